/* Fast-mode MoE prefill products with the weights decoded inside the tile (cuda/cuk_prefill.h,
 * cuk_moe_mm): every local expert's rows of one layer in one launch, the quantized weights read
 * once per (expert, row tile) straight from the blob layout and turned into fp16 in shared
 * memory, never written back to global memory. Before this kernel the experts' weights were
 * dequantized to an fp16 copy in global memory (2 bytes per weight written and read back: 4.8 GB
 * per GLM-5 layer of 64 experts) and multiplied by cuBLAS one expert at a time.
 *
 * Grid: x = row tiles of CUK_MOE_MM_BM compact rows over all experts (expert by expert, each
 * expert's rows split into tiles of 64; a CTA finds its expert and rows by a scan of cnt), y =
 * tiles of 128 output columns. 256 threads (8 warps); warp w owns rows 32 (w & 1) .. + 32 and
 * columns 32 (w >> 1) .. + 32 of the tile, as 2 x 4 mma.sync m16n8k16 fragments (fp16 inputs,
 * float32 accumulators) per weight matrix (mm_tile). A tile of 32 rows or fewer (an expert's share
 * of a 256-token call on 64 experts, or of a 512-token call on GLM-5's 256) takes the wa form
 * instead (wa_tile): the weights are the mma's A operand, decoded in registers by the warp that
 * owns their 16 rows, and only the input comes through shared memory. ncu put mm_tile on its L1 /
 * shared-memory pipe (the weight tile written and read back); at 16 / 32 rows an expert the wa form
 * takes GLM-5's expert shapes from 1.06 / 1.17 to 0.90 / 1.02 ms a layer, where at 64 rows it
 * loses (1.65 against 1.49: one CTA an SM for gate+up in one pass of 64 rows, 2.04 in two passes of
 * 32), H100, bench/RESULTS.md session 46. The two forms sum k in different orders, so a row's bits
 * depend on whether its expert's tile has more than 32 rows (llama.cpp's MMQ tiles likewise follow
 * the batch; cuBLAS's dense products do too). Earlier forms of the small tile: the full layout with
 * zero rows 1.50 / 1.50, half of it on rows 0 .. 31 1.14 / 1.24 (session 45), the same with the
 * decode's stores free of bank conflicts 1.06 / 1.17 (session 46). mm_tile, per k step
 * of 128: the input tile (up to 64 x 128 fp16) comes by cp.async while each thread decodes one
 * weight row's 64 elements of the step (a pair of sub-blocks, whose raw bytes it loaded with
 * 16-byte loads during the previous step's products) into the fp16 tile, then 8 k16 steps of mma.
 * Two CTAs per SM overlap one's decode with the other's products. Shared rows are padded by 16
 * bytes so ldmatrix is conflict-free. Types: Q4_K and Q5_K (the experts of the UD-Q4_K_XL files);
 * cuk_moe_mm_takes says no to the others, which run the dequantized-copy path
 * (runtime/gpu/gpu_linear.c). A first version decoding any deq_sub.h type with its byte loads
 * straight from global memory ran at 55 TFLOP/s, slower than that path; a two-stage pipeline (k
 * steps of 64, the next step's decode beside this step's products, one barrier per step) at 140
 * against this kernel's 200; and the kernel as a dense product (one expert, no counts) loses to the
 * dequantized copy + cuBLAS at 512 rows and more (0.57 against 0.23 ms for 6144 x 16384 Q4_K):
 * bench/RESULTS.md, Session 7. Session 45 (H100): ncu puts this kernel on its L1 / shared-memory
 * pipe (87-89% busy; stalls on short scoreboard and MIO throttle, tensor pipe 17-23%), and two
 * forms without the weight tile both lost: B fragments decoded from weight words in registers (one
 * CTA an SM at 155-255 registers) 1.59 / 1.76 / 2.12 ms at 16 / 32 / 64 rows, and an L2 prefetch of
 * the bytes two or four steps ahead 8-15% slower.
 * gate_up (two matrices): out = fp16(silu(gate) * up) per element (cuk_silu_mul_16's arithmetic);
 * one matrix: out = the float32 product. */
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "cuda/cuk_internal.cuh"
#include "cuda/cuk_model.h"
#include "cuda/cuk_prefill.h"
#include "cuda/mma.cuh"

#define BAD(...) g5_fail(err, G5_ERR_INVALID_ARG, __VA_ARGS__)

namespace {

constexpr int BM = CUK_MOE_MM_BM, BN = 128, BK = 128, NT = 256;
constexpr int LDS = BK + 8;                  /* halves per shared row */
constexpr int SX_B = BM * LDS * 2, SW_B = BN * LDS * 2;
constexpr uint32_t N_TYPE_IDS = 64;          /* above every ggml type id (format/quant.h) */
static_assert(SX_B + 2 * SW_B == CUK_MOE_MM_SMEM, "cuk_limits.h's entry");
static_assert(BN * 2 == NT && BK == 128, "one weight job (a row's sub-block pair) per thread and k step");

struct MmParams {
    const uint8_t *w[2];   /* [n_local][n] rows of rb bytes */
    int64_t rb, ew;        /* bytes per weight row, per expert matrix */
    int64_t bb;            /* bytes per quant block */
    int k, n;
    const __half *x;       /* [rows][k] */
    const int32_t *cnt;
    int n_local;
    void *out;
    int64_t ldo;
};

__device__ __forceinline__ int warp_incl(int v, int lane) {
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int t = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += t;
    }
    return v;
}

/* sh[16..18] = (expert, first compact row, rows) of row tile `tile` (rows 0: no such tile).
 * All threads; sh has 20 ints. */
__device__ void find_tile(const int32_t *__restrict__ cnt, int n_local, int tile, int *sh) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (tid == 0) sh[18] = 0;
    int base_t = 0, base_r = 0;
    for (int c0 = 0; c0 < n_local; c0 += NT) {
        const int e = c0 + tid;
        const int c = e < n_local ? max(cnt[e], 0) : 0, t = (c + BM - 1) / BM;
        const int it = warp_incl(t, lane), ir = warp_incl(c, lane);
        if (lane == 31) {
            sh[warp] = it;
            sh[8 + warp] = ir;
        }
        __syncthreads();
        int wt = 0, wr = 0, tt = 0, tr = 0;
        for (int w = 0; w < NT / 32; w++) {
            if (w < warp) {
                wt += sh[w];
                wr += sh[8 + w];
            }
            tt += sh[w];
            tr += sh[8 + w];
        }
        const int incl = base_t + wt + it, excl = incl - t;
        if (t > 0 && tile >= excl && tile < incl) {
            const int m0 = (tile - excl) * BM;
            sh[16] = e;
            sh[17] = base_r + wr + ir - c + m0;
            sh[18] = min(BM, c - m0);
        }
        base_t += tt;
        base_r += tr;
        __syncthreads();
    }
}

/* One weight job: the pair of 32-element sub-blocks (2 pr, 2 pr + 1) of a 256-element block, which
 * share their 32 bytes of low nibbles: loaded with 16-byte loads one k step ahead, decoded from
 * registers two elements at a time in half2 arithmetic and stored as the tile row's 64 halves at
 * dst (16-byte aligned, shared memory). A quant v (0 .. 31) becomes the fp16 1024 + v by a byte
 * permute and a mask (0x64 is the high byte of 1024.0), 1024 is subtracted exactly, and the
 * element is fma(v, fp16(d * sc), -fp16(dmin * m)) rounded once: about four integer and half
 * operations per pair where the float32 decode of deq_sub.h (then rounded to fp16) took about
 * seven per element and made the kernel decode-bound. The result differs from that value by at
 * most 2^-9 of the sub-block's largest magnitude (the two fp16 scale factors and the rounding;
 * tests/gpu/test_moe_mm.c): fast mode's weights are fp16 either way (specs/numerics.md). */
template <int T> struct Raw;
template <> struct Raw<QT_Q4_K> { uint4 h, q0, q1; };
template <> struct Raw<QT_Q5_K> { uint4 h, q0, q1, qh0, qh1; };

__device__ __forceinline__ uint4 ld16(const uint8_t *p) { return __ldg((const uint4 *)(const void *)p); }

template <int T> __device__ __forceinline__ void raw_load(Raw<T> &w, const uint8_t *blk, int pr) {
    w.h = ld16(blk);
    if constexpr (T == QT_Q4_K) {
        w.q0 = ld16(blk + 16 + 32 * pr);
        w.q1 = ld16(blk + 32 + 32 * pr);
    } else {
        w.qh0 = ld16(blk + 16);
        w.qh1 = ld16(blk + 32);
        w.q0 = ld16(blk + 48 + 32 * pr);
        w.q1 = ld16(blk + 64 + 32 * pr);
    }
}

/* byte i < 12 of the scales (bytes 4 .. 15 of the block) */
__device__ __forceinline__ uint32_t scb(const uint4 &h, int i) {
    const uint32_t w = i < 4 ? h.y : i < 8 ? h.z : h.w;
    return (w >> (8 * (i & 3))) & 0xffu;
}

/* sub-block sb's 6-bit scale and min from the 12 packed bytes (ggml's get_scale_min_k4) */
__device__ __forceinline__ void sb_scale(const uint4 &h, int sb, uint32_t &sv, uint32_t &mv) {
    if (sb < 4) {
        sv = scb(h, sb) & 63;
        mv = scb(h, sb + 4) & 63;
    } else {
        sv = (scb(h, sb + 4) & 0xf) | ((scb(h, sb - 4) >> 6) << 4);
        mv = (scb(h, sb + 4) >> 4) | ((scb(h, sb) >> 6) << 4);
    }
}

/* the quants of bytes i0, i0 + 1 of x (low nibbles) as the half2 (1024 + v0, 1024 + v1) bits */
__device__ __forceinline__ uint32_t nib2(uint32_t x, uint32_t sel) {
    return __byte_perm(x, 0x64646464u, sel) & 0xff0fff0fu;
}

/* Q5_K: the fifth bits (bit 0 of each byte of t) of nib2's two pairs, into bit 4 of each half */
__device__ __forceinline__ void add_hi5(uint32_t (&v)[2], uint32_t t) {
    v[0] |= (__byte_perm(t, 0u, 0x4140u) & 0x00010001u) << 4;
    v[1] |= (__byte_perm(t, 0u, 0x4342u) & 0x00010001u) << 4;
}

template <int T> __device__ __forceinline__ void raw_decode(const Raw<T> &w, int pr, int jp, uint4 *dst) {
    const float d = __half2float(__ushort_as_half((unsigned short)(w.h.x & 0xffffu)));
    const float mn = __half2float(__ushort_as_half((unsigned short)(w.h.x >> 16)));
    const uint32_t q[8] = {w.q0.x, w.q0.y, w.q0.z, w.q0.w, w.q1.x, w.q1.y, w.q1.z, w.q1.w};
    uint32_t qh[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if constexpr (T == QT_Q5_K) {
        qh[0] = w.qh0.x, qh[1] = w.qh0.y, qh[2] = w.qh0.z, qh[3] = w.qh0.w;
        qh[4] = w.qh1.x, qh[5] = w.qh1.y, qh[6] = w.qh1.z, qh[7] = w.qh1.w;
    }
    const __half2 k1024 = __float2half2_rn(1024.0f);
    /* lane jp = 1 decodes and stores the odd sub-block first: at each 16-byte store the two lanes
     * of a row write chunks 4 apart, so the 8 lanes of a store phase (4 rows) hit 8 distinct
     * bank groups (in step they hit 4, twice: rows are 272 bytes apart, the pairs 128) */
#pragma unroll
    for (int it = 0; it < 2; it++) {
        const int hh = it ^ jp;
        const int sb = 2 * pr + hh;
        uint32_t sv, mv;
        sb_scale(w.h, sb, sv, mv);
        const __half2 dd = __float2half2_rn(__fmul_rn(d, (float)sv));
        const __half2 nm = __float2half2_rn(-__fmul_rn(mn, (float)mv));
        uint32_t o[16];
#pragma unroll
        for (int i = 0; i < 8; i++) { /* elements 4 i .. 4 i + 3 of sub-block sb */
            const uint32_t x = q[i] >> (4 * hh);
            uint32_t v[2] = {nib2(x, 0x4140u), nib2(x, 0x4342u)};
            if constexpr (T == QT_Q5_K) add_hi5(v, qh[i] >> sb); /* bit 0 of each byte: that element's fifth bit */
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const __half2 hv = __hsub2(*(const __half2 *)&v[j], k1024);
                const __half2 y = __hfma2(hv, dd, nm);
                o[2 * i + j] = *(const uint32_t *)&y;
            }
        }
#pragma unroll
        for (int c = 0; c < 4; c++) dst[4 * hh + c] = make_uint4(o[4 * c], o[4 * c + 1], o[4 * c + 2], o[4 * c + 3]);
    }
}

/* The 8 k16 steps of one k step into acc: warp w owns rows 32 (w & 1) .. + 31 and columns
 * 32 (w >> 1) .. + 31 of the tile, 2 x 4 fragments. */
template <int NM>
__device__ __forceinline__ void mma_step(float (&acc)[NM][2][4][4], uint32_t sx, int warp, int lane) {
    const int wm = warp & 1, wn = warp >> 1;
    const int rbase = wm * 32, cbase = wn * 32;
#pragma unroll
    for (int kk = 0; kk < BK / 16; kk++) {
        uint32_t a[2][4];
#pragma unroll
        for (int mi = 0; mi < 2; mi++)
            cuk::ldsm4(a[mi], sx + (uint32_t)((rbase + mi * 16 + (lane & 15)) * LDS + kk * 16 + (lane >> 4) * 8) * 2);
#pragma unroll
        for (int m = 0; m < NM; m++) {
            const uint32_t swm = sx + SX_B + m * SW_B;
#pragma unroll
            for (int nj = 0; nj < 2; nj++) {
                uint32_t b[4];
                const int br = cbase + nj * 16 + (lane & 7) + ((lane >> 4) << 3);
                cuk::ldsm4(b, swm + (uint32_t)(br * LDS + kk * 16 + ((lane >> 3) & 1) * 8) * 2);
#pragma unroll
                for (int mi = 0; mi < 2; mi++) {
                    cuk::mma_f16(acc[m][mi][2 * nj], a[mi], b[0], b[1]);
                    cuk::mma_f16(acc[m][mi][2 * nj + 1], a[mi], b[2], b[3]);
                }
            }
        }
    }
}

/* A row tile of more than 32 rows: the weights decoded into a shared fp16 tile, the input tile
 * by cp.async, mma_step's layout. */
template <int T, int NM>
__device__ __forceinline__ void mm_tile(const MmParams &p, uint8_t *smem, int e, int row0, int nr) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp & 1, wn = warp >> 1;
    const int n0 = (int)blockIdx.y * BN;
    const uint32_t sx = (uint32_t)__cvta_generic_to_shared(smem);
    const __half *xr = p.x + (int64_t)row0 * p.k; // [nr][k]
    const uint8_t *wb[NM];
#pragma unroll
    for (int m = 0; m < NM; m++) wb[m] = p.w[m] + (int64_t)e * p.ew;

    float acc[NM][2][4][4];
#pragma unroll
    for (int m = 0; m < NM; m++)
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int q = 0; q < 4; q++) acc[m][i][j][q] = 0.0f;

    /* this thread's weight job per k step: row r of the tile, sub-block pair jp of the step's four;
     * a lane pair takes one row (lanes on 16 rows, jp by half-warp: 5-17% slower, session 45) */
    const int r = tid >> 1, jp = tid & 1;
    const bool row_ok = n0 + r < p.n;
    const uint8_t *wrow[NM];
    Raw<T> raw[NM];
#pragma unroll
    for (int m = 0; m < NM; m++) {
        wrow[m] = wb[m] + (int64_t)(row_ok ? n0 + r : 0) * p.rb;
        raw_load<T>(raw[m], wrow[m], jp);
    }
    for (int k0 = 0; k0 < p.k; k0 += BK) {
        const int pr0 = (k0 % 256) / 64;
        for (int i = tid; i < BM * (BK / 8); i += NT) {
            const int r = i / (BK / 8), c = i % (BK / 8);
            const bool ok = r < nr;
            cuk::cp16(sx + (uint32_t)(r * LDS + c * 8) * 2, xr + (int64_t)(ok ? r : 0) * p.k + k0 + c * 8, ok);
        }
        cuk::cp_commit();
#pragma unroll
        for (int m = 0; m < NM; m++) raw_decode<T>(raw[m], pr0 + jp, jp, (uint4 *)(void *)(smem + SX_B + m * SW_B + (r * LDS + 64 * jp) * 2));
        if (k0 + BK < p.k) {
            const int kn = k0 + BK;
#pragma unroll
            for (int m = 0; m < NM; m++) raw_load<T>(raw[m], wrow[m] + (int64_t)(kn / 256) * p.bb, (kn % 256) / 64 + jp);
        }
        cuk::cp_wait<0>();
        __syncthreads();
        mma_step<NM>(acc, sx, warp, lane);
        __syncthreads();
    }

    const int g = lane >> 2, c4 = lane & 3;
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                /* the fragment's rows and columns as mma_step places them */
                const int r = wm * 32 + mi * 16 + g + 8 * hr;
                const int col = n0 + wn * 32 + ni * 8 + 2 * c4;
                if (r >= nr || col >= p.n) continue;
                const float *v0 = &acc[0][mi][ni][2 * hr];
                if constexpr (NM == 2) {
                    const float *v1 = &acc[1][mi][ni][2 * hr];
                    float o[2];
#pragma unroll
                    for (int q = 0; q < 2; q++) {
                        const float s = v0[q] / (1.0f + expf(-v0[q]));
                        o[q] = __fmul_rn(s, v1[q]);
                    }
                    *(__half2 *)((__half *)p.out + (int64_t)(row0 + r) * p.ldo + col) = __floats2half2_rn(o[0], o[1]);
                } else {
                    *(float2 *)((float *)p.out + (int64_t)(row0 + r) * p.ldo + col) = make_float2(v0[0], v0[1]);
                }
            }
}

/* wa form (NOTES session 45, next 2): the weights are the mma's A operand, as in cuk_gemv_h16.
 * Warp w owns weight rows n0 + 16 w .. + 15 (lane (g, c): rows g and g + 8) and every token row of
 * the tile (n8 tiles t < ceil(nr / 8)). Per 256-element block the lane holds, per row, the header,
 * bytes 8c .. 8c + 7 of each 32-byte quant group and (Q5_K) of the high-bit bytes. A k16 chunk is
 * one nibble half (h) of 4 of those bytes (hf): the lane's A pieces at mma k 2c, 2c+1, 2c+8, 2c+9
 * are the 4 consecutive elements 64 j + 32 h + 8 c + 4 hf + 0 .. 3, and its B pieces x[8 t + g]
 * of the same elements (one 16-byte shared load serves both hf). Each sub-block's fp16 scale pair
 * is made by lane c = sub-block / 2 of the four and shuffled. The input tile is double buffered,
 * rows padded to 576 bytes so that a 16-byte load phase (lanes g, g + 1) is conflict-free. */
constexpr int XLD = 256 + 32;            /* halves per shared input row */
constexpr int SXB = 32 * XLD * 2;        /* bytes per input buffer: 32 rows */
static_assert(2 * SXB <= SX_B + SW_B, "wa_tile's two input buffers fit mm_tile's smallest launch");

__device__ __forceinline__ uint32_t pack_sc(float d, float mn, uint32_t sv, uint32_t mv) {
    const __half a = __float2half_rn(__fmul_rn(d, (float)sv)), b = __float2half_rn(-__fmul_rn(mn, (float)mv));
    return (uint32_t)__half_as_ushort(a) | ((uint32_t)__half_as_ushort(b) << 16);
}

/* A row tile of 32 rows or fewer in the wa form: one pass, the weights decoded in registers. */
template <int T, int NM>
__device__ __forceinline__ void wa_tile(const MmParams &p, uint8_t *smem, int e, int row0, int nr) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
    const int n0 = (int)blockIdx.y * BN;
    const uint32_t sx = (uint32_t)__cvta_generic_to_shared(smem);
    constexpr int QOFF = T == QT_Q4_K ? 16 : 48;
    const uint8_t *rp[NM][2];
#pragma unroll
    for (int m = 0; m < NM; m++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int col = n0 + 16 * warp + g + 8 * r;
            rp[m][r] = p.w[m] + (int64_t)e * p.ew + (int64_t)(col < p.n ? col : 0) * p.rb;
        }
    const int nt = (nr + 7) >> 3, xrows = 8 * nt; /* n8 tiles of token rows */
    const __half *xr = p.x + (int64_t)row0 * p.k; // [nr][k]
    float acc[NM][4][4];
#pragma unroll
    for (int m = 0; m < NM; m++)
#pragma unroll
        for (int t = 0; t < 4; t++)
#pragma unroll
            for (int q = 0; q < 4; q++) acc[m][t][q] = 0.0f;

    uint4 hd[NM][2];
    uint2 qw[NM][2][4], qh[NM][2];
    auto load_hdr = [&](int s) {
#pragma unroll
        for (int m = 0; m < NM; m++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const uint8_t *bp = rp[m][r] + (int64_t)s * p.bb;
                hd[m][r] = ld16(bp);
                if constexpr (T == QT_Q5_K) qh[m][r] = __ldg((const uint2 *)(const void *)(bp + 16 + 8 * c));
            }
    };
    auto load_q = [&](int s, int j) {
#pragma unroll
        for (int m = 0; m < NM; m++)
#pragma unroll
            for (int r = 0; r < 2; r++)
                qw[m][r][j] = __ldg((const uint2 *)(const void *)(rp[m][r] + (int64_t)s * p.bb + QOFF + 32 * j + 8 * c));
    };
    auto load_x = [&](int s, int buf) {
        for (int i = tid; i < xrows * 32; i += NT) {
            const int r = i >> 5, cc = i & 31;
            const bool ok = r < nr;
            cuk::cp16(sx + (uint32_t)(buf * SXB + (r * XLD + cc * 8) * 2), xr + (int64_t)(ok ? r : 0) * p.k + s * 256 + cc * 8, ok);
        }
        cuk::cp_commit();
    };
    const int steps = p.k / 256;
    load_x(0, 0);
    load_hdr(0);
#pragma unroll
    for (int j = 0; j < 4; j++) load_q(0, j);
    const __half2 k1024 = __float2half2_rn(1024.0f);
    for (int s = 0; s < steps; s++) {
        cuk::cp_wait<0>();
        __syncthreads();
        const bool more = s + 1 < steps;
        if (more) load_x(s + 1, (s + 1) & 1);
        /* this lane's two sub-blocks (2c, 2c + 1) of each row: packed (fp16(d sc), fp16(-dmin m)) */
        uint32_t sc[NM][2][2];
        uint2 qhc[NM][2];
#pragma unroll
        for (int m = 0; m < NM; m++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const uint4 &w = hd[m][r];
                const float d = __half2float(__ushort_as_half((unsigned short)(w.x & 0xffffu)));
                const float mn = __half2float(__ushort_as_half((unsigned short)(w.x >> 16)));
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const int sb = 2 * c + hh;
                    uint32_t sv, mv;
                    sb_scale(w, sb, sv, mv);
                    sc[m][r][hh] = pack_sc(d, mn, sv, mv);
                }
                qhc[m][r] = T == QT_Q5_K ? qh[m][r] : make_uint2(0u, 0u);
            }
        if (more) load_hdr(s + 1);
        const uint32_t xb = sx + (uint32_t)((s & 1) * SXB);
#pragma unroll
        for (int j = 0; j < 4; j++) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int sb = 2 * j + h;
                uint32_t A[NM][2][4];
#pragma unroll
                for (int m = 0; m < NM; m++)
#pragma unroll
                    for (int r = 0; r < 2; r++) {
                        const uint32_t pk = __shfl_sync(0xffffffffu, sc[m][r][h], (lane & ~3) | j);
                        const uint32_t ddw = __byte_perm(pk, 0u, 0x1010u), nmw = __byte_perm(pk, 0u, 0x3232u);
                        const __half2 dd = *(const __half2 *)&ddw, nm = *(const __half2 *)&nmw;
#pragma unroll
                        for (int hf = 0; hf < 2; hf++) {
                            const uint32_t x = (hf ? qw[m][r][j].y : qw[m][r][j].x) >> (4 * h);
                            uint32_t v[2] = {nib2(x, 0x4140u), nib2(x, 0x4342u)};
                            if constexpr (T == QT_Q5_K) add_hi5(v, (hf ? qhc[m][r].y : qhc[m][r].x) >> sb);
#pragma unroll
                            for (int q = 0; q < 2; q++) {
                                const __half2 y = __hfma2(__hsub2(*(const __half2 *)&v[q], k1024), dd, nm);
                                A[m][hf][2 * q + r] = *(const uint32_t *)&y;
                            }
                        }
                    }
#pragma unroll
                for (int t = 0; t < 4; t++) {
                    if (t >= nt) break;
                    uint32_t b[4];
                    const uint32_t ad = xb + (uint32_t)(((8 * t + g) * XLD + 64 * j + 32 * h + 8 * c) * 2);
                    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                                 : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                                 : "r"(ad));
#pragma unroll
                    for (int m = 0; m < NM; m++) {
                        cuk::mma_f16(acc[m][t], A[m][0], b[0], b[1]);
                        cuk::mma_f16(acc[m][t], A[m][1], b[2], b[3]);
                    }
                }
            }
            if (more) load_q(s + 1, j);
        }
    }

#pragma unroll
    for (int t = 0; t < 4; t++) {
        if (t >= nt) break;
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int tok = 8 * t + 2 * c + (q & 1), col = n0 + 16 * warp + g + 8 * (q >> 1);
            if (tok >= nr || col >= p.n) continue;
            const float v0 = acc[0][t][q];
            if constexpr (NM == 2) {
                const float v1 = acc[1][t][q];
                const float sg = v0 / (1.0f + expf(-v0));
                ((__half *)p.out)[(int64_t)(row0 + tok) * p.ldo + col] = __float2half_rn(__fmul_rn(sg, v1));
            } else {
                ((float *)p.out)[(int64_t)(row0 + tok) * p.ldo + col] = v0;
            }
        }
    }
}
/* WA: the launch of the tiles of 32 rows or fewer (wa_tile), else of the others (mm_tile); each
 * launch has every tile's CTA, and a CTA whose tile is the other launch's exits after find_tile.
 * Two kernels, so that neither form's registers are the other's (one kernel with both spilled
 * 232 bytes in the Q5_K gate+up instance). */
template <int T, int NM, bool WA>
__global__ void __launch_bounds__(NT, 2) k_moe_mm(MmParams p) {
    extern __shared__ __align__(128) uint8_t smem[];
    __shared__ int sh[20];
    find_tile(p.cnt, p.n_local, (int)blockIdx.x, sh);
    const int e = sh[16], row0 = sh[17], nr = sh[18];
    if (nr <= 0 || (nr <= BM / 2) != WA) return;
    if constexpr (WA) wa_tile<T, NM>(p, smem, e, row0, nr);
    else mm_tile<T, NM>(p, smem, e, row0, nr);
}

typedef void (*mm_fn)(MmParams);

template <int NM, bool WA> mm_fn pick(uint32_t t) {
    switch (t) {
    case QT_Q4_K: return k_moe_mm<QT_Q4_K, NM, WA>;
    case QT_Q5_K: return k_moe_mm<QT_Q5_K, NM, WA>;
    default: return nullptr;
    }
}

} // namespace

extern "C" int cuk_moe_mm_takes(uint32_t w_type, int64_t k, int64_t n) {
    return (w_type == QT_Q4_K || w_type == QT_Q5_K) && k >= 256 && k % 256 == 0 && k <= 0x7fffffff && n >= 8 && n % 8 == 0 &&
           n <= 0x7fffffff;
}

extern "C" g5_status cuk_moe_mm(const cuk_moe_mm_args *a, cuk_stream stream, g5_error *err) {
    if (!a || !a->w0 || !a->x || !a->cnt || !a->out) return BAD("moe_mm: NULL pointer");
    if (!cuk_moe_mm_takes(a->w_type, a->k, a->n))
        return BAD("moe_mm: %s weights of %lld x %lld (Q4_K or Q5_K, k a multiple of 256, n of 8)",
                   quant_type_name(a->w_type), (long long)a->n, (long long)a->k);
    if (a->n_local < 1 || a->n_tiles < 0 || a->ldo < a->n || a->ldo % 2)
        return BAD("moe_mm: n_local=%d n_tiles=%d ldo=%lld", a->n_local, a->n_tiles, (long long)a->ldo);
    if (((uintptr_t)a->x | (uintptr_t)a->out | (uintptr_t)a->w0 | (uintptr_t)a->w1) % 16)
        return BAD("moe_mm: weights, x or out not 16-byte aligned");
    if ((a->n + BN - 1) / BN > 65535) return BAD("moe_mm: n=%lld", (long long)a->n);
    if (a->n_tiles == 0) return G5_OK;
    const quant_type_info *ti = quant_type_get(a->w_type);
    uint64_t rb = 0;
    if (!ti || quant_row_bytes(a->w_type, (uint64_t)a->k, &rb)) return BAD("moe_mm: row size");
    const int nm = a->w1 ? 2 : 1;
    MmParams p;
    p.w[0] = (const uint8_t *)a->w0;
    p.w[1] = (const uint8_t *)(a->w1 ? a->w1 : a->w0);
    p.rb = (int64_t)rb;
    p.ew = (int64_t)rb * a->n;
    p.bb = ti->block_bytes;
    p.k = (int)a->k;
    p.n = (int)a->n;
    p.x = (const __half *)a->x;
    p.cnt = a->cnt;
    p.n_local = a->n_local;
    p.out = a->out;
    p.ldo = a->ldo;
    const size_t smem = (size_t)SX_B + (size_t)nm * SW_B;
    const dim3 grid((unsigned)a->n_tiles, (unsigned)((a->n + BN - 1) / BN));
    const mm_fn fm = nm == 2 ? pick<2, false>(a->w_type) : pick<1, false>(a->w_type);
    const mm_fn fw = nm == 2 ? pick<2, true>(a->w_type) : pick<1, true>(a->w_type);
    /* mm_tile's limit is raised once per device and kernel (a repeat is harmless); wa_tile's
     * 36 KB fit the default */
    static bool raised[CUK_MAX_DEVICES][2][N_TYPE_IDS];
    const int slot = cuk_device_slot();
    const uint32_t ti_ix = a->w_type < N_TYPE_IDS ? a->w_type : 0;
    if (!raised[slot][nm - 1][ti_ix]) {
        CUK_CHECK(cudaFuncSetAttribute(fm, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        raised[slot][nm - 1][ti_ix] = true;
    }
    static_assert(2 * SXB <= 48 * 1024, "wa_tile's input buffers fit the default shared-memory limit");
    fm<<<grid, NT, smem, (cudaStream_t)stream>>>(p);
    fw<<<grid, NT, (size_t)2 * SXB, (cudaStream_t)stream>>>(p);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}
