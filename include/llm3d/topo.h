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
 *   int tp = 2, pp = 2, dp = 0;                            // dp 0: inferred
 *   if (l3d_topo_resolve(world->size, &tp, &pp, &dp) != L3D_OK) ... // before any allocation
 *   l3d_topo_init(&topo, world, tp, pp, dp);
 *   l3d_comm_all_reduce(topo.dp_comm, ...);
 *   l3d_topo_free(&topo);
 */
#ifndef LLM3D_TOPO_H
#define LLM3D_TOPO_H

#include "llm3d/comm.h"
#include "llm3d/core.h"

struct l3d_topo {
    int tp, pp, dp;
    int rank, world_size;
    int tp_rank, pp_rank, dp_rank;
    int cp, cp_rank;           /* context parallelism (l3d_topo_init_cp); 1 and 0 otherwise */
    struct l3d_comm *world;    /* not owned */
    struct l3d_comm *tp_comm;  /* ranks that differ only in tp_rank */
    struct l3d_comm *pp_comm;  /* ranks that differ only in pp_rank (a pipeline) */
    struct l3d_comm *dp_comm;  /* ranks that differ only in dp_rank (replicas) */
    struct l3d_comm *cp_comm;  /* ranks that differ only in cp_rank (a ring holding the chunks
                                * of the same sequences) */
    struct l3d_comm *dpcp_comm;/* ranks that differ in dp_rank or cp_rank, ordered dp_rank cp +
                                * cp_rank: the gradient reduction's and ZeRO's group (the weights
                                * are replicated over both); dp_comm itself when cp = 1 */
    struct l3d_comm *embed_comm; /* first and last stage of this pipeline; NULL on middle stages */
};

/* Checks tp, pp >= 1 and dp >= 0 and fills dp when it is 0 (world / (tp * pp)); L3D_ERR_LAYOUT,
 * with a message naming the flags (--tp, --pp, --dp), their values, the world size and what to
 * do, when one is out of range, tp * pp does not divide the world, or tp * pp * dp != world_size.
 * Collective-free: every rank reaches the same verdict on its own. */
l3d_status l3d_topo_resolve(int world_size, int *tp, int *pp, int *dp);
/* The same with a context-parallel ring of cp ranks (world = tp x cp x pp x dp): cp must divide
 * the world, dp 0 is world / (tp x cp x pp), and the messages name --cp and the whole product
 * ("--tp 1 x --cp 2 x --pp 1 x --dp 2 = 4 ranks, but the world size is 2"). cp 1: as above. */
l3d_status l3d_topo_resolve_cp(int world_size, int *tp, int cp, int *pp, int *dp);
/* Rank of (tp_rank, pp_rank, dp_rank), and back. */
int l3d_topo_rank_of(int tp, int pp, int tp_rank, int pp_rank, int dp_rank);
void l3d_topo_coords(int tp, int pp, int rank, int *tp_rank, int *pp_rank, int *dp_rank);
/* Builds the sub-communicators (collective over the world: four splits, each group ordered by its
 * own coordinate, so tp_comm->rank == tp_rank and so on). The layout must be resolved.
 * l3d_topo_free releases them (not the world). */
l3d_status l3d_topo_init(struct l3d_topo *t, struct l3d_comm *world, int tp, int pp, int dp);
/* The grid with context parallelism: tp fastest, then cp, then pp, then dp,
 *
 *     rank = ((dp_rank pp + pp_rank) cp + cp_rank) tp + tp_rank
 *
 * (cp = 1: the grid above). CP next to TP because its ring moves K and V at every layer of every
 * micro-batch, the most traffic after TP's, so a ring stays on a node's fast links when tp x cp
 * fits a node; PP sends one activation per micro-batch and stage, DP reduces once a step. Two
 * more splits: cp_comm and dpcp_comm (after the four above). tp / pp / dp_rank of rank_of_cp and
 * coords_cp as above. */
l3d_status l3d_topo_init_cp(struct l3d_topo *t, struct l3d_comm *world, int tp, int cp, int pp,
                            int dp);
int l3d_topo_rank_of_cp(int tp, int cp, int pp, int tp_rank, int cp_rank, int pp_rank,
                        int dp_rank);
void l3d_topo_coords_cp(int tp, int cp, int pp, int rank, int *tp_rank, int *cp_rank,
                        int *pp_rank, int *dp_rank);
void l3d_topo_free(struct l3d_topo *t);

#endif
