/* Token draws on the device (cuda/cuk_sample.h). Each row's vocabulary cut into segs segments of
 * consecutive ids:
 *   (rows with penalties, any_pen) k_samp_penalize: the window's logits penalized in place
 *   k_samp_max   each segment's largest logit and its first id (the argmax rule, argmax.cuh)
 *   (top-k rows, any_top_k) k_samp_hist + k_samp_cut three times in W_TOPK: a radix select of
 *                the top_k-th key kk (dx_desc_key, 11 + 11 + 10 bits) over count histograms;
 *                then k_samp_mass + k_samp_pick in W_TOPK: the last of kk's ties in the set, by
 *                an exact prefix count in id order (idk)
 *   (top-p rows, any_top_p) k_samp_hist + k_samp_cut three times in W_DRAW: the same select of
 *                the cut's key kt over histograms of the set's temperature-1 masses (the first
 *                pass also sums z, the set's temperature-1 mass)
 *   k_samp_mass  each segment's mass at its row's temperature, from the row's largest logit
 *   k_samp_pick  a row's token: the argmax, or the segment holding r, then the warp's piece of it,
 *                then the id, each found from exact integer prefix sums
 * Masses and counts are integers, so how the sums are split and combined changes nothing: the
 * token is the host sampler's (runtime/text/sample.c) bit for bit. */
#include <stdint.h>

#include "cuda/argmax.cuh"
#include "cuda/cuk_internal.cuh"
#include "cuda/cuk_sample.h"
#include "format/det_exp.h"

#define BAD(...) g5_fail(err, G5_ERR_INVALID_ARG, __VA_ARGS__)

namespace {

constexpr int SEGS_MAX = 64;       /* segments a row at most (samp_segs picks by the row count) */
constexpr int SEG_THREADS = 256;   /* k_samp_max, k_samp_hist, k_samp_mass */
constexpr int PICK_THREADS = 1024; /* k_samp_pick: 32 warps */
constexpr int HBINS = 2048;        /* a radix pass's histogram */
constexpr uint32_t ALL = 0xffffffffu;

/* What a pass, cut, mass or pick works on: the draw (masses at the temperature; top-p's
 * temperature-1 masses in hist / cut), or top-k's set (counts). */
enum { W_DRAW = 0, W_TOPK = 1 };

/* A row's selects. Top-k: the count still needed inside the bin chosen so far, the key's digits
 * so far; then kk, the key of the k-th best (ALL: no cut), how many of kk's ties are in (kneed)
 * and the last of them by id (idk). Top-p: z, the mass still needed, the digits so far, kt (ALL:
 * every key). */
struct Sel {
    uint64_t z, need, kneed;
    uint32_t prefix, kt, kprefix, kk;
    int32_t done, kdone, idk, pad;
};

struct Scratch {
    uint64_t *seg_mass; /* [n_rows][segs] */
    uint64_t *hist;     /* [n_rows][HBINS] */
    Sel *sel;           /* [n_rows] */
    float *seg_max;     /* [n_rows][segs] */
    int32_t *seg_arg;   /* [n_rows][segs]: its first id, -1 for a segment of NaN only */
    int segs;           /* segments a row, <= SEGS_MAX: the grid's x of the segment kernels */
};

__host__ __device__ inline Scratch scratch_of(void *p, int32_t n_rows, int segs) {
    Scratch s;
    s.segs = segs;
    s.seg_mass = (uint64_t *)p;
    s.hist = s.seg_mass + (size_t)n_rows * SEGS_MAX;
    s.sel = (Sel *)(s.hist + (size_t)n_rows * HBINS);
    s.seg_max = (float *)(s.sel + n_rows);
    s.seg_arg = (int32_t *)(s.seg_max + (size_t)n_rows * SEGS_MAX);
    return s;
}

__device__ __forceinline__ void seg_range(int32_t n, int s, int segs, int32_t *b, int32_t *e) {
    const int32_t len = (int32_t)(((int64_t)n + segs - 1) / segs);
    const int64_t lo = (int64_t)s * len, hi = lo + len;
    *b = (int32_t)(lo < n ? lo : n);
    *e = (int32_t)(hi < n ? hi : n);
}


__device__ __forceinline__ bool sampled(const cuk_sample_row &r) { return r.temperature > 0.0f; }
__device__ __forceinline__ bool top_k_on(const cuk_sample_row &r, int32_t n) {
    return sampled(r) && r.top_k > 0 && r.top_k < n;
}
__device__ __forceinline__ bool top_p_on(const cuk_sample_row &r) { return sampled(r) && r.top_p < 1.0f; }

/* A row's bounds as the mass functions read them: top-k's (kk, idk) and top-p's kt, ALL where off. */
struct Bounds {
    uint32_t kk, kt;
    int32_t idk;
};

__device__ __forceinline__ Bounds bounds_of(const cuk_sample_row &r, int32_t n, const Scratch &sc, int row) {
    Bounds b = {ALL, ALL, 0};
    if (top_k_on(r, n)) b.kk = sc.sel[row].kk, b.idk = sc.sel[row].idk;
    if (top_p_on(r)) b.kt = sc.sel[row].kt;
    return b;
}

/* 1 if the token of key k and id i is in the top-k set. */
__device__ __forceinline__ bool in_top_k(uint32_t k, int32_t i, const Bounds &b) {
    return b.kk == ALL || k < b.kk || (k == b.kk && i <= b.idk);
}

/* 1 if logit l (> -inf) survives min-p. */
__device__ __forceinline__ bool min_p_keeps(float l, float maxl, const cuk_sample_row &r) {
    return r.min_p <= 0.0f || dx_min_p_keeps(l, maxl, r.min_p, r.lmin);
}

/* The draw's mass of id i, logit l: 0 for NaN and -inf, outside the top-k set, below min-p or
 * above top-p's key bound; else dx_mass at the row's temperature. */
__device__ __forceinline__ uint64_t row_mass(float l, int32_t i, float maxl, const cuk_sample_row &r, const Bounds &b,
                                             double scale, double xmin) {
    if (!(l > -INFINITY)) return 0;
    const uint32_t k = dx_desc_key(l);
    if (!in_top_k(k, i, b) || !min_p_keeps(l, maxl, r) || (b.kt != ALL && k > b.kt)) return 0;
    return dx_mass(l, maxl, r.temperature, scale, xmin);
}

/* Top-k's tie count: 1 for an id in kk's tie group. */
__device__ __forceinline__ uint64_t tie_count(float l, const Bounds &b) {
    return l > -INFINITY && dx_desc_key(l) == b.kk ? 1 : 0;
}

__device__ __forceinline__ uint64_t warp_sum(uint64_t v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* grid (n_rows), 64 threads: thread t rewrites the logits of the row's penalized ids t, t + 64,
 * ... (distinct ids: no two threads touch one logit) with dx_penalized's (NaN read as -inf). */
__global__ void __launch_bounds__(64) k_samp_penalize(float *__restrict__ x, int64_t ldx, const cuk_sample_row *__restrict__ rows,
                                                      const int32_t *__restrict__ ids, const uint32_t *__restrict__ counts) {
    const int row = blockIdx.x;
    const cuk_sample_row r = rows[row];
    float *xr = x + (int64_t)row * ldx;
    for (uint32_t j = threadIdx.x; j < r.n_pen; j += 64) {
        const int32_t i = ids[r.pen_off + j];
        const float l = xr[i];
        xr[i] = dx_penalized(l != l ? -INFINITY : l, r.repeat_penalty, r.frequency_penalty, r.presence_penalty,
                             counts[r.pen_off + j]);
    }
}

/* grid (segs, n_rows), SEG_THREADS threads: thread t reads ids b + t, b + t + SEG_THREADS, ... of
 * segment blockIdx.x; (value, id) pairs combined by argmax_take over the warp, then the block. */
__global__ void __launch_bounds__(SEG_THREADS)
    k_samp_max(const float *__restrict__ x, int64_t ldx, int32_t n, Scratch sc) {
    const int row = blockIdx.y, s = blockIdx.x;
    int32_t b, e;
    seg_range(n, s, sc.segs, &b, &e);
    const float *xr = x + (int64_t)row * ldx;
    float bv = -INFINITY;
    int32_t bi = -1;
    for (int32_t i = b + (int32_t)threadIdx.x; i < e; i += SEG_THREADS) {
        const float v = xr[i];
        if (v == v) argmax_take(bv, bi, v, i); /* NaN never wins */
    }
    argmax_warp(bv, bi);
    __shared__ float sv[SEG_THREADS / 32];
    __shared__ int32_t si[SEG_THREADS / 32];
    const int w = threadIdx.x >> 5;
    if ((threadIdx.x & 31) == 0) sv[w] = bv, si[w] = bi;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int j = 1; j < SEG_THREADS / 32; j++) argmax_take(bv, bi, sv[j], si[j]);
        sc.seg_max[row * sc.segs + s] = bi < 0 ? -INFINITY : bv;
        sc.seg_arg[row * sc.segs + s] = bi;
    }
}

/* The largest logit of a row, from its segments' (-inf where it has none > -inf). */
__device__ __forceinline__ float row_max(const Scratch &sc, int row) {
    float m = -INFINITY;
    for (int s = 0; s < sc.segs; s++) m = fmaxf(m, sc.seg_max[row * sc.segs + s]);
    return m;
}

/* A radix pass (1, 2, 3: the key's bits 31..21, 20..10, 9..0): whether key k's higher digits
 * are those chosen so far, and its digit in this pass. */
__device__ __forceinline__ bool in_pass(uint32_t k, int pass, uint32_t prefix, uint32_t *d) {
    if (pass == 1) return *d = k >> 21, true;
    if (pass == 2) return *d = (k >> 10) & 2047u, (k >> 21) == prefix;
    return *d = k & 1023u, (k >> 10) == prefix;
}

/* 1 if row r still selects in this phase (W_TOPK: top-k's key; W_DRAW: top-p's key). */
__device__ __forceinline__ bool selecting(const cuk_sample_row &r, int32_t n, const Sel &s, float maxl, int what) {
    if (!(maxl > -INFINITY)) return false;
    return what == W_TOPK ? top_k_on(r, n) && !s.kdone : top_p_on(r) && !s.done;
}

/* grid (segs, n_rows), SEG_THREADS threads; selecting rows only (the others return at once).
 * Thread t adds, for each id b + t + j SEG_THREADS of the segment in this pass, its weight into a
 * shared histogram of its digit (exact 64-bit atomics), flushed into the row's global histogram.
 * W_TOPK: weight 1 for every logit > -inf. W_DRAW (top-p): the temperature-1 mass of the ids of
 * the top-k set that survive min-p; pass 1 also sums every top-k id's temperature-1 mass into z. */
__global__ void __launch_bounds__(SEG_THREADS)
    k_samp_hist(const float *__restrict__ x, int64_t ldx, int32_t n, const cuk_sample_row *__restrict__ rows,
                double scale, double xmin, Scratch sc, int pass, int what) {
    const int row = blockIdx.y, s = blockIdx.x;
    const cuk_sample_row r = rows[row];
    const float maxl = row_max(sc, row);
    if (!selecting(r, n, sc.sel[row], maxl, what)) return;
    __shared__ unsigned long long h[HBINS];
    for (int i = threadIdx.x; i < HBINS; i += SEG_THREADS) h[i] = 0;
    __syncthreads();
    const uint32_t prefix = what == W_TOPK ? sc.sel[row].kprefix : sc.sel[row].prefix;
    const Bounds bd = bounds_of(r, n, sc, row); /* W_DRAW: top-k's set is known; kt is not used */
    int32_t b, e;
    seg_range(n, s, sc.segs, &b, &e);
    const float *xr = x + (int64_t)row * ldx;
    uint64_t z = 0;
    for (int32_t i = b + (int32_t)threadIdx.x; i < e; i += SEG_THREADS) {
        const float l = xr[i];
        if (!(l > -INFINITY)) continue; /* NaN, -inf: not counted, mass 0 */
        const uint32_t k = dx_desc_key(l);
        uint32_t d;
        if (!in_pass(k, pass, prefix, &d)) continue;
        if (what == W_TOPK) {
            atomicAdd(&h[d], 1ull);
            continue;
        }
        if (!in_top_k(k, i, bd)) continue;
        const uint64_t w = dx_mass(l, maxl, 1.0f, scale, xmin);
        z += w;
        if (w && min_p_keeps(l, maxl, r)) atomicAdd(&h[d], (unsigned long long)w);
    }
    if (what == W_DRAW && pass == 1) {
        z = warp_sum(z);
        if ((threadIdx.x & 31) == 0 && z) atomicAdd((unsigned long long *)&sc.sel[row].z, (unsigned long long)z);
    }
    __syncthreads();
    unsigned long long *g = (unsigned long long *)(sc.hist + (size_t)row * HBINS);
    for (int i = threadIdx.x; i < HBINS; i += SEG_THREADS)
        if (h[i]) atomicAdd(&g[i], h[i]);
}

/* grid (n_rows), 1024 threads; selecting rows only. Thread t owns bins 2t and 2t + 1 of the row's
 * histogram; an exclusive scan of their pair sums (exact) finds the bin d with
 * cum(< d) < need <= cum(<= d): d joins the prefix, need becomes need - cum(< d), and after the
 * third pass the prefix is the key (W_TOPK: kk, its remaining need kneed; W_DRAW: kt). need in
 * pass 1: top_k, or dx_top_p_need(top_p, z). No such bin in pass 1 (fewer logits > -inf than
 * top_k; min-p's survivors holding less than need): ALL, every one kept. The histogram is cleared
 * for the next pass. */
__global__ void __launch_bounds__(1024)
    k_samp_cut(int32_t n, const cuk_sample_row *__restrict__ rows, Scratch sc, int pass, int what) {
    const int row = blockIdx.x, t = threadIdx.x, lane = t & 31, w = t >> 5;
    const cuk_sample_row r = rows[row];
    Sel *sl = &sc.sel[row];
    if (!selecting(r, n, *sl, row_max(sc, row), what)) return;
    __shared__ uint64_t s_warp[32];
    __shared__ int s_found;
    uint64_t *g = sc.hist + (size_t)row * HBINS;
    const uint64_t h0 = g[2 * t], h1 = g[2 * t + 1];
    const uint64_t need = what == W_TOPK ? (pass == 1 ? (uint64_t)r.top_k : sl->kneed)
                                         : (pass == 1 ? dx_top_p_need(r.top_p, sl->z) : sl->need);
    uint64_t v = h0 + h1; /* inclusive scan over the warp, then over the warps */
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const uint64_t u = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += u;
    }
    if (lane == 31) s_warp[w] = v;
    if (t == 0) s_found = 0;
    __syncthreads();
    uint64_t before = 0;
    for (int j = 0; j < w; j++) before += s_warp[j];
    const uint64_t excl = before + v - (h0 + h1);
    int d = -1;
    uint64_t rem = 0;
    if (excl < need && need <= excl + h0) d = 2 * t, rem = need - excl;
    else if (excl + h0 < need && need <= excl + h0 + h1) d = 2 * t + 1, rem = need - excl - h0;
    __syncthreads(); /* every thread has read the histogram before it is cleared */
    g[2 * t] = 0;
    g[2 * t + 1] = 0;
    if (d >= 0) { /* one thread: the bins' ranges do not overlap */
        s_found = 1;
        const int bits = pass == 3 ? 10 : 11;
        if (what == W_TOPK) {
            const uint32_t prefix = pass == 1 ? (uint32_t)d : sl->kprefix << bits | (uint32_t)d;
            sl->kprefix = prefix;
            sl->kneed = rem;
            if (pass == 3) sl->kk = prefix, sl->kdone = 1;
        } else {
            const uint32_t prefix = pass == 1 ? (uint32_t)d : sl->prefix << bits | (uint32_t)d;
            sl->prefix = prefix;
            sl->need = rem;
            if (pass == 3) sl->kt = prefix, sl->done = 1;
        }
    }
    __syncthreads();
    if (t == 0 && !s_found) { /* less than need in all */
        if (what == W_TOPK) sl->kk = ALL, sl->kdone = 1;
        else sl->kt = ALL, sl->done = 1;
    }
}

/* 1 if row r takes part in a mass or pick of `what`: W_DRAW every sampled row with a logit
 * > -inf, W_TOPK the rows whose top-k cuts (kk known, not ALL). */
__device__ __forceinline__ bool weighing(const cuk_sample_row &r, int32_t n, const Scratch &sc, int row, float maxl,
                                         int what) {
    if (!sampled(r) || !(maxl > -INFINITY)) return false;
    return what == W_DRAW || (top_k_on(r, n) && sc.sel[row].kk != ALL);
}

/* An id's weight: W_DRAW its mass, W_TOPK 1 in kk's tie group. */
__device__ __forceinline__ uint64_t weight_of(float l, int32_t i, float maxl, const cuk_sample_row &r, const Bounds &b,
                                              double scale, double xmin, int what) {
    return what == W_TOPK ? tie_count(l, b) : row_mass(l, i, maxl, r, b, scale, xmin);
}

/* grid (segs, n_rows), SEG_THREADS threads: thread t sums the weights of ids b + t + j SEG_THREADS
 * of segment blockIdx.x; the block's sum (exact) is the segment's. Rows not weighing write 0. */
__global__ void __launch_bounds__(SEG_THREADS)
    k_samp_mass(const float *__restrict__ x, int64_t ldx, int32_t n, const cuk_sample_row *__restrict__ rows,
                double scale, double xmin, Scratch sc, int what) {
    const int row = blockIdx.y, s = blockIdx.x;
    const cuk_sample_row r = rows[row];
    const float maxl = row_max(sc, row);
    uint64_t acc = 0;
    if (weighing(r, n, sc, row, maxl, what)) {
        int32_t b, e;
        seg_range(n, s, sc.segs, &b, &e);
        const float *xr = x + (int64_t)row * ldx;
        const Bounds bd = bounds_of(r, n, sc, row);
        for (int32_t i = b + (int32_t)threadIdx.x; i < e; i += SEG_THREADS)
            acc += weight_of(xr[i], i, maxl, r, bd, scale, xmin, what);
    }
    acc = warp_sum(acc);
    __shared__ uint64_t sm[SEG_THREADS / 32];
    if ((threadIdx.x & 31) == 0) sm[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        uint64_t t = 0;
        for (int j = 0; j < SEG_THREADS / 32; j++) t += sm[j];
        sc.seg_mass[row * sc.segs + s] = t;
    }
}

/* grid (n_rows), PICK_THREADS threads. W_DRAW: argmax rows: thread 0 combines the segments;
 * sampled rows: r = floor(k total / 2^53), the token into out. W_TOPK (rows whose top-k cuts):
 * r = kneed - 1 over the tie counts, the id into the row's idk. Thread 0 finds the segment whose
 * weight range holds r; warp w sums the weights of its piece of that segment (ids p0 + w L ..
 * p0 + (w + 1) L, lanes 32 apart); thread 0 finds the piece holding the remainder; that piece's
 * warp walks it 32 ids at a time, an inclusive scan of the lanes' weights over the running sum,
 * the first lane past it giving the id. Every sum is of integers: exact, so the id is the first
 * whose running weight from id 0 exceeds r. */
__global__ void __launch_bounds__(PICK_THREADS)
    k_samp_pick(const float *__restrict__ x, int64_t ldx, int32_t n, const cuk_sample_row *__restrict__ rows,
                double scale, double xmin, Scratch sc, int32_t *__restrict__ out, int what) {
    const int row = blockIdx.x, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const cuk_sample_row r = rows[row];
    __shared__ int32_t s_b, s_e;
    __shared__ uint64_t s_rem, s_piece[PICK_THREADS / 32];
    __shared__ int s_w;
    const float maxl = row_max(sc, row);
    if (what == W_DRAW && !sampled(r)) {
        if (threadIdx.x == 0) {
            float bv = -INFINITY;
            int32_t bi = -1;
            for (int s = 0; s < sc.segs; s++)
                argmax_take(bv, bi, sc.seg_max[row * sc.segs + s], sc.seg_arg[row * sc.segs + s]);
            out[row] = bi >= 0 && bv > -INFINITY ? bi : -1;
        }
        return;
    }
    if (what == W_DRAW && !(maxl > -INFINITY)) {
        if (threadIdx.x == 0) out[row] = -1;
        return;
    }
    if (!weighing(r, n, sc, row, maxl, what)) return;
    if (threadIdx.x == 0) {
        uint64_t rem;
        if (what == W_TOPK) {
            rem = sc.sel[row].kneed - 1; /* kneed >= 1 of the tie group */
        } else {
            uint64_t total = 0;
            for (int s = 0; s < sc.segs; s++) total += sc.seg_mass[row * sc.segs + s];
            rem = dx_draw_point(r.k, total);
        }
        int s = 0;
        while (s < sc.segs - 1 && rem >= sc.seg_mass[row * sc.segs + s])
            rem -= sc.seg_mass[row * sc.segs + s++];
        int32_t b, e;
        seg_range(n, s, sc.segs, &b, &e);
        s_b = b;
        s_e = e;
        s_rem = rem;
    }
    __syncthreads();
    const float *xr = x + (int64_t)row * ldx;
    const Bounds bd = bounds_of(r, n, sc, row);
    const int32_t b = s_b, e = s_e, len = (e - b + 31) / 32; /* a warp's piece: ceil((e - b) / 32) ids */
    const int32_t p0 = b + w * len < e ? b + w * len : e, p1 = p0 + len < e ? p0 + len : e;
    uint64_t acc = 0;
    for (int32_t i = p0 + lane; i < p1; i += 32) acc += weight_of(xr[i], i, maxl, r, bd, scale, xmin, what);
    acc = warp_sum(acc);
    if (lane == 0) s_piece[w] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        uint64_t rem = s_rem;
        int j = 0;
        while (j < PICK_THREADS / 32 - 1 && rem >= s_piece[j]) rem -= s_piece[j++];
        s_w = j;
        s_rem = rem;
    }
    __syncthreads();
    if (w != s_w) return;
    const uint64_t rem = s_rem;
    int32_t *dst = what == W_TOPK ? &sc.sel[row].idk : &out[row];
    uint64_t run = 0;
    for (int32_t i0 = p0; i0 < p1; i0 += 32) {
        const int32_t i = i0 + lane;
        uint64_t v = i < p1 ? weight_of(xr[i], i, maxl, r, bd, scale, xmin, what) : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) { /* inclusive scan over the lanes */
            const uint64_t t = __shfl_up_sync(0xffffffffu, v, o);
            if (lane >= o) v += t;
        }
        const unsigned hit = __ballot_sync(0xffffffffu, rem < run + v);
        if (hit) {
            if (lane == 0) *dst = i0 + __ffs((int)hit) - 1;
            return;
        }
        run += __shfl_sync(0xffffffffu, v, 31);
    }
    if (lane == 0) *dst = p1 > p0 ? p1 - 1 : -1; /* not reached: rem < the piece's weight */
}

/* Segments a row for n_rows rows: enough blocks for the SMs when there are few rows (a lone row
 * in 16 segments ran its passes on 16 SMs). Measured (bench_sample, 154880 logits, H100, us a
 * call; 16 / 32 / 64 / 128 segments): 1 row, top-p 0.95: 155 / 101 / 77 / 71, llama.cpp's chain
 * 220 / 150 / 124 / 124, temperature 0.9 38 / 25 / 20 / 20; 16 rows, top-p: 167 / 121 / 131 /
 * 168, the chain 236 / 180 / 203 / 278. The masses and counts are integers, so the segment count
 * changes no token. */
int samp_segs(int32_t n_rows) { return n_rows <= 4 ? 64 : n_rows <= 24 ? 32 : 16; }

} // namespace

extern "C" size_t cuk_sample_scratch_bytes(int32_t n_rows) {
    return n_rows > 0 ? (size_t)n_rows * (SEGS_MAX * (sizeof(uint64_t) + sizeof(float) + sizeof(int32_t)) +
                                          HBINS * sizeof(uint64_t) + sizeof(Sel))
                      : 0;
}

extern "C" g5_status cuk_sample(const cuk_sample_args *a, cuk_stream stream, g5_error *err) {
    if (!a) return BAD("sample: args is NULL");
    if (!a->x || !a->rows || !a->scratch || !a->out) return BAD("sample: x, rows, scratch or out is NULL");
    if (a->n < 1) return BAD("sample: n=%d must be positive", (int)a->n);
    if (a->n_rows < 1 || a->n_rows > 65535) return BAD("sample: n_rows=%d outside 1..65535", (int)a->n_rows);
    if (a->ldx < a->n) return BAD("sample: ldx=%lld < n=%d", (long long)a->ldx, (int)a->n);
    if ((uintptr_t)a->scratch % 16 || (uintptr_t)a->rows % 8) return BAD("sample: scratch or rows misaligned");
    const cudaStream_t st = (cudaStream_t)stream;
    const Scratch sc = scratch_of(a->scratch, a->n_rows, samp_segs(a->n_rows));
    const int k = dx_mass_bits((uint32_t)a->n);
    const double scale = ldexp(1.0, k), xmin = dx_mass_xmin(k);
    const dim3 grid((unsigned)sc.segs, (unsigned)a->n_rows);
    if (a->any_pen) {
        if (!a->pen_ids || !a->pen_counts) return BAD("sample: penalties without pen_ids or pen_counts");
        k_samp_penalize<<<(unsigned)a->n_rows, 64, 0, st>>>(a->x, a->ldx, a->rows, a->pen_ids, a->pen_counts);
    }
    k_samp_max<<<grid, SEG_THREADS, 0, st>>>(a->x, a->ldx, a->n, sc);
    if (a->any_top_k || a->any_top_p)
        CUK_CHECK(cudaMemsetAsync(sc.hist, 0, (size_t)a->n_rows * (HBINS * sizeof(uint64_t) + sizeof(Sel)), st));
    for (int what = W_TOPK; what >= W_DRAW; what--) { /* top-k's set, then top-p's key within it */
        if (what == W_TOPK ? !a->any_top_k : !a->any_top_p) continue;
        for (int pass = 1; pass <= 3; pass++) {
            k_samp_hist<<<grid, SEG_THREADS, 0, st>>>(a->x, a->ldx, a->n, a->rows, scale, xmin, sc, pass, what);
            k_samp_cut<<<(unsigned)a->n_rows, 1024, 0, st>>>(a->n, a->rows, sc, pass, what);
        }
        if (what == W_TOPK) { /* the last of kk's ties that the set takes, by id */
            k_samp_mass<<<grid, SEG_THREADS, 0, st>>>(a->x, a->ldx, a->n, a->rows, scale, xmin, sc, W_TOPK);
            k_samp_pick<<<(unsigned)a->n_rows, PICK_THREADS, 0, st>>>(a->x, a->ldx, a->n, a->rows, scale, xmin, sc,
                                                                        a->out, W_TOPK);
        }
    }
    k_samp_mass<<<grid, SEG_THREADS, 0, st>>>(a->x, a->ldx, a->n, a->rows, scale, xmin, sc, W_DRAW);
    k_samp_pick<<<(unsigned)a->n_rows, PICK_THREADS, 0, st>>>(a->x, a->ldx, a->n, a->rows, scale, xmin, sc, a->out,
                                                                W_DRAW);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}
