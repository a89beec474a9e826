/* GLM-5.2 (IndexShare) against transformers: tests/data/glm52-tiny, made by
 * scripts/make_glm52_ref.py (a random GlmMoeDsaForCausalLM with GLM-5.2's indexer schedule, run in
 * float64; the GGUF written from the same weights). Logits of three prompts (6, 40, 72 tokens;
 * index_topk 8) within 1e-3 / 1e-3 / 5e-3 relative L2, the top-k every layer used on prompt 2 (the
 * shared layers' being their full layer's), and the greedy continuation exact: from the proper
 * IndexShare GGUF and from the published-style one (indexer on every layer, no schedule key), at
 * TP1 from the GGUF and TP1 / TP2 --ep from blob sets. Also: the schedule in the model facts, the
 * converter dropping the published file's duplicate indexer tensors, and the blob recording it. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "convert/convert.h"
#include "convert/inspect.h"
#include "convert/shard.h"
#include "format/blob.h"
#include "format/gguf.h"
#include "format/gguf_write.h"
#include "format/glm5.h"
#include "runtime/cpu/model.h"
#include "runtime/cpu/weights.h"
#include "tests/test_util.h"
#include "tests/glm52_ref.h"

static void check_model(rt_model *m, const ref *r, const char *label) {
    const glm5_hparams *hp = rt_model_hparams(m);
    const uint32_t V = hp->n_vocab, L = hp->n_layer_main, K = hp->idx_top_k;
    g5_error e = {0};
    for (int i = 0; i < NP; i++) {
        const uint32_t n = r->n[i];
        float *lg = malloc((size_t)n * V * sizeof(float));
        int32_t *tk = i == 2 ? malloc((size_t)L * n * K * sizeof(int32_t)) : NULL;
        rt_state *s = NULL;
        rt_outputs out = {.logits = lg, .all_logits = 1, .topk = tk};
        int ok = rt_state_create(m, &s, &e) == G5_OK && rt_model_forward(m, s, r->ids[i], n, &out, &e) == G5_OK;
        rt_state_free(s);
        T_CHECK(ok, "%s: prompt %d ran: %s", label, i, e.msg);
        if (ok) {
            uint32_t agree;
            const double rel = ref_rel_l2(r, i, lg, V, &agree);
            printf("%s: prompt %d (%u tokens): rel L2 %.3g (tol %.0e), argmax %u/%u\n", label, i, n, rel, k_tol[i], agree, n);
            T_CHECK(rel <= k_tol[i], "%s: prompt %d rel L2 %.3g > %.0e", label, i, rel, k_tol[i]);
            T_CHECK(agree == n, "%s: prompt %d argmax %u/%u", label, i, agree, n);
        }
        if (ok && tk) {
            /* queries that see more than K keys: the same set as transformers', every layer; a
             * shared layer uses exactly its full layer's choice */
            uint32_t same = 0, rows = 0, shared_same = 0;
            for (uint32_t il = 0; il < L; il++) {
                const uint32_t s_il = ref_topk_same(r, tk, il, K);
                if (s_il != n - K) printf("%s: layer %u: %u/%u top-k sets equal\n", label, il, s_il, n - K);
                same += s_il;
                rows += n - K;
                const uint32_t src = glm5_idx_src_layer(hp, il);
                for (uint32_t t = K; t < n; t++)
                    shared_same += memcmp(tk + ((size_t)il * n + t) * K, tk + ((size_t)src * n + t) * K,
                                          K * sizeof(int32_t)) == 0;
            }
            printf("%s: prompt 2 top-k: %u/%u (layer, query) sets equal transformers'\n", label, same, rows);
            T_CHECK(same == rows, "%s: top-k sets %u/%u", label, same, rows);
            T_CHECK(shared_same == rows, "%s: shared layers reuse their full layer's top-k (%u/%u)", label,
                    shared_same, rows);
        }
        free(lg);
        free(tk);
    }
    /* greedy continuation, with the cache (decode steps of one token) */
    const uint32_t gp = r->greedy_prompt;
    float *last = malloc(V * sizeof(float));
    rt_state *s = NULL;
    rt_outputs out = {.logits = last};
    int ok = rt_state_create(m, &s, &e) == G5_OK && rt_model_forward(m, s, r->ids[gp], r->n[gp], &out, &e) == G5_OK;
    uint32_t match = 0;
    for (uint32_t i = 0; ok && i < r->n_greedy; i++) {
        int32_t tok = (int32_t)amax(last, V);
        if (tok != r->greedy[i]) break;
        match++;
        ok = rt_model_forward(m, s, &tok, 1, &out, &e) == G5_OK;
    }
    rt_state_free(s);
    free(last);
    printf("%s: greedy continuation %u/%u tokens equal transformers'\n", label, match, r->n_greedy);
    T_CHECK(match == r->n_greedy, "%s: greedy %u/%u", label, match, r->n_greedy);

    /* batched decode: the greedy prompt beside prompt 2, one rt_model_forward_batch per step */
    rt_state *b[2] = {NULL, NULL};
    float *lg = malloc((size_t)2 * V * sizeof(float));
    rt_outputs o0 = {.logits = lg}, o1 = {.logits = lg + V};
    ok = rt_state_create(m, &b[0], &e) == G5_OK && rt_state_create(m, &b[1], &e) == G5_OK &&
         rt_model_forward(m, b[0], r->ids[gp], r->n[gp], &o0, &e) == G5_OK &&
         rt_model_forward(m, b[1], r->ids[2], r->n[2], &o1, &e) == G5_OK;
    match = 0;
    for (uint32_t i = 0; ok && i < r->n_greedy; i++) {
        int32_t tok[2] = {(int32_t)amax(lg, V), (int32_t)amax(lg + V, V)};
        if (tok[0] != r->greedy[i]) break;
        match++;
        ok = rt_model_forward_batch(m, b, tok, 2, lg, &e) == G5_OK;
    }
    rt_state_free(b[0]);
    rt_state_free(b[1]);
    free(lg);
    printf("%s: batched decode (beside prompt 2): greedy %u/%u\n", label, match, r->n_greedy);
    T_CHECK(ok && match == r->n_greedy, "%s: batched greedy %u/%u (%s)", label, match, r->n_greedy, e.msg);
}

static void check_facts(const char *path, uint32_t want_src) {
    gguf_ctx *c = NULL;
    g5_error e = {0};
    glm5_hparams *hp = malloc(sizeof *hp);
    T_CHECK(gguf_open(path, &c, &e) == G5_OK && glm5_hparams_read(c, hp, &e) == G5_OK, "%s: %s", path, e.msg);
    if (c) {
        static const uint8_t want[8] = {1, 1, 1, 0, 0, 0, 1, 0};
        T_CHECK(hp->n_layer_main == 8 && memcmp(hp->idx_full, want, 8) == 0, "%s: GLM-5.2 schedule", path);
        T_CHECK(hp->idx_source == want_src, "%s: schedule source %u", path, hp->idx_source);
        T_CHECK(hp->version == GLM5_VERSION_5_2 && hp->rope_theta == 8e6f && hp->n_ctx_train == 1048576,
                "%s: GLM-5.2, theta %g, ctx %u", path, (double)hp->rope_theta, hp->n_ctx_train);
        T_CHECK(glm5_idx_src_layer(hp, 5) == 2 && glm5_idx_src_layer(hp, 7) == 6 && glm5_idx_src_layer(hp, 6) == 6,
                "%s: shared layers' source", path);
        glm5_tensor_spec sp;
        T_CHECK(glm5_spec_for(hp, "blk.4.indexer.proj.weight", &sp) == G5_OK && sp.unused,
                "%s: a shared layer's indexer tensor is known and unused", path);
        T_CHECK(glm5_spec_for(hp, "blk.6.indexer.proj.weight", &sp) == G5_OK && !sp.unused,
                "%s: a full layer's indexer tensor is used", path);
    }
    /* inspect names the version and the schedule; the published file's duplicates are unused,
     * not a failure */
    json_t *rep = NULL;
    if (c && inspect_gguf(c, path, NULL, &rep, &e) == G5_OK) {
        const json_t *a = json_object_get(rep, "audit"), *h = json_object_get(a, "hparams");
        const char *ver = json_string_value(json_object_get(h, "model_version"));
        const char *sched = json_string_value(json_object_get(h, "indexer_schedule"));
        const size_t unused = json_array_size(json_object_get(a, "unused_shared_indexer"));
        T_CHECK(inspect_report_passed(rep) && ver && !strcmp(ver, "GLM-5.2") && sched && !strcmp(sched, "0-2,6") &&
                    unused == (want_src == GLM5_IDX_SRC_KEY ? 0u : 20u),
                "%s: inspect: passed %d, version %s, schedule %s, %zu unused", path, inspect_report_passed(rep),
                ver ? ver : "?", sched ? sched : "?", unused);
    } else {
        T_CHECK(0, "%s: inspect: %s", path, e.msg);
    }
    json_decref(rep);
    gguf_free(c);
    free(hp);
}

/* The published file rewritten in memory: keys dropped / set, tensors of some layers' indexer
 * left out. Returns the hyperparameter read's status (and *hp, *msg). */
typedef struct variant {
    const char *name;            /* general.name and general.basename ("" leaves them out) */
    const char *drop_idx;        /* layers whose indexer tensors are left out: "345" */
    int drop_one;                /* leave out only blk.<first of drop_idx>.indexer.proj.weight */
    const char *scaling;         /* rope.scaling.type, or NULL */
    int key;                     /* write indexer.types (the GLM-5.2 schedule) */
} variant;

static g5_status read_variant(const variant *v, glm5_hparams *hp, char *msg, size_t cap) {
    gguf_ctx *src = NULL;
    g5_error e = {0};
    if (gguf_open(DIR "glm52-tiny-published.gguf", &src, &e)) return G5_ERR_IO;
    gguf_writer *w = gguf_writer_create();
    for (int64_t i = 0; i < gguf_get_n_kv(src); i++) {
        const char *k = gguf_get_key(src, i);
        if (!strcmp(k, "general.name") || !strcmp(k, "general.basename")) continue;
        gguf_writer_copy_kv(w, src, i);
    }
    if (v->name[0]) {
        gguf_writer_set_str(w, "general.name", v->name, strlen(v->name));
        gguf_writer_set_str(w, "general.basename", v->name, strlen(v->name));
    }
    if (v->scaling) gguf_writer_set_str(w, "glm-dsa.rope.scaling.type", v->scaling, strlen(v->scaling));
    if (v->key) {
        static const uint8_t t[8] = {1, 1, 1, 0, 0, 0, 1, 0};
        gguf_writer_set_arr(w, "glm-dsa.attention.indexer.types", GGUF_VT_BOOL, t, 8);
    }
    for (int64_t i = 0; i < gguf_get_n_tensors(src); i++) {
        const gguf_tensor *t = gguf_get_tensor(src, i);
        int32_t layer;
        glm5_role r = glm5_classify(t->name, &layer);
        if (glm5_role_is_indexer(r) && layer >= 0 && strchr(v->drop_idx, '0' + layer) &&
            (!v->drop_one || (r == GLM5_ROLE_IDX_PROJ && layer == v->drop_idx[0] - '0')))
            continue;
        gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, NULL);
    }
    uint8_t *buf = NULL;
    uint64_t len = 0;
    gguf_ctx *c = NULL;
    g5_status st = gguf_writer_write_buffer(w, &buf, &len);
    if (!st) st = gguf_parse_buffer(buf, len, "variant", &c, &e);
    if (!st) st = glm5_hparams_read(c, hp, &e);
    snprintf(msg, cap, "%s", st ? e.msg : "");
    gguf_free(c);
    free(buf);
    gguf_writer_free(w);
    gguf_free(src);
    return st;
}

static void test_variants(void) {
    static const uint8_t k52[8] = {1, 1, 1, 0, 0, 0, 1, 0};
    static const uint8_t all[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    static const uint8_t some[8] = {1, 1, 1, 0, 0, 0, 1, 1};
    static const struct {
        variant v;
        g5_status want;
        uint32_t src, version;
        const uint8_t *full;
        const char *msg;         /* part of the refusal */
    } cases[] = {
        /* a proper IndexShare file without the key: the layers carrying the indexer */
        {{"", "345", 0, NULL, 0}, G5_OK, GLM5_IDX_SRC_TENSORS, GLM5_VERSION_5_2, some, NULL},
        {{"GLM-5.2", "3457", 0, NULL, 0}, G5_OK, GLM5_IDX_SRC_TENSORS, GLM5_VERSION_5_2, k52, NULL},
        /* published layout, named: GLM-5.2's schedule; GLM-5.1 / GLM-5: every layer */
        {{"GLM-5.2-UD-Q4_K_XL", "", 0, NULL, 0}, G5_OK, GLM5_IDX_SRC_GLM52, GLM5_VERSION_5_2, k52, NULL},
        {{"GLM 5.1", "", 0, NULL, 0}, G5_OK, GLM5_IDX_SRC_ALL_FULL, GLM5_VERSION_5_1, all, NULL},
        {{"glm5", "", 0, NULL, 0}, G5_OK, GLM5_IDX_SRC_ALL_FULL, GLM5_VERSION_5, all, NULL},
        /* unnamed: GLM-5.2's rope theta 8e6 and 1M context name it */
        {{"", "", 0, NULL, 0}, G5_OK, GLM5_IDX_SRC_GLM52, GLM5_VERSION_5_2, k52, NULL},
        /* the key wins over everything */
        {{"GLM-5.1", "", 0, NULL, 1}, G5_OK, GLM5_IDX_SRC_KEY, GLM5_VERSION_5_1, k52, NULL},
        /* refusals */
        {{"GLM-5.2", "4", 1, NULL, 0}, G5_ERR_MODEL, 0, 0, NULL, "only some of its indexer tensors"},
        {{"GLM-5.2", "0", 0, NULL, 0}, G5_ERR_MODEL, 0, 0, NULL, "layer 0 has no indexer tensors"},
        {{"GLM-5.1", "345", 0, NULL, 0}, G5_ERR_MODEL, 0, 0, NULL, "runs the indexer on every layer"},
        {{"GLM-5.3", "", 0, NULL, 0}, G5_ERR_MODEL, 0, 0, NULL, "GLM-5.3"},
        {{"GLM-5.2", "", 0, "yarn", 0}, G5_ERR_UNSUPPORTED, 0, 0, NULL, "RoPE scaling"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        glm5_hparams *hp = calloc(1, sizeof *hp);
        char msg[1100];
        g5_status st = read_variant(&cases[i].v, hp, msg, sizeof msg);
        T_CHECK(st == cases[i].want, "variant %zu ('%s', no indexer on '%s'): %s, want %s (%s)", i, cases[i].v.name,
                cases[i].v.drop_idx, g5_strerror(st), g5_strerror(cases[i].want), msg);
        if (st == G5_OK && cases[i].want == G5_OK) {
            T_CHECK(hp->idx_source == cases[i].src && hp->version == cases[i].version &&
                        memcmp(hp->idx_full, cases[i].full, 8) == 0,
                    "variant %zu: source %u version %u", i, hp->idx_source, hp->version);
        } else if (st && cases[i].msg) {
            T_CHECK(strstr(msg, cases[i].msg) != NULL, "variant %zu: the refusal says why: %s", i, msg);
            printf("variant %zu refused: %s\n", i, msg);
        }
        free(hp);
    }
}

int main(void) {
    test_variants();
    check_facts(DIR "glm52-tiny.gguf", GLM5_IDX_SRC_KEY);
    check_facts(DIR "glm52-tiny-published.gguf", GLM5_IDX_SRC_GLM52);

    const char *dir = t_tmpdir();
    static const char *const files[] = {"glm52-tiny.gguf", "glm52-tiny-published.gguf"};
    ref r;
    int have = 0;
    rt_model_opts opts = {.n_threads = 0, .mla = RT_MLA_ABSORBED};
    for (int f = 0; f < 2; f++) {
        char src[256], label[96];
        snprintf(src, sizeof src, DIR "%s", files[f]);
        g5_error e = {0};
        rt_wset *ws = NULL;
        rt_model *m = NULL;
        T_CHECK(rt_wset_open_gguf(src, &ws, &e) == G5_OK, "%s: open: %s", src, e.msg);
        if (ws) T_CHECK(rt_model_create(ws, &opts, &m, &e) == G5_OK, "%s: model: %s", src, e.msg);
        if (m && !have) {
            const glm5_hparams *hp = rt_model_hparams(m);
            have = ref_load(&r, hp->n_vocab, hp->n_layer_main, hp->idx_top_k);
            T_CHECK(have, "reference data loads");
        }
        snprintf(label, sizeof label, "%s TP=1", files[f]);
        if (m && have) check_model(m, &r, label);
        rt_model_free(m);
        rt_wset_free(ws);
        if (!have) break;
        static const struct { uint32_t tp; int ep; } cfg[] = {{1, 0}, {2, 1}};
        for (size_t k = 0; k < 2; k++) {
            char out[4200];
            snprintf(out, sizeof out, "%s/f%d-tp%u%s", dir, f, cfg[k].tp, cfg[k].ep ? "ep" : "");
            snprintf(label, sizeof label, "%s blobs TP=%u%s", files[f], cfg[k].tp, cfg[k].ep ? " --ep" : "");
            convert_options co;
            convert_options_init(&co);
            co.tp = cfg[k].tp;
            co.ep = cfg[k].ep;
            convert_result *res = NULL;
            g5_status st = convert_run(src, out, &co, &res, &e);
            T_CHECK(st == G5_OK, "%s: convert: %s", label, e.msg);
            if (res && res->plan)
                T_CHECK(res->plan->src_unused == (f ? 20u : 0u), "%s: %llu shared-layer indexer tensors dropped",
                        label, (unsigned long long)res->plan->src_unused);
            convert_result_free(res);
            if (st) continue;
            ws = NULL;
            m = NULL;
            T_CHECK(rt_wset_open_blobs(out, &ws, &e) == G5_OK, "%s: open: %s", label, e.msg);
            if (ws) {
                const gguf_ctx *meta = rt_wset_meta(ws);
                T_CHECK(gguf_find_key(meta, "glm-dsa.attention.indexer.types") >= 0 &&
                            (gguf_find_key(meta, "glm5shard.indexer.dropped") >= 0) == f,
                        "%s: the blob records the schedule (and the dropped tensors)", label);
                T_CHECK(rt_model_create(ws, &opts, &m, &e) == G5_OK, "%s: model: %s", label, e.msg);
            }
            if (m) check_model(m, &r, label);
            rt_model_free(m);
            rt_wset_free(ws);
        }
    }
    if (have) ref_free(&r);
    t_rmtree(dir);
    return t_report("test_glm52_ref");
}
