/* One-token absorption (cuda/attn.cu, which this file includes): k_absorb_split (the form every
 * step took until now: 32-column slices of W_UK staged in shared memory, then one warp's chain)
 * against k_absorb_one (each thread's whole 192-row column in registers, all of the launch's
 * bytes in flight at once), both the CPU's order, at the peer model's TP 1 shape (64 heads) and a
 * TP 8 rank's (8 heads): nope 192, kv_lora 512, head_rows 448 (58.7 MB of kv_b a layer at 64
 * heads, W_UK 25.2 MB), kv_b rotating over copies filling >= 256 MB (a layer's weights are not in
 * the L2 when it runs). Checks the two forms' outputs bit for bit. Needs no build on the device:
 *   gcc -std=c11 -D_GNU_SOURCE -O2 -I. -c format/status.c -o /tmp/status.o
 *   make -j2 CUDA_ARCH=90 G5_NO_DEPS=1 build/gpu/obj/cuda/device.o build/gpu/obj/cuda/attn_dec.o
 *   mkdir -p .dev/idx && nvcc -std=c++17 -O3 -arch=sm_90 -I. -Xcompiler -Wall,-Wextra,-ffp-contract=off \
 *     -Werror all-warnings -cudart static -o .dev/idx/absbench bench/pending/absbench.cu \
 *     build/gpu/obj/cuda/device.o build/gpu/obj/cuda/attn_dec.o /tmp/status.o
 * (on a tree with bench/pending/s36-absorb-one.patch applied).
 * Exits 1 on a failed check. Usage: absbench [reps] */
#include "cuda/attn.cu"

#include "bench/pending/pending.cuh"

enum { NOPE = 192, R = 64, KL = 512, HR = 448 };

static void split(const cuk_mla_dims &d, const float *q, const float *kvb, float *out) {
    const size_t smem = ((size_t)NOPE * AB_COLS + NOPE) * sizeof(float);
    const dim3 grid((unsigned)d.n_head, (unsigned)(KL / AB_COLS), 1);
    k_absorb_split<<<grid, AB_THREADS, smem>>>(d, q, kvb, HR, 1, out);
    CK(cudaGetLastError());
}

static void one(const cuk_mla_dims &d, const float *q, const float *kvb, float *out) {
    cuk_mla_absorb_args a;
    memset(&a, 0, sizeof a);
    a.d = d, a.q = q, a.kvb = kvb, a.head_rows = HR, a.qlat = out;
    GXX(cuk_mla_absorb(&a, NULL, &err_));
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 200;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("absbench: %s, %d SMs; one-token mla_absorb, nope %d -> kv_lora %d; us per launch, mean of %d\n\n",
           prop.name, prop.multiProcessorCount, NOPE, KL, reps);
    printf("| heads | W_UK MB | k_absorb_split | k_absorb_one | W_UK at 3.0 TB/s |\n| --- | --- | --- | --- | --- |\n");
    int fails = 0;
    const int heads[2] = {64, 8};
    for (int H : heads) {
        const int64_t copy_n = (int64_t)H * HR * KL, copy_b = copy_n * 4, ncopy = ((256ll << 20) + copy_b - 1) / copy_b;
        float *kvb, *q, *o0, *o1;
        CK(cudaMalloc(&kvb, ncopy * copy_b));
        std::vector<float> h((size_t)copy_n);
        for (auto &x : h) x = unif(-0.1f, 0.1f);
        for (int64_t c = 0; c < ncopy; c++) CK(cudaMemcpy(kvb + c * copy_n, h.data(), copy_b, cudaMemcpyHostToDevice));
        std::vector<float> hq((size_t)H * (NOPE + R));
        for (auto &x : hq) x = unif(-1, 1);
        CK(cudaMalloc(&q, hq.size() * 4));
        CK(cudaMemcpy(q, hq.data(), hq.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMalloc(&o0, (size_t)H * KL * 4));
        CK(cudaMalloc(&o1, (size_t)H * KL * 4));
        const cuk_mla_dims d = {1, H, NOPE, R, KL};
        float t[2][2];
        for (int r = 0; r < 2; r++) { /* two rounds, alternated */
            t[r][0] = time_us(reps, [&](int i) { split(d, q, kvb + (int64_t)(i % ncopy) * copy_n, o0); });
            t[r][1] = time_us(reps, [&](int i) { one(d, q, kvb + (int64_t)(i % ncopy) * copy_n, o1); });
        }
        split(d, q, kvb, o0);
        one(d, q, kvb, o1);
        CK(cudaDeviceSynchronize());
        std::vector<float> a0((size_t)H * KL), a1((size_t)H * KL);
        CK(cudaMemcpy(a0.data(), o0, a0.size() * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(a1.data(), o1, a1.size() * 4, cudaMemcpyDeviceToHost));
        if (memcmp(a0.data(), a1.data(), a0.size() * 4)) {
            size_t nd = 0;
            for (size_t i = 0; i < a0.size(); i++) nd += memcmp(&a0[i], &a1[i], 4) != 0;
            printf("FAIL heads %d: %zu of %zu outputs differ between the forms\n", H, nd, a0.size());
            fails++;
        }
        const double mb = (double)H * NOPE * KL * 4 / 1e6;
        printf("| %d | %.1f | %.2f, %.2f | %.2f, %.2f | %.2f |\n", H, mb, t[0][0], t[1][0], t[0][1], t[1][1], mb / 3.0);
        cudaFree(kvb), cudaFree(q), cudaFree(o0), cudaFree(o1);
    }
    printf("absbench: %d failed\n", fails);
    return fails ? 1 : 0;
}
