/* Token-id test vectors (tokvec.h). */
#include "support/tokvec.h"

#include <stdlib.h>
#include <string.h>

static int hexval(int c) { return c <= '9' ? c - '0' : c - 'a' + 10; }

bool tokvec_parse_line(const char *line, unsigned char *text, size_t *n, char *mode,
                       struct l3d_ids *want) {
    const char *t1 = strchr(line, '\t'), *t2 = t1 ? strchr(t1 + 1, '\t') : NULL;
    if (!t1 || !t2 || t1 != line + 1) return false;
    *mode = line[0];
    *n = (size_t)(t2 - t1 - 1) / 2;
    for (size_t i = 0; i < *n; i++)
        text[i] = (unsigned char)(hexval(t1[1 + 2 * i]) * 16 + hexval(t1[2 + 2 * i]));
    char *end;
    for (const char *p = t2 + 1; *p && *p != '\n'; p = end) {
        long v = strtol(p, &end, 10);
        if (end == p) break;
        l3d_ids_push(want, (int32_t)v);
    }
    return true;
}

bool tokvec_same(const struct l3d_ids *a, const struct l3d_ids *b) {
    return a->n == b->n && (a->n == 0 || memcmp(a->v, b->v, (size_t)a->n * sizeof *a->v) == 0);
}
