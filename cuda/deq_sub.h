/* One 32-element sub-block of a quantized block, decoded operation for operation as
 * format/quant.c's decoders (so bit for bit the CPU's float32 values): the element-parallel form
 * of cuda/model_ops.cu's deq_block, for the 16-bit weight tiles of fast-mode prefill (one thread
 * per sub-block instead of per 256-element block, so no 1 KB per-thread staging and full
 * occupancy). C and CUDA: tests/test_deq_sub.c checks it on the CPU against quant_dequantize.
 *
 * deq_sub(type, b, s, y): y[0..32) = elements 32 s .. 32 s + 31 of the block at b, for the block
 * types of 32 elements (s = 0: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) and of 256 (s < 8: Q4_K, Q5_K,
 * Q6_K, IQ4_XS); returns 0 for any other type (y untouched; cuda/model_ops.cu decodes the low-bit
 * types of format/quant_blocks.h a block per thread instead). */
#ifndef G5_DEQ_SUB_H
#define G5_DEQ_SUB_H

#include <stdint.h>

#include "format/quant.h"

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

/* The exact int8 form of a sub-block (cuda/cuk_kvb_exact.h): for the types whose every element is
 * one rounded product of a scale and a small integer (Q4_0, Q5_0, Q8_0, IQ4_NL, Q6_K, IQ4_XS), q[l]
 * and sc[l / 16] such that dqs_mul(sc[l / 16], q[l]) is deq_sub's y[l], bit for bit (products
 * commute; Q6_K's d * sc is exact, so its scale is that product). Returns 0 (nothing written) for
 * the other types, whose elements are a product minus (or plus) a second term. */
DQS_FN int deq_sub_i8(uint32_t type, const uint8_t *b, int s, float *sc, int8_t *q) {
    switch (type) {
    case QT_Q4_0:
        sc[0] = sc[1] = dqs_half(b);
        DQS_UNROLL
        for (int j = 0; j < 16; j++) {
            q[j] = (int8_t)((b[2 + j] & 0x0f) - 8);
            q[j + 16] = (int8_t)((b[2 + j] >> 4) - 8);
        }
        return 1;
    case QT_Q5_0: {
        const uint32_t qh = dqs_rd16(b + 2) | (dqs_rd16(b + 4) << 16);
        sc[0] = sc[1] = dqs_half(b);
        DQS_UNROLL
        for (int j = 0; j < 16; j++) {
            q[j] = (int8_t)((int)((b[6 + j] & 0x0f) | (((qh >> j) & 1) << 4)) - 16);
            q[j + 16] = (int8_t)((int)((b[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16);
        }
        return 1;
    }
    case QT_Q8_0:
        sc[0] = sc[1] = dqs_half(b);
        DQS_UNROLL
        for (int j = 0; j < 32; j++) q[j] = (int8_t)b[2 + j];
        return 1;
    case QT_IQ4_NL:
        sc[0] = sc[1] = dqs_half(b);
        DQS_UNROLL
        for (int j = 0; j < 16; j++) {
            q[j] = (int8_t)dqs_iq4(b[2 + j] & 0xf);
            q[j + 16] = (int8_t)dqs_iq4(b[2 + j] >> 4);
        }
        return 1;
    case QT_Q6_K: {
        const int n = s >> 2, c = s & 3;
        const float d = dqs_half(b + 208);
        const uint8_t *ql = b + 64 * n + (c & 1) * 32, *qh = b + 128 + 32 * n;
        const int8_t *scs = (const int8_t *)(b + 192 + 8 * n) + 2 * c;
        sc[0] = dqs_mul(d, (float)scs[0]);
        sc[1] = dqs_mul(d, (float)scs[1]);
        DQS_UNROLL
        for (int l = 0; l < 32; l++) {
            const int lo = (c & 2) ? ql[l] >> 4 : ql[l] & 0xf;
            q[l] = (int8_t)((int)(lo | (((qh[l] >> (2 * c)) & 3) << 4)) - 32);
        }
        return 1;
    }
    case QT_IQ4_XS: {
        const uint32_t sh = dqs_rd16(b + 2);
        const uint8_t *qs = b + 8 + 16 * s;
        const int ls = ((b[4 + s / 2] >> 4 * (s % 2)) & 0xf) | (int)(((sh >> 2 * s) & 3) << 4);
        sc[0] = sc[1] = dqs_mul(dqs_half(b), (float)(ls - 32));
        DQS_UNROLL
        for (int j = 0; j < 16; j++) {
            q[j] = (int8_t)dqs_iq4(qs[j] & 0xf);
            q[j + 16] = (int8_t)dqs_iq4(qs[j] >> 4);
        }
        return 1;
    }
    default:
        return 0;
    }
}

#endif
