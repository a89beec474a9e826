/* The per-device context: the properties of a CUDA device that launchers size their kernels by,
 * read once per device (cuk_device_get), and the start-up check of the kernels' table
 * (cuda/cuk_limits.h) against them. Launchers inside cuda/ read the current device's context
 * (cuk_device_current); runtime/gpu checks every device it places a rank on before loading. */
#ifndef G5_CUK_DEVICE_H
#define G5_CUK_DEVICE_H

#include <stddef.h>

#include "format/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cuk_device {
    int ordinal;                 /* CUDA device number */
    char name[256];
    int cc_major, cc_minor;      /* compute capability (sm_90: 9, 0; sm_120: 12, 0) */
    int sm_count;                /* multiprocessors */
    size_t smem_optin;           /* dynamic shared memory a block may opt into, bytes */
    size_t smem_per_sm;          /* shared memory per multiprocessor, bytes */
    int cluster_launch;          /* 1: thread block clusters */
} cuk_device;

/* Reads device ORDINAL's properties (cached: each device is asked once per process). */
g5_status cuk_device_get(int ordinal, cuk_device *out, g5_error *err);
/* The current device's context (cached), or NULL when it cannot be read. */
const cuk_device *cuk_device_current(void);
/* G5_ERR_UNSUPPORTED naming the kernel and the limit when the device cannot run a kernel of the
 * table (cuk_limits.h) that has no fallback, or is older than the build's targets (sm_90). */
g5_status cuk_device_check(const cuk_device *d, g5_error *err);
/* The dynamic shared memory a launcher may ask for on the current device: min(want, opt-in). */
size_t cuk_device_smem_cap(size_t want);

#ifdef __cplusplus
}
#endif

#endif
