/* ggml tensor types: type table, CPU dequantizers, the few quantizers we need, half conversions.
 *
 * The dequantizers reproduce ggml's dequantize_row_* float32 arithmetic operation for operation
 * (same products, same order), so results are bit-identical to ggml's reference CPU code. Block
 * fields are read byte by byte through the little-endian helpers, never by casting structs, so
 * the code does not depend on host endianness or alignment. */
#include "quant.h"
#include "quant_int.h"

#include <math.h>
#include <string.h>

/* Block geometry, from ggml-common.h. */
#define QK_K 256
#define QK32 32

enum {
    B_Q4_0 = 18, B_Q4_1 = 20, B_Q5_0 = 22, B_Q5_1 = 24, B_Q8_0 = 34, B_Q8_1 = 36,
    B_Q2_K = 84, B_Q3_K = 110, B_Q4_K = 144, B_Q5_K = 176, B_Q6_K = 210, B_Q8_K = 292,
    B_IQ2_XXS = 66, B_IQ2_XS = 74, B_IQ3_XXS = 98, B_IQ1_S = 50, B_IQ4_NL = 18, B_IQ3_S = 110,
    B_IQ2_S = 82, B_IQ4_XS = 136, B_IQ1_M = 56, B_TQ1_0 = 54, B_TQ2_0 = 66, B_MXFP4 = 17,
    B_NVFP4 = 36
};

/* Field offsets inside each block (sizes in the comments), matching the ggml struct layouts. */
_Static_assert(B_Q4_0 == 2 + QK32 / 2, "q4_0: d, qs[16]");
_Static_assert(B_Q4_1 == 4 + QK32 / 2, "q4_1: d, m, qs[16]");
_Static_assert(B_Q5_0 == 2 + 4 + QK32 / 2, "q5_0: d, qh[4], qs[16]");
_Static_assert(B_Q5_1 == 4 + 4 + QK32 / 2, "q5_1: d, m, qh[4], qs[16]");
_Static_assert(B_Q8_0 == 2 + QK32, "q8_0: d, qs[32]");
_Static_assert(B_Q2_K == QK_K / 16 + QK_K / 4 + 4, "q2_K: scales[16], qs[64], d, dmin");
_Static_assert(B_Q3_K == QK_K / 8 + QK_K / 4 + 12 + 2, "q3_K: hmask[32], qs[64], scales[12], d");
_Static_assert(B_Q4_K == 4 + 12 + QK_K / 2, "q4_K: d, dmin, scales[12], qs[128]");
_Static_assert(B_Q5_K == 4 + 12 + QK_K / 8 + QK_K / 2, "q5_K: d, dmin, scales[12], qh[32], qs[128]");
_Static_assert(B_Q6_K == QK_K / 2 + QK_K / 4 + QK_K / 16 + 2, "q6_K: ql[128], qh[64], scales[16], d");
_Static_assert(B_IQ4_NL == 2 + QK32 / 2, "iq4_nl: d, qs[16]");
_Static_assert(B_IQ4_XS == 2 + 2 + QK_K / 64 + QK_K / 2, "iq4_xs: d, scales_h, scales_l[4], qs[128]");

#define Q2K_SCALES 0
#define Q2K_QS 16
#define Q2K_D 80
#define Q2K_DMIN 82
#define Q3K_HMASK 0
#define Q3K_QS 32
#define Q3K_SCALES 96
#define Q3K_D 108
#define Q4K_D 0
#define Q4K_DMIN 2
#define Q4K_SCALES 4
#define Q4K_QS 16
#define Q5K_QH 16
#define Q5K_QS 48
#define Q6K_QL 0
#define Q6K_QH 128
#define Q6K_SCALES 192
#define Q6K_D 208
#define IQ4XS_SCALES_H 2
#define IQ4XS_SCALES_L 4
#define IQ4XS_QS 8

static const quant_type_info type_table[] = {
    {QT_F32, "F32", 1, 4, 1},
    {QT_F16, "F16", 1, 2, 1},
    {QT_Q4_0, "Q4_0", QK32, B_Q4_0, 1},
    {QT_Q4_1, "Q4_1", QK32, B_Q4_1, 1},
    {QT_Q5_0, "Q5_0", QK32, B_Q5_0, 1},
    {QT_Q5_1, "Q5_1", QK32, B_Q5_1, 1},
    {QT_Q8_0, "Q8_0", QK32, B_Q8_0, 1},
    {QT_Q8_1, "Q8_1", QK32, B_Q8_1, 0},
    {QT_Q2_K, "Q2_K", QK_K, B_Q2_K, 1},
    {QT_Q3_K, "Q3_K", QK_K, B_Q3_K, 1},
    {QT_Q4_K, "Q4_K", QK_K, B_Q4_K, 1},
    {QT_Q5_K, "Q5_K", QK_K, B_Q5_K, 1},
    {QT_Q6_K, "Q6_K", QK_K, B_Q6_K, 1},
    {QT_Q8_K, "Q8_K", QK_K, B_Q8_K, 0},
    {QT_IQ2_XXS, "IQ2_XXS", QK_K, B_IQ2_XXS, 1},
    {QT_IQ2_XS, "IQ2_XS", QK_K, B_IQ2_XS, 1},
    {QT_IQ3_XXS, "IQ3_XXS", QK_K, B_IQ3_XXS, 1},
    {QT_IQ1_S, "IQ1_S", QK_K, B_IQ1_S, 1},
    {QT_IQ4_NL, "IQ4_NL", QK32, B_IQ4_NL, 1},
    {QT_IQ3_S, "IQ3_S", QK_K, B_IQ3_S, 1},
    {QT_IQ2_S, "IQ2_S", QK_K, B_IQ2_S, 1},
    {QT_IQ4_XS, "IQ4_XS", QK_K, B_IQ4_XS, 1},
    {QT_I8, "I8", 1, 1, 0},
    {QT_I16, "I16", 1, 2, 0},
    {QT_I32, "I32", 1, 4, 0},
    {QT_I64, "I64", 1, 8, 0},
    {QT_F64, "F64", 1, 8, 0},
    {QT_IQ1_M, "IQ1_M", QK_K, B_IQ1_M, 1},
    {QT_BF16, "BF16", 1, 2, 1},
    {QT_TQ1_0, "TQ1_0", QK_K, B_TQ1_0, 1},
    {QT_TQ2_0, "TQ2_0", QK_K, B_TQ2_0, 1},
    {QT_MXFP4, "MXFP4", QK32, B_MXFP4, 1},
    {QT_NVFP4, "NVFP4", 64, B_NVFP4, 1},
    {QT_Q1_0, "Q1_0", 128, 18, 0}, /* sizes only: gguf-py has no dequantizer to check one against */
};
#define N_TYPES (sizeof type_table / sizeof type_table[0])

/* Non-linear 4-bit levels shared by IQ4_NL and IQ4_XS (ggml's kvalues_iq4nl). */
static const int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                         1,    13,   25,  38,  53,  69,  89,  113};

const quant_type_info *quant_type_get(uint32_t id) {
    if (id >= QT_TYPE_LIMIT) return NULL;
    for (size_t i = 0; i < N_TYPES; i++)
        if (type_table[i].id == id) return &type_table[i];
    return NULL;
}

const char *quant_type_name(uint32_t id) {
    const quant_type_info *t = quant_type_get(id);
    return t ? t->name : "unknown";
}

int quant_type_from_name(const char *name) {
    if (!name) return -1;
    for (size_t i = 0; i < N_TYPES; i++) {
        const char *a = type_table[i].name, *b = name;
        while (*a && *b) {
            char cb = *b;
            if (cb >= 'a' && cb <= 'z') cb = (char)(cb - 'a' + 'A');
            if (*a != cb) break;
            a++, b++;
        }
        if (!*a && !*b) return (int)type_table[i].id;
    }
    return -1;
}

int quant_exact_i8(uint32_t type) {
    return type == QT_Q4_0 || type == QT_Q5_0 || type == QT_Q8_0 || type == QT_IQ4_NL || type == QT_Q6_K ||
           type == QT_IQ4_XS;
}

g5_status quant_check_supported(uint32_t type, g5_error *err) {
    const quant_type_info *t = quant_type_get(type);
    if (!t) return g5_fail(err, G5_ERR_TENSOR_TYPE, "type id %u: unknown", type);
    if (!t->supported)
        return g5_fail(err, G5_ERR_UNSUPPORTED, "%s (%u): not supported", t->name, type);
    return G5_OK;
}

g5_status quant_row_bytes(uint32_t type, uint64_t n_elems, uint64_t *out) {
    const quant_type_info *t = quant_type_get(type);
    if (!t) return G5_ERR_TENSOR_TYPE;
    if (n_elems % t->block_elems) return G5_ERR_ALIGN;
    uint64_t bytes;
    if (g5_mul_u64(n_elems / t->block_elems, t->block_bytes, &bytes)) return G5_ERR_OVERFLOW;
    if (out) *out = bytes;
    return G5_OK;
}

/* ---- half precision ---- */

static inline float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

float quant_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    if (exp == 0x1f) return f32_from_bits(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
        if (mant == 0) return f32_from_bits(sign);
        /* Subnormal half: renormalize; every half subnormal is a normal float. */
        int e = -14;
        while (!(mant & 0x400)) {
            mant <<= 1;
            e--;
        }
        mant &= 0x3ff;
        return f32_from_bits(sign | ((uint32_t)(e + 127) << 23) | (mant << 13));
    }
    return f32_from_bits(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

uint16_t quant_f32_to_f16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t exp = (u >> 23) & 0xff;
    uint32_t mant = u & 0x7fffff;
    if (exp == 0xff) {
        if (mant) return (uint16_t)(sign | 0x7e00 | (mant >> 13)); /* quiet NaN, keep payload top */
        return (uint16_t)(sign | 0x7c00);
    }
    int e = (int)exp - 127;
    if (e > 15) return (uint16_t)(sign | 0x7c00);
    if (e >= -14) {
        uint32_t r = ((uint32_t)(e + 15) << 10) | (mant >> 13);
        uint32_t rem = mant & 0x1fff;
        /* A carry out of the mantissa correctly bumps the exponent (up to infinity). */
        if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    if (e < -25) return sign; /* below half the smallest subnormal (2^-25): rounds to zero */
    /* Subnormal result: value / 2^-24 = m * 2^(e+1) with the implicit bit restored. */
    uint32_t m = mant | 0x800000;
    int s = -(e + 1); /* 14..24 */
    uint32_t q = m >> s;
    uint32_t rem = m & ((1u << s) - 1);
    uint32_t half = 1u << (s - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
    return (uint16_t)(sign | q);
}

float quant_bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

uint16_t quant_f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

static inline float rd_half(const uint8_t *p) { return quant_f16_to_f32(g5_rd_u16(p)); }

/* ---- dequantizers: one block each, y receives block_elems floats ---- */

static void deq_q4_0(const uint8_t *b, float *y) {
    const float d = rd_half(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < QK32 / 2; j++) {
        const int x0 = (qs[j] & 0x0f) - 8;
        const int x1 = (qs[j] >> 4) - 8;
        y[j] = x0 * d;
        y[j + QK32 / 2] = x1 * d;
    }
}

static void deq_q4_1(const uint8_t *b, float *y) {
    const float d = rd_half(b), m = rd_half(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < QK32 / 2; j++) {
        const int x0 = qs[j] & 0x0f;
        const int x1 = qs[j] >> 4;
        y[j] = x0 * d + m;
        y[j + QK32 / 2] = x1 * d + m;
    }
}

/* qh bit j holds the 5th bit of element j (elements 0..31). */
static void deq_q5_0(const uint8_t *b, float *y) {
    const float d = rd_half(b);
    const uint32_t qh = g5_rd_u32(b + 2);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < QK32 / 2; j++) {
        const int x0 = (int)((qs[j] & 0x0f) | (((qh >> j) & 1) << 4)) - 16;
        const int x1 = (int)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
        y[j] = x0 * d;
        y[j + QK32 / 2] = x1 * d;
    }
}

static void deq_q5_1(const uint8_t *b, float *y) {
    const float d = rd_half(b), m = rd_half(b + 2);
    const uint32_t qh = g5_rd_u32(b + 4);
    const uint8_t *qs = b + 8;
    for (int j = 0; j < QK32 / 2; j++) {
        const int x0 = (int)((qs[j] & 0x0f) | (((qh >> j) & 1) << 4));
        const int x1 = (int)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
        y[j] = x0 * d + m;
        y[j + QK32 / 2] = x1 * d + m;
    }
}

static void deq_q8_0(const uint8_t *b, float *y) {
    const float d = rd_half(b);
    for (int j = 0; j < QK32; j++) y[j] = (int8_t)b[2 + j] * d;
}

static void deq_q2_k(const uint8_t *b, float *y) {
    const float d = rd_half(b + Q2K_D), min = rd_half(b + Q2K_DMIN);
    const uint8_t *sc = b + Q2K_SCALES;
    const uint8_t *q = b + Q2K_QS;
    int is = 0;
    for (int n = 0; n < QK_K; n += 128) {
        for (int shift = 0; shift < 8; shift += 2) {
            for (int half = 0; half < 2; half++) {
                const uint8_t s = sc[is++];
                const float dl = d * (s & 0xf), ml = min * (s >> 4);
                for (int l = 0; l < 16; l++) *y++ = dl * ((q[16 * half + l] >> shift) & 3) - ml;
            }
        }
        q += 32;
    }
}

/* Q3_K's 16 6-bit scales: low 4 bits in bytes 0..7 (low nibble for scales 0..7, high nibble for
 * 8..15), high 2 bits in bytes 8..11 (scale j at bits 2*(j/4) of byte 8 + j%4). Biased by 32. */
static void q3k_scales(const uint8_t *s, int out[16]) {
    for (int j = 0; j < 16; j++) {
        const int lo = j < 8 ? (s[j] & 0xf) : (s[j - 8] >> 4);
        const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        out[j] = (lo | (hi << 4)) - 32;
    }
}

static void deq_q3_k(const uint8_t *b, float *y) {
    const float d_all = rd_half(b + Q3K_D);
    const uint8_t *hm = b + Q3K_HMASK;
    const uint8_t *q = b + Q3K_QS;
    int scales[16];
    q3k_scales(b + Q3K_SCALES, scales);
    int is = 0;
    uint8_t m = 1;
    for (int n = 0; n < QK_K; n += 128) {
        for (int shift = 0; shift < 8; shift += 2) {
            for (int half = 0; half < 2; half++) {
                const float dl = d_all * scales[is++];
                for (int l = 0; l < 16; l++) {
                    const int k = 16 * half + l;
                    *y++ = dl * (((q[k] >> shift) & 3) - ((hm[k] & m) ? 0 : 4));
                }
            }
            m <<= 1;
        }
        q += 32;
    }
}

void quant_k4_scale_min(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

static void deq_q4_k(const uint8_t *b, float *y) {
    const float d = rd_half(b + Q4K_D), min = rd_half(b + Q4K_DMIN);
    const uint8_t *scales = b + Q4K_SCALES;
    const uint8_t *q = b + Q4K_QS;
    for (int is = 0; is < 8; is += 2) {
        uint8_t sc, m;
        quant_k4_scale_min(is, scales, &sc, &m);
        const float d1 = d * sc, m1 = min * m;
        quant_k4_scale_min(is + 1, scales, &sc, &m);
        const float d2 = d * sc, m2 = min * m;
        for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xf) - m1;
        for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
        q += 32;
    }
}

static void deq_q5_k(const uint8_t *b, float *y) {
    const float d = rd_half(b + Q4K_D), min = rd_half(b + Q4K_DMIN);
    const uint8_t *scales = b + Q4K_SCALES;
    const uint8_t *qh = b + Q5K_QH;
    const uint8_t *ql = b + Q5K_QS;
    uint8_t u1 = 1, u2 = 2;
    for (int is = 0; is < 8; is += 2) {
        uint8_t sc, m;
        quant_k4_scale_min(is, scales, &sc, &m);
        const float d1 = d * sc, m1 = min * m;
        quant_k4_scale_min(is + 1, scales, &sc, &m);
        const float d2 = d * sc, m2 = min * m;
        for (int l = 0; l < 32; l++) *y++ = d1 * ((ql[l] & 0xf) + (qh[l] & u1 ? 16 : 0)) - m1;
        for (int l = 0; l < 32; l++) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        ql += 32;
        u1 = (uint8_t)(u1 << 2);
        u2 = (uint8_t)(u2 << 2);
    }
}

static void deq_q6_k(const uint8_t *b, float *y) {
    const float d = rd_half(b + Q6K_D);
    const uint8_t *ql = b + Q6K_QL;
    const uint8_t *qh = b + Q6K_QH;
    const int8_t *sc = (const int8_t *)(b + Q6K_SCALES);
    for (int n = 0; n < QK_K; n += 128) {
        for (int l = 0; l < 32; l++) {
            const int is = l / 16;
            const int q1 = (int)((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int q2 = (int)((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            /* ggml evaluates d * sc * q left to right in float. */
            y[l + 0] = d * sc[is + 0] * q1;
            y[l + 32] = d * sc[is + 2] * q2;
            y[l + 64] = d * sc[is + 4] * q3;
            y[l + 96] = d * sc[is + 6] * q4;
        }
        y += 128;
        ql += 64;
        qh += 32;
        sc += 8;
    }
}

static void deq_iq4_nl(const uint8_t *b, float *y) {
    const float d = rd_half(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < QK32 / 2; j++) {
        y[j] = d * kvalues_iq4nl[qs[j] & 0xf];
        y[j + QK32 / 2] = d * kvalues_iq4nl[qs[j] >> 4];
    }
}

static void deq_iq4_xs(const uint8_t *b, float *y) {
    const float d = rd_half(b);
    const uint16_t scales_h = g5_rd_u16(b + IQ4XS_SCALES_H);
    const uint8_t *scales_l = b + IQ4XS_SCALES_L;
    const uint8_t *qs = b + IQ4XS_QS;
    for (int ib = 0; ib < QK_K / 32; ib++) {
        const int ls = ((scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) | (((scales_h >> 2 * ib) & 3) << 4);
        const float dl = d * (ls - 32);
        for (int j = 0; j < 16; j++) {
            y[j] = dl * kvalues_iq4nl[qs[j] & 0xf];
            y[j + 16] = dl * kvalues_iq4nl[qs[j] >> 4];
        }
        y += 32;
        qs += 16;
    }
}

typedef void (*deq_block_fn)(const uint8_t *b, float *y);

static deq_block_fn block_dequantizer(uint32_t type) {
    switch (type) {
    case QT_Q4_0: return deq_q4_0;
    case QT_Q4_1: return deq_q4_1;
    case QT_Q5_0: return deq_q5_0;
    case QT_Q5_1: return deq_q5_1;
    case QT_Q8_0: return deq_q8_0;
    case QT_Q2_K: return deq_q2_k;
    case QT_Q3_K: return deq_q3_k;
    case QT_Q4_K: return deq_q4_k;
    case QT_Q5_K: return deq_q5_k;
    case QT_Q6_K: return deq_q6_k;
    case QT_IQ4_NL: return deq_iq4_nl;
    case QT_IQ4_XS: return deq_iq4_xs;
    default: return NULL;
    }
}

/* Common argument checks for the converters; returns the type entry through *out. */
static g5_status check_args(uint32_t type, const void *src, uint64_t n_elems, const void *dst,
                            const quant_type_info **out) {
    const quant_type_info *t = quant_type_get(type);
    if (!t) return G5_ERR_TENSOR_TYPE;
    if (!t->supported) return G5_ERR_UNSUPPORTED;
    if (n_elems % t->block_elems) return G5_ERR_ALIGN;
    if (n_elems && (!src || !dst)) return G5_ERR_INVALID_ARG;
    uint64_t bytes;
    if (g5_mul_u64(n_elems / t->block_elems, t->block_bytes, &bytes) || bytes > SIZE_MAX ||
        n_elems > SIZE_MAX / sizeof(float))
        return G5_ERR_OVERFLOW;
    *out = t;
    return G5_OK;
}

g5_status quant_dequantize(uint32_t type, const void *src, uint64_t n_elems, float *dst) {
    const quant_type_info *t = NULL;
    g5_status st = check_args(type, src, n_elems, dst, &t);
    if (st != G5_OK) return st;
    const uint8_t *s = src;
    switch (type) {
    case QT_F32:
        for (uint64_t i = 0; i < n_elems; i++) dst[i] = f32_from_bits(g5_rd_u32(s + 4 * i));
        return G5_OK;
    case QT_F16:
        for (uint64_t i = 0; i < n_elems; i++) dst[i] = quant_f16_to_f32(g5_rd_u16(s + 2 * i));
        return G5_OK;
    case QT_BF16:
        for (uint64_t i = 0; i < n_elems; i++) dst[i] = quant_bf16_to_f32(g5_rd_u16(s + 2 * i));
        return G5_OK;
    default: break;
    }
    const uint64_t nb = n_elems / t->block_elems;
    deq_block_fn fn = block_dequantizer(type);
    if (!fn) return quant_lowbit_dequant(type, s, nb, dst);
    for (uint64_t i = 0; i < nb; i++) fn(s + i * t->block_bytes, dst + i * t->block_elems);
    return G5_OK;
}

/* ---- quantizers ---- */

static void quantize_block_q8_0(const float *x, uint8_t *b) {
    float amax = 0.0f;
    for (int j = 0; j < QK32; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / 127;
    /* As ggml's reference: the quants use the unrounded scale, the block stores d as fp16. */
    const float id = d ? 1.0f / d : 0.0f;
    g5_wr_u16(b, quant_f32_to_f16(d));
    for (int j = 0; j < QK32; j++) {
        const float v = roundf(x[j] * id);
        /* |x| <= amax keeps v in [-127, 127]; only NaN input (or an infinite amax) escapes. */
        b[2 + j] = (uint8_t)(int8_t)(v >= -127.0f && v <= 127.0f ? (int)v : 0);
    }
}

g5_status quant_quantize(uint32_t type, const float *src, uint64_t n_elems, void *dst) {
    const quant_type_info *t = NULL;
    g5_status st = check_args(type, src, n_elems, dst, &t);
    if (st != G5_OK) return st;
    uint8_t *d = dst;
    switch (type) {
    case QT_F32:
        for (uint64_t i = 0; i < n_elems; i++) g5_wr_u32(d + 4 * i, f32_bits(src[i]));
        return G5_OK;
    case QT_F16:
        for (uint64_t i = 0; i < n_elems; i++) g5_wr_u16(d + 2 * i, quant_f32_to_f16(src[i]));
        return G5_OK;
    case QT_BF16:
        for (uint64_t i = 0; i < n_elems; i++) g5_wr_u16(d + 2 * i, quant_f32_to_bf16(src[i]));
        return G5_OK;
    case QT_Q8_0:
        for (uint64_t i = 0; i < n_elems / QK32; i++)
            quantize_block_q8_0(src + i * QK32, d + i * B_Q8_0);
        return G5_OK;
    default:
        return G5_ERR_UNSUPPORTED;
    }
}

/* ---- random blocks for synthetic models ---- */

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

float quant_rng_uniform(uint64_t *s, float lo, float hi) {
    return lo + (hi - lo) * (float)((rng_next(s) >> 40) * (1.0 / 16777216.0));
}

static void rng_bytes(uint64_t *s, uint8_t *p, size_t n) {
    while (n) {
        uint64_t r = rng_next(s);
        for (int k = 0; k < 8 && n; k++, n--) *p++ = (uint8_t)(r >> (8 * k));
    }
}

/* A positive fp16 scale in [lo, hi). */
static void put_scale(uint64_t *s, uint8_t *p, float lo, float hi) {
    g5_wr_u16(p, quant_f32_to_f16(quant_rng_uniform(s, lo, hi)));
}

/* Scale ranges are chosen so |dequantized| stays around 0.01..1 given each type's largest
 * quant x scale product (e.g. Q4_K: 63 * 15 * d <= ~1). */
static void fill_block(uint32_t type, uint8_t *b, uint64_t *s) {
    const quant_type_info *t = quant_type_get(type);
    rng_bytes(s, b, t->block_bytes);
    switch (type) {
    case QT_F32:
        g5_wr_u32(b, f32_bits(quant_rng_uniform(s, -1.0f, 1.0f)));
        break;
    case QT_F16:
        g5_wr_u16(b, quant_f32_to_f16(quant_rng_uniform(s, -1.0f, 1.0f)));
        break;
    case QT_BF16:
        g5_wr_u16(b, quant_f32_to_bf16(quant_rng_uniform(s, -1.0f, 1.0f)));
        break;
    case QT_Q4_0: put_scale(s, b, 0.01f, 0.12f); break;
    case QT_Q4_1:
        put_scale(s, b, 0.01f, 0.06f);
        g5_wr_u16(b + 2, quant_f32_to_f16(quant_rng_uniform(s, -0.5f, 0.0f)));
        break;
    case QT_Q5_0: put_scale(s, b, 0.005f, 0.06f); break;
    case QT_Q5_1:
        put_scale(s, b, 0.005f, 0.03f);
        g5_wr_u16(b + 2, quant_f32_to_f16(quant_rng_uniform(s, -0.5f, 0.0f)));
        break;
    case QT_Q8_0: put_scale(s, b, 0.001f, 0.008f); break;
    case QT_Q2_K:
        put_scale(s, b + Q2K_D, 0.005f, 0.02f);
        put_scale(s, b + Q2K_DMIN, 0.002f, 0.02f);
        break;
    case QT_Q3_K: put_scale(s, b + Q3K_D, 0.001f, 0.006f); break;
    case QT_Q4_K:
    case QT_Q5_K:
        put_scale(s, b + Q4K_D, 0.0002f, type == QT_Q4_K ? 0.001f : 0.0005f);
        put_scale(s, b + Q4K_DMIN, 0.0002f, 0.002f);
        break;
    case QT_Q6_K: put_scale(s, b + Q6K_D, 0.00005f, 0.0002f); break;
    case QT_IQ4_NL: put_scale(s, b, 0.001f, 0.008f); break;
    case QT_IQ4_XS: put_scale(s, b, 0.00005f, 0.0002f); break;
    default: (void)quant_lowbit_fill(type, b, s); break;
    }
}

g5_status quant_fill_random(uint32_t type, void *dst, uint64_t n_blocks, uint64_t *rng_state) {
    const quant_type_info *t = quant_type_get(type);
    if (!t) return G5_ERR_TENSOR_TYPE;
    if (!t->supported) return G5_ERR_UNSUPPORTED;
    if (n_blocks && (!dst || !rng_state)) return G5_ERR_INVALID_ARG;
    uint64_t bytes;
    if (g5_mul_u64(n_blocks, t->block_bytes, &bytes) || bytes > SIZE_MAX) return G5_ERR_OVERFLOW;
    uint8_t *b = dst;
    for (uint64_t i = 0; i < n_blocks; i++) fill_block(type, b + i * t->block_bytes, rng_state);
    return G5_OK;
}

g5_status quant_centre_blocks(uint32_t type, void *dst, uint64_t n_blocks) {
    const quant_type_info *t = quant_type_get(type);
    if (!t) return G5_ERR_TENSOR_TYPE;
    if (type != QT_Q2_K && type != QT_Q4_K && type != QT_Q5_K) return G5_OK;
    if (n_blocks && !dst) return G5_ERR_INVALID_ARG;
    uint8_t *b = dst;
    for (uint64_t i = 0; i < n_blocks; i++, b += t->block_bytes) {
        if (type == QT_Q2_K) { /* 16 bytes: scale in the low nibble, min in the high one */
            g5_wr_u16(b + Q2K_DMIN, quant_f32_to_f16(quant_f16_to_f32(g5_rd_u16(b + Q2K_D)) * 1.5f));
            uint8_t *sc = b + Q2K_SCALES;
            for (int j = 0; j < 16; j++) sc[j] = (uint8_t)((sc[j] & 0x0f) << 4 | (sc[j] & 0x0f));
            continue;
        }
        const float h = type == QT_Q4_K ? 7.5f : 15.5f;
        g5_wr_u16(b + Q4K_DMIN, quant_f32_to_f16(quant_f16_to_f32(g5_rd_u16(b + Q4K_D)) * h));
        /* 12 bytes: sc / m of sub-blocks 0..3 in bytes 0..3 / 4..7 (6 bits; their top 2 bits
         * hold the high bits of sub-blocks 4..7), bytes 8..11 the low 4 bits of sc (low nibble)
         * and m (high nibble) of 4..7 */
        uint8_t *sc = b + Q4K_SCALES;
        for (int j = 0; j < 4; j++) sc[4 + j] = sc[j];
        for (int j = 8; j < 12; j++) sc[j] = (uint8_t)((sc[j] & 0x0f) | (sc[j] << 4));
    }
    return G5_OK;
}
