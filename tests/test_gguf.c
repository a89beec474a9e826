/* GGUF reader and writer: round trips of every value type, typed getters, streamed writes, split
 * sets, and a table of corrupt files each refused with its specific status.
 *
 * Expected values never come from the code under test: byte sizes come from ggml's block
 * layouts (Q8_0: 32 elements in 34 bytes, Q4_K: 256 in 144, IQ2_XXS: 256 in 66), offsets from
 * the GGUF layout rules, and corrupt files are made by patching fields that the test locates
 * itself in the serialized bytes. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/gguf.h"
#include "format/gguf_write.h"
#include "format/quant.h"
#include "tests/test_util.h"

static const char *g_dir;

/* ---- small helpers ------------------------------------------------------------------------ */

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static const char *path_in(const char *name) {
    static char buf[8][4096];
    static int slot;
    char *b = buf[slot++ & 7];
    snprintf(b, sizeof buf[0], "%s/%s", g_dir, name);
    return b;
}

static uint8_t pattern(uint32_t seed, uint64_t j) {
    return (uint8_t)(seed * 131u + j * 7u + (j >> 8));
}

static void fill_pattern(uint8_t *dst, uint64_t n, uint32_t seed) {
    for (uint64_t j = 0; j < n; j++) dst[j] = pattern(seed, j);
}

static int check_pattern(const uint8_t *p, uint64_t n, uint32_t seed) {
    for (uint64_t j = 0; j < n; j++)
        if (p[j] != pattern(seed, j)) return 0;
    return 1;
}

static uint64_t up32(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* Offset of the length field of the string `s` stored in a GGUF image (key or tensor name). */
static uint64_t field_at(const uint8_t *b, uint64_t n, const char *s) {
    uint64_t L = strlen(s);
    for (uint64_t i = 8; i + L <= n; i++)
        if (memcmp(b + i, s, L) == 0 && g5_rd_u64(b + i - 8) == L) return i - 8;
    fprintf(stderr, "test bug: '%s' not in image\n", s);
    exit(2);
}
static uint64_t kv_type_at(const uint8_t *b, uint64_t n, const char *key) {
    return field_at(b, n, key) + 8 + strlen(key);
}
static uint64_t kv_val_at(const uint8_t *b, uint64_t n, const char *key) {
    return kv_type_at(b, n, key) + 4;
}
static uint64_t ti_ndims_at(const uint8_t *b, uint64_t n, const char *name) {
    return field_at(b, n, name) + 8 + strlen(name);
}
static uint64_t ti_ne_at(const uint8_t *b, uint64_t n, const char *name, int d) {
    return ti_ndims_at(b, n, name) + 4 + 8 * (uint64_t)d;
}
static uint64_t ti_type_at(const uint8_t *b, uint64_t n, const char *name) {
    uint64_t nd = ti_ndims_at(b, n, name);
    return nd + 4 + 8ull * g5_rd_u32(b + nd);
}
static uint64_t ti_off_at(const uint8_t *b, uint64_t n, const char *name) {
    return ti_type_at(b, n, name) + 4;
}

/* Parses an exact-size heap copy, so ASan sees any read past the end; free with done(). */
static g5_status parse_copy(const uint8_t *b, uint64_t n, const char *name, gguf_ctx **out,
                            g5_error *err) {
    uint8_t *c = malloc(n ? (size_t)n : 1);
    if (n) memcpy(c, b, (size_t)n);
    g5_status st = gguf_parse_buffer(n ? c : NULL, (size_t)n, name, out, err);
    if (st != G5_OK) free(c);
    return st;
}

/* Frees a context made by parse_copy together with its buffer. */
static void done(gguf_ctx *c) {
    if (!c) return;
    uint8_t *b = (uint8_t *)gguf_get_split_bytes(c, 0);
    gguf_free(c);
    free(b);
}

/* ---- the rich file: every value type and a few tensor types --------------------------------- */

typedef struct tspec {
    const char *name;
    uint32_t type;
    uint32_t n_dims;
    uint64_t ne[4];
    uint64_t nbytes; /* from ggml's block layouts, by hand */
} tspec;

static const tspec rich_tensors[] = {
    {"w.f32", QT_F32, 2, {3, 5, 1, 1}, 60},
    {"w.q8", QT_Q8_0, 2, {64, 3, 1, 1}, 2 * 34 * 3},
    {"w.q4k", QT_Q4_K, 2, {256, 2, 1, 1}, 144 * 2},
    {"w.iq2xxs", QT_IQ2_XXS, 1, {256, 1, 1, 1}, 66}, /* an i-quant: 256 elements in 66 bytes */
    {"w.f16", QT_F16, 3, {4, 3, 2, 1}, 48},
    {"w.4d", QT_F32, 4, {2, 3, 2, 2}, 96},
};
#define N_RICH (sizeof rich_tensors / sizeof rich_tensors[0])

static const char *const rich_strs[] = {"alpha", "", "\xe4\xb8\xad", "with space", "z"};
static const uint8_t arr_u8[] = {0, 1, 255};
static const int8_t arr_i8[] = {-128, 0, 127};
static const uint16_t arr_u16[] = {1, 65535};
static const int16_t arr_i16[] = {-32768, 5, 32767};
static const uint32_t arr_u32[] = {7, 4000000000u};
static const int32_t arr_i32[] = {-5, 6, -2147483647 - 1};
static const float arr_f32[] = {0.5f, -1.25f, 3e38f};
static const uint8_t arr_bool[] = {1, 0, 1, 1};
static const uint64_t arr_u64[] = {UINT64_MAX, 0};
static const int64_t arr_i64[] = {INT64_MIN, 42};
static const double arr_f64[] = {1e-300, -2.5};

static struct {
    const char *key;
    gguf_vtype et;
    const void *data;
    uint64_t n;
    unsigned esz;
} rich_arrays[] = {
    {"a.u8", GGUF_VT_UINT8, arr_u8, 3, 1},     {"a.i8", GGUF_VT_INT8, arr_i8, 3, 1},
    {"a.u16", GGUF_VT_UINT16, arr_u16, 2, 2},  {"a.i16", GGUF_VT_INT16, arr_i16, 3, 2},
    {"a.u32", GGUF_VT_UINT32, arr_u32, 2, 4},  {"a.i32", GGUF_VT_INT32, arr_i32, 3, 4},
    {"a.f32", GGUF_VT_FLOAT32, arr_f32, 3, 4}, {"a.bool", GGUF_VT_BOOL, arr_bool, 4, 1},
    {"a.u64", GGUF_VT_UINT64, arr_u64, 2, 8},  {"a.i64", GGUF_VT_INT64, arr_i64, 2, 8},
    {"a.f64", GGUF_VT_FLOAT64, arr_f64, 2, 8}, {"a.empty", GGUF_VT_UINT32, arr_u32, 0, 4},
};
#define N_ARR (sizeof rich_arrays / sizeof rich_arrays[0])

static uint8_t *rich_data[N_RICH];

static gguf_writer *rich_writer(int with_data) {
    gguf_writer *w = gguf_writer_create();
    T_CHECK(w != NULL, "writer_create");
    int bad = 0;
    bad |= gguf_writer_set_str(w, "general.architecture", "rich", 4);
    bad |= gguf_writer_set_u8(w, "t.u8", 200);
    bad |= gguf_writer_set_i8(w, "t.i8", -100);
    bad |= gguf_writer_set_u16(w, "t.u16", 60000);
    bad |= gguf_writer_set_i16(w, "t.i16", -30000);
    bad |= gguf_writer_set_u32(w, "t.u32", 4000000000u);
    bad |= gguf_writer_set_i32(w, "t.i32", -2000000000);
    bad |= gguf_writer_set_f32(w, "t.f32", 1.5f);
    bad |= gguf_writer_set_bool(w, "t.bool", 1);
    bad |= gguf_writer_set_str(w, "t.str", "hello\0world", 11);
    bad |= gguf_writer_set_u64(w, "t.u64", UINT64_MAX);
    bad |= gguf_writer_set_i64(w, "t.i64", INT64_MIN);
    bad |= gguf_writer_set_f64(w, "t.f64", -2.25e300);
    bad |= gguf_writer_set_i32(w, "t.small", 12);
    for (size_t i = 0; i < N_ARR; i++)
        bad |= gguf_writer_set_arr(w, rich_arrays[i].key, rich_arrays[i].et, rich_arrays[i].data,
                                   rich_arrays[i].n);
    bad |= gguf_writer_set_arr_str(w, "a.str", rich_strs, NULL, 5);
    bad |= gguf_writer_set_arr_str(w, "a.str.empty", NULL, NULL, 0);
    T_CHECK(bad == 0, "setting rich kvs");
    for (size_t i = 0; i < N_RICH; i++) {
        const tspec *t = &rich_tensors[i];
        if (!rich_data[i]) {
            rich_data[i] = malloc(t->nbytes);
            fill_pattern(rich_data[i], t->nbytes, (uint32_t)i + 1);
        }
        int64_t idx = -1;
        g5_status st = gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne,
                                              with_data ? rich_data[i] : NULL, &idx);
        T_CHECK(st == G5_OK && idx == (int64_t)i, "add_tensor %s: %s", t->name, g5_strerror(st));
        T_CHECK(gguf_writer_tensor_nbytes(w, (int64_t)i) == t->nbytes, "writer nbytes of %s",
                t->name);
    }
    T_CHECK(gguf_writer_n_tensors(w) == (int64_t)N_RICH, "n_tensors");
    return w;
}

static int msg_has(const g5_error *e, const char *s) { return strstr(e->msg, s) != NULL; }

/* Checks everything in the rich file against the values the test put in. */
static void check_rich(const gguf_ctx *c, uint32_t version, uint64_t align, const char *what) {
    g5_error e;
    T_CHECK(gguf_get_version(c) == version, "%s: version", what);
    T_CHECK(gguf_get_alignment(c) == align, "%s: alignment %llu", what,
            (unsigned long long)gguf_get_alignment(c));
    T_CHECK(gguf_get_n_splits(c) == 1, "%s: one split", what);

    int64_t iv;
    uint64_t uv;
    uint32_t u32;
    double fv;
    int bv;
    T_CHECK(gguf_get_int(c, "t.u8", &iv, &e) == G5_OK && iv == 200, "%s: u8", what);
    T_CHECK(gguf_get_int(c, "t.i8", &iv, &e) == G5_OK && iv == -100, "%s: i8", what);
    T_CHECK(gguf_get_int(c, "t.u16", &iv, &e) == G5_OK && iv == 60000, "%s: u16", what);
    T_CHECK(gguf_get_int(c, "t.i16", &iv, &e) == G5_OK && iv == -30000, "%s: i16", what);
    T_CHECK(gguf_get_int(c, "t.u32", &iv, &e) == G5_OK && iv == 4000000000ll, "%s: u32", what);
    T_CHECK(gguf_get_int(c, "t.i32", &iv, &e) == G5_OK && iv == -2000000000, "%s: i32", what);
    T_CHECK(gguf_get_int(c, "t.i64", &iv, &e) == G5_OK && iv == INT64_MIN, "%s: i64", what);
    T_CHECK(gguf_get_int(c, "t.bool", &iv, &e) == G5_OK && iv == 1, "%s: bool as int", what);
    T_CHECK(gguf_get_int(c, "t.u64", &iv, &e) == G5_ERR_OVERFLOW && msg_has(&e, "t.u64"),
            "%s: u64 max does not fit int64: %s", what, e.msg);
    T_CHECK(gguf_get_uint(c, "t.u64", &uv, &e) == G5_OK && uv == UINT64_MAX, "%s: u64", what);
    T_CHECK(gguf_get_uint(c, "t.i8", &uv, &e) == G5_ERR_OVERFLOW && msg_has(&e, "t.i8"),
            "%s: negative as uint", what);
    T_CHECK(gguf_get_uint(c, "t.small", &uv, &e) == G5_OK && uv == 12, "%s: i32 as uint", what);
    T_CHECK(gguf_get_u32(c, "t.u32", &u32, &e) == G5_OK && u32 == 4000000000u, "%s: u32", what);
    T_CHECK(gguf_get_u32(c, "t.u16", &u32, &e) == G5_OK && u32 == 60000, "%s: u16 as u32", what);
    T_CHECK(gguf_get_u32(c, "t.u64", &u32, &e) == G5_ERR_OVERFLOW, "%s: u64 as u32", what);
    T_CHECK(gguf_get_float(c, "t.f32", &fv, &e) == G5_OK && fv == 1.5, "%s: f32", what);
    T_CHECK(gguf_get_float(c, "t.f64", &fv, &e) == G5_OK && fv == -2.25e300, "%s: f64", what);
    T_CHECK(gguf_get_bool(c, "t.bool", &bv, &e) == G5_OK && bv == 1, "%s: bool", what);
    const char *s;
    uint64_t len;
    T_CHECK(gguf_get_str(c, "t.str", &s, &len, &e) == G5_OK && len == 11 &&
                memcmp(s, "hello\0world", 11) == 0,
            "%s: string with NUL", what);
    T_CHECK(gguf_get_str(c, "general.architecture", &s, &len, &e) == G5_OK && len == 4 &&
                memcmp(s, "rich", 4) == 0,
            "%s: architecture", what);

    /* wrong types name the key, the expected and the actual type */
    T_CHECK(gguf_get_float(c, "t.u32", &fv, &e) == G5_ERR_WRONG_TYPE && msg_has(&e, "t.u32") &&
                msg_has(&e, "u32") && msg_has(&e, "f32"),
            "%s: float of u32: %s", what, e.msg);
    T_CHECK(gguf_get_bool(c, "t.u8", &bv, &e) == G5_ERR_WRONG_TYPE && msg_has(&e, "bool") &&
                msg_has(&e, "u8"),
            "%s: bool of u8: %s", what, e.msg);
    T_CHECK(gguf_get_int(c, "t.f32", &iv, &e) == G5_ERR_WRONG_TYPE, "%s: int of f32", what);
    T_CHECK(gguf_get_uint(c, "t.str", &uv, &e) == G5_ERR_WRONG_TYPE, "%s: uint of str", what);
    T_CHECK(gguf_get_str(c, "a.str", &s, &len, &e) == G5_ERR_WRONG_TYPE &&
                msg_has(&e, "a.str") && msg_has(&e, "array") && msg_has(&e, "string"),
            "%s: str of array: %s", what, e.msg);
    gguf_vtype et;
    uint64_t n;
    T_CHECK(gguf_get_arr(c, "t.str", &et, &n, &e) == G5_ERR_WRONG_TYPE, "%s: arr of str", what);
    const void *data;
    T_CHECK(gguf_get_arr_data(c, "a.str", &data, &e) == G5_ERR_WRONG_TYPE,
            "%s: numeric data of string array", what);
    T_CHECK(gguf_get_arr_str(c, "a.u8", 0, &s, &len, &e) == G5_ERR_WRONG_TYPE,
            "%s: string element of u8 array", what);
    T_CHECK(gguf_get_arr_str(c, "a.str", 5, &s, &len, &e) == G5_ERR_BOUNDS,
            "%s: string index past the end", what);
    T_CHECK(gguf_get_int(c, "no.such.key", &iv, &e) == G5_ERR_NOT_FOUND &&
                msg_has(&e, "no.such.key"),
            "%s: missing key", what);
    T_CHECK(gguf_find_key(c, "no.such.key") == -1, "%s: find missing", what);

    for (size_t i = 0; i < N_ARR; i++) {
        const char *k = rich_arrays[i].key;
        T_CHECK(gguf_get_arr(c, k, &et, &n, &e) == G5_OK && et == rich_arrays[i].et &&
                    n == rich_arrays[i].n,
                "%s: array %s", what, k);
        T_CHECK(gguf_get_arr_data(c, k, &data, &e) == G5_OK &&
                    (n == 0 || memcmp(data, rich_arrays[i].data, n * rich_arrays[i].esz) == 0),
                "%s: array %s data", what, k);
    }
    T_CHECK(gguf_get_arr(c, "a.str", &et, &n, &e) == G5_OK && et == GGUF_VT_STRING && n == 5,
            "%s: string array", what);
    for (uint64_t j = 0; j < 5; j++)
        T_CHECK(gguf_get_arr_str(c, "a.str", j, &s, &len, &e) == G5_OK &&
                    len == strlen(rich_strs[j]) && memcmp(s, rich_strs[j], len) == 0,
                "%s: a.str[%llu]", what, (unsigned long long)j);
    T_CHECK(gguf_get_arr(c, "a.str.empty", &et, &n, &e) == G5_OK && et == GGUF_VT_STRING && n == 0,
            "%s: empty string array", what);

    /* iteration by index sees the same values, in insertion order */
    int64_t nkv = gguf_get_n_kv(c);
    T_CHECK(nkv == 14 + (int64_t)N_ARR + 2 + (align != 32), "%s: n_kv %lld", what,
            (long long)nkv);
    T_CHECK(strcmp(gguf_get_key(c, 0), "general.architecture") == 0, "%s: first key", what);
    T_CHECK(gguf_get_key(c, nkv) == NULL && gguf_get_key(c, -1) == NULL, "%s: key range", what);
    int seen_types[GGUF_VT_COUNT] = {0};
    for (int64_t i = 0; i < nkv; i++) {
        gguf_value v;
        T_CHECK(gguf_get_value(c, i, &v) == G5_OK, "%s: value %lld", what, (long long)i);
        T_CHECK(gguf_find_key(c, gguf_get_key(c, i)) == i, "%s: find_key(%s)", what,
                gguf_get_key(c, i));
        T_CHECK(gguf_get_kv_type(c, i) == v.type, "%s: kv type", what);
        seen_types[v.type]++;
        const char *k = gguf_get_key(c, i);
        if (!strcmp(k, "t.i16")) T_CHECK(v.v.i == -30000, "%s: value t.i16", what);
        if (!strcmp(k, "t.u16")) T_CHECK(v.v.u == 60000, "%s: value t.u16", what);
        if (!strcmp(k, "t.f32")) T_CHECK(v.v.f == 1.5, "%s: value t.f32", what);
        if (!strcmp(k, "a.str")) {
            T_CHECK(v.v.arr.elem_type == GGUF_VT_STRING && v.v.arr.n == 5, "%s: value a.str", what);
            T_CHECK(gguf_get_arr_str_at(c, i, 2, &s, &len) == G5_OK && len == 3 &&
                        memcmp(s, rich_strs[2], 3) == 0,
                    "%s: a.str[2] by index", what);
            T_CHECK(gguf_get_arr_str_at(c, i, 5, &s, &len) == G5_ERR_BOUNDS, "%s: str_at range",
                    what);
        }
    }
    for (int t = 0; t < GGUF_VT_COUNT; t++)
        T_CHECK(seen_types[t] > 0, "%s: value type %s present", what,
                gguf_vtype_name((gguf_vtype)t));
    gguf_value v;
    T_CHECK(gguf_get_value(c, nkv, &v) == G5_ERR_INVALID_ARG, "%s: value out of range", what);

    /* tensors: shape, size from ggml's layouts, offsets per the alignment rule, data */
    T_CHECK(gguf_get_n_tensors(c) == (int64_t)N_RICH, "%s: n_tensors", what);
    uint64_t want_off = 0, data_off = gguf_get_split_data_offset(c, 0);
    T_CHECK(data_off % align == 0 && data_off > 24, "%s: data offset %llu", what,
            (unsigned long long)data_off);
    for (size_t i = 0; i < N_RICH; i++) {
        const tspec *ts = &rich_tensors[i];
        const gguf_tensor *t = gguf_get_tensor(c, (int64_t)i);
        T_CHECK(t && gguf_find_tensor(c, ts->name) == t, "%s: find %s", what, ts->name);
        if (!t) continue;
        T_CHECK(strcmp(t->name, ts->name) == 0 && t->type == ts->type && t->n_dims == ts->n_dims,
                "%s: tensor %s header", what, ts->name);
        uint64_t ne_prod = 1;
        for (int d = 0; d < 4; d++) {
            T_CHECK(t->ne[d] == ts->ne[d], "%s: %s ne[%d]", what, ts->name, d);
            ne_prod *= ts->ne[d];
        }
        T_CHECK(t->n_elems == ne_prod, "%s: %s n_elems", what, ts->name);
        T_CHECK(t->nbytes == ts->nbytes, "%s: %s nbytes %llu", what, ts->name,
                (unsigned long long)t->nbytes);
        T_CHECK(t->offset == want_off, "%s: %s offset %llu, want %llu", what, ts->name,
                (unsigned long long)t->offset, (unsigned long long)want_off);
        T_CHECK(t->file_offset == data_off + want_off && t->split == 0, "%s: %s file offset",
                what, ts->name);
        T_CHECK(t->data == gguf_get_split_bytes(c, 0) + t->file_offset &&
                    check_pattern(t->data, t->nbytes, (uint32_t)i + 1),
                "%s: %s data", what, ts->name);
        want_off = up32(want_off + ts->nbytes, align);
    }
    T_CHECK(gguf_get_split_size(c, 0) == data_off + want_off, "%s: file size %llu, want %llu",
            what, (unsigned long long)gguf_get_split_size(c, 0),
            (unsigned long long)(data_off + want_off));
    T_CHECK(gguf_get_tensor(c, -1) == NULL && gguf_get_tensor(c, (int64_t)N_RICH) == NULL &&
                gguf_find_tensor(c, "nope") == NULL,
            "%s: tensor lookups out of range", what);

    /* the kv section spans from the end of the 24-byte header to the first tensor info */
    const uint8_t *img = gguf_get_split_bytes(c, 0);
    uint64_t kvlen, img_len = gguf_get_split_size(c, 0);
    const uint8_t *kvb = gguf_get_kv_bytes(c, &kvlen);
    T_CHECK(kvb == img + 24 && kvlen == field_at(img, img_len, rich_tensors[0].name) - 24,
            "%s: kv bytes span", what);
    T_CHECK(memcmp(img, "GGUF", 4) == 0 && g5_rd_u32(img + 4) == version &&
                g5_rd_u64(img + 8) == N_RICH && g5_rd_u64(img + 16) == (uint64_t)nkv,
            "%s: raw header fields", what);
}

static void test_round_trip(void) {
    gguf_writer *w = rich_writer(1);
    uint8_t *buf;
    uint64_t len;
    T_CHECK(gguf_writer_write_buffer(w, &buf, &len) == G5_OK, "write_buffer");
    uint8_t *hdr;
    uint64_t hlen, dsize;
    T_CHECK(gguf_writer_header_bytes(w, &hdr, &hlen, &dsize) == G5_OK && hlen + dsize == len &&
                hlen % 32 == 0 && memcmp(hdr, buf, hlen) == 0,
            "header_bytes is the image's prefix");
    free(hdr);
    gguf_ctx *c = NULL;
    g5_error e;
    T_CHECK(parse_copy(buf, len, "rich.gguf", &c, &e) == G5_OK, "parse rich: %s", e.msg);
    if (c) check_rich(c, 3, 32, "v3");
    T_CHECK(c && strcmp(gguf_get_split_path(c, 0), "rich.gguf") == 0, "buffer name");

    /* copying every pair verbatim reproduces the kv section byte for byte */
    gguf_writer *w2 = gguf_writer_create();
    for (int64_t i = 0; c && i < gguf_get_n_kv(c); i++)
        T_CHECK(gguf_writer_copy_kv(w2, c, i) == G5_OK, "copy_kv %lld", (long long)i);
    uint8_t *buf2;
    uint64_t len2;
    gguf_ctx *c2 = NULL;
    T_CHECK(gguf_writer_write_buffer(w2, &buf2, &len2) == G5_OK, "write copied");
    T_CHECK(parse_copy(buf2, len2, "copy.gguf", &c2, &e) == G5_OK, "parse copy: %s", e.msg);
    if (c && c2) {
        uint64_t l1, l2;
        const uint8_t *k1 = gguf_get_kv_bytes(c, &l1), *k2 = gguf_get_kv_bytes(c2, &l2);
        T_CHECK(l1 == l2 && memcmp(k1, k2, l1) == 0, "copied kv section identical");
        T_CHECK(gguf_get_n_tensors(c2) == 0 && gguf_get_split_data_offset(c2, 0) == len2,
                "tensor-less image: data section at its end");
    }
    /* replacing keeps the position; removing shifts */
    T_CHECK(gguf_writer_set_u32(w2, "t.u8", 5) == G5_OK, "replace");
    T_CHECK(gguf_writer_remove_key(w2, "general.architecture") == G5_OK, "remove");
    T_CHECK(gguf_writer_remove_key(w2, "general.architecture") == G5_ERR_NOT_FOUND, "remove 2");
    free(buf2);
    done(c2);
    c2 = NULL;
    T_CHECK(gguf_writer_write_buffer(w2, &buf2, &len2) == G5_OK, "write edited");
    T_CHECK(parse_copy(buf2, len2, "edit.gguf", &c2, &e) == G5_OK, "parse edited: %s", e.msg);
    uint32_t u32 = 0;
    T_CHECK(c2 && strcmp(gguf_get_key(c2, 0), "t.u8") == 0 &&
                gguf_get_kv_type(c2, 0) == GGUF_VT_UINT32 &&
                gguf_get_u32(c2, "t.u8", &u32, &e) == G5_OK && u32 == 5 &&
                gguf_find_key(c2, "general.architecture") == -1,
            "edited kvs");
    free(buf2);
    done(c2);

    /* a tensor-less image cut before its padding still parses */
    gguf_writer *w3 = gguf_writer_create();
    gguf_writer_set_str(w3, "k", "v", 1);
    uint8_t *b3;
    uint64_t l3;
    gguf_writer_write_buffer(w3, &b3, &l3);
    gguf_ctx *c3 = NULL;
    uint64_t body = 24 + 8 + 1 + 4 + 8 + 1; /* header, key "k", type, string "v" */
    T_CHECK(l3 == 64 && parse_copy(b3, body, "nopad.gguf", &c3, &e) == G5_OK &&
                gguf_get_split_data_offset(c3, 0) == body,
            "unpadded tensor-less image");
    done(c3);
    free(b3);
    gguf_writer_free(w3);

    gguf_writer_free(w2);
    done(c);
    free(buf);

    /* version 2 and a 64-byte alignment */
    gguf_writer_set_version(w, 2);
    gguf_writer_set_alignment(w, 64);
    T_CHECK(gguf_writer_write_buffer(w, &buf, &len) == G5_OK, "write v2");
    c = NULL;
    T_CHECK(parse_copy(buf, len, "rich-v2.gguf", &c, &e) == G5_OK, "parse v2: %s", e.msg);
    if (c) check_rich(c, 2, 64, "v2/64");
    uint32_t a = 0;
    T_CHECK(c && gguf_get_u32(c, "general.alignment", &a, &e) == G5_OK && a == 64,
            "general.alignment written");
    done(c);
    free(buf);

    /* back to 32: the key goes away */
    gguf_writer_set_alignment(w, 32);
    T_CHECK(gguf_writer_remove_key(w, "general.alignment") == G5_ERR_NOT_FOUND,
            "alignment 32 removes the key");

    /* writer refusals */
    uint64_t ne[4] = {32, 2, 1, 1}, ne_bad[4] = {33, 1, 1, 1}, ne0[4] = {0, 1, 1, 1};
    float f[64] = {0};
    T_CHECK(gguf_writer_add_tensor(w, "w.f32", QT_F32, 1, ne, f, NULL) == G5_ERR_DUPLICATE,
            "writer duplicate tensor");
    T_CHECK(gguf_writer_add_tensor(w, "x1", 77, 1, ne, f, NULL) == G5_ERR_TENSOR_TYPE,
            "writer unknown type");
    T_CHECK(gguf_writer_add_tensor(w, "x2", QT_Q8_0, 1, ne_bad, f, NULL) == G5_ERR_ALIGN,
            "writer row not a block multiple");
    T_CHECK(gguf_writer_add_tensor(w, "x3", QT_F32, 0, ne, f, NULL) == G5_ERR_INVALID_ARG,
            "writer n_dims 0");
    T_CHECK(gguf_writer_add_tensor(w, "x4", QT_F32, 5, ne, f, NULL) == G5_ERR_INVALID_ARG,
            "writer n_dims 5");
    T_CHECK(gguf_writer_add_tensor(w, "x5", QT_F32, 1, ne0, f, NULL) == G5_ERR_NDIMS,
            "writer zero dim");
    T_CHECK(gguf_writer_set_arr(w, "bad", GGUF_VT_STRING, f, 1) == G5_ERR_INVALID_ARG &&
                gguf_writer_set_arr(w, "bad", GGUF_VT_ARRAY, f, 1) == G5_ERR_INVALID_ARG,
            "writer refuses string/nested arrays in set_arr");
    gguf_writer_set_alignment(w, 3);
    T_CHECK(gguf_writer_write_buffer(w, &buf, &len) == G5_ERR_INVALID_ARG,
            "writer refuses alignment 3");
    gguf_writer_free(w);
    gguf_writer_free(NULL);
    gguf_free(NULL);
}

/* ---- streamed files --------------------------------------------------------------------- */

typedef struct fill_state {
    int calls;
    int fail_at;
} fill_state;

static g5_status fill_rich(void *user, int64_t i, uint8_t *dst, uint64_t nbytes) {
    fill_state *fs = user;
    fs->calls++;
    if (i == fs->fail_at) return G5_ERR_IO;
    if (nbytes != rich_tensors[i].nbytes) return G5_ERR_INTERNAL;
    fill_pattern(dst, nbytes, (uint32_t)i + 1);
    return G5_OK;
}

static void test_write_file(void) {
    gguf_writer *w = rich_writer(0);
    g5_error e;
    const char *p = path_in("stream.gguf");
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    T_CHECK(gguf_writer_write_file(w, p, NULL, NULL, &e) == G5_ERR_INVALID_ARG && !exists(p),
            "no data and no fill");
    fill_state fs = {0, 3};
    T_CHECK(gguf_writer_write_file(w, p, fill_rich, &fs, &e) == G5_ERR_IO && !exists(p) &&
                !exists(tmp) && msg_has(&e, "w.iq2xxs"),
            "failing fill leaves nothing: %s", e.msg);
    fs = (fill_state){0, -1};
    T_CHECK(gguf_writer_write_file(w, p, fill_rich, &fs, &e) == G5_OK, "write_file: %s", e.msg);
    T_CHECK(fs.calls == (int)N_RICH && !exists(tmp), "fill called once per tensor, no tmp left");
    gguf_ctx *c = NULL;
    T_CHECK(gguf_open(p, &c, &e) == G5_OK, "open streamed: %s", e.msg);
    if (c) check_rich(c, 3, 32, "streamed");
    T_CHECK(c && strcmp(gguf_get_split_path(c, 0), p) == 0, "split path");
    gguf_free(c);
    /* and an open of something missing is an I/O error naming it */
    T_CHECK(gguf_open(path_in("absent.gguf"), &c, &e) == G5_ERR_IO && msg_has(&e, "absent.gguf"),
            "open missing file: %s", e.msg);
    gguf_writer_free(w);
}

/* ---- scale: a GLM-5-sized token array and tensor count ------------------------------------ */

static void test_scale(void) {
    enum { NTOK = 154880, NT = 1809 };
    char **toks = malloc(NTOK * sizeof *toks);
    for (int i = 0; i < NTOK; i++) {
        toks[i] = malloc(16);
        snprintf(toks[i], 16, "tok%d", i);
    }
    gguf_writer *w = gguf_writer_create();
    T_CHECK(gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, NULL,
                                    NTOK) == G5_OK,
            "big string array");
    static float one[1] = {1.0f};
    uint64_t ne[4] = {1, 1, 1, 1};
    char name[64];
    int bad = 0;
    for (int i = 0; i < NT; i++) {
        snprintf(name, sizeof name, "blk.%d.t", i);
        bad |= gguf_writer_add_tensor(w, name, QT_F32, 1, ne, one, NULL) != G5_OK;
    }
    T_CHECK(!bad, "1809 tensors added");
    uint8_t *buf;
    uint64_t len;
    g5_error e;
    gguf_ctx *c = NULL;
    T_CHECK(gguf_writer_write_buffer(w, &buf, &len) == G5_OK, "write big");
    T_CHECK(parse_copy(buf, len, "big.gguf", &c, &e) == G5_OK, "parse big: %s", e.msg);
    if (c) {
        int ok = 1;
        for (int i = 0; i < NTOK; i += 97) {
            const char *s;
            uint64_t l;
            char want[16];
            int wl = snprintf(want, sizeof want, "tok%d", i);
            ok &= gguf_get_arr_str(c, "tokenizer.ggml.tokens", (uint64_t)i, &s, &l, &e) == G5_OK &&
                  l == (uint64_t)wl && memcmp(s, want, l) == 0;
        }
        const char *s;
        uint64_t l;
        ok &= gguf_get_arr_str(c, "tokenizer.ggml.tokens", NTOK - 1, &s, &l, &e) == G5_OK &&
              l == 9 && memcmp(s, "tok154879", 9) == 0;
        T_CHECK(ok, "token strings by index");
        ok = gguf_get_n_tensors(c) == NT;
        for (int i = 0; i < NT && ok; i++) {
            snprintf(name, sizeof name, "blk.%d.t", i);
            const gguf_tensor *t = gguf_find_tensor(c, name);
            ok &= t == gguf_get_tensor(c, i) && t->offset == 32ull * (uint64_t)i;
        }
        T_CHECK(ok, "1809 tensors found by name at 32-byte steps");
    }
    done(c);
    free(buf);
    gguf_writer_free(w);
    for (int i = 0; i < NTOK; i++) free(toks[i]);
    free(toks);
}

/* ---- corrupt files ------------------------------------------------------------------------ */

/* The base for corruption: small, with every field kind that a case patches. Data section:
 * alpha F32 [8,2] 64 bytes at 0, beta Q8_0 [32,2] 68 bytes at 64, gamma F32 [4] 16 bytes at
 * 160; 176 bytes of data, 192 with the final padding. */
static uint8_t *base_image(uint64_t *len) {
    gguf_writer *w = gguf_writer_create();
    uint8_t data[256];
    fill_pattern(data, sizeof data, 9);
    static const char *const toks[] = {"a", "bc", "def"};
    static const int32_t ints[] = {1, 2, 3, 4};
    uint64_t ne_a[4] = {8, 2}, ne_b[4] = {32, 2}, ne_g[4] = {4};
    int bad = 0;
    bad |= gguf_writer_set_u32(w, "general.alignment", 32);
    bad |= gguf_writer_set_str(w, "general.architecture", "testarch", 8);
    bad |= gguf_writer_set_u32(w, "test.u32", 7);
    bad |= gguf_writer_set_arr_str(w, "test.tokens", toks, NULL, 3);
    bad |= gguf_writer_set_arr(w, "test.ints", GGUF_VT_INT32, ints, 4);
    bad |= gguf_writer_set_u8(w, "dup.keyA", 1);
    bad |= gguf_writer_set_u8(w, "dup.keyB", 2);
    bad |= gguf_writer_add_tensor(w, "tensor.alpha", QT_F32, 2, ne_a, data, NULL);
    bad |= gguf_writer_add_tensor(w, "tensor.beta", QT_Q8_0, 2, ne_b, data, NULL);
    bad |= gguf_writer_add_tensor(w, "tensor.gamma", QT_F32, 1, ne_g, data, NULL);
    uint8_t *buf = NULL;
    bad |= gguf_writer_write_buffer(w, &buf, len);
    gguf_writer_free(w);
    if (bad) {
        fprintf(stderr, "test bug: base image\n");
        exit(2);
    }
    return buf;
}

/* End of the tensor infos, located independently of the reader. */
static uint64_t base_infos_end(const uint8_t *b, uint64_t n) {
    return ti_off_at(b, n, "tensor.gamma") + 8;
}

typedef struct corrupt_case {
    const char *label;
    g5_status want;
    const char *must_name; /* a key or tensor the message must mention, or NULL */
} corrupt_case;

static const corrupt_case cases[] = {
    {"empty", G5_ERR_TRUNCATED, NULL},
    {"magic-only", G5_ERR_TRUNCATED, NULL},
    {"bad-magic", G5_ERR_BAD_MAGIC, NULL},
    {"version-1", G5_ERR_VERSION, NULL},
    {"version-0", G5_ERR_VERSION, NULL},
    {"version-4", G5_ERR_VERSION, NULL},
    {"big-endian", G5_ERR_VERSION, NULL},
    {"kv-count-absurd", G5_ERR_COUNT, NULL},
    {"kv-count-max", G5_ERR_COUNT, NULL},
    {"tensor-count-absurd", G5_ERR_COUNT, NULL},
    {"key-len-absurd", G5_ERR_COUNT, NULL},
    {"key-past-eof", G5_ERR_TRUNCATED, NULL},
    {"string-past-eof", G5_ERR_TRUNCATED, "general.architecture"},
    {"value-type-13", G5_ERR_VALUE_TYPE, "test.u32"},
    {"value-type-max", G5_ERR_VALUE_TYPE, "test.u32"},
    {"nested-array", G5_ERR_VALUE_TYPE, "test.ints"},
    {"array-elem-type-unknown", G5_ERR_VALUE_TYPE, "test.ints"},
    {"array-len-absurd", G5_ERR_COUNT, "test.ints"},
    {"string-array-len-absurd", G5_ERR_COUNT, "test.tokens"},
    {"string-elem-past-eof", G5_ERR_TRUNCATED, "test.tokens"},
    {"key-with-nul", G5_ERR_FORMAT, NULL},
    {"duplicate-key", G5_ERR_DUPLICATE, "dup.keyA"},
    {"alignment-0", G5_ERR_ALIGN, "general.alignment"},
    {"alignment-3", G5_ERR_ALIGN, "general.alignment"},
    {"alignment-huge", G5_ERR_ALIGN, "general.alignment"},
    {"alignment-float", G5_ERR_WRONG_TYPE, "general.alignment"},
    {"n-dims-0", G5_ERR_NDIMS, "tensor.alpha"},
    {"n-dims-5", G5_ERR_NDIMS, "tensor.alpha"},
    {"dim-zero", G5_ERR_NDIMS, "tensor.alpha"},
    {"dim-negative", G5_ERR_NDIMS, "tensor.alpha"},
    {"dims-overflow", G5_ERR_OVERFLOW, "tensor.alpha"},
    {"bytes-overflow", G5_ERR_OVERFLOW, "tensor.alpha"},
    {"type-unknown", G5_ERR_TENSOR_TYPE, "tensor.alpha"},
    {"type-max", G5_ERR_TENSOR_TYPE, "tensor.alpha"},
    {"row-not-block-multiple", G5_ERR_ALIGN, "tensor.beta"},
    {"offset-misaligned", G5_ERR_ALIGN, "tensor.beta"},
    {"tensor-past-eof", G5_ERR_BOUNDS, "tensor.gamma"},
    {"offset-overflow", G5_ERR_OVERFLOW, "tensor.gamma"},
    {"tensors-overlap", G5_ERR_OVERLAP, "tensor.beta"},
    {"tensors-same-offset", G5_ERR_OVERLAP, "tensor.gamma"},
    {"duplicate-tensor", G5_ERR_DUPLICATE, "tensor.alpha"},
    {"tensor-name-nul", G5_ERR_FORMAT, NULL},
    {"tensor-name-absurd", G5_ERR_COUNT, NULL},
    {"cut-in-tensor-infos", G5_ERR_TRUNCATED, "tensor.gamma"},
    {"cut-before-data", G5_ERR_TRUNCATED, NULL},
    {"cut-in-data", G5_ERR_BOUNDS, "tensor.beta"},
    {"cut-in-header", G5_ERR_TRUNCATED, NULL},
};
#define N_CASES (sizeof cases / sizeof cases[0])

/* Applies case `id` to a copy of the base image (in place; may shorten *n). */
static void corrupt(int id, uint8_t *b, uint64_t *n) {
    uint64_t N = *n;
    const char *lbl = cases[id].label;
#define IS(s) (strcmp(lbl, s) == 0)
    if (IS("empty")) *n = 0;
    else if (IS("magic-only")) *n = 4;
    else if (IS("bad-magic")) b[3] = 'G';
    else if (IS("version-1")) g5_wr_u32(b + 4, 1);
    else if (IS("version-0")) g5_wr_u32(b + 4, 0);
    else if (IS("version-4")) g5_wr_u32(b + 4, 4);
    else if (IS("big-endian")) g5_wr_u32(b + 4, 0x03000000u);
    else if (IS("kv-count-absurd")) g5_wr_u64(b + 16, 1ull << 40);
    else if (IS("kv-count-max")) g5_wr_u64(b + 16, UINT64_MAX);
    else if (IS("tensor-count-absurd")) g5_wr_u64(b + 8, 1ull << 40);
    else if (IS("key-len-absurd")) g5_wr_u64(b + field_at(b, N, "general.alignment"), 1ull << 62);
    else if (IS("key-past-eof")) g5_wr_u64(b + field_at(b, N, "general.alignment"), 60000);
    else if (IS("string-past-eof"))
        g5_wr_u64(b + kv_val_at(b, N, "general.architecture"), 1ull << 40);
    else if (IS("value-type-13")) g5_wr_u32(b + kv_type_at(b, N, "test.u32"), 13);
    else if (IS("value-type-max")) g5_wr_u32(b + kv_type_at(b, N, "test.u32"), UINT32_MAX);
    else if (IS("nested-array")) g5_wr_u32(b + kv_val_at(b, N, "test.ints"), GGUF_VT_ARRAY);
    else if (IS("array-elem-type-unknown")) g5_wr_u32(b + kv_val_at(b, N, "test.ints"), 50);
    else if (IS("array-len-absurd")) g5_wr_u64(b + kv_val_at(b, N, "test.ints") + 4, 1ull << 61);
    else if (IS("string-array-len-absurd"))
        g5_wr_u64(b + kv_val_at(b, N, "test.tokens") + 4, 1ull << 59);
    else if (IS("string-elem-past-eof"))
        g5_wr_u64(b + kv_val_at(b, N, "test.tokens") + 12, 1ull << 40);
    else if (IS("key-with-nul")) b[field_at(b, N, "dup.keyA") + 8 + 3] = 0;
    else if (IS("duplicate-key")) b[field_at(b, N, "dup.keyB") + 8 + 7] = 'A';
    else if (IS("alignment-0")) g5_wr_u32(b + kv_val_at(b, N, "general.alignment"), 0);
    else if (IS("alignment-3")) g5_wr_u32(b + kv_val_at(b, N, "general.alignment"), 3);
    else if (IS("alignment-huge")) g5_wr_u32(b + kv_val_at(b, N, "general.alignment"), 1u << 30);
    else if (IS("alignment-float"))
        g5_wr_u32(b + kv_type_at(b, N, "general.alignment"), GGUF_VT_FLOAT32);
    else if (IS("n-dims-0")) g5_wr_u32(b + ti_ndims_at(b, N, "tensor.alpha"), 0);
    else if (IS("n-dims-5")) g5_wr_u32(b + ti_ndims_at(b, N, "tensor.alpha"), 5);
    else if (IS("dim-zero")) g5_wr_u64(b + ti_ne_at(b, N, "tensor.alpha", 1), 0);
    else if (IS("dim-negative")) g5_wr_u64(b + ti_ne_at(b, N, "tensor.alpha", 0), 1ull << 63);
    else if (IS("dims-overflow")) {
        g5_wr_u64(b + ti_ne_at(b, N, "tensor.alpha", 0), 1ull << 32);
        g5_wr_u64(b + ti_ne_at(b, N, "tensor.alpha", 1), 1ull << 32);
    } else if (IS("bytes-overflow")) { /* 2^62 elements fit in int64, 2^64 bytes do not */
        g5_wr_u64(b + ti_ne_at(b, N, "tensor.alpha", 0), 1ull << 62);
        g5_wr_u64(b + ti_ne_at(b, N, "tensor.alpha", 1), 1);
    } else if (IS("type-unknown")) g5_wr_u32(b + ti_type_at(b, N, "tensor.alpha"), 77);
    else if (IS("type-max")) g5_wr_u32(b + ti_type_at(b, N, "tensor.alpha"), UINT32_MAX);
    else if (IS("row-not-block-multiple")) g5_wr_u64(b + ti_ne_at(b, N, "tensor.beta", 0), 48);
    else if (IS("offset-misaligned")) g5_wr_u64(b + ti_off_at(b, N, "tensor.beta"), 65);
    else if (IS("tensor-past-eof")) g5_wr_u64(b + ti_off_at(b, N, "tensor.gamma"), 4096);
    else if (IS("offset-overflow"))
        g5_wr_u64(b + ti_off_at(b, N, "tensor.gamma"), UINT64_MAX - 31);
    else if (IS("tensors-overlap")) g5_wr_u64(b + ti_off_at(b, N, "tensor.beta"), 32);
    else if (IS("tensors-same-offset")) g5_wr_u64(b + ti_off_at(b, N, "tensor.gamma"), 64);
    else if (IS("duplicate-tensor")) memcpy(b + field_at(b, N, "tensor.gamma") + 15, "alpha", 5);
    else if (IS("tensor-name-nul")) b[field_at(b, N, "tensor.beta") + 8 + 6] = 0;
    else if (IS("tensor-name-absurd")) g5_wr_u64(b + field_at(b, N, "tensor.beta"), 1ull << 62);
    else if (IS("cut-in-tensor-infos")) *n = ti_ne_at(b, N, "tensor.gamma", 0) + 3;
    else if (IS("cut-before-data")) *n = up32(base_infos_end(b, N), 32) - 1;
    else if (IS("cut-in-data")) *n = up32(base_infos_end(b, N), 32) + 100;
    else if (IS("cut-in-header")) *n = 23;
    else {
        fprintf(stderr, "test bug: case %s\n", lbl);
        exit(2);
    }
#undef IS
}

static void test_corrupt_table(void) {
    uint64_t blen;
    uint8_t *base = base_image(&blen);
    gguf_ctx *c = NULL;
    g5_error e;
    /* the base itself is sound, and laid out as the comments above say */
    T_CHECK(parse_copy(base, blen, "base.gguf", &c, &e) == G5_OK, "base parses: %s", e.msg);
    uint64_t dstart = up32(base_infos_end(base, blen), 32);
    T_CHECK(c && gguf_get_split_data_offset(c, 0) == dstart && blen == dstart + 192,
            "base layout");
    T_CHECK(c && gguf_find_tensor(c, "tensor.gamma")->offset == 160, "base gamma offset");
    done(c);
    T_CHECK(N_CASES >= 30, "at least 30 corrupt cases (%zu)", N_CASES);

    uint8_t *b = malloc(blen);
    for (size_t id = 0; id < N_CASES; id++) {
        const corrupt_case *cc = &cases[id];
        memcpy(b, base, blen);
        uint64_t n = blen;
        corrupt((int)id, b, &n);
        char name[128];
        snprintf(name, sizeof name, "case-%s.gguf", cc->label);
        c = NULL;
        g5_error_clear(&e);
        g5_status st = parse_copy(b, n, name, &c, &e);
        T_CHECK(st == cc->want, "%s: got %s (%s), want %s", cc->label, g5_strerror(st), e.msg,
                g5_strerror(cc->want));
        T_CHECK(c == NULL && e.status == st && msg_has(&e, name) && e.has_offset,
                "%s: message names the file with an offset: %s", cc->label, e.msg);
        if (cc->must_name)
            T_CHECK(msg_has(&e, cc->must_name), "%s: message names '%s': %s", cc->label,
                    cc->must_name, e.msg);
        /* the same through a file */
        const char *p = path_in(name);
        t_write_file(p, b, n);
        g5_error e2;
        st = gguf_open(p, &c, &e2);
        T_CHECK(st == cc->want && msg_has(&e2, p) && c == NULL, "%s (file): got %s: %s", cc->label,
                g5_strerror(st), e2.msg);
        unlink(p);
    }

    /* every prefix of the header region fails cleanly; prefixes inside the data fail until the
     * last tensor's bytes are all there */
    int bad = 0;
    for (uint64_t cut = 0; cut < blen; cut++) {
        c = NULL;
        g5_status st = parse_copy(base, cut, "prefix.gguf", &c, &e);
        int ok;
        if (cut < dstart)
            ok = (st == G5_ERR_TRUNCATED || st == G5_ERR_COUNT) && msg_has(&e, "prefix.gguf");
        else if (cut < dstart + 176) ok = st == G5_ERR_BOUNDS;
        else ok = st == G5_OK;
        if (!ok && bad++ < 5)
            printf("prefix %llu: %s %s\n", (unsigned long long)cut, g5_strerror(st), e.msg);
        done(c);
    }
    T_CHECK(bad == 0, "all %llu prefixes behave", (unsigned long long)blen);

    /* every single-byte change in the header region parses or fails, never crashes; whatever
     * parses keeps every tensor inside the image */
    for (uint64_t i = 0; i < dstart; i++) {
        static const uint8_t vals[] = {0x00, 0xff, 0x01, 0x80, 0x7f};
        for (size_t v = 0; v < sizeof vals; v++) {
            memcpy(b, base, blen);
            b[i] ^= vals[v] ? vals[v] : b[i];
            c = NULL;
            if (parse_copy(b, blen, "flip.gguf", &c, &e) == G5_OK) {
                for (int64_t k = 0; k < gguf_get_n_tensors(c); k++) {
                    const gguf_tensor *t = gguf_get_tensor(c, k);
                    if (t->file_offset + t->nbytes > blen ||
                        t->data != gguf_get_split_bytes(c, 0) + t->file_offset)
                        bad++;
                }
                done(c);
            } else if (!msg_has(&e, "flip.gguf")) {
                bad++;
            }
        }
    }
    T_CHECK(bad == 0, "byte flips handled");
    free(b);
    free(base);
}

/* An image containing a known-but-unsupported type and a large-alignment file still parses. */
static void test_unsupported_type_parses(void) {
    gguf_writer *w = gguf_writer_create();
    uint8_t blk[66 * 2] = {0};
    uint64_t ne[4] = {256, 2};
    T_CHECK(gguf_writer_add_tensor(w, "iq", QT_IQ2_XXS, 2, ne, blk, NULL) == G5_OK, "add IQ2_XXS");
    uint8_t *buf;
    uint64_t len;
    gguf_writer_write_buffer(w, &buf, &len);
    gguf_ctx *c = NULL;
    g5_error e;
    T_CHECK(parse_copy(buf, len, "iq.gguf", &c, &e) == G5_OK, "IQ2_XXS parses: %s", e.msg);
    T_CHECK(c && gguf_get_tensor(c, 0)->nbytes == 132 && gguf_get_tensor(c, 0)->type == QT_IQ2_XXS,
            "IQ2_XXS size");
    done(c);
    free(buf);
    gguf_writer_free(w);
}

/* ---- split sets --------------------------------------------------------------------------- */

typedef struct split_tensor {
    const char *name;
    uint32_t type;
    uint64_t ne0, ne1;
    uint64_t nbytes;
    uint32_t split;
} split_tensor;

static const split_tensor split_ts[] = {
    {"s0.a", QT_F32, 16, 1, 64, 0},
    {"s0.b", QT_Q8_0, 32, 1, 34, 0},
    {"s1.a", QT_F32, 8, 2, 64, 1},
    {"s2.a", QT_F32, 4, 1, 16, 2},
    {"s2.b", QT_F16, 64, 1, 128, 2},
};
#define N_SPLIT_TS (sizeof split_ts / sizeof split_ts[0])

enum {
    SV_GOOD, SV_COUNT_MISMATCH, SV_NO_WRONG, SV_MISSING, SV_TOTAL_MISMATCH, SV_DUP_TENSOR,
    SV_NO_ABSENT, SV_COUNT_STRING, SV_SIBLING_CORRUPT, SV_NO_TOTAL, SV_N
};

static g5_status fill_split(void *user, int64_t i, uint8_t *dst, uint64_t nbytes) {
    const int *map = user; /* writer index -> split_ts index */
    fill_pattern(dst, nbytes, 100 + (uint32_t)map[i]);
    return G5_OK;
}

/* Writes PREFIX-0000k-of-00003.gguf for k = 1..3 as llama.cpp's gguf-split does: all metadata
 * in the first, split.no/split.count as u16 and split.tensors.count as i32 in each. */
static void write_split_set(const char *prefix, int variant) {
    for (uint32_t s = 0; s < 3; s++) {
        gguf_writer *w = gguf_writer_create();
        if (s == 0) {
            gguf_writer_set_str(w, "general.architecture", "splitarch", 9);
            gguf_writer_set_u32(w, "only.in.first", 1);
        }
        uint16_t count = 3, no = (uint16_t)s;
        int32_t total = (int32_t)N_SPLIT_TS;
        if (variant == SV_COUNT_MISMATCH && s == 2) count = 4;
        if (variant == SV_NO_WRONG && s == 1) no = 2;
        if (variant == SV_TOTAL_MISMATCH) total = 6;
        if (variant != SV_NO_ABSENT || s != 1) gguf_writer_set_u16(w, "split.no", no);
        if (variant == SV_COUNT_STRING && s == 0) gguf_writer_set_str(w, "split.count", "3", 1);
        else gguf_writer_set_u16(w, "split.count", count);
        if (variant != SV_NO_TOTAL) gguf_writer_set_i32(w, "split.tensors.count", total);
        if (s == 1) gguf_writer_set_u32(w, "only.in.second", 2);
        int map[N_SPLIT_TS], nw = 0;
        for (size_t i = 0; i < N_SPLIT_TS; i++) {
            const split_tensor *t = &split_ts[i];
            if (t->split != s) continue;
            uint64_t ne[4] = {t->ne0, t->ne1, 1, 1};
            const char *name = t->name;
            if (variant == SV_DUP_TENSOR && !strcmp(name, "s2.a")) name = "s0.a";
            gguf_writer_add_tensor(w, name, t->type, t->ne1 > 1 ? 2 : 1, ne, NULL, NULL);
            map[nw++] = (int)i;
        }
        char path[4200];
        snprintf(path, sizeof path, "%s-%05u-of-%05u.gguf", prefix, s + 1, 3u);
        g5_error e;
        T_CHECK(gguf_writer_write_file(w, path, fill_split, map, &e) == G5_OK, "write %s: %s",
                path, e.msg);
        gguf_writer_free(w);
        if (variant == SV_MISSING && s == 1) unlink(path);
        if (variant == SV_SIBLING_CORRUPT && s == 2) {
            uint64_t n;
            uint8_t *b = t_read_file(path, &n);
            b[0] = 'X';
            t_write_file(path, b, n);
            free(b);
        }
    }
}

static void test_split_set(void) {
    char prefix[4200], p[3][4300];
    snprintf(prefix, sizeof prefix, "%s/x", g_dir);
    write_split_set(prefix, SV_GOOD);
    for (int s = 0; s < 3; s++) snprintf(p[s], sizeof p[s], "%s-%05d-of-00003.gguf", prefix, s + 1);
    for (int from = 0; from < 3; from++) {
        gguf_ctx *c = NULL;
        g5_error e;
        T_CHECK(gguf_open(p[from], &c, &e) == G5_OK, "open split set from %d: %s", from, e.msg);
        if (!c) continue;
        T_CHECK(gguf_get_n_splits(c) == 3 && gguf_get_n_tensors(c) == (int64_t)N_SPLIT_TS,
                "split set sizes");
        for (uint32_t s = 0; s < 3; s++)
            T_CHECK(strcmp(gguf_get_split_path(c, s), p[s]) == 0, "split %u path %s", s,
                    gguf_get_split_path(c, s));
        T_CHECK(gguf_get_split_path(c, 3) == NULL && gguf_get_split_bytes(c, 3) == NULL,
                "split out of range");
        uint32_t v;
        uint64_t u;
        T_CHECK(gguf_get_u32(c, "only.in.first", &v, &e) == G5_OK && v == 1, "metadata of split 0");
        T_CHECK(gguf_find_key(c, "only.in.second") == -1, "metadata of split 1 is not merged");
        T_CHECK(gguf_get_uint(c, "split.tensors.count", &u, &e) == G5_OK && u == N_SPLIT_TS,
                "split.tensors.count as i32 read as uint");
        uint64_t kvlen;
        const uint8_t *kvb = gguf_get_kv_bytes(c, &kvlen);
        T_CHECK(kvb == gguf_get_split_bytes(c, 0) + 24, "kv bytes from split 0");
        uint64_t next_off[3] = {0, 0, 0};
        for (size_t i = 0; i < N_SPLIT_TS; i++) {
            const split_tensor *st = &split_ts[i];
            const gguf_tensor *t = gguf_get_tensor(c, (int64_t)i);
            T_CHECK(t && t == gguf_find_tensor(c, st->name) && t->split == st->split &&
                        t->nbytes == st->nbytes,
                    "tensor %s in split %u", st->name, st->split);
            if (!t) continue;
            uint64_t doff = gguf_get_split_data_offset(c, t->split);
            T_CHECK(t->offset == next_off[st->split] && t->file_offset == doff + t->offset &&
                        t->data == gguf_get_split_bytes(c, t->split) + t->file_offset &&
                        t->file_offset + t->nbytes <= gguf_get_split_size(c, t->split),
                    "tensor %s placement", st->name);
            T_CHECK(check_pattern(t->data, t->nbytes, 100 + (uint32_t)i), "tensor %s data",
                    st->name);
            next_off[st->split] = up32(next_off[st->split] + st->nbytes, 32);
        }
        gguf_free(c);
    }

    static const struct {
        int variant;
        g5_status want;
        int blame; /* split whose path the message must name (0-based) */
        const char *label;
    } bad[] = {
        {SV_COUNT_MISMATCH, G5_ERR_SPLIT, 2, "split.count mismatch"},
        {SV_NO_WRONG, G5_ERR_SPLIT, 1, "split.no wrong"},
        {SV_MISSING, G5_ERR_MISSING_SPLIT, 1, "missing sibling"},
        {SV_TOTAL_MISMATCH, G5_ERR_SPLIT, 0, "split.tensors.count mismatch"},
        {SV_DUP_TENSOR, G5_ERR_DUPLICATE, 2, "tensor in two splits"},
        {SV_NO_ABSENT, G5_ERR_SPLIT, 1, "split.no absent"},
        {SV_COUNT_STRING, G5_ERR_SPLIT, 0, "split.count a string"},
        {SV_SIBLING_CORRUPT, G5_ERR_BAD_MAGIC, 2, "corrupt sibling"},
        {SV_NO_TOTAL, G5_ERR_SPLIT, 0, "split.tensors.count absent"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char pre[4200];
        snprintf(pre, sizeof pre, "%s/bad%zu", g_dir, k);
        write_split_set(pre, bad[k].variant);
        for (int from = 0; from < 3; from++) {
            char path[4300], blame[4300];
            snprintf(path, sizeof path, "%s-%05d-of-00003.gguf", pre, from + 1);
            snprintf(blame, sizeof blame, "%s-%05d-of-00003.gguf", pre, bad[k].blame + 1);
            if (!exists(path)) continue;
            if (bad[k].variant == SV_SIBLING_CORRUPT && from == 2) continue;
            gguf_ctx *c = NULL;
            g5_error e;
            g5_status st = gguf_open(path, &c, &e);
            T_CHECK(st == bad[k].want && c == NULL && msg_has(&e, blame),
                    "%s (from %d): got %s: %s", bad[k].label, from, g5_strerror(st), e.msg);
        }
    }

    /* split.count > 1 in a file whose name does not follow the pattern */
    char single[4300];
    snprintf(single, sizeof single, "%s/plain.gguf", g_dir);
    uint64_t n;
    uint8_t *b = t_read_file(p[0], &n);
    t_write_file(single, b, n);
    free(b);
    gguf_ctx *c = NULL;
    g5_error e;
    T_CHECK(gguf_open(single, &c, &e) == G5_ERR_SPLIT && msg_has(&e, single),
            "split.count 3 without a split name: %s", e.msg);
    /* a one-file set named -00001-of-00001 */
    gguf_writer *w = gguf_writer_create();
    gguf_writer_set_u16(w, "split.no", 0);
    gguf_writer_set_u16(w, "split.count", 1);
    gguf_writer_set_i32(w, "split.tensors.count", 0);
    snprintf(single, sizeof single, "%s/one-00001-of-00001.gguf", g_dir);
    T_CHECK(gguf_writer_write_file(w, single, NULL, NULL, &e) == G5_OK, "write one-file set");
    T_CHECK(gguf_open(single, &c, &e) == G5_OK && gguf_get_n_splits(c) == 1, "one-file set: %s",
            e.msg);
    gguf_free(c);
    gguf_writer_free(w);
}

int main(void) {
    g_dir = t_tmpdir();
    test_round_trip();
    test_write_file();
    test_scale();
    test_corrupt_table();
    test_unsupported_type_parses();
    test_split_set();
    for (size_t i = 0; i < N_RICH; i++) free(rich_data[i]);
    t_rmtree(g_dir);
    return t_report("test_gguf");
}
