/* Fast mode's decode absorption (cuda/attn.cu, which this file includes): k_absorb_split (the
 * CPU's order, used by every mode until now) against k_absorb_fast, W_UK held in registers with
 * nope split over warps, in the production shape (8 warps of 24 rows, registers for 3 blocks an
 * SM) and variants (8 warps for 2 blocks, 16 warps of 12 rows for 3 or 4, 32 warps of 6), at the peer
 * model's TP 1 shape (64 heads, nope 192, kv_lora 512, head_rows 448: 58.7 MB of kv_b a layer, of
 * which W_UK 25.2 MB) and 1, 8 and 32 tokens, kv_b rotating over copies filling >= 256 MB (a
 * layer's weights are not in the L2 when it runs). Checks: every form within 1e-5 of the split
 * kernel (relative to the largest output), and the production form's rows of an 8- and a
 * 32-token launch bit for bit its one-token launches. Needs no build on the device (compiled
 * here like bench/pending/decbench.cu, on a tree with bench/pending/s34-absorb-fast.patch applied:
 * s34-first-call.sh does both). Exits 1 on a failed check. Usage: absbench [reps] */
#include "cuda/attn.cu"

#include "bench/pending/pending.cuh"


enum { H = 64, NOPE = 192, R = 64, KL = 512, HR = 448, MAXT = 32 };


enum { NV = 6 };
static const char *const VN[NV] = {"split (CPU order)", "fast 8x24, 3/SM (production)", "fast 16x12, 4/SM",
                                   "fast 8x24, 2/SM", "fast 16x12, 3/SM", "fast 32x6, 2/SM"};

static void launch(int v, const cuk_mla_dims &d, const float *q, const float *kvb, float *out) {
    const dim3 grid((unsigned)d.n_head, (unsigned)(d.kv_lora / AF_COLS), (unsigned)((d.n_tok + AF_TOK - 1) / AF_TOK));
    switch (v) {
    case 0:
    case 1: {
        cuk_mla_absorb_args a;
        memset(&a, 0, sizeof a);
        a.d = d, a.q = q, a.kvb = kvb, a.head_rows = HR, a.qlat = out, a.fast = v;
        GXX(cuk_mla_absorb(&a, NULL, &err_));
        return;
    }
    case 2: k_absorb_fast<16, 12, 4><<<grid, 16 * 32>>>(d, q, kvb, HR, out); break;
    case 3: k_absorb_fast<8, 24, 2><<<grid, 8 * 32>>>(d, q, kvb, HR, out); break;
    case 4: k_absorb_fast<16, 12, 3><<<grid, 16 * 32>>>(d, q, kvb, HR, out); break;
    default: k_absorb_fast<32, 6, 2><<<grid, 32 * 32>>>(d, q, kvb, HR, out); break;
    }
    CK(cudaGetLastError());
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 200;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("absbench: %s, %d SMs; mla_absorb, %d heads x nope %d -> kv_lora %d, W_UK %.1f MB; us per launch, mean "
           "of %d\n",
           prop.name, prop.multiProcessorCount, H, NOPE, KL, (double)H * NOPE * KL * 4 / 1e6, reps);
    const int64_t copy_n = (int64_t)H * HR * KL, copy_b = copy_n * 4, ncopy = ((256ll << 20) + copy_b - 1) / copy_b;
    float *kvb, *q, *out[NV], *o1;
    CK(cudaMalloc(&kvb, ncopy * copy_b));
    {
        std::vector<float> h((size_t)copy_n);
        for (auto &x : h) x = unif(-0.1f, 0.1f);
        for (int64_t c = 0; c < ncopy; c++) CK(cudaMemcpy(kvb + c * copy_n, h.data(), copy_b, cudaMemcpyHostToDevice));
        std::vector<float> hq((size_t)MAXT * H * (NOPE + R));
        for (auto &x : hq) x = unif(-1, 1);
        CK(cudaMalloc(&q, hq.size() * 4));
        CK(cudaMemcpy(q, hq.data(), hq.size() * 4, cudaMemcpyHostToDevice));
    }
    for (int v = 0; v < NV; v++) CK(cudaMalloc(&out[v], (size_t)MAXT * H * KL * 4));
    CK(cudaMalloc(&o1, (size_t)H * KL * 4));
    printf("| tokens |");
    for (int v = 0; v < NV; v++) printf(" %s |", VN[v]);
    printf(" W_UK at the copy rate of 3.0 TB/s |\n| --- |");
    for (int v = 0; v <= NV; v++) printf(" --- |");
    printf("\n");
    int fails = 0;
    const int toks[3] = {1, 8, 32};
    for (int nt : toks) {
        const cuk_mla_dims d = {nt, H, NOPE, R, KL};
        float t_us[NV];
        for (int v = 0; v < NV; v++) {
            t_us[v] = time_us(reps, [&](int i) { launch(v, d, q, kvb + (int64_t)(i % ncopy) * copy_n, out[v]); });
            launch(v, d, q, kvb, out[v]);
        }
        CK(cudaDeviceSynchronize());
        const size_t n = (size_t)nt * H * KL;
        std::vector<float> o[NV];
        for (int v = 0; v < NV; v++) {
            o[v].resize(n);
            CK(cudaMemcpy(o[v].data(), out[v], n * 4, cudaMemcpyDeviceToHost));
        }
        double mx = 0;
        for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(o[0][i]));
        for (int v = 1; v < NV; v++) {
            double e = 0;
            for (size_t i = 0; i < n; i++) e = fmax(e, fabs((double)o[v][i] - o[0][i]));
            if (!(e <= 1e-5 * mx)) {
                printf("FAIL %d tokens: %s differs from the split kernel by %.3g (max |out| %.3g)\n", nt, VN[v], e, mx);
                fails++;
            }
        }
        if (nt > 1) /* the production form: each row bit for bit its one-token launch */
            for (int t = 0; t < nt; t++) {
                const cuk_mla_dims d1 = {1, H, NOPE, R, KL};
                launch(1, d1, q + (int64_t)t * H * (NOPE + R), kvb, o1);
                std::vector<float> r1((size_t)H * KL);
                CK(cudaMemcpy(r1.data(), o1, r1.size() * 4, cudaMemcpyDeviceToHost));
                if (memcmp(r1.data(), o[1].data() + (size_t)t * H * KL, r1.size() * 4)) {
                    printf("FAIL %d tokens: row %d differs from its one-token launch\n", nt, t);
                    fails++;
                }
            }
        printf("| %d |", nt);
        for (int v = 0; v < NV; v++) printf(" %.2f |", t_us[v]);
        printf(" %.2f |\n", (double)H * NOPE * KL * 4 / 3.0e6);
    }
    printf("absbench: %d failed\n", fails);
    return fails ? 1 : 0;
}
