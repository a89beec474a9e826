/* GGUF reader: parses one image held in memory (gguf_parse_buffer) or a file / split set mapped
 * with mmap (gguf_open). Only the header, kv and tensor-info regions are read; tensor data is
 * never touched. Every count, length and offset taken from the image is checked before use. */
#include "gguf.h"
#include "mapguard.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "quant.h"

#define GGUF_HEADER_BYTES 24u       /* magic, version u32, n_tensors u64, n_kv u64 */
#define GGUF_MAX_NAME_LEN 65535u    /* the spec's limit for keys; also applied to tensor names */
/* Writers use 32 (ggml) or small powers of two; anything above 1 MiB is a corrupt field, and
 * bounding it keeps the padding arithmetic trivially safe. */
#define GGUF_MAX_ALIGNMENT (1u << 20)
/* Smallest possible encodings: a kv is key length (8) + type (4) + a one-byte value; a tensor
 * info is name length (8) + n_dims (4) + one dim (8) + type (4) + offset (8). Used to reject
 * absurd counts before anything is allocated. */
#define GGUF_MIN_KV_BYTES 13u
#define GGUF_MIN_TI_BYTES 32u
#define GGUF_SPLIT_SUFFIX_LEN 20u   /* "-00001-of-00003.gguf" */

_Static_assert(GGUF_VT_COUNT == 13, "GGUF defines 13 metadata value types");

typedef struct gguf_kv {
    const char *key;     /* NUL-terminated copy (in the split's pool) */
    uint64_t key_off;    /* byte offset of the key's length field; the bytes follow it */
    uint64_t key_len;
    uint64_t type_off;   /* byte offset of the value type field */
    uint64_t val_off;    /* raw value bytes [val_off, val_end) follow the type field */
    uint64_t val_end;
    gguf_value val;
    uint64_t *str_offs;  /* string arrays: offset of each element's length field */
} gguf_kv;

/* Open-addressing hash index from a name to an array index. */
typedef struct name_index {
    int64_t *slots;      /* -1 = empty */
    uint64_t mask;
} name_index;

typedef struct gguf_split {
    char *name;
    const uint8_t *buf;
    uint64_t len;
    void *map;           /* non-NULL when this split owns an mmap of `len` bytes */
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset;
    uint64_t kv_begin, kv_end;
    int64_t n_kv, cap_kv;
    gguf_kv *kvs;
    name_index kv_index;
    char *key_pool;
    char *name_pool;
    int64_t n_tensors;   /* tensors of this split, as counted in its header */
} gguf_split;

struct gguf_ctx {
    uint32_t n_splits;
    gguf_split *splits;
    int64_t n_tensors, cap_tensors;
    gguf_tensor *tensors;
    uint64_t *name_offs; /* byte offset of each tensor's name field in its split (messages) */
    name_index t_index;
};

/* ------------------------------------------------------------------------------------------ */

static const char *const vtype_names[GGUF_VT_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};
static const uint8_t vtype_sizes[GGUF_VT_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

const char *gguf_vtype_name(gguf_vtype t) {
    return (unsigned)t < GGUF_VT_COUNT ? vtype_names[t] : "?";
}

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

typedef const char *(*name_of_fn)(const void *arr, int64_t i);
static const char *kv_name_of(const void *arr, int64_t i) { return ((const gguf_kv *)arr)[i].key; }
static const char *t_name_of(const void *arr, int64_t i) {
    return ((const gguf_tensor *)arr)[i].name;
}

static int index_init(name_index *ix, int64_t n) {
    uint64_t cap = 16;
    while (cap < (uint64_t)n * 2) cap <<= 1;
    ix->slots = malloc(cap * sizeof *ix->slots);
    if (!ix->slots) return -1;
    memset(ix->slots, 0xff, cap * sizeof *ix->slots);
    ix->mask = cap - 1;
    return 0;
}

/* Returns the index already holding `name`, or -1 after inserting `i` (i >= 0), or -1 when
 * only looking up (i < 0) and absent. */
static int64_t index_put(name_index *ix, const void *arr, name_of_fn name_of, const char *name,
                         int64_t i) {
    if (!ix->slots) return -1;
    uint64_t h = hash_str(name) & ix->mask;
    for (;;) {
        int64_t cur = ix->slots[h];
        if (cur < 0) {
            if (i >= 0) ix->slots[h] = i;
            return -1;
        }
        if (strcmp(name_of(arr, cur), name) == 0) return cur;
        h = (h + 1) & ix->mask;
    }
}

static uint64_t align_up(uint64_t x, uint64_t a, int *ovf) {
    uint64_t r = x % a, out = x;
    if (r && g5_add_u64(x, a - r, &out)) *ovf = 1;
    return out;
}

/* ---- cursor over one image ---------------------------------------------------------------- */

typedef struct rd {
    const uint8_t *b;
    uint64_t len, pos;
    const char *file;
    g5_error *err;
    char what[320];      /* "key 'x'", "tensor 'y'", "header": the field's owner, for messages */
} rd;

static void rd_what(rd *r, const char *kind, const uint8_t *s, uint64_t n) {
    int shown = n > 200 ? 200 : (int)n;
    snprintf(r->what, sizeof r->what, "%s '%.*s%s'", kind, shown, (const char *)s,
             n > 200 ? "..." : "");
}

static uint64_t rd_left(const rd *r) { return r->len - r->pos; }

static g5_status rd_need(rd *r, uint64_t n, const char *field) {
    if (n <= rd_left(r)) return G5_OK;
    return g5_fail_at(r->err, G5_ERR_TRUNCATED, r->pos,
                      "%s: %s: %s needs %llu bytes but the file ends after %llu", r->file, r->what,
                      field, (unsigned long long)n, (unsigned long long)rd_left(r));
}

static g5_status rd_u32(rd *r, uint32_t *v, const char *field) {
    g5_status st = rd_need(r, 4, field);
    if (st) return st;
    *v = g5_rd_u32(r->b + r->pos);
    r->pos += 4;
    return G5_OK;
}

static g5_status rd_u64(rd *r, uint64_t *v, const char *field) {
    g5_status st = rd_need(r, 8, field);
    if (st) return st;
    *v = g5_rd_u64(r->b + r->pos);
    r->pos += 8;
    return G5_OK;
}

/* A length-prefixed string; the bytes stay in the buffer. max_len 0 = bounded by the file. */
static g5_status rd_str(rd *r, uint64_t *off, uint64_t *n, uint64_t max_len, const char *field) {
    uint64_t at = r->pos, len;
    g5_status st = rd_u64(r, &len, field);
    if (st) return st;
    if (max_len && len > max_len)
        return g5_fail_at(r->err, G5_ERR_COUNT, at, "%s: %s: %s length %llu exceeds %llu",
                          r->file, r->what, field, (unsigned long long)len,
                          (unsigned long long)max_len);
    if (len > rd_left(r))
        return g5_fail_at(r->err, G5_ERR_TRUNCATED, at,
                          "%s: %s: %s of %llu bytes runs past the end of the file (%llu left)",
                          r->file, r->what, field, (unsigned long long)len,
                          (unsigned long long)rd_left(r));
    *off = r->pos;
    *n = len;
    r->pos += len;
    return G5_OK;
}

/* ---- context helpers ---------------------------------------------------------------------- */

static void split_release(gguf_split *s) {
    if (!s) return;
    for (int64_t i = 0; i < s->n_kv; i++) free(s->kvs[i].str_offs);
    free(s->kvs);
    free(s->kv_index.slots);
    free(s->key_pool);
    free(s->name_pool);
    free(s->name);
    if (s->map) {
        g5_mapguard_remove(s->map);
        munmap(s->map, (size_t)s->len);
    }
    memset(s, 0, sizeof *s);
}

void gguf_free(gguf_ctx *ctx) {
    if (!ctx) return;
    for (uint32_t i = 0; i < ctx->n_splits; i++) split_release(&ctx->splits[i]);
    free(ctx->splits);
    free(ctx->tensors);
    free(ctx->name_offs);
    free(ctx->t_index.slots);
    free(ctx);
}

static g5_status oom(g5_error *err, const char *file) {
    return g5_fail(err, G5_ERR_NOMEM, "%s: out of memory while parsing", file);
}

/* ---- kv section ----------------------------------------------------------------------------- */

static g5_status parse_value(rd *r, gguf_kv *kv, uint32_t type_id) {
    g5_status st;
    gguf_value *v = &kv->val;
    if (type_id >= GGUF_VT_COUNT)
        return g5_fail_at(r->err, G5_ERR_VALUE_TYPE, kv->type_off,
                          "%s: %s: unknown value type %u", r->file, r->what, type_id);
    gguf_vtype type = (gguf_vtype)type_id;
    v->type = type;
    if (type == GGUF_VT_STRING) {
        uint64_t off, n;
        if ((st = rd_str(r, &off, &n, 0, "string value"))) return st;
        v->v.str.s = (const char *)r->b + off;
        v->v.str.len = n;
        return G5_OK;
    }
    if (type != GGUF_VT_ARRAY) {
        unsigned sz = vtype_sizes[type];
        if ((st = rd_need(r, sz, "value"))) return st;
        const uint8_t *p = r->b + r->pos;
        switch (type) {
        case GGUF_VT_UINT8: v->v.u = p[0]; break;
        case GGUF_VT_BOOL:
            if (p[0] > 1) /* GGUF bools are 0 or 1; anything else is damage, not "true" */
                return g5_fail_at(r->err, G5_ERR_FORMAT, r->pos, "%s: %s: boolean value %u (must be 0 or 1)",
                                  r->file, r->what, p[0]);
            v->v.u = p[0];
            break;
        case GGUF_VT_INT8: v->v.i = (int8_t)p[0]; break;
        case GGUF_VT_UINT16: v->v.u = g5_rd_u16(p); break;
        case GGUF_VT_INT16: v->v.i = (int16_t)g5_rd_u16(p); break;
        case GGUF_VT_UINT32: v->v.u = g5_rd_u32(p); break;
        case GGUF_VT_INT32: v->v.i = (int32_t)g5_rd_u32(p); break;
        case GGUF_VT_UINT64: v->v.u = g5_rd_u64(p); break;
        case GGUF_VT_INT64: v->v.i = (int64_t)g5_rd_u64(p); break;
        case GGUF_VT_FLOAT32: {
            uint32_t bits = g5_rd_u32(p);
            float f;
            memcpy(&f, &bits, 4);
            v->v.f = f;
            break;
        }
        case GGUF_VT_FLOAT64: {
            uint64_t bits = g5_rd_u64(p);
            memcpy(&v->v.f, &bits, 8);
            break;
        }
        default: break;
        }
        r->pos += sz;
        return G5_OK;
    }

    uint64_t et_at = r->pos, n_at, n;
    uint32_t et;
    if ((st = rd_u32(r, &et, "array element type"))) return st;
    if (et == GGUF_VT_ARRAY)
        return g5_fail_at(r->err, G5_ERR_VALUE_TYPE, et_at,
                          "%s: %s: nested arrays are not supported", r->file, r->what);
    if (et >= GGUF_VT_COUNT)
        return g5_fail_at(r->err, G5_ERR_VALUE_TYPE, et_at,
                          "%s: %s: unknown array element type %u", r->file, r->what, et);
    n_at = r->pos;
    if ((st = rd_u64(r, &n, "array length"))) return st;
    uint64_t min_elem = et == GGUF_VT_STRING ? 8 : vtype_sizes[et];
    if (n > rd_left(r) / min_elem)
        return g5_fail_at(r->err, G5_ERR_COUNT, n_at,
                          "%s: %s: array of %llu %s elements cannot fit in the %llu bytes left",
                          r->file, r->what, (unsigned long long)n, vtype_names[et],
                          (unsigned long long)rd_left(r));
    v->v.arr.elem_type = (gguf_vtype)et;
    v->v.arr.n = n;
    v->v.arr.data = r->b + r->pos;
    if (et != GGUF_VT_STRING) {
        for (uint64_t j = 0; et == GGUF_VT_BOOL && j < n; j++)
            if (r->b[r->pos + j] > 1)
                return g5_fail_at(r->err, G5_ERR_FORMAT, r->pos + j, "%s: %s: element %llu is boolean value %u (must be 0 or 1)",
                                  r->file, r->what, (unsigned long long)j, r->b[r->pos + j]);
        r->pos += n * min_elem;
        return G5_OK;
    }
    /* Validate every element first, so the offset index is allocated only for a sound array. */
    uint64_t start = r->pos;
    for (uint64_t j = 0; j < n; j++) {
        uint64_t len;
        if (rd_left(r) < 8 || (len = g5_rd_u64(r->b + r->pos)) > rd_left(r) - 8)
            return g5_fail_at(r->err, G5_ERR_TRUNCATED, r->pos,
                              "%s: %s: string element %llu of %llu runs past the end of the file",
                              r->file, r->what, (unsigned long long)j, (unsigned long long)n);
        r->pos += 8 + len;
    }
    kv->str_offs = malloc((n ? n : 1) * sizeof *kv->str_offs);
    if (!kv->str_offs) return oom(r->err, r->file);
    uint64_t p = start;
    for (uint64_t j = 0; j < n; j++) {
        kv->str_offs[j] = p;
        p += 8 + g5_rd_u64(r->b + p);
    }
    return G5_OK;
}

static g5_status parse_kvs(rd *r, gguf_split *s, uint64_t n_kv) {
    g5_status st;
    s->kv_begin = r->pos;
    uint64_t key_bytes = 0;
    for (uint64_t i = 0; i < n_kv; i++) {
        if (s->n_kv == s->cap_kv) {
            int64_t cap = s->cap_kv ? s->cap_kv * 2 : 16;
            gguf_kv *nk = realloc(s->kvs, (size_t)cap * sizeof *nk);
            if (!nk) return oom(r->err, r->file);
            s->kvs = nk;
            s->cap_kv = cap;
        }
        gguf_kv *kv = &s->kvs[s->n_kv];
        memset(kv, 0, sizeof *kv);
        snprintf(r->what, sizeof r->what, "kv pair %llu", (unsigned long long)i);
        kv->key_off = r->pos;
        uint64_t koff;
        if ((st = rd_str(r, &koff, &kv->key_len, GGUF_MAX_NAME_LEN, "key"))) return st;
        s->n_kv++;
        rd_what(r, "key", r->b + koff, kv->key_len);
        if (memchr(r->b + koff, 0, kv->key_len))
            return g5_fail_at(r->err, G5_ERR_FORMAT, kv->key_off, "%s: %s: key contains a NUL byte",
                              r->file, r->what);
        key_bytes += kv->key_len + 1;
        uint32_t type;
        kv->type_off = r->pos;
        if ((st = rd_u32(r, &type, "value type"))) return st;
        kv->val_off = r->pos;
        if ((st = parse_value(r, kv, type))) return st;
        kv->val_end = r->pos;
    }
    s->kv_end = r->pos;

    s->key_pool = malloc(key_bytes ? key_bytes : 1);
    if (!s->key_pool || index_init(&s->kv_index, s->n_kv)) return oom(r->err, r->file);
    char *p = s->key_pool;
    for (int64_t i = 0; i < s->n_kv; i++) {
        gguf_kv *kv = &s->kvs[i];
        memcpy(p, r->b + kv->key_off + 8, kv->key_len);
        p[kv->key_len] = 0;
        kv->key = p;
        p += kv->key_len + 1;
        int64_t prev = index_put(&s->kv_index, s->kvs, kv_name_of, kv->key, i);
        if (prev >= 0)
            return g5_fail_at(r->err, G5_ERR_DUPLICATE, kv->key_off,
                              "%s: key '%s' appears twice (first at byte %llu)", r->file, kv->key,
                              (unsigned long long)s->kvs[prev].key_off);
    }
    return G5_OK;
}

static const gguf_kv *split_find_kv(const gguf_split *s, const char *key) {
    int64_t i = index_put((name_index *)&s->kv_index, s->kvs, kv_name_of, key, -1);
    return i >= 0 ? &s->kvs[i] : NULL;
}

static int kv_is_int(const gguf_kv *kv) {
    switch (kv->val.type) {
    case GGUF_VT_UINT8: case GGUF_VT_INT8: case GGUF_VT_UINT16: case GGUF_VT_INT16:
    case GGUF_VT_UINT32: case GGUF_VT_INT32: case GGUF_VT_UINT64: case GGUF_VT_INT64:
        return 1;
    default:
        return 0;
    }
}

static int kv_is_signed(const gguf_kv *kv) {
    gguf_vtype t = kv->val.type;
    return t == GGUF_VT_INT8 || t == GGUF_VT_INT16 || t == GGUF_VT_INT32 || t == GGUF_VT_INT64;
}

static g5_status parse_alignment(rd *r, gguf_split *s) {
    s->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *kv = split_find_kv(s, "general.alignment");
    if (!kv) return G5_OK;
    if (!kv_is_int(kv))
        return g5_fail_at(r->err, G5_ERR_WRONG_TYPE, kv->type_off,
                          "%s: key 'general.alignment': expected an integer, found %s", r->file,
                          gguf_vtype_name(kv->val.type));
    if (kv_is_signed(kv) && kv->val.v.i < 0)
        return g5_fail_at(r->err, G5_ERR_ALIGN, kv->val_off,
                          "%s: key 'general.alignment': negative value %lld", r->file,
                          (long long)kv->val.v.i);
    uint64_t a = kv->val.v.u; /* same bits as v.i when non-negative */
    if (a == 0 || (a & (a - 1)) || a > GGUF_MAX_ALIGNMENT)
        return g5_fail_at(r->err, G5_ERR_ALIGN, kv->val_off,
                          "%s: key 'general.alignment': %llu is not a power of two in 1..%u",
                          r->file, (unsigned long long)a, GGUF_MAX_ALIGNMENT);
    s->alignment = a;
    return G5_OK;
}

/* ---- tensor infos ------------------------------------------------------------------------- */

typedef struct t_span {
    uint64_t off, end;
    int64_t idx;
} t_span;

static int span_cmp(const void *a, const void *b) {
    const t_span *x = a, *y = b;
    if (x->off != y->off) return x->off < y->off ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

static g5_status ctx_grow_tensors(gguf_ctx *ctx, int64_t want) {
    if (want <= ctx->cap_tensors) return G5_OK;
    int64_t cap = ctx->cap_tensors ? ctx->cap_tensors : 16;
    while (cap < want) cap *= 2;
    gguf_tensor *t = realloc(ctx->tensors, (size_t)cap * sizeof *t);
    if (!t) return G5_ERR_NOMEM;
    ctx->tensors = t;
    uint64_t *o = realloc(ctx->name_offs, (size_t)cap * sizeof *o);
    if (!o) return G5_ERR_NOMEM;
    ctx->name_offs = o;
    ctx->cap_tensors = cap;
    return G5_OK;
}

/* One tensor info at r->pos, appended to ctx->tensors (name kept as a buffer offset). */
static g5_status parse_tensor_info(rd *r, gguf_ctx *ctx, const gguf_split *s, uint32_t split,
                                   uint64_t i, uint64_t *name_bytes) {
    g5_status st;
    if (ctx_grow_tensors(ctx, ctx->n_tensors + 1)) return oom(r->err, r->file);
    gguf_tensor *t = &ctx->tensors[ctx->n_tensors];
    memset(t, 0, sizeof *t);
    snprintf(r->what, sizeof r->what, "tensor info %llu", (unsigned long long)i);
    uint64_t name_at = r->pos, noff, nlen;
    if ((st = rd_str(r, &noff, &nlen, GGUF_MAX_NAME_LEN, "tensor name"))) return st;
    rd_what(r, "tensor", r->b + noff, nlen);
    if (memchr(r->b + noff, 0, nlen))
        return g5_fail_at(r->err, G5_ERR_FORMAT, name_at, "%s: %s: name contains a NUL byte",
                          r->file, r->what);
    uint64_t nd_at = r->pos;
    uint32_t n_dims;
    if ((st = rd_u32(r, &n_dims, "n_dims"))) return st;
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return g5_fail_at(r->err, G5_ERR_NDIMS, nd_at, "%s: %s: n_dims %u is outside 1..%d",
                          r->file, r->what, n_dims, GGUF_MAX_DIMS);
    t->n_dims = n_dims;
    uint64_t n_elems = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        uint64_t at = r->pos, ne;
        if ((st = rd_u64(r, &ne, "dimension"))) return st;
        /* ggml stores dims as int64: a value with the top bit set is negative there */
        if (ne == 0 || ne > (uint64_t)INT64_MAX)
            return g5_fail_at(r->err, G5_ERR_NDIMS, at, "%s: %s: dimension %u is %lld",
                              r->file, r->what, d, (long long)ne);
        if (g5_mul_u64(n_elems, ne, &n_elems) || n_elems > (uint64_t)INT64_MAX)
            return g5_fail_at(r->err, G5_ERR_OVERFLOW, at,
                              "%s: %s: element count overflows at dimension %u", r->file, r->what,
                              d);
        t->ne[d] = ne;
    }
    t->n_elems = n_elems;
    uint64_t type_at = r->pos;
    if ((st = rd_u32(r, &t->type, "type"))) return st;
    const quant_type_info *qi = quant_type_get(t->type);
    if (!qi || qi->block_elems == 0 || qi->block_bytes == 0)
        return g5_fail_at(r->err, G5_ERR_TENSOR_TYPE, type_at, "%s: %s: unknown ggml type id %u",
                          r->file, r->what, t->type);
    if (t->ne[0] % qi->block_elems)
        return g5_fail_at(r->err, G5_ERR_ALIGN, type_at,
                          "%s: %s: row length %llu is not a multiple of %s's block of %u",
                          r->file, r->what, (unsigned long long)t->ne[0], qi->name,
                          qi->block_elems);
    uint64_t nbytes = (t->ne[0] / qi->block_elems);
    if (g5_mul_u64(nbytes, qi->block_bytes, &nbytes) ||
        g5_mul_u64(nbytes, t->ne[1], &nbytes) || g5_mul_u64(nbytes, t->ne[2], &nbytes) ||
        g5_mul_u64(nbytes, t->ne[3], &nbytes))
        return g5_fail_at(r->err, G5_ERR_OVERFLOW, type_at, "%s: %s: byte size overflows",
                          r->file, r->what);
    t->nbytes = nbytes;
    uint64_t off_at = r->pos;
    if ((st = rd_u64(r, &t->offset, "data offset"))) return st;
    if (t->offset % s->alignment)
        return g5_fail_at(r->err, G5_ERR_ALIGN, off_at,
                          "%s: %s: data offset %llu is not a multiple of the alignment %llu",
                          r->file, r->what, (unsigned long long)t->offset,
                          (unsigned long long)s->alignment);
    t->split = split;
    ctx->name_offs[ctx->n_tensors] = name_at;
    ctx->n_tensors++;
    *name_bytes += nlen + 1;
    return G5_OK;
}

/* Places the tensors [first, ctx->n_tensors) of split s in its data section and checks bounds
 * and overlaps. */
static g5_status place_tensors(rd *r, gguf_ctx *ctx, gguf_split *s, int64_t first) {
    int64_t n = ctx->n_tensors - first;
    if (n == 0) return G5_OK;
    t_span *sp = malloc((size_t)n * sizeof *sp);
    if (!sp) return oom(r->err, r->file);
    g5_status st = G5_OK;
    for (int64_t k = 0; k < n && !st; k++) {
        gguf_tensor *t = &ctx->tensors[first + k];
        /* the offset field sits 12 bytes before the end of the info, after the type */
        uint64_t name_at = ctx->name_offs[first + k];
        uint64_t off_at = name_at + 8 + strlen(t->name) + 4 + 8ull * t->n_dims + 4;
        uint64_t abs, end;
        if (g5_add_u64(s->data_offset, t->offset, &abs) || g5_add_u64(abs, t->nbytes, &end)) {
            st = g5_fail_at(r->err, G5_ERR_OVERFLOW, off_at,
                            "%s: tensor '%s': data offset %llu + size %llu overflows", r->file,
                            t->name, (unsigned long long)t->offset,
                            (unsigned long long)t->nbytes);
            break;
        }
        if (end > s->len) {
            st = g5_fail_at(r->err, G5_ERR_BOUNDS, off_at,
                            "%s: tensor '%s': data [%llu, %llu) lies past the end of the file "
                            "(%llu bytes)",
                            r->file, t->name, (unsigned long long)abs, (unsigned long long)end,
                            (unsigned long long)s->len);
            break;
        }
        t->file_offset = abs;
        t->data = s->buf + abs;
        sp[k] = (t_span){abs, end, first + k};
    }
    if (!st) {
        qsort(sp, (size_t)n, sizeof *sp, span_cmp);
        for (int64_t k = 1; k < n; k++) {
            if (sp[k].off < sp[k - 1].end) {
                const gguf_tensor *a = &ctx->tensors[sp[k - 1].idx], *b = &ctx->tensors[sp[k].idx];
                st = g5_fail_at(r->err, G5_ERR_OVERLAP, ctx->name_offs[sp[k].idx],
                                "%s: tensor '%s' data [%llu, %llu) overlaps tensor '%s' "
                                "[%llu, %llu)",
                                r->file, b->name, (unsigned long long)sp[k].off,
                                (unsigned long long)sp[k].end, a->name,
                                (unsigned long long)sp[k - 1].off,
                                (unsigned long long)sp[k - 1].end);
                break;
            }
        }
    }
    free(sp);
    return st;
}

/* Builds the tensor name index over all tensors; duplicates are errors. */
static g5_status index_tensors(gguf_ctx *ctx, g5_error *err) {
    free(ctx->t_index.slots);
    ctx->t_index.slots = NULL;
    if (index_init(&ctx->t_index, ctx->n_tensors))
        return g5_fail(err, G5_ERR_NOMEM, "out of memory indexing tensors");
    for (int64_t i = 0; i < ctx->n_tensors; i++) {
        const gguf_tensor *t = &ctx->tensors[i];
        int64_t prev = index_put(&ctx->t_index, ctx->tensors, t_name_of, t->name, i);
        if (prev < 0) continue;
        const gguf_tensor *p = &ctx->tensors[prev];
        const char *f1 = ctx->splits[p->split].name, *f2 = ctx->splits[t->split].name;
        return g5_fail_at(err, G5_ERR_DUPLICATE, ctx->name_offs[i],
                          "%s: tensor '%s' is defined twice (first in %s at byte %llu)", f2,
                          t->name, f1, (unsigned long long)ctx->name_offs[prev]);
    }
    return G5_OK;
}

/* ---- one image ---------------------------------------------------------------------------- */

static g5_status parse_image(gguf_ctx *ctx, const uint8_t *b, uint64_t len, g5_error *err) {
    gguf_split *s = &ctx->splits[0];
    rd r = {.b = b, .len = len, .pos = 0, .file = s->name, .err = err};
    snprintf(r.what, sizeof r.what, "header");
    g5_status st;
    s->buf = b;
    s->len = len;
    if (len < 4)
        return g5_fail_at(err, G5_ERR_TRUNCATED, 0, "%s: %llu bytes is too short for a GGUF magic",
                          s->name, (unsigned long long)len);
    if (memcmp(b, GGUF_MAGIC, 4) != 0)
        return g5_fail_at(err, G5_ERR_BAD_MAGIC, 0,
                          "%s: not a GGUF file (magic %02x %02x %02x %02x)", s->name, b[0], b[1],
                          b[2], b[3]);
    r.pos = 4;
    if ((st = rd_u32(&r, &s->version, "version"))) return st;
    if (s->version != 2 && s->version != 3) {
        uint32_t sw = __builtin_bswap32(s->version);
        if (sw == 2 || sw == 3)
            return g5_fail_at(err, G5_ERR_VERSION, 4,
                              "%s: big-endian GGUF v%u is not supported", s->name, sw);
        return g5_fail_at(err, G5_ERR_VERSION, 4, "%s: GGUF version %u is not supported (2, 3 are)",
                          s->name, s->version);
    }
    uint64_t n_tensors, n_kv;
    if ((st = rd_u64(&r, &n_tensors, "tensor count"))) return st;
    if ((st = rd_u64(&r, &n_kv, "kv count"))) return st;
    if (n_kv > rd_left(&r) / GGUF_MIN_KV_BYTES)
        return g5_fail_at(err, G5_ERR_COUNT, 16,
                          "%s: header: %llu kv pairs cannot fit in %llu bytes", s->name,
                          (unsigned long long)n_kv, (unsigned long long)rd_left(&r));
    if (n_tensors > rd_left(&r) / GGUF_MIN_TI_BYTES)
        return g5_fail_at(err, G5_ERR_COUNT, 8,
                          "%s: header: %llu tensor infos cannot fit in %llu bytes", s->name,
                          (unsigned long long)n_tensors, (unsigned long long)rd_left(&r));
    if ((st = parse_kvs(&r, s, n_kv))) return st;
    if ((st = parse_alignment(&r, s))) return st;
    snprintf(r.what, sizeof r.what, "tensor infos");
    if (n_tensors > rd_left(&r) / GGUF_MIN_TI_BYTES)
        return g5_fail_at(err, G5_ERR_COUNT, 8,
                          "%s: header: %llu tensor infos cannot fit in the %llu bytes after the "
                          "kv section",
                          s->name, (unsigned long long)n_tensors, (unsigned long long)rd_left(&r));

    int64_t first = ctx->n_tensors;
    uint64_t name_bytes = 0;
    for (uint64_t i = 0; i < n_tensors; i++)
        if ((st = parse_tensor_info(&r, ctx, s, 0, i, &name_bytes))) return st;
    s->n_tensors = (int64_t)n_tensors;

    s->name_pool = malloc(name_bytes ? name_bytes : 1);
    if (!s->name_pool) return oom(err, s->name);
    char *p = s->name_pool;
    for (int64_t i = first; i < ctx->n_tensors; i++) {
        uint64_t nlen = g5_rd_u64(b + ctx->name_offs[i]);
        memcpy(p, b + ctx->name_offs[i] + 8, nlen);
        p[nlen] = 0;
        ctx->tensors[i].name = p;
        p += nlen + 1;
    }

    int ovf = 0;
    s->data_offset = align_up(r.pos, s->alignment, &ovf);
    if (ovf) return g5_fail_at(err, G5_ERR_OVERFLOW, r.pos, "%s: data offset overflows", s->name);
    if (s->data_offset > len) {
        /* Without tensors, missing final padding is harmless: nothing lives in the data
         * section. */
        if (n_tensors == 0) {
            s->data_offset = len;
        } else {
            return g5_fail_at(err, G5_ERR_TRUNCATED, r.pos,
                              "%s: data section would start at byte %llu, past the end of the "
                              "file (%llu bytes)",
                              s->name, (unsigned long long)s->data_offset,
                              (unsigned long long)len);
        }
    }
    if ((st = place_tensors(&r, ctx, s, first))) return st;
    return G5_OK;
}

static g5_status ctx_new(const char *name, gguf_ctx **out, g5_error *err) {
    gguf_ctx *ctx = calloc(1, sizeof *ctx);
    if (ctx) ctx->splits = calloc(1, sizeof *ctx->splits);
    if (ctx && ctx->splits) {
        ctx->n_splits = 1;
        ctx->splits[0].name = strdup(name ? name : "<buffer>");
    }
    if (!ctx || !ctx->splits || !ctx->splits[0].name) {
        gguf_free(ctx);
        return g5_fail(err, G5_ERR_NOMEM, "%s: out of memory", name ? name : "<buffer>");
    }
    *out = ctx;
    return G5_OK;
}

g5_status gguf_parse_buffer(const void *buf, size_t len, const char *name, gguf_ctx **out,
                            g5_error *err) {
    if (!out) return g5_fail(err, G5_ERR_INVALID_ARG, "gguf_parse_buffer: out is NULL");
    *out = NULL;
    if (!buf && len) return g5_fail(err, G5_ERR_INVALID_ARG, "gguf_parse_buffer: NULL buffer");
    gguf_ctx *ctx;
    g5_status st = ctx_new(name, &ctx, err);
    if (st) return st;
    static const uint8_t empty[1];
    st = parse_image(ctx, buf ? buf : empty, len, err);
    if (!st) st = index_tensors(ctx, err);
    if (st) {
        gguf_free(ctx);
        return st;
    }
    *out = ctx;
    return G5_OK;
}

/* ---- files and split sets ----------------------------------------------------------------- */

/* `sibling_of`: the file whose split set this one belongs to (NULL for the file asked for);
 * a sibling that does not exist is G5_ERR_MISSING_SPLIT rather than an I/O error. */
static g5_status open_one(const char *path, const char *sibling_of, uint32_t no, uint32_t n,
                          gguf_ctx **out, g5_error *err) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        if (sibling_of && e == ENOENT)
            return g5_fail(err, G5_ERR_MISSING_SPLIT, "%s: split %u of %u (sibling of %s) is "
                           "missing", path, no, n, sibling_of);
        return g5_fail(err, G5_ERR_IO, "%s: cannot open: %s", path, strerror(e));
    }
    struct stat stt;
    if (fstat(fd, &stt) != 0 || !S_ISREG(stt.st_mode)) {
        int e = errno;
        close(fd);
        return g5_fail(err, G5_ERR_IO, "%s: not a readable regular file%s%s", path,
                       e ? ": " : "", e ? strerror(e) : "");
    }
    uint64_t len = (uint64_t)stt.st_size;
    void *map = NULL;
    if (len > 0) {
        map = mmap(NULL, (size_t)len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return g5_fail(err, G5_ERR_IO, "%s: mmap of %llu bytes failed: %s", path,
                           (unsigned long long)len, strerror(e));
        }
        g5_mapguard_add(map, (size_t)len, path); /* a truncation under us: an error, not a crash */
    }
    close(fd);
    gguf_ctx *ctx;
    g5_status st = ctx_new(path, &ctx, err);
    if (st) {
        if (map) {
            g5_mapguard_remove(map);
            munmap(map, (size_t)len);
        }
        return st;
    }
    static const uint8_t empty[1];
    st = parse_image(ctx, map ? map : empty, len, err);
    ctx->splits[0].map = map;
    ctx->splits[0].len = len;
    ctx->splits[0].buf = map ? map : empty;
    if (!st) st = index_tensors(ctx, err);
    if (st) {
        gguf_free(ctx);
        return st;
    }
    *out = ctx;
    return G5_OK;
}

/* Recognizes PREFIX-KKKKK-of-NNNNN.gguf; returns 1 and fills k (1-based), n and the prefix
 * length. */
static int split_name(const char *path, uint32_t *k, uint32_t *n, size_t *prefix_len) {
    size_t L = strlen(path);
    if (L < GGUF_SPLIT_SUFFIX_LEN) return 0;
    const char *s = path + L - GGUF_SPLIT_SUFFIX_LEN;
    if (s[0] != '-' || memcmp(s + 6, "-of-", 4) != 0 || memcmp(s + 15, ".gguf", 5) != 0) return 0;
    uint32_t a = 0, b = 0;
    for (int i = 0; i < 5; i++) {
        if (s[1 + i] < '0' || s[1 + i] > '9' || s[10 + i] < '0' || s[10 + i] > '9') return 0;
        a = a * 10 + (uint32_t)(s[1 + i] - '0');
        b = b * 10 + (uint32_t)(s[10 + i] - '0');
    }
    *k = a;
    *n = b;
    *prefix_len = L - GGUF_SPLIT_SUFFIX_LEN;
    return 1;
}

/* Reads an integer split.* key of one split; G5_ERR_NOT_FOUND (no message) when absent. */
static g5_status split_key(const gguf_split *s, const char *key, uint64_t *v, g5_error *err) {
    const gguf_kv *kv = split_find_kv(s, key);
    if (!kv) return G5_ERR_NOT_FOUND;
    if (!kv_is_int(kv) || (kv_is_signed(kv) && kv->val.v.i < 0))
        return g5_fail_at(err, G5_ERR_SPLIT, kv->type_off,
                          "%s: key '%s' must be a non-negative integer (found %s)", s->name, key,
                          gguf_vtype_name(kv->val.type));
    *v = kv->val.v.u;
    return G5_OK;
}

/* Checks split i of n: split.count == n, split.no == i; tensors.count (if present) == total,
 * or required when `need_total`. */
static g5_status check_split(const gguf_split *s, uint32_t i, uint32_t n, uint64_t total,
                             int need_total, g5_error *err) {
    uint64_t v;
    g5_status st = split_key(s, "split.count", &v, err);
    if (st == G5_ERR_NOT_FOUND)
        return g5_fail_at(err, G5_ERR_SPLIT, s->kv_begin,
                          "%s: split %u of %u carries no split.count key", s->name, i + 1, n);
    if (st) return st;
    const gguf_kv *kv = split_find_kv(s, "split.count");
    if (v != n)
        return g5_fail_at(err, G5_ERR_SPLIT, kv->val_off,
                          "%s: split.count is %llu but the set has %u files", s->name,
                          (unsigned long long)v, n);
    st = split_key(s, "split.no", &v, err);
    if (st == G5_ERR_NOT_FOUND)
        return g5_fail_at(err, G5_ERR_SPLIT, s->kv_begin, "%s: split %u of %u carries no split.no",
                          s->name, i + 1, n);
    if (st) return st;
    if (v != i) {
        kv = split_find_kv(s, "split.no");
        return g5_fail_at(err, G5_ERR_SPLIT, kv->val_off,
                          "%s: split.no is %llu but the file name makes it %u (0-based)",
                          s->name, (unsigned long long)v, i);
    }
    st = split_key(s, "split.tensors.count", &v, err);
    if (st == G5_ERR_NOT_FOUND) {
        if (!need_total) return G5_OK;
        return g5_fail_at(err, G5_ERR_SPLIT, s->kv_begin,
                          "%s: first split carries no split.tensors.count", s->name);
    }
    if (st) return st;
    if (v != total) {
        kv = split_find_kv(s, "split.tensors.count");
        return g5_fail_at(err, G5_ERR_SPLIT, kv->val_off,
                          "%s: split.tensors.count is %llu but the %u files hold %llu tensors",
                          s->name, (unsigned long long)v, n, (unsigned long long)total);
    }
    return G5_OK;
}

/* Moves the single split of each part into one context, tensors in split order. */
static g5_status merge_parts(gguf_ctx **parts, uint32_t n, gguf_ctx **out, g5_error *err) {
    gguf_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return g5_fail(err, G5_ERR_NOMEM, "out of memory merging splits");
    ctx->splits = calloc(n, sizeof *ctx->splits);
    int64_t total = 0;
    for (uint32_t i = 0; i < n; i++) total += parts[i]->n_tensors;
    if (!ctx->splits || ctx_grow_tensors(ctx, total ? total : 1)) {
        gguf_free(ctx);
        return g5_fail(err, G5_ERR_NOMEM, "out of memory merging splits");
    }
    ctx->n_splits = n;
    for (uint32_t i = 0; i < n; i++) {
        gguf_ctx *p = parts[i];
        ctx->splits[i] = p->splits[0];
        memset(&p->splits[0], 0, sizeof p->splits[0]);
        for (int64_t k = 0; k < p->n_tensors; k++) {
            ctx->tensors[ctx->n_tensors] = p->tensors[k];
            ctx->tensors[ctx->n_tensors].split = i;
            ctx->name_offs[ctx->n_tensors] = p->name_offs[k];
            ctx->n_tensors++;
        }
    }
    g5_status st = index_tensors(ctx, err);
    if (st) {
        gguf_free(ctx);
        return st;
    }
    *out = ctx;
    return G5_OK;
}

g5_status gguf_open(const char *path, gguf_ctx **out, g5_error *err) {
    if (!out || !path) return g5_fail(err, G5_ERR_INVALID_ARG, "gguf_open: NULL argument");
    *out = NULL;
    gguf_ctx *first;
    g5_status st = open_one(path, NULL, 0, 0, &first, err);
    if (st) return st;

    uint32_t k = 0, n = 0;
    size_t plen = 0;
    int named = split_name(path, &k, &n, &plen);
    uint64_t count = 1;
    st = split_key(&first->splits[0], "split.count", &count, err);
    if (st && st != G5_ERR_NOT_FOUND) goto fail_first;
    int has_count = st == G5_OK;
    if (!named || n == 1) {
        if (has_count && count > 1) {
            uint64_t at = split_find_kv(&first->splits[0], "split.count")->val_off;
            st = g5_fail_at(err, G5_ERR_SPLIT, at,
                            "%s: split.count is %llu but the name is not "
                            "NAME-%05u-of-%05llu.gguf, so its siblings cannot be found",
                            path, (unsigned long long)count, 1u, (unsigned long long)count);
            goto fail_first;
        }
        if (named || has_count) { /* a one-file "set": its split keys must still agree */
            uint64_t no = 0;
            st = split_key(&first->splits[0], "split.no", &no, err);
            if (st == G5_ERR_NOT_FOUND) st = G5_OK;
            if (st) goto fail_first;
            if (no != 0 || (named && k != 1)) {
                st = g5_fail(err, G5_ERR_SPLIT, "%s: a single-file set must be split 1 of 1 "
                             "(split.no %llu)", path, (unsigned long long)no);
                goto fail_first;
            }
        }
        *out = first;
        return G5_OK;
    }
    if (k < 1 || k > n) {
        st = g5_fail(err, G5_ERR_SPLIT, "%s: split number %u is outside 1..%u", path, k, n);
        goto fail_first;
    }

    gguf_ctx **parts = calloc(n, sizeof *parts);
    char *sib = malloc(plen + 32); /* n <= 99999, but keep snprintf obviously in range */
    if (!parts || !sib) {
        free(parts);
        free(sib);
        st = g5_fail(err, G5_ERR_NOMEM, "%s: out of memory", path);
        goto fail_first;
    }
    parts[k - 1] = first;
    memcpy(sib, path, plen);
    for (uint32_t i = 0; i < n && !st; i++) {
        if (parts[i]) continue;
        snprintf(sib + plen, 32, "-%05u-of-%05u.gguf", i + 1, n);
        st = open_one(sib, path, i + 1, n, &parts[i], err);
    }
    uint64_t total = 0;
    for (uint32_t i = 0; i < n && !st; i++) total += (uint64_t)parts[i]->n_tensors;
    for (uint32_t i = 0; i < n && !st; i++)
        st = check_split(&parts[i]->splits[0], i, n, total, i == 0, err);
    if (!st) st = merge_parts(parts, n, out, err);
    for (uint32_t i = 0; i < n; i++) gguf_free(parts[i]);
    free(parts);
    free(sib);
    return st;

fail_first:
    gguf_free(first);
    return st;
}

/* ---- accessors ---------------------------------------------------------------------------- */

uint32_t gguf_get_version(const gguf_ctx *ctx) { return ctx->splits[0].version; }
uint64_t gguf_get_alignment(const gguf_ctx *ctx) { return ctx->splits[0].alignment; }
uint32_t gguf_get_n_splits(const gguf_ctx *ctx) { return ctx->n_splits; }

const char *gguf_get_split_path(const gguf_ctx *ctx, uint32_t split) {
    return split < ctx->n_splits ? ctx->splits[split].name : NULL;
}
uint64_t gguf_get_split_size(const gguf_ctx *ctx, uint32_t split) {
    return split < ctx->n_splits ? ctx->splits[split].len : 0;
}
const uint8_t *gguf_get_split_bytes(const gguf_ctx *ctx, uint32_t split) {
    return split < ctx->n_splits ? ctx->splits[split].buf : NULL;
}
uint64_t gguf_get_split_data_offset(const gguf_ctx *ctx, uint32_t split) {
    return split < ctx->n_splits ? ctx->splits[split].data_offset : 0;
}

int64_t gguf_get_n_kv(const gguf_ctx *ctx) { return ctx->splits[0].n_kv; }

static const gguf_kv *kv_at(const gguf_ctx *ctx, int64_t i) {
    return i >= 0 && i < ctx->splits[0].n_kv ? &ctx->splits[0].kvs[i] : NULL;
}

const char *gguf_get_key(const gguf_ctx *ctx, int64_t i) {
    const gguf_kv *kv = kv_at(ctx, i);
    return kv ? kv->key : NULL;
}

gguf_vtype gguf_get_kv_type(const gguf_ctx *ctx, int64_t i) {
    const gguf_kv *kv = kv_at(ctx, i);
    return kv ? kv->val.type : GGUF_VT_COUNT;
}

int64_t gguf_find_key(const gguf_ctx *ctx, const char *key) {
    if (!key) return -1;
    const gguf_kv *kv = split_find_kv(&ctx->splits[0], key);
    return kv ? kv - ctx->splits[0].kvs : -1;
}

static const gguf_kv *find_or_fail(const gguf_ctx *ctx, const char *key, g5_error *err,
                                   g5_status *st) {
    const gguf_kv *kv = key ? split_find_kv(&ctx->splits[0], key) : NULL;
    if (!kv) *st = g5_fail(err, G5_ERR_NOT_FOUND, "%s: key '%s' not found", ctx->splits[0].name,
                           key ? key : "(null)");
    return kv;
}

static g5_status wrong_type(const gguf_ctx *ctx, const gguf_kv *kv, const char *expected,
                            g5_error *err) {
    const char *actual = gguf_vtype_name(kv->val.type);
    char arr[48];
    if (kv->val.type == GGUF_VT_ARRAY) {
        snprintf(arr, sizeof arr, "array of %s", gguf_vtype_name(kv->val.v.arr.elem_type));
        actual = arr;
    }
    return g5_fail_at(err, G5_ERR_WRONG_TYPE, kv->type_off, "%s: key '%s': expected %s, found %s",
                      ctx->splits[0].name, kv->key, expected, actual);
}

g5_status gguf_get_int(const gguf_ctx *ctx, const char *key, int64_t *out, g5_error *err) {
    g5_status st = G5_OK;
    const gguf_kv *kv = find_or_fail(ctx, key, err, &st);
    if (!kv) return st;
    if (!kv_is_int(kv) && kv->val.type != GGUF_VT_BOOL)
        return wrong_type(ctx, kv, "an integer", err);
    if (kv_is_signed(kv)) {
        *out = kv->val.v.i;
    } else {
        if (kv->val.v.u > (uint64_t)INT64_MAX)
            return g5_fail_at(err, G5_ERR_OVERFLOW, kv->val_off,
                              "%s: key '%s': %llu does not fit in int64", ctx->splits[0].name,
                              kv->key, (unsigned long long)kv->val.v.u);
        *out = (int64_t)kv->val.v.u;
    }
    return G5_OK;
}

g5_status gguf_get_uint(const gguf_ctx *ctx, const char *key, uint64_t *out, g5_error *err) {
    g5_status st = G5_OK;
    const gguf_kv *kv = find_or_fail(ctx, key, err, &st);
    if (!kv) return st;
    if (!kv_is_int(kv) && kv->val.type != GGUF_VT_BOOL)
        return wrong_type(ctx, kv, "an integer", err);
    if (kv_is_signed(kv) && kv->val.v.i < 0)
        return g5_fail_at(err, G5_ERR_OVERFLOW, kv->val_off,
                          "%s: key '%s': negative value %lld where an unsigned one is needed",
                          ctx->splits[0].name, kv->key, (long long)kv->val.v.i);
    *out = kv->val.v.u;
    return G5_OK;
}

g5_status gguf_get_u32(const gguf_ctx *ctx, const char *key, uint32_t *out, g5_error *err) {
    uint64_t v;
    g5_status st = gguf_get_uint(ctx, key, &v, err);
    if (st) return st;
    if (v > UINT32_MAX) {
        const gguf_kv *kv = split_find_kv(&ctx->splits[0], key);
        return g5_fail_at(err, G5_ERR_OVERFLOW, kv->val_off,
                          "%s: key '%s': %llu does not fit in u32", ctx->splits[0].name, key,
                          (unsigned long long)v);
    }
    *out = (uint32_t)v;
    return G5_OK;
}

g5_status gguf_get_float(const gguf_ctx *ctx, const char *key, double *out, g5_error *err) {
    g5_status st = G5_OK;
    const gguf_kv *kv = find_or_fail(ctx, key, err, &st);
    if (!kv) return st;
    if (kv->val.type != GGUF_VT_FLOAT32 && kv->val.type != GGUF_VT_FLOAT64)
        return wrong_type(ctx, kv, "f32 or f64", err);
    *out = kv->val.v.f;
    return G5_OK;
}

g5_status gguf_get_bool(const gguf_ctx *ctx, const char *key, int *out, g5_error *err) {
    g5_status st = G5_OK;
    const gguf_kv *kv = find_or_fail(ctx, key, err, &st);
    if (!kv) return st;
    if (kv->val.type != GGUF_VT_BOOL) return wrong_type(ctx, kv, "bool", err);
    *out = kv->val.v.u != 0;
    return G5_OK;
}

g5_status gguf_get_str(const gguf_ctx *ctx, const char *key, const char **s, uint64_t *len,
                       g5_error *err) {
    g5_status st = G5_OK;
    const gguf_kv *kv = find_or_fail(ctx, key, err, &st);
    if (!kv) return st;
    if (kv->val.type != GGUF_VT_STRING) return wrong_type(ctx, kv, "string", err);
    *s = kv->val.v.str.s;
    *len = kv->val.v.str.len;
    return G5_OK;
}

g5_status gguf_get_arr(const gguf_ctx *ctx, const char *key, gguf_vtype *elem_type, uint64_t *n,
                       g5_error *err) {
    g5_status st = G5_OK;
    const gguf_kv *kv = find_or_fail(ctx, key, err, &st);
    if (!kv) return st;
    if (kv->val.type != GGUF_VT_ARRAY) return wrong_type(ctx, kv, "array", err);
    *elem_type = kv->val.v.arr.elem_type;
    *n = kv->val.v.arr.n;
    return G5_OK;
}

g5_status gguf_get_arr_data(const gguf_ctx *ctx, const char *key, const void **data,
                            g5_error *err) {
    g5_status st = G5_OK;
    const gguf_kv *kv = find_or_fail(ctx, key, err, &st);
    if (!kv) return st;
    if (kv->val.type != GGUF_VT_ARRAY || kv->val.v.arr.elem_type == GGUF_VT_STRING)
        return wrong_type(ctx, kv, "numeric array", err);
    *data = kv->val.v.arr.data;
    return G5_OK;
}

static void arr_str_elem(const gguf_split *s, const gguf_kv *kv, uint64_t idx, const char **str,
                         uint64_t *len) {
    uint64_t at = kv->str_offs[idx];
    *len = g5_rd_u64(s->buf + at);
    *str = (const char *)s->buf + at + 8;
}

g5_status gguf_get_arr_str(const gguf_ctx *ctx, const char *key, uint64_t idx, const char **s,
                           uint64_t *len, g5_error *err) {
    g5_status st = G5_OK;
    const gguf_kv *kv = find_or_fail(ctx, key, err, &st);
    if (!kv) return st;
    if (kv->val.type != GGUF_VT_ARRAY || kv->val.v.arr.elem_type != GGUF_VT_STRING)
        return wrong_type(ctx, kv, "array of string", err);
    if (idx >= kv->val.v.arr.n)
        return g5_fail(err, G5_ERR_BOUNDS, "%s: key '%s': index %llu is past the %llu strings",
                       ctx->splits[0].name, key, (unsigned long long)idx,
                       (unsigned long long)kv->val.v.arr.n);
    arr_str_elem(&ctx->splits[0], kv, idx, s, len);
    return G5_OK;
}

g5_status gguf_get_value(const gguf_ctx *ctx, int64_t i, gguf_value *out) {
    const gguf_kv *kv = kv_at(ctx, i);
    if (!kv || !out) return G5_ERR_INVALID_ARG;
    *out = kv->val;
    return G5_OK;
}

g5_status gguf_get_arr_str_at(const gguf_ctx *ctx, int64_t i, uint64_t idx, const char **s,
                              uint64_t *len) {
    const gguf_kv *kv = kv_at(ctx, i);
    if (!kv || !s || !len) return G5_ERR_INVALID_ARG;
    if (kv->val.type != GGUF_VT_ARRAY || kv->val.v.arr.elem_type != GGUF_VT_STRING)
        return G5_ERR_WRONG_TYPE;
    if (idx >= kv->val.v.arr.n) return G5_ERR_BOUNDS;
    arr_str_elem(&ctx->splits[0], kv, idx, s, len);
    return G5_OK;
}

g5_status gguf_get_kv_raw(const gguf_ctx *ctx, int64_t i, const uint8_t **val, uint64_t *len) {
    const gguf_kv *kv = kv_at(ctx, i);
    if (!kv || !val || !len) return G5_ERR_INVALID_ARG;
    *val = ctx->splits[0].buf + kv->val_off;
    *len = kv->val_end - kv->val_off;
    return G5_OK;
}

const uint8_t *gguf_get_kv_bytes(const gguf_ctx *ctx, uint64_t *len) {
    const gguf_split *s = &ctx->splits[0];
    if (len) *len = s->kv_end - s->kv_begin;
    return s->buf + s->kv_begin;
}

int64_t gguf_get_n_tensors(const gguf_ctx *ctx) { return ctx->n_tensors; }

const gguf_tensor *gguf_get_tensor(const gguf_ctx *ctx, int64_t i) {
    return i >= 0 && i < ctx->n_tensors ? &ctx->tensors[i] : NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_ctx *ctx, const char *name) {
    if (!name) return NULL;
    int64_t i = index_put((name_index *)&ctx->t_index, ctx->tensors, t_name_of, name, -1);
    return i >= 0 ? &ctx->tensors[i] : NULL;
}
