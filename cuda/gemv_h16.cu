/* fp16 tensor-core products for batched fast-mode decode (API and numerics: cuda/cuk_h16.h).
 *
 * Why: k_gemv_q8t keeps a batched row's bits equal to the dp4a kernel's one-row bits, so it redoes
 * that kernel's per-unit float work (unit_k4 and the residue sums) for every column; at 32 vectors
 * that work, not the weight bytes, is its time (attn_output 6144 x 16384 Q5_K: 170 us for 69 MB
 * on the H100). Here each weight is decoded once per block of 16 rows and serves every column
 * through the mma: 64 us there in bench/pending/h16bench.cu's prototype (session 40).
 *
 * k_gemv_h16, grid ceil(m / 16) CTAs of CUK_H16_KW warps: CTA b takes rows 16 b .. + 15, warp ks
 * the 256-element blocks ks, ks + KW, .. in order (the next one loaded into registers while this
 * one multiplies). Lane l (g = l / 4, c = l % 4) decodes rows g and g + 8: of each 32-byte quant
 * group j (Q5_K: with its high-bit bytes 8c..8c+7) bytes 8c..8c+7, whose low and high nibbles are
 * elements 64 j + 8 c .. + 7 and 64 j + 32 + 8 c .. + 7. An m16n8k16 chunk is one nibble half of
 * 4 of those bytes per lane: its k order is permuted so that the lane's A pieces (mma k 2c, 2c+1,
 * 2c+8, 2c+9) are those 4 consecutive elements, and its B pieces (x of column g) the same 4
 * elements, one 8-byte load. Column tile t: x column 8 t + g as B, C columns 8 t + 2 c, + 1. */
#include <cuda_fp16.h>
#include <stdint.h>

#include "cuda/cuk_h16.h"
#include "cuda/cuk_internal.cuh"
#include "cuda/mma.cuh"
#include "cuda/q8_load.cuh"
#include "cuda/rowops.cuh"
#include "format/quant.h"

#define BAD(...) g5_fail(err, G5_ERR_INVALID_ARG, __VA_ARGS__)

namespace {

using cuk::q8l::K4Hdr;
using cuk::q8l::k4_scale_of;
using cuk::q8l::k4_unpack;
using cuk::q8l::ldg128;
using cuk::q8l::ldg64;
using cuk::mma_f16;

constexpr int KW = CUK_H16_KW;

/* One 256-element block of the lane's two rows: the 16-byte header, Q5_K's high-bit bytes
 * 8c..8c+7, bytes 8c..8c+7 of each quant group. */
template <int T> struct Blk {
    static constexpr int BYTES = T == QT_Q5_K ? 176 : 144, QOFF = T == QT_Q5_K ? 48 : 16;
    uint4 h[2];
    uint2 qh[2];
    uint2 q[2][4];
    __device__ __forceinline__ void load(const uint8_t *const (&rp)[2], int64_t s, int c) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const uint8_t *bp = rp[r] + s * BYTES;
            h[r] = ldg128(bp);
            if (T == QT_Q5_K) qh[r] = ldg64(bp + 16 + 8 * c);
#pragma unroll
            for (int j = 0; j < 4; j++) q[r][j] = ldg64(bp + QOFF + 32 * j + 8 * c);
        }
    }
};

__device__ __forceinline__ uint32_t h2u(__half2 v) { return *(const uint32_t *)&v; }

/* Quant byte i of v as a float: 0x4B0000qq is 2^23 + q exactly */
template <int I> __device__ __forceinline__ float qf(uint32_t v) {
    return __fsub_rn(__uint_as_float(__byte_perm(v, 0x4B00u, 0x5440u | I)), 8388608.0f);
}

/* The 4 quants of v (bytes, each < 32) as weights fp16(d1 q - m1): (q0, q1) in lo, (q2, q3) in hi */
__device__ __forceinline__ void deq4(uint32_t v, float d1, float nm1, uint32_t &lo, uint32_t &hi) {
    lo = h2u(__floats2half2_rn(__fmaf_rn(qf<0>(v), d1, nm1), __fmaf_rn(qf<1>(v), d1, nm1)));
    hi = h2u(__floats2half2_rn(__fmaf_rn(qf<2>(v), d1, nm1), __fmaf_rn(qf<3>(v), d1, nm1)));
}

/* Block s of the lane's rows times its column tiles, into C (the top comment's order). */
template <int T, int NT>
__device__ __forceinline__ void block_mma(const Blk<T> &b, const __half *const (&xc)[NT], int64_t s, float (&C)[NT][4]) {
    const K4Hdr kh[2] = {k4_unpack(b.h[0]), k4_unpack(b.h[1])};
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int sb = 2 * j + h;
            uint32_t A[2][4]; /* per 4-byte half of the lane's bytes, the A fragment (cuda/mma.cuh's order) */
#pragma unroll
            for (int r = 0; r < 2; r++) { /* rows g, g + 8 */
                float d1, m1;
                k4_scale_of(kh[r], sb, d1, m1);
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    uint32_t v = ((hf ? b.q[r][j].y : b.q[r][j].x) >> (4 * h)) & 0x0F0F0F0Fu;
                    if (T == QT_Q5_K) v |= (((hf ? b.qh[r].y : b.qh[r].x) >> sb) & 0x01010101u) << 4;
                    deq4(v, d1, -m1, A[hf][r], A[hf][2 + r]);
                }
            }
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const uint4 x = ldg128(xc[t] + s * 256 + 64 * j + 32 * h);
                mma_f16(C[t], A[0], x.x, x.y);
                mma_f16(C[t], A[1], x.z, x.w);
            }
        }
}

/* The lane's two rows of the CTA's 16-row tile (g, g + 8; past m the last row, read but never
 * stored by tile_finish). */
__device__ __forceinline__ void tile_rows(const uint8_t *w, int64_t rb, int64_t m, int g, const uint8_t *(&rp)[2]) {
    const int64_t row0 = (int64_t)blockIdx.x * 16;
    rp[0] = w + (row0 + g < m ? row0 + g : m - 1) * rb;
    rp[1] = w + (row0 + g + 8 < m ? row0 + g + 8 : m - 1) * rb;
}

/* Warp ks's blocks ks, ks + KW, .. of the lane's rows in order, each given to step(block, s) while
 * the next one loads into registers. */
template <int T, typename Step>
__device__ __forceinline__ void tile_blocks(const uint8_t *const (&rp)[2], int steps, int ks, int c, Step step) {
    Blk<T> cur;
    if (ks < steps) cur.load(rp, ks, c);
    for (int s = ks; s < steps; s += KW) {
        Blk<T> nxt;
        if (s + KW < steps) nxt.load(rp, s + KW, c);
        step(cur, s);
        cur = nxt;
    }
}

/* The W warps' partials of a tile (C: this warp's) added in warp order by warp 0, times each
 * column's 2^-e, into y. Every thread of the CTA calls it. */
template <int NT, int W>
__device__ __forceinline__ void tile_finish(const float (&C)[NT][4], float (*red)[NT * 4][32],
                                            const float *__restrict__ unscale, int64_t row0, int64_t m, int n,
                                            float *__restrict__ y, int64_t ldy) {
    const int lane = threadIdx.x & 31, ks = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int e = 0; e < 4; e++) red[ks][4 * t + e][lane] = C[t][e];
    __syncthreads();
    if (ks != 0) return;
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float v = red[0][4 * t + e][lane];
#pragma unroll
            for (int q = 1; q < W; q++) v = __fadd_rn(v, red[q][4 * t + e][lane]);
            const int64_t row = row0 + g + 8 * (e >> 1);
            const int col = 8 * t + 2 * c + (e & 1);
            if (row < m && col < n) y[(int64_t)col * ldy + row] = __fmul_rn(v, unscale[col]);
        }
}

/* The GEMV (grid and lanes: the top comment). NT column tiles of 8 (n <= 8 NT). */
template <int T, int NT>
__global__ void __launch_bounds__(KW * 32, 16 / KW)
    k_gemv_h16(const uint8_t *__restrict__ w, int64_t rb, int64_t m, int steps, const __half *__restrict__ x,
               int64_t ldx, const float *__restrict__ unscale, int n, float *__restrict__ y, int64_t ldy) {
    __shared__ float red[KW][NT * 4][32];
    const int lane = threadIdx.x & 31, ks = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const uint8_t *rp[2];
    tile_rows(w, rb, m, g, rp);
    const __half *xc[NT]; /* column 8 t + g's x (a copy of the last column past n, never stored) */
#pragma unroll
    for (int t = 0; t < NT; t++) xc[t] = x + (int64_t)(8 * t + g < n ? 8 * t + g : n - 1) * ldx + 8 * c;
    float C[NT][4] = {};
    tile_blocks<T>(rp, steps, ks, c, [&](const Blk<T> &b, int s) { block_mma<T, NT>(b, xc, s, C); });
    tile_finish<NT, KW>(C, red, unscale, (int64_t)blockIdx.x * 16, m, n, y, ldy);
}

/* cuk_h16_prep: one CTA of 256 threads a row; the largest magnitude by a block max (fmaxf: its
 * result does not depend on the order), then every element scaled and rounded. */
__global__ void __launch_bounds__(256) k_h16_prep(const float *__restrict__ x, int64_t ldx, int64_t k,
                                                  uint16_t *__restrict__ xh, int64_t ldxh, float *__restrict__ unscale) {
    __shared__ float wmax[8];
    const float *xr = x + (int64_t)blockIdx.x * ldx;
    float mx = 0.0f;
    for (int64_t i = threadIdx.x; i < k; i += 256) mx = fmaxf(mx, fabsf(xr[i]));
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    if ((threadIdx.x & 31) == 0) wmax[threadIdx.x >> 5] = mx;
    __syncthreads();
    mx = wmax[0];
#pragma unroll
    for (int i = 1; i < 8; i++) mx = fmaxf(mx, wmax[i]);
    const int e = rowops_h16_exp(mx);
    uint16_t *o = xh + (int64_t)blockIdx.x * ldxh;
    for (int64_t i = threadIdx.x; i < k; i += 256) o[i] = rowops_h16_of(xr[i], e);
    if (threadIdx.x == 0) unscale[blockIdx.x] = ldexpf(1.0f, -e);
}

template <int T>
g5_status launch(const cuk_gemv_h16_args *a, int64_t rb, cudaStream_t st, g5_error *err) {
    const unsigned grid = (unsigned)((a->m + 15) / 16);
    const int steps = (int)(a->k / 256);
    const __half *x = (const __half *)a->x.x;
    for (int64_t v0 = 0; v0 < a->n; v0 += CUK_H16_MAX_N) { /* the bits do not depend on the split */
        const int nv = (int)(a->n - v0 < CUK_H16_MAX_N ? a->n - v0 : CUK_H16_MAX_N);
        const __half *xv = x + v0 * a->x.ldx;
        const float *us = a->x.unscale + v0;
        float *yv = a->y + v0 * a->ldy;
        const auto fn = nv <= 8 ? k_gemv_h16<T, 1> : nv <= 16 ? k_gemv_h16<T, 2> : k_gemv_h16<T, 4>;
        fn<<<grid, KW * 32, 0, st>>>((const uint8_t *)a->w, rb, a->m, steps, xv, a->x.ldx, us, nv, yv, a->ldy);
        CUK_CHECK(cudaGetLastError());
    }
    return G5_OK;
}

} // namespace

extern "C" int cuk_h16_takes(uint32_t type, int64_t k) {
    return (type == QT_Q4_K || type == QT_Q5_K) && k >= 256 && k % 256 == 0 && k <= ((int64_t)1 << 30);
}

extern "C" g5_status cuk_h16_prep(const cuk_h16_prep_args *a, cuk_stream stream, g5_error *err) {
    if (!a || !a->x || !a->xh || !a->unscale) return BAD("h16_prep: NULL argument");
    if (a->k < 1 || a->n < 1 || a->n > 0x7fffffff || a->ldx < a->k || a->ldxh < a->k)
        return BAD("h16_prep: k=%lld n=%lld ldx=%lld ldxh=%lld", (long long)a->k, (long long)a->n, (long long)a->ldx,
                   (long long)a->ldxh);
    k_h16_prep<<<(unsigned)a->n, 256, 0, (cudaStream_t)stream>>>(a->x, a->ldx, a->k, a->xh, a->ldxh,
                                                                 a->unscale);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}

extern "C" g5_status cuk_gemv_h16(const cuk_gemv_h16_args *a, cuk_stream stream, g5_error *err) {
    if (!a || !a->w || !a->x.x || !a->x.unscale || !a->y) return BAD("gemv_h16: NULL argument");
    if (!cuk_h16_takes(a->type, a->k))
        return g5_fail(err, G5_ERR_UNSUPPORTED, "gemv_h16: no fp16 kernel for %s at k = %lld",
                       quant_type_name(a->type), (long long)a->k);
    if (a->m < 1 || a->m > ((int64_t)1 << 34) || a->n < 1 || a->ldy < a->m || a->x.ldx < a->k || a->x.ldx % 8 ||
        ((uintptr_t)a->x.x & 15) || ((uintptr_t)a->w & 15))
        return BAD("gemv_h16: m=%lld n=%lld ldy=%lld ldx=%lld (a multiple of 8 >= k = %lld; x and w 16-byte aligned)",
                   (long long)a->m, (long long)a->n, (long long)a->ldy, (long long)a->x.ldx, (long long)a->k);
    uint64_t rb = 0;
    if (quant_row_bytes(a->type, (uint64_t)a->k, &rb) != G5_OK) return BAD("gemv_h16: row bytes of k = %lld", (long long)a->k);
    const cudaStream_t st = (cudaStream_t)stream;
    return a->type == QT_Q5_K ? launch<QT_Q5_K>(a, (int64_t)rb, st, err) : launch<QT_Q4_K>(a, (int64_t)rb, st, err);
}
