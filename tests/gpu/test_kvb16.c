/* kv_b's two decode products with float32 and with fp16 weights (fast mode's decode copy,
 * specs/numerics.md): the absorption through W_UK (cuk_mla_absorb) and the per-head W_UV GEMV
 * (cuk_head_gemv).
 *  - absorb: every element equal to the CPU's order (runtime/cpu/attn.c: one float32 multiply
 *    and add per d, ascending) on the weights the kernel reads, fp16 ones converted to float32
 *    exactly, so bit for bit; both kernel shapes (one token, 16-token blocks);
 *  - head_gemv: against a float64 product of the same weights (max |diff| <= 1e-5 max |ref|),
 *    float32 and bf16 inputs;
 *  - both: every row of a batched call bitwise equal to a one-row call of that row (the server's
 *    batched decode and the MTP verify rows rely on it);
 *  - refusals: an unknown weight type, fp16 weights off their 8-byte alignment.
 * Shapes: GLM-5's (nope 192, v_head 256, kv_lora 512) at 64 heads (TP 1), 8 (TP 8) and 3.
 * Runs on the device only. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuk.h"
#include "cuda/cuk_head_gemv.h"
#include "cuda/cuk_model.h"
#include "format/quant.h"
#include "tests/test_util.h"

#define G5_TEST_NAME "test_kvb16"
#define G5_TEST_SEED 0x6b7662ull
#include "tests/gpu/gpu_test_util.h"

enum { NOPE = 192, R = 64, KL = 512, VH = 256, HR = NOPE + VH, QW = NOPE + R, NMAX = 20 };

/* One head's weights as the kernel reads them: fp16-rounded where f16. */
typedef struct kvb_set {
    int H;
    float *w;      /* [H * HR][KL] the values the kernel reads, as float32 */
    void *dw32;    /* the float32 copy on the device */
    void *dw16;    /* the fp16 copy on the device */
    float *wf;     /* the float32 values (f32 runs) */
} kvb_set;

static void set_make(kvb_set *s, int H) {
    const size_t nw = (size_t)H * HR * KL;
    s->H = H;
    s->wf = xmalloc(nw * 4);
    s->w = xmalloc(nw * 4);
    uint16_t *h = xmalloc(nw * 2);
    for (size_t i = 0; i < nw; i++) {
        s->wf[i] = unif(-0.1f, 0.1f);
        h[i] = quant_f32_to_f16(s->wf[i]);
        s->w[i] = quant_f16_to_f32(h[i]);
    }
    s->dw32 = dup_d(s->wf, nw * 4);
    s->dw16 = dup_d(h, nw * 2);
    free(h);
}

static void set_free(kvb_set *s) {
    free(s->w);
    free(s->wf);
    cudaFree(s->dw32);
    cudaFree(s->dw16);
}

static void test_absorb(const kvb_set *s, int n, int f16) {
    const int H = s->H;
    const float *w = f16 ? s->w : s->wf;
    float *q = xmalloc((size_t)n * H * QW * 4), *ql = xmalloc((size_t)n * H * KL * 4);
    float *ql1 = xmalloc((size_t)n * H * KL * 4), *acc = xmalloc(KL * 4);
    for (size_t i = 0; i < (size_t)n * H * QW; i++) q[i] = unif(-1, 1);
    float *dq = dup_d(q, (size_t)n * H * QW * 4), *dql = dalloc((size_t)n * H * KL * 4);
    CK(cudaMemset(dql, 0xFF, (size_t)n * H * KL * 4));
    g5_error e = {0};
    cuk_mla_absorb_args ab = {.d = {n, H, NOPE, R, KL}, .q = dq, .kvb = f16 ? s->dw16 : s->dw32, .head_rows = HR,
                              .qlat = dql, .kvb_type = f16 ? CUK_F16 : CUK_F32};
    T_CHECK(cuk_mla_absorb(&ab, NULL, &e) == G5_OK, "absorb: %s", e.msg);
    get(ql, dql, (size_t)n * H * KL * 4);
    for (int t = 0; t < n; t++) { /* each token alone */
        ab.d.n_tok = 1;
        ab.q = dq + (size_t)t * H * QW;
        ab.qlat = dql + (size_t)t * H * KL;
        T_CHECK(cuk_mla_absorb(&ab, NULL, &e) == G5_OK, "absorb (one token): %s", e.msg);
    }
    get(ql1, dql, (size_t)n * H * KL * 4);
    uint64_t diff = 0;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < H; h++) {
            const float *qn = q + ((size_t)t * H + h) * QW;
            for (int c = 0; c < KL; c++) acc[c] = 0.0f;
            for (int d = 0; d < NOPE; d++)
                for (int c = 0; c < KL; c++) acc[c] = acc[c] + qn[d] * w[((size_t)h * HR + d) * KL + c];
            diff += memcmp(acc, ql + ((size_t)t * H + h) * KL, KL * 4) != 0;
        }
    const int rows_bad = memcmp(ql, ql1, (size_t)n * H * KL * 4) != 0;
    printf("absorb %s heads %d n %d: %llu (token, head) rows not bit-equal to the CPU order, batched != single: %d\n",
           f16 ? "f16" : "f32", H, n, (unsigned long long)diff, rows_bad);
    T_CHECK(diff == 0, "absorb %s heads %d n %d: %llu rows differ from the CPU order", f16 ? "f16" : "f32", H, n,
            (unsigned long long)diff);
    T_CHECK(!rows_bad, "absorb %s heads %d n %d: a batched row differs from its one-token call", f16 ? "f16" : "f32", H, n);
    free(q);
    free(ql);
    free(ql1);
    free(acc);
    cudaFree(dq);
    cudaFree(dql);
}

static void test_head_gemv(const kvb_set *s, int n, int f16, int xbf) {
    const int H = s->H;
    const float *w = f16 ? s->w : s->wf;
    const size_t nx = (size_t)n * H * KL, ny = (size_t)n * H * VH;
    float *x = xmalloc(nx * 4), *y = xmalloc(ny * 4), *y1 = xmalloc(ny * 4);
    uint16_t *xb = xmalloc(nx * 2);
    for (size_t i = 0; i < nx; i++) {
        x[i] = unif(-1, 1);
        xb[i] = quant_f32_to_bf16(x[i]);
        if (xbf) x[i] = quant_bf16_to_f32(xb[i]); /* the values the kernel reads */
    }
    void *dx = xbf ? dup_d(xb, nx * 2) : dup_d(x, nx * 4);
    float *dy = dalloc(ny * 4);
    CK(cudaMemset(dy, 0xFF, ny * 4));
    const size_t es = f16 ? 2 : 4, xes = xbf ? 2 : 4;
    cuk_head_gemv_args a = {(const uint8_t *)(f16 ? s->dw16 : s->dw32) + (size_t)NOPE * KL * es, (int64_t)HR * KL, KL, H,
                            VH, KL, dx, xbf ? CUK_ACT_BF16 : CUK_ACT_F32, (int64_t)H * KL, KL, n, dy, (int64_t)H * VH, VH,
                            f16 ? CUK_HG_W_F16 : CUK_HG_W_F32};
    g5_error e = {0};
    T_CHECK(cuk_head_gemv_fits(&a), "head_gemv refuses heads %d f16 %d", H, f16);
    T_CHECK(cuk_head_gemv(&a, NULL, &e) == G5_OK, "head_gemv: %s", e.msg);
    get(y, dy, ny * 4);
    for (int t = 0; t < n; t++) {
        a.x = (const uint8_t *)dx + (size_t)t * H * KL * xes;
        a.n = 1;
        a.y = dy + (size_t)t * H * VH;
        T_CHECK(cuk_head_gemv(&a, NULL, &e) == G5_OK, "head_gemv (one row): %s", e.msg);
    }
    get(y1, dy, ny * 4);
    double dmax = 0, rmax = 0;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < H; h++)
            for (int r = 0; r < VH; r++) {
                double ref = 0;
                const float *wr = w + ((size_t)h * HR + NOPE + r) * KL, *xv = x + ((size_t)t * H + h) * KL;
                for (int c = 0; c < KL; c++) ref += (double)wr[c] * xv[c];
                const double got = y[((size_t)t * H + h) * VH + r];
                if (fabs(got - ref) > dmax || got != got) dmax = got != got ? INFINITY : fabs(got - ref);
                if (fabs(ref) > rmax) rmax = fabs(ref);
            }
    const int rows_bad = memcmp(y, y1, ny * 4) != 0;
    printf("head_gemv w %s x %s heads %d n %d: max err %.2e of %.2e, batched != single: %d\n", f16 ? "f16" : "f32",
           xbf ? "bf16" : "f32", H, n, dmax, rmax, rows_bad);
    T_CHECK(dmax <= 1e-5 * rmax && rmax > 0, "head_gemv w f16 %d x bf16 %d heads %d n %d: err %.2e of %.2e", f16, xbf, H,
            n, dmax, rmax);
    T_CHECK(!rows_bad, "head_gemv w f16 %d heads %d n %d: a batched row differs from its one-row call", f16, H, n);
    /* refusals */
    a.w_type = 7;
    T_CHECK(!cuk_head_gemv_fits(&a) && cuk_head_gemv(&a, NULL, &e) == G5_ERR_INVALID_ARG, "w_type 7 accepted");
    if (f16) {
        a.w_type = CUK_HG_W_F16;
        a.w = (const uint8_t *)a.w + 2;
        T_CHECK(!cuk_head_gemv_fits(&a), "fp16 weights at a 2-byte offset accepted");
    }
    free(x);
    free(xb);
    free(y);
    free(y1);
    cudaFree(dx);
    cudaFree(dy);
}

int main(void) {
    if (!t_need_device()) return t_report(G5_TEST_NAME);
    static const int heads[] = {64, 8, 3}, ns[] = {1, 3, NMAX};
    for (size_t hi = 0; hi < sizeof heads / sizeof heads[0]; hi++) {
        kvb_set s;
        set_make(&s, heads[hi]);
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
            for (int f16 = 0; f16 < 2; f16++) {
                test_absorb(&s, ns[ni], f16);
                for (int xbf = 0; xbf < 2; xbf++) test_head_gemv(&s, ns[ni], f16, xbf);
            }
        set_free(&s);
    }
    g5_error e = {0};
    const float one = 1.0f;
    const cuk_mla_absorb_args bad = {.d = {1, 1, NOPE, R, KL}, .q = &one, .kvb = &one, .head_rows = HR, .qlat = (float *)&one,
                                     .kvb_type = 9};
    T_CHECK(cuk_mla_absorb(&bad, NULL, &e) == G5_ERR_INVALID_ARG, "absorb kvb_type 9 accepted");
    return t_report(G5_TEST_NAME);
}
