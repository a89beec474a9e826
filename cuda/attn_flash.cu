/* Fused MLA prefill attention of fast mode (cuda/cuk_prefill.h, cuk_mla_flash): the absorbed form
 * (queries [qlat | q_pe], 576 wide; keys the latent rows [c_kv | k_pe]; values their first 512
 * columns) on the tensor cores with mma.sync m16n8k16 (fp16 inputs, float32 accumulators) and a
 * float32 online softmax, so the scores never leave the chip.
 *
 * Why absorbed and not expanded heads (qk 192 + 64, v 256): the expanded form does 512 MACs per
 * (query row, key) against 1088 here, but it needs each head's own keys and values (c_kv W_UK,
 * c_kv W_UV: 0.27 GB of fp16 per layer at 4096 tokens and 64 heads, written and read back, plus
 * 0.12 TFLOP to make them) and, worse, the DSA selection is per token: a tile of one head's rows
 * spans many tokens with different key sets, so the sparse part (every query past index_topk keys)
 * would run over the union of their keys. Here a tile of 64 rows is one token's 64 heads (GLM-5 at
 * TP 1), which share one key list: the sparse part costs n * index_topk, not n^2, and each key tile
 * (64 x 576 fp16) read from L2 serves 64 query rows. At pp4096 that is 0.88 TFLOP per layer.
 *
 * Grid: one CTA of 256 threads (8 warps) per 64 consecutive query rows (row = token * n_head + head),
 * heaviest (latest) rows first. Warp w owns rows 16 (w & 3) .. + 16; for S = Q K^T of a 64-key tile
 * it computes key columns 32 (w >> 2) .. + 32, for O += P V value columns 256 (w >> 2) .. + 256
 * (128 float32 accumulators per thread). The two warps of a row block swap their row maxima and
 * (at the end) their row sums through shared memory; P goes through shared memory as fp16. Key
 * tiles are double-buffered with cp.async (16-byte chunks, XOR-swizzled per row so that ldmatrix
 * is conflict-free). A CTA whose tokens are all dense (at most index_topk earlier keys) makes one
 * pass over keys 0 .. its last position, masked causally; otherwise one pass per token over that
 * token's key list (0 .. p, or its selection), the other tokens' rows masked; in such a pass only
 * the warps holding a row of its token compute. At n_head <= 16 such passes go to
 * k_mla_flash_tok instead (one token per CTA, below), whose 8 warps all work on the token. */
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "cuda/cuk_internal.cuh"
#include "cuda/cuk_model.h"
#include "cuda/cuk_prefill.h"
#include "cuda/mla_tile.cuh"

#define BAD(...) g5_fail(err, G5_ERR_INVALID_ARG, __VA_ARGS__)

namespace {

using namespace cuk::mla;
constexpr int FBM = 64, FT = 256;
constexpr int SQ_B = FBM * ROWB, SP_B = FBM * FBN * 2;
constexpr int SMEM_B = SQ_B + 2 * SK_B + SP_B + (2 * FBN + 4 * FBM + 3 * FBM) * 4;

using cuk::cp16;
using cuk::cp_commit;
using cuk::cp_wait;
using cuk::ldsm4;
using cuk::ldsm4t;

__device__ __forceinline__ void mma(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) { cuk::mma_f16(c, a, b0, b1); }

/* The key list of one pass: key u < cnt is position u (dense) or sel[u]; a listed position outside
 * [0, plim] marks the pass's token bad (*bad) and loads as zeros, masked. */
struct keylist {
    bool dense;
    int64_t cnt, plim;
    const int32_t *sel;
    int *bad;
};

__device__ __forceinline__ int64_t key_at(const keylist &kl, int64_t u, bool *oob) {
    *oob = false;
    if (u >= kl.cnt) return -1;
    const int64_t j = kl.dense ? u : (int64_t)kl.sel[u];
    if (j < 0 || j > kl.plim) {
        *oob = true;
        return -1;
    }
    return j;
}

/* All threads: keys u0 .. u0 + 63 of the list into a swizzled tile, their positions into kp.
 * Four threads per key, each copying every fourth 16-byte chunk of its row: one list lookup
 * (a global load of sel) per thread and tile, not one per chunk, so the copies are issued
 * without waiting on a chain of dependent loads. */
static_assert(FT == 4 * FBN && FCH % 4 == 0, "load_keys: four threads per key");
__device__ __forceinline__ void load_keys(uint32_t sk, int *kp, const __half *kb, const keylist &kl, int64_t u0) {
    const int key = threadIdx.x >> 2, c0 = threadIdx.x & 3;
    bool oob;
    const int64_t j = key_at(kl, u0 + key, &oob);
    const __half *src = kb + (j < 0 ? 0 : j) * FD;
#pragma unroll
    for (int c = c0; c < FCH; c += 4) cp16(sk + sw(key, c), src + c * 8, j >= 0);
    if (c0 == 0) {
        kp[key] = (int)j;
        if (oob) *kl.bad = 1;
    }
}

/* All threads, before key tile b of nb (buffer b & 1): tile b + 1's copy issued into the other
 * buffer, tile b's copy complete and visible to the CTA. */
__device__ __forceinline__ void tile_ready(uint32_t sk0, int *kpos, const __half *kb, const keylist &kl, int64_t b,
                                           int64_t nb) {
    const int buf = (int)(b & 1);
    if (b + 1 < nb) {
        load_keys(sk0 + (buf ^ 1) * SK_B, kpos + (buf ^ 1) * FBN, kb, kl, (b + 1) * FBN);
        cp_commit();
        cp_wait<1>();
    } else {
        cp_wait<0>();
    }
    __syncthreads();
}

__global__ void __launch_bounds__(FT, 1)
    k_mla_flash(const __half *__restrict__ qb, const __half *__restrict__ kb, int64_t n_rows, int n_head,
                int64_t pos0, const int32_t *__restrict__ sel, int64_t ld_sel, const int32_t *__restrict__ n_sel,
                int max_sel, float scale, float *__restrict__ out) {
    extern __shared__ __align__(128) uint8_t smem[];
    const uint32_t sq = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t sk0 = sq + SQ_B, sp = sq + SQ_B + 2 * SK_B;
    uint8_t *pp = smem + SQ_B + 2 * SK_B;                       /* P tile, generic address */
    int *kpos = (int *)(void *)(smem + SQ_B + 2 * SK_B + SP_B); /* [2][FBN] */
    float *rmax = (float *)(void *)(kpos + 2 * FBN);            /* [2][FBM] */
    float *rsum = rmax + 2 * FBM;                               /* [2][FBM] */
    int *tcnt = (int *)(void *)(rsum + 2 * FBM);                /* [FBM] per token of the CTA: n_sel */
    int *tstate = tcnt + FBM;                                   /* [FBM] 0 ok, 1 dense, 2 bad count */
    int *tbad = tstate + FBM;                                   /* [FBM] a listed key out of range */

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int rq = warp & 3, ch = warp >> 2, g = lane >> 2, c4 = lane & 3;
    const int64_t nblk = (n_rows + FBM - 1) / FBM, rb = nblk - 1 - blockIdx.x;
    const int64_t R0 = rb * FBM, Rl = (R0 + FBM < n_rows ? R0 + FBM : n_rows) - 1;
    const int64_t t_first = R0 / n_head;
    const int G = (int)(Rl / n_head - t_first + 1);

    for (int i = tid; i < FBM * FCH; i += FT) {
        const int r = i / FCH, c = i % FCH;
        const bool ok = R0 + r < n_rows;
        cp16(sq + sw(r, c), qb + (ok ? R0 + r : 0) * FD + c * 8, ok);
    }
    cp_commit();
    if (tid < G) {
        const int64_t t = t_first + tid, p = pos0 + t;
        const int ns = n_sel[t];
        tcnt[tid] = ns;
        tstate[tid] = ns < 1 || ns > max_sel ? 2 : (int64_t)ns == p + 1 ? 1 : 0;
        tbad[tid] = 0;
    }
    __syncthreads();
    const bool all_dense = __syncthreads_and(tid >= G || tstate[tid] == 1);

    /* this thread's two rows: rq * 16 + g and + 8 */
    int64_t prow[2];
    int ltok[2];
    bool rvalid[2];
    for (int i = 0; i < 2; i++) {
        const int64_t R = R0 + rq * 16 + g + 8 * i;
        rvalid[i] = R < n_rows;
        const int64_t t = (rvalid[i] ? R : Rl) / n_head;
        ltok[i] = (int)(t - t_first);
        prow[i] = pos0 + t;
    }
    float o[32][4];
#pragma unroll
    for (int nt = 0; nt < 32; nt++) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    float mrun[2] = {-INFINITY, -INFINITY}, lrun[2] = {0.0f, 0.0f};

    /* the tokens (of the CTA's) that this warp's 16 rows belong to: a per-token pass skips the
     * products and the softmax of warps without a row of its token (their rows would be all
     * masked: alpha 1, p 0, their state unchanged), so at 8 heads (TP 8) a pass costs a quarter */
    const int64_t wr0 = R0 + rq * 16, wr1 = (wr0 + 15 < Rl ? wr0 + 15 : Rl);
    const int wt0 = (int)(wr0 / n_head - t_first), wt1 = wr0 <= Rl ? (int)(wr1 / n_head - t_first) : -1;
    const int npass = all_dense ? 1 : G;
    for (int ps = 0; ps < npass; ps++) {
        const int lt = all_dense ? -1 : ps;
        if (lt >= 0 && tstate[lt] == 2) continue;
        const bool act = lt < 0 || (lt >= wt0 && lt <= wt1);
        keylist kl;
        const int64_t tp = t_first + (lt >= 0 ? lt : G - 1), pt = pos0 + tp;
        kl.dense = all_dense || tstate[lt] == 1;
        kl.cnt = kl.dense ? pt + 1 : tcnt[lt];
        kl.plim = pt;
        kl.sel = sel + tp * ld_sel;
        kl.bad = tbad + (lt >= 0 ? lt : 0);
        const int64_t nb = (kl.cnt + FBN - 1) / FBN;
        load_keys(sk0, kpos, kb, kl, 0);
        cp_commit();
        for (int64_t b = 0; b < nb; b++) {
            const int buf = (int)(b & 1);
            tile_ready(sk0, kpos, kb, kl, b, nb);
            const uint32_t sk = sk0 + buf * SK_B;
            const int *kp = kpos + buf * FBN;

            /* S[16 rows][32 keys] of this warp */
            float s[4][4];
            if (act) {
#pragma unroll
                for (int nt = 0; nt < 4; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll 4
                for (int kk = 0; kk < FD / 16; kk++) {
                    uint32_t a[4];
                    ldsm4(a, sq + sw(rq * 16 + (lane & 15), kk * 2 + (lane >> 4)));
#pragma unroll
                    for (int np = 0; np < 2; np++) {
                        const int mi = lane >> 3, key = ch * 32 + np * 16 + (lane & 7) + ((mi >> 1) << 3);
                        uint32_t bb[4];
                        ldsm4(bb, sk + sw(key, kk * 2 + (mi & 1)));
                        mma(s[np * 2], a, bb[0], bb[1]);
                        mma(s[np * 2 + 1], a, bb[2], bb[3]);
                    }
                }
                /* mask, scale, row maxima of this warp's columns */
                float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
                for (int nt = 0; nt < 4; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int i = e >> 1, col = ch * 32 + nt * 8 + 2 * c4 + (e & 1), j = kp[col];
                        const bool ok = rvalid[i] && j >= 0 && (lt < 0 ? (int64_t)j <= prow[i] : ltok[i] == lt);
                        const float v = ok ? __fmul_rn(s[nt][e], scale) : -INFINITY;
                        s[nt][e] = v;
                        mx[i] = fmaxf(mx[i], v);
                    }
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
                    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
                    if (c4 == 0) rmax[ch * FBM + rq * 16 + g + 8 * i] = mx[i];
                }
            }
            __syncthreads();
            if (act) {
                float mu[2], alpha[2];
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const int r = rq * 16 + g + 8 * i;
                    const float mn = fmaxf(mrun[i], fmaxf(rmax[r], rmax[FBM + r]));
                    mu[i] = mn == -INFINITY ? 0.0f : mn;
                    alpha[i] = __expf(mrun[i] - mu[i]);
                    mrun[i] = mn;
                    lrun[i] *= alpha[i];
                }
#pragma unroll
                for (int nt = 0; nt < 4; nt++)
#pragma unroll
                    for (int i = 0; i < 2; i++) {
                        const float p0 = __expf(s[nt][2 * i] - mu[i]), p1 = __expf(s[nt][2 * i + 1] - mu[i]);
                        const __half2 h = __halves2half2(__float2half_rn(p0), __float2half_rn(p1));
                        lrun[i] += p0 + p1;
                        const int r = rq * 16 + g + 8 * i;
                        *(__half2 *)(void *)(pp + swp(r, ch * 4 + nt) + c4 * 4) = h;
                    }
#pragma unroll
                for (int nt = 0; nt < 32; nt++) {
                    o[nt][0] *= alpha[0];
                    o[nt][1] *= alpha[0];
                    o[nt][2] *= alpha[1];
                    o[nt][3] *= alpha[1];
                }
            }
            __syncthreads();
            /* O[16 rows][256 values] += P[16][64] V[64][256] */
            if (act) {
                pv_acc<16>(o, sp, rq * 16, sk, ch * 32, lane);
            }
            __syncthreads();
        }
    }
    cp_wait<0>(); /* the query tile's copy when every pass was skipped */
    /* row sums: the quad, then the partner warp */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        lrun[i] += __shfl_xor_sync(0xffffffffu, lrun[i], 1);
        lrun[i] += __shfl_xor_sync(0xffffffffu, lrun[i], 2);
        if (c4 == 0) rsum[ch * FBM + rq * 16 + g + 8 * i] = lrun[i];
    }
    __syncthreads();
    const float nan = __int_as_float(0x7fc00000);
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (!rvalid[i]) continue;
        const int r = rq * 16 + g + 8 * i;
        const bool bad = tstate[ltok[i]] == 2 || tbad[all_dense ? 0 : ltok[i]];
        const float inv = bad ? nan : 1.0f / (rsum[r] + rsum[FBM + r]);
        float *orow = out + (R0 + r) * FDV + ch * 256 + 2 * c4;
#pragma unroll
        for (int nt = 0; nt < 32; nt++)
            *(float2 *)(void *)(orow + nt * 8) = make_float2(o[nt][2 * i] * inv, o[nt][2 * i + 1] * inv);
    }
}

/* ---- one token per CTA: the per-token passes at small head counts ---- */

/* At n_head <= 16 (GLM-5 from TP 4 on) k_mla_flash's per-token pass leaves 6 of its 8 warps idle
 * and the other two on one SM sub-partition. Here a CTA is one token: its heads are the 16 rows of
 * one MMA tile (rows past n_head zero and never written) and the 8 warps split the key tile for S
 * and the value columns for O.
 *
 * Grid: one CTA of 256 threads (8 warps) per token t0 + i, the last token first. For each 64-key
 * tile of the token's list, warp w computes S[16 rows][keys 8w .. 8w + 7], the row maxima of the
 * 8 warps meet in shared memory, and warp w accumulates O[16 rows][value columns 64w .. + 64]
 * from P (fp16, shared) and the same tile read transposed. Keys double-buffered with cp.async as
 * in k_mla_flash; same numerics (float32 scores, scale, online softmax, fp16 P, float32 sums). */
constexpr int TBM = 16;
constexpr int TSQ_B = TBM * ROWB, TSP_B = TBM * FBN * 2;
constexpr int TSMEM_B = TSQ_B + 2 * SK_B + TSP_B + (2 * FBN + 2 * 8 * TBM) * 4 + 16;

__global__ void __launch_bounds__(FT, 1)
    k_mla_flash_tok(const __half *__restrict__ qb, const __half *__restrict__ kb, int64_t t0, int64_t n_tok,
                    int n_head, int64_t pos0, const int32_t *__restrict__ sel, int64_t ld_sel,
                    const int32_t *__restrict__ n_sel, int max_sel, float scale, float *__restrict__ out) {
    extern __shared__ __align__(128) uint8_t smem[];
    const uint32_t sq = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t sk0 = sq + TSQ_B, sp = sq + TSQ_B + 2 * SK_B;
    uint8_t *pp = smem + TSQ_B + 2 * SK_B;
    int *kpos = (int *)(void *)(smem + TSQ_B + 2 * SK_B + TSP_B); /* [2][FBN] */
    float *rmax = (float *)(void *)(kpos + 2 * FBN);              /* [8 warps][TBM] */
    float *rsum = rmax + 8 * TBM;                                 /* [8 warps][TBM] */
    int *tbad = (int *)(void *)(rsum + 8 * TBM);                  /* [1] a listed key out of range */

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, c4 = lane & 3;
    const int64_t t = t0 + n_tok - 1 - blockIdx.x, p = pos0 + t;
    const int64_t R0 = t * n_head;
    for (int i = tid; i < TBM * FCH; i += FT) {
        const int r = i / FCH, c = i % FCH;
        const bool ok = r < n_head;
        cp16(sq + sw(r, c), qb + (R0 + (ok ? r : 0)) * FD + c * 8, ok);
    }
    cp_commit();
    const int ns = n_sel[t];
    const bool bad_cnt = ns < 1 || ns > max_sel;
    if (tid == 0) *tbad = 0;
    __syncthreads();

    float o[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; nt++) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    float mrun[2] = {-INFINITY, -INFINITY}, lrun[2] = {0.0f, 0.0f};
    if (!bad_cnt) {
        keylist kl;
        kl.dense = (int64_t)ns == p + 1;
        kl.cnt = kl.dense ? p + 1 : ns;
        kl.plim = p;
        kl.sel = sel + t * ld_sel;
        kl.bad = tbad;
        const int64_t nb = (kl.cnt + FBN - 1) / FBN;
        load_keys(sk0, kpos, kb, kl, 0);
        cp_commit();
        for (int64_t b = 0; b < nb; b++) {
            const int buf = (int)(b & 1);
            tile_ready(sk0, kpos, kb, kl, b, nb);
            const uint32_t sk = sk0 + buf * SK_B;
            const int *kp = kpos + buf * FBN;

            /* S[16 rows][8 keys]: two k-steps per key fragment load */
            float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 3
            for (int kk = 0; kk < FD / 32; kk++) {
                uint32_t a0[4], a1[4], bb[4];
                ldsm4(a0, sq + sw(lane & 15, kk * 4 + (lane >> 4)));
                ldsm4(a1, sq + sw(lane & 15, kk * 4 + 2 + (lane >> 4)));
                ldsm4(bb, sk + sw(warp * 8 + (lane & 7), kk * 4 + (lane >> 3)));
                mma(s, a0, bb[0], bb[1]);
                mma(s, a1, bb[2], bb[3]);
            }
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i = e >> 1, row = g + 8 * i, j = kp[warp * 8 + 2 * c4 + (e & 1)];
                const float v = row < n_head && j >= 0 ? __fmul_rn(s[e], scale) : -INFINITY;
                s[e] = v;
                mx[i] = fmaxf(mx[i], v);
            }
#pragma unroll
            for (int i = 0; i < 2; i++) {
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
                if (c4 == 0) rmax[warp * TBM + g + 8 * i] = mx[i];
            }
            __syncthreads();
            float alpha[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                float mn = mrun[i];
#pragma unroll
                for (int w = 0; w < 8; w++) mn = fmaxf(mn, rmax[w * TBM + g + 8 * i]);
                const float mu = mn == -INFINITY ? 0.0f : mn;
                alpha[i] = __expf(mrun[i] - mu);
                mrun[i] = mn;
                lrun[i] *= alpha[i];
                const float p0 = __expf(s[2 * i] - mu), p1 = __expf(s[2 * i + 1] - mu);
                lrun[i] += p0 + p1;
                *(__half2 *)(void *)(pp + swp(g + 8 * i, warp) + c4 * 4) =
                    __halves2half2(__float2half_rn(p0), __float2half_rn(p1));
            }
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
                o[nt][0] *= alpha[0];
                o[nt][1] *= alpha[0];
                o[nt][2] *= alpha[1];
                o[nt][3] *= alpha[1];
            }
            __syncthreads();
            /* O[16 rows][64 values] += P[16][64] V[64][64 of this warp] */
            pv_acc<4>(o, sp, 0, sk, warp * 8, lane);
            __syncthreads();
        }
    }
    cp_wait<0>(); /* the query tile's copy when the token was skipped */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        lrun[i] += __shfl_xor_sync(0xffffffffu, lrun[i], 1);
        lrun[i] += __shfl_xor_sync(0xffffffffu, lrun[i], 2);
        if (c4 == 0) rsum[warp * TBM + g + 8 * i] = lrun[i];
    }
    __syncthreads();
    const float nan = __int_as_float(0x7fc00000);
    const bool bad = bad_cnt || *tbad;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = g + 8 * i;
        if (r >= n_head) continue;
        float l = 0.0f;
#pragma unroll
        for (int w = 0; w < 8; w++) l += rsum[w * TBM + r];
        const float inv = bad ? nan : 1.0f / l;
        float *orow = out + (R0 + r) * FDV + warp * 64 + 2 * c4;
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
            *(float2 *)(void *)(orow + nt * 8) = make_float2(o[nt][2 * i] * inv, o[nt][2 * i + 1] * inv);
    }
}

} // namespace

extern "C" g5_status cuk_mla_flash(const cuk_mla_flash_args *a, cuk_stream stream, g5_error *err) {
    if (!a || !a->qb || !a->kb || !a->sel || !a->n_sel || !a->out) return BAD("mla_flash: NULL pointer");
    if (a->kv_lora != FDV || a->rope != FD - FDV)
        return BAD("mla_flash: kv_lora=%d rope=%d (the kernel is built for %d + %d)", a->kv_lora, a->rope, FDV,
                   FD - FDV);
    if (a->n_tok < 1 || a->n_head < 1 || a->pos0 < 0 || a->max_sel < 1 || a->ld_sel < a->max_sel)
        return BAD("mla_flash: n_tok=%d n_head=%d pos0=%lld max_sel=%d ld_sel=%lld", a->n_tok, a->n_head,
                   (long long)a->pos0, a->max_sel, (long long)a->ld_sel);
    if (a->et != CUK_F16) return BAD("mla_flash: et %u (fp16 only)", a->et);
    const int64_t rows = (int64_t)a->n_tok * a->n_head, nblk = (rows + FBM - 1) / FBM;
    if (nblk > 0x7fffffff) return BAD("mla_flash: %lld row blocks", (long long)nblk);
    /* At n_head <= TBM the tokens that index_topk leaves dense (p + 1 <= max_sel: one causal pass
     * per CTA of 64 / n_head tokens) go to k_mla_flash, the later ones to k_mla_flash_tok. Either
     * kernel handles any token; the split only picks the faster one. */
    const int64_t n_first = a->n_head > TBM ? a->n_tok
                            : a->max_sel - a->pos0 <= 0 ? 0
                            : a->max_sel - a->pos0 < a->n_tok ? a->max_sel - a->pos0 : a->n_tok;
    const int64_t rows_first = n_first * a->n_head, nblk_first = (rows_first + FBM - 1) / FBM;
    /* the shared-memory limits are raised once per device (a repeat is harmless, so no lock) */
    static bool raised[64];
    int dev = 0;
    CUK_CHECK(cudaGetDevice(&dev));
    if (dev < 0 || dev >= 64 || !raised[dev]) {
        CUK_CHECK(cudaFuncSetAttribute(k_mla_flash, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_B));
        CUK_CHECK(cudaFuncSetAttribute(k_mla_flash_tok, cudaFuncAttributeMaxDynamicSharedMemorySize, TSMEM_B));
        if (dev >= 0 && dev < 64) raised[dev] = true;
    }
    if (nblk_first > 0)
        k_mla_flash<<<(unsigned)nblk_first, FT, SMEM_B, (cudaStream_t)stream>>>(
            (const __half *)a->qb, (const __half *)a->kb, rows_first, a->n_head, a->pos0, a->sel, a->ld_sel,
            a->n_sel, a->max_sel, a->scale, a->out);
    if (n_first < a->n_tok)
        k_mla_flash_tok<<<(unsigned)(a->n_tok - n_first), FT, TSMEM_B, (cudaStream_t)stream>>>(
            (const __half *)a->qb, (const __half *)a->kb, n_first, a->n_tok - n_first, a->n_head, a->pos0, a->sel,
            a->ld_sel, a->n_sel, a->max_sel, a->scale, a->out);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}
