/* --out: the first replica's weights as llm.c's model.bin and a Hugging Face folder, written by
 * rank 0 without the whole model on any rank (docs/DESIGN.md, "Hugging Face folders").
 *
 * The writers take the full model a unit at a time: rows [R0, R1) of one layer of one full
 * tensor, at most l3d_ckpt_stage_bytes of them (one row where a row is larger). Every rank walks
 * the same list of units (units_list): model.bin's flat order, then the folder's tensors twice
 * (its check of every value, then its writing). For each unit, in the order of today's gather
 * (tp rank, then pp rank, then chunk; a later copy of a replicated tensor over an earlier one),
 * each (tp, pp) rank of the first replica that holds some of its rows sends them, one contiguous
 * range of its chunk (l3d_gpt_shard_rows), rank 0 places them (l3d_gpt_shard_place). Where no rank
 * holds the fp32 parameters whole (ZeRO-3, ZeRO-2 in mixed precision) the range is first pulled
 * from its DP owners (l3d_dp_fp32_pull), the whole DP group walking the list.
 *
 * Rank 0 holds beside the trainer: a unit and a received range (each at most a piece), and the
 * folder writer's staging of its largest tensor (l3d_st_write, and its check). */
#include <libgen.h>
#include <string.h>
#include <sys/stat.h>

#include "llm3d/ckpt.h"
#include "llm3d/hf.h"
#include "llm3d/tokenizer.h"
#include "train/train-impl.h"

struct unit {
    int t;
    int64_t layer, R0, R1;
};

struct out_ctx {
    struct l3d_trainer *t;
    struct unit *u;
    int64_t n, next;               /* the list; the next unit to pull */
    int64_t cap;                   /* elements a unit (and a range) at most */
    struct l3d_tensor_info ti[L3D_NUM_TENSORS]; /* the full model's */
    const struct l3d_hf_tensor *map;
    float *unit, *range;           /* rank 0's host buffers */
    float *dev;                    /* a range pulled from the DP owners (device memory) */
};

/* Rows [row0, row0 + rows) of tensor t's layer, a window of at most cap elements at a time;
 * counted only when u is NULL. */
static int64_t add_units(struct unit *u, int64_t k, int t, int64_t layer, int64_t row0,
                         int64_t rows, int64_t cols, int64_t piece) {
    int64_t w = piece / cols > 0 ? piece / cols : 1;
    for (int64_t r = row0; r < row0 + rows; r += w, k++)
        if (u) u[k] = (struct unit){t, layer, r, r + w < row0 + rows ? r + w : row0 + rows};
    return k;
}

static int64_t units_list(struct out_ctx *o, const struct l3d_hf_tensor *map, int nmap,
                          int64_t piece, struct unit *u) {
    int64_t k = 0;
    for (int t = 0; t < L3D_NUM_TENSORS; t++) /* model.bin: the flat order */
        for (int64_t l = 0; o->ti[t].count > 0 && l < o->ti[t].layers; l++)
            k = add_units(u, k, t, l, 0, o->ti[t].rows, o->ti[t].cols, piece);
    for (int pass = 0; pass < 2; pass++) /* the folder: its check, then its writing */
        for (int i = 0; i < nmap; i++)
            k = add_units(u, k, map[i].tensor, map[i].layer, map[i].row0, map[i].rows,
                          map[i].cols, piece);
    return k;
}

/* Unit u: placed into o->unit on rank 0; sent or pulled from on the ranks that hold it. */
static void pull(struct out_ctx *o, const struct unit *u) {
    struct l3d_trainer *t = o->t;
    const struct l3d_train_config *tc = t->tc;
    const struct l3d_topo *topo = t->topo;
    struct l3d_comm *world = t->world;
    const struct l3d_layout *l = &tc->layout;
    int v = l->v;
    /* the first replica's ranks hold the model; with expert parallelism its first ep DP x CP
     * ranks (q = dp_rank cp + cp_rank < ep), each its experts (the rows of the other tensors come
     * from q = 0) */
    int ep = l->ep > 1 ? l->ep : 1, q = topo->dp_rank * l->cp + topo->cp_rank;
    bool lead = world->rank == 0, first = q < ep;
    for (int i = 0; i < l->tp * l->pp * ep; i++) {
        int tp_rank = i % l->tp, pp_rank = i / l->tp % l->pp, ep_rank = i / (l->tp * l->pp);
        int r = l3d_topo_rank_of(l, tp_rank, ep_rank % l->cp, pp_rank, ep_rank / l->cp);
        bool mine = tp_rank == topo->tp_rank && pp_rank == topo->pp_rank &&
                    ep_rank == topo->ep_rank;
        if (!lead && !mine) continue;
        if (ep_rank > 0 && !l3d_gpt_expert_tensor(u->t)) continue;
        for (int c = 0; c < v; c++) {
            struct l3d_shard sh = l3d_train_layout_shard(
                &t->lay, tc, l3d_pp_vstage(tc->layout.schedule, l->pp, pp_rank, c), tp_rank);
            l3d_shard_set_experts(&tc->model, &sh, ep, ep_rank);
            int64_t off, r0, r1;
            if (!l3d_gpt_shard_rows(&tc->model, &sh, u->t, u->layer, u->R0, u->R1, &off, &r0,
                                    &r1))
                continue;
            struct l3d_tensor_info ts[L3D_NUM_TENSORS];
            l3d_gpt_plan_tensors(&tc->model, &sh, ts);
            int64_t n = (r1 - r0) * ts[u->t].cols;
            L3D_ASSERT(n <= o->cap);
            const float *src = NULL;
            if (mine) { /* this rank's chunk: its view, or its DP owners' rows */
                src = t->vptr[c]->params ? (const float *)t->vptr[c]->params + off : o->dev;
                if (!t->vptr[c]->params) l3d_dp_fp32_pull(&t->dps[c], &t->opts[c], off, n, o->dev);
                if (!first) continue;
            }
            if (!lead) {
                l3d_comm_send(world, src, n, L3D_F32, 0, L3D_TAG_MODEL_GATHER + c, NULL);
                continue;
            }
            if (r == 0)
                l3d_be_copy_d2h(t->be, o->range, src, (size_t)n * sizeof(float));
            else
                l3d_comm_recv(world, o->range, n, L3D_F32, r, L3D_TAG_MODEL_GATHER + c, NULL);
            l3d_gpt_shard_place(&tc->model, &sh, u->t, r0, r1, o->range, u->R0, o->unit);
        }
    }
}

/* Rank 0: the next unit of the list, which must be u's (t, layer, R0); its element count. */
static int64_t next_unit(struct out_ctx *o, int t, int64_t layer, int64_t R0) {
    L3D_ASSERT(o->next < o->n);
    const struct unit *u = &o->u[o->next++];
    L3D_ASSERT(u->t == t && u->layer == layer && u->R0 == R0);
    pull(o, u);
    return (u->R1 - u->R0) * o->ti[t].cols;
}

static const float *bin_next(void *ctx, int64_t *n) {
    struct out_ctx *o = ctx;
    const struct unit *u = &o->u[o->next];
    *n = next_unit(o, u->t, u->layer, u->R0);
    return o->unit;
}

static void hf_fill(void *ctx, int i, float *out) {
    struct out_ctx *o = ctx;
    const struct l3d_hf_tensor *h = &o->map[i];
    for (int64_t R0 = h->row0; R0 < h->row0 + h->rows;) {
        int64_t w = next_unit(o, h->tensor, h->layer, R0) / h->cols, j0 = R0 - h->row0;
        if (!h->transposed)
            memcpy(out + j0 * h->cols, o->unit, (size_t)(w * h->cols) * sizeof(float));
        else
            for (int64_t a = 0; a < h->cols; a++)
                for (int64_t j = 0; j < w; j++) out[a * h->rows + j0 + j] = o->unit[j * h->cols + a];
        R0 += w;
    }
}

/* buf = DIR/tokenizer.json, where DIR is path itself (folder) or its directory; whether it is a
 * file. */
static bool tokenizer_in(const char *path, bool folder, char *buf, size_t cap) {
    char dir[4096];
    struct stat sb;
    snprintf(dir, sizeof dir, "%s", path);
    if ((size_t)snprintf(buf, cap, "%s/tokenizer.json", folder ? dir : dirname(dir)) >= cap)
        return false;
    return stat(buf, &sb) == 0 && S_ISREG(sb.st_mode);
}

const char *l3d_train_out_tokenizer(const struct l3d_train_config *tc, char *buf, size_t cap) {
    if (tc->tokenizer) return tc->tokenizer;
    if (tc->train_pattern && tokenizer_in(tc->train_pattern, false, buf, cap)) return buf;
    bool folder = tc->init_from && l3d_hf_is_folder(tc->init_from);
    if (folder && tokenizer_in(tc->init_from, true, buf, cap)) return buf;
    return NULL;
}

/* The tokenizer of the folder, on rank 0 (NULL: none known, or one that cannot serve: said in one
 * line; a --tokenizer was read at start-up, l3d_cli_train_flags). */
static struct l3d_tokenizer *out_tokenizer(const struct l3d_train_config *tc) {
    char buf[4200];
    const char *spec = l3d_train_out_tokenizer(tc, buf, sizeof buf);
    struct l3d_tokenizer *tok = NULL;
    if (!spec) {
        if (!tc->quiet)
            printf("--out: no tokenizer known (give --tokenizer SPEC, or train on shards of llm3d "
                   "prepare, which records theirs): %s gets the model only\n", tc->out_dir);
        return NULL;
    }
    l3d_status st = l3d_tokenizer_open(&tok, spec);
    if (st == L3D_OK) st = l3d_tokenizer_fits(tok, tc->model.V, spec);
    if (st == L3D_OK) return tok;
    fprintf(stderr, "llm3d train: --out's tokenizer: %s: %s gets the model only\n",
            l3d_error_message(), tc->out_dir);
    l3d_tokenizer_free(tok);
    return NULL;
}

/* Rank 0 writes the two files; every other rank walks the list for it. */
l3d_status l3d_train_save_out(struct l3d_trainer *t) {
    const struct l3d_train_config *tc = t->tc;
    struct l3d_hf_tensor *map = NULL;
    int nmap = 0;
    /* agreed: the spec is the same; a MoE, QK-norm or head_dim model no Hugging Face family
     * holds (GPT-2's blocks, shared experts, dense layers) has model.bin only, said below */
    l3d_status st = l3d_hf_tensors(&tc->model, &map, &nmap);
    bool folder = st == L3D_OK;
    char why[512] = "";
    if (!folder && tc->model.moe.experts == 0 && !tc->model.qk_norm && tc->model.head_dim == 0)
        return st;
    if (!folder) snprintf(why, sizeof why, "%s", l3d_error_message());
    st = L3D_OK;
    struct out_ctx o = {.t = t, .map = map};
    struct l3d_shard fs = l3d_shard_full(&tc->model);
    l3d_gpt_plan_tensors(&tc->model, &fs, o.ti);
    int64_t piece = l3d_dp_fp32_piece(INT64_MAX, l3d_ckpt_stage_bytes());
    o.n = units_list(&o, map, nmap, piece, NULL);
    o.u = l3d_alloc((size_t)o.n * sizeof *o.u, "--out units");
    units_list(&o, map, nmap, piece, o.u);
    for (int64_t k = 0; k < o.n; k++) {
        int64_t e = (o.u[k].R1 - o.u[k].R0) * o.ti[o.u[k].t].cols;
        if (e > o.cap) o.cap = e;
    }
    bool lead = t->world->rank == 0, streamed = false;
    size_t before = l3d_mem_window_begin(), used = l3d_mem_used(); /* what --out adds */
    for (int c = 0; c < t->tc->layout.v; c++) streamed |= !t->vptr[c]->params;
    if (streamed) o.dev = l3d_be_alloc(t->be, (size_t)o.cap * sizeof(float), "--out rows");
    if (lead) {
        o.unit = l3d_alloc((size_t)o.cap * sizeof(float), "--out rows");
        o.range = l3d_alloc((size_t)o.cap * sizeof(float), "--out rows");
        char path[4096];
        snprintf(path, sizeof path, "%s/model.bin", tc->out_dir);
        st = l3d_ckpt_save_llmc_pieces(path, &tc->model, bin_next, &o);
        if (st == L3D_OK && !tc->quiet) printf("saved %s\n", path);
        if (st == L3D_OK && !folder && !tc->quiet)
            printf("no Hugging Face folder: %s\n", why);
        struct l3d_tokenizer *tok = st == L3D_OK && folder ? out_tokenizer(tc) : NULL;
        if (st == L3D_OK && folder)
            st = l3d_hf_save_fill_tok(tc->out_dir, &tc->model, hf_fill, &o, tc->save_dtype,
                                      tc->save_shard_bytes > 0 ? tc->save_shard_bytes
                                                               : L3D_HF_SHARD_BYTES, tok);
        if (st == L3D_OK && folder && !tc->quiet)
            printf("saved %s/config.json and model.safetensors%s (%s; the writers took %.3f MiB "
                   "of host memory at most)\n", tc->out_dir, tok ? ", tokenizer.json, "
                   "tokenizer_config.json, special_tokens_map.json, generation_config.json" : "",
                   l3d_dtype_name(tc->save_dtype), (double)(l3d_mem_peak() - used) / 1048576.0);
        l3d_tokenizer_free(tok);
    }
    while (o.next < o.n) pull(&o, &o.u[o.next++]); /* the others; what a failed writer left */
    if (o.dev) l3d_be_free(t->be, o.dev);
    l3d_free(o.unit);
    l3d_free(o.range);
    l3d_free(o.u);
    l3d_free(map);
    l3d_mem_window_end(before);
    return st;
}
