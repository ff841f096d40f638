/* The layout search (l3d_plan_search): every valid layout of the run evaluated, the fastest that
 * fit kept; and the line on why the best one wins (l3d_plan_explain). */
#include <stdio.h>
#include <string.h>

#include "plan-impl.h"

struct l3d_plan_fixed l3d_plan_fixed_none(void) {
    struct l3d_plan_fixed fx = {.mask = 0};
    fx.layout = (struct l3d_layout){.tp = 1, .cp = 1, .pp = 1, .v = 1, .micro_batch = 1,
                                    .schedule = L3D_PP_1F1B, .zero3_prefetch = 1, .threads = 1,
                                    .global_batch = 1};
    return fx;
}

void l3d_plan_fix(struct l3d_plan_fixed *fx, unsigned bit, int value) {
    struct l3d_layout *l = &fx->layout;
    fx->mask |= bit;
    switch (bit) {
    case L3D_FIX_TP: l->tp = value; break;
    case L3D_FIX_CP: l->cp = value; break;
    case L3D_FIX_PP: l->pp = value; break;
    case L3D_FIX_DP: l->dp = value; break;
    case L3D_FIX_MB: l->micro_batch = value; break;
    case L3D_FIX_V: l->v = value; break;
    case L3D_FIX_ZERO: l->zero = value; break;
    case L3D_FIX_RECOMPUTE: l->recompute = (enum l3d_recompute)value; break;
    case L3D_FIX_SP: l->sp = value != 0; break;
    case L3D_FIX_EP: l->ep = value; break;
    default: L3D_ASSERT(!"one L3D_FIX_ part");
    }
}

/* Whether part `bit` is fixed (its value: fx->layout's field). */
static bool fixed(const struct l3d_plan_fixed *fx, unsigned bit) { return fx->mask & bit; }

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
    const struct l3d_layout *l = &fx->layout;
    l3d_status st = l3d_plan_zero_check(prof, run, fixed(fx, L3D_FIX_ZERO) ? l->zero : -1);
    if (st != L3D_OK) return st;
    const char *part[] = {"--tp", "--pp", "--dp", "--cp"};
    const unsigned bit[] = {L3D_FIX_TP, L3D_FIX_PP, L3D_FIX_DP, L3D_FIX_CP};
    const int val[] = {l->tp, l->pp, l->dp, l->cp};
    int64_t size[4];
    for (int i = 0; i < 4; i++) size[i] = fixed(fx, bit[i]) ? val[i] : 0;
    for (int i = 0; i < 4; i++)
        if (size[i] && ranks % size[i] != 0)
            return l3d_error(L3D_ERR_LAYOUT,
                             "%s %d does not divide the %lld ranks (%lld devices%s)", part[i],
                             val[i], (long long)ranks, (long long)run->devices,
                             th > 1 ? " / threads" : "");
    if (size[0] && m->NH % size[0] != 0)
        return l3d_error(L3D_ERR_LAYOUT, "--tp %d does not divide the model's %d heads", l->tp,
                         m->NH);
    int64_t cp = size[3] ? size[3] : 1;
    if ((size[0] ? size[0] : 1) * (size[1] ? size[1] : 1) * (size[2] ? size[2] : 1) * cp > ranks ||
        (size[0] && size[1] && size[2] && size[0] * size[1] * size[2] * cp != ranks))
        return l3d_error(L3D_ERR_LAYOUT, "--tp x --cp x --pp x --dp must equal the %lld ranks",
                         (long long)ranks);
    return L3D_OK;
}

/* The ring sizes the search tries: --cp; else 1 and the powers of two that cut the sequence into
 * 2 cp chunks of at least CP_MIN_CHUNK tokens (a shorter block hides little of its transfer, and
 * every size tried multiplies the search: give --cp to plan another). */
#define CP_MIN_CHUNK 1024
static bool cp_tried(const struct l3d_plan_fixed *fx, const struct l3d_model_spec *m, int64_t cp) {
    if (fixed(fx, L3D_FIX_CP)) return cp == fx->layout.cp;
    if (cp == 1) return true;
    int64_t T = fx->layout.seq > 0 ? fx->layout.seq : m->maxT;
    return (cp & (cp - 1)) == 0 && T % (2 * cp) == 0 && T / (2 * cp) >= CP_MIN_CHUNK;
}

/* An enumeration in progress (l3d_plan_layouts). */
struct space_walk {
    const struct l3d_plan_space *sp;
    void (*each)(void *, const struct l3d_layout *);
    void *ctx;
};

/* The ZeRO stages, recomputations and SP choices of one (tp, cp, pp, dp, micro-batch, v). */
static void walk_variants(const struct space_walk *w, const struct l3d_layout *base) {
    const struct l3d_plan_fixed *fx = w->sp->fx;
    const struct l3d_layout *f = &fx->layout;
    for (int z = 0; z <= 3; z++) {
        if (fixed(fx, L3D_FIX_ZERO) ? z != f->zero : (z > 0 && base->dp == 1)) continue;
        if (z == 3 && !w->sp->zero3) continue; /* Megatron-LM's optimizer: ZeRO-1/2 */
        bool zb = l3d_pp_split(base->schedule); /* l3d_spec_check's refusals */
        if (zb && z >= 2 && w->sp->m->moe.experts > 0) continue;
        for (int rc = 0; rc <= 2; rc++) {
            if (fixed(fx, L3D_FIX_RECOMPUTE) && rc != (int)f->recompute) continue;
            for (int sp = 0; sp <= 1; sp++) {
                if (fixed(fx, L3D_FIX_SP) ? sp != f->sp : (sp && base->tp == 1)) continue;
                struct l3d_layout lay = *base;
                lay.zero = z;
                lay.zero3_prefetch = f->zero3_prefetch;
                lay.recompute = (enum l3d_recompute)rc;
                lay.sp = sp;
                lay.xent_chunk = f->xent_chunk; /* the run's, never searched */
                w->each(w->ctx, &lay);
            }
        }
    }
}

/* The micro-batches tried (l3d_plan_fixed's rule: at most 7) into mbs; their number. */
static int micro_batches(const struct l3d_plan_fixed *fx, int mbs[8]) {
    int n = 0;
    if (fixed(fx, L3D_FIX_MB)) {
        mbs[n++] = fx->layout.micro_batch;
    } else if (fx->mb_halvings) {
        for (int b = fx->layout.micro_batch; b >= 1 && n < 4; b /= 2) {
            mbs[n++] = b;
            if (b % 2) break;
        }
    } else {
        for (int b = 1; b <= 64; b *= 2) mbs[n++] = b;
    }
    return n;
}

/* Megatron-LM's stages hold equal layers; when S does not divide L, Megatron-Core's shorter end
 * stages: first and last k layers each (the largest k below L / S that splits the rest evenly over
 * the S - 2 others: Llama 3 405B's 126 layers on 16 as 7 + 14 x 8 + 7), or on two stages the
 * first the shorter half. Left even (and refused by the rules) when no k does. */
static void balance_ends(int L, int S, struct l3d_layout *l) {
    if (S < 2 || L % S == 0) return;
    if (S == 2) {
        l->pp_first = L / 2;
        return;
    }
    for (int k = L / S; k >= 1; k--)
        if ((L - 2 * k) % (S - 2) == 0) {
            l->pp_first = l->pp_last = k;
            return;
        }
}

/* Every micro-batch and v of tp x cp x pp x dp ranks, the experts over ep of them. */
static void walk_shape(const struct space_walk *w, int64_t tp, int64_t cp, int64_t pp,
                       int64_t dp, int ep) {
    const struct l3d_plan_fixed *fx = w->sp->fx;
    const struct l3d_layout *f = &fx->layout;
    int mbs[8], n_mb = micro_batches(fx, mbs);
    for (int bi = 0; bi < n_mb; bi++) {
        int mb = mbs[bi];
        if (f->global_batch % ((int64_t)mb * dp)) continue;
        /* every v that divides the layers a pipeline rank holds (Megatron-LM needs it; the
         * trainer splits unevenly, so there the rank's whole layers, L / pp rounded down, which
         * keeps the choice to the divisors) */
        int per_rank = (int)(w->sp->m->L / pp);
        for (int v = 1; v <= per_rank; v++) {
            if (per_rank % v || (fixed(fx, L3D_FIX_V) && v != fx->layout.v)) continue;
            if (v > 1 && pp < 2) continue;
            enum l3d_pp_kind one = fx->layout.schedule == L3D_PP_GPIPE && pp > 1 ? L3D_PP_GPIPE
                                                                                 : L3D_PP_1F1B;
            struct l3d_layout base = {
                .tp = (int)tp, .cp = (int)cp, .pp = (int)pp, .dp = (int)dp, .ep = ep,
                .micro_batch = mb,
                .v = v, .schedule = v > 1 ? L3D_PP_INTERLEAVED : one,
                .threads = f->threads > 0 ? f->threads : 1, .seq = f->seq,
                .global_batch = f->global_batch, .bucket_bytes = f->bucket_bytes,
                .pp_layers = f->pp_layers, .pp_first = f->pp_first, .pp_last = f->pp_last};
            if (w->sp->even_stages && !f->pp_layers && !f->pp_first && !f->pp_last)
                balance_ends(w->sp->m->L, (int)pp * v, &base);
            if (!l3d_pp_split(f->schedule)) walk_variants(w, &base);
            /* zero-bubble ZB-H1 beside 1F1B (one chunk a rank), ZB-V beside interleaved (two) */
            bool any = w->sp->zero_bubble && one == L3D_PP_1F1B;
            bool zbh = f->schedule == L3D_PP_ZBH1 || (any && f->schedule != L3D_PP_ZBV);
            bool zbv = f->schedule == L3D_PP_ZBV || (any && f->schedule != L3D_PP_ZBH1);
            if ((zbh && v == 1) || (zbv && v == 2)) {
                base.schedule = v == 1 ? L3D_PP_ZBH1 : L3D_PP_ZBV;
                if (pp > 1) walk_variants(w, &base);
            }
        }
    }
}

/* Expert parallelism's sizes: ep divides the ranks a DP group and its ring hold (dp x cp) and
 * the experts; a dense model's 1, a fixed --ep whatever it divides (the rules refuse it by
 * name). */
static void walk_experts(const struct space_walk *w, int64_t tp, int64_t cp, int64_t pp,
                         int64_t dp) {
    const struct l3d_plan_fixed *fx = w->sp->fx;
    int E = w->sp->m->moe.experts;
    if (fixed(fx, L3D_FIX_EP)) {
        walk_shape(w, tp, cp, pp, dp, fx->layout.ep);
        return;
    }
    for (int64_t ep = 1; ep <= (E > 0 ? dp * cp : 1); ep++)
        if (ep == 1 || ((dp * cp) % ep == 0 && E % ep == 0))
            walk_shape(w, tp, cp, pp, dp, (int)ep);
}

void l3d_plan_layouts(const struct l3d_plan_space *sp,
                      void (*each)(void *, const struct l3d_layout *), void *ctx) {
    const struct l3d_plan_fixed *fx = sp->fx;
    const struct l3d_layout *f = &fx->layout;
    const struct l3d_model_spec *m = sp->m;
    struct space_walk w = {.sp = sp, .each = each, .ctx = ctx};
    int64_t ranks = sp->ranks;
    for (int64_t tp = 1; tp <= ranks; tp++) {
        if (ranks % tp || (fixed(fx, L3D_FIX_TP) && tp != f->tp)) continue;
        if (!fixed(fx, L3D_FIX_TP) && (tp > m->NH || (tp > sp->dpn && sp->dpn > 1))) continue;
        for (int64_t cp = 1; cp <= ranks / tp; cp++) {
            if ((ranks / tp) % cp || !cp_tried(fx, m, cp)) continue;
            int64_t rest = ranks / tp / cp;
            for (int64_t pp = 1; pp <= rest; pp++) {
                if (rest % pp || (fixed(fx, L3D_FIX_PP) && pp != f->pp) || pp > m->L) continue;
                int64_t dp = rest / pp;
                if (fixed(fx, L3D_FIX_DP) && dp != f->dp) continue;
                walk_experts(&w, tp, cp, pp, dp);
            }
        }
    }
}

/* A search in progress: what it is run on, the best layouts so far and the first error. */
struct walk {
    const struct l3d_model_spec *m;
    const struct l3d_profile *prof;     /* the run's (l3d_plan_run_profile) */
    const struct l3d_plan_run *run;
    struct l3d_plan_result *out;        /* the `top` fastest that fit, sorted; *n_out of them */
    int top, *n_out;
    struct l3d_plan_search_stats *stats;
    struct l3d_plan_cache cache;
    void (*each)(void *, const struct l3d_plan_result *); /* every valid layout, or NULL */
    void *each_ctx;
    l3d_status first_err;               /* of the first layout that was not valid */
    char first_msg[512];
};

/* One layout of the search: evaluated, kept when it fits and is among the fastest. */
static void walk_one(void *ctx, const struct l3d_layout *lay) {
    struct walk *w = ctx;
    struct l3d_plan_result res;
    w->stats->evaluated++;
    l3d_status e = l3d_plan_evaluate_in(w->m, w->prof, w->run, lay, &res, &w->cache);
    if (e != L3D_OK) {
        if (w->first_err == L3D_OK) {
            w->first_err = e;
            snprintf(w->first_msg, sizeof w->first_msg, "%s", l3d_error_message());
        }
        return;
    }
    w->stats->valid++;
    if (w->each) w->each(w->each_ctx, &res);
    if (!res.fits) return;
    w->stats->fit++;
    keep(w->out, w->top, w->n_out, &res);
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
    int th = fx->layout.threads > 0 ? fx->layout.threads : 1;
    if (run->devices % th != 0)
        return l3d_error(L3D_ERR_ARG, "%lld devices do not split into ranks of %d threads",
                         (long long)run->devices, th);
    int64_t ranks = run->devices / th;
    if ((st = check_fixed(m, prof, run, fx, th, ranks)) != L3D_OK) return st;
    struct walk w = {.m = m, .prof = prof, .run = run, .out = out, .top = top,
                     .n_out = n_out, .stats = stats, .each = each, .each_ctx = each_ctx,
                     .first_err = L3D_OK};
    l3d_plan_layouts(&(struct l3d_plan_space){.m = m, .ranks = ranks,
                                              .dpn = prof->devices_per_node,
                                              .zero3 = l3d_plan_trainer(run),
                                              .even_stages = !l3d_plan_trainer(run),
                                              .zero_bubble = l3d_plan_trainer(run), .fx = fx},
                     walk_one, &w);
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
                           "context-parallel ring", "experts' all-to-all"};
    const struct l3d_plan_time *x = &a->time, *y = &b->time;
    const double va[] = {x->gemm - x->recompute, x->attention, x->elementwise, x->recompute,
                         x->tp_comm, x->pp_p2p, x->bubble, x->dp_comm, x->embed_sync,
                         x->optimizer, x->cp_comm, x->ep_comm};
    const double vb[] = {y->gemm - y->recompute, y->attention, y->elementwise, y->recompute,
                         y->tp_comm, y->pp_p2p, y->bubble, y->dp_comm, y->embed_sync,
                         y->optimizer, y->cp_comm, y->ep_comm};
    int best = 0;
    for (int i = 1; i < 12; i++)
        if (vb[i] - va[i] > vb[best] - va[best]) best = i;
    char cp[32] = "";
    size_t k = 0;
    if (b->layout.cp > 1) k = (size_t)snprintf(cp, sizeof cp, " cp %d", b->layout.cp);
    if (b->layout.ep > 1 && k < sizeof cp) snprintf(cp + k, sizeof cp - k, " ep %d", b->layout.ep);
    snprintf(buf, len, "%.1f%% faster than the best layout of another shape (tp %d%s pp %d dp %d "
             "micro-batch %d v %d, ZeRO-%d, %s%s): %s %.3g s instead of %.3g s a step",
             100.0 * (b->time.step / a->time.step - 1), b->layout.tp, cp, b->layout.pp,
             b->layout.dp,
             b->layout.micro_batch, b->layout.v, b->layout.zero, rc_words(b->layout.recompute),
             b->layout.sp ? ", SP" : "", names[best], va[best], vb[best]);
}
