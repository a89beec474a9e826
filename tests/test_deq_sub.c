/* cuda/deq_sub.h (the element-parallel sub-block decoder of the GPU's 16-bit weight tiles) on the
 * CPU against format/quant.c's quant_dequantize, bit for bit (NaN for NaN), for every block type
 * it decodes: random blocks from quant_fill_random and blocks of random bytes (NaN, infinite and
 * subnormal half scales included), every sub-block of each. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/deq_sub.h"
#include "format/quant.h"
#include "tests/test_util.h"

static uint64_t rs = 0x5eed0deadbeefull;
static uint32_t rnd32(void) {
    rs ^= rs >> 12;
    rs ^= rs << 25;
    rs ^= rs >> 27;
    return (uint32_t)((rs * 0x2545f4914f6cdd1dull) >> 32);
}

static int same(float a, float b) {
    uint32_t x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    return x == y || (a != a && b != b);
}

static void check_type(uint32_t type) {
    const quant_type_info *ti = quant_type_get(type);
    const int nb = 512, be = (int)ti->block_elems, bb = (int)ti->block_bytes;
    uint8_t *blk = malloc((size_t)nb * bb);
    float *ref = malloc((size_t)nb * be * 4), y[32];
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 0) T_CHECK(quant_fill_random(type, blk, nb, &rs) == G5_OK, "%s: fill", ti->name);
        else
            for (int i = 0; i < nb * bb; i++) blk[i] = (uint8_t)rnd32();
        T_CHECK(quant_dequantize(type, blk, (uint64_t)nb * be, ref) == G5_OK, "%s: dequantize", ti->name);
        int bad = 0, first = -1, ok = 1;
        for (int b = 0; b < nb; b++)
            for (int s = 0; s < be / 32; s++) {
                ok &= deq_sub(type, blk + (size_t)b * bb, s, y);
                for (int l = 0; l < 32; l++)
                    if (!same(y[l], ref[(size_t)b * be + s * 32 + l])) {
                        if (first < 0) first = b * be + s * 32 + l;
                        bad++;
                    }
            }
        T_CHECK(ok, "%s: decoded", ti->name);
        T_CHECK(bad == 0, "%s (%s blocks): %d of %d elements differ, first at %d", ti->name,
                pass ? "random-byte" : "random", bad, nb * be, first);
    }
    free(blk), free(ref);
}

/* deq_row32 over rows of 512 elements (two of them for NVFP4's 64, 16 of Q4_0's 32), every
 * 32-element piece, against quant_dequantize; its block geometry against format's type table. */
static void check_row32(uint32_t type) {
    const quant_type_info *ti = quant_type_get(type);
    int be = -1;
    const int bb = dqs_block_bytes(type, &be);
    T_CHECK(ti && bb == (int)ti->block_bytes && be == (int)ti->block_elems, "%s: block geometry %d/%d",
            ti ? ti->name : "?", bb, be);
    if (!ti || bb != (int)ti->block_bytes || be != (int)ti->block_elems) return;
    const int64_t k = 512, rows = 24, nb = rows * k / be;
    uint8_t *w = malloc((size_t)(nb * bb));
    float *ref = malloc((size_t)(rows * k) * 4), y[32];
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 0 && be > 1) T_CHECK(quant_fill_random(type, w, (uint64_t)nb, &rs) == G5_OK, "%s: fill", ti->name);
        else
            for (int64_t i = 0; i < nb * bb; i++) w[i] = (uint8_t)rnd32();
        T_CHECK(quant_dequantize(type, w, (uint64_t)(rows * k), ref) == G5_OK, "%s: dequantize", ti->name);
        int64_t bad = 0, ok = 1;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < k / 32; j++) {
                ok &= deq_row32(type, w + r * (k / be) * bb, j, y);
                for (int l = 0; l < 32; l++) bad += !same(y[l], ref[r * k + 32 * j + l]);
            }
        T_CHECK(ok && bad == 0, "%s (%s): deq_row32: %lld of %lld elements differ", ti->name,
                pass ? "random bytes" : "random blocks", (long long)bad, (long long)(rows * k));
    }
    free(w), free(ref);
}

int main(void) {
    static const uint32_t types[] = {QT_Q4_0, QT_Q4_1, QT_Q5_0,  QT_Q5_1,  QT_Q8_0,
                                     QT_IQ4_NL, QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_IQ4_XS};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) check_type(types[i]);
    float y[32];
    T_CHECK(!deq_sub(QT_F32, (const uint8_t *)y, 0, y) && !deq_sub_handles(QT_F32), "F32 is not a block type here");
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        T_CHECK(deq_sub_handles(types[i]), "type %u handled", types[i]);
    /* every weight type the converter carries: the ones of 32-multiple blocks and the floats */
    static const uint32_t row_types[] = {QT_F32,    QT_F16,     QT_BF16,  QT_Q4_0,   QT_Q4_1,   QT_Q5_0,
                                         QT_Q5_1,   QT_Q8_0,    QT_Q2_K,  QT_Q3_K,   QT_Q4_K,   QT_Q5_K,
                                         QT_Q6_K,   QT_IQ2_XXS, QT_IQ2_XS, QT_IQ3_XXS, QT_IQ1_S, QT_IQ4_NL,
                                         QT_IQ3_S,  QT_IQ2_S,   QT_IQ4_XS, QT_IQ1_M,  QT_TQ1_0,  QT_TQ2_0,
                                         QT_MXFP4,  QT_NVFP4};
    for (size_t i = 0; i < sizeof row_types / sizeof row_types[0]; i++) check_row32(row_types[i]);
    int be;
    memset(y, 0, sizeof y);
    T_CHECK(!dqs_block_bytes(QT_Q8_1, &be) && !dqs_block_bytes(QT_Q8_K, &be) && !deq_row32(QT_Q8_K, (const uint8_t *)y, 0, y),
            "types outside the weight set are not decoded");
    return t_report("test_deq_sub");
}
