/* libFuzzer target for the GGUF reader: parse, walk everything the API exposes, and for images
 * that parse, rewrite them through the writer and require the result to parse the same way. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "format/gguf_write.h"

static volatile uint64_t sink;

static void touch(const void *p, uint64_t n) {
    const uint8_t *b = p;
    if (n) sink += b[0] + b[n - 1];
}

static void walk(const gguf_ctx *c) {
    g5_error e;
    int64_t nkv = gguf_get_n_kv(c);
    for (int64_t i = 0; i < nkv; i++) {
        const char *key = gguf_get_key(c, i);
        if (gguf_find_key(c, key) != i) abort();
        gguf_value v;
        if (gguf_get_value(c, i, &v) != G5_OK) abort();
        int64_t iv;
        uint64_t uv, len;
        uint32_t u32;
        double f;
        int b;
        const char *s;
        const void *d;
        gguf_vtype et;
        (void)gguf_get_int(c, key, &iv, &e);
        (void)gguf_get_uint(c, key, &uv, &e);
        (void)gguf_get_u32(c, key, &u32, &e);
        (void)gguf_get_float(c, key, &f, &e);
        (void)gguf_get_bool(c, key, &b, &e);
        if (gguf_get_str(c, key, &s, &len, &e) == G5_OK) touch(s, len);
        if (gguf_get_arr(c, key, &et, &uv, &e) == G5_OK) {
            if (gguf_get_arr_data(c, key, &d, &e) == G5_OK && uv) touch(d, 1);
            for (uint64_t j = 0; j < uv && j < 64; j++)
                if (gguf_get_arr_str_at(c, i, j, &s, &len) == G5_OK) touch(s, len);
            if (uv && gguf_get_arr_str(c, key, uv - 1, &s, &len, &e) == G5_OK) touch(s, len);
            (void)gguf_get_arr_str(c, key, uv, &s, &len, &e);
        }
        const uint8_t *raw;
        if (gguf_get_kv_raw(c, i, &raw, &len) == G5_OK) touch(raw, len);
    }
    uint64_t kvlen;
    touch(gguf_get_kv_bytes(c, &kvlen), kvlen);
    int64_t nt = gguf_get_n_tensors(c);
    uint64_t size = gguf_get_split_size(c, 0);
    const uint8_t *img = gguf_get_split_bytes(c, 0);
    for (int64_t i = 0; i < nt; i++) {
        const gguf_tensor *t = gguf_get_tensor(c, i);
        if (gguf_find_tensor(c, t->name) != t) abort();
        if (t->data != img + t->file_offset || t->file_offset + t->nbytes > size) abort();
        touch(t->data, t->nbytes);
    }
    (void)gguf_get_version(c);
    (void)gguf_get_alignment(c);
    (void)gguf_get_split_path(c, 0);
    (void)gguf_get_split_data_offset(c, 0);
}

/* Rewrites a parsed image through the writer; the copy must parse with the same kvs and
 * tensors. */
static void rewrite(const gguf_ctx *c) {
    gguf_writer *w = gguf_writer_create();
    if (!w) return;
    gguf_writer_set_version(w, gguf_get_version(c));
    for (int64_t i = 0; i < gguf_get_n_kv(c); i++)
        if (gguf_writer_copy_kv(w, c, i) != G5_OK) abort();
    for (int64_t i = 0; i < gguf_get_n_tensors(c); i++) {
        const gguf_tensor *t = gguf_get_tensor(c, i);
        if (gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, NULL) != G5_OK)
            abort();
    }
    uint8_t *buf;
    uint64_t len;
    g5_status st = gguf_writer_write_buffer(w, &buf, &len);
    gguf_writer_free(w);
    if (st == G5_ERR_NOMEM || st == G5_ERR_OVERFLOW) return;
    if (st != G5_OK) abort();
    gguf_ctx *c2 = NULL;
    g5_error e;
    if (gguf_parse_buffer(buf, len, "rewrite", &c2, &e) != G5_OK) abort();
    if (gguf_get_n_kv(c2) != gguf_get_n_kv(c) || gguf_get_n_tensors(c2) != gguf_get_n_tensors(c))
        abort();
    for (int64_t i = 0; i < gguf_get_n_tensors(c); i++) {
        const gguf_tensor *a = gguf_get_tensor(c, i), *b = gguf_get_tensor(c2, i);
        if (strcmp(a->name, b->name) || a->nbytes != b->nbytes ||
            memcmp(a->data, b->data, a->nbytes))
            abort();
    }
    gguf_free(c2);
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gguf_ctx *c = NULL;
    g5_error e;
    if (gguf_parse_buffer(data, size, "fuzz", &c, &e) != G5_OK) {
        if (c) abort();
        return 0;
    }
    walk(c);
    rewrite(c);
    gguf_free(c);
    return 0;
}
