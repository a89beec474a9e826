/* GEMV bandwidth of every weight type the GPU takes (issue 15's "GEMV ratio per type"): one
 * launch of cuk_gemv at batch 1 on the TP8 lm_head shape (19360 x 6144; k = 6144 fits every
 * block size) with random blocks (quant_fill_random), weights rotating over copies filling
 * >= 1 GiB so that L2 holds none of them between launches, the default kernel choice. Prints per
 * type: MB read per launch, us per launch (mean of 50 after 2 warm-ups), GB/s and the ratio to
 * a device-to-device cudaMemcpy of 512 MiB measured in the same run (counted read + written).
 * Usage: bench_types [iters] */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda/cuk.h"
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

int main(int argc, char **argv) {
    const int iters = argc > 1 ? atoi(argv[1]) : 50;
    if (iters < 1) {
        fprintf(stderr, "usage: bench_types [iters >= 1]\n");
        return 2;
    }
    uint8_t *pool;
    float *x, *y;
    CK(cudaMalloc((void **)&pool, POOL_BYTES));
    CK(cudaMalloc((void **)&x, sizeof(float) * K));
    CK(cudaMalloc((void **)&y, sizeof(float) * M));
    float *hx = malloc(sizeof(float) * K);
    if (!hx) return 2;
    for (int i = 0; i < K; i++) hx[i] = (float)((i * 37 % 101) - 50) / 50.0f;
    CK(cudaMemcpy(x, hx, sizeof(float) * K, cudaMemcpyHostToDevice));
    free(hx);
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    const double rate = copy_rw_rate(pool, a, b);
    printf("bench_types: cudaMemcpy D2D 512 MiB: %.0f GB/s read+written; gemv %d x %d, n = 1, x f32\n", rate / 1e9, M, K);
    printf("| type | MB per launch | us | GB/s | ratio to copy |\n| --- | --- | --- | --- | --- |\n");
    for (uint32_t type = 0; type < QT_TYPE_LIMIT; type++) {
        const quant_type_info *ti = quant_type_get(type);
        if (!ti || !ti->supported || !cuk_gemv_supported(type) || K % ti->block_elems) continue;
        uint64_t rb = 0;
        if (quant_row_bytes(type, K, &rb) != G5_OK) continue;
        const uint64_t bytes = rb * M, stride = (bytes + 255) & ~255ull;
        if (stride > POOL_BYTES) continue;
        uint8_t *h = malloc(bytes);
        if (!h) return 2;
        uint64_t st = 12345;
        if (quant_fill_random(type, h, bytes / ti->block_bytes, &st) != G5_OK) {
            free(h);
            continue;
        }
        const int copies = (int)(POOL_BYTES / stride);
        CK(cudaMemcpy(pool, h, bytes, cudaMemcpyHostToDevice));
        for (int i = 1; i < copies; i++) CK(cudaMemcpy(pool + i * stride, pool, bytes, cudaMemcpyDeviceToDevice));
        free(h);
        cuk_gemv_args g = {.w_type = type, .w = pool, .k = K, .m = M, .x = x, .x_type = CUK_ACT_F32, .ldx = K,
                           .n = 1, .y = y, .ldy = M};
        for (int i = 0; i < 2; i++) GK(cuk_gemv(&g, NULL, &err_));
        CK(cudaEventRecord(a, NULL));
        for (int i = 0; i < iters; i++) {
            g.w = pool + (uint64_t)(i % copies) * stride;
            GK(cuk_gemv(&g, NULL, &err_));
        }
        CK(cudaEventRecord(b, NULL));
        CK(cudaEventSynchronize(b));
        const double s = elapsed_ms(a, b) * 1e-3 / iters, gbs = (double)bytes / s;
        printf("| %s | %.1f | %.2f | %.0f | %.3f |\n", ti->name, bytes / 1e6, s * 1e6, gbs / 1e9, gbs / rate);
        fflush(stdout);
    }
    CK(cudaFree(pool));
    CK(cudaFree(x));
    CK(cudaFree(y));
    return 0;
}
