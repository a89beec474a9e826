/* What a chain of small dependent kernels costs in one captured graph, and what programmatic
 * dependent launch (PDL: griddepcontrol, Hopper) buys: the question behind the decode step's
 * ~30 launches per layer (issue 14; bench/RESULTS.md session 8 tried PDL with the wait first in
 * every kernel and lost 20%). A chain of NK GEMV-like kernels, each reading its own weights
 * (float32 rows of K) and the previous kernel's output as x, one warp per row, is captured once
 * and replayed; us per kernel for
 *   plain        ordinary launches (graph edges as the decode step has them today)
 *   pdl-wait     PDL launches, griddepcontrol.wait first, then the weights (session 8's form)
 *   pdl-pre      PDL launches, the row's weights loaded into registers first, then
 *                launch_dependents and the wait, then x (the form a GEMV could take)
 *   pdl-l2       PDL launches, the row's weights prefetched into L2 first, then
 *                launch_dependents and the wait, then weights and x read as plain does
 *   empty, empty-pdl   the same chain with no weights (the launch floor, without and with PDL)
 * at weights of 0.5, 2 and 8 MB per kernel, against the byte time at the D2D copy rate of the
 * same run. The PDL chains' final outputs must equal the plain chain's bit for bit (a misplaced
 * wait reads a stale x). Usage: bench_pdl [replays] */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/status.h"

#include "tests/gpu/bench_util.h"

enum { K = 2048, NK = 240, THREADS = 256, ROWS_PER_CTA = THREADS / 32, PER_LANE = K / 32 };

typedef enum { V_PLAIN, V_PDL_WAIT, V_PDL_PRE, V_PDL_L2, V_EMPTY, V_EMPTY_PDL, N_V } variant;
static const char *const VNAME[N_V] = {"plain", "pdl-wait", "pdl-pre", "pdl-l2", "empty", "empty-pdl"};

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_launch() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

/* Grid: m / ROWS_PER_CTA CTAs; warp = one row of w [m][K]; lane l sums elements l + 32 j. MODE 0:
 * no PDL; 1: wait first; 2: weights first (into registers), then trigger and wait; 3: the row's
 * weights prefetched into L2 (prefetch.global.L2, one 128-byte line a lane a step), then trigger
 * and wait, then the weights read as in MODE 0 (the form any kernel could take without holding
 * its weights in registers). y[row] = w[row] . x (x = the previous kernel's y, its first K
 * elements). */
template <int MODE>
__global__ void __launch_bounds__(THREADS) k_chain(const float *__restrict__ w, const float *x, float *y, int m) {
    const int lane = threadIdx.x & 31, row = blockIdx.x * ROWS_PER_CTA + (threadIdx.x >> 5);
    if (MODE == 1) {
        pdl_wait();
        pdl_launch();
    }
    float wv[PER_LANE];
    const float *wr = w + (int64_t)(row < m ? row : m - 1) * K;
    if (MODE == 3) {
        for (int c = lane; c < K / 32; c += 32) /* the row's 128-byte lines */
            asm volatile("prefetch.global.L2 [%0];" ::"l"(wr + 32 * c));
        pdl_launch();
        pdl_wait();
    }
#pragma unroll
    for (int j = 0; j < PER_LANE; j++) wv[j] = __ldg(wr + lane + 32 * j);
    if (MODE == 2) {
        pdl_launch();
        pdl_wait();
    }
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < PER_LANE; j++) acc = fmaf(wv[j], x[lane + 32 * j], acc);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0 && row < m) y[row] = acc;
}

/* One CTA: y[i] = x[i] + 1 for i < K (the dependency, no weights). */
template <int PDL> __global__ void __launch_bounds__(THREADS) k_empty(const float *x, float *y) {
    if (PDL) {
        pdl_launch();
        pdl_wait();
    }
    for (int i = threadIdx.x; i < K; i += THREADS) y[i] = x[i] + 1.0f;
}

static void launch(variant v, const float *w, const float *x, float *y, int m, cudaStream_t st) {
    const int pdl = v == V_PDL_WAIT || v == V_PDL_PRE || v == V_PDL_L2 || v == V_EMPTY_PDL;
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(v == V_EMPTY || v == V_EMPTY_PDL ? 1u : (unsigned)(m / ROWS_PER_CTA), 1, 1);
    cfg.blockDim = dim3(THREADS, 1, 1);
    cfg.stream = st;
    cfg.attrs = pdl ? &at : NULL;
    cfg.numAttrs = pdl ? 1 : 0;
    switch (v) {
    case V_PLAIN: CK(cudaLaunchKernelEx(&cfg, k_chain<0>, w, x, y, m)); break;
    case V_PDL_WAIT: CK(cudaLaunchKernelEx(&cfg, k_chain<1>, w, x, y, m)); break;
    case V_PDL_PRE: CK(cudaLaunchKernelEx(&cfg, k_chain<2>, w, x, y, m)); break;
    case V_PDL_L2: CK(cudaLaunchKernelEx(&cfg, k_chain<3>, w, x, y, m)); break;
    case V_EMPTY: CK(cudaLaunchKernelEx(&cfg, k_empty<0>, x, y)); break;
    default: CK(cudaLaunchKernelEx(&cfg, k_empty<1>, x, y)); break;
    }
}

/* The chain as one graph: kernel i reads buf[i % 2] and writes buf[(i + 1) % 2]; buf[0] is set
 * from seed first (a copy node), so every replay computes the same values. */
static cudaGraphExec_t capture(variant v, float *const *wk, float *const *buf, const float *seed, int m,
                               cudaStream_t st) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    CK(cudaMemcpyAsync(buf[0], seed, (size_t)(m > K ? m : K) * 4, cudaMemcpyDeviceToDevice, st));
    for (int i = 0; i < NK; i++) launch(v, wk[i], buf[i % 2], buf[(i + 1) % 2], m, st);
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphDestroy(g));
    return ge;
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 20;
    if (reps < 1) {
        fprintf(stderr, "usage: bench_pdl [replays >= 1]\n");
        return 2;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("bench_pdl: %s, %d SMs; chain of %d kernels, x of %d floats, %d replays\n", prop.name,
           prop.multiProcessorCount, NK, K, reps);
    const double gbs = bench_copy_gbs();
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    static const int MS[] = {64, 256, 1024}; /* 0.5, 2, 8 MB of weights per kernel */
    int fails = 0;
    printf("| weights per kernel | byte time us |");
    for (int v = 0; v < N_V; v++) printf(" %s |", VNAME[v]);
    printf(" (us per kernel) |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (size_t mi = 0; mi < sizeof MS / sizeof MS[0]; mi++) {
        const int m = MS[mi];
        const size_t wbytes = (size_t)m * K * 4;
        /* distinct weights per kernel (NK x 8 MB = 1.9 GB at the largest: nothing stays in L2) */
        float **wk = (float **)malloc(NK * sizeof *wk);
        float *hw = (float *)malloc(wbytes);
        for (size_t i = 0; i < (size_t)m * K; i++) hw[i] = (float)((i * 2654435761u) % 1000) * 1e-6f - 5e-4f;
        for (int i = 0; i < NK; i++) { /* each kernel's own weights, so a stale x changes the output */
            hw[i % (m * K)] += 1e-3f;
            wk[i] = (float *)dup_d(hw, wbytes);
        }
        const size_t bb = (size_t)(m > K ? m : K) * 4;
        float *hs = (float *)malloc(bb);
        for (size_t i = 0; i < bb / 4; i++) hs[i] = (float)(i % 17) * 0.25f - 2.0f;
        float *seed = (float *)dup_d(hs, bb);
        float *buf[2] = {(float *)dup_d(hs, bb), (float *)dup_d(hs, bb)}; /* x past a kernel's m rows: the seed */
        double us[N_V];
        float *out[N_V];
        for (int v = 0; v < N_V; v++) {
            cudaGraphExec_t ge = capture((variant)v, wk, buf, seed, m, st);
            CK(cudaGraphLaunch(ge, st)); /* warm */
            CK(cudaEventRecord(e0, st));
            for (int r = 0; r < reps; r++) CK(cudaGraphLaunch(ge, st));
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            us[v] = ms * 1e3 / reps / NK;
            out[v] = (float *)malloc(bb);
            CK(cudaMemcpy(out[v], buf[NK % 2], bb, cudaMemcpyDeviceToHost));
            CK(cudaGraphExecDestroy(ge));
        }
        const int same = !memcmp(out[V_PLAIN], out[V_PDL_WAIT], (size_t)m * 4) &&
                         !memcmp(out[V_PLAIN], out[V_PDL_PRE], (size_t)m * 4) &&
                         !memcmp(out[V_PLAIN], out[V_PDL_L2], (size_t)m * 4) &&
                         !memcmp(out[V_EMPTY], out[V_EMPTY_PDL], (size_t)K * 4);
        if (!same) fails++;
        printf("| %.1f MB, %d CTAs | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %s |\n", wbytes / 1048576.0,
               m / ROWS_PER_CTA, wbytes / (gbs * 1e9) * 1e6, us[V_PLAIN], us[V_PDL_WAIT], us[V_PDL_PRE], us[V_PDL_L2],
               us[V_EMPTY], us[V_EMPTY_PDL], same ? "outputs equal" : "OUTPUTS DIFFER");
        for (int v = 0; v < N_V; v++) free(out[v]);
        for (int i = 0; i < NK; i++) CK(cudaFree(wk[i]));
        CK(cudaFree(seed));
        CK(cudaFree(buf[0]));
        CK(cudaFree(buf[1]));
        free(wk), free(hw), free(hs);
    }
    printf("(byte time: the weights at the D2D copy rate, as bench/decode.sh's floor)\n");
    printf("bench_pdl: %s\n", fails ? "FAILED (a PDL chain's output differs)" : "ok");
    return fails ? 1 : 0;
}
