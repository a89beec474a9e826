/* The peer benchmark (bench/peer.sh): glm5-run's GPU path on a whole model from a blob set (or a
 * GGUF), measured the way llama-bench measures llama.cpp on the same file, so the two sets of
 * tok/s can stand side by side:
 *   pp N        prefill of an N-token prompt into an empty sequence (logits of the last position
 *               only), after one untimed warm-up of the same size; median of --reps runs
 *   tg M @ d    M single-token decode steps after a d-token prefill (llama-bench -d d -n M):
 *               tokens / seconds of the steps alone, after 2 untimed warm-up steps
 *   batch B @ d B sequences, each prefilled with d tokens, then M batched decode steps
 *               (rt_gpu_forward_batch, every row's logits copied to the host): aggregate tok/s;
 *               then M more giving each row's argmax on the device (rt_gpu_forward_rows), what
 *               glm5-serve's greedy decode loop does
 * Prompts are random token ids (fixed seed). The ceiling measured in the same run is the
 * device-to-device copy rate; each decode figure is also given as a ratio to the bytes one token
 * must read (rank 0's tensors with the routed experts at n_expert_used / n_expert, one embedding
 * row, no NextN block) at that rate.
 *
 *   bench_peer -m DIR|FILE.gguf [--precision fast|precise] [--pp 512,4096] [--tg 64]
 *              [--depth 512,4096,16384] [--batch 1,8,32] [--batch-depth 512] [--reps 3]
 *              [--cuda-graph on|off] [--no-verify] [--profile] [--chunk N] [--h16]
 * --h16: rt_gpu_opts.h16_products (glm5-serve's batch-invariant fp16 products, with --max-batch > 1).
 * --chunk N: each pp prompt in forward calls of at most N tokens (glm5-run --prefill-chunk), so a
 * 32k-token prompt's work buffers stay those of N tokens.
 * --profile: rt_gpu_debug_profile's sub-step tables: after the pp runs, of the last pp size (the
 * prompt's work again with an event between sub-steps: where prefill time goes); after each tg
 * run and each batch of 2 or more, of its last step. The pp profile adds the prefill class table
 * (issue 13): the sub-steps' launched times summed by class (attention: mla_absorb, mla_attend,
 * W_UV; indexer: idx_*; dense: q_a, kv_a, q_b, attn_output, dense FFN, shared expert, router;
 * moe: the routed experts; lm_head; other: norms, rope, quantize/convert, routing, collectives,
 * adds, and any label the table does not know, named under it), each class's FLOPs for the call
 * (runtime/gpu/gpu_debug.c, prof_class_flops: weight products 2 m k per token of the rank's
 * slice; absorbed MLA attention 2 H (576 + 512) per query and selected key, min(p + 1, top-k)
 * keys per query, plus absorb and W_UV; the indexer's projections and 2 idx_heads idx_dim per
 * causal pair; routed experts 2 * 3 E FE per (token, slot); lm_head one row), its TFLOP/s and
 * the ratio to cuBLAS bf16 on an 8192^3 GEMM, measured in the same run just before (best of 5
 * after 2 warm-ups; printed as a ceiling line). */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/cuk_gemm.h"
#include "format/glm5.h"
#include "format/status.h"
#include "runtime/cpu/model.h"
#include "runtime/cpu/weights.h"
#include "runtime/gpu/gpu_model.h"
#include "runtime/text/sample.h"
#include "tests/gpu/bench_util.h"

enum { MAX_LIST = 16 };

typedef struct list {
    uint32_t v[MAX_LIST];
    uint32_t n;
} list;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void parse_list(const char *s, list *l) {
    l->n = 0;
    while (*s && l->n < MAX_LIST) {
        char *end;
        unsigned long x = strtoul(s, &end, 10);
        if (end == s || x == 0 || x > (1u << 24)) {
            fprintf(stderr, "bench_peer: bad list '%s'\n", s);
            exit(2);
        }
        l->v[l->n++] = (uint32_t)x;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') {
            fprintf(stderr, "bench_peer: bad list '%s'\n", s);
            exit(2);
        }
    }
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Device-to-device copy rate in bytes/s (read + write counted), 2 GiB buffers, median of 5. */
static double copy_rate(void) {
    const size_t n = (size_t)1 << 31;
    void *a, *b;
    CK(cudaMalloc(&a, n));
    CK(cudaMalloc(&b, n));
    CK(cudaMemset(a, 1, n));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double t[5];
    CK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
    for (int i = 0; i < 5; i++) {
        CK(cudaEventRecord(e0, 0));
        CK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        t[i] = ms * 1e-3;
    }
    qsort(t, 5, sizeof t[0], cmp_d);
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaFree(a));
    CK(cudaFree(b));
    return 2.0 * (double)n / t[2];
}

/* cuBLAS bf16 GEMM TFLOP/s on an 8192^3 product (bf16 in, float32 sums and out): the best of 5
 * after 2 warm-ups (the best: the rate the device can reach, what a class's rate is held to). */
static double blas_bf16_tflops(void) {
    const int64_t S = 8192;
    cuk_blas *cb = NULL;
    void *w = NULL, *x = NULL;
    float *y = NULL;
    GK(cuk_blas_create(&cb, &err_));
    CK(cudaMalloc(&w, S * S * 2));
    CK(cudaMalloc(&x, S * S * 2));
    CK(cudaMalloc((void **)&y, S * S * 4));
    CK(cudaMemset(w, 0x3c, S * S * 2)); /* 0x3c3c: bf16 0.0115, finite products */
    CK(cudaMemset(x, 0x3c, S * S * 2));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const cuk_gemm_args a = {CUK_GEMM_BF16, w, S, x, S, S, S, S, y, S};
    for (int i = 0; i < 2; i++) GK(cuk_gemm(cb, &a, NULL, &err_));
    float best = 0;
    for (int i = 0; i < 5; i++) {
        float ms;
        CK(cudaEventRecord(e0, NULL));
        GK(cuk_gemm(cb, &a, NULL, &err_));
        CK(cudaEventRecord(e1, NULL));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (!i || ms < best) best = ms;
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaFree(w));
    CK(cudaFree(x));
    CK(cudaFree(y));
    cuk_blas_free(cb);
    return 2.0 * S * S * S / (best * 1e-3) / 1e12;
}

/* What rank 0 reads for one decode token (glm5_decode_bytes_of: the routed experts at top-k / n,
 * one embedding row, W_UK/W_UV as the GPU decode reads them (glm5_decode_bytes_of: kv_b's exact int8
 * form where attn_k_b/attn_v_b have one); the NextN block apart), printed by group. */
static double token_bytes(const rt_wset *ws, const glm5_hparams *hp) {
    const rt_weights *w = rt_wset_rank(ws, rt_wset_rank_first(ws));
    const uint64_t nt = rt_weights_n_tensors(w);
    glm5_tensor_ref *refs = malloc(sizeof *refs * (nt ? nt : 1));
    if (!refs) return 0;
    for (uint64_t i = 0; i < nt; i++) {
        const rt_tensor *t = rt_weights_tensor(w, i);
        refs[i] = (glm5_tensor_ref){t->name, t->type, {t->ne[0], t->ne[1], t->ne[2], t->ne[3]}, t->nbytes};
    }
    glm5_decode_bytes db;
    glm5_decode_bytes_of(hp, refs, nt, &db);
    free(refs);
    printf("decode bytes per token (rank 0; W_UK/W_UV as decode reads them):");
    for (int g = 0; g < GLM5_DB_COUNT; g++)
        printf("%s %s %.1f MB", g ? ";" : "", glm5_db_group_name((glm5_db_group)g), db.group[g] / 1e6);
    printf("\n");
    return db.total;
}

/* Seconds a step of tg one-token steps whose token sc draws on the device (rt_gpu_outputs.draw:
 * the host's part, samp_device_row, timed with it; no penalties), after one untimed step (its
 * graph's capture). The steps feed ids[0] and ids[1] in turn. */
static double device_draw_steps(rt_gpu_model *g, samp_ctx *sc, const int32_t *ids, uint32_t tg) {
    samp_dev_row row;
    cuk_sample_row cr;
    int32_t id = -1;
    const rt_gpu_outputs od = {.draw = &cr, .draw_ids = &id};
    double a = 0;
    for (uint32_t s = 0; s <= tg; s++) {
        if (s == 1) a = now_s();
        samp_device_row(sc, &row);
        cr = (cuk_sample_row){.temperature = row.temperature, .min_p = row.min_p, .top_p = row.top_p,
                              .top_k = row.top_k, .lmin = row.lmin, .k = row.k};
        GK(rt_gpu_forward(g, ids + s % 2, 1, &od, &err_));
    }
    return (now_s() - a) / tg;
}

static void fill_tokens(int32_t *ids, uint32_t n, uint32_t vocab, uint64_t *seed) {
    for (uint32_t i = 0; i < n; i++) {
        *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((*seed >> 33) % vocab);
    }
}

int main(int argc, char **argv) {
    const char *model = NULL;
    int fast = 1, graph = 1, verify = 1, profile = 0, h16 = 0;
    uint32_t tg = 64, reps = 3, batch_depth = 512, chunk = 0;
    list pp, depth, batch;
    parse_list("512,4096", &pp);
    parse_list("512,4096,16384", &depth);
    parse_list("1,8,32", &batch);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--no-verify")) { verify = 0; continue; }
        if (!strcmp(a, "--profile")) { profile = 1; continue; }
        if (!strcmp(a, "--h16")) { h16 = 1; continue; }
        if (!v) { fprintf(stderr, "bench_peer: %s needs a value\n", a); return 2; }
        i++;
        if (!strcmp(a, "-m")) model = v;
        else if (!strcmp(a, "--precision")) fast = !strcmp(v, "fast");
        else if (!strcmp(a, "--pp")) parse_list(v, &pp);
        else if (!strcmp(a, "--depth")) parse_list(v, &depth);
        else if (!strcmp(a, "--batch")) parse_list(v, &batch);
        else if (!strcmp(a, "--tg")) tg = (uint32_t)atoi(v);
        else if (!strcmp(a, "--reps")) reps = (uint32_t)atoi(v);
        else if (!strcmp(a, "--batch-depth")) batch_depth = (uint32_t)atoi(v);
        else if (!strcmp(a, "--chunk")) chunk = (uint32_t)atoi(v);
        else if (!strcmp(a, "--cuda-graph")) graph = !strcmp(v, "on");
        else { fprintf(stderr, "bench_peer: unknown option %s\n", a); return 2; }
    }
    if (!model || !tg || !reps || reps > 64) {
        fprintf(stderr, "usage: bench_peer -m DIR|FILE.gguf [options] (see the source's top comment)\n");
        return 2;
    }
    rt_wset *ws = NULL;
    rt_model *m = NULL;
    rt_gpu_model *g = NULL;
    GK(rt_wset_open(model, &ws, &err_));
    rt_model_opts mo = {0};
    GK(rt_model_create(ws, &mo, &m, &err_));
    const glm5_hparams *hp = rt_model_hparams(m);
    rt_gpu_opts go;
    rt_gpu_opts_default(&go);
    go.precision = fast ? RT_GPU_FAST : RT_GPU_PRECISE;
    go.cuda_graph = graph;
    go.h16_products = h16;
    go.load.verify = verify;
    go.blobs = rt_wset_blobs(ws); /* the set opened above (NULL for a GGUF) */
    double t0 = now_s();
    GK(rt_gpu_model_create(m, &go, &g, &err_));
    const rt_gpu_info *gi = rt_gpu_model_info(g);
    const char *prec = fast ? "fast" : "precise";
    printf("bench_peer: %s (%s), %s, %u layers (%u main), %u experts (%u used), vocab %u; GPU %s, %s, cache %s, "
           "graph %s%s; load %.2f s (%.2f GB); kv_b's exact int8 form in %u layer(s)\n", model, rt_wset_source(ws), prec,
           hp->n_layer, hp->n_layer_main, hp->n_expert, hp->n_expert_used, hp->n_vocab, gi->device_name, gi->precision,
           gi->cache, gi->cuda_graph ? "on" : "off", gi->h16_products ? ", fp16 products" : "", now_s() - t0,
           gi->weight_bytes / 1e9, gi->kvb_exact_layers);
    const double rate = copy_rate(), tb = token_bytes(ws, hp), floor_s = tb / rate;
    printf("ceiling: device copy %.0f GB/s; one decode token reads %.1f MB -> floor %.3f ms (%.0f tok/s)\n",
           rate / 1e9, tb / 1e6, floor_s * 1e3, 1.0 / floor_s);

    uint32_t max_n = batch_depth + tg + 8;
    for (uint32_t i = 0; i < pp.n; i++) max_n = pp.v[i] > max_n ? pp.v[i] : max_n;
    for (uint32_t i = 0; i < depth.n; i++) max_n = depth.v[i] + tg + 8 > max_n ? depth.v[i] + tg + 8 : max_n;
    int32_t *ids = malloc(sizeof *ids * max_n);
    /* page-locked, as glm5-serve's (rt_eng_host_alloc): the batch rows' logits copy at the bus rate */
    float *logits = rt_gpu_host_alloc(sizeof *logits * (size_t)hp->n_vocab * 64);
    if (!ids || !logits) return 1;
    uint64_t seed = 42;
    rt_gpu_outputs out = {.logits = logits};
    char summary[4096];
    size_t sl = 0;
    summary[0] = 0;

    for (uint32_t i = 0; i < pp.n; i++) {
        const uint32_t n = pp.v[i];
        double t[64];
        fill_tokens(ids, n, hp->n_vocab, &seed);
        for (uint32_t r = 0; r <= reps; r++) { /* r = 0: warm-up */
            rt_gpu_reset(g);
            double a = now_s();
            for (uint32_t d = 0; d < n;) { /* --chunk: calls of at most chunk tokens, as glm5-run --prefill-chunk */
                const uint32_t c = chunk && n - d > chunk ? chunk : n - d;
                GK(rt_gpu_forward(g, ids + d, c, &out, &err_));
                d += c;
            }
            if (r) t[r - 1] = now_s() - a;
        }
        qsort(t, reps, sizeof t[0], cmp_d);
        const double med = t[reps / 2];
        printf("pp%u %s%s: %.1f tok/s (median of %u: %.4f s; min %.4f, max %.4f)\n", n, prec,
               chunk && n > chunk ? " (in calls of --chunk tokens)" : "", n / med, reps, med, t[0],
               t[reps - 1]);
        sl += (size_t)snprintf(summary + sl, sizeof summary - sl, "| pp%u | %.0f |\n", n, n / med);
    }
    if (profile && pp.n) { /* the last forward call was the last pp size's */
        const double blas = blas_bf16_tflops(); /* the class table's reference, in this run */
        printf("ceiling: cuBLAS bf16 GEMM 8192^3: %.1f TFLOP/s (best of 5)\n", blas);
        printf("profile of pp%u (%s):\n", pp.v[pp.n - 1], prec);
        GK(rt_gpu_debug_profile(g, pp.v[pp.n - 1], blas, 0, stdout, &err_));
    }
    for (uint32_t i = 0; i < depth.n; i++) {
        const uint32_t d = depth.v[i];
        fill_tokens(ids, d + tg + 8, hp->n_vocab, &seed); /* the loops below read up to d + tg + 5 */
        rt_gpu_reset(g);
        GK(rt_gpu_forward(g, ids, d, &out, &err_));
        for (uint32_t s = 0; s < 2; s++) GK(rt_gpu_forward(g, ids + d + s, 1, &out, &err_));
        double a = now_s();
        for (uint32_t s = 0; s < tg; s++) GK(rt_gpu_forward(g, ids + d + 2 + s, 1, &out, &err_));
        const double per = (now_s() - a) / tg;
        printf("tg%u @ %u %s: %.1f tok/s (%.3f ms per token; ratio to the floor %.2f", tg, d, prec, 1.0 / per,
               per * 1e3, per / floor_s);
        if (gi->cuda_graph) printf("; graph of %llu launches", (unsigned long long)gi->graph_nodes);
        printf(")\n");
        sl += (size_t)snprintf(summary + sl, sizeof summary - sl, "| tg%u @ d%u | %.1f |\n", tg, d, 1.0 / per);
        { /* the same steps giving the argmax instead of the logits (glm5-run's greedy steps) */
            int32_t pick = -1;
            float pick_logit = 0;
            const rt_gpu_outputs oa = {.argmax = &pick, .argmax_logit = &pick_logit};
            /* one step first: its graph is captured then, not in the timed steps */
            GK(rt_gpu_forward(g, ids + d + 2 + tg, 1, &oa, &err_));
            const double a2 = now_s();
            for (uint32_t s = 0; s < tg; s++) GK(rt_gpu_forward(g, ids + d + 2 + tg + s % 2, 1, &oa, &err_));
            const double per2 = (now_s() - a2) / tg;
            printf("tg%u @ %u %s, argmax steps: %.1f tok/s (%.3f ms per token)\n", tg, d + tg + 2, prec, 1.0 / per2,
                   per2 * 1e3);
        }
        { /* sampled at OpenAI's defaults (temperature 0.9, no top-k, top-p 1): the logits and the
           * host's draw (samp_sample), then the same steps drawn on the device (rt_gpu_outputs.draw) */
            samp_params sp;
            samp_params_default(&sp);
            sp.temperature = 0.9f, sp.top_k = 0, sp.top_p = 1.0f, sp.min_p = 0.0f, sp.seed = 5;
            samp_ctx *sc = NULL;
            GK(samp_create(&sp, hp->n_vocab, &sc, &err_));
            int32_t id = -1;
            GK(rt_gpu_forward(g, ids + d + 4 + tg, 1, &out, &err_));
            double a3 = now_s(), host_s = 0;
            for (uint32_t s = 0; s < tg; s++) {
                GK(rt_gpu_forward(g, ids + d + 4 + tg + s % 2, 1, &out, &err_));
                const double h0 = now_s();
                GK(samp_sample(sc, logits, &id, &err_));
                host_s += now_s() - h0;
            }
            const double per3 = (now_s() - a3) / tg;
            printf("tg%u @ %u %s, sampled, host draws: %.1f tok/s (%.3f ms per token, of which the draw %.3f ms)\n", tg,
                   d + 2 * tg + 2, prec, 1.0 / per3, per3 * 1e3, host_s * 1e3 / tg);
            if (gi->draws) {
                const double per4 = device_draw_steps(g, sc, ids + d + 4 + tg, tg);
                printf("tg%u @ %u %s, sampled, device draws: %.1f tok/s (%.3f ms per token)\n", tg, d + 3 * tg + 2, prec,
                       1.0 / per4, per4 * 1e3);
                samp_ctx *sc2 = NULL; /* the same with top-p 0.95 (its threshold's radix passes) */
                sp.top_p = 0.95f;
                GK(samp_create(&sp, hp->n_vocab, &sc2, &err_));
                const double per5 = device_draw_steps(g, sc2, ids + d + 4 + tg, tg);
                printf("tg%u @ %u %s, sampled top-p 0.95, device draws: %.1f tok/s (%.3f ms per token)\n", tg,
                       d + 4 * tg + 3, prec, 1.0 / per5, per5 * 1e3);
                samp_free(sc2);
            }
            samp_free(sc);
        }
        if (profile) GK(rt_gpu_debug_profile(g, 1, 0, rate / 1e9, stdout, &err_)); /* the last step, sub-step by sub-step */
    }
    for (uint32_t i = 0; i < batch.n; i++) {
        const uint32_t B = batch.v[i];
        if (B > 64) continue;
        rt_gpu_seq *seqs[64] = {0};
        int32_t tok[64];
        for (uint32_t b = 0; b < B; b++) {
            GK(rt_gpu_seq_create(g, batch_depth + 2 * tg + 8, &seqs[b], &err_));
            fill_tokens(ids, batch_depth, hp->n_vocab, &seed);
            GK(rt_gpu_forward_seq(g, seqs[b], ids, batch_depth, &out, &err_));
        }
        fill_tokens(tok, B, hp->n_vocab, &seed);
        GK(rt_gpu_forward_batch(g, seqs, tok, B, logits, &err_)); /* warm-up */
        double a = now_s();
        for (uint32_t s = 0; s < tg; s++) {
            fill_tokens(tok, B, hp->n_vocab, &seed);
            GK(rt_gpu_forward_batch(g, seqs, tok, B, logits, &err_));
        }
        const double dt = now_s() - a;
        printf("batch %u @ %u %s: %.1f tok/s aggregate (%.3f ms per step)\n", B, batch_depth, prec, B * tg / dt,
               dt / tg * 1e3);
        sl += (size_t)snprintf(summary + sl, sizeof summary - sl, "| batch %u @ d%u | %.1f |\n", B, batch_depth,
                               B * tg / dt);
        { /* the same steps giving each row's argmax instead of its logits: glm5-serve's greedy
           * decode (rt_eng_decode_argmax), without the B rows' logits copy to the host */
            int32_t am[64];
            float av[64];
            const rt_gpu_outputs oa = {.argmax = am, .argmax_logit = av, .all_logits = 1};
            fill_tokens(tok, B, hp->n_vocab, &seed);
            GK(rt_gpu_forward_rows(g, seqs, NULL, B, tok, &oa, &err_)); /* warm-up (a graph's capture) */
            const double a2 = now_s();
            for (uint32_t s = 0; s < tg; s++) {
                fill_tokens(tok, B, hp->n_vocab, &seed);
                GK(rt_gpu_forward_rows(g, seqs, NULL, B, tok, &oa, &err_));
            }
            const double dt2 = now_s() - a2;
            printf("batch %u @ %u %s, argmax steps: %.1f tok/s aggregate (%.3f ms per step)\n", B, batch_depth, prec,
                   B * tg / dt2, dt2 / tg * 1e3);
            sl += (size_t)snprintf(summary + sl, sizeof summary - sl, "| batch %u @ d%u, argmax | %.1f |\n", B,
                                   batch_depth, B * tg / dt2);
        }
        if (profile && B > 1) GK(rt_gpu_debug_profile_batch(g, seqs, B, stdout, &err_));
        for (uint32_t b = 0; b < B; b++) rt_gpu_seq_free(seqs[b]);
    }
    printf("\n| %s (tok/s) | glm5-run |\n| --- | --- |\n%s", prec, summary);
    free(ids);
    rt_gpu_host_free(logits);
    rt_gpu_model_free(g);
    rt_model_free(m);
    rt_wset_free(ws);
    return 0;
}
