/* The JSON reader (src/core/json.c): values, escapes, numbers, and the errors of malformed
 * documents, each naming where. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llm3d/json.h"
#include "test.h"

static l3d_status parse(struct l3d_json *v, const char *s) {
    return l3d_json_parse(v, s, strlen(s), "t.json");
}

/* The document must be refused with a message containing `where`. */
static void refuse(const char *s, const char *where) {
    struct l3d_json v;
    l3d_status st = parse(&v, s);
    CHECK(st == L3D_ERR_FORMAT);
    CHECK(v.type == L3D_JSON_NULL && v.count == 0);
    if (st != L3D_OK && !strstr(l3d_error_message(), where))
        fprintf(stderr, "refuse(%s): message '%s' lacks '%s'\n", s, l3d_error_message(), where);
    CHECK(st != L3D_OK && strstr(l3d_error_message(), where) != NULL);
}

static void test_values(void) {
    struct l3d_json v;
    const char *doc = "{\"a\": [1, -2.5e1, true, false, null, \"x\"], \"b\": {\"c\": \"\\u00e9\\n\"},"
                      " \"A\": 7, \"big\": 9007199254740993, \"e\": 4.096e3, \"f\": 1.5}";
    CHECK(parse(&v, doc) == L3D_OK);
    CHECK(v.type == L3D_JSON_OBJECT && v.count == 6);
    const struct l3d_json *a = l3d_json_get(&v, "a");
    CHECK(a && a->type == L3D_JSON_ARRAY && a->count == 6);
    if (a && a->count == 6) {
        CHECK(a->items[0].number == 1.0 && a->items[1].number == -25.0);
        CHECK(a->items[2].type == L3D_JSON_BOOL && a->items[2].boolean);
        CHECK(a->items[3].type == L3D_JSON_BOOL && !a->items[3].boolean);
        CHECK(a->items[4].type == L3D_JSON_NULL);
        CHECK(l3d_json_str(&a->items[5]) && strcmp(l3d_json_str(&a->items[5]), "x") == 0);
        CHECK(l3d_json_str(&a->items[0]) == NULL);
    }
    const struct l3d_json *c = l3d_json_get(l3d_json_get(&v, "b"), "c");
    CHECK(c && c->len == 3 && memcmp(c->str, "\xc3\xa9\n", 3) == 0);
    int64_t x = 0;
    CHECK(l3d_json_int(l3d_json_get(&v, "big"), &x) && x == 9007199254740993LL);
    CHECK(l3d_json_int(l3d_json_get(&v, "e"), &x) && x == 4096);
    CHECK(!l3d_json_int(l3d_json_get(&v, "f"), &x));
    CHECK(!l3d_json_int(l3d_json_get(&v, "b"), &x));
    CHECK(l3d_json_get(&v, "missing") == NULL && l3d_json_get(a, "a") == NULL);
    l3d_json_free(&v);

    /* surrogate pairs, \u0000 inside a string, raw UTF-8 kept */
    CHECK(parse(&v, "[\"\\ud83d\\ude00\", \"a\\u0000b\", \"\xe4\xb8\xad\"]") == L3D_OK);
    CHECK(v.count == 3);
    if (v.count == 3) {
        CHECK(v.items[0].len == 4 && memcmp(v.items[0].str, "\xf0\x9f\x98\x80", 4) == 0);
        CHECK(v.items[1].len == 3 && v.items[1].str[1] == 0 && v.items[1].str[2] == 'b');
        CHECK(v.items[2].len == 3);
    }
    l3d_json_free(&v);
    CHECK(parse(&v, " [ ] ") == L3D_OK && v.type == L3D_JSON_ARRAY && v.count == 0);
    l3d_json_free(&v);
    CHECK(parse(&v, "\"\\\"\\\\\\/\\b\\f\\r\\t\"") == L3D_OK && v.len == 7 &&
          memcmp(v.str, "\"\\/\b\f\r\t", 7) == 0);
    l3d_json_free(&v);
}

static void test_errors(void) {
    refuse("", "line 1, column 1: expected a JSON value");
    refuse("{\"a\": 1,}", "expected a member name");
    refuse("[1, 2,]", "expected a JSON value");
    refuse("{\"a\" 1}", "':' after a member name");
    refuse("{\"a\": 1\n \"b\": 2}", "line 2, column 2: expected ',' or '}'");
    refuse("[1] 2", "the end of the document");
    refuse("\"abc", "closing '\"'");
    refuse("\"a\tb\"", "control character");
    refuse("\"\\ud83d\"", "low surrogate");
    refuse("\"\\ude00\"", "high surrogate before a low one");
    refuse("\"\\x\"", "an escape");
    refuse("\"\\u12G4\"", "4 hex digits");
    refuse("01", "the end of the document");
    refuse("1.", "a digit after the decimal point");
    refuse("1e+", "a digit in the exponent");
    refuse("NaN", "a JSON value");
    refuse("-x", "a digit");
    refuse("tru", "a JSON value");
    refuse("[1, {\"a\": [2, }]", "expected a JSON value");
    /* nesting: 256 arrays are read, 257 refused (no stack exhaustion on a hostile file) */
    for (int depth = 256; depth <= 257; depth++) {
        char *deep = malloc(2 * (size_t)depth + 1);
        memset(deep, '[', (size_t)depth);
        memset(deep + depth, ']', (size_t)depth);
        deep[2 * depth] = 0;
        struct l3d_json v;
        l3d_status st = parse(&v, deep);
        CHECK(depth == 256 ? st == L3D_OK : st == L3D_ERR_FORMAT);
        if (depth == 257) CHECK(strstr(l3d_error_message(), "at most 256 nested") != NULL);
        l3d_json_free(&v);
        free(deep);
    }
}

/* A key twice in one object: refused, naming both places (Python's json takes the last, llm3d
 * took the first: two readers of one config.json saw two models). Keys are compared as bytes
 * with their length ("a\u0000b" is not "a"), per object (the same key in two objects is fine). A
 * vocabulary of 200k keys is checked in linear time: 200k^2 / 2 comparisons would take seconds. */
static void test_repeated_keys(void) {
    refuse("{\"a\": 1, \"b\": 2, \"a\": 3}", "line 1, column 18: key \"a\" repeats the one at "
           "line 1, column 2");
    refuse("{\"x\": {\"dtype\": \"F32\",\n \"dtype\": \"F16\"}}", "line 2, column 2: key \"dtype\"");
    refuse("[{\"k\": 1}, {\"k\": 2, \"\\u006b\": 3}]", "key \"k\" repeats"); /* escaped: the same */
    refuse("{\"a\\nb\\u0000\": 1, \"a\\nb\\u0000\": 2}", "key \"a\\u000ab\\u0000\" repeats"); /* one line */
    struct l3d_json v;
    CHECK(parse(&v, "{\"a\": 1, \"a\\u0000b\": 2, \"b\": {\"a\": 3}, \"c\": [{\"a\": 4}]}") ==
          L3D_OK && v.count == 4);
    l3d_json_free(&v);
    const int n = 200000;
    char *big = malloc((size_t)n * 24 + 64);
    for (int dup = 0; dup < 2; dup++) {
        size_t k = 0;
        big[k++] = '{';
        for (int i = 0; i < n; i++) /* the last key repeats the first when dup */
            k += (size_t)sprintf(big + k, "%s\"tok%d\": %d", i ? ", " : "", dup && i == n - 1
                                 ? 0 : i, i);
        big[k++] = '}';
        big[k] = 0;
        clock_t t0 = clock();
        l3d_status st = parse(&v, big);
        double s = (double)(clock() - t0) / CLOCKS_PER_SEC;
        CHECK(dup ? st == L3D_ERR_FORMAT && strstr(l3d_error_message(), "key \"tok0\" repeats")
                  : st == L3D_OK && v.count == (size_t)n);
        if (!(s < 1.0)) fprintf(stderr, "%d keys parsed in %.2f s\n", n, s);
        CHECK(s < 1.0);
        l3d_json_free(&v);
    }
    free(big);
}

int main(void) {
    test_values();
    test_errors();
    test_repeated_keys();
    return TEST_REPORT();
}
