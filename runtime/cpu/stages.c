/* Stage runs for the GPU --check (model.h, "stage runs"): one layer's attention or FFN/MoE of a
 * one-rank model from a caller's input, through the forward pass's own stage functions. */
#include <stdlib.h>
#include <string.h>

#include "runtime/cpu/model_impl.h"

struct rt_stage {
    rt_model *m;
    rt_layer_cache *cache;       /* [n_layer_main] the stage run's own caches */
    uint32_t cap;                /* positions they hold */
    uint8_t *mem;                /* the work buffers of the current call */
    rt_work w;
    uint32_t n, pos0;
};

g5_status rt_stage_create(rt_model *m, rt_stage **out, g5_error *err) {
    *out = NULL;
    if (m->n_ranks != 1 || m->n_local != 1)
        return g5_fail(err, G5_ERR_UNSUPPORTED, "stage runs need a model of one rank (this one has %u)", m->n_ranks);
    rt_stage *s = calloc(1, sizeof *s);
    if (s) s->cache = calloc(m->hp.n_layer_main ? m->hp.n_layer_main : 1, sizeof *s->cache);
    if (!s || !s->cache) {
        free(s);
        return g5_fail(err, G5_ERR_NOMEM, "stage run caches");
    }
    s->m = m;
    *out = s;
    return G5_OK;
}

void rt_stage_free(rt_stage *s) {
    if (!s) return;
    for (uint32_t il = 0; il < s->m->hp.n_layer_main; il++) {
        free(s->cache[il].lat);
        free(s->cache[il].idxk);
    }
    free(s->cache);
    free(s->mem);
    free(s);
}

static g5_status reserve(rt_stage *s, uint32_t need, g5_error *err) {
    if (need <= s->cap) return G5_OK;
    const glm5_hparams *hp = &s->m->hp;
    uint32_t nc = s->cap ? s->cap : 64;
    while (nc < need) nc *= 2;
    const size_t lw = (size_t)hp->kv_lora + hp->qk_rope, iw = hp->idx_head_dim;
    for (uint32_t il = 0; il < hp->n_layer_main; il++) {
        float *a = realloc(s->cache[il].lat, (size_t)nc * lw * sizeof(float));
        if (!a) return g5_fail(err, G5_ERR_NOMEM, "stage run: latent cache of %u positions", nc);
        s->cache[il].lat = a;
        if (!hp->idx_full[il]) continue; /* a shared layer keeps no indexer keys */
        float *b = realloc(s->cache[il].idxk, (size_t)nc * iw * sizeof(float));
        if (!b) return g5_fail(err, G5_ERR_NOMEM, "stage run: indexer cache of %u positions", nc);
        s->cache[il].idxk = b;
    }
    s->cap = nc;
    return G5_OK;
}

g5_status rt_stage_begin(rt_stage *s, uint32_t pos0, uint32_t n, g5_error *err) {
    const glm5_hparams *hp = &s->m->hp;
    if (n == 0 || pos0 > UINT32_MAX - n) return g5_fail(err, G5_ERR_INVALID_ARG, "stage run of %u tokens at %u", n, pos0);
    g5_status st = reserve(s, pos0 + n, err);
    if (st) return st;
    free(s->mem);
    s->mem = NULL;
    if ((st = rt_work_alloc(s->m, &s->m->ranks[0], n, pos0 + n, &s->mem, &s->w, err))) return st;
    for (uint32_t t = 0; t < n; t++)
        rt_rope_table(pos0 + t, hp->qk_rope, hp->rope_theta, s->w.rope + (size_t)t * hp->qk_rope);
    s->n = n;
    s->pos0 = pos0;
    return G5_OK;
}

void rt_stage_attn(rt_stage *s, uint32_t il, const float *x, float *out, int32_t *sel) {
    rt_model *m = s->m;
    rt_rank *rk = &m->ranks[0];
    const size_t E = m->hp.n_embd, N = s->n;
    rt_fwd f = {.m = m, .s = NULL, .n = s->n, .pos0 = s->pos0};
    memcpy(s->w.x, x, N * E * sizeof(float));
    rt_attn_layer(&f, rk, &rk->layers[il], &s->cache[il], &s->w);
    memcpy(out, s->w.part, N * E * sizeof(float));
    if (sel) memcpy(sel, s->w.sel, N * m->hp.idx_top_k * sizeof(int32_t));
}

void rt_stage_ffn(rt_stage *s, uint32_t il, const float *xmid, float *out, int32_t *experts) {
    rt_model *m = s->m;
    const glm5_hparams *hp = &m->hp;
    rt_rank *rk = &m->ranks[0];
    const rt_layer *L = &rk->layers[il];
    const uint32_t E = hp->n_embd, n = s->n;
    for (uint32_t t = 0; t < n; t++)
        rt_rmsnorm(xmid + (size_t)t * E, L->ffn_norm, E, hp->rms_eps, s->w.h + (size_t)t * E);
    if (L->dense) {
        rt_ffn_dense(rk, L, &s->w, n, E);
    } else {
        rt_fwd f = {.m = m, .s = NULL, .n = n, .pos0 = s->pos0}; /* one rank: no exchange */
        rt_ffn_moe(&f, rk, L, &s->w, n);
        if (experts) memcpy(experts, s->w.ch_e, (size_t)n * hp->n_expert_used * sizeof(int32_t));
    }
    memcpy(out, s->w.part, (size_t)n * E * sizeof(float));
}

void rt_stage_head(rt_stage *s, const float *x, float *logits) {
    rt_model *m = s->m;
    const glm5_hparams *hp = &m->hp;
    rt_rank *rk = &m->ranks[0];
    const uint32_t E = hp->n_embd, n = s->n;
    for (uint32_t t = 0; t < n; t++) rt_rmsnorm(x + (size_t)t * E, rk->output_norm, E, hp->rms_eps, s->w.h + (size_t)t * E);
    rt_matmul(rk->pool, &rk->output.mat, s->w.h, E, n, logits, hp->n_vocab); /* one rank: all columns */
}
