/* The int8-activation kernels (cuda/gemv_q8.cu, API cuda/cuk_q8.h):
 * - cuk_q8_quantize bit-exact against its CPU emulation here (d = amax / 127, q = rint(x / d),
 *   s = d * sum q; the second plane of the residual), including an all-zero block and a block
 *   holding a NaN (d NaN); one plane within 4e-3 of x, two within 3e-5 (rel L2);
 * - cuk_gemv_q8, cuk_moe_gate_up_q8 and cuk_moe_down_q8 for Q4_K, Q5_K, Q6_K, Q8_0 and the low-bit
 *   types (Q2_K, Q3_K, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS, TQ1_0,
 *   TQ2_0, MXFP4, NVFP4: cuda/q8_lowbit.cuh) against a
 *   float64 product of quant_dequantize's weights with the dequantized int8 rows d * q: rel L2
 *   <= 1e-5 per output vector (float32 sums; a wrong block, scale, nibble or row gives O(1)),
 *   shapes with odd m, one unit per lane and several, n = 1..8;
 * - batch invariance: each vector of an n = 8 GEMV and each token of a 5-token MoE call
 *   bit-identical to its one-vector launch; skipped (weight 0) pairs left untouched;
 * - cuk_gemv_q8 with a second matrix (w2, y2): both outputs bit-identical to their own launches
 *   (every type, odd m, n = 1, 3, 8), and cuk_gemv_q8t refusing w2;
 * - cuk_gemv_q8t (tensor cores) the same way for n = 1..32, and its batch invariance, with and
 *   without its scratch (x re-laid out or not) and in the sx form: the same bits;
 * - cuk_moe_gate_up_q8t / cuk_moe_down_q8t (tensor cores: x staged where it fits, and the _l1
 *   forms) bit-identical to the dp4a MoE kernels
 *   (5, 24 and 40 tokens over 6 experts: groups alone and paired, a part row tile);
 * - cuk_moe_down_q8 from float32 rows (hf: each CTA quantizes what it reads; Q4_K, Q5_K, Q8_0, one
 *   plane) bit-identical to its launch on cuk_q8_quantize's rows, alone and for one token, and
 *   cuk_moe_down_q8t refusing them;
 * - cuk_gemv_q8_xf (float32 x quantized per CTA into the staged layout; Q4_K, Q5_K, Q8_0, one and
 *   two planes) bit-identical to cuk_q8_quantize + cuk_gemv_q8, alone and with w2; with a norm
 *   (each CTA RMS-norms the rows first) bit-identical to cuk_norm_q8 + cuk_gemv_q8 at every norm
 *   split (one CTA of 128 or 256 threads, clusters of 2, 4 and 8, two chunks a thread);
 * - cuk_gemv_q8_xs (the dp4a GEMV with x staged in shared memory; Q4_K, Q5_K, Q8_0) bit-identical
 *   to cuk_gemv_q8, alone and with w2, on every cuk_gemv_q8 shape above;
 * - refusals: a type without a kernel, n outside 1..8 (1..32), a misaligned ldq. Device only. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuk.h"
#include "cuda/cuk_q8.h"
#include "format/quant.h"
#include "tests/test_util.h"

#define G5_TEST_NAME "test_gemv_q8"
#define G5_TEST_SEED 0x9a8e11ull
#include "tests/gpu/gpu_test_util.h"

static const uint32_t TYPES[] = {QT_Q4_K,  QT_Q5_K,  QT_Q6_K,  QT_Q8_0,   QT_Q2_K,  QT_Q3_K,  QT_IQ1_S,
                                 QT_IQ1_M, QT_IQ2_XXS, QT_IQ2_XS, QT_IQ2_S, QT_IQ3_XXS, QT_IQ3_S, QT_TQ1_0,
                                 QT_TQ2_0, QT_MXFP4, QT_NVFP4, QT_IQ4_NL, QT_IQ4_XS, QT_Q4_0,  QT_Q4_1,
                                 QT_Q5_0,  QT_Q5_1};
#define N_TYPES (sizeof TYPES / sizeof TYPES[0])

/* The quantizer's CPU emulation for one row of k (planes 2: the residual plane at q + k and
 * ds + k / 16, as cuda/cuk_q8.h says). */
static void q8_host(const float *x, int64_t k, int planes, int8_t *q, float *ds) {
    for (int64_t b = 0; b < k / 32; b++) {
        float amax = 0.0f;
        int bad = 0;
        for (int i = 0; i < 32; i++) {
            const float v = x[32 * b + i];
            bad |= !isfinite(v);
            if (fabsf(v) > amax) amax = fabsf(v);
        }
        volatile float d = amax / 127.0f;
        int sum = 0;
        for (int i = 0; i < 32; i++) {
            volatile float r = x[32 * b + i] / d;
            /* the device's float-to-int conversion gives 0 for NaN */
            const int qi = d > 0.0f && r == r ? (int)rintf(r) : 0;
            q[32 * b + i] = (int8_t)qi;
            sum += qi;
        }
        const float dd = bad ? NAN : d;
        float stot = dd * (float)sum;
        if (planes == 2) {
            volatile float d2 = d / 254.0f;
            int sum2 = 0;
            for (int i = 0; i < 32; i++) {
                const float r = fmaf(-d, (float)q[32 * b + i], x[32 * b + i]);
                volatile float rr = r / d2;
                int q2 = d2 > 0.0f && rr == rr ? (int)rintf(rr) : 0;
                q2 = q2 > 127 ? 127 : q2 < -127 ? -127 : q2;
                q[k + 32 * b + i] = (int8_t)q2;
                sum2 += q2;
            }
            stot = fmaf(d2, (float)sum2, stot);
            ds[k / 16 + 2 * b] = bad ? dd : d2;
            ds[k / 16 + 2 * b + 1] = 0.0f;
        }
        ds[2 * b] = dd;
        ds[2 * b + 1] = stot;
    }
}

/* Random rows with varied block magnitudes (some blocks 100x larger, some zero). */
static void fill_x(float *x, int64_t n, int64_t k) {
    for (int64_t i = 0; i < n * k; i++) x[i] = unif(-1.0f, 1.0f);
    for (int64_t b = 0; b < n * k / 32; b++) {
        const uint64_t r = rnd() % 16;
        for (int i = 0; i < 32; i++) {
            if (r == 0) x[32 * b + i] *= 100.0f;
            if (r == 1) x[32 * b + i] = 0.0f;
        }
    }
}

/* Device q8 rows of x [n][k] (ldq = k rounded to 16, ldds = 2 k / 32 rounded to 4); the host copy
 * of what the kernel wrote is checked against q8_host. */
typedef struct dq8 {
    int8_t *q;
    float *ds;
    int64_t ldq, ldds;
    int32_t planes;
    int8_t *hq;   /* host emulation */
    float *hds;
} dq8;

static dq8 quantize(const float *x, int64_t n, int64_t k, int planes, const char *what) {
    dq8 o;
    o.planes = planes;
    o.ldq = (planes * k + 15) / 16 * 16;
    o.ldds = (planes * (k / 16) + 3) / 4 * 4;
    o.q = dalloc((size_t)(n * o.ldq));
    o.ds = dalloc((size_t)(n * o.ldds) * 4);
    o.hq = xmalloc((size_t)(n * o.ldq));
    o.hds = xmalloc((size_t)(n * o.ldds) * 4);
    float *dx = dup_d(x, (size_t)(n * k) * 4);
    g5_error err = {0};
    const cuk_q8_quantize_args qa = {dx, k, k, n, o.q, o.ldq, o.ds, o.ldds, planes};
    T_CHECK(cuk_q8_quantize(&qa, NULL, &err) == G5_OK, "%s: quantize: %s", what, err.msg);
    int8_t *gq = xmalloc((size_t)(n * o.ldq));
    float *gds = xmalloc((size_t)(n * o.ldds) * 4);
    get(gq, o.q, (size_t)(n * o.ldq));
    get(gds, o.ds, (size_t)(n * o.ldds) * 4);
    int bad = 0;
    for (int64_t r = 0; r < n; r++) {
        q8_host(x + r * k, k, planes, o.hq + r * o.ldq, o.hds + r * o.ldds);
        bad += memcmp(gq + r * o.ldq, o.hq + r * o.ldq, (size_t)(planes * k)) != 0;
        for (int64_t b = 0; b < planes * (k / 16); b++) {
            const float a = gds[r * o.ldds + b], h = o.hds[r * o.ldds + b];
            bad += !(bits(a) == bits(h) || (is_nan(a) && is_nan(h)));
        }
    }
    T_CHECK(bad == 0, "%s: quantizer differs from its CPU emulation in %d rows/scales", what, bad);
    free(gq);
    free(gds);
    CK(cudaFree(dx));
    return o;
}

static void q8_free(dq8 *o) {
    CK(cudaFree(o->q));
    CK(cudaFree(o->ds));
    free(o->hq);
    free(o->hds);
}

/* Dequantized int8 row r of o (k elements) as doubles. */
static void q8_row(const dq8 *o, int64_t r, int64_t k, double *xd) {
    for (int64_t j = 0; j < k; j++) {
        xd[j] = (double)o->hds[r * o->ldds + 2 * (j / 32)] * o->hq[r * o->ldq + j];
        if (o->planes == 2) xd[j] += (double)o->hds[r * o->ldds + k / 16 + 2 * (j / 32)] * o->hq[r * o->ldq + k + j];
    }
}

/* Random weights [n_mat * m][k] of t on the device, and their float32 dequantization. */
static void *weights(uint32_t t, int64_t rows, int64_t k, float **wf) {
    const quant_type_info *ti = quant_type_get(t);
    const uint64_t nb = (uint64_t)rows * (uint64_t)k / ti->block_elems;
    uint8_t *w = xmalloc((size_t)(nb * ti->block_bytes));
    uint64_t st = rnd();
    *wf = xmalloc((size_t)(rows * k) * 4);
    if (quant_fill_random(t, w, nb, &st) || quant_dequantize(t, w, (uint64_t)(rows * k), *wf)) {
        printf("FAIL: random %s weights\n", ti->name);
        exit(2);
    }
    void *d = dup_d(w, (size_t)(nb * ti->block_bytes));
    free(w);
    return d;
}

static double dotd(const float *w, const double *x, int64_t k) {
    double s = 0;
    for (int64_t j = 0; j < k; j++) s += (double)w[j] * x[j];
    return s;
}

static double rel_l2(const float *got, const double *ref, int64_t n) {
    double e = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        e += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
        r += ref[i] * ref[i];
    }
    return r > 0 ? sqrt(e / r) : sqrt(e);
}

static void test_quantize_nan(int planes) {
    float x[64];
    for (int i = 0; i < 64; i++) x[i] = unif(-2, 2);
    x[40] = NAN;
    dq8 o = quantize(x, 1, 64, planes, "nan block");
    float ds[8];
    get(ds, o.ds, (size_t)planes * 4 * sizeof(float));
    T_CHECK(!is_nan(ds[0]) && is_nan(ds[2]) && is_nan(ds[3]), "nan block (%d planes): d of the NaN block is NaN, the other finite", planes);
    if (planes == 2) T_CHECK(!is_nan(ds[4]) && is_nan(ds[6]), "nan block: the second plane's d too");
    q8_free(&o);
}

/* How close the dequantized rows are to x: one plane ~ 1/254 of each block's largest value per
 * element, two planes ~ 1/254^2. */
static void test_planes_error(void) {
    enum { K = 4096 };
    float *x = xmalloc(K * 4);
    fill_x(x, 1, K);
    for (int planes = 1; planes <= 2; planes++) {
        dq8 o = quantize(x, 1, K, planes, "planes");
        double *xd = xmalloc(K * 8), e = 0, r = 0;
        q8_row(&o, 0, K, xd);
        for (int i = 0; i < K; i++) {
            e += (xd[i] - x[i]) * (xd[i] - x[i]);
            r += (double)x[i] * x[i];
        }
        const double rel = sqrt(e / r), bound = planes == 1 ? 4e-3 : 3e-5;
        T_CHECK(rel <= bound, "%d plane(s): dequantized x rel L2 %.3e <= %.0e", planes, rel, bound);
        printf("  %d plane(s): x rel L2 %.2e\n", planes, rel);
        free(xd);
        q8_free(&o);
    }
    free(x);
}

static void test_gemv(uint32_t t, int64_t m, int64_t k, int planes) {
    const char *tn = quant_type_name(t);
    enum { N = 8 };
    float *wf;
    void *dw = weights(t, m, k, &wf);
    float *x = xmalloc((size_t)(N * k) * 4);
    fill_x(x, N, k);
    dq8 o = quantize(x, N, k, planes, tn);
    float *dy = dalloc((size_t)(N * m) * 4), *dy1 = dalloc((size_t)m * 4);
    float *y = xmalloc((size_t)(N * m) * 4), *y1 = xmalloc((size_t)m * 4);
    double *xd = xmalloc((size_t)k * 8), *ref = xmalloc((size_t)m * 8);
    float *wf2;
    void *dw2 = weights(t, m, k, &wf2);
    float *dz = dalloc((size_t)(N * m) * 4), *dp1 = dalloc((size_t)(N * m) * 4), *dp2 = dalloc((size_t)(N * m) * 4);
    float *z = xmalloc((size_t)(N * m) * 4), *p1 = xmalloc((size_t)(N * m) * 4), *p2 = xmalloc((size_t)(N * m) * 4);
    float *dxs = dalloc((size_t)(N * m) * 4), *yxs = xmalloc((size_t)(N * m) * 4);
    g5_error err = {0};
    for (int n = 1; n <= N; n += n < 3 ? 2 : 5) { /* 1, 3, 8 */
        const cuk_gemv_q8_args a = {t, dw, k, m, {o.q, o.ldq, o.ds, o.ldds, o.planes}, n, dy, m, NULL, NULL};
        T_CHECK(cuk_gemv_q8(&a, NULL, &err) == G5_OK, "%s gemv n=%d: %s", tn, n, err.msg);
        get(y, dy, (size_t)(n * m) * 4);
        double worst = 0;
        int same = 1;
        for (int v = 0; v < n; v++) {
            q8_row(&o, v, k, xd);
            for (int64_t i = 0; i < m; i++) ref[i] = dotd(wf + i * k, xd, k);
            const double e = rel_l2(y + v * m, ref, m);
            if (!(e <= worst)) worst = e;
            const cuk_gemv_q8_args a1 = {t, dw, k, m, {o.q + v * o.ldq, o.ldq, o.ds + v * o.ldds, o.ldds, o.planes}, 1, dy1, m, NULL, NULL};
            T_CHECK(cuk_gemv_q8(&a1, NULL, &err) == G5_OK, "%s gemv one: %s", tn, err.msg);
            get(y1, dy1, (size_t)m * 4);
            same &= memcmp(y1, y + v * m, (size_t)m * 4) == 0;
        }
        T_CHECK(worst <= 1e-5, "%s gemv m=%lld k=%lld n=%d planes %d: rel L2 %.3e <= 1e-5", tn, (long long)m,
                (long long)k, n, planes, worst);
        T_CHECK(same, "%s gemv m=%lld k=%lld n=%d planes %d: every vector bit-identical to its one-vector launch", tn,
                (long long)m, (long long)k, n, planes);
        printf("  %s gemv m=%lld k=%lld n=%d planes %d: rel L2 %.2e\n", tn, (long long)m, (long long)k, n, planes, worst);
        /* the xs form (x staged in shared memory): the same bits wherever it is offered; it must
         * be for Q4_K, Q5_K and Q8_0 where the rows fit any sm_90 or sm_120 block (99 KB) */
        const int xs_must = (t == QT_Q4_K || t == QT_Q5_K || t == QT_Q8_0) && (int64_t)n * planes * k / 64 * 80 <= 99 * 1024;
        cuk_gemv_q8_args ax = a;
        ax.y = dxs;
        CK(cudaMemset(dxs, 0xFF, (size_t)(n * m) * 4));
        const g5_status sx = cuk_gemv_q8_xs(&ax, NULL, &err);
        T_CHECK(sx == G5_OK || (sx == G5_ERR_UNSUPPORTED && !xs_must), "%s gemv_q8_xs n=%d planes %d: %s", tn, n, planes,
                sx == G5_OK ? "ok" : err.msg);
        if (sx == G5_OK) {
            get(yxs, dxs, (size_t)(n * m) * 4);
            T_CHECK(!memcmp(yxs, y, (size_t)(n * m) * 4), "%s gemv_q8_xs m=%lld k=%lld n=%d planes %d: bit-identical to gemv_q8",
                    tn, (long long)m, (long long)k, n, planes);
        }
        /* w and w2 in one launch: each output as its own launch gives it */
        const cuk_gemv_q8_args a2 = {t, dw2, k, m, {o.q, o.ldq, o.ds, o.ldds, o.planes}, n, dz, m, NULL, NULL};
        const cuk_gemv_q8_args ap = {t, dw, k, m, {o.q, o.ldq, o.ds, o.ldds, o.planes}, n, dp1, m, dw2, dp2};
        T_CHECK(cuk_gemv_q8(&a2, NULL, &err) == G5_OK && cuk_gemv_q8(&ap, NULL, &err) == G5_OK, "%s gemv pair: %s", tn,
                err.msg);
        get(z, dz, (size_t)(n * m) * 4);
        get(p1, dp1, (size_t)(n * m) * 4);
        get(p2, dp2, (size_t)(n * m) * 4);
        T_CHECK(!memcmp(p1, y, (size_t)(n * m) * 4) && !memcmp(p2, z, (size_t)(n * m) * 4),
                "%s gemv pair m=%lld k=%lld n=%d planes %d: both outputs bit-identical to their own launches", tn,
                (long long)m, (long long)k, n, planes);
        if (sx == G5_OK) { /* the pair in the xs form */
            CK(cudaMemset(dp1, 0xFF, (size_t)(n * m) * 4));
            CK(cudaMemset(dp2, 0xFF, (size_t)(n * m) * 4));
            T_CHECK(cuk_gemv_q8_xs(&ap, NULL, &err) == G5_OK, "%s gemv_q8_xs pair: %s", tn, err.msg);
            get(p1, dp1, (size_t)(n * m) * 4);
            get(p2, dp2, (size_t)(n * m) * 4);
            T_CHECK(!memcmp(p1, y, (size_t)(n * m) * 4) && !memcmp(p2, z, (size_t)(n * m) * 4),
                    "%s gemv_q8_xs pair m=%lld k=%lld n=%d planes %d: both outputs bit-identical to gemv_q8's", tn,
                    (long long)m, (long long)k, n, planes);
        }
        if (cuk_gemv_q8_xf_takes(t, k, n, planes)) { /* float32 x, quantized per CTA: the same bits */
            float *dxf = dup_d(x, (size_t)(n * k) * 4);
            const cuk_gemv_q8_args af = {t, dw, k, m, {NULL, 0, NULL, 0, planes}, n, dxs, m, NULL, NULL};
            CK(cudaMemset(dxs, 0xFF, (size_t)(n * m) * 4));
            const cuk_q8_xf xf = {dxf, k, NULL, 0.0f}, xf_bad = {dxf, k + 2, NULL, 0.0f};
            T_CHECK(cuk_gemv_q8_xf(&af, &xf, NULL, &err) == G5_OK, "%s gemv_q8_xf n=%d planes %d: %s", tn, n, planes,
                    err.msg);
            get(yxs, dxs, (size_t)(n * m) * 4);
            T_CHECK(!memcmp(yxs, y, (size_t)(n * m) * 4),
                    "%s gemv_q8_xf m=%lld k=%lld n=%d planes %d: bit-identical to quantize + gemv_q8", tn, (long long)m,
                    (long long)k, n, planes);
            const cuk_gemv_q8_args afp = {t, dw, k, m, {NULL, 0, NULL, 0, planes}, n, dp1, m, dw2, dp2};
            CK(cudaMemset(dp1, 0xFF, (size_t)(n * m) * 4));
            CK(cudaMemset(dp2, 0xFF, (size_t)(n * m) * 4));
            T_CHECK(cuk_gemv_q8_xf(&afp, &xf, NULL, &err) == G5_OK, "%s gemv_q8_xf pair: %s", tn, err.msg);
            get(p1, dp1, (size_t)(n * m) * 4);
            get(p2, dp2, (size_t)(n * m) * 4);
            T_CHECK(!memcmp(p1, y, (size_t)(n * m) * 4) && !memcmp(p2, z, (size_t)(n * m) * 4),
                    "%s gemv_q8_xf pair m=%lld k=%lld n=%d planes %d: both outputs bit-identical", tn, (long long)m,
                    (long long)k, n, planes);
            T_CHECK(cuk_gemv_q8_xf(&af, &xf_bad, NULL, &err) == G5_ERR_INVALID_ARG && strstr(err.msg, "ldx"),
                    "%s gemv_q8_xf: ldx not a multiple of 4 refused (%s)", tn, err.msg);
            CK(cudaFree(dxf));
        }
    }
    q8_free(&o);
    CK(cudaFree(dw2));
    CK(cudaFree(dz));
    CK(cudaFree(dp1));
    CK(cudaFree(dp2));
    free(wf2), free(z), free(p1), free(p2), free(yxs);
    CK(cudaFree(dxs));
    CK(cudaFree(dw));
    CK(cudaFree(dy));
    CK(cudaFree(dy1));
    free(wf), free(x), free(y), free(y1), free(xd), free(ref);
}

/* cuk_gemv_q8t (the tensor-core kernel): n = 1..32 against float64, every vector bit-identical
 * to the dp4a kernel's one-vector launch (cuk_gemv_q8, n = 1: what a single decode row gets), so
 * a batched step can take either kernel. */
static void test_gemv_t(uint32_t t, int64_t m, int64_t k, int planes) {
    const char *tn = quant_type_name(t);
    enum { N = CUK_Q8T_MAX_N };
    static const int NS[] = {1, 2, 5, 8, 12, 17, 24, 32}; /* 12: the 9-16 column forms at one plane; 24: a part 8th tile at two planes */
    float *wf;
    void *dw = weights(t, m, k, &wf);
    float *x = xmalloc((size_t)(N * k) * 4);
    fill_x(x, N, k);
    dq8 o = quantize(x, N, k, planes, tn);
    float *dy = dalloc((size_t)(N * m) * 4), *dy1 = dalloc((size_t)m * 4);
    void *fxs = dalloc((size_t)k * CUK_Q8T_SCRATCH_PER_K);
    float *y = xmalloc((size_t)(N * m) * 4), *y1 = xmalloc((size_t)m * 4), *ysx = xmalloc((size_t)(N * m) * 4);
    double *xd = xmalloc((size_t)k * 8), *ref = xmalloc((size_t)(N * m) * 8);
    for (int v = 0; v < N; v++) {
        q8_row(&o, v, k, xd);
        for (int64_t i = 0; i < m; i++) ref[v * m + i] = dotd(wf + i * k, xd, k);
    }
    g5_error err = {0};
    for (size_t ni = 0; ni < sizeof NS / sizeof NS[0]; ni++) {
        const int n = NS[ni];
        const cuk_gemv_q8_args a = {t, dw, k, m, {o.q, o.ldq, o.ds, o.ldds, o.planes}, n, dy, m, NULL, NULL};
        T_CHECK(cuk_gemv_q8t(&a, fxs, (size_t)k * CUK_Q8T_SCRATCH_PER_K, NULL, &err) == G5_OK, "%s gemv_q8t n=%d: %s",
                tn, n, err.msg);
        get(y, dy, (size_t)(n * m) * 4);
        double worst = 0;
        int same = 1;
        for (int v = 0; v < n; v++) {
            const double e = rel_l2(y + v * m, ref + v * m, m);
            if (!(e <= worst)) worst = e;
            const cuk_gemv_q8_args a1 = {t, dw, k, m, {o.q + v * o.ldq, o.ldq, o.ds + v * o.ldds, o.ldds, o.planes}, 1, dy1, m, NULL, NULL};
            T_CHECK(cuk_gemv_q8(&a1, NULL, &err) == G5_OK, "%s gemv_q8 one: %s", tn, err.msg);
            get(y1, dy1, (size_t)m * 4);
            same &= memcmp(y1, y + v * m, (size_t)m * 4) == 0;
        }
        T_CHECK(worst <= 1e-5, "%s gemv_q8t m=%lld k=%lld n=%d planes %d: rel L2 %.3e <= 1e-5", tn, (long long)m,
                (long long)k, n, planes, worst);
        T_CHECK(same, "%s gemv_q8t m=%lld k=%lld n=%d planes %d: every vector bit-identical to cuk_gemv_q8's "
                "one-vector launch", tn, (long long)m, (long long)k, n, planes);
        /* without scratch (x read as it is where cuk_gemv_q8t re-lays it out): the same bits */
        CK(cudaMemset(dy, 0xFF, (size_t)(n * m) * 4));
        T_CHECK(cuk_gemv_q8t(&a, NULL, 0, NULL, &err) == G5_OK, "%s gemv_q8t n=%d, no scratch: %s", tn, n, err.msg);
        get(ysx, dy, (size_t)(n * m) * 4);
        T_CHECK(memcmp(ysx, y, (size_t)(n * m) * 4) == 0,
                "%s gemv_q8t m=%lld k=%lld n=%d planes %d: no scratch, bit-identical", tn, (long long)m, (long long)k, n,
                planes);
        /* the second form on every shape, whatever cuk_gemv_q8t picked: the same bits */
        CK(cudaMemset(dy, 0xFF, (size_t)(n * m) * 4));
        const g5_status ss = cuk_gemv_q8t_sx(&a, NULL, &err);
        if (ss == G5_ERR_UNSUPPORTED) {
            printf("  %s gemv_q8t_sx: not on this device (%s)\n", tn, err.msg);
        } else {
            T_CHECK(ss == G5_OK, "%s gemv_q8t_sx n=%d: %s", tn, n, err.msg);
            get(ysx, dy, (size_t)(n * m) * 4);
            T_CHECK(memcmp(ysx, y, (size_t)(n * m) * 4) == 0,
                    "%s gemv_q8t_sx m=%lld k=%lld n=%d planes %d: bit-identical to gemv_q8t", tn, (long long)m,
                    (long long)k, n, planes);
        }
        if (n == 1 || n == N)
            printf("  %s gemv_q8t m=%lld k=%lld n=%d planes %d: rel L2 %.2e\n", tn, (long long)m, (long long)k, n, planes,
                   worst);
    }
    q8_free(&o);
    CK(cudaFree(dw));
    CK(cudaFree(dy));
    CK(cudaFree(dy1));
    CK(cudaFree(fxs));
    free(wf), free(x), free(y), free(y1), free(ysx), free(xd), free(ref);
}

static void test_refusals_moe_t(void) {
    g5_error err = {0};
    void *w = dalloc(1 << 20);
    int8_t *q = dalloc(64 * 1024);
    float *ds = dalloc(64 * 256), *y = dalloc(64 * 4096);
    int32_t *ids = dalloc(64), *plan = dalloc(4096);
    cuk_moe_gate_up_q8_args a = {QT_Q6_K, w, w, 256, 16, 2, ids, 1, 1, {q, 256, ds, 16, 1}, 1, y, 16, plan};
    T_CHECK(cuk_moe_gate_up_q8t(&a, NULL, &err) == G5_ERR_INVALID_ARG && strstr(err.msg, "Q6_K"), "moe q8t refused: Q6_K (%s)",
            err.msg);
    a.w_type = QT_Q4_K;
    a.x = (cuk_q8_act){q, 512, ds, 32, 2};
    T_CHECK(cuk_moe_gate_up_q8t(&a, NULL, &err) == G5_ERR_INVALID_ARG && strstr(err.msg, "2 planes"),
            "moe q8t refused: two planes (%s)", err.msg);
    T_CHECK(cuk_moe_q8t_takes(QT_Q8_0, 512, 1) && !cuk_moe_q8t_takes(QT_Q8_0, 64, 1) && !cuk_moe_q8t_takes(QT_Q6_K, 512, 1) &&
                !cuk_moe_q8t_takes(QT_Q4_K, 512, 2),
            "cuk_moe_q8t_takes: Q4_K, Q5_K, Q8_0 with k %% 256 and one plane");
    CK(cudaFree(w));
    CK(cudaFree(q));
    CK(cudaFree(ds));
    CK(cudaFree(y));
    CK(cudaFree(ids));
    CK(cudaFree(plan));
}

static void test_refusals_t(void) {
    g5_error err = {0};
    void *w = dalloc(1 << 16);
    int8_t *q = dalloc(64 * 1024);
    float *ds = dalloc(64 * 256), *y = dalloc(64 * 256);
    cuk_gemv_q8_args a = {QT_Q4_K, w, 256, 16, {q, 512, ds, 32, 1}, 33, y, 16, NULL, NULL};
    T_CHECK(cuk_gemv_q8t(&a, NULL, 0, NULL, &err) == G5_ERR_INVALID_ARG && strstr(err.msg, "n=33"), "q8t refused: n=33 (%s)", err.msg);
    a.n = 1;
    a.k = 320;
    T_CHECK(cuk_gemv_q8t(&a, NULL, 0, NULL, &err) == G5_ERR_INVALID_ARG && strstr(err.msg, "k=320"), "q8t refused: Q4_K k=320 (%s)", err.msg);
    a.k = 256;
    a.w_type = QT_Q4_0;
    T_CHECK(cuk_gemv_q8t(&a, NULL, 0, NULL, &err) == G5_ERR_INVALID_ARG && strstr(err.msg, "Q4_0"), "q8t refused: Q4_0 (%s)", err.msg);
    a.w_type = QT_Q8_0;
    a.w2 = w;
    a.y2 = y;
    T_CHECK(cuk_gemv_q8t(&a, NULL, 0, NULL, &err) == G5_ERR_INVALID_ARG && strstr(err.msg, "w2"), "q8t refused: w2 (%s)", err.msg);
    a.w2 = NULL;
    a.y2 = NULL;
    a.x.ldq = 200;
    T_CHECK(cuk_gemv_q8t(&a, NULL, 0, NULL, &err) == G5_ERR_INVALID_ARG && strstr(err.msg, "ldq"), "q8t refused: ldq 200 (%s)", err.msg);
    a.x.ldq = 512;
    T_CHECK(cuk_gemv_q8t(&a, q, 256 * CUK_Q8T_SCRATCH_PER_K - 1, NULL, &err) == G5_ERR_INVALID_ARG &&
                strstr(err.msg, "scratch"),
            "q8t refused: scratch one byte short (%s)", err.msg);
    T_CHECK(cuk_gemv_q8t(&a, q + 8, 256 * CUK_Q8T_SCRATCH_PER_K, NULL, &err) == G5_ERR_INVALID_ARG &&
                strstr(err.msg, "scratch"),
            "q8t refused: scratch not 16-byte aligned (%s)", err.msg);
    T_CHECK(cuk_q8t_takes(QT_Q8_0, 512) && !cuk_q8t_takes(QT_Q8_0, 64) && cuk_q8t_takes(QT_Q6_K, 6144) &&
                !cuk_q8t_takes(QT_Q4_0, 256),
            "cuk_q8t_takes: the four types with k %% 256, nothing else");
    CK(cudaFree(w));
    CK(cudaFree(q));
    CK(cudaFree(ds));
    CK(cudaFree(y));
}

enum { NE = 6, TOPK = 2, MAXTOK = 40 };

static int32_t *plan_for(const int32_t *did, const float *dwts, int n_tok) {
    int32_t *p = dalloc((size_t)cuk_moe_plan_words(n_tok, TOPK) * 4);
    g5_error err = {0};
    const cuk_moe_plan_args pa = {did, dwts, n_tok, TOPK, TOPK, TOPK, NE, p};
    T_CHECK(cuk_moe_plan(&pa, NULL, &err) == G5_OK, "plan: %s", err.msg);
    return p;
}

static void silu_ref(double g, double u, double *o) { *o = g / (1.0 + exp(-g)) * u; }

/* The tensor-core MoE kernel's rows against the dp4a kernel's (`ref`, rows of n each, ldo n):
 * bit-identical for every computed pair, the skipped pairs' rows left untouched. */
static void moe_t_same(const char *what, const char *tn, const float *got, const float *ref, const float *wts, int64_t P,
                       int64_t n, int skipped_poison) {
    int64_t bad = -1;
    for (int64_t p = 0; p < P && bad < 0; p++) {
        if (wts && wts[p] == 0.0f) {
            if (skipped_poison)
                for (int64_t i = 0; i < n; i++)
                    if (bits(got[p * n + i]) != POISON) bad = p;
            continue;
        }
        if (memcmp(got + p * n, ref + p * n, (size_t)n * 4)) bad = p;
    }
    T_CHECK(bad < 0, "%s %s: tensor-core rows bit-identical to the dp4a kernel's (first bad row %lld of %lld)", tn, what,
            (long long)bad, (long long)P);
}

/* gate_up (m rows per expert, k in) then down (k2 = m in, m2 = k out) for ntok tokens (>= 5); the
 * down half where the int8 kernels take k2 = m. With many tokens per expert (ntok 40: about 13
 * pairs per expert, several plan groups each) the tensor-core kernels pair the groups. */
static void test_moe(uint32_t t, int64_t m, int64_t k, int planes, int ntok) {
    const char *tn = quant_type_name(t);
    float *wgf, *wuf, *wdf;
    void *dwg = weights(t, NE * m, k, &wgf), *dwu = weights(t, NE * m, k, &wuf), *dwd = weights(t, NE * k, m, &wdf);
    int32_t ids[MAXTOK * TOPK];
    float wts[MAXTOK * TOPK];
    for (int i = 0; i < ntok * TOPK; i++) {
        ids[i] = (int32_t)(rnd() % NE);
        if (i % TOPK && ids[i] == ids[i - 1]) ids[i] = (ids[i] + 1) % NE;
        wts[i] = unif(0.1f, 1.0f);
    }
    ids[3] = ids[0]; /* two tokens on one expert: a group of 2 */
    if (ids[2] == ids[3]) ids[2] = (ids[3] + 1) % NE;
    wts[5] = 0.0f;   /* a skipped pair */
    int32_t *did = dup_d(ids, sizeof ids);
    float *dwts = dup_d(wts, sizeof wts);
    float *x = xmalloc((size_t)(ntok * k) * 4);
    fill_x(x, ntok, k);
    dq8 ox = quantize(x, ntok, k, planes, tn);
    const int64_t P = ntok * TOPK;
    const int tc = cuk_moe_q8t_takes(t, k, planes), tc_dn = cuk_moe_q8t_takes(t, m, planes);
    float *dout = dalloc((size_t)(P * m) * 4), *out = xmalloc((size_t)(P * m) * 4);
    float *out1 = xmalloc((size_t)(P * m) * 4), *outt = xmalloc((size_t)(P * m) * 4);
    CK(cudaMemset(dout, 0xFF, (size_t)(P * m) * 4));
    int32_t *plan = plan_for(did, dwts, ntok);
    g5_error err = {0};
    const cuk_moe_gate_up_q8_args gu = {t, dwg, dwu, k, m, NE, did, TOPK, TOPK, {ox.q, ox.ldq, ox.ds, ox.ldds, ox.planes},
                                        ntok, dout, m, plan};
    T_CHECK(cuk_moe_gate_up_q8(&gu, NULL, &err) == G5_OK, "%s gate_up: %s", tn, err.msg);
    get(out, dout, (size_t)(P * m) * 4);
    for (int l1 = 0; tc && l1 < 2; l1++) { /* the tensor-core kernels: the form by device, then the L1 form */
        CK(cudaMemset(dout, 0xFF, (size_t)(P * m) * 4));
        T_CHECK((l1 ? cuk_moe_gate_up_q8t_l1(&gu, NULL, &err) : cuk_moe_gate_up_q8t(&gu, NULL, &err)) == G5_OK,
                "%s gate_up q8t%s: %s", tn, l1 ? "_l1" : "", err.msg);
        get(outt, dout, (size_t)(P * m) * 4);
        moe_t_same(l1 ? "gate_up (L1 form)" : "gate_up", tn, outt, out, wts, P, m, 1);
    }
    double *xd = xmalloc((size_t)k * 8), *ref = xmalloc((size_t)(m > k ? m : k) * 8);
    double worst = 0;
    for (int64_t p = 0; p < P; p++) {
        if (wts[p] == 0.0f) {
            int kept = 1;
            for (int64_t i = 0; i < m; i++) kept &= bits(out[p * m + i]) == POISON;
            T_CHECK(kept, "%s gate_up: the skipped pair's row left untouched", tn);
            continue;
        }
        q8_row(&ox, p / TOPK, k, xd);
        const int64_t e = ids[p];
        for (int64_t i = 0; i < m; i++)
            silu_ref(dotd(wgf + (e * m + i) * k, xd, k), dotd(wuf + (e * m + i) * k, xd, k), &ref[i]);
        const double er = rel_l2(out + p * m, ref, m);
        if (!(er <= worst)) worst = er;
    }
    T_CHECK(worst <= 1e-5, "%s gate_up m=%lld k=%lld: rel L2 %.3e <= 1e-5", tn, (long long)m, (long long)k, worst);
    printf("  %s moe gate_up m=%lld k=%lld, %d tokens%s: rel L2 %.2e\n", tn, (long long)m, (long long)k, ntok,
           tc ? " (and q8t)" : "", worst);
    /* token 1 alone (its own plan): bit-identical rows */
    {
        float *d1 = dalloc((size_t)(TOPK * m) * 4);
        int32_t *p1 = plan_for(did + TOPK, dwts + TOPK, 1);
        const cuk_moe_gate_up_q8_args g1 = {t, dwg, dwu, k, m, NE, did + TOPK, TOPK, TOPK,
                                            {ox.q + ox.ldq, ox.ldq, ox.ds + ox.ldds, ox.ldds, ox.planes}, 1, d1, m, p1};
        T_CHECK(cuk_moe_gate_up_q8(&g1, NULL, &err) == G5_OK, "%s gate_up one: %s", tn, err.msg);
        get(out1, d1, (size_t)(TOPK * m) * 4);
        T_CHECK(memcmp(out1, out + TOPK * m, (size_t)(TOPK * m) * 4) == 0,
                "%s gate_up: token 1 of %d bit-identical to its one-token launch", tn, ntok);
        CK(cudaFree(d1));
        CK(cudaFree(p1));
    }
    if (cuk_q8_takes(t, m)) { /* the int8 down kernels take rows of m */
        /* down: h = the gate_up rows (skipped pair: zeros), quantized per pair row */
        for (int64_t i = 0; i < m; i++) out[5 * m + i] = 0.0f;
        dq8 oh = quantize(out, P, m, planes, tn);
        float *dy = dalloc((size_t)(ntok * k) * 4), *dpart = dalloc((size_t)(P * k) * 4);
        float *y = xmalloc((size_t)(ntok * k) * 4), *y1 = xmalloc((size_t)k * 4), *yt = xmalloc((size_t)(ntok * k) * 4);
        const cuk_moe_down_q8_args dn = {t, dwd, m, k, NE, did, dwts, TOPK, TOPK, TOPK, {oh.q, oh.ldq, oh.ds, oh.ldds, oh.planes},
                                         ntok, dy, k, plan, dpart, k, NULL, 0};
        T_CHECK(cuk_moe_down_q8(&dn, NULL, &err) == G5_OK, "%s down: %s", tn, err.msg);
        get(y, dy, (size_t)(ntok * k) * 4);
        for (int l1 = 0; tc_dn && l1 < 2; l1++) {
            CK(cudaMemset(dy, 0xFF, (size_t)(ntok * k) * 4));
            T_CHECK((l1 ? cuk_moe_down_q8t_l1(&dn, NULL, &err) : cuk_moe_down_q8t(&dn, NULL, &err)) == G5_OK,
                    "%s down q8t%s: %s", tn, l1 ? "_l1" : "", err.msg);
            get(yt, dy, (size_t)(ntok * k) * 4);
            moe_t_same(l1 ? "down (L1 form)" : "down", tn, yt, y, NULL, ntok, k, 0);
        }
        double *hd = xmalloc((size_t)m * 8);
        worst = 0;
        for (int tk = 0; tk < ntok; tk++) {
            for (int64_t i = 0; i < k; i++) ref[i] = 0;
            for (int s = 0; s < TOPK; s++) {
                const int64_t p = tk * TOPK + s;
                if (wts[p] == 0.0f) continue;
                q8_row(&oh, p, m, hd);
                for (int64_t i = 0; i < k; i++) ref[i] += (double)wts[p] * dotd(wdf + ((int64_t)ids[p] * k + i) * m, hd, m);
            }
            const double er = rel_l2(y + tk * k, ref, k);
            if (!(er <= worst)) worst = er;
        }
        T_CHECK(worst <= 1e-5, "%s down m=%lld k=%lld: rel L2 %.3e <= 1e-5", tn, (long long)k, (long long)m, worst);
        printf("  %s moe down m=%lld k=%lld, %d tokens%s: rel L2 %.2e\n", tn, (long long)k, (long long)m, ntok,
               tc_dn ? " (and q8t)" : "", worst);
        {
            float *d1 = dalloc((size_t)k * 4);
            int32_t *p1 = plan_for(did + TOPK, dwts + TOPK, 1);
            const cuk_moe_down_q8_args d1a = {t, dwd, m, k, NE, did + TOPK, dwts + TOPK, TOPK, TOPK, TOPK,
                                              {oh.q + TOPK * oh.ldq, oh.ldq, oh.ds + TOPK * oh.ldds, oh.ldds, oh.planes}, 1, d1, k,
                                              p1, dpart, k, NULL, 0};
            T_CHECK(cuk_moe_down_q8(&d1a, NULL, &err) == G5_OK, "%s down one: %s", tn, err.msg);
            get(y1, d1, (size_t)k * 4);
            T_CHECK(memcmp(y1, y + k, (size_t)k * 4) == 0, "%s down: token 1 of %d bit-identical to its one-token launch", tn,
                    ntok);
            CK(cudaFree(d1));
            CK(cudaFree(p1));
        }
        if (planes == 1 && cuk_moe_down_q8_hf_takes(t, m, ntok)) { /* h as float32 rows, quantized inside */
            float *dhf = dup_d(out, (size_t)(P * m) * 4), *d1 = dalloc((size_t)k * 4);
            cuk_moe_down_q8_args df = dn;
            df.h = (cuk_q8_act){0};
            df.hf = dhf;
            df.ldhf = m;
            CK(cudaMemset(dy, 0xFF, (size_t)(ntok * k) * 4));
            T_CHECK(cuk_moe_down_q8(&df, NULL, &err) == G5_OK, "%s down from float32 rows: %s", tn, err.msg);
            get(yt, dy, (size_t)(ntok * k) * 4);
            T_CHECK(!memcmp(yt, y, (size_t)(ntok * k) * 4),
                    "%s down from float32 rows m=%lld k=%lld, %d tokens: bit-identical to the int8 rows' launch", tn,
                    (long long)k, (long long)m, ntok);
            int32_t *p1 = plan_for(did + TOPK, dwts + TOPK, 1);
            cuk_moe_down_q8_args d1f = df;
            d1f.ids = did + TOPK, d1f.wts = dwts + TOPK, d1f.n_tok = 1, d1f.y = d1, d1f.plan = p1, d1f.hf = dhf + TOPK * m;
            T_CHECK(cuk_moe_down_q8(&d1f, NULL, &err) == G5_OK, "%s down one from float32 rows: %s", tn, err.msg);
            get(y1, d1, (size_t)k * 4);
            T_CHECK(!memcmp(y1, y + k, (size_t)k * 4), "%s down from float32 rows: token 1 alone bit-identical", tn);
            T_CHECK(cuk_moe_down_q8t(&df, NULL, &err) == G5_ERR_INVALID_ARG && strstr(err.msg, "hf"),
                    "%s down_q8t refuses float32 rows (%s)", tn, err.msg);
            df.ldhf = m + 2;
            T_CHECK(cuk_moe_down_q8(&df, NULL, &err) == G5_ERR_INVALID_ARG && strstr(err.msg, "ldhf"),
                    "%s down: ldhf not a multiple of 4 refused (%s)", tn, err.msg);
            CK(cudaFree(dhf));
            CK(cudaFree(d1));
            CK(cudaFree(p1));
        }
        q8_free(&oh);
        CK(cudaFree(dy));
        CK(cudaFree(dpart));
        free(y), free(y1), free(yt), free(hd);
    }
    q8_free(&ox);
    CK(cudaFree(dwg));
    CK(cudaFree(dwu));
    CK(cudaFree(dwd));
    CK(cudaFree(did));
    CK(cudaFree(dwts));
    CK(cudaFree(dout));
    CK(cudaFree(plan));
    free(wgf), free(wuf), free(wdf), free(x), free(out), free(out1), free(outt), free(xd), free(ref);
}

static void test_refusals(void) {
    g5_error err = {0};
    float *dx = dalloc(4096);
    int8_t *q = dalloc(4096);
    float *ds = dalloc(4096);
    float *y = dalloc(4096);
    void *w = dalloc(1 << 16);
    cuk_gemv_q8_args a = {QT_F16, w, 256, 4, {q, 256, ds, 16, 1}, 1, y, 4, NULL, NULL};
    T_CHECK(cuk_gemv_q8(&a, NULL, &err) == G5_ERR_INVALID_ARG && strstr(err.msg, "F16"), "refused: F16 (%s)", err.msg);
    a.w_type = QT_Q4_K;
    a.n = 9;
    T_CHECK(cuk_gemv_q8(&a, NULL, &err) == G5_ERR_INVALID_ARG && strstr(err.msg, "n=9"), "refused: n=9 (%s)", err.msg);
    a.n = 1;
    a.x.ldq = 264;
    T_CHECK(cuk_gemv_q8(&a, NULL, &err) == G5_ERR_INVALID_ARG && strstr(err.msg, "ldq"), "refused: ldq 264 (%s)", err.msg);
    a.x.ldq = 256;
    a.x.planes = 2;
    T_CHECK(cuk_gemv_q8(&a, NULL, &err) == G5_ERR_INVALID_ARG && strstr(err.msg, "ldq"), "refused: two planes in ldq 256 (%s)", err.msg);
    a.x.planes = 3;
    T_CHECK(cuk_gemv_q8(&a, NULL, &err) == G5_ERR_INVALID_ARG && strstr(err.msg, "planes"), "refused: planes 3 (%s)", err.msg);
    a.x.planes = 1;
    a.w2 = w;
    a.y2 = y + 3; /* y's row is 4 floats */
    T_CHECK(cuk_gemv_q8(&a, NULL, &err) == G5_ERR_INVALID_ARG && strstr(err.msg, "overlaps"), "refused: y2 overlapping y (%s)",
            err.msg);
    a.y2 = y + 4;
    T_CHECK(cuk_gemv_q8(&a, NULL, &err) == G5_OK, "y2 right after y's one row: launched (%s)", err.msg);
    a.w2 = NULL;
    a.y2 = NULL;
    a.k = 320;
    T_CHECK(cuk_gemv_q8(&a, NULL, &err) == G5_ERR_INVALID_ARG, "refused: Q4_K k=320 (%s)", err.msg);
    const cuk_q8_quantize_args qa = {dx, 48, 48, 1, q, 48, ds, 4, 1};
    T_CHECK(cuk_q8_quantize(&qa, NULL, &err) == G5_ERR_INVALID_ARG && strstr(err.msg, "k=48"), "refused: quantize k=48 (%s)", err.msg);
    T_CHECK(cuk_q8_takes(QT_Q8_0, 64) && !cuk_q8_takes(QT_Q8_0, 96) && cuk_q8_takes(QT_Q6_K, 512) && !cuk_q8_takes(QT_F32, 64) &&
                cuk_q8_takes(QT_MXFP4, 64) && !cuk_q8_takes(QT_MXFP4, 32) && cuk_q8_takes(QT_NVFP4, 64) &&
                cuk_q8_takes(QT_IQ1_S, 256) && !cuk_q8_takes(QT_IQ2_XXS, 192) && cuk_q8_takes(QT_IQ4_XS, 256) &&
                cuk_q8_takes(QT_IQ4_NL, 64) && !cuk_q8_takes(QT_IQ4_NL, 32) && cuk_q8_takes(QT_Q4_0, 64) &&
                !cuk_q8_takes(QT_Q5_1, 32) && !cuk_q8_takes(QT_Q8_1, 64),
            "cuk_q8_takes: Q8_0, IQ4_NL, MXFP4, NVFP4, Q4_0..Q5_1 k%%64, the other K- and i-quants k%%256, not Q8_1, F32");
    CK(cudaFree(dx));
    CK(cudaFree(q));
    CK(cudaFree(ds));
    CK(cudaFree(y));
    CK(cudaFree(w));
}

/* cuk_gemv_q8_xf with a norm: each CTA's RMSNorm of the rows must give cuk_norm_q8's bits (its
 * split of a row over clusters and threads, rowops_norm_shape), so the outputs equal cuk_norm_q8
 * followed by cuk_gemv_q8, for n rows of k (the norm's input rows with varied magnitudes). */
static void test_xf_norm(uint32_t t, int64_t m, int64_t k, int n, int planes) {
    const char *tn = quant_type_name(t);
    if (!cuk_gemv_q8_xf_takes(t, k, n, planes)) {
        T_CHECK(0, "%s gemv_q8_xf takes k=%lld n=%d planes %d", tn, (long long)k, n, planes);
        return;
    }
    float *wf;
    void *dw = weights(t, m, k, &wf);
    float *x = xmalloc((size_t)(n * k) * 4), *nw = xmalloc((size_t)k * 4);
    fill_x(x, n, k);
    for (int64_t i = 0; i < k; i++) nw[i] = unif(0.5f, 1.5f);
    float *dx = dup_d(x, (size_t)(n * k) * 4), *dnw = dup_d(nw, (size_t)k * 4), *dyn = dalloc((size_t)(n * k) * 4);
    const int64_t ldq = (planes * k + 15) / 16 * 16, ldds = (planes * k / 16 + 3) / 4 * 4;
    int8_t *dq = dalloc((size_t)(n * ldq));
    float *dds = dalloc((size_t)(n * ldds) * 4), *dy = dalloc((size_t)(n * m) * 4), *dyf = dalloc((size_t)(n * m) * 4);
    float *y = xmalloc((size_t)(n * m) * 4), *yf = xmalloc((size_t)(n * m) * 4);
    const float eps = 1e-5f;
    g5_error err = {0};
    const cuk_norm_q8_args na = {{.x = dx, .ldx = k, .w = dnw, .y = dyn, .ldy = k, .n_rows = n, .dim = k, .eps = eps},
                                 dq, ldq, dds, ldds, planes};
    const cuk_gemv_q8_args a = {t, dw, k, m, {dq, ldq, dds, ldds, planes}, n, dy, m, NULL, NULL};
    T_CHECK(cuk_norm_q8_fits(k) && cuk_norm_q8(&na, NULL, &err) == G5_OK && cuk_gemv_q8(&a, NULL, &err) == G5_OK,
            "%s norm_q8 + gemv_q8 k=%lld: %s", tn, (long long)k, err.msg);
    const cuk_gemv_q8_args af = {t, dw, k, m, {NULL, 0, NULL, 0, planes}, n, dyf, m, NULL, NULL};
    const cuk_q8_xf xf = {dx, k, dnw, eps};
    CK(cudaMemset(dyf, 0xFF, (size_t)(n * m) * 4));
    T_CHECK(cuk_gemv_q8_xf(&af, &xf, NULL, &err) == G5_OK, "%s gemv_q8_xf with a norm k=%lld: %s", tn, (long long)k,
            err.msg);
    get(y, dy, (size_t)(n * m) * 4);
    get(yf, dyf, (size_t)(n * m) * 4);
    T_CHECK(!memcmp(y, yf, (size_t)(n * m) * 4),
            "%s gemv_q8_xf with a norm m=%lld k=%lld n=%d planes %d: bit-identical to norm_q8 + gemv_q8", tn,
            (long long)m, (long long)k, n, planes);
    const cuk_q8_xf xf_mis = {dx, k, dnw + 1, eps}, xf_eps = {dx, k, dnw, -1.0f};
    T_CHECK(cuk_gemv_q8_xf(&af, &xf_mis, NULL, &err) == G5_ERR_INVALID_ARG && strstr(err.msg, "nw"),
            "%s gemv_q8_xf: a misaligned norm weight refused (%s)", tn, err.msg);
    T_CHECK(cuk_gemv_q8_xf(&af, &xf_eps, NULL, &err) == G5_ERR_INVALID_ARG && strstr(err.msg, "eps"),
            "%s gemv_q8_xf: a negative eps refused (%s)", tn, err.msg);
    CK(cudaFree(dw));
    CK(cudaFree(dx));
    CK(cudaFree(dnw));
    CK(cudaFree(dyn));
    CK(cudaFree(dq));
    CK(cudaFree(dds));
    CK(cudaFree(dy));
    CK(cudaFree(dyf));
    free(wf), free(x), free(nw), free(y), free(yf);
}

int main(void) {
    if (!t_need_device()) return t_report(G5_TEST_NAME);
    test_quantize_nan(1);
    test_quantize_nan(2);
    test_planes_error();
    test_refusals();
    test_refusals_t();
    test_refusals_moe_t();
    for (int planes = 1; planes <= 2; planes++)
        for (size_t i = 0; i < N_TYPES; i++) {
            const uint32_t t = TYPES[i];
            test_gemv(t, 37, 512, planes);   /* 8 units per row: 4 row pairs side by side (span 8) */
            test_gemv(t, 45, 256, planes);   /* 4 units: 8 pairs side by side, the last group partial */
            test_gemv(t, 29, 768, planes);   /* 12 units in spans of 16: lanes 12..15 of each hold none */
            test_gemv(t, 64, 2048, planes);  /* one unit per lane: 4 row pairs per warp */
            test_gemv(t, 9, 6144, planes);   /* three units per lane, odd m */
            test_moe(t, 256, 512, planes, 5);
            test_moe(t, 40, 2560, planes, 40);  /* gate_up only: a part tile, 10 steps, paired groups */
            test_moe(t, 512, 2560, planes, 24); /* down over 2 steps, residue groups 2..7 empty */
            if (!cuk_q8t_takes(t, 256)) continue; /* the low-bit types have no tensor-core kernel */
            test_gemv_t(t, 37, 512, planes);  /* two steps, a part tile */
            test_gemv_t(t, 64, 2048, planes); /* two warps per tile */
            test_gemv_t(t, 9, 6144, planes);  /* eight warps per tile */
            test_gemv_t(t, 21, 256, planes);  /* one step: residue groups 1..7 empty */
            test_gemv_t(t, 40, 1024, planes); /* four steps over two warps, groups 4..7 empty */
            test_gemv_t(t, 17, 5120, planes); /* 20 steps: residues with three units and with two */
            test_gemv_t(t, 3, 12288, planes); /* six units per residue */
            /* 17+ columns of a tall matrix: x staged in shared memory; k-ranges as clusters of 2 (groups
             * 6, 7 empty) and of 4 */
            test_gemv_t(t, 12301, 1536, planes);
            test_gemv_t(t, 12301, 2048, planes);
            test_gemv_t(t, 3, 40960, planes); /* sx: a k-range of 20 steps, staged in two chunks */
        }
    /* after the loop above, whose random inputs (and tolerances) stay those of the tests before */
    static const uint32_t XF_TYPES[] = {QT_Q4_K, QT_Q5_K, QT_Q8_0};
    for (int planes = 1; planes <= 2; planes++)
        for (size_t i = 0; i < sizeof XF_TYPES / sizeof XF_TYPES[0]; i++) {
            const uint32_t t = XF_TYPES[i];
            test_xf_norm(t, 77, 512, 1, planes);   /* the norm's splits (rowops_norm_shape): one CTA of 128 threads */
            test_xf_norm(t, 77, 1024, 3, planes);  /* one CTA of 256 */
            test_xf_norm(t, 300, 2048, 1, planes); /* a cluster of 2: q_lora */
            test_xf_norm(t, 300, 2048, 2, planes);
            test_xf_norm(t, 45, 4096, 1, planes);  /* 4 */
            test_xf_norm(t, 45, 16384, 1, planes); /* 8, two chunks a thread */
        }
    return t_report(G5_TEST_NAME);
}
