#include "synth.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/gguf_write.h"
#include "format/quant.h"

/* ---- presets ---- */

typedef struct preset_dims {
    const char *name;
    uint32_t n_embd, n_head, q_lora, kv_lora, qk_nope, qk_rope, v_head;
    uint32_t n_vocab, n_ctx, n_ff, n_ff_exp;
    uint32_t n_expert, n_expert_used, n_expert_shared, n_group, topk_group;
    uint32_t n_dense, n_main;
    uint32_t idx_n_head, idx_head_dim, idx_top_k;
    float rope_theta, rms_eps, expert_scale;
    uint32_t specials_base;  /* id of <|endoftext|>; the GLM specials follow it */
    int gating_func_key;     /* write expert_gating_func (the published GLM-5 GGUFs carry it;
                              * the oracle does not) */
} preset_dims;

/* The oracle's config.json (../shared/oracle/glm5-tiny). */
static const preset_dims k_tiny = {
    "tiny", 512, 4, 512, 512, 192, 64, 256,
    2048, 4096, 1024, 512,
    8, 2, 1, 1, 1,
    1, 3,
    16, 128, 32,
    1e6f, 1e-5f, 2.5f,
    2023, 0,
};

/* GLM-5 (zai-org/GLM-5 config.json: hidden 6144, 78 layers with first_k_dense_replace 3, 64
 * heads, q_lora 2048, kv_lora 512, qk_nope 192, qk_rope 64, v_head 256, intermediate 12288,
 * moe_intermediate 2048, 256 routed experts, 8 per token, 1 shared, n_group 1, topk_group 1,
 * index_n_heads 32, index_head_dim 128, index_topk 2048, routed_scaling_factor 2.5, rope theta
 * 1e6, max_position_embeddings 202752, vocab 154880, eos ids 154820/154827/154829). */
static const preset_dims k_glm5 = {
    "glm5", 6144, 64, 2048, 512, 192, 64, 256,
    154880, 202752, 12288, 2048,
    256, 8, 1, 1, 1,
    3, 78,
    32, 128, 2048,
    1e6f, 1e-5f, 2.5f,
    154820, 1,
};

/* GLM's special tokens, in the order of their ids (the oracle's tokenizer and GLM-5's). */
static const char *const k_specials[] = {
    "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>",
    "<|user|>", "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>",
    "<|begin_of_video|>", "<|end_of_video|>", "<think>", "</think>", "<tool_call>",
    "</tool_call>", "<tool_response>", "</tool_response>", "<arg_key>", "</arg_key>",
    "<arg_value>", "</arg_value>", "/nothink",
};
#define N_SPECIALS (sizeof k_specials / sizeof k_specials[0])
enum { SP_EOS = 0, SP_BOS = 2, SP_EOT = 7, SP_EOM = 9 }; /* offsets into k_specials */

void synth_opts_init(synth_opts *o) {
    memset(o, 0, sizeof *o);
    o->preset = SYNTH_PRESET_TINY;
    o->n_layers = -1;
    o->n_experts = -1;
    o->seed = 1;
}

g5_status synth_preset_from_name(const char *name, synth_preset *out, g5_error *err) {
    if (name && strcmp(name, "tiny") == 0) *out = SYNTH_PRESET_TINY;
    else if (name && strcmp(name, "glm5") == 0) *out = SYNTH_PRESET_GLM5;
    else return g5_fail(err, G5_ERR_INVALID_ARG, "unknown preset '%s' (tiny, glm5)",
                        name ? name : "(null)");
    return G5_OK;
}

/* The preset's dimensions after the options. */
static g5_status resolve_dims(const synth_opts *o, preset_dims *d, g5_error *err) {
    if (o->preset == SYNTH_PRESET_TINY) *d = k_tiny;
    else if (o->preset == SYNTH_PRESET_GLM5) *d = k_glm5;
    else return g5_fail(err, G5_ERR_INVALID_ARG, "synth: unknown preset %d", (int)o->preset);
    if (o->tp_friendly && o->preset == SYNTH_PRESET_TINY) {
        /* 8 heads: attn_output ne[0] = 8*256 = 2048; dense and expert widths 2048: every
         * ne[0] split at T = 8 is 256 wide, a whole k-quant block. */
        d->n_head = 8;
        d->n_ff = 2048;
        d->n_ff_exp = 2048;
    }
    if (o->n_layers >= 0) {
        if (o->n_layers < 1 || o->n_layers > GLM5_MAX_LAYERS - 1)
            return g5_fail(err, G5_ERR_INVALID_ARG, "synth: --layers %lld (must be 1..%d)",
                           (long long)o->n_layers, GLM5_MAX_LAYERS - 1);
        d->n_main = (uint32_t)o->n_layers;
    }
    if (o->n_experts >= 0) {
        if (o->n_experts < 1 || o->n_experts > 65536)
            return g5_fail(err, G5_ERR_INVALID_ARG, "synth: --experts %lld (must be 1..65536)",
                           (long long)o->n_experts);
        d->n_expert = (uint32_t)o->n_experts;
        if (d->n_expert_used > d->n_expert) d->n_expert_used = d->n_expert;
    }
    if (o->tp_friendly && d->n_expert % 8)
        return g5_fail(err, G5_ERR_INVALID_ARG,
                       "synth: --tp-friendly needs a multiple of 8 experts, got %u", d->n_expert);
    /* At least one MoE main layer whenever there are two or more main layers; with one main
     * layer it is MoE too (experts dominate GLM-5, so that is the representative case). */
    uint32_t max_dense = d->n_main > 1 ? d->n_main - 1 : 0;
    if (d->n_dense > max_dense) d->n_dense = max_dense;
    return G5_OK;
}

g5_status synth_hparams(const synth_opts *o, glm5_hparams *hp, g5_error *err) {
    preset_dims d;
    g5_status st = resolve_dims(o, &d, err);
    if (st) return st;
    memset(hp, 0, sizeof *hp);
    hp->n_nextn = 1;
    hp->n_layer_main = d.n_main;
    hp->n_layer = d.n_main + 1;
    hp->n_embd = d.n_embd;
    hp->n_vocab = d.n_vocab;
    hp->n_ctx_train = d.n_ctx;
    hp->n_ff = d.n_ff;
    hp->n_ff_exp = d.n_ff_exp;
    hp->n_head = d.n_head;
    hp->n_head_kv = 1;
    hp->q_lora = d.q_lora;
    hp->kv_lora = d.kv_lora;
    hp->qk_nope = d.qk_nope;
    hp->qk_rope = d.qk_rope;
    hp->v_head = d.v_head;
    hp->n_expert = d.n_expert;
    hp->n_expert_used = d.n_expert_used;
    hp->n_expert_shared = d.n_expert_shared;
    hp->n_group = d.n_group;
    hp->topk_group = d.topk_group;
    hp->n_leading_dense = d.n_dense;
    hp->expert_weights_scale = d.expert_scale;
    hp->expert_weights_norm = 1;
    hp->expert_gating_func = 2;
    hp->rope_theta = d.rope_theta;
    hp->rms_eps = d.rms_eps;
    hp->idx_n_head = d.idx_n_head;
    hp->idx_head_dim = d.idx_head_dim;
    hp->idx_top_k = d.idx_top_k;
    hp->rope_scale_factor = 1.0f;
    hp->idx_source = GLM5_IDX_SRC_KEY; /* the file states the schedule (all full) */
    memset(hp->idx_full, 1, sizeof hp->idx_full);
    return G5_OK;
}

uint32_t synth_role_type(glm5_role r) {
    switch (r) {
    case GLM5_ROLE_TOKEN_EMBD: case GLM5_ROLE_OUTPUT: case GLM5_ROLE_ATTN_Q_A:
    case GLM5_ROLE_ATTN_V_B: case GLM5_ROLE_NEXTN_EMBED: case GLM5_ROLE_NEXTN_HEAD:
        return QT_Q6_K;
    case GLM5_ROLE_ATTN_Q_B: case GLM5_ROLE_ATTN_OUT: case GLM5_ROLE_IDX_Q_B:
    case GLM5_ROLE_EXP_DOWN:
        return QT_Q5_K;
    case GLM5_ROLE_ATTN_KV_A: case GLM5_ROLE_SHEXP_GATE: case GLM5_ROLE_SHEXP_UP:
    case GLM5_ROLE_SHEXP_DOWN:
        return QT_Q8_0;
    /* attn_k_b rows are qk_nope = 192 long: no 256-element k-quant block fits */
    case GLM5_ROLE_ATTN_K_B: return QT_Q5_0;
    case GLM5_ROLE_ATTN_KV_B: return QT_F32;
    case GLM5_ROLE_IDX_K: case GLM5_ROLE_IDX_PROJ: return QT_BF16;
    case GLM5_ROLE_FFN_GATE: case GLM5_ROLE_FFN_UP: case GLM5_ROLE_FFN_DOWN:
    case GLM5_ROLE_EXP_GATE: case GLM5_ROLE_EXP_UP: case GLM5_ROLE_NEXTN_EH_PROJ:
        return QT_Q4_K;
    default:
        return QT_F32; /* norms, router, biases */
    }
}

/* ---- randomness: splitmix64, seeded per tensor from the seed and the tensor's name ---- */

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t tensor_seed(uint64_t seed, const char *name) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (const char *p = name; *p; p++) h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
    uint64_t s = seed ^ h;
    return splitmix64(&s);
}

static float rng_unit(uint64_t *s) { /* [-1, 1) */
    return (float)((int64_t)(splitmix64(s) >> 11) - (int64_t)(1ull << 52)) / (float)(1ull << 52);
}

/* ---- tokenizer: byte-level BPE in the GPT-2 alphabet ---- */

typedef struct strtab {
    char *buf;
    uint64_t used, cap;
    uint64_t *off, *len;
    uint64_t n, ncap;
} strtab;

static void strtab_free(strtab *t) {
    free(t->buf);
    free(t->off);
    free(t->len);
    memset(t, 0, sizeof *t);
}

static int strtab_add(strtab *t, const char *s, uint64_t len) {
    if (t->used + len + 1 > t->cap) {
        uint64_t c = t->cap ? t->cap * 2 : 4096;
        while (c < t->used + len + 1) c *= 2;
        char *b = realloc(t->buf, c);
        if (!b) return -1;
        t->buf = b;
        t->cap = c;
    }
    if (t->n == t->ncap) {
        uint64_t c = t->ncap ? t->ncap * 2 : 1024;
        uint64_t *o = realloc(t->off, c * sizeof *o);
        if (!o) return -1;
        t->off = o;
        uint64_t *l = realloc(t->len, c * sizeof *l);
        if (!l) return -1;
        t->len = l;
        t->ncap = c;
    }
    memcpy(t->buf + t->used, s, len);
    t->buf[t->used + len] = 0;
    t->off[t->n] = t->used;
    t->len[t->n] = len;
    t->used += len + 1;
    t->n++;
    return 0;
}

static const char *strtab_get(const strtab *t, uint64_t i) { return t->buf + t->off[i]; }

/* GPT-2's bytes_to_unicode: printable bytes map to themselves, the other 68 to U+0100.. in
 * byte order. Returns the UTF-8 length written to out (2..3 bytes max here). */
static int byte_char(int id, char *out) {
    /* ids 0..187: '!'..'~', U+00A1..U+00AC, U+00AE..U+00FF; ids 188..255: U+0100 + k */
    unsigned cp;
    if (id < 94) cp = 0x21 + (unsigned)id;
    else if (id < 94 + 12) cp = 0xA1 + (unsigned)(id - 94);
    else if (id < 188) cp = 0xAE + (unsigned)(id - 106);
    else cp = 0x100 + (unsigned)(id - 188);
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* Words whose prefixes (with the 'Ġ' word-start marker) become the first merges, so short
 * English text tokenizes into plausible pieces. */
static const char *const k_words[] = {
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "with", "as", "on", "was",
    "be", "at", "by", "this", "are", "from", "or", "have", "an", "they", "which", "one",
    "you", "were", "all", "we", "can", "there", "their", "has", "more", "when", "will",
    "would", "what", "about", "model", "tensor", "layer", "expert", "attention", "token",
    "return", "int", "float", "void", "const", "struct", "include", "def", "self", "import",
    "print", "hello", "world", "function", "value", "data", "file", "error", "test",
};

#define GCH "\xC4\xA0" /* 'Ġ' (U+0120), GPT-2's encoding of the space byte */

typedef struct tokenizer {
    strtab tokens, merges;
    int32_t *types;
    uint32_t n_vocab;
} tokenizer;

static void tokenizer_free(tokenizer *t) {
    strtab_free(&t->tokens);
    strtab_free(&t->merges);
    free(t->types);
}

static int tok_find_recent(const strtab *t, uint64_t from, const char *s, uint64_t len) {
    for (uint64_t i = from; i < t->n; i++)
        if (t->len[i] == len && memcmp(strtab_get(t, i), s, len) == 0) return 1;
    return 0;
}

/* Adds token a+b (a and b already tokens) and its merge "a b". */
static int add_merge(tokenizer *t, const char *a, uint64_t la, const char *b, uint64_t lb) {
    char buf[256];
    if (la + lb + 1 >= sizeof buf) return -1;
    memcpy(buf, a, la);
    memcpy(buf + la, b, lb);
    if (strtab_add(&t->tokens, buf, la + lb)) return -1;
    memcpy(buf, a, la);
    buf[la] = ' ';
    memcpy(buf + la + 1, b, lb);
    return strtab_add(&t->merges, buf, la + lb + 1);
}

static g5_status tokenizer_build(const preset_dims *d, tokenizer *t, g5_error *err) {
    memset(t, 0, sizeof *t);
    t->n_vocab = d->n_vocab;
    if (d->specials_base < 256 || d->specials_base + N_SPECIALS > d->n_vocab)
        return g5_fail(err, G5_ERR_INTERNAL, "synth: special tokens do not fit the vocabulary");
    const uint64_t n_merged = d->specials_base - 256;
    char c[4];
    for (int i = 0; i < 256; i++)
        if (strtab_add(&t->tokens, c, (uint64_t)byte_char(i, c))) goto nomem;

    /* 'Ġ'-prefixed word pieces: "Ġ t" -> "Ġt", "Ġt h" -> "Ġth", ... */
    const uint64_t words_from = t->tokens.n;
    for (size_t w = 0; w < sizeof k_words / sizeof k_words[0]; w++) {
        char cur[128] = GCH;
        uint64_t lc = 2;
        for (const char *p = k_words[w]; *p && t->tokens.n - 256 < n_merged; p++) {
            char nb[128];
            memcpy(nb, cur, lc);
            nb[lc] = *p;
            if (!tok_find_recent(&t->tokens, words_from, nb, lc + 1) &&
                add_merge(t, cur, lc, p, 1))
                goto nomem;
            cur[lc++] = *p;
        }
    }
    /* Then every string over a..z in shortlex order from length 2: each one's prefix is a
     * token already, so "prefix last" is a valid merge, and none collides with the above. */
    for (uint32_t len = 2; t->tokens.n - 256 < n_merged && len < 8; len++) {
        uint32_t idx[8] = {0};
        for (;;) {
            if (t->tokens.n - 256 >= n_merged) break;
            char s[8];
            for (uint32_t k = 0; k < len; k++) s[k] = (char)('a' + idx[k]);
            if (add_merge(t, s, len - 1, s + len - 1, 1)) goto nomem;
            int k = (int)len - 1;
            while (k >= 0 && ++idx[k] == 26) idx[k--] = 0;
            if (k < 0) break;
        }
    }
    if (t->tokens.n != d->specials_base)
        return g5_fail(err, G5_ERR_INTERNAL, "synth: tokenizer has %llu tokens before specials",
                       (unsigned long long)t->tokens.n);
    for (size_t i = 0; i < N_SPECIALS; i++)
        if (strtab_add(&t->tokens, k_specials[i], strlen(k_specials[i]))) goto nomem;
    /* Unused ids up to the embedding size, named as llama.cpp's converter names them. */
    while (t->tokens.n < d->n_vocab) {
        char pad[32];
        int n = snprintf(pad, sizeof pad, "[PAD%llu]", (unsigned long long)t->tokens.n);
        if (strtab_add(&t->tokens, pad, (uint64_t)n)) goto nomem;
    }
    t->types = malloc((size_t)d->n_vocab * sizeof *t->types);
    if (!t->types) goto nomem;
    for (uint32_t i = 0; i < d->n_vocab; i++)
        t->types[i] = i < d->specials_base ? 1                        /* normal */
                      : i < d->specials_base + N_SPECIALS ? 3         /* control */
                                                          : 5;        /* unused */
    return G5_OK;
nomem:
    tokenizer_free(t);
    return g5_fail(err, G5_ERR_NOMEM, "synth: out of memory building the tokenizer");
}

/* ---- metadata ---- */

static g5_status set_strtab(gguf_writer *w, const char *key, const strtab *t) {
    const char **ptrs = malloc((size_t)(t->n ? t->n : 1) * sizeof *ptrs);
    if (!ptrs) return G5_ERR_NOMEM;
    for (uint64_t i = 0; i < t->n; i++) ptrs[i] = strtab_get(t, i);
    g5_status st = gguf_writer_set_arr_str(w, key, ptrs, t->len, t->n);
    free(ptrs);
    return st;
}

static void size_label(const glm5_hparams *hp, uint64_t total_params, char *out, size_t cap) {
    double per = (double)total_params / hp->n_expert;
    if (per >= 1e9) snprintf(out, cap, "%ux%.1fB", hp->n_expert, per / 1e9);
    else snprintf(out, cap, "%ux%.0fM", hp->n_expert, per / 1e6);
}

#define KV(call)                                  \
    do {                                          \
        if ((st = (call)) != G5_OK) goto kv_fail; \
    } while (0)
#define A(k) GLM5_ARCH "." k

/* The oracle GGUF's keys, in its order (plus expert_gating_func for the glm5 preset). */
static g5_status add_metadata(gguf_writer *w, const preset_dims *d, const glm5_hparams *hp,
                              const tokenizer *tok, uint64_t total_params, g5_error *err) {
    g5_status st;
    char name[64], label[64];
    snprintf(name, sizeof name, "GLM-5 synthetic (%s)", d->name);
    size_label(hp, total_params, label, sizeof label);
    KV(gguf_writer_set_str(w, "general.architecture", GLM5_ARCH, strlen(GLM5_ARCH)));
    KV(gguf_writer_set_str(w, "general.type", "model", 5));
    KV(gguf_writer_set_str(w, "general.name", name, strlen(name)));
    KV(gguf_writer_set_str(w, "general.size_label", label, strlen(label)));
    KV(gguf_writer_set_u32(w, A("block_count"), hp->n_layer));
    KV(gguf_writer_set_u32(w, A("context_length"), hp->n_ctx_train));
    KV(gguf_writer_set_u32(w, A("embedding_length"), hp->n_embd));
    KV(gguf_writer_set_u32(w, A("feed_forward_length"), hp->n_ff));
    KV(gguf_writer_set_u32(w, A("attention.head_count"), hp->n_head));
    KV(gguf_writer_set_u32(w, A("attention.head_count_kv"), hp->n_head_kv));
    KV(gguf_writer_set_f32(w, A("rope.freq_base"), hp->rope_theta));
    KV(gguf_writer_set_f32(w, A("attention.layer_norm_rms_epsilon"), hp->rms_eps));
    KV(gguf_writer_set_u32(w, A("expert_count"), hp->n_expert));
    KV(gguf_writer_set_u32(w, A("expert_used_count"), hp->n_expert_used));
    KV(gguf_writer_set_u32(w, A("expert_group_count"), hp->n_group));
    KV(gguf_writer_set_u32(w, A("expert_group_used_count"), hp->topk_group));
    /* MLA as llama.cpp stores it: one latent "kv head" of kv_lora + rope dims */
    KV(gguf_writer_set_u32(w, A("attention.key_length"), hp->kv_lora + hp->qk_rope));
    KV(gguf_writer_set_u32(w, A("attention.value_length"), hp->kv_lora));
    KV(gguf_writer_set_u32(w, A("leading_dense_block_count"), hp->n_leading_dense));
    KV(gguf_writer_set_u32(w, A("vocab_size"), hp->n_vocab));
    KV(gguf_writer_set_u32(w, A("attention.q_lora_rank"), hp->q_lora));
    KV(gguf_writer_set_u32(w, A("attention.kv_lora_rank"), hp->kv_lora));
    KV(gguf_writer_set_u32(w, A("attention.key_length_mla"), hp->qk_nope + hp->qk_rope));
    KV(gguf_writer_set_u32(w, A("attention.value_length_mla"), hp->v_head));
    KV(gguf_writer_set_u32(w, A("expert_feed_forward_length"), hp->n_ff_exp));
    KV(gguf_writer_set_u32(w, A("expert_shared_count"), hp->n_expert_shared));
    KV(gguf_writer_set_f32(w, A("expert_weights_scale"), hp->expert_weights_scale));
    KV(gguf_writer_set_bool(w, A("expert_weights_norm"), 1));
    if (d->gating_func_key) KV(gguf_writer_set_u32(w, A("expert_gating_func"), 2));
    KV(gguf_writer_set_u32(w, A("rope.dimension_count"), hp->qk_rope));
    KV(gguf_writer_set_u32(w, A("nextn_predict_layers"), hp->n_nextn));
    KV(gguf_writer_set_u32(w, A("attention.indexer.head_count"), hp->idx_n_head));
    KV(gguf_writer_set_u32(w, A("attention.indexer.key_length"), hp->idx_head_dim));
    KV(gguf_writer_set_u32(w, A("attention.indexer.top_k"), hp->idx_top_k));
    {
        uint8_t types[GLM5_MAX_LAYERS];
        memset(types, 1, sizeof types); /* every layer runs its own indexer ("full") */
        KV(gguf_writer_set_arr(w, A("attention.indexer.types"), GGUF_VT_BOOL, types,
                               hp->n_layer_main));
    }
    KV(gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2", 4));
    KV(gguf_writer_set_str(w, "tokenizer.ggml.pre", "glm4", 4));
    KV(set_strtab(w, "tokenizer.ggml.tokens", &tok->tokens));
    KV(gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, tok->types,
                           tok->n_vocab));
    KV(set_strtab(w, "tokenizer.ggml.merges", &tok->merges));
    KV(gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", d->specials_base + SP_EOS));
    KV(gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", d->specials_base + SP_EOS));
    KV(gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", d->specials_base + SP_BOS));
    KV(gguf_writer_set_u32(w, "tokenizer.ggml.eot_token_id", d->specials_base + SP_EOT));
    KV(gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", d->specials_base + SP_EOS));
    KV(gguf_writer_set_u32(w, "tokenizer.ggml.eom_token_id", d->specials_base + SP_EOM));
    KV(gguf_writer_set_u32(w, "general.quantization_version", 2));
    KV(gguf_writer_set_u32(w, "general.file_type", 15)); /* LLAMA_FTYPE_MOSTLY_Q4_K_M */
    return G5_OK;
kv_fail:
    return g5_fail(err, st, "synth: cannot set metadata: %s", g5_strerror(st));
}

/* ---- tensors ---- */

/* The oracle's order: the three globals by name, then layer by layer, each layer's tensors by
 * name. */
static int cmp_tensor(const void *pa, const void *pb) {
    const synth_tensor_info *a = pa, *b = pb;
    if (a->layer != b->layer) return a->layer < b->layer ? -1 : 1;
    return strcmp(a->name, b->name);
}

static uint64_t pad_to(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

void synth_plan_free(synth_plan *p) {
    if (!p) return;
    free(p->tensors);
    free(p);
}

static g5_status plan_build(const synth_opts *o, synth_plan **out, g5_error *err) {
    synth_plan *p = calloc(1, sizeof *p);
    if (!p) return g5_fail(err, G5_ERR_NOMEM, "synth: out of memory");
    g5_status st = synth_hparams(o, &p->hp, err);
    if (st) {
        synth_plan_free(p);
        return st;
    }
    const uint64_t n_exp = glm5_n_expected(&p->hp);
    p->tensors = calloc((size_t)n_exp, sizeof *p->tensors);
    if (!p->tensors) {
        synth_plan_free(p);
        return g5_fail(err, G5_ERR_NOMEM, "synth: out of memory");
    }
    for (uint64_t i = 0; i < n_exp; i++) {
        glm5_tensor_spec s;
        if ((st = glm5_expected_tensor(&p->hp, i, &s))) {
            synth_plan_free(p);
            return g5_fail(err, st, "synth: expected tensor %llu", (unsigned long long)i);
        }
        if (s.optional) continue; /* the published GGUFs carry neither kv_b nor nextn heads */
        synth_tensor_info *t = &p->tensors[p->n_tensors];
        snprintf(t->name, sizeof t->name, "%s", s.name);
        t->role = s.role;
        t->layer = s.layer;
        t->type = synth_opts_role_type(o, s.role);
        t->n_dims = s.n_dims;
        memcpy(t->ne, s.ne, sizeof t->ne);
        uint64_t rows = s.ne[1] * s.ne[2] * s.ne[3], row_bytes;
        if ((st = quant_row_bytes(t->type, s.ne[0], &row_bytes)) ||
            g5_mul_u64(row_bytes, rows, &t->nbytes)) {
            const quant_type_info *qi = quant_type_get(t->type);
            st = st == G5_ERR_ALIGN
                     ? g5_fail(err, st, "synth: tensor '%s': ne[0] = %llu is not a multiple of %s's "
                               "%u-element block", s.name, (unsigned long long)s.ne[0],
                               quant_type_name(t->type), qi ? qi->block_elems : 0)
                     : g5_fail(err, st ? st : G5_ERR_OVERFLOW, "synth: tensor '%s': %s row of %llu",
                               s.name, quant_type_name(t->type), (unsigned long long)s.ne[0]);
            synth_plan_free(p);
            return st;
        }
        p->data_bytes += t->nbytes;
        p->n_params += s.ne[0] * rows;
        p->n_tensors++;
    }
    qsort(p->tensors, (size_t)p->n_tensors, sizeof *p->tensors, cmp_tensor);

    /* Splits: tensors in order, a new split when the next tensor would pass split_size. */
    p->n_splits = 1;
    if (o->split_size) {
        uint64_t cur = 0, in_split = 0;
        for (uint64_t i = 0; i < p->n_tensors; i++) {
            uint64_t b = pad_to(p->tensors[i].nbytes, GGUF_DEFAULT_ALIGNMENT);
            if (in_split && cur + b > o->split_size) {
                p->n_splits++;
                cur = 0;
                in_split = 0;
            }
            p->tensors[i].split = p->n_splits - 1;
            cur += b;
            in_split++;
        }
        if (p->n_splits > 65535) { /* split.count is a u16 */
            uint32_t n = p->n_splits;
            synth_plan_free(p);
            return g5_fail(err, G5_ERR_INVALID_ARG, "synth: --split-size %llu gives %u splits",
                           (unsigned long long)o->split_size, n);
        }
    }
    *out = p;
    return G5_OK;
}

g5_status synth_plan_build(const synth_opts *o, synth_plan **out, g5_error *err) {
    if (!o || !out) return g5_fail(err, G5_ERR_INVALID_ARG, "synth: no options");
    return plan_build(o, out, err);
}

/* Random but plausible float data: norms near 1, biases near 0, weights ~ U(+-1/sqrt(fan_in)). */
static void fill_float(const synth_tensor_info *t, uint8_t *dst, uint64_t n, uint64_t *rng) {
    float center = 0.0f, spread;
    switch (t->role) {
    case GLM5_ROLE_ROUTER_BIAS: case GLM5_ROLE_IDX_K_NORM_BIAS: spread = 0.05f; break;
    default:
        if (t->n_dims == 1) {
            center = 1.0f; /* every other 1-D tensor is an RMSNorm/LayerNorm weight */
            spread = 0.1f;
        } else {
            spread = 1.0f / sqrtf((float)t->ne[0]);
        }
        break;
    }
    for (uint64_t i = 0; i < n; i++) {
        float v = center + spread * rng_unit(rng);
        if (t->type == QT_F32) {
            uint32_t bits;
            memcpy(&bits, &v, 4);
            g5_wr_u32(dst + 4 * i, bits);
        } else if (t->type == QT_BF16) {
            g5_wr_u16(dst + 2 * i, quant_f32_to_bf16(v));
        } else {
            g5_wr_u16(dst + 2 * i, quant_f32_to_f16(v));
        }
    }
}

typedef struct fill_ctx {
    const synth_tensor_info *ts;
    uint64_t first;   /* index of the split's first tensor in the plan */
    uint64_t seed;
    int centred;      /* synth_opts.centred */
} fill_ctx;

/* Quantized data is generated in chunks of FILL_CHUNK blocks, each seeded from the tensor's seed
 * and its index, so several threads can fill one tensor and the bytes do not depend on how
 * many did. */
#define FILL_CHUNK 8192u
#define FILL_MAX_THREADS 8

typedef struct fill_job {
    uint32_t type, block_bytes;
    uint8_t *dst;
    uint64_t n_blocks, seed;
    int centred;
    uint64_t next_chunk;     /* shared counter */
    pthread_mutex_t mu;
    g5_status st;
} fill_job;

static void *fill_worker(void *arg) {
    fill_job *j = arg;
    const uint64_t n_chunks = (j->n_blocks + FILL_CHUNK - 1) / FILL_CHUNK;
    for (;;) {
        pthread_mutex_lock(&j->mu);
        uint64_t c = j->next_chunk++;
        int stop = j->st != G5_OK;
        pthread_mutex_unlock(&j->mu);
        if (stop || c >= n_chunks) break;
        uint64_t b0 = c * FILL_CHUNK;
        uint64_t nb = j->n_blocks - b0 < FILL_CHUNK ? j->n_blocks - b0 : FILL_CHUNK;
        uint64_t rng = j->seed ^ (c * 0xD1B54A32D192ED03ull);
        rng = splitmix64(&rng);
        g5_status st = quant_fill_random(j->type, j->dst + b0 * j->block_bytes, nb, &rng);
        if (st == G5_OK && j->centred) st = quant_centre_blocks(j->type, j->dst + b0 * j->block_bytes, nb);
        if (st) {
            pthread_mutex_lock(&j->mu);
            j->st = st;
            pthread_mutex_unlock(&j->mu);
        }
    }
    return NULL;
}

static g5_status fill_tensor(void *user, int64_t i, uint8_t *dst, uint64_t nbytes) {
    const fill_ctx *fc = user;
    const synth_tensor_info *t = &fc->ts[fc->first + (uint64_t)i];
    if (nbytes != t->nbytes) return G5_ERR_INTERNAL;
    uint64_t rng = tensor_seed(fc->seed, t->name);
    if (t->type == QT_F32 || t->type == QT_F16 || t->type == QT_BF16) {
        fill_float(t, dst, nbytes / (t->type == QT_F32 ? 4 : 2), &rng);
        return G5_OK;
    }
    const quant_type_info *qi = quant_type_get(t->type);
    if (!qi || !qi->block_bytes) return G5_ERR_INTERNAL;
    fill_job j = {t->type, qi->block_bytes, dst, nbytes / qi->block_bytes, rng, fc->centred, 0,
                  PTHREAD_MUTEX_INITIALIZER, G5_OK};
    const uint64_t n_chunks = (j.n_blocks + FILL_CHUNK - 1) / FILL_CHUNK;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    uint64_t n_threads = ncpu > 1 ? (uint64_t)ncpu : 1;
    if (n_threads > FILL_MAX_THREADS) n_threads = FILL_MAX_THREADS;
    if (n_threads > n_chunks) n_threads = n_chunks;
    pthread_t th[FILL_MAX_THREADS];
    uint64_t started = 0;
    for (; started + 1 < n_threads; started++)
        if (pthread_create(&th[started], NULL, fill_worker, &j) != 0) break;
    fill_worker(&j); /* the calling thread works too */
    for (uint64_t k = 0; k < started; k++) pthread_join(th[k], NULL);
    pthread_mutex_destroy(&j.mu);
    return j.st;
}

g5_status synth_split_path(const char *path, uint32_t k, uint32_t n, char *out, size_t cap) {
    size_t len = strlen(path);
    if (len > 5 && strcmp(path + len - 5, ".gguf") == 0) len -= 5;
    if (k >= n || n > 99999) return G5_ERR_INVALID_ARG;
    int w = snprintf(out, cap, "%.*s-%05u-of-%05u.gguf", (int)len, path, k + 1, n);
    return w < 0 || (size_t)w >= cap ? G5_ERR_INVALID_ARG : G5_OK;
}

/* A writer holding split 0's metadata (architecture, hyperparameters, tokenizer). */
static g5_status metadata_writer(const synth_opts *o, const synth_plan *p, gguf_writer **out,
                                 g5_error *err) {
    preset_dims d;
    tokenizer tok;
    g5_status st = resolve_dims(o, &d, err);
    if (st) return st;
    if ((st = tokenizer_build(&d, &tok, err))) return st;
    gguf_writer *w = gguf_writer_create();
    if (!w) st = g5_fail(err, G5_ERR_NOMEM, "synth: out of memory");
    else st = add_metadata(w, &d, &p->hp, &tok, p->n_params, err);
    tokenizer_free(&tok);
    if (st) {
        gguf_writer_free(w);
        return st;
    }
    *out = w;
    return G5_OK;
}

g5_status synth_metadata_image(const synth_opts *o, uint8_t **buf, uint64_t *len, g5_error *err) {
    synth_plan *p = NULL;
    gguf_writer *w = NULL;
    g5_status st = synth_plan_build(o, &p, err);
    if (!st) st = metadata_writer(o, p, &w, err);
    if (!st && (st = gguf_writer_write_buffer(w, buf, len)))
        g5_fail(err, st, "synth: cannot serialize the metadata");
    gguf_writer_free(w);
    synth_plan_free(p);
    return st;
}

g5_status synth_write(const synth_opts *o, const char *path, synth_result *res, g5_error *err) {
    g5_status st;
    if (!o || !path || !*path) return g5_fail(err, G5_ERR_INVALID_ARG, "synth: no output path");
    synth_plan *p = NULL;
    gguf_writer *w = NULL;
    if ((st = synth_plan_build(o, &p, err))) return st;
    if (res) {
        memset(res, 0, sizeof *res);
        res->n_files = p->n_splits;
        res->n_tensors = p->n_tensors;
        res->data_bytes = p->data_bytes;
    }
    uint64_t first = 0, set_bytes = 0;
    uint32_t n_done = 0;
    for (uint32_t k = 0; k < p->n_splits; k++) {
        char fpath[4096];
        if (!o->split_size) {
            if (strlen(path) >= sizeof fpath) {
                st = g5_fail(err, G5_ERR_INVALID_ARG, "synth: output path too long");
                goto done;
            }
            strcpy(fpath, path);
        } else if (synth_split_path(path, k, p->n_splits, fpath, sizeof fpath)) {
            st = g5_fail(err, G5_ERR_INVALID_ARG, "synth: output path too long");
            goto done;
        }
        uint64_t last = first;
        while (last < p->n_tensors && p->tensors[last].split == k) last++;

        if (k == 0) {
            if ((st = metadata_writer(o, p, &w, err))) goto done;
        } else if (!(w = gguf_writer_create())) {
            st = g5_fail(err, G5_ERR_NOMEM, "synth: out of memory");
            goto done;
        }
        if (o->split_size) {
            /* as llama.cpp's gguf-split writes them (split.no is 0-based) */
            if ((st = gguf_writer_set_u16(w, "split.no", (uint16_t)k)) ||
                (st = gguf_writer_set_u16(w, "split.count", (uint16_t)p->n_splits)) ||
                (st = gguf_writer_set_i32(w, "split.tensors.count", (int32_t)p->n_tensors))) {
                st = g5_fail(err, st, "synth: cannot set split metadata");
                goto done;
            }
        }
        for (uint64_t i = first; i < last; i++) {
            const synth_tensor_info *t = &p->tensors[i];
            int64_t widx;
            if ((st = gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, NULL, &widx))) {
                st = g5_fail(err, st, "synth: cannot add tensor '%s'", t->name);
                goto done;
            }
        }
        fill_ctx fc = {p->tensors, first, o->seed, o->centred};
        if (o->test_fail_after_bytes)
            gguf_writer_set_test_fail_after(w, o->test_fail_after_bytes > set_bytes ? o->test_fail_after_bytes - set_bytes : 1);
        if ((st = gguf_writer_write_file(w, fpath, fill_tensor, &fc, err))) goto done;
        n_done = k + 1;
        gguf_writer_free(w);
        w = NULL;
        struct stat sb;
        if (stat(fpath, &sb) == 0) set_bytes += (uint64_t)sb.st_size;
        if (res) {
            if (k == 0) snprintf(res->first_path, sizeof res->first_path, "%s", fpath);
            res->file_bytes = set_bytes;
        }
        first = last;
    }
    st = G5_OK;
done:
    /* A set is written as a set: a failure removes the splits already in place (the failing one
     * removed its own temporary file). */
    for (uint32_t k = 0; st && k < n_done; k++) {
        char fpath[4096];
        if (!o->split_size) snprintf(fpath, sizeof fpath, "%s", path);
        else if (synth_split_path(path, k, p->n_splits, fpath, sizeof fpath)) continue;
        unlink(fpath);
    }
    gguf_writer_free(w);
    synth_plan_free(p);
    return st;
}
