/* The GPU prefix store (gpu_model.h, "prefix store"): per rank one device allocation of n_blocks
 * slots, each holding bt positions of everything a sequence keeps per position on that rank:
 * every main layer's latent rows (the model's cache type, bytes as they are) and every full
 * layer's indexer keys (float32). A slot is [n_layer_main][bt][lat_w] latents, then (256-byte
 * aligned) [full layers][bt][idx_head_dim] keys: the sequence's caches ([layer][cap][width])
 * restricted to bt rows, so one block moves by one 2-D copy per cache kind and rank
 * (cudaMemcpy2DAsync on the rank's stream, ordered with the forward calls that write and read
 * those caches). The NextN layer's caches are not stored: the engine keeps the hidden states
 * they are rebuilt from (runtime/engine.h kv_prefix_hidden). Which slot holds which block is the caller's (runtime/prefix.h).
 * Compiled to nothing unless G5_WITH_CUDA. */
#ifdef G5_WITH_CUDA

#include "runtime/gpu/gpu_model.h"

#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdlib.h>

#include "runtime/gpu/gpu_int.h"

struct rt_gpu_prefix {
    rt_gpu_model *g;
    uint32_t bt, n_blocks;
    uint64_t lat_bytes, block_bytes; /* per rank: a slot's latent part; the whole slot */
    uint8_t **mem;                   /* [T] each rank's slots */
    uint64_t max_pitch;              /* the smallest cudaDevAttrMaxPitch of the ranks' devices */
};

static uint64_t up256(uint64_t b) { return (b + 255) & ~(uint64_t)255; }

static uint64_t lat_part(const rt_gpu_model *g, uint32_t bt) {
    return up256((uint64_t)g->hp.n_layer_main * bt * gm_lat_w(&g->hp) * g->lat_es);
}

uint64_t rt_gpu_prefix_block_bytes(const rt_gpu_model *g, uint32_t bt) {
    return lat_part(g, bt) + up256((uint64_t)glm5_n_idx_full(&g->hp) * bt * g->hp.idx_head_dim * sizeof(float));
}

g5_status rt_gpu_prefix_create(rt_gpu_model *g, uint32_t bt, uint32_t n_blocks, rt_gpu_prefix **out,
                               g5_error *err) {
    *out = NULL;
    if (!bt || !n_blocks) return g5_fail(err, G5_ERR_INVALID_ARG, "prefix store of %u blocks of %u tokens", n_blocks, bt);
    rt_gpu_prefix *p = calloc(1, sizeof *p);
    if (p) p->mem = calloc(g->T, sizeof *p->mem);
    if (!p || !p->mem) {
        if (p) free(p->mem);
        free(p);
        return g5_fail(err, G5_ERR_NOMEM, "prefix store");
    }
    p->g = g;
    p->bt = bt;
    p->n_blocks = n_blocks;
    p->lat_bytes = lat_part(g, bt);
    p->block_bytes = rt_gpu_prefix_block_bytes(g, bt);
    p->max_pitch = UINT64_MAX;
    for (uint32_t r = 0; r < g->T; r++) {
        int mp = 0;
        cudaError_t ce = cudaSetDevice(g->rk[r].dev);
        if (ce == cudaSuccess) ce = cudaDeviceGetAttribute(&mp, cudaDevAttrMaxPitch, g->rk[r].dev);
        if (ce == cudaSuccess && (uint64_t)(mp > 0 ? mp : 0) < p->max_pitch) p->max_pitch = (uint64_t)(mp > 0 ? mp : 0);
        if (ce == cudaSuccess) ce = cudaMalloc((void **)&p->mem[r], (size_t)(p->block_bytes * n_blocks));
        if (ce != cudaSuccess) {
            (void)cudaGetLastError(); /* must not surface at a later launch check */
            g5_status st = g5_fail(err, ce == cudaErrorMemoryAllocation ? G5_ERR_NOMEM : G5_ERR_INTERNAL,
                                   "rank %u: prefix store of %u blocks of %u tokens (%.1f MB): %s", g->rk[r].rg,
                                   n_blocks, bt, (double)p->block_bytes * n_blocks / 1e6, cudaGetErrorString(ce));
            p->mem[r] = NULL;
            rt_gpu_prefix_free(p);
            return st;
        }
    }
    *out = p;
    return G5_OK;
}

void rt_gpu_prefix_free(rt_gpu_prefix *p) {
    if (!p) return;
    for (uint32_t r = 0; r < p->g->T; r++)
        if (p->mem[r]) {
            cudaSetDevice(p->g->rk[r].dev);
            cudaFree(p->mem[r]);
        }
    free(p->mem);
    free(p);
}

uint32_t rt_gpu_prefix_n_blocks(const rt_gpu_prefix *p) { return p->n_blocks; }
uint32_t rt_gpu_prefix_block_tokens(const rt_gpu_prefix *p) { return p->bt; }

/* A 2-D device copy on st: h rows of w bytes; one cudaMemcpy2DAsync unless a pitch exceeds what
 * it takes (max: cudaDevAttrMaxPitch, 2^31 - 1 on current GPUs, a sequence layer of ~900k float32
 * latent positions), then one copy per row. */
static cudaError_t copy2d(void *dst, uint64_t dp, const void *src, uint64_t sp, uint64_t w, uint64_t h, uint64_t max,
                          cudaStream_t st) {
    if (dp <= max && sp <= max)
        return cudaMemcpy2DAsync(dst, dp, src, sp, w, h, cudaMemcpyDeviceToDevice, st);
    cudaError_t ce = cudaSuccess;
    for (uint64_t i = 0; i < h && ce == cudaSuccess; i++)
        ce = cudaMemcpyAsync((uint8_t *)dst + i * dp, (const uint8_t *)src + i * sp, w, cudaMemcpyDeviceToDevice, st);
    return ce;
}

/* Block `slot` of rank r and s's positions [k bt, (k+1) bt), copied one way (to_store) or the
 * other, on the rank's stream. */
static g5_status move_block(const rt_gpu_prefix *p, rt_gpu_seq *s, uint32_t r, uint32_t k, uint32_t slot, int to_store,
                            g5_error *err) {
    const rt_gpu_model *g = p->g;
    const glm5_hparams *hp = &g->hp;
    const gl_rank *rk = &g->rk[r];
    const uint64_t LW = gm_lat_w(hp), ID = hp->idx_head_dim, Lm = hp->n_layer_main, Lf = glm5_n_idx_full(hp);
    const uint64_t bt = p->bt, cap = s->cap, es = g->lat_es, mp = p->max_pitch;
    uint8_t *blk = p->mem[r] + (uint64_t)slot * p->block_bytes;
    uint8_t *lat = (uint8_t *)s->rk[r].lat + (uint64_t)k * bt * LW * es;
    CUK_CHECK(cudaSetDevice(rk->dev));
    /* rows: layers; a row: bt positions' latents (pitch: a layer of the store, of the sequence) */
    const uint64_t lw = bt * LW * es, lp = cap * LW * es;
    CUK_CHECK(to_store ? copy2d(blk, lw, lat, lp, lw, Lm, mp, rk->st) : copy2d(lat, lp, blk, lw, lw, Lm, mp, rk->st));
    if (Lf) {
        uint8_t *kb = blk + p->lat_bytes;
        uint8_t *ks = (uint8_t *)(s->rk[r].idxk + (uint64_t)k * bt * ID);
        const uint64_t kw = bt * ID * 4, kp = cap * ID * 4;
        CUK_CHECK(to_store ? copy2d(kb, kw, ks, kp, kw, Lf, mp, rk->st) : copy2d(ks, kp, kb, kw, kw, Lf, mp, rk->st));
    }
    return G5_OK;
}

g5_status rt_gpu_prefix_save(rt_gpu_prefix *p, const rt_gpu_seq *s, uint32_t k, uint32_t slot, g5_error *err) {
    if (!s || s->g != p->g) return g5_fail(err, G5_ERR_INVALID_ARG, "prefix store: a sequence of another GPU model");
    if (slot >= p->n_blocks || (uint64_t)(k + 1) * p->bt > s->n_past)
        return g5_fail(err, G5_ERR_INVALID_ARG, "prefix store: block %u (slot %u of %u) of a sequence of %u positions", k,
                       slot, p->n_blocks, s->n_past);
    for (uint32_t r = 0; r < p->g->T; r++) CK(move_block(p, (rt_gpu_seq *)s, r, k, slot, 1, err));
    return G5_OK;
}

g5_status rt_gpu_prefix_load(rt_gpu_prefix *p, rt_gpu_seq *s, const uint32_t *slots, uint32_t n, g5_error *err) {
    if (!s || s->g != p->g) return g5_fail(err, G5_ERR_INVALID_ARG, "prefix store: a sequence of another GPU model");
    if (s->n_past || s->mtp_n_past)
        return g5_fail(err, G5_ERR_INVALID_ARG, "prefix store: the sequence holds %u/%u positions, not none",
                       s->n_past, s->mtp_n_past);
    if (!n) return G5_OK;
    if ((uint64_t)n * p->bt > INT32_MAX) return g5_fail(err, G5_ERR_OVERFLOW, "prefix of %u blocks", n);
    for (uint32_t k = 0; k < n; k++)
        if (slots[k] >= p->n_blocks)
            return g5_fail(err, G5_ERR_INVALID_ARG, "prefix store: slot %u of %u", slots[k], p->n_blocks);
    CK(gm_seq_need(s, n * p->bt, err));
    for (uint32_t r = 0; r < p->g->T; r++)
        for (uint32_t k = 0; k < n; k++) CK(move_block(p, s, r, k, slots[k], 0, err));
    s->n_past = n * p->bt;
    return G5_OK;
}

#else
typedef int rt_gpu_prefix_unused_;
#endif
