/*
 * Double-precision reference kernels: the oracle the float backends are tested against, and the
 * pieces a whole-model double GPT-2 forward is composed from. Plain naive loops, no threads, no
 * cleverness: each function is the textbook formula, so it can be read against the paper.
 *
 *   ref_to_double(inp_d, inp, N * C);                       // same values as the float input
 *   ref_matmul_forward(out_d, inp_d, w_d, b_d, N, C, OC);   // out (N,OC) = inp w^T + b, in double
 *   ref_fd_grad(objective, ctx, w_d, OC * C, 1e-6, dw_d);   // d objective(ctx) / d w_d, numerically
 *
 * Every function has the argument order and the shapes of its float kernel in
 * include/llm3d/backend.h (outputs first, then inputs, then sizes), minus the backend context, with
 * double buffers; token and target ids stay int32_t. Outputs are overwritten (=). Only forward
 * passes are here: gradients are checked by finite differences of these, never by a second
 * hand-written backward that could share the float kernel's mistake.
 */
#ifndef L3D_TEST_REF_H
#define L3D_TEST_REF_H

#include <stdint.h>

/* Layernorm epsilon of GPT-2 (and llm.c): added to the biased variance before the square root. */
#define REF_LN_EPS 1e-5

/* out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (OC); bias may be NULL. */
void ref_matmul_forward(double *out, const double *inp, const double *weight, const double *bias,
                        int64_t N, int64_t C, int64_t OC);

/* out (B,T,C) = wte[tok - vocab_start] for tokens in [vocab_start, vocab_start+vocab_count), zero
 * for the others, plus wpe[t] when wpe is not NULL. tokens (B,T), wte (vocab_count,C),
 * wpe (>=T,C). */
void ref_encoder_forward(double *out, const int32_t *tokens, const double *wte, const double *wpe,
                         int64_t vocab_start, int64_t vocab_count, int64_t B, int64_t T, int64_t C);

/* out (N,C) = (inp - mean) * rstd * weight + bias, mean and the biased variance over C,
 * rstd = 1/sqrt(var + REF_LN_EPS). mean, rstd (N) are written when not NULL. */
void ref_layernorm_forward(double *out, double *mean, double *rstd, const double *inp,
                           const double *weight, const double *bias, int64_t N, int64_t C);

/* Causal self-attention, scale 1/sqrt(HS). qkv (B,T,3,NH,HS): queries, keys, values;
 * out (B,T,NH,HS); att (B,NH,T,T) the softmax probabilities, zero above the diagonal, written when
 * not NULL. */
void ref_attention_forward(double *out, double *att, const double *qkv, int64_t B, int64_t T,
                           int64_t NH, int64_t HS);
/* lse (B,NH,T): log sum_{t2 <= t} exp(q_t k_t2 / sqrt(HS)) of each causal row's scores, the
 * statistic the tiled kernel saves for its backward. */
void ref_attention_lse(double *lse, const double *qkv, int64_t B, int64_t T, int64_t NH,
                       int64_t HS);

/* Grouped-query attention's qkv (B,T,NH+2*NKV,HS) (query heads, then key heads, then value heads)
 * as the multi-head full (B,T,3,NH,HS) of ref_attention_forward: the key and value head
 * h / (NH / NKV) written out again for each query head h (the repeat the kernels never make). */
void ref_gqa_expand(double *full, const double *qkv, int64_t B, int64_t T, int64_t NH,
                    int64_t NKV, int64_t HS);

/* RMSNorm (Zhang & Sennrich 2019): out (N,C) = inp / sqrt(mean(inp^2) + eps) * weight; rstd (N)
 * = 1 / sqrt(mean(inp^2) + eps) written when not NULL. */
void ref_rmsnorm_forward(double *out, double *rstd, const double *inp, const double *weight,
                         int64_t N, int64_t C, double eps);

/* Rotary embedding, rotate-half form: out = qkv (B,T,NH+2*NKV,HS) with, in each of the first
 * NH+NKV heads of a row at t, x_i and x_{i+HS/2} turned by the angle pos[t] * inv_freq[i]
 * (x_i cos - x_j sin, x_j cos + x_i sin), i < HS/2; the value heads copied. */
void ref_rope_forward(double *out, const double *qkv, const double *inv_freq, const int32_t *pos,
                      int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS);

/* SwiGLU (Shazeer 2020): inp (N,2H) rows [g | u], out (N,H) = g / (1 + exp(-g)) * u. */
void ref_swiglu_forward(double *out, const double *inp, int64_t N, int64_t H);

/* out (N) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), the tanh approximation
 * (Hendrycks & Gimpel 2016, eq. after 2). */
void ref_gelu_forward(double *out, const double *inp, int64_t N);

/* out (N) = a + b. */
void ref_residual_forward(double *out, const double *a, const double *b, int64_t N);

/* Per-row softmax cross-entropy over one slice of the vocabulary. logits (N,Vl): columns
 * [0,Vvalid) are vocabulary entries vocab_start.., the rest padding, ignored whatever its values.
 * loss (N) = logsumexp(logits[0,Vvalid)) - tlogit, where tlogit is the logit of targets[i] when it
 * lies in [vocab_start, vocab_start+Vvalid), else 0: the slice's share of the vocabulary-parallel
 * loss, whose gradient is softmax - onehot. With vocab_start 0 and Vvalid the full vocabulary it
 * is the ordinary loss. */
void ref_xent_loss(double *loss, const double *logits, const int32_t *targets, int64_t vocab_start,
                   int64_t N, int64_t Vl, int64_t Vvalid);

/* One AdamW step (Loshchilov & Hutter 2019) on n elements, as the float kernel:
 * m = beta1 m + (1-beta1) g; v = beta2 v + (1-beta2) g^2;
 * param -= lr * ((m/bc1) / (sqrt(v/bc2) + eps) + wd * param), bc1 = 1 - beta1^t, bc2 = 1 - beta2^t.
 * The decay uses param before this step's update. */
void ref_adamw(double *param, double *m, double *v, const double *grad, int64_t n, double lr,
               double beta1, double beta2, double eps, double wd, double bc1, double bc2);

/* Conversions and seeded fills. */
void ref_to_double(double *dst, const float *src, int64_t n);
void ref_to_float(float *dst, const double *src, int64_t n);
/* x[i] = mean + std * l3d_rng_normal(seed, stream, i). */
void ref_fill_normal(float *x, int64_t n, float mean, float std, uint64_t seed, uint64_t stream);
/* n bf16 values (malloc'd), ref_fill_normal's (mean 0, std, stream 1) rounded to nearest even. */
uint16_t *ref_bf16_normal(int64_t n, float std, uint64_t seed);
/* x[i] uniform in [lo, hi), from l3d_rng_u64(seed, stream, i). */
void ref_fill_tokens(int32_t *x, int64_t n, int32_t lo, int32_t hi, uint64_t seed, uint64_t stream);

/* Sum over i of a[i] * b[i], in order. */
double ref_dot(const double *a, const double *b, int64_t n);

/* Central-difference derivative of the scalar f(ctx) with respect to x[i], x perturbed in place by
 * +-h and restored exactly: (f(x + h e_i) - f(x - h e_i)) / (2 h), h = eps * max(1, |x[i]|). */
double ref_fd_partial(double (*f)(void *ctx), void *ctx, double *x, int64_t i, double eps);
/* grad[i] = ref_fd_partial(f, ctx, x, i, eps) for every i in [0, n). */
void ref_fd_grad(double (*f)(void *ctx), void *ctx, double *x, int64_t n, double eps,
                 double *grad);

#endif
