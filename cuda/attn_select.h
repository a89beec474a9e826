/* Kernel selection for the MLA attention and DSA indexer launchers (cuda/attn.cu, indexer.cu),
 * for benchmarks and tests. Two implementations:
 *   split  (default) absorb over W_UK column slices; attention and top-k over thread-block
 *          clusters that split each token's keys / positions; scores a thread per key
 *   old    one block per (head, token) for absorb / attention, one block per token for top-k,
 *          a warp per key for scores
 * Shapes the split kernels do not cover use the old ones either way. Process-wide, not
 * thread-safe against concurrent launches. */
#ifndef G5_CUDA_ATTN_SELECT_H
#define G5_CUDA_ATTN_SELECT_H

#ifdef __cplusplus
extern "C" {
#endif

/* 1: the old kernels, 0 or -1: the split ones (the default). */
void cuk_attn_set_old(int old);
/* 1 if the old kernels are selected now. */
int cuk_attn_old(void);

#ifdef __cplusplus
}
#endif

#endif
