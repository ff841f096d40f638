/* Private to src/ckpt: what its files share. The sharded checkpoints (include/llm3d/ckpt.h) are
 * four files with one job each: fileio.c (the checksum, whole reads and writes, host staging of
 * device memory, atomic text files), manifest.c (the manifest's text: printed, parsed, checked),
 * save.c and load.c; llmc.c is llm.c's single-file format. */
#ifndef LLM3D_CKPT_IMPL_H
#define LLM3D_CKPT_IMPL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "llm3d/ckpt.h"
#include "llm3d/file.h"
#include "llm3d/core.h"

/* Bytes of the host buffer that stages a transfer of `want` bytes between a file and device
 * memory: want, at most l3d_ckpt_stage_bytes() (64 MiB), at least 1. */
static inline size_t l3d_ckpt_stage_cap(size_t want) {
    size_t most = l3d_ckpt_stage_bytes();
    return want < most ? (want > 0 ? want : 1) : most;
}

/* ---- rank files ------------------------------------------------------------------------------
 * Every path is checked against L3D_CKPT_PATH_CAP (l3d_ckpt_long_path) where it enters, so that
 * the names built from it fit. */
#define L3D_CKPT_PATH_CAP 4096
#define L3D_CKPT_HEADER_BYTES 128    /* of a rank file from format 3 on */
#define L3D_CKPT_HEADER_BYTES_OLD 64 /* formats 1 and 2: no dtype names */
#define L3D_CKPT_FILE_MAGIC "L3DSHRD1" /* a rank file's first 8 bytes */

/* The element types of a chunk's parameters: the model's (in training an fp32 view,
 * l3d_gpt_fp32_view); of its AdamW moments: fp32, the type of l3d_adamw's m and v. On disk a
 * dtype is its name (l3d_dtype_name: the manifest's `dtype` record, the rank-file header), never
 * the enum's number. */
static inline enum l3d_dtype l3d_ckpt_params_dtype(const struct l3d_gpt *m) { return m->dt; }
#define L3D_CKPT_MOMENTS_DTYPE L3D_F32

/* The number of model chunks per rank of a layout (pp_virtual, 0 read as 1). */
static inline int l3d_ckpt_chunks_of(const struct l3d_ckpt_layout *lay) {
    return lay->layout.v > 1 ? lay->layout.v : 1;
}

/* ---- fileio.c -------------------------------------------------------------------------------- */

/* The checksum of rank files and manifests (fileio.c says which hash). */
struct l3d_ckpt_hasher {
    uint64_t lane[4];
    uint8_t pend[32];
    int npend;
    uint64_t len;
};
void l3d_ckpt_hash_init(struct l3d_ckpt_hasher *h);
void l3d_ckpt_hash_update(struct l3d_ckpt_hasher *h, const void *data, size_t n);
uint64_t l3d_ckpt_hash_final(const struct l3d_ckpt_hasher *h);

/* buf = a + sep + b (asserted to fit: the paths were checked by l3d_ckpt_long_path). */
void l3d_ckpt_join(char *buf, size_t cap, const char *a, const char *sep, const char *b);
/* L3D_ERR_ARG naming a path too long to build names under. */
l3d_status l3d_ckpt_long_path(const char *p);
/* n bytes to fd (hashed into h unless NULL); n bytes at offset off of path. */
l3d_status l3d_ckpt_write_all(int fd, const char *path, const void *buf, size_t n,
                              struct l3d_ckpt_hasher *h);
l3d_status l3d_ckpt_read_at(const char *path, int64_t off, void *buf, size_t n);

/* A host staging buffer for transfers of up to `want` bytes (l3d_ckpt_stage_cap: 64 MiB). */
struct l3d_ckpt_stage {
    void *p;
    size_t cap;
};
l3d_status l3d_ckpt_stage_init(struct l3d_ckpt_stage *sg, size_t want, const char *path);
/* n bytes of be's device memory at src written to fd through sg; n bytes at off of path read
 * into be's device memory at dst (through a staging buffer of its own). */
l3d_status l3d_ckpt_write_device(int fd, const char *path, struct l3d_backend *be, const void *src,
                                 size_t n, const struct l3d_ckpt_stage *sg,
                                 struct l3d_ckpt_hasher *h);
l3d_status l3d_ckpt_read_device(const char *path, int64_t off, struct l3d_backend *be, void *dst,
                                size_t n);

l3d_status l3d_ckpt_fsync_path(const char *path);
/* text to path atomically (include/llm3d/file.h: a temporary beside it, fsync, rename). */
l3d_status l3d_ckpt_write_text_atomic(const char *path, const char *text);
/* A whole text file (at most 64 MiB; what names it in errors), NUL-terminated, into *text
 * (l3d_free it) and its length. */
l3d_status l3d_ckpt_read_text(const char *path, const char *what, char **text, size_t *len);

/* ---- manifest.c ------------------------------------------------------------------------------ */

/* What each rank tells rank 0 about each of its files (one per chunk), gathered as bytes: the
 * manifest's `file` record. */
struct l3d_ckpt_rank_rec {
    int64_t status, bytes, params, opt_start, opt_count;
    uint64_t hash;
    int64_t tp_rank, pp_rank, dp_rank, chunk;
    int64_t layer_start, layer_count, head_start, head_count, ffn_start, ffn_count, vocab_start,
        vocab_count, has_embedding, has_head;
    int64_t expert_start, expert_count; /* MoE models: the experts the file holds */
};

/* One `file` record as read. */
struct l3d_ckpt_mf_file {
    int rank, chunk, tp_rank, pp_rank, dp_rank;
    char name[64];
    int64_t bytes, params, opt_start, opt_count;
    uint64_t hash;
    struct l3d_shard shard;
};

/* A manifest as read. */
struct l3d_ckpt_manifest {
    char path[L3D_CKPT_PATH_CAP]; /* of the manifest, for messages */
    char dir[L3D_CKPT_PATH_CAP];
    struct l3d_model_spec cfg;
    struct l3d_ckpt_layout lay;
    struct l3d_ckpt_state st;
    int format, nc;          /* format version; chunks per rank (lay.layout.v, 1 in format 1) */
    enum l3d_dtype pdt, mdt; /* element types of the parameters and moments (fp32 before 3) */
    int64_t header;          /* bytes of a rank file's header */
    int nfiles;              /* lay.world x nc */
    struct l3d_ckpt_mf_file *files; /* nfiles, the piece of chunk c of rank r at r nc + c */
};

/* Bytes per stored parameter and moment element. */
static inline int64_t l3d_ckpt_psize(const struct l3d_ckpt_manifest *mf) {
    return (int64_t)l3d_dtype_size(mf->pdt);
}
static inline int64_t l3d_ckpt_msize(const struct l3d_ckpt_manifest *mf) {
    return (int64_t)l3d_dtype_size(mf->mdt);
}

/* The name of the file of chunk `chunk` of rank `rank`, with nc chunks per rank. */
void l3d_ckpt_piece_name(char *buf, size_t cap, int nc, int rank, int chunk);
/* The manifest of a save into buf (cap bytes, asserted enough): recs, lay->world x chunks. */
void l3d_ckpt_manifest_print(char *buf, size_t cap, const struct l3d_model_spec *c,
                             enum l3d_dtype pdt, enum l3d_dtype mdt,
                             const struct l3d_ckpt_layout *lay, const struct l3d_ckpt_state *s,
                             const struct l3d_ckpt_rank_rec *recs);
/* Reads and parses dir/manifest (a regular file, at most 1 GiB), every record present and every
 * value in its range; on success the caller frees it with l3d_ckpt_manifest_free. */
l3d_status l3d_ckpt_manifest_read(const char *dir, struct l3d_ckpt_manifest *mf);
void l3d_ckpt_manifest_free(struct l3d_ckpt_manifest *mf);
/* L3D_ERR_LAYOUT unless the manifest's layout can hold its model (every shard inside it, every
 * slice held by some rank file). */
l3d_status l3d_ckpt_manifest_check_layout(const struct l3d_ckpt_manifest *mf);

/* A manifest's text parsed and its layout checked against its model, as a load does before it
 * reads any rank file: the entry of the fuzz target tests/fuzz/fuzz_manifest.c and of
 * tests/test_manifest.c. */
l3d_status l3d_ckpt_manifest_check(const char *text, size_t len);

/* ---- a shard from the full model a strip of rows at a time (src/ckpt/reshard.c) -------------
 *
 * A load onto another layout than the source's (a checkpoint of another tp / pp, a Hugging Face
 * folder) never builds the full model: for each tensor and layer the shard holds, the rows of
 * the full tensor its rows come from are asked of the source a strip at a time (at most
 * l3d_ckpt_stage_bytes(), 64 MiB, of them, or one row), cut to the shard's elements and handed to
 * q->put in pieces of at most q->piece. The host holds three strips at most: the full rows, the
 * shard's cut of them, and the source's read buffer (struct l3d_ckpt_rows). */
struct l3d_ckpt_rows {
    /* rows [r0, r0 + n) of layer `layer` of the full model's tensor t (row-major, the full
     * tensor's columns) into out; NaN (checkpoints) or 0 (folders) where the source holds none */
    l3d_status (*read)(void *ctx, int t, int64_t layer, int64_t r0, int64_t n, float *out);
    void *ctx;
};
/* The elements of a strip: l3d_ckpt_stage_bytes() (64 MiB) of them, or a layer of the largest
 * tensor when less, but at least the widest row. */
int64_t l3d_ckpt_strip(const struct l3d_model_spec *cfg);
/* Shard sh's elements [q->lo, q->hi) from src, into q->put. what (non-NULL) names the source
 * for an element that is NaN: "no rank file holds" it, an error; NULL: not checked. */
l3d_status l3d_ckpt_reshard(const struct l3d_model_spec *cfg, const struct l3d_shard *sh,
                            const struct l3d_ckpt_rows *src, const struct l3d_ckpt_pieces *q,
                            const char *what, const char *name);

#endif
