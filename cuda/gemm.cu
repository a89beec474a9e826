/* cuBLAS GEMM and the MoE grouping kernels of the prefill GEMM path (cuda/cuk_gemm.h). */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <stdint.h>

#include <new>

#include "cuda/cuk_gemm.h"
#include "cuda/cuk_internal.cuh"

/* CUK_CHECK's overloads for cuBLAS statuses (see cuk_internal.cuh). */
static inline bool cuk_ok(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }
static inline const char *cuk_errstr(cublasStatus_t s) { return cublasGetStatusString(s); }

#define BAD(...) g5_fail(err, G5_ERR_INVALID_ARG, __VA_ARGS__)

struct cuk_blas {
    cublasHandle_t h;
};

namespace {

constexpr int GROUP_THREADS = 256;

/* Grid: one block per local expert, GROUP_THREADS threads. The block walks the tokens in tiles
 * of GROUP_THREADS; each thread tests one token's top_k ids against the block's expert, and a
 * ballot plus the per-warp counts give every hit its place, so the list comes out ascending
 * without atomics. Block 0 also counts the ids outside [0, n_expert). */
__global__ void __launch_bounds__(GROUP_THREADS)
    k_moe_group(const int32_t *__restrict__ ids, const float *__restrict__ wts, int n_tok, int top_k, int64_t ld,
                int n_expert, int exp0, int32_t *__restrict__ rows, float *__restrict__ rw, int64_t ld_rows,
                int32_t *__restrict__ cnt, int n_local) {
    constexpr int NW = GROUP_THREADS / 32;
    __shared__ int warp_cnt[NW];
    __shared__ int bad_cnt[NW];
    const int e = blockIdx.x, eg = exp0 + e;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int32_t *my_rows = rows + (int64_t)e * ld_rows;
    float *my_rw = rw + (int64_t)e * ld_rows;
    int base = 0, bad = 0;
    for (int t0 = 0; t0 < n_tok; t0 += GROUP_THREADS) {
        const int t = t0 + (int)threadIdx.x;
        bool hit = false;
        float w = 0.0f;
        if (t < n_tok) {
            const int32_t *it = ids + (int64_t)t * ld;
            const float *wt = wts + (int64_t)t * ld;
            for (int s = 0; s < top_k; s++) {
                const int32_t id = it[s];
                if (id == eg) {
                    w = hit ? __fadd_rn(w, wt[s]) : wt[s];
                    hit = true;
                }
                if (e == 0 && (id < 0 || id >= n_expert)) bad++;
            }
        }
        const unsigned m = __ballot_sync(0xffffffffu, hit);
        if (lane == 0) warp_cnt[warp] = __popc(m);
        __syncthreads();
        int off = base, total = 0;
        for (int i = 0; i < NW; i++) {
            if (i < warp) off += warp_cnt[i];
            total += warp_cnt[i];
        }
        if (hit) {
            const int j = off + __popc(m & ((1u << lane) - 1u));
            my_rows[j] = t;
            my_rw[j] = w;
        }
        __syncthreads(); /* warp_cnt is rewritten by the next tile */
        base += total;
    }
    if (threadIdx.x == 0) cnt[e] = base;
    if (e == 0) {
        for (int o = 16; o > 0; o >>= 1) bad += __shfl_down_sync(0xffffffffu, bad, o);
        if (lane == 0) bad_cnt[warp] = bad;
        __syncthreads();
        if (threadIdx.x == 0) {
            int sum = 0;
            for (int i = 0; i < NW; i++) sum += bad_cnt[i];
            cnt[n_local] = sum;
        }
    }
}

/* One thread per output element (row i, column c): a plain copy, coalesced along c. */
__global__ void k_gather_rows(const float *__restrict__ x, int64_t ldx, int64_t n_rows_x,
                              const int32_t *__restrict__ rows, int64_t n, int64_t k, float *__restrict__ out,
                              int64_t ldo) {
    const int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= n * k) return;
    const int64_t i = g / k, c = g % k;
    const int64_t r = rows[i];
    out[i * ldo + c] = r >= 0 && r < n_rows_x ? x[r * ldx + c] : __int_as_float(0x7fc00000);
}

/* One thread per element of d (row i, column c): adds rw[i] * d[i][c] to y's row rows[i]. */
__global__ void k_scatter_add_rows(const float *__restrict__ d, int64_t ldd, const int32_t *__restrict__ rows,
                                   const float *__restrict__ rw, int64_t n, int64_t m, float *__restrict__ y,
                                   int64_t ldy, int64_t n_rows_y) {
    const int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= n * m) return;
    const int64_t i = g / m, c = g % m;
    const int64_t r = rows[i];
    if (r < 0 || r >= n_rows_y) return;
    float *p = y + r * ldy + c;
    *p = __fadd_rn(*p, __fmul_rn(rw[i], d[i * ldd + c]));
}

unsigned grid_for(int64_t n, int threads) { return (unsigned)((n + threads - 1) / threads); }

} // namespace

extern "C" g5_status cuk_blas_create(cuk_blas **out, g5_error *err) {
    *out = NULL;
    cuk_blas *b = new (std::nothrow) cuk_blas;
    if (!b) return g5_fail(err, G5_ERR_NOMEM, "cuBLAS handle");
    const cublasStatus_t s = cublasCreate(&b->h);
    if (s != CUBLAS_STATUS_SUCCESS) {
        delete b;
        return g5_fail(err, G5_ERR_INTERNAL, "cublasCreate: %s", cublasGetStatusString(s));
    }
    *out = b;
    return G5_OK;
}

extern "C" void cuk_blas_free(cuk_blas *b) {
    if (!b) return;
    cublasDestroy(b->h);
    delete b;
}

/* The element and compute types of a mode, the handle bound to the stream, and the math mode
 * (pedantic for F32: no TF32, no reduced-precision split-K). */
static g5_status prepare(cuk_blas *b, uint32_t mode, cuk_stream stream, cudaDataType *in_t, cublasComputeType_t *ct,
                         g5_error *err) {
    if (mode != CUK_GEMM_F32 && mode != CUK_GEMM_TF32 && mode != CUK_GEMM_BF16 && mode != CUK_GEMM_F16)
        return BAD("gemm: mode %u", mode);
    *in_t = mode == CUK_GEMM_BF16 ? CUDA_R_16BF : mode == CUK_GEMM_F16 ? CUDA_R_16F : CUDA_R_32F;
    *ct = mode == CUK_GEMM_F32    ? CUBLAS_COMPUTE_32F_PEDANTIC
          : mode == CUK_GEMM_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                  : CUBLAS_COMPUTE_32F;
    CUK_CHECK(cublasSetStream(b->h, (cudaStream_t)stream));
    CUK_CHECK(cublasSetMathMode(b->h, mode == CUK_GEMM_F32 ? CUBLAS_PEDANTIC_MATH : CUBLAS_DEFAULT_MATH));
    return G5_OK;
}

#define CK_PREP(call)                                                                         \
    do {                                                                                      \
        const g5_status st_ = (call);                                                         \
        if (st_) return st_;                                                                  \
    } while (0)

extern "C" g5_status cuk_gemm(cuk_blas *b, const cuk_gemm_args *a, cuk_stream stream, g5_error *err) {
    if (!b || !a) return BAD("gemm: NULL handle or arguments");
    if (!a->w || !a->x || !a->y) return BAD("gemm: NULL pointer");
    if (a->k < 1 || a->m < 1 || a->n < 1 || a->k > INT32_MAX || a->m > INT32_MAX || a->n > INT32_MAX)
        return BAD("gemm: k=%lld m=%lld n=%lld must be 1 .. INT32_MAX", (long long)a->k, (long long)a->m,
                   (long long)a->n);
    if (a->ldw < a->k || a->ldx < a->k || a->ldy < a->m || a->ldw > INT32_MAX || a->ldx > INT32_MAX ||
        a->ldy > INT32_MAX)
        return BAD("gemm: ldw=%lld ldx=%lld (k=%lld), ldy=%lld (m=%lld)", (long long)a->ldw, (long long)a->ldx,
                   (long long)a->k, (long long)a->ldy, (long long)a->m);
    cudaDataType in_t;
    cublasComputeType_t ct;
    CK_PREP(prepare(b, a->mode, stream, &in_t, &ct, err));
    const float one = 1.0f, zero = 0.0f;
    /* Row-major y[n][m] = x[n][k] W[m][k]^T is, column-major, y^T (m x n) = W^T' x^T: W's rows
     * are the columns of a k x m matrix (lda = ldw), taken transposed. */
    CUK_CHECK(cublasGemmEx(b->h, CUBLAS_OP_T, CUBLAS_OP_N, (int)a->m, (int)a->n, (int)a->k, &one, a->w, in_t,
                           (int)a->ldw, a->x, in_t, (int)a->ldx, &zero, a->y, CUDA_R_32F, (int)a->ldy, ct,
                           CUBLAS_GEMM_DEFAULT));
    return G5_OK;
}

extern "C" g5_status cuk_gemm_ex(cuk_blas *b, const cuk_gemm_ex_args *a, cuk_stream stream, g5_error *err) {
    if (!b || !a) return BAD("gemm_ex: NULL handle or arguments");
    if (!a->a || !a->b || !a->c) return BAD("gemm_ex: NULL pointer");
    if (a->k < 1 || a->m < 1 || a->n < 1 || a->batch < 1 || a->k > INT32_MAX || a->m > INT32_MAX || a->n > INT32_MAX)
        return BAD("gemm_ex: k=%lld m=%lld n=%lld batch=%d", (long long)a->k, (long long)a->m, (long long)a->n,
                   a->batch);
    const int64_t ra = a->trans_a ? a->k : a->m, rb = a->trans_b ? a->n : a->k;
    if (a->lda < ra || a->ldb < rb || a->ldc < a->m || a->lda > INT32_MAX || a->ldb > INT32_MAX || a->ldc > INT32_MAX)
        return BAD("gemm_ex: lda=%lld ldb=%lld ldc=%lld for m=%lld n=%lld k=%lld", (long long)a->lda,
                   (long long)a->ldb, (long long)a->ldc, (long long)a->m, (long long)a->n, (long long)a->k);
    cudaDataType in_t;
    cublasComputeType_t ct;
    CK_PREP(prepare(b, a->mode, stream, &in_t, &ct, err));
    const float one = 1.0f;
    CUK_CHECK(cublasGemmStridedBatchedEx(b->h, a->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                         a->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, (int)a->m, (int)a->n, (int)a->k, &one,
                                         a->a, in_t, (int)a->lda, a->stride_a, a->b, in_t, (int)a->ldb, a->stride_b,
                                         &a->beta, a->c, CUDA_R_32F, (int)a->ldc, a->stride_c, a->batch, ct,
                                         CUBLAS_GEMM_DEFAULT));
    return G5_OK;
}

extern "C" g5_status cuk_moe_group(const cuk_moe_group_args *a, cuk_stream stream, g5_error *err) {
    if (!a || !a->ids || !a->wts || !a->rows || !a->rw || !a->cnt) return BAD("moe_group: NULL pointer");
    if (a->n_tok < 1 || a->top_k < 1 || a->ld < a->top_k)
        return BAD("moe_group: n_tok=%d top_k=%d ld=%lld", a->n_tok, a->top_k, (long long)a->ld);
    if (a->n_expert < 1 || a->n_local < 1 || a->exp0 < 0 || a->exp0 > a->n_expert - a->n_local)
        return BAD("moe_group: experts %d .. %d + %d of %d", a->exp0, a->exp0, a->n_local, a->n_expert);
    if (a->ld_rows < a->n_tok) return BAD("moe_group: ld_rows=%lld < n_tok=%d", (long long)a->ld_rows, a->n_tok);
    k_moe_group<<<(unsigned)a->n_local, GROUP_THREADS, 0, (cudaStream_t)stream>>>(
        a->ids, a->wts, a->n_tok, a->top_k, a->ld, a->n_expert, a->exp0, a->rows, a->rw, a->ld_rows, a->cnt,
        a->n_local);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}

extern "C" g5_status cuk_gather_rows(const float *x, int64_t ldx, int64_t n_rows_x, const int32_t *rows,
                                     int64_t n, int64_t k, float *out, int64_t ldo, cuk_stream stream,
                                     g5_error *err) {
    if (!x || !rows || !out) return BAD("gather_rows: NULL pointer");
    if (n < 1 || k < 1 || n_rows_x < 1 || ldx < k || ldo < k)
        return BAD("gather_rows: n=%lld k=%lld n_rows_x=%lld ldx=%lld ldo=%lld", (long long)n, (long long)k,
                   (long long)n_rows_x, (long long)ldx, (long long)ldo);
    if (n > INT64_MAX / k) return BAD("gather_rows: n * k overflows");
    k_gather_rows<<<grid_for(n * k, 256), 256, 0, (cudaStream_t)stream>>>(x, ldx, n_rows_x, rows, n, k, out, ldo);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}

extern "C" g5_status cuk_scatter_add_rows(const float *d, int64_t ldd, const int32_t *rows, const float *rw,
                                          int64_t n, int64_t m, float *y, int64_t ldy, int64_t n_rows_y,
                                          cuk_stream stream, g5_error *err) {
    if (!d || !rows || !rw || !y) return BAD("scatter_add_rows: NULL pointer");
    if (n < 1 || m < 1 || n_rows_y < 1 || ldd < m || ldy < m)
        return BAD("scatter_add_rows: n=%lld m=%lld n_rows_y=%lld ldd=%lld ldy=%lld", (long long)n, (long long)m,
                   (long long)n_rows_y, (long long)ldd, (long long)ldy);
    if (n > INT64_MAX / m) return BAD("scatter_add_rows: n * m overflows");
    k_scatter_add_rows<<<grid_for(n * m, 256), 256, 0, (cudaStream_t)stream>>>(d, ldd, rows, rw, n, m, y, ldy,
                                                                               n_rows_y);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}
