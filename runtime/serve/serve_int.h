/* Internals of glm5-serve shared by serve_engine.c (queue, batching, cache blocks, loading),
 * serve_api.c (request parameters and response JSON) and serve_http.c (libmicrohttpd glue,
 * metrics). Not a public interface.
 *
 * Locking: one mutex (srv_server.mu) guards the queues, the block allocator, the statistics and
 * every request's shared fields (state, outputs, cancelled). The engine thread alone touches a
 * request's engine-private fields and the model. */
#ifndef G5_SERVE_INT_H
#define G5_SERVE_INT_H

#include <pthread.h>
#include <stdint.h>

#include "runtime/cpu/cpu_ops.h"
#include "runtime/cpu/weights.h"
#include "runtime/draft.h"
#include "runtime/engine.h"
#include "runtime/serve/serve.h"
#include "runtime/text/chat.h"
#include "runtime/text/chat_parse.h"
#include "runtime/text/sample.h"
#include "runtime/text/tokenizer.h"

#define SRV_MAX_STOPS 16
#define SRV_MAX_STOP_LEN 1024
#define SRV_MAX_TOP_LOGPROBS 20
#define SRV_MAX_MESSAGES 4096

typedef enum srv_kind { SRV_KIND_COMPLETION = 0, SRV_KIND_CHAT = 1 } srv_kind;

/* A generation request, validated. */
typedef struct srv_params {
    srv_kind kind;
    int stream;
    int include_usage;        /* stream_options.include_usage */
    int return_token_ids;     /* extension: choices carry "token_ids" */
    int logprobs;             /* report the sampled token's log-probability */
    uint32_t top_logprobs;    /* and this many alternatives */
    uint32_t max_tokens;
    samp_params sp;
    char *stops[SRV_MAX_STOPS];
    size_t n_stops;
    int32_t *prompt;          /* [n_prompt] */
    uint32_t n_prompt;
    /* chat */
    int think;                /* the prompt ends inside <think>: the output starts with reasoning */
    int tools;                /* tool calls are parsed out of the output (tools given, tool_choice
                                 not "none") */
    int parallel_tool_calls;  /* 0: only the first tool call is returned */
    struct json_t *tool_defs; /* the request's tools (argument types), or NULL; owned */
    int32_t *force;           /* [n_force] tokens forced once the reasoning is over (tool_choice
                                 "required" or a named function: "<tool_call>" [+ the name]) */
    uint32_t n_force;
} srv_params;
void srv_params_clear(srv_params *p);

typedef struct srv_top {
    int32_t id;
    float logprob;
} srv_top;

typedef enum srv_rstate {
    SRV_R_NEW = 0,
    SRV_R_WAITING,
    SRV_R_RUNNING,
    SRV_R_DONE,
} srv_rstate;

typedef struct srv_req {
    int refs;                  /* under mu */
    char id[64];
    long created;              /* unix time */
    srv_params p;
    double t_arrival, t_first, t_last, t_done;
    uint64_t admit_no;         /* order of (latest) admission; preemption takes the largest */

    /* engine-private */
    rt_eng_seq *st;            /* CPU: paged caches from the engine's pool; held only while RUNNING */
    int gslot;                 /* CUDA: its GPU sequence (srv_slots) while RUNNING, else -1 */
    srv_btable gblocks;        /* CUDA: the blocks (accounting only) covering its cached tokens */
    samp_ctx *samp;
    rt_drafter *dr;            /* --draft mtp: the drafter on its sequence while RUNNING */
    tok_stream *ts;
    uint32_t n_past;           /* tokens in st's caches (an unverified draft token not counted) */
    int32_t *feed;             /* tokens to run before the next draw: the prompt, then each
                                  drawn token; after a preemption the prompt and all output */
    uint32_t n_feed, feed_off, cap_feed;
    uint32_t force_pos;        /* p.force tokens drawn so far */
    int prefix_looked_up;      /* the prompt was looked up in the prefix cache */
    int force_armed;           /* the reasoning is over: forcing may start */
    int mid_prompt;            /* a chunk of its feed ran and more are left (under mu) */

    /* shared (under mu) */
    srv_rstate state;
    int cancelled;
    uint32_t cached_tokens;    /* prompt tokens taken from the prefix cache */
    int32_t *out_ids;          /* [n_out] generated tokens (an end-of-generation token is not
                                  part of the output) */
    float *out_lp;             /* [n_out] their log-probabilities (if p.logprobs) */
    srv_top *out_top;          /* [n_out][p.top_logprobs] */
    uint32_t *out_text_end;    /* [n_out] text length after each token */
    uint32_t n_out, cap_out;
    char *text;                /* decoded output, possibly invalid UTF-8 */
    size_t text_len, text_cap;
    size_t text_safe;          /* bytes that may be shown (stop-string and UTF-8 hold-back) */
    int done;
    const char *finish;        /* "stop", "length" */
    int err_http;              /* != 0: failed; the HTTP status to report, errmsg says why */
    char errmsg[256];
    pthread_cond_t cv;         /* signalled on every change */
    /* the HTTP side's view of a streamed chat answer (under mu) */
    chat_parser *cp;
    size_t cp_fed;             /* text bytes fed to cp */
    size_t sent_r, sent_c, sent_calls; /* reasoning / content bytes and tool calls sent */
} srv_req;

/* Prometheus histogram with fixed upper bounds. */
#define SRV_HIST_MAX 16
typedef struct srv_hist {
    const double *bounds;
    uint32_t n;
    uint64_t counts[SRV_HIST_MAX]; /* per bucket (not cumulative); +Inf is count - sum */
    uint64_t count;
    double sum;
} srv_hist;
void srv_hist_observe(srv_hist *h, double v);

/* Endpoints for the request counter. */
typedef enum srv_ep {
    SRV_EP_COMPLETIONS = 0,
    SRV_EP_CHAT,
    SRV_EP_MODELS,
    SRV_EP_HEALTH,
    SRV_EP_METRICS,
    SRV_EP_TOKENIZE,
    SRV_EP_DETOKENIZE,
    SRV_EP_MODEL,             /* GET /v1/models/{id} */
    SRV_EP_OTHER,
    SRV_EP_COUNT
} srv_ep;
/* HTTP statuses counted separately; anything else goes to the last slot. 499: the client went
 * away before the response. */
#define SRV_CODE_SLOTS 11
extern const int srv_code_list[SRV_CODE_SLOTS - 1];
int srv_code_slot(int code);

struct srv_server {
    srv_config cfg;            /* strings point at the copies below */
    char *model_path, *model_name, *host, *api_key, *cors;
    struct MHD_Daemon *daemon;
    uint16_t port;
    double t_start;
    long created;              /* unix time */

    pthread_mutex_t mu;
    pthread_cond_t engine_cv;  /* new work, cancellation, stop */
    pthread_cond_t load_cv;
    pthread_t loader, engine;
    int loader_started, engine_started;
    int stopping;

    /* loaded (set once under mu, then read-only) */
    srv_load_state load;
    g5_error load_err;
    rt_wset *ws;
    rt_eng *eng;               /* the model on its device (runtime/engine.h) */
    tok_ctx *tok;
    uint32_t n_vocab;
    uint32_t max_ctx;          /* longest sequence (prompt + output) */
    chat_format chat_fmt;
    srv_blocks *blocks;        /* CPU: a view of the kv pool (srv_blocks_create_pool); CUDA: a
                                  plain allocator of max_batch x ctx_size tokens, the GPU caches
                                  reserved at load, whose blocks sequences hold as they fill */
    struct srv_slots *gpu;     /* CUDA: the GPU sequences reserved at load (NULL on the CPU) */
    float *logits;             /* [max_batch][n_vocab] engine scratch ([2 max_batch] with draft) */
    float *hidden;             /* --draft mtp: [2 max_batch][n_embd] the verification's states */
    int draft;                 /* --draft mtp (set at load) */

    srv_req **waiting;         /* FIFO; preempted requests go back to the front */
    uint32_t n_waiting, cap_waiting;
    srv_req **running;
    uint32_t n_running;
    uint64_t next_req_no, admit_counter;

    /* statistics (under mu) */
    uint32_t peak_running;
    uint64_t n_requests[SRV_EP_COUNT][SRV_CODE_SLOTS];
    uint64_t n_completions, n_cancelled, n_preemptions, n_failed;
    uint64_t prompt_tokens, generated_tokens;
    int prefix_cache;          /* CPU pool with prefix caching (set at load) */
    uint64_t prefix_query_tokens, prefix_hit_tokens;
    uint64_t draft_proposed, draft_accepted;
    uint64_t prefill_chunks, decode_steps_beside_prefill; /* srv_stats */
    uint64_t decode_steps;     /* srv_stats: engine steps that decoded */
    uint64_t device_draw_steps; /* srv_stats: decode steps drawn on the device */
    uint64_t device_draw_pending; /* the engine thread's, moved under the lock once a step */
    double decode_seconds, prefill_seconds, draw_seconds; /* srv_stats: time in decode steps, in
                                                             prompt chunks, drawing tokens */
    double draw_pending;       /* the engine thread's draw time not yet in draw_seconds (that
                                  thread alone touches it; moved under the lock once a step) */
    rt_pool *draws;            /* a decode step's draws: cfg.draw_threads workers, the engine
                                  thread worker 0 (runtime/cpu/cpu_ops.h) */
    srv_hist ttft, tpot, e2e;
    double load_seconds;
    uint64_t load_bytes;
};

/* serve_engine.c */
/* A block allocator whose counts are those of the engine's shared cache pool (opts.kv_blocks;
 * srv_blocks_reserve is not used with it). */
g5_status srv_blocks_create_pool(const rt_eng *e, srv_blocks **out, g5_error *err);
g5_status srv_engine_start(srv_server *s, g5_error *err);
void srv_engine_stop(srv_server *s);         /* after the HTTP daemon has stopped */
srv_req *srv_req_new(srv_server *s, srv_params *p); /* takes over p's contents; refs = 1 */
void srv_req_unref(srv_server *s, srv_req *r);      /* takes mu itself */
/* Queues r (the queue takes a reference). Returns 0, or the HTTP status of a refusal with a
 * message: 503 not loaded / stopping, 429 queue full, 400 too long for the cache. */
int srv_submit(srv_server *s, srv_req *r, char *msg, size_t msg_cap);
void srv_cancel(srv_server *s, srv_req *r);  /* idempotent; takes mu */
void srv_cancel_locked(srv_server *s, srv_req *r);
void srv_log(srv_server *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
double srv_now(void);

/* CUDA batch places: engine sequences with caches for max_ctx positions each, all created at load
 * (a full GPU shows then, not in the middle of a request). Engine thread only, except create
 * (loader) and free (after the engine stopped). */
typedef struct srv_slots srv_slots;
g5_status srv_slots_create(rt_eng *e, uint32_t n_slots, uint32_t max_ctx, srv_slots **out, g5_error *err);
void srv_slots_free(srv_slots *g); /* accepts NULL */
int srv_slots_take(srv_slots *g);            /* a free slot (its sequence empty), or -1 */
void srv_slots_put(srv_slots *g, int slot);  /* back to the free list */
/* The slot's sequence; NULL if slot is not in use. */
rt_eng_seq *srv_slots_seq(const srv_slots *g, int slot);
uint64_t srv_slots_bytes(const srv_slots *g); /* device memory of all slots' caches */

/* serve_api.c */
/* Parses and validates a request body. Returns 0 (p filled), or an HTTP status with msg and
 * the offending parameter's name in *param (a string literal, or NULL). */
int srv_api_parse(srv_server *s, srv_kind kind, const char *body, size_t len, srv_params *p,
                  char *msg, size_t msg_cap, const char **param);
/* An OpenAI error object as a malloc'ed JSON string. */
char *srv_api_error_json(int http_status, const char *msg, const char *param);
/* The whole non-streaming response for a finished request (under mu). */
char *srv_api_response_json(srv_server *s, const srv_req *r);
/* One SSE event ("data: ...\n\n") for outputs [from_tok, r->n_out) and text [from_text, upto),
 * with the finish reason when final. Under mu. */
char *srv_api_stream_chunk(srv_server *s, srv_req *r, uint32_t from_tok, size_t from_text,
                           size_t upto, int first, int final);
char *srv_api_stream_usage(srv_server *s, const srv_req *r);
char *srv_api_models_json(srv_server *s);
/* One model object (GET /v1/models/{id}). */
char *srv_api_model_json(srv_server *s);
/* POST /tokenize and /detokenize: 0 and *out (JSON), or an HTTP status with msg and *param. */
int srv_api_tokenize(srv_server *s, const char *body, size_t len, char **out, char *msg, size_t cap,
                     const char **param);
int srv_api_detokenize(srv_server *s, const char *body, size_t len, char **out, char *msg, size_t cap,
                       const char **param);

#endif
