/* cuda/deq_sub.h (the element-parallel sub-block decoder of the GPU's 16-bit weight tiles) on the
 * CPU against format/quant.c's quant_dequantize, bit for bit (NaN for NaN), for every block type
 * it decodes: random blocks from quant_fill_random and blocks of random bytes (NaN, infinite and
 * subnormal half scales included), every sub-block of each; and deq_sub_i8's exact int8 form
 * (scale times integer, one rounded product) against the same values. */
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
        /* the exact int8 form: dqs_mul(sc, q) is the dequantized element, or the type has none */
        const int i8 = type != QT_Q4_1 && type != QT_Q5_1 && type != QT_Q4_K && type != QT_Q5_K;
        T_CHECK(quant_exact_i8(type) == i8, "%s: quant_exact_i8 says %d", ti->name, quant_exact_i8(type));
        int8_t q[32];
        float sc[2];
        bad = 0, first = -1, ok = 1;
        for (int b = 0; b < nb; b++)
            for (int s = 0; s < be / 32; s++) {
                const int got = deq_sub_i8(type, blk + (size_t)b * bb, s, sc, q);
                ok &= got == i8;
                if (!got) continue;
                for (int l = 0; l < 32; l++)
                    if (!same(dqs_mul(sc[l / 16], (float)q[l]), ref[(size_t)b * be + s * 32 + l])) {
                        if (first < 0) first = b * be + s * 32 + l;
                        bad++;
                    }
            }
        T_CHECK(ok, "%s: int8 form %s", ti->name, i8 ? "given" : "refused");
        T_CHECK(bad == 0, "%s (%s blocks): int8 form, %d of %d elements differ, first at %d", ti->name,
                pass ? "random-byte" : "random", bad, nb * be, first);
    }
    free(blk), free(ref);
}

int main(void) {
    static const uint32_t types[] = {QT_Q4_0, QT_Q4_1, QT_Q5_0,  QT_Q5_1,  QT_Q8_0,
                                     QT_IQ4_NL, QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_IQ4_XS};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) check_type(types[i]);
    float y[32];
    T_CHECK(!deq_sub(QT_F32, (const uint8_t *)y, 0, y) && !deq_sub_handles(QT_F32), "F32 is not a block type here");
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        T_CHECK(deq_sub_handles(types[i]), "type %u handled", types[i]);
    return t_report("test_deq_sub");
}
