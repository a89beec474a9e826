/* GPU sequences and batched decoding (runtime/gpu/gpu_model.h: rt_gpu_seq, rt_gpu_forward_batch),
 * and the concurrent-client half of tests/gpu/serve_gpu.sh.
 *
 * Without arguments (make test-gpu, tests/gpu/run_device.sh): the oracle (../shared/oracle,
 * $GLM5_SHARED) converted to blobs at TP 1 and TP 2; per configuration (precise, precise with
 * the one-token reference through CUDA graphs, fast
 * with its bf16 cache, fast with an f16 cache, TP 2 on one device) 18 sequences of different prompt lengths (1 .. 250 tokens: some above the
 * indexer's top-k, so the selection differs per sequence) are prefilled, then decoded for 10
 * steps twice over: one rt_gpu_forward_batch call per step (batches of 18 rows, more than one
 * 16-row GEMV launch; some steps leave a third of the sequences out and the order changes) and
 * one rt_gpu_forward_seq call per sequence and step. Every logits row must be bit-identical. The
 * one-at-a-time sequences grow their caches on demand (the 250-token one crosses 256 positions
 * mid-decode: a resize with its copy), the batched ones were reserved up front. Also: the
 * default sequence (rt_gpu_forward) equals an explicit one, a bad batch is refused without
 * advancing anything, and the step times (batched vs one at a time) are printed.
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
#include "runtime/gpu/gpu_model.h"
#include "runtime/cpu/model.h"
#include "runtime/cpu/weights.h"
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
} bcfg;

static uint32_t argmax(const float *x, uint32_t n) {
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
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
    uint32_t rows = 0, diff_rows = 0, steps_gt16 = 0;
    double worst = 0, t_batch = 0, t_single = 0;
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
        double t0 = now_s();
        ok &= rt_gpu_forward_batch(g, bb, tok, k, lb, &e) == G5_OK;
        t_batch += now_s() - t0;
        if (!ok) break;
        t0 = now_s();
        for (uint32_t j = 0; j < k && ok; j++) {
            const rt_gpu_outputs o1 = {.logits = lr + (size_t)j * V};
            ok &= rt_gpu_forward_seq(g, rs[idx[j]], &tok[j], 1, &o1, &e) == G5_OK;
        }
        t_single += now_s() - t0;
        for (uint32_t j = 0; j < k && ok; j++) {
            const float *a = lb + (size_t)j * V, *b = lr + (size_t)j * V;
            rows++;
            if (memcmp(a, b, (size_t)V * 4)) {
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

static int run_batch_tests(void) {
    if (!t_need_device() || !t_need_oracle()) return t_report(G5_TEST_NAME);
    const char *tmp = t_tmpdir();
    char dirs[2][4200];
    int have[2] = {0, 0};
    for (int t = 0; t < 2; t++) {
        have[t] = t_oracle_blobs(tmp, (uint32_t)(t + 1), dirs[t], sizeof dirs[t]);
    }
    static const bcfg cfg[] = {
        {"TP=1 precise", 0, RT_GPU_PRECISE, RT_GPU_CACHE_DEFAULT, 0},
        {"TP=1 precise, one-token calls as CUDA graphs", 0, RT_GPU_PRECISE, RT_GPU_CACHE_DEFAULT, 1},
        {"TP=1 fast (bf16 cache)", 0, RT_GPU_FAST, RT_GPU_CACHE_DEFAULT, 0},
        {"TP=1 fast, f16 cache", 0, RT_GPU_FAST, RT_GPU_CACHE_F16, 0},
        {"TP=2 precise", 1, RT_GPU_PRECISE, RT_GPU_CACHE_DEFAULT, 0},
        {"TP=2 fast (bf16 cache)", 1, RT_GPU_FAST, RT_GPU_CACHE_DEFAULT, 0},
    };
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++)
        if (have[cfg[i].tp2]) batch_vs_single(&cfg[i], dirs[cfg[i].tp2]);
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
