/* Converter and verifier end to end. Expectations are computed independently of convert/ and of
 * glm5_rebuild_kv_b: slices are reassembled from the blobs' own split descriptions and compared
 * with the source bytes read through the GGUF reader; kv_b is rebuilt here from quant_dequantize
 * of attn_k_b/attn_v_b; source identity is hashed here from the file. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <xxhash.h>

#include "convert/convert.h"
#include "convert/convert_test.h"
#include "convert/synth.h"
#include "format/blob.h"
#include "format/glm5.h"
#include "format/gguf_write.h"
#include "format/quant.h"
#include "tests/test_util.h"

static const char *g_tmp;

static void canon(const void *p, size_t n, uint8_t out[16]) {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(p, n));
    memcpy(out, c.digest, 16);
}

static void file_hash(const char *path, uint8_t out[16]) {
    size_t n;
    uint8_t *b = t_read_file(path, &n);
    canon(b ? b : (const uint8_t *)"", b ? n : 0, out);
    free(b);
}

static int copy_file(const char *from, const char *to) {
    size_t n;
    uint8_t *b = t_read_file(from, &n);
    int r = b ? t_write_file(to, b, n) : -1;
    free(b);
    return r;
}

static int n_dir_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static char *path2(const char *a, const char *b) {
    static char buf[8][4400];
    static int k;
    char *p = buf[k++ & 7];
    snprintf(p, sizeof buf[0], "%s/%s", a, b);
    return p;
}

static const char *rank_file(const char *dir, uint32_t r, uint32_t tp) {
    char fn[64];
    blob_rank_filename(r, tp, fn, sizeof fn);
    return path2(dir, fn);
}

/* Byte-for-byte equality of two output directories (ranks and set record). */
static int dirs_equal(const char *a, const char *b, uint32_t tp) {
    for (uint32_t r = 0; r <= tp; r++) {
        const char *fa = r < tp ? rank_file(a, r, tp) : path2(a, BLOB_SET_RECORD);
        const char *fb = r < tp ? rank_file(b, r, tp) : path2(b, BLOB_SET_RECORD);
        size_t na, nb;
        uint8_t *x = t_read_file(fa, &na), *y = t_read_file(fb, &nb);
        int eq = x && y && na == nb && memcmp(x, y, na) == 0;
        free(x);
        free(y);
        if (!eq) return 0;
    }
    return 1;
}

static g5_status convert(const char *model, const char *dir, uint32_t tp, int ep, uint32_t kvb,
                         convert_result **res, g5_error *e) {
    convert_options o;
    convert_options_init(&o);
    o.tp = tp;
    o.ep = ep;
    o.kv_b_type = kvb;
    o.jobs = 2;
    return convert_run(model, dir, &o, res, e);
}

static g5_status verify(const char *dir, const char *deep, convert_verify_result **res, g5_error *e) {
    convert_verify_options o;
    convert_verify_options_init(&o);
    o.jobs = 2;
    o.deep_source = deep;
    return convert_verify(dir, &o, res, e);
}

/* ---- independent expectations ---- */

/* The rule table of the issue, by tensor name: split axis in ggml order (-1 replicated). */
static int expected_axis(const char *name, int ep) {
    static const struct { const char *suffix; int axis; } k[] = {
        {".attn_q_b.weight", 1}, {".attn_kv_b.weight", 1}, {".attn_output.weight", 0},
        {".ffn_gate.weight", 1}, {".ffn_up.weight", 1}, {".ffn_down.weight", 0},
        {".ffn_gate_shexp.weight", 1}, {".ffn_up_shexp.weight", 1}, {".ffn_down_shexp.weight", 0},
        {".ffn_gate_exps.weight", 1}, {".ffn_up_exps.weight", 1}, {".ffn_down_exps.weight", 0},
        {".attn_k_b.weight", 2}, {".attn_v_b.weight", 2}, /* whole heads, ne = {., ., n_head} */
    };
    if (strcmp(name, "output.weight") == 0) return 1;
    if (strstr(name, ".indexer.")) return -1;
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        size_t m = strlen(k[i].suffix);
        if (n > m && strcmp(name + n - m, k[i].suffix) == 0) return ep && strstr(name, "_exps") ? 2 : k[i].axis;
    }
    return -1;
}

/* Reassembles a source tensor from the ranks' slices using only the blobs' split fields. */
static int reassemble(const blob_tensor *const *bt, uint32_t tp, uint8_t *out, uint64_t nbytes) {
    const blob_tensor *t0 = bt[0];
    const uint32_t a = t0->split_axis;
    const uint64_t rows_l = t0->ne[1] * t0->ne[2] * t0->ne[3];
    const uint64_t rows_g = t0->ne_global[1] * t0->ne_global[2] * t0->ne_global[3];
    const uint64_t rb_l = t0->size / rows_l, rb_g = nbytes / rows_g;
    for (uint32_t r = 0; r < tp; r++) {
        if (bt[r]->split_index != r || bt[r]->split_count != tp || bt[r]->size != t0->size) return 0;
        for (uint64_t i3 = 0; i3 < t0->ne[3]; i3++)
            for (uint64_t i2 = 0; i2 < t0->ne[2]; i2++)
                for (uint64_t i1 = 0; i1 < t0->ne[1]; i1++) {
                    const uint64_t g1 = i1 + (a == 1 ? r * t0->ne[1] : 0), g2 = i2 + (a == 2 ? r * t0->ne[2] : 0);
                    const uint64_t grow = g1 + t0->ne_global[1] * (g2 + t0->ne_global[2] * i3);
                    const uint64_t lrow = i1 + t0->ne[1] * (i2 + t0->ne[2] * i3);
                    memcpy(out + grow * rb_g + (a == 0 ? r * rb_l : 0), bt[r]->data + lrow * rb_l, rb_l);
                }
    }
    return 1;
}

static int values_equal(const gguf_ctx *a, int64_t i, const gguf_ctx *b, int64_t j) {
    gguf_value x, y;
    if (gguf_get_value(a, i, &x) || gguf_get_value(b, j, &y) || x.type != y.type) return 0;
    switch (x.type) {
    case GGUF_VT_STRING:
        return x.v.str.len == y.v.str.len && memcmp(x.v.str.s, y.v.str.s, x.v.str.len) == 0;
    case GGUF_VT_ARRAY:
        if (x.v.arr.elem_type != y.v.arr.elem_type || x.v.arr.n != y.v.arr.n) return 0;
        if (x.v.arr.elem_type == GGUF_VT_STRING) {
            for (uint64_t k = 0; k < x.v.arr.n; k++) {
                const char *s, *t;
                uint64_t sl, tl;
                if (gguf_get_arr_str_at(a, i, k, &s, &sl) || gguf_get_arr_str_at(b, j, k, &t, &tl) || sl != tl ||
                    memcmp(s, t, sl))
                    return 0;
            }
            return 1;
        } else {
            static const int sz[GGUF_VT_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
            return memcmp(x.v.arr.data, y.v.arr.data, x.v.arr.n * (uint64_t)sz[x.v.arr.elem_type]) == 0;
        }
    case GGUF_VT_FLOAT32: case GGUF_VT_FLOAT64:
        return x.v.f == y.v.f;
    case GGUF_VT_INT8: case GGUF_VT_INT16: case GGUF_VT_INT32: case GGUF_VT_INT64:
        return x.v.i == y.v.i;
    default:
        return x.v.u == y.v.u;
    }
}

/* Expected kv_b of one layer, [H * (nope + vh), kv_lora], from quant_dequantize only. */
static float *expected_kv_b(const gguf_ctx *src, const glm5_hparams *hp, int layer) {
    char kn[64], vn[64];
    snprintf(kn, sizeof kn, "blk.%d.attn_k_b.weight", layer);
    snprintf(vn, sizeof vn, "blk.%d.attn_v_b.weight", layer);
    const gguf_tensor *k = gguf_find_tensor(src, kn), *v = gguf_find_tensor(src, vn);
    if (!k || !v) return NULL;
    const uint64_t H = hp->n_head, L = hp->kv_lora, N = hp->qk_nope, V = hp->v_head;
    float *kf = malloc(k->n_elems * sizeof(float)), *vf = malloc(v->n_elems * sizeof(float));
    float *out = malloc(H * (N + V) * L * sizeof(float));
    if (quant_dequantize(k->type, k->data, k->n_elems, kf) || quant_dequantize(v->type, v->data, v->n_elems, vf)) {
        free(kf);
        free(vf);
        free(out);
        return NULL;
    }
    for (uint64_t h = 0; h < H; h++) {
        for (uint64_t d = 0; d < N; d++)
            for (uint64_t c = 0; c < L; c++) /* k_b ne = {N, L, H}: element (d, c, h) */
                out[(h * (N + V) + d) * L + c] = kf[(h * L + c) * N + d];
        for (uint64_t j = 0; j < V; j++)
            for (uint64_t c = 0; c < L; c++) /* v_b ne = {L, V, H}: element (c, j, h) */
                out[(h * (N + V) + N + j) * L + c] = vf[(h * V + j) * L + c];
    }
    free(kf);
    free(vf);
    return out;
}

/* Checks a converted set against its source; returns the max |kv_b stored - expected|. */
static double check_set(const char *model, const char *dir, uint32_t tp, int ep, uint32_t kvb) {
    g5_error e;
    gguf_ctx *src = NULL;
    blob_set *set = NULL;
    double kv_err = -1;
    T_CHECK(gguf_open(model, &src, &e) == G5_OK, "open source: %s", e.msg);
    T_CHECK(blob_set_open(dir, &set, &e) == G5_OK, "open set %s: %s", dir, e.msg);
    if (!src || !set) goto out;
    glm5_hparams hp;
    T_CHECK(glm5_hparams_read(src, &hp, &e) == G5_OK, "hparams");
    const blob *b0 = blob_set_rank(set, 0);
    const blob_info *in = blob_get_info(b0);
    T_CHECK(in->tp == tp && in->placement == (uint32_t)(ep ? BLOB_PLACE_EP : BLOB_PLACE_TP) && in->kv_b_type == kvb,
            "header: tp %u placement %u kv_b %u", in->tp, in->placement, in->kv_b_type);
    /* Source identity, hashed here. */
    T_CHECK(blob_n_sources(b0) == gguf_get_n_splits(src), "source count");
    for (uint32_t s = 0; s < blob_n_sources(b0) && s < gguf_get_n_splits(src); s++) {
        size_t n;
        uint8_t *f = t_read_file(gguf_get_split_path(src, s), &n), h[16];
        const blob_source *bs = blob_get_source(b0, s);
        const uint64_t hs = gguf_get_split_data_offset(src, s);
        canon(f, hs, h);
        T_CHECK(bs->file_size == n && bs->header_size == hs && memcmp(bs->header_hash, h, 16) == 0, "source %u identity", s);
        free(f);
    }
    /* Metadata: every source key but split.*, same values. */
    const gguf_ctx *m = blob_get_meta(b0);
    int64_t n_src_kv = 0, same = 0;
    for (int64_t i = 0; i < gguf_get_n_kv(src); i++) {
        const char *k = gguf_get_key(src, i);
        if (strncmp(k, "split.", 6) == 0) continue;
        n_src_kv++;
        int64_t j = gguf_find_key(m, k);
        same += j >= 0 && values_equal(src, i, m, j);
    }
    /* plus the resolved indexer schedule (specs/blob-format.md "Metadata") */
    int64_t extra = 0;
    for (int64_t j = 0; j < gguf_get_n_kv(m); j++) {
        const char *k = gguf_get_key(m, j);
        if (gguf_find_key(src, k) >= 0) continue;
        extra++;
        T_CHECK(strcmp(k, "glm-dsa.attention.indexer.types") == 0 || strncmp(k, "glm5shard.indexer.", 18) == 0,
                "metadata: only the schedule keys are added (%s)", k);
    }
    T_CHECK(gguf_find_key(m, "glm-dsa.attention.indexer.types") >= 0 && gguf_find_key(m, "glm5shard.indexer.source") >= 0,
            "metadata: the blob records the indexer schedule");
    T_CHECK(same == n_src_kv && gguf_get_n_kv(m) == n_src_kv + extra, "metadata: %lld of %lld keys equal, blob has %lld",
            (long long)same, (long long)n_src_kv, (long long)gguf_get_n_kv(m));
    /* Every source tensor: replicated byte-identical, or split and reassembling exactly. */
    const blob_tensor *bt[64];
    uint64_t n_copied = 0, n_ok = 0, n_kb = 0;
    for (int64_t i = 0; i < gguf_get_n_tensors(src); i++) {
        const gguf_tensor *g = gguf_get_tensor(src, i);
        /* attn_k_b / attn_v_b are carried as they are (cut by heads) and also rebuilt as kv_b */
        if (strstr(g->name, ".attn_k_b.") || strstr(g->name, ".attn_v_b.")) n_kb++;
        n_copied++;
        int ok = 1;
        for (uint32_t r = 0; r < tp; r++) {
            bt[r] = blob_find_tensor(blob_set_rank(set, r), g->name);
            ok = ok && bt[r] && bt[r]->type == g->type && memcmp(bt[r]->ne_global, g->ne, sizeof g->ne) == 0 &&
                 !(bt[r]->flags & BLOB_TFLAG_DERIVED);
        }
        if (!ok) {
            T_CHECK(0, "tensor %s missing or misdescribed", g->name);
            continue;
        }
        const int want_axis = expected_axis(g->name, ep);
        if (want_axis < 0) {
            for (uint32_t r = 0; r < tp; r++)
                ok = ok && bt[r]->split_axis == BLOB_AXIS_NONE && bt[r]->size == g->nbytes &&
                     memcmp(bt[r]->data, g->data, g->nbytes) == 0;
        } else {
            uint8_t *re = calloc(1, g->nbytes);
            ok = bt[0]->split_axis == (uint32_t)want_axis && reassemble(bt, tp, re, g->nbytes) &&
                 memcmp(re, g->data, g->nbytes) == 0;
            free(re);
        }
        T_CHECK(ok, "tensor %s (axis %d) does not reassemble to the source bytes", g->name, want_axis);
        n_ok += ok;
    }
    T_CHECK(n_ok == n_copied, "%llu of %llu tensors exact", (unsigned long long)n_ok, (unsigned long long)n_copied);
    T_CHECK(blob_n_tensors(b0) == n_copied + n_kb / 2, "tensor count %llu", (unsigned long long)blob_n_tensors(b0));
    /* kv_b: F32 must equal the dequantized k_b/v_b bit for bit; other types within their error. */
    kv_err = 0;
    for (uint32_t l = 0; l < hp.n_layer; l++) {
        float *want = expected_kv_b(src, &hp, (int)l);
        T_CHECK(want != NULL, "expected kv_b of layer %u", l);
        if (!want) continue;
        char name[64];
        snprintf(name, sizeof name, "blk.%u.attn_kv_b.weight", l);
        const uint64_t rows = (uint64_t)hp.n_head * (hp.qk_nope + hp.v_head), per = rows / tp;
        float *got = malloc(per * hp.kv_lora * sizeof(float));
        int exact = 1;
        for (uint32_t r = 0; r < tp; r++) {
            const blob_tensor *t = blob_find_tensor(blob_set_rank(set, r), name);
            T_CHECK(t && t->type == kvb && t->ne[0] == hp.kv_lora && t->ne[1] == per && t->split_axis == 1 &&
                        t->split_index == r && (t->flags & BLOB_TFLAG_DERIVED),
                    "%s rank %u descriptor", name, r);
            if (!t) continue;
            T_CHECK(quant_dequantize(t->type, t->data, per * hp.kv_lora, got) == G5_OK, "dequantize %s", name);
            const float *w = want + (uint64_t)r * per * hp.kv_lora;
            if (kvb == QT_F32) exact = exact && memcmp(got, w, per * hp.kv_lora * sizeof(float)) == 0;
            for (uint64_t k = 0; k < per * hp.kv_lora; k++) {
                double d = (double)got[k] - w[k];
                if (d < 0) d = -d;
                if (d > kv_err) kv_err = d;
            }
        }
        if (kvb == QT_F32) T_CHECK(exact, "%s is not bit-identical to the rebuilt dequantized k_b/v_b", name);
        free(got);
        free(want);
    }
out:
    blob_set_free(set);
    gguf_free(src);
    return kv_err;
}

/* ---- a small synthetic glm-dsa model written here ---- */

typedef struct mdims {
    uint32_t n_embd, n_head, q_lora, kv_lora, qk_nope, qk_rope, v_head, n_ff, n_ff_exp, n_expert, n_vocab, n_main;
    uint32_t idx_heads, idx_dim, attn_out_type;
    uint64_t seed;
} mdims;

static const mdims k_small = {256, 4, 64, 64, 32, 32, 64, 128, 64, 4, 256, 2, 4, 64, QT_Q8_0, 1};

static int write_model(const char *path, const mdims *d) {
    gguf_writer *w = gguf_writer_create();
    gguf_writer_set_str(w, "general.architecture", "glm-dsa", 7);
#define U(k, v) gguf_writer_set_u32(w, "glm-dsa." k, v)
    U("block_count", d->n_main + 1);
    U("nextn_predict_layers", 1);
    U("embedding_length", d->n_embd);
    U("feed_forward_length", d->n_ff);
    U("expert_feed_forward_length", d->n_ff_exp);
    U("attention.head_count", d->n_head);
    U("attention.head_count_kv", 1);
    U("attention.q_lora_rank", d->q_lora);
    U("attention.kv_lora_rank", d->kv_lora);
    U("rope.dimension_count", d->qk_rope);
    U("attention.key_length_mla", d->qk_nope + d->qk_rope);
    U("attention.value_length_mla", d->v_head);
    U("expert_count", d->n_expert);
    U("expert_used_count", 2);
    U("expert_shared_count", 1);
    U("leading_dense_block_count", 1);
    U("attention.indexer.head_count", d->idx_heads);
    U("attention.indexer.key_length", d->idx_dim);
    U("attention.indexer.top_k", 8);
    U("vocab_size", d->n_vocab);
#undef U
    gguf_writer_set_f32(w, "glm-dsa.attention.layer_norm_rms_epsilon", 1e-5f);
    char (*tok)[16] = malloc(d->n_vocab * sizeof *tok);
    const char **strs = malloc(d->n_vocab * sizeof *strs);
    uint64_t *lens = malloc(d->n_vocab * sizeof *lens);
    for (uint32_t i = 0; i < d->n_vocab; i++) {
        snprintf(tok[i], sizeof tok[i], "t%u", i);
        strs[i] = tok[i];
        lens[i] = strlen(tok[i]);
    }
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", strs, lens, d->n_vocab);
    /* the tokenizer keys the runtime needs (glm5_tokenizer_check), no merges */
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2", 4);
    gguf_writer_set_str(w, "tokenizer.ggml.pre", "glm4", 4);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", NULL, NULL, 0);
    free(tok);
    free(strs);
    free(lens);
    uint8_t *img;
    uint64_t img_len;
    gguf_ctx *meta = NULL;
    glm5_hparams hp;
    int ok = gguf_writer_write_buffer(w, &img, &img_len) == G5_OK &&
             gguf_parse_buffer(img, img_len, "synthetic", &meta, NULL) == G5_OK && glm5_hparams_read(meta, &hp, NULL) == G5_OK;
    uint64_t n = ok ? glm5_n_expected(&hp) : 0, rng = d->seed * 0x9e3779b97f4a7c15ull + 1;
    uint8_t **bufs = calloc(n ? n : 1, sizeof *bufs);
    for (uint64_t i = 0; ok && i < n; i++) {
        glm5_tensor_spec s;
        if (glm5_expected_tensor(&hp, i, &s) || s.optional) continue;
        uint32_t type = s.n_dims == 1 ? QT_F32 : s.role == GLM5_ROLE_ATTN_OUT ? d->attn_out_type : QT_Q8_0;
        const quant_type_info *qi = quant_type_get(type);
        uint64_t n_blocks = s.ne[0] * s.ne[1] * s.ne[2] * s.ne[3] / qi->block_elems;
        bufs[i] = malloc(n_blocks * qi->block_bytes);
        ok = quant_fill_random(type, bufs[i], n_blocks, &rng) == G5_OK &&
             gguf_writer_add_tensor(w, s.name, type, s.n_dims, s.ne, bufs[i], NULL) == G5_OK;
    }
    g5_error e;
    ok = ok && gguf_writer_write_file(w, path, NULL, NULL, &e) == G5_OK;
    for (uint64_t i = 0; i < n; i++) free(bufs[i]);
    free(bufs);
    gguf_free(meta);
    free(img);
    gguf_writer_free(w);
    T_CHECK(ok, "synthetic model %s written", path);
    return ok;
}

/* ---- the tests ---- */

static void test_oracle_sets(void) {
    const char *model = T_ORACLE_GGUF;
    const struct { uint32_t tp; int ep; } cases[] = {{1, 0}, {2, 0}, {2, 1}, {4, 1}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char dir[2048];
        snprintf(dir, sizeof dir, "%s/oracle-t%u%s", g_tmp, cases[k].tp, cases[k].ep ? "-ep" : "");
        g5_error e;
        convert_result *res = NULL;
        g5_status st = convert(model, dir, cases[k].tp, cases[k].ep, QT_F32, &res, &e);
        T_CHECK(st == G5_OK, "convert T=%u ep=%d: %s", cases[k].tp, cases[k].ep, e.msg);
        if (st) continue;
        T_CHECK(res->n_ranks_written == cases[k].tp && res->kv_b_max_abs_err == 0 && res->kv_b_max_abs > 0,
                "result: %u ranks, kv_b err %g", res->n_ranks_written, res->kv_b_max_abs_err);
        convert_result_free(res);
        double err = check_set(model, dir, cases[k].tp, cases[k].ep, QT_F32);
        T_CHECK(err == 0, "kv_b F32 error %g", err);
        convert_verify_result *vr = NULL;
        st = verify(dir, model, &vr, &e);
        T_CHECK(st == G5_OK && vr && vr->ok, "verify --deep T=%u: %s", cases[k].tp, e.msg);
        for (uint32_t r = 0; vr && r < vr->n_ranks; r++)
            T_CHECK(vr->ranks[r].n_deep_checked == vr->ranks[r].n_tensors && vr->ranks[r].n_deep_bad == 0 &&
                        vr->ranks[r].kv_b_max_abs_err == 0,
                    "rank %u deep", r);
        convert_verify_result_free(vr);
        if (!(cases[k].tp == 2 && !cases[k].ep)) t_rmtree(dir); /* oracle-t2 is the reference later */
    }
}

static void test_kv_b_types(void) {
    const char *model = T_ORACLE_GGUF;
    const uint32_t types[] = {QT_BF16, QT_F16, QT_Q8_0};
    for (size_t k = 0; k < 3; k++) {
        char dir[2048];
        snprintf(dir, sizeof dir, "%s/kvb-%s", g_tmp, quant_type_name(types[k]));
        g5_error e;
        convert_result *res = NULL;
        T_CHECK(convert(model, dir, 2, 0, types[k], &res, &e) == G5_OK, "convert kv_b %s: %s", quant_type_name(types[k]), e.msg);
        if (!res) continue;
        const double mx = res->kv_b_max_abs;
        /* bounds from the formats: bf16 8 significant bits, f16 11, q8_0 half a step of amax/127 */
        const double bound = types[k] == QT_BF16 ? mx / 256 : types[k] == QT_F16 ? mx / 2048 : mx / 254 * 1.01;
        T_CHECK(res->kv_b_max_abs_err > 0 && res->kv_b_max_abs_err <= bound, "%s: max error %g, bound %g",
                quant_type_name(types[k]), res->kv_b_max_abs_err, bound);
        double err = check_set(model, dir, 2, 0, types[k]);
        T_CHECK(err == res->kv_b_max_abs_err, "%s: reported error %g, measured here %g", quant_type_name(types[k]),
                res->kv_b_max_abs_err, err);
        convert_result_free(res);
        convert_verify_result *vr = NULL;
        T_CHECK(verify(dir, model, &vr, &e) == G5_OK, "deep verify kv_b %s: %s", quant_type_name(types[k]), e.msg);
        convert_verify_result_free(vr);
        t_rmtree(dir);
    }
}

/* A set as converter 1.0 wrote it (attn_k_b/attn_v_b not carried; the test hook): version 1.0.0
 * in its headers, 90 tensors, kv_b bytes those of the 1.1 set; it verifies, deep included
 * (verify plans it as 1.0 did), and --resume over it gives the 1.1 set byte for byte. */
static void test_legacy_set(void) {
    const char *model = T_ORACLE_GGUF;
    char dir[4200], ref[4200];
    snprintf(dir, sizeof dir, "%s/legacy-1.0", g_tmp);
    snprintf(ref, sizeof ref, "%s/oracle-t2", g_tmp); /* the 1.1 set of test_oracle_sets */
    convert_options o;
    convert_options_init(&o);
    o.tp = 2;
    const convert_test_hooks legacy = {.legacy_1_0 = 1};
    convert_result *res = NULL;
    g5_error e;
    g5_status st = convert_run_hooked(model, dir, &o, &legacy, &res, &e);
    T_CHECK(st == G5_OK && res && res->n_tensors_out == 90, "legacy convert: %s", e.msg);
    convert_result_free(res);
    blob_set *s = NULL, *s11 = NULL;
    T_CHECK(blob_set_open(dir, &s, &e) == G5_OK, "legacy set opens: %s", e.msg);
    T_CHECK(blob_set_open(ref, &s11, &e) == G5_OK, "1.1 set opens: %s", e.msg);
    if (s && s11) {
        const blob *b = blob_set_rank(s, 1), *b11 = blob_set_rank(s11, 1);
        T_CHECK(blob_get_info(b)->converter_version == CONVERT_VERSION_1_0 &&
                    blob_get_info(b11)->converter_version == CONVERT_VERSION && blob_n_tensors(b) == 90 &&
                    !blob_find_tensor(b, "blk.0.attn_k_b.weight") && blob_find_tensor(b11, "blk.0.attn_k_b.weight"),
                "legacy set: version %#x, %llu tensors, no attn_k_b", blob_get_info(b)->converter_version,
                (unsigned long long)blob_n_tensors(b));
        const blob_tensor *k = blob_find_tensor(b, "blk.2.attn_kv_b.weight"), *k11 = blob_find_tensor(b11, "blk.2.attn_kv_b.weight");
        T_CHECK(k && k11 && k->size == k11->size && memcmp(k->data, k11->data, k->size) == 0,
                "kv_b of the legacy set equals the 1.1 set's");
    }
    blob_set_free(s);
    blob_set_free(s11);
    convert_verify_result *vr = NULL;
    st = verify(dir, NULL, &vr, &e);
    T_CHECK(st == G5_OK && vr && vr->ok, "legacy set verifies: %s", e.msg);
    convert_verify_result_free(vr);
    vr = NULL;
    st = verify(dir, model, &vr, &e);
    T_CHECK(st == G5_OK && vr && vr->ok && vr->ranks[0].n_deep_checked == 90 && vr->ranks[0].n_deep_bad == 0,
            "legacy set verifies --deep against its own plan: %s", e.msg);
    convert_verify_result_free(vr);
    /* converting over it with --resume rewrites every rank as 1.1: the result is the 1.1 set */
    o.resume = 1;
    res = NULL;
    st = convert_run(model, dir, &o, &res, &e);
    T_CHECK(st == G5_OK && res && res->n_ranks_written == 2, "resume over a 1.0 set: %s", e.msg);
    convert_result_free(res);
    T_CHECK(st != G5_OK || dirs_equal(dir, ref, 2), "resumed over a 1.0 set: the 1.1 set byte for byte");
    t_rmtree(dir);
}

static void test_refusals(void) {
    g5_error e;
    convert_result *res = NULL;
    char dir[4200];
    /* The oracle at T = 4: ffn_down_exps (Q5_K) ne[0] = 512 -> 128-column slices. */
    snprintf(dir, sizeof dir, "%s/refused-t4", g_tmp);
    g5_status st = convert(T_ORACLE_GGUF, dir, 4, 0, QT_F32, &res, &e);
    T_CHECK(st == G5_ERR_SHARDING, "T=4 refused: %s", g5_strerror(st));
    T_CHECK(strstr(e.msg, "ffn_down_exps") && strstr(e.msg, "Q5_K") && strstr(e.msg, "256") &&
                strstr(e.msg, "128") && strstr(e.msg, "--ep") && strstr(e.msg, "{1, 2}"),
            "message: %s", e.msg);
    T_CHECK(access(dir, F_OK) != 0, "nothing written on refusal");
    convert_result_free(res);
    res = NULL;
    /* T = 8: 4 heads do not divide. */
    st = convert(T_ORACLE_GGUF, dir, 8, 1, QT_F32, &res, &e);
    T_CHECK(st == G5_ERR_SHARDING && strstr(e.msg, "heads") && strstr(e.msg, "8 ranks"), "T=8: %s", e.msg);
    T_CHECK(access(dir, F_OK) != 0, "nothing written on refusal");
    convert_result_free(res);
    res = NULL;
    /* Synthetic: attn_output Q4_K with ne[0] = 4 heads x 64 = 256, T = 2 -> 128 columns. */
    mdims d = k_small;
    d.attn_out_type = QT_Q4_K;
    char model[4200];
    snprintf(model, sizeof model, "%s/misaligned.gguf", g_tmp);
    if (!write_model(model, &d)) return;
    uint8_t h0[16], h1[16];
    file_hash(model, h0);
    st = convert(model, dir, 2, 0, QT_F32, &res, &e);
    T_CHECK(st == G5_ERR_SHARDING && strstr(e.msg, "blk.0.attn_output.weight") && strstr(e.msg, "Q4_K") &&
                strstr(e.msg, "block size 256") && strstr(e.msg, "128 columns") && strstr(e.msg, "T in {1}"),
            "misaligned: %s", e.msg);
    T_CHECK(access(dir, F_OK) != 0, "nothing written on refusal");
    convert_result_free(res);
    res = NULL;
    /* A dry run of the same model at T = 1 plans without writing. */
    convert_options o;
    convert_options_init(&o);
    o.tp = 1;
    o.dry_run = 1;
    st = convert_run(model, dir, &o, &res, &e);
    T_CHECK(st == G5_OK && res && res->plan && res->plan->n_tensors > 0 && res->bytes_written == 0, "dry run: %s", e.msg);
    T_CHECK(access(dir, F_OK) != 0, "dry run writes nothing");
    if (res && res->plan) {
        char line[512];
        shard_format_tensor(res->plan, 0, line, sizeof line);
        T_CHECK(strstr(line, res->plan->tensors[0].name) != NULL, "plan line: %s", line);
        char *j = convert_result_json(res, 1);
        T_CHECK(j && strstr(j, "\"plan\"") && strstr(j, "bytes_per_rank"), "json plan");
        free(j);
    }
    convert_result_free(res);
    file_hash(model, h1);
    T_CHECK(memcmp(h0, h1, 16) == 0, "source untouched");
    /* Bad options. */
    st = convert(T_ORACLE_GGUF, dir, 2, 0, QT_Q4_K, NULL, &e);
    T_CHECK(st == G5_ERR_INVALID_ARG && strstr(e.msg, "kv_b"), "kv_b Q4_K refused: %s", e.msg);
    st = convert(T_ORACLE_GGUF, dir, 0, 0, QT_F32, NULL, &e);
    T_CHECK(st == G5_ERR_INVALID_ARG, "T=0 refused");
}

/* Which part of a blob a byte belongs to, from the header fields (spec offsets). */
static const char *region_word(const uint8_t *img, uint64_t pos, const blob *b) {
    if (pos < 320) return "header";
    const struct { int off, size; const char *w; } s[] = {
        {88, 96, "source table"}, {104, 112, "tensor table"}, {120, 128, "chunk table"},
        {136, 144, "strings"}, {152, 160, "metadata"}};
    for (int k = 0; k < 5; k++) {
        uint64_t o = g5_rd_u64(img + s[k].off), n = g5_rd_u64(img + s[k].size);
        if (pos >= o && pos < o + n) return s[k].w;
    }
    if (pos < g5_rd_u64(img + 176)) return "padding";
    for (uint64_t i = 0; i < blob_n_tensors(b); i++) {
        const blob_tensor *t = blob_get_tensor(b, i);
        if (pos >= t->offset && pos < t->offset + t->size) return t->name;
    }
    return "chunk";
}

static void test_corruption(void) {
    char model[4200], model2[4200], dir[4200], dir2[4200];
    snprintf(model, sizeof model, "%s/small.gguf", g_tmp);
    snprintf(model2, sizeof model2, "%s/small2.gguf", g_tmp);
    snprintf(dir, sizeof dir, "%s/small-t2", g_tmp);
    snprintf(dir2, sizeof dir2, "%s/small2-t2", g_tmp);
    mdims d2 = k_small;
    d2.seed = 2;
    if (!write_model(model, &k_small) || !write_model(model2, &d2)) return;
    g5_error e;
    T_CHECK(convert(model, dir, 2, 0, QT_F32, NULL, &e) == G5_OK, "convert small: %s", e.msg);
    T_CHECK(convert(model2, dir2, 2, 0, QT_F32, NULL, &e) == G5_OK, "convert small2: %s", e.msg);
    check_set(model, dir, 2, 0, QT_F32);
    convert_verify_result *vr = NULL;
    T_CHECK(verify(dir, model, &vr, &e) == G5_OK, "verify small: %s", e.msg);
    convert_verify_result_free(vr);

    /* >= 200 single-byte flips over header, tables, strings, metadata and data of both ranks. */
    uint64_t n_flips = 0, n_failed = 0, n_named = 0;
    for (uint32_t r = 0; r < 2; r++) {
        const char *rf = rank_file(dir, r, 2);
        char rfn[64];
        blob_rank_filename(r, 2, rfn, sizeof rfn);
        size_t len;
        uint8_t *img = t_read_file(rf, &len);
        blob *pristine = NULL;
        T_CHECK(img && blob_parse_buffer(img, len, "pristine", 0, &pristine, &e) == G5_OK, "pristine");
        if (!pristine) {
            free(img);
            continue;
        }
        const uint64_t data_off = g5_rd_u64(img + 176);
        uint64_t positions[160], np = 0, x = 12345 + r;
        for (int k = 0; k < 25; k++) positions[np++] = (uint64_t)k * 13 % 320;                     /* header */
        for (int k = 0; k < 55; k++) x = x * 6364136223846793005ull + 1, positions[np++] = 320 + (x >> 33) % (data_off - 320);
        for (int k = 0; k < 30; k++) x = x * 6364136223846793005ull + 1, positions[np++] = data_off + (x >> 33) % (len - data_off);
        for (uint64_t k = 0; k < np; k++) {
            const uint64_t pos = positions[k];
            const char *want = region_word(img, pos, pristine);
            img[pos] ^= 0x40;
            t_write_file(rf, img, len);
            img[pos] ^= 0x40;
            g5_status st = verify(dir, NULL, &vr, &e);
            n_flips++;
            n_failed += st != G5_OK && vr && !vr->ok;
            /* The first finding names the file, and the region, tensor or (for padding) chunk;
             * a flip in the padding between sections fails the structural check "padding". */
            int named = vr && vr->n_findings_stored > 0 && strstr(vr->findings[0].msg, rfn) &&
                        (strstr(vr->findings[0].msg, want) ||
                         (strcmp(want, "header") == 0 && strstr(vr->findings[0].msg, "header")));
            if (!named && n_named + 5 > n_flips) /* show the first few misses */
                printf("flip at %llu (%s): %s\n", (unsigned long long)pos, want, vr && vr->n_findings_stored ? vr->findings[0].msg : "-");
            n_named += named;
            convert_verify_result_free(vr);
            vr = NULL;
        }
        t_write_file(rf, img, len);
        blob_free(pristine);
        free(img);
    }
    T_CHECK(n_flips >= 200 && n_failed == n_flips && n_named == n_flips, "flips: %llu, failed %llu, named %llu",
            (unsigned long long)n_flips, (unsigned long long)n_failed, (unsigned long long)n_named);
    T_CHECK(verify(dir, NULL, NULL, &e) == G5_OK, "restored set verifies: %s", e.msg);

    /* Truncated rank. */
    size_t len;
    uint8_t *img = t_read_file(rank_file(dir, 1, 2), &len);
    t_write_file(rank_file(dir, 1, 2), img, len - 1);
    g5_status st = verify(dir, NULL, NULL, &e);
    T_CHECK(st == G5_ERR_TRUNCATED && strstr(e.msg, "truncated"), "truncated: %s", e.msg);
    t_write_file(rank_file(dir, 1, 2), img, len / 2);
    st = verify(dir, NULL, NULL, &e);
    T_CHECK(st == G5_ERR_TRUNCATED, "half file: %s", e.msg);
    /* Rank 0's file in rank 1's place. */
    copy_file(rank_file(dir, 0, 2), rank_file(dir, 1, 2));
    st = verify(dir, NULL, NULL, &e);
    T_CHECK(st == G5_ERR_MISMATCH && strstr(e.msg, "holds rank 0"), "other rank: %s", e.msg);
    /* Rank 1 from another source. */
    copy_file(rank_file(dir2, 1, 2), rank_file(dir, 1, 2));
    st = verify(dir, NULL, NULL, &e);
    T_CHECK(st == G5_ERR_MISMATCH && strstr(e.msg, "belongs to set"), "other source: %s", e.msg);
    t_write_file(rank_file(dir, 1, 2), img, len);
    free(img);
    T_CHECK(verify(dir, NULL, NULL, &e) == G5_OK, "restored: %s", e.msg);
    /* --deep against the wrong source. */
    st = verify(dir, model2, NULL, &e);
    T_CHECK(st == G5_ERR_MISMATCH && strstr(e.msg, "not the source"), "deep wrong source: %s", e.msg);
    /* Missing rank, missing record. */
    rename(rank_file(dir, 1, 2), path2(g_tmp, "r1.keep"));
    st = verify(dir, NULL, NULL, &e);
    T_CHECK(st == G5_ERR_IO && strstr(e.msg, "rank-00001-of-00002.g5b"), "missing rank: %s", e.msg);
    rename(path2(g_tmp, "r1.keep"), rank_file(dir, 1, 2));
    rename(path2(dir, BLOB_SET_RECORD), path2(g_tmp, "rec.keep"));
    st = verify(dir, NULL, &vr, &e);
    T_CHECK(st == G5_ERR_NOT_FOUND && strstr(e.msg, "set record") && vr && vr->n_ranks == 2 && vr->ranks[1].opened,
            "missing record: %s", e.msg);
    convert_verify_result_free(vr);
    rename(path2(g_tmp, "rec.keep"), path2(dir, BLOB_SET_RECORD));
    T_CHECK(verify(dir, NULL, NULL, &e) == G5_OK, "restored: %s", e.msg);
}

static void kill_after(void *user, const convert_progress *p) {
    if (p->phase == CONVERT_PHASE_WRITE && p->bytes_done > *(uint64_t *)user) raise(SIGKILL);
}

static void test_interruption(void) {
    const char *model = T_ORACLE_GGUF;
    char ref[4200], dir[4200], dir2[4200];
    snprintf(ref, sizeof ref, "%s/oracle-t2", g_tmp); /* written uninterrupted by test_oracle_sets */
    snprintf(dir, sizeof dir, "%s/interrupted", g_tmp);
    snprintf(dir2, sizeof dir2, "%s/killed", g_tmp);
    g5_error e;
    convert_options o;
    convert_options_init(&o);
    o.tp = 2;
    const convert_test_hooks crash = {.stop_after_bytes = 9 << 20};
    convert_result *res = NULL;
    g5_status st = convert_run_hooked(model, dir, &o, &crash, &res, &e);
    T_CHECK(st == G5_ERR_INTERNAL && strstr(e.msg, "test hook"), "stopped: %s", e.msg);
    convert_result_free(res);
    T_CHECK(verify(dir, NULL, NULL, &e) != G5_OK, "an interrupted conversion does not verify");
    blob_set *s = NULL;
    T_CHECK(blob_set_open(dir, &s, &e) != G5_OK, "nor open as a set");
    blob_set_free(s);
    T_CHECK(access(path2(dir, "rank-00000-of-00002.g5b.tmp"), F_OK) == 0, "temporary files left as by a crash");
    o.resume = 1;
    res = NULL;
    st = convert_run(model, dir, &o, &res, &e);
    T_CHECK(st == G5_OK && res && res->n_ranks_written == 2, "resume: %s", e.msg);
    convert_result_free(res);
    T_CHECK(dirs_equal(dir, ref, 2), "resumed result equals an uninterrupted run byte for byte");

    /* A killed child process. */
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        uint64_t after = 8 << 20;
        convert_options c;
        convert_options_init(&c);
        c.tp = 2;
        c.progress = kill_after;
        c.progress_user = &after;
        c.progress_interval_s = 0;
        convert_run(model, dir2, &c, NULL, NULL);
        _exit(0); /* not reached if the kill fired */
    }
    int status = 0;
    waitpid(pid, &status, 0);
    T_CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "child killed mid-conversion");
    T_CHECK(verify(dir2, NULL, NULL, &e) != G5_OK, "a killed conversion does not verify");
    res = NULL;
    st = convert_run(model, dir2, &o, &res, &e);
    T_CHECK(st == G5_OK, "resume after kill: %s", e.msg);
    convert_result_free(res);
    T_CHECK(dirs_equal(dir2, ref, 2), "resumed after kill equals an uninterrupted run");

    /* Resume keeps ranks that verify and redoes the rest. */
    unlink(rank_file(dir2, 1, 2));
    unlink(path2(dir2, BLOB_SET_RECORD));
    res = NULL;
    st = convert_run(model, dir2, &o, &res, &e);
    T_CHECK(st == G5_OK && res && res->n_ranks_reused == 1 && res->ranks[0].reused && !res->ranks[1].reused,
            "resume reuses rank 0: %s", e.msg);
    convert_result_free(res);
    T_CHECK(dirs_equal(dir2, ref, 2), "equal after partial resume");
    size_t len;
    uint8_t *img = t_read_file(rank_file(dir2, 0, 2), &len);
    img[len - 100] ^= 1;
    t_write_file(rank_file(dir2, 0, 2), img, len);
    free(img);
    res = NULL;
    st = convert_run(model, dir2, &o, &res, &e);
    T_CHECK(st == G5_OK && res && !res->ranks[0].reused && res->ranks[1].reused, "a damaged rank is redone: %s", e.msg);
    convert_result_free(res);
    T_CHECK(dirs_equal(dir2, ref, 2), "equal after repairing resume");
    /* Without --resume an existing set is refused (untouched); --force rewrites it, not trusted. */
    o.resume = 0;
    res = NULL;
    st = convert_run(model, dir2, &o, &res, &e);
    T_CHECK(st == G5_ERR_EXISTS && strstr(e.msg, "--force"), "plain rerun refused: %s", e.msg);
    convert_result_free(res);
    T_CHECK(dirs_equal(dir2, ref, 2), "refused rerun leaves the set");
    o.force = 1;
    res = NULL;
    st = convert_run(model, dir2, &o, &res, &e);
    o.force = 0;
    T_CHECK(st == G5_OK && res && res->n_ranks_reused == 0, "--force rerun rewrites");
    convert_result_free(res);
    T_CHECK(dirs_equal(dir2, ref, 2), "rerun is deterministic");
}

static void test_split_sets(void) {
    synth_opts so;
    synth_opts_init(&so);
    char one[4200], split[4200], d1[4200], d2[4200], d3[4200];
    snprintf(one, sizeof one, "%s/synth-one.gguf", g_tmp);
    snprintf(split, sizeof split, "%s/synth-split.gguf", g_tmp);
    snprintf(d1, sizeof d1, "%s/synth-one-t2", g_tmp);
    snprintf(d2, sizeof d2, "%s/synth-split-t2", g_tmp);
    snprintf(d3, sizeof d3, "%s/synth-split-t2-b", g_tmp);
    g5_error e;
    synth_result r1, r2;
    T_CHECK(synth_write(&so, one, &r1, &e) == G5_OK, "synth one: %s", e.msg);
    so.split_size = 6 << 20;
    T_CHECK(synth_write(&so, split, &r2, &e) == G5_OK && r2.n_files >= 3, "synth split: %s (%u files)", e.msg, r2.n_files);
    convert_result *a = NULL, *b = NULL, *c = NULL;
    T_CHECK(convert(one, d1, 2, 0, QT_F32, &a, &e) == G5_OK, "convert one: %s", e.msg);
    T_CHECK(convert(r2.first_path, d2, 2, 0, QT_F32, &b, &e) == G5_OK, "convert split: %s", e.msg);
    char second[4200];
    synth_split_path(split, 1, r2.n_files, second, sizeof second);
    T_CHECK(convert(second, d3, 2, 0, QT_F32, &c, &e) == G5_OK, "convert from split 2: %s", e.msg);
    if (!a || !b || !c) goto out;
    T_CHECK(b->n_sources == r2.n_files && a->n_sources == 1, "sources recorded");
    T_CHECK(memcmp(b->set_id, c->set_id, 16) == 0 && dirs_equal(d2, d3, 2), "any split of a set gives the same blobs");
    T_CHECK(memcmp(a->set_id, b->set_id, 16) != 0, "a different source layout is a different set");
    check_set(r2.first_path, d2, 2, 0, QT_F32);
    for (uint32_t r = 0; r < 2; r++) {
        blob *x = NULL, *y = NULL;
        T_CHECK(blob_open(rank_file(d1, r, 2), &x, &e) == G5_OK && blob_open(rank_file(d2, r, 2), &y, &e) == G5_OK, "open");
        if (x && y) {
            const blob_info *ix = blob_get_info(x), *iy = blob_get_info(y);
            uint64_t lx, ly;
            const uint8_t *bx = blob_get_bytes(x, &lx), *by = blob_get_bytes(y, &ly);
            T_CHECK(ix->data_size == iy->data_size &&
                        memcmp(bx + ix->data_offset, by + iy->data_offset, ix->data_size) == 0,
                    "rank %u: data regions identical", r);
            T_CHECK(memcmp(ix->meta_hash, iy->meta_hash, 16) == 0, "rank %u: metadata identical", r);
            int same = blob_n_tensors(x) == blob_n_tensors(y);
            for (uint64_t i = 0; same && i < blob_n_tensors(x); i++) {
                const blob_tensor *s = blob_get_tensor(x, i), *t = blob_get_tensor(y, i);
                same = strcmp(s->name, t->name) == 0 && s->type == t->type && memcmp(s->ne, t->ne, sizeof s->ne) == 0 &&
                       s->offset - ix->data_offset == t->offset - iy->data_offset && memcmp(s->hash, t->hash, 16) == 0;
            }
            T_CHECK(same, "rank %u: tensor tables identical", r);
        }
        blob_free(x);
        blob_free(y);
    }
out:
    convert_result_free(a);
    convert_result_free(b);
    convert_result_free(c);
}

static void test_output_failures(void) {
    char model[4200], dir[4200];
    snprintf(model, sizeof model, "%s/small.gguf", g_tmp); /* from test_corruption */
    snprintf(dir, sizeof dir, "%s/full", g_tmp);
    uint8_t h0[16], h1[16];
    file_hash(model, h0);
    g5_error e;
    /* An injected full disk (convert/convert_test.h). */
    convert_options fo;
    convert_options_init(&fo);
    fo.tp = 2;
    fo.jobs = 2;
    const convert_test_hooks full = {.fail_write_after_bytes = 100000};
    g5_status st = convert_run_hooked(model, dir, &fo, &full, NULL, &e);
    T_CHECK(st == G5_ERR_IO && strstr(e.msg, "No space left on device") && strstr(e.msg, ".g5b.tmp"), "full: %s", e.msg);
    T_CHECK(n_dir_entries(dir) == 0, "nothing left in the output directory (%d entries)", n_dir_entries(dir));
    T_CHECK(verify(dir, NULL, NULL, &e) != G5_OK, "nothing verifies");
    /* A full disk during a --resume over a complete set: the old set record is gone first. */
    char good[4200];
    snprintf(good, sizeof good, "%s/small-t2", g_tmp);
    convert_options o;
    convert_options_init(&o);
    o.tp = 2;
    o.force = 1;
    st = convert_run_hooked(model, good, &o, &full, NULL, &e);
    T_CHECK(st == G5_ERR_IO, "full over an old set: %s", e.msg);
    T_CHECK(n_dir_entries(good) == 0, "--force removed the old set first; the failed new one left nothing (%d entries)",
            n_dir_entries(good));
    T_CHECK(verify(good, NULL, NULL, &e) != G5_OK, "the old set no longer verifies as a set");
    /* A directory where nothing can be created. */
    char ro[4200];
    int skip = 0;
    if (geteuid() != 0) {
        snprintf(ro, sizeof ro, "%s/readonly", g_tmp);
        mkdir(ro, 0555);
        chmod(ro, 0555);
    } else if (access("/sys", F_OK) == 0) {
        snprintf(ro, sizeof ro, "/sys"); /* root ignores modes; sysfs refuses new files */
    } else {
        skip = 1;
    }
    if (!skip) {
        st = convert(model, ro, 2, 0, QT_F32, NULL, &e);
        T_CHECK(st == G5_ERR_IO && (strstr(e.msg, "Permission denied") || strstr(e.msg, "not permitted") ||
                                    strstr(e.msg, "Read-only")),
                "read-only: %s", e.msg);
        T_CHECK(access(path2(ro, "rank-00000-of-00002.g5b.tmp"), F_OK) != 0 &&
                    access(path2(ro, "rank-00000-of-00002.g5b"), F_OK) != 0,
                "nothing created");
        if (geteuid() != 0) chmod(ro, 0755);
    } else {
        printf("note: no read-only directory available; read-only case skipped\n");
    }
    file_hash(model, h1);
    T_CHECK(memcmp(h0, h1, 16) == 0, "source untouched");
}

int main(void) {
    g_tmp = t_tmpdir();
    if (access(T_ORACLE_GGUF, R_OK) != 0) {
        printf("oracle GGUF not found at %s\n", T_ORACLE_GGUF);
        T_CHECK(0, "oracle present");
        return t_report("test_convert");
    }
    test_oracle_sets();
    test_kv_b_types();
    test_legacy_set();
    test_refusals();
    test_corruption();
    test_interruption();
    test_split_sets();
    test_output_failures();
    t_rmtree(g_tmp);
    return t_report("test_convert");
}
