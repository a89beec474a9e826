/* Internal to cuda/: the CUDA error check macro and small host helpers shared by the .cu files. */
#ifndef G5_CUK_INTERNAL_CUH
#define G5_CUK_INTERNAL_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda/cuk.h" /* brings format/status.h in with C linkage */
extern "C" {
#include "format/quant.h"
}

/* One check macro for every CUDA-side status type: cuk_ok/cuk_errstr are overloaded per status
 * type (cudaError_t now; cublasStatus_t and ncclResult_t get their overloads beside these when
 * those libraries come in). Needs a `g5_error *err` in scope; returns G5_ERR_INTERNAL naming the
 * call and the place. */
static inline bool cuk_ok(cudaError_t e) { return e == cudaSuccess; }
static inline const char *cuk_errstr(cudaError_t e) { return cudaGetErrorString(e); }

#define CUK_CHECK(call)                                                                       \
    do {                                                                                      \
        auto cuk_st_ = (call);                                                                \
        if (!cuk_ok(cuk_st_))                                                                 \
            return g5_fail(err, G5_ERR_INTERNAL, "%s:%d: %s: %s", __FILE__, __LINE__, #call,  \
                           cuk_errstr(cuk_st_));                                              \
    } while (0)

/* Multiprocessor count of the current device (0 if it cannot be read). */
static inline int cuk_sm_count(void) {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return 0;
    return n;
}

#endif
