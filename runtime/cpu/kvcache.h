/* Paged latent / indexer-key caches for the CPU runtime: a pool of fixed-size token blocks and
 * per-sequence block tables. Internal to the runtime (model.h has the public face:
 * rt_kvpool_create, rt_state_create_paged, ...).
 *
 * A block holds block_tokens positions of every (rank, layer) the pool was laid out for: per
 * rank and layer a [block_tokens][kv_width] latent region and, for layers with an indexer, a
 * [block_tokens][idx_width] key region. All of a block's regions are allocated and freed
 * together, so a sequence needs one block id per block_tokens positions whatever the layer and
 * rank count. Position p of a sequence lives in block ids[p / block_tokens] at row
 * p % block_tokens.
 *
 * The pool is thread-safe (one mutex; alloc and free are O(1) per block: a stack of free ids).
 * A fixed pool holds at most n_blocks blocks and refuses more (G5_ERR_NOMEM, "kv pool
 * exhausted: ..."); a growable one (n_blocks = 0) doubles its id space instead. Block memory is
 * allocated when an id is first handed out and kept for reuse until the pool is freed.
 * A table is used by one thread at a time. A pool may also keep one row of floats per position
 * (rt_kvpool_keep_rows: the main model's hidden states for the MTP drafter, model.h), a region
 * of each block of its own, once per block.
 *
 * Prefix caching (rt_kvpool_enable_prefix, fixed pools): a full block's contents depend only on
 * the tokens at and before its positions, so a block can be named by the hash of its token
 * prefix (rt_kv_prefix_hashes: XXH3-64 of each block's tokens, seeded with the previous
 * block's hash) and shared by every table whose sequence starts with that prefix. Blocks carry
 * reference counts; a registered block that no table holds stays cached (least recently
 * released first out) and counts as free: a pool short of free blocks evicts cached ones. A
 * registered or shared block is never written: tables only append after their attached blocks,
 * and rt_kvtab_unshare copies one before a truncated sequence writes into it. Two prefixes
 * with the same 64-bit chained hash would share blocks (not checked further, as in vLLM). */
#ifndef G5_RT_KVCACHE_H
#define G5_RT_KVCACHE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "format/status.h"

typedef struct rt_kvpool rt_kvpool;

/* What one block holds. */
typedef struct rt_kvlayout {
    uint32_t n_ranks;
    uint32_t il0, n_layers;      /* model layers il0 .. il0 + n_layers - 1 */
    uint32_t kv_width;           /* latent floats per position (kv_lora + qk_rope) */
    uint32_t idx_width;          /* indexer key floats per position (idx_head_dim) */
    const uint8_t *has_idx;      /* [n_layers]: the layer keeps indexer keys (NULL: all do) */
} rt_kvlayout;

struct rt_kvpool {
    pthread_mutex_t mu;
    const void *owner;           /* the model the pool was made for (checked by states) */
    uint32_t bt;                 /* tokens per block */
    uint32_t n_ranks, il0, nl, kvw, idw;
    size_t *lat_off, *idx_off;   /* [n_ranks * nl] float offsets in a block (idx: SIZE_MAX none) */
    uint32_t hidw;               /* hidden-state floats per position (0: none; rt_kvpool_keep_rows) */
    size_t hid_off;              /* float offset of the block's [bt][hidw] rows (once, not per rank) */
    size_t block_floats;
    int growable;
    uint32_t cap;                /* block ids that exist */
    float **mem;                 /* [cap] block memory, NULL until first handed out */
    uint32_t *refs;              /* [cap] tables holding the block (0: free or cached) */
    uint32_t *free_ids;          /* [cap] stack; the lowest ids are handed out first */
    uint32_t n_free;
    /* prefix cache (NULL arrays when off) */
    uint64_t *bhash;             /* [cap] the prefix hash of a registered block */
    uint8_t *reg;                /* [cap] registered (found by its hash) */
    uint32_t *lru_prev, *lru_next; /* [cap] cached blocks (registered, refs 0), oldest first */
    uint32_t lru_head, lru_tail, n_cached;
    uint32_t *ht, ht_mask;       /* open addressing over bhash: block id + 1, 0 empty */
    uint64_t n_evicted;
};

/* n_blocks = 0: growable. block_tokens >= 1. */
g5_status rt_kvpool_create_layout(const rt_kvlayout *lay, uint32_t n_blocks, uint32_t block_tokens,
                                  rt_kvpool **out, g5_error *err);
void rt_kvpool_free(rt_kvpool *p); /* accepts NULL; every table drawing on it must be empty */
uint32_t rt_kvpool_n_blocks(const rt_kvpool *p);     /* ids that exist now */
uint32_t rt_kvpool_n_free(const rt_kvpool *p);
uint32_t rt_kvpool_block_tokens(const rt_kvpool *p);
uint64_t rt_kvpool_block_bytes(const rt_kvpool *p);

/* Adds to every block a [block_tokens][width] region of one float row per position (once per
 * block, not per rank: the main model's final-normed hidden states, which the MTP drafter of a
 * sequence attached to a cached prefix reads back, model.h). Before any block is handed out. */
g5_status rt_kvpool_keep_rows(rt_kvpool *p, uint32_t width, g5_error *err);
/* Turns prefix caching on (a fixed pool, before any block is handed out). */
g5_status rt_kvpool_enable_prefix(rt_kvpool *p, g5_error *err);
uint32_t rt_kvpool_n_cached(const rt_kvpool *p);   /* cached blocks no table holds */
uint64_t rt_kvpool_n_evicted(const rt_kvpool *p);  /* cached blocks reused for other contents */
/* out[k] = the prefix hash of block k (tokens [k bt, (k+1) bt)), k < n_blocks. */
void rt_kv_prefix_hashes(const int32_t *tokens, uint32_t n_blocks, uint32_t bt, uint64_t *out);

/* A sequence's blocks in position order. Zero-initialize, then set pool (and own = 1 when the
 * table owns a private pool, freed by rt_kvtab_release). */
typedef struct rt_kvtab {
    rt_kvpool *pool;
    int own;
    uint32_t *ids;               /* [cap] block ids */
    float **ptr;                 /* [cap] their memory */
    uint32_t n, cap;
} rt_kvtab;

/* Blocks needed for n_tokens positions. */
uint32_t rt_kvtab_blocks_for(const rt_kvtab *t, uint64_t n_tokens);
/* Makes t cover positions [0, n_tokens), all or nothing (t unchanged on failure):
 * G5_ERR_NOMEM "kv pool exhausted: ..." when a fixed pool has too few free blocks. */
g5_status rt_kvtab_reserve(rt_kvtab *t, uint64_t n_tokens, g5_error *err);
/* Returns the blocks past the first n_blocks to the pool. */
void rt_kvtab_shrink_blocks(rt_kvtab *t, uint32_t n_blocks);
/* Returns every block, frees the table's arrays and, if owned, the pool. */
void rt_kvtab_release(rt_kvtab *t);
/* An empty table takes the registered blocks named by hashes[0, n) in order, as long as they are
 * found; returns how many (0 when the pool has no prefix cache). G5_ERR_NOMEM only if the table
 * cannot grow (nothing taken). */
g5_status rt_kvtab_attach(rt_kvtab *t, const uint64_t *hashes, uint32_t n, uint32_t *n_attached,
                          g5_error *err);
/* Registers t's blocks [0, n) (full, with the given prefix hashes) where no block of that hash
 * is registered yet. */
void rt_kvtab_publish(rt_kvtab *t, const uint64_t *hashes, uint32_t n);
/* Block k becomes t's own copy if it is registered or held by another table. */
g5_status rt_kvtab_unshare(rt_kvtab *t, uint32_t k, g5_error *err);

/* Rank r, layer il (a layer of the pool's layout), position pos (< n * bt). */
static inline float *rt_kvtab_lat(const rt_kvtab *t, uint32_t r, uint32_t il, uint32_t pos) {
    const rt_kvpool *p = t->pool;
    return t->ptr[pos / p->bt] + p->lat_off[(size_t)r * p->nl + (il - p->il0)] +
           (size_t)(pos % p->bt) * p->kvw;
}
static inline float *rt_kvtab_idx(const rt_kvtab *t, uint32_t r, uint32_t il, uint32_t pos) {
    const rt_kvpool *p = t->pool;
    return t->ptr[pos / p->bt] + p->idx_off[(size_t)r * p->nl + (il - p->il0)] +
           (size_t)(pos % p->bt) * p->idw;
}

/* Position pos's row of the region of rt_kvpool_keep_rows (the pool must have one). */
static inline float *rt_kvtab_row(const rt_kvtab *t, uint32_t pos) {
    const rt_kvpool *p = t->pool;
    return t->ptr[pos / p->bt] + p->hid_off + (size_t)(pos % p->bt) * p->hidw;
}

#endif
