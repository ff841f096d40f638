/* Node-aware placement (src/train/train-impl.h, l3d_train_placement): the node of every rank, the
 * check that each tensor-parallel group sits inside one node, and the start-up lines that show
 * where the groups of a multi-node run lie. */
#include <stdio.h>
#include <string.h>

#include "llm3d/topo.h"
#include "train/train-impl.h"

enum { GROUPS_SHOWN = 4 }; /* groups listed per kind; the rest are counted */

/* Appends "{r0,r1,...} on node a" or "... on nodes a,b" for the group of ranks[0..n) to out (cap
 * bytes in all, truncated). */
static void describe_group(char *out, size_t cap, const int *ranks, int n, const int *node_of) {
    char nodes[128] = "";
    int shown = 0;
    size_t k = strlen(out), m = 0;
#define ADD(buf, len, size, ...) \
    (len += (size_t)snprintf(buf + len, len < size ? size - len : 0, __VA_ARGS__))
    for (int i = 0; i < n; i++) {
        ADD(out, k, cap, "%s%d", i ? "," : "{", ranks[i]);
        bool seen = false; /* each node once, in the order of the group's ranks */
        for (int j = 0; j < i; j++) seen = seen || node_of[ranks[j]] == node_of[ranks[i]];
        if (!seen) ADD(nodes, m, sizeof nodes, "%s%d", shown++ ? "," : "", node_of[ranks[i]]);
    }
    ADD(out, k, cap, "} on node%s %s", shown > 1 ? "s" : "", nodes);
#undef ADD
}

/* kind 0: TP groups (tp_rank varies), 1: PP groups (pp_rank), 2: DP groups (dp_rank), 3: CP rings
 * (cp_rank); size: tp, pp, dp, cp of layout l. The ranks of group g of that kind into ranks[],
 * returning their number: g numbers the other coordinates, tp fastest, then pp, dp, cp. */
static int group(const struct l3d_layout *l, int kind, int g, const int size[4], int *ranks) {
    for (int i = 0; i < size[kind]; i++) {
        int c[4], rest = g;
        for (int k = 0; k < 4; k++) {
            if (k == kind) continue;
            c[k] = rest % size[k];
            rest /= size[k];
        }
        c[kind] = i;
        ranks[i] = l3d_topo_rank_of(l, c[0], c[3], c[1], c[2]);
    }
    return size[kind];
}

l3d_status l3d_train_placement(const struct l3d_train_config *tc, struct l3d_comm *world,
                               bool lead) {
    int W = world->size, tp = tc->layout.tp;
    const int size[4] = {tp, tc->layout.pp, tc->layout.dp, tc->layout.cp};
    int *node_of = l3d_alloc((size_t)W * sizeof *node_of, "node of each rank");
    int *ranks = l3d_alloc((size_t)W * sizeof *ranks, "ranks of a group");
    int nodes = l3d_comm_nodes(world, node_of);
    l3d_status st = L3D_OK;
    /* the first TP group that spans nodes (every rank reaches the same verdict) */
    for (int g = 0; g < W / tp && st == L3D_OK; g++) {
        int n = group(&tc->layout, 0, g, size, ranks);
        bool split = false;
        for (int i = 1; i < n; i++) split = split || node_of[ranks[i]] != node_of[ranks[0]];
        if (!split) continue;
        char grp[256] = "";
        describe_group(grp, sizeof grp, ranks, n, node_of);
        if (tc->allow_cross_node_tp) {
            if (lead)
                fprintf(stderr, "llm3d train: warning: --tp %d: the TP group %s spans nodes "
                        "(--allow-cross-node-tp): its all-reduces, several per layer, cross the "
                        "network\n", tp, grp);
            break;
        }
        st = l3d_error(L3D_ERR_LAYOUT, "--tp %d: the TP group %s spans nodes, and its "
                       "all-reduces (several per layer) would cross the network: TP groups are "
                       "runs of --tp consecutive ranks, so start a multiple of %d ranks per node "
                       "in rank order (hostfile slots, mpirun --map-by slot, srun "
                       "--distribution=block), use a --tp that divides the ranks per node, or "
                       "give --allow-cross-node-tp to run anyway", tp, grp, tp);
    }
    if (st == L3D_OK && lead && nodes > 1) {
        char line[1024];
        int k = snprintf(line, sizeof line, "nodes: %d (ranks that share memory, as the MPI "
                         "launcher placed them): rank:node", nodes);
        for (int r = 0; r < W && k < (int)sizeof line - 32; r++)
            k += snprintf(line + k, sizeof line - (size_t)k, " %d:%d", r, node_of[r]);
        if (k >= (int)sizeof line - 32) snprintf(line + k, sizeof line - (size_t)k, " ...");
        printf("%s\n", line);
        static const char *const kind_name[4] = {"TP", "PP", "DP", "CP"};
        for (int kind = 0; kind < 4; kind++) {
            if (size[kind] == 1) continue;
            int count = W / size[kind], across = 0;
            line[0] = '\0';
            for (int g = 0; g < count; g++) {
                int n = group(&tc->layout, kind, g, size, ranks);
                bool split = false;
                for (int i = 1; i < n; i++) split = split || node_of[ranks[i]] != node_of[ranks[0]];
                across += split;
                if (g < GROUPS_SHOWN) {
                    if (g) strncat(line, "; ", sizeof line - strlen(line) - 1);
                    describe_group(line, sizeof line, ranks, n, node_of);
                }
            }
            printf("%s groups: %d, %d of them across nodes: %s%s\n", kind_name[kind], count,
                   across, line, count > GROUPS_SHOWN ? "; ..." : "");
        }
        fflush(stdout);
    }
    l3d_free(ranks);
    l3d_free(node_of);
    return st;
}
