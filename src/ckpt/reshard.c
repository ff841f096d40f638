/* A shard's parameters (or moments) from the full model's tensors a strip of rows at a time,
 * never the full model on the host (src/ckpt/ckpt-impl.h, struct l3d_ckpt_rows). */
#include <string.h>

#include "ckpt/ckpt-impl.h"
#include "llm3d/model.h"

int64_t l3d_ckpt_strip(const struct l3d_model_spec *cfg) {
    struct l3d_shard fs = l3d_shard_full(cfg);
    struct l3d_tensor_info tf[L3D_NUM_TENSORS];
    l3d_gpt_plan_tensors(cfg, &fs, tf);
    int64_t n = (int64_t)(l3d_ckpt_stage_bytes() / sizeof(float)), most = 1, row = 1;
    for (int t = 0; t < L3D_NUM_TENSORS; t++) {
        most = tf[t].rows * tf[t].cols > most ? tf[t].rows * tf[t].cols : most; /* a layer's */
        row = tf[t].cols > row ? tf[t].cols : row;
    }
    n = n < most ? n : most;
    return n > row ? n : row;
}

static int64_t row_of(const struct l3d_model_spec *cfg, const struct l3d_shard *sh, int t,
                      int64_t r) {
    int64_t gr, gc;
    l3d_gpt_global_rc(cfg, sh, t, r, 0, &gr, &gc);
    return gr;
}

/* Rows [r, rb) of a layer of the shard's tensor t (ts) from the full rows [g0, g0 + k) in full
 * (full columns fc) into out, row-major in the shard's layout. */
static void cut(const struct l3d_model_spec *cfg, const struct l3d_shard *sh, int t,
                const struct l3d_tensor_info *ts, int64_t fc, int64_t r, int64_t rb, int64_t g0,
                const float *full, float *out) {
    for (int64_t i = r; i < rb; i++)
        for (int64_t c = 0; c < ts->cols; c++) {
            int64_t gr, gc;
            l3d_gpt_global_rc(cfg, sh, t, i, c, &gr, &gc);
            out[(i - r) * ts->cols + c] = full[(gr - g0) * fc + gc];
        }
}

/* The cut elements [x0, x1) of the flat space (out from x0) clipped to q's range, checked and
 * handed over. */
static l3d_status hand(const struct l3d_ckpt_pieces *q, int64_t x0, int64_t x1, const float *out,
                       const char *what, const char *name) {
    int64_t a = x0 > q->lo ? x0 : q->lo, b = x1 < q->hi ? x1 : q->hi;
    for (int64_t x = a; what && x < b; x++)
        if (out[x - x0] != out[x - x0])
            return l3d_error(L3D_ERR_FORMAT, "%s: no rank file holds %s element %lld of this "
                             "rank's slice (or it is NaN): the checkpoint is incomplete", name,
                             what, (long long)(x - q->lo));
    for (int64_t off = a, n; off < b; off += n) {
        n = b - off < q->piece ? b - off : q->piece;
        q->put(q->ctx, off, n, out + (off - x0));
    }
    return L3D_OK;
}

/* One layer l (of the shard's) of tensor t, a strip of full rows at a time. */
static l3d_status one_layer(const struct l3d_model_spec *cfg, const struct l3d_shard *sh, int t,
                            const struct l3d_tensor_info *ts, const struct l3d_tensor_info *tf,
                            int64_t l, const struct l3d_ckpt_rows *src,
                            const struct l3d_ckpt_pieces *q, int64_t strip, float *full,
                            float *out, const char *what, const char *name) {
    int64_t layer = l3d_gpt_tensor_first(cfg, sh, t) + l;
    int64_t k = strip / tf->cols > 0 ? strip / tf->cols : 1; /* full rows a strip */
    l3d_status st = L3D_OK;
    for (int64_t r = 0, rb; st == L3D_OK && r < ts->rows; r = rb) {
        int64_t g0 = row_of(cfg, sh, t, r);
        for (rb = r + 1; rb < ts->rows && row_of(cfg, sh, t, rb) < g0 + k; rb++) {}
        int64_t x0 = ts->offset + (l * ts->rows + r) * ts->cols, x1 = x0 + (rb - r) * ts->cols;
        if (x1 <= q->lo || x0 >= q->hi) continue; /* none of the range kept */
        int64_t g1 = row_of(cfg, sh, t, rb - 1) + 1;
        st = src->read(src->ctx, t, layer, g0, g1 - g0, full);
        if (st != L3D_OK) break;
        cut(cfg, sh, t, ts, tf->cols, r, rb, g0, full, out);
        st = hand(q, x0, x1, out, what, name);
    }
    return st;
}

l3d_status l3d_ckpt_reshard(const struct l3d_model_spec *cfg, const struct l3d_shard *sh,
                            const struct l3d_ckpt_rows *src, const struct l3d_ckpt_pieces *q,
                            const char *what, const char *name) {
    struct l3d_shard fs = l3d_shard_full(cfg);
    struct l3d_tensor_info ts[L3D_NUM_TENSORS], tf[L3D_NUM_TENSORS];
    l3d_gpt_plan_tensors(cfg, sh, ts);
    l3d_gpt_plan_tensors(cfg, &fs, tf);
    int64_t strip = l3d_ckpt_strip(cfg);
    float *full = l3d_try_alloc((size_t)strip * sizeof(float), "model rows");
    float *out = full ? l3d_try_alloc((size_t)strip * sizeof(float), "shard rows") : NULL;
    l3d_status st = L3D_OK;
    if (!out)
        st = l3d_error(L3D_ERR_OOM, "%s: no host memory for two strips of %.1f MiB of the "
                       "model's rows: free host memory", name,
                       (double)strip * sizeof(float) / 1048576.0);
    for (int t = 0; st == L3D_OK && t < L3D_NUM_TENSORS; t++)
        for (int64_t l = 0; st == L3D_OK && ts[t].count > 0 && l < ts[t].layers; l++)
            st = one_layer(cfg, sh, t, &ts[t], &tf[t], l, src, q, strip, full, out, what, name);
    l3d_free(out);
    l3d_free(full);
    return st;
}
