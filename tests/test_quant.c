/* Unit tests for format/quant: the type table, size arithmetic, refusal messages, exact half
 * conversions, hand-built blocks of every supported type (expected values computed here per
 * element from the ggml block layout, not by calling the dequantizer), Q8_0 quantization and
 * random fill. The oracle test covers the types present in the oracle GGUF against gguf-py. */
#include <float.h>
#include <math.h>
#include <stdint.h>

#include "format/quant.h"
#include "tests/test_util.h"

/* ---- test-local helpers, independent of the library ---- */

static uint64_t rs = 0x1234abcd5678ef01ull;
static uint32_t rnd32(void) { /* xorshift64* */
    rs ^= rs >> 12;
    rs ^= rs << 25;
    rs ^= rs >> 27;
    return (uint32_t)((rs * 0x2545f4914f6cdd1dull) >> 32);
}
static void rnd_bytes(uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)rnd32();
}

/* IEEE half decode by arithmetic (not bit-moving). */
static double half_val(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 31) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexp(m, -24);
    else v = ldexp(1024 + m, e - 25);
    return s ? -v : v;
}
static double bf16_val(uint16_t h) {
    int s = h >> 15, e = (h >> 7) & 255, m = h & 127;
    double v;
    if (e == 255) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexp(m, -133);
    else v = ldexp(128 + m, e - 134);
    return s ? -v : v;
}
/* A random normal fp16 with exponent field in [e_lo, e_hi] (value 2^(e-15) * 1.m). */
static uint16_t rnd_half(int e_lo, int e_hi, int allow_neg) {
    int e = e_lo + (int)(rnd32() % (uint32_t)(e_hi - e_lo + 1));
    uint16_t h = (uint16_t)((e << 10) | (rnd32() & 1023));
    if (allow_neg && (rnd32() & 1)) h |= 0x8000;
    return h;
}
static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static float get_half(const uint8_t *p) { return (float)half_val((uint16_t)(p[0] | (p[1] << 8))); }

static const int8_t KV[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* ---- type table ---- */

static void test_type_table(void) {
    /* Values checked against ggml's ggml.h enum and ggml-common.h block structs. */
    static const struct { uint32_t id; const char *name; uint32_t elems, bytes; int sup; } want[] = {
        {0, "F32", 1, 4, 1},         {1, "F16", 1, 2, 1},         {2, "Q4_0", 32, 18, 1},
        {3, "Q4_1", 32, 20, 1},      {6, "Q5_0", 32, 22, 1},      {7, "Q5_1", 32, 24, 1},
        {8, "Q8_0", 32, 34, 1},      {9, "Q8_1", 32, 36, 0},      {10, "Q2_K", 256, 84, 1},
        {11, "Q3_K", 256, 110, 1},   {12, "Q4_K", 256, 144, 1},   {13, "Q5_K", 256, 176, 1},
        {14, "Q6_K", 256, 210, 1},   {15, "Q8_K", 256, 292, 0},   {16, "IQ2_XXS", 256, 66, 1},
        {17, "IQ2_XS", 256, 74, 1},  {18, "IQ3_XXS", 256, 98, 1}, {19, "IQ1_S", 256, 50, 1},
        {20, "IQ4_NL", 32, 18, 1},   {21, "IQ3_S", 256, 110, 1},  {22, "IQ2_S", 256, 82, 1},
        {23, "IQ4_XS", 256, 136, 1}, {24, "I8", 1, 1, 0},         {25, "I16", 1, 2, 0},
        {26, "I32", 1, 4, 0},        {27, "I64", 1, 8, 0},        {28, "F64", 1, 8, 0},
        {29, "IQ1_M", 256, 56, 1},   {30, "BF16", 1, 2, 1},       {34, "TQ1_0", 256, 54, 1},
        {35, "TQ2_0", 256, 66, 1},   {39, "MXFP4", 32, 17, 1},    {40, "NVFP4", 64, 36, 1},    {41, "Q1_0", 128, 18, 0},
    };
    const size_t nw = sizeof want / sizeof want[0];
    int known = 0;
    for (uint32_t id = 0; id < QT_TYPE_LIMIT + 8; id++) {
        const quant_type_info *t = quant_type_get(id);
        size_t k = 0;
        while (k < nw && want[k].id != id) k++;
        if (k == nw) {
            T_CHECK(t == NULL, "id %u should be unknown", id);
            T_CHECK(strcmp(quant_type_name(id), "unknown") == 0, "name of unknown id %u: %s", id,
                    quant_type_name(id));
            continue;
        }
        known++;
        T_CHECK(t != NULL, "id %u (%s) missing", id, want[k].name);
        if (!t) continue;
        T_CHECK(t->id == id, "id %u: entry says %u", id, t->id);
        T_CHECK(strcmp(t->name, want[k].name) == 0, "id %u: name %s, want %s", id, t->name, want[k].name);
        T_CHECK(t->block_elems == want[k].elems && t->block_bytes == want[k].bytes,
                "%s: block %u/%u, want %u/%u", t->name, t->block_elems, t->block_bytes,
                want[k].elems, want[k].bytes);
        T_CHECK(t->supported == want[k].sup, "%s: supported=%d", t->name, t->supported);
        T_CHECK(strcmp(quant_type_name(id), want[k].name) == 0, "quant_type_name(%u)", id);
        T_CHECK(quant_type_from_name(want[k].name) == (int)id, "from_name(%s)", want[k].name);
        char lower[16];
        size_t n = strlen(want[k].name);
        for (size_t c = 0; c <= n; c++)
            lower[c] = (char)(want[k].name[c] >= 'A' && want[k].name[c] <= 'Z' ? want[k].name[c] + 32 : want[k].name[c]);
        T_CHECK(quant_type_from_name(lower) == (int)id, "from_name(%s)", lower);
        T_CHECK(quant_check_supported(id, NULL) == (want[k].sup ? G5_OK : G5_ERR_UNSUPPORTED),
                "check_supported(%s)", want[k].name);
    }
    T_CHECK(known == (int)nw, "%d known ids", known);
    T_CHECK(quant_type_from_name("Q4_K_M") == -1, "Q4_K_M is a file type, not a tensor type");
    T_CHECK(quant_type_from_name("Q4_") == -1, "prefix matched");
    T_CHECK(quant_type_from_name("") == -1 && quant_type_from_name(NULL) == -1, "empty/NULL name");
    T_CHECK(quant_type_get(UINT32_MAX) == NULL, "UINT32_MAX");
}

static void test_row_bytes(void) {
    uint64_t b = 0;
    T_CHECK(quant_row_bytes(QT_Q4_K, 512, &b) == G5_OK && b == 288, "Q4_K 512 -> %llu", (unsigned long long)b);
    T_CHECK(quant_row_bytes(QT_Q5_0, 192, &b) == G5_OK && b == 6 * 22, "Q5_0 192");
    T_CHECK(quant_row_bytes(QT_F32, 7, &b) == G5_OK && b == 28, "F32 7");
    T_CHECK(quant_row_bytes(QT_BF16, 0, &b) == G5_OK && b == 0, "BF16 0");
    /* Sizes of known but unsupported types are still needed to walk a file. */
    T_CHECK(quant_row_bytes(QT_IQ2_XXS, 256, &b) == G5_OK && b == 66, "IQ2_XXS 256");
    T_CHECK(quant_row_bytes(QT_MXFP4, 64, &b) == G5_OK && b == 34, "MXFP4 64");
    T_CHECK(quant_row_bytes(QT_Q4_K, 255, &b) == G5_ERR_ALIGN, "Q4_K 255 must be ALIGN");
    T_CHECK(quant_row_bytes(QT_Q8_0, 48, &b) == G5_ERR_ALIGN, "Q8_0 48 must be ALIGN");
    T_CHECK(quant_row_bytes(QT_F64, UINT64_MAX / 4, &b) == G5_ERR_OVERFLOW, "F64 overflow");
    T_CHECK(quant_row_bytes(QT_Q8_0, (UINT64_MAX / 32) * 32, &b) == G5_ERR_OVERFLOW, "Q8_0 overflow");
    /* The boundary: the largest F32 count whose byte size fits, and one more. */
    T_CHECK(quant_row_bytes(QT_F32, UINT64_MAX / 4, &b) == G5_OK && b == (UINT64_MAX / 4) * 4, "F32 max");
    T_CHECK(quant_row_bytes(QT_F32, UINT64_MAX / 4 + 1, &b) == G5_ERR_OVERFLOW, "F32 max + 1");
    T_CHECK(quant_row_bytes(77, 32, &b) == G5_ERR_TENSOR_TYPE, "unknown type");
}

static void test_refusals(void) {
    g5_error err;
    memset(&err, 0, sizeof err);
    T_CHECK(quant_check_supported(QT_Q8_K, &err) == G5_ERR_UNSUPPORTED && err.status == G5_ERR_UNSUPPORTED,
            "Q8_K status");
    T_CHECK(strcmp(err.msg, "Q8_K (15): not supported") == 0, "message '%s'", err.msg);
    T_CHECK(quant_check_supported(QT_I32, &err) == G5_ERR_UNSUPPORTED &&
                strcmp(err.msg, "I32 (26): not supported") == 0, "message '%s'", err.msg);
    T_CHECK(quant_check_supported(77, &err) == G5_ERR_TENSOR_TYPE && err.status == G5_ERR_TENSOR_TYPE,
            "unknown status");
    T_CHECK(strcmp(err.msg, "type id 77: unknown") == 0, "message '%s'", err.msg);
    T_CHECK(quant_check_supported(31, &err) == G5_ERR_TENSOR_TYPE, "removed id 31 is unknown");
    T_CHECK(quant_check_supported(QT_Q6_K, NULL) == G5_OK, "Q6_K supported");

    uint8_t buf[512] = {0};
    float out[256];
    T_CHECK(quant_dequantize(QT_Q8_1, buf, 32, out) == G5_ERR_UNSUPPORTED, "dequant Q8_1");
    T_CHECK(quant_dequantize(QT_Q8_K, buf, 256, out) == G5_ERR_UNSUPPORTED, "dequant Q8_K");
    T_CHECK(quant_dequantize(QT_I32, buf, 4, out) == G5_ERR_UNSUPPORTED, "dequant I32");
    T_CHECK(quant_dequantize(99, buf, 256, out) == G5_ERR_TENSOR_TYPE, "dequant unknown");
    T_CHECK(quant_dequantize(QT_Q4_0, buf, 33, out) == G5_ERR_ALIGN, "dequant misaligned");
    T_CHECK(quant_dequantize(QT_Q4_0, NULL, 32, out) == G5_ERR_INVALID_ARG, "dequant NULL src");
    T_CHECK(quant_dequantize(QT_Q4_0, buf, 32, NULL) == G5_ERR_INVALID_ARG, "dequant NULL dst");
    T_CHECK(quant_dequantize(QT_Q4_0, buf, 0, out) == G5_OK, "dequant 0 elements");
    T_CHECK(quant_quantize(QT_Q4_K, out, 256, buf) == G5_ERR_UNSUPPORTED, "quantize Q4_K");
    T_CHECK(quant_quantize(QT_IQ2_XXS, out, 256, buf) == G5_ERR_UNSUPPORTED, "quantize IQ2_XXS");
    T_CHECK(quant_quantize(200, out, 256, buf) == G5_ERR_TENSOR_TYPE, "quantize unknown");
    T_CHECK(quant_quantize(QT_Q8_0, out, 31, buf) == G5_ERR_ALIGN, "quantize misaligned");
    uint64_t st = 1;
    T_CHECK(quant_fill_random(QT_Q8_K, buf, 1, &st) == G5_ERR_UNSUPPORTED, "fill Q8_K");
    T_CHECK(quant_fill_random(64, buf, 1, &st) == G5_ERR_TENSOR_TYPE, "fill unknown");
}

/* ---- half conversions ---- */

static int same_bits_or_both_nan(float a, double b) {
    if (isnan(b)) return isnan(a);
    return (double)a == b && !signbit(a) == !signbit((float)b);
}

static void test_f16(void) {
    int bad_dec = 0, bad_rt = 0, bad_round = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = quant_f16_to_f32((uint16_t)h);
        if (!same_bits_or_both_nan(f, half_val((uint16_t)h))) bad_dec++;
        const uint16_t back = quant_f32_to_f16(f);
        if (isnan(f)) {
            /* NaN stays NaN with its sign; a quiet NaN keeps its payload. */
            if ((back & 0x7c00) != 0x7c00 || !(back & 0x3ff) || (back & 0x8000) != (h & 0x8000) ||
                ((h & 0x200) && back != h))
                bad_rt++;
        } else if (back != h) {
            bad_rt++;
        }
    }
    T_CHECK(bad_dec == 0, "%d f16 values decode wrongly", bad_dec);
    T_CHECK(bad_rt == 0, "%d f16 values do not round-trip", bad_rt);

    /* Round to nearest, ties to even, between every pair of adjacent finite halves, both signs
     * (subnormals included). Midpoints of halves are exact floats. */
    for (uint32_t h = 0; h < 0x7bff; h++) {
        for (int neg = 0; neg < 2; neg++) {
            const double a = half_val((uint16_t)h), b = half_val((uint16_t)(h + 1));
            const float mid = (float)((a + b) / 2);
            const uint16_t s = neg ? 0x8000 : 0;
            const float m = neg ? -mid : mid;
            const uint16_t even = (uint16_t)(s | ((h & 1) ? h + 1 : h));
            if (quant_f32_to_f16(m) != even) bad_round++;
            if (quant_f32_to_f16(nextafterf(m, neg ? -INFINITY : INFINITY)) != (s | (h + 1))) bad_round++;
            if (quant_f32_to_f16(nextafterf(m, 0.0f)) != (s | h)) bad_round++;
        }
    }
    T_CHECK(bad_round == 0, "%d f16 rounding errors", bad_round);
    T_CHECK(quant_f32_to_f16(65504.0f) == 0x7bff, "max half");
    T_CHECK(quant_f32_to_f16(65520.0f) == 0x7c00, "65520 ties to even -> inf");
    T_CHECK(quant_f32_to_f16(nextafterf(65520.0f, 0)) == 0x7bff, "just below 65520");
    T_CHECK(quant_f32_to_f16(1e10f) == 0x7c00 && quant_f32_to_f16(-1e10f) == 0xfc00, "overflow");
    T_CHECK(quant_f32_to_f16(INFINITY) == 0x7c00 && quant_f32_to_f16(-INFINITY) == 0xfc00, "inf");
    T_CHECK((quant_f32_to_f16(NAN) & 0x7fff) > 0x7c00, "NaN");
    T_CHECK(quant_f32_to_f16(0x1p-25f) == 0x0000, "2^-25 ties to even -> 0");
    T_CHECK(quant_f32_to_f16(nextafterf(0x1p-25f, 1)) == 0x0001, "just above 2^-25");
    T_CHECK(quant_f32_to_f16(1e-10f) == 0 && quant_f32_to_f16(-1e-10f) == 0x8000, "underflow keeps sign");
    T_CHECK(quant_f32_to_f16(FLT_TRUE_MIN) == 0 && quant_f32_to_f16(-0.0f) == 0x8000, "tiny");
    T_CHECK(quant_f32_to_f16(0x1p-14f) == 0x0400 && quant_f32_to_f16(nextafterf(0x1p-14f, 0)) == 0x0400,
            "smallest normal and just below");
    T_CHECK(quant_f32_to_f16(1.0f) == 0x3c00 && quant_f32_to_f16(-2.0f) == 0xc000, "1, -2");
    T_CHECK(quant_f32_to_f16(0.1f) == 0x2e66, "0.1");
}

static void test_bf16(void) {
    int bad_dec = 0, bad_rt = 0, bad_round = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = quant_bf16_to_f32((uint16_t)h);
        if (!same_bits_or_both_nan(f, bf16_val((uint16_t)h))) bad_dec++;
        const uint16_t back = quant_f32_to_bf16(f);
        if (isnan(f)) {
            if ((back & 0x7f80) != 0x7f80 || !(back & 0x7f) || (back & 0x8000) != (h & 0x8000) ||
                ((h & 0x40) && back != h))
                bad_rt++;
        } else if (back != h) {
            bad_rt++;
        }
    }
    T_CHECK(bad_dec == 0, "%d bf16 values decode wrongly", bad_dec);
    T_CHECK(bad_rt == 0, "%d bf16 values do not round-trip", bad_rt);
    for (uint32_t h = 0; h < 0x7f7f; h++) {
        for (int neg = 0; neg < 2; neg++) {
            const double a = bf16_val((uint16_t)h), b = bf16_val((uint16_t)(h + 1));
            const float mid = (float)((a + b) / 2);
            const uint16_t s = neg ? 0x8000 : 0;
            const float m = neg ? -mid : mid;
            const uint16_t even = (uint16_t)(s | ((h & 1) ? h + 1 : h));
            if (quant_f32_to_bf16(m) != even) bad_round++;
            if (quant_f32_to_bf16(nextafterf(m, neg ? -INFINITY : INFINITY)) != (s | (h + 1))) bad_round++;
            if (quant_f32_to_bf16(nextafterf(m, 0.0f)) != (s | h)) bad_round++;
        }
    }
    T_CHECK(bad_round == 0, "%d bf16 rounding errors", bad_round);
    T_CHECK(quant_f32_to_bf16(FLT_MAX) == 0x7f80, "FLT_MAX rounds up to inf");
    T_CHECK(quant_f32_to_bf16(-INFINITY) == 0xff80, "-inf");
    T_CHECK((quant_f32_to_bf16(NAN) & 0x7fff) > 0x7f80, "NaN");
    /* A NaN whose payload lies only in the low 16 bits must not become infinity. */
    uint32_t nb = 0x7f800001u;
    float sn;
    memcpy(&sn, &nb, 4);
    T_CHECK((quant_f32_to_bf16(sn) & 0x7fff) > 0x7f80, "low-payload NaN");
    nb = 0xff800001u;
    memcpy(&sn, &nb, 4);
    T_CHECK((quant_f32_to_f16(sn) & 0x7fff) > 0x7c00 && (quant_f32_to_f16(sn) & 0x8000), "f16 low-payload NaN");
    /* bf16's smallest subnormal is 2^-133: half of it ties to even (0), 1.5 of it ties up to 2. */
    T_CHECK(quant_f32_to_bf16(0x1p-134f) == 0x0000 && quant_f32_to_bf16(0x1p-134f * 3) == 0x0002 &&
                quant_f32_to_bf16(FLT_TRUE_MIN) == 0x0000, "bf16 subnormal rounding");
    T_CHECK(quant_f32_to_bf16(1.0f) == 0x3f80 && quant_f32_to_bf16(-1.5f) == 0xbfc0, "1, -1.5");
}

/* ---- hand-built blocks: expected value of element e of a block, per the ggml layout ---- */

typedef struct {
    /* Unpacked scale fields the test chose before packing them into the block. */
    int sc[16], mn[16];
} scales_t;

static int nib32(const uint8_t *qs, int e) { return e < 16 ? (qs[e] & 15) : (qs[e - 16] >> 4); }

static float expect_elem(uint32_t type, const uint8_t *b, const scales_t *S, int e) {
    switch (type) {
    case QT_F32: {
        uint32_t u = (uint32_t)b[4 * e] | ((uint32_t)b[4 * e + 1] << 8) | ((uint32_t)b[4 * e + 2] << 16) |
                     ((uint32_t)b[4 * e + 3] << 24);
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    case QT_F16: return (float)half_val((uint16_t)(b[2 * e] | (b[2 * e + 1] << 8)));
    case QT_BF16: return (float)bf16_val((uint16_t)(b[2 * e] | (b[2 * e + 1] << 8)));
    case QT_Q4_0: return (nib32(b + 2, e) - 8) * get_half(b);
    case QT_Q4_1: return nib32(b + 4, e) * get_half(b) + get_half(b + 2);
    case QT_Q5_0: {
        const int hb = (b[2 + e / 8] >> (e % 8)) & 1;
        return ((nib32(b + 6, e) | (hb << 4)) - 16) * get_half(b);
    }
    case QT_Q5_1: {
        const int hb = (b[4 + e / 8] >> (e % 8)) & 1;
        return (nib32(b + 8, e) | (hb << 4)) * get_half(b) + get_half(b + 2);
    }
    case QT_Q8_0: return (int8_t)b[2 + e] * get_half(b);
    case QT_IQ4_NL: return get_half(b) * KV[nib32(b + 2, e)];
    case QT_Q2_K: {
        const int h = e / 128, g = (e % 128) / 32, l = e % 32;
        const int q = (b[16 + h * 32 + l] >> (2 * g)) & 3;
        const int is = h * 8 + 2 * g + l / 16;
        const float dl = get_half(b + 80) * (b[is] & 15), ml = get_half(b + 82) * (b[is] >> 4);
        return dl * q - ml;
    }
    case QT_Q3_K: {
        const int h = e / 128, g = (e % 128) / 32, l = e % 32;
        const int low = (b[32 + h * 32 + l] >> (2 * g)) & 3;
        const int high = (b[l] >> (4 * h + g)) & 1;
        const int is = h * 8 + 2 * g + l / 16;
        const float dl = get_half(b + 108) * (S->sc[is] - 32);
        return dl * (low - (high ? 0 : 4));
    }
    case QT_Q4_K:
    case QT_Q5_K: {
        const int c = e / 64, hi = (e % 64) / 32, l = e % 32, j = e / 32;
        const uint8_t *qs = b + (type == QT_Q4_K ? 16 : 48);
        int q = hi ? (qs[c * 32 + l] >> 4) : (qs[c * 32 + l] & 15);
        if (type == QT_Q5_K) q += 16 * ((b[16 + l] >> (2 * c + hi)) & 1);
        const float d1 = get_half(b) * S->sc[j], m1 = get_half(b + 2) * S->mn[j];
        return d1 * q - m1;
    }
    case QT_Q6_K: {
        const int h = e / 128, g = (e % 128) / 32, l = e % 32;
        const uint8_t qlb = b[h * 64 + (g & 1) * 32 + l];
        const int low = g >= 2 ? (qlb >> 4) : (qlb & 15);
        const int high = (b[128 + h * 32 + l] >> (2 * g)) & 3;
        const int q = (low | (high << 4)) - 32;
        const int sc = (int8_t)b[192 + h * 8 + 2 * g + l / 16];
        return get_half(b + 208) * sc * q;
    }
    case QT_IQ4_XS: {
        const int ib = e / 32, l = e % 32;
        const int nib = l < 16 ? (b[8 + ib * 16 + l] & 15) : (b[8 + ib * 16 + l - 16] >> 4);
        const float dl = get_half(b) * (S->sc[ib] - 32);
        return dl * KV[nib];
    }
    default: return NAN;
    }
}

/* Random block with the scale fields chosen and packed here. */
static void build_block(uint32_t type, uint8_t *b, size_t bytes, scales_t *S) {
    rnd_bytes(b, bytes);
    memset(S, 0, sizeof *S);
    switch (type) {
    case QT_F32: {
        for (size_t i = 0; i < bytes; i += 4) { /* keep F32 finite: random sign/mantissa, sane exponent */
            b[i + 3] = (uint8_t)((b[i + 3] & 0x80) | (0x38 + (b[i + 3] & 0x0f)));
        }
        break;
    }
    case QT_F16:
        for (size_t i = 0; i < bytes; i += 2) put16(b + i, rnd_half(0, 30, 1)); /* exponent 0: subnormals */
        break;
    case QT_BF16:
        for (size_t i = 0; i < bytes; i += 2) b[i + 1] = (uint8_t)((b[i + 1] & 0x80) | (0x30 + (b[i + 1] & 0x1f)));
        break;
    case QT_Q4_0: case QT_Q5_0: case QT_Q8_0: case QT_IQ4_NL:
        put16(b, rnd_half(5, 20, 1));
        break;
    case QT_Q4_1: case QT_Q5_1:
        put16(b, rnd_half(5, 20, 1));
        put16(b + 2, rnd_half(5, 20, 1));
        break;
    case QT_Q2_K:
        put16(b + 80, rnd_half(5, 20, 1));
        put16(b + 82, rnd_half(5, 20, 1));
        break;
    case QT_Q3_K: {
        uint8_t *s = b + 96;
        memset(s, 0, 12);
        for (int j = 0; j < 16; j++) {
            S->sc[j] = (int)(rnd32() % 64);
            const int lo = S->sc[j] & 15, hi = S->sc[j] >> 4;
            if (j < 8) s[j] |= (uint8_t)lo;
            else s[j - 8] |= (uint8_t)(lo << 4);
            s[8 + j % 4] |= (uint8_t)(hi << (2 * (j / 4)));
        }
        put16(b + 108, rnd_half(5, 20, 1));
        break;
    }
    case QT_Q4_K:
    case QT_Q5_K: {
        uint8_t *s = b + 4;
        memset(s, 0, 12);
        for (int j = 0; j < 8; j++) {
            S->sc[j] = (int)(rnd32() % 64);
            S->mn[j] = (int)(rnd32() % 64);
        }
        for (int j = 0; j < 4; j++) {
            s[j] = (uint8_t)(S->sc[j] | ((S->sc[j + 4] >> 4) << 6));
            s[j + 4] = (uint8_t)(S->mn[j] | ((S->mn[j + 4] >> 4) << 6));
            s[j + 8] = (uint8_t)((S->sc[j + 4] & 15) | ((S->mn[j + 4] & 15) << 4));
        }
        put16(b, rnd_half(5, 20, 1));
        put16(b + 2, rnd_half(5, 20, 1));
        break;
    }
    case QT_Q6_K:
        put16(b + 208, rnd_half(5, 20, 1));
        break;
    case QT_IQ4_XS: {
        uint16_t sh = 0;
        memset(b + 4, 0, 4);
        for (int ib = 0; ib < 8; ib++) {
            S->sc[ib] = (int)(rnd32() % 64);
            b[4 + ib / 2] |= (uint8_t)((S->sc[ib] & 15) << (4 * (ib % 2)));
            sh |= (uint16_t)((S->sc[ib] >> 4) << (2 * ib));
        }
        put16(b, rnd_half(5, 20, 1));
        put16(b + 2, sh);
        break;
    }
    default: break;
    }
}

static const uint32_t supported_types[] = {QT_F32, QT_F16, QT_BF16, QT_Q4_0, QT_Q4_1, QT_Q5_0,
                                           QT_Q5_1, QT_Q8_0, QT_Q2_K, QT_Q3_K, QT_Q4_K, QT_Q5_K,
                                           QT_Q6_K, QT_IQ4_NL, QT_IQ4_XS};
#define N_SUPPORTED (sizeof supported_types / sizeof supported_types[0])

static void test_hand_built(void) {
    enum { NBLK = 3, TRIALS = 40 };
    for (size_t ti = 0; ti < N_SUPPORTED; ti++) {
        const uint32_t type = supported_types[ti];
        const quant_type_info *t = quant_type_get(type);
        if (!t) continue;
        /* Scalar types get a "block" of 256 elements so the loop shape is shared. */
        const uint32_t be = t->block_elems == 1 ? 256 : t->block_elems;
        const uint32_t bb = t->block_elems == 1 ? 256 * t->block_bytes : t->block_bytes;
        uint8_t *raw = malloc((size_t)NBLK * bb);
        float *out = malloc((size_t)NBLK * be * sizeof(float));
        scales_t S[NBLK];
        int bad = 0, nonzero = 0;
        for (int trial = 0; trial < TRIALS && raw && out; trial++) {
            for (int k = 0; k < NBLK; k++) build_block(type, raw + (size_t)k * bb, bb, &S[k]);
            g5_status st = quant_dequantize(type, raw, (uint64_t)NBLK * be, out);
            if (st != G5_OK) {
                T_CHECK(0, "%s: dequantize: %s", t->name, g5_strerror(st));
                break;
            }
            for (int k = 0; k < NBLK; k++) {
                for (uint32_t e = 0; e < be; e++) {
                    const float want = expect_elem(type, raw + (size_t)k * bb, &S[k], (int)e);
                    const float got = out[(size_t)k * be + e];
                    if (got != 0) nonzero++;
                    if (!(got == want || (isnan(got) && isnan(want)))) {
                        if (bad++ < 3)
                            T_CHECK(0, "%s: block %d element %u = %.9g, expected %.9g", t->name, k, e, got, want);
                    }
                }
            }
        }
        T_CHECK(bad == 0, "%s: %d hand-built elements differ", t->name, bad);
        T_CHECK(nonzero > TRIALS * NBLK * (int)be / 2, "%s: mostly zeros (%d)", t->name, nonzero);
        free(raw);
        free(out);
    }
}

/* A few fully hand-written blocks with exact known values, as a readable anchor. */
static void test_fixed_blocks(void) {
    float y[256];
    /* Q4_0, d = 0.5: element j (< 16) from low nibble j, element j+16 from the high nibble. */
    uint8_t q40[18] = {0x00, 0x38};
    for (int j = 0; j < 16; j++) q40[2 + j] = (uint8_t)(j | ((15 - j) << 4));
    T_CHECK(quant_dequantize(QT_Q4_0, q40, 32, y) == G5_OK, "q4_0");
    T_CHECK(y[0] == -4.0f && y[15] == 3.5f && y[16] == 3.5f && y[31] == -4.0f && y[8] == 0.0f,
            "q4_0 values %g %g %g %g", y[0], y[15], y[16], y[31]);
    /* Q5_1, d = 1, m = -16: value = q - 16 with q's 5th bit from qh bit e. */
    uint8_t q51[24] = {0x00, 0x3c, 0x00, 0xcc, 0x01, 0x00, 0x00, 0x80};
    q51[8] = 0x3f; /* element 0 nibble 15, element 16 nibble 3 */
    T_CHECK(quant_dequantize(QT_Q5_1, q51, 32, y) == G5_OK, "q5_1");
    T_CHECK(y[0] == 15.0f, "q5_1 e0 = %g (bit 0 set: 15+16-16)", y[0]);
    T_CHECK(y[16] == -13.0f && y[31] == 0.0f && y[1] == -16.0f, "q5_1 e16=%g e31=%g e1=%g", y[16], y[31], y[1]);
    /* IQ4_NL, d = 1: the levels themselves. */
    uint8_t nl[18] = {0x00, 0x3c};
    for (int j = 0; j < 16; j++) nl[2 + j] = (uint8_t)(j | (j << 4));
    T_CHECK(quant_dequantize(QT_IQ4_NL, nl, 32, y) == G5_OK, "iq4_nl");
    T_CHECK(y[0] == -127.0f && y[7] == -10.0f && y[8] == 1.0f && y[15] == 113.0f && y[31] == 113.0f, "iq4_nl levels");
    /* Q3_K with all scales 33 (scale 1), d = 1, hmask all set: values are the 2-bit quants. */
    uint8_t q3[110];
    memset(q3, 0, sizeof q3);
    memset(q3, 0xff, 32);
    q3[32] = 0xe4; /* element 0: 0, element 32: 1, element 64: 2, element 96: 3 */
    for (int j = 0; j < 8; j++) q3[96 + j] = 0x11; /* low nibbles 1 */
    for (int j = 8; j < 12; j++) q3[96 + j] = 0xaa; /* high bits 2 -> 33 */
    q3[108] = 0x00, q3[109] = 0x3c;
    T_CHECK(quant_dequantize(QT_Q3_K, q3, 256, y) == G5_OK, "q3_K");
    T_CHECK(y[0] == 0.0f && y[32] == 1.0f && y[64] == 2.0f && y[96] == 3.0f && y[1] == 0.0f, "q3_K values");
    q3[0] = 0xfe; /* clear element 0's high bit: 0 - 4 */
    quant_dequantize(QT_Q3_K, q3, 256, y);
    T_CHECK(y[0] == -4.0f && y[32] == 1.0f, "q3_K hmask bit 0 -> element 0 only (%g, %g)", y[0], y[32]);
}

/* ---- quantizers ---- */

static void test_quantize(void) {
    enum { N = 32 * 64 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    uint8_t *q = malloc((N / 32) * 34);
    if (!x || !y || !q) {
        T_CHECK(0, "oom");
        return;
    }
    for (int i = 0; i < N; i++) {
        const int blk = i / 32;
        const float scale = ldexpf(1.0f, (blk % 16) - 10); /* 2^-10 .. 2^5 */
        x[i] = scale * ((float)(int32_t)rnd32() / 2147483648.0f);
    }
    for (int j = 0; j < 32; j++) x[32 * 5 + j] = 0.0f; /* an all-zero block */
    x[32 * 6 + 3] = -1000.0f;                        /* amax from a negative value */
    T_CHECK(quant_quantize(QT_Q8_0, x, N, q) == G5_OK, "quantize q8_0");
    T_CHECK(quant_dequantize(QT_Q8_0, q, N, y) == G5_OK, "dequantize q8_0");
    int bad_bound = 0, bad_ref = 0;
    for (int b = 0; b < N / 32; b++) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fabsf(x[b * 32 + j]) > amax ? fabsf(x[b * 32 + j]) : amax;
        const float d = amax / 127;
        const float id = d ? 1.0f / d : 0.0f;
        const uint8_t *blk = q + b * 34;
        const double d16 = half_val((uint16_t)(blk[0] | (blk[1] << 8)));
        /* ggml's reference: d stored as fp16, quants rounded half away from zero with 1/d.
         * fp16 rounding of d: relative 2^-11 when normal, absolute 2^-25 when subnormal. */
        const double d_err = fmax(d * 0x1p-11, 0x1p-25);
        if (fabs(d16 - d) > d_err) bad_ref++;
        for (int j = 0; j < 32; j++) {
            if ((int8_t)blk[2 + j] != (int)roundf(x[b * 32 + j] * id)) bad_ref++;
            /* Error: half a quant step, plus the fp16 rounding of d over up to 127 steps. */
            const double err = fabs((double)y[b * 32 + j] - x[b * 32 + j]);
            if (err > d * 0.5 + 127.0 * d_err) bad_bound++;
        }
    }
    T_CHECK(bad_ref == 0, "%d q8_0 bytes differ from the reference rule", bad_ref);
    T_CHECK(bad_bound == 0, "%d q8_0 round-trip errors above bound", bad_bound);
    T_CHECK(q[5 * 34] == 0 && q[5 * 34 + 1] == 0 && y[5 * 32] == 0.0f, "all-zero block");
    T_CHECK((int8_t)q[6 * 34 + 2 + 3] == -127 && q[6 * 34] == 0xe0 && q[6 * 34 + 1] == 0x47 &&
                y[6 * 32 + 3] == -1000.125f, /* d = 1000/127 stored as fp16 7.875 (0x47e0) */
            "amax element -> -127 (%d, %g)", (int8_t)q[6 * 34 + 2 + 3], y[6 * 32 + 3]);
    /* Halfway cases round away from zero (roundf): amax 127 -> d = 1, x = 2.5 -> 3, -2.5 -> -3. */
    float h[32] = {127.0f, 2.5f, -2.5f, 0.5f, -0.5f};
    uint8_t hq[34];
    quant_quantize(QT_Q8_0, h, 32, hq);
    T_CHECK(hq[0] == 0x00 && hq[1] == 0x3c, "d = 1.0");
    T_CHECK((int8_t)hq[3] == 3 && (int8_t)hq[4] == -3 && (int8_t)hq[5] == 1 && (int8_t)hq[6] == -1,
            "ties away from zero: %d %d %d %d", (int8_t)hq[3], (int8_t)hq[4], (int8_t)hq[5], (int8_t)hq[6]);

    /* F32 / F16 / BF16 storage: little-endian encodings of each element. */
    uint8_t *r = malloc(N * 4);
    if (r) {
        T_CHECK(quant_quantize(QT_F32, x, N, r) == G5_OK, "f32");
        T_CHECK(quant_dequantize(QT_F32, r, N, y) == G5_OK && memcmp(x, y, N * 4) == 0, "f32 round trip");
        uint32_t u;
        memcpy(&u, &x[7], 4);
        T_CHECK(r[28] == (uint8_t)u && r[31] == (uint8_t)(u >> 24), "f32 little-endian");
        int bad16 = 0, badbf = 0;
        T_CHECK(quant_quantize(QT_F16, x, N, r) == G5_OK, "f16");
        for (int i = 0; i < N; i++)
            if ((uint16_t)(r[2 * i] | (r[2 * i + 1] << 8)) != quant_f32_to_f16(x[i])) bad16++;
        T_CHECK(quant_quantize(QT_BF16, x, N, r) == G5_OK, "bf16");
        for (int i = 0; i < N; i++)
            if ((uint16_t)(r[2 * i] | (r[2 * i + 1] << 8)) != quant_f32_to_bf16(x[i])) badbf++;
        T_CHECK(bad16 == 0 && badbf == 0, "f16 %d / bf16 %d encodings differ", bad16, badbf);
        free(r);
    }
    free(x);
    free(y);
    free(q);
}

static void test_fill_random(void) {
    int n_types = 0;
    for (uint32_t type = 0; type < QT_TYPE_LIMIT; type++) {
        const quant_type_info *t = quant_type_get(type);
        if (!t || !t->supported) continue;
        n_types++;
        const uint64_t nblk = t->block_elems == 1 ? 4096 : 4096 / t->block_elems + 8;
        const uint64_t n = nblk * t->block_elems;
        uint8_t *a = malloc(nblk * t->block_bytes), *b2 = malloc(nblk * t->block_bytes);
        float *y = malloc(n * sizeof *y);
        if (!a || !b2 || !y) {
            T_CHECK(0, "oom");
            free(a), free(b2), free(y);
            continue;
        }
        uint64_t s1 = 42, s2 = 42;
        T_CHECK(quant_fill_random(type, a, nblk, &s1) == G5_OK, "%s fill", t->name);
        T_CHECK(quant_fill_random(type, b2, nblk, &s2) == G5_OK && memcmp(a, b2, nblk * t->block_bytes) == 0 &&
                    s1 == s2 && s1 != 42, "%s fill is deterministic and advances the state", t->name);
        T_CHECK(quant_dequantize(type, a, n, y) == G5_OK, "%s dequantize", t->name);
        int nonfinite = 0;
        double amax = 0, sumsq = 0;
        for (uint64_t i = 0; i < n; i++) {
            if (!isfinite(y[i])) nonfinite++;
            else {
                amax = fabs(y[i]) > amax ? fabs(y[i]) : amax;
                sumsq += (double)y[i] * y[i];
            }
        }
        const double rms = sqrt(sumsq / (double)n);
        T_CHECK(nonfinite == 0, "%s: %d non-finite values", t->name, nonfinite);
        T_CHECK(amax <= 2.0 && amax >= 0.05, "%s: max |value| %g", t->name, amax);
        T_CHECK(rms >= 0.005 && rms <= 1.0, "%s: rms %g", t->name, rms);
        uint64_t s3 = 43;
        quant_fill_random(type, b2, nblk, &s3);
        T_CHECK(memcmp(a, b2, nblk * t->block_bytes) != 0, "%s: another seed gives other data", t->name);
        free(a), free(b2), free(y);
    }
    T_CHECK(n_types == 26, "%d supported types filled", n_types);
}

/* quant_centre_blocks: the three types with independent mins come out zero-mean (|mean| <= 2% of
 * the rms over 64 Ki weights; before: at least 20%), with the same scales and quants, finite;
 * every other type is left byte for byte as it was. */
static void test_centre(void) {
    for (uint32_t type = 0; type < QT_TYPE_LIMIT; type++) {
        const quant_type_info *t = quant_type_get(type);
        if (!t || !t->supported || t->block_elems == 1) continue;
        const uint64_t nblk = 65536 / t->block_elems, n = nblk * t->block_elems;
        uint8_t *a = malloc(nblk * t->block_bytes), *b2 = malloc(nblk * t->block_bytes);
        float *y = malloc(n * sizeof *y);
        if (!a || !b2 || !y) {
            T_CHECK(0, "oom");
            free(a), free(b2), free(y);
            continue;
        }
        uint64_t st = 7;
        T_CHECK(quant_fill_random(type, a, nblk, &st) == G5_OK, "%s fill", t->name);
        memcpy(b2, a, nblk * t->block_bytes);
        T_CHECK(quant_centre_blocks(type, b2, nblk) == G5_OK, "%s centre", t->name);
        const int mins = type == QT_Q2_K || type == QT_Q4_K || type == QT_Q5_K;
        if (!mins) {
            T_CHECK(memcmp(a, b2, nblk * t->block_bytes) == 0, "%s: centring leaves it as it was", t->name);
        } else {
            double m[2], r[2];
            for (int v = 0; v < 2; v++) {
                T_CHECK(quant_dequantize(type, v ? b2 : a, n, y) == G5_OK, "%s dequantize", t->name);
                double sum = 0, sumsq = 0;
                int bad = 0;
                for (uint64_t i = 0; i < n; i++) {
                    bad |= !isfinite(y[i]);
                    sum += y[i];
                    sumsq += (double)y[i] * y[i];
                }
                T_CHECK(!bad, "%s: finite values", t->name);
                m[v] = sum / (double)n;
                r[v] = sqrt(sumsq / (double)n);
            }
            T_CHECK(m[0] >= 0.2 * r[0], "%s as filled: mean %.3g, rms %.3g (biased)", t->name, m[0], r[0]);
            T_CHECK(fabs(m[1]) <= 0.02 * r[1], "%s centred: mean %.3g, rms %.3g", t->name, m[1], r[1]);
            /* only dmin and the mins change: the d and the quants stay */
            const uint64_t qs = 16, qe = type == QT_Q2_K ? 80 : t->block_bytes; /* the quants */
            int same = 1;
            for (uint64_t b = 0; b < nblk; b++) {
                const uint8_t *pa = a + b * t->block_bytes, *pb = b2 + b * t->block_bytes;
                same &= memcmp(pa + qs, pb + qs, qe - qs) == 0;
                same &= type == QT_Q2_K ? memcmp(pa + 80, pb + 80, 2) == 0 : memcmp(pa, pb, 2) == 0;
            }
            T_CHECK(same, "%s: d and the quants unchanged", t->name);
        }
        free(a), free(b2), free(y);
    }
    uint8_t blk[256];
    T_CHECK(quant_centre_blocks(64, blk, 1) == G5_ERR_TENSOR_TYPE, "centre: unknown type refused");
    T_CHECK(quant_centre_blocks(QT_Q4_K, NULL, 1) == G5_ERR_INVALID_ARG, "centre: NULL refused");
}

/* Every type against gguf-py: tests/data/quant_fixture.bin (tests/data/gen_quant_fixture.py)
 * holds random blocks with extreme scales and the float32 values gguf-py's quants module gives;
 * ours must be the same bits. Every supported block type must be in the fixture. */
static void test_gguf_py_fixture(void) {
    size_t len = 0;
    uint8_t *buf = t_read_file("tests/data/quant_fixture.bin", &len);
    T_CHECK(buf != NULL, "cannot read tests/data/quant_fixture.bin");
    if (!buf) return;
    T_CHECK(len >= 12 && memcmp(buf, "G5QFIX1", 8) == 0, "fixture magic");
    const uint32_t n_cases = len >= 12 ? (uint32_t)(buf[8] | buf[9] << 8 | buf[10] << 16 | (uint32_t)buf[11] << 24) : 0;
    int seen[QT_TYPE_LIMIT] = {0};
    size_t off = 12, n_vals = 0;
    for (uint32_t c = 0; c < n_cases; c++) {
        if (off + 8 > len) {
            T_CHECK(0, "fixture truncated at case %u", c);
            break;
        }
        const uint32_t type = (uint32_t)(buf[off] | buf[off + 1] << 8 | buf[off + 2] << 16 | (uint32_t)buf[off + 3] << 24);
        const uint32_t nb = (uint32_t)(buf[off + 4] | buf[off + 5] << 8 | buf[off + 6] << 16 | (uint32_t)buf[off + 7] << 24);
        off += 8;
        const quant_type_info *t = quant_type_get(type);
        T_CHECK(t != NULL && t->supported, "fixture type %u is not supported", type);
        if (!t) break;
        const size_t raw = (size_t)nb * t->block_bytes, n = (size_t)nb * t->block_elems;
        if (off + raw + 4 * n > len) {
            T_CHECK(0, "fixture truncated in %s", t->name);
            break;
        }
        float *y = malloc(n * sizeof *y);
        if (!y) break;
        T_CHECK(quant_dequantize(type, buf + off, n, y) == G5_OK, "%s: dequantize", t->name);
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < n; i++) {
            uint32_t got, want = (uint32_t)(buf[off + raw + 4 * i] | buf[off + raw + 4 * i + 1] << 8 |
                                             buf[off + raw + 4 * i + 2] << 16 |
                                             (uint32_t)buf[off + raw + 4 * i + 3] << 24);
            memcpy(&got, &y[i], 4);
            if (got != want && !bad++) first = i;
        }
        T_CHECK(bad == 0, "%s: %zu of %zu values differ from gguf-py (first at %zu, block %zu)",
                t->name, bad, n, first, first / t->block_elems);
        seen[type] = 1;
        n_vals += n;
        off += raw + 4 * n;
        free(y);
    }
    T_CHECK(off == len, "fixture has %zu trailing bytes", len - off);
    for (uint32_t type = 0; type < QT_TYPE_LIMIT; type++) {
        const quant_type_info *t = quant_type_get(type);
        if (t && t->supported && type != QT_F32)
            T_CHECK(seen[type], "%s is missing from the fixture", t->name);
    }
    printf("gguf-py fixture: %u types, %zu values compared\n", n_cases, n_vals);
    free(buf);
}

int main(void) {
    test_type_table();
    test_row_bytes();
    test_refusals();
    test_f16();
    test_bf16();
    test_fixed_blocks();
    test_hand_built();
    test_quantize();
    test_fill_random();
    test_centre();
    test_gguf_py_fixture();
    return t_report("test_quant");
}
