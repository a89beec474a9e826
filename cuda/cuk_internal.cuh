/* Internal to cuda/: small host helpers shared by the .cu files (the check macros: cuk_check.h). */
#ifndef G5_CUK_INTERNAL_CUH
#define G5_CUK_INTERNAL_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda/cuk.h" /* brings format/status.h in with C linkage */
#include "cuda/cuk_check.h"
#include "cuda/cuk_device.h"
#include "cuda/cuk_limits.h"
extern "C" {
#include "format/quant.h"
}

/* Multiprocessor count of the current device (0 if it cannot be read). */
static inline int cuk_sm_count(void) {
    const cuk_device *d = cuk_device_current(); /* cuda/cuk_device.h */
    return d ? d->sm_count : 0;
}

/* Function attributes (the dynamic shared memory opt-in, non-portable cluster sizes) belong to
 * one device: a launcher that sets one "once" keeps that per device, or the kernel's first
 * launch on another GPU of the same process fails (seen with TP 2 over two H200s driven by one
 * process). Devices past CUK_MAX_DEVICES share the last slot (then merely set again). */
#define CUK_MAX_DEVICES 64
static inline int cuk_device_slot(void) {
    int d = 0;
    if (cudaGetDevice(&d) != cudaSuccess || d < 0) return 0;
    return d < CUK_MAX_DEVICES ? d : CUK_MAX_DEVICES - 1;
}

/* The launch configuration of `grid` blocks of `threads` threads with `smem` bytes of dynamic
 * shared memory on st, in clusters of (cl, 1, 1); *at holds the cluster attribute and must
 * outlive the cudaLaunchKernelEx call. */
static inline cudaLaunchConfig_t cuk_cluster_cfg(cudaLaunchAttribute *at, unsigned cl, dim3 grid, unsigned threads,
                                                 size_t smem, cudaStream_t st) {
    at->id = cudaLaunchAttributeClusterDimension;
    at->val.clusterDim.x = cl;
    at->val.clusterDim.y = 1;
    at->val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(threads, 1, 1);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return cfg;
}

/* The largest cluster of `want` blocks (a non-portable size above 8) that the device can run for
 * kernel `fn` with `threads` threads and `smem` bytes of dynamic shared memory per block, else 8.
 * Asked once per kernel by its launcher; a refused query leaves no launch error behind. */
static inline int cuk_cluster_max(const void *fn, int want, int threads, size_t smem, cudaStream_t st) {
    int max_cl = 8;
    if (cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess) {
        cudaLaunchAttribute at;
        const cudaLaunchConfig_t cfg = cuk_cluster_cfg(&at, (unsigned)want, dim3((unsigned)want, 1, 1),
                                                       (unsigned)threads, smem, st);
        int n = 0;
        if (cudaOccupancyMaxActiveClusters(&n, fn, &cfg) == cudaSuccess && n >= 1) max_cl = want;
    }
    (void)cudaGetLastError();
    return max_cl;
}

#endif
