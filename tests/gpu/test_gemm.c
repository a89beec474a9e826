/* The prefill GEMM path's kernels (cuda/cuk_gemm.h) against the CPU, and its timing against the
 * GEMV kernels at GLM-5's per-rank shapes.
 *
 * 1. cuk_gemm per compute (f32, tf32, bf16) against a float64 reference with padded leading
 *    dimensions (padding poisoned, must stay so); f32 held to float32 accuracy, which TF32 input
 *    rounding could not meet (so the pedantic no-TF32 setting is in effect).
 * 2. cuk_moe_group (token lists per expert, localized experts, an invalid id counted),
 *    cuk_gather_rows (NaN row for a bad id), cuk_scatter_add_rows (bit-exact vs the CPU).
 * 3. "gemm bench" lines (printed, never asserted): the GEMV kernels in launches of 16 rows
 *    against dequantize + GEMM (what runtime/gpu/gpu_linear.c does for a weight that fits its tile)
 *    for each compute, n = 16 .. 4096 rows, and the first n at which each GEMM is faster: the
 *    numbers to tune rt_gpu_opts.gemm_min / gemm_min_expert with.
 * Runs on the device only (`make test-gpu`); needs no reference data files. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuk.h"
#include "cuda/cuk_gemm.h"
#include "cuda/cuk_model.h"
#include "format/quant.h"
#include "tests/test_util.h"

#define G5_TEST_NAME "test_gemm"
#define G5_TEST_SEED 0x6e33a11c0ffeeull
#include "tests/gpu/gpu_test_util.h"

/* cuk_gemm against a float64 reference, padded leading dimensions (the padding must stay
 * untouched). F32 must be float32 arithmetic (error 1e-7 .. 1e-6; TF32-rounded inputs would give
 * ~1e-4: the pedantic no-TF32 setting took effect); BF16 is compared with the bf16-rounded operands,
 * so only its float32 accumulation remains. The MoE grouping (vs a CPU listing, localized
 * experts, an invalid id counted), gather (NaN for a bad row) and the weighted scatter-add
 * (bit-exact vs the CPU's separately rounded multiply and add). */
static void test_gemm_kernels(void) {
    g5_error e = {0};
    cuk_blas *b = NULL;
    T_CHECK(cuk_blas_create(&b, &e) == G5_OK, "cublas handle: %s", e.msg);
    if (!b) return;
    static const int64_t ks[] = {512, 6144};
    for (size_t ki = 0; ki < 2; ki++) {
        const int64_t k = ks[ki], m = 300, n = 37, ldw = k + 8, ldx = k + 4, ldy = m + 3;
        float *w = xmalloc((size_t)m * ldw * 4), *x = xmalloc((size_t)n * ldx * 4), *y = xmalloc((size_t)n * ldy * 4);
        uint16_t *wb = xmalloc((size_t)m * ldw * 2), *xb = xmalloc((size_t)n * ldx * 2);
        for (int64_t i = 0; i < m * ldw; i++) {
            w[i] = unif(-1, 1);
            wb[i] = quant_f32_to_bf16(w[i]);
        }
        for (int64_t i = 0; i < n * ldx; i++) {
            x[i] = unif(-1, 1);
            xb[i] = quant_f32_to_bf16(x[i]);
        }
        double *ref = xmalloc((size_t)n * m * 8), *refb = xmalloc((size_t)n * m * 8);
        for (int64_t t = 0; t < n; t++)
            for (int64_t i = 0; i < m; i++) {
                double s = 0, sb = 0;
                for (int64_t j = 0; j < k; j++) {
                    s += (double)w[i * ldw + j] * x[t * ldx + j];
                    sb += (double)quant_bf16_to_f32(wb[i * ldw + j]) * quant_bf16_to_f32(xb[t * ldx + j]);
                }
                ref[t * m + i] = s;
                refb[t * m + i] = sb;
            }
        void *dw = dup_d(w, (size_t)m * ldw * 4), *dx = dup_d(x, (size_t)n * ldx * 4);
        void *dwb = dup_d(wb, (size_t)m * ldw * 2), *dxb = dup_d(xb, (size_t)n * ldx * 2);
        float *dy = dalloc((size_t)n * ldy * 4);
        double errs[3] = {0, 0, 0};
        static const char *names[3] = {"f32", "tf32", "bf16"};
        for (uint32_t mode = 0; mode < 3; mode++) {
            CK(cudaMemset(dy, 0xFF, (size_t)n * ldy * 4));
            const int bf = mode == CUK_GEMM_BF16;
            cuk_gemm_args a = {mode, bf ? dwb : dw, ldw, bf ? dxb : dx, ldx, k, m, n, dy, ldy};
            T_CHECK(cuk_gemm(b, &a, NULL, &e) == G5_OK, "gemm %s: %s", names[mode], e.msg);
            get(y, dy, (size_t)n * ldy * 4);
            double num = 0, den = 0;
            uint64_t pad_bad = 0;
            for (int64_t t = 0; t < n; t++) {
                for (int64_t i = 0; i < m; i++) {
                    const double r = (bf ? refb : ref)[t * m + i], d = (double)y[t * ldy + i] - r;
                    num += d * d;
                    den += r * r;
                }
                for (int64_t i = m; i < ldy; i++) pad_bad += bits(y[t * ldy + i]) != POISON;
            }
            errs[mode] = num == num ? sqrt(num / den) : INFINITY;
            T_CHECK(pad_bad == 0, "gemm %s: %llu padding elements written", names[mode], (unsigned long long)pad_bad);
        }
        printf("gemm k=%lld m=%lld n=%lld: rel L2 vs float64: f32 %.2e, tf32 %.2e, bf16 %.2e (vs the bf16-rounded "
               "operands)\n", (long long)k, (long long)m, (long long)n, errs[0], errs[1], errs[2]);
        /* float32 sums over k = 6144: a few 1e-6 at most; TF32-rounded inputs alone give ~1e-4 */
        T_CHECK(errs[0] <= 1e-5, "gemm f32 k=%lld: rel err %.2e (float32 expected: TF32 in the f32 path?)",
                (long long)k, errs[0]);
        T_CHECK(errs[1] <= 5e-3, "gemm tf32 k=%lld: rel err %.2e", (long long)k, errs[1]);
        T_CHECK(errs[2] <= 1e-5, "gemm bf16 k=%lld: rel err %.2e vs the rounded operands", (long long)k, errs[2]);
        free(w), free(x), free(y), free(wb), free(xb), free(ref), free(refb);
        cudaFree(dw), cudaFree(dx), cudaFree(dwb), cudaFree(dxb), cudaFree(dy);
    }
    cuk_blas_free(b);

    /* grouping: 300 tokens, top-4 of 16 experts, this rank holds experts 4..11 */
    const int32_t NT = 300, TK = 4, NE = 16, E0 = 4, NL = 8;
    int32_t *ids = xmalloc((size_t)NT * TK * 4);
    float *wts = xmalloc((size_t)NT * TK * 4);
    for (int32_t t = 0; t < NT; t++) {
        int32_t pick[16] = {0}, got = 0;
        while (got < TK) {
            const int32_t id = (int32_t)(rnd() % NE);
            if (!pick[id]) pick[id] = 1, got++;
        }
        for (int32_t id = 0, s = 0; id < NE; id++)
            if (pick[id]) ids[t * TK + s++] = id;
        for (int32_t s = 0; s < TK; s++) wts[t * TK + s] = unif(0, 1);
    }
    int32_t *dids = dup_d(ids, (size_t)NT * TK * 4);
    float *dwts = dup_d(wts, (size_t)NT * TK * 4);
    const int64_t LDR = NT + 5;
    int32_t *drows = dalloc((size_t)NL * LDR * 4), *dcnt = dalloc((size_t)(NL + 1) * 4);
    float *drw = dalloc((size_t)NL * LDR * 4);
    CK(cudaMemset(dcnt, 0xFF, (size_t)(NL + 1) * 4));
    cuk_moe_group_args ga = {dids, dwts, NT, TK, TK, NE, E0, NL, drows, drw, LDR, dcnt};
    T_CHECK(cuk_moe_group(&ga, NULL, &e) == G5_OK, "moe_group: %s", e.msg);
    int32_t *rows = xmalloc((size_t)NL * LDR * 4), cnt[9];
    float *rw = xmalloc((size_t)NL * LDR * 4);
    get(rows, drows, (size_t)NL * LDR * 4);
    get(rw, drw, (size_t)NL * LDR * 4);
    get(cnt, dcnt, sizeof cnt);
    int gbad = cnt[NL] != 0;
    for (int32_t le = 0; le < NL; le++) {
        int32_t j = 0;
        for (int32_t t = 0; t < NT; t++)
            for (int32_t s = 0; s < TK; s++)
                if (ids[t * TK + s] == E0 + le) {
                    gbad += j >= cnt[le] || rows[le * LDR + j] != t || bits(rw[le * LDR + j]) != bits(wts[t * TK + s]);
                    j++;
                }
        gbad += j != cnt[le];
    }
    ids[7] = 99; /* an id outside [0, NE) is counted */
    CK(cudaMemcpy(dids, ids, (size_t)NT * TK * 4, cudaMemcpyHostToDevice));
    T_CHECK(cuk_moe_group(&ga, NULL, &e) == G5_OK, "moe_group: %s", e.msg);
    get(cnt, dcnt, sizeof cnt);
    T_CHECK(gbad == 0 && cnt[NL] == 1, "moe_group: %d list entries wrong, invalid ids counted %d (want 1)", gbad,
            cnt[NL]);

    /* gather rows 5, 0, 299, -1, 17 of x [300][70] (k = 64 of each) and scatter-add them back */
    const int64_t GK = 64, GLD = 70;
    float *gx = xmalloc((size_t)NT * GLD * 4), *gy = xmalloc((size_t)NT * GLD * 4), *go = xmalloc(5 * GK * 4);
    for (int64_t i = 0; i < NT * GLD; i++) gx[i] = unif(-2, 2), gy[i] = unif(-2, 2);
    const int32_t grows[5] = {5, 0, 299, -1, 17};
    const float gw[5] = {0.25f, -1.5f, 3.0f, 7.0f, 0.1f};
    float *dgx = dup_d(gx, (size_t)NT * GLD * 4), *dgy = dup_d(gy, (size_t)NT * GLD * 4), *dgo = dalloc(5 * GK * 4);
    int32_t *dgr = dup_d(grows, sizeof grows);
    float *dgw = dup_d(gw, sizeof gw);
    T_CHECK(cuk_gather_rows(dgx, GLD, NT, dgr, 5, GK, dgo, GK, NULL, &e) == G5_OK, "gather: %s", e.msg);
    get(go, dgo, 5 * GK * 4);
    int gat_bad = 0;
    for (int i = 0; i < 5; i++)
        for (int64_t c = 0; c < GK; c++)
            gat_bad += grows[i] < 0 ? !is_nan(go[i * GK + c]) : bits(go[i * GK + c]) != bits(gx[grows[i] * GLD + c]);
    T_CHECK(gat_bad == 0, "gather_rows: %d elements wrong", gat_bad);
    /* the NaN row's id is invalid: skipped by the scatter as well */
    T_CHECK(cuk_scatter_add_rows(dgo, GK, dgr, dgw, 5, GK, dgy, GLD, NT, NULL, &e) == G5_OK, "scatter: %s", e.msg);
    float *gy2 = xmalloc((size_t)NT * GLD * 4);
    get(gy2, dgy, (size_t)NT * GLD * 4);
    for (int i = 0; i < 5; i++)
        for (int64_t c = 0; c < GK && grows[i] >= 0; c++) {
            volatile float p = gw[i] * go[i * GK + c];
            gy[grows[i] * GLD + c] = gy[grows[i] * GLD + c] + p;
        }
    int sc_bad = 0;
    for (int64_t i = 0; i < NT * GLD; i++) sc_bad += bits(gy[i]) != bits(gy2[i]);
    T_CHECK(sc_bad == 0, "scatter_add_rows: %d elements differ from the CPU's", sc_bad);
    printf("moe_group / gather_rows / scatter_add_rows: lists %s, gather %s, scatter-add %s\n", gbad ? "WRONG" : "exact",
           gat_bad ? "WRONG" : "exact", sc_bad ? "WRONG" : "bit-exact");
    free(ids), free(wts), free(rows), free(rw), free(gx), free(gy), free(go), free(gy2);
    cudaFree(dids), cudaFree(dwts), cudaFree(drows), cudaFree(dcnt), cudaFree(drw);
    cudaFree(dgx), cudaFree(dgy), cudaFree(dgo), cudaFree(dgr), cudaFree(dgw);
}

/* One weight product of n rows the GEMM path's way: dequantize the whole weight into the
 * float32 tile (bf16: then round it and the input), then one GEMM. */
static g5_status gemm_path(cuk_blas *b, uint32_t mode, uint32_t type, const void *w, int64_t k, int64_t m,
                           const float *x, int64_t n, float *y, float *tile, void *tile16, void *xb, g5_error *e) {
    const cuk_dequant_rows_args dq = {.w_type = type, .w = w, .k = k, .n_rows_w = m, .n = m, .out = tile, .ldo = k};
    g5_status st = cuk_dequant_rows(&dq, NULL, e);
    const void *wt = tile, *xt = x;
    if (!st && mode == CUK_GEMM_BF16) {
        st = cuk_convert(tile, k, tile16, CUK_BF16, k, m, k, NULL, e);
        if (!st) st = cuk_convert(x, k, xb, CUK_BF16, k, n, k, NULL, e);
        wt = tile16;
        xt = xb;
    }
    const cuk_gemm_args a = {mode, wt, k, xt, k, k, m, n, y, m};
    return st ? st : cuk_gemm(b, &a, NULL, e);
}

static void bench_gemm(void) {
    static const struct { uint32_t type; int64_t k, m; const char *what; } shp[] = {
        {QT_Q4_K, 6144, 2048, "expert gate/up Q4_K"},
        {QT_Q5_K, 2048, 6144, "expert down Q5_K"},
        {QT_Q8_0, 6144, 4096, "attention Q8_0"},
    };
    static const int64_t ns[] = {16, 32, 64, 128, 256, 512, 1024, 4096};
    enum { NN = sizeof ns / sizeof ns[0] };
    g5_error e = {0};
    cuk_blas *b = NULL;
    T_CHECK(cuk_blas_create(&b, &e) == G5_OK, "cublas handle: %s", e.msg);
    if (!b) return;
    for (size_t si = 0; si < sizeof shp / sizeof shp[0]; si++) {
        const int64_t k = shp[si].k, m = shp[si].m, NMAX = ns[NN - 1];
        uint64_t rb;
        quant_row_bytes(shp[si].type, (uint64_t)k, &rb);
        const quant_type_info *qi = quant_type_get(shp[si].type);
        uint8_t *w = xmalloc(rb * m);
        quant_fill_random(shp[si].type, w, rb * m / qi->block_bytes, &g_rng);
        void *dw = dup_d(w, rb * m);
        free(w);
        float *hx = xmalloc((size_t)NMAX * k * 4);
        for (int64_t i = 0; i < NMAX * k; i++) hx[i] = unif(-1, 1);
        float *dx = dup_d(hx, (size_t)NMAX * k * 4), *dy = dalloc((size_t)NMAX * m * 4);
        free(hx);
        float *tile = dalloc((size_t)m * k * 4);
        void *tile16 = dalloc((size_t)m * k * 2), *xb = dalloc((size_t)NMAX * k * 2);
        double t_ms[4][NN];
        for (uint32_t v = 0; v < 4; v++) /* 0: GEMV, 1..3: GEMM f32, tf32, bf16 */
            for (int ni = 0; ni < NN; ni++) {
                const int64_t n = ns[ni];
                double best = 1e30;
                for (int rep = 0; rep < 4; rep++) { /* the first run warms up (cuBLAS plans, caches) */
                    CK(cudaDeviceSynchronize());
                    const double t0 = t_now_s();
                    g5_status st = G5_OK;
                    if (v == 0) {
                        for (int64_t r0 = 0; r0 < n && !st; r0 += CUK_GEMV_MAX_N) {
                            const cuk_gemv_args a = {shp[si].type, dw, k, m, dx + r0 * k, CUK_ACT_F32, k,
                                                     (int32_t)(n - r0 < CUK_GEMV_MAX_N ? n - r0 : CUK_GEMV_MAX_N),
                                                     dy + r0 * m, m};
                            st = cuk_gemv(&a, NULL, &e);
                        }
                    } else {
                        st = gemm_path(b, v - 1, shp[si].type, dw, k, m, dx, n, dy, tile, tile16, xb, &e);
                    }
                    CK(cudaDeviceSynchronize());
                    const double dt = t_now_s() - t0;
                    T_CHECK(st == G5_OK, "bench %s v%u n=%lld: %s", shp[si].what, v, (long long)n, e.msg);
                    if (rep && dt < best) best = dt;
                }
                t_ms[v][ni] = best * 1e3;
            }
        for (uint32_t v = 0; v < 4; v++) {
            char line[640];
            int off = snprintf(line, sizeof line, "gemm bench %s [%lld x %lld] %-9s ms:", shp[si].what, (long long)m,
                               (long long)k, v == 0 ? "gemv" : v == 1 ? "gemm-f32" : v == 2 ? "gemm-tf32" : "gemm-bf16");
            for (int ni = 0; ni < NN; ni++)
                off += snprintf(line + off, sizeof line - (size_t)off, " n=%lld %.3f", (long long)ns[ni], t_ms[v][ni]);
            if (v) {
                int cross = -1;
                for (int ni = 0; ni < NN && cross < 0; ni++)
                    if (t_ms[v][ni] < t_ms[0][ni]) cross = ni;
                snprintf(line + off, sizeof line - (size_t)off, "; first faster than gemv at n=%lld",
                         cross < 0 ? -1LL : (long long)ns[cross]);
            }
            printf("%s\n", line);
        }
        cudaFree(dw), cudaFree(dx), cudaFree(dy), cudaFree(tile), cudaFree(tile16), cudaFree(xb);
    }
    cuk_blas_free(b);
}

int main(void) {
    setvbuf(stdout, NULL, _IONBF, 0);
    if (!t_need_device()) return t_report(G5_TEST_NAME);
    test_gemm_kernels();
    bench_gemm();
    return t_report(G5_TEST_NAME);
}
