/* Tensor-core dequantizing GEMV (plain, MoE gate+up fused, MoE down) for Q4_K, float32
 * activations. Included by cuda/gemv_q4_k.cu (CUK_GEMV_TC_INSTANTIATE); cuda/gemv.cu picks this
 * path or the CUDA-core one (gemv_impl.cuh) per call, by the weight shape.
 *
 * Why: the CUDA-core kernels spend about 2 instructions per weight on building a float and
 * multiplying it (measured instruction-bound at 0.38 of HBM for Q4_K). Here one mma.m16n8k16
 * multiplies 16 rows x 16 weights at once and a weight costs about 0.6 instruction to decode.
 *
 * Numerics (the products still take float32 inputs, exactly):
 * - x is split into three f16 pieces, x * 2^e = h + m + l (e per vector, chosen from max|x| so
 *   that h cannot overflow; h, m, l carry 33 significant bits, so the split is exact to
 *   2^-25 * 2^14 of max|x|, below float32 rounding). The pieces are the mma's B columns.
 * - Quants are exact f16 values: subnormals (the nibble placed in the low mantissa bits:
 *   q * 2^-24 exactly, or 16 q * 2^-24 for a high nibble). f16 x f16 products are exact in the
 *   f32 accumulator.
 * - Per 32-element group the mma result D (f32) is scaled: y += a * D - b * sum(x_group), with
 *   a, b from the block's scales; warps, then lanes, are summed in a fixed order.
 *
 * Layout:
 * - CTA: NW = 8 warps. An item is 16 A rows (gemv, down: 16 output rows; gate_up: 8 gate rows in
 *   A rows 0..7 and the same 8 up rows in A rows 8..15). The 8 warps split the item's k into
 *   chunks (warp w takes chunks w, w + 8, ...) and the CTA sums them in shared memory.
 * - CTAs are persistent over items (grid.x <= 2 per SM), grid.y = token for the MoE kernels:
 *   the x pieces are made once per CTA (prologue) into shared memory in B-fragment order.
 * - Within a 32-element group, lane quad index t (= lane % 4) owns elements 8t + 4j + {0,1,2,3}
 *   for the group's two mma tiles j = 0, 1: register r0 holds elements +0, +2, r1 holds +1, +3
 *   (how one 32-bit word of quants splits into two f16 pairs). x pieces are stored permuted the
 *   same way, so A's and B's k orders agree. */
#ifndef G5_GEMV_TC_CUH
#define G5_GEMV_TC_CUH

#include "cuda/gemv_impl.cuh"
#include "cuda/moe_plan.cuh"

namespace cuk {
namespace tc {

constexpr int NW = 8;                      /* warps per CTA */
constexpr int SMEM_MAX = CUK_GEMV_TC_SMEM_PREF; /* two CTAs per SM; capped by the device (cuk_limits.h) */
enum { M_GEMV = 0, M_GATE_UP = 1, M_DOWN = 2 };
/* Chunks in flight per warp + 1. Measured against deeper staging (3), an L2 prefetch of the next
 * item and magic-exponent quants (bench/NOTES.md, GEMV rounds 2 and 3): this one was fastest,
 * the others are gone. */
constexpr int DEPTH = 2;

template <int T> struct TT;
/* CH: elements per chunk (a warp's unit of k), BB/BLK: block bytes/elements. */
template <> struct TT<QT_Q4_K> { static constexpr int CH = 256, BLK = 256, BB = 144; };

template <int NV> struct NvGeo {
    static constexpr int NP = (NV + 1) / 2;   /* vector pairs = mmas per tile */
    static constexpr int CP = NV == 1 ? 3 : 6; /* stored B columns per pair */
};

/* Shared-memory layout of one CTA for K virtual elements (multiple of 256). */
template <int NV> struct Lay {
    static constexpr int NP = NvGeo<NV>::NP, CP = NvGeo<NV>::CP;
    __host__ __device__ static size_t b_bytes(int K) { return (size_t)K * 2 * NP * CP; }
    __host__ __device__ static size_t sx_bytes(int K) { return (size_t)(2 * NP) * (K / 32) * sizeof(float); }
    static constexpr size_t SAB = (size_t)NW * 2 * 16 * 8 * sizeof(float); /* a, b per warp */
    static constexpr size_t RED = (size_t)NW * NP * 32 * 2 * sizeof(float);
    static constexpr size_t MISC = (size_t)(NW * NV + 2 * 2 * NP) * sizeof(float);
    static size_t total(int K) { return b_bytes(K) + sx_bytes(K) + SAB + RED + MISC; }
};

/* Launch parameters shared by the three modes (fields a mode does not use are 0). */
struct Params {
    const uint8_t *w0, *w1; /* gemv/down: w0; gate_up: w0 gate, w1 up */
    int64_t rb;             /* bytes per row (k elements) */
    int64_t m;              /* rows per matrix */
    int64_t mat;            /* bytes per expert matrix (m * rb) */
    const int32_t *plan;    /* MoE: cuk_moe_plan (cuda/cuk.h) of n_pairs pairs */
    int n_pairs;
    int top_k;
    const void *x;          /* gemv: [nvec][ldx]; gate_up: [n_tok][ldx]; down: [n_tok*top_k][ldx] */
    int64_t ldx;
    int nvec;               /* gemv: vectors of this launch */
    int k;                  /* k of one matrix row */
    float *y;               /* gemv: [nvec][ldy]; MoE: [n_tok*top_k][ldy] by pair */
    int64_t ldy;
    int64_t items;          /* row tiles per matrix (gate_up: of 8 rows, else of 16) */
};

__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint2 ldg64(const uint8_t *p) {
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.b32 {%0,%1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}
__device__ __forceinline__ uint4 ldg128(const uint8_t *p) {
    uint4 v;
    asm volatile("ld.global.nc.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
__device__ __forceinline__ float h2f(uint32_t bits) {
    return __half2float(__ushort_as_half((unsigned short)(bits & 0xFFFFu)));
}

/* The three f16 pieces of x (exact split, see the file comment) as bits. */
__device__ __forceinline__ void split3(float x, uint32_t &h, uint32_t &m, uint32_t &l) {
    const __half hh = __float2half_rn(x);
    const float r1 = x - __half2float(hh);
    const __half mh = __float2half_rn(r1);
    const float r2 = r1 - __half2float(mh);
    h = __half_as_ushort(hh);
    m = __half_as_ushort(mh);
    l = __half_as_ushort(__float2half_rn(r2));
}

/* ---- per-type chunk loads and math ---- */

/* Raw bytes of one chunk for the lane's rows g and g+8 (A rows), in registers. */
template <int T> struct Raw;
template <> struct Raw<QT_Q4_K> {
    uint4 hdr;      /* header (d, dmin, scales) of the row this lane decodes scales for */
    uint2 q[2][4];  /* [row g / g+8][pair p]: qs bytes 32p + 8t .. +7 */
};

/* rowp[0], rowp[1]: chunk start in rows g and g+8. */
__device__ __forceinline__ void load_raw(Raw<QT_Q4_K> &r, const uint8_t *const rowp[2], int t) {
    r.hdr = ldg128((t >> 1) ? rowp[1] : rowp[0]); /* a select keeps rowp in registers */
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int p = 0; p < 4; p++) r.q[h][p] = ldg64(rowp[h] + 16 + 32 * p + 8 * t);
}
/* Component i (a compile-time constant after unrolling) of v, kept in registers. */
__device__ __forceinline__ float f4get(const float4 &v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/* B fragment (two registers) of group G, tile j, pair pi for this lane; boff < 0: zero column. */
template <int NP, int CP>
__device__ __forceinline__ uint2 ldb(const uint2 *bs, int G, int j, int pi, int boff) {
    if (boff < 0) return make_uint2(0u, 0u);
    return bs[(((G * 2 + j) * NP + pi) * CP) * 4 + boff];
}

/* acc[pi][0..1] (rows g, g+8 of vector 2 pi + t/2) += the chunk's contribution.
 * G0: the chunk's first 32-element group in the virtual k; sab: this warp's a/b area. */
template <int NV>
__device__ __forceinline__ void chunk_math(const Raw<QT_Q4_K> &r, const uint2 *bs, const float *sx,
                                           int ngrp, float *sab, int G0, int lane, int boff,
                                           float (&acc)[NvGeo<NV>::NP][2]) {
    constexpr int NP = NvGeo<NV>::NP, CP = NvGeo<NV>::CP;
    const int g = lane >> 2, t = lane & 3;
    /* Scales: lane decodes sub-blocks 4h..4h+3 of A row rr (two lanes per row), the warp shares
     * them through sab: a at [rr][s], b at [16 + rr][s]. */
    {
        const int rr = (t >> 1) ? g + 8 : g, h = t & 1;
        const float d = h2f(r.hdr.x), dmin = h2f(r.hdr.x >> 16);
        const uint32_t s0 = r.hdr.y, s1 = r.hdr.z, s2 = r.hdr.w;
        const uint32_t sc = h ? (s2 & 0x0F0F0F0Fu) | ((s0 >> 2) & 0x30303030u) : s0 & 0x3F3F3F3Fu;
        const uint32_t mn = h ? ((s2 >> 4) & 0x0F0F0F0Fu) | ((s1 >> 2) & 0x30303030u) : s1 & 0x3F3F3F3Fu;
        float a[4], b[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float fs = __uint_as_float(__byte_perm(sc, 0x4B000000u, 0x7440u | i)) - 8388608.0f;
            const float fm = __uint_as_float(__byte_perm(mn, 0x4B000000u, 0x7440u | i)) - 8388608.0f;
            const float d1 = d * fs, m1 = dmin * fm;
            /* D = 2^-24 * (1 or 16) * sum(q x) */
            a[i] = d1 * ((i & 1) ? 1048576.0f : 16777216.0f);
            b[i] = m1;
        }
        *(float4 *)(sab + rr * 8 + 4 * h) = make_float4(a[0], a[1], a[2], a[3]);
        *(float4 *)(sab + 128 + rr * 8 + 4 * h) = make_float4(b[0], b[1], b[2], b[3]);
    }
    __syncwarp();
    const float4 ag[2] = {*(const float4 *)(sab + g * 8), *(const float4 *)(sab + g * 8 + 4)};
    const float4 ag8[2] = {*(const float4 *)(sab + (g + 8) * 8), *(const float4 *)(sab + (g + 8) * 8 + 4)};
    /* min/offset terms: lane t covers sub-blocks 4(t&1)..+3 of vector 2 pi + t/2 */
    const float4 bg = *(const float4 *)(sab + 128 + g * 8 + 4 * (t & 1));
    const float4 bg8 = *(const float4 *)(sab + 128 + (g + 8) * 8 + 4 * (t & 1));
#pragma unroll
    for (int pi = 0; pi < NP; pi++) {
        const float *sv = sx + (2 * pi + (t >> 1)) * ngrp + G0 + 4 * (t & 1);
        const float x0 = sv[0], x1 = sv[1], x2 = sv[2], x3 = sv[3];
        float u = acc[pi][0], v = acc[pi][1];
        u = fmaf(-bg.x, x0, u), v = fmaf(-bg8.x, x0, v);
        u = fmaf(-bg.y, x1, u), v = fmaf(-bg8.y, x1, v);
        u = fmaf(-bg.z, x2, u), v = fmaf(-bg8.z, x2, v);
        u = fmaf(-bg.w, x3, u), v = fmaf(-bg8.w, x3, v);
        acc[pi][0] = u, acc[pi][1] = v;
    }
#pragma unroll
    for (int s = 0; s < 8; s++) {
        const int p = s >> 1;
        uint32_t A[2][2][2]; /* [tile j][row half][reg r] */
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint32_t u = j ? r.q[h][p].y : r.q[h][p].x;
                if (s & 1) { /* high nibbles: 16 q * 2^-24 */
                    A[j][h][0] = u & 0x00F000F0u;
                    A[j][h][1] = (u >> 8) & 0x00F000F0u;
                } else { /* low nibbles: q * 2^-24 */
                    A[j][h][0] = u & 0x000F000Fu;
                    A[j][h][1] = (u >> 8) & 0x000F000Fu;
                }
            }
#pragma unroll
        for (int pi = 0; pi < NP; pi++) {
            float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const uint2 b = ldb<NP, CP>(bs, G0 + s, j, pi, boff);
                mma16816(d, A[j][0][0], A[j][1][0], A[j][0][1], A[j][1][1], b.x, b.y);
            }
            acc[pi][0] = fmaf(f4get(ag[s >> 2], s & 3), d[0] + d[1], acc[pi][0]);
            acc[pi][1] = fmaf(f4get(ag8[s >> 2], s & 3), d[2] + d[3], acc[pi][1]);
        }
    }
    __syncwarp(); /* sab is rewritten by the next chunk */
}

/* x row of vector v: gemv: v; MoE: the v-th pair of the CTA's group from list position pos0
 * (gate_up: its token's row, down: the pair's h row). */
template <int MODE>
__device__ __forceinline__ int64_t xrow(const Params &p, const PlanView &pv, int pos0, int v) {
    if constexpr (MODE == M_GEMV) return v;
    else if constexpr (MODE == M_GATE_UP) return pv.pair(pos0 + v) / p.top_k;
    else return pv.pair(pos0 + v);
}

/* The tensor-core GEMV. Grid: x = persistent CTAs over items, y = plan group (MoE; CTAs past
 * n_groups return at once) or 1, z = which NV vectors of the group (MoE); block: 8 warps. Each warp walks its (item, chunk) steps, items blockIdx.x, +gridDim.x, ..., chunks
 * warp, warp + 8, ... of each, as one stream with DEPTH - 1 chunks loaded ahead in registers: the
 * first loads go out before the prologue, and the loads run on across item ends (an item's
 * last chunk is followed by the next item's first without a gap in the memory pipe).
 * Prologue: the CTA turns x (NV vectors: gemv's, or the group's pairs' rows) into f16
 * pieces in shared memory, with the per-32 sums and per-vector scales. Per step the warp
 * decodes its chunk of the item's 16 A rows into mma fragments and accumulates
 * a * D - b * sum(x) per lane; after an item's last step the CTA sums the warps in order and
 * threads o < outputs store y (gate_up: silu(gate) * up). */
template <int T, int NV, int XT, int MODE>
__global__ void __launch_bounds__(NW * 32, 2) k_tc(const Params p) {
    constexpr int NP = NvGeo<NV>::NP, CP = NvGeo<NV>::CP;
    using Q = TT<T>;
    extern __shared__ __align__(16) uint8_t smem[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const PlanView pv(p.plan, p.n_pairs);
    int eid = 0, pos0 = 0, nvec = p.nvec;
    if constexpr (MODE != M_GEMV) {
        const int grp = blockIdx.y;
        if (grp >= pv.n_groups()) return; /* uniform over the CTA */
        const int v0 = blockIdx.z * NV;
        nvec = pv.count(grp) - v0;
        if (nvec <= 0) return;
        nvec = nvec < NV ? nvec : NV;
        eid = pv.expert(grp), pos0 = pv.start(grp) + v0;
    }
    const int K = p.k, ngrp = K / 32;
    uint2 *bs = (uint2 *)smem;
    float *sx = (float *)(smem + Lay<NV>::b_bytes(K));
    float *sab = (float *)((uint8_t *)sx + Lay<NV>::sx_bytes(K));
    float *red = sab + Lay<NV>::SAB / sizeof(float);
    float *misc = red + Lay<NV>::RED / sizeof(float); /* [NW][NV] maxima, then 2 NP scales */
    float *inv = misc + NW * NV;

    constexpr int GPC = Q::CH / 32;                  /* groups per chunk */
    const int nch = K / Q::CH;                       /* chunks */
    const int cpw = (nch + NW - 1) / NW;             /* steps per item (chunks per warp) */
    const int64_t cbytes = (int64_t)(Q::CH / Q::BLK) * Q::BB;
    const int64_t nit = (p.items - blockIdx.x + gridDim.x - 1) / gridDim.x; /* this CTA's items */
    const int64_t nsteps = nit * cpw;

    /* A step's item: first A rows m0, rows g and g+8 at k = 0; past the last item: bad (no
     * loads, no math). */
    struct Cur {
        int64_t it, m0;
        int ci;
        bool bad;
        const uint8_t *base[2];
    };
    const int64_t eoff = (int64_t)eid * p.mat;
    auto set_item = [&](Cur &u) {
        u.bad = u.it >= p.items;
        const int64_t it = u.bad ? 0 : u.it;
        if constexpr (MODE == M_GATE_UP) {
            u.m0 = it * 8;
            const int64_t row = u.m0 + g < p.m ? u.m0 + g : p.m - 1;
            u.base[0] = p.w0 + eoff + row * p.rb;
            u.base[1] = p.w1 + eoff + row * p.rb;
        } else {
            u.m0 = it * 16;
            const int64_t r0 = u.m0 + g < p.m ? u.m0 + g : p.m - 1;
            const int64_t r1 = u.m0 + g + 8 < p.m ? u.m0 + g + 8 : p.m - 1;
            u.base[0] = p.w0 + eoff + r0 * p.rb;
            u.base[1] = p.w0 + eoff + r1 * p.rb;
        }
    };
    auto advance = [&](Cur &u) {
        if (++u.ci == cpw) {
            u.ci = 0;
            u.it += gridDim.x;
            set_item(u);
        }
    };
    auto issue = [&](Raw<T> &r, const Cur &u) {
        const int c = warp + NW * u.ci;
        if (u.bad || c >= nch) return;
        const uint8_t *rp[2] = {u.base[0] + c * cbytes, u.base[1] + c * cbytes};
        load_raw(r, rp, t);
    };
    constexpr int D = DEPTH;
    Raw<T> buf[D];
    Cur ld, cs; /* the load and the math cursors */
    ld.it = blockIdx.x, ld.ci = 0;
    set_item(ld);
    cs = ld;
#pragma unroll
    for (int i = 0; i < D - 1; i++) {
        if (i < nsteps) issue(buf[i], ld);
        advance(ld);
    }

    /* ---- prologue: scales, pieces, group sums ---- */
    {
        float mx[NV];
#pragma unroll
        for (int v = 0; v < NV; v++) mx[v] = 0.0f;
        for (int i = tid; i < K / 4; i += NW * 32)
#pragma unroll
            for (int v = 0; v < NV; v++)
                if (v < nvec) {
                    const float4 q = ldx4<XT>(p.x, xrow<MODE>(p, pv, pos0, v) * p.ldx + 4 * i);
                    mx[v] = fmaxf(mx[v], fmaxf(fmaxf(fabsf(q.x), fabsf(q.y)), fmaxf(fabsf(q.z), fabsf(q.w))));
                }
#pragma unroll
        for (int v = 0; v < NV; v++) {
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) mx[v] = fmaxf(mx[v], __shfl_xor_sync(0xffffffffu, mx[v], off));
            if (lane == 0) misc[warp * NV + v] = mx[v];
        }
        __syncthreads();
        float scale[NV];
#pragma unroll
        for (int v = 0; v < NV; v++) {
            float a = 0.0f;
            for (int w = 0; w < NW; w++) a = fmaxf(a, misc[w * NV + v]);
            int ex = 0;
            if (a > 0.0f) frexpf(a, &ex); /* a < 2^ex: x * 2^(14 - ex) < 2^14, no f16 overflow */
            int e = 14 - ex;
            e = e < -126 ? -126 : e > 126 ? 126 : e;
            scale[v] = v < nvec ? ldexpf(1.0f, e) : 0.0f;
            if (tid == 0) inv[v] = ldexpf(1.0f, -e);
        }
        if (tid < 2 * NP && tid >= NV) inv[tid] = 0.0f;
        /* Word i of vector v: elements 4i..4i+3 = group G = i / 8, lane-quad t = i % 8 / 2, tile j. */
        const int words = K / 4;
        for (int idx = tid; idx < NV * words; idx += NW * 32) {
            const int v = idx / words, i = idx - v * words;
            const int G = i >> 3, tq = (i & 7) >> 1, j = i & 1;
            float4 q = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            float sc = 0.0f;
#pragma unroll
            for (int vv = 0; vv < NV; vv++)
                if (vv == v) sc = scale[vv];
            if (v < nvec) q = ldx4<XT>(p.x, xrow<MODE>(p, pv, pos0, v) * p.ldx + 4 * i);
            q.x *= sc, q.y *= sc, q.z *= sc, q.w *= sc;
            uint32_t h0, m0, l0, h1, m1, l1, h2, m2, l2, h3, m3, l3;
            split3(q.x, h0, m0, l0);
            split3(q.y, h1, m1, l1);
            split3(q.z, h2, m2, l2);
            split3(q.w, h3, m3, l3);
            const int pi = v >> 1, gp0 = 3 * (v & 1);
            uint2 *dst = bs + (((G * 2 + j) * NP + pi) * CP + gp0) * 4 + tq;
            /* r0 = elements (+0, +2), r1 = (+1, +3) */
            dst[0] = make_uint2(h0 | (h2 << 16), h1 | (h3 << 16));
            dst[4] = make_uint2(m0 | (m2 << 16), m1 | (m3 << 16));
            dst[8] = make_uint2(l0 | (l2 << 16), l1 | (l3 << 16));
            /* group sum of the scaled x: the 8 words of a group are 8 consecutive lanes */
            float s = (q.x + q.y) + (q.z + q.w);
            s += __shfl_xor_sync(0xffffffffu, s, 1);
            s += __shfl_xor_sync(0xffffffffu, s, 2);
            s += __shfl_xor_sync(0xffffffffu, s, 4);
            if ((i & 7) == 0) sx[v * ngrp + G] = s;
        }
        for (int idx = tid; idx < (2 * NP - NV) * ngrp; idx += NW * 32) sx[NV * ngrp + idx] = 0.0f;
        __syncthreads();
    }

    /* this lane's B column: vector 2 pi + g / 4, piece g % 4 (piece 3: zero column) */
    const int gq = g & 3, gv = g >> 2;
    const int boff = (gq == 3 || (NV == 1 && gv == 1)) ? -1 : (3 * gv + gq) * 4 + t;
    float *wsab = sab + warp * 256;

    float acc[NP][2];
#pragma unroll
    for (int pi = 0; pi < NP; pi++) acc[pi][0] = acc[pi][1] = 0.0f;
    /* After an item's last step: sum the warps, store, clear acc. */
    auto finish = [&](const Cur &u) {
        /* lanes t, t^1 hold the pieces of one vector */
#pragma unroll
        for (int pi = 0; pi < NP; pi++) {
            acc[pi][0] += __shfl_xor_sync(0xffffffffu, acc[pi][0], 1);
            acc[pi][1] += __shfl_xor_sync(0xffffffffu, acc[pi][1], 1);
            red[((warp * NP + pi) * 32 + lane) * 2 + 0] = acc[pi][0];
            red[((warp * NP + pi) * 32 + lane) * 2 + 1] = acc[pi][1];
            acc[pi][0] = acc[pi][1] = 0.0f;
        }
        __syncthreads();
        if constexpr (MODE == M_GATE_UP) {
            /* gate row r in A row r (comp 0), up row r in A row r + 8 (comp 1) */
            if (tid < 8 * NV) {
                const int r = tid & 7, v = tid >> 3;
                const int src = r * 4 + 2 * (v & 1);
                float gs = 0.0f, us = 0.0f;
                for (int w = 0; w < NW; w++) {
                    gs += red[((w * NP + (v >> 1)) * 32 + src) * 2 + 0];
                    us += red[((w * NP + (v >> 1)) * 32 + src) * 2 + 1];
                }
                float iv = 0.0f;
#pragma unroll
                for (int vv = 0; vv < NV; vv++)
                    if (vv == v) iv = inv[vv];
                gs *= iv, us *= iv;
                if (u.m0 + r < p.m && v < nvec)
                    p.y[(int64_t)pv.pair(pos0 + v) * p.ldy + u.m0 + r] = gs / (1.0f + expf(-gs)) * us;
            }
        } else {
            if (tid < 16 * NV) {
                const int r = tid & 15, v = tid >> 4;
                const int src = ((r & 7) * 4 + 2 * (v & 1)), comp = r >> 3;
                float sum = 0.0f;
                for (int w = 0; w < NW; w++) sum += red[((w * NP + (v >> 1)) * 32 + src) * 2 + comp];
                float val = 0.0f;
#pragma unroll
                for (int vv = 0; vv < NV; vv++)
                    if (vv == v) val = sum * inv[vv];
                const int64_t yrow = MODE == M_DOWN ? (int64_t)pv.pair(pos0 + v) : v;
                if (u.m0 + r < p.m && v < nvec) p.y[yrow * p.ldy + u.m0 + r] = val;
            }
        }
        __syncthreads(); /* red is reused by the next item */
    };
    /* Step s uses buf[s % D]; before its math, step s + D - 1 is loaded into the buffer that
     * step s - 1 used. The conditions are the same in every warp of the CTA (syncthreads). */
    for (int64_t s0 = 0; s0 < nsteps; s0 += D) {
#pragma unroll
        for (int i = 0; i < D; i++) {
            if (s0 + i < nsteps) {
                if (s0 + i + D - 1 < nsteps) issue(buf[(i + D - 1) % D], ld);
                advance(ld);
                const int c = warp + NW * cs.ci;
                if (!cs.bad && c < nch) chunk_math<NV>(buf[i], bs, sx, ngrp, wsab, c * GPC, lane, boff, acc);
                if (cs.ci == cpw - 1) finish(cs);
                advance(cs);
            }
        }
    }
}

/* ---- host side ---- */

template <int T, int NV, int XT, int MODE>
static g5_status launch(const Params &p, int ny, int nz, int64_t busy_y, cudaStream_t st, g5_error *err) {
    const size_t bytes = Lay<NV>::total(p.k);
    auto kern = k_tc<T, NV, XT, MODE>;
    /* Dynamic shared memory above 48 KB needs an opt-in, once per kernel (this instantiation). */
    static size_t allowed_dev[CUK_MAX_DEVICES]; /* per device, as attributes are (0: none yet) */
    size_t &allowed = allowed_dev[cuk_device_slot()];
    if (bytes > (allowed ? allowed : 48 * 1024)) {
        const size_t cap = cuk_device_smem_cap(SMEM_MAX);
        CUK_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)cap));
        allowed = cap;
    }
    static int sms = 0;
    if (sms <= 0) sms = cuk_sm_count() > 0 ? cuk_sm_count() : 132;
    /* two CTAs per SM over the grid.y entries expected to have work (MoE: most groups of a
     * large batch are empty, their CTAs return at once) */
    int64_t per_y = (2LL * sms + busy_y - 1) / busy_y;
    if (per_y < 1) per_y = 1;
    const int64_t gx = p.items < per_y ? p.items : per_y;
    kern<<<dim3((unsigned)gx, (unsigned)ny, (unsigned)nz), NW * 32, bytes, st>>>(p);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}

/* 1 if the tensor-core path takes this shape: k a multiple of the chunk, NV <= 4 and the x
 * pieces fit in shared memory. */
template <int T> bool applies(int64_t k, int n) {
    if (k % TT<T>::CH || k % 256) return false;
    const int nv = n <= 1 ? 1 : n <= 2 ? 2 : n <= 4 ? 4 : 0;
    if (!nv || k > (1 << 20)) return false;
    const size_t bytes = nv == 1 ? Lay<1>::total((int)k) : nv == 2 ? Lay<2>::total((int)k) : Lay<4>::total((int)k);
    return bytes <= cuk_device_smem_cap(SMEM_MAX);
}

template <int T, int MODE>
static g5_status run_nv(const Params &p, int nv, int ny, int64_t busy_y, bool bf, cudaStream_t st, g5_error *err) {
    const int nz = MODE == M_GEMV ? 1 : CUK_MOE_GROUP / nv;
    switch (nv) {
    case 1: return bf ? launch<T, 1, 1, MODE>(p, ny, nz, busy_y, st, err) : launch<T, 1, 0, MODE>(p, ny, nz, busy_y, st, err);
    case 2: return bf ? launch<T, 2, 1, MODE>(p, ny, nz, busy_y, st, err) : launch<T, 2, 0, MODE>(p, ny, nz, busy_y, st, err);
    default: return bf ? launch<T, 4, 1, MODE>(p, ny, nz, busy_y, st, err) : launch<T, 4, 0, MODE>(p, ny, nz, busy_y, st, err);
    }
}

/* The entry points cuda/gemv.cu calls after validation; *done = 0 when the shape is not
 * handled here (the caller then uses the CUDA-core kernels). */
/* Vectors per launch for k: 4, 2 or 1 as the x pieces fit in shared memory, 0: no TC path. */
template <int T> int max_nv(int64_t k) {
    return applies<T>(k, 4) ? 4 : applies<T>(k, 2) ? 2 : applies<T>(k, 1) ? 1 : 0;
}

/* n > max_nv runs as several launches over groups of vectors (each re-reads W). A vector's
 * arithmetic does not depend on its group (same lane, same order, mma columns independent), so
 * y[v] is bit-identical whatever n is: batched decode steps reproduce one-vector launches. */
template <int T>
g5_status gemv_run(const cuk_gemv_args *a, int *done, cudaStream_t st, g5_error *err) {
    *done = 0;
    const int nvm = max_nv<T>(a->k);
    if (!nvm) return G5_OK;
    Params p = {};
    p.w0 = (const uint8_t *)a->w;
    p.rb = a->k / TT<T>::BLK * TT<T>::BB;
    p.m = a->m;
    p.ldx = a->ldx;
    p.k = (int)a->k;
    p.ldy = a->ldy;
    p.items = (a->m + 15) / 16;
    *done = 1;
    const bool bf = a->x_type == CUK_ACT_BF16;
    for (int v0 = 0; v0 < a->n; v0 += nvm) {
        const int nn = a->n - v0 < nvm ? a->n - v0 : nvm;
        p.x = (const uint8_t *)a->x + (size_t)v0 * a->ldx * (bf ? 2 : 4);
        p.y = a->y + (int64_t)v0 * a->ldy;
        p.nvec = nn;
        const g5_status s = run_nv<T, M_GEMV>(p, nn == 1 ? 1 : nn == 2 ? 2 : 4, 1, 1, bf, st, err);
        if (s != G5_OK) return s;
    }
    return G5_OK;
}

/* Vectors per CTA of the MoE modes: a plan group's pairs (at most min(n_tok, 4)), as many as
 * fit; the z grid covers the rest of a group of 4. grid.y: the plan's group capacity. */
template <int T> static int moe_nv_tc(int64_t k, int n_tok) {
    const int want = n_tok <= 1 ? 1 : n_tok <= 2 ? 2 : 4;
    const int fit = max_nv<T>(k);
    return want < fit ? want : fit;
}

template <int T>
g5_status gate_up_run(const cuk_moe_gate_up_args *a, int *done, cudaStream_t st, g5_error *err) {
    *done = 0;
    if (!applies<T>(a->k, 1)) return G5_OK;
    Params p = {};
    p.w0 = (const uint8_t *)a->w_gate, p.w1 = (const uint8_t *)a->w_up;
    p.rb = a->k / TT<T>::BLK * TT<T>::BB;
    p.m = a->m, p.mat = p.rb * a->m;
    p.n_pairs = a->n_tok * a->top_k, p.plan = a->plan, p.top_k = a->top_k;
    p.x = a->x, p.ldx = a->ldx;
    p.k = (int)a->k;
    p.y = a->out, p.ldy = a->ldo;
    p.items = (a->m + 7) / 8;
    *done = 1;
    const int64_t busy = p.n_pairs < a->n_expert ? p.n_pairs : a->n_expert;
    return run_nv<T, M_GATE_UP>(p, moe_nv_tc<T>(a->k, a->n_tok), p.n_pairs, busy, a->x_type == CUK_ACT_BF16, st, err);
}

template <int T>
g5_status down_run(const cuk_moe_down_args *a, int *done, cudaStream_t st, g5_error *err) {
    *done = 0;
    if (!applies<T>(a->k, 1)) return G5_OK;
    Params p = {};
    p.w0 = (const uint8_t *)a->w;
    p.rb = a->k / TT<T>::BLK * TT<T>::BB;
    p.m = a->m, p.mat = p.rb * a->m;
    p.n_pairs = a->n_tok * a->top_k, p.plan = a->plan, p.top_k = a->top_k;
    p.x = a->h, p.ldx = a->ldh;
    p.k = (int)a->k;
    p.y = a->part, p.ldy = a->ldp;
    p.items = (a->m + 15) / 16;
    *done = 1;
    const int64_t busy = p.n_pairs < a->n_expert ? p.n_pairs : a->n_expert;
    const g5_status s = run_nv<T, M_DOWN>(p, moe_nv_tc<T>(a->k, a->n_tok), p.n_pairs, busy, a->h_type == CUK_ACT_BF16, st, err);
    return s != G5_OK ? s : moe_combine(a, st, err);
}

} // namespace tc
} // namespace cuk

#define CUK_GEMV_TC_INSTANTIATE(T)                                                              \
    namespace cuk {                                                                             \
    namespace tc {                                                                              \
    template g5_status gemv_run<T>(const cuk_gemv_args *, int *, cudaStream_t, g5_error *);    \
    template g5_status gate_up_run<T>(const cuk_moe_gate_up_args *, int *, cudaStream_t,       \
                                      g5_error *);                                              \
    template g5_status down_run<T>(const cuk_moe_down_args *, int *, cudaStream_t, g5_error *); \
    }                                                                                           \
    }

/* In cuda/gemv.cu, which sees the templates but must not instantiate them again. */
#define CUK_GEMV_TC_EXTERN(T)                                                                   \
    namespace cuk {                                                                             \
    namespace tc {                                                                              \
    extern template g5_status gemv_run<T>(const cuk_gemv_args *, int *, cudaStream_t,          \
                                          g5_error *);                                          \
    extern template g5_status gate_up_run<T>(const cuk_moe_gate_up_args *, int *, cudaStream_t, \
                                             g5_error *);                                       \
    extern template g5_status down_run<T>(const cuk_moe_down_args *, int *, cudaStream_t,      \
                                          g5_error *);                                          \
    }                                                                                           \
    }

#endif
