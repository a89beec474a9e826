/* Fast mode's MLA decode attention on the tensor cores (attn_int.cuh: mla_dec_run), for the
 * three decode launchers of attn.cu (cuk_mla_attend_fresh, _dev, _multi with args.tc set): the
 * absorbed form of cuk_mla_flash (queries [qlat | q_pe] and keys the latent rows, 576 wide;
 * values their first 512 columns), fp16 inputs, float32 accumulators and softmax.
 *
 * Why not k_attend_hg (float32 on the CUDA cores, precise mode's kernel): a decode step's scores
 * and weighted sums are 2 x 576 x 512 x n_head MACs per 512 keys, which on the CUDA cores cost a
 * 32-sequence step 692 us per layer of the peer model (session 11); here every 64-key tile read
 * serves all of a token's heads as the rows of one MMA tile.
 *
 * Grid (CL, ceil(n_head / M), n_tok), clusters of (CL, 1, 1), 256 threads (8 warps). A CTA holds M
 * = 16 RB heads of one token (RB = 1, 2 or 4 row blocks of 16; rows past n_head are zero and never
 * written). The token's n_sel keys are cut into 64-key tiles, CTA `rank` of the cluster takes the
 * tiles rank * tpc .. + tpc (tpc = ceil(tiles / CL)), double-buffered with cp.async (a 16-bit
 * cache row as it is, converted to fp16 in place for bf16; the token's own float32 rows converted
 * on the way). Warp w owns rows 16 (w % RB) .. + 16 and, of the KS = 8 / RB warps per row block,
 * is number ks = w / RB: for S = Q K^T it computes keys 64 / KS * ks .. of the tile, for O += P V
 * value columns 512 / KS * ks ..; row maxima and sums meet in shared memory, P goes through it
 * as fp16 (the numerics of k_mla_flash). A row's running sum is kept per 8-key column group of
 * the tile (whichever warp computes it) and the groups are added in order at the end, so the bits
 * are the same for every RB. Each CTA then leaves its running max m, sum l and unnormalised O
 * (float32) in its shared memory and, after a cluster barrier, CTA `rank` combines a 1 / CL share
 * of the token's (head, column) outputs over the busy CTAs in rank order (flash-decoding through
 * distributed shared memory: no global scratch, one launch). CL is fixed by max_sel and the
 * device (the smallest largest cluster of the forms that fit), never by the token count, so a
 * token's bits are the same in a one-token launch, a graph step and a multi-sequence step, while
 * the launcher picks RB per launch: 16 heads a CTA for one token (64 CTAs at 64 heads, against 16
 * with RB 4: 12.6 against 20.7 us at 512 keys on the H100), RB 4 from 4 tokens (at 8: 40.4
 * against 56.8 us at RB 1), bench/RESULTS.md. */
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "cuda/attn_int.cuh"
#include "cuda/cuk_internal.cuh"
#include "cuda/mla_tile.cuh"
#include "cuda/pdl.cuh"

namespace cg = cooperative_groups;

namespace {

using namespace cuk::mla;
using cuk::cp16;
using cuk::cp_commit;
using cuk::cp_wait;
using cuk::ldsm4;

constexpr int DT = 256;                   /* threads per CTA */
constexpr int DMAXCL = CUK_MLA_DEC_CLUSTER_MAX;
constexpr int DKEYS_PER_CTA = 2 * FBN;    /* the cluster is sized for two tiles per CTA at max_sel */

/* Shared memory of a CTA of M rows: the query tile, two key tiles, the P tile, key positions,
 * the row maxima and sums of the 8 warps. After the last tile the key tiles hold the CTA's
 * unnormalised O ([M][512] float32) and the query tile its m, l and the combine's weights. */
__host__ __device__ constexpr int dec_smem(int M) { return M * ROWB + 2 * SK_B + M * FBN * 2 + 2 * FBN * 4 + 8 * 16 * 4; }
static_assert(dec_smem(64) <= 227 * 1024, "k_mla_dec<4> fits sm_90's opt-in");
static_assert(64 * FDV * 4 <= 2 * SK_B, "the partial O fits the key tiles");
static_assert(2 * 64 * 4 <= 64 * ROWB, "m and l fit the query tile");

__device__ __forceinline__ uint32_t h2(float a, float b) {
    const __half2 v = __floats2half2_rn(a, b);
    return *(const uint32_t *)&v;
}

/* 8 float32 (x, y) -> 8 fp16 at dst (shared) */
__device__ __forceinline__ void st_f16x8(uint8_t *dst, float4 x, float4 y) {
    *(uint4 *)dst = make_uint4(h2(x.x, x.y), h2(x.z, x.w), h2(y.x, y.y), h2(y.z, y.w));
}

/* 8 bf16 -> 8 fp16 */
__device__ __forceinline__ uint4 bf16x8_to_f16(uint4 v) {
    uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const __nv_bfloat162 b = *(const __nv_bfloat162 *)&w[i];
        const float2 f = __bfloat1622float2(b);
        w[i] = h2(f.x, f.y);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

/* All threads, four per key: keys u0 .. u0 + 63 of token's list into the tile at (sk, skg: its
 * shared and generic addresses). Cache rows go by cp.async (zero-filled where there is no key),
 * fresh rows are converted and stored now (selrow NULL: the list 0, 1, ..). Returns this thread's
 * key position (-1: none); a listed position outside [0, n_pos) sets *bad. */
__device__ __forceinline__ int load_tile(uint32_t sk, uint8_t *skg, int *kp, const void *lat, const ac_range &kr,
                                         const int32_t *selrow, int ns, int u0, int *bad) {
    const int key = threadIdx.x >> 2, c0 = threadIdx.x & 3, u = u0 + key;
    int j = -1;
    if (u < ns) {
        j = selrow ? selrow[u] : u;
        if (j < 0 || j >= kr.n_pos) {
            *bad = 1;
            j = -1;
        }
    }
    if (j >= kr.fresh0) { /* loads of a batch issued together: they are dependent-free */
        const float *src = kr.fresh + (int64_t)(j - kr.fresh0) * FD;
        constexpr int FB = 6;
        static_assert((FCH / 4) % FB == 0, "fresh-row batches");
        for (int k0 = 0; k0 < FCH / 4; k0 += FB) {
            float4 v[FB][2];
#pragma unroll
            for (int k = 0; k < FB; k++) {
                const float *e = src + (c0 + 4 * (k0 + k)) * 8;
                v[k][0] = *(const float4 *)e;
                v[k][1] = *(const float4 *)(e + 4);
            }
#pragma unroll
            for (int k = 0; k < FB; k++) st_f16x8(skg + sw(key, c0 + 4 * (k0 + k)), v[k][0], v[k][1]);
        }
    } else {
        const uint16_t *src = (const uint16_t *)lat + (int64_t)(j < 0 ? 0 : j) * FD;
#pragma unroll
        for (int c = c0; c < FCH; c += 4) cp16(sk + sw(key, c), src + c * 8, j >= 0);
    }
    if (c0 == 0) kp[key] = j;
    return j;
}

/* This thread's chunks of a completed bf16 tile (key position j read from the cache) to fp16, in
 * batches of CB chunks whose loads are issued together: a store may alias the next chunk's load
 * for the compiler, so one chunk at a time is 18 dependent shared-memory round trips a tile */
template <int CB>
__device__ __forceinline__ void tile_to_f16(uint8_t *skg, int j, int64_t fresh0) {
    constexpr int N = FCH / 4; /* chunks a thread converts */
    static_assert(N % CB == 0, "whole batches");
    if (j < 0 || j >= fresh0) return;
    const int key = threadIdx.x >> 2, c0 = threadIdx.x & 3;
#pragma unroll
    for (int k0 = 0; k0 < N; k0 += CB) {
        uint4 v[CB];
#pragma unroll
        for (int k = 0; k < CB; k++) v[k] = *(const uint4 *)(skg + sw(key, c0 + 4 * (k0 + k)));
#pragma unroll
        for (int k = 0; k < CB; k++) *(uint4 *)(skg + sw(key, c0 + 4 * (k0 + k))) = bf16x8_to_f16(v[k]);
    }
}

template <int RB, bool BF16>
__global__ void __launch_bounds__(DT, 1) k_mla_dec(ac_args a) {
    constexpr int M = 16 * RB, KS = 8 / RB, KW = FBN / KS, NKT = KW / 8, NP = 32 / KS;
    constexpr int TCB = RB == 1 ? 18 : RB == 2 ? 9 : 3; /* tile_to_f16 batches within the registers o leaves */
    extern __shared__ __align__(128) uint8_t smem[];
    __shared__ int bad;
    cg::cluster_group cl = cg::this_cluster();
    const int CL = (int)cl.num_blocks(), rank = (int)cl.block_rank();
    /* the W_UV product after it (cuk_head_gemv, a programmatic launch) may start and load its
     * weights; it reads this kernel's output only after its pdl_wait */
    cuk::pdl_trigger();
    const uint32_t sq = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t sk0 = sq + M * ROWB, sp = sk0 + 2 * SK_B;
    uint8_t *sqg = smem, *skg0 = smem + M * ROWB, *pp = skg0 + 2 * SK_B;
    int *kpos = (int *)(void *)(pp + M * FBN * 2); /* [2][FBN] */
    float *rmax = (float *)(void *)(kpos + 2 * FBN); /* [KS][M] */

    const cuk_mla_dims d = a.d;
    const int H = d.n_head, t = blockIdx.z, h0 = blockIdx.y * M, nh = min(M, H - h0);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, c4 = lane & 3;
    const int rb = warp % RB, ks = warp / RB;
    const ac_range kr = ac_token_range(a, t, FD);
    const int ns_raw = ac_n_sel(a, t, kr);
    const bool ok = kr.ok && ns_raw >= 1 && ns_raw <= a.max_sel;
    const int ns = ok ? ns_raw : 0, tiles = (ns + FBN - 1) / FBN, tpc = (tiles + CL - 1) / CL;
    const int nbusy = tpc ? (tiles + tpc - 1) / tpc : 0;
    const int b0 = min(tiles, rank * tpc), b1 = min(tiles, b0 + tpc);
    const int32_t *selrow = a.sel ? a.sel + (int64_t)t * a.ld_sel : nullptr; /* NULL: every key */
    if (tid == 0) bad = !ok;
    __syncthreads();

    float o[2 * NP][4];
#pragma unroll
    for (int nt = 0; nt < 2 * NP; nt++) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    float mrun[2] = {-INFINITY, -INFINITY};
    float lrun[NKT][2]; /* per 8-key column group of the tile: the sum's order does not depend on RB */
#pragma unroll
    for (int nt = 0; nt < NKT; nt++) lrun[nt][0] = lrun[nt][1] = 0.0f;
    if (b0 < b1) {
        int jn = load_tile(sk0, skg0, kpos, kr.lat, kr, selrow, ns, b0 * FBN, &bad);
        cp_commit();
        /* the queries, fp16: [qlat | q_pe] of heads h0 .. h0 + nh - 1, zero rows past them */
        constexpr int QPT = (M * FCH + DT - 1) / DT, QB = QPT < 6 ? QPT : 6;
        for (int k0 = 0; k0 < QPT; k0 += QB) { /* a batch's loads issued together */
            float4 v[QB][2];
#pragma unroll
            for (int k = 0; k < QB; k++) {
                const int i = tid + (k0 + k) * DT, r = i / FCH, c = i - r * FCH;
                v[k][0] = v[k][1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (k0 + k < QPT && r < nh) {
                    const int64_t row = (int64_t)t * H + h0 + r;
                    const float *e = c < FDV / 8 ? a.qlat + row * FDV + c * 8
                                                 : a.q + row * (d.nope + d.rope) + d.nope + (c * 8 - FDV);
                    v[k][0] = *(const float4 *)e;
                    v[k][1] = *(const float4 *)(e + 4);
                }
            }
#pragma unroll
            for (int k = 0; k < QB; k++) {
                const int i = tid + (k0 + k) * DT, r = i / FCH, c = i - r * FCH;
                if (k0 + k < QPT && r < M) st_f16x8(sqg + sw(r, c), v[k][0], v[k][1]);
            }
        }
        for (int b = b0; b < b1; b++) {
            const int buf = (b - b0) & 1;
            const uint32_t sk = sk0 + buf * SK_B;
            uint8_t *skg = skg0 + buf * SK_B;
            const int *kp = kpos + buf * FBN;
            const int jc = jn;
            if (b + 1 < b1) {
                jn = load_tile(sk0 + (buf ^ 1) * SK_B, skg0 + (buf ^ 1) * SK_B, kpos + (buf ^ 1) * FBN, kr.lat, kr,
                               selrow, ns, (b + 1) * FBN, &bad);
                cp_commit();
                cp_wait<1>();
            } else {
                cp_wait<0>();
            }
            if (BF16) tile_to_f16<TCB>(skg, jc, kr.fresh0);
            __syncthreads();

            /* S[16 rows][KW keys] of this warp */
            float s[NKT][4];
#pragma unroll
            for (int nt = 0; nt < NKT; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
            if constexpr (NKT == 1) { /* 8 keys: one fragment load covers two k-steps */
#pragma unroll 3
                for (int kk = 0; kk < FD / 32; kk++) {
                    uint32_t a0[4], a1[4], bb[4];
                    ldsm4(a0, sq + sw(rb * 16 + (lane & 15), kk * 4 + (lane >> 4)));
                    ldsm4(a1, sq + sw(rb * 16 + (lane & 15), kk * 4 + 2 + (lane >> 4)));
                    ldsm4(bb, sk + sw(ks * KW + (lane & 7), kk * 4 + (lane >> 3)));
                    cuk::mma_f16(s[0], a0, bb[0], bb[1]);
                    cuk::mma_f16(s[0], a1, bb[2], bb[3]);
                }
            } else {
#pragma unroll 4
                for (int kk = 0; kk < FD / 16; kk++) {
                    uint32_t a4[4];
                    ldsm4(a4, sq + sw(rb * 16 + (lane & 15), kk * 2 + (lane >> 4)));
#pragma unroll
                    for (int np = 0; np < NKT / 2; np++) {
                        const int mi = lane >> 3, key = ks * KW + np * 16 + (lane & 7) + ((mi >> 1) << 3);
                        uint32_t bb[4];
                        ldsm4(bb, sk + sw(key, kk * 2 + (mi & 1)));
                        cuk::mma_f16(s[np * 2], a4, bb[0], bb[1]);
                        cuk::mma_f16(s[np * 2 + 1], a4, bb[2], bb[3]);
                    }
                }
            }
            /* mask, scale, row maxima of this warp's keys */
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int nt = 0; nt < NKT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int i = e >> 1, row = rb * 16 + g + 8 * i, j = kp[ks * KW + nt * 8 + 2 * c4 + (e & 1)];
                    const float v = row < nh && j >= 0 ? __fmul_rn(s[nt][e], a.scale) : -INFINITY;
                    s[nt][e] = v;
                    mx[i] = fmaxf(mx[i], v);
                }
#pragma unroll
            for (int i = 0; i < 2; i++) {
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
                if (c4 == 0) rmax[ks * M + rb * 16 + g + 8 * i] = mx[i];
            }
            __syncthreads();
            float alpha[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int r = rb * 16 + g + 8 * i;
                float mn = mrun[i];
#pragma unroll
                for (int k = 0; k < KS; k++) mn = fmaxf(mn, rmax[k * M + r]);
                const float mu = mn == -INFINITY ? 0.0f : mn;
                alpha[i] = __expf(mrun[i] - mu);
                mrun[i] = mn;
#pragma unroll
                for (int nt = 0; nt < NKT; nt++) {
                    const float p0 = __expf(s[nt][2 * i] - mu), p1 = __expf(s[nt][2 * i + 1] - mu);
                    lrun[nt][i] = __fadd_rn(__fmul_rn(lrun[nt][i], alpha[i]), __fadd_rn(p0, p1));
                    *(uint32_t *)(void *)(pp + swp(r, ks * NKT + nt) + c4 * 4) = h2(p0, p1);
                }
            }
#pragma unroll
            for (int nt = 0; nt < 2 * NP; nt++) {
                o[nt][0] *= alpha[0];
                o[nt][1] *= alpha[0];
                o[nt][2] *= alpha[1];
                o[nt][3] *= alpha[1];
            }
            __syncthreads();
            /* O[16 rows][512 / KS values] += P[16][64] V[64][512 / KS] */
            pv_acc<NP>(o, sp, rb * 16, sk, ks * (FDV / 8) / KS, lane);
            __syncthreads();
        }
    }
    /* this CTA's state: the column groups' sums [FBN / 8][M] (in the P tile, free after the last
     * tile) -> l per row, in group order; O into the key tiles, m and l into the query tile */
    float *gsum = (float *)(void *)pp;
#pragma unroll
    for (int nt = 0; nt < NKT; nt++)
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float l = lrun[nt][i];
            l = __fadd_rn(l, __shfl_xor_sync(0xffffffffu, l, 1));
            l = __fadd_rn(l, __shfl_xor_sync(0xffffffffu, l, 2));
            if (c4 == 0) gsum[(ks * NKT + nt) * M + rb * 16 + g + 8 * i] = l;
        }
    float *po = (float *)(void *)skg0;   /* [M][512] */
    float *cm = (float *)(void *)sqg;    /* [M] */
    float *cs = cm + M;                  /* [M] */
    if (b0 < b1) {
#pragma unroll
        for (int nt = 0; nt < 2 * NP; nt++)
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int r = rb * 16 + g + 8 * i, col = ks * (FDV / KS) + nt * 8 + 2 * c4;
                *(float2 *)(void *)(po + r * FDV + col) = make_float2(o[nt][2 * i], o[nt][2 * i + 1]);
            }
    }
    __syncthreads();
    /* a CTA that read a listed position out of range says so through its sums: NaN makes every
     * row's combined sum NaN, so the whole token is NaN in each CTA's share (a CTA with no tiles
     * has bad only where the token itself is out of range, the same in all of them) */
    if (ks == 0 && c4 == 0)
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int r = rb * 16 + g + 8 * i;
            float l = 0.0f;
#pragma unroll
            for (int k = 0; k < FBN / 8; k++) l = __fadd_rn(l, gsum[k * M + r]);
            cm[r] = mrun[i];
            cs[r] = bad ? nanf_() : l;
        }
    cl.sync();
    /* the combine: four columns of a row per thread, the busy CTAs' m, l and float4 of O loaded
     * together (one round trip through distributed shared memory), the weights in rank order */
    const float nan = nanf_();
    for (int i = rank * DT + tid; i < nh * (FDV / 4); i += CL * DT) {
        const int r = i / (FDV / 4), col = 4 * (i - r * (FDV / 4));
        float mc[DMAXCL], lc[DMAXCL];
        float4 v[DMAXCL];
#pragma unroll
        for (int c = 0; c < DMAXCL; c++) {
            mc[c] = c < nbusy ? cl.map_shared_rank(cm, c)[r] : -INFINITY;
            lc[c] = c < nbusy ? cl.map_shared_rank(cs, c)[r] : 0.0f;
            v[c] = c < nbusy ? *(const float4 *)(cl.map_shared_rank(po, c) + r * FDV + col) : make_float4(0, 0, 0, 0);
        }
        float mx = -INFINITY;
#pragma unroll
        for (int c = 0; c < DMAXCL; c++) mx = fmaxf(mx, mc[c]);
        float l = 0.0f;
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int c = 0; c < DMAXCL; c++) {
            if (c >= nbusy) break;
            const float w = mc[c] == -INFINITY ? 0.0f : __expf(mc[c] - mx);
            l = fmaf(w, lc[c], l);
            acc.x = fmaf(w, v[c].x, acc.x);
            acc.y = fmaf(w, v[c].y, acc.y);
            acc.z = fmaf(w, v[c].z, acc.z);
            acc.w = fmaf(w, v[c].w, acc.w);
        }
        *(float4 *)(a.out + ((int64_t)t * H + h0 + r) * FDV + col) =
            bad || isnan(l) ? make_float4(nan, nan, nan, nan) : make_float4(acc.x / l, acc.y / l, acc.z / l, acc.w / l);
    }
    cl.sync(); /* the others may still read this CTA's shared memory */
}

/* The largest cluster of every form that fits the device (`fit` of them: RB 1, 2, 4), so that CL,
 * and with it the bits, do not depend on which form a launch takes. Once per device. */
template <bool BF16>
g5_status dec_cluster_max(int fit, cudaStream_t st, int *out, g5_error *err) {
    static int cl_dev[CUK_MAX_DEVICES];
    int &max_cl = cl_dev[cuk_device_slot()];
    if (max_cl == 0) {
        const void *fn[3] = {(const void *)k_mla_dec<1, BF16>, (const void *)k_mla_dec<2, BF16>,
                             (const void *)k_mla_dec<4, BF16>};
        int m = DMAXCL;
        for (int i = 0; i < fit; i++) {
            const int smem = dec_smem(16 << i);
            CUK_CHECK(cudaFuncSetAttribute(fn[i], cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
            m = min(m, cuk_cluster_max(fn[i], DMAXCL, DT, (size_t)smem, st));
        }
        max_cl = m;
    }
    *out = max_cl;
    return G5_OK;
}

template <int RB, bool BF16>
g5_status dec_launch(const ac_args &a, int cl, cudaStream_t st, g5_error *err) {
    constexpr int M = 16 * RB;
    cudaLaunchAttribute at;
    const cudaLaunchConfig_t cfg = cuk_cluster_cfg(
        &at, (unsigned)cl, dim3((unsigned)cl, (unsigned)((a.d.n_head + M - 1) / M), (unsigned)a.d.n_tok), DT,
        dec_smem(M), st);
    CUK_CHECK(cudaLaunchKernelEx(&cfg, k_mla_dec<RB, BF16>, a));
    CUK_CHECK_LAUNCH("mla_attend (tensor cores)");
    return G5_OK;
}

/* How many of the forms RB 1, 2, 4 the device's opt-in holds (0: none) */
int dec_forms_fit(const cuk_device *dev) {
    int n = 0;
    while (n < 3 && dev && (int64_t)dec_smem(16 << n) <= (int64_t)dev->smem_optin) n++;
    return n;
}

template <bool BF16>
g5_status dec_run(const ac_args &a, cudaStream_t st, g5_error *err) {
    const cuk_device *dev = cuk_device_current();
    const int fit = dec_forms_fit(dev);
    if (!fit) return g5_fail(err, G5_ERR_INVALID_ARG, "mla_attend (tensor cores): no form fits the device");
    int max_cl = 0;
    const g5_status s = dec_cluster_max<BF16>(fit, st, &max_cl, err);
    if (s != G5_OK) return s;
    int cl = (a.max_sel + DKEYS_PER_CTA - 1) / DKEYS_PER_CTA;
    if (cl > max_cl) cl = max_cl;
    if (cl < 1) cl = 1;
    /* then the fewest CTAs (more heads a CTA: each key tile serves more rows) that fill at least
     * a third of the SMs: 64 heads run as RB 1, 2 and 4 on 64 CTAs for 1, 2 and 4 tokens (12.6,
     * 16.0 and 21.0 us at 512 keys on the H100, each the fastest form) */
    int lg = 0; /* RB 16 << lg heads a CTA: no more than the heads need, no more than fit */
    while (lg + 1 < fit && (16 << lg) < a.d.n_head) lg++;
    const int64_t per = (int64_t)cl * a.d.n_tok;
    while (lg > 0 && per * ((a.d.n_head + (16 << lg) - 1) / (16 << lg)) * 3 < dev->sm_count) lg--;
    switch (lg) {
    case 0: return dec_launch<1, BF16>(a, cl, st, err);
    case 1: return dec_launch<2, BF16>(a, cl, st, err);
    default: return dec_launch<4, BF16>(a, cl, st, err);
    }
}

} // namespace

int mla_dec_fits(const cuk_mla_dims *d, uint32_t lat_type) {
    if (!d || d->kv_lora != FDV || d->rope != FD - FDV || d->nope < 0 || d->nope % 4) return 0;
    if (lat_type != CUK_BF16 && lat_type != CUK_F16) return 0;
    if (d->n_head < 1 || (d->n_head + 15) / 16 > 65535) return 0;
    return dec_forms_fit(cuk_device_current()) > 0; /* cuda/cuk_device.h */
}

g5_status mla_dec_run(const ac_args &a, uint32_t lat_type, cudaStream_t st, g5_error *err) {
    if (((uintptr_t)a.q | (uintptr_t)a.qlat | (uintptr_t)a.lat | (uintptr_t)a.fresh) & 15)
        return g5_fail(err, G5_ERR_INVALID_ARG, "mla_attend (tensor cores): operands not 16-byte aligned");
    return lat_type == CUK_BF16 ? dec_run<true>(a, st, err) : dec_run<false>(a, st, err);
}
