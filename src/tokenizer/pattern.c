/*
 * Pre-tokenisation patterns (tokenizer-impl.h, l3d_tok_compile): tiktoken's and tokenizer.json's
 * regexes are written for Rust's regex crate (fancy-regex) and Python's `regex`, whose \p{..} and
 * \s follow Unicode's current tables. PCRE2 10.42's own tables are Unicode 14, and its \s leaves
 * out U+0085, so each \p{X} and \s becomes an explicit class of code point ranges: from
 * unicode_classes.h (the Unicode version of the node that wrote the test vectors) and the
 * White_Space property. The ranges of one bracketed class are merged into one sorted list, which
 * keeps the compiled pattern small; a pattern PCRE2 still finds too large is compiled with its own
 * property tables instead (said in docs/DESIGN.md). A negated class, \P{X} or \S, is the
 * complement of its ranges: [^...] alone, the complement's ranges inside brackets, so that
 * [^\P{N}] is \p{N}.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer-impl.h"
#include "tokenizer/unicode_classes.h"

#define NR(a) (sizeof(a) / sizeof((a)[0]))

/* The Unicode White_Space property (PropList.txt): \s of Python's `regex` and Rust's regex. */
static const uint32_t white_space[][2] = {
    {0x9, 0xD}, {0x20, 0x20}, {0x85, 0x85}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A},
    {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000},
};

static const struct {
    const char *name;
    const uint32_t (*r)[2];
    size_t n;
} uclass[] = {
    {"L", l3d_uni_letter, NR(l3d_uni_letter)}, {"N", l3d_uni_number, NR(l3d_uni_number)},
    {"Lu", l3d_uni_Lu, NR(l3d_uni_Lu)}, {"Ll", l3d_uni_Ll, NR(l3d_uni_Ll)},
    {"Lt", l3d_uni_Lt, NR(l3d_uni_Lt)}, {"Lm", l3d_uni_Lm, NR(l3d_uni_Lm)},
    {"Lo", l3d_uni_Lo, NR(l3d_uni_Lo)}, {"M", l3d_uni_M, NR(l3d_uni_M)},
};

/* A growing output string and the pending ranges of the class being written. */
struct pat_out {
    char *s;
    size_t n, cap;
    uint32_t (*r)[2];
    size_t nr, rcap;
};

static void put(struct pat_out *o, const char *s, size_t n) {
    if (o->n + n + 1 > o->cap) {
        o->cap = 2 * (o->n + n + 1);
        o->s = realloc(o->s, o->cap);
        L3D_ASSERT(o->s != NULL);
    }
    memcpy(o->s + o->n, s, n);
    o->n += n;
    o->s[o->n] = '\0';
}

static void add_ranges(struct pat_out *o, const uint32_t (*r)[2], size_t n) {
    if (o->nr + n > o->rcap) {
        o->rcap = 2 * (o->nr + n);
        o->r = realloc(o->r, o->rcap * sizeof *o->r);
        L3D_ASSERT(o->r != NULL);
    }
    memcpy(o->r + o->nr, r, n * sizeof *r);
    o->nr += n;
}

static int cmp_range(const void *a, const void *b) {
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* Adds the code points that are in none of the ranges r[0..n) (sorted or not), surrogates left out
 * (they are no characters: UTF-8 text holds none, and PCRE2 refuses them in a UTF pattern). */
static void add_complement(struct pat_out *o, const uint32_t (*r)[2], size_t n) {
    uint32_t(*s)[2] = malloc((n + 1) * sizeof *s);
    L3D_ASSERT(s != NULL);
    memcpy(s, r, n * sizeof *r);
    qsort(s, n, sizeof *s, cmp_range);
    uint32_t next = 0; /* the first code point not yet covered */
    for (size_t i = 0; i <= n; i++) {
        uint32_t a = i < n ? s[i][0] : 0x110000;
        for (uint32_t lo = next; lo < a;) { /* [lo, a) without 0xD800..0xDFFF */
            uint32_t hi = lo < 0xD800 && a > 0xD800 ? 0xD7FF : a - 1;
            if (lo < 0xD800 || lo > 0xDFFF) add_ranges(o, &(const uint32_t[2]){lo, hi}, 1);
            lo = lo >= 0xD800 && lo <= 0xDFFF ? 0xE000 : hi + 1;
        }
        if (i < n && s[i][1] + 1 > next) next = s[i][1] + 1;
    }
    free(s);
}

/* Writes the pending ranges, sorted and merged, as \x{A}-\x{B} items; empties the list. */
static void flush_ranges(struct pat_out *o) {
    if (o->nr > 0) qsort(o->r, o->nr, sizeof *o->r, cmp_range); /* none yet: r may be NULL */
    for (size_t i = 0; i < o->nr;) {
        uint32_t a = o->r[i][0], b = o->r[i][1];
        for (i++; i < o->nr && o->r[i][0] <= b + 1; i++)
            if (o->r[i][1] > b) b = o->r[i][1];
        char item[40];
        int k = a == b ? snprintf(item, sizeof item, "\\x{%X}", (unsigned)a)
                       : snprintf(item, sizeof item, "\\x{%X}-\\x{%X}", (unsigned)a, (unsigned)b);
        put(o, item, (size_t)k);
    }
    o->nr = 0;
}

/* The escape \p{X}, \P{X}, \s or \S at p (its backslash) in pattern pat (in_class: inside
 * brackets), added to o: outside brackets its ranges, *neg telling whether the class is their
 * complement (\P{X}, \S); inside, the ranges of what it matches (the complement's for \P{X} and
 * \S). native: \p{X} and \P{X} are copied for PCRE2's own tables. *len receives the escape's
 * length. Returns false (with the error set) for a class llm3d does not know. */
static bool expand_escape(struct pat_out *o, const char *pat, const char *p, bool native,
                          bool in_class, size_t *len, bool *neg, const char *what) {
    bool complement = p[1] == 'S' || p[1] == 'P';
    *neg = complement && !in_class;
    if (p[1] == 's' || p[1] == 'S') {
        if (complement && in_class) add_complement(o, white_space, NR(white_space));
        else add_ranges(o, white_space, NR(white_space));
        *len = 2;
        return true;
    }
    const char *end = strchr(p, '}');
    size_t nl = end ? (size_t)(end - p - 3) : 0;
    for (size_t i = 0; end && p[2] == '{' && i < NR(uclass); i++) {
        if (strlen(uclass[i].name) != nl || memcmp(p + 3, uclass[i].name, nl) != 0) continue;
        *len = nl + 4;
        if (native) { /* PCRE2 reads \P{X} itself: a positive item, never a [^...] */
            put(o, p, nl + 4);
            *neg = false;
        } else if (complement && in_class) {
            add_complement(o, uclass[i].r, uclass[i].n);
        } else {
            add_ranges(o, uclass[i].r, uclass[i].n);
        }
        return true;
    }
    l3d_error(L3D_ERR_FORMAT, "%s: the pattern's class %.*s at offset %zu is not one llm3d "
              "supports (\\p{X} or \\P{X} of L, N, Lu, Ll, Lt, Lm, Lo, M; \\s, \\S): rewrite the "
              "pattern with these", what, end ? (int)(end - p + 1) : 3, p, (size_t)(p - pat));
    return false;
}

/* pat with its Unicode classes spelled out (native: \p{X} left to PCRE2); NULL on error. */
static char *expand(const char *pat, bool native, const char *what) {
    struct pat_out o = {0};
    bool in_class = false;
    put(&o, "", 0);
    for (const char *p = pat; *p;) {
        bool unicode = p[0] == '\\' && (p[1] == 'p' || p[1] == 's' || p[1] == 'S' || p[1] == 'P');
        if (unicode) {
            size_t len;
            bool neg;
            size_t before = o.n;
            if (!expand_escape(&o, pat, p, native, in_class, &len, &neg, what)) {
                free(o.s);
                free(o.r);
                return NULL;
            }
            if (!in_class && (o.nr || o.n > before)) { /* a class of its own */
                char *native_item = NULL;
                if (o.n > before) { /* native \p{X}: move it inside brackets */
                    native_item = strndup(o.s + before, o.n - before);
                    o.n = before;
                }
                put(&o, neg ? "[^" : "[", neg ? 2 : 1);
                if (native_item) put(&o, native_item, strlen(native_item));
                free(native_item);
                flush_ranges(&o);
                put(&o, "]", 1);
            }
            p += len;
        } else if (p[0] == '\\' && p[1]) {
            put(&o, p, 2);
            p += 2;
        } else {
            if (!in_class && p[0] == '[') {
                in_class = true;
                size_t k = p[1] == '^' ? 2 : 1;
                put(&o, p, k);
                p += k;
                continue;
            }
            if (in_class && p[0] == ']') {
                flush_ranges(&o);
                in_class = false;
            }
            put(&o, p, 1);
            p++;
        }
    }
    free(o.r);
    return o.s;
}

/* The length of the item at p: an escape (2), else one byte; *in_class follows the brackets. */
static size_t item_len(const char *p, bool *in_class) {
    if (p[0] == '\\' && p[1]) return 2;
    if (!*in_class && p[0] == '[') *in_class = true;
    else if (*in_class && p[0] == ']') *in_class = false;
    return 1;
}

/* pat with each lookaround, (?=..), (?!..), (?<=..) or (?<!..), replaced by the empty group (?:),
 * what a match consumes left; NULL when the pattern's parentheses do not balance. */
static char *strip_lookarounds(const char *pat) {
    struct pat_out o = {0};
    bool in_class = false;
    put(&o, "", 0);
    for (const char *p = pat; *p;) {
        bool look = !in_class && p[0] == '(' && p[1] == '?' &&
                    (p[2] == '=' || p[2] == '!' || (p[2] == '<' && (p[3] == '=' || p[3] == '!')));
        if (!look) {
            size_t k = item_len(p, &in_class);
            put(&o, p, k);
            p += k;
            continue;
        }
        int depth = 0;
        do {
            if (!*p) {
                free(o.s);
                return NULL;
            }
            if (!in_class) depth += (p[0] == '(') - (p[0] == ')');
            p += item_len(p, &in_class);
        } while (depth > 0);
        put(&o, "(?:)", 4);
    }
    return o.s;
}

/* Whether PCRE2 bounds the characters a match of pattern (compiled as re) consumes above 0. Its
 * minimum length (PCRE2_INFO_MINLENGTH) is a lower bound on the subject a match needs, the
 * characters a lookahead reads included ((?=a) has 1), so it is read from the pattern without its
 * lookarounds (compiled with PCRE2's own tables: the length does not depend on their version);
 * from re where that does not compile (a reference to a group inside a lookaround). 0 also where
 * PCRE2 cannot tell ((*ACCEPT), recursion). \K, which drops what it consumed before it, is not
 * counted: an empty match through it is an error while encoding (bpe.c). */
static bool consumes(const pcre2_code *re, const char *pattern, const char *what) {
    char *bare = strip_lookarounds(pattern), *pat = bare ? expand(bare, true, what) : NULL;
    pcre2_code *b = NULL;
    if (pat) {
        int err;
        PCRE2_SIZE erroff;
        b = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                          &err, &erroff, NULL);
    }
    uint32_t min = 0;
    pcre2_pattern_info(b ? b : re, PCRE2_INFO_MINLENGTH, &min);
    pcre2_code_free(b);
    free(pat);
    free(bare);
    return min > 0;
}

static l3d_status compiled(struct l3d_tokenizer *t, const char *pattern, const char *what) {
    if (!consumes(t->re, pattern, what))
        return l3d_error(L3D_ERR_FORMAT, "%s: the pre-tokenisation pattern \"%s\" can match the "
                         "empty string (PCRE2 bounds what a match consumes by 0 characters): "
                         "llm3d needs every match to hold a character; rewrite the pattern so "
                         "that each alternative consumes one (+ rather than *, no alternative "
                         "that is optional or only a lookaround)", what, pattern);
    pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE); /* without JIT, pcre2_match interprets */
    t->pattern = strdup(pattern);
    t->what = strdup(what);
    L3D_ASSERT(t->pattern && t->what);
    return L3D_OK;
}

l3d_status l3d_tok_compile(struct l3d_tokenizer *t, const char *pattern, const char *what) {
    for (int native = 0; native < 2; native++) {
        char *pat = expand(pattern, native, what);
        if (!pat) return L3D_ERR_FORMAT;
        int err;
        PCRE2_SIZE erroff;
        t->re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED,
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &erroff, NULL);
        free(pat);
        if (t->re) return compiled(t, pattern, what);
        if (err == PCRE2_ERROR_PATTERN_TOO_LARGE && !native) continue;
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return l3d_error(L3D_ERR_FORMAT, "%s: PCRE2 cannot compile the pre-tokenisation pattern "
                         "%s: %s", what, pattern, (char *)msg);
    }
    return L3D_ERR_FORMAT; /* not reached */
}
