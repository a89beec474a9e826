/* An open-addressing table of ids keyed by 64-bit hashes that the caller keeps (key[id]): the
 * lookup of the prefix caches (runtime/cpu/kvcache.c's shared pool, runtime/prefix.c's GPU store
 * index). ht has mask + 1 entries (a power of two, more than the ids it will hold), each id + 1
 * or 0 for empty; linear probing, deletion by backward shift (no tombstones). Header-only. */
#ifndef G5_RT_IDTAB_H
#define G5_RT_IDTAB_H

#include <stdint.h>

#define RT_IDTAB_NONE UINT32_MAX

/* the hashes are XXH3 outputs already: a multiplicative mix, the high half as the home */
static inline uint32_t rt_idtab_home(uint32_t mask, uint64_t h) {
    return (uint32_t)((h * 0x9E3779B97F4A7C15ull) >> 32) & mask;
}

/* The id whose key is h, or RT_IDTAB_NONE. */
static inline uint32_t rt_idtab_find(const uint32_t *ht, uint32_t mask, const uint64_t *key, uint64_t h) {
    for (uint32_t i = rt_idtab_home(mask, h);; i = (i + 1) & mask) {
        const uint32_t e = ht[i];
        if (!e) return RT_IDTAB_NONE;
        if (key[e - 1] == h) return e - 1;
    }
}

/* Adds id (its key already in key[id]; not in the table). */
static inline void rt_idtab_put(uint32_t *ht, uint32_t mask, const uint64_t *key, uint32_t id) {
    uint32_t i = rt_idtab_home(mask, key[id]);
    while (ht[i]) i = (i + 1) & mask;
    ht[i] = id + 1;
}

/* Removes id (in the table, key[id] unchanged since it was put). */
static inline void rt_idtab_del(uint32_t *ht, uint32_t mask, const uint64_t *key, uint32_t id) {
    uint32_t i = rt_idtab_home(mask, key[id]);
    while (ht[i] != id + 1) i = (i + 1) & mask;
    /* backward shift: move later entries of the probe run into the hole where they may live */
    for (uint32_t j = (i + 1) & mask; ht[j]; j = (j + 1) & mask) {
        const uint32_t k = rt_idtab_home(mask, key[ht[j] - 1]);
        /* the entry at j stays unless its home lies cyclically outside (i, j] */
        const int stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (stays) continue;
        ht[i] = ht[j];
        i = j;
    }
    ht[i] = 0;
}

#endif
