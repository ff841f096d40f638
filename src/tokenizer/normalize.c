/*
 * Unicode canonical composition (NFC, Unicode Standard Annex #15), the normalizer of Qwen2's
 * tokenizer.json: decompose every character canonically (the tables of nfc_tables.h applied until
 * nothing changes; Hangul syllables by the arithmetic of the Unicode Standard, section 3.12), put
 * each run of marks in the order of their combining classes (a stable sort), then compose each
 * starter with the characters after it that it is not blocked from (the canonical composition
 * algorithm, UAX #15 section 1.3 / Unicode 3.11 D117).
 *
 * Invalid UTF-8: each byte that is not part of a valid sequence is kept as it is and acts as a
 * starter that composes with nothing, so the valid text on either side normalizes as it would
 * alone (the rule the oracle, scripts/hf_vectors.js, builds its expected ids by).
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/nfc_tables.h"
#include "tokenizer/tokenizer-impl.h"

#define NR(a) (sizeof(a) / sizeof((a)[0]))
enum { SBASE = 0xAC00, LBASE = 0x1100, VBASE = 0x1161, TBASE = 0x11A7, LCOUNT = 19, VCOUNT = 21,
       TCOUNT = 28, NCOUNT = VCOUNT * TCOUNT, SCOUNT = LCOUNT * NCOUNT };

static int ccc(int32_t c) {
    if (c < 0x300) return 0; /* also an invalid byte (negative) */
    size_t lo = 0, hi = NR(l3d_nfc_ccc);
    while (lo < hi) {
        size_t m = (lo + hi) / 2;
        if ((uint32_t)c < l3d_nfc_ccc[m][0]) hi = m;
        else if ((uint32_t)c > l3d_nfc_ccc[m][1]) lo = m + 1;
        else return (int)l3d_nfc_ccc[m][2];
    }
    return 0;
}

static const uint32_t *decomp_of(int32_t c) {
    size_t lo = 0, hi = NR(l3d_nfc_decomp);
    while (c >= 0xC0 && lo < hi) {
        size_t m = (lo + hi) / 2;
        if ((uint32_t)c == l3d_nfc_decomp[m][0]) return l3d_nfc_decomp[m];
        if ((uint32_t)c < l3d_nfc_decomp[m][0]) hi = m;
        else lo = m + 1;
    }
    return NULL;
}

/* The primary composite of (a, b); -1 when there is none. */
static int32_t compose(int32_t a, int32_t b) {
    if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
        return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
    if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE &&
        b < TBASE + TCOUNT)
        return a + (b - TBASE);
    size_t lo = 0, hi = NR(l3d_nfc_comp);
    while (b >= 0x300 && lo < hi) {
        size_t m = (lo + hi) / 2;
        const uint32_t *d = l3d_nfc_decomp[l3d_nfc_comp[m]];
        if ((uint32_t)a == d[1] && (uint32_t)b == d[2]) return (int32_t)d[0];
        if ((uint32_t)a < d[1] || ((uint32_t)a == d[1] && (uint32_t)b < d[2])) hi = m;
        else lo = m + 1;
    }
    return -1;
}

/* Appends c to s->cp, growing it. */
static void push(struct l3d_nfc *s, int32_t c) {
    if (s->ncp == s->cpcap) {
        s->cpcap = s->cpcap ? 2 * s->cpcap : 256;
        int32_t *v = realloc(s->cp, s->cpcap * sizeof *v);
        L3D_ASSERT(v != NULL);
        s->cp = v;
    }
    s->cp[s->ncp++] = c;
}

/* Appends the full canonical decomposition of c. */
static void decompose(struct l3d_nfc *s, int32_t c) {
    if (c >= SBASE && c < SBASE + SCOUNT) {
        int32_t i = c - SBASE;
        push(s, LBASE + i / NCOUNT);
        push(s, VBASE + (i % NCOUNT) / TCOUNT);
        if (i % TCOUNT) push(s, TBASE + i % TCOUNT);
        return;
    }
    const uint32_t *d = decomp_of(c);
    if (!d) {
        push(s, c);
        return;
    }
    decompose(s, (int32_t)d[1]);
    if (d[2]) decompose(s, (int32_t)d[2]);
}

/* The code point of the valid UTF-8 sequence at s (n bytes left) and its length; 0 when invalid
 * (overlong, a surrogate, above U+10FFFF, truncated), as PCRE2's PCRE2_MATCH_INVALID_UTF sees it. */
static int utf8_at(const unsigned char *s, size_t n, int32_t *cp) {
    int len = s[0] < 0x80 ? 1 : s[0] >= 0xC2 && s[0] < 0xE0 ? 2 : s[0] >= 0xE0 && s[0] < 0xF0 ? 3
            : s[0] >= 0xF0 && s[0] < 0xF5 ? 4 : 0;
    if (len == 0 || (size_t)len > n) return 0;
    int32_t c = len == 1 ? s[0] : s[0] & (0x7F >> len);
    for (int k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) return 0;
        c = c << 6 | (s[k] & 0x3F);
    }
    static const int32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < min[len] || (c >= 0xD800 && c <= 0xDFFF) || c > 0x10FFFF) return 0;
    *cp = c;
    return len;
}

/* The marks of each run in the order of their classes (insertion sort: runs are short). */
static void reorder(int32_t *v, size_t n) {
    for (size_t i = 1; i < n; i++) {
        int k = ccc(v[i]);
        if (k == 0) continue;
        int32_t c = v[i];
        size_t j = i;
        for (; j > 0 && ccc(v[j - 1]) > k; j--) v[j] = v[j - 1];
        v[j] = c;
    }
}

/* Canonical composition in place; returns the new count. */
static size_t compose_all(int32_t *v, size_t n) {
    if (n == 0) return 0;
    size_t starter = 0, out = 1;
    int last = ccc(v[0]) ? 256 : 0; /* a mark at the start has no starter before it */
    for (size_t i = 1; i < n; i++) {
        int k = ccc(v[i]);
        int32_t c = v[starter] >= 0 && (last < k || last == 0) ? compose(v[starter], v[i]) : -1;
        if (c >= 0) {
            v[starter] = c;
            continue;
        }
        if (k == 0) starter = out;
        last = k;
        v[out++] = v[i];
    }
    return out;
}

static size_t put_utf8(char *o, int32_t c) {
    if (c < 0) { o[0] = (char)(unsigned char)(-c - 1); return 1; } /* an invalid byte */
    return l3d_utf8_put(o, (uint32_t)c);
}

const char *l3d_tok_nfc(struct l3d_nfc *s, const char *text, size_t n, size_t *out_n) {
    /* every code point below U+0300 is its own NFC and composes with nothing before it: text
     * without a lead byte of U+0300 or above (0xCC..0xF4) is NFC already */
    size_t i = 0;
    while (i < n && (unsigned char)text[i] < 0xCC) i++;
    *out_n = n;
    if (i == n) return text;
    const unsigned char *u = (const unsigned char *)text;
    s->ncp = 0;
    for (i = 0; i < n;) {
        int32_t c;
        int len = utf8_at(u + i, n - i, &c);
        if (len == 0) {
            push(s, -(int32_t)u[i] - 1);
            i++;
            continue;
        }
        decompose(s, c);
        i += (size_t)len;
    }
    reorder(s->cp, s->ncp);
    size_t m = compose_all(s->cp, s->ncp);
    if (s->cap < 4 * m + 1) {
        s->cap = 4 * m + 1;
        char *b = realloc(s->out, s->cap);
        L3D_ASSERT(b != NULL);
        s->out = b;
    }
    size_t o = 0;
    for (size_t k = 0; k < m; k++) o += put_utf8(s->out + o, s->cp[k]);
    s->out[o] = '\0';
    *out_n = o;
    return s->out;
}

void l3d_nfc_free(struct l3d_nfc *s) {
    free(s->cp);
    free(s->out);
    *s = (struct l3d_nfc){0};
}
