/* The GPU forward pass (runtime/gpu/gpu_model.h) and its kernels (cuda/cuk_model.h).
 *
 * 1. Kernels against the CPU on fresh random inputs, outputs poisoned before each run, GLM-5's
 *    per-rank shapes among the cases: row dequantization (bit-exact vs quant_dequantize, every
 *    type the CPU dequantizes), the MoE router (vs runtime/cpu/model.c's rt_moe_route), the indexer scores (vs a
 *    float64 reference) and top-k (exact, vs a sort, with many ties), MLA absorption and
 *    attention (vs float32 / float64 references), SwiGLU.
 * 2. Loader: the oracle converted to blobs here; the device copy equals the file's data region
 *    (default options, a small-buffer ring, buffered reads without verification); a blob with one
 *    flipped byte is refused with the tensor named, by the loader and by rt_gpu_model_create.
 * 3. Oracle (../shared/oracle/glm5-tiny), precise mode: logits relative L2 <= 1e-3 / 1e-3 / 5e-3
 *    on prompts 0/1/2, argmax where the oracle's top-2 gap > 0.01, hidden states of prompt 1,
 *    the indexer's top-k on prompt 2, the greedy continuation with the cache; for TP=1 blobs.
 *    TP=2, TP=2 --ep, TP=4 --ep (all ranks on one GPU, device-side sum) and the GGUF source:
 *    prompts 0 and 1 against the oracle and against TP=1 (rel L2 <= 1e-4).
 * 4. Fast mode with f32/bf16/f16 latent caches and precise mode with bf16/f16 caches: precise:
 *    argmax agreement with the oracle on prompts 0 and 1 >= 0.99 and in the dense regime where
 *    the reference's top-2 gap > 0.01; fast: the fast bar (fast_bar: issue 13's policy), also
 *    with the cache read back (prompt 1 decoded one token per call; checked for the f32 cache,
 *    printed for bf16/f16).
 *    The bf16-product-input mode (RT_GPU_BF16ACT) is printed only.
 * 5. --check's machinery (rt_gpu_check) on prompt 1 plus decode steps: every stage within 1e-4
 *    of the CPU stage fed the same input.
 * 6. CUDA graphs (opts.cuda_graph): tests/gpu/test_gpu_graph.c.
 * 7. The prefill GEMM path (runtime/gpu/gpu_linear.h; its kernels are tested by test_gemm.c): the
 *    path forced on (gemm_min 1) in precise mode against the oracle (check_gpu: the tolerances
 *    above, greedy continuation included) and against the GEMV path (logits and every layer's hidden
 *    states within 1e-5 on prompts 0 and 1), also with the experts run by GEMV on their gathered
 *    rows, with 64 KB tiles (row-chunked dequantization), and for TP=2 and TP=2 --ep (vs TP=1
 *    within 1e-4); fast mode with the f32 and f16 (default) computes: argmax agreement printed
 *    for prompts 0/1/2 (checked >= 0.99 on prompts 0/1 for f32; the fast bar, below, for the
 *    default f16, the tensor-core attention and indexer of gpu_linear.h included).
 * Also row conversion to bf16/f16 (bit-exact vs format/quant.c). Runs on the device only
 * (`make test-gpu`, GLM5_SHARED as for the CPU tests). */
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "convert/convert.h"
#include "tests/oracle_ref.h"
#include "cuda/cuk.h"
#include "cuda/cuk_model.h"
#include "format/blob.h"
#include "format/gguf_write.h"
#include "format/quant.h"
#include "runtime/gpu/gpu_model.h"
#include "runtime/cpu/cpu_ops.h"
#include "runtime/cpu/model.h"
#include "runtime/cpu/weights.h"
#include "tests/test_util.h"

#define G5_TEST_NAME "test_gpu_model"
#define G5_TEST_SEED 0x9e1e5eedull
#include "tests/gpu/gpu_test_util.h"

/* ---- 1. kernels ---- */

static void test_dequant(void) {
    static const int64_t ks[] = {512, 6144};
    int n_types = 0; /* every type the CPU dequantizes */
    for (uint32_t type = 0; type < QT_TYPE_LIMIT; type++)
        for (size_t ki = 0; ki < 2 && quant_type_get(type) && quant_type_get(type)->supported; ki++) {
            const quant_type_info *qi = quant_type_get(type);
            n_types += ki == 0;
            const int64_t k = ks[ki], nrw = 7, n = 6, ldo = k + 8;
            uint64_t rb;
            quant_row_bytes(type, (uint64_t)k, &rb);
            uint8_t *w = xmalloc(rb * nrw);
            T_CHECK(quant_fill_random(type, w, rb * nrw / qi->block_bytes, &g_rng) == G5_OK, "fill %s", qi->name);
            const int32_t rows[6] = {3, 0, 6, 99, 2, -1};
            float *ref = xmalloc(k * sizeof(float)), *got = xmalloc((size_t)n * ldo * sizeof(float));
            void *dw = dup_d(w, rb * nrw);
            int32_t *drows = dup_d(rows, sizeof rows);
            float *dout = dalloc((size_t)n * ldo * sizeof(float));
            CK(cudaMemset(dout, 0xFF, (size_t)n * ldo * sizeof(float)));
            g5_error e = {0};
            cuk_dequant_rows_args dq = {.w_type = type, .w = dw, .k = k, .n_rows_w = nrw, .rows = drows, .n = n,
                                        .out = dout, .ldo = ldo};
            T_CHECK(cuk_dequant_rows(&dq, NULL, &e) == G5_OK, "%s: %s", qi->name, e.msg);
            get(got, dout, (size_t)n * ldo * sizeof(float));
            uint64_t bad = 0, pad_bad = 0, nan_bad = 0;
            for (int64_t i = 0; i < n; i++) {
                for (int64_t j = k; j < ldo; j++) pad_bad += bits(got[i * ldo + j]) != POISON;
                if (rows[i] < 0 || rows[i] >= nrw) {
                    for (int64_t j = 0; j < k; j++) nan_bad += !is_nan(got[i * ldo + j]) || bits(got[i * ldo + j]) == POISON;
                    continue;
                }
                quant_dequantize(type, w + rows[i] * rb, (uint64_t)k, ref);
                for (int64_t j = 0; j < k; j++) bad += bits(got[i * ldo + j]) != bits(ref[j]);
            }
            T_CHECK(bad == 0 && pad_bad == 0 && nan_bad == 0,
                    "dequant %s k=%lld: %llu elements differ from quant_dequantize, %llu padding written, "
                    "%llu of the out-of-range rows not NaN", qi->name, (long long)k, (unsigned long long)bad,
                    (unsigned long long)pad_bad, (unsigned long long)nan_bad);
            /* the 16-bit tiles of fast mode's prefill: the same values, rounded once */
            for (int o = 0; o < 2; o++) {
                const uint32_t ot = o ? CUK_F16 : CUK_BF16;
                uint16_t *g16 = xmalloc((size_t)n * ldo * 2);
                uint16_t *d16 = dalloc((size_t)n * ldo * 2);
                CK(cudaMemset(d16, 0xA5, (size_t)n * ldo * 2));
                dq.out = d16;
                dq.out_type = ot;
                T_CHECK(cuk_dequant_rows_16(&dq, NULL, &e) == G5_OK, "%s 16: %s", qi->name, e.msg);
                get(g16, d16, (size_t)n * ldo * 2);
                uint64_t bad16 = 0, pad16 = 0, nan16 = 0;
                for (int64_t i = 0; i < n; i++) {
                    for (int64_t j = k; j < ldo; j++) pad16 += g16[i * ldo + j] != 0xA5A5;
                    if (rows[i] < 0 || rows[i] >= nrw) {
                        for (int64_t j = 0; j < k; j++) {
                            const uint16_t h = g16[i * ldo + j];
                            nan16 += o ? !((h & 0x7c00) == 0x7c00 && (h & 0x03ff)) : !((h & 0x7f80) == 0x7f80 && (h & 0x7f));
                        }
                        continue;
                    }
                    quant_dequantize(type, w + rows[i] * rb, (uint64_t)k, ref);
                    for (int64_t j = 0; j < k; j++)
                        bad16 += g16[i * ldo + j] != (o ? quant_f32_to_f16(ref[j]) : quant_f32_to_bf16(ref[j]));
                }
                T_CHECK(bad16 == 0 && pad16 == 0 && nan16 == 0,
                        "dequant_16 %s %s k=%lld: %llu elements differ from quant_dequantize rounded, %llu padding "
                        "written, %llu of the out-of-range rows not NaN", qi->name, o ? "f16" : "bf16", (long long)k,
                        (unsigned long long)bad16, (unsigned long long)pad16, (unsigned long long)nan16);
                free(g16);
                cudaFree(d16);
            }
            free(w);
            free(ref);
            free(got);
            cudaFree(dw);
            cudaFree(drows);
            cudaFree(dout);
        }
    T_CHECK(n_types == 26, "%d types dequantized", n_types);
    printf("dequant_rows: %d types x 2 widths, bit-exact vs quant_dequantize (float32, and rounded to bf16/f16)\n",
           n_types);
}

static void test_route(void) {
    static const struct { int ne, u, g, tg, gating, norm; float scale; int bias; } cfg[] = {
        {8, 2, 1, 1, 2, 1, 2.5f, 1},    /* the oracle model */
        {256, 8, 1, 1, 2, 1, 2.5f, 1},  /* GLM-5 */
        {256, 8, 8, 4, 2, 1, 2.5f, 1},  /* grouped (DeepSeek-V3 style) */
        {64, 6, 8, 3, 1, 0, 1.0f, 0},   /* softmax, no normalization, no bias */
    };
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        const int NE = cfg[c].ne, U = cfg[c].u, n = 37;
        glm5_hparams hp;
        memset(&hp, 0, sizeof hp);
        hp.n_expert = (uint32_t)NE;
        hp.n_expert_used = (uint32_t)U;
        hp.n_group = (uint32_t)cfg[c].g;
        hp.topk_group = (uint32_t)cfg[c].tg;
        hp.expert_gating_func = (uint32_t)cfg[c].gating;
        hp.expert_weights_norm = cfg[c].norm;
        hp.expert_weights_scale = cfg[c].scale;
        float *lg = xmalloc((size_t)n * NE * 4), *bias = xmalloc((size_t)NE * 4), *lg_cpu = xmalloc((size_t)n * NE * 4);
        for (int i = 0; i < n * NE; i++) lg[i] = unif(-4, 4);
        for (int i = 0; i < NE; i++) bias[i] = unif(-0.5f, 0.5f);
        memcpy(lg_cpu, lg, (size_t)n * NE * 4);
        int32_t *ids_cpu = xmalloc((size_t)n * U * 4), *ids = xmalloc((size_t)n * U * 4);
        float *w_cpu = xmalloc((size_t)n * U * 4), *w = xmalloc((size_t)n * U * 4);
        float *choice = xmalloc((size_t)NE * 4), *gscore = xmalloc((size_t)hp.n_group * 4);
        uint8_t *allowed = xmalloc((size_t)NE);
        for (int t = 0; t < n; t++)
            rt_moe_route(&hp, lg_cpu + (size_t)t * NE, cfg[c].bias ? bias : NULL, choice, allowed, gscore,
                         ids_cpu + (size_t)t * U, w_cpu + (size_t)t * U);
        float *dlg = dup_d(lg, (size_t)n * NE * 4), *dbias = dup_d(bias, (size_t)NE * 4);
        int32_t *dids = dalloc((size_t)n * U * 4);
        float *dw = dalloc((size_t)n * U * 4);
        CK(cudaMemset(dids, 0xFF, (size_t)n * U * 4));
        CK(cudaMemset(dw, 0xFF, (size_t)n * U * 4));
        cuk_route_args a = {dlg, NE, cfg[c].bias ? dbias : NULL, n, NE, U, cfg[c].g, cfg[c].tg, cfg[c].gating,
                            cfg[c].norm, cfg[c].scale, dids, dw, NULL};
        g5_error e = {0};
        T_CHECK(cuk_moe_route(&a, NULL, &e) == G5_OK, "route: %s", e.msg);
        get(ids, dids, (size_t)n * U * 4);
        get(w, dw, (size_t)n * U * 4);
        get(lg, dlg, (size_t)n * NE * 4);
        int id_bad = 0;
        double werr = 0, serr = 0;
        for (int i = 0; i < n * U; i++) {
            id_bad += ids[i] != ids_cpu[i];
            const double d = fabs((double)w[i] - w_cpu[i]) / (fabs((double)w_cpu[i]) + 1e-30);
            if (d > werr || d != d) werr = d != d ? INFINITY : d;
        }
        for (int i = 0; i < n * NE; i++) {
            const double d = fabs((double)lg[i] - lg_cpu[i]);
            if (d > serr || d != d) serr = d != d ? INFINITY : d;
        }
        printf("route NE=%d U=%d groups %d/%d %s: %d ids differ, weights max rel err %.2e, scores max abs err %.2e\n",
               NE, U, cfg[c].tg, cfg[c].g, cfg[c].gating == 1 ? "softmax" : "sigmoid", id_bad, werr, serr);
        T_CHECK(id_bad == 0, "route config %zu: %d ids differ from rt_moe_route", c, id_bad);
        T_CHECK(werr <= 1e-5, "route config %zu: weight rel err %.2e", c, werr);
        T_CHECK(serr <= 1e-6, "route config %zu: score err %.2e", c, serr);
        /* localize: whole experts [NE/4, NE/2) on this rank */
        const int32_t exp0 = NE / 4, nl = NE / 4;
        int32_t *lids = dalloc((size_t)n * U * 4);
        float *lw = dalloc((size_t)n * U * 4);
        T_CHECK(cuk_moe_localize(dids, dw, (int64_t)n * U, exp0, nl, lids, lw, NULL, &e) == G5_OK, "localize: %s", e.msg);
        int32_t *li = xmalloc((size_t)n * U * 4);
        float *lwh = xmalloc((size_t)n * U * 4);
        get(li, lids, (size_t)n * U * 4);
        get(lwh, lw, (size_t)n * U * 4);
        int lbad = 0;
        for (int i = 0; i < n * U; i++) {
            const int mine = ids[i] >= exp0 && ids[i] < exp0 + nl;
            lbad += mine ? (li[i] != ids[i] - exp0 || bits(lwh[i]) != bits(w[i])) : (li[i] != 0 || lwh[i] != 0.0f);
        }
        T_CHECK(lbad == 0, "localize: %d entries wrong", lbad);
        free(li);
        free(lwh);
        cudaFree(lids);
        cudaFree(lw);
        free(lg);
        free(bias);
        free(lg_cpu);
        free(ids_cpu);
        free(ids);
        free(w_cpu);
        free(w);
        free(choice);
        free(gscore);
        free(allowed);
        cudaFree(dlg);
        cudaFree(dbias);
        cudaFree(dids);
        cudaFree(dw);
    }
}

/* reference top-k: the k best by (score desc, position asc), ascending; -1 padded when all fit */
static const float *g_sc_row;
static int cmp_key(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    const float fx = g_sc_row[x], fy = g_sc_row[y];
    if (fx > fy) return -1;
    if (fx < fy) return 1;
    return (x > y) - (x < y);
}
static int cmp_i32(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void test_topk(void) {
    static const struct { int k; int64_t pos0; int n; int ties; } cfg[] = {
        {32, 0, 455, 1}, {32, 100, 7, 0}, {2048, 4000, 3, 1}, {2048, 0, 2, 0}, {64, 10, 200, 1}, {2048, 20000, 2, 0},
        {2048, 30000, 2, 1}, {2048, 40000, 1, 1}, /* the one-block kernel at its largest, the split kernel past it */
    };
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        const int K = cfg[c].k, n = cfg[c].n;
        const int64_t pos0 = cfg[c].pos0, ld = pos0 + n + 5;
        float *sc = xmalloc((size_t)n * ld * 4);
        for (int64_t i = 0; i < n * ld; i++) {
            float v = unif(-2, 2);
            if (cfg[c].ties) v = roundf(v * 8) / 8; /* many exact ties, zeros of both signs */
            if (cfg[c].ties && (rnd() & 15) == 0) v = (rnd() & 1) ? -0.0f : 0.0f;
            sc[i] = v;
        }
        float *dsc = dup_d(sc, (size_t)n * ld * 4);
        const int64_t lds = K + 3;
        int32_t *dsel = dalloc((size_t)n * lds * 4), *dns = dalloc((size_t)n * 4);
        CK(cudaMemset(dsel, 0x7F, (size_t)n * lds * 4));
        CK(cudaMemset(dns, 0x7F, (size_t)n * 4));
        g5_error e = {0};
        const cuk_idx_topk_args ta = {.sc = dsc, .ld_sc = ld, .n_tok = n, .pos0 = pos0, .k = K, .sel = dsel,
                                      .ld_sel = lds, .n_sel = dns};
        T_CHECK(cuk_idx_topk(&ta, NULL, &e) == G5_OK, "topk: %s", e.msg);
        int32_t *sel = xmalloc((size_t)n * lds * 4), *ns = xmalloc((size_t)n * 4);
        get(sel, dsel, (size_t)n * lds * 4);
        get(ns, dns, (size_t)n * 4);
        int32_t *idx = xmalloc((size_t)(pos0 + n) * 4), ref[4096];
        int rows_bad = 0, pad_bad = 0;
        for (int t = 0; t < n; t++) {
            const int64_t cnt = pos0 + t + 1;
            int nref;
            if (cnt <= K) {
                for (int i = 0; i < K; i++) ref[i] = i < cnt ? i : -1;
                nref = (int)cnt;
            } else {
                for (int64_t s = 0; s < cnt; s++) idx[s] = (int32_t)s;
                g_sc_row = sc + (int64_t)t * ld;
                qsort(idx, (size_t)cnt, 4, cmp_key);
                memcpy(ref, idx, (size_t)K * 4);
                qsort(ref, (size_t)K, 4, cmp_i32);
                nref = K;
            }
            int bad = ns[t] != nref;
            for (int i = 0; i < K; i++) bad |= sel[(int64_t)t * lds + i] != ref[i];
            for (int64_t i = K; i < lds; i++) pad_bad += sel[(int64_t)t * lds + i] != 0x7F7F7F7F;
            rows_bad += bad;
        }
        printf("idx_topk k=%d pos0=%lld n=%d%s: %d/%d rows differ from the sort\n", K, (long long)pos0, n,
               cfg[c].ties ? " (ties, signed zeros)" : "", rows_bad, n);
        T_CHECK(rows_bad == 0 && pad_bad == 0, "topk config %zu: %d rows wrong, %d padding written", c, rows_bad, pad_bad);
        free(sc);
        free(sel);
        free(ns);
        free(idx);
        cudaFree(dsc);
        cudaFree(dsel);
        cudaFree(dns);
    }
}

static void test_scores(void) {
    static const struct { int n, ih, id; int64_t pos0; } cfg[] = {{5, 16, 128, 40}, {2, 32, 128, 3000}, {16, 32, 128, 0}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        const int n = cfg[c].n, IH = cfg[c].ih, ID = cfg[c].id;
        const int64_t pos0 = cfg[c].pos0, P = pos0 + n, ld = P + 3;
        float *q = xmalloc((size_t)n * IH * ID * 4), *w = xmalloc((size_t)n * IH * 4), *k = xmalloc((size_t)P * ID * 4);
        for (int64_t i = 0; i < (int64_t)n * IH * ID; i++) q[i] = unif(-1, 1);
        for (int64_t i = 0; i < (int64_t)n * IH; i++) w[i] = unif(-0.2f, 0.2f);
        for (int64_t i = 0; i < P * ID; i++) k[i] = unif(-1, 1);
        float *dq = dup_d(q, (size_t)n * IH * ID * 4), *dw = dup_d(w, (size_t)n * IH * 4), *dk = dup_d(k, (size_t)P * ID * 4);
        float *dsc = dalloc((size_t)n * ld * 4);
        CK(cudaMemset(dsc, 0xFF, (size_t)n * ld * 4));
        g5_error e = {0};
        const cuk_idx_scores_args sa = {.q = dq, .w = dw, .k = dk, .n_tok = n, .n_head = IH, .dim = ID, .pos0 = pos0,
                                        .sc = dsc, .ld_sc = ld};
        T_CHECK(cuk_idx_scores(&sa, NULL, &e) == G5_OK, "scores: %s", e.msg);
        float *sc = xmalloc((size_t)n * ld * 4);
        get(sc, dsc, (size_t)n * ld * 4);
        double maxerr = 0, maxref = 0;
        int untouched_bad = 0;
        for (int t = 0; t < n; t++)
            for (int64_t s = 0; s < ld; s++) {
                const float g = sc[(int64_t)t * ld + s];
                if (s > pos0 + t) {
                    untouched_bad += bits(g) != POISON;
                    continue;
                }
                double acc = 0;
                for (int h = 0; h < IH; h++) {
                    double d = 0;
                    for (int i = 0; i < ID; i++) d += (double)q[((int64_t)t * IH + h) * ID + i] * k[s * ID + i];
                    if (d > 0) acc += w[(int64_t)t * IH + h] * d;
                }
                const double err = fabs(g - acc);
                if (err > maxerr || err != err) maxerr = err != err ? INFINITY : err;
                if (fabs(acc) > maxref) maxref = fabs(acc);
            }
        printf("idx_scores n=%d heads %d x %d pos0=%lld: max err %.2e of max %.2e\n", n, IH, ID, (long long)pos0,
               maxerr, maxref);
        T_CHECK(maxerr <= 1e-5 * maxref && untouched_bad == 0, "scores config %zu: err %.2e (max %.2e), %d written past the causal limit",
                c, maxerr, maxref, untouched_bad);
        free(q);
        free(w);
        free(k);
        free(sc);
        cudaFree(dq);
        cudaFree(dw);
        cudaFree(dk);
        cudaFree(dsc);
    }
}

/* The absorbed query of head h's q_nope qn (nope) through W_UK (kvb head h's first nope rows of
 * head_rows, kv_lora wide) in the CPU's order (runtime/cpu/attn.c absorb_task), float32, into acc. */
static void absorb_ref(const float *qn, const float *kvb, int h, int nope, int head_rows, int kl, float *acc) {
    for (int cc = 0; cc < kl; cc++) acc[cc] = 0.0f;
    for (int dd = 0; dd < nope; dd++)
        for (int cc = 0; cc < kl; cc++) acc[cc] = acc[cc] + qn[dd] * kvb[((int64_t)h * head_rows + dd) * kl + cc];
}

/* Absorption alone, every output's bits against the CPU's order (runtime/cpu/attn.c absorb_task):
 * token counts that give a block each per-warp count (1 token alone, 1..4 a warp, a second block
 * of one), a nope that is not a multiple of 4 (the scalar loop) and a kv_lora that is not (the
 * unvectorised staging); one token with a nope of 32-row chunks takes k_absorb_one (GLM-5 at TP 1
 * and 8; 2 and 3 chunks, a kv_lora that leaves most of the last block's columns past it). */
static void test_absorb(void) {
    static const struct { int n, h, nope, kl; } cfg[] = {
        {1, 3, 192, 512}, {8, 2, 192, 512}, {26, 2, 192, 512}, {33, 2, 192, 512}, {70, 1, 192, 96},
        {1, 2, 66, 99},   {13, 3, 66, 99},  {33, 2, 66, 99},   {1, 64, 192, 512}, {1, 8, 192, 512},
        {1, 2, 64, 100},  {1, 3, 96, 300},
    };
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        const int n = cfg[c].n, H = cfg[c].h, NOPE = cfg[c].nope, KL = cfg[c].kl, R = 64, HR = NOPE + 128;
        const int QW = NOPE + R;
        float *q = xmalloc((size_t)n * H * QW * 4), *kvb = xmalloc((size_t)H * HR * KL * 4);
        for (int64_t i = 0; i < (int64_t)n * H * QW; i++) q[i] = unif(-1, 1);
        for (int64_t i = 0; i < (int64_t)H * HR * KL; i++) kvb[i] = unif(-0.1f, 0.1f);
        float *dq = dup_d(q, (size_t)n * H * QW * 4), *dkvb = dup_d(kvb, (size_t)H * HR * KL * 4);
        float *dql = dalloc((size_t)n * H * KL * 4);
        CK(cudaMemset(dql, 0xFF, (size_t)n * H * KL * 4));
        g5_error e = {0};
        const cuk_mla_absorb_args ab = {.d = {n, H, NOPE, R, KL}, .q = dq, .kvb = dkvb, .head_rows = HR, .qlat = dql};
        T_CHECK(cuk_mla_absorb(&ab, NULL, &e) == G5_OK, "absorb: %s", e.msg);
        float *ql = xmalloc((size_t)n * H * KL * 4), *acc = xmalloc((size_t)KL * 4);
        get(ql, dql, (size_t)n * H * KL * 4);
        uint64_t diff = 0;
        for (int t = 0; t < n; t++)
            for (int h = 0; h < H; h++) {
                const float *qn = q + ((int64_t)t * H + h) * QW;
                absorb_ref(qn, kvb, h, NOPE, HR, KL, acc);
                for (int cc = 0; cc < KL; cc++) diff += bits(ql[((int64_t)t * H + h) * KL + cc]) != bits(acc[cc]);
            }
        T_CHECK(diff == 0, "absorb n=%d heads=%d nope=%d kv_lora=%d: %llu of %lld outputs differ from the CPU's bits", n,
                H, NOPE, KL, (unsigned long long)diff, (long long)n * H * KL);
        free(q), free(kvb), free(ql), free(acc);
        cudaFree(dq), cudaFree(dkvb), cudaFree(dql);
    }
}

static void test_mla(void) {
    static const struct { int n, h, nope, rope, kl, v; int64_t P; int K; } cfg[] = {
        {4, 4, 192, 64, 512, 256, 100, 32},    /* the oracle model, prefill */
        {1, 8, 192, 64, 512, 256, 3000, 2048}, /* GLM-5 at TP=8 (64 heads / 8), decode */
        {11, 2, 192, 64, 512, 256, 700, 2048},
        {1, 64, 192, 64, 512, 256, 4096, 2048}, /* GLM-5 at TP=1 (the peer model), decode at 4k */
        {3, 12, 192, 64, 512, 256, 600, 2048},  /* heads not a multiple of the head group */
    };
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        const int n = cfg[c].n, H = cfg[c].h, NOPE = cfg[c].nope, R = cfg[c].rope, KL = cfg[c].kl, VH = cfg[c].v, K = cfg[c].K;
        const int64_t P = cfg[c].P, QW = NOPE + R, KVW = KL + R, HR = NOPE + VH;
        float *q = xmalloc((size_t)n * H * QW * 4), *kvb = xmalloc((size_t)H * HR * KL * 4), *lat = xmalloc((size_t)P * KVW * 4);
        for (int64_t i = 0; i < (int64_t)n * H * QW; i++) q[i] = unif(-1, 1);
        for (int64_t i = 0; i < (int64_t)H * HR * KL; i++) kvb[i] = unif(-0.1f, 0.1f);
        for (int64_t i = 0; i < P * KVW; i++) lat[i] = unif(-1, 1);
        int32_t *sel = xmalloc((size_t)n * K * 4), *ns = xmalloc((size_t)n * 4);
        for (int t = 0; t < n; t++) {
            const int cnt = t == 0 ? 1 : t == 1 ? (K < P ? K : (int)P) : (int)(1 + rnd() % (uint64_t)(K < P ? K : P));
            int m = 0;
            for (int64_t s = 0; s < P && m < cnt; s++) /* a random ascending subset of cnt (selection sampling) */
                if ((int64_t)(rnd() % (uint64_t)(P - s)) < cnt - m) sel[(int64_t)t * K + m++] = (int32_t)s;
            ns[t] = m;
            for (int i = m; i < K; i++) sel[(int64_t)t * K + i] = -1;
        }
        float *dq = dup_d(q, (size_t)n * H * QW * 4), *dkvb = dup_d(kvb, (size_t)H * HR * KL * 4), *dlat = dup_d(lat, (size_t)P * KVW * 4);
        int32_t *dsel = dup_d(sel, (size_t)n * K * 4), *dns = dup_d(ns, (size_t)n * 4);
        float *dql = dalloc((size_t)n * H * KL * 4), *dout = dalloc((size_t)n * H * KL * 4);
        CK(cudaMemset(dql, 0xFF, (size_t)n * H * KL * 4));
        CK(cudaMemset(dout, 0xFF, (size_t)n * H * KL * 4));
        const cuk_mla_dims d = {n, H, NOPE, R, KL};
        const float scale = (float)(1.0 / sqrt((double)(NOPE + R)));
        g5_error e = {0};
        const cuk_mla_absorb_args ab = {.d = d, .q = dq, .kvb = dkvb, .head_rows = (int32_t)HR, .qlat = dql};
        T_CHECK(cuk_mla_absorb(&ab, NULL, &e) == G5_OK, "absorb: %s", e.msg);
        /* the f32 cache alone; below also the 16-bit caches and float32 fresh rows */
        cuk_mla_attend_args at = {.d = d, .q = dq, .qlat = dql, .lat = dlat, .lat_type = CUK_F32, .n_pos = P, .sel = dsel,
                                  .ld_sel = K, .n_sel = dns, .max_sel = K, .scale = scale, .out = dout};
        T_CHECK(cuk_mla_attend(&at, NULL, &e) == G5_OK, "attend: %s", e.msg);
        float *ql = xmalloc((size_t)n * H * KL * 4), *out = xmalloc((size_t)n * H * KL * 4);
        get(ql, dql, (size_t)n * H * KL * 4);
        get(out, dout, (size_t)n * H * KL * 4);
        /* absorption: the CPU's order (runtime/cpu/attn.c absorb_task), float32 */
        uint64_t ql_diff = 0;
        double ql_err = 0, ql_max = 0;
        float *acc = xmalloc((size_t)KL * 4);
        double *sc = xmalloc((size_t)K * sizeof(double)), *o = xmalloc((size_t)KL * sizeof(double));
        double at_err = 0, at_max = 0;
        for (int t = 0; t < n; t++)
            for (int h = 0; h < H; h++) {
                const float *qn = q + ((int64_t)t * H + h) * QW;
                absorb_ref(qn, kvb, h, NOPE, (int)HR, KL, acc);
                const float *g = ql + ((int64_t)t * H + h) * KL;
                for (int cc = 0; cc < KL; cc++) {
                    ql_diff += bits(g[cc]) != bits(acc[cc]);
                    const double err = fabs((double)g[cc] - acc[cc]);
                    if (err > ql_err || err != err) ql_err = err != err ? INFINITY : err;
                    if (fabs(acc[cc]) > ql_max) ql_max = fabs(acc[cc]);
                }
                /* attention in float64 from the GPU's absorbed query */
                const int m = ns[t];
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j < m; j++) {
                    const float *row = lat + (int64_t)sel[(int64_t)t * K + j] * KVW;
                    double s = 0;
                    for (int cc = 0; cc < KL; cc++) s += (double)g[cc] * row[cc];
                    for (int i = 0; i < R; i++) s += (double)qn[NOPE + i] * row[KL + i];
                    sc[j] = s * scale;
                    if (sc[j] > mx) mx = sc[j];
                }
                for (int j = 0; j < m; j++) sum += (sc[j] = exp(sc[j] - mx));
                for (int cc = 0; cc < KL; cc++) o[cc] = 0;
                for (int j = 0; j < m; j++) {
                    const float *row = lat + (int64_t)sel[(int64_t)t * K + j] * KVW;
                    for (int cc = 0; cc < KL; cc++) o[cc] += sc[j] / sum * row[cc];
                }
                const float *go = out + ((int64_t)t * H + h) * KL;
                for (int cc = 0; cc < KL; cc++) {
                    const double err = fabs(go[cc] - o[cc]);
                    if (err > at_err || err != err) at_err = err != err ? INFINITY : err;
                    if (fabs(o[cc]) > at_max) at_max = fabs(o[cc]);
                }
            }
        printf("mla n=%d heads=%d P=%lld k=%d: absorb %llu elements not bit-equal to the CPU order (max err %.2e), "
               "attend max err %.2e of max %.2e\n", n, H, (long long)P, K, (unsigned long long)ql_diff, ql_err,
               at_err, at_max);
        T_CHECK(ql_err <= 1e-6 * ql_max, "mla config %zu: absorb err %.2e", c, ql_err);
        T_CHECK(at_err <= 2e-5 * at_max, "mla config %zu: attend err %.2e of %.2e", c, at_err, at_max);
        /* bf16 and f16 latent caches: the reference reads the same rounded values */
        for (uint32_t lt = CUK_BF16; lt <= CUK_F16; lt++) {
            uint16_t *raw = xmalloc((size_t)P * KVW * 2);
            float *latq = xmalloc((size_t)P * KVW * 4);
            for (int64_t i = 0; i < P * KVW; i++) {
                raw[i] = lt == CUK_BF16 ? quant_f32_to_bf16(lat[i]) : quant_f32_to_f16(lat[i]);
                latq[i] = lt == CUK_BF16 ? quant_bf16_to_f32(raw[i]) : quant_f16_to_f32(raw[i]);
            }
            void *dlt = dup_d(raw, (size_t)P * KVW * 2);
            cuk_mla_attend_args atc = at;
            atc.lat = dlt;
            atc.lat_type = lt;
            /* fr = 1: positions from fresh0 on come from float32 rows beside the cache
             * (cuk_mla_attend_fresh: a forward call's own tokens), the rest from the cache */
            for (int fr = 0; fr < 2; fr++) {
            /* from 2/3 of the positions on, or from the last selected key if it lies before */
            int64_t fresh0 = P;
            if (fr) {
                int64_t last = 0;
                for (int t = 0; t < n; t++)
                    if (sel[(int64_t)t * K + ns[t] - 1] > last) last = sel[(int64_t)t * K + ns[t] - 1];
                fresh0 = P - P / 3 < last ? P - P / 3 : last;
            }
            CK(cudaMemset(dout, 0xFF, (size_t)n * H * KL * 4));
            atc.fresh = dlat + fresh0 * KVW;
            atc.fresh0 = fresh0;
            if (fr)
                T_CHECK(cuk_mla_attend_fresh(&atc, NULL, &e) == G5_OK, "attend_fresh: %s", e.msg);
            else
                T_CHECK(cuk_mla_attend(&atc, NULL, &e) == G5_OK, "attend: %s", e.msg);
            get(out, dout, (size_t)n * H * KL * 4);
            double terr = 0, tmax = 0;
            int64_t n_fresh = 0;
            for (int t = 0; t < n; t++)
                for (int h = 0; h < H; h++) {
                    const float *qn = q + ((int64_t)t * H + h) * QW, *g = ql + ((int64_t)t * H + h) * KL;
                    const int m = ns[t];
                    double mx = -INFINITY, sum = 0;
                    for (int j = 0; j < m; j++) {
                        const int64_t sp = sel[(int64_t)t * K + j];
                        const float *row = (sp >= fresh0 ? lat : latq) + sp * KVW;
                        n_fresh += sp >= fresh0;
                        double sv = 0;
                        for (int cc = 0; cc < KL; cc++) sv += (double)g[cc] * row[cc];
                        for (int i = 0; i < R; i++) sv += (double)qn[NOPE + i] * row[KL + i];
                        sc[j] = sv * scale;
                        if (sc[j] > mx) mx = sc[j];
                    }
                    for (int j = 0; j < m; j++) sum += (sc[j] = exp(sc[j] - mx));
                    for (int cc = 0; cc < KL; cc++) o[cc] = 0;
                    for (int j = 0; j < m; j++) {
                        const int64_t sp = sel[(int64_t)t * K + j];
                        const float *row = (sp >= fresh0 ? lat : latq) + sp * KVW;
                        for (int cc = 0; cc < KL; cc++) o[cc] += sc[j] / sum * row[cc];
                    }
                    const float *go = out + ((int64_t)t * H + h) * KL;
                    for (int cc = 0; cc < KL; cc++) {
                        const double err = fabs(go[cc] - o[cc]);
                        if (err > terr || err != err) terr = err != err ? INFINITY : err;
                        if (fabs(o[cc]) > tmax) tmax = fabs(o[cc]);
                    }
                }
            char frs[64] = "";
            if (fr) snprintf(frs, sizeof frs, " + float32 rows from %lld", (long long)fresh0);
            printf("mla n=%d heads=%d P=%lld: %s latent cache%s: attend max err %.2e of max %.2e\n", n, H, (long long)P,
                   lt == CUK_BF16 ? "bf16" : "f16", frs, terr, tmax);
            T_CHECK(terr <= 2e-5 * tmax, "mla config %zu cache type %u fresh %d: err %.2e", c, lt, fr, terr);
            if (fr) T_CHECK(n_fresh > 0, "mla config %zu: no selected key among the float32 rows", c);
            }
            /* a fresh0 outside the positions is refused */
            atc.fresh = dlat;
            atc.fresh0 = P;
            T_CHECK(cuk_mla_attend_fresh(&atc, NULL, &e) == G5_ERR_INVALID_ARG, "fresh0 = n_pos accepted");
            free(raw);
            free(latq);
            cudaFree(dlt);
        }
        /* a position outside the cache makes that row NaN, not a wild read */
        if (n > 1) {
            int32_t badpos = (int32_t)P + 5;
            CK(cudaMemcpy(dsel + K, &badpos, 4, cudaMemcpyHostToDevice)); /* token 1, key 0 */
            T_CHECK(cuk_mla_attend(&at, NULL, &e) == G5_OK, "attend: %s", e.msg);
            get(out, dout, (size_t)n * H * KL * 4);
            int nan_rows = 0;
            for (int h = 0; h < H; h++) nan_rows += is_nan(out[((int64_t)1 * H + h) * KL]);
            T_CHECK(nan_rows == H && !is_nan(out[0]), "bad position: %d/%d NaN rows", nan_rows, H);
        }
        free(q);
        free(kvb);
        free(lat);
        free(sel);
        free(ns);
        free(ql);
        free(out);
        free(acc);
        free(sc);
        free(o);
        cudaFree(dq);
        cudaFree(dkvb);
        cudaFree(dlat);
        cudaFree(dsel);
        cudaFree(dns);
        cudaFree(dql);
        cudaFree(dout);
    }
}

static void test_silu(void) {
    const int64_t rows = 5, dim = 2048 * 3, ld = dim + 4;
    float *g = xmalloc((size_t)rows * ld * 4), *u = xmalloc((size_t)rows * ld * 4), *y = xmalloc((size_t)rows * ld * 4);
    for (int64_t i = 0; i < rows * ld; i++) {
        g[i] = unif(-8, 8);
        u[i] = unif(-2, 2);
    }
    float *dg = dup_d(g, (size_t)rows * ld * 4), *du = dup_d(u, (size_t)rows * ld * 4), *dy = dalloc((size_t)rows * ld * 4);
    CK(cudaMemset(dy, 0xFF, (size_t)rows * ld * 4));
    g5_error e = {0};
    T_CHECK(cuk_silu_mul(dg, ld, du, ld, dy, ld, rows, dim, NULL, &e) == G5_OK, "silu: %s", e.msg);
    get(y, dy, (size_t)rows * ld * 4);
    double err = 0;
    int pad = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < ld; i++) {
            if (i >= dim) {
                pad += bits(y[r * ld + i]) != POISON;
                continue;
            }
            const float ref = rt_silu(g[r * ld + i]) * u[r * ld + i];
            const double d = fabs((double)y[r * ld + i] - ref) / (fabs((double)ref) + 1e-6);
            if (d > err || d != d) err = d != d ? INFINITY : d;
        }
    printf("silu_mul: max rel err %.2e\n", err);
    T_CHECK(err <= 1e-6 && pad == 0, "silu_mul err %.2e, %d padding written", err, pad);
    free(g);
    free(u);
    free(y);
    cudaFree(dg);
    cudaFree(du);
    cudaFree(dy);
}

static void test_convert(void) {
    const int64_t rows = 3, dim = 4096, ldx = dim + 8, ldy = dim + 4;
    float *x = xmalloc((size_t)rows * ldx * 4);
    for (int64_t i = 0; i < rows * ldx; i++) {
        x[i] = unif(-70000, 70000) * ((rnd() & 3) ? 1e-4f : 1.0f);
        if ((rnd() & 31) == 0) x[i] = -0.0f;
    }
    float *dx = dup_d(x, (size_t)rows * ldx * 4);
    uint16_t *dy = dalloc((size_t)rows * ldy * 2), *y = xmalloc((size_t)rows * ldy * 2);
    for (uint32_t t = CUK_BF16; t <= CUK_F16; t++) {
        CK(cudaMemset(dy, 0xAB, (size_t)rows * ldy * 2));
        g5_error e = {0};
        T_CHECK(cuk_convert(dx, ldx, dy, t, ldy, rows, dim, NULL, &e) == G5_OK, "convert: %s", e.msg);
        get(y, dy, (size_t)rows * ldy * 2);
        int bad = 0, pad = 0;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t i = 0; i < ldy; i++) {
                if (i >= dim) {
                    pad += y[r * ldy + i] != 0xABAB;
                    continue;
                }
                const float v = x[r * ldx + i];
                const uint16_t ref = t == CUK_BF16 ? quant_f32_to_bf16(v) : quant_f32_to_f16(v);
                bad += y[r * ldy + i] != ref;
            }
        printf("convert to %s: %d of %lld differ from the CPU rounding\n", t == CUK_BF16 ? "bf16" : "f16", bad,
               (long long)(rows * dim));
        T_CHECK(bad == 0 && pad == 0, "convert type %u: %d wrong, %d padding written", t, bad, pad);
    }
    free(x);
    free(y);
    cudaFree(dx);
    cudaFree(dy);
}

/* ---- oracle ---- */

/* Oracle checks for one GPU model; full: prompt 2, hidden states, top-k, greedy. cross[i]: the
 * first configuration's logits (stored when NULL). */
static void check_gpu(rt_gpu_model *g, const glm5_hparams *hp, const oracle *o, const char *label,
                      float **cross, int full) {
    const uint32_t V = hp->n_vocab, E = hp->n_embd, NL = hp->n_layer_main, K = hp->idx_top_k;
    g5_error e = {0};
    for (int i = 0; i < (full ? N_PROMPTS : 2); i++) {
        const prompt *p = &o->p[i];
        float *lg = xmalloc((size_t)p->n * V * 4);
        float *lh = i == 1 ? xmalloc((size_t)(NL + 1) * p->n * E * 4) : NULL;
        float *hid = i == 1 ? xmalloc((size_t)p->n * E * 4) : NULL;
        int32_t *tk = i == 2 ? xmalloc((size_t)NL * p->n * K * 4) : NULL;
        rt_gpu_reset(g);
        rt_gpu_outputs out = {.logits = lg, .all_logits = 1, .hidden = hid, .layer_hidden = lh, .topk = tk};
        const double t0 = t_now_s();
        g5_status st = rt_gpu_forward(g, p->ids, p->n, &out, &e);
        const double secs = t_now_s() - t0;
        T_CHECK(st == G5_OK, "%s: prompt %d: %s", label, i, e.msg);
        if (!st) {
            const double rel = rel_l2(lg, p->ref, (size_t)p->n * V);
            uint32_t agree = 0, checked = 0, agree_all = 0;
            for (uint32_t t = 0; t < p->n; t++) {
                const uint32_t a = argmax(lg + (size_t)t * V, V);
                agree_all += a == (uint32_t)p->argmax[t];
                if (top2_gap(p->ref + (size_t)t * V, V) > 0.01f) {
                    checked++;
                    agree += a == (uint32_t)p->argmax[t];
                }
            }
            printf("%s: prompt %d (%u tokens, %.3f s): logits rel L2 %.3e (tol %.0e), argmax %u/%u (%u/%u where top-2 gap > 0.01)\n",
                   label, i, p->n, secs, rel, k_tol_logits[i], agree_all, p->n, agree, checked);
            T_CHECK(rel <= k_tol_logits[i], "%s: prompt %d logits rel L2 %.3e > %.0e", label, i, rel, k_tol_logits[i]);
            if (i < 2) T_CHECK(agree == checked, "%s: prompt %d argmax %u/%u", label, i, agree, checked);
            if (cross) {
                if (!cross[i]) {
                    cross[i] = xmalloc((size_t)p->n * V * 4);
                    memcpy(cross[i], lg, (size_t)p->n * V * 4);
                } else {
                    const double x = rel_l2(lg, cross[i], (size_t)p->n * V);
                    printf("%s: prompt %d vs the first configuration: rel L2 %.3e\n", label, i, x);
                    T_CHECK(x <= 1e-4, "%s: prompt %d differs from the first configuration by %.3e", label, i, x);
                }
            }
            if (i == 1) {
                char buf[512];
                int off = snprintf(buf, sizeof buf, "%s: prompt 1 hidden rel L2 per layer:", label);
                for (uint32_t l = 0; l <= NL; l++) {
                    const float *ours = l < NL ? lh + (size_t)l * p->n * E : hid;
                    const double r = rel_l2(ours, o->hidden + (size_t)l * p->n * E, (size_t)p->n * E);
                    off += snprintf(buf + off, sizeof buf - (size_t)off, " %.3e", r);
                    T_CHECK(r <= 1e-3, "%s: hidden state %u rel L2 %.3e", label, l, r);
                }
                printf("%s\n", buf);
            }
            if (i == 2 && o->topk_layers == NL && o->topk_k == K && K <= 4096) {
                for (uint32_t l = 0; l < NL; l++) {
                    uint32_t rows = 0, same = 0, max_diff = 0;
                    for (uint32_t t = K; t < p->n; t++) {
                        int32_t a[4096], b[4096];
                        memcpy(a, tk + ((size_t)l * p->n + t) * K, K * 4);
                        memcpy(b, o->topk + ((size_t)l * p->n + t) * K, K * 4);
                        qsort(b, K, 4, cmp_i32);
                        uint32_t common = 0, x = 0, y = 0;
                        while (x < K && y < K) {
                            if (a[x] == b[y]) common++, x++, y++;
                            else if (a[x] < b[y]) x++;
                            else y++;
                        }
                        rows++;
                        same += common == K;
                        if (K - common > max_diff) max_diff = K - common;
                    }
                    printf("%s: prompt 2 layer %u top-k: %u/%u rows identical, worst row differs in %u keys\n", label,
                           l, same, rows, max_diff);
                    T_CHECK(same * 100 >= rows * 99, "%s: layer %u top-k rows identical %u/%u", label, l, same, rows);
                    T_CHECK(max_diff <= 2, "%s: layer %u a top-k row differs in %u keys", label, l, max_diff);
                }
            }
        }
        free(lg);
        free(lh);
        free(hid);
        free(tk);
    }
    if (!full) return;
    const prompt *p = &o->p[o->greedy_prompt];
    float *last = xmalloc((size_t)V * 4);
    rt_gpu_reset(g);
    rt_gpu_outputs out = {.logits = last};
    int ok = rt_gpu_forward(g, p->ids, p->n, &out, &e) == G5_OK;
    uint32_t match = 0;
    const double t0 = t_now_s();
    for (uint32_t i = 0; ok && i < o->n_greedy; i++) {
        int32_t tok = (int32_t)argmax(last, V);
        if (tok != o->greedy[i]) break;
        match++;
        ok = rt_gpu_forward(g, &tok, 1, &out, &e) == G5_OK;
    }
    const double secs = t_now_s() - t0;
    T_CHECK(ok, "%s: greedy decode ran: %s", label, e.msg);
    printf("%s: greedy continuation of prompt %u: %u/%u tokens equal the oracle's (%u decode steps in %.3f s)\n", label,
           o->greedy_prompt, match, o->n_greedy, match, secs);
    T_CHECK(match == o->n_greedy, "%s: greedy continuation matches %u/%u", label, match, o->n_greedy);
    free(last);
}

/* ---- 2. loader ---- */

static void test_loader(const char *dir, const char *tmp) {
    blob_set *set = NULL;
    g5_error e = {0};
    T_CHECK(blob_set_open(dir, &set, &e) == G5_OK, "open %s: %s", dir, e.msg);
    if (!set) return;
    const blob *b = blob_set_rank(set, 0);
    const blob_info *in = blob_get_info(b);
    uint64_t len;
    const uint8_t *img = blob_get_bytes(b, &len);
    uint8_t *back = xmalloc(in->data_size);
    for (int v = 0; v < 3; v++) {
        rt_gpu_load_opts o;
        rt_gpu_load_opts_default(&o);
        const char *what = "default (4 readers, 16 MiB buffers, checksums, O_DIRECT)";
        if (v == 1) {
            o.n_threads = 3;
            o.buf_bytes = 64 << 10;
            o.bufs_per_thread = 3;
            what = "64 KiB ring of 3 per reader";
        } else if (v == 2) {
            o.direct = 0;
            o.verify = 0;
            what = "buffered reads, no checksums";
        }
        void *dev = NULL;
        rt_gpu_load_stats ls;
        memset(&ls, 0, sizeof ls);
        g5_status st = rt_gpu_load_blob(b, 0, &o, &dev, &ls, &e);
        T_CHECK(st == G5_OK, "load (%s): %s", what, e.msg);
        if (st) continue;
        CK(cudaMemcpy(back, dev, in->data_size, cudaMemcpyDeviceToHost));
        T_CHECK(memcmp(back, img + in->data_offset, in->data_size) == 0, "load (%s): device bytes differ from the file", what);
        printf("loader %s: %llu bytes in %.4f s (%.2f GB/s), %u threads, %llu O_DIRECT + %llu buffered reads, checksums %s\n",
               what, (unsigned long long)ls.bytes, ls.seconds, ls.gb_per_s, ls.n_threads,
               (unsigned long long)ls.direct_reads, (unsigned long long)ls.buffered_reads, ls.verified ? "verified" : "off");
        T_CHECK(ls.bytes == in->data_size && ls.verified == o.verify, "load stats");
        cudaFree(dev);
    }
    /* one flipped byte in the middle of a tensor */
    const char *victim = "blk.1.ffn_down_exps.weight";
    const blob_tensor *bt = blob_find_tensor(b, victim);
    T_CHECK(bt != NULL, "victim tensor present");
    char bad[4200], cmd[13000], path[4300], fname[64];
    snprintf(bad, sizeof bad, "%s/corrupt", tmp);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", bad, dir, bad);
    T_CHECK(system(cmd) == 0, "copy the set");
    blob_rank_filename(0, 1, fname, sizeof fname);
    snprintf(path, sizeof path, "%s/%s", bad, fname);
    if (bt) {
        const uint64_t off = bt->offset + bt->size / 2;
        int fd = open(path, O_RDWR);
        uint8_t byte = 0;
        T_CHECK(fd >= 0 && pread(fd, &byte, 1, (off_t)off) == 1, "read victim byte");
        byte ^= 0x10;
        T_CHECK(fd >= 0 && pwrite(fd, &byte, 1, (off_t)off) == 1, "write victim byte");
        if (fd >= 0) close(fd);
    }
    blob_set *bs = NULL;
    T_CHECK(blob_set_open(bad, &bs, &e) == G5_OK, "the damaged set still opens (data is not read at open): %s", e.msg);
    if (bs) {
        void *dev = NULL;
        rt_gpu_load_opts o;
        rt_gpu_load_opts_default(&o);
        memset(&e, 0, sizeof e);
        g5_status st = rt_gpu_load_blob(blob_set_rank(bs, 0), 0, &o, &dev, NULL, &e);
        printf("loader on the damaged blob: %s (%s)\n", g5_strerror(st), e.msg);
        T_CHECK(st == G5_ERR_CHECKSUM, "damaged blob refused with a checksum error (got %s)", g5_strerror(st));
        T_CHECK(strstr(e.msg, victim) != NULL, "the message names %s: %s", victim, e.msg);
        T_CHECK(dev == NULL, "nothing handed out");
        o.verify = 0;
        st = rt_gpu_load_blob(blob_set_rank(bs, 0), 0, &o, &dev, NULL, &e);
        T_CHECK(st == G5_OK, "--no-verify loads the damaged blob: %s", e.msg);
        if (dev) cudaFree(dev);
        blob_set_free(bs);
    }
    /* the same through the model */
    rt_wset *ws = NULL;
    rt_model *m = NULL;
    rt_gpu_model *g = NULL;
    /* the CPU open would refuse it (rt_wset_open verifies): skip that, the GPU loader is tested */
    T_CHECK(rt_wset_open_blobs(bad, &ws, &e) == G5_ERR_CHECKSUM && strstr(e.msg, victim), "CPU open refuses: %s", e.msg);
    rt_wset_opts nv = {.no_verify = 1};
    T_CHECK(rt_wset_open_ex(bad, &nv, &ws, NULL, &e) == G5_OK, "open damaged set (--no-verify): %s", e.msg);
    rt_model_opts mo = {.n_threads = 1, .mla = RT_MLA_ABSORBED};
    if (ws) T_CHECK(rt_model_create(ws, &mo, &m, &e) == G5_OK, "CPU model on the damaged set: %s", e.msg);
    if (m) {
        rt_gpu_opts go;
        rt_gpu_opts_default(&go);
        go.blobs = rt_wset_blobs(rt_model_wset(m)); /* the damaged set */
        memset(&e, 0, sizeof e);
        g5_status st = rt_gpu_model_create(m, &go, &g, &e);
        printf("rt_gpu_model_create on the damaged set: %s (%s)\n", g5_strerror(st), e.msg);
        T_CHECK(st == G5_ERR_CHECKSUM && strstr(e.msg, victim), "model refuses the damaged blob naming the tensor");
        rt_gpu_model_free(g);
    }
    rt_model_free(m);
    rt_wset_free(ws);
    free(back);
    blob_set_free(set);
}

/* A synthetic blob with 1 MiB hash chunks (the converter's are 64 MiB, more than the whole oracle):
 * many chunks, so several readers work at once; random tensor bytes. */
static void test_loader_chunks(const char *tmp) {
    enum { NTEN = 23 };
    char path[4300];
    snprintf(path, sizeof path, "%s/chunks.g5b", tmp);
    gguf_writer *gw = gguf_writer_create();
    uint8_t *meta = NULL;
    uint64_t meta_len = 0;
    gguf_writer_set_str(gw, "general.architecture", "glm-dsa", 7);
    T_CHECK(gguf_writer_write_buffer(gw, &meta, &meta_len) == G5_OK, "meta image");
    gguf_writer_free(gw);
    blob_writer_tensor wt[NTEN];
    char names[NTEN][32];
    uint64_t total = 0;
    for (int i = 0; i < NTEN; i++) {
        memset(&wt[i], 0, sizeof wt[i]);
        snprintf(names[i], sizeof names[i], "t%02d.weight", i);
        const uint64_t ne = 100000 + 37000 * (uint64_t)i; /* 0.4 .. 3.6 MB, unaligned sizes */
        wt[i] = (blob_writer_tensor){names[i], QT_F32, 1, {ne, 1, 1, 1}, {ne, 1, 1, 1}, BLOB_AXIS_NONE, 0, 1, 0};
        total += ne * 4;
    }
    blob_source_desc src = {"synthetic.gguf", 1, 1, {0}, {0}};
    blob_writer_params p;
    memset(&p, 0, sizeof p);
    p.tp = 1;
    p.placement = BLOB_PLACE_TP;
    p.kv_b_type = QT_F32;
    p.meta = meta;
    p.meta_len = meta_len;
    p.n_sources = 1;
    p.sources = &src;
    p.chunk_size = 1 << 20;
    blob_writer *w = NULL;
    g5_error e = {0};
    T_CHECK(blob_writer_create(path, &p, wt, NTEN, &w, &e) == G5_OK, "blob writer: %s", e.msg);
    free(meta);
    if (!w) return;
    uint8_t *buf = xmalloc(1 << 20);
    for (uint64_t done = 0; done < total;) {
        const uint64_t nb = total - done < (1u << 20) ? total - done : (1u << 20);
        for (uint64_t i = 0; i < nb; i++) buf[i] = (uint8_t)rnd();
        T_CHECK(blob_writer_write(w, buf, nb, &e) == G5_OK, "write: %s", e.msg);
        done += nb;
    }
    free(buf);
    T_CHECK(blob_writer_finish(w, NULL, &e) == G5_OK, "finish: %s", e.msg);
    blob_writer_free(w);
    blob *b = NULL;
    T_CHECK(blob_open(path, &b, &e) == G5_OK, "open: %s", e.msg);
    if (!b) return;
    const blob_info *in = blob_get_info(b);
    uint64_t len;
    const uint8_t *img = blob_get_bytes(b, &len);
    rt_gpu_load_opts o;
    rt_gpu_load_opts_default(&o);
    o.n_threads = 4;
    o.buf_bytes = 256 << 10;
    o.bufs_per_thread = 3;
    void *dev = NULL;
    rt_gpu_load_stats ls;
    memset(&ls, 0, sizeof ls);
    g5_status st = rt_gpu_load_blob(b, 0, &o, &dev, &ls, &e);
    T_CHECK(st == G5_OK, "chunked load: %s", e.msg);
    if (!st) {
        uint8_t *back = xmalloc(in->data_size);
        CK(cudaMemcpy(back, dev, in->data_size, cudaMemcpyDeviceToHost));
        T_CHECK(memcmp(back, img + in->data_offset, in->data_size) == 0, "chunked load: device bytes differ from the file");
        free(back);
        cudaFree(dev);
        printf("loader, %llu chunks of 1 MiB: %llu bytes in %.4f s (%.2f GB/s), %u readers, %llu O_DIRECT + %llu buffered reads\n",
               (unsigned long long)in->n_chunks, (unsigned long long)ls.bytes, ls.seconds, ls.gb_per_s, ls.n_threads,
               (unsigned long long)ls.direct_reads, (unsigned long long)ls.buffered_reads);
        T_CHECK(ls.n_threads == 4 && in->n_chunks > 8, "several readers over several chunks");
    }
    const blob_tensor *bt = blob_find_tensor(b, "t13.weight");
    const uint64_t off = bt ? bt->offset + 12345 : 0;
    blob_free(b);
    int fd = open(path, O_RDWR);
    uint8_t byte = 0;
    T_CHECK(bt && fd >= 0 && pread(fd, &byte, 1, (off_t)off) == 1, "read byte");
    byte ^= 1;
    T_CHECK(fd >= 0 && pwrite(fd, &byte, 1, (off_t)off) == 1, "flip byte");
    if (fd >= 0) close(fd);
    b = NULL;
    T_CHECK(blob_open(path, &b, &e) == G5_OK, "reopen: %s", e.msg);
    if (!b) return;
    dev = NULL;
    memset(&e, 0, sizeof e);
    st = rt_gpu_load_blob(b, 0, &o, &dev, NULL, &e);
    printf("loader, damaged chunked blob: %s (%s)\n", g5_strerror(st), e.msg);
    T_CHECK(st == G5_ERR_CHECKSUM && strstr(e.msg, "t13.weight") && !dev, "damaged tensor t13 named");
    blob_free(b);
}

/* ---- configurations ---- */

static rt_gpu_model *open_gpu(const char *path, int blobs, rt_wset **ws, rt_model **m, const char *label) {
    g5_error e = {0};
    *ws = NULL;
    *m = NULL;
    T_CHECK((blobs ? rt_wset_open_blobs(path, ws, &e) : rt_wset_open_gguf(path, ws, &e)) == G5_OK, "%s: open: %s", label, e.msg);
    if (!*ws) return NULL;
    rt_model_opts mo = {.n_threads = 0, .mla = RT_MLA_ABSORBED};
    T_CHECK(rt_model_create(*ws, &mo, m, &e) == G5_OK, "%s: CPU model: %s", label, e.msg);
    if (!*m) return NULL;
    rt_gpu_opts go;
    rt_gpu_opts_default(&go);
    go.blobs = blobs ? rt_wset_blobs(rt_model_wset(*m)) : NULL;
    rt_gpu_model *g = NULL;
    T_CHECK(rt_gpu_model_create(*m, &go, &g, &e) == G5_OK, "%s: GPU model: %s", label, e.msg);
    if (g) {
        const rt_gpu_info *gi = rt_gpu_model_info(g);
        printf("%s: %s, %u rank(s) on %u device(s), collective %s, weights %llu bytes (+%llu float32 extras), load %.4f s (%.2f GB/s)\n",
               label, gi->device_name, gi->n_ranks, gi->n_devices, gi->collective, (unsigned long long)gi->weight_bytes,
               (unsigned long long)gi->extra_bytes, gi->load.seconds, gi->load.gb_per_s);
        /* the oracle's attn_k_b / attn_v_b (Q5_0 / Q6_K) give the exact int8 form at each of its
         * 3 main layers (and the NextN one where loaded) where the set holds them with a rank's heads */
        if (gi->n_ranks == 1 || blobs)
            T_CHECK(gi->kvb_exact_layers >= 3 * gi->n_local_ranks, "%s: %u layer(s) read kv_b's exact int8 form at decode",
                    label, gi->kvb_exact_layers);
    }
    return g;
}

static void close_gpu(rt_gpu_model *g, rt_model *m, rt_wset *ws) {
    rt_gpu_model_free(g);
    rt_model_free(m);
    rt_wset_free(ws);
}

/* Positions of prompt p where lg's argmax equals the oracle's; the misses (position and the oracle's
 * top-2 gap there) are listed in miss (" none" if there are none). */
static uint32_t argmax_agree(const prompt *p, const float *lg, uint32_t V, char *miss, size_t cap) {
    uint32_t agree = 0;
    int mo = 0;
    miss[0] = 0;
    for (uint32_t t = 0; t < p->n; t++) {
        const int a = argmax(lg + (size_t)t * V, V) == (uint32_t)p->argmax[t];
        agree += a;
        if (!a && mo < (int)cap - 112)
            mo += snprintf(miss + mo, cap - (size_t)mo, " %u(gap %.3f)", t, (double)top2_gap(p->ref + (size_t)t * V, V));
    }
    if (!mo) snprintf(miss, cap, " none");
    return agree;
}

/* Fast mode's fidelity bar (issue 13, specs/numerics.md "Fast mode"): on prompts 0 and 1 the
 * argmax equals the oracle's at every dense position (< 32 = index_topk: no indexer choice yet)
 * whose reference top-2 gap exceeds 0.1; logits rel L2 on prompts 0/1/2 no worse than llama.cpp's
 * default path on the same file (0.09 / 0.26 / 0.51, ../shared/oracle/README.md). */
static const double k_fast_rel_l2[3] = {0.09, 0.26, 0.51};

static void fast_bar(const char *name, int i, const prompt *p, const float *lg, uint32_t V) {
    uint32_t sure = 0, sure_n = 0;
    char miss[512] = "";
    int mo = 0;
    for (uint32_t t = 0; t < p->n && t < 32; t++) {
        if (top2_gap(p->ref + (size_t)t * V, V) <= 0.1f) continue;
        sure_n++;
        if (argmax(lg + (size_t)t * V, V) == (uint32_t)p->argmax[t]) sure++;
        else if (mo < 400) mo += snprintf(miss + mo, sizeof miss - (size_t)mo, " %u", t);
    }
    const double rel = rel_l2(lg, p->ref, (size_t)p->n * V);
    printf("%s: prompt %d: fast bar: dense argmax %u/%u where the gap > 0.1%s%s, logits rel L2 %.3e (bar %.2f)\n",
           name, i, sure, sure_n, mo ? "; misses at" : "", miss, rel, i < 3 ? k_fast_rel_l2[i] : 0.0);
    if (i < 2) T_CHECK(sure == sure_n, "%s: prompt %d dense argmax where the gap > 0.1: %u/%u", name, i, sure, sure_n);
    if (i < 3) T_CHECK(rel <= k_fast_rel_l2[i], "%s: prompt %d logits rel L2 %.3e above %.2f", name, i, rel,
                       k_fast_rel_l2[i]);
}

/* The cache read back: prompt 1 as a 32-token prefill, then one token per call (each call
 * attends the earlier tokens through the latent cache, in its storage type). With an f32
 * cache that is the precise arithmetic in another order: held to the precise tolerance. The
 * bf16/f16 numbers are measured and printed (what a rounded cache costs at decode). */
static void decode_path(rt_gpu_model *g, const oracle *o, uint32_t V, const char *name, int f32_cache) {
    const prompt *p = &o->p[1];
    const uint32_t first = p->n < 32 ? p->n : 32;
    float *lg = xmalloc((size_t)p->n * V * 4);
    g5_error e = {0};
    rt_gpu_reset(g);
    rt_gpu_outputs out = {.logits = lg, .all_logits = 1};
    g5_status st = rt_gpu_forward(g, p->ids, first, &out, &e);
    for (uint32_t t = first; t < p->n && !st; t++) {
        rt_gpu_outputs o1 = {.logits = lg + (size_t)t * V};
        st = rt_gpu_forward(g, p->ids + t, 1, &o1, &e);
    }
    T_CHECK(st == G5_OK, "%s decode path: %s", name, e.msg);
    if (!st) {
        char miss[512];
        const uint32_t agree = argmax_agree(p, lg, V, miss, sizeof miss);
        const double rel = rel_l2(lg, p->ref, (size_t)p->n * V);
        printf("mode %s: prompt 1 as prefill 0..%u + %u single-token calls (cache read back): argmax agreement "
               "%.4f (%u/%u), logits rel L2 %.3e; misses at%s\n", name, first - 1, p->n - first,
               (double)agree / p->n, agree, p->n, rel, miss);
        /* the 32-token prefill runs fast mode's bf16 products: the fast bar, whatever the cache */
        if (f32_cache) fast_bar(name, 1, p, lg, V);
    }
    free(lg);
}

/* The precisions (runtime/gpu/gpu_model.h) and the latent cache types: argmax agreement with the
 * oracle on prompts 0 and 1 (see the check below for what is checked and what is only printed). */
static void test_modes(const char *dir, const oracle *o) {
    static const struct { rt_gpu_precision prec; rt_gpu_cache cache; int h16; const char *name; } cfg[] = {
        {RT_GPU_PRECISE, RT_GPU_CACHE_BF16, 0, "precise, bf16 cache"},
        {RT_GPU_PRECISE, RT_GPU_CACHE_F16, 0, "precise, f16 cache"},
        {RT_GPU_FAST, RT_GPU_CACHE_F32, 0, "fast, f32 cache"},
        {RT_GPU_FAST, RT_GPU_CACHE_BF16, 0, "fast, bf16 cache"},
        {RT_GPU_FAST, RT_GPU_CACHE_F16, 0, "fast, f16 cache"},
        /* glm5-serve's batch-invariant fp16 products (rt_gpu_opts.h16_products): the same bar */
        {RT_GPU_FAST, RT_GPU_CACHE_BF16, 1, "fast, bf16 cache, fp16 products"},
        {RT_GPU_FAST, RT_GPU_CACHE_F16, 1, "fast, f16 cache, fp16 products"},
        {RT_GPU_BF16ACT, RT_GPU_CACHE_F32, 0, "bf16act, f32 cache"},
        {RT_GPU_BF16ACT, RT_GPU_CACHE_BF16, 0, "bf16act, bf16 cache"},
        {RT_GPU_BF16ACT, RT_GPU_CACHE_F16, 0, "bf16act, f16 cache"},
    };
    g5_error e = {0};
    rt_wset *ws = NULL;
    rt_model *m = NULL;
    T_CHECK(rt_wset_open_blobs(dir, &ws, &e) == G5_OK, "open: %s", e.msg);
    rt_model_opts mo = {.n_threads = 1, .mla = RT_MLA_ABSORBED};
    if (ws) T_CHECK(rt_model_create(ws, &mo, &m, &e) == G5_OK, "model: %s", e.msg);
    if (!m) {
        rt_wset_free(ws);
        return;
    }
    const uint32_t V = rt_model_hparams(m)->n_vocab;
    float *int8_lg = NULL; /* prompt 0's logits, fast with the bf16 cache and int8 products */
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        rt_gpu_opts go;
        rt_gpu_opts_default(&go);
        go.precision = cfg[c].prec;
        go.cache = cfg[c].cache;
        go.h16_products = cfg[c].h16;
        go.blobs = dir ? rt_wset_blobs(rt_model_wset(m)) : NULL;
        rt_gpu_model *g = NULL;
        T_CHECK(rt_gpu_model_create(m, &go, &g, &e) == G5_OK, "%s: %s", cfg[c].name, e.msg);
        if (!g) continue;
        T_CHECK(rt_gpu_model_info(g)->h16_products == cfg[c].h16, "%s: h16_products %d", cfg[c].name,
                rt_gpu_model_info(g)->h16_products);
        for (int i = 0; i < 2; i++) {
            const prompt *p = &o->p[i];
            float *lg = xmalloc((size_t)p->n * V * 4);
            rt_gpu_reset(g);
            rt_gpu_outputs out = {.logits = lg, .all_logits = 1};
            g5_status st = rt_gpu_forward(g, p->ids, p->n, &out, &e);
            T_CHECK(st == G5_OK, "%s prompt %d: %s", cfg[c].name, i, e.msg);
            if (!st) {
                uint32_t agree = 0, dense = 0, dense_n = 0, sure = 0, sure_n = 0;
                char miss[512] = "";
                int mo = 0;
                for (uint32_t t = 0; t < p->n; t++) {
                    const uint32_t am = argmax(lg + (size_t)t * V, V);
                    const int a = am == (uint32_t)p->argmax[t];
                    const float gap = top2_gap(p->ref + (size_t)t * V, V);
                    agree += a;
                    if (t < 32) {
                        dense_n++, dense += a;
                        if (gap > 0.01f) sure_n++, sure += a;
                    }
                    if (!a && mo < 400)
                        mo += snprintf(miss + mo, sizeof miss - (size_t)mo, " %u(gap %.3f)", t, (double)gap);
                }
                const double rel = rel_l2(lg, p->ref, (size_t)p->n * V);
                printf("mode %s: prompt %d: argmax agreement %.4f (%u/%u; up to position 31: %u/%u, %u/%u where the "
                       "oracle's top-2 gap > 0.01), logits rel L2 %.3e; misses at%s\n",
                       cfg[c].name, i, (double)agree / p->n, agree, p->n, dense, dense_n, sure, sure_n, rel,
                       mo ? miss : " none");
                /* Checked for precise and fast: the target, >= 0.99 over the whole prompt,
                 * and the dense regime (positions < 32 = top_k) at positions whose reference top-2
                 * gap exceeds 0.01 (the float32 paths' criterion, test_oracle_logits). The
                 * bf16-input mode is only measured: its 3e-3 per-stage rounding flips near-tied
                 * indexer/router choices on this random model (the oracle's README). */
                if (cfg[c].prec == RT_GPU_FAST) fast_bar(cfg[c].name, i, p, lg, V);
                const int bf16_fast = cfg[c].prec == RT_GPU_FAST && cfg[c].cache == RT_GPU_CACHE_BF16;
                if (bf16_fast && i == 0 && cfg[c].h16 && int8_lg) /* the fp16 kernels ran at all */
                    T_CHECK(memcmp(int8_lg, lg, (size_t)p->n * V * 4) != 0, "%s: logits equal to the int8 products'",
                            cfg[c].name);
                if (bf16_fast && i == 0 && !cfg[c].h16) { /* kept for the fp16-products rows (lg handed over) */
                    free(int8_lg);
                    int8_lg = lg;
                    lg = NULL;
                }
                if (cfg[c].prec == RT_GPU_PRECISE) {
                    T_CHECK(sure == sure_n, "%s: prompt %d argmax up to position 31 where the gap > 0.01: %u/%u",
                            cfg[c].name, i, sure, sure_n);
                    T_CHECK(agree >= 0.99 * p->n, "%s: prompt %d argmax agreement %u/%u below 0.99", cfg[c].name, i,
                            agree, p->n);
                }
            }
            free(lg);
        }
        if (cfg[c].prec == RT_GPU_FAST) decode_path(g, o, V, cfg[c].name, cfg[c].cache == RT_GPU_CACHE_F32);
        rt_gpu_model_free(g);
    }
    free(int8_lg);
    rt_model_free(m);
    rt_wset_free(ws);
}

static void test_check_tool(const char *dir, const oracle *o) {
    rt_wset *ws;
    rt_model *m;
    rt_gpu_model *g = open_gpu(dir, 1, &ws, &m, "check");
    if (!g) {
        close_gpu(g, m, ws);
        return;
    }
    rt_gpu_check_opts co;
    rt_gpu_check_opts_default(&co);
    co.n_tokens = 100000;
    co.report = stdout;
    rt_gpu_check *c = NULL;
    g5_error e = {0};
    T_CHECK(rt_gpu_check_create(m, g, &co, &c, &e) == G5_OK, "check create: %s", e.msg);
    const prompt *p = &o->p[1];
    const uint32_t V = rt_model_hparams(m)->n_vocab;
    float *last = xmalloc((size_t)V * 4);
    rt_gpu_outputs out = {.logits = last};
    int ok = c && rt_gpu_check_forward(c, p->ids, p->n, &out, &e) == G5_OK;
    for (int i = 0; ok && i < 3; i++) {
        int32_t tok = (int32_t)argmax(last, V);
        ok = rt_gpu_check_forward(c, &tok, 1, &out, &e) == G5_OK;
    }
    T_CHECK(ok, "checked forward: %s", e.msg);
    if (c) {
        rt_gpu_check_summary s;
        rt_gpu_check_get_summary(c, &s);
        printf("check over %u tokens: %s; stage max rel diff attn %.3e, moe %.3e; layer %.3e; logits rel L2 %.3e; "
               "top-k overlap >= %.4f\n", s.n_tokens, s.ok ? "ok" : "FAILED", s.max_stage_attn, s.max_stage_ffn,
               s.max_layer, s.logits_rel_l2, s.min_overlap_mean);
        T_CHECK(s.ok && s.n_tokens == p->n + 3, "GPU within tolerance of the CPU at every stage");
        T_CHECK(s.max_stage_attn <= 1e-4 && s.max_stage_ffn <= 1e-4, "stage differences are float32 rounding");
    }
    rt_gpu_check_free(c);
    free(last);
    close_gpu(g, m, ws);
}

/* ---- 7. the prefill GEMM path (runtime/gpu/gpu_linear.h) ---- */

/* One prompt through g: all logits, and layer_hidden ([NL + 1][n][E]) and hidden when asked. */
static int gemm_run(rt_gpu_model *g, const prompt *p, float *lg, float *lh, float *hid, double *secs, const char *label,
                    int i) {
    g5_error e = {0};
    rt_gpu_reset(g);
    rt_gpu_outputs out = {.logits = lg, .all_logits = 1, .layer_hidden = lh, .hidden = hid};
    const double t0 = t_now_s();
    const g5_status st = rt_gpu_forward(g, p->ids, p->n, &out, &e);
    *secs = t_now_s() - t0;
    T_CHECK(st == G5_OK, "%s: prompt %d: %s", label, i, e.msg);
    return st == G5_OK;
}

static rt_gpu_model *gemm_model(rt_model *m, const char *dir, rt_gpu_precision prec, int gmin, int gmin_exp,
                                rt_gpu_gemm mode, uint32_t tile_kb, const char *label) {
    rt_gpu_opts go;
    rt_gpu_opts_default(&go);
    go.precision = prec;
    go.blobs = dir ? rt_wset_blobs(rt_model_wset(m)) : NULL;
    go.gemm_min = gmin;
    go.gemm_min_expert = gmin_exp;
    go.gemm = mode;
    go.gemm_tile_kb = tile_kb;
    g5_error e = {0};
    rt_gpu_model *g = NULL;
    T_CHECK(rt_gpu_model_create(m, &go, &g, &e) == G5_OK, "%s: %s", label, e.msg);
    if (g) {
        const rt_gpu_info *gi = rt_gpu_model_info(g);
        printf("%s: precision %s, gemm %s from %d tokens (experts from %d rows)\n", label, gi->precision, gi->gemm,
               gi->gemm_min, gi->gemm_min_expert);
    }
    return g;
}

/* The GEMM path against the oracle and against the GEMV path. */
static void test_prefill_gemm(const char *dir, const char *dir_tp2, const char *dir_ep, const oracle *o,
                              float **cross) {
    g5_error e = {0};
    rt_wset *ws = NULL;
    rt_model *m = NULL;
    T_CHECK(rt_wset_open_blobs(dir, &ws, &e) == G5_OK, "open: %s", e.msg);
    rt_model_opts mo = {.n_threads = 1, .mla = RT_MLA_ABSORBED};
    if (ws) T_CHECK(rt_model_create(ws, &mo, &m, &e) == G5_OK, "model: %s", e.msg);
    if (!m) {
        rt_wset_free(ws);
        return;
    }
    const glm5_hparams *hp = rt_model_hparams(m);
    const uint32_t V = hp->n_vocab, E = hp->n_embd, NL = hp->n_layer_main;
    /* the GEMV path's outputs (precise) */
    float *ref_lg[N_PROMPTS], *ref_lh[N_PROMPTS], *ref_hid[N_PROMPTS];
    double ref_s[N_PROMPTS];
    int have_ref = 1;
    rt_gpu_model *g = gemm_model(m, dir, RT_GPU_PRECISE, -1, 0, RT_GPU_GEMM_DEFAULT, 0, "gemm off (GEMV), precise");
    for (int i = 0; i < N_PROMPTS; i++) {
        const prompt *p = &o->p[i];
        ref_lg[i] = xmalloc((size_t)p->n * V * 4);
        ref_lh[i] = xmalloc((size_t)(NL + 1) * p->n * E * 4);
        ref_hid[i] = xmalloc((size_t)p->n * E * 4);
        have_ref = have_ref && g && gemm_run(g, p, ref_lg[i], ref_lh[i], ref_hid[i], &ref_s[i], "gemv", i);
    }
    if (g) T_CHECK(rt_gpu_model_info(g)->gemm_calls == 0, "gemm off: %llu GEMMs ran",
                   (unsigned long long)rt_gpu_model_info(g)->gemm_calls);
    rt_gpu_model_free(g);

    /* precise, forced on: the oracle's tolerances (check_gpu: logits, argmax, hidden states,
     * top-k, greedy continuation), then against the GEMV path; then the experts by GEMV on
     * their gathered rows, and tiny tiles (row-chunked dequantization and expert rows) */
    static const struct { int gmin_exp; uint32_t tile_kb; int full; const char *name; } pc[] = {
        {1, 0, 1, "gemm precise forced"},
        {-1, 0, 0, "gemm precise forced, experts by GEMV"},
        {1, 64, 0, "gemm precise forced, 64 KB tiles"},
    };
    for (size_t c = 0; c < sizeof pc / sizeof pc[0]; c++) {
        g = gemm_model(m, dir, RT_GPU_PRECISE, 1, pc[c].gmin_exp, RT_GPU_GEMM_DEFAULT, pc[c].tile_kb, pc[c].name);
        if (!g) continue;
        check_gpu(g, hp, o, pc[c].name, NULL, pc[c].full);
        const rt_gpu_info *gi = rt_gpu_model_info(g);
        printf("%s: %llu GEMMs, %llu experts run by GEMV\n", pc[c].name, (unsigned long long)gi->gemm_calls,
               (unsigned long long)gi->gemm_expert_gemv);
        T_CHECK(gi->gemm_calls > 0, "%s: the GEMM path ran", pc[c].name);
        T_CHECK(pc[c].gmin_exp < 0 ? gi->gemm_expert_gemv > 0 : gi->gemm_expert_gemv == 0,
                "%s: %llu experts by GEMV", pc[c].name, (unsigned long long)gi->gemm_expert_gemv);
        for (int i = 0; i < N_PROMPTS && have_ref; i++) {
            const prompt *p = &o->p[i];
            float *lg = xmalloc((size_t)p->n * V * 4), *lh = xmalloc((size_t)(NL + 1) * p->n * E * 4);
            float *hid = xmalloc((size_t)p->n * E * 4);
            double secs = 0;
            if (gemm_run(g, p, lg, lh, hid, &secs, pc[c].name, i)) {
                const double rl = rel_l2(lg, ref_lg[i], (size_t)p->n * V);
                double worst = rel_l2(hid, ref_hid[i], (size_t)p->n * E);
                for (uint32_t l = 0; l <= NL; l++) {
                    const double r = rel_l2(lh + (size_t)l * p->n * E, ref_lh[i] + (size_t)l * p->n * E, (size_t)p->n * E);
                    if (!(r <= worst)) worst = r;
                }
                printf("%s: prompt %d (%u tokens) vs the GEMV path: logits rel L2 %.3e, hidden states worst layer "
                       "%.3e; %.4f s (GEMV %.4f s)\n", pc[c].name, i, p->n, rl, worst, secs, ref_s[i]);
                /* prompt 2 (455 tokens, sparse attention) has near-tied indexer choices that a
                 * 1e-7 difference can flip; it is held to the oracle's tolerance by check_gpu */
                if (i < 2) {
                    T_CHECK(rl <= 1e-5, "%s: prompt %d logits differ from the GEMV path by %.3e", pc[c].name, i, rl);
                    T_CHECK(worst <= 1e-5, "%s: prompt %d hidden states differ from the GEMV path by %.3e", pc[c].name,
                            i, worst);
                }
            }
            free(lg), free(lh), free(hid);
        }
        rt_gpu_model_free(g);
    }
    for (int i = 0; i < N_PROMPTS; i++) free(ref_lg[i]), free(ref_lh[i]), free(ref_hid[i]);

    /* TP=2 (experts split by width) and TP=2 --ep (whole experts per rank: the grouping's
     * localization) forced on: the oracle, and TP=1's GEMV logits (cross) within 1e-4 */
    const char *tdirs[2] = {dir_tp2, dir_ep};
    static const char *tnames[2] = {"gemm precise forced TP=2", "gemm precise forced TP=2 --ep"};
    for (int c = 0; c < 2; c++) {
        rt_wset *ws2 = NULL;
        rt_model *m2 = NULL;
        T_CHECK(rt_wset_open_blobs(tdirs[c], &ws2, &e) == G5_OK, "%s: open: %s", tnames[c], e.msg);
        if (ws2) T_CHECK(rt_model_create(ws2, &mo, &m2, &e) == G5_OK, "%s: model: %s", tnames[c], e.msg);
        rt_gpu_model *g2 = m2 ? gemm_model(m2, tdirs[c], RT_GPU_PRECISE, 1, 1, RT_GPU_GEMM_DEFAULT, 0, tnames[c]) : NULL;
        if (g2) {
            check_gpu(g2, rt_model_hparams(m2), o, tnames[c], cross, 0);
            T_CHECK(rt_gpu_model_info(g2)->gemm_calls > 0, "%s: the GEMM path ran", tnames[c]);
        }
        rt_gpu_model_free(g2);
        rt_model_free(m2);
        rt_wset_free(ws2);
    }

    /* fast mode, each compute, forced on: argmax agreement with the oracle (printed; checked
     * for f32, the arithmetic class of the fast GEMV path) */
    static const struct { rt_gpu_gemm mode; const char *name; } fc[] = {
        {RT_GPU_GEMM_DEFAULT, "gemm off (GEMV), fast"},
        {RT_GPU_GEMM_F32, "gemm fast forced f32"},
        {RT_GPU_GEMM_DEFAULT, "gemm fast forced (default: f16)"},
    };
    for (size_t c = 0; c < sizeof fc / sizeof fc[0]; c++) {
        g = gemm_model(m, dir, RT_GPU_FAST, c ? 1 : -1, 1, fc[c].mode, 0, fc[c].name);
        if (!g) continue;
        for (int i = 0; i < N_PROMPTS; i++) {
            const prompt *p = &o->p[i];
            float *lg = xmalloc((size_t)p->n * V * 4);
            double secs = 0;
            if (gemm_run(g, p, lg, NULL, NULL, &secs, fc[c].name, i)) {
                char miss[512];
                const uint32_t agree = argmax_agree(p, lg, V, miss, sizeof miss);
                const double rel = rel_l2(lg, p->ref, (size_t)p->n * V);
                printf("%s: prompt %d: argmax agreement %.4f (%u/%u), logits rel L2 %.3e, %.4f s; misses at%s\n",
                       fc[c].name, i, (double)agree / p->n, agree, p->n, rel, secs, miss);
                if (i < 2 && fc[c].mode == RT_GPU_GEMM_F32)
                    T_CHECK(agree >= 0.99 * p->n, "%s: prompt %d argmax agreement %u/%u below 0.99", fc[c].name, i,
                            agree, p->n);
                if (c == 2) fast_bar(fc[c].name, i, p, lg, V); /* the default: checked */
            }
            free(lg);
        }
        rt_gpu_model_free(g);
    }
    rt_model_free(m);
    rt_wset_free(ws);
}

int main(void) {
    setvbuf(stdout, NULL, _IONBF, 0); /* a crash must not eat the lines before it */
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        printf("FAIL: no CUDA device\n");
        t_failed++;
        return t_report("test_gpu_model");
    }
    test_dequant();
    test_route();
    test_topk();
    test_scores();
    test_absorb();
    test_mla();
    test_silu();
    test_convert();

    struct stat sb;
    if (stat(T_ORACLE_GGUF, &sb) != 0) {
        printf("oracle missing at %s\n", T_ORACLE_GGUF);
        T_CHECK(0, "oracle present");
        return t_report("test_gpu_model");
    }
    oracle o;
    const int have = load_oracle(&o, 2048);
    T_CHECK(have, "oracle files load");
    if (!have) return t_report("test_gpu_model");
    const char *tmp = t_tmpdir();
    static const struct { uint32_t tp; int ep; } cfg[] = {{1, 0}, {2, 0}, {2, 1}, {4, 1}};
    char dirs[4][4200];
    float *cross[N_PROMPTS] = {0};
    g5_error e = {0};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        char label[64];
        snprintf(dirs[c], sizeof dirs[c], "%s/tp%u%s", tmp, cfg[c].tp, cfg[c].ep ? "ep" : "");
        snprintf(label, sizeof label, "GPU blobs TP=%u%s", cfg[c].tp, cfg[c].ep ? " --ep" : "");
        convert_options co;
        convert_options_init(&co);
        co.tp = cfg[c].tp;
        co.ep = cfg[c].ep;
        g5_status st = convert_run(T_ORACLE_GGUF, dirs[c], &co, NULL, &e);
        T_CHECK(st == G5_OK, "%s: convert: %s", label, e.msg);
        if (st) continue;
        if (c == 0) {
            test_loader(dirs[0], tmp);
            test_loader_chunks(tmp);
        }
        rt_wset *ws;
        rt_model *m;
        rt_gpu_model *g = open_gpu(dirs[c], 1, &ws, &m, label);
        if (g) check_gpu(g, rt_model_hparams(m), &o, label, cross, c == 0);
        close_gpu(g, m, ws);
    }
    {
        rt_wset *ws;
        rt_model *m;
        rt_gpu_model *g = open_gpu(T_ORACLE_GGUF, 0, &ws, &m, "GPU gguf TP=1");
        if (g) check_gpu(g, rt_model_hparams(m), &o, "GPU gguf TP=1", cross, 0);
        close_gpu(g, m, ws);
    }
    test_modes(dirs[0], &o);
    test_check_tool(dirs[0], &o);
    test_prefill_gemm(dirs[0], dirs[1], dirs[2], &o, cross);
    for (int i = 0; i < N_PROMPTS; i++) free(cross[i]);
    free_oracle(&o);
    t_rmtree(tmp);
    return t_report("test_gpu_model");
}
