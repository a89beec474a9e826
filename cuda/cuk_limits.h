/* The kernels' shared memory and cluster sizes, in one table that the kernels take their
 * constants from, that start-up checks against the device (cuk_device_check, cuk_device.h) and
 * that tests/test_kernel_limits.c checks, without a GPU, against sm_120's published limits
 * (RTX PRO 6000 Blackwell: 99 KB of dynamic shared memory per block after opt-in, portable
 * cluster size 8). Plain C, no CUDA header: the CPU build compiles it.
 *
 * A kernel either fits every target (48 KB without opt-in, up to 99 KB with it, clusters of at
 * most 8), or is marked DEVICE: its launcher sizes it from the device's properties at start-up
 * (the opt-in limit, the cluster size cudaOccupancyMaxPotentialClusterSize grants) and falls back
 * to the kernel named in `fallback`, which itself fits. Byte counts are for GLM-5's shapes (MLA
 * nope 192, rope 64, kv_lora 512; DSA indexer 32 heads x 128, top-k 2048): the largest launch.
 * Static shared memory (__shared__ arrays) is bounded by ptxas at 48 KB for every target, so the
 * table lists the dynamic part and the clusters; a kernel with neither (the prefill kernels of
 * attn_prefill.cu and moe_prefill.cu, the row kernels) fits both targets as built. */
#ifndef G5_CUK_LIMITS_H
#define G5_CUK_LIMITS_H

#include <stddef.h>
#include <stdint.h>

#define CUK_SMEM_NO_OPTIN (48u * 1024)     /* dynamic shared memory any device gives without opt-in */
#define CUK_SM120_SMEM_OPTIN (99u * 1024)  /* sm_120: the most a block may opt into (101376 bytes) */
#define CUK_PORTABLE_CLUSTER 8             /* every cluster-capable device runs clusters of 8 */

/* The constants the kernels use (the .cu files of cuda/ take them from here). */
#define CUK_GEMV_TC_SMEM_PREF (112u * 1024) /* gemv_tc.cuh: two CTAs per SM on sm_90; capped by the device */
#define CUK_NORM_CLUSTER_MAX 8              /* ops.cu: CTAs per row of the norms (NR_CL) */
#define CUK_ATTEND_SPLIT_CLUSTER_MAX 16     /* attn.cu: non-portable, only where the device grants it */
#define CUK_MLA_DEC_CLUSTER_MAX 16          /* attn_dec.cu: non-portable, only where the device grants it */
#define CUK_TOPK_SPLIT_CLUSTER_MAX 16       /* indexer.cu: non-portable, only where the device grants it */
#define CUK_MOE_MM_SMEM ((64 + 2 * 128) * (128 + 8) * 2) /* moe_mm.cu: input tile + gate and up weight tiles, fp16 */
#define CUK_SCORES_TILE_SMEM (4 * 2 * 8 * 32 * 16) /* indexer.cu: k_scores_tile's per-warp double buffers of key rows */
#define CUK_Q8T_SX_SMEM (200u * 1024) /* gemv_q8t.cu: k_gemv_q8t_sx's x slots (+ 16 KB static): sm_90's 227 KB only */

/* GLM-5's shapes the byte counts below are taken at. */
#define CUK_G5_NOPE 192
#define CUK_G5_KVW (512 + 64)
#define CUK_G5_TOPK 2048
#define CUK_G5_IDX_HEADS 32
#define CUK_G5_IDX_DIM 128

typedef struct cuk_kernel_limit {
    const char *kernel;
    uint32_t smem;             /* dynamic shared memory per block at GLM-5's shapes, bytes */
    uint32_t cluster;          /* largest cluster it is launched with unconditionally (1: none) */
    uint32_t cluster_device;   /* larger cluster used only where the device grants it (0: none) */
    int smem_device;           /* 1: smem above the device's opt-in limit is not asked for: the
                                  launcher caps it or takes `fallback` */
    const char *fallback;      /* what runs where the device cannot (NULL: nothing: start-up fails) */
} cuk_kernel_limit;

/* The table. Static data in the header so that the CPU test needs no CUDA. */
static const cuk_kernel_limit cuk_kernel_limits[] = {
    /* gemv_impl.cuh: static_assert'ed below CUK_SMEM_NO_OPTIN per instantiation */
    {"k_gemv / k_gate_up / k_down", CUK_SMEM_NO_OPTIN, 1, 0, 0, NULL},
    {"k_tc (tensor-core GEMV)", CUK_GEMV_TC_SMEM_PREF, 1, 0, 1, "k_gemv (shapes whose x pieces exceed the cap)"},
    /* attn.cu: (nope * AB_COLS + AB_TOK * nope) floats */
    {"k_absorb_split", (CUK_G5_NOPE * 32 + 16 * CUK_G5_NOPE) * 4, 1, 0, 1, "k_absorb"},
    {"k_absorb", 8 * CUK_G5_NOPE * 4, 1, 0, 0, NULL},
    /* attn.cu: two tiles of AC_TK = 32 latent rows */
    /* attn.cu: (AH_HB + AH_TK) rows of (kv_lora + rope + 4) floats */
    {"k_attend_hg", (8 + 32) * (CUK_G5_KVW + 4) * 4, CUK_PORTABLE_CLUSTER, CUK_ATTEND_SPLIT_CLUSTER_MAX, 1, "k_attend"},
    /* attn_dec.cu: 64 query rows, two key tiles of 64 rows, the P tile (fp16), positions, maxima */
    {"k_mla_dec", 64 * CUK_G5_KVW * 2 + 2 * 64 * CUK_G5_KVW * 2 + 64 * 64 * 2 + 2 * 64 * 4 + 8 * 16 * 4,
     CUK_PORTABLE_CLUSTER, CUK_MLA_DEC_CLUSTER_MAX, 1, "k_attend_hg"},
    {"k_attend", CUK_G5_KVW * 4 + CUK_G5_TOPK * (4 + 4), 1, 0, 0, NULL},
    /* indexer.cu: (n_head * dim + n_head) floats; the split kernel only up to CUK_SMEM_NO_OPTIN */
    {"k_scores_split / k_scores", (CUK_G5_IDX_HEADS * CUK_G5_IDX_DIM + CUK_G5_IDX_HEADS) * 4, 1, 0, 0, NULL},
    {"k_scores_tile", CUK_SCORES_TILE_SMEM, 1, 0, 0, NULL},
    /* indexer.cu: a token's keys (4 bytes each) up to TO_MAX_KEYS = 32768 and the device's opt-in */
    {"k_topk_one", 32768 * 4, 1, 0, 1, "k_topk_split"},
    {"k_topk_split", 0, CUK_PORTABLE_CLUSTER, CUK_TOPK_SPLIT_CLUSTER_MAX, 0, "k_topk"},
    {"k_norm", 0, CUK_NORM_CLUSTER_MAX, 0, 0, NULL},
    {"k_moe_mm", CUK_MOE_MM_SMEM, 1, 0, 0, NULL},
    /* gemv_q8t.cu: the L1 form has static shared memory only; the sx form's slots need sm_90's
     * opt-in, and its launcher takes the L1 form where the device cannot give them */
    {"k_gemv_q8t", 0, 1, 0, 0, NULL},
    {"k_gemv_q8t_sx", CUK_Q8T_SX_SMEM, CUK_PORTABLE_CLUSTER, 0, 1, "k_gemv_q8t"},
};
#define CUK_N_KERNEL_LIMITS (sizeof cuk_kernel_limits / sizeof cuk_kernel_limits[0])

#endif
