/* The prefix store's index (prefix.h): a table from hash to slot (runtime/cpu/idtab.h, the one
 * the CPU pool uses), a doubly linked LRU list over the used slots (head: least recently used)
 * and a stack of free slots. */
#include "runtime/prefix.h"

#include "runtime/cpu/idtab.h"

#include <stdlib.h>

struct rt_pfx {
    uint32_t n;                  /* slots */
    uint64_t *hash;              /* [n] the hash a used slot holds */
    uint8_t *used;               /* [n] */
    uint32_t *prev, *next;       /* [n] LRU links (RT_PFX_NONE at the ends) */
    uint32_t head, tail;         /* least and most recently used */
    uint32_t *free_ids, n_free;  /* stack; the lowest slots are handed out first */
    uint32_t *ht, mask;          /* [mask + 1]: slot + 1, 0 empty */
    uint64_t n_evicted;
};

g5_status rt_pfx_create(uint32_t n_slots, rt_pfx **out, g5_error *err) {
    *out = NULL;
    if (n_slots == 0 || n_slots > (1u << 30)) return g5_fail(err, G5_ERR_INVALID_ARG, "prefix index of %u slots", n_slots);
    rt_pfx *x = calloc(1, sizeof *x);
    uint64_t size = 16;
    while (size < 2 * (uint64_t)n_slots) size *= 2;
    if (x) {
        x->n = n_slots;
        x->hash = calloc(n_slots, sizeof *x->hash);
        x->used = calloc(n_slots, 1);
        x->prev = malloc((size_t)n_slots * sizeof *x->prev);
        x->next = malloc((size_t)n_slots * sizeof *x->next);
        x->free_ids = malloc((size_t)n_slots * sizeof *x->free_ids);
        x->ht = calloc(size, sizeof *x->ht);
    }
    if (!x || !x->hash || !x->used || !x->prev || !x->next || !x->free_ids || !x->ht) {
        rt_pfx_free(x);
        return g5_fail(err, G5_ERR_NOMEM, "prefix index of %u slots", n_slots);
    }
    x->mask = (uint32_t)(size - 1);
    x->head = x->tail = RT_PFX_NONE;
    for (uint32_t i = 0; i < n_slots; i++) x->free_ids[i] = n_slots - 1 - i;
    x->n_free = n_slots;
    *out = x;
    return G5_OK;
}

void rt_pfx_free(rt_pfx *x) {
    if (!x) return;
    free(x->hash);
    free(x->used);
    free(x->prev);
    free(x->next);
    free(x->free_ids);
    free(x->ht);
    free(x);
}

uint32_t rt_pfx_n_slots(const rt_pfx *x) { return x->n; }
uint32_t rt_pfx_n_used(const rt_pfx *x) { return x->n - x->n_free; }
uint64_t rt_pfx_n_evicted(const rt_pfx *x) { return x->n_evicted; }

/* ---- the table ---- */

uint32_t rt_pfx_slot_of(const rt_pfx *x, uint64_t h) {
    const uint32_t id = rt_idtab_find(x->ht, x->mask, x->hash, h);
    return id == RT_IDTAB_NONE ? RT_PFX_NONE : id;
}

static void ht_put(rt_pfx *x, uint32_t slot) { rt_idtab_put(x->ht, x->mask, x->hash, slot); }

static void ht_del(rt_pfx *x, uint32_t slot) { rt_idtab_del(x->ht, x->mask, x->hash, slot); }

/* ---- the LRU list ---- */

static void lru_unlink(rt_pfx *x, uint32_t s) {
    const uint32_t a = x->prev[s], b = x->next[s];
    if (a != RT_PFX_NONE) x->next[a] = b;
    else x->head = b;
    if (b != RT_PFX_NONE) x->prev[b] = a;
    else x->tail = a;
}

static void lru_push(rt_pfx *x, uint32_t s) { /* as the most recently used */
    x->prev[s] = x->tail;
    x->next[s] = RT_PFX_NONE;
    if (x->tail != RT_PFX_NONE) x->next[x->tail] = s;
    else x->head = s;
    x->tail = s;
}

static void touch(rt_pfx *x, uint32_t s) {
    lru_unlink(x, s);
    lru_push(x, s);
}

static void release(rt_pfx *x, uint32_t s) {
    ht_del(x, s);
    lru_unlink(x, s);
    x->used[s] = 0;
    x->free_ids[x->n_free++] = s;
}

/* ---- lookups and inserts ---- */

uint32_t rt_pfx_find(rt_pfx *x, const uint64_t *hashes, uint32_t n, uint32_t *slots) {
    uint32_t k = 0;
    for (; k < n; k++) {
        const uint32_t s = rt_pfx_slot_of(x, hashes[k]);
        if (s == RT_PFX_NONE) break;
        slots[k] = s;
    }
    for (uint32_t i = k; i-- > 0;) touch(x, slots[i]); /* hashes[0] last: the most recent */
    return k;
}

uint32_t rt_pfx_insert(rt_pfx *x, const uint64_t *hashes, uint32_t n, uint32_t *slots, uint8_t *fresh) {
    const uint32_t m = n < x->n ? n : x->n;
    for (uint32_t k = 0; k < m; k++) {
        uint32_t s = rt_pfx_slot_of(x, hashes[k]);
        fresh[k] = s == RT_PFX_NONE;
        if (!fresh[k]) {
            touch(x, s); /* the k blocks before it are the most recent: never the victim below */
        } else {
            if (!x->n_free) { /* k < n_slots blocks of this chain are at the tail: the head is another's */
                release(x, x->head);
                x->n_evicted++;
            }
            s = x->free_ids[--x->n_free];
            x->hash[s] = hashes[k];
            x->used[s] = 1;
            ht_put(x, s);
            lru_push(x, s);
        }
        slots[k] = s;
    }
    for (uint32_t i = m; i-- > 0;) touch(x, slots[i]);
    return m;
}

void rt_pfx_drop(rt_pfx *x, uint32_t slot) {
    if (slot < x->n && x->used[slot]) release(x, slot);
}

/* ---- block rules ---- */

uint32_t rt_pfx_slots_for(uint64_t bytes, uint64_t block_bytes) {
    if (!block_bytes) return 0;
    const uint64_t n = bytes / block_bytes;
    return n > (1u << 30) ? 1u << 30 : (uint32_t)n;
}

uint32_t rt_pfx_call_len(uint32_t pos, uint32_t left, uint32_t bt) {
    if (!bt) return left;
    const uint32_t to_end = bt - pos % bt;
    return left < to_end ? left : to_end;
}

uint32_t rt_pfx_exact_after(uint32_t n_exact, uint32_t pos, uint32_t len, uint32_t bt) {
    return bt && len == bt && pos == n_exact && pos % bt == 0 ? n_exact + bt : n_exact;
}

uint32_t rt_pfx_attach_max(uint32_t n, uint32_t bt) { return bt && n >= 2 ? (n - 1) / bt : 0; }
