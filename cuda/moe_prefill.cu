/* MoE prefill kernels of fast mode (cuda/cuk_prefill.h): compact token lists, bf16 gathers,
 * SwiGLU to bf16, and the weighted combine; the expert products are cuBLAS calls made by
 * runtime/gpu/gpu_linear.c. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "cuda/cuk_internal.cuh"
#include "cuda/cuk_model.h"
#include "cuda/cuk_prefill.h"
#include "cuda/rowops.cuh"

#define BAD(...) g5_fail(err, G5_ERR_INVALID_ARG, __VA_ARGS__)


namespace {

unsigned grid_for(int64_t n, int threads) { return (unsigned)((n + threads - 1) / threads); }

__device__ __forceinline__ void st16(__nv_bfloat16 *p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }
__device__ __forceinline__ void st16(__half *p, int64_t i, float v) { p[i] = __float2half_rn(v); }

/* Grid: one block of 256 threads per local expert e. Thread 0 sums cnt[0..e) into the block's
 * offset; the threads then copy the expert's list into the compact arrays and point each row's
 * token slot (the first slot holding this expert) at its compact index. */
__global__ void k_moe_compact(const int32_t *__restrict__ ids, int n_tok, int top_k, int exp0,
                              const int32_t *__restrict__ rows, const float *__restrict__ rw, int64_t ld_rows,
                              const int32_t *__restrict__ cnt, int32_t *__restrict__ crow, float *__restrict__ crw,
                              int32_t *__restrict__ inv) {
    __shared__ int off;
    const int e = blockIdx.x;
    if (threadIdx.x == 0) {
        int o = 0;
        for (int i = 0; i < e; i++) o += cnt[i];
        off = o;
    }
    __syncthreads();
    const int c = cnt[e];
    for (int j = threadIdx.x; j < c; j += blockDim.x) {
        const int t = rows[(int64_t)e * ld_rows + j], i = off + j;
        crow[i] = t;
        crw[i] = rw[(int64_t)e * ld_rows + j];
        if (t < 0 || t >= n_tok) continue;
        for (int s = 0; s < top_k; s++)
            if (ids[(int64_t)t * top_k + s] == exp0 + e) {
                inv[(int64_t)t * top_k + s] = i;
                break;
            }
    }
}

/* One thread per output element (row i, column c). */
template <typename T>
__global__ void k_gather_16(const float *__restrict__ x, int64_t ldx, int64_t n_rows_x,
                            const int32_t *__restrict__ rows, int64_t n, int64_t k, T *__restrict__ out) {
    const int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= n * k) return;
    const int64_t i = g / k, c = g % k, r = rows[i];
    st16(out, g, r >= 0 && r < n_rows_x ? x[r * ldx + c] : __int_as_float(0x7fc00000));
}

/* One thread per element; k_silu_mul's arithmetic, then the bf16 rounding. */
template <typename T>
__global__ void k_silu_mul_16(const float *__restrict__ g, const float *__restrict__ u, int64_t n, T *__restrict__ y) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    st16(y, i, rowops_silu_mul(g[i], u[i]));
}

/* One thread per output element (token t, column c), coalesced along c. */
__global__ void k_moe_combine(const float *__restrict__ d, int64_t m, const int32_t *__restrict__ inv,
                              const float *__restrict__ crw, int n_tok, int top_k, float *__restrict__ y,
                              int64_t ldy) {
    const int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= (int64_t)n_tok * m) return;
    const int64_t t = g / m, c = g % m;
    float acc = 0.0f;
    for (int s = 0; s < top_k; s++) {
        const int32_t i = inv[t * top_k + s];
        if (i >= 0) acc = __fadd_rn(acc, __fmul_rn(crw[i], d[(int64_t)i * m + c]));
    }
    y[t * ldy + c] = acc;
}

} // namespace

extern "C" g5_status cuk_moe_compact(const cuk_moe_compact_args *a, cuk_stream stream, g5_error *err) {
    if (!a || !a->ids || !a->rows || !a->rw || !a->cnt || !a->crow || !a->crw || !a->inv)
        return BAD("moe_compact: NULL pointer");
    if (a->n_tok < 1 || a->top_k < 1 || a->n_local < 1 || a->exp0 < 0 || a->ld_rows < a->n_tok)
        return BAD("moe_compact: n_tok=%d top_k=%d n_local=%d exp0=%d ld_rows=%lld", a->n_tok, a->top_k, a->n_local,
                   a->exp0, (long long)a->ld_rows);
    CUK_CHECK(cudaMemsetAsync(a->inv, 0xff, (size_t)a->n_tok * a->top_k * 4, (cudaStream_t)stream));
    k_moe_compact<<<(unsigned)a->n_local, 256, 0, (cudaStream_t)stream>>>(a->ids, a->n_tok, a->top_k, a->exp0, a->rows,
                                                                          a->rw, a->ld_rows, a->cnt, a->crow, a->crw,
                                                                          a->inv);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}

extern "C" g5_status cuk_gather_rows_16(const float *x, int64_t ldx, int64_t n_rows_x, const int32_t *rows,
                                        int64_t n, int64_t k, void *out, uint32_t et, cuk_stream stream,
                                        g5_error *err) {
    if (!x || !rows || !out) return BAD("gather_rows_16: NULL pointer");
    if (et != CUK_BF16 && et != CUK_F16) return BAD("gather_rows_16: et %u", et);
    if (n < 1 || k < 1 || n_rows_x < 1 || ldx < k || n > INT64_MAX / k)
        return BAD("gather_rows_16: n=%lld k=%lld n_rows_x=%lld ldx=%lld", (long long)n, (long long)k,
                   (long long)n_rows_x, (long long)ldx);
    if (et == CUK_BF16)
        k_gather_16<<<grid_for(n * k, 256), 256, 0, (cudaStream_t)stream>>>(x, ldx, n_rows_x, rows, n, k,
                                                                            (__nv_bfloat16 *)out);
    else
        k_gather_16<<<grid_for(n * k, 256), 256, 0, (cudaStream_t)stream>>>(x, ldx, n_rows_x, rows, n, k,
                                                                            (__half *)out);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}

extern "C" g5_status cuk_silu_mul_16(const float *g, const float *u, int64_t n_rows, int64_t dim, void *y,
                                     uint32_t et, cuk_stream stream, g5_error *err) {
    if (!g || !u || !y) return BAD("silu_mul_16: NULL pointer");
    if (et != CUK_BF16 && et != CUK_F16) return BAD("silu_mul_16: et %u", et);
    if (n_rows < 1 || dim < 1 || n_rows > INT64_MAX / dim)
        return BAD("silu_mul_16: n_rows=%lld dim=%lld", (long long)n_rows, (long long)dim);
    if (et == CUK_BF16)
        k_silu_mul_16<<<grid_for(n_rows * dim, 256), 256, 0, (cudaStream_t)stream>>>(g, u, n_rows * dim,
                                                                                     (__nv_bfloat16 *)y);
    else
        k_silu_mul_16<<<grid_for(n_rows * dim, 256), 256, 0, (cudaStream_t)stream>>>(g, u, n_rows * dim,
                                                                                     (__half *)y);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}

extern "C" g5_status cuk_moe_combine(const float *d, int64_t m, const int32_t *inv, const float *crw, int32_t n_tok,
                                     int32_t top_k, float *y, int64_t ldy, cuk_stream stream, g5_error *err) {
    if (!d || !inv || !crw || !y) return BAD("moe_combine: NULL pointer");
    if (m < 1 || n_tok < 1 || top_k < 1 || ldy < m)
        return BAD("moe_combine: m=%lld n_tok=%d top_k=%d ldy=%lld", (long long)m, n_tok, top_k, (long long)ldy);
    k_moe_combine<<<grid_for((int64_t)n_tok * m, 256), 256, 0, (cudaStream_t)stream>>>(d, m, inv, crw, n_tok, top_k,
                                                                                       y, ldy);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}
