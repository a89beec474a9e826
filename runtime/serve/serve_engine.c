/* glm5-serve engine: model loading, the request queue, continuous batching over engine
 * sequences (runtime/engine.h: the CPU model's paged states, or GPU sequences), and the cache
 * block allocator.
 *
 * The cache blocks are real: the engine's shared pool (--ctx-size / block_tokens blocks) holds
 * every sequence's paged latent and indexer-key caches, and the srv_blocks the metrics read is a
 * view of that pool, so a sequence's blocks are in use exactly while its sequence holds them.
 * Each engine iteration runs every sequence that is decoding (one token to feed) in one
 * rt_eng_decode call, and every sequence with prompt left to prefill one chunk on its own
 * (rt_eng_prefill), so a long prompt holds the decoding sequences up for one chunk per step, not
 * for its whole prefill. On CUDA the same loop runs the decoding sequences in one rt_eng_decode
 * call and the prompts in chunks too (srv_prefill_chunk): the GPU engine runs every rt_eng_prefill
 * in GPU calls ending at the multiples of --gpu-prefix-block (engine_gpu.c, rt_pfx_call_len: a
 * call ends at the next multiple of the block after its first position, or at the last token),
 * and a chunk here is a whole number of those blocks ending at such a multiple (or the rest of the
 * prompt), so the engine makes exactly the calls of one rt_eng_prefill of the whole prompt, with
 * the same bits: a prompt up to one block long is one call, as glm5-run runs it, and a greedy
 * request gives the tokens of the same request alone whatever the chunk size (with
 * --gpu-prefix-block 0 a prompt is one call and one step). The GPU
 * caches are reserved at load (max_batch x ctx_size positions), so nothing is preempted there, and
 * the block allocator counts the blocks of those caches that hold tokens. Prefix caching on CUDA
 * is the engine's device-side store of block copies (engine.h): a batch place's sequence takes
 * the stored blocks of its prompt's prefix when admitted and gives its prompt's blocks to the
 * store after its prefill and when it ends. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "format/gguf.h"
#include "runtime/serve/serve_int.h"

double srv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void srv_log(srv_server *s, const char *fmt, ...) {
    if (!s->cfg.log) return;
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    s->cfg.log(s->cfg.log_user, line);
}

const int srv_code_list[SRV_CODE_SLOTS - 1] = {200, 400, 401, 404, 405, 413, 429, 499, 500, 503};

int srv_code_slot(int code) {
    for (int i = 0; i < SRV_CODE_SLOTS - 1; i++)
        if (srv_code_list[i] == code) return i;
    return SRV_CODE_SLOTS - 1;
}

void srv_hist_observe(srv_hist *h, double v) {
    h->count++;
    h->sum += v;
    for (uint32_t i = 0; i < h->n; i++)
        if (v <= h->bounds[i]) {
            h->counts[i]++;
            return;
        }
}

int srv_cuda_available(void) { return rt_eng_cuda_available(); }

uint32_t srv_prefill_chunk(uint32_t rem, uint32_t n_past, uint32_t max_chunk, int cuda, uint32_t gpu_block) {
    if (!cuda) return rem < max_chunk ? rem : max_chunk;
    if (!gpu_block) return rem; /* one GPU call per prompt: a split would change its bits */
    const uint64_t per = max_chunk / gpu_block ? (uint64_t)(max_chunk / gpu_block) * gpu_block : gpu_block;
    /* ends at a multiple of the block: n_past is one in the server (attached prefixes are whole
     * blocks), and would be one again after the first chunk if it were not */
    const uint64_t c = per - n_past % gpu_block;
    return rem < c ? rem : (uint32_t)c;
}

/* ---- CUDA batch places ---- */

struct srv_slots {
    rt_eng_seq **seq;          /* [n_slots] */
    uint8_t *busy;             /* [n_slots] */
    uint32_t n_slots;
    uint64_t bytes;
};

g5_status srv_slots_create(rt_eng *e, uint32_t n_slots, uint32_t max_ctx, srv_slots **out, g5_error *err) {
    *out = NULL;
    srv_slots *b = calloc(1, sizeof *b);
    if (!b) return g5_fail(err, G5_ERR_NOMEM, "GPU sequences");
    b->n_slots = n_slots;
    b->seq = calloc(n_slots, sizeof *b->seq);
    b->busy = calloc(n_slots, 1);
    if (!b->seq || !b->busy) {
        srv_slots_free(b);
        return g5_fail(err, G5_ERR_NOMEM, "GPU sequences: %u slots", n_slots);
    }
    for (uint32_t i = 0; i < n_slots; i++) {
        g5_status st = rt_eng_seq_create(e, max_ctx, &b->seq[i], err);
        if (st) {
            g5_error_prefix(err, "GPU caches (--max-batch %u x --ctx-size %u positions, %.3f GB)", n_slots, max_ctx,
                            (double)rt_eng_seq_bytes(e, max_ctx) * n_slots / 1e9);
            srv_slots_free(b);
            return st;
        }
    }
    b->bytes = rt_eng_seq_bytes(e, max_ctx) * n_slots;
    *out = b;
    return G5_OK;
}

void srv_slots_free(srv_slots *b) {
    if (!b) return;
    for (uint32_t i = 0; b->seq && i < b->n_slots; i++) rt_eng_seq_free(b->seq[i]);
    free(b->seq);
    free(b->busy);
    free(b);
}

uint64_t srv_slots_bytes(const srv_slots *b) { return b->bytes; }

int srv_slots_take(srv_slots *b) {
    for (uint32_t i = 0; i < b->n_slots; i++)
        if (!b->busy[i]) {
            b->busy[i] = 1;
            rt_eng_seq_reset(b->seq[i]);
            return (int)i;
        }
    return -1;
}

void srv_slots_put(srv_slots *b, int slot) {
    if (slot < 0 || (uint32_t)slot >= b->n_slots) return;
    rt_eng_seq_reset(b->seq[slot]);
    b->busy[slot] = 0;
}

rt_eng_seq *srv_slots_seq(const srv_slots *b, int slot) {
    if (slot < 0 || (uint32_t)slot >= b->n_slots || !b->busy[slot]) return NULL;
    return b->seq[slot];
}

/* ---- block allocator ---- */

struct srv_blocks {
    uint32_t n_total, block_tokens, n_free;
    uint32_t *free_ids; /* stack of free block ids */
    uint8_t *used;      /* [n_total]: catches a block returned twice */
    const rt_eng *pool; /* set: the counts are the engine pool's; the tables are not used */
};

g5_status srv_blocks_create_pool(const rt_eng *e, srv_blocks **out, g5_error *err) {
    g5_status st = srv_blocks_create(1, rt_eng_pool_block_tokens(e), out, err);
    if (st) return st;
    (*out)->pool = e;
    (*out)->n_total = rt_eng_pool_n_blocks(e);
    return G5_OK;
}

g5_status srv_blocks_create(uint32_t n_blocks, uint32_t block_tokens, srv_blocks **out,
                            g5_error *err) {
    *out = NULL;
    if (n_blocks == 0 || block_tokens == 0)
        return g5_fail(err, G5_ERR_INVALID_ARG, "cache blocks: %u blocks of %u tokens", n_blocks,
                       block_tokens);
    srv_blocks *b = calloc(1, sizeof *b);
    if (b) {
        b->free_ids = malloc((size_t)n_blocks * sizeof *b->free_ids);
        b->used = calloc(n_blocks, 1);
    }
    if (!b || !b->free_ids || !b->used) {
        srv_blocks_free(b);
        return g5_fail(err, G5_ERR_NOMEM, "cache blocks: %u blocks", n_blocks);
    }
    b->n_total = b->n_free = n_blocks;
    b->block_tokens = block_tokens;
    /* Lowest ids are handed out first. */
    for (uint32_t i = 0; i < n_blocks; i++) b->free_ids[i] = n_blocks - 1 - i;
    *out = b;
    return G5_OK;
}

void srv_blocks_free(srv_blocks *b) {
    if (!b) return;
    free(b->free_ids);
    free(b->used);
    free(b);
}

uint32_t srv_blocks_n_total(const srv_blocks *b) { return b->n_total; }
uint32_t srv_blocks_n_free(const srv_blocks *b) { return b->pool ? rt_eng_pool_n_free(b->pool) : b->n_free; }
uint32_t srv_blocks_block_tokens(const srv_blocks *b) { return b->block_tokens; }

uint32_t srv_blocks_needed(const srv_blocks *b, uint64_t n_tokens) {
    uint64_t n = n_tokens / b->block_tokens + (n_tokens % b->block_tokens != 0);
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

g5_status srv_blocks_reserve(srv_blocks *b, srv_btable *t, uint64_t n_tokens, g5_error *err) {
    if (b->pool) return g5_fail(err, G5_ERR_INVALID_ARG, "cache blocks: tables of a pool-backed allocator");
    uint32_t need = srv_blocks_needed(b, n_tokens);
    if (need <= t->n) return G5_OK;
    uint32_t add = need - t->n;
    if (add > b->n_free)
        return g5_fail(err, G5_ERR_BOUNDS, "cache blocks: %u more needed, %u free", add, b->n_free);
    if (need > t->cap) {
        uint32_t nc = t->cap ? t->cap : 4;
        while (nc < need) nc = nc > UINT32_MAX / 2 ? need : nc * 2;
        uint32_t *q = realloc(t->ids, (size_t)nc * sizeof *q);
        if (!q) return g5_fail(err, G5_ERR_NOMEM, "cache block table of %u", nc);
        t->ids = q;
        t->cap = nc;
    }
    for (uint32_t i = 0; i < add; i++) {
        uint32_t id = b->free_ids[--b->n_free];
        b->used[id] = 1;
        t->ids[t->n++] = id;
    }
    return G5_OK;
}

void srv_blocks_release(srv_blocks *b, srv_btable *t) {
    for (uint32_t i = 0; i < t->n; i++) {
        uint32_t id = t->ids[i];
        if (id < b->n_total && b->used[id]) {
            b->used[id] = 0;
            b->free_ids[b->n_free++] = id;
        }
    }
    free(t->ids);
    t->ids = NULL;
    t->n = t->cap = 0;
}

/* ---- requests ---- */

void srv_params_clear(srv_params *p) {
    for (size_t i = 0; i < p->n_stops; i++) free(p->stops[i]);
    free(p->prompt);
    json_decref(p->tool_defs);
    free(p->force);
    memset(p, 0, sizeof *p);
}

srv_req *srv_req_new(srv_server *s, srv_params *p) {
    srv_req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int bad = pthread_cond_init(&r->cv, &ca) != 0;
    pthread_condattr_destroy(&ca);
    if (bad) {
        free(r);
        return NULL;
    }
    r->refs = 1;
    r->gslot = -1;
    r->p = *p;
    memset(p, 0, sizeof *p);
    r->created = (long)time(NULL);
    r->t_arrival = srv_now();
    pthread_mutex_lock(&s->mu);
    uint64_t no = ++s->next_req_no;
    pthread_mutex_unlock(&s->mu);
    snprintf(r->id, sizeof r->id, "%s-%lx%04llx", r->p.kind == SRV_KIND_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long)s->created, (unsigned long long)no);
    return r;
}

/* Frees the engine's resources of r; its state returns its blocks to the pool (under mu). */
static void publish_prefix_locked(srv_server *s, srv_req *r);

static void req_drop_engine_locked(srv_server *s, srv_req *r) {
    if (s->prefix_cache && r->st && rt_eng_seq_n_past(r->st) > r->n_past) {
        /* --draft mtp: an unverified draft's position goes before the blocks are published */
        g5_error e = {0};
        if (rt_eng_truncate(r->st, r->n_past, rt_eng_seq_mtp_n_past(r->st), &e) != G5_OK) r->n_past = 0;
    }
    publish_prefix_locked(s, r);
    rt_drafter_free(r->dr); /* before its sequence */
    r->dr = NULL;
    rt_eng_seq_free(r->st);
    r->st = NULL;
    if (r->gslot >= 0) srv_slots_put(s->gpu, r->gslot);
    r->gslot = -1;
    if (r->gblocks.ids) srv_blocks_release(s->blocks, &r->gblocks);
    r->n_past = 0;
}

static void req_destroy(srv_req *r) {
    rt_drafter_free(r->dr);
    rt_eng_seq_free(r->st);
    free(r->gblocks.ids);
    samp_free(r->samp);
    tok_stream_free(r->ts);
    free(r->feed);
    free(r->out_ids);
    free(r->out_lp);
    free(r->out_top);
    free(r->out_text_end);
    free(r->text);
    chat_parser_free(r->cp);
    srv_params_clear(&r->p);
    pthread_cond_destroy(&r->cv);
    free(r);
}

static int req_unref_locked(srv_req *r) { return --r->refs == 0; }

void srv_req_unref(srv_server *s, srv_req *r) {
    if (!r) return;
    pthread_mutex_lock(&s->mu);
    int last = req_unref_locked(r);
    pthread_mutex_unlock(&s->mu);
    if (last) req_destroy(r);
}

static void finish_locked(srv_server *s, srv_req *r, const char *finish, int err_http,
                          const char *errmsg) {
    if (r->done) return;
    r->done = 1;
    r->state = SRV_R_DONE;
    r->finish = finish;
    r->t_done = srv_now();
    if (err_http) {
        r->err_http = err_http;
        snprintf(r->errmsg, sizeof r->errmsg, "%s", errmsg ? errmsg : "internal error");
    }
    r->text_safe = r->text_len;
    if (r->cancelled) s->n_cancelled++;
    else if (err_http) s->n_failed++;
    s->n_completions++;
    if (!r->cancelled && !err_http) srv_hist_observe(&s->e2e, r->t_done - r->t_arrival);
    pthread_cond_broadcast(&r->cv);
}

int srv_submit(srv_server *s, srv_req *r, char *msg, size_t msg_cap) {
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        snprintf(msg, msg_cap, "the server is shutting down");
        rc = 503;
    } else if (s->load != SRV_READY) {
        snprintf(msg, msg_cap, s->load == SRV_LOADING ? "the model is loading" : "the model failed to load");
        rc = 503;
    } else if (s->n_waiting >= s->cfg.max_queue) {
        snprintf(msg, msg_cap, "the server is busy: %u requests are waiting (--max-queue %u)",
                 s->n_waiting, s->cfg.max_queue);
        rc = 429;
    } else if ((uint64_t)r->p.n_prompt + r->p.max_tokens > s->max_ctx) {
        snprintf(msg, msg_cap, "prompt (%u tokens) + max_tokens (%u) exceeds the context length %u",
                 r->p.n_prompt, r->p.max_tokens, s->max_ctx);
        rc = 400;
    } else {
        r->feed = malloc((size_t)r->p.n_prompt * sizeof *r->feed);
        if (!r->feed) {
            snprintf(msg, msg_cap, "out of memory");
            rc = 500;
        } else {
            memcpy(r->feed, r->p.prompt, (size_t)r->p.n_prompt * sizeof *r->feed);
            r->n_feed = r->cap_feed = r->p.n_prompt;
            r->feed_off = 0;
            r->force_armed = !r->p.think;
            r->state = SRV_R_WAITING;
            r->refs++;
            s->prompt_tokens += r->p.n_prompt;
            s->waiting[s->n_waiting++] = r;
            pthread_cond_signal(&s->engine_cv);
        }
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void srv_cancel_locked(srv_server *s, srv_req *r) {
    if (r->done || r->cancelled) return;
    r->cancelled = 1;
    pthread_cond_signal(&s->engine_cv);
}

void srv_cancel(srv_server *s, srv_req *r) {
    pthread_mutex_lock(&s->mu);
    srv_cancel_locked(s, r);
    pthread_mutex_unlock(&s->mu);
}

/* ---- loading ---- */

srv_template_kind srv_chat_template_kind(const char *t, size_t len) {
    int roles = memmem(t, len, "<|user|>", 8) && memmem(t, len, "<|assistant|>", 13);
    int prefix = memmem(t, len, "[gMASK]", 7) && memmem(t, len, "<sop>", 5);
    if (!roles || !prefix) return SRV_TEMPLATE_OTHER;
    return memmem(t, len, "/nothink", 8) ? SRV_TEMPLATE_GLM45 : SRV_TEMPLATE_GLM5;
}

static void check_chat_template(srv_server *s, const gguf_ctx *meta) {
    const char *t;
    uint64_t len;
    s->chat_fmt = CHAT_FORMAT_GLM5;
    if (gguf_get_str(meta, "tokenizer.chat_template", &t, &len, NULL) != G5_OK) {
        srv_log(s, "chat: no tokenizer.chat_template in the metadata; using the built-in GLM-5 format");
        return;
    }
    switch (srv_chat_template_kind(t, len)) {
    case SRV_TEMPLATE_GLM5:
        srv_log(s, "chat: tokenizer.chat_template (%llu bytes) matches the built-in GLM-5 format "
                   "(GLM role tokens, [gMASK]<sop>, no /nothink)", (unsigned long long)len);
        break;
    case SRV_TEMPLATE_GLM45:
        s->chat_fmt = CHAT_FORMAT_GLM45;
        srv_log(s, "chat: tokenizer.chat_template (%llu bytes) is the GLM-4.5/4.6 format (/nothink), "
                   "not GLM-5's; using the built-in GLM-4.5 format", (unsigned long long)len);
        break;
    default:
        srv_log(s, "chat: tokenizer.chat_template (%llu bytes) does not match the built-in GLM-5 format "
                   "(no GLM role tokens or [gMASK]<sop>); using the built-in GLM-5 format anyway",
                (unsigned long long)len);
    }
}

/* Counts the weight bytes; with touch, reads one byte of every page of every tensor, so the
 * weights are resident before the first request and the load rate is a real read rate. */
static uint64_t prefault(const rt_wset *ws, int touch, uint64_t *bytes) {
    uint64_t sink = 0, total = 0;
    for (uint32_t r = 0; r < rt_wset_n_ranks(ws); r++) {
        const rt_weights *w = rt_wset_rank(ws, r);
        for (uint64_t i = 0; i < rt_weights_n_tensors(w); i++) {
            const rt_tensor *t = rt_weights_tensor(w, i);
            const volatile uint8_t *p = t->data;
            total += t->nbytes;
            if (!p || !touch) continue;
            for (uint64_t o = 0; o < t->nbytes; o += 4096) sink += p[o];
            if (t->nbytes) sink += p[t->nbytes - 1];
        }
    }
    *bytes = total;
    return sink;
}

/* The "prefix cache:" load line: on, or why not. */
static void log_prefix(srv_server *s, const rt_eng *eng, int cuda) {
    rt_eng_prefix_info pi;
    rt_eng_prefix_get_info(eng, &pi);
    const srv_config *c = &s->cfg;
    char why[512];
    const char *hid = c->draft_mtp ? ", keeping the hidden states the NextN block rebuilds its cache of a reused "
                                      "prefix from" : "";
    if (pi.on && !cuda)
        snprintf(why, sizeof why, "on (cache blocks shared by token prefix%s)", hid);
    else if (pi.on)
        snprintf(why, sizeof why, "on (GPU store of %u blocks of %u tokens, %.1f MB per rank; prompts prefilled in calls "
                 "ending at multiples of %u tokens%s)", pi.n_blocks, pi.block_tokens,
                 (double)pi.n_blocks * pi.block_bytes / 1e6, pi.block_tokens, hid);
    else if (!c->prefix_cache)
        snprintf(why, sizeof why, "off (--no-prefix-cache)");
    else if (cuda && !c->gpu_prefix_block)
        snprintf(why, sizeof why, "off (--gpu-prefix-block 0: each prompt prefilled in one call)");
    else if (cuda && !c->gpu_prefix_cache_mb)
        snprintf(why, sizeof why, "off (--gpu-prefix-cache-mb 0)");
    else
        snprintf(why, sizeof why, "off (--gpu-prefix-cache-mb %u holds no block of %u tokens: %.1f MB per rank)",
                 c->gpu_prefix_cache_mb, pi.block_tokens, pi.block_bytes / 1e6);
    srv_log(s, "prefix cache: %s", why);
}

/* CUDA: what the first calls of each shape set up (lazily loaded kernels, cuBLAS plans, work
 * buffers grown to a chunk's rows and to max_batch rows, the one-sequence decode graph) made at
 * load on the slots' sequences, which are empty again after it; without it the first request
 * pays for it (a one-client TTFT of 0.29 s where its calls take about 30 ms: bench/RESULTS.md
 * session 15). The outputs of later calls are the same either way: graph replay and plain
 * launches give the same bits, and no cache row outlives the warm-up. */
static g5_status warm_up(const srv_config *cfg, rt_eng *eng, srv_slots *gpu, float *logits, uint32_t max_ctx,
                         double *seconds, g5_error *e) {
    const double t0 = srv_now();
    const uint32_t B = cfg->max_batch;
    uint32_t n = srv_prefill_chunk(UINT32_MAX, 0, cfg->prefill_chunk, 1, cfg->gpu_prefix_block);
    if (n > max_ctx - 1) n = max_ctx - 1; /* and one decode step after it */
    int32_t *tok = calloc(n > B ? n : B, sizeof *tok); /* token 0 throughout */
    rt_eng_seq **sq = calloc(B, sizeof *sq);
    int *slot = malloc(B * sizeof *slot);
    g5_status st = tok && sq && slot ? G5_OK : g5_fail(e, G5_ERR_NOMEM, "warm-up");
    uint32_t taken = 0;
    for (; !st && taken < B; taken++) {
        slot[taken] = srv_slots_take(gpu);
        sq[taken] = srv_slots_seq(gpu, slot[taken]);
        if (!sq[taken]) st = g5_fail(e, G5_ERR_INTERNAL, "warm-up: no free sequence slot %u of %u", taken, B);
    }
    const rt_eng_out out = {.logits = logits};
    if (!st) st = rt_eng_prefill(sq[0], tok, n, &out, e);
    if (!st) st = rt_eng_decode(eng, sq, tok, 1, logits, e);
    if (!st && B > 1) st = rt_eng_decode(eng, sq, tok, B, logits, e);
    for (uint32_t i = 0; i < taken; i++) srv_slots_put(gpu, slot[i]);
    if (st) g5_error_prefix(e, "warm-up (a %u-token prompt, then decode steps of 1 and %u sequences; --no-warmup skips it)", n, B);
    free(tok);
    free(sq);
    free(slot);
    *seconds = srv_now() - t0;
    return st;
}

static void *loader_main(void *arg) {
    srv_server *s = arg;
    double t0 = srv_now();
    g5_error e = {0};
    rt_wset *ws = NULL;
    rt_eng *eng = NULL;
    tok_ctx *tok = NULL;
    srv_blocks *blocks = NULL;
    srv_slots *gpu = NULL;
    float *logits = NULL;
    uint64_t bytes = 0;
    const int cuda = s->cfg.device == SRV_DEVICE_CUDA;
    srv_log(s, "loading %s%s", s->model_path, cuda ? " for CUDA" : "");
    /* CPU: checksums verified here (a corrupt set never serves); CUDA: by the GPU loader */
    rt_wset_opts wo = {.no_verify = s->cfg.gpu_no_verify || cuda, .jobs = s->cfg.n_threads};
    rt_wset_load_info li = {0};
    g5_status st = rt_wset_open_ex(s->model_path, &wo, &ws, &li, &e);
    if (st == G5_OK && li.verified)
        srv_log(s, "checksums verified: %.3f GB in %.2f s, %u threads", li.bytes / 1e9, li.seconds, li.jobs);
    else if (st == G5_OK && !cuda && !strcmp(rt_wset_source(ws), "blobs"))
        srv_log(s, "checksums skipped (--no-verify)");
    if (st == G5_OK) {
        volatile uint64_t sink = prefault(ws, s->cfg.prefault && !cuda, &bytes);
        (void)sink;
    }
    rt_eng_opts eo;
    rt_eng_opts_default(&eo);
    eo.device = cuda ? RT_ENG_CUDA : RT_ENG_CPU;
    eo.n_threads = s->cfg.n_threads;
    eo.mla = RT_MLA_ABSORBED;
    eo.gpu0 = s->cfg.gpu0;
    eo.precision = s->cfg.gpu_fast ? RT_ENG_FAST : RT_ENG_PRECISE;
    eo.cache = (rt_eng_cache)s->cfg.gpu_kv_cache;
    eo.verify = !s->cfg.gpu_no_verify;
    eo.cuda_graph = s->cfg.gpu_graph;
    /* a batching server takes the fp16 products (rt_gpu_opts.h16_products): a batch reads each
     * weight once (a batch-32 step 2.2 ms faster on the peer model, H100) for 0.3 ms more a
     * one-sequence step; a row's bits still do not depend on the batch */
    eo.h16_products = s->cfg.max_batch > 1;
    /* prefix caching; with --draft mtp the blocks (CPU pool or GPU store) also keep the hidden
     * states the drafter rebuilds the NextN cache of a reused prefix from */
    eo.kv_prefix_cache = s->cfg.prefix_cache;
    if (!cuda) { /* one pool of --ctx-size positions for every sequence */
        eo.kv_block_tokens = s->cfg.block_tokens;
        eo.kv_blocks = s->cfg.ctx_size / s->cfg.block_tokens + (s->cfg.ctx_size % s->cfg.block_tokens != 0);
    } else { /* prompts in calls ending at the store's block ends, with or without the store */
        eo.prefix_block_tokens = s->cfg.gpu_prefix_block;
        eo.prefix_cache_bytes = (uint64_t)s->cfg.gpu_prefix_cache_mb << 20;
        if (!eo.prefix_block_tokens || !eo.prefix_cache_bytes) eo.kv_prefix_cache = 0;
    }
    eo.kv_prefix_hidden = eo.kv_prefix_cache && s->cfg.draft_mtp;
    if (st == G5_OK) st = rt_eng_create(ws, &eo, &eng, &e);
    if (st == G5_OK) st = tok_create(rt_wset_meta(ws), &tok, &e);
    if (st == G5_OK) st = rt_eng_load(eng, &e);
    if (st == G5_OK && s->cfg.draft_mtp && !rt_eng_has_mtp(eng))
        st = g5_fail(&e, G5_ERR_UNSUPPORTED, "--draft mtp: %s has no NextN/MTP block", s->model_path);
    float *hidden = NULL;
    uint32_t max_ctx = 0, n_vocab = 0;
    if (st == G5_OK) {
        const glm5_hparams *hp = rt_eng_hparams(eng);
        n_vocab = hp->n_vocab;
        if (tok_n_vocab(tok) < n_vocab) n_vocab = tok_n_vocab(tok);
        max_ctx = s->cfg.ctx_size;
        if (hp->n_ctx_train && hp->n_ctx_train < max_ctx) max_ctx = hp->n_ctx_train;
        if (!cuda) {
            st = srv_blocks_create_pool(eng, &blocks, &e);
        } else {
            const uint64_t per = max_ctx / s->cfg.block_tokens + (max_ctx % s->cfg.block_tokens != 0);
            st = srv_slots_create(eng, s->cfg.max_batch, max_ctx, &gpu, &e);
            rt_eng_prefix_info pi;
            rt_eng_prefix_get_info(eng, &pi);
            if (st && pi.on)
                g5_error_prefix(&e, "next to the prefix store (--gpu-prefix-cache-mb %u)", s->cfg.gpu_prefix_cache_mb);
            if (st == G5_OK && per * s->cfg.max_batch > UINT32_MAX)
                st = g5_fail(&e, G5_ERR_INVALID_ARG, "%u sequences x %llu cache blocks", s->cfg.max_batch,
                             (unsigned long long)per);
            if (st == G5_OK) st = srv_blocks_create((uint32_t)(per * s->cfg.max_batch), s->cfg.block_tokens, &blocks, &e);
        }
    }
    if (st == G5_OK) { /* with draft: two rows (the chosen token and the draft) per sequence */
        const size_t rows = (size_t)s->cfg.max_batch * (s->cfg.draft_mtp ? 2 : 1);
        /* page-locked on CUDA: every step copies each row's logits (20 MB at 32 sequences) */
        logits = rt_eng_host_alloc(eng, rows * rt_eng_hparams(eng)->n_vocab * sizeof *logits);
        if (s->cfg.draft_mtp) hidden = rt_eng_host_alloc(eng, rows * rt_eng_hparams(eng)->n_embd * sizeof *hidden);
        if (!logits || (s->cfg.draft_mtp && !hidden)) st = g5_fail(&e, G5_ERR_NOMEM, "logits");
    }
    double dt = srv_now() - t0, warm_s = -1; /* the load's time: the warm-up is logged apart */
    if (st == G5_OK && gpu && s->cfg.warmup) st = warm_up(&s->cfg, eng, gpu, logits, max_ctx, &warm_s, &e);
    if (st == G5_OK) check_chat_template(s, rt_wset_meta(ws));
    pthread_mutex_lock(&s->mu);
    if (st == G5_OK) {
        s->ws = ws;
        s->eng = eng;
        s->tok = tok;
        s->blocks = blocks;
        s->gpu = gpu;
        s->logits = logits;
        s->hidden = hidden;
        s->draft = s->cfg.draft_mtp;
        s->n_vocab = n_vocab;
        s->max_ctx = max_ctx;
        rt_eng_prefix_info pi;
        rt_eng_prefix_get_info(eng, &pi);
        s->prefix_cache = pi.on;
        s->load_seconds = dt;
        s->load_bytes = bytes;
        s->load = SRV_READY;
    } else {
        s->load_err = e;
        if (!s->load_err.msg[0]) snprintf(s->load_err.msg, sizeof s->load_err.msg, "%s", g5_strerror(st));
        s->load_err.status = st;
        s->load = SRV_FAILED;
    }
    pthread_cond_broadcast(&s->engine_cv);
    pthread_cond_broadcast(&s->load_cv);
    pthread_mutex_unlock(&s->mu);
    if (st == G5_OK) {
        const glm5_hparams *hp = rt_eng_hparams(eng);
        srv_log(s, "model loaded: %s, %u rank%s, %u threads, vocab %u, %u layers; %.3f GB in %.2f s "
                   "(%.2f GB/s); context %u tokens per sequence, cache %u blocks of %u tokens",
                rt_wset_source(ws), rt_eng_n_ranks(eng), rt_eng_n_ranks(eng) > 1 ? "s" : "",
                rt_eng_n_threads(eng), hp->n_vocab, hp->n_layer_main, bytes / 1e9, dt,
                dt > 0 ? bytes / 1e9 / dt : 0.0, max_ctx, srv_blocks_n_total(blocks),
                srv_blocks_block_tokens(blocks));
        if (gpu) {
            char line[1024];
            rt_eng_describe(eng, line, sizeof line);
            srv_log(s, "%s; caches %.3f GB for %u sequences x %u positions", line, srv_slots_bytes(gpu) / 1e9,
                    s->cfg.max_batch, max_ctx);
        }
        if (warm_s >= 0) srv_log(s, "warm-up: %.3f s", warm_s);
        log_prefix(s, eng, cuda);
        if (s->draft)
            srv_log(s, "draft: mtp (one NextN draft token per sequence and step, verified in the batched step)");
    } else {
        srv_log(s, "model load failed: %s (%s)", e.msg, g5_strerror(st));
        if (eng) {
            rt_eng_host_free(eng, logits);
            rt_eng_host_free(eng, hidden);
        }
        srv_slots_free(gpu);
        srv_blocks_free(blocks);
        tok_free(tok);
        rt_eng_free(eng);
        rt_wset_free(ws);
    }
    return NULL;
}

/* ---- engine ---- */

static void waiting_remove_at(srv_server *s, uint32_t i) {
    memmove(s->waiting + i, s->waiting + i + 1, (size_t)(s->n_waiting - i - 1) * sizeof *s->waiting);
    s->n_waiting--;
}

static void running_remove(srv_server *s, srv_req *r) {
    for (uint32_t i = 0; i < s->n_running; i++)
        if (s->running[i] == r) {
            memmove(s->running + i, s->running + i + 1,
                    (size_t)(s->n_running - i - 1) * sizeof *s->running);
            s->n_running--;
            return;
        }
}

/* Takes r out of the batch for good: frees its state and blocks, drops the queue's reference. */
static void retire_locked(srv_server *s, srv_req *r, const char *finish, int err_http,
                          const char *errmsg) {
    running_remove(s, r);
    req_drop_engine_locked(s, r);
    finish_locked(s, r, finish, err_http, errmsg);
    if (req_unref_locked(r)) req_destroy(r);
}

static void reap_locked(srv_server *s) {
    for (uint32_t i = 0; i < s->n_waiting;) {
        srv_req *r = s->waiting[i];
        if (r->cancelled) {
            waiting_remove_at(s, i);
            req_drop_engine_locked(s, r);
            finish_locked(s, r, NULL, 0, NULL);
            if (req_unref_locked(r)) req_destroy(r);
        } else {
            i++;
        }
    }
    for (uint32_t i = 0; i < s->n_running;) {
        srv_req *r = s->running[i];
        if (r->cancelled) retire_locked(s, r, NULL, 0, NULL);
        else i++;
    }
}

/* Moves r from the batch back to the front of the queue; it restarts from its prompt and output
 * (the sampler keeps its state, so what it produces does not change). */
static void preempt_locked(srv_server *s, srv_req *r) {
    running_remove(s, r);
    req_drop_engine_locked(s, r);
    uint32_t n = r->p.n_prompt + r->n_out;
    if (n > r->cap_feed) {
        int32_t *q = realloc(r->feed, (size_t)n * sizeof *q);
        if (!q) {
            finish_locked(s, r, NULL, 500, "out of memory while preempting");
            if (req_unref_locked(r)) req_destroy(r);
            return;
        }
        r->feed = q;
        r->cap_feed = n;
    }
    memcpy(r->feed, r->p.prompt, (size_t)r->p.n_prompt * sizeof *r->feed);
    memcpy(r->feed + r->p.n_prompt, r->out_ids, (size_t)r->n_out * sizeof *r->feed);
    r->n_feed = n;
    r->feed_off = 0;
    r->mid_prompt = 0;
    r->state = SRV_R_WAITING;
    memmove(s->waiting + 1, s->waiting, (size_t)s->n_waiting * sizeof *s->waiting);
    s->waiting[0] = r;
    s->n_waiting++;
    s->n_preemptions++;
}

/* A fresh state (q: r->st, or on CUDA its batch place's sequence) starts from the cached blocks
 * of the longest cached prefix of its feed (the prompt, after a preemption also the output so
 * far). */
static g5_status attach_prefix_locked(srv_server *s, srv_req *r, rt_eng_seq *q, g5_error *e) {
    uint32_t reused = 0;
    g5_status st = rt_eng_seq_attach_prefix(q, r->feed, r->n_feed, &reused, e);
    if (st) return st;
    r->n_past = reused;
    r->feed_off = reused;
    if (!r->prefix_looked_up) { /* the request's first admission: its prompt's reuse */
        r->prefix_looked_up = 1;
        r->cached_tokens = reused;
        s->prefix_query_tokens += r->p.n_prompt;
        s->prefix_hit_tokens += reused;
    }
    return G5_OK;
}

/* Registers the full blocks of r's state (tokens: the prompt, then the output) for reuse. */
static void publish_prefix_locked(srv_server *s, srv_req *r) {
    rt_eng_seq *q = s->gpu ? srv_slots_seq(s->gpu, r->gslot) : r->st;
    if (!s->prefix_cache || !q || !r->n_past || rt_eng_seq_n_past(q) != r->n_past) return; /* no unverified draft */
    uint32_t n = r->n_past;
    int32_t *t = malloc((size_t)n * sizeof *t);
    if (!t) return; /* only a lost chance of reuse */
    uint32_t np = n < r->p.n_prompt ? n : r->p.n_prompt;
    memcpy(t, r->p.prompt, (size_t)np * sizeof *t);
    if (n > np) memcpy(t + np, r->out_ids, (size_t)(n - np) * sizeof *t);
    g5_error e = {0};
    (void)rt_eng_seq_publish_prefix(q, t, &e);
    free(t);
}

static void admit_locked(srv_server *s) {
    while (s->n_running < s->cfg.max_batch && s->n_waiting > 0) {
        srv_req *r = s->waiting[0];
        uint32_t pending = r->n_feed - r->feed_off;
        /* CUDA: a batch place is a GPU sequence with room for the whole context */
        if (!s->gpu && srv_blocks_needed(s->blocks, (uint64_t)pending + 1) > srv_blocks_n_free(s->blocks)) break;
        waiting_remove_at(s, 0);
        g5_error e = {0};
        g5_status st = G5_OK;
        if (s->gpu) {
            if (r->gslot < 0) {
                if ((r->gslot = srv_slots_take(s->gpu)) < 0)
                    st = g5_fail(&e, G5_ERR_INTERNAL, "no free GPU sequence with %u running", s->n_running);
                else if (s->prefix_cache) /* the store's blocks copied into the batch place's caches */
                    st = attach_prefix_locked(s, r, srv_slots_seq(s->gpu, r->gslot), &e);
            }
        } else if (!r->st) {
            st = rt_eng_seq_create(s->eng, 0, &r->st, &e);
            if (st == G5_OK && s->prefix_cache) st = attach_prefix_locked(s, r, r->st, &e);
            pending = r->n_feed - r->feed_off;
        }
        if (st == G5_OK && !r->samp) {
            st = samp_create(&r->p.sp, rt_eng_hparams(s->eng)->n_vocab, &r->samp, &e);
            if (st == G5_OK)
                for (uint32_t i = 0; i < r->p.n_prompt; i++) samp_accept(r->samp, r->p.prompt[i]);
        }
        if (st == G5_OK && s->draft && !r->dr) {
            rt_eng_seq *q = s->gpu ? srv_slots_seq(s->gpu, r->gslot) : r->st;
            st = q ? rt_drafter_create(q, &r->dr, &e) : g5_fail(&e, G5_ERR_INTERNAL, "no sequence to draft for");
            if (st == G5_OK) rt_drafter_set_sampler(r->dr, r->samp);
            /* an attached prefix: the NextN block's inputs of those positions from the cache */
            if (st == G5_OK && r->n_past) st = rt_drafter_resume(r->dr, r->feed, r->n_past, &e);
            if (st == G5_OK && s->cfg.draft_observer)
                rt_drafter_set_observer(r->dr, s->cfg.draft_observer, s->cfg.draft_observer_user);
        }
        if (st == G5_OK && !r->ts) st = tok_stream_create(s->tok, 0, &r->ts, &e);
        if (st == G5_OK && !s->gpu) st = rt_eng_seq_reserve(r->st, r->n_past + pending, &e);
        r->state = SRV_R_RUNNING;
        r->admit_no = ++s->admit_counter;
        s->running[s->n_running++] = r;
        if (s->n_running > s->peak_running) s->peak_running = s->n_running;
        if (st != G5_OK) retire_locked(s, r, NULL, 500, e.msg);
    }
}

static void logprobs_of(const float *x, uint32_t V, int32_t id, uint32_t n_top, float *lp,
                        srv_top *top) {
    float mx = -INFINITY;
    for (uint32_t i = 0; i < V; i++)
        if (x[i] > mx) mx = x[i];
    double sum = 0;
    for (uint32_t i = 0; i < V; i++) sum += exp((double)x[i] - mx);
    double lse = (double)mx + log(sum);
    *lp = (float)((double)x[id] - lse);
    uint32_t n = 0;
    for (uint32_t i = 0; i < V && n_top; i++) {
        float v = x[i];
        if (n == n_top && !(v > top[n - 1].logprob)) continue;
        uint32_t j = n < n_top ? n++ : n - 1;
        while (j > 0 && v > top[j - 1].logprob) {
            top[j] = top[j - 1];
            j--;
        }
        top[j].id = (int32_t)i;
        top[j].logprob = v;
    }
    for (uint32_t j = 0; j < n; j++) top[j].logprob = (float)((double)top[j].logprob - lse);
    for (uint32_t j = n; j < n_top; j++) top[j] = (srv_top){-1, -INFINITY};
}

static int grow_out_locked(srv_req *r) {
    if (r->n_out < r->cap_out) return 1;
    uint32_t nc = r->cap_out ? r->cap_out * 2 : 64;
    int32_t *ids = realloc(r->out_ids, (size_t)nc * sizeof *ids);
    if (ids) r->out_ids = ids;
    uint32_t *te = realloc(r->out_text_end, (size_t)nc * sizeof *te);
    if (te) r->out_text_end = te;
    if (!ids || !te) return 0;
    if (r->p.logprobs) {
        float *lp = realloc(r->out_lp, (size_t)nc * sizeof *lp);
        if (lp) r->out_lp = lp;
        if (!lp) return 0;
        if (r->p.top_logprobs) {
            srv_top *t = realloc(r->out_top, (size_t)nc * r->p.top_logprobs * sizeof *t);
            if (t) r->out_top = t;
            if (!t) return 0;
        }
    }
    r->cap_out = nc;
    return 1;
}

static int append_text_locked(srv_req *r, const char *b, size_t n) {
    if (r->text_len + n + 1 > r->text_cap) {
        size_t nc = r->text_cap ? r->text_cap : 256;
        while (nc < r->text_len + n + 1) nc *= 2;
        char *q = realloc(r->text, nc);
        if (!q) return 0;
        r->text = q;
        r->text_cap = nc;
    }
    memcpy(r->text + r->text_len, b, n);
    r->text_len += n;
    r->text[r->text_len] = 0;
    return 1;
}

static void flush_text_locked(srv_req *r) {
    const char *b;
    size_t n;
    tok_stream_flush(r->ts, &b, &n);
    if (n) append_text_locked(r, b, n);
    if (r->n_out) r->out_text_end[r->n_out - 1] = (uint32_t)r->text_len;
}

/* Makes r's state hold blocks for n_tokens positions, preempting the most recently admitted
 * sequences while the pool is short (under mu). Returns 0 if r itself was preempted or retired. */
static int reserve_locked(srv_server *s, srv_req *r, uint32_t n_tokens) {
    if (s->gpu) { /* accounting only: the GPU sequence has room for max_ctx, and so has the pool */
        g5_error e = {0};
        if (srv_blocks_reserve(s->blocks, &r->gblocks, n_tokens, &e) == G5_OK) return 1;
        retire_locked(s, r, NULL, 500, e.msg);
        return 0;
    }
    for (;;) {
        g5_error e = {0};
        if (rt_eng_seq_reserve(r->st, n_tokens, &e) == G5_OK) return 1;
        const uint32_t bt = srv_blocks_block_tokens(s->blocks);
        const uint32_t need = (n_tokens + bt - 1) / bt - rt_eng_seq_n_blocks(r->st);
        if (need <= srv_blocks_n_free(s->blocks)) { /* not the pool: out of memory */
            retire_locked(s, r, NULL, 500, e.msg);
            return 0;
        }
        srv_req *victim = NULL;
        for (uint32_t i = 0; i < s->n_running; i++)
            if (!victim || s->running[i]->admit_no > victim->admit_no) victim = s->running[i];
        if (!victim || (victim == r && s->n_running == 1)) {
            retire_locked(s, r, NULL, 500, "the cache is exhausted");
            return 0;
        }
        preempt_locked(s, victim);
        if (victim == r) return 0;
    }
}

/* A control token whose text the chat parser reads (<think>, <tool_call>, <arg_key>, ...): its
 * text into buf. Other control tokens print nothing, as before. */
static int chat_marker(const tok_ctx *tok, int32_t id, char *buf, size_t cap, size_t *n) {
    static const char *const marks[] = {"<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>",
                                        "</arg_key>", "<arg_value>", "</arg_value>"};
    if (tok_token_type(tok, id) != TOK_TYPE_CONTROL) return 0;
    size_t len = 0;
    const char *t = tok_token_text(tok, id, &len);
    for (size_t i = 0; t && i < sizeof marks / sizeof marks[0]; i++)
        if (len == strlen(marks[i]) && len < cap && !memcmp(t, marks[i], len)) {
            memcpy(buf, t, len);
            *n = len;
            return 1;
        }
    return 0;
}

/* A drawn token before it is published: what draw_pick gives draw_publish_many. */
typedef struct srv_drawn {
    g5_status st;
    g5_error e;
    int32_t id;
    float lp;
    int eog;
    const char *bytes; /* into r's text stream, or mark */
    size_t nb;
    char mark[64];
    srv_top top[SRV_MAX_TOP_LOGPROBS];
} srv_drawn;

static void draw_pick(const srv_server *s, srv_req *r, const float *logits, int32_t pick, float pick_logit,
                      srv_drawn *d);
static void draw_publish_many(srv_server *s, srv_req **rs, srv_drawn *d, uint32_t k);

/* r has run its feed up to the end and logits (its row) holds the next token's: draws it and
 * publishes it, or finishes r; its time goes to the draw counter. logits NULL: a greedy step
 * whose argmax the engine computed (rt_eng_decode_argmax): the token is pick, its logit
 * pick_logit. */
static void draw(srv_server *s, srv_req *r, const float *logits, int32_t pick, float pick_logit) {
    const double t0 = srv_now();
    srv_drawn d;
    draw_pick(s, r, logits, pick, pick_logit, &d);
    draw_publish_many(s, &r, &d, 1);
    s->draw_pending += srv_now() - t0;
}

/* The draws of a decode step's k sequences from their logits rows: picked on the draw threads
 * (each touches its own sequence's sampler and text stream alone), then published in order. */
typedef struct draw_job {
    const srv_server *s;
    srv_req **dec;
    const float *logits; /* [k][V] */
    uint32_t V;
    srv_drawn *out;      /* [k] */
} draw_job;

static void draw_job_one(void *ctx, uint64_t i, uint32_t worker) {
    (void)worker;
    const draw_job *j = ctx;
    draw_pick(j->s, j->dec[i], j->logits + (size_t)i * j->V, -1, 0, &j->out[i]);
}

static void draw_many(srv_server *s, srv_req **dec, uint32_t k, const float *logits, srv_drawn *out) {
    const double t0 = srv_now();
    draw_job j = {s, dec, logits, rt_eng_hparams(s->eng)->n_vocab, out};
    rt_pool_run(s->draws, k, draw_job_one, &j);
    draw_publish_many(s, dec, out, k);
    s->draw_pending += srv_now() - t0;
}

/* 1: r's next token may come from rt_eng_decode_argmax: its sampler takes the argmax of the
 * logits as they are, and it asks for nothing else of them. */
static int argmax_draw(const srv_req *r) { return !r->dr && !r->p.logprobs && samp_is_argmax(r->samp); }

/* 1: r's next token may come from rt_eng_decode_draw: a draw the device makes (samp_device_ok),
 * and r asks for nothing else of the logits. */
static int device_draw(const srv_req *r) { return !r->dr && !r->p.logprobs && samp_device_ok(r->samp); }

/* The token of r and what its text adds, without the lock: r's sampler, forced tokens and text
 * stream are the engine's alone (serve_int.h), so draws of different sequences may run at once. */
static void draw_pick(const srv_server *s, srv_req *r, const float *logits, int32_t pick, float pick_logit,
                      srv_drawn *d) {
    const uint32_t V = rt_eng_hparams(s->eng)->n_vocab;
    d->e = (g5_error){0};
    d->id = -1;
    d->lp = 0;
    d->bytes = NULL;
    d->nb = 0;
    int32_t x = -1; /* --draft mtp: a draft pending verification, whose logits follow these */
    const float *q = r->dr && logits ? rt_drafter_draft(r->dr, &x) : NULL;
    g5_status st;
    if (!logits) { /* the sampler's refusal where it would give one on the same logits */
        d->id = pick;
        st = samp_argmax_check(pick_logit, &d->e);
        if (st != G5_OK && s->gpu && s->cfg.gpu_fast) snprintf(d->e.msg, sizeof d->e.msg, "%s", RT_ENG_FAST_RANGE_MSG);
    } else {
        st = q ? samp_sample_spec(r->samp, logits, q, x, &d->id, NULL, &d->e) : samp_sample(r->samp, logits, &d->id, &d->e);
        if (st != G5_OK && s->gpu && s->cfg.gpu_fast && !rt_eng_any_finite(logits, V))
            snprintf(d->e.msg, sizeof d->e.msg, "%s", RT_ENG_FAST_RANGE_MSG);
    }
    if (st == G5_OK && r->force_armed && r->force_pos < r->p.n_force) d->id = r->p.force[r->force_pos++];
    if (st == G5_OK && (d->id < 0 || (uint32_t)d->id >= V))
        st = g5_fail(&d->e, G5_ERR_INTERNAL, "sampler returned token %d", d->id);
    if (st == G5_OK && r->p.logprobs && logits) logprobs_of(logits, V, d->id, r->p.top_logprobs, &d->lp, d->top);
    d->eog = st == G5_OK && tok_is_eog(s->tok, d->id);
    if (st == G5_OK && !d->eog) {
        samp_accept(r->samp, d->id);
        size_t ml = 0;
        if (r->p.kind == SRV_KIND_CHAT && chat_marker(s->tok, d->id, d->mark, sizeof d->mark, &ml)) {
            /* the parser needs the marker: what the stream held back, then its text */
            const char *held;
            size_t nh;
            tok_stream_flush(r->ts, &held, &nh);
            if (nh + ml <= sizeof d->mark) {
                memmove(d->mark + nh, d->mark, ml);
                memcpy(d->mark, held, nh);
                ml += nh;
            }
            d->bytes = d->mark;
            d->nb = ml;
            if (ml >= 8 && !memcmp(d->mark + ml - 8, "</think>", 8)) r->force_armed = 1;
        } else if ((uint32_t)d->id < tok_n_vocab(s->tok)) {
            st = tok_stream_push(r->ts, d->id, &d->bytes, &d->nb, &d->e);
        }
    }
    d->st = st;
}

/* r's drawn token published (the lock held): its output, text, stop strings and length, the
 * clients woken; or r finished (end of generation, stop, length, error). */
static void draw_publish_locked(srv_server *s, srv_req *r, srv_drawn *d, double now) {
    const int32_t id = d->id;
    const size_t nb = d->nb;
    if (d->st != G5_OK) {
        retire_locked(s, r, NULL, 500, d->e.msg);
        return;
    }
    s->generated_tokens++;
    if (r->t_first == 0) {
        r->t_first = now;
        srv_hist_observe(&s->ttft, now - r->t_arrival);
    } else {
        srv_hist_observe(&s->tpot, now - r->t_last);
    }
    r->t_last = now;
    if (d->eog) {
        flush_text_locked(r);
        retire_locked(s, r, "stop", 0, NULL);
        return;
    }
    if (!grow_out_locked(r) || !append_text_locked(r, d->bytes ? d->bytes : "", nb)) {
        retire_locked(s, r, NULL, 500, "out of memory");
        return;
    }
    uint32_t k = r->n_out++;
    r->out_ids[k] = id;
    r->out_text_end[k] = (uint32_t)r->text_len;
    if (r->p.logprobs) {
        r->out_lp[k] = d->lp;
        if (r->p.top_logprobs)
            memcpy(r->out_top + (size_t)k * r->p.top_logprobs, d->top, r->p.top_logprobs * sizeof *d->top);
    }
    r->feed[0] = id;
    r->n_feed = 1;
    r->feed_off = 0;
    const char *const *stops = (const char *const *)r->p.stops;
    size_t pos;
    if (r->p.n_stops && samp_stop_find(r->text, r->text_len, nb, stops, r->p.n_stops, &pos) >= 0) {
        r->text_len = pos;
        r->text[pos] = 0;
        for (uint32_t i = 0; i < r->n_out; i++)
            if (r->out_text_end[i] > pos) r->out_text_end[i] = (uint32_t)pos;
        retire_locked(s, r, "stop", 0, NULL);
    } else if (r->n_out >= r->p.max_tokens || r->n_past + 1 > s->max_ctx) {
        flush_text_locked(r);
        retire_locked(s, r, "length", 0, NULL);
    } else {
        size_t hold = r->p.n_stops ? samp_stop_holdback(r->text, r->text_len, stops, r->p.n_stops) : 0;
        r->text_safe = r->text_len - hold;
        pthread_cond_broadcast(&r->cv);
    }
}

/* The drawn tokens of k sequences published in order under one hold of the lock, not one per
 * token, each handoff racing the clients' threads that the last one woke (32 greedy streaming
 * clients, the oracle's model on a 2-core host: the engine's token draws 0.40 -> 0.25 ms a step;
 * 1.10 ms a step on the H100 host, bench/RESULTS.md session 22). */
static void draw_publish_many(srv_server *s, srv_req **rs, srv_drawn *d, uint32_t k) {
    const double now = srv_now();
    pthread_mutex_lock(&s->mu);
    for (uint32_t i = 0; i < k; i++) draw_publish_locked(s, rs[i], &d[i], now);
    pthread_mutex_unlock(&s->mu);
}

static int is_live_locked(const srv_req *r) {
    return r->state == SRV_R_RUNNING && !r->cancelled && (r->st || r->gslot >= 0);
}

/* One prompt chunk of one sequence; draws the next token when the feed is used up. */
static void prefill_step(srv_server *s, srv_req *r) {
    g5_error e = {0};
    pthread_mutex_lock(&s->mu);
    if (!is_live_locked(r)) {
        pthread_mutex_unlock(&s->mu);
        return;
    }
    const uint32_t rem = r->n_feed - r->feed_off;
    /* CUDA: the engine's prefix blocks are cfg.gpu_prefix_block (its opts at load). The drafter
     * (--draft mtp) chunks alike: rt_drafter_prompt runs its chunk as one rt_eng_prefill (the same
     * GPU calls, each giving the hidden states as before) and only queues the (hidden state, next
     * token) pairs, across chunk ends too, for one MTP call at the first decode step, so its MTP
     * calls do not depend on the chunks either; a chunk's last GPU call also computes logits (the
     * head after the final norm: caches and hidden states unchanged), overwritten by the next */
    const uint32_t chunk = srv_prefill_chunk(rem, r->n_past, s->cfg.prefill_chunk, s->gpu != NULL, s->cfg.gpu_prefix_block);
    if (!reserve_locked(s, r, r->n_past + chunk)) {
        pthread_mutex_unlock(&s->mu);
        return;
    }
    pthread_mutex_unlock(&s->mu);

    int last = chunk == rem;
    g5_status st;
    rt_eng_seq *q = s->gpu ? srv_slots_seq(s->gpu, r->gslot) : r->st;
    const rt_eng_out out = {.logits = s->logits};
    if (!q)
        st = g5_fail(&e, G5_ERR_INTERNAL, "GPU slot %d is not in use", r->gslot);
    else if (s->gpu && (uint64_t)rt_eng_seq_n_past(q) + chunk > s->max_ctx) /* sized at load: never grow here */
        st = g5_fail(&e, G5_ERR_BOUNDS, "sequence of %u + %u tokens exceeds the context %u", rt_eng_seq_n_past(q), chunk,
                     s->max_ctx);
    else if (r->dr) /* the drafter keeps the hidden states for its MTP block */
        st = rt_drafter_prompt(r->dr, r->feed + r->feed_off, chunk, s->logits, 0, &e);
    else
        st = rt_eng_prefill(q, r->feed + r->feed_off, chunk, last ? &out : NULL, &e);
    if (st != G5_OK) {
        pthread_mutex_lock(&s->mu);
        /* CUDA: work buffers for a long prompt may not fit next to the reserved caches */
        retire_locked(s, r, NULL, s->gpu && st == G5_ERR_NOMEM ? 503 : 500, e.msg);
        pthread_mutex_unlock(&s->mu);
        return;
    }
    r->n_past += chunk;
    r->feed_off += chunk;
    pthread_mutex_lock(&s->mu);
    s->prefill_chunks++;
    r->mid_prompt = !last;
    if (s->prefix_cache) publish_prefix_locked(s, r); /* the prompt's blocks are reusable as soon as they are full */
    pthread_mutex_unlock(&s->mu);
    if (last) draw(s, r, s->logits, -1, 0);
}

/* One token for each of the n decoding sequences in dec, in one batched forward call. CUDA, when
 * every one of them takes the argmax (argmax_draw: greedy requests without logprobs or
 * penalties in force): the step gives the ids and their logits (pick, pick_l [n]) computed on
 * the GPU, not the rows' logits (20 MB at 32 sequences), and the draws need no pass over them.
 * Else, where the engine draws on its device and every draw is one it makes (device_draw:
 * any draw but a logprobs request's or a draft's): the step gives the
 * tokens (pick), each sampler's random number taken beforehand (samp_device_row, rows [n]). */
static void decode_step(srv_server *s, srv_req **dec, uint32_t n, rt_eng_seq **sts, int32_t *toks, int32_t *pick,
                        float *pick_l, samp_dev_row *rows, srv_drawn *drawn) {
    pthread_mutex_lock(&s->mu);
    for (uint32_t i = 0; i < n; i++)
        if (is_live_locked(dec[i])) (void)reserve_locked(s, dec[i], dec[i]->n_past + 1);
    /* a reservation may have preempted or retired sequences reserved before it */
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++)
        if (is_live_locked(dec[i])) dec[k++] = dec[i];
    pthread_mutex_unlock(&s->mu);
    if (!k) return;
    for (uint32_t i = 0; i < k; i++) {
        sts[i] = s->gpu ? srv_slots_seq(s->gpu, dec[i]->gslot) : dec[i]->st;
        toks[i] = dec[i]->feed[dec[i]->feed_off];
    }
    g5_error e = {0};
    g5_status st = G5_OK;
    for (uint32_t i = 0; i < k && !st; i++) {
        if (!sts[i]) st = g5_fail(&e, G5_ERR_INTERNAL, "GPU slot %d is not in use", dec[i]->gslot);
        else if (s->gpu && rt_eng_seq_n_past(sts[i]) + 1ull > s->max_ctx)
            st = g5_fail(&e, G5_ERR_BOUNDS, "sequence of %u + 1 tokens exceeds the context %u", rt_eng_seq_n_past(sts[i]),
                         s->max_ctx);
    }
    int am = s->gpu != NULL;
    for (uint32_t i = 0; i < k && am; i++) am = argmax_draw(dec[i]);
    int dv = !am && s->gpu != NULL && rt_eng_draws_on_device(s->eng);
    for (uint32_t i = 0; i < k && dv; i++) dv = device_draw(dec[i]);
    for (uint32_t i = 0; i < k && dv && !st; i++) /* takes each sampled draw's random number */
        if (!samp_device_row(dec[i]->samp, &rows[i])) st = g5_fail(&e, G5_ERR_INTERNAL, "device draw refused");
    if (!st) st = am ? rt_eng_decode_argmax(s->eng, sts, toks, k, pick, pick_l, &e)
                 : dv ? rt_eng_decode_draw(s->eng, sts, toks, k, rows, pick, &e)
                      : rt_eng_decode(s->eng, sts, toks, k, s->logits, &e);
    if (st != G5_OK) {
        pthread_mutex_lock(&s->mu);
        for (uint32_t i = 0; i < k; i++) retire_locked(s, dec[i], NULL, s->gpu && st == G5_ERR_NOMEM ? 503 : 500, e.msg);
        pthread_mutex_unlock(&s->mu);
        return;
    }
    for (uint32_t i = 0; i < k; i++) {
        dec[i]->n_past++;
        dec[i]->feed_off++;
    }
    s->device_draw_pending += dv;
    if (am || dv) { /* the tokens are known: each sequence's pick, then one publish for all */
        const double t0 = srv_now();
        for (uint32_t i = 0; i < k; i++) /* dv: -1 when no logit is > -inf */
            draw_pick(s, dec[i], NULL, pick[i], am ? pick_l[i] : pick[i] >= 0 ? 0.0f : NAN, &drawn[i]);
        draw_publish_many(s, dec, drawn, k);
        s->draw_pending += srv_now() - t0;
    } else {
        draw_many(s, dec, k, s->logits, drawn);
    }
}

/* No draft when it cannot be used: the context has no room for it, or the next token is the
 * request's last. */
static int want_draft(const srv_server *s, const srv_req *r) {
    return (uint64_t)r->n_past + 2 <= s->max_ctx && r->n_out + 1 < r->p.max_tokens;
}

/* --draft mtp: one step of the n decoding sequences in dec. A sequence whose token is its
 * pending draft (accepted) has the logits after it already and draws at once; then the MTP
 * blocks of all draft the token after each one's newest in one batched call
 * (rt_drafter_begin_many), and all are verified in one batched call of [token, draft] rows
 * (rt_eng_decode_rows); each then draws from its first row
 * (speculative sampling against the draft), the second row waiting for the next step. */
static void decode_step_mtp(srv_server *s, srv_req **dec, uint32_t n, rt_eng_seq **sts, int32_t *toks, uint32_t *nt) {
    const uint32_t V = rt_eng_hparams(s->eng)->n_vocab, E = rt_eng_hparams(s->eng)->n_embd;
    g5_error e = {0};
    for (uint32_t i = 0; i < n; i++) { /* accepted drafts */
        srv_req *r = dec[i];
        int32_t x;
        pthread_mutex_lock(&s->mu);
        const int live = is_live_locked(r);
        pthread_mutex_unlock(&s->mu);
        if (!live || !r->dr || !rt_drafter_draft(r->dr, &x) || x != r->feed[r->feed_off]) continue;
        const float *ready = NULL;
        int32_t two[2];
        uint32_t nv = 0;
        g5_status st = rt_drafter_begin(r->dr, x, 0, &ready, two, &nv, &e);
        if (st == G5_OK && !ready) st = g5_fail(&e, G5_ERR_INTERNAL, "draft: an accepted draft without its logits");
        pthread_mutex_lock(&s->mu);
        if (st == G5_OK) s->draft_accepted++;
        else retire_locked(s, r, NULL, 500, e.msg);
        pthread_mutex_unlock(&s->mu);
        if (st != G5_OK) continue;
        r->n_past++;
        r->feed_off++;
        draw(s, r, ready, -1, 0);
    }
    pthread_mutex_lock(&s->mu);
    for (uint32_t i = 0; i < n; i++)
        if (is_live_locked(dec[i])) (void)reserve_locked(s, dec[i], dec[i]->n_past + 1 + want_draft(s, dec[i]));
    uint32_t k = 0; /* a reservation may have preempted or retired sequences reserved before it */
    for (uint32_t i = 0; i < n; i++)
        if (is_live_locked(dec[i])) dec[k++] = dec[i];
    pthread_mutex_unlock(&s->mu);
    if (!k) return;
    uint32_t rows = 0, drafted = 0;
    /* every drafter's MTP call in one batched call, then every verification in another */
    rt_drafter **drs = malloc(k * sizeof *drs);
    int32_t *ys = malloc(k * sizeof *ys);
    int *want = malloc(k * sizeof *want);
    const float **ready = malloc(k * sizeof *ready);
    g5_status st = drs && ys && want && ready ? G5_OK : g5_fail(&e, G5_ERR_NOMEM, "MTP step of %u sequences", k);
    for (uint32_t i = 0; i < k && !st; i++) {
        srv_req *r = dec[i];
        sts[i] = s->gpu ? srv_slots_seq(s->gpu, r->gslot) : r->st;
        if (!sts[i] || !r->dr) st = g5_fail(&e, G5_ERR_INTERNAL, "GPU slot %d is not in use, or no drafter", r->gslot);
        drs[i] = r->dr;
        ys[i] = r->feed[r->feed_off];
        want[i] = want_draft(s, r);
    }
    if (!st) st = rt_drafter_begin_many(drs, k, ys, want, ready, toks, nt, &e);
    for (uint32_t i = 0; i < k && !st; i++) {
        if (ready[i] || !nt[i]) st = g5_fail(&e, G5_ERR_INTERNAL, "draft: a verified draft twice");
        if (!st && s->gpu && (uint64_t)rt_eng_seq_n_past(sts[i]) + nt[i] > s->max_ctx)
            st = g5_fail(&e, G5_ERR_BOUNDS, "sequence of %u + %u tokens exceeds the context %u", rt_eng_seq_n_past(sts[i]),
                         nt[i], s->max_ctx);
        rows += nt[i];
        drafted += nt[i] == 2;
    }
    free(drs);
    free(ys);
    free(want);
    free(ready);
    if (!st) st = rt_eng_decode_rows(s->eng, sts, nt, k, toks, &(rt_eng_out){.logits = s->logits, .hidden = s->hidden}, &e);
    for (uint32_t i = 0, r0 = 0; i < k && !st; r0 += nt[i++])
        st = rt_drafter_end(dec[i]->dr, s->logits + (size_t)r0 * V, s->hidden + (size_t)r0 * E, &e);
    if (st != G5_OK) { /* the drafters cannot be trusted any more: every sequence of the step fails */
        pthread_mutex_lock(&s->mu);
        for (uint32_t i = 0; i < k; i++) retire_locked(s, dec[i], NULL, s->gpu && st == G5_ERR_NOMEM ? 503 : 500, e.msg);
        pthread_mutex_unlock(&s->mu);
        return;
    }
    pthread_mutex_lock(&s->mu);
    s->draft_proposed += drafted;
    pthread_mutex_unlock(&s->mu);
    for (uint32_t i = 0, r0 = 0; i < k; r0 += nt[i++]) {
        dec[i]->n_past++;
        dec[i]->feed_off++;
        draw(s, dec[i], s->logits + (size_t)r0 * V, -1, 0);
    }
}

static void *engine_main(void *arg) {
    srv_server *s = arg;
    const size_t mb = s->cfg.max_batch;
    srv_req **batch = malloc(mb * sizeof *batch), **dec = malloc(mb * sizeof *dec);
    rt_eng_seq **sts = malloc(mb * sizeof *sts);
    int32_t *toks = malloc(2 * mb * sizeof *toks); /* --draft mtp: two rows per sequence */
    uint32_t *ntok = malloc(mb * sizeof *ntok);
    int32_t *pick = malloc(mb * sizeof *pick); /* a greedy step's ids and logits (decode_step) */
    float *pick_l = malloc(mb * sizeof *pick_l);
    samp_dev_row *rows = malloc(mb * sizeof *rows); /* a device-drawn step's draws */
    srv_drawn *drawn = malloc(mb * sizeof *drawn); /* a step's draws before they are published */
    const int ok = batch && dec && sts && toks && ntok && pick && pick_l && rows && drawn;
    pthread_mutex_lock(&s->mu);
    while (!s->stopping) {
        if (s->load != SRV_READY || !ok) {
            pthread_cond_wait(&s->engine_cv, &s->mu);
            continue;
        }
        reap_locked(s);
        admit_locked(s);
        if (s->n_running == 0) {
            pthread_cond_wait(&s->engine_cv, &s->mu);
            continue;
        }
        uint32_t n = s->n_running, nd = 0;
        int beside = 0; /* a prompt part way through its chunks waits for this step */
        memcpy(batch, s->running, n * sizeof *batch);
        /* The step loop holds a reference to each: a step may retire or preempt another. */
        for (uint32_t i = 0; i < n; i++) {
            batch[i]->refs++;
            if (batch[i]->n_feed - batch[i]->feed_off == 1) dec[nd++] = batch[i];
            beside |= batch[i]->mid_prompt;
        }
        pthread_mutex_unlock(&s->mu);
        const double t0 = srv_now();
        if (nd && s->draft) decode_step_mtp(s, dec, nd, sts, toks, ntok);
        else if (nd) decode_step(s, dec, nd, sts, toks, pick, pick_l, rows, drawn);
        const double t1 = srv_now();
        for (uint32_t i = 0; i < n; i++)
            if (batch[i]->n_feed - batch[i]->feed_off > 1) prefill_step(s, batch[i]);
        const double t2 = srv_now();
        pthread_mutex_lock(&s->mu);
        if (nd && beside) s->decode_steps_beside_prefill++;
        s->decode_steps += nd > 0;
        s->decode_seconds += t1 - t0;
        s->prefill_seconds += t2 - t1;
        s->draw_seconds += s->draw_pending;
        s->draw_pending = 0;
        s->device_draw_steps += s->device_draw_pending;
        s->device_draw_pending = 0;
        for (uint32_t i = 0; i < n; i++)
            if (req_unref_locked(batch[i])) req_destroy(batch[i]);
    }
    /* Shutting down: every queued or running request ends with an error. */
    while (s->n_running) retire_locked(s, s->running[0], NULL, 503, "the server is shutting down");
    while (s->n_waiting) {
        srv_req *r = s->waiting[0];
        waiting_remove_at(s, 0);
        req_drop_engine_locked(s, r);
        finish_locked(s, r, NULL, 503, "the server is shutting down");
        if (req_unref_locked(r)) req_destroy(r);
    }
    pthread_mutex_unlock(&s->mu);
    free(batch);
    free(dec);
    free(sts);
    free(toks);
    free(ntok);
    free(pick);
    free(pick_l);
    free(rows);
    free(drawn);
    return NULL;
}

g5_status srv_engine_start(srv_server *s, g5_error *err) {
    s->cap_waiting = s->cfg.max_queue + s->cfg.max_batch + 1;
    s->waiting = calloc(s->cap_waiting, sizeof *s->waiting);
    s->running = calloc(s->cfg.max_batch, sizeof *s->running);
    if (!s->waiting || !s->running) return g5_fail(err, G5_ERR_NOMEM, "request queues");
    uint32_t nd = s->cfg.draw_threads;
    if (!nd) {
        const long nc = sysconf(_SC_NPROCESSORS_ONLN);
        nd = nc >= 16 ? 8 : nc >= 2 ? (uint32_t)(nc / 2) : 1;
    }
    g5_status st = rt_pool_create(nd, &s->draws, err);
    if (st) {
        g5_error_prefix(err, "draw threads");
        return st;
    }
    if (pthread_create(&s->engine, NULL, engine_main, s) != 0)
        return g5_fail(err, G5_ERR_INTERNAL, "cannot start the engine thread");
    s->engine_started = 1;
    if (pthread_create(&s->loader, NULL, loader_main, s) != 0)
        return g5_fail(err, G5_ERR_INTERNAL, "cannot start the loader thread");
    s->loader_started = 1;
    return G5_OK;
}

void srv_engine_stop(srv_server *s) {
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_broadcast(&s->engine_cv);
    pthread_mutex_unlock(&s->mu);
    if (s->engine_started) pthread_join(s->engine, NULL);
    s->engine_started = 0;
    rt_pool_free(s->draws);
    s->draws = NULL;
    if (s->loader_started) pthread_join(s->loader, NULL);
    s->loader_started = 0;
}

srv_load_state srv_get_load_state(const srv_server *s, g5_error *err) {
    srv_server *w = (srv_server *)s;
    pthread_mutex_lock(&w->mu);
    srv_load_state st = w->load;
    if (st == SRV_FAILED && err) *err = w->load_err;
    pthread_mutex_unlock(&w->mu);
    return st;
}

void srv_get_stats(srv_server *s, srv_stats *o) {
    memset(o, 0, sizeof *o);
    pthread_mutex_lock(&s->mu);
    o->running = s->n_running;
    o->waiting = s->n_waiting;
    o->peak_running = s->peak_running;
    if (s->blocks) {
        o->blocks_total = srv_blocks_n_total(s->blocks);
        o->blocks_in_use = o->blocks_total - srv_blocks_n_free(s->blocks);
        o->block_tokens = srv_blocks_block_tokens(s->blocks);
    }
    for (int i = 0; i < SRV_EP_COUNT; i++)
        for (int j = 0; j < SRV_CODE_SLOTS; j++) o->requests += s->n_requests[i][j];
    o->completions = s->n_completions;
    o->cancelled = s->n_cancelled;
    o->preemptions = s->n_preemptions;
    o->prompt_tokens = s->prompt_tokens;
    o->generated_tokens = s->generated_tokens;
    o->prefix_query_tokens = s->prefix_query_tokens;
    o->prefix_hit_tokens = s->prefix_hit_tokens;
    o->draft_proposed = s->draft_proposed;
    o->draft_accepted = s->draft_accepted;
    o->prefill_chunks = s->prefill_chunks;
    o->decode_steps_beside_prefill = s->decode_steps_beside_prefill;
    o->decode_steps = s->decode_steps;
    o->device_draw_steps = s->device_draw_steps;
    o->decode_seconds = s->decode_seconds;
    o->prefill_seconds = s->prefill_seconds;
    o->draw_seconds = s->draw_seconds;
    o->load_seconds = s->load_seconds;
    o->load_bytes = s->load_bytes;
    pthread_mutex_unlock(&s->mu);
}
