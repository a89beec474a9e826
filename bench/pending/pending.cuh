/* Helpers of the standalone programs in bench/pending (compiled on the CPU machine, run on the
 * device with no build there): CK from tests/gpu/bench_util.h, GXX (bench_util.h's GK for C++:
 * its `= {0}` does not initialize g5_error's enum member there; the call sees `err_`), a
 * deterministic xorshift uniform, dev_rand (uniform floats in device memory), bucket (the decode
 * graph's key bucket), and time_us (mean microseconds of reps calls f(0) .. f(reps - 1)
 * after one warm-up call, between two events on the default stream). Exit codes: 1 a failed
 * check, 2 a failed call. */
#ifndef G5_BENCH_PENDING_CUH
#define G5_BENCH_PENDING_CUH

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#define BENCH_EXIT 2
#include "tests/gpu/bench_util.h"

#define GXX(call)                                                                                  \
    do {                                                                                           \
        g5_error err_ = {};                                                                        \
        if ((call) != G5_OK) {                                                                     \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, err_.msg);               \
            exit(BENCH_EXIT);                                                                      \
        }                                                                                          \
    } while (0)

static uint64_t pend_rng = 0x9E3779B97F4A7C15ull;
static inline float unif(float a, float b) {
    pend_rng ^= pend_rng << 13;
    pend_rng ^= pend_rng >> 7;
    pend_rng ^= pend_rng << 17;
    return a + (b - a) * (float)((pend_rng >> 40) * (1.0 / 16777216.0));
}

/* n uniform floats in [a, b) in device memory */
static inline float *dev_rand(size_t n, float a, float b) {
    std::vector<float> h(n);
    for (auto &x : h) x = unif(a, b);
    float *d;
    CK(cudaMalloc(&d, n * 4));
    CK(cudaMemcpy(d, h.data(), n * 4, cudaMemcpyHostToDevice));
    return d;
}

/* the decode graph's key bucket for cnt keys (specs/numerics.md) */
static inline int64_t bucket(int64_t cnt) {
    if (cnt <= 16384) {
        int64_t b = 1024;
        while (b < cnt) b *= 2;
        return b;
    }
    return (cnt + 8191) / 8192 * 8192;
}

template <typename F> static float time_us(int reps, F f) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    f(0);
    CK(cudaDeviceSynchronize());
    CK(cudaEventRecord(a));
    for (int i = 0; i < reps; i++) f(i);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    CK(cudaGetLastError());
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    cudaEventDestroy(a), cudaEventDestroy(b);
    return ms * 1000.0f / (float)reps;
}

#endif
