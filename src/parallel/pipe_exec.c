/* The pipeline executor and its timeline (include/llm3d/pipeline.h). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "llm3d/comm.h"
#include "llm3d/dp.h"
#include "llm3d/pipeline.h"

l3d_status l3d_pp_exec_init(struct l3d_pp_exec *x, struct l3d_gpt **chunks, int v,
                            struct l3d_dp *dp, struct l3d_comm *pp_comm,
                            struct l3d_comm *embed_comm, int64_t trace_events) {
    memset(x, 0, sizeof *x);
    x->chunks = chunks;
    x->v = v;
    x->dp = dp;
    x->pp_comm = pp_comm;
    x->embed_comm = embed_comm;
    x->act_dtype = chunks[0]->dt; /* 16-bit activations between stages in mixed precision */
    x->grad_dtype = L3D_F32;
    const struct l3d_gpt *m0 = chunks[0];
    x->be = m0->be;
    for (int c = 0; c < v; c++)
        if (chunks[c]->act_slots > x->max_slots) x->max_slots = chunks[c]->act_slots;
    int64_t rows = (int64_t)m0->Bmax * m0->Tmax / m0->shard.sp_size;
    size_t bytes = (size_t)(rows * m0->cfg.C) * l3d_dtype_size(x->act_dtype);
    x->grad_buf = l3d_be_alloc(x->be, bytes, "pipeline gradient");
    if (!x->grad_buf) {
        memset(x, 0, sizeof *x);
        return l3d_error(L3D_ERR_OOM, "cannot allocate %.2f MiB for the pipeline's received "
                         "gradient (%lld rows of %d): lower --batch or --seq-len",
                         (double)bytes / 1048576.0, (long long)rows, m0->cfg.C);
    }
    l3d_be_memset(x->be, x->grad_buf, 0, bytes); /* first touch now, not inside the step loop */
    x->act_req = l3d_calloc((size_t)v * x->max_slots * sizeof(l3d_req), "pipeline requests");
    x->grad_req = l3d_calloc((size_t)v * x->max_slots * sizeof(l3d_req), "pipeline requests");
    if (trace_events > 0) {
        x->cap_ev = trace_events;
        x->ev = l3d_calloc((size_t)trace_events * sizeof(struct l3d_pp_event), "trace");
    }
    x->origin = l3d_time_s();
    if (pp_comm->size > 1)
        for (int c = 0; c < v; c++)
            if (dp) l3d_dp_defer_nonlayer(&dp[c]);
    return L3D_OK;
}

void l3d_pp_exec_free(struct l3d_pp_exec *x) {
    if (x->grad_buf) l3d_be_free(x->be, x->grad_buf);
    l3d_free(x->act_req);
    l3d_free(x->grad_req);
    l3d_free(x->ev);
    memset(x, 0, sizeof *x);
}

void l3d_pp_trace_add(struct l3d_pp_exec *x, int kind, int chunk, int micro, double t0, double t1) {
    if (!x->ev || x->nev >= x->cap_ev) return;
    x->ev[x->nev++] = (struct l3d_pp_event){.t0 = t0 - x->origin, .t1 = t1 - x->origin,
                                            .kind = (uint8_t)kind, .chunk = (int16_t)chunk,
                                            .micro = micro};
}

/* The sends from a slot's buffers (its output activation, its input gradient) have completed. */
static void wait_slot(struct l3d_pp_exec *x, int chunk, int slot) {
    l3d_comm_wait(x->pp_comm, &x->act_req[chunk * x->max_slots + slot]);
    l3d_comm_wait(x->pp_comm, &x->grad_req[chunk * x->max_slots + slot]);
}

/* Tags name the boundary between virtual stages b and b + 1: L3D_TAG_PIPE + 2b for the activation,
 * + 2b + 1 for its gradient; messages with the same tag arrive in the order sent (micro-batch
 * order). */
double l3d_pp_exec_run(struct l3d_pp_exec *x, const struct l3d_pp_action *acts, int n, int m,
                       const int32_t *inputs, const int32_t *targets, int B, int T, float dloss) {
    int pp = x->pp_comm->size, r = x->pp_comm->rank;
    int64_t BT = (int64_t)B * T;
    double loss = 0.0, start = l3d_time_s();
    x->busy_s = x->recv_s = 0.0;
    for (int i = 0; i < n; i++) {
        const struct l3d_pp_action *a = &acts[i];
        struct l3d_gpt *g = x->chunks[a->chunk];
        int slot = a->micro % g->act_slots, vs = l3d_pp_vstage(x->kind, pp, r, a->chunk);
        int64_t count = BT / g->shard.sp_size * g->cfg.C;
        l3d_req *areq = &x->act_req[a->chunk * x->max_slots + slot];
        l3d_req *greq = &x->grad_req[a->chunk * x->max_slots + slot];
        double t0 = l3d_time_s();
        static const char *const doing[] = {
            [L3D_PP_RECV_ACT] = "forward micro-batch", [L3D_PP_FWD] = "forward micro-batch",
            [L3D_PP_SEND_ACT] = "forward micro-batch", [L3D_PP_RECV_GRAD] = "backward micro-batch",
            [L3D_PP_BWD] = "backward micro-batch", [L3D_PP_SEND_GRAD] = "backward micro-batch",
            [L3D_PP_BWD_B] = "backward micro-batch", [L3D_PP_BWD_W] = "weight gradients of"};
        l3d_comm_doing(x->pp_comm, a->op <= L3D_PP_BWD_W ? doing[a->op] : NULL, a->micro,
                       a->chunk); /* what the watchdog names */
        switch (a->op) {
        case L3D_PP_RECV_ACT:
            l3d_gpt_use_slot(g, slot);
            wait_slot(x, a->chunk, slot);
            l3d_comm_recv(x->pp_comm, g->input_act, count, x->act_dtype, a->peer, L3D_TAG_PIPE + 2 * (vs - 1),
                          NULL);
            x->recv_s += l3d_time_s() - t0;
            l3d_pp_trace_add(x, L3D_EV_RECV_ACT, a->chunk, a->micro, t0, l3d_time_s());
            break;
        case L3D_PP_FWD: {
            l3d_gpt_use_slot(g, slot);
            wait_slot(x, a->chunk, slot);
            const int32_t *in = g->shard.has_embedding ? inputs + a->micro * BT : NULL;
            const int32_t *tg = g->shard.has_head ? targets + a->micro * BT : NULL;
            double l = l3d_gpt_forward(g, in, tg, B, T);
            if (g->shard.has_head) loss += l;
            double t1 = l3d_time_s();
            x->busy_s += t1 - t0;
            l3d_pp_trace_add(x, L3D_EV_FWD, a->chunk, a->micro, t0, t1);
            break;
        }
        case L3D_PP_SEND_ACT:
            l3d_comm_send(x->pp_comm, l3d_gpt_output_act(g), count, x->act_dtype, a->peer, L3D_TAG_PIPE + 2 * vs,
                          areq);
            break;
        case L3D_PP_RECV_GRAD:
            l3d_comm_recv(x->pp_comm, x->grad_buf, count, x->act_dtype, a->peer, L3D_TAG_PIPE + 2 * vs + 1, NULL);
            x->recv_s += l3d_time_s() - t0;
            l3d_pp_trace_add(x, L3D_EV_RECV_GRAD, a->chunk, a->micro, t0, l3d_time_s());
            break;
        case L3D_PP_BWD:
        case L3D_PP_BWD_B: {
            l3d_gpt_use_slot(g, slot);
            /* the data-parallel reduction follows the layers' gradients: W's when split (the
             * non-layer tensors' wait for l3d_pp_exec_finish_grads in a pipeline) */
            if (x->dp && a->op == L3D_PP_BWD)
                l3d_dp_begin_micro(&x->dp[a->chunk], a->micro == m - 1);
            if (a->op == L3D_PP_BWD)
                l3d_gpt_backward(g, dloss, g->shard.has_head ? NULL : x->grad_buf);
            else { /* B writes W's input over its output activation: the send has left */
                l3d_comm_wait(x->pp_comm, areq);
                l3d_gpt_backward_input(g, dloss, g->shard.has_head ? NULL : x->grad_buf,
                                       a->micro % g->wstash_slots);
            }
            double t1 = l3d_time_s();
            x->busy_s += t1 - t0;
            l3d_pp_trace_add(x, L3D_EV_BWD, a->chunk, a->micro, t0, t1);
            break;
        }
        case L3D_PP_BWD_W: {
            l3d_gpt_use_slot(g, slot);
            if (x->dp) l3d_dp_begin_micro(&x->dp[a->chunk], a->micro == m - 1);
            l3d_gpt_backward_weight(g, a->micro % g->wstash_slots);
            double t1 = l3d_time_s();
            x->busy_s += t1 - t0;
            l3d_pp_trace_add(x, L3D_EV_WGRAD, a->chunk, a->micro, t0, t1);
            break;
        }
        case L3D_PP_SEND_GRAD:
            l3d_comm_send(x->pp_comm, g->dinput_act, count, x->act_dtype, a->peer, L3D_TAG_PIPE + 2 * (vs - 1) + 1,
                          greq);
            break;
        default: L3D_ASSERT(!"unknown pipeline action");
        }
    }
    l3d_comm_doing(x->pp_comm, "completing the pipeline's sends", -1, -1);
    for (int k = 0; k < x->v * x->max_slots; k++) {
        l3d_comm_wait(x->pp_comm, &x->act_req[k]);
        l3d_comm_wait(x->pp_comm, &x->grad_req[k]);
    }
    x->span_s = l3d_time_s() - start;
    return loss;
}

/* zbv: the first and the last virtual stage on this rank (rank 0), the embedding's and the head's
 * gradient of the tied wte in two chunks: summed here, into both. */
static void tied_local(struct l3d_pp_exec *x) {
    struct l3d_gpt *e = NULL, *h = NULL;
    for (int c = 0; c < x->v; c++) {
        if (x->chunks[c]->shard.has_embedding) e = x->chunks[c];
        if (x->chunks[c]->shard.has_head) h = x->chunks[c];
    }
    if (!e || !h || e == h || e->cfg.untied) return;
    int64_t n = e->tensors[L3D_T_WTE].count;
    float *ge = l3d_gpt_grad_ptr(e, L3D_T_WTE, 0), *gh = l3d_gpt_grad_ptr(h, L3D_T_WTE, 0);
    L3D_ASSERT(n == h->tensors[L3D_T_WTE].count);
    l3d_be_add_inplace(x->be, L3D_F32, ge, gh, n);
    l3d_be_copy_d2d(x->be, gh, ge, (size_t)n * sizeof(float));
}

void l3d_pp_exec_finish_grads(struct l3d_pp_exec *x) {
    double t0 = l3d_time_s();
    l3d_comm_doing(x->pp_comm, "tied-embedding gradient sum", -1, -1);
    if (x->kind == L3D_PP_ZBV)
        tied_local(x);
    else if (x->embed_comm && x->embed_comm->size > 1)
        for (int c = 0; c < x->v; c++) {
            struct l3d_gpt *g = x->chunks[c];
            const struct l3d_tensor_info *t = &g->tensors[L3D_T_WTE];
            /* the first stage's embedding, the last stage's head: one sum (an untied head is
             * a tensor of its own: nothing shared) */
            if (t->count > 0 && !g->cfg.untied)
                l3d_comm_all_reduce(x->embed_comm, l3d_gpt_grad_ptr(g, L3D_T_WTE, 0), t->count,
                                    x->grad_dtype, L3D_SUM, NULL);
        }
    double t1 = l3d_time_s();
    if (x->embed_comm && x->embed_comm->size > 1)
        l3d_pp_trace_add(x, L3D_EV_EMBED_SYNC, 0, 0, t0, t1);
    if (!x->dp) return;
    l3d_comm_doing(x->pp_comm, "DP gradient reduction, end of the step", -1, -1);
    for (int c = 0; c < x->v; c++)
        if (x->dp[c].defer_nonlayer) l3d_dp_reduce_nonlayer(&x->dp[c]);
    for (int c = 0; c < x->v; c++) l3d_dp_finish(&x->dp[c]);
    l3d_pp_trace_add(x, L3D_EV_DP_WAIT, 0, 0, t1, l3d_time_s());
}
