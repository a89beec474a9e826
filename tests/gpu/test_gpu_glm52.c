/* The GPU model on GLM-5.2 (IndexShare) against transformers: tests/data/glm52-tiny (made by
 * scripts/make_glm52_ref.py; tests/test_glm52_ref.c holds the CPU to it). Precise mode, from blob
 * sets of both GGUF layouts (the proper one and the published one with duplicate indexer tensors
 * and no schedule key) at TP=1 and TP=2 --ep (ranks on one GPU):
 *  - logits of prompts 0, 1, 2 (6, 40, 72 tokens; index_topk 8: prompt 2 runs the prefill GEMM
 *    path) within 1e-3 / 1e-3 / 5e-3 relative L2 of transformers' float64, argmax everywhere;
 *  - the top-k of every layer on prompt 2 equal to transformers' (shared layers: the full layer's);
 *  - the greedy continuation of prompt 1 through the cache (decode steps), plain and as CUDA
 *    graphs, and in batched decode beside another sequence: exact;
 *  - the caches hold indexer keys for the full layers only (rt_gpu_seq_bytes);
 *  - --check (rt_gpu_check) over prompt 2 and decode steps: within tolerance.
 * The model has no NextN block (transformers has no MTP forward): MTP is covered by test_gpu_mtp. */
#define G5_TEST_NAME "test_gpu_glm52"
#define G5_TEST_SEED 52

#include "convert/convert.h"
#include "runtime/cpu/model.h"
#include "runtime/cpu/weights.h"
#include "runtime/gpu/gpu_model.h"
#include "tests/test_util.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/glm52_ref.h"

static ref R;

static void prompts(rt_gpu_model *g, const glm5_hparams *hp, const char *label) {
    const uint32_t V = hp->n_vocab, L = hp->n_layer_main, K = hp->idx_top_k;
    g5_error e = {0};
    for (int i = 0; i < NP; i++) {
        const uint32_t n = R.n[i];
        float *lg = xmalloc((size_t)n * V * 4);
        int32_t *tk = i == 2 ? xmalloc((size_t)L * n * K * 4) : NULL;
        rt_gpu_reset(g);
        rt_gpu_outputs out = {.logits = lg, .all_logits = 1, .topk = tk};
        g5_status st = rt_gpu_forward(g, R.ids[i], n, &out, &e);
        T_CHECK(st == G5_OK, "%s prompt %d: %s", label, i, e.msg);
        if (!st) {
            uint32_t agree;
            const double rel = ref_rel_l2(&R, i, lg, V, &agree);
            printf("%s: prompt %d (%u tokens): logits rel L2 %.3g (tol %.0e), argmax %u/%u\n", label, i, n, rel, k_tol[i],
                   agree, n);
            T_CHECK(rel <= k_tol[i] && agree == n, "%s prompt %d: rel L2 %.3g, argmax %u/%u", label, i, rel, agree, n);
        }
        if (!st && tk) {
            uint32_t same = 0, rows = 0;
            for (uint32_t il = 0; il < L; il++, rows += n - K) same += ref_topk_same(&R, tk, il, K);
            printf("%s: prompt 2 top-k: %u/%u (layer, query) sets equal transformers'\n", label, same, rows);
            T_CHECK(same == rows, "%s: top-k %u/%u", label, same, rows);
        }
        free(lg);
        free(tk);
    }
}

/* Prompt 1, then R.n_greedy single-token steps on the default sequence. */
static void greedy(rt_gpu_model *g, uint32_t V, const char *label) {
    g5_error e = {0};
    float *last = xmalloc((size_t)V * 4);
    rt_gpu_reset(g);
    rt_gpu_outputs out = {.logits = last};
    int ok = rt_gpu_forward(g, R.ids[1], R.n[1], &out, &e) == G5_OK;
    uint32_t match = 0;
    for (uint32_t i = 0; ok && i < R.n_greedy; i++) {
        int32_t tok = (int32_t)amax(last, V);
        if (tok != R.greedy[i]) break;
        match++;
        ok = rt_gpu_forward(g, &tok, 1, &out, &e) == G5_OK;
    }
    printf("%s: greedy continuation %u/%u tokens equal transformers'\n", label, match, R.n_greedy);
    T_CHECK(ok && match == R.n_greedy, "%s: greedy %u/%u (%s)", label, match, R.n_greedy, e.msg);
    free(last);
}

/* Batched decode: prompt 1 beside prompt 2, one rt_gpu_forward_batch call per step. */
static void batched(rt_gpu_model *g, uint32_t V, const char *label) {
    g5_error e = {0};
    rt_gpu_seq *s[2] = {NULL, NULL};
    float *lg = xmalloc((size_t)2 * V * 4);
    int ok = rt_gpu_seq_create(g, 0, &s[0], &e) == G5_OK && rt_gpu_seq_create(g, 0, &s[1], &e) == G5_OK;
    rt_gpu_outputs o0 = {.logits = lg}, o1 = {.logits = lg + V};
    ok = ok && rt_gpu_forward_seq(g, s[0], R.ids[1], R.n[1], &o0, &e) == G5_OK &&
         rt_gpu_forward_seq(g, s[1], R.ids[2], R.n[2], &o1, &e) == G5_OK;
    uint32_t match = 0;
    for (uint32_t i = 0; ok && i < R.n_greedy; i++) {
        int32_t tok[2] = {(int32_t)amax(lg, V), (int32_t)amax(lg + V, V)};
        if (tok[0] != R.greedy[i]) break;
        match++;
        ok = rt_gpu_forward_batch(g, s, tok, 2, lg, &e) == G5_OK;
    }
    printf("%s: batched decode (beside prompt 2): greedy %u/%u tokens equal transformers'\n", label, match, R.n_greedy);
    T_CHECK(ok && match == R.n_greedy, "%s: batched greedy %u/%u (%s)", label, match, R.n_greedy, e.msg);
    rt_gpu_seq_free(s[0]);
    rt_gpu_seq_free(s[1]);
    free(lg);
}

static void check_tool(rt_model *m, rt_gpu_model *g, uint32_t V, const char *label) {
    rt_gpu_check_opts co;
    rt_gpu_check_opts_default(&co);
    co.n_tokens = 100000;
    co.report = stdout;
    rt_gpu_check *c = NULL;
    g5_error e = {0};
    rt_gpu_reset(g);
    T_CHECK(rt_gpu_check_create(m, g, &co, &c, &e) == G5_OK, "%s: check create: %s", label, e.msg);
    float *last = xmalloc((size_t)V * 4);
    rt_gpu_outputs out = {.logits = last};
    int ok = c && rt_gpu_check_forward(c, R.ids[2], R.n[2], &out, &e) == G5_OK;
    for (int i = 0; ok && i < 4; i++) {
        int32_t tok = (int32_t)amax(last, V);
        ok = rt_gpu_check_forward(c, &tok, 1, &out, &e) == G5_OK;
    }
    T_CHECK(ok, "%s: checked forward: %s", label, e.msg);
    if (c) {
        rt_gpu_check_summary s;
        rt_gpu_check_get_summary(c, &s);
        printf("%s: check over %u tokens: %s; layer %.3e; logits rel L2 %.3e; top-k overlap >= %.4f\n", label,
               s.n_tokens, s.ok ? "ok" : "FAILED", s.max_layer, s.logits_rel_l2, s.min_overlap_mean);
        T_CHECK(s.ok && s.n_tokens == R.n[2] + 4, "%s: --check within tolerance", label);
    }
    rt_gpu_check_free(c);
    free(last);
}

int main(void) {
    if (!t_need_device()) return t_report(G5_TEST_NAME);
    const char *tmp = t_tmpdir();
    static const char *const files[] = {"glm52-tiny.gguf", "glm52-tiny-published.gguf"};
    static const struct { uint32_t tp; int ep; } cfg[] = {{1, 0}, {2, 1}};
    int have = 0;
    for (int f = 0; f < 2; f++)
        for (size_t k = 0; k < 2; k++) {
            char src[128], dir[4200], label[128];
            snprintf(src, sizeof src, DIR "%s", files[f]);
            snprintf(dir, sizeof dir, "%s/f%d-tp%u", tmp, f, cfg[k].tp);
            snprintf(label, sizeof label, "GPU %s TP=%u%s", files[f], cfg[k].tp, cfg[k].ep ? " --ep" : "");
            convert_options co;
            convert_options_init(&co);
            co.tp = cfg[k].tp;
            co.ep = cfg[k].ep;
            g5_error e = {0};
            g5_status st = convert_run(src, dir, &co, NULL, &e);
            T_CHECK(st == G5_OK, "%s: convert: %s", label, e.msg);
            if (st) continue;
            rt_wset *ws = NULL;
            rt_model *m = NULL;
            T_CHECK(rt_wset_open_blobs(dir, &ws, &e) == G5_OK, "%s: open: %s", label, e.msg);
            rt_model_opts mo = {.n_threads = 0, .mla = RT_MLA_ABSORBED};
            if (ws) T_CHECK(rt_model_create(ws, &mo, &m, &e) == G5_OK, "%s: CPU model: %s", label, e.msg);
            if (!m) {
                rt_wset_free(ws);
                continue;
            }
            const glm5_hparams *hp = rt_model_hparams(m);
            if (!have) have = ref_load(&R, hp->n_vocab, hp->n_layer_main, hp->idx_top_k) && R.greedy_prompt == 1;
            T_CHECK(have, "reference data loads");
            for (int graph = 0; graph < 2 && have; graph++) {
                rt_gpu_opts go;
                rt_gpu_opts_default(&go);
                go.precision = RT_GPU_PRECISE;
                go.blobs = rt_wset_blobs(rt_model_wset(m));
                go.cuda_graph = graph;
                rt_gpu_model *g = NULL;
                char lab[160];
                snprintf(lab, sizeof lab, "%s%s", label, graph ? " graph" : "");
                T_CHECK(rt_gpu_model_create(m, &go, &g, &e) == G5_OK, "%s: GPU model: %s", lab, e.msg);
                if (!g) continue;
                if (!graph) {
                    /* f32 latents (precise), indexer keys for the 4 full layers of 8 only */
                    const uint64_t T = rt_gpu_model_info(g)->n_local_ranks, P = 1000;
                    const uint64_t want = T * P * ((uint64_t)hp->n_layer_main * (hp->kv_lora + hp->qk_rope) * 4 +
                                                   4ull * hp->idx_head_dim * 4);
                    T_CHECK(rt_gpu_seq_bytes(g, (uint32_t)P) == want, "%s: cache bytes %llu, want %llu (no indexer "
                            "keys for shared layers)", lab, (unsigned long long)rt_gpu_seq_bytes(g, (uint32_t)P),
                            (unsigned long long)want);
                    prompts(g, hp, lab);
                    batched(g, hp->n_vocab, lab);
                    if (cfg[k].tp == 1) check_tool(m, g, hp->n_vocab, lab);
                }
                greedy(g, hp->n_vocab, lab);
                rt_gpu_model_free(g);
            }
            rt_model_free(m);
            rt_wset_free(ws);
        }
    if (have) ref_free(&R);
    t_rmtree(tmp);
    return t_report(G5_TEST_NAME);
}
