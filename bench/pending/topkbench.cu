/* k_topk_one (the decode top-k of every layer, one CTA of 1024 threads a token) against a form
 * with fewer sweeps over the keys, at one token, 2048 of 1536-32768 keys; through
 * cuda/indexer.cu, which this file includes.
 * Session 53 measured what does not cost (bench/RESULTS.md): the same-bin shared atomics (a
 * per-lane histogram lost 2 us at 32768 keys) and the load's latency (eight float4 loads in flight
 * gained at most 1 us). What is left is issue: the tree's kernel sweeps its keys seven times (the
 * load, four histogram passes, the count and the ordered write), about ten instructions a key a
 * sweep, on one SM. k_topk_cmp sweeps four times:
 *  1. the load, with each warp's smallest and largest key (the bits all keys share are the
 *     threshold's: the random oracle's scores share nine);
 *  2. a histogram of the next (up to) 11 bits below them, and its pick (pick_wide: 2048 bins);
 *  3. the compaction: each warp counts its chunk's keys in bins above the picked one and lists
 *     the positions of those in it (the candidates: about 1% of the keys at 32768) in shared
 *     memory; the remaining radix passes run over the candidates only, whose keys above / equal
 *     to the final threshold are then added to their chunks' counts;
 *  4. the ordered write, as k_topk_one's.
 * Over CP_CAP candidates (rows of few distinct values) it falls back to k_topk_one's full passes
 * and count. Every form's selection is compared with k_topk's on the scores and on five
 * adversarial rows (all equal, four values, mostly zero, normal with both signs, a ramp); times on
 * the scores and on the normal row. Exits 1 on any difference. Usage: topkbench [reps] */
#include "cuda/indexer.cu"

#include "bench/pending/pending.cuh"

#include <math.h>

constexpr int CP_BITS = 11, CP_BINS = 1 << CP_BITS;
constexpr int CP_CAP = 4096; /* candidate positions kept (16 KB) */

/* The largest bin b of h's CP_BINS with S(b) >= rem (S(b): the count in bins b and above), and
 * S(b + 1), by one warp: lane l sums its 64 bins (read rotated by l: 32 banks), a suffix scan
 * over the lanes finds the lane whose 64 bins hold b, then each lane takes two of those. Every
 * lane returns the same. */
__device__ __forceinline__ void pick_wide(const uint32_t *h, int rem, int lane, int *b_out, uint32_t *above_out) {
    uint32_t own = 0;
    for (int i = 0; i < 64; i++) own += h[64 * lane + ((i + lane) & 63)];
    uint32_t suf = own;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const uint32_t x = __shfl_down_sync(0xffffffffu, suf, o);
        if (lane + o < 32) suf += x;
    }
    int L = suf >= (uint32_t)rem ? lane : -1;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) L = max(L, __shfl_xor_sync(0xffffffffu, L, o));
    if (L < 0) L = 0;
    const uint32_t beyond = __shfl_sync(0xffffffffu, suf - own, L); /* S(64 (L + 1)) */
    const uint32_t v0 = h[64 * L + 2 * lane], v1 = h[64 * L + 2 * lane + 1];
    uint32_t sp = v0 + v1; /* pairs lane .. 31 */
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const uint32_t x = __shfl_down_sync(0xffffffffu, sp, o);
        if (lane + o < 32) sp += x;
    }
    const uint32_t S0 = beyond + sp, S1 = S0 - v0; /* S(64 L + 2 lane), S(64 L + 2 lane + 1) */
    int mine = -1;
    uint32_t ab = 0;
    if (S0 >= (uint32_t)rem) mine = 64 * L + 2 * lane, ab = S1;
    if (S1 >= (uint32_t)rem) mine = 64 * L + 2 * lane + 1, ab = S1 - v1;
    int b = mine;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) b = max(b, __shfl_xor_sync(0xffffffffu, b, o));
    if (b < 0) b = 0;
    *above_out = __shfl_sync(0xffffffffu, ab, (b - 64 * L) >> 1);
    *b_out = b;
}

/* grid (n_tok), TO_THREADS threads; dynamic shared: the keys ([bound] rounded to 4 words), then
 * CP_CAP candidate positions. The same selection as k_topk_one (above). */
__global__ void __launch_bounds__(TO_THREADS) k_topk_cmp(const float *__restrict__ sc, int64_t ld_sc, int64_t pos0_h,
                                                         const int32_t *__restrict__ dpos,
                                                         const cuk_seq_row *__restrict__ rows, int64_t bound, int32_t K,
                                                         int32_t *__restrict__ sel, int64_t ld_sel,
                                                         int32_t *__restrict__ n_sel) {
    extern __shared__ __align__(16) uint32_t to_keys[];
    __shared__ uint32_t hist[CP_BINS];
    __shared__ uint32_t s_prefix;
    __shared__ int s_remaining, s_ncand;
    __shared__ uint32_t wsum[TO_WARPS], wmin[TO_WARPS], wmax[TO_WARPS], wgt[TO_WARPS], weq[TO_WARPS];
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
    int32_t *cand = (int32_t *)(to_keys + ((bound + 3) & ~(int64_t)3)); /* [CP_CAP] */
    const float *row = sc + (int64_t)t * ld_sc;
    /* every sweep takes warp w's contiguous chunk (lane j: key j of each 32), as the write does */
    const int chunk = (cnt + TO_WARPS * 32 - 1) / (TO_WARPS * 32) * 32;
    const int c0 = min(cnt, warp * chunk), c1 = min(cnt, c0 + chunk);
    uint32_t kmin = 0xFFFFFFFFu, kmax = 0u;
    for (int s = c0 + lane; s < c1; s += 32) {
        const uint32_t key = key_of(row[s]);
        to_keys[s] = key;
        kmin = min(kmin, key);
        kmax = max(kmax, key);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        kmin = min(kmin, __shfl_xor_sync(0xffffffffu, kmin, o));
        kmax = max(kmax, __shfl_xor_sync(0xffffffffu, kmax, o));
    }
    if (lane == 0) wmin[warp] = kmin, wmax[warp] = kmax, wgt[warp] = 0, weq[warp] = 0;
    for (int i = threadIdx.x; i < CP_BINS; i += TO_THREADS) hist[i] = 0;
    if (threadIdx.x == 0) s_ncand = 0;
    __syncthreads();
    kmin = wmin[lane], kmax = wmax[lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        kmin = min(kmin, __shfl_xor_sync(0xffffffffu, kmin, o));
        kmax = max(kmax, __shfl_xor_sync(0xffffffffu, kmax, o));
    }
    const uint32_t d = kmin ^ kmax;
    int bits = d ? 32 - __clz((int)d) : 0; /* the low bits not yet decided; those above are kmax's */
    uint32_t prefix = bits == 32 ? 0u : kmax & (0xFFFFFFFFu << bits);
    int rem = K;
    bool counted = false; /* wgt / weq hold every chunk's counts against the final threshold */
    if (bits > 0) { /* 2: the histogram of the next w1 bits (every key shares the prefix) */
        const int w1 = min(CP_BITS, bits), shift1 = bits - w1;
        const uint32_t m1 = (1u << w1) - 1u;
        for (int s = c0 + lane; s < c1; s += 32) atomicAdd(&hist[(to_keys[s] >> shift1) & m1], 1u);
        __syncthreads();
        if (warp == 0) {
            int b;
            uint32_t above;
            pick_wide(hist, K, lane, &b, &above);
            if (lane == 0) {
                s_prefix = prefix | ((uint32_t)b << shift1);
                s_remaining = K - (int)above;
            }
        }
        __syncthreads();
        prefix = s_prefix;
        rem = s_remaining;
        bits = shift1;
        if (bits > 0) { /* 3: the compaction, and each chunk's keys in the bins above */
            const uint32_t B = (prefix >> shift1) & m1;
            uint32_t n_above = 0;
            const unsigned lt = (1u << lane) - 1u;
            for (int base = c0; base < c1; base += 32) { /* warp-uniform trip count */
                const int s = base + lane;
                const uint32_t bin = s < c1 ? (to_keys[s] >> shift1) & m1 : 0u;
                n_above += __popc(__ballot_sync(0xffffffffu, s < c1 && bin > B));
                const unsigned cb = __ballot_sync(0xffffffffu, s < c1 && bin == B);
                if (cb) {
                    int at = 0;
                    if (lane == 0) at = atomicAdd(&s_ncand, __popc(cb));
                    at = __shfl_sync(0xffffffffu, at, 0);
                    const int i = at + __popc(cb & lt);
                    if (((cb >> lane) & 1u) && i < CP_CAP) cand[i] = s;
                }
            }
            if (lane == 0) wgt[warp] = n_above;
            __syncthreads();
            const int n = s_ncand;
            /* the remaining 8-bit passes: over the candidates, or over every key when they did
             * not all fit (rows of few distinct values) */
            const int32_t *idx = n <= CP_CAP ? cand : NULL;
            const int m = idx ? n : cnt;
            while (bits > 0) {
                const int w = min(8, bits), shift = bits - w;
                for (int i = threadIdx.x; i < 256; i += TO_THREADS) hist[i] = 0;
                __syncthreads();
                const uint32_t hi = 0xFFFFFFFFu << (shift + w), ph = prefix & hi;
                for (int i = threadIdx.x; i < m; i += TO_THREADS) {
                    const uint32_t key = to_keys[idx ? idx[i] : i];
                    if ((key & hi) == ph) atomicAdd(&hist[(key >> shift) & 0xFFu], 1u);
                }
                __syncthreads();
                radix_pick(hist, prefix, shift, &s_prefix, &s_remaining);
                __syncthreads();
                prefix = s_prefix;
                rem = s_remaining;
                bits -= w;
            }
            if (idx) { /* the candidates above / equal to the threshold join their chunks' counts */
                for (int i = threadIdx.x; i < n; i += TO_THREADS) {
                    const int s = cand[i];
                    const uint32_t key = to_keys[s];
                    if (key > prefix) atomicAdd(&wgt[s / chunk], 1u);
                    else if (key == prefix) atomicAdd(&weq[s / chunk], 1u);
                }
                counted = true;
            }
        }
    }
    const uint32_t thr = prefix;
    const int need_eq = rem;
    if (!counted) { /* block-uniform */
        uint32_t gt = 0, eq = 0;
        for (int s = c0 + lane; s < c1; s += 32) {
            const uint32_t key = to_keys[s];
            gt += key > thr;
            eq += key == thr;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            gt += __shfl_xor_sync(0xffffffffu, gt, o);
            eq += __shfl_xor_sync(0xffffffffu, eq, o);
        }
        if (lane == 0) wgt[warp] = gt, weq[warp] = eq;
    }
    __syncthreads();
    if (warp == 0) { /* exclusive scan over the warps */
        const uint32_t x = wgt[lane] << 16 | weq[lane];
        wsum[lane] = warp_incl_scan(x, lane) - x;
    }
    __syncthreads();
    const uint32_t before = wsum[warp];
    int eq_seen = (int)(before & 0xFFFFu);
    int taken = (int)(before >> 16) + min(eq_seen, need_eq);
    const unsigned lt = (1u << lane) - 1u;
    for (int base = c0; base < c1; base += 32) {
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

typedef void (*topk_fn)(const float *, int64_t, int64_t, const int32_t *, const cuk_seq_row *, int64_t, int32_t,
                        int32_t *, int64_t, int32_t *);

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 200;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("topkbench: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    const int IH = 32, ID = 128, K = 2048;
    const int64_t cnts[] = {1024 + 512, 4096, 8192, 16384, 16400, 32768};
    const int64_t maxP = 32768;
    float *dk = dev_rand((size_t)maxP * ID, -1, 1), *dq = dev_rand(IH * ID, -1, 1), *dw = dev_rand(IH, 0, 1);
    float *dsc, *dadv;
    int32_t *dpos, *dsel, *dn;
    CK(cudaMalloc(&dsc, maxP * 4));
    CK(cudaMalloc(&dadv, maxP * 4 * 6));
    CK(cudaMalloc(&dpos, 4));
    CK(cudaMalloc(&dsel, K * 4));
    CK(cudaMalloc(&dn, 4));
    const char *names[] = {"k_topk_one", "k_topk_cmp"};
    const topk_fn fns[] = {k_topk_one, k_topk_cmp};
    const int NF = 2;
    for (int f = 0; f < NF; f++)
        CK(cudaFuncSetAttribute((const void *)fns[f], cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)(maxP * 4 + CP_CAP * 4)));
    int fails = 0, checks = 0;
    std::vector<int32_t> r0(K), r1(K);
    printf("one token, top-k %d, us per launch (mean of %d); scores: the indexer's of random keys; normal: N(0, 1)\n\n", K, reps);
    printf("| keys | row | k_topk_one | k_topk_cmp |\n| --- | --- | --- | --- |\n");
    for (int64_t cnt : cnts) {
        const int64_t P = cnt <= 16384 ? cnt : (cnt + 8191) / 8192 * 8192;
        const int32_t pos = (int32_t)(cnt - 1);
        CK(cudaMemcpy(dpos, &pos, 4, cudaMemcpyHostToDevice));
        cuk_idx_scores_args a;
        memset(&a, 0, sizeof a);
        a.q = dq, a.w = dw, a.k = dk, a.n_tok = 1, a.n_head = IH, a.dim = ID, a.pos0_dev = dpos, a.pos_bound = P;
        a.sc = dsc, a.ld_sc = P;
        GXX(cuk_idx_scores_dev(&a, NULL, &err_));
        for (int kind = 1; kind <= 5; kind++) { /* all equal, four values, mostly zero, normal, ramp */
            std::vector<float> adv((size_t)P);
            for (int64_t i = 0; i < P; i++) {
                float &x = adv[(size_t)i];
                if (kind == 1) x = 1.0f;
                else if (kind == 2) x = (float)(int)unif(0, 4);
                else if (kind == 3) x = unif(0, 1) < 0.9f ? 0.0f : unif(0, 1);
                else if (kind == 4) {
                    const float u1 = unif(1e-7f, 1), u2 = unif(0, 1);
                    x = sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
                } else x = (float)(i % 5000) * 0.25f - 100.0f;
            }
            CK(cudaMemcpy(dadv + (kind - 1) * maxP, adv.data(), P * 4, cudaMemcpyHostToDevice));
        }
        for (int kind = 0; kind <= 5; kind++) {
            const float *src = kind ? dadv + (kind - 1) * maxP : dsc;
            k_topk<<<1, TK_THREADS>>>(src, P, 0, dpos, (const cuk_seq_row *)NULL, P, K, dsel, K, dn);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(r0.data(), dsel, K * 4, cudaMemcpyDeviceToHost));
            float tm[2] = {0, 0};
            for (int f = 0; f < NF; f++) {
                const size_t smem = (size_t)((P + 3) & ~3) * 4 + CP_CAP * 4;
                CK(cudaMemset(dsel, 0xFF, K * 4));
                fns[f]<<<1, TO_THREADS, smem>>>(src, P, 0, dpos, (const cuk_seq_row *)NULL, P, K, dsel, K, dn);
                CK(cudaDeviceSynchronize());
                CK(cudaMemcpy(r1.data(), dsel, K * 4, cudaMemcpyDeviceToHost));
                checks++;
                if (memcmp(r0.data(), r1.data(), K * 4)) {
                    printf("FAIL keys %lld row %d: %s differs from k_topk\n", (long long)cnt, kind, names[f]);
                    fails++;
                }
                if (kind == 0 || kind == 4)
                    tm[f] = time_us(reps, [&](int) {
                        fns[f]<<<1, TO_THREADS, smem>>>(src, P, 0, dpos, (const cuk_seq_row *)NULL, P, K, dsel, K, dn);
                    });
            }
            if (kind == 0 || kind == 4)
                printf("| %lld | %s | %.2f | %.2f |\n", (long long)cnt, kind ? "normal" : "scores", tm[0], tm[1]);
        }
    }
    printf("topkbench: %d passed, %d failed\n", checks - fails, fails);
    return fails ? 1 : 0;
}
