/* A batched float32 GEMV with one matrix per head, in one launch (the MLA W_UV product:
 * each head's latent attention output times that head's W_UV rows of kv_b).
 *
 * For t < n, h < n_head, r < m:
 *   y[t * ldy + h * ldyh + r] = sum over c < k of w[h * ld_head + r * ldw + c] * x[t][h][c],
 * with x[t][h][c] = x[t * ldx + h * ldxh + c] (float32, or bf16 read exactly as float32).
 * The sum of one output is formed in a fixed order that depends on k alone, never on n or on
 * the other rows: a row's bits are the same whether it is computed alone or in a batch (the
 * server's batched decode relies on that). Pure float32 (fmaf), no tensor cores. */
#ifndef G5_CUDA_CUK_HEAD_GEMV_H
#define G5_CUDA_CUK_HEAD_GEMV_H

#include <stdint.h>

#include "cuda/cuk.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cuk_head_gemv_args {
    const float *w;        /* head h, row r: w + h * ld_head + r * ldw, k floats */
    int64_t ld_head, ldw;
    int32_t n_head, m, k;
    const void *x;         /* [n][ldx] of x_type; head h's input at column h * ldxh */
    uint32_t x_type;       /* CUK_ACT_F32 or CUK_ACT_BF16 */
    int64_t ldx, ldxh;
    int32_t n;
    float *y;              /* [n][ldy]; head h's outputs at column h * ldyh */
    int64_t ldy, ldyh;
    const int8_t *wq;      /* optional: the weights in an exact int8 form, read instead of w (which
                              may then be NULL): w[h][r][c] = wq[h * ld_head + r * ldw + c] times
                              ws[h * ws_ld_head + r * ws_ldw + c / 16], one __fmul_rn (kv_b's form,
                              cuk_kvb_exact in cuda/cuk_model.h): the same values, so the same bits */
    const float *ws;
    int64_t ws_ld_head, ws_ldw;
} cuk_head_gemv_args;

/* 1 if cuk_head_gemv takes these arguments: k a multiple of 4 and at most 1024, float4-aligned
 * weight rows (with wq: k a multiple of 16, 4-byte aligned int8 rows, float-aligned scales), 16-byte
 * (f32) or 8-byte (bf16) aligned input pieces, positive sizes. */
int cuk_head_gemv_fits(const cuk_head_gemv_args *a);

/* The product above on `stream`; G5_ERR_INVALID_ARG where cuk_head_gemv_fits says 0. */
g5_status cuk_head_gemv(const cuk_head_gemv_args *a, cuk_stream stream, g5_error *err);

#ifdef __cplusplus
}
#endif

#endif
