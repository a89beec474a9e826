/* Small kernels around the GEMVs: RMSNorm, LayerNorm, interleaved RoPE, residual add, argmax.
 * Each follows the CPU reference's arithmetic (runtime/cpu/cpu_ops.c) closely enough for --check:
 * norm statistics in float64, products in the same order without contraction into FMAs. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include <cooperative_groups.h>

#include "cuda/argmax.cuh"
#include "cuda/cuk_h16.h"
#include "cuda/cuk_internal.cuh"
#include "cuda/cuk_q8.h"
#include "cuda/q8_quant.cuh"
#include "cuda/rowops.cuh"

namespace cg = cooperative_groups;

#define BAD(...) g5_fail(err, G5_ERR_INVALID_ARG, __VA_ARGS__)

namespace {

/* ---- row norms ----
 * At decode a norm is one row: latency, not bandwidth, decides. A row is split into float4
 * chunks spread over the CTAs of a cluster (the row's "threads" g = rank * blockDim + tid, chunk
 * c owned by thread c % P, P = cluster size * blockDim), every load of a thread's chunks issued
 * before any arithmetic, the chunks kept in registers for the second pass (up to NR_NC per
 * thread; beyond that, re-read). The shape (cluster size, blockDim) depends on dim alone
 * (rowops_norm_shape), so a row's reduction order, hence its bits, is the same whatever the number of
 * rows in the launch, and the same for the fused add + norm as for the plain norm. */
constexpr int NR_T = ROWOPS_NT;          /* threads per CTA at most */
constexpr int NR_CL = CUK_NORM_CLUSTER_MAX; /* CTAs per row (cluster) at most: the portable cluster size */
constexpr int NR_NC = 4;  /* float4 chunks per thread held in registers */
constexpr int64_t NR_MAX_CLUSTERS = 1 << 20; /* rows per launch wave (rows loop past it) */

enum { NK_RMS = 0, NK_ADD_RMS = 1, NK_LAYER = 2 };

struct NormArgs {
    float *x;          /* [n_rows][ldx] (written by NK_ADD_RMS) */
    int64_t ldx;
    const float *a;    /* NK_ADD_RMS: [n_rows][lda] */
    const float *b;    /* NK_ADD_RMS: [n_rows][lda] or NULL */
    int64_t lda;
    const float *w;    /* [dim] */
    const float *bias; /* NK_LAYER: [dim] */
    float *y;          /* [n_rows][ldy] */
    int64_t ldy;
    int64_t n_rows, dim;
    float eps;
    int cs;            /* CTAs per row (cluster size) */
    int8_t *q;         /* NE_Q8_1 / NE_Q8_2: y's int8 rows [n_rows][ldq] (cuda/cuk_q8.h); NE_H16:
                          y's fp16 rows (cuda/cuk_h16.h), ldq halves apart */
    int64_t ldq;
    float *ds;         /* [n_rows][ldds]; NE_H16: 2^-e [n_rows] */
    int64_t ldds;
};

/* What a norm launch does besides y: nothing, y's int8 rows in one or two planes (cuk_norm_q8),
 * the RoPE'd tail of the row after dim (cuk_norm_rope), or y's fp16 rows (cuk_norm_h16). */
enum { NE_NONE = 0, NE_Q8_1 = 1, NE_Q8_2 = 2, NE_ROPE = 3, NE_H16 = 4 };

constexpr int ROPE_MAX_PAIRS = 128;
struct RopeInv {
    float inv[ROPE_MAX_PAIRS];
};

/* cuk_norm_rope: pairs i < n_pairs of x[row][dim..] roped at pos[row] into y[row][dim..]. */
struct NormTail {
    const int32_t *pos;
    int n_pairs;
    RopeInv inv;
};

__device__ __forceinline__ void cl_arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory"); }
__device__ __forceinline__ void cl_arrive() { asm volatile("barrier.cluster.arrive.aligned;" ::: "memory"); }
__device__ __forceinline__ void cl_wait() { asm volatile("barrier.cluster.wait.aligned;" ::: "memory"); }

/* Sum (MAX: the largest, by fmax) of one double per thread over the row's CTAs; every thread gets
 * the total. Order: lanes by butterfly, warps in index order, CTAs in rank order. Slots alternate
 * between consecutive calls (red counts them), so a call never overwrites partials another thread
 * or CTA may still be reading from the call before; a CTA pushes its partial into every CTA's
 * slot, so after the cluster barrier each reads only its own shared memory and may exit at once.
 * started: the kernel's opening relaxed arrive has not been waited for yet (a CTA may write
 * another's shared memory only once that one is running). */
template <bool MAX = false>
__device__ double row_sum(double v, double (*wsh)[NR_T / 32], double (*csh)[NR_CL], int &red, bool &started,
                          int cs) {
    const int slot = red++ & 1;
    v = MAX ? rowops_warp_max(v) : rowops_warp_sum(v);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    if (lane == 0) wsh[slot][warp] = v;
    __syncthreads();
    double t = wsh[slot][0];
    for (int i = 1; i < nw; i++) t = MAX ? fmax(t, wsh[slot][i]) : t + wsh[slot][i];
    if (cs == 1) return t;
    if (started) {
        cl_wait();
        started = false;
    }
    if (threadIdx.x < (unsigned)cs) {
        cg::cluster_group cl = cg::this_cluster();
        double *dst = cl.map_shared_rank(&csh[slot][0], (unsigned)threadIdx.x);
        dst[cl.block_rank()] = t;
    }
    cl_arrive();
    cl_wait();
    t = csh[slot][0];
    for (int r = 1; r < cs; r++) t = MAX ? fmax(t, csh[slot][r]) : t + csh[slot][r];
    return t;
}

/* x + (b ? a + b : a), elementwise: the separate adds' order. */
__device__ __forceinline__ float4 add_res(float4 x, float4 a, const float *br, float4 b) {
    if (br) a = make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z), __fadd_rn(a.w, b.w));
    return make_float4(__fadd_rn(x.x, a.x), __fadd_rn(x.y, a.y), __fadd_rn(x.z, a.z), __fadd_rn(x.w, a.w));
}

__device__ __forceinline__ float4 rms_out(float4 x, float s, float4 w) {
    return make_float4(__fmul_rn(__fmul_rn(x.x, s), w.x), __fmul_rn(__fmul_rn(x.y, s), w.y),
                       __fmul_rn(__fmul_rn(x.z, s), w.z), __fmul_rn(__fmul_rn(x.w, s), w.w));
}

__device__ __forceinline__ float4 ln_out(float4 x, double mean, double inv, float4 w, float4 b) {
    return make_float4(rowops_ln_out(x.x, mean, inv, w.x, b.x), rowops_ln_out(x.y, mean, inv, w.y, b.y),
                       rowops_ln_out(x.z, mean, inv, w.z, b.z), rowops_ln_out(x.w, mean, inv, w.w, b.w));
}

/* RMSNorm (NK_RMS), residual add + RMSNorm (NK_ADD_RMS), LayerNorm (NK_LAYER). Grid: cs CTAs
 * (one cluster) per row, rows looping by the number of clusters; block: rowops_norm_shape's threads.
 * Each thread loads its chunks (x, and a, b for the add; w, bias) first, forms v = x (+ a + b),
 * writes v back for the add, sums v^2 (or v, then (v - mean)^2) in float64 over its chunks in
 * order, the row reduces (row_sum), and the thread writes its chunks of y from the registers.
 * The arithmetic per element is the CPU's: x * scale * w, (float)((x - mean) * inv) * w + b. */
template <int KIND, int EX>
__device__ __forceinline__ void norm_rows(const NormArgs &p, const NormTail *tail) {
    __shared__ double wsh[2][NR_T / 32];
    __shared__ double csh[2][NR_CL];
    const int cs = p.cs;
    const int64_t P = (int64_t)cs * blockDim.x;
    const int64_t g = (int64_t)(blockIdx.x % cs) * blockDim.x + threadIdx.x;
    const int64_t nch = (p.dim + 3) / 4;
    const int nc = (int)((nch - g + P - 1) / P); /* this thread's chunks: g, g + P, ... */
    const int64_t n_cl = gridDim.x / cs;
    bool started = cs > 1;
    int red = 0;
    if (started) cl_arrive_relaxed();
    for (int64_t row = blockIdx.x / cs; row < p.n_rows; row += n_cl) {
        float *xr = p.x + row * p.ldx;
        float *yr = p.y + row * p.ldy;
        const float *ar = KIND == NK_ADD_RMS ? p.a + row * p.lda : nullptr;
        const float *br = KIND == NK_ADD_RMS && p.b ? p.b + row * p.lda : nullptr;
        const bool vec = (((uintptr_t)xr | (uintptr_t)yr | (uintptr_t)ar | (uintptr_t)br | (uintptr_t)p.w |
                           (uintptr_t)p.bias) & 15) == 0;
        float2 tv = make_float2(0.0f, 0.0f); /* NE_ROPE: this thread's first tail pair, loaded with the row */
        if (EX == NE_ROPE && g < tail->n_pairs) tv = make_float2(xr[p.dim + 2 * g], xr[p.dim + 2 * g + 1]);
        float4 xv[NR_NC], wv[NR_NC], bv[NR_NC];
#pragma unroll
        for (int j = 0; j < NR_NC; j++) {
            xv[j] = wv[j] = bv[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (j < nc) {
                const int64_t e0 = (g + j * P) * 4;
                xv[j] = rowops_ld4(xr, e0, p.dim, vec);
                if (KIND == NK_ADD_RMS) {
                    const float4 av = rowops_ld4(ar, e0, p.dim, vec);
                    const float4 bb = br ? rowops_ld4(br, e0, p.dim, vec) : av;
                    xv[j] = add_res(xv[j], av, br, bb);
                }
                wv[j] = rowops_ld4(p.w, e0, p.dim, vec);
                if (KIND == NK_LAYER) bv[j] = rowops_ld4(p.bias, e0, p.dim, vec);
            }
        }
        double s = 0.0;
#pragma unroll
        for (int j = 0; j < NR_NC; j++) {
            if (j >= nc) break;
            const int64_t e0 = (g + j * P) * 4;
            if (KIND == NK_ADD_RMS) rowops_st4(xr, e0, p.dim, vec, xv[j]);
            s += KIND == NK_LAYER ? rowops_chunk_sum(xv[j], e0, p.dim) : rowops_chunk_sq(xv[j], e0, p.dim);
        }
        for (int j = NR_NC; j < nc; j++) { /* past the registers: read (and for the add written) */
            const int64_t e0 = (g + j * P) * 4;
            float4 v = rowops_ld4(xr, e0, p.dim, vec);
            if (KIND == NK_ADD_RMS) {
                const float4 av = rowops_ld4(ar, e0, p.dim, vec);
                const float4 bb = br ? rowops_ld4(br, e0, p.dim, vec) : av;
                v = add_res(v, av, br, bb);
                rowops_st4(xr, e0, p.dim, vec, v);
            }
            s += KIND == NK_LAYER ? rowops_chunk_sum(v, e0, p.dim) : rowops_chunk_sq(v, e0, p.dim);
        }
        s = row_sum(s, wsh, csh, red, started, cs);
        float scale = 0.0f;
        double mean = 0.0, inv = 0.0;
        if (KIND == NK_LAYER) {
            mean = s / (double)p.dim;
            double v2 = 0.0;
#pragma unroll
            for (int j = 0; j < NR_NC; j++) {
                if (j >= nc) break;
                v2 += rowops_chunk_var(xv[j], (g + j * P) * 4, p.dim, mean);
            }
            for (int j = NR_NC; j < nc; j++) {
                const int64_t e0 = (g + j * P) * 4;
                v2 += rowops_chunk_var(rowops_ld4(xr, e0, p.dim, vec), e0, p.dim, mean);
            }
            const double var = row_sum(v2, wsh, csh, red, started, cs) / (double)p.dim;
            inv = 1.0 / sqrt(var + (double)p.eps);
        } else {
            scale = (float)(1.0 / sqrt(s / (double)p.dim + (double)p.eps));
        }
        float4 yv[NR_NC]; /* NE_H16: the thread's y chunks, kept for their fp16 copy */
        double mx = 0.0;  /* NE_H16: their largest magnitude */
#pragma unroll
        for (int j = 0; j < NR_NC; j++) {
            if (j >= nc) break;
            const int64_t e0 = (g + j * P) * 4;
            const float4 o = KIND == NK_LAYER ? ln_out(xv[j], mean, inv, wv[j], bv[j]) : rms_out(xv[j], scale, wv[j]);
            rowops_st4(yr, e0, p.dim, vec, o);
            if (EX == NE_Q8_1 || EX == NE_Q8_2) { /* every thread has nc chunks here (cuk_norm_q8_fits) */
                const float v[4] = {o.x, o.y, o.z, o.w};
                cuk::q8q::quant_block<4, EX == NE_Q8_2 ? 2 : 1>(v, (int)((e0 >> 2) & 7), p.q + row * p.ldq + (e0 & ~31ll),
                                                            p.dim, p.ds + row * p.ldds, e0 >> 5);
            }
            if (EX == NE_H16) {
                yv[j] = o;
                mx = fmax(mx, (double)fmaxf(fmaxf(fabsf(o.x), fabsf(o.y)), fmaxf(fabsf(o.z), fabsf(o.w))));
            }
        }
        if (EX == NE_H16) { /* k_h16_prep's scale and rounding of y (every thread has nc chunks here) */
            const int e = rowops_h16_exp((float)row_sum<true>(mx, wsh, csh, red, started, cs));
#pragma unroll
            for (int j = 0; j < NR_NC; j++) {
                if (j >= nc) break;
                const int64_t e0 = (g + j * P) * 4;
                const float4 o = yv[j];
                *(uint2 *)((uint16_t *)p.q + row * p.ldq + e0) =
                    make_uint2((uint32_t)rowops_h16_of(o.x, e) | (uint32_t)rowops_h16_of(o.y, e) << 16,
                               (uint32_t)rowops_h16_of(o.z, e) | (uint32_t)rowops_h16_of(o.w, e) << 16);
            }
            if (g == 0) p.ds[row] = ldexpf(1.0f, -e);
        }
        for (int j = NR_NC; j < nc; j++) {
            const int64_t e0 = (g + j * P) * 4;
            const float4 v = rowops_ld4(xr, e0, p.dim, vec); /* NK_ADD_RMS: this thread's own write */
            const float4 w = rowops_ld4(p.w, e0, p.dim, vec);
            rowops_st4(yr, e0, p.dim, vec,
                     KIND == NK_LAYER ? ln_out(v, mean, inv, w, rowops_ld4(p.bias, e0, p.dim, vec)) : rms_out(v, scale, w));
        }
        if (EX == NE_ROPE) { /* k_rope's arithmetic on the copied pairs */
            const float *xt = xr + p.dim;
            float *yt = yr + p.dim;
            for (int64_t i = g; i < tail->n_pairs; i += P) {
                float a = i == g ? tv.x : xt[2 * i], b = i == g ? tv.y : xt[2 * i + 1];
                rowops_rope_rot(a, b, rowops_rope_cs(tail->pos[row], tail->inv.inv[i]));
                yt[2 * i] = a;
                yt[2 * i + 1] = b;
            }
        }
    }
    if (started) cl_wait(); /* a cluster with no row: complete the opening arrive */
}

/* RMSNorm (NK_RMS), residual add + RMSNorm (NK_ADD_RMS), LayerNorm (NK_LAYER) as norm_rows says,
 * with y's int8 rows (EX = NE_Q8_1, NE_Q8_2), its fp16 rows (NE_H16) or not (NE_NONE). */
template <int KIND, int EX>
__global__ void __launch_bounds__(NR_T) k_norm(NormArgs p) {
    /* a kernel launched after this one with programmatic stream serialization (cuk_gemv_wide:
     * the router after the MoE layer's ffn_norm) may start now and load its weights; it reads y
     * only after griddepcontrol.wait, which waits for this grid's completion and its writes. No
     * effect on an ordinary launch after it. */
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    norm_rows<KIND, EX>(p, nullptr);
}

/* RMSNorm of the first dim elements and RoPE of the n_rot after them (cuk_norm_rope). */
__global__ void __launch_bounds__(NR_T) k_norm_rope(NormArgs p, const NormTail t) {
    norm_rows<NK_RMS, NE_ROPE>(p, &t);
}

/* One launch of kernel fn (k_norm or k_norm_rope) in rowops_norm_shape's clusters. */
template <typename... Args>
static g5_status launch_norm_fn(void (*fn)(NormArgs, Args...), NormArgs p, cudaStream_t st, g5_error *err,
                                Args... more) {
    const RowopsShape sh = rowops_norm_shape(p.dim);
    p.cs = sh.cs;
    const int64_t n_cl = p.n_rows < NR_MAX_CLUSTERS ? p.n_rows : NR_MAX_CLUSTERS;
    if (sh.cs == 1) {
        fn<<<(unsigned)n_cl, sh.threads, 0, st>>>(p, more...);
    } else {
        cudaLaunchAttribute at;
        const cudaLaunchConfig_t cfg = cuk_cluster_cfg(&at, (unsigned)sh.cs, dim3((unsigned)(n_cl * sh.cs), 1, 1),
                                                       (unsigned)sh.threads, 0, st);
        CUK_CHECK(cudaLaunchKernelEx(&cfg, fn, p, more...));
    }
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}

template <int KIND>
static g5_status launch_norm(NormArgs p, cudaStream_t st, g5_error *err) {
    return launch_norm_fn(k_norm<KIND, NE_NONE>, p, st, err);
}


/* RoPE. Grid: one CTA per token (tokens loop past the grid); block: ROPE_T threads. Thread i <
 * n_pairs forms pair i's cos/sin once per token into shared memory (shared by all heads); each
 * thread rotates pairs idx = tid, tid + ROPE_T, ... of the token's (head, pair) grid, the first
 * ROPE_PRE of them loaded before the table is formed so their loads overlap the sincos. */
constexpr int ROPE_T = 256, ROPE_PRE = 4;
constexpr int64_t ROPE_MAX_CTAS = 1 << 20;

__global__ void __launch_bounds__(ROPE_T)
    k_rope(float *x, int64_t n_tok, int64_t tok_stride, int64_t n_head, int64_t head_stride, int64_t rot_off,
           int n_pairs, const int32_t *__restrict__ pos, const RopeInv inv) {
    __shared__ float2 tab[ROPE_MAX_PAIRS];
    const int64_t np = n_head * n_pairs;
    for (int64_t t = blockIdx.x; t < n_tok; t += gridDim.x) {
        float *xt = x + t * tok_stride + rot_off;
        const int32_t ps = pos[t];
        float2 v[ROPE_PRE];
#pragma unroll
        for (int j = 0; j < ROPE_PRE; j++) {
            const int64_t idx = threadIdx.x + (int64_t)j * blockDim.x;
            v[j] = make_float2(0.0f, 0.0f);
            if (idx < np) {
                const float *p = xt + (idx / n_pairs) * head_stride + 2 * (idx % n_pairs);
                v[j] = make_float2(p[0], p[1]);
            }
        }
        __syncthreads(); /* the previous token's table is no longer read */
        for (int i = threadIdx.x; i < n_pairs; i += blockDim.x) tab[i] = rowops_rope_cs(ps, inv.inv[i]);
        __syncthreads();
#pragma unroll
        for (int j = 0; j < ROPE_PRE; j++) {
            const int64_t idx = threadIdx.x + (int64_t)j * blockDim.x;
            if (idx < np) {
                float *p = xt + (idx / n_pairs) * head_stride + 2 * (idx % n_pairs);
                rowops_rope_rot(v[j].x, v[j].y, tab[idx % n_pairs]);
                p[0] = v[j].x;
                p[1] = v[j].y;
            }
        }
        for (int64_t idx = threadIdx.x + (int64_t)ROPE_PRE * blockDim.x; idx < np; idx += blockDim.x) {
            float *p = xt + (idx / n_pairs) * head_stride + 2 * (idx % n_pairs);
            float a = p[0], b = p[1];
            rowops_rope_rot(a, b, tab[idx % n_pairs]);
            p[0] = a;
            p[1] = b;
        }
    }
}

/* Residual add. Grid-stride; block: 256 threads; each thread adds one element per step. */
__global__ void k_add(const float *a, const float *b, float *y, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = a[i] + b[i];
}

/* Argmax. Grid: one CTA per row; block: AM_THREADS threads. A row that starts on 16 bytes is
 * read as float4 pieces, thread t taking pieces t, t + AM_THREADS, ..., four pieces in flight a
 * step (then the elements past the last whole piece one each); other rows one element at a
 * time. Each thread keeps the largest non-NaN value and its lowest index; warps then the CTA
 * reduce (cuda/argmax.cuh: larger value wins, equal values the lower index). The rule is a
 * total order, so how the row is spread over threads changes no result. The decode step's
 * greedy token reads a 154880-logit row: one CTA of 256 threads walking it one element a
 * step cost about 0.1 ms a token on an H100 (argmax steps against logits steps, bench_peer). */
constexpr int AM_THREADS = 1024, AM_INFLIGHT = 4;

__device__ __forceinline__ void argmax_take4(float &bv, int64_t &bi, const float4 &v, int64_t i) {
    if (v.x == v.x) argmax_take(bv, bi, v.x, i);
    if (v.y == v.y) argmax_take(bv, bi, v.y, i + 1);
    if (v.z == v.z) argmax_take(bv, bi, v.z, i + 2);
    if (v.w == v.w) argmax_take(bv, bi, v.w, i + 3);
}

__global__ void __launch_bounds__(AM_THREADS)
    k_argmax(const float *__restrict__ x, int64_t ldx, int64_t n, int32_t *out, float *val) {
    __shared__ float sv[AM_THREADS / 32];
    __shared__ int64_t si[AM_THREADS / 32];
    const float *xr = x + (int64_t)blockIdx.x * ldx;
    float bv = 0.0f;
    int64_t bi = -1;
    int64_t i0 = 0; /* the first element read one at a time */
    if (((uintptr_t)xr & 15) == 0) {
        const float4 *x4 = (const float4 *)xr;
        const int64_t nq = n / 4;
        const float qnan = __int_as_float(0x7fc00000);
        for (int64_t q = threadIdx.x; q < nq; q += AM_INFLIGHT * AM_THREADS) {
            float4 v[AM_INFLIGHT];
#pragma unroll
            for (int j = 0; j < AM_INFLIGHT; j++) {
                const int64_t qj = q + (int64_t)j * AM_THREADS;
                v[j] = qj < nq ? __ldg(x4 + qj) : make_float4(qnan, qnan, qnan, qnan);
            }
#pragma unroll
            for (int j = 0; j < AM_INFLIGHT; j++) argmax_take4(bv, bi, v[j], 4 * (q + (int64_t)j * AM_THREADS));
        }
        i0 = 4 * nq;
    }
    for (int64_t i = i0 + threadIdx.x; i < n; i += AM_THREADS) {
        const float v = xr[i];
        if (v == v) argmax_take(bv, bi, v, i); /* NaN never wins */
    }
    argmax_warp(bv, bi);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) sv[warp] = bv, si[warp] = bi;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int j = 0; j < AM_THREADS / 32; j++) argmax_take(bv, bi, sv[j], si[j]);
        out[blockIdx.x] = (int32_t)bi;
        if (val) val[blockIdx.x] = bi < 0 ? __int_as_float(0x7fc00000) : bv;
    }
}

unsigned grid_for(int64_t n, int threads) {
    const int64_t g = (n + threads - 1) / threads;
    return (unsigned)(g < 65536 ? (g > 0 ? g : 1) : 65536);
}

} // namespace

static g5_status check_rows(const char *what, const void *x, const void *y, int64_t ldx,
                            int64_t ldy, int64_t n_rows, int64_t dim, g5_error *err) {
    if (!x) return BAD("%s: x is NULL", what);
    if (!y) return BAD("%s: y is NULL", what);
    if (dim <= 0) return BAD("%s: dim=%lld must be positive", what, (long long)dim);
    if (n_rows <= 0 || n_rows > 0x7fffffff)
        return BAD("%s: n_rows=%lld outside 1..2^31-1", what, (long long)n_rows);
    if (ldx < dim) return BAD("%s: ldx=%lld < dim=%lld", what, (long long)ldx, (long long)dim);
    if (ldy < dim) return BAD("%s: ldy=%lld < dim=%lld", what, (long long)ldy, (long long)dim);
    return G5_OK;
}

extern "C" g5_status cuk_rms_norm(const float *x, int64_t ldx, const float *w, float *y,
                                  int64_t ldy, int64_t n_rows, int64_t dim, float eps,
                                  cuk_stream stream, g5_error *err) {
    g5_status st = check_rows("rms_norm", x, y, ldx, ldy, n_rows, dim, err);
    if (st != G5_OK) return st;
    if (!w) return BAD("rms_norm: w is NULL");
    if (!(eps >= 0.0f)) return BAD("rms_norm: eps=%g must be >= 0", (double)eps);
    const NormArgs p = {(float *)x, ldx, nullptr, nullptr, 0, w, nullptr, y, ldy, n_rows, dim, eps, 1, nullptr, 0, nullptr, 0};
    return launch_norm<NK_RMS>(p, (cudaStream_t)stream, err);
}

extern "C" g5_status cuk_add_rms_norm(const cuk_add_rms_norm_args *args, cuk_stream stream, g5_error *err) {
    if (!args) return BAD("add_rms_norm: no args");
    float *const x = args->x, *const y = args->y;
    const float *const a = args->a, *const b = args->b, *const w = args->w;
    const int64_t ldx = args->ldx, lda = args->lda, ldy = args->ldy, n_rows = args->n_rows, dim = args->dim;
    const float eps = args->eps;
    g5_status st = check_rows("add_rms_norm", x, y, ldx, ldy, n_rows, dim, err);
    if (st != G5_OK) return st;
    if (!a) return BAD("add_rms_norm: a is NULL");
    if (!w) return BAD("add_rms_norm: w is NULL");
    if (lda < dim) return BAD("add_rms_norm: lda=%lld < dim=%lld", (long long)lda, (long long)dim);
    if (y == x || y == a || (b && y == b)) return BAD("add_rms_norm: y aliases an input");
    if (!(eps >= 0.0f)) return BAD("add_rms_norm: eps=%g must be >= 0", (double)eps);
    const NormArgs p = {x, ldx, a, b, lda, w, nullptr, y, ldy, n_rows, dim, eps, 1, nullptr, 0, nullptr, 0};
    return launch_norm<NK_ADD_RMS>(p, (cudaStream_t)stream, err);
}

extern "C" int cuk_norm_q8_fits(int64_t dim) {
    if (dim <= 0 || dim % 64 || dim > (1LL << 24)) return 0;
    const RowopsShape sh = rowops_norm_shape(dim);
    const int64_t P = (int64_t)sh.cs * sh.threads, nch = dim / 4;
    return nch % P == 0 && nch / P <= NR_NC;
}

/* The norm half of a fused norm launch (cuk_norm_q8, cuk_norm_h16): rows, weights, eps, the add's
 * operands, a dim cuk_norm_q8_fits takes. */
static g5_status check_fused_norm(const char *what, const cuk_add_rms_norm_args *n, g5_error *err) {
    g5_status st = check_rows(what, n->x, n->y, n->ldx, n->ldy, n->n_rows, n->dim, err);
    if (st != G5_OK) return st;
    if (!n->w) return BAD("%s: w is NULL", what);
    if (!(n->eps >= 0.0f)) return BAD("%s: eps=%g must be >= 0", what, (double)n->eps);
    if (n->a) {
        if (n->lda < n->dim) return BAD("%s: lda=%lld < dim=%lld", what, (long long)n->lda, (long long)n->dim);
        if (n->y == n->x || n->y == n->a || (n->b && n->y == n->b)) return BAD("%s: y aliases an input", what);
    } else if (n->b) {
        return BAD("%s: b without a", what);
    }
    if (!cuk_norm_q8_fits(n->dim)) return BAD("%s: dim=%lld is not one cuk_norm_q8_fits takes", what, (long long)n->dim);
    return G5_OK;
}

extern "C" g5_status cuk_norm_q8(const cuk_norm_q8_args *args, cuk_stream stream, g5_error *err) {
    if (!args) return BAD("norm_q8: no args");
    const cuk_add_rms_norm_args *n = &args->norm;
    g5_status st = check_fused_norm("norm_q8", n, err);
    if (st != G5_OK) return st;
    const cuk_q8_act o = {args->q, args->ldq, args->ds, args->ldds, args->planes};
    if ((st = cuk::q8_check_act("norm_q8", "out", &o, n->dim, err)) != G5_OK) return st;
    const int P = args->planes;
    const NormArgs p = {n->x, n->ldx, n->a, n->b, n->lda, n->w, nullptr, n->y, n->ldy, n->n_rows, n->dim, n->eps, 1,
                        args->q, args->ldq, args->ds, args->ldds};
    const cudaStream_t cs = (cudaStream_t)stream;
    if (n->a) return P == 2 ? launch_norm_fn(k_norm<NK_ADD_RMS, NE_Q8_2>, p, cs, err)
                            : launch_norm_fn(k_norm<NK_ADD_RMS, NE_Q8_1>, p, cs, err);
    return P == 2 ? launch_norm_fn(k_norm<NK_RMS, NE_Q8_2>, p, cs, err) : launch_norm_fn(k_norm<NK_RMS, NE_Q8_1>, p, cs, err);
}

extern "C" g5_status cuk_norm_h16(const cuk_norm_h16_args *args, cuk_stream stream, g5_error *err) {
    if (!args) return BAD("norm_h16: no args");
    const cuk_add_rms_norm_args *n = &args->norm;
    const g5_status st = check_fused_norm("norm_h16", n, err);
    if (st != G5_OK) return st;
    if (!args->xh || !args->unscale) return BAD("norm_h16: xh or unscale is NULL");
    if (args->ldxh < n->dim || args->ldxh % 8 || ((uintptr_t)args->xh & 15))
        return BAD("norm_h16: ldxh=%lld (a multiple of 8 >= dim = %lld; xh 16-byte aligned)", (long long)args->ldxh,
                   (long long)n->dim);
    const NormArgs p = {n->x, n->ldx, n->a, n->b, n->lda, n->w, nullptr, n->y, n->ldy, n->n_rows, n->dim, n->eps, 1,
                        (int8_t *)args->xh, args->ldxh, args->unscale, 0};
    const cudaStream_t cs = (cudaStream_t)stream;
    return n->a ? launch_norm_fn(k_norm<NK_ADD_RMS, NE_H16>, p, cs, err) : launch_norm_fn(k_norm<NK_RMS, NE_H16>, p, cs, err);
}

extern "C" g5_status cuk_norm_rope(const cuk_norm_rope_args *a, cuk_stream stream, g5_error *err) {
    if (!a) return BAD("norm_rope: no args");
    g5_status st = check_rows("norm_rope", a->x, a->y, a->ldx, a->ldy, a->n_rows, a->dim + a->n_rot, err);
    if (st != G5_OK) return st;
    if (!a->w) return BAD("norm_rope: w is NULL");
    if (!a->pos) return BAD("norm_rope: pos is NULL");
    if (!(a->eps >= 0.0f)) return BAD("norm_rope: eps=%g must be >= 0", (double)a->eps);
    if (a->n_rot < 2 || a->n_rot > 2 * ROPE_MAX_PAIRS || a->n_rot % 2)
        return BAD("norm_rope: n_rot=%lld must be even and in 2..%d", (long long)a->n_rot, 2 * ROPE_MAX_PAIRS);
    if (!(a->theta > 0.0f)) return BAD("norm_rope: theta=%g must be positive", (double)a->theta);
    if (a->x != a->y && a->x < a->y + a->n_rows * a->ldy && a->y < a->x + a->n_rows * a->ldx)
        return BAD("norm_rope: x and y overlap without being equal");
    if (a->x == a->y && a->ldx != a->ldy && a->n_rows > 1) /* rows would overlap other rows */
        return BAD("norm_rope: in place with ldx=%lld != ldy=%lld", (long long)a->ldx, (long long)a->ldy);
    NormTail t;
    t.pos = a->pos;
    t.n_pairs = rowops_rope_inv(a->theta, (int)a->n_rot, t.inv.inv);
    const NormArgs p = {(float *)a->x, a->ldx, nullptr, nullptr, 0, a->w, nullptr, a->y, a->ldy, a->n_rows, a->dim, a->eps, 1,
                        nullptr, 0, nullptr, 0};
    return launch_norm_fn(k_norm_rope, p, (cudaStream_t)stream, err, t);
}

extern "C" g5_status cuk_layer_norm(const cuk_layer_norm_args *args, cuk_stream stream, g5_error *err) {
    if (!args) return BAD("layer_norm: no args");
    const float *const x = args->x, *const w = args->w, *const b = args->b;
    float *const y = args->y;
    const int64_t ldx = args->ldx, ldy = args->ldy, n_rows = args->n_rows, dim = args->dim;
    const float eps = args->eps;
    g5_status st = check_rows("layer_norm", x, y, ldx, ldy, n_rows, dim, err);
    if (st != G5_OK) return st;
    if (!w) return BAD("layer_norm: w is NULL");
    if (!b) return BAD("layer_norm: b is NULL");
    if (!(eps >= 0.0f)) return BAD("layer_norm: eps=%g must be >= 0", (double)eps);
    const NormArgs p = {(float *)x, ldx, nullptr, nullptr, 0, w, b, y, ldy, n_rows, dim, eps, 1, nullptr, 0, nullptr, 0};
    return launch_norm<NK_LAYER>(p, (cudaStream_t)stream, err);
}

extern "C" g5_status cuk_rope(const cuk_rope_args *a, cuk_stream stream, g5_error *err) {
    if (!a) return BAD("rope: no args");
    float *const x = a->x;
    const int32_t *const pos = a->pos;
    const int64_t n_tok = a->n_tok, tok_stride = a->tok_stride, n_head = a->n_head, head_stride = a->head_stride;
    const int64_t rot_off = a->rot_off, n_rot = a->n_rot;
    const float theta = a->theta;
    if (!x) return BAD("rope: x is NULL");
    if (!pos) return BAD("rope: pos is NULL");
    if (n_rot < 2 || n_rot > 2 * ROPE_MAX_PAIRS || n_rot % 2)
        return BAD("rope: n_rot=%lld must be even and in 2..%d", (long long)n_rot, 2 * ROPE_MAX_PAIRS);
    if (n_tok < 1) return BAD("rope: n_tok=%lld must be positive", (long long)n_tok);
    if (n_head < 1) return BAD("rope: n_head=%lld must be positive", (long long)n_head);
    if (rot_off < 0) return BAD("rope: rot_off=%lld is negative", (long long)rot_off);
    if (n_head > 1 && head_stride < rot_off + n_rot)
        return BAD("rope: head_stride=%lld < rot_off + n_rot = %lld (heads would overlap)",
                   (long long)head_stride, (long long)(rot_off + n_rot));
    const int64_t tok_span = (n_head - 1) * head_stride + rot_off + n_rot;
    if (n_tok > 1 && tok_stride < tok_span)
        return BAD("rope: tok_stride=%lld < %lld (tokens would overlap)", (long long)tok_stride,
                   (long long)tok_span);
    if (!(theta > 0.0f)) return BAD("rope: theta=%g must be positive", (double)theta);
    RopeInv inv;
    const int n_pairs = rowops_rope_inv(theta, (int)n_rot, inv.inv);
    const int64_t np = n_head * n_pairs;
    const int threads = np < ROPE_T ? (int)((np + 31) / 32 * 32) : ROPE_T;
    k_rope<<<(unsigned)(n_tok < ROPE_MAX_CTAS ? n_tok : ROPE_MAX_CTAS), threads, 0, (cudaStream_t)stream>>>(
        x, n_tok, tok_stride, n_head, head_stride, rot_off, n_pairs, pos, inv);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}

extern "C" g5_status cuk_add(const float *a, const float *b, float *y, int64_t n,
                             cuk_stream stream, g5_error *err) {
    if (!a) return BAD("add: a is NULL");
    if (!b) return BAD("add: b is NULL");
    if (!y) return BAD("add: y is NULL");
    if (n <= 0) return BAD("add: n=%lld must be positive", (long long)n);
    k_add<<<grid_for(n, 256), 256, 0, (cudaStream_t)stream>>>(a, b, y, n);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}

/* Grid-stride over x (<= 1024 CTAs of 256); each thread keeps its largest finite |x| and its
 * count of non-finite values, a warp reduces them and lane 0 folds them into out with atomics
 * (non-negative floats order as their bits). */
__global__ void k_absmax_scan(const float *__restrict__ x, int64_t n, uint32_t *out) {
    float m = 0.0f;
    uint32_t bad = 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = fabsf(x[i]);
        if (isfinite(v)) m = fmaxf(m, v);
        else bad++;
    }
    for (int o = 16; o; o >>= 1) {
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        bad += __shfl_xor_sync(0xffffffffu, bad, o);
    }
    if ((threadIdx.x & 31) == 0) {
        atomicMax(&out[0], __float_as_uint(m));
        if (bad) atomicAdd(&out[1], bad);
    }
}

extern "C" g5_status cuk_absmax_scan(const float *x, int64_t n, uint32_t *out, cuk_stream stream, g5_error *err) {
    if (!x) return BAD("absmax_scan: x is NULL");
    if (!out) return BAD("absmax_scan: out is NULL");
    if (n <= 0) return BAD("absmax_scan: n=%lld must be positive", (long long)n);
    const int64_t ctas = (n + 255) / 256;
    k_absmax_scan<<<(unsigned)(ctas < 1024 ? ctas : 1024), 256, 0, (cudaStream_t)stream>>>(x, n, out);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}

extern "C" g5_status cuk_argmax(const float *x, int64_t ldx, int64_t n_rows, int64_t n,
                                int32_t *out, float *val, cuk_stream stream, g5_error *err) {
    if (!x) return BAD("argmax: x is NULL");
    if (!out) return BAD("argmax: out is NULL");
    if (n <= 0 || n > 0x7fffffff) return BAD("argmax: n=%lld outside 1..2^31-1", (long long)n);
    if (n_rows <= 0 || n_rows > 0x7fffffff)
        return BAD("argmax: n_rows=%lld outside 1..2^31-1", (long long)n_rows);
    if (ldx < n) return BAD("argmax: ldx=%lld < n=%lld", (long long)ldx, (long long)n);
    k_argmax<<<(unsigned)n_rows, AM_THREADS, 0, (cudaStream_t)stream>>>(x, ldx, n, out, val);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}
