/* The loopback harness of the glm5-serve tests (tests/test_serve.c, tests/test_serve_mtp.c): log
 * capture, an HTTP client (tests/http_client.h), generation requests and their parsed results
 * (streamed or not), /metrics values, independent greedy and sampled references over rt_model,
 * in-process servers on free ports, the oracle's prompts, concurrent client threads. */
#ifndef G5_TESTS_SERVE_HARNESS_H
#define G5_TESTS_SERVE_HARNESS_H

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "runtime/cpu/model.h"
#include "runtime/cpu/weights.h"
#include "runtime/serve/serve.h"
#include "runtime/text/chat.h"
#include "runtime/text/sample.h"
#include "runtime/text/tokenizer.h"
#include "tests/test_util.h"

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static inline void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- log capture ---- */

static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
typedef struct logbuf {
    int n_request_lines;
    int verbose;
    char chat_line[512];
} logbuf;
static inline void log_cb(void *user, const char *line) {
    logbuf *lb = user;
    pthread_mutex_lock(&g_log_mu);
    /* request lines: "CLIENT METHOD URL STATUS ..." (all clients here are 127.0.0.1) */
    if (!strncmp(line, "127.0.0.1 ", 10)) lb->n_request_lines++;
    if (!strncmp(line, "chat: ", 6)) snprintf(lb->chat_line, sizeof lb->chat_line, "%s", line);
    if (lb->verbose) fprintf(stderr, "  [srv] %s\n", line);
    pthread_mutex_unlock(&g_log_mu);
}

#include "tests/http_client.h"

static inline json_t *body_json(const hresp *r) { return json_loadb(r->body, r->body_len, 0, NULL); }

/* SSE events of a streamed body; *done: the last event was [DONE]. Returns an array. */
static inline json_t *sse_events(const char *body, int *done) {
    json_t *a = json_array();
    *done = 0;
    const char *p = body;
    while ((p = strstr(p, "data: "))) {
        p += 6;
        const char *e = strstr(p, "\n\n");
        if (!e) break;
        if (e - p == 6 && !strncmp(p, "[DONE]", 6)) *done = 1;
        else {
            *done = 0;
            json_t *j = json_loadb(p, (size_t)(e - p), 0, NULL);
            json_array_append_new(a, j ? j : json_null());
        }
        p = e + 2;
    }
    return a;
}

/* ---- responses ---- */

typedef struct gen {
    int status;
    int32_t ids[4096];
    uint32_t n;
    char text[65536];
    char reasoning[65536];
    char finish[16];
    long prompt_tokens, completion_tokens;
    long cached_tokens;          /* usage.prompt_tokens_details.cached_tokens (-1: none given) */
    int done_marker, n_events;
} gen;

/* Collects token ids, text and finish reason from a response (streamed or not). */
static inline int read_gen(const hresp *h, int stream, int chat, gen *g) {
    memset(g, 0, sizeof *g);
    g->status = h->status;
    g->prompt_tokens = g->completion_tokens = g->cached_tokens = -1;
    if (h->status != 200) return -1;
    json_t *objs;
    if (stream) {
        objs = sse_events(h->body, &g->done_marker);
    } else {
        objs = json_array();
        json_t *j = body_json(h);
        if (!j) {
            json_decref(objs);
            return -1;
        }
        json_array_append_new(objs, j);
    }
    g->n_events = (int)json_array_size(objs);
    size_t i;
    json_t *o;
    json_array_foreach(objs, i, o) {
        json_t *u = json_object_get(o, "usage");
        if (json_is_object(u)) {
            g->prompt_tokens = (long)json_integer_value(json_object_get(u, "prompt_tokens"));
            g->completion_tokens = (long)json_integer_value(json_object_get(u, "completion_tokens"));
            json_t *ct = json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens");
            if (json_is_integer(ct)) g->cached_tokens = (long)json_integer_value(ct);
        }
        json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
        if (!ch) continue;
        json_t *ids = json_object_get(ch, "token_ids");
        for (size_t k = 0; k < json_array_size(ids) && g->n < 4096; k++)
            g->ids[g->n++] = (int32_t)json_integer_value(json_array_get(ids, k));
        json_t *t = !chat ? json_object_get(ch, "text")
                    : stream ? json_object_get(json_object_get(ch, "delta"), "content")
                             : json_object_get(json_object_get(ch, "message"), "content");
        if (json_is_string(t) && strlen(g->text) + json_string_length(t) < sizeof g->text)
            strcat(g->text, json_string_value(t));
        json_t *rc = !chat ? NULL
                     : stream ? json_object_get(json_object_get(ch, "delta"), "reasoning_content")
                              : json_object_get(json_object_get(ch, "message"), "reasoning_content");
        if (json_is_string(rc) && strlen(g->reasoning) + json_string_length(rc) < sizeof g->reasoning)
            strcat(g->reasoning, json_string_value(rc));
        json_t *fr = json_object_get(ch, "finish_reason");
        if (json_is_string(fr)) snprintf(g->finish, sizeof g->finish, "%s", json_string_value(fr));
    }
    json_decref(objs);
    return 0;
}

static inline int gen_request(uint16_t port, const char *path, const char *body, int stream, gen *g) {
    hresp h;
    int rc = http_do(port, "POST", path, NULL, body, &h);
    if (rc == 0) rc = read_gen(&h, stream, strstr(path, "chat") != NULL, g);
    else g->status = -1;
    hresp_free(&h);
    return rc;
}

static inline char *ids_json(const int32_t *ids, uint32_t n) {
    json_t *a = json_array();
    for (uint32_t i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    char *s = json_dumps(a, JSON_COMPACT);
    json_decref(a);
    return s;
}

static inline char *completion_body(const int32_t *ids, uint32_t n, const char *text, uint32_t max_tokens, int stream,
                             const char *extra) {
    char *p = ids ? ids_json(ids, n) : NULL;
    json_t *tj = text ? json_string(text) : NULL;
    char *ts = tj ? json_dumps(tj, JSON_ENCODE_ANY) : NULL;
    json_decref(tj);
    size_t cap = (p ? strlen(p) : 0) + (ts ? strlen(ts) : 0) + (extra ? strlen(extra) : 0) + 256;
    char *b = malloc(cap);
    int own_temp = extra && strstr(extra, "\"temperature\"");
    snprintf(b, cap,
             "{\"model\":\"glm5-tiny-UD-Q4_K_XL\",\"prompt\":%s,\"max_tokens\":%u,%s\"stream\":%s,"
             "\"return_token_ids\":true%s%s}",
             p ? p : ts, max_tokens, own_temp ? "" : "\"temperature\":0,", stream ? "true" : "false",
             extra ? "," : "", extra ? extra : "");
    free(p);
    free(ts);
    return b;
}

static inline double metric(uint16_t port, const char *name) {
    hresp h;
    if (http_do(port, "GET", "/metrics", NULL, NULL, &h) || h.status != 200) {
        hresp_free(&h);
        return NAN;
    }
    double v = NAN;
    size_t n = strlen(name);
    for (const char *p = h.body; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, name, n) && p[n] == ' ') {
            v = strtod(p + n + 1, NULL);
            break;
        }
    hresp_free(&h);
    return v;
}

/* Polls until the metric equals want (or the timeout passes); returns the last value. */
static inline double metric_wait(uint16_t port, const char *name, double want, double timeout_s) {
    double t0 = now_s(), v = NAN;
    while (now_s() - t0 < timeout_s) {
        v = metric(port, name);
        if (v == want) break;
        sleep_ms(20);
    }
    return v;
}

/* ---- independent references ---- */

typedef struct ref {
    rt_wset *ws;
    rt_model *m;
    tok_ctx *tok;
    float *logits;
    uint32_t V;
} ref;

/* Greedy continuation: argmax (lowest id on ties), stopping before an end-of-generation token. */
static inline uint32_t ref_greedy(ref *R, const int32_t *prompt, uint32_t n, uint32_t max_tokens, int32_t *out) {
    rt_state *s = NULL;
    g5_error e = {0};
    if (rt_state_create(R->m, &s, &e) != G5_OK) return 0;
    rt_outputs o = {.logits = R->logits};
    uint32_t k = 0;
    g5_status st = rt_model_forward(R->m, s, prompt, n, &o, &e);
    while (st == G5_OK && k < max_tokens) {
        int32_t best = 0;
        for (uint32_t i = 1; i < R->V; i++)
            if (R->logits[i] > R->logits[best]) best = (int32_t)i;
        if (tok_is_eog(R->tok, best)) break;
        out[k++] = best;
        if (k == max_tokens) break;
        st = rt_model_forward(R->m, s, &best, 1, &o, &e);
    }
    rt_state_free(s);
    return k;
}

/* Sampled continuation with the sampler module directly (prompt accepted into its history). */
static inline uint32_t ref_sampled(ref *R, const int32_t *prompt, uint32_t n, const samp_params *sp, uint32_t max_tokens,
                            int32_t *out) {
    rt_state *s = NULL;
    samp_ctx *sc = NULL;
    g5_error e = {0};
    if (rt_state_create(R->m, &s, &e) != G5_OK || samp_create(sp, R->V, &sc, &e) != G5_OK) {
        rt_state_free(s);
        return 0;
    }
    for (uint32_t i = 0; i < n; i++) samp_accept(sc, prompt[i]);
    rt_outputs o = {.logits = R->logits};
    uint32_t k = 0;
    g5_status st = rt_model_forward(R->m, s, prompt, n, &o, &e);
    while (st == G5_OK && k < max_tokens) {
        int32_t id;
        if (samp_sample(sc, R->logits, &id, &e) != G5_OK || tok_is_eog(R->tok, id)) break;
        samp_accept(sc, id);
        out[k++] = id;
        if (k == max_tokens) break;
        st = rt_model_forward(R->m, s, &id, 1, &o, &e);
    }
    samp_free(sc);
    rt_state_free(s);
    return k;
}

static inline uint32_t encode(ref *R, const char *text, int32_t *ids, size_t cap) {
    size_t n = 0;
    if (tok_encode(R->tok, text, strlen(text), 1, ids, cap, &n, NULL) != G5_OK) return 0;
    return (uint32_t)n;
}

static inline uint32_t chat_ids(ref *R, const char *sys, const char *user, int32_t *ids, size_t cap) {
    chat_message m[2] = {{.role = "system", .content = sys}, {.role = "user", .content = user}};
    chat_options co;
    chat_options_default(&co);
    char buf[4096];
    size_t n = 0;
    if (chat_build_prompt(m, 2, &co, buf, sizeof buf - 1, &n, NULL) != G5_OK) return 0;
    buf[n] = 0;
    return encode(R, buf, ids, cap);
}

static inline int ids_equal(const int32_t *a, uint32_t na, const int32_t *b, uint32_t nb) {
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

/* Directory of this executable's build tree (BUILD/tests/test_serve -> BUILD). */
static inline int build_dir(char *out, size_t cap) {
    ssize_t n = readlink("/proc/self/exe", out, cap - 1);
    if (n <= 0) return 0;
    out[n] = 0;
    for (int k = 0; k < 2; k++) {
        char *sl = strrchr(out, '/');
        if (!sl) return 0;
        *sl = 0;
    }
    return 1;
}

/* Runs a command, returns its stdout (malloc'ed) or NULL. */
static inline char *run_capture(const char *cmd) {
    FILE *f = popen(cmd, "r");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    size_t k;
    while ((k = fread(b + n, 1, cap - n - 1, f)) > 0) {
        n += k;
        if (n + 1 >= cap) b = realloc(b, cap *= 2);
    }
    b[n] = 0;
    int rc = pclose(f);
    if (rc != 0) {
        free(b);
        return NULL;
    }
    return b;
}

static inline uint32_t parse_ids(const char *s, int32_t *ids, uint32_t cap) {
    uint32_t n = 0;
    char *e;
    while (s && *s && n < cap) {
        long v = strtol(s, &e, 10);
        if (e == s) break;
        ids[n++] = (int32_t)v;
        s = e;
    }
    return n;
}

/* ---- server helpers ---- */

static inline srv_server *start_server(const char *model, srv_config *c, logbuf *lb) {
    c->model_path = model;
    c->host = "127.0.0.1";
    c->port = 0;
    c->n_threads = 2;
    c->log = log_cb;
    c->log_user = lb;
    lb->verbose = getenv("G5_SERVE_LOG") != NULL;
    srv_server *s = NULL;
    g5_error e = {0};
    g5_status st = srv_create(c, &s, &e);
    T_CHECK(st == G5_OK, "srv_create: %s", e.msg);
    return s;
}

static inline int wait_health(uint16_t port, double timeout_s) {
    double t0 = now_s();
    while (now_s() - t0 < timeout_s) {
        hresp h;
        int rc = http_do(port, "GET", "/health", NULL, NULL, &h);
        int st = h.status;
        hresp_free(&h);
        if (rc == 0 && st == 200) return 1;
        sleep_ms(20);
    }
    return 0;
}

/* ---- oracle data ---- */

typedef struct oracle {
    int32_t p1[128], p2[512], greedy[64];
    uint32_t n1, n2, ng;
} oracle;

static inline int load_oracle(oracle *o) {
    json_t *root = json_load_file(t_shared("oracle/glm5-tiny/reference.json"), 0, NULL);
    if (!root) return 0;
    json_t *m = json_object_get(json_object_get(root, "models"), "UD-Q4_K_XL");
    json_t *pr = json_object_get(m, "prompts");
    json_t *a1 = json_object_get(json_array_get(pr, 1), "ids"), *a2 = json_object_get(json_array_get(pr, 2), "ids");
    json_t *g = json_object_get(json_object_get(m, "greedy"), "tokens");
    int gp = (int)json_integer_value(json_object_get(json_object_get(m, "greedy"), "prompt_index"));
    o->n1 = (uint32_t)json_array_size(a1);
    o->n2 = (uint32_t)json_array_size(a2);
    o->ng = (uint32_t)json_array_size(g);
    int ok = gp == 1 && o->n1 && o->n1 <= 128 && o->n2 && o->n2 <= 512 && o->ng && o->ng <= 64;
    for (uint32_t i = 0; ok && i < o->n1; i++) o->p1[i] = (int32_t)json_integer_value(json_array_get(a1, i));
    for (uint32_t i = 0; ok && i < o->n2; i++) o->p2[i] = (int32_t)json_integer_value(json_array_get(a2, i));
    for (uint32_t i = 0; ok && i < o->ng; i++) o->greedy[i] = (int32_t)json_integer_value(json_array_get(g, i));
    json_decref(root);
    return ok;
}

/* The oracle's model, tokenizer and prompts for a test program named `name`: 0 (with the
 * failed check recorded) when they are missing; ref_close frees what ref_open made. */
static inline int ref_open(ref *R, oracle *o, const char *name) {
    struct stat sb;
    memset(R, 0, sizeof *R);
    if (stat(T_ORACLE_GGUF, &sb) != 0) {
        printf("%s: oracle model not found (%s)\n", name, T_ORACLE_GGUF);
        T_CHECK(0, "oracle model present");
        return 0;
    }
    T_CHECK(load_oracle(o), "oracle reference.json");
    g5_error e = {0};
    rt_model_opts mo = {.n_threads = 1, .mla = RT_MLA_ABSORBED};
    int ok = rt_wset_open(T_ORACLE_GGUF, &R->ws, &e) == G5_OK && rt_model_create(R->ws, &mo, &R->m, &e) == G5_OK &&
             tok_create(rt_wset_meta(R->ws), &R->tok, &e) == G5_OK;
    T_CHECK(ok, "reference model: %s", e.msg);
    if (ok) {
        R->V = rt_model_hparams(R->m)->n_vocab;
        ok = (R->logits = malloc(R->V * sizeof(float))) != NULL;
    }
    return ok;
}
static inline void ref_close(ref *R) {
    free(R->logits);
    tok_free(R->tok);
    rt_model_free(R->m);
    rt_wset_free(R->ws);
    memset(R, 0, sizeof *R);
}

/* ---- concurrent clients ---- */

typedef struct client_job {
    uint16_t port;
    char *body;
    int stream;
    pthread_barrier_t *bar;
    gen g;
} client_job;

static inline void *client_main(void *arg) {
    client_job *j = arg;
    if (j->bar) pthread_barrier_wait(j->bar);
    gen_request(j->port, "/v1/completions", j->body, j->stream, &j->g);
    return NULL;
}

#endif
