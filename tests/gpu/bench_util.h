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

#endif
