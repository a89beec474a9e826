/* cuk_mla_flash (cuda/attn_flash.cu), fast mode's fused MLA prefill attention, against a float64
 * reference on the host computed from the same fp16 queries and keys (read back from
 * cuk_mla_pack_q / cuk_mla_pack_k), on random inputs: dense rows (at most max_sel earlier keys),
 * sparse rows (a random selection, unordered), CTAs of one token's heads, of several tokens
 * (n_head < 64), of a token split over two CTAs (n_head = 100, 128), a cache offset (pos0 > 0),
 * and the invalid rows (count 0, count past max_sel, a listed key past the token's position:
 * NaN for that token only). The output is poisoned first: every element must be written.
 * Bound: relative L2 <= 2e-3 per case and <= 1e-2 per row (fp16 probabilities carry 2^-11
 * relative rounding; a wrong index or mask gives O(1)). Runs on the device only. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuk.h"
#include "cuda/cuk_model.h"
#include "cuda/cuk_prefill.h"
#include "tests/test_util.h"

#define G5_TEST_NAME "test_mla_flash"
#define G5_TEST_SEED 0xf1a5ull
#include "tests/gpu/gpu_test_util.h"

enum { NOPE = 192, ROPE = 64, KL = 512, W = KL + ROPE };

static double half_to_double(uint16_t h) {
    const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 0) v = ldexp((double)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexp((double)(m | 1024), e - 25);
    return s ? -v : v;
}

typedef struct fcase {
    int n_head, n_tok, pos0, max_sel;
    float scale;
    int bad; /* 1: tokens 20, 30, 35 made invalid */
} fcase;

static void run_case(const fcase *c) {
    const int H = c->n_head, n = c->n_tok, K = c->max_sel;
    const int64_t P = (int64_t)c->pos0 + n, rows = (int64_t)n * H;
    float *hq = xmalloc((size_t)rows * (NOPE + ROPE) * 4), *hql = xmalloc((size_t)rows * KL * 4);
    float *hlat = xmalloc((size_t)P * W * 4);
    for (int64_t i = 0; i < rows * (NOPE + ROPE); i++) hq[i] = unif(-1, 1);
    for (int64_t i = 0; i < rows * KL; i++) hql[i] = unif(-1, 1);
    for (int64_t i = 0; i < P * W; i++) hlat[i] = unif(-1, 1);
    int32_t *hsel = xmalloc((size_t)n * K * 4), *hns = xmalloc((size_t)n * 4);
    int32_t *perm = xmalloc((size_t)P * 4);
    for (int t = 0; t < n; t++) {
        const int64_t p = c->pos0 + t;
        if (p + 1 <= K) { /* dense: the list is not read */
            hns[t] = (int32_t)(p + 1);
            for (int u = 0; u < K; u++) hsel[(int64_t)t * K + u] = -5;
            continue;
        }
        for (int64_t j = 0; j <= p; j++) perm[j] = (int32_t)j;
        for (int u = 0; u < K; u++) { /* partial Fisher-Yates: K distinct keys, unordered */
            const int64_t r = u + (int64_t)(rnd() % (uint64_t)(p + 1 - u));
            const int32_t tmp = perm[u];
            perm[u] = perm[r];
            perm[r] = tmp;
            hsel[(int64_t)t * K + u] = perm[u];
        }
        hns[t] = K;
    }
    if (c->bad) {
        hns[20] = 0;
        hsel[30 * K + 3] = c->pos0 + 31;
        hns[35] = K + 1;
    }
    float *dq = dup_d(hq, (size_t)rows * (NOPE + ROPE) * 4), *dql = dup_d(hql, (size_t)rows * KL * 4);
    float *dlat = dup_d(hlat, (size_t)P * W * 4);
    int32_t *dsel = dup_d(hsel, (size_t)n * K * 4), *dns = dup_d(hns, (size_t)n * 4);
    void *dqb = dalloc((size_t)rows * W * 2), *dkb = dalloc((size_t)P * W * 2);
    float *dout = dalloc((size_t)rows * KL * 4);
    CK(cudaMemset(dout, 0xFF, (size_t)rows * KL * 4));
    g5_error err = {0};
    const cuk_mla_pack_q_args pq = {dq, dql, n, H, NOPE, ROPE, KL, dqb, CUK_F16};
    const cuk_mla_pack_k_args pk = {dlat, CUK_F32, NULL, 0, P, W, dkb, CUK_F16};
    const cuk_mla_flash_args fa = {dqb, dkb, n, H, KL, ROPE, c->pos0, dsel, K, dns, K, c->scale, dout, CUK_F16};
    g5_status st = cuk_mla_pack_q(&pq, NULL, &err);
    if (st == G5_OK) st = cuk_mla_pack_k(&pk, NULL, &err);
    if (st == G5_OK) st = cuk_mla_flash(&fa, NULL, &err);
    T_CHECK(st == G5_OK, "H=%d n=%d: launch: %s", H, n, err.msg);
    uint16_t *hqb = xmalloc((size_t)rows * W * 2), *hkb = xmalloc((size_t)P * W * 2);
    float *hout = xmalloc((size_t)rows * KL * 4);
    get(hqb, dqb, (size_t)rows * W * 2);
    get(hkb, dkb, (size_t)P * W * 2);
    get(hout, dout, (size_t)rows * KL * 4);
    CK(cudaGetLastError());

    double *kd = xmalloc((size_t)P * W * 8), *qd = xmalloc((size_t)W * 8), *sc = xmalloc((size_t)P * 8);
    double *ref = xmalloc((size_t)KL * 8);
    for (int64_t i = 0; i < P * W; i++) kd[i] = half_to_double(hkb[i]);
    double num = 0, den = 0, worst = 0;
    int unwritten = 0, nan_ok = 1, nan_bad = 0;
    for (int64_t r = 0; r < rows; r++) {
        const int t = (int)(r / H);
        const int64_t p = c->pos0 + t;
        const float *o = hout + r * KL;
        for (int k = 0; k < KL; k++) unwritten += bits(o[k]) == POISON;
        const int invalid = c->bad && (t == 20 || t == 30 || t == 35);
        if (invalid) {
            for (int k = 0; k < KL; k++) nan_ok &= is_nan(o[k]);
            continue;
        }
        for (int k = 0; k < W; k++) qd[k] = half_to_double(hqb[r * W + k]);
        const int dense = hns[t] == p + 1, cnt = hns[t];
        double mx = -INFINITY;
        for (int u = 0; u < cnt; u++) {
            const int64_t j = dense ? u : hsel[(int64_t)t * K + u];
            double d = 0;
            for (int k = 0; k < W; k++) d += qd[k] * kd[j * W + k];
            sc[u] = d * c->scale;
            if (sc[u] > mx) mx = sc[u];
        }
        double sum = 0;
        for (int k = 0; k < KL; k++) ref[k] = 0;
        for (int u = 0; u < cnt; u++) {
            const int64_t j = dense ? u : hsel[(int64_t)t * K + u];
            const double e = exp(sc[u] - mx);
            sum += e;
            for (int k = 0; k < KL; k++) ref[k] += e * kd[j * W + k];
        }
        double rn = 0, rd = 0;
        for (int k = 0; k < KL; k++) {
            const double v = ref[k] / sum, d = (double)o[k] - v;
            nan_bad += is_nan(o[k]);
            rn += d * d;
            rd += v * v;
        }
        num += rn;
        den += rd;
        const double rr = sqrt(rn / (rd > 0 ? rd : 1e-300));
        if (!(rr <= worst)) worst = rr;
    }
    const double rel = sqrt(num / den);
    printf("mla_flash H=%d n=%d pos0=%d max_sel=%d scale=%g%s: rel L2 %.3e, worst row %.3e\n", H, n, c->pos0, K,
           (double)c->scale, c->bad ? " (3 invalid tokens)" : "", rel, worst);
    T_CHECK(unwritten == 0, "H=%d n=%d: %d elements unwritten", H, n, unwritten);
    T_CHECK(nan_bad == 0, "H=%d n=%d: %d NaN in valid rows", H, n, nan_bad);
    T_CHECK(rel <= 2e-3, "H=%d n=%d: rel L2 %.3e > 2e-3", H, n, rel);
    T_CHECK(worst <= 1e-2, "H=%d n=%d: worst row %.3e > 1e-2", H, n, worst);
    if (c->bad) T_CHECK(nan_ok, "H=%d n=%d: invalid tokens' rows not all NaN", H, n);
    cudaFree(dq), cudaFree(dql), cudaFree(dlat), cudaFree(dsel), cudaFree(dns), cudaFree(dqb), cudaFree(dkb);
    cudaFree(dout);
    free(hq), free(hql), free(hlat), free(hsel), free(hns), free(perm), free(hqb), free(hkb), free(hout);
    free(kd), free(qd), free(sc), free(ref);
}

static void test_errors(void) {
    g5_error err = {0};
    const cuk_mla_flash_args a = {(void *)16, (void *)16, 4, 64, 256, 64, 0, (int32_t *)16, 8, (int32_t *)16, 8,
                                  1.0f, (float *)16, CUK_F16};
    T_CHECK(cuk_mla_flash(&a, NULL, &err) == G5_ERR_INVALID_ARG, "kv_lora 256 refused");
    cuk_mla_flash_args b = a;
    b.kv_lora = KL;
    b.et = CUK_BF16;
    T_CHECK(cuk_mla_flash(&b, NULL, &err) == G5_ERR_INVALID_ARG, "bf16 refused");
    b.et = CUK_F16;
    b.ld_sel = 4;
    T_CHECK(cuk_mla_flash(&b, NULL, &err) == G5_ERR_INVALID_ARG, "ld_sel < max_sel refused");
}

int main(void) {
    if (!t_need_device()) return t_report(G5_TEST_NAME);
    static const fcase cases[] = {
        {64, 70, 0, 32, 0.0625f, 0},   /* GLM-5 at TP 1: one token per CTA, sparse from token 32 */
        {64, 40, 100, 128, 0.3f, 0},   /* cache offset, dense then sparse, peaky softmax */
        {4, 300, 0, 32, 0.1f, 0},      /* 16 tokens per CTA: all-dense CTAs and mixed ones */
        {16, 24, 2100, 2048, 0.0625f, 0}, /* GLM-5's index_topk: 32 key tiles per token */
        {8, 40, 2100, 2048, 0.0625f, 0}, /* GLM-5 at TP 8: 8 tokens per CTA, a pass per token */
        {12, 30, 0, 16, 0.1f, 0},      /* warps whose 16 rows span two or three tokens */
        {16, 20, 50, 32, 0.1f, 0},     /* TP 4: k_mla_flash_tok only, a full 16-row tile */
        {1, 50, 0, 8, 0.3f, 0},        /* one head: dense CTAs of 64 tokens, then one token per CTA */
        {17, 12, 0, 4, 0.1f, 0},       /* just past the one-token kernel's head count */
        {100, 9, 5, 8, 0.2f, 0},       /* CTAs spanning two tokens */
        {128, 6, 0, 4, 0.0625f, 0},    /* a token over two CTAs */
        {8, 40, 0, 16, 0.0625f, 1},    /* invalid counts and keys */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
    test_errors();
    return t_report(G5_TEST_NAME);
}
