/* The fp16 decode of Q4_K / Q5_K blocks that fast prefill's expert kernel makes in registers
 * (cuda/moe_mm.cu raw_decode), emulated bit for bit on the host for tests/gpu/test_moe_mm (and
 * for any kernel that takes that decode): per sub-block sb, dd = fp16(d sc) and nm = fp16(-(dmin
 * m)) (d sc and dmin m exact in float32: an fp16 times a 6-bit integer), each element fp16(q dd +
 * nm) with one rounding (hfma2). Include format/quant.h first. */
#ifndef G5_TESTS_K4_H16_H
#define G5_TESTS_K4_H16_H

#include <math.h>
#include <stdint.h>

/* x rounded to the nearest fp16 (ties to even), from the exact double: no float32 step between */
static inline float t_f16_rne(double x) {
    if (x == 0 || !isfinite(x)) return (float)x;
    int ex = 0;
    (void)frexp(fabs(x), &ex); /* |x| = m 2^ex, m in [0.5, 1) */
    const int lead = ex - 1 < -14 ? -14 : ex - 1;
    const double ulp = ldexp(1.0, lead - 10), r = nearbyint(x / ulp) * ulp;
    return quant_f16_to_f32(quant_f32_to_f16((float)r)); /* r is an fp16 value (or overflows) */
}

/* One block b of type t (QT_Q4_K or QT_Q5_K) -> y [256] in ggml element order, as fp16 values */
static inline void t_k4_decode_h16(uint32_t t, const uint8_t *b, float *y) {
    const float d = quant_f16_to_f32((uint16_t)(b[0] | b[1] << 8)), mn = quant_f16_to_f32((uint16_t)(b[2] | b[3] << 8));
    const uint8_t *sc = b + 4, *qh = b + 16, *qs = b + (t == QT_Q5_K ? 48 : 16);
    for (int sb = 0; sb < 8; sb++) {
        uint8_t sv, mv;
        quant_k4_scale_min(sb, sc, &sv, &mv);
        const double dd = quant_f16_to_f32(quant_f32_to_f16(d * (float)sv));
        const double nm = quant_f16_to_f32(quant_f32_to_f16(-(mn * (float)mv)));
        for (int l = 0; l < 32; l++) {
            int v = (sb & 1) ? qs[32 * (sb / 2) + l] >> 4 : qs[32 * (sb / 2) + l] & 0xf;
            if (t == QT_Q5_K && (qh[l] >> sb & 1)) v += 16;
            y[32 * sb + l] = t_f16_rne(v * dd + nm);
        }
    }
}

#endif
