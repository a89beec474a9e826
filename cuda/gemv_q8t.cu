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
 * From there every output is built as the dp4a kernel builds it (cuda/cuk_q8.h: unit values of
 * q8_load.cuh, per-residue sums in unit order, the pairwise tree over the 32 residues), so its bits
 * are cuk_gemv_q8's. A first version summed in k order with fma (the same speed: bench/RESULTS.md,
 * session 9) and could not be wired in, because a batched row must keep its one-row bits.
 *
 * Grid: ceil(ceil(m / 16) * KW / 8) CTAs of 8 warps. A warp takes a tile of 16 rows (lane l, g =
 * l / 4, c = l % 4: rows g and g + 8, the mma's C columns 2c and 2c + 1, B column g) and 8 / KW of
 * the 8 residue groups (group G: the 256-element steps G, G + 8, G + 16, .., each four units, one
 * per residue 4G .. 4G + 3), loading the next step while it multiplies this one; the KW warps'
 * subtrees of a tile are merged in shared memory, pairwise in group order. In a 32-element
 * sub-block the mma's k positions 4c..4c+3 and 16+4c..16+4c+3 hold elements 8c..8c+7 (for A and
 * B alike), so a lane reads 8 consecutive bytes of a row. KW depends on (m, k) only.
 *
 * A second form, k_gemv_q8t_sx, for 9..32 columns of matrices of >= 12288 rows: a CTA's 8 warps
 * take 8 tiles of one k-range (the same groups and order), the CTA stages that range's x columns
 * in shared memory once, and the ranges of a row block form a thread-block cluster whose subtrees
 * are merged pairwise in range order through distributed shared memory: the same bits. The first
 * form reads x through L1 per warp and is bound by it there (ncu: L1 83% busy, 8 warps per SM);
 * on short matrices and at few columns it stays faster (bench/RESULTS.md, session 23).
 *
 * On shorter matrices at more than 8 columns the first form reads x re-laid out by one launch more
 * (k_x_frag, into the caller's scratch) in mma-fragment order: a warp's B fragment is one 256-byte
 * read instead of 8 rows' 8 bytes, its (d, s) pairs one line; the same loops and bits, 1.0-1.35x
 * faster at 16-64 columns (session 24). Two planes of 17-32 vectors (64 columns) take that form with
 * 8 tiles, one launch where 4 tiles took two (session 26), or the second form with 8 tiles on short
 * rows of tall matrices and on short matrices (sx8_by_shape; sessions 39 and 40). */
#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

#include "cuda/cuk_internal.cuh"
#include "cuda/cuk_q8.h"
#include "cuda/mma.cuh"
#include "cuda/moe_plan.cuh"
#include "cuda/q8_load.cuh"
#include "cuda/q8_quant.cuh"
#include "cuda/q8t_order.h"

namespace cg = cooperative_groups;

namespace cuk {
namespace q8t {

constexpr int WARPS = 8;
constexpr int BIAS_I = 0x4B400000; /* 1.5 * 2^23 as float bits */
constexpr float BIAS_F = 12582912.0f;

using q8l::h2f;
using q8l::k4_scale_of;
using q8l::k4_unpack;
using q8l::K4Hdr;
using q8l::ldg128;
using q8l::ldg32;
using q8l::ldg64;
using q8l::ldg_f4;
using q8l::q6_add;
using q8l::unit_k4;
using q8l::unit_q8_0;

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

/* Where a step's weight bytes or x columns are read from: global memory (non-coherent loads), or
 * shared memory (the MoE kernel's weight stage, k_gemv_q8t_sx's x slots: the same layouts). */
struct Gld {
    static constexpr int XB = 32, DU = 4; /* x: address step of a 32-element sub-block (bytes), of a unit's (d, s) (floats) */
    static __device__ __forceinline__ uint4 v4(const void *p) { return ldg128(p); }
    static __device__ __forceinline__ uint2 v2(const void *p) { return ldg64(p); }
    static __device__ __forceinline__ uint32_t w(const void *p) { return ldg32(p); }
    static __device__ __forceinline__ float4 f4(const float *p) { return ldg_f4(p); }
};
struct Sld {
    static constexpr int XB = 32, DU = 4;
    static __device__ __forceinline__ uint4 v4(const void *p) { return *(const uint4 *)p; }
    static __device__ __forceinline__ uint2 v2(const void *p) { return *(const uint2 *)p; }
    static __device__ __forceinline__ uint32_t w(const void *p) { return *(const uint32_t *)p; }
    static __device__ __forceinline__ float4 f4(const float *p) { return *(const float4 *)(const void *)p; }
};

template <> struct Step<QT_Q4_K> {
    uint4 h[2];    /* d, dmin, 12 scale bytes */
    uint2 q[2][4]; /* bytes 8c..8c+7 of quant pair j */
    template <class LD = Gld> __device__ void load(const uint8_t *const (&rp)[2], int64_t s, int c) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const uint8_t *bp = rp[r] + s * 144;
            h[r] = LD::v4(bp);
#pragma unroll
            for (int j = 0; j < 4; j++) q[r][j] = LD::v2(bp + 16 + 32 * j + 8 * c);
        }
    }
};
template <> struct Step<QT_Q5_K> {
    uint4 h[2];
    uint2 qh[2];   /* high-bit bytes 8c..8c+7 */
    uint2 q[2][4];
    template <class LD = Gld> __device__ void load(const uint8_t *const (&rp)[2], int64_t s, int c) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const uint8_t *bp = rp[r] + s * 176;
            h[r] = LD::v4(bp);
            qh[r] = LD::v2(bp + 16 + 8 * c);
#pragma unroll
            for (int j = 0; j < 4; j++) q[r][j] = LD::v2(bp + 48 + 32 * j + 8 * c);
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
    template <class LD = Gld> __device__ void load(const uint8_t *const (&rp)[2], int64_t s, int c) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const uint8_t *pw = rp[r] + s * 272;
#pragma unroll
            for (int p = 0; p < 4; p++) {
                const uint8_t *w = pw + 68 * p;
                const uint32_t w0 = LD::w(w), w8 = LD::w(w + 32);
                const uint32_t a0 = LD::w(w + 8 * c), a1 = LD::w(w + 8 * c + 4), a2 = LD::w(w + 8 * c + 8);
                dd[r][p] = (w0 & 0xFFFFu) | (w8 & 0xFFFF0000u);
                lo[r][p][0] = __funnelshift_r(a0, a1, 16);
                lo[r][p][1] = __funnelshift_r(a1, a2, 16);
                hi[r][p][0] = LD::w(w + 36 + 8 * c);
                hi[r][p][1] = LD::w(w + 40 + 8 * c);
            }
        }
    }
};

/* x re-laid out by k_x_frag in mma-fragment order (the fx launches): per 32-element sub-block and
 * column tile, 256 bytes [g][c][8], so a warp's B fragment is one contiguous 256-byte read instead
 * of 8 rows' 8 bytes each; per unit and tile 32 floats [c][column 2c, 2c + 1][d0 s0 d1 s1], a
 * lane's (d, s) pairs on one line. */
template <int NT> struct XF : Gld {
    static constexpr int XB = NT * 256, DU = NT * 32;
};

/* S += one unit's values f of the lane's four C elements (rows g, g + 8 x columns 2c, 2c + 1);
 * P = 2: the columns are a vector's two planes, added to one sum, plane 0 first (S[0], S[2]). */
template <int P> __device__ __forceinline__ void acc_unit(float (&S)[4], const float (&f)[4]) {
    if (P == 2) {
        S[0] = __fadd_rn(__fadd_rn(S[0], f[0]), f[1]);
        S[2] = __fadd_rn(__fadd_rn(S[2], f[2]), f[3]);
    } else {
#pragma unroll
        for (int e = 0; e < 4; e++) S[e] = __fadd_rn(S[e], f[e]);
    }
}

/* One unit (x elements xo .. xo + 63) against every column tile, into S: a[sb] the A fragments of
 * its two 32-element sub-blocks, ws/wm[row][sb] the weight scales and mins (K4: Q4_K, Q5_K) or
 * the two Q8_0 block scales (wm unused). step_units below: the 4 units of step s (64-element
 * units 4s .. 4s + 3, i.e. residues 4 (s % 8) + j) into S[j]. */
template <int NT, int P, bool K4, class XL>
__device__ __forceinline__ void unit_tiles(const uint32_t (&a)[2][4], const float (&ws)[2][2],
                                              const float (&wm)[2][2], const Cols<NT> &cl, int64_t xo, int c,
                                              float (&S)[NT][4]) {
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float4 e0 = XL::f4(cl.xds + cl.ds[t][0] + (xo / 64) * XL::DU),
                     e1 = XL::f4(cl.xds + cl.ds[t][1] + (xo / 64) * XL::DU);
        float r[2][4];
#pragma unroll
        for (int sb = 0; sb < 2; sb++) {
            const uint2 b = XL::v2(cl.xq + cl.q[t] + (xo / 32 + sb) * XL::XB + 8 * c);
            mma32(r[sb], a[sb], b.x, b.y);
        }
        float f[4];
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int row = e >> 1;
            const float4 x = e & 1 ? e1 : e0;
            f[e] = K4 ? unit_k4(ws[row][0], wm[row][0], ws[row][1], wm[row][1], x.x, x.y, x.z, x.w, r[0][e], r[1][e])
                      : unit_q8_0(ws[row][0], ws[row][1], x.x, x.z, r[0][e], r[1][e]);
        }
        acc_unit<P>(S[t], f);
    }
}

template <int NT, int P, class XL = Gld>
__device__ __forceinline__ void step_units(const Step<QT_Q4_K> &w, const Cols<NT> &cl, int64_t s, int c,
                                           float (&S)[4][NT][4]) {
    const K4Hdr kh[2] = {k4_unpack(w.h[0]), k4_unpack(w.h[1])};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        float ws[2][2], wm[2][2];
        uint32_t a[2][4];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            k4_scale_of(kh[r], 2 * j, ws[r][0], wm[r][0]);
            k4_scale_of(kh[r], 2 * j + 1, ws[r][1], wm[r][1]);
            const uint2 q = w.q[r][j];
            a[0][r] = q.x & 0x0F0F0F0Fu;
            a[0][2 + r] = q.y & 0x0F0F0F0Fu;
            a[1][r] = (q.x >> 4) & 0x0F0F0F0Fu;
            a[1][2 + r] = (q.y >> 4) & 0x0F0F0F0Fu;
        }
        unit_tiles<NT, P, true, XL>(a, ws, wm, cl, s * 256 + 64 * j, c, S[j]);
    }
}

template <int NT, int P, class XL = Gld>
__device__ __forceinline__ void step_units(const Step<QT_Q5_K> &w, const Cols<NT> &cl, int64_t s, int c,
                                           float (&S)[4][NT][4]) {
    const K4Hdr kh[2] = {k4_unpack(w.h[0]), k4_unpack(w.h[1])};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        float ws[2][2], wm[2][2];
        uint32_t a[2][4];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            k4_scale_of(kh[r], 2 * j, ws[r][0], wm[r][0]);
            k4_scale_of(kh[r], 2 * j + 1, ws[r][1], wm[r][1]);
            const uint2 q = w.q[r][j], qh = w.qh[r];
            a[0][r] = (q.x & 0x0F0F0F0Fu) | (((qh.x >> (2 * j)) & 0x01010101u) << 4);
            a[0][2 + r] = (q.y & 0x0F0F0F0Fu) | (((qh.y >> (2 * j)) & 0x01010101u) << 4);
            a[1][r] = ((q.x >> 4) & 0x0F0F0F0Fu) | (((qh.x >> (2 * j + 1)) & 0x01010101u) << 4);
            a[1][2 + r] = ((q.y >> 4) & 0x0F0F0F0Fu) | (((qh.y >> (2 * j + 1)) & 0x01010101u) << 4);
        }
        unit_tiles<NT, P, true, XL>(a, ws, wm, cl, s * 256 + 64 * j, c, S[j]);
    }
}

template <int NT, int P, class XL = Gld>
__device__ __forceinline__ void step_units(const Step<QT_Q8_0> &w, const Cols<NT> &cl, int64_t s, int c,
                                           float (&S)[4][NT][4]) {
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
        unit_tiles<NT, P, false, XL>(a, ws, ws, cl, s * 256 + 64 * p, c, S[p]);
    }
}

template <int NT, int P, class XL = Gld>
__device__ __forceinline__ void step_units(const Step<QT_Q6_K> &w, const Cols<NT> &cl, int64_t s, int c,
                                           float (&S)[4][NT][4]) {
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
                e[t][col][0] = XL::f4(cl.xds + cl.ds[t][col] + (4 * s + 2 * h) * XL::DU);
                e[t][col][1] = XL::f4(cl.xds + cl.ds[t][col] + (4 * s + 2 * h + 1) * XL::DU);
            }
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int u = 2 * h + i;
            float f[NT][4];
#pragma unroll
            for (int t = 0; t < NT; t++) f[t][0] = f[t][1] = f[t][2] = f[t][3] = 0.0f;
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
                    ws[r] = __fmul_rn(d[r], (float)(int8_t)((w.sc[r][sb >> 2] >> (8 * (sb & 3))) & 0xFFu));
                }
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    const uint32_t b = XL::w(cl.xq + cl.q[t] + (8 * s + 4 * h + q) * XL::XB + 16 * i + 4 * c);
                    float r4[4];
                    mma16(r4, a[0], a[1], b);
                    const float dx0 = (q & 1) ? e[t][0][q >> 1].z : e[t][0][q >> 1].x;
                    const float dx1 = (q & 1) ? e[t][1][q >> 1].z : e[t][1][q >> 1].x;
                    f[t][0] = q6_add(f[t][0], ws[0], dx0, r4[0]);
                    f[t][1] = q6_add(f[t][1], ws[0], dx1, r4[1]);
                    f[t][2] = q6_add(f[t][2], ws[1], dx0, r4[2]);
                    f[t][3] = q6_add(f[t][3], ws[1], dx1, r4[3]);
                }
            }
#pragma unroll
            for (int t = 0; t < NT; t++) acc_unit<P>(S[u][t], f[t]);
        }
    }
}

/* P = 2 sums a vector's two planes into C elements 0 and 2 (acc_unit): 1 and 3 carry nothing. At 8
 * column tiles every loop over the elements skips them, so they take no registers and 8 tiles fit
 * (narrower launches keep the code they had: the skip moved some of their spills around). */
template <int NT, int P> __device__ constexpr bool sum_elem(int e) { return !(P == 2 && NT == 8) || !(e & 1); }

/* One residue group's leaf (its four residue sums S: the dp4a warp butterfly's first two levels)
 * merged as leaf gi of the warp's range into the binary counter stk (stk[b]: a finished subtree of
 * 2^b leaves; bit b of gi set: v = stk[b] + v, the first clear bit stores v), the butterfly's last
 * three levels; res gets v, the range's whole tree after its last leaf. Both kernels below sum
 * through this, which keeps their bits the dp4a kernel's. */
template <int NT, int P = 1>
__device__ __forceinline__ void leaf_merge(const float (&S)[4][NT][4], int gi, float (&stk)[3][NT][4], float (&res)[NT][4]) {
    float v[NT][4];
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            v[t][e] = sum_elem<NT, P>(e) ? __fadd_rn(__fadd_rn(S[0][t][e], S[1][t][e]), __fadd_rn(S[2][t][e], S[3][t][e])) : 0.0f;
    bool stored = false;
#pragma unroll
    for (int b = 0; b < 3; b++) {
        if (stored) break;
        if ((gi >> b) & 1) {
#pragma unroll
            for (int t = 0; t < NT; t++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (sum_elem<NT, P>(e)) v[t][e] = __fadd_rn(stk[b][t][e], v[t][e]);
        } else {
#pragma unroll
            for (int t = 0; t < NT; t++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (sum_elem<NT, P>(e)) stk[b][t][e] = v[t][e];
            stored = true;
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int e = 0; e < 4; e++) res[t][e] = v[t][e];
}

/* A tile's finished sums into y (rows row0 + g and row0 + g + 8 of the lane's C columns; P = 2:
 * a vector's two planes are one sum, in the plane-0 columns). */
template <int NT, int P>
__device__ __forceinline__ void store_tile(const float (&res)[NT][4], float *__restrict__ y, int64_t ldy, int64_t m,
                                           int n, int64_t row0, int g, int c) {
    const int64_t r_lo = row0 + g, r_hi = row0 + g + 8;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (P == 2) {
            const int v = 4 * t + c;
            if (v < n) {
                if (r_lo < m) y[(int64_t)v * ldy + r_lo] = res[t][0];
                if (r_hi < m) y[(int64_t)v * ldy + r_hi] = res[t][2];
            }
        } else {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int v = 8 * t + 2 * c + e;
                if (v < n) {
                    if (r_lo < m) y[(int64_t)v * ldy + r_lo] = res[t][e];
                    if (r_hi < m) y[(int64_t)v * ldy + r_hi] = res[t][2 + e];
                }
            }
        }
    }
}

/* The GEMV (grid and lanes: the top comment). steps = k / 256; kw = warps per tile (1, 2, 4, 8),
 * warp ks of a tile taking the residue groups ks * 8 / kw .. (ks + 1) * 8 / kw - 1. */
template <int T, int NT, int P, class XL = Gld>
__global__ void __launch_bounds__(WARPS * 32, 1)
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
        if constexpr (XL::XB != 32) { /* the fragment layout */
            cl.q[t] = (uint32_t)(t * 256 + g * 32);
            cl.ds[t][0] = (uint32_t)(t * 32 + c * 8);
            cl.ds[t][1] = (uint32_t)(t * 32 + c * 8 + 4);
            continue;
        }
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
    /* Residue group G (0..7) = units 4 G .. 4 G + 3 of each 2048-element chunk = step s = G + 8 i of
     * chunk i: the dp4a kernel's lanes 4 G .. 4 G + 3. Per group the four residue sums run over the
     * chunks in order (S), the leaf (S0 + S1) + (S2 + S3) is the warp butterfly's first two levels,
     * and the leaves are merged pairwise in group order (a binary counter: stk[b] holds a finished
     * subtree of 2^b leaves), the butterfly's last three levels, finished across warps below. */
    const int ng = 8 / kw, G0 = ks * ng;
    float res[NT][4], stk[3][NT][4];
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int e = 0; e < 4; e++) res[t][e] = stk[0][t][e] = stk[1][t][e] = stk[2][t][e] = 0.0f;
    Step<T> cur;
    if (live && G0 < steps) cur.load(rp, G0, c);
    for (int gi = 0; gi < ng; gi++) {
        const int G = G0 + gi;
        float S[4][NT][4];
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int t = 0; t < NT; t++) S[j][t][0] = S[j][t][1] = S[j][t][2] = S[j][t][3] = 0.0f;
        if (live)
            for (int st = G; st < steps; st += 8) {
                const int sn = st + 8 < steps ? st + 8 : gi + 1 < ng && G + 1 < steps ? G + 1 : -1;
                Step<T> nxt;
                if (sn >= 0) nxt.load(rp, sn, c);
                step_units<NT, P, XL>(cur, cl, st, c, S);
                cur = nxt;
            }
        leaf_merge<NT, P>(S, gi, stk, res);
    }
    /* the warps of a tile: their subtrees merged pairwise in range order */
    for (int h = 1; h < kw; h <<= 1) {
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                if (sum_elem<NT, P>(i)) red[wid][4 * t + i][lane] = res[t][i];
        __syncthreads();
        if (ks % (2 * h) == 0)
#pragma unroll
            for (int t = 0; t < NT; t++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    if (sum_elem<NT, P>(i)) res[t][i] = __fadd_rn(res[t][i], red[wid + h][4 * t + i][lane]);
        __syncthreads();
    }
    if (live && ks == 0) store_tile<NT, P>(res, y, ldy, m, n, row0, g, c);
}

/* The x side of k_gemv_q8t in shared memory: the CTA stages the x of its k-range once, step by step
 * in the range's order, for all 8 of its warps (each warp used to read its x columns through L1 on
 * its own, and the L1 pipe was the bound: ncu, bench/RESULTS.md session 23). A slot holds one
 * 256-element step: the int8 bytes of every column (row stride XStride: the 8-byte reads of lanes
 * g, c hit distinct banks; Q6_K's 4-byte reads want 272), then the (d, s) pairs of its 8 blocks
 * (row stride XD floats, for the same reason). Ranges longer than max_steps go in chunks. */
template <int T> struct XStride { static constexpr int v = 288; };
template <> struct XStride<QT_Q6_K> { static constexpr int v = 272; };
constexpr int XD = 20;
constexpr int XSMEM = (int)CUK_Q8T_SX_SMEM; /* the slots' dynamic shared memory; with red: <= 227 KB */
template <int T, int NT> struct XSlot {
    static constexpr int cols = NT * 8, qbytes = cols * XStride<T>::v, bytes = qbytes + cols * XD * 4;
    static constexpr int max_steps = XSMEM / bytes;
};

/* Steps r0 .. r1 - 1 of the range into slots 0 .. r1 - r0 - 1 of buf (cp.async, every column). */
template <int T, int NT, int P>
__device__ __forceinline__ void stage_x(uint8_t *buf, int G0, int ng, int steps, int r0, int r1,
                                        const int8_t *__restrict__ xq, int64_t ldq, const float *__restrict__ xds,
                                        int64_t ldds, int64_t k, int n) {
    using SL = XSlot<T, NT>;
    constexpr int QCH = SL::cols * 16, CH = QCH + SL::cols * 4; /* 16-byte chunks: bytes, then (d, s) */
    for (int r = r0; r < r1; r++) {
        const int s = q8t_nth_step(G0, ng, steps, r);
        uint8_t *slot = buf + (r - r0) * SL::bytes;
        for (int i = threadIdx.x; i < CH; i += WARPS * 32) {
            const bool isq = i < QCH;
            const int col = isq ? i >> 4 : (i - QCH) >> 2, ch = isq ? i & 15 : (i - QCH) & 3;
            int v = P == 2 ? col >> 1 : col;
            v = v < n ? v : n - 1; /* columns past n compute a copy of the last one, never stored */
            const int pl = P == 2 ? col & 1 : 0;
            const void *src = isq ? (const void *)(xq + v * ldq + pl * k + (int64_t)s * 256 + 16 * ch)
                                  : (const void *)(xds + v * ldds + pl * (k / 16) + (int64_t)s * 16 + 4 * ch);
            uint8_t *dst = isq ? slot + col * XStride<T>::v + 16 * ch : slot + SL::qbytes + (col * XD + 4 * ch) * 4;
            cp16((uint32_t)__cvta_generic_to_shared(dst), src, true);
        }
    }
}

/* The GEMV (grid and lanes: the top comment). steps = k / 256; kw = k-ranges (1, 2, 4, 8), range
 * ks taking the residue groups ks * 8 / kw .. (ks + 1) * 8 / kw - 1: CTA b * kw + ks, all 8 warps
 * in range ks, one 16-row tile each (rows 128 b ..); the kw CTAs of a row block form a cluster
 * and merge their subtrees through distributed shared memory. */
template <int T, int NT, int P>
__global__ void __launch_bounds__(WARPS * 32, 1)
    k_gemv_q8t_sx(const uint8_t *__restrict__ w, int64_t rb, int64_t m, int steps, int kw, const int8_t *__restrict__ xq,
                  int64_t ldq, const float *__restrict__ xds, int64_t ldds, int64_t k, int n, float *__restrict__ y,
                  int64_t ldy) {
    using SL = XSlot<T, NT>;
    extern __shared__ __align__(16) uint8_t xsm[]; /* [<= SL::max_steps][SL::bytes] */
    __shared__ float red[WARPS][NT * 4][32];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const int ks = (int)(blockIdx.x % (unsigned)kw);
    const int64_t row0 = ((int64_t)(blockIdx.x / (unsigned)kw) * WARPS + wid) * 16;
    const bool live = row0 < m;
    const int64_t ra = row0 + g < m ? row0 + g : m - 1, rb8 = row0 + g + 8 < m ? row0 + g + 8 : m - 1;
    const uint8_t *rp[2] = {w + ra * rb, w + rb8 * rb};
    Cols<NT> cl;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        cl.q[t] = (uint32_t)((8 * t + g) * XStride<T>::v);
        cl.ds[t][0] = (uint32_t)((8 * t + 2 * c) * XD);
        cl.ds[t][1] = (uint32_t)((8 * t + 2 * c + 1) * XD);
    }
    /* Residue group G (0..7) = units 4 G .. 4 G + 3 of each 2048-element chunk = step s = G + 8 i of
     * chunk i: the dp4a kernel's lanes 4 G .. 4 G + 3. Per group the four residue sums run over the
     * chunks in order (S), the leaf (S0 + S1) + (S2 + S3) is the warp butterfly's first two levels,
     * and the leaves are merged pairwise in group order (a binary counter: stk[b] holds a finished
     * subtree of 2^b leaves), the butterfly's last three levels, finished across the cluster below. */
    const int ng = 8 / kw, G0 = ks * ng, rsteps = q8t_range_steps(G0, ng, steps);
    float res[NT][4], stk[3][NT][4], S[4][NT][4];
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            res[t][e] = stk[0][t][e] = stk[1][t][e] = stk[2][t][e] = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; j++) S[j][t][e] = 0.0f;
        }
    int gi = 0, st = G0; /* the warp's place: group gi, step st */
    Step<T> cur;
    if (live && st < steps) cur.load(rp, st, c);
    for (int c0 = 0; c0 < rsteps; c0 += SL::max_steps) {
        const int c1 = rsteps - c0 < SL::max_steps ? rsteps : c0 + SL::max_steps;
        /* the chunk's first step on its own, so its multiply overlaps the rest's copies */
        stage_x<T, NT, P>(xsm, G0, ng, steps, c0, c0 + 1, xq, ldq, xds, ldds, k, n);
        cp_commit();
        stage_x<T, NT, P>(xsm + SL::bytes, G0, ng, steps, c0 + 1, c1, xq, ldq, xds, ldds, k, n);
        cp_commit();
        cp_wait<1>();
        __syncthreads();
        for (int r = c0; r < c1; r++) {
            if (r == c0 + 1) {
                cp_wait<0>();
                __syncthreads();
            }
            const uint8_t *slot = xsm + (r - c0) * SL::bytes;
            cl.xq = (const int8_t *)slot;
            cl.xds = (const float *)(slot + SL::qbytes);
            int gn;
            const int sn = q8t_next_step(G0, ng, steps, gi, st, &gn);
            Step<T> nxt;
            if (live && sn < steps) nxt.load(rp, sn, c);
            if (live) step_units<NT, P, Sld>(cur, cl, 0, c, S);
            cur = nxt;
            if (gn != gi) { /* group gi done */
                leaf_merge<NT, P>(S, gi, stk, res);
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int t = 0; t < NT; t++) S[j][t][0] = S[j][t][1] = S[j][t][2] = S[j][t][3] = 0.0f;
            }
            gi = gn;
            st = sn;
        }
        __syncthreads(); /* every warp is done with the chunk's slots */
    }
    for (; gi < ng; gi++) leaf_merge<NT, P>(S, gi, stk, res); /* groups with no steps: zero leaves */
    /* the ranges of a tile: their subtrees merged pairwise in range order, across the cluster */
    if (kw > 1) {
        cg::cluster_group cluster = cg::this_cluster();
        for (int h = 1; h < kw; h <<= 1) {
#pragma unroll
            for (int t = 0; t < NT; t++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    if (sum_elem<NT, P>(i)) red[wid][4 * t + i][lane] = res[t][i];
            cluster.sync();
            if (ks % (2 * h) == 0) {
                const float(*o)[NT * 4][32] = (const float(*)[NT * 4][32])cluster.map_shared_rank(&red[0][0][0], ks + h);
#pragma unroll
                for (int t = 0; t < NT; t++)
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        if (sum_elem<NT, P>(i)) res[t][i] = __fadd_rn(res[t][i], o[wid][4 * t + i][lane]);
            }
            cluster.sync(); /* read before the next level writes, and before any CTA exits */
        }
    }
    if (live && ks == 0) store_tile<NT, P>(res, y, ldy, m, n, row0, g, c);
}

/* ---- MoE experts on the tensor cores (cuk_moe_gate_up_q8t, cuk_moe_down_q8t) ----
 * Grid: x = plan group, y = blocks of MW 16-row tiles; MW warps. A CTA whose group is the first,
 * third, .. of its expert takes that group and the next one of the same expert (up to 8 pairs:
 * the 8 columns of one mma tile); the other CTAs return at once. Columns past the count compute a
 * copy of the last and are not stored. Warp w takes the 16-row tile w of its block over the whole k (the
 * dense kernel's kw = 1: the same bits) for each of its NM matrices in turn (gate_up: the gate
 * tile's outputs kept in registers while the up tile runs, then silu(g) * u as k_gate_up_q8 writes
 * it). Its weights come through a ring of MST shared-memory stages per warp, one 256-element
 * step of the 16 rows each, filled by cp.async MST - 1 steps ahead in the order the residue
 * groups consume them (group G: steps G, G + 8, ..); the warp's own lanes fill and read its
 * ring, so no barrier but the one after the x columns are staged: in the xs form every thread
 * first copies the CTA's (up to 8) x columns for the whole k into shared memory, read there by
 * the warps; in the L1 form (where the device cannot give the slots) the warps read them from
 * global memory as k_gemv_q8t does. k_gemv_q8t holds its next step in registers (up to 255 of
 * them: one CTA of 8 warps per SM); the ring keeps MST - 1 steps in flight per warp at 128 registers (16 warps per SM). The same ring
 * for the dense product (column tiles as x, one and two planes) lost to k_gemv_q8t on most
 * shapes, since each column tile decodes the weights again (bench/RESULTS.md, session 13). */
constexpr int MW = 4, MST = 4;
template <int T> struct StepBytes;
template <> struct StepBytes<QT_Q4_K> { static constexpr int v = 144; };
template <> struct StepBytes<QT_Q5_K> { static constexpr int v = 176; };
template <> struct StepBytes<QT_Q8_0> { static constexpr int v = 272; };

struct MoeT {
    const uint8_t *w[2];   /* [n_expert][m][rb] */
    int64_t rb;
    int m, steps;
    const int32_t *plan;
    int n_pairs, xdiv;     /* x row of pair p: p / xdiv */
    const int8_t *xq;
    int64_t ldq;
    const float *xds;
    int64_t ldds;
    float *out;            /* [pairs][ldo] */
    int64_t ldo;
};

/* The step order of a warp: matrix, then residue group G = 0 .. min(8, steps) - 1, then the
 * group's steps G, G + 8, ... */
struct StepCursor {
    int mat, G, st;
    __device__ void next(int steps) {
        st += 8;
        if (st >= steps) {
            G++;
            st = G;
            if (G >= 8 || G >= steps) {
                mat++;
                G = st = 0;
            }
        }
    }
};

/* The xs form's x slots after the weight rings: per column a row of k bytes then one of k / 16
 * (d, s) floats, padded so that a warp's 8-byte B reads (lanes g, c) and 16-byte pair reads (4
 * addresses) hit distinct banks. */
__host__ __device__ constexpr int64_t moe_xs_qs(int64_t k) { return k + 32; }
__host__ __device__ constexpr int64_t moe_xs_ds(int64_t k) { return k / 16 + 4; }
template <int T> constexpr size_t moe_smem(int64_t k, bool xs) {
    return (size_t)MW * MST * 16 * StepBytes<T>::v + (xs ? (size_t)(8 * moe_xs_qs(k) + 32 * moe_xs_ds(k)) : 0);
}

/* XS: the CTA's x columns staged once in shared memory for its MW warps (the xs form); else each
 * warp reads them from global memory through L1 (the L1 form, where the slots do not fit). */
template <int T, int NM, bool XS>
__global__ void __launch_bounds__(MW * 32, 4) k_moe_q8t(MoeT p) {
    extern __shared__ __align__(16) uint8_t msm[];
    constexpr int SB = StepBytes<T>::v, CH = SB / 16, STAGE = 16 * SB;
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const PlanView pv(p.plan, p.n_pairs);
    const int grp = blockIdx.x, ng_all = pv.n_groups();
    if (grp >= ng_all) return;
    const int e = pv.expert(grp);
    int before = 0; /* the expert's groups before this one */
    while (grp - before > 0 && pv.expert(grp - before - 1) == e) before++;
    if (before & 1) return;
    const int pos0 = pv.start(grp);
    const int nvec = pv.count(grp) + (grp + 1 < ng_all && pv.expert(grp + 1) == e ? pv.count(grp + 1) : 0);
    const int row0 = ((int)blockIdx.y * MW + wid) * 16;
    if (!XS && row0 >= p.m) return; /* only warp-level synchronization below */
    const int v = g < nvec ? g : nvec - 1;
    const int u0 = 2 * c < nvec ? 2 * c : nvec - 1, u1 = 2 * c + 1 < nvec ? 2 * c + 1 : nvec - 1;
    Cols<1> cl;
    if constexpr (XS) { /* every thread copies, then the CTA's one barrier: before any warp returns */
        const int64_t k = (int64_t)p.steps * 256, qs = moe_xs_qs(k), ds = moe_xs_ds(k);
        uint8_t *xq_s = msm + MW * MST * STAGE;
        float *xd_s = (float *)(void *)(xq_s + 8 * qs);
        const int qch = (int)(k / 16), per = qch + (int)(k / 64); /* 16-byte chunks a column */
        for (int col = 0; col < nvec; col++) {
            const int64_t xr = pv.pair(pos0 + col) / p.xdiv;
            for (int j = threadIdx.x; j < per; j += MW * 32) {
                if (j < qch)
                    cp16((uint32_t)__cvta_generic_to_shared(xq_s + col * qs + 16 * j), p.xq + xr * p.ldq + 16 * j, true);
                else
                    cp16((uint32_t)__cvta_generic_to_shared(xd_s + col * ds + 4 * (j - qch)),
                         p.xds + xr * p.ldds + 4 * (j - qch), true);
            }
        }
        cp_commit();
        cp_wait<0>();
        __syncthreads();
        cl.xq = (const int8_t *)xq_s;
        cl.xds = xd_s;
        cl.q[0] = (uint32_t)(v * qs);
        cl.ds[0][0] = (uint32_t)(u0 * ds);
        cl.ds[0][1] = (uint32_t)(u1 * ds);
    } else {
        cl.xq = p.xq;
        cl.xds = p.xds;
        cl.q[0] = (uint32_t)((pv.pair(pos0 + v) / p.xdiv) * p.ldq);
        cl.ds[0][0] = (uint32_t)((pv.pair(pos0 + u0) / p.xdiv) * p.ldds);
        cl.ds[0][1] = (uint32_t)((pv.pair(pos0 + u1) / p.xdiv) * p.ldds);
    }
    if (XS && row0 >= p.m) return; /* only warp-level synchronization below */
    uint8_t *ring = msm + wid * (MST * STAGE);
    const int64_t eoff = (int64_t)e * p.m * p.rb;
    const int n_steps = NM * p.steps;
    /* the issue side: step `is` of the warp's order into stage is % MST */
    StepCursor ic = {0, 0, 0};
    int is = 0;
    auto issue = [&]() {
        if (is < n_steps) {
            const uint8_t *wb = (ic.mat ? p.w[1] : p.w[0]) + eoff + (int64_t)ic.st * SB; /* no local copy of p */
            uint8_t *dst = ring + (is % MST) * STAGE;
            for (int i = lane; i < 16 * CH; i += 32) {
                const int r = i / CH, ch = i - r * CH;
                const int row = row0 + r < p.m ? row0 + r : p.m - 1;
                cp16((uint32_t)__cvta_generic_to_shared(dst + r * SB + ch * 16), wb + row * p.rb + ch * 16, true);
            }
            ic.next(p.steps);
        }
        cp_commit(); /* an empty group past the end keeps the wait count uniform */
        is++;
    };
#pragma unroll
    for (int i = 0; i < MST - 1; i++) issue();
    int used = 0;
    float keep[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 1
    for (int mat = 0; mat < NM; mat++) {
        float stk[3][1][4], res[1][4];
#pragma unroll
        for (int q = 0; q < 4; q++) res[0][q] = stk[0][0][q] = stk[1][0][q] = stk[2][0][q] = 0.0f;
#pragma unroll 1
        for (int gi = 0; gi < 8; gi++) {
            float S[4][1][4];
#pragma unroll
            for (int j = 0; j < 4; j++) S[j][0][0] = S[j][0][1] = S[j][0][2] = S[j][0][3] = 0.0f;
#pragma unroll 1
            for (int st = gi; st < p.steps; st += 8) {
                cp_wait<MST - 2>();
                __syncwarp();
                const uint8_t *stg = ring + (used % MST) * STAGE;
                const uint8_t *const rp[2] = {stg + g * SB, stg + (g + 8) * SB};
                Step<T> cur;
                cur.template load<Sld>(rp, 0, c);
                __syncwarp(); /* every lane has read the stage the next issue overwrites */
                issue();
                used++;
                step_units<1, 1, typename std::conditional<XS, Sld, Gld>::type>(cur, cl, st, c, S);
            }
            leaf_merge<1>(S, gi, stk, res);
        }
        if (NM == 2 && mat == 0) {
#pragma unroll
            for (int q = 0; q < 4; q++) keep[q] = res[0][q];
            continue;
        }
        const int r_lo = row0 + g, r_hi = row0 + g + 8;
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int v = 2 * c + (q & 1), r = q < 2 ? r_lo : r_hi;
            if (v >= nvec || r >= p.m) continue;
            float o = res[0][q];
            if (NM == 2) {
                const float gt = keep[q];
                o = gt / (1.0f + expf(-gt)) * o;
            }
            p.out[(int64_t)pv.pair(pos0 + v) * p.ldo + r] = o;
        }
    }
    cp_wait<0>();
}

/* The L1 form; XL = XF<NT>: a->x is the fragment-order copy k_x_frag made (launch_fx). */
template <int T, int NT, int P, class XL = Gld>
static g5_status launch_l1(const cuk_gemv_q8_args *a, int64_t rb, cudaStream_t st, g5_error *err) {
    const int kw = q8t_kw_l1(a->m, a->k);
    const int64_t tiles = (a->m + 15) / 16, per = WARPS / kw;
    k_gemv_q8t<T, NT, P, XL><<<(unsigned)((tiles + per - 1) / per), WARPS * 32, 0, st>>>(
        (const uint8_t *)a->w, rb, a->m, (int)(a->k / 256), kw, a->x.q, a->x.ldq, a->x.ds, a->x.ldds, a->k, a->n, a->y,
        a->ldy);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}

/* x of one launch's columns into the fragment order of XF<NT>. Grid: one thread per
 * lane's 8 bytes of a sub-block and tile, then one per (unit, tile, c) for its 8 (d, s) floats. */
template <int NT, int P>
__global__ void k_x_frag(const int8_t *__restrict__ xq, int64_t ldq, const float *__restrict__ xds, int64_t ldds,
                         int64_t k, int n, int8_t *__restrict__ fq, float *__restrict__ fds) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t nq = k / 32 * NT * 32, nd = k / 64 * NT * 4;
    auto src_col = [&](int col, int &pl) {
        int v = P == 2 ? col >> 1 : col;
        pl = P == 2 ? col & 1 : 0;
        return v < n ? v : n - 1;
    };
    if (i < nq) {
        const int64_t b = i / (NT * 32);
        const int r = (int)(i % (NT * 32)), t = r / 32, l = r % 32;
        int pl;
        const int v = src_col(8 * t + l / 4, pl);
        *(uint2 *)(void *)(fq + i * 8) = ldg64(xq + v * ldq + pl * k + 32 * b + 8 * (l % 4));
    } else if (i < nq + nd) {
        const int64_t j = i - nq, u = j / (NT * 4);
        const int r = (int)(j % (NT * 4)), t = r / 4, c = r % 4;
#pragma unroll
        for (int e = 0; e < 2; e++) {
            int pl;
            const int v = src_col(8 * t + 2 * c + e, pl);
            *(float4 *)(void *)(fds + (u * NT + t) * 32 + c * 8 + 4 * e) = ldg_f4(xds + v * ldds + pl * (k / 16) + 4 * u);
        }
    }
}

/* The L1 form on x re-laid out first (fx): scratch holds k * NT * 10 bytes (CUK_Q8T_SCRATCH_PER_K
 * covers NT = 8). */
static_assert(8 * 10 == CUK_Q8T_SCRATCH_PER_K, "the scratch of NT = 8 column tiles a k element");

template <int T, int NT, int P>
static g5_status launch_fx(const cuk_gemv_q8_args *a, int64_t rb, int8_t *scratch, cudaStream_t st, g5_error *err) {
    cuk_gemv_q8_args b = *a;
    int8_t *fq = scratch;
    float *fds = (float *)(void *)(scratch + a->k / 32 * NT * 256);
    const int64_t items = a->k / 32 * NT * 32 + a->k / 64 * NT * 4;
    k_x_frag<NT, P><<<(unsigned)((items + 255) / 256), 256, 0, st>>>(a->x.q, a->x.ldq, a->x.ds, a->x.ldds, a->k,
                                                                      (int)a->n, fq, fds);
    CUK_CHECK(cudaGetLastError());
    b.x = cuk_q8_act{fq, 0, fds, 0, a->x.planes}; /* the layout is XF's; the strides are unused */
    return launch_l1<T, NT, P, XF<NT>>(&b, rb, st, err);
}

/* Whether the device lets a block have k_gemv_q8t_sx's slots and its static red (sm_90: 227 KB
 * of opt-in shared memory); sm_120 gives 99 KB and takes the L1 form (cuk_limits.h). */
template <int T, int NT = 4> static bool sx_fits() {
    const size_t need = (size_t)XSlot<T, NT>::max_steps * XSlot<T, NT>::bytes + sizeof(float) * WARPS * NT * 4 * 32;
    return cuk_device_smem_cap(need) >= need;
}
static_assert(XSlot<QT_Q5_K, 8>::max_steps * XSlot<QT_Q5_K, 8>::bytes + 4 * WARPS * 8 * 4 * 32 <= 227 * 1024,
              "8 column tiles' slots and red fit sm_90's opt-in");

template <int T, int NT, int P>
static g5_status launch_sx(const cuk_gemv_q8_args *a, int64_t rb, cudaStream_t st, g5_error *err) {
    using SL = XSlot<T, NT>;
    const int64_t blocks = ((a->m + 15) / 16 + WARPS - 1) / WARPS;
    const int steps = (int)(a->k / 256), kw = q8t_kw_sx(blocks, steps, SL::max_steps);
    const int rs = q8t_range_steps(0, 8 / kw, steps);
    const size_t smem = (size_t)(rs < SL::max_steps ? rs : SL::max_steps) * SL::bytes;
    static bool raised[CUK_MAX_DEVICES]; /* the largest slot set, opted into once per device */
    const int slot = cuk_device_slot();
    if (!raised[slot]) {
        CUK_CHECK(cudaFuncSetAttribute(k_gemv_q8t_sx<T, NT, P>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       SL::max_steps * SL::bytes));
        raised[slot] = true;
    }
    cudaLaunchAttribute at;
    const cudaLaunchConfig_t cfg = cuk_cluster_cfg(&at, (unsigned)kw, dim3((unsigned)(blocks * kw)), WARPS * 32, smem, st);
    CUK_CHECK(cudaLaunchKernelEx(&cfg, k_gemv_q8t_sx<T, NT, P>, (const uint8_t *)a->w, rb, a->m, steps, kw,
                                 (const int8_t *)a->x.q, (int64_t)a->x.ldq, (const float *)a->x.ds, (int64_t)a->x.ldds,
                                 (int64_t)a->k, (int)a->n, a->y, (int64_t)a->ldy));
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}

/* Whether a launch of NT column tiles takes the sx form by shape: a tall matrix (>= 12288 rows) at
 * more than 8 columns, a k-range's x fitting its slots at once (k <= 34816: every GLM-5 product),
 * and the device giving a block the memory. */
template <int T, int NT> static bool sx_by_shape(const cuk_gemv_q8_args *a) {
    return a->m >= 12288 && q8t_range_steps(0, 1, (int)(a->k / 256)) <= XSlot<T, NT>::max_steps && sx_fits<T>();
}

/* Two planes of 17-32 vectors in the sx form with 8 tiles instead of fx: where bench_q8 measured it
 * faster at 32 vectors on the H100 (bench/RESULTS.md, session 39): short rows on tall matrices (q_b
 * 16384 x 2048: 46.0 against 58.3 us for two sx launches; the shared down 6144 x 2048: 35.1 against
 * 43.1) and the short matrices (kv_a 576 x 6144: 25.1 against 31.5). */
template <int T> static bool sx8_by_shape(const cuk_gemv_q8_args *a) {
    return ((a->k <= 2048 && a->m >= 6144) || a->m <= 1024) && sx_fits<T, 8>();
}

/* The fx or sx form with 8 column tiles: two planes (their C elements 1 and 3 idle: sum_elem) of
 * types whose step fits beside 8 tiles' sums; launch_nt asks for it only there. */
template <int T, int P>
static g5_status launch_t8(const cuk_gemv_q8_args *a, int64_t rb, int8_t *fx, bool sx, cudaStream_t st, g5_error *err) {
    if constexpr (P == 2 && T != QT_Q6_K)
        return sx ? launch_sx<T, 8, P>(a, rb, st, err) : launch_fx<T, 8, P>(a, rb, fx, st, err);
    else
        return g5_fail(err, G5_ERR_UNSUPPORTED, "gemv_q8t: no 8-tile form for type %s with %d planes",
                       quant_type_name((uint32_t)T), P);
}

/* Columns (vectors x planes) of one launch: up to 32 (NT = 4; more would spill the residue sums);
 * with two planes and scratch (fx) up to 64 (NT = 8: two planes hold half the sums). A larger n
 * goes in launches of that many columns, which changes no bits (they never depend on n).
 * all_sx: every launch in the sx form (cuk_gemv_q8t_sx), two planes of 17-32 vectors with 8 tiles
 * where the device gives the block its 216 KB. Else the form by shape (bench/RESULTS.md, sessions
 * 23 to 26, 39 and 40): at 33-64 columns (two planes, scratch given, not Q6_K) sx with 8 tiles
 * where sx8_by_shape says, else fx with 8 tiles except on tall matrices of k <= 4096; at 9-32
 * columns sx on tall matrices, else the L1 form on x re-laid out in fragment order where the
 * caller gave scratch (fx); at 8 columns or fewer the L1 form on x as it is (the relayout launch
 * costs more than it saves there). */
template <int T, int P>
static g5_status launch_nt(const cuk_gemv_q8_args *a, int64_t rb, cudaStream_t st, bool all_sx, int8_t *fx,
                           g5_error *err) {
    constexpr bool nt8 = P == 2 && T != QT_Q6_K; /* Q6_K's 8 tiles spill (its step holds more) */
    /* a tall matrix of short rows (q_b: 16384 x 2048) keeps two sx launches: 58 us against 67 for
     * one of 8 tiles at 32 vectors on the H100, where 12288 x 6144 took 110 against 153 */
    const bool sx8 = nt8 && (all_sx ? sx_fits<T, 8>() : fx && sx8_by_shape<T>(a));
    const bool wide = nt8 && (sx8 || (fx && !all_sx && !(a->k <= 4096 && sx_by_shape<T, 4>(a)))); /* 32 vectors a launch */
    const int per = wide ? 32 : 32 / P;
    for (int v0 = 0; v0 < a->n; v0 += per) {
        cuk_gemv_q8_args b = *a;
        b.n = a->n - v0 < per ? a->n - v0 : per;
        b.x.q += (int64_t)v0 * a->x.ldq;
        b.x.ds += (int64_t)v0 * a->x.ldds;
        b.y += (int64_t)v0 * a->ldy;
        const int cols = b.n * P;
        g5_status s;
        if (nt8 && cols > 32) /* two planes of 17-32 vectors: one launch of 8 column tiles (fx or all_sx) */
            s = launch_t8<T, P>(&b, rb, fx, sx8, st, err);
        else if (all_sx)
            s = cols <= 8    ? launch_sx<T, 1, P>(&b, rb, st, err)
                : cols <= 16 ? launch_sx<T, 2, P>(&b, rb, st, err)
                             : launch_sx<T, 4, P>(&b, rb, st, err);
        else if (cols > 16 && sx_by_shape<T, 4>(&b))
            s = launch_sx<T, 4, P>(&b, rb, st, err);
        else if (cols > 8 && cols <= 16 && sx_by_shape<T, 2>(&b))
            s = launch_sx<T, 2, P>(&b, rb, st, err);
        else if (cols > 8 && fx)
            s = cols <= 16 ? launch_fx<T, 2, P>(&b, rb, fx, st, err) : launch_fx<T, 4, P>(&b, rb, fx, st, err);
        else
            s = cols <= 8    ? launch_l1<T, 1, P>(&b, rb, st, err)
                : cols <= 16 ? launch_l1<T, 2, P>(&b, rb, st, err)
                             : launch_l1<T, 4, P>(&b, rb, st, err);
        if (s != G5_OK) return s;
    }
    return G5_OK;
}

template <int T>
static g5_status launch_p(const cuk_gemv_q8_args *a, int64_t rb, cudaStream_t st, bool all_sx, int8_t *fx, g5_error *err) {
    if (all_sx && !sx_fits<T>())
        return g5_fail(err, G5_ERR_UNSUPPORTED, "gemv_q8t_sx: the device gives a block less than the %zu bytes of shared memory its x slots need",
                       (size_t)XSlot<T, 4>::max_steps * XSlot<T, 4>::bytes);
    return a->x.planes == 2 ? launch_nt<T, 2>(a, rb, st, all_sx, fx, err) : launch_nt<T, 1>(a, rb, st, all_sx, fx, err);
}

/* Whether the xs form's ring and x slots fit a block of the device (cuk_q8.h: sm_90 to k = 16128
 * for every type, sm_120 to 6400 for Q4_K, 5376 for Q5_K and 3072 for Q8_0). */
template <int T> static bool moe_xs_fits(int64_t k) {
    const size_t need = moe_smem<T>(k, true);
    return cuk_device_smem_cap(need) >= need;
}

/* One MoE launch (grid: the kernel's comment) over up to n_groups plan groups. Each instance is
 * opted into shared memory once per device: the L1 form its ring, the xs form all the device
 * gives (its size follows k). */
template <int T, int NM, bool XS>
static g5_status moe_launch(const MoeT &p, int n_groups, cudaStream_t st, g5_error *err) {
    const size_t smem = moe_smem<T>((int64_t)p.steps * 256, XS);
    static bool raised[CUK_MAX_DEVICES];
    const int slot = cuk_device_slot();
    if (!raised[slot]) {
        const size_t cap = XS ? cuk_device_smem_cap((size_t)227 * 1024) : smem; /* sm_90: the most any device gives */
        CUK_CHECK(cudaFuncSetAttribute(k_moe_q8t<T, NM, XS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)cap));
        raised[slot] = true;
    }
    const int tiles = (p.m + 15) / 16;
    const dim3 grid((unsigned)n_groups, (unsigned)((tiles + MW - 1) / MW));
    k_moe_q8t<T, NM, XS><<<grid, MW * 32, smem, st>>>(p);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}

/* The xs form where it fits the device (bench/RESULTS.md, session 29: 1.13x to 1.17x faster at 8
 * to 32 tokens on the H100), else the L1 form (l1: always, for tests). The same bits either way. */
template <int NM, int T> static g5_status moe_form(const MoeT &p, int n_groups, bool l1, cudaStream_t st, g5_error *err) {
    if (!l1 && moe_xs_fits<T>((int64_t)p.steps * 256)) return moe_launch<T, NM, true>(p, n_groups, st, err);
    return moe_launch<T, NM, false>(p, n_groups, st, err);
}
template <int NM>
static g5_status moe_type(uint32_t t, const MoeT &p, int n_groups, bool l1, cudaStream_t st, g5_error *err) {
    switch (t) {
    case QT_Q4_K: return moe_form<NM, QT_Q4_K>(p, n_groups, l1, st, err);
    case QT_Q5_K: return moe_form<NM, QT_Q5_K>(p, n_groups, l1, st, err);
    default: return moe_form<NM, QT_Q8_0>(p, n_groups, l1, st, err);
    }
}

} // namespace q8t
} // namespace cuk

using namespace cuk;

#define BAD(...) g5_fail(err, G5_ERR_INVALID_ARG, __VA_ARGS__)

extern "C" int cuk_q8t_takes(uint32_t t, int64_t k) {
    if (k <= 0 || k > (1LL << 24) || k % 256) return 0;
    return t == QT_Q4_K || t == QT_Q5_K || t == QT_Q6_K || t == QT_Q8_0;
}

/* cuk_gemv_q8t and cuk_gemv_q8t_sx: the argument checks (what names the call), then the launches. */
static g5_status gemv_q8t_run(const char *what, const cuk_gemv_q8_args *a, cuk_stream stream, bool all_sx, int8_t *fx,
                              g5_error *err) {
    if (!a) return BAD("%s: args is NULL", what);
    if (!cuk_q8t_takes(a->w_type, a->k))
        return BAD("%s: type %s with k=%lld has no int8 tensor-core kernel", what, quant_type_name(a->w_type),
                   (long long)a->k);
    if (!a->w || (uintptr_t)a->w % 16) return BAD("%s: weights NULL or not 16-byte aligned", what);
    if (a->w2) return BAD("%s: a second matrix (w2) is cuk_gemv_q8's alone", what);
    if (a->m <= 0 || a->m > (1LL << 31)) return BAD("%s: m=%lld outside 1..2^31", what, (long long)a->m);
    uint64_t rb = 0, tot = 0;
    if (quant_row_bytes(a->w_type, (uint64_t)a->k, &rb) != G5_OK || g5_mul_u64(rb, (uint64_t)a->m, &tot))
        return BAD("%s: m=%lld rows of k=%lld overflow", what, (long long)a->m, (long long)a->k);
    if (a->n < 1 || a->n > CUK_Q8T_MAX_N) return BAD("%s: n=%d outside 1..%d", what, (int)a->n, CUK_Q8T_MAX_N);
    const cuk_q8_act *x = &a->x;
    const g5_status sx = cuk::q8_check_act(what, "x", x, a->k, err);
    if (sx != G5_OK) return sx;
    /* the L1 form's 32-bit x offsets */
    if ((uint64_t)a->n * (uint64_t)x->ldq > 0xFFFFFFFFull || (uint64_t)a->n * (uint64_t)x->ldds > 0x3FFFFFFFull)
        return BAD("%s: x of %d rows exceeds 4 GB", what, (int)a->n);
    if (!a->y) return BAD("%s: y is NULL", what);
    if (a->ldy < a->m) return BAD("%s: ldy=%lld < m=%lld", what, (long long)a->ldy, (long long)a->m);
    const cudaStream_t st = (cudaStream_t)stream;
    switch (a->w_type) {
    case QT_Q4_K: return q8t::launch_p<QT_Q4_K>(a, (int64_t)rb, st, all_sx, fx, err);
    case QT_Q5_K: return q8t::launch_p<QT_Q5_K>(a, (int64_t)rb, st, all_sx, fx, err);
    case QT_Q6_K: return q8t::launch_p<QT_Q6_K>(a, (int64_t)rb, st, all_sx, fx, err);
    default: return q8t::launch_p<QT_Q8_0>(a, (int64_t)rb, st, all_sx, fx, err);
    }
}

extern "C" g5_status cuk_gemv_q8t(const cuk_gemv_q8_args *a, void *scratch, size_t scratch_bytes, cuk_stream stream,
                                  g5_error *err) {
    if (a && scratch && ((uintptr_t)scratch % 16 || scratch_bytes / CUK_Q8T_SCRATCH_PER_K < (uint64_t)a->k))
        return BAD("gemv_q8t: scratch of %zu bytes unaligned or under k=%lld x %d", scratch_bytes, (long long)a->k,
                   CUK_Q8T_SCRATCH_PER_K);
    return gemv_q8t_run("gemv_q8t", a, stream, false, (int8_t *)scratch, err);
}

extern "C" g5_status cuk_gemv_q8t_sx(const cuk_gemv_q8_args *a, cuk_stream stream, g5_error *err) {
    return gemv_q8t_run("gemv_q8t_sx", a, stream, true, NULL, err);
}

/* cuk_q8t_takes' types but Q6_K, whose 210-byte steps cp.async cannot copy (not 16-byte aligned). */
extern "C" int cuk_moe_q8t_takes(uint32_t t, int64_t k, int32_t planes) {
    return planes == 1 && t != QT_Q6_K && cuk_q8t_takes(t, k);
}

/* The kernel's grid (y: blocks of MW row tiles) and its 32-bit x offsets per row (Cols). */
static g5_status moe_t_check(const char *what, uint32_t t, int64_t k, int64_t m, const cuk_q8_act *x, int64_t x_rows,
                             g5_error *err) {
    if (!cuk_moe_q8t_takes(t, k, x->planes))
        return BAD("%s: type %s with k=%lld and %d planes has no tensor-core MoE kernel", what, quant_type_name(t),
                   (long long)k, (int)x->planes);
    if ((m + 15) / 16 > 65535LL * q8t::MW) return BAD("%s: m=%lld rows exceed the grid", what, (long long)m);
    if ((uint64_t)x_rows * (uint64_t)x->ldq > 0xFFFFFFFFull || (uint64_t)x_rows * (uint64_t)x->ldds > 0x3FFFFFFFull)
        return BAD("%s: x of %lld rows exceeds 4 GB", what, (long long)x_rows);
    return G5_OK;
}

static g5_status moe_gate_up_t(const char *what, const cuk_moe_gate_up_q8_args *a, bool l1, cuk_stream stream,
                               g5_error *err) {
    int64_t rb = 0;
    g5_status st = q8_moe_gate_up_check(what, a, &rb, err);
    if (st == G5_OK) st = moe_t_check(what, a->w_type, a->k, a->m, &a->x, a->n_tok, err);
    if (st != G5_OK) return st;
    const q8t::MoeT p = {{(const uint8_t *)a->w_gate, (const uint8_t *)a->w_up}, rb, (int)a->m, (int)(a->k / 256), a->plan,
                         a->n_tok * a->top_k, a->top_k, a->x.q, a->x.ldq, a->x.ds, a->x.ldds, a->out, a->ldo};
    return q8t::moe_type<2>(a->w_type, p, a->n_tok * a->top_k, l1, (cudaStream_t)stream, err);
}

static g5_status moe_down_t(const char *what, const cuk_moe_down_q8_args *a, bool l1, cuk_stream stream, g5_error *err) {
    int64_t rb = 0;
    if (a && a->hf) return g5_fail(err, G5_ERR_INVALID_ARG, "%s: float32 rows (hf): cuk_moe_down_q8 only", what);
    g5_status st = q8_moe_down_check(what, a, &rb, err);
    if (st == G5_OK) st = moe_t_check(what, a->w_type, a->k, a->m, &a->h, (int64_t)a->n_tok * a->top_k, err);
    if (st != G5_OK) return st;
    const q8t::MoeT p = {{(const uint8_t *)a->w, (const uint8_t *)a->w}, rb, (int)a->m, (int)(a->k / 256), a->plan,
                         a->n_tok * a->top_k, 1, a->h.q, a->h.ldq, a->h.ds, a->h.ldds, a->part, a->ldp};
    if ((st = q8t::moe_type<1>(a->w_type, p, a->n_tok * a->top_k, l1, (cudaStream_t)stream, err)) != G5_OK) return st;
    return q8_moe_combine(a, (cudaStream_t)stream, err);
}

extern "C" g5_status cuk_moe_gate_up_q8t(const cuk_moe_gate_up_q8_args *a, cuk_stream stream, g5_error *err) {
    return moe_gate_up_t("moe_gate_up_q8t", a, false, stream, err);
}
extern "C" g5_status cuk_moe_down_q8t(const cuk_moe_down_q8_args *a, cuk_stream stream, g5_error *err) {
    return moe_down_t("moe_down_q8t", a, false, stream, err);
}
extern "C" g5_status cuk_moe_gate_up_q8t_l1(const cuk_moe_gate_up_q8_args *a, cuk_stream stream, g5_error *err) {
    return moe_gate_up_t("moe_gate_up_q8t_l1", a, true, stream, err);
}
extern "C" g5_status cuk_moe_down_q8t_l1(const cuk_moe_down_q8_args *a, cuk_stream stream, g5_error *err) {
    return moe_down_t("moe_down_q8t_l1", a, true, stream, err);
}
