/* int8-activation GEMV and MoE expert kernels (API and numerics: cuda/cuk_q8.h).
 *
 * Layout of the work: a "unit" is 64 consecutive elements of a weight row's k (or, for Q6_K, 4
 * runs of 16 that share one block half), so every type has k / 64 units per row and a unit's
 * bytes are whole words of one block: Q4_K/Q5_K a 32-byte quant pair plus the block header (and
 * Q5_K's 32 high-bit bytes), Q6_K 3 runs of 16 bytes (ql low, ql high, qh) at an even offset
 * realigned by funnel shifts, Q8_0 two whole blocks (68 bytes from a 4-byte boundary). The
 * matching x bytes are 16-byte loads of the int8 rows.
 * - Grid (plain GEMV): one warp per R = 2 rows; 8 warps per CTA. Lane l takes units l, l + 32,
 *   ... of both rows (loads of the two rows issued together), all NV vectors reuse each decoded
 *   weight word. A butterfly sum over the warp gives every row's total; lane r * NV + v stores
 *   row r of vector v. The unit order and the shuffle order depend on k only: lane l's sum is
 *   units l, l + 32, .. in order (plane 0 then plane 1 of each), the warp's the pairwise tree
 *   over the lanes (warp_sum_asc), with every rounding explicit (q8_load.cuh), which
 *   gemv_q8t.cu reproduces bit for bit.
 * - MoE: grid.y = plan group (cuda/cuk.h), its pairs the vectors; gate_up warps take 2 gate rows
 *   and the same 2 up rows of the group's expert and store silu(g) * u, down warps 2 rows into
 *   the pairs' part rows, summed over slots by moe_combine.
 * The kernels are templates in gemv_q8_kern.cuh; this file holds the K-quants' and Q8_0's units,
 * the quantizer and the host API, gemv_q8_lb*.cu the low-bit types' units (q8_lowbit.cuh). */
#include "cuda/gemv_q8_kern.cuh"
#include "cuda/q8_quant.cuh"

namespace cuk {
namespace q8 {

/* ---- per type: the raw bytes of one unit, and its dot product with one x row ---- */

/* 16 bytes from an even address: 5 aligned words shifted into 4. */
__device__ __forceinline__ void ld16_a2(const uint8_t *p, uint32_t (&o)[4]) {
    const uint32_t *a = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
    const uint32_t sh = ((uint32_t)(uintptr_t)p & 3u) * 8u;
    uint32_t w[5];
#pragma unroll
    for (int i = 0; i < 5; i++) w[i] = ldg32(a + i);
#pragma unroll
    for (int i = 0; i < 4; i++) o[i] = __funnelshift_r(w[i], w[i + 1], sh);
}

template <> struct Raw<QT_Q4_K> {
    uint4 hdr, qa, qb;
    __device__ void load(const uint8_t *row, int u) {
        const uint8_t *bp = row + (int64_t)(u >> 2) * 144;
        hdr = ldg128(bp);
        qa = ldg128(bp + 16 + 32 * (u & 3));
        qb = ldg128(bp + 32 + 32 * (u & 3));
    }
};
template <> struct Raw<QT_Q5_K> {
    uint4 hdr, ha, hb, qa, qb;
    __device__ void load(const uint8_t *row, int u) {
        const uint8_t *bp = row + (int64_t)(u >> 2) * 176;
        hdr = ldg128(bp);
        ha = ldg128(bp + 16);
        hb = ldg128(bp + 32);
        qa = ldg128(bp + 48 + 32 * (u & 3));
        qb = ldg128(bp + 64 + 32 * (u & 3));
    }
};
template <> struct Raw<QT_Q6_K> {
    uint32_t la[4], lb[4], hq[4], sc[2], d;
    __device__ void load(const uint8_t *row, int u) {
        const int h = (u >> 1) & 1, i = u & 1;
        const uint8_t *bp = row + (int64_t)(u >> 2) * 210;
        ld16_a2(bp + 64 * h + 16 * i, la);
        ld16_a2(bp + 64 * h + 32 + 16 * i, lb);
        ld16_a2(bp + 128 + 32 * h + 16 * i, hq);
        const uint8_t *sp = bp + 192 + 8 * h;
        const uint32_t *a = (const uint32_t *)((uintptr_t)sp & ~(uintptr_t)3);
        const uint32_t sh = ((uint32_t)(uintptr_t)sp & 3u) * 8u;
        const uint32_t w0 = ldg32(a), w1 = ldg32(a + 1), w2 = ldg32(a + 2);
        sc[0] = __funnelshift_r(w0, w1, sh);
        sc[1] = __funnelshift_r(w1, w2, sh);
        const uint32_t *dp = (const uint32_t *)((uintptr_t)(bp + 208) & ~(uintptr_t)3);
        d = ldg32(dp) >> (((uint32_t)(uintptr_t)(bp + 208) & 3u) * 8u);
    }
};
template <> struct Raw<QT_Q8_0> {
    uint32_t w[17];
    __device__ void load(const uint8_t *row, int u) {
        const uint32_t *p = (const uint32_t *)(row + (int64_t)u * 68);
#pragma unroll
        for (int i = 0; i < 17; i++) w[i] = ldg32(p + i);
    }
};

/* Q6_K: quarter j's 16 elements of unit u (elements 256b + 128h + 32j + 16i ..) and the d of
 * blocks 8b + 4h + j. */
struct X6 {
    uint4 q[4];
    float4 da, db; /* d, s of blocks +0, +1 | +2, +3 */
    __device__ void load(const Xrow &x, int u) {
        const int64_t b = u >> 2, h = (u >> 1) & 1, i = u & 1;
        const int8_t *p = x.q + b * 256 + h * 128 + 16 * i;
#pragma unroll
        for (int j = 0; j < 4; j++) q[j] = ldg128(p + 32 * j);
        const float *dp = x.ds + (b * 8 + h * 4) * 2;
        da = ldg_f4(dp);
        db = ldg_f4(dp + 4);
    }
};

template <> struct XOf<QT_Q6_K> { using type = X6; };

__device__ __forceinline__ float dot(const Raw<QT_Q4_K> &w, const X64 &x, int u) {
    const int p = u & 3;
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const uint32_t q = u4get(i < 4 ? w.qa : w.qb, i & 3);
        s0 = dp4(q & 0x0F0F0F0Fu, x.word(i), s0);
        s1 = dp4((q >> 4) & 0x0F0F0F0Fu, x.word(8 + i), s1);
    }
    float d0, m0, d1, m1;
    k4_scale(w.hdr, 2 * p, d0, m0);
    k4_scale(w.hdr, 2 * p + 1, d1, m1);
    return unit_k4(d0, m0, d1, m1, x.ds.x, x.ds.y, x.ds.z, x.ds.w, (float)s0, (float)s1);
}

__device__ __forceinline__ float dot(const Raw<QT_Q5_K> &w, const X64 &x, int u) {
    const int p = u & 3;
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const uint32_t q = u4get(i < 4 ? w.qa : w.qb, i & 3);
        const uint32_t qh = u4get(i < 4 ? w.ha : w.hb, i & 3);
        const uint32_t lo = (q & 0x0F0F0F0Fu) | (((qh >> (2 * p)) & 0x01010101u) << 4);
        const uint32_t hi = ((q >> 4) & 0x0F0F0F0Fu) | (((qh >> (2 * p + 1)) & 0x01010101u) << 4);
        s0 = dp4(lo, x.word(i), s0);
        s1 = dp4(hi, x.word(8 + i), s1);
    }
    float d0, m0, d1, m1;
    k4_scale(w.hdr, 2 * p, d0, m0);
    k4_scale(w.hdr, 2 * p + 1, d1, m1);
    return unit_k4(d0, m0, d1, m1, x.ds.x, x.ds.y, x.ds.z, x.ds.w, (float)s0, (float)s1);
}

__device__ __forceinline__ float dot(const Raw<QT_Q6_K> &w, const X6 &x, int u) {
    const int i = u & 1;
    int s[4] = {0, 0, 0, 0}, c[4] = {0, 0, 0, 0};
#pragma unroll
    for (int t = 0; t < 4; t++) {
        const uint32_t a = w.la[t], b = w.lb[t], h = w.hq[t];
        const uint32_t q[4] = {(a & 0x0F0F0F0Fu) | ((h << 4) & 0x30303030u),
                               (b & 0x0F0F0F0Fu) | ((h << 2) & 0x30303030u),
                               ((a >> 4) & 0x0F0F0F0Fu) | (h & 0x30303030u),
                               ((b >> 4) & 0x0F0F0F0Fu) | ((h >> 2) & 0x30303030u)};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint32_t xw = u4get(x.q[j], t);
            s[j] = dp4(q[j], xw, s[j]);
            c[j] = dp4(0x01010101u, xw, c[j]);
        }
    }
    const float d = h2f(w.d);
    const float dx[4] = {x.da.x, x.da.z, x.db.x, x.db.z};
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        /* scale byte i + 2j of the half's 8 */
        const int sb = i + 2 * j;
        const int sc = (int)(int8_t)((w.sc[sb >> 2] >> (8 * (sb & 3))) & 0xFFu);
        acc = q6_add(acc, __fmul_rn(d, (float)sc), dx[j], (float)(s[j] - 32 * c[j]));
    }
    return acc;
}

__device__ __forceinline__ float dot(const Raw<QT_Q8_0> &w, const X64 &x, int) {
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        s0 = dp4(__funnelshift_r(w.w[i], w.w[i + 1], 16), x.word(i), s0);
        s1 = dp4(w.w[9 + i], x.word(8 + i), s1);
    }
    return unit_q8_0(h2f(w.w[0]), h2f(w.w[8] >> 16), x.ds.x, x.ds.z, (float)s0, (float)s1);
}

/* Quantizer. Grid: (ceil(k / 32 / 8), n); block: 8 warps, warp = one 32-element block, lane =
 * one element (q8_quant.cuh: a NaN or infinity in the block makes d NaN, the products then carry
 * it; P = 2: the residual as a second plane). */
template <int P>
__global__ void __launch_bounds__(256)
    k_quantize(const float *__restrict__ x, int64_t ldx, int64_t k, int8_t *__restrict__ q, int64_t ldq,
               float *__restrict__ ds, int64_t ldds) {
    const int lane = threadIdx.x & 31;
    const int64_t b = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5), row = blockIdx.y;
    if (b * 32 >= k) return;
    const float v[1] = {x[row * ldx + b * 32 + lane]};
    q8q::quant_block<1, P>(v, lane, q + row * ldq + b * 32, k, ds + row * ldds, b);
}

} // namespace q8
} // namespace cuk

using namespace cuk;

#define BAD(...) g5_fail(err, G5_ERR_INVALID_ARG, __VA_ARGS__)

extern "C" int cuk_q8_takes(uint32_t t, int64_t k) {
    if (k <= 0 || k > (1LL << 24)) return 0;
    switch (t) {
    case QT_Q4_K: case QT_Q5_K: case QT_Q6_K: return k % 256 == 0;
    case QT_Q8_0: case QT_MXFP4: case QT_NVFP4: case QT_IQ4_NL: case QT_Q4_0: case QT_Q4_1: case QT_Q5_0:
    case QT_Q5_1:
        return k % 64 == 0;
    case QT_Q2_K: case QT_Q3_K: case QT_IQ1_S: case QT_IQ1_M: case QT_IQ2_XXS: case QT_IQ2_XS: case QT_IQ2_S:
    case QT_IQ3_XXS: case QT_IQ3_S: case QT_IQ4_XS: case QT_TQ1_0: case QT_TQ2_0: return k % 256 == 0;
    default: return 0;
    }
}

static int64_t row_bytes(uint32_t t, int64_t k) {
    uint64_t rb = 0;
    return quant_row_bytes(t, (uint64_t)k, &rb) == G5_OK ? (int64_t)rb : -1;
}

g5_status cuk::q8_check_act(const char *what, const char *name, const cuk_q8_act *x, int64_t k, g5_error *err) {
    if (!x->q || !x->ds) return BAD("%s: %s.q or %s.ds is NULL", what, name, name);
    if ((uintptr_t)x->q % 16 || (uintptr_t)x->ds % 16) return BAD("%s: %s is not 16-byte aligned", what, name);
    if (x->planes != 1 && x->planes != 2) return BAD("%s: %s.planes=%d is neither 1 nor 2", what, name, (int)x->planes);
    if (x->planes == 2 && k % 64) return BAD("%s: two planes need k=%lld to be a multiple of 64", what, (long long)k);
    const int64_t P = x->planes;
    if (x->ldq < P * k || x->ldq % 16)
        return BAD("%s: %s.ldq=%lld must be >= %lld and a multiple of 16", what, name, (long long)x->ldq,
                   (long long)(P * k));
    if (x->ldds < P * (k / 16) || x->ldds % 4)
        return BAD("%s: %s.ldds=%lld must be >= %lld and a multiple of 4", what, name, (long long)x->ldds,
                   (long long)(P * (k / 16)));
    return G5_OK;
}

/* Weights: type, alignment, k, m and the total byte size of n_mat matrices. */
static g5_status check_w(const char *what, uint32_t t, const void *w, int64_t k, int64_t m, int64_t n_mat,
                         int64_t *rb, g5_error *err) {
    if (!cuk_q8_takes(t, k))
        return BAD("%s: type %s with k=%lld has no int8 kernel", what, quant_type_name(t), (long long)k);
    if (!w || (uintptr_t)w % 16) return BAD("%s: weights NULL or not 16-byte aligned", what);
    if (m <= 0 || m > (1LL << 31)) return BAD("%s: m=%lld outside 1..2^31", what, (long long)m);
    *rb = row_bytes(t, k);
    uint64_t tot = 0;
    if (*rb <= 0 || g5_mul_u64((uint64_t)*rb, (uint64_t)m, &tot) || g5_mul_u64(tot, (uint64_t)n_mat, &tot) ||
        tot > (uint64_t)INT64_MAX)
        return BAD("%s: m=%lld rows of k=%lld overflow", what, (long long)m, (long long)k);
    return G5_OK;
}

extern "C" g5_status cuk_q8_quantize(const cuk_q8_quantize_args *a, cuk_stream stream, g5_error *err) {
    if (!a) return BAD("q8_quantize: args is NULL");
    if (!a->x || !a->q || !a->ds) return BAD("q8_quantize: x, q or ds is NULL");
    if (a->k <= 0 || a->k % 32 || a->k > (1LL << 24)) return BAD("q8_quantize: k=%lld is not a positive multiple of 32", (long long)a->k);
    if (a->n < 1 || a->n > 65535) return BAD("q8_quantize: n=%lld outside 1..65535", (long long)a->n);
    if (a->ldx < a->k) return BAD("q8_quantize: ldx=%lld < k=%lld", (long long)a->ldx, (long long)a->k);
    const cuk_q8_act o = {a->q, a->ldq, a->ds, a->ldds, a->planes};
    g5_status st = q8_check_act("q8_quantize", "out", &o, a->k, err);
    if (st != G5_OK) return st;
    const dim3 grid((unsigned)((a->k / 32 + 7) / 8), (unsigned)a->n);
    if (a->planes == 2)
        q8::k_quantize<2><<<grid, 256, 0, (cudaStream_t)stream>>>(a->x, a->ldx, a->k, a->q, a->ldq, a->ds, a->ldds);
    else
        q8::k_quantize<1><<<grid, 256, 0, (cudaStream_t)stream>>>(a->x, a->ldx, a->k, a->q, a->ldq, a->ds, a->ldds);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}

template <template <int, int, int, int> class L, int MAXNV, class A>
static void run_type(int kind, uint32_t t, const A *a, int nv, int64_t rb, int64_t k, int planes, cudaStream_t st) {
    const int units = (int)(k / 64);
    switch (t) {
    case QT_Q4_K: run_nv<L, MAXNV, QT_Q4_K>(a, nv, rb, units, planes, st); break;
    case QT_Q5_K: run_nv<L, MAXNV, QT_Q5_K>(a, nv, rb, units, planes, st); break;
    case QT_Q6_K: run_nv<L, MAXNV, QT_Q6_K>(a, nv, rb, units, planes, st); break;
    case QT_Q8_0: run_nv<L, MAXNV, QT_Q8_0>(a, nv, rb, units, planes, st); break;
    default: /* cuk_q8_takes admitted t: one of the low-bit files holds it */
        if (!q8_lb_run_a(kind, t, a, nv, rb, k, planes, st) && !q8_lb_run_b(kind, t, a, nv, rb, k, planes, st))
            q8_lb_run_c(kind, t, a, nv, rb, k, planes, st);
        break;
    }
}

/* cuk_gemv_q8, _xs and _xf: the argument checks, what names the call; x_f32: x comes as float32
 * rows (cuk_gemv_q8_xf), so only its plane count is checked here. */
static g5_status gemv_q8_check(const char *what, const cuk_gemv_q8_args *a, int64_t *rb, g5_error *err,
                               bool x_f32 = false) {
    if (!a) return BAD("%s: args is NULL", what);
    g5_status st = check_w(what, a->w_type, a->w, a->k, a->m, 1, rb, err);
    if (st != G5_OK) return st;
    if (a->n < 1 || a->n > CUK_Q8_MAX_N) return BAD("%s: n=%d outside 1..%d", what, (int)a->n, CUK_Q8_MAX_N);
    if (x_f32) {
        if (a->x.planes != 1 && a->x.planes != 2) return BAD("%s: x.planes=%d is neither 1 nor 2", what, (int)a->x.planes);
    } else if ((st = q8_check_act(what, "x", &a->x, a->k, err)) != G5_OK) {
        return st;
    }
    if (!a->y) return BAD("%s: y is NULL", what);
    if (a->ldy < a->m) return BAD("%s: ldy=%lld < m=%lld", what, (long long)a->ldy, (long long)a->m);
    if (a->w2 && ((uintptr_t)a->w2 % 16 || !a->y2)) return BAD("%s: w2 not 16-byte aligned, or y2 NULL", what);
    if (a->w2 && 2 * a->m > (1LL << 31)) return BAD("%s: 2 x m=%lld rows outside 1..2^31", what, (long long)a->m);
    if (a->w2) { /* both outputs are __restrict__: their spans [n][ldy] (m used) must not meet */
        const int64_t span = (int64_t)(a->n - 1) * a->ldy + a->m;
        if (a->y2 < a->y + span && a->y < a->y2 + span) return BAD("%s: y2 overlaps y", what);
    }
    return G5_OK;
}

extern "C" g5_status cuk_gemv_q8(const cuk_gemv_q8_args *a, cuk_stream stream, g5_error *err) {
    int64_t rb = 0;
    const g5_status st = gemv_q8_check("gemv_q8", a, &rb, err);
    if (st != G5_OK) return st;
    static_assert(CUK_Q8_MAX_N == 8, "cuk_gemv_q8: widths 1, 2, 4, 8");
    run_type<GemvL, 8>(Q8_GEMV, a->w_type, a, a->n, rb, a->k, a->x.planes, (cudaStream_t)stream);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}

/* The types whose int8 unit is 64 contiguous elements, the ones with a staged form (x in shared
 * memory in the XS layout: cuk_gemv_q8_xs, cuk_gemv_q8_xf, cuk_moe_down_q8 with hf). */
static bool staged_type(uint32_t t) { return t == QT_Q4_K || t == QT_Q5_K || t == QT_Q8_0; }

/* The launch L of a staged form for type t (staged_type). */
template <template <int, int, int, int> class L, int MAXNV, class A>
static void run_staged(uint32_t t, const A *a, int nv, int64_t rb, int units, int planes, cudaStream_t st) {
    switch (t) {
    case QT_Q4_K: run_nv<L, MAXNV, QT_Q4_K>(a, nv, rb, units, planes, st); break;
    case QT_Q5_K: run_nv<L, MAXNV, QT_Q5_K>(a, nv, rb, units, planes, st); break;
    default: run_nv<L, MAXNV, QT_Q8_0>(a, nv, rb, units, planes, st); break;
    }
}

/* The staged rows of cuk_gemv_q8_xf and of cuk_moe_down_q8's hf at most, so that with the kernels'
 * static shared memory (the norm's partials, stage_rows' sink) they stay under the 48 KB a block
 * gets without opting in. */
constexpr int64_t STAGE_SMEM_MAX = 46 * 1024;

extern "C" g5_status cuk_gemv_q8_xs(const cuk_gemv_q8_args *a, cuk_stream stream, g5_error *err) {
    int64_t rb = 0;
    const g5_status st = gemv_q8_check("gemv_q8_xs", a, &rb, err);
    if (st != G5_OK) return st;
    if (!staged_type(a->w_type))
        return g5_fail(err, G5_ERR_UNSUPPORTED, "gemv_q8_xs: type %s has no staged form (Q4_K, Q5_K, Q8_0)",
                       quant_type_name(a->w_type));
    const size_t smem = (size_t)a->n * (size_t)a->x.planes * (size_t)(a->k / 64) * q8::XS_UNIT;
    if (cuk_device_smem_cap(smem) < smem)
        return g5_fail(err, G5_ERR_UNSUPPORTED, "gemv_q8_xs: %d vectors of k=%lld need %zu bytes of shared memory a block, the device gives %zu",
                       (int)a->n, (long long)a->k, smem, cuk_device_smem_cap(smem));
    run_staged<GemvXL, 8>(a->w_type, a, a->n, rb, (int)(a->k / 64), a->x.planes, (cudaStream_t)stream);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}

extern "C" int cuk_gemv_q8_xf_takes(uint32_t t, int64_t k, int32_t n, int32_t planes) {
    if (!staged_type(t) || !cuk_q8_takes(t, k) || n < 1 || n > CUK_Q8_MAX_N) return 0;
    if (planes != 1 && planes != 2) return 0;
    return (int64_t)n * planes * (k / 64) * q8::XS_UNIT <= STAGE_SMEM_MAX;
}

extern "C" g5_status cuk_gemv_q8_xf(const cuk_gemv_q8_args *a, const cuk_q8_xf *xf, cuk_stream stream,
                                    g5_error *err) {
    int64_t rb = 0;
    const g5_status st = gemv_q8_check("gemv_q8_xf", a, &rb, err, true);
    if (st != G5_OK) return st;
    if (!xf || !xf->x || (uintptr_t)xf->x % 16 || xf->ldx < a->k || xf->ldx % 4)
        return BAD("gemv_q8_xf: x NULL or not 16-byte aligned, or ldx=%lld < k=%lld or not a multiple of 4",
                   xf ? (long long)xf->ldx : 0LL, (long long)a->k);
    if (xf->nw && ((uintptr_t)xf->nw % 16 || !(xf->eps >= 0.0f)))
        return BAD("gemv_q8_xf: nw not 16-byte aligned, or eps=%g not >= 0", (double)xf->eps);
    if (!cuk_gemv_q8_xf_takes(a->w_type, a->k, a->n, a->x.planes))
        return g5_fail(err, G5_ERR_UNSUPPORTED, "gemv_q8_xf: %s weights of k=%lld, %d vectors of %d planes",
                       quant_type_name(a->w_type), (long long)a->k, (int)a->n, (int)a->x.planes);
    const XfArgs f = {a, {xf->x, xf->ldx, xf->nw, xf->eps, rowops_norm_shape(a->k)}};
    run_staged<GemvXFL, 8>(a->w_type, &f, a->n, rb, (int)(a->k / 64), a->x.planes, (cudaStream_t)stream);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}

static g5_status check_moe(const char *what, int32_t n_expert, const int32_t *ids, int32_t top_k, int64_t ld_ids,
                           int32_t n_tok, const int32_t *plan, g5_error *err) {
    if (n_expert < 1) return BAD("%s: n_expert=%d must be positive", what, (int)n_expert);
    if (!ids || !plan) return BAD("%s: ids or plan is NULL", what);
    if (top_k < 1 || top_k > n_expert) return BAD("%s: top_k=%d outside 1..%d", what, (int)top_k, (int)n_expert);
    if (ld_ids < top_k) return BAD("%s: ld_ids=%lld < top_k=%d", what, (long long)ld_ids, (int)top_k);
    if (n_tok < 1 || (int64_t)n_tok * top_k > CUK_MOE_PLAN_MAX_PAIRS)
        return BAD("%s: n_tok=%d x top_k=%d outside 1..%d pairs", what, (int)n_tok, (int)top_k, CUK_MOE_PLAN_MAX_PAIRS);
    return G5_OK;
}


/* The argument checks of both MoE gate_up kernels (this file's and gemv_q8t.cu's). */
g5_status cuk::q8_moe_gate_up_check(const char *what, const cuk_moe_gate_up_q8_args *a, int64_t *rb, g5_error *err) {
    if (!a) return BAD("%s: args is NULL", what);
    g5_status st = check_w(what, a->w_type, a->w_gate, a->k, a->m, a->n_expert > 0 ? a->n_expert : 1, rb, err);
    if (st != G5_OK) return st;
    if (!a->w_up || (uintptr_t)a->w_up % 16) return BAD("%s: w_up NULL or not 16-byte aligned", what);
    if ((st = check_moe(what, a->n_expert, a->ids, a->top_k, a->ld_ids, a->n_tok, a->plan, err))) return st;
    if ((st = q8_check_act(what, "x", &a->x, a->k, err)) != G5_OK) return st;
    if (!a->out || a->ldo < a->m) return BAD("%s: out NULL or ldo=%lld < m=%lld", what, (long long)a->ldo, (long long)a->m);
    return G5_OK;
}

extern "C" g5_status cuk_moe_gate_up_q8(const cuk_moe_gate_up_q8_args *a, cuk_stream stream, g5_error *err) {
    int64_t rb = 0;
    const g5_status st = q8_moe_gate_up_check("moe_gate_up_q8", a, &rb, err);
    if (st != G5_OK) return st;
    run_type<GateUpL, 4>(Q8_GATE_UP, a->w_type, a, moe_nv(a->n_tok), rb, a->k, a->x.planes, (cudaStream_t)stream);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}

g5_status cuk::q8_moe_down_check(const char *what, const cuk_moe_down_q8_args *a, int64_t *rb, g5_error *err) {
    if (!a) return BAD("%s: args is NULL", what);
    g5_status st = check_w(what, a->w_type, a->w, a->k, a->m, a->n_expert > 0 ? a->n_expert : 1, rb, err);
    if (st != G5_OK) return st;
    if ((st = check_moe(what, a->n_expert, a->ids, a->top_k, a->ld_ids, a->n_tok, a->plan, err))) return st;
    if (!a->wts || a->ld_wts < a->top_k) return BAD("%s: wts NULL or ld_wts=%lld < top_k", what, (long long)a->ld_wts);
    if (a->hf) {
        if ((uintptr_t)a->hf % 16 || a->ldhf < a->k || a->ldhf % 4)
            return BAD("%s: hf not 16-byte aligned, or ldhf=%lld < k=%lld or not a multiple of 4", what,
                       (long long)a->ldhf, (long long)a->k);
    } else if ((st = q8_check_act(what, "h", &a->h, a->k, err)) != G5_OK) {
        return st;
    }
    if (!a->y || a->ldy < a->m) return BAD("%s: y NULL or ldy=%lld < m=%lld", what, (long long)a->ldy, (long long)a->m);
    if (!a->part || a->ldp < a->m) return BAD("%s: part NULL or ldp=%lld < m=%lld", what, (long long)a->ldp, (long long)a->m);
    return G5_OK;
}

/* The slot sum of cuk_moe_down (the same part layout and plan) after either down kernel. */
g5_status cuk::q8_moe_combine(const cuk_moe_down_q8_args *a, cudaStream_t stream, g5_error *err) {
    cuk_moe_down_args c = {};
    c.w_type = a->w_type;
    c.k = a->k;
    c.m = a->m;
    c.n_expert = a->n_expert;
    c.ids = a->ids;
    c.wts = a->wts;
    c.top_k = a->top_k;
    c.ld_ids = a->ld_ids;
    c.ld_wts = a->ld_wts;
    c.n_tok = a->n_tok;
    c.y = a->y;
    c.ldy = a->ldy;
    c.plan = a->plan;
    c.part = a->part;
    c.ldp = a->ldp;
    return moe_combine(&c, stream, err);
}

extern "C" int cuk_moe_down_q8_hf_takes(uint32_t t, int64_t k, int32_t n_tok) {
    if (!staged_type(t) || !cuk_q8_takes(t, k) || n_tok < 1) return 0;
    return (int64_t)moe_nv(n_tok) * (k / 64) * q8::XS_UNIT <= STAGE_SMEM_MAX;
}

extern "C" g5_status cuk_moe_down_q8(const cuk_moe_down_q8_args *a, cuk_stream stream, g5_error *err) {
    int64_t rb = 0;
    const g5_status st = q8_moe_down_check("moe_down_q8", a, &rb, err);
    if (st != G5_OK) return st;
    const cudaStream_t cs = (cudaStream_t)stream;
    if (a->hf) { /* float32 rows, quantized per CTA (DownFL) */
        if (!cuk_moe_down_q8_hf_takes(a->w_type, a->k, a->n_tok))
            return g5_fail(err, G5_ERR_UNSUPPORTED, "moe_down_q8: float32 rows (hf) with %s weights of k=%lld, %d tokens",
                           quant_type_name(a->w_type), (long long)a->k, (int)a->n_tok);
        run_staged<DownFL, 4>(a->w_type, a, moe_nv(a->n_tok), rb, (int)(a->k / 64), 1, cs);
        CUK_CHECK(cudaGetLastError());
        return q8_moe_combine(a, cs, err);
    }
    run_type<DownL, 4>(Q8_DOWN, a->w_type, a, moe_nv(a->n_tok), rb, a->k, a->h.planes, cs);
    CUK_CHECK(cudaGetLastError());
    return q8_moe_combine(a, cs, err);
}
