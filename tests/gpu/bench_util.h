/* Error handling shared by the GPU benchmark programs (tests/gpu/bench_*.c): a benchmark stops at
 * its first failed call, naming the call and the line. Include after <stdio.h>, <stdlib.h>,
 * <cuda_runtime_api.h> and format/status.h; define BENCH_EXIT first for another exit code. */
#ifndef G5_BENCH_UTIL_H
#define G5_BENCH_UTIL_H

#ifndef BENCH_EXIT
#define BENCH_EXIT 1
#endif

#include "cuda/cuk_check.h"

/* A CUDA runtime call (cuda/cuk_check.h). */
#define CK(call) CUK_CHECK_OR(call, exit(BENCH_EXIT))

/* A g5_status call; it may report into `g5_error err_`, which this macro declares. */
#define GK(call)                                                                                   \
    do {                                                                                           \
        g5_error err_ = {0};                                                                       \
        g5_status s_ = (call);                                                                     \
        if (s_ != G5_OK) {                                                                         \
            fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #call, err_.msg,            \
                    g5_strerror(s_));                                                              \
            exit(BENCH_EXIT);                                                                      \
        }                                                                                          \
    } while (0)

/* Device memory of n bytes, and a device copy of n host bytes (a failed call ends the bench). */
static inline void *dalloc(size_t n) {
    void *p = NULL;
    CK(cudaMalloc(&p, n));
    return p;
}
static inline void *dup_d(const void *h, size_t n) {
    void *d = dalloc(n);
    CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    return d;
}

/* The ceiling of the memory-bound benchmarks: a device-to-device copy of 512 MB, five times,
 * bytes read + written per second (GB/s); printed as "D2D copy: N GB/s (read + write)". Needs
 * <cuda_runtime_api.h> and <stdio.h>. */
static inline double bench_copy_gbs(void) {
    const size_t cb = 512ull << 20;
    void *a = NULL, *bb = NULL;
    CK(cudaMalloc(&a, cb));
    CK(cudaMalloc(&bb, cb));
    CK(cudaMemset(a, 1, cb));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaMemcpy(bb, a, cb, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e0, NULL));
    for (int i = 0; i < 5; i++) CK(cudaMemcpyAsync(bb, a, cb, cudaMemcpyDeviceToDevice, NULL));
    CK(cudaEventRecord(e1, NULL));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    const double gbs = 2.0 * 5 * cb / (ms * 1e-3) / 1e9;
    printf("D2D copy: %.0f GB/s (read + write)\n", gbs);
    CK(cudaFree(a));
    CK(cudaFree(bb));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return gbs;
}

#endif
