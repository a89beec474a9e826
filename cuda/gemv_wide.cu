/* Float32 GEMV of few rows and a long k (cuda/cuk_gemv_wide.h): the MoE router's product
 * (GLM-5: 256 x 6144, the peer model 64 x 6144), 1.5-6.3 MB that the k_gemv path reads through
 * a few dozen warps, each with one two-chunk pipeline: far fewer bytes in flight than the HBM
 * needs, so the launch takes several times its byte time on the critical path of every MoE
 * layer. Here the whole matrix is in flight at once: k is cut into WS slices, one per CTA of a
 * cluster, each warp loads its row's slice into registers before any product, and the slices'
 * sums meet in rank order through distributed shared memory. */
#include <cooperative_groups.h>
#include <stdint.h>

#include "cuda/cuk_gemv_wide.h"
#include "cuda/cuk_internal.cuh"

namespace cg = cooperative_groups;

namespace {

constexpr int WS = 8;    /* k slices: the cluster (portable size) */
constexpr int WR = 8;    /* rows a CTA: one a warp */
constexpr int WNV = 32;  /* vectors a launch at most */
constexpr int WJ = 8;    /* float4 pieces a lane holds at most: a slice of <= 1024 columns */

/* grid (WS, ceil(m / WR)), clusters of (WS, 1, 1), WR warps. CTA rank s of row group g: warp w
 * holds row g WR + w (the last row again past m, never stored), columns s ks + 4 (lane + 32 j) ..
 * + 3 of its slice (ks = k / WS) in registers. Per vector: the lane's fmaf chain over its pieces
 * in j order, the warp's butterfly (xor 16 .. 1), the row's slice sum into shared memory; after
 * the cluster barrier CTA s stores vectors v = s, s + WS, .. of its rows, each the sum of the WS
 * slice sums in rank order from 0. A row's bits depend on k alone, never on n or m. */
template <int J, int VB>
__global__ void __launch_bounds__(WR * 32) k_gemv_wide(const float *__restrict__ w, int64_t m, int32_t k,
                                                       const float *__restrict__ x, int64_t ldx, int32_t nvec,
                                                       float *__restrict__ y, int64_t ldy) {
    __shared__ float part[WR][WNV];
    cg::cluster_group cl = cg::this_cluster();
    const int s = (int)cl.block_rank(), lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t r = (int64_t)blockIdx.y * WR + warp, rr = r < m ? r : m - 1;
    const int ks = k / WS, c0 = s * ks;
    float4 wv[J]; /* [J] pieces of the row's slice */
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int c = 4 * (lane + 32 * j);
        wv[j] = c < ks ? __ldcs((const float4 *)(w + rr * k + c0 + c)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    /* the launch is a programmatic dependent one: with the weights in registers, wait for the
     * grid before (the norm that writes x, which lets it start early) to complete, its writes
     * visible (bench_pdl: 4.1 -> 1.9 us a 2 MB kernel in this form) */
    asm volatile("griddepcontrol.wait;" ::: "memory");
    /* VB vectors at a time, so a warp has VB J loads of x in flight rather than J (one vector
     * a pass leaves the launch bound by L2 latency at n = 32: routerbench 19.5 -> 18.0 us at
     * m 64; at n = 1, VB = 4 costs 4.6 -> 5.8 us, so one vector takes VB = 1); each vector's
     * sums as alone */
    for (int v0 = 0; v0 < nvec; v0 += VB) {
        float acc[VB];
#pragma unroll
        for (int b = 0; b < VB; b++) acc[b] = 0.0f;
#pragma unroll
        for (int j = 0; j < J; j++) {
            const int c = 4 * (lane + 32 * j);
            if (c < ks) {
#pragma unroll
                for (int b = 0; b < VB; b++) {
                    const int v = v0 + b < nvec ? v0 + b : v0; /* past nvec: read, never stored */
                    const float4 xv = __ldg((const float4 *)(x + (int64_t)v * ldx + c0 + c));
                    acc[b] = fmaf(wv[j].x, xv.x, acc[b]);
                    acc[b] = fmaf(wv[j].y, xv.y, acc[b]);
                    acc[b] = fmaf(wv[j].z, xv.z, acc[b]);
                    acc[b] = fmaf(wv[j].w, xv.w, acc[b]);
                }
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
#pragma unroll
            for (int b = 0; b < VB; b++) acc[b] += __shfl_xor_sync(0xffffffffu, acc[b], o);
        if (lane == 0)
#pragma unroll
            for (int b = 0; b < VB; b++)
                if (v0 + b < nvec) part[warp][v0 + b] = acc[b];
    }
    cl.sync();
    for (int i = threadIdx.x; i < WR * nvec; i += WR * 32) {
        const int rw = i % WR, v = i / WR;
        const int64_t row = (int64_t)blockIdx.y * WR + rw;
        if (v % WS != s || row >= m) continue;
        float t = 0.0f;
#pragma unroll
        for (int q = 0; q < WS; q++) t += cl.map_shared_rank(&part[0][0], q)[rw * WNV + v];
        y[(int64_t)v * ldy + row] = t;
    }
    cl.sync(); /* the other CTAs may still read this one's part */
}

template <int J, int VB> cudaError_t launch_vb(const cuk_gemv_args *a, const float *x, int32_t n, float *y, cudaStream_t st) {
    cudaLaunchAttribute at[2];
    cudaLaunchConfig_t cfg = cuk_cluster_cfg(&at[0], WS, dim3(WS, (unsigned)((a->m + WR - 1) / WR), 1), WR * 32, 0, st);
    at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[1].val.programmaticStreamSerializationAllowed = 1;
    cfg.numAttrs = 2;
    return cudaLaunchKernelEx(&cfg, k_gemv_wide<J, VB>, (const float *)a->w, (int64_t)a->m, (int32_t)a->k, x,
                              (int64_t)a->ldx, n, y, (int64_t)a->ldy);
}

template <int J> cudaError_t launch(const cuk_gemv_args *a, const float *x, int32_t n, float *y, cudaStream_t st) {
    return n < 4 ? launch_vb<J, 1>(a, x, n, y, st) : launch_vb<J, 4>(a, x, n, y, st);
}

} // namespace

extern "C" int cuk_gemv_wide_fits(const cuk_gemv_args *a) {
    if (!a || !a->w || !a->x || !a->y || a->w_type != QT_F32 || a->x_type != CUK_ACT_F32) return 0;
    if (a->k < 4 * WS || a->k % (4 * WS) || a->k > (int64_t)WS * 4 * 32 * WJ) return 0;
    if (a->m < 1 || (a->m + WR - 1) / WR > 65535 || a->n < 1 || a->ldx < a->k || a->ldx % 4 || a->ldy < a->m) return 0;
    return !((uintptr_t)a->w & 15) && !((uintptr_t)a->x & 15);
}

extern "C" g5_status cuk_gemv_wide(const cuk_gemv_args *a, cuk_stream stream, g5_error *err) {
    if (!cuk_gemv_wide_fits(a))
        return g5_fail(err, G5_ERR_INVALID_ARG,
                       "gemv_wide: float32 weights and input, k a multiple of 32 up to 8192, aligned rows");
    const int need = (int)((a->k / WS / 4 + 31) / 32); /* float4 pieces a lane */
    const cudaStream_t st = (cudaStream_t)stream;
    for (int32_t v0 = 0; v0 < a->n; v0 += WNV) { /* launches of WNV vectors: the same sums */
        const int32_t n = a->n - v0 < WNV ? a->n - v0 : WNV;
        const float *x = (const float *)a->x + (int64_t)v0 * a->ldx;
        float *y = a->y + (int64_t)v0 * a->ldy;
        CUK_CHECK(need <= 2   ? launch<2>(a, x, n, y, st)
                  : need <= 4 ? launch<4>(a, x, n, y, st)
                  : need <= 6 ? launch<6>(a, x, n, y, st)
                              : launch<WJ>(a, x, n, y, st));
        CUK_CHECK_LAUNCH("gemv_wide");
    }
    return G5_OK;
}
