/* Dequantizing GEMV kernels (plain, MoE gate+up fused, MoE down), templated on the ggml type.
 * Included by one cuda/gemv_<type>.cu per type (CUK_GEMV_INSTANTIATE) so that the types compile
 * in parallel; cuda/gemv.cu holds the validating C launchers and dispatches on the type.
 *
 * Design (all three kernels share it):
 * - A warp owns a tile of R weight rows and streams them through shared memory in chunks of NB
 *   whole blocks per row (about 0.5-1 KB per row), with 16-byte cp.async copies, STAGES chunks
 *   in flight. A chunk's bytes start at an arbitrary (even) offset; the copy is widened to 16-byte
 *   boundaries and the decoder reads at the offset, so every block size (18, 34, 210 bytes, ...)
 *   gets full-width coalesced loads.
 * - Each lane then decodes "groups" of 8 elements (two runs of 4 consecutive elements, which is
 *   how one 32-bit word of nibbles maps onto ggml's layouts), for all R rows, and multiplies them
 *   with the matching x values of every input vector: one x load serves R rows, one decoded
 *   weight serves NV vectors.
 * - Quants become floats without int->float conversions: a byte q < 128 placed in the mantissa
 *   of 0.5 gives f = 0.5 + q/256 exactly, and a group's contribution d*sum(q x) - m*sum(x) is
 *   formed as a*sum(f x) - b*sum(x) with a = 256 d, b = 128 d + m ("affine" types); signed
 *   8-bit quants and the IQ4 tables give exact integers (2^23 + q - (2^23 + 128)).
 * - Q4_K/Q5_K's packed 6-bit scales are decoded once per chunk by the whole warp into shared
 *   memory (float pairs a, b per 32-element sub-block) instead of once per group.
 * - Lane partial sums are reduced with shuffles; split-K warps of one CTA (used when there are
 *   too few row tiles to fill the GPU) are summed through shared memory in a fixed order, so
 *   results never depend on timing. */
#ifndef G5_GEMV_IMPL_CUH
#define G5_GEMV_IMPL_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cuda/cuk_internal.cuh"
#include "cuda/moe_plan.cuh"
#include "cuda/warp_tile.cuh"

namespace cuk {

enum { K_FLOAT = 0, K_AFFINE = 1, K_SIGNED = 2 };

/* Per type: BLK elements and BB bytes per block (F32/F16/BF16 use pseudo-blocks of 8 elements),
 * NB blocks per chunk, KIND of decoded values, COOP (warp-wide scale decode), TAB (IQ4 table). */
template <int T> struct Tr;
#define CUK_TR(T_, BLK_, BB_, NB_, KIND_, COOP_, TAB_)                                        \
    template <> struct Tr<T_> {                                                               \
        static constexpr int BLK = BLK_, BB = BB_, NB = NB_, KIND = KIND_;                    \
        static constexpr bool COOP = COOP_, TAB = TAB_;                                       \
    };
CUK_TR(QT_F32, 8, 32, 32, K_FLOAT, false, false)
CUK_TR(QT_F16, 8, 16, 64, K_FLOAT, false, false)
CUK_TR(QT_BF16, 8, 16, 64, K_FLOAT, false, false)
CUK_TR(QT_Q8_0, 32, 34, 16, K_SIGNED, false, false)
CUK_TR(QT_Q4_0, 32, 18, 32, K_AFFINE, false, false)
CUK_TR(QT_Q4_1, 32, 20, 32, K_AFFINE, false, false)
CUK_TR(QT_Q5_0, 32, 22, 32, K_AFFINE, false, false)
CUK_TR(QT_Q5_1, 32, 24, 32, K_AFFINE, false, false)
CUK_TR(QT_IQ4_NL, 32, 18, 32, K_SIGNED, false, true)
CUK_TR(QT_Q4_K, 256, 144, 4, K_AFFINE, true, false)
CUK_TR(QT_Q5_K, 256, 176, 4, K_AFFINE, true, false)
CUK_TR(QT_Q6_K, 256, 210, 4, K_AFFINE, false, false)
CUK_TR(QT_IQ4_XS, 256, 136, 4, K_SIGNED, false, true)
#undef CUK_TR

constexpr int WARPS = 4; /* per CTA, every kernel here */

/* Shared-memory geometry of one warp for type T and R rows. */
template <int T, int R> struct Geo {
    using Q = Tr<T>;
    static constexpr int CB = Q::NB * Q::BB;                  /* chunk bytes per row */
    static constexpr int CE = Q::NB * Q::BLK;                 /* chunk elements per row */
    static constexpr int SEG = 16 * ((CB + 30) / 16);         /* room for CB at any even offset */
    static constexpr int PPL = (SEG / 16 + 31) / 32;          /* 16-byte pieces per lane per row */
    static constexpr int STAGE = R * SEG;
    static constexpr int STAGES = 2; /* one chunk in flight while one is decoded: the decode,
                                       * not the memory, is the limit, so smem goes to more
                                       * resident warps rather than deeper pipelines */
    static constexpr int NSC = Q::COOP ? R * Q::NB * 8 : 0;   /* float2 scale pairs */
    static constexpr int WARP_BYTES = STAGES * STAGE + NSC * 8;
    static constexpr int GPB = Q::BLK / 8;                    /* groups per block */
    static constexpr int GPL = (Q::NB * GPB + 31) / 32;       /* groups per lane per chunk */
};

template <int T, int R, int NV> constexpr size_t smem_bytes() {
    return (size_t)WARPS * Geo<T, R>::WARP_BYTES + (size_t)WARPS * R * NV * sizeof(float) +
           (Tr<T>::TAB ? 16 * sizeof(float) : 0);
}

/* ---- cp.async ---- */

__device__ __forceinline__ void cp16(void *sdst, const void *gsrc) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(sdst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gsrc) : "memory");
}
/* Copies src_bytes (1..16) and zero-fills the rest of the 16. */
__device__ __forceinline__ void cp16n(void *sdst, const void *gsrc, int src_bytes) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(sdst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gsrc),
                 "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* ---- small decoders (host+device: tests/gpu checks them on the CPU too) ---- */

#define CUK_HD __host__ __device__ __forceinline__

CUK_HD float as_f32(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}
/* __byte_perm without the sign-replicate mode (selector nibbles 0..7 only). */
CUK_HD uint32_t bperm(uint32_t x, uint32_t y, uint32_t s) {
#ifdef __CUDA_ARCH__
    return __byte_perm(x, y, s);
#else
    const uint64_t v = ((uint64_t)y << 32) | x;
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) r |= (uint32_t)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
    return r;
#endif
}

CUK_HD float ld_half(const uint8_t *p) {
    return __half2float(__ushort_as_half(*(const uint16_t *)p));
}
CUK_HD uint32_t ld32_a2(const uint8_t *p) {
    const uint16_t *q = (const uint16_t *)p;
    return (uint32_t)q[0] | ((uint32_t)q[1] << 16);
}
CUK_HD uint32_t ld32_a4(const uint8_t *p) { return *(const uint32_t *)p; }
template <bool A4> CUK_HD uint32_t ld32(const uint8_t *p) {
    return A4 ? ld32_a4(p) : ld32_a2(p);
}

/* Small integer (|v| < 2^22) to float without the slow conversion unit. */
CUK_HD float i2f(int v) {
    return as_f32((uint32_t)(0x4B400000 + v)) - 12582912.0f;
}

/* The 4 bytes of u (each < 128) as f = 0.5 + q/256, exactly. */
CUK_HD void u7x4(uint32_t u, float *f) {
    f[0] = as_f32(bperm(u, 0x3F000000u, 0x7044));
    f[1] = as_f32(bperm(u, 0x3F000000u, 0x7144));
    f[2] = as_f32(bperm(u, 0x3F000000u, 0x7244));
    f[3] = as_f32(bperm(u, 0x3F000000u, 0x7344));
}

/* The 4 signed bytes of u as exact floats. */
CUK_HD void s8x4(uint32_t u, float *f) {
    const uint32_t b = u ^ 0x80808080u;
    f[0] = as_f32(bperm(b, 0x4B000000u, 0x7440)) - 8388736.0f;
    f[1] = as_f32(bperm(b, 0x4B000000u, 0x7441)) - 8388736.0f;
    f[2] = as_f32(bperm(b, 0x4B000000u, 0x7442)) - 8388736.0f;
    f[3] = as_f32(bperm(b, 0x4B000000u, 0x7443)) - 8388736.0f;
}

/* Bits 0..3 of x moved to bit 4 of bytes 0..3 (the 5th bit of Q5_0/Q5_1 quants). */
CUK_HD uint32_t spread4(uint32_t x) {
    return (((x & 0xFu) * 0x00204081u) & 0x01010101u) << 4;
}

CUK_HD void tab8(uint32_t u, const float *tab, float *f) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[i] = tab[(u >> (8 * i)) & 0xF];
        f[4 + i] = tab[(u >> (8 * i + 4)) & 0xF];
    }
}

/* Element offsets (within the block) of group gi's two runs of 4. */
template <int T> CUK_HD void run_offsets(int gi, int &ea, int &eb) {
    if constexpr (T == QT_F32 || T == QT_F16 || T == QT_BF16) {
        ea = 0, eb = 4;
    } else if constexpr (T == QT_Q8_0) {
        ea = 8 * gi, eb = 8 * gi + 4;
    } else if constexpr (Tr<T>::BLK == 32) { /* Q4_0 Q4_1 Q5_0 Q5_1 IQ4_NL: word gi of qs */
        ea = 4 * gi, eb = 16 + 4 * gi;
    } else if constexpr (T == QT_Q4_K || T == QT_Q5_K) { /* pair p = gi/8, word t = gi%8 */
        ea = 64 * (gi >> 3) + 4 * (gi & 7), eb = ea + 32;
    } else if constexpr (T == QT_Q6_K) { /* half n, ql word h, l = 4*(gi%8) */
        ea = 128 * (gi >> 4) + 32 * ((gi >> 3) & 1) + 4 * (gi & 7), eb = ea + 64;
    } else { /* IQ4_XS: sub-block ib = gi/4, word t = gi%4 */
        ea = 32 * (gi >> 2) + 4 * (gi & 3), eb = ea + 16;
    }
}

/* Decodes group gi of the block at bp (shared memory) into f[8] (run A then run B) and the
 * scales s = {aA, bA, aB, bB}; see the file comment for what a and b mean per KIND. cs: this
 * block's 8 (a, b) pairs for COOP types. */
template <int T>
CUK_HD void dec(const uint8_t *bp, int gi, const float2 *cs, const float *tab,
                                    float *f, float *s) {
    constexpr bool A4 = Tr<T>::BB % 4 == 0;
    if constexpr (T == QT_F32) {
        const float4 a = ((const float4 *)bp)[0], b = ((const float4 *)bp)[1];
        f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
    } else if constexpr (T == QT_F16) {
        const uint4 u = *(const uint4 *)bp;
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            f[2 * i] = __half2float(__ushort_as_half((unsigned short)(w[i] & 0xFFFFu)));
            f[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(w[i] >> 16)));
        }
    } else if constexpr (T == QT_BF16) {
        const uint4 u = *(const uint4 *)bp;
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            f[2 * i] = as_f32(w[i] << 16);
            f[2 * i + 1] = as_f32(w[i] & 0xFFFF0000u);
        }
    } else if constexpr (T == QT_Q8_0) {
        const float d = ld_half(bp);
        s8x4(ld32_a2(bp + 2 + 8 * gi), f);
        s8x4(ld32_a2(bp + 6 + 8 * gi), f + 4);
        s[0] = d, s[2] = d;
    } else if constexpr (T == QT_Q4_0 || T == QT_Q4_1) {
        constexpr int QS = T == QT_Q4_0 ? 2 : 4;
        const float d = ld_half(bp);
        const uint32_t u = ld32<A4>(bp + QS + 4 * gi);
        u7x4(u & 0x0F0F0F0Fu, f);
        u7x4((u >> 4) & 0x0F0F0F0Fu, f + 4);
        const float b = T == QT_Q4_0 ? 136.0f * d : 128.0f * d - ld_half(bp + 2);
        s[0] = 256.0f * d, s[1] = b, s[2] = s[0], s[3] = b;
    } else if constexpr (T == QT_Q5_0 || T == QT_Q5_1) {
        constexpr int QH = T == QT_Q5_0 ? 2 : 4;
        const float d = ld_half(bp);
        const uint32_t qh = ld32<A4>(bp + QH);
        const uint32_t u = ld32<A4>(bp + QH + 4 + 4 * gi);
        u7x4((u & 0x0F0F0F0Fu) | spread4(qh >> (4 * gi)), f);
        u7x4(((u >> 4) & 0x0F0F0F0Fu) | spread4(qh >> (16 + 4 * gi)), f + 4);
        const float b = T == QT_Q5_0 ? 144.0f * d : 128.0f * d - ld_half(bp + 2);
        s[0] = 256.0f * d, s[1] = b, s[2] = s[0], s[3] = b;
    } else if constexpr (T == QT_IQ4_NL) {
        const float d = ld_half(bp);
        tab8(ld32_a2(bp + 2 + 4 * gi), tab, f);
        s[0] = d, s[2] = d;
    } else if constexpr (T == QT_Q4_K || T == QT_Q5_K) {
        const int p = gi >> 3, t = gi & 7;
        const uint32_t u = ld32_a4(bp + (T == QT_Q4_K ? 16 : 48) + 32 * p + 4 * t);
        uint32_t lo = u & 0x0F0F0F0Fu, hi = (u >> 4) & 0x0F0F0F0Fu;
        if constexpr (T == QT_Q5_K) {
            const uint32_t qh = ld32_a4(bp + 16 + 4 * t);
            lo |= ((qh >> (2 * p)) & 0x01010101u) << 4;
            hi |= ((qh >> (2 * p + 1)) & 0x01010101u) << 4;
        }
        u7x4(lo, f);
        u7x4(hi, f + 4);
#ifdef __CUDA_ARCH__
        const float4 sc = ((const float4 *)cs)[p]; /* pairs 2p, 2p+1 in one 16-byte load */
        s[0] = sc.x, s[1] = sc.y, s[2] = sc.z, s[3] = sc.w;
#else
        s[0] = cs[2 * p].x, s[1] = cs[2 * p].y, s[2] = cs[2 * p + 1].x, s[3] = cs[2 * p + 1].y;
#endif
    } else if constexpr (T == QT_Q6_K) {
        const int n = gi >> 4, h = (gi >> 3) & 1, l = 4 * (gi & 7);
        const uint32_t ql = ld32_a2(bp + 64 * n + 32 * h + l);
        const uint32_t qh = ld32_a2(bp + 128 + 32 * n + l);
        u7x4((ql & 0x0F0F0F0Fu) | (((qh >> (2 * h)) & 0x03030303u) << 4), f);
        u7x4(((ql >> 4) & 0x0F0F0F0Fu) | (((qh >> (4 + 2 * h)) & 0x03030303u) << 4), f + 4);
        const float d = ld_half(bp + 208);
        const int8_t *sc = (const int8_t *)(bp + 192 + 8 * n) + (l >> 4) + 2 * h;
        /* As the CPU: (d * sc) * (q - 32); the -32 folds into b = (128 + 32) * d * sc. */
        const float da = d * i2f(sc[0]), db = d * i2f(sc[4]);
        s[0] = 256.0f * da, s[1] = 160.0f * da, s[2] = 256.0f * db, s[3] = 160.0f * db;
    } else if constexpr (T == QT_IQ4_XS) {
        const int ib = gi >> 2, t = gi & 3;
        const float d = ld_half(bp);
        const uint32_t sh = *(const uint16_t *)(bp + 2);
        const uint32_t sl = bp[4 + (ib >> 1)];
        const int ls = (int)(((sl >> (4 * (ib & 1))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4));
        const float dl = d * i2f(ls - 32);
        tab8(ld32_a4(bp + 8 + 16 * ib + 4 * t), tab, f);
        s[0] = dl, s[2] = dl;
    }
}

/* Q4_K/Q5_K: the (a, b) pairs of sub-blocks 4h..4h+3 of the block at bp, (a, b) =
 * (256 d1, 128 d1 + m1) where the CPU's weights are d1 * q - m1 (ggml's get_scale_min_k4
 * unpacking, done four bytes at a time). */
CUK_HD void k4_half(const uint8_t *bp, int h, float2 *out) {
    const float d = ld_half(bp), dmin = ld_half(bp + 2);
    const uint32_t s0 = ld32_a4(bp + 4), s1 = ld32_a4(bp + 8), s2 = ld32_a4(bp + 12);
    uint32_t sc, mn;
    if (h == 0) {
        sc = s0 & 0x3F3F3F3Fu;
        mn = s1 & 0x3F3F3F3Fu;
    } else {
        sc = (s2 & 0x0F0F0F0Fu) | ((s0 >> 2) & 0x30303030u);
        mn = ((s2 >> 4) & 0x0F0F0F0Fu) | ((s1 >> 2) & 0x30303030u);
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float fs = as_f32(bperm(sc, 0x4B000000u, 0x7440u | i)) - 8388608.0f;
        const float fm = as_f32(bperm(mn, 0x4B000000u, 0x7440u | i)) - 8388608.0f;
        const float d1 = d * fs, m1 = dmin * fm;
        out[i] = make_float2(256.0f * d1, fmaf(128.0f, d1, m1));
    }
}

/* Q4_K/Q5_K: the warp decodes the (a, b) pairs of every 32-element sub-block of the chunk's
 * blocks for its R rows into sc[(r * NB + blk) * 8 + j], two lanes per block header. */
template <int T, int R>
__device__ __forceinline__ void coop_scales(const uint8_t *stage, const uint8_t *const *gseg,
                                            int nblk, float2 *sc, int lane) {
    using Q = Tr<T>;
    using G = Geo<T, R>;
    constexpr int NE = R * Q::NB * 2;
#pragma unroll
    for (int e0 = 0; e0 < NE; e0 += 32) {
        const int e = e0 + lane;
        const int r = e / (Q::NB * 2), blk = (e >> 1) % Q::NB, h = e & 1;
        if (e < NE && blk < nblk) {
            int off = 0; /* gseg[r] & 15 without indexing gseg at run time (stays in registers) */
#pragma unroll
            for (int rr = 0; rr < R; rr++)
                if (rr == r) off = (int)((uintptr_t)gseg[rr] & 15);
            const uint8_t *bp = stage + r * G::SEG + off + blk * Q::BB;
            float2 v[4];
            k4_half(bp, h, v);
            float4 *dst = (float4 *)(sc + (r * Q::NB + blk) * 8 + 4 * h);
            dst[0] = make_float4(v[0].x, v[0].y, v[1].x, v[1].y);
            dst[1] = make_float4(v[2].x, v[2].y, v[3].x, v[3].y);
        }
    }
}

/* Copies one chunk (nblk blocks of each of the R rows starting at gseg[r]) into stage. Only
 * a copy reaching the end of the tensor (wend[r]) takes the slow path that shortens the last
 * 16-byte piece. */
template <int T, int R>
__device__ __forceinline__ void issue(uint8_t *stage, const uint8_t *const *gseg,
                                      const uint8_t *const *wend, int nblk, int lane) {
    using G = Geo<T, R>;
    const int len = nblk * Tr<T>::BB;
#pragma unroll
    for (int r = 0; r < R; r++) {
        const uintptr_t a = (uintptr_t)gseg[r];
        const uint8_t *a0 = (const uint8_t *)(a & ~(uintptr_t)15) + 16 * lane;
        const int np = (int)(((a & 15) + len + 15) >> 4) - lane; /* pieces left for this lane */
        uint8_t *dst = stage + r * G::SEG + 16 * lane;
        if ((const uint8_t *)(a & ~(uintptr_t)15) + 16 * (np + lane) <= wend[r]) {
#pragma unroll
            for (int i = 0; i < G::PPL; i++)
                if (32 * i < np) cp16(dst + 512 * i, a0 + 512 * i);
        } else {
#pragma unroll
            for (int i = 0; i < G::PPL; i++) {
                if (32 * i < np) {
                    const ptrdiff_t rem = wend[r] - (a0 + 512 * i);
                    cp16n(dst + 512 * i, a0 + 512 * i, rem >= 16 ? 16 : (int)rem);
                }
            }
        }
    }
}

template <int XT> __device__ __forceinline__ float4 ldx4(const void *base, int64_t idx) {
    if constexpr (XT == CUK_ACT_F32) {
        return __ldg((const float4 *)((const float *)base + idx));
    } else {
        const uint2 u = __ldg((const uint2 *)((const uint16_t *)base + idx));
        return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xFFFF0000u),
                           __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xFFFF0000u));
    }
}

/* Distance from run A to run B in elements, per type (see run_offsets). */
template <int T> __host__ __device__ constexpr int run_b() {
    return Tr<T>::KIND == K_FLOAT || T == QT_Q8_0 ? 4
           : T == QT_Q4_K || T == QT_Q5_K         ? 32
           : T == QT_Q6_K                         ? 64
                                                  : 16;
}
/* Runs A and B share one scale (everything but Q4_K, Q5_K, Q6_K). */
template <int T> __host__ __device__ constexpr bool same_scale() {
    return !(T == QT_Q4_K || T == QT_Q5_K || T == QT_Q6_K);
}

/* What a lane does in every chunk, computed once: its GPL groups' block, group index and x
 * offset within the chunk. */
template <int T, int R> struct LanePlan {
    int blk[Geo<T, R>::GPL], gi[Geo<T, R>::GPL], xo[Geo<T, R>::GPL];
    __device__ __forceinline__ explicit LanePlan(int lane) {
#pragma unroll
        for (int q = 0; q < Geo<T, R>::GPL; q++) {
            const int g = lane + 32 * q;
            blk[q] = g / Geo<T, R>::GPB;
            gi[q] = g % Geo<T, R>::GPB;
            int ea, eb;
            run_offsets<T>(gi[q], ea, eb);
            xo[q] = blk[q] * Tr<T>::BLK + ea;
        }
    }
};

/* One row's contribution of one group: f (8 decoded values), s (scales), x runs xa, xb and
 * their sums (affine types). */
template <int T>
__device__ __forceinline__ float group_dot(const float *f, const float *s, const float4 &xa,
                                           const float4 &xb, float sxa, float sxb, float acc) {
    using Q = Tr<T>;
    if constexpr (same_scale<T>()) {
        float d = f[0] * xa.x;
        d = fmaf(f[1], xa.y, d);
        d = fmaf(f[2], xa.z, d);
        d = fmaf(f[3], xa.w, d);
        d = fmaf(f[4], xb.x, d);
        d = fmaf(f[5], xb.y, d);
        d = fmaf(f[6], xb.z, d);
        d = fmaf(f[7], xb.w, d);
        if constexpr (Q::KIND == K_FLOAT) return acc + d;
        else if constexpr (Q::KIND == K_SIGNED) return fmaf(s[0], d, acc);
        else return fmaf(-s[1], sxa + sxb, fmaf(s[0], d, acc));
    } else {
        float da = f[0] * xa.x;
        da = fmaf(f[1], xa.y, da);
        da = fmaf(f[2], xa.z, da);
        da = fmaf(f[3], xa.w, da);
        float db = f[4] * xb.x;
        db = fmaf(f[5], xb.y, db);
        db = fmaf(f[6], xb.z, db);
        db = fmaf(f[7], xb.w, db);
        if constexpr (Q::KIND == K_SIGNED) {
            return fmaf(s[2], db, fmaf(s[0], da, acc));
        } else {
            acc = fmaf(s[0], da, acc);
            acc = fmaf(-s[1], sxa, acc);
            acc = fmaf(s[2], db, acc);
            return fmaf(-s[3], sxb, acc);
        }
    }
}

/* acc[r][v] += the chunk's contribution (rows r < R, vectors v < NV; vectors >= nvec read
 * vector 0 and are ignored by the caller). x: the chunk's first element of vector 0; vector v
 * starts v * ldx elements after it, or vo[v] (GATH: the MoE kernels' gathered rows, vo[v] = 0
 * for v >= nvec).
 * NV <= 4: x of all vectors is loaded first and each row is decoded and used in turn;
 * NV > 4: all rows are decoded first and each vector's x is loaded and used in turn. */
template <int T, int R, int NV, int XT, bool GATH>
__device__ __forceinline__ void compute(const uint8_t *stage, const float2 *sc, const float *tab,
                                        const uint8_t *const *gseg, int nblk, const void *x,
                                        int64_t ldx, const int64_t *vo, int nvec,
                                        const LanePlan<T, R> &lp, int lane, float (&acc)[R][NV]) {
    using Q = Tr<T>;
    using G = Geo<T, R>;
    constexpr int EB = run_b<T>();
    const uint8_t *sp[R];
#pragma unroll
    for (int r = 0; r < R; r++) sp[r] = stage + r * G::SEG + ((uintptr_t)gseg[r] & 15);
    const int ng = nblk * G::GPB;
    if constexpr (NV == 1) {
        /* One vector: every group's x is requested before the first group is decoded, so the
         * x loads overlap the decoding instead of stalling each group. */
        float4 xa[G::GPL], xb[G::GPL];
#pragma unroll
        for (int q = 0; q < G::GPL; q++) {
            const bool on = lane + 32 * q < ng;
            xa[q] = on ? ldx4<XT>(x, lp.xo[q]) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            xb[q] = on ? ldx4<XT>(x, lp.xo[q] + EB) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int q = 0; q < G::GPL; q++) {
            if (lane + 32 * q >= ng) break;
            const int blk = lp.blk[q], gi = lp.gi[q];
            float sxa = 0.0f, sxb = 0.0f;
            if constexpr (Q::KIND == K_AFFINE) {
                sxa = (xa[q].x + xa[q].y) + (xa[q].z + xa[q].w);
                sxb = (xb[q].x + xb[q].y) + (xb[q].z + xb[q].w);
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                float f[8], s[4];
                dec<T>(sp[r] + blk * Q::BB, gi, Q::COOP ? sc + (r * Q::NB + blk) * 8 : nullptr,
                       tab, f, s);
                acc[r][0] = group_dot<T>(f, s, xa[q], xb[q], sxa, sxb, acc[r][0]);
            }
        }
    } else {
#pragma unroll
    for (int q = 0; q < G::GPL; q++) {
        if (lane + 32 * q >= ng) break;
        const int blk = lp.blk[q], gi = lp.gi[q], xo = lp.xo[q];
        if constexpr (NV <= 4) {
            float4 xa[NV], xb[NV];
            float sxa[NV], sxb[NV];
#pragma unroll
            for (int v = 0; v < NV; v++) {
                const int64_t o = (GATH ? vo[v] : (int64_t)(v < nvec ? v : 0) * ldx) + xo;
                xa[v] = ldx4<XT>(x, o);
                xb[v] = ldx4<XT>(x, o + EB);
                sxa[v] = sxb[v] = 0.0f;
                if constexpr (Q::KIND == K_AFFINE) {
                    sxa[v] = (xa[v].x + xa[v].y) + (xa[v].z + xa[v].w);
                    sxb[v] = (xb[v].x + xb[v].y) + (xb[v].z + xb[v].w);
                }
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                float f[8], s[4];
                dec<T>(sp[r] + blk * Q::BB, gi, Q::COOP ? sc + (r * Q::NB + blk) * 8 : nullptr,
                       tab, f, s);
#pragma unroll
                for (int v = 0; v < NV; v++)
                    acc[r][v] = group_dot<T>(f, s, xa[v], xb[v], sxa[v], sxb[v], acc[r][v]);
            }
        } else {
            float f[R][8], s[R][4];
#pragma unroll
            for (int r = 0; r < R; r++)
                dec<T>(sp[r] + blk * Q::BB, gi, Q::COOP ? sc + (r * Q::NB + blk) * 8 : nullptr,
                       tab, f[r], s[r]);
#pragma unroll
            for (int v = 0; v < NV; v++) {
                const int64_t o = (GATH ? vo[v] : (int64_t)(v < nvec ? v : 0) * ldx) + xo;
                const float4 xa = ldx4<XT>(x, o), xb = ldx4<XT>(x, o + EB);
                float sxa = 0.0f, sxb = 0.0f;
                if constexpr (Q::KIND == K_AFFINE) {
                    sxa = (xa.x + xa.y) + (xa.z + xa.w);
                    sxb = (xb.x + xb.y) + (xb.z + xb.w);
                }
#pragma unroll
                for (int r = 0; r < R; r++)
                    acc[r][v] = group_dot<T>(f[r], s[r], xa, xb, sxa, sxb, acc[r][v]);
            }
        }
    }
    }
}

/* One item of a warp's work list: the chunk's R row segments (global), their tensor ends, the
 * number of blocks and the x pointer of the chunk's first element. */
template <int R> struct Item {
    const uint8_t *gseg[R];
    const uint8_t *wend[R];
    int nblk;
    const void *x;
};

/* Streams a warp through items 0..nit-1 of `get` (get(i, item)), STAGES chunks in flight, and
 * adds every item's contribution to acc. */
template <int T, int R, int NV, int XT, bool GATH, class Get>
__device__ __forceinline__ void stream(const Get &get, int nit, uint8_t *wsm, const float *tab,
                                       int64_t ldx, const int64_t *vo, int nvec, int lane,
                                       float (&acc)[R][NV]) {
    using G = Geo<T, R>;
    float2 *sc = (float2 *)(wsm + G::STAGES * G::STAGE);
    const LanePlan<T, R> lp(lane);
#pragma unroll
    for (int s = 0; s < G::STAGES - 1; s++) {
        if (s < nit) {
            Item<R> it;
            get(s, it);
            issue<T, R>(wsm + s * G::STAGE, it.gseg, it.wend, it.nblk, lane);
        }
        cp_commit();
    }
    for (int i = 0; i < nit; i++) {
        const int j = i + G::STAGES - 1;
        if (j < nit) {
            Item<R> it;
            get(j, it);
            issue<T, R>(wsm + (j % G::STAGES) * G::STAGE, it.gseg, it.wend, it.nblk, lane);
        }
        cp_commit();
        cp_wait<G::STAGES - 1>();
        __syncwarp();
        Item<R> it;
        get(i, it);
        const uint8_t *st = wsm + (i % G::STAGES) * G::STAGE;
        if constexpr (Tr<T>::COOP) {
            coop_scales<T, R>(st, it.gseg, it.nblk, sc, lane);
            __syncwarp();
        }
        compute<T, R, NV, XT, GATH>(st, sc, tab, it.gseg, it.nblk, it.x, ldx, vo, nvec, lp, lane, acc);
        __syncwarp(); /* the next iteration's copy overwrites a buffer read here */
    }
}

/* The tile's total for lane l < R * NV (row l / NV, vector l % NV): the warp's sums, then the
 * tile's ks split-K warps added in order through shared memory. false: a warp other than the
 * tile's first, which stores nothing. Uniform over the CTA when ks > 1 (__syncthreads). */
template <int R, int NV>
__device__ __forceinline__ bool tile_total(float (&acc)[R][NV], float *red, int warp, int kw, int ks, int lane,
                                           float &val) {
    warp_sum<R, NV>(acc);
    val = pick<R, NV>(acc, lane);
    if (ks > 1) {
        if (lane < R * NV) red[warp * R * NV + lane] = val;
        __syncthreads();
        if (kw != 0) return false;
        val = 0.0f;
        if (lane < R * NV)
            for (int j = 0; j < ks; j++) val += red[(warp + j) * R * NV + lane];
    }
    return true;
}

/* ggml's kvalues_iq4nl, the non-linear 4-bit levels of IQ4_NL and IQ4_XS. */
#define CUK_IQ4_LEVELS                                                                          \
    {-127.0f, -104.0f, -83.0f, -65.0f, -49.0f, -35.0f, -22.0f, -10.0f,                          \
     1.0f,    13.0f,   25.0f,  38.0f,  53.0f,  69.0f,  89.0f,  113.0f}
__constant__ float c_iq4[16] = CUK_IQ4_LEVELS;
static const float c_iq4_host[16] = CUK_IQ4_LEVELS;

/* Shared memory: WARPS warp areas, then the split-K reduction area, then the IQ4 table. */
template <int T, int R, int NV> struct Smem {
    uint8_t *warp;
    float *red;
    float *tab;
    __device__ Smem(uint8_t *base, int w) {
        warp = base + w * Geo<T, R>::WARP_BYTES;
        red = (float *)(base + WARPS * Geo<T, R>::WARP_BYTES);
        tab = red + WARPS * R * NV;
        if constexpr (Tr<T>::TAB) {
            if (threadIdx.x < 16) tab[threadIdx.x] = c_iq4[threadIdx.x];
        }
        __syncthreads();
    }
};

/* Plain GEMV. Grid: row-tile groups; block: 4 warps. The CTA covers 4/ks row tiles of R rows;
 * the S = ks warps of a tile split its chunks: chunk c goes to warp c % S of the tile. The splits
 * are summed in split order, so timing never changes a bit. Each thread
 * copies its 16-byte pieces of the tile's chunks, decodes GPL groups of 8 elements per row per
 * chunk and accumulates R x NV partial sums; the warp (then the tile's warps, in order) sums
 * them and lanes l < R*NV store y[l % NV][m0 + l / NV]. */
template <int T, int R, int NV, int XT>
__global__ void __launch_bounds__(WARPS * 32, NV == 1 ? 8 : 1) /* NV 1: <= 64 registers */
    k_gemv(const uint8_t *__restrict__ w, int64_t rb, int64_t m, int nblk_row, int nchunks,
           const void *__restrict__ x, int64_t ldx, int nvec, float *__restrict__ y, int64_t ldy,
           int ks) {
    using Q = Tr<T>;
    using G = Geo<T, R>;
    extern __shared__ __align__(16) uint8_t smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    Smem<T, R, NV> sm(smem, warp);
    const int tpc = WARPS / ks;
    const int64_t m0 = ((int64_t)blockIdx.x * tpc + warp / ks) * R;
    const int kw = warp % ks;
    /* split index of this warp among the S = ks splits of its tile; chunk c -> c % S */
    const int sidx = kw, S = ks;
    const uint8_t *wend = w + m * rb;
    const uint8_t *rowp[R];
#pragma unroll
    for (int r = 0; r < R; r++) rowp[r] = w + (m0 + r < m ? m0 + r : m - 1) * rb;
    const size_t xsz = XT == CUK_ACT_F32 ? 4 : 2;
    auto get = [&](int i, Item<R> &it) {
        const int c = sidx + i * S;
#pragma unroll
        for (int r = 0; r < R; r++) {
            it.gseg[r] = rowp[r] + (int64_t)c * G::CB;
            it.wend[r] = wend;
        }
        const int left = nblk_row - c * Q::NB;
        it.nblk = left < Q::NB ? left : Q::NB;
        it.x = (const uint8_t *)x + (size_t)c * G::CE * xsz;
    };
    float acc[R][NV];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int v = 0; v < NV; v++) acc[r][v] = 0.0f;
    const int nit = sidx < nchunks ? (nchunks - sidx + S - 1) / S : 0;
    stream<T, R, NV, XT, false>(get, nit, sm.warp, sm.tab, ldx, nullptr, nvec, lane, acc);
    float val;
    if (!tile_total<R, NV>(acc, sm.red, warp, kw, ks, lane, val)) return;
    if (lane < R * NV) {
        const int r = lane / NV, v = lane % NV;
        if (m0 + r < m && v < nvec) y[(int64_t)v * ldy + m0 + r] = val;
    }
}

/* MoE gate+up, fused, by expert group (the plan, cuda/cuk.h). Grid: x = row-tile groups of
 * one expert, y = group g of the plan (CTAs of g >= n_groups return at once); block: 4 warps.
 * The group's NV <= CUK_MOE_GROUP pairs are the vectors: their tokens' x rows, gathered. A
 * warp's tile is RH = 2 rows of Wg[e] and the same 2 rows of Wu[e] (R = 4 rows sharing each x
 * load); split-K over ks warps as in k_gemv. Lanes l < RH * NV store silu(g) * u of row
 * l / NV for vector l % NV in its pair's out row. A vector's arithmetic is the one-vector
 * launch's (same lanes, same order), so rows never depend on n_tok. */
template <int T, int NV, int XT>
__global__ void __launch_bounds__(WARPS * 32, NV == 1 ? 6 : 2)
    k_gate_up(const uint8_t *__restrict__ wg, const uint8_t *__restrict__ wu, int64_t rb,
              int64_t m, int n_expert, int nblk_row, int nchunks, const int32_t *__restrict__ plan,
              int n_pairs, int top_k, const void *__restrict__ x, int64_t ldx,
              float *__restrict__ out, int64_t ldo, int ks) {
    constexpr int R = 4, RH = 2;
    using Q = Tr<T>;
    using G = Geo<T, R>;
    const PlanView pv(plan, n_pairs);
    const int grp = blockIdx.y;
    if (grp >= pv.n_groups()) return; /* uniform over the CTA */
    extern __shared__ __align__(16) uint8_t smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    Smem<T, R, NV> sm(smem, warp);
    const int tpc = WARPS / ks;
    const int64_t m0 = ((int64_t)blockIdx.x * tpc + warp / ks) * RH;
    const int kw = warp % ks;
    const int e = pv.expert(grp), pos0 = pv.start(grp), nvec = pv.count(grp);
    const size_t xsz = XT == CUK_ACT_F32 ? 4 : 2;
    int64_t vo[NV]; /* x row of vector v relative to vector 0's, in elements */
    const int64_t row0 = (int64_t)(pv.pair(pos0) / top_k) * ldx;
#pragma unroll
    for (int v = 0; v < NV; v++) vo[v] = v < nvec ? (int64_t)(pv.pair(pos0 + v) / top_k) * ldx - row0 : 0;
    const int64_t eoff = (int64_t)e * m * rb;
    const uint8_t *endg = wg + (int64_t)n_expert * m * rb, *endu = wu + (int64_t)n_expert * m * rb;
    const uint8_t *rowp[R];
#pragma unroll
    for (int r = 0; r < RH; r++) {
        const int64_t row = m0 + r < m ? m0 + r : m - 1;
        rowp[r] = wg + eoff + row * rb;
        rowp[RH + r] = wu + eoff + row * rb;
    }
    const uint8_t *xt = (const uint8_t *)x + (size_t)row0 * xsz;
    auto get = [&](int i, Item<R> &it) {
        const int c = kw + i * ks;
#pragma unroll
        for (int r = 0; r < R; r++) {
            it.gseg[r] = rowp[r] + (int64_t)c * G::CB;
            it.wend[r] = r < RH ? endg : endu;
        }
        const int left = nblk_row - c * Q::NB;
        it.nblk = left < Q::NB ? left : Q::NB;
        it.x = xt + (size_t)c * G::CE * xsz;
    };
    float acc[R][NV];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int v = 0; v < NV; v++) acc[r][v] = 0.0f;
    const int nit = kw < nchunks ? (nchunks - kw + ks - 1) / ks : 0;
    stream<T, R, NV, XT, true>(get, nit, sm.warp, sm.tab, ldx, vo, nvec, lane, acc);
    float val;
    if (!tile_total<R, NV>(acc, sm.red, warp, kw, ks, lane, val)) return;
    /* lane r * NV + v holds row r of vector v: rows 0..RH-1 gate, RH..R-1 up */
    const float up = __shfl_down_sync(0xffffffffu, val, RH * NV);
    const int r = lane / NV, v = lane % NV;
    if (lane < RH * NV && v < nvec && m0 + r < m) {
        float *o = out + (int64_t)pv.pair(pos0 + v) * ldo;
        o[m0 + r] = val / (1.0f + expf(-val)) * up;
    }
}

/* MoE down by expert group: k_gemv over Wd[e] for the group's NV vectors (its pairs' h rows,
 * gathered); row i of vector v goes to part[pair_v][i]. Grid: x = row-tile groups, y = plan
 * group; block: 4 warps, split-K over ks warps of a tile, summed in order. */
template <int T, int NV, int XT>
__global__ void __launch_bounds__(WARPS * 32, NV == 1 ? 6 : 2)
    k_down(const uint8_t *__restrict__ w, int64_t rb, int64_t m, int n_expert, int nblk_row,
           int nchunks, const int32_t *__restrict__ plan, int n_pairs, const void *__restrict__ h,
           int64_t ldh, float *__restrict__ part, int64_t ldp, int ks) {
    constexpr int R = 4;
    using Q = Tr<T>;
    using G = Geo<T, R>;
    const PlanView pv(plan, n_pairs);
    const int grp = blockIdx.y;
    if (grp >= pv.n_groups()) return;
    extern __shared__ __align__(16) uint8_t smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    Smem<T, R, NV> sm(smem, warp);
    const int tpc = WARPS / ks;
    const int64_t m0 = ((int64_t)blockIdx.x * tpc + warp / ks) * R;
    const int kw = warp % ks;
    const int e = pv.expert(grp), pos0 = pv.start(grp), nvec = pv.count(grp);
    const size_t xsz = XT == CUK_ACT_F32 ? 4 : 2;
    int64_t vo[NV];
    const int64_t row0 = (int64_t)pv.pair(pos0) * ldh;
#pragma unroll
    for (int v = 0; v < NV; v++) vo[v] = v < nvec ? (int64_t)pv.pair(pos0 + v) * ldh - row0 : 0;
    const uint8_t *we = w + (int64_t)e * m * rb;
    const uint8_t *wend = w + (int64_t)n_expert * m * rb;
    const uint8_t *rowp[R];
#pragma unroll
    for (int r = 0; r < R; r++) rowp[r] = we + (m0 + r < m ? m0 + r : m - 1) * rb;
    const uint8_t *ht = (const uint8_t *)h + (size_t)row0 * xsz;
    auto get = [&](int i, Item<R> &it) {
        const int c = kw + i * ks;
#pragma unroll
        for (int r = 0; r < R; r++) {
            it.gseg[r] = rowp[r] + (int64_t)c * G::CB;
            it.wend[r] = wend;
        }
        const int left = nblk_row - c * Q::NB;
        it.nblk = left < Q::NB ? left : Q::NB;
        it.x = ht + (size_t)c * G::CE * xsz;
    };
    float acc[R][NV];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int v = 0; v < NV; v++) acc[r][v] = 0.0f;
    const int nit = kw < nchunks ? (nchunks - kw + ks - 1) / ks : 0;
    stream<T, R, NV, XT, true>(get, nit, sm.warp, sm.tab, ldh, vo, nvec, lane, acc);
    float val;
    if (!tile_total<R, NV>(acc, sm.red, warp, kw, ks, lane, val)) return;
    const int r = lane / NV, v = lane % NV;
    if (lane < R * NV && v < nvec && m0 + r < m) part[(int64_t)pv.pair(pos0 + v) * ldp + m0 + r] = val;
}

/* ---- host side: launch one type (arguments already validated by cuda/gemv.cu) ---- */

/* The device's multiprocessor count, asked once: launchers run once per GEMV of a decode
 * step, and the attribute query is host work on every one of them. */
static inline int sms_cached() {
    static int sms = 0;
    if (sms <= 0) {
        const int n = cuk_sm_count();
        sms = n > 0 ? n : 132;
    }
    return sms;
}

/* Split-K factor: enough warps for about 16 per multiprocessor, never more than the chunks. */
static inline int pick_ks(int64_t tiles, int nchunks) {
    const int64_t want = 16LL * sms_cached();
    int ks = 1;
    while (ks < WARPS && tiles * ks < want && ks * 2 <= nchunks) ks *= 2;
    return ks;
}

template <int T, int NV, int XT>
static g5_status launch_gemv(const cuk_gemv_args *a, cudaStream_t st, g5_error *err) {
    constexpr int R = NV <= 4 ? 4 : 2;
    using Q = Tr<T>;
    static_assert(smem_bytes<T, R, NV>() <= CUK_SMEM_NO_OPTIN, "k_gemv: no opt-in (cuda/cuk_limits.h)");
    const int nblk_row = (int)(a->k / Q::BLK);
    const int64_t rb = (int64_t)nblk_row * Q::BB;
    const int nchunks = (nblk_row + Q::NB - 1) / Q::NB;
    const int64_t tiles = (a->m + R - 1) / R;
    /* split-K from the weight shape alone (the tile count at R = 4, whatever R and n are): a
     * row's summation order then never depends on how many vectors share the launch, so a
     * batched decode step (rt_gpu_forward_batch) reproduces one-vector launches bit for bit */
    const int ks = pick_ks((a->m + 3) / 4, nchunks);
    const int tpc = WARPS / ks;
    const int64_t grid = (tiles + tpc - 1) / tpc;
    if (grid > 0x7fffffff) return g5_fail(err, G5_ERR_INVALID_ARG, "gemv: m=%lld too large", (long long)a->m);
    k_gemv<T, R, NV, XT><<<(unsigned)grid, WARPS * 32, smem_bytes<T, R, NV>(), st>>>(
        (const uint8_t *)a->w, rb, a->m, nblk_row, nchunks, a->x, a->ldx, a->n, a->y, a->ldy, ks);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}

template <int T> g5_status gemv_run(const cuk_gemv_args *a, cudaStream_t st, g5_error *err) {
    const int n = a->n;
    const int nv = n <= 1 ? 1 : n <= 2 ? 2 : n <= 4 ? 4 : n <= 8 ? 8 : 16;
    const bool bf = a->x_type == CUK_ACT_BF16;
    switch (nv) {
    case 1: return bf ? launch_gemv<T, 1, 1>(a, st, err) : launch_gemv<T, 1, 0>(a, st, err);
    case 2: return bf ? launch_gemv<T, 2, 1>(a, st, err) : launch_gemv<T, 2, 0>(a, st, err);
    case 4: return bf ? launch_gemv<T, 4, 1>(a, st, err) : launch_gemv<T, 4, 0>(a, st, err);
    case 8: return bf ? launch_gemv<T, 8, 1>(a, st, err) : launch_gemv<T, 8, 0>(a, st, err);
    default: return bf ? launch_gemv<T, 16, 1>(a, st, err) : launch_gemv<T, 16, 0>(a, st, err);
    }
}

/* Vectors per expert-kernel launch from the batch size: a plan group holds at most
 * min(n_tok, CUK_MOE_GROUP) pairs. Only the register tiling depends on it, never the bits. */
static inline int moe_nv(int n_tok) { return n_tok <= 1 ? 1 : n_tok <= 2 ? 2 : 4; }
static_assert(CUK_MOE_GROUP == 4, "moe_nv: groups of 4");

template <int T, int NV, int XT>
static g5_status launch_gate_up(const cuk_moe_gate_up_args *a, cudaStream_t st, g5_error *err) {
    using Q = Tr<T>;
    const int nblk_row = (int)(a->k / Q::BLK);
    const int64_t rb = (int64_t)nblk_row * Q::BB;
    const int nchunks = (nblk_row + Q::NB - 1) / Q::NB;
    const int64_t tiles_e = (a->m + 1) / 2;
    const int ks = pick_ks(tiles_e * a->top_k, nchunks); /* not n_tok: see launch_gemv */
    const int tpc = WARPS / ks;
    const int64_t gx = (tiles_e + tpc - 1) / tpc;
    const int n_pairs = a->n_tok * a->top_k;
    if (gx > 0x7fffffff) return g5_fail(err, G5_ERR_INVALID_ARG, "moe_gate_up: m=%lld too large", (long long)a->m);
    const dim3 grid((unsigned)gx, (unsigned)n_pairs);
    k_gate_up<T, NV, XT><<<grid, WARPS * 32, smem_bytes<T, 4, NV>(), st>>>(
        (const uint8_t *)a->w_gate, (const uint8_t *)a->w_up, rb, a->m, a->n_expert, nblk_row,
        nchunks, a->plan, n_pairs, a->top_k, a->x, a->ldx, a->out, a->ldo, ks);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}

template <int T>
g5_status gate_up_run(const cuk_moe_gate_up_args *a, cudaStream_t st, g5_error *err) {
    const bool bf = a->x_type == CUK_ACT_BF16;
    switch (moe_nv(a->n_tok)) {
    case 1: return bf ? launch_gate_up<T, 1, 1>(a, st, err) : launch_gate_up<T, 1, 0>(a, st, err);
    case 2: return bf ? launch_gate_up<T, 2, 1>(a, st, err) : launch_gate_up<T, 2, 0>(a, st, err);
    default: return bf ? launch_gate_up<T, 4, 1>(a, st, err) : launch_gate_up<T, 4, 0>(a, st, err);
    }
}

template <int T, int NV, int XT>
static g5_status launch_down(const cuk_moe_down_args *a, cudaStream_t st, g5_error *err) {
    using Q = Tr<T>;
    const int nblk_row = (int)(a->k / Q::BLK);
    const int64_t rb = (int64_t)nblk_row * Q::BB;
    const int nchunks = (nblk_row + Q::NB - 1) / Q::NB;
    const int64_t tiles = (a->m + 3) / 4;
    const int ks = pick_ks(tiles * a->top_k, nchunks); /* from the shape and top_k, not n_tok */
    const int tpc = WARPS / ks;
    const int64_t gx = (tiles + tpc - 1) / tpc;
    const int n_pairs = a->n_tok * a->top_k;
    if (gx > 0x7fffffff) return g5_fail(err, G5_ERR_INVALID_ARG, "moe_down: m=%lld too large", (long long)a->m);
    const dim3 grid((unsigned)gx, (unsigned)n_pairs);
    k_down<T, NV, XT><<<grid, WARPS * 32, smem_bytes<T, 4, NV>(), st>>>(
        (const uint8_t *)a->w, rb, a->m, a->n_expert, nblk_row, nchunks, a->plan, n_pairs, a->h,
        a->ldh, a->part, a->ldp, ks);
    CUK_CHECK(cudaGetLastError());
    return moe_combine(a, st, err);
}

template <int T> g5_status down_run(const cuk_moe_down_args *a, cudaStream_t st, g5_error *err) {
    const bool bf = a->h_type == CUK_ACT_BF16;
    switch (moe_nv(a->n_tok)) {
    case 1: return bf ? launch_down<T, 1, 1>(a, st, err) : launch_down<T, 1, 0>(a, st, err);
    case 2: return bf ? launch_down<T, 2, 1>(a, st, err) : launch_down<T, 2, 0>(a, st, err);
    default: return bf ? launch_down<T, 4, 1>(a, st, err) : launch_down<T, 4, 0>(a, st, err);
    }
}

} // namespace cuk

#define CUK_GEMV_INSTANTIATE(T)                                                                 \
    namespace cuk {                                                                             \
    template g5_status gemv_run<T>(const cuk_gemv_args *, cudaStream_t, g5_error *);            \
    template g5_status gate_up_run<T>(const cuk_moe_gate_up_args *, cudaStream_t, g5_error *);  \
    template g5_status down_run<T>(const cuk_moe_down_args *, cudaStream_t, g5_error *);        \
    }

#endif
