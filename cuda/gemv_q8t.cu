/* int8 tensor-core GEMV for fast-mode decode (issue 14; API cuda/cuk_q8.h, cuk_gemv_q8t):
 * y[v] = W x'[v] for up to CUK_Q8T_MAX_N int8 rows x' of cuk_q8_quantize (one or two planes).
 * The weights (Q4_K, Q5_K, Q6_K, Q8_0) are decoded in registers into int8 mma fragments and
 * multiplied by mma.sync m16n8k32 s8 (m16n8k16 for Q6_K, whose scales cover 16 elements): the x
 * rows and planes are the mma's columns, so the weights are read and decoded once for all of
 * them, where the dp4a kernels (gemv_q8.cu) repeat the integer work per vector.
 *
 * Numerics: each weight sub-block's integer dot product with x's int8 block is exact in int32;
 * the accumulator starts at the bit pattern of 1.5 * 2^23, so read as float32 it is exactly
 * 1.5 * 2^23 + dot (|dot| < 2^22 for every type here) and one subtraction gives float(dot) exactly.
 * It is then scaled by x's d and the weight scale and added (float32, fma) to the output's sum;
 * the K-quant min term subtracts the weight min times x's s. Two planes: the second plane's
 * products are summed apart and added to the first's at the end.
 *
 * Grid: ceil(ceil(m / 16) * KW / 8) CTAs of 8 warps. A warp takes a tile of 16 rows (lane l, g =
 * l / 4, c = l % 4: rows g and g + 8, the mma's C columns 2c and 2c + 1, B column g) and one of KW
 * contiguous ranges of the rows' 256-element steps, loading step s + 1 while it multiplies step s;
 * the KW partial sums of a tile are added in shared memory in range order. In a 32-element
 * sub-block the mma's k positions 4c..4c+3 and 16+4c..16+4c+3 hold elements 8c..8c+7 (for A and
 * B alike), so a lane reads 8 consecutive bytes of a row. KW and the k order depend on (m, k)
 * only: a vector's bits never depend on n or on its column. */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/cuk_internal.cuh"
#include "cuda/cuk_q8.h"
#include "cuda/q8_load.cuh"

namespace cuk {
namespace q8t {

constexpr int WARPS = 8;
constexpr int BIAS_I = 0x4B400000; /* 1.5 * 2^23 as float bits */
constexpr float BIAS_F = 12582912.0f;

using q8l::h2f;
using q8l::k4_scale;
using q8l::ldg128;
using q8l::ldg32;
using q8l::ldg64;
using q8l::ldg_f4;

/* 4 bytes from a 2-byte aligned address (two aligned words; reads up to 2 bytes past p + 4). */
__device__ __forceinline__ uint32_t ld32_a2(const uint8_t *p) {
    const uint32_t *a = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
    return __funnelshift_r(ldg32(a), ldg32(a + 1), ((uint32_t)(uintptr_t)p & 2u) * 8u);
}

/* r = float(A B) of one m16n8k32 s8 product, exact (see the top comment). */
__device__ __forceinline__ void mma32(float (&r)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    uint32_t o[4];
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};\n"
        : "=r"(o[0]), "=r"(o[1]), "=r"(o[2]), "=r"(o[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(BIAS_I));
#pragma unroll
    for (int i = 0; i < 4; i++) r[i] = __uint_as_float(o[i]) - BIAS_F;
}
/* The same for m16n8k16 s8 (A: a0 row g, a1 row g + 8, k 4c..4c+3; B: k 4c..4c+3 of column g). */
__device__ __forceinline__ void mma16(float (&r)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
    uint32_t o[4];
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};\n"
        : "=r"(o[0]), "=r"(o[1]), "=r"(o[2]), "=r"(o[3])
        : "r"(a0), "r"(a1), "r"(b0), "r"(BIAS_I));
#pragma unroll
    for (int i = 0; i < 4; i++) r[i] = __uint_as_float(o[i]) - BIAS_F;
}

/* The x side of a lane: per column tile t, the byte offset of its B column's int8 row (plane
 * included) and the float offsets of its two C columns' (d, s) rows. */
template <int NT> struct Cols {
    const int8_t *xq;
    const float *xds;
    uint32_t q[NT], ds[NT][2];
};

/* ---- one 256-element step of the lane's two rows, per weight type ---- */

template <int T> struct Step;

template <> struct Step<QT_Q4_K> {
    uint4 h[2];    /* d, dmin, 12 scale bytes */
    uint2 q[2][4]; /* bytes 8c..8c+7 of quant pair j */
    __device__ void load(const uint8_t *const (&rp)[2], int64_t s, int c) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const uint8_t *bp = rp[r] + s * 144;
            h[r] = ldg128(bp);
#pragma unroll
            for (int j = 0; j < 4; j++) q[r][j] = ldg64(bp + 16 + 32 * j + 8 * c);
        }
    }
};
template <> struct Step<QT_Q5_K> {
    uint4 h[2];
    uint2 qh[2];   /* high-bit bytes 8c..8c+7 */
    uint2 q[2][4];
    __device__ void load(const uint8_t *const (&rp)[2], int64_t s, int c) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const uint8_t *bp = rp[r] + s * 176;
            h[r] = ldg128(bp);
            qh[r] = ldg64(bp + 16 + 8 * c);
#pragma unroll
            for (int j = 0; j < 4; j++) q[r][j] = ldg64(bp + 48 + 32 * j + 8 * c);
        }
    }
};
/* Q6_K: unit u (half h = u / 2, run i = u % 2) holds elements 128h + 32q + 16i + 4c..+3 of the
 * four quarters q: low/high nibbles of la (q = 0, 2) and lb (q = 1, 3), two bits each of hq. */
template <> struct Step<QT_Q6_K> {
    uint32_t la[2][4], lb[2][4], hq[2][4], sc[2][4], d[2];
    __device__ void load(const uint8_t *const (&rp)[2], int64_t s, int c) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const uint8_t *bp = rp[r] + s * 210;
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int h = u >> 1, i = u & 1;
                la[r][u] = ld32_a2(bp + 64 * h + 16 * i + 4 * c);
                lb[r][u] = ld32_a2(bp + 64 * h + 32 + 16 * i + 4 * c);
                hq[r][u] = ld32_a2(bp + 128 + 32 * h + 16 * i + 4 * c);
            }
#pragma unroll
            for (int w = 0; w < 4; w++) sc[r][w] = ld32_a2(bp + 192 + 4 * w);
            const uint8_t *dp = bp + 208;
            d[r] = ldg32((const uint32_t *)((uintptr_t)dp & ~(uintptr_t)3)) >> (((uint32_t)(uintptr_t)dp & 2u) * 8u);
        }
    }
};
/* Q8_0: 8 blocks of 34 bytes from a 4-byte boundary, as 4 pairs of 68 bytes; per pair and row the
 * d of both blocks and the lane's 8 bytes of each. */
template <> struct Step<QT_Q8_0> {
    uint32_t dd[2][4], lo[2][4][2], hi[2][4][2];
    __device__ void load(const uint8_t *const (&rp)[2], int64_t s, int c) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const uint32_t *pw = (const uint32_t *)(rp[r] + s * 272);
#pragma unroll
            for (int p = 0; p < 4; p++) {
                const uint32_t *w = pw + 17 * p;
                const uint32_t w0 = ldg32(w), w8 = ldg32(w + 8);
                const uint32_t a0 = ldg32(w + 2 * c), a1 = ldg32(w + 2 * c + 1), a2 = ldg32(w + 2 * c + 2);
                dd[r][p] = (w0 & 0xFFFFu) | (w8 & 0xFFFF0000u);
                lo[r][p][0] = __funnelshift_r(a0, a1, 16);
                lo[r][p][1] = __funnelshift_r(a1, a2, 16);
                hi[r][p][0] = ldg32(w + 9 + 2 * c);
                hi[r][p][1] = ldg32(w + 10 + 2 * c);
            }
        }
    }
};

/* A pair of 32-element sub-blocks (x elements xo.. and xo + 32..) against every column tile:
 * a[sb] the A fragments, ws/wm[row][sb] the weight scales and mins (wm unused when MIN is 0). */
template <int NT, int P, bool MIN>
__device__ __forceinline__ void pair_tiles(const uint32_t (&a)[2][4], const float (&ws)[2][2], const float (&wm)[2][2],
                                           const Cols<NT> &cl, int64_t xo, int c, float (&acc)[NT][4]) {
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float4 e0 = ldg_f4(cl.xds + cl.ds[t][0] + xo / 16), e1 = ldg_f4(cl.xds + cl.ds[t][1] + xo / 16);
#pragma unroll
        for (int sb = 0; sb < 2; sb++) {
            const uint2 b = ldg64(cl.xq + cl.q[t] + xo + 32 * sb + 8 * c);
            float r[4];
            mma32(r, a[sb], b.x, b.y);
            const float dx0 = sb ? e0.z : e0.x, sx0 = sb ? e0.w : e0.y;
            const float dx1 = sb ? e1.z : e1.x, sx1 = sb ? e1.w : e1.y;
            acc[t][0] = fmaf(ws[0][sb], dx0 * r[0], acc[t][0]);
            acc[t][1] = fmaf(ws[0][sb], dx1 * r[1], acc[t][1]);
            acc[t][2] = fmaf(ws[1][sb], dx0 * r[2], acc[t][2]);
            acc[t][3] = fmaf(ws[1][sb], dx1 * r[3], acc[t][3]);
            if (MIN) {
                acc[t][0] = fmaf(-wm[0][sb], sx0, acc[t][0]);
                acc[t][2] = fmaf(-wm[1][sb], sx0, acc[t][2]);
                if (P == 1) { /* P = 2: column 1 is the second plane, whose s is 0 */
                    acc[t][1] = fmaf(-wm[0][sb], sx1, acc[t][1]);
                    acc[t][3] = fmaf(-wm[1][sb], sx1, acc[t][3]);
                }
            }
        }
    }
}

template <int NT, int P>
__device__ __forceinline__ void step_mma(const Step<QT_Q4_K> &w, const Cols<NT> &cl, int64_t s, int c,
                                         float (&acc)[NT][4]) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
        float ws[2][2], wm[2][2];
        uint32_t a[2][4];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            k4_scale(w.h[r], 2 * j, ws[r][0], wm[r][0]);
            k4_scale(w.h[r], 2 * j + 1, ws[r][1], wm[r][1]);
            const uint2 q = w.q[r][j];
            a[0][r] = q.x & 0x0F0F0F0Fu;
            a[0][2 + r] = q.y & 0x0F0F0F0Fu;
            a[1][r] = (q.x >> 4) & 0x0F0F0F0Fu;
            a[1][2 + r] = (q.y >> 4) & 0x0F0F0F0Fu;
        }
        pair_tiles<NT, P, true>(a, ws, wm, cl, s * 256 + 64 * j, c, acc);
    }
}

template <int NT, int P>
__device__ __forceinline__ void step_mma(const Step<QT_Q5_K> &w, const Cols<NT> &cl, int64_t s, int c,
                                         float (&acc)[NT][4]) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
        float ws[2][2], wm[2][2];
        uint32_t a[2][4];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            k4_scale(w.h[r], 2 * j, ws[r][0], wm[r][0]);
            k4_scale(w.h[r], 2 * j + 1, ws[r][1], wm[r][1]);
            const uint2 q = w.q[r][j], qh = w.qh[r];
            a[0][r] = (q.x & 0x0F0F0F0Fu) | (((qh.x >> (2 * j)) & 0x01010101u) << 4);
            a[0][2 + r] = (q.y & 0x0F0F0F0Fu) | (((qh.y >> (2 * j)) & 0x01010101u) << 4);
            a[1][r] = ((q.x >> 4) & 0x0F0F0F0Fu) | (((qh.x >> (2 * j + 1)) & 0x01010101u) << 4);
            a[1][2 + r] = ((q.y >> 4) & 0x0F0F0F0Fu) | (((qh.y >> (2 * j + 1)) & 0x01010101u) << 4);
        }
        pair_tiles<NT, P, true>(a, ws, wm, cl, s * 256 + 64 * j, c, acc);
    }
}

template <int NT, int P>
__device__ __forceinline__ void step_mma(const Step<QT_Q8_0> &w, const Cols<NT> &cl, int64_t s, int c,
                                         float (&acc)[NT][4]) {
#pragma unroll
    for (int p = 0; p < 4; p++) {
        float ws[2][2];
        uint32_t a[2][4];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            ws[r][0] = h2f(w.dd[r][p]);
            ws[r][1] = h2f(w.dd[r][p] >> 16);
            a[0][r] = w.lo[r][p][0];
            a[0][2 + r] = w.lo[r][p][1];
            a[1][r] = w.hi[r][p][0];
            a[1][2 + r] = w.hi[r][p][1];
        }
        pair_tiles<NT, P, false>(a, ws, ws, cl, s * 256 + 64 * p, c, acc);
    }
}

template <int NT, int P>
__device__ __forceinline__ void step_mma(const Step<QT_Q6_K> &w, const Cols<NT> &cl, int64_t s, int c,
                                         float (&acc)[NT][4]) {
    float d[2];
#pragma unroll
    for (int r = 0; r < 2; r++) d[r] = h2f(w.d[r]);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        /* x blocks 8s + 4h + q (q = 0..3): (d, s) pairs, per C column */
        float4 e[NT][2][2];
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int col = 0; col < 2; col++) {
                e[t][col][0] = ldg_f4(cl.xds + cl.ds[t][col] + s * 16 + 8 * h);
                e[t][col][1] = ldg_f4(cl.xds + cl.ds[t][col] + s * 16 + 8 * h + 4);
            }
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int u = 2 * h + i;
#pragma unroll
            for (int q = 0; q < 4; q++) {
                uint32_t a[2];
                float ws[2];
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const uint32_t l = q & 1 ? w.lb[r][u] : w.la[r][u];
                    const uint32_t nib = q < 2 ? l & 0x0F0F0F0Fu : (l >> 4) & 0x0F0F0F0Fu;
                    const uint32_t hb = ((w.hq[r][u] >> (2 * q)) & 0x03030303u) << 4;
                    a[r] = __vsub4(nib | hb, 0x20202020u); /* q6 - 32 as int8 */
                    const int sb = 8 * h + i + 2 * q;
                    ws[r] = d[r] * (float)(int8_t)((w.sc[r][sb >> 2] >> (8 * (sb & 3))) & 0xFFu);
                }
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    const uint32_t b = ldg32(cl.xq + cl.q[t] + s * 256 + 128 * h + 32 * q + 16 * i + 4 * c);
                    float r4[4];
                    mma16(r4, a[0], a[1], b);
                    const float dx0 = (q & 1) ? e[t][0][q >> 1].z : e[t][0][q >> 1].x;
                    const float dx1 = (q & 1) ? e[t][1][q >> 1].z : e[t][1][q >> 1].x;
                    acc[t][0] = fmaf(ws[0], dx0 * r4[0], acc[t][0]);
                    acc[t][1] = fmaf(ws[0], dx1 * r4[1], acc[t][1]);
                    acc[t][2] = fmaf(ws[1], dx0 * r4[2], acc[t][2]);
                    acc[t][3] = fmaf(ws[1], dx1 * r4[3], acc[t][3]);
                }
            }
        }
    }
}

/* The GEMV (grid and lanes: the top comment). steps = k / 256; kw = warps per tile (1, 2, 4, 8). */
template <int T, int NT, int P>
__global__ void __launch_bounds__(WARPS * 32, NT <= 2 ? 2 : 1)
    k_gemv_q8t(const uint8_t *__restrict__ w, int64_t rb, int64_t m, int steps, int kw, const int8_t *__restrict__ xq,
               int64_t ldq, const float *__restrict__ xds, int64_t ldds, int64_t k, int n, float *__restrict__ y,
               int64_t ldy) {
    __shared__ float red[WARPS][NT * 4][32];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const int ks = wid % kw;
    const int64_t row0 = ((int64_t)blockIdx.x * (WARPS / kw) + wid / kw) * 16;
    const bool live = row0 < m;
    const int64_t ra = row0 + g < m ? row0 + g : m - 1, rb8 = row0 + g + 8 < m ? row0 + g + 8 : m - 1;
    const uint8_t *rp[2] = {w + ra * rb, w + rb8 * rb};
    Cols<NT> cl;
    cl.xq = xq;
    cl.xds = xds;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const int col = 8 * t + g;
        int v = P == 2 ? col >> 1 : col;
        v = v < n ? v : n - 1; /* columns past n compute a copy of the last one, never stored */
        cl.q[t] = (uint32_t)(v * ldq + (P == 2 ? (col & 1) * k : 0));
        if (P == 2) {
            const int u = 4 * t + c < n ? 4 * t + c : n - 1;
            cl.ds[t][0] = (uint32_t)(u * ldds);
            cl.ds[t][1] = (uint32_t)(u * ldds + k / 16);
        } else {
            const int u0 = 8 * t + 2 * c < n ? 8 * t + 2 * c : n - 1, u1 = 8 * t + 2 * c + 1 < n ? 8 * t + 2 * c + 1 : n - 1;
            cl.ds[t][0] = (uint32_t)(u0 * ldds);
            cl.ds[t][1] = (uint32_t)(u1 * ldds);
        }
    }
    float acc[NT][4] = {};
    const int s0 = (int)((int64_t)steps * ks / kw), s1 = (int)((int64_t)steps * (ks + 1) / kw);
    if (live && s0 < s1) {
        Step<T> cur;
        cur.load(rp, s0, c);
        for (int s = s0; s < s1; s++) {
            Step<T> nxt;
            if (s + 1 < s1) nxt.load(rp, s + 1, c);
            step_mma<NT, P>(cur, cl, s, c, acc);
            cur = nxt;
        }
    }
    if (kw > 1) {
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int i = 0; i < 4; i++) red[wid][4 * t + i][lane] = acc[t][i];
        __syncthreads();
        if (ks != 0) return;
        for (int j = 1; j < kw; j++)
#pragma unroll
            for (int t = 0; t < NT; t++)
#pragma unroll
                for (int i = 0; i < 4; i++) acc[t][i] += red[wid + j][4 * t + i][lane];
    }
    if (!live) return;
    const int64_t r_lo = row0 + g, r_hi = row0 + g + 8;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (P == 2) {
            const int v = 4 * t + c;
            if (v < n) {
                if (r_lo < m) y[(int64_t)v * ldy + r_lo] = acc[t][0] + acc[t][1];
                if (r_hi < m) y[(int64_t)v * ldy + r_hi] = acc[t][2] + acc[t][3];
            }
        } else {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int v = 8 * t + 2 * c + e;
                if (v < n) {
                    if (r_lo < m) y[(int64_t)v * ldy + r_lo] = acc[t][e];
                    if (r_hi < m) y[(int64_t)v * ldy + r_hi] = acc[t][2 + e];
                }
            }
        }
    }
}

/* Warps per 16-row tile from the shape alone: split k until about 2048 warps run (16 per SM of
 * an H200), while every warp keeps at least 2 steps. */
static int kw_for(int64_t m, int64_t k) {
    const int64_t tiles = (m + 15) / 16, steps = k / 256;
    int kw = 1;
    while (kw < 8 && tiles * kw < 2048 && steps >= 4 * kw) kw *= 2;
    return kw;
}

template <int T, int NT, int P>
static void launch(const cuk_gemv_q8_args *a, int64_t rb, cudaStream_t st) {
    const int kw = kw_for(a->m, a->k);
    const int64_t tiles = (a->m + 15) / 16, per = WARPS / kw;
    k_gemv_q8t<T, NT, P><<<(unsigned)((tiles + per - 1) / per), WARPS * 32, 0, st>>>(
        (const uint8_t *)a->w, rb, a->m, (int)(a->k / 256), kw, a->x.q, a->x.ldq, a->x.ds, a->x.ldds, a->k, a->n, a->y,
        a->ldy);
}

template <int T, int P> static void launch_nt(const cuk_gemv_q8_args *a, int64_t rb, cudaStream_t st) {
    const int cols = a->n * P;
    if (cols <= 8) launch<T, 1, P>(a, rb, st);
    else if (cols <= 16) launch<T, 2, P>(a, rb, st);
    else if (cols <= 32 || P == 1) launch<T, 4, P>(a, rb, st);
    else if constexpr (P == 2) launch<T, 8, P>(a, rb, st);
}

template <int T> static void launch_p(const cuk_gemv_q8_args *a, int64_t rb, cudaStream_t st) {
    if (a->x.planes == 2) launch_nt<T, 2>(a, rb, st);
    else launch_nt<T, 1>(a, rb, st);
}

} // namespace q8t
} // namespace cuk

using namespace cuk;

#define BAD(...) g5_fail(err, G5_ERR_INVALID_ARG, __VA_ARGS__)

extern "C" int cuk_q8t_takes(uint32_t t, int64_t k) {
    if (k <= 0 || k > (1LL << 24) || k % 256) return 0;
    return t == QT_Q4_K || t == QT_Q5_K || t == QT_Q6_K || t == QT_Q8_0;
}

extern "C" g5_status cuk_gemv_q8t(const cuk_gemv_q8_args *a, cuk_stream stream, g5_error *err) {
    if (!a) return BAD("gemv_q8t: args is NULL");
    if (!cuk_q8t_takes(a->w_type, a->k))
        return BAD("gemv_q8t: type %s with k=%lld has no int8 tensor-core kernel", quant_type_name(a->w_type),
                   (long long)a->k);
    if (!a->w || (uintptr_t)a->w % 16) return BAD("gemv_q8t: weights NULL or not 16-byte aligned");
    if (a->m <= 0 || a->m > (1LL << 31)) return BAD("gemv_q8t: m=%lld outside 1..2^31", (long long)a->m);
    uint64_t rb = 0, tot = 0;
    if (quant_row_bytes(a->w_type, (uint64_t)a->k, &rb) != G5_OK || g5_mul_u64(rb, (uint64_t)a->m, &tot))
        return BAD("gemv_q8t: m=%lld rows of k=%lld overflow", (long long)a->m, (long long)a->k);
    if (a->n < 1 || a->n > CUK_Q8T_MAX_N) return BAD("gemv_q8t: n=%d outside 1..%d", (int)a->n, CUK_Q8T_MAX_N);
    const cuk_q8_act *x = &a->x;
    if (!x->q || !x->ds) return BAD("gemv_q8t: x.q or x.ds is NULL");
    if ((uintptr_t)x->q % 16 || (uintptr_t)x->ds % 16) return BAD("gemv_q8t: x is not 16-byte aligned");
    if (x->planes != 1 && x->planes != 2) return BAD("gemv_q8t: x.planes=%d is neither 1 nor 2", (int)x->planes);
    if (x->ldq < x->planes * a->k || x->ldq % 16)
        return BAD("gemv_q8t: x.ldq=%lld must be >= %lld and a multiple of 16", (long long)x->ldq,
                   (long long)(x->planes * a->k));
    if (x->ldds < x->planes * (a->k / 16) || x->ldds % 4)
        return BAD("gemv_q8t: x.ldds=%lld must be >= %lld and a multiple of 4", (long long)x->ldds,
                   (long long)(x->planes * (a->k / 16)));
    /* the kernel's 32-bit x offsets */
    if ((uint64_t)a->n * (uint64_t)x->ldq > 0xFFFFFFFFull || (uint64_t)a->n * (uint64_t)x->ldds > 0x3FFFFFFFull)
        return BAD("gemv_q8t: x of %d rows exceeds 4 GB", (int)a->n);
    if (!a->y) return BAD("gemv_q8t: y is NULL");
    if (a->ldy < a->m) return BAD("gemv_q8t: ldy=%lld < m=%lld", (long long)a->ldy, (long long)a->m);
    const cudaStream_t st = (cudaStream_t)stream;
    switch (a->w_type) {
    case QT_Q4_K: q8t::launch_p<QT_Q4_K>(a, (int64_t)rb, st); break;
    case QT_Q5_K: q8t::launch_p<QT_Q5_K>(a, (int64_t)rb, st); break;
    case QT_Q6_K: q8t::launch_p<QT_Q6_K>(a, (int64_t)rb, st); break;
    default: q8t::launch_p<QT_Q8_0>(a, (int64_t)rb, st); break;
    }
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}
