/* The CPU model's tensor table, public: what rt_model_create found and checked for each local
 * rank (types, this rank's shapes, data pointers into the weight set's memory, dequantized
 * norms and biases). The GPU model is built from it (runtime/gpu/gpu_model.c) without the CPU
 * model's private structures; the pointers are valid while the model lives, and nothing here
 * may be written. A matrix (rt_mat, cpu_ops.h) is {type, ncols, nrows, row_bytes, data}; a
 * tensor (rt_tensor, weights.h) is the weight set's own entry, whose data lies in the set's
 * memory (for a blob set at the tensor's offset in its rank's blob). */
#ifndef G5_RT_MODEL_TENSORS_H
#define G5_RT_MODEL_TENSORS_H

#include <stdint.h>

#include "runtime/cpu/cpu_ops.h"
#include "runtime/cpu/model.h"
#include "runtime/cpu/weights.h"

/* transformers' GlmMoeDsaIndexer uses nn.LayerNorm(index_head_dim, eps=1e-6) for k_norm; the
 * GGUF carries no key for it. */
#define RT_IDX_NORM_EPS 1e-6f

/* How a rank holds a matrix that TP may split: its whole, its rows (outputs; results are
 * gathered), or its columns (inputs; partial results are summed). */
typedef enum rt_split { RT_SPLIT_NONE = 0, RT_SPLIT_ROWS, RT_SPLIT_COLS } rt_split;

/* An output projection over the vocabulary, split by rows (tokens) across ranks: this rank
 * writes columns col0 .. col0 + mat.nrows of the logits (write = 0: another rank writes them). */
typedef struct rt_head {
    rt_mat mat;
    uint32_t col0;
    int write;
} rt_head;

typedef struct rt_layer {
    int present;                 /* the layer's tensors were found (main layers, NextN block) */
    int dense, nextn, has_indexer;
    /* attention (q_b, kv_b, o split by heads) */
    float *attn_norm, *q_a_norm, *kv_a_norm;          /* [n_embd] [q_lora] [kv_lora] */
    rt_mat q_a;                  /* [q_lora] rows of n_embd */
    rt_mat q_b;                  /* [H_l * (qk_nope + qk_rope)] rows of q_lora */
    rt_mat kv_a;                 /* [kv_lora + qk_rope] rows of n_embd */
    rt_mat kv_b;                 /* [H_l * (qk_nope + v_head)] rows of kv_lora */
    rt_mat k_b, v_b;             /* the GGUF's own pair where the set holds it with this rank's
                                    heads (.data NULL otherwise): [H_l * kv_lora] rows of qk_nope,
                                    [H_l * v_head] rows of kv_lora; the GPU's exact int8 kv_b */
    rt_mat o;                    /* [n_embd] rows of H_l * v_head */
    /* indexer (replicated) */
    rt_mat idx_q_b;              /* [idx_n_head * idx_head_dim] rows of q_lora */
    rt_mat idx_k;                /* [idx_head_dim] rows of n_embd */
    rt_mat idx_proj;             /* [idx_n_head] rows of n_embd */
    float *idx_k_norm, *idx_k_norm_b;                 /* [idx_head_dim] */
    /* FFN */
    float *ffn_norm;
    rt_mat ffn_gate, ffn_up, ffn_down;                /* dense: [ff_l] rows; down [n_embd] rows */
    rt_mat router;                                    /* [n_expert] rows of n_embd */
    float *router_b;                                  /* [n_expert] */
    const rt_tensor *exp_gate, *exp_up, *exp_down;    /* 3D, n_exp_l experts */
    rt_mat sh_gate, sh_up, sh_down;
    int sh_contrib;              /* this rank adds the shared expert (split, or rank 0 if whole) */
    uint32_t sh_l;               /* shared expert rows here */
    /* NextN */
    rt_mat eh_proj;
    rt_split eh_split;
    float *enorm, *hnorm, *shared_head_norm;
    rt_mat nextn_embed;          /* .data NULL when absent (token_embd is used) */
    rt_head nextn_head;          /* .mat.data NULL when absent (output is used) */
} rt_layer;

/* One local rank's tensors and its share of the model. */
typedef struct rt_rank_tensors {
    uint32_t r;                  /* global rank index */
    const rt_weights *w;         /* its weights (the tensor list, in the set's order) */
    uint32_t H_l;                /* attention heads here */
    uint32_t ff_l;               /* dense FFN rows here */
    uint32_t ffe_l;              /* rows of each routed expert here */
    uint32_t n_exp_l, exp0;      /* routed experts here: global ids exp0 .. exp0 + n_exp_l - 1 */
    uint64_t max_ncols;          /* widest matrix row */
    uint64_t max_rows;           /* widest FFN activation (ff_l, ffe_l, sh_l) */
    rt_mat tok_embd;
    rt_head output;
    const float *output_norm;    /* [n_embd] */
    const rt_layer *layers;      /* [n_layers]: the main layers, then the NextN block if any */
    uint32_t n_layers;
} rt_rank_tensors;

/* Local rank i (0 .. rt_model_n_local - 1). G5_ERR_INVALID_ARG when out of range. */
g5_status rt_model_rank_tensors(const rt_model *m, uint32_t i, rt_rank_tensors *out, g5_error *err);

#endif
