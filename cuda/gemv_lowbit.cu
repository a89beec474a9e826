/* GEMV, MoE gate+up and MoE down for the low-bit types (Q2_K, Q3_K, IQ1_S, IQ1_M, IQ2_XXS,
 * IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, TQ1_0, TQ2_0, MXFP4, NVFP4): the same arguments and results as
 * cuk_gemv / cuk_moe_gate_up / cuk_moe_down (cuda/cuk.h), reached from their dispatch in
 * cuda/gemv.cu. Weights are decoded by format/quant_blocks.h, the code the CPU dequantizes
 * with: a group of 8 elements is y = a * f - b, so a group's dot product with x is
 * a * sum(f x) - b * sum(x).
 *
 * Grid and threads (all three kernels): a CTA of 4 warps, one weight row per warp; each lane
 * takes groups lane, lane + 32, ... of the row (8 consecutive weights and 8 x values, 32-byte
 * x loads), the lanes' partial sums are reduced by shuffles in a fixed order. These kernels
 * favour one simple, exact decode over speed; the tuned kernels of gemv_impl.cuh cover the
 * other types. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/cuk.h"
#include "cuda/cuk_internal.cuh"
#include "cuda/gemv_lowbit.h"
#include "format/quant_blocks.h"

namespace cuk {
namespace lowbit {

constexpr int WARPS = 4;
constexpr int NVC = 4; /* input vectors per pass of cuk_gemv */

/* x[0..8) of an activation row (float32 or bf16), o is a multiple of 8 */
template <int XT> __device__ __forceinline__ void ldx8(const void *x, int64_t o, float *v) {
    if constexpr (XT == CUK_ACT_F32) {
        const float4 a = __ldg((const float4 *)((const float *)x + o));
        const float4 b = __ldg((const float4 *)((const float *)x + o + 4));
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
        const uint2 a = __ldg((const uint2 *)((const uint16_t *)x + o));
        const uint2 b = __ldg((const uint2 *)((const uint16_t *)x + o + 4));
        const uint32_t w[4] = {a.x, a.y, b.x, b.y};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            v[2 * i] = __uint_as_float(w[i] << 16);
            v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
        }
    }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* acc[v] (v < nv <= NVC) += row . x_v over the lane's groups; row: k elements of type T. */
template <int T, int XT>
__device__ __forceinline__ void row_dot(const uint8_t *row, int64_t k, const void *x, int64_t ldx,
                                        int nv, int lane, float *acc) {
    constexpr int BLK = T == QT_MXFP4 ? 32 : T == QT_NVFP4 ? 64 : 256;
    constexpr int BB = T == QT_Q2_K     ? QB_B_Q2_K
                       : T == QT_Q3_K   ? QB_B_Q3_K
                       : T == QT_IQ2_XXS ? QB_B_IQ2_XXS
                       : T == QT_IQ2_XS ? QB_B_IQ2_XS
                       : T == QT_IQ2_S  ? QB_B_IQ2_S
                       : T == QT_IQ3_XXS ? QB_B_IQ3_XXS
                       : T == QT_IQ3_S  ? QB_B_IQ3_S
                       : T == QT_IQ1_S  ? QB_B_IQ1_S
                       : T == QT_IQ1_M  ? QB_B_IQ1_M
                       : T == QT_TQ1_0  ? QB_B_TQ1_0
                       : T == QT_TQ2_0  ? QB_B_TQ2_0
                       : T == QT_MXFP4  ? QB_B_MXFP4
                                        : QB_B_NVFP4;
    constexpr int GPB = BLK / 8;
    const int64_t ng = k / 8;
    for (int64_t g = lane; g < ng; g += 32) {
        float f[8], b;
        const float a = qb_group(T, row + (g / GPB) * BB, (int)(g % GPB), f, &b);
        for (int v = 0; v < nv; v++) {
            float xv[8];
            ldx8<XT>(x, (int64_t)v * ldx + 8 * g, xv);
            float d = f[0] * xv[0], sx = xv[0];
#pragma unroll
            for (int j = 1; j < 8; j++) {
                d = fmaf(f[j], xv[j], d);
                sx += xv[j];
            }
            acc[v] = fmaf(a, d, acc[v]);
            if (b != 0.0f) acc[v] = fmaf(-b, sx, acc[v]);
        }
    }
}

/* Grid: x = row tiles of 4 rows, y = chunks of NVC input vectors. */
template <int T, int XT>
__global__ void __launch_bounds__(WARPS * 32)
    k_gemv(const uint8_t *__restrict__ w, int64_t rb, int64_t k, int64_t m,
           const void *__restrict__ x, int64_t ldx, int n, float *__restrict__ y, int64_t ldy) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * WARPS + warp;
    if (row >= m) return;
    const int v0 = blockIdx.y * NVC, nv = n - v0 < NVC ? n - v0 : NVC;
    const size_t xs = XT == CUK_ACT_F32 ? 4 : 2;
    const void *xv = (const uint8_t *)x + (size_t)v0 * ldx * xs;
    float acc[NVC] = {0.0f, 0.0f, 0.0f, 0.0f};
    row_dot<T, XT>(w + row * rb, k, xv, ldx, nv, lane, acc);
    for (int v = 0; v < nv; v++) {
        const float s = warp_sum(acc[v]);
        if (lane == 0) y[(int64_t)(v0 + v) * ldy + row] = s;
    }
}

/* Grid: x = row tiles, y = slot s, z = token t. out row (t, s) = silu(Wg[e] x_t) * (Wu[e] x_t). */
template <int T, int XT>
__global__ void __launch_bounds__(WARPS * 32)
    k_gate_up(const uint8_t *__restrict__ wg, const uint8_t *__restrict__ wu, int64_t rb, int64_t k,
              int64_t m, int n_expert, const int32_t *__restrict__ ids, int64_t ld_ids, int top_k,
              const void *__restrict__ x, int64_t ldx, float *__restrict__ out, int64_t ldo) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * WARPS + warp;
    if (row >= m) return;
    const int s = blockIdx.y, t = blockIdx.z;
    float *o = out + ((int64_t)t * top_k + s) * ldo;
    const int e = ids[(int64_t)t * ld_ids + s];
    if (e < 0 || e >= n_expert) {
        if (lane == 0) o[row] = __int_as_float(0x7fc00000);
        return;
    }
    const size_t xs = XT == CUK_ACT_F32 ? 4 : 2;
    const void *xt = (const uint8_t *)x + (size_t)t * ldx * xs;
    const int64_t off = ((int64_t)e * m + row) * rb;
    float g[1] = {0.0f}, u[1] = {0.0f};
    row_dot<T, XT>(wg + off, k, xt, ldx, 1, lane, g);
    row_dot<T, XT>(wu + off, k, xt, ldx, 1, lane, u);
    const float gs = warp_sum(g[0]), us = warp_sum(u[0]);
    if (lane == 0) o[row] = gs / (1.0f + expf(-gs)) * us;
}

/* Grid: x = row tiles, y = token t. y row t = sum over s in order of wts[s] * (Wd[e_s] h_{t,s}). */
template <int T, int XT>
__global__ void __launch_bounds__(WARPS * 32)
    k_down(const uint8_t *__restrict__ w, int64_t rb, int64_t k, int64_t m, int n_expert,
           const int32_t *__restrict__ ids, int64_t ld_ids, const float *__restrict__ wts,
           int64_t ld_wts, int top_k, const void *__restrict__ h, int64_t ldh,
           float *__restrict__ y, int64_t ldy) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * WARPS + warp;
    if (row >= m) return;
    const int t = blockIdx.y;
    const size_t hs = XT == CUK_ACT_F32 ? 4 : 2;
    float sum = 0.0f;
    for (int s = 0; s < top_k; s++) {
        const int e = ids[(int64_t)t * ld_ids + s];
        if (e < 0 || e >= n_expert) {
            sum = __int_as_float(0x7fc00000);
            break;
        }
        const void *hv = (const uint8_t *)h + ((size_t)t * top_k + s) * ldh * hs;
        float acc[1] = {0.0f};
        row_dot<T, XT>(w + ((int64_t)e * m + row) * rb, k, hv, ldh, 1, lane, acc);
        sum = fmaf(wts[(int64_t)t * ld_wts + s], warp_sum(acc[0]), sum);
    }
    if (lane == 0) y[(int64_t)t * ldy + row] = sum;
}

static unsigned tiles(int64_t m) { return (unsigned)((m + WARPS - 1) / WARPS); }

static int64_t row_bytes(uint32_t type, int64_t k) {
    uint64_t rb = 0;
    quant_row_bytes(type, (uint64_t)k, &rb);
    return (int64_t)rb;
}

template <int T>
static g5_status gemv(const cuk_gemv_args *a, cudaStream_t st, g5_error *err) {
    const dim3 grid(tiles(a->m), (unsigned)((a->n + NVC - 1) / NVC));
    const int64_t rb = row_bytes(T, a->k);
    if (a->x_type == CUK_ACT_F32)
        k_gemv<T, CUK_ACT_F32><<<grid, WARPS * 32, 0, st>>>((const uint8_t *)a->w, rb, a->k, a->m,
                                                           a->x, a->ldx, a->n, a->y, a->ldy);
    else
        k_gemv<T, CUK_ACT_BF16><<<grid, WARPS * 32, 0, st>>>((const uint8_t *)a->w, rb, a->k, a->m,
                                                            a->x, a->ldx, a->n, a->y, a->ldy);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}

template <int T>
static g5_status gate_up(const cuk_moe_gate_up_args *a, cudaStream_t st, g5_error *err) {
    const dim3 grid(tiles(a->m), (unsigned)a->top_k, (unsigned)a->n_tok);
    const int64_t rb = row_bytes(T, a->k);
    if (a->x_type == CUK_ACT_F32)
        k_gate_up<T, CUK_ACT_F32><<<grid, WARPS * 32, 0, st>>>(
            (const uint8_t *)a->w_gate, (const uint8_t *)a->w_up, rb, a->k, a->m, a->n_expert,
            a->ids, a->ld_ids, a->top_k, a->x, a->ldx, a->out, a->ldo);
    else
        k_gate_up<T, CUK_ACT_BF16><<<grid, WARPS * 32, 0, st>>>(
            (const uint8_t *)a->w_gate, (const uint8_t *)a->w_up, rb, a->k, a->m, a->n_expert,
            a->ids, a->ld_ids, a->top_k, a->x, a->ldx, a->out, a->ldo);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}

template <int T>
static g5_status down(const cuk_moe_down_args *a, cudaStream_t st, g5_error *err) {
    const dim3 grid(tiles(a->m), (unsigned)a->n_tok);
    const int64_t rb = row_bytes(T, a->k);
    if (a->h_type == CUK_ACT_F32)
        k_down<T, CUK_ACT_F32><<<grid, WARPS * 32, 0, st>>>(
            (const uint8_t *)a->w, rb, a->k, a->m, a->n_expert, a->ids, a->ld_ids, a->wts,
            a->ld_wts, a->top_k, a->h, a->ldh, a->y, a->ldy);
    else
        k_down<T, CUK_ACT_BF16><<<grid, WARPS * 32, 0, st>>>(
            (const uint8_t *)a->w, rb, a->k, a->m, a->n_expert, a->ids, a->ld_ids, a->wts,
            a->ld_wts, a->top_k, a->h, a->ldh, a->y, a->ldy);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}

} // namespace lowbit

#define LOWBIT_DISPATCH(fn, type, a, s, err)                                                   \
    switch (type) {                                                                           \
    case QT_Q2_K: return lowbit::fn<QT_Q2_K>(a, s, err);                                      \
    case QT_Q3_K: return lowbit::fn<QT_Q3_K>(a, s, err);                                      \
    case QT_IQ2_XXS: return lowbit::fn<QT_IQ2_XXS>(a, s, err);                                \
    case QT_IQ2_XS: return lowbit::fn<QT_IQ2_XS>(a, s, err);                                  \
    case QT_IQ2_S: return lowbit::fn<QT_IQ2_S>(a, s, err);                                    \
    case QT_IQ3_XXS: return lowbit::fn<QT_IQ3_XXS>(a, s, err);                                \
    case QT_IQ3_S: return lowbit::fn<QT_IQ3_S>(a, s, err);                                    \
    case QT_IQ1_S: return lowbit::fn<QT_IQ1_S>(a, s, err);                                    \
    case QT_IQ1_M: return lowbit::fn<QT_IQ1_M>(a, s, err);                                    \
    case QT_TQ1_0: return lowbit::fn<QT_TQ1_0>(a, s, err);                                    \
    case QT_TQ2_0: return lowbit::fn<QT_TQ2_0>(a, s, err);                                    \
    case QT_MXFP4: return lowbit::fn<QT_MXFP4>(a, s, err);                                    \
    case QT_NVFP4: return lowbit::fn<QT_NVFP4>(a, s, err);                                    \
    default: return g5_fail(err, G5_ERR_INTERNAL, #fn ": type %u is not a low-bit type", type); \
    }

int lowbit_handles(uint32_t type) { return qb_handles(type); }
int lowbit_block(uint32_t type) { return qb_handles(type) ? qb_block_elems(type) : 0; }

g5_status lowbit_gemv(const cuk_gemv_args *a, cudaStream_t s, g5_error *err) {
    LOWBIT_DISPATCH(gemv, a->w_type, a, s, err)
}
g5_status lowbit_gate_up(const cuk_moe_gate_up_args *a, cudaStream_t s, g5_error *err) {
    LOWBIT_DISPATCH(gate_up, a->w_type, a, s, err)
}
g5_status lowbit_down(const cuk_moe_down_args *a, cudaStream_t s, g5_error *err) {
    LOWBIT_DISPATCH(down, a->w_type, a, s, err)
}

} // namespace cuk
