/* The prefill GEMM path (gpu_linear.h). Compiled to nothing unless G5_WITH_CUDA. */
#ifdef G5_WITH_CUDA

#include "runtime/gpu/gpu_linear.h"

#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuk_gemm.h"
#include "cuda/cuk_model.h"
#include "cuda/cuk_prefill.h"
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
    dbuf tile16;                 /* the same rounded to bf16 or fp16 (16-bit computes) */
    dbuf xb;                     /* 16-bit copy of a product's input */
    dbuf grp;                    /* expert token lists, weights, counts */
    dbuf ex;                     /* per-expert gathered inputs, gate, up, down outputs */
    dbuf att;                    /* fast prefill attention/indexer: packed keys, queries, scores */
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

g5_status gl_lin_cfg_resolve(const rt_gpu_opts *o, gl_lin_cfg *c, g5_error *err) {
    memset(c, 0, sizeof *c);
    rt_gpu_gemm g = o->gemm;
    if (g == RT_GPU_GEMM_DEFAULT) g = o->precision == RT_GPU_PRECISE ? RT_GPU_GEMM_F32 : RT_GPU_GEMM_F16;
    if (g != RT_GPU_GEMM_F32 && g != RT_GPU_GEMM_F16)
        return g5_fail(err, G5_ERR_INVALID_ARG, "gemm compute %d (f32 or f16)", (int)g);
    if (o->precision == RT_GPU_PRECISE) g = RT_GPU_GEMM_F32;
    c->mode = g == RT_GPU_GEMM_F16 ? CUK_GEMM_F16 : CUK_GEMM_F32;
    c->min_tokens = o->gemm_min < 0 ? 0 : o->gemm_min > 0 ? o->gemm_min : DEFAULT_MIN_TOKENS;
    c->min_rows_expert = o->gemm_min_expert > 0   ? o->gemm_min_expert
                         : o->gemm_min_expert < 0 ? INT32_MAX
                                                  : DEFAULT_MIN_ROWS_EXPERT;
    c->tile_bytes = (uint64_t)(o->gemm_tile_kb ? o->gemm_tile_kb : DEFAULT_TILE_KB) * 1024u;
    return G5_OK;
}

const char *gl_lin_mode_name(uint32_t mode) {
    return mode == CUK_GEMM_F16 ? "f16" : "f32";
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
    if (l->tile32.p || l->tile16.p || l->xb.p || l->grp.p || l->ex.p || l->att.p) cudaStreamSynchronize((cudaStream_t)l->st);
    cudaFree(l->tile32.p);
    cudaFree(l->tile16.p);
    cudaFree(l->xb.p);
    cudaFree(l->grp.p);
    cudaFree(l->ex.p);
    cudaFree(l->att.p);
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

/* out [rows][k] = rows 0 .. rows - 1 of w (type, k elements each) dequantized: float32
 * (et CUK_F32) or rounded to et (CUK_BF16, CUK_F16). */
static g5_status dequant(gl_lin *l, uint32_t type, const void *w, int64_t k, int64_t rows, void *out, uint32_t et,
                         g5_error *err) {
    const cuk_dequant_rows_args a = {.w_type = type, .w = w, .k = k, .n_rows_w = rows, .n = rows, .out = out,
                                     .out_type = et, .ldo = k};
    return et == CUK_F32 ? cuk_dequant_rows(&a, l->st, err) : cuk_dequant_rows_16(&a, l->st, err);
}

g5_status gl_lin_matmul(gl_lin *l, const gl_wmat *w, const float *x, int64_t ldx, int64_t n, float *y,
                        int64_t ldy, int keep_f32, g5_error *err) {
    if (!l->blas) return g5_fail(err, G5_ERR_INTERNAL, "prefill GEMM path used while off");
    const uint32_t mode = keep_f32 ? CUK_GEMM_F32 : l->cfg.mode;
    const int bf = mode == CUK_GEMM_F16; /* 16-bit inputs */
    const uint32_t et = CUK_F16;
    const int64_t k = w->k, m = w->m;
    if (k < 1 || m < 1 || n < 1) return g5_fail(err, G5_ERR_INVALID_ARG, "matmul: k=%lld m=%lld n=%lld",
                                                (long long)k, (long long)m, (long long)n);
    const void *xin = x;
    int64_t ldxin = ldx;
    if (bf) {
        CK(grow(l, &l->xb, (size_t)n * (size_t)k * 2, "16-bit input", err));
        CK(cuk_convert(x, ldx, l->xb.p, et, k, n, k, l->st, err));
        xin = l->xb.p;
        ldxin = k;
    }
    if ((w->type == QT_F32 && !bf) || (w->type == QT_F16 && bf))
        return gemm(l, mode, w->w, k, xin, ldxin, k, m, n, y, ldy, err);
    uint64_t rb = 0;
    if (quant_row_bytes(w->type, (uint64_t)k, &rb))
        return g5_fail(err, G5_ERR_INVALID_ARG, "matmul: %s rows of %lld elements", quant_type_name(w->type),
                       (long long)k);
    /* rows per chunk: the tile (rc x k, float32 or 16-bit) within tile_bytes */
    const uint64_t es = bf ? 2 : 4;
    int64_t rc = (int64_t)(l->cfg.tile_bytes / ((uint64_t)k * es));
    if (rc < 1) rc = 1;
    if (rc > m) rc = m;
    dbuf *tb = bf ? &l->tile16 : &l->tile32;
    CK(grow(l, tb, (size_t)rc * (size_t)k * es, "weight tile", err));
    for (int64_t r0 = 0; r0 < m; r0 += rc) {
        const int64_t c = m - r0 < rc ? m - r0 : rc;
        const uint8_t *wr = (const uint8_t *)w->w + (uint64_t)r0 * rb;
        CK(dequant(l, w->type, wr, k, c, tb->p, bf ? et : CUK_F32, err));
        CK(gemm(l, mode, tb->p, k, xin, ldxin, k, c, n, y + r0, ldy, err));
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

/* Bound of the 16-bit copies of a batch of experts' gate, up and down weights (fast mode): the
 * experts of a layer are dequantized a batch at a time, one launch per tensor and batch. */
#define MOE_WTILE_BYTES (4ull << 30)

/* Whether cuk_moe_mm beats the dequantized copy + cuBLAS for a layer's experts: `tiles` row tiles
 * of CUK_MOE_MM_BM over `busy` experts with rows, `tot` rows. Both costs scale with an expert's
 * weights; measured on GLM-5's shapes (tests/gpu/bench_moe_mm, H200, bench/RESULTS.md): cuk_moe_mm
 * about 23.5 us per row tile (it decodes the expert's weights once per tile), the copy path about
 * 72.7 us per expert it decodes plus 0.081 us per row (cuBLAS). Few rows per expert (short prompts,
 * many experts: GLM-5 at 512 tokens has 16 rows per expert) go to cuk_moe_mm; many rows per
 * expert (pp4096 on 64 experts: 512) to the copy. Since session 46 a tile of 32 rows or fewer
 * costs about two fifths less than the 23.5 us (moe_mm.cu's wa form; a fifth in session 45), so
 * the test leans towards the copy there; it is kept as measured. */
static int moe_mm_wins(int64_t tiles, int64_t busy, int64_t tot) {
    return tiles * 2350 <= busy * 7270 + tot * 8;
}

int gl_lin_fast(const gl_lin *l) { return l && l->cfg.mode == CUK_GEMM_F16; }
static uint32_t et_of(const gl_lin *l) { (void)l; return CUK_F16; }

/* Fast mode's experts after grouping (l->hcnt holds the counts): one compact list of all local
 * experts' rows, their inputs gathered to 16 bits in one launch, then either cuk_moe_mm (gate+up
 * with SwiGLU, then down: two launches, weights decoded inside the tiles) or, where moe_mm_wins
 * says no or the types are others, each batch of experts' weights dequantized to 16 bits (three
 * launches per run of experts with rows), three 16-bit GEMMs per expert with rows and one SwiGLU;
 * one weighted combine for the whole layer. */
static g5_status moe_fast(gl_lin *l, const gl_moe_args *a, const int32_t *rows, const float *rw, const int32_t *cnt,
                          uint64_t rb_gu, uint64_t rb_d, g5_error *err) {
    const int64_t n = a->n, E = a->E, FE = a->FE, NL = a->n_local, U = a->top_k;
    int64_t tot = 0;
    for (int64_t e = 0; e < NL; e++) tot += l->hcnt[e];
    if (tot == 0) return G5_OK; /* y already zero */
    /* the form first: the float32 gate and up rows are the copy path's alone */
    const int aligned = (((uintptr_t)a->w_gate | (uintptr_t)a->w_up | (uintptr_t)a->w_down) & 15) == 0;
    int64_t busy = 0, tiles = 0;
    for (int64_t e = 0; e < NL; e++) {
        busy += l->hcnt[e] > 0;
        tiles += l->hcnt[e] > 0 ? (l->hcnt[e] + CUK_MOE_MM_BM - 1) / CUK_MOE_MM_BM : 0;
    }
    const int fused = aligned && tiles <= INT32_MAX && moe_mm_wins(tiles, busy, tot) &&
                      cuk_moe_mm_takes(a->gu_type, E, FE) && cuk_moe_mm_takes(a->down_type, FE, E);
    const uint64_t sz_cr = up256((uint64_t)tot * 4), sz_inv = up256((uint64_t)n * U * 4);
    const uint64_t sz_x = up256((uint64_t)tot * E * 2), sz_g = fused ? 0 : up256((uint64_t)tot * FE * 4);
    const uint64_t sz_h = up256((uint64_t)tot * FE * 2), sz_d = up256((uint64_t)tot * E * 4);
    CK(grow(l, &l->ex, 2 * sz_cr + sz_inv + sz_x + sz_h + sz_d + 2 * sz_g, "expert rows", err));
    uint8_t *p = l->ex.p;
    int32_t *crow = (int32_t *)(void *)p;
    float *crw = (float *)(void *)(p + sz_cr);
    int32_t *inv = (int32_t *)(void *)(p + 2 * sz_cr);
    void *xb = p + 2 * sz_cr + sz_inv;
    void *hb = (uint8_t *)xb + sz_x;
    float *ds = (float *)(void *)((uint8_t *)hb + sz_h);
    float *gs = (float *)(void *)((uint8_t *)ds + sz_d); /* copy path only */
    float *us = (float *)(void *)((uint8_t *)gs + sz_g);
    const cuk_moe_compact_args ca = {a->ids, (int32_t)n, (int32_t)U, a->exp0, (int32_t)NL, rows, rw, n, cnt,
                                     crow, crw, inv};
    CK(cuk_moe_compact(&ca, l->st, err));
    const uint32_t et = et_of(l), md = l->cfg.mode;
    CK(cuk_gather_rows_16(a->x, a->ldx, n, crow, tot, E, xb, et, l->st, err));
    if (fused) {
        /* weights decoded inside the product's tiles: no 16-bit copy of them in memory */
        const cuk_moe_mm_args gu = {a->gu_type, a->w_gate, a->w_up, E, FE, xb, cnt, (int32_t)NL, (int32_t)tiles,
                                    hb, FE};
        CK(cuk_moe_mm(&gu, l->st, err));
        const cuk_moe_mm_args dn = {a->down_type, a->w_down, NULL, FE, E, hb, cnt, (int32_t)NL, (int32_t)tiles,
                                    ds, E};
        CK(cuk_moe_mm(&dn, l->st, err));
        if (l->info) l->info->gemm_calls += 2;
        return cuk_moe_combine(ds, E, inv, crw, (int32_t)n, (int32_t)U, a->y, a->ldy, l->st, err);
    }
    /* experts per weight batch */
    const uint64_t per_e = (uint64_t)3 * FE * E * 2;
    int64_t EB = (int64_t)(MOE_WTILE_BYTES / per_e);
    if (EB < 1) EB = 1;
    if (EB > NL) EB = NL;
    CK(grow(l, &l->tile16, (size_t)EB * per_e, "expert weight tiles", err));
    uint8_t *wg16 = l->tile16.p, *wu16 = wg16 + (uint64_t)EB * FE * E * 2, *wd16 = wu16 + (uint64_t)EB * FE * E * 2;
    int64_t off = 0;
    for (int64_t e0 = 0; e0 < NL; e0 += EB) {
        const int64_t eb = NL - e0 < EB ? NL - e0 : EB;
        int64_t rows_b = 0;
        for (int64_t e = e0; e < e0 + eb; e++) rows_b += l->hcnt[e];
        if (rows_b == 0) continue;
        for (int64_t r0 = e0; r0 < e0 + eb;) { /* runs of experts with rows: the others are not decoded */
            if (l->hcnt[r0] <= 0) {
                r0++;
                continue;
            }
            int64_t r1 = r0;
            while (r1 < e0 + eb && l->hcnt[r1] > 0) r1++;
            const uint64_t j = (uint64_t)(r0 - e0), ne = (uint64_t)(r1 - r0);
            CK(dequant(l, a->gu_type, (const uint8_t *)a->w_gate + (uint64_t)r0 * FE * rb_gu, E, (int64_t)ne * FE,
                       wg16 + j * FE * E * 2, et, err));
            CK(dequant(l, a->gu_type, (const uint8_t *)a->w_up + (uint64_t)r0 * FE * rb_gu, E, (int64_t)ne * FE,
                       wu16 + j * FE * E * 2, et, err));
            CK(dequant(l, a->down_type, (const uint8_t *)a->w_down + (uint64_t)r0 * E * rb_d, FE, (int64_t)ne * E,
                       wd16 + j * E * FE * 2, et, err));
            r0 = r1;
        }
        int64_t o = off;
        for (int64_t e = e0; e < e0 + eb; e++) {
            const int64_t c = l->hcnt[e];
            if (c <= 0) continue;
            const uint8_t *x = (const uint8_t *)xb + (uint64_t)o * E * 2;
            CK(gemm(l, md, wg16 + (uint64_t)(e - e0) * FE * E * 2, E, x, E, E, FE, c, gs + o * FE, FE, err));
            CK(gemm(l, md, wu16 + (uint64_t)(e - e0) * FE * E * 2, E, x, E, E, FE, c, us + o * FE, FE, err));
            o += c;
        }
        CK(cuk_silu_mul_16(gs + off * FE, us + off * FE, rows_b, FE, (uint8_t *)hb + (uint64_t)off * FE * 2, et,
                           l->st, err));
        o = off;
        for (int64_t e = e0; e < e0 + eb; e++) {
            const int64_t c = l->hcnt[e];
            if (c <= 0) continue;
            CK(gemm(l, md, wd16 + (uint64_t)(e - e0) * E * FE * 2, FE,
                    (const uint8_t *)hb + (uint64_t)o * FE * 2, FE, FE, E, c, ds + o * E, E, err));
            o += c;
        }
        off = o;
    }
    return cuk_moe_combine(ds, E, inv, crw, (int32_t)n, (int32_t)U, a->y, a->ldy, l->st, err);
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
    if (gl_lin_fast(l)) return moe_fast(l, a, rows, rw, cnt, rb_gu, rb_d, err);
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

/* ---- fast mode: attention and indexer of a prompt as tensor-core products ---- */

/* Bytes of score chunk per query row budgeted: the score and probability rows of a chunk of
 * query tokens stay within this (chunks of whole tokens, at least one). */
#define ATT_CHUNK_BYTES (512ull << 20)

static g5_status gemm_ex(gl_lin *l, const cuk_gemm_ex_args *a, g5_error *err) {
    CK(cuk_gemm_ex(l->blas, a, l->st, err));
    if (l->info) l->info->gemm_calls++;
    return G5_OK;
}

g5_status gl_lin_absorb(gl_lin *l, const cuk_mla_absorb_args *ab, g5_error *err) {
    if (!l->blas) return g5_fail(err, G5_ERR_INTERNAL, "prefill GEMM path used while off");
    const cuk_mla_dims *d = &ab->d;
    const int64_t H = d->n_head, NR = d->nope + d->rope, KL = d->kv_lora;
    /* column-major per head: qlat^T (KL x n) = W_UK^T (KL x nope, kvb rows as columns) q_nope^T */
    const cuk_gemm_ex_args a = {CUK_GEMM_TF32, 0, 0, KL, d->n_tok, d->nope, ab->kvb, KL, (int64_t)ab->head_rows * KL,
                                ab->q, H * NR, NR, 0.0f, ab->qlat, H * KL, KL, (int32_t)H};
    return gemm_ex(l, &a, err);
}

g5_status gl_lin_wuv(gl_lin *l, const float *kvb_uv, int64_t head_stride, int32_t n_head, int64_t kv_lora,
                     int64_t v_head, const float *olat, int64_t n, float *ao, g5_error *err) {
    if (!l->blas) return g5_fail(err, G5_ERR_INTERNAL, "prefill GEMM path used while off");
    /* per head: ao^T (V x n) = (W_UV rows as columns)^T olat^T */
    const cuk_gemm_ex_args a = {CUK_GEMM_TF32, 1, 0, v_head, n, kv_lora, kvb_uv, kv_lora, head_stride, olat,
                                (int64_t)n_head * kv_lora, kv_lora, 0.0f, ao, (int64_t)n_head * v_head, v_head,
                                n_head};
    return gemm_ex(l, &a, err);
}

static int64_t up8(int64_t v) { return (v + 7) & ~(int64_t)7; }

g5_status gl_lin_idx_scores(gl_lin *l, const cuk_idx_scores_args *sa, g5_error *err) {
    if (!l->blas) return g5_fail(err, G5_ERR_INTERNAL, "prefill GEMM path used while off");
    const float *const q = sa->q, *const w = sa->w, *const k = sa->k;
    const int32_t n_tok = sa->n_tok, n_head = sa->n_head, dim = sa->dim;
    const int64_t pos0 = sa->pos0, ld_sc = sa->ld_sc;
    float *const sc = sa->sc;
    const int64_t P = pos0 + n_tok, ld = up8(P);
    int64_t ct = (int64_t)(ATT_CHUNK_BYTES / ((uint64_t)n_head * (uint64_t)ld * 4));
    if (ct < 1) ct = 1;
    if (ct > n_tok) ct = n_tok;
    CK(grow(l, &l->att, (size_t)ct * (size_t)n_head * (size_t)ld * 4, "indexer scores", err));
    float *s = l->att.p;
    for (int64_t t0 = 0; t0 < n_tok; t0 += ct) {
        const int64_t c = n_tok - t0 < ct ? n_tok - t0 : ct, pc = pos0 + t0 + c;
        /* s[(t - t0) * n_head + h][j] = q[t][h] . k[j], j < pc (TF32 products, float32 sums) */
        const cuk_gemm_ex_args a = {CUK_GEMM_TF32, 1, 0, pc, c * n_head, dim, k, dim, 0, q + t0 * n_head * dim,
                                    dim, 0, 0.0f, s, ld, 0, 1};
        CK(gemm_ex(l, &a, err));
        const cuk_idx_reduce_args r = {s, ld, w, (int32_t)c, n_head, t0, pos0, sc, ld_sc};
        CK(cuk_idx_reduce(&r, l->st, err));
    }
    return G5_OK;
}

g5_status gl_lin_mla_attend(gl_lin *l, const cuk_mla_attend_args *a, g5_error *err) {
    if (!l->blas) return g5_fail(err, G5_ERR_INTERNAL, "prefill GEMM path used while off");
    const int64_t n = a->d.n_tok, H = a->d.n_head, KL = a->d.kv_lora, W = KL + a->d.rope;
    const int64_t P = a->n_pos, pos0 = P - n;
    if (pos0 < 0 || (a->fresh && a->fresh0 != pos0))
        return g5_fail(err, G5_ERR_INTERNAL, "mla attend (tensor cores): %lld positions, %lld query tokens, fresh "
                       "from %lld", (long long)P, (long long)n, (long long)a->fresh0);
    const uint64_t kb_b = up256((uint64_t)P * W * 2), qb_b = up256((uint64_t)n * H * W * 2);
    CK(grow(l, &l->att, kb_b + qb_b, "attention scratch", err));
    uint8_t *base = l->att.p;
    void *kb = base, *qb = base + kb_b;
    const uint32_t et = et_of(l);
    const cuk_mla_pack_k_args pk = {a->lat, a->lat_type, a->fresh, pos0, P, (int32_t)W, kb, et};
    CK(cuk_mla_pack_k(&pk, l->st, err));
    const cuk_mla_pack_q_args pq = {a->q, a->qlat, (int32_t)n, (int32_t)H, a->d.nope, a->d.rope, (int32_t)KL, qb, et};
    CK(cuk_mla_pack_q(&pq, l->st, err));
    const cuk_mla_flash_args fa = {qb, kb, (int32_t)n, (int32_t)H, (int32_t)KL, a->d.rope, pos0, a->sel,
                                   a->ld_sel, a->n_sel, a->max_sel, a->scale, a->out, et};
    return cuk_mla_flash(&fa, l->st, err);
}

#else
typedef int gl_linear_unused_;
#endif
