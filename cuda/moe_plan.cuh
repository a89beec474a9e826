/* Views of a MoE routing plan (layout: cuda/cuk.h, cuk_moe_plan) for the expert kernels, and the
 * slot sum of the grouped down projection (cuda/moe_plan.cu). */
#ifndef G5_MOE_PLAN_CUH
#define G5_MOE_PLAN_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/cuk.h"

namespace cuk {

/* The plan of P = n_tok * top_k pairs, read by the kernels. */
struct PlanView {
    const int32_t *plan;
    int P;
    __host__ __device__ PlanView(const int32_t *p, int n_pairs) : plan(p), P(n_pairs) {}
    __device__ int n_groups() const { return plan[0]; }
    __device__ int expert(int g) const { return plan[1 + g]; }
    __device__ int start(int g) const { return plan[1 + P + g]; }
    __device__ int count(int g) const { return plan[1 + 2 * P + g]; }
    __device__ int pair(int pos) const { return plan[1 + 3 * P + pos]; }
};

/* The plan's regions for P pairs (as many group slots as pairs), where its writers (k_moe_plan,
 * k_route's one-token plan) and the slot sum (its flags) find them. I: int32_t or const int32_t. */
template <class I> struct PlanParts {
    I *g_e, *g_start, *g_cnt, *list, *flag;
    __host__ __device__ PlanParts(I *plan, int64_t P)
        : g_e(plan + 1), g_start(plan + 1 + P), g_cnt(plan + 1 + 2 * P), list(plan + 1 + 3 * P),
          flag(plan + 1 + 4 * P) {}
};

/* y of cuk_moe_down from its part rows (one launch). */
g5_status moe_combine(const cuk_moe_down_args *a, cudaStream_t st, g5_error *err);

} // namespace cuk

#endif
