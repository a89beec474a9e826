/* Blob writer (streaming): layout, hashing while writing, PATH.tmp + fsync + rename. */
#include "blob.h"
#include "mapguard.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include "blob_int.h"
#include "blob_test.h"

/* ---- writing ---- */

struct blob_writer {
    char *path, *tmp;
    int fd;
    uint8_t *index;              /* the index region [0, data_offset), hashes filled at finish */
    uint64_t n_tensors;
    uint64_t *t_off, *t_size;    /* data-relative */
    uint64_t tab_off, chk_off;
    uint64_t data_offset, data_size, file_size, chunk_size, n_chunks;
    uint64_t pos;                /* data bytes emitted so far (padding included) */
    uint64_t cur, cur_filled;    /* current tensor and its bytes so far */
    XXH3_state_t *tst, *cst;
    uint8_t *buf;
    uint64_t buf_len, buf_cap, flushed;
    uint64_t fail_after;
    int finished, failed;
};

static g5_status write_at(blob_writer *w, const void *data, uint64_t n, uint64_t off, g5_error *err) {
    const uint8_t *p = data;
    while (n > 0) {
        size_t want = n > (1u << 30) ? (1u << 30) : (size_t)n;
        int injected = 0;
        if (w->fail_after && off + want > w->fail_after) {
            injected = 1;
            want = off < w->fail_after ? (size_t)(w->fail_after - off) : 0;
        }
        ssize_t r = want ? pwrite(w->fd, p, want, (off_t)off) : 0;
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 || (r == 0 && !injected)) {
            int e = r < 0 ? errno : EIO;
            w->failed = 1;
            return g5_fail(err, G5_ERR_IO, "%s: write failed at byte %llu: %s", w->tmp,
                           (unsigned long long)off, strerror(e));
        }
        p += r;
        off += (uint64_t)r;
        n -= (uint64_t)r;
        if (injected && (uint64_t)r == want) {
            w->failed = 1;
            return g5_fail(err, G5_ERR_IO, "%s: write failed at byte %llu: %s", w->tmp,
                           (unsigned long long)off, strerror(ENOSPC));
        }
    }
    return G5_OK;
}

static g5_status wflush(blob_writer *w, g5_error *err) {
    if (!w->buf_len) return G5_OK;
    g5_status st = write_at(w, w->buf, w->buf_len, w->data_offset + w->flushed, err);
    if (st) return st;
    w->flushed += w->buf_len;
    w->buf_len = 0;
    return G5_OK;
}

/* Appends bytes to the data region: chunk hashing, buffering. */
static g5_status emit(blob_writer *w, const uint8_t *data, uint64_t len, g5_error *err) {
    g5_status st;
    while (len > 0) {
        uint64_t cend = (w->pos / w->chunk_size + 1) * w->chunk_size;
        uint64_t take = len < cend - w->pos ? len : cend - w->pos;
        XXH3_128bits_update(w->cst, data, take);
        if (take >= (1u << 20)) {
            /* Large pieces go straight from the caller's buffer: one copy fewer. */
            if ((st = wflush(w, err)) || (st = write_at(w, data, take, w->data_offset + w->flushed, err))) return st;
            w->flushed += take;
        } else {
            for (uint64_t done = 0; done < take;) {
                uint64_t room = w->buf_cap - w->buf_len, n = take - done < room ? take - done : room;
                memcpy(w->buf + w->buf_len, data + done, n);
                w->buf_len += n;
                done += n;
                if (w->buf_len == w->buf_cap && (st = wflush(w, err))) return st;
            }
        }
        w->pos += take;
        data += take;
        len -= take;
        if (w->pos % w->chunk_size == 0) {
            state_digest(w->cst, w->index + w->chk_off + (w->pos / w->chunk_size - 1) * BLOB_CHUNK_ENTRY_SIZE);
            XXH3_128bits_reset(w->cst);
        }
    }
    return G5_OK;
}

static const uint8_t k_zeros[BLOB_DATA_ALIGN];

void blob_writer_test_fail_after(blob_writer *w, uint64_t file_bytes) {
    if (w) w->fail_after = file_bytes;
}

g5_status blob_writer_create(const char *path, const blob_writer_params *p,
                             const blob_writer_tensor *tensors, uint64_t n, blob_writer **out,
                             g5_error *err) {
    *out = NULL;
    g5_status st;
    if (p->tp < 1 || p->tp > MAX_TP || p->rank >= p->tp || p->placement > BLOB_PLACE_EP ||
        p->n_sources < 1 || p->n_sources > MAX_SOURCES || !p->meta || p->meta_len == 0 ||
        n > MAX_TENSORS || !quant_type_get(p->kv_b_type))
        return g5_fail(err, G5_ERR_INVALID_ARG, "%s: blob writer: bad parameters (tp %u, rank %u, placement %u, %u sources, %llu tensors)",
                       path, p->tp, p->rank, p->placement, p->n_sources, (unsigned long long)n);
    uint64_t cs = p->chunk_size ? p->chunk_size : BLOB_DEFAULT_CHUNK_SIZE;
    if (cs < BLOB_DATA_ALIGN || (cs & (cs - 1)))
        return g5_fail(err, G5_ERR_INVALID_ARG, "%s: chunk size %llu", path, (unsigned long long)cs);
    blob_writer *w = calloc(1, sizeof *w);
    if (!w) return g5_fail(err, G5_ERR_NOMEM, "%s", path);
    w->fd = -1;
    w->chunk_size = cs;
    w->n_tensors = n;
    uint8_t *zmeta = NULL;
    const uint8_t *meta = p->meta;
    uint64_t meta_size = p->meta_len;
    uint32_t hflags = 0;
    size_t plen = strlen(path);
    w->path = strdup(path);
    w->tmp = malloc(plen + 5);
    w->t_off = calloc(n ? n : 1, sizeof *w->t_off);
    w->t_size = calloc(n ? n : 1, sizeof *w->t_size);
    w->tst = XXH3_createState();
    w->cst = XXH3_createState();
    w->buf_cap = 8ull << 20;
    w->buf = malloc(w->buf_cap);
    if (!w->path || !w->tmp || !w->t_off || !w->t_size || !w->tst || !w->cst || !w->buf) {
        st = g5_fail(err, G5_ERR_NOMEM, "%s", path);
        goto fail;
    }
    memcpy(w->tmp, path, plen);
    memcpy(w->tmp + plen, ".tmp", 5);

    uint64_t str_size = 0, off = 0;
    for (uint64_t i = 0; i < n; i++) {
        const blob_writer_tensor *t = &tensors[i];
        size_t nl = t->name ? strlen(t->name) : 0;
        if (nl == 0 || nl > BLOB_MAX_NAME || t->n_dims < 1 || t->n_dims > 4) {
            st = g5_fail(err, G5_ERR_INVALID_ARG, "%s: tensor %llu: name length %zu, n_dims %u", path,
                         (unsigned long long)i, nl, t->n_dims);
            goto fail;
        }
        if ((st = tensor_bytes(t->type, t->ne, &w->t_size[i]))) {
            st = g5_fail(err, st, "%s: tensor '%s': %s x ne[0] %llu has no valid size", path, t->name,
                         quant_type_name(t->type), (unsigned long long)t->ne[0]);
            goto fail;
        }
        str_size += nl + 1;
        off = align_up(off, BLOB_DATA_ALIGN);
        w->t_off[i] = off;
        if (g5_add_u64(off, w->t_size[i], &off)) {
            st = g5_fail(err, G5_ERR_OVERFLOW, "%s: data size overflow", path);
            goto fail;
        }
    }
    for (uint32_t i = 0; i < p->n_sources; i++) str_size += strlen(base_name(p->sources[i].name)) + 1;
    w->data_size = off;
    w->n_chunks = (off + cs - 1) / cs;

    if (p->meta_zstd_level > 0) {
        size_t bound = ZSTD_compressBound(p->meta_len);
        zmeta = malloc(bound);
        if (!zmeta) { st = g5_fail(err, G5_ERR_NOMEM, "%s: metadata", path); goto fail; }
        size_t r = ZSTD_compress(zmeta, bound, p->meta, p->meta_len, p->meta_zstd_level);
        if (ZSTD_isError(r)) {
            st = g5_fail(err, G5_ERR_COMPRESS, "%s: metadata: zstd: %s", path, ZSTD_getErrorName(r));
            goto fail;
        }
        if (r < p->meta_len) {
            meta = zmeta;
            meta_size = r;
            hflags |= BLOB_FLAG_META_ZSTD;
        }
    }
    const uint64_t src_off = BLOB_HEADER_SIZE, src_size = (uint64_t)p->n_sources * BLOB_SOURCE_ENTRY_SIZE;
    const uint64_t tab_off = align_up(src_off + src_size, 8), tab_size = n * BLOB_TENSOR_ENTRY_SIZE;
    const uint64_t chk_off = align_up(tab_off + tab_size, 8), chk_size = w->n_chunks * BLOB_CHUNK_ENTRY_SIZE;
    const uint64_t str_off = align_up(chk_off + chk_size, 8);
    const uint64_t meta_off = align_up(str_off + str_size, 8);
    w->data_offset = align_up(meta_off + meta_size, BLOB_DATA_ALIGN);
    w->file_size = w->data_offset + w->data_size;
    w->tab_off = tab_off;
    w->chk_off = chk_off;
    w->index = calloc(1, w->data_offset);
    if (!w->index) { st = g5_fail(err, G5_ERR_NOMEM, "%s: index", path); goto fail; }
    uint8_t *h = w->index;
    memcpy(h + H_MAGIC, BLOB_MAGIC, 8);
    g5_wr_u32(h + H_VERSION, BLOB_VERSION);
    g5_wr_u32(h + H_HSIZE, BLOB_HEADER_SIZE);
    g5_wr_u32(h + H_FLAGS, hflags);
    g5_wr_u32(h + H_TP, p->tp);
    g5_wr_u32(h + H_RANK, p->rank);
    g5_wr_u32(h + H_PLACE, p->placement);
    g5_wr_u32(h + H_CONV, p->converter_version);
    g5_wr_u32(h + H_KVB, p->kv_b_type);
    memcpy(h + H_SETID, p->set_id, 16);
    g5_wr_u32(h + H_NSRC, p->n_sources);
    g5_wr_u64(h + H_NTENS, n);
    g5_wr_u64(h + H_CHUNK, cs);
    g5_wr_u64(h + H_NCHUNK, w->n_chunks);
    g5_wr_u64(h + H_SRC_OFF, src_off);
    g5_wr_u64(h + H_SRC_SIZE, src_size);
    g5_wr_u64(h + H_TAB_OFF, tab_off);
    g5_wr_u64(h + H_TAB_SIZE, tab_size);
    g5_wr_u64(h + H_CHK_OFF, chk_off);
    g5_wr_u64(h + H_CHK_SIZE, chk_size);
    g5_wr_u64(h + H_STR_OFF, str_off);
    g5_wr_u64(h + H_STR_SIZE, str_size);
    g5_wr_u64(h + H_META_OFF, meta_off);
    g5_wr_u64(h + H_META_SIZE, meta_size);
    g5_wr_u64(h + H_META_RAW, p->meta_len);
    g5_wr_u64(h + H_DATA_OFF, w->data_offset);
    g5_wr_u64(h + H_DATA_SIZE, w->data_size);
    g5_wr_u64(h + H_FILE_SIZE, w->file_size);
    uint64_t sp = 0; /* strings cursor */
    for (uint64_t i = 0; i < n; i++) {
        const blob_writer_tensor *t = &tensors[i];
        uint8_t *e = h + tab_off + i * BLOB_TENSOR_ENTRY_SIZE;
        size_t nl = strlen(t->name);
        memcpy(h + str_off + sp, t->name, nl + 1);
        g5_wr_u64(e + T_NAMEOFF, sp);
        g5_wr_u32(e + T_NAMELEN, (uint32_t)nl);
        sp += nl + 1;
        g5_wr_u32(e + T_TYPE, t->type);
        g5_wr_u32(e + T_NDIMS, t->n_dims);
        g5_wr_u32(e + T_AXIS, t->split_axis);
        g5_wr_u32(e + T_SINDEX, t->split_index);
        g5_wr_u32(e + T_SCOUNT, t->split_count);
        for (int d = 0; d < 4; d++) {
            g5_wr_u64(e + T_NE + 8 * d, t->ne[d]);
            g5_wr_u64(e + T_NEG + 8 * d, t->ne_global[d]);
        }
        g5_wr_u64(e + T_OFF, w->t_off[i]);
        g5_wr_u64(e + T_SIZE, w->t_size[i]);
        g5_wr_u32(e + T_FLAGS, t->flags);
    }
    for (uint32_t i = 0; i < p->n_sources; i++) {
        const blob_source_desc *s = &p->sources[i];
        uint8_t *e = h + src_off + (uint64_t)i * BLOB_SOURCE_ENTRY_SIZE;
        const char *bn = base_name(s->name);
        size_t nl = strlen(bn);
        if (nl == 0 || nl > BLOB_MAX_NAME) {
            st = g5_fail(err, G5_ERR_INVALID_ARG, "%s: source %u: name '%s'", path, i, s->name);
            goto fail;
        }
        memcpy(h + str_off + sp, bn, nl + 1);
        g5_wr_u32(e + S_SPLIT, i);
        g5_wr_u32(e + S_NAMELEN, (uint32_t)nl);
        g5_wr_u64(e + S_NAMEOFF, sp);
        sp += nl + 1;
        g5_wr_u64(e + S_FSIZE, s->file_size);
        g5_wr_u64(e + S_HSIZE, s->header_size);
        memcpy(e + S_HASH, s->header_hash, 16);
        memcpy(e + S_SAMPLE, s->sample_hash, 16);
    }
    memcpy(h + meta_off, meta, meta_size);
    free(zmeta);
    zmeta = NULL;

    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        st = g5_fail(err, G5_ERR_IO, "%s: cannot create: %s", w->tmp, strerror(errno));
        goto fail;
    }
    g5_mapguard_add_output(w->tmp); /* removed by the SIGBUS handler if a source vanishes */
    XXH3_128bits_reset(w->cst);
    *out = w;
    return G5_OK;
fail:
    free(zmeta);
    blob_writer_free(w);
    return st;
}

g5_status blob_writer_write(blob_writer *w, const void *vdata, uint64_t len, g5_error *err) {
    const uint8_t *data = vdata;
    g5_status st;
    if (w->failed || w->finished) return g5_fail(err, G5_ERR_INVALID_ARG, "%s: writer is closed", w->tmp);
    while (len > 0) {
        if (w->cur >= w->n_tensors) {
            w->failed = 1;
            return g5_fail(err, G5_ERR_INTERNAL, "%s: %llu bytes of data past the last tensor", w->tmp,
                           (unsigned long long)len);
        }
        if (w->cur_filled == 0) {
            if (w->pos > w->t_off[w->cur]) {
                w->failed = 1;
                return g5_fail(err, G5_ERR_INTERNAL, "%s: data position past tensor %llu's offset", w->tmp,
                               (unsigned long long)w->cur);
            }
            if ((st = emit(w, k_zeros, w->t_off[w->cur] - w->pos, err))) return st;
            XXH3_128bits_reset(w->tst);
        }
        uint64_t room = w->t_size[w->cur] - w->cur_filled, take = len < room ? len : room;
        XXH3_128bits_update(w->tst, data, take);
        if ((st = emit(w, data, take, err))) return st;
        w->cur_filled += take;
        data += take;
        len -= take;
        if (w->cur_filled == w->t_size[w->cur]) {
            state_digest(w->tst, w->index + w->tab_off + w->cur * BLOB_TENSOR_ENTRY_SIZE + T_HASH);
            w->cur++;
            w->cur_filled = 0;
        }
    }
    return G5_OK;
}

uint64_t blob_writer_current(const blob_writer *w) { return w->cur; }
uint64_t blob_writer_file_bytes(const blob_writer *w) { return w->flushed + w->buf_len; }
uint64_t blob_writer_tensor_offset(const blob_writer *w, uint64_t i) {
    return i < w->n_tensors ? w->t_off[i] : w->data_size;
}
uint64_t blob_writer_file_size(const blob_writer *w) { return w->file_size; }

g5_status blob_i_fsync_dir_of(const char *path, g5_error *err) {
    char *d = strdup(path);
    if (!d) return g5_fail(err, G5_ERR_NOMEM, "%s", path);
    char *s = strrchr(d, '/');
    if (s == d) s[1] = 0;
    else if (s) *s = 0;
    else strcpy(d, ".");
    int fd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    g5_status st = G5_OK;
    if (fd < 0 || fsync(fd) != 0) st = g5_fail(err, G5_ERR_IO, "%s: fsync of the directory: %s", d, strerror(errno));
    if (fd >= 0) close(fd);
    free(d);
    return st;
}

g5_status blob_writer_finish(blob_writer *w, uint8_t out_hash[16], g5_error *err) {
    g5_status st;
    if (w->failed || w->finished) return g5_fail(err, G5_ERR_INVALID_ARG, "%s: writer is closed", w->tmp);
    if (w->cur < w->n_tensors) {
        w->failed = 1;
        return g5_fail(err, G5_ERR_INTERNAL, "%s: tensor %llu has %llu of %llu bytes", w->tmp,
                       (unsigned long long)w->cur, (unsigned long long)w->cur_filled,
                       (unsigned long long)w->t_size[w->cur]);
    }
    if (w->pos % w->chunk_size)
        state_digest(w->cst, w->index + w->chk_off + (w->pos / w->chunk_size) * BLOB_CHUNK_ENTRY_SIZE);
    if ((st = wflush(w, err))) return st;
    uint8_t *h = w->index;
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        uint8_t *e = h + w->tab_off + i * BLOB_TENSOR_ENTRY_SIZE;
        entry_hash(e, e + T_EHASH);
    }
    static const int hf[5][3] = {{H_SRC_OFF, H_SRC_SIZE, H_HASH_SRC}, {H_TAB_OFF, H_TAB_SIZE, H_HASH_TAB},
                                 {H_CHK_OFF, H_CHK_SIZE, H_HASH_CHK}, {H_STR_OFF, H_STR_SIZE, H_HASH_STR},
                                 {H_META_OFF, H_META_SIZE, H_HASH_META}};
    for (int s = 0; s < 5; s++)
        blob_hash128(h + g5_rd_u64(h + hf[s][0]), g5_rd_u64(h + hf[s][1]), h + hf[s][2]);
    header_hash(h, h + H_HASH_HDR);
    if ((st = write_at(w, h, w->data_offset, 0, err))) return st;
    if (w->data_size == 0 && ftruncate(w->fd, (off_t)w->file_size) != 0) {
        w->failed = 1;
        return g5_fail(err, G5_ERR_IO, "%s: ftruncate: %s", w->tmp, strerror(errno));
    }
    if (fsync(w->fd) != 0) {
        w->failed = 1;
        return g5_fail(err, G5_ERR_IO, "%s: fsync: %s", w->tmp, strerror(errno));
    }
    int rc = close(w->fd);
    w->fd = -1;
    if (rc != 0) {
        w->failed = 1;
        return g5_fail(err, G5_ERR_IO, "%s: close: %s", w->tmp, strerror(errno));
    }
    if (rename(w->tmp, w->path) != 0) {
        w->failed = 1;
        return g5_fail(err, G5_ERR_IO, "%s: rename to %s: %s", w->tmp, w->path, strerror(errno));
    }
    w->finished = 1;
    g5_mapguard_remove_output(w->tmp);
    if (out_hash) memcpy(out_hash, h + H_HASH_HDR, 16);
    return blob_i_fsync_dir_of(w->path, err);
}

void blob_writer_abort(blob_writer *w, int keep_tmp) {
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    if (!w->finished && !keep_tmp && w->tmp && w->fd >= 0) unlink(w->tmp);
    g5_mapguard_remove_output(w->tmp);
    free(w->path);
    free(w->tmp);
    free(w->index);
    free(w->t_off);
    free(w->t_size);
    XXH3_freeState(w->tst);
    XXH3_freeState(w->cst);
    free(w->buf);
    free(w);
}

void blob_writer_free(blob_writer *w) { blob_writer_abort(w, 0); }

/* ---- set record ---- */

static void record_hash(const uint8_t *img, uint64_t len, uint8_t out[16]) {
    XXH3_state_t *st = XXH3_createState();
    if (!st) { /* hash over a zeroed copy is equivalent; without memory fall back to a marker */
        memset(out, 0xff, 16);
        return;
    }
    XXH3_128bits_reset(st);
    XXH3_128bits_update(st, img, R_HASH);
    XXH3_128bits_update(st, img + R_END, len - R_END);
    state_digest(st, out);
    XXH3_freeState(st);
}

void blob_set_record_clear(blob_set_record *r) {
    if (!r) return;
    free(r->ranks);
    memset(r, 0, sizeof *r);
}

g5_status blob_set_record_parse(const void *vbuf, size_t len, const char *name, blob_set_record *out,
                                g5_error *err) {
    memset(out, 0, sizeof *out);
    const uint8_t *b = vbuf;
    if (len < BLOB_SET_HEADER_SIZE)
        return g5_fail(err, G5_ERR_TRUNCATED, "%s: %zu bytes, shorter than a set record header", name, len);
    if (memcmp(b, BLOB_SET_MAGIC, 8) != 0) return g5_fail_at(err, G5_ERR_BAD_MAGIC, 0, "%s: not a blob set record", name);
    uint32_t v = g5_rd_u32(b + R_VERSION), tp = g5_rd_u32(b + R_TP);
    if (v != BLOB_SET_VERSION) return g5_fail_at(err, G5_ERR_VERSION, R_VERSION, "%s: set record version %u", name, v);
    if (tp < 1 || tp > MAX_TP) return g5_fail_at(err, G5_ERR_FORMAT, R_TP, "%s: set record tp %u", name, tp);
    uint64_t want = BLOB_SET_HEADER_SIZE + (uint64_t)tp * BLOB_SET_ENTRY_SIZE;
    if (len != want)
        return g5_fail(err, len < want ? G5_ERR_TRUNCATED : G5_ERR_FORMAT,
                       "%s: set record is %zu bytes, tp %u needs %llu", name, len, tp, (unsigned long long)want);
    uint8_t h[16];
    record_hash(b, len, h);
    if (memcmp(h, b + R_HASH, 16) != 0) return g5_fail_at(err, G5_ERR_CHECKSUM, R_HASH, "%s: set record XXH3-128 mismatch", name);
    out->version = v;
    out->tp = tp;
    out->placement = g5_rd_u32(b + R_PLACE);
    out->converter_version = g5_rd_u32(b + R_CONV);
    memcpy(out->set_id, b + R_SETID, 16);
    if (out->placement > BLOB_PLACE_EP || !all_zero(b + R_RES, R_HASH - R_RES)) {
        memset(out, 0, sizeof *out);
        return g5_fail_at(err, G5_ERR_FORMAT, R_PLACE, "%s: set record placement %u or reserved bytes", name,
                          g5_rd_u32(b + R_PLACE));
    }
    out->ranks = calloc(tp, sizeof *out->ranks);
    if (!out->ranks) return g5_fail(err, G5_ERR_NOMEM, "%s", name);
    for (uint32_t r = 0; r < tp; r++) {
        const uint64_t eo = R_END + (uint64_t)r * RE_END;
        const uint8_t *e = b + eo;
        if (g5_rd_u32(e + RE_RANK) != r || !all_zero(e + RE_RES0, 4) || !all_zero(e + RE_RES1, RE_END - RE_RES1) ||
            g5_rd_u64(e + RE_FSIZE) < BLOB_HEADER_SIZE) {
            blob_set_record_clear(out);
            return g5_fail_at(err, G5_ERR_FORMAT, eo, "%s: set record entry %u is malformed", name, r);
        }
        out->ranks[r].file_size = g5_rd_u64(e + RE_FSIZE);
        memcpy(out->ranks[r].header_hash, e + RE_HASH, 16);
    }
    return G5_OK;
}

g5_status blob_set_record_bytes(const blob_set_record *r, uint8_t **buf, uint64_t *len) {
    *buf = NULL;
    if (r->tp < 1 || r->tp > MAX_TP) return G5_ERR_INVALID_ARG;
    uint64_t n = BLOB_SET_HEADER_SIZE + (uint64_t)r->tp * BLOB_SET_ENTRY_SIZE;
    uint8_t *b = calloc(1, n);
    if (!b) return G5_ERR_NOMEM;
    memcpy(b, BLOB_SET_MAGIC, 8);
    g5_wr_u32(b + R_VERSION, BLOB_SET_VERSION);
    g5_wr_u32(b + R_TP, r->tp);
    g5_wr_u32(b + R_PLACE, r->placement);
    g5_wr_u32(b + R_CONV, r->converter_version);
    memcpy(b + R_SETID, r->set_id, 16);
    for (uint32_t k = 0; k < r->tp; k++) {
        uint8_t *e = b + R_END + (uint64_t)k * RE_END;
        g5_wr_u32(e + RE_RANK, k);
        g5_wr_u64(e + RE_FSIZE, r->ranks[k].file_size);
        memcpy(e + RE_HASH, r->ranks[k].header_hash, 16);
    }
    record_hash(b, n, b + R_HASH);
    *buf = b;
    *len = n;
    return G5_OK;
}

static g5_status read_small_file(const char *path, uint64_t max, uint8_t **buf, size_t *len, g5_error *err) {
    *buf = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return g5_fail(err, errno == ENOENT ? G5_ERR_NOT_FOUND : G5_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size > max) {
        close(fd);
        return g5_fail(err, G5_ERR_FORMAT, "%s: not a regular file of at most %llu bytes", path, (unsigned long long)max);
    }
    size_t n = (size_t)sb.st_size, got = 0;
    uint8_t *b = malloc(n ? n : 1);
    if (!b) { close(fd); return g5_fail(err, G5_ERR_NOMEM, "%s", path); }
    while (got < n) {
        ssize_t r = read(fd, b + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = r < 0 ? errno : EIO;
            close(fd);
            free(b);
            return g5_fail(err, G5_ERR_IO, "%s: read: %s", path, strerror(e));
        }
        got += (size_t)r;
    }
    close(fd);
    *buf = b;
    *len = n;
    return G5_OK;
}

g5_status blob_set_record_read(const char *dir, blob_set_record *out, g5_error *err) {
    memset(out, 0, sizeof *out);
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, BLOB_SET_RECORD);
    uint8_t *buf = NULL;
    size_t len = 0;
    g5_status st = read_small_file(path, BLOB_SET_HEADER_SIZE + (uint64_t)MAX_TP * BLOB_SET_ENTRY_SIZE, &buf, &len, err);
    if (st == G5_ERR_NOT_FOUND)
        return g5_fail(err, G5_ERR_NOT_FOUND, "%s: no set record (conversion not finished, or not a blob directory)", path);
    if (st) return st;
    st = blob_set_record_parse(buf, len, path, out, err);
    free(buf);
    return st;
}

g5_status blob_set_record_write(const char *dir, const blob_set_record *r, g5_error *err) {
    uint8_t *buf;
    uint64_t len;
    g5_status st = blob_set_record_bytes(r, &buf, &len);
    if (st) return g5_fail(err, st, "%s: set record: bad contents", dir);
    char path[4200], tmp[4210];
    snprintf(path, sizeof path, "%s/%s", dir, BLOB_SET_RECORD);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        free(buf);
        return g5_fail(err, G5_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    }
    uint64_t done = 0;
    while (done < len) {
        ssize_t w = write(fd, buf + done, len - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : EIO;
            close(fd);
            unlink(tmp);
            free(buf);
            return g5_fail(err, G5_ERR_IO, "%s: write: %s", tmp, strerror(e));
        }
        done += (uint64_t)w;
    }
    free(buf);
    if (fsync(fd) != 0 || close(fd) != 0) {
        int e = errno;
        unlink(tmp);
        return g5_fail(err, G5_ERR_IO, "%s: fsync/close: %s", tmp, strerror(e));
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return g5_fail(err, G5_ERR_IO, "%s: rename: %s", tmp, strerror(e));
    }
    return blob_i_fsync_dir_of(path, err);
}

