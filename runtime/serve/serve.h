/* glm5-serve: an OpenAI-compatible HTTP server over the runtime.
 *
 * Endpoints: POST /v1/completions, POST /v1/chat/completions (streaming as server-sent events
 * ending in `data: [DONE]`, or one JSON response), GET /v1/models, GET /v1/models/{id} (404 for
 * another id), POST /tokenize ({"prompt"|"content": TEXT} or {"messages": [...],
 * "add_generation_prompt"}, optional "return_token_strs"/"with_pieces" -> {"tokens", "count",
 * "max_model_len"[, "token_strs"/"pieces"]}), POST /detokenize ({"tokens": [...]} -> {"prompt",
 * "content"}), GET /health (503 until the model is loaded, then 200), GET /metrics (Prometheus
 * text format). With cors_origin set, OPTIONS preflights are answered without a key.
 *
 * Threads: libmicrohttpd runs one thread per connection; a loader thread opens the weights after
 * the socket is listening; one engine thread owns the model and runs decode steps over every
 * active sequence (continuous batching: requests join and leave between steps; every decoding
 * sequence advances in one rt_model_forward_batch call, so the weights are read once per step).
 * Each sequence has its own rt_state whose latent/indexer cache lives in fixed-size token blocks
 * of one shared rt_kvpool, sized to ctx_size tokens for all sequences together; srv_blocks is a
 * view of that pool, so the metrics count the blocks that really hold caches. Prompts run in
 * chunks (prefill_chunk): each engine iteration runs the decode step of every decoding sequence,
 * then one chunk of each sequence with prompt left, so a long prompt delays the others' tokens
 * by one chunk per step, not by its whole prefill (/metrics: glm5_prefill_chunks_total, and
 * glm5_decode_steps_beside_prefill_total, the decode steps run while a prompt was part way
 * through; where the engine's time goes: glm5_decode_steps_total, glm5_decode_step_seconds_total,
 * glm5_prefill_seconds_total and glm5_token_draw_seconds_total, the host's share;
 * glm5_device_draw_steps_total, the steps whose tokens were drawn on the GPU). A sequence that needs a block when none is free preempts the most recently admitted
 * one, which is recomputed later from its prompt and the tokens it already produced (results
 * are unchanged: the model gives bit-identical results whether tokens are fed together or one
 * at a time, and the sampler keeps its state).
 *
 * MTP speculative decoding (draft_mtp, --draft mtp): each request has a drafter (runtime/draft.h)
 * on its sequence; its prompt chunks keep their final-normed hidden states for the NextN block.
 * A decode step then (1) lets every sequence whose newest token is its pending draft (accepted)
 * draw from the logits its verification already produced, (2) runs each sequence's MTP block
 * over its new (hidden state, token) pairs and draws a draft with the request's own sampler
 * (greedy: its argmax), (3) verifies all [token, draft] rows in one batched call
 * (rt_eng_decode_rows: one weight pass on the CPU) and (4) draws each next token from its first
 * row with samp_sample_spec: greedy keeps the argmax (outputs identical to plain decoding),
 * sampled requests keep the draft with probability min(1, p/q), else draw from max(0, p - q)
 * (the model's distribution). A rejected draft's position is truncated before the next
 * verification; the second row's logits wait for the step that accepts it. No draft is made
 * when the context is full or the next token is the request's last. /metrics counts drafts
 * verified and accepted. With the prefix cache (CPU): the shared pool's blocks also keep the
 * final-normed hidden state of each position (engine.h kv_prefix_hidden), and a request that
 * attaches a cached prefix has its drafter rebuild the NextN block's cache of those positions
 * from them (rt_drafter_resume: one NextN layer over the prefix, not the whole model), so its MTP
 * calls, drafts and tokens are those of a run without the cache, bit for bit; an unverified
 * draft's position is dropped before a finished or preempted request's blocks are published. On
 * CUDA the engine records the hidden states of its prefill calls and the store's blocks keep
 * them (host memory, n_embd floats per position), the same rebuild following. After a preemption a sampled request's tokens may differ
 * from an unpreempted run (the same distribution: the drafter restarts, so the random stream is
 * used differently); greedy ones never do.
 *
 * A client that goes away (its socket reads EOF/hangs up while it waits, or a write fails) has
 * its request cancelled; the engine drops the sequence and frees its blocks before its next step.
 *
 * API notes (where OpenAI leaves room):
 *  - prompt: a string (special-token texts such as "[gMASK]" become those tokens, as in
 *    glm5-run), an array of token ids, or a one-element array of either; no BOS is added.
 *    messages: roles system/developer/user/assistant/tool, content a string or text parts;
 *    an assistant message may carry reasoning_content (or reasoning) and tool_calls (arguments
 *    a JSON object or a string holding one), rendered as GLM-5's template does (chat.h).
 *    chat_template_kwargs.enable_thinking (default true) as in vLLM.
 *  - "model": absent, or this server's id; another id gets 404 (as vLLM answers).
 *  - Chat output (GLM-5 / chat_parse.h): the text before "</think>" (thinking on) is returned
 *    as message.reasoning_content, the rest as content; with tools (and tool_choice not
 *    "none") each "<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>"
 *    becomes a tool_calls entry (id "call_<request>_<i>", arguments a JSON object text: a value
 *    the tool declares "string" stays text, others are parsed as JSON when they parse) and
 *    finish_reason "stop" becomes "tool_calls"; content is null when only whitespace is left
 *    beside calls. parallel_tool_calls false keeps the first call. Streaming sends the growth
 *    of reasoning_content and content, and each tool call whole (one delta with id, name and
 *    arguments) once its "</tool_call>" is generated (or at the end, for one cut off).
 *  - tools: [{"type": "function", "function": {...}}], rendered into the prompt (GLM-5 format
 *    only; a GLM-4.5 template gets 400). tool_choice: "auto" (default with tools), "none" (the
 *    tools are left out of the prompt and nothing is parsed), "required" or
 *    {"type": "function", "function": {"name": N}}: once the reasoning is over (at once with
 *    thinking off, else after the model's "</think>") the next tokens are forced to
 *    "<tool_call>" (and N; "required" with one tool: that tool's name), so the answer is a call; a model that never closes its
 *    reasoning within max_tokens makes no call.
 *  - Refused with 400 naming the field: response_format other than {"type": "text"} and
 *    guided_json/guided_regex/guided_choice/guided_grammar/structured_outputs (no constrained
 *    decoding), n or best_of other than 1, echo, suffix, logit_bias, tools/tool_choice on
 *    /v1/completions.
 *  - Prefix caching (prefix_cache): full cache blocks are named by the hash of the tokens up to
 *    their end (runtime/cpu/kvcache.h) and reused by later requests sharing the prefix;
 *    usage.prompt_tokens_details.cached_tokens says how many prompt tokens were, and /metrics
 *    glm5_prefix_cache_{queries,hits,evictions}_total and glm5_prefix_cache_blocks count them.
 *    Outputs are bit-identical with and without it. CPU: the shared pool's blocks of block_tokens
 *    are shared. CUDA: a device-side store of copies, gpu_prefix_cache_mb per rank, of blocks of
 *    gpu_prefix_block tokens (every layer's latent rows and indexer keys), least recently used
 *    first out; prompts are prefilled in calls ending at the blocks' ends (with or without the
 *    store: that is what makes a stored block the bits a fresh prefill writes; runtime/engine.h).
 *    Only prompt blocks are stored (not those of generated tokens: a decode step writes other
 *    bits than a prefill). With --draft mtp: on the CPU (above, "MTP"), off on CUDA.
 *  - Defaults: temperature 1, top_p 1, top_k off, min_p off, max_tokens 16 for completions and
 *    the rest of the context for chat; seed random unless given. Penalties: frequency_penalty,
 *    presence_penalty, repetition_penalty (llama.cpp semantics, sample.h), over the prompt too.
 *  - An end-of-generation token ends the output with finish_reason "stop" and is not part of
 *    the text, token_ids, logprobs or usage.completion_tokens (glm5-run does the same).
 *  - logprobs are the log-softmax of the raw logits (before penalties and temperature).
 *  - Extension: "return_token_ids": true adds "token_ids" to each choice (or chunk).
 *  - Text that is not valid UTF-8 (a random model can emit any byte) is sent with U+FFFD in
 *    place of each bad byte.
 *
 * Library code: nothing is printed; log lines go to the caller's callback. */
#ifndef G5_SERVE_H
#define G5_SERVE_H

#include <stddef.h>
#include <stdint.h>

#include "format/status.h"

typedef struct srv_server srv_server;

/* Where the model runs. CUDA needs the CUDA build (build/gpu/bin/glm5-serve, `make gpu-model`):
 * there every sequence gets its own GPU caches (rt_gpu_seq), each prompt is prefilled on its own
 * (in calls ending at the multiples of gpu_prefix_block; its chunks are whole numbers of those
 * blocks, prefill_chunk), and every decoding sequence advances in one rt_gpu_forward_batch call
 * per step; sampling stays on the host. The caches of max_batch sequences of ctx_size positions
 * each are allocated when the model loads (so no step allocates and none is preempted); the
 * block metrics count the blocks of those that hold cached tokens. */
typedef enum srv_device { SRV_DEVICE_CPU = 0, SRV_DEVICE_CUDA = 1 } srv_device;

/* 1 in a build with the CUDA backend. */
int srv_cuda_available(void);

/* One line without a trailing newline. Called from any thread; must be thread-safe. */
typedef void (*srv_log_fn)(void *user, const char *line);

typedef struct srv_config {
    const char *model_path;  /* blob set directory or GGUF (TP 1) */
    const char *model_name;  /* id in /v1/models and responses; NULL: the path's base name */
    const char *host;        /* address to bind; NULL: "127.0.0.1" */
    uint16_t port;           /* 0: any free port (srv_port() says which) */
    const char *api_key;     /* NULL or "": no authentication; else "Authorization: Bearer KEY"
                                is required on everything but /health */
    uint32_t max_batch;      /* sequences decoded together (default 8) */
    uint32_t max_queue;      /* requests waiting for a batch slot before 429 (default 64) */
    uint32_t ctx_size;       /* cache tokens for all sequences together (CUDA: for each of
                                max_batch sequences), and the longest prompt + max_tokens of
                                one request (default 4096; capped at the model's training
                                context) */
    uint32_t block_tokens;   /* tokens per cache block (default 16) */
    uint32_t n_threads;      /* model threads (0: online cores) */
    uint32_t draw_threads;   /* threads that draw a decode step's tokens, the engine thread
                                included (0: online cores / 2, at most 8; 1: the engine thread
                                alone); the tokens are the same either way */
    uint32_t prefill_chunk;  /* most prompt tokens one sequence runs per engine step (default
                                256; srv_prefill_chunk). CUDA with gpu_prefix_block > 0: rounded
                                down to whole blocks (at least one), so the GPU calls and bits
                                are those of the whole prompt at once; gpu_prefix_block 0: the
                                whole prompt in one step */
    uint64_t max_body;       /* request body limit in bytes (default 1 MiB); larger: 413 */
    uint32_t max_connections;/* simultaneous connections (default 512, at least max_batch +
                                max_queue + 32); one thread each */
    uint32_t max_per_ip;     /* simultaneous connections from one address (default 256) */
    uint32_t timeout_s;      /* a connection idle this long is closed, also one that has sent
                                only part of its request (default 30; 0: never). Not counted
                                while a generation request waits for the model */
    int warmup;              /* CUDA: run a prompt chunk and decode steps of one and of
                                max_batch sequences once at load (default 1), so that the
                                first requests do not pay for what the first calls set up
                                (lazily loaded kernels, cuBLAS plans, work buffers, the decode
                                graph); the outputs are the same either way */
    int prefault;            /* touch every weight page at load (default 1): measures the read
                                rate and keeps first requests from paying for page faults
                                (CPU only: the CUDA loader reads the blob files itself) */
    const char *cors_origin; /* NULL: no CORS headers; else Access-Control-Allow-Origin's value
                                on every reply, and OPTIONS preflights answered 204 */
    int prefix_cache;        /* reuse cache blocks of earlier requests' token prefixes (default 1) */
    uint32_t gpu_prefix_cache_mb; /* CUDA: the prefix store's device memory per rank in MiB (default
                                2048; 0: no store) */
    uint32_t gpu_prefix_block; /* CUDA: tokens per prefix block; prompts are prefilled in calls
                                ending at its multiples (default 256; 0: one call per prompt and no
                                store) */
    int draft_mtp;           /* --draft mtp: speculative decoding with the model's NextN/MTP block
                                (one draft token per sequence and step, verified in the batched
                                step; greedy requests keep the argmax, sampled ones use
                                speculative sampling). Default 0; the prefix cache is off with it */
    /* --draft mtp, tests: each request's drafter calls this after every MTP call, as draft.h's
     * rt_draft_observer (it may rewrite the draft logits: tests drive the accept path with it);
     * engine thread. NULL: none */
    g5_status (*draft_observer)(void *user, uint32_t p0, const float *hidden, const int32_t *next, uint32_t n,
                                float *draft, g5_error *err);
    void *draft_observer_user;
    srv_device device;       /* default SRV_DEVICE_CPU */
    int gpu0;                /* CUDA: first device; rank r on (gpu0 + r) % n_devices */
    int gpu_fast;            /* CUDA: --precision fast (default precise) */
    int gpu_kv_cache;        /* CUDA: latent cache type, rt_gpu_cache (0: precision's default) */
    int gpu_no_verify;       /* skip the blob checksums while loading (CPU: rt_wset_open_ex; CUDA: the loader) */
    int gpu_graph;           /* CUDA: decode steps (a lone sequence's and batched ones) as CUDA graph
                                launches (default 1; the same tokens as plain launches) */
    srv_log_fn log;          /* may be NULL */
    void *log_user;
} srv_config;

void srv_config_default(srv_config *c);

/* Validates the configuration, binds and listens, then starts the loader and the engine; returns
 * as soon as the socket is listening (the model loads in the background). */
g5_status srv_create(const srv_config *c, srv_server **out, g5_error *err);
/* Stops accepting, ends every request (waiting clients get an error or their stream ends),
 * joins all threads and frees everything. Accepts NULL. */
void srv_free(srv_server *s);

uint16_t srv_port(const srv_server *s);

typedef enum srv_load_state { SRV_LOADING = 0, SRV_READY = 1, SRV_FAILED = 2 } srv_load_state;
/* The load's state; on SRV_FAILED err (may be NULL) receives the load error. */
srv_load_state srv_get_load_state(const srv_server *s, g5_error *err);

typedef struct srv_stats {
    uint32_t running;          /* sequences in the batch now */
    uint32_t waiting;          /* queued requests */
    uint32_t peak_running;     /* largest batch seen */
    uint32_t blocks_total, blocks_in_use, block_tokens;
    uint64_t requests;         /* HTTP requests answered */
    uint64_t completions;      /* generation requests finished (any reason) */
    uint64_t cancelled;        /* generation requests cancelled (client gone, shutdown) */
    uint64_t preemptions;
    uint64_t prompt_tokens, generated_tokens;
    uint64_t prefix_query_tokens, prefix_hit_tokens; /* prompt tokens looked up / reused */
    uint64_t draft_proposed, draft_accepted;          /* --draft mtp: draft tokens verified / kept */
    uint64_t prefill_chunks;   /* prompt chunks run (one rt_eng_prefill each) */
    uint64_t decode_steps_beside_prefill; /* decode steps run while a prompt was part way through
                                             its chunks (the steps chunking let in) */
    uint64_t decode_steps;     /* engine steps that decoded (one batched forward call each) */
    uint64_t device_draw_steps; /* of those, steps whose tokens were drawn on the device
                                   (rt_eng_decode_draw: requests without logprobs or drafts) */
    double decode_seconds;     /* wall time of those steps: forward call (logits to host) + draws */
    double prefill_seconds;    /* wall time of prompt chunks (their last chunk's draw included) */
    double draw_seconds;       /* wall time drawing tokens (sampling, detokenizing, stop strings,
                                  hand-off to the client), part of the two above */
    double load_seconds;
    uint64_t load_bytes;
} srv_stats;
void srv_get_stats(srv_server *s, srv_stats *out);

/* ---- the cache block allocator (not thread-safe; the server holds its lock) ---- */
typedef struct srv_blocks srv_blocks;

/* A sequence's block table: the ids of its blocks in token order. Zero-initialize. */
typedef struct srv_btable {
    uint32_t *ids;
    uint32_t n, cap;
} srv_btable;

g5_status srv_blocks_create(uint32_t n_blocks, uint32_t block_tokens, srv_blocks **out,
                            g5_error *err);
void srv_blocks_free(srv_blocks *b); /* accepts NULL */
uint32_t srv_blocks_n_total(const srv_blocks *b);
uint32_t srv_blocks_n_free(const srv_blocks *b);
uint32_t srv_blocks_block_tokens(const srv_blocks *b);
/* Blocks needed to hold n_tokens. */
uint32_t srv_blocks_needed(const srv_blocks *b, uint64_t n_tokens);
/* Grows t so that it covers n_tokens, all or nothing: G5_ERR_BOUNDS (t unchanged) when too few
 * blocks are free, G5_ERR_NOMEM if the table cannot grow. Never shrinks t. */
g5_status srv_blocks_reserve(srv_blocks *b, srv_btable *t, uint64_t n_tokens, g5_error *err);
/* Returns all of t's blocks and frees its table (t is left empty). */
void srv_blocks_release(srv_blocks *b, srv_btable *t);

/* ---- helpers shared with the tests ---- */
/* The prompt tokens a sequence runs in one engine step: `rem` tokens left of its feed, the next
 * at position n_past. CPU (cuda 0): min(rem, max_chunk); any split gives the same bits there.
 * CUDA: the GPU's bits depend on how a prompt is split into calls, and the engine runs every
 * rt_eng_prefill in calls ending at the multiples of gpu_block (engine.h), so a chunk that ends
 * at such a multiple leaves the engine making exactly the calls of one rt_eng_prefill of the
 * whole rest: the chunk is the largest multiple of gpu_block <= max_chunk (at least one block)
 * less n_past's offset into its block (0 in the server: attached prefixes are whole blocks), or
 * the rest when that is shorter. gpu_block 0 (one call per prompt): the whole rest. */
uint32_t srv_prefill_chunk(uint32_t rem, uint32_t n_past, uint32_t max_chunk, int cuda, uint32_t gpu_block);

/* What a tokenizer.chat_template (Jinja, not interpreted) looks like, by its literal markers:
 * GLM role tokens and "[gMASK]<sop>" without "/nothink" = the GLM-5 (and GLM-4.7) format that
 * chat.h builds; with "/nothink" = GLM-4.5/4.6; anything else = another format. */
typedef enum srv_template_kind {
    SRV_TEMPLATE_GLM5 = 0,
    SRV_TEMPLATE_GLM45 = 1,
    SRV_TEMPLATE_OTHER = 2,
} srv_template_kind;
srv_template_kind srv_chat_template_kind(const char *tmpl, size_t len);

/* Copies len bytes into a NUL-terminated malloc'ed string that is valid UTF-8: each byte that
 * does not start a complete, well-formed sequence becomes U+FFFD. *out_len (may be NULL)
 * receives the length. NULL on allocation failure. */
char *srv_utf8_clean(const char *s, size_t len, size_t *out_len);

#endif
