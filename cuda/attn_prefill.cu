/* Row kernels of the tensor-core prefill attention and indexer (cuda/cuk_prefill.h). The products
 * themselves are cuBLAS calls (cuk_gemm_ex) made by runtime/gpu/gpu_linear.c. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "cuda/cuk_internal.cuh"
#include "cuda/cuk_model.h"
#include "cuda/cuk_prefill.h"

#define BAD(...) g5_fail(err, G5_ERR_INVALID_ARG, __VA_ARGS__)

namespace {

constexpr int SM_THREADS = 256;

unsigned grid_for(int64_t n, int threads) { return (unsigned)((n + threads - 1) / threads); }

/* The 16-bit product inputs: bf16 or fp16, rounded to nearest even. */
__device__ __forceinline__ void st16(__nv_bfloat16 *p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }
__device__ __forceinline__ void st16(__half *p, int64_t i, float v) { p[i] = __float2half_rn(v); }

/* One thread per element of qb (token t, head h, column c), coalesced along c. */
template <typename T>
__global__ void k_pack_q(const float *__restrict__ q, const float *__restrict__ qlat, int64_t n_rows, int nope,
                         int rope, int kv_lora, T *__restrict__ qb) {
    const int64_t w = kv_lora + rope;
    const int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= n_rows * w) return;
    const int64_t r = g / w, c = g % w; /* r = t * n_head + h */
    const float v = c < kv_lora ? qlat[r * kv_lora + c] : q[r * (nope + rope) + nope + (c - kv_lora)];
    st16(qb, g, v);
}

/* One thread per element of kb (key j, column c). */
template <typename T>
__global__ void k_pack_k(const void *__restrict__ lat, uint32_t lat_type, const float *__restrict__ fresh,
                         int64_t fresh0, int64_t n_pos, int w, T *__restrict__ kb) {
    const int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= n_pos * w) return;
    const int64_t j = g / w;
    float v;
    if (fresh && j >= fresh0) v = fresh[g - fresh0 * w];
    else if (lat_type == CUK_BF16) v = __bfloat162float(((const __nv_bfloat16 *)lat)[g]);
    else if (lat_type == CUK_F16) v = __half2float(((const __half *)lat)[g]);
    else v = ((const float *)lat)[g];
    st16(kb, g, v);
}

/* Block-wide max / sum of one value per thread (SM_THREADS threads). */
__device__ float block_max(float v, float *red) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float m = red[0];
    for (int i = 1; i < SM_THREADS / 32; i++) m = fmaxf(m, red[i]);
    return m;
}

__device__ float block_sum(float v, float *red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = 0.0f;
    for (int i = 0; i < SM_THREADS / 32; i++) s += red[i];
    return s;
}

/* Grid: one block of SM_THREADS per query row i (token t = t0 + i / n_head, one head). The
 * threads stride over the row's keys: dense rows over columns 0 .. p, sparse rows over the
 * selection list (after zeroing the row); max, then sum of exp, in float32, then p = e / sum
 * stored as bf16. */
template <typename T>
__global__ void __launch_bounds__(SM_THREADS)
    k_mla_softmax(const float *__restrict__ s, T *__restrict__ pb, int64_t ld, int64_t n_cols,
                  int n_head, int64_t t0, int64_t pos0, const int32_t *__restrict__ sel, int64_t ld_sel,
                  const int32_t *__restrict__ n_sel, int max_sel, float scale) {
    __shared__ float red[SM_THREADS / 32];
    const int64_t i = blockIdx.x, t = t0 + i / n_head, p = pos0 + t;
    const float *sr = s + i * ld;
    T *pr = pb + i * ld;
    const int ns = n_sel[t];
    const bool dense = (int64_t)ns == p + 1;
    const int32_t *st = sel + t * ld_sel;
    const float nan = __int_as_float(0x7fc00000);
    if (ns < 1 || ns > max_sel) {
        for (int64_t j = threadIdx.x; j < n_cols; j += SM_THREADS) st16(pr, j, nan);
        return;
    }
    const int64_t cnt = dense ? p + 1 : ns;
    float m = -INFINITY;
    bool bad = false;
    for (int64_t u = threadIdx.x; u < cnt; u += SM_THREADS) {
        const int64_t j = dense ? u : st[u];
        if (j < 0 || j > p) bad = true;
        else m = fmaxf(m, __fmul_rn(sr[j], scale));
    }
    bad = __syncthreads_or(bad);
    m = block_max(m, red);
    float sum = 0.0f;
    for (int64_t u = threadIdx.x; u < cnt; u += SM_THREADS) {
        const int64_t j = dense ? u : st[u];
        if (j >= 0 && j <= p) sum += __expf(__fmul_rn(sr[j], scale) - m);
    }
    sum = block_sum(sum, red);
    const float inv = bad ? nan : 1.0f / sum;
    if (dense) {
        for (int64_t j = threadIdx.x; j < n_cols; j += SM_THREADS)
            st16(pr, j, j <= p ? __expf(__fmul_rn(sr[j], scale) - m) * inv : 0.0f);
        return;
    }
    for (int64_t j = threadIdx.x; j < n_cols; j += SM_THREADS) st16(pr, j, bad ? nan : 0.0f);
    __syncthreads();
    for (int64_t u = threadIdx.x; u < cnt && !bad; u += SM_THREADS) {
        const int64_t j = st[u];
        st16(pr, j, __expf(__fmul_rn(sr[j], scale) - m) * inv);
    }
}

/* One thread per (token t - t0, key j), coalesced along j: the head sum in head order. */
__global__ void k_idx_reduce(const float *__restrict__ s, int64_t ld_s, const float *__restrict__ w, int n_tok,
                             int n_head, int64_t t0, int64_t pos0, float *__restrict__ sc, int64_t ld_sc,
                             int64_t n_cols) {
    const int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= (int64_t)n_tok * n_cols) return;
    const int64_t tl = g / n_cols, j = g % n_cols, t = t0 + tl;
    if (j > pos0 + t) return;
    const float *wt = w + t * n_head;
    const float *sr = s + tl * n_head * ld_s + j;
    float acc = 0.0f;
    for (int h = 0; h < n_head; h++) {
        const float d = sr[(int64_t)h * ld_s];
        if (d > 0.0f) acc = __fadd_rn(acc, __fmul_rn(wt[h], d));
    }
    sc[t * ld_sc + j] = acc;
}

} // namespace


extern "C" g5_status cuk_mla_pack_q(const cuk_mla_pack_q_args *a, cuk_stream stream, g5_error *err) {
    if (!a || !a->q || !a->qlat || !a->qb) return BAD("mla_pack_q: NULL pointer");
    if (a->n_tok < 1 || a->n_head < 1 || a->nope < 0 || a->rope < 0 || a->kv_lora < 1)
        return BAD("mla_pack_q: n_tok=%d n_head=%d nope=%d rope=%d kv_lora=%d", a->n_tok, a->n_head, a->nope, a->rope,
                   a->kv_lora);
    if (a->et != CUK_BF16 && a->et != CUK_F16) return BAD("mla_pack_q: et %u", a->et);
    const int64_t rows = (int64_t)a->n_tok * a->n_head;
    const unsigned gr = grid_for(rows * (a->kv_lora + a->rope), 256);
    if (a->et == CUK_BF16)
        k_pack_q<<<gr, 256, 0, (cudaStream_t)stream>>>(a->q, a->qlat, rows, a->nope, a->rope, a->kv_lora,
                                                       (__nv_bfloat16 *)a->qb);
    else
        k_pack_q<<<gr, 256, 0, (cudaStream_t)stream>>>(a->q, a->qlat, rows, a->nope, a->rope, a->kv_lora,
                                                       (__half *)a->qb);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}

extern "C" g5_status cuk_mla_pack_k(const cuk_mla_pack_k_args *a, cuk_stream stream, g5_error *err) {
    if (!a || !a->kb || (!a->lat && (!a->fresh || a->fresh0 > 0))) return BAD("mla_pack_k: NULL pointer");
    if (a->lat_type != CUK_F32 && a->lat_type != CUK_BF16 && a->lat_type != CUK_F16)
        return BAD("mla_pack_k: lat_type %u", a->lat_type);
    if (a->n_pos < 1 || a->w < 1 || a->fresh0 < 0 || a->fresh0 > a->n_pos)
        return BAD("mla_pack_k: n_pos=%lld w=%d fresh0=%lld", (long long)a->n_pos, a->w, (long long)a->fresh0);
    if (a->et != CUK_BF16 && a->et != CUK_F16) return BAD("mla_pack_k: et %u", a->et);
    const unsigned gr = grid_for(a->n_pos * a->w, 256);
    if (a->et == CUK_BF16)
        k_pack_k<<<gr, 256, 0, (cudaStream_t)stream>>>(a->lat, a->lat_type, a->fresh, a->fresh0, a->n_pos, a->w,
                                                       (__nv_bfloat16 *)a->kb);
    else
        k_pack_k<<<gr, 256, 0, (cudaStream_t)stream>>>(a->lat, a->lat_type, a->fresh, a->fresh0, a->n_pos, a->w,
                                                       (__half *)a->kb);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}

extern "C" g5_status cuk_mla_softmax(const cuk_mla_softmax_args *a, cuk_stream stream, g5_error *err) {
    if (!a || !a->s || !a->pb || !a->sel || !a->n_sel) return BAD("mla_softmax: NULL pointer");
    if (a->n_rows < 1 || a->n_head < 1 || a->n_rows % a->n_head || a->n_cols < 1 || a->ld < a->n_cols ||
        a->t0 < 0 || a->pos0 < 0 || a->max_sel < 1 || a->ld_sel < a->max_sel)
        return BAD("mla_softmax: n_rows=%d n_head=%d n_cols=%lld ld=%lld t0=%lld pos0=%lld max_sel=%d ld_sel=%lld",
                   a->n_rows, a->n_head, (long long)a->n_cols, (long long)a->ld, (long long)a->t0,
                   (long long)a->pos0, a->max_sel, (long long)a->ld_sel);
    if (a->pos0 + a->t0 + a->n_rows / a->n_head > a->n_cols)
        return BAD("mla_softmax: %lld columns for the last token's %lld keys", (long long)a->n_cols,
                   (long long)(a->pos0 + a->t0 + a->n_rows / a->n_head));
    if (a->et != CUK_BF16 && a->et != CUK_F16) return BAD("mla_softmax: et %u", a->et);
    if (a->et == CUK_BF16)
        k_mla_softmax<<<(unsigned)a->n_rows, SM_THREADS, 0, (cudaStream_t)stream>>>(
            a->s, (__nv_bfloat16 *)a->pb, a->ld, a->n_cols, a->n_head, a->t0, a->pos0, a->sel, a->ld_sel, a->n_sel,
            a->max_sel, a->scale);
    else
        k_mla_softmax<<<(unsigned)a->n_rows, SM_THREADS, 0, (cudaStream_t)stream>>>(
            a->s, (__half *)a->pb, a->ld, a->n_cols, a->n_head, a->t0, a->pos0, a->sel, a->ld_sel, a->n_sel,
            a->max_sel, a->scale);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}

extern "C" g5_status cuk_idx_reduce(const cuk_idx_reduce_args *a, cuk_stream stream, g5_error *err) {
    if (!a || !a->s || !a->w || !a->sc) return BAD("idx_reduce: NULL pointer");
    if (a->n_tok < 1 || a->n_head < 1 || a->t0 < 0 || a->pos0 < 0)
        return BAD("idx_reduce: n_tok=%d n_head=%d t0=%lld pos0=%lld", a->n_tok, a->n_head, (long long)a->t0,
                   (long long)a->pos0);
    const int64_t n_cols = a->pos0 + a->t0 + a->n_tok;
    if (a->ld_s < n_cols || a->ld_sc < n_cols)
        return BAD("idx_reduce: ld_s=%lld ld_sc=%lld below %lld keys", (long long)a->ld_s, (long long)a->ld_sc,
                   (long long)n_cols);
    k_idx_reduce<<<grid_for((int64_t)a->n_tok * n_cols, 256), 256, 0, (cudaStream_t)stream>>>(
        a->s, a->ld_s, a->w, a->n_tok, a->n_head, a->t0, a->pos0, a->sc, a->ld_sc, n_cols);
    CUK_CHECK(cudaGetLastError());
    return G5_OK;
}
