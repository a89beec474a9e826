/* One model validation for the converter, the auditor and the runtime (glm5.h): what one of them
 * refuses, all refuse, so `convert` never writes a set that `glm5-run` cannot run. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "glm5.h"
#include "quant.h"

static int str_is(const char *s, uint64_t len, const char *lit) {
    return len == strlen(lit) && memcmp(s, lit, len) == 0;
}

/* A string key holding one of the accepted values (the tokenizer's, runtime/text/tokenizer.c). */
static g5_status str_one_of(const gguf_ctx *ctx, const char *key, const char *const *ok, int n_ok, g5_error *err) {
    const char *s;
    uint64_t len;
    g5_status st = gguf_get_str(ctx, key, &s, &len, err);
    if (st == G5_ERR_NOT_FOUND) return g5_fail(err, G5_ERR_MODEL, "tokenizer: metadata key '%s' is missing", key);
    if (st) return st;
    for (int i = 0; i < n_ok; i++)
        if (str_is(s, len, ok[i])) return G5_OK;
    return g5_fail(err, G5_ERR_UNSUPPORTED, "tokenizer: %s is '%.*s', not supported (%s%s%s)", key,
                   (int)(len > 64 ? 64 : len), s, ok[0], n_ok > 1 ? ", " : "", n_ok > 1 ? ok[1] : "");
}

/* A string array key: present, of strings; its length. */
static g5_status str_array(const gguf_ctx *ctx, const char *key, uint64_t *n, g5_error *err) {
    gguf_vtype et;
    g5_status st = gguf_get_arr(ctx, key, &et, n, err);
    if (st == G5_ERR_NOT_FOUND) return g5_fail(err, G5_ERR_MODEL, "tokenizer: metadata key '%s' is missing", key);
    if (st == G5_ERR_WRONG_TYPE) return g5_fail(err, G5_ERR_MODEL, "tokenizer: %s is not an array", key);
    if (st) return st;
    if (et != GGUF_VT_STRING)
        return g5_fail(err, G5_ERR_MODEL, "tokenizer: %s holds %s, not strings", key, gguf_vtype_name(et));
    return G5_OK;
}

g5_status glm5_tokenizer_check(const gguf_ctx *ctx, uint32_t n_vocab, g5_error *err) {
    static const char *const models[] = {"gpt2"}, *const pres[] = {"glm4", "chatglm-bpe"};
    g5_status st;
    if ((st = str_one_of(ctx, "tokenizer.ggml.model", models, 1, err))) return st;
    if ((st = str_one_of(ctx, "tokenizer.ggml.pre", pres, 2, err))) return st;
    uint64_t n, n_merges;
    if ((st = str_array(ctx, "tokenizer.ggml.tokens", &n, err))) return st;
    /* The vocabulary rows must have a token each way: an id the model can produce needs text, and
     * a token the tokenizer can produce needs a row. GLM's byte-level BPE needs its 256 byte
     * symbols, so fewer tokens than that cannot encode arbitrary text. */
    if (n < 256 || n != n_vocab)
        return g5_fail(err, G5_ERR_MODEL, "tokenizer: tokenizer.ggml.tokens has %llu entries; the model's vocabulary "
                       "is %u (must be equal, and at least 256)", (unsigned long long)n, n_vocab);
    for (uint64_t i = 0; i < n; i++) {
        const char *s;
        uint64_t len;
        if ((st = gguf_get_arr_str(ctx, "tokenizer.ggml.tokens", i, &s, &len, err))) return st;
    }
    if ((st = str_array(ctx, "tokenizer.ggml.merges", &n_merges, err))) return st;
    for (uint64_t r = 0; r < n_merges; r++) {
        const char *s;
        uint64_t len, sp = 1;
        if ((st = gguf_get_arr_str(ctx, "tokenizer.ggml.merges", r, &s, &len, err))) return st;
        while (sp < len && s[sp] != ' ') sp++;
        if (sp + 1 >= len)
            return g5_fail(err, G5_ERR_MODEL, "tokenizer: tokenizer.ggml.merges[%llu] = '%.*s' is not 'LEFT RIGHT'",
                           (unsigned long long)r, (int)(len > 64 ? 64 : len), s);
    }
    gguf_vtype et;
    uint64_t nt;
    st = gguf_get_arr(ctx, "tokenizer.ggml.token_type", &et, &nt, err);
    if (st == G5_OK) {
        if ((et != GGUF_VT_INT32 && et != GGUF_VT_UINT32) || nt != n)
            return g5_fail(err, G5_ERR_MODEL, "tokenizer: tokenizer.ggml.token_type is %llu x %s, expected %llu x i32",
                           (unsigned long long)nt, gguf_vtype_name(et), (unsigned long long)n);
        const void *data;
        if ((st = gguf_get_arr_data(ctx, "tokenizer.ggml.token_type", &data, err))) return st;
        for (uint64_t i = 0; i < n; i++) {
            int32_t t = (int32_t)g5_rd_u32((const uint8_t *)data + 4 * i);
            if (t < 0 || t > 6) /* llama.cpp's token types: undefined .. byte */
                return g5_fail(err, G5_ERR_MODEL, "tokenizer: tokenizer.ggml.token_type[%llu] = %d (must be 0..6)",
                               (unsigned long long)i, (int)t);
        }
    } else if (st != G5_ERR_NOT_FOUND) {
        return st;
    }
    g5_error_clear(err);
    static const char *const ids[] = {"bos", "eos", "eot", "eom", "unknown", "padding"};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        char key[64];
        snprintf(key, sizeof key, "tokenizer.ggml.%s_token_id", ids[i]);
        if (gguf_find_key(ctx, key) < 0) continue;
        int64_t v;
        if ((st = gguf_get_int(ctx, key, &v, err)))
            return st == G5_ERR_WRONG_TYPE ? g5_fail(err, G5_ERR_MODEL, "tokenizer: %s is not an integer", key) : st;
        if (v < 0 || (uint64_t)v >= n)
            return g5_fail(err, G5_ERR_MODEL, "tokenizer: %s = %lld is outside the vocabulary (0..%llu)", key,
                           (long long)v, (unsigned long long)n - 1);
    }
    return G5_OK;
}

static void fmt_shape(const uint64_t ne[4], char *buf, size_t cap) {
    snprintf(buf, cap, "[%llu, %llu, %llu, %llu]", (unsigned long long)ne[0], (unsigned long long)ne[1],
             (unsigned long long)ne[2], (unsigned long long)ne[3]);
}

g5_status glm5_tensor_check(const glm5_hparams *hp, const char *name, uint32_t type, const uint64_t ne[4],
                            const void *data, uint64_t nbytes, g5_error *err) {
    glm5_tensor_spec spec;
    if (glm5_spec_for(hp, name, &spec) != G5_OK)
        return g5_fail(err, G5_ERR_MODEL, "tensor '%s' is not part of a glm-dsa model with these hyperparameters", name);
    if (memcmp(spec.ne, ne, sizeof spec.ne) != 0) {
        char a[112], b[112];
        fmt_shape(ne, a, sizeof a);
        fmt_shape(spec.ne, b, sizeof b);
        return g5_fail(err, G5_ERR_MODEL, "tensor '%s': shape %s, expected %s", name, a, b);
    }
    g5_status st = quant_check_supported(type, err);
    if (st) {
        g5_error_prefix(err, "tensor '%s'", name);
        return st;
    }
    /* Norm weights and biases are small and feed every position: a NaN or Inf there poisons every
     * logit, so they are read here (large matrices are the checksums' business). */
    if (data && spec.n_dims == 1) {
        const uint64_t n = ne[0];
        uint64_t need;
        if (quant_row_bytes(type, n, &need) || need > nbytes)
            return g5_fail(err, G5_ERR_SIZE, "tensor '%s': %llu bytes for %llu %s elements", name,
                           (unsigned long long)nbytes, (unsigned long long)n, quant_type_name(type));
        float *f = malloc((n ? n : 1) * sizeof *f);
        if (!f) return g5_fail(err, G5_ERR_NOMEM, "tensor '%s'", name);
        if ((st = quant_dequantize(type, data, n, f))) {
            free(f);
            return g5_fail(err, st, "tensor '%s': cannot dequantize %s", name, quant_type_name(type));
        }
        for (uint64_t i = 0; i < n; i++)
            if (!isfinite(f[i])) {
                double v = f[i];
                free(f);
                return g5_fail(err, G5_ERR_MODEL, "tensor '%s': element %llu is %g (norm weights and biases must be finite)",
                               name, (unsigned long long)i, v);
            }
        free(f);
    }
    return G5_OK;
}

g5_status glm5_meta_validate(const gguf_ctx *meta, glm5_hparams *hp, g5_error *err) {
    g5_status st = glm5_hparams_read(meta, hp, err);
    if (!st) st = glm5_tokenizer_check(meta, hp->n_vocab, err);
    return st;
}

g5_status glm5_model_validate(const gguf_ctx *ctx, glm5_hparams *hp, g5_error *err) {
    g5_status st = glm5_meta_validate(ctx, hp, err);
    if (st) return st;
    const int64_t nt = gguf_get_n_tensors(ctx);
    uint8_t *kvb = calloc(hp->n_layer, 1); /* bit 0: attn_kv_b, 1: attn_k_b, 2: attn_v_b */
    if (!kvb) return g5_fail(err, G5_ERR_NOMEM, "validation");
    for (int64_t i = 0; i < nt && !st; i++) {
        const gguf_tensor *t = gguf_get_tensor(ctx, i);
        st = glm5_tensor_check(hp, t->name, t->type, t->ne, t->data, t->nbytes, err);
        int32_t layer;
        glm5_role r = glm5_classify(t->name, &layer);
        if (!st && layer >= 0 && (uint32_t)layer < hp->n_layer)
            kvb[layer] |= r == GLM5_ROLE_ATTN_KV_B ? 1 : r == GLM5_ROLE_ATTN_K_B ? 2 : r == GLM5_ROLE_ATTN_V_B ? 4 : 0;
    }
    for (uint64_t i = 0, n = glm5_n_expected(hp); i < n && !st; i++) {
        glm5_tensor_spec spec;
        if (glm5_expected_tensor(hp, i, &spec) || spec.optional) continue;
        const int l = spec.layer;
        if (spec.role == GLM5_ROLE_ATTN_K_B || spec.role == GLM5_ROLE_ATTN_V_B) {
            if (kvb[l] & 1) {
                if (kvb[l] & 6) st = g5_fail(err, G5_ERR_MODEL, "layer %d holds attn_kv_b and attn_k_b/attn_v_b; ambiguous", l);
                continue;
            }
        }
        if (!gguf_find_tensor(ctx, spec.name))
            st = g5_fail(err, G5_ERR_MODEL, "tensor '%s' is missing from the model", spec.name);
    }
    free(kvb);
    return st;
}
