/* glm5-shard verify (and the JSON summaries of convert and verify results). */
#include <dirent.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "convert/convert.h"
#include "format/glm5.h"
#include "convert/convert_int.h"
#include "format/quant.h"

void convert_verify_options_init(convert_verify_options *o) {
    memset(o, 0, sizeof *o);
    o->progress_interval_s = 0.5;
}

void convert_verify_result_free(convert_verify_result *r) {
    if (!r) return;
    for (uint32_t i = 0; i < r->n_ranks; i++) free(r->ranks[i].tensor_bad);
    free(r->ranks);
    free(r->findings);
    free(r);
}

static void add_finding(convert_verify_result *r, int32_t rank, int64_t tensor, int64_t chunk, g5_status st,
                        const char *msg) {
    r->n_findings++;
    if (r->n_findings_stored >= CONVERT_MAX_FINDINGS) return;
    convert_finding *f = &r->findings[r->n_findings_stored++];
    f->rank = rank;
    f->tensor = tensor;
    f->chunk = chunk;
    f->status = st;
    size_t n = strlen(msg);
    if (n >= sizeof f->msg) n = sizeof f->msg - 1;
    memcpy(f->msg, msg, n);
    f->msg[n] = 0;
}

/* Without a set record, guess T from the rank files present (the most common "of" count). */
static uint32_t guess_tp(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    uint32_t best = 0, best_n = 0, cand[64] = {0}, cnt[64] = {0}, nc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        unsigned r, t;
        char tail[8];
        if (sscanf(e->d_name, "rank-%5u-of-%5u.g5%7s", &r, &t, tail) != 3 || strcmp(tail, "b") != 0) continue;
        if (t < 1 || t > 4096) continue;
        uint32_t k = 0;
        while (k < nc && cand[k] != t) k++;
        if (k == nc && nc < 64) cand[nc++] = t;
        if (k < nc) cnt[k]++;
    }
    closedir(d);
    for (uint32_t k = 0; k < nc; k++)
        if (cnt[k] > best_n) best_n = cnt[k], best = cand[k];
    return best;
}

typedef struct vprog {
    const convert_verify_options *opt;
    double t0;
} vprog;

static void vprog_cb(void *user, uint64_t done, uint64_t total) {
    vprog *v = user;
    if (!v->opt->progress) return;
    double el = convert_i_now() - v->t0;
    convert_progress p = {CONVERT_PHASE_VERIFY, done, total, el, el > 0 ? done / el / 1e9 : 0, -1, NULL};
    if (done > 0 && total >= done) p.eta_s = el * (double)(total - done) / (double)done;
    v->opt->progress(v->opt->progress_user, &p);
}

/* ---- deep verification ---- */

typedef struct deep_ctx {
    const shard_plan *plan;
    const gguf_ctx *src;
    blob **blobs;            /* [tp], NULL where not opened */
    convert_verify_result *res;
    uint64_t next, n_items;
    pthread_mutex_t lock;
} deep_ctx;

typedef struct cmp_ctx {
    const uint8_t *want;     /* blob bytes */
    uint64_t pos, size;
    int64_t first_diff;
} cmp_ctx;

static g5_status put_cmp(void *vctx, const uint8_t *p, uint64_t n) {
    cmp_ctx *c = vctx;
    if (c->pos + n > c->size) {
        if (c->first_diff < 0) c->first_diff = (int64_t)c->pos;
        c->pos += n;
        return G5_OK;
    }
    if (c->first_diff < 0 && memcmp(c->want + c->pos, p, n) != 0) {
        uint64_t k = 0;
        while (c->want[c->pos + k] == p[k]) k++;
        c->first_diff = (int64_t)(c->pos + k);
    }
    c->pos += n;
    return G5_OK;
}

static void *deep_worker(void *varg) {
    deep_ctx *d = varg;
    const shard_plan *p = d->plan;
    convert_i_kvb kvb = {0};
    int have = 0;
    for (;;) {
        pthread_mutex_lock(&d->lock);
        uint64_t i = d->next < d->n_items ? d->next++ : d->n_items;
        pthread_mutex_unlock(&d->lock);
        if (i >= d->n_items) break;
        /* Tensor-major: the ranks of one tensor are checked together, so the source pages they
         * share (replicated tensors, ne[0] cuts) are read from disk once. */
        const uint32_t r = (uint32_t)(i % d->res->n_ranks);
        const uint64_t ti = i / d->res->n_ranks;
        const blob *b = d->blobs[r];
        if (!b) continue;
        const shard_tensor *t = &p->tensors[ti];
        const blob_tensor *bt = blob_get_tensor(b, ti);
        char msg[2048];
        int bad = 0;
        double kv_err = 0, kv_abs = 0;
        g5_error e;
        g5_error_clear(&e);
        if (t->rule == SHARD_KV_B) {
            g5_status st = G5_OK;
            if (!have) {
                st = convert_i_kvb_init(&kvb, p, t, &e);
                have = st == G5_OK;
            }
            if (!st)
                st = convert_i_kvb_build(&kvb, p, t, r, gguf_get_tensor(d->src, t->src_k_b),
                                         gguf_get_tensor(d->src, t->src_v_b), &kv_err, &kv_abs, &e);
            if (st) {
                snprintf(msg, sizeof msg, "%.200s: tensor '%s': cannot rebuild kv_b: %.300s", blob_get_path(b), t->name, e.msg);
                bad = 1;
            } else {
                /* Values: the blob's kv_b against the exact rebuilt one; bytes: against our storing. */
                double me = 0;
                if (quant_dequantize(bt->type, bt->data, kvb.n_elems, kvb.back) != G5_OK) me = 1e300;
                for (uint64_t k = 0; k < kvb.n_elems; k++) {
                    double x = (double)kvb.back[k] - kvb.f32[k];
                    if (x < 0) x = -x;
                    if (x > me || x != x) me = x;
                }
                pthread_mutex_lock(&d->lock);
                if (me > d->res->ranks[r].kv_b_max_abs_err) d->res->ranks[r].kv_b_max_abs_err = me;
                pthread_mutex_unlock(&d->lock);
                if (memcmp(kvb.out, bt->data, bt->size) != 0 || (bt->type == QT_F32 && me != 0)) {
                    uint64_t k = 0;
                    while (k < bt->size && kvb.out[k] == bt->data[k]) k++;
                    snprintf(msg, sizeof msg,
                             "%s: tensor '%s': differs from kv_b rebuilt from the source at byte %llu "
                             "(max |blob - exact| = %g)",
                             blob_get_path(b), t->name, (unsigned long long)(bt->offset + k), me);
                    bad = 1;
                }
            }
        } else {
            const gguf_tensor *g = gguf_get_tensor(d->src, t->src);
            shard_sel s;
            shard_select(p, t, r, &s);
            cmp_ctx c = {bt->data, 0, bt->size, -1};
            convert_i_select_rows(t, &s, g->data, 0, t->n_rows, put_cmp, &c);
            if (c.first_diff >= 0 || c.pos != bt->size) {
                snprintf(msg, sizeof msg,
                         "%s: tensor '%s': differs from its slice of source tensor '%s' at byte %llu",
                         blob_get_path(b), t->name, g->name,
                         (unsigned long long)(bt->offset + (c.first_diff >= 0 ? (uint64_t)c.first_diff : c.pos)));
                bad = 1;
            }
        }
        pthread_mutex_lock(&d->lock);
        d->res->ranks[r].n_deep_checked++;
        if (bad) {
            d->res->ranks[r].n_deep_bad++;
            if (d->res->ranks[r].tensor_bad) d->res->ranks[r].tensor_bad[ti] = 1;
            add_finding(d->res, (int32_t)r, (int64_t)ti, -1, G5_ERR_CHECKSUM, msg);
        }
        pthread_mutex_unlock(&d->lock);
    }
    if (have) convert_i_kvb_free(&kvb);
    return NULL;
}

static void deep_verify(const convert_verify_options *opt, blob **blobs, convert_verify_result *res) {
    const blob *first = NULL;
    for (uint32_t r = 0; r < res->n_ranks && !first; r++) first = blobs[r];
    char msg[1400];
    g5_error e;
    g5_error_clear(&e);
    if (!first) {
        add_finding(res, -1, -1, -1, G5_ERR_NOT_FOUND, "--deep: no rank file could be opened");
        return;
    }
    gguf_ctx *src = NULL;
    shard_plan *plan = NULL;
    blob_source_desc *sd = NULL;
    uint32_t ns = 0;
    g5_status st = gguf_open(opt->deep_source, &src, &e);
    if (!st) st = convert_i_source_identity(src, &sd, &ns, &e);
    if (st) {
        snprintf(msg, sizeof msg, "--deep: %s", e.msg);
        add_finding(res, -1, -1, -1, st, msg);
        goto out;
    }
    if (ns != blob_n_sources(first)) {
        snprintf(msg, sizeof msg, "--deep: %s has %u split files, the blobs were made from %u", opt->deep_source, ns,
                 blob_n_sources(first));
        add_finding(res, -1, -1, -1, G5_ERR_MISMATCH, msg);
        goto out;
    }
    for (uint32_t i = 0; i < ns; i++) {
        const blob_source *bs = blob_get_source(first, i);
        if (bs->file_size != sd[i].file_size || bs->header_size != sd[i].header_size ||
            memcmp(bs->header_hash, sd[i].header_hash, 16) != 0 ||
            memcmp(bs->sample_hash, sd[i].sample_hash, 16) != 0) {
            snprintf(msg, sizeof msg,
                     "--deep: %s is not the source of these blobs: split %u differs from '%s' (%llu bytes) "
                     "in size, header hash or data samples",
                     sd[i].name, i, bs->name, (unsigned long long)bs->file_size);
            add_finding(res, -1, -1, -1, G5_ERR_MISMATCH, msg);
            goto out;
        }
    }
    const blob_info *in = blob_get_info(first);
    /* sets written before 1.1 carry no attn_k_b/attn_v_b: their own plan */
    shard_options so = {in->tp, in->placement == BLOB_PLACE_EP, in->kv_b_type,
                        in->converter_version < CONVERT_VERSION_PAIR};
    if ((st = shard_plan_build(src, &so, &plan, &e))) {
        snprintf(msg, sizeof msg, "--deep: cannot rebuild the plan: %s", e.msg);
        add_finding(res, -1, -1, -1, st, msg);
        goto out;
    }
    for (uint32_t r = 0; r < res->n_ranks; r++) {
        const blob *b = blobs[r];
        if (!b) continue;
        int ok = blob_n_tensors(b) == plan->n_tensors;
        for (uint64_t i = 0; ok && i < plan->n_tensors; i++) {
            const blob_tensor *bt = blob_get_tensor(b, i);
            const shard_tensor *t = &plan->tensors[i];
            if (strcmp(bt->name, t->name) || bt->type != t->type || memcmp(bt->ne, t->ne_local, sizeof bt->ne) ||
                bt->size != t->local_bytes || bt->offset != blob_get_info(b)->data_offset + t->data_offset) {
                snprintf(msg, sizeof msg, "%s: tensor %llu ('%s') does not match the plan's '%s'", blob_get_path(b),
                         (unsigned long long)i, bt->name, t->name);
                add_finding(res, (int32_t)r, (int64_t)i, -1, G5_ERR_MISMATCH, msg);
                ok = 0;
            }
        }
        if (!ok) {
            if (blob_n_tensors(b) != plan->n_tensors) {
                snprintf(msg, sizeof msg, "%s: %llu tensors, the plan has %llu", blob_get_path(b),
                         (unsigned long long)blob_n_tensors(b), (unsigned long long)plan->n_tensors);
                add_finding(res, (int32_t)r, -1, -1, G5_ERR_MISMATCH, msg);
            }
            blobs[r] = NULL; /* its table is not the plan's: byte comparison is meaningless */
        }
    }
    deep_ctx d = {plan, src, blobs, res, 0, (uint64_t)res->n_ranks * plan->n_tensors, PTHREAD_MUTEX_INITIALIZER};
    uint32_t jobs = opt->jobs;
    if (jobs == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        jobs = n > 0 ? (uint32_t)n : 1;
    }
    if (jobs > 64) jobs = 64;
    pthread_t th[64];
    uint32_t started = 0;
    for (uint32_t k = 0; k < jobs; k++)
        if (pthread_create(&th[k], NULL, deep_worker, &d) == 0) started++;
    if (!started) deep_worker(&d);
    for (uint32_t k = 0; k < started; k++) pthread_join(th[k], NULL);
out:
    shard_plan_free(plan);
    free(sd);
    gguf_free(src);
}

g5_status convert_verify(const char *outdir, const convert_verify_options *opt, convert_verify_result **out,
                         g5_error *err) {
    if (out) *out = NULL;
    const double t0 = convert_i_now();
    convert_verify_result *res = calloc(1, sizeof *res);
    if (!res) return g5_fail(err, G5_ERR_NOMEM, "verify");
    res->findings = calloc(CONVERT_MAX_FINDINGS, sizeof *res->findings);
    if (!res->findings) {
        free(res);
        return g5_fail(err, G5_ERR_NOMEM, "verify");
    }
    g5_error e;
    g5_error_clear(&e);
    blob_set_record rec;
    int have_rec = 0;
    uint32_t tp = 0;
    g5_status st = blob_set_record_read(outdir, &rec, &e);
    if (st) {
        add_finding(res, -1, -1, -1, st, e.msg);
        tp = guess_tp(outdir);
    } else {
        have_rec = 1;
        tp = rec.tp;
        memcpy(res->set_id, rec.set_id, 16);
    }
    res->tp = have_rec ? tp : 0;
    blob **blobs = NULL;
    blob_verify_stats *stats = NULL;
    const blob **list = NULL;
    uint32_t *which = NULL;
    if (tp == 0) goto finish;
    res->n_ranks = tp;
    res->ranks = calloc(tp, sizeof *res->ranks);
    blobs = calloc(tp, sizeof *blobs);
    stats = calloc(tp, sizeof *stats);
    list = calloc(tp, sizeof *list);
    which = calloc(tp, sizeof *which);
    if (!res->ranks || !blobs || !stats || !list || !which) {
        add_finding(res, -1, -1, -1, G5_ERR_NOMEM, "verify: out of memory");
        res->n_ranks = res->ranks ? tp : 0;
        goto finish;
    }
    uint32_t n_open = 0;
    const blob *first = NULL;
    for (uint32_t r = 0; r < tp; r++) {
        convert_verify_rank *vr = &res->ranks[r];
        vr->rank = r;
        char fn[64];
        blob_rank_filename(r, tp, fn, sizeof fn);
        snprintf(vr->path, sizeof vr->path, "%s/%s", outdir, fn);
        if ((st = blob_open(vr->path, &blobs[r], &e))) {
            add_finding(res, (int32_t)r, -1, -1, st, e.msg);
            continue;
        }
        const blob_info *in = blob_get_info(blobs[r]);
        vr->opened = 1;
        vr->file_size = in->file_size;
        vr->n_tensors = in->n_tensors;
        vr->n_chunks = in->n_chunks;
        vr->tensor_bad = calloc(in->n_tensors ? in->n_tensors : 1, 1);
        if (have_rec && (st = blob_check_rank(blobs[r], &rec, r, &e))) add_finding(res, (int32_t)r, -1, -1, st, e.msg);
        else if (!have_rec && in->rank != r) {
            snprintf(e.msg, sizeof e.msg, "%.900s: blob holds rank %u", vr->path, in->rank);
            add_finding(res, (int32_t)r, -1, -1, G5_ERR_MISMATCH, e.msg);
        }
        if (first && (st = blob_check_compatible(first, blobs[r], &e))) add_finding(res, (int32_t)r, -1, -1, st, e.msg);
        if (!first) first = blobs[r];
        list[n_open] = blobs[r];
        which[n_open++] = r;
    }
    if (n_open) {
        vprog vp = {opt, convert_i_now()};
        blob_verify_data(list, n_open, opt->jobs, stats, vprog_cb, &vp, opt->progress_interval_s, NULL);
        for (uint32_t i = 0; i < n_open; i++) {
            const uint32_t r = which[i];
            const blob *b = blobs[r];
            convert_verify_rank *vr = &res->ranks[r];
            res->bytes_hashed += stats[i].bytes;
            vr->n_tensors_bad = stats[i].n_tensors_bad;
            vr->n_chunks_bad = stats[i].n_chunks_bad;
            char msg[6000];
            for (uint64_t k = 0; k < stats[i].n_tensors_bad; k++) {
                const uint64_t ti = stats[i].bad_tensors[k];
                const blob_tensor *t = blob_get_tensor(b, ti);
                if (vr->tensor_bad) vr->tensor_bad[ti] = 1;
                snprintf(msg, sizeof msg, "%s: tensor '%s' (#%llu, bytes %llu..%llu): XXH3-128 mismatch", vr->path,
                         t->name, (unsigned long long)ti, (unsigned long long)t->offset,
                         (unsigned long long)(t->offset + t->size));
                add_finding(res, (int32_t)r, (int64_t)ti, -1, G5_ERR_CHECKSUM, msg);
            }
            for (uint64_t k = 0; k < stats[i].n_chunks_bad; k++) {
                char d[700];
                blob_describe_chunk(b, stats[i].bad_chunks[k], d, sizeof d);
                snprintf(msg, sizeof msg, "%s: %s: XXH3-128 mismatch", vr->path, d);
                add_finding(res, (int32_t)r, -1, (int64_t)stats[i].bad_chunks[k], G5_ERR_CHECKSUM, msg);
            }
            blob_verify_stats_clear(&stats[i]);
        }
    }
    /* What the runtime's open would refuse (glm5_meta_validate, glm5_tensor_check) fails verify
     * too: a set from an older converter is not blessed by its checksums alone. */
    for (uint32_t i = 0; i < n_open && res->n_findings == 0; i++) {
        const uint32_t r = which[i];
        const blob *b = blobs[r];
        glm5_hparams *hp = malloc(sizeof *hp);
        g5_error ve = {0};
        g5_status vs = hp ? glm5_meta_validate(blob_get_meta(b), hp, &ve) : G5_ERR_NOMEM;
        for (uint64_t ti = 0; !vs && ti < blob_n_tensors(b); ti++) {
            const blob_tensor *t = blob_get_tensor(b, ti);
            vs = glm5_tensor_check(hp, t->name, t->type, t->ne_global, t->n_dims == 1 ? t->data : NULL, t->size, &ve);
        }
        if (vs) {
            char msg[6000];
            snprintf(msg, sizeof msg, "%s: the runtime would refuse this set: %s", res->ranks[r].path,
                     vs == G5_ERR_NOMEM ? "out of memory" : ve.msg);
            add_finding(res, (int32_t)r, -1, -1, vs, msg);
        }
        free(hp);
    }
    if (opt->deep_source) deep_verify(opt, blobs, res);
finish:
    for (uint32_t r = 0; blobs && r < tp; r++) blob_free(blobs[r]);
    free(blobs);
    free(stats);
    free(list);
    free(which);
    if (have_rec) blob_set_record_clear(&rec);
    res->seconds = convert_i_now() - t0;
    res->ok = res->n_findings == 0;
    if (!have_rec && tp == 0 && res->n_findings == 0)
        add_finding(res, -1, -1, -1, G5_ERR_NOT_FOUND, "no blob set found");
    res->ok = res->n_findings == 0;
    st = G5_OK;
    if (!res->ok) {
        const convert_finding *f = &res->findings[0];
        st = g5_fail(err, f->status, "%s%s", f->msg,
                     res->n_findings > 1 ? " (and more findings)" : "");
    }
    if (out) *out = res;
    else convert_verify_result_free(res);
    return st;
}

/* ---- JSON ---- */

static json_t *hex16(const uint8_t h[16]) {
    char x[33];
    blob_hash_hex(h, x);
    return json_string(x);
}

char *convert_result_json(const convert_result *r, int with_plan) {
    json_t *o = json_object();
    if (!o) return NULL;
    json_object_set_new(o, "tp", json_integer(r->tp));
    json_object_set_new(o, "placement", json_string(r->ep ? "ep" : "tp"));
    json_object_set_new(o, "kv_b_type", json_string(quant_type_name(r->kv_b_type)));
    json_object_set_new(o, "dry_run", json_boolean(r->dry_run));
    json_object_set_new(o, "set_id", hex16(r->set_id));
    json_object_set_new(o, "n_sources", json_integer(r->n_sources));
    json_object_set_new(o, "source_bytes", json_integer((json_int_t)r->source_bytes));
    json_object_set_new(o, "source_tensor_bytes", json_integer((json_int_t)r->source_tensor_bytes));
    json_object_set_new(o, "n_tensors_in", json_integer((json_int_t)r->n_tensors_in));
    json_object_set_new(o, "n_tensors_out", json_integer((json_int_t)r->n_tensors_out));
    json_object_set_new(o, "bytes_written", json_integer((json_int_t)r->bytes_written));
    json_object_set_new(o, "rank_bytes", json_integer((json_int_t)r->rank_bytes));
    json_object_set_new(o, "ranks_written", json_integer(r->n_ranks_written));
    json_object_set_new(o, "ranks_reused", json_integer(r->n_ranks_reused));
    json_object_set_new(o, "seconds", json_real(r->seconds));
    json_object_set_new(o, "gb_per_s", json_real(r->gb_per_s));
    json_object_set_new(o, "kv_b_max_abs_err", json_real(r->kv_b_max_abs_err));
    json_object_set_new(o, "kv_b_max_abs", json_real(r->kv_b_max_abs));
    if (r->ranks) {
        json_t *a = json_array();
        for (uint32_t i = 0; i < r->tp; i++) {
            json_t *x = json_object();
            json_object_set_new(x, "rank", json_integer(r->ranks[i].rank));
            json_object_set_new(x, "path", json_string(r->ranks[i].path));
            json_object_set_new(x, "bytes", json_integer((json_int_t)r->ranks[i].file_size));
            json_object_set_new(x, "header_xxh128", hex16(r->ranks[i].header_hash));
            json_object_set_new(x, "reused", json_boolean(r->ranks[i].reused));
            json_array_append_new(a, x);
        }
        json_object_set_new(o, "ranks", a);
    }
    if (with_plan && r->plan) {
        const shard_plan *p = r->plan;
        json_object_set_new(o, "rank_data_bytes", json_integer((json_int_t)p->data_size));
        json_t *a = json_array();
        for (uint64_t i = 0; i < p->n_tensors; i++) {
            const shard_tensor *t = &p->tensors[i];
            json_t *x = json_object(), *g = json_array(), *l = json_array();
            for (uint32_t d = 0; d < t->n_dims; d++) {
                json_array_append_new(g, json_integer((json_int_t)t->ne_global[d]));
                json_array_append_new(l, json_integer((json_int_t)t->ne_local[d]));
            }
            json_object_set_new(x, "name", json_string(t->name));
            json_object_set_new(x, "type", json_string(quant_type_name(t->type)));
            json_object_set_new(x, "rule", json_string(shard_rule_name(t->rule)));
            json_object_set_new(x, "why", json_string(t->why));
            json_object_set_new(x, "ne", g);
            json_object_set_new(x, "ne_rank", l);
            json_object_set_new(x, "bytes_per_rank", json_integer((json_int_t)t->local_bytes));
            json_object_set_new(x, "source_bytes", json_integer((json_int_t)t->src_bytes));
            json_array_append_new(a, x);
        }
        json_object_set_new(o, "plan", a);
    }
    char *s = json_dumps(o, JSON_INDENT(2));
    json_decref(o);
    return s;
}

char *convert_verify_result_json(const convert_verify_result *r) {
    json_t *o = json_object();
    if (!o) return NULL;
    json_object_set_new(o, "ok", json_boolean(r->ok));
    json_object_set_new(o, "tp", json_integer(r->tp));
    json_object_set_new(o, "set_id", hex16(r->set_id));
    json_object_set_new(o, "bytes_hashed", json_integer((json_int_t)r->bytes_hashed));
    json_object_set_new(o, "seconds", json_real(r->seconds));
    json_t *a = json_array();
    for (uint32_t i = 0; i < r->n_ranks; i++) {
        const convert_verify_rank *v = &r->ranks[i];
        json_t *x = json_object();
        json_object_set_new(x, "rank", json_integer(v->rank));
        json_object_set_new(x, "path", json_string(v->path));
        json_object_set_new(x, "opened", json_boolean(v->opened));
        json_object_set_new(x, "bytes", json_integer((json_int_t)v->file_size));
        json_object_set_new(x, "tensors", json_integer((json_int_t)v->n_tensors));
        json_object_set_new(x, "tensors_bad", json_integer((json_int_t)v->n_tensors_bad));
        json_object_set_new(x, "chunks", json_integer((json_int_t)v->n_chunks));
        json_object_set_new(x, "chunks_bad", json_integer((json_int_t)v->n_chunks_bad));
        json_object_set_new(x, "deep_checked", json_integer((json_int_t)v->n_deep_checked));
        json_object_set_new(x, "deep_bad", json_integer((json_int_t)v->n_deep_bad));
        json_object_set_new(x, "kv_b_max_abs_err", json_real(v->kv_b_max_abs_err));
        json_array_append_new(a, x);
    }
    json_object_set_new(o, "ranks", a);
    json_t *f = json_array();
    for (uint64_t i = 0; i < r->n_findings_stored; i++) {
        const convert_finding *c = &r->findings[i];
        json_t *x = json_object();
        json_object_set_new(x, "rank", json_integer(c->rank));
        if (c->tensor >= 0) json_object_set_new(x, "tensor", json_integer(c->tensor));
        if (c->chunk >= 0) json_object_set_new(x, "chunk", json_integer(c->chunk));
        json_object_set_new(x, "status", json_string(g5_strerror(c->status)));
        json_object_set_new(x, "message", json_string(c->msg));
        json_array_append_new(f, x);
    }
    json_object_set_new(o, "findings", f);
    json_object_set_new(o, "n_findings", json_integer((json_int_t)r->n_findings));
    char *s = json_dumps(o, JSON_INDENT(2));
    json_decref(o);
    return s;
}
