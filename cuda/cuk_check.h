/* The one check macro family for CUDA, cuBLAS and NCCL calls, in C (runtime/gpu, the GPU tests)
 * and CUDA C++ (cuda/). Every member names the call (or the launch), the file and line, and the
 * library's own message.
 *
 * Library code (needs a `g5_error *err` in scope; returns G5_ERR_INTERNAL from the function):
 *   CUK_CHECK(call)              a CUDA runtime call (cudaError_t); in C++ also any status type
 *                                with cuk_ok/cuk_errstr overloads (cuBLAS: cuda/gemm.cu)
 *   CUK_CHECK_LAUNCH(what)       the kernel launch just made (cudaGetLastError), named WHAT
 *   CUK_CHECK_NCCL(call, errstr) an NCCL call (ncclResult_t, 0 = success); ERRSTR maps its
 *                                result to a message (ncclGetErrorString, or the dlopen'ed one)
 * Programs (tests, benchmarks), which stop or count instead of returning:
 *   CUK_CHECK_OR(call, action)   prints `FAIL file:line: call: message` to stderr, then ACTION
 *
 * All are built on CUK_TRY_ / CUK_TRY_OR_: a new status type (or reaction) is one line here. */
#ifndef G5_CUK_CHECK_H
#define G5_CUK_CHECK_H

#include <cuda_runtime_api.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "format/status.h"
#ifdef __cplusplus
}
#endif

/* CALL's status S (declared as type T) is good when OKF(S); otherwise ON_FAIL(what, message)
 * runs: a function-like macro given the call's text and STRF(S). */
#define CUK_TRY_(T, call, okf, strf, on_fail)                                                  \
    do {                                                                                      \
        T cuk_s_ = (call);                                                                    \
        if (!(okf(cuk_s_))) on_fail(#call, strf(cuk_s_));                                     \
    } while (0)
/* The same for programs: prints the failure, then runs ACTION. */
#define CUK_TRY_OR_(T, call, okf, strf, action)                                                \
    do {                                                                                      \
        T cuk_s_ = (call);                                                                    \
        if (!(okf(cuk_s_))) {                                                                 \
            fprintf(stderr, "FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #call, strf(cuk_s_));  \
            action;                                                                           \
        }                                                                                     \
    } while (0)

#define CUK_FAIL_RETURN_(what, msg)                                                            \
    return g5_fail(err, G5_ERR_INTERNAL, "%s:%d: %s: %s", __FILE__, __LINE__, what, msg)

static inline int cuk_cuda_ok(cudaError_t e) { return e == cudaSuccess; }
static inline int cuk_nccl_ok(int r) { return r == 0; } /* ncclSuccess */

#ifdef __cplusplus
/* Overloaded per status type (cuBLAS adds its pair where cuBLAS is used, cuda/gemm.cu). */
static inline bool cuk_ok(cudaError_t e) { return e == cudaSuccess; }
static inline const char *cuk_errstr(cudaError_t e) { return cudaGetErrorString(e); }
#define CUK_CHECK(call) CUK_TRY_(auto, call, cuk_ok, cuk_errstr, CUK_FAIL_RETURN_)
#define CUK_CHECK_OR(call, action) CUK_TRY_OR_(auto, call, cuk_ok, cuk_errstr, action)
#else
#define CUK_CHECK(call) CUK_TRY_(cudaError_t, call, cuk_cuda_ok, cudaGetErrorString, CUK_FAIL_RETURN_)
#define CUK_CHECK_OR(call, action) CUK_TRY_OR_(cudaError_t, call, cuk_cuda_ok, cudaGetErrorString, action)
#endif

#define CUK_CHECK_LAUNCH(what)                                                                 \
    do {                                                                                      \
        cudaError_t cuk_s_ = cudaGetLastError();                                              \
        if (cuk_s_ != cudaSuccess)                                                            \
            return g5_fail(err, G5_ERR_INTERNAL, "%s: %s", (what), cudaGetErrorString(cuk_s_)); \
    } while (0)
#define CUK_CHECK_NCCL(call, errstr) CUK_TRY_(int, (int)(call), cuk_nccl_ok, (errstr), CUK_FAIL_RETURN_)

#endif
