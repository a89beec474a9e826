/* GPU sequences and batched decoding (runtime/gpu/gpu_model.h: rt_gpu_seq, rt_gpu_forward_batch),
 * and the concurrent-client half of tests/gpu/serve_gpu.sh.
 *
 * Without arguments (make test-gpu, tests/gpu/run_device.sh): the oracle (../shared/oracle,
 * $GLM5_SHARED) converted to blobs at TP 1 and TP 2; per configuration (precise, fast with its
 * f16 cache, fast with a bf16 cache, TP 2 on one device; precise, fast and TP 2 fast with CUDA
 * graphs: batched steps of up to GM_RGRAPH_MAX rows and the one-token reference both replayed
 * graphs) 18 sequences of different prompt lengths (1 .. 250 tokens: some above the
 * indexer's top-k, so the selection differs per sequence) are prefilled, then decoded for 10
 * steps twice over: one rt_gpu_forward_batch call per step (batches of 18 rows, more than one
 * 16-row GEMV launch; some steps leave a third of the sequences out and the order changes) and
 * one rt_gpu_forward_seq call per sequence and step. Every logits row must be bit-identical. The
 * one-at-a-time sequences grow their caches on demand (the 250-token one crosses 256 positions
 * mid-decode: a resize with its copy), the batched ones were reserved up front. Also: the
 * default sequence (rt_gpu_forward) equals an explicit one, a bad batch is refused without
 * advancing anything, and the step times (batched vs one at a time) are printed.
 *
 * Prefix caching (runtime/engine.h, the GPU prefix store), per configuration (TP 1 precise, with
 * CUDA graphs, fast bf16 and f16 caches, TP 2 precise and fast on one device; blocks of 32
 * tokens): requests on an engine with a store against the same requests on one without (same
 * block split), each a prefill and 20 greedy decode steps whose 21 logits rows must be
 * bit-identical, with the positions reused as the rules say: nothing at first, 3 blocks of a
 * shared 100-token prefix, 4 for the same prompt again, and for the next turn of a chat (the
 * prompt, its 20 generated ids, more) the prompt's 4 blocks but not the one decode steps
 * completed; then a store of 3 blocks, whose evictions (7, exactly) leave partial hits that are
 * still bit-identical. Over loopback, in-process glm5-serve --device cuda servers with and
 * without the prefix cache (TP 1 precise and fast, TP 2 precise): four greedy completions of two
 * prompts sharing 140 tokens report cached_tokens 0, 128, 128, 160 and the ids of the server
 * without it; the hit counter and the store's block gauge move; the same with --draft mtp on both
 * servers (TP 1 precise and fast: drafting over attached prefixes, the drafts counter moving). Chunked prefill (same
 * configurations): a 300-token prompt on a server with --prefill-chunk 80 (2 blocks of 32) runs in
 * 5 chunks and gives the ids of a server that runs each prompt in one step, alone and while
 * another greedy request decodes; that one gets a decode step between every two chunks
 * (glm5_decode_steps_beside_prefill_total) and keeps its own ids.
 *
 * With --client PORT CASES: 16 (one per line of CASES: "max_tokens<TAB>ids,...<TAB>expected ids
 * separated by spaces") concurrent greedy /v1/completions requests (token-id prompts, half of
 * them streamed) against a running glm5-serve; each must return exactly the expected ids
 * (glm5-run's, see serve_gpu.sh). Then: no sequence runs and no cache block is held any more,
 * the peak batch was > 1, the same requests once more (reused GPU sequences) give the same ids,
 * and a streamed request whose client hangs up is cancelled and frees its sequence. */
#define G5_TEST_NAME "test_gpu_serve"
#define G5_TEST_SEED 0x5e12e
#include "tests/test_util.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/oracle_blobs.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/time.h>

#include "convert/convert.h"
#include "cuda/cuk.h"
#include "runtime/engine.h"
#include "runtime/gpu/gpu_model.h"
#include "runtime/cpu/model.h"
#include "runtime/cpu/weights.h"
#include "runtime/serve/serve.h"
#include "tests/http_client.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- batched vs one at a time ---- */

#define NSEQ 18
#define STEPS 10

static const uint32_t k_lens[NSEQ] = {250, 1, 2, 5, 16, 17, 31, 32, 33, 40, 64, 77, 100, 128, 129, 150, 3, 9};

typedef struct bcfg {
    const char *name;
    int tp2;
    rt_gpu_precision prec;
    rt_gpu_cache cache;
    int graph;
    int h16; /* rt_gpu_opts.h16_products */
} bcfg;

static uint32_t argmax(const float *x, uint32_t n) {
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* cuk_argmax's rule (rt_gpu_outputs.argmax): the largest, the lowest id on ties, NaN never. */
static int32_t argmax_rule(const float *x, uint32_t n) {
    int64_t b = -1;
    for (uint32_t i = 0; i < n; i++)
        if (x[i] == x[i] && (b < 0 || x[i] > x[b])) b = i;
    return (int32_t)b;
}

/* The argmax output of a row (id, logit) against the row's logits x: the id by the rule, the
 * logit x[id]'s bits. */
static int argmax_ok(int32_t id, float v, const float *x, uint32_t n) {
    const int32_t w = argmax_rule(x, n);
    return id == w && (w < 0 ? v != v : !memcmp(&v, &x[w], 4));
}

static double max_abs_diff(const float *a, const float *b, uint32_t n) {
    double m = 0;
    for (uint32_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m)) m = d; /* NaN sticks */
    }
    return m;
}

/* Sequence i is in step s's batch: all of them, except every third step without i % 3 == 0. */
static int active(uint32_t i, uint32_t s) { return !(s % 3 == 1 && i % 3 == 0); }

static void batch_vs_single(const bcfg *c, const char *dir) {
    g5_error e = {0};
    rt_wset *ws = NULL;
    rt_model *m = NULL;
    rt_gpu_model *g = NULL;
    T_CHECK(rt_wset_open_blobs(dir, &ws, &e) == G5_OK, "%s: open: %s", c->name, e.msg);
    if (!ws) return;
    rt_model_opts mo = {.n_threads = 0, .mla = RT_MLA_ABSORBED};
    T_CHECK(rt_model_create(ws, &mo, &m, &e) == G5_OK, "%s: CPU model: %s", c->name, e.msg);
    rt_gpu_opts go;
    rt_gpu_opts_default(&go);
    go.blobs = rt_wset_blobs(ws);
    go.precision = c->prec;
    go.cache = c->cache;
    go.cuda_graph = c->graph;
    go.h16_products = c->h16;
    if (m) T_CHECK(rt_gpu_model_create(m, &go, &g, &e) == G5_OK, "%s: GPU model: %s", c->name, e.msg);
    if (!g) {
        rt_model_free(m);
        rt_wset_free(ws);
        return;
    }
    const rt_gpu_info *gi = rt_gpu_model_info(g);
    const uint32_t V = rt_model_hparams(m)->n_vocab;
    printf("%s: %u rank(s), collective %s, %s, %s cache, graphs %s\n", c->name, gi->n_ranks, gi->collective,
           gi->precision, gi->cache, gi->cuda_graph ? "on" : "off");
    T_CHECK(gi->h16_products == c->h16, "%s: h16_products %d", c->name, gi->h16_products);

    rt_gpu_seq *bs[NSEQ] = {0}, *rs[NSEQ] = {0};
    int32_t *prompt[NSEQ];
    float *lb = xmalloc((size_t)NSEQ * V * 4), *lr = xmalloc((size_t)NSEQ * V * 4), *lp = xmalloc((size_t)V * 4);
    int32_t next[NSEQ];
    int ok = 1;
    for (uint32_t i = 0; i < NSEQ; i++) {
        prompt[i] = xmalloc(k_lens[i] * sizeof(int32_t));
        for (uint32_t t = 0; t < k_lens[i]; t++) prompt[i][t] = (int32_t)(rnd() % V);
        /* batched: caches reserved up front; one at a time: grown on demand (from 256) */
        ok &= rt_gpu_seq_create(g, 512, &bs[i], &e) == G5_OK;
        ok &= rt_gpu_seq_create(g, 0, &rs[i], &e) == G5_OK;
    }
    T_CHECK(ok, "%s: sequences: %s", c->name, e.msg);
    uint32_t prefill_diff = 0;
    for (uint32_t i = 0; i < NSEQ && ok; i++) {
        const rt_gpu_outputs ob = {.logits = lb + (size_t)i * V}, orr = {.logits = lr + (size_t)i * V};
        ok &= rt_gpu_forward_seq(g, bs[i], prompt[i], k_lens[i], &ob, &e) == G5_OK;
        ok &= rt_gpu_forward_seq(g, rs[i], prompt[i], k_lens[i], &orr, &e) == G5_OK;
        if (ok && memcmp(lb + (size_t)i * V, lr + (size_t)i * V, (size_t)V * 4)) prefill_diff++;
        next[i] = (int32_t)argmax(lr + (size_t)i * V, V);
    }
    T_CHECK(ok, "%s: prefill: %s", c->name, e.msg);
    T_CHECK(prefill_diff == 0, "%s: %u prefills differ between two runs of the same call", c->name, prefill_diff);
    if (ok) { /* the default sequence is one like any other */
        const rt_gpu_outputs od = {.logits = lp};
        rt_gpu_reset(g);
        T_CHECK(rt_gpu_forward(g, prompt[10], k_lens[10], &od, &e) == G5_OK, "%s: rt_gpu_forward: %s", c->name, e.msg);
        T_CHECK(memcmp(lp, lr + (size_t)10 * V, (size_t)V * 4) == 0 && rt_gpu_n_past(g) == k_lens[10],
                "%s: rt_gpu_forward differs from rt_gpu_forward_seq", c->name);
        rt_gpu_seq *dup[2] = {bs[1], bs[1]};
        const int32_t tt[2] = {1, 2};
        T_CHECK(rt_gpu_forward_batch(g, dup, tt, 2, lb, &e) == G5_ERR_INVALID_ARG &&
                    rt_gpu_seq_n_past(bs[1]) == k_lens[1],
                "%s: a batch naming one sequence twice must be refused without advancing it", c->name);
        rt_gpu_seq *bad[2] = {bs[2], bs[3]};
        const int32_t tv[2] = {1, (int32_t)V};
        T_CHECK(rt_gpu_forward_batch(g, bad, tv, 2, lb, &e) == G5_ERR_INVALID_ARG && rt_gpu_seq_n_past(bs[2]) == k_lens[2],
                "%s: a token outside the vocabulary must be refused without advancing anything", c->name);
    }
    uint32_t rows = 0, diff_rows = 0, steps_gt16 = 0, am_rows = 0, am_bad = 0, dr_rows = 0, dr_bad = 0;
    const int draws = rt_gpu_model_info(g)->draws;
    samp_dev_row drows[NSEQ];
    cuk_sample_row crows[NSEQ];
    int32_t pids[NSEQ * 5]; /* the draws' penalty lists, one after another */
    uint32_t pcnt[NSEQ * 5], np = 0;
    int32_t dv[NSEQ], dv1[NSEQ];
    double worst = 0, t_batch = 0, t_single = 0;
    int32_t am[NSEQ], am1[NSEQ];
    float av[NSEQ], av1[NSEQ];
    for (uint32_t s = 0; s < STEPS && ok; s++) {
        rt_gpu_seq *bb[NSEQ];
        int32_t tok[NSEQ];
        uint32_t idx[NSEQ], k = 0;
        for (uint32_t j = 0; j < NSEQ; j++) {
            const uint32_t i = s % 2 ? j : NSEQ - 1 - j; /* the order changes too */
            if (!active(i, s)) continue;
            idx[k] = i;
            bb[k] = bs[i];
            tok[k++] = next[i];
        }
        if (k > CUK_GEMV_MAX_N) steps_gt16++;
        /* the argmax outputs (greedy steps: rt_eng_decode_argmax) on two steps of four, on the
         * second without the logits, for the batch and for the one-token calls (graphs too); on
         * the fourth, where the model draws on the device, the draws (rt_eng_decode_draw: the
         * batch without its logits, the one-token calls with them) */
        const int mode = s % 4, want_dr = mode == 3 && draws, want_am = mode == 1 || mode == 2, want_lg = mode < 2;
        np = 0;
        for (uint32_t j = 0; j < k && want_dr; j++) {
            const uint32_t u = (uint32_t)(rnd() % 4);
            drows[j] = (samp_dev_row){.temperature = u == 0 ? 0.0f : unif(0.4f, 1.4f), .min_p = u == 3 ? unif(0.01f, 0.2f) : 0.0f,
                                      .top_p = u == 2 || (u == 3 && j % 2) ? unif(0.5f, 0.99f) : 1.0f,
                                      .top_k = u == 1 && j % 2 ? 40 : 0, .k = rnd() >> 11}; /* penalties: below */
            if (drows[j].min_p > 0) drows[j].lmin = log((double)drows[j].min_p);
            if (j % 3 == 1) { /* penalties on up to 5 ascending ids */
                const uint32_t m = 1 + (uint32_t)(rnd() % 5);
                int32_t id = (int32_t)(rnd() % (V / 8));
                for (uint32_t q = 0; q < m && id < (int32_t)V; q++, id += 1 + (int32_t)(rnd() % 7))
                    pids[np + drows[j].n_pen] = id, pcnt[np + drows[j].n_pen++] = 1 + (uint32_t)(rnd() % 4);
                drows[j].repeat_penalty = 1.3f, drows[j].frequency_penalty = 0.3f, drows[j].presence_penalty = 0.5f;
                drows[j].pen_ids = pids + np, drows[j].pen_counts = pcnt + np;
            }
            crows[j] = (cuk_sample_row){.temperature = drows[j].temperature, .min_p = drows[j].min_p, .top_p = drows[j].top_p,
                                        .top_k = drows[j].top_k, .lmin = drows[j].lmin, .k = drows[j].k,
                                        .repeat_penalty = drows[j].repeat_penalty,
                                        .frequency_penalty = drows[j].frequency_penalty,
                                        .presence_penalty = drows[j].presence_penalty, .pen_off = np, .n_pen = drows[j].n_pen};
            np += drows[j].n_pen;
        }
        const rt_gpu_outputs ob = {.logits = want_lg ? lb : NULL, .all_logits = 1, .argmax = want_am ? am : NULL,
                                   .argmax_logit = want_am ? av : NULL, .draw = want_dr ? crows : NULL,
                                   .draw_ids = want_dr ? dv : NULL, .draw_pen_ids = pids, .draw_pen_counts = pcnt,
                                   .draw_n_pen = want_dr ? np : 0};
        double t0 = now_s();
        ok &= rt_gpu_forward_rows(g, bb, NULL, k, tok, &ob, &e) == G5_OK;
        t_batch += now_s() - t0;
        if (!ok) break;
        t0 = now_s();
        for (uint32_t j = 0; j < k && ok; j++) {
            const rt_gpu_outputs o1 = {.logits = lr + (size_t)j * V, .argmax = want_am ? &am1[j] : NULL,
                                       .argmax_logit = want_am ? &av1[j] : NULL, .draw = want_dr ? &crows[j] : NULL,
                                       .draw_ids = want_dr ? &dv1[j] : NULL, .draw_pen_ids = pids, .draw_pen_counts = pcnt,
                                       .draw_n_pen = want_dr ? np : 0}; /* crows[j].pen_off indexes the whole list */
            ok &= rt_gpu_forward_seq(g, rs[idx[j]], &tok[j], 1, &o1, &e) == G5_OK;
        }
        t_single += now_s() - t0;
        for (uint32_t j = 0; j < k && ok; j++) {
            const float *a = lb + (size_t)j * V, *b = lr + (size_t)j * V;
            rows++;
            if (want_am) {
                am_rows++;
                am_bad += !argmax_ok(am[j], av[j], b, V) + !argmax_ok(am1[j], av1[j], b, V);
            }
            if (want_dr) {
                const int32_t w = samp_device_draw(&drows[j], b, V);
                dr_rows++;
                dr_bad += (dv[j] != w) + (dv1[j] != w);
            }
            if (want_lg && memcmp(a, b, (size_t)V * 4)) {
                const double d = max_abs_diff(a, b, V);
                if (diff_rows < 5)
                    printf("  step %u sequence %u (position %u): batched row differs, max |diff| %.3e, argmax %u vs %u\n",
                           s, idx[j], rt_gpu_seq_n_past(rs[idx[j]]) - 1, d, argmax(a, V), argmax(b, V));
                diff_rows++;
                if (!(d <= worst)) worst = d;
            }
            next[idx[j]] = (int32_t)argmax(b, V); /* both go on with the reference's choice */
        }
    }
    T_CHECK(ok, "%s: decode: %s", c->name, e.msg);
    for (uint32_t i = 0; i < NSEQ && ok; i++)
        T_CHECK(rt_gpu_seq_n_past(bs[i]) == rt_gpu_seq_n_past(rs[i]), "%s: sequence %u at %u vs %u", c->name, i,
                rt_gpu_seq_n_past(bs[i]), rt_gpu_seq_n_past(rs[i]));
    T_CHECK(ok && rt_gpu_seq_capacity(rs[0]) >= 512 && rt_gpu_seq_capacity(bs[0]) == 512,
            "%s: capacities %u (grown) and %u (reserved)", c->name, rt_gpu_seq_capacity(rs[0]),
            rt_gpu_seq_capacity(bs[0]));
    printf("%s: %u batched rows over %u steps (%u of more than %d rows): %u differ from one-at-a-time (max |diff| %.3e); "
           "batched steps %.2f ms, one-at-a-time %.2f ms per step\n",
           c->name, rows, STEPS, steps_gt16, CUK_GEMV_MAX_N, diff_rows, worst, 1e3 * t_batch / STEPS,
           1e3 * t_single / STEPS);
    T_CHECK(ok && rows > 0 && diff_rows == 0, "%s: batched decoding must equal one-at-a-time bit for bit (%u of %u rows differ)",
            c->name, diff_rows, rows);
    T_CHECK(ok && am_rows > 0 && am_bad == 0,
            "%s: argmax outputs (batched and one-token) must be the logits' argmax and its bits (%u wrong of 2 x %u)",
            c->name, am_bad, am_rows);
    T_CHECK(ok && (draws ? dr_rows > 0 : dr_rows == 0) && dr_bad == 0,
            "%s: device draws (batched and one-token) must be samp_device_draw's tokens from the logits (%u wrong of "
            "2 x %u; draws %s)", c->name, dr_bad, dr_rows, draws ? "on" : "off: the head is split");
    for (uint32_t i = 0; i < NSEQ; i++) {
        rt_gpu_seq_free(bs[i]);
        rt_gpu_seq_free(rs[i]);
        free(prompt[i]);
    }
    free(lb);
    free(lr);
    free(lp);
    rt_gpu_model_free(g);
    rt_model_free(m);
    rt_wset_free(ws);
}

/* ---- prefix caching (runtime/engine.h): the engine's GPU prefix store ---- */

static int http_body(uint16_t port, const char *method, const char *path, const char *body, char **out);
static double get_metric(uint16_t port, const char *name);
static int idle_after(uint16_t port, double timeout_s);

#define PBT 32     /* prefix block (small: the oracle's prompts span several) */
#define PSTEPS 20  /* greedy decode steps per request */

typedef struct pcfg {
    const char *name;
    int tp2;
    rt_eng_precision prec;
    rt_eng_cache cache;
    int graph;
    int draft; /* servers: --draft mtp */
} pcfg;

static g5_status open_eng(const pcfg *c, const char *dir, int store, uint64_t bytes, rt_eng **out, g5_error *e) {
    rt_eng_opts o;
    rt_eng_opts_default(&o);
    o.device = RT_ENG_CUDA;
    o.precision = c->prec;
    o.cache = c->cache;
    o.cuda_graph = c->graph;
    o.prefix_block_tokens = PBT;
    o.kv_prefix_cache = store;
    o.prefix_cache_bytes = bytes;
    return rt_eng_open(dir, &o, out, e);
}

/* One request on e: attach (when use_store), prefill the rest, PSTEPS greedy steps, publish (when
 * use_store). logits: [(1 + PSTEPS)][V], the prefill's last row then each step's; gen: the greedy
 * ids (PSTEPS). Returns the reused positions, or -1 on an error (reported). */
static int run_req(rt_eng *e, const int32_t *prompt, uint32_t n, int use_store, float *logits, int32_t *gen,
                   const char *what) {
    g5_error er = {0};
    const uint32_t V = rt_eng_hparams(e)->n_vocab;
    rt_eng_seq *q = NULL;
    uint32_t reused = 0;
    int ok = rt_eng_seq_create(e, 512, &q, &er) == G5_OK;
    if (ok && use_store) ok = rt_eng_seq_attach_prefix(q, prompt, n, &reused, &er) == G5_OK;
    if (ok) ok = rt_eng_seq_n_past(q) == reused;
    const rt_eng_out out = {.logits = logits};
    if (ok) ok = rt_eng_prefill(q, prompt + reused, n - reused, &out, &er) == G5_OK;
    for (uint32_t t = 0; t < PSTEPS && ok; t++) {
        gen[t] = (int32_t)argmax(logits + (size_t)t * V, V);
        ok = rt_eng_decode(e, &q, &gen[t], 1, logits + (size_t)(t + 1) * V, &er) == G5_OK;
    }
    if (ok && use_store) {
        int32_t *all = xmalloc((n + PSTEPS) * sizeof *all);
        memcpy(all, prompt, n * sizeof *all);
        memcpy(all + n, gen, PSTEPS * sizeof *all);
        ok = rt_eng_seq_publish_prefix(q, all, &er) == G5_OK;
        free(all);
    }
    T_CHECK(ok, "%s: %s", what, er.msg);
    rt_eng_seq_free(q);
    return ok ? (int)reused : -1;
}

/* The request on the store's engine `e` against the same request on the reference engine `r`
 * (no store): reused positions as expected, every logits row bit-identical. */
static void check_req(rt_eng *e, rt_eng *r, const int32_t *prompt, uint32_t n, int want_reused, const char *cfg,
                      const char *what) {
    const uint32_t V = rt_eng_hparams(e)->n_vocab;
    float *la = xmalloc((size_t)(1 + PSTEPS) * V * 4), *lr = xmalloc((size_t)(1 + PSTEPS) * V * 4);
    int32_t ga[PSTEPS], gr[PSTEPS];
    char label[256];
    snprintf(label, sizeof label, "%s: %s", cfg, what);
    const int got = run_req(e, prompt, n, 1, la, ga, label);
    const int ref = run_req(r, prompt, n, 0, lr, gr, label);
    if (got >= 0 && ref >= 0) {
        T_CHECK(got == want_reused, "%s: %d positions reused (want %d)", label, got, want_reused);
        uint32_t bad = 0;
        for (uint32_t t = 0; t <= PSTEPS; t++) {
            const float *a = la + (size_t)t * V, *b = lr + (size_t)t * V;
            if (!memcmp(a, b, (size_t)V * 4)) continue;
            if (bad++ < 3)
                printf("  %s: %s row %u (position %u) differs from the run without prefix caching: max |diff| %.3e, "
                       "argmax %u vs %u\n", label, t ? "decode" : "prefill", t, n - 1 + t, max_abs_diff(a, b, V),
                       argmax(a, V), argmax(b, V));
        }
        T_CHECK(bad == 0, "%s: %u of %u logits rows differ with prefix caching (%d positions reused)", label, bad,
                1 + PSTEPS, got);
    }
    free(la);
    free(lr);
}

static void prefix_engine(const pcfg *c, const char *dir) {
    g5_error e = {0};
    rt_eng *big = NULL, *small = NULL, *ref = NULL;
    T_CHECK(open_eng(c, dir, 1, 64ull << 20, &big, &e) == G5_OK, "%s: engine with a prefix store: %s", c->name, e.msg);
    T_CHECK(open_eng(c, dir, 0, 0, &ref, &e) == G5_OK, "%s: engine without: %s", c->name, e.msg);
    rt_eng_prefix_info pi = {0}, pr = {0};
    if (big) rt_eng_prefix_get_info(big, &pi);
    if (ref) rt_eng_prefix_get_info(ref, &pr);
    T_CHECK(pi.on && pi.block_tokens == PBT && pi.n_blocks > 8 && pi.block_bytes > 0 && !pr.on,
            "%s: store on (%u blocks of %u tokens, %llu bytes each) and off", c->name, pi.n_blocks, pi.block_tokens,
            (unsigned long long)pi.block_bytes);
    /* three blocks: evictions */
    if (pi.block_bytes)
        T_CHECK(open_eng(c, dir, 1, 3 * pi.block_bytes + pi.block_bytes / 2, &small, &e) == G5_OK,
                "%s: engine with a 3-block store: %s", c->name, e.msg);
    if (!big || !ref || !small) goto done;
    printf("%s: prefix store of %u blocks of %u tokens (%.3f MB per block and rank)\n", c->name, pi.n_blocks, PBT,
           pi.block_bytes / 1e6);
    const uint32_t V = rt_eng_hparams(big)->n_vocab;
    int32_t A[150], B[160], D[100], E2[100], M[200];
    for (int i = 0; i < 150; i++) A[i] = (int32_t)(rnd() % V);
    memcpy(B, A, 100 * sizeof *B); /* 3 whole blocks shared */
    for (int i = 100; i < 160; i++) B[i] = (int32_t)(rnd() % V);
    for (int i = 0; i < 100; i++) D[i] = (int32_t)(rnd() % V);
    memcpy(E2, A, 40 * sizeof *E2); /* 1 whole block shared */
    for (int i = 40; i < 100; i++) E2[i] = (int32_t)(rnd() % V);

    check_req(big, ref, A, 150, 0, c->name, "first request (nothing cached)");
    check_req(big, ref, B, 160, 96, c->name, "second request sharing 100 tokens (3 blocks)");
    check_req(big, ref, A, 150, 128, c->name, "the first prompt again (4 blocks, 22 tokens run)");
    /* multi-turn: A, its first 20 greedy ids (as the run above generated them), more: the block
     * that decode steps completed (positions 128..159) is not reused, the prompt's 4 are */
    {
        float *lg = xmalloc((size_t)(1 + PSTEPS) * V * 4);
        int32_t gen[PSTEPS];
        (void)run_req(ref, A, 150, 0, lg, gen, "multi-turn ids");
        free(lg);
        memcpy(M, A, 150 * sizeof *M);
        memcpy(M + 150, gen, PSTEPS * sizeof *M);
        for (int i = 150 + PSTEPS; i < 200; i++) M[i] = (int32_t)(rnd() % V);
        check_req(big, ref, M, 200, 128, c->name, "next turn (the prompt's blocks, not the decoded one)");
        check_req(big, ref, M, 200, 192, c->name, "the next turn again (its own prompt's 6 blocks)");
    }
    rt_eng_prefix_get_info(big, &pi);
    T_CHECK(pi.n_cached >= 7 && pi.n_evicted == 0, "%s: %u blocks stored, %llu evicted", c->name, pi.n_cached,
            (unsigned long long)pi.n_evicted);
    /* a store of 3 blocks: A keeps its first 3; E2 shares the first and evicts the others; D
     * evicts E2's */
    check_req(small, ref, A, 150, 0, c->name, "3-block store: first request");
    check_req(small, ref, A, 150, 96, c->name, "3-block store: again (3 of its 4 blocks kept)");
    check_req(small, ref, E2, 100, 32, c->name, "3-block store: 1 block shared");
    check_req(small, ref, A, 150, 32, c->name, "3-block store: A after E2 evicted its blocks 1, 2");
    check_req(small, ref, D, 100, 0, c->name, "3-block store: unrelated prompt");
    check_req(small, ref, D, 100, 96, c->name, "3-block store: unrelated prompt again (its 3 blocks)");
    rt_eng_prefix_get_info(small, &pi);
    T_CHECK(pi.n_blocks == 3 && pi.n_cached == 3 && pi.n_evicted == 7, "%s: 3-block store: %u of %u used, %llu evicted (want 7)",
            c->name, pi.n_cached, pi.n_blocks, (unsigned long long)pi.n_evicted);
done:
    rt_eng_free(small);
    rt_eng_free(big);
    rt_eng_free(ref);
}

/* ---- prefix caching over loopback: glm5-serve --device cuda in process ---- */

/* chunk: srv_config.prefill_chunk (0: the default) */
static srv_server *start_gpu_server(const char *model, const pcfg *c, int prefix, uint32_t chunk) {
    srv_config sc;
    srv_config_default(&sc);
    if (chunk) sc.prefill_chunk = chunk;
    sc.model_path = model;
    sc.port = 0;
    sc.device = SRV_DEVICE_CUDA;
    sc.max_batch = 4;
    sc.ctx_size = 512;
    sc.gpu_fast = c->prec == RT_ENG_FAST;
    sc.gpu_prefix_block = PBT;
    sc.gpu_prefix_cache_mb = 64;
    sc.prefix_cache = prefix;
    sc.draft_mtp = c->draft;
    srv_server *s = NULL;
    g5_error e = {0};
    T_CHECK(srv_create(&sc, &s, &e) == G5_OK, "%s: server (prefix cache %d): %s", c->name, prefix, e.msg);
    for (int i = 0; s && i < 6000 && srv_get_load_state(s, NULL) == SRV_LOADING; i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    T_CHECK(s && srv_get_load_state(s, &e) == SRV_READY, "%s: server (prefix cache %d) loaded: %s", c->name, prefix,
            e.msg);
    return s;
}

/* POST /v1/completions with the JSON fields `fields` and the prompt ids: the status, up to cap_out
 * token ids of the first choice, and the parsed response (*resp, NULL unless 200; the caller
 * frees it). */
static int post_completion(uint16_t port, const char *fields, const int32_t *ids, uint32_t n, int32_t *out,
                           uint32_t cap_out, uint32_t *n_out, json_t **resp) {
    size_t cap = strlen(fields) + 32 + (size_t)n * 12;
    char *body = xmalloc(cap), *p = body;
    p += snprintf(p, cap, "{%s,\"prompt\":[", fields);
    for (uint32_t i = 0; i < n; i++) p += snprintf(p, cap - (size_t)(p - body), "%s%d", i ? "," : "", ids[i]);
    snprintf(p, cap - (size_t)(p - body), "]}");
    char *text = NULL;
    const int status = http_body(port, "POST", "/v1/completions", body, &text);
    free(body);
    *n_out = 0;
    json_t *j = status == 200 && text ? json_loads(text, 0, NULL) : NULL;
    json_t *t = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "token_ids");
    for (size_t k = 0; k < json_array_size(t) && *n_out < cap_out; k++)
        out[(*n_out)++] = (int32_t)json_integer_value(json_array_get(t, k));
    free(text);
    *resp = j;
    return status;
}

/* One greedy completion of ids (max_tokens): up to cap token ids, usage.prompt_tokens_details.cached_tokens
 * and the finish reason (finish may be NULL). */
static int complete_req(uint16_t port, const int32_t *ids, uint32_t n, uint32_t max_tokens, int32_t *out, uint32_t cap_out,
                        uint32_t *n_out, long *cached, char finish[16]) {
    char fields[96];
    snprintf(fields, sizeof fields, "\"max_tokens\":%u,\"temperature\":0,\"return_token_ids\":true", max_tokens);
    json_t *j = NULL;
    const int status = post_completion(port, fields, ids, n, out, cap_out, n_out, &j);
    *cached = -1;
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    json_t *d = json_object_get(json_object_get(json_object_get(j, "usage"), "prompt_tokens_details"), "cached_tokens");
    if (json_is_integer(d)) *cached = (long)json_integer_value(d);
    if (finish) snprintf(finish, 16, "%s", json_is_string(json_object_get(ch, "finish_reason"))
                                               ? json_string_value(json_object_get(ch, "finish_reason")) : "");
    json_decref(j);
    return status;
}

static int complete_ids(uint16_t port, const int32_t *ids, uint32_t n, int32_t *out, uint32_t *n_out, long *cached) {
    return complete_req(port, ids, n, PSTEPS, out, 64, n_out, cached, NULL);
}

static void prefix_server(const pcfg *c, const char *model) {
    srv_server *on = start_gpu_server(model, c, 1, 0), *off = start_gpu_server(model, c, 0, 0);
    if (on && off && srv_get_load_state(on, NULL) == SRV_READY && srv_get_load_state(off, NULL) == SRV_READY) {
        const uint16_t pon = srv_port(on), poff = srv_port(off);
        int32_t A[150], B[170];
        for (int i = 0; i < 150; i++) A[i] = (int32_t)(10 + rnd() % 1500);
        memcpy(B, A, 140 * sizeof *B); /* 4 blocks shared */
        for (int i = 140; i < 170; i++) B[i] = (int32_t)(10 + rnd() % 1500);
        const double h0 = get_metric(pon, "glm5_prefix_cache_hits_total");
        static const struct { int b; long want; } seq[] = {{0, 0}, {1, 128}, {0, 128}, {1, 160}};
        for (size_t k = 0; k < sizeof seq / sizeof seq[0]; k++) {
            const int32_t *pr = seq[k].b ? B : A;
            const uint32_t n = seq[k].b ? 170 : 150;
            int32_t g1[64], g2[64];
            uint32_t n1, n2;
            long c1, c2;
            const int s1 = complete_ids(pon, pr, n, g1, &n1, &c1), s2 = complete_ids(poff, pr, n, g2, &n2, &c2);
            T_CHECK(s1 == 200 && s2 == 200 && n1 > 0, "%s: request %zu: status %d / %d, %u ids", c->name, k, s1, s2, n1);
            T_CHECK(c1 == seq[k].want && c2 == 0, "%s: request %zu (prompt %s): cached_tokens %ld (want %ld), %ld without",
                    c->name, k, seq[k].b ? "B" : "A", c1, seq[k].want, c2);
            const int same = n1 == n2 && !memcmp(g1, g2, n1 * sizeof *g1);
            if (!same) {
                printf("  %s: request %zu ids with the cache:", c->name, k);
                for (uint32_t i = 0; i < n1; i++) printf(" %d", g1[i]);
                printf(" | without:");
                for (uint32_t i = 0; i < n2; i++) printf(" %d", g2[i]);
                printf("\n");
            }
            T_CHECK(same, "%s: request %zu: the same ids with and without the prefix cache", c->name, k);
        }
        const double h1 = get_metric(pon, "glm5_prefix_cache_hits_total");
        T_CHECK(h1 - h0 == 128 + 128 + 160, "%s: glm5_prefix_cache_hits_total +%.0f (want 416)", c->name, h1 - h0);
        T_CHECK(get_metric(pon, "glm5_prefix_cache_blocks") >= 5 && get_metric(poff, "glm5_prefix_cache_blocks") == 0,
                "%s: glm5_prefix_cache_blocks %.0f / %.0f", c->name, get_metric(pon, "glm5_prefix_cache_blocks"),
                get_metric(poff, "glm5_prefix_cache_blocks"));
        if (c->draft) /* the drafters over attached prefixes resumed from the store's hidden states */
            T_CHECK(get_metric(pon, "glm5_draft_tokens_total") > 0 && get_metric(poff, "glm5_draft_tokens_total") > 0,
                    "%s: drafts made (%.0f / %.0f)", c->name, get_metric(pon, "glm5_draft_tokens_total"),
                    get_metric(poff, "glm5_draft_tokens_total"));
        T_CHECK(idle_after(pon, 10) && idle_after(poff, 10), "%s: servers idle after the requests", c->name);
    }
    srv_free(on);
    srv_free(off);
}

/* ---- token draws on the device (rt_eng_decode_draw) ---- */

/* One sampled completion (temperature 0.9, the seed, min_p, a presence penalty; logprobs 1 or
 * none): its token ids. */
static int complete_sampled(uint16_t port, const int32_t *ids, uint32_t n, long seed, double min_p, double presence,
                            int logprobs, int32_t *out, uint32_t cap_out, uint32_t *n_out) {
    char fields[200];
    snprintf(fields, sizeof fields,
             "\"max_tokens\":%u,\"temperature\":0.9,\"seed\":%ld,\"min_p\":%g,\"presence_penalty\":%g,%s\"return_token_ids\":true",
             cap_out, seed, min_p, presence, logprobs ? "\"logprobs\":1," : "");
    json_t *j = NULL;
    const int status = post_completion(port, fields, ids, n, out, cap_out, n_out, &j);
    json_decref(j);
    return status;
}

/* Seeded sampled requests drawn on the device (no logprobs: rt_eng_decode_draw where the model
 * draws there) give the ids of the same requests with logprobs, which the host draws from the
 * logits; glm5_device_draw_steps_total counts the device's steps (none where the head is split). */
static void draw_server(const pcfg *c, const char *model) {
    srv_server *s = start_gpu_server(model, c, 0, 0);
    if (s && srv_get_load_state(s, NULL) == SRV_READY) {
        const uint16_t port = srv_port(s);
        const double d0 = get_metric(port, "glm5_device_draw_steps_total");
        int same = 0, n_req = 0;
        for (int k = 0; k < 4; k++) {
            int32_t pr[40], a[24], b[24];
            for (int i = 0; i < 40; i++) pr[i] = (int32_t)(10 + rnd() % 1500);
            uint32_t na = 0, nb = 0;
            const double mp = k % 2 ? 0.05 : 0.0, pres = k >= 2 ? 1.5 : 0.0; /* penalties on the device too */
            const int sa = complete_sampled(port, pr, 40, 1000 + k, mp, pres, 0, a, 24, &na);
            const int sb = complete_sampled(port, pr, 40, 1000 + k, mp, pres, 1, b, 24, &nb);
            n_req++;
            same += sa == 200 && sb == 200 && na > 0 && na == nb && !memcmp(a, b, na * sizeof *a);
        }
        const double d1 = get_metric(port, "glm5_device_draw_steps_total");
        T_CHECK(same == n_req, "%s: seeded sampled requests drawn without logprobs give the ids of the same requests "
                "drawn on the host (%d of %d)", c->name, same, n_req);
        const int draws = c->tp2 == 0; /* one rank holds the head */
        T_CHECK(draws ? d1 - d0 > 0 : d1 == d0, "%s: glm5_device_draw_steps_total +%.0f (%s)", c->name, d1 - d0,
                draws ? "want > 0" : "want 0: the head is split");
        T_CHECK(idle_after(port, 10), "%s: draw server idle after the requests", c->name);
    }
    srv_free(s);
}

/* ---- chunked prefill beside decoding (runtime/serve/serve_engine.c, srv_prefill_chunk) ---- */

#define CNA 300    /* the long prompt: 9 blocks of PBT and 12 tokens */
#define CCHUNK 80  /* --prefill-chunk: 2 blocks of PBT per chunk, so 5 chunks for CNA */
#define CNB 10     /* the decoding request: its prompt and tokens */
#define CGB 400

typedef struct bjob {
    uint16_t port;
    const int32_t *prompt;
    int32_t ids[CGB];
    uint32_t n;
    int status;
} bjob;

static void *bjob_main(void *arg) {
    bjob *j = arg;
    long cached;
    j->status = complete_req(j->port, j->prompt, CNB, CGB, j->ids, CGB, &j->n, &cached, NULL);
    return NULL;
}

/* A long prompt on a server whose chunks are 2 blocks: alone it runs in 5 chunks and gives the
 * ids of a server running each prompt in one step (the old GPU behaviour: one rt_eng_prefill);
 * sent while another request B decodes, it gives the same ids again, in 5 chunks, with B's
 * decode steps between every two of them (glm5_decode_steps_beside_prefill_total +4) and B's own
 * ids those of B alone. B is a prompt whose greedy run reaches CGB tokens (decoding throughout). */
static void chunked_server(const pcfg *c, const char *model) {
    srv_server *x = start_gpu_server(model, c, 0, CCHUNK), *y = start_gpu_server(model, c, 0, 1u << 30);
    if (x && y && srv_get_load_state(x, NULL) == SRV_READY && srv_get_load_state(y, NULL) == SRV_READY) {
        const uint16_t px = srv_port(x), py = srv_port(y);
        const uint32_t want_chunks = (CNA + 2 * PBT - 1) / (2 * PBT);
        int32_t A[CNA], one[64], alone[64], with[64];
        static int32_t B[CNB], bref[CGB];
        uint32_t n_one = 0, n_alone = 0, n_with = 0, n_bref = 0;
        long cached;
        char fin[16] = "";
        for (int i = 0; i < CNA; i++) A[i] = (int32_t)(10 + rnd() % 1500);
        for (int t = 0; t < 8 && strcmp(fin, "length"); t++) {
            for (int i = 0; i < CNB; i++) B[i] = (int32_t)(10 + rnd() % 1500);
            if (complete_req(px, B, CNB, CGB, bref, CGB, &n_bref, &cached, fin) != 200) break;
        }
        T_CHECK(!strcmp(fin, "length") && n_bref == CGB, "%s: a prompt B decoding %d tokens (%u, finish %s)", c->name, CGB,
                n_bref, fin);
        const int s1 = complete_ids(py, A, CNA, one, &n_one, &cached);
        const double c0 = get_metric(px, "glm5_prefill_chunks_total");
        const double d0 = get_metric(px, "glm5_decode_steps_beside_prefill_total");
        const int s2 = complete_ids(px, A, CNA, alone, &n_alone, &cached);
        const double c1 = get_metric(px, "glm5_prefill_chunks_total");
        const double d1 = get_metric(px, "glm5_decode_steps_beside_prefill_total");
        T_CHECK(s1 == 200 && s2 == 200 && n_one > 0 && n_alone == n_one && !memcmp(alone, one, n_one * sizeof *one),
                "%s: A alone in chunks of 2 blocks gives the ids of A in one step (%d/%d, %u vs %u ids)", c->name, s2, s1,
                n_alone, n_one);
        T_CHECK(c1 - c0 == want_chunks && d1 == d0, "%s: A alone in %.0f chunks (want %u), %.0f decode steps beside",
                c->name, c1 - c0, want_chunks, d1 - d0);
        if (!strcmp(fin, "length")) {
            bjob jb = {.port = px, .prompt = B};
            const double g0 = get_metric(px, "glm5_generation_tokens_total");
            pthread_t th;
            pthread_create(&th, NULL, bjob_main, &jb);
            const double t0 = now_s(); /* B is decoding once it has drawn two tokens */
            while (get_metric(px, "glm5_generation_tokens_total") < g0 + 2 && now_s() - t0 < 30) {
                struct timespec ts = {0, 200 * 1000};
                nanosleep(&ts, NULL);
            }
            const double c2 = get_metric(px, "glm5_prefill_chunks_total");
            const double d2 = get_metric(px, "glm5_decode_steps_beside_prefill_total");
            const int s3 = complete_ids(px, A, CNA, with, &n_with, &cached);
            const double c3 = get_metric(px, "glm5_prefill_chunks_total");
            const double d3 = get_metric(px, "glm5_decode_steps_beside_prefill_total");
            pthread_join(th, NULL);
            printf("%s: A (%d tokens) in %.0f chunks beside B, %.0f of B's decode steps between them\n", c->name, CNA,
                   c3 - c2, d3 - d2);
            T_CHECK(s3 == 200 && n_with == n_alone && !memcmp(with, alone, n_alone * sizeof *alone),
                    "%s: A beside a decoding request gives A's ids alone (%u vs %u ids)", c->name, n_with, n_alone);
            T_CHECK(c3 - c2 == want_chunks, "%s: A beside B in %.0f chunks (want %u)", c->name, c3 - c2, want_chunks);
            T_CHECK(d3 - d2 == want_chunks - 1, "%s: %.0f decode steps of B between A's chunks (want %u)", c->name, d3 - d2,
                    want_chunks - 1);
            T_CHECK(jb.status == 200 && jb.n == n_bref && !memcmp(jb.ids, bref, n_bref * sizeof *bref),
                    "%s: B beside A's chunks gives B's ids alone (%d, %u vs %u ids)", c->name, jb.status, jb.n, n_bref);
        }
        T_CHECK(idle_after(px, 10) && idle_after(py, 10), "%s: chunked-prefill servers idle after the requests", c->name);
    }
    srv_free(x);
    srv_free(y);
}

static int run_batch_tests(void) {
    if (!t_need_device() || !t_need_oracle()) return t_report(G5_TEST_NAME);
    const char *tmp = t_tmpdir();
    char dirs[2][4200];
    int have[2] = {0, 0};
    for (int t = 0; t < 2; t++) {
        have[t] = t_oracle_blobs(tmp, (uint32_t)(t + 1), dirs[t], sizeof dirs[t]);
    }
    static const bcfg cfg[] = {
        {"TP=1 precise", 0, RT_GPU_PRECISE, RT_GPU_CACHE_DEFAULT, 0, 0},
        {"TP=1 precise, CUDA graphs (batched and one-token steps)", 0, RT_GPU_PRECISE, RT_GPU_CACHE_DEFAULT, 1, 0},
        {"TP=1 fast (f16 cache), CUDA graphs", 0, RT_GPU_FAST, RT_GPU_CACHE_DEFAULT, 1, 0},
        {"TP=2 fast (f16 cache), CUDA graphs", 1, RT_GPU_FAST, RT_GPU_CACHE_DEFAULT, 1, 0},
        {"TP=1 fast (f16 cache)", 0, RT_GPU_FAST, RT_GPU_CACHE_DEFAULT, 0, 0},
        {"TP=1 fast, bf16 cache", 0, RT_GPU_FAST, RT_GPU_CACHE_BF16, 0, 0},
        {"TP=2 precise", 1, RT_GPU_PRECISE, RT_GPU_CACHE_DEFAULT, 0, 0},
        {"TP=2 fast (f16 cache)", 1, RT_GPU_FAST, RT_GPU_CACHE_DEFAULT, 0, 0},
        {"TP=1 fast (f16 cache), fp16 products, CUDA graphs", 0, RT_GPU_FAST, RT_GPU_CACHE_DEFAULT, 1, 1},
        {"TP=1 fast, bf16 cache, fp16 products", 0, RT_GPU_FAST, RT_GPU_CACHE_BF16, 0, 1},
        {"TP=2 fast (f16 cache), fp16 products", 1, RT_GPU_FAST, RT_GPU_CACHE_DEFAULT, 0, 1},
    };
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++)
        if (have[cfg[i].tp2]) batch_vs_single(&cfg[i], dirs[cfg[i].tp2]);
    static const pcfg pc[] = {
        {"prefix, TP=1 precise", 0, RT_ENG_PRECISE, RT_ENG_CACHE_DEFAULT, 0, 0},
        {"prefix, TP=1 precise, CUDA graphs", 0, RT_ENG_PRECISE, RT_ENG_CACHE_DEFAULT, 1, 0},
        {"prefix, TP=1 fast (f16 cache)", 0, RT_ENG_FAST, RT_ENG_CACHE_DEFAULT, 0, 0},
        {"prefix, TP=1 fast, bf16 cache", 0, RT_ENG_FAST, RT_ENG_CACHE_BF16, 0, 0},
        {"prefix, TP=2 precise", 1, RT_ENG_PRECISE, RT_ENG_CACHE_DEFAULT, 0, 0},
        {"prefix, TP=2 fast (f16 cache)", 1, RT_ENG_FAST, RT_ENG_CACHE_DEFAULT, 0, 0},
        {"prefix, TP=1 precise, --draft mtp", 0, RT_ENG_PRECISE, RT_ENG_CACHE_DEFAULT, 0, 1},
        {"prefix, TP=1 fast, --draft mtp", 0, RT_ENG_FAST, RT_ENG_CACHE_DEFAULT, 0, 1},
    };
    for (size_t i = 0; i < sizeof pc / sizeof pc[0]; i++)
        if (have[pc[i].tp2] && !pc[i].draft) prefix_engine(&pc[i], dirs[pc[i].tp2]);
    if (have[0]) prefix_server(&pc[0], dirs[0]);
    if (have[0]) prefix_server(&pc[2], dirs[0]);
    if (have[1]) prefix_server(&pc[4], dirs[1]);
    if (have[0]) prefix_server(&pc[6], dirs[0]);
    if (have[0]) prefix_server(&pc[7], dirs[0]);
    if (have[0]) draw_server(&pc[0], dirs[0]);
    if (have[0]) draw_server(&pc[2], dirs[0]);
    if (have[1]) draw_server(&pc[4], dirs[1]);
    if (have[0]) chunked_server(&pc[0], dirs[0]);
    if (have[0]) chunked_server(&pc[2], dirs[0]);
    if (have[1]) chunked_server(&pc[4], dirs[1]);
    t_rmtree(tmp);
    return t_report(G5_TEST_NAME);
}

/* ---- HTTP client (--client) ---- */

/* The status and the de-chunked body of one request (malloc'ed, NUL-terminated), or -1. */
static int http_body(uint16_t port, const char *method, const char *path, const char *body, char **out) {
    hresp r;
    *out = NULL;
    const int rc = http_do(port, method, path, NULL, body, &r);
    const int status = rc ? -1 : r.status;
    if (!rc) {
        *out = r.body;
        r.body = NULL;
    }
    hresp_free(&r);
    return status;
}

/* A gauge or counter (no labels) from /metrics; -1 when absent. */
static double metric(const char *text, const char *name) {
    const size_t n = strlen(name);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, name, n) && p[n] == ' ') return atof(p + n + 1);
    return -1;
}

static double get_metric(uint16_t port, const char *name) {
    char *b;
    double v = http_body(port, "GET", "/metrics", NULL, &b) == 200 ? metric(b, name) : -1;
    free(b);
    return v;
}

typedef struct ccase {
    uint32_t max_tokens;
    char *ids_json;              /* "[1,2,3]" */
    int32_t exp[4096];
    uint32_t n_exp;
    /* results */
    int status, stream, finished; /* finished: atomic */
    int32_t got[4096];
    uint32_t n_got;
    uint16_t port;
    pthread_barrier_t *bar;
} ccase;

static void collect_ids(json_t *o, ccase *c) {
    json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
    json_t *ids = json_object_get(ch, "token_ids");
    for (size_t k = 0; k < json_array_size(ids) && c->n_got < 4096; k++)
        c->got[c->n_got++] = (int32_t)json_integer_value(json_array_get(ids, k));
}

static void *client_main(void *arg) {
    ccase *c = arg;
    char body[65536];
    snprintf(body, sizeof body,
             "{\"prompt\":%s,\"max_tokens\":%u,\"temperature\":0,\"stream\":%s,\"return_token_ids\":true}",
             c->ids_json, c->max_tokens, c->stream ? "true" : "false");
    if (c->bar) pthread_barrier_wait(c->bar);
    char *resp = NULL;
    c->n_got = 0;
    c->status = http_body(c->port, "POST", "/v1/completions", body, &resp);
    if (c->status == 200 && resp) {
        if (!c->stream) {
            json_t *j = json_loads(resp, 0, NULL);
            if (j) collect_ids(j, c);
            json_decref(j);
        } else {
            for (const char *p = resp; (p = strstr(p, "data: "));) {
                p += 6;
                const char *e = strstr(p, "\n\n");
                if (!e) break;
                json_t *j = json_loadb(p, (size_t)(e - p), 0, NULL);
                if (j) collect_ids(j, c);
                json_decref(j);
                p = e + 2;
            }
        }
    }
    free(resp);
    __atomic_store_n(&c->finished, 1, __ATOMIC_RELEASE);
    return NULL;
}

static int read_cases(const char *path, ccase *cs, int max) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    static char line[1 << 16];
    int n = 0;
    while (n < max && fgets(line, sizeof line, f)) {
        char *t1 = strchr(line, '\t'), *t2 = t1 ? strchr(t1 + 1, '\t') : NULL;
        if (!t1 || !t2) continue;
        *t1 = *t2 = 0;
        ccase *c = &cs[n];
        memset(c, 0, sizeof *c);
        c->max_tokens = (uint32_t)strtoul(line, NULL, 10);
        size_t L = strlen(t1 + 1);
        c->ids_json = xmalloc(L + 3);
        snprintf(c->ids_json, L + 3, "[%s]", t1 + 1);
        for (char *p = t2 + 1, *e; c->n_exp < 4096; p = e) {
            long v = strtol(p, &e, 10);
            if (e == p) break;
            c->exp[c->n_exp++] = (int32_t)v;
        }
        n++;
    }
    fclose(f);
    return n;
}

/* All cases at once (a barrier releases them together); returns how many gave their expected ids. */
static int run_round(ccase *cs, int n, uint16_t port, const char *label, double *max_running) {
    pthread_t th[64];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)n + 1);
    for (int i = 0; i < n; i++) {
        cs[i].port = port;
        cs[i].stream = i % 2;
        cs[i].bar = &bar;
        cs[i].status = 0;
        cs[i].finished = 0;
        pthread_create(&th[i], NULL, client_main, &cs[i]);
    }
    pthread_barrier_wait(&bar);
    const double t0 = now_s();
    /* watch the batch while the clients run (the peak gauge below is the exact figure) */
    *max_running = 0;
    for (int k = 0; k < 2000; k++) {
        double r = get_metric(port, "glm5_running_sequences");
        if (r > *max_running) *max_running = r;
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
        int done = 1;
        for (int i = 0; i < n && done; i++) done = __atomic_load_n(&cs[i].finished, __ATOMIC_ACQUIRE);
        if (done) break;
    }
    int good = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        const int eq = cs[i].status == 200 && cs[i].n_got == cs[i].n_exp &&
                       !memcmp(cs[i].got, cs[i].exp, cs[i].n_exp * sizeof(int32_t));
        good += eq;
        if (!eq) {
            printf("  %s: case %d (%s, max_tokens %u): status %d, %u ids, expected %u:", label, i,
                   cs[i].stream ? "streamed" : "one response", cs[i].max_tokens, cs[i].status, cs[i].n_got, cs[i].n_exp);
            for (uint32_t k = 0; k < cs[i].n_got && k < 24; k++) printf(" %d", cs[i].got[k]);
            printf(" | expected");
            for (uint32_t k = 0; k < cs[i].n_exp && k < 24; k++) printf(" %d", cs[i].exp[k]);
            printf("\n");
        }
    }
    pthread_barrier_destroy(&bar);
    printf("%s: %d of %d concurrent greedy requests equal glm5-run's ids (%.2f s, up to %.0f running seen)\n", label,
           good, n, now_s() - t0, *max_running);
    return good;
}

static int idle_after(uint16_t port, double timeout_s) {
    const double t0 = now_s();
    while (now_s() - t0 < timeout_s) {
        if (get_metric(port, "glm5_running_sequences") == 0 && get_metric(port, "glm5_cache_blocks_in_use") == 0 &&
            get_metric(port, "glm5_queue_length") == 0)
            return 1;
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

static int run_client(uint16_t port, const char *path) {
    static ccase cs[64];
    const int n = read_cases(path, cs, 64);
    T_CHECK(n > 0, "cases from %s", path);
    if (n <= 0) return t_report(G5_TEST_NAME);
    int ready = 0;
    for (int k = 0; k < 600 && !ready; k++) { /* up to 60 s for the load */
        char *b;
        ready = http_body(port, "GET", "/health", NULL, &b) == 200;
        free(b);
        if (!ready) {
            struct timespec ts = {0, 100 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    T_CHECK(ready, "/health 200 on port %u", port);
    if (!ready) return t_report(G5_TEST_NAME);
    double seen;
    int good = run_round(cs, n, port, "round 1", &seen);
    T_CHECK(good == n, "round 1: %d of %d requests gave glm5-run's ids", good, n);
    T_CHECK(idle_after(port, 10), "after round 1: no running sequence, queued request or held cache block");
    const double peak = get_metric(port, "glm5_running_sequences_peak");
    printf("peak batch %.0f, cache blocks total %.0f\n", peak, get_metric(port, "glm5_cache_blocks_total"));
    T_CHECK(peak >= 2, "the requests ran as one batch (peak %.0f)", peak);
    good = run_round(cs, n, port, "round 2 (GPU sequences reused)", &seen);
    T_CHECK(good == n, "round 2: %d of %d requests gave glm5-run's ids", good, n);
    T_CHECK(idle_after(port, 10), "after round 2: nothing running or held");

    /* a streamed request whose client hangs up after the first event */
    const double cancelled0 = get_metric(port, "glm5_requests_cancelled_total");
    char body[65536];
    snprintf(body, sizeof body,
             "{\"prompt\":%s,\"max_tokens\":300,\"temperature\":0,\"stream\":true}", cs[0].ids_json);
    int fd = tcp_connect(port);
    int got_event = 0;
    if (fd >= 0 && http_send_req(fd, "POST", "/v1/completions", NULL, body, strlen(body)) == 0) {
        char buf[8192];
        size_t len = 0;
        while (len < sizeof buf - 1) {
            ssize_t k = recv(fd, buf + len, sizeof buf - 1 - len, 0);
            if (k <= 0) break;
            len += (size_t)k;
            buf[len] = 0;
            char *d = strstr(buf, "data: ");
            if (d && strstr(d, "\n\n")) {
                got_event = 1;
                break;
            }
        }
    }
    if (fd >= 0) close(fd);
    T_CHECK(got_event, "the streamed request's first event");
    T_CHECK(idle_after(port, 20), "after the client hung up: its sequence and blocks are freed");
    const double cancelled1 = get_metric(port, "glm5_requests_cancelled_total");
    printf("cancelled requests %.0f -> %.0f\n", cancelled0, cancelled1);
    T_CHECK(cancelled1 == cancelled0 + 1, "one request counted as cancelled (%.0f -> %.0f)", cancelled0, cancelled1);
    /* and the server still answers correctly */
    cs[0].port = port;
    cs[0].stream = 0;
    cs[0].bar = NULL;
    client_main(&cs[0]);
    T_CHECK(cs[0].status == 200 && cs[0].n_got == cs[0].n_exp &&
                !memcmp(cs[0].got, cs[0].exp, cs[0].n_exp * sizeof(int32_t)),
            "case 0 after the cancellation: status %d, %u ids", cs[0].status, cs[0].n_got);
    for (int i = 0; i < n; i++) free(cs[i].ids_json);
    return t_report(G5_TEST_NAME);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0); /* a crash must not eat the lines before it */
    if (argc == 4 && !strcmp(argv[1], "--client")) return run_client((uint16_t)atoi(argv[2]), argv[3]);
    if (argc != 1) {
        fprintf(stderr, "usage: test_gpu_serve [--client PORT CASES]\n");
        return 2;
    }
    return run_batch_tests();
}
