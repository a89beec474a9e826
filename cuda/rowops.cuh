/* Internal to cuda/: device helpers shared by the per-row kernels of ops.cu (norms, RoPE) and
 * model_ops.cu (the fused indexer preparation), so that a fused kernel does the same arithmetic
 * as the separate launches it replaces. */
#ifndef G5_ROWOPS_CUH
#define G5_ROWOPS_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "cuda/cuk_limits.h"

/* Sum over the 32 lanes by xor butterfly: every lane gets the same total, in an order fixed by
 * the lane layout alone. */
__device__ __forceinline__ double rowops_warp_sum(double v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

/* Max over the 32 lanes by xor butterfly (fmax: NaN loses, the order does not matter). */
__device__ __forceinline__ double rowops_warp_max(double v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

/* The fp16 operand's row scale (cuda/cuk_h16.h): e with mx * 2^e in [2^14, 2^15) for mx, the
 * row's largest magnitude, clamped to [-126, 126]; 0 for a row of zeros or with an infinity. */
__device__ __forceinline__ int rowops_h16_exp(float mx) {
    if (!(mx > 0.0f && mx <= 3.402823466e38f)) return 0;
    int ex;
    frexpf(mx, &ex); /* mx in [2^(ex - 1), 2^ex) */
    const int e = 15 - ex;
    return e < -126 ? -126 : e > 126 ? 126 : e;
}

/* v * 2^e rounded to fp16 (nearest even), as IEEE half bits */
__device__ __forceinline__ uint16_t rowops_h16_of(float v, int e) { return __half_as_ushort(__float2half_rn(ldexpf(v, e))); }

/* cos/sin of RoPE pair i at position pos: the angle pos * inv_i in float32, cos and sin in
 * float64 of that float (the CPU reference's arithmetic), rounded to float. */
__device__ __forceinline__ float2 rowops_rope_cs(int32_t pos, float inv) {
    const float ang = __fmul_rn((float)pos, inv);
    double sd, cd;
    sincos((double)ang, &sd, &cd);
    return make_float2((float)cd, (float)sd);
}

/* inv_i = 1 / theta^(2i / n_rot) for the n_rot / 2 pairs, on the host with powf as the CPU does:
 * the table every RoPE launch passes to its kernel. Returns the number of pairs. */
static inline int rowops_rope_inv(float theta, int n_rot, float *inv) {
    const int n_pairs = n_rot / 2;
    for (int i = 0; i < n_pairs; i++) inv[i] = 1.0f / powf(theta, (float)(2 * i) / (float)n_rot);
    return n_pairs;
}

/* Rotates the adjacent pair (a, b) by cs = (cos, sin), no contraction into FMAs. */
__device__ __forceinline__ void rowops_rope_rot(float &a, float &b, float2 cs) {
    const float x = a, y = b;
    a = __fsub_rn(__fmul_rn(x, cs.x), __fmul_rn(y, cs.y));
    b = __fadd_rn(__fmul_rn(x, cs.y), __fmul_rn(y, cs.x));
}

/* silu(g) * u: g / (1 + e^-g) in float32 (expf), then the product rounded on its own. */
__device__ __forceinline__ float rowops_silu_mul(float g, float u) {
    const float s = g / (1.0f + expf(-g));
    return __fmul_rn(s, u);
}

/* Elements e0 .. e0 + 3 of row r, those < dim (the others read as 0 / not written); vec: r
 * is 16-byte aligned, so a whole chunk moves as one float4. */
__device__ __forceinline__ float4 rowops_ld4(const float *r, int64_t e0, int64_t dim, bool vec) {
    if (vec && e0 + 4 <= dim) return *(const float4 *)(r + e0);
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (e0 < dim) v.x = r[e0];
    if (e0 + 1 < dim) v.y = r[e0 + 1];
    if (e0 + 2 < dim) v.z = r[e0 + 2];
    if (e0 + 3 < dim) v.w = r[e0 + 3];
    return v;
}

__device__ __forceinline__ void rowops_st4(float *r, int64_t e0, int64_t dim, bool vec, float4 v) {
    if (vec && e0 + 4 <= dim) {
        *(float4 *)(r + e0) = v;
        return;
    }
    if (e0 < dim) r[e0] = v.x;
    if (e0 + 1 < dim) r[e0 + 1] = v.y;
    if (e0 + 2 < dim) r[e0 + 2] = v.z;
    if (e0 + 3 < dim) r[e0 + 3] = v.w;
}

/* One LayerNorm chunk of up to 4 elements e0 .. e0 + 3 (those < dim) of a row: the float64 sum
 * of the elements, in element order. */
__device__ __forceinline__ double rowops_chunk_sum(float4 v, int64_t e0, int64_t dim) {
    double s = 0.0;
    if (e0 < dim) s += (double)v.x;
    if (e0 + 1 < dim) s += (double)v.y;
    if (e0 + 2 < dim) s += (double)v.z;
    if (e0 + 3 < dim) s += (double)v.w;
    return s;
}

/* The float64 sum of (x - mean)^2 over the chunk's elements < dim, in element order. */
__device__ __forceinline__ double rowops_chunk_var(float4 v, int64_t e0, int64_t dim, double mean) {
    double s = 0.0, d;
    if (e0 < dim) d = (double)v.x - mean, s = __dadd_rn(s, __dmul_rn(d, d));
    if (e0 + 1 < dim) d = (double)v.y - mean, s = __dadd_rn(s, __dmul_rn(d, d));
    if (e0 + 2 < dim) d = (double)v.z - mean, s = __dadd_rn(s, __dmul_rn(d, d));
    if (e0 + 3 < dim) d = (double)v.w - mean, s = __dadd_rn(s, __dmul_rn(d, d));
    return s;
}

/* The float64 sum of squares over the chunk's elements < dim (each square is exact). */
__device__ __forceinline__ double rowops_chunk_sq(float4 v, int64_t e0, int64_t dim) {
    double s = 0.0;
    if (e0 < dim) s += (double)v.x * v.x;
    if (e0 + 1 < dim) s += (double)v.y * v.y;
    if (e0 + 2 < dim) s += (double)v.z * v.z;
    if (e0 + 3 < dim) s += (double)v.w * v.w;
    return s;
}

/* The norm launches' split of a row of dim floats (ops.cu's norm_rows): cs CTAs (one cluster) of
 * `threads` threads, one float4 chunk a thread up to ROWOPS_NT * CUK_NORM_CLUSTER_MAX chunks (dim
 * 8192), more chunks a thread past that. It fixes the order of a row's sums, hence their bits:
 * rowops_rms_scale follows it. */
constexpr int ROWOPS_NT = 256;
struct RowopsShape {
    int cs, threads;
};
__host__ __device__ inline RowopsShape rowops_norm_shape(int64_t dim) {
    const int64_t nch = (dim + 3) / 4;
    if (nch <= ROWOPS_NT) return {1, (int)((nch + 31) / 32 * 32)};
    const int64_t cs = (nch + ROWOPS_NT - 1) / ROWOPS_NT;
    return {(int)(cs < CUK_NORM_CLUSTER_MAX ? cs : CUK_NORM_CLUSTER_MAX), ROWOPS_NT};
}

/* Doubles of shared memory rowops_rms_scale takes. */
constexpr int ROWOPS_RMS_SH = CUK_NORM_CLUSTER_MAX * (ROWOPS_NT / 32);

/* RMSNorm's scale, (float)(1 / sqrt(mean(x^2) + eps)), of the row x (dim floats, 16-byte aligned)
 * with the bits of the norm launches: sh = rowops_norm_shape(dim)'s cs CTAs of nt threads, thread
 * g summing its chunks g, g + cs nt, .. in double, then lanes by butterfly, warps in index order,
 * CTAs in rank order (ops.cu's row_sum). One CTA of ROWOPS_NT threads plays the cs CTAs in turn,
 * thread t being thread t of each. red: ROWOPS_RMS_SH doubles of shared memory. Every thread of
 * the CTA calls it and gets the scale; it ends with a barrier, so red may be reused at once. */
__device__ inline float rowops_rms_scale(const float *x, int64_t dim, float eps, RowopsShape sh, double *red) {
    const int t = (int)threadIdx.x, nw = sh.threads / 32;
    const int64_t P = (int64_t)sh.cs * sh.threads;
    for (int c = 0; c < sh.cs; c++) {
        double s = 0.0;
        if (t < sh.threads)
            for (int64_t e0 = ((int64_t)c * sh.threads + t) * 4; e0 < dim; e0 += 4 * P)
                s += rowops_chunk_sq(rowops_ld4(x, e0, dim, true), e0, dim);
        s = rowops_warp_sum(s);
        if ((t & 31) == 0 && (t >> 5) < nw) red[c * (ROWOPS_NT / 32) + (t >> 5)] = s;
    }
    __syncthreads();
    double tot = 0.0;
    for (int c = 0; c < sh.cs; c++) {
        double tc = red[c * (ROWOPS_NT / 32)];
        for (int i = 1; i < nw; i++) tc += red[c * (ROWOPS_NT / 32) + i];
        tot = c == 0 ? tc : tot + tc;
    }
    __syncthreads();
    return (float)(1.0 / sqrt(tot / (double)dim + (double)eps));
}

/* LayerNorm output of one element: (float)((x - mean) * inv) * w + b. */
__device__ __forceinline__ float rowops_ln_out(float x, double mean, double inv, float w, float b) {
    const float t = (float)(((double)x - mean) * inv);
    return __fadd_rn(__fmul_rn(t, w), b);
}

#endif
