/* The index of a prefix store of copies (the GPU engine's, runtime/engine_gpu.c): which of
 * n_slots fixed-size slots holds the cache block named by which prefix hash, least recently
 * used first out. Only bookkeeping: the caller owns the slots' memory and copies the blocks in
 * and out. Host C, no device code (tests/test_prefix.c runs it in `make test`).
 *
 * A block is named by the chained hash of the tokens up to its end (rt_kv_prefix_hashes,
 * runtime/cpu/kvcache.h: the CPU pool's names), so a run of blocks of one sequence is a chain
 * hashes[0], hashes[1], ... and only a chain's first k blocks can be reused together. Both
 * lookups and inserts leave a chain's earlier blocks more recently used than its later ones, so
 * eviction takes a chain's tail before its head (a head without its tail still serves a shorter
 * prefix; a tail without its head serves nothing). An insert of a chain longer than n_slots
 * stores its first n_slots blocks, and never evicts a block of the chain it is storing. Two
 * prefixes with the same 64-bit hash would share a slot (not checked further, as on the CPU).
 * One thread at a time. */
#ifndef G5_RT_PREFIX_H
#define G5_RT_PREFIX_H

#include <stdint.h>

#include "format/status.h"

typedef struct rt_pfx rt_pfx;

#define RT_PFX_NONE UINT32_MAX

/* An index of n_slots slots (n_slots >= 1), all free. */
g5_status rt_pfx_create(uint32_t n_slots, rt_pfx **out, g5_error *err);
void rt_pfx_free(rt_pfx *x); /* accepts NULL */
uint32_t rt_pfx_n_slots(const rt_pfx *x);
uint32_t rt_pfx_n_used(const rt_pfx *x);   /* slots holding a block */
uint64_t rt_pfx_n_evicted(const rt_pfx *x); /* blocks dropped to make room for others */
/* The slot holding hash h, or RT_PFX_NONE (does not touch the LRU order). */
uint32_t rt_pfx_slot_of(const rt_pfx *x, uint64_t h);
/* The longest run hashes[0, k) that is stored: slots[0, k) receive its slots, and they become the
 * most recently used (hashes[0] the most). Returns k. */
uint32_t rt_pfx_find(rt_pfx *x, const uint64_t *hashes, uint32_t n, uint32_t *slots);
/* Stores the chain hashes[0, m), m = min(n, n_slots): slots[k] receives block k's slot and
 * fresh[k] 1 where the caller must now copy the block in (a free slot, or the least recently
 * used block's, evicted), 0 where it was stored already. The chain becomes the most recently
 * used (hashes[0] the most). Returns m. */
uint32_t rt_pfx_insert(rt_pfx *x, const uint64_t *hashes, uint32_t n, uint32_t *slots, uint8_t *fresh);
/* Frees a slot (its copy failed): the block is no longer found. */
void rt_pfx_drop(rt_pfx *x, uint32_t slot);

/* ---- the block rules of the GPU engine's prefill and store (engine.h, prefix caching) ---- */

/* Slots of block_bytes in a budget of `bytes` (whole blocks; at most 2^30). */
uint32_t rt_pfx_slots_for(uint64_t bytes, uint64_t block_bytes);
/* The length of the next call of a prefill at position pos with `left` tokens to run: up to
 * the next multiple of bt (bt 0: all of them). */
uint32_t rt_pfx_call_len(uint32_t pos, uint32_t left, uint32_t bt);
/* n_exact after a call of len tokens at position pos: extended by bt when the call ran exactly
 * the block that starts at n_exact, else unchanged. */
uint32_t rt_pfx_exact_after(uint32_t n_exact, uint32_t pos, uint32_t len, uint32_t bt);
/* Blocks an attach of a prompt of n tokens may take: whole blocks leaving one token to run. */
uint32_t rt_pfx_attach_max(uint32_t n, uint32_t bt);

#endif
