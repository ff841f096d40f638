/* Stage layers and stage shards of a layout (include/llm3d/layout.h). */
#include "llm3d/layout.h"
#include "llm3d/pipeline.h"
#include "llm3d/tp.h"

l3d_status l3d_layout_stage_layers(const struct l3d_model_spec *cfg, int T, int pp, int v,
                                   const char *given, int *layers) {
    int64_t stages = (int64_t)pp * v;
    if (stages > cfg->L)
        return l3d_error(L3D_ERR_LAYOUT, "--pp %d x --pp-virtual %d = %lld pipeline stages but the "
                         "model has %d layers: each stage needs at least one layer; lower --pp or "
                         "--pp-virtual", pp, v, (long long)stages, cfg->L);
    if (given) return l3d_pp_parse_layers(given, cfg, (int)stages, layers);
    return l3d_pp_partition(cfg, T, (int)stages, layers);
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
