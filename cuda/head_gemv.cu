/* Batched float32 GEMV with one matrix per head (cuda/cuk_head_gemv.h).
 *
 * The W_UV product of a decode step is 8 heads x 256 rows x 512 columns of float32 (4 MB) and
 * at most a few input rows: it is a pure weight stream. One launch covers every head: each warp
 * owns HG_RW weight rows, loads them into registers once (all its loads issued up front, so the
 * whole matrix is in flight at once over the GPU), then runs every input row t against them. A
 * batched step (32 rows) is instruction-bound instead: its inputs go in passes of HG_TB whose
 * HG_RW x HG_TB sums share one warp reduction (31 shuffles, not 160).
 *
 * With a.wq the weights come from kv_b's exact int8 form (a byte and a quarter an element, not
 * four): the warp forms each float as it loads it, so the registers hold the float32 values and
 * everything after the loads is the float32 kernel's, bit for bit.
 *
 * The launch is a programmatic dependent one (cuda/pdl.cuh): the warps load their weights, then
 * wait for the kernel before (decode's attention, k_mla_dec, which lets it start early) before
 * reading x, so the weights are in registers when the attention ends (bench_pdl's form: 4.1 ->
 * 1.9 us a 2 MB kernel). In the int8 form a decode step's W_UV fits one wave (10.5 MB at TP 1,
 * 1.3 MB on a TP 8 rank); a grid of more than one wave preloads its first wave only. */
#include <stdint.h>

#include "cuda/cuk_head_gemv.h"
#include "cuda/cuk_internal.cuh"
#include "cuda/pdl.cuh"

namespace {

constexpr int HG_WARPS = 4; /* per block */
constexpr int HG_RW = 4;    /* weight rows per warp, all of one head */
constexpr int HG_TB = 8;    /* inputs per pass: HG_RW x HG_TB = 32 sums, one per lane once reduced */

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

/* Each lane's V partial sums v[0..V) (V a power of two <= 32) summed over the warp in one tree:
 * lanes paired by xor 16, then 8, 4, 2, 1, the tree of the butterfly `acc += shfl_xor(acc, o)`
 * for o = 16 .. 1 (each level's a + b is commutative, so every sum has the butterfly's bits).
 * While more than one value is left a level halves them, each lane keeping the upper half where
 * its mask bit is set, so V sums cost V - 1 + log2(32 / V) shuffles instead of 5 V. The lane's
 * result (v[0]) is sum number hg_index<V>(lane); hg_holds<V>(lane) marks one lane per sum. */
template <int V, int CNT = V, int MASK = 16> __device__ __forceinline__ void hg_warp_sum(float (&v)[V], int lane) {
    if constexpr (MASK > 0) {
        if constexpr (CNT > 1) {
            constexpr int HALF = CNT / 2;
            const bool up = lane & MASK;
#pragma unroll
            for (int i = 0; i < HALF; i++) {
                const float send = up ? v[i] : v[i + HALF], keep = up ? v[i + HALF] : v[i];
                v[i] = keep + __shfl_xor_sync(0xffffffffu, send, MASK);
            }
            hg_warp_sum<V, HALF, MASK / 2>(v, lane);
        } else {
            v[0] += __shfl_xor_sync(0xffffffffu, v[0], MASK);
            hg_warp_sum<V, 1, MASK / 2>(v, lane);
        }
    }
}
template <int V> __device__ __forceinline__ int hg_index(int lane) {
    int idx = 0;
#pragma unroll
    for (int l = 0; l < 5; l++)
        if ((V >> l) > 1 && (lane & (16 >> l))) idx += (V >> l) / 2;
    return idx;
}
template <int V> __device__ __forceinline__ bool hg_holds(int lane) {
    int low = 0; /* the mask bits of the butterfly levels, past the halving ones */
#pragma unroll
    for (int l = 0; l < 5; l++)
        if ((V >> l) <= 1) low |= 16 >> l;
    return (lane & low) == 0;
}

/* TB inputs t0 .. t0 + TB - 1 against the warp's rows: sum (tt, i) = tt * HG_RW + i. */
template <int TB, int J, bool BF>
__device__ __forceinline__ void hg_pass(const cuk_head_gemv_args &a, const float4 (&wr)[HG_RW][J], int64_t xo,
                                        int64_t yo, int r0, int t0, int lane) {
    constexpr int V = HG_RW * TB;
    const int k4 = a.k >> 2;
    float v[V];
#pragma unroll
    for (int i = 0; i < V; i++) v[i] = 0.0f;
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int c4 = lane + 32 * j;
        if (c4 < k4) {
#pragma unroll
            for (int tt = 0; tt < TB; tt++) {
                const float4 xv = ld_x4<BF>(a.x, (int64_t)(t0 + tt) * a.ldx + xo + 4 * c4);
#pragma unroll
                for (int i = 0; i < HG_RW; i++) {
                    float &acc = v[tt * HG_RW + i];
                    acc = fmaf(wr[i][j].x, xv.x, acc);
                    acc = fmaf(wr[i][j].y, xv.y, acc);
                    acc = fmaf(wr[i][j].z, xv.z, acc);
                    acc = fmaf(wr[i][j].w, xv.w, acc);
                }
            }
        }
    }
    hg_warp_sum<V>(v, lane);
    const float s = v[0];
    const int idx = hg_index<V>(lane), tt = idx / HG_RW, i = idx % HG_RW;
    if (hg_holds<V>(lane) && r0 + i < a.m) a.y[(int64_t)(t0 + tt) * a.ldy + yo + i] = s;
}

/* grid (ceil(n_head * ceil(m / HG_RW) / HG_WARPS)), HG_WARPS warps. Warp w of block b owns row
 * group q = b * HG_WARPS + w: head h = q / groups, rows r0 = (q % groups) * HG_RW .. + HG_RW - 1
 * (rows past m are clamped duplicates, never stored). Lane l holds columns 4 * (l + 32 j) .. + 3
 * (j < J) of each of its rows in registers, all loads issued before any product. Then the inputs
 * in passes of HG_TB (the rest one at a time): per input and row the lane's partial dot product
 * (fmaf chain over its pieces in j order), the pass's sums reduced together (hg_warp_sum: the
 * butterfly's tree), each stored by the lane that holds it. A sum's order depends on k only, so
 * a row's bits never depend on n. */
/* Columns 4 c4 .. 4 c4 + 3 of a weight row: float32, or (WQ) formed from the exact int8 form,
 * each the one rounded product scale x integer that the float32 value is. */
template <bool WQ>
__device__ __forceinline__ float4 hg_w4(const cuk_head_gemv_args &a, int64_t h, int r, int c4) {
    if constexpr (WQ) {
        const uint32_t u = __ldcs((const uint32_t *)(a.wq + h * a.ld_head + (int64_t)r * a.ldw) + c4);
        const float s = __ldg(a.ws + h * a.ws_ld_head + (int64_t)r * a.ws_ldw + c4 / 4);
        return make_float4(__fmul_rn(s, (float)(int8_t)(u & 0xff)), __fmul_rn(s, (float)(int8_t)((u >> 8) & 0xff)),
                           __fmul_rn(s, (float)(int8_t)((u >> 16) & 0xff)), __fmul_rn(s, (float)(int8_t)(u >> 24)));
    } else {
        return __ldcs((const float4 *)(a.w + h * a.ld_head + (int64_t)r * a.ldw) + c4);
    }
}

template <int J, bool BF, bool WQ>
__global__ void __launch_bounds__(HG_WARPS * 32) k_head_gemv(const cuk_head_gemv_args a) {
    const int lane = threadIdx.x & 31;
    const int groups = (a.m + HG_RW - 1) / HG_RW;
    const int64_t q = (int64_t)blockIdx.x * HG_WARPS + (threadIdx.x >> 5);
    if (q >= (int64_t)a.n_head * groups) return;
    const int64_t h = q / groups;
    const int r0 = (int)(q % groups) * HG_RW;
    const int k4 = a.k >> 2;
    float4 wr[HG_RW][J];
#pragma unroll
    for (int i = 0; i < HG_RW; i++) {
        const int r = r0 + i < a.m ? r0 + i : a.m - 1;
#pragma unroll
        for (int j = 0; j < J; j++) {
            const int c4 = lane + 32 * j;
            wr[i][j] = c4 < k4 ? hg_w4<WQ>(a, h, r, c4) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    }
    cuk::pdl_wait(); /* x is the kernel before's output; nothing is written before this */
    const int64_t xo = h * a.ldxh, yo = h * a.ldyh + r0;
    int t = 0;
    for (; t + HG_TB <= a.n; t += HG_TB) hg_pass<HG_TB, J, BF>(a, wr, xo, yo, r0, t, lane);
    for (; t < a.n; t++) hg_pass<1, J, BF>(a, wr, xo, yo, r0, t, lane);
}

template <bool BF, bool WQ> cudaError_t launch(const cuk_head_gemv_args *a, int J, unsigned blocks, cudaStream_t s) {
    const dim3 th(HG_WARPS * 32);
    switch (J) {
    case 1: return cuk::pdl_launch(k_head_gemv<1, BF, WQ>, dim3(blocks), th, 0, s, *a);
    case 2: return cuk::pdl_launch(k_head_gemv<2, BF, WQ>, dim3(blocks), th, 0, s, *a);
    case 4: return cuk::pdl_launch(k_head_gemv<4, BF, WQ>, dim3(blocks), th, 0, s, *a);
    default: return cuk::pdl_launch(k_head_gemv<8, BF, WQ>, dim3(blocks), th, 0, s, *a);
    }
}

template <bool BF> cudaError_t launch_w(const cuk_head_gemv_args *a, int J, unsigned blocks, cudaStream_t s) {
    return a->wq ? launch<BF, true>(a, J, blocks, s) : launch<BF, false>(a, J, blocks, s);
}

} // namespace

extern "C" int cuk_head_gemv_fits(const cuk_head_gemv_args *a) {
    if (!a || (!a->w && !a->wq) || !a->x || !a->y) return 0;
    if (a->n_head < 1 || a->m < 1 || a->m > INT32_MAX - HG_RW || a->k < 4 || a->k > 1024 || a->k % 4 || a->n < 1)
        return 0;
    if (a->x_type != CUK_ACT_F32 && a->x_type != CUK_ACT_BF16) return 0;
    if (a->ld_head % 4 || a->ldw % 4 || a->ld_head < 0 || a->ldw < a->k) return 0;
    if (a->wq ? (a->k % 16 || ((uintptr_t)a->wq & 3) || !a->ws || ((uintptr_t)a->ws & 3) || a->ws_ld_head < 0 ||
                 a->ws_ldw < a->k / 16)
              : ((uintptr_t)a->w & 15) != 0)
        return 0;
    const uintptr_t xal = a->x_type == CUK_ACT_F32 ? 15 : 7;
    if (((uintptr_t)a->x & xal) || a->ldx % 4 || a->ldxh % 4 || a->ldxh < 0 || a->ldx < 0) return 0;
    if (a->ldyh < 0 || a->ldy < 0) return 0;
    if ((int64_t)a->n_head * ((a->m + HG_RW - 1) / HG_RW) > (int64_t)2147483647 * HG_WARPS / 2) return 0;
    return 1;
}

extern "C" g5_status cuk_head_gemv(const cuk_head_gemv_args *a, cuk_stream stream, g5_error *err) {
    if (!cuk_head_gemv_fits(a))
        return g5_fail(err, G5_ERR_INVALID_ARG,
                       "head_gemv: unsupported arguments (k=%d must be a multiple of 4 in 4..1024, aligned rows)",
                       a ? a->k : 0);
    const int need = (a->k / 4 + 31) / 32;
    const int J = need <= 1 ? 1 : need <= 2 ? 2 : need <= 4 ? 4 : 8;
    const int64_t groups = (int64_t)a->n_head * ((a->m + HG_RW - 1) / HG_RW);
    const unsigned blocks = (unsigned)((groups + HG_WARPS - 1) / HG_WARPS);
    CUK_CHECK(a->x_type == CUK_ACT_BF16 ? launch_w<true>(a, J, blocks, (cudaStream_t)stream)
                                         : launch_w<false>(a, J, blocks, (cudaStream_t)stream));
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}
