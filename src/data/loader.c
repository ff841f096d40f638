/* The batch loader: an endless stream of (T+1)-token windows, in order or shuffled per epoch, cut
 * into global batches of dp_size*B windows of which each DP rank keeps its own B. See
 * include/llm3d/data.h for the stream and a worked example. */
#include "llm3d/data.h"

struct l3d_loader {
    const struct l3d_data *data;
    struct l3d_loader_config cfg;
    int nfiles;
    int64_t nwin;  /* W: windows over all files */
    int64_t *cum;  /* (nfiles+1): file f holds windows [cum[f], cum[f+1]) */
    int64_t *perm; /* (W) this epoch's order, random mode only */
    int64_t epoch, index;
};

/* Fisher-Yates over the identity, seeded with seed+epoch, so the order of an epoch depends on
 * nothing else (a resumed loader rebuilds it exactly). The modulo's bias is below W / 2^64. */
static void shuffle(struct l3d_loader *ld) {
    int64_t W = ld->nwin;
    for (int64_t i = 0; i < W; i++) ld->perm[i] = i;
    l3d_rng r;
    l3d_rng_seed(&r, ld->cfg.seed + (uint64_t)ld->epoch);
    for (int64_t i = W - 1; i > 0; i--) {
        int64_t j = (int64_t)(l3d_rng_next(&r) % (uint64_t)(i + 1));
        int64_t t = ld->perm[i];
        ld->perm[i] = ld->perm[j];
        ld->perm[j] = t;
    }
}

l3d_status l3d_loader_init(struct l3d_loader **out, const struct l3d_data *data,
                           const struct l3d_loader_config *cfg) {
    *out = NULL;
    if (cfg->B < 1 || cfg->T < 1)
        return l3d_error(L3D_ERR_ARG, "loader batch size B=%lld and sequence length T=%lld must be "
                         "at least 1", (long long)cfg->B, (long long)cfg->T);
    if (cfg->dp_size < 1 || cfg->dp_rank < 0 || cfg->dp_rank >= cfg->dp_size)
        return l3d_error(L3D_ERR_ARG, "loader DP rank %d is outside a DP group of size %d",
                         cfg->dp_rank, cfg->dp_size);

    int nfiles = l3d_data_num_files(data);
    int64_t T = cfg->T, nwin = 0;
    for (int f = 0; f < nfiles; f++) {
        int64_t n;
        n = l3d_data_file_ntok(data, f);
        nwin += (n - 1) / T;
    }
    int64_t G = cfg->B * (int64_t)cfg->dp_size;
    if (nwin < G)
        return l3d_error(L3D_ERR_ARG,
                         "the data holds %lld window(s) of T+1 = %lld tokens (%lld tokens in %d "
                         "file(s)), fewer than one global batch of dp_size*B = %lld windows, which "
                         "needs at least %lld tokens: lower B or T, or add data",
                         (long long)nwin, (long long)(T + 1), (long long)l3d_data_num_tokens(data),
                         nfiles, (long long)G, (long long)(G * T + 1));

    int64_t *perm = NULL;
    if (cfg->random) {
        perm = l3d_try_alloc((size_t)nwin * sizeof *perm, "loader window order");
        if (!perm)
            return l3d_error(L3D_ERR_OOM,
                             "out of memory for the shuffled order of %lld windows (%zu bytes)",
                             (long long)nwin, (size_t)nwin * sizeof *perm);
    }
    struct l3d_loader *ld = l3d_calloc(sizeof *ld, "loader");
    ld->data = data;
    ld->cfg = *cfg;
    ld->nfiles = nfiles;
    ld->nwin = nwin;
    ld->perm = perm;
    ld->cum = l3d_alloc((size_t)(nfiles + 1) * sizeof *ld->cum, "loader window table");
    ld->cum[0] = 0;
    for (int f = 0; f < nfiles; f++) {
        int64_t n;
        n = l3d_data_file_ntok(data, f);
        ld->cum[f + 1] = ld->cum[f] + (n - 1) / T;
    }
    if (cfg->random) shuffle(ld);
    *out = ld;
    return L3D_OK;
}

/* Copies window w (a global window number) into one row of inputs and targets. */
static void copy_window(const struct l3d_loader *ld, int64_t w, int32_t *inp, int32_t *tgt) {
    int lo = 0, hi = ld->nfiles - 1; /* the file f with cum[f] <= w < cum[f+1] */
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (ld->cum[mid] <= w) lo = mid;
        else hi = mid - 1;
    }
    int64_t T = ld->cfg.T;
    l3d_data_file_read(ld->data, lo, (w - ld->cum[lo]) * T, T, inp);
    l3d_data_file_read(ld->data, lo, (w - ld->cum[lo]) * T + 1, T, tgt);
}

void l3d_loader_next(struct l3d_loader *ld, int32_t *inputs, int32_t *targets) {
    int64_t B = ld->cfg.B, T = ld->cfg.T;
    int64_t G = B * ld->cfg.dp_size, mine = B * ld->cfg.dp_rank;
    if (ld->nwin - ld->index < G) { /* a batch never straddles two epochs (as llm.c's shards) */
        ld->index = 0;
        ld->epoch++;
        if (ld->perm) shuffle(ld);
    }
    for (int64_t g = 0; g < G; g++) {
        if (g >= mine && g < mine + B) {
            int64_t w = ld->perm ? ld->perm[ld->index] : ld->index;
            int64_t b = g - mine;
            copy_window(ld, w, inputs + b * T, targets + b * T);
        }
        if (++ld->index == ld->nwin) {
            ld->index = 0;
            ld->epoch++;
            if (ld->perm) shuffle(ld);
        }
    }
}

struct l3d_loader_pos l3d_loader_get_pos(const struct l3d_loader *ld) {
    return (struct l3d_loader_pos){.epoch = ld->epoch, .index = ld->index};
}

l3d_status l3d_loader_set_pos(struct l3d_loader *ld, struct l3d_loader_pos pos) {
    if (pos.epoch < 0 || pos.index < 0 || pos.index >= ld->nwin)
        return l3d_error(L3D_ERR_ARG,
                         "loader position (epoch %lld, window %lld) is outside this data's %lld "
                         "windows of T+1 = %lld tokens: it was saved with other data or another T",
                         (long long)pos.epoch, (long long)pos.index, (long long)ld->nwin,
                         (long long)(ld->cfg.T + 1));
    bool reshuffle = ld->perm && pos.epoch != ld->epoch;
    ld->epoch = pos.epoch;
    ld->index = pos.index;
    if (reshuffle) shuffle(ld);
    return L3D_OK;
}

int64_t l3d_loader_num_windows(const struct l3d_loader *ld) { return ld->nwin; }

void l3d_loader_free(struct l3d_loader *ld) {
    if (!ld) return;
    l3d_free(ld->perm);
    l3d_free(ld->cum);
    l3d_free(ld);
}
