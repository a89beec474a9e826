/* cuk_moe_mm (cuda/moe_mm.cu), fast mode's MoE prefill products with the weights decoded inside
 * the tile, against a float64 host reference built from the same inputs: the weights decoded as
 * the kernel decodes them (its half2 arithmetic emulated exactly; that decode itself is checked
 * against quant_dequantize, within 2^-9 of each sub-block's largest value), fp16 inputs. For the types
 * the kernel takes (Q4_K, Q5_K; the others are refused and run the dequantized-copy path): gate+up with SwiGLU to fp16 and the single product to float32, on expert
 * counts that exercise empty experts, one row, a full tile, a tile plus one, several tiles, more
 * than 256 experts (the tile scan's second chunk), tiles of 16, 32 and more rows (the kernel's
 * two forms: wa_tile up to 32 rows, mm_tile above) and an output width that is not a multiple of the 128-column
 * tile. Output padding (ldo > n) is poisoned and must stay untouched; every row
 * must be written. Bounds: fp16 outputs within one fp16 rounding of the float64 value (plus 1e-4
 * absolute: float32 sums), float32 outputs rel L2 <= 1e-5 per case; a wrong row, column or
 * expert gives O(1). Runs on the device only. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuk.h"
#include "cuda/cuk_prefill.h"
#include "format/quant.h"
#include "tests/test_util.h"

#define G5_TEST_NAME "test_moe_mm"
#define G5_TEST_SEED 0x3e3a11ull
#include "tests/gpu/gpu_test_util.h"

static const uint32_t TYPES[] = {QT_Q4_K, QT_Q5_K};
#define N_TYPES (sizeof TYPES / sizeof TYPES[0])

typedef struct mcase {
    const char *name;
    int n_local, k, n;
    const int *cnt; /* NULL: counts 0 except the last expert, 70 rows */
} mcase;

static const int CNT_A[] = {0, 1, 64, 65, 130};
static const int CNT_B[] = {3, 0, 0, 17};
static const int CNT_D[] = {150};
static const int CNT_E[] = {16, 32, 33, 48, 97}; /* the kernel's two tile forms: <= 32 rows, more */

static uint64_t rbytes(uint32_t t, int64_t k) {
    uint64_t rb = 0;
    if (quant_row_bytes(t, (uint64_t)k, &rb)) {
        printf("FAIL: quant_row_bytes(%s, %lld)\n", quant_type_name(t), (long long)k);
        exit(2);
    }
    return rb;
}

/* x rounded to the nearest fp16 (ties to even), from the exact double: no float32 step between */
static float f16_rne(double x) {
    if (x == 0 || !isfinite(x)) return (float)x;
    int ex = 0;
    (void)frexp(fabs(x), &ex); /* |x| = m 2^ex, m in [0.5, 1) */
    const int lead = ex - 1 < -14 ? -14 : ex - 1;
    const double ulp = ldexp(1.0, lead - 10), r = nearbyint(x / ulp) * ulp;
    return quant_f16_to_f32(quant_f32_to_f16((float)r)); /* r is an fp16 value (or overflows) */
}

static float f32_mul(float a, float b) {
    volatile float r = a * b;
    return r;
}

/* The kernel's decode of one Q4_K / Q5_K block (cuda/moe_mm.cu raw_decode): per sub-block sb,
 * dd = fp16(d * sc), nm = fp16(-(dmin * m)), element = fp16(v * dd + nm) with one rounding. */
static void kdecode(uint32_t t, const uint8_t *b, float *y) {
    const float d = quant_f16_to_f32((uint16_t)(b[0] | b[1] << 8)), mn = quant_f16_to_f32((uint16_t)(b[2] | b[3] << 8));
    const uint8_t *sc = b + 4, *qh = b + 16, *qs = b + (t == QT_Q5_K ? 48 : 16);
    for (int sb = 0; sb < 8; sb++) {
        uint8_t sv, mv;
        quant_k4_scale_min(sb, sc, &sv, &mv);
        const double dd = quant_f16_to_f32(quant_f32_to_f16(f32_mul(d, (float)sv)));
        const double nm = quant_f16_to_f32(quant_f32_to_f16(-f32_mul(mn, (float)mv)));
        for (int l = 0; l < 32; l++) {
            int v = (sb & 1) ? qs[32 * (sb / 2) + l] >> 4 : qs[32 * (sb / 2) + l] & 0xf;
            if (t == QT_Q5_K && (qh[l] >> sb & 1)) v += 16;
            y[32 * sb + l] = f16_rne(v * dd + nm);
        }
    }
}

/* w: [rows][k] blocks of t -> wf [rows][k]: the fp16 values the kernel multiplies */
static void decode16(uint32_t t, const uint8_t *w, int64_t rows, int64_t k, float *wf) {
    const uint64_t rb = rbytes(t, k), bb = quant_type_get(t)->block_bytes;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < k / 256; j++) kdecode(t, w + r * rb + j * bb, wf + r * k + j * 256);
}

/* The kernel's decode against format/quant.c's exact float32 one, per element: within 2^-9 of
 * the sub-block's largest magnitude M (each of fp16(d sc) v <= 2 M, fp16(dmin m) <= M and the
 * result <= M carries at most 2^-11 relative rounding), plus 2^-24 for fp16 subnormals. */
static void check_decode(uint32_t t) {
    enum { NB = 512 };
    const quant_type_info *ti = quant_type_get(t);
    uint8_t *w = xmalloc((size_t)NB * ti->block_bytes);
    float *a = xmalloc(NB * 256 * 4), *b = xmalloc(NB * 256 * 4);
    uint64_t st = rnd();
    if (quant_fill_random(t, w, NB, &st) || quant_dequantize(t, w, NB * 256, a)) {
        printf("FAIL: random %s blocks\n", ti->name);
        exit(2);
    }
    for (int i = 0; i < NB; i++) kdecode(t, w + (size_t)i * ti->block_bytes, b + i * 256);
    int bad = 0;
    for (int s = 0; s < NB * 8; s++) {
        float mx = 0;
        for (int l = 0; l < 32; l++) mx = fmaxf(mx, fabsf(a[32 * s + l]));
        for (int l = 0; l < 32; l++) bad += !(fabsf(a[32 * s + l] - b[32 * s + l]) <= mx * (1.0f / 512) + 6e-8f);
    }
    T_CHECK(bad == 0, "%s: %d elements of the half2 decode off the exact one by more than 2^-9 of their sub-block", ti->name, bad);
    free(w);
    free(a);
    free(b);
}

static void run_case(uint32_t t, const mcase *c) {
    const int NL = c->n_local, k = c->k, n = c->n, ldo = n + 8;
    int *cnt = xmalloc((size_t)NL * sizeof *cnt);
    int tot = 0, tiles = 0;
    for (int e = 0; e < NL; e++) {
        cnt[e] = c->cnt ? c->cnt[e] : e == NL - 1 ? 70 : 0;
        tot += cnt[e];
        tiles += (cnt[e] + CUK_MOE_MM_BM - 1) / CUK_MOE_MM_BM;
    }
    const uint64_t rb = rbytes(t, k), wbytes = (uint64_t)NL * n * rb;
    const quant_type_info *ti = quant_type_get(t);
    uint8_t *hw[2];
    float *wf[2];
    for (int m = 0; m < 2; m++) {
        hw[m] = xmalloc(wbytes);
        uint64_t st = rnd();
        if (quant_fill_random(t, hw[m], wbytes / ti->block_bytes, &st) != G5_OK) {
            printf("FAIL: quant_fill_random(%s)\n", ti->name);
            exit(2);
        }
        wf[m] = xmalloc((size_t)NL * n * k * sizeof(float));
        decode16(t, hw[m], (int64_t)NL * n, k, wf[m]);
    }
    uint16_t *hx = xmalloc((size_t)tot * k * 2);
    for (int64_t i = 0; i < (int64_t)tot * k; i++) hx[i] = quant_f32_to_f16(unif(-1, 1));
    void *dw0 = dup_d(hw[0], wbytes), *dw1 = dup_d(hw[1], wbytes), *dx = dup_d(hx, (size_t)tot * k * 2);
    void *dcnt = dup_d(cnt, (size_t)NL * 4);
    const size_t ob16 = (size_t)tot * ldo * 2, ob32 = (size_t)tot * ldo * 4;
    void *dh = dalloc(ob16), *dd = dalloc(ob32);
    CK(cudaMemset(dh, 0xff, ob16)); /* fp16 NaN poison */
    CK(cudaMemset(dd, 0xff, ob32)); /* float32 NaN poison */
    g5_error err = {0};
    const cuk_moe_mm_args gu = {t, dw0, dw1, k, n, dx, dcnt, NL, tiles, dh, ldo};
    const cuk_moe_mm_args dn = {t, dw0, NULL, k, n, dx, dcnt, NL, tiles, dd, ldo};
    const g5_status s1 = cuk_moe_mm(&gu, NULL, &err), s2 = s1 ? s1 : cuk_moe_mm(&dn, NULL, &err);
    T_CHECK(s1 == G5_OK && s2 == G5_OK, "%s %s: launch (%s)", ti->name, c->name, err.msg);
    uint16_t *oh = xmalloc(ob16);
    float *od = xmalloc(ob32);
    get(oh, dh, ob16);
    get(od, dd, ob32);
    int bad_h = 0, pad = 0;
    double e2 = 0, r2 = 0, worst = 0;
    int row = 0;
    for (int e = 0; e < NL; e++)
        for (int i = 0; i < cnt[e]; i++, row++) {
            for (int col = 0; col < ldo; col++) {
                const uint16_t gh = oh[(int64_t)row * ldo + col];
                const float gd = od[(int64_t)row * ldo + col];
                if (col >= n) {
                    pad += gh != 0xffff || !isnan(gd);
                    continue;
                }
                double g = 0, u = 0;
                const float *w0 = wf[0] + ((int64_t)e * n + col) * k, *w1 = wf[1] + ((int64_t)e * n + col) * k;
                const uint16_t *xr = hx + (int64_t)row * k;
                for (int j = 0; j < k; j++) {
                    const double xv = quant_f16_to_f32(xr[j]);
                    g += (double)w0[j] * xv;
                    u += (double)w1[j] * xv;
                }
                const double h = g / (1.0 + exp(-g)) * u, hg = quant_f16_to_f32(gh);
                if (!(fabs(hg - h) <= fabs(h) * (1.0 / 1024) + 1e-4)) {
                    if (bad_h < 3) printf("  %s %s: h[%d][%d] = %.6g, want %.6g\n", ti->name, c->name, row, col, hg, h);
                    bad_h++;
                }
                const double d = (double)gd - g;
                e2 += d * d;
                r2 += g * g;
                if (!(fabs(d) <= worst)) worst = isnan(d) ? INFINITY : fabs(d);
            }
        }
    const double rel = r2 > 0 ? sqrt(e2 / r2) : sqrt(e2);
    T_CHECK(bad_h == 0, "%s %s: gate_up %d of %d elements off by more than one fp16 rounding", ti->name, c->name,
            bad_h, tot * n);
    T_CHECK(rel <= 1e-5, "%s %s: product rel L2 %.3g (worst |d| %.3g)", ti->name, c->name, rel, worst);
    T_CHECK(pad == 0, "%s %s: %d padding elements written", ti->name, c->name, pad);
    printf("moe_mm %s %s: rows %d, tiles %d, product rel L2 %.3g\n", ti->name, c->name, tot, tiles, rel);
    cudaFree(dw0);
    cudaFree(dw1);
    cudaFree(dx);
    cudaFree(dcnt);
    cudaFree(dh);
    cudaFree(dd);
    for (int m = 0; m < 2; m++) {
        free(hw[m]);
        free(wf[m]);
    }
    free(hx);
    free(oh);
    free(od);
    free(cnt);
}

/* A row's bits within each of the kernel's two forms do not depend on the tile's row count: the
 * first rows of one expert as tiles of 32, 16 and 1 rows (wa_tile) alike, and as tiles of 64 and 33
 * rows (mm_tile) alike. (Across the forms, 32 against 33 rows, the k order differs: cuda/moe_mm.cu.) */
static void check_layouts(uint32_t t) {
    enum { K = 512, N = 136, R = 64, NV = 5 };
    const quant_type_info *ti = quant_type_get(t);
    const uint64_t wbytes = (uint64_t)N * rbytes(t, K);
    uint8_t *hw = xmalloc(wbytes);
    uint64_t st = rnd();
    if (quant_fill_random(t, hw, wbytes / ti->block_bytes, &st) != G5_OK) {
        printf("FAIL: quant_fill_random(%s)\n", ti->name);
        exit(2);
    }
    uint16_t *hx = xmalloc((size_t)R * K * 2);
    for (int i = 0; i < R * K; i++) hx[i] = quant_f32_to_f16(unif(-1, 1));
    void *dw = dup_d(hw, wbytes), *dx = dup_d(hx, (size_t)R * K * 2);
    /* rows[v] compared with rows[ref[v]] over rows[v] rows */
    const int rows[NV] = {32, 16, 1, 64, 33}, ref[NV] = {0, 0, 0, 3, 3};
    uint16_t *oh[NV];
    float *od[NV];
    g5_error err = {0};
    for (int v = 0; v < NV; v++) {
        void *dc = dup_d(&rows[v], 4), *dh = dalloc((size_t)R * N * 2), *dd = dalloc((size_t)R * N * 4);
        const cuk_moe_mm_args gu = {t, dw, dw, K, N, dx, dc, 1, 1, dh, N};
        const cuk_moe_mm_args dn = {t, dw, NULL, K, N, dx, dc, 1, 1, dd, N};
        T_CHECK(cuk_moe_mm(&gu, NULL, &err) == G5_OK && cuk_moe_mm(&dn, NULL, &err) == G5_OK, "%s layouts: launch (%s)",
                ti->name, err.msg);
        oh[v] = xmalloc((size_t)R * N * 2);
        od[v] = xmalloc((size_t)R * N * 4);
        get(oh[v], dh, (size_t)R * N * 2);
        get(od[v], dd, (size_t)R * N * 4);
        cudaFree(dc);
        cudaFree(dh);
        cudaFree(dd);
    }
    for (int v = 0; v < NV; v++) {
        if (ref[v] == v) continue;
        const size_t n_el = (size_t)rows[v] * N;
        T_CHECK(!memcmp(oh[ref[v]], oh[v], n_el * 2) && !memcmp(od[ref[v]], od[v], n_el * 4),
                "%s: the first %d rows as a tile of %d rows equal to a tile of %d", ti->name, rows[v], rows[v],
                rows[ref[v]]);
    }
    for (int v = 0; v < NV; v++) {
        free(oh[v]);
        free(od[v]);
    }
    free(hx);
    free(hw);
    cudaFree(dw);
    cudaFree(dx);
}

static void check_refusals(void) {
    g5_error err = {0};
    int dummy_cnt = 1;
    void *d = dalloc(1 << 20), *dc = dup_d(&dummy_cnt, 4);
    const cuk_moe_mm_args ok = {QT_Q4_K, d, NULL, 256, 128, d, dc, 1, 1, d, 128};
    cuk_moe_mm_args a = ok;
    a.w_type = QT_Q2_K;
    T_CHECK(cuk_moe_mm(&a, NULL, &err) == G5_ERR_INVALID_ARG && strstr(err.msg, "Q2_K"), "Q2_K refused by name: %s",
            err.msg);
    a = ok;
    a.k = 384;
    T_CHECK(cuk_moe_mm(&a, NULL, &err) == G5_ERR_INVALID_ARG, "k = 384 refused");
    a = ok;
    a.cnt = NULL;
    T_CHECK(cuk_moe_mm(&a, NULL, &err) == G5_ERR_INVALID_ARG, "NULL counts refused");
    a = ok;
    a.x = NULL;
    T_CHECK(cuk_moe_mm(&a, NULL, &err) == G5_ERR_INVALID_ARG, "NULL x refused");
    a = ok;
    a.ldo = 127;
    T_CHECK(cuk_moe_mm(&a, NULL, &err) == G5_ERR_INVALID_ARG, "ldo < n refused");
    a = ok;
    a.out = (uint8_t *)d + 4;
    T_CHECK(cuk_moe_mm(&a, NULL, &err) == G5_ERR_INVALID_ARG, "unaligned out refused");
    T_CHECK(!cuk_moe_mm_takes(QT_IQ2_XXS, 256, 128) && !cuk_moe_mm_takes(QT_Q6_K, 6144, 2048) &&
                cuk_moe_mm_takes(QT_Q4_K, 6144, 2048) && cuk_moe_mm_takes(QT_Q5_K, 2048, 6144) &&
                !cuk_moe_mm_takes(QT_Q4_K, 256, 100) && !cuk_moe_mm_takes(QT_Q4_K, 384, 128),
            "cuk_moe_mm_takes");
    cudaFree(d);
    cudaFree(dc);
}

int main(void) {
    if (!t_need_device()) return t_report(G5_TEST_NAME);
    const mcase cases[] = {
        {"5 experts 0/1/64/65/130 rows, k 512, n 136", 5, 512, 136, CNT_A},
        {"4 experts 3/0/0/17 rows, k 256, n 256", 4, 256, 256, CNT_B},
        {"300 experts, rows only in the last, k 256, n 64", 300, 256, 64, NULL},
        {"1 expert of 150 rows, k 768, n 200", 1, 768, 200, CNT_D},
        {"5 experts 16/32/33/48/97 rows, k 512, n 264", 5, 512, 264, CNT_E},
    };
    for (size_t ti = 0; ti < N_TYPES; ti++)
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) run_case(TYPES[ti], &cases[ci]);
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        check_decode(TYPES[ti]);
        check_layouts(TYPES[ti]);
    }
    check_refusals();
    return t_report(G5_TEST_NAME);
}
