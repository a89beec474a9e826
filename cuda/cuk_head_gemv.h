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
} cuk_head_gemv_args;

/* The same product with the heads' matrices in their compact stored type (the MLA decode path's
 * W_UK^T from attn_k_b and W_UV from attn_v_b, specs/sharding.md "kv_b"): row r of head h is row
 * h * m + r of w, rows of k elements of w_type, contiguous (row_bytes = k / block x block bytes).
 * Weights decoded exactly as the CPU dequantizes them (cuda/deq_sub.h deq_row32). The sum of one
 * output: for each 32-element piece j of the row in order, an fmaf chain over its 32 products
 * (from 0, ascending), and the pieces' results added from 0 in ascending j. It depends on k and
 * the type only, never on n: a row's bits are the same alone or in a batch. No tensor cores. */
typedef struct cuk_head_gemv_q_args {
    uint32_t w_type;
    const void *w;         /* [n_head * m] rows of k elements of w_type */
    int32_t n_head, m, k;
    const void *x;         /* [n][ldx] of x_type; head h's input at column h * ldxh */
    uint32_t x_type;       /* CUK_ACT_F32 or CUK_ACT_BF16 */
    int64_t ldx, ldxh;
    int32_t n;
    float *y;              /* [n][ldy]; head h's outputs at column h * ldyh */
    int64_t ldy, ldyh;
} cuk_head_gemv_q_args;

/* 1 if cuk_head_gemv_q decodes rows of k elements of this type: F32, F16, BF16 and every
 * quantized weight type whose blocks hold a multiple of 32 elements, k a multiple of the block
 * (and of 32) and at most CUK_HEAD_GEMV_Q_MAX_K. */
#define CUK_HEAD_GEMV_Q_MAX_K 8192
int cuk_head_gemv_q_takes(uint32_t w_type, int64_t k);

/* 1 if cuk_head_gemv_q takes these arguments: the type and k as above, 16-byte aligned input
 * pieces (x, ldx and ldxh multiples of 4 floats or 8 bf16), positive sizes. */
int cuk_head_gemv_q_fits(const cuk_head_gemv_q_args *a);

/* The product above on `stream`; G5_ERR_INVALID_ARG where cuk_head_gemv_q_fits says 0. */
g5_status cuk_head_gemv_q(const cuk_head_gemv_q_args *a, cuk_stream stream, g5_error *err);

/* 1 if cuk_head_gemv takes these arguments: k a multiple of 4 and at most 1024, float4-aligned
 * weight rows, 16-byte (f32) or 8-byte (bf16) aligned input pieces, positive sizes. */
int cuk_head_gemv_fits(const cuk_head_gemv_args *a);

/* The product above on `stream`; G5_ERR_INVALID_ARG where cuk_head_gemv_fits says 0. */
g5_status cuk_head_gemv(const cuk_head_gemv_args *a, cuk_stream stream, g5_error *err);

#ifdef __cplusplus
}
#endif

#endif
