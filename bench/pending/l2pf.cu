// L2 prefetch microbenchmark (session 32, bench/RESULTS.md; not part of the build:
//   nvcc -O3 -arch=sm_90 -o l2pf bench/pending/l2pf.cu -cudart static): does a bulk L2 prefetch (evict_last or normal) of W survive
// streaming reads of other data, and how fast is a later full read of W then?
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s line %d\n", cudaGetErrorString(e), __LINE__); return 1; } } while (0)
__global__ void rd(const uint4 *p, size_t n, unsigned *out) {
    unsigned acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint4 v = __ldg(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) out[0] = acc;
}
__global__ void pf(const uint8_t *p, uint64_t bytes, int last, uint64_t CH) {
    const uint64_t nch = (bytes + CH - 1) / CH, step = (uint64_t)gridDim.x * blockDim.x;
    uint64_t pol = 0;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
    for (uint64_t c = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; c < nch; c += step) {
        const uint64_t off = c * CH;
        const uint32_t sz = (uint32_t)(bytes - off < CH ? bytes - off : CH);
        if (last == 2) { for (uint64_t o = off; o < off + sz; o += 128) asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(p + o)); }
        else if (last) asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(p + off), "r"(sz), "l"(pol) : "memory");
        else asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"(sz) : "memory");
    }
}
__global__ void spin(long long cyc) { long long t0 = clock64(); while (clock64() - t0 < cyc) {} }
int main() {
    const size_t MB = 1 << 20, WB = 69 * MB, SB = 400 * MB, FB = 256 * MB;
    uint8_t *w, *s, *f; unsigned *o;
    CK(cudaMalloc(&w, WB)); CK(cudaMalloc(&s, SB)); CK(cudaMalloc(&f, FB)); CK(cudaMalloc(&o, 4));
    CK(cudaMemset(w, 1, WB)); CK(cudaMemset(s, 2, SB)); CK(cudaMemset(f, 3, FB));
    int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    cudaStream_t st; CK(cudaStreamCreate(&st));
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    auto read = [&](const uint8_t *p, size_t bytes) { rd<<<sms * 4, 512, 0, st>>>((const uint4 *)p, bytes / 16, o); };
    auto flush = [&]() { read(f, FB); };
    printf("device SMs %d\n", sms);
    auto timed = [&](const uint8_t *p, size_t bytes) { cudaEventRecord(a, st); read(p, bytes); cudaEventRecord(b, st); cudaStreamSynchronize(st); float ms; cudaEventElapsedTime(&ms, a, b); return ms * 1e3f; };
    for (int mb : {16, 25, 40}) { float c = 1e9f, h = 1e9f; for (int r = 0; r < 5; r++) { flush(); float t1 = timed(w, mb * MB); float t2 = timed(w, mb * MB); if (t1 < c) c = t1; if (t2 < h) h = t2; }
        printf("read %d MB: cold %.1f us, again %.1f us\n", mb, c, h); }
    const uint64_t chs[] = {4096, 65536};
    for (int last = 0; last <= 2; last++) for (uint64_t ch : chs) for (int mb : {25, 40}) {
        if (last == 2 && ch != 4096) continue;
        float best = 1e9f;
        for (int rep = 0; rep < 5; rep++) { flush(); pf<<<(last == 2 ? 264 : 32), (last == 2 ? 256 : 32), 0, st>>>(w, (uint64_t)mb * MB, last, ch); spin<<<1, 1, 0, st>>>(100000); float t = timed(w, mb * MB); if (t < best) best = t; }
        printf("policy %d chunk %llu: prefetch %d MB, then read it: %.1f us\n", last, (unsigned long long)ch, mb, best);
    }
    // 2) W (69 MB, attn_output's size): prefetch a part of it (64 KB chunks), spin ~35 us, stream X MB
    //    of other data (normal priority), then time one read of all of W
    const int fr[] = {0, 25, 40, 69};
    const int strm[] = {0, 34, 80, 180};
    for (int last = 1; last >= 0; last--)
        for (int fi = 0; fi < 4; fi++)
            for (int si = 0; si < 4; si++) {
                if (fr[fi] == 0 && (last == 0 || si > 0)) continue;
                float best = 1e9f;
                for (int rep = 0; rep < 5; rep++) {
                    flush();
                    if (fr[fi]) pf<<<32, 32, 0, st>>>(w, (uint64_t)fr[fi] * MB, last, 65536);
                    spin<<<1, 1, 0, st>>>(60000);
                    if (strm[si]) read(s + (rep % 2) * 200 * MB, (size_t)strm[si] * MB);
                    float t = timed(w, WB);
                    if (t < best) best = t;
                }
                printf("policy %-6s prefetch %2d MB, stream %3d MB between: W (69 MB) read %.1f us\n",
                       last ? "last" : "normal", fr[fi], strm[si], best);
            }
    // prefetch time itself: prefetch 69 MB then read (no spin)
    CK(cudaGetLastError());
    printf("done\n");
    return 0;
}
