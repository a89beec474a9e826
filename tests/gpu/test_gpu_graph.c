/* CUDA graphs for the decode step (rt_gpu_opts.cuda_graph, runtime/gpu/gpu_graph.c) on the oracle
 * (../shared/oracle/glm5-tiny, converted to TP=1 and TP=2 blobs here):
 *
 * - prompt 1 plus 65 greedy decode steps, tokens and logits bit-identical to plain launches (TP=1
 *   precise and fast, TP=2 on one device, and TP=1 through a one-rank NCCL communicator:
 *   opts.collective NCCL, its all-reduces captured into the graph), the step captured once and
 *   replayed (one capture, one instantiation); both timed.
 * - from synthetic contexts (rt_gpu_debug_set_context) decode steps across the graph's buckets
 *   (1024 keys, the capacity; 16384: the score kernel changes) with a prefill chunk between them
 *   that reallocates the work buffers, also through one-rank NCCL: logits bit-identical to plain
 *   launches (and two plain runs to each other), one capture per bucket or buffer change.
 * - contexts that shrink (16380 then 1020 keys on one sequence): bit-identical and finite.
 *
 * Several GPUs (NCCL between them, one process or one per GPU) are run by tests/gpu/multi_gpu.sh
 * and tests/gpu/mpi_device.sh with --cuda-graph on. Runs on the device only (`make test-gpu`,
 * GLM5_SHARED as for the CPU tests). */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert/convert.h"
#include "tests/oracle_ref.h"
#include "runtime/gpu/gpu_model.h"
#include "runtime/cpu/model.h"
#include "runtime/cpu/weights.h"
#include "tests/test_util.h"

#define G5_TEST_NAME "test_gpu_graph"
#define G5_TEST_SEED 0x9a4f5eedull
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/oracle_blobs.h"

/* What a configuration changes from the defaults (bits): GV_NCCL through a one-rank NCCL
 * communicator (main sets the environment NCCL reads when it is made), GV_H16 the fp16 products
 * (rt_gpu_opts.h16_products) */
enum { GV_NCCL = 1, GV_H16 = 2 };

/* A GPU model of the blobs in dir, with the GV_ options of var. */
static rt_gpu_model *graph_model(rt_model *m, const char *dir, rt_gpu_precision prec, int var, int use_graph,
                                 const char *name, g5_error *e) {
    rt_gpu_opts go;
    rt_gpu_opts_default(&go);
    go.precision = prec;
    go.blobs = dir ? rt_wset_blobs(rt_model_wset(m)) : NULL;
    go.cuda_graph = use_graph;
    if (var & GV_NCCL) go.collective = RT_GPU_COLL_NCCL;
    go.h16_products = (var & GV_H16) != 0;
    rt_gpu_model *g = NULL;
    T_CHECK(rt_gpu_model_create(m, &go, &g, e) == G5_OK, "%s graph=%d: %s", name, use_graph, e->msg);
    if (g)
        T_CHECK(!strcmp(rt_gpu_model_info(g)->collective, var & GV_NCCL ? "nccl" : rt_model_n_ranks(m) > 1 ? "device-sum" : "none"),
                "%s: collective %s", name, rt_gpu_model_info(g)->collective);
    return g;
}

/* Prompt 1, then 64 greedy decode steps, each choosing its token from its own logits: with
 * opts.cuda_graph the steps are graph launches running the same kernels with the same arguments,
 * so the tokens and every step's logits must be bit-identical to the plain run's. Timed both ways
 * (printed, not asserted). */
enum { GRAPH_STEPS = 64 };
static int graph_run(rt_model *m, const char *dir, rt_gpu_precision prec, int var, int use_graph, const oracle *o,
                     uint32_t V, int32_t *toks, float *lg, double *secs, const char *name) {
    g5_error e = {0};
    rt_gpu_model *g = graph_model(m, dir, prec, var, use_graph, name, &e);
    if (!g) return 0;
    T_CHECK(rt_gpu_model_info(g)->cuda_graph == use_graph, "%s: info.cuda_graph = %d", name, use_graph);
    const prompt *p = &o->p[1];
    float *last = xmalloc((size_t)V * 4);
    rt_gpu_outputs out = {.logits = last};
    int ok = rt_gpu_forward(g, p->ids, p->n, &out, &e) == G5_OK;
    /* one untimed step first: the graph's instantiation and the kernels' first-launch costs */
    int32_t tok = (int32_t)argmax(last, V);
    toks[0] = tok;
    memcpy(lg, last, (size_t)V * 4);
    ok = ok && rt_gpu_forward(g, &tok, 1, &out, &e) == G5_OK;
    const double t0 = t_now_s();
    for (uint32_t i = 1; ok && i <= GRAPH_STEPS; i++) {
        tok = (int32_t)argmax(last, V);
        toks[i] = tok;
        memcpy(lg + (size_t)i * V, last, (size_t)V * 4);
        ok = rt_gpu_forward(g, &tok, 1, &out, &e) == G5_OK;
    }
    *secs = t_now_s() - t0;
    T_CHECK(ok, "%s graph=%d: decode: %s", name, use_graph, e.msg);
    if (ok) {
        toks[GRAPH_STEPS + 1] = (int32_t)argmax(last, V);
        memcpy(lg + (size_t)(GRAPH_STEPS + 1) * V, last, (size_t)V * 4);
    }
    const rt_gpu_info *gi = rt_gpu_model_info(g);
    if (use_graph) {
        printf("%s: %llu graph steps, %llu capture(s), %llu instantiation(s), %llu nodes a step\n", name,
               (unsigned long long)gi->graph_steps, (unsigned long long)gi->graph_captures,
               (unsigned long long)gi->graph_instantiations, (unsigned long long)gi->graph_nodes);
        T_CHECK(gi->graph_nodes >= 10, "%s: the captured step's node count (%llu) reported", name,
                (unsigned long long)gi->graph_nodes);
        T_CHECK(gi->graph_steps == GRAPH_STEPS + 1, "%s: every decode step ran as a graph (%llu)", name,
                (unsigned long long)gi->graph_steps);
        /* all steps lie in one bucket of one sequence with unchanged buffers: replays only */
        T_CHECK(gi->graph_captures == 1 && gi->graph_instantiations == 1,
                "%s: the step captured once and replayed (%llu captures, %llu instantiations)", name,
                (unsigned long long)gi->graph_captures, (unsigned long long)gi->graph_instantiations);
    } else {
        T_CHECK(gi->graph_steps == 0 && gi->graph_captures == 0, "%s: no graph steps when off", name);
    }
    rt_gpu_model_free(g);
    free(last);
    return ok;
}

/* From a synthetic context of ctx positions (caches grown to hold ctx + 256: the power of two
 * from 256 at or above it), n greedy decode steps (the first token fixed), except that step
 * chunk_at is a call of CHUNK tokens (more rows than the work buffers hold: reallocated).
 * lg: [n][V]; *gi: the model's counters at the end. */
enum { CHUNK = 20 };
static int graph_ctx_run(rt_model *m, const char *dir, rt_gpu_precision prec, int var, int use_graph, uint32_t ctx,
                         uint32_t n, uint32_t chunk_at, uint32_t V, float *lg, rt_gpu_info *gi, const char *name) {
    g5_error e = {0};
    rt_gpu_model *g = graph_model(m, dir, prec, var, use_graph, name, &e);
    if (!g) return 0;
    int ok = rt_gpu_debug_set_context(g, ctx, 0x5eed + ctx, &e) == G5_OK;
    rt_gpu_outputs out = {0};
    int32_t tok = 1, chunk[CHUNK];
    for (uint32_t i = 0; ok && i < n; i++) {
        out.logits = lg + (size_t)i * V;
        for (uint32_t j = 0; j < CHUNK; j++) chunk[j] = (int32_t)(((uint32_t)tok + 7 * j) % V);
        ok = rt_gpu_forward(g, i == chunk_at ? chunk : &tok, i == chunk_at ? CHUNK : 1, &out, &e) == G5_OK;
        tok = (int32_t)argmax(out.logits, V);
    }
    T_CHECK(ok, "%s graph=%d ctx %u: %s", name, use_graph, ctx, e.msg);
    *gi = *rt_gpu_model_info(g);
    rt_gpu_model_free(g);
    return ok;
}

/* One model, contexts that shrink (16380 then 1020 on the same default sequence, as
 * bench/decode.sh's CTX=32768,8192,1024 does): the graph of the smaller bucket must not keep
 * anything of the larger one. 4 steps per context, with and without graphs, bit-identical and
 * finite. */
static void test_graph_shrink(const char *dir) {
    static const uint32_t ctxs[] = {16380, 1020};
    enum { NC = 2, NS = 4 };
    g5_error e = {0};
    rt_wset *ws = NULL;
    rt_model *m = NULL;
    rt_model_opts mo = {.n_threads = 1, .mla = RT_MLA_ABSORBED};
    T_CHECK(rt_wset_open_blobs(dir, &ws, &e) == G5_OK && rt_model_create(ws, &mo, &m, &e) == G5_OK, "graph shrink: %s",
            e.msg);
    const uint32_t V = m ? rt_model_hparams(m)->n_vocab : 0;
    float *lg[2] = {xmalloc((size_t)NC * NS * V * 4), xmalloc((size_t)NC * NS * V * 4)};
    int ok = m != NULL;
    for (int use = 0; use < 2 && ok; use++) {
        rt_gpu_opts go;
        rt_gpu_opts_default(&go);
        go.blobs = rt_wset_blobs(rt_model_wset(m));
        go.cuda_graph = use;
        rt_gpu_model *g = NULL;
        ok = rt_gpu_model_create(m, &go, &g, &e) == G5_OK;
        for (int c = 0; c < NC && ok; c++) {
            ok = rt_gpu_debug_set_context(g, ctxs[c], 0x5eed + ctxs[c], &e) == G5_OK;
            int32_t tok = 1;
            for (int i = 0; i < NS && ok; i++) {
                rt_gpu_outputs out = {.logits = lg[use] + ((size_t)c * NS + i) * V};
                ok = rt_gpu_forward(g, &tok, 1, &out, &e) == G5_OK;
                tok = (int32_t)argmax(out.logits, V);
            }
        }
        if (ok && use)
            printf("graph shrink (ctx 16380 then 1020): %llu graph steps, %llu captures, %llu instantiations\n",
                   (unsigned long long)rt_gpu_model_info(g)->graph_steps,
                   (unsigned long long)rt_gpu_model_info(g)->graph_captures,
                   (unsigned long long)rt_gpu_model_info(g)->graph_instantiations);
        rt_gpu_model_free(g);
    }
    T_CHECK(ok, "graph shrink: %s", e.msg);
    if (ok) {
        uint32_t same = 0, finite = 0;
        for (uint32_t i = 0; i < NC * NS; i++) {
            same += !memcmp(lg[0] + (size_t)i * V, lg[1] + (size_t)i * V, (size_t)V * 4);
            uint32_t f = 1;
            for (uint32_t v = 0; v < V; v++) f &= isfinite(lg[1][(size_t)i * V + v]) != 0;
            finite += f;
        }
        printf("graph shrink (ctx 16380 then 1020): %u/%u logit vectors bit-identical to the plain run, %u finite\n",
               same, NC * NS, finite);
        T_CHECK(same == NC * NS && finite == NC * NS, "graph shrink: logits with graphs bit-identical and finite");
    }
    free(lg[0]);
    free(lg[1]);
    rt_model_free(m);
    rt_wset_free(ws);
}

/* graph_ctx_run with and without graphs: logits bit-identical and finite, and the captures that
 * runtime/gpu/gpu_graph.c's rule predicts (bound = the power of two >= the key count, at least 1024,
 * up to 16384, then the multiple of 8192 >= it; at most the capacity; a capture when it or the
 * work buffers change), no more. */
static void test_graph_buckets(const char *dir, const char *dir_tp2) {
    static const struct {
        int tp2, var;
        rt_gpu_precision prec;
        uint32_t ctx, steps, chunk_at, captures;
        const char *name;
    } cfg[] = {
        /* capacity 2048; keys 1021..1024 (bound 1024), 1025, 1026 (bound 2048), the chunk, then
         * 1047.. (work buffers reallocated): 3 captures */
        {0, 0, RT_GPU_PRECISE, 1020, 12, 6, 3, "graph buckets TP=1 precise, ctx 1020"},
        {0, 0, RT_GPU_FAST, 1020, 12, 6, 3, "graph buckets TP=1 fast (f16 cache), ctx 1020"},
        {1, 0, RT_GPU_PRECISE, 1020, 12, 6, 3, "graph buckets TP=2 (device-sum) precise, ctx 1020"},
        /* the same through a one-rank NCCL communicator: its all-reduces inside the captures */
        {0, GV_NCCL, RT_GPU_PRECISE, 1020, 12, 6, 3, "graph buckets TP=1 one-rank NCCL precise, ctx 1020"},
        /* capacity 32768; keys 16381..16384 (bound 16384, lane scores), 16385..16388 (bound
         * 24576, thread-per-key scores): 2 captures; no chunk */
        {0, 0, RT_GPU_PRECISE, 16380, 8, 99, 2, "graph buckets TP=1 precise, ctx 16380"},
    };
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        const char *d = cfg[c].tp2 ? dir_tp2 : dir;
        g5_error e = {0};
        rt_wset *ws = NULL;
        rt_model *m = NULL;
        rt_model_opts mo = {.n_threads = 1, .mla = RT_MLA_ABSORBED};
        T_CHECK(rt_wset_open_blobs(d, &ws, &e) == G5_OK && rt_model_create(ws, &mo, &m, &e) == G5_OK, "%s: %s",
                cfg[c].name, e.msg);
        const uint32_t V = m ? rt_model_hparams(m)->n_vocab : 0, n = cfg[c].steps;
        float *la = xmalloc((size_t)n * V * 4), *lb = xmalloc((size_t)n * V * 4), *lc = xmalloc((size_t)n * V * 4);
        rt_gpu_info ia, ib, ic;
        /* a second plain run (lc) first: two models without graphs must agree bit for bit, which
         * tells a context or plain-path difference from a graph one */
        if (m && graph_ctx_run(m, d, cfg[c].prec, cfg[c].var, 0, cfg[c].ctx, n, cfg[c].chunk_at, V, la, &ia, cfg[c].name) &&
            graph_ctx_run(m, d, cfg[c].prec, cfg[c].var, 0, cfg[c].ctx, n, cfg[c].chunk_at, V, lc, &ic, cfg[c].name) &&
            graph_ctx_run(m, d, cfg[c].prec, cfg[c].var, 1, cfg[c].ctx, n, cfg[c].chunk_at, V, lb, &ib, cfg[c].name)) {
            const int plain_same = !memcmp(la, lc, (size_t)n * V * 4);
            printf("%s: two plain runs %s\n", cfg[c].name, plain_same ? "bit-identical" : "DIFFER");
            T_CHECK(plain_same, "%s: two plain runs from the same synthetic context bit-identical", cfg[c].name);
            uint32_t same = 0, finite = 0, first_diff = n;
            for (uint32_t i = 0; i < n; i++) {
                const int eq = !memcmp(la + (size_t)i * V, lb + (size_t)i * V, (size_t)V * 4);
                same += eq;
                if (!eq && first_diff == n) first_diff = i;
                uint32_t f = 1;
                for (uint32_t v = 0; v < V; v++) f &= isfinite(lb[(size_t)i * V + v]) != 0;
                finite += f;
            }
            printf("%s: %u/%u logit vectors bit-identical to the plain run, %u finite; %llu graph steps, %llu captures "
                   "(expected %u), %llu instantiations\n", cfg[c].name, same, n, finite,
                   (unsigned long long)ib.graph_steps, (unsigned long long)ib.graph_captures, cfg[c].captures,
                   (unsigned long long)ib.graph_instantiations);
            /* where it starts tells the causes apart: step 0 (every step differs) is the context
             * or the first capture, the first graph step after a bucket change or the chunk
             * (chunk_at) a later capture */
            if (first_diff < n)
                printf("%s: first differing step %u of %u\n", cfg[c].name, first_diff, n);
            T_CHECK(same == n && finite == n, "%s: logits with graphs bit-identical to the plain run's", cfg[c].name);
            T_CHECK(ib.graph_steps == n - (cfg[c].chunk_at < n) && ib.graph_captures == cfg[c].captures &&
                        ib.graph_instantiations >= 1 && ib.graph_instantiations <= ib.graph_captures &&
                        ia.graph_steps == 0 && ia.graph_captures == 0,
                    "%s: one capture per bucket or buffer change (%llu steps, %llu captures, %llu instantiations)",
                    cfg[c].name, (unsigned long long)ib.graph_steps, (unsigned long long)ib.graph_captures,
                    (unsigned long long)ib.graph_instantiations);
        }
        free(la);
        free(lb);
        free(lc);
        rt_model_free(m);
        rt_wset_free(ws);
    }
}

static void test_graphs(const char *dir, const char *dir_tp2, const oracle *o) {
    static const struct { int tp2, var; rt_gpu_precision prec; const char *name; } cfg[] = {
        {0, 0, RT_GPU_PRECISE, "graph TP=1 precise"}, {0, 0, RT_GPU_FAST, "graph TP=1 fast"},
        {0, GV_H16, RT_GPU_FAST, "graph TP=1 fast, fp16 products"},
        {1, 0, RT_GPU_PRECISE, "graph TP=2 (device-sum) precise"},
        {0, GV_NCCL, RT_GPU_PRECISE, "graph TP=1 one-rank NCCL precise"}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        const char *d = cfg[c].tp2 ? dir_tp2 : dir;
        g5_error e = {0};
        rt_wset *ws = NULL;
        rt_model *m = NULL;
        T_CHECK(rt_wset_open_blobs(d, &ws, &e) == G5_OK, "%s: open: %s", cfg[c].name, e.msg);
        rt_model_opts mo = {.n_threads = 1, .mla = RT_MLA_ABSORBED};
        if (ws) T_CHECK(rt_model_create(ws, &mo, &m, &e) == G5_OK, "%s: model: %s", cfg[c].name, e.msg);
        if (m) {
            const uint32_t V = rt_model_hparams(m)->n_vocab;
            int32_t ta[GRAPH_STEPS + 2], tb[GRAPH_STEPS + 2];
            float *la = xmalloc((size_t)(GRAPH_STEPS + 2) * V * 4), *lb = xmalloc((size_t)(GRAPH_STEPS + 2) * V * 4);
            double sa = 0, sb = 0;
            const int oka = graph_run(m, d, cfg[c].prec, cfg[c].var, 0, o, V, ta, la, &sa, cfg[c].name);
            const int okb = graph_run(m, d, cfg[c].prec, cfg[c].var, 1, o, V, tb, lb, &sb, cfg[c].name);
            if (oka && okb) {
                uint32_t same_tok = 0, same_lg = 0, first_diff = GRAPH_STEPS + 2;
                double maxrel = 0;
                for (uint32_t i = 0; i < GRAPH_STEPS + 2; i++) {
                    same_tok += ta[i] == tb[i];
                    const int eq = !memcmp(la + (size_t)i * V, lb + (size_t)i * V, (size_t)V * 4);
                    same_lg += eq;
                    if (!eq && first_diff == GRAPH_STEPS + 2) first_diff = i;
                    const double r = rel_l2(lb + (size_t)i * V, la + (size_t)i * V, V);
                    if (r > maxrel) maxrel = r;
                }
                uint32_t oracle_eq = 0;
                while (oracle_eq < o->n_greedy && o->greedy_prompt == 1 && tb[oracle_eq] == o->greedy[oracle_eq]) oracle_eq++;
                printf("%s: %u/%u tokens and %u/%u logit vectors bit-identical to the plain run (max rel L2 %.3g%s); "
                       "first %u tokens equal the oracle's greedy\n",
                       cfg[c].name, same_tok, GRAPH_STEPS + 2, same_lg, GRAPH_STEPS + 2, maxrel,
                       first_diff < GRAPH_STEPS + 2 ? ", differences from step shown below" : "", oracle_eq);
                if (first_diff < GRAPH_STEPS + 2) printf("%s: first differing step %u\n", cfg[c].name, first_diff);
                printf("%s: %d decode steps: plain %.3f ms (%.1f us/step), graph %.3f ms (%.1f us/step), speedup %.2fx\n",
                       cfg[c].name, GRAPH_STEPS, sa * 1e3, sa * 1e6 / GRAPH_STEPS, sb * 1e3, sb * 1e6 / GRAPH_STEPS,
                       sb > 0 ? sa / sb : 0);
                T_CHECK(same_tok == GRAPH_STEPS + 2, "%s: greedy tokens with graphs equal the plain run's", cfg[c].name);
                T_CHECK(same_lg == GRAPH_STEPS + 2, "%s: logits with graphs bit-identical to the plain run's",
                        cfg[c].name);
            }
            free(la);
            free(lb);
        }
        rt_model_free(m);
        rt_wset_free(ws);
    }
}

int main(void) {
    setvbuf(stdout, NULL, _IONBF, 0); /* a crash must not eat the lines before it */
    /* the one-rank NCCL cases capture NCCL's all-reduces: the program's part, before any
     * communicator (runtime/gpu/gpu_model.h, rt_gpu_model_create, says why) */
    setenv("NCCL_GRAPH_MIXING_SUPPORT", "0", 0);
    if (!t_need_device() || !t_need_oracle()) return t_report(G5_TEST_NAME);
    oracle o;
    const int have = load_oracle(&o, 2048);
    T_CHECK(have, "oracle files load");
    if (!have) return t_report(G5_TEST_NAME);
    const char *tmp = t_tmpdir();
    char dirs[2][4200];
    int ok = 1;
    for (uint32_t c = 0; c < 2; c++) ok = t_oracle_blobs(tmp, c + 1, dirs[c], sizeof dirs[c]) && ok;
    if (ok) {
        test_graphs(dirs[0], dirs[1], &o);
        test_graph_buckets(dirs[0], dirs[1]);
        test_graph_shrink(dirs[0]);
    }
    free_oracle(&o);
    t_rmtree(tmp);
    return t_report(G5_TEST_NAME);
}
