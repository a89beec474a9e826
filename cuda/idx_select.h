/* Which kernel cuk_idx_scores (cuda/indexer.cu) runs where the split ones are selected
 * (cuda/attn_select.h), for benchmarks and tests:
 *   lane  (default) a warp per group of keys, lane h = head h, the query held in registers
 *   split a thread per key
 * Both give the same bits (the same float32 operations in the same order), so the choice never
 * changes a result. Shapes the lane kernel does not cover (more than 32 heads, dim above 128 or
 * not a multiple of 4) run the split kernel. Process-wide, not thread-safe against launches. */
#ifndef G5_CUDA_IDX_SELECT_H
#define G5_CUDA_IDX_SELECT_H

#ifdef __cplusplus
extern "C" {
#endif

/* 1: the lane kernel where it fits (default), 0: the split kernel. */
void cuk_idx_scores_set_lane(int on);
int cuk_idx_scores_lane(void);

#ifdef __cplusplus
}
#endif

#endif
