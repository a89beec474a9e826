/* glm5-serve's CUDA backend (serve_int.h): the GPU model and a fixed set of GPU sequences
 * ("slots", one per batch place) whose caches hold max_ctx positions each, all allocated at load.
 * Built for real only with G5_WITH_CUDA (cuda/model.mk compiles this file again for
 * build/gpu/bin/glm5-serve); elsewhere the entry points are stubs that report the missing
 * backend, so serve_engine.c needs no conditional code. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/serve/serve_int.h"

#ifdef G5_WITH_CUDA

#include "runtime/gpu/gpu_model.h"

struct srv_gpu {
    rt_gpu_model *g;
    rt_gpu_seq **seq;          /* [n_slots] */
    uint8_t *busy;             /* [n_slots] */
    uint32_t n_slots, max_ctx, n_vocab;
    rt_gpu_seq **batch;        /* [n_slots] decode step scratch */
    uint64_t cache_bytes;
};

int srv_cuda_available(void) { return 1; }

g5_status srv_gpu_create(srv_server *s, const rt_model *m, const char *blob_dir, uint32_t n_slots,
                         uint32_t max_ctx, srv_gpu **out, g5_error *err) {
    *out = NULL;
    srv_gpu *b = calloc(1, sizeof *b);
    if (!b) return g5_fail(err, G5_ERR_NOMEM, "GPU backend");
    b->n_slots = n_slots;
    b->max_ctx = max_ctx;
    b->n_vocab = rt_model_hparams(m)->n_vocab;
    b->seq = calloc(n_slots, sizeof *b->seq);
    b->busy = calloc(n_slots, 1);
    b->batch = calloc(n_slots, sizeof *b->batch);
    if (!b->seq || !b->busy || !b->batch) {
        srv_gpu_free(b);
        return g5_fail(err, G5_ERR_NOMEM, "GPU backend: %u slots", n_slots);
    }
    rt_gpu_opts go;
    rt_gpu_opts_default(&go);
    go.device0 = s->cfg.gpu0;
    go.precision = s->cfg.gpu_fast ? RT_GPU_FAST : RT_GPU_PRECISE;
    go.cache = (rt_gpu_cache)s->cfg.gpu_kv_cache;
    go.load.verify = !s->cfg.gpu_no_verify;
    go.blob_dir = blob_dir;
    g5_status st = rt_gpu_model_create(m, &go, &b->g, err);
    if (st) {
        g5_error_prefix(err, "GPU model");
        srv_gpu_free(b);
        return st;
    }
    /* every slot's caches now: a full GPU shows at load, not in the middle of a request */
    for (uint32_t i = 0; i < n_slots; i++) {
        if ((st = rt_gpu_seq_create(b->g, max_ctx, &b->seq[i], err))) {
            g5_error_prefix(err, "GPU caches (--max-batch %u x --ctx-size %u positions, %.3f GB)", n_slots, max_ctx,
                            (double)rt_gpu_seq_bytes(b->g, max_ctx) * n_slots / 1e9);
            srv_gpu_free(b);
            return st;
        }
    }
    b->cache_bytes = rt_gpu_seq_bytes(b->g, max_ctx) * n_slots;
    *out = b;
    return G5_OK;
}

void srv_gpu_free(srv_gpu *b) {
    if (!b) return;
    for (uint32_t i = 0; b->seq && i < b->n_slots; i++) rt_gpu_seq_free(b->seq[i]);
    rt_gpu_model_free(b->g);
    free(b->seq);
    free(b->busy);
    free(b->batch);
    free(b);
}

void srv_gpu_describe(const srv_gpu *b, char *buf, size_t cap) {
    const rt_gpu_info *gi = rt_gpu_model_info(b->g);
    snprintf(buf, cap, "GPU %s: %u rank%s on %u device%s (collective %s), %s, %s latent cache; weights %.3f GB in "
             "%.2f s (%.2f GB/s, checksums %s); caches %.3f GB for %u sequences x %u positions",
             gi->device_name, gi->n_ranks, gi->n_ranks > 1 ? "s" : "", gi->n_devices, gi->n_devices > 1 ? "s" : "",
             gi->collective, gi->precision, gi->cache, gi->load.bytes / 1e9, gi->load.seconds, gi->load.gb_per_s,
             gi->load.verified ? "verified" : "skipped", b->cache_bytes / 1e9, b->n_slots, b->max_ctx);
}

uint64_t srv_gpu_load_bytes(const srv_gpu *b) { return rt_gpu_model_info(b->g)->load.bytes; }

int srv_gpu_slot_take(srv_gpu *b) {
    for (uint32_t i = 0; i < b->n_slots; i++)
        if (!b->busy[i]) {
            b->busy[i] = 1;
            rt_gpu_seq_reset(b->seq[i]);
            return (int)i;
        }
    return -1;
}

void srv_gpu_slot_put(srv_gpu *b, int slot) {
    if (slot < 0 || (uint32_t)slot >= b->n_slots) return;
    rt_gpu_seq_reset(b->seq[slot]);
    b->busy[slot] = 0;
}

static g5_status check_slot(const srv_gpu *b, int slot, uint32_t n, g5_error *err) {
    if (slot < 0 || (uint32_t)slot >= b->n_slots || !b->busy[slot])
        return g5_fail(err, G5_ERR_INTERNAL, "GPU slot %d is not in use", slot);
    const uint32_t past = rt_gpu_seq_n_past(b->seq[slot]);
    if ((uint64_t)past + n > b->max_ctx) /* the caches were sized for max_ctx: never grow mid-step */
        return g5_fail(err, G5_ERR_BOUNDS, "sequence of %u + %u tokens exceeds the context %u", past, n, b->max_ctx);
    return G5_OK;
}

g5_status srv_gpu_prefill(srv_gpu *b, int slot, const int32_t *toks, uint32_t n, float *logits,
                          g5_error *err) {
    g5_status st = check_slot(b, slot, n, err);
    if (st) return st;
    const rt_gpu_outputs out = {.logits = logits};
    return rt_gpu_forward_seq(b->g, b->seq[slot], toks, n, logits ? &out : NULL, err);
}

g5_status srv_gpu_decode(srv_gpu *b, const int *slots, const int32_t *toks, uint32_t n, float *logits,
                         g5_error *err) {
    if (n > b->n_slots) return g5_fail(err, G5_ERR_INTERNAL, "decode batch of %u > %u slots", n, b->n_slots);
    for (uint32_t i = 0; i < n; i++) {
        g5_status st = check_slot(b, slots[i], 1, err);
        if (st) return st;
        b->batch[i] = b->seq[slots[i]];
    }
    return rt_gpu_forward_batch(b->g, b->batch, toks, n, logits, err);
}

#else /* !G5_WITH_CUDA */

int srv_cuda_available(void) { return 0; }

static g5_status no_cuda(g5_error *err) {
    return g5_fail(err, G5_ERR_UNSUPPORTED, "this build has no CUDA backend: use build/gpu/bin/glm5-serve (make gpu-model)");
}

g5_status srv_gpu_create(srv_server *s, const rt_model *m, const char *blob_dir, uint32_t n_slots,
                         uint32_t max_ctx, srv_gpu **out, g5_error *err) {
    (void)s, (void)m, (void)blob_dir, (void)n_slots, (void)max_ctx;
    *out = NULL;
    return no_cuda(err);
}
void srv_gpu_free(srv_gpu *b) { (void)b; }
void srv_gpu_describe(const srv_gpu *b, char *buf, size_t cap) {
    (void)b;
    if (cap) buf[0] = 0;
}
uint64_t srv_gpu_load_bytes(const srv_gpu *b) {
    (void)b;
    return 0;
}
int srv_gpu_slot_take(srv_gpu *b) {
    (void)b;
    return -1;
}
void srv_gpu_slot_put(srv_gpu *b, int slot) { (void)b, (void)slot; }
g5_status srv_gpu_prefill(srv_gpu *b, int slot, const int32_t *toks, uint32_t n, float *logits,
                          g5_error *err) {
    (void)b, (void)slot, (void)toks, (void)n, (void)logits;
    return no_cuda(err);
}
g5_status srv_gpu_decode(srv_gpu *b, const int *slots, const int32_t *toks, uint32_t n, float *logits,
                         g5_error *err) {
    (void)b, (void)slots, (void)toks, (void)n, (void)logits;
    return no_cuda(err);
}

#endif
