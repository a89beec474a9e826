/* Kernel selection for cuk_moe_route (cuda/model_ops.cu), for benchmarks and tests. Two
 * implementations, the same bits on every input (tests/gpu/test_rowops.c checks it):
 *   old  every eligible expert counts its betters over all n_expert choices, one
 *        shared-memory read per step with an early exit (a serial chain of ~n_expert loads for
 *        the experts that are picked); thread 0 sums and divides the weights in float64 alone
 *   warp (default) each warp first drops the experts that have n_used betters inside the warp (shuffles),
 *        the survivors (at most 8 per warp at n_used 8) count their betters among themselves
 *        (float4 reads, no early exit); warp 0 orders the picks and computes the weights, one
 *        lane per pick. CUK_ROUTE_IMPL=old selects the old kernel. On the H200 at GLM-5's
 *        routing (256 experts, 8 used, sigmoid, bias): 3.3 us vs 14.2 us per launch in a graph
 *        (tests/gpu/bench_route.cu), 0 ids and weights differing.
 * Process-wide, not thread-safe against concurrent launches. */
#ifndef G5_CUDA_ROUTE_SELECT_H
#define G5_CUDA_ROUTE_SELECT_H

#ifdef __cplusplus
extern "C" {
#endif

/* 1: the warp kernel, 0: the old one, -1: back to the environment's choice. */
void cuk_route_set_warp(int on);
/* 1 if the warp kernel is selected now. */
int cuk_route_warp(void);

#ifdef __cplusplus
}
#endif

#endif
