/* Dense GEMM through cuBLAS and the MoE grouping kernels of the prefill GEMM path
 * (runtime/gpu/gpu_linear.c uses them; specs/numerics.md "Prefill GEMM" has the numerics).
 *
 * Same conventions as cuk.h: C-linkage launchers that validate every shape on the host
 * (G5_ERR_INVALID_ARG naming the argument), enqueue on `stream`, never synchronize, never
 * allocate, and report a CUDA or cuBLAS error as G5_ERR_INTERNAL naming the call. The weights of
 * a GEMM are plain float32 or bf16 matrices: quantized weights are dequantized by the caller
 * (cuk_dequant_rows, cuk_convert) into a scratch tile first. */
#ifndef G5_CUK_GEMM_H
#define G5_CUK_GEMM_H

#include <stdint.h>

#include "cuda/cuk.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A cuBLAS handle, bound to the device that was current at creation. */
typedef struct cuk_blas cuk_blas;

g5_status cuk_blas_create(cuk_blas **out, g5_error *err);
void cuk_blas_free(cuk_blas *b); /* accepts NULL; the device it was made on must be current */

/* Compute variants of cuk_gemm.
 *   CUK_GEMM_F32   float32 w and x, CUBLAS_COMPUTE_32F_PEDANTIC with the pedantic math mode:
 *                  float32 products and sums, no TF32, no reduced-precision split-K.
 *   CUK_GEMM_TF32  float32 w and x, CUBLAS_COMPUTE_32F_FAST_TF32: tensor cores round both
 *                  inputs to TF32 (10-bit mantissa), float32 accumulation.
 *   CUK_GEMM_BF16  bf16 w and x, float32 accumulation (CUBLAS_COMPUTE_32F).
 *   CUK_GEMM_F16   fp16 w and x, float32 accumulation (CUBLAS_COMPUTE_32F). */
enum { CUK_GEMM_F32 = 0, CUK_GEMM_TF32 = 1, CUK_GEMM_BF16 = 2, CUK_GEMM_F16 = 3 };

/* y[t][i] = sum_j W[i][j] * x[t][j] for t < n, i < m, j < k (y overwritten). */
typedef struct cuk_gemm_args {
    uint32_t mode;       /* CUK_GEMM_* */
    const void *w;       /* [m][ldw]: float32 (F32, TF32), bf16 (BF16) or fp16 (F16) */
    int64_t ldw;         /* >= k */
    const void *x;       /* [n][ldx], the same element type as w */
    int64_t ldx;         /* >= k */
    int64_t k, m, n;     /* each 1 .. INT32_MAX */
    float *y;            /* [n][ldy] */
    int64_t ldy;         /* >= m */
} cuk_gemm_args;

/* One cublasGemmEx on `stream` (the handle is set to it). Deterministic: the same shapes on the
 * same device and cuBLAS version give the same bits. */
g5_status cuk_gemm(cuk_blas *b, const cuk_gemm_args *a, cuk_stream stream, g5_error *err);

/* The general form, column-major as cuBLAS: for b < batch,
 *   C_b (m x n) = op(A_b) op(B_b) + beta C_b,  X_b = X + b * stride_x (elements),
 * op(A) m x k (A k x m when trans_a), op(B) k x n (B n x k when trans_b); A and B both float32
 * (F32, TF32) or both bf16 (BF16), C float32. One cublasGemmStridedBatchedEx (batch 1 included). */
typedef struct cuk_gemm_ex_args {
    uint32_t mode;               /* CUK_GEMM_* */
    int trans_a, trans_b;
    int64_t m, n, k;             /* each 1 .. INT32_MAX */
    const void *a;
    int64_t lda, stride_a;
    const void *b;
    int64_t ldb, stride_b;
    float beta;
    float *c;
    int64_t ldc, stride_c;
    int32_t batch;               /* >= 1 */
} cuk_gemm_ex_args;

g5_status cuk_gemm_ex(cuk_blas *b, const cuk_gemm_ex_args *a, cuk_stream stream, g5_error *err);

/* ---- MoE grouping ---- */

/* Token lists per expert. For local expert e < n_local (global id exp0 + e):
 *   rows[e * ld_rows + j] = t and rw[e * ld_rows + j] = sum of wts[t][s] over the slots s with
 *   ids[t][s] == exp0 + e, for the tokens t that chose it, ascending (j < cnt[e]);
 *   cnt[n_local] = how many ids lie outside [0, n_expert) (the router never makes one: the caller
 *   reports a nonzero count as an error).
 * ids, wts: [n_tok][ld] (global expert ids as cuk_moe_route writes them, top_k per token);
 * rows, rw: [n_local][ld_rows], ld_rows >= n_tok; cnt: [n_local + 1]. Deterministic (no atomics). */
typedef struct cuk_moe_group_args {
    const int32_t *ids;
    const float *wts;
    int32_t n_tok, top_k;
    int64_t ld;          /* >= top_k */
    int32_t n_expert;    /* all experts of the model */
    int32_t exp0, n_local; /* this rank's experts: exp0 .. exp0 + n_local - 1 */
    int32_t *rows;
    float *rw;
    int64_t ld_rows;
    int32_t *cnt;
} cuk_moe_group_args;

g5_status cuk_moe_group(const cuk_moe_group_args *a, cuk_stream stream, g5_error *err);

/* out[i][0..k) = x[rows[i]][0..k) for i < n; a row id outside [0, n_rows_x) gives a NaN row.
 * x: [n_rows_x][ldx], out: [n][ldo], rows: [n] device. */
g5_status cuk_gather_rows(const float *x, int64_t ldx, int64_t n_rows_x, const int32_t *rows, int64_t n,
                          int64_t k, float *out, int64_t ldo, cuk_stream stream, g5_error *err);

/* y[rows[i]][c] = y[rows[i]][c] + rw[i] * d[i][c] for i < n, c < m (product and sum rounded
 * separately, no fused multiply-add). The rows must be distinct within one call (each element
 * of y is written by one thread); a row id outside [0, n_rows_y) is skipped. Calls on one stream
 * add in call order, which is what fixes each token's summation order.
 * d: [n][ldd], rows/rw: [n] device, y: [n_rows_y][ldy]. */
g5_status cuk_scatter_add_rows(const float *d, int64_t ldd, const int32_t *rows, const float *rw, int64_t n,
                               int64_t m, float *y, int64_t ldy, int64_t n_rows_y, cuk_stream stream,
                               g5_error *err);

#ifdef __cplusplus
}
#endif

#endif
