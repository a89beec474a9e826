/* The GGUF reader against the oracle: glm5-tiny written by llama.cpp, and gguf-py's independent
 * account of every tensor in dequant_reference.json (type name, ne, absolute byte offset of the
 * data from the start of the file, byte size). */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "format/gguf.h"
#include "format/quant.h"
#include "tests/test_util.h"

static void check_tensors(const gguf_ctx *c, json_t *root) {
    json_t *ts = json_object_get(root, "tensors");
    T_CHECK(json_is_array(ts), "dequant_reference.json has a tensors array");
    if (!json_is_array(ts)) return;
    T_CHECK(json_array_size(ts) == 94, "reference lists 94 tensors (%zu)", json_array_size(ts));
    T_CHECK(json_integer_value(json_object_get(root, "n_tensors")) == gguf_get_n_tensors(c),
            "n_tensors agrees with the reference");
    uint64_t data_off = gguf_get_split_data_offset(c, 0);
    size_t i;
    json_t *jt;
    int n_checked = 0;
    json_array_foreach(ts, i, jt) {
        const char *name = json_string_value(json_object_get(jt, "name"));
        const char *type = json_string_value(json_object_get(jt, "type"));
        json_t *ne = json_object_get(jt, "ne");
        json_int_t off = json_integer_value(json_object_get(jt, "offset"));
        json_int_t nbytes = json_integer_value(json_object_get(jt, "nbytes"));
        if (!name || !type || !json_is_array(ne)) {
            T_CHECK(0, "reference entry %zu malformed", i);
            continue;
        }
        const gguf_tensor *t = gguf_find_tensor(c, name);
        T_CHECK(t != NULL, "tensor %s present", name);
        if (!t) continue;
        T_CHECK(strcmp(quant_type_name(t->type), type) == 0, "%s: type %s, reference %s", name,
                quant_type_name(t->type), type);
        T_CHECK(t->n_dims == json_array_size(ne), "%s: n_dims %u, reference %zu", name, t->n_dims,
                json_array_size(ne));
        for (size_t d = 0; d < json_array_size(ne) && d < GGUF_MAX_DIMS; d++)
            T_CHECK((json_int_t)t->ne[d] == json_integer_value(json_array_get(ne, d)),
                    "%s: ne[%zu]", name, d);
        /* the reference's offset is absolute in the file */
        T_CHECK((json_int_t)t->file_offset == off && (json_int_t)(data_off + t->offset) == off,
                "%s: offset %llu (+%llu), reference %lld", name,
                (unsigned long long)t->file_offset, (unsigned long long)t->offset, (long long)off);
        T_CHECK((json_int_t)t->nbytes == nbytes, "%s: nbytes %llu, reference %lld", name,
                (unsigned long long)t->nbytes, (long long)nbytes);
        T_CHECK(t->data == gguf_get_split_bytes(c, 0) + off, "%s: data pointer", name);
        n_checked++;
    }
    T_CHECK(n_checked == 94, "checked %d tensors", n_checked);
}

static void check_metadata(const gguf_ctx *c, json_t *root) {
    g5_error e;
    json_t *md = json_object_get(root, "metadata");
    T_CHECK(gguf_get_version(c) == json_integer_value(json_object_get(md, "GGUF.version")),
            "version");
    T_CHECK(gguf_get_n_kv(c) == json_integer_value(json_object_get(md, "GGUF.kv_count")),
            "kv count %lld", (long long)gguf_get_n_kv(c));
    T_CHECK(gguf_get_alignment(c) == 32, "default alignment");
    T_CHECK(gguf_get_split_data_offset(c, 0) % 32 == 0, "data section aligned");

    uint32_t u;
    T_CHECK(gguf_get_u32(c, "glm-dsa.block_count", &u, &e) == G5_OK && u == 4, "block_count");
    T_CHECK(gguf_get_u32(c, "glm-dsa.attention.indexer.top_k", &u, &e) == G5_OK &&
                (json_int_t)u ==
                    json_integer_value(json_object_get(md, "glm-dsa.attention.indexer.top_k")),
            "indexer top_k");
    const char *s;
    uint64_t len;
    T_CHECK(gguf_get_str(c, "general.architecture", &s, &len, &e) == G5_OK && len == 7 &&
                memcmp(s, "glm-dsa", 7) == 0,
            "architecture");
    double f;
    T_CHECK(gguf_get_float(c, "glm-dsa.expert_weights_scale", &f, &e) == G5_OK &&
                f == json_real_value(json_object_get(md, "glm-dsa.expert_weights_scale")),
            "expert_weights_scale");
    int b;
    T_CHECK(gguf_get_bool(c, "glm-dsa.expert_weights_norm", &b, &e) == G5_OK && b == 1,
            "expert_weights_norm");

    gguf_vtype et;
    uint64_t n;
    T_CHECK(gguf_get_arr(c, "tokenizer.ggml.tokens", &et, &n, &e) == G5_OK &&
                et == GGUF_VT_STRING && n == 2048,
            "2048 token strings");
    T_CHECK(gguf_get_arr(c, "tokenizer.ggml.merges", &et, &n, &e) == G5_OK &&
                et == GGUF_VT_STRING && n == 1767,
            "1767 merges");
    T_CHECK(gguf_get_arr(c, "glm-dsa.attention.indexer.types", &et, &n, &e) == G5_OK &&
                et == GGUF_VT_BOOL && n == 3,
            "indexer.types is a bool[3]");
    const void *data;
    T_CHECK(gguf_get_arr_data(c, "glm-dsa.attention.indexer.types", &data, &e) == G5_OK &&
                memcmp(data, "\1\1\1", 3) == 0,
            "indexer.types all true");
    T_CHECK(gguf_get_arr(c, "tokenizer.ggml.token_type", &et, &n, &e) == G5_OK &&
                et == GGUF_VT_INT32 && n == 2048,
            "token_type i32[2048]");

    /* token strings against the HF tokenizer's vocabulary (tokenizer.json, model.vocab) */
    json_error_t je;
    json_t *tok = json_load_file(t_shared("oracle/glm5-tiny/tokenizer.json"), 0, &je);
    json_t *vocab = json_object_get(json_object_get(tok, "model"), "vocab");
    T_CHECK(json_is_object(vocab), "tokenizer.json vocab: %s", tok ? "present" : je.text);
    if (json_is_object(vocab)) {
        int checked = 0, bad = 0;
        const char *key;
        json_t *val;
        json_object_foreach(vocab, key, val) {
            json_int_t id = json_integer_value(val);
            if (id < 0 || id >= 2048) continue;
            if (gguf_get_arr_str(c, "tokenizer.ggml.tokens", (uint64_t)id, &s, &len, &e) != G5_OK ||
                len != strlen(key) || memcmp(s, key, len) != 0)
                bad++;
            checked++;
        }
        T_CHECK(checked > 1000 && bad == 0, "%d of %d vocab strings differ", bad, checked);
    }
    json_decref(tok);

    /* kv bytes end where the first tensor info (output.weight) begins */
    uint64_t kvlen;
    const uint8_t *kv = gguf_get_kv_bytes(c, &kvlen);
    const uint8_t *img = gguf_get_split_bytes(c, 0);
    T_CHECK(kv == img + 24 && g5_rd_u64(kv + kvlen) == strlen(gguf_get_tensor(c, 0)->name) &&
                memcmp(kv + kvlen + 8, gguf_get_tensor(c, 0)->name,
                       strlen(gguf_get_tensor(c, 0)->name)) == 0,
            "kv section bounds");
}

int main(void) {
    gguf_ctx *c = NULL;
    g5_error e;
    g5_status st = gguf_open(T_ORACLE_GGUF, &c, &e);
    T_CHECK(st == G5_OK, "open %s: %s", T_ORACLE_GGUF, e.msg);
    if (!c) return t_report("test_oracle_gguf");
    T_CHECK(gguf_get_n_tensors(c) == 94, "94 tensors (%lld)", (long long)gguf_get_n_tensors(c));
    T_CHECK(gguf_get_n_splits(c) == 1, "one file");
    json_error_t je;
    json_t *root = json_load_file(t_shared("oracle/glm5-tiny/dequant_reference.json"), 0, &je);
    T_CHECK(root != NULL, "load dequant_reference.json: %s", root ? "" : je.text);
    if (root) {
        check_tensors(c, root);
        check_metadata(c, root);
    }
    json_decref(root);
    gguf_free(c);
    return t_report("test_oracle_gguf");
}
