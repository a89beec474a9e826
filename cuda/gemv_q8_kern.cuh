/* Internal to cuda/: the int8-input dp4a kernels of gemv_q8.cu (GEMV, MoE gate+up, MoE down) as
 * templates over the weight type, and their launchers. A weight type plugs in with
 *   template <> struct Raw<T> { void load(const uint8_t *row, int u); }   the bytes of unit u,
 *   decode(const Raw<T> &, int u)   what the unit's dot products read (Dec<T>::type; the K-quants
 *                                   read Raw itself),
 *   float dot(const Dec<T>::type &, const XOf<T>::type &x, int u)   the unit's float32 value,
 * visible before the launchers are instantiated. gemv_q8.cu instantiates the K-quants and Q8_0,
 * gemv_q8_lb*.cu the low-bit types (cuda/q8_lowbit.cuh), so that no one file compiles them all.
 * Layout of the work and numerics: gemv_q8.cu's head comment and cuda/cuk_q8.h. */
#ifndef G5_GEMV_Q8_KERN_CUH
#define G5_GEMV_Q8_KERN_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/cuk_internal.cuh"
#include "cuda/cuk_q8.h"
#include "cuda/moe_plan.cuh"
#include "cuda/q8_load.cuh"
#include "cuda/q8_quant.cuh"
#include "cuda/rowops.cuh"
#include "cuda/warp_tile.cuh"

namespace cuk {
namespace q8 {

constexpr int WARPS = 8;

using q8l::h2f;
using q8l::k4_scale;
using q8l::ldg128;
using q8l::ldg32;
using q8l::ldg_f4;
using q8l::q6_add;
using q8l::unit_k4;
using q8l::unit_q8_0;

__device__ __forceinline__ int dp4(uint32_t a, uint32_t b, int c) { return __dp4a((int)a, (int)b, c); }
__device__ __forceinline__ uint32_t u4get(const uint4 &v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/* One vector's int8 row (q) and block pairs (ds), both at the row's start. */
struct Xrow {
    const int8_t *q;
    const float *ds;
};

/* ---- per type: the raw bytes of one unit (specialized by each type) ---- */

template <int T> struct Raw;

/* The x row's 64 elements of unit u for the 64-element-contiguous types (blocks 2u, 2u + 1). */
struct X64 {
    uint4 q[4];
    float4 ds; /* d0, s0, d1, s1 */
    __device__ void load(const Xrow &x, int u) {
        const int8_t *p = x.q + (int64_t)u * 64;
#pragma unroll
        for (int i = 0; i < 4; i++) q[i] = ldg128(p + 16 * i);
        ds = ldg_f4(x.ds + (int64_t)u * 4);
    }
    /* from k_gemv_q8's staged x (its XS form): the unit's 64 bytes, then its 4 floats */
    __device__ void load_s(const uint8_t *p) {
#pragma unroll
        for (int i = 0; i < 4; i++) q[i] = *(const uint4 *)(const void *)(p + 16 * i);
        ds = *(const float4 *)(const void *)(p + 64);
    }
    __device__ uint32_t word(int i) const { return u4get(q[i >> 2], i & 3); }
};

/* What a unit's x rows are read as (X64 but for Q6_K), and what its weights are decoded to before
 * the dot products with them (the raw bytes themselves, but for the low-bit types). */
template <int T> struct XOf { using type = X64; };
template <int T> struct Dec { using type = Raw<T>; };
template <int T> __device__ __forceinline__ const Raw<T> &decode(const Raw<T> &w, int) { return w; }

/* Butterfly sum over the warp with the offsets ascending (1, 2, .., 16): each total is the
 * pairwise tree over the lanes in their natural order, ((l0 + l1) + (l2 + l3)) + ..., the order
 * gemv_q8t.cu rebuilds from its per-residue sums (cuda/cuk_q8.h). span < 32 (a power of two):
 * the same tree within each span of lanes (rows of few units, seg_for), then + 0, which is what
 * the whole warp's tree adds from lanes that hold no unit (it turns a -0 total into +0): the bits
 * of a row spread over all 32 lanes. */
template <int R, int NV> __device__ __forceinline__ void warp_sum_asc(float (&a)[R][NV], int span = 32) {
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        if (off >= span) break;
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int v = 0; v < NV; v++) a[r][v] = __fadd_rn(a[r][v], __shfl_xor_sync(0xffffffffu, a[r][v], off));
    }
    if (span < 32)
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int v = 0; v < NV; v++) a[r][v] = __fadd_rn(a[r][v], 0.0f);
}

/* The XS form's x in shared memory: per vector and plane, per unit its 64 int8 bytes and its 4
 * floats (80 bytes: the 16-byte reads of 8 lanes, 80 bytes apart, hit distinct banks). */
constexpr int XS_UNIT = 80;

/* acc[r][v] += row r's units u0, u0 + us, .. times vector v (v < nvec); P = 2: the second plane
 * (the same layout k bytes and k / 16 floats further, s = 0) added after the first. XS: x read
 * from sx ([NV][P][units][XS_UNIT] in shared memory) instead of xv; the same values. */
template <int T, int R, int NV, int P, bool XS = false>
__device__ __forceinline__ void rows_dot(const uint8_t *const (&rowp)[R], int units, const Xrow (&xv)[NV], int nvec,
                                         int u0, int us, float (&acc)[R][NV], const uint8_t *sx = nullptr) {
    using XT = typename XOf<T>::type;
    const int64_t qo = (int64_t)units * 64, dso = (int64_t)units * 4;
    for (int u = u0; u < units; u += us) {
        Raw<T> w[R];
#pragma unroll
        for (int r = 0; r < R; r++) w[r].load(rowp[r], u);
        typename Dec<T>::type dw[R];
#pragma unroll
        for (int r = 0; r < R; r++) dw[r] = decode(w[r], u);
#pragma unroll
        for (int v = 0; v < NV; v++) {
            if (v < nvec) {
#pragma unroll
                for (int pl = 0; pl < P; pl++) {
                    XT x;
                    if constexpr (XS)
                        x.load_s(sx + ((int64_t)(v * P + pl) * units + u) * XS_UNIT);
                    else
                        x.load(Xrow{xv[v].q + pl * qo, xv[v].ds + pl * dso}, u);
#pragma unroll
                    for (int r = 0; r < R; r++) acc[r][v] = __fadd_rn(acc[r][v], dot(dw[r], x, u));
                }
            }
        }
    }
}

/* Lanes a row's units spread over in k_gemv_q8 and k_down_q8: the whole warp, or for rows of 16
 * units or fewer (a TP 8 rank's routed and shared experts' down, k = 256: 4 units) the power of
 * two covering them, 32 / span rows side by side in the warp instead of most lanes idle. */
static __host__ __device__ constexpr int seg_for(int units) {
    return units > 16 ? 32 : units > 8 ? 16 : units > 4 ? 8 : units > 2 ? 4 : units > 1 ? 2 : 1;
}

/* Rows per warp: G groups of R rows (times 32 / seg_for side by side), one after the other (G = 4
 * where a row has one unit per lane over the whole warp, so a warp keeps loads in flight across
 * groups instead of exiting after one; rows of <= 16 units fill the warp side by side instead). */
static __host__ __device__ constexpr int groups_for(int units) { return units <= 32 && units > 16 ? 4 : 1; }

/* The XS layout ([nvec][P][units][XS_UNIT]) of the float32 rows row(v) (v < nvec, k = 64 units),
 * quantized by the CTA's warps a 32-element block per 8 lanes (q8q::quant_block<4, P>: the bits of
 * cuk_q8_quantize, both planes); then a barrier. Every thread of the CTA calls it. With nw, row v
 * is RMS-normed first, (x * nsc[v]) * nw elementwise as the norm launches round it (cuk_norm_q8's
 * int8 rows: the quantization of that product). */
template <int P, class RowOf>
__device__ __forceinline__ void stage_rows(RowOf row, int nvec, int units, uint8_t *sx, const float *nw = nullptr,
                                           const float *nsc = nullptr) {
    __shared__ __align__(16) uint8_t sink[P * XS_UNIT]; /* where the lanes past the last block write */
    const int lane = threadIdx.x & 31, gl = lane & 7, nb = 2 * units, tot = nvec * nb;
    for (int b0 = 4 * (int)(threadIdx.x >> 5); b0 < tot; b0 += 4 * WARPS) { /* warp-uniform (quant_block's shuffles) */
        const int bi = b0 + (lane >> 3);
        const bool on = bi < tot;
        const int v = on ? bi / nb : 0, b = on ? bi - v * nb : 0;
        float4 f = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (on) f = ldg_f4(row(v) + 32 * b + 4 * gl);
        if (on && nw) {
            const float4 g = ldg_f4(nw + 32 * b + 4 * gl);
            const float sc = nsc[v];
            f = make_float4(__fmul_rn(__fmul_rn(f.x, sc), g.x), __fmul_rn(__fmul_rn(f.y, sc), g.y),
                            __fmul_rn(__fmul_rn(f.z, sc), g.z), __fmul_rn(__fmul_rn(f.w, sc), g.w));
        }
        const float e4[4] = {f.x, f.y, f.z, f.w};
        /* plane 1 of the unit: units * XS_UNIT bytes further (sink: XS_UNIT) */
        const int64_t pstep = on ? (int64_t)units * XS_UNIT : XS_UNIT;
        uint8_t *unit = on ? sx + ((int64_t)v * P * units + (b >> 1)) * XS_UNIT : sink;
        q8q::quant_block<4, P>(e4, gl, (int8_t *)(unit + 32 * (b & 1)), 0, (float *)(void *)(unit + 64), b & 1,
                               pstep, pstep / 4);
    }
    __syncthreads();
}

/* Plain GEMV, of one matrix or (w2 non-NULL) of two of the same shape read with the same x: the
 * rows of w, then those of w2 (outputs in y2), each row's arithmetic the same either way. Grid:
 * ceil(mt / (2 G WARPS ns)) CTAs of WARPS warps, mt = m or 2 m, ns = 32 / seg_for(units); warp w
 * of CTA c takes G groups of ns row pairs from 2 G ns (c WARPS + w), lanes s span .. s span +
 * span - 1 the pair s of a group (unit ul = lane % span, then ul + span, ..). XS
 * (cuk_gemv_q8_xs, tests and bench_q8; types read as X64): the CTA's threads first copy its nvec
 * x rows (both planes) into dynamic shared memory in rows_dot's XS layout, then one barrier,
 * then the warps read x there instead of through L1.
 * One vector: three CTAs an SM (80 registers; sm_90 ptxas: no spills but 16-28 bytes for Q5_K's
 * two planes), so that a product of 6144 rows (3072 warps of row pairs) fills the SMs' 3168 warp
 * slots in one wave instead of 1.45 waves of the 2112 that 2 CTAs of 103-123 registers give. */
/* cuk_gemv_q8_xf's float32 rows (XF): x [nvec][ld]; with nw, RMS-normed first (weights nw, eps,
 * the norm launches' split sh of a row). */
struct XfIn {
    const float *x;
    int64_t ld;
    const float *nw;
    float eps;
    RowopsShape sh;
};

template <int T, int NV, int G, int P, bool XS = false, bool XF = false>
__global__ void __launch_bounds__(WARPS * 32, NV == 1 ? 3 : 2)
    k_gemv_q8(const uint8_t *__restrict__ w, int64_t rb, int64_t m, int units, const int8_t *__restrict__ xq,
              int64_t ldq, const float *__restrict__ xds, int64_t ldds, int nvec, float *__restrict__ y,
              int64_t ldy, const uint8_t *__restrict__ w2, float *__restrict__ y2, const XfIn xin) {
    static_assert(XS || !XF, "k_gemv_q8: float32 x is staged");
    constexpr int R = 2;
    const int lane = threadIdx.x & 31;
    const int64_t wi = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5), mt = w2 ? 2 * m : m;
    Xrow xv[NV];
#pragma unroll
    for (int v = 0; v < NV; v++) xv[v] = Xrow{xq + (int64_t)v * ldq, xds + (int64_t)v * ldds};
    extern __shared__ __align__(16) uint8_t gsx[]; /* XS: [nvec][P][units][XS_UNIT] */
    if constexpr (XF) {
        static_assert(WARPS * 32 == ROWOPS_NT, "k_gemv_q8: rowops_rms_scale plays the norm's CTAs of ROWOPS_NT threads");
        __shared__ float nsc[NV]; /* the rows' RMS scales */
        if (xin.nw) {
            __shared__ double red[ROWOPS_RMS_SH];
            for (int v = 0; v < nvec; v++) {
                const float sc = rowops_rms_scale(xin.x + (int64_t)v * xin.ld, 64 * (int64_t)units, xin.eps, xin.sh, red);
                if (threadIdx.x == 0) nsc[v] = sc;
            }
            __syncthreads();
        }
        stage_rows<P>([&](int v) { return xin.x + (int64_t)v * xin.ld; }, nvec, units, gsx, xin.nw, nsc);
    } else if constexpr (XS) { /* every thread copies 16-byte pieces: a unit's four of int8 bytes, then its floats */
        const int per = 5 * units;
        for (int vp = 0; vp < nvec * P; vp++) {
            const int v = vp / P, pl = vp - v * P;
            const int8_t *q = xq + (int64_t)v * ldq + (int64_t)pl * units * 64;
            const float *ds = xds + (int64_t)v * ldds + (int64_t)pl * units * 4;
            for (int j = threadIdx.x; j < per; j += WARPS * 32) {
                const int u = j / 5, part = j - 5 * u;
                uint4 val;
                if (part < 4) {
                    val = ldg128(q + (int64_t)u * 64 + 16 * part);
                } else {
                    const float4 f = ldg_f4(ds + (int64_t)u * 4);
                    val = make_uint4(__float_as_uint(f.x), __float_as_uint(f.y), __float_as_uint(f.z), __float_as_uint(f.w));
                }
                *(uint4 *)(void *)(gsx + ((int64_t)vp * units + u) * XS_UNIT + 16 * part) = val;
            }
        }
        __syncthreads();
    }
    /* G = 4 only where units > 16 (groups_for): span 32 at compile time there */
    const int span = G == 4 ? 32 : seg_for(units), ns = 32 / span, ul = lane & (span - 1);
    const int64_t sr = (int64_t)(lane / span) * R; /* the lane's slot's first row in the group */
#pragma unroll
    for (int gi = 0; gi < G; gi++) {
        const int64_t r0 = (wi * G + gi) * R * ns;
        if (r0 >= mt) return;
        const uint8_t *rowp[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int64_t row = r0 + sr + r < mt ? r0 + sr + r : mt - 1;
            rowp[r] = row < m ? w + row * rb : w2 + (row - m) * rb;
        }
        float acc[R][NV] = {};
        rows_dot<T, R, NV, P, XS>(rowp, units, xv, nvec, ul, span, acc, gsx);
        warp_sum_asc<R, NV>(acc, span);
        for (int i = ul; i < R * NV; i += span) {
            const float val = pick<R, NV>(acc, i);
            const int r = i / NV, v = i % NV;
            const int64_t row = r0 + sr + r;
            if (v < nvec && row < mt) (row < m ? y + row : y2 + (row - m))[(int64_t)v * ldy] = val;
        }
    }
}

/* MoE gate+up. Grid: x = ceil(m / (G WARPS)), y = plan group. Warp: G times a gate row and the
 * same up row of the group's expert (R = 2 rows sharing each x load; 4 rows needed up to 179
 * registers). */
template <int T, int NV, int G, int P>
__global__ void __launch_bounds__(WARPS * 32, 2)
    k_gate_up_q8(const uint8_t *__restrict__ wg, const uint8_t *__restrict__ wu, int64_t rb, int64_t m,
                 int units, const int32_t *__restrict__ plan, int n_pairs, int top_k,
                 const int8_t *__restrict__ xq, int64_t ldq, const float *__restrict__ xds, int64_t ldds,
                 float *__restrict__ out, int64_t ldo) {
    constexpr int R = 2;
    const PlanView pv(plan, n_pairs);
    const int grp = blockIdx.y;
    if (grp >= pv.n_groups()) return;
    const int lane = threadIdx.x & 31;
    const int64_t wi = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5);
    const int e = pv.expert(grp), pos0 = pv.start(grp), nvec = pv.count(grp);
    const int64_t eoff = (int64_t)e * m * rb;
    Xrow xv[NV];
#pragma unroll
    for (int v = 0; v < NV; v++) {
        const int64_t t = v < nvec ? pv.pair(pos0 + v) / top_k : 0;
        xv[v] = Xrow{xq + t * ldq, xds + t * ldds};
    }
#pragma unroll
    for (int gi = 0; gi < G; gi++) {
        const int64_t m0 = wi * G + gi;
        if (m0 >= m) return;
        const uint8_t *rowp[R] = {wg + eoff + m0 * rb, wu + eoff + m0 * rb};
        float acc[R][NV] = {};
        rows_dot<T, R, NV, P>(rowp, units, xv, nvec, lane, 32, acc);
        warp_sum_asc<R, NV>(acc);
        const float g = pick<R, NV>(acc, lane), up = pick<R, NV>(acc, lane + NV);
        if (lane < nvec) {
            out[(int64_t)pv.pair(pos0 + lane) * ldo + m0] = g / (1.0f + expf(-g)) * up;
        }
    }
}

/* MoE down. Grid: x = ceil(m / (2 G WARPS 32 / seg_for(units))), y = plan group; rows of the
 * pairs' part rows; the warp's rows as k_gemv_q8's. QF: h comes as float32 rows (hf), which the
 * CTA quantizes into shared memory first (stage_rows; P = 1), and the warps read x there.
 * One vector of float32 rows (decode): three CTAs an SM, as k_gemv_q8, so that a token's 8
 * experts of 6144 rows at a TP 8 rank's k = 256 (384 CTAs) run in one wave, not in 1.45 waves of
 * the 264 slots that 2 CTAs of Q5_K's 85 registers give (sm_90 ptxas at 80: no spills for Q4_K
 * and Q5_K; Q8_0 would spill 36-60 bytes and keeps two). */
template <int T, int NV, int G, int P, bool QF = false>
__global__ void __launch_bounds__(WARPS * 32, NV == 1 && QF && T != QT_Q8_0 ? 3 : 2)
    k_down_q8(const uint8_t *__restrict__ w, int64_t rb, int64_t m, int units, const int32_t *__restrict__ plan,
              int n_pairs, const int8_t *__restrict__ hq, int64_t ldq, const float *__restrict__ hds, int64_t ldds,
              float *__restrict__ part, int64_t ldp, const float *__restrict__ hf, int64_t ldhf) {
    constexpr int R = 2;
    static_assert(!QF || P == 1, "k_down_q8: float32 rows are quantized to one plane");
    const PlanView pv(plan, n_pairs);
    const int grp = blockIdx.y;
    if (grp >= pv.n_groups()) return;
    const int lane = threadIdx.x & 31;
    const int64_t wi = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5);
    const int e = pv.expert(grp), pos0 = pv.start(grp), nvec = pv.count(grp);
    const uint8_t *we = w + (int64_t)e * m * rb;
    extern __shared__ __align__(16) uint8_t dsx[]; /* QF: [nvec][units][XS_UNIT] */
    if constexpr (QF) stage_rows<1>([&](int v) { return hf + (int64_t)pv.pair(pos0 + v) * ldhf; }, nvec, units, dsx);
    Xrow xv[NV];
#pragma unroll
    for (int v = 0; v < NV; v++) {
        const int64_t p = v < nvec ? pv.pair(pos0 + v) : 0;
        xv[v] = QF ? Xrow{nullptr, nullptr} : Xrow{hq + p * ldq, hds + p * ldds};
    }
    const int span = G == 4 ? 32 : seg_for(units), ns = 32 / span, ul = lane & (span - 1); /* as k_gemv_q8 */
    const int64_t sr = (int64_t)(lane / span) * R;
#pragma unroll
    for (int gi = 0; gi < G; gi++) {
        const int64_t r0 = (wi * G + gi) * R * ns;
        if (r0 >= m) return;
        const uint8_t *rowp[R];
#pragma unroll
        for (int r = 0; r < R; r++) rowp[r] = we + (r0 + sr + r < m ? r0 + sr + r : m - 1) * rb;
        float acc[R][NV] = {};
        rows_dot<T, R, NV, P, QF>(rowp, units, xv, nvec, ul, span, acc, dsx);
        warp_sum_asc<R, NV>(acc, span);
        for (int i = ul; i < R * NV; i += span) {
            const float val = pick<R, NV>(acc, i);
            const int r = i / NV, v = i % NV;
            if (v < nvec && r0 + sr + r < m) part[(int64_t)pv.pair(pos0 + v) * ldp + r0 + sr + r] = val;
        }
    }
}

} // namespace q8

/* The launch of one kernel instance: L<T, NV, G, P>::run. run_type picks the instance of a call
 * from the weight type, the vector width nv (1, 2, 4 or 8 up to MAXNV), the row groups of k
 * (q8::groups_for) and the planes of x. */
template <template <int, int, int, int> class L, int T, int NV, class A>
static void run_gp(const A *a, int64_t rb, int units, int planes, cudaStream_t st) {
    const bool g4 = q8::groups_for(units) == 4;
    if (planes == 2) {
        if (g4) L<T, NV, 4, 2>::run(a, rb, st);
        else L<T, NV, 1, 2>::run(a, rb, st);
    } else {
        if (g4) L<T, NV, 4, 1>::run(a, rb, st);
        else L<T, NV, 1, 1>::run(a, rb, st);
    }
}
template <template <int, int, int, int> class L, int MAXNV, int T, class A>
static void run_nv(const A *a, int nv, int64_t rb, int units, int planes, cudaStream_t st) {
    static_assert(MAXNV == 4 || MAXNV == 8, "run_nv: widths 1, 2, 4 (, 8)");
    if (nv <= 1) run_gp<L, T, 1>(a, rb, units, planes, st);
    else if (nv <= 2) run_gp<L, T, 2>(a, rb, units, planes, st);
    else if (MAXNV == 4 || nv <= 4) run_gp<L, T, 4>(a, rb, units, planes, st);
    else if constexpr (MAXNV == 8) run_gp<L, T, 8>(a, rb, units, planes, st);
}

template <int T, int NV, int G, int P> struct GemvL {
    static void run(const cuk_gemv_q8_args *a, int64_t rb, cudaStream_t st) {
        const int64_t per = 2 * G * q8::WARPS * (32 / q8::seg_for((int)(a->k / 64))),
                      mt = a->w2 ? 2 * a->m : a->m, grid = (mt + per - 1) / per;
        q8::k_gemv_q8<T, NV, G, P><<<(unsigned)grid, q8::WARPS * 32, 0, st>>>(
            (const uint8_t *)a->w, rb, a->m, (int)(a->k / 64), a->x.q, a->x.ldq, a->x.ds, a->x.ldds, a->n, a->y,
            a->ldy, (const uint8_t *)a->w2, a->y2, q8::XfIn{});
    }
};

/* Kernel K opted into all the shared memory the device gives a block, once per device and
 * instance (K itself is the template argument: one flag per kernel, not per signature); a failure
 * shows as the launch's error. */
template <auto K> static void xs_optin() {
    static bool raised[CUK_MAX_DEVICES];
    const int slot = cuk_device_slot();
    if (!raised[slot]) {
        (void)cudaFuncSetAttribute(K, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)cuk_device_smem_cap((size_t)227 * 1024));
        raised[slot] = true;
    }
}

/* The XS form of GemvL (cuk_gemv_q8_xs): nvec x rows of both planes staged per CTA. */
template <int T, int NV, int G, int P> struct GemvXL {
    static void run(const cuk_gemv_q8_args *a, int64_t rb, cudaStream_t st) {
        const int units = (int)(a->k / 64);
        const size_t smem = (size_t)a->n * P * units * q8::XS_UNIT;
        xs_optin<q8::k_gemv_q8<T, NV, G, P, true>>();
        const int64_t per = 2 * G * q8::WARPS * (32 / q8::seg_for(units)), mt = a->w2 ? 2 * a->m : a->m,
                      grid = (mt + per - 1) / per;
        q8::k_gemv_q8<T, NV, G, P, true><<<(unsigned)grid, q8::WARPS * 32, smem, st>>>(
            (const uint8_t *)a->w, rb, a->m, units, a->x.q, a->x.ldq, a->x.ds, a->x.ldds, a->n, a->y, a->ldy,
            (const uint8_t *)a->w2, a->y2, q8::XfIn{});
    }
};

/* cuk_gemv_q8_xf: float32 x rows (XfArgs), quantized into the XS layout by each CTA. */
struct XfArgs {
    const cuk_gemv_q8_args *a;
    q8::XfIn in;
};
template <int T, int NV, int G, int P> struct GemvXFL {
    static void run(const XfArgs *f, int64_t rb, cudaStream_t st) {
        const cuk_gemv_q8_args *a = f->a;
        const int units = (int)(a->k / 64);
        const size_t smem = (size_t)a->n * P * units * q8::XS_UNIT;
        const int64_t per = 2 * G * q8::WARPS * (32 / q8::seg_for(units)), mt = a->w2 ? 2 * a->m : a->m,
                      grid = (mt + per - 1) / per;
        q8::k_gemv_q8<T, NV, G, P, true, true><<<(unsigned)grid, q8::WARPS * 32, smem, st>>>(
            (const uint8_t *)a->w, rb, a->m, units, nullptr, 0, nullptr, 0, a->n, a->y, a->ldy, (const uint8_t *)a->w2,
            a->y2, f->in);
    }
};

/* Vectors per launch from the batch: a plan group holds at most min(n_tok, CUK_MOE_GROUP). */
static inline int moe_nv(int n_tok) { return n_tok <= 1 ? 1 : n_tok <= 2 ? 2 : 4; }
static_assert(CUK_MOE_GROUP == 4, "moe_nv: groups of 4");

template <int T, int NV, int G, int P> struct GateUpL {
    static void run(const cuk_moe_gate_up_q8_args *a, int64_t rb, cudaStream_t st) {
        const int n_pairs = a->n_tok * a->top_k;
        const int64_t per = G * q8::WARPS;
        const dim3 grid((unsigned)((a->m + per - 1) / per), (unsigned)n_pairs);
        q8::k_gate_up_q8<T, NV, G, P><<<grid, q8::WARPS * 32, 0, st>>>(
            (const uint8_t *)a->w_gate, (const uint8_t *)a->w_up, rb, a->m, (int)(a->k / 64), a->plan, n_pairs,
            a->top_k, a->x.q, a->x.ldq, a->x.ds, a->x.ldds, a->out, a->ldo);
    }
};

template <int T, int NV, int G, int P> struct DownL {
    static void run(const cuk_moe_down_q8_args *a, int64_t rb, cudaStream_t st) {
        const int n_pairs = a->n_tok * a->top_k;
        const int64_t per = 2 * G * q8::WARPS * (32 / q8::seg_for((int)(a->k / 64)));
        const dim3 grid((unsigned)((a->m + per - 1) / per), (unsigned)n_pairs);
        q8::k_down_q8<T, NV, G, P><<<grid, q8::WARPS * 32, 0, st>>>((const uint8_t *)a->w, rb, a->m, (int)(a->k / 64),
                                                                 a->plan, n_pairs, a->h.q, a->h.ldq, a->h.ds,
                                                                 a->h.ldds, a->part, a->ldp, nullptr, 0);
    }
};

/* DownL with float32 rows (a->hf): the QF kernel, x staged per CTA (P is 1 here). */
template <int T, int NV, int G, int P> struct DownFL {
    static void run(const cuk_moe_down_q8_args *a, int64_t rb, cudaStream_t st) {
        const int n_pairs = a->n_tok * a->top_k, units = (int)(a->k / 64);
        const int64_t per = 2 * G * q8::WARPS * (32 / q8::seg_for(units));
        const dim3 grid((unsigned)((a->m + per - 1) / per), (unsigned)n_pairs);
        const size_t smem = (size_t)NV * units * q8::XS_UNIT;
        q8::k_down_q8<T, NV, G, 1, true><<<grid, q8::WARPS * 32, smem, st>>>(
            (const uint8_t *)a->w, rb, a->m, units, a->plan, n_pairs, nullptr, 0, nullptr, 0, a->part, a->ldp, a->hf,
            a->ldhf);
    }
};

/* The low-bit types' launches (gemv_q8_lb*.cu): kind Q8_GEMV takes a cuk_gemv_q8_args, Q8_GATE_UP
 * a cuk_moe_gate_up_q8_args, Q8_DOWN a cuk_moe_down_q8_args; nv as run_nv's. Each returns 1 where
 * its file holds type t (and launched), else 0. */
enum { Q8_GEMV, Q8_GATE_UP, Q8_DOWN };
int q8_lb_run_a(int kind, uint32_t t, const void *a, int nv, int64_t rb, int64_t k, int planes, cudaStream_t st);
int q8_lb_run_b(int kind, uint32_t t, const void *a, int nv, int64_t rb, int64_t k, int planes, cudaStream_t st);
int q8_lb_run_c(int kind, uint32_t t, const void *a, int nv, int64_t rb, int64_t k, int planes, cudaStream_t st);

} // namespace cuk

#endif
