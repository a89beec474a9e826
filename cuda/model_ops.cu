/* Row dequantization, SwiGLU, scaling and the MoE router (cuda/cuk_model.h). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuk_internal.cuh"
#include "cuda/cuk_model.h"
#include "cuda/cuk_q8.h"
#include "cuda/deq_sub.h"
#include "cuda/moe_plan.cuh"
#include "cuda/q8_quant.cuh"
#include "cuda/rowops.cuh"
#include "format/quant_blocks.h"

#define BAD(...) g5_fail(err, G5_ERR_INVALID_ARG, __VA_ARGS__)

namespace {

/* ---- dequantization: format/quant.c's block decoders, operation for operation ---- */

__device__ __forceinline__ uint32_t rd16(const uint8_t *p) { return (uint32_t)p[0] | ((uint32_t)p[1] << 8); }
__device__ __forceinline__ uint32_t rd32(const uint8_t *p) {
    return rd16(p) | (rd16(p + 2) << 16);
}
__device__ __forceinline__ float rdh(const uint8_t *p) {
    return __half2float(__ushort_as_half((unsigned short)rd16(p)));
}
/* float * float and float - float, never contracted into an fma (the CPU rounds each). */
__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }

__constant__ int8_t c_kv_iq4[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                    1,    13,   25,  38,  53,  69,  89,  113};

__device__ void deq_block(uint32_t type, const uint8_t *b, float *y) {
    switch (type) {
    case QT_Q4_0: {
        const float d = rdh(b);
        for (int j = 0; j < 16; j++) {
            y[j] = mul((float)((b[2 + j] & 0x0f) - 8), d);
            y[j + 16] = mul((float)((b[2 + j] >> 4) - 8), d);
        }
        break;
    }
    case QT_Q4_1: {
        const float d = rdh(b), m = rdh(b + 2);
        for (int j = 0; j < 16; j++) {
            y[j] = add(mul((float)(b[4 + j] & 0x0f), d), m);
            y[j + 16] = add(mul((float)(b[4 + j] >> 4), d), m);
        }
        break;
    }
    case QT_Q5_0: {
        const float d = rdh(b);
        const uint32_t qh = rd32(b + 2);
        const uint8_t *qs = b + 6;
        for (int j = 0; j < 16; j++) {
            const int x0 = (int)((qs[j] & 0x0f) | (((qh >> j) & 1) << 4)) - 16;
            const int x1 = (int)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
            y[j] = mul((float)x0, d);
            y[j + 16] = mul((float)x1, d);
        }
        break;
    }
    case QT_Q5_1: {
        const float d = rdh(b), m = rdh(b + 2);
        const uint32_t qh = rd32(b + 4);
        const uint8_t *qs = b + 8;
        for (int j = 0; j < 16; j++) {
            const int x0 = (int)((qs[j] & 0x0f) | (((qh >> j) & 1) << 4));
            const int x1 = (int)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
            y[j] = add(mul((float)x0, d), m);
            y[j + 16] = add(mul((float)x1, d), m);
        }
        break;
    }
    case QT_Q8_0: {
        const float d = rdh(b);
        for (int j = 0; j < 32; j++) y[j] = mul((float)(int8_t)b[2 + j], d);
        break;
    }
    case QT_Q4_K:
    case QT_Q5_K: {
        const bool q5 = type == QT_Q5_K;
        const float d = rdh(b), mn = rdh(b + 2);
        const uint8_t *sc = b + 4;
        const uint8_t *qh = b + 16;
        const uint8_t *q = b + (q5 ? 48 : 16);
        uint8_t u1 = 1, u2 = 2;
        for (int is = 0; is < 8; is += 2) {
            float dd[2], mm[2];
            for (int h = 0; h < 2; h++) {
                const int j = is + h;
                uint8_t s, m;
                if (j < 4) {
                    s = sc[j] & 63;
                    m = sc[j + 4] & 63;
                } else {
                    s = (uint8_t)((sc[j + 4] & 0xf) | ((sc[j - 4] >> 6) << 4));
                    m = (uint8_t)((sc[j + 4] >> 4) | ((sc[j] >> 6) << 4));
                }
                dd[h] = mul(d, (float)s);
                mm[h] = mul(mn, (float)m);
            }
            for (int l = 0; l < 32; l++) {
                const int v = (q[l] & 0xf) + (q5 && (qh[l] & u1) ? 16 : 0);
                *y++ = sub(mul(dd[0], (float)v), mm[0]);
            }
            for (int l = 0; l < 32; l++) {
                const int v = (q[l] >> 4) + (q5 && (qh[l] & u2) ? 16 : 0);
                *y++ = sub(mul(dd[1], (float)v), mm[1]);
            }
            q += 32;
            u1 = (uint8_t)(u1 << 2);
            u2 = (uint8_t)(u2 << 2);
        }
        break;
    }
    case QT_Q6_K: {
        const float d = rdh(b + 208);
        const uint8_t *ql = b;
        const uint8_t *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int n = 0; n < 256; n += 128) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = (int)((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = (int)((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l + 0] = mul(mul(d, (float)sc[is + 0]), (float)q1);
                y[l + 32] = mul(mul(d, (float)sc[is + 2]), (float)q2);
                y[l + 64] = mul(mul(d, (float)sc[is + 4]), (float)q3);
                y[l + 96] = mul(mul(d, (float)sc[is + 6]), (float)q4);
            }
            y += 128;
            ql += 64;
            qh += 32;
            sc += 8;
        }
        break;
    }
    case QT_IQ4_NL: {
        const float d = rdh(b);
        for (int j = 0; j < 16; j++) {
            y[j] = mul(d, (float)c_kv_iq4[b[2 + j] & 0xf]);
            y[j + 16] = mul(d, (float)c_kv_iq4[b[2 + j] >> 4]);
        }
        break;
    }
    case QT_IQ4_XS: {
        const float d = rdh(b);
        const uint32_t sh = rd16(b + 2);
        const uint8_t *sl = b + 4;
        const uint8_t *qs = b + 8;
        for (int ib = 0; ib < 8; ib++) {
            const int ls = ((sl[ib / 2] >> 4 * (ib % 2)) & 0xf) | (int)(((sh >> 2 * ib) & 3) << 4);
            const float dl = mul(d, (float)(ls - 32));
            for (int j = 0; j < 16; j++) {
                y[j] = mul(dl, (float)c_kv_iq4[qs[j] & 0xf]);
                y[j + 16] = mul(dl, (float)c_kv_iq4[qs[j] >> 4]);
            }
            y += 32;
            qs += 16;
        }
        break;
    }
    default: /* the low-bit types: format/quant_blocks.h, as the CPU; F32/F16/BF16: the caller */
        if (qb_handles(type)) qb_dequant_block(type, b, y);
        break;
    }
}

/* One thread per (row, block). Float types use pseudo-blocks of 8 elements. OutT float: the
 * CPU's values bit for bit; OutT __nv_bfloat16: the same values rounded to nearest even (the
 * fast-mode prefill GEMM's weight tiles, written without a float32 copy). */
__device__ __forceinline__ void put_out(float *y, int j, float v) { y[j] = v; }
__device__ __forceinline__ void put_out(__nv_bfloat16 *y, int j, float v) { y[j] = __float2bfloat16_rn(v); }
__device__ __forceinline__ void put_out(__half *y, int j, float v) { y[j] = __float2half_rn(v); }

template <typename OutT>
__global__ void k_dequant_rows(uint32_t type, const uint8_t *__restrict__ w, int64_t row_bytes,
                               int64_t n_rows_w, const int32_t *__restrict__ rows, int64_t n,
                               int64_t nblk, int blk, int bb, OutT *__restrict__ out, int64_t ldo) {
    const int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= n * nblk) return;
    const int64_t i = g / nblk, bi = g % nblk;
    const int64_t r = rows ? (int64_t)rows[i] : i;
    OutT *y = out + i * ldo + bi * blk;
    if (r < 0 || r >= n_rows_w) {
        for (int j = 0; j < blk; j++) put_out(y, j, __int_as_float(0x7fc00000));
        return;
    }
    const uint8_t *b = w + r * row_bytes + bi * (int64_t)bb;
    if (type == QT_F32) {
        for (int j = 0; j < blk; j++) put_out(y, j, __uint_as_float(rd32(b + 4 * j)));
    } else if (type == QT_F16) {
        for (int j = 0; j < blk; j++) put_out(y, j, rdh(b + 2 * j));
    } else if (type == QT_BF16) {
        for (int j = 0; j < blk; j++) put_out(y, j, __uint_as_float(rd16(b + 2 * j) << 16));
    } else {
        float tmp[256];
        deq_block(type, b, tmp);
        for (int j = 0; j < blk; j++) put_out(y, j, tmp[j]);
    }
}

/* ---- elementwise ---- */

__global__ void k_silu_mul(const float *g, int64_t ldg, const float *u, int64_t ldu, float *y,
                           int64_t ldy, int64_t n_rows, int64_t dim) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_rows * dim) return;
    const int64_t r = i / dim, c = i % dim;
    y[r * ldy + c] = rowops_silu_mul(g[r * ldg + c], u[r * ldu + c]);
}

/* k_silu_mul and cuk_q8_quantize in one. Grid: (ceil(dim / 32 / 8), n_rows); block: 8 warps, warp
 * = one 32-element block of a row, lane = one element (q8_quant.cuh). */
template <int P>
__global__ void __launch_bounds__(256)
    k_silu_mul_q8(const float *g, int64_t ldg, const float *u, int64_t ldu, float *y, int64_t ldy, int64_t dim,
                  int8_t *__restrict__ q, int64_t ldq, float *__restrict__ ds, int64_t ldds) {
    const int lane = threadIdx.x & 31;
    const int64_t b = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5), r = blockIdx.y, c = b * 32 + lane;
    if (b * 32 >= dim) return;
    const float v[1] = {rowops_silu_mul(g[r * ldg + c], u[r * ldu + c])};
    y[r * ldy + c] = v[0];
    cuk::q8q::quant_block<1, P>(v, lane, q + r * ldq + b * 32, dim, ds + r * ldds, b);
}

/* y[i] = v rounded to y_type: the one rounding of cuk_convert and cuk_cache_write_rows. */
__device__ __forceinline__ void store_as(void *y, uint32_t y_type, int64_t i, float v) {
    if (y_type == CUK_BF16) ((__nv_bfloat16 *)y)[i] = __float2bfloat16_rn(v);
    else if (y_type == CUK_F16) ((__half *)y)[i] = __float2half_rn(v);
    else ((float *)y)[i] = v;
}

__global__ void k_convert(const float *x, int64_t ldx, void *y, uint32_t y_type, int64_t ldy,
                          int64_t n_rows, int64_t dim) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_rows * dim) return;
    const int64_t r = i / dim, c = i % dim;
    store_as(y, y_type, r * ldy + c, x[r * ldx + c]);
}

/* Elements [0, n_rows * lat_w) are latent elements, the rest (key_w per row) key elements. */
__global__ void k_cache_write(const float *lat_new, int64_t lat_w, void *lat, uint32_t lat_type,
                              const float *key_new, int64_t key_w, float *key, int64_t cap,
                              const int32_t *__restrict__ pos, int64_t n_rows) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t nl = n_rows * lat_w;
    if (i < nl) {
        const int64_t r = i / lat_w, c = i % lat_w, p = pos[r];
        if (p >= 0 && p < cap) store_as(lat, lat_type, p * lat_w + c, lat_new[i]);
    } else if (key_new && i < nl + n_rows * key_w) {
        const int64_t j = i - nl, r = j / key_w, c = j % key_w, p = pos[r];
        if (p >= 0 && p < cap) key[p * key_w + c] = key_new[j];
    }
}

/* k_cache_write for several sequences: row r into rows[r]'s caches at rows[r].pos. */
__global__ void k_cache_write_multi(const float *lat_new, int64_t lat_w, uint32_t lat_type, const float *key_new,
                                    int64_t key_w, const cuk_seq_row *__restrict__ rows, int64_t n_rows) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t nl = n_rows * lat_w;
    if (i < nl) {
        const int64_t r = i / lat_w, c = i % lat_w;
        const cuk_seq_row rw = rows[r];
        if (rw.lat && rw.pos >= 0 && rw.pos < rw.cap) store_as(rw.lat, lat_type, (int64_t)rw.pos * lat_w + c, lat_new[i]);
    } else if (key_new && i < nl + n_rows * key_w) {
        const int64_t j = i - nl, r = j / key_w, c = j % key_w;
        const cuk_seq_row rw = rows[r];
        if (rw.idxk && rw.pos >= 0 && rw.pos < rw.cap) rw.idxk[(int64_t)rw.pos * key_w + c] = key_new[j];
    }
}

__global__ void k_scale(float *x, int64_t n, float s) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __fmul_rn(x[i], s);
}

/* ---- router ---- */

__device__ __forceinline__ bool better(const float *v, int a, int b) {
    return v[a] > v[b] || (v[a] == v[b] && a < b);
}

constexpr int ROUTE_MAX_USED = 64;

/* Grid: one CTA per token; block: n_expert rounded up to whole warps (<= 1024). Thread e owns
 * expert e: its logit and bias are loaded at once, its score and choice computed, then kept in
 * shared memory. Sequential on thread 0 is what must keep the CPU's order (the float64 softmax
 * sum, the group pick over n_group scores). The n_used picks: when no eligible choice is NaN,
 * runtime/cpu/model.c's scan picks the n_used best by the strict order "larger, ties to the lower
 * index", which is each eligible expert's rank under that order being below n_used. An eligible
 * expert with n_used betters inside its own warp (found by shuffles) cannot be among them, so
 * only the others (candidates) are ranked, against the candidates alone: every better of a
 * picked expert is picked too, hence a candidate, so a candidate's rank among candidates is below
 * n_used exactly when its rank among all eligible experts is. The candidates are stored in
 * ascending expert order, so "lower index" is "lower slot". The picks land in rpick[] by rank;
 * warp 0 sorts them by counting and computes the weights one lane per pick: the float64 sum in
 * ascending expert order on every lane (the CPU's order), the division per lane. With a NaN among
 * the eligible choices, warp 0 replays the scan pick by pick (it keeps its first eligible expert
 * if that one is NaN and never picks a NaN otherwise). An earlier kernel that ranked every expert
 * against all n_expert choices in one serial loop took 14.2 us per launch on the H200 at GLM-5's
 * routing against this one's 3.3 us, with the same ids and weights (bench/RESULTS.md). */
__global__ void __launch_bounds__(1024) k_route(cuk_route_args a) {
    extern __shared__ float4 sh4[];
    const int NE = a.n_expert, U = a.n_used, G = a.n_group;
    const int NE4 = (NE + 3) & ~3;
    float *cval = (float *)sh4;                            /* [NE4] candidate choices, by expert */
    float *choice = cval + NE4;                            /* [NE] */
    float *score = choice + NE;                            /* [NE] gating scores */
    float *gscore = score + NE;                            /* [G] */
    int32_t *rpick = (int32_t *)(gscore + G);              /* [ROUTE_MAX_USED] picks by rank */
    int32_t *pick = rpick + ROUTE_MAX_USED;                /* [ROUTE_MAX_USED] picks, ascending */
    int32_t *wcnt = pick + ROUTE_MAX_USED;                 /* [32] candidates per warp */
    uint8_t *allowed = (uint8_t *)(wcnt + 32);             /* [NE] */
    __shared__ double s_sum;
    __shared__ float s_mx[32];
    const int t = blockIdx.x, e = threadIdx.x, lane = e & 31, warp = e >> 5, nw = blockDim.x >> 5;
    const bool mine = e < NE;
    float *lg = a.logits + (int64_t)t * a.ld_logits;
    const float l = mine ? lg[e] : 0.0f;
    const float bias = mine && a.bias ? a.bias[e] : 0.0f;
    float sc = 0.0f;
    if (a.gating == 1) {
        float mx = mine && l > -INFINITY ? l : -INFINITY;
        for (int off = 16; off > 0; off >>= 1) {
            const float o = __shfl_xor_sync(0xffffffffu, mx, off);
            mx = o > mx ? o : mx;
        }
        if (lane == 0) s_mx[warp] = mx;
        __syncthreads();
        mx = s_mx[0];
        for (int i = 1; i < nw; i++) mx = s_mx[i] > mx ? s_mx[i] : mx;
        if (mine) score[e] = expf(l - mx);
        __syncthreads();
        if (e == 0) {
            double sum = 0;
            for (int i = 0; i < NE; i++) sum += score[i]; /* the CPU's order */
            s_sum = sum;
        }
        __syncthreads();
        if (mine) sc = (float)(score[e] / s_sum);
    } else {
        sc = 1.0f / (1.0f + expf(-l));
    }
    const float ce = __fadd_rn(sc, bias);
    if (mine) {
        lg[e] = sc;
        score[e] = sc;
        choice[e] = ce;
        allowed[e] = 1;
    }
    bool elig = mine;
    if (G > 1 && a.topk_group < G) {
        const int gs = NE / G;
        __syncthreads();
        if (e < G) {
            float b1 = -INFINITY, b2 = -INFINITY;
            for (int i = e * gs; i < (e + 1) * gs; i++) {
                if (choice[i] > b1) {
                    b2 = b1;
                    b1 = choice[i];
                } else if (choice[i] > b2) {
                    b2 = choice[i];
                }
            }
            gscore[e] = gs >= 2 ? __fadd_rn(b1, b2) : b1;
        }
        if (mine) allowed[e] = 0;
        __syncthreads();
        if (e == 0)
            for (int k = 0; k < a.topk_group; k++) {
                int best = -1;
                for (int g = 0; g < G; g++)
                    if (!allowed[g * gs] && (best < 0 || better(gscore, g, best))) best = g;
                for (int i = best * gs; i < (best + 1) * gs; i++) allowed[i] = 1;
            }
        __syncthreads();
        elig = mine && allowed[e];
    }
    /* the rank within the warp; NaN (ineligible, or no thread's expert) is never better */
    const float v = elig ? ce : __int_as_float(0x7fc00000);
    int wrank = 0;
#pragma unroll
    for (int j = 0; j < 32; j++) {
        const float o = __shfl_sync(0xffffffffu, v, j);
        wrank += o > v || (o == v && j < lane);
    }
    const bool cand = elig && wrank < U;
    const unsigned bal = __ballot_sync(0xffffffffu, cand);
    if (lane == 0) wcnt[warp] = __popc(bal);
    if (!__syncthreads_or(elig && ce != ce)) {
        /* candidate slots: the warps' counts scanned across a warp's lanes */
        const int wc = lane < nw ? wcnt[lane] : 0;
        int inc = wc;
        for (int off = 1; off < 32; off <<= 1) {
            const int o = __shfl_up_sync(0xffffffffu, inc, off);
            if (lane >= off) inc += o;
        }
        const int n_cand = __shfl_sync(0xffffffffu, inc, 31);
        const int slot = __shfl_sync(0xffffffffu, inc - wc, warp) + __popc(bal & ((1u << lane) - 1u));
        if (cand) cval[slot] = v;
        if (e < 3 && n_cand + e < ((n_cand + 3) & ~3)) cval[n_cand + e] = __int_as_float(0x7fc00000);
        __syncthreads();
        if (cand) {
            int rank = 0;
            const float4 *c4 = (const float4 *)cval;
#pragma unroll 4
            for (int i = 0; i < n_cand; i += 4) {
                const float4 o = c4[i >> 2];
                rank += o.x > v || (o.x == v && i < slot);
                rank += o.y > v || (o.y == v && i + 1 < slot);
                rank += o.z > v || (o.z == v && i + 2 < slot);
                rank += o.w > v || (o.w == v && i + 3 < slot);
            }
            if (rank < U) rpick[rank] = e;
        }
        __syncthreads();
    } else {
        /* the scan replayed, the picks in pick order */
        if (warp == 0) {
            for (int k = 0; k < U; k++) {
                int first = 0x7fffffff, bi = -1;
                float bv = 0.0f;
                for (int i = lane; i < NE; i += 32) {
                    if (!allowed[i]) continue;
                    if (first == 0x7fffffff) first = i;
                    const float cv = choice[i];
                    if (cv == cv && (bi < 0 || cv > bv)) bv = cv, bi = i;
                }
                for (int off = 16; off > 0; off >>= 1) {
                    const int of = __shfl_xor_sync(0xffffffffu, first, off);
                    const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
                    const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
                    first = of < first ? of : first;
                    if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
                }
                int best;
                if (first == 0x7fffffff) best = 0; /* cannot happen: n_used <= eligible experts (checked) */
                else if (choice[first] != choice[first]) best = first;
                else best = bi;
                __syncwarp();
                if (lane == 0) {
                    rpick[k] = best;
                    allowed[best] = 0;
                }
                __syncwarp();
            }
        }
        __syncthreads();
    }
    if (warp != 0) return;
    /* the picks are distinct: a pick's place in ascending order is the count of lower picks */
    for (int k = lane; k < U; k += 32) {
        const int32_t id = rpick[k];
        int p = 0;
        for (int j = 0; j < U; j++) p += rpick[j] < id;
        pick[p] = id;
    }
    __syncwarp();
    double sum = 0;
    for (int k = 0; k < U; k++) sum += score[pick[k]]; /* ascending: the CPU's order */
    int32_t *ch = a.ids + (int64_t)t * U;
    float *cw = a.wts + (int64_t)t * U;
    for (int k = lane; k < U; k += 32) {
        const int32_t id = pick[k];
        float w = score[id];
        if (a.norm) w = (float)(w / (sum + 1e-20));
        ch[k] = id;
        cw[k] = __fmul_rn(w, a.scale);
    }
    if (a.plan) { /* one token (checked): k_moe_plan's plan of these picks, which are distinct, in
                     range and ascending, so each computed pair (weight not 0) is a group of its
                     own, in slot order; __syncwarp orders the lanes' stores before lane 0 reads */
        __syncwarp();
        if (lane == 0) {
            const cuk::PlanParts<int32_t> pp(a.plan, U);
            int32_t *g_e = pp.g_e, *g_start = pp.g_start, *g_cnt = pp.g_cnt, *list = pp.list, *flag = pp.flag;
            int ng = 0;
            for (int k = 0; k < U; k++) {
                const int f = cw[k] == 0.0f ? 0 : 1;
                flag[k] = f;
                if (f) {
                    g_e[ng] = ch[k];
                    g_start[ng] = ng;
                    g_cnt[ng] = 1;
                    list[ng] = k;
                    ng++;
                }
            }
            a.plan[0] = ng;
        }
    }
}

__global__ void k_localize(const int32_t *ids, const float *wts, int64_t cnt, int32_t exp0,
                           int32_t n_local, int32_t *ids_out, float *wts_out) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= cnt) return;
    const int32_t e = ids[i] - exp0;
    const bool mine = e >= 0 && e < n_local;
    const float w = wts[i];
    ids_out[i] = mine ? e : 0;
    wts_out[i] = mine ? w : 0.0f;
}

/* ---- DSA indexer preparation ---- */

constexpr int IP_T = 256, IP_PRE = 4, IP_MAX_PAIRS = 128, IP_MAX_DIM = 128;
constexpr int IP_PRE2 = 8; /* the attention query's pairs loaded up front: 64 heads x 32 pairs at TP 1 */
constexpr int64_t IP_MAX_CTAS = 1 << 20;
struct IpInv {
    float inv[IP_MAX_PAIRS];
};

/* This thread's first NPRE pairs (tid, tid + IP_T, ..) of np, heads head_stride apart from base
 * (n_pairs a head), into v; zero past np. */
template <int NPRE>
__device__ __forceinline__ void ip_load(const float *base, int64_t head_stride, int n_pairs, int np, float2 (&v)[NPRE]) {
#pragma unroll
    for (int j = 0; j < NPRE; j++) {
        const int idx = threadIdx.x + j * IP_T;
        v[j] = make_float2(0.0f, 0.0f);
        if (idx < np) {
            const float *p = base + (int64_t)(idx / n_pairs) * head_stride + 2 * (idx % n_pairs);
            v[j] = make_float2(p[0], p[1]);
        }
    }
}

/* Every pair of this thread (the first NPRE from v, the rest loaded here) rotated by tab and
 * stored. */
template <int NPRE>
__device__ __forceinline__ void ip_rope_store(float *base, int64_t head_stride, int n_pairs, int np, float2 (&v)[NPRE],
                                              const float2 *tab) {
#pragma unroll
    for (int j = 0; j < NPRE; j++) {
        const int idx = threadIdx.x + j * IP_T;
        if (idx < np) {
            float *p = base + (int64_t)(idx / n_pairs) * head_stride + 2 * (idx % n_pairs);
            rowops_rope_rot(v[j].x, v[j].y, tab[idx % n_pairs]);
            p[0] = v[j].x;
            p[1] = v[j].y;
        }
    }
    for (int idx = threadIdx.x + NPRE * IP_T; idx < np; idx += IP_T) {
        float *p = base + (int64_t)(idx / n_pairs) * head_stride + 2 * (idx % n_pairs);
        float a = p[0], b = p[1];
        rowops_rope_rot(a, b, tab[idx % n_pairs]);
        p[0] = a;
        p[1] = b;
    }
}

/* Grid: one CTA per token (tokens loop past the grid); block: IP_T threads. The four small
 * operations cuk_idx_prep names, with the separate kernels' arithmetic (rowops.cuh): warp 0
 * holds the key row (lane l: elements 4l .. 4l + 3, as cuk_layer_norm's one-warp shape for
 * dim <= 128), LayerNorms it (butterfly sums, float64) and ropes it in registers; threads
 * n_pairs form the cos/sin table shared by the key and the n_head query heads; every thread
 * ropes query pairs tid, tid + IP_T, ... (the first IP_PRE loaded up front) and threads < n_head
 * scale the head weights; with q2, the attention query's pairs likewise (the first IP_PRE2 loaded
 * up front). */
__global__ void __launch_bounds__(IP_T)
    k_idx_prep(float *q, float *k, float *w, const float *__restrict__ kw, const float *__restrict__ kb, int n_tok,
               int n_head, int dim, int n_pairs, const int32_t *__restrict__ pos, const IpInv inv, float eps,
               float w_scale, float *q2, int64_t tok_stride2, int n_head2, int head_stride2, int rot_off2) {
    __shared__ float2 tab[IP_MAX_PAIRS];
    const int tid = threadIdx.x, lane = tid & 31;
    const int np = n_head * n_pairs;
    for (int64_t t = blockIdx.x; t < n_tok; t += gridDim.x) {
        float *qt = q + t * n_head * dim, *kt = k + t * dim, *wt = w + t * n_head;
        const int32_t ps = pos[t];
        const int64_t e0 = 4 * lane;
        const bool vk = (((uintptr_t)kt | (uintptr_t)kw | (uintptr_t)kb) & 15) == 0;
        float4 kv = make_float4(0.0f, 0.0f, 0.0f, 0.0f), kwv = kv, kbv = kv;
        if (tid < 32 && e0 < dim) {
            kv = rowops_ld4(kt, e0, dim, vk);
            kwv = rowops_ld4(kw, e0, dim, vk);
            kbv = rowops_ld4(kb, e0, dim, vk);
        }
        float2 v[IP_PRE], v2[IP_PRE2];
        ip_load(qt, dim, n_pairs, np, v);
        /* the attention query's first pairs too, so their loads overlap the key's norm */
        float *q2t = q2 ? q2 + t * tok_stride2 + rot_off2 : nullptr;
        const int np2 = q2 ? n_head2 * n_pairs : 0;
        ip_load(q2t, head_stride2, n_pairs, np2, v2);
        if (tid < n_head) wt[tid] = __fmul_rn(wt[tid], w_scale);
        __syncthreads(); /* the previous token's table is no longer read */
        for (int i = tid; i < n_pairs; i += IP_T) tab[i] = rowops_rope_cs(ps, inv.inv[i]);
        double mean = 0.0, dinv = 0.0;
        if (tid < 32) {
            double s = 0.0;
            if (e0 < dim) s += rowops_chunk_sum(kv, e0, dim);
            mean = rowops_warp_sum(s) / (double)dim;
            double v2 = 0.0;
            if (e0 < dim) v2 += rowops_chunk_var(kv, e0, dim, mean);
            const double var = rowops_warp_sum(v2) / (double)dim;
            dinv = 1.0 / sqrt(var + (double)eps);
        }
        __syncthreads();
        if (tid < 32 && e0 < dim) {
            kv = make_float4(rowops_ln_out(kv.x, mean, dinv, kwv.x, kbv.x), rowops_ln_out(kv.y, mean, dinv, kwv.y, kbv.y),
                             rowops_ln_out(kv.z, mean, dinv, kwv.z, kbv.z), rowops_ln_out(kv.w, mean, dinv, kwv.w, kbv.w));
            if (2 * lane < n_pairs) rowops_rope_rot(kv.x, kv.y, tab[2 * lane]);
            if (2 * lane + 1 < n_pairs) rowops_rope_rot(kv.z, kv.w, tab[2 * lane + 1]);
            rowops_st4(kt, e0, dim, vk, kv);
        }
        ip_rope_store(qt, dim, n_pairs, np, v, tab);
        ip_rope_store(q2t, head_stride2, n_pairs, np2, v2, tab); /* the attention's query, same table */
    }
}

unsigned grid_for(int64_t n, int threads) { return (unsigned)((n + threads - 1) / threads); }

} // namespace

/* Grid: one thread per (row i, 32-element sub-block) of a block type, 256 per CTA. Each thread
 * decodes its sub-block with cuda/deq_sub.h's deq_sub (the CPU's operations, so deq_block's
 * values) into registers, rounds once to OutT and stores 64 bytes, as four 16-byte vectors when
 * the output rows allow it: every thread busy and no staging buffer (the former kernel decoded
 * a whole 256-element block per thread through 33 KB of shared memory per warp, about 6 warps
 * per SM; bench/RESULTS.md, the pp512 profile). */
__device__ __forceinline__ uint32_t pack2(float a, float b, __half *) {
    const __half2 h = __floats2half2_rn(a, b);
    return *(const uint32_t *)(const void *)&h;
}
__device__ __forceinline__ uint32_t pack2(float a, float b, __nv_bfloat16 *) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *(const uint32_t *)(const void *)&h;
}

template <typename OutT>
__global__ void __launch_bounds__(256)
    k_dequant_sub16(uint32_t type, const uint8_t *__restrict__ w, int64_t row_bytes, int64_t n_rows_w,
                    const int32_t *__restrict__ rows, int64_t n, int64_t nsub, int spb, int bb,
                    OutT *__restrict__ out, int64_t ldo, int vec) {
    const int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= n * nsub) return;
    const int64_t i = g / nsub, sb = g % nsub, bi = sb / spb;
    const int s = (int)(sb % spb);
    const int64_t r = rows ? (int64_t)rows[i] : i;
    float y[32];
    if (r < 0 || r >= n_rows_w) {
#pragma unroll
        for (int j = 0; j < 32; j++) y[j] = __int_as_float(0x7fc00000);
    } else {
        deq_sub(type, w + r * row_bytes + bi * (int64_t)bb, s, y);
    }
    OutT *o = out + i * ldo + sb * 32;
    uint32_t p[16];
#pragma unroll
    for (int j = 0; j < 16; j++) p[j] = pack2(y[2 * j], y[2 * j + 1], o);
    if (vec) {
        uint4 *o4 = (uint4 *)(void *)o;
#pragma unroll
        for (int q = 0; q < 4; q++) o4[q] = make_uint4(p[4 * q], p[4 * q + 1], p[4 * q + 2], p[4 * q + 3]);
    } else {
        uint16_t *o2 = (uint16_t *)(void *)o;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            o2[2 * j] = (uint16_t)(p[j] & 0xffffu);
            o2[2 * j + 1] = (uint16_t)(p[j] >> 16);
        }
    }
}

/* The types deq_sub does not decode (the low-bit ones of format/quant_blocks.h).
 * Grid: one warp (DQ_W threads) per DQ_W consecutive (row, block) pairs of a quantized type
 * (blocks of 32 or 256 elements). Each thread decodes its block with deq_block straight into
 * shared memory (rows padded by one float: the threads' writes of one index fall in distinct
 * banks), then the warp stores the DQ_W blocks, each as 32-lane runs of consecutive elements, so
 * the 16-bit tiles are written coalesced and no per-thread stack array exists. Same values as
 * k_dequant_rows, rounded once to OutT. */
constexpr int DQ_W = 32;

template <typename OutT>
__global__ void __launch_bounds__(DQ_W)
    k_dequant_rows_sh(uint32_t type, const uint8_t *__restrict__ w, int64_t row_bytes, int64_t n_rows_w,
                      const int32_t *__restrict__ rows, int64_t n, int64_t nblk, int blk, int bb,
                      OutT *__restrict__ out, int64_t ldo) {
    __shared__ float sh[DQ_W * 257];
    const int lane = threadIdx.x;
    const int64_t g0 = (int64_t)blockIdx.x * DQ_W, g = g0 + lane, total = n * nblk;
    if (g < total) {
        const int64_t i = g / nblk, bi = g % nblk;
        const int64_t r = rows ? (int64_t)rows[i] : i;
        float *y = sh + lane * 257;
        if (r < 0 || r >= n_rows_w) {
            for (int j = 0; j < blk; j++) y[j] = __int_as_float(0x7fc00000);
        } else {
            deq_block(type, w + r * row_bytes + bi * (int64_t)bb, y);
        }
    }
    __syncwarp();
    for (int u = 0; u < DQ_W && g0 + u < total; u++) {
        const int64_t gu = g0 + u, i = gu / nblk, bi = gu % nblk;
        OutT *y = out + i * ldo + bi * blk;
        const float *src = sh + u * 257;
        for (int j = lane; j < blk; j += DQ_W) put_out(y, j, src[j]);
    }
}

template <typename OutT>
static g5_status dequant_rows(const cuk_dequant_rows_args *a, cuk_stream stream, g5_error *err) {
    const uint32_t w_type = a->w_type;
    const void *const w = a->w;
    const int32_t *const rows = a->rows;
    OutT *const out = (OutT *)a->out;
    const int64_t k = a->k, n_rows_w = a->n_rows_w, n = a->n, ldo = a->ldo;
    if (!cuk_gemv_supported(w_type)) return BAD("dequant_rows: type %u (%s) not supported", w_type, quant_type_name(w_type));
    if (!w || !out) return BAD("dequant_rows: NULL pointer");
    if (n < 1 || k < 1 || n_rows_w < 1) return BAD("dequant_rows: n=%lld k=%lld n_rows_w=%lld must be positive", (long long)n, (long long)k, (long long)n_rows_w);
    if (ldo < k) return BAD("dequant_rows: ldo=%lld < k=%lld", (long long)ldo, (long long)k);
    const quant_type_info *ti = quant_type_get(w_type);
    int blk = (int)ti->block_elems, bb = (int)ti->block_bytes;
    if (blk == 1) { /* float types: pseudo-blocks of 8 elements */
        blk = 8;
        bb = 8 * (int)ti->block_bytes;
    }
    if (k % blk) return BAD("dequant_rows: k=%lld is not a multiple of %d", (long long)k, blk);
    uint64_t row_bytes;
    if (quant_row_bytes(w_type, (uint64_t)k, &row_bytes)) return BAD("dequant_rows: row bytes of k=%lld", (long long)k);
    const int64_t nblk = k / blk;
    if (n > INT64_MAX / nblk) return BAD("dequant_rows: n * blocks overflows");
    if constexpr (sizeof(OutT) == 2) {
        if (blk >= 32 && !deq_sub_handles(w_type)) {
            k_dequant_rows_sh<OutT><<<grid_for(n * nblk, DQ_W), DQ_W, 0, (cudaStream_t)stream>>>(
                w_type, (const uint8_t *)w, (int64_t)row_bytes, n_rows_w, rows, n, nblk, blk, bb, out, ldo);
            CUK_CHECK_LAUNCH("dequant_rows");
            return G5_OK;
        }
        if (blk >= 32) {
            const int spb = blk / 32, vec = (uintptr_t)out % 16 == 0 && ldo % 8 == 0;
            const int64_t nsub = nblk * spb;
            if (n > INT64_MAX / nsub) return BAD("dequant_rows: n * sub-blocks overflows");
            k_dequant_sub16<OutT><<<grid_for(n * nsub, 256), 256, 0, (cudaStream_t)stream>>>(
                w_type, (const uint8_t *)w, (int64_t)row_bytes, n_rows_w, rows, n, nsub, spb, bb, out, ldo, vec);
            CUK_CHECK_LAUNCH("dequant_rows");
            return G5_OK;
        }
    }
    k_dequant_rows<OutT><<<grid_for(n * nblk, 128), 128, 0, (cudaStream_t)stream>>>(
        w_type, (const uint8_t *)w, (int64_t)row_bytes, n_rows_w, rows, n, nblk, blk, bb, out, ldo);
    CUK_CHECK_LAUNCH("dequant_rows");
    return G5_OK;
}

extern "C" g5_status cuk_dequant_rows(const cuk_dequant_rows_args *a, cuk_stream stream, g5_error *err) {
    if (!a) return BAD("dequant_rows: no args");
    return dequant_rows<float>(a, stream, err);
}

extern "C" g5_status cuk_dequant_rows_16(const cuk_dequant_rows_args *a, cuk_stream stream, g5_error *err) {
    if (!a) return BAD("dequant_rows_16: no args");
    if (a->out_type == CUK_BF16) return dequant_rows<__nv_bfloat16>(a, stream, err);
    if (a->out_type == CUK_F16) return dequant_rows<__half>(a, stream, err);
    return BAD("dequant_rows_16: out_type %u (bf16 or f16)", a->out_type);
}

extern "C" g5_status cuk_silu_mul(const float *g, int64_t ldg, const float *u, int64_t ldu,
                                  float *y, int64_t ldy, int64_t n_rows, int64_t dim,
                                  cuk_stream stream, g5_error *err) {
    if (!g || !u || !y) return BAD("silu_mul: NULL pointer");
    if (n_rows < 1 || dim < 1) return BAD("silu_mul: n_rows=%lld dim=%lld must be positive", (long long)n_rows, (long long)dim);
    if (ldg < dim || ldu < dim || ldy < dim) return BAD("silu_mul: leading dimension below dim=%lld", (long long)dim);
    k_silu_mul<<<grid_for(n_rows * dim, 256), 256, 0, (cudaStream_t)stream>>>(g, ldg, u, ldu, y, ldy, n_rows, dim);
    CUK_CHECK_LAUNCH("silu_mul");
    return G5_OK;
}

extern "C" g5_status cuk_silu_mul_q8(const cuk_silu_mul_q8_args *a, cuk_stream stream, g5_error *err) {
    if (!a) return BAD("silu_mul_q8: no args");
    if (!a->g || !a->u || !a->y) return BAD("silu_mul_q8: NULL pointer");
    if (a->n_rows < 1 || a->n_rows > 65535) return BAD("silu_mul_q8: n_rows=%lld outside 1..65535", (long long)a->n_rows);
    const int64_t P = a->planes, dim = a->dim;
    if (P != 1 && P != 2) return BAD("silu_mul_q8: planes=%lld is neither 1 nor 2", (long long)P);
    if (dim <= 0 || dim % (32 * P) || dim > (1LL << 24))
        return BAD("silu_mul_q8: dim=%lld is not a positive multiple of %lld", (long long)dim, (long long)(32 * P));
    if (a->ldg < dim || a->ldu < dim || a->ldy < dim) return BAD("silu_mul_q8: leading dimension below dim=%lld", (long long)dim);
    const cuk_q8_act o = {a->q, a->ldq, a->ds, a->ldds, a->planes};
    const g5_status st = cuk::q8_check_act("silu_mul_q8", "out", &o, dim, err);
    if (st != G5_OK) return st;
    const dim3 grid((unsigned)((dim / 32 + 7) / 8), (unsigned)a->n_rows);
    if (P == 2)
        k_silu_mul_q8<2><<<grid, 256, 0, (cudaStream_t)stream>>>(a->g, a->ldg, a->u, a->ldu, a->y, a->ldy, dim, a->q,
                                                                 a->ldq, a->ds, a->ldds);
    else
        k_silu_mul_q8<1><<<grid, 256, 0, (cudaStream_t)stream>>>(a->g, a->ldg, a->u, a->ldu, a->y, a->ldy, dim, a->q,
                                                                 a->ldq, a->ds, a->ldds);
    CUK_CHECK_LAUNCH("silu_mul_q8");
    return G5_OK;
}

extern "C" g5_status cuk_convert(const float *x, int64_t ldx, void *y, uint32_t y_type, int64_t ldy,
                                 int64_t n_rows, int64_t dim, cuk_stream stream, g5_error *err) {
    if (!x || !y) return BAD("convert: NULL pointer");
    if (y_type != CUK_F32 && y_type != CUK_BF16 && y_type != CUK_F16) return BAD("convert: y_type %u", y_type);
    if (n_rows < 1 || dim < 1) return BAD("convert: n_rows=%lld dim=%lld must be positive", (long long)n_rows, (long long)dim);
    if (ldx < dim || ldy < dim) return BAD("convert: leading dimension below dim=%lld", (long long)dim);
    if ((uintptr_t)y % 4) return BAD("convert: y is not 4-byte aligned");
    k_convert<<<grid_for(n_rows * dim, 256), 256, 0, (cudaStream_t)stream>>>(x, ldx, y, y_type, ldy, n_rows, dim);
    CUK_CHECK_LAUNCH("convert");
    return G5_OK;
}

extern "C" g5_status cuk_cache_write_rows(const cuk_cache_write_rows_args *a, cuk_stream stream, g5_error *err) {
    if (!a) return BAD("cache_write_rows: no args");
    const float *const lat_new = a->lat_new, *const key_new = a->key_new;
    void *const lat = a->lat;
    float *const key = a->key;
    const uint32_t lat_type = a->lat_type;
    const int64_t lat_w = a->lat_w, key_w = a->key_w, cap = a->cap, n_rows = a->n_rows;
    const int32_t *const pos = a->pos;
    if (!lat_new || !lat || !pos || (key_new && !key)) return BAD("cache_write_rows: NULL pointer");
    if (lat_type != CUK_F32 && lat_type != CUK_BF16 && lat_type != CUK_F16)
        return BAD("cache_write_rows: lat_type %u", lat_type);
    if (n_rows < 1 || lat_w < 1 || cap < 1 || (key_new && key_w < 1))
        return BAD("cache_write_rows: n_rows=%lld lat_w=%lld key_w=%lld cap=%lld must be positive", (long long)n_rows,
                   (long long)lat_w, (long long)key_w, (long long)cap);
    if ((uintptr_t)lat % 4) return BAD("cache_write_rows: lat is not 4-byte aligned");
    const int64_t per = lat_w + (key_new ? key_w : 0);
    if (per > INT64_MAX / n_rows || cap > INT64_MAX / per) return BAD("cache_write_rows: sizes overflow");
    k_cache_write<<<grid_for(n_rows * per, 256), 256, 0, (cudaStream_t)stream>>>(lat_new, lat_w, lat, lat_type, key_new,
                                                                                 key_w, key, cap, pos, n_rows);
    CUK_CHECK_LAUNCH("cache_write_rows");
    return G5_OK;
}

extern "C" g5_status cuk_cache_write_multi(const float *lat_new, int64_t lat_w, uint32_t lat_type,
                                           const float *key_new, int64_t key_w, const cuk_seq_row *rows,
                                           int32_t n_tok, cuk_stream stream, g5_error *err) {
    if (!lat_new || !rows) return BAD("cache_write_multi: NULL pointer");
    if (lat_type != CUK_F32 && lat_type != CUK_BF16 && lat_type != CUK_F16)
        return BAD("cache_write_multi: lat_type %u", lat_type);
    if (n_tok < 1 || lat_w < 1 || lat_w > (1 << 20) || (key_new && (key_w < 1 || key_w > (1 << 20))))
        return BAD("cache_write_multi: n_tok=%d lat_w=%lld key_w=%lld", n_tok, (long long)lat_w, (long long)key_w);
    const int64_t per = lat_w + (key_new ? key_w : 0);
    k_cache_write_multi<<<grid_for((int64_t)n_tok * per, 256), 256, 0, (cudaStream_t)stream>>>(
        lat_new, lat_w, lat_type, key_new, key_w, rows, n_tok);
    CUK_CHECK_LAUNCH("cache_write_multi");
    return G5_OK;
}

extern "C" g5_status cuk_scale(float *x, int64_t n, float s, cuk_stream stream, g5_error *err) {
    if (!x) return BAD("scale: NULL pointer");
    if (n < 1) return BAD("scale: n=%lld must be positive", (long long)n);
    k_scale<<<grid_for(n, 256), 256, 0, (cudaStream_t)stream>>>(x, n, s);
    CUK_CHECK_LAUNCH("scale");
    return G5_OK;
}

extern "C" g5_status cuk_moe_route(const cuk_route_args *a, cuk_stream stream, g5_error *err) {
    if (!a || !a->logits || !a->ids || !a->wts) return BAD("moe_route: NULL pointer");
    if (a->n_tok < 1 || a->n_tok > 2147483647) return BAD("moe_route: n_tok=%d must be positive", a->n_tok);
    if (a->n_expert < 1 || a->n_expert > 1024) return BAD("moe_route: n_expert=%d outside 1..1024", a->n_expert);
    if (a->ld_logits < a->n_expert) return BAD("moe_route: ld_logits=%lld < n_expert=%d", (long long)a->ld_logits, a->n_expert);
    if (a->n_group < 1 || a->n_expert % a->n_group) return BAD("moe_route: n_group=%d does not divide n_expert=%d", a->n_group, a->n_expert);
    if (a->topk_group < 1 || a->topk_group > a->n_group) return BAD("moe_route: topk_group=%d outside 1..%d", a->topk_group, a->n_group);
    const int eligible = a->n_group > 1 && a->topk_group < a->n_group ? a->topk_group * (a->n_expert / a->n_group) : a->n_expert;
    if (a->n_used < 1 || a->n_used > ROUTE_MAX_USED || a->n_used > eligible)
        return BAD("moe_route: n_used=%d outside 1..min(64, %d eligible experts)", a->n_used, eligible);
    if (a->plan && a->n_tok != 1) return BAD("moe_route: a plan is written for one token, not %d", a->n_tok);
    const unsigned threads = (unsigned)(a->n_expert + 31) / 32 * 32;
    const size_t smem = (size_t)((a->n_expert + 3) / 4 * 4 + 2 * a->n_expert + a->n_group) * sizeof(float) +
                        (2 * ROUTE_MAX_USED + 32) * sizeof(int32_t) + (size_t)a->n_expert + 16;
    k_route<<<(unsigned)a->n_tok, threads, smem, (cudaStream_t)stream>>>(*a);
    CUK_CHECK_LAUNCH("moe_route");
    return G5_OK;
}

extern "C" g5_status cuk_moe_localize(const int32_t *ids, const float *wts, int64_t cnt,
                                      int32_t exp0, int32_t n_local, int32_t *ids_out,
                                      float *wts_out, cuk_stream stream, g5_error *err) {
    if (!ids || !wts || !ids_out || !wts_out) return BAD("moe_localize: NULL pointer");
    if (cnt < 1 || n_local < 1 || exp0 < 0) return BAD("moe_localize: cnt=%lld n_local=%d exp0=%d", (long long)cnt, n_local, exp0);
    k_localize<<<grid_for(cnt, 256), 256, 0, (cudaStream_t)stream>>>(ids, wts, cnt, exp0, n_local, ids_out, wts_out);
    CUK_CHECK_LAUNCH("moe_localize");
    return G5_OK;
}

extern "C" g5_status cuk_idx_prep(const cuk_idx_prep_args *a, cuk_stream stream, g5_error *err) {
    if (!a) return BAD("idx_prep: no args");
    float *const q = a->q, *const k = a->k, *const w = a->w;
    const float *const k_norm_w = a->k_norm_w, *const k_norm_b = a->k_norm_b;
    const int32_t n_tok = a->n_tok, n_head = a->n_head, dim = a->dim, n_rot = a->n_rot;
    const int32_t *const pos = a->pos;
    const float theta = a->theta, eps = a->eps, w_scale = a->w_scale;
    if ((n_head && (!q || !w)) || !k || !k_norm_w || !k_norm_b || !pos) return BAD("idx_prep: NULL pointer");
    if (n_tok < 1 || n_head < 0 || dim < 1)
        return BAD("idx_prep: n_tok=%d dim=%d must be positive, n_head=%d not negative", n_tok, dim, n_head);
    if (n_rot < 2 || n_rot % 2 || n_rot > dim) return BAD("idx_prep: n_rot=%d must be even and in 2..dim=%d", n_rot, dim);
    const cuk_rope_args r2 = {a->q2, n_tok, a->tok_stride2, a->n_head2, a->head_stride2, a->rot_off2, n_rot, theta, pos};
    if (a->q2) { /* cuk_rope's checks of the second query, and its pairs within int range */
        if (a->n_head2 < 1 || a->rot_off2 < 0 || (a->n_head2 > 1 && a->head_stride2 < a->rot_off2 + n_rot) ||
            (n_tok > 1 && a->tok_stride2 < (int64_t)(a->n_head2 - 1) * a->head_stride2 + a->rot_off2 + n_rot) ||
            (int64_t)a->n_head2 * n_rot / 2 > 0x7fffffff)
            return BAD("idx_prep: q2 heads %d x %d from %d, tokens %lld apart, do not hold %d rotated elements each",
                       a->n_head2, a->head_stride2, a->rot_off2, (long long)a->tok_stride2, n_rot);
        /* the kernel loads q2's first pairs before it writes q, k and w */
        const float *b2 = a->q2, *e2 = a->q2 + (int64_t)(n_tok - 1) * a->tok_stride2 +
                                               (int64_t)(a->n_head2 - 1) * a->head_stride2 + a->rot_off2 + n_rot;
        const float *bs[3] = {q, k, w}, *es[3] = {q + (int64_t)n_tok * n_head * dim, k + (int64_t)n_tok * dim,
                                                    w + (int64_t)n_tok * n_head};
        for (int i = 0; i < 3; i++)
            if (b2 < es[i] && bs[i] < e2) return BAD("idx_prep: q2 overlaps q, k or w");
    }
    if (dim > IP_MAX_DIM || n_rot / 2 > IP_MAX_PAIRS || (int64_t)n_head * n_rot / 2 > 0x7fffffff) {
        /* beyond the fused kernel's one-warp key row: the separate launches */
        const cuk_rope_args rq = {q, n_tok, (int64_t)n_head * dim, n_head, dim, 0, n_rot, theta, pos};
        const cuk_layer_norm_args ln = {k, dim, k_norm_w, k_norm_b, k, dim, n_tok, dim, eps};
        const cuk_rope_args rk = {k, n_tok, dim, 1, dim, 0, n_rot, theta, pos};
        g5_status st = n_head ? cuk_rope(&rq, stream, err) : G5_OK;
        if (!st) st = cuk_layer_norm(&ln, stream, err);
        if (!st) st = cuk_rope(&rk, stream, err);
        if (!st && n_head) st = cuk_scale(w, (int64_t)n_tok * n_head, w_scale, stream, err);
        if (!st && a->q2) st = cuk_rope(&r2, stream, err);
        return st;
    }
    if (!(eps >= 0.0f)) return BAD("idx_prep: eps=%g must be >= 0", (double)eps);
    if (!(theta > 0.0f)) return BAD("idx_prep: theta=%g must be positive", (double)theta);
    IpInv inv;
    const int n_pairs = rowops_rope_inv(theta, n_rot, inv.inv); /* as cuk_rope */
    k_idx_prep<<<(unsigned)(n_tok < IP_MAX_CTAS ? n_tok : IP_MAX_CTAS), IP_T, 0, (cudaStream_t)stream>>>(
        q, k, w, k_norm_w, k_norm_b, n_tok, n_head, dim, n_pairs, pos, inv, eps, w_scale, a->q2, a->tok_stride2,
        a->n_head2, a->head_stride2, a->rot_off2);
    CUK_CHECK_LAUNCH("idx_prep");
    return G5_OK;
}
