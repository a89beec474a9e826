/* Float32 GEMV of few rows and a long k with the whole matrix in flight at once (the MoE
 * router's product in fast modes' decode steps; cuda/gemv_wide.cu has the grid).
 *
 * y[v][i] = sum_j W[i][j] x[v][j] for v < n, i < m, j < k (cuk_gemv_args of cuda/cuk.h, float32
 * weights and input): k in 8 slices, each slice's sum an fmaf chain per lane over its float4
 * pieces and a warp butterfly (xor 16 .. 1), the slices added in order from 0. Not cuk_gemv's
 * order; a row's bits depend on k alone, never on n (any n >= 1) or m. */
#ifndef G5_CUDA_CUK_GEMV_WIDE_H
#define G5_CUDA_CUK_GEMV_WIDE_H

#include "cuda/cuk.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 if cuk_gemv_wide takes a: F32 weights and input, k a multiple of 32 up to 8192, ldx a
 * multiple of 4, 16-byte aligned w and x, positive sizes. */
int cuk_gemv_wide_fits(const cuk_gemv_args *a);
/* The product on `stream`; G5_ERR_INVALID_ARG where cuk_gemv_wide_fits says 0. */
g5_status cuk_gemv_wide(const cuk_gemv_args *a, cuk_stream stream, g5_error *err);

#ifdef __cplusplus
}
#endif

#endif
