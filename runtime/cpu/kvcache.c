/* The block pool and block tables of the paged caches (kvcache.h). */
#include "runtime/cpu/kvcache.h"

#include "runtime/cpu/idtab.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define GROW_FIRST 16 /* ids a growable pool starts with */

/* Makes ids [p->cap, nc) exist and free (lowest handed out first). Under mu or before sharing. */
static g5_status pool_grow(rt_kvpool *p, uint32_t nc, g5_error *err) {
    float **mem = realloc(p->mem, (size_t)nc * sizeof *mem);
    if (mem) p->mem = mem;
    uint32_t *refs = mem ? realloc(p->refs, (size_t)nc * sizeof *refs) : NULL;
    if (refs) p->refs = refs;
    uint32_t *fr = refs ? realloc(p->free_ids, (size_t)nc * sizeof *fr) : NULL;
    if (fr) p->free_ids = fr;
    if (!mem || !refs || !fr) return g5_fail(err, G5_ERR_NOMEM, "kv pool: table of %u blocks", nc);
    memset(p->mem + p->cap, 0, (size_t)(nc - p->cap) * sizeof *p->mem);
    memset(p->refs + p->cap, 0, (size_t)(nc - p->cap) * sizeof *p->refs);
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
    free(p->refs);
    free(p->free_ids);
    free(p->bhash);
    free(p->reg);
    free(p->lru_prev);
    free(p->lru_next);
    free(p->ht);
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
    uint32_t n = p->n_free + p->n_cached;
    pthread_mutex_unlock(&unconst(p)->mu);
    return n;
}

uint32_t rt_kvpool_block_tokens(const rt_kvpool *p) { return p->bt; }

g5_status rt_kvpool_keep_rows(rt_kvpool *p, uint32_t width, g5_error *err) {
    if (p->hidw == width) return G5_OK;
    g5_status st = G5_OK;
    pthread_mutex_lock(&p->mu);
    for (uint32_t i = 0; i < p->cap && !st; i++)
        if (p->mem[i]) st = g5_fail(err, G5_ERR_INVALID_ARG, "kv pool: rows of %u floats added after blocks were handed out",
                                    width);
    uint64_t base = p->hidw ? p->hid_off : p->block_floats, a, b, bytes;
    if (!st && (g5_mul_u64(p->bt, width, &a) || g5_add_u64(base, a, &b) || g5_mul_u64(b, sizeof(float), &bytes) ||
                bytes > (uint64_t)SIZE_MAX / 2))
        st = g5_fail(err, G5_ERR_OVERFLOW, "kv pool: a block of %u tokens with rows of %u floats is too large", p->bt, width);
    if (!st) {
        p->hid_off = (size_t)base;
        p->hidw = width;
        p->block_floats = (size_t)b;
    }
    pthread_mutex_unlock(&p->mu);
    return st;
}
uint64_t rt_kvpool_block_bytes(const rt_kvpool *p) { return (uint64_t)p->block_floats * sizeof(float); }

/* ---- prefix cache: hash table and LRU (under mu) ---- */

#define NO_ID UINT32_MAX

static uint32_t ht_find(const rt_kvpool *p, uint64_t h) {
    const uint32_t id = rt_idtab_find(p->ht, p->ht_mask, p->bhash, h);
    return id == RT_IDTAB_NONE ? NO_ID : id;
}

static void ht_insert(rt_kvpool *p, uint32_t id) {
    rt_idtab_put(p->ht, p->ht_mask, p->bhash, id);
    p->reg[id] = 1;
}

static void ht_remove(rt_kvpool *p, uint32_t id) {
    rt_idtab_del(p->ht, p->ht_mask, p->bhash, id);
    p->reg[id] = 0;
}

static void lru_push(rt_kvpool *p, uint32_t id) {
    p->lru_prev[id] = p->lru_tail;
    p->lru_next[id] = NO_ID;
    if (p->lru_tail != NO_ID) p->lru_next[p->lru_tail] = id;
    else p->lru_head = id;
    p->lru_tail = id;
    p->n_cached++;
}

static void lru_unlink(rt_kvpool *p, uint32_t id) {
    const uint32_t a = p->lru_prev[id], b = p->lru_next[id];
    if (a != NO_ID) p->lru_next[a] = b;
    else p->lru_head = b;
    if (b != NO_ID) p->lru_prev[b] = a;
    else p->lru_tail = a;
    p->n_cached--;
}

static void evict_oldest(rt_kvpool *p) {
    const uint32_t id = p->lru_head;
    lru_unlink(p, id);
    ht_remove(p, id);
    p->free_ids[p->n_free++] = id;
    p->n_evicted++;
}

g5_status rt_kvpool_enable_prefix(rt_kvpool *p, g5_error *err) {
    if (p->growable) return g5_fail(err, G5_ERR_INVALID_ARG, "kv pool: prefix caching needs a fixed pool");
    if (p->reg) return G5_OK;
    uint64_t size = 2;
    while (size < 2 * (uint64_t)p->cap) size *= 2;
    if (size > UINT32_MAX) return g5_fail(err, G5_ERR_OVERFLOW, "kv pool: prefix table for %u blocks", p->cap);
    p->bhash = calloc(p->cap, sizeof *p->bhash);
    p->reg = calloc(p->cap, 1);
    p->lru_prev = malloc((size_t)p->cap * sizeof *p->lru_prev);
    p->lru_next = malloc((size_t)p->cap * sizeof *p->lru_next);
    p->ht = calloc((size_t)size, sizeof *p->ht);
    if (!p->bhash || !p->reg || !p->lru_prev || !p->lru_next || !p->ht) {
        free(p->bhash), free(p->reg), free(p->lru_prev), free(p->lru_next), free(p->ht);
        p->bhash = NULL, p->reg = NULL, p->lru_prev = p->lru_next = p->ht = NULL;
        return g5_fail(err, G5_ERR_NOMEM, "kv pool: prefix table for %u blocks", p->cap);
    }
    p->ht_mask = (uint32_t)(size - 1);
    p->lru_head = p->lru_tail = NO_ID;
    return G5_OK;
}

uint32_t rt_kvpool_n_cached(const rt_kvpool *p) {
    pthread_mutex_lock(&unconst(p)->mu);
    uint32_t n = p->n_cached;
    pthread_mutex_unlock(&unconst(p)->mu);
    return n;
}

uint64_t rt_kvpool_n_evicted(const rt_kvpool *p) {
    pthread_mutex_lock(&unconst(p)->mu);
    uint64_t n = p->n_evicted;
    pthread_mutex_unlock(&unconst(p)->mu);
    return n;
}

void rt_kv_prefix_hashes(const int32_t *tokens, uint32_t n_blocks, uint32_t bt, uint64_t *out) {
    uint64_t h = 0x6c6d352d70726566ull; /* any fixed seed for the first block */
    for (uint32_t k = 0; k < n_blocks; k++) {
        h = XXH3_64bits_withSeed(tokens + (size_t)k * bt, (size_t)bt * sizeof *tokens, h);
        out[k] = h;
    }
}

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
    while (!st && p->n_free < k && p->n_cached) evict_oldest(p);
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
                    p->refs[ids[j]] = 0;
                    p->free_ids[p->n_free++] = ids[j];
                }
                break;
            }
            p->mem[id] = mem;
        }
        p->n_free--;
        p->refs[id] = 1;
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
        if (id < p->cap && p->refs[id] && --p->refs[id] == 0) {
            if (p->reg && p->reg[id]) lru_push(p, id); /* cached: found again until evicted */
            else p->free_ids[p->n_free++] = id;
        }
    }
    pthread_mutex_unlock(&p->mu);
}

uint32_t rt_kvtab_blocks_for(const rt_kvtab *t, uint64_t n_tokens) {
    const uint64_t n = n_tokens / t->pool->bt + (n_tokens % t->pool->bt != 0);
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

static g5_status tab_room(rt_kvtab *t, uint32_t need, g5_error *err) {
    if (need <= t->cap) return G5_OK;
    uint32_t nc = t->cap ? t->cap : 8;
    while (nc < need) nc = nc > UINT32_MAX / 2 ? need : nc * 2;
    uint32_t *ids = realloc(t->ids, (size_t)nc * sizeof *ids);
    if (ids) t->ids = ids;
    float **ptr = ids ? realloc(t->ptr, (size_t)nc * sizeof *ptr) : NULL;
    if (ptr) t->ptr = ptr;
    if (!ids || !ptr) return g5_fail(err, G5_ERR_NOMEM, "kv block table of %u blocks", nc);
    t->cap = nc;
    return G5_OK;
}

g5_status rt_kvtab_reserve(rt_kvtab *t, uint64_t n_tokens, g5_error *err) {
    const uint32_t need = rt_kvtab_blocks_for(t, n_tokens);
    if (need <= t->n) return G5_OK;
    g5_status st = tab_room(t, need, err);
    if (st) return st;
    st = pool_take(t->pool, need - t->n, t->ids + t->n, t->ptr + t->n, err);
    if (st) return st;
    t->n = need;
    return G5_OK;
}

void rt_kvtab_shrink_blocks(rt_kvtab *t, uint32_t n_blocks) {
    if (n_blocks >= t->n) return;
    pool_put(t->pool, t->ids + n_blocks, t->n - n_blocks);
    t->n = n_blocks;
}

g5_status rt_kvtab_attach(rt_kvtab *t, const uint64_t *hashes, uint32_t n, uint32_t *n_attached,
                          g5_error *err) {
    *n_attached = 0;
    rt_kvpool *p = t->pool;
    if (!p || !p->reg || t->n || !n) return G5_OK;
    g5_status st = tab_room(t, n, err);
    if (st) return st;
    pthread_mutex_lock(&p->mu);
    uint32_t k = 0;
    for (; k < n; k++) {
        const uint32_t id = ht_find(p, hashes[k]);
        if (id == NO_ID) break;
        if (p->refs[id]++ == 0) lru_unlink(p, id);
        t->ids[k] = id;
        t->ptr[k] = p->mem[id];
    }
    pthread_mutex_unlock(&p->mu);
    t->n = k;
    *n_attached = k;
    return G5_OK;
}

void rt_kvtab_publish(rt_kvtab *t, const uint64_t *hashes, uint32_t n) {
    rt_kvpool *p = t->pool;
    if (!p || !p->reg) return;
    if (n > t->n) n = t->n;
    pthread_mutex_lock(&p->mu);
    for (uint32_t k = 0; k < n; k++) {
        const uint32_t id = t->ids[k];
        if (p->reg[id] || ht_find(p, hashes[k]) != NO_ID) continue;
        p->bhash[id] = hashes[k];
        ht_insert(p, id);
    }
    pthread_mutex_unlock(&p->mu);
}

g5_status rt_kvtab_unshare(rt_kvtab *t, uint32_t k, g5_error *err) {
    rt_kvpool *p = t->pool;
    if (k >= t->n) return G5_OK;
    pthread_mutex_lock(&p->mu);
    const uint32_t old = t->ids[k];
    const int shared = p->refs[old] > 1 || (p->reg && p->reg[old]);
    pthread_mutex_unlock(&p->mu);
    if (!shared) return G5_OK;
    uint32_t id;
    float *mem;
    g5_status st = pool_take(p, 1, &id, &mem, err);
    if (st) return st;
    memcpy(mem, t->ptr[k], p->block_floats * sizeof(float));
    pool_put(p, &old, 1);
    t->ids[k] = id;
    t->ptr[k] = mem;
    return G5_OK;
}

void rt_kvtab_release(rt_kvtab *t) {
    if (t->pool) rt_kvtab_shrink_blocks(t, 0);
    free(t->ids);
    free(t->ptr);
    if (t->own) rt_kvpool_free(t->pool);
    memset(t, 0, sizeof *t);
}
