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

#include <jansson.h>
#include <math.h>

#include "convert/convert.h"
#include "runtime/cpu/model.h"
#include "runtime/cpu/weights.h"
#include "runtime/gpu/gpu_model.h"
#include "tests/test_util.h"
#include "tests/gpu/gpu_test_util.h"

#define DIR "tests/data/glm52-tiny/"
#define NP 3
static const double k_tol[NP] = {1e-3, 1e-3, 5e-3};

static int32_t *g_ids[NP], *g_topk, g_greedy[64];
static uint32_t g_n[NP], g_n_greedy;
static float *g_logits[NP];

static int load_ref(uint32_t V, uint32_t L, uint32_t K) {
    json_error_t je;
    json_t *root = json_load_file(DIR "reference.json", 0, &je);
    if (!root) return 0;
    json_t *ps = json_object_get(root, "prompts");
    int ok = json_array_size(ps) == NP;
    for (int i = 0; ok && i < NP; i++) {
        json_t *ids = json_object_get(json_array_get(ps, (size_t)i), "ids");
        g_n[i] = (uint32_t)json_array_size(ids);
        g_ids[i] = xmalloc(g_n[i] * sizeof(int32_t));
        for (uint32_t k = 0; k < g_n[i]; k++) g_ids[i][k] = (int32_t)json_integer_value(json_array_get(ids, k));
        char path[128];
        snprintf(path, sizeof path, DIR "p%d.logits.f32", i);
        size_t n = 0;
        g_logits[i] = (float *)(void *)t_read_file(path, &n);
        ok = g_logits[i] && n == (size_t)g_n[i] * V * 4;
    }
    size_t n = 0;
    g_topk = ok ? (int32_t *)(void *)t_read_file(DIR "p2.topk.i32", &n) : NULL;
    ok = ok && g_topk && n == (size_t)L * g_n[2] * K * 4;
    json_t *gr = json_object_get(root, "greedy");
    g_n_greedy = (uint32_t)json_array_size(gr);
    if (g_n_greedy > 64) g_n_greedy = 64;
    for (uint32_t i = 0; i < g_n_greedy; i++) g_greedy[i] = (int32_t)json_integer_value(json_array_get(gr, i));
    ok = ok && g_n_greedy && json_integer_value(json_object_get(root, "greedy_prompt")) == 1;
    json_decref(root);
    return ok;
}

static uint32_t amax(const float *v, uint32_t n) {
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void prompts(rt_gpu_model *g, const glm5_hparams *hp, const char *label) {
    const uint32_t V = hp->n_vocab, L = hp->n_layer_main, K = hp->idx_top_k;
    g5_error e = {0};
    for (int i = 0; i < NP; i++) {
        const uint32_t n = g_n[i];
        float *lg = xmalloc((size_t)n * V * 4);
        int32_t *tk = i == 2 ? xmalloc((size_t)L * n * K * 4) : NULL;
        rt_gpu_reset(g);
        rt_gpu_outputs out = {.logits = lg, .all_logits = 1, .topk = tk};
        g5_status st = rt_gpu_forward(g, g_ids[i], n, &out, &e);
        T_CHECK(st == G5_OK, "%s prompt %d: %s", label, i, e.msg);
        if (!st) {
            double num = 0, den = 0;
            uint32_t agree = 0;
            for (size_t k = 0; k < (size_t)n * V; k++) {
                const double d = (double)lg[k] - g_logits[i][k];
                num += d * d;
                den += (double)g_logits[i][k] * g_logits[i][k];
            }
            for (uint32_t t = 0; t < n; t++) agree += amax(lg + (size_t)t * V, V) == amax(g_logits[i] + (size_t)t * V, V);
            const double rel = sqrt(num / den);
            printf("%s: prompt %d (%u tokens): logits rel L2 %.3g (tol %.0e), argmax %u/%u\n", label, i, n, rel, k_tol[i],
                   agree, n);
            T_CHECK(rel <= k_tol[i] && agree == n, "%s prompt %d: rel L2 %.3g, argmax %u/%u", label, i, rel, agree, n);
        }
        if (!st && tk) {
            uint32_t same = 0, rows = 0;
            int32_t a[64], b[64];
            for (uint32_t il = 0; il < L; il++)
                for (uint32_t t = K; t < n && K <= 64; t++, rows++) {
                    memcpy(a, tk + ((size_t)il * n + t) * K, K * 4);
                    memcpy(b, g_topk + ((size_t)il * n + t) * K, K * 4);
                    qsort(a, K, 4, cmp_i32);
                    qsort(b, K, 4, cmp_i32);
                    same += memcmp(a, b, K * 4) == 0;
                }
            printf("%s: prompt 2 top-k: %u/%u (layer, query) sets equal transformers'\n", label, same, rows);
            T_CHECK(same == rows, "%s: top-k %u/%u", label, same, rows);
        }
        free(lg);
        free(tk);
    }
}

/* Prompt 1, then g_n_greedy single-token steps on the default sequence. */
static void greedy(rt_gpu_model *g, uint32_t V, const char *label) {
    g5_error e = {0};
    float *last = xmalloc((size_t)V * 4);
    rt_gpu_reset(g);
    rt_gpu_outputs out = {.logits = last};
    int ok = rt_gpu_forward(g, g_ids[1], g_n[1], &out, &e) == G5_OK;
    uint32_t match = 0;
    for (uint32_t i = 0; ok && i < g_n_greedy; i++) {
        int32_t tok = (int32_t)amax(last, V);
        if (tok != g_greedy[i]) break;
        match++;
        ok = rt_gpu_forward(g, &tok, 1, &out, &e) == G5_OK;
    }
    printf("%s: greedy continuation %u/%u tokens equal transformers'\n", label, match, g_n_greedy);
    T_CHECK(ok && match == g_n_greedy, "%s: greedy %u/%u (%s)", label, match, g_n_greedy, e.msg);
    free(last);
}

/* Batched decode: prompt 1 beside prompt 2, one rt_gpu_forward_batch call per step. */
static void batched(rt_gpu_model *g, uint32_t V, const char *label) {
    g5_error e = {0};
    rt_gpu_seq *s[2] = {NULL, NULL};
    float *lg = xmalloc((size_t)2 * V * 4);
    int ok = rt_gpu_seq_create(g, 0, &s[0], &e) == G5_OK && rt_gpu_seq_create(g, 0, &s[1], &e) == G5_OK;
    rt_gpu_outputs o0 = {.logits = lg}, o1 = {.logits = lg + V};
    ok = ok && rt_gpu_forward_seq(g, s[0], g_ids[1], g_n[1], &o0, &e) == G5_OK &&
         rt_gpu_forward_seq(g, s[1], g_ids[2], g_n[2], &o1, &e) == G5_OK;
    uint32_t match = 0;
    for (uint32_t i = 0; ok && i < g_n_greedy; i++) {
        int32_t tok[2] = {(int32_t)amax(lg, V), (int32_t)amax(lg + V, V)};
        if (tok[0] != g_greedy[i]) break;
        match++;
        ok = rt_gpu_forward_batch(g, s, tok, 2, lg, &e) == G5_OK;
    }
    printf("%s: batched decode (beside prompt 2): greedy %u/%u tokens equal transformers'\n", label, match, g_n_greedy);
    T_CHECK(ok && match == g_n_greedy, "%s: batched greedy %u/%u (%s)", label, match, g_n_greedy, e.msg);
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
    int ok = c && rt_gpu_check_forward(c, g_ids[2], g_n[2], &out, &e) == G5_OK;
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
        T_CHECK(s.ok && s.n_tokens == g_n[2] + 4, "%s: --check within tolerance", label);
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
            if (!have) have = load_ref(hp->n_vocab, hp->n_layer_main, hp->idx_top_k);
            T_CHECK(have, "reference data loads");
            for (int graph = 0; graph < 2 && have; graph++) {
                rt_gpu_opts go;
                rt_gpu_opts_default(&go);
                go.precision = RT_GPU_PRECISE;
                go.blob_dir = dir;
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
    for (int i = 0; i < NP; i++) {
        free(g_ids[i]);
        free(g_logits[i]);
    }
    free(g_topk);
    t_rmtree(tmp);
    return t_report(G5_TEST_NAME);
}
