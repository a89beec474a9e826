/* The block pool and block tables of the paged caches (kvcache.h). */
#include "runtime/cpu/kvcache.h"

#include <stdlib.h>
#include <string.h>

#define GROW_FIRST 16 /* ids a growable pool starts with */

/* Makes ids [p->cap, nc) exist and free (lowest handed out first). Under mu or before sharing. */
static g5_status pool_grow(rt_kvpool *p, uint32_t nc, g5_error *err) {
    float **mem = realloc(p->mem, (size_t)nc * sizeof *mem);
    if (mem) p->mem = mem;
    uint8_t *used = mem ? realloc(p->used, nc) : NULL;
    if (used) p->used = used;
    uint32_t *fr = used ? realloc(p->free_ids, (size_t)nc * sizeof *fr) : NULL;
    if (fr) p->free_ids = fr;
    if (!mem || !used || !fr) return g5_fail(err, G5_ERR_NOMEM, "kv pool: table of %u blocks", nc);
    memset(p->mem + p->cap, 0, (size_t)(nc - p->cap) * sizeof *p->mem);
    memset(p->used + p->cap, 0, nc - p->cap);
    /* the new ids go under the existing free ones, highest first, so the stack pops the lowest
     * of them once the older free ids are gone */
    memmove(p->free_ids + (nc - p->cap), p->free_ids, (size_t)p->n_free * sizeof *fr);
    for (uint32_t i = 0; i < nc - p->cap; i++) p->free_ids[i] = nc - 1 - i;
    p->n_free += nc - p->cap;
    p->cap = nc;
    return G5_OK;
}

g5_status rt_kvpool_create_layout(const rt_kvlayout *lay, uint32_t n_blocks, uint32_t block_tokens,
                                  rt_kvpool **out, g5_error *err) {
    *out = NULL;
    if (!block_tokens || !lay->n_ranks || !lay->n_layers || !lay->kv_width)
        return g5_fail(err, G5_ERR_INVALID_ARG,
                       "kv pool: %u-token blocks of %u ranks x %u layers x %u floats", block_tokens,
                       lay->n_ranks, lay->n_layers, lay->kv_width);
    rt_kvpool *p = calloc(1, sizeof *p);
    if (!p) return g5_fail(err, G5_ERR_NOMEM, "kv pool");
    pthread_mutex_init(&p->mu, NULL);
    p->bt = block_tokens;
    p->n_ranks = lay->n_ranks;
    p->il0 = lay->il0;
    p->nl = lay->n_layers;
    p->kvw = lay->kv_width;
    p->idw = lay->idx_width;
    p->growable = n_blocks == 0;
    const size_t nrl = (size_t)lay->n_ranks * lay->n_layers;
    p->lat_off = malloc(nrl * sizeof *p->lat_off);
    p->idx_off = malloc(nrl * sizeof *p->idx_off);
    g5_status st = G5_OK;
    if (!p->lat_off || !p->idx_off) {
        st = g5_fail(err, G5_ERR_NOMEM, "kv pool layout");
        goto fail;
    }
    /* every region size is checked against overflow: block_tokens and the widths come from
     * callers (and a model's metadata) */
    uint64_t off = 0;
    for (size_t i = 0; i < nrl; i++) {
        const size_t l = i % lay->n_layers;
        uint64_t a, b;
        if (g5_mul_u64(block_tokens, lay->kv_width, &a) || g5_add_u64(off, a, &b)) goto overflow;
        p->lat_off[i] = (size_t)off;
        off = b;
        if (lay->idx_width && (!lay->has_idx || lay->has_idx[l])) {
            if (g5_mul_u64(block_tokens, lay->idx_width, &a) || g5_add_u64(off, a, &b)) goto overflow;
            p->idx_off[i] = (size_t)off;
            off = b;
        } else {
            p->idx_off[i] = SIZE_MAX;
        }
    }
    uint64_t bytes;
    if (g5_mul_u64(off, sizeof(float), &bytes) || bytes > (uint64_t)SIZE_MAX / 2) goto overflow;
    p->block_floats = (size_t)off;
    if ((st = pool_grow(p, n_blocks ? n_blocks : GROW_FIRST, err))) goto fail;
    *out = p;
    return G5_OK;
overflow:
    st = g5_fail(err, G5_ERR_OVERFLOW, "kv pool: a block of %u tokens is too large", block_tokens);
fail:
    rt_kvpool_free(p);
    return st;
}

void rt_kvpool_free(rt_kvpool *p) {
    if (!p) return;
    for (uint32_t i = 0; p->mem && i < p->cap; i++) free(p->mem[i]);
    free(p->mem);
    free(p->used);
    free(p->free_ids);
    free(p->lat_off);
    free(p->idx_off);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

static rt_kvpool *unconst(const rt_kvpool *p) { return (rt_kvpool *)(uintptr_t)p; }

uint32_t rt_kvpool_n_blocks(const rt_kvpool *p) {
    pthread_mutex_lock(&unconst(p)->mu);
    uint32_t n = p->cap;
    pthread_mutex_unlock(&unconst(p)->mu);
    return n;
}

uint32_t rt_kvpool_n_free(const rt_kvpool *p) {
    pthread_mutex_lock(&unconst(p)->mu);
    uint32_t n = p->n_free;
    pthread_mutex_unlock(&unconst(p)->mu);
    return n;
}

uint32_t rt_kvpool_block_tokens(const rt_kvpool *p) { return p->bt; }
uint64_t rt_kvpool_block_bytes(const rt_kvpool *p) { return (uint64_t)p->block_floats * sizeof(float); }

/* Hands out k ids (with their memory) or none. */
static g5_status pool_take(rt_kvpool *p, uint32_t k, uint32_t *ids, float **ptr, g5_error *err) {
    g5_status st = G5_OK;
    pthread_mutex_lock(&p->mu);
    if (p->n_free < k && p->growable) {
        uint64_t want = (uint64_t)p->cap - p->n_free + k, nc = p->cap;
        while (nc < want) nc *= 2;
        if (nc > UINT32_MAX) st = g5_fail(err, G5_ERR_OVERFLOW, "kv pool: %llu blocks", (unsigned long long)nc);
        else st = pool_grow(p, (uint32_t)nc, err);
    }
    if (!st && p->n_free < k)
        st = g5_fail(err, G5_ERR_NOMEM, "kv pool exhausted: %u blocks of %u tokens, %u free, %u needed",
                     p->cap, p->bt, p->n_free, k);
    for (uint32_t i = 0; !st && i < k; i++) {
        const uint32_t id = p->free_ids[p->n_free - 1];
        if (!p->mem[id]) {
            void *mem = NULL;
            if (posix_memalign(&mem, 64, p->block_floats * sizeof(float))) {
                st = g5_fail(err, G5_ERR_NOMEM, "kv pool: memory of a %zu-byte block",
                             p->block_floats * sizeof(float));
                /* give back what this call took */
                for (uint32_t j = i; j-- > 0;) {
                    p->used[ids[j]] = 0;
                    p->free_ids[p->n_free++] = ids[j];
                }
                break;
            }
            p->mem[id] = mem;
        }
        p->n_free--;
        p->used[id] = 1;
        ids[i] = id;
        ptr[i] = p->mem[id];
    }
    pthread_mutex_unlock(&p->mu);
    return st;
}

static void pool_put(rt_kvpool *p, const uint32_t *ids, uint32_t k) {
    pthread_mutex_lock(&p->mu);
    /* in reverse, so that a table's blocks come back out in the same order */
    for (uint32_t i = k; i-- > 0;) {
        const uint32_t id = ids[i];
        if (id < p->cap && p->used[id]) {
            p->used[id] = 0;
            p->free_ids[p->n_free++] = id;
        }
    }
    pthread_mutex_unlock(&p->mu);
}

uint32_t rt_kvtab_blocks_for(const rt_kvtab *t, uint64_t n_tokens) {
    const uint64_t n = n_tokens / t->pool->bt + (n_tokens % t->pool->bt != 0);
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

g5_status rt_kvtab_reserve(rt_kvtab *t, uint64_t n_tokens, g5_error *err) {
    const uint32_t need = rt_kvtab_blocks_for(t, n_tokens);
    if (need <= t->n) return G5_OK;
    if (need > t->cap) {
        uint32_t nc = t->cap ? t->cap : 8;
        while (nc < need) nc = nc > UINT32_MAX / 2 ? need : nc * 2;
        uint32_t *ids = realloc(t->ids, (size_t)nc * sizeof *ids);
        if (ids) t->ids = ids;
        float **ptr = ids ? realloc(t->ptr, (size_t)nc * sizeof *ptr) : NULL;
        if (ptr) t->ptr = ptr;
        if (!ids || !ptr) return g5_fail(err, G5_ERR_NOMEM, "kv block table of %u blocks", nc);
        t->cap = nc;
    }
    g5_status st = pool_take(t->pool, need - t->n, t->ids + t->n, t->ptr + t->n, err);
    if (st) return st;
    t->n = need;
    return G5_OK;
}

void rt_kvtab_shrink_blocks(rt_kvtab *t, uint32_t n_blocks) {
    if (n_blocks >= t->n) return;
    pool_put(t->pool, t->ids + n_blocks, t->n - n_blocks);
    t->n = n_blocks;
}

void rt_kvtab_release(rt_kvtab *t) {
    if (t->pool) rt_kvtab_shrink_blocks(t, 0);
    free(t->ids);
    free(t->ptr);
    if (t->own) rt_kvpool_free(t->pool);
    memset(t, 0, sizeof *t);
}
