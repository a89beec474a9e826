/* One 32-element sub-block of a quantized block, decoded operation for operation as
 * format/quant.c's decoders (so bit for bit the CPU's float32 values): the element-parallel form
 * of cuda/model_ops.cu's deq_block, for the 16-bit weight tiles of fast-mode prefill (one thread
 * per sub-block instead of per 256-element block, so no 1 KB per-thread staging and full
 * occupancy). C and CUDA: tests/test_deq_sub.c checks it on the CPU against quant_dequantize.
 *
 * deq_sub(type, b, s, y): y[0..32) = elements 32 s .. 32 s + 31 of the block at b, for the block
 * types of 32 elements (s = 0: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) and of 256 (s < 8: Q4_K, Q5_K,
 * Q6_K, IQ4_XS); returns 0 for any other type (y untouched; cuda/model_ops.cu decodes the low-bit
 * types of format/quant_blocks.h a block per thread instead).
 *
 * deq_row32(type, row, j, y): y[0..32) = elements 32 j .. 32 j + 31 of a row of any type whose
 * blocks hold a multiple of 32 elements, or of F32/F16/BF16: deq_sub's types, the low-bit types
 * of format/quant_blocks.h (four of their 8-element groups) and the float types; 0 for others.
 * The decoder of cuda/head_gemv.cu's per-head products over compact weights (attn_k_b,
 * attn_v_b). */
#ifndef G5_DEQ_SUB_H
#define G5_DEQ_SUB_H

#include <stdint.h>

#include "format/quant.h"
#include "format/quant_blocks.h"

#ifdef __CUDACC__
#define DQS_FN static __host__ __device__ __forceinline__
#define DQS_UNROLL _Pragma("unroll") /* y[] must stay in registers */
#else
#define DQS_FN static inline
#define DQS_UNROLL
#endif

DQS_FN uint32_t dqs_rd16(const uint8_t *p) { return (uint32_t)p[0] | ((uint32_t)p[1] << 8); }

/* float * float and float - float, each rounded (never contracted into an fma) */
DQS_FN float dqs_mul(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    volatile float r = a * b;
    return r;
#endif
}
DQS_FN float dqs_add(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    volatile float r = a + b;
    return r;
#endif
}
DQS_FN float dqs_sub(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fsub_rn(a, b);
#else
    volatile float r = a - b;
    return r;
#endif
}

/* IEEE half at p (little-endian) as float, exactly */
DQS_FN float dqs_half(const uint8_t *p) {
    const uint32_t h = dqs_rd16(p), s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
    uint32_t u;
    if (e == 31) u = (s << 31) | 0x7f800000u | (m << 13);
    else if (e) u = (s << 31) | ((e + 112) << 23) | (m << 13);
    else if (!m) u = s << 31;
    else { /* subnormal: normalize */
        int ee = 113;
        uint32_t mm = m;
        while (!(mm & 1024)) {
            mm <<= 1;
            ee--;
        }
        u = (s << 31) | ((uint32_t)ee << 23) | ((mm & 1023) << 13);
    }
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
#endif
}

DQS_FN int dqs_iq4(int i) {
    const int8_t t[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
    return t[i & 15];
}

/* 1 for the types deq_sub decodes */
DQS_FN int deq_sub_handles(uint32_t type) {
    return type == QT_Q4_0 || type == QT_Q4_1 || type == QT_Q5_0 || type == QT_Q5_1 || type == QT_Q8_0 ||
           type == QT_IQ4_NL || type == QT_Q4_K || type == QT_Q5_K || type == QT_Q6_K || type == QT_IQ4_XS;
}

DQS_FN int deq_sub(uint32_t type, const uint8_t *b, int s, float *y) {
    switch (type) {
    case QT_Q4_0: {
        const float d = dqs_half(b);
        DQS_UNROLL
        for (int j = 0; j < 16; j++) {
            y[j] = dqs_mul((float)((b[2 + j] & 0x0f) - 8), d);
            y[j + 16] = dqs_mul((float)((b[2 + j] >> 4) - 8), d);
        }
        return 1;
    }
    case QT_Q4_1: {
        const float d = dqs_half(b), m = dqs_half(b + 2);
        DQS_UNROLL
        for (int j = 0; j < 16; j++) {
            y[j] = dqs_add(dqs_mul((float)(b[4 + j] & 0x0f), d), m);
            y[j + 16] = dqs_add(dqs_mul((float)(b[4 + j] >> 4), d), m);
        }
        return 1;
    }
    case QT_Q5_0: {
        const float d = dqs_half(b);
        const uint32_t qh = dqs_rd16(b + 2) | (dqs_rd16(b + 4) << 16);
        DQS_UNROLL
        for (int j = 0; j < 16; j++) {
            const int x0 = (int)((b[6 + j] & 0x0f) | (((qh >> j) & 1) << 4)) - 16;
            const int x1 = (int)((b[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
            y[j] = dqs_mul((float)x0, d);
            y[j + 16] = dqs_mul((float)x1, d);
        }
        return 1;
    }
    case QT_Q5_1: {
        const float d = dqs_half(b), m = dqs_half(b + 2);
        const uint32_t qh = dqs_rd16(b + 4) | (dqs_rd16(b + 6) << 16);
        DQS_UNROLL
        for (int j = 0; j < 16; j++) {
            const int x0 = (int)((b[8 + j] & 0x0f) | (((qh >> j) & 1) << 4));
            const int x1 = (int)((b[8 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
            y[j] = dqs_add(dqs_mul((float)x0, d), m);
            y[j + 16] = dqs_add(dqs_mul((float)x1, d), m);
        }
        return 1;
    }
    case QT_Q8_0: {
        const float d = dqs_half(b);
        DQS_UNROLL
        for (int j = 0; j < 32; j++) y[j] = dqs_mul((float)(int8_t)b[2 + j], d);
        return 1;
    }
    case QT_IQ4_NL: {
        const float d = dqs_half(b);
        DQS_UNROLL
        for (int j = 0; j < 16; j++) {
            y[j] = dqs_mul(d, (float)dqs_iq4(b[2 + j] & 0xf));
            y[j + 16] = dqs_mul(d, (float)dqs_iq4(b[2 + j] >> 4));
        }
        return 1;
    }
    case QT_Q4_K:
    case QT_Q5_K: { /* sub-block s: nibble h = s & 1 of the 32 bytes q[32 (s / 2) ..], scale/min s */
        const int q5 = type == QT_Q5_K, h = s & 1, pr = s >> 1;
        const float d = dqs_half(b), mn = dqs_half(b + 2);
        const uint8_t *sc = b + 4, *qh = b + 16, *q = b + (q5 ? 48 : 16) + 32 * pr;
        uint8_t sv, mv;
        if (s < 4) {
            sv = (uint8_t)(sc[s] & 63);
            mv = (uint8_t)(sc[s + 4] & 63);
        } else {
            sv = (uint8_t)((sc[s + 4] & 0xf) | ((sc[s - 4] >> 6) << 4));
            mv = (uint8_t)((sc[s + 4] >> 4) | ((sc[s] >> 6) << 4));
        }
        const float dd = dqs_mul(d, (float)sv), mm = dqs_mul(mn, (float)mv);
        const uint8_t u = (uint8_t)(1u << (2 * pr + h));
        DQS_UNROLL
        for (int l = 0; l < 32; l++) {
            const int v = (h ? q[l] >> 4 : q[l] & 0xf) + (q5 && (qh[l] & u) ? 16 : 0);
            y[l] = dqs_sub(dqs_mul(dd, (float)v), mm);
        }
        return 1;
    }
    case QT_Q6_K: { /* sub-block s: half n = s / 4, quarter c = s % 4 of it */
        const int n = s >> 2, c = s & 3;
        const float d = dqs_half(b + 208);
        const uint8_t *ql = b + 64 * n + (c & 1) * 32, *qh = b + 128 + 32 * n;
        const int8_t *sc = (const int8_t *)(b + 192 + 8 * n) + 2 * c;
        DQS_UNROLL
        for (int l = 0; l < 32; l++) {
            const int lo = (c & 2) ? ql[l] >> 4 : ql[l] & 0xf;
            const int q = (int)(lo | (((qh[l] >> (2 * c)) & 3) << 4)) - 32;
            y[l] = dqs_mul(dqs_mul(d, (float)sc[l / 16]), (float)q);
        }
        return 1;
    }
    case QT_IQ4_XS: {
        const float d = dqs_half(b);
        const uint32_t sh = dqs_rd16(b + 2);
        const uint8_t *qs = b + 8 + 16 * s;
        const int ls = ((b[4 + s / 2] >> 4 * (s % 2)) & 0xf) | (int)(((sh >> 2 * s) & 3) << 4);
        const float dl = dqs_mul(d, (float)(ls - 32));
        DQS_UNROLL
        for (int j = 0; j < 16; j++) {
            y[j] = dqs_mul(dl, (float)dqs_iq4(qs[j] & 0xf));
            y[j + 16] = dqs_mul(dl, (float)dqs_iq4(qs[j] >> 4));
        }
        return 1;
    }
    default:
        return 0;
    }
}

/* Bytes of one block of the types deq_row32 decodes, and its elements in *elems; 0 for others. */
DQS_FN int dqs_block_bytes(uint32_t type, int *elems) {
    *elems = 32;
    switch (type) {
    case QT_F32: *elems = 1; return 4;
    case QT_F16: case QT_BF16: *elems = 1; return 2;
    case QT_Q4_0: case QT_IQ4_NL: return 18;
    case QT_Q4_1: return 20;
    case QT_Q5_0: return 22;
    case QT_Q5_1: return 24;
    case QT_Q8_0: return 34;
    case QT_MXFP4: return QB_B_MXFP4;
    case QT_NVFP4: *elems = 64; return QB_B_NVFP4;
    default: break;
    }
    *elems = 256;
    switch (type) {
    case QT_Q4_K: return 144;
    case QT_Q5_K: return 176;
    case QT_Q6_K: return 210;
    case QT_IQ4_XS: return 136;
    case QT_Q2_K: return QB_B_Q2_K;
    case QT_Q3_K: return QB_B_Q3_K;
    case QT_IQ2_XXS: return QB_B_IQ2_XXS;
    case QT_IQ2_XS: return QB_B_IQ2_XS;
    case QT_IQ2_S: return QB_B_IQ2_S;
    case QT_IQ3_XXS: return QB_B_IQ3_XXS;
    case QT_IQ3_S: return QB_B_IQ3_S;
    case QT_IQ1_S: return QB_B_IQ1_S;
    case QT_IQ1_M: return QB_B_IQ1_M;
    case QT_TQ1_0: return QB_B_TQ1_0;
    case QT_TQ2_0: return QB_B_TQ2_0;
    default: *elems = 0; return 0;
    }
}

DQS_FN int deq_row32(uint32_t type, const uint8_t *row, int64_t j, float *y) {
    int be;
    const int bb = dqs_block_bytes(type, &be);
    const int64_t e0 = 32 * j;
    if (!bb) return 0;
    if (be == 1) { /* F32, F16, BF16: element by element */
        const uint8_t *p = row + e0 * bb;
        DQS_UNROLL
        for (int l = 0; l < 32; l++) {
            if (type == QT_F16) {
                y[l] = dqs_half(p + 2 * l);
            } else {
                const uint32_t u = type == QT_BF16 ? dqs_rd16(p + 2 * l) << 16
                                                   : dqs_rd16(p + 4 * l) | (dqs_rd16(p + 4 * l + 2) << 16);
#ifdef __CUDA_ARCH__
                y[l] = __uint_as_float(u);
#else
                __builtin_memcpy(&y[l], &u, 4);
#endif
            }
        }
        return 1;
    }
    const uint8_t *b = row + (e0 / be) * bb;
    const int w = (int)(e0 % be);
    if (deq_sub_handles(type)) return deq_sub(type, b, w / 32, y);
    DQS_UNROLL
    for (int q = 0; q < 4; q++) {
        float f[8], mb;
        const float a = qb_group(type, b, w / 8 + q, f, &mb);
        DQS_UNROLL
        for (int l = 0; l < 8; l++) y[8 * q + l] = qb_elem(a, f[l], mb);
    }
    return 1;
}

#endif
