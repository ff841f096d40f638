/* safetensors files (include/llm3d/hf.h): the header read and checked against its file, tensors
 * read as fp32, folders sharded by an index, and the writer. Every check happens before a tensor
 * is used, and each refusal names the file, the tensor and the value. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt-impl.h"
#include "llm3d/hf.h"
#include "llm3d/json.h"

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"

/* The format's dtypes (safetensors' Dtype enum) and their bytes; the first three are read. */
static const struct { const char *name; int bytes; enum l3d_dtype dt; } dtypes[] = {
    {"F32", 4, L3D_F32}, {"BF16", 2, L3D_BF16}, {"F16", 2, L3D_F16},
    {"F64", 8, L3D_F64}, {"I64", 8, L3D_I64},   {"U64", 8, L3D_I64},  {"I32", 4, L3D_I32},
    {"U32", 4, L3D_I32}, {"I16", 2, L3D_I32},   {"U16", 2, L3D_I32},  {"I8", 1, L3D_U8},
    {"U8", 1, L3D_U8},   {"BOOL", 1, L3D_U8},   {"F8_E4M3", 1, L3D_U8}, {"F8_E5M2", 1, L3D_U8},
};
#define NHANDLED 3

static uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static void put_le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

void l3d_st_close(struct l3d_st *st) {
    for (int i = 0; i < st->nfiles; i++) l3d_free(st->files[i]);
    for (int i = 0; i < st->n; i++) l3d_free(st->t[i].name);
    for (int i = 0; i < 2 * st->nmeta; i++) l3d_free(st->meta[i]);
    l3d_free(st->files);
    l3d_free(st->t);
    l3d_free(st->meta);
    memset(st, 0, sizeof *st);
}

/* p (old bytes, l3d_alloc'ed) moved into a new block of `bytes`. */
static void *grow(void *p, size_t old, size_t bytes) {
    void *q = l3d_alloc(bytes, "safetensors header");
    if (old) memcpy(q, p, old);
    l3d_free(p);
    return q;
}

static char *dup_str(const char *s) {
    size_t n = strlen(s);
    char *d = l3d_alloc(n + 1, "safetensors names");
    memcpy(d, s, n + 1);
    return d;
}

/* An array of at most `most` integers >= 0 into out, each written as one (digits only: "2.0" and
 * "2e0" are refused, as Python's safetensors refuses them); its length, or -1 with *bad the
 * element that is not one (NULL: no array, or a longer one). */
static int int_array(const struct l3d_json *v, int64_t *out, int most,
                     const struct l3d_json **bad) {
    *bad = NULL;
    if (!v || v->type != L3D_JSON_ARRAY || (int)v->count > most) return -1;
    for (size_t i = 0; i < v->count; i++) {
        const struct l3d_json *x = &v->items[i];
        if (!l3d_json_int(x, &out[i]) || out[i] < 0 || strpbrk(x->str, ".eE-")) {
            *bad = x;
            return -1;
        }
    }
    return (int)v->count;
}

/* The refusal of a "shape" or "data_offsets" that int_array did not take. */
static l3d_status bad_ints(const char *path, const char *name, const char *key,
                           const struct l3d_json *bad, const char *want) {
    if (bad && bad->type == L3D_JSON_NUMBER)
        return l3d_error(L3D_ERR_FORMAT, "%s: tensor %s: \"%s\" element %.40s is not an integer "
                         ">= 0 written as one (digits only): give %s", path, name, key, bad->str,
                         want);
    return l3d_error(L3D_ERR_FORMAT, "%s: tensor %s: \"%s\" is not %s", path, name, key, want);
}

/* One header entry into t, checked against the data's size (bytes after the header). */
static l3d_status parse_entry(const char *path, const char *name, const struct l3d_json *v,
                              int64_t data_start, int64_t data_size, struct l3d_st_tensor *t) {
    const char *dt = l3d_json_str(l3d_json_get(v, "dtype"));
    if (!dt)
        return l3d_error(L3D_ERR_FORMAT, "%s: tensor %s: no \"dtype\" string", path, name);
    int k = 0, nd = (int)(sizeof dtypes / sizeof dtypes[0]);
    while (k < nd && strcmp(dtypes[k].name, dt) != 0) k++;
    if (k == nd)
        return l3d_error(L3D_ERR_FORMAT, "%s: tensor %s: dtype \"%.20s\" is not a safetensors "
                         "dtype", path, name, dt);
    snprintf(t->dtype_name, sizeof t->dtype_name, "%s", dt);
    t->dtype = dtypes[k].dt;
    t->handled = k < NHANDLED;
    const struct l3d_json *bad;
    t->ndim = int_array(l3d_json_get(v, "shape"), t->shape, L3D_ST_MAX_DIMS, &bad);
    if (t->ndim < 0)
        return bad_ints(path, name, "shape", bad, "a list of at most 8 sizes >= 0");
    t->count = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] > ((int64_t)1 << 40) || (t->shape[i] && t->count > ((int64_t)1 << 56) /
                                                 t->shape[i]))
            return l3d_error(L3D_ERR_FORMAT, "%s: tensor %s: shape too large (dimension %d is "
                             "%lld)", path, name, i, (long long)t->shape[i]);
        t->count *= t->shape[i];
    }
    int64_t off[2];
    if (int_array(l3d_json_get(v, "data_offsets"), off, 2, &bad) != 2)
        return bad_ints(path, name, "data_offsets", bad, "[BEGIN, END]");
    if (off[0] > off[1] || off[1] > data_size)
        return l3d_error(L3D_ERR_FORMAT, "%s: tensor %s: data_offsets [%lld, %lld] out of range: "
                         "the data holds %lld bytes", path, name, (long long)off[0],
                         (long long)off[1], (long long)data_size);
    if (off[1] - off[0] != t->count * dtypes[k].bytes)
        return l3d_error(L3D_ERR_FORMAT, "%s: tensor %s: data_offsets [%lld, %lld] hold %lld "
                         "bytes, its shape and dtype %s need %lld", path, name, (long long)off[0],
                         (long long)off[1], (long long)(off[1] - off[0]), dt,
                         (long long)(t->count * dtypes[k].bytes));
    t->offset = data_start + off[0];
    t->bytes = off[1] - off[0];
    t->name = dup_str(name);
    return L3D_OK;
}

static int by_offset(const void *a, const void *b) {
    const struct l3d_st_tensor *x = *(struct l3d_st_tensor *const *)a,
                               *y = *(struct l3d_st_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset ? 1 : 0;
}

static int by_name(const void *a, const void *b) {
    return strcmp((*(struct l3d_st_tensor *const *)a)->name,
                  (*(struct l3d_st_tensor *const *)b)->name);
}

/* No two tensors of file `file` share a byte; no name twice in st. */
static l3d_status check_overlaps(const struct l3d_st *st, int first) {
    int n = st->n - first;
    l3d_status rc = L3D_OK;
    struct l3d_st_tensor **p = l3d_alloc((size_t)(st->n > 0 ? st->n : 1) * sizeof *p, "header");
    for (int i = 0; i < n; i++) p[i] = &st->t[first + i];
    qsort(p, (size_t)n, sizeof *p, by_offset);
    int64_t end = 0;
    const struct l3d_st_tensor *last = NULL;
    for (int i = 0; i < n && rc == L3D_OK; i++) {
        if (p[i]->bytes == 0) continue;
        if (last && p[i]->offset < end)
            rc = l3d_error(L3D_ERR_FORMAT, "%s: tensors %s and %s overlap (file bytes %lld..%lld "
                           "and from %lld)", st->files[p[i]->file], last->name, p[i]->name,
                           (long long)last->offset, (long long)end, (long long)p[i]->offset);
        end = p[i]->offset + p[i]->bytes;
        last = p[i];
    }
    for (int i = 0; i < st->n; i++) p[i] = &st->t[i];
    qsort(p, (size_t)st->n, sizeof *p, by_name);
    for (int i = 1; i < st->n && rc == L3D_OK; i++)
        if (strcmp(p[i - 1]->name, p[i]->name) == 0)
            rc = l3d_error(L3D_ERR_FORMAT, "%s: tensor %s appears twice (also in %s)",
                           st->files[p[i]->file], p[i]->name, st->files[p[i - 1]->file]);
    l3d_free(p);
    return rc;
}

/* The data of tensors [first, st->n) ends at the file's end, as Python's safetensors requires: bytes
 * after it are appended, or the tail of a tensor the header lost. */
static l3d_status check_trailing(const struct l3d_st *st, int first, const char *path,
                                 int64_t data_start, int64_t size) {
    int64_t end = data_start;
    for (int i = first; i < st->n; i++)
        if (st->t[i].offset + st->t[i].bytes > end) end = st->t[i].offset + st->t[i].bytes;
    if (end == size) return L3D_OK;
    return l3d_error(L3D_ERR_FORMAT, "%s: %lld bytes after the last tensor's data (it ends at byte "
                     "%lld of the file's %lld): appended data, or a tensor the header lost; write "
                     "the file again", path, (long long)(size - end), (long long)end,
                     (long long)size);
}

/* The header's text, checked against the file's size. */
static l3d_status read_header(const char *path, char **text, int64_t *hlen, int64_t *size) {
    FILE *f;
    l3d_status rc = l3d_fopen_regular(path, "safetensors file", &f, size);
    if (rc != L3D_OK) return rc;
    uint8_t b[8];
    if (*size < 8 || fread(b, 1, 8, f) != 8) {
        fclose(f);
        return l3d_error(L3D_ERR_FORMAT, "%s: %lld bytes, shorter than the 8-byte header length "
                         "of a safetensors file", path, (long long)*size);
    }
    uint64_t n = le64(b);
    if (n > (uint64_t)(*size - 8) || n > (uint64_t)L3D_ST_MAX_HEADER || n < 2) {
        fclose(f);
        return l3d_error(L3D_ERR_FORMAT, "%s: header length %llu %s (the file has %lld bytes): not "
                         "a safetensors file, or truncated", path, (unsigned long long)n,
                         n < 2 ? "too small" : n > (uint64_t)(*size - 8) ? "past the file's end"
                                                                  : "above the 100 MB limit",
                         (long long)*size);
    }
    *text = l3d_alloc((size_t)n + 1, "safetensors header");
    if (fread(*text, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        l3d_free(*text);
        return l3d_error(L3D_ERR_IO, "%s: cannot read its %llu-byte header", path,
                         (unsigned long long)n);
    }
    fclose(f);
    (*text)[n] = '\0';
    *hlen = (int64_t)n;
    return L3D_OK;
}

static l3d_status parse_meta(struct l3d_st *st, const char *path, const struct l3d_json *v) {
    if (v->type != L3D_JSON_OBJECT)
        return l3d_error(L3D_ERR_FORMAT, "%s: __metadata__ is %s, not an object", path,
                         l3d_json_type_name(v->type));
    for (size_t i = 0; i < v->count; i++)
        if (!l3d_json_str(&v->items[i]))
            return l3d_error(L3D_ERR_FORMAT, "%s: __metadata__ \"%s\" is not a string", path,
                             v->keys[i].str);
    if (st->nmeta) return L3D_OK; /* the first file's */
    st->meta = l3d_alloc((2 * v->count + 1) * sizeof *st->meta, "safetensors metadata");
    for (size_t i = 0; i < v->count; i++) {
        st->meta[2 * i] = dup_str(v->keys[i].str);
        st->meta[2 * i + 1] = dup_str(v->items[i].str);
    }
    st->nmeta = (int)v->count;
    return L3D_OK;
}

l3d_status l3d_st_open_file(struct l3d_st *st, const char *path) {
    char *text = NULL;
    int64_t hlen = 0, size = 0;
    l3d_status rc = read_header(path, &text, &hlen, &size);
    if (rc != L3D_OK) return rc;
    struct l3d_json doc;
    rc = l3d_json_parse(&doc, text, (size_t)hlen, path);
    if (rc == L3D_OK && doc.type != L3D_JSON_OBJECT)
        rc = l3d_error(L3D_ERR_FORMAT, "%s: the header is %s, not an object", path,
                       l3d_json_type_name(doc.type));
    int file = st->nfiles, first = st->n;
    if (rc == L3D_OK) {
        st->files = grow(st->files, (size_t)file * sizeof *st->files,
                         (size_t)(file + 1) * sizeof *st->files);
        st->files[st->nfiles++] = dup_str(path);
        st->t = grow(st->t, (size_t)st->n * sizeof *st->t,
                     (size_t)(st->n + (int)doc.count + 1) * sizeof *st->t);
    }
    for (size_t i = 0; rc == L3D_OK && i < doc.count; i++) {
        const char *name = doc.keys[i].str;
        if (strcmp(name, "__metadata__") == 0) {
            rc = parse_meta(st, path, &doc.items[i]);
            continue;
        }
        struct l3d_st_tensor *t = &st->t[st->n];
        memset(t, 0, sizeof *t);
        t->file = file;
        if (strlen(name) != doc.keys[i].len) /* "\u0000" in the JSON */
            rc = l3d_error(L3D_ERR_FORMAT, "%s: tensor %s\\u0000%s: a NUL byte in its name, which "
                           "no reader can look up: rename the tensor", path, name,
                           name + strlen(name) + 1);
        else if (doc.items[i].type != L3D_JSON_OBJECT)
            rc = l3d_error(L3D_ERR_FORMAT, "%s: tensor %s: %s, not an object", path, name,
                           l3d_json_type_name(doc.items[i].type));
        else
            rc = parse_entry(path, name, &doc.items[i], 8 + hlen, size - 8 - hlen, t);
        if (rc == L3D_OK) st->n++;
    }
    if (rc == L3D_OK) rc = check_overlaps(st, first);
    if (rc == L3D_OK) rc = check_trailing(st, first, path, 8 + hlen, size);
    l3d_json_free(&doc);
    l3d_free(text);
    return rc;
}

const struct l3d_st_tensor *l3d_st_find(const struct l3d_st *st, const char *name) {
    for (int i = 0; i < st->n; i++)
        if (strcmp(st->t[i].name, name) == 0) return &st->t[i];
    return NULL;
}

/* A shard's file name from an index: a plain name in the folder, nothing that leaves it. */
static bool plain_name(const char *s) {
    return s[0] && s[0] != '.' && !strchr(s, '/') && strlen(s) < 256;
}

/* The index's weight_map: each shard opened once, each entry found in the shard it names. */
static l3d_status open_index(struct l3d_st *st, const char *dir, const char *index) {
    char *text = NULL;
    size_t len = 0;
    l3d_status rc = l3d_ckpt_read_text(index, "safetensors index", &text, &len);
    if (rc != L3D_OK) return rc;
    struct l3d_json doc;
    rc = l3d_json_parse(&doc, text, len, index);
    const struct l3d_json *map = rc == L3D_OK ? l3d_json_get(&doc, "weight_map") : NULL;
    if (rc == L3D_OK && (!map || map->type != L3D_JSON_OBJECT))
        rc = l3d_error(L3D_ERR_FORMAT, "%s: no \"weight_map\" object", index);
    else if (rc == L3D_OK && map->count == 0)
        rc = l3d_error(L3D_ERR_FORMAT, "%s: \"weight_map\" is empty: the index names no tensor "
                       "and no shard; write it again (every tensor: its shard's file name)", index);
    for (size_t i = 0; rc == L3D_OK && i < map->count; i++) {
        const char *file = l3d_json_str(&map->items[i]), *name = map->keys[i].str;
        if (!file || !plain_name(file)) {
            rc = l3d_error(L3D_ERR_FORMAT, "%s: weight_map \"%s\": not a file name in the folder",
                           index, name);
            break;
        }
        char path[L3D_CKPT_PATH_CAP];
        l3d_ckpt_join(path, sizeof path, dir, "/", file);
        int f = 0;
        while (f < st->nfiles && strcmp(st->files[f], path) != 0) f++;
        if (f == st->nfiles) {
            struct stat sb;
            if (stat(path, &sb) != 0) {
                rc = l3d_error(L3D_ERR_IO, "%s names shard %s (for tensor %s), which is missing: "
                               "%s", index, file, name, strerror(errno));
                break;
            }
            rc = l3d_st_open_file(st, path);
        }
        const struct l3d_st_tensor *t = rc == L3D_OK ? l3d_st_find(st, name) : NULL;
        if (rc == L3D_OK && (!t || t->file != f))
            rc = l3d_error(L3D_ERR_FORMAT, "%s: tensor %s is not in %s, the shard its weight_map "
                           "names", index, name, file);
    }
    /* each entry is a tensor of its shard, no name twice: equal counts, every tensor listed */
    for (int i = 0; rc == L3D_OK && st->n != (int)map->count && i < st->n; i++)
        if (!l3d_json_get(map, st->t[i].name)) {
            const char *shard = strrchr(st->files[st->t[i].file], '/');
            rc = l3d_error(L3D_ERR_FORMAT, "%s: tensor %s of %s is not in its weight_map: a reader "
                           "of the index would miss it; list it, or remove it from the shard",
                           index, st->t[i].name, shard ? shard + 1 : st->files[st->t[i].file]);
        }
    l3d_json_free(&doc);
    l3d_free(text);
    return rc;
}

l3d_status l3d_st_open_dir(struct l3d_st *st, const char *dir) {
    memset(st, 0, sizeof *st);
    l3d_status rc = l3d_ckpt_long_path(dir);
    if (rc != L3D_OK) return rc;
    char single[L3D_CKPT_PATH_CAP], index[L3D_CKPT_PATH_CAP];
    l3d_ckpt_join(single, sizeof single, dir, "/", SINGLE_NAME);
    l3d_ckpt_join(index, sizeof index, dir, "/", INDEX_NAME);
    struct stat sb;
    if (stat(single, &sb) == 0) rc = l3d_st_open_file(st, single);
    else if (stat(index, &sb) == 0) rc = open_index(st, dir, index);
    else
        rc = l3d_error(L3D_ERR_IO, "%s holds neither %s nor %s: not a Hugging Face model folder "
                       "(or one of other weights, e.g. pytorch_model.bin, which llm3d does not "
                       "read)", dir, SINGLE_NAME, INDEX_NAME);
    if (rc != L3D_OK) l3d_st_close(st);
    return rc;
}

l3d_status l3d_st_read_f32_range(const struct l3d_st *st, const struct l3d_st_tensor *t,
                                 int64_t first, int64_t count, float *out) {
    const char *path = st->files[t->file];
    if (!t->handled)
        return l3d_error(L3D_ERR_FORMAT, "%s: tensor %s has dtype %s; llm3d reads F32, BF16 and "
                         "F16 weights", path, t->name, t->dtype_name);
    L3D_ASSERT(first >= 0 && count >= 0 && first + count <= t->count);
    l3d_status rc = L3D_OK;
    if (t->dtype == L3D_F32) {
        rc = l3d_ckpt_read_at(path, t->offset + 4 * first, out, (size_t)count * 4);
    } else { /* 16-bit: a staging buffer at a time, widened */
        const int64_t chunk = 1 << 22;
        uint16_t *h = l3d_alloc((size_t)(count < chunk ? count : chunk) * 2 + 2, "stage");
        for (int64_t i = 0, k; rc == L3D_OK && i < count; i += k) {
            k = count - i < chunk ? count - i : chunk;
            rc = l3d_ckpt_read_at(path, t->offset + 2 * (first + i), h, (size_t)k * 2);
            for (int64_t j = 0; rc == L3D_OK && j < k; j++)
                out[i + j] = t->dtype == L3D_BF16 ? l3d_bf16_to_f32(h[j]) : l3d_f16_to_f32(h[j]);
        }
        l3d_free(h);
    }
    for (int64_t i = 0; rc == L3D_OK && i < count; i++)
        if (!isfinite(out[i]))
            rc = l3d_error(L3D_ERR_FORMAT, "%s: tensor %s: element %lld of %lld is %s: the file is "
                           "damaged or its run diverged", path, t->name, (long long)(first + i),
                           (long long)t->count, isnan(out[i]) ? "NaN" : "infinite");
    return rc;
}

l3d_status l3d_st_read_f32(const struct l3d_st *st, const struct l3d_st_tensor *t, float *out) {
    return l3d_st_read_f32_range(st, t, 0, t->count, out);
}

/* ---- the writer --------------------------------------------------------------------------- */

/* s as a JSON string's content (names are ours, but escaped all the same). */
static void json_escaped(FILE *f, const char *s) {
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
}

static const char *dtype_tag(enum l3d_dtype dt) {
    return dt == L3D_BF16 ? "BF16" : dt == L3D_F16 ? "F16" : "F32";
}

/* The header of entries [a, b) (data offsets from 0), padded with spaces to a multiple of 8 bytes
 * with its length field, as the reference writer aligns the data. */
static char *header_text(const struct l3d_st_entry *e, int a, int b, enum l3d_dtype dt,
                         size_t *len) {
    const int64_t es = (int64_t)l3d_dtype_size(dt);
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f) l3d_fatal(__FILE__, __LINE__, "out of memory for a safetensors header");
    fprintf(f, "{\"__metadata__\":{\"format\":\"pt\"}");
    int64_t off = 0;
    for (int i = a; i < b; i++) {
        int64_t n = 1;
        fputs(",\"", f);
        json_escaped(f, e[i].name);
        fprintf(f, "\":{\"dtype\":\"%s\",\"shape\":[", dtype_tag(dt));
        for (int d = 0; d < e[i].ndim; d++) {
            fprintf(f, "%s%lld", d ? "," : "", (long long)e[i].shape[d]);
            n *= e[i].shape[d];
        }
        fprintf(f, "],\"data_offsets\":[%lld,%lld]}", (long long)off,
                (long long)(off + n * es));
        off += n * es;
    }
    fputc('}', f);
    fflush(f);
    while ((8 + *len) % 8) fputc(' ', f), fflush(f);
    fclose(f);
    return buf;
}

static int64_t entry_count(const struct l3d_st_entry *e) {
    int64_t n = 1;
    for (int d = 0; d < e->ndim; d++) n *= e->shape[d];
    return n;
}

/* Entries [a, b) into path, through the one file writer (a temporary, fsync, rename); buf
 * stages a tensor's fp32 values, half (16-bit dt only) their narrowed copy. */
static l3d_status write_shard(const char *path, const struct l3d_st_entry *e, int a, int b,
                              l3d_st_fill fill, void *ctx, enum l3d_dtype dt, float *buf,
                              uint16_t *half) {
    size_t es = l3d_dtype_size(dt), hlen;
    struct l3d_out o;
    if (l3d_out_open(&o, path, "safetensors file") != L3D_OK) return o.st;
    char *hdr = header_text(e, a, b, dt, &hlen);
    uint8_t len[8];
    put_le64(len, hlen);
    l3d_out_write(&o, len, 8);
    l3d_out_write(&o, hdr, hlen);
    free(hdr); /* open_memstream's */
    for (int i = a; o.st == L3D_OK && i < b; i++) {
        int64_t n = entry_count(&e[i]);
        fill(ctx, i, buf);
        for (int64_t j = 0; dt != L3D_F32 && j < n; j++)
            half[j] = dt == L3D_BF16 ? l3d_f32_to_bf16(buf[j]) : l3d_f32_to_f16(buf[j]);
        l3d_out_write(&o, dt == L3D_F32 ? (const void *)buf : (const void *)half,
                      (size_t)n * es);
    }
    return l3d_out_commit(&o);
}

/* Removes dir's files of a layout other than the one just written: the single file or index,
 * and shard files model-K-of-N.safetensors of another N; with nshards 0, all of them. */
static void remove_stale(const char *dir, int nshards) {
    char p[L3D_CKPT_PATH_CAP];
    l3d_ckpt_join(p, sizeof p, dir, "/", nshards > 1 ? SINGLE_NAME : INDEX_NAME);
    unlink(p);
    if (nshards == 0) {
        l3d_ckpt_join(p, sizeof p, dir, "/", SINGLE_NAME);
        unlink(p);
    }
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        int k, n, used = 0;
        if (sscanf(de->d_name, "model-%5d-of-%5d.safetensors%n", &k, &n, &used) == 2 &&
            de->d_name[used] == '\0' && n != nshards) {
            l3d_ckpt_join(p, sizeof p, dir, "/", de->d_name);
            unlink(p);
        }
    }
    if (d) closedir(d);
}

bool l3d_st_owned(const char *name) {
    int k, n, used = 0;
    return strcmp(name, SINGLE_NAME) == 0 || strcmp(name, INDEX_NAME) == 0 ||
           strcmp(name, "config.json") == 0 ||
           (sscanf(name, "model-%5d-of-%5d.safetensors%n", &k, &n, &used) == 2 &&
            name[used] == '\0');
}

static l3d_status write_index(const char *dir, const struct l3d_st_entry *e, int n,
                              const int *shard_of, int nshards, int64_t total) {
    char *text = NULL, path[L3D_CKPT_PATH_CAP];
    size_t len;
    FILE *f = open_memstream(&text, &len);
    if (!f) l3d_fatal(__FILE__, __LINE__, "out of memory for a safetensors index");
    fprintf(f, "{\n  \"metadata\": {\"total_size\": %lld},\n  \"weight_map\": {",
            (long long)total);
    for (int i = 0; i < n; i++) {
        fprintf(f, "%s\n    \"", i ? "," : "");
        json_escaped(f, e[i].name);
        fprintf(f, "\": \"model-%05d-of-%05d.safetensors\"", shard_of[i] + 1, nshards);
    }
    fprintf(f, "\n  }\n}\n");
    fclose(f);
    l3d_ckpt_join(path, sizeof path, dir, "/", INDEX_NAME);
    l3d_status rc = l3d_ckpt_write_text_atomic(path, text);
    free(text);
    return rc;
}

l3d_status l3d_st_write(const char *dir, const struct l3d_st_entry *e, int n, l3d_st_fill fill,
                        void *ctx, enum l3d_dtype dt, int64_t shard_bytes) {
    L3D_ASSERT(dt == L3D_F32 || dt == L3D_BF16 || dt == L3D_F16);
    l3d_status rc = l3d_ckpt_long_path(dir);
    if (rc != L3D_OK) return rc;
    int64_t es = (int64_t)l3d_dtype_size(dt), total = 0, cur = 0, most = 1;
    int *shard_of = l3d_alloc((size_t)(n + 1) * sizeof *shard_of, "shards"), nshards = 1;
    for (int i = 0; i < n; i++) { /* greedy: a new shard when this tensor would pass the size */
        int64_t b = entry_count(&e[i]) * es;
        if (cur > 0 && cur + b > shard_bytes) nshards++, cur = 0;
        shard_of[i] = nshards - 1;
        cur += b;
        total += b;
        most = entry_count(&e[i]) > most ? entry_count(&e[i]) : most;
    }
    float *buf = l3d_try_alloc((size_t)most * sizeof(float), "tensor staging");
    uint16_t *half = dt == L3D_F32 ? NULL : l3d_try_alloc((size_t)most * 2, "tensor staging");
    if (!buf || (dt != L3D_F32 && !half))
        rc = l3d_error(L3D_ERR_OOM, "%s: no memory for a %lld-element tensor", dir,
                       (long long)most);
    char path[L3D_CKPT_PATH_CAP], name[64];
    for (int s = 0, a = 0; rc == L3D_OK && s < nshards; s++) {
        int b = a;
        while (b < n && shard_of[b] == s) b++;
        if (nshards == 1) snprintf(name, sizeof name, SINGLE_NAME);
        else snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, nshards);
        l3d_ckpt_join(path, sizeof path, dir, "/", name);
        rc = write_shard(path, e, a, b, fill, ctx, dt, buf, half);
        a = b;
    }
    if (rc == L3D_OK && nshards > 1) rc = write_index(dir, e, n, shard_of, nshards, total);
    l3d_free(buf);
    l3d_free(half);
    l3d_free(shard_of);
    return rc;
}

bool l3d_st_remove(const char *dir) {
    char a[L3D_CKPT_PATH_CAP], b[L3D_CKPT_PATH_CAP];
    struct stat sb;
    if (l3d_ckpt_long_path(dir) != L3D_OK) return false;
    l3d_ckpt_join(a, sizeof a, dir, "/", SINGLE_NAME);
    l3d_ckpt_join(b, sizeof b, dir, "/", INDEX_NAME);
    if (stat(a, &sb) != 0 && stat(b, &sb) != 0) return false;
    remove_stale(dir, 0);
    return true;
}
