/* Synthetic GLM-5 GGUFs: exactly the glm-dsa layout of a llama.cpp GGUF (tensor names, shapes,
 * order, metadata keys, a small byte-level BPE tokenizer with GLM's special tokens) filled with
 * random but valid weights in a UD-Q4_K_XL-like type mix. For tests, the demo and benchmarks.
 *
 * Presets:
 *   tiny  the oracle's dimensions (hidden 512, 4 heads, q_lora 512, kv_lora 512, 8 experts of
 *         width 512, vocab 2048, 3 main layers + 1 NextN): with the defaults, the tensor set,
 *         shapes, types and metadata keys equal ../shared/oracle/glm5-tiny's.
 *   glm5  GLM-5's real dimensions (hidden 6144, 64 heads, 256 experts of width 2048, 78 main
 *         layers + 1 NextN, vocab 154880, ...): hundreds of GB at full depth, so bound it with
 *         n_layers / n_experts.
 *
 * tp_friendly: every T in {1, 2, 4, 8} shards cleanly (heads, vocabulary and experts divide by
 * T; every split along ne[0] lands on block boundaries). The glm5 preset already is; for tiny it
 * raises the heads to 8, the dense FFN to 2048 and the expert width to 2048 (with the default
 * dims, tiny shards at T = 2 but not at T = 4: ffn_down_exps ne[0] = 512 is Q5_K, 512/4 = 128 is
 * not a multiple of 256; nor at T = 8: 4 heads). With tp_friendly the expert count must be a
 * multiple of 8 (for --ep).
 *
 * Output is deterministic: the same options give the same bytes. Each tensor's data depends only
 * on the seed and the tensor's name, so a split set holds exactly the single file's tensors.
 * Data is produced tensor by tensor through the GGUF writer's fill callback (bounded memory).
 * Files are written to a temporary name, fsynced and renamed. */
#ifndef G5_SYNTH_H
#define G5_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "format/glm5.h"
#include "format/status.h"

typedef enum synth_preset { SYNTH_PRESET_TINY = 0, SYNTH_PRESET_GLM5 = 1 } synth_preset;

typedef struct synth_opts {
    synth_preset preset;
    int64_t n_layers;    /* main layers (the NextN layer comes on top); < 0: preset default */
    int64_t n_experts;   /* routed experts; < 0: preset default */
    int tp_friendly;
    int centred;         /* Q2_K/Q4_K/Q5_K blocks zero-mean like trained weights
                          * (quant_centre_blocks); 0: quant_fill_random's as they come, whose
                          * products carry a common mode (the peer model llama.cpp was measured on) */
    uint64_t seed;
    uint64_t split_size; /* 0: one file; otherwise at most this many tensor-data bytes per split
                          * (a single larger tensor gets a split of its own) */
    uint64_t test_fail_after_bytes; /* test hook: the write that takes the set (all splits
                          * together) past this many bytes fails with ENOSPC (0: off) */
    uint8_t role_type[GLM5_ROLE_COUNT]; /* ggml type + 1 per role; 0: synth_role_type's mix */
} synth_opts;

void synth_opts_init(synth_opts *o); /* tiny, preset defaults, seed 1, one file */
/* "tiny" / "glm5" -> preset; G5_ERR_INVALID_ARG otherwise. */
g5_status synth_preset_from_name(const char *name, synth_preset *out, g5_error *err);

/* The hyperparameters the options produce (what glm5_hparams_read returns on the output).
 * Leading dense layers: the preset's count, but at most n_layers - 1 so that at least one main
 * layer is MoE whenever there are two or more. */
g5_status synth_hparams(const synth_opts *o, glm5_hparams *hp, g5_error *err);

/* The ggml type synth uses for a role (mirrors the oracle's UD-Q4_K_XL mix). */
uint32_t synth_role_type(glm5_role r);

/* The type a role gets under the options' type map (synth_role_type where none is set). */
uint32_t synth_opts_role_type(const synth_opts *o, glm5_role r);

/* Applies "ROLE=TYPE,..." to o->role_type: ROLE is a tensor role (glm5_role_name: ffn_up_exps,
 * attn_k_b, token_embd, nextn.eh_proj, ...) or a group (exps, exps_gate_up, shexp, ffn,
 * ffn_gate_up, attn); TYPE any type quant_check_supported accepts (case-insensitive). Norms,
 * the router and biases stay F32 (refused). Later items override earlier ones. A width the
 * type's block does not divide is refused by synth_plan_build, naming the tensor. */
g5_status synth_type_map_parse(const char *spec, synth_opts *o, g5_error *err);

/* Replaces o->role_type by a preset mimicking a published mix: ud-q4_k_xl (the default mix),
 * ud-q3_k_xl, ud-q2_k_xl, ud-iq2_xxs, ud-iq1_m, ud-iq1_s, and ud-fp4 (MXFP4, NVFP4, TQ1_0,
 * TQ2_0). Between them every supported block type appears in some role. */
g5_status synth_type_preset(const char *name, synth_opts *o, g5_error *err);
const char *synth_type_preset_names(void); /* "ud-q4_k_xl, ud-q3_k_xl, ..." */

/* Name of split k (0-based) of n for an output path: "DIR/NAME.gguf" ->
 * "DIR/NAME-%05u-of-%05u.gguf" (1-based in the name, like llama.cpp's gguf-split). */
g5_status synth_split_path(const char *path, uint32_t k, uint32_t n, char *out, size_t cap);

typedef struct synth_result {
    uint32_t n_files;        /* 1, or the number of splits */
    uint64_t n_tensors;
    uint64_t data_bytes;     /* sum of tensor sizes */
    uint64_t file_bytes;     /* sum of file sizes */
    char first_path[4096];   /* the file written, or split 1 of n */
} synth_result;

/* The tensors synth writes, in file order, without writing anything. */
typedef struct synth_tensor_info {
    char name[96];
    glm5_role role;
    int32_t layer;           /* -1 for globals */
    uint32_t type;           /* ggml type id */
    uint32_t n_dims;
    uint64_t ne[4];          /* ggml order; unused dims 1 */
    uint64_t nbytes;
    uint32_t split;          /* split index (0 without split_size) */
} synth_tensor_info;

typedef struct synth_plan {
    glm5_hparams hp;
    uint64_t n_tensors;
    synth_tensor_info *tensors;
    uint32_t n_splits;
    uint64_t data_bytes;     /* sum of tensor sizes */
    uint64_t n_params;       /* sum of tensor elements */
} synth_plan;

g5_status synth_plan_build(const synth_opts *o, synth_plan **out, g5_error *err);
void synth_plan_free(synth_plan *p); /* accepts NULL */

/* The metadata split 0 carries (architecture, hyperparameters, tokenizer) as a tensor-less GGUF
 * image (malloc'ed; the caller frees), without generating any weights. */
g5_status synth_metadata_image(const synth_opts *o, uint8_t **buf, uint64_t *len, g5_error *err);

/* Writes the model to `path` (or, with split_size, the split set named after it). res may be
 * NULL. */
g5_status synth_write(const synth_opts *o, const char *path, synth_result *res, g5_error *err);

#endif
