/* The sharding plan: for every tensor of a glm-dsa GGUF, how it is cut across T tensor-parallel
 * ranks (specs/sharding.md), the slice shapes and bytes per rank, and the layout of every rank
 * blob's data region. Built and checked completely before anything is written, so refusals
 * (misaligned ne[0] slices, heads/vocabulary/experts/rows not divisible by T) cost nothing.
 *
 * Every rank holds every plan tensor, with the same local shape and size, in the same order and
 * at the same data offset: only the bytes differ. attn_k_b + attn_v_b are carried as they are
 * (cut by heads; the runtime does not read them) and also give one derived tensor
 * blk.N.attn_kv_b.weight (rebuilt, see glm5_rebuild_kv_b: prefill, decode and the CPU reference
 * read it), placed right after the later of the pair. */
#ifndef G5_SHARD_H
#define G5_SHARD_H

#include <stdint.h>

#include "format/gguf.h"
#include "format/glm5.h"
#include "format/status.h"

typedef enum shard_rule {
    SHARD_REPLICATE = 0,  /* every rank holds the whole tensor */
    SHARD_ROWS,           /* ne[1] cut into T contiguous ranges (heads, vocabulary, FFN rows) */
    SHARD_COLS,           /* ne[0] cut into T ranges, every row (block-aligned) */
    SHARD_EXPERT_ROWS,    /* 3-D expert tensor: ne[1] cut into T ranges within every expert */
    SHARD_EXPERT_COLS,    /* 3-D expert tensor: ne[0] cut into T ranges, every row */
    SHARD_EXPERTS,        /* --ep: ne[2] (experts) cut into T ranges, experts whole */
    SHARD_KV_B,           /* derived: kv_b rebuilt from attn_k_b/attn_v_b, rows cut by heads */
    SHARD_HEADS,          /* 3-D per-head tensor (attn_k_b, attn_v_b): ne[2] (heads) cut into T
                           * ranges, heads whole */
    SHARD_RULE_COUNT
} shard_rule;

const char *shard_rule_name(shard_rule r); /* "replicated", "rows", "cols", ... */

typedef struct shard_tensor {
    char name[96];            /* blob tensor name */
    glm5_role role;
    int32_t layer;            /* -1 for globals */
    shard_rule rule;
    const char *why;          /* short reason, e.g. "heads", "vocabulary", "input dim (heads)" */
    uint32_t type;            /* ggml type as stored in the blob */
    uint32_t n_dims;
    uint64_t ne_global[4];    /* whole-tensor shape (ggml order) */
    uint64_t ne_local[4];     /* per-rank shape */
    uint32_t axis;            /* split axis 0..2, or BLOB_AXIS_NONE (replicated) */
    uint32_t split_count;     /* T for split tensors, 1 for replicated */
    int64_t src;              /* source tensor index (gguf_get_tensor), -1 if derived */
    int64_t src_k_b, src_v_b; /* SHARD_KV_B: the attn_k_b / attn_v_b source indexes, else -1 */
    uint64_t src_bytes;       /* bytes read from the source for this tensor (k_b + v_b for kv_b) */
    uint64_t local_bytes;     /* bytes per rank */
    uint64_t data_offset;     /* offset of the tensor in every rank's data region (4096-aligned) */
    /* Byte selection of a copied tensor, rank r: rows i (of n_rows, each row_bytes long) with
     * lo(r) <= i mod period < hi(r), and of each such row the bytes [b0(r), b1(r)). See
     * shard_select. */
    uint64_t row_bytes, n_rows, period;
} shard_tensor;

typedef struct shard_plan {
    uint32_t tp;
    int ep;
    uint32_t kv_b_type;
    glm5_hparams hp;
    uint64_t n_tensors;
    shard_tensor *tensors;    /* n_tensors, in blob order (= source file order, kv_b right after
                               * the later of attn_k_b/attn_v_b) */
    uint64_t data_size;       /* per-rank data region size (tensors padded to 4096) */
    uint64_t n_src_tensors;
    uint64_t src_tensor_bytes; /* all source tensor bytes (each read once) */
    int no_pair;              /* shard_options.no_pair */
    uint64_t src_dropped;     /* source tensors not carried (the next; with no_pair also
                               * attn_k_b/attn_v_b) */
    uint64_t src_unused;      /* shared layers' duplicate indexer tensors (IndexShare: those
                               * layers reuse a full layer's top-k, the runtime never reads them) */
    uint64_t src_unused_bytes;
} shard_plan;

typedef struct shard_options {
    uint32_t tp;
    int ep;
    uint32_t kv_b_type;       /* QT_F32, QT_BF16, QT_F16, QT_Q8_0 */
    int no_pair;              /* converter 1.0's layout: attn_k_b/attn_v_b not carried, only the
                               * rebuilt kv_b (verify --deep of sets written before 1.1) */
} shard_options;

/* Builds and checks the plan. Refusals return G5_ERR_SHARDING with a message naming the tensor,
 * its type and block size, the slice width, and what would work (--ep, a smaller T); a model
 * that is not a complete glm-dsa tensor set (missing or misshapen tensors) G5_ERR_MODEL. */
g5_status shard_plan_build(const gguf_ctx *src, const shard_options *opt, shard_plan **out,
                           g5_error *err);
void shard_plan_free(shard_plan *p); /* accepts NULL */

/* Rank r's selection of a copied tensor (not SHARD_KV_B): rows with lo <= i mod period < hi,
 * bytes [b0, b1) of each selected row. */
typedef struct shard_sel {
    uint64_t lo, hi, b0, b1;
} shard_sel;
void shard_select(const shard_plan *p, const shard_tensor *t, uint32_t rank, shard_sel *s);

/* Rank r's heads [h0, h1) for SHARD_KV_B. */
void shard_kv_b_heads(const shard_plan *p, uint32_t rank, uint32_t *h0, uint32_t *h1);

/* Gathers rank r's slice of a copied tensor from the source bytes src (t->src_bytes long) into
 * dst (t->local_bytes). Used by deep verify and tests; the converter streams instead. */
void shard_gather(const shard_plan *p, const shard_tensor *t, uint32_t rank, const uint8_t *src,
                  uint8_t *dst);

/* One human-readable line per tensor for --dry-run, e.g.
 * "blk.0.attn_q_b.weight  Q5_K  {512, 1024} -> {512, 512}  rows (heads)  180224 B/rank". */
void shard_format_tensor(const shard_plan *p, uint64_t i, char *buf, size_t cap);

/* Which T values (1..max_tp) shard this model cleanly, without and with --ep: bit t-1 of
 * *tp_mask / *ep_mask is set if T = t works. For refusal messages and --dry-run. */
void shard_working_tp(const gguf_ctx *src, uint32_t kv_b_type, uint32_t max_tp,
                      uint64_t *tp_mask, uint64_t *ep_mask);

#endif
