#include "glm5.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant.h"

static g5_status hp_u32(const gguf_ctx *ctx, const char *suffix, uint32_t *out, int required,
                        uint32_t dflt, g5_error *err) {
    char key[128];
    snprintf(key, sizeof key, GLM5_ARCH ".%s", suffix);
    if (gguf_find_key(ctx, key) < 0) {
        if (required) return g5_fail(err, G5_ERR_MODEL, "metadata key '%s' is missing", key);
        *out = dflt;
        return G5_OK;
    }
    return gguf_get_u32(ctx, key, out, err);
}

static g5_status hp_f32(const gguf_ctx *ctx, const char *suffix, float *out, int required,
                        float dflt, g5_error *err) {
    char key[128];
    snprintf(key, sizeof key, GLM5_ARCH ".%s", suffix);
    if (gguf_find_key(ctx, key) < 0) {
        if (required) return g5_fail(err, G5_ERR_MODEL, "metadata key '%s' is missing", key);
        *out = dflt;
        return G5_OK;
    }
    double d;
    g5_status st = gguf_get_float(ctx, key, &d, err);
    if (st == G5_OK) *out = (float)d;
    return st;
}

static g5_status rope_read(const gguf_ctx *ctx, glm5_hparams *hp, g5_error *err);
static uint32_t version_of(const gguf_ctx *ctx, const glm5_hparams *hp);
static g5_status schedule_read(const gguf_ctx *ctx, glm5_hparams *hp, g5_error *err);

g5_status glm5_hparams_read(const gguf_ctx *ctx, glm5_hparams *hp, g5_error *err) {
    memset(hp, 0, sizeof *hp);
    const char *arch;
    uint64_t arch_len;
    g5_status st = gguf_get_str(ctx, "general.architecture", &arch, &arch_len, err);
    if (st) return st;
    if (arch_len != strlen(GLM5_ARCH) || memcmp(arch, GLM5_ARCH, arch_len) != 0)
        return g5_fail(err, G5_ERR_MODEL, "general.architecture is '%.*s', expected '" GLM5_ARCH "'",
                       (int)(arch_len > 64 ? 64 : arch_len), arch);

    uint32_t key_len_mla = 0;
#define REQ(field, key) if ((st = hp_u32(ctx, key, &hp->field, 1, 0, err))) return st
#define OPT(field, key, d) if ((st = hp_u32(ctx, key, &hp->field, 0, d, err))) return st
    REQ(n_layer, "block_count");
    OPT(n_nextn, "nextn_predict_layers", 0);
    REQ(n_embd, "embedding_length");
    OPT(n_ctx_train, "context_length", 0);
    REQ(n_ff, "feed_forward_length");
    REQ(n_ff_exp, "expert_feed_forward_length");
    REQ(n_head, "attention.head_count");
    OPT(n_head_kv, "attention.head_count_kv", 1);
    REQ(q_lora, "attention.q_lora_rank");
    REQ(kv_lora, "attention.kv_lora_rank");
    REQ(qk_rope, "rope.dimension_count");
    if ((st = hp_u32(ctx, "attention.key_length_mla", &key_len_mla, 1, 0, err))) return st;
    REQ(v_head, "attention.value_length_mla");
    REQ(n_expert, "expert_count");
    REQ(n_expert_used, "expert_used_count");
    OPT(n_expert_shared, "expert_shared_count", 0);
    OPT(n_group, "expert_group_count", 1);
    OPT(topk_group, "expert_group_used_count", 1);
    OPT(n_leading_dense, "leading_dense_block_count", 0);
    OPT(expert_gating_func, "expert_gating_func", 2);
    REQ(idx_n_head, "attention.indexer.head_count");
    REQ(idx_head_dim, "attention.indexer.key_length");
    REQ(idx_top_k, "attention.indexer.top_k");
#undef REQ
#undef OPT
    if ((st = hp_f32(ctx, "expert_weights_scale", &hp->expert_weights_scale, 0, 1.0f, err))) return st;
    if ((st = hp_f32(ctx, "rope.freq_base", &hp->rope_theta, 0, 10000.0f, err))) return st;
    if ((st = hp_f32(ctx, "attention.layer_norm_rms_epsilon", &hp->rms_eps, 1, 0, err))) return st;
    if (gguf_find_key(ctx, GLM5_ARCH ".expert_weights_norm") >= 0) {
        if ((st = gguf_get_bool(ctx, GLM5_ARCH ".expert_weights_norm", &hp->expert_weights_norm, err)))
            return st;
    }

    /* The vocabulary size: the arch key if present, otherwise the token list. */
    if (gguf_find_key(ctx, GLM5_ARCH ".vocab_size") >= 0) {
        if ((st = gguf_get_u32(ctx, GLM5_ARCH ".vocab_size", &hp->n_vocab, err))) return st;
    } else {
        gguf_vtype et;
        uint64_t n;
        if ((st = gguf_get_arr(ctx, "tokenizer.ggml.tokens", &et, &n, err))) return st;
        if (n > UINT32_MAX) return g5_fail(err, G5_ERR_MODEL, "tokenizer.ggml.tokens: %llu entries",
                                           (unsigned long long)n);
        hp->n_vocab = (uint32_t)n;
    }

    if (hp->n_layer == 0 || hp->n_layer > GLM5_MAX_LAYERS)
        return g5_fail(err, G5_ERR_MODEL, GLM5_ARCH ".block_count = %u (must be 1..%d)", hp->n_layer,
                       GLM5_MAX_LAYERS);
    if (hp->n_nextn >= hp->n_layer)
        return g5_fail(err, G5_ERR_MODEL, GLM5_ARCH ".nextn_predict_layers = %u >= block_count %u",
                       hp->n_nextn, hp->n_layer);
    hp->n_layer_main = hp->n_layer - hp->n_nextn;
    if (key_len_mla <= hp->qk_rope)
        return g5_fail(err, G5_ERR_MODEL,
                       GLM5_ARCH ".attention.key_length_mla = %u must exceed rope.dimension_count %u",
                       key_len_mla, hp->qk_rope);
    hp->qk_nope = key_len_mla - hp->qk_rope;
    if (hp->qk_rope % 2)
        return g5_fail(err, G5_ERR_MODEL, GLM5_ARCH ".rope.dimension_count = %u is odd", hp->qk_rope);
    if (hp->idx_head_dim < hp->qk_rope)
        return g5_fail(err, G5_ERR_MODEL, "indexer key_length %u is smaller than the rope dims %u",
                       hp->idx_head_dim, hp->qk_rope);
    struct { const char *name; uint32_t v; } nz[] = {
        {"embedding_length", hp->n_embd}, {"vocab", hp->n_vocab},
        {"feed_forward_length", hp->n_ff}, {"expert_feed_forward_length", hp->n_ff_exp},
        {"attention.head_count", hp->n_head}, {"attention.q_lora_rank", hp->q_lora},
        {"attention.kv_lora_rank", hp->kv_lora}, {"attention.value_length_mla", hp->v_head},
        {"expert_count", hp->n_expert}, {"expert_used_count", hp->n_expert_used},
        {"expert_group_count", hp->n_group}, {"expert_group_used_count", hp->topk_group},
        {"attention.indexer.head_count", hp->idx_n_head},
        {"attention.indexer.key_length", hp->idx_head_dim},
        {"attention.indexer.top_k", hp->idx_top_k},
    };
    for (size_t i = 0; i < sizeof nz / sizeof nz[0]; i++)
        if (nz[i].v == 0) return g5_fail(err, G5_ERR_MODEL, GLM5_ARCH ".%s is 0", nz[i].name);
    /* Upper bounds far above any real model, so that every product the loaders size buffers
     * with (heads x head dims x latent rank x 4 bytes, experts x widths, ...) fits in 64 bits and
     * an absurd value is named here, before any allocation, not reported as out of memory. */
    struct { const char *name; uint32_t v, max; } cap[] = {
        {"embedding_length", hp->n_embd, 1u << 20}, {"vocab", hp->n_vocab, 1u << 28},
        {"feed_forward_length", hp->n_ff, 1u << 22}, {"expert_feed_forward_length", hp->n_ff_exp, 1u << 22},
        {"attention.head_count", hp->n_head, 1u << 16}, {"attention.head_count_kv", hp->n_head_kv, 1u << 16},
        {"attention.q_lora_rank", hp->q_lora, 1u << 20}, {"attention.kv_lora_rank", hp->kv_lora, 1u << 20},
        {"attention.key_length_mla", key_len_mla, 1u << 20}, {"attention.value_length_mla", hp->v_head, 1u << 20},
        {"expert_count", hp->n_expert, 1u << 16}, {"expert_shared_count", hp->n_expert_shared, 1u << 16},
        {"attention.indexer.head_count", hp->idx_n_head, 1u << 16},
        {"attention.indexer.key_length", hp->idx_head_dim, 1u << 20},
        {"attention.indexer.top_k", hp->idx_top_k, 1u << 30},
        {"leading_dense_block_count", hp->n_leading_dense, GLM5_MAX_LAYERS},
    };
    for (size_t i = 0; i < sizeof cap / sizeof cap[0]; i++)
        if (cap[i].v > cap[i].max)
            return g5_fail(err, G5_ERR_MODEL, GLM5_ARCH ".%s = %u (must be at most %u)", cap[i].name, cap[i].v,
                           cap[i].max);
    if (gguf_find_key(ctx, GLM5_ARCH ".context_length") >= 0 && hp->n_ctx_train == 0)
        return g5_fail(err, G5_ERR_MODEL, GLM5_ARCH ".context_length is 0 (must be at least 1)");
    /* NaN compares false both ways: the checks are written so that NaN fails them. */
    struct { const char *name; float v; float lo, hi; } fl[] = {
        {"attention.layer_norm_rms_epsilon", hp->rms_eps, 0.0f, 1.0f},
        {"rope.freq_base", hp->rope_theta, 0.0f, 1e30f},
        {"expert_weights_scale", hp->expert_weights_scale, 0.0f, 1e30f},
    };
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++)
        if (!(fl[i].v > fl[i].lo && fl[i].v < fl[i].hi))
            return g5_fail(err, G5_ERR_MODEL, GLM5_ARCH ".%s = %g (must be finite, in (%g, %g))", fl[i].name,
                           (double)fl[i].v, (double)fl[i].lo, (double)fl[i].hi);
    if (hp->n_expert_used > hp->n_expert)
        return g5_fail(err, G5_ERR_MODEL, "expert_used_count %u > expert_count %u",
                       hp->n_expert_used, hp->n_expert);
    if (hp->n_expert % hp->n_group || hp->topk_group > hp->n_group)
        return g5_fail(err, G5_ERR_MODEL, "expert groups: %u experts, %u groups, %u used groups",
                       hp->n_expert, hp->n_group, hp->topk_group);
    if (hp->expert_gating_func != 1 && hp->expert_gating_func != 2)
        return g5_fail(err, G5_ERR_MODEL, GLM5_ARCH ".expert_gating_func = %u (1 softmax, 2 sigmoid)",
                       hp->expert_gating_func);

    if ((st = rope_read(ctx, hp, err))) return st;
    hp->version = version_of(ctx, hp);
    return schedule_read(ctx, hp, err);
}

/* ---- version, RoPE and the indexer schedule ---- */

const char *glm5_version_name(uint32_t v) {
    return v == GLM5_VERSION_5 ? "GLM-5" : v == GLM5_VERSION_5_1 ? "GLM-5.1"
         : v == GLM5_VERSION_5_2 ? "GLM-5.2" : "GLM-5 family";
}

const char *glm5_idx_source_name(uint32_t src) {
    switch (src) {
    case GLM5_IDX_SRC_KEY: return "metadata key " GLM5_ARCH ".attention.indexer.types";
    case GLM5_IDX_SRC_TENSORS: return "inferred from the layers that carry indexer tensors";
    case GLM5_IDX_SRC_GLM52: return "inferred: GLM-5.2's published schedule (offset 3, every 4th)";
    default: return "every layer (no IndexShare)";
    }
}

/* A version named in one general.* string: "GLM-5.2", "glm5.1", "GLM_5", "GLM 5.2-FP8". */
static uint32_t version_in(const char *s, uint64_t n) {
    for (uint64_t i = 0; i + 3 < n; i++) {
        if ((s[i] | 32) != 'g' || (s[i + 1] | 32) != 'l' || (s[i + 2] | 32) != 'm') continue;
        uint64_t j = i + 3;
        if (j < n && (s[j] == '-' || s[j] == '_' || s[j] == ' ')) j++;
        if (j >= n || s[j] != '5') continue;
        j++;
        if (j < n && s[j] >= '0' && s[j] <= '9') continue; /* GLM-50 is not GLM-5 */
        if (j + 1 < n && s[j] == '.' && s[j + 1] >= '0' && s[j + 1] <= '9') {
            if (j + 2 < n && s[j + 2] >= '0' && s[j + 2] <= '9') return GLM5_VERSION_UNKNOWN;
            return s[j + 1] == '2' ? GLM5_VERSION_5_2 : s[j + 1] == '1' ? GLM5_VERSION_5_1
                 : s[j + 1] == '0' ? GLM5_VERSION_5 : 100u + (uint32_t)(s[j + 1] - '0');
        }
        return GLM5_VERSION_5;
    }
    return GLM5_VERSION_UNKNOWN;
}

/* From general.name / basename / finetune; otherwise GLM-5.2's hyperparameters (rope_theta 8e6,
 * context 1,048,576) name it; values >= 100 are a later "GLM-5.x" this code does not know. */
static uint32_t version_of(const gguf_ctx *ctx, const glm5_hparams *hp) {
    static const char *const keys[] = {"general.basename", "general.name", "general.finetune"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        const char *v;
        uint64_t n;
        if (gguf_find_key(ctx, keys[k]) < 0 || gguf_get_str(ctx, keys[k], &v, &n, NULL) != G5_OK) continue;
        uint32_t ver = version_in(v, n);
        if (ver != GLM5_VERSION_UNKNOWN) return ver;
    }
    if (hp->n_ctx_train == 1048576u && hp->rope_theta == 8e6f) return GLM5_VERSION_5_2;
    return GLM5_VERSION_UNKNOWN;
}

/* GLM-5, 5.1 and 5.2 declare no RoPE scaling (rope_parameters.rope_type "default"); a file that
 * declares one is refused rather than run with positions it was not trained on. */
static g5_status rope_read(const gguf_ctx *ctx, glm5_hparams *hp, g5_error *err) {
    g5_status st;
    hp->rope_scaling = GLM5_ROPE_SCALING_NONE;
    hp->rope_scale_factor = 1.0f;
    const char *tkey = GLM5_ARCH ".rope.scaling.type";
    if ((st = hp_f32(ctx, "rope.scaling.factor", &hp->rope_scale_factor, 0, 1.0f, err))) return st;
    if ((st = hp_u32(ctx, "rope.scaling.original_context_length", &hp->rope_orig_ctx, 0, 0, err))) return st;
    int none = 1;
    if (gguf_find_key(ctx, tkey) >= 0) {
        const char *v;
        uint64_t n;
        if ((st = gguf_get_str(ctx, tkey, &v, &n, err))) return st;
        none = n == 4 && !memcmp(v, "none", 4);
        if (!none)
            return g5_fail(err, G5_ERR_UNSUPPORTED, "%s = '%.*s': RoPE scaling is not implemented (GLM-5, "
                           "5.1 and 5.2 declare none)", tkey, (int)(n > 32 ? 32 : n), v);
    }
    if (hp->rope_scale_factor != 1.0f)
        return g5_fail(err, G5_ERR_UNSUPPORTED, GLM5_ARCH ".rope.scaling.factor = %g: RoPE scaling is not "
                       "implemented (GLM-5, 5.1 and 5.2 declare none)", (double)hp->rope_scale_factor);
    if (!(hp->rope_theta > 1.0f) || !isfinite(hp->rope_theta))
        return g5_fail(err, G5_ERR_MODEL, GLM5_ARCH ".rope.freq_base = %g (must be finite and > 1)",
                       (double)hp->rope_theta);
    return G5_OK;
}

/* Which of layer il's five indexer tensors the file carries (a bit per role). */
static unsigned idx_tensors_in(const gguf_ctx *ctx, uint32_t il) {
    static const char *const names[] = {"indexer.attn_q_b.weight", "indexer.attn_k.weight",
                                        "indexer.k_norm.weight", "indexer.k_norm.bias",
                                        "indexer.proj.weight"};
    unsigned m = 0;
    for (unsigned k = 0; k < 5; k++) {
        char nm[96];
        snprintf(nm, sizeof nm, "blk.%u.%s", il, names[k]);
        if (gguf_find_tensor(ctx, nm)) m |= 1u << k;
    }
    return m;
}

static g5_status schedule_read(const gguf_ctx *ctx, glm5_hparams *hp, g5_error *err) {
    g5_status st;
    const char *tkey = GLM5_ARCH ".attention.indexer.types";
    memset(hp->idx_full, 1, sizeof hp->idx_full);
    if (gguf_find_key(ctx, tkey) >= 0) {
        gguf_vtype et;
        uint64_t n;
        const void *data;
        if ((st = gguf_get_arr(ctx, tkey, &et, &n, err))) return st;
        if (et != GGUF_VT_BOOL && et != GGUF_VT_UINT8 && et != GGUF_VT_INT8)
            return g5_fail(err, G5_ERR_MODEL, "%s: expected a bool array, got %s", tkey,
                           gguf_vtype_name(et));
        if (n != hp->n_layer_main && n != hp->n_layer)
            return g5_fail(err, G5_ERR_MODEL, "%s has %llu entries, expected %u", tkey,
                           (unsigned long long)n, hp->n_layer_main);
        if ((st = gguf_get_arr_data(ctx, tkey, &data, err))) return st;
        /* an entry for a NextN block is ignored: it always runs its own indexer */
        for (uint64_t i = 0; i < hp->n_layer_main; i++) hp->idx_full[i] = ((const uint8_t *)data)[i] ? 1 : 0;
        if (!hp->idx_full[0])
            return g5_fail(err, G5_ERR_MODEL, "%s: layer 0 is 'shared' but has no layer to share from",
                           tkey);
        hp->idx_source = GLM5_IDX_SRC_KEY;
        return G5_OK;
    }
    /* No key. A file with tensors (not a blob's metadata image) tells which layers carry them. */
    if (gguf_get_n_tensors(ctx) > 0) {
        uint32_t n_with = 0;
        for (uint32_t il = 0; il < hp->n_layer_main; il++) {
            unsigned m = idx_tensors_in(ctx, il);
            if (m != 0 && m != 0x1f)
                return g5_fail(err, G5_ERR_MODEL,
                               "layer %u carries only some of its indexer tensors and the file has no %s: "
                               "cannot tell whether it is a full or a shared layer", il, tkey);
            hp->idx_full[il] = m == 0x1f;
            n_with += hp->idx_full[il];
        }
        if (n_with < hp->n_layer_main) {
            if (!hp->idx_full[0])
                return g5_fail(err, G5_ERR_MODEL, "layer 0 has no indexer tensors (and no %s): the first "
                               "layer must run the indexer", tkey);
            if (hp->version == GLM5_VERSION_5 || hp->version == GLM5_VERSION_5_1)
                return g5_fail(err, G5_ERR_MODEL, "the file names %s, which runs the indexer on every layer, "
                               "but %u of %u layers carry no indexer tensors",
                               glm5_version_name(hp->version), hp->n_layer_main - n_with, hp->n_layer_main);
            hp->idx_source = GLM5_IDX_SRC_TENSORS;
            return G5_OK;
        }
        memset(hp->idx_full, 1, sizeof hp->idx_full);
    }
    if (hp->version >= 100u)
        return g5_fail(err, G5_ERR_MODEL, "the file names GLM-5.%u, whose indexer schedule is not known "
                       "here, and has no %s", hp->version - 100u, tkey);
    if (hp->version == GLM5_VERSION_5_2) {
        /* Published GLM-5.2 GGUFs duplicate the indexer on every layer and carry no key; their
         * config.json says layers < 3 and then every 4th run it (llama.cpp's and SGLang's rule). */
        for (uint32_t il = 0; il < hp->n_layer_main; il++)
            hp->idx_full[il] = il < GLM5_52_SKIP_OFFSET ||
                               (il - GLM5_52_SKIP_OFFSET) % GLM5_52_TOPK_FREQ == GLM5_52_TOPK_FREQ - 1;
        hp->idx_source = GLM5_IDX_SRC_GLM52;
        return G5_OK;
    }
    hp->idx_source = GLM5_IDX_SRC_ALL_FULL;
    return G5_OK;
}

uint32_t glm5_idx_src_layer(const glm5_hparams *hp, uint32_t il) {
    if (il >= hp->n_layer_main) return il;
    while (il > 0 && !hp->idx_full[il]) il--;
    return il;
}

uint32_t glm5_n_idx_full(const glm5_hparams *hp) {
    uint32_t n = 0;
    for (uint32_t il = 0; il < hp->n_layer_main; il++) n += hp->idx_full[il];
    return n;
}

void glm5_idx_schedule_str(const glm5_hparams *hp, char *buf, size_t cap) {
    size_t o = 0;
    if (!cap) return;
    buf[0] = 0;
    for (uint32_t il = 0; il < hp->n_layer_main; il++) {
        if (!hp->idx_full[il]) continue;
        uint32_t e = il;
        while (e + 1 < hp->n_layer_main && hp->idx_full[e + 1]) e++;
        char item[32];
        int k = e > il ? snprintf(item, sizeof item, "%s%u-%u", o ? "," : "", il, e)
                       : snprintf(item, sizeof item, "%s%u", o ? "," : "", il);
        if (o + (size_t)k + 4 >= cap) {
            snprintf(buf + o, cap - o, ",...");
            return;
        }
        memcpy(buf + o, item, (size_t)k + 1);
        o += (size_t)k;
        il = e;
    }
}

/* ---- roles ---- */

typedef struct role_desc {
    glm5_role role;
    const char *name;   /* suffix after "blk.N." or the global name, without ".weight" */
    const char *group;
    int per_layer;
    const char *suffix; /* ".weight" or ".bias" */
} role_desc;

static const role_desc k_roles[] = {
    {GLM5_ROLE_TOKEN_EMBD, "token_embd", "embedding/output", 0, ".weight"},
    {GLM5_ROLE_OUTPUT_NORM, "output_norm", "norms", 0, ".weight"},
    {GLM5_ROLE_OUTPUT, "output", "embedding/output", 0, ".weight"},
    {GLM5_ROLE_ATTN_NORM, "attn_norm", "norms", 1, ".weight"},
    {GLM5_ROLE_ATTN_Q_A, "attn_q_a", "attention", 1, ".weight"},
    {GLM5_ROLE_ATTN_Q_A_NORM, "attn_q_a_norm", "norms", 1, ".weight"},
    {GLM5_ROLE_ATTN_Q_B, "attn_q_b", "attention", 1, ".weight"},
    {GLM5_ROLE_ATTN_KV_A, "attn_kv_a_mqa", "attention", 1, ".weight"},
    {GLM5_ROLE_ATTN_KV_A_NORM, "attn_kv_a_norm", "norms", 1, ".weight"},
    {GLM5_ROLE_ATTN_K_B, "attn_k_b", "attention", 1, ".weight"},
    {GLM5_ROLE_ATTN_V_B, "attn_v_b", "attention", 1, ".weight"},
    {GLM5_ROLE_ATTN_KV_B, "attn_kv_b", "attention", 1, ".weight"},
    {GLM5_ROLE_ATTN_OUT, "attn_output", "attention", 1, ".weight"},
    {GLM5_ROLE_IDX_Q_B, "indexer.attn_q_b", "indexer", 1, ".weight"},
    {GLM5_ROLE_IDX_K, "indexer.attn_k", "indexer", 1, ".weight"},
    {GLM5_ROLE_IDX_K_NORM, "indexer.k_norm", "indexer", 1, ".weight"},
    {GLM5_ROLE_IDX_K_NORM_BIAS, "indexer.k_norm", "indexer", 1, ".bias"},
    {GLM5_ROLE_IDX_PROJ, "indexer.proj", "indexer", 1, ".weight"},
    {GLM5_ROLE_FFN_NORM, "ffn_norm", "norms", 1, ".weight"},
    {GLM5_ROLE_FFN_GATE, "ffn_gate", "dense FFN", 1, ".weight"},
    {GLM5_ROLE_FFN_UP, "ffn_up", "dense FFN", 1, ".weight"},
    {GLM5_ROLE_FFN_DOWN, "ffn_down", "dense FFN", 1, ".weight"},
    {GLM5_ROLE_ROUTER, "ffn_gate_inp", "router", 1, ".weight"},
    {GLM5_ROLE_ROUTER_BIAS, "exp_probs_b", "router", 1, ".bias"},
    {GLM5_ROLE_EXP_GATE, "ffn_gate_exps", "experts", 1, ".weight"},
    {GLM5_ROLE_EXP_UP, "ffn_up_exps", "experts", 1, ".weight"},
    {GLM5_ROLE_EXP_DOWN, "ffn_down_exps", "experts", 1, ".weight"},
    {GLM5_ROLE_SHEXP_GATE, "ffn_gate_shexp", "shared expert", 1, ".weight"},
    {GLM5_ROLE_SHEXP_UP, "ffn_up_shexp", "shared expert", 1, ".weight"},
    {GLM5_ROLE_SHEXP_DOWN, "ffn_down_shexp", "shared expert", 1, ".weight"},
    {GLM5_ROLE_NEXTN_EH_PROJ, "nextn.eh_proj", "NextN block", 1, ".weight"},
    {GLM5_ROLE_NEXTN_ENORM, "nextn.enorm", "NextN block", 1, ".weight"},
    {GLM5_ROLE_NEXTN_HNORM, "nextn.hnorm", "NextN block", 1, ".weight"},
    {GLM5_ROLE_NEXTN_SHARED_HEAD_NORM, "nextn.shared_head_norm", "NextN block", 1, ".weight"},
    {GLM5_ROLE_NEXTN_EMBED, "nextn.embed_tokens", "NextN block", 1, ".weight"},
    {GLM5_ROLE_NEXTN_HEAD, "nextn.shared_head_head", "NextN block", 1, ".weight"},
};
#define N_ROLES (sizeof k_roles / sizeof k_roles[0])

static const role_desc *role_find(glm5_role r) {
    for (size_t i = 0; i < N_ROLES; i++)
        if (k_roles[i].role == r) return &k_roles[i];
    return NULL;
}

const char *glm5_role_name(glm5_role r) {
    const role_desc *d = role_find(r);
    if (!d) return "unknown";
    return r == GLM5_ROLE_IDX_K_NORM_BIAS ? "indexer.k_norm.bias"
           : r == GLM5_ROLE_ROUTER_BIAS   ? "exp_probs_b.bias"
                                          : d->name;
}

const char *glm5_role_group(glm5_role r) {
    const role_desc *d = role_find(r);
    return d ? d->group : "unknown";
}

int glm5_role_is_indexer(glm5_role r) {
    return r == GLM5_ROLE_IDX_Q_B || r == GLM5_ROLE_IDX_K || r == GLM5_ROLE_IDX_K_NORM ||
           r == GLM5_ROLE_IDX_K_NORM_BIAS || r == GLM5_ROLE_IDX_PROJ;
}

glm5_role glm5_classify(const char *name, int32_t *layer) {
    *layer = -1;
    const char *rest = name;
    if (strncmp(name, "blk.", 4) == 0) {
        const char *p = name + 4;
        long v = 0;
        if (*p < '0' || *p > '9') return GLM5_ROLE_UNKNOWN;
        while (*p >= '0' && *p <= '9') {
            v = v * 10 + (*p - '0');
            if (v >= GLM5_MAX_LAYERS) return GLM5_ROLE_UNKNOWN;
            p++;
        }
        if (*p != '.') return GLM5_ROLE_UNKNOWN;
        *layer = (int32_t)v;
        rest = p + 1;
    }
    for (size_t i = 0; i < N_ROLES; i++) {
        const role_desc *d = &k_roles[i];
        if (d->per_layer != (*layer >= 0)) continue;
        size_t n = strlen(d->name);
        if (strncmp(rest, d->name, n) == 0 && strcmp(rest + n, d->suffix) == 0) return d->role;
    }
    *layer = -1;
    return GLM5_ROLE_UNKNOWN;
}

/* Shape of a role in ggml order (ne[0] contiguous). */
static void role_shape(const glm5_hparams *hp, glm5_role r, uint32_t *n_dims, uint64_t ne[4]) {
    const uint64_t E = hp->n_embd, H = hp->n_head;
    ne[0] = ne[1] = ne[2] = ne[3] = 1;
    *n_dims = 1;
#define S1(a) (ne[0] = (a), *n_dims = 1)
#define S2(a, b) (ne[0] = (a), ne[1] = (b), *n_dims = 2)
#define S3(a, b, c) (ne[0] = (a), ne[1] = (b), ne[2] = (c), *n_dims = 3)
    switch (r) {
    case GLM5_ROLE_TOKEN_EMBD: S2(E, hp->n_vocab); break;
    case GLM5_ROLE_OUTPUT: S2(E, hp->n_vocab); break;
    case GLM5_ROLE_OUTPUT_NORM: case GLM5_ROLE_ATTN_NORM: case GLM5_ROLE_FFN_NORM:
    case GLM5_ROLE_NEXTN_ENORM: case GLM5_ROLE_NEXTN_HNORM: case GLM5_ROLE_NEXTN_SHARED_HEAD_NORM:
        S1(E); break;
    case GLM5_ROLE_ATTN_Q_A: S2(E, hp->q_lora); break;
    case GLM5_ROLE_ATTN_Q_A_NORM: S1(hp->q_lora); break;
    case GLM5_ROLE_ATTN_Q_B: S2(hp->q_lora, H * (hp->qk_nope + hp->qk_rope)); break;
    case GLM5_ROLE_ATTN_KV_A: S2(E, hp->kv_lora + hp->qk_rope); break;
    case GLM5_ROLE_ATTN_KV_A_NORM: S1(hp->kv_lora); break;
    case GLM5_ROLE_ATTN_K_B: S3(hp->qk_nope, hp->kv_lora, H); break;
    case GLM5_ROLE_ATTN_V_B: S3(hp->kv_lora, hp->v_head, H); break;
    case GLM5_ROLE_ATTN_KV_B: S2(hp->kv_lora, H * (hp->qk_nope + hp->v_head)); break;
    case GLM5_ROLE_ATTN_OUT: S2(H * hp->v_head, E); break;
    case GLM5_ROLE_IDX_Q_B: S2(hp->q_lora, (uint64_t)hp->idx_n_head * hp->idx_head_dim); break;
    case GLM5_ROLE_IDX_K: S2(E, hp->idx_head_dim); break;
    case GLM5_ROLE_IDX_K_NORM: case GLM5_ROLE_IDX_K_NORM_BIAS: S1(hp->idx_head_dim); break;
    case GLM5_ROLE_IDX_PROJ: S2(E, hp->idx_n_head); break;
    case GLM5_ROLE_FFN_GATE: case GLM5_ROLE_FFN_UP: S2(E, hp->n_ff); break;
    case GLM5_ROLE_FFN_DOWN: S2(hp->n_ff, E); break;
    case GLM5_ROLE_ROUTER: S2(E, hp->n_expert); break;
    case GLM5_ROLE_ROUTER_BIAS: S1(hp->n_expert); break;
    case GLM5_ROLE_EXP_GATE: case GLM5_ROLE_EXP_UP: S3(E, hp->n_ff_exp, hp->n_expert); break;
    case GLM5_ROLE_EXP_DOWN: S3(hp->n_ff_exp, E, hp->n_expert); break;
    case GLM5_ROLE_SHEXP_GATE: case GLM5_ROLE_SHEXP_UP:
        S2(E, (uint64_t)hp->n_ff_exp * hp->n_expert_shared); break;
    case GLM5_ROLE_SHEXP_DOWN: S2((uint64_t)hp->n_ff_exp * hp->n_expert_shared, E); break;
    case GLM5_ROLE_NEXTN_EH_PROJ: S2(2 * E, E); break;
    case GLM5_ROLE_NEXTN_EMBED: S2(E, hp->n_vocab); break;
    case GLM5_ROLE_NEXTN_HEAD: S2(E, hp->n_vocab); break;
    default: break;
    }
#undef S1
#undef S2
#undef S3
}

/* Which roles a layer has, in a fixed order; returns the count. optional[i] marks optional ones. */
static size_t layer_roles(const glm5_hparams *hp, uint32_t il, glm5_role *out, int *optional) {
    size_t n = 0;
#define ADD(r, o) (out[n] = (r), optional[n] = (o), n++)
    ADD(GLM5_ROLE_ATTN_NORM, 0); ADD(GLM5_ROLE_ATTN_Q_A, 0); ADD(GLM5_ROLE_ATTN_Q_A_NORM, 0);
    ADD(GLM5_ROLE_ATTN_Q_B, 0); ADD(GLM5_ROLE_ATTN_KV_A, 0); ADD(GLM5_ROLE_ATTN_KV_A_NORM, 0);
    ADD(GLM5_ROLE_ATTN_K_B, 0); ADD(GLM5_ROLE_ATTN_V_B, 0); ADD(GLM5_ROLE_ATTN_KV_B, 1);
    ADD(GLM5_ROLE_ATTN_OUT, 0);
    if (glm5_layer_has_indexer(hp, il)) { /* shared layers reuse an earlier layer's top-k */
        ADD(GLM5_ROLE_IDX_Q_B, 0); ADD(GLM5_ROLE_IDX_K, 0); ADD(GLM5_ROLE_IDX_K_NORM, 0);
        ADD(GLM5_ROLE_IDX_K_NORM_BIAS, 0); ADD(GLM5_ROLE_IDX_PROJ, 0);
    }
    ADD(GLM5_ROLE_FFN_NORM, 0);
    if (glm5_layer_is_dense(hp, il)) {
        ADD(GLM5_ROLE_FFN_GATE, 0); ADD(GLM5_ROLE_FFN_UP, 0); ADD(GLM5_ROLE_FFN_DOWN, 0);
    } else {
        ADD(GLM5_ROLE_ROUTER, 0); ADD(GLM5_ROLE_ROUTER_BIAS, 0);
        ADD(GLM5_ROLE_EXP_GATE, 0); ADD(GLM5_ROLE_EXP_UP, 0); ADD(GLM5_ROLE_EXP_DOWN, 0);
        if (hp->n_expert_shared) {
            ADD(GLM5_ROLE_SHEXP_GATE, 0); ADD(GLM5_ROLE_SHEXP_UP, 0); ADD(GLM5_ROLE_SHEXP_DOWN, 0);
        }
    }
    if (glm5_layer_is_nextn(hp, il)) {
        ADD(GLM5_ROLE_NEXTN_EH_PROJ, 0); ADD(GLM5_ROLE_NEXTN_ENORM, 0);
        ADD(GLM5_ROLE_NEXTN_HNORM, 0); ADD(GLM5_ROLE_NEXTN_SHARED_HEAD_NORM, 0);
        ADD(GLM5_ROLE_NEXTN_EMBED, 1); ADD(GLM5_ROLE_NEXTN_HEAD, 1);
    }
#undef ADD
    return n;
}

#define MAX_LAYER_ROLES 40
static const glm5_role k_globals[] = {GLM5_ROLE_TOKEN_EMBD, GLM5_ROLE_OUTPUT_NORM, GLM5_ROLE_OUTPUT};

static void fill_spec(const glm5_hparams *hp, glm5_role r, int32_t layer, int optional,
                      glm5_tensor_spec *out) {
    memset(out, 0, sizeof *out);
    const role_desc *d = role_find(r);
    if (layer >= 0)
        snprintf(out->name, sizeof out->name, "blk.%d.%s%s", (int)layer, d->name, d->suffix);
    else
        snprintf(out->name, sizeof out->name, "%s%s", d->name, d->suffix);
    out->role = r;
    out->layer = layer;
    out->optional = optional;
    role_shape(hp, r, &out->n_dims, out->ne);
}

uint64_t glm5_n_expected(const glm5_hparams *hp) {
    uint64_t n = sizeof k_globals / sizeof k_globals[0];
    glm5_role roles[MAX_LAYER_ROLES];
    int opt[MAX_LAYER_ROLES];
    for (uint32_t il = 0; il < hp->n_layer; il++) n += layer_roles(hp, il, roles, opt);
    return n;
}

g5_status glm5_expected_tensor(const glm5_hparams *hp, uint64_t i, glm5_tensor_spec *out) {
    const uint64_t ng = sizeof k_globals / sizeof k_globals[0];
    if (i < ng) {
        fill_spec(hp, k_globals[i], -1, 0, out);
        return G5_OK;
    }
    i -= ng;
    glm5_role roles[MAX_LAYER_ROLES];
    int opt[MAX_LAYER_ROLES];
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        size_t n = layer_roles(hp, il, roles, opt);
        if (i < n) {
            fill_spec(hp, roles[i], (int32_t)il, opt[i], out);
            return G5_OK;
        }
        i -= n;
    }
    return G5_ERR_INVALID_ARG;
}

g5_status glm5_spec_for(const glm5_hparams *hp, const char *name, glm5_tensor_spec *out) {
    int32_t layer;
    glm5_role r = glm5_classify(name, &layer);
    if (r == GLM5_ROLE_UNKNOWN) return G5_ERR_NOT_FOUND;
    if (layer < 0) {
        fill_spec(hp, r, -1, 0, out);
        return G5_OK;
    }
    if ((uint32_t)layer >= hp->n_layer) return G5_ERR_NOT_FOUND;
    glm5_role roles[MAX_LAYER_ROLES];
    int opt[MAX_LAYER_ROLES];
    size_t n = layer_roles(hp, (uint32_t)layer, roles, opt);
    for (size_t k = 0; k < n; k++)
        if (roles[k] == r) {
            fill_spec(hp, r, layer, opt[k], out);
            return G5_OK;
        }
    if (glm5_role_is_indexer(r) && !glm5_layer_has_indexer(hp, (uint32_t)layer)) {
        fill_spec(hp, r, layer, 1, out);
        out->unused = 1;
        return G5_OK;
    }
    return G5_ERR_NOT_FOUND;
}

/* ---- kv_b ---- */

static g5_status check_shape(const gguf_tensor *t, const glm5_hparams *hp, glm5_role r,
                             g5_error *err) {
    uint32_t nd;
    uint64_t ne[4];
    role_shape(hp, r, &nd, ne);
    for (int d = 0; d < 4; d++)
        if (t->ne[d] != ne[d])
            return g5_fail(err, G5_ERR_MODEL,
                           "tensor '%s': shape {%llu, %llu, %llu} differs from the expected "
                           "{%llu, %llu, %llu}",
                           t->name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                           (unsigned long long)t->ne[2], (unsigned long long)ne[0],
                           (unsigned long long)ne[1], (unsigned long long)ne[2]);
    return G5_OK;
}

g5_status glm5_rebuild_kv_b(const glm5_hparams *hp, const gguf_tensor *k_b,
                            const gguf_tensor *v_b, uint32_t h0, uint32_t h1, float *out,
                            float *scratch, g5_error *err) {
    g5_status st;
    if (h0 > h1 || h1 > hp->n_head)
        return g5_fail(err, G5_ERR_INVALID_ARG, "kv_b: head range [%u, %u) of %u", h0, h1, hp->n_head);
    if ((st = check_shape(k_b, hp, GLM5_ROLE_ATTN_K_B, err))) return st;
    if ((st = check_shape(v_b, hp, GLM5_ROLE_ATTN_V_B, err))) return st;
    const uint64_t nope = hp->qk_nope, vh = hp->v_head, L = hp->kv_lora;
    const uint64_t kb_head_bytes = k_b->nbytes / hp->n_head;
    const uint64_t vb_head_bytes = v_b->nbytes / hp->n_head;
    for (uint32_t h = h0; h < h1; h++) {
        float *dst = out + (uint64_t)(h - h0) * (nope + vh) * L; // [nope + vh, L]
        // attn_k_b head h: [L rows][nope] (ne = {nope, L}); W_UK[d][c] = k_b[c][d]
        if ((st = quant_dequantize(k_b->type, k_b->data + h * kb_head_bytes, nope * L, scratch)))
            return g5_fail(err, st, "tensor '%s': cannot dequantize head %u", k_b->name, h);
        for (uint64_t d = 0; d < nope; d++)
            for (uint64_t c = 0; c < L; c++) dst[d * L + c] = scratch[c * nope + d];
        // attn_v_b head h: [vh rows][L] (ne = {L, vh}) is already W_UV's layout
        if ((st = quant_dequantize(v_b->type, v_b->data + h * vb_head_bytes, vh * L, dst + nope * L)))
            return g5_fail(err, st, "tensor '%s': cannot dequantize head %u", v_b->name, h);
    }
    return G5_OK;
}

/* ---- what one decode token reads ---- */

const char *glm5_db_group_name(glm5_db_group g) {
    static const char *n[GLM5_DB_COUNT] = {"attention", "indexer", "dense FFN", "shared experts",
                                          "routed experts", "output head", "embedding row", "norms, router",
                                          "NextN block (per draft)"};
    return (unsigned)g < GLM5_DB_COUNT ? n[g] : "?";
}

static glm5_db_group db_group_of(glm5_role r) {
    switch (r) {
    case GLM5_ROLE_ATTN_Q_A: case GLM5_ROLE_ATTN_Q_B: case GLM5_ROLE_ATTN_KV_A: case GLM5_ROLE_ATTN_K_B:
    case GLM5_ROLE_ATTN_V_B: case GLM5_ROLE_ATTN_KV_B: case GLM5_ROLE_ATTN_OUT:
        return GLM5_DB_ATTN;
    case GLM5_ROLE_IDX_Q_B: case GLM5_ROLE_IDX_K: case GLM5_ROLE_IDX_PROJ:
        return GLM5_DB_INDEXER;
    case GLM5_ROLE_FFN_GATE: case GLM5_ROLE_FFN_UP: case GLM5_ROLE_FFN_DOWN:
        return GLM5_DB_DENSE_FFN;
    case GLM5_ROLE_SHEXP_GATE: case GLM5_ROLE_SHEXP_UP: case GLM5_ROLE_SHEXP_DOWN:
        return GLM5_DB_SHARED;
    case GLM5_ROLE_EXP_GATE: case GLM5_ROLE_EXP_UP: case GLM5_ROLE_EXP_DOWN:
        return GLM5_DB_ROUTED;
    case GLM5_ROLE_OUTPUT: return GLM5_DB_HEAD;
    case GLM5_ROLE_TOKEN_EMBD: return GLM5_DB_EMBED;
    default: return GLM5_DB_OTHER;
    }
}

/* Elements of a tensor (unused dimensions are 1; 0 read as 1). */
static double ref_elems(const glm5_tensor_ref *t) {
    double e = 1;
    for (int d = 0; d < 4; d++) e *= t->ne[d] ? (double)t->ne[d] : 1.0;
    return e;
}

void glm5_decode_bytes_of(const glm5_hparams *hp, const glm5_tensor_ref *t, uint64_t n, glm5_decode_bytes *out) {
    memset(out, 0, sizeof *out);
    /* layers that carry kv_b (the others, a GGUF's, have it rebuilt from attn_k_b/attn_v_b), and
     * the layers whose pair has the exact int8 form the GPU decode reads instead (bit 0: attn_k_b
     * of such a type, bit 1: attn_v_b) */
    uint8_t has_kv_b[GLM5_MAX_LAYERS] = {0}, i8[GLM5_MAX_LAYERS] = {0};
    for (uint64_t i = 0; i < n; i++) {
        int32_t l;
        const glm5_role r = glm5_classify(t[i].name, &l);
        if (l < 0 || (uint32_t)l >= hp->n_layer || l >= GLM5_MAX_LAYERS) continue;
        if (r == GLM5_ROLE_ATTN_KV_B) has_kv_b[l] = 1;
        if (r == GLM5_ROLE_ATTN_K_B && quant_exact_i8(t[i].type)) i8[l] |= 1;
        if (r == GLM5_ROLE_ATTN_V_B && quant_exact_i8(t[i].type)) i8[l] |= 2;
    }
    for (uint64_t i = 0; i < n; i++) {
        int32_t l;
        const glm5_role r = glm5_classify(t[i].name, &l);
        if (r == GLM5_ROLE_UNKNOWN || (l >= 0 && ((uint32_t)l >= hp->n_layer || l >= GLM5_MAX_LAYERS))) continue;
        if (l >= 0 && glm5_role_is_indexer(r) && !glm5_layer_has_indexer(hp, (uint32_t)l)) continue;
        double b = (double)t[i].nbytes;
        const int exact = l >= 0 && i8[l] == 3;
        if (r == GLM5_ROLE_ATTN_K_B || r == GLM5_ROLE_ATTN_V_B) {
            /* kv_b's elements one for one: in the exact int8 form (a byte, a float per 16), or,
             * without kv_b beside the pair (a GGUF), as the float32 kv_b rebuilt from it */
            if (exact) b = 1.25 * ref_elems(&t[i]);
            else if (l >= 0 && has_kv_b[l]) continue;
            else b = 4.0 * ref_elems(&t[i]);
        } else if (r == GLM5_ROLE_ATTN_KV_B) {
            if (exact) continue;        /* the pair's int8 form is read instead */
            b = 4.0 * ref_elems(&t[i]); /* float32 rows, whatever type the set stores */
        } else if (r == GLM5_ROLE_EXP_GATE || r == GLM5_ROLE_EXP_UP || r == GLM5_ROLE_EXP_DOWN) {
            b *= (double)hp->n_expert_used / (double)hp->n_expert;
        } else if (r == GLM5_ROLE_TOKEN_EMBD || r == GLM5_ROLE_NEXTN_EMBED) {
            b /= t[i].ne[1] ? (double)t[i].ne[1] : 1.0;
        }
        const int nextn = l >= 0 && (uint32_t)l >= hp->n_layer_main;
        out->group[nextn ? GLM5_DB_NEXTN : db_group_of(r)] += b;
    }
    for (int g = 0; g < GLM5_DB_COUNT; g++)
        if (g != GLM5_DB_NEXTN) out->total += out->group[g];
}
