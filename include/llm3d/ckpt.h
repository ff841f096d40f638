/*
 * llm3d checkpoints: llm.c's single-file weights (GPT-2 in llm.c's versions, Llama-family models in
 * llm3d's 1003/1005), and sharded training checkpoints that resume exactly on the same layout and
 * by re-slicing on any other.
 *
 * llm.c weights:
 *
 *   l3d_ckpt_save_llmc("out/model.bin", model);              // full shard only
 *   struct l3d_model_spec cfg;
 *   l3d_ckpt_read_llmc_config("out/model.bin", &cfg);        // to size the model
 *   l3d_ckpt_load_llmc("out/model.bin", model);              // into a model of that config
 *
 * File (llm.c train_gpt2.c, gpt2_build_from_checkpoint): 256 int32 header, [0] = 20240326,
 * [1] = 3 (fp32), [2] = maxT, [3] = V, [4] = L, [5] = NH, [6] = C, [7] = Vp; then the 16 tensors in
 * llm.c's order as fp32, the padded wte rows included.
 *
 * Device memory: a model's parameters (m->params) and an optimizer's moments (opt.m, .v) belong
 * to the model's backend (m->be, include/llm3d/backend.h). Checkpoint code never touches them:
 * it copies them through host staging buffers (l3d_be_copy_d2h before a write, l3d_be_copy_h2d
 * after a read), at most 64 MiB at a time where a tensor streams straight between file and device;
 * re-slicing and NaN checks work on host copies. l3d_ckpt_save_llmc_params takes host memory.
 */
#ifndef LLM3D_CKPT_H
#define LLM3D_CKPT_H

#include <stdbool.h>

#include "llm3d/comm.h"
#include "llm3d/core.h"
#include "llm3d/spec.h"
#include "llm3d/data.h"
#include "llm3d/model.h"
#include "llm3d/optim.h"

#define L3D_LLMC_MAGIC 20240326
#define L3D_LLMC_VERSION_FP32 3
#define L3D_LLMC_VERSION_BF16 5 /* llm.c's bf16 file: the same layout, 2-byte parameters */
/* llm3d's files of other architectures (Llama): the same layout with the architecture in header
 * words 8-25 (l3d_gpt_plan_tensors' tensors in its order), versions that llm.c refuses rather
 * than misreads. */
#define L3D_LLMC_VERSION_ARCH_FP32 1003
#define L3D_LLMC_VERSION_ARCH_BF16 1005

/* Written atomically: a temporary file, fsync, then rename over path. Version 3 (fp32). Reading
 * takes version 3 and version 5 (bf16, widened to fp32 exactly). */
l3d_status l3d_ckpt_save_llmc(const char *path, const struct l3d_gpt *m);
/* The same from a full model's flat parameters (e.g. gathered from tensor-parallel shards). */
l3d_status l3d_ckpt_save_llmc_params(const char *path, const struct l3d_model_spec *cfg,
                                     const float *params, int64_t num_params);
/* The same as llm.c version 3 (dt L3D_F32) or version 5 (L3D_BF16: each parameter rounded to
 * nearest even). */
/* The next piece of the full model's flat fp32 parameters (host memory, valid until the next
 * call) and its element count *n > 0. */
typedef const float *(*l3d_ckpt_next)(void *ctx, int64_t *n);
/* model.bin (fp32) from the full model's parameters taken in order a piece at a time from next,
 * which is called until they are all taken (also when writing failed). */
l3d_status l3d_ckpt_save_llmc_pieces(const char *path, const struct l3d_model_spec *cfg,
                                     l3d_ckpt_next next, void *ctx);
l3d_status l3d_ckpt_save_llmc_params_dt(const char *path, const struct l3d_model_spec *cfg,
                                        const float *params, int64_t num_params,
                                        enum l3d_dtype dt);
l3d_status l3d_ckpt_read_llmc_config(const char *path, struct l3d_model_spec *cfg);
l3d_status l3d_ckpt_load_llmc(const char *path, struct l3d_gpt *m);
struct l3d_ckpt_pieces;
/* Into a view without parameters (m->params NULL) whose parameters go a piece at a time: the
 * elements [q->lo, q->hi) of its flat buffer, handed to q->put (include/llm3d/ckpt.h's struct
 * l3d_ckpt_pieces). The full shard reads only those, a piece at a time; another shard reads the
 * whole file on the host and cuts its slice. Checked finite (the pieces read: a range's
 * non-finite parameters are counted and the first named before anything is handed over after
 * it). */
l3d_status l3d_ckpt_load_llmc_pieces(const char *path, const struct l3d_gpt *m,
                                     const struct l3d_ckpt_pieces *q);
/* The file's parameters as the full model's flat fp32 buffer (host memory, l3d_gpt_param_count
 * of cfg, whose model the file must hold), checked finite. */
l3d_status l3d_ckpt_read_llmc_full(const char *path, const struct l3d_model_spec *cfg,
                                   float *full);

/* ---- sharded checkpoints (src/ckpt: save.c, load.c, manifest.c, fileio.c) --------------------
 *
 *   struct l3d_ckpt_layout lay = {.layout = {.tp = 2, .pp = 1, .dp = 2, .v = 1, .zero = 1},
 *                                 .world = 4, .tp_rank = topo.tp_rank,
 *                                 .pp_rank = topo.pp_rank, .dp_rank = topo.dp_rank};
 *   struct l3d_ckpt_state s = {.step = 50, .loader = l3d_loader_get_pos(ld), ...};
 *   l3d_ckpt_save("out/checkpoints", 3, world, &lay, &s, chunks, opts, NULL, &io, &report);
 *   char dir[4096];
 *   l3d_ckpt_resolve("auto", "out/checkpoints", dir, sizeof dir);  // "" when there is none
 *   l3d_ckpt_load(dir, world, &lay, chunks, opts, NULL, &s, &io, &report); // any layout
 *
 * chunks and opts hold the rank's lay.layout.v model chunks and their optimizers (one for a
 * rank without an interleaved schedule; chunk c of pipeline rank r is virtual stage c pp + r,
 * include/llm3d/pipeline.h). Each (rank, chunk) is one piece of the checkpoint, with its own file.
 *
 * On disk, one directory per saved step, ROOT/step_00000050/:
 *   manifest       text, one record per line: format version, model config, layout, step,
 *                  data-loader position, seed, learning-rate schedule, AdamW hyper-parameters and
 *                  step count, then one `file` line per piece (rank, then chunk): its coordinates,
 *                  its shard (layer range = pipeline stage; head, FFN-column and vocabulary ranges
 *                  = tensor-parallel slice; embedding / head), its optimizer range, size and
 *                  checksum; then `end`. Floats are C99 hex floats, exact; ranges START+COUNT. E.g.
 *                    file rank 1 tp 1 pp 0 dp 0 name rank_00001.bin bytes 485952 hash 9b... params
 *                    60736 opt_start 0 opt_count 30368 layers 0+2 heads 2+2 ffn 128+128 vocab
 *                    128+128 embedding 1 head 1
 *   rank_00003.bin a 128-byte header, then the piece's parameters (the shard's flat buffer, in the
 *                  order of l3d_gpt_plan_tensors; written by data-parallel rank 0 only), then
 *                  AdamW's m and v over its optimizer range [opt_start, opt_start + opt_count) of
 *                  that buffer (ZeRO >= 1: every rank its range; ZeRO-0: data-parallel rank 0).
 *                  Header: bytes 0..7 "L3DSHRD1", then int64 format, rank, step, params,
 *                  opt_count, opt_start, chunk (8..63), the parameters' and the moments' dtype
 *                  names NUL-padded (64..71, 72..79, e.g. "fp32"), zeros (80..127).
 * ROOT/latest names the newest complete step directory.
 *
 * Formats (the manifest's first line): 3, written since the dtypes were recorded, holds V =
 * lay.layout.v >= 1 chunks per rank: the record `dtype params fp32 moments fp32` follows the
 * model record (element types by name: fp32, bf16, fp16, fp64; sizes from l3d_dtype_size), the
 * layout record ends with `virtual V`, each file line has `chunk C`, and the file of chunk C of
 * rank R is rank_RRRRR.bin when V = 1, else rank_RRRRR_cC.bin, V lines per rank. Older formats
 * still load, as fp32 with a 64-byte header (bytes 0..63 above; no dtype record): 1 (one chunk
 * per rank, no `virtual` or `chunk`) and 2 (V > 1 chunks, `virtual V` and `chunk C` as in 3).
 * A checkpoint whose dtypes are not the run's is refused before any rank file is read (there is
 * no conversion on load), naming the manifest, the stored dtype and the run's.
 *
 * Atomic save: rank files go to ROOT/.tmp_step_..., each flushed and fsync'ed; then rank 0 writes
 * the manifest, fsyncs, renames the directory into place (exchanging it with an existing one of the
 * same step) and only then rewrites `latest` (temporary file, fsync, rename), and removes all but
 * the newest `keep` step directories up to this step that this run wrote (exact step_NNNNNNNN
 * names whose manifest's `run` record is this run's id). A crash at any point leaves `latest`
 * naming a complete checkpoint; a stale .tmp_ directory is removed by the next save. A save that
 * fails (a write error: the message names the file and errno) removes its .tmp_ directory on the
 * way out, so a full disk is not left fuller.
 *
 * Loading re-slices by logical tensor: a rank whose shard equals a saved one reads its parameters
 * and its optimizer range straight from the files of that shard (the same layout reads only its
 * own file); otherwise it assembles the full model's tensors from the saved shards
 * (l3d_gpt_shard_to_full) and cuts its slice (l3d_gpt_full_to_shard), one buffer at a time, in
 * host memory, then copies the slice to the device (host peak: the full model once plus two
 * shards). Every file is checked against the manifest (size,
 * checksum, header) before any tensor is used; a rank's own file, when it holds what the rank
 * needs, is loaded by the same pass.
 */
#define L3D_CKPT_FORMAT 4     /* the format written, and the newest read: the manifest's checksum */
#define L3D_CKPT_FORMAT_DTYPES 3 /* from this one on: dtypes recorded, 128-byte rank-file headers */
#define L3D_CKPT_FORMAT_ONE 1 /* the oldest read: fp32, one chunk per rank */

struct l3d_ckpt_layout {
    struct l3d_layout layout;      /* the run spec's: tp, pp, dp, v (chunks per rank, 0 reads as
                                    * 1), zero and sp; the batch's fields are the state's */
    int world;
    int tp_rank, pp_rank, dp_rank; /* this rank's coordinates */
};

/* What a checkpoint holds besides tensors. Training has no other random state: initial weights
 * and the batch order are pure functions of the seed (core.h, data.h). */
struct l3d_ckpt_state {
    int64_t step;                  /* optimizer steps completed */
    struct l3d_loader_pos loader;  /* the training loader's position after that step */
    uint64_t seed;
    int B, T, accum;               /* per-rank micro-batch, sequence length, accumulation */
    struct l3d_lr_schedule sched;
    struct l3d_adamw_hparams adamw;
    int64_t adamw_t;               /* AdamW's step count (bias correction) */
    struct l3d_ckpt_layout layout; /* load: the layout it was saved under (save: ignored) */
    uint64_t run_id;               /* the run that wrote it (manifest record `run`); 0: none */
    /* fp16 dynamic loss scaling (manifest record `lossscale`, optional): the scale (0: none),
     * steps since its last change, overflows left before the next back-off */
    double loss_scale;
    int64_t ls_good, ls_hyst;
};

struct l3d_ckpt_io {
    double seconds;                /* wall time of the whole save or load, every rank waiting */
    int64_t bytes_total;           /* size of the checkpoint: all rank files */
    int64_t bytes_rank;            /* written, or read (checksum passes included), by this rank */
};

/* The bytes a checkpoint moves between a file and memory at once: 64 MiB, or $L3D_CKPT_TEST_STAGE
 * when set (tests: tiny models take many transfers per tensor too). */
#define L3D_CKPT_STAGE_BYTES ((size_t)64 << 20)
size_t l3d_ckpt_stage_bytes(void);

/* A chunk whose fp32 parameters no rank holds whole (ZeRO-3, ZeRO-2 in mixed precision;
 * src/parallel/pieces.c): its view has no parameters (m->params NULL), and a save or a load moves
 * them through these calls, a piece of at most `piece` elements at a time, in order of offset.
 * piece 0: the chunk's parameters are m->params. */
struct l3d_ckpt_pieces {
    int64_t piece;
    int64_t lo, hi; /* load: the elements [lo, hi) of the chunk's flat parameters this rank takes */
    /* save, on the rank that writes the parameters: [off, off + n) in device memory, valid until
     * the next call; off = 0, piece, 2 piece, ...; n = piece but for the last */
    const float *(*get)(void *ctx, int64_t off, int64_t n);
    /* load: [off, off + n) (n <= piece, within [lo, hi)) in host memory, taken before it returns */
    void (*put)(void *ctx, int64_t off, int64_t n, const float *host);
    void *ctx;
};

/* Saves step s->step under root, the lay->pp_virtual chunks m[c] with their optimizers opt[c]
 * (pieces: NULL, or one per chunk); collective over world. keep >= 1. Every rank returns the
 * same status; *report is true on the one rank that should print the message. The parameters of
 * a chunk with pieces go to its file a piece at a time (the host staging: one piece). */
l3d_status l3d_ckpt_save(const char *root, int keep, struct l3d_comm *world,
                         const struct l3d_ckpt_layout *lay, const struct l3d_ckpt_state *s,
                         struct l3d_gpt *const *m, const struct l3d_adamw *opt,
                         const struct l3d_ckpt_pieces *pieces, struct l3d_ckpt_io *io,
                         bool *report);
/* Asynchronous saves (--async-save): l3d_ckpt_save_begin makes the temporary directory and copies
 * this rank's pieces (parameters and moments) into a host staging buffer, allocated once by
 * l3d_ckpt_async_init with l3d_ckpt_async_bytes, then a writer thread writes and fsyncs the rank
 * files while training goes on; l3d_ckpt_save_poll, called by every rank at the same points,
 * closes the save once every rank's writer is done (wait: now, joining this rank's): the records
 * gathered and the directory published as l3d_ckpt_save does (manifest, rename, `latest`,
 * pruning), so a crash before it leaves the last published checkpoint as it was. At most one save
 * runs: begin asserts none is. Chunks whose parameters move a piece at a time through collectives
 * (struct l3d_ckpt_pieces) are saved with l3d_ckpt_save instead. */
struct l3d_ckpt_async;
size_t l3d_ckpt_async_bytes(const struct l3d_ckpt_layout *lay, struct l3d_gpt *const *m,
                            const struct l3d_adamw *opt);
l3d_status l3d_ckpt_async_init(struct l3d_ckpt_async **a, size_t bytes);
l3d_status l3d_ckpt_save_begin(struct l3d_ckpt_async *a, const char *root, int keep,
                               struct l3d_comm *world, const struct l3d_ckpt_layout *lay,
                               const struct l3d_ckpt_state *s, struct l3d_gpt *const *m,
                               const struct l3d_adamw *opt, bool *report);
bool l3d_ckpt_save_running(const struct l3d_ckpt_async *a);
/* Seconds the last begin took (the copies: how long training stood still). */
double l3d_ckpt_async_stall(const struct l3d_ckpt_async *a);
/* *closed: the running save was closed now (its step in *step, its figures in *io; the status
 * agreed). Collective when a save runs. */
l3d_status l3d_ckpt_save_poll(struct l3d_ckpt_async *a, struct l3d_comm *world, bool wait,
                              bool *closed, int64_t *step, struct l3d_ckpt_io *io, bool *report);
/* Joins a writer still running (its directory stays temporary) and frees; NULL is a no-op. */
void l3d_ckpt_async_free(struct l3d_ckpt_async *a);

/* The step directory that spec names: "auto" -> the one root/latest names, or "" when root has no
 * latest (a fresh start); a step directory (holding a manifest); or a root holding `latest`. */
l3d_status l3d_ckpt_resolve(const char *spec, const char *root, char *dir, size_t cap);
/* Loads dir into this rank's lay->pp_virtual model chunks and optimizers (m[c]->params, or
 * pieces[c]'s [lo, hi) a piece at a time: from a file of the chunk's shard a piece is all the
 * host holds, from others a strip of full rows at a time, never the full model; opt[c].m, .v, .t),
 * whatever the layout (chunks per rank included) it was saved under, and
 * returns the saved state in s. Each chunk loads like a rank of its own. Collective over world;
 * reads only, so a failure leaves every file as it was. L3D_ERR_FORMAT for a bad or mismatching
 * file or dtype, L3D_ERR_IO for a missing one, L3D_ERR_LAYOUT for a manifest whose layout
 * cannot hold the model. */
l3d_status l3d_ckpt_load(const char *dir, struct l3d_comm *world,
                         const struct l3d_ckpt_layout *lay, struct l3d_gpt *const *m,
                         struct l3d_adamw *opt, const struct l3d_ckpt_pieces *pieces,
                         struct l3d_ckpt_state *s, struct l3d_ckpt_io *io, bool *report);
/* Reads a step directory's model config (to size a model before loading). */
l3d_status l3d_ckpt_read_config(const char *dir, struct l3d_model_spec *cfg, int64_t *step);
/* Writes the weights of step directory dir as one llm.c checkpoint (one process): version 3 (fp32),
 * or with _dt and L3D_BF16 version 5 (the fp32 weights rounded to bf16). */
l3d_status l3d_ckpt_export_llmc(const char *dir, const char *path);
l3d_status l3d_ckpt_export_llmc_dt(const char *dir, const char *path, enum l3d_dtype dt);
/* The weights of step directory dir as the full model's flat fp32 parameters (*full, l3d_free
 * it; checked finite) and its config. */
l3d_status l3d_ckpt_read_full(const char *dir, struct l3d_model_spec *cfg, float **full);

/* What a step directory holds, for llm3d inspect. */
struct l3d_ckpt_info {
    int format;                      /* the manifest's format version */
    struct l3d_model_spec cfg;
    struct l3d_ckpt_layout layout;   /* saved under (world, tp, pp, dp, zero, pp_virtual, sp) */
    struct l3d_ckpt_state state;     /* step, loader position, seed, B, T, accum, ... */
    /* the stored element types as the manifest records them (`dtype`, format 3 on; fp32 before):
     * "fp32", "bf16", ...; static strings */
    const char *params_dtype, *moments_dtype;
    int nfiles;                      /* rank files (world x chunks per rank) */
    int64_t bytes;                   /* of all rank files */
};
/* Reads dir's manifest into info and verifies every rank file against it (present, size, header,
 * checksum), reading them all once; one process. The errors are l3d_ckpt_load's. */
l3d_status l3d_ckpt_inspect(const char *dir, struct l3d_ckpt_info *info);

/* Keeps the lines of a metrics.jsonl whose "step" is at most step, and its run record (a resumed
 * run appends after them): each line parsed as JSON, so that a line without its newline (a write
 * cut short) or one that is not a JSON object (two half-written lines run together) goes; atomic
 * like every write here. A missing file is not an error. */
l3d_status l3d_ckpt_trim_metrics(const char *path, int64_t step);
/* The run id of a step directory's manifest (its `run` record) in *id: 0 when the directory has
 * no manifest or the manifest no such record. Reads only the records before the file lines, at
 * most 8 KiB (pruning and --resume decide by it); a manifest that is not a regular file (a FIFO,
 * a link to a device) is refused unread, naming it. */
l3d_status l3d_ckpt_run_id(const char *dir, uint64_t *id);
/* Whether name is a step directory's name exactly as written: step_ and eight or more digits,
 * nothing else (a user's step_00000003.bak is not one). */
bool l3d_ckpt_is_step_name(const char *name);
/* --overwrite: removes what llm3d wrote under root: `latest`, its temporary files and
 * directories, and every step directory (exact name, holding a manifest); nothing else. Returns
 * the number of step directories removed in *n (may be NULL). */
l3d_status l3d_ckpt_clear(const char *root, int *n);

#endif
