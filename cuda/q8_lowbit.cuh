/* Internal to cuda/gemv_q8_lb*.cu: the low-bit weight types as units of the int8-input kernels
 * (cuda/gemv_q8_kern.cuh): Q2_K, Q3_K, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S,
 * IQ4_NL, IQ4_XS, TQ1_0, TQ2_0, MXFP4, NVFP4, and the legacy 32-element types Q4_0, Q4_1, Q5_0,
 * Q5_1.
 *
 * A unit is 64 consecutive elements of a row (a quarter of a 256-element block, two MXFP4 or
 * IQ4_NL blocks, one NVFP4 block). Raw<T>::load reads its bytes (16-bit aligned blocks: aligned words realigned
 * by funnel shifts, never a word that holds none of the bytes asked for); decode() turns them into
 * a Lb<T>: the 64 weights as exact int8 values q (16 words, element order) and per run of RUN
 * elements (32 or 16) a float scale a (and for Q2_K a min b) with
 *     weight = a * q - b.
 * Every one of these types is such an integer times a per-run scale (format/quant_blocks.h: the
 * grid entries with their signs, the doubled fp4 levels, the iq4 levels, the ternary digits; IQ1_S/IQ1_M's grid +
 * delta as (8 grid +- 1) with a / 8). The unit's value with one int8 x row is then, run by run in
 * order, with every rounding explicit:
 *     acc += a_r * (dx * I_r) [- b_r * (dx * C_r)]
 * I_r the exact int32 dot product of the run's q with x's int8 quants (dp4a), C_r the sum of x's
 * quants over the run, dx the scale of x's 32-element block. A run of 32 is Q8_0's unit form
 * (unit_q8_0); Q4_1 and Q5_1 (weight = d q + m) add m_r s_r, s_r x's (d, s) block sum, as the
 * Q4_K unit subtracts its min (unit_q4_1). Grids: the device copies in format/quant_blocks.h. */
#ifndef G5_Q8_LOWBIT_CUH
#define G5_Q8_LOWBIT_CUH

#include "cuda/gemv_q8_kern.cuh"
#include "format/quant_blocks.h"

namespace cuk {
namespace q8 {

/* Runs per unit and mins, per type. */
template <int T> struct LbT {
    static constexpr int RUN = (T == QT_IQ2_XS || T == QT_IQ2_S || T == QT_IQ1_M || T == QT_NVFP4 ||
                                T == QT_Q2_K || T == QT_Q3_K)
                                   ? 16
                                   : 32;
    static constexpr bool MIN = T == QT_Q2_K;
    static constexpr bool MIN32 = T == QT_Q4_1 || T == QT_Q5_1; /* + m per 32-element block */
};

template <int T> struct Lb {
    uint32_t q[16];                    /* int8 weights, 4 per word, element order */
    float a[64 / LbT<T>::RUN];         /* scale per run */
    float b[LbT<T>::MIN ? 4 : LbT<T>::MIN32 ? 2 : 1]; /* min per run (Q2_K), per block (Q4_1, Q5_1) */
};

/* Bytes [p, p + NB) as words, p 16-bit aligned: the aligned words holding them, shifted. */
template <int NB> __device__ __forceinline__ void ldb(const uint8_t *p, uint32_t (&o)[(NB + 3) / 4]) {
    constexpr int NW = (NB + 3) / 4;
    const uint32_t *a = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
    const uint32_t sh = ((uint32_t)(uintptr_t)p & 2u) * 8u;
    uint32_t w[NW + 1];
#pragma unroll
    for (int i = 0; i < NW; i++) w[i] = ldg32(a + i);
    /* word NW starts 2 bytes before p + 4 NW: it holds asked-for bytes only if NB > 4 NW - 2 */
    w[NW] = (NB > 4 * NW - 2 && sh) ? ldg32(a + NW) : 0u;
#pragma unroll
    for (int i = 0; i < NW; i++) o[i] = __funnelshift_r(w[i], w[i + 1], sh);
}
__device__ __forceinline__ uint32_t ld16(const uint8_t *p) { return __ldg((const unsigned short *)p); }

/* The word at byte offset OFF (compile time) of a word array. */
template <int OFF, int N> __device__ __forceinline__ uint32_t word_at(const uint32_t (&w)[N]) {
    static_assert(OFF / 4 + (OFF % 4 ? 1 : 0) < N, "word_at: past the words");
    if constexpr (OFF % 4 == 0) return w[OFF / 4];
    else return __funnelshift_r(w[OFF / 4], w[OFF / 4 + 1], 8 * (OFF % 4));
}

/* The 8 sign bits of a grid group (7 stored, the 8th making the count of minus signs even):
 * qb_ksigns with the parity from one popc. */
__device__ __forceinline__ uint32_t ksigns(uint32_t s7) { return s7 | ((__popc(s7) & 1u) << 7); }
/* 4 int8 values v negated where bits 0..3 of s are set. */
__device__ __forceinline__ uint32_t sgn4(uint32_t v, uint32_t s) {
    const uint32_t m = (((s & 0xFu) * 0x00204081u) & 0x01010101u) * 0xFFu;
    return __vsub4(v ^ m, m);
}
/* A grid row of 8 bytes with its 8 sign bits: words lo, hi. */
__device__ __forceinline__ void grid8(uint64_t row, uint32_t s, uint32_t &lo, uint32_t &hi) {
    lo = sgn4((uint32_t)row, s);
    hi = sgn4((uint32_t)(row >> 32), s >> 4);
}
/* IQ1_S/IQ1_M: grid bytes g in {-1, 0, 1} as 8 g + 1 (delta +1/8) or 8 g - 1. */
__device__ __forceinline__ uint32_t iq1w(uint32_t g4, bool neg) {
    const uint32_t w = (g4 << 3) & 0xF8F8F8F8u;
    return neg ? __vsub4(w, 0x01010101u) : (w | 0x01010101u);
}
/* Doubled e2m1 levels of 4 nibbles (one per byte, low half): 0 1 2 3 4 6 8 12, bit 3 the sign
 * (level 8, "-0", is 0). */
__device__ __forceinline__ uint32_t fp4x4(uint32_t n4) {
    const uint32_t s = n4 & 0x07070707u, x = s | (s >> 4);
    const uint32_t lv = __byte_perm(0x03020100u, 0x0C080604u, (x & 0xFFu) | ((x >> 8) & 0xFF00u));
    const uint32_t m = ((n4 >> 3) & 0x01010101u) * 0xFFu;
    return __vsub4(lv ^ m, m);
}
/* IQ4_NL/IQ4_XS: the non-linear levels of 4 nibbles (one per byte, low half). The table is
 * ggml's kvalues_iq4nl (format/quant.c holds it as data): -127 -104 -83 -65 -49 -35 -22 -10 1 13
 * 25 38 53 69 89 113, four int8 levels to a word. */
__device__ __forceinline__ uint32_t iq4x4(uint32_t n4) {
    const uint32_t s = n4 & 0x07070707u, x = s | (s >> 4), sel = (x & 0xFFu) | ((x >> 8) & 0xFF00u);
    const uint32_t lo = __byte_perm(0xBFAD9881u, 0xF6EADDCFu, sel), hi = __byte_perm(0x26190D01u, 0x71594535u, sel);
    const uint32_t m = ((n4 >> 3) & 0x01010101u) * 0xFFu;
    return (lo & ~m) | (hi & m);
}
/* TQ1_0: digit n (p3 = 3^n) of 4 bytes, minus 1: ((uint8)(x 3^n) * 3) >> 8 in 16-bit lanes. */
__device__ __forceinline__ uint32_t tdig(uint32_t w, uint32_t p3) {
    uint32_t lo = ((w & 0x00FF00FFu) * p3) & 0x00FF00FFu, hi = (((w >> 8) & 0x00FF00FFu) * p3) & 0x00FF00FFu;
    lo = ((lo * 3u) >> 8) & 0x00030003u;
    hi = ((hi * 3u) >> 8) & 0x00030003u;
    return __vsub4(lo | (hi << 8), 0x01010101u);
}
__device__ __forceinline__ float f16(uint32_t bits) { return qb_half(bits & 0xFFFFu); }

/* ---- the types: load (bytes of unit u = block u / 4, quarter u % 4) and decode ---- */

/* IQ2_XXS (66 bytes): d; per 32 elements 4 grid bytes and a word of 4 x 7 sign bits + scale. */
template <> struct Raw<QT_IQ2_XXS> {
    uint32_t q[4], d;
    __device__ void load(const uint8_t *row, int u) {
        const uint8_t *bp = row + (int64_t)(u >> 2) * QB_B_IQ2_XXS;
        ldb<16>(bp + 2 + 16 * (u & 3), q);
        d = ld16(bp);
    }
};
__device__ __forceinline__ Lb<QT_IQ2_XXS> decode(const Raw<QT_IQ2_XXS> &w, int) {
    Lb<QT_IQ2_XXS> o;
    const float d = f16(w.d);
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const uint32_t g = w.q[2 * j], s = w.q[2 * j + 1];
#pragma unroll
        for (int l = 0; l < 4; l++)
            grid8(QB_TAB(iq2xxs)[(g >> (8 * l)) & 0xFFu], ksigns((s >> (7 * l)) & 127u), o.q[8 * j + 2 * l],
                  o.q[8 * j + 2 * l + 1]);
        o.a[j] = qb_iq2_scale(d, s >> 28);
    }
    return o;
}

/* IQ2_XS (74 bytes): d, a 16-bit word per group (9-bit grid index, 7 sign bits), a nibble scale
 * per 16 elements. */
template <> struct Raw<QT_IQ2_XS> {
    uint32_t q[4], sc, d;
    __device__ void load(const uint8_t *row, int u) {
        const uint8_t *bp = row + (int64_t)(u >> 2) * QB_B_IQ2_XS;
        ldb<16>(bp + 2 + 16 * (u & 3), q);
        sc = ld16(bp + 66 + 2 * (u & 3));
        d = ld16(bp);
    }
};
__device__ __forceinline__ Lb<QT_IQ2_XS> decode(const Raw<QT_IQ2_XS> &w, int) {
    Lb<QT_IQ2_XS> o;
    const float d = f16(w.d);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const uint32_t v = (w.q[i >> 1] >> (16 * (i & 1))) & 0xFFFFu;
        grid8(QB_TAB(iq2xs)[v & 511u], ksigns(v >> 9), o.q[2 * i], o.q[2 * i + 1]);
    }
#pragma unroll
    for (int r = 0; r < 4; r++) o.a[r] = qb_iq2_scale(d, (w.sc >> (4 * r)) & 0xFu);
    return o;
}

/* IQ2_S (82 bytes): d, qs[32] (grid index low bytes), signs[32], qh[8] (2 index bits a group),
 * scales[8] (a nibble per 16 elements). */
template <> struct Raw<QT_IQ2_S> {
    uint32_t qs[2], sg[2], qh, sc, d;
    __device__ void load(const uint8_t *row, int u) {
        const uint8_t *bp = row + (int64_t)(u >> 2) * QB_B_IQ2_S;
        const int q = u & 3;
        ldb<8>(bp + 2 + 8 * q, qs);
        ldb<8>(bp + 34 + 8 * q, sg);
        qh = ld16(bp + 66 + 2 * q);
        sc = ld16(bp + 74 + 2 * q);
        d = ld16(bp);
    }
};
__device__ __forceinline__ Lb<QT_IQ2_S> decode(const Raw<QT_IQ2_S> &w, int) {
    Lb<QT_IQ2_S> o;
    const float d = f16(w.d);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const uint32_t sh = 8 * (i & 3);
        const uint32_t idx = ((w.qs[i >> 2] >> sh) & 0xFFu) | (((w.qh >> (2 * i)) & 3u) << 8);
        grid8(QB_TAB(iq2s)[idx], (w.sg[i >> 2] >> sh) & 0xFFu, o.q[2 * i], o.q[2 * i + 1]);
    }
#pragma unroll
    for (int r = 0; r < 4; r++) o.a[r] = qb_iq2_scale(d, (w.sc >> (4 * r)) & 0xFu);
    return o;
}

/* IQ3_XXS (98 bytes): d, qs[64] (grid bytes, 4 elements each), a word per 32 elements of
 * 4 x 7 sign bits + scale. */
template <> struct Raw<QT_IQ3_XXS> {
    uint32_t q[4], aux[2], d;
    __device__ void load(const uint8_t *row, int u) {
        const uint8_t *bp = row + (int64_t)(u >> 2) * QB_B_IQ3_XXS;
        const int q4 = u & 3;
        ldb<16>(bp + 2 + 16 * q4, q);
        ldb<8>(bp + 66 + 8 * q4, aux);
        d = ld16(bp);
    }
};
__device__ __forceinline__ Lb<QT_IQ3_XXS> decode(const Raw<QT_IQ3_XXS> &w, int) {
    Lb<QT_IQ3_XXS> o;
    const float d = f16(w.d);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const uint32_t h = w.q[i >> 1] >> (16 * (i & 1));
        const uint32_t s = ksigns((w.aux[i >> 2] >> (7 * (i & 3))) & 127u);
        o.q[2 * i] = sgn4(QB_TAB(iq3xxs)[h & 0xFFu], s);
        o.q[2 * i + 1] = sgn4(QB_TAB(iq3xxs)[(h >> 8) & 0xFFu], s >> 4);
    }
#pragma unroll
    for (int j = 0; j < 2; j++) o.a[j] = qb_iq3xxs_scale(d, w.aux[j] >> 28);
    return o;
}

/* IQ3_S (110 bytes): d, qs[64] (grid index low bytes), qh[8] (9th bits), signs[32], scales[4]
 * (a nibble per 32 elements). */
template <> struct Raw<QT_IQ3_S> {
    uint32_t q[4], sg[2], qh, sc, d;
    __device__ void load(const uint8_t *row, int u) {
        const uint8_t *bp = row + (int64_t)(u >> 2) * QB_B_IQ3_S;
        const int q4 = u & 3;
        ldb<16>(bp + 2 + 16 * q4, q);
        ldb<8>(bp + 74 + 8 * q4, sg);
        qh = ld16(bp + 66 + 2 * q4);
        sc = ld16(bp + 106 + 2 * (q4 >> 1)) >> (8 * (q4 & 1));
        d = ld16(bp);
    }
};
__device__ __forceinline__ Lb<QT_IQ3_S> decode(const Raw<QT_IQ3_S> &w, int) {
    Lb<QT_IQ3_S> o;
    const float d = f16(w.d);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const uint32_t h = w.q[i >> 1] >> (16 * (i & 1));
        const uint32_t x0 = (h & 0xFFu) | (((w.qh >> (2 * i)) & 1u) << 8);
        const uint32_t x1 = ((h >> 8) & 0xFFu) | (((w.qh >> (2 * i + 1)) & 1u) << 8);
        const uint32_t s = (w.sg[i >> 2] >> (8 * (i & 3))) & 0xFFu;
        o.q[2 * i] = sgn4(QB_TAB(iq3s)[x0], s);
        o.q[2 * i + 1] = sgn4(QB_TAB(iq3s)[x1], s >> 4);
    }
#pragma unroll
    for (int j = 0; j < 2; j++) o.a[j] = qb_iq3s_scale(d, (w.sc >> (4 * j)) & 0xFu);
    return o;
}

/* IQ1_S (50 bytes): d, qs[32] (grid index low bytes), a 16-bit word per 32 elements: 3 index
 * bits a group, a 3-bit scale at bit 12, the delta's sign at bit 15. */
template <> struct Raw<QT_IQ1_S> {
    uint32_t qs[2], qh[1], d;
    __device__ void load(const uint8_t *row, int u) {
        const uint8_t *bp = row + (int64_t)(u >> 2) * QB_B_IQ1_S;
        const int q = u & 3;
        ldb<8>(bp + 2 + 8 * q, qs);
        ldb<4>(bp + 34 + 4 * q, qh);
        d = ld16(bp);
    }
};
__device__ __forceinline__ Lb<QT_IQ1_S> decode(const Raw<QT_IQ1_S> &w, int) {
    Lb<QT_IQ1_S> o;
    const float d = f16(w.d);
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const uint32_t h = (w.qh[0] >> (16 * j)) & 0xFFFFu;
        const bool neg = (h & 0x8000u) != 0;
#pragma unroll
        for (int l = 0; l < 4; l++) {
            const int i = 4 * j + l;
            const uint64_t row = QB_TAB(iq1s)[((w.qs[j] >> (8 * l)) & 0xFFu) | (((h >> (3 * l)) & 7u) << 8)];
            o.q[2 * i] = iq1w((uint32_t)row, neg);
            o.q[2 * i + 1] = iq1w((uint32_t)(row >> 32), neg);
        }
        o.a[j] = qb_mul(qb_iq1_scale(d, (h >> 12) & 7u), 0.125f);
    }
    return o;
}

/* IQ1_M (56 bytes): qs[32], qh[16] (a nibble a group: 3 index bits, the delta's sign), four
 * 16-bit words of 3-bit scales (one per 16 elements) whose top nibbles hold the fp16 d. */
template <> struct Raw<QT_IQ1_M> {
    uint32_t qs[2], qh[1], sc[2];
    __device__ void load(const uint8_t *row, int u) {
        const uint8_t *bp = row + (int64_t)(u >> 2) * QB_B_IQ1_M;
        const int q = u & 3;
        ldb<8>(bp + 8 * q, qs);
        ldb<4>(bp + 32 + 4 * q, qh);
        ldb<8>(bp + 48, sc);
    }
};
__device__ __forceinline__ Lb<QT_IQ1_M> decode(const Raw<QT_IQ1_M> &w, int u) {
    Lb<QT_IQ1_M> o;
    const uint32_t s0 = w.sc[0] & 0xFFFFu, s1 = w.sc[0] >> 16, s2 = w.sc[1] & 0xFFFFu, s3 = w.sc[1] >> 16;
    const float d = qb_half(qb_iq1m_dbits(s0, s1, s2, s3));
    const int q = u & 3;
    const uint32_t sw = q == 0 ? s0 : q == 1 ? s1 : q == 2 ? s2 : s3;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const uint32_t nib = (w.qh[0] >> (4 * i)) & 0xFu;
        const uint64_t row = QB_TAB(iq1s)[((w.qs[i >> 2] >> (8 * (i & 3))) & 0xFFu) | ((nib & 7u) << 8)];
        o.q[2 * i] = iq1w((uint32_t)row, (nib & 8u) != 0);
        o.q[2 * i + 1] = iq1w((uint32_t)(row >> 32), (nib & 8u) != 0);
    }
#pragma unroll
    for (int r = 0; r < 4; r++) o.a[r] = qb_mul(qb_iq1_scale(d, (sw >> (3 * r)) & 7u), 0.125f);
    return o;
}

/* TQ2_0 (66 bytes): qs[64] (2-bit digits, four planes per 32 bytes), d. */
template <> struct Raw<QT_TQ2_0> {
    uint32_t q[8], d;
    __device__ void load(const uint8_t *row, int u) {
        const uint8_t *bp = row + (int64_t)(u >> 2) * QB_B_TQ2_0;
        ldb<32>(bp + 32 * ((u & 3) >> 1), q);
        d = ld16(bp + 64);
    }
};
__device__ __forceinline__ Lb<QT_TQ2_0> decode(const Raw<QT_TQ2_0> &w, int u) {
    Lb<QT_TQ2_0> o;
    const int p0 = 4 * (u & 1); /* planes 2 (u & 1) and 2 (u & 1) + 1 */
#pragma unroll
    for (int t = 0; t < 8; t++) {
        o.q[t] = __vsub4((w.q[t] >> p0) & 0x03030303u, 0x01010101u);
        o.q[8 + t] = __vsub4((w.q[t] >> (p0 + 2)) & 0x03030303u, 0x01010101u);
    }
    o.a[0] = o.a[1] = f16(w.d);
    return o;
}

/* TQ1_0 (54 bytes): qs[48], qh[4], d; base-3 digits (qb_tq1_0). Element order: the five digit
 * planes of qs[0..31], then of qs[32..47], then the four of qh. Quarter 0: planes 0, 1 of
 * qs[0..31]; 1: planes 2, 3; 2: plane 4, then planes 0, 1 of qs[32..47]; 3: planes 2, 3, 4 of
 * qs[32..47], then qh's four. */
template <> struct Raw<QT_TQ1_0> {
    uint32_t q[13], d;
    __device__ void load(const uint8_t *row, int u) {
        const uint8_t *bp = row + (int64_t)(u >> 2) * QB_B_TQ1_0;
        ldb<52>(bp, q);
        d = ld16(bp + 52);
    }
};
__device__ __forceinline__ Lb<QT_TQ1_0> decode(const Raw<QT_TQ1_0> &w, int u) {
    Lb<QT_TQ1_0> o;
    const int q = u & 3;
    if (q < 2) {
        const uint32_t pa = q == 0 ? 1u : 9u, pb = q == 0 ? 3u : 27u;
#pragma unroll
        for (int t = 0; t < 8; t++) o.q[t] = tdig(w.q[t], pa), o.q[8 + t] = tdig(w.q[t], pb);
    } else if (q == 2) {
#pragma unroll
        for (int t = 0; t < 8; t++) o.q[t] = tdig(w.q[t], 81u);
#pragma unroll
        for (int t = 0; t < 4; t++) o.q[8 + t] = tdig(w.q[8 + t], 1u), o.q[12 + t] = tdig(w.q[8 + t], 3u);
    } else {
#pragma unroll
        for (int t = 0; t < 4; t++) {
            o.q[t] = tdig(w.q[8 + t], 9u);
            o.q[4 + t] = tdig(w.q[8 + t], 27u);
            o.q[8 + t] = tdig(w.q[8 + t], 81u);
        }
        o.q[12] = tdig(w.q[12], 1u), o.q[13] = tdig(w.q[12], 3u);
        o.q[14] = tdig(w.q[12], 9u), o.q[15] = tdig(w.q[12], 27u);
    }
    o.a[0] = o.a[1] = f16(w.d);
    return o;
}

/* MXFP4 (17-byte blocks of 32): a unit is blocks 2u and 2u + 1, 34 bytes from an even offset:
 * e (E8M0), qs[16] (element j the low nibble of qs[j], 16 + j the high one). */
template <> struct Raw<QT_MXFP4> {
    uint32_t r[9];
    __device__ void load(const uint8_t *row, int u) { ldb<34>(row + (int64_t)u * 34, r); }
};
template <int J> __device__ __forceinline__ void mxfp4_block(const uint32_t (&r)[9], Lb<QT_MXFP4> &o) {
    const uint32_t qw[4] = {word_at<17 * J + 1>(r), word_at<17 * J + 5>(r), word_at<17 * J + 9>(r),
                            word_at<17 * J + 13>(r)};
#pragma unroll
    for (int t = 0; t < 4; t++) {
        o.q[8 * J + t] = fp4x4(qw[t] & 0x0F0F0F0Fu);
        o.q[8 * J + 4 + t] = fp4x4((qw[t] >> 4) & 0x0F0F0F0Fu);
    }
    o.a[J] = qb_bits(qb_e8m0_half_bits(word_at<17 * J>(r) & 0xFFu));
}
__device__ __forceinline__ Lb<QT_MXFP4> decode(const Raw<QT_MXFP4> &w, int) {
    Lb<QT_MXFP4> o;
    mxfp4_block<0>(w.r, o);
    mxfp4_block<1>(w.r, o);
    return o;
}

/* NVFP4 (36-byte blocks of 64, one unit): 4 UE4M3 scales (one per 16 elements), qs[32]:
 * sub-block s holds qs[8s .. 8s + 7], low nibbles first. */
template <> struct Raw<QT_NVFP4> {
    uint32_t r[9];
    __device__ void load(const uint8_t *row, int u) { ldb<36>(row + (int64_t)u * QB_B_NVFP4, r); }
};
__device__ __forceinline__ Lb<QT_NVFP4> decode(const Raw<QT_NVFP4> &w, int) {
    Lb<QT_NVFP4> o;
#pragma unroll
    for (int s = 0; s < 4; s++) {
        const uint32_t qa = w.r[1 + 2 * s], qb = w.r[2 + 2 * s];
        o.q[4 * s] = fp4x4(qa & 0x0F0F0F0Fu);
        o.q[4 * s + 1] = fp4x4(qb & 0x0F0F0F0Fu);
        o.q[4 * s + 2] = fp4x4((qa >> 4) & 0x0F0F0F0Fu);
        o.q[4 * s + 3] = fp4x4((qb >> 4) & 0x0F0F0F0Fu);
        o.a[s] = qb_ue4m3_half((w.r[0] >> (8 * s)) & 0xFFu);
    }
    return o;
}

/* IQ4_NL (18-byte blocks of 32): a unit is blocks 2u and 2u + 1 (36 bytes): d, qs[16] (element j
 * the low nibble of qs[j], 16 + j the high one). */
template <> struct Raw<QT_IQ4_NL> {
    uint32_t r[9];
    __device__ void load(const uint8_t *row, int u) { ldb<36>(row + (int64_t)u * 36, r); }
};
template <int J> __device__ __forceinline__ void iq4nl_block(const uint32_t (&r)[9], Lb<QT_IQ4_NL> &o) {
    const uint32_t qw[4] = {word_at<18 * J + 2>(r), word_at<18 * J + 6>(r), word_at<18 * J + 10>(r),
                            word_at<18 * J + 14>(r)};
#pragma unroll
    for (int t = 0; t < 4; t++) {
        o.q[8 * J + t] = iq4x4(qw[t] & 0x0F0F0F0Fu);
        o.q[8 * J + 4 + t] = iq4x4((qw[t] >> 4) & 0x0F0F0F0Fu);
    }
    o.a[J] = f16(word_at<18 * J>(r));
}
__device__ __forceinline__ Lb<QT_IQ4_NL> decode(const Raw<QT_IQ4_NL> &w, int) {
    Lb<QT_IQ4_NL> o;
    iq4nl_block<0>(w.r, o);
    iq4nl_block<1>(w.r, o);
    return o;
}

/* Q4_0 (18 bytes: d, qs[16]), Q4_1 (20: d, m, qs[16]), Q5_0 (22: d, qh[4], qs[16]), Q5_1 (24: d, m,
 * qh[4], qs[16]): a unit is blocks 2u and 2u + 1; element j of a block is the low nibble of qs[j],
 * 16 + j the high one, with bit j (16 + j) of qh as bit 4 (Q5); Q4_0 subtracts 8, Q5_0 16. */
template <int T> struct Leg {
    static constexpr int BB = T == QT_Q4_0 ? 18 : T == QT_Q4_1 ? 20 : T == QT_Q5_0 ? 22 : 24; /* block bytes */
    static constexpr bool M = T == QT_Q4_1 || T == QT_Q5_1;  /* a min after d */
    static constexpr bool H = T == QT_Q5_0 || T == QT_Q5_1;  /* qh */
    static constexpr int QS = 2 + (M ? 2 : 0) + (H ? 4 : 0); /* offset of qs */
    static constexpr uint32_t OFF = T == QT_Q4_0 ? 0x08080808u : T == QT_Q5_0 ? 0x10101010u : 0u;
};
template <int T> struct RawLeg {
    uint32_t r[(2 * Leg<T>::BB + 3) / 4];
    __device__ void load(const uint8_t *row, int u) { ldb<2 * Leg<T>::BB>(row + (int64_t)u * (2 * Leg<T>::BB), r); }
};
template <> struct Raw<QT_Q4_0> : RawLeg<QT_Q4_0> {};
template <> struct Raw<QT_Q4_1> : RawLeg<QT_Q4_1> {};
template <> struct Raw<QT_Q5_0> : RawLeg<QT_Q5_0> {};
template <> struct Raw<QT_Q5_1> : RawLeg<QT_Q5_1> {};
/* bits 0..3 of s as bit 4 of the four bytes */
__device__ __forceinline__ uint32_t hbit4(uint32_t s) { return (((s & 0xFu) * 0x00204081u) & 0x01010101u) << 4; }
template <int T, int J, int N> __device__ __forceinline__ void leg_block(const uint32_t (&r)[N], Lb<T> &o) {
    using G = Leg<T>;
    constexpr int B = G::BB * J;
    uint32_t qh = 0;
    if constexpr (G::H) qh = word_at<B + 2 + (G::M ? 2 : 0)>(r);
    const uint32_t qw[4] = {word_at<B + G::QS>(r), word_at<B + G::QS + 4>(r), word_at<B + G::QS + 8>(r),
                            word_at<B + G::QS + 12>(r)};
#pragma unroll
    for (int t = 0; t < 4; t++) {
        uint32_t lo = qw[t] & 0x0F0F0F0Fu, hi = (qw[t] >> 4) & 0x0F0F0F0Fu;
        if constexpr (G::H) {
            lo |= hbit4(qh >> (4 * t));
            hi |= hbit4(qh >> (16 + 4 * t));
        }
        o.q[8 * J + t] = __vsub4(lo, G::OFF);
        o.q[8 * J + 4 + t] = __vsub4(hi, G::OFF);
    }
    o.a[J] = f16(word_at<B>(r));
    if constexpr (G::M) o.b[J] = f16(word_at<B + 2>(r));
}
template <int T> __device__ __forceinline__ Lb<T> decode_leg(const RawLeg<T> &w) {
    Lb<T> o;
    leg_block<T, 0>(w.r, o);
    leg_block<T, 1>(w.r, o);
    return o;
}
__device__ __forceinline__ Lb<QT_Q4_0> decode(const Raw<QT_Q4_0> &w, int) { return decode_leg<QT_Q4_0>(w); }
__device__ __forceinline__ Lb<QT_Q4_1> decode(const Raw<QT_Q4_1> &w, int) { return decode_leg<QT_Q4_1>(w); }
__device__ __forceinline__ Lb<QT_Q5_0> decode(const Raw<QT_Q5_0> &w, int) { return decode_leg<QT_Q5_0>(w); }
__device__ __forceinline__ Lb<QT_Q5_1> decode(const Raw<QT_Q5_1> &w, int) { return decode_leg<QT_Q5_1>(w); }

/* Q4_1/Q5_1 unit: blocks 0 and 1 with scales d0, d1 and mins m0, m1 (weight d q + m), x's (d, s)
 * of the two blocks, the exact dot products i0, i1 as floats. */
__device__ __forceinline__ float unit_q4_1(float d0, float m0, float d1, float m1, float dx0, float sx0, float dx1,
                                          float sx1, float i0, float i1) {
    const float a = __fadd_rn(__fmul_rn(d0, __fmul_rn(dx0, i0)), __fmul_rn(m0, sx0));
    const float b = __fadd_rn(__fmul_rn(d1, __fmul_rn(dx1, i1)), __fmul_rn(m1, sx1));
    return __fadd_rn(a, b);
}

/* IQ4_XS (136 bytes): d, scales_h (2 bits per 32 elements), scales_l[4] (a nibble per 32),
 * qs[128] (16 bytes per 32 elements, low nibbles first); dl = d * (ls - 32). */
template <> struct Raw<QT_IQ4_XS> {
    uint32_t q[8], h[2];
    __device__ void load(const uint8_t *row, int u) {
        const uint8_t *bp = row + (int64_t)(u >> 2) * 136;
        ldb<32>(bp + 8 + 32 * (u & 3), q);
        ldb<8>(bp, h);
    }
};
__device__ __forceinline__ Lb<QT_IQ4_XS> decode(const Raw<QT_IQ4_XS> &w, int u) {
    Lb<QT_IQ4_XS> o;
    const int q = u & 3;
    const float d = f16(w.h[0]);
#pragma unroll
    for (int j = 0; j < 2; j++) {
#pragma unroll
        for (int t = 0; t < 4; t++) {
            o.q[8 * j + t] = iq4x4(w.q[4 * j + t] & 0x0F0F0F0Fu);
            o.q[8 * j + 4 + t] = iq4x4((w.q[4 * j + t] >> 4) & 0x0F0F0F0Fu);
        }
        const int ib = 2 * q + j;
        const uint32_t ls = ((w.h[1] >> (8 * q + 4 * j)) & 0xFu) | (((w.h[0] >> (16 + 2 * ib)) & 3u) << 4);
        o.a[j] = qb_mul(d, qb_i2f((int)ls - 32));
    }
    return o;
}

/* Q2_K (84 bytes): scales[16] (scale nibble, min nibble per 16 elements), qs[64], d, dmin. A
 * quarter is bit pairs 2 (u & 1) and 2 (u & 1) + 1 of the 32 bytes of its 128-element half. */
template <> struct Raw<QT_Q2_K> {
    uint32_t q[8], sc, dd;
    __device__ void load(const uint8_t *row, int u) {
        const uint8_t *bp = row + (int64_t)(u >> 2) * QB_B_Q2_K;
        const int q4 = u & 3;
        ldb<32>(bp + 16 + 32 * (q4 >> 1), q);
        uint32_t s[1], m[1];
        ldb<4>(bp + 4 * q4, s);
        ldb<4>(bp + 80, m);
        sc = s[0], dd = m[0];
    }
};
__device__ __forceinline__ Lb<QT_Q2_K> decode(const Raw<QT_Q2_K> &w, int u) {
    Lb<QT_Q2_K> o;
    const int sa = 4 * (u & 1);
#pragma unroll
    for (int t = 0; t < 8; t++) {
        o.q[t] = (w.q[t] >> sa) & 0x03030303u;
        o.q[8 + t] = (w.q[t] >> (sa + 2)) & 0x03030303u;
    }
    const float d = f16(w.dd), dmin = f16(w.dd >> 16);
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const uint32_t s = (w.sc >> (8 * r)) & 0xFFu;
        o.a[r] = qb_mul(d, qb_i2f((int)(s & 0xFu)));
        o.b[r] = qb_mul(dmin, qb_i2f((int)(s >> 4)));
    }
    return o;
}

/* Q3_K (110 bytes): hmask[32], qs[64], scales[12] (6-bit, biased by 32), d. Same walk as Q2_K;
 * a clear hmask bit subtracts 4. */
template <> struct Raw<QT_Q3_K> {
    uint32_t hm[8], q[8], sc[3], d;
    __device__ void load(const uint8_t *row, int u) {
        const uint8_t *bp = row + (int64_t)(u >> 2) * QB_B_Q3_K;
        ldb<32>(bp, hm);
        ldb<32>(bp + 32 + 32 * ((u & 3) >> 1), q);
        ldb<12>(bp + 96, sc);
        d = ld16(bp + 108);
    }
};
__device__ __forceinline__ Lb<QT_Q3_K> decode(const Raw<QT_Q3_K> &w, int u) {
    Lb<QT_Q3_K> o;
    const int q4 = u & 3, sa = 4 * (q4 & 1), ma = 4 * (q4 >> 1) + 2 * (q4 & 1);
#pragma unroll
    for (int t = 0; t < 8; t++) {
        const uint32_t h0 = (~(w.hm[t] >> ma) & 0x01010101u) << 2, h1 = (~(w.hm[t] >> (ma + 1)) & 0x01010101u) << 2;
        o.q[t] = __vsub4((w.q[t] >> sa) & 0x03030303u, h0);
        o.q[8 + t] = __vsub4((w.q[t] >> (sa + 2)) & 0x03030303u, h1);
    }
    /* scale 4 q4 + r: low nibble of byte 4 q4 + r (q4 < 2) or high nibble of byte 4 q4 + r - 8,
     * high bits 2 q4 of byte 8 + r */
    const float d = f16(w.d);
    const uint32_t wl = (q4 & 1) ? w.sc[1] : w.sc[0];
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const uint32_t lo = (wl >> (8 * r + 4 * (q4 >> 1))) & 0xFu, hi = (w.sc[2] >> (8 * r + 2 * q4)) & 3u;
        o.a[r] = qb_mul(d, qb_i2f((int)(lo | (hi << 4)) - 32));
    }
    return o;
}

/* The unit's value with one x row (the head comment's order). */
template <int T> __device__ __forceinline__ float dot(const Lb<T> &w, const X64 &x, int) {
    if constexpr (LbT<T>::RUN == 32) {
        int s0 = 0, s1 = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            s0 = dp4(w.q[i], x.word(i), s0);
            s1 = dp4(w.q[8 + i], x.word(8 + i), s1);
        }
        if constexpr (LbT<T>::MIN32)
            return unit_q4_1(w.a[0], w.b[0], w.a[1], w.b[1], x.ds.x, x.ds.y, x.ds.z, x.ds.w, (float)s0, (float)s1);
        else
            return unit_q8_0(w.a[0], w.a[1], x.ds.x, x.ds.z, (float)s0, (float)s1);
    } else {
        float acc = 0.0f;
#pragma unroll
        for (int r = 0; r < 4; r++) {
            int s = 0, c = 0;
#pragma unroll
            for (int t = 0; t < 4; t++) {
                s = dp4(w.q[4 * r + t], x.word(4 * r + t), s);
                if constexpr (LbT<T>::MIN) c = dp4(0x01010101u, x.word(4 * r + t), c);
            }
            const float dx = r < 2 ? x.ds.x : x.ds.z;
            float term = __fmul_rn(w.a[r], __fmul_rn(dx, (float)s));
            if constexpr (LbT<T>::MIN) term = __fsub_rn(term, __fmul_rn(w.b[r], __fmul_rn(dx, (float)c)));
            acc = r == 0 ? term : __fadd_rn(acc, term);
        }
        return acc;
    }
}

#define G5_Q8_LB_DEC(T) \
    template <> struct Dec<T> { using type = Lb<T>; };
G5_Q8_LB_DEC(QT_IQ2_XXS)
G5_Q8_LB_DEC(QT_IQ2_XS)
G5_Q8_LB_DEC(QT_IQ2_S)
G5_Q8_LB_DEC(QT_IQ3_XXS)
G5_Q8_LB_DEC(QT_IQ3_S)
G5_Q8_LB_DEC(QT_IQ1_S)
G5_Q8_LB_DEC(QT_IQ1_M)
G5_Q8_LB_DEC(QT_TQ1_0)
G5_Q8_LB_DEC(QT_TQ2_0)
G5_Q8_LB_DEC(QT_MXFP4)
G5_Q8_LB_DEC(QT_NVFP4)
G5_Q8_LB_DEC(QT_Q2_K)
G5_Q8_LB_DEC(QT_Q3_K)
G5_Q8_LB_DEC(QT_IQ4_NL)
G5_Q8_LB_DEC(QT_IQ4_XS)
G5_Q8_LB_DEC(QT_Q4_0)
G5_Q8_LB_DEC(QT_Q4_1)
G5_Q8_LB_DEC(QT_Q5_0)
G5_Q8_LB_DEC(QT_Q5_1)
#undef G5_Q8_LB_DEC

} // namespace q8

/* One low-bit file's dispatch: the instances of type T for kind (gemv_q8_kern.cuh). */
template <int T>
static void q8_lb_run(int kind, const void *a, int nv, int64_t rb, int64_t k, int planes, cudaStream_t st) {
    const int units = (int)(k / 64);
    if (kind == Q8_GEMV) run_nv<GemvL, 8, T>((const cuk_gemv_q8_args *)a, nv, rb, units, planes, st);
    else if (kind == Q8_GATE_UP) run_nv<GateUpL, 4, T>((const cuk_moe_gate_up_q8_args *)a, nv, rb, units, planes, st);
    else run_nv<DownL, 4, T>((const cuk_moe_down_q8_args *)a, nv, rb, units, planes, st);
}

} // namespace cuk

#endif
