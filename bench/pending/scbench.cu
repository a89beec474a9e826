/* Fast mode's decode indexer scores with TF32 tensor cores (mma.sync m16n8k8) against the tree's
 * float32 k_scores_tile, at GLM-5's shape (32 heads x 128), one token, 1536 to 131072 keys rotating
 * over 256 MB of key copies; through cuda/indexer.cu, which this file includes.
 * Prefill in fast mode already takes TF32 products for these scores (gl_lin_idx_scores: cuBLAS
 * TF32, float32 sums); a decode step computes its scores in float32 FMA chains, which leaves
 * k_scores_tile issue-bound (32 x 128 FMAs a key: 22.8 us a layer at 32768 keys in the marked
 * profile, 0.74 TB/s of key bytes). Reports us a launch against the keys' byte time, the scores'
 * largest relative difference from k_scores_tile's (scaled by the row's largest |score|), and how
 * many of the top 2048 of each agree. Session 53's first run: the right values, but about 13 us of
 * fixed cost (14.1 us at 1536 keys against k_scores_tile's 7.6); V 1-4 of the kernel are timing
 * ablations to find it (bench/NOTES.md, session 53). Usage: scbench [reps] */
#include "cuda/indexer.cu"

#include "bench/pending/pending.cuh"

#include <algorithm>
#include <math.h>

constexpr int SM_WARPS = 4;            /* per block */
constexpr int SM_KG = 8;               /* keys a warp takes at a time: one mma n-tile */
constexpr int SM_ROW = 136;            /* a staged key row's words: 128 + 8, so that an LDS.64 half-warp hits 32 banks */
constexpr size_t SM_SMEM = (size_t)SM_WARPS * 2 * SM_KG * SM_ROW * 4;
constexpr size_t SM_QSMEM = 32 * 132 * 4; /* V 1's query */

template <bool VOL> __device__ __forceinline__ void mma_tf32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <> __device__ __forceinline__ void mma_tf32<false>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <> __device__ __forceinline__ void mma_tf32<true>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* grid (nbx, n_tok), SM_WARPS warps: fast mode's scores, sc[t][s] = sum over heads of
 * w[t][h] * relu(q[t][h] . k[s]) with the dot products as TF32 tensor-core products (float32
 * sums). A warp takes groups of SM_KG keys (warp-strided over the grid), staged by cp.async into
 * its double buffer as k_scores_tile does. The mma's A is the query (heads as rows: two m-tiles of
 * 16 for 32 heads), B the group's keys (n = 8 keys); its k index c of each 8-dim step s maps to
 * dim 8s + 2c and c + 4 to 8s + 2c + 1, so a lane's two B values are adjacent words (one LDS.64).
 * Lane (g = lane / 4, c = lane % 4) ends with heads g, g + 8, g + 16, g + 24 of keys 2c and
 * 2c + 1; it weighs and sums its four heads, then xor shuffles over g add the 8 lanes of each c,
 * and lanes 0-3 store. A key's bits depend only on its row: any grid, any token count, the same.
 * Needs n_head <= 32, dim % 8 == 0, dim <= 128, 16-byte aligned q and k. */
/* V (timing ablations of the fixed cost; 0, 1 and 5 give the scores): 0 the form above; 1 the
 * query staged through shared memory by the block (coalesced), the fragments read from there;
 * 2 no query loads (zero fragments); 3 no mma (the key values summed instead); 4 as 0 with the
 * mma asm not volatile; 5 as 0 with each fragment load unconditional (a valid address, then a
 * select). The guess to test: V0's 64 loads a lane sit in branches, and the join after each
 * waits for its load (64 L2 round trips, about 13 us), which V1 and V5 avoid. */
template <int V>
__global__ void __launch_bounds__(SM_WARPS * 32, 3)
    k_scores_mma(const float *__restrict__ q, const float *__restrict__ w, const float *k, int32_t n_head, int32_t dim,
                 int64_t pos0_h, const int32_t *__restrict__ dpos, const cuk_seq_row *__restrict__ rows, int64_t bound,
                 float *__restrict__ sc, int64_t ld_sc) {
    extern __shared__ __align__(16) float sm_buf[];
    const int64_t pos0 = rows ? 0 : first_pos(pos0_h, dpos, bound, (int)gridDim.y);
    if (pos0 < 0) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const int t = blockIdx.y;
    int64_t cnt = pos0 + t + 1;
    if (rows) {
        cnt = row_cnt(rows, t, bound);
        if (cnt < 0 || !rows[t].idxk) return;
        k = rows[t].idxk;
    }
    const int64_t ngr = (cnt + SM_KG - 1) / SM_KG;
    const int64_t nw = (int64_t)gridDim.x * SM_WARPS;
    int64_t gi = (int64_t)blockIdx.x * SM_WARPS + warp;
    if (V != 1 && gi >= ngr) return; /* warp-uniform; no block barrier below (V 1: after its one) */
    const int d4n = dim >> 2, d8n = dim >> 3;
    float *wb = sm_buf + (int64_t)warp * 2 * SM_KG * SM_ROW; /* [2][SM_KG][SM_ROW] */
    const uint32_t wb_s = (uint32_t)__cvta_generic_to_shared(wb);
    auto stage = [&](int64_t gg, int b) {
        if (gg < ngr && lane < d4n)
#pragma unroll
            for (int i = 0; i < SM_KG; i++) {
                const int64_t s = gg * SM_KG + i < cnt ? gg * SM_KG + i : cnt - 1;
                cuk::cp16(wb_s + (uint32_t)(((b * SM_KG + i) * SM_ROW + lane * 4) * 4), k + s * dim + lane * 4, true);
            }
        cuk::cp_commit();
    };
    stage(gi, 0);
    /* A fragments of every 8-dim step: a0 = q[g][8s + 2c], a1 = q[g + 8][..], a2 = q[g][8s + 2c + 1],
     * a3 = q[g + 8][8s + 2c + 1]; m-tile m holds heads 16m .. 16m + 15 (zeros past n_head) */
    uint32_t qa[2][16][4];
    const float *qt = q + (int64_t)t * n_head * dim;
    const float *qsrc = qt;
    int64_t qld = dim;
    if (V == 1) { /* the block's query into shared memory behind the key buffers: [32][128 + 4] */
        float *qs = sm_buf + (int64_t)SM_WARPS * 2 * SM_KG * SM_ROW;
#pragma unroll
        for (int j = 0; j < 32 * 32 / (SM_WARPS * 32); j++) { /* all loads in flight, then a select */
            const int i = threadIdx.x + j * SM_WARPS * 32, h = i >> 5, d4 = i & 31;
            const bool ok = h < n_head && d4 < d4n;
            float4 v = *(const float4 *)(qt + (ok ? (int64_t)h * dim + 4 * d4 : 0));
            if (!ok) v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            *(float4 *)(qs + h * 132 + 4 * d4) = v;
        }
        __syncthreads();
        qsrc = qs;
        qld = 132;
        if (gi >= ngr) return;
    }
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int s = 0; s < 16; s++) {
            const int h0 = 16 * m + g, h1 = h0 + 8, d = 8 * s + 2 * c;
            float2 v0 = make_float2(0.0f, 0.0f), v1 = v0;
            if (V == 1) {
                v0 = *(const float2 *)(qsrc + h0 * qld + d);
                v1 = *(const float2 *)(qsrc + h1 * qld + d);
            } else if (V == 5) { /* unconditional loads from a valid address, then a select */
                const bool ok0 = s < d8n && h0 < n_head, ok1 = s < d8n && h1 < n_head;
                v0 = *(const float2 *)(qt + (ok0 ? (int64_t)h0 * dim + d : 0));
                v1 = *(const float2 *)(qt + (ok1 ? (int64_t)h1 * dim + d : 0));
                if (!ok0) v0 = make_float2(0.0f, 0.0f);
                if (!ok1) v1 = make_float2(0.0f, 0.0f);
            } else if (V != 2) {
                if (s < d8n && h0 < n_head) v0 = *(const float2 *)(qt + (int64_t)h0 * dim + d);
                if (s < d8n && h1 < n_head) v1 = *(const float2 *)(qt + (int64_t)h1 * dim + d);
            }
            qa[m][s][0] = __float_as_uint(v0.x);
            qa[m][s][1] = __float_as_uint(v1.x);
            qa[m][s][2] = __float_as_uint(v0.y);
            qa[m][s][3] = __float_as_uint(v1.y);
        }
    float wh[4];
#pragma unroll
    for (int j = 0; j < 4; j++) wh[j] = g + 8 * j < n_head ? w[(int64_t)t * n_head + g + 8 * j] : 0.0f;
    for (int b = 0; gi < ngr; gi += nw, b ^= 1) {
        stage(gi + nw, b ^ 1);
        cuk::cp_wait<1>();
        __syncwarp();
        const float *kb = wb + (b * SM_KG + g) * SM_ROW + 2 * c; /* key g of the group */
        float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
        for (int s = 0; s < 16; s++) {
            if (s < d8n) {
                const float2 kv = *(const float2 *)(kb + 8 * s);
                if (V == 3) {
                    acc[0][s & 3] += kv.x;
                    acc[1][s & 3] += kv.y;
                } else {
                    mma_tf32<V != 4>(acc[0], qa[0][s], __float_as_uint(kv.x), __float_as_uint(kv.y));
                    mma_tf32<V != 4>(acc[1], qa[1][s], __float_as_uint(kv.x), __float_as_uint(kv.y));
                }
            }
        }
        __syncwarp(); /* the buffer is staged again two groups on */
        /* acc[m][0..1]: head 16m + g, keys 2c, 2c + 1; acc[m][2..3]: head 16m + g + 8 */
        float r0 = 0.0f, r1 = 0.0f;
#pragma unroll
        for (int m = 0; m < 2; m++) {
            r0 = fmaf(wh[2 * m], fmaxf(acc[m][0], 0.0f), r0);
            r1 = fmaf(wh[2 * m], fmaxf(acc[m][1], 0.0f), r1);
            r0 = fmaf(wh[2 * m + 1], fmaxf(acc[m][2], 0.0f), r0);
            r1 = fmaf(wh[2 * m + 1], fmaxf(acc[m][3], 0.0f), r1);
        }
#pragma unroll
        for (int o = 4; o < 32; o <<= 1) {
            r0 += __shfl_xor_sync(0xffffffffu, r0, o);
            r1 += __shfl_xor_sync(0xffffffffu, r1, o);
        }
        const int64_t s0 = gi * SM_KG + 2 * c;
        if (g == 0) {
            float *o = sc + (int64_t)t * ld_sc;
            if (s0 < cnt) o[s0] = r0;
            if (s0 + 1 < cnt) o[s0 + 1] = r1;
        }
    }
    cuk::cp_wait<0>();
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 200;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const int sms = prop.multiProcessorCount;
    printf("scbench: %s, %d SMs\n", prop.name, sms);
    const int IH = 32, ID = 128, K = 2048;
    const int64_t cnts[] = {1536, 4096, 8192, 16384, 16400, 32768, 65536, 131072};
    const int64_t row_b = ID * 4, nrows = (256ll << 20) / row_b;
    float *dk = dev_rand((size_t)nrows * ID, -1, 1), *dq = dev_rand(IH * ID, -1, 1), *dw = dev_rand(IH, -1, 1);
    float *dsa, *dsb;
    int32_t *dpos;
    CK(cudaMalloc(&dsa, (size_t)bucket(131072) * 4));
    CK(cudaMalloc(&dsb, (size_t)bucket(131072) * 4));
    CK(cudaMalloc(&dpos, 4));
    typedef void (*sc_fn)(const float *, const float *, const float *, int32_t, int32_t, int64_t, const int32_t *,
                          const cuk_seq_row *, int64_t, float *, int64_t);
    const sc_fn fv[6] = {k_scores_mma<0>, k_scores_mma<1>, k_scores_mma<2>, k_scores_mma<3>, k_scores_mma<4>, k_scores_mma<5>};
    for (int v = 0; v < 6; v++)
        CK(cudaFuncSetAttribute((const void *)fv[v], cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(SM_SMEM + SM_QSMEM)));
    int fails = 0, checks = 0;
    printf("one token, %d heads x %d (w in [-1, 1]), us a launch (mean of %d)\n\n", IH, ID, reps);
    printf("| keys | bucket | k_scores_tile | mma V0 | V1 (query via shared) | V2 (no query loads) | V3 (no mma) | V4 (not volatile) | V5 (V0, loads not branched) | "
           "key bytes at 3.0 TB/s | V0: max |diff| / max |score| | V0: top-%d agree | V1 = V0 |\n", K);
    printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    std::vector<float> a0, b0, b1;
    for (int64_t cnt : cnts) {
        const int64_t P = bucket(cnt), ncopy = nrows / P;
        const int32_t pos = (int32_t)(cnt - 1);
        CK(cudaMemcpy(dpos, &pos, 4, cudaMemcpyHostToDevice));
        auto ref = [&](int i) {
            cuk_idx_scores_args a;
            memset(&a, 0, sizeof a);
            a.q = dq, a.w = dw, a.k = dk + (int64_t)(i % ncopy) * P * ID, a.n_tok = 1, a.n_head = IH, a.dim = ID;
            a.pos0_dev = dpos, a.pos_bound = P, a.sc = dsa, a.ld_sc = P;
            GXX(cuk_idx_scores_dev(&a, NULL, &err_));
        };
        const int64_t groups = (P + SM_KG - 1) / SM_KG, want = (groups + SM_WARPS - 1) / SM_WARPS;
        const int64_t cap = 3ll * sms;
        const unsigned nb = (unsigned)(want < cap ? want : cap);
        auto mma = [&](int v, int i) {
            fv[v]<<<dim3(nb, 1), SM_WARPS * 32, SM_SMEM + SM_QSMEM>>>(dq, dw, dk + (int64_t)(i % ncopy) * P * ID, IH, ID, 0,
                                                                    dpos, (const cuk_seq_row *)NULL, P, dsb, P);
        };
        float tm[6];
        for (int v = 0; v < 6; v++) tm[v] = time_us(reps, [&](int i) { mma(v, i); });
        const float t_ref = time_us(reps, ref);
        a0.assign((size_t)cnt, 0.0f), b0.assign((size_t)cnt, 0.0f), b1.assign((size_t)cnt, 0.0f);
        ref(0);
        mma(0, 0);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(a0.data(), dsa, cnt * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(b0.data(), dsb, cnt * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemset(dsb, 0xFF, cnt * 4));
        mma(1, 0);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(b1.data(), dsb, cnt * 4, cudaMemcpyDeviceToHost));
        const bool same = memcmp(b0.data(), b1.data(), (size_t)cnt * 4) == 0;
        double mx = 0, md = 0;
        for (int64_t i = 0; i < cnt; i++) {
            mx = std::max(mx, (double)fabsf(a0[(size_t)i]));
            md = std::max(md, (double)fabsf(a0[(size_t)i] - b0[(size_t)i]));
        }
        /* top-K overlap */
        std::vector<int32_t> ia((size_t)cnt), ib((size_t)cnt);
        for (int64_t i = 0; i < cnt; i++) ia[(size_t)i] = ib[(size_t)i] = (int32_t)i;
        const int64_t kk = std::min<int64_t>(K, cnt);
        std::partial_sort(ia.begin(), ia.begin() + kk, ia.end(), [&](int32_t x, int32_t y) { return a0[(size_t)x] > a0[(size_t)y]; });
        std::partial_sort(ib.begin(), ib.begin() + kk, ib.end(), [&](int32_t x, int32_t y) { return b0[(size_t)x] > b0[(size_t)y]; });
        std::sort(ia.begin(), ia.begin() + kk);
        std::sort(ib.begin(), ib.begin() + kk);
        std::vector<int32_t> both;
        std::set_intersection(ia.begin(), ia.begin() + kk, ib.begin(), ib.begin() + kk, std::back_inserter(both));
        const double rel = mx > 0 ? md / mx : md;
        checks++;
        if (!(rel < 1e-2) || (double)both.size() < 0.95 * (double)kk || !same) {
            printf("FAIL keys %lld: rel diff %.3g, top-k agree %zu of %lld, V1 %s V0\n", (long long)cnt, rel, both.size(),
                   (long long)kk, same ? "=" : "!=");
            fails++;
        }
        printf("| %lld | %lld | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2e | %zu | %s |\n",
               (long long)cnt, (long long)P, t_ref, tm[0], tm[1], tm[2], tm[3], tm[4], tm[5], (double)cnt * row_b / 3.0e6,
               rel, both.size(), same ? "yes" : "NO");
    }
    printf("scbench: %d passed, %d failed\n", checks - fails, fails);
    return fails ? 1 : 0;
}
