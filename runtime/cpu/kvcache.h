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
 * A table is used by one thread at a time. */
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
    size_t block_floats;
    int growable;
    uint32_t cap;                /* block ids that exist */
    float **mem;                 /* [cap] block memory, NULL until first handed out */
    uint8_t *used;               /* [cap] */
    uint32_t *free_ids;          /* [cap] stack; the lowest ids are handed out first */
    uint32_t n_free;
};

/* n_blocks = 0: growable. block_tokens >= 1. */
g5_status rt_kvpool_create_layout(const rt_kvlayout *lay, uint32_t n_blocks, uint32_t block_tokens,
                                  rt_kvpool **out, g5_error *err);
void rt_kvpool_free(rt_kvpool *p); /* accepts NULL; every table drawing on it must be empty */
uint32_t rt_kvpool_n_blocks(const rt_kvpool *p);     /* ids that exist now */
uint32_t rt_kvpool_n_free(const rt_kvpool *p);
uint32_t rt_kvpool_block_tokens(const rt_kvpool *p);
uint64_t rt_kvpool_block_bytes(const rt_kvpool *p);

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

#endif
