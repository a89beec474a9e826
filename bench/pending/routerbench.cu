/* The MoE router's product at 1, 4, 8, 16 and 32 vectors: float32 weights [m][6144], m = 64 (the peer
 * model) or 256 (GLM-5), through k_gemv (cuda/gemv_impl.cuh: 16 CTAs of 4 warps at m = 64, one
 * 2-chunk pipeline a warp, so about 128 KB in flight over the GPU) against cuk_gemv_wide
 * (cuda/gemv_wide.cu: clusters of 8 CTAs split k, each warp one row's 768-column slice in
 * registers, the slices' sums added in rank order through distributed shared memory); both
 * files are included. The weights rotate over copies filling >= 256 MB. Checks cuk_gemv_wide
 * within 1e-5 of k_gemv (relative to the largest output) and its rows of a batched launch bit for
 * bit its one-vector launches. Compiled here, run with no build on the device. Usage:
 * routerbench [reps] */
#include "cuda/gemv_impl.cuh"
#include "cuda/gemv_wide.cu"

#include "bench/pending/pending.cuh"

static void wide(const float *w, int m, int k, const float *x, int nvec, float *y) {
    const cuk_gemv_args a = {QT_F32, w, k, m, x, CUK_ACT_F32, k, nvec, y, m};
    GXX(cuk_gemv_wide(&a, NULL, &err_));
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 200;
    const int K = 6144;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("routerbench: %s, %d SMs; float32 [m][%d] times [n][%d], us per launch (mean of %d)\n\n", prop.name,
           prop.multiProcessorCount, K, K, reps);
    const int64_t total = 256ll << 20;
    float *w, *x, *y0, *y1, *y2;
    CK(cudaMalloc(&w, total));
    {
        std::vector<float> h((size_t)(total / 4));
        for (auto &v : h) v = unif(-0.05f, 0.05f);
        CK(cudaMemcpy(w, h.data(), total, cudaMemcpyHostToDevice));
        std::vector<float> hx((size_t)32 * K);
        for (auto &v : hx) v = unif(-1, 1);
        CK(cudaMalloc(&x, hx.size() * 4));
        CK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
    }
    CK(cudaMalloc(&y0, (size_t)32 * 256 * 4));
    CK(cudaMalloc(&y1, (size_t)32 * 256 * 4));
    CK(cudaMalloc(&y2, (size_t)32 * 256 * 4));
    printf("| m | n | k_gemv | cuk_gemv_wide | bytes at 3.0 TB/s |\n| --- | --- | --- | --- | --- |\n");
    int fails = 0;
    const int ms[2] = {64, 256}, ns[5] = {1, 4, 8, 16, 32};
    for (int m : ms)
        for (int n : ns) {
            const int64_t mat = (int64_t)m * K, ncopy = total / 4 / mat;
            auto base = [&](int i, float *out) {
                cuk_gemv_args a;
                memset(&a, 0, sizeof a);
                a.w_type = QT_F32, a.w = w + (int64_t)(i % ncopy) * mat, a.k = K, a.m = m, a.x = x;
                a.x_type = CUK_ACT_F32, a.ldx = K, a.y = out, a.ldy = m;
                for (int v0 = 0; v0 < n; v0 += CUK_GEMV_MAX_N) { /* as gm_gemv_k: launches of <= 16 */
                    a.x = x + (int64_t)v0 * K, a.y = out + (int64_t)v0 * m;
                    a.n = n - v0 < CUK_GEMV_MAX_N ? n - v0 : CUK_GEMV_MAX_N;
                    g5_error e = {};
                    if (cuk::gemv_run<QT_F32>(&a, 0, &e) != G5_OK) {
                        fprintf(stderr, "gemv: %s\n", e.msg);
                        exit(BENCH_EXIT);
                    }
                }
            };
            const float t0 = time_us(reps, [&](int i) { base(i, y0); });
            const float t1 = time_us(reps, [&](int i) { wide(w + (int64_t)(i % ncopy) * mat, m, K, x, n, y1); });
            base(0, y0);
            wide(w, m, K, x, n, y1);
            CK(cudaDeviceSynchronize());
            std::vector<float> a0((size_t)n * m), a1((size_t)n * m), a2((size_t)m);
            CK(cudaMemcpy(a0.data(), y0, a0.size() * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(a1.data(), y1, a1.size() * 4, cudaMemcpyDeviceToHost));
            double mx = 0, e = 0;
            for (size_t i = 0; i < a0.size(); i++) {
                mx = fmax(mx, fabs(a0[i]));
                e = fmax(e, fabs((double)a1[i] - a0[i]));
            }
            if (!(e <= 1e-5 * mx) || mx == 0) {
                printf("FAIL m %d n %d: cuk_gemv_wide differs from k_gemv by %.3g (max %.3g)\n", m, n, e, mx);
                fails++;
            }
            for (int v = 0; v < n && n > 1; v++) {
                wide(w, m, K, x + (int64_t)v * K, 1, y2);
                CK(cudaMemcpy(a2.data(), y2, a2.size() * 4, cudaMemcpyDeviceToHost));
                if (memcmp(a2.data(), a1.data() + (size_t)v * m, a2.size() * 4)) {
                    printf("FAIL m %d n %d: row %d differs from its one-vector launch\n", m, n, v);
                    fails++;
                }
            }
            printf("| %d | %d | %.2f | %.2f | %.2f |\n", m, n, t0, t1, (double)m * K * 4 / 3.0e6);
        }
    printf("routerbench: %d failed\n", fails);
    return fails ? 1 : 0;
}
