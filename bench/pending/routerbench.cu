/* The MoE router's product at one vector (and 8, 32): float32 weights [m][6144], m = 64 (the peer
 * model) or 256 (GLM-5), through the landed k_gemv (cuda/gemv_impl.cuh, which this file
 * includes: 16 CTAs of 4 warps at m = 64, one 2-chunk pipeline a warp, so about 128 KB in flight
 * over the GPU) against a prototype that puts the whole matrix in flight at once: clusters of 8
 * CTAs split k, each warp one row's 768-column slice in registers (6 float4 a lane), the slices'
 * sums added in rank order through distributed shared memory. The weights rotate over copies
 * filling >= 256 MB. Checks the prototype within 1e-5 of k_gemv (relative to the largest
 * output) and its rows of a batched launch bit for bit its one-vector launches. Compiled here,
 * run with no build on the device. Usage: routerbench [reps] */
#include "cuda/gemv_impl.cuh"

#include <cooperative_groups.h>
#include "bench/pending/pending.cuh"

namespace cg = cooperative_groups;

constexpr int WS = 8;  /* k slices: the cluster */
constexpr int WR = 8;  /* rows a CTA: one a warp */
constexpr int WNV = 32; /* vectors at most */

template <int J>
__global__ void __launch_bounds__(WR * 32) k_wide(const float *__restrict__ w, int m, int k,
                                                  const float *__restrict__ x, int64_t ldx, int nvec,
                                                  float *__restrict__ y, int64_t ldy) {
    __shared__ float part[WR][WNV];
    cg::cluster_group cl = cg::this_cluster();
    const int s = (int)cl.block_rank(), lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int r = blockIdx.y * WR + warp, rr = r < m ? r : m - 1, ks = k / WS, c0 = s * ks;
    float4 wv[J];
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int c = c0 + 4 * (lane + 32 * j);
        wv[j] = c < c0 + ks ? __ldcs((const float4 *)(w + (int64_t)rr * k + c)) : make_float4(0, 0, 0, 0);
    }
    for (int v = 0; v < nvec; v++) {
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < J; j++) {
            const int c = c0 + 4 * (lane + 32 * j);
            if (c < c0 + ks) {
                const float4 xv = __ldg((const float4 *)(x + (int64_t)v * ldx + c));
                acc = fmaf(wv[j].x, xv.x, acc);
                acc = fmaf(wv[j].y, xv.y, acc);
                acc = fmaf(wv[j].z, xv.z, acc);
                acc = fmaf(wv[j].w, xv.w, acc);
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) part[warp][v] = acc;
    }
    cl.sync();
    /* slice s's CTA stores vectors v = s, s + WS, ..: each output the slices' sums in rank order */
    for (int i = threadIdx.x; i < WR * nvec; i += WR * 32) {
        const int rw = i % WR, v = i / WR;
        if (v % WS != s) continue;
        const int row = blockIdx.y * WR + rw;
        float t = 0.0f;
#pragma unroll
        for (int q = 0; q < WS; q++) t += cl.map_shared_rank(&part[0][0], q)[rw * WNV + v];
        if (row < m) y[(int64_t)v * ldy + row] = t;
    }
    cl.sync();
}

static void wide(const float *w, int m, int k, const float *x, int nvec, float *y) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeClusterDimension;
    at.val.clusterDim.x = WS, at.val.clusterDim.y = 1, at.val.clusterDim.z = 1;
    cfg.gridDim = dim3(WS, (unsigned)((m + WR - 1) / WR), 1);
    cfg.blockDim = dim3(WR * 32, 1, 1);
    cfg.attrs = &at, cfg.numAttrs = 1;
    CK(cudaLaunchKernelEx(&cfg, k_wide<6>, w, m, k, x, (int64_t)k, nvec, y, (int64_t)m));
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
        std::vector<float> hx((size_t)WNV * K);
        for (auto &v : hx) v = unif(-1, 1);
        CK(cudaMalloc(&x, hx.size() * 4));
        CK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
    }
    CK(cudaMalloc(&y0, (size_t)WNV * 256 * 4));
    CK(cudaMalloc(&y1, (size_t)WNV * 256 * 4));
    CK(cudaMalloc(&y2, (size_t)WNV * 256 * 4));
    printf("| m | n | k_gemv | wide (clusters of %d) | bytes at 3.0 TB/s |\n| --- | --- | --- | --- | --- |\n", WS);
    int fails = 0;
    const int ms[2] = {64, 256}, ns[3] = {1, 8, 32};
    for (int m : ms)
        for (int n : ns) {
            const int64_t mat = (int64_t)m * K, ncopy = total / 4 / mat;
            auto base = [&](int i, float *out) {
                cuk_gemv_args a;
                memset(&a, 0, sizeof a);
                a.w_type = QT_F32, a.w = w + (int64_t)(i % ncopy) * mat, a.k = K, a.m = m, a.x = x;
                a.x_type = CUK_ACT_F32, a.ldx = K, a.n = n, a.y = out, a.ldy = m;
                g5_error e = {};
                if (cuk::gemv_run<QT_F32>(&a, 0, &e) != G5_OK) {
                    fprintf(stderr, "gemv: %s\n", e.msg);
                    exit(BENCH_EXIT);
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
                printf("FAIL m %d n %d: wide differs from k_gemv by %.3g (max %.3g)\n", m, n, e, mx);
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
