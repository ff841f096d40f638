/* The memory check before allocation (src/train/train-impl.h, l3d_train_memory_check): the
 * layout's planned bytes per rank (the planner's closed form, l3d_plan_memory: exactly what the
 * trainer allocates) against the memory this rank may use (MemAvailable, or the cgroup's limit
 * less its usage when lower, shared by the ranks of the node), and the layouts that would fit. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llm3d/hf.h"
#include "llm3d/pipeline.h"
#include "llm3d/plan.h"
#include "train/train-impl.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

/* bytes as "1.50 GiB" or "3.4 MiB" (a temporary: use within the expression) */
struct human { char s[32]; };
static struct human human(double b) {
    struct human h;
    if (b >= GIB) snprintf(h.s, sizeof h.s, "%.2f GiB", b / GIB);
    else snprintf(h.s, sizeof h.s, "%.1f MiB", b / 1048576.0);
    return h;
}

/* The first integer after `key` in file path, in bytes (meminfo lines are in kB: scale 1024);
 * -1 when the file or the key is not there or says "max". */
static double read_number(const char *path, const char *key, double scale) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[256];
    double v = -1;
    while (fgets(line, sizeof line, f)) {
        if (key && strncmp(line, key, strlen(key)) != 0) continue;
        const char *p = line + (key ? strlen(key) : 0);
        char *end;
        unsigned long long x = strtoull(p, &end, 10);
        if (end != p) v = (double)x * scale;
        break;
    }
    fclose(f);
    return v;
}

/* The process's cgroup path for controller ctl ("" for v2's unified line), from /proc/self/cgroup;
 * "" when it is the root or the file is not there. */
static void cgroup_path(const char *ctl, char *out, size_t cap) {
    out[0] = '\0';
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *a = strchr(line, ':'), *b = a ? strchr(a + 1, ':') : NULL;
        if (!b) continue;
        *b = '\0';
        bool hit = ctl[0] ? strstr(a + 1, ctl) != NULL : a[1] == '\0';
        if (hit && strcmp(b + 1, "/") != 0) snprintf(out, cap, "%s", b + 1);
        if (hit) break;
    }
    fclose(f);
}

/* limit - usage of a cgroup whose files are dir/limit and dir/usage, tried below the process's
 * own path and at the mount's root (a container sees its own group there); -1 without a limit. */
static double cgroup_room(const char *mount, const char *sub, const char *limit,
                          const char *usage) {
    char path[1536];
    double best = -1;
    const char *dirs[2] = {sub, ""};
    for (int i = 0; i < 2; i++) {
        if (i == 0 && !sub[0]) continue;
        snprintf(path, sizeof path, "%s%s/%s", mount, dirs[i], limit);
        double lim = read_number(path, NULL, 1.0);
        if (lim < 0 || lim >= 9.0e18) continue; /* "max", or v1's "no limit" (2^63 - page) */
        snprintf(path, sizeof path, "%s%s/%s", mount, dirs[i], usage);
        double use = read_number(path, NULL, 1.0);
        double room = lim - (use > 0 ? use : 0);
        if (room < 0) room = 0;
        if (best < 0 || room < best) best = room;
    }
    return best;
}

/* The bytes this node may still allocate, and a description of where the figure comes from. */
static double node_available(char *src, size_t cap) {
    const char *test = getenv("L3D_TEST_MEM_AVAILABLE");
    if (test && *test) { /* tests: a machine of that many bytes */
        snprintf(src, cap, "L3D_TEST_MEM_AVAILABLE");
        return strtod(test, NULL);
    }
    double avail = read_number("/proc/meminfo", "MemAvailable:", 1024.0);
    snprintf(src, cap, "MemAvailable");
    char sub[1024];
    cgroup_path("", sub, sizeof sub);
    double v2 = cgroup_room("/sys/fs/cgroup", sub, "memory.max", "memory.current");
    cgroup_path("memory", sub, sizeof sub);
    double v1 = cgroup_room("/sys/fs/cgroup/memory", sub, "memory.limit_in_bytes",
                            "memory.usage_in_bytes");
    if (v2 >= 0 && (avail < 0 || v2 < avail)) {
        avail = v2;
        snprintf(src, cap, "the cgroup's memory.max less its usage");
    }
    if (v1 >= 0 && (avail < 0 || v1 < avail)) {
        avail = v1;
        snprintf(src, cap, "the cgroup's memory limit less its usage");
    }
    return avail;
}

/* One layout of the trainer (the run spec's layout with its own parts changed; accum its
 * micro-batches a step) and what the planner and the trainer count for it. */
struct cand {
    struct l3d_layout lay;
    double bytes; /* the fullest rank's, extras included; < 0: not a valid layout */
    double gather; /* of which model.bin's gathered copy (rank 0) */
    double sched; /* of which the pipeline schedules (training and validation) */
    struct l3d_plan_mem mem;
    int cost;     /* how far from the flags given: fewer and cheaper changes first */
};

static const char *rc_name(enum l3d_recompute r) {
    return r == L3D_RECOMPUTE_NONE ? "none" : r == L3D_RECOMPUTE_SELECTIVE ? "selective" : "full";
}

/* The planner's bytes of layout c with m micro-batches a step (l3d_plan_memory) into *mem;
 * false when it refuses the layout. */
static bool plan_at(const struct l3d_train_config *tc, const struct cand *c, int64_t m,
                    struct l3d_plan_mem *mem) {
    /* the run's spec with the candidate's layout, its sequence planned and its context the
     * position table's rows (the trainer sizes wpe by --context) */
    struct l3d_model_spec pm = tc->model;
    snprintf(pm.name, sizeof pm.name, "train");
    const struct l3d_layout *l = &c->lay;
    struct l3d_plan_run run = l3d_plan_run_default();
    run.devices = (int64_t)l->tp * l->pp * l->dp * l->cp;
    const char *attn = getenv("L3D_ATTENTION");
    run.flash = !(attn && strcmp(attn, "naive") == 0);
    run.precision = tc->precision;
    run.llm3d = true; /* this trainer's allocation plan in every precision */
    /* whatever tc's own stage: a ZeRO-3 candidate moves pieces when the run reads or saves
     * files, through the checkpoint's staging size */
    run.files = tc->resume || tc->init_from || tc->save_every > 0;
    run.piece_bytes = l3d_ckpt_stage_bytes();
    struct l3d_layout lay = *l;
    lay.accum = (int)m;
    lay.global_batch = 0;
    lay.threads = 1;
    return l3d_plan_memory(&pm, &run, &lay, mem) == L3D_OK;
}

/* The planner's bytes for c's micro-batches. It plans at most PLAN_MAX_MICRO of them
 * (l3d_plan_check); beyond, each term that grows with them grows linearly (the token ids, and
 * GPipe's activations; the other schedules keep at most the pipeline's depth in flight), so the
 * line through two plans below the bound gives the figures. */
#define PLAN_MAX_MICRO (1 << 24)
static bool plan_memory(const struct l3d_train_config *tc, const struct cand *c,
                        struct l3d_plan_mem *mem) {
    const struct l3d_layout *l = &c->lay;
    if (l->accum <= PLAN_MAX_MICRO) return plan_at(tc, c, l->accum, mem);
    int64_t step = l->v > 1 ? l->pp : 1; /* interleaving: a multiple of --pp */
    int64_t m1 = PLAN_MAX_MICRO / step * step, m0 = m1 / 2 / step * step;
    struct l3d_plan_mem a, b;
    if (m0 < 1 || !plan_at(tc, c, m0, &a) || !plan_at(tc, c, m1, &b)) return false;
    double k = (double)(l->accum - m1) / (double)(m1 - m0);
    *mem = b;
    mem->params += k * (b.params - a.params);
    mem->grads += k * (b.grads - a.grads);
    mem->optimizer += k * (b.optimizer - a.optimizer);
    mem->activations += k * (b.activations - a.activations);
    mem->other += k * (b.other - a.other);
    mem->total += k * (b.total - a.total);
    return true;
}

/* What grows with the micro-batches (and validation's batches), the trainer holds and the
 * planner leaves out: the pipeline schedules of every stage, which the trainer builds after this
 * check (l3d_train_layout_build; l3d_pp_schedule_bytes) into *sched; the pipeline executor's
 * requests, two for each activation slot of a chunk (src/parallel/pipe_exec.c: GPipe keeps every
 * micro-batch in flight, 1F1B at most pp, interleaving at most its warm-up); the token ids of
 * --val-batches beyond the planner's 8; the --trace buffer (src/train/train.c). */
static double micro_extras(const struct l3d_train_config *tc, const struct cand *c,
                           double *sched) {
    const struct l3d_layout *l = &c->lay;
    int pp = l->pp, v = l->v;
    int64_t m = l->accum, vb = tc->val_pattern ? tc->val_batches : 0;
    *sched = (double)l3d_pp_schedule_bytes(pp, v, m, false);
    if (vb > 0) *sched += (double)l3d_pp_schedule_bytes(pp, v, vb, true);
    int64_t slots = l3d_pp_in_flight(l->schedule, pp, 0, v, m); /* stage 0 holds the most */
    if (slots > m) slots = m;
    double b = *sched + 2.0 * v * (double)slots * sizeof(l3d_req);
    int64_t planned = m > 8 ? m : 8, held = m > tc->val_batches ? m : tc->val_batches;
    if (held > planned)
        b += 2.0 * sizeof(int32_t) * l->micro_batch * tc->layout.seq * (double)(held - planned);
    if (tc->trace_path) { /* the events of the busiest stage's steps, at most 1 << 22 */
        double most = 0;
        for (int r = 0; r < pp; r++) {
            double n = (double)l3d_pp_schedule_actions(l->schedule, pp, v, m, r, false) + 4;
            if (vb > 0) n += (double)l3d_pp_schedule_actions(l->schedule, pp, v, vb, r, true);
            most = n > most ? n : most;
        }
        double ev = (most + L3D_KF_N) * tc->steps + 64; /* + the kernel families' rows */
        b += (ev < (1 << 22) ? ev : (1 << 22)) * sizeof(struct l3d_pp_event);
    }
    return b;
}

/* --async-save's staging (l3d_ckpt_async_bytes, held from start-up): the writing rank's fp32
 * parameters (the views: 4 bytes each of the planner's w) and its AdamW moments (8 of the
 * optimizer's 8 or, with master weights, 12 a parameter), 64 bytes of alignment each; none where
 * the parameters move a piece at a time (ZeRO-3, mixed-precision ZeRO-2: saved synchronously). */
static double async_staging(const struct l3d_train_config *tc, const struct cand *c) {
    const struct l3d_layout *l = &c->lay;
    bool mixed = tc->precision.param != L3D_F32;
    if (!tc->async_save || !(tc->out_dir || tc->ckpt_dir) || l->zero == 3 || (l->zero == 2 && mixed))
        return 0.0;
    double w = (double)l3d_dtype_size(tc->precision.param), k_opt = mixed ? 3.0 : 2.0;
    return 4.0 * c->mem.params / w + 2.0 * c->mem.optimizer / k_opt + 192.0 * l->v;
}

/* The fullest rank's bytes for layout c: the planner's total (wpe's rows beyond the sequence
 * included: run.context), plus what the planner leaves out and the trainer holds: on the lead
 * rank model.bin's copy, and what grows with the micro-batches (micro_extras). */
static void evaluate(const struct l3d_train_config *tc, struct cand *c, bool lead) {
    c->bytes = -1;
    if (!plan_memory(tc, c, &c->mem)) return;
    /* --out's model.bin and Hugging Face folder (src/train/out.c): rank 0 takes the model a unit
     * of rows at a time (at most a checkpoint staging piece, 64 MiB: the unit and the range it
     * receives), and the folder writer stages its largest tensor (the embedding or an MLP
     * matrix) in fp32 (the value check's copy of it is freed before) and, in 16 bits, its
     * narrowed copy */
    c->gather = 0.0;
    if (lead && tc->out_dir) {
        const struct l3d_model_spec *m = &tc->model;
        double big = (double)m->C * (double)(m->Vp > m->ffn ? m->Vp : m->ffn);
        double piece = (double)l3d_ckpt_stage_bytes();
        if (piece > 4.0 * big) piece = 4.0 * big;
        c->gather = 4.0 * big + (tc->save_dtype == L3D_F32 ? 0.0 : 2.0 * big) + 2.0 * piece;
    }
    /* a resume re-sliced from another layout, or --init-from a Hugging Face folder
     * (src/ckpt/reshard.c): three host strips of rows (the full rows, this rank's cut, the read
     * buffer), each at most a staging piece and at most one layer of the largest tensor; counted
     * for every resume (the layout of the checkpoint is read later) */
    double strips = 0.0;
    if (tc->resume || (tc->init_from && l3d_hf_is_folder(tc->init_from))) {
        const struct l3d_model_spec *m = &tc->model;
        double rows = m->Vp > 2.0 * m->ffn ? m->Vp : 2.0 * m->ffn;
        if (3.0 * m->C > rows) rows = 3.0 * m->C;
        double layer = 4.0 * m->C * rows, piece = (double)l3d_ckpt_stage_bytes();
        strips = 3.0 * (layer < piece ? layer : piece);
    }
    c->bytes = c->mem.total + c->gather + strips + async_staging(tc, c) +
               micro_extras(tc, c, &c->sched);
}

static int cmp_cand(const void *a, const void *b) {
    const struct cand *x = a, *y = b;
    if (x->cost != y->cost) return x->cost - y->cost;
    return (x->bytes > y->bytes) - (x->bytes < y->bytes);
}

/* The layouts the memory check suggests, collected from the planner's enumeration
 * (l3d_plan_layouts): those of the same ranks and global batch that change only tp, pp, ep (a
 * mixture of experts' split), ZeRO, recomputation and the micro-batch (halved), keeping v when pp stays, cp, SP where tp allows it
 * and the schedule; the least of them all and those that fit in room. */
struct suggest {
    const struct l3d_train_config *tc;
    const struct cand *now;
    double room;
    bool lead;
    struct cand list[512];
    int n;
    struct cand least;     /* bytes < 0: none valid */
};

static void suggest_one(void *ctx, const struct l3d_layout *lay) {
    struct suggest *s = ctx;
    const struct l3d_layout *now = &s->now->lay;
    if (lay->v != (lay->pp == now->pp ? now->v : 1)) return;
    if (lay->sp != (now->sp && lay->tp > 1)) return;
    if (s->n == (int)(sizeof s->list / sizeof s->list[0])) return;
    struct cand c = {.lay = *now};
    struct l3d_layout *l = &c.lay;
    l->tp = lay->tp, l->pp = lay->pp, l->dp = lay->dp, l->v = lay->v, l->zero = lay->zero;
    l->ep = lay->ep;
    l->recompute = lay->recompute, l->sp = lay->sp, l->micro_batch = lay->micro_batch;
    /* the same global batch: B accum dp sequences a step */
    l->accum = (int)((int64_t)now->micro_batch * now->accum * now->dp /
                     ((int64_t)l->micro_batch * l->dp));
    if (l->pp == 1) l->schedule = L3D_PP_1F1B;
    else if (l->v > 1 && now->schedule != L3D_PP_ZBV) /* zbv keeps its V (v 2, same pp) */
        l->schedule = L3D_PP_INTERLEAVED;
    else if (now->schedule == L3D_PP_INTERLEAVED) l->schedule = L3D_PP_1F1B;
    evaluate(s->tc, &c, s->lead);
    if (c.bytes < 0) return;
    int half = 0;
    while (now->micro_batch >> half > l->micro_batch) half++;
    c.cost = (l->zero != now->zero) +
             (l->recompute == L3D_RECOMPUTE_SELECTIVE ? 1 : l->recompute == L3D_RECOMPUTE_FULL ? 3 : 0) +
             2 * (l->tp != now->tp) + 2 * (l->pp != now->pp) + 2 * half +
             ((l->ep > 1 ? l->ep : 1) != (now->ep > 1 ? now->ep : 1));
    if (c.cost == 0) return;
    if (s->least.bytes < 0 || c.bytes < s->least.bytes) s->least = c;
    if (c.bytes <= s->room) s->list[s->n++] = c;
}

/* Up to three layouts of the same ranks (and global batch) that fit in `room`, as flags, into
 * out; "no layout ... fits" with the least when none does. */
static void alternatives(const struct l3d_train_config *tc, const struct cand *now, double room,
                         bool lead, char *out, size_t cap) {
    const struct l3d_layout *nl = &now->lay;
    struct suggest *s = l3d_alloc(sizeof *s, "memory check's suggestions");
    *s = (struct suggest){.tc = tc, .now = now, .room = room, .lead = lead,
                          .least = {.bytes = -1}};
    struct l3d_plan_fixed fx = l3d_plan_fixed_none();
    fx.layout = *nl;
    fx.layout.global_batch = (int64_t)nl->micro_batch * nl->accum * nl->dp; /* kept */
    fx.layout.threads = 1;
    fx.mask = L3D_FIX_CP;
    fx.mb_halvings = true;
    int world = nl->tp * nl->pp * nl->dp; /* over the ring: each ring rank the same place */
    l3d_plan_layouts(&(struct l3d_plan_space){.m = &tc->model, .ranks = (int64_t)world * nl->cp,
                                              .zero3 = true, .fx = &fx},
                     suggest_one, s);
    qsort(s->list, (size_t)s->n, sizeof s->list[0], cmp_cand);
    size_t k = 0;
    out[0] = '\0';
    if (s->n == 0) {
        const struct l3d_layout *l = &s->least.lay;
        char least_flags[160] = "";
        if (s->least.bytes >= 0) {
            char ep[24] = ""; /* a mixture of experts' split, when it has one */
            if (l->ep > 1) snprintf(ep, sizeof ep, " --ep %d", l->ep);
            snprintf(least_flags, sizeof least_flags,
                     "--tp %d --pp %d%s --zero %d --recompute %s --batch %d", l->tp, l->pp, ep,
                     l->zero, rc_name(l->recompute), l->micro_batch);
        }
        snprintf(out, cap, "no layout of %d rank(s) fits (the least, %s, with %s): use more nodes "
                 "or a smaller model", world, human(s->least.bytes).s, least_flags);
        l3d_free(s);
        return;
    }
    k += (size_t)snprintf(out + k, cap - k, "layouts of %d rank(s) that fit:", world);
    for (int i = 0; i < s->n && i < 3 && k < cap; i++) {
        const struct l3d_layout *c = &s->list[i].lay;
        char flags[160] = "";
        size_t f = 0;
#define ADD(...) f += (size_t)snprintf(flags + f, sizeof flags - f, __VA_ARGS__)
        if (c->tp != nl->tp) ADD(" --tp %d", c->tp);
        if (c->pp != nl->pp) ADD(" --pp %d", c->pp);
        if ((c->ep > 1 ? c->ep : 1) != (nl->ep > 1 ? nl->ep : 1)) ADD(" --ep %d", c->ep);
        if (c->zero != nl->zero) ADD(" --zero %d", c->zero);
        if (c->recompute != nl->recompute) ADD(" --recompute %s", rc_name(c->recompute));
        if (c->micro_batch != nl->micro_batch)
            ADD(" --batch %d --grad-accum %d", c->micro_batch, c->accum);
#undef ADD
        k += (size_t)snprintf(out + k, cap - k, "%s%s (%s)", i ? ";" : "", flags,
                              human(s->list[i].bytes).s);
    }
    l3d_free(s);
}

/* The most micro-batches a step (a multiple of --pp under interleaving, at most c's) with which
 * layout c fits in room; 0 when not even the fewest do. Bytes grow with them: a bisection. */
static int64_t most_micro(const struct l3d_train_config *tc, const struct cand *c, double room,
                          bool lead) {
    int64_t step = c->lay.v > 1 ? c->lay.pp : 1, lo = 0, hi = c->lay.accum / step;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        struct cand t = *c;
        t.lay.accum = (int)(mid * step);
        evaluate(tc, &t, lead);
        if (t.bytes >= 0 && t.bytes <= room)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo * step;
}

static double token_bytes(const struct l3d_train_config *tc, const struct cand *c) {
    return 2.0 * sizeof(int32_t) * c->lay.micro_batch * tc->layout.seq *
           (double)(c->lay.accum > tc->val_batches ? c->lay.accum : tc->val_batches);
}

/* The refusal when the layout fits with the fewest micro-batches (one) but not with its own
 * (now): it names the flag that set their number, its value, the bytes that grow with them and
 * the most that fit (k >= 1). */
static l3d_status too_many_micro(const struct l3d_train_config *tc, const struct cand *now,
                                 const struct cand *one, int64_t k, int rank, double room,
                                 const char *where) {
    double grow = now->bytes - one->bytes, tokens = token_bytes(tc, now) - token_bytes(tc, one);
    double sched = now->sched - one->sched, rest = grow - tokens - sched;
    char fix[160];
    if (tc->layout.global_batch > 0)
        snprintf(fix, sizeof fix, "--global-batch %lld (%lld micro-batches of --batch %d x %d "
                 "data-parallel replicas)", (long long)(k * now->lay.micro_batch * now->lay.dp),
                 (long long)k, now->lay.micro_batch, now->lay.dp);
    else
        snprintf(fix, sizeof fix, "--grad-accum %lld", (long long)k);
    return l3d_error(L3D_ERR_OOM,
                     "not enough memory for %s %lld: %d micro-batches a step need %s "
                     "on rank %d, of which %s grow with their number (token ids %s, pipeline "
                     "schedules %s, activations in flight and other %s), but it has %s (%s); "
                     "give at most %s, or --ignore-memory-check to try anyway",
                     tc->layout.global_batch > 0 ? "--global-batch" : "--grad-accum",
                     tc->layout.global_batch > 0 ? (long long)tc->layout.global_batch
                                                 : (long long)tc->layout.accum,
                     now->lay.accum, human(now->bytes).s, rank, human(grow).s, human(tokens).s,
                     human(sched).s, human(rest > 0 ? rest : 0).s, human(room).s, where, fix);
}

/* The refusal when the layout does not fit at all: the figures and the layouts that do. */
static l3d_status too_big(const struct l3d_train_config *tc, const struct cand *now, int rank,
                          double room, const char *where, bool lead) {
    char alt[1024];
    alternatives(tc, now, room, lead, alt, sizeof alt);
    const struct l3d_plan_mem *m = &now->mem;
    char extra[64] = "", ep[24] = "";
    if (now->gather > 0) snprintf(extra, sizeof extra, ", model.bin %s", human(now->gather).s);
    if (now->lay.ep > 1) snprintf(ep, sizeof ep, " (ep %d)", now->lay.ep);
    return l3d_error(L3D_ERR_OOM, "not enough memory: this layout (tp %d x pp %d x dp %d%s, "
                     "ZeRO-%d, recompute %s, batch %d) needs %s on rank %d (parameters %s, "
                     "gradients %s, AdamW %s, activations %s, other %s%s) but has %s (%s); %s; or "
                     "--ignore-memory-check to try anyway", now->lay.tp, now->lay.pp, now->lay.dp, ep,
                     now->lay.zero, rc_name(now->lay.recompute), now->lay.micro_batch,
                     human(now->bytes).s, rank, human(m->params).s,
                     human(m->grads).s, human(m->optimizer).s, human(m->activations).s,
                     human(m->other + now->bytes - m->total - now->gather).s, extra,
                     human(room).s, where, alt);
}

l3d_status l3d_train_memory_check(const struct l3d_train_config *tc, struct l3d_comm *world,
                                  double *figure, bool *report) {
    /* the ranks of this node: those the communicator puts on this one's (l3d_comm_nodes, the same
     * count as the placement of TP groups) */
    int W = world->size;
    int *node_of = l3d_alloc((size_t)W * sizeof *node_of, "node of each rank");
    l3d_comm_nodes(world, node_of);
    int local = 0;
    for (int i = 0; i < W; i++) local += node_of[i] == node_of[world->rank];
    l3d_free(node_of);

    char src[96];
    double node = node_available(src, sizeof src);
    l3d_status st = L3D_OK;
    bool lead = world->rank == 0;
    struct cand now = {.lay = tc->layout}; /* resolved: l3d_train_layout_init */
    *figure = -1;
    if (!tc->ignore_memory_check) {
        evaluate(tc, &now, lead);
        *figure = now.bytes;
    }
    if (node >= 0 && !tc->ignore_memory_check) {
        double room = node / local;
        if (now.bytes > room) {
            char where[192];
            snprintf(where, sizeof where, "%s %s shared by %d rank(s) of this node", src,
                     human(node).s, local);
            /* the fewest micro-batches fit: their number is what to change */
            struct cand one = now;
            one.lay.accum = now.lay.v > 1 ? now.lay.pp : 1;
            evaluate(tc, &one, lead);
            int64_t k = one.bytes >= 0 && one.bytes <= room ? most_micro(tc, &now, room, lead) : 0;
            if (k > 0)
                st = too_many_micro(tc, &now, &one, k, world->rank, room, where);
            else
                st = too_big(tc, &now, world->rank, room, where, lead);
        }
    }
    return l3d_comm_agree(world, st, report);
}
