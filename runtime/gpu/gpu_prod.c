/* The weight products of the GPU stages (gpu_int.h "products"): the GEMV launches for float32,
 * bf16 (fast) and int8 (cuda/cuk_q8.h) inputs, and the prefill GEMM path's hand-off
 * (gpu_linear.h). Which input a role takes is specs/numerics.md's "Fast mode" table. Compiled to
 * nothing unless G5_WITH_CUDA. */
#ifdef G5_WITH_CUDA

#include "cuda/cuk.h"
#include "cuda/cuk_model.h"
#include "cuda/cuk_q8.h"
#include "runtime/gpu/gpu_int.h"
#include "runtime/gpu/gpu_linear.h"

/* The product input of a fast-mode rank: x [n][ldx] rounded to bf16 in rk->xb [n][k]. */
const void *gm_act_in(const gl_rank *rk, const float *x, int64_t ldx, int64_t n, int64_t k, int64_t *ld,
                      uint32_t *type, int keep_f32, g5_status *st, g5_error *err) {
    *st = G5_OK;
    if (!rk->fast || keep_f32) {
        *ld = ldx;
        *type = CUK_ACT_F32;
        return x;
    }
    *st = cuk_convert(x, ldx, rk->xb, CUK_BF16, k, n, k, (cuk_stream)rk->st, err);
    *ld = k;
    *type = CUK_ACT_BF16;
    return rk->xb;
}

g5_status gm_gemv_k(const gl_rank *rk, const dmat *W, const float *x, int64_t ldx, uint32_t n, float *y,
                    int64_t ldy, int keep_f32, g5_error *err) {
    if (gl_lin_use(rk->lin, n)) { /* prefill: dequantize + cuBLAS GEMM (gpu_linear.h) */
        const gl_wmat wm = {W->type, W->w, W->k, W->m};
        return gl_lin_matmul(rk->lin, &wm, x, ldx, n, y, ldy, keep_f32, err);
    }
    g5_status st;
    int64_t ld;
    uint32_t xt;
    const void *xx = gm_act_in(rk, x, ldx, n, W->k, &ld, &xt, keep_f32, &st, err);
    if (st) return st;
    return gm_gemv_in(rk, W, xx, xt, ld, n, y, ldy, err);
}

/* The GEMV launches of gm_gemv_k for an input gm_act_in made: xx [n][ld] of type xt. Several products
 * of one input share one conversion this way (fast mode). */
g5_status gm_gemv_in(const gl_rank *rk, const dmat *W, const void *xin, uint32_t xt, int64_t ld, uint32_t n,
                     float *y, int64_t ldy, g5_error *err) {
    const uint8_t *xx = xin;
    const int64_t es = xt == CUK_ACT_BF16 ? 2 : 4;
    /* A batched decode step must give each row the bits of a one-row launch: the split-K choice
     * of the CUDA-core kernels ignores the width, but the tensor-core kernels take only up to 4
     * rows (and fewer for a wide k), so where they run one row they get launches they take. */
    uint32_t cw = CUK_GEMV_MAX_N;
    if (rk->batch_rows && cuk_gemv_takes_tc(W->type, W->m, W->k, 1))
        for (cw = 4; cw > 1 && !cuk_gemv_takes_tc(W->type, W->m, W->k, (int32_t)cw);) cw /= 2;
    for (uint32_t t0 = 0; t0 < n; t0 += cw) {
        const uint32_t c = n - t0 < cw ? n - t0 : cw;
        cuk_gemv_args a = {W->type, W->w, W->k, W->m, xx + (int64_t)t0 * ld * es, xt, ld, (int32_t)c,
                           y + (int64_t)t0 * ldy, ldy};
        CK(cuk_gemv(&a, (cuk_stream)rk->st, err));
    }
    return G5_OK;
}

g5_status gm_gemv(const gl_rank *rk, const dmat *W, const float *x, int64_t ldx, uint32_t n, float *y,
                  int64_t ldy, g5_error *err) {
    return gm_gemv_k(rk, W, x, ldx, n, y, ldy, 0, err);
}

/* 1: a fast-mode product of W over n rows takes int8 inputs (GEMV path, a type with a kernel). */
int gm_q8_takes(const gl_rank *rk, const dmat *W, uint32_t n) {
    return rk->q8 && !gl_lin_use(rk->lin, n) && cuk_q8_takes(W->type, W->k);
}

/* Where n rows of k in `planes` planes of int8 inputs are written (gm_q8_buf's layout): *q, *ds
 * and their description *b; refused unless they fit the whole buffer, or its half while side
 * work may run (the main chain's and the side's inputs must not meet). */
static g5_status q8_dst(const gl_rank *rk, int64_t n, int64_t k, int planes, int8_t **q, float **ds, cuk_q8_act *b,
                        g5_error *err) {
    if (rk->aux == 1) /* gm_aux_begin: the third stream has no half of its own */
        return g5_fail(err, G5_ERR_INTERNAL, "int8 inputs of %lld x %lld quantized on the third stream", (long long)n,
                       (long long)k);
    const uint64_t need = (uint64_t)n * (uint64_t)k * (uint64_t)planes, room = rk->side ? rk->q8n : 2 * rk->q8n;
    if (need > room)
        return g5_fail(err, G5_ERR_INTERNAL, "int8 inputs of %lld rows x %lld x %d planes: room for %llu elements",
                       (long long)n, (long long)k, planes, (unsigned long long)room);
    *q = rk->q8q + gm_q8_off(rk);
    *ds = rk->q8d + gm_q8_off(rk) / 16;
    *b = gm_q8_buf(rk, k, planes);
    return G5_OK;
}

/* x [n][ldx] quantized into rk->q8q/q8d as rows of k in `planes` planes (cuda/cuk_q8.h); *o
 * describes them. */
g5_status gm_q8_in(const gl_rank *rk, const float *x, int64_t ldx, int64_t n, int64_t k, int planes,
                   cuk_q8_act *o, g5_error *err) {
    int8_t *q = NULL;
    float *ds = NULL;
    cuk_q8_act b = {0};
    CK(q8_dst(rk, n, k, planes, &q, &ds, &b, err));
    const cuk_q8_quantize_args qa = {x, ldx, k, n, q, b.ldq, ds, b.ldds, planes};
    CK(cuk_q8_quantize(&qa, (cuk_stream)rk->st, err));
    *o = b;
    return G5_OK;
}

g5_status gm_norm_q8(const gl_rank *rk, const cuk_add_rms_norm_args *na, int planes, cuk_q8_act *o, g5_error *err) {
    const cuk_stream cs = (cuk_stream)rk->st;
    *o = (cuk_q8_act){0};
    if (planes && cuk_norm_q8_fits(na->dim)) {
        int8_t *q = NULL;
        float *ds = NULL;
        cuk_q8_act b = {0};
        CK(q8_dst(rk, na->n_rows, na->dim, planes, &q, &ds, &b, err));
        const cuk_norm_q8_args a = {*na, q, b.ldq, ds, b.ldds, planes};
        CK(cuk_norm_q8(&a, cs, err));
        *o = b;
        return G5_OK;
    }
    CK(na->a ? cuk_add_rms_norm(na, cs, err)
             : cuk_rms_norm(na->x, na->ldx, na->w, na->y, na->ldy, na->n_rows, na->dim, na->eps, cs, err));
    return planes ? gm_q8_in(rk, na->y, na->ldy, na->n_rows, na->dim, planes, o, err) : G5_OK;
}

/* y[t] = W x'[t] for the int8 rows x (of W->k), in launches of CUK_Q8_MAX_N rows. */
/* The int8 tensor-core kernel (cuk_gemv_q8t reads and decodes the weights once for up to 32
 * vectors; dp4a once per 8 and does the integer work per vector) from 8 vectors, and from 4 on
 * matrices of at most 2^26 elements. Its rows have the bits of the dp4a kernel's one-row launch
 * (cuda/cuk_q8.h), so a batched step's outputs stay those of its single-sequence steps. Measured
 * (bench_q8, H200, bench/RESULTS.md session 11): at n = 4 q8t wins on the attention shapes (6144 x
 * 8192 Q5_K 26.6 against 31.8 us, 16384 x 2048 19.2 against 23.1) and loses on 19360 x 6144 (Q4_K
 * 59.3 against 53.9, Q8_0 101 against 64), at n = 8 it wins on every shape, at n = 2 on none. */
static int q8t_for(const dmat *W, uint32_t n) {
    if (!cuk_q8t_takes(W->type, W->k)) return 0;
    return n >= 8 || (n >= 4 && (uint64_t)W->m * (uint64_t)W->k <= (1ull << 26));
}

/* gm_gemv_q8_in, and with W2 (the dp4a kernel only) W2's rows into y2 in the same launches. */
static g5_status gemv_q8_in2(const gl_rank *rk, const dmat *W, const dmat *W2, const cuk_q8_act *x, uint32_t n,
                             float *y, float *y2, int64_t ldy, g5_error *err) {
    const int tc = !W2 && q8t_for(W, n);
    const uint32_t per = tc ? CUK_Q8T_MAX_N : CUK_Q8_MAX_N;
    for (uint32_t t0 = 0; t0 < n; t0 += per) {
        const uint32_t c = n - t0 < per ? n - t0 : per;
        const cuk_gemv_q8_args a = {W->type, W->w, W->k, W->m, gm_q8_rows(x, t0), (int32_t)c, y + (int64_t)t0 * ldy, ldy,
                                    W2 ? W2->w : NULL, W2 ? y2 + (int64_t)t0 * ldy : NULL};
        const cuk_stream cs = (cuk_stream)rk->st;
        CK(tc ? cuk_gemv_q8t(&a, rk->q8x, rk->q8x_bytes, cs, err) : cuk_gemv_q8(&a, cs, err));
    }
    return G5_OK;
}

g5_status gm_gemv_q8_in(const gl_rank *rk, const dmat *W, const cuk_q8_act *x, uint32_t n, float *y,
                        int64_t ldy, g5_error *err) {
    return gemv_q8_in2(rk, W, NULL, x, n, y, NULL, ldy, err);
}

g5_status gm_gemv_q8_pair_in(const gl_rank *rk, const dmat *W1, const dmat *W2, const cuk_q8_act *x, uint32_t n,
                             float *y1, float *y2, int64_t ldy, g5_error *err) {
    if (!q8t_for(W1, n) && W1->type == W2->type && W1->k == W2->k && W1->m == W2->m)
        return gemv_q8_in2(rk, W1, W2, x, n, y1, y2, ldy, err);
    CK(gm_gemv_q8_in(rk, W1, x, n, y1, ldy, err));
    return gm_gemv_q8_in(rk, W2, x, n, y2, ldy, err);
}

/* One vector of a short row (k <= XF_MAX_K: q_b and the indexer's q_b, k = q_lora; a TP 8 rank's
 * attn_output, k = 2048) from float32 x: the GEMV quantizes (with a norm, normalizes) x per CTA
 * (cuk_gemv_q8_xf, the bits of the launches it saves). Longer rows keep the separate launch, since
 * every CTA works through the whole row (attn_output at TP 1: 16384 elements in each of 384 CTAs). */
#define XF_MAX_K 4096
int gm_xf_takes(const gl_rank *rk, const dmat *W, uint32_t n, int planes) {
    return n == 1 && W->k <= XF_MAX_K && gm_q8_takes(rk, W, n) && !q8t_for(W, n) &&
           cuk_gemv_q8_xf_takes(W->type, W->k, 1, planes);
}

g5_status gm_gemv_xf(const gl_rank *rk, const dmat *W, const cuk_q8_xf *x, int planes, float *y, int64_t ldy,
                     g5_error *err) {
    const cuk_gemv_q8_args a = {W->type, W->w, W->k, W->m, {NULL, 0, NULL, 0, planes}, 1, y, ldy, NULL, NULL};
    return cuk_gemv_q8_xf(&a, x, (cuk_stream)rk->st, err);
}

static g5_status gemv_q8p(const gl_rank *rk, const dmat *W, const float *x, int64_t ldx, uint32_t n, float *y,
                          int64_t ldy, int planes, g5_error *err) {
    if (!gm_q8_takes(rk, W, n)) return gm_gemv_k(rk, W, x, ldx, n, y, ldy, 0, err);
    if (gm_xf_takes(rk, W, n, planes) && (uintptr_t)x % 16 == 0 && ldx % 4 == 0) {
        const cuk_q8_xf xf = {x, ldx, NULL, 0.0f};
        return gm_gemv_xf(rk, W, &xf, planes, y, ldy, err);
    }
    cuk_q8_act q = {0};
    CK(gm_q8_in(rk, x, ldx, n, W->k, planes, &q, err));
    return gm_gemv_q8_in(rk, W, &q, n, y, ldy, err);
}

g5_status gm_silu_gemv(const gl_rank *rk, const dmat *W, int64_t F, uint32_t n, int planes, float *y, int64_t ldy,
                       g5_error *err) {
    const cuk_stream cs = (cuk_stream)rk->st;
    const int q8 = planes == 2 ? gm_q8x2_takes(rk, W, n) && !gm_h16_takes(rk, W, n) : gm_q8_takes(rk, W, n);
    /* else gm_gemv_q8x2 (fp16 inputs where the weights have their kernel); F % 64: gm_q8_buf's scale
     * rows (F / 16 a plane) keep 16-byte alignment */
    if (!q8 || F % 64) {
        CK(cuk_silu_mul(rk->ga, F, rk->gb, F, rk->ga, F, n, F, cs, err));
        return planes == 2 ? gm_gemv_q8x2(rk, W, rk->ga, F, n, y, ldy, err) : gm_gemv_q8(rk, W, rk->ga, F, n, y, ldy, err);
    }
    int8_t *qd = NULL;
    float *ds = NULL;
    cuk_q8_act q = {0};
    CK(q8_dst(rk, n, F, planes, &qd, &ds, &q, err));
    const cuk_silu_mul_q8_args a = {rk->ga, F, rk->gb, F, rk->ga, F, n, F, qd, q.ldq, ds, q.ldds, planes};
    CK(cuk_silu_mul_q8(&a, cs, err));
    return gm_gemv_q8_in(rk, W, &q, n, y, ldy, err);
}

g5_status gm_gemv_q8(const gl_rank *rk, const dmat *W, const float *x, int64_t ldx, uint32_t n, float *y,
                     int64_t ldy, g5_error *err) {
    return gemv_q8p(rk, W, x, ldx, n, y, ldy, 1, err);
}

int gm_h16_takes(const gl_rank *rk, const dmat *W, uint32_t n) {
    return rk->h16n && gm_q8x2_takes(rk, W, n) && cuk_h16_takes(W->type, W->k);
}

/* rk->h16x may take n fp16 rows of k: main chain only (it has no half for side work), room for them */
static g5_status h16_room(const gl_rank *rk, int64_t n, int64_t k, g5_error *err) {
    if (rk->side == 1 || rk->aux == 1)
        return g5_fail(err, G5_ERR_INTERNAL, "fp16 inputs of %lld x %lld made off the main chain", (long long)n,
                       (long long)k);
    if ((uint64_t)n * (uint64_t)k > rk->h16n)
        return g5_fail(err, G5_ERR_INTERNAL, "fp16 inputs of %lld rows x %lld: room for %llu elements", (long long)n,
                       (long long)k, (unsigned long long)rk->h16n);
    return G5_OK;
}

g5_status gm_h16_in(const gl_rank *rk, const float *x, int64_t ldx, int64_t n, int64_t k, cuk_h16_act *o,
                    g5_error *err) {
    CK(h16_room(rk, n, k, err));
    const cuk_h16_prep_args pa = {x, ldx, k, n, rk->h16x, k, rk->h16u};
    CK(cuk_h16_prep(&pa, (cuk_stream)rk->st, err));
    *o = (cuk_h16_act){rk->h16x, k, rk->h16u};
    return G5_OK;
}

g5_status gm_norm_h16(const gl_rank *rk, const cuk_add_rms_norm_args *na, cuk_h16_act *o, g5_error *err) {
    const cuk_stream cs = (cuk_stream)rk->st;
    if (!cuk_norm_q8_fits(na->dim)) {
        CK(na->a ? cuk_add_rms_norm(na, cs, err)
                 : cuk_rms_norm(na->x, na->ldx, na->w, na->y, na->ldy, na->n_rows, na->dim, na->eps, cs, err));
        return gm_h16_in(rk, na->y, na->ldy, na->n_rows, na->dim, o, err);
    }
    CK(h16_room(rk, na->n_rows, na->dim, err));
    const cuk_norm_h16_args a = {*na, rk->h16x, na->dim, rk->h16u};
    CK(cuk_norm_h16(&a, cs, err));
    *o = (cuk_h16_act){rk->h16x, na->dim, rk->h16u};
    return G5_OK;
}

g5_status gm_gemv_h16_in(const gl_rank *rk, const dmat *W, const cuk_h16_act *x, uint32_t n, float *y, int64_t ldy,
                         g5_error *err) {
    const cuk_gemv_h16_args a = {W->type, W->w, W->k, W->m, *x, n, y, ldy};
    return cuk_gemv_h16(&a, (cuk_stream)rk->st, err);
}

/* 1: a product of the attention projections or the dense FFN takes two int8 planes (about 16 bits
 * of x; specs/numerics.md: one plane breaks the fast bar there). RT_GPU_BF16ACT keeps its bf16
 * inputs. */
int gm_q8x2_takes(const gl_rank *rk, const dmat *W, uint32_t n) { return !rk->fast && gm_q8_takes(rk, W, n); }

g5_status gm_gemv_q8x2(const gl_rank *rk, const dmat *W, const float *x, int64_t ldx, uint32_t n, float *y,
                       int64_t ldy, g5_error *err) {
    if (gm_h16_takes(rk, W, n)) {
        cuk_h16_act h = {0};
        CK(gm_h16_in(rk, x, ldx, n, W->k, &h, err));
        return gm_gemv_h16_in(rk, W, &h, n, y, ldy, err);
    }
    if (!gm_q8x2_takes(rk, W, n)) return gm_gemv_k(rk, W, x, ldx, n, y, ldy, 0, err);
    return gemv_q8p(rk, W, x, ldx, n, y, ldy, 2, err);
}

#endif /* G5_WITH_CUDA */
