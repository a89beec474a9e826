/* Batched GEMVs with one matrix per head (cuda/cuk_head_gemv.h): float32 matrices
 * (k_head_gemv) and matrices in their compact stored types (k_head_gemv_q).
 *
 * The W_UV product of a decode step is 8 heads x 256 rows x 512 columns of float32 (4 MB) and
 * at most a few input rows: it is a pure weight stream. One launch covers every head: each warp
 * owns HG_RW weight rows, loads them into registers once (all its loads issued up front, so the
 * whole matrix is in flight at once over the GPU), then runs every input row t against them. */
#include <stdint.h>

#include "cuda/cuk_head_gemv.h"
#include "cuda/cuk_internal.cuh"
#include "cuda/deq_sub.h"

namespace {

constexpr int HG_WARPS = 4; /* per block */
constexpr int HG_RW = 2;    /* weight rows per warp */

/* Four consecutive inputs as float32: bf16 is the high half of a float32. */
template <bool BF> __device__ __forceinline__ float4 ld_x4(const void *x, int64_t off) {
    if constexpr (BF) {
        const uint2 u = __ldg((const uint2 *)((const uint16_t *)x + off));
        return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xFFFF0000u),
                           __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xFFFF0000u));
    } else {
        return __ldg((const float4 *)((const float *)x + off));
    }
}

/* grid (ceil(n_head * m / (HG_WARPS * HG_RW))), HG_WARPS warps. Global row g = h * m + r; warp
 * w of block b owns rows (b * HG_WARPS + w) * HG_RW + i, i < HG_RW. Lane l holds columns
 * 4 * (l + 32 j) .. + 3 (j < J) of each of its rows in registers. For each t < n and each row:
 * the lane's partial dot product (fmaf chain over its pieces in j order), a butterfly shuffle
 * sum, and lane 0 stores y. The order depends on k only, so a row's bits never depend on n. */
template <int J, bool BF>
__global__ void __launch_bounds__(HG_WARPS * 32) k_head_gemv(const cuk_head_gemv_args a) {
    const int lane = threadIdx.x & 31;
    const int64_t total = (int64_t)a.n_head * a.m;
    const int64_t g0 = ((int64_t)blockIdx.x * HG_WARPS + (threadIdx.x >> 5)) * HG_RW;
    if (g0 >= total) return;
    const int k4 = a.k >> 2;
    float4 wr[HG_RW][J];
    int64_t xo[HG_RW], yo[HG_RW];
#pragma unroll
    for (int i = 0; i < HG_RW; i++) {
        const int64_t g = g0 + i < total ? g0 + i : total - 1; /* a clamped duplicate is never stored */
        const int64_t h = g / a.m, r = g % a.m;
        const float4 *wp = (const float4 *)(a.w + h * a.ld_head + r * a.ldw);
        xo[i] = h * a.ldxh;
        yo[i] = h * a.ldyh + r;
#pragma unroll
        for (int j = 0; j < J; j++) {
            const int c4 = lane + 32 * j;
            wr[i][j] = c4 < k4 ? __ldcs(wp + c4) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    }
    for (int t = 0; t < a.n; t++) {
#pragma unroll
        for (int i = 0; i < HG_RW; i++) {
            if (g0 + i >= total) break; /* warp-uniform */
            float acc = 0.0f;
#pragma unroll
            for (int j = 0; j < J; j++) {
                const int c4 = lane + 32 * j;
                if (c4 < k4) {
                    const float4 xv = ld_x4<BF>(a.x, (int64_t)t * a.ldx + xo[i] + 4 * c4);
                    acc = fmaf(wr[i][j].x, xv.x, acc);
                    acc = fmaf(wr[i][j].y, xv.y, acc);
                    acc = fmaf(wr[i][j].z, xv.z, acc);
                    acc = fmaf(wr[i][j].w, xv.w, acc);
                }
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
            if (lane == 0) a.y[(int64_t)t * a.ldy + yo[i]] = acc;
        }
    }
}

constexpr int HQ_THREADS = 256; /* per block: one 32-element piece of a row each */
constexpr int HQ_TC = 8;        /* input rows per shared-memory round */

/* 32 inputs from 16-byte aligned x + off, as float32 (bf16 is the high half of a float32). */
template <bool BF> __device__ __forceinline__ void ld_x32(const void *x, int64_t off, float *v) {
    if constexpr (BF) {
        const uint4 *p = (const uint4 *)((const uint16_t *)x + off);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint4 u = __ldg(p + i);
            const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                v[8 * i + 2 * j] = __uint_as_float(w[j] << 16);
                v[8 * i + 2 * j + 1] = __uint_as_float(w[j] & 0xFFFF0000u);
            }
        }
    } else {
        const float4 *p = (const float4 *)((const float *)x + off);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const float4 f = __ldg(p + i);
            v[4 * i] = f.x, v[4 * i + 1] = f.y, v[4 * i + 2] = f.z, v[4 * i + 3] = f.w;
        }
    }
}

/* grid (ceil(n_head * m / R)), HQ_THREADS threads, R = HQ_THREADS / spr rows per block (spr =
 * k / 32 pieces per row; rows of several heads may share a block). Thread i < R spr owns piece
 * i % spr of global row g = blockIdx.x R + i / spr (head g / m): it decodes the piece's 32
 * weights once into registers, then, for each round of up to HQ_TC input rows t, stores its fmaf
 * chain over the piece for every t in shared memory; after a barrier, thread j < R tc adds row
 * j % R's spr pieces of round row j / R in piece order and stores y. Nothing depends on n but the
 * number of rounds. */
template <bool BF>
__global__ void __launch_bounds__(HQ_THREADS) k_head_gemv_q(const cuk_head_gemv_q_args a, int64_t row_bytes,
                                                            int spr, int R) {
    __shared__ float part[HQ_TC][HQ_THREADS];
    const int tid = threadIdx.x;
    const int64_t total = (int64_t)a.n_head * a.m, g0 = (int64_t)blockIdx.x * R;
    const int rows = (int)(total - g0 < R ? total - g0 : R);
    const int rl = tid / spr, pc = tid - rl * spr;
    const bool own = rl < rows;
    float w[32];
    int64_t xo = 0;
    if (own) {
        const int64_t g = g0 + rl;
        (void)deq_row32(a.w_type, (const uint8_t *)a.w + g * row_bytes, pc, w);
        xo = g / a.m * a.ldxh + 32 * pc;
    }
    for (int t0 = 0; t0 < a.n; t0 += HQ_TC) {
        const int tc = a.n - t0 < HQ_TC ? a.n - t0 : HQ_TC;
        if (own) {
            for (int tt = 0; tt < tc; tt++) {
                float xv[32];
                ld_x32<BF>(a.x, (int64_t)(t0 + tt) * a.ldx + xo, xv);
                float acc = 0.0f;
#pragma unroll
                for (int l = 0; l < 32; l++) acc = fmaf(w[l], xv[l], acc);
                part[tt][tid] = acc;
            }
        }
        __syncthreads();
        for (int j = tid; j < rows * tc; j += HQ_THREADS) {
            const int rr = j % rows, tt = j / rows;
            float sum = 0.0f;
            for (int q = 0; q < spr; q++) sum = __fadd_rn(sum, part[tt][rr * spr + q]);
            const int64_t g = g0 + rr, h = g / a.m;
            a.y[(int64_t)(t0 + tt) * a.ldy + h * a.ldyh + (g - h * a.m)] = sum;
        }
        __syncthreads();
    }
}

template <bool BF> void launch(const cuk_head_gemv_args *a, int J, unsigned blocks, cudaStream_t s) {
    const int th = HG_WARPS * 32;
    switch (J) {
    case 1: k_head_gemv<1, BF><<<blocks, th, 0, s>>>(*a); break;
    case 2: k_head_gemv<2, BF><<<blocks, th, 0, s>>>(*a); break;
    case 4: k_head_gemv<4, BF><<<blocks, th, 0, s>>>(*a); break;
    default: k_head_gemv<8, BF><<<blocks, th, 0, s>>>(*a); break;
    }
}

} // namespace

extern "C" int cuk_head_gemv_fits(const cuk_head_gemv_args *a) {
    if (!a || !a->w || !a->x || !a->y) return 0;
    if (a->n_head < 1 || a->m < 1 || a->k < 4 || a->k > 1024 || a->k % 4 || a->n < 1) return 0;
    if (a->x_type != CUK_ACT_F32 && a->x_type != CUK_ACT_BF16) return 0;
    if (((uintptr_t)a->w & 15) || a->ld_head % 4 || a->ldw % 4 || a->ld_head < 0 || a->ldw < a->k) return 0;
    const uintptr_t xal = a->x_type == CUK_ACT_F32 ? 15 : 7;
    if (((uintptr_t)a->x & xal) || a->ldx % 4 || a->ldxh % 4 || a->ldxh < 0 || a->ldx < 0) return 0;
    if (a->ldyh < 0 || a->ldy < 0) return 0;
    if ((int64_t)a->n_head * a->m > (int64_t)2147483647 * HG_WARPS * HG_RW / 2) return 0;
    return 1;
}

extern "C" g5_status cuk_head_gemv(const cuk_head_gemv_args *a, cuk_stream stream, g5_error *err) {
    if (!cuk_head_gemv_fits(a))
        return g5_fail(err, G5_ERR_INVALID_ARG,
                       "head_gemv: unsupported arguments (k=%d must be a multiple of 4 in 4..1024, aligned rows)",
                       a ? a->k : 0);
    const int need = (a->k / 4 + 31) / 32;
    const int J = need <= 1 ? 1 : need <= 2 ? 2 : need <= 4 ? 4 : 8;
    const int64_t per = HG_WARPS * HG_RW;
    const unsigned blocks = (unsigned)(((int64_t)a->n_head * a->m + per - 1) / per);
    if (a->x_type == CUK_ACT_BF16)
        launch<true>(a, J, blocks, (cudaStream_t)stream);
    else
        launch<false>(a, J, blocks, (cudaStream_t)stream);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}

extern "C" int cuk_head_gemv_q_takes(uint32_t w_type, int64_t k) {
    int be;
    const int bb = dqs_block_bytes(w_type, &be);
    return bb > 0 && k >= 32 && k <= CUK_HEAD_GEMV_Q_MAX_K && k % 32 == 0 && k % be == 0;
}

extern "C" int cuk_head_gemv_q_fits(const cuk_head_gemv_q_args *a) {
    if (!a || !a->w || !a->x || !a->y || !cuk_head_gemv_q_takes(a->w_type, a->k)) return 0;
    if (a->n_head < 1 || a->m < 1 || a->n < 1) return 0;
    if (a->x_type != CUK_ACT_F32 && a->x_type != CUK_ACT_BF16) return 0;
    const int64_t al = a->x_type == CUK_ACT_F32 ? 4 : 8; /* elements in 16 bytes */
    if (((uintptr_t)a->x & 15) || a->ldx < 0 || a->ldxh < 0 || a->ldx % al || a->ldxh % al) return 0;
    if (a->ldy < 0 || a->ldyh < 0) return 0;
    const int64_t R = HQ_THREADS / (a->k / 32);
    if (((int64_t)a->n_head * a->m + R - 1) / R > 2147483647) return 0;
    return 1;
}

extern "C" g5_status cuk_head_gemv_q(const cuk_head_gemv_q_args *a, cuk_stream stream, g5_error *err) {
    if (!cuk_head_gemv_q_fits(a))
        return g5_fail(err, G5_ERR_INVALID_ARG,
                       "head_gemv_q: unsupported arguments (type %s, k=%d: a multiple of the block and of 32, "
                       "at most %d; 16-byte aligned inputs)",
                       a ? quant_type_name(a->w_type) : "?", a ? a->k : 0, CUK_HEAD_GEMV_Q_MAX_K);
    int be;
    const int bb = dqs_block_bytes(a->w_type, &be);
    const int64_t row_bytes = (int64_t)a->k / be * bb;
    const int spr = a->k / 32, R = HQ_THREADS / spr;
    const unsigned blocks = (unsigned)(((int64_t)a->n_head * a->m + R - 1) / R);
    if (a->x_type == CUK_ACT_BF16)
        k_head_gemv_q<true><<<blocks, HQ_THREADS, 0, (cudaStream_t)stream>>>(*a, row_bytes, spr, R);
    else
        k_head_gemv_q<false><<<blocks, HQ_THREADS, 0, (cudaStream_t)stream>>>(*a, row_bytes, spr, R);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}
