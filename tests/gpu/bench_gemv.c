/* GEMV bandwidth at batch 1 on GLM-5's large per-rank (TP8) shapes, against a device-to-device
 * cudaMemcpy measured in the same run. Weights rotate over copies filling >= 1 GiB so that L2
 * (50-60 MB) holds none of them between launches. Prints one line per case:
 * bytes of weights read per launch, time per launch, GB/s, and the ratio to the copy rate
 * counted as bytes read + bytes written (both are DRAM traffic per second). Each GEMV line says
 * which kernels ran it (tc: tensor cores, simt: CUDA cores; cuk_gemv_takes_tc), the MoE lines
 * run what cuk_moe_gate_up / cuk_moe_down pick (tensor cores for Q4_K). The kernel variants
 * that lost (magic-exponent and deeper or prefetching tensor-core kernels, tensor cores for
 * Q8_0, the cluster k-split of the CUDA-core kernels) are gone; their numbers are in
 * bench/NOTES.md and bench/RESULTS.md.
 * First, the GEMVs of one decode step at their own types, graph-timed (bench_decode_shape);
 * BENCH_GEMV_DECODE_ONLY=1 stops after them.
 * Usage: bench_gemv [iters]  (default 50) */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda/cuk.h"
#include "format/quant.h"

#include "tests/gpu/bench_util.h"

#define POOL_BYTES (1ull << 30)

static int iters = 50;
static double copy_rw_gbs; /* bytes read + written per second, GB/s */

static uint8_t *pool;      /* device, POOL_BYTES */
static uint64_t pool_copy; /* bytes per weight copy (256-aligned), copies = POOL_BYTES / pool_copy */

/* Puts n_copies of one random weight buffer of `bytes` into the pool. */
static int fill_pool(uint32_t type, uint64_t bytes) {
    const quant_type_info *ti = quant_type_get(type);
    uint8_t *h = malloc(bytes);
    if (!h) exit(2);
    uint64_t st = 12345;
    if (quant_fill_random(type, h, bytes / ti->block_bytes, &st) != G5_OK) exit(3);
    pool_copy = (bytes + 255) & ~255ull;
    const int copies = (int)(POOL_BYTES / pool_copy);
    CK(cudaMemcpy(pool, h, bytes, cudaMemcpyHostToDevice));
    for (int i = 1; i < copies; i++)
        CK(cudaMemcpy(pool + i * pool_copy, pool, bytes, cudaMemcpyDeviceToDevice));
    CK(cudaDeviceSynchronize());
    free(h);
    return copies;
}

static float time_ms(cudaEvent_t a, cudaEvent_t b) {
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    return ms;
}

static void report(const char *what, const char *impl, double bytes, double ms_per) {
    const double gbs = bytes / (ms_per * 1e-3) / 1e9;
    printf("%-46s %-7s %7.1f MB %8.2f us %6.0f GB/s  ratio %.3f\n", what, impl, bytes / 1e6, ms_per * 1e3, gbs,
           gbs / copy_rw_gbs);
    fflush(stdout);
}

static void bench_gemv(uint32_t type, int64_t m, int64_t k, int n, uint32_t x_type, float *x, float *y) {
    uint64_t rb = 0;
    quant_row_bytes(type, (uint64_t)k, &rb);
    const uint64_t bytes = rb * (uint64_t)m;
    const int copies = fill_pool(type, bytes);
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    cuk_gemv_args g = {.w_type = type, .w = pool, .k = k, .m = m, .x = x, .x_type = x_type,
                       .ldx = k, .n = n, .y = y, .ldy = m};
    char what[128];
    snprintf(what, sizeof what, "gemv %s m=%lld k=%lld n=%d x=%s", quant_type_name(type),
             (long long)m, (long long)k, n, x_type == CUK_ACT_BF16 ? "bf16" : "f32");
    for (int i = 0; i < 3; i++) GK(cuk_gemv(&g, NULL, &err_));
    CK(cudaEventRecord(a, NULL));
    for (int i = 0; i < iters; i++) {
        g.w = pool + (uint64_t)(i % copies) * pool_copy;
        GK(cuk_gemv(&g, NULL, &err_));
    }
    CK(cudaEventRecord(b, NULL));
    CK(cudaEventSynchronize(b));
    report(what, cuk_gemv_takes_tc(type, m, k, n) ? "tc" : "simt", (double)bytes, time_ms(a, b) / iters);
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
}

/* One decode-step GEMV shape (one GLM-5 TP 8 rank, types of synth's glm5 preset as
 * tests/gpu/bench_decode runs them) at n vectors. Timed as the decode runs: >= `iters` launches
 * on rotating weight copies (>= 256 MB of them, so that L2 keeps none) captured into one CUDA
 * graph (no host launch cost in the time), mean per launch of 3 graph launches after a warm-up
 * one. Prints the byte floor at the copy rate beside it. */
static void bench_decode_shape(const char *name, uint32_t type, int64_t m, int64_t k, int n, float *x, float *y) {
    uint64_t rb = 0;
    quant_row_bytes(type, (uint64_t)k, &rb);
    const uint64_t bytes = rb * (uint64_t)m;
    const int copies = fill_pool(type, bytes);
    /* launches per graph: the copies one graph reads must not fit L2 (60 MB) */
    int nl = iters;
    while (nl < copies && (uint64_t)nl * bytes < (256ull << 20)) nl++;
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    cuk_gemv_args g = {.w_type = type, .w = pool, .k = k, .m = m, .x = x, .x_type = CUK_ACT_F32,
                       .ldx = k, .n = n, .y = y, .ldy = m};
    char what[128];
    snprintf(what, sizeof what, "decode %-8s %-4s m=%lld k=%lld n=%d", name, quant_type_name(type),
             (long long)m, (long long)k, n);
    GK(cuk_gemv(&g, (cuk_stream)st, &err_));
    CK(cudaStreamSynchronize(st));
    cudaGraph_t graph;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < nl; i++) {
        g.w = pool + (uint64_t)(i % copies) * pool_copy;
        GK(cuk_gemv(&g, (cuk_stream)st, &err_));
    }
    CK(cudaStreamEndCapture(st, &graph));
    CK(cudaGraphInstantiate(&ge, graph, 0));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(a, st));
    for (int i = 0; i < 3; i++) CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    const double us = time_ms(a, b) / (3.0 * nl) * 1e3;
    printf("%-44s %-4s %7.3f MB %7.2f us  floor %5.2f us  x%5.2f\n", what,
           cuk_gemv_takes_tc(type, m, k, n) ? "tc" : "simt", bytes / 1e6, us, bytes / (copy_rw_gbs * 1e3),
           us / (bytes / (copy_rw_gbs * 1e3)));
    fflush(stdout);
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(graph));
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    CK(cudaStreamDestroy(st));
}

/* The GEMVs of one decode step of a GLM-5 TP 8 rank (bench_decode's rank-0-equivalent shapes). */
static void bench_decode_shapes(float *x, float *y) {
    static const struct {
        const char *name;
        uint32_t type;
        int64_t m, k;
    } D[] = {
        {"q_a", QT_Q6_K, 2048, 6144},     {"kv_a", QT_Q8_0, 576, 6144},
        {"idx_q_b", QT_Q5_K, 4096, 2048}, {"idx_k", QT_BF16, 128, 6144},
        {"idx_proj", QT_BF16, 32, 6144},  {"q_b", QT_Q5_K, 2048, 2048},
        {"attn_out", QT_Q5_K, 6144, 2048}, {"router", QT_F32, 256, 6144},
        {"sh_gate", QT_Q8_0, 256, 6144},  {"sh_down", QT_Q8_0, 6144, 256},
        {"ffn_up", QT_Q4_K, 1536, 6144},  {"ffn_down", QT_Q4_K, 6144, 1536},
        {"lm_head", QT_Q6_K, 19360, 6144},
    };
    printf("== decode-step GEMV shapes: graph-timed (floor = bytes at the copy rate)\n");
    for (size_t i = 0; i < sizeof D / sizeof D[0]; i++)
        for (int n = 1; n <= 8; n += 7) bench_decode_shape(D[i].name, D[i].type, D[i].m, D[i].k, n, x, y);
}

/* Experts of one rank: 32 local, 8 chosen; gate+up 256 x 6144 each, down 6144 x 256. */
static void bench_moe(uint32_t type, float *x, float *y, float *h, int32_t *ids, float *wts) {
    const int E = 32, K = 8, FF = 256, EMBD = 6144;
    uint64_t rb_up = 0, rb_dn = 0;
    quant_row_bytes(type, EMBD, &rb_up);
    quant_row_bytes(type, FF, &rb_dn);
    const uint64_t set = rb_up * FF * E; /* one expert tensor; gate and up are two of them */
    const int copies = fill_pool(type, set);
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    int32_t *plan = NULL;
    float *part = NULL;
    CK(cudaMalloc((void **)&plan, sizeof(int32_t) * (size_t)cuk_moe_plan_words(1, K)));
    CK(cudaMalloc((void **)&part, sizeof(float) * K * EMBD));
    const cuk_moe_plan_args pa = {ids, wts, 1, K, K, K, E, plan};
    GK(cuk_moe_plan(&pa, NULL, &err_));
    cuk_moe_gate_up_args g = {.w_type = type, .k = EMBD, .m = FF, .n_expert = E, .ids = ids,
                              .top_k = K, .ld_ids = K, .x = x, .x_type = CUK_ACT_F32, .ldx = EMBD,
                              .n_tok = 1, .out = h, .ldo = FF, .plan = plan};
    cuk_moe_down_args d = {.w_type = type, .k = FF, .m = EMBD, .n_expert = E, .ids = ids,
                           .wts = wts, .top_k = K, .ld_ids = K, .ld_wts = K, .h = h,
                           .h_type = CUK_ACT_F32, .ldh = FF, .n_tok = 1, .y = y, .ldy = EMBD,
                           .plan = plan, .part = part, .ldp = EMBD};
    const int pairs = copies / 2;
    char what[128];
    /* gate+up, timed over the pool */
    for (int i = 0; i < iters + 3; i++) {
        if (i == 3) CK(cudaEventRecord(a, NULL));
        const int c = i % pairs;
        g.w_gate = pool + (uint64_t)(2 * c) * pool_copy;
        g.w_up = pool + (uint64_t)(2 * c + 1) * pool_copy;
        GK(cuk_moe_gate_up(&g, NULL, &err_));
    }
    CK(cudaEventRecord(b, NULL));
    CK(cudaEventSynchronize(b));
    snprintf(what, sizeof what, "moe_gate_up %s 8 of 32, 2x %dx%d", quant_type_name(type), FF, EMBD);
    report(what, "moe", (double)(2 * K * FF) * rb_up, time_ms(a, b) / iters);

    /* down: h = the gate/up output of the last call (random-looking, nonzero) */
    for (int i = 0; i < iters + 3; i++) {
        if (i == 3) CK(cudaEventRecord(a, NULL));
        d.w = pool + (uint64_t)(i % copies) * pool_copy;
        GK(cuk_moe_down(&d, NULL, &err_));
    }
    CK(cudaEventRecord(b, NULL));
    CK(cudaEventSynchronize(b));
    snprintf(what, sizeof what, "moe_down %s 8 of 32, %dx%d", quant_type_name(type), EMBD, FF);
    report(what, "moe", (double)K * EMBD * rb_dn, time_ms(a, b) / iters);
    CK(cudaFree(plan));
    CK(cudaFree(part));
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
}

int main(int argc, char **argv) {
    if (argc > 1) iters = atoi(argv[1]);
    if (iters < 1) iters = 1;
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    CK(cudaMalloc((void **)&pool, POOL_BYTES));

    /* Copy rate: 512 MiB halves of the pool, device to device. */
    {
        const size_t half = POOL_BYTES / 2;
        CK(cudaMemset(pool, 1, POOL_BYTES));
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        CK(cudaMemcpy(pool + half, pool, half, cudaMemcpyDeviceToDevice));
        const int reps = 10;
        CK(cudaEventRecord(a, NULL));
        for (int i = 0; i < reps; i++)
            CK(cudaMemcpyAsync(pool + (i & 1 ? 0 : half), pool + (i & 1 ? half : 0), half,
                               cudaMemcpyDeviceToDevice, NULL));
        CK(cudaEventRecord(b, NULL));
        CK(cudaEventSynchronize(b));
        const double ms = time_ms(a, b) / reps;
        const double one_way = (double)half / (ms * 1e-3) / 1e9;
        copy_rw_gbs = 2 * one_way;
        printf("cudaMemcpy D2D %zu MiB: %.1f us, %.0f GB/s copied = %.0f GB/s read+written\n",
               half >> 20, ms * 1e3, one_way, copy_rw_gbs);
        CK(cudaEventDestroy(a));
        CK(cudaEventDestroy(b));
    }

    float *x, *y, *h, *wts;
    int32_t *ids;
    CK(cudaMalloc((void **)&x, sizeof(float) * 16 * 6144));
    CK(cudaMalloc((void **)&y, sizeof(float) * 16 * 19360));
    CK(cudaMalloc((void **)&h, sizeof(float) * 8 * 256));
    CK(cudaMalloc((void **)&wts, sizeof(float) * 8));
    CK(cudaMalloc((void **)&ids, sizeof(int32_t) * 8));
    {
        float *hx = malloc(sizeof(float) * 16 * 6144);
        if (!hx) exit(2);
        uint64_t r = 0x9e3779b97f4a7c15ull;
        for (int i = 0; i < 16 * 6144; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            hx[i] = (float)((double)(r >> 11) / 9007199254740992.0 * 2.0 - 1.0);
        }
        CK(cudaMemcpy(x, hx, sizeof(float) * 16 * 6144, cudaMemcpyHostToDevice));
        const float hw[8] = {0.3f, 0.2f, 0.15f, 0.1f, 0.1f, 0.05f, 0.05f, 0.05f};
        CK(cudaMemcpy(wts, hw, sizeof hw, cudaMemcpyHostToDevice));
        free(hx);
    }
    CK(cudaMemset(h, 0, sizeof(float) * 8 * 256));
    const int32_t hid[8] = {3, 30, 7, 12, 19, 0, 25, 9};
    CK(cudaMemcpy(ids, hid, sizeof hid, cudaMemcpyHostToDevice));

    bench_decode_shapes(x, y);
    if (getenv("BENCH_GEMV_DECODE_ONLY")) goto done;

    const uint32_t types[] = {QT_Q4_K, QT_Q8_0};
    for (int t = 0; t < 2; t++) {
        bench_gemv(types[t], 19360, 6144, 1, CUK_ACT_F32, x, y); /* lm_head */
        bench_gemv(types[t], 2048, 2048, 1, CUK_ACT_F32, x, y);  /* attn q_b */
        bench_gemv(types[t], 6144, 2048, 1, CUK_ACT_F32, x, y);  /* attn o */
        bench_gemv(types[t], 1536, 6144, 1, CUK_ACT_F32, x, y);  /* dense up */
        bench_gemv(types[t], 6144, 1536, 1, CUK_ACT_F32, x, y);  /* dense down */
        bench_gemv(types[t], 19360, 6144, 1, CUK_ACT_BF16, x, y);
        bench_gemv(types[t], 19360, 6144, 2, CUK_ACT_F32, x, y);
        bench_gemv(types[t], 6144, 2048, 4, CUK_ACT_F32, x, y);
        bench_gemv(types[t], 19360, 6144, 4, CUK_ACT_F32, x, y);
        bench_gemv(types[t], 19360, 6144, 16, CUK_ACT_F32, x, y);
        bench_moe(types[t], x, y, h, ids, wts);
    }
    const uint32_t more[] = {QT_Q6_K, QT_Q5_K, QT_IQ4_XS, QT_BF16};
    for (int t = 0; t < 4; t++) bench_gemv(more[t], 19360, 6144, 1, CUK_ACT_F32, x, y);
    bench_moe(QT_Q6_K, x, y, h, ids, wts);
    /* the low-bit types (cuda/gemv_lowbit.cu): the lm_head shape and the experts */
    const uint32_t low[] = {QT_Q2_K, QT_Q3_K, QT_IQ1_S, QT_IQ1_M, QT_IQ2_XXS, QT_IQ2_XS, QT_IQ2_S,
                            QT_IQ3_XXS, QT_IQ3_S, QT_TQ1_0, QT_TQ2_0, QT_MXFP4, QT_NVFP4};
    for (size_t t = 0; t < sizeof low / sizeof low[0]; t++) {
        bench_gemv(low[t], 19360, 6144, 1, CUK_ACT_F32, x, y);
        bench_moe(low[t], x, y, h, ids, wts);
    }
done:
    CK(cudaFree(pool));
    CK(cudaFree(x)); CK(cudaFree(y)); CK(cudaFree(h)); CK(cudaFree(wts)); CK(cudaFree(ids));
    return 0;
}
