/* e^x for x <= 0 with the same bits on the host and the GPU, and the sampler's weights and masses
 * built on it (runtime/text/sample.c, cuda/sample.cu, specs/numerics.md "Token draws"), so that a
 * draw made from the same logits picks the same token wherever it runs.
 *
 * Plain IEEE double operations in a fixed order and nothing from a math library: the device form
 * spells every product and sum as its _rn intrinsic (which nvcc never fuses into a multiply-add),
 * the host form is compiled with -ffp-contract=off (the Makefile's CFLAGS, and cuda.mk's for the
 * host side of .cu files), so no product is fused into the sum that follows it. Reduction
 * x = m ln2/32 + r (|r| <= ln2/64; ln2 in two parts, so m times the high part is exact), a
 * degree-6 Taylor polynomial of e^r, times 2^((m mod 32)/32) from a table of 32 doubles, times
 * 2^floor(m/32) from its exponent bits. Within 3 ulp of e^x; 0 below
 * -708 (and for NaN and -inf), 1 at 0 and above. */
#ifndef G5_DET_EXP_H
#define G5_DET_EXP_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define DX_FN static __host__ __device__ __forceinline__
#if defined(__CUDA_ARCH__)
#define DX_MUL(a, b) __dmul_rn((a), (b))
#define DX_ADD(a, b) __dadd_rn((a), (b))
#else
#define DX_MUL(a, b) ((a) * (b))
#define DX_ADD(a, b) ((a) + (b))
#endif
#else
#define DX_FN static inline
#define DX_MUL(a, b) ((a) * (b))
#define DX_ADD(a, b) ((a) + (b))
#endif

/* 2^(j/32), j = 0..31, each the double nearest it (from 60-digit decimals) */
#define DX_TAB_INIT \
    {0x1.0000000000000p+0, 0x1.059b0d3158574p+0, 0x1.0b5586cf9890fp+0, 0x1.11301d0125b51p+0, \
     0x1.172b83c7d517bp+0, 0x1.1d4873168b9aap+0, 0x1.2387a6e756238p+0, 0x1.29e9df51fdee1p+0, \
     0x1.306fe0a31b715p+0, 0x1.371a7373aa9cbp+0, 0x1.3dea64c123422p+0, 0x1.44e086061892dp+0, \
     0x1.4bfdad5362a27p+0, 0x1.5342b569d4f82p+0, 0x1.5ab07dd485429p+0, 0x1.6247eb03a5585p+0, \
     0x1.6a09e667f3bcdp+0, 0x1.71f75e8ec5f74p+0, 0x1.7a11473eb0187p+0, 0x1.82589994cce13p+0, \
     0x1.8ace5422aa0dbp+0, 0x1.93737b0cdc5e5p+0, 0x1.9c49182a3f090p+0, 0x1.a5503b23e255dp+0, \
     0x1.ae89f995ad3adp+0, 0x1.b7f76f2fb5e47p+0, 0x1.c199bdd85529cp+0, 0x1.cb720dcef9069p+0, \
     0x1.d5818dcfba487p+0, 0x1.dfc97337b9b5fp+0, 0x1.ea4afa2a490dap+0, 0x1.f50765b6e4540p+0}
static const double dx_tab_h[32] = DX_TAB_INIT;
#ifdef __CUDACC__
static __device__ const double dx_tab_d[32] = DX_TAB_INIT;
#endif
#if defined(__CUDA_ARCH__)
#define DX_TAB dx_tab_d
#else
#define DX_TAB dx_tab_h
#endif

DX_FN double dx_exp_neg(double x) {
    if (!(x >= -708.0)) return 0.0;
    if (x >= 0.0) return 1.0;
    /* m = x * 32 / ln2 rounded to the nearest integer (ties to even) by the 1.5 * 2^52 shift;
     * x = m ln2 / 32 + r, e^x = 2^(m >> 5) * 2^((m & 31) / 32) * e^r */
    const double t = DX_MUL(x, 0x1.71547652b82fep+5);
    const double tm = DX_ADD(t, 0x1.8p+52);
    const double m = DX_ADD(tm, -0x1.8p+52);
    const double mh = DX_MUL(m, -0x1.62e42fee00000p-6); /* exact: |m| < 2^15, 33-bit constant */
    const double ml = DX_MUL(m, -0x1.a39ef35793c76p-38);
    const double rh = DX_ADD(x, mh);
    const double r = DX_ADD(rh, ml); /* |r| <= ln2 / 64 */
    /* Horner from 1/6! down to 1/0! (truncation below 4e-18 relative at |r| = ln2 / 64) */
    double p = 0x1.6c16c16c16c17p-10;
    p = DX_ADD(DX_MUL(p, r), 0x1.1111111111111p-7);
    p = DX_ADD(DX_MUL(p, r), 0x1.5555555555555p-5);
    p = DX_ADD(DX_MUL(p, r), 0x1.5555555555555p-3);
    p = DX_ADD(DX_MUL(p, r), 0x1.0000000000000p-1);
    p = DX_ADD(DX_MUL(p, r), 0x1.0000000000000p+0);
    p = DX_ADD(DX_MUL(p, r), 0x1.0000000000000p+0);
    const int64_t mi = (int64_t)m;
    const int64_t n = (mi - (mi & 31)) / 32; /* floor(m / 32): m - (m & 31) is a multiple of 32 */
    const uint64_t bits = (uint64_t)(n + 1023) << 52; /* n >= -1022 since x >= -708 */
    double s;
    memcpy(&s, &bits, sizeof s);
    return DX_MUL(DX_MUL(p, DX_TAB[mi & 31]), s);
}

/* ---- the sampler's weights as integer masses (runtime/text/sample.c, cuda/sample.cu) ----
 * A token of logit l (the largest being maxl) at temperature T weighs e^x, x = (l - maxl) / T in
 * double (1 for l == maxl, +inf included); its mass is weight * scale truncated, scale = 2^K with
 * K = 63 - the bit length of the vocabulary size (dx_mass_scale), so a whole vocabulary's masses
 * sum below 2^63. The exp is skipped where the mass is certainly 0: x below xmin = -K ln2 - 1e-6
 * gives e^x < 2^-K by more than dx_exp_neg's 3 ulp (so xmin's own rounding changes nothing). */

DX_FN int dx_mass_bits(uint32_t n_vocab) {
    int bits = 0;
    while (bits < 32 && (n_vocab >> bits) != 0) bits++;
    return 63 - bits;
}

DX_FN double dx_mass_xmin(int k) { return DX_ADD(DX_MUL((double)-k, 0.69314718055994531), -1e-6); }

DX_FN uint64_t dx_mass(float l, float maxl, float T, double scale, double xmin) {
    if (l == maxl) return (uint64_t)scale;
#if defined(__CUDA_ARCH__)
    const double x = __ddiv_rn(__dadd_rn((double)l, -(double)maxl), (double)T);
#else
    const double x = ((double)l - (double)maxl) / (double)T;
#endif
    return x < xmin ? 0 : (uint64_t)DX_MUL(dx_exp_neg(x), scale);
}

/* min-p's test, weight at temperature 1 >= min_p, with the exp only where x = l - maxl lies
 * within 1e-6 of lmin = log(min_p): further away the answer is the side x is on (the exp's
 * error and lmin's own are far below 1e-6, so lmin may come from any libm). */
DX_FN int dx_min_p_keeps(float l, float maxl, float min_p, double lmin) {
    if (l == maxl) return 1;
    const double x = DX_ADD((double)l, -(double)maxl);
    if (x >= DX_ADD(lmin, 1e-6)) return 1;
    if (x <= DX_ADD(lmin, -1e-6)) return 0;
    return dx_exp_neg(x) >= (double)min_p;
}

/* A logit as a key whose ascending order is descending logits (-0 as +0; NaN is never given). */
DX_FN uint32_t dx_desc_key(float l) {
    if (l == 0.0f) l = 0.0f;
    uint32_t u;
    memcpy(&u, &l, sizeof u);
    u = u & 0x80000000u ? ~u : u | 0x80000000u; /* ascending in the float's value */
    return ~u;
}

#if !defined(__CUDA_ARCH__)
__extension__ typedef unsigned __int128 dx_u128;
#endif

/* The high 64 bits of a * b. */
DX_FN uint64_t dx_mul_hi(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
    return __umul64hi(a, b);
#else
    return (uint64_t)(((dx_u128)a * b) >> 64);
#endif
}

/* The draw's point in [0, total): floor(k * total / 2^53) for k's 53 random bits (total < 2^63,
 * so the product's bits 53..115 fit). */
DX_FN uint64_t dx_draw_point(uint64_t k, uint64_t total) {
    return dx_mul_hi(k, total) << 11 | (k * total) >> 53;
}

/* top-p's need: max(1, ceil(top_p * z)) exactly (top_p = a 2^-sh, a the float's 24-bit mantissa,
 * the product in 128 bits as hi:lo); 1 for top_p <= 0. */
DX_FN uint64_t dx_top_p_need(float top_p, uint64_t z) {
    if (!(top_p > 0)) return 1;
    int e;
    const float f = frexpf(top_p, &e); /* top_p = f 2^e, f in [0.5, 1) */
    const uint64_t a = (uint64_t)ldexpf(f, 24);
    const int sh = 24 - e; /* >= 24 below 1 */
    const uint64_t lo = a * z, h = dx_mul_hi(a, z);
    if (sh >= 88) return 1; /* a z < 2^87: the ceiling is 1 (or 0, raised to 1) */
    if (sh >= 64) { /* ceil(h:lo / 2^sh) = (h >> (sh - 64)) + any bit below */
        const int t = sh - 64;
        const uint64_t q = h >> t, rest = lo | (t ? h & ((1ull << t) - 1) : 0);
        const uint64_t c = q + (rest != 0);
        return c ? c : 1;
    }
    const uint64_t q = (h << (64 - sh)) | (lo >> sh), rest = lo & ((1ull << sh) - 1);
    const uint64_t c = q + (rest != 0);
    return c ? c : 1;
}

/* A window token's logit after the penalties (llama.cpp's order): divided by the repeat penalty
 * if positive, multiplied by it if not, then count * frequency + presence subtracted; float
 * operations one at a time (the device spells them as _rn intrinsics). */
DX_FN float dx_penalized(float l, float repeat, float frequency, float presence, uint32_t count) {
#if defined(__CUDA_ARCH__)
    l = l <= 0 ? __fmul_rn(l, repeat) : __fdiv_rn(l, repeat);
    return __fsub_rn(l, __fadd_rn(__fmul_rn((float)count, frequency), presence));
#else
    l = l <= 0 ? l * repeat : l / repeat;
    const float f = (float)count * frequency;
    return l - (f + presence);
#endif
}

#endif
