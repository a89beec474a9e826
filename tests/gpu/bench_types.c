/* GEMV bandwidth of every weight type the GPU takes (issue 15's "GEMV ratio per type"): one
 * launch of cuk_gemv at batch 1 on the TP8 lm_head shape (19360 x 6144; k = 6144 fits every
 * block size) with random blocks (quant_fill_random), weights rotating over copies filling
 * >= 1 GiB so that L2 holds none of them between launches, the default kernel choice, x float32
 * (precise mode's input) and bf16. Then the routed experts of one decoded token at GLM-5's
 * expert shape (cuk_moe_gate_up 2 x 2048 x 6144 and cuk_moe_down 6144 x 2048, 8 of 32 experts
 * per call, four disjoint expert sets in rotation so that L2 holds none; x float32). Prints per
 * type and kernel: MB read per launch, us per launch (mean of 50 after 2 warm-ups), GB/s and the
 * ratio to a device-to-device cudaMemcpy of 512 MiB measured in the same run (counted read +
 * written). Types with int8-input kernels (fast mode's decode: cuda/cuk_q8.h) also get those
 * rows: the GEMV with one and two int8 planes of x, and the two expert kernels with one. Usage:
 * bench_types [iters] */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuk.h"
#include "cuda/cuk_q8.h"
#include "format/quant.h"

#include "tests/gpu/bench_util.h"

#define POOL_BYTES (1ull << 30)
enum { M = 19360, K = 6144 };

static float elapsed_ms(cudaEvent_t a, cudaEvent_t b) {
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    return ms;
}

/* The copy rate, bytes read + written per second. */
static double copy_rw_rate(uint8_t *pool, cudaEvent_t a, cudaEvent_t b) {
    const size_t half = POOL_BYTES / 2;
    const int reps = 10;
    CK(cudaMemcpy(pool + half, pool, half, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(a, NULL));
    for (int i = 0; i < reps; i++) CK(cudaMemcpyAsync(pool + half, pool, half, cudaMemcpyDeviceToDevice, NULL));
    CK(cudaEventRecord(b, NULL));
    CK(cudaEventSynchronize(b));
    return 2.0 * (double)half * reps / (elapsed_ms(a, b) * 1e-3);
}

/* One table row: what, MB per launch, us, GB/s, ratio. */
static void row(const char *type, const char *what, double bytes, double s, double rate) {
    const double gbs = bytes / s;
    printf("| %s | %s | %.1f | %.2f | %.0f | %.3f |\n", type, what, bytes / 1e6, s * 1e6, gbs / 1e9, gbs / rate);
    fflush(stdout);
}

/* Fills the pool with `copies` copies of `bytes` of random blocks of type (the first copy from
 * the host, the others device to device); returns 0 when the type cannot be filled. */
static int fill_pool(uint32_t type, uint8_t *pool, uint64_t bytes, uint64_t stride, int copies) {
    const quant_type_info *ti = quant_type_get(type);
    uint8_t *h = malloc(bytes);
    if (!h) exit(2);
    uint64_t st = 12345;
    if (quant_fill_random(type, h, bytes / ti->block_bytes, &st) != G5_OK) {
        free(h);
        return 0;
    }
    CK(cudaMemcpy(pool, h, bytes, cudaMemcpyHostToDevice));
    for (int i = 1; i < copies; i++) CK(cudaMemcpy(pool + i * stride, pool, bytes, cudaMemcpyDeviceToDevice));
    free(h);
    return 1;
}

/* int8 copies of x (two planes' room) and of the experts' h rows (cuda/cuk_q8.h). */
static struct {
    int8_t *q, *hq;
    float *ds, *hds;
} q8;

static void bench_gemv_type(uint32_t type, uint8_t *pool, const float *x, const uint16_t *xb, float *y,
                            int iters, double rate, cudaEvent_t a, cudaEvent_t b) {
    const quant_type_info *ti = quant_type_get(type);
    uint64_t rb = 0;
    if (quant_row_bytes(type, K, &rb) != G5_OK) return;
    const uint64_t bytes = rb * M, stride = (bytes + 255) & ~255ull;
    if (stride > POOL_BYTES) return;
    const int copies = (int)(POOL_BYTES / stride);
    if (!fill_pool(type, pool, bytes, stride, copies)) return;
    for (int xt = 0; xt < 2; xt++) {
        cuk_gemv_args g = {.w_type = type, .w = pool, .k = K, .m = M, .x = xt ? (const void *)xb : x,
                           .x_type = xt ? CUK_ACT_BF16 : CUK_ACT_F32, .ldx = K, .n = 1, .y = y, .ldy = M};
        for (int i = 0; i < 2; i++) GK(cuk_gemv(&g, NULL, &err_));
        CK(cudaEventRecord(a, NULL));
        for (int i = 0; i < iters; i++) {
            g.w = pool + (uint64_t)(i % copies) * stride;
            GK(cuk_gemv(&g, NULL, &err_));
        }
        CK(cudaEventRecord(b, NULL));
        CK(cudaEventSynchronize(b));
        row(ti->name, xt ? "gemv, x bf16" : "gemv, x f32", (double)bytes, elapsed_ms(a, b) * 1e-3 / iters, rate);
    }
    if (!cuk_q8_takes(type, K)) return;
    for (int planes = 1; planes <= 2; planes++) {
        const cuk_q8_quantize_args qa = {x, K, K, 1, q8.q, 2 * K, q8.ds, 2 * K / 16, planes};
        GK(cuk_q8_quantize(&qa, NULL, &err_));
        cuk_gemv_q8_args g = {type, pool, K, M, {q8.q, 2 * K, q8.ds, 2 * K / 16, planes}, 1, y, M, NULL, NULL};
        for (int i = 0; i < 2; i++) GK(cuk_gemv_q8(&g, NULL, &err_));
        CK(cudaEventRecord(a, NULL));
        for (int i = 0; i < iters; i++) {
            g.w = pool + (uint64_t)(i % copies) * stride;
            GK(cuk_gemv_q8(&g, NULL, &err_));
        }
        CK(cudaEventRecord(b, NULL));
        CK(cudaEventSynchronize(b));
        row(ti->name, planes == 1 ? "gemv, x int8" : "gemv, x int8 two planes", (double)bytes,
            elapsed_ms(a, b) * 1e-3 / iters, rate);
    }
}

/* The routed experts of one token: E experts of FF x EMBD (gate, up) and EMBD x FF (down) in
 * the pool, TOPK of them per call, set c = experts 8c .. 8c + 7. */
enum { E = 32, TOPK = 8, FF = 2048, EMBD = 6144, SETS = E / TOPK };
static void bench_moe_type(uint32_t type, uint8_t *pool, const float *x, float *h, float *y, float *part,
                           int32_t *const *ids, float *wts, int32_t *const *plan, int iters,
                           double rate, cudaEvent_t a, cudaEvent_t b) {
    const quant_type_info *ti = quant_type_get(type);
    uint64_t rb_up = 0, rb_dn = 0;
    if (quant_row_bytes(type, EMBD, &rb_up) != G5_OK || quant_row_bytes(type, FF, &rb_dn) != G5_OK) return;
    const uint64_t up = rb_up * FF * E, dn = rb_dn * EMBD * E; /* one expert tensor each */
    const uint64_t s_up = (up + 255) & ~255ull, s_dn = (dn + 255) & ~255ull;
    if (2 * s_up + s_dn > POOL_BYTES) return;
    if (!fill_pool(type, pool, up, s_up, 2)) return;
    if (!fill_pool(type, pool + 2 * s_up, dn, s_dn, 1)) return;
    cuk_moe_gate_up_args g = {.w_type = type, .w_gate = pool, .w_up = pool + s_up, .k = EMBD, .m = FF,
                              .n_expert = E, .top_k = TOPK, .ld_ids = TOPK, .x = x,
                              .x_type = CUK_ACT_F32, .ldx = EMBD, .n_tok = 1, .out = h, .ldo = FF};
    cuk_moe_down_args d = {.w_type = type, .w = pool + 2 * s_up, .k = FF, .m = EMBD, .n_expert = E,
                           .wts = wts, .top_k = TOPK, .ld_ids = TOPK, .ld_wts = TOPK, .h = h,
                           .h_type = CUK_ACT_F32, .ldh = FF, .n_tok = 1, .y = y, .ldy = EMBD,
                           .part = part, .ldp = EMBD};
    for (int i = 0; i < iters + 2; i++) {
        if (i == 2) CK(cudaEventRecord(a, NULL));
        g.ids = ids[i % SETS], g.plan = plan[i % SETS];
        GK(cuk_moe_gate_up(&g, NULL, &err_));
    }
    CK(cudaEventRecord(b, NULL));
    CK(cudaEventSynchronize(b));
    row(ti->name, "moe_gate_up 8 of 32, 2 x 2048 x 6144", 2.0 * TOPK * FF * rb_up, elapsed_ms(a, b) * 1e-3 / iters, rate);
    for (int i = 0; i < iters + 2; i++) {
        if (i == 2) CK(cudaEventRecord(a, NULL));
        d.ids = ids[i % SETS], d.plan = plan[i % SETS];
        GK(cuk_moe_down(&d, NULL, &err_));
    }
    CK(cudaEventRecord(b, NULL));
    CK(cudaEventSynchronize(b));
    row(ti->name, "moe_down 8 of 32, 6144 x 2048", (double)TOPK * EMBD * rb_dn, elapsed_ms(a, b) * 1e-3 / iters, rate);
    if (!cuk_q8_takes(type, EMBD) || !cuk_q8_takes(type, FF)) return;
    const cuk_q8_quantize_args qx = {x, EMBD, EMBD, 1, q8.q, EMBD, q8.ds, EMBD / 16, 1};
    const cuk_q8_quantize_args qh = {h, FF, FF, TOPK, q8.hq, FF, q8.hds, FF / 16, 1};
    GK(cuk_q8_quantize(&qx, NULL, &err_));
    GK(cuk_q8_quantize(&qh, NULL, &err_));
    cuk_moe_gate_up_q8_args gq = {type, pool, pool + s_up, EMBD, FF, E, NULL, TOPK, TOPK, {q8.q, EMBD, q8.ds, EMBD / 16, 1},
                                  1, h, FF, NULL};
    cuk_moe_down_q8_args dq = {type, pool + 2 * s_up, FF, EMBD, E, NULL, wts, TOPK, TOPK, TOPK,
                               {q8.hq, FF, q8.hds, FF / 16, 1}, 1, y, EMBD, NULL, part, EMBD, NULL, 0};
    for (int i = 0; i < iters + 2; i++) {
        if (i == 2) CK(cudaEventRecord(a, NULL));
        gq.ids = ids[i % SETS], gq.plan = plan[i % SETS];
        GK(cuk_moe_gate_up_q8(&gq, NULL, &err_));
    }
    CK(cudaEventRecord(b, NULL));
    CK(cudaEventSynchronize(b));
    row(ti->name, "moe_gate_up, x int8", 2.0 * TOPK * FF * rb_up, elapsed_ms(a, b) * 1e-3 / iters, rate);
    for (int i = 0; i < iters + 2; i++) {
        if (i == 2) CK(cudaEventRecord(a, NULL));
        dq.ids = ids[i % SETS], dq.plan = plan[i % SETS];
        GK(cuk_moe_down_q8(&dq, NULL, &err_));
    }
    CK(cudaEventRecord(b, NULL));
    CK(cudaEventSynchronize(b));
    row(ti->name, "moe_down, h int8", (double)TOPK * EMBD * rb_dn, elapsed_ms(a, b) * 1e-3 / iters, rate);
}

int main(int argc, char **argv) {
    const int iters = argc > 1 ? atoi(argv[1]) : 50;
    if (iters < 1) {
        fprintf(stderr, "usage: bench_types [iters >= 1]\n");
        return 2;
    }
    uint8_t *pool;
    float *x, *y, *h, *part, *wts;
    uint16_t *xb;
    CK(cudaMalloc((void **)&pool, POOL_BYTES));
    CK(cudaMalloc((void **)&x, sizeof(float) * K));
    CK(cudaMalloc((void **)&xb, sizeof(uint16_t) * K));
    CK(cudaMalloc((void **)&y, sizeof(float) * M));
    CK(cudaMalloc((void **)&h, sizeof(float) * TOPK * FF));
    CK(cudaMalloc((void **)&part, sizeof(float) * TOPK * EMBD));
    CK(cudaMalloc((void **)&wts, sizeof(float) * TOPK));
    CK(cudaMalloc((void **)&q8.q, 2 * K));
    CK(cudaMalloc((void **)&q8.ds, sizeof(float) * 2 * K / 16));
    CK(cudaMalloc((void **)&q8.hq, TOPK * FF));
    CK(cudaMalloc((void **)&q8.hds, sizeof(float) * TOPK * FF / 16));
    float *hx = malloc(sizeof(float) * K);
    uint16_t *hb = malloc(sizeof(uint16_t) * K);
    if (!hx || !hb) return 2;
    for (int i = 0; i < K; i++) {
        hx[i] = (float)((i * 37 % 101) - 50) / 50.0f;
        uint32_t u;
        memcpy(&u, &hx[i], 4);
        hb[i] = (uint16_t)(u >> 16); /* truncated: only the magnitudes matter to a timing */
    }
    CK(cudaMemcpy(x, hx, sizeof(float) * K, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(xb, hb, sizeof(uint16_t) * K, cudaMemcpyHostToDevice));
    free(hx);
    free(hb);
    const float hw[TOPK] = {0.2f, 0.15f, 0.15f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f};
    CK(cudaMemcpy(wts, hw, sizeof hw, cudaMemcpyHostToDevice));
    int32_t *ids[SETS], *plan[SETS];
    for (int c = 0; c < SETS; c++) {
        int32_t hi[TOPK];
        for (int s = 0; s < TOPK; s++) hi[s] = TOPK * c + s;
        CK(cudaMalloc((void **)&ids[c], sizeof hi));
        CK(cudaMemcpy(ids[c], hi, sizeof hi, cudaMemcpyHostToDevice));
        CK(cudaMalloc((void **)&plan[c], sizeof(int32_t) * (size_t)cuk_moe_plan_words(1, TOPK)));
        const cuk_moe_plan_args pa = {ids[c], wts, 1, TOPK, TOPK, TOPK, E, plan[c]};
        GK(cuk_moe_plan(&pa, NULL, &err_));
    }
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    const double rate = copy_rw_rate(pool, a, b);
    printf("bench_types: cudaMemcpy D2D 512 MiB: %.0f GB/s read+written; gemv %d x %d, n = 1\n", rate / 1e9, M, K);
    printf("| type | kernel | MB per launch | us | GB/s | ratio to copy |\n| --- | --- | --- | --- | --- | --- |\n");
    for (uint32_t type = 0; type < QT_TYPE_LIMIT; type++) {
        const quant_type_info *ti = quant_type_get(type);
        if (!ti || !ti->supported || !cuk_gemv_supported(type) || K % ti->block_elems) continue;
        bench_gemv_type(type, pool, x, xb, y, iters, rate, a, b);
        if (FF % ti->block_elems == 0)
            bench_moe_type(type, pool, x, h, y, part, ids, wts, plan, iters, rate, a, b);
    }
    for (int c = 0; c < SETS; c++) {
        CK(cudaFree(ids[c]));
        CK(cudaFree(plan[c]));
    }
    CK(cudaFree(pool));
    CK(cudaFree(x));
    CK(cudaFree(xb));
    CK(cudaFree(y));
    CK(cudaFree(h));
    CK(cudaFree(part));
    CK(cudaFree(wts));
    CK(cudaFree(q8.q));
    CK(cudaFree(q8.ds));
    CK(cudaFree(q8.hq));
    CK(cudaFree(q8.hds));
    return 0;
}
