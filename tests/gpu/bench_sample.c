/* cuk_sample (cuda/sample.cu) at GLM-5's 154880 tokens: us per call for 1, 8 and 16 rows
 * (a decode step's head chunk holds at most CUK_GEMV_MAX_N = 16) of greedy, sampled (temperature
 * 0.9), min-p, top-p and llama.cpp-default (top-k) rows, against what a host draw needs first: the rows' logits copied to
 * page-locked host memory (and the byte time of one read of them at the D2D copy rate of this
 * run). Usage: bench_sample [calls per case] */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda/cuk_sample.h"
#include "format/status.h"

#include "tests/gpu/bench_util.h"

enum { V = 154880 };

int main(int argc, char **argv) {
    const int calls = argc > 1 ? atoi(argv[1]) : 200;
    if (calls < 1) {
        fprintf(stderr, "usage: bench_sample [calls >= 1]\n");
        return 2;
    }
    const double gbs = bench_copy_gbs();
    static const int32_t NR[] = {1, 8, 16};
    const int32_t RMAX = 16;
    float *hl = malloc((size_t)RMAX * V * sizeof *hl), *pin = NULL;
    if (!hl) return 1;
    uint64_t z = 88172645463325252ull;
    for (size_t i = 0; i < (size_t)RMAX * V; i++) { /* N(-2, 3)-like with one token in 775 at 8-16 */
        z ^= z << 13, z ^= z >> 7, z ^= z << 17;
        const double u = (double)(z >> 11) * (1.0 / 9007199254740992.0);
        hl[i] = i % 775 == 0 ? (float)(8 + 8 * u) : (float)(-2 + 3 * (u + u * u - 1));
    }
    float *dl = dup_d(hl, (size_t)RMAX * V * sizeof *hl);
    CK(cudaMallocHost((void **)&pin, (size_t)RMAX * V * sizeof *pin));
    cuk_sample_row *dr = dalloc(RMAX * sizeof *dr);
    int32_t *dout = dalloc(RMAX * sizeof *dout);
    void *scratch = dalloc(cuk_sample_scratch_bytes(RMAX));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    static const struct { const char *name; float t, min_p, top_p; int32_t top_k; } kinds[] = {
        {"greedy", 0, 0, 1, 0}, {"temperature 0.9", 0.9f, 0, 1, 0}, {"+ min-p 0.05", 0.9f, 0.05f, 1, 0},
        {"+ top-p 0.95", 0.9f, 0, 0.95f, 0}, {"llama.cpp's (0.8, top-k 40, top-p 0.95, min-p 0.05)", 0.8f, 0.05f, 0.95f, 40}};
    printf("| rows | draw | cuk_sample us | logits to host us | one read of the logits at the copy rate us |\n");
    printf("| --- | --- | --- | --- | --- |\n");
    for (size_t ni = 0; ni < sizeof NR / sizeof NR[0]; ni++) {
        const int32_t n = NR[ni];
        float ms = 0;
        CK(cudaEventRecord(e0, NULL));
        for (int c = 0; c < calls; c++) CK(cudaMemcpyAsync(pin, dl, (size_t)n * V * 4, cudaMemcpyDeviceToHost, NULL));
        CK(cudaEventRecord(e1, NULL));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        const double copy_us = ms * 1e3 / calls, read_us = (double)n * V * 4 / (gbs / 2 * 1e9) * 1e6;
        for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
            cuk_sample_row hr[16];
            for (int32_t r = 0; r < n; r++)
                hr[r] = (cuk_sample_row){.temperature = kinds[k].t, .min_p = kinds[k].min_p, .top_p = kinds[k].top_p,
                                         .top_k = kinds[k].top_k, .lmin = kinds[k].min_p > 0 ? log((double)kinds[k].min_p) : 0,
                                         .k = (uint64_t)(r + 1) * 2654435761ull};
            CK(cudaMemcpy(dr, hr, n * sizeof *dr, cudaMemcpyHostToDevice));
            const cuk_sample_args a = {dl, V, V, n, dr, scratch, dout, kinds[k].top_p < 1.0f, kinds[k].top_k > 0, NULL, NULL, 0};
            GK(cuk_sample(&a, NULL, &err_));
            CK(cudaEventRecord(e0, NULL));
            for (int c = 0; c < calls; c++) GK(cuk_sample(&a, NULL, &err_));
            CK(cudaEventRecord(e1, NULL));
            CK(cudaEventSynchronize(e1));
            CK(cudaEventElapsedTime(&ms, e0, e1));
            printf("| %d | %s | %.2f | %.2f | %.2f |\n", n, kinds[k].name, ms * 1e3 / calls, copy_us, read_us);
        }
    }
    CK(cudaFree(dl));
    CK(cudaFreeHost(pin));
    CK(cudaFree(dr));
    CK(cudaFree(dout));
    CK(cudaFree(scratch));
    free(hl);
    return 0;
}
