/* Blob format: writer/reader round trip against independently computed sizes and XXH3-128
 * hashes (specs/blob-format.md), every index byte's corruption detected, data corruption named
 * by tensor and chunk, truncation, structural checks on resealed images, writer failures, and
 * blob sets (record, foreign or swapped ranks). */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "format/blob.h"
#include "format/blob_test.h"
#include "format/gguf_write.h"
#include "format/quant.h"
#include "tests/test_util.h"

static void canon(const void *p, size_t n, uint8_t out[16]) {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(p, n));
    memcpy(out, c.digest, 16);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_rand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static int exists(const char *p) { return access(p, F_OK) == 0; }

/* ---- test content ---- */

typedef struct tdesc {
    const char *name;
    uint32_t type, n_dims;
    uint64_t ne[4], neg[4];
    uint32_t axis, index, count;
    uint64_t size; /* computed by hand from ggml block sizes */
} tdesc;

#define NT 5
static const tdesc k_t[NT] = {
    {"a.weight", QT_F32, 1, {300, 1, 1, 1}, {300, 1, 1, 1}, BLOB_AXIS_NONE, 0, 1, 300 * 4},
    /* Q8_0: 34 bytes per 32 elements */
    {"b.weight", QT_Q8_0, 2, {64, 100, 1, 1}, {64, 200, 1, 1}, 1, 1, 2, 2 * 34 * 100},
    {"c.weight", QT_F16, 3, {10, 3, 2, 1}, {20, 3, 2, 1}, 0, 0, 2, 10 * 3 * 2 * 2},
    /* Q4_K: 144 bytes per 256 elements */
    {"d.weight", QT_Q4_K, 2, {256, 40, 1, 1}, {256, 40, 1, 1}, BLOB_AXIS_NONE, 0, 1, 144 * 40},
    {"e.bias", QT_BF16, 1, {5000, 1, 1, 1}, {5000, 1, 1, 1}, BLOB_AXIS_NONE, 0, 1, 10000},
};
static uint8_t *g_data[NT];

static void make_meta(uint8_t **buf, uint64_t *len) {
    gguf_writer *w = gguf_writer_create();
    gguf_writer_set_str(w, "general.architecture", "glm-dsa", 7);
    gguf_writer_set_u32(w, "glm-dsa.block_count", 4);
    char tok[600][16];
    const char *strs[600];
    uint64_t lens[600];
    for (int i = 0; i < 600; i++) {
        snprintf(tok[i], sizeof tok[i], "tok%d", i);
        strs[i] = tok[i];
        lens[i] = strlen(tok[i]);
    }
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", strs, lens, 600);
    T_CHECK(gguf_writer_write_buffer(w, buf, len) == G5_OK, "meta image");
    gguf_writer_free(w);
}

typedef struct wopts {
    uint32_t tp, rank;
    uint8_t set_byte;
    int zstd;
    uint64_t fail_after;
    uint32_t type_override; /* for tensor 3, 0 = none */
} wopts;

/* Writes a blob of k_t (data g_data) to path in odd-sized pieces. Returns status. */
static g5_status write_blob(const char *path, const wopts *o, g5_error *e) {
    uint8_t *meta;
    uint64_t meta_len;
    make_meta(&meta, &meta_len);
    blob_writer_tensor wt[NT];
    for (int i = 0; i < NT; i++) {
        memset(&wt[i], 0, sizeof wt[i]);
        wt[i].name = k_t[i].name;
        wt[i].type = (i == 3 && o->type_override) ? o->type_override : k_t[i].type;
        wt[i].n_dims = k_t[i].n_dims;
        memcpy(wt[i].ne, k_t[i].ne, sizeof wt[i].ne);
        memcpy(wt[i].ne_global, k_t[i].neg, sizeof wt[i].ne_global);
        wt[i].split_axis = k_t[i].axis;
        wt[i].split_index = k_t[i].axis == BLOB_AXIS_NONE ? 0 : o->rank;
        wt[i].split_count = k_t[i].count;
    }
    blob_source_desc src[2] = {{"/some/dir/model-00001-of-00002.gguf", 1000, 200, {1, 2, 3}, {7}},
                               {"model-00002-of-00002.gguf", 2000, 300, {4, 5, 6}, {8}}};
    blob_writer_params p = {0};
    p.tp = o->tp;
    p.rank = o->rank;
    p.placement = BLOB_PLACE_TP;
    p.converter_version = 0x010203;
    p.kv_b_type = QT_F32;
    memset(p.set_id, o->set_byte, 16);
    p.meta = meta;
    p.meta_len = meta_len;
    p.meta_zstd_level = o->zstd;
    p.n_sources = 2;
    p.sources = src;
    p.chunk_size = 4096;
    blob_writer *w;
    g5_status st = blob_writer_create(path, &p, wt, NT, &w, e);
    free(meta);
    if (st) return st;
    blob_writer_test_fail_after(w, o->fail_after);
    /* One stream of all tensors, in pieces of varying size crossing tensor boundaries. */
    uint64_t total = 0;
    for (int i = 0; i < NT; i++) total += k_t[i].size;
    uint8_t *all = malloc(total);
    for (int i = 0, o2 = 0; i < NT; o2 += (int)k_t[i].size, i++) memcpy(all + o2, g_data[i], k_t[i].size);
    uint64_t pos = 0, piece = 7;
    while (pos < total && !st) {
        uint64_t n = piece < total - pos ? piece : total - pos;
        st = blob_writer_write(w, all + pos, n, e);
        pos += n;
        piece = piece * 3 % 9001 + 1;
    }
    free(all);
    if (!st) st = blob_writer_finish(w, NULL, e);
    blob_writer_free(w);
    return st;
}

/* Recomputes every hash of an image as the spec defines them (entry hashes, section hashes, header
 * hash), so structural edits reach the structural checks. */
static void reseal(uint8_t *b) {
    uint64_t n_t = g5_rd_u64(b + 112) / 160, tab = g5_rd_u64(b + 104); /* from the table size: edits may break the count */
    for (uint64_t i = 0; i < n_t; i++) canon(b + tab + i * 160, 144, b + tab + i * 160 + 144);
    const int sec[5][3] = {{88, 96, 200}, {104, 112, 216}, {120, 128, 232}, {136, 144, 248}, {152, 160, 264}};
    for (int s = 0; s < 5; s++) canon(b + g5_rd_u64(b + sec[s][0]), g5_rd_u64(b + sec[s][1]), b + sec[s][2]);
    canon(b, 304, b + 304);
}

static void test_roundtrip(const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/one.g5b", dir);
    g5_error e;
    wopts o = {2, 1, 0xab, 9, 0, 0};
    T_CHECK(write_blob(path, &o, &e) == G5_OK, "write: %s", e.msg);
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    T_CHECK(!exists(tmp), "temporary file left behind");
    size_t len;
    uint8_t *img = t_read_file(path, &len);
    T_CHECK(img != NULL, "read back");
    if (!img) return;
    /* Header layout as the spec states it. */
    T_CHECK(memcmp(img, "GLM5BLOB", 8) == 0, "magic");
    T_CHECK(g5_rd_u32(img + 8) == 1 && g5_rd_u32(img + 12) == 320, "version/header size");
    uint8_t h[16];
    canon(img, 304, h);
    T_CHECK(memcmp(h, img + 304, 16) == 0, "header hash over bytes 0..304");
    const uint64_t data_off = g5_rd_u64(img + 176), data_size = g5_rd_u64(img + 184);
    T_CHECK(data_off % 4096 == 0 && data_off + data_size == len && g5_rd_u64(img + 192) == len,
            "data offset %llu size %llu file %zu", (unsigned long long)data_off, (unsigned long long)data_size, len);

    blob *b;
    T_CHECK(blob_open(path, &b, &e) == G5_OK, "open: %s", e.msg);
    if (!b) {
        free(img);
        return;
    }
    const blob_info *in = blob_get_info(b);
    T_CHECK(in->tp == 2 && in->rank == 1 && in->placement == BLOB_PLACE_TP && in->converter_version == 0x010203 &&
                in->kv_b_type == QT_F32 && in->n_tensors == NT && in->chunk_size == 4096,
            "info fields");
    T_CHECK(in->set_id[0] == 0xab && in->set_id[15] == 0xab, "set id");
    T_CHECK(in->flags & BLOB_FLAG_META_ZSTD, "repetitive metadata should be compressed");
    T_CHECK(in->n_chunks == (data_size + 4095) / 4096, "chunk count");
    T_CHECK(blob_n_sources(b) == 2, "sources");
    const blob_source *s0 = blob_get_source(b, 0), *s1 = blob_get_source(b, 1);
    T_CHECK(s0 && strcmp(s0->name, "model-00001-of-00002.gguf") == 0 && s0->file_size == 1000 &&
                s0->header_size == 200 && s0->header_hash[2] == 3 && s0->sample_hash[0] == 7,
            "source 0");
    T_CHECK(s1 && s1->split == 1 && s1->file_size == 2000 && s1->header_hash[0] == 4 && s1->sample_hash[0] == 8,
            "source 1");
    T_CHECK(blob_get_source(b, 2) == NULL, "source out of range");
    uint64_t prev_end = data_off;
    for (int i = 0; i < NT; i++) {
        const blob_tensor *t = blob_get_tensor(b, (uint64_t)i);
        T_CHECK(t && strcmp(t->name, k_t[i].name) == 0, "tensor %d name", i);
        if (!t) continue;
        T_CHECK(t->type == k_t[i].type && t->n_dims == k_t[i].n_dims, "tensor %d type", i);
        T_CHECK(memcmp(t->ne, k_t[i].ne, sizeof t->ne) == 0 && memcmp(t->ne_global, k_t[i].neg, sizeof t->ne) == 0,
                "tensor %d shapes", i);
        T_CHECK(t->split_axis == k_t[i].axis && t->split_count == k_t[i].count &&
                    t->split_index == (k_t[i].axis == BLOB_AXIS_NONE ? 0u : 1u),
                "tensor %d split", i);
        T_CHECK(t->size == k_t[i].size, "tensor %d size %llu, expected %llu", i, (unsigned long long)t->size,
                (unsigned long long)k_t[i].size);
        T_CHECK(t->offset % 4096 == 0 && t->offset >= prev_end, "tensor %d offset", i);
        prev_end = t->offset + t->size;
        T_CHECK(memcmp(t->data, g_data[i], k_t[i].size) == 0, "tensor %d data", i);
        canon(g_data[i], k_t[i].size, h);
        T_CHECK(memcmp(t->hash, h, 16) == 0, "tensor %d hash", i);
        T_CHECK(blob_find_tensor(b, k_t[i].name) == t && blob_find_tensor_index(b, k_t[i].name) == i, "find %d", i);
        T_CHECK(blob_verify_tensor(b, (uint64_t)i, &e) == G5_OK, "verify tensor %d", i);
    }
    T_CHECK(blob_find_tensor(b, "nope") == NULL && blob_find_tensor_index(b, "a.weigh") == -1, "absent name");
    for (uint64_t c = 0; c < in->n_chunks; c++) {
        uint64_t s = data_off + c * 4096, n = len - s < 4096 ? len - s : 4096;
        canon(img + s, n, h);
        T_CHECK(memcmp(blob_get_chunk_hash(b, c), h, 16) == 0, "chunk %llu hash", (unsigned long long)c);
    }
    const gguf_ctx *m = blob_get_meta(b);
    const char *str;
    uint64_t sl;
    uint32_t u;
    T_CHECK(m && gguf_get_str(m, "general.architecture", &str, &sl, NULL) == G5_OK && sl == 7 &&
                memcmp(str, "glm-dsa", 7) == 0,
            "metadata string");
    T_CHECK(m && gguf_get_u32(m, "glm-dsa.block_count", &u, NULL) == G5_OK && u == 4, "metadata u32");
    T_CHECK(m && gguf_get_arr_str(m, "tokenizer.ggml.tokens", 599, &str, &sl, NULL) == G5_OK && sl == 6 &&
                memcmp(str, "tok599", 6) == 0,
            "metadata token");
    for (uint32_t jobs = 1; jobs <= 3; jobs += 2) {
        blob_verify_stats st;
        const blob *list[1] = {b};
        T_CHECK(blob_verify_data(list, 1, jobs, &st, NULL, NULL, 0, &e) == G5_OK, "verify jobs %u: %s", jobs, e.msg);
        T_CHECK(st.bytes == data_size && st.n_chunks_bad == 0 && st.n_tensors_bad == 0, "verify stats");
        blob_verify_stats_clear(&st);
    }
    blob_free(b);

    /* Every byte of the index region is protected: each single flip fails the open. */
    uint64_t detected = 0;
    for (uint64_t pos = 0; pos < data_off; pos++) {
        img[pos] ^= (uint8_t)(1u << (pos % 8));
        blob *x = NULL;
        if (blob_parse_buffer(img, len, "flip", 0, &x, NULL) != G5_OK) detected++;
        blob_free(x);
        img[pos] ^= (uint8_t)(1u << (pos % 8));
    }
    T_CHECK(detected == data_off, "index flips detected: %llu of %llu", (unsigned long long)detected,
            (unsigned long long)data_off);
    /* A flip in the tensor table names the damaged entry. */
    {
        const uint64_t tab = g5_rd_u64(img + 104);
        img[tab + 2 * 160 + 20] ^= 4;
        blob *x = NULL;
        g5_status st = blob_parse_buffer(img, len, "flip", 0, &x, &e);
        T_CHECK(st == G5_ERR_CHECKSUM && strstr(e.msg, "tensor table") && strstr(e.msg, "entry 2"), "%s", e.msg);
        img[tab + 2 * 160 + 20] ^= 4;
    }
    /* Data flips: parse still succeeds (data is checked by verify), verify names tensor and chunk. */
    uint64_t n_data_flips = 0, named = 0;
    for (uint64_t pos = data_off; pos < len; pos += 97) {
        img[pos] ^= 0x10;
        blob *x = NULL;
        if (blob_parse_buffer(img, len, "flip", 0, &x, &e) == G5_OK) {
            blob_verify_stats st;
            const blob *list[1] = {x};
            g5_status vs = blob_verify_data(list, 1, 2, &st, NULL, NULL, 0, &e);
            int in_tensor = -1;
            for (int i = 0; i < NT; i++) {
                const blob_tensor *t = blob_get_tensor(x, (uint64_t)i);
                if (pos >= t->offset && pos < t->offset + t->size) in_tensor = i;
            }
            int ok = vs == G5_ERR_CHECKSUM && st.n_chunks_bad == 1 && st.bad_chunks[0] == (pos - data_off) / 4096;
            if (in_tensor >= 0)
                ok = ok && st.n_tensors_bad == 1 && st.bad_tensors[0] == (uint64_t)in_tensor &&
                     strstr(e.msg, k_t[in_tensor].name) != NULL;
            else
                ok = ok && st.n_tensors_bad == 0 && strstr(e.msg, "chunk") != NULL;
            named += ok;
            blob_verify_stats_clear(&st);
        }
        blob_free(x);
        n_data_flips++;
        img[pos] ^= 0x10;
    }
    T_CHECK(n_data_flips >= 200 && named == n_data_flips, "data flips named: %llu of %llu",
            (unsigned long long)named, (unsigned long long)n_data_flips);

    /* Truncation and trailing bytes. */
    const size_t cuts[] = {len - 1, data_off + 1, data_off, 4096, 320, 319, 12, 3, 0};
    for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++) {
        blob *x = NULL;
        g5_status st = blob_parse_buffer(img, cuts[k], "cut", 0, &x, &e);
        T_CHECK(st == G5_ERR_TRUNCATED, "cut at %zu: %s (%s)", cuts[k], g5_strerror(st), e.msg);
        blob_free(x);
    }
    uint8_t *longer = malloc(len + 1);
    memcpy(longer, img, len);
    longer[len] = 0;
    blob *x = NULL;
    T_CHECK(blob_parse_buffer(longer, len + 1, "long", 0, &x, &e) == G5_ERR_FORMAT, "trailing byte");
    free(longer);

    /* Structural checks, on resealed images (hashes recomputed as the spec defines them). */
    const uint64_t tab = g5_rd_u64(img + 104);
    struct { uint64_t at; int width; uint64_t val; g5_status want; const char *what; } edits[] = {
        {tab + 1 * 160 + 96, 8, 100, G5_ERR_ALIGN, "offset not 4096-aligned"},
        {tab + 1 * 160 + 96, 8, 0, G5_ERR_OVERLAP, "tensor overlapping the previous"},
        {tab + 1 * 160 + 104, 8, 6799, G5_ERR_SIZE, "size != type x shape"},
        {tab + 1 * 160 + 12, 4, 63, G5_ERR_TENSOR_TYPE, "unknown type"},
        {tab + 1 * 160 + 64 + 8, 8, 201, G5_ERR_FORMAT, "global shape != local x count"},
        {tab + 1 * 160 + 24, 4, 2, G5_ERR_FORMAT, "split index >= count"},
        {tab + 0 * 160 + 20, 4, 0, G5_ERR_FORMAT, "replicated tensor with an axis but count 1 fine? no: axis 0 count 1"},
        {tab + 1 * 160 + 16, 4, 5, G5_ERR_NDIMS, "n_dims 5"},
        {tab + 1 * 160 + 40, 8, 0, G5_ERR_NDIMS, "zero dimension"},
        {tab + 4 * 160 + 96, 8, 1ull << 40, G5_ERR_BOUNDS, "tensor past the data region"},
        {tab + 1 * 160 + 8, 4, 0, G5_ERR_FORMAT, "empty name"},
        {tab + 1 * 160 + 120, 8, 1, G5_ERR_FORMAT, "reserved bytes"},
        {20, 4, 0, G5_ERR_FORMAT, "tp 0"},
        {24, 4, 2, G5_ERR_FORMAT, "rank >= tp"},
        {28, 4, 2, G5_ERR_FORMAT, "placement 2"},
        {72, 8, 5000, G5_ERR_FORMAT, "chunk size not a power of two"},
        {80, 8, 1, G5_ERR_FORMAT, "chunk count"},
        {176, 8, data_off + 8, G5_ERR_ALIGN, "data offset misaligned"},
        {104, 8, tab + 8, G5_ERR_FORMAT, "table not where the layout puts it"},
        {64, 8, 1ull << 30, G5_ERR_COUNT, "absurd tensor count"},
        {16, 4, 2, G5_ERR_FORMAT, "unknown header flag"},
    };
    for (size_t k = 0; k < sizeof edits / sizeof edits[0]; k++) {
        uint8_t *c = malloc(len);
        memcpy(c, img, len);
        if (edits[k].width == 8) g5_wr_u64(c + edits[k].at, edits[k].val);
        else g5_wr_u32(c + edits[k].at, (uint32_t)edits[k].val);
        reseal(c);
        blob *y = NULL;
        g5_status st = blob_parse_buffer(c, len, "edit", 0, &y, &e);
        /* "axis 0 count 1" on a replicated tensor is valid only if index 0 < count 1 holds and
         * the shapes agree: it is. Expect success there. */
        if (k == 6)
            T_CHECK(st == G5_OK, "%s: %s", edits[k].what, e.msg);
        else
            T_CHECK(st == edits[k].want, "%s: got %s (%s)", edits[k].what, g5_strerror(st), st ? e.msg : "");
        blob_free(y);
        /* The same edit without resealing is caught by a hash, and with NO_HASH by the same check. */
        if (k != 6) {
            memcpy(c, img, len);
            if (edits[k].width == 8) g5_wr_u64(c + edits[k].at, edits[k].val);
            else g5_wr_u32(c + edits[k].at, (uint32_t)edits[k].val);
            y = NULL;
            T_CHECK(blob_parse_buffer(c, len, "edit", 0, &y, NULL) != G5_OK, "%s unsealed", edits[k].what);
            blob_free(y);
        }
        free(c);
    }
    /* Duplicate names: point entry 1's name at entry 0's. */
    {
        uint8_t *c = malloc(len);
        memcpy(c, img, len);
        /* make entry 1 name "a.weight" by reusing entry 0's string */
        memcpy(c + tab + 160, c + tab, 12);
        reseal(c);
        blob *y = NULL;
        T_CHECK(blob_parse_buffer(c, len, "dup", 0, &y, &e) == G5_ERR_DUPLICATE, "duplicate names: %s", e.msg);
        blob_free(y);
        free(c);
    }
    free(img);

    /* Uncompressed metadata round trip. */
    wopts o2 = {1, 0, 0x11, 0, 0, 0};
    T_CHECK(write_blob(path, &o2, &e) == G5_OK, "write raw: %s", e.msg);
    T_CHECK(blob_open(path, &b, &e) == G5_OK, "open raw: %s", e.msg);
    if (b) {
        T_CHECK(!(blob_get_info(b)->flags & BLOB_FLAG_META_ZSTD), "raw metadata flag");
        T_CHECK(blob_get_info(b)->meta_raw_size == blob_get_info(b)->meta_size, "raw sizes");
        T_CHECK(gguf_get_n_kv(blob_get_meta(b)) == 3, "raw metadata keys");
        blob_free(b);
    }
}

static void test_writer_errors(const char *dir) {
    char path[4200], tmp[4300];
    snprintf(path, sizeof path, "%s/err.g5b", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    g5_error e;
    /* Injected full disk. */
    wopts o = {2, 0, 1, 0, 5000, 0};
    g5_status st = write_blob(path, &o, &e);
    T_CHECK(st == G5_ERR_IO && strstr(e.msg, "No space left") && strstr(e.msg, "err.g5b.tmp"), "ENOSPC: %s", e.msg);
    T_CHECK(!exists(path) && !exists(tmp), "nothing left after a failed write");
    /* Bad parameters. */
    wopts o2 = {2, 2, 1, 0, 0, 0};
    T_CHECK(write_blob(path, &o2, &e) == G5_ERR_INVALID_ARG, "rank >= tp refused");
    /* Too much data, and finishing early. */
    uint8_t *meta;
    uint64_t ml;
    make_meta(&meta, &ml);
    blob_writer_tensor wt = {"x", QT_F32, 1, {8, 1, 1, 1}, {8, 1, 1, 1}, BLOB_AXIS_NONE, 0, 1, 0};
    blob_source_desc sd = {"m.gguf", 100, 50, {0}, {0}};
    blob_writer_params p = {0};
    p.tp = 1;
    p.meta = meta;
    p.meta_len = ml;
    p.n_sources = 1;
    p.sources = &sd;
    p.kv_b_type = QT_F32;
    blob_writer *w;
    uint8_t buf[64] = {0};
    T_CHECK(blob_writer_create(path, &p, &wt, 1, &w, &e) == G5_OK, "create: %s", e.msg);
    T_CHECK(exists(tmp), "writes go to PATH.tmp");
    T_CHECK(blob_writer_write(w, buf, 16, &e) == G5_OK, "partial write");
    T_CHECK(blob_writer_finish(w, NULL, &e) != G5_OK && strstr(e.msg, "16 of 32"), "finish early: %s", e.msg);
    blob_writer_free(w);
    T_CHECK(!exists(tmp) && !exists(path), "abandoned writer leaves nothing");
    T_CHECK(blob_writer_create(path, &p, &wt, 1, &w, &e) == G5_OK, "create");
    T_CHECK(blob_writer_write(w, buf, 33, &e) != G5_OK, "write past the last tensor refused");
    blob_writer_abort(w, 1);
    T_CHECK(exists(tmp) && !exists(path), "abort with keep_tmp keeps only the temporary");
    unlink(tmp);
    /* A tensor-less blob is valid. */
    T_CHECK(blob_writer_create(path, &p, &wt, 0, &w, &e) == G5_OK, "create empty");
    T_CHECK(blob_writer_finish(w, NULL, &e) == G5_OK, "finish empty: %s", e.msg);
    blob_writer_free(w);
    blob *b;
    T_CHECK(blob_open(path, &b, &e) == G5_OK && blob_n_tensors(b) == 0 && blob_get_info(b)->n_chunks == 0,
            "empty blob: %s", e.msg);
    blob_free(b);
    free(meta);
}

static void test_sets(const char *dir) {
    char sdir[4200], p0[4300], p1[4300], pr[4300];
    snprintf(sdir, sizeof sdir, "%s/set", dir);
    mkdir(sdir, 0755);
    snprintf(p0, sizeof p0, "%s/rank-00000-of-00002.g5b", sdir);
    snprintf(p1, sizeof p1, "%s/rank-00001-of-00002.g5b", sdir);
    snprintf(pr, sizeof pr, "%s/blobset.g5s", sdir);
    char fn[64];
    blob_rank_filename(1, 2, fn, sizeof fn);
    T_CHECK(strcmp(fn, "rank-00001-of-00002.g5b") == 0, "rank file name");
    g5_error e;
    wopts o0 = {2, 0, 0x5e, 9, 0, 0}, o1 = {2, 1, 0x5e, 9, 0, 0};
    T_CHECK(write_blob(p0, &o0, &e) == G5_OK && write_blob(p1, &o1, &e) == G5_OK, "write ranks");
    blob_set *s;
    T_CHECK(blob_set_open(sdir, &s, &e) == G5_ERR_NOT_FOUND && strstr(e.msg, "set record"), "no record: %s", e.msg);
    blob_set_record rec = {BLOB_SET_VERSION, 2, BLOB_PLACE_TP, 0x010203, {0}, NULL};
    memset(rec.set_id, 0x5e, 16);
    rec.ranks = calloc(2, sizeof *rec.ranks);
    const char *paths[2] = {p0, p1};
    for (int r = 0; r < 2; r++) {
        blob *b;
        T_CHECK(blob_open(paths[r], &b, &e) == G5_OK, "open");
        rec.ranks[r].file_size = blob_get_info(b)->file_size;
        memcpy(rec.ranks[r].header_hash, blob_get_info(b)->header_hash, 16);
        blob_free(b);
    }
    T_CHECK(blob_set_record_write(sdir, &rec, &e) == G5_OK, "record write: %s", e.msg);
    T_CHECK(blob_set_open(sdir, &s, &e) == G5_OK, "set open: %s", e.msg);
    if (s) {
        T_CHECK(blob_set_tp(s) == 2 && blob_get_info(blob_set_rank(s, 1))->rank == 1 && blob_set_rank(s, 2) == NULL,
                "set accessors");
        blob_set_free(s);
    }
    /* Record: layout and every byte protected. */
    size_t rl;
    uint8_t *ri = t_read_file(pr, &rl);
    T_CHECK(ri && rl == 64 + 2 * 64 && memcmp(ri, "G5BLOBST", 8) == 0, "record size/magic");
    uint64_t det = 0;
    for (size_t i = 0; ri && i < rl; i++) {
        ri[i] ^= 0x20;
        blob_set_record r2;
        if (blob_set_record_parse(ri, rl, "rec", &r2, NULL) != G5_OK) det++;
        else blob_set_record_clear(&r2);
        ri[i] ^= 0x20;
    }
    T_CHECK(det == rl, "record flips detected %llu of %zu", (unsigned long long)det, rl);
    free(ri);
    /* Ranks swapped. */
    char tmp[4400];
    snprintf(tmp, sizeof tmp, "%s.x", p0);
    rename(p0, tmp);
    rename(p1, p0);
    rename(tmp, p1);
    T_CHECK(blob_set_open(sdir, &s, &e) == G5_ERR_MISMATCH && strstr(e.msg, "holds rank 1"), "swapped: %s", e.msg);
    rename(p0, tmp);
    rename(p1, p0);
    rename(tmp, p1);
    /* A rank of another set (other set id) in place of rank 1. */
    wopts of = {2, 1, 0x77, 9, 0, 0};
    T_CHECK(write_blob(p1, &of, &e) == G5_OK, "foreign rank");
    T_CHECK(blob_set_open(sdir, &s, &e) == G5_ERR_MISMATCH && strstr(e.msg, "belongs to set"), "foreign: %s", e.msg);
    blob *a, *b;
    T_CHECK(blob_open(p0, &a, &e) == G5_OK && blob_open(p1, &b, &e) == G5_OK, "open pair");
    T_CHECK(blob_check_compatible(a, b, &e) == G5_ERR_MISMATCH, "different set ids are incompatible");
    blob_free(b);
    /* Same set id but a different tensor type: incompatible. */
    wopts ot = {2, 1, 0x5e, 9, 0, QT_Q4_0};
    /* d.weight {256, 40} as Q4_0 has the same byte size as Q4_K */
    T_CHECK(write_blob(p1, &ot, &e) == G5_OK, "rank with another type: %s", e.msg);
    T_CHECK(blob_open(p1, &b, &e) == G5_OK, "open");
    T_CHECK(blob_check_compatible(a, b, &e) == G5_ERR_MISMATCH && strstr(e.msg, "d.weight"), "type differs: %s", e.msg);
    blob_free(a);
    blob_free(b);
    /* Missing rank. */
    unlink(p1);
    T_CHECK(blob_set_open(sdir, &s, &e) == G5_ERR_IO && strstr(e.msg, "rank-00001-of-00002.g5b"), "missing: %s", e.msg);
    blob_set_record_clear(&rec);
}

int main(void) {
    for (int i = 0; i < NT; i++) {
        g_data[i] = malloc(k_t[i].size);
        for (uint64_t k = 0; k < k_t[i].size; k++) g_data[i][k] = (uint8_t)next_rand();
    }
    uint8_t h[16];
    blob_hash128("abc", 3, h);
    uint8_t w[16];
    canon("abc", 3, w);
    T_CHECK(memcmp(h, w, 16) == 0, "blob_hash128 is canonical XXH3-128");
    char hex[33];
    uint8_t z[16] = {0x01, 0xab};
    blob_hash_hex(z, hex);
    T_CHECK(strcmp(hex, "01ab0000000000000000000000000000") == 0, "hex: %s", hex);
    const char *dir = t_tmpdir();
    test_roundtrip(dir);
    test_writer_errors(dir);
    test_sets(dir);
    t_rmtree(dir);
    for (int i = 0; i < NT; i++) free(g_data[i]);
    return t_report("test_blob");
}
