/* The engine's CUDA implementation (engine.h) over the GPU model (runtime/gpu/gpu_model.h). Built
 * for real only with G5_WITH_CUDA (cuda/model.mk compiles this file again for build/gpu); the CPU
 * build's copy says there is no CUDA implementation (rt_eng_gpu_ops() == NULL). */
#include "runtime/engine_int.h"

#ifdef G5_WITH_CUDA

#include <stdlib.h>
#include <string.h>

#include "runtime/cpu/kvcache.h"
#include "runtime/gpu/gpu_model.h"
#include "runtime/prefix.h"

typedef struct eng_gpu {
    rt_gpu_model *g;
    rt_gpu_check *chk;           /* --check (on the default sequence) */
    int def_taken;               /* the default sequence belongs to an rt_eng_seq */
    int blobs;                   /* loaded from a blob set (else copied from host memory) */
    rt_gpu_seq **batch;          /* [cap] decode step scratch */
    uint32_t cap;
    cuk_sample_row *drow;        /* [drow_cap] a draw step's rows (gpu_decode_draw) */
    uint32_t drow_cap;
    int32_t *dpen_ids;           /* [dpen_cap] its rows' penalty lists, one after another */
    uint32_t *dpen_counts;
    uint32_t dpen_cap;
    /* prefix caching (engine.h): the device store and its index, or NULL */
    rt_gpu_prefix *pfx;
    rt_pfx *idx;
    uint64_t pfx_block_bytes;    /* one block on one rank (with prefix_block_tokens) */
    float *slot_hid;             /* opts.kv_prefix_hidden: [slots][block tokens][n_embd] (host), the
                                    hidden states of each store block's positions (MTP drafting over
                                    an attached prefix: rt_eng_seq_hidden) */
} eng_gpu;

static rt_gpu_seq *gseq(const rt_eng_seq *s) { return s->dev; }

/* The prefix store of opts.prefix_cache_bytes per rank in whole blocks (none below one). */
static g5_status prefix_create(rt_eng *e, eng_gpu *x, g5_error *err) {
    const rt_eng_opts *o = &e->o;
    if (!o->prefix_block_tokens) return G5_OK;
    x->pfx_block_bytes = rt_gpu_prefix_block_bytes(x->g, o->prefix_block_tokens);
    if (!o->kv_prefix_cache || o->prefix_cache_bytes < x->pfx_block_bytes) return G5_OK;
    const uint32_t nb = rt_pfx_slots_for(o->prefix_cache_bytes, x->pfx_block_bytes);
    g5_status st = rt_gpu_prefix_create(x->g, o->prefix_block_tokens, nb, &x->pfx, err);
    if (!st) st = rt_pfx_create(nb, &x->idx, err);
    if (!st && o->kv_prefix_hidden) {
        uint64_t n;
        if (g5_mul_u64((uint64_t)nb * o->prefix_block_tokens, rt_eng_hparams(e)->n_embd * sizeof(float), &n) ||
            n > SIZE_MAX || !(x->slot_hid = malloc((size_t)n)))
            st = g5_fail(err, G5_ERR_NOMEM, "the hidden states of %u blocks of %u tokens (host)", nb,
                         o->prefix_block_tokens);
    }
    if (st) g5_error_prefix(err, "prefix cache (%llu MB per rank)", (unsigned long long)(o->prefix_cache_bytes >> 20));
    return st;
}

static g5_status gpu_create(rt_eng *e, g5_error *err) {
    eng_gpu *x = calloc(1, sizeof *x);
    if (!x) return g5_fail(err, G5_ERR_NOMEM, "GPU engine");
    e->dev = x;
    const rt_eng_opts *o = &e->o;
    rt_gpu_opts go;
    rt_gpu_opts_default(&go);
    go.device0 = o->gpu0;
    go.precision = o->precision == RT_ENG_FAST ? RT_GPU_FAST : RT_GPU_PRECISE;
    go.cache = o->cache == RT_ENG_CACHE_F32    ? RT_GPU_CACHE_F32
               : o->cache == RT_ENG_CACHE_BF16 ? RT_GPU_CACHE_BF16
               : o->cache == RT_ENG_CACHE_F16  ? RT_GPU_CACHE_F16
                                               : RT_GPU_CACHE_DEFAULT;
    go.load.verify = o->verify;
    go.cuda_graph = o->cuda_graph;
    go.h16_products = o->h16_products;
    go.collective = o->collective_nccl ? RT_GPU_COLL_NCCL : RT_GPU_COLL_AUTO;
    go.blobs = rt_wset_blobs(e->ws);
    x->blobs = go.blobs != NULL;
    g5_status st = rt_gpu_model_create(e->m, &go, &x->g, err);
    if (st) {
        g5_error_prefix(err, "GPU");
        return st;
    }
    if (o->check_tokens) {
        rt_gpu_check_opts co;
        rt_gpu_check_opts_default(&co);
        co.n_tokens = o->check_tokens;
        if (o->check_tol_stage > 0) co.tol_stage = o->check_tol_stage;
        if (o->check_tol_logits > 0) co.tol_logits = o->check_tol_logits;
        if (o->check_min_overlap > 0) co.min_overlap = o->check_min_overlap;
        co.stagewise = o->precision == RT_ENG_FAST;
        co.report = o->check_report;
        if ((st = rt_gpu_check_create(e->m, x->g, &co, &x->chk, err))) {
            g5_error_prefix(err, "check");
            return st;
        }
    }
    return prefix_create(e, x, err);
}

static void gpu_destroy(rt_eng *e) {
    eng_gpu *x = e->dev;
    if (!x) return;
    rt_pfx_free(x->idx);
    rt_gpu_prefix_free(x->pfx);
    free(x->slot_hid);
    rt_gpu_check_free(x->chk);
    rt_gpu_model_free(x->g);
    free(x->batch);
    free(x->drow);
    free(x->dpen_ids);
    free(x->dpen_counts);
    free(x);
    e->dev = NULL;
}

static void gpu_describe(const rt_eng *e, char *buf, size_t cap) {
    const eng_gpu *x = e->dev;
    const rt_gpu_info *gi = rt_gpu_model_info(x->g);
    snprintf(buf, cap,
             "GPU %s: %u rank%s on %u device%s (collective %s), %s, %s latent cache; weights %.3f GB in %.3f s "
             "(%.2f GB/s, %u reader threads, checksums %s, %llu O_DIRECT / %llu buffered reads)",
             gi->device_name, gi->n_ranks, gi->n_ranks > 1 ? "s" : "", gi->n_devices, gi->n_devices > 1 ? "s" : "",
             gi->collective, gi->precision, gi->cache, gi->load.bytes / 1e9, gi->load.seconds, gi->load.gb_per_s,
             gi->load.n_threads, x->blobs ? (gi->load.verified ? "verified" : "skipped") : "n/a (not a blob set)",
             (unsigned long long)gi->load.direct_reads, (unsigned long long)gi->load.buffered_reads);
}

static uint64_t gpu_load_bytes(const rt_eng *e) { return rt_gpu_model_info(((const eng_gpu *)e->dev)->g)->load.bytes; }

static uint64_t gpu_seq_bytes(const rt_eng *e, uint32_t positions) {
    return rt_gpu_seq_bytes(((const eng_gpu *)e->dev)->g, positions);
}

static int gpu_check_result(const rt_eng *e, rt_eng_check_result *out) {
    const eng_gpu *x = e->dev;
    if (!x->chk) return 0;
    rt_gpu_check_summary cs;
    rt_gpu_check_get_summary(x->chk, &cs);
    *out = (rt_eng_check_result){.ok = cs.ok, .n_tokens = cs.n_tokens, .max_stage_attn = cs.max_stage_attn,
                                 .max_stage_ffn = cs.max_stage_ffn, .max_layer = cs.max_layer,
                                 .logits_rel_l2 = cs.logits_rel_l2, .min_overlap_mean = cs.min_overlap_mean,
                                 .head_rel_l2 = cs.head_rel_l2, .mtp_rel_l2 = cs.mtp_rel_l2, .mtp_n = cs.mtp_n,
                                 .mtp_agree = cs.mtp_agree, .max_exp_diff = cs.max_exp_diff};
    return 1;
}

/* The first sequence is the GPU model's default one: what --check (rt_gpu_check_forward) runs. */
static g5_status gpu_seq_create(rt_eng_seq *s, uint32_t reserve, g5_error *err) {
    eng_gpu *x = s->e->dev;
    if (!x->def_taken) {
        rt_gpu_seq *d = rt_gpu_default_seq(x->g);
        rt_gpu_seq_reset(d);
        if (reserve) {
            g5_status st = rt_gpu_seq_reserve(d, reserve, err);
            if (st) return st;
        }
        x->def_taken = 1;
        s->def = 1;
        s->dev = d;
        return G5_OK;
    }
    rt_gpu_seq *q = NULL;
    g5_status st = rt_gpu_seq_create(x->g, reserve, &q, err);
    if (!st) s->dev = q;
    return st;
}

static void gpu_seq_free(rt_eng_seq *s) {
    eng_gpu *x = s->e->dev;
    if (s->def) {
        rt_gpu_seq_reset(gseq(s));
        x->def_taken = 0;
    } else {
        rt_gpu_seq_free(gseq(s));
    }
}

static void gpu_seq_reset(rt_eng_seq *s) {
    rt_gpu_seq_reset(gseq(s));
    s->n_exact = 0;
}
static uint32_t gpu_n_past(const rt_eng_seq *s) { return rt_gpu_seq_n_past(gseq(s)); }
static uint32_t gpu_mtp_n_past(const rt_eng_seq *s) { return rt_gpu_seq_mtp_n_past(gseq(s)); }

static g5_status gpu_reserve(rt_eng_seq *s, uint32_t n, g5_error *err) {
    if (n <= rt_gpu_seq_capacity(gseq(s))) return G5_OK;
    return rt_gpu_seq_reserve(gseq(s), n, err);
}

static uint32_t gpu_n_blocks(const rt_eng_seq *s) {
    (void)s;
    return 0;
}

static g5_status gpu_truncate(rt_eng_seq *s, uint32_t n_past, uint32_t mtp_n_past, g5_error *err) {
    return rt_gpu_seq_truncate(gseq(s), n_past, mtp_n_past, err);
}

/* One GPU call of tokens [0, n) at s's next positions. */
static g5_status gpu_call(rt_eng_seq *s, const int32_t *tokens, uint32_t n, const rt_eng_out *out, g5_error *err) {
    eng_gpu *x = s->e->dev;
    const rt_gpu_outputs go = {.logits = out ? out->logits : NULL,
                               .all_logits = out ? out->all_logits : 0,
                               .hidden = out ? out->hidden : NULL};
    if (s->def && x->chk) return rt_gpu_check_forward(x->chk, tokens, n, &go, err);
    const int any = out && (out->logits || out->hidden);
    return rt_gpu_forward_seq(x->g, gseq(s), tokens, n, any ? &go : NULL, err);
}

/* opts.kv_prefix_hidden: s->hid holds positions [0, need). */
static g5_status hid_room(rt_eng_seq *s, uint64_t need, g5_error *err) {
    if (need <= s->hid_cap) return G5_OK;
    const size_t E = rt_eng_hparams(s->e)->n_embd;
    uint64_t nc = s->hid_cap ? s->hid_cap : 256, bytes;
    while (nc < need) nc *= 2;
    if (nc > UINT32_MAX || g5_mul_u64(nc, E * sizeof(float), &bytes) || bytes > SIZE_MAX)
        return g5_fail(err, G5_ERR_OVERFLOW, "hidden states of %llu positions", (unsigned long long)need);
    float *h = realloc(s->hid, (size_t)bytes);
    if (!h) return g5_fail(err, G5_ERR_NOMEM, "hidden states of %llu positions", (unsigned long long)need);
    s->hid = h;
    s->hid_cap = (uint32_t)nc;
    return G5_OK;
}

/* gpu_prefill, and with opts.kv_prefix_hidden the call's hidden states recorded in s->hid (which
 * then extends n_hid where it follows it), the caller's copy taken from there. */
static g5_status gpu_prefill_blocks(rt_eng_seq *s, const int32_t *tokens, uint32_t n, const rt_eng_out *out,
                                    g5_error *err);
static g5_status gpu_prefill(rt_eng_seq *s, const int32_t *tokens, uint32_t n, const rt_eng_out *out,
                             g5_error *err) {
    if (!s->e->o.kv_prefix_hidden || !n) return gpu_prefill_blocks(s, tokens, n, out, err);
    const uint32_t p0 = rt_gpu_seq_n_past(gseq(s));
    const size_t E = rt_eng_hparams(s->e)->n_embd;
    g5_status st = hid_room(s, (uint64_t)p0 + n, err);
    if (st) return st;
    rt_eng_out o = out ? *out : (rt_eng_out){0};
    o.hidden = s->hid + (size_t)p0 * E;
    if ((st = gpu_prefill_blocks(s, tokens, n, &o, err))) return st;
    if (s->n_hid == p0) s->n_hid = p0 + n;
    if (out && out->hidden) memcpy(out->hidden, o.hidden, (size_t)n * E * sizeof(float));
    return G5_OK;
}

/* With opts.prefix_block_tokens (bt): the tokens in calls that end at the multiples of bt and at
 * the last one (engine.h, prefix caching: what makes a block's bits those of one call of exactly
 * its positions), each call's rows of the outputs in place; a call of exactly the block after
 * s->n_exact extends it. All or nothing: on failure s is truncated back. */
static g5_status gpu_prefill_blocks(rt_eng_seq *s, const int32_t *tokens, uint32_t n, const rt_eng_out *out,
                                    g5_error *err) {
    const uint32_t bt = s->e->o.prefix_block_tokens;
    if (!bt) return gpu_call(s, tokens, n, out, err);
    eng_gpu *x = s->e->dev;
    const glm5_hparams *hp = rt_eng_hparams(s->e);
    const uint32_t p0 = rt_gpu_seq_n_past(gseq(s)), m0 = rt_gpu_seq_mtp_n_past(gseq(s)), exact0 = s->n_exact;
    g5_status st = G5_OK;
    for (uint32_t done = 0; done < n && !st;) {
        const uint32_t p = p0 + done, len = rt_pfx_call_len(p, n - done, bt);
        const int last = done + len == n;
        rt_eng_out o = {0}, *op = NULL;
        if (out) {
            o.all_logits = out->all_logits;
            const size_t row = out->all_logits ? (size_t)done * hp->n_vocab : 0;
            o.logits = out->logits && (out->all_logits || last) ? out->logits + row : NULL;
            o.hidden = out->hidden ? out->hidden + (size_t)done * hp->n_embd : NULL;
            op = &o;
        }
        st = gpu_call(s, tokens + done, len, op, err);
        if (!st && !(s->def && x->chk)) s->n_exact = rt_pfx_exact_after(s->n_exact, p, len, bt);
        done += len;
    }
    if (st && rt_gpu_seq_n_past(gseq(s)) != p0) {
        g5_error e2 = {0};
        (void)rt_gpu_seq_truncate(gseq(s), p0, m0, &e2);
        s->n_exact = exact0;
    }
    return st;
}

/* ---- prefix caching (engine.h) ---- */

static g5_status gpu_attach(rt_eng_seq *s, const int32_t *tokens, uint32_t n, uint32_t *n_reused, g5_error *err) {
    eng_gpu *x = s->e->dev;
    const uint32_t bt = s->e->o.prefix_block_tokens;
    *n_reused = 0;
    if (!x->idx || n < 2 || (s->def && x->chk)) return G5_OK; /* --check's CPU side has no such prefix */
    if (rt_gpu_seq_n_past(gseq(s)) || rt_gpu_seq_mtp_n_past(gseq(s)))
        return g5_fail(err, G5_ERR_INVALID_ARG, "prefix cache: attach to a sequence of %u positions (it must be empty)",
                       rt_gpu_seq_n_past(gseq(s)));
    const uint32_t nb = rt_pfx_attach_max(n, bt);
    if (!nb) return G5_OK;
    uint64_t *h = malloc((size_t)nb * sizeof *h);
    uint32_t *slots = malloc((size_t)nb * sizeof *slots);
    g5_status st = h && slots ? G5_OK : g5_fail(err, G5_ERR_NOMEM, "prefix cache: %u blocks", nb);
    if (!st) {
        rt_kv_prefix_hashes(tokens, nb, bt, h);
        const uint32_t k = rt_pfx_find(x->idx, h, nb, slots);
        st = rt_gpu_prefix_load(x->pfx, gseq(s), slots, k, err);
        if (!st && x->slot_hid && k) { /* the blocks' hidden states (MTP drafting) */
            const size_t blk = (size_t)bt * rt_eng_hparams(s->e)->n_embd;
            st = hid_room(s, (uint64_t)k * bt, err);
            for (uint32_t j = 0; j < k && !st; j++)
                memcpy(s->hid + j * blk, x->slot_hid + (size_t)slots[j] * blk, blk * sizeof(float));
            if (st) {
                g5_error e2 = {0};
                (void)rt_gpu_seq_truncate(gseq(s), 0, 0, &e2);
            }
        }
        if (!st) {
            s->n_exact = k * bt;
            s->n_hid = x->slot_hid ? k * bt : 0;
            *n_reused = k * bt;
        }
    }
    free(h);
    free(slots);
    return st;
}

static g5_status gpu_publish(rt_eng_seq *s, const int32_t *tokens, g5_error *err) {
    eng_gpu *x = s->e->dev;
    const uint32_t bt = s->e->o.prefix_block_tokens;
    if (!x->idx) return G5_OK;
    uint32_t exact = s->n_exact, np = rt_gpu_seq_n_past(gseq(s));
    if (exact > np) exact = np / bt * bt;
    if (x->slot_hid && exact > s->n_hid) exact = s->n_hid / bt * bt; /* blocks with their hidden states */
    const uint32_t nb = exact / bt;
    if (!nb) return G5_OK;
    uint64_t *h = malloc((size_t)nb * sizeof *h);
    uint32_t *slots = malloc((size_t)nb * sizeof *slots);
    uint8_t *fresh = malloc(nb);
    g5_status st = h && slots && fresh ? G5_OK : g5_fail(err, G5_ERR_NOMEM, "prefix cache: %u blocks", nb);
    if (!st) {
        rt_kv_prefix_hashes(tokens, nb, bt, h);
        const uint32_t m = rt_pfx_insert(x->idx, h, nb, slots, fresh);
        for (uint32_t k = 0; k < m; k++) {
            if (!fresh[k]) continue;
            if (!st) st = rt_gpu_prefix_save(x->pfx, gseq(s), k, slots[k], err);
            if (!st && x->slot_hid) {
                const size_t blk = (size_t)bt * rt_eng_hparams(s->e)->n_embd;
                memcpy(x->slot_hid + (size_t)slots[k] * blk, s->hid + k * blk, blk * sizeof(float));
            }
            if (st) rt_pfx_drop(x->idx, slots[k]); /* not copied: never found */
        }
    }
    free(h);
    free(slots);
    free(fresh);
    return st;
}

static void gpu_prefix_info(const rt_eng *e, rt_eng_prefix_info *out) {
    const eng_gpu *x = e->dev;
    out->block_tokens = e->o.prefix_block_tokens;
    out->block_bytes = x->pfx_block_bytes;
    if (!x->idx) return;
    out->on = 1;
    out->n_blocks = rt_pfx_n_slots(x->idx);
    out->n_cached = rt_pfx_n_used(x->idx);
    out->n_evicted = rt_pfx_n_evicted(x->idx);
}

/* x->batch holds n_seq GPU sequences. */
static g5_status batch_room(eng_gpu *x, uint32_t n_seq, g5_error *err) {
    if (n_seq <= x->cap) return G5_OK;
    rt_gpu_seq **b = realloc(x->batch, (size_t)n_seq * sizeof *b);
    if (!b) return g5_fail(err, G5_ERR_NOMEM, "decode step of %u sequences", n_seq);
    x->batch = b;
    x->cap = n_seq;
    return G5_OK;
}

static g5_status gpu_decode(rt_eng *e, rt_eng_seq *const *seqs, const int32_t *tokens, uint32_t n_seq,
                            float *logits, g5_error *err) {
    eng_gpu *x = e->dev;
    const g5_status sr = batch_room(x, n_seq, err);
    if (sr) return sr;
    for (uint32_t i = 0; i < n_seq; i++) x->batch[i] = gseq(seqs[i]);
    return rt_gpu_forward_batch(x->g, x->batch, tokens, n_seq, logits, err);
}

static g5_status gpu_decode_argmax(rt_eng *e, rt_eng_seq *const *seqs, const int32_t *tokens, uint32_t n_seq,
                                   int32_t *ids, float *logit, g5_error *err) {
    eng_gpu *x = e->dev;
    const g5_status sr = batch_room(x, n_seq, err);
    if (sr) return sr;
    for (uint32_t i = 0; i < n_seq; i++) x->batch[i] = gseq(seqs[i]);
    const rt_gpu_outputs out = {.argmax = ids, .argmax_logit = logit, .all_logits = 1};
    return rt_gpu_forward_rows(x->g, x->batch, NULL, n_seq, tokens, &out, err);
}

/* x->drow holds n_seq rows and x->dpen_* np penalty entries (grown, never shrunk: no allocation
 * per step once the largest batch was seen). */
static g5_status draw_room(eng_gpu *x, uint32_t n_seq, uint32_t np, g5_error *err) {
    if (n_seq > x->drow_cap) {
        cuk_sample_row *r = realloc(x->drow, (size_t)n_seq * sizeof *r);
        if (!r) return g5_fail(err, G5_ERR_NOMEM, "draws of %u sequences", n_seq);
        x->drow = r;
        x->drow_cap = n_seq;
    }
    if (np > x->dpen_cap) {
        int32_t *i = realloc(x->dpen_ids, (size_t)np * sizeof *i);
        if (i) x->dpen_ids = i;
        uint32_t *c = i ? realloc(x->dpen_counts, (size_t)np * sizeof *c) : NULL;
        if (!c) return g5_fail(err, G5_ERR_NOMEM, "penalty lists of %u entries", np);
        x->dpen_counts = c;
        x->dpen_cap = np;
    }
    return G5_OK;
}

static g5_status gpu_decode_draw(rt_eng *e, rt_eng_seq *const *seqs, const int32_t *tokens, uint32_t n_seq,
                                 const samp_dev_row *rows, int32_t *ids, g5_error *err) {
    eng_gpu *x = e->dev;
    const g5_status sr = batch_room(x, n_seq, err);
    if (sr) return sr;
    uint32_t np = 0; /* the rows' penalty lists, one after another */
    for (uint32_t i = 0; i < n_seq; i++) np += rows[i].n_pen;
    const g5_status sd = draw_room(x, n_seq, np, err);
    if (sd) return sd;
    cuk_sample_row *cr = x->drow;
    int32_t *pi = x->dpen_ids;
    uint32_t *pc = x->dpen_counts;
    for (uint32_t i = 0, off = 0; i < n_seq; off += rows[i++].n_pen) {
        const samp_dev_row *d = &rows[i];
        x->batch[i] = gseq(seqs[i]);
        cr[i] = (cuk_sample_row){.temperature = d->temperature, .min_p = d->min_p, .top_p = d->top_p, .top_k = d->top_k,
                                 .lmin = d->lmin, .k = d->k, .repeat_penalty = d->repeat_penalty,
                                 .frequency_penalty = d->frequency_penalty, .presence_penalty = d->presence_penalty,
                                 .pen_off = off, .n_pen = d->n_pen};
        if (d->n_pen) {
            memcpy(pi + off, d->pen_ids, d->n_pen * sizeof *pi);
            memcpy(pc + off, d->pen_counts, d->n_pen * sizeof *pc);
        }
    }
    const rt_gpu_outputs out = {.draw = cr, .draw_ids = ids, .all_logits = 1, .draw_pen_ids = pi, .draw_pen_counts = pc,
                                .draw_n_pen = np};
    return rt_gpu_forward_rows(x->g, x->batch, NULL, n_seq, tokens, &out, err);
}

/* --check compares each step's logits: its draws stay on the host */
static int gpu_draws_on_device(const rt_eng *e) {
    const eng_gpu *x = e->dev;
    return x && !x->chk && rt_gpu_model_info(x->g)->draws;
}

static g5_status gpu_decode_rows(rt_eng *e, rt_eng_seq *const *seqs, const uint32_t *n_tok, uint32_t n_seq,
                                 const int32_t *tokens, const rt_eng_out *out, g5_error *err) {
    eng_gpu *x = e->dev;
    for (uint32_t i = 0; i < n_seq && x->chk; i++) /* --check follows its sequence's prefill calls */
        if (seqs[i]->def) return rt_eng_decode_rows_each(e, seqs, n_tok, n_seq, tokens, out, err);
    const g5_status sr = batch_room(x, n_seq, err);
    if (sr) return sr;
    for (uint32_t i = 0; i < n_seq; i++) x->batch[i] = gseq(seqs[i]);
    const rt_gpu_outputs go = {.logits = out ? out->logits : NULL, .all_logits = 1, .hidden = out ? out->hidden : NULL};
    return rt_gpu_forward_rows(x->g, x->batch, n_tok, n_seq, tokens, &go, err);
}

static g5_status gpu_mtp(rt_eng_seq *s, const float *hidden, const int32_t *next, uint32_t n, float *draft, int all,
                         g5_error *err) {
    return rt_gpu_mtp_seq(((eng_gpu *)s->e->dev)->g, gseq(s), hidden, next, n, draft, all, err);
}

/* The sequences of at most RT_ENG_MTP_ROWS pairs as one rows call, the others alone (a row's
 * bits then depend on its sequence's pair count, never on the batch). */
static g5_status gpu_mtp_rows(rt_eng *e, rt_eng_seq *const *seqs, const uint32_t *n_tok, uint32_t n_seq,
                              const float *hidden, const int32_t *next, float *draft, g5_error *err) {
    eng_gpu *x = e->dev;
    const size_t V = rt_eng_hparams(e)->n_vocab, E = rt_eng_hparams(e)->n_embd;
    uint32_t k = 0, rows = 0;
    for (uint32_t i = 0; i < n_seq; i++)
        if (n_tok[i] <= RT_ENG_MTP_ROWS) {
            rows += n_tok[i];
            k++;
        }
    if (k == n_seq) {
        const g5_status sr = batch_room(x, n_seq, err);
    if (sr) return sr;
        for (uint32_t i = 0; i < n_seq; i++) x->batch[i] = gseq(seqs[i]);
        return rt_gpu_mtp_rows(x->g, x->batch, n_tok, n_seq, hidden, next, draft, err);
    }
    /* mixed: gather the short ones' pairs, run them, spread their draft logits back */
    uint32_t *nt = malloc((size_t)(k ? k : 1) * sizeof *nt);
    float *hs = malloc((size_t)(rows ? rows : 1) * E * sizeof *hs);
    float *ds = draft ? malloc((k ? k : 1) * V * sizeof *ds) : NULL;
    int32_t *ns = malloc((size_t)(rows ? rows : 1) * sizeof *ns);
    g5_status st = nt && hs && ns && (ds || !draft) ? batch_room(x, k ? k : 1, err) : g5_fail(err, G5_ERR_NOMEM, "MTP rows");
    for (uint32_t i = 0, r0 = 0, j = 0, q = 0; i < n_seq && !st; r0 += n_tok[i++]) {
        if (n_tok[i] > RT_ENG_MTP_ROWS) {
            st = rt_gpu_mtp_seq(x->g, gseq(seqs[i]), hidden + (size_t)r0 * E, next + r0, n_tok[i],
                                draft ? draft + i * V : NULL, 0, err);
            continue;
        }
        x->batch[j] = gseq(seqs[i]);
        nt[j++] = n_tok[i];
        memcpy(hs + (size_t)q * E, hidden + (size_t)r0 * E, (size_t)n_tok[i] * E * sizeof *hs);
        memcpy(ns + q, next + r0, (size_t)n_tok[i] * sizeof *ns);
        q += n_tok[i];
    }
    if (!st && k) st = rt_gpu_mtp_rows(x->g, x->batch, nt, k, hs, ns, ds, err);
    for (uint32_t i = 0, j = 0; i < n_seq && !st && draft; i++)
        if (n_tok[i] <= RT_ENG_MTP_ROWS) memcpy(draft + i * V, ds + (size_t)j++ * V, V * sizeof *ds);
    free(nt);
    free(hs);
    free(ds);
    free(ns);
    return st;
}

static const rt_eng_ops gpu_ops = {
    .create = gpu_create,
    .destroy = gpu_destroy,
    .describe = gpu_describe,
    .load_bytes = gpu_load_bytes,
    .seq_bytes = gpu_seq_bytes,
    .check_result = gpu_check_result,
    .seq_create = gpu_seq_create,
    .seq_free = gpu_seq_free,
    .seq_reset = gpu_seq_reset,
    .n_past = gpu_n_past,
    .mtp_n_past = gpu_mtp_n_past,
    .reserve = gpu_reserve,
    .n_blocks = gpu_n_blocks,
    .truncate = gpu_truncate,
    .prefill = gpu_prefill,
    .decode = gpu_decode,
    .decode_argmax = gpu_decode_argmax,
    .decode_draw = gpu_decode_draw,
    .draws_on_device = gpu_draws_on_device,
    .decode_rows = gpu_decode_rows,
    .mtp = gpu_mtp,
    .mtp_rows = gpu_mtp_rows,
    .attach = gpu_attach,
    .publish = gpu_publish,
    .prefix_info = gpu_prefix_info,
    .host_alloc = rt_gpu_host_alloc,
    .host_free = rt_gpu_host_free,
};

const rt_eng_ops *rt_eng_gpu_ops(void) { return &gpu_ops; }

#else /* !G5_WITH_CUDA */

const rt_eng_ops *rt_eng_gpu_ops(void) { return NULL; }

#endif
