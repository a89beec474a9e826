/* Batched float32 GEMV with one matrix per head (cuda/cuk_head_gemv.h).
 *
 * The W_UV product of a decode step is 8 heads x 256 rows x 512 columns of float32 (4 MB) and
 * at most a few input rows: it is a pure weight stream. One launch covers every head: each warp
 * owns HG_RW weight rows, loads them into registers once (all its loads issued up front, so the
 * whole matrix is in flight at once over the GPU), then runs every input row t against them. */
#include <stdint.h>

#include "cuda/cuk_head_gemv.h"
#include "cuda/cuk_internal.cuh"

namespace {

constexpr int HG_WARPS = 4; /* per block */
constexpr int HG_RW = 2;    /* weight rows per warp */

/* Four consecutive inputs as float32: bf16 is the high half of a float32. */
template <bool BF> __device__ __forceinline__ float4 ld_x4(const void *x, int64_t off) {
    if constexpr (BF) {
        const uint2 u = __ldg((const uint2 *)((const uint16_t *)x + off));
        return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xFFFF0000u),
                           __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xFFFF0000u));
    } else {
        return __ldg((const float4 *)((const float *)x + off));
    }
}

/* grid (ceil(n_head * m / (HG_WARPS * HG_RW))), HG_WARPS warps. Global row g = h * m + r; warp
 * w of block b owns rows (b * HG_WARPS + w) * HG_RW + i, i < HG_RW. Lane l holds columns
 * 4 * (l + 32 j) .. + 3 (j < J) of each of its rows in registers. For each t < n and each row:
 * the lane's partial dot product (fmaf chain over its pieces in j order), a butterfly shuffle
 * sum, and lane 0 stores y. The order depends on k only, so a row's bits never depend on n. */
template <int J, bool BF>
__global__ void __launch_bounds__(HG_WARPS * 32) k_head_gemv(const cuk_head_gemv_args a) {
    const int lane = threadIdx.x & 31;
    const int64_t total = (int64_t)a.n_head * a.m;
    const int64_t g0 = ((int64_t)blockIdx.x * HG_WARPS + (threadIdx.x >> 5)) * HG_RW;
    if (g0 >= total) return;
    const int k4 = a.k >> 2;
    float4 wr[HG_RW][J];
    int64_t xo[HG_RW], yo[HG_RW];
#pragma unroll
    for (int i = 0; i < HG_RW; i++) {
        const int64_t g = g0 + i < total ? g0 + i : total - 1; /* a clamped duplicate is never stored */
        const int64_t h = g / a.m, r = g % a.m;
        const float4 *wp = (const float4 *)(a.w + h * a.ld_head + r * a.ldw);
        xo[i] = h * a.ldxh;
        yo[i] = h * a.ldyh + r;
#pragma unroll
        for (int j = 0; j < J; j++) {
            const int c4 = lane + 32 * j;
            wr[i][j] = c4 < k4 ? __ldcs(wp + c4) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    }
    for (int t = 0; t < a.n; t++) {
#pragma unroll
        for (int i = 0; i < HG_RW; i++) {
            if (g0 + i >= total) break; /* warp-uniform */
            float acc = 0.0f;
#pragma unroll
            for (int j = 0; j < J; j++) {
                const int c4 = lane + 32 * j;
                if (c4 < k4) {
                    const float4 xv = ld_x4<BF>(a.x, (int64_t)t * a.ldx + xo[i] + 4 * c4);
                    acc = fmaf(wr[i][j].x, xv.x, acc);
                    acc = fmaf(wr[i][j].y, xv.y, acc);
                    acc = fmaf(wr[i][j].z, xv.z, acc);
                    acc = fmaf(wr[i][j].w, xv.w, acc);
                }
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
            if (lane == 0) a.y[(int64_t)t * a.ldy + yo[i]] = acc;
        }
    }
}

template <bool BF> void launch(const cuk_head_gemv_args *a, int J, unsigned blocks, cudaStream_t s) {
    const int th = HG_WARPS * 32;
    switch (J) {
    case 1: k_head_gemv<1, BF><<<blocks, th, 0, s>>>(*a); break;
    case 2: k_head_gemv<2, BF><<<blocks, th, 0, s>>>(*a); break;
    case 4: k_head_gemv<4, BF><<<blocks, th, 0, s>>>(*a); break;
    default: k_head_gemv<8, BF><<<blocks, th, 0, s>>>(*a); break;
    }
}

} // namespace

extern "C" int cuk_head_gemv_fits(const cuk_head_gemv_args *a) {
    if (!a || !a->w || !a->x || !a->y) return 0;
    if (a->n_head < 1 || a->m < 1 || a->k < 4 || a->k > 1024 || a->k % 4 || a->n < 1) return 0;
    if (a->x_type != CUK_ACT_F32 && a->x_type != CUK_ACT_BF16) return 0;
    if (((uintptr_t)a->w & 15) || a->ld_head % 4 || a->ldw % 4 || a->ld_head < 0 || a->ldw < a->k) return 0;
    const uintptr_t xal = a->x_type == CUK_ACT_F32 ? 15 : 7;
    if (((uintptr_t)a->x & xal) || a->ldx % 4 || a->ldxh % 4 || a->ldxh < 0 || a->ldx < 0) return 0;
    if (a->ldyh < 0 || a->ldy < 0) return 0;
    if ((int64_t)a->n_head * a->m > (int64_t)2147483647 * HG_WARPS * HG_RW / 2) return 0;
    return 1;
}

extern "C" g5_status cuk_head_gemv(const cuk_head_gemv_args *a, cuk_stream stream, g5_error *err) {
    if (!cuk_head_gemv_fits(a))
        return g5_fail(err, G5_ERR_INVALID_ARG,
                       "head_gemv: unsupported arguments (k=%d must be a multiple of 4 in 4..1024, aligned rows)",
                       a ? a->k : 0);
    const int need = (a->k / 4 + 31) / 32;
    const int J = need <= 1 ? 1 : need <= 2 ? 2 : need <= 4 ? 4 : 8;
    const int64_t per = HG_WARPS * HG_RW;
    const unsigned blocks = (unsigned)(((int64_t)a->n_head * a->m + per - 1) / per);
    if (a->x_type == CUK_ACT_BF16)
        launch<true>(a, J, blocks, (cudaStream_t)stream);
    else
        launch<false>(a, J, blocks, (cudaStream_t)stream);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}
