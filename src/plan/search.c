/* The layout search (l3d_plan_search): every valid layout of the run evaluated, the fastest that
 * fit kept; and the line on why the best one wins (l3d_plan_explain). */
#include <stdio.h>
#include <string.h>

#include "plan-impl.h"

struct l3d_plan_fixed l3d_plan_fixed_none(void) {
    return (struct l3d_plan_fixed){.zero = -1, .recompute = -1, .sp = -1, .v = 0, .cp = 0,
                                   .zero3_prefetch = 1};
}

static bool better(const struct l3d_plan_result *a, const struct l3d_plan_result *b) {
    if (a->time.step != b->time.step) return a->time.step < b->time.step;
    return a->mem.total < b->mem.total;
}

static void keep(struct l3d_plan_result *out, int top, int *n, const struct l3d_plan_result *r) {
    int i = *n < top ? (*n)++ : top;
    if (i == top) {
        if (!better(r, &out[top - 1])) return;
        i = top - 1;
    }
    while (i > 0 && better(r, &out[i - 1])) {
        out[i] = out[i - 1];
        i--;
    }
    out[i] = *r;
}

/* The fixed parts against the ranks (devices / th) and the model's heads. */
static l3d_status check_fixed(const struct l3d_model_spec *m, const struct l3d_profile *prof,
                              const struct l3d_plan_run *run, const struct l3d_plan_fixed *fx,
                              int th, int64_t ranks) {
    /* a stage the trainer has not: one sentence, not "no layout suits" after the search */
    l3d_status st = l3d_plan_zero_check(prof, run, fx->zero);
    if (st != L3D_OK) return st;
    const char *part[] = {"--tp", "--pp", "--dp", "--cp"};
    const int val[] = {fx->tp, fx->pp, fx->dp, fx->cp};
    for (int i = 0; i < 4; i++)
        if (val[i] && ranks % val[i] != 0)
            return l3d_error(L3D_ERR_LAYOUT,
                             "%s %d does not divide the %lld ranks (%lld devices%s)", part[i],
                             val[i], (long long)ranks, (long long)run->devices,
                             th > 1 ? " / threads" : "");
    if (fx->tp && m->NH % fx->tp != 0)
        return l3d_error(L3D_ERR_LAYOUT, "--tp %d does not divide the model's %d heads", fx->tp,
                         m->NH);
    int64_t cp = fx->cp ? fx->cp : 1;
    if ((int64_t)(fx->tp ? fx->tp : 1) * (fx->pp ? fx->pp : 1) * (fx->dp ? fx->dp : 1) * cp >
            ranks ||
        (fx->tp && fx->pp && fx->dp && (int64_t)fx->tp * fx->pp * fx->dp * cp != ranks))
        return l3d_error(L3D_ERR_LAYOUT, "--tp x --cp x --pp x --dp must equal the %lld ranks",
                         (long long)ranks);
    return L3D_OK;
}

/* The ring sizes the search tries: --cp; else 1 and the powers of two that cut the sequence into
 * 2 cp chunks of at least CP_MIN_CHUNK tokens (a shorter block hides little of its transfer, and
 * every size tried multiplies the search: give --cp to plan another). */
#define CP_MIN_CHUNK 1024
static bool cp_tried(const struct l3d_plan_fixed *fx, const struct l3d_model_spec *m, int64_t cp) {
    if (fx->cp) return cp == fx->cp;
    if (cp == 1) return true;
    return (cp & (cp - 1)) == 0 && m->maxT % (2 * cp) == 0 && m->maxT / (2 * cp) >= CP_MIN_CHUNK;
}

/* A search in progress: what it is run on, the best layouts so far and the first error. */
struct walk {
    const struct l3d_model_spec *m;
    const struct l3d_profile *prof;     /* the run's (l3d_plan_run_profile) */
    const struct l3d_plan_run *run;
    const struct l3d_plan_fixed *fx;
    struct l3d_plan_result *out;        /* the `top` fastest that fit, sorted; *n_out of them */
    int top, *n_out;
    struct l3d_plan_search_stats *stats;
    struct l3d_plan_cache cache;
    void (*each)(void *, const struct l3d_plan_result *); /* every valid layout, or NULL */
    void *each_ctx;
    l3d_status first_err;               /* of the first layout that was not valid */
    char first_msg[512];
};

/* The ZeRO stages, recomputations and SP choices of one (tp, pp, dp, micro-batch, v), each
 * evaluated, kept when it fits and is among the fastest. */
static void walk_variants(struct walk *w, const struct l3d_layout *base) {
    const struct l3d_plan_fixed *fx = w->fx;
    for (int z = 0; z <= 3; z++) {
        if (fx->zero >= 0 ? z != fx->zero : (z > 0 && base->dp == 1)) continue;
        if (z == 3 && !l3d_plan_trainer(w->run)) continue; /* Megatron-LM's optimizer: ZeRO-1/2 */
        for (int rc = 0; rc <= 2; rc++) {
            if (fx->recompute >= 0 && rc != fx->recompute) continue;
            for (int sp = 0; sp <= 1; sp++) {
                if (fx->sp >= 0 ? sp != fx->sp : (sp && base->tp == 1)) continue;
                struct l3d_layout lay = *base;
                lay.zero = z;
                lay.zero3_prefetch = fx->zero3_prefetch;
                lay.recompute = (enum l3d_recompute)rc;
                lay.sp = sp;
                struct l3d_plan_result res;
                w->stats->evaluated++;
                l3d_status e = l3d_plan_evaluate_in(w->m, w->prof, w->run, &lay, &res, &w->cache);
                if (e != L3D_OK) {
                    if (w->first_err == L3D_OK) {
                        w->first_err = e;
                        snprintf(w->first_msg, sizeof w->first_msg, "%s", l3d_error_message());
                    }
                    continue;
                }
                w->stats->valid++;
                if (w->each) w->each(w->each_ctx, &res);
                if (!res.fits) continue;
                w->stats->fit++;
                keep(w->out, w->top, w->n_out, &res);
            }
        }
    }
}

/* Every micro-batch and v of tp x cp x pp x dp ranks of th threads. */
static void walk_shape(struct walk *w, int64_t tp, int64_t cp, int64_t pp, int64_t dp, int th) {
    static const int mbs[] = {1, 2, 4, 8, 16, 32, 64};
    const struct l3d_plan_fixed *fx = w->fx;
    size_t n_mb = fx->mb ? 1 : sizeof mbs / sizeof mbs[0];
    for (size_t bi = 0; bi < n_mb; bi++) {
        int mb = fx->mb ? fx->mb : mbs[bi];
        if (w->run->global_batch % ((int64_t)mb * dp)) continue;
        /* every v that divides the layers a pipeline rank holds (Megatron-LM needs it; the
         * trainer splits unevenly, so there the rank's whole layers, L / pp rounded down, which
         * keeps the choice to the divisors) */
        int per_rank = (int)(w->m->L / pp);
        for (int v = 1; v <= per_rank; v++) {
            if (per_rank % v || (fx->v && v != fx->v)) continue;
            if (v > 1 && pp < 2) continue;
            struct l3d_layout base = {
                .tp = (int)tp, .cp = (int)cp, .pp = (int)pp, .dp = (int)dp, .micro_batch = mb,
                .v = v,
                .schedule = v > 1 ? L3D_PP_INTERLEAVED : L3D_PP_1F1B, .threads = th};
            walk_variants(w, &base);
        }
    }
}

l3d_status l3d_plan_search(const struct l3d_model_spec *m, const struct l3d_profile *prof,
                           const struct l3d_plan_run *run, const struct l3d_plan_fixed *fx,
                           struct l3d_plan_result *out, int top, int *n_out,
                           struct l3d_plan_search_stats *stats) {
    return l3d_plan_search_each(m, prof, run, fx, out, top, n_out, stats, NULL, NULL);
}

l3d_status l3d_plan_search_each(const struct l3d_model_spec *m, const struct l3d_profile *prof,
                                const struct l3d_plan_run *run, const struct l3d_plan_fixed *fx,
                                struct l3d_plan_result *out, int top, int *n_out,
                                struct l3d_plan_search_stats *stats,
                                void (*each)(void *, const struct l3d_plan_result *),
                                void *each_ctx) {
    double t0 = l3d_time_s();
    struct l3d_profile tmp;
    prof = l3d_plan_run_profile(prof, run, &tmp);
    memset(stats, 0, sizeof *stats);
    *n_out = 0;
    l3d_status st = l3d_plan_model_check(m);
    if (st != L3D_OK) return st;
    if (top < 1) return l3d_error(L3D_ERR_ARG, "--top %d must be at least 1", top);
    int th = run->threads > 0 ? run->threads : 1;
    if (run->devices % th != 0)
        return l3d_error(L3D_ERR_ARG, "%lld devices do not split into ranks of %d threads",
                         (long long)run->devices, th);
    int64_t ranks = run->devices / th;
    if ((st = check_fixed(m, prof, run, fx, th, ranks)) != L3D_OK) return st;
    struct walk w = {.m = m, .prof = prof, .run = run, .fx = fx, .out = out, .top = top,
                     .n_out = n_out, .stats = stats, .each = each, .each_ctx = each_ctx,
                     .first_err = L3D_OK};
    int dpn = prof->devices_per_node;
    for (int64_t tp = 1; tp <= ranks; tp++) {
        if (ranks % tp || (fx->tp && tp != fx->tp)) continue;
        if (!fx->tp && (tp > m->NH || (tp > dpn && dpn > 1))) continue;
        for (int64_t cp = 1; cp <= ranks / tp; cp++) {
            if ((ranks / tp) % cp || !cp_tried(fx, m, cp)) continue;
            int64_t rest = ranks / tp / cp;
            for (int64_t pp = 1; pp <= rest; pp++) {
                if (rest % pp || (fx->pp && pp != fx->pp) || pp > m->L) continue;
                int64_t dp = rest / pp;
                if (fx->dp && dp != fx->dp) continue;
                walk_shape(&w, tp, cp, pp, dp, th);
            }
        }
    }
    l3d_plan_cache_free(&w.cache);
    stats->seconds = l3d_time_s() - t0;
    if (stats->valid == 0 && w.first_err != L3D_OK)
        return l3d_error(w.first_err, "no valid layout; the first tried: %s", w.first_msg);
    if (stats->valid == 0)
        return l3d_error(L3D_ERR_LAYOUT, "no layout of %lld devices (ranks of %d threads) suits "
                         "this model and batch: check --devices, --global-batch and the fixed "
                         "parts", (long long)run->devices, th);
    return L3D_OK;
}

static const char *rc_words(enum l3d_recompute r) {
    return r == L3D_RECOMPUTE_FULL        ? "full recomputation"
           : r == L3D_RECOMPUTE_SELECTIVE ? "selective recomputation"
                                          : "no recomputation";
}

void l3d_plan_explain(const struct l3d_plan_result *a, const struct l3d_plan_result *b, char *buf,
                      size_t len) {
    if (!b) {
        snprintf(buf, len, "the only layout that fits");
        return;
    }
    const char *names[] = {"matrix products", "attention", "element-wise kernels", "recomputation",
                           "TP communication", "pipeline p2p", "pipeline bubble",
                           "DP communication", "embedding sync", "optimizer",
                           "context-parallel ring"};
    const struct l3d_plan_time *x = &a->time, *y = &b->time;
    const double va[] = {x->gemm - x->recompute, x->attention, x->elementwise, x->recompute,
                         x->tp_comm, x->pp_p2p, x->bubble, x->dp_comm, x->embed_sync,
                         x->optimizer, x->cp_comm};
    const double vb[] = {y->gemm - y->recompute, y->attention, y->elementwise, y->recompute,
                         y->tp_comm, y->pp_p2p, y->bubble, y->dp_comm, y->embed_sync,
                         y->optimizer, y->cp_comm};
    int best = 0;
    for (int i = 1; i < 11; i++)
        if (vb[i] - va[i] > vb[best] - va[best]) best = i;
    char cp[16] = "";
    if (b->layout.cp > 1) snprintf(cp, sizeof cp, " cp %d", b->layout.cp);
    snprintf(buf, len, "%.1f%% faster than the best layout of another shape (tp %d%s pp %d dp %d "
             "micro-batch %d v %d, ZeRO-%d, %s%s): %s %.3g s instead of %.3g s a step",
             100.0 * (b->time.step / a->time.step - 1), b->layout.tp, cp, b->layout.pp,
             b->layout.dp,
             b->layout.micro_batch, b->layout.v, b->layout.zero, rc_words(b->layout.recompute),
             b->layout.sp ? ", SP" : "", names[best], va[best], vb[best]);
}
