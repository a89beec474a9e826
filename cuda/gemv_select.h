/* GEMV kernel families by name, for benchmarks and tests: the variants beyond cuk.h's
 * CUK_GEMV_AUTO / CUK_GEMV_SIMT / CUK_GEMV_TC_SUB. Names:
 *   auto     per type and weight shape (never per n: batched launches keep one-vector bits):
 *            Q4_K GEMVs of >= 2^25 weights and Q4_K MoE run the
 *            tensor-core kernels (tc_sub: the fastest on the device, bench/NOTES.md),
 *            everything else the CUDA-core ones
 *   simt     CUDA-core kernels only
 *   tc       tensor cores, magic-exponent quants, 1 chunk ahead per warp
 *   tc_sub   tensor cores, subnormal quants, 1 chunk ahead per warp (= CUK_GEMV_TC_SUB)
 *   tc_sub3  as tc_sub with 2 chunks ahead (same bits as tc_sub)
 *   tc_sub2p, tc_sub3p  as tc_sub, tc_sub3, and each warp asks L2 for its rows of the next
 *            item ahead (cp.async.bulk.prefetch), same bits
 * Process-wide, not thread-safe against concurrent launches. */
#ifndef G5_CUDA_GEMV_SELECT_H
#define G5_CUDA_GEMV_SELECT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 and the family set, or 0 (nothing changed) for an unknown name. */
int cuk_gemv_set_impl_name(const char *name);
/* The name of the family set now. */
const char *cuk_gemv_impl_name(void);
/* 1 if a GEMV of this type and shape would run on the tensor cores with the family set now. */
int cuk_gemv_takes_tc(uint32_t type, int64_t m, int64_t k, int32_t n);

/* How the CUDA-core cuk_gemv splits k for shapes with few rows:
 * 1 "cluster": warps of a CTA and CTAs of a cluster (up to 8) split k, summed in a fixed order;
 * 0 "old" (default: faster at 8 rows, see cuda/gemv.cu): warps of one CTA only. Either
 * way a row's bits never depend on n; the two modes give different bits for the split shapes. */
void cuk_gemv_set_split_mode(int mode);
int cuk_gemv_split_mode(void);

#ifdef __cplusplus
}
#endif

#endif
