/*
 * Checkpoint manifests (src/ckpt/manifest.c): every numeric field of every record is parsed in
 * full and checked against its range (finite floats, whole numbers, counts at least 1, 0/1
 * flags), and a bad one is refused with a message naming the manifest, the line, the record, the
 * field and the value. A manifest's checksum guards against damage only: a value edited and the
 * checksum recomputed (format 4) meets the same checks as here, in format 3 (no checksum line),
 * which l3d_ckpt_manifest_check parses as a load does before it reads any rank file.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt-impl.h"
#include "test.h"

/* A valid format-3 manifest of one rank (tests/fuzz/corpus/manifest/format3), with the optional
 * loss-scale record of fp16 runs. */
static const char *base =
    "llm3d-checkpoint format 3\n"
    "step 1\n"
    "run 00000000deadbeef\n"
    "model L 1 C 8 NH 1 V 296 Vp 384 maxT 4\n"
    "dtype params fp32 moments fp32\n"
    "layout world 1 tp 1 pp 1 dp 1 zero 0 sp 0 virtual 1\n"
    "data epoch 0 index 1 B 1 T 4 accum 1 seed 1337\n"
    "schedule max_lr 0x1.3a92a4p-11 min_lr 0x1.f75104p-15 warmup 1 total 1\n"
    "adamw beta1 0x1.ccccccp-1 beta2 0x1.e66666p-1 eps 0x1.5798eep-27 weight_decay "
    "0x1.99999ap-4 grad_clip 0x1p+0 t 1\n"
    "lossscale scale 0x1p+16 good 3 hysteresis 2\n"
    "file rank 0 chunk 0 tp 0 pp 0 dp 0 name rank_00000.bin bytes 48032 hash e766c3129c7b215c "
    "params 3992 opt_start 0 opt_count 3992 layers 0+1 heads 0+1 ffn 0+32 vocab 0+384 "
    "embedding 1 head 1\n"
    "end\n";

/* base with the value after `key` on the line of `record` replaced by value (key NULL: the
 * record's one value, "step N"); NULL when there is no such field. */
static char *edit(const char *record, const char *key, const char *value) {
    char head[64], field[64];
    snprintf(head, sizeof head, "\n%s ", record);
    const char *line = strstr(base, head);
    if (!line) return NULL;
    line++;
    const char *eol = strchr(line, '\n'), *at = line + strlen(record) + 1;
    if (key) {
        snprintf(field, sizeof field, " %s ", key);
        at = strstr(line, field);
        if (!at || at > eol) return NULL;
        at += strlen(field);
    }
    const char *end = at + strcspn(at, " \n");
    size_t n = strlen(base) + strlen(value) + 1;
    char *out = malloc(n);
    snprintf(out, n, "%.*s%s%s", (int)(at - base), base, value, end);
    return out;
}

struct bad {
    const char *record, *key, *value;
};

/* Values that parse with strtoll / strtod / strtoull but are not what the field can hold. */
static const struct bad cases[] = {
    {"step", NULL, "-1"}, {"step", NULL, "1x"}, {"step", NULL, "4294967296"},
    {"model", "L", "0"}, {"model", "C", "-8"}, {"model", "NH", "one"},
    {"layout", "world", "0"}, {"layout", "tp", "0"}, {"layout", "pp", "-1"},
    {"layout", "dp", "0"}, {"layout", "zero", "4"}, {"layout", "zero", "-1"},
    {"layout", "sp", "2"}, {"layout", "virtual", "0"},
    {"data", "epoch", "-1"}, {"data", "index", "-1"}, {"data", "B", "0"}, {"data", "T", "0"},
    {"data", "accum", "0"}, {"data", "seed", "abc"}, {"data", "seed", "-1"},
    {"data", "seed", "12x"}, {"data", "seed", "18446744073709551616"}, {"data", "seed", "+5"},
    {"schedule", "max_lr", "nan"}, {"schedule", "max_lr", "inf"}, {"schedule", "max_lr", "-1"},
    {"schedule", "max_lr", "0x1p+200"}, {"schedule", "min_lr", "-0x1p-10"},
    {"schedule", "min_lr", "nan"}, {"schedule", "warmup", "-1"}, {"schedule", "total", "0"},
    {"schedule", "total", "1.5"},
    {"adamw", "beta1", "1"}, {"adamw", "beta1", "-0.5"}, {"adamw", "beta1", "nan"},
    {"adamw", "beta2", "0x1p+0"}, {"adamw", "eps", "0"}, {"adamw", "eps", "-1e-8"},
    {"adamw", "eps", "inf"}, {"adamw", "weight_decay", "-0.1"},
    {"adamw", "weight_decay", "nan"}, {"adamw", "grad_clip", "-1"},
    {"adamw", "grad_clip", "inf"}, {"adamw", "t", "-4"}, {"adamw", "t", "2.0"},
    {"adamw", "t", "99999999999999999999"},
    {"lossscale", "scale", "nan"}, {"lossscale", "scale", "0"}, {"lossscale", "good", "-1"},
    {"lossscale", "hysteresis", "x"},
    {"file", "rank", "-1"}, {"file", "chunk", "1"}, {"file", "tp", "-1"}, {"file", "tp", "1048576"},
    {"file", "pp", "4294967296"}, {"file", "dp", "-1"}, {"file", "bytes", "-48032"},
    {"file", "bytes", "48032b"}, {"file", "hash", "xyz"}, {"file", "hash", "e766c3129c7b215"},
    {"file", "hash", "-766c3129c7b215c"}, {"file", "params", "-1"},
    {"file", "opt_start", "-1"}, {"file", "opt_count", "-3992"}, {"file", "embedding", "2"},
    {"file", "head", "-1"},
};

/* Each bounded field's range (src/ckpt/manifest.c): LO and HI as written, and a value just below
 * and one just above. The field's own bound must take LO and HI (the manifest may still be refused
 * by a later rule, e.g. a model too large for l3d_gpt_config_finish, but never for that field's
 * value) and refuse the two others, naming them. Written out, so that a bound changed in the
 * parser fails here. */
struct range {
    const char *record, *key, *lo, *hi, *below, *above;
};
#define FMAX "1074790400" /* FIELD_MAX: 2^30 + 2^20 */
#define CMAX "4611686018427387904" /* COUNT_MAX: 2^62 */
static const struct range ranges[] = {
    {"step", NULL, "0", "2147483647", "-1", "2147483648"},
    {"model", "L", "1", FMAX, "0", "1074790401"},
    {"model", "C", "1", FMAX, "0", "1074790401"},
    {"model", "NH", "1", FMAX, "0", "1074790401"},
    {"model", "V", "2", FMAX, "1", "1074790401"},
    {"model", "Vp", "2", FMAX, "1", "1074790401"},
    {"model", "maxT", "1", FMAX, "0", "1074790401"},
    {"layout", "world", "1", "1048576", "0", "1048577"},
    {"layout", "tp", "1", "1048576", "0", "1048577"},
    {"layout", "pp", "1", "1048576", "0", "1048577"},
    {"layout", "dp", "1", "1048576", "0", "1048577"},
    {"layout", "zero", "0", "3", "-1", "4"},
    {"layout", "sp", "0", "1", "-1", "2"},
    {"layout", "virtual", "1", "256", "0", "257"},
    {"data", "epoch", "0", CMAX, "-1", "4611686018427387905"},
    {"data", "index", "0", CMAX, "-1", "4611686018427387905"},
    {"data", "B", "1", FMAX, "0", "1074790401"},
    {"data", "T", "1", FMAX, "0", "1074790401"},
    {"data", "accum", "1", FMAX, "0", "1074790401"},
    {"data", "seed", "0", "18446744073709551615", "-1", "18446744073709551616"},
    {"schedule", "max_lr", "0", "0x1.fffffep+127", "-0x1p-149", "0x1p+128"},
    {"schedule", "min_lr", "0", "0x1.fffffep+127", "-0x1p-149", "0x1p+128"},
    {"schedule", "warmup", "0", FMAX, "-1", "1074790401"},
    {"schedule", "total", "1", FMAX, "0", "1074790401"},
    {"adamw", "beta1", "0", "0x1.fffffep-1", "-0x1p-149", "0x1p+0"},
    {"adamw", "beta2", "0", "0x1.fffffep-1", "-0x1p-149", "0x1p+0"},
    {"adamw", "eps", "0x1p-149", "0x1.fffffep+127", "0x1p-151", "0x1p+128"},
    {"adamw", "weight_decay", "0", "0x1.fffffep+127", "-0x1p-149", "0x1p+128"},
    {"adamw", "grad_clip", "0", "0x1.fffffep+127", "-0x1p-149", "0x1p+128"},
    {"adamw", "t", "0", CMAX, "-1", "4611686018427387905"},
    {"lossscale", "scale", "0x1p-1074", "0x1.fffffffffffffp+1023", "0x1p-1076", "0x1p+1024"},
    {"lossscale", "good", "0", CMAX, "-1", "4611686018427387905"},
    {"lossscale", "hysteresis", "0", CMAX, "-1", "4611686018427387905"},
    {"file", "rank", "0", "0", "-1", "1"}, /* 0 to world - 1 */
    {"file", "chunk", "0", "0", "-1", "1"}, /* 0 to virtual - 1 */
    {"file", "tp", "0", "1048575", "-1", "1048576"},
    {"file", "pp", "0", "1048575", "-1", "1048576"},
    {"file", "dp", "0", "1048575", "-1", "1048576"},
    {"file", "bytes", "0", CMAX, "-1", "4611686018427387905"},
    {"file", "params", "0", CMAX, "-1", "4611686018427387905"},
    {"file", "opt_start", "0", CMAX, "-1", "4611686018427387905"},
    {"file", "opt_count", "0", CMAX, "-1", "4611686018427387905"},
    {"file", "layers", "0+0", "1073741823+1073741823", "-1+0", "1073741824+0"},
    {"file", "heads", "0+0", "0+1073741823", "0+-1", "0+1073741824"},
    {"file", "embedding", "0", "1", "-1", "2"},
    {"file", "head", "0", "1", "-1", "2"},
};

/* Whether the manifest with the field set to value is refused for that value (the message names
 * record, field and value as the bad one). */
static bool field_refused(const struct range *r, const char *value) {
    char *text = edit(r->record, r->key, value);
    CHECK(text != NULL);
    if (!text) return false;
    char want[160];
    if (r->key) snprintf(want, sizeof want, ": %s %s '%s' ", r->record, r->key, value);
    else snprintf(want, sizeof want, ": %s '%s' ", r->record, value);
    bool bad = l3d_ckpt_manifest_check(text, strlen(text)) == L3D_ERR_FORMAT &&
               strstr(l3d_error_message(), want) != NULL;
    free(text);
    return bad;
}

static void test_ranges(void) {
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
        const struct range *r = &ranges[i];
        bool lo = !field_refused(r, r->lo), hi = !field_refused(r, r->hi);
        bool below = field_refused(r, r->below), above = field_refused(r, r->above);
        CHECK(lo && hi && below && above);
        if (!(lo && hi && below && above))
            fprintf(stderr, "  %s %s: %s %s, %s %s, %s %s, %s %s\n", r->record, r->key ? r->key : "",
                    r->lo, lo ? "taken" : "REFUSED", r->hi, hi ? "taken" : "REFUSED", r->below,
                    below ? "refused" : "TAKEN", r->above, above ? "refused" : "TAKEN");
    }
    /* the bounds of the whole: a manifest with both ends of a field that only it limits loads */
    char *text = edit("layout", "virtual", "1");
    CHECK(text && l3d_ckpt_manifest_check(text, strlen(text)) == L3D_OK);
    free(text);
    printf("%d manifest ranges checked\n", (int)(sizeof ranges / sizeof ranges[0]));
}

int main(void) {
    test_ranges();
    CHECK(l3d_ckpt_manifest_check(base, strlen(base)) == L3D_OK); /* the cases can fail */
    if (l3d_ckpt_manifest_check(base, strlen(base)) != L3D_OK)
        fprintf(stderr, "base: %s\n", l3d_error_message());
    /* the edit itself works: a valid value in place of another still parses */
    char *same = edit("adamw", "t", "7");
    CHECK(same && strstr(same, " t 7\n") && l3d_ckpt_manifest_check(same, strlen(same)) == L3D_OK);
    free(same);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const struct bad *c = &cases[i];
        char *text = edit(c->record, c->key, c->value);
        CHECK(text != NULL);
        if (!text) continue;
        l3d_status st = l3d_ckpt_manifest_check(text, strlen(text));
        /* "(text)/manifest line 9: adamw t '-4' is ...": the file, the line, the record, the
         * field and the value */
        char want[160];
        if (c->key)
            snprintf(want, sizeof want, ": %s %s '%s' ", c->record, c->key, c->value);
        else
            snprintf(want, sizeof want, ": %s '%s' ", c->record, c->value);
        const char *msg = st == L3D_OK ? "(accepted)" : l3d_error_message();
        bool named = st == L3D_ERR_FORMAT && strstr(msg, "(text)/manifest line ") == msg &&
                     strstr(msg, want) != NULL;
        CHECK(named);
        if (!named)
            fprintf(stderr, "  %s %s %s: %s\n", c->record, c->key ? c->key : "", c->value, msg);
        free(text);
    }
    printf("%d manifest edits checked\n", (int)(sizeof cases / sizeof cases[0]));
    return TEST_REPORT();
}
