/* The kernels' shared memory and cluster table (cuda/cuk_limits.h, the constants the kernels
 * take) against sm_120's published limits, without a GPU: 99 KB (101376 bytes) of dynamic shared
 * memory per block after opt-in, portable cluster size 8 (CUDA C Programming Guide, compute
 * capability 12.0; the non-portable 16 only where cudaOccupancyMaxPotentialClusterSize grants
 * it). Every kernel must fit, or be sized from the device at start-up with a fallback that fits.
 * The check itself is tried on planted entries that must fail. */
#include "tests/test_util.h"

#include "cuda/cuk_limits.h"

#define SM120_OPTIN 101376u
#define SM90_OPTIN 232448u /* H100/H200: 227 KB */

static const cuk_kernel_limit *find(const char *name) {
    const size_t n = strcspn(name, " ");
    for (size_t i = 0; i < CUK_N_KERNEL_LIMITS; i++)
        if (!strncmp(cuk_kernel_limits[i].kernel, name, n) &&
            (cuk_kernel_limits[i].kernel[n] == 0 || cuk_kernel_limits[i].kernel[n] == ' '))
            return &cuk_kernel_limits[i];
    return NULL;
}

/* What the launcher asks for on a device with OPTIN bytes of opt-in shared memory: the table's
 * bytes when they fit; a device-sized kernel is capped or replaced by its fallback. */
static int runs(const cuk_kernel_limit *k, uint32_t optin, char *why, size_t cap) {
    if (k->cluster > 8) {
        snprintf(why, cap, "%s: unconditional cluster %u > portable 8", k->kernel, k->cluster);
        return 0;
    }
    if (k->cluster_device && (k->cluster_device > 16 || k->cluster_device < k->cluster)) {
        snprintf(why, cap, "%s: device-granted cluster %u outside %u..16", k->kernel, k->cluster_device, k->cluster);
        return 0;
    }
    if (k->smem <= optin) return 1;
    if (!k->smem_device) {
        snprintf(why, cap, "%s: %u bytes of shared memory per block > %u, and not sized from the device", k->kernel,
                 k->smem, optin);
        return 0;
    }
    if (!k->fallback) {
        snprintf(why, cap, "%s: %u bytes > %u and no fallback", k->kernel, k->smem, optin);
        return 0;
    }
    const cuk_kernel_limit *f = find(k->fallback);
    if (!f || f == k) {
        snprintf(why, cap, "%s: fallback '%s' not in the table", k->kernel, k->fallback);
        return 0;
    }
    return runs(f, optin, why, cap);
}

int main(void) {
    char why[512];
    T_CHECK(CUK_SM120_SMEM_OPTIN == SM120_OPTIN, "sm_120 opt-in %u", CUK_SM120_SMEM_OPTIN);
    T_CHECK(CUK_PORTABLE_CLUSTER == 8, "portable cluster %d", CUK_PORTABLE_CLUSTER);
    T_CHECK(CUK_N_KERNEL_LIMITS >= 9, "%zu kernels in the table", (size_t)CUK_N_KERNEL_LIMITS);
    for (size_t i = 0; i < CUK_N_KERNEL_LIMITS; i++) {
        const cuk_kernel_limit *k = &cuk_kernel_limits[i];
        why[0] = 0;
        T_CHECK(runs(k, CUK_SM120_SMEM_OPTIN, why, sizeof why), "sm_120: %s", why);
        T_CHECK(runs(k, SM90_OPTIN, why, sizeof why), "sm_90: %s", why);
        /* without a fallback, above the no-opt-in 48 KB, a launcher must set the attribute */
        T_CHECK(k->smem_device || k->smem <= CUK_SM120_SMEM_OPTIN, "%s: %u bytes", k->kernel, k->smem);
        printf("  %-28s smem %6u B%s  cluster %u%s\n", k->kernel, k->smem, k->smem_device ? " (device-sized)" : "",
               k->cluster, k->cluster_device ? " (16 where granted)" : "");
    }
    /* the kernels' constants, as the table states them */
    T_CHECK(CUK_NORM_CLUSTER_MAX <= CUK_PORTABLE_CLUSTER, "portable clusters: norm %d", CUK_NORM_CLUSTER_MAX);
    T_CHECK(find("k_tc")->smem_device && find("k_attend_hg")->smem_device && find("k_absorb_split")->smem_device,
            "the kernels above 99 KB are device-sized");
    /* the check fails on planted entries */
    static const cuk_kernel_limit bad[] = {
        {"planted_smem", 100 * 1024, 1, 0, 0, NULL},
        {"planted_cluster", 0, 16, 0, 0, NULL},
        {"planted_no_fallback", 150 * 1024, 1, 0, 1, NULL},
        {"planted_bad_fallback", 150 * 1024, 1, 0, 1, "k_nothing"},
        {"planted_cluster_device", 0, 8, 32, 0, NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        T_CHECK(!runs(&bad[i], CUK_SM120_SMEM_OPTIN, why, sizeof why), "%s passed the check", bad[i].kernel);
    static const cuk_kernel_limit big_fb = {"planted_fallback_too_big", 150 * 1024, 1, 0, 1, "k_attend_hg"};
    T_CHECK(runs(&big_fb, CUK_SM120_SMEM_OPTIN, why, sizeof why), "a device-sized kernel falling back to one that falls back: %s", why);
    return t_report("test_kernel_limits");
}
