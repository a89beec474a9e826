/* MLA absorbed attention over the latent cache (cuda/cuk_model.h): query absorption through
 * W_UK and the attention itself, for prefill and decode alike (each query token attends the
 * key positions the indexer chose for it).
 *
 * Two kernels for each launcher, chosen by the shape. The split ones spread a token's work over
 * many SMs: absorption over column slices of W_UK, attention (k_attend_hg) over a thread-block
 * cluster that splits the selected keys, 8 heads per block sharing each latent tile
 * (flash-decoding: each block keeps a running max / sum / weighted latent sum per head, the
 * cluster combines them through distributed shared memory, so no global scratch is needed). The
 * first ones, one block per (head, token), run prefill-sized launches and the shapes the split
 * ones do not cover. A one-token absorption (a decode step at batch 1) takes k_absorb_one, each
 * thread a whole column of W_UK in registers; all three absorption kernels add in the CPU's order. */
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/attn_int.cuh"
#include "cuda/cuk_internal.cuh"
#include "cuda/cuk_model.h"
#include "cuda/rowops.cuh"

#define BAD(...) g5_fail(err, G5_ERR_INVALID_ARG, __VA_ARGS__)

namespace {

constexpr int ABS_TOK = 8;      /* tokens per absorb block: each W_UK element is read once for all */
constexpr int ABS_THREADS = 256;
constexpr int ATT_THREADS = 128;
constexpr int ATT_WARPS = ATT_THREADS / 32;

/* The key range of a token set whose first position is read from the device (dpos: a CUDA-graph
 * step, cuk_mla_attend_dev): n_pos = pos0 + n_tok, fresh rows (if any) the call's own tokens from
 * pos0 on. Without dpos the host's values stay. 0 when *dpos is outside [0, bound - n_tok]. */
__device__ __forceinline__ bool dev_range(const int32_t *dpos, int64_t bound, int n_tok, bool has_fresh,
                                          int64_t *fresh0, int64_t *n_pos) {
    if (!dpos) return true;
    const int64_t p = *dpos;
    *n_pos = p + n_tok;
    *fresh0 = has_fresh ? p : *n_pos;
    return p >= 0 && p + n_tok <= bound;
}

/* grid (n_head, ceil(n_tok / ABS_TOK)) */
__global__ void k_absorb(cuk_mla_dims d, const float *__restrict__ q, const float *__restrict__ kvb,
                         int32_t head_rows, float *__restrict__ qlat) {
    extern __shared__ float qs[]; /* [ABS_TOK][nope] */
    const int h = blockIdx.x;
    const int t0 = blockIdx.y * ABS_TOK;
    const int nt = min(ABS_TOK, d.n_tok - t0);
    const int QW = d.nope + d.rope;
    for (int i = threadIdx.x; i < nt * d.nope; i += blockDim.x) {
        const int tt = i / d.nope, dd = i % d.nope;
        qs[i] = q[((int64_t)(t0 + tt) * d.n_head + h) * QW + dd];
    }
    __syncthreads();
    const float *W = kvb + (int64_t)h * head_rows * d.kv_lora; /* [nope][kv_lora] */
    for (int c = threadIdx.x; c < d.kv_lora; c += blockDim.x) {
        float acc[ABS_TOK];
#pragma unroll
        for (int tt = 0; tt < ABS_TOK; tt++) acc[tt] = 0.0f;
        for (int dd = 0; dd < d.nope; dd++) {
            const float w = W[(int64_t)dd * d.kv_lora + c];
#pragma unroll
            for (int tt = 0; tt < ABS_TOK; tt++)
                if (tt < nt) acc[tt] = __fadd_rn(acc[tt], __fmul_rn(qs[tt * d.nope + dd], w));
        }
        for (int tt = 0; tt < nt; tt++) qlat[((int64_t)(t0 + tt) * d.n_head + h) * d.kv_lora + c] = acc[tt];
    }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float ldf(const float *p) { return *p; }
__device__ __forceinline__ float ldf(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ float ldf(const __half *p) { return __half2float(*p); }

/* grid (n_head, n_tok), ATT_THREADS threads. Shared: q [kv_lora + rope], p [max_sel],
 * pos [max_sel]. */
template <typename T>
__global__ void k_attend(cuk_mla_dims d, const float *__restrict__ q, const float *__restrict__ qlat,
                         const T *__restrict__ lat, const float *__restrict__ fresh, int64_t fresh0,
                         int64_t n_pos, const int32_t *__restrict__ dpos, int64_t bound,
                         const int32_t *__restrict__ sel, int64_t ld_sel, const int32_t *__restrict__ n_sel,
                         int32_t max_sel, float scale, float *__restrict__ out) {
    extern __shared__ float sm[];
    __shared__ int bad, bad_pos; /* two flags: one is read while the other may be written */
    __shared__ float red_f[ATT_WARPS];
    __shared__ double red_d[ATT_WARPS];
    const int h = blockIdx.x, t = blockIdx.y;
    const int KL = d.kv_lora, R = d.rope, KVW = KL + R;
    float *qv = sm;                          /* [KL + R] */
    float *p = sm + KVW;                     /* [max_sel] */
    int32_t *ps = (int32_t *)(p + max_sel);  /* [max_sel] */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t row = (int64_t)t * d.n_head + h;
    float *o = out + row * KL;
    const bool pos_ok = dev_range(dpos, bound, (int)gridDim.y, fresh != nullptr, &fresh0, &n_pos);
    /* no list: every key up to the token's position (the call's tokens are the last positions) */
    const int ns = sel ? n_sel[t] : (int)min(n_pos - ((int64_t)gridDim.y - 1 - t), (int64_t)max_sel + 1);
    if (threadIdx.x == 0) bad = ns < 1 || ns > max_sel || !pos_ok;
    for (int c = threadIdx.x; c < KL; c += blockDim.x) qv[c] = qlat[row * KL + c];
    for (int i = threadIdx.x; i < R; i += blockDim.x) qv[KL + i] = q[row * (d.nope + R) + d.nope + i];
    __syncthreads();
    if (bad) {
        for (int c = threadIdx.x; c < KL; c += blockDim.x) o[c] = nanf_();
        return;
    }
    if (threadIdx.x == 0) bad_pos = 0;
    __syncthreads();
    for (int j = threadIdx.x; j < ns; j += blockDim.x) {
        const int32_t s = sel ? sel[(int64_t)t * ld_sel + j] : j;
        ps[j] = s;
        if (s < 0 || s >= n_pos) bad_pos = 1;
    }
    __syncthreads();
    if (bad_pos) {
        for (int c = threadIdx.x; c < KL; c += blockDim.x) o[c] = nanf_();
        return;
    }
    /* scores: a warp per key */
    for (int j = warp; j < ns; j += ATT_WARPS) {
        float a = 0.0f, b = 0.0f;
        if (fresh && ps[j] >= fresh0) {
            const float *kr = fresh + (int64_t)(ps[j] - fresh0) * KVW;
            for (int c = lane; c < KL; c += 32) a += qv[c] * kr[c];
            for (int i = lane; i < R; i += 32) b += qv[KL + i] * kr[KL + i];
        } else {
            const T *kr = lat + (int64_t)ps[j] * KVW;
            for (int c = lane; c < KL; c += 32) a += qv[c] * ldf(kr + c);
            for (int i = lane; i < R; i += 32) b += qv[KL + i] * ldf(kr + KL + i);
        }
        a = warp_sum(a);
        b = warp_sum(b);
        if (lane == 0) p[j] = __fmul_rn(__fadd_rn(a, b), scale);
    }
    __syncthreads();
    /* softmax: max, exp, sum in double, one reciprocal */
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < ns; j += blockDim.x) mx = fmaxf(mx, p[j]);
    mx = warp_max(mx);
    if (lane == 0) red_f[warp] = mx;
    __syncthreads();
    mx = red_f[0];
    for (int w = 1; w < ATT_WARPS; w++) mx = fmaxf(mx, red_f[w]);
    double sum = 0.0;
    for (int j = threadIdx.x; j < ns; j += blockDim.x) {
        const float e = expf(__fsub_rn(p[j], mx));
        p[j] = e;
        sum += (double)e;
    }
    sum = warp_sum_d(sum);
    if (lane == 0) red_d[warp] = sum;
    __syncthreads();
    sum = 0.0;
    for (int w = 0; w < ATT_WARPS; w++) sum += red_d[w];
    const float inv = (float)(1.0 / sum);
    /* output: each thread its latent columns, keys in ascending order */
    for (int c = threadIdx.x; c < KL; c += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < ns; j++) {
            const float v = fresh && ps[j] >= fresh0 ? fresh[(int64_t)(ps[j] - fresh0) * KVW + c]
                                                     : ldf(lat + (int64_t)ps[j] * KVW + c);
            acc = __fadd_rn(acc, __fmul_rn(__fmul_rn(p[j], inv), v));
        }
        o[c] = acc;
    }
}

/* ---- split implementations ---- */

namespace cg = cooperative_groups;

constexpr int AB_COLS = 32;  /* W_UK columns per absorb block: one per lane */
constexpr int AB_TOK = 32;   /* tokens per absorb block: four per thread (warp w: w, w + 8, w + 16, w + 24) */
constexpr int AB_THREADS = 256;
constexpr int AB_TW = AB_TOK / (AB_THREADS / 32); /* tokens per warp */

/* Column c0 + lane of the absorbed query for NU tokens warp, warp + 8, .. of the block, summed over d
 * in order (the CPU's operations): each w read from shared memory serves NU tokens; with F4 each
 * float4 of a token's q serves four d (nope % 4 == 0). A block of one token (a decode step at batch
 * 1) is one warp's dependent chain: it takes the scalar loop, as before the multi-token form. */
template <int NU, bool F4>
__device__ __forceinline__ void absorb_cols(const float *qs, const float *ws, int N, int KL, int c0, int lane,
                                            int warp, int t0, int n_head, int h, float *__restrict__ qlat) {
    float acc[NU];
#pragma unroll
    for (int u = 0; u < NU; u++) acc[u] = 0.0f;
    if (F4 && N % 4 == 0) {
#pragma unroll 2
        for (int dd = 0; dd < N; dd += 4) {
            const float w0 = ws[dd * AB_COLS + lane], w1 = ws[(dd + 1) * AB_COLS + lane],
                        w2 = ws[(dd + 2) * AB_COLS + lane], w3 = ws[(dd + 3) * AB_COLS + lane];
#pragma unroll
            for (int u = 0; u < NU; u++) {
                const float4 qv = *(const float4 *)(qs + (warp + u * (AB_THREADS / 32)) * N + dd);
                acc[u] = __fadd_rn(acc[u], __fmul_rn(qv.x, w0));
                acc[u] = __fadd_rn(acc[u], __fmul_rn(qv.y, w1));
                acc[u] = __fadd_rn(acc[u], __fmul_rn(qv.z, w2));
                acc[u] = __fadd_rn(acc[u], __fmul_rn(qv.w, w3));
            }
        }
    } else {
#pragma unroll 8
        for (int dd = 0; dd < N; dd++) {
            const float w = ws[dd * AB_COLS + lane];
#pragma unroll
            for (int u = 0; u < NU; u++)
                acc[u] = __fadd_rn(acc[u], __fmul_rn(qs[(warp + u * (AB_THREADS / 32)) * N + dd], w));
        }
    }
    const int c = c0 + lane;
    if (c >= KL) return;
#pragma unroll
    for (int u = 0; u < NU; u++)
        qlat[((int64_t)(t0 + warp + u * (AB_THREADS / 32)) * n_head + h) * KL + c] = acc[u];
}

/* grid (n_head, ceil(kv_lora / AB_COLS), ceil(n_tok / AB_TOK)), AB_THREADS threads. The block
 * stages W_UK[h][0..nope)[c0 .. c0 + 32) in shared memory in one go (all loads in flight at
 * once: the decode case is latency bound), then thread (lane, warp) sums column c0 + lane for
 * its tokens (up to AB_TW: absorb_cols) over d in order, exactly the CPU's operations. Shared: ws
 * [nope][AB_COLS], qs [AB_TOK][nope]. */
__global__ void __launch_bounds__(AB_THREADS) k_absorb_split(cuk_mla_dims d, const float *__restrict__ q,
                                                             const float *__restrict__ kvb, int32_t head_rows,
                                                             int vec, float *__restrict__ qlat) {
    extern __shared__ __align__(16) float abs_sm[];
    const int N = d.nope, KL = d.kv_lora, QW = d.nope + d.rope;
    float *ws = abs_sm;                     /* [N][AB_COLS] */
    float *qs = abs_sm + (size_t)N * AB_COLS; /* [AB_TOK][N] */
    const int h = blockIdx.x, c0 = blockIdx.y * AB_COLS, t0 = blockIdx.z * AB_TOK;
    const int nt = min(AB_TOK, d.n_tok - t0);
    const float *W = kvb + (int64_t)h * head_rows * KL; /* [nope][kv_lora] */
    if (vec) { /* kv_lora % 4 == 0, kvb 16-byte aligned: a float4 never straddles kv_lora */
        for (int i = threadIdx.x; i < N * (AB_COLS / 4); i += AB_THREADS) {
            const int r = i / (AB_COLS / 4), c4 = (i % (AB_COLS / 4)) * 4;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (c0 + c4 < KL) v = *(const float4 *)(W + (int64_t)r * KL + c0 + c4);
            *(float4 *)(ws + r * AB_COLS + c4) = v;
        }
    } else {
        for (int i = threadIdx.x; i < N * AB_COLS; i += AB_THREADS) {
            const int r = i / AB_COLS, cc = i % AB_COLS;
            ws[i] = c0 + cc < KL ? W[(int64_t)r * KL + c0 + cc] : 0.0f;
        }
    }
    for (int i = threadIdx.x; i < nt * N; i += AB_THREADS) {
        const int tt = i / N, dd = i % N;
        qs[i] = q[((int64_t)(t0 + tt) * d.n_head + h) * QW + dd];
    }
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (warp >= nt) return;
    /* the warp's tokens: warp + 8 u for u < nu (a run-time count, so a one-token block computes one) */
    const int nu = min(AB_TW, (nt - warp + AB_THREADS / 32 - 1) / (AB_THREADS / 32));
    if (nt == 1) {
        absorb_cols<1, false>(qs, ws, N, KL, c0, lane, warp, t0, d.n_head, h, qlat);
        return;
    }
    switch (nu) {
    case 1: absorb_cols<1, true>(qs, ws, N, KL, c0, lane, warp, t0, d.n_head, h, qlat); break;
    case 2: absorb_cols<2, true>(qs, ws, N, KL, c0, lane, warp, t0, d.n_head, h, qlat); break;
    case 3: absorb_cols<3, true>(qs, ws, N, KL, c0, lane, warp, t0, d.n_head, h, qlat); break;
    default: absorb_cols<AB_TW, true>(qs, ws, N, KL, c0, lane, warp, t0, d.n_head, h, qlat); break;
    }
}

/* ---- one-token absorption ---- */

constexpr int AO_THREADS = 128;
constexpr int AO_MAXNC = 6; /* 32-row chunks of W_UK a thread holds at most: nope <= 192 (GLM-5's) */
constexpr int AO_MAX_PAIRS = 64; /* RoPE pairs of a head the launch may rotate (q_rot): rope <= 128 */

/* cuk_mla_absorb_args.q_rot: q's rope part, rotated at *pos (NULL q: none) */
struct AoRope {
    float *q;
    const int32_t *pos;
    int n_pairs;
    float inv[AO_MAX_PAIRS]; /* rowops_rope_inv */
};

extern "C" int cuk_mla_absorb_rotates(const cuk_mla_dims *d) {
    return d && d->n_tok == 1 && d->nope > 0 && d->nope % 32 == 0 && d->nope <= 32 * AO_MAXNC && d->rope >= 2 &&
           d->rope % 2 == 0 && d->rope <= 2 * AO_MAX_PAIRS;
}

/* grid (n_head, ceil(kv_lora / AO_THREADS)), AO_THREADS threads, one token (a decode step at batch
 * 1). Thread c of head h loads its whole column W_UK[h][0..N)[c] into registers at once, so all of
 * the launch's bytes are in flight together (the split form stages 32-column slices in shared
 * memory, then sums them on one warp), and sums q_nope[d] * w[d] over d in order: the CPU's
 * operations, the split kernel's bits. N = 32 NC; a column past kv_lora reads the last one again
 * and stores nothing. WQ: the column comes from kv_b's exact int8 form (kq, ksk: a byte an element
 * and a scale per 16 rows, so a quarter of the bytes), each weight the float32 product it is in
 * kv_b, so the sums and bits are the float32 form's. With rot.q (q itself), thread i < n_pairs of
 * column block 0 then rotates head h's rope pair i in place, k_rope's arithmetic (rowops.cuh): a
 * decode step's query is roped here rather than by a launch on the way to the attention. The
 * absorption reads q's first nope elements only, so the two never touch the same element. */
template <int NC, bool WQ>
__global__ void __launch_bounds__(AO_THREADS, 2) k_absorb_one(cuk_mla_dims d, const float *q,
                                                             const float *__restrict__ kvb, int32_t head_rows,
                                                             float *__restrict__ qlat, const int8_t *__restrict__ kq,
                                                             const float *__restrict__ ksk, const AoRope rot) {
    constexpr int N = 32 * NC;
    __shared__ float qs[N];
    const int h = blockIdx.x, c = blockIdx.y * AO_THREADS + threadIdx.x, KL = d.kv_lora;
    const int cc = c < KL ? c : KL - 1;
    float w[N];
    if constexpr (WQ) { /* the exact int8 form: each float the one product the float32 kv_b holds */
        const int8_t *Q = kq + (int64_t)h * head_rows * KL + cc;       /* [nope][kv_lora], column c */
        const float *S = ksk + (int64_t)h * (N / 16) * KL + cc;        /* [nope / 16][kv_lora] */
        int8_t qv[N];
        float sv[N / 16];
#pragma unroll
        for (int i = 0; i < N; i++) qv[i] = __ldg(Q + (int64_t)i * KL);
#pragma unroll
        for (int g = 0; g < N / 16; g++) sv[g] = __ldg(S + (int64_t)g * KL);
#pragma unroll
        for (int i = 0; i < N; i++) w[i] = __fmul_rn(sv[i / 16], (float)qv[i]);
    } else {
        const float *W = kvb + (int64_t)h * head_rows * KL + cc; /* [nope][kv_lora], column c */
#pragma unroll
        for (int i = 0; i < N; i++) w[i] = __ldg(W + (int64_t)i * KL);
    }
    for (int i = threadIdx.x; i < N; i += AO_THREADS) qs[i] = q[(int64_t)h * (d.nope + d.rope) + i];
    __syncthreads();
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < N; i++) acc = __fadd_rn(acc, __fmul_rn(qs[i], w[i]));
    if (c < KL) qlat[(int64_t)h * KL + c] = acc;
    if (rot.q && blockIdx.y == 0 && threadIdx.x < rot.n_pairs) {
        float *p = rot.q + (int64_t)h * (d.nope + d.rope) + d.nope + 2 * threadIdx.x;
        float x = p[0], y = p[1];
        rowops_rope_rot(x, y, rowops_rope_cs(rot.pos[0], rot.inv[threadIdx.x]));
        p[0] = x;
        p[1] = y;
    }
}

template <int NC> static void absorb_one(const cuk_mla_absorb_args *a, cudaStream_t st) {
    const cuk_mla_dims *d = &a->d;
    const dim3 grid((unsigned)d->n_head, (unsigned)((d->kv_lora + AO_THREADS - 1) / AO_THREADS));
    AoRope rot = {a->q_rot, a->pos, 0, {}};
    if (a->q_rot) rot.n_pairs = rowops_rope_inv(a->theta, d->rope, rot.inv);
    if (a->kq)
        k_absorb_one<NC, true>
            <<<grid, AO_THREADS, 0, st>>>(*d, a->q, a->kvb, a->head_rows, a->qlat, a->kq, a->ksk, rot);
    else
        k_absorb_one<NC, false><<<grid, AO_THREADS, 0, st>>>(*d, a->q, a->kvb, a->head_rows, a->qlat, NULL, NULL, rot);
}

/* ---- head-group decode attention (the default for decode steps) ---- */


constexpr int AH_THREADS = 256;
constexpr int AH_HB = 8;      /* heads per block: one warp each in the score phase */
constexpr int AH_TK = 32;     /* keys per tile: one lane each in the score phase */
constexpr int AH_NU = 9;      /* 8-element pieces of a tile per thread: AH_TK x (kv_lora + rope) / 8 <= 9 x 256 */
constexpr int AH_MAXCL = CUK_ATTEND_SPLIT_CLUSTER_MAX;

/* grid (CL, ceil(n_head / AH_HB), n_tok), clusters of (CL, 1, 1), AH_THREADS threads. Token t's
 * n_sel[t] selected keys are split into CL contiguous chunks, block `rank` takes one for heads
 * h0 .. h0 + 7: every latent row it loads serves its 8 heads (the cache is shared by all heads:
 * MLA's keys are the latents). Per tile of AH_TK rows, converted to float32 in shared memory
 * (rows padded by 4 floats; the next tile's rows are loaded into registers while this one is
 * used):
 *   scores: warp w = head h0 + w, lane = key of the tile: q . row over kv_lora + rope in one fmaf
 *     chain (float4 pieces, ascending), times scale; the warp then updates that head's running
 *     max m and sum l (double) and leaves exp(s - m) in shared memory;
 *   output: thread (c4 = tid % 128, g = tid / 128) accumulates columns 4 c4 .. 4 c4 + 3 of heads
 *     h0 + 4 g .. + 3 over the tile's keys in order, rescaled when m grows.
 * Then each block leaves (m, l, o) in shared memory and, after a cluster barrier, block `rank`
 * combines the CL partial results of its share of the (head, column) outputs in rank order. The
 * result depends on CL, which the launcher derives from the head count and max_sel alone.
 * Two blocks per SM (128 registers, a few spilled; 171 before): at 1 block per SM only 7
 * 16-block clusters fit and a 64-head decode step's 8 ran in two waves (ncu, H200); with 2 the
 * peer model's decode went 221.0 -> 231.2 tok/s at 512 tokens, 184.3 -> 196.5 at 4096. */
template <typename T>
__global__ void __launch_bounds__(AH_THREADS, 2) k_attend_hg(ac_args a) {
    extern __shared__ __align__(16) float ah_sm[];
    __shared__ __align__(16) float ps[AH_TK][AH_HB]; /* exp(s - m) of the tile */
    __shared__ float alpha[AH_HB];
    __shared__ float mcl[AH_HB];
    __shared__ double lcl[AH_HB];
    __shared__ int32_t spos[AH_TK];
    __shared__ int bad;
    __shared__ float wcl[AH_MAXCL][AH_HB];
    __shared__ double lsum[AH_HB];
    __shared__ int bad_any;

    cg::cluster_group cl = cg::this_cluster();
    const int CL = (int)cl.num_blocks(), rank = (int)cl.block_rank();
    const cuk_mla_dims d = a.d;
    const int KL = d.kv_lora, R = d.rope, KVW = KL + R, RS = KVW + 4;
    const int h0 = blockIdx.y * AH_HB, nh = min(AH_HB, d.n_head - h0);
    const int t = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float *qs = ah_sm;                  /* [AH_HB][RS] */
    float *ks = ah_sm + AH_HB * RS;     /* [AH_TK][RS] */
    const ac_range kr = ac_token_range(a, t, KVW);
    const int ns_raw = ac_n_sel(a, t, kr);
    const int64_t fresh0 = kr.fresh0, n_pos = kr.n_pos;
    const float *fr = kr.fresh;
    const T *lat = (const T *)kr.lat;
    const bool pos_ok = kr.ok;
    const bool ns_ok = ns_raw >= 1 && ns_raw <= a.max_sel && pos_ok;
    const int ns = ns_ok ? ns_raw : 0;
    const int chunk = (ns + CL - 1) / CL;
    const int j0 = min(ns, rank * chunk), j1 = min(ns, j0 + chunk);
    const int ntiles = (j1 - j0 + AH_TK - 1) / AH_TK;
    if (threadIdx.x == 0) bad = !ns_ok;
    __syncthreads(); /* before any fetch can flag a position */
    /* the queries: [latent (absorbed) | rope] per head, zeros for heads past n_head */
    for (int i = threadIdx.x; i < AH_HB * KVW; i += AH_THREADS) {
        const int h = i / KVW, c = i - h * KVW;
        const int64_t row = (int64_t)t * d.n_head + h0 + h;
        float v = 0.0f;
        if (h < nh) v = c < KL ? a.qlat[row * KL + c] : a.q[row * (d.nope + R) + d.nope + (c - KL)];
        qs[h * RS + c] = v;
    }
    const int upr = KVW / 8; /* 8-element pieces per row */
    uint4 raw[AH_NU][2];
    int32_t rpos[AH_NU];
    /* loads tile `it`'s pieces into registers (positions checked; -1: none) */
    auto fetch = [&](int it) {
        const int jt = j0 + it * AH_TK, nk = min(AH_TK, j1 - jt);
#pragma unroll
        for (int u = 0; u < AH_NU; u++) {
            const int i = threadIdx.x + AH_THREADS * u, jj = i / upr, pc = i - jj * upr;
            int32_t s = -1;
            if (jj < nk) {
                s = a.sel ? a.sel[(int64_t)t * a.ld_sel + jt + jj] : jt + jj;
                if (s < 0 || s >= n_pos) {
                    bad = 1;
                    s = -1;
                }
            }
            rpos[u] = s;
            if (s >= fresh0) {
                const uint4 *src = (const uint4 *)(fr + (s - fresh0) * KVW + pc * 8);
                raw[u][0] = src[0];
                raw[u][1] = src[1];
            } else if (s >= 0) {
                if (sizeof(T) == 4) {
                    const uint4 *src = (const uint4 *)((const float *)(const void *)lat + (int64_t)s * KVW + pc * 8);
                    raw[u][0] = src[0];
                    raw[u][1] = src[1];
                } else {
                    raw[u][0] = *(const uint4 *)(lat + (int64_t)s * KVW + pc * 8);
                }
            }
        }
    };
    /* converts the registers into ks (rows without a key: zeros) and spos */
    auto store = [&](int it) {
        const int jt = j0 + it * AH_TK, nk = min(AH_TK, j1 - jt);
#pragma unroll
        for (int u = 0; u < AH_NU; u++) {
            const int i = threadIdx.x + AH_THREADS * u, jj = i / upr, pc = i - jj * upr;
            if (jj >= AH_TK) continue;
            const int32_t s = rpos[u];
            float v[8];
            if (s >= fresh0 || (s >= 0 && sizeof(T) == 4)) {
                const float4 x = *(const float4 *)&raw[u][0], y = *(const float4 *)&raw[u][1];
                v[0] = x.x; v[1] = x.y; v[2] = x.z; v[3] = x.w;
                v[4] = y.x; v[5] = y.y; v[6] = y.z; v[7] = y.w;
            } else if (s >= 0) {
                const T *e = (const T *)&raw[u][0];
#pragma unroll
                for (int k = 0; k < 8; k++) v[k] = ldf(e + k);
            } else {
#pragma unroll
                for (int k = 0; k < 8; k++) v[k] = 0.0f;
            }
            float *dst = ks + jj * RS + pc * 8;
            *(float4 *)dst = make_float4(v[0], v[1], v[2], v[3]);
            *(float4 *)(dst + 4) = make_float4(v[4], v[5], v[6], v[7]);
            if (pc == 0) spos[jj] = jj < nk ? s : -1;
        }
    };
    const int c4 = threadIdx.x & 127, g = threadIdx.x >> 7;
    float o[4][4];
#pragma unroll
    for (int h = 0; h < 4; h++)
#pragma unroll
        for (int k = 0; k < 4; k++) o[h][k] = 0.0f;
    float m_run = -INFINITY; /* warp w's head: the same in every lane */
    double l_run = 0.0;
    if (ntiles > 0) fetch(0);
    for (int it = 0; it < ntiles; it++) {
        __syncthreads(); /* the previous tile's ks, ps and spos are used up (and qs is written) */
        store(it);
        __syncthreads();
        if (it + 1 < ntiles) fetch(it + 1); /* in flight while this tile is used */
        /* scores and the softmax state: warp = head, lane = key */
        {
            const float4 *qv = (const float4 *)(qs + warp * RS), *kv = (const float4 *)(ks + lane * RS);
            float acc = 0.0f;
#pragma unroll 4
            for (int c = 0; c < KVW / 4; c++) {
                const float4 x = qv[c], y = kv[c];
                acc = fmaf(x.x, y.x, acc);
                acc = fmaf(x.y, y.y, acc);
                acc = fmaf(x.z, y.z, acc);
                acc = fmaf(x.w, y.w, acc);
            }
            const float sv = spos[lane] < 0 ? -INFINITY : __fmul_rn(acc, a.scale);
            const float mn = fmaxf(m_run, warp_max(sv));
            const float e = spos[lane] < 0 ? 0.0f : expf(__fsub_rn(sv, mn));
            const double ts = warp_sum_d((double)e);
            const float al = m_run == -INFINITY ? 0.0f : expf(__fsub_rn(m_run, mn));
            l_run = l_run * (double)al + ts;
            m_run = mn;
            ps[lane][warp] = e;
            if (lane == 0) alpha[warp] = al;
        }
        __syncthreads();
        {
            float al[4];
#pragma unroll
            for (int h = 0; h < 4; h++) al[h] = alpha[4 * g + h];
#pragma unroll
            for (int h = 0; h < 4; h++)
#pragma unroll
                for (int k = 0; k < 4; k++) o[h][k] *= al[h];
            if (4 * c4 < KL) {
                const int nk = min(AH_TK, j1 - (j0 + it * AH_TK));
                for (int jj = 0; jj < nk; jj++) {
                    const float4 v = *(const float4 *)(ks + jj * RS + 4 * c4);
                    const float4 p = *(const float4 *)&ps[jj][4 * g];
                    const float pv[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
                    for (int h = 0; h < 4; h++) {
                        o[h][0] = fmaf(pv[h], v.x, o[h][0]);
                        o[h][1] = fmaf(pv[h], v.y, o[h][1]);
                        o[h][2] = fmaf(pv[h], v.z, o[h][2]);
                        o[h][3] = fmaf(pv[h], v.w, o[h][3]);
                    }
                }
            }
        }
    }
    __syncthreads(); /* ks is reused for the partial outputs */
    float *oacc = ks; /* [AH_HB][KL] */
    if (4 * c4 < KL)
#pragma unroll
        for (int h = 0; h < 4; h++)
            *(float4 *)(oacc + (4 * g + h) * KL + 4 * c4) = make_float4(o[h][0], o[h][1], o[h][2], o[h][3]);
    if (lane == 0) {
        mcl[warp] = m_run;
        lcl[warp] = l_run;
    }
    cl.sync();
    if (threadIdx.x < AH_HB) {
        const int h = threadIdx.x;
        float M = -INFINITY;
        int any = 0;
        for (int r = 0; r < CL; r++) {
            M = fmaxf(M, cl.map_shared_rank(mcl, r)[h]);
            any |= *cl.map_shared_rank(&bad, r);
        }
        double L = 0.0;
        for (int r = 0; r < CL; r++) {
            const float mr = cl.map_shared_rank(mcl, r)[h];
            const float w = mr == -INFINITY ? 0.0f : expf(__fsub_rn(mr, M));
            wcl[r][h] = w;
            L += (double)w * cl.map_shared_rank(lcl, r)[h];
        }
        lsum[h] = L;
        if (h == 0) bad_any = any;
    }
    __syncthreads();
    for (int i = rank * AH_THREADS + threadIdx.x; i < nh * KL; i += CL * AH_THREADS) {
        const int h = i / KL, c = i - h * KL;
        float acc = 0.0f;
        for (int r = 0; r < CL; r++) acc = fmaf(wcl[r][h], cl.map_shared_rank(oacc, r)[h * KL + c], acc);
        a.out[((int64_t)t * d.n_head + h0 + h) * KL + c] = bad_any ? nanf_() : (float)((double)acc / lsum[h]);
    }
    cl.sync(); /* the other blocks may still read this one's shared memory */
}

} // namespace

static g5_status check_dims(const char *what, const cuk_mla_dims *d, g5_error *err) {
    if (!d) return BAD("%s: no dims", what);
    if (d->n_tok < 1 || d->n_tok > 65535 * ABS_TOK) return BAD("%s: n_tok=%d out of range", what, d->n_tok);
    if (d->n_head < 1 || d->n_head > 65535) return BAD("%s: n_head=%d out of range", what, d->n_head);
    if (d->nope < 1 || d->nope > 1024) return BAD("%s: nope=%d outside 1..1024", what, d->nope);
    if (d->rope < 0 || d->rope > 1024) return BAD("%s: rope=%d outside 0..1024", what, d->rope);
    if (d->kv_lora < 1 || d->kv_lora > 8192) return BAD("%s: kv_lora=%d outside 1..8192", what, d->kv_lora);
    return G5_OK;
}

/* Largest dynamic shared memory a block may opt into on the current device (0: unknown). */
static int smem_optin(void) {
    const cuk_device *d = cuk_device_current(); /* cuda/cuk_device.h */
    return d ? (int)d->smem_optin : 0;
}

extern "C" g5_status cuk_mla_absorb(const cuk_mla_absorb_args *a, cuk_stream stream, g5_error *err) {
    if (!a) return BAD("mla_absorb: no args");
    const cuk_mla_dims *const d = &a->d;
    const float *const q = a->q, *const kvb = a->kvb;
    const int32_t head_rows = a->head_rows;
    float *const qlat = a->qlat;
    g5_status st = check_dims("mla_absorb", d, err);
    if (st) return st;
    if (!q || !kvb || !qlat) return BAD("mla_absorb: NULL pointer");
    if (head_rows < d->nope) return BAD("mla_absorb: head_rows=%d < nope=%d", head_rows, d->nope);
    if (!a->kq != !a->ksk) return BAD("mla_absorb: kq and ksk go together");
    if (a->q_rot) {
        if (a->q_rot != q || !cuk_mla_absorb_rotates(d))
            return BAD("mla_absorb: q_rot is q itself, for one token (n_tok=%d), nope a multiple of 32 up to %d "
                       "(nope=%d), rope even up to %d (rope=%d)",
                       d->n_tok, 32 * AO_MAXNC, d->nope, 2 * AO_MAX_PAIRS, d->rope);
        if (!a->pos) return BAD("mla_absorb: q_rot without pos");
        if (!(a->theta > 0.0f)) return BAD("mla_absorb: theta=%g must be positive", (double)a->theta);
    }
    if (d->n_tok == 1 && d->nope % 32 == 0 && d->nope <= 32 * AO_MAXNC) {
        const cudaStream_t st = (cudaStream_t)stream;
        switch (d->nope / 32) {
        case 1: absorb_one<1>(a, st); break;
        case 2: absorb_one<2>(a, st); break;
        case 3: absorb_one<3>(a, st); break;
        case 4: absorb_one<4>(a, st); break;
        case 5: absorb_one<5>(a, st); break;
        default: absorb_one<6>(a, st); break;
        }
        CUK_CHECK_LAUNCH("mla_absorb");
        return G5_OK;
    }
    /* qs holds the block's tokens only: a decode step's blocks (1 token) then fit 8 per SM, so
     * the 64-head, 16-slice grid runs in one wave */
    const size_t smem_split =
        ((size_t)d->nope * AB_COLS + (size_t)(d->n_tok < AB_TOK ? d->n_tok : AB_TOK) * d->nope) * sizeof(float);
    if (smem_split <= 48 * 1024 || (int64_t)smem_split <= smem_optin()) {
        static size_t allowed_dev[CUK_MAX_DEVICES]; /* the opt-in, once per device (0: none yet) */
        size_t &allowed = allowed_dev[cuk_device_slot()];
        if (smem_split > (allowed ? allowed : 48 * 1024)) {
            CUK_CHECK(cudaFuncSetAttribute(k_absorb_split, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_optin()));
            allowed = (size_t)smem_optin();
        }
        const int vec = d->kv_lora % 4 == 0 && ((uintptr_t)kvb & 15) == 0;
        dim3 grid((unsigned)d->n_head, (unsigned)((d->kv_lora + AB_COLS - 1) / AB_COLS),
                  (unsigned)((d->n_tok + AB_TOK - 1) / AB_TOK));
        k_absorb_split<<<grid, AB_THREADS, smem_split, (cudaStream_t)stream>>>(*d, q, kvb, head_rows, vec, qlat);
        CUK_CHECK_LAUNCH("mla_absorb");
        return G5_OK;
    }
    const size_t smem = (size_t)ABS_TOK * d->nope * sizeof(float);
    dim3 grid((unsigned)d->n_head, (unsigned)((d->n_tok + ABS_TOK - 1) / ABS_TOK));
    k_absorb<<<grid, ABS_THREADS, smem, (cudaStream_t)stream>>>(*d, q, kvb, head_rows, qlat);
    CUK_CHECK_LAUNCH("mla_absorb");
    return G5_OK;
}

/* Cluster size for the head-group attention: enough blocks to cover the SMs at decode, at most
 * AH_MAXCL, chunks of at least two tiles of max_sel. From the head count and max_sel alone (not
 * the token count), so a multi-sequence launch splits each token's keys as a one-token launch
 * does. 16-block clusters are non-portable: used only where the device can run one. */
template <typename T>
static int hg_cluster(const cuk_mla_dims *d, int32_t max_sel, size_t smem, cudaStream_t st) {
    static int sms = 0;
    if (sms <= 0) sms = cuk_sm_count() > 0 ? cuk_sm_count() : 132;
    static int max_cl_dev[CUK_MAX_DEVICES]; /* per device: the attribute cuk_cluster_max sets is */
    int &max_cl = max_cl_dev[cuk_device_slot()];
    if (max_cl == 0) max_cl = cuk_cluster_max((const void *)k_attend_hg<T>, AH_MAXCL, AH_THREADS, smem, st);
    const int64_t groups = (d->n_head + AH_HB - 1) / AH_HB;
    int cl = 1;
    while (cl < max_cl && groups * cl < sms && (int64_t)cl * 2 * AH_TK * 2 <= max_sel) cl *= 2;
    return cl;
}

/* Launches k_attend_hg<T> over clusters of cl blocks for a's tokens. */
template <typename T>
static g5_status attend_hg_launch(const ac_args &a, int cl, size_t smem, cudaStream_t st, g5_error *err) {
    cudaLaunchAttribute at;
    const cudaLaunchConfig_t cfg = cuk_cluster_cfg(
        &at, (unsigned)cl, dim3((unsigned)cl, (unsigned)((a.d.n_head + AH_HB - 1) / AH_HB), (unsigned)a.d.n_tok),
        AH_THREADS, smem, st);
    CUK_CHECK(cudaLaunchKernelEx(&cfg, k_attend_hg<T>, a));
    CUK_CHECK_LAUNCH("mla_attend");
    return G5_OK;
}

static size_t hg_smem_bytes(int KVW) { return (size_t)(AH_HB + AH_TK) * (KVW + 4) * sizeof(float); }

/* The dynamic shared memory of k_attend_hg<T>, opted into once per instantiation and device. */
template <typename T>
static g5_status attend_hg_smem(int KVW, size_t *smem_out, g5_error *err) {
    const size_t smem = hg_smem_bytes(KVW);
    static size_t allowed_dev[CUK_MAX_DEVICES];
    size_t &allowed = allowed_dev[cuk_device_slot()];
    if (smem > (allowed ? allowed : 48 * 1024)) {
        CUK_CHECK(cudaFuncSetAttribute(k_attend_hg<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        allowed = smem;
    }
    *smem_out = smem;
    return G5_OK;
}

/* The operands every attention launch shares, from either args struct (cuk_mla_attend_args,
 * cuk_attend_multi_args); the rest zero. */
template <typename A>
static ac_args ac_common(const A *m) {
    ac_args a;
    memset(&a, 0, sizeof a);
    a.d = m->d;
    a.q = m->q;
    a.qlat = m->qlat;
    a.fresh = m->fresh;
    a.sel = m->sel;
    a.ld_sel = m->ld_sel;
    a.n_sel = m->n_sel;
    a.max_sel = m->max_sel;
    a.scale = m->scale;
    a.out = m->out;
    return a;
}

/* a: a one-sequence launch's operands (rows NULL) */
template <typename T>
static g5_status attend_split(const ac_args &a, cudaStream_t st, g5_error *err) {
    size_t smem = 0;
    g5_status sst = attend_hg_smem<T>(a.d.kv_lora + a.d.rope, &smem, err);
    if (sst) return sst;
    const int cl = hg_cluster<T>(&a.d, a.max_sel, smem, st);
    return attend_hg_launch<T>(a, cl, smem, st, err);
}

/* 1 if k_attend_hg covers the shape: kv_lora <= 512 and a multiple of 4, kv_lora + rope <= 576
 * and a multiple of 8 (a tile's 8-element pieces fit AH_NU per thread), 16-byte rows and its
 * shared memory. */
static int split_fits(const cuk_mla_dims *d, const void *lat, size_t es, const float *fresh) {
    const int KVW = d->kv_lora + d->rope;
    if (d->kv_lora > 4 * 128 || d->kv_lora % 4 || KVW > 576 || KVW % 8 || (KVW * es) % 16) return 0;
    if (AH_TK * (KVW / 8) > AH_NU * AH_THREADS) return 0;
    if (((uintptr_t)lat & 15) || (fresh && ((uintptr_t)fresh & 15))) return 0;
    const size_t smem = hg_smem_bytes(KVW);
    return smem <= 48 * 1024 || (int64_t)smem <= smem_optin();
}

/* a.lat of T; smem: k_attend's shared memory */
template <typename T>
static g5_status attend_t(const ac_args &a, size_t smem, cudaStream_t st, g5_error *err) {
    /* The split kernel exists for the few (token, head) pairs of a decode step; once those pairs
     * alone fill the SMs twice (prefill) the one-block-per-pair kernel is faster (bench_attn: 512
     * tokens x 8 heads at 4k, 5.1 ms vs 11.9 ms). */
    static int sms = 0;
    if (sms <= 0) sms = cuk_sm_count() > 0 ? cuk_sm_count() : 132;
    if ((int64_t)a.d.n_tok * a.d.n_head < 2 * (int64_t)sms && split_fits(&a.d, a.lat, sizeof(T), a.fresh))
        return attend_split<T>(a, st, err);
    if (smem > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(k_attend<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return g5_fail(err, G5_ERR_INTERNAL, "mla_attend: %zu bytes of shared memory: %s", smem, cudaGetErrorString(e));
    }
    dim3 grid((unsigned)a.d.n_head, (unsigned)a.d.n_tok);
    k_attend<T><<<grid, ATT_THREADS, smem, st>>>(a.d, a.q, a.qlat, (const T *)a.lat, a.fresh, a.fresh0, a.n_pos, a.dpos,
                                                 a.bound, a.sel, a.ld_sel, a.n_sel, a.max_sel, a.scale, a.out);
    CUK_CHECK_LAUNCH("mla_attend");
    return G5_OK;
}

/* cuk_mla_attend_fresh and cuk_mla_attend_dev: m's operands, with fresh, fresh0 and n_pos as
 * given (dpos non-NULL: fresh0 and n_pos are read from it at run time, within bound). */
static g5_status mla_attend(const cuk_mla_attend_args *m, const float *fresh, int64_t fresh0, int64_t n_pos,
                            const int32_t *dpos, int64_t bound, cuk_stream stream, g5_error *err) {
    if (!m->q || !m->qlat || !m->lat || !m->sel != !m->n_sel || !m->out) return BAD("mla_attend: NULL pointer");
    if (m->max_sel < 1 || m->max_sel > 16384 || m->ld_sel < m->max_sel)
        return BAD("mla_attend: max_sel=%d outside 1..16384 or above ld_sel=%lld", m->max_sel, (long long)m->ld_sel);
    if (m->d.n_tok > 65535) return BAD("mla_attend: n_tok=%d above 65535", m->d.n_tok);
    const size_t smem =
        (size_t)(m->d.kv_lora + m->d.rope) * sizeof(float) + (size_t)m->max_sel * (sizeof(float) + sizeof(int32_t));
    ac_args a = ac_common(m);
    a.lat = m->lat;
    a.fresh = fresh;
    a.fresh0 = fresh0;
    a.n_pos = n_pos;
    a.dpos = dpos;
    a.bound = bound;
    const cudaStream_t cs = (cudaStream_t)stream;
    if (m->tc && mla_dec_fits(&m->d, m->lat_type)) return mla_dec_run(a, m->lat_type, cs, err);
    switch (m->lat_type) {
    case CUK_F32: return attend_t<float>(a, smem, cs, err);
    case CUK_BF16: return attend_t<__nv_bfloat16>(a, smem, cs, err);
    case CUK_F16: return attend_t<__half>(a, smem, cs, err);
    default: return BAD("mla_attend: lat_type %u is none of CUK_F32, CUK_BF16, CUK_F16", m->lat_type);
    }
}

/* cuk_mla_attend (fresh NULL) and cuk_mla_attend_fresh */
static g5_status attend_host(const cuk_mla_attend_args *a, const float *fresh, cuk_stream stream, g5_error *err) {
    g5_status st = check_dims("mla_attend", &a->d, err);
    if (st) return st;
    const int64_t n_pos = a->n_pos;
    if (n_pos < 1) return BAD("mla_attend: n_pos=%lld must be positive", (long long)n_pos);
    if (fresh && (a->fresh0 < 0 || a->fresh0 >= n_pos))
        return BAD("mla_attend: fresh0=%lld outside 0..n_pos-1 (%lld)", (long long)a->fresh0, (long long)n_pos - 1);
    return mla_attend(a, fresh, fresh ? a->fresh0 : n_pos, n_pos, NULL, 0, stream, err);
}

extern "C" g5_status cuk_mla_attend(const cuk_mla_attend_args *a, cuk_stream stream, g5_error *err) {
    if (!a) return BAD("mla_attend: no args");
    return attend_host(a, NULL, stream, err);
}

extern "C" g5_status cuk_mla_attend_fresh(const cuk_mla_attend_args *a, cuk_stream stream, g5_error *err) {
    if (!a) return BAD("mla_attend_fresh: no args");
    return attend_host(a, a->fresh, stream, err);
}

extern "C" g5_status cuk_mla_attend_dev(const cuk_mla_attend_args *a, cuk_stream stream, g5_error *err) {
    if (!a) return BAD("mla_attend_dev: no args");
    g5_status st = check_dims("mla_attend_dev", &a->d, err);
    if (st) return st;
    if (!a->pos0_dev) return BAD("mla_attend_dev: NULL position");
    if (a->pos_bound < a->d.n_tok || a->pos_bound > 2147483647)
        return BAD("mla_attend_dev: pos_bound=%lld outside n_tok=%d..2^31-1", (long long)a->pos_bound, a->d.n_tok);
    return mla_attend(a, a->fresh, 0, 0, a->pos0_dev, a->pos_bound, stream, err);
}

extern "C" int cuk_mla_attend_multi_fits(const cuk_mla_dims *d, uint32_t lat_type) {
    const size_t es = lat_type == CUK_F32 ? 4 : lat_type == CUK_BF16 || lat_type == CUK_F16 ? 2 : 0;
    if (!d || !es || d->n_head < 1 || d->kv_lora < 1 || d->rope < 0) return 0;
    static int sms = 0; /* the one-token launcher runs the split kernel below 2 x SMs heads */
    if (sms <= 0) sms = cuk_sm_count() > 0 ? cuk_sm_count() : 132;
    if (d->n_head >= 2 * sms) return 0;
    static const float dummy[4] __attribute__((aligned(16))) = {0};
    return split_fits(d, dummy, es, NULL);
}

template <typename T>
static g5_status attend_multi_t(const cuk_attend_multi_args *m, cudaStream_t st, g5_error *err) {
    size_t smem = 0;
    g5_status sst = attend_hg_smem<T>(m->d.kv_lora + m->d.rope, &smem, err);
    if (sst) return sst;
    /* the one-token launch's cluster size (hg_cluster never looks at n_tok): each token's keys
     * split alike, so its bits are those of a one-token call */
    const int cl = hg_cluster<T>(&m->d, m->max_sel, smem, st);
    ac_args a = ac_common(m);
    a.bound = m->pos_bound;
    a.rows = m->rows;
    return attend_hg_launch<T>(a, cl, smem, st, err);
}

extern "C" g5_status cuk_mla_attend_multi(const cuk_attend_multi_args *m, cuk_stream stream, g5_error *err) {
    if (!m) return BAD("mla_attend_multi: no args");
    g5_status st = check_dims("mla_attend_multi", &m->d, err);
    if (st) return st;
    if (!m->q || !m->qlat || !m->rows || !m->sel != !m->n_sel || !m->out) return BAD("mla_attend_multi: NULL pointer");
    if (m->d.n_tok > 65535) return BAD("mla_attend_multi: n_tok=%d above 65535", m->d.n_tok);
    if (m->max_sel < 1 || m->max_sel > 16384 || m->ld_sel < m->max_sel)
        return BAD("mla_attend_multi: max_sel=%d outside 1..16384 or above ld_sel=%lld", m->max_sel, (long long)m->ld_sel);
    if (m->pos_bound < 1 || m->pos_bound > 2147483647)
        return BAD("mla_attend_multi: pos_bound=%lld", (long long)m->pos_bound);
    if (!cuk_mla_attend_multi_fits(&m->d, m->lat_type) || ((uintptr_t)m->fresh & 15))
        return BAD("mla_attend_multi: shape or cache type %u not covered (cuk_mla_attend_multi_fits)", m->lat_type);
    const cudaStream_t cs = (cudaStream_t)stream;
    if (m->tc && mla_dec_fits(&m->d, m->lat_type)) {
        ac_args a = ac_common(m);
        a.bound = m->pos_bound;
        a.rows = m->rows;
        return mla_dec_run(a, m->lat_type, cs, err);
    }
    switch (m->lat_type) {
    case CUK_F32: return attend_multi_t<float>(m, cs, err);
    case CUK_BF16: return attend_multi_t<__nv_bfloat16>(m, cs, err);
    default: return attend_multi_t<__half>(m, cs, err);
    }
}
