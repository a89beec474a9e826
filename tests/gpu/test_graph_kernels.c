/* The device-position launchers that a CUDA-graph decode step replays (cuda/cuk_model.h,
 * "positions in device memory"; runtime/gpu/gpu_graph.c) against the host-position launchers:
 *  - cuk_idx_scores_dev / cuk_idx_topk_dev / cuk_mla_attend_dev give the bits of cuk_idx_scores /
 *    cuk_idx_topk / cuk_mla_attend_fresh at the same position, for bounds from the position
 *    itself to 32 times it, across the graph's 16384-key bucket edge (the staged score kernel on
 *    both sides since session 33; the thread per key in prefill-sized launches), the top-k
 *    cluster sizes, the f32 cache and the bf16/f16 caches with fresh rows, one and three
 *    query tokens, and prefill-sized launches (one block per token for the top-k, per (head,
 *    token) for the attention: the kernels the split ones leave those shapes to);
 *  - cuk_cache_write_rows writes what cuk_convert writes, at the device positions, and nothing
 *    for a position outside the capacity;
 *  - a device position past the bound writes no score, a top-k count of 0 and NaN attention rows;
 *  - those launches captured once into a CUDA graph and replayed at three positions (only the
 *    position in device memory changing) give the host launchers' bits at each.
 * Runs on the device only. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuk.h"
#include "cuda/cuk_model.h"
#include "tests/test_util.h"

#define G5_TEST_NAME "test_graph_kernels"
#define G5_TEST_SEED 0x9a4f1ull
#include "tests/gpu/gpu_test_util.h"

/* GLM-5's per-rank shapes at TP 8: indexer 32 heads x 128, top-k 2048; 8 MLA heads of
 * nope 192 + rope 64 over a 512-wide latent. */
enum { IH = 32, ID = 128, TOPK = 2048, H = 8, NOPE = 192, ROPE = 64, KL = 512, KVW = KL + ROPE };

static float *rand_dev(size_t n, float lo, float hi) {
    float *h = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) h[i] = unif(lo, hi);
    float *d = dup_d(h, n * 4);
    free(h);
    return d;
}

static int32_t *dev_i32(int32_t v) { return dup_d(&v, 4); }

static int same_dev(const void *a, const void *b, size_t bytes) {
    uint8_t *x = xmalloc(bytes), *y = xmalloc(bytes);
    get(x, a, bytes);
    get(y, b, bytes);
    const int eq = !memcmp(x, y, bytes);
    free(x);
    free(y);
    return eq;
}

/* Poisoned entries of row 0 of an [.][ld] float buffer in [from, to). */
static int64_t n_poisoned(const float *d, int64_t from, int64_t to) {
    float *h = xmalloc((size_t)to * 4);
    get(h, d, (size_t)to * 4);
    int64_t c = 0;
    for (int64_t i = from; i < to; i++) c += bits(h[i]) == POISON;
    free(h);
    return c;
}

/* Scores and top-k for n query tokens ending at key count P: host launchers vs device-position
 * ones shaped for `bound` keys. */
static void scores_topk_case(int64_t P, int64_t bound, int n) {
    const int64_t pos0 = P - n, ld = bound;
    float *q = rand_dev((size_t)n * IH * ID, -1, 1), *w = rand_dev((size_t)n * IH, -0.2f, 0.2f);
    float *k = rand_dev((size_t)bound * ID, -1, 1);
    float *sh = dalloc((size_t)n * ld * 4), *sd = dalloc((size_t)n * ld * 4);
    int32_t *selh = dalloc((size_t)n * TOPK * 4), *seld = dalloc((size_t)n * TOPK * 4);
    int32_t *nh = dalloc((size_t)n * 4), *nd = dalloc((size_t)n * 4), *dpos = dev_i32((int32_t)pos0);
    CK(cudaMemset(sh, 0xFF, (size_t)n * ld * 4));
    CK(cudaMemset(sd, 0xFF, (size_t)n * ld * 4));
    CK(cudaMemset(selh, 0x7F, (size_t)n * TOPK * 4));
    CK(cudaMemset(seld, 0x7F, (size_t)n * TOPK * 4));
    g5_error e = {0};
    /* one set of operands for both forms: the host form reads pos0, the device form pos0_dev */
    cuk_idx_scores_args sa = {.q = q, .w = w, .k = k, .n_tok = n, .n_head = IH, .dim = ID, .pos0 = pos0,
                              .pos0_dev = dpos, .pos_bound = bound, .sc = sh, .ld_sc = ld};
    cuk_idx_topk_args ta = {.sc = sh, .ld_sc = ld, .n_tok = n, .pos0 = pos0, .pos0_dev = dpos, .pos_bound = bound,
                            .k = TOPK, .sel = selh, .ld_sel = TOPK, .n_sel = nh};
    T_CHECK(cuk_idx_scores(&sa, NULL, &e) == G5_OK, "scores: %s", e.msg);
    sa.sc = sd;
    T_CHECK(cuk_idx_scores_dev(&sa, NULL, &e) == G5_OK, "scores_dev: %s", e.msg);
    T_CHECK(cuk_idx_topk(&ta, NULL, &e) == G5_OK, "topk: %s", e.msg);
    ta.sc = sd;
    ta.sel = seld;
    ta.n_sel = nd;
    T_CHECK(cuk_idx_topk_dev(&ta, NULL, &e) == G5_OK, "topk_dev: %s", e.msg);
    const int s_eq = same_dev(sh, sd, (size_t)n * ld * 4);
    const int t_eq = same_dev(selh, seld, (size_t)n * TOPK * 4) && same_dev(nh, nd, (size_t)n * 4);
    /* the last token's row: keys past P untouched (the bound's extra blocks wrote nothing) */
    const int64_t past = n_poisoned(sd + (int64_t)(n - 1) * ld, P, ld);
    printf("idx_scores/topk_dev P=%lld bound=%lld n=%d: scores %s, top-k %s, %lld/%lld past P untouched\n",
           (long long)P, (long long)bound, n, s_eq ? "bit-identical" : "DIFFER", t_eq ? "identical" : "DIFFERS",
           (long long)past, (long long)(ld - P));
    T_CHECK(s_eq && t_eq && past == ld - P, "P=%lld bound=%lld n=%d", (long long)P, (long long)bound, n);
    cudaFree(q), cudaFree(w), cudaFree(k), cudaFree(sh), cudaFree(sd), cudaFree(selh), cudaFree(seld);
    cudaFree(nh), cudaFree(nd), cudaFree(dpos);
}

/* n tokens' selections: the last min(cnt, TOPK) ... spread over the causal range, ascending,
 * always including the token's own position (a fresh row). */
static int32_t *make_sel(int64_t pos0, int n, int32_t *nsel_h) {
    int32_t *sel = xmalloc((size_t)n * TOPK * 4);
    for (int t = 0; t < n; t++) {
        const int64_t cnt = pos0 + t + 1, m = cnt < TOPK ? cnt : TOPK;
        int32_t *row = sel + (size_t)t * TOPK;
        for (int64_t j = 0; j < m; j++) row[j] = (int32_t)(j * cnt / m); /* ascending, distinct */
        row[m - 1] = (int32_t)(cnt - 1);
        for (int64_t j = m; j < TOPK; j++) row[j] = -1;
        nsel_h[t] = (int32_t)m;
    }
    return sel;
}

static void *rand_cache(uint32_t type, int64_t rows) {
    const size_t n = (size_t)rows * KVW;
    float *f = rand_dev(n, -1, 1);
    if (type == CUK_F32) return f;
    void *c = dalloc(n * 2);
    g5_error e = {0};
    T_CHECK(cuk_convert(f, KVW, c, type, KVW, rows, KVW, NULL, &e) == G5_OK, "convert: %s", e.msg);
    cudaFree(f);
    return c;
}

static void attend_case(uint32_t type, int64_t P, int64_t bound, int n) {
    const int64_t pos0 = P - n;
    const cuk_mla_dims d = {n, H, NOPE, ROPE, KL};
    float *q = rand_dev((size_t)n * H * (NOPE + ROPE), -1, 1), *ql = rand_dev((size_t)n * H * KL, -0.3f, 0.3f);
    void *lat = rand_cache(type, bound);
    float *fresh = type == CUK_F32 ? NULL : rand_dev((size_t)n * KVW, -1, 1);
    int32_t *nsel_h = xmalloc((size_t)n * 4);
    int32_t *sel_h = make_sel(pos0, n, nsel_h);
    int32_t *sel = dup_d(sel_h, (size_t)n * TOPK * 4), *nsel = dup_d(nsel_h, (size_t)n * 4), *dpos = dev_i32((int32_t)pos0);
    float *oh = dalloc((size_t)n * H * KL * 4), *od = dalloc((size_t)n * H * KL * 4);
    CK(cudaMemset(oh, 0xFF, (size_t)n * H * KL * 4));
    CK(cudaMemset(od, 0xFF, (size_t)n * H * KL * 4));
    const float scale = (float)(1.0 / sqrt((double)(NOPE + ROPE)));
    g5_error e = {0};
    cuk_mla_attend_args at = {.d = d, .q = q, .qlat = ql, .lat = lat, .lat_type = type, .fresh = fresh, .fresh0 = pos0,
                              .n_pos = P, .pos0_dev = dpos, .pos_bound = bound, .sel = sel, .ld_sel = TOPK,
                              .n_sel = nsel, .max_sel = TOPK, .scale = scale, .out = oh};
    T_CHECK(cuk_mla_attend_fresh(&at, NULL, &e) == G5_OK, "attend: %s", e.msg);
    at.out = od;
    T_CHECK(cuk_mla_attend_dev(&at, NULL, &e) == G5_OK, "attend_dev: %s", e.msg);
    const int eq = same_dev(oh, od, (size_t)n * H * KL * 4);
    const int64_t nan = n_poisoned(oh, 0, (int64_t)n * H * KL);
    printf("mla_attend_dev cache %s P=%lld bound=%lld n=%d: %s\n", type == CUK_F32 ? "f32" : type == CUK_BF16 ? "bf16" : "f16",
           (long long)P, (long long)bound, n, eq ? "bit-identical" : "DIFFERS");
    T_CHECK(eq && nan == 0, "attend type %u P=%lld bound=%lld n=%d: %lld unwritten", type, (long long)P,
            (long long)bound, n, (long long)nan);
    free(sel_h), free(nsel_h);
    cudaFree(q), cudaFree(ql), cudaFree(lat), cudaFree(fresh), cudaFree(sel), cudaFree(nsel), cudaFree(dpos);
    cudaFree(oh), cudaFree(od);
}

static void test_cache_write(void) {
    static const uint32_t types[] = {CUK_F32, CUK_BF16, CUK_F16};
    enum { CAP = 300, N = 3 };
    const int32_t pos_h[N] = {7, 299, 300}; /* the last one is outside the capacity */
    for (int ti = 0; ti < 3; ti++) {
        const uint32_t type = types[ti];
        const size_t es = type == CUK_F32 ? 4 : 2;
        float *lat_new = rand_dev((size_t)N * KVW, -3, 3), *key_new = rand_dev((size_t)N * ID, -3, 3);
        uint8_t *lat = dalloc((size_t)CAP * KVW * es), *lref = dalloc((size_t)CAP * KVW * es);
        float *key = dalloc((size_t)CAP * ID * 4), *kref = dalloc((size_t)CAP * ID * 4);
        CK(cudaMemset(lat, 0xFF, (size_t)CAP * KVW * es));
        CK(cudaMemset(lref, 0xFF, (size_t)CAP * KVW * es));
        CK(cudaMemset(key, 0xFF, (size_t)CAP * ID * 4));
        CK(cudaMemset(kref, 0xFF, (size_t)CAP * ID * 4));
        int32_t *pos = dup_d(pos_h, sizeof pos_h);
        g5_error e = {0};
        const cuk_cache_write_rows_args cw = {.lat_new = lat_new, .lat_w = KVW, .lat = lat, .lat_type = type,
                                              .key_new = key_new, .key_w = ID, .key = key, .cap = CAP, .pos = pos,
                                              .n_rows = N};
        T_CHECK(cuk_cache_write_rows(&cw, NULL, &e) == G5_OK, "cache_write_rows: %s", e.msg);
        for (int r = 0; r < N; r++) {
            if (pos_h[r] >= CAP) continue;
            T_CHECK(cuk_convert(lat_new + (size_t)r * KVW, KVW, lref + (size_t)pos_h[r] * KVW * es, type, KVW, 1, KVW, NULL,
                                &e) == G5_OK, "convert: %s", e.msg);
            CK(cudaMemcpy(kref + (size_t)pos_h[r] * ID, key_new + (size_t)r * ID, ID * 4, cudaMemcpyDeviceToDevice));
        }
        const int eq = same_dev(lat, lref, (size_t)CAP * KVW * es) && same_dev(key, kref, (size_t)CAP * ID * 4);
        printf("cache_write_rows type %u: %s (position %d outside the capacity %d skipped)\n", type,
               eq ? "equals cuk_convert" : "DIFFERS", pos_h[2], CAP);
        T_CHECK(eq, "cache_write_rows type %u", type);
        cudaFree(lat_new), cudaFree(key_new), cudaFree(lat), cudaFree(lref), cudaFree(key), cudaFree(kref), cudaFree(pos);
    }
}

/* A device position past the bound: no scores, count 0, NaN attention rows. */
static void test_bad_position(void) {
    const int64_t bound = 1024;
    float *q = rand_dev((size_t)IH * ID, -1, 1), *w = rand_dev(IH, -0.2f, 0.2f), *k = rand_dev((size_t)bound * ID, -1, 1);
    float *sc = dalloc((size_t)bound * 4);
    int32_t *sel = dalloc(TOPK * 4), *ns = dalloc(4), *dpos = dev_i32((int32_t)bound); /* pos0 + 1 > bound */
    CK(cudaMemset(sc, 0xFF, (size_t)bound * 4));
    CK(cudaMemset(ns, 0x7F, 4));
    g5_error e = {0};
    cuk_idx_scores_args sa = {.q = q, .w = w, .k = k, .n_tok = 1, .n_head = IH, .dim = ID, .pos0_dev = dpos,
                              .pos_bound = bound, .sc = sc, .ld_sc = bound};
    cuk_idx_topk_args ta = {.sc = sc, .ld_sc = bound, .n_tok = 1, .pos0_dev = dpos, .pos_bound = bound, .k = TOPK,
                            .sel = sel, .ld_sel = TOPK, .n_sel = ns};
    T_CHECK(cuk_idx_scores_dev(&sa, NULL, &e) == G5_OK, "%s", e.msg);
    T_CHECK(cuk_idx_topk_dev(&ta, NULL, &e) == G5_OK, "%s", e.msg);
    int32_t nsh = -1;
    get(&nsh, ns, 4);
    const int64_t untouched = n_poisoned(sc, 0, bound);
    const cuk_mla_dims d = {1, H, NOPE, ROPE, KL};
    float *qq = rand_dev((size_t)H * (NOPE + ROPE), -1, 1), *ql = rand_dev((size_t)H * KL, -1, 1);
    void *lat = rand_cache(CUK_F32, bound);
    int32_t ns1 = 1, sel1 = 0;
    int32_t *dns1 = dup_d(&ns1, 4), *dsel1 = dup_d(&sel1, 4);
    float *o = dalloc((size_t)H * KL * 4);
    cuk_mla_attend_args at = {.d = d, .q = qq, .qlat = ql, .lat = lat, .lat_type = CUK_F32, .pos0_dev = dpos,
                              .pos_bound = bound, .sel = dsel1, .ld_sel = 1, .n_sel = dns1, .max_sel = 1, .scale = 0.1f,
                              .out = o};
    T_CHECK(cuk_mla_attend_dev(&at, NULL, &e) == G5_OK, "%s", e.msg);
    float *oh = xmalloc((size_t)H * KL * 4);
    get(oh, o, (size_t)H * KL * 4);
    int nan = 0;
    for (int i = 0; i < H * KL; i++) nan += is_nan(oh[i]);
    printf("device position %lld past bound %lld: %lld/%lld scores untouched, top-k count %d, %d/%d attention outputs NaN\n",
           (long long)bound, (long long)bound, (long long)untouched, (long long)bound, nsh, nan, H * KL);
    T_CHECK(untouched == bound && nsh == 0 && nan == H * KL, "bad position handling");
    /* and the host checks of the bound itself */
    sa.ld_sc = bound - 1;
    T_CHECK(cuk_idx_scores_dev(&sa, NULL, &e) == G5_ERR_INVALID_ARG, "ld_sc below the bound refused");
    ta.n_tok = 2;
    ta.pos_bound = 1;
    T_CHECK(cuk_idx_topk_dev(&ta, NULL, &e) == G5_ERR_INVALID_ARG, "bound below n_tok refused");
    at.pos0_dev = NULL;
    T_CHECK(cuk_mla_attend_dev(&at, NULL, &e) == G5_ERR_INVALID_ARG, "NULL device position refused");
    T_CHECK(cuk_mla_attend_dev(NULL, NULL, &e) == G5_ERR_INVALID_ARG && cuk_idx_scores(NULL, NULL, &e) == G5_ERR_INVALID_ARG &&
                cuk_idx_topk_dev(NULL, NULL, &e) == G5_ERR_INVALID_ARG &&
                cuk_cache_write_rows(NULL, NULL, &e) == G5_ERR_INVALID_ARG,
            "NULL args refused");
    free(oh);
    cudaFree(q), cudaFree(w), cudaFree(k), cudaFree(sc), cudaFree(sel), cudaFree(ns), cudaFree(dpos);
    cudaFree(qq), cudaFree(ql), cudaFree(lat), cudaFree(dns1), cudaFree(dsel1), cudaFree(o);
}

/* One decode step's position-dependent launches (cache write, scores, top-k, attention on a bf16
 * cache with the fresh row), captured once with the position in device memory, replayed at three
 * positions; each replay against the host launchers at that position on a copy of the caches. */
static void test_graph_replay(void) {
    const int64_t cap = 4096, bound = 4096;
    const int64_t positions[3] = {2500, 2501, 4095};
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const cuk_stream cs = (cuk_stream)st;
    const cuk_mla_dims d = {1, H, NOPE, ROPE, KL};
    const float scale = (float)(1.0 / sqrt((double)(NOPE + ROPE)));
    float *q = rand_dev((size_t)IH * ID, -1, 1), *w = rand_dev(IH, -0.2f, 0.2f), *kn = rand_dev(ID, -1, 1);
    float *qq = rand_dev((size_t)H * (NOPE + ROPE), -1, 1), *ql = rand_dev((size_t)H * KL, -0.3f, 0.3f);
    float *latf = rand_dev(KVW, -1, 1);
    void *lat[2] = {rand_cache(CUK_BF16, cap), dalloc((size_t)cap * KVW * 2)};
    float *key[2] = {rand_dev((size_t)cap * ID, -1, 1), dalloc((size_t)cap * ID * 4)};
    CK(cudaMemcpy(lat[1], lat[0], (size_t)cap * KVW * 2, cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(key[1], key[0], (size_t)cap * ID * 4, cudaMemcpyDeviceToDevice));
    /* a device-to-device cudaMemcpy (and one from pageable memory) may return before the copy
     * lands, and st does not wait for the legacy stream: without this the host launches below
     * could read lat[1] / key[1] half copied (seen as DIFFERS when other processes load the GPU) */
    CK(cudaDeviceSynchronize());
    float *sc[2] = {dalloc((size_t)bound * 4), dalloc((size_t)bound * 4)};
    int32_t *sel[2] = {dalloc(TOPK * 4), dalloc(TOPK * 4)}, *ns[2] = {dalloc(4), dalloc(4)};
    float *o[2] = {dalloc((size_t)H * KL * 4), dalloc((size_t)H * KL * 4)};
    int32_t *dpos = dev_i32(0);
    /* the same for dpos's copy from pageable memory: landing after the first replay's write of
     * its position on st, it would run that replay at position 0 (seen under TEST_JOBS=8) */
    CK(cudaDeviceSynchronize());
    g5_error e = {0};
    /* [0]: the graph */
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    const cuk_cache_write_rows_args cw = {.lat_new = latf, .lat_w = KVW, .lat = lat[0], .lat_type = CUK_BF16,
                                          .key_new = kn, .key_w = ID, .key = key[0], .cap = cap, .pos = dpos, .n_rows = 1};
    cuk_idx_scores_args sa = {.q = q, .w = w, .k = key[0], .n_tok = 1, .n_head = IH, .dim = ID, .pos0_dev = dpos,
                              .pos_bound = bound, .sc = sc[0], .ld_sc = bound};
    cuk_idx_topk_args ta = {.sc = sc[0], .ld_sc = bound, .n_tok = 1, .pos0_dev = dpos, .pos_bound = bound, .k = TOPK,
                            .sel = sel[0], .ld_sel = TOPK, .n_sel = ns[0]};
    cuk_mla_attend_args at = {.d = d, .q = qq, .qlat = ql, .lat = lat[0], .lat_type = CUK_BF16, .fresh = latf,
                              .pos0_dev = dpos, .pos_bound = bound, .sel = sel[0], .ld_sel = TOPK, .n_sel = ns[0],
                              .max_sel = TOPK, .scale = scale, .out = o[0]};
    g5_status s = cuk_cache_write_rows(&cw, cs, &e);
    if (!s) s = cuk_idx_scores_dev(&sa, cs, &e);
    if (!s) s = cuk_idx_topk_dev(&ta, cs, &e);
    if (!s) s = cuk_mla_attend_dev(&at, cs, &e);
    cudaGraph_t graph = NULL;
    CK(cudaStreamEndCapture(st, &graph));
    T_CHECK(s == G5_OK, "capture: %s", e.msg);
    cudaGraphExec_t ge = NULL;
    CK(cudaGraphInstantiate(&ge, graph, 0));
    for (int i = 0; i < 3; i++) {
        const int32_t p = (int32_t)positions[i];
        const int64_t P = p + 1;
        CK(cudaMemcpyAsync(dpos, &p, 4, cudaMemcpyHostToDevice, st));
        CK(cudaGraphLaunch(ge, st));
        /* [1]: the host launchers at p */
        s = cuk_convert(latf, KVW, (uint8_t *)lat[1] + (size_t)p * KVW * 2, CUK_BF16, KVW, 1, KVW, cs, &e);
        CK(cudaMemcpyAsync(key[1] + (size_t)p * ID, kn, ID * 4, cudaMemcpyDeviceToDevice, st));
        const cuk_idx_scores_args sh = {.q = q, .w = w, .k = key[1], .n_tok = 1, .n_head = IH, .dim = ID, .pos0 = p,
                                        .sc = sc[1], .ld_sc = P};
        const cuk_idx_topk_args th = {.sc = sc[1], .ld_sc = P, .n_tok = 1, .pos0 = p, .k = TOPK, .sel = sel[1],
                                      .ld_sel = TOPK, .n_sel = ns[1]};
        cuk_mla_attend_args ah = at; /* the capture's operands, at p, on the copies */
        ah.lat = lat[1], ah.fresh0 = p, ah.n_pos = P, ah.sel = sel[1], ah.n_sel = ns[1], ah.out = o[1];
        if (!s) s = cuk_idx_scores(&sh, cs, &e);
        if (!s) s = cuk_idx_topk(&th, cs, &e);
        if (!s) s = cuk_mla_attend_fresh(&ah, cs, &e);
        T_CHECK(s == G5_OK, "host launches: %s", e.msg);
        CK(cudaStreamSynchronize(st));
        const int e_sc = same_dev(sc[0], sc[1], (size_t)P * 4), e_sel = same_dev(sel[0], sel[1], TOPK * 4);
        const int e_ns = same_dev(ns[0], ns[1], 4), e_o = same_dev(o[0], o[1], (size_t)H * KL * 4);
        const int e_lat = same_dev(lat[0], lat[1], (size_t)cap * KVW * 2);
        const int e_key = same_dev(key[0], key[1], (size_t)cap * ID * 4);
        const int eq = e_sc && e_sel && e_ns && e_o && e_lat && e_key;
        printf("graph replay at position %d (captured once, bound %lld): %s%s%s%s%s%s%s\n", p, (long long)bound,
               eq ? "bit-identical to the host launches" : "DIFFERS in", e_sc ? "" : " scores", e_sel ? "" : " selection",
               e_ns ? "" : " count", e_o ? "" : " output", e_lat ? "" : " latents", e_key ? "" : " keys");
        T_CHECK(eq, "graph replay at position %d", p);
    }
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(graph);
    for (int i = 0; i < 2; i++) cudaFree(lat[i]), cudaFree(key[i]), cudaFree(sc[i]), cudaFree(sel[i]), cudaFree(ns[i]), cudaFree(o[i]);
    cudaFree(q), cudaFree(w), cudaFree(kn), cudaFree(qq), cudaFree(ql), cudaFree(latf), cudaFree(dpos);
    cudaStreamDestroy(st);
}

int main(void) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        printf("no CUDA device\n");
        return t_report(G5_TEST_NAME);
    }
    /* key counts (P) and the buckets runtime/gpu/gpu_graph.c would use, plus the extremes */
    static const struct { int64_t P, bound; int n; } sc[] = {
        {1, 1024, 1},     {900, 1024, 1},     {1024, 1024, 1},    {3000, 4096, 1},
        {5000, 5000, 1},  {16384, 16384, 1},  {16385, 32768, 1},  {40000, 65536, 1},
        {3000, 4096, 3},
        /* a top-k cluster launched larger than the plain one (8 vs 16 blocks at 8193 keys, 2 vs
         * 16 at 2049: only the plain count gets positions), the 32768 -> 65536 doubling, the
         * 8192-multiple buckets above 16384 (gpu_graph.c) and three tokens across a cluster edge */
        {8193, 16384, 1}, {2049, 65536, 1},   {32769, 65536, 1},  {32769, 40960, 1},
        {16385, 24576, 1}, {4097, 16384, 3},
    };
    for (size_t i = 0; i < sizeof sc / sizeof sc[0]; i++) scores_topk_case(sc[i].P, sc[i].bound, sc[i].n);
    /* prefill-sized launches: a token per SM or more runs the one-block-per-token top-k
     * (cuda/indexer.cu), tokens x heads >= 2 per SM the one-block-per-(head, token) attention
     * (cuda/attn.cu) */
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    scores_topk_case(3000, 4096, sms);
    scores_topk_case(20000, 32768, sms + 3);
    static const struct { uint32_t type; int64_t P, bound; int n; } at[] = {
        {CUK_F32, 100, 1024, 1},    {CUK_F32, 5000, 8192, 1},   {CUK_BF16, 5000, 8192, 1},
        {CUK_F16, 2049, 4096, 1},   {CUK_BF16, 3000, 4096, 3},
    };
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) attend_case(at[i].type, at[i].P, at[i].bound, at[i].n);
    const int n_pre = (2 * sms + H - 1) / H;
    attend_case(CUK_BF16, 5000, 8192, n_pre);
    attend_case(CUK_F32, 5000, 5000, n_pre + 1);
    test_cache_write();
    test_bad_position();
    test_graph_replay();
    return t_report(G5_TEST_NAME);
}
