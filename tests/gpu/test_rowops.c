/* The latency-bound per-row kernels (cuda/ops.cu norms and RoPE, cuda/model_ops.cu router and
 * indexer preparation) on the properties the decode step relies on beyond test_kernels'
 * tolerances:
 *  - a row's bits do not depend on the number of rows in the launch (batched decode);
 *  - cuk_add_rms_norm equals cuk_add + cuk_rms_norm bit for bit (x and y);
 *  - cuk_idx_prep equals cuk_rope, cuk_layer_norm, cuk_rope, cuk_scale bit for bit;
 *  - the fused launches of the decode step equal the ones they replace bit for bit, outputs and
 *    untouched bytes alike: cuk_norm_q8 (cuk_rms_norm or cuk_add_rms_norm, then
 *    cuk_q8_quantize), cuk_silu_mul_q8 (cuk_silu_mul, cuk_q8_quantize) and cuk_norm_rope
 *    (cuk_rms_norm, the copy of the rope part, cuk_rope), with NaN, infinite and all-zero rows;
 *  - cuk_moe_route picks exactly what runtime/cpu/model.c's scan picks, also with ties, signed
 *    zeros and NaN choices (the reference scan below runs on the kernel's own scores, so the
 *    check is on the selection alone);
 * and the norms against a float64 reference, for dims that take each kernel shape (one warp,
 * one CTA, a cluster, chunks past the registers) with aligned and unaligned rows.
 * Runs on the device only. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuk.h"
#include "cuda/cuk_model.h"
#include "cuda/cuk_q8.h"
#include "tests/test_util.h"

#define G5_TEST_NAME "test_rowops"
#define G5_TEST_SEED 0x70e5ull
#include "tests/gpu/gpu_test_util.h"

static int same_bits(const float *a, const float *b, size_t n) {
    return memcmp(a, b, n * sizeof(float)) == 0;
}

static float *rand_buf(size_t n, float lo, float hi) {
    float *h = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) h[i] = unif(lo, hi);
    return h;
}

/* row-wise y on the host of an [n][ld] device buffer, first dim columns */
static void get_rows(float *h, const float *d, int64_t n, int64_t ld, int64_t dim) {
    float *t = xmalloc((size_t)(n * ld) * 4);
    get(t, d, (size_t)(n * ld) * 4);
    for (int64_t r = 0; r < n; r++) memcpy(h + r * dim, t + r * ld, (size_t)dim * 4);
    free(t);
}

static void test_norms(void) {
    static const int64_t dims[] = {7, 100, 128, 512, 576, 2048, 6144, 40001};
    const int64_t n = 5;
    const float eps = 1e-5f;
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
        for (int al = 0; al < 2; al++) {
            const int64_t dim = dims[di], ld = al ? (dim + 3) / 4 * 4 : dim + 5;
            const size_t N = (size_t)(n * ld);
            float *hx = rand_buf(N, -3, 3), *ha = rand_buf(N, -1, 1), *hb = rand_buf(N, -1, 1);
            float *hw = rand_buf((size_t)dim, 0.5f, 1.5f), *hbias = rand_buf((size_t)dim, -0.5f, 0.5f);
            float *dx = dup_d(hx, N * 4), *da = dup_d(ha, N * 4), *db = dup_d(hb, N * 4);
            float *dw = dup_d(hw, (size_t)dim * 4), *dbias = dup_d(hbias, (size_t)dim * 4);
            float *dy = dalloc(N * 4), *dy1 = dalloc(N * 4), *dx1 = dalloc(N * 4), *dx2 = dalloc(N * 4);
            float *dt = dalloc((size_t)dim * 4);
            float *y = xmalloc((size_t)(n * dim) * 4), *y1 = xmalloc((size_t)(n * dim) * 4);
            float *x1 = xmalloc((size_t)(n * dim) * 4), *x2 = xmalloc((size_t)(n * dim) * 4);
            g5_error e = {0};
            int ok = 1;
            double maxerr[2] = {0, 0};
            for (int kind = 0; kind < 2; kind++) {
                /* all rows in one launch vs one launch per row */
                ok &= (kind ? cuk_layer_norm(&(cuk_layer_norm_args){dx, ld, dw, dbias, dy, ld, n, dim, eps}, NULL, &e)
                            : cuk_rms_norm(dx, ld, dw, dy, ld, n, dim, eps, NULL, &e)) == G5_OK;
                for (int64_t r = 0; r < n; r++)
                    ok &= (kind ? cuk_layer_norm(&(cuk_layer_norm_args){dx + r * ld, ld, dw, dbias, dy1 + r * ld, ld, 1, dim,
                                                                        eps}, NULL, &e)
                                : cuk_rms_norm(dx + r * ld, ld, dw, dy1 + r * ld, ld, 1, dim, eps, NULL, &e)) == G5_OK;
                get_rows(y, dy, n, ld, dim);
                get_rows(y1, dy1, n, ld, dim);
                T_CHECK(ok, "norm launch: %s", e.msg);
                T_CHECK(same_bits(y, y1, (size_t)(n * dim)), "%s dim=%lld ld=%lld: rows differ with n_rows",
                        kind ? "layer_norm" : "rms_norm", (long long)dim, (long long)ld);
                for (int64_t r = 0; r < n; r++) {
                    const float *xr = hx + r * ld;
                    double s = 0, ss = 0, v = 0;
                    for (int64_t i = 0; i < dim; i++) s += xr[i], ss += (double)xr[i] * xr[i];
                    const double mean = s / (double)dim;
                    for (int64_t i = 0; i < dim; i++) v += (xr[i] - mean) * (xr[i] - mean);
                    for (int64_t i = 0; i < dim; i++) {
                        const double ref = kind ? (xr[i] - mean) / sqrt(v / (double)dim + eps) * hw[i] + hbias[i]
                                                : xr[i] / sqrt(ss / (double)dim + eps) * hw[i];
                        const double d = fabs(y[r * dim + i] - ref) / (fabs(ref) + 1.0);
                        if (!(d <= maxerr[kind])) maxerr[kind] = d;
                    }
                }
                T_CHECK(maxerr[kind] < 1e-6, "%s dim=%lld: rel err %.3e", kind ? "layer_norm" : "rms_norm",
                        (long long)dim, maxerr[kind]);
            }
            /* add + norm, with and without b: fused (all rows, then per row) vs cuk_add + cuk_rms_norm */
            for (int wb = 0; wb < 2; wb++) {
                CK(cudaMemcpy(dx1, dx, N * 4, cudaMemcpyDeviceToDevice));
                CK(cudaMemcpy(dx2, dx, N * 4, cudaMemcpyDeviceToDevice));
                const cuk_add_rms_norm_args an = {dx1, ld, da, wb ? db : NULL, ld, dw, dy, ld, n, dim, eps};
                ok &= cuk_add_rms_norm(&an, NULL, &e) == G5_OK;
                for (int64_t r = 0; r < n; r++) {
                    const float *ar = da + r * ld;
                    if (wb) {
                        ok &= cuk_add(da + r * ld, db + r * ld, dt, dim, NULL, &e) == G5_OK;
                        ar = dt;
                    }
                    ok &= cuk_add(dx2 + r * ld, ar, dx2 + r * ld, dim, NULL, &e) == G5_OK;
                }
                ok &= cuk_rms_norm(dx2, ld, dw, dy1, ld, n, dim, eps, NULL, &e) == G5_OK;
                get_rows(y, dy, n, ld, dim);
                get_rows(y1, dy1, n, ld, dim);
                get_rows(x1, dx1, n, ld, dim);
                get_rows(x2, dx2, n, ld, dim);
                T_CHECK(ok, "add_rms_norm launch: %s", e.msg);
                T_CHECK(same_bits(x1, x2, (size_t)(n * dim)) && same_bits(y, y1, (size_t)(n * dim)),
                        "add_rms_norm dim=%lld ld=%lld b=%d: not cuk_add + cuk_rms_norm bit for bit", (long long)dim,
                        (long long)ld, wb);
                CK(cudaMemcpy(dx1, dx, N * 4, cudaMemcpyDeviceToDevice));
                for (int64_t r = 0; r < n; r++)
                    ok &= cuk_add_rms_norm(&(cuk_add_rms_norm_args){dx1 + r * ld, ld, da + r * ld, wb ? db + r * ld : NULL,
                                                                    ld, dw, dy1 + r * ld, ld, 1, dim, eps},
                                           NULL, &e) == G5_OK;
                get_rows(y1, dy1, n, ld, dim);
                get_rows(x2, dx1, n, ld, dim);
                T_CHECK(ok && same_bits(y, y1, (size_t)(n * dim)) && same_bits(x1, x2, (size_t)(n * dim)),
                        "add_rms_norm dim=%lld: rows differ with n_rows", (long long)dim);
            }
            printf("norms dim=%lld ld=%lld: rms rel err %.2e, layer %.2e; n_rows-independent, add fused == unfused\n",
                   (long long)dim, (long long)ld, maxerr[0], maxerr[1]);
            free(hx), free(ha), free(hb), free(hw), free(hbias), free(y), free(y1), free(x1), free(x2);
            cudaFree(dx), cudaFree(da), cudaFree(db), cudaFree(dw), cudaFree(dbias), cudaFree(dy), cudaFree(dy1);
            cudaFree(dx1), cudaFree(dx2), cudaFree(dt);
        }
}

/* RoPE of the q layout [n][H][nope + rope] (rope part at nope): all tokens vs per token, and vs
 * the host's rotation (cos/sin from the host libm: a last-bit tolerance). */
static void test_rope(void) {
    const int64_t n = 3, H = 70, NOPE = 192, R = 64, W = NOPE + R; /* 70 heads: past the preloaded pairs */
    const float theta = 1e6f;
    const size_t N = (size_t)(n * H * W);
    float *hx = rand_buf(N, -2, 2), *y = xmalloc(N * 4), *y1 = xmalloc(N * 4);
    int32_t hpos[3] = {0, 1037, 200000};
    float *dx = dup_d(hx, N * 4), *dx1 = dup_d(hx, N * 4);
    int32_t *dpos = dup_d(hpos, sizeof hpos);
    g5_error e = {0};
    int ok = cuk_rope(&(cuk_rope_args){dx, n, H * W, H, W, NOPE, R, theta, dpos}, NULL, &e) == G5_OK;
    for (int64_t t = 0; t < n; t++)
        ok &= cuk_rope(&(cuk_rope_args){dx1 + t * H * W, 1, H * W, H, W, NOPE, R, theta, dpos + t}, NULL, &e) == G5_OK;
    get(y, dx, N * 4);
    get(y1, dx1, N * 4);
    T_CHECK(ok, "rope: %s", e.msg);
    T_CHECK(same_bits(y, y1, N), "rope: rows differ with n_tok");
    double mx = 0;
    int untouched = 1;
    for (int64_t t = 0; t < n; t++)
        for (int64_t h = 0; h < H; h++) {
            const float *xr = hx + (t * H + h) * W, *yr = y + (t * H + h) * W;
            for (int64_t i = 0; i < NOPE; i++) untouched &= bits(xr[i]) == bits(yr[i]);
            for (int64_t i = 0; i < R / 2; i++) {
                const float inv = 1.0f / powf(theta, (float)(2 * i) / (float)R);
                const float ang = (float)hpos[t] * inv;
                const double c = (float)cos((double)ang), s = (float)sin((double)ang);
                const double a = xr[NOPE + 2 * i], b = xr[NOPE + 2 * i + 1];
                const double r0 = a * c - b * s, r1 = a * s + b * c;
                const double d0 = fabs(yr[NOPE + 2 * i] - r0), d1 = fabs(yr[NOPE + 2 * i + 1] - r1);
                if (!(d0 <= mx)) mx = d0;
                if (!(d1 <= mx)) mx = d1;
            }
        }
    printf("rope H=%lld: max abs err %.2e vs host, n_tok-independent\n", (long long)H, mx);
    T_CHECK(untouched, "rope: wrote outside the rotated part");
    T_CHECK(mx < 2e-6, "rope: max abs err %.3e", mx);
    free(hx), free(y), free(y1);
    cudaFree(dx), cudaFree(dx1), cudaFree(dpos);
}

/* n rows of ld floats in [-3, 3): row 1 with an infinity, row 2 all zero, row 3 with a NaN (where
 * there are so many rows). */
static float *rows_special(int64_t n, int64_t ld, int64_t dim) {
    float *h = rand_buf((size_t)(n * ld), -3, 3);
    if (n > 1) h[ld + dim / 3] = INFINITY;
    if (n > 2) memset(h + 2 * ld, 0, (size_t)ld * 4);
    if (n > 3) h[3 * ld + dim - 1] = NAN;
    return h;
}

/* Device buffer of n bytes filled with 0xff (the same poison on both sides of a comparison). */
static void *poisoned(size_t n) {
    void *d = dalloc(n);
    CK(cudaMemset(d, 0xff, n));
    return d;
}

static int same_dev(const void *a, const void *b, size_t n) {
    uint8_t *ha = xmalloc(n), *hb = xmalloc(n);
    get(ha, a, n);
    get(hb, b, n);
    const int same = memcmp(ha, hb, n) == 0;
    free(ha), free(hb);
    return same;
}

/* cuk_norm_q8 vs cuk_rms_norm / cuk_add_rms_norm then cuk_q8_quantize: x, y, q, ds bit for bit. */
static void test_norm_q8(void) {
    static const int64_t dims[] = {512, 2048, 6144, 16384};
    const float eps = 1e-5f;
    int cases = 0;
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
        for (int v = 0; v < 12; v++) {
            const int64_t dim = dims[di], n = v % 2 ? 5 : 1, planes = 1 + (v / 2) % 2, add = v / 4; /* add: 0, a, a + b */
            const int64_t ld = v % 3 == 2 ? dim + 1 : dim, ldq = planes * dim, ldds = planes * dim / 16; /* dim + 1: rows not 16-byte aligned */
            const size_t N = (size_t)(n * ld) * 4, NQ = (size_t)(n * ldq), ND = (size_t)(n * ldds) * 4;
            T_CHECK(cuk_norm_q8_fits(dim), "norm_q8_fits(%lld)", (long long)dim);
            float *hx = rows_special(n, ld, dim), *ha = rand_buf((size_t)(n * ld), -1, 1), *hb = rand_buf((size_t)(n * ld), -1, 1);
            float *hw = rand_buf((size_t)dim, 0.5f, 1.5f);
            float *dx0 = dup_d(hx, N), *dx1 = dup_d(hx, N), *da = dup_d(ha, N), *db = dup_d(hb, N);
            float *dw = dup_d(hw, (size_t)dim * 4);
            float *dy0 = poisoned(N), *dy1 = poisoned(N), *dd0 = poisoned(ND), *dd1 = poisoned(ND);
            int8_t *dq0 = poisoned(NQ), *dq1 = poisoned(NQ);
            g5_error e = {0};
            const cuk_add_rms_norm_args an0 = {dx0, ld, da, add == 2 ? db : NULL, ld, dw, dy0, ld, n, dim, eps};
            int ok = (add ? cuk_add_rms_norm(&an0, NULL, &e) : cuk_rms_norm(dx0, ld, dw, dy0, ld, n, dim, eps, NULL, &e)) == G5_OK;
            ok = ok && cuk_q8_quantize(&(cuk_q8_quantize_args){dy0, ld, dim, n, dq0, ldq, dd0, ldds, (int32_t)planes}, NULL,
                                       &e) == G5_OK;
            const cuk_norm_q8_args fa = {{dx1, ld, add ? da : NULL, add == 2 ? db : NULL, ld, dw, dy1, ld, n, dim, eps},
                                         dq1, ldq, dd1, ldds, (int32_t)planes};
            ok = ok && cuk_norm_q8(&fa, NULL, &e) == G5_OK;
            T_CHECK(ok, "norm_q8 dim=%lld: %s", (long long)dim, e.msg);
            const int same = same_dev(dx0, dx1, N) && same_dev(dy0, dy1, N) && same_dev(dq0, dq1, NQ) && same_dev(dd0, dd1, ND);
            T_CHECK(same, "norm_q8 dim=%lld n=%lld planes=%lld add=%d ld=%lld: not the separate launches' bits",
                    (long long)dim, (long long)n, (long long)planes, (int)add, (long long)ld);
            cases += same;
            free(hx), free(ha), free(hb), free(hw);
            cudaFree(dx0), cudaFree(dx1), cudaFree(da), cudaFree(db), cudaFree(dw), cudaFree(dy0), cudaFree(dy1);
            cudaFree(dd0), cudaFree(dd1), cudaFree(dq0), cudaFree(dq1);
        }
    /* in place (q_a_norm): y == x */
    {
        const int64_t dim = 2048, n = 4;
        const size_t N = (size_t)(n * dim) * 4, NQ = (size_t)(n * 2 * dim), ND = (size_t)(n * 2 * dim / 16) * 4;
        float *hx = rows_special(n, dim, dim), *hw = rand_buf((size_t)dim, 0.5f, 1.5f);
        float *dx0 = dup_d(hx, N), *dx1 = dup_d(hx, N), *dw = dup_d(hw, (size_t)dim * 4);
        float *dd0 = poisoned(ND), *dd1 = poisoned(ND);
        int8_t *dq0 = poisoned(NQ), *dq1 = poisoned(NQ);
        g5_error e = {0};
        int ok = cuk_rms_norm(dx0, dim, dw, dx0, dim, n, dim, 1e-5f, NULL, &e) == G5_OK &&
                 cuk_q8_quantize(&(cuk_q8_quantize_args){dx0, dim, dim, n, dq0, 2 * dim, dd0, 2 * dim / 16, 2}, NULL, &e) == G5_OK;
        ok = ok && cuk_norm_q8(&(cuk_norm_q8_args){{dx1, dim, NULL, NULL, 0, dw, dx1, dim, n, dim, 1e-5f}, dq1, 2 * dim, dd1,
                                                   2 * dim / 16, 2},
                               NULL, &e) == G5_OK;
        T_CHECK(ok, "norm_q8 in place: %s", e.msg);
        const int same = same_dev(dx0, dx1, N) && same_dev(dq0, dq1, NQ) && same_dev(dd0, dd1, ND);
        T_CHECK(same, "norm_q8 in place: not the separate launches' bits");
        cases += same;
        free(hx), free(hw);
        cudaFree(dx0), cudaFree(dx1), cudaFree(dw), cudaFree(dd0), cudaFree(dd1), cudaFree(dq0), cudaFree(dq1);
    }
    /* the widths it does not take are refused by name */
    static const int64_t bad[] = {576, 100, 12288};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        float *d = dalloc(16 * 16384 * 4);
        g5_error e = {0};
        T_CHECK(!cuk_norm_q8_fits(bad[i]), "norm_q8_fits(%lld) should be 0", (long long)bad[i]);
        const g5_status st = cuk_norm_q8(&(cuk_norm_q8_args){{d, bad[i], NULL, NULL, 0, d, d, bad[i], 1, bad[i], 1e-5f},
                                                             (int8_t *)(d + 4 * 16384), 2 * bad[i] + 64, d + 8 * 16384, 2 * bad[i], 2},
                                         NULL, &e);
        T_CHECK(st == G5_ERR_INVALID_ARG && strstr(e.msg, "norm_q8"), "norm_q8 dim=%lld refused (%s)", (long long)bad[i], e.msg);
        cudaFree(d);
    }
    printf("norm_q8: %d cases bit-identical to the separate launches\n", cases);
}

/* cuk_silu_mul_q8 vs cuk_silu_mul then cuk_q8_quantize, in place on g as the runtime calls it. */
static void test_silu_mul_q8(void) {
    static const int64_t dims[] = {64, 2048, 12288};
    int cases = 0;
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
        for (int v = 0; v < 4; v++) {
            const int64_t dim = dims[di], n = v % 2 ? 7 : 1, planes = 1 + v / 2, ld = dim;
            const int64_t ldq = planes * dim, ldds = planes * dim / 16;
            const size_t N = (size_t)(n * ld) * 4, NQ = (size_t)(n * ldq), ND = (size_t)(n * ldds) * 4;
            float *hg = rows_special(n, ld, dim), *hu = rand_buf((size_t)(n * ld), -2, 2);
            if (n > 4) hg[4 * ld] = 200.0f, hu[4 * ld] = 3e38f; /* a product past float's range */
            float *dg0 = dup_d(hg, N), *dg1 = dup_d(hg, N), *du = dup_d(hu, N);
            float *dd0 = poisoned(ND), *dd1 = poisoned(ND);
            int8_t *dq0 = poisoned(NQ), *dq1 = poisoned(NQ);
            g5_error e = {0};
            int ok = cuk_silu_mul(dg0, ld, du, ld, dg0, ld, n, dim, NULL, &e) == G5_OK &&
                     cuk_q8_quantize(&(cuk_q8_quantize_args){dg0, ld, dim, n, dq0, ldq, dd0, ldds, (int32_t)planes}, NULL,
                                     &e) == G5_OK;
            ok = ok && cuk_silu_mul_q8(&(cuk_silu_mul_q8_args){dg1, ld, du, ld, dg1, ld, n, dim, dq1, ldq, dd1, ldds,
                                                                (int32_t)planes},
                                       NULL, &e) == G5_OK;
            T_CHECK(ok, "silu_mul_q8 dim=%lld: %s", (long long)dim, e.msg);
            const int same = same_dev(dg0, dg1, N) && same_dev(dq0, dq1, NQ) && same_dev(dd0, dd1, ND);
            T_CHECK(same, "silu_mul_q8 dim=%lld n=%lld planes=%lld: not the separate launches' bits", (long long)dim,
                    (long long)n, (long long)planes);
            cases += same;
            free(hg), free(hu);
            cudaFree(dg0), cudaFree(dg1), cudaFree(du), cudaFree(dd0), cudaFree(dd1), cudaFree(dq0), cudaFree(dq1);
        }
    float *d = dalloc(4096 * 4);
    g5_error e = {0};
    const g5_status st = cuk_silu_mul_q8(&(cuk_silu_mul_q8_args){d, 96, d, 96, d, 96, 1, 96, (int8_t *)(d + 1024), 192,
                                                                 d + 2048, 16, 2},
                                         NULL, &e);
    T_CHECK(st == G5_ERR_INVALID_ARG && strstr(e.msg, "dim=96"), "silu_mul_q8: two planes of 96 refused (%s)", e.msg);
    cudaFree(d);
    printf("silu_mul_q8: %d cases bit-identical to the separate launches\n", cases);
}

/* cuk_norm_rope vs cuk_rms_norm, the copy of the rope part and cuk_rope (the latent rows of the
 * attention stage: dim 512 + 64), and a clustered width; separate and in place. */
static void test_norm_rope(void) {
    static const struct { int64_t dim, rot, n; } cfg[] = {{512, 64, 1}, {512, 64, 6}, {6144, 64, 3}, {128, 128, 2}};
    int cases = 0;
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++)
        for (int inplace = 0; inplace < 2; inplace++) {
            const int64_t dim = cfg[c].dim, R = cfg[c].rot, n = cfg[c].n, W = dim + R;
            const size_t N = (size_t)(n * W) * 4;
            const float theta = 1e6f;
            int32_t hpos[6] = {0, 1, 4095, 200000, 77, 31999};
            float *hx = rows_special(n, W, dim), *hw = rand_buf((size_t)dim, 0.5f, 1.5f);
            float *dx0 = dup_d(hx, N), *dx1 = dup_d(hx, N), *dw = dup_d(hw, (size_t)dim * 4);
            float *dy0 = poisoned(N), *dy1 = inplace ? dx1 : poisoned(N);
            int32_t *dpos = dup_d(hpos, sizeof hpos);
            g5_error e = {0};
            int ok = cuk_rms_norm(dx0, W, dw, dy0, W, n, dim, 1e-5f, NULL, &e) == G5_OK;
            CK(cudaMemcpy2D(dy0 + dim, (size_t)W * 4, dx0 + dim, (size_t)W * 4, (size_t)R * 4, (size_t)n,
                            cudaMemcpyDeviceToDevice));
            ok = ok && cuk_rope(&(cuk_rope_args){dy0, n, W, 1, W, dim, R, theta, dpos}, NULL, &e) == G5_OK;
            ok = ok && cuk_norm_rope(&(cuk_norm_rope_args){dx1, W, dw, dy1, W, n, dim, 1e-5f, R, theta, dpos}, NULL, &e) == G5_OK;
            T_CHECK(ok, "norm_rope dim=%lld: %s", (long long)dim, e.msg);
            const int same = same_dev(dy0, dy1, N) && (inplace || same_dev(dx0, dx1, N)); /* x untouched */
            T_CHECK(same, "norm_rope dim=%lld rot=%lld n=%lld in place %d: not the separate launches' bits", (long long)dim,
                    (long long)R, (long long)n, inplace);
            cases += same;
            if (inplace && n > 2) { /* n - 1 rows: one row in place is any ldy */
                const g5_status rs = cuk_norm_rope(&(cuk_norm_rope_args){dx1, W, dw, dx1, W + 2, n - 1, dim, 1e-5f, R, theta,
                                                                         dpos}, NULL, &e);
                T_CHECK(rs == G5_ERR_INVALID_ARG && strstr(e.msg, "ldx"), "norm_rope refused: in place, ldy != ldx (%s)", e.msg);
            }
            free(hx), free(hw);
            cudaFree(dx0), cudaFree(dx1), cudaFree(dw), cudaFree(dy0), cudaFree(dpos);
            if (!inplace) cudaFree(dy1);
        }
    printf("norm_rope: %d cases bit-identical to the separate launches\n", cases);
}

/* cuk_idx_prep vs its four separate launches, bit for bit (fused shapes and the fallback), with
 * and without the attention query's RoPE (q2: 64 heads of 192 + 64, or 3 of 40 + 32 with the
 * tokens further apart, against cuk_rope on it); without the indexer query (n_head 0) the key
 * and q2 alone, the same bits. */
static void test_idx_prep(void) {
    static const struct { int ih, id, r, h2, nope2, pad2; } cfg[] = {
        {32, 128, 64, 0, 0, 0}, {4, 64, 32, 0, 0, 0}, {3, 100, 64, 0, 0, 0}, {2, 256, 64, 0, 0, 0},
        {32, 128, 64, 64, 192, 0}, {4, 64, 32, 3, 40, 7}, {2, 256, 64, 5, 192, 0}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        const int n = 5, IH = cfg[c].ih, ID = cfg[c].id, R = cfg[c].r;
        const int H2 = cfg[c].h2, HS2 = cfg[c].nope2 + R;
        const int64_t TS2 = (int64_t)H2 * HS2 + cfg[c].pad2;
        const size_t N2 = (size_t)(n * TS2);
        float *hq2 = rand_buf(N2 ? N2 : 1, -2, 2), *q2a = dup_d(hq2, (N2 ? N2 : 1) * 4), *q2b = dup_d(hq2, (N2 ? N2 : 1) * 4);
        const float theta = 1e4f, eps = 1e-6f, ws = (float)(1.0 / sqrt((double)ID * IH));
        const size_t NQ = (size_t)n * IH * ID, NK = (size_t)n * ID, NW = (size_t)n * IH;
        float *hq = rand_buf(NQ, -2, 2), *hk = rand_buf(NK, -2, 2), *hw = rand_buf(NW, -1, 1);
        float *hkw = rand_buf((size_t)ID, 0.5f, 1.5f), *hkb = rand_buf((size_t)ID, -0.5f, 0.5f);
        int32_t hpos[5] = {0, 5, 77, 4095, 123456};
        float *q1 = dup_d(hq, NQ * 4), *k1 = dup_d(hk, NK * 4), *w1 = dup_d(hw, NW * 4);
        float *q2 = dup_d(hq, NQ * 4), *k2 = dup_d(hk, NK * 4), *w2 = dup_d(hw, NW * 4);
        float *dkw = dup_d(hkw, (size_t)ID * 4), *dkb = dup_d(hkb, (size_t)ID * 4);
        int32_t *dpos = dup_d(hpos, sizeof hpos);
        g5_error e = {0};
        const cuk_idx_prep_args ip = {q1, k1, w1, dkw, dkb, n, IH, ID, R, theta, dpos, eps, ws,
                                      H2 ? q2a : NULL, TS2, H2, HS2, cfg[c].nope2};
        int ok = cuk_idx_prep(&ip, NULL, &e) == G5_OK;
        if (H2) ok &= cuk_rope(&(cuk_rope_args){q2b, n, TS2, H2, HS2, cfg[c].nope2, R, theta, dpos}, NULL, &e) == G5_OK;
        ok &= cuk_rope(&(cuk_rope_args){q2, n, (int64_t)IH * ID, IH, ID, 0, R, theta, dpos}, NULL, &e) == G5_OK;
        ok &= cuk_layer_norm(&(cuk_layer_norm_args){k2, ID, dkw, dkb, k2, ID, n, ID, eps}, NULL, &e) == G5_OK;
        ok &= cuk_rope(&(cuk_rope_args){k2, n, ID, 1, ID, 0, R, theta, dpos}, NULL, &e) == G5_OK;
        ok &= cuk_scale(w2, (int64_t)NW, ws, NULL, &e) == G5_OK;
        T_CHECK(ok, "idx_prep: %s", e.msg);
        float *a = xmalloc(NQ * 4), *b = xmalloc(NQ * 4);
        get(a, q1, NQ * 4);
        get(b, q2, NQ * 4);
        const int sq = same_bits(a, b, NQ);
        get(a, k1, NK * 4);
        get(b, k2, NK * 4);
        const int sk = same_bits(a, b, NK);
        get(a, w1, NW * 4);
        get(b, w2, NW * 4);
        const int sw = same_bits(a, b, NW);
        const int s2 = !H2 || same_dev(q2a, q2b, N2 * 4);
        printf("idx_prep IH=%d ID=%d R=%d q2 %d heads: q %s, k %s, w %s, q2 %s vs the separate launches\n", IH, ID, R, H2,
               sq ? "same" : "DIFF", sk ? "same" : "DIFF", sw ? "same" : "DIFF", s2 ? "same" : "DIFF");
        T_CHECK(sq && sk && sw && s2, "idx_prep IH=%d ID=%d q2 %d heads: not the separate launches' bits", IH, ID, H2);
        { /* n_head 0 (no indexer query or weights, q and w NULL): the key and q2 alone, the same bits */
            float *k3 = dup_d(hk, NK * 4), *q2c = dup_d(hq2, (N2 ? N2 : 1) * 4);
            cuk_idx_prep_args kn = ip;
            kn.q = NULL, kn.w = NULL, kn.n_head = 0, kn.k = k3, kn.q2 = H2 ? q2c : NULL;
            T_CHECK(cuk_idx_prep(&kn, NULL, &e) == G5_OK, "idx_prep without a query: %s", e.msg);
            const int k_same = same_dev(k3, k1, NK * 4), q2_same = !H2 || same_dev(q2c, q2a, N2 * 4);
            T_CHECK(k_same && q2_same, "idx_prep IH=%d ID=%d q2 %d heads without a query: key %s, q2 %s", IH, ID, H2,
                    k_same ? "same" : "DIFF", q2_same ? "same" : "DIFF");
            kn.n_head = -1;
            T_CHECK(cuk_idx_prep(&kn, NULL, &e) == G5_ERR_INVALID_ARG, "idx_prep: n_head -1 refused");
            kn.n_head = IH;
            T_CHECK(cuk_idx_prep(&kn, NULL, &e) == G5_ERR_INVALID_ARG, "idx_prep: heads without q and w refused");
            cudaFree(k3), cudaFree(q2c);
        }
        if (H2) { /* heads too narrow for the rotated part: refused */
            cuk_idx_prep_args bad = ip;
            bad.head_stride2 = cfg[c].nope2 + R - 2;
            T_CHECK(cuk_idx_prep(&bad, NULL, &e) == G5_ERR_INVALID_ARG && strstr(e.msg, "q2"), "idx_prep: narrow q2 refused (%s)",
                    e.msg);
            bad = ip;
            bad.q2 = q1; /* its first pairs are loaded before q is written: refused */
            T_CHECK(cuk_idx_prep(&bad, NULL, &e) == G5_ERR_INVALID_ARG && strstr(e.msg, "overlaps"),
                    "idx_prep: q2 over q refused (%s)", e.msg);
        }
        free(hq2);
        cudaFree(q2a), cudaFree(q2b);
        free(hq), free(hk), free(hw), free(hkw), free(hkb), free(a), free(b);
        cudaFree(q1), cudaFree(k1), cudaFree(w1), cudaFree(q2), cudaFree(k2), cudaFree(w2);
        cudaFree(dkw), cudaFree(dkb), cudaFree(dpos);
    }
}

/* runtime/cpu/model.c's selection scan on given scores (the specification the kernel must meet). */
static int ref_better(const float *v, int a, int b) { return v[a] > v[b] || (v[a] == v[b] && a < b); }

static void ref_pick(int NE, int U, int G, int TG, const float *score, const float *bias, int32_t *ch) {
    float choice[1024], gscore[64];
    uint8_t allowed[1024];
    const int gs = NE / G;
    for (int e = 0; e < NE; e++) choice[e] = score[e] + (bias ? bias[e] : 0.0f), allowed[e] = 1;
    if (G > 1 && TG < G) {
        for (int g = 0; g < G; g++) {
            float b1 = -INFINITY, b2 = -INFINITY;
            for (int e = g * gs; e < (g + 1) * gs; e++) {
                if (choice[e] > b1) b2 = b1, b1 = choice[e];
                else if (choice[e] > b2) b2 = choice[e];
            }
            gscore[g] = gs >= 2 ? b1 + b2 : b1;
        }
        memset(allowed, 0, (size_t)NE);
        for (int k = 0; k < TG; k++) {
            int best = -1;
            for (int g = 0; g < G; g++)
                if (!allowed[g * gs] && (best < 0 || ref_better(gscore, g, best))) best = g;
            memset(allowed + best * gs, 1, (size_t)gs);
        }
    }
    for (int k = 0; k < U; k++) {
        int best = -1;
        for (int e = 0; e < NE; e++)
            if (allowed[e] && (best < 0 || ref_better(choice, e, best))) best = e;
        ch[k] = best;
        allowed[best] = 0;
    }
    for (int i = 1; i < U; i++)
        for (int j = i; j > 0 && ch[j - 1] > ch[j]; j--) {
            const int32_t t = ch[j];
            ch[j] = ch[j - 1];
            ch[j - 1] = t;
        }
}

/* Router inputs of one style for n tokens: 0 random, 1 few distinct values (ties), 2 ties at zero
 * (-inf logits, -0 biases), 3 some NaN logits, 4 NaN at experts 0 and 1 (the scan keeps a NaN
 * first eligible expert), 5 one value everywhere but a few larger ones crowded into one warp
 * per token (more than n_used ties inside a warp, at the n_used boundary), 6 infinities and
 * signed zeros in the logits, zero bias, 7 no bias pointer (NULL) and random logits. */
static void route_inputs(int style, int n, int NE, float *lg, float *bias) {
    for (int i = 0; i < n * NE; i++) {
        lg[i] = style == 0 || style == 7 ? unif(-4, 4) : (float)(int)unif(-3, 3);
        if ((style == 3 || style == 4) && rnd() % 7 == 0) lg[i] = NAN;
    }
    if (style == 4)
        for (int t = 0; t < n; t++) lg[t * NE] = lg[t * NE + 1] = NAN;
    for (int i = 0; i < NE; i++) bias[i] = style == 0 ? unif(-0.5f, 0.5f) : 0.0f;
    if (style == 2)
        for (int i = 0; i < NE; i += 3) bias[i] = -0.0f;
    if (style == 2)
        for (int i = 0; i < n * NE; i += 5) lg[i] = -INFINITY;
    if (style == 5)
        for (int t = 0; t < n; t++) {
            const int w0 = (t * 32) % NE;
            for (int e = 0; e < NE; e++) lg[t * NE + e] = 1.0f;
            for (int e = w0; e < w0 + 32 && e < NE; e++) lg[t * NE + e] = rnd() % 3 ? 2.0f : 3.0f;
        }
    if (style == 6) {
        static const float v[] = {INFINITY, -INFINITY, 0.0f, -0.0f, 1.0f};
        for (int i = 0; i < n * NE; i++) lg[i] = v[rnd() % 5];
    }
}

/* One cuk_moe_route call on a copy of lg. */
static void route_run(const cuk_route_args *a0, const float *lg, const float *dbias, int32_t *ids,
                      float *w, float *sc) {
    const int n = a0->n_tok, NE = a0->n_expert, U = a0->n_used;
    float *dlg = dup_d(lg, (size_t)n * NE * 4), *dw = dalloc((size_t)n * U * 4);
    int32_t *dids = dalloc((size_t)n * U * 4);
    cuk_route_args a = *a0;
    a.logits = dlg;
    a.bias = dbias;
    a.ids = dids;
    a.wts = dw;
    g5_error e = {0};
    T_CHECK(cuk_moe_route(&a, NULL, &e) == G5_OK, "route: %s", e.msg);
    get(ids, dids, (size_t)n * U * 4);
    get(w, dw, (size_t)n * U * 4);
    get(sc, dlg, (size_t)n * NE * 4);
    cudaFree(dlg), cudaFree(dids), cudaFree(dw);
}

static void test_route(void) {
    static const struct { int ne, u, g, tg, gating; } cfg[] = {
        {256, 8, 1, 1, 2}, {256, 8, 8, 4, 2}, {160, 6, 1, 1, 2}, {1024, 16, 1, 1, 2}, {64, 6, 8, 3, 1},
        {256, 8, 1, 1, 1}, {100, 7, 1, 1, 2}, {1024, 64, 1, 1, 2}, {256, 40, 1, 1, 2}, {96, 8, 4, 2, 1},
        {33, 1, 1, 1, 2}, {256, 32, 1, 1, 2}, {256, 33, 1, 1, 2}, {256, 8, 16, 1, 2}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++)
        for (int style = 0; style < 8; style++) {
            const int NE = cfg[c].ne, U = cfg[c].u, G = cfg[c].g, TG = cfg[c].tg, n = 9;
            float *lg = xmalloc((size_t)n * NE * 4), *bias = xmalloc((size_t)NE * 4);
            route_inputs(style, n, NE, lg, bias);
            float *dbias = style == 7 ? NULL : dup_d(bias, (size_t)NE * 4);
            const cuk_route_args a = {NULL, NE, NULL, n, NE, U, G, TG, cfg[c].gating, 1, 2.5f, NULL, NULL, NULL};
            int32_t *ids = xmalloc((size_t)n * U * 4), *ref = xmalloc((size_t)n * U * 4);
            float *w = xmalloc((size_t)n * U * 4), *sc = xmalloc((size_t)n * NE * 4);
            route_run(&a, lg, dbias, ids, w, sc);
            int bad = 0;
            double werr = 0;
            for (int t = 0; t < n; t++) {
                const float *s = sc + (size_t)t * NE;
                ref_pick(NE, U, G, TG, s, style == 7 ? NULL : bias, ref + (size_t)t * U);
                double sum = 0;
                for (int k = 0; k < U; k++) sum += s[ref[t * U + k]];
                for (int k = 0; k < U; k++) {
                    const int i = t * U + k;
                    bad += ids[i] != ref[i];
                    const float rw = (float)((float)(s[ref[i]] / (sum + 1e-20)) * 2.5f);
                    if (bits(rw) != bits(w[i]) && !(is_nan(rw) && is_nan(w[i]))) werr += 1;
                }
            }
            printf("route NE=%d U=%d groups %d/%d gating %d style %d: %d ids differ, %.0f weights differ\n", NE, U, TG, G,
                   cfg[c].gating, style, bad, werr);
            T_CHECK(bad == 0, "route NE=%d style %d: %d ids differ from the scan", NE, style, bad);
            T_CHECK(werr == 0, "route NE=%d style %d: weights differ", NE, style);
            free(ids), free(w), free(sc);
            free(lg), free(bias), free(ref);
            cudaFree(dbias);
        }
}

/* A routing launch of one token with a plan (the decode step's form) gives the ids and weights of
 * the launch without it, and the plan cuk_moe_plan makes of them: its group count, the groups'
 * experts, starts and counts, the pair list, and every pair's flag (a weight-0 pair, from scale 0,
 * is flagged 0 and in no group; at scale 0 only NaN weights, from NaN logits, are computed). */
static void test_route_plan(void) {
    static const struct { int ne, u, g, tg, gating; float scale; } cfg[] = {
        {256, 8, 8, 4, 2, 2.5f}, {64, 6, 8, 3, 1, 1.0f}, {1024, 64, 1, 1, 2, 2.5f}, {33, 1, 1, 1, 2, 1.0f},
        {256, 8, 1, 1, 2, 0.0f}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++)
        for (int style = 0; style < 8; style++) {
            const int NE = cfg[c].ne, U = cfg[c].u, P = U, W = (int)cuk_moe_plan_words(1, U);
            float *lg = xmalloc((size_t)NE * 4), *bias = xmalloc((size_t)NE * 4);
            route_inputs(style, 1, NE, lg, bias);
            float *dbias = style == 7 ? NULL : dup_d(bias, (size_t)NE * 4);
            float *dlg = dup_d(lg, (size_t)NE * 4), *dlg2 = dup_d(lg, (size_t)NE * 4), *dw = dalloc((size_t)U * 4);
            float *dw2 = dalloc((size_t)U * 4);
            int32_t *dids = dalloc((size_t)U * 4), *dids2 = dalloc((size_t)U * 4);
            int32_t *dplan = dalloc((size_t)W * 4), *dref = dalloc((size_t)W * 4);
            cuk_route_args a = {dlg, NE, dbias, 1, NE, U, cfg[c].g, cfg[c].tg, cfg[c].gating, 1, cfg[c].scale,
                                dids, dw, dplan};
            g5_error e = {0};
            T_CHECK(cuk_moe_route(&a, NULL, &e) == G5_OK, "route with a plan: %s", e.msg);
            a.logits = dlg2, a.ids = dids2, a.wts = dw2, a.plan = NULL;
            T_CHECK(cuk_moe_route(&a, NULL, &e) == G5_OK, "route: %s", e.msg);
            const cuk_moe_plan_args pa = {dids, dw, 1, U, U, U, NE, dref};
            T_CHECK(cuk_moe_plan(&pa, NULL, &e) == G5_OK, "plan: %s", e.msg);
            int32_t *ids = xmalloc((size_t)U * 4), *ids2 = xmalloc((size_t)U * 4);
            int32_t *pl = xmalloc((size_t)W * 4), *ref = xmalloc((size_t)W * 4);
            float *w = xmalloc((size_t)U * 4), *w2 = xmalloc((size_t)U * 4);
            get(ids, dids, (size_t)U * 4), get(ids2, dids2, (size_t)U * 4);
            get(w, dw, (size_t)U * 4), get(w2, dw2, (size_t)U * 4);
            get(pl, dplan, (size_t)W * 4), get(ref, dref, (size_t)W * 4);
            T_CHECK(!memcmp(ids, ids2, (size_t)U * 4) && !memcmp(w, w2, (size_t)U * 4),
                    "route NE=%d style %d: a plan changes the ids or weights", NE, style);
            const int ng = ref[0];
            int bad = pl[0] != ng;
            for (int gi = 0; gi < ng && !bad && gi < P; gi++)
                for (int part = 0; part < 3; part++) bad |= pl[1 + part * P + gi] != ref[1 + part * P + gi];
            for (int i = 0; i < ng && !bad && i < P; i++) bad |= pl[1 + 3 * P + i] != ref[1 + 3 * P + i];
            for (int p = 0; p < P && !bad; p++) bad |= pl[1 + 4 * P + p] != ref[1 + 4 * P + p];
            T_CHECK(!bad, "route NE=%d U=%d scale %g style %d: its plan differs from cuk_moe_plan's (groups %d / %d)", NE,
                    U, (double)cfg[c].scale, style, pl[0], ng);
            int nz = 0; /* pairs computed: weight not 0 (a NaN logit's NaN weight counts) */
            for (int k = 0; k < U; k++) nz += !(w[k] == 0.0f);
            T_CHECK(ng == nz && (cfg[c].scale != 0.0f || style == 3 || style == 4 || nz == 0), "route NE=%d scale %g style %d: %d groups for %d pairs of weight not 0",
                    NE, (double)cfg[c].scale, style, ng, nz);
            free(ids), free(ids2), free(pl), free(ref), free(w), free(w2), free(lg), free(bias);
            cudaFree(dbias), cudaFree(dlg), cudaFree(dlg2), cudaFree(dw), cudaFree(dw2), cudaFree(dids), cudaFree(dids2);
            cudaFree(dplan), cudaFree(dref);
        }
    /* a plan of more than one token is refused */
    const cuk_route_args a = {(float *)(void *)16, 8, NULL, 2, 8, 2, 1, 1, 2, 1, 1.0f, (int32_t *)(void *)16,
                              (float *)(void *)16, (int32_t *)(void *)16};
    g5_error e = {0};
    T_CHECK(cuk_moe_route(&a, NULL, &e) == G5_ERR_INVALID_ARG, "route: a plan of 2 tokens accepted");
}

int main(void) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        printf("FAIL: no CUDA device\n");
        t_failed++;
        return t_report(G5_TEST_NAME);
    }
    test_norms();
    test_rope();
    test_idx_prep();
    test_norm_q8();
    test_silu_mul_q8();
    test_norm_rope();
    test_route();
    test_route_plan();
    return t_report(G5_TEST_NAME);
}
