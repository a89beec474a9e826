/* GLM-5 (GGUF arch "glm-dsa") model facts shared by the converter, the auditor and the runtime:
 * hyperparameters from metadata, the expected tensor set with roles and shapes, and the kv_b
 * rebuild from attn_k_b / attn_v_b. No sharding policy here (that is convert/'s). */
#ifndef G5_GLM5_H
#define G5_GLM5_H

#include <stdint.h>

#include "gguf.h"
#include "status.h"

#define GLM5_ARCH "glm-dsa"
#define GLM5_MAX_LAYERS 512

typedef struct glm5_hparams {
    uint32_t n_layer;          /* block_count, including the NextN/MTP layers */
    uint32_t n_nextn;          /* nextn_predict_layers: the last n_nextn blocks are MTP */
    uint32_t n_layer_main;     /* n_layer - n_nextn */
    uint32_t n_embd;           /* hidden size */
    uint32_t n_vocab;
    uint32_t n_ctx_train;
    uint32_t n_ff;             /* dense FFN width */
    uint32_t n_ff_exp;         /* routed expert width */
    uint32_t n_head;
    uint32_t n_head_kv;        /* 1 in the GGUF (MLA stores one latent "kv head") */
    uint32_t q_lora;           /* q_lora_rank */
    uint32_t kv_lora;          /* kv_lora_rank */
    uint32_t qk_nope;          /* key_length_mla - rope dims */
    uint32_t qk_rope;          /* rope.dimension_count */
    uint32_t v_head;           /* value_length_mla */
    uint32_t n_expert;
    uint32_t n_expert_used;
    uint32_t n_expert_shared;
    uint32_t n_group;          /* expert_group_count (1 if absent) */
    uint32_t topk_group;       /* expert_group_used_count (1 if absent) */
    uint32_t n_leading_dense;  /* leading_dense_block_count */
    float expert_weights_scale;
    int expert_weights_norm;
    uint32_t expert_gating_func; /* 1 softmax, 2 sigmoid; absent means sigmoid for glm-dsa */
    float rope_theta;
    float rms_eps;
    uint32_t idx_n_head;       /* attention.indexer.head_count */
    uint32_t idx_head_dim;     /* attention.indexer.key_length */
    uint32_t idx_top_k;        /* attention.indexer.top_k */
    /* RoPE as the file states it (rope.freq_base; GLM-5.2's rope_parameters.rope_theta is written
     * there by the converters) and any declared long-context scaling. */
    uint32_t rope_scaling;     /* GLM5_ROPE_SCALING_NONE: any other declared type is refused */
    float rope_scale_factor;   /* rope.scaling.factor (1; another value is refused) */
    uint32_t rope_orig_ctx;    /* rope.scaling.original_context_length (0 when absent) */
    uint32_t version;          /* GLM5_VERSION_*: from general.* names or the hyperparameters */
    uint32_t idx_source;       /* GLM5_IDX_SRC_*: how the indexer schedule was determined */
    /* Per main layer: 1 if the layer runs its own indexer ("full"), 0 if it reuses the previous
     * full layer's top-k choice ("shared"); NextN blocks always run their own. See
     * specs/model-family.md for how it is read or inferred. */
    uint8_t idx_full[GLM5_MAX_LAYERS];
} glm5_hparams;

enum { GLM5_ROPE_SCALING_NONE = 0 };
enum { GLM5_VERSION_UNKNOWN = 0, GLM5_VERSION_5 = 1, GLM5_VERSION_5_1 = 2, GLM5_VERSION_5_2 = 3 };
enum {
    GLM5_IDX_SRC_KEY = 0,      /* glm-dsa.attention.indexer.types */
    GLM5_IDX_SRC_TENSORS = 1,  /* inferred: the layers that carry indexer tensors */
    GLM5_IDX_SRC_GLM52 = 2,    /* inferred: GLM-5.2's published schedule (file says GLM-5.2) */
    GLM5_IDX_SRC_ALL_FULL = 3  /* GLM-5 / GLM-5.1 (and DeepSeek-V3.2-style files): every layer */
};
/* GLM-5.2's config.json: index_skip_topk_offset 3, index_topk_freq 4 (layers 0, 1, 2 full, then
 * every 4th: 6, 10, ..., 74; 21 of 78). */
#define GLM5_52_SKIP_OFFSET 3u
#define GLM5_52_TOPK_FREQ 4u

/* "GLM-5", "GLM-5.1", "GLM-5.2", or "GLM-5 family" when unknown. */
const char *glm5_version_name(uint32_t version);
/* "metadata key", "indexer tensors present", "GLM-5.2 published schedule", "every layer". */
const char *glm5_idx_source_name(uint32_t src);
/* The layer whose top-k layer il uses (il itself for full layers and NextN blocks). */
uint32_t glm5_idx_src_layer(const glm5_hparams *hp, uint32_t il);
/* Number of main layers that run their own indexer. */
uint32_t glm5_n_idx_full(const glm5_hparams *hp);
/* Whether layer il runs an indexer (a full main layer or a NextN block). */
static inline int glm5_layer_has_indexer(const glm5_hparams *hp, uint32_t il) {
    return il >= hp->n_layer_main || hp->idx_full[il];
}
/* The full layers as ranges, "0-2,6,10,14" (truncated with "..." to cap). */
void glm5_idx_schedule_str(const glm5_hparams *hp, char *buf, size_t cap);

/* Reads and validates the hyperparameters (general.architecture must be glm-dsa). Every missing
 * or inconsistent key is named in the error. */
g5_status glm5_hparams_read(const gguf_ctx *ctx, glm5_hparams *hp, g5_error *err);

/* Whether block il is dense-FFN (leading dense), MoE, and/or a NextN/MTP block. */
static inline int glm5_layer_is_dense(const glm5_hparams *hp, uint32_t il) {
    return il < hp->n_leading_dense;
}
static inline int glm5_layer_is_nextn(const glm5_hparams *hp, uint32_t il) {
    return il >= hp->n_layer_main;
}

typedef enum glm5_role {
    GLM5_ROLE_UNKNOWN = 0,
    GLM5_ROLE_TOKEN_EMBD,
    GLM5_ROLE_OUTPUT_NORM,
    GLM5_ROLE_OUTPUT,          /* lm_head [n_embd, n_vocab] */
    GLM5_ROLE_ATTN_NORM,
    GLM5_ROLE_ATTN_Q_A,
    GLM5_ROLE_ATTN_Q_A_NORM,
    GLM5_ROLE_ATTN_Q_B,
    GLM5_ROLE_ATTN_KV_A,       /* attn_kv_a_mqa */
    GLM5_ROLE_ATTN_KV_A_NORM,
    GLM5_ROLE_ATTN_K_B,
    GLM5_ROLE_ATTN_V_B,
    GLM5_ROLE_ATTN_KV_B,       /* optional in a GGUF; always present in blobs (rebuilt) */
    GLM5_ROLE_ATTN_OUT,
    GLM5_ROLE_IDX_Q_B,
    GLM5_ROLE_IDX_K,
    GLM5_ROLE_IDX_K_NORM,
    GLM5_ROLE_IDX_K_NORM_BIAS,
    GLM5_ROLE_IDX_PROJ,
    GLM5_ROLE_FFN_NORM,
    GLM5_ROLE_FFN_GATE,
    GLM5_ROLE_FFN_UP,
    GLM5_ROLE_FFN_DOWN,
    GLM5_ROLE_ROUTER,          /* ffn_gate_inp */
    GLM5_ROLE_ROUTER_BIAS,     /* exp_probs_b.bias */
    GLM5_ROLE_EXP_GATE,
    GLM5_ROLE_EXP_UP,
    GLM5_ROLE_EXP_DOWN,
    GLM5_ROLE_SHEXP_GATE,
    GLM5_ROLE_SHEXP_UP,
    GLM5_ROLE_SHEXP_DOWN,
    GLM5_ROLE_NEXTN_EH_PROJ,
    GLM5_ROLE_NEXTN_ENORM,
    GLM5_ROLE_NEXTN_HNORM,
    GLM5_ROLE_NEXTN_SHARED_HEAD_NORM,
    GLM5_ROLE_NEXTN_EMBED,     /* optional nextn.embed_tokens */
    GLM5_ROLE_NEXTN_HEAD,      /* optional nextn.shared_head_head */
    GLM5_ROLE_COUNT
} glm5_role;

const char *glm5_role_name(glm5_role r);  /* "attn_q_b" */
/* The audit's coarse group: "attention", "indexer", "dense FFN", "experts", "shared expert",
 * "router", "NextN block", "norms", "embedding/output". */
const char *glm5_role_group(glm5_role r);
int glm5_role_is_indexer(glm5_role r);

typedef struct glm5_tensor_spec {
    char name[96];
    glm5_role role;
    int32_t layer;             /* -1 for global tensors */
    uint32_t n_dims;
    uint64_t ne[4];
    int optional;              /* may be absent from a GGUF */
    int unused;                /* part of the file but not of the model: a shared layer's
                                  indexer tensor (IndexShare; the runtime never reads it) */
} glm5_tensor_spec;

/* Number of expected tensors (optional ones included) and the i-th one, in a fixed order:
 * globals, then layer by layer. Out of range -> G5_ERR_INVALID_ARG. */
uint64_t glm5_n_expected(const glm5_hparams *hp);
g5_status glm5_expected_tensor(const glm5_hparams *hp, uint64_t i, glm5_tensor_spec *out);
/* Classifies a tensor name; *layer = -1 for globals. GLM5_ROLE_UNKNOWN if it matches nothing. */
glm5_role glm5_classify(const char *name, int32_t *layer);
/* The expected spec for a name (role, shape). G5_ERR_NOT_FOUND if not part of the model. A
 * shared layer's indexer tensor gets its spec with unused = 1 (such layers are not expected to
 * carry them, but published GGUFs duplicate them there). */
g5_status glm5_spec_for(const glm5_hparams *hp, const char *name, glm5_tensor_spec *out);

/* ---- validation (glm5_check.c): one set of rules for convert, inspect and the runtime ----
 *
 * glm5_hparams_read range-checks every hyperparameter (zero, absurdly large, NaN or infinite
 * values are named) before anything is sized from it. On top of that: */

/* The tokenizer metadata the runtime's tokenizer needs: model "gpt2", pre "glm4"/"chatglm-bpe",
 * tokens (strings, as many as the vocabulary, at least 256), merges (strings "LEFT RIGHT"),
 * token_type (i32, one per token, 0..6) if present, special ids (bos, eos, eot, eom, unknown,
 * padding) integers inside the vocabulary if present. The first problem names the key. */
g5_status glm5_tokenizer_check(const gguf_ctx *ctx, uint32_t n_vocab, g5_error *err);
/* One tensor: a GLM-5 name, the shape the hyperparameters give (ne: the whole tensor's), a type
 * both the converter and the runtime support (quant_check_supported); with data (nbytes long,
 * may be NULL), a 1-D tensor's values (norm weights, biases) must all be finite. */
g5_status glm5_tensor_check(const glm5_hparams *hp, const char *name, uint32_t type, const uint64_t ne[4],
                            const void *data, uint64_t nbytes, g5_error *err);
/* glm5_hparams_read + glm5_tokenizer_check (what a blob's embedded metadata must pass). */
g5_status glm5_meta_validate(const gguf_ctx *meta, glm5_hparams *hp, g5_error *err);
/* A whole GGUF: glm5_meta_validate, glm5_tensor_check on every tensor (with its data), every
 * required tensor present (attn_kv_b or attn_k_b + attn_v_b per layer, not both). Used by
 * `convert` before writing anything, by `inspect`'s audit, and by the runtime's GGUF open before
 * any allocation sized from the hyperparameters. */
g5_status glm5_model_validate(const gguf_ctx *ctx, glm5_hparams *hp, g5_error *err);

/* ---- what one decode token reads ----
 *
 * Bytes of one rank's weights that one decode step reads per token (one sequence, greedy), by
 * group, as the CUDA runtime reads them: the routed experts at n_expert_used / n_expert of their
 * bytes (the average under uniform routing, whole or split experts alike), one row of
 * token_embd, and per layer W_UK/W_UV as the GPU decode reads them: kv_b's exact int8 form (1.25
 * bytes per element of the pair: a byte, and a float scale per 16) where the layer holds
 * attn_k_b and attn_v_b of types that have one (quant_exact_i8: a GGUF, or a converter 1.1 blob,
 * whose kv_b beside them is then not counted), else the float32 kv_b rows (4 bytes per element,
 * whatever type kv_b is stored in). (A GGUF opened at TP > 1 reads the float32 kv_b: its pair is
 * not cut by heads.) The NextN
 * layer (layers >= n_layer_main) is counted apart: it runs once per draft with --draft mtp,
 * never in a plain step. Tensors the model does not read (a shared layer's indexer duplicates)
 * and unknown names count nowhere. */
typedef enum glm5_db_group {
    GLM5_DB_ATTN,       /* q_a, q_b, kv_a, W_UK/W_UV (kv_b's int8 form or float32), attn_output */
    GLM5_DB_INDEXER,
    GLM5_DB_DENSE_FFN,
    GLM5_DB_SHARED,     /* shared experts */
    GLM5_DB_ROUTED,     /* routed experts */
    GLM5_DB_HEAD,       /* output (lm_head) */
    GLM5_DB_EMBED,      /* one token_embd row */
    GLM5_DB_OTHER,      /* norms, router, biases */
    GLM5_DB_NEXTN,      /* the NextN block, per draft (not in the total) */
    GLM5_DB_COUNT
} glm5_db_group;
const char *glm5_db_group_name(glm5_db_group g); /* "attention", "indexer", ... */

typedef struct glm5_tensor_ref {
    const char *name;
    uint32_t type;
    uint64_t ne[4];      /* this rank's shape */
    uint64_t nbytes;     /* this rank's bytes */
} glm5_tensor_ref;

typedef struct glm5_decode_bytes {
    double group[GLM5_DB_COUNT];
    double total;        /* every group but GLM5_DB_NEXTN */
} glm5_decode_bytes;

/* Fills *out from one rank's n tensors. */
void glm5_decode_bytes_of(const glm5_hparams *hp, const glm5_tensor_ref *t, uint64_t n, glm5_decode_bytes *out);

/* Rebuilds HF's kv_b_proj for heads [h0, h1) of one layer, as float32 rows:
 *   out: [(h1-h0) * (qk_nope + v_head), kv_lora] row-major, i.e. in ggml order
 *   ne = {kv_lora, (h1-h0)*(qk_nope+v_head)}. Per head: qk_nope rows of W_UK, then v_head rows
 *   of W_UV, where
 *   W_UK[h][d][c] = attn_k_b[h][c][d]  (attn_k_b ne = {qk_nope, kv_lora, n_head}, transposed)
 *   W_UV[h][j][c] = attn_v_b[h][j][c]  (attn_v_b ne = {kv_lora, v_head, n_head})
 * Both inputs are dequantized exactly (quant.h), so the result is lossless w.r.t. the source.
 * `scratch` must hold max(qk_nope*kv_lora, v_head*kv_lora) floats. */
g5_status glm5_rebuild_kv_b(const glm5_hparams *hp, const gguf_tensor *k_b,
                            const gguf_tensor *v_b, uint32_t h0, uint32_t h1, float *out,
                            float *scratch, g5_error *err);

#endif
