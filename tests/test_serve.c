/* glm5-serve over real loopback HTTP on the oracle model (in-process servers on random free
 * ports, plus the glm5-serve binary driven by curl and a Python client when those exist):
 *  - greedy output against independent references: the oracle's 24-token greedy continuation
 *    (transformers, float64), the test's own greedy loop over rt_model, and glm5-run --ids;
 *    both endpoints, streaming and not; seeded sampling against glm5-run and a test-side loop;
 *  - 16 concurrent greedy clients get exactly the tokens they get one at a time;
 *  - a burst of malformed, out-of-range, too-long and oversized requests (from 4 threads):
 *    every one answered 4xx with an error object, then a normal request still works;
 *  - a client that disconnects mid-stream (and one that gives up on a non-streaming request):
 *    /metrics shows its cache blocks back to 0 and the request cancelled;
 *  - 429 when the queue is full, 401 without the API key, 503 while no model is loaded;
 *  - preemption when the block pool is exhausted leaves outputs unchanged;
 *  - chunked prefill: srv_prefill_chunk's GPU chunks leave the engine's calls those of one call
 *    (checked against rt_pfx_call_len for many block sizes, chunk sizes and positions); a long
 *    prompt prefilled in 16-token chunks while another request decodes gives the ids it gives
 *    alone, and the other request got a decode step between every two of its chunks;
 *  (--draft mtp: tests/test_serve_mtp.c; the helpers: tests/serve_harness.h)
 *  - a blob set (TP 2) written by the converter;
 *  - metrics deltas for a known request; one log line per request. */
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

#include "convert/convert.h"
#include "format/gguf.h"
#include "format/gguf_write.h"
#include "runtime/text/chat.h"
#include "runtime/cpu/model.h"
#include "runtime/text/sample.h"
#include "runtime/serve/serve.h"
#include "runtime/text/tokenizer.h"
#include "runtime/cpu/weights.h"
#include "runtime/prefix.h"
#include "tests/test_util.h"

#include "tests/serve_harness.h"

/* ---- unit tests ---- */

static void test_blocks(void) {
    srv_blocks *b = NULL;
    T_CHECK(srv_blocks_create(10, 4, &b, NULL) == G5_OK, "create");
    if (!b) return;
    srv_btable t1 = {0}, t2 = {0};
    T_CHECK(srv_blocks_needed(b, 0) == 0 && srv_blocks_needed(b, 1) == 1 && srv_blocks_needed(b, 4) == 1 &&
                srv_blocks_needed(b, 5) == 2, "needed");
    T_CHECK(srv_blocks_reserve(b, &t1, 9, NULL) == G5_OK && t1.n == 3, "9 tokens -> 3 blocks (%u)", t1.n);
    T_CHECK(srv_blocks_reserve(b, &t2, 28, NULL) == G5_OK && t2.n == 7, "28 tokens -> 7 blocks");
    T_CHECK(srv_blocks_n_free(b) == 0, "pool empty");
    T_CHECK(srv_blocks_reserve(b, &t1, 12, NULL) == G5_OK && t1.n == 3, "within its blocks");
    T_CHECK(srv_blocks_reserve(b, &t1, 13, NULL) == G5_ERR_BOUNDS && t1.n == 3, "exhausted: unchanged");
    int uniq = 1;
    for (uint32_t i = 0; i < t1.n; i++)
        for (uint32_t j = 0; j < t2.n; j++) uniq &= t1.ids[i] != t2.ids[j];
    T_CHECK(uniq, "no block shared");
    srv_blocks_release(b, &t2);
    T_CHECK(srv_blocks_n_free(b) == 7 && t2.n == 0 && !t2.ids, "released");
    T_CHECK(srv_blocks_reserve(b, &t1, 40, NULL) == G5_OK && t1.n == 10, "grows to the whole pool");
    T_CHECK(srv_blocks_reserve(b, &t2, 1, NULL) == G5_ERR_BOUNDS, "nothing left");
    srv_blocks_release(b, &t1);
    srv_blocks_release(b, &t1); /* twice: a no-op */
    T_CHECK(srv_blocks_n_free(b) == 10, "all back (%u)", srv_blocks_n_free(b));
    srv_blocks_free(b);
    T_CHECK(srv_blocks_create(0, 4, &b, NULL) == G5_ERR_INVALID_ARG, "0 blocks refused");
}

/* The ends of the GPU engine's calls (rt_pfx_call_len) for n tokens at p0, appended to ends. */
static uint32_t call_ends(uint32_t p0, uint32_t n, uint32_t bt, uint32_t *ends, uint32_t k) {
    for (uint32_t done = 0; done < n;) {
        done += rt_pfx_call_len(p0 + done, n - done, bt);
        ends[k++] = p0 + done;
    }
    return k;
}

/* srv_prefill_chunk: CPU chunks are min(rest, max); CUDA chunks are whole blocks (the rest at the
 * end) and the engine calls of the chunks, one rt_eng_prefill each, end where those of one
 * rt_eng_prefill of the whole rest end: the same calls, so the same bits. */
static void test_prefill_chunk(void) {
    T_CHECK(srv_prefill_chunk(100, 0, 16, 0, 256) == 16 && srv_prefill_chunk(10, 7, 16, 0, 256) == 10,
            "CPU: min(rest, chunk)");
    T_CHECK(srv_prefill_chunk(5000, 0, 256, 1, 0) == 5000, "CUDA, no prefix block: the whole rest");
    T_CHECK(srv_prefill_chunk(5000, 0, 1000, 1, 256) == 768 && srv_prefill_chunk(5000, 512, 100, 1, 256) == 256 &&
                srv_prefill_chunk(300, 256, 1000, 1, 256) == 300 && srv_prefill_chunk(5000, 10, 512, 1, 256) == 502,
            "CUDA: whole blocks (at least one), ending at a block's end");
    static const uint32_t bts[] = {1, 7, 32, 256}, maxes[] = {1, 5, 32, 100, 256, 1000, 4096};
    static uint32_t a[2048], b[2048];
    uint32_t bad = 0, cases = 0;
    for (size_t i = 0; i < sizeof bts / sizeof bts[0]; i++)
        for (size_t j = 0; j < sizeof maxes / sizeof maxes[0]; j++)
            for (uint32_t p0 = 0; p0 <= 3 * bts[i] + 5; p0 += p0 < 2 * bts[i] ? bts[i] : 5)
                for (uint32_t n = 1; n <= 900; n += 1 + n / 8) {
                    const uint32_t bt = bts[i], mx = maxes[j], per = mx / bt ? mx / bt * bt : bt;
                    uint32_t ka = call_ends(p0, n, bt, a, 0), kb = 0, ok = 1;
                    for (uint32_t done = 0; done < n && ok;) {
                        const uint32_t c = srv_prefill_chunk(n - done, p0 + done, mx, 1, bt);
                        ok = c >= 1 && c <= n - done && c <= per && (done + c == n || (p0 + done + c) % bt == 0);
                        kb = call_ends(p0 + done, c, bt, b, kb);
                        done += c;
                    }
                    ok = ok && ka == kb && !memcmp(a, b, ka * sizeof *a);
                    if (!ok && bad++ < 3) printf("  prefill chunks: block %u, chunk %u, at %u, %u tokens differ\n", bt, mx, p0, n);
                    cases++;
                }
    T_CHECK(bad == 0, "CUDA prefill chunks make the engine calls of one call: %u of %u cases differ", bad, cases);
}

static void test_utf8(void) {
    static const struct {
        const char *in;
        size_t n;
        const char *out;
    } cases[] = {
        {"abc", 3, "abc"},
        {"\xC3\xA9", 2, "\xC3\xA9"},                       /* é */
        {"\xE2\x82\xAC!", 4, "\xE2\x82\xAC!"},             /* € */
        {"\xF0\x9F\x98\x80", 4, "\xF0\x9F\x98\x80"},       /* U+1F600 */
        {"a\xFFz", 3, "a\xEF\xBF\xBDz"},                   /* invalid byte */
        {"\xE2\x82", 2, "\xEF\xBF\xBD\xEF\xBF\xBD"},       /* truncated: each byte replaced */
        {"\xC0\x80", 2, "\xEF\xBF\xBD\xEF\xBF\xBD"},       /* overlong NUL */
        {"\xED\xA0\x80", 3, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, /* surrogate */
        {"\xF4\x90\x80\x80", 4, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, /* > U+10FFFF */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = 0;
        char *o = srv_utf8_clean(cases[i].in, cases[i].n, &n);
        T_CHECK(o && n == strlen(cases[i].out) && !memcmp(o, cases[i].out, n), "utf8 case %zu", i);
        free(o);
    }
}

/* ---- malformed requests ---- */

typedef struct bad_case {
    const char *method, *path, *body;
    int want;
} bad_case;

static char *g_deep, *g_long_prompt, *g_long_total, *g_bad_utf8;

static void build_bad_bodies(void) {
    size_t n = 100000;
    g_deep = malloc(n + 1);
    memset(g_deep, '[', n);
    g_deep[n] = 0;
    /* 5000 token ids: longer than the 4096-token context */
    size_t cap = 5000 * 6 + 64;
    g_long_prompt = malloc(cap);
    size_t w = (size_t)snprintf(g_long_prompt, cap, "{\"prompt\":[");
    for (int i = 0; i < 5000; i++) w += (size_t)snprintf(g_long_prompt + w, cap - w, "%s%d", i ? "," : "", 100 + i % 500);
    snprintf(g_long_prompt + w, cap - w, "]}");
    /* 4000 prompt tokens + 200 max_tokens > 4096 */
    g_long_total = malloc(cap);
    w = (size_t)snprintf(g_long_total, cap, "{\"max_tokens\":200,\"prompt\":[");
    for (int i = 0; i < 4000; i++) w += (size_t)snprintf(g_long_total + w, cap - w, "%s%d", i ? "," : "", 100 + i % 500);
    snprintf(g_long_total + w, cap - w, "]}");
    g_bad_utf8 = strdup("{\"prompt\":\"a\xFF\xFE b\"}");
}

static const bad_case bad_cases[] = {
    {"POST", "/v1/completions", "{", 400},
    {"POST", "/v1/completions", "", 400},
    {"POST", "/v1/completions", "[]", 400},
    {"POST", "/v1/completions", "null", 400},
    {"POST", "/v1/completions", "{\"prompt\":5}", 400},
    {"POST", "/v1/completions", "{\"max_tokens\":5}", 400},
    {"POST", "/v1/completions", "{\"prompt\":\"\"}", 400},
    {"POST", "/v1/completions", "{\"prompt\":[]}", 400},
    {"POST", "/v1/completions", "{\"prompt\":[99999]}", 400},
    {"POST", "/v1/completions", "{\"prompt\":[-1]}", 400},
    {"POST", "/v1/completions", "{\"prompt\":[1.5]}", 400},
    {"POST", "/v1/completions", "{\"prompt\":[\"a\",\"b\"]}", 400},
    {"POST", "/v1/completions", "{\"prompt\":{\"a\":1}}", 400},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"temperature\":\"hot\"}", 400},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"temperature\":5}", 400},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"top_p\":1.5}", 400},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"top_k\":-5}", 400},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"min_p\":-0.1}", 400},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":0}", 400},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":-1}", 400},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":1000000000}", 400},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":3.5}", 400},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":\"10\"}", 400},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"stop\":7}", 400},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"stop\":[\"\"]}", 400},
    {"POST", "/v1/completions",
     "{\"prompt\":\"hi\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\",\"j\",\"k\",\"l\",\"m\","
     "\"n\",\"o\",\"p\",\"q\"]}", 400},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"stream\":\"yes\"}", 400},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"stream_options\":5}", 400},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"n\":2}", 400},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"logprobs\":50}", 400},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"seed\":\"x\"}", 400},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"echo\":true}", 400},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"logit_bias\":{\"5\":10}}", 400},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"model\":7}", 400},
    {"POST", "/v1/completions", "{\"prompt\":\"a\",\"prompt\":\"b\"}", 400},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\"} trailing", 400},
    {"POST", "/v1/chat/completions", "{}", 400},
    {"POST", "/v1/chat/completions", "{\"messages\":[]}", 400},
    {"POST", "/v1/chat/completions", "{\"messages\":\"hi\"}", 400},
    {"POST", "/v1/chat/completions", "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 400},
    {"POST", "/v1/chat/completions", "{\"messages\":[{\"content\":\"x\"}]}", 400},
    {"POST", "/v1/chat/completions", "{\"messages\":[5]}", 400},
    {"POST", "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400},
    {"POST", "/v1/chat/completions",
     "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":\"x\"}]}]}", 400},
    {"POST", "/v1/chat/completions",
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":3}", 400},
    {"POST", "/v1/chat/completions",
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":[]}", 400},
    {"GET", "/v1/completions", NULL, 405},
    {"POST", "/v1/models", "{}", 405},
    {"DELETE", "/health", NULL, 405},
    {"GET", "/v1/nope", NULL, 404},
    {"POST", "/", "{}", 404},
};
#define N_BAD_STATIC (sizeof bad_cases / sizeof bad_cases[0])

/* An OpenAI error object with the wanted status. Thread-safe (T_CHECK is not): the caller
 * checks the result. */
static int is_error_reply(const hresp *h, int want) {
    json_t *j = body_json(h);
    json_t *e = json_object_get(j, "error");
    json_t *m = json_object_get(e, "message");
    int ok = h->status == want && json_is_string(m) && json_string_length(m) > 0 &&
             json_is_string(json_object_get(e, "type"));
    json_decref(j);
    return ok;
}

static int check_error_reply(const hresp *h, int want, const char *what) {
    int ok = is_error_reply(h, want);
    T_CHECK(ok, "%s: status %d (want %d), body %.200s", what, h->status, want, h->body ? h->body : "(none)");
    return ok;
}

typedef struct burst_job {
    uint16_t port;
    int n_ok, n_total;
    char first_fail[256];
} burst_job;

static void *burst_main(void *arg) {
    burst_job *b = arg;
    for (size_t i = 0; i < N_BAD_STATIC + 4; i++) {
        const char *method = "POST", *path = "/v1/completions", *body;
        int want = 400;
        char what[96];
        if (i < N_BAD_STATIC) {
            method = bad_cases[i].method;
            path = bad_cases[i].path;
            body = bad_cases[i].body;
            want = bad_cases[i].want;
        } else {
            body = i == N_BAD_STATIC ? g_deep : i == N_BAD_STATIC + 1 ? g_long_prompt
                   : i == N_BAD_STATIC + 2                          ? g_long_total
                                                                    : g_bad_utf8;
        }
        snprintf(what, sizeof what, "bad case %zu (%s %s)", i, method, path);
        hresp h;
        int rc = http_do(b->port, method, path, NULL, body, &h);
        b->n_total++;
        if (rc == 0 && is_error_reply(&h, want)) b->n_ok++;
        else if (!b->first_fail[0])
            snprintf(b->first_fail, sizeof b->first_fail, "%s: status %d (want %d), body %.100s", what, h.status, want,
                     h.body ? h.body : "(none)");
        hresp_free(&h);
    }
    return NULL;
}

/* Oversized bodies: by Content-Length (answered before the body is sent) and chunked. */
static void test_oversized(uint16_t port) {
    int fd = tcp_connect(port);
    T_CHECK(fd >= 0, "connect");
    if (fd < 0) return;
    const char *head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       "Content-Length: 2097152\r\n\r\n";
    send_all(fd, head, strlen(head));
    size_t n;
    char *raw = recv_all(fd, &n);
    close(fd);
    hresp h = {0};
    T_CHECK(parse_resp(raw, n, &h) == 0, "413 response parses");
    check_error_reply(&h, 413, "Content-Length 2 MiB");
    hresp_free(&h);

    fd = tcp_connect(port);
    if (fd < 0) return;
    head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           "Connection: close\r\nTransfer-Encoding: chunked\r\n\r\n";
    send_all(fd, head, strlen(head));
    static char chunk[65536 + 32];
    int k = snprintf(chunk, sizeof chunk, "10000\r\n");
    memset(chunk + k, 'x', 65536);
    memcpy(chunk + k + 65536, "\r\n", 2);
    for (int i = 0; i < 32; i++) send_all(fd, chunk, (size_t)k + 65536 + 2);
    send_all(fd, "0\r\n\r\n", 5);
    raw = recv_all(fd, &n);
    close(fd);
    memset(&h, 0, sizeof h);
    T_CHECK(parse_resp(raw, n, &h) == 0, "chunked 413 parses");
    check_error_reply(&h, 413, "chunked 2 MiB");
    hresp_free(&h);

    /* Not HTTP at all: libmicrohttpd closes the connection without an answer (nothing to
     * answer to); the server must go on serving. A 100 KB header: libmicrohttpd's 431. */
    fd = tcp_connect(port);
    if (fd < 0) return;
    send_all(fd, "\x01\x02garbage\r\n\r\n", 13);
    raw = recv_all(fd, &n);
    close(fd);
    memset(&h, 0, sizeof h);
    parse_resp(raw, n, &h);
    T_CHECK(h.status == 0 || (h.status >= 400 && h.status < 500), "garbage request line: status %d", h.status);
    hresp_free(&h);
    char *big = malloc(120000);
    int w = snprintf(big, 120000, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: ");
    memset(big + w, 'a', 100000);
    memcpy(big + w + 100000, "\r\n\r\n", 5);
    fd = tcp_connect(port);
    if (fd >= 0) {
        send_all(fd, big, strlen(big));
        raw = recv_all(fd, &n);
        close(fd);
        memset(&h, 0, sizeof h);
        parse_resp(raw, n, &h);
        T_CHECK(h.status >= 400 && h.status < 500, "100 KB header: status %d", h.status);
        hresp_free(&h);
    }
    free(big);
}

/* Opens a streaming request and returns the socket once the first event has arrived. */
static int open_stream(uint16_t port, const char *path, const char *body, int wait_event) {
    int fd = tcp_connect(port);
    if (fd < 0) return -1;
    if (http_send_req(fd, "POST", path, NULL, body, strlen(body))) {
        close(fd);
        return -1;
    }
    if (!wait_event) return fd;
    char buf[65536];
    size_t len = 0;
    double t0 = now_s();
    while (len < sizeof buf - 1 && now_s() - t0 < 30) {
        ssize_t k = recv(fd, buf + len, sizeof buf - 1 - len, 0);
        if (k <= 0) break;
        len += (size_t)k;
        buf[len] = 0;
        char *d = strstr(buf, "data: ");
        if (d && strstr(d, "\n\n")) return fd;
    }
    close(fd);
    return -1;
}

/* ---- the main server ---- */

static void test_main_server(ref *R, const oracle *o, const char *bdir) {
    srv_config c;
    srv_config_default(&c);
    c.max_batch = 16;
    c.max_queue = 64;
    c.ctx_size = 4096;
    c.draw_threads = 4; /* the draw pool on any machine (the default follows the cores) */
    logbuf lb = {0};
    srv_server *s = start_server(T_ORACLE_GGUF, &c, &lb);
    if (!s) return;
    uint16_t port = srv_port(s);
    T_CHECK(wait_health(port, 60), "health 200 after load");
    g5_error le = {0};
    T_CHECK(srv_get_load_state(s, &le) == SRV_READY, "ready");

    /* /v1/models */
    hresp h;
    http_do(port, "GET", "/v1/models", NULL, NULL, &h);
    json_t *j = body_json(&h);
    json_t *d0 = json_array_get(json_object_get(j, "data"), 0);
    T_CHECK(h.status == 200 && json_is_string(json_object_get(d0, "id")) &&
                !strcmp(json_string_value(json_object_get(j, "object")), "list"),
            "models: %d %.200s", h.status, h.body);
    json_decref(j);
    hresp_free(&h);

    /* Oracle: prompt 1's greedy continuation (transformers, float64), both modes. */
    double m_prompt0 = metric(port, "glm5_prompt_tokens_total"), m_gen0 = metric(port, "glm5_generation_tokens_total");
    double m_ttft0 = metric(port, "glm5_time_to_first_token_seconds_count");
    double m_tpot0 = metric(port, "glm5_time_per_output_token_seconds_count");
    gen g, gs;
    char *body = completion_body(o->p1, o->n1, NULL, o->ng, 0, NULL);
    gen_request(port, "/v1/completions", body, 0, &g);
    free(body);
    T_CHECK(g.status == 200 && ids_equal(g.ids, g.n, o->greedy, o->ng), "completions: oracle greedy (%u tokens, status %d)", g.n, g.status);
    T_CHECK(g.prompt_tokens == o->n1 && g.completion_tokens == o->ng && !strcmp(g.finish, "length"),
            "usage %ld/%ld finish %s", g.prompt_tokens, g.completion_tokens, g.finish);
    T_CHECK(metric(port, "glm5_prompt_tokens_total") - m_prompt0 == o->n1, "metrics: prompt tokens +%u", o->n1);
    T_CHECK(metric(port, "glm5_generation_tokens_total") - m_gen0 == o->ng, "metrics: generated +%u", o->ng);
    T_CHECK(metric(port, "glm5_time_to_first_token_seconds_count") - m_ttft0 == 1, "metrics: one TTFT");
    T_CHECK(metric(port, "glm5_time_per_output_token_seconds_count") - m_tpot0 == o->ng - 1, "metrics: %u TPOT", o->ng - 1);
    body = completion_body(o->p1, o->n1, NULL, o->ng, 1, "\"stream_options\":{\"include_usage\":true}");
    gen_request(port, "/v1/completions", body, 1, &gs);
    free(body);
    T_CHECK(gs.status == 200 && ids_equal(gs.ids, gs.n, o->greedy, o->ng), "stream: oracle greedy (%u)", gs.n);
    T_CHECK(gs.done_marker && !strcmp(gs.finish, "length") && gs.completion_tokens == o->ng && gs.n_events >= 3,
            "stream: [DONE] %d, finish %s, usage %ld, %d events", gs.done_marker, gs.finish, gs.completion_tokens,
            gs.n_events);
    T_CHECK(!strcmp(g.text, gs.text), "stream text == text");

    /* Text prompt and chat: the test's own greedy loop and glm5-run --ids. */
    char run[4200];
    int have_run = bdir && snprintf(run, sizeof run, "%s/bin/glm5-run", bdir) > 0 && access(run, X_OK) == 0;
    static int32_t pids[4096], ref_ids[512], run_ids[512];
    const char *text = "The quick brown fox jumps over the lazy dog";
    uint32_t np = encode(R, text, pids, 4096);
    uint32_t nr = ref_greedy(R, pids, np, 12, ref_ids);
    body = completion_body(NULL, 0, text, 12, 0, NULL);
    gen_request(port, "/v1/completions", body, 0, &g);
    free(body);
    T_CHECK(g.status == 200 && np > 0 && ids_equal(g.ids, g.n, ref_ids, nr), "text prompt: rt greedy (%u vs %u)", g.n, nr);
    char *cmd = malloc(16384);
    if (have_run) {
        snprintf(cmd, 16384, "'%s' -m '%s' -p '%s' -n 12 --temp 0 --ids -q --threads 1", run, T_ORACLE_GGUF, text);
        char *out = run_capture(cmd);
        uint32_t n = parse_ids(out, run_ids, 512);
        T_CHECK(out && ids_equal(g.ids, g.n, run_ids, n), "text prompt: glm5-run --ids (%u vs %u)", g.n, n);
        free(out);
    }
    const char *sys = "You are terse.", *user = "Name three colors.";
    np = chat_ids(R, sys, user, pids, 4096);
    nr = ref_greedy(R, pids, np, 10, ref_ids);
    const char *chat_fmt = "{\"messages\":[{\"role\":\"system\",\"content\":\"%s\"},{\"role\":\"user\",\"content\":"
                           "[{\"type\":\"text\",\"text\":\"%s\"}]}],\"max_tokens\":10,\"temperature\":0,"
                           "\"return_token_ids\":true,\"stream\":%s}";
    char cb[1024];
    for (int st = 0; st < 2; st++) {
        snprintf(cb, sizeof cb, chat_fmt, sys, user, st ? "true" : "false");
        gen_request(port, "/v1/chat/completions", cb, st, &g);
        T_CHECK(g.status == 200 && np > 0 && ids_equal(g.ids, g.n, ref_ids, nr), "chat%s: rt greedy (%u vs %u)",
                st ? " stream" : "", g.n, nr);
        T_CHECK(!st || g.done_marker, "chat stream ends with [DONE]");
    }
    if (have_run) {
        snprintf(cmd, 16384, "'%s' -m '%s' --chat --system '%s' -p '%s' -n 10 --temp 0 --ids -q --threads 1", run,
                 T_ORACLE_GGUF, sys, user);
        char *out = run_capture(cmd);
        uint32_t n = parse_ids(out, run_ids, 512);
        T_CHECK(out && ids_equal(g.ids, g.n, run_ids, n), "chat: glm5-run --chat --ids (%u vs %u)", g.n, n);
        free(out);
    }

    /* Seeded sampling: the sampler module driven by the test, and glm5-run. */
    samp_params sp;
    samp_params_default(&sp);
    sp.temperature = 0.9f;
    sp.top_k = 0;
    sp.top_p = 1.0f;
    sp.min_p = 0.0f;
    sp.seed = 4242;
    np = encode(R, text, pids, 4096);
    nr = ref_sampled(R, pids, np, &sp, 12, ref_ids);
    char *sb = completion_body(NULL, 0, text, 12, 0, "\"temperature\":0.9,\"seed\":4242");
    gen g2;
    gen_request(port, "/v1/completions", sb, 0, &g);
    gen_request(port, "/v1/completions", sb, 0, &g2);
    free(sb);
    T_CHECK(g.status == 200 && ids_equal(g.ids, g.n, ref_ids, nr), "seeded: sampler loop (%u vs %u)", g.n, nr);
    T_CHECK(ids_equal(g.ids, g.n, g2.ids, g2.n), "seeded: repeatable");
    if (have_run) {
        snprintf(cmd, 16384, "'%s' -m '%s' -p '%s' -n 12 --temp 0.9 --top-k 0 --top-p 1 --min-p 0 --seed 4242 --ids -q "
                 "--threads 1", run, T_ORACLE_GGUF, text);
        char *out = run_capture(cmd);
        uint32_t n = parse_ids(out, run_ids, 512);
        T_CHECK(out && ids_equal(g.ids, g.n, run_ids, n), "seeded: glm5-run (%u vs %u)", g.n, n);
        free(out);
    }

    /* Logprobs: the chosen token's value against the test's own log-softmax of rt logits. */
    np = encode(R, text, pids, 4096);
    {
        rt_state *st = NULL;
        rt_state_create(R->m, &st, NULL);
        rt_outputs ro = {.logits = R->logits};
        rt_model_forward(R->m, st, pids, np, &ro, NULL);
        rt_state_free(st);
        double mx = -INFINITY, sum = 0;
        uint32_t am = 0;
        for (uint32_t i = 0; i < R->V; i++)
            if (R->logits[i] > mx) mx = R->logits[i], am = i;
        for (uint32_t i = 0; i < R->V; i++) sum += exp(R->logits[i] - mx);
        double want = R->logits[am] - mx - log(sum);
        body = completion_body(NULL, 0, text, 1, 0, "\"logprobs\":3");
        http_do(port, "POST", "/v1/completions", NULL, body, &h);
        free(body);
        j = body_json(&h);
        json_t *lp = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
        double got = json_number_value(json_array_get(json_object_get(lp, "token_logprobs"), 0));
        json_t *top = json_array_get(json_object_get(lp, "top_logprobs"), 0);
        double best = -INFINITY;
        const char *k;
        json_t *v;
        json_object_foreach(top, k, v) if (json_number_value(v) > best) best = json_number_value(v);
        T_CHECK(h.status == 200 && fabs(got - want) < 1e-4 && fabs(best - got) < 1e-9 && json_object_size(top) >= 1,
                "logprobs: %g vs %g (top %g)", got, want, best);
        json_decref(j);
        hresp_free(&h);
    }

    /* Stop strings: cut at the first occurrence, streaming and not. */
    body = completion_body(NULL, 0, "Hello world", 16, 0, NULL);
    gen_request(port, "/v1/completions", body, 0, &g);
    free(body);
    size_t tl = strlen(g.text);
    if (tl >= 6) {
        char stop[8];
        size_t at = tl / 2;
        while (at > 1 && ((unsigned char)g.text[at] & 0xC0) == 0x80) at--;
        snprintf(stop, sizeof stop, "%.3s", g.text + at);
        json_t *sj = json_string(stop);
        if (sj) {
            char *first = strstr(g.text, stop);
            size_t want_len = (size_t)(first - g.text);
            char extra[128];
            char *sjs = json_dumps(sj, JSON_ENCODE_ANY);
            snprintf(extra, sizeof extra, "\"stop\":[\"zzzz-never\",%s]", sjs);
            free(sjs);
            for (int st = 0; st < 2; st++) {
                body = completion_body(NULL, 0, "Hello world", 16, st, extra);
                gen_request(port, "/v1/completions", body, st, &g2);
                free(body);
                T_CHECK(g2.status == 200 && strlen(g2.text) == want_len && !strncmp(g2.text, g.text, want_len) &&
                            !strcmp(g2.finish, "stop"),
                        "stop '%s'%s: '%s' (want %zu bytes of '%s'), finish %s", stop, st ? " stream" : "", g2.text,
                        want_len, g.text, g2.finish);
            }
            json_decref(sj);
        }
    } else {
        T_CHECK(0, "greedy text too short for the stop test: '%s'", g.text);
    }

    /* 16 concurrent clients vs the same requests one at a time: greedy, seeded sampling and
     * greedy with logprobs (the last two drawn on the draw pool, four threads) */
    enum { NC = 16 };
    static client_job jobs[NC];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, NC);
    for (int i = 0; i < NC; i++) {
        uint32_t off = (uint32_t)(i * 23) % (o->n2 - 40), len = 3 + (uint32_t)(i * 5) % 23;
        char extra[96];
        if (i % 3 == 1) snprintf(extra, sizeof extra, "\"temperature\":0.9,\"seed\":%d", 1000 + i);
        else snprintf(extra, sizeof extra, "\"logprobs\":2");
        jobs[i].port = port;
        jobs[i].stream = i % 2;
        jobs[i].body = completion_body(o->p2 + off, len, NULL, 5, jobs[i].stream, i % 3 ? extra : NULL);
    }
    static gen seq[NC];
    for (int i = 0; i < NC; i++) {
        gen_request(port, "/v1/completions", jobs[i].body, jobs[i].stream, &seq[i]);
        T_CHECK(seq[i].status == 200 && (seq[i].n == 5 || !strcmp(seq[i].finish, "stop")), "one at a time %d: %d, %u tokens",
                i, seq[i].status, seq[i].n);
    }
    srv_stats st0;
    srv_get_stats(s, &st0);
    pthread_t th[NC];
    double t0 = now_s();
    for (int i = 0; i < NC; i++) {
        jobs[i].bar = &bar;
        pthread_create(&th[i], NULL, client_main, &jobs[i]);
    }
    for (int i = 0; i < NC; i++) pthread_join(th[i], NULL);
    double dt = now_s() - t0;
    int same = 0;
    for (int i = 0; i < NC; i++) {
        int eq = jobs[i].g.status == 200 && ids_equal(jobs[i].g.ids, jobs[i].g.n, seq[i].ids, seq[i].n) &&
                 !strcmp(jobs[i].g.text, seq[i].text);
        same += eq;
        T_CHECK(eq, "concurrent client %d: status %d, %u tokens", i, jobs[i].g.status, jobs[i].g.n);
        free(jobs[i].body);
    }
    pthread_barrier_destroy(&bar);
    srv_stats st1;
    srv_get_stats(s, &st1);
    printf("16 concurrent clients (greedy, seeded sampling, logprobs): %d/16 identical to one-at-a-time, %.2f s, "
           "peak batch %u\n", same, dt, st1.peak_running);
    T_CHECK(st1.peak_running >= 4, "requests were batched together (peak %u)", st1.peak_running);
    T_CHECK(st1.blocks_in_use == 0 && st1.running == 0, "blocks back to 0 (%u)", st1.blocks_in_use);

    /* A burst of malformed requests from 4 threads, then a normal one. */
    build_bad_bodies();
    burst_job bj[4] = {{.port = port}, {.port = port}, {.port = port}, {.port = port}};
    pthread_t bt[4];
    for (int i = 0; i < 4; i++) pthread_create(&bt[i], NULL, burst_main, &bj[i]);
    for (int i = 0; i < 4; i++) pthread_join(bt[i], NULL);
    int bok = 0, btot = 0;
    for (int i = 0; i < 4; i++) {
        bok += bj[i].n_ok, btot += bj[i].n_total;
        T_CHECK(!bj[i].first_fail[0], "burst thread %d: %s", i, bj[i].first_fail);
    }
    T_CHECK(bok == btot && btot == 4 * (int)(N_BAD_STATIC + 4), "burst: %d/%d", bok, btot);
    test_oversized(port);
    printf("malformed burst: %d/%d answered with the expected 4xx and an error object\n", bok, btot);
    body = completion_body(o->p1, o->n1, NULL, o->ng, 0, NULL);
    gen_request(port, "/v1/completions", body, 0, &g);
    free(body);
    T_CHECK(g.status == 200 && ids_equal(g.ids, g.n, o->greedy, o->ng), "normal request after the burst");

    /* Disconnects: mid-stream, and while waiting for a non-streaming answer. */
    double canc0 = metric(port, "glm5_requests_cancelled_total");
    double gen0 = metric(port, "glm5_generation_tokens_total");
    body = completion_body(o->p1, 20, NULL, 3000, 1, NULL);
    int fd = open_stream(port, "/v1/completions", body, 1);
    free(body);
    T_CHECK(fd >= 0, "stream opened");
    T_CHECK(metric(port, "glm5_cache_blocks_in_use") > 0, "blocks in use while streaming");
    if (fd >= 0) close(fd);
    T_CHECK(metric_wait(port, "glm5_cache_blocks_in_use", 0, 15) == 0, "blocks freed after the disconnect");
    T_CHECK(metric_wait(port, "glm5_running_sequences", 0, 5) == 0, "no running sequence");
    T_CHECK(metric_wait(port, "glm5_requests_cancelled_total", canc0 + 1, 5) == canc0 + 1, "cancelled counted");
    double gen1 = metric(port, "glm5_generation_tokens_total");
    T_CHECK(gen1 - gen0 < 1000, "generation stopped early (%g tokens)", gen1 - gen0);
    body = completion_body(o->p1, 20, NULL, 3000, 0, NULL);
    fd = open_stream(port, "/v1/completions", body, 0);
    free(body);
    T_CHECK(metric_wait(port, "glm5_running_sequences", 1, 10) == 1, "non-streaming request running");
    if (fd >= 0) close(fd);
    T_CHECK(metric_wait(port, "glm5_cache_blocks_in_use", 0, 15) == 0, "blocks freed after a non-stream disconnect");
    T_CHECK(metric_wait(port, "glm5_requests_cancelled_total", canc0 + 2, 5) == canc0 + 2, "second cancel counted");

    /* Metrics: the families are all there. */
    http_do(port, "GET", "/metrics", NULL, NULL, &h);
    static const char *const names[] = {
        "glm5_requests_total{", "glm5_prompt_tokens_total ", "glm5_generation_tokens_total ",
        "glm5_time_to_first_token_seconds_bucket{le=\"+Inf\"}", "glm5_time_per_output_token_seconds_sum ",
        "glm5_queue_length ", "glm5_running_sequences ", "glm5_cache_blocks_in_use ", "glm5_cache_blocks_total 256",
        "glm5_model_load_seconds ", "glm5_model_load_gigabytes_per_second ", "# TYPE glm5_time_to_first_token_seconds histogram"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        T_CHECK(h.status == 200 && h.body && strstr(h.body, names[i]), "metrics has %s", names[i]);
    T_CHECK(metric(port, "glm5_model_load_gigabytes_per_second") > 0, "load rate > 0");
    hresp_free(&h);

    /* One log line per request. */
    double t1 = now_s();
    srv_stats fin;
    int lines = 0;
    do {
        srv_get_stats(s, &fin);
        pthread_mutex_lock(&g_log_mu);
        lines = lb.n_request_lines;
        pthread_mutex_unlock(&g_log_mu);
        if ((uint64_t)lines == fin.requests) break;
        sleep_ms(20);
    } while (now_s() - t1 < 3);
    T_CHECK((uint64_t)lines == fin.requests && lines > 100, "log lines %d == requests %llu", lines,
            (unsigned long long)fin.requests);
    free(cmd);
    srv_free(s);
}

/* 429 when the queue is full, 401 without the key (one server: max batch 1, queue 1, API key). */
static void test_queue_and_auth(const oracle *o) {
    srv_config c;
    srv_config_default(&c);
    c.max_batch = 1;
    c.max_queue = 1;
    c.api_key = "sekret-key";
    logbuf lb = {0};
    srv_server *s = start_server(T_ORACLE_GGUF, &c, &lb);
    if (!s) return;
    uint16_t port = srv_port(s);
    T_CHECK(wait_health(port, 60), "health without a key");
    const char *paths[] = {"/v1/models", "/metrics"};
    for (int i = 0; i < 2; i++) {
        hresp h;
        http_do(port, "GET", paths[i], NULL, NULL, &h);
        check_error_reply(&h, 401, paths[i]);
        hresp_free(&h);
        http_do(port, "GET", paths[i], "Authorization: Bearer wrong\r\n", NULL, &h);
        check_error_reply(&h, 401, "wrong key");
        hresp_free(&h);
        http_do(port, "GET", paths[i], "Authorization: Bearer sekret-key\r\n", NULL, &h);
        T_CHECK(h.status == 200, "%s with the key: %d", paths[i], h.status);
        hresp_free(&h);
    }
    char *body = completion_body(o->p1, 8, NULL, 4, 0, NULL);
    hresp h;
    http_do(port, "POST", "/v1/completions", NULL, body, &h);
    check_error_reply(&h, 401, "completions without a key");
    hresp_free(&h);
    http_do(port, "POST", "/v1/chat/completions", "Authorization: Bearer sekret-ke\r\n",
            "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &h);
    check_error_reply(&h, 401, "chat with a truncated key");
    hresp_free(&h);
    free(body);

    g_auth = "Authorization: Bearer sekret-key\r\n";
    body = completion_body(o->p1, 10, NULL, 3000, 1, NULL);
    int a = open_stream(port, "/v1/completions", body, 1);
    free(body);
    T_CHECK(a >= 0, "A streaming");
    body = completion_body(o->p1, 12, NULL, 3, 1, NULL);
    int b = open_stream(port, "/v1/completions", body, 0);
    free(body);
    T_CHECK(metric_wait(port, "glm5_queue_length", 1, 10) == 1, "B queued");
    body = completion_body(o->p1, 14, NULL, 3, 0, NULL);
    http_do(port, "POST", "/v1/completions", NULL, body, &h);
    free(body);
    check_error_reply(&h, 429, "C with a full queue");
    hresp_free(&h);
    if (a >= 0) close(a);
    if (b >= 0) {
        size_t n;
        char *raw = recv_all(b, &n);
        close(b);
        memset(&h, 0, sizeof h);
        parse_resp(raw, n, &h);
        gen g;
        read_gen(&h, 1, 0, &g);
        T_CHECK(g.status == 200 && g.done_marker && g.n == 3, "B served after A left: %d, %u tokens", g.status, g.n);
        hresp_free(&h);
    }
    T_CHECK(metric_wait(port, "glm5_cache_blocks_in_use", 0, 15) == 0, "blocks back to 0");
    g_auth = NULL;
    srv_free(s);
}

/* A pool of 4 blocks of 8 tokens: three concurrent 26-token sequences must preempt. */
static void test_preemption(ref *R, const oracle *o) {
    srv_config c;
    srv_config_default(&c);
    c.max_batch = 4;
    c.ctx_size = 32;
    c.block_tokens = 8;
    logbuf lb = {0};
    srv_server *s = start_server(T_ORACLE_GGUF, &c, &lb);
    if (!s) return;
    uint16_t port = srv_port(s);
    T_CHECK(wait_health(port, 60), "health");
    enum { NP = 3 };
    client_job jobs[NP];
    int32_t want[NP][64];
    uint32_t nw[NP];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, NP);
    pthread_t th[NP];
    for (int i = 0; i < NP; i++) {
        const int32_t *p = o->p2 + 40 * i;
        nw[i] = ref_greedy(R, p, 6, 20, want[i]);
        jobs[i] = (client_job){.port = port, .stream = i == 1, .bar = &bar};
        jobs[i].body = completion_body(p, 6, NULL, 20, jobs[i].stream, NULL);
        pthread_create(&th[i], NULL, client_main, &jobs[i]);
    }
    for (int i = 0; i < NP; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < NP; i++) {
        T_CHECK(jobs[i].g.status == 200 && ids_equal(jobs[i].g.ids, jobs[i].g.n, want[i], nw[i]),
                "preemption client %d: %d, %u vs %u tokens", i, jobs[i].g.status, jobs[i].g.n, nw[i]);
        free(jobs[i].body);
    }
    pthread_barrier_destroy(&bar);
    srv_stats st;
    srv_get_stats(s, &st);
    printf("preemption: pool %u blocks, %llu preemptions, peak batch %u\n", st.blocks_total,
           (unsigned long long)st.preemptions, st.peak_running);
    T_CHECK(st.preemptions > 0, "sequences were preempted");
    T_CHECK(st.blocks_in_use == 0, "all blocks back");
    char *body = completion_body(o->p2, 20, NULL, 13, 0, NULL);
    hresp h;
    http_do(port, "POST", "/v1/completions", NULL, body, &h);
    check_error_reply(&h, 400, "prompt + max_tokens > ctx");
    hresp_free(&h);
    free(body);
    srv_free(s);
}

/* Chunked prefill beside a decoding request (CPU; tests/gpu/test_gpu_serve.c has the GPU twin):
 * prompt A (200 tokens, chunks of 16: 13) alone, then while B decodes: the same ids (the test's
 * greedy reference's too), 13 chunks each time, and B decoded between every two of A's chunks
 * (glm5_decode_steps_beside_prefill_total +12), with B's own ids unchanged. */
static void test_chunked_prefill(ref *R, const oracle *o) {
    srv_config c;
    srv_config_default(&c);
    c.max_batch = 4;
    c.ctx_size = 2048;
    c.prefill_chunk = 16;
    c.prefix_cache = 0; /* A's second run prefills all of its prompt again */
    logbuf lb = {0};
    srv_server *s = start_server(T_ORACLE_GGUF, &c, &lb);
    if (!s) return;
    const uint16_t port = srv_port(s);
    T_CHECK(wait_health(port, 60), "chunked prefill: health");
    enum { NA = 200, GA = 8, GB = 150, CHUNKS = (NA + 15) / 16 };
    static int32_t ra[GA], rb[GB];
    const uint32_t nra = ref_greedy(R, o->p2, NA, GA, ra);
    /* B: a short prompt whose greedy run reaches GB tokens (no end token: decoding all along) */
    const int32_t *pb = NULL;
    for (uint32_t off = 250; off + 8 <= o->n2 && !pb; off += 20)
        if (ref_greedy(R, o->p2 + off, 8, GB, rb) == GB) pb = o->p2 + off;
    T_CHECK(pb != NULL, "chunked prefill: a prompt B decoding %d tokens", GB);
    char *ba = completion_body(o->p2, NA, NULL, GA, 0, NULL), *bb = pb ? completion_body(pb, 8, NULL, GB, 1, NULL) : NULL;
    gen alone;
    const double ch0 = metric(port, "glm5_prefill_chunks_total"), bs0 = metric(port, "glm5_decode_steps_beside_prefill_total");
    const double ds0 = metric(port, "glm5_decode_steps_total"), dt0 = metric(port, "glm5_decode_step_seconds_total");
    const double pt0 = metric(port, "glm5_prefill_seconds_total"), wt0 = metric(port, "glm5_token_draw_seconds_total");
    gen_request(port, "/v1/completions", ba, 0, &alone);
    const double ch1 = metric(port, "glm5_prefill_chunks_total"), bs1 = metric(port, "glm5_decode_steps_beside_prefill_total");
    const double ds1 = metric(port, "glm5_decode_steps_total"), dt1 = metric(port, "glm5_decode_step_seconds_total");
    const double pt1 = metric(port, "glm5_prefill_seconds_total"), wt1 = metric(port, "glm5_token_draw_seconds_total");
    /* the first token is drawn at the prompt's end, each later one in a decode step of its own */
    T_CHECK(nra >= 2 && ds1 - ds0 == nra - 1 && dt1 > dt0 && pt1 > pt0 && wt1 > wt0 &&
                wt1 - wt0 <= (dt1 - dt0) + (pt1 - pt0),
            "step timing metrics: %.0f decode steps (want %u), %.4f s decoding, %.4f s in prompt chunks, %.4f s drawing",
            ds1 - ds0, nra - 1, dt1 - dt0, pt1 - pt0, wt1 - wt0);
    T_CHECK(alone.status == 200 && ids_equal(alone.ids, alone.n, ra, nra), "chunked prefill: A alone, rt greedy (%u vs %u)",
            alone.n, nra);
    T_CHECK(ch1 - ch0 == CHUNKS && bs1 == bs0, "chunked prefill: A alone in %.0f chunks (want %d), %.0f steps beside",
            ch1 - ch0, CHUNKS, bs1 - bs0);
    if (bb) {
        client_job jb = {.port = port, .body = bb, .stream = 1};
        const double g0 = metric(port, "glm5_generation_tokens_total");
        pthread_t th;
        pthread_create(&th, NULL, client_main, &jb);
        double t0 = now_s();
        while (metric(port, "glm5_generation_tokens_total") < g0 + 2 && now_s() - t0 < 30) sleep_ms(1);
        const double c0 = metric(port, "glm5_prefill_chunks_total"), d0 = metric(port, "glm5_decode_steps_beside_prefill_total");
        gen with;
        gen_request(port, "/v1/completions", ba, 0, &with);
        const double c1 = metric(port, "glm5_prefill_chunks_total"), d1 = metric(port, "glm5_decode_steps_beside_prefill_total");
        pthread_join(th, NULL);
        printf("chunked prefill: A (%d tokens) alone %.0f chunks; beside B %.0f chunks, %.0f of B's decode steps between "
               "them\n", NA, ch1 - ch0, c1 - c0, d1 - d0);
        T_CHECK(with.status == 200 && ids_equal(with.ids, with.n, alone.ids, alone.n),
                "chunked prefill: A beside B gives A's ids alone (%u vs %u)", with.n, alone.n);
        T_CHECK(jb.g.status == 200 && ids_equal(jb.g.ids, jb.g.n, rb, GB), "chunked prefill: B's ids (%u of %d)", jb.g.n, GB);
        T_CHECK(c1 - c0 == CHUNKS, "chunked prefill: A beside B in %.0f chunks (want %d)", c1 - c0, CHUNKS);
        T_CHECK(d1 - d0 == CHUNKS - 1, "chunked prefill: %.0f decode steps of B between A's chunks (want %d)", d1 - d0,
                CHUNKS - 1);
    }
    free(ba);
    free(bb);
    srv_free(s);
}

/* No model: /health and generation are 503 (load fails), the rest still answers. */
static void test_no_model(void) {
    srv_config c;
    srv_config_default(&c);
    logbuf lb = {0};
    srv_server *s = start_server("/nonexistent/model.gguf", &c, &lb);
    if (!s) return;
    uint16_t port = srv_port(s);
    double t0 = now_s();
    while (srv_get_load_state(s, NULL) == SRV_LOADING && now_s() - t0 < 10) sleep_ms(10);
    T_CHECK(srv_get_load_state(s, NULL) == SRV_FAILED, "load failed");
    hresp h;
    http_do(port, "GET", "/health", NULL, NULL, &h);
    check_error_reply(&h, 503, "health without a model");
    hresp_free(&h);
    http_do(port, "POST", "/v1/completions", NULL, "{\"prompt\":\"hi\"}", &h);
    check_error_reply(&h, 503, "completions without a model");
    hresp_free(&h);
    T_CHECK(metric(port, "glm5_model_loaded") == 0, "metrics: not loaded");
    srv_free(s);
}

/* A TP-2 blob set written by the converter. */
static void test_blobs(const oracle *o) {
    const char *dir = t_tmpdir();
    char out[4200];
    snprintf(out, sizeof out, "%s/tp2", dir);
    convert_options co;
    convert_options_init(&co);
    co.tp = 2;
    g5_error e = {0};
    g5_status st = convert_run(T_ORACLE_GGUF, out, &co, NULL, &e);
    T_CHECK(st == G5_OK, "convert TP 2: %s", e.msg);
    if (st == G5_OK) {
        srv_config c;
        srv_config_default(&c);
        c.model_name = "glm5-tiny-UD-Q4_K_XL"; /* the name the request bodies use */
        logbuf lb = {0};
        srv_server *s = start_server(out, &c, &lb);
        if (s) {
            uint16_t port = srv_port(s);
            T_CHECK(wait_health(port, 60), "blobs: health");
            gen g;
            char *body = completion_body(o->p1, o->n1, NULL, o->ng, 1, NULL);
            gen_request(port, "/v1/completions", body, 1, &g);
            free(body);
            T_CHECK(g.status == 200 && ids_equal(g.ids, g.n, o->greedy, o->ng), "blobs TP 2: oracle greedy (%u)", g.n);
            srv_free(s);
        }
    }
    t_rmtree(dir);
}

/* The chat template check: by markers, and end to end on a copy of the oracle GGUF that carries
 * a GLM-4.5-style template (the server then formats chats the GLM-4.5 way). */
static void test_chat_template(ref *R) {
    static const char glm5[] = "[gMASK]<sop>{% for m in messages %}{% if m.role == 'user' %}<|user|>{{ m.content }}"
                               "{% elif m.role == 'assistant' %}<|assistant|></think>{{ m.content }}{% endif %}"
                               "{% endfor %}{% if add_generation_prompt %}<|assistant|><think>{% endif %}";
    static const char glm45[] = "[gMASK]<sop>{% for m in messages %}{% if m.role == 'user' %}<|user|>\n{{ m.content }}"
                                "{% if not enable_thinking %}/nothink{% endif %}{% endif %}{% endfor %}"
                                "{% if add_generation_prompt %}<|assistant|>{% endif %}";
    static const char chatml[] = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                                 "{% endfor %}<|im_start|>assistant\n";
    T_CHECK(srv_chat_template_kind(glm5, strlen(glm5)) == SRV_TEMPLATE_GLM5, "GLM-5 template");
    T_CHECK(srv_chat_template_kind(glm45, strlen(glm45)) == SRV_TEMPLATE_GLM45, "GLM-4.5 template");
    T_CHECK(srv_chat_template_kind(chatml, strlen(chatml)) == SRV_TEMPLATE_OTHER, "ChatML template");

    const char *dir = t_tmpdir();
    char path[4200];
    snprintf(path, sizeof path, "%s/tmpl.gguf", dir);
    gguf_ctx *g = NULL;
    gguf_writer *w = gguf_writer_create();
    g5_error e = {0};
    int ok = w && gguf_open(T_ORACLE_GGUF, &g, &e) == G5_OK;
    for (int64_t i = 0; ok && i < gguf_get_n_kv(g); i++) ok = gguf_writer_copy_kv(w, g, i) == G5_OK;
    ok = ok && gguf_writer_set_str(w, "tokenizer.chat_template", glm45, strlen(glm45)) == G5_OK;
    for (int64_t i = 0; ok && i < gguf_get_n_tensors(g); i++) {
        const gguf_tensor *tn = gguf_get_tensor(g, i);
        ok = gguf_writer_add_tensor(w, tn->name, tn->type, tn->n_dims, tn->ne, tn->data, NULL) == G5_OK;
    }
    ok = ok && gguf_writer_write_file(w, path, NULL, NULL, &e) == G5_OK;
    gguf_writer_free(w);
    gguf_free(g);
    T_CHECK(ok, "GGUF with a chat template written: %s", e.msg);
    if (ok) {
        srv_config c;
        srv_config_default(&c);
        logbuf lb = {0};
        srv_server *s = start_server(path, &c, &lb);
        if (s) {
            uint16_t port = srv_port(s);
            T_CHECK(wait_health(port, 60), "template server: health");
            T_CHECK(strstr(lb.chat_line, "GLM-4.5") != NULL, "log names the template: '%s'", lb.chat_line);
            chat_message m[1] = {{.role = "user", .content = "Hello there"}};
            chat_options co;
            chat_options_default(&co);
            co.format = CHAT_FORMAT_GLM45;
            char buf[512];
            size_t n = 0;
            int32_t ids[512], want[16];
            uint32_t np = 0, nw = 0;
            if (chat_build_prompt(m, 1, &co, buf, sizeof buf - 1, &n, NULL) == G5_OK) {
                buf[n] = 0;
                np = encode(R, buf, ids, 512);
                nw = ref_greedy(R, ids, np, 6, want);
            }
            gen gg;
            gen_request(port, "/v1/chat/completions",
                        "{\"messages\":[{\"role\":\"user\",\"content\":\"Hello there\"}],\"max_tokens\":6,"
                        "\"temperature\":0,\"return_token_ids\":true}", 0, &gg);
            T_CHECK(gg.status == 200 && np > 0 && gg.prompt_tokens == np && ids_equal(gg.ids, gg.n, want, nw),
                    "GLM-4.5 chat format used: prompt %ld vs %u tokens, output %u vs %u", gg.prompt_tokens, np, gg.n, nw);
            srv_free(s);
        }
    }
    t_rmtree(dir);
}

/* The glm5-serve binary, driven by curl and the Python client when present. */
static void test_binary(ref *R, const char *bdir) {
    char bin[4200];
    snprintf(bin, sizeof bin, "%s/bin/glm5-serve", bdir);
    if (access(bin, X_OK) != 0) {
        printf("glm5-serve binary not built (%s): CLI part skipped\n", bin);
        return;
    }
    int pfd[2];
    if (pipe(pfd)) return;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pfd[1], 2);
        close(pfd[0]);
        close(pfd[1]);
        execl(bin, bin, "-m", T_ORACLE_GGUF, "--port", "0", "--api-key", "k123", "--max-batch", "4", "--threads",
              "1", (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    FILE *err = fdopen(pfd[0], "r");
    char line[4096];
    unsigned port = 0;
    while (fgets(line, sizeof line, err)) {
        char *p = strstr(line, "listening on http://127.0.0.1:");
        if (p && sscanf(p, "listening on http://127.0.0.1:%u", &port) == 1) break;
    }
    T_CHECK(port > 0, "glm5-serve logged its port");
    int n_posts = 0;
    if (port && wait_health((uint16_t)port, 60)) {
        int32_t pids[256], want[32];
        const char *text = "Once upon a time";
        uint32_t np = encode(R, text, pids, 256);
        uint32_t nw = ref_greedy(R, pids, np, 10, want);
        char cmd[8192];
        if (system("curl --version >/dev/null 2>&1") == 0) {
            for (int st = 0; st < 2; st++) {
                snprintf(cmd, sizeof cmd,
                         "curl -sS%s -H 'Authorization: Bearer k123' -H 'Content-Type: application/json' "
                         "http://127.0.0.1:%u/v1/completions -d '{\"prompt\":\"%s\",\"max_tokens\":10,"
                         "\"temperature\":0,\"return_token_ids\":true,\"stream\":%s}'",
                         st ? "N" : "", port, text, st ? "true" : "false");
                char *out = run_capture(cmd);
                n_posts++;
                hresp h = {0};
                gen g;
                memset(&g, 0, sizeof g);
                if (out) {
                    h.status = 200;
                    h.body = out;
                    h.body_len = strlen(out);
                    read_gen(&h, st, 0, &g);
                }
                T_CHECK(out && ids_equal(g.ids, g.n, want, nw), "curl%s: rt greedy (%u vs %u)", st ? " -N stream" : "",
                        g.n, nw);
                T_CHECK(!st || g.done_marker, "curl stream: [DONE]");
                free(out);
            }
            snprintf(cmd, sizeof cmd, "curl -s -o /dev/null -w '%%{http_code}' http://127.0.0.1:%u/v1/completions "
                     "-d '{\"prompt\":\"x\"}'", port);
            char *out = run_capture(cmd);
            n_posts++;
            T_CHECK(out && !strcmp(out, "401"), "curl without the key: %s", out ? out : "(failed)");
            free(out);
        } else {
            printf("curl not found: curl part skipped\n");
        }
        if (access("tests/serve_client.py", R_OK) == 0 && system("python3 --version >/dev/null 2>&1") == 0) {
            /* the official openai client from PyPI in a venv under the build dir, when it can be had */
            const char *bd = getenv("BUILD");
            snprintf(cmd, sizeof cmd, "bash scripts/pyenv.sh '%s/pyenv' 2>/dev/null", bd && *bd ? bd : "build");
            char *py = run_capture(cmd);
            if (py) py[strcspn(py, "\n")] = 0;
            int32_t nm[32];
            uint32_t n_name = encode(R, "get_weather", nm, 32);
            snprintf(cmd, sizeof cmd, "'%s' tests/serve_client.py --port %u --api-key k123 --prompt '%s' "
                     "--max-tokens 10 --tool-max-tokens %u", py && *py ? py : "python3", port, text, 1 + n_name);
            free(py);
            char *out = run_capture(cmd);
            n_posts += 9;
            json_t *j = out ? json_loads(out, 0, NULL) : NULL;
            T_CHECK(j != NULL, "python client ran: %s", out ? out : "(failed)");
            if (j) {
                /* Its texts against what the server gives the C client for the same requests. */
                g_auth = "Authorization: Bearer k123\r\n";
                gen g;
                char *body = completion_body(NULL, 0, text, 10, 0, NULL);
                gen_request((uint16_t)port, "/v1/completions", body, 0, &g);
                free(body);
                n_posts++;
                T_CHECK(ids_equal(g.ids, g.n, want, nw), "C client on the binary: rt greedy");
                const char *keys[] = {"completions", "completions_stream"};
                for (int i = 0; i < 2; i++) {
                    json_t *v = json_object_get(j, keys[i]);
                    T_CHECK(json_is_string(v) && !strcmp(json_string_value(v), g.text), "python %s (%s): '%s' vs '%s'",
                            keys[i], json_string_value(json_object_get(j, "client")),
                            json_is_string(v) ? json_string_value(v) : "?", g.text);
                }
                char cb[512];
                snprintf(cb, sizeof cb, "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"max_tokens\":10,"
                         "\"temperature\":0}", text);
                gen_request((uint16_t)port, "/v1/chat/completions", cb, 0, &g);
                n_posts++;
                for (int i = 0; i < 2; i++) {
                    json_t *v = json_object_get(j, i ? "chat_stream" : "chat");
                    T_CHECK(json_is_string(v) && !strcmp(json_string_value(v), g.text), "python chat%s: '%s' vs '%s'",
                            i ? " stream" : "", json_is_string(v) ? json_string_value(v) : "?", g.text);
                }
                for (int i = 0; i < 2; i++) {
                    json_t *v = json_object_get(j, i ? "chat_reasoning_stream" : "chat_reasoning");
                    T_CHECK(json_is_string(v) && !strcmp(json_string_value(v), g.reasoning) && g.reasoning[0],
                            "python chat reasoning%s: '%s' vs '%s'", i ? " stream" : "",
                            json_is_string(v) ? json_string_value(v) : "?", g.reasoning);
                }
                /* tools: a named tool_choice gives the call, streamed the same; the second turn runs */
                for (int i = 0; i < 2; i++) {
                    json_t *v = json_object_get(j, i ? "tool_stream" : "tool");
                    const char *nm0 = json_string_value(json_array_get(v, 0)), *ar = json_string_value(json_array_get(v, 1));
                    T_CHECK(nm0 && !strcmp(nm0, "get_weather") && ar && !strcmp(ar, "{}"), "python tool call%s: %s(%s)",
                            i ? " stream" : "", nm0 ? nm0 : "?", ar ? ar : "?");
                }
                T_CHECK(json_is_string(json_object_get(j, "turn2_finish")), "python: second turn with the tool result");
                g_auth = NULL;
                printf("python client (%s): completions, chat (reasoning), tool calls, streaming and not, agree with "
                       "the C client\n", json_string_value(json_object_get(j, "client")));
            }
            json_decref(j);
            free(out);
        } else {
            printf("python3 or tests/serve_client.py not found: Python part skipped\n");
        }
    }
    kill(pid, SIGTERM);
    int posts_logged = 0, shut = 0;
    while (fgets(line, sizeof line, err)) {
        if (strstr(line, " POST /v1/")) posts_logged++;
        if (strstr(line, "shutting down")) shut = 1;
    }
    fclose(err);
    int status = 0;
    waitpid(pid, &status, 0);
    T_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "glm5-serve exits 0 on SIGTERM (status %d)", status);
    T_CHECK(shut && posts_logged == n_posts, "binary: %d POST lines logged for %d requests", posts_logged, n_posts);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    test_blocks();
    test_prefill_chunk();
    test_utf8();
    static oracle o;
    ref R;
    if (!ref_open(&R, &o, "test_serve")) {
        ref_close(&R);
        return t_report("test_serve");
    }
    char bdir[4096];
    int have_bdir = build_dir(bdir, sizeof bdir);

    double t0 = now_s();
    test_no_model();
    test_main_server(&R, &o, have_bdir ? bdir : NULL);
    double t1 = now_s();
    test_queue_and_auth(&o);
    test_preemption(&R, &o);
    test_chunked_prefill(&R, &o);
    double t2 = now_s();
    test_blobs(&o);
    test_chat_template(&R);
    if (have_bdir) test_binary(&R, bdir);
    printf("times: main server %.1f s, queue/auth/preemption %.1f s, blobs/binary %.1f s\n", t1 - t0, t2 - t1,
           now_s() - t2);

    free(g_deep);
    free(g_long_prompt);
    free(g_long_total);
    free(g_bad_utf8);
    ref_close(&R);
    return t_report("test_serve");
}
