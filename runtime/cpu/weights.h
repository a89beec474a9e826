/* Weight sources: what the forward pass sees of the model's weights, whatever their origin.
 *
 * A weight set (rt_wset) is n_ranks tensor-parallel ranks. Each rank (rt_weights) maps tensor
 * names to {type, local shape, data}: only its own shard. The model's metadata (hyperparameters,
 * tokenizer) is one gguf_ctx shared by all ranks. Two sources implement it:
 *  - a GGUF file (TP = 1): tensors point into the mmap'ed file, and every layer's
 *    `blk.N.attn_kv_b.weight` is rebuilt in float32 from attn_k_b / attn_v_b (glm5_rebuild_kv_b),
 *    so the model always finds HF's kv_b layout, exactly as in blobs;
 *  - a blob set written by `glm5-shard convert` (TP = N, one blob per rank).
 * Shards are contiguous and even: rank r of T holds heads [r*H/T, (r+1)*H/T), vocabulary rows
 * [r*V/T, ...), and (expert placement) experts [r*E/T, ...); the model relies on that. */
#ifndef G5_RT_WEIGHTS_H
#define G5_RT_WEIGHTS_H

#include <stdint.h>

#include "format/blob.h"
#include "format/gguf.h"
#include "format/status.h"

typedef struct rt_tensor {
    const char *name;
    uint32_t type;         /* ggml type id */
    uint32_t n_dims;
    uint64_t ne[4];        /* this rank's shape, ggml order (ne[0] contiguous); unused dims 1 */
    uint64_t nbytes;
    const void *data;      /* nbytes, valid while the set is open */
} rt_tensor;

typedef struct rt_weights rt_weights; /* one rank */
typedef struct rt_wset rt_wset;       /* all ranks */

/* How a set is opened. Blob data is checked against every tensor's XXH3-128 (and the 64 MiB
 * chunk hashes) while it is read in, by `jobs` threads (blob_verify_data) unless no_verify: a
 * corrupt tensor fails the open, naming the rank file, the tensor and its byte range. A GGUF has
 * no checksums; it is validated (glm5_model_validate) like every other source. */
typedef struct rt_wset_opts {
    int no_verify;       /* skip the blob checksums (glm5-run/glm5-serve --no-verify) */
    uint32_t jobs;       /* hashing threads (0: online CPUs) */
    uint32_t first, count; /* blob ranks [first, first + count) only; count 0: all */
} rt_wset_opts;

/* What the open did, for the load line. */
typedef struct rt_wset_load_info {
    int verified;        /* 1: every opened blob's data hashed and matched */
    uint64_t bytes;      /* data bytes hashed */
    double seconds;      /* hashing time */
    uint32_t jobs;       /* threads used */
} rt_wset_load_info;

/* A directory is opened as a blob set, anything else as a GGUF (split sets included). `o` NULL:
 * verify everything with all CPUs; info may be NULL. */
g5_status rt_wset_open_ex(const char *path, const rt_wset_opts *o, rt_wset **out,
                          rt_wset_load_info *info, g5_error *err);
/* rt_wset_open_ex with the default options (checksums verified). */
g5_status rt_wset_open(const char *path, rt_wset **out, g5_error *err);
g5_status rt_wset_open_gguf(const char *path, rt_wset **out, g5_error *err);
g5_status rt_wset_open_blobs(const char *dir, rt_wset **out, g5_error *err);
/* Only ranks [first, first + count) of the set (count 0: all): what one process of a
 * multi-process run needs (blob_set_open_ranks); the other ranks' files may be absent. Both
 * verify the checksums (rt_wset_open_ex for options). */
g5_status rt_wset_open_blobs_ranks(const char *dir, uint32_t first, uint32_t count, rt_wset **out,
                                   g5_error *err);
/* A set from caller-built tensor tables (tests, synthetic models): rank r has counts[r] tensors
 * tables[r][0 ..]. The tables are copied; names, data and meta must outlive the set. */
g5_status rt_wset_from_tables(const gguf_ctx *meta, uint32_t n_ranks, int expert_placement,
                              const rt_tensor *const *tables, const uint64_t *counts,
                              rt_wset **out, g5_error *err);
void rt_wset_free(rt_wset *ws); /* accepts NULL */

uint32_t rt_wset_n_ranks(const rt_wset *ws);     /* T, the set's ranks (opened or not) */
uint32_t rt_wset_rank_first(const rt_wset *ws);  /* the ranks opened: [first, first + count) */
uint32_t rt_wset_rank_count(const rt_wset *ws);
int rt_wset_expert_placement(const rt_wset *ws); /* 1 if experts are distributed whole (--ep) */
const gguf_ctx *rt_wset_meta(const rt_wset *ws);
/* NULL if out of range or not opened. */
const rt_weights *rt_wset_rank(const rt_wset *ws, uint32_t rank);
const char *rt_wset_source(const rt_wset *ws); /* "gguf", "blobs" or "tables" */
/* The open blob set behind a "blobs" set (the GPU loader reads its files); NULL otherwise. */
const blob_set *rt_wset_blobs(const rt_wset *ws);

/* NULL if this rank has no tensor of that name. */
const rt_tensor *rt_weights_find(const rt_weights *w, const char *name);
uint64_t rt_weights_n_tensors(const rt_weights *w);
const rt_tensor *rt_weights_tensor(const rt_weights *w, uint64_t i);

#endif
