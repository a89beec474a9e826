/* synth: the tiny preset reproduces the oracle GGUF's layout (tensor names, order, types, shapes,
 * metadata keys and types, hyperparameters, tokenizer bytes and specials) and passes the audit;
 * output is deterministic by seed; a split set holds the single file's tensors byte for byte;
 * the glm5 preset has GLM-5's shapes (checked against numbers from GLM-5's config.json, without
 * writing GBs); --tp-friendly and --layers behave as documented; --centred makes the tensors with
 * mins zero-mean. */
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>

#include <jansson.h>

#include "convert/inspect.h"
#include "convert/synth.h"
#include "format/gguf.h"
#include "format/quant.h"
#include "test_util.h"

static int str_eq(const char *s, uint64_t len, const char *want) {
    return len == strlen(want) && memcmp(s, want, len) == 0;
}

/* The tiny preset against the oracle GGUF. */
static void test_tiny_vs_oracle(const char *path) {
    gguf_ctx *syn = NULL, *ora = NULL;
    g5_error e;
    g5_error_clear(&e);
    T_CHECK(gguf_open(path, &syn, &e) == G5_OK, "open synth: %s", e.msg);
    T_CHECK(gguf_open(T_ORACLE_GGUF, &ora, &e) == G5_OK, "open oracle: %s", e.msg);
    if (!syn || !ora) goto out;

    /* tensors: same names in the same order, same types and shapes */
    T_CHECK(gguf_get_n_tensors(syn) == 94 && gguf_get_n_tensors(ora) == 94, "94 tensors (%lld)",
            (long long)gguf_get_n_tensors(syn));
    int bad = 0;
    for (int64_t i = 0; i < gguf_get_n_tensors(ora) && i < gguf_get_n_tensors(syn); i++) {
        const gguf_tensor *a = gguf_get_tensor(ora, i), *b = gguf_get_tensor(syn, i);
        int ok = !strcmp(a->name, b->name) && a->type == b->type && a->n_dims == b->n_dims &&
                 !memcmp(a->ne, b->ne, sizeof a->ne) && a->nbytes == b->nbytes;
        if (!ok && bad++ < 5)
            printf("  tensor %lld: oracle %s %s, synth %s %s\n", (long long)i, a->name,
                   quant_type_name(a->type), b->name, quant_type_name(b->type));
    }
    T_CHECK(bad == 0, "%d tensors differ from the oracle's", bad);

    /* metadata: every oracle key, with the same value type (and element type) */
    for (int64_t i = 0; i < gguf_get_n_kv(ora); i++) {
        const char *key = gguf_get_key(ora, i);
        int64_t j = gguf_find_key(syn, key);
        T_CHECK(j >= 0, "synth lacks key %s", key);
        if (j < 0) continue;
        gguf_value va, vb;
        gguf_get_value(ora, i, &va);
        gguf_get_value(syn, j, &vb);
        T_CHECK(va.type == vb.type, "%s: type %s vs %s", key, gguf_vtype_name(va.type),
                gguf_vtype_name(vb.type));
        if (va.type == GGUF_VT_ARRAY && vb.type == GGUF_VT_ARRAY) {
            T_CHECK(va.v.arr.elem_type == vb.v.arr.elem_type && va.v.arr.n == vb.v.arr.n,
                    "%s: array %s x %llu vs %s x %llu", key, gguf_vtype_name(va.v.arr.elem_type),
                    (unsigned long long)va.v.arr.n, gguf_vtype_name(vb.v.arr.elem_type),
                    (unsigned long long)vb.v.arr.n);
        } else if (strncmp(key, "general.", 8) != 0) {
            /* every hyperparameter and tokenizer scalar has the oracle's value */
            int same = va.type == GGUF_VT_STRING
                           ? va.v.str.len == vb.v.str.len &&
                                 !memcmp(va.v.str.s, vb.v.str.s, va.v.str.len)
                           : memcmp(&va.v, &vb.v, sizeof(uint64_t)) == 0;
            T_CHECK(same, "%s: value differs from the oracle's", key);
        }
    }
    T_CHECK(gguf_get_n_kv(syn) == gguf_get_n_kv(ora), "%lld keys vs the oracle's %lld",
            (long long)gguf_get_n_kv(syn), (long long)gguf_get_n_kv(ora));

    glm5_hparams ha, hb;
    T_CHECK(glm5_hparams_read(ora, &ha, &e) == G5_OK, "oracle hparams: %s", e.msg);
    T_CHECK(glm5_hparams_read(syn, &hb, &e) == G5_OK, "synth hparams: %s", e.msg);
    T_CHECK(hb.version == GLM5_VERSION_5, "synth's name says GLM-5");
    hb.version = ha.version; /* the oracle's general.name ("Hf") names no version */
    T_CHECK(memcmp(&ha, &hb, sizeof ha) == 0, "hyperparameters equal the oracle's");
    synth_opts o;
    synth_opts_init(&o);
    glm5_hparams hc;
    T_CHECK(synth_hparams(&o, &hc, &e) == G5_OK && memcmp(&hc, &ha, sizeof ha) == 0,
            "synth_hparams(tiny) equals the oracle's");

    /* tokenizer: byte tokens and specials at the oracle's ids, with its token types */
    int tok_bad = 0;
    const void *tta, *ttb;
    gguf_get_arr_data(ora, "tokenizer.ggml.token_type", &tta, NULL);
    gguf_get_arr_data(syn, "tokenizer.ggml.token_type", &ttb, NULL);
    for (uint64_t id = 0; id < 2048; id++) {
        if (id >= 256 && id < 2023) continue; /* learned merges differ, by design */
        const char *sa, *sb;
        uint64_t la, lb;
        gguf_get_arr_str(ora, "tokenizer.ggml.tokens", id, &sa, &la, NULL);
        gguf_get_arr_str(syn, "tokenizer.ggml.tokens", id, &sb, &lb, NULL);
        if (la != lb || memcmp(sa, sb, la) ||
            g5_rd_u32((const uint8_t *)tta + 4 * id) != g5_rd_u32((const uint8_t *)ttb + 4 * id))
            tok_bad++;
    }
    T_CHECK(tok_bad == 0, "%d byte/special tokens differ from the oracle's", tok_bad);
    /* every merge "a b" joins two tokens into a token that exists (a valid BPE table) */
    gguf_vtype et;
    uint64_t n_merges = 0, n_tok = 0;
    gguf_get_arr(syn, "tokenizer.ggml.merges", &et, &n_merges, NULL);
    gguf_get_arr(syn, "tokenizer.ggml.tokens", &et, &n_tok, NULL);
    char **toks = calloc(n_tok, sizeof *toks);
    for (uint64_t i = 0; i < n_tok; i++) {
        const char *s;
        uint64_t l;
        gguf_get_arr_str(syn, "tokenizer.ggml.tokens", i, &s, &l, NULL);
        toks[i] = strndup(s, l);
    }
    int merge_bad = 0;
    for (uint64_t m = 0; m < n_merges; m++) {
        const char *s;
        uint64_t l;
        gguf_get_arr_str(syn, "tokenizer.ggml.merges", m, &s, &l, NULL);
        char *ms = strndup(s, l), *sp = strchr(ms, ' ');
        int found_a = 0, found_b = 0, found_ab = 0;
        if (sp) {
            *sp = 0;
            char ab[256];
            snprintf(ab, sizeof ab, "%s%s", ms, sp + 1);
            for (uint64_t i = 0; i < n_tok; i++) {
                found_a |= !strcmp(toks[i], ms);
                found_b |= !strcmp(toks[i], sp + 1);
                found_ab |= !strcmp(toks[i], ab);
            }
        }
        merge_bad += !(found_a && found_b && found_ab);
        free(ms);
    }
    T_CHECK(n_merges == 2048 - 256 - 25 && merge_bad == 0, "%llu merges, %d invalid",
            (unsigned long long)n_merges, merge_bad);
    for (uint64_t i = 0; i < n_tok; i++) free(toks[i]);
    free(toks);

    /* the audit */
    json_t *rep = NULL;
    T_CHECK(inspect_gguf(syn, path, NULL, &rep, &e) == G5_OK && inspect_report_passed(rep),
            "synth tiny passes the audit");
    json_decref(rep);
out:
    gguf_free(syn);
    gguf_free(ora);
}

/* A split set opens from any split and holds the single file's tensors byte for byte. */
static void test_split(const char *dir, const char *single) {
    synth_opts o;
    synth_opts_init(&o);
    o.seed = 7; /* as the single file */
    o.split_size = 4u << 20;
    char base[4200], p2[4200];
    snprintf(base, sizeof base, "%s/split.gguf", dir);
    synth_result res;
    g5_error e;
    g5_error_clear(&e);
    T_CHECK(synth_write(&o, base, &res, &e) == G5_OK, "synth split: %s", e.msg);
    T_CHECK(res.n_files >= 5, "26 MiB in 4 MiB splits: %u files", res.n_files);
    synth_split_path(base, 1, res.n_files, p2, sizeof p2);
    char want_name[4200];
    snprintf(want_name, sizeof want_name, "%s/split-00002-of-%05u.gguf", dir, res.n_files);
    T_CHECK(strcmp(p2, want_name) == 0, "split name %s", p2);

    gguf_ctx *a = NULL, *b = NULL;
    T_CHECK(gguf_open(single, &a, &e) == G5_OK, "open single: %s", e.msg);
    T_CHECK(gguf_open(p2, &b, &e) == G5_OK, "open split 2 of n: %s", e.msg);
    if (a && b) {
        T_CHECK(gguf_get_n_splits(b) == res.n_files, "n_splits %u", gguf_get_n_splits(b));
        T_CHECK(gguf_get_n_tensors(a) == gguf_get_n_tensors(b), "tensor count");
        int bad = 0;
        uint32_t last_split = 0;
        for (int64_t i = 0; i < gguf_get_n_tensors(a); i++) {
            const gguf_tensor *ta = gguf_get_tensor(a, i);
            const gguf_tensor *tb = gguf_find_tensor(b, ta->name);
            if (!tb || tb->type != ta->type || tb->nbytes != ta->nbytes ||
                memcmp(ta->data, tb->data, ta->nbytes) != 0) {
                bad++;
                continue;
            }
            /* distributed in order, no split over budget unless one tensor fills it */
            if (tb->split < last_split) bad++;
            last_split = tb->split;
        }
        T_CHECK(bad == 0, "%d tensors differ between the split set and the single file", bad);
        for (uint32_t s = 0; s < gguf_get_n_splits(b); s++) {
            uint64_t data = gguf_get_split_size(b, s) - gguf_get_split_data_offset(b, s);
            T_CHECK(data <= o.split_size, "split %u holds %llu data bytes", s,
                    (unsigned long long)data);
        }
        /* split metadata: u16 split.no / split.count and i32 split.tensors.count (gguf-split) */
        int64_t k = gguf_find_key(b, "split.count");
        T_CHECK(k >= 0 && gguf_get_kv_type(b, k) == GGUF_VT_UINT16, "split.count is u16");
        k = gguf_find_key(b, "split.tensors.count");
        T_CHECK(k >= 0 && gguf_get_kv_type(b, k) == GGUF_VT_INT32, "split.tensors.count is i32");
        /* split 0 carries all of the single file's metadata */
        for (int64_t i = 0; i < gguf_get_n_kv(a); i++)
            T_CHECK(gguf_find_key(b, gguf_get_key(a, i)) >= 0, "split set lacks %s",
                    gguf_get_key(a, i));
        json_t *rep = NULL;
        T_CHECK(inspect_gguf(b, p2, NULL, &rep, &e) == G5_OK && inspect_report_passed(rep),
                "split set passes the audit");
        json_decref(rep);
    }
    gguf_free(a);
    gguf_free(b);
}

static const glm5_tensor_spec *find_spec(const synth_plan *p, const char *name,
                                         glm5_tensor_spec *tmp) {
    for (uint64_t i = 0; i < p->n_tensors; i++)
        if (!strcmp(p->tensors[i].name, name)) {
            memset(tmp, 0, sizeof *tmp);
            memcpy(tmp->ne, p->tensors[i].ne, sizeof tmp->ne);
            tmp->n_dims = p->tensors[i].n_dims;
            return tmp;
        }
    return NULL;
}

static void expect_shape(const synth_plan *p, const char *name, uint64_t a, uint64_t b,
                         uint64_t c) {
    glm5_tensor_spec tmp;
    const glm5_tensor_spec *s = find_spec(p, name, &tmp);
    T_CHECK(s != NULL, "%s present", name);
    if (s)
        T_CHECK(s->ne[0] == a && s->ne[1] == b && s->ne[2] == c,
                "%s: {%llu, %llu, %llu}, want {%llu, %llu, %llu}", name,
                (unsigned long long)s->ne[0], (unsigned long long)s->ne[1],
                (unsigned long long)s->ne[2], (unsigned long long)a, (unsigned long long)b,
                (unsigned long long)c);
}

/* GLM-5's dimensions, from zai-org/GLM-5's config.json (independent of our code): hidden 6144,
 * 64 heads, q_lora 2048, kv_lora 512, qk_nope 192, qk_rope 64, v_head 256, vocab 154880, dense
 * 12288, experts of 2048, index 32 heads x 128, eos ids 154820 / 154827 / 154829. */
static void test_glm5_preset(void) {
    synth_opts o;
    synth_opts_init(&o);
    o.preset = SYNTH_PRESET_GLM5;
    o.n_layers = 1;
    o.n_experts = 8;
    synth_plan *p = NULL;
    g5_error e;
    g5_error_clear(&e);
    T_CHECK(synth_plan_build(&o, &p, &e) == G5_OK, "glm5 plan: %s", e.msg);
    if (!p) return;
    /* 3 globals; one MoE main layer of 23 tensors; the NextN layer adds 4 */
    T_CHECK(p->n_tensors == 3 + 23 + 27, "%llu tensors", (unsigned long long)p->n_tensors);
    expect_shape(p, "token_embd.weight", 6144, 154880, 1);
    expect_shape(p, "output.weight", 6144, 154880, 1);
    expect_shape(p, "blk.0.attn_q_a.weight", 6144, 2048, 1);
    expect_shape(p, "blk.0.attn_q_b.weight", 2048, 64 * (192 + 64), 1);
    expect_shape(p, "blk.0.attn_kv_a_mqa.weight", 6144, 512 + 64, 1);
    expect_shape(p, "blk.0.attn_k_b.weight", 192, 512, 64);
    expect_shape(p, "blk.0.attn_v_b.weight", 512, 256, 64);
    expect_shape(p, "blk.0.attn_output.weight", 64 * 256, 6144, 1);
    expect_shape(p, "blk.0.indexer.attn_q_b.weight", 2048, 32 * 128, 1);
    expect_shape(p, "blk.0.indexer.attn_k.weight", 6144, 128, 1);
    expect_shape(p, "blk.0.indexer.proj.weight", 6144, 32, 1);
    expect_shape(p, "blk.0.ffn_gate_inp.weight", 6144, 8, 1);
    expect_shape(p, "blk.0.ffn_gate_exps.weight", 6144, 2048, 8);
    expect_shape(p, "blk.0.ffn_down_exps.weight", 2048, 6144, 8);
    expect_shape(p, "blk.0.ffn_up_shexp.weight", 6144, 2048, 1);
    expect_shape(p, "blk.1.nextn.eh_proj.weight", 2 * 6144, 6144, 1);
    expect_shape(p, "blk.1.ffn_down_exps.weight", 2048, 6144, 8);
    glm5_tensor_spec tmp;
    T_CHECK(!find_spec(p, "blk.0.ffn_gate.weight", &tmp), "one main layer: MoE, not dense");
    T_CHECK(p->hp.n_leading_dense == 0 && p->hp.n_layer == 2, "layers %u, dense %u",
            p->hp.n_layer, p->hp.n_leading_dense);
    synth_plan_free(p);

    /* --layers 4 keeps GLM-5's three dense layers; ffn width 12288 */
    o.n_layers = 4;
    T_CHECK(synth_plan_build(&o, &p, &e) == G5_OK, "glm5 plan: %s", e.msg);
    if (p) {
        expect_shape(p, "blk.2.ffn_down.weight", 12288, 6144, 1);
        T_CHECK(!find_spec(p, "blk.3.ffn_down.weight", &tmp), "layer 3 is MoE");
        T_CHECK(p->hp.n_leading_dense == 3, "3 dense layers");
        synth_plan_free(p);
    }

    /* full depth: 1809 tensors, as the published GLM-5 UD-Q4_K_XL split set has */
    synth_opts_init(&o);
    o.preset = SYNTH_PRESET_GLM5;
    T_CHECK(synth_plan_build(&o, &p, &e) == G5_OK, "glm5 full plan: %s", e.msg);
    if (p) {
        T_CHECK(p->n_tensors == 1809, "%llu tensors", (unsigned long long)p->n_tensors);
        T_CHECK(p->hp.n_layer == 79 && p->hp.n_expert == 256 && p->hp.n_expert_used == 8,
                "79 blocks, 256 experts, 8 used");
        synth_plan_free(p);
    }

    /* metadata (tokenizer included) without the weights */
    o.n_layers = 1;
    o.n_experts = 8;
    uint8_t *img = NULL;
    uint64_t len = 0;
    T_CHECK(synth_metadata_image(&o, &img, &len, &e) == G5_OK, "metadata image: %s", e.msg);
    gguf_ctx *ctx = NULL;
    if (img) T_CHECK(gguf_parse_buffer(img, len, "glm5-meta", &ctx, &e) == G5_OK, "parse: %s", e.msg);
    if (ctx) {
        glm5_hparams hp;
        T_CHECK(glm5_hparams_read(ctx, &hp, &e) == G5_OK, "hparams: %s", e.msg);
        T_CHECK(hp.n_embd == 6144 && hp.n_head == 64 && hp.q_lora == 2048 && hp.kv_lora == 512 &&
                    hp.qk_nope == 192 && hp.qk_rope == 64 && hp.v_head == 256 &&
                    hp.n_vocab == 154880 && hp.n_ff == 12288 && hp.n_ff_exp == 2048,
                "GLM-5 dimensions");
        T_CHECK(hp.idx_n_head == 32 && hp.idx_head_dim == 128 && hp.idx_top_k == 2048,
                "indexer 32 x 128, top_k 2048");
        T_CHECK(hp.n_ctx_train == 202752 && hp.rope_theta == 1e6f && hp.expert_weights_scale == 2.5f,
                "ctx, rope theta, routed scale");
        T_CHECK(hp.expert_gating_func == 2 && gguf_find_key(ctx, "glm-dsa.expert_gating_func") >= 0,
                "gating func 2 (sigmoid) stored, as in the published GGUFs");
        T_CHECK(hp.n_expert_shared == 1 && hp.n_group == 1 && hp.topk_group == 1, "groups");
        struct { const char *key; uint64_t id; const char *tok; } sp[] = {
            {"tokenizer.ggml.eos_token_id", 154820, "<|endoftext|>"},
            {"tokenizer.ggml.eot_token_id", 154827, "<|user|>"},
            {"tokenizer.ggml.eom_token_id", 154829, "<|observation|>"},
            {"tokenizer.ggml.bos_token_id", 154822, "[gMASK]"},
        };
        for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) {
            uint64_t id = 0;
            const char *s = "";
            uint64_t l = 0;
            gguf_get_uint(ctx, sp[i].key, &id, NULL);
            gguf_get_arr_str(ctx, "tokenizer.ggml.tokens", sp[i].id, &s, &l, NULL);
            T_CHECK(id == sp[i].id && str_eq(s, l, sp[i].tok), "%s = %llu (%.*s)", sp[i].key,
                    (unsigned long long)id, (int)l, s);
        }
        const char *s;
        uint64_t l;
        T_CHECK(gguf_get_arr_str(ctx, "tokenizer.ggml.tokens", 154824, &s, &l, NULL) == G5_OK &&
                    str_eq(s, l, "<sop>"),
                "<sop>");
        T_CHECK(gguf_get_arr_str(ctx, "tokenizer.ggml.tokens", 154834, &s, &l, NULL) == G5_OK &&
                    str_eq(s, l, "<think>"),
                "<think>");
        T_CHECK(gguf_get_str(ctx, "tokenizer.ggml.pre", &s, &l, NULL) == G5_OK && str_eq(s, l, "glm4"),
                "pre glm4");
        gguf_vtype et;
        uint64_t n = 0;
        gguf_get_arr(ctx, "tokenizer.ggml.tokens", &et, &n, NULL);
        T_CHECK(n == 154880, "%llu tokens", (unsigned long long)n);
        gguf_free(ctx);
    }
    free(img);
}

/* Block alignment of every ne[0] split at T, as specs/sharding.md cuts them. */
static int misaligned_at(const synth_plan *p, uint32_t T, char *what, size_t cap) {
    if (p->hp.n_head % T) return snprintf(what, cap, "%u heads", p->hp.n_head), 1;
    if (p->hp.n_vocab % T) return snprintf(what, cap, "vocab %u", p->hp.n_vocab), 1;
    for (uint64_t i = 0; i < p->n_tensors; i++) {
        const synth_tensor_info *t = &p->tensors[i];
        int col = t->role == GLM5_ROLE_ATTN_OUT || t->role == GLM5_ROLE_FFN_DOWN ||
                  t->role == GLM5_ROLE_SHEXP_DOWN || t->role == GLM5_ROLE_EXP_DOWN;
        if (!col) continue;
        uint64_t w = t->ne[0] / T, blk = quant_type_get(t->type)->block_elems;
        if (t->ne[0] % T || w % blk)
            return snprintf(what, cap, "%s %s slice %llu", t->name, quant_type_name(t->type),
                            (unsigned long long)w), 1;
    }
    return 0;
}

static void test_tp_friendly(void) {
    synth_opts o;
    synth_plan *p = NULL;
    g5_error e;
    char what[256];
    synth_opts_init(&o);
    T_CHECK(synth_plan_build(&o, &p, &e) == G5_OK, "tiny plan");
    if (p) {
        T_CHECK(!misaligned_at(p, 2, what, sizeof what), "tiny shards at T=2");
        T_CHECK(misaligned_at(p, 4, what, sizeof what) && strstr(what, "ffn_down_exps"),
                "tiny does not shard at T=4 (%s)", what);
        synth_plan_free(p);
    }
    o.tp_friendly = 1;
    T_CHECK(synth_plan_build(&o, &p, &e) == G5_OK, "tiny tp-friendly plan: %s", e.msg);
    if (p) {
        for (uint32_t T = 1; T <= 8; T *= 2)
            T_CHECK(!misaligned_at(p, T, what, sizeof what), "tp-friendly tiny at T=%u: %s", T, what);
        T_CHECK(p->hp.n_expert % 8 == 0, "experts divide by 8");
        synth_plan_free(p);
    }
    o.n_experts = 6;
    T_CHECK(synth_plan_build(&o, &p, &e) == G5_ERR_INVALID_ARG, "tp-friendly refuses 6 experts");
    synth_opts_init(&o);
    o.preset = SYNTH_PRESET_GLM5;
    o.n_layers = 2;
    o.n_experts = 16;
    T_CHECK(synth_plan_build(&o, &p, &e) == G5_OK, "glm5 plan");
    if (p) {
        for (uint32_t T = 1; T <= 8; T *= 2)
            T_CHECK(!misaligned_at(p, T, what, sizeof what), "glm5 at T=%u: %s", T, what);
        synth_plan_free(p);
    }
    /* --layers on tiny: the NextN layer stays, leading dense layers leave one MoE layer */
    synth_opts_init(&o);
    o.n_layers = 2;
    T_CHECK(synth_plan_build(&o, &p, &e) == G5_OK, "tiny 2 layers");
    if (p) {
        T_CHECK(p->hp.n_layer == 3 && p->hp.n_leading_dense == 1 && p->hp.n_nextn == 1,
                "2 main (1 dense) + NextN");
        synth_plan_free(p);
    }
    o.n_layers = 0;
    T_CHECK(synth_plan_build(&o, &p, &e) == G5_ERR_INVALID_ARG, "0 layers refused");
    synth_preset ps;
    T_CHECK(synth_preset_from_name("huge", &ps, &e) == G5_ERR_INVALID_ARG, "unknown preset");
}

/* Mean and rms over the Q2_K / Q4_K / Q5_K tensors of a synth file, and how many there are. */
static int kmin_stats(const char *path, double *mean, double *rms) {
    gguf_ctx *g = NULL;
    g5_error e;
    g5_error_clear(&e);
    T_CHECK(gguf_open(path, &g, &e) == G5_OK, "open %s: %s", path, e.msg);
    if (!g) return 0;
    double sum = 0, sumsq = 0, n = 0;
    int count = 0;
    for (int64_t i = 0; i < gguf_get_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_get_tensor(g, i);
        if (t->type != QT_Q2_K && t->type != QT_Q4_K && t->type != QT_Q5_K) continue;
        float *y = malloc(t->n_elems * sizeof *y);
        if (!y || quant_dequantize(t->type, t->data, t->n_elems, y) != G5_OK) {
            T_CHECK(0, "dequantize %s", t->name);
            free(y);
            continue;
        }
        for (uint64_t j = 0; j < t->n_elems; j++) sum += y[j], sumsq += (double)y[j] * y[j];
        n += (double)t->n_elems;
        count++;
        free(y);
    }
    gguf_free(g);
    *mean = n ? sum / n : 0;
    *rms = n ? sqrt(sumsq / n) : 0;
    return count;
}

/* --centred: the same layout, other bytes, and the tensors with mins zero-mean (without it their
 * mean is at least a fifth of their rms). */
static void test_centred(const char *dir, const char *plain) {
    char path[4300];
    snprintf(path, sizeof path, "%s/centred.gguf", dir);
    synth_opts o;
    synth_opts_init(&o);
    o.seed = 7;
    o.centred = 1;
    g5_error e;
    g5_error_clear(&e);
    T_CHECK(synth_write(&o, path, NULL, &e) == G5_OK, "synth --centred: %s", e.msg);
    T_CHECK(!t_file_equal(path, plain), "--centred gives other bytes");
    double m0, r0, m1, r1;
    const int n0 = kmin_stats(plain, &m0, &r0), n1 = kmin_stats(path, &m1, &r1);
    T_CHECK(n0 > 0 && n0 == n1, "%d / %d tensors with mins", n0, n1);
    T_CHECK(m0 >= 0.2 * r0, "as filled: mean %.3g, rms %.3g", m0, r0);
    T_CHECK(fabs(m1) <= 0.02 * r1, "centred: mean %.3g, rms %.3g", m1, r1);
    printf("  tensors with mins: mean / rms %.3f as filled, %.4f centred\n", m0 / r0, m1 / r1);
    unlink(path);
}

int main(void) {
    const char *dir0 = t_tmpdir();
    char *dir = strdup(dir0);
    char a[4200], b[4200], c[4200];
    snprintf(a, sizeof a, "%s/a.gguf", dir);
    snprintf(b, sizeof b, "%s/b.gguf", dir);
    snprintf(c, sizeof c, "%s/c.gguf", dir);
    synth_opts o;
    synth_opts_init(&o);
    o.seed = 7;
    synth_result res;
    g5_error e;
    g5_error_clear(&e);
    T_CHECK(synth_write(&o, a, &res, &e) == G5_OK, "synth tiny: %s", e.msg);
    T_CHECK(res.n_files == 1 && res.n_tensors == 94, "result: %u files, %llu tensors",
            res.n_files, (unsigned long long)res.n_tensors);
    struct stat sb;
    T_CHECK(stat(a, &sb) == 0 && (uint64_t)sb.st_size == res.file_bytes, "file size reported");
    test_tiny_vs_oracle(a);

    /* deterministic by seed */
    T_CHECK(synth_write(&o, b, NULL, &e) == G5_OK, "synth again");
    T_CHECK(t_file_equal(a, b), "same seed, same bytes");
    o.seed = 8;
    T_CHECK(synth_write(&o, c, NULL, &e) == G5_OK, "synth seed 8");
    T_CHECK(!t_file_equal(a, c), "another seed, other bytes");
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp", a);
    T_CHECK(access(tmp, F_OK) != 0, "no temporary file left");

    test_split(dir, b);
    test_centred(dir, b);
    test_glm5_preset();
    test_tp_friendly();
    t_rmtree(dir);
    free(dir);
    return t_report("test_synth");
}
