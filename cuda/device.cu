/* cuda/cuk_device.h: the per-device context and the start-up check of cuda/cuk_limits.h. */
#include <stdio.h>
#include <string.h>

#include "cuda/cuk_device.h"
#include "cuda/cuk_internal.cuh"
#include "cuda/cuk_limits.h"

/* One context per device slot, written once (by whichever thread asks first; every writer
 * writes the same values) and published with a release store. */
static cuk_device g_dev[CUK_MAX_DEVICES];
static int g_have[CUK_MAX_DEVICES];

/* Attribute queries only (cheap, and allowed while a stream is being captured: the first launch
 * of a kernel may come inside a graph capture); the name through the device properties only
 * where asked for (start-up, cuk_device_get). */
static g5_status read_device(int ordinal, int with_name, cuk_device *d, g5_error *err) {
    memset(d, 0, sizeof *d);
    d->ordinal = ordinal;
    int v[6] = {0};
    CUK_CHECK(cudaDeviceGetAttribute(&v[0], cudaDevAttrComputeCapabilityMajor, ordinal));
    CUK_CHECK(cudaDeviceGetAttribute(&v[1], cudaDevAttrComputeCapabilityMinor, ordinal));
    CUK_CHECK(cudaDeviceGetAttribute(&v[2], cudaDevAttrMultiProcessorCount, ordinal));
    CUK_CHECK(cudaDeviceGetAttribute(&v[3], cudaDevAttrMaxSharedMemoryPerBlockOptin, ordinal));
    CUK_CHECK(cudaDeviceGetAttribute(&v[4], cudaDevAttrMaxSharedMemoryPerMultiprocessor, ordinal));
    CUK_CHECK(cudaDeviceGetAttribute(&v[5], cudaDevAttrClusterLaunch, ordinal));
    d->cc_major = v[0];
    d->cc_minor = v[1];
    d->sm_count = v[2];
    d->smem_optin = (size_t)v[3];
    d->smem_per_sm = (size_t)v[4];
    d->cluster_launch = v[5] != 0;
    if (with_name) {
        cudaDeviceProp prop;
        CUK_CHECK(cudaGetDeviceProperties(&prop, ordinal));
        snprintf(d->name, sizeof d->name, "%s", prop.name);
    } else {
        snprintf(d->name, sizeof d->name, "CUDA device %d", ordinal);
    }
    return G5_OK;
}

/* g_have: 0 none, 1 read without the name, 2 with it. */
static g5_status get(int ordinal, int with_name, cuk_device *out, g5_error *err) {
    if (ordinal < 0) return g5_fail(err, G5_ERR_INVALID_ARG, "device %d", ordinal);
    const int slot = ordinal < CUK_MAX_DEVICES ? ordinal : -1;
    if (slot >= 0 && __atomic_load_n(&g_have[slot], __ATOMIC_ACQUIRE) >= 1 + with_name) {
        *out = g_dev[slot];
        return G5_OK;
    }
    cuk_device d;
    g5_status st = read_device(ordinal, with_name, &d, err);
    if (st) return st;
    if (slot >= 0 && __atomic_load_n(&g_have[slot], __ATOMIC_ACQUIRE) < 1 + with_name) {
        g_dev[slot] = d;
        __atomic_store_n(&g_have[slot], 1 + with_name, __ATOMIC_RELEASE);
    }
    *out = d;
    return G5_OK;
}

extern "C" g5_status cuk_device_get(int ordinal, cuk_device *out, g5_error *err) { return get(ordinal, 1, out, err); }

extern "C" const cuk_device *cuk_device_current(void) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= CUK_MAX_DEVICES) return NULL;
    if (!__atomic_load_n(&g_have[dev], __ATOMIC_ACQUIRE)) {
        cuk_device d;
        g5_error e;
        if (get(dev, 0, &d, &e)) return NULL;
    }
    return &g_dev[dev];
}

extern "C" size_t cuk_device_smem_cap(size_t want) {
    const cuk_device *d = cuk_device_current();
    return d && d->smem_optin < want ? d->smem_optin : want;
}

extern "C" g5_status cuk_device_check(const cuk_device *d, g5_error *err) {
    if (!d) return g5_fail(err, G5_ERR_INVALID_ARG, "no device");
    if (d->cc_major < 9)
        return g5_fail(err, G5_ERR_UNSUPPORTED,
                       "device %d (%s) is sm_%d%d: the kernels are built for sm_90 and later (thread block clusters)",
                       d->ordinal, d->name, d->cc_major, d->cc_minor);
    for (size_t i = 0; i < CUK_N_KERNEL_LIMITS; i++) {
        const cuk_kernel_limit *k = &cuk_kernel_limits[i];
        if (!k->smem_device && k->smem > CUK_SMEM_NO_OPTIN && k->smem > d->smem_optin)
            return g5_fail(err, G5_ERR_UNSUPPORTED,
                           "kernel %s needs %u bytes of shared memory per block; device %d (%s, sm_%d%d) allows %zu",
                           k->kernel, k->smem, d->ordinal, d->name, d->cc_major, d->cc_minor, d->smem_optin);
        if (k->cluster > 1 && !d->cluster_launch)
            return g5_fail(err, G5_ERR_UNSUPPORTED,
                           "kernel %s launches clusters of %u blocks; device %d (%s, sm_%d%d) has no cluster launch",
                           k->kernel, k->cluster, d->ordinal, d->name, d->cc_major, d->cc_minor);
    }
    return G5_OK;
}
