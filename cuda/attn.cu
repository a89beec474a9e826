/* MLA absorbed attention over the latent cache (cuda/cuk_model.h): query absorption through
 * W_UK and the attention itself, for prefill and decode alike (each query token attends the
 * key positions the indexer chose for it). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "cuda/cuk_internal.cuh"
#include "cuda/cuk_model.h"

#define BAD(...) g5_fail(err, G5_ERR_INVALID_ARG, __VA_ARGS__)

namespace {

constexpr int ABS_TOK = 8;      /* tokens per absorb block: each W_UK element is read once for all */
constexpr int ABS_THREADS = 256;
constexpr int ATT_THREADS = 128;
constexpr int ATT_WARPS = ATT_THREADS / 32;

__device__ __forceinline__ float nanf_() { return __int_as_float(0x7fc00000); }

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
                         int64_t n_pos, const int32_t *__restrict__ sel,
                         int64_t ld_sel, const int32_t *__restrict__ n_sel, int32_t max_sel,
                         float scale, float *__restrict__ out) {
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
    const int ns = n_sel[t];
    if (threadIdx.x == 0) bad = ns < 1 || ns > max_sel;
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
        const int32_t s = sel[(int64_t)t * ld_sel + j];
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

} // namespace

#define LAUNCH_CHECK(what)                                                                    \
    do {                                                                                      \
        cudaError_t e_ = cudaGetLastError();                                                  \
        if (e_ != cudaSuccess)                                                                \
            return g5_fail(err, G5_ERR_INTERNAL, "%s: %s", what, cudaGetErrorString(e_));     \
    } while (0)

static g5_status check_dims(const char *what, const cuk_mla_dims *d, g5_error *err) {
    if (!d) return BAD("%s: no dims", what);
    if (d->n_tok < 1 || d->n_tok > 65535 * ABS_TOK) return BAD("%s: n_tok=%d out of range", what, d->n_tok);
    if (d->n_head < 1 || d->n_head > 65535) return BAD("%s: n_head=%d out of range", what, d->n_head);
    if (d->nope < 1 || d->nope > 1024) return BAD("%s: nope=%d outside 1..1024", what, d->nope);
    if (d->rope < 0 || d->rope > 1024) return BAD("%s: rope=%d outside 0..1024", what, d->rope);
    if (d->kv_lora < 1 || d->kv_lora > 8192) return BAD("%s: kv_lora=%d outside 1..8192", what, d->kv_lora);
    return G5_OK;
}

extern "C" g5_status cuk_mla_absorb(const cuk_mla_dims *d, const float *q, const float *kvb,
                                    int32_t head_rows, float *qlat, cuk_stream stream,
                                    g5_error *err) {
    g5_status st = check_dims("mla_absorb", d, err);
    if (st) return st;
    if (!q || !kvb || !qlat) return BAD("mla_absorb: NULL pointer");
    if (head_rows < d->nope) return BAD("mla_absorb: head_rows=%d < nope=%d", head_rows, d->nope);
    const size_t smem = (size_t)ABS_TOK * d->nope * sizeof(float);
    dim3 grid((unsigned)d->n_head, (unsigned)((d->n_tok + ABS_TOK - 1) / ABS_TOK));
    k_absorb<<<grid, ABS_THREADS, smem, (cudaStream_t)stream>>>(*d, q, kvb, head_rows, qlat);
    LAUNCH_CHECK("mla_absorb");
    return G5_OK;
}

template <typename T>
static g5_status attend_t(const cuk_mla_dims *d, const float *q, const float *qlat, const T *lat,
                          const float *fresh, int64_t fresh0, int64_t n_pos, const int32_t *sel, int64_t ld_sel, const int32_t *n_sel,
                          int32_t max_sel, float scale, float *out, size_t smem, cudaStream_t st,
                          g5_error *err) {
    if (smem > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(k_attend<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return g5_fail(err, G5_ERR_INTERNAL, "mla_attend: %zu bytes of shared memory: %s", smem, cudaGetErrorString(e));
    }
    dim3 grid((unsigned)d->n_head, (unsigned)d->n_tok);
    k_attend<T><<<grid, ATT_THREADS, smem, st>>>(*d, q, qlat, lat, fresh, fresh0, n_pos, sel, ld_sel, n_sel, max_sel, scale, out);
    LAUNCH_CHECK("mla_attend");
    return G5_OK;
}

extern "C" g5_status cuk_mla_attend(const cuk_mla_dims *d, const float *q, const float *qlat,
                                    const void *lat, uint32_t lat_type, int64_t n_pos,
                                    const int32_t *sel, int64_t ld_sel, const int32_t *n_sel,
                                    int32_t max_sel, float scale, float *out, cuk_stream stream,
                                    g5_error *err) {
    return cuk_mla_attend_fresh(d, q, qlat, lat, lat_type, NULL, n_pos, n_pos, sel, ld_sel, n_sel, max_sel, scale,
                                out, stream, err);
}

extern "C" g5_status cuk_mla_attend_fresh(const cuk_mla_dims *d, const float *q, const float *qlat,
                                          const void *lat, uint32_t lat_type, const float *fresh,
                                          int64_t fresh0, int64_t n_pos, const int32_t *sel,
                                          int64_t ld_sel, const int32_t *n_sel, int32_t max_sel,
                                          float scale, float *out, cuk_stream stream, g5_error *err) {
    g5_status st = check_dims("mla_attend", d, err);
    if (st) return st;
    if (!q || !qlat || !lat || !sel || !n_sel || !out) return BAD("mla_attend: NULL pointer");
    if (n_pos < 1) return BAD("mla_attend: n_pos=%lld must be positive", (long long)n_pos);
    if (fresh && (fresh0 < 0 || fresh0 >= n_pos))
        return BAD("mla_attend: fresh0=%lld outside 0..n_pos-1 (%lld)", (long long)fresh0, (long long)n_pos - 1);
    if (!fresh) fresh0 = n_pos;
    if (max_sel < 1 || max_sel > 16384 || ld_sel < max_sel)
        return BAD("mla_attend: max_sel=%d outside 1..16384 or above ld_sel=%lld", max_sel, (long long)ld_sel);
    if (d->n_tok > 65535) return BAD("mla_attend: n_tok=%d above 65535", d->n_tok);
    const size_t smem = (size_t)(d->kv_lora + d->rope) * sizeof(float) + (size_t)max_sel * (sizeof(float) + sizeof(int32_t));
    const cudaStream_t cs = (cudaStream_t)stream;
    switch (lat_type) {
    case CUK_F32: return attend_t(d, q, qlat, (const float *)lat, fresh, fresh0, n_pos, sel, ld_sel, n_sel, max_sel, scale, out, smem, cs, err);
    case CUK_BF16: return attend_t(d, q, qlat, (const __nv_bfloat16 *)lat, fresh, fresh0, n_pos, sel, ld_sel, n_sel, max_sel, scale, out, smem, cs, err);
    case CUK_F16: return attend_t(d, q, qlat, (const __half *)lat, fresh, fresh0, n_pos, sel, ld_sel, n_sel, max_sel, scale, out, smem, cs, err);
    default: return BAD("mla_attend: lat_type %u is none of CUK_F32, CUK_BF16, CUK_F16", lat_type);
    }
}
