/* Small kernels around the GEMVs: RMSNorm, LayerNorm, interleaved RoPE, residual add, argmax.
 * Each follows the CPU reference's arithmetic (runtime/cpu_ops.c) closely enough for --check:
 * norm statistics in float64, products in the same order without contraction into FMAs. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "cuda/cuk_internal.cuh"

#define BAD(...) g5_fail(err, G5_ERR_INVALID_ARG, __VA_ARGS__)

namespace {

constexpr int NORM_THREADS = 256;

/* Sum over the CTA (blockDim.x == NORM_THREADS); every thread gets the total. */
__device__ double block_sum(double v, double *sh) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads(); /* sh may still be read from a previous call */
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    double t = 0.0;
    for (int i = 0; i < NORM_THREADS / 32; i++) t += sh[i]; /* fixed order: deterministic */
    return t;
}

/* RMSNorm. Grid: one CTA per row; block: 256 threads. Each thread sums x^2 (float64) over
 * elements tid, tid+256, ...; the CTA reduces, then each thread writes its elements
 * x * scale * w. */
__global__ void __launch_bounds__(NORM_THREADS)
    k_rms_norm(const float *x, int64_t ldx, const float *__restrict__ w, float *y, int64_t ldy,
               int64_t dim, float eps) {
    __shared__ double sh[NORM_THREADS / 32];
    const float *xr = x + (int64_t)blockIdx.x * ldx;
    float *yr = y + (int64_t)blockIdx.x * ldy;
    double ss = 0.0;
    for (int64_t i = threadIdx.x; i < dim; i += NORM_THREADS) ss += (double)xr[i] * xr[i];
    ss = block_sum(ss, sh);
    const float scale = (float)(1.0 / sqrt(ss / (double)dim + (double)eps));
    for (int64_t i = threadIdx.x; i < dim; i += NORM_THREADS)
        yr[i] = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
}

/* Residual add fused into the RMSNorm that follows it (the decode step's x += stage output;
 * h = norm(x)). Grid: one CTA per row; block: 256 threads. Each thread forms its elements
 * v = x + (b ? a + b : a) (the separate adds' order), writes v back to x and sums v^2; the
 * rest is k_rms_norm's arithmetic, so x and y equal cuk_add(s) followed by cuk_rms_norm. */
__global__ void __launch_bounds__(NORM_THREADS)
    k_add_rms_norm(float *x, int64_t ldx, const float *a, const float *b, int64_t lda,
                   const float *__restrict__ w, float *y, int64_t ldy, int64_t dim, float eps) {
    __shared__ double sh[NORM_THREADS / 32];
    float *xr = x + (int64_t)blockIdx.x * ldx;
    const float *ar = a + (int64_t)blockIdx.x * lda;
    const float *br = b ? b + (int64_t)blockIdx.x * lda : nullptr;
    float *yr = y + (int64_t)blockIdx.x * ldy;
    double ss = 0.0;
    for (int64_t i = threadIdx.x; i < dim; i += NORM_THREADS) {
        const float s = br ? __fadd_rn(ar[i], br[i]) : ar[i];
        const float v = __fadd_rn(xr[i], s);
        xr[i] = v;
        ss += (double)v * v;
    }
    ss = block_sum(ss, sh);
    const float scale = (float)(1.0 / sqrt(ss / (double)dim + (double)eps));
    for (int64_t i = threadIdx.x; i < dim; i += NORM_THREADS)
        yr[i] = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
}

/* LayerNorm. Grid: one CTA per row; block: 256 threads. Two strided passes for the float64
 * mean and biased variance (x re-read, cached), then each thread writes its elements
 * (float)((x - mean) * inv) * w + b. */
__global__ void __launch_bounds__(NORM_THREADS)
    k_layer_norm(const float *x, int64_t ldx, const float *__restrict__ w,
                 const float *__restrict__ b, float *y, int64_t ldy, int64_t dim, float eps) {
    __shared__ double sh[NORM_THREADS / 32];
    const float *xr = x + (int64_t)blockIdx.x * ldx;
    float *yr = y + (int64_t)blockIdx.x * ldy;
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < dim; i += NORM_THREADS) s += xr[i];
    const double mean = block_sum(s, sh) / (double)dim;
    double v = 0.0;
    for (int64_t i = threadIdx.x; i < dim; i += NORM_THREADS) {
        const double d = (double)xr[i] - mean;
        v += d * d;
    }
    const double var = block_sum(v, sh) / (double)dim;
    const double inv = 1.0 / sqrt(var + (double)eps);
    for (int64_t i = threadIdx.x; i < dim; i += NORM_THREADS) {
        const float t = (float)(((double)xr[i] - mean) * inv);
        yr[i] = __fadd_rn(__fmul_rn(t, w[i]), b[i]);
    }
}

constexpr int ROPE_MAX_PAIRS = 128;
struct RopeInv {
    float inv[ROPE_MAX_PAIRS];
};

/* RoPE. Grid-stride over (token, head, pair); block: 256 threads. Each thread rotates one
 * adjacent pair by pos[t] * inv[i] (angle in float32, cos/sin in float64 as the CPU does). */
__global__ void k_rope(float *x, int64_t n_tok, int64_t tok_stride, int64_t n_head,
                       int64_t head_stride, int64_t rot_off, int n_pairs,
                       const int32_t *__restrict__ pos, const RopeInv inv) {
    const int64_t total = n_tok * n_head * n_pairs;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int i = (int)(idx % n_pairs);
        const int64_t hh = (idx / n_pairs) % n_head, t = idx / ((int64_t)n_pairs * n_head);
        const float ang = __fmul_rn((float)pos[t], inv.inv[i]);
        double sd, cd;
        sincos((double)ang, &sd, &cd);
        const float c = (float)cd, s = (float)sd;
        float *p = x + t * tok_stride + hh * head_stride + rot_off + 2 * i;
        const float a = p[0], b = p[1];
        p[0] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
        p[1] = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
    }
}

/* Residual add. Grid-stride; block: 256 threads; each thread adds one element per step. */
__global__ void k_add(const float *a, const float *b, float *y, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = a[i] + b[i];
}

/* Argmax. Grid: one CTA per row; block: 256 threads. Each thread scans elements tid, tid+256,
 * ... keeping the largest non-NaN value and its lowest index; warps then the CTA reduce
 * (larger value wins, equal values: lower index). */
__device__ __forceinline__ void better(float &bv, int64_t &bi, float v, int64_t i) {
    if (i < 0) return;
    if (bi < 0 || v > bv || (v == bv && i < bi)) bv = v, bi = i;
}

__global__ void __launch_bounds__(NORM_THREADS)
    k_argmax(const float *__restrict__ x, int64_t ldx, int64_t n, int32_t *out) {
    __shared__ float sv[NORM_THREADS / 32];
    __shared__ int64_t si[NORM_THREADS / 32];
    const float *xr = x + (int64_t)blockIdx.x * ldx;
    float bv = 0.0f;
    int64_t bi = -1;
    for (int64_t i = threadIdx.x; i < n; i += NORM_THREADS) {
        const float v = xr[i];
        if (v == v) better(bv, bi, v, i); /* NaN never wins */
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
        const int64_t oi = __shfl_xor_sync(0xffffffffu, bi, off);
        better(bv, bi, ov, oi);
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) sv[warp] = bv, si[warp] = bi;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int j = 0; j < NORM_THREADS / 32; j++) better(bv, bi, sv[j], si[j]);
        out[blockIdx.x] = (int32_t)bi;
    }
}

unsigned grid_for(int64_t n, int threads) {
    const int64_t g = (n + threads - 1) / threads;
    return (unsigned)(g < 65536 ? (g > 0 ? g : 1) : 65536);
}

} // namespace

static g5_status check_rows(const char *what, const void *x, const void *y, int64_t ldx,
                            int64_t ldy, int64_t n_rows, int64_t dim, g5_error *err) {
    if (!x) return BAD("%s: x is NULL", what);
    if (!y) return BAD("%s: y is NULL", what);
    if (dim <= 0) return BAD("%s: dim=%lld must be positive", what, (long long)dim);
    if (n_rows <= 0 || n_rows > 0x7fffffff)
        return BAD("%s: n_rows=%lld outside 1..2^31-1", what, (long long)n_rows);
    if (ldx < dim) return BAD("%s: ldx=%lld < dim=%lld", what, (long long)ldx, (long long)dim);
    if (ldy < dim) return BAD("%s: ldy=%lld < dim=%lld", what, (long long)ldy, (long long)dim);
    return G5_OK;
}

extern "C" g5_status cuk_rms_norm(const float *x, int64_t ldx, const float *w, float *y,
                                  int64_t ldy, int64_t n_rows, int64_t dim, float eps,
                                  cuk_stream stream, g5_error *err) {
    g5_status st = check_rows("rms_norm", x, y, ldx, ldy, n_rows, dim, err);
    if (st != G5_OK) return st;
    if (!w) return BAD("rms_norm: w is NULL");
    if (!(eps >= 0.0f)) return BAD("rms_norm: eps=%g must be >= 0", (double)eps);
    k_rms_norm<<<(unsigned)n_rows, NORM_THREADS, 0, (cudaStream_t)stream>>>(x, ldx, w, y, ldy, dim, eps);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}

extern "C" g5_status cuk_add_rms_norm(float *x, int64_t ldx, const float *a, const float *b,
                                      int64_t lda, const float *w, float *y, int64_t ldy,
                                      int64_t n_rows, int64_t dim, float eps, cuk_stream stream,
                                      g5_error *err) {
    g5_status st = check_rows("add_rms_norm", x, y, ldx, ldy, n_rows, dim, err);
    if (st != G5_OK) return st;
    if (!a) return BAD("add_rms_norm: a is NULL");
    if (!w) return BAD("add_rms_norm: w is NULL");
    if (lda < dim) return BAD("add_rms_norm: lda=%lld < dim=%lld", (long long)lda, (long long)dim);
    if (y == x || y == a || (b && y == b)) return BAD("add_rms_norm: y aliases an input");
    if (!(eps >= 0.0f)) return BAD("add_rms_norm: eps=%g must be >= 0", (double)eps);
    k_add_rms_norm<<<(unsigned)n_rows, NORM_THREADS, 0, (cudaStream_t)stream>>>(x, ldx, a, b, lda, w, y, ldy, dim,
                                                                              eps);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}

extern "C" g5_status cuk_layer_norm(const float *x, int64_t ldx, const float *w, const float *b,
                                    float *y, int64_t ldy, int64_t n_rows, int64_t dim, float eps,
                                    cuk_stream stream, g5_error *err) {
    g5_status st = check_rows("layer_norm", x, y, ldx, ldy, n_rows, dim, err);
    if (st != G5_OK) return st;
    if (!w) return BAD("layer_norm: w is NULL");
    if (!b) return BAD("layer_norm: b is NULL");
    if (!(eps >= 0.0f)) return BAD("layer_norm: eps=%g must be >= 0", (double)eps);
    k_layer_norm<<<(unsigned)n_rows, NORM_THREADS, 0, (cudaStream_t)stream>>>(x, ldx, w, b, y, ldy, dim, eps);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}

extern "C" g5_status cuk_rope(float *x, int64_t n_tok, int64_t tok_stride, int64_t n_head,
                              int64_t head_stride, int64_t rot_off, int64_t n_rot, float theta,
                              const int32_t *pos, cuk_stream stream, g5_error *err) {
    if (!x) return BAD("rope: x is NULL");
    if (!pos) return BAD("rope: pos is NULL");
    if (n_rot < 2 || n_rot > 2 * ROPE_MAX_PAIRS || n_rot % 2)
        return BAD("rope: n_rot=%lld must be even and in 2..%d", (long long)n_rot, 2 * ROPE_MAX_PAIRS);
    if (n_tok < 1) return BAD("rope: n_tok=%lld must be positive", (long long)n_tok);
    if (n_head < 1) return BAD("rope: n_head=%lld must be positive", (long long)n_head);
    if (rot_off < 0) return BAD("rope: rot_off=%lld is negative", (long long)rot_off);
    if (n_head > 1 && head_stride < rot_off + n_rot)
        return BAD("rope: head_stride=%lld < rot_off + n_rot = %lld (heads would overlap)",
                   (long long)head_stride, (long long)(rot_off + n_rot));
    const int64_t tok_span = (n_head - 1) * head_stride + rot_off + n_rot;
    if (n_tok > 1 && tok_stride < tok_span)
        return BAD("rope: tok_stride=%lld < %lld (tokens would overlap)", (long long)tok_stride,
                   (long long)tok_span);
    if (!(theta > 0.0f)) return BAD("rope: theta=%g must be positive", (double)theta);
    RopeInv inv;
    const int n_pairs = (int)(n_rot / 2);
    for (int i = 0; i < n_pairs; i++)
        inv.inv[i] = 1.0f / powf(theta, (float)(2 * i) / (float)n_rot); /* as the CPU */
    const int64_t total = n_tok * n_head * n_pairs;
    k_rope<<<grid_for(total, 256), 256, 0, (cudaStream_t)stream>>>(
        x, n_tok, tok_stride, n_head, head_stride, rot_off, n_pairs, pos, inv);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}

extern "C" g5_status cuk_add(const float *a, const float *b, float *y, int64_t n,
                             cuk_stream stream, g5_error *err) {
    if (!a) return BAD("add: a is NULL");
    if (!b) return BAD("add: b is NULL");
    if (!y) return BAD("add: y is NULL");
    if (n <= 0) return BAD("add: n=%lld must be positive", (long long)n);
    k_add<<<grid_for(n, 256), 256, 0, (cudaStream_t)stream>>>(a, b, y, n);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}

extern "C" g5_status cuk_argmax(const float *x, int64_t ldx, int64_t n_rows, int64_t n,
                                int32_t *out, cuk_stream stream, g5_error *err) {
    if (!x) return BAD("argmax: x is NULL");
    if (!out) return BAD("argmax: out is NULL");
    if (n <= 0 || n > 0x7fffffff) return BAD("argmax: n=%lld outside 1..2^31-1", (long long)n);
    if (n_rows <= 0 || n_rows > 0x7fffffff)
        return BAD("argmax: n_rows=%lld outside 1..2^31-1", (long long)n_rows);
    if (ldx < n) return BAD("argmax: ldx=%lld < n=%lld", (long long)ldx, (long long)n);
    k_argmax<<<(unsigned)n_rows, NORM_THREADS, 0, (cudaStream_t)stream>>>(x, ldx, n, out);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}
