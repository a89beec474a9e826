/* GPU kernels (cuda/) against the CPU: every kernel on fresh random inputs, outputs poisoned
 * (NaN) before each run, GLM-5's per-rank (TP8) shapes among the cases.
 *
 * Weights come from quant_fill_random (valid random blocks of every type); the reference
 * dequantizes them with quant_dequantize (exact vs ggml, tested in tests/test_quant*.c) and
 * accumulates in double. GEMV tolerance: float32 accumulation-order differences only, measured
 * relative to the output's magnitude: ||y - ref||_2 <= 1e-4 ||ref||_2 and
 * max|y - ref| <= 1e-4 max|ref|. Padding past each output row must stay poisoned.
 * Runs on the device only (`make test-gpu`); needs no reference data files. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuk.h"
#include "cuda/cuk_gemv_wide.h"
#include "cuda/cuk_head_gemv.h"
#include "cuda/cuk_model.h"
#include "format/quant.h"
#include "format/quant_blocks.h"
#include "tests/test_util.h"

#define G5_TEST_NAME "test_kernels"
#define G5_TEST_SEED 0x5eed1234abcdull
#include "tests/gpu/gpu_test_util.h"

#define TOL 1e-4

/* Per-case detail lines: stdout, and the file named by $G5_TEST_DETAIL if set (run_tests.sh
 * keeps only the summary and FAIL lines). */
static FILE *g_detail;
static void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void note(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    if (g_detail) {
        va_start(ap, fmt);
        vfprintf(g_detail, fmt, ap);
        va_end(ap);
        fflush(g_detail);
    }
}

static void poison(void *d, size_t bytes) { CK(cudaMemset(d, 0xFF, bytes)); }

static int is_poison(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u == 0xFFFFFFFFu;
}

/* Compares got[n] to ref[n]; returns 1 if within TOL (see the file comment). */
static int compare(const float *got, const double *ref, size_t n, double *rel_l2, double *rel_max) {
    double e2 = 0, r2 = 0, emax = 0, rmax = 0;
    int finite = 1;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) finite = 0;
        const double e = fabs((double)got[i] - ref[i]);
        e2 += e * e;
        r2 += ref[i] * ref[i];
        if (e > emax) emax = e;
        if (fabs(ref[i]) > rmax) rmax = fabs(ref[i]);
    }
    *rel_l2 = r2 > 0 ? sqrt(e2 / r2) : sqrt(e2);
    *rel_max = rmax > 0 ? emax / rmax : emax;
    return finite && *rel_l2 <= TOL && *rel_max <= TOL;
}

static float bf16_round(float f) { return quant_bf16_to_f32(quant_f32_to_bf16(f)); }

/* ---------------- GEMV ---------------- */

typedef struct shape {
    const char *name;
    int64_t m, k;
    int ns[8]; /* vector counts to try, 0-terminated */
    int bf16;  /* also run with bf16 activations */
} shape;

static const shape SHAPES[] = {
    {"lm_head", 19360, 6144, {1}, 0},
    {"dense_up", 1536, 6144, {1, 3}, 0},
    {"dense_down", 6144, 1536, {1, 16}, 0},
    {"q_b", 2048, 2048, {1, 2, 4, 5, 8, 16}, 1},
    {"o", 6144, 2048, {1}, 0},
    {"odd", 37, 512, {1, 7, 13}, 1},
    {"one_block", 5, 256, {1, 16}, 0},
    {"tail", 3, 1280, {1}, 0},
    /* decode shapes with few rows: split-K over the warps of a CTA */
    {"idx_proj", 32, 6144, {1, 8}, 1},
    {"kv_a", 576, 6144, {1}, 0},
};
#define N_SHAPES (sizeof SHAPES / sizeof SHAPES[0])

static const uint32_t TYPES[] = {QT_F32, QT_F16, QT_BF16, QT_Q8_0, QT_Q4_0, QT_Q4_1, QT_Q5_0,
                                 QT_Q5_1, QT_IQ4_NL, QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_IQ4_XS,
                                 /* the low-bit types (cuda/gemv_lowbit.cu) */
                                 QT_Q2_K, QT_Q3_K, QT_IQ1_S, QT_IQ1_M, QT_IQ2_XXS, QT_IQ2_XS,
                                 QT_IQ2_S, QT_IQ3_XXS, QT_IQ3_S, QT_TQ1_0, QT_TQ2_0, QT_MXFP4,
                                 QT_NVFP4};
#define N_TYPES (sizeof TYPES / sizeof TYPES[0])

static uint64_t row_bytes(uint32_t type, int64_t k) {
    uint64_t rb = 0;
    if (quant_row_bytes(type, (uint64_t)k, &rb) != G5_OK) {
        printf("FAIL: quant_row_bytes(%u, %lld)\n", type, (long long)k);
        exit(2);
    }
    return rb;
}

/* Fills `bytes` (a multiple of the block size) of random valid blocks of type. */
static void fill_weights(uint32_t type, uint8_t *w, uint64_t bytes) {
    const quant_type_info *ti = quant_type_get(type);
    uint64_t st = rnd();
    if (quant_fill_random(type, w, bytes / ti->block_bytes, &st) != G5_OK) {
        printf("FAIL: quant_fill_random(%s)\n", ti->name);
        exit(2);
    }
}

/* The kernels a GEMV of this shape runs (cuk_gemv_takes_tc), for messages. */
static const char *path_name(uint32_t type, int64_t m, int64_t k, int n) {
    return cuk_gemv_takes_tc(type, m, k, n) ? "tc" : "simt";
}

/* x element i of a case: uniform in [-1, 1], or (wide) spread over 2^-20 .. 2^17 in magnitude
 * so that the tensor-core path's f16 split needs its scaling (|x| > 65504 would overflow f16). */
static float x_value(int wide) {
    const float u = unif(-1.0f, 1.0f);
    if (!wide) return u;
    return ldexpf(u, (int)(rnd() % 38) - 20);
}

/* One GEMV case on weights already on the device (dw, host copy hw). */
static void gemv_case_x(uint32_t type, const uint8_t *hw, const void *dw, const shape *sh, int n,
                        uint32_t x_type, float *rowbuf, int wide) {
    const int64_t m = sh->m, k = sh->k;
    const int64_t ldx = k + (sh->m < 100 ? 4 : 0), ldy = m + 3;
    const uint64_t rb = row_bytes(type, k);
    float *hx = xmalloc(sizeof(float) * (size_t)(n * ldx));
    uint16_t *hxb = xmalloc(sizeof(uint16_t) * (size_t)(n * ldx));
    for (int64_t i = 0; i < n * ldx; i++) {
        hx[i] = x_value(wide);
        if (x_type == CUK_ACT_BF16) {
            hxb[i] = quant_f32_to_bf16(hx[i]);
            hx[i] = quant_bf16_to_f32(hxb[i]);
        }
    }
    const size_t xbytes = (size_t)(n * ldx) * (x_type == CUK_ACT_BF16 ? 2 : 4);
    void *dx = dalloc(xbytes);
    float *dy = dalloc(sizeof(float) * (size_t)(n * ldy));
    CK(cudaMemcpy(dx, x_type == CUK_ACT_BF16 ? (void *)hxb : (void *)hx, xbytes, cudaMemcpyHostToDevice));
    poison(dy, sizeof(float) * (size_t)(n * ldy));
    cuk_gemv_args a = {.w_type = type, .w = dw, .k = k, .m = m, .x = dx, .x_type = x_type,
                       .ldx = ldx, .n = n, .y = dy, .ldy = ldy};
    g5_error err = {0};
    g5_status st = cuk_gemv(&a, NULL, &err);
    T_CHECK(st == G5_OK, "%s %s: cuk_gemv: %s", quant_type_name(type), sh->name, err.msg);
    CK(cudaDeviceSynchronize());
    float *hy = xmalloc(sizeof(float) * (size_t)(n * ldy));
    CK(cudaMemcpy(hy, dy, sizeof(float) * (size_t)(n * ldy), cudaMemcpyDeviceToHost));

    double *ref = xmalloc(sizeof(double) * (size_t)(n * m));
    float *got = xmalloc(sizeof(float) * (size_t)(n * m));
    for (int64_t i = 0; i < m; i++) {
        quant_dequantize(type, hw + (uint64_t)i * rb, (uint64_t)k, rowbuf);
        for (int v = 0; v < n; v++) {
            double s = 0;
            const float *xv = hx + v * ldx;
            for (int64_t j = 0; j < k; j++) s += (double)rowbuf[j] * xv[j];
            ref[v * m + i] = s;
            got[v * m + i] = hy[v * ldy + i];
        }
    }
    int pad_ok = 1;
    for (int v = 0; v < n; v++)
        for (int64_t i = m; i < ldy; i++) pad_ok &= is_poison(hy[v * ldy + i]);
    double l2, mx;
    const int ok = compare(got, ref, (size_t)(n * m), &l2, &mx);
    T_CHECK(ok, "gemv[%s] %s %s m=%lld k=%lld n=%d x=%s%s: relL2 %.3e relmax %.3e", path_name(type, m, k, n),
            quant_type_name(type), sh->name, (long long)m, (long long)k, n,
            x_type == CUK_ACT_BF16 ? "bf16" : "f32", wide ? " wide" : "", l2, mx);
    T_CHECK(pad_ok, "gemv[%s] %s %s n=%d: wrote past m into the row padding", path_name(type, m, k, n),
            quant_type_name(type), sh->name, n);
    note("  gemv[%-4s] %-6s %-10s m=%-5lld k=%-5lld n=%-2d x=%s%s relL2 %.2e relmax %.2e\n",
         path_name(type, m, k, n), quant_type_name(type), sh->name, (long long)m, (long long)k, n,
         x_type == CUK_ACT_BF16 ? "bf16" : "f32 ", wide ? " wide" : "", l2, mx);
    free(hx), free(hxb), free(hy), free(ref), free(got);
    CK(cudaFree(dx));
    CK(cudaFree(dy));
}

static void gemv_case(uint32_t type, const uint8_t *hw, const void *dw, const shape *sh, int n,
                      uint32_t x_type, float *rowbuf) {
    gemv_case_x(type, hw, dw, sh, n, x_type, rowbuf, 0);
}

/* Batched decode relies on it: y[v] of an n-vector launch must equal, bit for bit, a
 * one-vector launch on x[v] (both kernel families; the tensor-core path splits large n into
 * several passes). Weights dw: m rows of k. */
static void batch_identity_case(uint32_t type, const void *dw, int64_t m, int64_t k, int n) {
    const int64_t ldx = k, ldy = m;
    float *hx = xmalloc(sizeof(float) * (size_t)(n * ldx));
    for (int64_t i = 0; i < n * ldx; i++) hx[i] = unif(-1.0f, 1.0f);
    float *dx = dalloc(sizeof(float) * (size_t)(n * ldx)), *dy = dalloc(sizeof(float) * (size_t)(n * ldy));
    float *d1 = dalloc(sizeof(float) * (size_t)ldy);
    CK(cudaMemcpy(dx, hx, sizeof(float) * (size_t)(n * ldx), cudaMemcpyHostToDevice));
    g5_error err = {0};
    cuk_gemv_args a = {.w_type = type, .w = dw, .k = k, .m = m, .x = dx, .x_type = CUK_ACT_F32,
                       .ldx = ldx, .n = n, .y = dy, .ldy = ldy};
    T_CHECK(cuk_gemv(&a, NULL, &err) == G5_OK, "batch identity %s: %s", quant_type_name(type), err.msg);
    float *hy = xmalloc(sizeof(float) * (size_t)(n * ldy)), *h1 = xmalloc(sizeof(float) * (size_t)ldy);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(hy, dy, sizeof(float) * (size_t)(n * ldy), cudaMemcpyDeviceToHost));
    int same = 1;
    for (int v = 0; v < n; v++) {
        cuk_gemv_args b = a;
        b.x = dx + v * ldx, b.n = 1, b.y = d1;
        T_CHECK(cuk_gemv(&b, NULL, &err) == G5_OK, "batch identity %s n=1: %s", quant_type_name(type), err.msg);
        CK(cudaMemcpy(h1, d1, sizeof(float) * (size_t)ldy, cudaMemcpyDeviceToHost));
        same &= memcmp(h1, hy + v * ldy, sizeof(float) * (size_t)m) == 0;
    }
    T_CHECK(same, "gemv[%s] %s m=%lld k=%lld: n=%d launch differs from one-vector launches",
            path_name(type, m, k, n), quant_type_name(type), (long long)m, (long long)k, n);
    note("  gemv[%-4s] %-6s m=%lld k=%lld n=%d bit-identical to n=1: %s\n", path_name(type, m, k, n),
         quant_type_name(type), (long long)m, (long long)k, n, same ? "yes" : "NO");
    free(hx), free(hy), free(h1);
    CK(cudaFree(dx)); CK(cudaFree(dy)); CK(cudaFree(d1));
}

/* $G5_TEST_QUICK=1: only the small shapes and one MoE type (for runs under compute-sanitizer). */
static int quick(void) {
    const char *q = getenv("G5_TEST_QUICK");
    return q && *q == '1';
}

/* The tensor-core kernels (Q4_K, >= 2^25 weights) on the widths they run: 1, 2 and 4 vectors
 * per pass at k = 4096 (n = 5 and 16: several passes), 1 and 2 at k = 6144, f32, bf16 and wide
 * x, and batched launches against one-vector ones. hw/dw hold Q4_K weights for the lm_head shape
 * (the largest here). */
static void test_gemv_tc(const uint8_t *hw, const void *dw, float *rowbuf) {
    static const shape TC[] = {
        {"tc_4096", 8192, 4096, {1, 2, 3, 4, 5, 16}, 1},
        {"lm_head", 19360, 6144, {2, 3}, 1},
    };
    for (size_t s = 0; s < sizeof TC / sizeof TC[0]; s++) {
        const shape *sh = &TC[s];
        T_CHECK(cuk_gemv_takes_tc(QT_Q4_K, sh->m, sh->k, 1), "Q4_K %s m=%lld k=%lld: not on the tensor cores",
                sh->name, (long long)sh->m, (long long)sh->k);
        for (int i = 0; i < 8 && sh->ns[i]; i++) gemv_case(QT_Q4_K, hw, dw, sh, sh->ns[i], CUK_ACT_F32, rowbuf);
        gemv_case(QT_Q4_K, hw, dw, sh, 1, CUK_ACT_BF16, rowbuf);
        gemv_case(QT_Q4_K, hw, dw, sh, 3, CUK_ACT_BF16, rowbuf);
        gemv_case_x(QT_Q4_K, hw, dw, sh, 1, CUK_ACT_F32, rowbuf, 1);
        gemv_case_x(QT_Q4_K, hw, dw, sh, 2, CUK_ACT_F32, rowbuf, 1);
        batch_identity_case(QT_Q4_K, dw, sh->m, sh->k, 7);
        batch_identity_case(QT_Q4_K, dw, sh->m, sh->k, 16);
    }
    /* below 2^25 weights the CUDA-core kernels take Q4_K */
    T_CHECK(!cuk_gemv_takes_tc(QT_Q4_K, 1536, 6144, 1) && !cuk_gemv_takes_tc(QT_Q8_0, 19360, 6144, 1),
            "Q4_K 1536 x 6144 and Q8_0 on the CUDA-core kernels");
}

static void test_gemv(void) {
    uint64_t max_bytes = 0;
    int64_t max_k = 0;
    for (size_t t = 0; t < N_TYPES; t++)
        for (size_t s = 0; s < N_SHAPES; s++) {
            const uint64_t b = row_bytes(TYPES[t], SHAPES[s].k) * (uint64_t)SHAPES[s].m;
            if (b > max_bytes) max_bytes = b;
            if (SHAPES[s].k > max_k) max_k = SHAPES[s].k;
        }
    uint8_t *hw = xmalloc(max_bytes);
    float *rowbuf = xmalloc(sizeof(float) * (size_t)max_k);
    void *dw = dalloc(max_bytes);
    /* Every type on every shape: the tensor cores for the Q4_K shapes of >= 2^25 weights (the
     * lm_head here), the CUDA-core kernels for the rest. */
    for (size_t t = 0; t < N_TYPES; t++) {
        const uint32_t type = TYPES[t];
        uint64_t bytes = 0;
        for (size_t s = 0; s < N_SHAPES; s++) {
            const uint64_t b = row_bytes(type, SHAPES[s].k) * (uint64_t)SHAPES[s].m;
            if (b > bytes) bytes = b;
        }
        fill_weights(type, hw, bytes);
        CK(cudaMemcpy(dw, hw, bytes, cudaMemcpyHostToDevice));
        for (size_t s = 0; s < N_SHAPES; s++) {
            if (quick() && SHAPES[s].m * SHAPES[s].k > 1000000) continue;
            for (int i = 0; i < 8 && SHAPES[s].ns[i]; i++)
                gemv_case(type, hw, dw, &SHAPES[s], SHAPES[s].ns[i], CUK_ACT_F32, rowbuf);
            if (SHAPES[s].bf16) {
                gemv_case(type, hw, dw, &SHAPES[s], 1, CUK_ACT_BF16, rowbuf);
                gemv_case(type, hw, dw, &SHAPES[s], SHAPES[s].ns[2] ? SHAPES[s].ns[2] : 4,
                          CUK_ACT_BF16, rowbuf);
            }
            if (s == 0) {
                /* split-K shapes (32..576 rows at k = 6144), R = 4 and R = 2 tiles */
                batch_identity_case(type, dw, 32, 6144, 8);
                batch_identity_case(type, dw, 576, 6144, 16);
                batch_identity_case(type, dw, 256, 6144, 3);
            }
            if (s == 0 && (type == QT_Q4_K || type == QT_Q8_0)) {
                batch_identity_case(type, dw, 2048, 2048, 7);
                batch_identity_case(type, dw, 1536, 6144, 5);
            }
            /* x over 37 binades (some above the f16 range) */
            if (SHAPES[s].m * SHAPES[s].k <= 5000000) {
                gemv_case_x(type, hw, dw, &SHAPES[s], 1, CUK_ACT_F32, rowbuf, 1);
                gemv_case_x(type, hw, dw, &SHAPES[s], 2, CUK_ACT_F32, rowbuf, 1);
            }
        }
        if (type == QT_Q4_K && !quick()) test_gemv_tc(hw, dw, rowbuf);
    }
    free(hw), free(rowbuf);
    CK(cudaFree(dw));
}

/* ---------------- MoE ---------------- */

enum { E_LOCAL = 32, TOP_K = 8, N_TOK = 6, FF = 256, EMBD = 6144 };

/* Distinct random expert ids per token; expert 3 in slot 0 of every token (6 pairs: two plan
 * groups of one expert). */
static void pick_ids(int32_t *ids) {
    for (int t = 0; t < N_TOK; t++)
        for (int s = 0; s < TOP_K; s++) {
            int32_t e;
            int dup;
            if (s == 0) {
                ids[t * TOP_K] = 3;
                continue;
            }
            do {
                e = (int32_t)(rnd() % E_LOCAL);
                dup = 0;
                for (int j = 0; j < s; j++) dup |= ids[t * TOP_K + j] == e;
            } while (dup);
            ids[t * TOP_K + s] = e;
        }
}

static double dot_row(uint32_t type, const uint8_t *row, int64_t k, const float *x, float *buf) {
    quant_dequantize(type, row, (uint64_t)k, buf);
    double s = 0;
    for (int64_t j = 0; j < k; j++) s += (double)buf[j] * x[j];
    return s;
}

/* cuk_moe_plan of n_tok tokens into a new device buffer; checks the plan on the host against
 * ids and wts (every computed pair once, grouped by expert in pair order, groups of <= 4). */
static int32_t *moe_plan(const int32_t *did, const float *dwts, const int32_t *ids, const float *wts, int n_tok) {
    const int64_t words = cuk_moe_plan_words(n_tok, TOP_K);
    int32_t *dplan = dalloc(sizeof(int32_t) * words);
    g5_error err = {0};
    cuk_moe_plan_args pa = {did, dwts, n_tok, TOP_K, TOP_K, TOP_K, E_LOCAL, dplan};
    T_CHECK(cuk_moe_plan(&pa, NULL, &err) == G5_OK, "moe_plan: %s", err.msg);
    CK(cudaDeviceSynchronize());
    int32_t *h = xmalloc(sizeof(int32_t) * words);
    CK(cudaMemcpy(h, dplan, sizeof(int32_t) * words, cudaMemcpyDeviceToHost));
    const int P = n_tok * TOP_K, ng = h[0];
    const int32_t *ge = h + 1, *gs = ge + P, *gc = gs + P, *list = gc + P, *flag = list + P;
    int ok = ng >= 1 && ng <= P, seen[N_TOK * TOP_K] = {0}, npos = 0, prev_e = -1, prev_p = -1;
    for (int g = 0; ok && g < ng; g++) {
        ok &= gc[g] >= 1 && gc[g] <= CUK_MOE_GROUP && gs[g] == npos && ge[g] >= prev_e;
        if (ge[g] != prev_e) prev_p = -1;
        for (int j = 0; ok && j < gc[g]; j++) {
            const int p = list[gs[g] + j];
            ok &= p >= 0 && p < P && !seen[p] && p > prev_p && ids[p] == ge[g] && wts[p] != 0.0f;
            if (ok) seen[p] = 1, prev_p = p;
        }
        ok &= gc[g] == CUK_MOE_GROUP || g + 1 == ng || ge[g + 1] != ge[g];
        prev_e = ge[g];
        npos += gc[g];
    }
    for (int p = 0; ok && p < P; p++) {
        const int want = ids[p] < 0 || ids[p] >= E_LOCAL ? -1 : wts[p] == 0.0f ? 0 : 1;
        ok &= flag[p] == want && seen[p] == (want == 1);
    }
    T_CHECK(ok, "moe_plan n_tok=%d: groups, list or flags wrong (%d groups)", n_tok, ng);
    free(h);
    return dplan;
}

/* Bitwise equality of n floats (NaN payloads included). */
static int same_bits(const float *a, const float *b, size_t n) { return !memcmp(a, b, n * sizeof(float)); }

static void test_moe_type(uint32_t type, int bad_id) {
    const char *tn = quant_type_name(type);
    const uint64_t rb_up = row_bytes(type, EMBD), rb_dn = row_bytes(type, FF);
    const uint64_t mat_up = rb_up * FF, mat_dn = rb_dn * EMBD;
    uint8_t *hg = xmalloc(mat_up * E_LOCAL), *hu = xmalloc(mat_up * E_LOCAL);
    uint8_t *hd = xmalloc(mat_dn * E_LOCAL);
    fill_weights(type, hg, mat_up * E_LOCAL);
    fill_weights(type, hu, mat_up * E_LOCAL);
    fill_weights(type, hd, mat_dn * E_LOCAL);
    void *dg = dalloc(mat_up * E_LOCAL), *du = dalloc(mat_up * E_LOCAL), *dd = dalloc(mat_dn * E_LOCAL);
    CK(cudaMemcpy(dg, hg, mat_up * E_LOCAL, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(du, hu, mat_up * E_LOCAL, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dd, hd, mat_dn * E_LOCAL, cudaMemcpyHostToDevice));

    int32_t ids[N_TOK * TOP_K];
    float wts[N_TOK * TOP_K];
    pick_ids(ids);
    for (int i = 0; i < N_TOK * TOP_K; i++) wts[i] = unif(0.05f, 0.5f);
    const int bad_t = 1, bad_s = 5, zero_t = 2, zero_s = 4;
    if (bad_id) ids[bad_t * TOP_K + bad_s] = E_LOCAL + 7;
    wts[zero_t * TOP_K + zero_s] = 0.0f; /* another rank's expert: skipped */
    float *hx = xmalloc(sizeof(float) * N_TOK * EMBD);
    for (int i = 0; i < N_TOK * EMBD; i++) hx[i] = unif(-1.0f, 1.0f);
    const int64_t ldo = FF + 4, ldy = EMBD + 4;
    int32_t *did = dalloc(sizeof ids);
    float *dwts = dalloc(sizeof wts), *dx = dalloc(sizeof(float) * N_TOK * EMBD);
    float *dout = dalloc(sizeof(float) * N_TOK * TOP_K * ldo), *dy = dalloc(sizeof(float) * N_TOK * ldy);
    CK(cudaMemcpy(did, ids, sizeof ids, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dwts, wts, sizeof wts, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dx, hx, sizeof(float) * N_TOK * EMBD, cudaMemcpyHostToDevice));
    poison(dout, sizeof(float) * N_TOK * TOP_K * ldo);
    int32_t *dplan = moe_plan(did, dwts, ids, wts, N_TOK);
    const int lowbit = qb_handles(type); /* the per-pair kernels of cuda/gemv_lowbit.cu */

    g5_error err = {0};
    cuk_moe_gate_up_args gu = {.w_type = type, .w_gate = dg, .w_up = du, .k = EMBD, .m = FF,
                               .n_expert = E_LOCAL, .ids = did, .top_k = TOP_K, .ld_ids = TOP_K,
                               .x = dx, .x_type = CUK_ACT_F32, .ldx = EMBD, .n_tok = N_TOK,
                               .out = dout, .ldo = ldo, .plan = dplan};
    g5_status st = cuk_moe_gate_up(&gu, NULL, &err);
    T_CHECK(st == G5_OK, "moe_gate_up %s: %s", tn, err.msg);
    CK(cudaDeviceSynchronize());
    float *hout = xmalloc(sizeof(float) * N_TOK * TOP_K * ldo);
    CK(cudaMemcpy(hout, dout, sizeof(float) * N_TOK * TOP_K * ldo, cudaMemcpyDeviceToHost));

    /* Reference gate/up (the GPU's own output feeds the down test, so each is checked alone). */
    float *buf = xmalloc(sizeof(float) * EMBD);
    double *ref = xmalloc(sizeof(double) * N_TOK * TOP_K * FF);
    float *got = xmalloc(sizeof(float) * N_TOK * TOP_K * FF);
    size_t nref = 0;
    int pad_ok = 1, bad_ok = 1;
    for (int t = 0; t < N_TOK; t++)
        for (int s = 0; s < TOP_K; s++) {
            const float *o = hout + (t * TOP_K + s) * ldo;
            for (int64_t i = FF; i < ldo; i++) pad_ok &= is_poison(o[i]);
            if (bad_id && t == bad_t && s == bad_s) { /* low-bit: NaN; grouped kernels: not computed */
                for (int i = 0; i < FF; i++) bad_ok &= lowbit ? isnan(o[i]) && !is_poison(o[i]) : is_poison(o[i]);
                continue;
            }
            if (t == zero_t && s == zero_s && !lowbit) { /* skipped pair: row untouched */
                for (int i = 0; i < FF; i++) bad_ok &= is_poison(o[i]);
                continue;
            }
            const int e = ids[t * TOP_K + s];
            for (int i = 0; i < FF; i++) {
                const double g = dot_row(type, hg + (uint64_t)e * mat_up + i * rb_up, EMBD, hx + t * EMBD, buf);
                const double u = dot_row(type, hu + (uint64_t)e * mat_up + i * rb_up, EMBD, hx + t * EMBD, buf);
                ref[nref] = g / (1.0 + exp(-g)) * u;
                got[nref++] = o[i];
            }
        }
    double l2, mx;
    int ok = compare(got, ref, nref, &l2, &mx);
    T_CHECK(ok, "moe_gate_up %s E=%d top_k=%d m=%d k=%d n_tok=%d: relL2 %.3e relmax %.3e",
            tn, E_LOCAL, TOP_K, FF, EMBD, N_TOK, l2, mx);
    T_CHECK(pad_ok, "moe_gate_up %s: wrote into the row padding", tn);
    T_CHECK(bad_ok, "moe_gate_up %s: the row of an out-of-range id or a skipped pair is wrong", tn);
    note("  moe_gate_up %-6s m=%d k=%d E=%d top_k=%d n_tok=%d relL2 %.2e relmax %.2e\n",
         tn, FF, EMBD, E_LOCAL, TOP_K, N_TOK, l2, mx);

    /* Down: h random (independent of the gate/up output). */
    float *hh = xmalloc(sizeof(float) * N_TOK * TOP_K * FF);
    for (int i = 0; i < N_TOK * TOP_K * FF; i++) hh[i] = unif(-1.0f, 1.0f);
    float *dh = dalloc(sizeof(float) * N_TOK * TOP_K * FF);
    CK(cudaMemcpy(dh, hh, sizeof(float) * N_TOK * TOP_K * FF, cudaMemcpyHostToDevice));
    poison(dy, sizeof(float) * N_TOK * ldy);
    cuk_moe_down_args dn = {.w_type = type, .w = dd, .k = FF, .m = EMBD, .n_expert = E_LOCAL,
                            .ids = did, .wts = dwts, .top_k = TOP_K, .ld_ids = TOP_K,
                            .ld_wts = TOP_K, .h = dh, .h_type = CUK_ACT_F32, .ldh = FF,
                            .n_tok = N_TOK, .y = dy, .ldy = ldy, .plan = dplan, .part = NULL, .ldp = EMBD};
    float *dpart = dalloc(sizeof(float) * N_TOK * TOP_K * EMBD);
    dn.part = dpart;
    st = cuk_moe_down(&dn, NULL, &err);
    T_CHECK(st == G5_OK, "moe_down %s: %s", tn, err.msg);
    CK(cudaDeviceSynchronize());
    float *hy = xmalloc(sizeof(float) * N_TOK * ldy);
    CK(cudaMemcpy(hy, dy, sizeof(float) * N_TOK * ldy, cudaMemcpyDeviceToHost));
    double *ref2 = xmalloc(sizeof(double) * N_TOK * EMBD);
    float *got2 = xmalloc(sizeof(float) * N_TOK * EMBD);
    nref = 0;
    pad_ok = 1, bad_ok = 1;
    for (int t = 0; t < N_TOK; t++) {
        for (int64_t i = EMBD; i < ldy; i++) pad_ok &= is_poison(hy[t * ldy + i]);
        if (bad_id && t == bad_t) {
            for (int i = 0; i < EMBD; i++) bad_ok &= isnan(hy[t * ldy + i]) && !is_poison(hy[t * ldy + i]);
            continue;
        }
        for (int i = 0; i < EMBD; i++) {
            double s = 0;
            for (int j = 0; j < TOP_K; j++) {
                const int e = ids[t * TOP_K + j];
                s += (double)wts[t * TOP_K + j] *
                     dot_row(type, hd + (uint64_t)e * mat_dn + (uint64_t)i * rb_dn, FF,
                             hh + (t * TOP_K + j) * FF, buf);
            }
            ref2[nref] = s;
            got2[nref++] = hy[t * ldy + i];
        }
    }
    ok = compare(got2, ref2, nref, &l2, &mx);
    T_CHECK(ok, "moe_down %s E=%d top_k=%d m=%d k=%d n_tok=%d: relL2 %.3e relmax %.3e",
            tn, E_LOCAL, TOP_K, EMBD, FF, N_TOK, l2, mx);
    T_CHECK(pad_ok, "moe_down %s: wrote into the row padding", tn);
    if (bad_id) T_CHECK(bad_ok, "moe_down %s: token with an out-of-range id is not NaN", tn);
    note("  moe_down    %-6s m=%d k=%d E=%d top_k=%d n_tok=%d relL2 %.2e relmax %.2e\n",
         tn, EMBD, FF, E_LOCAL, TOP_K, N_TOK, l2, mx);

    /* Each token alone (n_tok = 1, its own plan) gives the batched rows bit for bit. */
    {
        float *one = xmalloc(sizeof(float) * TOP_K * ldo), *oney = xmalloc(sizeof(float) * ldy);
        int same = 1, samey = 1;
        for (int t = 0; t < N_TOK; t++) {
            int32_t *p1 = moe_plan(did + t * TOP_K, dwts + t * TOP_K, ids + t * TOP_K, wts + t * TOP_K, 1);
            cuk_moe_gate_up_args g1 = gu;
            g1.ids = did + t * TOP_K, g1.x = dx + t * EMBD, g1.n_tok = 1, g1.out = dout, g1.plan = p1;
            poison(dout, sizeof(float) * TOP_K * ldo);
            T_CHECK(cuk_moe_gate_up(&g1, NULL, &err) == G5_OK, "moe_gate_up n_tok=1: %s", err.msg);
            cuk_moe_down_args d1 = dn;
            d1.ids = did + t * TOP_K, d1.wts = dwts + t * TOP_K, d1.h = dh + (int64_t)t * TOP_K * FF, d1.n_tok = 1;
            d1.y = dy, d1.plan = p1;
            T_CHECK(cuk_moe_down(&d1, NULL, &err) == G5_OK, "moe_down n_tok=1: %s", err.msg);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(one, dout, sizeof(float) * TOP_K * ldo, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(oney, dy, sizeof(float) * ldy, cudaMemcpyDeviceToHost));
            for (int s2 = 0; s2 < TOP_K; s2++) {
                if ((bad_id && t == bad_t && s2 == bad_s) || (t == zero_t && s2 == zero_s)) continue;
                same &= same_bits(one + s2 * ldo, hout + (t * TOP_K + s2) * ldo, FF);
            }
            samey &= same_bits(oney, hy + t * ldy, EMBD);
            CK(cudaFree(p1));
        }
        T_CHECK(same, "moe_gate_up %s: n_tok=1 rows differ from the n_tok=%d launch", tn, N_TOK);
        T_CHECK(samey, "moe_down %s: n_tok=1 rows differ from the n_tok=%d launch", tn, N_TOK);
        free(one), free(oney);
    }

    /* bf16 activations, token 0 only (ids of token 0 are valid). */
    if (!bad_id) {
        uint16_t *hxb = xmalloc(sizeof(uint16_t) * EMBD);
        float *xr = xmalloc(sizeof(float) * EMBD);
        for (int i = 0; i < EMBD; i++) hxb[i] = quant_f32_to_bf16(hx[i]), xr[i] = bf16_round(hx[i]);
        uint16_t *dxb = dalloc(sizeof(uint16_t) * EMBD);
        CK(cudaMemcpy(dxb, hxb, sizeof(uint16_t) * EMBD, cudaMemcpyHostToDevice));
        poison(dout, sizeof(float) * N_TOK * TOP_K * ldo);
        int32_t *p0 = moe_plan(did, dwts, ids, wts, 1);
        gu.x = dxb, gu.x_type = CUK_ACT_BF16, gu.n_tok = 1, gu.plan = p0;
        st = cuk_moe_gate_up(&gu, NULL, &err);
        T_CHECK(st == G5_OK, "moe_gate_up bf16 %s: %s", tn, err.msg);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(hout, dout, sizeof(float) * TOP_K * ldo, cudaMemcpyDeviceToHost));
        nref = 0;
        for (int s = 0; s < TOP_K; s++) {
            const int e = ids[s];
            for (int i = 0; i < FF; i++) {
                const double g = dot_row(type, hg + (uint64_t)e * mat_up + i * rb_up, EMBD, xr, buf);
                const double u = dot_row(type, hu + (uint64_t)e * mat_up + i * rb_up, EMBD, xr, buf);
                ref[nref] = g / (1.0 + exp(-g)) * u;
                got[nref++] = hout[s * ldo + i];
            }
        }
        ok = compare(got, ref, nref, &l2, &mx);
        T_CHECK(ok, "moe_gate_up %s x=bf16: relL2 %.3e relmax %.3e", tn, l2, mx);
        free(hxb), free(xr);
        CK(cudaFree(dxb));
        CK(cudaFree(p0));
    }

    free(hg), free(hu), free(hd), free(hx), free(hout), free(buf), free(ref), free(got);
    free(hh), free(hy), free(ref2), free(got2);
    CK(cudaFree(dg)); CK(cudaFree(du)); CK(cudaFree(dd)); CK(cudaFree(did)); CK(cudaFree(dwts));
    CK(cudaFree(dx)); CK(cudaFree(dout)); CK(cudaFree(dy)); CK(cudaFree(dh));
    CK(cudaFree(dplan)); CK(cudaFree(dpart));
}

static void test_moe(void) {
    if (quick()) {
        test_moe_type(QT_Q6_K, 0);
        return;
    }
    for (size_t t = 0; t < N_TYPES; t++) test_moe_type(TYPES[t], 0);
    test_moe_type(QT_Q4_K, 1); /* the tensor-core kernels */
    test_moe_type(QT_Q8_0, 1); /* the CUDA-core ones */
}

/* ---------------- norms, rope, add, argmax ---------------- */

static void test_norms(void) {
    const int64_t dims[] = {6144, 576, 7};
    for (int di = 0; di < 3; di++) {
        const int64_t dim = dims[di], rows = 4, ldx = dim + 5, ldy = dim + 3;
        float *hx = xmalloc(sizeof(float) * rows * ldx), *hw = xmalloc(sizeof(float) * dim);
        float *hb = xmalloc(sizeof(float) * dim), *hy = xmalloc(sizeof(float) * rows * ldy);
        for (int64_t i = 0; i < rows * ldx; i++) hx[i] = unif(-3.0f, 3.0f) + (i % 3 == 0 ? 2.0f : 0.0f);
        for (int64_t i = 0; i < dim; i++) hw[i] = unif(0.5f, 1.5f), hb[i] = unif(-0.5f, 0.5f);
        float *dx = dalloc(sizeof(float) * rows * ldx), *dw = dalloc(sizeof(float) * dim);
        float *db = dalloc(sizeof(float) * dim), *dy = dalloc(sizeof(float) * rows * ldy);
        CK(cudaMemcpy(dx, hx, sizeof(float) * rows * ldx, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dw, hw, sizeof(float) * dim, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(db, hb, sizeof(float) * dim, cudaMemcpyHostToDevice));
        const float eps = 1e-5f;
        double *ref = xmalloc(sizeof(double) * rows * dim);
        float *got = xmalloc(sizeof(float) * rows * dim);
        g5_error err = {0};
        for (int kind = 0; kind < 2; kind++) {
            poison(dy, sizeof(float) * rows * ldy);
            g5_status st = kind == 0 ? cuk_rms_norm(dx, ldx, dw, dy, ldy, rows, dim, eps, NULL, &err)
                                     : cuk_layer_norm(&(cuk_layer_norm_args){dx, ldx, dw, db, dy, ldy, rows, dim, eps},
                                                      NULL, &err);
            T_CHECK(st == G5_OK, "%s: %s", kind ? "layer_norm" : "rms_norm", err.msg);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(hy, dy, sizeof(float) * rows * ldy, cudaMemcpyDeviceToHost));
            int pad_ok = 1;
            for (int64_t r = 0; r < rows; r++) {
                const float *xr = hx + r * ldx;
                double mean = 0, ss = 0;
                for (int64_t i = 0; i < dim; i++) mean += xr[i], ss += (double)xr[i] * xr[i];
                mean /= (double)dim;
                double var = 0;
                for (int64_t i = 0; i < dim; i++) var += (xr[i] - mean) * (xr[i] - mean);
                var /= (double)dim;
                for (int64_t i = 0; i < dim; i++) {
                    ref[r * dim + i] = kind == 0 ? xr[i] / sqrt(ss / (double)dim + eps) * hw[i]
                                                 : (xr[i] - mean) / sqrt(var + eps) * hw[i] + hb[i];
                    got[r * dim + i] = hy[r * ldy + i];
                }
                for (int64_t i = dim; i < ldy; i++) pad_ok &= is_poison(hy[r * ldy + i]);
            }
            double l2, mx;
            const int ok = compare(got, ref, (size_t)(rows * dim), &l2, &mx);
            T_CHECK(ok && l2 < 1e-6 && mx < 1e-6, "%s dim=%lld: relL2 %.3e relmax %.3e",
                    kind ? "layer_norm" : "rms_norm", (long long)dim, l2, mx);
            T_CHECK(pad_ok, "%s dim=%lld: wrote into the padding", kind ? "layer_norm" : "rms_norm",
                    (long long)dim);
        }
        /* In place (y == x), RMSNorm: same result as out of place. */
        float *hy2 = xmalloc(sizeof(float) * rows * ldx);
        float *dxy = dalloc(sizeof(float) * rows * ldx);
        CK(cudaMemcpy(dxy, hx, sizeof(float) * rows * ldx, cudaMemcpyHostToDevice));
        g5_status st = cuk_rms_norm(dxy, ldx, dw, dxy, ldx, rows, dim, eps, NULL, &err);
        T_CHECK(st == G5_OK, "rms_norm in place: %s", err.msg);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(hy2, dxy, sizeof(float) * rows * ldx, cudaMemcpyDeviceToHost));
        CK(cudaFree(dxy));
        double l2, mx;
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = hx + r * ldx;
            double ss = 0;
            for (int64_t i = 0; i < dim; i++) ss += (double)xr[i] * xr[i];
            for (int64_t i = 0; i < dim; i++) {
                ref[r * dim + i] = xr[i] / sqrt(ss / (double)dim + eps) * hw[i];
                got[r * dim + i] = hy2[r * ldx + i];
            }
        }
        T_CHECK(compare(got, ref, (size_t)(rows * dim), &l2, &mx) && l2 < 1e-6,
                "rms_norm in place dim=%lld: relL2 %.3e", (long long)dim, l2);
        free(hx), free(hw), free(hb), free(hy), free(hy2), free(ref), free(got);
        CK(cudaFree(dx)); CK(cudaFree(dw)); CK(cudaFree(db)); CK(cudaFree(dy));
    }
}

static void test_rope(void) {
    /* q heads of 256 (192 nope + 64 rope) and the 576-wide latent k row (512 + 64 rope). */
    const struct { int64_t n_head, head_dim, rot_off, n_rot; float theta; } cases[] = {
        {8, 256, 192, 64, 1000000.0f}, {1, 576, 512, 64, 10000.0f}, {3, 10, 2, 8, 500.0f}};
    const int32_t pos[] = {0, 1, 17, 4095, 100000, 202751};
    const int64_t n_tok = 6;
    for (int c = 0; c < 3; c++) {
        const int64_t nh = cases[c].n_head, hd = cases[c].head_dim, tok_stride = nh * hd + 2;
        const int64_t n = n_tok * tok_stride;
        float *hx = xmalloc(sizeof(float) * n), *hy = xmalloc(sizeof(float) * n);
        for (int64_t i = 0; i < n; i++) hx[i] = unif(-2.0f, 2.0f);
        float *dx = dalloc(sizeof(float) * n);
        int32_t *dp = dalloc(sizeof pos);
        CK(cudaMemcpy(dx, hx, sizeof(float) * n, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dp, pos, sizeof pos, cudaMemcpyHostToDevice));
        g5_error err = {0};
        g5_status st = cuk_rope(&(cuk_rope_args){dx, n_tok, tok_stride, nh, hd, cases[c].rot_off, cases[c].n_rot,
                                cases[c].theta, dp}, NULL, &err);
        T_CHECK(st == G5_OK, "rope: %s", err.msg);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(hy, dx, sizeof(float) * n, cudaMemcpyDeviceToHost));
        /* Reference: the documented angle (float32 inv and product), rotation in double. */
        double emax = 0, rmax = 0;
        int untouched = 1;
        for (int64_t t = 0; t < n_tok; t++)
            for (int64_t h = 0; h < nh; h++) {
                const int64_t base = t * tok_stride + h * hd;
                for (int64_t d = 0; d < hd; d++) {
                    const int64_t j = d - cases[c].rot_off;
                    const int64_t idx = base + d;
                    if (j < 0 || j >= cases[c].n_rot) {
                        untouched &= memcmp(&hx[idx], &hy[idx], 4) == 0;
                        continue;
                    }
                    const int64_t i = j / 2;
                    const float inv = 1.0f / powf(cases[c].theta, (float)(2 * i) / (float)cases[c].n_rot);
                    const float ang = (float)pos[t] * inv;
                    const double a = hx[base + cases[c].rot_off + 2 * i], b = hx[base + cases[c].rot_off + 2 * i + 1];
                    const double r = (j % 2 == 0) ? a * cos((double)ang) - b * sin((double)ang)
                                                  : a * sin((double)ang) + b * cos((double)ang);
                    if (fabs(hy[idx] - r) > emax || !isfinite(hy[idx])) emax = isfinite(hy[idx]) ? fabs(hy[idx] - r) : 1e30;
                    if (fabs(r) > rmax) rmax = fabs(r);
                }
            }
        T_CHECK(emax <= 1e-6 * rmax, "rope case %d: max err %.3e (max |y| %.3e)", c, emax, rmax);
        T_CHECK(untouched, "rope case %d: changed dims outside the rotated range", c);
        free(hx), free(hy);
        CK(cudaFree(dx)); CK(cudaFree(dp));
    }
}

/* cuk_argmax with the values over nr rows of n (row stride ld; d the device copy of h): each
 * row's id equal to want[r], its value that of its id's element (NaN where want[r] is -1). */
static void argmax_values_check(const char *what, const float *d, const float *h, int64_t ld, int nr, int64_t n,
                                const int32_t *want) {
    g5_error err = {0};
    int32_t *dout = dalloc(sizeof(int32_t) * nr), *got = xmalloc(sizeof(int32_t) * nr);
    float *dval = dalloc(sizeof(float) * nr), *gv = xmalloc(sizeof(float) * nr);
    poison(dout, sizeof(int32_t) * nr);
    T_CHECK(cuk_argmax(d, ld, nr, n, dout, dval, NULL, &err) == G5_OK, "%s: %s", what, err.msg);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(got, dout, sizeof(int32_t) * nr, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gv, dval, sizeof(float) * nr, cudaMemcpyDeviceToHost));
    for (int r = 0; r < nr; r++) {
        T_CHECK(got[r] == want[r], "%s, row %d: got %d want %d", what, r, got[r], want[r]);
        const int same = want[r] < 0 ? gv[r] != gv[r] : !memcmp(&gv[r], &h[r * ld + want[r]], 4);
        T_CHECK(same, "%s, value of row %d: %g", what, r, (double)gv[r]);
    }
    free(got), free(gv);
    CK(cudaFree(dout)); CK(cudaFree(dval));
}

static void test_add_argmax(void) {
    const int64_t n = 6144 * 3 + 1;
    float *ha = xmalloc(sizeof(float) * n), *hb = xmalloc(sizeof(float) * n), *hy = xmalloc(sizeof(float) * n);
    for (int64_t i = 0; i < n; i++) ha[i] = unif(-10, 10), hb[i] = unif(-10, 10);
    float *da = dalloc(sizeof(float) * n), *db = dalloc(sizeof(float) * n), *dy = dalloc(sizeof(float) * (n + 1));
    CK(cudaMemcpy(da, ha, sizeof(float) * n, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db, hb, sizeof(float) * n, cudaMemcpyHostToDevice));
    poison(dy, sizeof(float) * (n + 1));
    g5_error err = {0};
    T_CHECK(cuk_add(da, db, dy, n, NULL, &err) == G5_OK, "add: %s", err.msg);
    CK(cudaDeviceSynchronize());
    float *hy1 = xmalloc(sizeof(float) * (n + 1));
    CK(cudaMemcpy(hy1, dy, sizeof(float) * (n + 1), cudaMemcpyDeviceToHost));
    int ok = is_poison(hy1[n]);
    for (int64_t i = 0; i < n; i++) ok &= hy1[i] == ha[i] + hb[i];
    T_CHECK(ok, "add: result differs from a + b (or wrote past n)");
    /* in place: a += b */
    T_CHECK(cuk_add(da, db, da, n, NULL, &err) == G5_OK, "add in place: %s", err.msg);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(hy, da, sizeof(float) * n, cudaMemcpyDeviceToHost));
    ok = 1;
    for (int64_t i = 0; i < n; i++) ok &= hy[i] == ha[i] + hb[i];
    T_CHECK(ok, "add in place: result differs from a + b");
    free(ha), free(hb), free(hy), free(hy1);
    CK(cudaFree(da)); CK(cudaFree(db)); CK(cudaFree(dy));

    /* argmax over 6 rows of a vocabulary-sized row. */
    const int64_t V = 154880, ldx = V + 3, rows = 6;
    float *hx = xmalloc(sizeof(float) * rows * ldx);
    for (int64_t i = 0; i < rows * ldx; i++) hx[i] = unif(-20, 20);
    int32_t want[6];
    /* row 0: random; row 1: tie at 777 and 150000 (777 wins); row 2: NaNs incl. index 0 and a
     * NaN beyond the max; row 3: all NaN -> -1; row 4: all -inf -> 0; row 5: max at the last
     * element, larger values in the padding (must be ignored). */
    hx[1 * ldx + 777] = 50.0f, hx[1 * ldx + 150000] = 50.0f;
    hx[2 * ldx + 0] = NAN, hx[2 * ldx + 5] = NAN, hx[2 * ldx + 99] = 40.0f, hx[2 * ldx + 100] = NAN;
    for (int64_t i = 0; i < V; i++) hx[3 * ldx + i] = NAN, hx[4 * ldx + i] = -INFINITY;
    hx[5 * ldx + V - 1] = 30.0f, hx[5 * ldx + V] = 99.0f, hx[5 * ldx + V + 1] = 98.0f;
    for (int r = 0; r < 6; r++) {
        int32_t best = -1;
        for (int64_t i = 0; i < V; i++) {
            const float v = hx[r * ldx + i];
            if (v != v) continue;
            if (best < 0 || v > hx[r * ldx + best]) best = (int32_t)i;
        }
        want[r] = best;
    }
    T_CHECK(want[1] == 777 && want[2] == 99 && want[3] == -1 && want[4] == 0 && want[5] == V - 1,
            "argmax: the test's own expectations are wrong");
    float *dx = dalloc(sizeof(float) * rows * ldx);
    int32_t *dout = dalloc(sizeof(int32_t) * rows);
    CK(cudaMemcpy(dx, hx, sizeof(float) * rows * ldx, cudaMemcpyHostToDevice));
    poison(dout, sizeof(int32_t) * rows);
    T_CHECK(cuk_argmax(dx, ldx, rows, V, dout, NULL, NULL, &err) == G5_OK, "argmax: %s", err.msg);
    CK(cudaDeviceSynchronize());
    int32_t got[6];
    CK(cudaMemcpy(got, dout, sizeof got, cudaMemcpyDeviceToHost));
    for (int r = 0; r < 6; r++) T_CHECK(got[r] == want[r], "argmax row %d: got %d want %d", r, got[r], want[r]);
    /* with the values: the same indices, each row's value that of its index (NaN for row 3) */
    argmax_values_check("argmax with values", dx, hx, ldx, (int)rows, V, want);
    free(hx);
    CK(cudaFree(dx)); CK(cudaFree(dout));
    /* aligned rows of a length that is not a multiple of 4 (float4 pieces, then the tail one by
     * one): the maximum in the tail, in the last whole piece, tied across the two */
    {
        const int64_t n = 4099, ld = 4100, nr = 5;
        float *h = xmalloc(sizeof(float) * nr * ld);
        for (int64_t i = 0; i < nr * ld; i++) h[i] = unif(-5, 5);
        h[0 * ld + 4097] = 9.0f;                          /* row 0: in the tail */
        h[1 * ld + 4095] = 9.0f;                          /* row 1: the last whole piece */
        h[2 * ld + 4098] = 9.0f, h[2 * ld + 17] = 9.0f;   /* row 2: tie, the lower id wins */
        h[0 * ld + 4099] = 50.0f;                         /* padding: never read */
        h[3 * ld + 0] = NAN, h[3 * ld + 6] = NAN, h[3 * ld + 2001] = NAN; /* row 3: NaNs in pieces */
        h[3 * ld + 2002] = 8.0f;
        for (int64_t i = 0; i < n; i++) h[4 * ld + i] = NAN; /* row 4: all NaN: -1 */
        const int32_t wt[5] = {4097, 4095, 17, 2002, -1};
        float *d = dalloc(sizeof(float) * nr * ld);
        CK(cudaMemcpy(d, h, sizeof(float) * nr * ld, cudaMemcpyHostToDevice));
        argmax_values_check("argmax tail", d, h, ld, (int)nr, n, wt);
        free(h);
        CK(cudaFree(d));
    }
}

/* ---------------- host-side validation (no kernel runs) ---------------- */

static void expect_bad(g5_status st, const g5_error *err, g5_status want, const char *needle,
                       const char *what) {
    T_CHECK(st == want, "%s: status %s, want %s (%s)", what, g5_strerror(st), g5_strerror(want), err->msg);
    T_CHECK(strstr(err->msg, needle) != NULL, "%s: message '%s' does not name '%s'", what, err->msg, needle);
}

static void test_validation(void) {
    void *w = dalloc(1 << 20), *x = dalloc(1 << 20), *y = dalloc(1 << 20);
    g5_error err = {0};
    cuk_gemv_args ok = {.w_type = QT_Q4_K, .w = w, .k = 512, .m = 16, .x = x,
                        .x_type = CUK_ACT_F32, .ldx = 512, .n = 1, .y = y, .ldy = 16};
    cuk_gemv_args a = ok;
    a.k = 100;
    expect_bad(cuk_gemv(&a, NULL, &err), &err, G5_ERR_INVALID_ARG, "k=100", "gemv k");
    a = ok, a.m = 0;
    expect_bad(cuk_gemv(&a, NULL, &err), &err, G5_ERR_INVALID_ARG, "m=0", "gemv m");
    a = ok, a.n = 17;
    expect_bad(cuk_gemv(&a, NULL, &err), &err, G5_ERR_INVALID_ARG, "n=17", "gemv n");
    a = ok, a.ldx = 256;
    expect_bad(cuk_gemv(&a, NULL, &err), &err, G5_ERR_INVALID_ARG, "ldx=256", "gemv ldx");
    a = ok, a.ldx = 514;
    expect_bad(cuk_gemv(&a, NULL, &err), &err, G5_ERR_INVALID_ARG, "ldx=514", "gemv ldx%4");
    a = ok, a.ldy = 15;
    expect_bad(cuk_gemv(&a, NULL, &err), &err, G5_ERR_INVALID_ARG, "ldy=15", "gemv ldy");
    a = ok, a.w = (uint8_t *)w + 2;
    expect_bad(cuk_gemv(&a, NULL, &err), &err, G5_ERR_INVALID_ARG, "w is not 16-byte aligned", "gemv w align");
    a = ok, a.x = (uint8_t *)x + 4;
    expect_bad(cuk_gemv(&a, NULL, &err), &err, G5_ERR_INVALID_ARG, "x is not 16-byte aligned", "gemv x align");
    a = ok, a.w_type = QT_Q8_K;
    expect_bad(cuk_gemv(&a, NULL, &err), &err, G5_ERR_UNSUPPORTED, "Q8_K", "gemv type");
    a = ok, a.x_type = 7;
    expect_bad(cuk_gemv(&a, NULL, &err), &err, G5_ERR_INVALID_ARG, "type 7", "gemv x_type");
    a = ok, a.w_type = QT_Q8_0, a.k = 48;
    expect_bad(cuk_gemv(&a, NULL, &err), &err, G5_ERR_INVALID_ARG, "k=48", "gemv q8_0 k");

    cuk_moe_gate_up_args g = {.w_type = QT_Q4_K, .w_gate = w, .w_up = w, .k = 256, .m = 8,
                              .n_expert = 4, .ids = x, .top_k = 5, .ld_ids = 5, .x = x,
                              .x_type = CUK_ACT_F32, .ldx = 256, .n_tok = 1, .out = y, .ldo = 8};
    expect_bad(cuk_moe_gate_up(&g, NULL, &err), &err, G5_ERR_INVALID_ARG, "top_k=5", "gate_up top_k");
    g.top_k = 2, g.ld_ids = 1;
    expect_bad(cuk_moe_gate_up(&g, NULL, &err), &err, G5_ERR_INVALID_ARG, "ld_ids=1", "gate_up ld_ids");
    g.ld_ids = 2, g.ldo = 7;
    expect_bad(cuk_moe_gate_up(&g, NULL, &err), &err, G5_ERR_INVALID_ARG, "ldo=7", "gate_up ldo");
    g.ldo = 8;
    expect_bad(cuk_moe_gate_up(&g, NULL, &err), &err, G5_ERR_INVALID_ARG, "plan is NULL", "gate_up plan");
    cuk_moe_down_args d = {.w_type = QT_Q6_K, .w = w, .k = 256, .m = 8, .n_expert = 4,
                           .ids = x, .wts = NULL, .top_k = 2, .ld_ids = 2, .ld_wts = 2,
                           .h = x, .h_type = CUK_ACT_F32, .ldh = 256, .n_tok = 1, .y = y, .ldy = 8};
    expect_bad(cuk_moe_down(&d, NULL, &err), &err, G5_ERR_INVALID_ARG, "wts is NULL", "down wts");
    d.wts = y, d.n_tok = 0;
    expect_bad(cuk_moe_down(&d, NULL, &err), &err, G5_ERR_INVALID_ARG, "n_tok=0", "down n_tok");
    d.n_tok = 1;
    expect_bad(cuk_moe_down(&d, NULL, &err), &err, G5_ERR_INVALID_ARG, "plan is NULL", "down plan");
    d.plan = (const int32_t *)x;
    expect_bad(cuk_moe_down(&d, NULL, &err), &err, G5_ERR_INVALID_ARG, "part is NULL", "down part");
    d.part = y, d.ldp = 7;
    expect_bad(cuk_moe_down(&d, NULL, &err), &err, G5_ERR_INVALID_ARG, "ldp=7", "down ldp");
    d.ldp = 8, d.n_tok = 2049;
    expect_bad(cuk_moe_down(&d, NULL, &err), &err, G5_ERR_INVALID_ARG, "exceed 4096", "down pairs");
    cuk_moe_plan_args pa = {(const int32_t *)x, y, 513, 8, 8, 8, 64, (int32_t *)x};
    expect_bad(cuk_moe_plan(&pa, NULL, &err), &err, G5_ERR_INVALID_ARG, "pairs outside 1..4096", "plan pairs");
    pa.n_tok = 1, pa.n_expert = 5000;
    expect_bad(cuk_moe_plan(&pa, NULL, &err), &err, G5_ERR_INVALID_ARG, "n_expert=5000", "plan n_expert");
    pa.n_expert = 64, pa.ld_wts = 4;
    expect_bad(cuk_moe_plan(&pa, NULL, &err), &err, G5_ERR_INVALID_ARG, "ld_wts=4", "plan ld_wts");
    pa.ld_wts = 8, pa.wts = NULL;
    expect_bad(cuk_moe_plan(&pa, NULL, &err), &err, G5_ERR_INVALID_ARG, "is NULL", "plan wts");

    expect_bad(cuk_rms_norm(x, 8, y, y, 8, 1, 0, 1e-5f, NULL, &err), &err, G5_ERR_INVALID_ARG,
               "dim=0", "rms_norm dim");
    expect_bad(cuk_layer_norm(&(cuk_layer_norm_args){x, 4, y, y, y, 8, 1, 8, 1e-5f}, NULL, &err), &err, G5_ERR_INVALID_ARG,
               "ldx=4", "layer_norm ldx");
    expect_bad(cuk_rope(&(cuk_rope_args){x, 1, 64, 1, 64, 0, 63, 1e4f, x}, NULL, &err), &err, G5_ERR_INVALID_ARG,
               "n_rot=63", "rope n_rot");
    expect_bad(cuk_rope(&(cuk_rope_args){x, 2, 60, 1, 64, 0, 64, 1e4f, x}, NULL, &err), &err, G5_ERR_INVALID_ARG,
               "tok_stride=60", "rope tok_stride");
    expect_bad(cuk_add(x, NULL, y, 4, NULL, &err), &err, G5_ERR_INVALID_ARG, "b is NULL", "add b");
    expect_bad(cuk_argmax(x, 4, 1, 8, y, NULL, NULL, &err), &err, G5_ERR_INVALID_ARG, "ldx=4", "argmax ldx");
    CK(cudaFree(w)); CK(cudaFree(x)); CK(cudaFree(y));
}

/* A warp's butterfly sum (acc += shfl_xor(acc, o) for o = 16 .. 1) of the lanes' partials p,
 * emulated: lane 0's total (p is overwritten). */
static float lane_tree(float p[32]) {
    for (int o = 16; o > 0; o >>= 1) {
        float q[32];
        for (int l = 0; l < 32; l++) q[l] = p[l] + p[l ^ o];
        memcpy(p, q, 32 * sizeof *p);
    }
    return p[0];
}

/* The bits cuk_head_gemv promises (cuda/cuk_head_gemv.h), emulated: lane l's partial over its
 * float4 pieces l + 32 j in j order (fmaf chain from 0), then the lanes' tree xor 16, 8, 4, 2, 1. */
static float head_gemv_emul(const float *w, const float *x, int k) {
    float p[32];
    for (int l = 0; l < 32; l++) {
        float acc = 0.0f;
        for (int c4 = l; c4 < k / 4; c4 += 32)
            for (int e = 0; e < 4; e++) acc = fmaf(w[4 * c4 + e], x[4 * c4 + e], acc);
        p[l] = acc;
    }
    return lane_tree(p);
}

/* cuk_head_gemv: every output bit-identical to the emulated order, for f32 and bf16 inputs, odd
 * row counts (a warp's clamped rows), k below a full lane set, and n across the pass size. */
static void test_head_gemv(void) {
    static const struct { int H, m, k; } S[] = {{3, 37, 512}, {2, 256, 512}, {5, 9, 200}, {1, 4, 1024}};
    static const int NS[] = {1, 3, 8, 19, 32};
    for (size_t si = 0; si < sizeof S / sizeof S[0]; si++) {
        const int H = S[si].H, m = S[si].m, k = S[si].k, N = 32;
        const int64_t ldw = k + 4, ld_head = (int64_t)m * ldw + 8, ldxh = k + 12, ldx = H * ldxh + 4;
        const int64_t ldyh = m + 3, ldy = H * ldyh + 5;
        float *w = xmalloc((size_t)(H * ld_head) * 4), *x = xmalloc((size_t)(N * ldx) * 4);
        uint16_t *xb = xmalloc((size_t)(N * ldx) * 2);
        float *xr = xmalloc((size_t)k * 4), *y = xmalloc((size_t)(N * ldy) * 4);
        for (int64_t i = 0; i < H * ld_head; i++) w[i] = unif(-1.0f, 1.0f);
        for (int64_t i = 0; i < N * ldx; i++) {
            x[i] = unif(-2.0f, 2.0f);
            xb[i] = (uint16_t)(bits(x[i]) >> 16);
        }
        float *dw = dup_d(w, (size_t)(H * ld_head) * 4), *dy = dalloc((size_t)(N * ldy) * 4);
        void *dx = dup_d(x, (size_t)(N * ldx) * 4), *dxb = dup_d(xb, (size_t)(N * ldx) * 2);
        for (int bf = 0; bf < 2; bf++)
            for (size_t ni = 0; ni < sizeof NS / sizeof NS[0]; ni++) {
                const int n = NS[ni];
                const cuk_head_gemv_args a = {dw, ld_head, ldw, H, m, k, bf ? dxb : dx, bf ? CUK_ACT_BF16 : CUK_ACT_F32,
                                              ldx, ldxh, n, dy, ldy, ldyh, NULL, NULL, 0, 0};
                poison(dy, (size_t)(N * ldy) * 4);
                g5_error err = {0};
                T_CHECK(cuk_head_gemv_fits(&a) && cuk_head_gemv(&a, NULL, &err) == G5_OK, "head_gemv: %s", err.msg);
                get(y, dy, (size_t)(N * ldy) * 4);
                int same = 1, pad = 1;
                for (int t = 0; t < n; t++)
                    for (int h = 0; h < H; h++) {
                        for (int c = 0; c < k; c++) {
                            const int64_t xi = t * ldx + h * ldxh + c;
                            if (bf) {
                                const uint32_t u = (uint32_t)xb[xi] << 16;
                                memcpy(&xr[c], &u, 4);
                            } else {
                                xr[c] = x[xi];
                            }
                        }
                        for (int r = 0; r < m; r++) {
                            const float e = head_gemv_emul(w + h * ld_head + r * ldw, xr, k);
                            same &= bits(e) == bits(y[t * ldy + h * ldyh + r]);
                        }
                    }
                for (int t = 0; t < N; t++) /* everything but the outputs stays poisoned */
                    for (int64_t i = 0; i < ldy; i++)
                        if (t >= n || i / ldyh >= H || i % ldyh >= m) pad &= is_poison(y[t * ldy + i]);
                T_CHECK(same, "head_gemv H=%d m=%d k=%d n=%d %s: every output has the emulated order's bits", H, m, k, n,
                        bf ? "bf16" : "f32");
                T_CHECK(pad, "head_gemv H=%d m=%d k=%d n=%d: nothing written past the outputs", H, m, k, n);
            }
        note("  head_gemv H=%d m=%d k=%d: n = 1..32, f32 and bf16\n", H, m, k);
        CK(cudaFree(dw)); CK(cudaFree(dy)); CK(cudaFree(dx)); CK(cudaFree(dxb));
        free(w), free(x), free(xb), free(xr), free(y);
    }
}

/* The bits cuk_gemv_wide promises (cuda/cuk_gemv_wide.h), emulated: per slice s of ks = k / 8
 * columns, lane l's fmaf chain over its float4 pieces l + 32 j in j order, the lanes' tree xor
 * 16 .. 1, then the 8 slice sums added in order from 0. */
static float gemv_wide_emul(const float *w, const float *x, int k) {
    const int ks = k / 8;
    float total = 0.0f;
    for (int sl = 0; sl < 8; sl++) {
        float p[32];
        for (int l = 0; l < 32; l++) {
            float acc = 0.0f;
            for (int c = 4 * l; c < ks; c += 128)
                for (int e = 0; e < 4; e++) acc = fmaf(w[sl * ks + c + e], x[sl * ks + c + e], acc);
            p[l] = acc;
        }
        total = total + lane_tree(p);
    }
    return total;
}

/* cuk_gemv_wide: every output bit-identical to the emulated order (so a row's bits never depend
 * on n), rows past m and columns past m untouched, for the router's shapes (64 and 256 x 6144),
 * rows that leave a CTA's warps idle, the largest and smallest slices, and n past one launch's 32
 * vectors; the shapes it refuses. */
static void test_gemv_wide(void) {
    static const struct { int m, k; } S[] = {{64, 6144}, {256, 6144}, {13, 2048}, {5, 8192}, {9, 32}};
    static const int NS[] = {1, 3, 32, 40};
    for (size_t si = 0; si < sizeof S / sizeof S[0]; si++) {
        const int m = S[si].m, k = S[si].k, N = 40;
        const int64_t ldx = k + 4, ldy = m + 3;
        float *w = xmalloc((size_t)m * k * 4), *x = xmalloc((size_t)N * ldx * 4), *y = xmalloc((size_t)N * ldy * 4);
        for (int64_t i = 0; i < (int64_t)m * k; i++) w[i] = unif(-1.0f, 1.0f);
        for (int64_t i = 0; i < N * ldx; i++) x[i] = unif(-2.0f, 2.0f);
        float *dw = dup_d(w, (size_t)m * k * 4), *dx = dup_d(x, (size_t)N * ldx * 4), *dy = dalloc((size_t)N * ldy * 4);
        for (size_t ni = 0; ni < sizeof NS / sizeof NS[0]; ni++) {
            const int n = NS[ni];
            const cuk_gemv_args a = {QT_F32, dw, k, m, dx, CUK_ACT_F32, ldx, n, dy, ldy};
            poison(dy, (size_t)N * ldy * 4);
            g5_error err = {0};
            T_CHECK(cuk_gemv_wide_fits(&a) && cuk_gemv_wide(&a, NULL, &err) == G5_OK, "gemv_wide: %s", err.msg);
            get(y, dy, (size_t)N * ldy * 4);
            int same = 1, pad = 1;
            for (int v = 0; v < N; v++)
                for (int64_t i = 0; i < ldy; i++) {
                    if (v < n && i < m)
                        same &= bits(gemv_wide_emul(w + i * k, x + v * ldx, k)) == bits(y[v * ldy + i]);
                    else
                        pad &= is_poison(y[v * ldy + i]);
                }
            T_CHECK(same, "gemv_wide m=%d k=%d n=%d: every output has the emulated order's bits", m, k, n);
            T_CHECK(pad, "gemv_wide m=%d k=%d n=%d: nothing written past the outputs", m, k, n);
        }
        note("  gemv_wide m=%d k=%d: n = 1, 3, 32, 40\n", m, k);
        CK(cudaFree(dw)); CK(cudaFree(dx)); CK(cudaFree(dy));
        free(w), free(x), free(y);
    }
    float *d = dalloc(4096 * 4);
    const cuk_gemv_args ok = {QT_F32, d, 64, 8, d, CUK_ACT_F32, 64, 1, d, 8};
    cuk_gemv_args bad = ok;
    T_CHECK(cuk_gemv_wide_fits(&ok), "gemv_wide takes k=64");
    bad.k = 48, bad.ldx = 64;
    T_CHECK(!cuk_gemv_wide_fits(&bad), "gemv_wide refuses k=48 (not a multiple of 32)");
    bad = ok, bad.k = 8224, bad.ldx = 8224;
    T_CHECK(!cuk_gemv_wide_fits(&bad), "gemv_wide refuses k=8224 (over 8192)");
    bad = ok, bad.x_type = CUK_ACT_BF16;
    T_CHECK(!cuk_gemv_wide_fits(&bad), "gemv_wide refuses bf16 input");
    bad = ok, bad.w_type = QT_Q8_0;
    T_CHECK(!cuk_gemv_wide_fits(&bad), "gemv_wide refuses Q8_0 weights");
    g5_error err = {0};
    T_CHECK(cuk_gemv_wide(&bad, NULL, &err) == G5_ERR_INVALID_ARG, "gemv_wide: a refused shape is an error");
    CK(cudaFree(d));
}

/* The one-token absorption that also ropes the query (q_rot, q itself): the same qlat (l0: the
 * absorption without it), q's nope part untouched and its rope part cuk_rope's bits at the same
 * position, from kv_b and from its int8 form; the refused forms. dqh: [H][nope + rope] (qh on the
 * host, left as it was). */
static void test_absorb_rot(const float *dqh, const float *qh, const float *dkvb, const int8_t *dkq, const float *dsk,
                            int H, int NOPE, int R, int KL, int HR, const float *l0) {
    const size_t nq = (size_t)H * (NOPE + R);
    const int32_t pos = 70001 + 13 * H;
    int32_t *dpos = dup_d(&pos, 4);
    float *dq = dalloc(nq * 4), *dr = dup_d(qh, nq * 4), *dl = dalloc((size_t)H * KL * 4);
    float *q1 = xmalloc(nq * 4), *qr = xmalloc(nq * 4), *l1 = xmalloc((size_t)H * KL * 4);
    g5_error err = {0};
    const float theta = 1000000.0f;
    const cuk_rope_args ra = {.x = dr, .n_tok = 1, .tok_stride = (int64_t)nq, .n_head = H, .head_stride = NOPE + R,
                              .rot_off = NOPE, .n_rot = R, .theta = theta, .pos = dpos};
    T_CHECK(cuk_rope(&ra, NULL, &err) == G5_OK, "absorb q_rot: the reference rope: %s", err.msg);
    get(qr, dr, nq * 4);
    const cuk_mla_dims d1 = {1, H, NOPE, R, KL};
    T_CHECK(cuk_mla_absorb_rotates(&d1), "absorb q_rot: one token of nope %d, rope %d is taken", NOPE, R);
    for (int wq = 0; wq < 2; wq++) {
        CK(cudaMemcpy(dq, dqh, nq * 4, cudaMemcpyDeviceToDevice));
        cuk_mla_absorb_args ab = {.d = d1, .q = dq, .kvb = dkvb, .head_rows = HR, .qlat = dl, .kq = wq ? dkq : NULL,
                                  .ksk = wq ? dsk : NULL, .q_rot = dq, .pos = dpos, .theta = theta};
        poison(dl, (size_t)H * KL * 4);
        T_CHECK(cuk_mla_absorb(&ab, NULL, &err) == G5_OK, "absorb q_rot wq=%d: %s", wq, err.msg);
        get(l1, dl, (size_t)H * KL * 4);
        get(q1, dq, nq * 4);
        T_CHECK(!memcmp(l0, l1, (size_t)H * KL * 4), "absorb q_rot wq=%d H=%d: qlat bit for bit the absorption alone",
                wq, H);
        T_CHECK(!memcmp(q1, qr, nq * 4), "absorb q_rot wq=%d H=%d: q bit for bit cuk_rope of its rope part, nope "
                "part unchanged", wq, H);
        /* refused: another array than q, no position, two tokens, nope off the one-token kernel */
        ab.q_rot = dr;
        T_CHECK(cuk_mla_absorb(&ab, NULL, &err) == G5_ERR_INVALID_ARG, "absorb: q_rot other than q refused");
        ab.q_rot = dq;
        ab.pos = NULL;
        T_CHECK(cuk_mla_absorb(&ab, NULL, &err) == G5_ERR_INVALID_ARG, "absorb: q_rot without pos refused");
        ab.pos = dpos;
        ab.theta = 0.0f;
        T_CHECK(cuk_mla_absorb(&ab, NULL, &err) == G5_ERR_INVALID_ARG, "absorb: q_rot with theta 0 refused");
        ab.theta = theta;
        ab.d.n_tok = 2;
        T_CHECK(!cuk_mla_absorb_rotates(&ab.d) && cuk_mla_absorb(&ab, NULL, &err) == G5_ERR_INVALID_ARG,
                "absorb: q_rot of two tokens refused");
        ab.d.n_tok = 1;
        ab.d.nope = 48;
        T_CHECK(!cuk_mla_absorb_rotates(&ab.d) && cuk_mla_absorb(&ab, NULL, &err) == G5_ERR_INVALID_ARG,
                "absorb: q_rot with nope 48 refused");
    }
    CK(cudaFree(dpos)); CK(cudaFree(dq)); CK(cudaFree(dr)); CK(cudaFree(dl));
    free(q1), free(qr), free(l1);
}

/* kv_b's exact int8 form (cuk_kvb_exact) from random attn_k_b / attn_v_b blocks of each type pair:
 * the kv_b of the CPU's dequantization (W_UK[h][d][c] = k_b[h][c][d]) proves exact (no element
 * counted), every scale x integer read back equals it, one changed float of kv_b is counted; then
 * the kernels that read the form give the float32 form's bits: cuk_head_gemv (W_UV, n = 1..32)
 * and the one-token cuk_mla_absorb (W_UK). */
static void test_kvb_exact(void) {
    static const struct { uint32_t kt, vt; int H; } S[] = {
        {QT_Q5_0, QT_Q6_K, 3}, {QT_Q8_0, QT_Q8_0, 2}, {QT_Q4_0, QT_IQ4_XS, 1}, {QT_IQ4_NL, QT_Q5_0, 2}};
    const int NOPE = 192, V = 256, KL = 512, R = 64, HR = NOPE + V;
    T_CHECK(!cuk_kvb_exact_takes(QT_Q4_K) && !cuk_kvb_exact_takes(QT_Q5_1) && !cuk_kvb_exact_takes(QT_F32) &&
                cuk_kvb_exact_takes(QT_Q6_K),
            "kvb_exact: the types with a product minus a term, and float types, have no int8 form");
    for (size_t si = 0; si < sizeof S / sizeof S[0]; si++) {
        const int H = S[si].H;
        const quant_type_info *kt = quant_type_get(S[si].kt), *vt = quant_type_get(S[si].vt);
        const size_t kbytes = (size_t)H * KL * (NOPE / kt->block_elems) * kt->block_bytes;
        const size_t vbytes = (size_t)H * V * (KL / vt->block_elems) * vt->block_bytes;
        const size_t nkv = (size_t)H * HR * KL;
        uint8_t *kb = xmalloc(kbytes), *vb = xmalloc(vbytes);
        float *kf = xmalloc((size_t)H * KL * NOPE * 4), *vf = xmalloc((size_t)H * V * KL * 4), *kvb = xmalloc(nkv * 4);
        T_CHECK(quant_fill_random(S[si].kt, kb, kbytes / kt->block_bytes, &g_rng) == G5_OK &&
                    quant_fill_random(S[si].vt, vb, vbytes / vt->block_bytes, &g_rng) == G5_OK &&
                    quant_dequantize(S[si].kt, kb, (uint64_t)H * KL * NOPE, kf) == G5_OK &&
                    quant_dequantize(S[si].vt, vb, (uint64_t)H * V * KL, vf) == G5_OK,
                "kvb_exact %s/%s: random blocks", kt->name, vt->name);
        for (int h = 0; h < H; h++)
            for (int c = 0; c < KL; c++) {
                for (int d = 0; d < NOPE; d++) kvb[((size_t)h * HR + d) * KL + c] = kf[((size_t)h * KL + c) * NOPE + d];
                for (int j = 0; j < V; j++) kvb[((size_t)h * HR + NOPE + j) * KL + c] = vf[((size_t)h * V + j) * KL + c];
            }
        void *dkb = dup_d(kb, kbytes), *dvb = dup_d(vb, vbytes);
        float *dkvb = dup_d(kvb, nkv * 4);
        int8_t *dkq = dalloc(nkv);
        float *dsk = dalloc((size_t)H * (NOPE / 16) * KL * 4), *dsv = dalloc((size_t)H * V * (KL / 16) * 4);
        cuk_kvb_exact_args a = {S[si].kt, S[si].vt, dkb, dvb, H, NOPE, V, KL, dkvb, dkq, dsk, dsv};
        g5_error err = {0};
        uint64_t bad = 1;
        T_CHECK(cuk_kvb_exact(&a, NULL, &bad, &err) == G5_OK && bad == 0, "kvb_exact %s/%s H=%d: every product is kv_b's "
                "float (%llu differ) %s", kt->name, vt->name, H, (unsigned long long)bad, err.msg);
        int8_t *kq = xmalloc(nkv);
        float *sk = xmalloc((size_t)H * (NOPE / 16) * KL * 4), *sv = xmalloc((size_t)H * V * (KL / 16) * 4);
        get(kq, dkq, nkv);
        get(sk, dsk, (size_t)H * (NOPE / 16) * KL * 4);
        get(sv, dsv, (size_t)H * V * (KL / 16) * 4);
        size_t diff = 0;
        for (int h = 0; h < H; h++)
            for (int r = 0; r < HR; r++)
                for (int c = 0; c < KL; c++) {
                    const size_t e = ((size_t)h * HR + r) * KL + c;
                    const float s = r < NOPE ? sk[((size_t)h * (NOPE / 16) + r / 16) * KL + c]
                                             : sv[((size_t)h * V + r - NOPE) * (KL / 16) + c / 16];
                    volatile float p = s * (float)kq[e];
                    diff += bits(p) != bits(kvb[e]);
                }
        T_CHECK(diff == 0, "kvb_exact %s/%s: %zu of %zu read back differ from kv_b", kt->name, vt->name, diff, nkv);
        /* one float off in each part: counted */
        const size_t ek = ((size_t)(H - 1) * HR + 77) * KL + 301, ev = ((size_t)(H - 1) * HR + NOPE + 5) * KL + 17;
        float *kvb2 = xmalloc(nkv * 4);
        memcpy(kvb2, kvb, nkv * 4);
        kvb2[ek] = kvb2[ek] == 0.0f ? 1.0f : -kvb2[ek];
        kvb2[ev] = nextafterf(kvb2[ev], INFINITY);
        float *dkvb2 = dup_d(kvb2, nkv * 4);
        a.kvb = dkvb2;
        T_CHECK(cuk_kvb_exact(&a, NULL, &bad, &err) == G5_OK && bad == 2, "kvb_exact: two changed floats counted (%llu)",
                (unsigned long long)bad);
        a.nope = 100;
        T_CHECK(cuk_kvb_exact(&a, NULL, &bad, &err) == G5_ERR_INVALID_ARG, "kvb_exact: nope 100 refused");
        /* W_UV from the form: the float32 kernel's bits, n across the pass size, with int8 rows too */
        const int N = 32;
        float *x = xmalloc((size_t)N * H * KL * 4), *y0 = xmalloc((size_t)N * H * V * 4), *y1 = xmalloc((size_t)N * H * V * 4);
        for (size_t i = 0; i < (size_t)N * H * KL; i++) x[i] = unif(-2.0f, 2.0f);
        float *dx = dup_d(x, (size_t)N * H * KL * 4), *dy = dalloc((size_t)N * H * V * 4);
        static const int NS[] = {1, 3, 8, 9, 32};
        int same = 1;
        for (size_t ni = 0; ni < sizeof NS / sizeof NS[0]; ni++)
            for (int wq = 0; wq < 2; wq++) {
                cuk_head_gemv_args g = {dkvb + (size_t)NOPE * KL, (int64_t)HR * KL, KL, H, V, KL, dx, CUK_ACT_F32,
                                        (int64_t)H * KL, KL, NS[ni], dy, (int64_t)H * V, V,
                                        wq ? dkq + (size_t)NOPE * KL : NULL, wq ? dsv : NULL, (int64_t)V * (KL / 16),
                                        KL / 16};
                if (wq) g.w = NULL;
                poison(dy, (size_t)N * H * V * 4);
                T_CHECK(cuk_head_gemv_fits(&g) && cuk_head_gemv(&g, NULL, &err) == G5_OK, "head_gemv wq: %s", err.msg);
                get(wq ? y1 : y0, dy, (size_t)N * H * V * 4);
                if (wq)
                    for (size_t i = 0; i < (size_t)NS[ni] * H * V; i++) same &= bits(y0[i]) == bits(y1[i]);
            }
        T_CHECK(same, "kvb_exact %s/%s: W_UV from the int8 form has the float32 kernel's bits, n = 1..32", kt->name,
                vt->name);
        /* W_UK, one token */
        float *qh = xmalloc((size_t)H * (NOPE + R) * 4), *l0 = xmalloc((size_t)H * KL * 4), *l1 = xmalloc((size_t)H * KL * 4);
        for (size_t i = 0; i < (size_t)H * (NOPE + R); i++) qh[i] = unif(-2.0f, 2.0f);
        float *dqh = dup_d(qh, (size_t)H * (NOPE + R) * 4), *dl = dalloc((size_t)H * KL * 4);
        for (int wq = 0; wq < 2; wq++) {
            const cuk_mla_absorb_args ab = {.d = {1, H, NOPE, R, KL}, .q = dqh, .kvb = dkvb, .head_rows = HR, .qlat = dl,
                                            .kq = wq ? dkq : NULL, .ksk = wq ? dsk : NULL};
            poison(dl, (size_t)H * KL * 4);
            T_CHECK(cuk_mla_absorb(&ab, NULL, &err) == G5_OK, "absorb wq=%d: %s", wq, err.msg);
            get(wq ? l1 : l0, dl, (size_t)H * KL * 4);
        }
        T_CHECK(!memcmp(l0, l1, (size_t)H * KL * 4), "kvb_exact %s/%s: one-token W_UK from the int8 form has the float32 "
                "kernel's bits", kt->name, vt->name);
        test_absorb_rot(dqh, qh, dkvb, dkq, dsk, H, NOPE, R, KL, HR, l0);
        note("  kvb_exact %s/%s H=%d: exact, read back, W_UV n=1..32 and W_UK bits equal\n", kt->name, vt->name, H);
        CK(cudaFree(dkb)); CK(cudaFree(dvb)); CK(cudaFree(dkvb)); CK(cudaFree(dkvb2)); CK(cudaFree(dkq));
        CK(cudaFree(dsk)); CK(cudaFree(dsv)); CK(cudaFree(dx)); CK(cudaFree(dy));
        CK(cudaFree(dqh)); CK(cudaFree(dl));
        free(kb), free(vb), free(kf), free(vf), free(kvb), free(kvb2), free(kq), free(sk), free(sv), free(x), free(y0);
        free(y1), free(qh), free(l0), free(l1);
    }
}

int main(void) {
    const char *dp = getenv("G5_TEST_DETAIL");
    if (dp && *dp) g_detail = fopen(dp, "a");
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        printf("FAIL: no CUDA device\n");
        t_failed++;
        return t_report("test_kernels");
    }
    test_validation();
    test_norms();
    test_rope();
    test_add_argmax();
    test_gemv();
    test_moe();
    test_head_gemv();
    test_kvb_exact();
    test_gemv_wide();
    if (g_detail) {
        fprintf(g_detail, "test_kernels: %d passed, %d failed\n", t_passed, t_failed);
        fclose(g_detail);
    }
    return t_report("test_kernels");
}
