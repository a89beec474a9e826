#include "runtime/cpu/weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "format/blob.h"
#include "format/glm5.h"
#include "format/quant.h"

struct rt_weights {
    rt_tensor *t;      /* [n] */
    uint64_t n, cap;
    const rt_tensor **sorted; /* into t, sorted by name (t is not resized after finish) */
};

struct rt_wset {
    uint32_t n_ranks;
    uint32_t first, count; /* the ranks opened (a process's part of the set): [first, first + count) */
    int ep;
    const char *source;
    rt_weights *ranks;     /* [n_ranks] */
    gguf_ctx *gguf;        /* GGUF source: the model file, also the metadata */
    const gguf_ctx *meta;
    void **owned;          /* buffers and names to free */
    uint64_t n_owned, cap_owned;
    void (*close_src)(void *);
    void *src;             /* source handle (blob set) */
};

static g5_status own(rt_wset *ws, void *p, g5_error *err) {
    if (ws->n_owned == ws->cap_owned) {
        uint64_t nc = ws->cap_owned ? ws->cap_owned * 2 : 64;
        void **q = realloc(ws->owned, nc * sizeof *q);
        if (!q) {
            free(p);
            return g5_fail(err, G5_ERR_NOMEM, "weight set bookkeeping");
        }
        ws->owned = q;
        ws->cap_owned = nc;
    }
    ws->owned[ws->n_owned++] = p;
    return G5_OK;
}

static g5_status add_tensor(rt_weights *w, const rt_tensor *t, g5_error *err) {
    if (w->n == w->cap) {
        uint64_t nc = w->cap ? w->cap * 2 : 128;
        rt_tensor *q = realloc(w->t, nc * sizeof *q);
        if (!q) return g5_fail(err, G5_ERR_NOMEM, "tensor table");
        w->t = q;
        w->cap = nc;
    }
    w->t[w->n++] = *t;
    return G5_OK;
}

static int cmp_tensor(const void *a, const void *b) {
    return strcmp((*(const rt_tensor *const *)a)->name, (*(const rt_tensor *const *)b)->name);
}

/* Builds the name index once the table is complete. */
static g5_status finish(rt_weights *w, g5_error *err) {
    w->sorted = malloc((w->n ? w->n : 1) * sizeof *w->sorted);
    if (!w->sorted) return g5_fail(err, G5_ERR_NOMEM, "tensor index");
    for (uint64_t i = 0; i < w->n; i++) w->sorted[i] = &w->t[i];
    qsort(w->sorted, w->n, sizeof *w->sorted, cmp_tensor);
    for (uint64_t i = 1; i < w->n; i++)
        if (strcmp(w->sorted[i - 1]->name, w->sorted[i]->name) == 0)
            return g5_fail(err, G5_ERR_DUPLICATE, "tensor '%s' appears twice", w->sorted[i]->name);
    return G5_OK;
}

const rt_tensor *rt_weights_find(const rt_weights *w, const char *name) {
    uint64_t lo = 0, hi = w->n;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(w->sorted[mid]->name, name);
        if (c == 0) return w->sorted[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

uint64_t rt_weights_n_tensors(const rt_weights *w) { return w->n; }
const rt_tensor *rt_weights_tensor(const rt_weights *w, uint64_t i) {
    return i < w->n ? &w->t[i] : NULL;
}

uint32_t rt_wset_n_ranks(const rt_wset *ws) { return ws->n_ranks; }
int rt_wset_expert_placement(const rt_wset *ws) { return ws->ep; }
const gguf_ctx *rt_wset_meta(const rt_wset *ws) { return ws->meta; }
const rt_weights *rt_wset_rank(const rt_wset *ws, uint32_t rank) {
    return rank >= ws->first && rank - ws->first < ws->count ? &ws->ranks[rank] : NULL;
}
uint32_t rt_wset_rank_first(const rt_wset *ws) { return ws->first; }
uint32_t rt_wset_rank_count(const rt_wset *ws) { return ws->count; }
const char *rt_wset_source(const rt_wset *ws) { return ws->source; }

void rt_wset_free(rt_wset *ws) {
    if (!ws) return;
    for (uint32_t r = 0; ws->ranks && r < ws->n_ranks; r++) {
        free(ws->ranks[r].t);
        free(ws->ranks[r].sorted);
    }
    free(ws->ranks);
    for (uint64_t i = 0; i < ws->n_owned; i++) free(ws->owned[i]);
    free(ws->owned);
    if (ws->close_src) ws->close_src(ws->src);
    gguf_free(ws->gguf);
    free(ws);
}

static rt_wset *wset_new(uint32_t n_ranks) {
    rt_wset *ws = calloc(1, sizeof *ws);
    if (!ws) return NULL;
    ws->ranks = calloc(n_ranks, sizeof *ws->ranks);
    if (!ws->ranks) {
        free(ws);
        return NULL;
    }
    ws->n_ranks = n_ranks;
    ws->count = n_ranks;
    return ws;
}

/* ---- GGUF source (TP = 1) ---- */

g5_status rt_wset_open_gguf(const char *path, rt_wset **out, g5_error *err) {
    *out = NULL;
    rt_wset *ws = wset_new(1);
    if (!ws) return g5_fail(err, G5_ERR_NOMEM, "%s: weight set", path);
    ws->source = "gguf";
    g5_status st = gguf_open(path, &ws->gguf, err);
    if (st) goto fail;
    ws->meta = ws->gguf;
    glm5_hparams hp; /* validated with every tensor before kv_b buffers are sized from it */
    if ((st = glm5_model_validate(ws->gguf, &hp, err))) {
        g5_error_prefix(err, "%s", path);
        goto fail;
    }
    rt_weights *w = &ws->ranks[0];
    int64_t nt = gguf_get_n_tensors(ws->gguf);
    for (int64_t i = 0; i < nt; i++) {
        const gguf_tensor *gt = gguf_get_tensor(ws->gguf, i);
        rt_tensor t = {gt->name, gt->type, gt->n_dims, {gt->ne[0], gt->ne[1], gt->ne[2], gt->ne[3]},
                       gt->nbytes, gt->data};
        if ((st = add_tensor(w, &t, err))) goto fail;
    }
    /* kv_b in HF's layout for every layer that lacks it: float32, lossless. */
    const uint64_t rows = (uint64_t)hp.n_head * (hp.qk_nope + hp.v_head);
    const uint64_t scratch_n = (uint64_t)(hp.qk_nope > hp.v_head ? hp.qk_nope : hp.v_head) * hp.kv_lora;
    float *scratch = malloc(scratch_n * sizeof(float));
    if (!scratch) {
        st = g5_fail(err, G5_ERR_NOMEM, "kv_b scratch");
        goto fail;
    }
    for (uint32_t il = 0; il < hp.n_layer; il++) {
        char name[96], kb[96], vb[96];
        snprintf(name, sizeof name, "blk.%u.attn_kv_b.weight", il);
        if (gguf_find_tensor(ws->gguf, name)) continue;
        snprintf(kb, sizeof kb, "blk.%u.attn_k_b.weight", il);
        snprintf(vb, sizeof vb, "blk.%u.attn_v_b.weight", il);
        const gguf_tensor *tk = gguf_find_tensor(ws->gguf, kb);
        const gguf_tensor *tv = gguf_find_tensor(ws->gguf, vb);
        if (!tk || !tv) {
            free(scratch);
            st = g5_fail(err, G5_ERR_MODEL, "%s: layer %u has neither attn_kv_b nor attn_k_b/attn_v_b",
                         path, il);
            goto fail;
        }
        float *kv = malloc(rows * hp.kv_lora * sizeof(float)); /* [rows, kv_lora] */
        char *nm = strdup(name);
        if (!kv || !nm) {
            free(kv);
            free(nm);
            free(scratch);
            st = g5_fail(err, G5_ERR_NOMEM, "%s: %s", path, name);
            goto fail;
        }
        if ((st = own(ws, kv, err))) { /* own() freed kv */
            free(nm);
            free(scratch);
            goto fail;
        }
        if ((st = own(ws, nm, err))) {
            free(scratch);
            goto fail;
        }
        if ((st = glm5_rebuild_kv_b(&hp, tk, tv, 0, hp.n_head, kv, scratch, err))) {
            free(scratch);
            g5_error_prefix(err, "%s", path);
            goto fail;
        }
        rt_tensor t = {nm, QT_F32, 2, {hp.kv_lora, rows, 1, 1}, rows * hp.kv_lora * sizeof(float), kv};
        if ((st = add_tensor(w, &t, err))) {
            free(scratch);
            goto fail;
        }
    }
    free(scratch);
    if ((st = finish(w, err))) goto fail;
    *out = ws;
    return G5_OK;
fail:
    rt_wset_free(ws);
    return st;
}

/* ---- caller-built tables ---- */

g5_status rt_wset_from_tables(const gguf_ctx *meta, uint32_t n_ranks, int expert_placement,
                              const rt_tensor *const *tables, const uint64_t *counts,
                              rt_wset **out, g5_error *err) {
    *out = NULL;
    if (!meta || n_ranks == 0 || !tables || !counts)
        return g5_fail(err, G5_ERR_INVALID_ARG, "weight tables: no metadata or no ranks");
    rt_wset *ws = wset_new(n_ranks);
    if (!ws) return g5_fail(err, G5_ERR_NOMEM, "weight set");
    ws->source = "tables";
    ws->meta = meta;
    ws->ep = expert_placement;
    g5_status st = G5_OK;
    for (uint32_t r = 0; r < n_ranks && !st; r++) {
        for (uint64_t i = 0; i < counts[r] && !st; i++) st = add_tensor(&ws->ranks[r], &tables[r][i], err);
        if (!st) st = finish(&ws->ranks[r], err);
    }
    if (st) {
        rt_wset_free(ws);
        return st;
    }
    *out = ws;
    return G5_OK;
}

/* ---- blob set (TP = N) ---- */

static void close_blob_set(void *s) { blob_set_free(s); }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Hashes the opened ranks' data (every tensor and chunk hash), all ranks at once. */
static g5_status verify_blobs(const blob_set *set, uint32_t jobs, rt_wset_load_info *info, g5_error *err) {
    const uint32_t first = blob_set_first(set), n = blob_set_count(set);
    const blob **bl = malloc(n * sizeof *bl);
    blob_verify_stats *vs = calloc(n, sizeof *vs);
    if (!bl || !vs) {
        free(bl);
        free(vs);
        return g5_fail(err, G5_ERR_NOMEM, "checksum verification");
    }
    for (uint32_t i = 0; i < n; i++) bl[i] = blob_set_rank(set, first + i);
    if (!jobs) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        jobs = nc > 0 ? (uint32_t)nc : 1;
    }
    double t0 = now_s();
    g5_status st = blob_verify_data(bl, n, jobs, vs, NULL, NULL, 0, err);
    info->seconds = now_s() - t0;
    info->jobs = jobs;
    for (uint32_t i = 0; i < n; i++) {
        info->bytes += vs[i].bytes;
        blob_verify_stats_clear(&vs[i]);
    }
    info->verified = st == G5_OK;
    free(bl);
    free(vs);
    return st;
}

static g5_status open_blobs(const char *dir, const rt_wset_opts *o, rt_wset **out, rt_wset_load_info *info,
                            g5_error *err) {
    *out = NULL;
    blob_set *set = NULL;
    g5_status st = o->count ? blob_set_open_ranks(dir, o->first, o->count, &set, err) : blob_set_open(dir, &set, err);
    if (st) return st;
    if (!o->no_verify && (st = verify_blobs(set, o->jobs, info, err))) {
        blob_set_free(set);
        return st;
    }
    const uint32_t T = blob_set_tp(set);
    rt_wset *ws = T ? wset_new(T) : NULL;
    if (!ws) {
        blob_set_free(set);
        return g5_fail(err, G5_ERR_NOMEM, "%s: weight set of %u ranks", dir, T);
    }
    ws->source = "blobs";
    ws->src = set;
    ws->close_src = close_blob_set;
    ws->first = blob_set_first(set);
    ws->count = blob_set_count(set);
    const blob *b0 = blob_set_rank(set, ws->first);
    ws->meta = blob_get_meta(b0);
    ws->ep = blob_get_info(b0)->placement == BLOB_PLACE_EP;
    glm5_hparams *hp = malloc(sizeof *hp);
    if (!hp || (st = glm5_meta_validate(ws->meta, hp, err))) {
        if (!hp) st = g5_fail(err, G5_ERR_NOMEM, "hyperparameters");
        free(hp);
        g5_error_prefix(err, "%s", blob_get_path(b0));
        rt_wset_free(ws);
        return st;
    }
    for (uint32_t r = ws->first; r < ws->first + ws->count; r++) {
        const blob *b = blob_set_rank(set, r);
        rt_weights *w = &ws->ranks[r];
        const uint64_t nt = blob_n_tensors(b);
        for (uint64_t i = 0; i < nt; i++) {
            const blob_tensor *bt = blob_get_tensor(b, i);
            /* 1-D tensors are whole on every rank: their values are checked too */
            if ((st = glm5_tensor_check(hp, bt->name, bt->type, bt->ne_global, bt->n_dims == 1 ? bt->data : NULL,
                                        bt->size, err))) {
                g5_error_prefix(err, "%s", blob_get_path(b));
                free(hp);
                goto fail;
            }
            rt_tensor t = {bt->name, bt->type, bt->n_dims,
                           {bt->ne[0], bt->ne[1], bt->ne[2], bt->ne[3]}, bt->size, bt->data};
            if ((st = add_tensor(w, &t, err))) {
                free(hp);
                goto fail;
            }
        }
        if ((st = finish(w, err))) {
            free(hp);
            goto fail;
        }
    }
    free(hp);
    *out = ws;
    return G5_OK;
fail:
    g5_error_prefix(err, "%s", dir);
    rt_wset_free(ws);
    return st;
}

const blob_set *rt_wset_blobs(const rt_wset *ws) {
    return ws->close_src == close_blob_set ? ws->src : NULL;
}

g5_status rt_wset_open_blobs(const char *dir, rt_wset **out, g5_error *err) {
    return rt_wset_open_blobs_ranks(dir, 0, 0, out, err);
}

g5_status rt_wset_open_blobs_ranks(const char *dir, uint32_t first, uint32_t count, rt_wset **out,
                                   g5_error *err) {
    rt_wset_opts o = {.first = first, .count = count};
    rt_wset_load_info info = {0};
    return open_blobs(dir, &o, out, &info, err);
}

g5_status rt_wset_open_ex(const char *path, const rt_wset_opts *o, rt_wset **out, rt_wset_load_info *info,
                          g5_error *err) {
    rt_wset_opts def = {0};
    rt_wset_load_info scratch;
    if (!o) o = &def;
    if (!info) info = &scratch;
    memset(info, 0, sizeof *info);
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) return open_blobs(path, o, out, info, err);
    return rt_wset_open_gguf(path, out, err);
}

g5_status rt_wset_open(const char *path, rt_wset **out, g5_error *err) {
    return rt_wset_open_ex(path, NULL, out, NULL, err);
}
