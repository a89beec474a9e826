/* The indexer's decode score launch, the staged kernel (k_scores_tile, through the launchers of
 * cuda/indexer.cu, which this file includes) against the kernels it replaced: the broadcast-load
 * kernel (k_scores_lane, copied below as ref_scores_lane from 68c2e24) up to 16384 keys and the
 * thread per key (k_scores_split) above, as the old launcher chose. Needs no build on the device
 * (compiled here: bench/NOTES.md "Session 33" has the line). GLM-5's indexer, 32 heads x 128:
 *  - bits: cuk_idx_scores (host position, 1-4 tokens), cuk_idx_scores_dev (position in device
 *    memory, the launch shaped for the graph's bucket), cuk_idx_scores_multi (8 rows of their
 *    own caches and positions), and 16 heads x 64 (lanes without a head, pieces without a lane),
 *    each against the old kernels on the same inputs;
 *  - time: one token, _dev at the graph's bucket, 1k-128k keys rotating over 256 MB of key copies
 *    (so that the L2 does not hold them), us per launch.
 * Exits 1 on any difference. Usage: idxbench [reps] */
#include "cuda/indexer.cu"

#include "bench/pending/pending.cuh"


namespace {
constexpr int RL_WARPS = 4;   /* per block */
constexpr int RL_KG = 8;      /* keys per warp pass: independent FMA chains per lane */

/* grid (nbx, n_tok), RL_WARPS warps: the same scores as k_scores_split, bit for bit, with the
 * work spread for short contexts too (a thread per key leaves most SMs idle below ~16k keys).
 * Lane h holds head h's query row q[t][h] in registers (lanes >= n_head hold zeros) and w[t][h].
 * Warps take groups of RL_KG consecutive keys (warp-strided over the grid's x warps): each lane
 * runs RL_KG fmaf chains (key pieces read as warp-wide broadcasts) in k_scores_split's order
 * (d ascending), then the relu'd, weighted head terms go through shared memory and lane i < RL_KG
 * adds key i's 32 terms in head order (a skipped or absent head adds +0, which leaves the sum's
 * bits unchanged: the sum starts at +0 and never becomes -0). */
__global__ void __launch_bounds__(RL_WARPS * 32) ref_scores_lane(const float *__restrict__ q, const float *__restrict__ w,
                                                               const float *k, int32_t n_head, int32_t dim,
                                                               int64_t pos0_h, const int32_t *__restrict__ dpos,
                                                               const cuk_seq_row *__restrict__ rows, int64_t bound,
                                                               float *__restrict__ sc, int64_t ld_sc) {
    __shared__ float red[RL_WARPS][RL_KG][33];
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
    const int64_t ngr = (cnt + RL_KG - 1) / RL_KG;
    const int64_t nw = (int64_t)gridDim.x * RL_WARPS;
    int64_t g = (int64_t)blockIdx.x * RL_WARPS + warp;
    if (g >= ngr) return; /* warp-uniform; no block barrier below */
    const int d4n = dim >> 2;
    const bool hl = lane < n_head;
    const float4 *qp = (const float4 *)(q + ((int64_t)t * n_head + (hl ? lane : 0)) * dim);
    float4 qr[ST_MAXD4];
#pragma unroll
    for (int d4 = 0; d4 < ST_MAXD4; d4++)
        qr[d4] = hl && d4 < d4n ? __ldg(qp + d4) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float wh = hl ? w[(int64_t)t * n_head + lane] : 0.0f;
    float *rw = &red[warp][0][0];
    for (; g < ngr; g += nw) {
        const int64_t s0 = g * RL_KG;
        const float4 *kp[RL_KG];
        float acc[RL_KG];
#pragma unroll
        for (int i = 0; i < RL_KG; i++) {
            const int64_t s = s0 + i < cnt ? s0 + i : cnt - 1; /* a clamped duplicate is never stored */
            kp[i] = (const float4 *)(k + s * dim);
            acc[i] = 0.0f;
        }
#pragma unroll
        for (int d4 = 0; d4 < ST_MAXD4; d4++) {
            if (d4 < d4n) {
#pragma unroll
                for (int i = 0; i < RL_KG; i++) {
                    const float4 kv = __ldg(kp[i] + d4);
                    acc[i] = fmaf(qr[d4].x, kv.x, acc[i]);
                    acc[i] = fmaf(qr[d4].y, kv.y, acc[i]);
                    acc[i] = fmaf(qr[d4].z, kv.z, acc[i]);
                    acc[i] = fmaf(qr[d4].w, kv.w, acc[i]);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < RL_KG; i++) rw[i * 33 + lane] = hl && acc[i] > 0.0f ? __fmul_rn(wh, acc[i]) : 0.0f;
        __syncwarp();
        if (lane < RL_KG && s0 + lane < cnt) {
            float r = 0.0f;
            for (int h = 0; h < 32; h++) r = __fadd_rn(r, rw[lane * 33 + h]);
            sc[(int64_t)t * ld_sc + s0 + lane] = r;
        }
        __syncwarp();
    }
}

} // namespace

static float *dev_rand(size_t n, float a, float b) {
    std::vector<float> h(n);
    for (auto &x : h) x = unif(a, b);
    float *d;
    CK(cudaMalloc(&d, n * 4));
    CK(cudaMemcpy(d, h.data(), n * 4, cudaMemcpyHostToDevice));
    return d;
}

/* the graph's bucket for cnt keys (specs/numerics.md) */
static int64_t bucket(int64_t cnt) {
    if (cnt <= 16384) {
        int64_t b = 1024;
        while (b < cnt) b *= 2;
        return b;
    }
    return (cnt + 8191) / 8192 * 8192;
}

/* the old launcher's choice for decode-sized launches: the broadcast-load kernel up to 16384, the
 * thread per key above */
static void ref_scores(const float *q, const float *w, const float *k, int n_tok, int n_head, int dim, int64_t pos0,
                       const int32_t *dpos, const cuk_seq_row *rows, int64_t P, float *sc, int64_t ld_sc) {
    if (P <= 16384) {
        static int sms = 0;
        if (!sms) sms = cuk_sm_count();
        const int64_t groups = (P + RL_KG - 1) / RL_KG, want = (groups + RL_WARPS - 1) / RL_WARPS;
        const int64_t cap = (2 * (int64_t)sms + n_tok - 1) / n_tok;
        dim3 g3((unsigned)(want < cap ? want : cap), (unsigned)n_tok);
        ref_scores_lane<<<g3, RL_WARPS * 32>>>(q, w, k, n_head, dim, pos0, dpos, rows, P, sc, ld_sc);
    } else {
        const size_t smem = ((size_t)n_head * dim + n_head) * sizeof(float);
        dim3 g2((unsigned)((P + SS_THREADS - 1) / SS_THREADS), (unsigned)n_tok);
        k_scores_split<<<g2, SS_THREADS, smem>>>(q, w, k, n_head, dim, pos0, dpos, rows, P, sc, ld_sc);
    }
    CK(cudaGetLastError());
}

static int fails = 0, checks = 0;

/* n floats of a and b (device) bit for bit */
static void same(const float *a, const float *b, size_t n, const char *what) {
    std::vector<float> x(n), y(n);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(x.data(), a, n * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(y.data(), b, n * 4, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += memcmp(&x[i], &y[i], 4) != 0;
    checks++;
    if (bad) {
        printf("FAIL %s: %zu of %zu scores differ\n", what, bad, n);
        fails++;
    }
}

static void check_bits(void) {
    const int64_t ctx[] = {1, 7, 8, 9, 100, 1024, 5000, 16384, 16385, 40000};
    const int heads[2] = {32, 16}, dims[2] = {128, 64};
    const int64_t maxc = 40000 + 8;
    float *k = dev_rand((size_t)maxc * 128, -1, 1), *q = dev_rand(8 * 32 * 128, -1, 1), *w = dev_rand(8 * 32, 0, 1);
    float *s1, *s2;
    int32_t *dpos;
    CK(cudaMalloc(&s1, (size_t)8 * maxc * 4));
    CK(cudaMalloc(&s2, (size_t)8 * maxc * 4));
    CK(cudaMalloc(&dpos, 4));
    char what[160];
    for (int hd = 0; hd < 2; hd++) {
        const int IH = heads[hd], ID = dims[hd];
        for (int64_t c : ctx)
            for (int n = 1; n <= 4; n++) { /* host position: token t sees c - n + t + 1 keys */
                const int64_t pos0 = c >= n ? c - n : 0, P = pos0 + n, ld = P + 3;
                CK(cudaMemset(s1, 0, (size_t)n * ld * 4));
                CK(cudaMemset(s2, 0, (size_t)n * ld * 4));
                cuk_idx_scores_args a;
                memset(&a, 0, sizeof a);
                a.q = q;
                a.w = w;
                a.k = k;
                a.n_tok = n;
                a.n_head = IH;
                a.dim = ID;
                a.pos0 = pos0;
                a.sc = s1;
                a.ld_sc = ld;
                GXX(cuk_idx_scores(&a, NULL, &err_));
                ref_scores(q, w, k, n, IH, ID, pos0, NULL, NULL, P, s2, ld);
                snprintf(what, sizeof what, "cuk_idx_scores %dx%d pos0 %lld n_tok %d", IH, ID, (long long)pos0, n);
                same(s1, s2, (size_t)n * ld, what);
            }
        for (int64_t c : ctx) { /* device position, the launch shaped for the bucket */
            const int64_t P = bucket(c);
            if (P > maxc) continue;
            const int32_t pos = (int32_t)(c - 1);
            CK(cudaMemcpy(dpos, &pos, 4, cudaMemcpyHostToDevice));
            CK(cudaMemset(s1, 0, (size_t)P * 4));
            CK(cudaMemset(s2, 0, (size_t)P * 4));
            cuk_idx_scores_args a;
            memset(&a, 0, sizeof a);
            a.q = q;
            a.w = w;
            a.k = k;
            a.n_tok = 1;
            a.n_head = IH;
            a.dim = ID;
            a.pos0_dev = dpos;
            a.pos_bound = P;
            a.sc = s1;
            a.ld_sc = P;
            GXX(cuk_idx_scores_dev(&a, NULL, &err_));
            ref_scores(q, w, k, 1, IH, ID, 0, dpos, NULL, P, s2, P);
            snprintf(what, sizeof what, "cuk_idx_scores_dev %dx%d keys %lld bucket %lld", IH, ID, (long long)c, (long long)P);
            same(s1, s2, (size_t)P, what);
        }
        /* 8 rows, each its own cache (offsets into k) and position; one row past its cap */
        for (int big = 0; big < 2; big++) {
            std::vector<cuk_seq_row> hr(8);
            int64_t bound = 0;
            for (int t = 0; t < 8; t++) {
                const int64_t cap = big ? 4000 + 4000 * t : 64 + 200 * t;
                hr[t].lat = NULL;
                hr[t].idxk = k + (int64_t)t * 37 * ID;
                hr[t].cap = (int32_t)cap;
                hr[t].pos = t == 5 ? (int32_t)cap : (int32_t)(cap - 1 - (t * 13) % 50);
                bound = bound > cap ? bound : cap;
            }
            cuk_seq_row *dr;
            CK(cudaMalloc(&dr, 8 * sizeof(cuk_seq_row)));
            CK(cudaMemcpy(dr, hr.data(), 8 * sizeof(cuk_seq_row), cudaMemcpyHostToDevice));
            CK(cudaMemset(s1, 0, (size_t)8 * bound * 4));
            CK(cudaMemset(s2, 0, (size_t)8 * bound * 4));
            cuk_idx_scores_args a;
            memset(&a, 0, sizeof a);
            a.q = q;
            a.w = w;
            a.n_tok = 8;
            a.n_head = IH;
            a.dim = ID;
            a.rows = dr;
            a.pos_bound = bound;
            a.sc = s1;
            a.ld_sc = bound;
            GXX(cuk_idx_scores_multi(&a, NULL, &err_));
            ref_scores(q, w, NULL, 8, IH, ID, 0, NULL, dr, bound, s2, bound);
            snprintf(what, sizeof what, "cuk_idx_scores_multi %dx%d 8 rows, bound %lld", IH, ID, (long long)bound);
            same(s1, s2, (size_t)8 * bound, what);
            cudaFree(dr);
        }
    }
    cudaFree(k), cudaFree(q), cudaFree(w), cudaFree(s1), cudaFree(s2), cudaFree(dpos);
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 200;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("idxbench: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    check_bits();
    printf("bits: %d comparisons, %d differ\n", checks, fails);
    const int IH = 32, ID = 128;
    const int64_t cnts[] = {512, 1024, 4096, 8192, 16384, 16400, 32768, 65536, 131072};
    const int64_t row_b = ID * 4, nrows = (256ll << 20) / row_b;
    float *dk = dev_rand((size_t)nrows * ID, -1, 1), *dq = dev_rand(IH * ID, -1, 1), *dw = dev_rand(IH, 0, 1);
    float *dsc;
    int32_t *dpos;
    CK(cudaMalloc(&dsc, (size_t)bucket(131072) * 4));
    CK(cudaMalloc(&dpos, 4));
    printf("one token, %d heads x %d, position in device memory, us per launch (mean of %d)\n\n", IH, ID, reps);
    printf("| keys | bucket | old kernels | k_scores_tile | key bytes at the copy rate of 3.0 TB/s |\n| --- | --- | --- | --- | --- |\n");
    for (int64_t cnt : cnts) {
        const int64_t P = bucket(cnt), ncopy = nrows / P;
        const int32_t pos = (int32_t)(cnt - 1);
        CK(cudaMemcpy(dpos, &pos, 4, cudaMemcpyHostToDevice));
        const float t_old = time_us(reps, [&](int i) {
            ref_scores(dq, dw, dk + (int64_t)(i % ncopy) * P * ID, 1, IH, ID, 0, dpos, NULL, P, dsc, P);
        });
        const float t_new = time_us(reps, [&](int i) {
            cuk_idx_scores_args a;
            memset(&a, 0, sizeof a);
            a.q = dq;
            a.w = dw;
            a.k = dk + (int64_t)(i % ncopy) * P * ID;
            a.n_tok = 1;
            a.n_head = IH;
            a.dim = ID;
            a.pos0_dev = dpos;
            a.pos_bound = P;
            a.sc = dsc;
            a.ld_sc = P;
            GXX(cuk_idx_scores_dev(&a, NULL, &err_));
        });
        printf("| %lld | %lld | %.2f | %.2f | %.2f |\n", (long long)cnt, (long long)P, t_old, t_new,
               (double)cnt * row_b / 3.0e6);
    }
    /* top-k of those scores: the one-block kernel, and the cluster kernel at each cluster size
     * (the launcher's choice: clusters of up to 16, slices of at least 1024 positions) */
    int32_t *dsel, *dn;
    float *dsc2;
    CK(cudaMalloc(&dsc2, (size_t)bucket(131072) * 4));
    CK(cudaMalloc(&dsel, 2048 * 4));
    CK(cudaMalloc(&dn, 4));
    const int clmax = cuk_cluster_max((const void *)k_topk_split, TS_MAXCL, TK_THREADS, 0, 0);
    printf("\ntop-k 2048 of one token's scores, us per launch: k_topk (one block), k_topk_split in clusters of 1-%d\n\n", clmax);
    printf("| keys | bucket | k_topk | cl 1 | cl 2 | cl 4 | cl 8 | cl 16 | k_topk_one | the launcher |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    CK(cudaFuncSetAttribute(k_topk_one, cudaFuncAttributeMaxDynamicSharedMemorySize, 48 * 1024 * 4));
    std::vector<int32_t> r0(2048), r1(2048);
    for (int64_t cnt : cnts) {
        const int64_t P = bucket(cnt);
        const int32_t pos = (int32_t)(cnt - 1);
        CK(cudaMemcpy(dpos, &pos, 4, cudaMemcpyHostToDevice));
        {
            cuk_idx_scores_args a;
            memset(&a, 0, sizeof a);
            a.q = dq, a.w = dw, a.k = dk, a.n_tok = 1, a.n_head = IH, a.dim = ID, a.pos0_dev = dpos, a.pos_bound = P;
            a.sc = dsc, a.ld_sc = P;
            GXX(cuk_idx_scores_dev(&a, NULL, &err_));
        }
        float t[8];
        t[0] = time_us(reps, [&](int) {
            k_topk<<<1, TK_THREADS>>>(dsc, P, 0, dpos, (const cuk_seq_row *)NULL, P, 2048, dsel, 2048, dn);
        });
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(r0.data(), dsel, 2048 * 4, cudaMemcpyDeviceToHost));
        for (int c = 0; c < 5; c++) {
            const int cl = 1 << c;
            t[1 + c] = 0.0f;
            if (cl > clmax) continue;
            auto f = [&](int) {
                cudaLaunchAttribute at;
                const cudaLaunchConfig_t cfg = cuk_cluster_cfg(&at, (unsigned)cl, dim3((unsigned)cl, 1, 1), TK_THREADS, 0, 0);
                CK(cudaLaunchKernelEx(&cfg, k_topk_split, (const float *)dsc, P, (int64_t)0, (const int32_t *)dpos,
                                       (const cuk_seq_row *)NULL, P, (int32_t)2048, dsel, (int64_t)2048, dn));
            };
            t[1 + c] = time_us(reps, f);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(r1.data(), dsel, 2048 * 4, cudaMemcpyDeviceToHost));
            checks++;
            if (memcmp(r0.data(), r1.data(), 2048 * 4)) {
                printf("FAIL top-k keys %lld: cluster %d differs from k_topk\n", (long long)cnt, cl);
                fails++;
            }
        }
        for (int v = 0; v < 2; v++) {
            t[6 + v] = 0.0f;
            if (P > 48 * 1024) continue;
            const float *fs = dsc; /* the row f reads: the scores, then each adversarial input */
            auto f = [&](int) {
                if (v == 0)
                    k_topk_one<<<1, TO_THREADS, P * 4>>>(fs, P, 0, dpos, (const cuk_seq_row *)NULL, P, 2048, dsel, 2048, dn);
                else { /* the launcher's pick */
                    cuk_idx_topk_args ta;
                    memset(&ta, 0, sizeof ta);
                    ta.sc = fs, ta.ld_sc = P, ta.n_tok = 1, ta.pos0_dev = dpos, ta.pos_bound = P, ta.k = 2048;
                    ta.sel = dsel, ta.ld_sel = 2048, ta.n_sel = dn;
                    GXX(cuk_idx_topk_dev(&ta, NULL, &err_));
                }
            };
            t[6 + v] = time_us(reps, f);
            for (int kind = 0; kind < 4; kind++) { /* the scores, then all equal, four values, mostly zero */
                if (kind) {
                    std::vector<float> adv((size_t)P);
                    for (auto &x : adv)
                        x = kind == 1 ? 1.0f : kind == 2 ? (float)(int)unif(0, 4) : (unif(0, 1) < 0.9f ? 0.0f : unif(0, 1));
                    CK(cudaMemcpy(dsc2, adv.data(), P * 4, cudaMemcpyHostToDevice));
                }
                const float *src = kind ? dsc2 : dsc;
                k_topk<<<1, TK_THREADS>>>(src, P, 0, dpos, (const cuk_seq_row *)NULL, P, 2048, dsel, 2048, dn);
                CK(cudaDeviceSynchronize());
                CK(cudaMemcpy(r0.data(), dsel, 2048 * 4, cudaMemcpyDeviceToHost));
                CK(cudaMemset(dsel, 0xFF, 2048 * 4));
                fs = src;
                f(0);
                CK(cudaDeviceSynchronize());
                CK(cudaMemcpy(r1.data(), dsel, 2048 * 4, cudaMemcpyDeviceToHost));
                checks++;
                if (memcmp(r0.data(), r1.data(), 2048 * 4)) {
                    printf("FAIL top-k keys %lld input %d: %s differs from k_topk\n", (long long)cnt, kind, v == 0 ? "k_topk_one" : "the launcher");
                    fails++;
                }
            }
        }
        printf("| %lld | %lld | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", (long long)cnt, (long long)P, t[0],
               t[1], t[2], t[3], t[4], t[5], t[6], t[7]);
    }
    printf("idxbench: %d passed, %d failed\n", checks - fails, fails);
    return fails ? 1 : 0;
}
