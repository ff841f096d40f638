/* The training loop's checkpoint calls (src/train/resume.h). */
#include <errno.h>
#include <string.h>

#include "llm3d/file.h"
#include "train/resume.h"
#include "train/signals.h"
#include "train/train-impl.h"

void l3d_train_ckpt_init(struct l3d_train_ckpt *c, const struct l3d_train_config *tc,
                         const struct l3d_topo *topo, struct l3d_comm *world) {
    memset(c, 0, sizeof *c);
    /* the run spec's layout (resolved: l3d_spec_resolve) */
    c->lay = (struct l3d_ckpt_layout){.layout = tc->layout, .world = world->size,
                                      .tp_rank = topo->tp_rank, .pp_rank = topo->pp_rank,
                                      .dp_rank = topo->dp_rank * tc->layout.cp + topo->cp_rank};
    /* checkpoints ignore cp: the weights are replicated over the ring as over the replicas and
     * ZeRO shards over both, so a ring rank is a data-parallel rank of dp x cp (dpcp_comm's) */
    c->lay.layout.dp = tc->layout.dp * tc->layout.cp;
    c->lay.layout.cp = 1;
    if (tc->ckpt_dir)
        snprintf(c->root, sizeof c->root, "%s", tc->ckpt_dir);
    else if (tc->out_dir && snprintf(c->root, sizeof c->root, "%s/checkpoints", tc->out_dir) >=
                                (int)sizeof c->root)
        c->root[0] = '\0';
    c->last_saved = -1;
    c->quiet = tc->quiet;
    c->lead = world->rank == 0;
    l3d_train_signals_install();
}

void l3d_train_ckpt_free(struct l3d_train_ckpt *c) {
    l3d_ckpt_async_free(c->async);
    c->async = NULL;
    l3d_train_signals_restore();
}

l3d_status l3d_train_ckpt_async_init(struct l3d_train_ckpt *c, const struct l3d_train_config *tc,
                                     struct l3d_gpt *const *m, const struct l3d_adamw *opt,
                                     bool streamed) {
    if (!tc->async_save || !c->root[0]) return L3D_OK;
    if (streamed) { /* start-up lines: printed under --quiet too */
        if (c->lead)
            printf("checkpoints: synchronous (--async-save does not stage parameters that no "
                   "rank holds whole: ZeRO-3, or ZeRO-2 in mixed precision)\n");
        return L3D_OK;
    }
    size_t bytes = l3d_ckpt_async_bytes(&c->lay, m, opt);
    if (c->lead)
        printf("checkpoints: written in the background (--async-save) from %.1f MiB of host "
               "staging on rank 0 (its parameters and AdamW moments)\n", bytes / 1048576.0);
    return l3d_ckpt_async_init(&c->async, bytes);
}

/* The line of a checkpoint written: its size and time (a background one's written while
 * training went on; training stood still for its copies and for the wait, if any, for the save
 * before it: c->waited). */
static void saved_line(const struct l3d_train_ckpt *c, int64_t step, const struct l3d_ckpt_io *io,
                       double stall) {
    if (!c->lead || c->quiet) return;
    if (stall >= 0)
        printf("checkpoint %s/step_%08lld: %.1f MB written in the background in %.2f s "
               "(training stood still %.3f s, of which %.3f s waiting for the save before)\n",
               c->root, (long long)step, io->bytes_total / 1e6, io->seconds, stall + c->waited,
               c->waited);
    else
        printf("checkpoint %s/step_%08lld: %.1f MB in %.2f s (%.0f MB/s over all ranks)\n",
               c->root, (long long)step, io->bytes_total / 1e6, io->seconds,
               io->bytes_total / 1e6 / io->seconds);
    fflush(stdout);
}

l3d_status l3d_train_ckpt_poll(struct l3d_train_ckpt *c, struct l3d_comm *world, bool wait,
                               bool *report) {
    if (!l3d_ckpt_save_running(c->async)) return L3D_OK;
    bool closed;
    int64_t step;
    struct l3d_ckpt_io io;
    l3d_status st = l3d_ckpt_save_poll(c->async, world, wait, &closed, &step, &io, report);
    if (closed && st == L3D_OK) {
        c->last_saved = step;
        saved_line(c, step, &io, l3d_ckpt_async_stall(c->async));
    }
    return st;
}

/* What differs from the checkpoint's run and makes the continuation another trajectory: said
 * once, not an error (a longer --steps is the usual reason to resume). */
static void notes(const struct l3d_train_config *tc, const struct l3d_ckpt_state *s, int dp) {
    const struct l3d_lr_schedule *q = &s->sched;
    const struct l3d_adamw_hparams *a = &s->adamw, *b = &tc->adamw;
    if (s->seed != tc->seed)
        printf("note: --seed %llu, the checkpoint's run used %llu (another batch order)\n",
               (unsigned long long)tc->seed, (unsigned long long)s->seed);
    if ((int64_t)s->B * s->accum * s->layout.layout.dp !=
        (int64_t)tc->layout.micro_batch * tc->layout.accum * dp)
        printf("note: global batch %lld sequences, the checkpoint's run used %lld\n",
               (long long)tc->layout.micro_batch * tc->layout.accum * dp,
               (long long)s->B * s->accum * s->layout.layout.dp);
    if (q->max_lr != tc->lr || q->min_lr != tc->min_lr || q->warmup_steps != tc->warmup_steps ||
        q->total_steps != tc->steps)
        printf("note: learning-rate schedule (--lr %g --min-lr %g --warmup %d --steps %d) differs "
               "from the checkpoint's (%g %g %d %d)\n", tc->lr, tc->min_lr, tc->warmup_steps,
               tc->steps, q->max_lr, q->min_lr, q->warmup_steps, q->total_steps);
    if (a->beta1 != b->beta1 || a->beta2 != b->beta2 || a->eps != b->eps ||
        a->weight_decay != b->weight_decay || a->grad_clip != b->grad_clip)
        printf("note: AdamW hyper-parameters differ from the checkpoint's\n");
}

l3d_status l3d_train_ckpt_resume(struct l3d_train_ckpt *c, const struct l3d_train_config *tc,
                                 struct l3d_comm *world, struct l3d_gpt *const *m,
                                 struct l3d_adamw *opt, const struct l3d_ckpt_pieces *pieces,
                                 int n, struct l3d_loader *ld, int *start_step, bool *report) {
    L3D_ASSERT(n == c->lay.layout.v);
    *start_step = 0;
    if (!tc->resume) return L3D_OK;
    char dir[4096];
    l3d_status st = l3d_ckpt_resolve(tc->resume, c->root[0] ? c->root : NULL, dir, sizeof dir);
    if (st != L3D_OK) { /* copied first: l3d_error writes the buffer the message is in */
        char why[1024];
        snprintf(why, sizeof why, "%s", l3d_error_message());
        st = l3d_error(st, "--resume: %s", why);
    }
    if ((st = l3d_comm_agree(world, st, report)) != L3D_OK) return st;
    if (!dir[0]) {
        if (c->lead) printf("resume auto: no checkpoint in %s, starting fresh\n", c->root);
        return L3D_OK;
    }
    struct l3d_ckpt_state s;
    struct l3d_ckpt_io io;
    st = l3d_ckpt_load(dir, world, &c->lay, m, opt, pieces, &s, &io, report);
    if (st != L3D_OK) return st;
    if (s.T != tc->layout.seq)
        st = l3d_error(L3D_ERR_ARG,
                       "--seq-len %d, but %s was trained with %d: its data position "
                       "counts windows of %d tokens; resume with --seq-len %d",
                       tc->layout.seq, dir, s.T, s.T + 1, s.T);
    else if (s.step > tc->steps)
        st = l3d_error(L3D_ERR_ARG, "--steps %d, but %s is at step %lld already: give more steps",
                       tc->steps, dir, (long long)s.step);
    else
        st = l3d_loader_set_pos(ld, s.loader);
    if (st != L3D_OK) {
        *report = c->lead; /* every rank found the same */
        return st;
    }
    *start_step = (int)s.step;
    c->ls_scale = s.loss_scale;
    c->ls_good = s.ls_good;
    c->ls_hyst = s.ls_hyst;
    if (c->lead) { /* also with --quiet: a resume is worth a line */
        const struct l3d_ckpt_layout *l = &s.layout;
        bool same = l->layout.tp == c->lay.layout.tp && l->layout.pp == c->lay.layout.pp &&
                    l->layout.dp == c->lay.layout.dp && l->layout.zero == c->lay.layout.zero &&
                    l->layout.v == c->lay.layout.v;
        char chunks[48] = "";
        if (l->layout.v > 1)
            snprintf(chunks, sizeof chunks, " (%d chunks per rank)", l->layout.v);
        printf("resumed %s: step %lld, saved as tp %d x pp %d%s x dp %d ZeRO-%d%s; %.1f MB loaded "
               "in %.2f s (%.0f MB/s; rank 0 read %.1f MB)\n",
               dir, (long long)s.step, l->layout.tp, l->layout.pp, chunks, l->layout.dp,
               l->layout.zero, same ? "" : ", re-sliced", io.bytes_total / 1e6, io.seconds,
               io.bytes_total / 1e6 / io.seconds, io.bytes_rank / 1e6);
        notes(tc, &s, c->lay.layout.dp);
        fflush(stdout);
    }
    return L3D_OK;
}

l3d_status l3d_train_ckpt_open_metrics(const struct l3d_train_config *tc, int start_step,
                                       uint64_t run_id, FILE **out, char *path, size_t cap) {
    *out = NULL;
    path[0] = '\0';
    if (!tc->out_dir) return L3D_OK;
    if (snprintf(path, cap, "%s/metrics.jsonl", tc->out_dir) >= (int)cap)
        return l3d_error(L3D_ERR_ARG, "--out path too long: %s", tc->out_dir);
    /* appended a line at a time (each flushed and checked, report.c), not renamed into place: the
     * file is the run's own log (out/run guards it from other runs); a resumed run first keeps
     * its lines up to the checkpoint (rewritten atomically) */
    l3d_status st = start_step > 0 ? l3d_ckpt_trim_metrics(path, start_step) : L3D_OK;
    if (st == L3D_OK) st = l3d_open_log(path, "metrics file", start_step > 0, out);
    if (st == L3D_OK && start_step == 0) { /* the first record: the run */
        const struct l3d_model_spec *c = &tc->model;
        char line[416];
        /* the parameters, and those a token uses (the count model FLOPs and MFU are quoted on) */
        snprintf(line, sizeof line, "{\"run\":\"%016llx\",\"model\":{\"L\":%d,\"C\":%d,\"NH\":%d,"
                 "\"V\":%d,\"maxT\":%d,\"params\":%.0f,\"active_params\":%.0f,\"experts\":%d%s},"
                 "\"seq_len\":%d}\n", (unsigned long long)run_id, c->L, c->C, c->NH, c->V, c->maxT,
                 l3d_model_param_count(c), l3d_model_active_param_count(c), c->moe.experts,
                 c->moe.force_balance ? ",\"moe_routing\":\"forced\"" : "", tc->layout.seq);
        st = l3d_train_metrics_write(*out, path, line);
    }
    return st;
}

bool l3d_train_ckpt_due(const struct l3d_train_ckpt *c, const struct l3d_train_config *tc,
                        int step) {
    return c->root[0] && tc->save_every > 0 && (step % tc->save_every == 0 || step == tc->steps);
}

l3d_status l3d_train_ckpt_save(struct l3d_train_ckpt *c, const struct l3d_train_config *tc,
                               struct l3d_comm *world, struct l3d_gpt *const *m,
                               const struct l3d_adamw *opt, const struct l3d_ckpt_pieces *pieces,
                               int n, const struct l3d_loader *ld, int step, bool *report) {
    L3D_ASSERT(n == c->lay.layout.v);
    if (!c->root[0] || c->last_saved == step) return L3D_OK;
    if (l3d_ckpt_save_running(c->async) && c->begun == step) return L3D_OK; /* being written */
    struct l3d_ckpt_state s = {.step = step,
                               .loader = l3d_loader_get_pos(ld),
                               .seed = tc->seed,
                               .B = tc->layout.micro_batch,
                               .T = tc->layout.seq,
                               .accum = tc->layout.accum,
                               .adamw = opt->hp,
                               .adamw_t = opt->t,
                               .sched = {.max_lr = tc->lr,
                                         .min_lr = tc->min_lr,
                                         .warmup_steps = tc->warmup_steps,
                                         .total_steps = tc->steps},
                               .run_id = c->run_id,
                               .loss_scale = c->ls_scale,
                               .ls_good = c->ls_good,
                               .ls_hyst = c->ls_hyst};
    struct l3d_ckpt_io io;
    l3d_status st;
    if (c->async) { /* one save at a time: the one in flight first */
        if (l3d_ckpt_save_running(c->async) && c->lead) { /* said under --quiet too */
            printf("checkpoint of step %d: waiting for the one still being written\n", step);
            fflush(stdout);
        }
        double t0 = l3d_time_s();
        if ((st = l3d_train_ckpt_poll(c, world, true, report)) != L3D_OK) return st;
        c->waited = l3d_time_s() - t0;
        c->begun = step;
        return l3d_ckpt_save_begin(c->async, c->root, tc->keep, world, &c->lay, &s, m, opt,
                                   report);
    }
    st = l3d_ckpt_save(c->root, tc->keep, world, &c->lay, &s, m, opt, pieces, &io, report);
    if (st != L3D_OK) return st;
    c->last_saved = step;
    saved_line(c, step, &io, -1);
    return L3D_OK;
}
