/* DSA lightning indexer (cuda/cuk_model.h): per-query key scores and the exact top-k selection.
 *
 * Top-k is a radix select per query: the scores become order-preserving 32-bit keys, four 8-bit
 * histogram passes find the k-th largest key (thr) and how many keys equal to it are still
 * needed; a final ordered pass keeps every key above thr and the lowest positions among those
 * equal to it. O(positions) work per query, the result independent of thread timing. */
#include <cooperative_groups.h>
#include <math.h>
#include <stdint.h>

#include "cuda/cuk_internal.cuh"
#include "cuda/cuk_model.h"
#include "cuda/mma.cuh"

#define BAD(...) g5_fail(err, G5_ERR_INVALID_ARG, __VA_ARGS__)

namespace {

constexpr int SC_WARPS = 8;
constexpr int TK_THREADS = 512;
constexpr int TK_WARPS = TK_THREADS / 32;

/* The first query token's position: pos0, or with dpos (a CUDA-graph step) *dpos, read at run
 * time; -1 when that one is outside [0, bound - n_tok] (the caller then writes nothing, or, for
 * the top-k, a count of 0 that the attention turns into a NaN row). */
__device__ __forceinline__ int64_t first_pos(int64_t pos0, const int32_t *dpos, int64_t bound, int n_tok) {
    if (!dpos) return pos0;
    const int64_t p = *dpos;
    return p >= 0 && p + n_tok <= bound ? p : -1;
}

/* Token t's key count in a multi-sequence launch (cuk_seq_row): pos + 1, or -1 for a position
 * outside [0, min(cap, bound)). */
__device__ __forceinline__ int64_t row_cnt(const cuk_seq_row *rows, int t, int64_t bound) {
    const int32_t p = rows[t].pos;
    return p >= 0 && p < bound && p < rows[t].cap ? (int64_t)p + 1 : -1;
}

/* grid (ceil((pos0 + n_tok) / SC_WARPS), n_tok): a warp per (query, key). Shared: q, w. */
__global__ void k_scores(const float *__restrict__ q, const float *__restrict__ w,
                         const float *__restrict__ k, int32_t n_head, int32_t dim, int64_t pos0_h,
                         const int32_t *__restrict__ dpos, int64_t bound, float *__restrict__ sc, int64_t ld_sc) {
    extern __shared__ float sm[];
    const int64_t pos0 = first_pos(pos0_h, dpos, bound, (int)gridDim.y);
    if (pos0 < 0) return;
    float *qs = sm;                        /* [n_head * dim] */
    float *ws = sm + (int64_t)n_head * dim; /* [n_head] */
    const int t = blockIdx.y;
    for (int i = threadIdx.x; i < n_head * dim; i += blockDim.x) qs[i] = q[(int64_t)t * n_head * dim + i];
    for (int i = threadIdx.x; i < n_head; i += blockDim.x) ws[i] = w[(int64_t)t * n_head + i];
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t s = (int64_t)blockIdx.x * SC_WARPS + warp;
    if (s > pos0 + t) return;
    const float *kr = k + s * dim;
    float acc = 0.0f;
    for (int h = 0; h < n_head; h++) {
        float d = 0.0f;
        for (int i = lane; i < dim; i += 32) d += qs[h * dim + i] * kr[i];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
        if (d > 0.0f) acc = __fadd_rn(acc, __fmul_rn(ws[h], d));
    }
    if (lane == 0) sc[(int64_t)t * ld_sc + s] = acc;
}

/* Larger float, larger key; -0 and +0 map to the same key. */
__device__ __forceinline__ uint32_t key_of(float f) {
    uint32_t u = f == 0.0f ? 0u : __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Inclusive prefix sum of x over the warp (lane l: lanes 0 .. l). */
template <typename T> __device__ __forceinline__ T warp_incl_scan(T x, int lane) {
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const T y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    return x;
}

/* Exclusive prefix sum of v over the block (blockDim.x == TK_THREADS); *total gets the sum.
 * Uses ws [TK_WARPS + 1]; ends with a barrier, so it may be called again at once. */
__device__ int block_scan(int v, int *ws, int *total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int x = warp_incl_scan(v, lane);
    if (lane == 31) ws[warp] = x;
    __syncthreads();
    if (threadIdx.x == 0) {
        int run = 0;
        for (int i = 0; i < TK_WARPS; i++) {
            const int c = ws[i];
            ws[i] = run;
            run += c;
        }
        ws[TK_WARPS] = run;
    }
    __syncthreads();
    const int r = ws[warp] + x - v;
    *total = ws[TK_WARPS];
    __syncthreads();
    return r;
}

/* A radix pass's decision, by warp 0 (lane l owns bins 8l .. 8l + 7): with S(b) the count in bins
 * b .. 255, the bin b = the largest one in 1 .. 255 with S(b) >= rem (0 if none) and above =
 * S(b + 1), the count in the bins over it: what a walk down from bin 255 finds, in ~30 steps
 * instead of up to 255 dependent ones. Every lane returns the same. */
__device__ __forceinline__ void pick_bin(const uint32_t *h, int rem, int lane, int *b_out, uint32_t *above_out) {
    uint32_t v[8], own = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        v[k] = h[8 * lane + k];
        own += v[k];
    }
    uint32_t suf = own; /* bins 8 lane .. 255 */
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const uint32_t x = __shfl_down_sync(0xffffffffu, suf, o);
        if (lane + o < 32) suf += x;
    }
    uint32_t S[8], run = suf - own; /* S(8 lane + k); run: bins past this lane's */
#pragma unroll
    for (int k = 7; k >= 0; k--) {
        run += v[k];
        S[k] = run;
    }
    int mine = -1;
#pragma unroll
    for (int k = 0; k < 8; k++)
        if (8 * lane + k >= 1 && S[k] >= (uint32_t)rem) mine = 8 * lane + k;
    int b = mine;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) b = max(b, __shfl_xor_sync(0xffffffffu, b, o));
    if (b < 0) b = 0;
    uint32_t ab = 0; /* S(b + 1), from the lane that owns b */
#pragma unroll
    for (int k = 0; k < 8; k++)
        if (8 * lane + k == b) ab = S[k] - v[k];
    *above_out = __shfl_sync(0xffffffffu, ab, b >> 3);
    *b_out = b;
}

/* One radix pass's choice, by the block's first warp: the bin of the remaining K-th largest key
 * among h's counts (pick_bin) joins the shared prefix, and the keys above it leave the count still
 * to take. The caller's barrier follows. */
__device__ __forceinline__ void radix_pick(const uint32_t *h, uint32_t prefix, int shift, uint32_t *s_prefix,
                                           int *s_remaining) {
    if (threadIdx.x < 32) {
        const int rem = *s_remaining;
        int b;
        uint32_t above;
        pick_bin(h, rem, threadIdx.x, &b, &above);
        if (threadIdx.x == 0) {
            *s_remaining = rem - (int)above;
            *s_prefix = prefix | ((uint32_t)b << shift);
        }
    }
}

/* one block per query token */
__global__ void k_topk(const float *__restrict__ sc, int64_t ld_sc, int64_t pos0_h, const int32_t *__restrict__ dpos,
                       const cuk_seq_row *__restrict__ rows, int64_t bound, int32_t K, int32_t *__restrict__ sel,
                       int64_t ld_sel, int32_t *__restrict__ n_sel) {
    __shared__ uint32_t hist[256];
    __shared__ uint32_t s_prefix;
    __shared__ int s_remaining;
    __shared__ int ws[TK_WARPS + 1];
    const int t = blockIdx.x;
    const int64_t pos0 = rows ? 0 : first_pos(pos0_h, dpos, bound, (int)gridDim.x);
    const int64_t cnt = rows ? row_cnt(rows, t, bound) : pos0 + t + 1;
    if (pos0 < 0 || cnt < 0) {
        if (threadIdx.x == 0) n_sel[t] = 0;
        return;
    }
    int32_t *out = sel + (int64_t)t * ld_sel;
    if (cnt <= K) {
        for (int64_t i = threadIdx.x; i < K; i += blockDim.x) out[i] = i < cnt ? (int32_t)i : -1;
        if (threadIdx.x == 0) n_sel[t] = (int32_t)cnt;
        return;
    }
    const float *row = sc + (int64_t)t * ld_sc;
    if (threadIdx.x == 0) {
        s_prefix = 0;
        s_remaining = K;
    }
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        const uint32_t prefix = s_prefix;
        const uint32_t hi = shift == 24 ? 0u : (0xFFFFFFFFu << (shift + 8));
        for (int64_t s = threadIdx.x; s < cnt; s += blockDim.x) {
            const uint32_t key = key_of(row[s]);
            if ((key & hi) == (prefix & hi)) atomicAdd(&hist[(key >> shift) & 0xFF], 1u);
        }
        __syncthreads();
        radix_pick(hist, prefix, shift, &s_prefix, &s_remaining);
        __syncthreads();
    }
    const uint32_t thr = s_prefix;
    const int need_eq = s_remaining; /* keys equal to thr still to take, lowest positions first */
    int taken = 0, eq_seen = 0;
    for (int64_t base = 0; base < cnt; base += blockDim.x) {
        const int64_t s = base + threadIdx.x;
        uint32_t key = 0;
        if (s < cnt) key = key_of(row[s]);
        const int gt = s < cnt && key > thr;
        const int eq = s < cnt && key == thr;
        int eq_tot, take_tot;
        const int eq_before = block_scan(eq, ws, &eq_tot);
        const int take = gt || (eq && eq_seen + eq_before < need_eq);
        const int pos = block_scan(take, ws, &take_tot);
        if (take) out[taken + pos] = (int32_t)s;
        taken += take_tot;
        eq_seen += eq_tot;
    }
    if (threadIdx.x == 0) n_sel[t] = K;
}

constexpr int TO_THREADS = 1024;
constexpr int TO_WARPS = TO_THREADS / 32;
constexpr size_t TO_STATIC = 2048; /* k_topk_one's static shared memory (about 1.2 KB), rounded up */
constexpr int64_t TO_MAX_KEYS = 32768; /* the launcher's bound for it (bench/RESULTS.md, session 34) */
static_assert(TO_MAX_KEYS < 65536, "a warp's and the row's counts fit 16 bits");

/* grid (n_tok), TO_THREADS threads, dynamic shared: the row's radix keys ([>= bound] uint32).
 * k_topk's selection (the same output) with the row read from global memory once: the four
 * radix passes run over the keys in shared memory (plain shared-memory atomics: faster than
 * warp-aggregated adds here), then warp w takes a contiguous chunk of the positions: it counts
 * its keys above and equal to the threshold (lane j reads key j of each 32: no bank conflicts),
 * one scan over the 32 warps of (above << 16 | equal) gives each warp its output offset and the
 * equal keys before it, and the warp writes its chunk in order, 32 keys a step, ranks from
 * ballots. The launcher keeps the bound below 65536 keys (TO_MAX_KEYS). */
__global__ void __launch_bounds__(TO_THREADS) k_topk_one(const float *__restrict__ sc, int64_t ld_sc, int64_t pos0_h,
                                                         const int32_t *__restrict__ dpos,
                                                         const cuk_seq_row *__restrict__ rows, int64_t bound, int32_t K,
                                                         int32_t *__restrict__ sel, int64_t ld_sel,
                                                         int32_t *__restrict__ n_sel) {
    extern __shared__ uint32_t to_keys[];
    __shared__ uint32_t hist[256];
    __shared__ uint32_t s_prefix;
    __shared__ int s_remaining;
    __shared__ uint32_t wsum[TO_WARPS];
    const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t pos0 = rows ? 0 : first_pos(pos0_h, dpos, bound, (int)gridDim.x);
    const int cnt = (int)(rows ? row_cnt(rows, t, bound) : pos0 + t + 1);
    if (pos0 < 0 || cnt < 0) {
        if (threadIdx.x == 0) n_sel[t] = 0;
        return;
    }
    int32_t *out = sel + (int64_t)t * ld_sel;
    if (cnt <= K) {
        for (int i = threadIdx.x; i < K; i += TO_THREADS) out[i] = i < cnt ? i : -1;
        if (threadIdx.x == 0) n_sel[t] = cnt;
        return;
    }
    const float *row = sc + (int64_t)t * ld_sc;
    for (int s = threadIdx.x; s < cnt; s += TO_THREADS) to_keys[s] = key_of(row[s]);
    if (threadIdx.x == 0) {
        s_prefix = 0;
        s_remaining = K;
    }
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += TO_THREADS) hist[i] = 0;
        __syncthreads();
        const uint32_t prefix = s_prefix;
        const uint32_t hi = shift == 24 ? 0u : (0xFFFFFFFFu << (shift + 8));
        for (int s = threadIdx.x; s < cnt; s += TO_THREADS) {
            const uint32_t key = to_keys[s];
            if ((key & hi) == (prefix & hi)) atomicAdd(&hist[(key >> shift) & 0xFFu], 1u);
        }
        __syncthreads();
        radix_pick(hist, prefix, shift, &s_prefix, &s_remaining);
        __syncthreads();
    }
    const uint32_t thr = s_prefix;
    const int need_eq = s_remaining; /* keys equal to thr to take, lowest positions first */
    const int chunk = (cnt + TO_WARPS * 32 - 1) / (TO_WARPS * 32) * 32;
    const int c0 = min(cnt, warp * chunk), c1 = min(cnt, c0 + chunk);
    uint32_t gt = 0, eq = 0;
    for (int s = c0 + lane; s < c1; s += 32) {
        const uint32_t key = to_keys[s];
        gt += key > thr;
        eq += key == thr;
    }
    uint32_t v = gt << 16 | eq;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) wsum[warp] = v;
    __syncthreads();
    if (warp == 0) { /* exclusive scan over the warps */
        const uint32_t w = wsum[lane];
        wsum[lane] = warp_incl_scan(w, lane) - w;
    }
    __syncthreads();
    const uint32_t before = wsum[warp];
    int eq_seen = (int)(before & 0xFFFFu);
    int taken = (int)(before >> 16) + min(eq_seen, need_eq);
    const unsigned lt = (1u << lane) - 1u;
    for (int base = c0; base < c1; base += 32) { /* warp-uniform trip count */
        const int s = base + lane;
        const uint32_t key = s < c1 ? to_keys[s] : 0u;
        const bool is_gt = s < c1 && key > thr, is_eq = s < c1 && key == thr;
        const unsigned eqb = __ballot_sync(0xffffffffu, is_eq);
        const bool take = is_gt || (is_eq && eq_seen + __popc(eqb & lt) < need_eq);
        const unsigned tb = __ballot_sync(0xffffffffu, take);
        if (take) out[taken + __popc(tb & lt)] = s;
        taken += __popc(tb);
        eq_seen += __popc(eqb);
    }
    if (threadIdx.x == 0) n_sel[t] = K;
}

/* ---- split implementations (decode-sized launches; the ones above take the other shapes) ---- */

namespace cg = cooperative_groups;

constexpr int SS_THREADS = 128;
constexpr int SS_MAXH = 32; /* heads held in registers */

/* grid (ceil((pos0 + n_tok) / SS_THREADS), n_tok), SS_THREADS threads: a thread per (query,
 * key). Each thread streams its key row in float4 pieces and keeps the n_head dot products in
 * registers (the query pieces are broadcast reads of shared memory), then applies the relu and
 * the head weights in head order. Shared: q [n_head][dim], w [n_head]. */
__global__ void __launch_bounds__(SS_THREADS) k_scores_split(const float *__restrict__ q, const float *__restrict__ w,
                                                             const float *k, int32_t n_head, int32_t dim,
                                                             int64_t pos0_h, const int32_t *__restrict__ dpos,
                                                             const cuk_seq_row *__restrict__ rows, int64_t bound,
                                                             float *__restrict__ sc, int64_t ld_sc) {
    extern __shared__ __align__(16) float ss_sm[];
    int64_t pos0 = rows ? 0 : first_pos(pos0_h, dpos, bound, (int)gridDim.y);
    if (pos0 < 0) return;
    if (rows) { /* token t's own keys: pos0 + t + 1 of them, as in a one-token launch */
        const int64_t c = row_cnt(rows, (int)blockIdx.y, bound);
        if (c < 0 || !rows[blockIdx.y].idxk) return;
        k = rows[blockIdx.y].idxk;
        pos0 = c - 1 - (int64_t)blockIdx.y;
    }
    float *qs = ss_sm;                          /* [n_head * dim] */
    float *wsh = ss_sm + (int64_t)n_head * dim; /* [n_head] */
    const int t = blockIdx.y;
    const int64_t s = (int64_t)blockIdx.x * SS_THREADS + threadIdx.x;
    if ((int64_t)blockIdx.x * SS_THREADS > pos0 + t) return; /* the whole block is past the causal limit */
    for (int i = threadIdx.x; i < n_head * dim; i += SS_THREADS) qs[i] = q[(int64_t)t * n_head * dim + i];
    for (int i = threadIdx.x; i < n_head; i += SS_THREADS) wsh[i] = w[(int64_t)t * n_head + i];
    __syncthreads();
    if (s > pos0 + t) return;
    const float4 *kr = (const float4 *)(k + s * dim);
    float acc[SS_MAXH];
#pragma unroll
    for (int h = 0; h < SS_MAXH; h++) acc[h] = 0.0f;
    const int d4n = dim / 4;
#pragma unroll 2
    for (int d4 = 0; d4 < d4n; d4++) {
        const float4 kv = kr[d4];
#pragma unroll
        for (int h = 0; h < SS_MAXH; h++) {
            if (h < n_head) {
                const float4 qv = ((const float4 *)(qs + h * dim))[d4];
                acc[h] = fmaf(qv.x, kv.x, acc[h]);
                acc[h] = fmaf(qv.y, kv.y, acc[h]);
                acc[h] = fmaf(qv.z, kv.z, acc[h]);
                acc[h] = fmaf(qv.w, kv.w, acc[h]);
            }
        }
    }
    float r = 0.0f;
#pragma unroll
    for (int h = 0; h < SS_MAXH; h++)
        if (h < n_head && acc[h] > 0.0f) r = __fadd_rn(r, __fmul_rn(wsh[h], acc[h]));
    sc[(int64_t)t * ld_sc + s] = r;
}

constexpr int ST_MAXD4 = 32; /* query float4 pieces held in registers (dim <= 128) */

constexpr int ST_WARPS = 4; /* per block */
constexpr int ST_KG = 8;    /* keys a warp takes at a time: independent FMA chains per lane */
constexpr size_t ST_SMEM = (size_t)ST_WARPS * 2 * ST_KG * ST_MAXD4 * 16;
static_assert(ST_SMEM == CUK_SCORES_TILE_SMEM && ST_SMEM <= CUK_SMEM_NO_OPTIN,
              "cuk_limits.h's entry; no shared-memory opt-in needed");

/* grid (nbx, n_tok), ST_WARPS warps: the same scores as k_scores_split, bit for bit, for decode
 * launches (a thread per key leaves most SMs idle below ~16k keys, and its 512-byte row per thread
 * reads poorly). Lane h holds head h's query row q[t][h] in registers (lanes >= n_head hold
 * zeros) and w[t][h]. Warps take groups of ST_KG consecutive keys (warp-strided over the grid's x
 * warps); a group's rows are staged by 16-byte cp.async into the warp's double buffer (lane i
 * copies piece i of every row: coalesced), the next group's copies in flight while this one is
 * computed. Each lane runs ST_KG fmaf chains (key pieces read as shared-memory broadcasts) in
 * k_scores_split's order (d ascending); the relu'd, weighted head terms go through shared memory
 * and lane i < ST_KG adds key i's 32 terms in head order (a skipped or absent head adds +0, which
 * leaves the sum's bits unchanged: the sum starts at +0 and never becomes -0).
 * Dynamic shared: [ST_WARPS][2][ST_KG][ST_MAXD4] float4 (ST_SMEM bytes). */
__global__ void __launch_bounds__(ST_WARPS * 32) k_scores_tile(const float *__restrict__ q, const float *__restrict__ w,
                                                               const float *k, int32_t n_head, int32_t dim,
                                                               int64_t pos0_h, const int32_t *__restrict__ dpos,
                                                               const cuk_seq_row *__restrict__ rows, int64_t bound,
                                                               float *__restrict__ sc, int64_t ld_sc) {
    extern __shared__ __align__(16) float4 st_buf[];
    __shared__ float red[ST_WARPS][ST_KG][33];
    const int64_t pos0 = rows ? 0 : first_pos(pos0_h, dpos, bound, (int)gridDim.y);
    if (pos0 < 0) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int t = blockIdx.y;
    int64_t cnt = pos0 + t + 1;
    if (rows) { /* token t's own keys */
        cnt = row_cnt(rows, t, bound);
        if (cnt < 0 || !rows[t].idxk) return;
        k = rows[t].idxk;
    }
    const int64_t ngr = (cnt + ST_KG - 1) / ST_KG;
    const int64_t nw = (int64_t)gridDim.x * ST_WARPS;
    int64_t g = (int64_t)blockIdx.x * ST_WARPS + warp;
    if (g >= ngr) return; /* warp-uniform; no block barrier below */
    const int d4n = dim >> 2;
    const bool hl = lane < n_head;
    float4 *wb = st_buf + (int64_t)warp * 2 * ST_KG * ST_MAXD4; /* [2][ST_KG][ST_MAXD4] */
    const uint32_t wb_s = (uint32_t)__cvta_generic_to_shared(wb);
    /* group gg's rows into buffer b; always one commit, so that wait_group counts stay uniform */
    auto stage = [&](int64_t gg, int b) {
        if (gg < ngr && lane < d4n)
#pragma unroll
            for (int i = 0; i < ST_KG; i++) {
                const int64_t s = gg * ST_KG + i < cnt ? gg * ST_KG + i : cnt - 1; /* a clamped duplicate is never stored */
                cuk::cp16(wb_s + (uint32_t)(((b * ST_KG + i) * ST_MAXD4 + lane) * 16), k + s * dim + lane * 4, true);
            }
        cuk::cp_commit();
    };
    stage(g, 0);
    const float4 *qp = (const float4 *)(q + ((int64_t)t * n_head + (hl ? lane : 0)) * dim);
    float4 qr[ST_MAXD4];
#pragma unroll
    for (int d4 = 0; d4 < ST_MAXD4; d4++)
        qr[d4] = hl && d4 < d4n ? __ldg(qp + d4) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float wh = hl ? w[(int64_t)t * n_head + lane] : 0.0f;
    float *rw = &red[warp][0][0];
    for (int b = 0; g < ngr; g += nw, b ^= 1) {
        stage(g + nw, b ^ 1); /* its buffer was last read before the previous pass's final __syncwarp */
        cuk::cp_wait<1>();
        __syncwarp();
        const float4 *kb = wb + b * ST_KG * ST_MAXD4;
        float acc[ST_KG];
#pragma unroll
        for (int i = 0; i < ST_KG; i++) acc[i] = 0.0f;
#pragma unroll
        for (int d4 = 0; d4 < ST_MAXD4; d4++) {
            if (d4 < d4n) {
#pragma unroll
                for (int i = 0; i < ST_KG; i++) {
                    const float4 kv = kb[i * ST_MAXD4 + d4];
                    acc[i] = fmaf(qr[d4].x, kv.x, acc[i]);
                    acc[i] = fmaf(qr[d4].y, kv.y, acc[i]);
                    acc[i] = fmaf(qr[d4].z, kv.z, acc[i]);
                    acc[i] = fmaf(qr[d4].w, kv.w, acc[i]);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < ST_KG; i++) rw[i * 33 + lane] = hl && acc[i] > 0.0f ? __fmul_rn(wh, acc[i]) : 0.0f;
        __syncwarp();
        const int64_t s0 = g * ST_KG;
        if (lane < ST_KG && s0 + lane < cnt) {
            float r = 0.0f;
            for (int h = 0; h < 32; h++) r = __fadd_rn(r, rw[lane * 33 + h]);
            sc[(int64_t)t * ld_sc + s0 + lane] = r;
        }
        __syncwarp();
    }
    cuk::cp_wait<0>();
}

constexpr int TS_MAXCL = CUK_TOPK_SPLIT_CLUSTER_MAX; /* cuda/cuk_limits.h */

/* grid (CL, n_tok), clusters of (CL, 1, 1), TK_THREADS threads. The same radix select as k_topk
 * with token t's positions split into CL contiguous slices, one per block of its cluster: each
 * pass every block builds the histogram of its slice (warp-aggregated shared atomics: scores
 * crowd into few bins), a cluster barrier, then every block sums the CL histograms through
 * distributed shared memory and takes the same decision. Last, each block counts its keys
 * above / equal to the threshold, learns those of the lower ranks, and writes its part of the
 * ordered output at the right offset. */
__global__ void __launch_bounds__(TK_THREADS) k_topk_split(const float *__restrict__ sc, int64_t ld_sc, int64_t pos0_h,
                                                           const int32_t *__restrict__ dpos,
                                                           const cuk_seq_row *__restrict__ rows, int64_t bound, int32_t K,
                                                           int32_t *__restrict__ sel, int64_t ld_sel,
                                                           int32_t *__restrict__ n_sel) {
    __shared__ uint32_t hist[2][256]; /* by pass parity: a pass never clears what another block may still read */
    __shared__ uint32_t tot[256];
    __shared__ uint32_t s_prefix;
    __shared__ int s_remaining;
    __shared__ int ws[TK_WARPS + 1];
    __shared__ int n_gt, n_eq;
    cg::cluster_group cl = cg::this_cluster();
    const int CL = (int)cl.num_blocks(), rank = (int)cl.block_rank();
    const int lane = threadIdx.x & 31;
    const int t = blockIdx.y;
    const int64_t pos0 = rows ? 0 : first_pos(pos0_h, dpos, bound, (int)gridDim.y);
    const int64_t cnt = rows ? row_cnt(rows, t, bound) : pos0 + t + 1;
    if (pos0 < 0 || cnt < 0) { /* the same for the whole cluster, as below */
        if (rank == 0 && threadIdx.x == 0) n_sel[t] = 0;
        return;
    }
    int32_t *out = sel + (int64_t)t * ld_sel;
    if (cnt <= K) { /* the same for the whole cluster: all of it leaves here */
        for (int64_t i = (int64_t)rank * TK_THREADS + threadIdx.x; i < K; i += (int64_t)CL * TK_THREADS)
            out[i] = i < cnt ? (int32_t)i : -1;
        if (rank == 0 && threadIdx.x == 0) n_sel[t] = (int32_t)cnt;
        return;
    }
    const float *row = sc + (int64_t)t * ld_sc;
    const int64_t per = (cnt + CL - 1) / CL;
    const int64_t s0 = min(cnt, (int64_t)rank * per), s1 = min(cnt, s0 + per);
    if (threadIdx.x == 0) {
        s_prefix = 0;
        s_remaining = K;
        n_gt = 0;
        n_eq = 0;
    }
    for (int pass = 0; pass < 4; pass++) {
        const int shift = 24 - 8 * pass;
        uint32_t *H = hist[pass & 1];
        for (int i = threadIdx.x; i < 256; i += TK_THREADS) H[i] = 0;
        __syncthreads();
        const uint32_t prefix = s_prefix;
        const uint32_t hi = shift == 24 ? 0u : (0xFFFFFFFFu << (shift + 8));
        for (int64_t base = s0; base < s1; base += TK_THREADS) {
            const int64_t s = base + threadIdx.x;
            const uint32_t key = s < s1 ? key_of(row[s]) : 0u;
            const bool act = s < s1 && (key & hi) == (prefix & hi);
            const uint32_t bin = act ? (key >> shift) & 0xFFu : 256u;
            const unsigned peers = __match_any_sync(0xffffffffu, bin);
            if (act && lane == __ffs(peers) - 1) atomicAdd(&H[bin], (uint32_t)__popc(peers));
        }
        cl.sync();
        for (int i = threadIdx.x; i < 256; i += TK_THREADS) {
            uint32_t v = 0;
            for (int r = 0; r < CL; r++) v += cl.map_shared_rank(H, r)[i];
            tot[i] = v;
        }
        __syncthreads();
        radix_pick(tot, prefix, shift, &s_prefix, &s_remaining);
        __syncthreads();
    }
    const uint32_t thr = s_prefix;
    const int need_eq = s_remaining; /* keys equal to thr to take, lowest positions first */
    int gt = 0, eq = 0;
    for (int64_t s = s0 + threadIdx.x; s < s1; s += TK_THREADS) {
        const uint32_t key = key_of(row[s]);
        gt += key > thr;
        eq += key == thr;
    }
    for (int o = 16; o > 0; o >>= 1) {
        gt += __shfl_xor_sync(0xffffffffu, gt, o);
        eq += __shfl_xor_sync(0xffffffffu, eq, o);
    }
    if (lane == 0) {
        atomicAdd(&n_gt, gt);
        atomicAdd(&n_eq, eq);
    }
    cl.sync();
    int taken = 0, eq_seen = 0; /* over the lower ranks' slices */
    for (int r = 0; r < rank; r++) {
        const int g = *cl.map_shared_rank(&n_gt, r), e = *cl.map_shared_rank(&n_eq, r);
        taken += g + max(0, min(e, need_eq - eq_seen));
        eq_seen += e;
    }
    for (int64_t base = s0; base < s1; base += TK_THREADS) {
        const int64_t s = base + threadIdx.x;
        uint32_t key = 0;
        if (s < s1) key = key_of(row[s]);
        const int is_gt = s < s1 && key > thr;
        const int is_eq = s < s1 && key == thr;
        int eq_tot, take_tot;
        const int eq_before = block_scan(is_eq, ws, &eq_tot);
        const int take = is_gt || (is_eq && eq_seen + eq_before < need_eq);
        const int pos = block_scan(take, ws, &take_tot);
        if (take) out[taken + pos] = (int32_t)s;
        taken += take_tot;
        eq_seen += eq_tot;
    }
    if (rank == 0 && threadIdx.x == 0) n_sel[t] = K;
    cl.sync(); /* the other blocks may still read this one's counts */
}

} // namespace

/* cuk_idx_scores and cuk_idx_scores_dev. P: the key count the launch is shaped for (pos0 +
 * n_tok, or the bound when the position is read from dpos); the kernels read the position and
 * skip keys past it, so the grid only has to cover P. */
static g5_status idx_scores(const float *q, const float *w, const float *k, int32_t n_tok, int32_t n_head, int32_t dim,
                            int64_t pos0, const int32_t *dpos, const cuk_seq_row *rows, int64_t P, float *sc,
                            int64_t ld_sc, cuk_stream stream, g5_error *err) {
    if (!q || !w || (!k && !rows) || !sc) return BAD("idx_scores: NULL pointer");
    if (n_tok < 1 || n_tok > 65535) return BAD("idx_scores: n_tok=%d outside 1..65535", n_tok);
    if (n_head < 1 || dim < 1 || (int64_t)n_head * dim > 12288)
        return BAD("idx_scores: n_head=%d x dim=%d must be positive and at most 12288", n_head, dim);
    if ((P + SC_WARPS - 1) / SC_WARPS > 2147483647) return BAD("idx_scores: too many positions");
    const size_t smem = ((size_t)n_head * dim + n_head) * sizeof(float);
    /* The staged kernel (same bits as the thread-per-key one) wins for decode steps at every
     * context measured (bench/pending/idxbench.cu, H100, one token: 1k 7.4 vs 12.4 us for the
     * broadcast-load kernel it replaced, 16k 14.1 vs 23.5, 128k 56.8 vs 78.7 for the thread per key)
     * and loses in prefill (512 tokens at 4k: the thread per key, 840 vs 1549 us for the
     * broadcast-load kernel, H200). */
    if ((n_tok <= 4 || rows) && n_head <= 32 && dim % 4 == 0 && dim <= 4 * ST_MAXD4 && ((uintptr_t)k & 15) == 0 &&
        ((uintptr_t)q & 15) == 0) {
        /* two blocks an SM (what the registers allow), a key group per warp at most; the warps
         * stride over the key groups, so a grid made for more keys than there are is exact too
         * (its extra warps leave at once) */
        static int sms = 0;
        if (sms <= 0) sms = cuk_sm_count() > 0 ? cuk_sm_count() : 132;
        const int64_t groups = (P + ST_KG - 1) / ST_KG, want = (groups + ST_WARPS - 1) / ST_WARPS;
        const int64_t cap = (2 * (int64_t)sms + n_tok - 1) / n_tok;
        dim3 g3((unsigned)(want < cap ? want : cap), (unsigned)n_tok);
        k_scores_tile<<<g3, ST_WARPS * 32, ST_SMEM, (cudaStream_t)stream>>>(q, w, k, n_head, dim, pos0, dpos, rows, P,
                                                                             sc, ld_sc);
        CUK_CHECK_LAUNCH("idx_scores");
        return G5_OK;
    }
    if (n_head <= SS_MAXH && dim % 4 == 0 && ((uintptr_t)k & 15) == 0 && smem <= 48 * 1024) {
        dim3 g2((unsigned)((P + SS_THREADS - 1) / SS_THREADS), (unsigned)n_tok);
        k_scores_split<<<g2, SS_THREADS, smem, (cudaStream_t)stream>>>(q, w, k, n_head, dim, pos0, dpos, rows, P, sc,
                                                                          ld_sc);
        CUK_CHECK_LAUNCH("idx_scores");
        return G5_OK;
    }
    if (rows) return BAD("idx_scores_multi: n_head=%d x dim=%d not covered (cuk_idx_multi_fits)", n_head, dim);
    dim3 grid((unsigned)((P + SC_WARPS - 1) / SC_WARPS), (unsigned)n_tok);
    k_scores<<<grid, SC_WARPS * 32, smem, (cudaStream_t)stream>>>(q, w, k, n_head, dim, pos0, dpos, P, sc, ld_sc);
    CUK_CHECK_LAUNCH("idx_scores");
    return G5_OK;
}

extern "C" g5_status cuk_idx_scores(const cuk_idx_scores_args *a, cuk_stream stream, g5_error *err) {
    if (!a) return BAD("idx_scores: no args");
    const int64_t pos0 = a->pos0, ld_sc = a->ld_sc;
    if (pos0 < 0) return BAD("idx_scores: pos0=%lld is negative", (long long)pos0);
    if (ld_sc < pos0 + a->n_tok)
        return BAD("idx_scores: ld_sc=%lld < pos0 + n_tok = %lld", (long long)ld_sc, (long long)(pos0 + a->n_tok));
    return idx_scores(a->q, a->w, a->k, a->n_tok, a->n_head, a->dim, pos0, NULL, NULL, pos0 + a->n_tok, a->sc, ld_sc,
                      stream, err);
}

extern "C" g5_status cuk_idx_scores_dev(const cuk_idx_scores_args *a, cuk_stream stream, g5_error *err) {
    if (!a) return BAD("idx_scores_dev: no args");
    const int64_t pos_bound = a->pos_bound, ld_sc = a->ld_sc;
    if (!a->pos0_dev) return BAD("idx_scores_dev: NULL position");
    if (pos_bound < a->n_tok || pos_bound > 2147483647)
        return BAD("idx_scores_dev: pos_bound=%lld outside n_tok=%d..2^31-1", (long long)pos_bound, a->n_tok);
    if (ld_sc < pos_bound) return BAD("idx_scores_dev: ld_sc=%lld < pos_bound=%lld", (long long)ld_sc, (long long)pos_bound);
    return idx_scores(a->q, a->w, a->k, a->n_tok, a->n_head, a->dim, 0, a->pos0_dev, NULL, pos_bound, a->sc, ld_sc,
                      stream, err);
}

/* cuk_idx_topk and cuk_idx_topk_dev; P as for idx_scores. */
static g5_status idx_topk(const float *sc, int64_t ld_sc, int32_t n_tok, int64_t pos0, const int32_t *dpos,
                          const cuk_seq_row *rows, int64_t P, int32_t k, int32_t *sel, int64_t ld_sel, int32_t *n_sel, cuk_stream stream, g5_error *err) {
    if (!sc || !sel || !n_sel) return BAD("idx_topk: NULL pointer");
    if (n_tok < 1) return BAD("idx_topk: n_tok=%d must be positive", n_tok);
    if (k < 1) return BAD("idx_topk: k=%d must be positive", k);
    if (ld_sel < k) return BAD("idx_topk: ld_sel=%lld < k=%d", (long long)ld_sel, k);
    /* The cluster split covers the SMs when a step has few query tokens; with a block per token
     * for at least every SM the one-block kernel is faster (bench_attn: 512 tokens at 4k, 42.8 us
     * vs 86.3 us). The selection is exact, so the cluster size never changes a result. */
    static int sms = 0;
    if (sms <= 0) sms = cuk_sm_count() > 0 ? cuk_sm_count() : 132;
    if (n_tok < sms) {
        const cudaStream_t st = (cudaStream_t)stream;
        /* one block per token with the row's keys in shared memory, up to TO_MAX_KEYS where the
         * device's opt-in holds them: no cluster barriers, one read of the row (4096 keys: 7.9
         * against 15.3 us for the split kernel on the H100; bench/RESULTS.md, session 34) */
        static size_t one_cap_dev[CUK_MAX_DEVICES];
        size_t &one_cap = one_cap_dev[cuk_device_slot()];
        if (one_cap == 0) {
            one_cap = cuk_device_smem_cap((size_t)TO_MAX_KEYS * 4 + TO_STATIC) - TO_STATIC;
            CUK_CHECK(cudaFuncSetAttribute(k_topk_one, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)one_cap));
        }
        if (P <= TO_MAX_KEYS && (size_t)P * 4 <= one_cap) {
            k_topk_one<<<(unsigned)n_tok, TO_THREADS, (size_t)P * 4, st>>>(sc, ld_sc, pos0, dpos, rows, P, k, sel, ld_sel,
                                                                           n_sel);
            CUK_CHECK_LAUNCH("idx_topk");
            return G5_OK;
        }
        /* 16-block clusters are non-portable: used where one fits (checked once per device) */
        static int max_cl_dev[CUK_MAX_DEVICES];
        int &max_cl = max_cl_dev[cuk_device_slot()];
        if (max_cl == 0) max_cl = cuk_cluster_max((const void *)k_topk_split, TS_MAXCL, TK_THREADS, 0, st);
        /* enough blocks to cover the SMs, slices of at least 1024 positions */
        int cl = 1;
        while (cl < max_cl && (int64_t)n_tok * cl < sms && P / (cl * 2) >= 1024) cl *= 2;
        cudaLaunchAttribute at;
        const cudaLaunchConfig_t cfg = cuk_cluster_cfg(&at, (unsigned)cl, dim3((unsigned)cl, (unsigned)n_tok, 1),
                                                       TK_THREADS, 0, st);
        cudaError_t e = cudaLaunchKernelEx(&cfg, k_topk_split, sc, ld_sc, pos0, dpos, rows, P, k, sel, ld_sel, n_sel);
        if (e != cudaSuccess) return g5_fail(err, G5_ERR_INTERNAL, "idx_topk: %s", cudaGetErrorString(e));
        CUK_CHECK_LAUNCH("idx_topk");
        return G5_OK;
    }
    k_topk<<<(unsigned)n_tok, TK_THREADS, 0, (cudaStream_t)stream>>>(sc, ld_sc, pos0, dpos, rows, P, k, sel, ld_sel,
                                                                        n_sel);
    CUK_CHECK_LAUNCH("idx_topk");
    return G5_OK;
}

extern "C" g5_status cuk_idx_topk(const cuk_idx_topk_args *a, cuk_stream stream, g5_error *err) {
    if (!a) return BAD("idx_topk: no args");
    const float *const sc = a->sc;
    const int64_t ld_sc = a->ld_sc, pos0 = a->pos0, ld_sel = a->ld_sel;
    const int32_t n_tok = a->n_tok, k = a->k;
    int32_t *const sel = a->sel, *const n_sel = a->n_sel;
    if (n_tok < 1) return BAD("idx_topk: n_tok=%d must be positive", n_tok);
    if (pos0 < 0 || pos0 > 2147483647 - (int64_t)n_tok) return BAD("idx_topk: pos0=%lld out of range", (long long)pos0);
    if (ld_sc < pos0 + n_tok) return BAD("idx_topk: ld_sc=%lld < pos0 + n_tok = %lld", (long long)ld_sc, (long long)(pos0 + n_tok));
    return idx_topk(sc, ld_sc, n_tok, pos0, NULL, NULL, pos0 + n_tok, k, sel, ld_sel, n_sel, stream, err);
}

extern "C" g5_status cuk_idx_topk_dev(const cuk_idx_topk_args *a, cuk_stream stream, g5_error *err) {
    if (!a) return BAD("idx_topk_dev: no args");
    const float *const sc = a->sc;
    const int64_t ld_sc = a->ld_sc, pos_bound = a->pos_bound, ld_sel = a->ld_sel;
    const int32_t n_tok = a->n_tok, k = a->k;
    const int32_t *const pos0_dev = a->pos0_dev;
    int32_t *const sel = a->sel, *const n_sel = a->n_sel;
    if (!pos0_dev) return BAD("idx_topk_dev: NULL position");
    if (n_tok < 1) return BAD("idx_topk_dev: n_tok=%d must be positive", n_tok);
    if (pos_bound < n_tok || pos_bound > 2147483647)
        return BAD("idx_topk_dev: pos_bound=%lld outside n_tok=%d..2^31-1", (long long)pos_bound, n_tok);
    if (ld_sc < pos_bound) return BAD("idx_topk_dev: ld_sc=%lld < pos_bound=%lld", (long long)ld_sc, (long long)pos_bound);
    return idx_topk(sc, ld_sc, n_tok, 0, pos0_dev, NULL, pos_bound, k, sel, ld_sel, n_sel, stream, err);
}

extern "C" int cuk_idx_multi_fits(int32_t n_head, int32_t dim) {
    return n_head >= 1 && n_head <= SS_MAXH && dim >= 4 && dim % 4 == 0 &&
           ((size_t)n_head * dim + n_head) * sizeof(float) <= 48 * 1024;
}

extern "C" g5_status cuk_idx_scores_multi(const cuk_idx_scores_args *a, cuk_stream stream, g5_error *err) {
    if (!a) return BAD("idx_scores_multi: no args");
    const float *const q = a->q, *const w = a->w;
    const cuk_seq_row *const rows = a->rows;
    const int32_t n_tok = a->n_tok, n_head = a->n_head, dim = a->dim;
    const int64_t pos_bound = a->pos_bound, ld_sc = a->ld_sc;
    float *const sc = a->sc;
    if (!rows) return BAD("idx_scores_multi: NULL rows");
    if (!cuk_idx_multi_fits(n_head, dim)) return BAD("idx_scores_multi: n_head=%d x dim=%d not covered", n_head, dim);
    if (pos_bound < 1 || pos_bound > 2147483647) return BAD("idx_scores_multi: pos_bound=%lld", (long long)pos_bound);
    if (ld_sc < pos_bound) return BAD("idx_scores_multi: ld_sc=%lld < pos_bound=%lld", (long long)ld_sc, (long long)pos_bound);
    /* the key caches come from cudaMalloc at row offsets of dim floats: 16-byte aligned */
    return idx_scores(q, w, NULL, n_tok, n_head, dim, 0, NULL, rows, pos_bound, sc, ld_sc, stream, err);
}

extern "C" g5_status cuk_idx_topk_multi(const cuk_idx_topk_args *a, cuk_stream stream, g5_error *err) {
    if (!a) return BAD("idx_topk_multi: no args");
    const float *const sc = a->sc;
    const cuk_seq_row *const rows = a->rows;
    const int64_t ld_sc = a->ld_sc, pos_bound = a->pos_bound, ld_sel = a->ld_sel;
    const int32_t n_tok = a->n_tok, k = a->k;
    int32_t *const sel = a->sel, *const n_sel = a->n_sel;
    if (!rows) return BAD("idx_topk_multi: NULL rows");
    if (pos_bound < 1 || pos_bound > 2147483647) return BAD("idx_topk_multi: pos_bound=%lld", (long long)pos_bound);
    if (ld_sc < pos_bound) return BAD("idx_topk_multi: ld_sc=%lld < pos_bound=%lld", (long long)ld_sc, (long long)pos_bound);
    return idx_topk(sc, ld_sc, n_tok, 0, NULL, rows, pos_bound, k, sel, ld_sel, n_sel, stream, err);
}
