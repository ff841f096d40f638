/*
 * The rank grid (include/llm3d/topo.h): world = tp x pp x dp,
 *
 *     rank = dp_rank * (pp * tp) + pp_rank * tp + tp_rank
 *
 * Each group is a split of the world whose color is the rank with the group's own coordinate
 * removed and whose key is that coordinate, so rank i of a group has coordinate i:
 *
 *     group   color                                  key       8 ranks, tp = pp = dp = 2
 *     TP      dp_rank * pp + pp_rank  (rank / tp)    tp_rank   {0,1} {2,3} {4,5} {6,7}
 *     PP      dp_rank * tp + tp_rank                 pp_rank   {0,2} {1,3} {4,6} {5,7}
 *     DP      pp_rank * tp + tp_rank  (rank % tp*pp) dp_rank   {0,4} {1,5} {2,6} {3,7}
 *     embed   as PP, first and last stage only       pp_rank   {0,2} {1,3} {4,6} {5,7}
 */
#include <stdio.h>

#include "llm3d/topo.h"

int l3d_topo_rank_of(const struct l3d_layout *l, int tp_rank, int cp_rank, int pp_rank,
                     int dp_rank) {
    L3D_ASSERT(l->tp >= 1 && l->cp >= 1 && l->pp >= 1);
    L3D_ASSERT(tp_rank >= 0 && tp_rank < l->tp && cp_rank >= 0 && cp_rank < l->cp &&
               pp_rank >= 0 && pp_rank < l->pp && dp_rank >= 0);
    return ((dp_rank * l->pp + pp_rank) * l->cp + cp_rank) * l->tp + tp_rank;
}

void l3d_topo_coords(const struct l3d_layout *l, int rank, int *tp_rank, int *cp_rank,
                     int *pp_rank, int *dp_rank) {
    L3D_ASSERT(l->tp >= 1 && l->cp >= 1 && l->pp >= 1 && rank >= 0);
    *tp_rank = rank % l->tp;
    *cp_rank = rank / l->tp % l->cp;
    *pp_rank = rank / (l->tp * l->cp) % l->pp;
    *dp_rank = rank / (l->tp * l->cp * l->pp);
}

/* "rank 5 (tp 1, pp 0, dp 1)": a world rank named by its coordinates (the watchdog's names); cp
 * named when there is a ring. */
static void topo_rank_name(void *ctx, int world_rank, char *buf, size_t n) {
    const struct l3d_topo *t = ctx;
    int tp_rank, cp_rank, pp_rank, dp_rank;
    l3d_topo_coords(t->layout, world_rank, &tp_rank, &cp_rank, &pp_rank, &dp_rank);
    if (t->layout->cp > 1)
        snprintf(buf, n, "rank %d (tp %d, cp %d, pp %d, dp %d)", world_rank, tp_rank, cp_rank,
                 pp_rank, dp_rank);
    else
        snprintf(buf, n, "rank %d (tp %d, pp %d, dp %d)", world_rank, tp_rank, pp_rank, dp_rank);
}

/* The ring and the widened data-parallel group (splits 5 and 6; none when cp = 1). tc: the rank's
 * index in the tp x cp block. */
static l3d_status split_cp(struct l3d_topo *t, struct l3d_comm *world) {
    const struct l3d_layout *l = t->layout;
    if (l->cp == 1) {
        t->dpcp_comm = t->dp_comm;
        return L3D_OK;
    }
    int ring = (t->dp_rank * l->pp + t->pp_rank) * l->tp + t->tp_rank;
    l3d_status st = l3d_comm_split(world, ring, t->cp_rank, &t->cp_comm);
    if (st == L3D_OK)
        st = l3d_comm_split(world, t->pp_rank * l->tp + t->tp_rank,
                            t->dp_rank * l->cp + t->cp_rank, &t->dpcp_comm);
    if (st != L3D_OK) return st;
    L3D_ASSERT(t->cp_comm->size == l->cp && t->cp_comm->rank == t->cp_rank);
    t->cp_comm->role = "CP";
    t->dpcp_comm->role = "DP x CP";
    return L3D_OK;
}

/* The expert-parallel groups (ep > 1): splits of the DP x CP group (Megatron-Core's expert group
 * inside data times context parallelism: a MoE layer is per token, whichever rank holds it),
 * whose rank q = dp_rank cp + cp_rank: ep_comm the ep consecutive q (ordered by ep_rank = q % ep),
 * edp_comm those with the same ep_rank (ordered by q / ep). dp 2 x cp 2, ep 2: ep_comm {q 0, 1}
 * = (dp 0, cp 0..1) and {2, 3}; edp_comm {0, 2} and {1, 3}. */
static l3d_status split_ep(struct l3d_topo *t) {
    int ep = t->layout->ep > 1 ? t->layout->ep : 1, q = t->dp_rank * t->layout->cp + t->cp_rank;
    t->ep_rank = q % ep;
    if (ep == 1) {
        t->edp_comm = t->dpcp_comm;
        return L3D_OK;
    }
    L3D_ASSERT(t->dpcp_comm->size % ep == 0 && t->dpcp_comm->rank == q);
    l3d_status st = l3d_comm_split(t->dpcp_comm, q / ep, t->ep_rank, &t->ep_comm);
    if (st == L3D_OK)
        st = l3d_comm_split(t->dpcp_comm, t->ep_rank, q / ep, &t->edp_comm);
    if (st != L3D_OK) return st;
    L3D_ASSERT(t->ep_comm->size == ep && t->ep_comm->rank == t->ep_rank);
    t->ep_comm->role = "EP";
    t->edp_comm->role = "expert DP";
    return L3D_OK;
}

l3d_status l3d_topo_init(struct l3d_topo *t, struct l3d_comm *world, const struct l3d_layout *l) {
    int tp = l->tp, cp = l->cp, pp = l->pp, dp = l->dp;
    L3D_ASSERT(tp >= 1 && cp >= 1 && pp >= 1 && dp >= 1 &&
               (int64_t)tp * cp * pp * dp == world->size);
    *t = (struct l3d_topo){.layout = l, .world = world};
    t->rank = world->rank;
    t->world_size = world->size;
    l3d_topo_coords(l, t->rank, &t->tp_rank, &t->cp_rank, &t->pp_rank, &t->dp_rank);

    /* Every split is collective over the world: each rank takes part in all, in this order. The
     * colors below name the ranks' other coordinates (with cp = 1, the grid of the header). */
    l3d_status st;
    int pipeline = (t->dp_rank * cp + t->cp_rank) * tp + t->tp_rank; /* this rank's pipeline */
    int tpgroup = (t->dp_rank * pp + t->pp_rank) * cp + t->cp_rank;
    int dpgroup = (t->pp_rank * cp + t->cp_rank) * tp + t->tp_rank;
    if ((st = l3d_comm_split(world, tpgroup, t->tp_rank, &t->tp_comm)) ||
        (st = l3d_comm_split(world, pipeline, t->pp_rank, &t->pp_comm)) ||
        (st = l3d_comm_split(world, dpgroup, t->dp_rank, &t->dp_comm))) {
        l3d_topo_free(t);
        return st;
    }
    bool ends = t->pp_rank == 0 || t->pp_rank == pp - 1;
    if ((st = l3d_comm_split(world, ends ? pipeline : -1, t->pp_rank, &t->embed_comm))) {
        l3d_topo_free(t);
        return st;
    }
    if ((st = split_cp(t, world)) || (st = split_ep(t))) {
        l3d_topo_free(t);
        return st;
    }
    L3D_ASSERT(t->tp_comm->size == tp && t->tp_comm->rank == t->tp_rank);
    L3D_ASSERT(t->pp_comm->size == pp && t->pp_comm->rank == t->pp_rank);
    L3D_ASSERT(t->dp_comm->size == dp && t->dp_comm->rank == t->dp_rank);
    L3D_ASSERT(ends == (t->embed_comm != NULL));
    t->tp_comm->role = "TP";
    t->pp_comm->role = "pipeline";
    t->dp_comm->role = "DP";
    if (t->embed_comm) t->embed_comm->role = "tied-embedding";
    if (world->watch) { /* the watchdog names ranks by their coordinates */
        world->watch->name = topo_rank_name;
        world->watch->name_ctx = t;
    }
    return L3D_OK;
}

void l3d_topo_free(struct l3d_topo *t) {
    if (t->tp_comm && t->tp_comm->watch && t->tp_comm->watch->name_ctx == t) {
        t->tp_comm->watch->name = NULL;
        t->tp_comm->watch->name_ctx = NULL;
    }
    if (t->edp_comm != t->dpcp_comm) l3d_comm_free(t->edp_comm);
    l3d_comm_free(t->ep_comm);
    t->edp_comm = t->ep_comm = NULL;
    if (t->dpcp_comm != t->dp_comm) l3d_comm_free(t->dpcp_comm);
    l3d_comm_free(t->cp_comm);
    t->dpcp_comm = t->cp_comm = NULL;
    l3d_comm_free(t->embed_comm);
    l3d_comm_free(t->dp_comm);
    l3d_comm_free(t->pp_comm);
    l3d_comm_free(t->tp_comm);
    t->embed_comm = t->dp_comm = t->pp_comm = t->tp_comm = NULL;
}
