/* Helpers shared by the GPU test programs (tests/gpu/test_*.c). Define G5_TEST_NAME (the name
 * t_report prints) and G5_TEST_SEED before including; include tests/test_util.h first. */
#ifndef G5_GPU_TEST_UTIL_H
#define G5_GPU_TEST_UTIL_H

#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cuda/cuk_check.h"

/* A failed CUDA call ends the program with the report so far: later checks would only repeat it
 * (cuda/cuk_check.h). */
#define CK(call) CUK_CHECK_OR(call, (fflush(stdout), t_failed++, exit(t_report(G5_TEST_NAME))))

/* The two things a GPU test cannot do without: when one is missing the test fails (a GPU test
 * that ran nothing must not pass) and the caller returns t_report(G5_TEST_NAME) at once. */
static inline int t_need_device(void) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        printf("FAIL: no CUDA device\n");
        t_failed++;
        return 0;
    }
    return 1;
}

static inline int t_need_oracle(void) {
    struct stat sb;
    if (stat(T_ORACLE_GGUF, &sb) != 0) {
        printf("oracle missing at %s\n", T_ORACLE_GGUF);
        T_CHECK(0, "oracle present");
        return 0;
    }
    return 1;
}

static uint64_t g_rng = G5_TEST_SEED;

static inline uint64_t rnd(void) { /* splitmix64 */
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline float unif(float lo, float hi) {
    return lo + (hi - lo) * (float)((rnd() >> 40) * (1.0 / 16777216.0));
}

static inline void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        printf("FAIL: out of host memory (%zu bytes)\n", n);
        exit(2);
    }
    return p;
}

/* Device memory (at least 16 bytes, so a zero-sized buffer still has an address). */
static inline void *dalloc(size_t n) {
    void *p = NULL;
    CK(cudaMalloc(&p, n ? n : 16));
    return p;
}

/* Device copy of n host bytes. */
static inline void *dup_d(const void *h, size_t n) {
    void *d = dalloc(n);
    CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    return d;
}

/* Waits for the device, then copies n bytes back to the host. */
static inline void get(void *h, const void *d, size_t n) {
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
}

static inline int is_nan(float f) { return f != f; }

static inline uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

#define POISON 0xFFFFFFFFu /* a NaN pattern no kernel writes: outputs are poisoned with it */

#endif
