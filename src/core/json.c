/* JSON reader (include/llm3d/json.h): recursive descent over RFC 8259's grammar, depth-bounded. */
#include "llm3d/json.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct parser {
    const char *s;
    size_t n, i;
    const char *what;
    l3d_status st;
};

void l3d_json_where(const char *text, size_t len, size_t offset, int *line, int *col) {
    int l = 1, c = 1;
    for (size_t i = 0; i < offset && i < len; i++) {
        if (text[i] == '\n') {
            l++;
            c = 1;
        } else {
            c++;
        }
    }
    *line = l;
    *col = c;
}

/* The first error wins: later ones are consequences of it. */
static bool fail(struct parser *p, const char *expected) {
    if (p->st != L3D_OK) return false;
    int line, col;
    l3d_json_where(p->s, p->n, p->i, &line, &col);
    const char *got = p->i >= p->n ? "the end of the file" : NULL;
    char c = p->i < p->n ? p->s[p->i] : 0;
    if (got)
        p->st = l3d_error(L3D_ERR_FORMAT, "%s: line %d, column %d: expected %s, found %s", p->what,
                          line, col, expected, got);
    else if (c >= 0x20 && c < 0x7f)
        p->st = l3d_error(L3D_ERR_FORMAT, "%s: line %d, column %d: expected %s, found '%c'",
                          p->what, line, col, expected, c);
    else
        p->st = l3d_error(L3D_ERR_FORMAT, "%s: line %d, column %d: expected %s, found byte 0x%02x",
                          p->what, line, col, expected, (unsigned char)c);
    return false;
}

static void skip_ws(struct parser *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' ||
                           p->s[p->i] == '\r'))
        p->i++;
}

static bool oom(struct parser *p) {
    if (p->st == L3D_OK)
        p->st = l3d_error(L3D_ERR_OOM, "%s: out of memory reading JSON at byte %zu", p->what, p->i);
    return false;
}

static int hex4(const char *s) {
    int v = 0;
    for (int k = 0; k < 4; k++) {
        char c = s[k];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* \uXXXX at p->i (after the backslash and 'u'), with its low surrogate when it is a high one. */
static bool unicode_escape(struct parser *p, uint32_t *cp) {
    if (p->n - p->i < 4 || hex4(p->s + p->i) < 0) return fail(p, "4 hex digits after \\u");
    uint32_t hi = (uint32_t)hex4(p->s + p->i);
    p->i += 4;
    if (hi >= 0xdc00 && hi <= 0xdfff) return fail(p, "a high surrogate before a low one");
    if (hi < 0xd800 || hi > 0xdbff) {
        *cp = hi;
        return true;
    }
    if (p->n - p->i < 6 || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u')
        return fail(p, "the low surrogate (\\uDC00-\\uDFFF) after a high one");
    int lo = hex4(p->s + p->i + 2);
    if (lo < 0xdc00 || lo > 0xdfff)
        return fail(p, "the low surrogate (\\uDC00-\\uDFFF) after a high one");
    p->i += 6;
    *cp = 0x10000 + ((hi - 0xd800) << 10) + ((uint32_t)lo - 0xdc00);
    return true;
}

/* A string at p->i (on its opening quote) into v. Escapes only shrink the text, so the decoded
 * bytes fit a buffer of the raw length. Raw bytes are taken as they are (the files are UTF-8;
 * a tokenizer's vocabulary may hold any byte sequence its writer put there). */
static bool parse_string(struct parser *p, struct l3d_json *v) {
    size_t start = ++p->i, end = start;
    while (end < p->n && p->s[end] != '"') end += p->s[end] == '\\' ? 2 : 1;
    if (end >= p->n) {
        p->i = p->n;
        return fail(p, "the closing '\"' of a string");
    }
    char *o = malloc(end - start + 1);
    if (!o) return oom(p);
    v->type = L3D_JSON_STRING;
    v->str = o;
    size_t k = 0;
    while (p->i < end) {
        unsigned char c = (unsigned char)p->s[p->i];
        if (c < 0x20) return fail(p, "no control character inside a string (escape it)");
        if (c != '\\') {
            o[k++] = (char)c;
            p->i++;
            continue;
        }
        char e = p->s[++p->i];
        p->i++;
        const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
        const char *at = e ? strchr(from, e) : NULL;
        if (at) {
            o[k++] = to[at - from];
        } else if (e == 'u') {
            uint32_t cp;
            if (!unicode_escape(p, &cp)) return false;
            k += l3d_utf8_put(o + k, cp);
        } else {
            p->i--;
            return fail(p, "an escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)");
        }
    }
    o[k] = 0;
    v->len = k;
    p->i = end + 1;
    return true;
}

static bool parse_number(struct parser *p, struct l3d_json *v) {
    size_t a = p->i, i = p->i;
    const char *s = p->s;
    if (i < p->n && s[i] == '-') i++;
    if (i < p->n && s[i] == '0') {
        i++;
    } else if (i < p->n && s[i] >= '1' && s[i] <= '9') {
        while (i < p->n && s[i] >= '0' && s[i] <= '9') i++;
    } else {
        p->i = i;
        return fail(p, "a digit");
    }
    if (i < p->n && s[i] == '.') {
        size_t d = ++i;
        while (i < p->n && s[i] >= '0' && s[i] <= '9') i++;
        if (i == d) {
            p->i = i;
            return fail(p, "a digit after the decimal point");
        }
    }
    if (i < p->n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < p->n && (s[i] == '+' || s[i] == '-')) i++;
        size_t d = i;
        while (i < p->n && s[i] >= '0' && s[i] <= '9') i++;
        if (i == d) {
            p->i = i;
            return fail(p, "a digit in the exponent");
        }
    }
    char *t = malloc(i - a + 1);
    if (!t) return oom(p);
    memcpy(t, s + a, i - a);
    t[i - a] = 0;
    v->type = L3D_JSON_NUMBER;
    v->str = t;
    v->len = i - a;
    v->number = strtod(t, NULL); /* overflow gives +-HUGE_VAL: kept, callers range-check */
    p->i = i;
    return true;
}

static bool parse_value(struct parser *p, struct l3d_json *v, int depth);

/* Growable array of values while a container is read. */
struct vec {
    struct l3d_json *a;
    size_t n, cap;
};

static struct l3d_json *vec_push(struct vec *x) {
    if (x->n == x->cap) {
        size_t cap = x->cap ? 2 * x->cap : 4;
        struct l3d_json *a = realloc(x->a, cap * sizeof *a);
        if (!a) return NULL;
        x->a = a;
        x->cap = cap;
    }
    struct l3d_json *e = &x->a[x->n++];
    memset(e, 0, sizeof *e);
    return e;
}

static bool same_key(const struct l3d_json *a, const struct l3d_json *b) {
    return a->len == b->len && memcmp(a->str, b->str, a->len) == 0;
}

/* FNV-1a over a key's bytes. */
static uint64_t key_hash(const struct l3d_json *k) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < k->len; i++) h = (h ^ (unsigned char)k->str[i]) * 0x100000001b3ULL;
    return h;
}

/* The index of the first of keys[0, n) that repeats an earlier one (*first: the earlier), n when
 * none, n + 1 when out of memory. Up to 16 keys pairwise; more through an open-addressing table
 * of 2^k >= 2n slots, so that a tokenizer.json vocabulary of 150k keys stays linear. */
static size_t repeated_key(const struct l3d_json *keys, size_t n, size_t *first) {
    if (n <= 16) {
        for (size_t i = 1; i < n; i++)
            for (size_t j = 0; j < i; j++)
                if (same_key(&keys[i], &keys[j])) return *first = j, i;
        return n;
    }
    size_t cap = 64;
    while (cap < 2 * n) cap *= 2;
    size_t *slot = calloc(cap, sizeof *slot); /* index + 1; 0: empty */
    if (!slot) return n + 1;
    size_t found = n;
    for (size_t i = 0; i < n && found == n; i++) {
        size_t s = (size_t)key_hash(&keys[i]) & (cap - 1);
        while (slot[s] && !same_key(&keys[slot[s] - 1], &keys[i])) s = (s + 1) & (cap - 1);
        if (slot[s]) *first = slot[s] - 1, found = i;
        else slot[s] = i + 1;
    }
    free(slot);
    return found;
}

/* Refuses an object whose key repeats: readers disagree on which one counts. */
static bool unique_keys(struct parser *p, const struct l3d_json *keys, size_t n) {
    size_t first = 0, i = repeated_key(keys, n, &first);
    if (i == n) return true;
    if (i > n) return oom(p);
    int line, col, line0, col0;
    char name[80]; /* the key's first bytes, control characters escaped: one line */
    size_t k = 0;
    for (size_t j = 0; j < keys[i].len && k + 7 < sizeof name; j++) {
        unsigned char c = (unsigned char)keys[i].str[j];
        if (c < 0x20) k += (size_t)snprintf(name + k, sizeof name - k, "\\u%04x", c);
        else name[k++] = (char)c;
    }
    name[k] = '\0';
    l3d_json_where(p->s, p->n, keys[i].offset, &line, &col);
    l3d_json_where(p->s, p->n, keys[first].offset, &line0, &col0);
    p->st = l3d_error(L3D_ERR_FORMAT, "%s: line %d, column %d: key \"%s\" repeats the one at "
                      "line %d, column %d: readers disagree on which counts (Python's json takes "
                      "the last); remove one", p->what, line, col, name, line0, col0);
    return false;
}

/* Members of an object (keys != NULL) or elements of an array, after the opening bracket. */
static bool parse_container(struct parser *p, struct l3d_json *v, int depth) {
    bool object = v->type == L3D_JSON_OBJECT;
    char close = object ? '}' : ']';
    struct vec items = {0}, keys = {0};
    bool ok = true;
    skip_ws(p);
    if (p->i < p->n && p->s[p->i] == close) {
        p->i++;
    } else {
        for (;;) {
            skip_ws(p);
            if (object) {
                struct l3d_json *k = vec_push(&keys);
                if (!k) {
                    ok = oom(p);
                    break;
                }
                k->offset = p->i;
                if (p->i >= p->n || p->s[p->i] != '"') {
                    ok = fail(p, "a member name in double quotes");
                    break;
                }
                if (!(ok = parse_string(p, k))) break;
                skip_ws(p);
                if (p->i >= p->n || p->s[p->i] != ':') {
                    ok = fail(p, "':' after a member name");
                    break;
                }
                p->i++;
            }
            struct l3d_json *e = vec_push(&items);
            if (!e) {
                ok = oom(p);
                break;
            }
            if (!(ok = parse_value(p, e, depth + 1))) break;
            skip_ws(p);
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                continue;
            }
            if (p->i < p->n && p->s[p->i] == close) {
                p->i++;
                break;
            }
            ok = fail(p, object ? "',' or '}' after a member" : "',' or ']' after an element");
            break;
        }
    }
    if (ok && object) ok = unique_keys(p, keys.a, keys.n);
    /* after an error a key may lack its value: drop it, so keys[i] names items[i] for every i */
    while (keys.n > items.n) free(keys.a[--keys.n].str);
    v->items = items.a;
    v->keys = keys.a;
    v->count = items.n;
    return ok;
}

static bool parse_literal(struct parser *p, const char *word) {
    size_t k = strlen(word);
    if (p->n - p->i < k || memcmp(p->s + p->i, word, k) != 0) return fail(p, "a JSON value");
    p->i += k;
    return true;
}

static bool parse_value(struct parser *p, struct l3d_json *v, int depth) {
    skip_ws(p);
    memset(v, 0, sizeof *v);
    v->offset = p->i;
    if (p->i >= p->n) return fail(p, "a JSON value");
    switch (p->s[p->i]) {
    case '{':
    case '[':
        if (depth >= L3D_JSON_MAX_DEPTH) return fail(p, "at most 256 nested arrays and objects");
        v->type = p->s[p->i] == '{' ? L3D_JSON_OBJECT : L3D_JSON_ARRAY;
        p->i++;
        return parse_container(p, v, depth);
    case '"': return parse_string(p, v);
    case 't': v->type = L3D_JSON_BOOL; v->boolean = true; return parse_literal(p, "true");
    case 'f': v->type = L3D_JSON_BOOL; return parse_literal(p, "false");
    case 'n': return parse_literal(p, "null");
    default:
        if (p->s[p->i] == '-' || (p->s[p->i] >= '0' && p->s[p->i] <= '9'))
            return parse_number(p, v);
        return fail(p, "a JSON value");
    }
}

l3d_status l3d_json_parse(struct l3d_json *out, const char *text, size_t len, const char *what) {
    struct parser p = {.s = text, .n = len, .what = what ? what : "JSON", .st = L3D_OK};
    if (parse_value(&p, out, 0)) {
        skip_ws(&p);
        if (p.i < p.n) fail(&p, "the end of the document after its value");
    }
    if (p.st != L3D_OK) {
        l3d_json_free(out);
        memset(out, 0, sizeof *out);
    }
    return p.st;
}

void l3d_json_free(struct l3d_json *v) {
    if (!v) return;
    for (size_t i = 0; i < v->count; i++) {
        if (v->items) l3d_json_free(&v->items[i]);
        if (v->keys) free(v->keys[i].str);
    }
    free(v->items);
    free(v->keys);
    free(v->str);
    memset(v, 0, sizeof *v);
}

const struct l3d_json *l3d_json_get(const struct l3d_json *v, const char *key) {
    if (!v || v->type != L3D_JSON_OBJECT) return NULL;
    size_t k = strlen(key);
    for (size_t i = 0; i < v->count; i++)
        if (v->keys[i].len == k && memcmp(v->keys[i].str, key, k) == 0) return &v->items[i];
    return NULL;
}

bool l3d_json_num(const struct l3d_json *v, double *out) {
    if (!v || v->type != L3D_JSON_NUMBER) return false;
    *out = v->number;
    return true;
}

bool l3d_json_int(const struct l3d_json *v, int64_t *out) {
    if (!v || v->type != L3D_JSON_NUMBER) return false;
    double d = v->number;
    /* 2^63 is the first double past INT64_MAX */
    if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0) || d != floor(d)) return false;
    if (!strpbrk(v->str, ".eE")) { /* exact for integers past 2^53, which a double rounds */
        errno = 0;
        long long x = strtoll(v->str, NULL, 10);
        if (errno) return false;
        *out = x;
        return true;
    }
    *out = (int64_t)d;
    return true;
}

const char *l3d_json_str(const struct l3d_json *v) {
    return v && v->type == L3D_JSON_STRING ? v->str : NULL;
}

const char *l3d_json_type_name(enum l3d_json_type t) {
    static const char *names[] = {"null", "a boolean", "a number", "a string", "an array",
                                  "an object"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "?";
}
