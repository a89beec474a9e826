/* The prefill GEMM path (gpu_linear.h). Compiled to nothing unless G5_WITH_CUDA. */
#ifdef G5_WITH_CUDA

#include "runtime/gpu/gpu_linear.h"

#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuk_gemm.h"
#include "cuda/cuk_model.h"
#include "format/quant.h"
#include "runtime/gpu/gpu_int.h"


/* Why 32 tokens: the GEMV kernels share one pass over a weight among up to CUK_GEMV_MAX_N = 16
 * input rows, so up to 16 tokens read each weight once, and the GEMM path cannot beat that (it
 * reads the weight once too and also writes and reads a dequantized copy). From 32 tokens on the
 * GEMV path reads every weight at least twice and does its multiply-adds on the CUDA cores one
 * decoded element at a time; a GEMM pays the dequantization (about 8 bytes of traffic per
 * element in float32, versus ~0.6 for a Q4_K element per GEMV pass) once and then runs at the
 * GEMM rate. The float32 GEMM runs on the same CUDA cores, so its gain grows slowly with n; the
 * TF32/bf16 tensor-core computes gain quickly. tests/gpu/test_gpu_model.c times both paths at
 * GLM-5's shapes over n (the "gemm bench" lines) for tuning this. */
enum { DEFAULT_MIN_TOKENS = 32, DEFAULT_MIN_ROWS_EXPERT = 32 };
#define DEFAULT_TILE_KB 262144u

/* A device buffer that only grows. */
typedef struct dbuf {
    void *p;
    size_t cap;
} dbuf;

struct gl_lin {
    gl_lin_cfg cfg;
    cuk_blas *blas;
    cuk_stream st;
    rt_gpu_info *info;
    int armed;
    dbuf tile32;                 /* dequantized weight rows, float32 */
    dbuf tile16;                 /* the same rounded to bf16 (BF16 compute) */
    dbuf xb;                     /* bf16 copy of a product's input */
    dbuf grp;                    /* expert token lists, weights, counts */
    dbuf ex;                     /* per-expert gathered inputs, gate, up, down outputs */
    int32_t *hcnt;               /* host copy of the counts */
    size_t hcnt_cap;
};

static uint64_t up256(uint64_t b) { return (b + 255) & ~(uint64_t)255; }

/* The buffer holds at least `need` bytes. Work enqueued earlier may still read it: the stream is
 * drained before the old one is freed. */
static g5_status grow(gl_lin *l, dbuf *b, size_t need, const char *what, g5_error *err) {
    if (need <= b->cap) return G5_OK;
    if (b->p) {
        CUK_CHECK(cudaStreamSynchronize((cudaStream_t)l->st));
        cudaFree(b->p);
        b->p = NULL;
        b->cap = 0;
    }
    const size_t cap = (size_t)up256(need);
    if (cudaMalloc(&b->p, cap) != cudaSuccess) {
        (void)cudaGetLastError();
        return g5_fail(err, G5_ERR_NOMEM, "prefill GEMM scratch (%s): %zu bytes", what, cap);
    }
    b->cap = cap;
    return G5_OK;
}

static g5_status env_int(const char *name, int64_t *out, int *set, g5_error *err) {
    *set = 0;
    const char *v = getenv(name);
    if (!v || !*v) return G5_OK;
    if (!strcmp(v, "off")) {
        *out = 0;
        *set = 1;
        return G5_OK;
    }
    char *end = NULL;
    errno = 0;
    const long long x = strtoll(v, &end, 10);
    if (errno || *end || x > INT32_MAX)
        return g5_fail(err, G5_ERR_INVALID_ARG, "%s=%s: want a token count (or 0/off)", name, v);
    *out = x > 0 ? x : 0;
    *set = 1;
    return G5_OK;
}

g5_status gl_lin_cfg_resolve(const rt_gpu_opts *o, gl_lin_cfg *c, g5_error *err) {
    memset(c, 0, sizeof *c);
    rt_gpu_gemm g = o->gemm;
    if (g == RT_GPU_GEMM_DEFAULT) {
        const char *v = getenv("G5_PREFILL_GEMM");
        if (v && *v) {
            if (!strcmp(v, "f32")) g = RT_GPU_GEMM_F32;
            else if (!strcmp(v, "tf32")) g = RT_GPU_GEMM_TF32;
            else if (!strcmp(v, "bf16")) g = RT_GPU_GEMM_BF16;
            else return g5_fail(err, G5_ERR_INVALID_ARG, "G5_PREFILL_GEMM=%s: want f32, tf32 or bf16", v);
        }
    }
    if (g == RT_GPU_GEMM_DEFAULT) g = o->precision == RT_GPU_BF16ACT ? RT_GPU_GEMM_BF16 : RT_GPU_GEMM_F32;
    if (g != RT_GPU_GEMM_F32 && g != RT_GPU_GEMM_TF32 && g != RT_GPU_GEMM_BF16)
        return g5_fail(err, G5_ERR_INVALID_ARG, "gemm compute %d", (int)g);
    if (o->precision == RT_GPU_PRECISE) g = RT_GPU_GEMM_F32;
    c->mode = g == RT_GPU_GEMM_TF32 ? CUK_GEMM_TF32 : g == RT_GPU_GEMM_BF16 ? CUK_GEMM_BF16 : CUK_GEMM_F32;
    int set;
    if (o->gemm_min < 0) {
        c->min_tokens = 0;
    } else if (o->gemm_min > 0) {
        c->min_tokens = o->gemm_min;
    } else {
        CK(env_int("G5_PREFILL_GEMM_MIN", &c->min_tokens, &set, err));
        if (!set) c->min_tokens = DEFAULT_MIN_TOKENS;
    }
    if (o->gemm_min_expert > 0) {
        c->min_rows_expert = o->gemm_min_expert;
    } else if (o->gemm_min_expert < 0) {
        c->min_rows_expert = INT32_MAX;
    } else {
        CK(env_int("G5_PREFILL_GEMM_MIN_EXPERT", &c->min_rows_expert, &set, err));
        if (!set) c->min_rows_expert = DEFAULT_MIN_ROWS_EXPERT;
        if (c->min_rows_expert == 0) c->min_rows_expert = INT32_MAX; /* "off": every expert by GEMV */
    }
    c->tile_bytes = (uint64_t)(o->gemm_tile_kb ? o->gemm_tile_kb : DEFAULT_TILE_KB) * 1024u;
    return G5_OK;
}

const char *gl_lin_mode_name(uint32_t mode) {
    return mode == CUK_GEMM_TF32 ? "tf32" : mode == CUK_GEMM_BF16 ? "bf16" : "f32";
}

g5_status gl_lin_create(const gl_lin_cfg *c, cuk_stream stream, rt_gpu_info *info, gl_lin **out,
                        g5_error *err) {
    *out = NULL;
    gl_lin *l = calloc(1, sizeof *l);
    if (!l) return g5_fail(err, G5_ERR_NOMEM, "prefill GEMM state");
    l->cfg = *c;
    l->st = stream;
    l->info = info;
    /* no handle (nor the workspace cuBLAS keeps with it) when the path is off */
    if (c->min_tokens > 0) {
        g5_status st = cuk_blas_create(&l->blas, err);
        if (st) {
            free(l);
            return st;
        }
    }
    *out = l;
    return G5_OK;
}

void gl_lin_free(gl_lin *l) {
    if (!l) return;
    if (l->tile32.p || l->tile16.p || l->xb.p || l->grp.p || l->ex.p) cudaStreamSynchronize((cudaStream_t)l->st);
    cudaFree(l->tile32.p);
    cudaFree(l->tile16.p);
    cudaFree(l->xb.p);
    cudaFree(l->grp.p);
    cudaFree(l->ex.p);
    cuk_blas_free(l->blas);
    free(l->hcnt);
    free(l);
}

void gl_lin_arm(gl_lin *l, int on) {
    if (l) l->armed = on;
}

int gl_lin_use(const gl_lin *l, int64_t n) {
    if (!l || !l->armed || !l->blas || l->cfg.min_tokens <= 0 || n < l->cfg.min_tokens) return 0;
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing((cudaStream_t)l->st, &cs) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return cs == cudaStreamCaptureStatusNone;
}

static g5_status gemm(gl_lin *l, uint32_t mode, const void *w, int64_t ldw, const void *x, int64_t ldx, int64_t k,
                      int64_t m, int64_t n, float *y, int64_t ldy, g5_error *err) {
    const cuk_gemm_args a = {mode, w, ldw, x, ldx, k, m, n, y, ldy};
    CK(cuk_gemm(l->blas, &a, l->st, err));
    if (l->info) l->info->gemm_calls++;
    return G5_OK;
}

g5_status gl_lin_matmul(gl_lin *l, const gl_wmat *w, const float *x, int64_t ldx, int64_t n, float *y,
                        int64_t ldy, int keep_f32, g5_error *err) {
    if (!l->blas) return g5_fail(err, G5_ERR_INTERNAL, "prefill GEMM path used while off");
    const uint32_t mode = keep_f32 ? CUK_GEMM_F32 : l->cfg.mode;
    const int bf = mode == CUK_GEMM_BF16;
    const int64_t k = w->k, m = w->m;
    if (k < 1 || m < 1 || n < 1) return g5_fail(err, G5_ERR_INVALID_ARG, "matmul: k=%lld m=%lld n=%lld",
                                                (long long)k, (long long)m, (long long)n);
    const void *xin = x;
    int64_t ldxin = ldx;
    if (bf) {
        CK(grow(l, &l->xb, (size_t)n * (size_t)k * 2, "bf16 input", err));
        CK(cuk_convert(x, ldx, l->xb.p, CUK_BF16, k, n, k, l->st, err));
        xin = l->xb.p;
        ldxin = k;
    }
    if ((w->type == QT_F32 && !bf) || (w->type == QT_BF16 && bf))
        return gemm(l, mode, w->w, k, xin, ldxin, k, m, n, y, ldy, err);
    uint64_t rb = 0;
    if (quant_row_bytes(w->type, (uint64_t)k, &rb))
        return g5_fail(err, G5_ERR_INVALID_ARG, "matmul: %s rows of %lld elements", quant_type_name(w->type),
                       (long long)k);
    /* rows per chunk: the float32 tile (rc x k) within tile_bytes */
    int64_t rc = (int64_t)(l->cfg.tile_bytes / ((uint64_t)k * 4));
    if (rc < 1) rc = 1;
    if (rc > m) rc = m;
    CK(grow(l, &l->tile32, (size_t)rc * (size_t)k * 4, "weight tile", err));
    if (bf) CK(grow(l, &l->tile16, (size_t)rc * (size_t)k * 2, "bf16 weight tile", err));
    for (int64_t r0 = 0; r0 < m; r0 += rc) {
        const int64_t c = m - r0 < rc ? m - r0 : rc;
        const uint8_t *wr = (const uint8_t *)w->w + (uint64_t)r0 * rb;
        CK(cuk_dequant_rows(w->type, wr, k, c, NULL, c, l->tile32.p, k, l->st, err));
        const void *tile = l->tile32.p;
        if (bf) {
            CK(cuk_convert(l->tile32.p, k, l->tile16.p, CUK_BF16, k, c, k, l->st, err));
            tile = l->tile16.p;
        }
        CK(gemm(l, mode, tile, k, xin, ldxin, k, c, n, y + r0, ldy, err));
    }
    return G5_OK;
}

/* y = W x in launches of up to CUK_GEMV_MAX_N rows (float32 inputs). */
static g5_status gemv_rows(gl_lin *l, const gl_wmat *w, const float *x, int64_t ldx, int64_t n, float *y,
                           int64_t ldy, g5_error *err) {
    for (int64_t t0 = 0; t0 < n; t0 += CUK_GEMV_MAX_N) {
        const int64_t c = n - t0 < CUK_GEMV_MAX_N ? n - t0 : CUK_GEMV_MAX_N;
        const cuk_gemv_args a = {w->type, w->w, w->k, w->m, x + t0 * ldx, CUK_ACT_F32, ldx, (int32_t)c,
                                 y + t0 * ldy, ldy};
        CK(cuk_gemv(&a, l->st, err));
    }
    return G5_OK;
}

g5_status gl_lin_moe(gl_lin *l, const gl_moe_args *a, g5_error *err) {
    if (!l->blas) return g5_fail(err, G5_ERR_INTERNAL, "prefill GEMM path used while off");
    const int64_t n = a->n, E = a->E, FE = a->FE, NL = a->n_local;
    if (n < 1 || E < 1 || FE < 1 || NL < 1 || a->top_k < 1)
        return g5_fail(err, G5_ERR_INVALID_ARG, "moe: n=%lld E=%lld FE=%lld n_local=%lld top_k=%d", (long long)n,
                       (long long)E, (long long)FE, (long long)NL, a->top_k);
    uint64_t rb_gu = 0, rb_d = 0;
    if (quant_row_bytes(a->gu_type, (uint64_t)E, &rb_gu) || quant_row_bytes(a->down_type, (uint64_t)FE, &rb_d))
        return g5_fail(err, G5_ERR_INVALID_ARG, "moe: expert row sizes");
    /* token rows per expert chunk: gathered inputs, gate, up and down outputs within tile_bytes
     * (16 .. 4096 rows; an expert with more rows is run in several chunks) */
    int64_t RC = (int64_t)(l->cfg.tile_bytes / ((uint64_t)(2 * E + 2 * FE) * 4));
    if (RC < 16) RC = 16;
    if (RC > 4096) RC = 4096;
    if (RC > n) RC = n;
    const uint64_t sz_rows = up256((uint64_t)NL * n * 4), sz_cnt = up256((uint64_t)(NL + 1) * 4);
    CK(grow(l, &l->grp, sz_rows * 2 + sz_cnt, "expert lists", err));
    const uint64_t sz_x = up256((uint64_t)RC * E * 4), sz_h = up256((uint64_t)RC * FE * 4);
    CK(grow(l, &l->ex, sz_x * 2 + sz_h * 2, "expert rows", err));
    if ((size_t)(NL + 1) > l->hcnt_cap) {
        int32_t *h = realloc(l->hcnt, (size_t)(NL + 1) * sizeof *h);
        if (!h) return g5_fail(err, G5_ERR_NOMEM, "expert counts");
        l->hcnt = h;
        l->hcnt_cap = (size_t)(NL + 1);
    }
    int32_t *rows = l->grp.p;
    float *rw = (float *)(void *)((uint8_t *)l->grp.p + sz_rows);
    int32_t *cnt = (int32_t *)(void *)((uint8_t *)l->grp.p + 2 * sz_rows);
    float *xs = l->ex.p;
    float *ds = (float *)(void *)((uint8_t *)l->ex.p + sz_x);
    float *gs = (float *)(void *)((uint8_t *)l->ex.p + 2 * sz_x);
    float *us = (float *)(void *)((uint8_t *)l->ex.p + 2 * sz_x + sz_h);
    const cudaStream_t st = (cudaStream_t)l->st;

    CUK_CHECK(cudaMemset2DAsync(a->y, (size_t)a->ldy * 4, 0, (size_t)E * 4, (size_t)n, st));
    const cuk_moe_group_args ga = {a->ids, a->wts, (int32_t)n, a->top_k, a->top_k, a->n_expert, a->exp0,
                                   (int32_t)NL, rows, rw, n, cnt};
    CK(cuk_moe_group(&ga, l->st, err));
    CUK_CHECK(cudaMemcpyAsync(l->hcnt, cnt, (size_t)(NL + 1) * 4, cudaMemcpyDeviceToHost, st));
    CUK_CHECK(cudaStreamSynchronize(st));
    if (l->hcnt[NL])
        return g5_fail(err, G5_ERR_INTERNAL, "moe: %d routed expert ids outside [0, %d)", l->hcnt[NL], a->n_expert);
    for (int64_t e = 0; e < NL; e++) {
        const int64_t c = l->hcnt[e];
        if (c <= 0) continue;
        const int by_gemm = c >= l->cfg.min_rows_expert;
        const gl_wmat wg = {a->gu_type, (const uint8_t *)a->w_gate + (uint64_t)e * FE * rb_gu, E, FE};
        const gl_wmat wu = {a->gu_type, (const uint8_t *)a->w_up + (uint64_t)e * FE * rb_gu, E, FE};
        const gl_wmat wd = {a->down_type, (const uint8_t *)a->w_down + (uint64_t)e * E * rb_d, FE, E};
        for (int64_t j0 = 0; j0 < c; j0 += RC) {
            const int64_t cc = c - j0 < RC ? c - j0 : RC;
            const int32_t *er = rows + e * n + j0;
            const float *ew = rw + e * n + j0;
            CK(cuk_gather_rows(a->x, a->ldx, n, er, cc, E, xs, E, l->st, err));
            if (by_gemm) {
                CK(gl_lin_matmul(l, &wg, xs, E, cc, gs, FE, 0, err));
                CK(gl_lin_matmul(l, &wu, xs, E, cc, us, FE, 0, err));
            } else {
                CK(gemv_rows(l, &wg, xs, E, cc, gs, FE, err));
                CK(gemv_rows(l, &wu, xs, E, cc, us, FE, err));
            }
            CK(cuk_silu_mul(gs, FE, us, FE, gs, FE, cc, FE, l->st, err));
            if (by_gemm) CK(gl_lin_matmul(l, &wd, gs, FE, cc, ds, E, 0, err));
            else CK(gemv_rows(l, &wd, gs, FE, cc, ds, E, err));
            CK(cuk_scatter_add_rows(ds, E, er, ew, cc, E, a->y, a->ldy, n, l->st, err));
        }
        if (!by_gemm && l->info) l->info->gemm_expert_gemv++;
    }
    return G5_OK;
}

#else
typedef int gl_linear_unused_;
#endif
