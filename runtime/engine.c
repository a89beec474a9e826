/* The engine (engine.h): the device-independent half and the CPU implementation over the CPU
 * model's rt_model / rt_state (runtime/cpu/model.h). The CUDA implementation is engine_gpu.c. */
#include "runtime/engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "format/blob.h"
#include "runtime/engine_int.h"

void rt_eng_opts_default(rt_eng_opts *o) {
    memset(o, 0, sizeof *o);
    o->device = RT_ENG_CPU;
    o->mla = RT_MLA_ABSORBED;
    o->verify = 1;
}

int rt_eng_cuda_available(void) { return rt_eng_gpu_ops() != NULL; }

/* ---- the CPU implementation ---- */

static g5_status cpu_create(rt_eng *e, g5_error *err) {
    g5_status st = G5_OK;
    if (e->o.kv_blocks) st = rt_kvpool_create(e->m, e->o.kv_blocks, e->o.kv_block_tokens, &e->pool, err);
    if (!st && e->pool && e->o.kv_prefix_cache) st = rt_kvpool_enable_prefix(e->pool, err);
    if (!st && e->pool && e->o.kv_prefix_cache && e->o.kv_prefix_hidden) st = rt_kvpool_keep_hidden(e->pool, err);
    return st;
}

static void cpu_destroy(rt_eng *e) {
    rt_kvpool_free(e->pool);
    e->pool = NULL;
    free(e->states);
    e->states = NULL;
}

static void cpu_describe(const rt_eng *e, char *buf, size_t cap) {
    (void)e;
    if (cap) buf[0] = 0;
}

static uint64_t cpu_zero(const rt_eng *e) {
    (void)e;
    return 0;
}

static uint64_t cpu_seq_bytes(const rt_eng *e, uint32_t positions) {
    (void)e, (void)positions;
    return 0;
}

static int cpu_check_result(const rt_eng *e, rt_eng_check_result *out) {
    (void)e, (void)out;
    return 0;
}

static g5_status cpu_seq_create(rt_eng_seq *s, uint32_t reserve, g5_error *err) {
    rt_state *st = NULL;
    g5_status r = s->e->pool ? rt_state_create_paged(s->e->m, s->e->pool, &st, err) : rt_state_create(s->e->m, &st, err);
    if (!r && reserve) r = rt_state_reserve(st, reserve, err);
    if (r) {
        rt_state_free(st);
        return r;
    }
    s->dev = st;
    return G5_OK;
}

static void cpu_seq_free(rt_eng_seq *s) { rt_state_free(s->dev); }
static void cpu_seq_reset(rt_eng_seq *s) { rt_state_reset(s->dev); }
static uint32_t cpu_n_past(const rt_eng_seq *s) { return rt_state_n_past(s->dev); }
static uint32_t cpu_mtp_n_past(const rt_eng_seq *s) { return rt_state_mtp_n_past(s->dev); }
static g5_status cpu_reserve(rt_eng_seq *s, uint32_t n, g5_error *err) { return rt_state_reserve(s->dev, n, err); }
static uint32_t cpu_n_blocks(const rt_eng_seq *s) { return rt_state_n_blocks(s->dev); }

static g5_status cpu_truncate(rt_eng_seq *s, uint32_t n_past, uint32_t mtp_n_past, g5_error *err) {
    return rt_state_truncate(s->dev, n_past, mtp_n_past, err);
}

static g5_status cpu_prefill(rt_eng_seq *s, const int32_t *tokens, uint32_t n, const rt_eng_out *out,
                             g5_error *err) {
    const rt_outputs ro = {.logits = out ? out->logits : NULL,
                           .all_logits = out ? out->all_logits : 0,
                           .hidden = out ? out->hidden : NULL};
    return rt_model_forward(s->e->m, s->dev, tokens, n, &ro, err);
}

/* e->states[0 .. n_seq) = the sequences' CPU states (the array grows as needed). */
static g5_status gather_states(rt_eng *e, rt_eng_seq *const *seqs, uint32_t n_seq, g5_error *err) {
    if (n_seq > e->cap_states) {
        rt_state **b = realloc(e->states, (size_t)n_seq * sizeof *b);
        if (!b) return g5_fail(err, G5_ERR_NOMEM, "decode step of %u sequences", n_seq);
        e->states = b;
        e->cap_states = n_seq;
    }
    for (uint32_t i = 0; i < n_seq; i++) e->states[i] = seqs[i]->dev;
    return G5_OK;
}

static g5_status cpu_decode(rt_eng *e, rt_eng_seq *const *seqs, const int32_t *tokens, uint32_t n_seq,
                            float *logits, g5_error *err) {
    g5_status st = gather_states(e, seqs, n_seq, err);
    if (st) return st;
    return rt_model_forward_batch(e->m, e->states, tokens, n_seq, logits, err);
}

static g5_status cpu_decode_rows(rt_eng *e, rt_eng_seq *const *seqs, const uint32_t *n_tok, uint32_t n_seq,
                                 const int32_t *tokens, const rt_eng_out *out, g5_error *err) {
    g5_status st = gather_states(e, seqs, n_seq, err);
    if (st) return st;
    const rt_outputs ro = {.logits = out ? out->logits : NULL, .all_logits = 1, .hidden = out ? out->hidden : NULL};
    return rt_model_forward_rows(e->m, e->states, n_tok, n_seq, tokens, &ro, err);
}

static g5_status cpu_mtp(rt_eng_seq *s, const float *hidden, const int32_t *next, uint32_t n, float *draft, int all,
                         g5_error *err) {
    return rt_model_mtp(s->e->m, s->dev, hidden, next, n, draft, all, err);
}

static const rt_eng_ops cpu_ops = {
    .create = cpu_create,
    .destroy = cpu_destroy,
    .describe = cpu_describe,
    .load_bytes = cpu_zero,
    .seq_bytes = cpu_seq_bytes,
    .check_result = cpu_check_result,
    .seq_create = cpu_seq_create,
    .seq_free = cpu_seq_free,
    .seq_reset = cpu_seq_reset,
    .n_past = cpu_n_past,
    .mtp_n_past = cpu_mtp_n_past,
    .reserve = cpu_reserve,
    .n_blocks = cpu_n_blocks,
    .truncate = cpu_truncate,
    .prefill = cpu_prefill,
    .decode = cpu_decode,
    .decode_rows = cpu_decode_rows,
    .mtp = cpu_mtp,
};

/* ---- the engine ---- */

g5_status rt_eng_create(const rt_wset *ws, const rt_eng_opts *o, rt_eng **out, g5_error *err) {
    *out = NULL;
    rt_eng_opts def;
    if (!o) {
        rt_eng_opts_default(&def);
        o = &def;
    }
    const rt_eng_ops *ops = o->device == RT_ENG_CPU ? &cpu_ops : o->device == RT_ENG_CUDA ? rt_eng_gpu_ops() : NULL;
    if (o->device == RT_ENG_CUDA && !ops)
        return g5_fail(err, G5_ERR_UNSUPPORTED, "this build has no CUDA: use the CUDA build (build/gpu/bin, make gpu)");
    if (!ops) return g5_fail(err, G5_ERR_INVALID_ARG, "device %d", (int)o->device);
    if ((o->prefix_block_tokens || o->prefix_cache_bytes) && o->device != RT_ENG_CUDA)
        return g5_fail(err, G5_ERR_INVALID_ARG, "a prefix store of %llu bytes in blocks of %u tokens (CUDA only; the "
                       "CPU's prefix cache is the shared pool's)", (unsigned long long)o->prefix_cache_bytes,
                       o->prefix_block_tokens);
    if (o->kv_blocks && (o->device != RT_ENG_CPU || !o->kv_block_tokens))
        return g5_fail(err, G5_ERR_INVALID_ARG, "a shared cache pool of %u blocks of %u tokens (CPU only)", o->kv_blocks,
                       o->kv_block_tokens);
    rt_eng *e = calloc(1, sizeof *e);
    if (!e) return g5_fail(err, G5_ERR_NOMEM, "engine");
    e->o = *o;
    e->ws = ws;
    e->ops = ops;
    const rt_model_opts mo = {.n_threads = o->n_threads, .mla = o->mla, .comm = o->comm};
    g5_status st = rt_model_create(ws, &mo, &e->m, err);
    if (st) {
        rt_eng_free(e);
        return st;
    }
    *out = e;
    return G5_OK;
}

g5_status rt_eng_open(const char *path, const rt_eng_opts *o, rt_eng **out, g5_error *err) {
    *out = NULL;
    rt_wset *ws = NULL;
    rt_comm *comm = o ? o->comm : NULL;
    g5_status st;
    if (rt_comm_size(comm) <= 1) {
        st = rt_wset_open(path, &ws, err);
    } else {
        /* this process's ranks of a blob set (a GGUF is one rank: it cannot be divided) */
        struct stat sb;
        blob_set_record rec = {0};
        uint32_t first = 0, count = 0;
        if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
            return g5_fail(err, G5_ERR_INVALID_ARG, "%s is not a blob set: a GGUF is one rank and %u processes need "
                           "at least %u", path, rt_comm_size(comm), rt_comm_size(comm));
        if ((st = blob_set_record_read(path, &rec, err))) return st;
        const uint32_t T = rec.tp;
        blob_set_record_clear(&rec);
        if ((st = rt_comm_ranks(comm, T, &first, &count, err))) return st;
        st = rt_wset_open_blobs_ranks(path, first, count, &ws, err);
    }
    if (st) return st;
    if ((st = rt_eng_create(ws, o, out, err))) {
        rt_wset_free(ws);
        return st;
    }
    (*out)->own_ws = ws;
    if ((st = rt_eng_load(*out, err))) {
        rt_eng_free(*out);
        *out = NULL;
    }
    return st;
}

g5_status rt_eng_load(rt_eng *e, g5_error *err) {
    if (e->loaded) return G5_OK;
    g5_status st = e->ops->create(e, err);
    if (st) e->ops->destroy(e); /* whatever the failed create left */
    else e->loaded = 1;
    return st;
}

void *rt_eng_host_alloc(const rt_eng *e, size_t bytes) {
    if (e->ops->host_alloc) return e->ops->host_alloc(bytes);
    return malloc(bytes ? bytes : 1);
}

void rt_eng_host_free(const rt_eng *e, void *p) {
    if (!p) return;
    if (e->ops->host_free) e->ops->host_free(p);
    else free(p);
}

void rt_eng_free(rt_eng *e) {
    if (!e) return;
    if (e->loaded) e->ops->destroy(e);
    rt_model_free(e->m);
    rt_wset_free(e->own_ws);
    free(e);
}

rt_eng_device rt_eng_device_of(const rt_eng *e) { return e->o.device; }
const glm5_hparams *rt_eng_hparams(const rt_eng *e) { return rt_model_hparams(e->m); }
const rt_wset *rt_eng_wset(const rt_eng *e) { return e->ws; }
uint32_t rt_eng_n_ranks(const rt_eng *e) { return rt_model_n_ranks(e->m); }
uint32_t rt_eng_n_threads(const rt_eng *e) { return rt_model_n_threads(e->m); }
int rt_eng_has_mtp(const rt_eng *e) { return rt_model_has_mtp(e->m); }
void rt_eng_describe(const rt_eng *e, char *buf, size_t cap) {
    if (e->loaded) e->ops->describe(e, buf, cap);
    else if (cap) buf[0] = 0;
}
uint64_t rt_eng_load_bytes(const rt_eng *e) { return e->loaded ? e->ops->load_bytes(e) : 0; }
uint64_t rt_eng_seq_bytes(const rt_eng *e, uint32_t positions) { return e->loaded ? e->ops->seq_bytes(e, positions) : 0; }
int rt_eng_check_result_get(const rt_eng *e, rt_eng_check_result *out) {
    return e->loaded ? e->ops->check_result(e, out) : 0;
}

uint32_t rt_eng_pool_n_blocks(const rt_eng *e) { return e->pool ? rt_kvpool_n_blocks(e->pool) : 0; }
uint32_t rt_eng_pool_n_free(const rt_eng *e) { return e->pool ? rt_kvpool_n_free(e->pool) : 0; }
uint32_t rt_eng_pool_block_tokens(const rt_eng *e) { return e->pool ? rt_kvpool_block_tokens(e->pool) : 0; }
void rt_eng_prefix_get_info(const rt_eng *e, rt_eng_prefix_info *out) {
    memset(out, 0, sizeof *out);
    if (!e->loaded) return;
    if (e->ops->prefix_info) {
        e->ops->prefix_info(e, out);
    } else if (e->pool && e->o.kv_prefix_cache) {
        out->on = 1;
        out->block_tokens = rt_kvpool_block_tokens(e->pool);
        out->n_blocks = rt_kvpool_n_blocks(e->pool);
        out->n_cached = rt_kvpool_n_cached(e->pool);
        out->n_evicted = rt_kvpool_n_evicted(e->pool);
    }
}

uint32_t rt_eng_pool_n_cached(const rt_eng *e) {
    rt_eng_prefix_info pi;
    rt_eng_prefix_get_info(e, &pi);
    return pi.n_cached;
}

uint64_t rt_eng_pool_n_evicted(const rt_eng *e) {
    rt_eng_prefix_info pi;
    rt_eng_prefix_get_info(e, &pi);
    return pi.n_evicted;
}

g5_status rt_eng_seq_attach_prefix(rt_eng_seq *s, const int32_t *tokens, uint32_t n, uint32_t *n_reused,
                                   g5_error *err) {
    *n_reused = 0;
    if (s->e->ops->attach) return s->e->ops->attach(s, tokens, n, n_reused, err);
    if (!s->e->pool || !s->e->o.kv_prefix_cache) return G5_OK;
    return rt_state_attach_prefix(s->dev, tokens, n, n_reused, err);
}

g5_status rt_eng_seq_publish_prefix(rt_eng_seq *s, const int32_t *tokens, g5_error *err) {
    if (s->e->ops->publish) return s->e->ops->publish(s, tokens, err);
    if (!s->e->pool || !s->e->o.kv_prefix_cache) return G5_OK;
    return rt_state_publish_prefix(s->dev, tokens, err);
}

g5_status rt_eng_seq_hidden(const rt_eng_seq *s, uint32_t p0, uint32_t n, float *out, g5_error *err) {
    if (s->e->o.device == RT_ENG_CUDA && s->e->o.kv_prefix_hidden) {
        if ((uint64_t)p0 + n > s->n_hid)
            return g5_fail(err, G5_ERR_BOUNDS, "hidden states of positions %u..%u: %u recorded", p0, p0 + n - 1,
                           s->n_hid);
        const size_t E = rt_eng_hparams(s->e)->n_embd;
        if (n) memcpy(out, s->hid + (size_t)p0 * E, (size_t)n * E * sizeof *out);
        return G5_OK;
    }
    if (s->e->o.device != RT_ENG_CPU || !s->e->pool || !s->e->o.kv_prefix_hidden)
        return g5_fail(err, G5_ERR_UNSUPPORTED, "hidden states of positions %u..: not kept (opts.kv_prefix_hidden)", p0);
    return rt_state_hidden(s->dev, p0, n, out, err);
}

g5_status rt_eng_seq_create(rt_eng *e, uint32_t reserve, rt_eng_seq **out, g5_error *err) {
    *out = NULL;
    if (!e->loaded) return g5_fail(err, G5_ERR_INVALID_ARG, "engine: a sequence before rt_eng_load");
    rt_eng_seq *s = calloc(1, sizeof *s);
    if (!s) return g5_fail(err, G5_ERR_NOMEM, "sequence");
    s->e = e;
    g5_status st = e->ops->seq_create(s, reserve, err);
    if (st) {
        free(s);
        return st;
    }
    *out = s;
    return G5_OK;
}

void rt_eng_seq_free(rt_eng_seq *s) {
    if (!s) return;
    s->e->ops->seq_free(s);
    free(s->hid);
    free(s);
}

void rt_eng_seq_reset(rt_eng_seq *s) {
    s->e->ops->seq_reset(s);
    s->n_exact = 0;
    s->n_hid = 0;
}
rt_eng *rt_eng_seq_engine(const rt_eng_seq *s) { return s->e; }
uint32_t rt_eng_seq_n_past(const rt_eng_seq *s) { return s->e->ops->n_past(s); }
uint32_t rt_eng_seq_mtp_n_past(const rt_eng_seq *s) { return s->e->ops->mtp_n_past(s); }
uint32_t rt_eng_seq_n_blocks(const rt_eng_seq *s) { return s->e->ops->n_blocks(s); }

g5_status rt_eng_seq_reserve(rt_eng_seq *s, uint32_t n_tokens, g5_error *err) {
    return s->e->ops->reserve(s, n_tokens, err);
}

g5_status rt_eng_truncate(rt_eng_seq *s, uint32_t n_past, uint32_t mtp_n_past, g5_error *err) {
    const g5_status st = s->e->ops->truncate(s, n_past, mtp_n_past, err);
    if (!st && s->n_hid > n_past) s->n_hid = n_past;
    if (!st && s->n_exact > n_past) { /* the blocks before n_past stay as they were written */
        const uint32_t bt = s->e->o.prefix_block_tokens;
        s->n_exact = bt ? n_past / bt * bt : 0;
    }
    return st;
}

g5_status rt_eng_prefill(rt_eng_seq *s, const int32_t *tokens, uint32_t n, const rt_eng_out *out,
                         g5_error *err) {
    return s->e->ops->prefill(s, tokens, n, out, err);
}

/* G5_OK if every one of seqs is e's. */
static g5_status own_seqs(const rt_eng *e, rt_eng_seq *const *seqs, uint32_t n_seq, g5_error *err) {
    for (uint32_t i = 0; i < n_seq; i++)
        if (seqs[i]->e != e) return g5_fail(err, G5_ERR_INVALID_ARG, "decode: sequence %u is another engine's", i);
    return G5_OK;
}

g5_status rt_eng_decode(rt_eng *e, rt_eng_seq *const *seqs, const int32_t *tokens, uint32_t n_seq,
                        float *logits, g5_error *err) {
    const g5_status st = own_seqs(e, seqs, n_seq, err);
    return st ? st : e->ops->decode(e, seqs, tokens, n_seq, logits, err);
}

/* The host side of the decode forms that give tokens: decode's logits of the step into *lg
 * (malloc'ed, [n_seq][n_vocab]; the caller frees it, on failure too). */
static g5_status decode_to_host(rt_eng *e, rt_eng_seq *const *seqs, const int32_t *tokens, uint32_t n_seq, float **lg,
                                g5_error *err) {
    *lg = malloc((size_t)(n_seq ? n_seq : 1) * rt_eng_hparams(e)->n_vocab * sizeof **lg);
    if (!*lg) return g5_fail(err, G5_ERR_NOMEM, "logits of %u sequences", n_seq);
    return e->ops->decode(e, seqs, tokens, n_seq, *lg, err);
}

g5_status rt_eng_decode_argmax(rt_eng *e, rt_eng_seq *const *seqs, const int32_t *tokens, uint32_t n_seq,
                               int32_t *ids, float *logit, g5_error *err) {
    const g5_status so = own_seqs(e, seqs, n_seq, err);
    if (so) return so;
    if (e->ops->decode_argmax) return e->ops->decode_argmax(e, seqs, tokens, n_seq, ids, logit, err);
    const size_t V = rt_eng_hparams(e)->n_vocab;
    float *lg = NULL;
    const g5_status st = decode_to_host(e, seqs, tokens, n_seq, &lg, err);
    for (uint32_t i = 0; i < n_seq && !st; i++) { /* cuk_argmax's rule */
        const float *x = lg + i * V;
        int64_t best = -1;
        for (size_t j = 0; j < V; j++)
            if (x[j] == x[j] && (best < 0 || x[j] > x[best])) best = (int64_t)j;
        ids[i] = (int32_t)best;
        logit[i] = best < 0 ? NAN : x[best];
    }
    free(lg);
    return st;
}

g5_status rt_eng_decode_draw(rt_eng *e, rt_eng_seq *const *seqs, const int32_t *tokens, uint32_t n_seq,
                             const samp_dev_row *rows, int32_t *ids, g5_error *err) {
    const g5_status so = own_seqs(e, seqs, n_seq, err);
    if (so) return so;
    if (!rows || !ids) return g5_fail(err, G5_ERR_INVALID_ARG, "decode_draw: no rows or ids");
    if (e->ops->decode_draw && rt_eng_draws_on_device(e))
        return e->ops->decode_draw(e, seqs, tokens, n_seq, rows, ids, err);
    const uint32_t V = rt_eng_hparams(e)->n_vocab;
    float *lg = NULL;
    const g5_status st = decode_to_host(e, seqs, tokens, n_seq, &lg, err);
    for (uint32_t i = 0; i < n_seq && !st; i++) ids[i] = samp_device_draw(&rows[i], lg + (size_t)i * V, V);
    free(lg);
    return st;
}

int rt_eng_draws_on_device(const rt_eng *e) { return e && e->ops->draws_on_device && e->ops->draws_on_device(e); }

g5_status rt_eng_decode_rows(rt_eng *e, rt_eng_seq *const *seqs, const uint32_t *n_tok, uint32_t n_seq,
                             const int32_t *tokens, const rt_eng_out *out, g5_error *err) {
    for (uint32_t i = 0; i < n_seq; i++) {
        if (seqs[i]->e != e) return g5_fail(err, G5_ERR_INVALID_ARG, "decode: sequence %u is another engine's", i);
        if (!n_tok[i]) return g5_fail(err, G5_ERR_INVALID_ARG, "decode: sequence %u has no tokens", i);
        for (uint32_t j = 0; j < i; j++)
            if (seqs[j] == seqs[i]) return g5_fail(err, G5_ERR_INVALID_ARG, "decode: rows %u and %u share a sequence", j, i);
    }
    if (e->ops->decode_rows) return e->ops->decode_rows(e, seqs, n_tok, n_seq, tokens, out, err);
    return rt_eng_decode_rows_each(e, seqs, n_tok, n_seq, tokens, out, err);
}

g5_status rt_eng_decode_rows_each(rt_eng *e, rt_eng_seq *const *seqs, const uint32_t *n_tok, uint32_t n_seq,
                                  const int32_t *tokens, const rt_eng_out *out, g5_error *err) {
    const uint32_t V = rt_eng_hparams(e)->n_vocab, E = rt_eng_hparams(e)->n_embd;
    uint32_t done = 0, r0 = 0;
    g5_status st = G5_OK;
    for (; done < n_seq; done++) {
        const rt_eng_out o = {.logits = out && out->logits ? out->logits + (size_t)r0 * V : NULL, .all_logits = 1,
                              .hidden = out && out->hidden ? out->hidden + (size_t)r0 * E : NULL};
        if ((st = e->ops->prefill(seqs[done], tokens + r0, n_tok[done], &o, err))) break;
        r0 += n_tok[done];
    }
    for (uint32_t i = 0; st && i < done; i++) { /* all or nothing: the calls that ran are undone */
        rt_eng_seq *q = seqs[i];
        g5_error e2 = {0};
        (void)rt_eng_truncate(q, e->ops->n_past(q) - n_tok[i], e->ops->mtp_n_past(q), &e2);
    }
    return st;
}

g5_status rt_eng_mtp_rows(rt_eng *e, rt_eng_seq *const *seqs, const uint32_t *n_tok, uint32_t n_seq,
                          const float *hidden, const int32_t *next_tokens, float *draft_logits, g5_error *err) {
    for (uint32_t i = 0; i < n_seq; i++) {
        if (seqs[i]->e != e) return g5_fail(err, G5_ERR_INVALID_ARG, "mtp: sequence %u is another engine's", i);
        if (!n_tok[i]) return g5_fail(err, G5_ERR_INVALID_ARG, "mtp: sequence %u has no pairs", i);
        for (uint32_t j = 0; j < i; j++)
            if (seqs[j] == seqs[i]) return g5_fail(err, G5_ERR_INVALID_ARG, "mtp: rows %u and %u share a sequence", j, i);
    }
    if (e->ops->mtp_rows) return e->ops->mtp_rows(e, seqs, n_tok, n_seq, hidden, next_tokens, draft_logits, err);
    return rt_eng_mtp_rows_each(e, seqs, n_tok, n_seq, hidden, next_tokens, draft_logits, err);
}

g5_status rt_eng_mtp_rows_each(rt_eng *e, rt_eng_seq *const *seqs, const uint32_t *n_tok, uint32_t n_seq,
                               const float *hidden, const int32_t *next, float *draft, g5_error *err) {
    const size_t V = rt_eng_hparams(e)->n_vocab, E = rt_eng_hparams(e)->n_embd;
    for (uint32_t i = 0, r0 = 0; i < n_seq; r0 += n_tok[i++]) {
        const g5_status st = e->ops->mtp(seqs[i], hidden + (size_t)r0 * E, next + r0, n_tok[i],
                                         draft ? draft + i * V : NULL, 0, err);
        if (st) return st;
    }
    return G5_OK;
}

g5_status rt_eng_mtp(rt_eng_seq *s, const float *hidden, const int32_t *next_tokens, uint32_t n,
                     float *draft_logits, int all_logits, g5_error *err) {
    return s->e->ops->mtp(s, hidden, next_tokens, n, draft_logits, all_logits, err);
}

int rt_eng_any_finite(const float *logits, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        if (isfinite(logits[i])) return 1;
    return 0;
}
