/* The fp16 tensor-core products (cuda/gemv_h16.cu, API cuda/cuk_h16.h):
 * - cuk_h16_prep bit-exact against its CPU emulation here (the exponent of the row's largest
 *   magnitude, the power-of-two scale, fp16 rounded to nearest even), rows of zeros, with a NaN,
 *   with an infinity, tiny and huge rows included;
 * - cuk_gemv_h16 for Q4_K and Q5_K against a float64 product of the weights as the kernel rounds
 *   them (d sc and dmin m as the CPU's dequantizer forms them, one fma, fp16 to nearest even:
 *   emulated here bit for bit) with the prepared x: every output within 1e-5 of sum |w x| (the
 *   float32 accumulation; one wrong weight or x element moves an output by about sum |w x| / k);
 *   odd m, one block per warp and many, n = 1..40 (two launches past 32), every seventh row's
 *   scales made tiny (subnormal weights); and the decode bit for bit: one-hot x gives each
 *   weight itself;
 * - batch invariance: every column of an n-vector call bit-identical to its one-vector launch;
 * - cuk_norm_h16 bit for bit the norm and cuk_h16_prep it replaces (x, y, xh, unscale), plain
 *   and with the residual add, zeros / NaN / infinity / tiny / huge rows;
 * - refusals: a type without a kernel, k not a multiple of 256, n < 1, a misaligned ldx; a norm
 *   dim cuk_norm_q8_fits does not take, a misaligned ldxh, no xh. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuk.h"
#include "cuda/cuk_h16.h"
#include "cuda/cuk_q8.h"
#include "format/quant.h"
#include "tests/test_util.h"

#define G5_TEST_NAME "test_gemv_h16"
#define G5_TEST_SEED 0x416e16ull
#include "tests/gpu/gpu_test_util.h"

/* cuk_h16_prep's emulation for one row */
static void prep_host(const float *x, int64_t k, uint16_t *xh, float *unscale) {
    float mx = 0.0f;
    for (int64_t i = 0; i < k; i++) mx = fmaxf(mx, fabsf(x[i]));
    int e = 0;
    if (mx > 0.0f && isfinite(mx)) {
        int ex;
        frexpf(mx, &ex);
        e = 15 - ex;
        e = e < -126 ? -126 : e > 126 ? 126 : e;
    }
    for (int64_t i = 0; i < k; i++) xh[i] = quant_f32_to_f16(ldexpf(x[i], e));
    *unscale = ldexpf(1.0f, -e);
}

/* Row r of a Q4_K / Q5_K matrix as the kernel's fp16 weights (as floats) */
static void weights_host(uint32_t t, const uint8_t *row, int64_t k, float *w) {
    const int bb = t == QT_Q5_K ? 176 : 144, qo = t == QT_Q5_K ? 48 : 16;
    for (int64_t s = 0; s < k / 256; s++) {
        const uint8_t *b = row + s * bb, *sc = b + 4;
        const float d = quant_f16_to_f32((uint16_t)(b[0] | b[1] << 8)), dmin = quant_f16_to_f32((uint16_t)(b[2] | b[3] << 8));
        for (int j = 0; j < 4; j++)
            for (int h = 0; h < 2; h++) {
                const int sb = 2 * j + h;
                uint8_t scv, mv;
                quant_k4_scale_min(sb, sc, &scv, &mv);
                volatile float d1 = d * (float)scv, m1 = dmin * (float)mv;
                for (int l = 0; l < 32; l++) {
                    int q = (b[qo + 32 * j + l] >> (4 * h)) & 0xF;
                    if (t == QT_Q5_K) q |= ((b[16 + l] >> sb) & 1) << 4;
                    w[s * 256 + 64 * j + 32 * h + l] = quant_f16_to_f32(quant_f32_to_f16(fmaf((float)q, d1, -m1)));
                }
            }
    }
}

static void fill_x(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        x[i] = unif(-1.0f, 1.0f);
        if (rnd() % 97 == 0) x[i] *= 30.0f;
    }
}

static void test_prep(void) {
    enum { K = 1000, N = 7 };
    float *x = xmalloc(sizeof(float) * N * K);
    fill_x(x, (int64_t)N * K);
    for (int i = 0; i < K; i++) x[K + i] = 0.0f;                 /* a row of zeros */
    x[2 * K + 17] = NAN;                                         /* a NaN */
    x[3 * K + 5] = INFINITY;                                     /* an infinity */
    for (int i = 0; i < K; i++) x[4 * K + i] *= 1e-36f;          /* tiny: e clamps at 126 */
    for (int i = 0; i < K; i++) x[5 * K + i] *= 3e30f;           /* huge */
    for (int i = 0; i < K; i++) x[6 * K + i] = ldexpf(x[6 * K + i], -20); /* subnormal halves */
    float *dx = dup_d(x, sizeof(float) * N * K), *dun = dalloc(sizeof(float) * N);
    uint16_t *dxh = dalloc(2 * (size_t)N * (K + 8));
    const cuk_h16_prep_args pa = {dx, K, K, N, dxh, K + 8, dun};
    g5_error e = {0};
    T_CHECK(cuk_h16_prep(&pa, NULL, &e) == G5_OK, "h16_prep: %s", e.msg);
    uint16_t *xh = xmalloc(2 * (size_t)N * (K + 8)), *ref = xmalloc(2 * K);
    float un[N];
    get(xh, dxh, 2 * (size_t)N * (K + 8));
    get(un, dun, sizeof un);
    for (int r = 0; r < N; r++) {
        float ru;
        prep_host(x + (size_t)r * K, K, ref, &ru);
        int diff = 0;
        for (int i = 0; i < K; i++) {
            const uint16_t a = xh[(size_t)r * (K + 8) + i], b = ref[i];
            const int nan_a = (a & 0x7C00u) == 0x7C00u && (a & 1023u), nan_b = (b & 0x7C00u) == 0x7C00u && (b & 1023u);
            diff += nan_a || nan_b ? nan_a != nan_b : a != b;
        }
        T_CHECK(diff == 0, "h16_prep row %d: %d elements differ from the emulation", r, diff);
        T_CHECK(memcmp(&un[r], &ru, 4) == 0, "h16_prep row %d: unscale %g against %g", r, un[r], ru);
    }
    free(x), free(xh), free(ref);
    cudaFree(dx), cudaFree(dxh), cudaFree(dun);
}

/* cuk_norm_h16 against the launches it replaces (the norm, then cuk_h16_prep), bit for bit: x (the
 * residual add's write), y, xh and unscale; add: with the residual add (and b), else the plain
 * norm. Rows: random, zeros, a NaN, an infinity, tiny, huge. */
static void test_norm_h16(int64_t dim, int n, int add, int with_b) {
    T_CHECK(cuk_norm_q8_fits(dim), "norm_h16: cuk_norm_q8_fits(%lld)", (long long)dim);
    const int64_t ld = dim + 8, sz = (int64_t)n * ld;
    float *x = xmalloc(sizeof(float) * sz), *a = xmalloc(sizeof(float) * sz), *b = xmalloc(sizeof(float) * sz),
          *w = xmalloc(sizeof(float) * dim);
    fill_x(x, sz), fill_x(a, sz), fill_x(b, sz), fill_x(w, dim);
    if (n > 1) for (int64_t i = 0; i < ld; i++) x[ld + i] = a[ld + i] = b[ld + i] = 0.0f;
    if (n > 2) x[2 * ld + 3] = NAN;
    if (n > 3) a[3 * ld + dim - 1] = INFINITY;
    if (n > 4) for (int64_t i = 0; i < ld; i++) x[4 * ld + i] *= 1e-30f;
    if (n > 5) for (int64_t i = 0; i < ld; i++) x[5 * ld + i] *= 1e30f;
    float *dx[2], *dy[2], *dun[2];
    uint16_t *dxh[2];
    float *da = dup_d(a, sizeof(float) * sz), *db = dup_d(b, sizeof(float) * sz), *dw = dup_d(w, sizeof(float) * dim);
    g5_error e = {0};
    for (int v = 0; v < 2; v++) {
        dx[v] = dup_d(x, sizeof(float) * sz), dy[v] = dalloc(sizeof(float) * sz), dun[v] = dalloc(sizeof(float) * n);
        dxh[v] = dalloc(2 * (size_t)sz);
        cudaMemset(dy[v], 0, sizeof(float) * sz), cudaMemset(dxh[v], 0, 2 * (size_t)sz);
        const cuk_add_rms_norm_args na = {.x = dx[v], .ldx = ld, .a = add ? da : NULL, .b = add && with_b ? db : NULL,
                                          .lda = ld, .w = dw, .y = add ? dy[v] : dx[v], .ldy = ld, .n_rows = n,
                                          .dim = dim, .eps = 1e-6f};
        if (v == 0) {
            const cuk_norm_h16_args ha = {na, dxh[v], ld, dun[v]};
            T_CHECK(cuk_norm_h16(&ha, NULL, &e) == G5_OK, "norm_h16: %s", e.msg);
        } else {
            T_CHECK((add ? cuk_add_rms_norm(&na, NULL, &e) : cuk_rms_norm(na.x, ld, dw, na.y, ld, n, dim, 1e-6f, NULL, &e)) ==
                        G5_OK, "norm: %s", e.msg);
            const cuk_h16_prep_args pa = {na.y, ld, dim, n, dxh[v], ld, dun[v]};
            T_CHECK(cuk_h16_prep(&pa, NULL, &e) == G5_OK, "h16_prep: %s", e.msg);
        }
    }
    T_CHECK(cudaDeviceSynchronize() == cudaSuccess, "norm_h16: sync");
    float *h[2][3];
    uint16_t *hx[2];
    for (int v = 0; v < 2; v++) {
        h[v][0] = xmalloc(sizeof(float) * sz), h[v][1] = xmalloc(sizeof(float) * sz), h[v][2] = xmalloc(sizeof(float) * n);
        hx[v] = xmalloc(2 * (size_t)sz);
        get(h[v][0], dx[v], sizeof(float) * sz), get(h[v][1], dy[v], sizeof(float) * sz);
        get(h[v][2], dun[v], sizeof(float) * n), get(hx[v], dxh[v], 2 * (size_t)sz);
    }
    const char *what = add ? (with_b ? "x + a + b" : "x + a") : "x";
    T_CHECK(memcmp(h[0][0], h[1][0], sizeof(float) * sz) == 0, "norm_h16 (%s) dim %lld n %d: x differs", what, (long long)dim, n);
    T_CHECK(memcmp(h[0][1], h[1][1], sizeof(float) * sz) == 0, "norm_h16 (%s) dim %lld n %d: y differs", what, (long long)dim, n);
    T_CHECK(memcmp(h[0][2], h[1][2], sizeof(float) * n) == 0, "norm_h16 (%s) dim %lld n %d: unscale differs", what, (long long)dim, n);
    T_CHECK(memcmp(hx[0], hx[1], 2 * (size_t)sz) == 0, "norm_h16 (%s) dim %lld n %d: xh differs", what, (long long)dim, n);
    int scaled = 0; /* the test's own sense: the rows were scaled at all (unscale != 1 somewhere) */
    for (int r = 0; r < n; r++) scaled += h[0][2][r] != 1.0f;
    T_CHECK(scaled > 0, "norm_h16 dim %lld n %d: no row scaled", (long long)dim, n);
    for (int v = 0; v < 2; v++) {
        free(h[v][0]), free(h[v][1]), free(h[v][2]), free(hx[v]);
        cudaFree(dx[v]), cudaFree(dy[v]), cudaFree(dun[v]), cudaFree(dxh[v]);
    }
    free(x), free(a), free(b), free(w);
    cudaFree(da), cudaFree(db), cudaFree(dw);
}

/* Random m x k weights of type t (rows of rb bytes); rows 3, 10, 17, ..: d and dmin times 2^-12,
 * so that d sc, dmin m and many weights are fp16 subnormals (the decode's rounding there is
 * emulated too). */
static uint8_t *weights_random(uint32_t t, int64_t m, int64_t k, uint64_t rb) {
    const quant_type_info *ti = quant_type_get(t);
    uint8_t *hw = xmalloc(rb * (size_t)m);
    uint64_t st = rnd();
    if (quant_fill_random(t, hw, rb * (uint64_t)m / ti->block_bytes, &st) != G5_OK) exit(2);
    for (int64_t o = 3; o < m; o += 7)
        for (int64_t s = 0; s < k / 256; s++)
            for (int f = 0; f < 2; f++) {
                uint8_t *b = hw + (size_t)o * rb + (size_t)s * ti->block_bytes + 2 * f;
                const uint16_t h = quant_f32_to_f16(ldexpf(quant_f16_to_f32((uint16_t)(b[0] | b[1] << 8)), -12));
                b[0] = (uint8_t)(h & 0xff), b[1] = (uint8_t)(h >> 8);
            }
    return hw;
}

/* The decode bit for bit through the kernel: x one-hot at element p (xh = 2^14, unscale 2^-14)
 * makes y[o] exactly row o's fp16 weight p (every other product is a zero, the float32 sums
 * exact), for every p of two blocks, 32 vectors a launch. */
static void test_decode_exact(uint32_t t) {
    enum { M = 45, K = 512, N = 32 };
    uint64_t rb = 0;
    if (quant_row_bytes(t, K, &rb) != G5_OK) exit(2);
    uint8_t *hw = weights_random(t, M, K, rb), *dw = dup_d(hw, rb * M);
    float *w = xmalloc(sizeof(float) * M * K), *x = xmalloc(sizeof(float) * N * K), *y = xmalloc(sizeof(float) * N * M);
    for (int o = 0; o < M; o++) weights_host(t, hw + (size_t)o * rb, K, w + (size_t)o * K);
    float *dx = dalloc(sizeof(float) * N * K), *dun = dalloc(sizeof(float) * N), *dy = dalloc(sizeof(float) * N * M);
    uint16_t *dxh = dalloc(2 * N * K);
    int bad = 0, sub = 0;
    for (int p0 = 0; p0 < K; p0 += N) {
        memset(x, 0, sizeof(float) * N * K);
        for (int v = 0; v < N; v++) x[v * K + p0 + v] = 1.0f;
        CK(cudaMemcpy(dx, x, sizeof(float) * N * K, cudaMemcpyHostToDevice));
        g5_error e = {0};
        const cuk_h16_prep_args pa = {dx, K, K, N, dxh, K, dun};
        const cuk_gemv_h16_args ga = {t, dw, K, M, {dxh, K, dun}, N, dy, M};
        T_CHECK(cuk_h16_prep(&pa, NULL, &e) == G5_OK && cuk_gemv_h16(&ga, NULL, &e) == G5_OK, "decode %s: %s",
                quant_type_name(t), e.msg);
        get(y, dy, sizeof(float) * N * M);
        for (int v = 0; v < N; v++)
            for (int o = 0; o < M; o++) {
                const float want = w[(size_t)o * K + p0 + v];
                bad += y[v * M + o] != want;
                sub += want != 0.0f && fabsf(want) < 0x1p-14f;
            }
    }
    T_CHECK(bad == 0, "decode %s: %d of %d weights differ from the emulated fp16 decode", quant_type_name(t), bad, M * K);
    T_CHECK(sub > 0, "decode %s: no subnormal weight", quant_type_name(t));
    free(hw), free(w), free(x), free(y);
    cudaFree(dw), cudaFree(dx), cudaFree(dun), cudaFree(dy), cudaFree(dxh);
}

/* One shape: m rows of k of type t, n vectors; the emulated reference and the batch invariance. */
static void test_gemv(uint32_t t, int64_t m, int64_t k, int n) {
    uint64_t rb = 0;
    if (quant_row_bytes(t, (uint64_t)k, &rb) != G5_OK) exit(2);
    uint8_t *hw = weights_random(t, m, k, rb);
    const int64_t ldx = k + 8;
    float *x = xmalloc(sizeof(float) * (size_t)n * k);
    fill_x(x, (int64_t)n * k);
    uint8_t *dw = dup_d(hw, rb * (size_t)m);
    float *dx = dup_d(x, sizeof(float) * (size_t)n * k), *dun = dalloc(sizeof(float) * (size_t)n);
    uint16_t *dxh = dalloc(2 * (size_t)n * ldx);
    float *dy = dalloc(sizeof(float) * (size_t)n * m), *dy1 = dalloc(sizeof(float) * (size_t)n * m);
    g5_error e = {0};
    const cuk_h16_prep_args pa = {dx, k, k, n, dxh, ldx, dun};
    T_CHECK(cuk_h16_prep(&pa, NULL, &e) == G5_OK, "h16_prep: %s", e.msg);
    const cuk_gemv_h16_args ga = {t, dw, k, m, {dxh, ldx, dun}, n, dy, m};
    T_CHECK(cuk_gemv_h16(&ga, NULL, &e) == G5_OK, "gemv_h16 %s %lldx%lld n %d: %s", quant_type_name(t), (long long)m,
            (long long)k, n, e.msg);
    for (int v = 0; v < n; v++) { /* each vector alone */
        const cuk_gemv_h16_args g1 = {t, dw, k, m, {dxh + (size_t)v * ldx, ldx, dun + v}, 1, dy1 + (size_t)v * m, m};
        T_CHECK(cuk_gemv_h16(&g1, NULL, &e) == G5_OK, "gemv_h16 one vector: %s", e.msg);
    }
    float *y = xmalloc(sizeof(float) * (size_t)n * m), *y1 = xmalloc(sizeof(float) * (size_t)n * m);
    uint16_t *xh = xmalloc(2 * (size_t)n * ldx);
    float *un = xmalloc(sizeof(float) * (size_t)n), *w = xmalloc(sizeof(float) * (size_t)k);
    get(y, dy, sizeof(float) * (size_t)n * m);
    get(y1, dy1, sizeof(float) * (size_t)n * m);
    get(xh, dxh, 2 * (size_t)n * ldx);
    get(un, dun, sizeof(float) * (size_t)n);
    T_CHECK(memcmp(y, y1, sizeof(float) * (size_t)n * m) == 0, "gemv_h16 %s %lldx%lld n %d: a vector differs from its one-vector launch",
            quant_type_name(t), (long long)m, (long long)k, n);
    double worst = 0;
    for (int64_t o = 0; o < m; o++) {
        weights_host(t, hw + (size_t)o * rb, k, w);
        for (int v = 0; v < n; v++) {
            double s = 0, a = 0;
            for (int64_t i = 0; i < k; i++) {
                const double p = (double)w[i] * (double)quant_f16_to_f32(xh[(size_t)v * ldx + i]);
                s += p;
                a += fabs(p);
            }
            const double d = fabs((double)y[(size_t)v * m + o] - s * un[v]) / (a * un[v] + 1e-30);
            if (d > worst) worst = d;
        }
    }
    T_CHECK(worst <= 1e-5, "gemv_h16 %s %lldx%lld n %d: |y - ref| / sum |w x| up to %.2e", quant_type_name(t),
            (long long)m, (long long)k, n, worst);
    free(hw), free(x), free(y), free(y1), free(xh), free(un), free(w);
    cudaFree(dw), cudaFree(dx), cudaFree(dun), cudaFree(dxh), cudaFree(dy), cudaFree(dy1);
}

static void test_refusals(void) {
    uint8_t *dw = dalloc(1 << 16);
    uint16_t *dxh = dalloc(1 << 14);
    float *dy = dalloc(1 << 14), *dun = dalloc(64);
    g5_error e = {0};
    cuk_gemv_h16_args a = {QT_Q6_K, dw, 256, 16, {dxh, 256, dun}, 1, dy, 16};
    T_CHECK(cuk_gemv_h16(&a, NULL, &e) == G5_ERR_UNSUPPORTED, "gemv_h16 refuses Q6_K");
    a.type = QT_Q4_K;
    a.k = 300;
    a.x.ldx = 304;
    T_CHECK(cuk_gemv_h16(&a, NULL, &e) == G5_ERR_UNSUPPORTED, "gemv_h16 refuses k = 300");
    a.k = 256;
    a.x.ldx = 256;
    a.n = 0;
    T_CHECK(cuk_gemv_h16(&a, NULL, &e) == G5_ERR_INVALID_ARG, "gemv_h16 refuses n = 0");
    a.n = 1;
    a.x.ldx = 260;
    T_CHECK(cuk_gemv_h16(&a, NULL, &e) == G5_ERR_INVALID_ARG, "gemv_h16 refuses ldx = 260");
    a.x.ldx = 256;
    a.w = NULL;
    T_CHECK(cuk_gemv_h16(&a, NULL, &e) == G5_ERR_INVALID_ARG, "gemv_h16 refuses no weights");
    a.w = dw;
    T_CHECK(cuk_gemv_h16(&a, NULL, &e) == G5_OK, "gemv_h16 takes the corrected call: %s", e.msg);
    cuk_h16_prep_args p = {dy, 256, 0, 1, dxh, 256, dun};
    T_CHECK(cuk_h16_prep(&p, NULL, &e) == G5_ERR_INVALID_ARG, "h16_prep refuses k = 0");
    p.k = 256;
    p.ldxh = 255;
    T_CHECK(cuk_h16_prep(&p, NULL, &e) == G5_ERR_INVALID_ARG, "h16_prep refuses ldxh < k");
    {
        float *dx = dalloc(sizeof(float) * 512), *dw = dalloc(sizeof(float) * 512), *du = dalloc(4);
        uint16_t *dh = dalloc(2 * 512);
        cuk_norm_h16_args na = {{.x = dx, .ldx = 512, .w = dw, .y = dx, .ldy = 512, .n_rows = 1, .dim = 512, .eps = 1e-6f},
                                dh, 512, du};
        T_CHECK(cuk_norm_h16(&na, NULL, &e) == G5_OK, "norm_h16 takes dim 512: %s", e.msg);
        na.norm.dim = na.norm.ldx = na.norm.ldy = 100;
        T_CHECK(cuk_norm_h16(&na, NULL, &e) == G5_ERR_INVALID_ARG, "norm_h16 refuses dim 100");
        na.norm.dim = 256, na.ldxh = 260;
        T_CHECK(cuk_norm_h16(&na, NULL, &e) == G5_ERR_INVALID_ARG, "norm_h16 refuses ldxh = 260");
        na.ldxh = 512, na.xh = NULL;
        T_CHECK(cuk_norm_h16(&na, NULL, &e) == G5_ERR_INVALID_ARG, "norm_h16 refuses no xh");
        cudaDeviceSynchronize();
        cudaFree(dx), cudaFree(dw), cudaFree(du), cudaFree(dh);
    }
    T_CHECK(cuk_h16_takes(QT_Q5_K, 2048) && !cuk_h16_takes(QT_Q8_0, 2048) && !cuk_h16_takes(QT_Q4_K, 128),
            "cuk_h16_takes");
    CK(cudaDeviceSynchronize());
    cudaFree(dw), cudaFree(dxh), cudaFree(dy), cudaFree(dun);
}

int main(void) {
    if (!t_need_device()) return t_report(G5_TEST_NAME);
    test_prep();
    test_refusals();
    test_norm_h16(2048, 1, 0, 0); /* q_a_norm of one token */
    test_norm_h16(2048, 32, 0, 0);
    test_norm_h16(6144, 6, 1, 0); /* ffn_norm after attention: x + a */
    test_norm_h16(6144, 32, 1, 1); /* after the MoE: x + (experts + shared) */
    test_norm_h16(512, 3, 1, 1);
    static const uint32_t types[] = {QT_Q4_K, QT_Q5_K};
    for (int i = 0; i < 2; i++) {
        const uint32_t t = types[i];
        test_decode_exact(t);
        test_gemv(t, 16, 256, 1);   /* one block: warps 1..3 of the tile hold none */
        test_gemv(t, 37, 512, 5);   /* a part tile, two blocks */
        test_gemv(t, 1, 2048, 8);   /* one row */
        test_gemv(t, 100, 2048, 13); /* two column tiles */
        test_gemv(t, 17, 6144, 32);  /* four column tiles, 24 blocks over 4 warps */
        test_gemv(t, 64, 1024, 40);  /* two launches: 32 + 8 */
        test_gemv(t, 9, 16384, 3);   /* the longest rows */
    }
    return t_report(G5_TEST_NAME);
}
