/* MoE routing plan (cuk_moe_plan) and the slot sum of the grouped down projection
 * (cuk::moe_combine, run by cuk_moe_down). Layout of the plan: cuda/cuk.h. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/cuk.h"
#include "cuda/cuk_internal.cuh"
#include "cuda/moe_plan.cuh"

namespace cuk {

constexpr int PLAN_T = 256;
constexpr int PLAN_MAX_EXPERTS = 1024; /* per-expert counters in shared memory */

/* Exclusive prefix sum of v over the CTA (PLAN_T threads), in thread order; *total gets the sum. */
__device__ int block_excl_scan(int v, int *swarp, int *total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int inc = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += u;
    }
    if (lane == 31) swarp[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        int w = lane < PLAN_T / 32 ? swarp[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int u = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += u;
        }
        if (lane < PLAN_T / 32) swarp[lane] = w; /* inclusive over warps */
    }
    __syncthreads();
    const int before = (warp ? swarp[warp - 1] : 0) + inc - v;
    *total = swarp[PLAN_T / 32 - 1];
    __syncthreads(); /* swarp is reused by the next scan */
    return before;
}

/* One CTA of PLAN_T threads. Phase 1: each pair's flag and the per-expert counts (shared
 * atomics: counts do not depend on their order). Phase 2: experts' list starts and group
 * starts by prefix sums over experts (thread j owns experts j*EPT .. +EPT-1) and the group
 * entries. Phase 3, one warp over the pairs in chunks of 32, in order: a pair's rank among its
 * expert's computed pairs = the expert's running count + its peers before it in the chunk
 * (match_any), so the list is sorted by (expert, pair). */
__global__ void __launch_bounds__(PLAN_T) k_moe_plan(const int32_t *__restrict__ ids, const float *__restrict__ wts,
                                                     int n_tok, int top_k, int64_t ld_ids, int64_t ld_wts,
                                                     int n_expert, int32_t *__restrict__ plan) {
    __shared__ int cnt[PLAN_MAX_EXPERTS], start[PLAN_MAX_EXPERTS];
    __shared__ int swarp[32];
    const int P = n_tok * top_k;
    const PlanParts<int32_t> pp(plan, P);
    int32_t *g_e = pp.g_e, *g_start = pp.g_start, *g_cnt = pp.g_cnt, *list = pp.list, *flag = pp.flag;
    for (int e = threadIdx.x; e < n_expert; e += PLAN_T) cnt[e] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < P; p += PLAN_T) {
        const int t = p / top_k, s = p - t * top_k;
        const int e = ids[(int64_t)t * ld_ids + s];
        const float w = wts[(int64_t)t * ld_wts + s];
        const int f = e < 0 || e >= n_expert ? -1 : w == 0.0f ? 0 : 1;
        flag[p] = f;
        if (f == 1) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    const int ept = (n_expert + PLAN_T - 1) / PLAN_T, e0 = threadIdx.x * ept;
    int c_sum = 0, g_sum = 0;
    for (int i = 0; i < ept; i++)
        if (e0 + i < n_expert) {
            c_sum += cnt[e0 + i];
            g_sum += (cnt[e0 + i] + CUK_MOE_GROUP - 1) / CUK_MOE_GROUP;
        }
    int n_pairs, n_groups;
    int c_off = block_excl_scan(c_sum, swarp, &n_pairs);
    int g_off = block_excl_scan(g_sum, swarp, &n_groups);
    for (int i = 0; i < ept; i++)
        if (e0 + i < n_expert) {
            const int e = e0 + i, c = cnt[e];
            start[e] = c_off;
            for (int r = 0, gi = g_off; r < c; r += CUK_MOE_GROUP, gi++) {
                g_e[gi] = e;
                g_start[gi] = c_off + r;
                g_cnt[gi] = c - r < CUK_MOE_GROUP ? c - r : CUK_MOE_GROUP;
            }
            c_off += c;
            g_off += (c + CUK_MOE_GROUP - 1) / CUK_MOE_GROUP;
            cnt[e] = 0; /* the running count of phase 3 */
        }
    __syncthreads();
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        for (int base = 0; base < P; base += 32) {
            const int p = base + lane;
            int key = -1;
            if (p < P && flag[p] == 1) key = ids[(int64_t)(p / top_k) * ld_ids + p % top_k];
            const unsigned peers = __match_any_sync(0xffffffffu, key);
            const int leader = __ffs(peers) - 1;
            int run = key >= 0 && lane == leader ? cnt[key] : 0;
            run = __shfl_sync(0xffffffffu, run, leader);
            if (key >= 0) list[start[key] + run + __popc(peers & ((1u << lane) - 1u))] = p;
            __syncwarp();
            if (key >= 0 && lane == leader) cnt[key] = run + __popc(peers);
            __syncwarp();
        }
    }
    if (threadIdx.x == 0) plan[0] = n_groups;
}

/* y[t][i] = sum over computed slots s (in order) of wts[t][s] * part[t * top_k + s][i]; NaN for
 * a token with an out-of-range id. Grid: (ceil(m / 256), n_tok); one output element per thread. */
__global__ void k_moe_combine(const float *__restrict__ part, int64_t ldp, const float *__restrict__ wts,
                              int64_t ld_wts, const int32_t *__restrict__ flag, int top_k, int64_t m,
                              float *__restrict__ y, int64_t ldy) {
    const int t = blockIdx.y;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= m) return;
    float acc = 0.0f;
    bool bad = false;
    for (int s = 0; s < top_k; s++) {
        const int64_t p = (int64_t)t * top_k + s;
        const int f = flag[p];
        bad |= f < 0;
        if (f == 1) acc = fmaf(wts[(int64_t)t * ld_wts + s], part[p * ldp + i], acc);
    }
    y[(int64_t)t * ldy + i] = bad ? __int_as_float(0x7fc00000) : acc;
}

g5_status moe_combine(const cuk_moe_down_args *a, cudaStream_t st, g5_error *err) {
    const int64_t P = (int64_t)a->n_tok * a->top_k;
    const int32_t *flag = PlanParts<const int32_t>(a->plan, P).flag;
    const dim3 grid((unsigned)((a->m + 255) / 256), (unsigned)a->n_tok);
    k_moe_combine<<<grid, 256, 0, st>>>(a->part, a->ldp, a->wts, a->ld_wts, flag, a->top_k, a->m, a->y, a->ldy);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}

} // namespace cuk

extern "C" int64_t cuk_moe_plan_words(int32_t n_tok, int32_t top_k) {
    if (n_tok < 1 || top_k < 1) return 0;
    const int64_t P = (int64_t)n_tok * top_k;
    return 1 + 3 * P + 2 * P;
}

#define BAD(...) g5_fail(err, G5_ERR_INVALID_ARG, __VA_ARGS__)

extern "C" g5_status cuk_moe_plan(const cuk_moe_plan_args *a, cuk_stream stream, g5_error *err) {
    if (!a) return BAD("moe_plan: args is NULL");
    if (!a->ids || !a->wts || !a->plan) return BAD("moe_plan: ids, wts or plan is NULL");
    if (a->n_expert < 1 || a->n_expert > cuk::PLAN_MAX_EXPERTS)
        return BAD("moe_plan: n_expert=%d outside 1..%d", (int)a->n_expert, cuk::PLAN_MAX_EXPERTS);
    if (a->top_k < 1 || a->top_k > a->n_expert)
        return BAD("moe_plan: top_k=%d outside 1..n_expert=%d", (int)a->top_k, (int)a->n_expert);
    if (a->n_tok < 1 || (int64_t)a->n_tok * a->top_k > CUK_MOE_PLAN_MAX_PAIRS)
        return BAD("moe_plan: n_tok=%d x top_k=%d pairs outside 1..%d", (int)a->n_tok, (int)a->top_k,
                   CUK_MOE_PLAN_MAX_PAIRS);
    if (a->ld_ids < a->top_k || a->ld_wts < a->top_k)
        return BAD("moe_plan: ld_ids=%lld / ld_wts=%lld < top_k=%d", (long long)a->ld_ids, (long long)a->ld_wts,
                   (int)a->top_k);
    cuk::k_moe_plan<<<1, cuk::PLAN_T, 0, (cudaStream_t)stream>>>(a->ids, a->wts, a->n_tok, a->top_k, a->ld_ids,
                                                                 a->ld_wts, a->n_expert, a->plan);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}
