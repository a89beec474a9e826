/* Fast mode's MLA decode attention (k_mla_dec, cuda/attn_dec.cu, which this file includes) at
 * the peer model's TP 1 shape: 64 heads, kv_lora 512, rope 64, nope 192, a bf16 latent cache,
 * top-k 2048, a cluster of ceil(max_sel / 128) = 16 CTAs. Times RB 1, 2 and 4 (16, 32 and 64
 * heads a CTA: 64, 32 and 16 CTAs for one token) and the launcher's own pick (mla_dec_run) at 1,
 * 2, 4, 8 and 32 tokens with 512 and 2048 selected keys, the caches rotating over copies filling
 * >= 256 MB (a layer's cache is not in the L2 when its attention runs). A row's softmax sum is
 * kept per 8-key group whatever the form, so the three forms must give the same bits: exits 1 if
 * any output differs from RB 4's or is not finite. Needs no build on the device (compiled here:
 * bench/NOTES.md "Session 33").
 * Usage: decbench [reps] */
#include "cuda/attn_dec.cu"

#include "bench/pending/pending.cuh"


enum { H = 64, NOPE = 192, R = 64, KL = 512, KVW = KL + R, TOPK = 2048, MAXT = 32 };

static uint16_t bf16_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static int g_cl = 16;
static g5_status launch(int rb, const ac_args &a, g5_error *err) {
    switch (rb) {
    case 0: return mla_dec_run(a, CUK_BF16, 0, err);
    case 1: return dec_launch<1, true>(a, g_cl, 0, err);
    case 2: return dec_launch<2, true>(a, g_cl, 0, err);
    default: return dec_launch<4, true>(a, g_cl, 0, err);
    }
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 200;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("decbench: %s, %d SMs; k_mla_dec, %d heads, bf16 cache, top-k %d; us per launch, mean of %d\n", prop.name,
           prop.multiProcessorCount, H, TOPK, reps);
    {
        int mc = 0;
        GXX(dec_cluster_max<true>(dec_forms_fit(cuk_device_current()), 0, &mc, &err_));
        if (mc < g_cl) g_cl = mc;
    }
    const int64_t NPOS = 16384; /* cache rows a copy */
    const int64_t copy_b = NPOS * KVW * 2, ncopy = ((256ll << 20) + copy_b - 1) / copy_b;
    uint16_t *lat;
    CK(cudaMalloc(&lat, ncopy * copy_b));
    {
        std::vector<uint16_t> h((size_t)NPOS * KVW);
        for (auto &x : h) x = bf16_of(unif(-1, 1));
        for (int64_t c = 0; c < ncopy; c++)
            CK(cudaMemcpy((uint8_t *)lat + c * copy_b, h.data(), copy_b, cudaMemcpyHostToDevice));
    }
    float *q, *qlat, *out[4];
    int32_t *sel, *nsel;
    {
        std::vector<float> hq((size_t)MAXT * H * (NOPE + R)), hl((size_t)MAXT * H * KL);
        for (auto &x : hq) x = unif(-1, 1);
        for (auto &x : hl) x = unif(-0.2f, 0.2f);
        CK(cudaMalloc(&q, hq.size() * 4));
        CK(cudaMalloc(&qlat, hl.size() * 4));
        CK(cudaMemcpy(q, hq.data(), hq.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(qlat, hl.data(), hl.size() * 4, cudaMemcpyHostToDevice));
    }
    for (int v = 0; v < 4; v++) CK(cudaMalloc(&out[v], (size_t)MAXT * H * KL * 4));
    CK(cudaMalloc(&sel, (size_t)MAXT * TOPK * 4));
    CK(cudaMalloc(&nsel, MAXT * 4));
    printf("| tokens | keys each | RB 1 | RB 2 | RB 4 | the launcher's pick | outputs equal |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- |\n");
    int fails = 0;
    const int toks[5] = {1, 2, 4, 8, 32}, keys[2] = {512, 2048};
    for (int nk : keys)
        for (int nt : toks) {
            /* token t's nk selected positions: ascending, spread over the cache (as the top-k gives) */
            std::vector<int32_t> hs((size_t)MAXT * TOPK, -1), hn(MAXT, nk);
            for (int t = 0; t < nt; t++) {
                int64_t p = (int64_t)(unif(0, 1) * 7);
                for (int i = 0; i < nk; i++) {
                    hs[(size_t)t * TOPK + i] = (int32_t)p;
                    p += 1 + (int64_t)(unif(0, 1) * (2.0 * NPOS / nk - 1.0));
                    if (p >= NPOS) p = NPOS - 1 - (nk - 1 - i);
                }
            }
            CK(cudaMemcpy(sel, hs.data(), hs.size() * 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(nsel, hn.data(), hn.size() * 4, cudaMemcpyHostToDevice));
            ac_args a;
            memset(&a, 0, sizeof a);
            a.d.n_tok = nt, a.d.n_head = H, a.d.nope = NOPE, a.d.rope = R, a.d.kv_lora = KL;
            a.q = q, a.qlat = qlat, a.fresh = NULL, a.fresh0 = NPOS, a.n_pos = NPOS, a.dpos = NULL, a.bound = NPOS;
            a.sel = sel, a.ld_sel = TOPK, a.n_sel = nsel, a.max_sel = TOPK;
            a.scale = 1.0f / sqrtf((float)(NOPE + R)), a.rows = NULL;
            float t_us[4];
            for (int v = 0; v < 4; v++) {
                const int rb = v == 3 ? 0 : 1 << v;
                t_us[v] = time_us(reps, [&](int i) {
                    ac_args b = a;
                    b.lat = (const uint8_t *)lat + (int64_t)(i % ncopy) * copy_b;
                    b.out = out[v];
                    GXX(launch(rb, b, &err_));
                });
                ac_args b = a; /* copy 0, for the comparison */
                b.lat = lat;
                b.out = out[v];
                GXX(launch(rb, b, &err_));
            }
            CK(cudaDeviceSynchronize());
            const size_t n = (size_t)nt * H * KL;
            std::vector<float> o[4];
            for (int v = 0; v < 4; v++) {
                o[v].resize(n);
                CK(cudaMemcpy(o[v].data(), out[v], n * 4, cudaMemcpyDeviceToHost));
            }
            int finite = 1, same = 1;
            for (size_t i = 0; i < n; i++)
                for (int v = 0; v < 4; v++) finite &= isfinite(o[v][i]) != 0;
            for (int v = 0; v < 4; v++) same &= memcmp(o[v].data(), o[2].data(), n * 4) == 0;
            if (!finite || !same) {
                printf("FAIL %d tokens x %d keys: finite %d, bits equal %d\n", nt, nk, finite, same);
                fails++;
            }
            printf("| %d | %d | %.2f | %.2f | %.2f | %.2f | %s |\n", nt, nk, t_us[0], t_us[1], t_us[2], t_us[3],
                   same ? "yes" : "no");
        }
    printf("decbench: %d failed\n", fails);
    return fails ? 1 : 0;
}
