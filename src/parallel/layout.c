/* Stage layers and stage shards of a layout (include/llm3d/layout.h). */
#include "llm3d/layout.h"
#include "llm3d/pipeline.h"
#include "llm3d/tp.h"

l3d_status l3d_layout_split_ends(int L, int S, int first, int last, int *layers) {
    int free = S - (first > 0) - (last > 0), rest = L - first - last;
    if (S < 1 || (S == 1 && (first || last)) || rest < free || (free == 0 && rest != 0))
        return l3d_error(L3D_ERR_LAYOUT, "--pp-first-layers %d and --pp-last-layers %d on %d "
                         "pipeline stages of %d layers: each stage needs a layer and the counts "
                         "must add up; give ends that leave %d or more layers to the %d other "
                         "stage(s)", first, last, S, L, free, free);
    for (int i = 0, k = 0; i < S; i++) {
        if (i == 0 && first) layers[i] = first;
        else if (i == S - 1 && last) layers[i] = last;
        else layers[i] = rest / free + (k++ < rest % free);
    }
    return L3D_OK;
}

l3d_status l3d_layout_stage_layers(const struct l3d_model_spec *cfg, const struct l3d_layout *l,
                                   int *layers) {
    int pp = l->pp, v = l->v > 0 ? l->v : 1;
    int64_t stages = (int64_t)pp * v;
    if (stages > cfg->L)
        return l3d_error(L3D_ERR_LAYOUT, "--pp %d x --pp-virtual %d = %lld pipeline stages but the "
                         "model has %d layers: each stage needs at least one layer; lower --pp or "
                         "--pp-virtual", pp, v, (long long)stages, cfg->L);
    if (l->pp_layers) return l3d_pp_parse_layers(l->pp_layers, cfg, (int)stages, layers);
    if (l->pp_first || l->pp_last)
        return l3d_layout_split_ends(cfg->L, (int)stages, l->pp_first, l->pp_last, layers);
    return l3d_pp_partition(cfg, l->seq > 0 ? l->seq : cfg->maxT, (int)stages, layers);
}

l3d_status l3d_layout_stage_shard(const struct l3d_model_spec *cfg, const int *layers, int stages,
                                  int vs, int tp, int tp_rank, bool sp, struct l3d_shard *out) {
    struct l3d_shard sh = l3d_shard_full(cfg);
    l3d_status st = tp > 1 ? l3d_tp_shard(cfg, tp, tp_rank, sp, &sh) : L3D_OK;
    sh.layer_start = 0;
    for (int i = 0; i < vs; i++) sh.layer_start += layers[i];
    sh.layer_count = layers[vs];
    sh.has_embedding = vs == 0;
    sh.has_head = vs == stages - 1;
    *out = sh;
    return st;
}
