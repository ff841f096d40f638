/*
 * llm3d rank grid: world = tp x pp x dp, tensor parallelism fastest-varying, so that a TP group
 * is a run of consecutive ranks (inside one node, as on Frontier, where TP stayed within the
 * 8 GCDs of a node), then pipeline stages, then data-parallel replicas:
 *
 *     rank = dp_rank * (pp * tp) + pp_rank * tp + tp_rank
 *
 * Worked example, 8 ranks as tp = 2, pp = 2, dp = 2:
 *
 *     rank  tp_rank pp_rank dp_rank   TP group  PP group  DP group
 *       0      0       0       0       {0,1}     {0,2}     {0,4}
 *       1      1       0       0       {0,1}     {1,3}     {1,5}
 *       2      0       1       0       {2,3}     {0,2}     {2,6}
 *       3      1       1       0       {2,3}     {1,3}     {3,7}
 *       4      0       0       1       {4,5}     {4,6}     {0,4}
 *       5      1       0       1       {4,5}     {5,7}     {1,5}
 *       6      0       1       1       {6,7}     {4,6}     {2,6}
 *       7      1       1       1       {6,7}     {5,7}     {3,7}
 *
 * The embedding group of a pipeline holds its first and last stage ({0,2}, {1,3}, {4,6}, {5,7}
 * here): the tied token embedding / LM head weight lives on both and its gradient is all-reduced
 * between them. With pp = 1 the only stage is first and last, and the group has one rank.
 *
 *   struct l3d_topo topo;
 *   struct l3d_run_spec s;  ...                            // the flags' layout
 *   if (l3d_spec_resolve(&s, &(struct l3d_spec_ctx){.world = world->size, .train = true},
 *                        NULL) != L3D_OK) ...             // before any allocation
 *   l3d_topo_init(&topo, world, &s.layout);
 *   l3d_comm_all_reduce(topo.dp_comm, ...);
 *   l3d_topo_free(&topo);
 */
#ifndef LLM3D_TOPO_H
#define LLM3D_TOPO_H

#include "llm3d/comm.h"
#include "llm3d/core.h"
#include "llm3d/spec.h"

/* This rank's place in the grid and its groups. The sizes are the layout's (tp, cp, pp, dp), which
 * the topology reads and does not copy. */
struct l3d_topo {
    const struct l3d_layout *layout; /* the resolved layout it was built for (not owned) */
    int rank, world_size;
    int tp_rank, cp_rank, pp_rank, dp_rank;
    struct l3d_comm *world;    /* not owned */
    struct l3d_comm *tp_comm;  /* ranks that differ only in tp_rank */
    struct l3d_comm *pp_comm;  /* ranks that differ only in pp_rank (a pipeline) */
    struct l3d_comm *dp_comm;  /* ranks that differ only in dp_rank (replicas) */
    struct l3d_comm *cp_comm;  /* ranks that differ only in cp_rank (a ring holding the chunks
                                * of the same sequences); NULL when cp = 1 */
    struct l3d_comm *dpcp_comm;/* ranks that differ in dp_rank or cp_rank, ordered dp_rank cp +
                                * cp_rank: the gradient reduction's and ZeRO's group (the weights
                                * are replicated over both); dp_comm itself when cp = 1 */
    struct l3d_comm *embed_comm; /* first and last stage of this pipeline; NULL on middle stages */
    /* Expert parallelism (layout ep > 1, a split of dpcp_comm): ep_rank = (dp_rank cp + cp_rank)
     * % ep. */
    int ep_rank;
    struct l3d_comm *ep_comm;  /* the ep consecutive DP x CP ranks that split the experts
                                * (dispatch and combine); NULL when ep = 1 */
    struct l3d_comm *edp_comm; /* the dp cp / ep ranks holding the same experts (same ep_rank):
                                * the experts' gradient reduction; dpcp_comm itself when ep = 1 */
};

/* The grid with context parallelism: tp fastest, then cp, then pp, then dp,
 *
 *     rank = ((dp_rank pp + pp_rank) cp + cp_rank) tp + tp_rank
 *
 * (cp = 1: the grid above). CP next to TP because its ring moves K and V at every layer of every
 * micro-batch, the most traffic after TP's, so a ring stays on a node's fast links when tp x cp
 * fits a node; PP sends one activation per micro-batch and stage, DP reduces once a step.
 * Rank of (tp_rank, cp_rank, pp_rank, dp_rank) in layout l (resolved), and back. */
int l3d_topo_rank_of(const struct l3d_layout *l, int tp_rank, int cp_rank, int pp_rank,
                     int dp_rank);
void l3d_topo_coords(const struct l3d_layout *l, int rank, int *tp_rank, int *cp_rank,
                     int *pp_rank, int *dp_rank);
/* Builds the sub-communicators of layout l (resolved, l3d_layout_resolve; it must outlive t):
 * collective over the world, four splits (TP, PP, DP, embedding), each group ordered by its own
 * coordinate, so tp_comm->rank == tp_rank and so on, and with a ring two more (cp_comm and
 * dpcp_comm). l3d_topo_free releases them (not the world). */
l3d_status l3d_topo_init(struct l3d_topo *t, struct l3d_comm *world, const struct l3d_layout *l);
void l3d_topo_free(struct l3d_topo *t);

#endif
