/* The GEMV kernels' block decoders (cuda/gemv_impl.cuh: dec, run_offsets, run_b, k4_half), run on the
 * CPU against quant_dequantize: for every type and every 8-element group of random blocks, the
 * effective weights implied by the decoded values and scales must equal the CPU dequantizer's
 * (exactly for float and signed types, to float rounding of the folded offset for affine ones),
 * and the groups' runs must cover each element of a block exactly once. Needs nvcc, no GPU. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cuda/gemv_impl.cuh"

extern "C" {
#include "tests/test_util.h"
}

using namespace cuk;

template <int T> static void check_type() {
    using Q = Tr<T>;
    const quant_type_info *ti = quant_type_get(T);
    const int nblk = 48;
    const int bb = T == QT_F32 || T == QT_F16 || T == QT_BF16 ? Q::BB : (int)ti->block_bytes;
    T_CHECK(bb == Q::BB, "%s: block bytes %d vs the kernel's %d", ti->name, bb, Q::BB);
    const int blk_elems = Q::BLK;
    alignas(16) static uint8_t raw[48 * 256 * 4 + 64];
    static float ref[48 * 256];
    static float tab[16];
    for (int i = 0; i < 16; i++) tab[i] = c_iq4_host[i];
    uint64_t st = 0x1234 + T;
    const uint64_t n_elems = (uint64_t)nblk * blk_elems;
    /* Blocks at the offsets the device sees: even, a multiple of 4 when BB is, of 16 for the
     * float types (whose rows are multiples of 16 bytes). */
    const int offs[3] = {0, Q::KIND == K_FLOAT ? 16 : Q::BB % 4 ? 2 : 4,
                         Q::KIND == K_FLOAT ? 32 : Q::BB % 4 ? 6 : 12};
    for (int oi = 0; oi < 3; oi++) {
        uint8_t *w = raw + offs[oi];
        const uint64_t fill_blocks = n_elems / ti->block_elems;
        T_CHECK(quant_fill_random(T, w, fill_blocks, &st) == G5_OK, "%s: fill", ti->name);
        T_CHECK(quant_dequantize(T, w, n_elems, ref) == G5_OK, "%s: dequantize", ti->name);
        int bad = 0, cover_bad = 0;
        double worst = 0;
        for (int b = 0; b < nblk; b++) {
            const uint8_t *bp = w + (size_t)b * Q::BB;
            float2 cs[8];
            if (Q::COOP) {
                k4_half(bp, 0, cs);
                k4_half(bp, 1, cs + 4);
            }
            int hits[256] = {0};
            for (int gi = 0; gi < Q::BLK / 8; gi++) {
                float f[8], s[4] = {0, 0, 0, 0};
                int ea, eb;
                run_offsets<T>(gi, ea, eb);
                if (eb - ea != run_b<T>()) cover_bad++;
                dec<T>(bp, gi, cs, tab, f, s);
                for (int i = 0; i < 8; i++) {
                    const int e = (i < 4 ? ea : eb) + (i & 3);
                    if (e < 0 || e >= blk_elems) {
                        cover_bad++;
                        continue;
                    }
                    hits[e]++;
                    const double r = ref[(size_t)b * blk_elems + e];
                    const double a = i < 4 ? s[0] : s[2], bo = i < 4 ? s[1] : s[3];
                    double got;
                    int ok;
                    if (Q::KIND == K_FLOAT) {
                        got = f[i];
                        ok = got == r;
                    } else if (Q::KIND == K_SIGNED) {
                        got = (float)(a * f[i]);
                        ok = got == r;
                    } else {
                        got = a * f[i] - bo; /* a*f exact in double; bo rounded once in float */
                        const double tol = 1.2e-7 * (fabs(bo) + fabs(r)) + 1e-30;
                        ok = fabs(got - r) <= tol;
                        if (fabs(got - r) / (fabs(bo) + fabs(r) + 1e-30) > worst)
                            worst = fabs(got - r) / (fabs(bo) + fabs(r) + 1e-30);
                    }
                    if (!ok && bad++ < 5)
                        printf("  %s block %d group %d elem %d: got %.9g want %.9g\n", ti->name, b,
                               gi, e, got, r);
                }
            }
            for (int e = 0; e < blk_elems; e++) cover_bad += hits[e] != 1;
        }
        T_CHECK(bad == 0, "%s (offset %d): %d decoded weights differ from quant_dequantize",
                ti->name, offs[oi], bad);
        T_CHECK(cover_bad == 0, "%s: groups do not cover each element once (%d)", ti->name, cover_bad);
        if (oi == 0) printf("  %-6s decode ok=%d worst rel %.2e\n", ti->name, bad == 0, worst);
    }
}

int main(void) {
    check_type<QT_F32>();
    check_type<QT_F16>();
    check_type<QT_BF16>();
    check_type<QT_Q8_0>();
    check_type<QT_Q4_0>();
    check_type<QT_Q4_1>();
    check_type<QT_Q5_0>();
    check_type<QT_Q5_1>();
    check_type<QT_IQ4_NL>();
    check_type<QT_Q4_K>();
    check_type<QT_Q5_K>();
    check_type<QT_Q6_K>();
    check_type<QT_IQ4_XS>();
    return t_report("test_decode");
}
