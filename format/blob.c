#include "blob.h"
#include "mapguard.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include "quant.h"

#include "blob_int.h"

/* ---- helpers ---- */

void blob_hash128(const void *data, size_t len, uint8_t out[16]) {
    XXH128_hash_t h = XXH3_128bits(data, len);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, h);
    memcpy(out, c.digest, 16);
}

void blob_hash_hex(const uint8_t h[16], char out[33]) {
    static const char hx[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        out[2 * i] = hx[h[i] >> 4];
        out[2 * i + 1] = hx[h[i] & 15];
    }
    out[32] = 0;
}

void blob_rank_filename(uint32_t rank, uint32_t tp, char *out, size_t cap) {
    snprintf(out, cap, "rank-%05u-of-%05u.g5b", rank, tp);
}

const char *blob_placement_name(uint32_t p) {
    return p == BLOB_PLACE_TP ? "tp" : p == BLOB_PLACE_EP ? "ep" : "?";
}

/* ---- reading ---- */

struct blob {
    char *path;
    const uint8_t *buf;
    size_t len;
    void *map;              /* non-NULL when blob_open mapped the file */
    size_t map_len;
    blob_info info;
    blob_source *sources;
    blob_tensor *tensors;
    uint64_t *by_name;      /* tensor indexes sorted by name */
    const uint8_t *chunk_hashes;
    uint8_t *meta_buf;      /* decompressed metadata (owned), or NULL */
    gguf_ctx *meta;
};

static const blob *g_sort_blob; /* qsort has no context argument in C11 */
static int cmp_by_name(const void *a, const void *b) {
    const blob_tensor *t = g_sort_blob->tensors;
    return strcmp(t[*(const uint64_t *)a].name, t[*(const uint64_t *)b].name);
}
static pthread_mutex_t g_sort_lock = PTHREAD_MUTEX_INITIALIZER;

/* A name in the strings section: NUL-terminated at off + len, no NUL inside. */
static g5_status get_name(const uint8_t *strs, uint64_t str_size, uint64_t off, uint64_t len,
                          uint64_t str_file_off, const char *name, const char *what,
                          const char **out, g5_error *err) {
    uint64_t end;
    if (len == 0 || len > BLOB_MAX_NAME)
        return g5_fail(err, G5_ERR_FORMAT, "%s: %s: name length %llu (must be 1..%d)", name, what,
                       (unsigned long long)len, BLOB_MAX_NAME);
    if (g5_add_u64(off, len, &end) || end >= str_size)
        return g5_fail(err, G5_ERR_BOUNDS, "%s: %s: name [%llu, +%llu] outside the %llu-byte strings section",
                       name, what, (unsigned long long)off, (unsigned long long)len,
                       (unsigned long long)str_size);
    if (strs[end] != 0)
        return g5_fail_at(err, G5_ERR_FORMAT, str_file_off + end, "%s: %s: name is not NUL-terminated",
                          name, what);
    if (memchr(strs + off, 0, len))
        return g5_fail_at(err, G5_ERR_FORMAT, str_file_off + off, "%s: %s: name holds a NUL byte",
                          name, what);
    *out = (const char *)strs + off;
    return G5_OK;
}

static g5_status parse_tensor(blob *b, uint64_t i, const uint8_t *e, uint64_t e_off,
                              const uint8_t *strs, uint64_t str_size, uint64_t str_off,
                              uint64_t *prev_end, uint32_t pflags, g5_error *err) {
    const char *nm = b->path;
    blob_tensor *t = &b->tensors[i];
    g5_status st;
    if (!(pflags & BLOB_PARSE_NO_HASH)) {
        uint8_t h[16];
        entry_hash(e, h);
        if (memcmp(h, e + T_EHASH, 16) != 0)
            return g5_fail_at(err, G5_ERR_CHECKSUM, e_off,
                              "%s: tensor table entry %llu: entry XXH3-128 mismatch (damaged entry)",
                              nm, (unsigned long long)i);
    }
    char what[64];
    snprintf(what, sizeof what, "tensor table entry %llu", (unsigned long long)i);
    if ((st = get_name(strs, str_size, g5_rd_u64(e + T_NAMEOFF), g5_rd_u32(e + T_NAMELEN), str_off,
                       nm, what, &t->name, err)))
        return st;
    t->type = g5_rd_u32(e + T_TYPE);
    t->n_dims = g5_rd_u32(e + T_NDIMS);
    t->split_axis = g5_rd_u32(e + T_AXIS);
    t->split_index = g5_rd_u32(e + T_SINDEX);
    t->split_count = g5_rd_u32(e + T_SCOUNT);
    for (int d = 0; d < 4; d++) {
        t->ne[d] = g5_rd_u64(e + T_NE + 8 * d);
        t->ne_global[d] = g5_rd_u64(e + T_NEG + 8 * d);
    }
    uint64_t off = g5_rd_u64(e + T_OFF);
    t->size = g5_rd_u64(e + T_SIZE);
    t->flags = g5_rd_u32(e + T_FLAGS);
    memcpy(t->hash, e + T_HASH, 16);
    const quant_type_info *qi = quant_type_get(t->type);
    if (!qi)
        return g5_fail_at(err, G5_ERR_TENSOR_TYPE, e_off + T_TYPE, "%s: tensor '%s': unknown type id %u",
                          nm, t->name, t->type);
    if (t->n_dims < 1 || t->n_dims > 4)
        return g5_fail_at(err, G5_ERR_NDIMS, e_off + T_NDIMS, "%s: tensor '%s': n_dims %u", nm, t->name,
                          t->n_dims);
    for (uint32_t d = 0; d < 4; d++) {
        if (t->ne[d] == 0 || t->ne_global[d] == 0 ||
            (d >= t->n_dims && (t->ne[d] != 1 || t->ne_global[d] != 1)))
            return g5_fail_at(err, G5_ERR_NDIMS, e_off + T_NE + 8 * d,
                              "%s: tensor '%s': dimension %u is %llu (global %llu) with n_dims %u", nm,
                              t->name, d, (unsigned long long)t->ne[d],
                              (unsigned long long)t->ne_global[d], t->n_dims);
    }
    if (t->split_axis == BLOB_AXIS_NONE) {
        if (t->split_index != 0 || t->split_count != 1)
            return g5_fail_at(err, G5_ERR_FORMAT, e_off + T_SINDEX,
                              "%s: tensor '%s': replicated but split index %u of %u", nm, t->name,
                              t->split_index, t->split_count);
    } else if (t->split_axis >= t->n_dims || t->split_count < 1 || t->split_index >= t->split_count) {
        return g5_fail_at(err, G5_ERR_FORMAT, e_off + T_AXIS,
                          "%s: tensor '%s': split axis %u, index %u of %u with n_dims %u", nm, t->name,
                          t->split_axis, t->split_index, t->split_count, t->n_dims);
    }
    for (uint32_t d = 0; d < 4; d++) {
        uint64_t want = t->ne[d];
        if (d == t->split_axis && g5_mul_u64(t->ne[d], t->split_count, &want))
            return g5_fail_at(err, G5_ERR_OVERFLOW, e_off + T_NE + 8 * d, "%s: tensor '%s': shape overflow",
                              nm, t->name);
        if (want != t->ne_global[d])
            return g5_fail_at(err, G5_ERR_FORMAT, e_off + T_NEG + 8 * d,
                              "%s: tensor '%s': global ne[%u] = %llu but local %llu x %u slices", nm,
                              t->name, d, (unsigned long long)t->ne_global[d],
                              (unsigned long long)t->ne[d], d == t->split_axis ? t->split_count : 1);
    }
    if (t->flags & ~BLOB_TFLAG_DERIVED)
        return g5_fail_at(err, G5_ERR_FORMAT, e_off + T_FLAGS, "%s: tensor '%s': unknown flags 0x%x", nm,
                          t->name, t->flags);
    if (!all_zero(e + T_RES, T_HASH - T_RES))
        return g5_fail_at(err, G5_ERR_FORMAT, e_off + T_RES, "%s: tensor '%s': reserved bytes not zero",
                          nm, t->name);
    uint64_t want_size;
    st = tensor_bytes(t->type, t->ne, &want_size);
    if (st == G5_ERR_ALIGN)
        return g5_fail_at(err, G5_ERR_ALIGN, e_off + T_NE,
                          "%s: tensor '%s': ne[0] = %llu is not a multiple of %s's block of %u", nm,
                          t->name, (unsigned long long)t->ne[0], qi->name, qi->block_elems);
    if (st) return g5_fail_at(err, st, e_off + T_NE, "%s: tensor '%s': size overflow", nm, t->name);
    if (want_size != t->size)
        return g5_fail_at(err, G5_ERR_SIZE, e_off + T_SIZE,
                          "%s: tensor '%s': size %llu, but %s x {%llu, %llu, %llu, %llu} is %llu bytes",
                          nm, t->name, (unsigned long long)t->size, qi->name,
                          (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                          (unsigned long long)t->ne[2], (unsigned long long)t->ne[3],
                          (unsigned long long)want_size);
    uint64_t end;
    if (off % BLOB_DATA_ALIGN)
        return g5_fail_at(err, G5_ERR_ALIGN, e_off + T_OFF, "%s: tensor '%s': offset %llu not %d-aligned",
                          nm, t->name, (unsigned long long)off, BLOB_DATA_ALIGN);
    if (off < *prev_end)
        return g5_fail_at(err, G5_ERR_OVERLAP, e_off + T_OFF,
                          "%s: tensor '%s': offset %llu overlaps or precedes the previous tensor (ends at %llu)",
                          nm, t->name, (unsigned long long)off, (unsigned long long)*prev_end);
    if (g5_add_u64(off, t->size, &end) || end > b->info.data_size)
        return g5_fail_at(err, G5_ERR_BOUNDS, e_off + T_OFF,
                          "%s: tensor '%s': bytes [%llu, +%llu) run past the %llu-byte data region", nm,
                          t->name, (unsigned long long)off, (unsigned long long)t->size,
                          (unsigned long long)b->info.data_size);
    *prev_end = end;
    t->offset = b->info.data_offset + off;
    t->data = b->buf + t->offset;
    return G5_OK;
}

static g5_status parse_meta(blob *b, const uint8_t *buf, g5_error *err) {
    const blob_info *in = &b->info;
    const uint8_t *img = buf + in->meta_offset;
    uint64_t img_len = in->meta_size;
    g5_status st;
    if (in->flags & BLOB_FLAG_META_ZSTD) {
        if (in->meta_raw_size == 0 || in->meta_raw_size > MAX_META_RAW)
            return g5_fail_at(err, G5_ERR_FORMAT, H_META_RAW, "%s: metadata raw size %llu", b->path,
                              (unsigned long long)in->meta_raw_size);
        unsigned long long fcs = ZSTD_getFrameContentSize(img, img_len);
        if (fcs != in->meta_raw_size)
            return g5_fail_at(err, G5_ERR_COMPRESS, in->meta_offset,
                              "%s: metadata zstd frame holds %llu bytes, header says %llu", b->path,
                              fcs, (unsigned long long)in->meta_raw_size);
        b->meta_buf = malloc(in->meta_raw_size);
        if (!b->meta_buf) return g5_fail(err, G5_ERR_NOMEM, "%s: metadata", b->path);
        size_t r = ZSTD_decompress(b->meta_buf, in->meta_raw_size, img, img_len);
        if (ZSTD_isError(r) || r != in->meta_raw_size)
            return g5_fail_at(err, G5_ERR_COMPRESS, in->meta_offset, "%s: metadata: zstd: %s", b->path,
                              ZSTD_isError(r) ? ZSTD_getErrorName(r) : "short output");
        img = b->meta_buf;
        img_len = in->meta_raw_size;
    } else if (in->meta_raw_size != in->meta_size) {
        return g5_fail_at(err, G5_ERR_FORMAT, H_META_RAW,
                          "%s: metadata is stored raw but raw size %llu != size %llu", b->path,
                          (unsigned long long)in->meta_raw_size, (unsigned long long)in->meta_size);
    }
    char nm[4200];
    snprintf(nm, sizeof nm, "%s (metadata)", b->path);
    if ((st = gguf_parse_buffer(img, img_len, nm, &b->meta, err))) return st;
    if (gguf_get_n_tensors(b->meta) != 0)
        return g5_fail_at(err, G5_ERR_FORMAT, in->meta_offset, "%s: metadata image holds %lld tensors",
                          b->path, (long long)gguf_get_n_tensors(b->meta));
    return G5_OK;
}

/* The fields of one index section as the header describes it. */
typedef struct section {
    const char *name;
    int off_field, size_field, hash_field;
    uint64_t off, size, want_size;
} section;

g5_status blob_parse_buffer(const void *vbuf, size_t len, const char *name, uint32_t flags,
                            blob **out, g5_error *err) {
    *out = NULL;
    if (!name) name = "<blob>";
    const uint8_t *buf = vbuf;
    if (len < 12) return g5_fail(err, G5_ERR_TRUNCATED, "%s: %zu bytes, too short for a blob header", name, len);
    if (memcmp(buf, BLOB_MAGIC, 8) != 0)
        return g5_fail_at(err, G5_ERR_BAD_MAGIC, 0, "%s: header: magic is not '" BLOB_MAGIC "'", name);
    uint32_t version = g5_rd_u32(buf + H_VERSION);
    if (version != BLOB_VERSION)
        return g5_fail_at(err, G5_ERR_VERSION, H_VERSION, "%s: header: version %u (this reader knows %d)",
                          name, version, BLOB_VERSION);
    if (len < BLOB_HEADER_SIZE)
        return g5_fail(err, G5_ERR_TRUNCATED, "%s: %zu bytes, shorter than the %d-byte header", name, len,
                       BLOB_HEADER_SIZE);
    if (g5_rd_u32(buf + H_HSIZE) != BLOB_HEADER_SIZE)
        return g5_fail_at(err, G5_ERR_FORMAT, H_HSIZE, "%s: header: header_size %u (version 1 is %d)", name,
                          g5_rd_u32(buf + H_HSIZE), BLOB_HEADER_SIZE);
    if (!(flags & BLOB_PARSE_NO_HASH)) {
        uint8_t h[16];
        header_hash(buf, h);
        if (memcmp(h, buf + H_HASH_HDR, 16) != 0)
            return g5_fail_at(err, G5_ERR_CHECKSUM, 0, "%s: header (bytes 0..%d): XXH3-128 mismatch",
                              name, BLOB_HEADER_SIZE);
    }

    blob *b = calloc(1, sizeof *b);
    if (!b) return g5_fail(err, G5_ERR_NOMEM, "%s", name);
    g5_status st = G5_OK;
    b->path = strdup(name);
    b->buf = buf;
    b->len = len;
    if (!b->path) { st = g5_fail(err, G5_ERR_NOMEM, "%s", name); goto fail; }
    blob_info *in = &b->info;
    in->version = version;
    in->flags = g5_rd_u32(buf + H_FLAGS);
    in->tp = g5_rd_u32(buf + H_TP);
    in->rank = g5_rd_u32(buf + H_RANK);
    in->placement = g5_rd_u32(buf + H_PLACE);
    in->converter_version = g5_rd_u32(buf + H_CONV);
    in->kv_b_type = g5_rd_u32(buf + H_KVB);
    memcpy(in->set_id, buf + H_SETID, 16);
    in->n_sources = g5_rd_u32(buf + H_NSRC);
    in->n_tensors = g5_rd_u64(buf + H_NTENS);
    in->chunk_size = g5_rd_u64(buf + H_CHUNK);
    in->n_chunks = g5_rd_u64(buf + H_NCHUNK);
    in->meta_offset = g5_rd_u64(buf + H_META_OFF);
    in->meta_size = g5_rd_u64(buf + H_META_SIZE);
    in->meta_raw_size = g5_rd_u64(buf + H_META_RAW);
    in->data_offset = g5_rd_u64(buf + H_DATA_OFF);
    in->data_size = g5_rd_u64(buf + H_DATA_SIZE);
    in->file_size = g5_rd_u64(buf + H_FILE_SIZE);
    memcpy(in->header_hash, buf + H_HASH_HDR, 16);
    memcpy(in->meta_hash, buf + H_HASH_META, 16);

#define BAD(field, code, ...) do { st = g5_fail_at(err, code, field, __VA_ARGS__); goto fail; } while (0)
    if (in->flags & ~BLOB_FLAG_META_ZSTD) BAD(H_FLAGS, G5_ERR_FORMAT, "%s: header: unknown flags 0x%x", name, in->flags);
    if (in->tp < 1 || in->tp > MAX_TP) BAD(H_TP, G5_ERR_FORMAT, "%s: header: tp %u (1..%u)", name, in->tp, MAX_TP);
    if (in->rank >= in->tp) BAD(H_RANK, G5_ERR_FORMAT, "%s: header: rank %u with tp %u", name, in->rank, in->tp);
    if (in->placement > BLOB_PLACE_EP) BAD(H_PLACE, G5_ERR_FORMAT, "%s: header: placement %u", name, in->placement);
    if (!quant_type_get(in->kv_b_type)) BAD(H_KVB, G5_ERR_TENSOR_TYPE, "%s: header: kv_b type id %u", name, in->kv_b_type);
    if (in->n_sources < 1 || in->n_sources > MAX_SOURCES)
        BAD(H_NSRC, G5_ERR_COUNT, "%s: header: %u sources (1..%u)", name, in->n_sources, MAX_SOURCES);
    if (in->n_tensors > MAX_TENSORS) BAD(H_NTENS, G5_ERR_COUNT, "%s: header: %llu tensors", name, (unsigned long long)in->n_tensors);
    if (!all_zero(buf + H_RES0, 4) || !all_zero(buf + H_RES1, H_HASH_HDR - H_RES1))
        BAD(H_RES0, G5_ERR_FORMAT, "%s: header: reserved bytes not zero", name);
    if (in->chunk_size < BLOB_DATA_ALIGN || in->chunk_size > (1ull << 40) ||
        (in->chunk_size & (in->chunk_size - 1)))
        BAD(H_CHUNK, G5_ERR_FORMAT, "%s: header: chunk size %llu (a power of two, 4096..2^40)", name,
            (unsigned long long)in->chunk_size);
    if (in->data_size > (1ull << 56)) BAD(H_DATA_SIZE, G5_ERR_OVERFLOW, "%s: header: data size %llu", name, (unsigned long long)in->data_size);
    uint64_t want_chunks = (in->data_size + in->chunk_size - 1) / in->chunk_size;
    if (in->n_chunks != want_chunks)
        BAD(H_NCHUNK, G5_ERR_FORMAT, "%s: header: %llu chunks, but %llu data bytes in %llu-byte chunks make %llu",
            name, (unsigned long long)in->n_chunks, (unsigned long long)in->data_size,
            (unsigned long long)in->chunk_size, (unsigned long long)want_chunks);
    if (in->data_offset % BLOB_DATA_ALIGN)
        BAD(H_DATA_OFF, G5_ERR_ALIGN, "%s: header: data offset %llu not %d-aligned", name,
            (unsigned long long)in->data_offset, BLOB_DATA_ALIGN);
    uint64_t fsz;
    if (g5_add_u64(in->data_offset, in->data_size, &fsz) || fsz != in->file_size)
        BAD(H_FILE_SIZE, G5_ERR_FORMAT, "%s: header: file size %llu != data offset %llu + data size %llu",
            name, (unsigned long long)in->file_size, (unsigned long long)in->data_offset,
            (unsigned long long)in->data_size);
    if (len < in->file_size)
        BAD(H_FILE_SIZE, G5_ERR_TRUNCATED, "%s: file is %zu bytes, header says %llu: truncated", name, len,
            (unsigned long long)in->file_size);
    if (len > in->file_size)
        BAD(H_FILE_SIZE, G5_ERR_FORMAT, "%s: file is %zu bytes, header says %llu: trailing bytes", name,
            len, (unsigned long long)in->file_size);

    /* Sections: exact order and placement, 8-aligned, zero padding. */
    section sec[5] = {
        {"source table", H_SRC_OFF, H_SRC_SIZE, H_HASH_SRC, 0, 0, (uint64_t)in->n_sources * BLOB_SOURCE_ENTRY_SIZE},
        {"tensor table", H_TAB_OFF, H_TAB_SIZE, H_HASH_TAB, 0, 0, in->n_tensors * BLOB_TENSOR_ENTRY_SIZE},
        {"chunk table", H_CHK_OFF, H_CHK_SIZE, H_HASH_CHK, 0, 0, in->n_chunks * BLOB_CHUNK_ENTRY_SIZE},
        {"strings", H_STR_OFF, H_STR_SIZE, H_HASH_STR, 0, 0, UINT64_MAX},
        {"metadata", H_META_OFF, H_META_SIZE, H_HASH_META, 0, 0, UINT64_MAX},
    };
    uint64_t pos = BLOB_HEADER_SIZE;
    for (int s = 0; s < 5; s++) {
        section *x = &sec[s];
        x->off = g5_rd_u64(buf + x->off_field);
        x->size = g5_rd_u64(buf + x->size_field);
        uint64_t want_off = align_up(pos, 8), end;
        if (x->off != want_off)
            BAD(x->off_field, G5_ERR_FORMAT, "%s: header: %s offset %llu, expected %llu", name, x->name,
                (unsigned long long)x->off, (unsigned long long)want_off);
        if (x->want_size != UINT64_MAX && x->size != x->want_size)
            BAD(x->size_field, G5_ERR_SIZE, "%s: header: %s size %llu, expected %llu", name, x->name,
                (unsigned long long)x->size, (unsigned long long)x->want_size);
        if (g5_add_u64(x->off, x->size, &end) || end > in->data_offset)
            BAD(x->size_field, G5_ERR_BOUNDS, "%s: header: %s [%llu, +%llu) runs past the data offset %llu",
                name, x->name, (unsigned long long)x->off, (unsigned long long)x->size,
                (unsigned long long)in->data_offset);
        if (!all_zero(buf + pos, x->off - pos))
            BAD(pos, G5_ERR_FORMAT, "%s: padding before the %s is not zero", name, x->name);
        if (!(flags & BLOB_PARSE_NO_HASH)) {
            uint8_t h[16];
            blob_hash128(buf + x->off, x->size, h);
            if (memcmp(h, buf + x->hash_field, 16) != 0) {
                /* Name the damaged entry of a table where its own hash tells. */
                uint64_t bad = UINT64_MAX;
                if (s == 1)
                    for (uint64_t i = 0; i < in->n_tensors && bad == UINT64_MAX; i++) {
                        const uint8_t *e = buf + x->off + i * BLOB_TENSOR_ENTRY_SIZE;
                        entry_hash(e, h);
                        if (memcmp(h, e + T_EHASH, 16) != 0) bad = i;
                    }
                if (bad != UINT64_MAX)
                    st = g5_fail_at(err, G5_ERR_CHECKSUM, x->off + bad * BLOB_TENSOR_ENTRY_SIZE,
                                    "%s: %s (bytes %llu..%llu): XXH3-128 mismatch: entry %llu (tensor #%llu) is damaged",
                                    name, x->name, (unsigned long long)x->off, (unsigned long long)end,
                                    (unsigned long long)bad, (unsigned long long)bad);
                else
                    st = g5_fail_at(err, G5_ERR_CHECKSUM, x->off, "%s: %s (bytes %llu..%llu): XXH3-128 mismatch",
                                    name, x->name, (unsigned long long)x->off, (unsigned long long)end);
                goto fail;
            }
        }
        pos = end;
    }
    if (in->data_offset != align_up(pos, BLOB_DATA_ALIGN))
        BAD(H_DATA_OFF, G5_ERR_FORMAT, "%s: header: data offset %llu, expected %llu after the metadata", name,
            (unsigned long long)in->data_offset, (unsigned long long)align_up(pos, BLOB_DATA_ALIGN));
    if (!all_zero(buf + pos, in->data_offset - pos))
        BAD(pos, G5_ERR_FORMAT, "%s: padding before the data region is not zero", name);
    if (sec[4].size == 0) BAD(H_META_SIZE, G5_ERR_FORMAT, "%s: header: empty metadata section", name);
    in->meta_offset = sec[4].off;
    const uint8_t *strs = buf + sec[3].off;
    const uint64_t str_size = sec[3].size;
    b->chunk_hashes = buf + sec[2].off;

    b->sources = calloc(in->n_sources, sizeof *b->sources);
    b->tensors = calloc(in->n_tensors ? in->n_tensors : 1, sizeof *b->tensors);
    b->by_name = calloc(in->n_tensors ? in->n_tensors : 1, sizeof *b->by_name);
    if (!b->sources || !b->tensors || !b->by_name) { st = g5_fail(err, G5_ERR_NOMEM, "%s", name); goto fail; }
    for (uint32_t i = 0; i < in->n_sources; i++) {
        const uint64_t eo = sec[0].off + (uint64_t)i * BLOB_SOURCE_ENTRY_SIZE;
        const uint8_t *e = buf + eo;
        blob_source *s = &b->sources[i];
        char what[64];
        snprintf(what, sizeof what, "source entry %u", i);
        s->split = g5_rd_u32(e + S_SPLIT);
        if (s->split != i) BAD(eo + S_SPLIT, G5_ERR_FORMAT, "%s: %s: split index %u", name, what, s->split);
        if ((st = get_name(strs, str_size, g5_rd_u64(e + S_NAMEOFF), g5_rd_u32(e + S_NAMELEN), sec[3].off,
                           name, what, &s->name, err)))
            goto fail;
        s->file_size = g5_rd_u64(e + S_FSIZE);
        s->header_size = g5_rd_u64(e + S_HSIZE);
        memcpy(s->header_hash, e + S_HASH, 16);
        memcpy(s->sample_hash, e + S_SAMPLE, 16);
        if (s->header_size == 0 || s->header_size > s->file_size)
            BAD(eo + S_HSIZE, G5_ERR_FORMAT, "%s: %s: header region %llu of a %llu-byte file", name, what,
                (unsigned long long)s->header_size, (unsigned long long)s->file_size);
    }
    uint64_t prev_end = 0;
    for (uint64_t i = 0; i < in->n_tensors; i++) {
        const uint64_t eo = sec[1].off + i * BLOB_TENSOR_ENTRY_SIZE;
        if ((st = parse_tensor(b, i, buf + eo, eo, strs, str_size, sec[3].off, &prev_end, flags, err)))
            goto fail;
        b->by_name[i] = i;
    }
    if (in->n_tensors > 1) {
        pthread_mutex_lock(&g_sort_lock);
        g_sort_blob = b;
        qsort(b->by_name, in->n_tensors, sizeof *b->by_name, cmp_by_name);
        pthread_mutex_unlock(&g_sort_lock);
        for (uint64_t i = 1; i < in->n_tensors; i++)
            if (strcmp(b->tensors[b->by_name[i - 1]].name, b->tensors[b->by_name[i]].name) == 0)
                BAD(sec[1].off + b->by_name[i] * BLOB_TENSOR_ENTRY_SIZE, G5_ERR_DUPLICATE,
                    "%s: tensor name '%s' appears twice", name, b->tensors[b->by_name[i]].name);
    }
    if ((st = parse_meta(b, buf, err))) goto fail;
#undef BAD
    *out = b;
    return G5_OK;
fail:
    blob_free(b);
    return st;
}

g5_status blob_open(const char *path, blob **out, g5_error *err) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return g5_fail(err, G5_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return g5_fail(err, G5_ERR_IO, "%s: fstat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return g5_fail(err, G5_ERR_IO, "%s: not a regular file", path);
    }
    if (sb.st_size < BLOB_HEADER_SIZE) {
        close(fd);
        return g5_fail(err, G5_ERR_TRUNCATED, "%s: %lld bytes, shorter than the %d-byte header", path,
                       (long long)sb.st_size, BLOB_HEADER_SIZE);
    }
    size_t len = (size_t)sb.st_size;
    void *map = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return g5_fail(err, G5_ERR_IO, "%s: mmap: %s", path, strerror(e));
    g5_mapguard_add(map, len, path); /* a truncation under us: an error, not a crash */
    g5_status st = blob_parse_buffer(map, len, path, 0, out, err);
    if (st) {
        g5_mapguard_remove(map);
        munmap(map, len);
        return st;
    }
    (*out)->map = map;
    (*out)->map_len = len;
    return G5_OK;
}

void blob_free(blob *b) {
    if (!b) return;
    gguf_free(b->meta);
    free(b->meta_buf);
    free(b->sources);
    free(b->tensors);
    free(b->by_name);
    if (b->map) {
        g5_mapguard_remove(b->map);
        munmap(b->map, b->map_len);
    }
    free(b->path);
    free(b);
}

const blob_info *blob_get_info(const blob *b) { return &b->info; }
const char *blob_get_path(const blob *b) { return b->path; }
const uint8_t *blob_get_bytes(const blob *b, uint64_t *len) {
    if (len) *len = b->len;
    return b->buf;
}
const gguf_ctx *blob_get_meta(const blob *b) { return b->meta; }
uint32_t blob_n_sources(const blob *b) { return b->info.n_sources; }
const blob_source *blob_get_source(const blob *b, uint32_t i) {
    return i < b->info.n_sources ? &b->sources[i] : NULL;
}
uint64_t blob_n_tensors(const blob *b) { return b->info.n_tensors; }
const blob_tensor *blob_get_tensor(const blob *b, uint64_t i) {
    return i < b->info.n_tensors ? &b->tensors[i] : NULL;
}
int64_t blob_find_tensor_index(const blob *b, const char *name) {
    uint64_t lo = 0, hi = b->info.n_tensors;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(b->tensors[b->by_name[mid]].name, name);
        if (c == 0) return (int64_t)b->by_name[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}
const blob_tensor *blob_find_tensor(const blob *b, const char *name) {
    int64_t i = blob_find_tensor_index(b, name);
    return i < 0 ? NULL : &b->tensors[i];
}
const uint8_t *blob_get_chunk_hash(const blob *b, uint64_t i) {
    return i < b->info.n_chunks ? b->chunk_hashes + i * BLOB_CHUNK_ENTRY_SIZE : NULL;
}

void blob_describe_chunk(const blob *b, uint64_t i, char *buf, size_t cap) {
    const blob_info *in = &b->info;
    uint64_t s = i * in->chunk_size, e = s + in->chunk_size;
    if (e > in->data_size) e = in->data_size;
    const char *first = NULL, *last = NULL;
    for (uint64_t k = 0; k < in->n_tensors; k++) {
        const blob_tensor *t = &b->tensors[k];
        uint64_t ts = t->offset - in->data_offset, te = ts + t->size;
        if (te > s && ts < e) {
            if (!first) first = t->name;
            last = t->name;
        }
    }
    if (first)
        snprintf(buf, cap, "chunk %llu (file bytes %llu..%llu, tensors '%s' .. '%s')", (unsigned long long)i,
                 (unsigned long long)(in->data_offset + s), (unsigned long long)(in->data_offset + e),
                 first, last);
    else
        snprintf(buf, cap, "chunk %llu (file bytes %llu..%llu, padding only)", (unsigned long long)i,
                 (unsigned long long)(in->data_offset + s), (unsigned long long)(in->data_offset + e));
}

g5_status blob_verify_tensor(const blob *b, uint64_t i, g5_error *err) {
    if (i >= b->info.n_tensors) return g5_fail(err, G5_ERR_INVALID_ARG, "%s: tensor %llu of %llu", b->path,
                                               (unsigned long long)i, (unsigned long long)b->info.n_tensors);
    const blob_tensor *t = &b->tensors[i];
    uint8_t h[16];
    blob_hash128(t->data, t->size, h);
    if (memcmp(h, t->hash, 16) != 0) {
        char a[33], c[33];
        blob_hash_hex(t->hash, a);
        blob_hash_hex(h, c);
        return g5_fail_at(err, G5_ERR_CHECKSUM, t->offset,
                          "%s: tensor '%s' (bytes %llu..%llu): XXH3-128 mismatch (stored %s, computed %s)",
                          b->path, t->name, (unsigned long long)t->offset,
                          (unsigned long long)(t->offset + t->size), a, c);
    }
    return G5_OK;
}

/* ---- parallel data verification ---- */

typedef struct vunit {
    uint32_t blob;
    uint64_t c0, c1;       /* chunk range */
    uint64_t t0;           /* first tensor starting at or after the unit's start */
} vunit;

typedef struct vctx {
    const blob *const *blobs;
    blob_verify_stats *stats;
    vunit *units;
    uint64_t n_units;
    uint64_t next;         /* next unit to take (under lock) */
    uint64_t bytes_done;
    int failed_nomem;
    uint32_t running;
    pthread_mutex_t lock;
    pthread_cond_t cv;
} vctx;

static int push_u64(uint64_t **arr, uint64_t *n, uint64_t v) {
    if ((*n & (*n - 1)) == 0) { /* grow at powers of two */
        uint64_t cap = *n ? *n * 2 : 1;
        uint64_t *a = realloc(*arr, cap * sizeof **arr);
        if (!a) return -1;
        *arr = a;
    }
    (*arr)[(*n)++] = v;
    return 0;
}

static void vunit_run(vctx *c, const vunit *u, XXH3_state_t *cst, XXH3_state_t *tst) {
    const blob *b = c->blobs[u->blob];
    const blob_info *in = &b->info;
    const uint8_t *base = b->buf + in->data_offset;
    const uint64_t step = 4ull << 20;
    uint64_t j = u->t0;
    uint64_t done_since = 0;
    if (b->map) {
        uint64_t s = u->c0 * in->chunk_size, e = u->c1 * in->chunk_size;
        if (e > in->data_size) e = in->data_size;
        long pg = sysconf(_SC_PAGESIZE);
        if (pg > 0 && (in->data_offset + s) % (uint64_t)pg == 0)
            madvise((void *)(base + s), e - s, MADV_SEQUENTIAL);
    }
    for (uint64_t ch = u->c0; ch < u->c1; ch++) {
        uint64_t cs = ch * in->chunk_size, ce = cs + in->chunk_size;
        if (ce > in->data_size) ce = in->data_size;
        XXH3_128bits_reset(cst);
        for (uint64_t p = cs; p < ce;) {
            uint64_t q = p + step < ce ? p + step : ce;
            XXH3_128bits_update(cst, base + p, q - p);
            uint64_t r = p;
            while (j < in->n_tensors) {
                const blob_tensor *t = &b->tensors[j];
                uint64_t ts = t->offset - in->data_offset, te = ts + t->size;
                if (ts >= q) break;
                uint64_t a = r > ts ? r : ts, e = q < te ? q : te;
                if (a == ts) XXH3_128bits_reset(tst);
                if (a < e) XXH3_128bits_update(tst, base + a, e - a);
                if (te > q) break;
                uint8_t h[16];
                state_digest(tst, h);
                if (memcmp(h, t->hash, 16) != 0) {
                    pthread_mutex_lock(&c->lock);
                    if (push_u64(&c->stats[u->blob].bad_tensors, &c->stats[u->blob].n_tensors_bad, j))
                        c->failed_nomem = 1;
                    pthread_mutex_unlock(&c->lock);
                }
                r = te;
                j++;
            }
            done_since += q - p;
            p = q;
            if (done_since >= (64ull << 20)) {
                pthread_mutex_lock(&c->lock);
                c->bytes_done += done_since;
                c->stats[u->blob].bytes += done_since;
                pthread_mutex_unlock(&c->lock);
                done_since = 0;
            }
        }
        uint8_t h[16];
        state_digest(cst, h);
        if (memcmp(h, b->chunk_hashes + ch * BLOB_CHUNK_ENTRY_SIZE, 16) != 0) {
            pthread_mutex_lock(&c->lock);
            if (push_u64(&c->stats[u->blob].bad_chunks, &c->stats[u->blob].n_chunks_bad, ch))
                c->failed_nomem = 1;
            pthread_mutex_unlock(&c->lock);
        }
    }
    pthread_mutex_lock(&c->lock);
    c->bytes_done += done_since;
    c->stats[u->blob].bytes += done_since;
    pthread_mutex_unlock(&c->lock);
}

static void *vworker(void *arg) {
    vctx *c = arg;
    XXH3_state_t *cst = XXH3_createState(), *tst = XXH3_createState();
    for (;;) {
        pthread_mutex_lock(&c->lock);
        if (!cst || !tst) c->failed_nomem = 1;
        uint64_t i = c->next;
        if (i < c->n_units && !c->failed_nomem) c->next++;
        else i = c->n_units;
        pthread_mutex_unlock(&c->lock);
        if (i >= c->n_units) break;
        vunit_run(c, &c->units[i], cst, tst);
    }
    XXH3_freeState(cst);
    XXH3_freeState(tst);
    pthread_mutex_lock(&c->lock);
    c->running--;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

void blob_verify_stats_clear(blob_verify_stats *s) {
    if (!s) return;
    free(s->bad_chunks);
    free(s->bad_tensors);
    memset(s, 0, sizeof *s);
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

g5_status blob_verify_data(const blob *const *blobs, uint32_t n_blobs, uint32_t jobs,
                           blob_verify_stats *stats, blob_progress_fn progress, void *user,
                           double interval_s, g5_error *err) {
    vctx c;
    memset(&c, 0, sizeof c);
    c.blobs = blobs;
    c.stats = stats;
    uint64_t total = 0, cap = 0;
    for (uint32_t k = 0; k < n_blobs; k++) {
        memset(&stats[k], 0, sizeof stats[k]);
        total += blobs[k]->info.data_size;
        cap += blobs[k]->info.n_chunks;
    }
    c.units = malloc((cap ? cap : 1) * sizeof *c.units);
    if (!c.units) return g5_fail(err, G5_ERR_NOMEM, "verify: %llu units", (unsigned long long)cap);
    /* Units: runs of whole chunks that no tensor crosses, so one thread hashes every chunk and
     * every tensor of a unit in a single pass over its bytes. */
    for (uint32_t k = 0; k < n_blobs; k++) {
        const blob *b = blobs[k];
        const blob_info *in = &b->info;
        uint64_t j = 0;
        for (uint64_t ch = 0; ch < in->n_chunks;) {
            vunit u = {k, ch, ch + 1, 0};
            while (j < in->n_tensors && b->tensors[j].offset - in->data_offset < ch * in->chunk_size) j++;
            u.t0 = j;
            uint64_t jj = j;
            for (;;) {
                uint64_t bound = u.c1 * in->chunk_size;
                while (jj < in->n_tensors && b->tensors[jj].offset - in->data_offset + b->tensors[jj].size <= bound) jj++;
                if (jj < in->n_tensors && b->tensors[jj].offset - in->data_offset < bound) {
                    uint64_t te = b->tensors[jj].offset - in->data_offset + b->tensors[jj].size;
                    u.c1 = (te + in->chunk_size - 1) / in->chunk_size;
                } else {
                    break;
                }
            }
            c.units[c.n_units++] = u;
            ch = u.c1;
        }
    }
    if (jobs == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        jobs = n > 0 ? (uint32_t)n : 1;
    }
    if (jobs > c.n_units) jobs = c.n_units ? (uint32_t)c.n_units : 1;
    if (jobs > 256) jobs = 256;
    pthread_mutex_init(&c.lock, NULL);
    pthread_cond_init(&c.cv, NULL);
    pthread_t th[256];
    uint32_t started = 0;
    for (uint32_t i = 0; i < jobs; i++) {
        pthread_mutex_lock(&c.lock);
        c.running++;
        pthread_mutex_unlock(&c.lock);
        if (pthread_create(&th[i], NULL, vworker, &c) != 0) {
            pthread_mutex_lock(&c.lock);
            c.running--;
            pthread_mutex_unlock(&c.lock);
            break;
        }
        started++;
    }
    if (started == 0) {
        /* No threads: do the work here. */
        pthread_mutex_lock(&c.lock);
        c.running++;
        pthread_mutex_unlock(&c.lock);
        vworker(&c);
    }
    pthread_mutex_lock(&c.lock);
    while (c.running > 0) {
        if (progress && interval_s > 0) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            double t = ts.tv_sec + ts.tv_nsec * 1e-9 + interval_s;
            ts.tv_sec = (time_t)t;
            ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
            pthread_cond_timedwait(&c.cv, &c.lock, &ts);
            uint64_t d = c.bytes_done;
            pthread_mutex_unlock(&c.lock);
            progress(user, d, total);
            pthread_mutex_lock(&c.lock);
        } else {
            pthread_cond_wait(&c.cv, &c.lock);
        }
    }
    pthread_mutex_unlock(&c.lock);
    for (uint32_t i = 0; i < started; i++) pthread_join(th[i], NULL);
    pthread_mutex_destroy(&c.lock);
    pthread_cond_destroy(&c.cv);
    free(c.units);
    if (progress) progress(user, c.bytes_done, total);
    if (c.failed_nomem) return g5_fail(err, G5_ERR_NOMEM, "verify: out of memory");

    g5_status st = G5_OK;
    for (uint32_t k = 0; k < n_blobs; k++) {
        blob_verify_stats *s = &stats[k];
        if (s->n_chunks_bad) qsort(s->bad_chunks, s->n_chunks_bad, sizeof(uint64_t), cmp_u64);
        if (s->n_tensors_bad) qsort(s->bad_tensors, s->n_tensors_bad, sizeof(uint64_t), cmp_u64);
        if (st == G5_OK && (s->n_tensors_bad || s->n_chunks_bad)) {
            const blob *b = blobs[k];
            if (s->n_tensors_bad) {
                const blob_tensor *t = &b->tensors[s->bad_tensors[0]];
                st = g5_fail_at(err, G5_ERR_CHECKSUM, t->offset,
                                "%s: tensor '%s' (bytes %llu..%llu): XXH3-128 mismatch (%llu bad tensors, %llu bad chunks)",
                                b->path, t->name, (unsigned long long)t->offset,
                                (unsigned long long)(t->offset + t->size),
                                (unsigned long long)s->n_tensors_bad, (unsigned long long)s->n_chunks_bad);
            } else {
                char d[600];
                blob_describe_chunk(b, s->bad_chunks[0], d, sizeof d);
                st = g5_fail_at(err, G5_ERR_CHECKSUM, b->info.data_offset + s->bad_chunks[0] * b->info.chunk_size,
                                "%s: %s: XXH3-128 mismatch in padding between tensors (%llu bad chunks)",
                                b->path, d, (unsigned long long)s->n_chunks_bad);
            }
        }
    }
    return st;
}

/* ---- set checks ---- */

g5_status blob_check_rank(const blob *b, const blob_set_record *rec, uint32_t rank, g5_error *err) {
    const blob_info *in = &b->info;
    char a[33], c[33];
    if (rank >= rec->tp) return g5_fail(err, G5_ERR_INVALID_ARG, "%s: rank %u of a %u-rank set", b->path, rank, rec->tp);
    if (in->tp != rec->tp)
        return g5_fail_at(err, G5_ERR_MISMATCH, H_TP, "%s: blob is for tp %u, the set record says %u", b->path, in->tp, rec->tp);
    if (in->rank != rank)
        return g5_fail_at(err, G5_ERR_MISMATCH, H_RANK, "%s: blob holds rank %u, expected rank %u", b->path, in->rank, rank);
    if (memcmp(in->set_id, rec->set_id, 16) != 0) {
        blob_hash_hex(in->set_id, a);
        blob_hash_hex(rec->set_id, c);
        return g5_fail_at(err, G5_ERR_MISMATCH, H_SETID,
                          "%s: blob belongs to set %s, the set record is %s (another conversion or source)",
                          b->path, a, c);
    }
    if (in->placement != rec->placement || in->converter_version != rec->converter_version)
        return g5_fail_at(err, G5_ERR_MISMATCH, H_PLACE, "%s: placement %s / converter %06x differ from the set record's %s / %06x",
                          b->path, blob_placement_name(in->placement), in->converter_version,
                          blob_placement_name(rec->placement), rec->converter_version);
    if (in->file_size != rec->ranks[rank].file_size)
        return g5_fail(err, G5_ERR_MISMATCH, "%s: %llu bytes, the set record says %llu", b->path,
                       (unsigned long long)in->file_size, (unsigned long long)rec->ranks[rank].file_size);
    if (memcmp(in->header_hash, rec->ranks[rank].header_hash, 16) != 0) {
        blob_hash_hex(in->header_hash, a);
        blob_hash_hex(rec->ranks[rank].header_hash, c);
        return g5_fail_at(err, G5_ERR_MISMATCH, H_HASH_HDR, "%s: header hash %s, the set record says %s",
                          b->path, a, c);
    }
    for (uint64_t i = 0; i < in->n_tensors; i++) {
        const blob_tensor *t = &b->tensors[i];
        if (t->split_axis != BLOB_AXIS_NONE && (t->split_count != rec->tp || t->split_index != rank))
            return g5_fail(err, G5_ERR_MISMATCH, "%s: tensor '%s' is slice %u of %u, expected %u of %u", b->path,
                           t->name, t->split_index, t->split_count, rank, rec->tp);
    }
    return G5_OK;
}

g5_status blob_check_compatible(const blob *a, const blob *b, g5_error *err) {
    const blob_info *x = &a->info, *y = &b->info;
#define DIFF(cond, ...) if (cond) return g5_fail(err, G5_ERR_MISMATCH, __VA_ARGS__)
    DIFF(memcmp(x->set_id, y->set_id, 16) != 0, "%s and %s belong to different sets", a->path, b->path);
    DIFF(x->tp != y->tp || x->placement != y->placement || x->converter_version != y->converter_version ||
         x->kv_b_type != y->kv_b_type,
         "%s and %s differ in tp, placement, converter version or kv_b type", a->path, b->path);
    DIFF(x->n_sources != y->n_sources, "%s and %s name different source files", a->path, b->path);
    for (uint32_t i = 0; i < x->n_sources; i++) {
        const blob_source *s = &a->sources[i], *t = &b->sources[i];
        DIFF(strcmp(s->name, t->name) || s->file_size != t->file_size || s->header_size != t->header_size ||
             memcmp(s->header_hash, t->header_hash, 16) || memcmp(s->sample_hash, t->sample_hash, 16),
             "%s and %s: source %u differs ('%s' / '%s')", a->path, b->path, i, s->name, t->name);
    }
    DIFF(memcmp(x->meta_hash, y->meta_hash, 16) != 0 || x->meta_size != y->meta_size,
         "%s and %s carry different metadata", a->path, b->path);
    DIFF(x->n_tensors != y->n_tensors || x->data_size != y->data_size || x->chunk_size != y->chunk_size,
         "%s and %s: %llu / %llu tensors, %llu / %llu data bytes", a->path, b->path,
         (unsigned long long)x->n_tensors, (unsigned long long)y->n_tensors,
         (unsigned long long)x->data_size, (unsigned long long)y->data_size);
    for (uint64_t i = 0; i < x->n_tensors; i++) {
        const blob_tensor *s = &a->tensors[i], *t = &b->tensors[i];
        DIFF(strcmp(s->name, t->name) != 0, "%s and %s: tensor %llu is '%s' / '%s'", a->path, b->path,
             (unsigned long long)i, s->name, t->name);
        DIFF(s->type != t->type || s->n_dims != t->n_dims || memcmp(s->ne, t->ne, sizeof s->ne) ||
             memcmp(s->ne_global, t->ne_global, sizeof s->ne_global) || s->split_axis != t->split_axis ||
             s->split_count != t->split_count || s->offset != t->offset || s->size != t->size ||
             s->flags != t->flags,
             "%s and %s: tensor '%s' differs in type, shape, split or placement", a->path, b->path, s->name);
    }
#undef DIFF
    return G5_OK;
}

struct blob_set {
    blob_set_record rec;
    uint32_t first, count;       /* the ranks opened */
    blob **ranks;                /* [rec.tp]; NULL for ranks not opened */
};

/* count == 0: every rank of the set. */
static g5_status set_open(const char *dir, uint32_t first, uint32_t count, blob_set **out,
                          g5_error *err) {
    *out = NULL;
    blob_set *s = calloc(1, sizeof *s);
    if (!s) return g5_fail(err, G5_ERR_NOMEM, "%s", dir);
    g5_status st = blob_set_record_read(dir, &s->rec, err);
    if (st) goto fail;
    if (count == 0) {
        first = 0;
        count = s->rec.tp;
    } else if (first >= s->rec.tp || count > s->rec.tp - first) {
        st = g5_fail(err, G5_ERR_INVALID_ARG, "%s: ranks %u..%u asked of a set of %u", dir, first,
                     first + count - 1, s->rec.tp);
        goto fail;
    }
    s->first = first;
    s->count = count;
    s->ranks = calloc(s->rec.tp, sizeof *s->ranks);
    if (!s->ranks) { st = g5_fail(err, G5_ERR_NOMEM, "%s", dir); goto fail; }
    for (uint32_t r = first; r < first + count; r++) {
        char fn[64], path[4200];
        blob_rank_filename(r, s->rec.tp, fn, sizeof fn);
        snprintf(path, sizeof path, "%s/%s", dir, fn);
        if ((st = blob_open(path, &s->ranks[r], err))) goto fail;
        if ((st = blob_check_rank(s->ranks[r], &s->rec, r, err))) goto fail;
        if (r > first && (st = blob_check_compatible(s->ranks[first], s->ranks[r], err))) goto fail;
    }
    *out = s;
    return G5_OK;
fail:
    blob_set_free(s);
    return st;
}

g5_status blob_set_open(const char *dir, blob_set **out, g5_error *err) {
    return set_open(dir, 0, 0, out, err);
}

g5_status blob_set_open_ranks(const char *dir, uint32_t first, uint32_t count, blob_set **out,
                              g5_error *err) {
    if (count == 0) {
        *out = NULL;
        return g5_fail(err, G5_ERR_INVALID_ARG, "%s: no ranks asked", dir);
    }
    return set_open(dir, first, count, out, err);
}

void blob_set_free(blob_set *s) {
    if (!s) return;
    if (s->ranks)
        for (uint32_t r = 0; r < s->rec.tp; r++) blob_free(s->ranks[r]);
    free(s->ranks);
    blob_set_record_clear(&s->rec);
    free(s);
}

uint32_t blob_set_tp(const blob_set *s) { return s->rec.tp; }
const blob_set_record *blob_set_get_record(const blob_set *s) { return &s->rec; }
const blob *blob_set_rank(const blob_set *s, uint32_t r) { return r < s->rec.tp ? s->ranks[r] : NULL; }
uint32_t blob_set_first(const blob_set *s) { return s->first; }
uint32_t blob_set_count(const blob_set *s) { return s->count; }
