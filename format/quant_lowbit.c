/* The low-bit types on the CPU: blocks dequantized through format/quant_blocks.h's group
 * decoders (the code the GPU runs too), and random valid blocks for synth. */
#include "quant.h"
#include "quant_blocks.h"
#include "quant_int.h"

g5_status quant_lowbit_dequant(uint32_t type, const uint8_t *src, uint64_t nb, float *dst) {
    const quant_type_info *t = quant_type_get(type);
    if (!t || !qb_handles(type) || t->block_elems != (uint32_t)qb_block_elems(type))
        return G5_ERR_INTERNAL;
    for (uint64_t i = 0; i < nb; i++)
        qb_dequant_block(type, src + i * t->block_bytes, dst + i * t->block_elems);
    return G5_OK;
}

static void put_half(uint8_t *p, float v) { g5_wr_u16(p, quant_f32_to_f16(v)); }

/* Scale ranges: the largest |value| of each type is about 1, e.g. IQ2_XXS 43 * 15.5/4 * d. */
int quant_lowbit_fill(uint32_t type, uint8_t *b, uint64_t *rng) {
    switch (type) {
    case QT_IQ2_XXS: case QT_IQ2_XS: case QT_IQ2_S:
        put_half(b, quant_rng_uniform(rng, 0.001f, 0.005f));
        return 1;
    case QT_IQ3_XXS: case QT_IQ3_S:
        put_half(b, quant_rng_uniform(rng, 0.0004f, 0.0018f));
        return 1;
    case QT_IQ1_S:
        put_half(b, quant_rng_uniform(rng, 0.01f, 0.05f));
        return 1;
    case QT_IQ1_M: { /* the fp16 d lives in the top nibbles of the four scale words */
        const uint32_t h = quant_f32_to_f16(quant_rng_uniform(rng, 0.01f, 0.05f));
        for (int k = 0; k < 4; k++) {
            uint8_t *p = b + 48 + 2 * k;
            const uint32_t w = (g5_rd_u16(p) & 0x0FFFu) | (((h >> (4 * k)) & 0xFu) << 12);
            g5_wr_u16(p, (uint16_t)w);
        }
        return 1;
    }
    case QT_TQ1_0: put_half(b + 52, quant_rng_uniform(rng, 0.02f, 0.1f)); return 1;
    case QT_TQ2_0: put_half(b + 64, quant_rng_uniform(rng, 0.02f, 0.1f)); return 1;
    case QT_MXFP4: /* d = 2^(e - 128) in [2^-10, 2^-4] */
        b[0] = (uint8_t)(118 + (int)quant_rng_uniform(rng, 0.0f, 6.99f));
        return 1;
    case QT_NVFP4: /* UE4M3 exponent 1..3: d = (8 + m) 2^(e - 11) */
        for (int k = 0; k < 4; k++)
            b[k] = (uint8_t)(((1 + (int)quant_rng_uniform(rng, 0.0f, 2.99f)) << 3) | (b[k] & 7));
        return 1;
    default: return 0;
    }
}
