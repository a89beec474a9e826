/* glm5-shard convert: the streaming converter (see convert.h for the design). */
#include "convert/convert.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "convert/convert_int.h"
#include "convert/convert_test.h"
#include "format/blob_test.h"
#include "format/gguf_write.h"
#include "format/quant.h"

/* Rebuilt kv_b floats are written as raw float32 bytes, which is the on-disk (little-endian)
 * format only on a little-endian host. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the converter assumes a little-endian host");

#define WINDOW_BYTES (32ull << 20)   /* source bytes per queued window */
#define BUDGET_BYTES (256ull << 20)  /* source bytes queued between reader and writers */
#define QUEUE_CAP 256

/* ---- shared helpers (convert_int.h) ---- */

double convert_i_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

g5_status convert_i_select_rows(const shard_tensor *t, const shard_sel *s, const uint8_t *src,
                                uint64_t r0, uint64_t r1, convert_i_put put, void *ctx) {
    const uint64_t rb = t->row_bytes;
    g5_status st;
    if (s->b0 == 0 && s->b1 == rb) {
        for (uint64_t i = r0; i < r1;) {
            uint64_t m = i % t->period;
            if (m < s->lo) {
                i += s->lo - m;
                continue;
            }
            if (m >= s->hi) {
                i += t->period - m;
                continue;
            }
            uint64_t end = i + (s->hi - m);
            if (end > r1) end = r1;
            if ((st = put(ctx, src + (i - r0) * rb, (end - i) * rb))) return st;
            i = end;
        }
        return G5_OK;
    }
    for (uint64_t i = r0; i < r1; i++) {
        uint64_t m = i % t->period;
        if (m < s->lo || m >= s->hi) continue;
        if ((st = put(ctx, src + (i - r0) * rb + s->b0, s->b1 - s->b0))) return st;
    }
    return G5_OK;
}

g5_status convert_i_kvb_init(convert_i_kvb *k, const shard_plan *p, const shard_tensor *t, g5_error *err) {
    memset(k, 0, sizeof *k);
    const glm5_hparams *hp = &p->hp;
    k->n_elems = t->ne_local[0] * t->ne_local[1];
    uint64_t sc = (uint64_t)(hp->qk_nope > hp->v_head ? hp->qk_nope : hp->v_head) * hp->kv_lora;
    k->f32 = malloc(k->n_elems * sizeof(float));
    k->back = malloc(k->n_elems * sizeof(float));
    k->scratch = malloc(sc * sizeof(float));
    k->out = malloc(t->local_bytes);
    if (!k->f32 || !k->back || !k->scratch || !k->out) {
        convert_i_kvb_free(k);
        return g5_fail(err, G5_ERR_NOMEM, "kv_b buffers (%llu elements)", (unsigned long long)k->n_elems);
    }
    return G5_OK;
}

void convert_i_kvb_free(convert_i_kvb *k) {
    free(k->f32);
    free(k->back);
    free(k->scratch);
    free(k->out);
    memset(k, 0, sizeof *k);
}

g5_status convert_i_kvb_build(convert_i_kvb *k, const shard_plan *p, const shard_tensor *t, uint32_t rank,
                              const gguf_tensor *k_b, const gguf_tensor *v_b, double *max_err,
                              double *max_abs, g5_error *err) {
    uint32_t h0, h1;
    shard_kv_b_heads(p, rank, &h0, &h1);
    g5_status st = glm5_rebuild_kv_b(&p->hp, k_b, v_b, h0, h1, k->f32, k->scratch, err);
    if (st) return st;
    if ((st = quant_quantize(t->type, k->f32, k->n_elems, k->out)))
        return g5_fail(err, st, "tensor '%s': cannot store as %s", t->name, quant_type_name(t->type));
    if ((st = quant_dequantize(t->type, k->out, k->n_elems, k->back)))
        return g5_fail(err, st, "tensor '%s': cannot read back %s", t->name, quant_type_name(t->type));
    double me = *max_err, ma = *max_abs;
    for (uint64_t i = 0; i < k->n_elems; i++) {
        double x = k->f32[i], d = (double)k->back[i] - x;
        if (d < 0) d = -d;
        if (x < 0) x = -x;
        if (d > me || d != d) me = d;
        if (x > ma) ma = x;
    }
    *max_err = me;
    *max_abs = ma;
    return G5_OK;
}

g5_status convert_i_source_identity(const gguf_ctx *src, blob_source_desc **descs, uint32_t *n, g5_error *err) {
    uint32_t ns = gguf_get_n_splits(src);
    blob_source_desc *d = calloc(ns ? ns : 1, sizeof *d);
    if (!d) return g5_fail(err, G5_ERR_NOMEM, "source identity");
    for (uint32_t i = 0; i < ns; i++) {
        d[i].name = gguf_get_split_path(src, i);
        d[i].file_size = gguf_get_split_size(src, i);
        d[i].header_size = gguf_get_split_data_offset(src, i);
        if (d[i].header_size == 0 || d[i].header_size > d[i].file_size) {
            g5_fail(err, G5_ERR_FORMAT, "%s: data offset %llu of a %llu-byte file", d[i].name,
                    (unsigned long long)d[i].header_size, (unsigned long long)d[i].file_size);
            free(d);
            return G5_ERR_FORMAT;
        }
        const uint8_t *bytes = gguf_get_split_bytes(src, i);
        blob_hash128(bytes, d[i].header_size, d[i].header_hash);
        /* Weights can differ under an identical header: 64 evenly spaced 4 KiB samples of the
         * data region tell such files apart for the set id (256 KiB per split, re-read later). */
        XXH3_state_t *xs = XXH3_createState();
        if (!xs) {
            free(d);
            return g5_fail(err, G5_ERR_NOMEM, "source identity");
        }
        XXH3_128bits_reset(xs);
        const uint64_t ds = d[i].file_size - d[i].header_size, blk = 4096, ns_ = 64;
        if (ds <= blk * ns_) {
            XXH3_128bits_update(xs, bytes + d[i].header_size, ds);
        } else {
            for (uint64_t k = 0; k < ns_; k++)
                XXH3_128bits_update(xs, bytes + d[i].header_size + (ds - blk) / (ns_ - 1) * k, blk);
        }
        XXH128_canonical_t c;
        XXH128_canonicalFromHash(&c, XXH3_128bits_digest(xs));
        memcpy(d[i].sample_hash, c.digest, 16);
        XXH3_freeState(xs);
    }
    *descs = d;
    *n = ns;
    return G5_OK;
}

void convert_i_set_id(const shard_plan *p, const blob_source_desc *src, uint32_t n_src, uint8_t out[16]) {
    uint8_t b[64];
    XXH3_state_t *st = XXH3_createState();
    if (!st) { /* cannot happen in practice; a constant id still keeps sets consistent */
        memset(out, 0, 16);
        return;
    }
    XXH3_128bits_reset(st);
    static const char tag[] = "glm5-shard blob set v1";
    XXH3_128bits_update(st, tag, sizeof tag);
    g5_wr_u32(b, convert_i_version(p));
    g5_wr_u32(b + 4, BLOB_VERSION);
    g5_wr_u32(b + 8, p->tp);
    g5_wr_u32(b + 12, p->ep ? BLOB_PLACE_EP : BLOB_PLACE_TP);
    g5_wr_u32(b + 16, p->kv_b_type);
    g5_wr_u32(b + 20, n_src);
    XXH3_128bits_update(st, b, 24);
    for (uint32_t i = 0; i < n_src; i++) {
        g5_wr_u64(b, src[i].file_size);
        g5_wr_u64(b + 8, src[i].header_size);
        memcpy(b + 16, src[i].header_hash, 16);
        memcpy(b + 32, src[i].sample_hash, 16);
        XXH3_128bits_update(st, b, 48);
    }
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st));
    memcpy(out, c.digest, 16);
    XXH3_freeState(st);
}

/* The source's keys (split.* left out: the source table records the layout), with the indexer
 * schedule as the plan resolved it: glm-dsa.attention.indexer.types always written (replacing
 * the source's), glm5shard.indexer.source saying where it came from and, when shared layers'
 * duplicate indexer tensors were left out, glm5shard.indexer.dropped saying so. */
g5_status convert_i_meta_image(const gguf_ctx *src, const shard_plan *p, uint8_t **buf, uint64_t *len,
                               g5_error *err) {
    static const char tkey[] = GLM5_ARCH ".attention.indexer.types";
    gguf_writer *w = gguf_writer_create();
    if (!w) return g5_fail(err, G5_ERR_NOMEM, "metadata image");
    g5_status st = G5_OK;
    for (int64_t i = 0, n = gguf_get_n_kv(src); i < n && !st; i++) {
        const char *k = gguf_get_key(src, i);
        if (strncmp(k, "split.", 6) == 0 || strcmp(k, tkey) == 0 || strncmp(k, "glm5shard.indexer.", 18) == 0)
            continue;
        if ((st = gguf_writer_copy_kv(w, src, i))) g5_fail(err, st, "metadata: copying key '%s'", k);
    }
    const glm5_hparams *hp = &p->hp;
    if (!st && (st = gguf_writer_set_arr(w, tkey, GGUF_VT_BOOL, hp->idx_full, hp->n_layer_main)))
        g5_fail(err, st, "metadata: writing %s", tkey);
    const char *why = glm5_idx_source_name(hp->idx_source);
    if (!st && (st = gguf_writer_set_str(w, "glm5shard.indexer.source", why, strlen(why))))
        g5_fail(err, st, "metadata: writing glm5shard.indexer.source");
    if (!st && p->src_unused) {
        char m[256];
        snprintf(m, sizeof m, "%llu indexer tensors of shared layers (%llu bytes) left out: those layers "
                 "reuse a full layer's top-k and never read them", (unsigned long long)p->src_unused,
                 (unsigned long long)p->src_unused_bytes);
        if ((st = gguf_writer_set_str(w, "glm5shard.indexer.dropped", m, strlen(m))))
            g5_fail(err, st, "metadata: writing glm5shard.indexer.dropped");
    }
    if (!st && (st = gguf_writer_write_buffer(w, buf, len))) g5_fail(err, st, "metadata: serializing");
    gguf_writer_free(w);
    return st;
}

uint32_t convert_i_version(const shard_plan *p) { return p->no_pair ? CONVERT_VERSION_1_0 : CONVERT_VERSION; }

void convert_i_writer_tensors(const shard_plan *p, uint32_t rank, blob_writer_tensor *out) {
    for (uint64_t i = 0; i < p->n_tensors; i++) {
        const shard_tensor *t = &p->tensors[i];
        blob_writer_tensor *o = &out[i];
        memset(o, 0, sizeof *o);
        o->name = t->name;
        o->type = t->type;
        o->n_dims = t->n_dims;
        memcpy(o->ne, t->ne_local, sizeof o->ne);
        memcpy(o->ne_global, t->ne_global, sizeof o->ne_global);
        o->split_axis = t->axis;
        o->split_index = t->axis == BLOB_AXIS_NONE ? 0 : rank;
        o->split_count = t->split_count;
        o->flags = t->rule == SHARD_KV_B ? BLOB_TFLAG_DERIVED : 0;
    }
}

/* ---- options, results ---- */

const char *convert_phase_name(convert_phase p) {
    static const char *n[] = {"plan", "resume", "write", "finish", "verify", "done"};
    return (unsigned)p < sizeof n / sizeof n[0] ? n[p] : "?";
}

void convert_options_init(convert_options *o) {
    memset(o, 0, sizeof *o);
    o->kv_b_type = QT_F32;
    o->progress_interval_s = 0.5;
}

void convert_result_free(convert_result *r) {
    if (!r) return;
    free(r->ranks);
    shard_plan_free(r->plan);
    free(r);
}

/* ---- the streaming pipeline ----
 *
 * The reader walks the plan in file order and queues windows of whole rows, pointers into the
 * source mapping, announcing each with MADV_WILLNEED so the kernel reads ahead while the writers
 * work. Writers hash and write straight from the mapping (no intermediate copy). At most
 * BUDGET_BYTES of windows are queued; a window all writers are done with is unmapped again
 * (MADV_DONTNEED), so resident memory stays bounded however large the model is. Each source page
 * is faulted in once: every writer consumes a window while it is queued. */

enum { IT_WINDOW = 0, IT_KVB = 1, IT_END = 2 };

typedef struct item {
    int kind;
    uint64_t ti;            /* plan tensor */
    uint64_t r0, r1;        /* IT_WINDOW: rows */
    const uint8_t *rows;    /* IT_WINDOW: row r0 in the source mapping */
    uint64_t bytes;         /* counted against the budget */
    uint32_t refs;
} item;

typedef struct pipe_state {
    const shard_plan *plan;
    const gguf_ctx *src;
    blob_writer **writers;  /* [tp], NULL for ranks not written */
    uint32_t *wranks;
    uint32_t n_wranks, nthreads;
    pthread_mutex_t lock;
    pthread_cond_t cv_item, cv_space;
    item q[QUEUE_CAP];
    uint64_t head, tail, inflight, done_bytes;
    int stop, crashed;
    g5_status st;
    g5_error err;
    uint64_t written;       /* bytes handed to the writers, all ranks */
    uint64_t stop_after;
    double kv_err, kv_abs;
} pipe_state;

static void pipe_fail(pipe_state *ps, g5_status st, const g5_error *e) {
    pthread_mutex_lock(&ps->lock);
    if (!ps->stop) {
        ps->stop = 1;
        ps->st = st;
        if (e) ps->err = *e;
    }
    pthread_cond_broadcast(&ps->cv_item);
    pthread_cond_broadcast(&ps->cv_space);
    pthread_mutex_unlock(&ps->lock);
}

/* madvise over the whole pages inside [p, p + n) (outer pages when `outer`). */
static void advise(const uint8_t *p, uint64_t n, int advice, int outer) {
    static long pg;
    if (!pg) pg = sysconf(_SC_PAGESIZE);
    if (pg <= 0 || n == 0) return;
    uintptr_t s = (uintptr_t)p, e = s + n, m = (uintptr_t)pg - 1;
    s = outer ? s & ~m : (s + m) & ~m;
    e = outer ? (e + m) & ~m : e & ~m;
    if (e > s) madvise((void *)s, e - s, advice);
}

static void item_release_locked(pipe_state *ps, item *it) {
    if (it->kind == IT_WINDOW) advise(it->rows, it->bytes, MADV_DONTNEED, 0);
    ps->inflight -= it->bytes;
    ps->done_bytes += it->bytes;
}

typedef struct put_ctx {
    pipe_state *ps;
    blob_writer *w;
    g5_error *err;
} put_ctx;

static g5_status put_writer(void *vctx, const uint8_t *p, uint64_t n) {
    put_ctx *c = vctx;
    g5_status st = blob_writer_write(c->w, p, n, c->err);
    if (st) return st;
    uint64_t tot = __atomic_add_fetch(&c->ps->written, n, __ATOMIC_RELAXED);
    if (c->ps->stop_after && tot >= c->ps->stop_after) {
        pthread_mutex_lock(&c->ps->lock);
        c->ps->crashed = 1;
        pthread_mutex_unlock(&c->ps->lock);
        g5_fail(c->err, G5_ERR_INTERNAL,
                "stopped by test hook after %llu bytes (simulated interruption; temporary files left "
                "as a killed process would leave them)", (unsigned long long)tot);
        return G5_ERR_INTERNAL;
    }
    return G5_OK;
}

typedef struct worker_arg {
    pipe_state *ps;
    uint32_t k;
} worker_arg;

static void *pipe_worker(void *varg) {
    worker_arg *a = varg;
    pipe_state *ps = a->ps;
    const shard_plan *p = ps->plan;
    g5_error err;
    g5_error_clear(&err);
    g5_status st = G5_OK;
    convert_i_kvb kvb = {0};
    int have_kvb = 0;
    double kv_err = 0, kv_abs = 0;
    for (uint64_t seq = 0;; seq++) {
        pthread_mutex_lock(&ps->lock);
        while (seq >= ps->head && !ps->stop) pthread_cond_wait(&ps->cv_item, &ps->lock);
        if (ps->stop) {
            pthread_mutex_unlock(&ps->lock);
            break;
        }
        item *it = &ps->q[seq % QUEUE_CAP];
        pthread_mutex_unlock(&ps->lock);
        if (it->kind == IT_END) break;
        const shard_tensor *t = &p->tensors[it->ti];
        for (uint32_t j = a->k; j < ps->n_wranks && !st; j += ps->nthreads) {
            const uint32_t r = ps->wranks[j];
            put_ctx pc = {ps, ps->writers[r], &err};
            if (it->kind == IT_WINDOW) {
                shard_sel s;
                shard_select(p, t, r, &s);
                st = convert_i_select_rows(t, &s, it->rows, it->r0, it->r1, put_writer, &pc);
            } else {
                if (!have_kvb) {
                    if ((st = convert_i_kvb_init(&kvb, p, t, &err))) break;
                    have_kvb = 1;
                }
                if (!(st = convert_i_kvb_build(&kvb, p, t, r, gguf_get_tensor(ps->src, t->src_k_b),
                                               gguf_get_tensor(ps->src, t->src_v_b), &kv_err, &kv_abs, &err)))
                    st = put_writer(&pc, kvb.out, t->local_bytes);
            }
        }
        if (st) {
            pipe_fail(ps, st, &err);
            break;
        }
        pthread_mutex_lock(&ps->lock);
        if (--it->refs == 0) {
            while (ps->tail < ps->head && ps->q[ps->tail % QUEUE_CAP].refs == 0) {
                item_release_locked(ps, &ps->q[ps->tail % QUEUE_CAP]);
                ps->tail++;
            }
            pthread_cond_broadcast(&ps->cv_space);
        }
        pthread_mutex_unlock(&ps->lock);
    }
    if (have_kvb) convert_i_kvb_free(&kvb);
    pthread_mutex_lock(&ps->lock);
    if (kv_err > ps->kv_err) ps->kv_err = kv_err;
    if (kv_abs > ps->kv_abs) ps->kv_abs = kv_abs;
    int stopped = ps->stop;
    pthread_mutex_unlock(&ps->lock);
    /* Index, fsync and rename in parallel too; renamed files are removed again if any rank fails. */
    for (uint32_t j = a->k; j < ps->n_wranks && !stopped; j += ps->nthreads) {
        const uint32_t r = ps->wranks[j];
        if ((st = blob_writer_finish(ps->writers[r], NULL, &err))) {
            pipe_fail(ps, st, &err);
            break;
        }
    }
    return NULL;
}

/* Queues an item once the budget allows; 0 if the pipeline stopped. */
static int pipe_push(pipe_state *ps, const item *it) {
    pthread_mutex_lock(&ps->lock);
    while (!ps->stop && (ps->head - ps->tail >= QUEUE_CAP ||
                         (ps->head > ps->tail && ps->inflight + it->bytes > BUDGET_BYTES)))
        pthread_cond_wait(&ps->cv_space, &ps->lock);
    if (ps->stop) {
        pthread_mutex_unlock(&ps->lock);
        return 0;
    }
    ps->q[ps->head % QUEUE_CAP] = *it;
    ps->q[ps->head % QUEUE_CAP].refs = ps->nthreads;
    ps->inflight += it->bytes;
    ps->head++;
    pthread_cond_broadcast(&ps->cv_item);
    pthread_mutex_unlock(&ps->lock);
    return 1;
}

typedef struct progress_state {
    const convert_options *opt;
    double t0, last;
} progress_state;

static void report(progress_state *pr, convert_phase ph, uint64_t done, uint64_t total, const char *tensor, int force) {
    if (!pr->opt->progress) return;
    double now = convert_i_now();
    if (!force && now - pr->last < pr->opt->progress_interval_s) return;
    pr->last = now;
    convert_progress p = {ph, done, total, now - pr->t0, 0, -1, tensor};
    if (p.elapsed_s > 0) p.gb_per_s = done / p.elapsed_s / 1e9;
    if (done > 0 && total >= done) p.eta_s = p.elapsed_s * (double)(total - done) / (double)done;
    pr->opt->progress(pr->opt->progress_user, &p);
}

static void report_done(pipe_state *ps, progress_state *pr, const char *tensor) {
    if (!pr->opt->progress) return;
    pthread_mutex_lock(&ps->lock);
    uint64_t d = ps->done_bytes;
    pthread_mutex_unlock(&ps->lock);
    report(pr, CONVERT_PHASE_WRITE, d, ps->plan->src_tensor_bytes, tensor, 0);
}

/* Walks every plan tensor once, in file order, and feeds the writers. */
static void pipe_read(pipe_state *ps, progress_state *pr) {
    const shard_plan *p = ps->plan;
    for (uint64_t ti = 0; ti < p->n_tensors; ti++) {
        const shard_tensor *t = &p->tensors[ti];
        if (t->rule == SHARD_KV_B) {
            const gguf_tensor *kb = gguf_get_tensor(ps->src, t->src_k_b), *vb = gguf_get_tensor(ps->src, t->src_v_b);
            advise(kb->data, kb->nbytes, MADV_WILLNEED, 1);
            advise(vb->data, vb->nbytes, MADV_WILLNEED, 1);
            item it = {IT_KVB, ti, 0, 0, NULL, kb->nbytes + vb->nbytes, 0};
            if (!pipe_push(ps, &it)) return;
        } else {
            const gguf_tensor *g = gguf_get_tensor(ps->src, t->src);
            uint64_t per = WINDOW_BYTES / t->row_bytes;
            if (per == 0) per = 1;
            for (uint64_t r0 = 0; r0 < t->n_rows; r0 += per) {
                uint64_t r1 = r0 + per < t->n_rows ? r0 + per : t->n_rows;
                item it = {IT_WINDOW, ti, r0, r1, g->data + r0 * t->row_bytes, (r1 - r0) * t->row_bytes, 0};
                advise(it.rows, it.bytes, MADV_WILLNEED, 1);
                if (!pipe_push(ps, &it)) return;
                report_done(ps, pr, t->name);
            }
        }
        report_done(ps, pr, t->name);
    }
    item end = {IT_END, 0, 0, 0, NULL, 0, 0};
    pipe_push(ps, &end);
}

/* ---- convert_run ---- */

static void rank_path(const char *outdir, uint32_t r, uint32_t tp, char *out, size_t cap) {
    char fn[64];
    blob_rank_filename(r, tp, fn, sizeof fn);
    snprintf(out, cap, "%s/%s", outdir, fn);
}

typedef struct resume_progress {
    progress_state *pr;
} resume_progress;

static void resume_cb(void *user, uint64_t done, uint64_t total) {
    resume_progress *rp = user;
    report(rp->pr, CONVERT_PHASE_RESUME, done, total, NULL, 0);
}

/* --resume: which existing rank files belong to this plan and verify completely. */
static g5_status resume_scan(const char *outdir, const shard_plan *p, const uint8_t set_id[16],
                             uint32_t jobs, progress_state *pr, convert_result *res, g5_error *err) {
    blob **cand = calloc(p->tp, sizeof *cand);
    const blob **list = calloc(p->tp, sizeof *list);
    uint32_t *which = calloc(p->tp, sizeof *which);
    blob_verify_stats *stats = calloc(p->tp, sizeof *stats);
    if (!cand || !list || !which || !stats) {
        free(cand); free(list); free(which); free(stats);
        return g5_fail(err, G5_ERR_NOMEM, "resume");
    }
    uint32_t n = 0;
    for (uint32_t r = 0; r < p->tp; r++) {
        char path[4200];
        rank_path(outdir, r, p->tp, path, sizeof path);
        blob *b;
        if (access(path, F_OK) != 0 || blob_open(path, &b, NULL) != G5_OK) continue;
        const blob_info *in = blob_get_info(b);
        if (memcmp(in->set_id, set_id, 16) != 0 || in->tp != p->tp || in->rank != r ||
            in->placement != (uint32_t)(p->ep ? BLOB_PLACE_EP : BLOB_PLACE_TP) || in->kv_b_type != p->kv_b_type ||
            in->converter_version != convert_i_version(p) || in->n_tensors != p->n_tensors ||
            in->data_size != p->data_size) {
            blob_free(b);
            continue;
        }
        cand[r] = b;
        list[n] = b;
        which[n++] = r;
    }
    if (n > 0) {
        resume_progress rp = {pr};
        blob_verify_data(list, n, jobs, stats, resume_cb, &rp, pr->opt->progress_interval_s, NULL);
        for (uint32_t i = 0; i < n; i++) {
            const uint32_t r = which[i];
            if (stats[i].n_chunks_bad == 0 && stats[i].n_tensors_bad == 0) {
                const blob_info *in = blob_get_info(cand[r]);
                res->ranks[r].reused = 1;
                res->ranks[r].file_size = in->file_size;
                memcpy(res->ranks[r].header_hash, in->header_hash, 16);
            }
            blob_verify_stats_clear(&stats[i]);
        }
    }
    for (uint32_t r = 0; r < p->tp; r++) blob_free(cand[r]);
    free(cand); free(list); free(which); free(stats);
    return G5_OK;
}

static g5_status ensure_dir(const char *dir, g5_error *err) {
    struct stat sb;
    if (stat(dir, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode)) return g5_fail(err, G5_ERR_IO, "%s: exists and is not a directory", dir);
        return G5_OK;
    }
    if (mkdir(dir, 0755) != 0) return g5_fail(err, G5_ERR_IO, "%s: cannot create the output directory: %s", dir, strerror(errno));
    return G5_OK;
}

/* Whether name is a blob-set file: rank-RRRRR-of-TTTTT.g5b (or its .tmp) or the set record; *tp
 * receives TTTTT for a rank file, 0 for the record. */
static int set_file(const char *name, uint32_t *tp) {
    unsigned r, t;
    int n = -1;
    *tp = 0;
    if (!strcmp(name, BLOB_SET_RECORD) || !strcmp(name, BLOB_SET_RECORD ".tmp")) return 1;
    if (sscanf(name, "rank-%5u-of-%5u.g5b%n", &r, &t, &n) != 2 || n < 0) return 0;
    if (name[n] && strcmp(name + n, ".tmp") != 0) return 0;
    *tp = t;
    return 1;
}

/* The output directory may hold only this conversion's own set (for --resume): another set's
 * files are refused unless force, which removes every set file first (a new set never sits
 * beside stale ranks of an old one). Other files are left alone. */
static g5_status claim_outdir(const char *outdir, uint32_t tp, int resume, int force, g5_error *err) {
    DIR *d = opendir(outdir);
    if (!d) return errno == ENOENT ? G5_OK : g5_fail(err, G5_ERR_IO, "%s: %s", outdir, strerror(errno));
    g5_status st = G5_OK;
    char first[300] = "";
    uint32_t n_found = 0;
    for (struct dirent *de; (de = readdir(d)) != NULL && !st;) {
        uint32_t t;
        if (!set_file(de->d_name, &t)) continue;
        if (resume && (t == tp || t == 0) && !force) continue; /* this plan's ranks, or the record */
        if (!force) {
            if (!n_found++) snprintf(first, sizeof first, "%s", de->d_name);
            continue;
        }
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", outdir, de->d_name);
        if (unlink(path) != 0 && errno != ENOENT)
            st = g5_fail(err, G5_ERR_IO, "%s: cannot remove the old set's file: %s", path, strerror(errno));
    }
    closedir(d);
    if (!st && n_found)
        st = g5_fail(err, G5_ERR_EXISTS,
                     "%s already holds a blob set (%s%s): refusing to mix sets; --force removes the old set's "
                     "files first%s", outdir, first, n_found > 1 ? " and others" : "",
                     resume ? "" : ", --resume keeps the ranks of this same conversion");
    return st;
}

g5_status convert_run(const char *model, const char *outdir, const convert_options *opt,
                      convert_result **out, g5_error *err) {
    return convert_run_hooked(model, outdir, opt, NULL, out, err);
}

g5_status convert_run_hooked(const char *model, const char *outdir, const convert_options *opt,
                             const convert_test_hooks *hooks, convert_result **out, g5_error *err) {
    static const convert_test_hooks no_hooks;
    if (!hooks) hooks = &no_hooks;
    if (out) *out = NULL;
    const double t0 = convert_i_now();
    progress_state pr = {opt, t0, 0};
    if (opt->tp < 1) return g5_fail(err, G5_ERR_INVALID_ARG, "--tp must be at least 1");
    gguf_ctx *src = NULL;
    g5_status st = gguf_open(model, &src, err);
    if (st) return st;
    convert_result *res = calloc(1, sizeof *res);
    blob_source_desc *sources = NULL;
    uint8_t *meta = NULL;
    uint64_t meta_len = 0;
    uint32_t n_src = 0;
    blob_writer **writers = NULL;
    blob_writer_tensor *wt = NULL;
    uint32_t *wranks = NULL;
    int crashed = 0, wrote = 0;
    if (!res) {
        gguf_free(src);
        return g5_fail(err, G5_ERR_NOMEM, "result");
    }
    res->tp = opt->tp;
    res->ep = opt->ep;
    res->kv_b_type = opt->kv_b_type;
    res->dry_run = opt->dry_run;
    report(&pr, CONVERT_PHASE_PLAN, 0, 0, NULL, 1);
    shard_options so = {opt->tp, opt->ep, opt->kv_b_type, hooks->legacy_1_0};
    if ((st = shard_plan_build(src, &so, &res->plan, err))) goto done;
    const shard_plan *p = res->plan;
    if ((st = convert_i_source_identity(src, &sources, &n_src, err))) goto done;
    convert_i_set_id(p, sources, n_src, res->set_id);
    res->n_sources = n_src;
    for (uint32_t i = 0; i < n_src; i++) res->source_bytes += sources[i].file_size;
    res->source_tensor_bytes = p->src_tensor_bytes;
    res->n_tensors_in = p->n_src_tensors;
    res->n_tensors_out = p->n_tensors;
    if ((st = convert_i_meta_image(src, p, &meta, &meta_len, err))) goto done;
    if (opt->dry_run) goto done;

    res->ranks = calloc(p->tp, sizeof *res->ranks);
    writers = calloc(p->tp, sizeof *writers);
    wranks = calloc(p->tp, sizeof *wranks);
    wt = calloc(p->n_tensors ? p->n_tensors : 1, sizeof *wt);
    if (!res->ranks || !writers || !wranks || !wt) {
        st = g5_fail(err, G5_ERR_NOMEM, "convert");
        goto done;
    }
    for (uint32_t r = 0; r < p->tp; r++) {
        res->ranks[r].rank = r;
        rank_path(outdir, r, p->tp, res->ranks[r].path, sizeof res->ranks[r].path);
    }
    if ((st = claim_outdir(outdir, p->tp, opt->resume, opt->force, err))) goto done;
    if ((st = ensure_dir(outdir, err))) goto done;
    const uint32_t jobs = opt->jobs ? opt->jobs : p->tp;
    if (opt->resume) {
        pr.t0 = convert_i_now();
        if ((st = resume_scan(outdir, p, res->set_id, jobs, &pr, res, err))) goto done;
        report(&pr, CONVERT_PHASE_RESUME, 1, 1, NULL, 1);
    }
    /* No stale set record may survive once any rank file is about to change. */
    char recpath[4200];
    snprintf(recpath, sizeof recpath, "%s/%s", outdir, BLOB_SET_RECORD);
    uint32_t n_w = 0;
    for (uint32_t r = 0; r < p->tp; r++)
        if (!res->ranks[r].reused) wranks[n_w++] = r;
    struct stat rsb;
    if (n_w > 0 && lstat(recpath, &rsb) == 0 && unlink(recpath) != 0 && errno != ENOENT) {
        st = g5_fail(err, G5_ERR_IO, "%s: cannot remove the old set record: %s", recpath, strerror(errno));
        goto done;
    }
    if (n_w > 0) {
        for (uint32_t i = 0; i < n_src; i++) {
            const uint8_t *m = gguf_get_split_bytes(src, i);
            advise(m, gguf_get_split_size(src, i), MADV_SEQUENTIAL, 1);
        }
        for (uint32_t j = 0; j < n_w; j++) {
            const uint32_t r = wranks[j];
            convert_i_writer_tensors(p, r, wt);
            blob_writer_params bp = {0};
            bp.tp = p->tp;
            bp.rank = r;
            bp.placement = p->ep ? BLOB_PLACE_EP : BLOB_PLACE_TP;
            bp.converter_version = convert_i_version(p);
            bp.kv_b_type = p->kv_b_type;
            memcpy(bp.set_id, res->set_id, 16);
            bp.meta = meta;
            bp.meta_len = meta_len;
            bp.meta_zstd_level = 9;
            bp.n_sources = n_src;
            bp.sources = sources;
            wrote = 1;
            if ((st = blob_writer_create(res->ranks[r].path, &bp, wt, p->n_tensors, &writers[r], err))) goto done;
            blob_writer_test_fail_after(writers[r], hooks->fail_write_after_bytes);
            if (blob_writer_file_size(writers[r]) == 0 || blob_writer_tensor_offset(writers[r], p->n_tensors) != p->data_size) {
                st = g5_fail(err, G5_ERR_INTERNAL, "%s: writer layout differs from the plan", res->ranks[r].path);
                goto done;
            }
        }
        pipe_state *ps = calloc(1, sizeof *ps);
        if (!ps) {
            st = g5_fail(err, G5_ERR_NOMEM, "pipeline");
            goto done;
        }
        ps->plan = p;
        ps->src = src;
        ps->writers = writers;
        ps->wranks = wranks;
        ps->n_wranks = n_w;
        ps->nthreads = jobs < n_w ? jobs : n_w;
        ps->stop_after = hooks->stop_after_bytes;
        pthread_mutex_init(&ps->lock, NULL);
        pthread_cond_init(&ps->cv_item, NULL);
        pthread_cond_init(&ps->cv_space, NULL);
        pthread_t th[256];
        worker_arg args[256];
        if (ps->nthreads > 256) ps->nthreads = 256;
        uint32_t started = 0;
        for (uint32_t k = 0; k < ps->nthreads; k++) {
            args[k] = (worker_arg){ps, k};
            if (pthread_create(&th[k], NULL, pipe_worker, &args[k]) != 0) break;
            started++;
        }
        pr.t0 = convert_i_now();
        pr.last = 0;
        if (started < ps->nthreads) {
            g5_error e2;
            g5_fail(&e2, G5_ERR_INTERNAL, "cannot start writer threads");
            pipe_fail(ps, G5_ERR_INTERNAL, &e2);
        } else {
            pipe_read(ps, &pr);
        }
        for (uint32_t k = 0; k < started; k++) pthread_join(th[k], NULL);
        const double tw = convert_i_now() - pr.t0;
        crashed = ps->crashed;
        if (ps->stop) {
            st = ps->st;
            if (err) *err = ps->err;
        }
        res->kv_b_max_abs_err = ps->kv_err;
        res->kv_b_max_abs = ps->kv_abs;
        res->gb_per_s = tw > 0 ? p->src_tensor_bytes / tw / 1e9 : 0;
        for (uint64_t i = ps->tail; i < ps->head; i++) item_release_locked(ps, &ps->q[i % QUEUE_CAP]);
        pthread_mutex_destroy(&ps->lock);
        pthread_cond_destroy(&ps->cv_item);
        pthread_cond_destroy(&ps->cv_space);
        free(ps);
        if (st) goto done;
        report(&pr, CONVERT_PHASE_WRITE, p->src_tensor_bytes, p->src_tensor_bytes, NULL, 1);
    }
    /* Every rank is in place: the set record goes last. */
    report(&pr, CONVERT_PHASE_FINISH, 0, 0, NULL, 1);
    for (uint32_t r = 0; r < p->tp; r++) {
        if (res->ranks[r].reused) continue;
        blob *b;
        if ((st = blob_open(res->ranks[r].path, &b, err))) goto done;
        res->ranks[r].file_size = blob_get_info(b)->file_size;
        memcpy(res->ranks[r].header_hash, blob_get_info(b)->header_hash, 16);
        blob_free(b);
    }
    blob_set_record rec = {BLOB_SET_VERSION, p->tp, p->ep ? BLOB_PLACE_EP : BLOB_PLACE_TP, convert_i_version(p), {0},
                           NULL};
    memcpy(rec.set_id, res->set_id, 16);
    rec.ranks = calloc(p->tp, sizeof *rec.ranks);
    if (!rec.ranks) {
        st = g5_fail(err, G5_ERR_NOMEM, "set record");
        goto done;
    }
    for (uint32_t r = 0; r < p->tp; r++) {
        rec.ranks[r].file_size = res->ranks[r].file_size;
        memcpy(rec.ranks[r].header_hash, res->ranks[r].header_hash, 16);
        res->bytes_written += res->ranks[r].reused ? 0 : res->ranks[r].file_size;
        res->n_ranks_reused += res->ranks[r].reused;
        res->n_ranks_written += !res->ranks[r].reused;
    }
    res->rank_bytes = res->ranks[0].file_size;
    st = blob_set_record_write(outdir, &rec, err);
    blob_set_record_clear(&rec);
done:
    if (writers) {
        for (uint32_t r = 0; r < res->tp; r++) {
            blob_writer_abort(writers[r], crashed);
            /* A failed run leaves no complete rank file of its own either. */
            if (st && !crashed && wrote && res->ranks && !res->ranks[r].reused) unlink(res->ranks[r].path);
        }
    }
    free(writers);
    free(wranks);
    free(wt);
    free(meta);
    free(sources);
    gguf_free(src);
    res->seconds = convert_i_now() - t0;
    if (!st) report(&pr, CONVERT_PHASE_DONE, 1, 1, NULL, 1);
    if (out && (res->plan || !st)) *out = res;
    else convert_result_free(res);
    return st;
}
