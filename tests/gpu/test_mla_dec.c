/* Fast mode's tensor-core decode attention (cuda/attn_dec.cu, reached through cuk_mla_attend_fresh,
 * _dev and _multi with tc = 1) against a float64 reference on the host. The inputs are chosen
 * exactly representable in fp16 (queries and fresh rows k / 1024, cache entries m / 128, which
 * bf16 holds too), so the reference sees the kernel's own inputs and the only differences are
 * the fp16 probabilities and float32 sums. Cases: GLM-5's 64 heads at TP 1 and 8 at TP 8, head
 * counts that leave rows of a tile empty (1, 20, 40) or need two head blocks (100), dense keys
 * and index_topk selections (one tile to 32, two tiles per CTA), several query tokens with their
 * fresh rows, both 16-bit caches, and invalid tokens (count 0, count past max_sel, a listed
 * position past the keys: NaN rows for that token only). Then the bits: the graph form (_dev,
 * position in device memory) equals _fresh, and one multi-sequence launch equals one-token
 * launches of each sequence (at 64 and 32 heads the multi launch takes 64 or 32 heads a CTA and
 * the one-token launch 16: the bits must not depend on the form). The output is poisoned first: every element must be written.
 * Bound: relative L2 <= 2e-3 per case and <= 1e-2 per row. Runs on the device only. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuk.h"
#include "cuda/cuk_model.h"
#include "tests/test_util.h"

#define G5_TEST_NAME "test_mla_dec"
#define G5_TEST_SEED 0xdec0ull
#include "tests/gpu/gpu_test_util.h"

enum { NOPE = 192, ROPE = 64, KL = 512, W = KL + ROPE, TOPK = 2048 };

static float rq(void) { return (float)((int)(rnd() % 2049) - 1024) / 1024.0f; } /* fp16-exact */
static float rc(void) { return (float)((int)(rnd() % 257) - 128) / 128.0f; }    /* bf16- and fp16-exact */

/* bits of an exactly representable value of rc() */
static uint16_t bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}
static uint16_t f16_bits(float f) {
    if (f == 0.0f) return 0;
    const uint16_t s = f < 0 ? 0x8000 : 0;
    int e;
    const double m = frexp(fabs((double)f), &e); /* |f| = m 2^e, m in [0.5, 1) */
    return (uint16_t)(s | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)lround((m * 2 - 1) * 1024));
}

/* One sequence's inputs: n query tokens at positions P - n .. P - 1, cache rows 0 .. P - n - 1
 * (lat: the float values; lat16: as lat_type), fresh rows for the n tokens, selections. */
typedef struct dcase {
    int n_head, n_tok, n_pos, max_sel;
    uint32_t lat_type;
    float scale;
    int bad; /* 1: tokens 0, 1, 2 made invalid (needs n_tok >= 4) */
} dcase;

typedef struct seq {
    int H, n, P, K;
    float *q, *ql, *lat, *fresh;
    uint16_t *lat16;
    int32_t *sel, *ns;
} seq;

static void seq_make(seq *s, const dcase *c) {
    s->H = c->n_head, s->n = c->n_tok, s->P = c->n_pos, s->K = c->max_sel;
    const int64_t rows = (int64_t)s->n * s->H, P = s->P, F = P - s->n;
    s->q = xmalloc((size_t)rows * (NOPE + ROPE) * 4);
    s->ql = xmalloc((size_t)rows * KL * 4);
    s->lat = xmalloc((size_t)P * W * 4);
    s->lat16 = xmalloc((size_t)P * W * 2);
    s->fresh = xmalloc((size_t)s->n * W * 4);
    for (int64_t i = 0; i < rows * (NOPE + ROPE); i++) s->q[i] = rq();
    for (int64_t i = 0; i < rows * KL; i++) s->ql[i] = rq();
    for (int64_t i = 0; i < P * W; i++) {
        const int64_t j = i / W;
        s->lat[i] = j < F ? rc() : rq(); /* the fresh positions' values come from fresh */
        s->lat16[i] = j < F ? (c->lat_type == CUK_BF16 ? bf16_bits(s->lat[i]) : f16_bits(s->lat[i])) : (c->lat_type == CUK_BF16 ? 0x7fc0 : 0x7e00); /* NaN: never read */
    }
    memcpy(s->fresh, s->lat + F * W, (size_t)s->n * W * 4);
    s->sel = xmalloc((size_t)s->n * s->K * 4);
    s->ns = xmalloc((size_t)s->n * 4);
    char *used = xmalloc((size_t)P);
    for (int t = 0; t < s->n; t++) {
        const int64_t p = F + t;
        int32_t *sl = s->sel + (int64_t)t * s->K;
        for (int u = 0; u < s->K; u++) sl[u] = -7;
        if (p + 1 <= s->K) {
            for (int u = 0; u <= p; u++) sl[u] = u;
            s->ns[t] = (int32_t)(p + 1);
            continue;
        }
        memset(used, 0, (size_t)P);
        for (int u = 0; u < s->K; u++) { /* K distinct positions <= p, then ascending */
            int64_t j;
            do j = (int64_t)(rnd() % (uint64_t)(p + 1)); while (used[j]);
            used[j] = 1;
        }
        int u = 0;
        for (int64_t j = 0; j <= p; j++)
            if (used[j]) sl[u++] = (int32_t)j;
        s->ns[t] = s->K;
    }
    free(used);
    if (c->bad) {
        s->ns[0] = 0;
        s->ns[1] = s->K + 1;
        s->sel[2 * s->K + 1] = s->P + 3;
    }
}

static void seq_free(seq *s) {
    free(s->q), free(s->ql), free(s->lat), free(s->lat16), free(s->fresh), free(s->sel), free(s->ns);
}

/* float64 attention of token t, head h into ref[KL]; 0 if the token is invalid */
static int ref_row(const seq *s, int t, int h, float scale, double *ref, double *sc) {
    const int ns = s->ns[t];
    if (ns < 1 || ns > s->K) return 0;
    const int64_t r = (int64_t)t * s->H + h;
    double mx = -INFINITY;
    for (int u = 0; u < ns; u++) {
        const int64_t j = s->sel[(int64_t)t * s->K + u];
        if (j < 0 || j >= s->P) return 0;
        double d = 0;
        for (int k = 0; k < KL; k++) d += (double)s->ql[r * KL + k] * s->lat[j * W + k];
        for (int k = 0; k < ROPE; k++) d += (double)s->q[r * (NOPE + ROPE) + NOPE + k] * s->lat[j * W + KL + k];
        sc[u] = d * scale;
        if (sc[u] > mx) mx = sc[u];
    }
    double sum = 0;
    for (int k = 0; k < KL; k++) ref[k] = 0;
    for (int u = 0; u < ns; u++) {
        const int64_t j = s->sel[(int64_t)t * s->K + u];
        const double e = exp(sc[u] - mx);
        sum += e;
        for (int k = 0; k < KL; k++) ref[k] += e * s->lat[j * W + k];
    }
    for (int k = 0; k < KL; k++) ref[k] /= sum;
    return 1;
}

/* Checks out [n][H][KL] against the reference; returns the relative L2 error */
static double check_out(const seq *s, const float *out, float scale, const char *what) {
    double *ref = xmalloc(KL * 8), *sc = xmalloc((size_t)s->K * 8 + 8);
    double num = 0, den = 0, worst = 0;
    int unwritten = 0, nan_ok = 1, nan_bad = 0;
    for (int t = 0; t < s->n; t++)
        for (int h = 0; h < s->H; h++) {
            const float *o = out + ((int64_t)t * s->H + h) * KL;
            for (int k = 0; k < KL; k++) unwritten += bits(o[k]) == POISON;
            if (!ref_row(s, t, h, scale, ref, sc)) {
                for (int k = 0; k < KL; k++) nan_ok &= is_nan(o[k]);
                continue;
            }
            double rn = 0, rd = 0;
            for (int k = 0; k < KL; k++) {
                const double d = (double)o[k] - ref[k];
                nan_bad += is_nan(o[k]);
                rn += d * d;
                rd += ref[k] * ref[k];
            }
            num += rn;
            den += rd;
            const double rr = sqrt(rn / (rd > 0 ? rd : 1e-300));
            if (!(rr <= worst)) worst = rr;
        }
    const double rel = den > 0 ? sqrt(num / den) : 0;
    printf("%s: rel L2 %.3e, worst row %.3e\n", what, rel, worst);
    T_CHECK(unwritten == 0, "%s: %d elements unwritten", what, unwritten);
    T_CHECK(nan_bad == 0, "%s: %d NaN in valid rows", what, nan_bad);
    T_CHECK(nan_ok, "%s: invalid tokens' rows not all NaN", what);
    T_CHECK(rel <= 2e-3, "%s: rel L2 %.3e > 2e-3", what, rel);
    T_CHECK(worst <= 1e-2, "%s: worst row %.3e > 1e-2", what, worst);
    free(ref), free(sc);
    return rel;
}

/* The list-free form (sel and n_sel NULL: every key 0 .. p): row by row the listed launch's bits
 * (out_list) for a token at position p < max_sel, whose list is 0 .. p (tokens whose list was
 * made invalid, lbad, are skipped), and NaN for a token that sees more than max_sel keys.
 * Returns the rows that differ. */
static int nolist_rows(const seq *s, const float *out_list, const float *out, int lbad) {
    const int64_t F = s->P - s->n;
    int bad = 0;
    for (int t = 0; t < s->n; t++) {
        if (lbad && t < 3) continue;
        for (int h = 0; h < s->H; h++) {
            const int64_t o = ((int64_t)t * s->H + h) * KL;
            int ok = 1;
            if (F + t + 1 <= s->K) {
                ok = !memcmp(out + o, out_list + o, KL * 4);
            } else {
                for (int k = 0; k < KL; k++) ok &= is_nan(out[o + k]);
            }
            bad += !ok;
        }
    }
    return bad;
}

static void run_case(const dcase *c) {
    seq s;
    seq_make(&s, c);
    const int H = s.H, n = s.n, P = s.P, K = s.K;
    const int64_t rows = (int64_t)n * H, F = P - n;
    float *dq = dup_d(s.q, (size_t)rows * (NOPE + ROPE) * 4), *dql = dup_d(s.ql, (size_t)rows * KL * 4);
    void *dlat = dup_d(s.lat16, (size_t)P * W * 2);
    float *dfr = dup_d(s.fresh, (size_t)n * W * 4);
    int32_t *dsel = dup_d(s.sel, (size_t)n * K * 4), *dns = dup_d(s.ns, (size_t)n * 4);
    const int32_t hpos = (int32_t)F;
    int32_t *dpos = dup_d(&hpos, 4);
    float *dout = dalloc((size_t)rows * KL * 4), *dout2 = dalloc((size_t)rows * KL * 4);
    CK(cudaMemset(dout, 0xFF, (size_t)rows * KL * 4));
    CK(cudaMemset(dout2, 0xFF, (size_t)rows * KL * 4));
    cuk_mla_attend_args a = {.d = {n, H, NOPE, ROPE, KL}, .q = dq, .qlat = dql, .lat = dlat,
                             .lat_type = c->lat_type, .fresh = dfr, .fresh0 = F, .n_pos = P,
                             .pos0_dev = dpos, .pos_bound = P + 9, .sel = dsel, .ld_sel = K, .n_sel = dns,
                             .max_sel = K, .scale = c->scale, .out = dout, .tc = 1};
    g5_error err = {0};
    g5_status st = cuk_mla_attend_fresh(&a, NULL, &err);
    T_CHECK(st == G5_OK, "H=%d n=%d: launch: %s", H, n, err.msg);
    a.out = dout2;
    st = cuk_mla_attend_dev(&a, NULL, &err);
    T_CHECK(st == G5_OK, "H=%d n=%d: _dev launch: %s", H, n, err.msg);
    float *hout = xmalloc((size_t)rows * KL * 4), *hout2 = xmalloc((size_t)rows * KL * 4);
    get(hout, dout, (size_t)rows * KL * 4);
    get(hout2, dout2, (size_t)rows * KL * 4);
    CK(cudaGetLastError());
    char what[160];
    snprintf(what, sizeof what, "mla_dec H=%d n=%d keys=%d max_sel=%d %s scale=%g%s", H, n, P, K,
             c->lat_type == CUK_BF16 ? "bf16" : "f16", (double)c->scale, c->bad ? " (3 invalid tokens)" : "");
    check_out(&s, hout, c->scale, what);
    T_CHECK(memcmp(hout, hout2, (size_t)rows * KL * 4) == 0, "%s: _dev differs from _fresh", what);
    /* without a list (a graph step while a token sees <= index_topk keys): _dev and _fresh, the
     * tensor-core kernel and the float32 ones, against each one's listed launch */
    for (int tc = 1; tc >= 0; tc--) {
        a.tc = (uint32_t)tc, a.sel = dsel, a.n_sel = dns, a.out = dout;
        st = cuk_mla_attend_fresh(&a, NULL, &err);
        T_CHECK(st == G5_OK, "%s tc %d: listed launch: %s", what, tc, err.msg);
        get(hout, dout, (size_t)rows * KL * 4);
        a.sel = NULL, a.n_sel = NULL;
        for (int dev = 0; dev < 2; dev++) {
            CK(cudaMemset(dout2, 0xFF, (size_t)rows * KL * 4));
            a.out = dout2;
            st = dev ? cuk_mla_attend_dev(&a, NULL, &err) : cuk_mla_attend_fresh(&a, NULL, &err);
            T_CHECK(st == G5_OK, "%s tc %d: launch without a list: %s", what, tc, err.msg);
            get(hout2, dout2, (size_t)rows * KL * 4);
            const int nb = nolist_rows(&s, hout, hout2, c->bad);
            T_CHECK(nb == 0, "%s tc %d %s without a list: %d rows differ from the listed launch's (or are not NaN "
                    "past max_sel)", what, tc, dev ? "_dev" : "_fresh", nb);
        }
    }
    cudaFree(dq), cudaFree(dql), cudaFree(dlat), cudaFree(dfr), cudaFree(dsel), cudaFree(dns), cudaFree(dpos);
    cudaFree(dout), cudaFree(dout2);
    free(hout), free(hout2);
    seq_free(&s);
}

/* B sequences at different positions in one multi launch, bit for bit their one-token launches */
static void run_multi(int H, uint32_t lat_type) {
    enum { B = 6 };
    static const int pos[B] = {0, 37, 600, 2047, 2048, 3001};
    seq s[B];
    cuk_seq_row hr[B];
    void *dlat[B];
    const int64_t qw = (int64_t)H * (NOPE + ROPE), lw = (int64_t)H * KL;
    float *hq = xmalloc((size_t)B * qw * 4), *hql = xmalloc((size_t)B * lw * 4), *hfr = xmalloc((size_t)B * W * 4);
    int32_t *hsel = xmalloc((size_t)B * TOPK * 4), *hns = xmalloc(B * 4);
    for (int b = 0; b < B; b++) {
        const dcase c = {H, 1, pos[b] + 1, TOPK, lat_type, 0.0625f, 0};
        seq_make(&s[b], &c);
        memcpy(hq + b * qw, s[b].q, (size_t)qw * 4);
        memcpy(hql + b * lw, s[b].ql, (size_t)lw * 4);
        memcpy(hfr + b * W, s[b].fresh, W * 4);
        memcpy(hsel + (int64_t)b * TOPK, s[b].sel, TOPK * 4);
        hns[b] = s[b].ns[0];
        dlat[b] = dup_d(s[b].lat16, (size_t)(pos[b] + 1) * W * 2);
        hr[b] = (cuk_seq_row){dlat[b], NULL, pos[b] + 1, pos[b]};
    }
    float *dq = dup_d(hq, (size_t)B * qw * 4), *dql = dup_d(hql, (size_t)B * lw * 4), *dfr = dup_d(hfr, (size_t)B * W * 4);
    int32_t *dsel = dup_d(hsel, (size_t)B * TOPK * 4), *dns = dup_d(hns, B * 4);
    cuk_seq_row *drows = dup_d(hr, sizeof hr);
    float *dout = dalloc((size_t)B * lw * 4), *d1 = dalloc((size_t)lw * 4), *d1m = dalloc((size_t)B * lw * 4);
    float *hm = xmalloc((size_t)B * lw * 4);
    CK(cudaMemset(dout, 0xFF, (size_t)B * lw * 4));
    const cuk_attend_multi_args m = {{B, H, NOPE, ROPE, KL}, dq, dql, lat_type, dfr, drows, 4096, dsel, TOPK, dns,
                                     TOPK, 0.0625f, dout, 1};
    g5_error err = {0};
    T_CHECK(cuk_mla_attend_multi(&m, NULL, &err) == G5_OK, "multi H=%d: launch: %s", H, err.msg);
    float *hout = xmalloc((size_t)B * lw * 4), *h1 = xmalloc((size_t)lw * 4);
    get(hout, dout, (size_t)B * lw * 4);
    int same = 1;
    for (int b = 0; b < B; b++) {
        char what[96];
        snprintf(what, sizeof what, "mla_dec multi H=%d seq %d at %d", H, b, pos[b]);
        check_out(&s[b], hout + b * lw, 0.0625f, what);
        CK(cudaMemset(d1, 0xFF, (size_t)lw * 4));
        const cuk_mla_attend_args a = {.d = {1, H, NOPE, ROPE, KL}, .q = dq + b * qw, .qlat = dql + b * lw,
                                       .lat = dlat[b], .lat_type = lat_type, .fresh = dfr + b * W, .fresh0 = pos[b],
                                       .n_pos = pos[b] + 1, .sel = dsel + (int64_t)b * TOPK, .ld_sel = TOPK,
                                       .n_sel = dns + b, .max_sel = TOPK, .scale = 0.0625f, .out = d1, .tc = 1};
        T_CHECK(cuk_mla_attend_fresh(&a, NULL, &err) == G5_OK, "one-token H=%d: %s", H, err.msg);
        get(h1, d1, (size_t)lw * 4);
        same &= memcmp(h1, hout + b * lw, (size_t)lw * 4) == 0;
    }
    T_CHECK(same, "multi H=%d: a sequence's row differs from its one-token launch", H);
    /* without a list, the tensor-core kernel and the float32 one against their listed launches:
     * sequences at positions < TOPK the same bits, those past it NaN */
    for (int tc = 1; tc >= 0; tc--) {
        cuk_attend_multi_args ml = m;
        ml.tc = (uint32_t)tc;
        T_CHECK(cuk_mla_attend_multi(&ml, NULL, &err) == G5_OK, "multi H=%d tc %d: %s", H, tc, err.msg);
        get(hout, dout, (size_t)B * lw * 4);
        ml.sel = NULL, ml.n_sel = NULL, ml.out = d1m;
        CK(cudaMemset(d1m, 0xFF, (size_t)B * lw * 4));
        T_CHECK(cuk_mla_attend_multi(&ml, NULL, &err) == G5_OK, "multi H=%d tc %d without a list: %s", H, tc, err.msg);
        get(hm, d1m, (size_t)B * lw * 4);
        int nb = 0;
        for (int b = 0; b < B; b++) nb += nolist_rows(&s[b], hout + b * lw, hm + b * lw, 0);
        T_CHECK(nb == 0, "multi H=%d tc %d without a list: %d rows differ from the listed launch's (or are not NaN past "
                "TOPK)", H, tc, nb);
    }
    CK(cudaGetLastError());
    for (int b = 0; b < B; b++) cudaFree(dlat[b]), seq_free(&s[b]);
    cudaFree(dq), cudaFree(dql), cudaFree(dfr), cudaFree(dsel), cudaFree(dns), cudaFree(drows), cudaFree(dout);
    cudaFree(d1), cudaFree(d1m);
    free(hm);
    free(hq), free(hql), free(hfr), free(hsel), free(hns), free(hout), free(h1);
}

int main(void) {
    if (!t_need_device()) return t_report(G5_TEST_NAME);
    static const dcase cases[] = {
        {64, 1, 512, TOPK, CUK_BF16, 0.0625f, 0},   /* TP 1 decode at 512: 8 tiles, one per CTA */
        {64, 1, 4096, TOPK, CUK_BF16, 0.0625f, 0},  /* index_topk: 32 tiles, two per CTA */
        {8, 1, 4096, TOPK, CUK_BF16, 0.0625f, 0},   /* TP 8: one 16-row block, 8 rows empty */
        {8, 5, 3000, TOPK, CUK_F16, 0.1f, 0},       /* several tokens, their fresh rows, f16 cache */
        {1, 3, 70, TOPK, CUK_BF16, 0.3f, 0},        /* one head, a partial tile */
        {20, 2, 129, TOPK, CUK_BF16, 0.0625f, 0},   /* two row blocks, 12 rows empty */
        {40, 1, 1, TOPK, CUK_BF16, 0.0625f, 0},     /* one key */
        {100, 2, 300, TOPK, CUK_BF16, 0.0625f, 0},  /* two head blocks */
        {64, 4, 2100, 256, CUK_BF16, 0.2f, 0},      /* a smaller max_sel: a cluster of 2 */
        {64, 6, 3000, TOPK, CUK_BF16, 0.0625f, 1},  /* invalid counts and keys */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
    run_multi(64, CUK_BF16);
    run_multi(32, CUK_BF16);
    run_multi(8, CUK_BF16);
    run_multi(8, CUK_F16);
    return t_report(G5_TEST_NAME);
}
