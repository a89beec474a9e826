/* MoE prefill products of one GLM-5-shaped layer (64 local experts, hidden 6144, expert width
 * 2048, gate/up Q4_K, down Q5_K: the peer model's mix): cuk_moe_mm (weights decoded inside the
 * tile, two launches) against the path it replaced (the weights dequantized to an fp16 copy, three
 * launches, then one cuBLAS fp16 GEMM per expert and projection plus the SwiGLU), at R rows per
 * expert (16: what each of GLM-5's 256 experts gets from a 512-token prompt; 64: 512 tokens with
 * top-8 of 64 experts, the peer model; 512: 4096 tokens of it). The two costs per row tile and per
 * decoded expert behind runtime/gpu/gpu_linear.c's moe_mm_wins come from these lines. Prints ms per
 * layer and TFLOP/s of each, and the ceiling measured in the same run: cuBLAS bf16 on an
 * 8192^3 product. Weights: one random expert (quant_fill_random) copied to all 64. Median of 7
 * after 2 warm-ups. Usage: bench_moe_mm [R,R,...] [--fused-only] (default 16,64,128,256,512; the
 * second argument skips the copy path). */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuk.h"
#include "cuda/cuk_gemm.h"
#include "cuda/cuk_model.h"
#include "cuda/cuk_prefill.h"
#include "format/quant.h"

#include "tests/gpu/bench_util.h"

enum { NL = 64, E = 6144, FE = 2048, REPS = 7 };

static int cmpf(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static uint8_t *rand_experts(uint32_t t, int64_t rows, int64_t k) {
    uint64_t rb = 0;
    if (quant_row_bytes(t, (uint64_t)k, &rb)) exit(1);
    const quant_type_info *ti = quant_type_get(t);
    const size_t one = (size_t)(rows * rb);
    uint8_t *h = malloc(one), *d = NULL;
    uint64_t st = 12345;
    if (!h || quant_fill_random(t, h, one / ti->block_bytes, &st)) exit(1);
    CK(cudaMalloc((void **)&d, one * NL));
    for (int e = 0; e < NL; e++) CK(cudaMemcpy(d + (size_t)e * one, h, one, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

typedef struct ctx {
    uint8_t *wg, *wu, *wd;
    void *x, *h, *wg16, *wu16, *wd16;
    float *gs, *us, *ds;
    int32_t *dcnt;
    int R;
    cuk_blas *blas;
} ctx;

static int tiles_of(const ctx *c) { return NL * ((c->R + CUK_MOE_MM_BM - 1) / CUK_MOE_MM_BM); }

static void run_gu(ctx *c) {
    const cuk_moe_mm_args gu = {QT_Q4_K, c->wg, c->wu, E, FE, c->x, c->dcnt, NL, tiles_of(c), c->h, FE};
    GK(cuk_moe_mm(&gu, NULL, &err_));
}

static void run_dn(ctx *c) {
    const cuk_moe_mm_args dn = {QT_Q5_K, c->wd, NULL, FE, E, c->h, c->dcnt, NL, tiles_of(c), c->ds, E};
    GK(cuk_moe_mm(&dn, NULL, &err_));
}

static void run_fused(ctx *c) {
    run_gu(c);
    run_dn(c);
}

static void deq(uint32_t t, const void *w, int64_t k, int64_t rows, void *out) {
    const cuk_dequant_rows_args a = {.w_type = t, .w = w, .k = k, .n_rows_w = rows, .n = rows, .out = out,
                                     .out_type = CUK_F16, .ldo = k};
    GK(cuk_dequant_rows_16(&a, NULL, &err_));
}

static void gemm16(ctx *c, const void *w, const void *x, int64_t k, int64_t m, int64_t n, float *y) {
    const cuk_gemm_args a = {CUK_GEMM_F16, w, k, x, k, k, m, n, y, m};
    GK(cuk_gemm(c->blas, &a, NULL, &err_));
}

static void run_old(ctx *c) {
    deq(QT_Q4_K, c->wg, E, (int64_t)NL * FE, c->wg16);
    deq(QT_Q4_K, c->wu, E, (int64_t)NL * FE, c->wu16);
    deq(QT_Q5_K, c->wd, FE, (int64_t)NL * E, c->wd16);
    const int64_t R = c->R;
    for (int e = 0; e < NL; e++) {
        const uint8_t *x = (const uint8_t *)c->x + (size_t)e * R * E * 2;
        gemm16(c, (uint8_t *)c->wg16 + (size_t)e * FE * E * 2, x, E, FE, R, c->gs + (size_t)e * R * FE);
        gemm16(c, (uint8_t *)c->wu16 + (size_t)e * FE * E * 2, x, E, FE, R, c->us + (size_t)e * R * FE);
    }
    GK(cuk_silu_mul_16(c->gs, c->us, R * NL, FE, c->h, CUK_F16, NULL, &err_));
    for (int e = 0; e < NL; e++)
        gemm16(c, (uint8_t *)c->wd16 + (size_t)e * E * FE * 2, (uint8_t *)c->h + (size_t)e * R * FE * 2, FE, E, R,
               c->ds + (size_t)e * R * E);
}

static float time_ms(void (*fn)(ctx *), ctx *c) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    float t[REPS];
    for (int i = 0; i < 2; i++) fn(c);
    for (int i = 0; i < REPS; i++) {
        CK(cudaEventRecord(a, NULL));
        fn(c);
        CK(cudaEventRecord(b, NULL));
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(&t[i], a, b));
    }
    qsort(t, REPS, sizeof t[0], cmpf);
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return t[REPS / 2];
}

/* cuBLAS bf16 TFLOP/s on an 8192^3 product */
static double blas_ceiling(ctx *c) {
    const int64_t S = 8192;
    void *w = NULL, *x = NULL;
    float *y = NULL;
    CK(cudaMalloc(&w, S * S * 2));
    CK(cudaMalloc(&x, S * S * 2));
    CK(cudaMalloc((void **)&y, S * S * 4));
    CK(cudaMemset(w, 0x3c, S * S * 2));
    CK(cudaMemset(x, 0x3c, S * S * 2));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    const cuk_gemm_args g = {CUK_GEMM_BF16, w, S, x, S, S, S, S, y, S};
    float t[REPS];
    for (int i = 0; i < 2; i++) GK(cuk_gemm(c->blas, &g, NULL, &err_));
    for (int i = 0; i < REPS; i++) {
        CK(cudaEventRecord(a, NULL));
        GK(cuk_gemm(c->blas, &g, NULL, &err_));
        CK(cudaEventRecord(b, NULL));
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(&t[i], a, b));
    }
    qsort(t, REPS, sizeof t[0], cmpf);
    cudaFree(w);
    cudaFree(x);
    cudaFree(y);
    return 2.0 * S * S * S / (t[REPS / 2] * 1e-3) / 1e12;
}

int main(int argc, char **argv) {
    int Rs[16] = {16, 64, 128, 256, 512}, nR = 5;
    if (argc > 1) {
        nR = 0;
        for (char *t = argv[1], *e = NULL; *t && nR < 16; t = *e ? e + 1 : e) {
            const long v = strtol(t, &e, 10);
            if (e == t || v < 1 || v > 4096 || (*e && *e != ',')) {
                fprintf(stderr, "bench_moe_mm: bad row list '%s'\n", argv[1]);
                return 2;
            }
            Rs[nR++] = (int)v;
        }
    }
    const int fused_only = argc > 2 && !strcmp(argv[2], "--fused-only");
    ctx c = {0};
    GK(cuk_blas_create(&c.blas, &err_));
    c.wg = rand_experts(QT_Q4_K, FE, E);
    c.wu = rand_experts(QT_Q4_K, FE, E);
    c.wd = rand_experts(QT_Q5_K, E, FE);
    CK(cudaMalloc(&c.wg16, (size_t)NL * FE * E * 2));
    CK(cudaMalloc(&c.wu16, (size_t)NL * FE * E * 2));
    CK(cudaMalloc(&c.wd16, (size_t)NL * FE * E * 2));
    const double ceil_tf = blas_ceiling(&c);
    printf("moe_mm bench: cuBLAS bf16 8192^3: %.1f TFLOP/s (the ceiling)\n", ceil_tf);
    for (int ri = 0; ri < nR; ri++) {
        const int R = c.R = Rs[ri];
        const int64_t rows = (int64_t)NL * R;
        int32_t hc[NL];
        for (int e = 0; e < NL; e++) hc[e] = R;
        CK(cudaMalloc((void **)&c.dcnt, sizeof hc));
        CK(cudaMemcpy(c.dcnt, hc, sizeof hc, cudaMemcpyHostToDevice));
        uint16_t *hx = malloc((size_t)rows * E * 2);
        if (!hx) exit(1);
        for (int64_t i = 0; i < rows * E; i++) hx[i] = quant_f32_to_f16((float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f);
        CK(cudaMalloc(&c.x, (size_t)rows * E * 2));
        CK(cudaMemcpy(c.x, hx, (size_t)rows * E * 2, cudaMemcpyHostToDevice));
        free(hx);
        CK(cudaMalloc(&c.h, (size_t)rows * FE * 2));
        CK(cudaMalloc((void **)&c.gs, (size_t)rows * FE * 4));
        CK(cudaMalloc((void **)&c.us, (size_t)rows * FE * 4));
        CK(cudaMalloc((void **)&c.ds, (size_t)rows * E * 4));
        const double fl = 2.0 * rows * 3.0 * E * FE;
        const float tf = time_ms(run_fused, &c), tg = time_ms(run_gu, &c), td = time_ms(run_dn, &c);
        printf("moe_mm bench R=%d: fused gate+up %.3f ms, down %.3f ms\n", R, tg, td);
        if (fused_only) {
            printf("moe_mm bench R=%d rows/expert (%lld rows): fused %.3f ms (%.1f TFLOP/s, %.3f of cuBLAS bf16)\n", R,
                   (long long)rows, tf, fl / (tf * 1e-3) / 1e12, fl / (tf * 1e-3) / 1e12 / ceil_tf);
        } else {
            const float to = time_ms(run_old, &c);
            printf("moe_mm bench R=%d rows/expert (%lld rows): fused %.3f ms (%.1f TFLOP/s, %.3f of cuBLAS bf16), "
                   "dequantized copy + cuBLAS %.3f ms (%.1f TFLOP/s, %.3f)\n",
                   R, (long long)rows, tf, fl / (tf * 1e-3) / 1e12, fl / (tf * 1e-3) / 1e12 / ceil_tf, to,
                   fl / (to * 1e-3) / 1e12, fl / (to * 1e-3) / 1e12 / ceil_tf);
        }
        cudaFree(c.dcnt);
        cudaFree(c.x);
        cudaFree(c.h);
        cudaFree(c.gs);
        cudaFree(c.us);
        cudaFree(c.ds);
    }
    cuk_blas_free(c.blas);
    return 0;
}
