/* The indexer's decode launches at GLM-5's shape (32 heads x 128), through cuda/indexer.cu, which
 * this file includes; one token, the position in device memory, the launch shaped for the graph's
 * bucket, 512 to 128k keys rotating over 256 MB of key copies (so that the L2 does not hold them):
 *  - scores (cuk_idx_scores_dev: k_scores_tile), us per launch against the keys' byte time;
 *  - top-k 2048 of those scores: k_topk, k_topk_split at clusters of 1-16, k_topk_one and the
 *    launcher's pick, us per launch; each form's selections against k_topk's on the scores and
 *    three adversarial rows (all equal, four values, mostly zero).
 * (Session 33's form also compared k_scores_tile with the kernels it replaced, bit for bit; its
 * numbers are in bench/RESULTS.md.) Needs no build on the device (compiled here: bench/NOTES.md).
 * Exits 1 on any difference. Usage: idxbench [reps] */
#include "cuda/indexer.cu"

#include "bench/pending/pending.cuh"

/* one token's scores at position *dpos, the launch shaped for bound P (row stride P) */
static void scores_dev(const float *q, const float *w, const float *k, const int32_t *dpos, int64_t P, float *sc) {
    cuk_idx_scores_args a;
    memset(&a, 0, sizeof a);
    a.q = q, a.w = w, a.k = k, a.n_tok = 1, a.n_head = 32, a.dim = 128, a.pos0_dev = dpos, a.pos_bound = P;
    a.sc = sc, a.ld_sc = P;
    GXX(cuk_idx_scores_dev(&a, NULL, &err_));
}

static int fails = 0, checks = 0;

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 200;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("idxbench: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    const int IH = 32, ID = 128;
    const int64_t cnts[] = {512, 1024, 4096, 8192, 16384, 16400, 32768, 65536, 131072};
    const int64_t row_b = ID * 4, nrows = (256ll << 20) / row_b;
    float *dk = dev_rand((size_t)nrows * ID, -1, 1), *dq = dev_rand(IH * ID, -1, 1), *dw = dev_rand(IH, 0, 1);
    float *dsc;
    int32_t *dpos;
    CK(cudaMalloc(&dsc, (size_t)bucket(131072) * 4));
    CK(cudaMalloc(&dpos, 4));
    printf("one token, %d heads x %d, position in device memory, us per launch (mean of %d)\n\n", IH, ID, reps);
    printf("| keys | bucket | k_scores_tile | key bytes at the copy rate of 3.0 TB/s |\n| --- | --- | --- | --- |\n");
    for (int64_t cnt : cnts) {
        const int64_t P = bucket(cnt), ncopy = nrows / P;
        const int32_t pos = (int32_t)(cnt - 1);
        CK(cudaMemcpy(dpos, &pos, 4, cudaMemcpyHostToDevice));
        const float t_new = time_us(reps, [&](int i) { scores_dev(dq, dw, dk + (int64_t)(i % ncopy) * P * ID, dpos, P, dsc); });
        printf("| %lld | %lld | %.2f | %.2f |\n", (long long)cnt, (long long)P, t_new, (double)cnt * row_b / 3.0e6);
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
        scores_dev(dq, dw, dk, dpos, P, dsc);
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
