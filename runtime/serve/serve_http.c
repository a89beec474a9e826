/* glm5-serve HTTP layer on libmicrohttpd (one thread per connection): routing, authentication,
 * body limits, streaming, client-gone detection, /metrics, one log line per request. */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "runtime/serve/serve_int.h"

static const double ttft_bounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
static const double tpot_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5};
static const double e2e_bounds[] = {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
#define NB(a) ((uint32_t)(sizeof a / sizeof a[0]))

static const char *const ep_names[SRV_EP_COUNT] = {"completions", "chat_completions", "models",
                                                   "health", "metrics", "tokenize", "detokenize",
                                                   "model", "other"};

/* Per-HTTP-request state. Referenced by the connection and, while streaming, by the response. */
typedef struct conn_ctx {
    srv_server *s;
    struct MHD_Connection *conn;
    atomic_int refs;
    srv_ep ep;
    char method[16];
    char url[200];
    char client[64];
    double t0;
    char *body;
    size_t body_len;
    int too_big;
    int responded;
    int status;
    int stream;
    srv_req *req;
    /* streaming */
    char *out;
    size_t out_len, out_off;
    uint32_t sent_tok;
    size_t sent_text;
    int sent_first, stream_done, gone;
    char errmsg[160];            /* an error reply's message, for the log line */
} conn_ctx;

static void conn_unref(conn_ctx *c) {
    if (atomic_fetch_sub(&c->refs, 1) != 1) return;
    if (c->req) srv_req_unref(c->s, c->req);
    free(c->body);
    free(c->out);
    free(c);
}

/* The peer closed its end (or the socket failed) while we wait to answer. */
static int client_gone(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return 0;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

static void wait_tick(srv_req *r, pthread_mutex_t *mu) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += 100 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&r->cv, mu, &ts);
}

/* ---- replies ---- */

/* --cors ORIGIN: browsers at ORIGIN ("*": any) may call the API. */
static void add_cors(srv_server *s, struct MHD_Response *resp) {
    if (!s->cfg.cors_origin) return;
    MHD_add_response_header(resp, "Access-Control-Allow-Origin", s->cfg.cors_origin);
    MHD_add_response_header(resp, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    MHD_add_response_header(resp, "Access-Control-Allow-Headers", "Authorization, Content-Type");
    MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
}

static enum MHD_Result reply(conn_ctx *c, int code, const char *ctype, char *body) {
    if (!body) {
        code = 500;
        ctype = "application/json";
        body = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}");
        if (!body) return MHD_NO;
    }
    size_t n = strlen(body);
    if (strcmp(ctype, "application/json") == 0 && n && body[n - 1] != '\n') {
        char *b = realloc(body, n + 2);
        if (b) {
            body = b;
            body[n++] = '\n';
            body[n] = 0;
        }
    }
    struct MHD_Response *resp = MHD_create_response_from_buffer(n, body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    add_cors(c->s, resp);
    if (code == 429 || code == 503) MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (code == 401) MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    enum MHD_Result ok = MHD_queue_response(c->conn, (unsigned)code, resp);
    MHD_destroy_response(resp);
    c->responded = 1;
    c->status = code;
    return ok;
}

static enum MHD_Result reply_error(conn_ctx *c, int code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static enum MHD_Result reply_error(conn_ctx *c, int code, const char *param, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(c->errmsg, sizeof c->errmsg, "%.150s", msg);
    return reply(c, code, "application/json", srv_api_error_json(code, msg, param));
}

/* ---- metrics ---- */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) return;
        if (b->p && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t nc = b->cap ? b->cap * 2 : 4096;
        while (nc < b->n + (size_t)k + 1) nc *= 2;
        char *q = realloc(b->p, nc);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = nc;
    }
}

static void sb_metric(sbuf *b, const char *name, const char *type, const char *help) {
    sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void sb_hist(sbuf *b, const char *name, const char *help, const srv_hist *h) {
    sb_metric(b, name, "histogram", help);
    uint64_t cum = 0;
    for (uint32_t i = 0; i < h->n; i++) {
        cum += h->counts[i];
        sb_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[i], (unsigned long long)cum);
    }
    sb_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name,
              (unsigned long long)h->count, name, h->sum, name, (unsigned long long)h->count);
}

static char *metrics_text(srv_server *s) {
    sbuf b = {0};
    pthread_mutex_lock(&s->mu);
    sb_metric(&b, "glm5_requests_total", "counter", "HTTP requests answered, by endpoint and status");
    for (int e = 0; e < SRV_EP_COUNT; e++)
        for (int k = 0; k < SRV_CODE_SLOTS; k++) {
            if (!s->n_requests[e][k]) continue;
            if (k < SRV_CODE_SLOTS - 1)
                sb_printf(&b, "glm5_requests_total{endpoint=\"%s\",code=\"%d\"} %llu\n", ep_names[e],
                          srv_code_list[k], (unsigned long long)s->n_requests[e][k]);
            else
                sb_printf(&b, "glm5_requests_total{endpoint=\"%s\",code=\"other\"} %llu\n", ep_names[e],
                          (unsigned long long)s->n_requests[e][k]);
        }
    sb_metric(&b, "glm5_generation_requests_total", "counter", "generation requests finished (any reason)");
    sb_printf(&b, "glm5_generation_requests_total %llu\n", (unsigned long long)s->n_completions);
    sb_metric(&b, "glm5_requests_cancelled_total", "counter", "generation requests cancelled (client gone)");
    sb_printf(&b, "glm5_requests_cancelled_total %llu\n", (unsigned long long)s->n_cancelled);
    sb_metric(&b, "glm5_requests_failed_total", "counter", "generation requests that failed");
    sb_printf(&b, "glm5_requests_failed_total %llu\n", (unsigned long long)s->n_failed);
    sb_metric(&b, "glm5_preemptions_total", "counter", "sequences preempted for cache blocks (recomputed later)");
    sb_printf(&b, "glm5_preemptions_total %llu\n", (unsigned long long)s->n_preemptions);
    sb_metric(&b, "glm5_prompt_tokens_total", "counter", "prompt tokens of accepted requests");
    sb_printf(&b, "glm5_prompt_tokens_total %llu\n", (unsigned long long)s->prompt_tokens);
    sb_metric(&b, "glm5_generation_tokens_total", "counter", "tokens drawn (end-of-generation tokens included)");
    sb_printf(&b, "glm5_generation_tokens_total %llu\n", (unsigned long long)s->generated_tokens);
    sb_metric(&b, "glm5_prefill_chunks_total", "counter", "prompt chunks run (at most one per sequence and engine step)");
    sb_printf(&b, "glm5_prefill_chunks_total %llu\n", (unsigned long long)s->prefill_chunks);
    sb_metric(&b, "glm5_decode_steps_beside_prefill_total", "counter",
              "decode steps run while a prompt was part way through its chunks");
    sb_printf(&b, "glm5_decode_steps_beside_prefill_total %llu\n", (unsigned long long)s->decode_steps_beside_prefill);
    sb_metric(&b, "glm5_decode_steps_total", "counter", "engine steps that decoded (one batched forward call each)");
    sb_printf(&b, "glm5_decode_steps_total %llu\n", (unsigned long long)s->decode_steps);
    sb_metric(&b, "glm5_device_draw_steps_total", "counter", "decode steps whose tokens were drawn on the device");
    sb_printf(&b, "glm5_device_draw_steps_total %llu\n", (unsigned long long)s->device_draw_steps);
    sb_metric(&b, "glm5_decode_step_seconds_total", "counter",
              "time in decode steps: the batched forward call (logits to the host included) and the draws");
    sb_printf(&b, "glm5_decode_step_seconds_total %.6f\n", s->decode_seconds);
    sb_metric(&b, "glm5_prefill_seconds_total", "counter", "time in prompt chunks (a prompt's first draw included)");
    sb_printf(&b, "glm5_prefill_seconds_total %.6f\n", s->prefill_seconds);
    sb_metric(&b, "glm5_token_draw_seconds_total", "counter",
              "time drawing tokens (sampling, detokenizing, stop strings, hand-off to the client), part of the two above");
    sb_printf(&b, "glm5_token_draw_seconds_total %.6f\n", s->draw_seconds);
    sb_hist(&b, "glm5_time_to_first_token_seconds", "from arrival to the first drawn token", &s->ttft);
    sb_hist(&b, "glm5_time_per_output_token_seconds", "between consecutive drawn tokens", &s->tpot);
    sb_hist(&b, "glm5_request_duration_seconds", "from arrival to the end of generation", &s->e2e);
    sb_metric(&b, "glm5_queue_length", "gauge", "requests waiting for a batch slot");
    sb_printf(&b, "glm5_queue_length %u\n", s->n_waiting);
    sb_metric(&b, "glm5_running_sequences", "gauge", "sequences in the decode batch");
    sb_printf(&b, "glm5_running_sequences %u\n", s->n_running);
    sb_metric(&b, "glm5_running_sequences_peak", "gauge", "largest decode batch since the start");
    sb_printf(&b, "glm5_running_sequences_peak %u\n", s->peak_running);
    uint32_t total = s->blocks ? srv_blocks_n_total(s->blocks) : 0;
    uint32_t used = s->blocks ? total - srv_blocks_n_free(s->blocks) : 0;
    sb_metric(&b, "glm5_cache_blocks_in_use", "gauge", "latent/indexer cache blocks held by sequences");
    sb_printf(&b, "glm5_cache_blocks_in_use %u\n", used);
    sb_metric(&b, "glm5_cache_blocks_total", "gauge",
              s->gpu ? "cache blocks of the GPU caches reserved at load (--max-batch x --ctx-size / block tokens)"
                     : "cache blocks in the pool (--ctx-size / block tokens)");
    sb_printf(&b, "glm5_cache_blocks_total %u\n", total);
    sb_metric(&b, "glm5_cache_block_tokens", "gauge", "tokens per cache block");
    sb_printf(&b, "glm5_cache_block_tokens %u\n", s->cfg.block_tokens);
    sb_metric(&b, "glm5_cache_usage_ratio", "gauge", "fraction of cache blocks in use");
    sb_printf(&b, "glm5_cache_usage_ratio %.6f\n", total ? (double)used / total : 0.0);
    sb_metric(&b, "glm5_prefix_cache_queries_total", "counter", "prompt tokens looked up in the prefix cache");
    sb_printf(&b, "glm5_prefix_cache_queries_total %llu\n", (unsigned long long)s->prefix_query_tokens);
    sb_metric(&b, "glm5_prefix_cache_hits_total", "counter", "prompt tokens whose cache blocks were reused");
    sb_printf(&b, "glm5_prefix_cache_hits_total %llu\n", (unsigned long long)s->prefix_hit_tokens);
    sb_metric(&b, "glm5_draft_tokens_total", "counter", "MTP draft tokens verified (--draft mtp)");
    sb_printf(&b, "glm5_draft_tokens_total %llu\n", (unsigned long long)s->draft_proposed);
    sb_metric(&b, "glm5_draft_accepted_tokens_total", "counter", "MTP draft tokens kept (--draft mtp)");
    sb_printf(&b, "glm5_draft_accepted_tokens_total %llu\n", (unsigned long long)s->draft_accepted);
    sb_metric(&b, "glm5_draft_acceptance_ratio", "gauge", "draft tokens kept / verified (0 before any)");
    sb_printf(&b, "glm5_draft_acceptance_ratio %.6f\n",
              s->draft_proposed ? (double)s->draft_accepted / (double)s->draft_proposed : 0.0);
    const rt_eng *ke = s->load == SRV_READY ? s->eng : NULL;
    sb_metric(&b, "glm5_prefix_cache_blocks", "gauge",
              s->gpu ? "blocks in the GPU prefix store (copies; --gpu-prefix-block tokens each)"
                     : "cached blocks no sequence holds (reusable, counted free)");
    sb_printf(&b, "glm5_prefix_cache_blocks %u\n", ke ? rt_eng_pool_n_cached(ke) : 0);
    sb_metric(&b, "glm5_prefix_cache_evictions_total", "counter", "cached blocks reused for other tokens");
    sb_printf(&b, "glm5_prefix_cache_evictions_total %llu\n", ke ? (unsigned long long)rt_eng_pool_n_evicted(ke) : 0ull);
    sb_metric(&b, "glm5_model_loaded", "gauge", "1 once the model is loaded");
    sb_printf(&b, "glm5_model_loaded %d\n", s->load == SRV_READY);
    sb_metric(&b, "glm5_model_load_seconds", "gauge", "time to open, read and set up the weights");
    sb_printf(&b, "glm5_model_load_seconds %.6f\n", s->load_seconds);
    sb_metric(&b, "glm5_model_load_bytes", "gauge", "weight bytes loaded (all ranks)");
    sb_printf(&b, "glm5_model_load_bytes %llu\n", (unsigned long long)s->load_bytes);
    sb_metric(&b, "glm5_model_load_gigabytes_per_second", "gauge", "weight bytes / load time, in 1e9 bytes/s");
    sb_printf(&b, "glm5_model_load_gigabytes_per_second %.6f\n",
              s->load_seconds > 0 ? s->load_bytes / 1e9 / s->load_seconds : 0.0);
    sb_metric(&b, "glm5_uptime_seconds", "gauge", "since the server started");
    sb_printf(&b, "glm5_uptime_seconds %.3f\n", srv_now() - s->t_start);
    pthread_mutex_unlock(&s->mu);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

/* ---- streaming ---- */

static int out_append(conn_ctx *c, char *piece) {
    if (!piece) return 0;
    size_t n = strlen(piece);
    char *q = realloc(c->out, c->out_len + n + 1);
    if (!q) {
        free(piece);
        return 0;
    }
    memcpy(q + c->out_len, piece, n + 1);
    c->out = q;
    c->out_len += n;
    free(piece);
    return 1;
}

/* Waits until the request has something new and renders it as SSE events into c->out.
 * Returns 0 if the client went away (the request is cancelled) or memory ran out. */
static int fill_stream(conn_ctx *c) {
    srv_server *s = c->s;
    srv_req *r = c->req;
    int ok = 1;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (r->done || r->n_out > c->sent_tok || r->text_safe > c->sent_text ||
            (!c->sent_first && r->p.kind == SRV_KIND_CHAT))
            break;
        wait_tick(r, &s->mu);
        if (!(r->done || r->n_out > c->sent_tok || r->text_safe > c->sent_text) && client_gone(c->conn)) {
            srv_cancel_locked(s, r);
            c->gone = 1;
            pthread_mutex_unlock(&s->mu);
            return 0;
        }
    }
    if (r->err_http) {
        ok = out_append(c, srv_api_stream_chunk(s, r, c->sent_tok, c->sent_text, c->sent_text, !c->sent_first, 0));
        char *e = srv_api_error_json(r->err_http, r->errmsg, NULL);
        if (e) {
            size_t n = strlen(e);
            char *ev = malloc(n + 9);
            if (ev) snprintf(ev, n + 9, "data: %s\n\n", e);
            free(e);
            ok = ok && out_append(c, ev);
        }
        ok = ok && out_append(c, strdup("data: [DONE]\n\n"));
        c->stream_done = 1;
    } else if (r->done && r->cancelled) {
        ok = 0;
    } else {
        size_t upto = r->done ? r->text_len : r->text_safe;
        if (upto < c->sent_text) upto = c->sent_text;
        ok = out_append(c, srv_api_stream_chunk(s, r, c->sent_tok, c->sent_text, upto, !c->sent_first, r->done));
        c->sent_tok = r->n_out;
        c->sent_text = upto;
        c->sent_first = 1;
        if (r->done) {
            if (ok && r->p.include_usage) ok = out_append(c, srv_api_stream_usage(s, r));
            ok = ok && out_append(c, strdup("data: [DONE]\n\n"));
            c->stream_done = 1;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return ok;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    conn_ctx *c = cls;
    (void)pos;
    while (c->out_off == c->out_len) {
        free(c->out);
        c->out = NULL;
        c->out_len = c->out_off = 0;
        if (c->stream_done) return MHD_CONTENT_READER_END_OF_STREAM;
        MHD_set_connection_option(c->conn, MHD_CONNECTION_OPTION_TIMEOUT, 0u); /* waiting for tokens */
        if (!fill_stream(c)) return MHD_CONTENT_READER_END_WITH_ERROR;
        MHD_set_connection_option(c->conn, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)c->s->cfg.timeout_s);
    }
    size_t n = c->out_len - c->out_off;
    if (n > max) n = max;
    memcpy(buf, c->out + c->out_off, n);
    c->out_off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    conn_ctx *c = cls;
    if (c->req && !c->stream_done) srv_cancel(c->s, c->req);
    conn_unref(c);
}

/* ---- endpoints ---- */

static enum MHD_Result generate(conn_ctx *c) {
    srv_server *s = c->s;
    if (c->too_big)
        return reply_error(c, 413, NULL, "the request body is larger than %llu bytes",
                           (unsigned long long)s->cfg.max_body);
    g5_error le = {0};
    srv_load_state ls = srv_get_load_state(s, &le);
    if (ls == SRV_LOADING) return reply_error(c, 503, NULL, "the model is loading");
    if (ls == SRV_FAILED) return reply_error(c, 503, NULL, "the model failed to load: %s", le.msg);
    srv_params p;
    char msg[768];
    const char *param = NULL;
    int rc = srv_api_parse(s, c->ep == SRV_EP_CHAT ? SRV_KIND_CHAT : SRV_KIND_COMPLETION,
                           c->body ? c->body : "", c->body_len, &p, msg, sizeof msg, &param);
    if (rc) return reply_error(c, rc, param, "%s", msg);
    srv_req *r = srv_req_new(s, &p);
    if (!r) {
        srv_params_clear(&p);
        return reply_error(c, 500, NULL, "out of memory");
    }
    r->t_arrival = c->t0;
    c->req = r;
    rc = srv_submit(s, r, msg, sizeof msg);
    if (rc) return reply_error(c, rc, rc == 400 ? "max_tokens" : NULL, "%s", msg);
    c->stream = r->p.stream;
    /* The request is in: waiting for the model is not the client idling (restored, which restarts
     * the idle timer, once there is something to send). */
    MHD_set_connection_option(c->conn, MHD_CONNECTION_OPTION_TIMEOUT, 0u);

    if (r->p.stream) {
        atomic_fetch_add(&c->refs, 1);
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024,
                                                                      stream_read, c, stream_free);
        if (!resp) {
            conn_unref(c);
            srv_cancel(s, r);
            return MHD_NO;
        }
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        MHD_add_response_header(resp, "X-Accel-Buffering", "no");
        add_cors(s, resp);
        enum MHD_Result ok = MHD_queue_response(c->conn, MHD_HTTP_OK, resp);
        MHD_destroy_response(resp);
        c->responded = 1;
        c->status = 200;
        return ok;
    }

    pthread_mutex_lock(&s->mu);
    while (!r->done) {
        wait_tick(r, &s->mu);
        if (!r->done && client_gone(c->conn)) {
            srv_cancel_locked(s, r);
            c->gone = 1;
            pthread_mutex_unlock(&s->mu);
            return MHD_NO;
        }
    }
    MHD_set_connection_option(c->conn, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)s->cfg.timeout_s);
    char *body = NULL;
    int err = r->err_http;
    if (err) snprintf(msg, sizeof msg, "%s", r->errmsg);
    else body = srv_api_response_json(s, r);
    pthread_mutex_unlock(&s->mu);
    if (err) return reply_error(c, err, NULL, "%s", msg);
    return reply(c, 200, "application/json", body);
}

/* GET /v1/models/{id}: the model object, or 404 as vLLM answers an unknown id. The id is the
 * URL's rest as libmicrohttpd gives it (percent-decoded). */
static enum MHD_Result model_info(conn_ctx *c) {
    srv_server *s = c->s;
    const char *id = !strncmp(c->url, "/v1/", 4) ? c->url + 11 : c->url + 8;
    if (strcmp(id, s->model_name) != 0)
        return reply_error(c, 404, "model", "The model `%.150s` does not exist.", id);
    pthread_mutex_lock(&s->mu);
    char *m = srv_api_model_json(s);
    pthread_mutex_unlock(&s->mu);
    return reply(c, 200, "application/json", m);
}

static enum MHD_Result tokenize(conn_ctx *c) {
    srv_server *s = c->s;
    g5_error le = {0};
    if (c->too_big) return generate(c); /* its 413 */
    if (srv_get_load_state(s, &le) != SRV_READY) return reply_error(c, 503, NULL, "the model is not loaded");
    char msg[768], *out = NULL;
    const char *param = NULL;
    int rc = c->ep == SRV_EP_TOKENIZE
                 ? srv_api_tokenize(s, c->body ? c->body : "", c->body_len, &out, msg, sizeof msg, &param)
                 : srv_api_detokenize(s, c->body ? c->body : "", c->body_len, &out, msg, sizeof msg, &param);
    if (rc) return reply_error(c, rc, param, "%s", msg);
    return reply(c, 200, "application/json", out);
}

static int auth_ok(conn_ctx *c) {
    const char *key = c->s->api_key;
    const char *h = MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return 0;
    h += 7;
    while (*h == ' ') h++;
    size_t a = strlen(h), b = strlen(key);
    unsigned diff = (unsigned)(a != b);
    for (size_t i = 0; i < b; i++) diff |= (unsigned char)key[i] ^ (unsigned char)(i < a ? h[i] : 0);
    return diff == 0;
}

static srv_ep route(const char *url) {
    if (!strcmp(url, "/v1/completions") || !strcmp(url, "/completions")) return SRV_EP_COMPLETIONS;
    if (!strcmp(url, "/v1/chat/completions") || !strcmp(url, "/chat/completions")) return SRV_EP_CHAT;
    if (!strcmp(url, "/v1/models") || !strcmp(url, "/models")) return SRV_EP_MODELS;
    if (!strcmp(url, "/health")) return SRV_EP_HEALTH;
    if (!strcmp(url, "/metrics")) return SRV_EP_METRICS;
    if (!strcmp(url, "/tokenize")) return SRV_EP_TOKENIZE;
    if (!strcmp(url, "/detokenize")) return SRV_EP_DETOKENIZE;
    if (!strncmp(url, "/v1/models/", 11) || !strncmp(url, "/models/", 8)) return SRV_EP_MODEL;
    return SRV_EP_OTHER;
}

static enum MHD_Result dispatch(conn_ctx *c, const char *method) {
    srv_server *s = c->s;
    int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    if (!strcmp(method, "OPTIONS") && s->cfg.cors_origin) /* a CORS preflight: no key needed */
        return reply(c, 204, "text/plain", strdup(""));
    if (c->ep == SRV_EP_HEALTH) {
        if (!get) return reply_error(c, 405, NULL, "use GET for %s", c->url);
        g5_error le = {0};
        srv_load_state ls = srv_get_load_state(s, &le);
        if (ls == SRV_READY) return reply(c, 200, "application/json", strdup("{\"status\":\"ok\"}"));
        return reply(c, 503, "application/json",
                     srv_api_error_json(503, ls == SRV_LOADING ? "the model is loading" : le.msg, NULL));
    }
    if (s->api_key && !auth_ok(c))
        return reply_error(c, 401, NULL, "a valid API key is required (Authorization: Bearer KEY)");
    switch (c->ep) {
    case SRV_EP_METRICS:
        if (!get) return reply_error(c, 405, NULL, "use GET for %s", c->url);
        return reply(c, 200, "text/plain; version=0.0.4; charset=utf-8", metrics_text(s));
    case SRV_EP_MODELS: {
        if (!get) return reply_error(c, 405, NULL, "use GET for %s", c->url);
        pthread_mutex_lock(&s->mu);
        char *m = srv_api_models_json(s);
        pthread_mutex_unlock(&s->mu);
        return reply(c, 200, "application/json", m);
    }
    case SRV_EP_MODEL:
        if (!get) return reply_error(c, 405, NULL, "use GET for %s", c->url);
        return model_info(c);
    case SRV_EP_TOKENIZE:
    case SRV_EP_DETOKENIZE:
        if (!post) return reply_error(c, 405, NULL, "use POST for %s", c->url);
        return tokenize(c);
    case SRV_EP_COMPLETIONS:
    case SRV_EP_CHAT:
        if (!post) return reply_error(c, 405, NULL, "use POST for %s", c->url);
        return generate(c);
    default:
        return reply_error(c, 404, NULL, "no such endpoint: %s %s", method, c->url);
    }
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version, const char *upload,
                                 size_t *upload_size, void **req_cls) {
    srv_server *s = cls;
    conn_ctx *c = *req_cls;
    (void)version;
    if (!c) {
        c = calloc(1, sizeof *c);
        if (!c) return MHD_NO;
        c->s = s;
        c->conn = conn;
        atomic_init(&c->refs, 1);
        c->t0 = srv_now();
        snprintf(c->method, sizeof c->method, "%s", method);
        snprintf(c->url, sizeof c->url, "%s", url);
        c->ep = route(url);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        if (ci && ci->client_addr) {
            const struct sockaddr *sa = ci->client_addr;
            if (sa->sa_family == AF_INET)
                inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, c->client, sizeof c->client);
            else if (sa->sa_family == AF_INET6)
                inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, c->client, sizeof c->client);
        }
        if (!c->client[0]) snprintf(c->client, sizeof c->client, "-");
        *req_cls = c;
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            char *end;
            errno = 0;
            unsigned long long n = strtoull(cl, &end, 10);
            if (errno || end == cl || n > s->cfg.max_body) {
                c->too_big = 1;
                return reply_error(c, 413, NULL, "the request body is larger than %llu bytes",
                                   (unsigned long long)s->cfg.max_body);
            }
        }
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (c->responded || c->too_big) return MHD_YES;
        if (c->body_len + n > s->cfg.max_body) {
            c->too_big = 1;
            free(c->body);
            c->body = NULL;
            c->body_len = 0;
            return MHD_YES;
        }
        char *b = realloc(c->body, c->body_len + n + 1);
        if (!b) return MHD_NO;
        memcpy(b + c->body_len, upload, n);
        c->body = b;
        c->body_len += n;
        b[c->body_len] = 0;
        return MHD_YES;
    }
    if (c->responded) return MHD_YES;
    return dispatch(c, method);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                         enum MHD_RequestTerminationCode toe) {
    srv_server *s = cls;
    conn_ctx *c = *req_cls;
    (void)conn;
    if (!c) return;
    *req_cls = NULL;
    int code = c->status ? c->status : 499;
    int aborted = toe != MHD_REQUEST_TERMINATED_COMPLETED_OK;
    char gen[256] = "";
    pthread_mutex_lock(&s->mu);
    srv_req *r = c->req;
    if (r) {
        if (!r->done) srv_cancel_locked(s, r);
        snprintf(gen, sizeof gen, " prompt=%u gen=%u ttft=%.3fs finish=%s%s id=%s", r->p.n_prompt, r->n_out,
                 r->t_first ? r->t_first - r->t_arrival : 0.0,
                 r->finish ? r->finish : r->err_http ? "error" : r->cancelled ? "cancelled" : "-",
                 r->p.stream ? " stream" : "", r->id);
    }
    s->n_requests[c->ep][srv_code_slot(code)]++;
    pthread_mutex_unlock(&s->mu);
    char errpart[200] = "";
    if (c->errmsg[0]) snprintf(errpart, sizeof errpart, " error=\"%.160s\"", c->errmsg);
    srv_log(s, "%s %s %s %d %.3fs%s%s%s", c->client, c->method, c->url, code, srv_now() - c->t0, gen, errpart,
            c->gone || (aborted && c->status) ? " (client gone)" : "");
    conn_unref(c);
}

static void mhd_logger(void *cls, const char *fmt, va_list ap) {
    srv_server *s = cls;
    char line[1024];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
    srv_log(s, "http: %s", line);
}

/* ---- lifecycle ---- */

void srv_config_default(srv_config *c) {
    memset(c, 0, sizeof *c);
    c->host = "127.0.0.1";
    c->port = 8080;
    c->max_batch = 8;
    c->max_queue = 64;
    c->ctx_size = 4096;
    c->block_tokens = 16;
    c->prefill_chunk = 256;
    c->max_body = 1u << 20;
    c->prefault = 1;
    c->warmup = 1;
    c->prefix_cache = 1;
    c->gpu_prefix_cache_mb = 2048;
    c->gpu_prefix_block = 256;
    c->gpu_graph = 1;
    /* Slow clients (half-sent requests) each hold a connection until the timeout: the limits sit
     * far above a batch's worth, so they cannot lock out /health or fresh clients. */
    c->max_connections = 512;
    c->max_per_ip = 256;
    c->timeout_s = 30;
}

static int bind_listen(const char *host, uint16_t port, uint16_t *bound, g5_error *err) {
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char ps[8];
    snprintf(ps, sizeof ps, "%u", port);
    int gr = getaddrinfo(host, ps, &hints, &res);
    if (gr != 0) {
        g5_fail(err, G5_ERR_INVALID_ARG, "--host %s: %s", host, gai_strerror(gr));
        return -1;
    }
    int fd = -1, saved = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 256) == 0) break;
        saved = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        g5_fail(err, G5_ERR_IO, "cannot listen on %s:%u: %s", host, port, strerror(saved));
        return -1;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
        *bound = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                : ((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}

static char *base_name(const char *path) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/') b--;
    size_t len = n - b;
    if (len > 5 && strncmp(path + n - 5, ".gguf", 5) == 0) len -= 5;
    return strndup(path + b, len);
}

g5_status srv_create(const srv_config *cfg, srv_server **out, g5_error *err) {
    *out = NULL;
    if (!cfg->model_path || !*cfg->model_path) return g5_fail(err, G5_ERR_INVALID_ARG, "no model path");
    if (cfg->max_batch < 1 || cfg->max_batch > 4096)
        return g5_fail(err, G5_ERR_INVALID_ARG, "--max-batch %u: must be 1..4096", cfg->max_batch);
    if (cfg->max_queue < 1 || cfg->max_queue > 1000000)
        return g5_fail(err, G5_ERR_INVALID_ARG, "--max-queue %u: must be 1..1000000", cfg->max_queue);
    if (cfg->block_tokens < 1 || cfg->block_tokens > 65536)
        return g5_fail(err, G5_ERR_INVALID_ARG, "block tokens %u: must be 1..65536", cfg->block_tokens);
    if (cfg->ctx_size < 2 || cfg->ctx_size > (1u << 30))
        return g5_fail(err, G5_ERR_INVALID_ARG, "--ctx-size %u: must be 2..2^30", cfg->ctx_size);
    if (cfg->prefill_chunk < 1) return g5_fail(err, G5_ERR_INVALID_ARG, "--prefill-chunk %u: must be >= 1", cfg->prefill_chunk);
    if (cfg->draw_threads > 256)
        return g5_fail(err, G5_ERR_INVALID_ARG, "--draw-threads %u: must be 1..256 (0: automatic)", cfg->draw_threads);
    if (cfg->gpu_prefix_block > 65536)
        return g5_fail(err, G5_ERR_INVALID_ARG, "--gpu-prefix-block %u: must be 0..65536", cfg->gpu_prefix_block);
    if (cfg->gpu_prefix_cache_mb > (1u << 24))
        return g5_fail(err, G5_ERR_INVALID_ARG, "--gpu-prefix-cache-mb %u: must be 0..16777216", cfg->gpu_prefix_cache_mb);
    if (cfg->max_body < 1024) return g5_fail(err, G5_ERR_INVALID_ARG, "max body must be >= 1024 bytes");
    if (cfg->device != SRV_DEVICE_CPU && cfg->device != SRV_DEVICE_CUDA)
        return g5_fail(err, G5_ERR_INVALID_ARG, "device %d", (int)cfg->device);
    if (cfg->device == SRV_DEVICE_CUDA && !srv_cuda_available())
        return g5_fail(err, G5_ERR_UNSUPPORTED, "--device cuda: this build has no CUDA backend; use "
                       "build/gpu/bin/glm5-serve (make gpu-model)");

    srv_server *s = calloc(1, sizeof *s);
    if (!s) return g5_fail(err, G5_ERR_NOMEM, "server");
    s->cfg = *cfg;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->engine_cv, &ca);
    pthread_cond_init(&s->load_cv, &ca);
    pthread_condattr_destroy(&ca);
    s->model_path = strdup(cfg->model_path);
    s->model_name = cfg->model_name && *cfg->model_name ? strdup(cfg->model_name) : base_name(cfg->model_path);
    s->host = strdup(cfg->host && *cfg->host ? cfg->host : "127.0.0.1");
    s->api_key = cfg->api_key && *cfg->api_key ? strdup(cfg->api_key) : NULL;
    s->cors = cfg->cors_origin && *cfg->cors_origin ? strdup(cfg->cors_origin) : NULL;
    s->cfg.cors_origin = s->cors;
    if (!s->model_path || !s->model_name || !s->host || (cfg->api_key && *cfg->api_key && !s->api_key) ||
        (cfg->cors_origin && *cfg->cors_origin && !s->cors)) {
        srv_free(s);
        return g5_fail(err, G5_ERR_NOMEM, "server");
    }
    s->cfg.model_path = s->model_path;
    s->cfg.model_name = s->model_name;
    s->cfg.host = s->host;
    s->cfg.api_key = s->api_key;
    if (s->cfg.max_connections < s->cfg.max_batch + s->cfg.max_queue + 32)
        s->cfg.max_connections = s->cfg.max_batch + s->cfg.max_queue + 32;
    if (!s->cfg.max_per_ip || s->cfg.max_per_ip > s->cfg.max_connections) s->cfg.max_per_ip = s->cfg.max_connections;
    s->t_start = srv_now();
    s->created = (long)time(NULL);
    s->ttft = (srv_hist){.bounds = ttft_bounds, .n = NB(ttft_bounds)};
    s->tpot = (srv_hist){.bounds = tpot_bounds, .n = NB(tpot_bounds)};
    s->e2e = (srv_hist){.bounds = e2e_bounds, .n = NB(e2e_bounds)};
    int fd = bind_listen(s->host, cfg->port, &s->port, err);
    if (fd < 0) {
        srv_free(s);
        return err ? err->status : G5_ERR_IO;
    }
    s->daemon = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG,
        0, NULL, NULL, on_access, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_logger, s,
        MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->cfg.max_connections,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)s->cfg.max_per_ip,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->cfg.timeout_s, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_END);
    if (!s->daemon) {
        close(fd);
        srv_free(s);
        return g5_fail(err, G5_ERR_INTERNAL, "cannot start the HTTP daemon on %s:%u", cfg->host, s->port);
    }
    g5_status st = srv_engine_start(s, err);
    if (st != G5_OK) {
        srv_free(s);
        return st;
    }
    *out = s;
    return G5_OK;
}

uint16_t srv_port(const srv_server *s) { return s->port; }

void srv_free(srv_server *s) {
    if (!s) return;
    srv_engine_stop(s);
    if (s->daemon) MHD_stop_daemon(s->daemon);
    s->daemon = NULL;
    if (s->eng) {
        rt_eng_host_free(s->eng, s->logits);
        rt_eng_host_free(s->eng, s->hidden);
    }
    srv_blocks_free(s->blocks);
    srv_slots_free(s->gpu); /* sequences before their engine */
    tok_free(s->tok);
    rt_eng_free(s->eng);
    rt_wset_free(s->ws);
    free(s->waiting);
    free(s->running);
    free(s->model_path);
    free(s->model_name);
    free(s->host);
    free(s->api_key);
    free(s->cors);
    pthread_cond_destroy(&s->engine_cv);
    pthread_cond_destroy(&s->load_cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
