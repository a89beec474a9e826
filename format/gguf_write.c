/* GGUF writer. Each kv pair is kept as its serialized value bytes (everything after the type
 * field), so copying a pair from a parsed file is a byte copy and the header is a concatenation.
 * Tensor data is streamed one tensor at a time. */
#include "gguf_write.h"
#include "mapguard.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "quant.h"

#define GW_MAX_NAME_LEN 65535u
#define GW_MAX_ALIGNMENT (1u << 20)

typedef struct wkv {
    char *key;
    uint64_t key_len;
    gguf_vtype type;
    uint8_t *val;        /* serialized value, val_len bytes */
    uint64_t val_len;
} wkv;

typedef struct wtensor {
    char *name;
    uint64_t name_len;
    uint32_t type, n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    const void *data;
    uint64_t nbytes;
} wtensor;

struct gguf_writer {
    uint32_t version;
    uint64_t alignment;
    int64_t n_kv, cap_kv;
    wkv *kvs;
    int64_t n_t, cap_t;
    wtensor *ts;
    uint64_t fail_after;   /* test hook: writes past this many file bytes fail with ENOSPC (0: off) */
};

static const uint8_t scalar_size[GGUF_VT_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

gguf_writer *gguf_writer_create(void) {
    gguf_writer *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->version = 3;
    w->alignment = GGUF_DEFAULT_ALIGNMENT;
    return w;
}

void gguf_writer_free(gguf_writer *w) {
    if (!w) return;
    for (int64_t i = 0; i < w->n_kv; i++) {
        free(w->kvs[i].key);
        free(w->kvs[i].val);
    }
    free(w->kvs);
    for (int64_t i = 0; i < w->n_t; i++) free(w->ts[i].name);
    free(w->ts);
    free(w);
}

void gguf_writer_set_version(gguf_writer *w, uint32_t version) {
    if (w) w->version = version;
}

static int64_t find_kv(const gguf_writer *w, const char *key) {
    for (int64_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kvs[i].key, key) == 0) return i;
    return -1;
}

/* Takes ownership of val (freed on failure). A repeated key keeps its position. */
static g5_status put_kv(gguf_writer *w, const char *key, gguf_vtype type, uint8_t *val,
                        uint64_t val_len) {
    if (!w || !key || strlen(key) > GW_MAX_NAME_LEN) {
        free(val);
        return G5_ERR_INVALID_ARG;
    }
    int64_t i = find_kv(w, key);
    if (i >= 0) {
        free(w->kvs[i].val);
        w->kvs[i].type = type;
        w->kvs[i].val = val;
        w->kvs[i].val_len = val_len;
        return G5_OK;
    }
    if (w->n_kv == w->cap_kv) {
        int64_t cap = w->cap_kv ? w->cap_kv * 2 : 16;
        wkv *nk = realloc(w->kvs, (size_t)cap * sizeof *nk);
        if (!nk) {
            free(val);
            return G5_ERR_NOMEM;
        }
        w->kvs = nk;
        w->cap_kv = cap;
    }
    char *k = strdup(key);
    if (!k) {
        free(val);
        return G5_ERR_NOMEM;
    }
    w->kvs[w->n_kv++] = (wkv){k, strlen(key), type, val, val_len};
    return G5_OK;
}

static g5_status put_scalar(gguf_writer *w, const char *key, gguf_vtype type, uint64_t bits) {
    unsigned n = scalar_size[type];
    uint8_t *v = malloc(8);
    if (!v) return G5_ERR_NOMEM;
    for (unsigned i = 0; i < n; i++) v[i] = (uint8_t)(bits >> (8 * i));
    return put_kv(w, key, type, v, n);
}

g5_status gguf_writer_set_u8(gguf_writer *w, const char *key, uint8_t v) {
    return put_scalar(w, key, GGUF_VT_UINT8, v);
}
g5_status gguf_writer_set_i8(gguf_writer *w, const char *key, int8_t v) {
    return put_scalar(w, key, GGUF_VT_INT8, (uint8_t)v);
}
g5_status gguf_writer_set_u16(gguf_writer *w, const char *key, uint16_t v) {
    return put_scalar(w, key, GGUF_VT_UINT16, v);
}
g5_status gguf_writer_set_i16(gguf_writer *w, const char *key, int16_t v) {
    return put_scalar(w, key, GGUF_VT_INT16, (uint16_t)v);
}
g5_status gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v) {
    return put_scalar(w, key, GGUF_VT_UINT32, v);
}
g5_status gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v) {
    return put_scalar(w, key, GGUF_VT_INT32, (uint32_t)v);
}
g5_status gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v) {
    return put_scalar(w, key, GGUF_VT_UINT64, v);
}
g5_status gguf_writer_set_i64(gguf_writer *w, const char *key, int64_t v) {
    return put_scalar(w, key, GGUF_VT_INT64, (uint64_t)v);
}
g5_status gguf_writer_set_f32(gguf_writer *w, const char *key, float v) {
    uint32_t bits;
    memcpy(&bits, &v, 4);
    return put_scalar(w, key, GGUF_VT_FLOAT32, bits);
}
g5_status gguf_writer_set_f64(gguf_writer *w, const char *key, double v) {
    uint64_t bits;
    memcpy(&bits, &v, 8);
    return put_scalar(w, key, GGUF_VT_FLOAT64, bits);
}
g5_status gguf_writer_set_bool(gguf_writer *w, const char *key, int v) {
    return put_scalar(w, key, GGUF_VT_BOOL, v ? 1 : 0);
}

g5_status gguf_writer_set_str(gguf_writer *w, const char *key, const char *s, uint64_t len) {
    if (!s && len) return G5_ERR_INVALID_ARG;
    if (len > SIZE_MAX - 8) return G5_ERR_OVERFLOW;
    uint8_t *v = malloc((size_t)len + 8);
    if (!v) return G5_ERR_NOMEM;
    g5_wr_u64(v, len);
    if (len) memcpy(v + 8, s, (size_t)len);
    return put_kv(w, key, GGUF_VT_STRING, v, len + 8);
}

void gguf_writer_set_test_fail_after(gguf_writer *w, uint64_t bytes) { w->fail_after = bytes; }

void gguf_writer_set_alignment(gguf_writer *w, uint64_t alignment) {
    if (!w) return;
    w->alignment = alignment;
    if (alignment == GGUF_DEFAULT_ALIGNMENT) {
        gguf_writer_remove_key(w, "general.alignment");
    } else if (alignment <= UINT32_MAX) {
        /* an OOM here surfaces as a wrong file; the header functions re-check alignment */
        (void)gguf_writer_set_u32(w, "general.alignment", (uint32_t)alignment);
    }
}

g5_status gguf_writer_set_arr(gguf_writer *w, const char *key, gguf_vtype elem_type,
                              const void *data, uint64_t n) {
    if ((unsigned)elem_type >= GGUF_VT_COUNT || elem_type == GGUF_VT_STRING ||
        elem_type == GGUF_VT_ARRAY || (!data && n))
        return G5_ERR_INVALID_ARG;
    uint64_t bytes, total;
    if (g5_mul_u64(n, scalar_size[elem_type], &bytes) || g5_add_u64(bytes, 12, &total) ||
        total > SIZE_MAX)
        return G5_ERR_OVERFLOW;
    uint8_t *v = malloc((size_t)total);
    if (!v) return G5_ERR_NOMEM;
    g5_wr_u32(v, (uint32_t)elem_type);
    g5_wr_u64(v + 4, n);
    if (bytes) memcpy(v + 12, data, (size_t)bytes);
    return put_kv(w, key, GGUF_VT_ARRAY, v, total);
}

g5_status gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *strs,
                                  const uint64_t *lens, uint64_t n) {
    if (!strs && n) return G5_ERR_INVALID_ARG;
    uint64_t total = 12;
    for (uint64_t i = 0; i < n; i++) {
        if (!strs[i] && (!lens || lens[i])) return G5_ERR_INVALID_ARG;
        uint64_t len = lens ? lens[i] : strlen(strs[i]);
        if (g5_add_u64(total, 8, &total) || g5_add_u64(total, len, &total)) return G5_ERR_OVERFLOW;
    }
    if (total > SIZE_MAX) return G5_ERR_OVERFLOW;
    uint8_t *v = malloc((size_t)total);
    if (!v) return G5_ERR_NOMEM;
    g5_wr_u32(v, GGUF_VT_STRING);
    g5_wr_u64(v + 4, n);
    uint8_t *p = v + 12;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t len = lens ? lens[i] : strlen(strs[i]);
        g5_wr_u64(p, len);
        if (len) memcpy(p + 8, strs[i], (size_t)len);
        p += 8 + len;
    }
    return put_kv(w, key, GGUF_VT_ARRAY, v, total);
}

g5_status gguf_writer_copy_kv(gguf_writer *w, const gguf_ctx *src, int64_t i) {
    if (!w || !src) return G5_ERR_INVALID_ARG;
    const char *key = gguf_get_key(src, i);
    const uint8_t *raw;
    uint64_t len;
    if (!key || gguf_get_kv_raw(src, i, &raw, &len) || len > SIZE_MAX) return G5_ERR_INVALID_ARG;
    gguf_vtype type = gguf_get_kv_type(src, i);
    if (strcmp(key, "general.alignment") == 0) {
        /* the copied value describes the padding of the file we write, so adopt it (the reader
         * has checked it is a sane power of two); the pair itself is still copied verbatim */
        gguf_value v;
        if (gguf_get_value(src, i, &v) == G5_OK && v.v.u > 0 && v.v.u <= GW_MAX_ALIGNMENT &&
            !(v.v.u & (v.v.u - 1)) && type != GGUF_VT_FLOAT32 && type != GGUF_VT_FLOAT64 &&
            type != GGUF_VT_BOOL && type != GGUF_VT_STRING && type != GGUF_VT_ARRAY)
            w->alignment = v.v.u;
    }
    uint8_t *v = malloc(len ? (size_t)len : 1);
    if (!v) return G5_ERR_NOMEM;
    if (len) memcpy(v, raw, (size_t)len);
    return put_kv(w, key, type, v, len);
}

g5_status gguf_writer_remove_key(gguf_writer *w, const char *key) {
    if (!w || !key) return G5_ERR_INVALID_ARG;
    int64_t i = find_kv(w, key);
    if (i < 0) return G5_ERR_NOT_FOUND;
    free(w->kvs[i].key);
    free(w->kvs[i].val);
    memmove(&w->kvs[i], &w->kvs[i + 1], (size_t)(w->n_kv - i - 1) * sizeof *w->kvs);
    w->n_kv--;
    return G5_OK;
}

g5_status gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t type,
                                 uint32_t n_dims, const uint64_t *ne, const void *data,
                                 int64_t *index) {
    if (!w || !name || !ne || n_dims < 1 || n_dims > GGUF_MAX_DIMS ||
        strlen(name) > GW_MAX_NAME_LEN)
        return G5_ERR_INVALID_ARG;
    const quant_type_info *qi = quant_type_get(type);
    if (!qi) return G5_ERR_TENSOR_TYPE;
    wtensor t = {.type = type, .n_dims = n_dims, .data = data};
    uint64_t n_elems = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        t.ne[d] = d < n_dims ? ne[d] : 1;
        if (t.ne[d] == 0 || t.ne[d] > (uint64_t)INT64_MAX) return G5_ERR_NDIMS;
        if (g5_mul_u64(n_elems, t.ne[d], &n_elems) || n_elems > (uint64_t)INT64_MAX)
            return G5_ERR_OVERFLOW;
    }
    uint64_t nbytes;
    g5_status st = quant_row_bytes(type, t.ne[0], &nbytes);
    if (st) return st;
    if (g5_mul_u64(nbytes, t.ne[1], &nbytes) || g5_mul_u64(nbytes, t.ne[2], &nbytes) ||
        g5_mul_u64(nbytes, t.ne[3], &nbytes))
        return G5_ERR_OVERFLOW;
    t.nbytes = nbytes;
    for (int64_t i = 0; i < w->n_t; i++)
        if (strcmp(w->ts[i].name, name) == 0) return G5_ERR_DUPLICATE;
    if (w->n_t == w->cap_t) {
        int64_t cap = w->cap_t ? w->cap_t * 2 : 16;
        wtensor *nt = realloc(w->ts, (size_t)cap * sizeof *nt);
        if (!nt) return G5_ERR_NOMEM;
        w->ts = nt;
        w->cap_t = cap;
    }
    t.name = strdup(name);
    if (!t.name) return G5_ERR_NOMEM;
    t.name_len = strlen(name);
    if (index) *index = w->n_t;
    w->ts[w->n_t++] = t;
    return G5_OK;
}

int64_t gguf_writer_n_tensors(const gguf_writer *w) { return w ? w->n_t : 0; }

uint64_t gguf_writer_tensor_nbytes(const gguf_writer *w, int64_t i) {
    return w && i >= 0 && i < w->n_t ? w->ts[i].nbytes : 0;
}

static uint64_t pad_to(uint64_t x, uint64_t a) { return (a - x % a) % a; }

/* Data-section layout: tensor i at offs[i]; each tensor is followed by padding, as ggml does. */
static g5_status layout(const gguf_writer *w, uint64_t *offs, uint64_t *data_size) {
    uint64_t a = w->alignment, off = 0;
    for (int64_t i = 0; i < w->n_t; i++) {
        if (offs) offs[i] = off;
        if (g5_add_u64(off, w->ts[i].nbytes, &off) || g5_add_u64(off, pad_to(off, a), &off))
            return G5_ERR_OVERFLOW;
    }
    *data_size = off;
    return G5_OK;
}

g5_status gguf_writer_header_bytes(const gguf_writer *w, uint8_t **buf, uint64_t *len,
                                   uint64_t *data_size) {
    if (!w || !buf || !len) return G5_ERR_INVALID_ARG;
    *buf = NULL;
    uint64_t a = w->alignment;
    if (a == 0 || (a & (a - 1)) || a > GW_MAX_ALIGNMENT) return G5_ERR_INVALID_ARG;
    uint64_t size = 24;
    for (int64_t i = 0; i < w->n_kv; i++) {
        if (g5_add_u64(size, 12 + w->kvs[i].key_len, &size) ||
            g5_add_u64(size, w->kvs[i].val_len, &size))
            return G5_ERR_OVERFLOW;
    }
    for (int64_t i = 0; i < w->n_t; i++)
        if (g5_add_u64(size, 8 + w->ts[i].name_len + 4 + 8ull * w->ts[i].n_dims + 12, &size))
            return G5_ERR_OVERFLOW;
    uint64_t body = size;
    if (g5_add_u64(size, pad_to(size, a), &size) || size > SIZE_MAX) return G5_ERR_OVERFLOW;
    uint64_t *offs = malloc((size_t)(w->n_t ? w->n_t : 1) * sizeof *offs);
    if (!offs) return G5_ERR_NOMEM;
    uint64_t dsize;
    g5_status st = layout(w, offs, &dsize);
    uint8_t *b = st ? NULL : calloc(1, (size_t)size);
    if (!st && !b) st = G5_ERR_NOMEM;
    if (st) {
        free(offs);
        return st;
    }
    memcpy(b, GGUF_MAGIC, 4);
    g5_wr_u32(b + 4, w->version);
    g5_wr_u64(b + 8, (uint64_t)w->n_t);
    g5_wr_u64(b + 16, (uint64_t)w->n_kv);
    uint8_t *p = b + 24;
    for (int64_t i = 0; i < w->n_kv; i++) {
        const wkv *kv = &w->kvs[i];
        g5_wr_u64(p, kv->key_len);
        memcpy(p + 8, kv->key, (size_t)kv->key_len);
        p += 8 + kv->key_len;
        g5_wr_u32(p, (uint32_t)kv->type);
        memcpy(p + 4, kv->val, (size_t)kv->val_len);
        p += 4 + kv->val_len;
    }
    for (int64_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->ts[i];
        g5_wr_u64(p, t->name_len);
        memcpy(p + 8, t->name, (size_t)t->name_len);
        p += 8 + t->name_len;
        g5_wr_u32(p, t->n_dims);
        p += 4;
        for (uint32_t d = 0; d < t->n_dims; d++, p += 8) g5_wr_u64(p, t->ne[d]);
        g5_wr_u32(p, t->type);
        g5_wr_u64(p + 4, offs[i]);
        p += 12;
    }
    free(offs);
    if ((uint64_t)(p - b) != body) {
        free(b);
        return G5_ERR_INTERNAL;
    }
    *buf = b;
    *len = size;
    if (data_size) *data_size = dsize;
    return G5_OK;
}

g5_status gguf_writer_write_buffer(const gguf_writer *w, uint8_t **buf, uint64_t *len) {
    if (!w || !buf || !len) return G5_ERR_INVALID_ARG;
    *buf = NULL;
    for (int64_t i = 0; i < w->n_t; i++)
        if (!w->ts[i].data) return G5_ERR_INVALID_ARG;
    uint8_t *hdr;
    uint64_t hlen, dsize, total;
    g5_status st = gguf_writer_header_bytes(w, &hdr, &hlen, &dsize);
    if (st) return st;
    if (g5_add_u64(hlen, dsize, &total) || total > SIZE_MAX) {
        free(hdr);
        return G5_ERR_OVERFLOW;
    }
    uint8_t *b = realloc(hdr, (size_t)total);
    if (!b) {
        free(hdr);
        return G5_ERR_NOMEM;
    }
    memset(b + hlen, 0, (size_t)dsize);
    uint64_t off = hlen;
    for (int64_t i = 0; i < w->n_t; i++) {
        memcpy(b + off, w->ts[i].data, (size_t)w->ts[i].nbytes);
        off += w->ts[i].nbytes;
        off += pad_to(off - hlen, w->alignment);
    }
    *buf = b;
    *len = total;
    return G5_OK;
}

/* Bytes written so far and the injected full-disk point of the file being written. */
typedef struct wpos {
    uint64_t done, fail_after;
} wpos;

static g5_status write_all(int fd, const void *p, uint64_t n, const char *path, g5_error *err, wpos *wp) {
    if (wp->fail_after && wp->done + n > wp->fail_after)
        return g5_fail(err, G5_ERR_IO, "%s: write failed: %s (injected by the test hook)", path, strerror(ENOSPC));
    wp->done += n;
    const uint8_t *b = p;
    while (n) {
        size_t chunk = n > (1u << 30) ? (1u << 30) : (size_t)n;
        ssize_t k = write(fd, b, chunk);
        if (k < 0) {
            if (errno == EINTR) continue;
            return g5_fail(err, G5_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        }
        b += k;
        n -= (uint64_t)k;
    }
    return G5_OK;
}

static void fsync_dir_of(const char *path) {
    char *copy = strdup(path);
    if (!copy) return;
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd); /* best effort: the file itself is already durable */
        close(fd);
    }
    free(copy);
}

g5_status gguf_writer_write_file(const gguf_writer *w, const char *path, gguf_fill_fn fill,
                                 void *user, g5_error *err) {
    if (!w || !path)
        return g5_fail(err, G5_ERR_INVALID_ARG, "gguf_writer_write_file: NULL argument");
    uint64_t fill_max = 0;
    for (int64_t i = 0; i < w->n_t; i++) {
        if (w->ts[i].data) continue;
        if (!fill)
            return g5_fail(err, G5_ERR_INVALID_ARG,
                           "%s: tensor '%s' has no data and no fill callback was given", path,
                           w->ts[i].name);
        if (w->ts[i].nbytes > fill_max) fill_max = w->ts[i].nbytes;
    }
    if (fill_max > SIZE_MAX)
        return g5_fail(err, G5_ERR_OVERFLOW, "%s: tensor too large for memory", path);
    uint8_t *hdr;
    uint64_t hlen, dsize;
    g5_status st = gguf_writer_header_bytes(w, &hdr, &hlen, &dsize);
    if (st) return g5_fail(err, st, "%s: cannot build the GGUF header: %s", path, g5_strerror(st));

    size_t plen = strlen(path);
    char *tmp = malloc(plen + 5);
    uint8_t *scratch = fill_max ? malloc((size_t)fill_max) : NULL;
    if (!tmp || (fill_max && !scratch)) {
        free(tmp);
        free(scratch);
        free(hdr);
        return g5_fail(err, G5_ERR_NOMEM, "%s: out of memory", path);
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        st = g5_fail(err, G5_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        goto out;
    }
    g5_mapguard_add_output(tmp);
    wpos wp = {0, w->fail_after};
    st = write_all(fd, hdr, hlen, tmp, err, &wp);
    static const uint8_t zeros[GW_MAX_ALIGNMENT > 4096 ? 4096 : GW_MAX_ALIGNMENT];
    uint64_t off = 0;
    for (int64_t i = 0; i < w->n_t && !st; i++) {
        const wtensor *t = &w->ts[i];
        const void *src = t->data;
        if (!src) {
            st = fill(user, i, scratch, t->nbytes);
            if (st) {
                st = g5_fail(err, st, "%s: producing data of tensor '%s' failed: %s", path,
                             t->name, g5_strerror(st));
                break;
            }
            src = scratch;
        }
        st = write_all(fd, src, t->nbytes, tmp, err, &wp);
        off += t->nbytes;
        uint64_t pad = pad_to(off, w->alignment);
        off += pad;
        while (!st && pad) {
            uint64_t k = pad > sizeof zeros ? sizeof zeros : pad;
            st = write_all(fd, zeros, k, tmp, err, &wp);
            pad -= k;
        }
    }
    if (!st && fsync(fd) != 0)
        st = g5_fail(err, G5_ERR_IO, "%s: fsync failed: %s", tmp, strerror(errno));
    if (close(fd) != 0 && !st)
        st = g5_fail(err, G5_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
    if (!st && rename(tmp, path) != 0)
        st = g5_fail(err, G5_ERR_IO, "%s: rename from %s failed: %s", path, tmp, strerror(errno));
    if (st) unlink(tmp);
    else fsync_dir_of(path);
    g5_mapguard_remove_output(tmp);
out:
    free(tmp);
    free(scratch);
    free(hdr);
    return st;
}
