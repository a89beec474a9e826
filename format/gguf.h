/* GGUF reader (v2, v3) for single files and split sets (NAME-0000k-of-0000n.gguf).
 *
 * Files are mmap'ed; parsing touches only the header, metadata and tensor-info regions, never
 * tensor data. Every count, length, dimension and offset read from a file is checked.
 * All multi-byte fields are little-endian. The parser core works on (buf, len) so that it can be
 * fuzzed (gguf_parse_buffer). */
#ifndef G5_GGUF_H
#define G5_GGUF_H

#include <stdint.h>
#include <stddef.h>

#include "status.h"

#define GGUF_MAGIC "GGUF"
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4

/* Metadata value types, numbered as in the GGUF specification. */
typedef enum gguf_vtype {
    GGUF_VT_UINT8 = 0,
    GGUF_VT_INT8 = 1,
    GGUF_VT_UINT16 = 2,
    GGUF_VT_INT16 = 3,
    GGUF_VT_UINT32 = 4,
    GGUF_VT_INT32 = 5,
    GGUF_VT_FLOAT32 = 6,
    GGUF_VT_BOOL = 7,
    GGUF_VT_STRING = 8,
    GGUF_VT_ARRAY = 9,
    GGUF_VT_UINT64 = 10,
    GGUF_VT_INT64 = 11,
    GGUF_VT_FLOAT64 = 12,
    GGUF_VT_COUNT
} gguf_vtype;

const char *gguf_vtype_name(gguf_vtype t); /* "u32", "string", ...; "?" if unknown */

typedef struct gguf_ctx gguf_ctx; /* one GGUF file or a whole split set, opaque */

/* Read-only description of one tensor. Pointers stay valid until gguf_free(). */
typedef struct gguf_tensor {
    const char *name;      /* NUL-terminated copy */
    uint32_t type;         /* ggml type id (see quant.h) */
    uint32_t n_dims;       /* 1..4 */
    uint64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the contiguous dimension; unused dims are 1 */
    uint64_t n_elems;
    uint64_t nbytes;       /* from type and shape */
    uint32_t split;        /* index of the split file holding it (0 for a single file) */
    uint64_t offset;       /* relative to that split's data section, as stored in the file */
    uint64_t file_offset;  /* absolute byte offset in that split file */
    const uint8_t *data;   /* into the mmap (or the caller's buffer), nbytes long */
} gguf_tensor;

/* Parses one GGUF image held in memory. The buffer must outlive the context (it is not copied).
 * `name` is used in error messages. Split metadata is read but siblings are not opened. */
g5_status gguf_parse_buffer(const void *buf, size_t len, const char *name, gguf_ctx **out,
                            g5_error *err);

/* Opens a file; if its name matches NAME-%05d-of-%05d.gguf (or it carries split.count > 1) all
 * siblings are opened and checked (split.count, split.no, split.tensors.count). Metadata comes
 * from split 0; tensors are gathered from every split in split order.
 * A file with split.count > 1 whose name does not follow the pattern is G5_ERR_SPLIT (its
 * siblings cannot be located); an absent sibling is G5_ERR_MISSING_SPLIT naming its path. */
g5_status gguf_open(const char *path, gguf_ctx **out, g5_error *err);

void gguf_free(gguf_ctx *ctx); /* accepts NULL */

/* ---- file-level facts ---- */
uint32_t gguf_get_version(const gguf_ctx *ctx);
uint64_t gguf_get_alignment(const gguf_ctx *ctx);
uint32_t gguf_get_n_splits(const gguf_ctx *ctx);
const char *gguf_get_split_path(const gguf_ctx *ctx, uint32_t split); /* name for buffers */
uint64_t gguf_get_split_size(const gguf_ctx *ctx, uint32_t split);     /* file size in bytes */
const uint8_t *gguf_get_split_bytes(const gguf_ctx *ctx, uint32_t split); /* whole mapped file */
/* Byte offset where the split's data section starts (end of header + padding): the "header
 * region" [0, data_offset) is what identifies a source file cheaply. Never past the end of the
 * file (a tensor-less image without its final padding has data_offset == its size). */
uint64_t gguf_get_split_data_offset(const gguf_ctx *ctx, uint32_t split);

/* ---- metadata (of split 0) ---- */
int64_t gguf_get_n_kv(const gguf_ctx *ctx);
const char *gguf_get_key(const gguf_ctx *ctx, int64_t i);
gguf_vtype gguf_get_kv_type(const gguf_ctx *ctx, int64_t i);
int64_t gguf_find_key(const gguf_ctx *ctx, const char *key); /* -1 if absent */

/* Typed getters by key. Missing key -> G5_ERR_NOT_FOUND; a value of another type ->
 * G5_ERR_WRONG_TYPE with a message naming the key, the expected and the actual type.
 * gguf_get_int accepts any integer type (and bool) whose value fits in int64_t;
 * gguf_get_uint any integer type with a non-negative value; gguf_get_float F32 or F64.
 * An integer of the right kind whose value does not fit the requested type is G5_ERR_OVERFLOW;
 * gguf_get_arr_str with idx >= n is G5_ERR_BOUNDS. */
g5_status gguf_get_int(const gguf_ctx *ctx, const char *key, int64_t *out, g5_error *err);
g5_status gguf_get_uint(const gguf_ctx *ctx, const char *key, uint64_t *out, g5_error *err);
g5_status gguf_get_u32(const gguf_ctx *ctx, const char *key, uint32_t *out, g5_error *err);
g5_status gguf_get_float(const gguf_ctx *ctx, const char *key, double *out, g5_error *err);
g5_status gguf_get_bool(const gguf_ctx *ctx, const char *key, int *out, g5_error *err);
/* The string is NOT NUL-terminated in general; *len is its byte length. */
g5_status gguf_get_str(const gguf_ctx *ctx, const char *key, const char **s, uint64_t *len,
                       g5_error *err);
/* Arrays: element type and count. Nested arrays are refused at parse time. */
g5_status gguf_get_arr(const gguf_ctx *ctx, const char *key, gguf_vtype *elem_type, uint64_t *n,
                       g5_error *err);
/* Raw little-endian element data of a non-string array (n * element size bytes). */
g5_status gguf_get_arr_data(const gguf_ctx *ctx, const char *key, const void **data,
                            g5_error *err);
/* Element idx of an array of strings. */
g5_status gguf_get_arr_str(const gguf_ctx *ctx, const char *key, uint64_t idx, const char **s,
                           uint64_t *len, g5_error *err);

/* The same, by kv index (for iteration). Scalars are returned through the most general type. */
typedef struct gguf_value {
    gguf_vtype type;
    union {
        uint64_t u;   /* UINT8/16/32/64, BOOL */
        int64_t i;    /* INT8/16/32/64 */
        double f;     /* FLOAT32/64 */
        struct { const char *s; uint64_t len; } str;
        struct { gguf_vtype elem_type; uint64_t n; const void *data; } arr; /* data: raw LE
               elements for numeric arrays; for string arrays use gguf_get_arr_str_at */
    } v;
} gguf_value;
g5_status gguf_get_value(const gguf_ctx *ctx, int64_t i, gguf_value *out);
/* G5_ERR_INVALID_ARG (bad i), G5_ERR_WRONG_TYPE (not a string array), G5_ERR_BOUNDS (idx). */
g5_status gguf_get_arr_str_at(const gguf_ctx *ctx, int64_t i, uint64_t idx, const char **s,
                              uint64_t *len);

/* Raw bytes of kv pair i's value exactly as stored, after its type field (for a string: the u64
 * length and the bytes; for an array: element type, count and elements). G5_ERR_INVALID_ARG if
 * i is out of range. Used to copy a pair verbatim (gguf_writer_copy_kv). */
g5_status gguf_get_kv_raw(const gguf_ctx *ctx, int64_t i, const uint8_t **val, uint64_t *len);

/* Raw bytes of the metadata section of split 0 (the kv pairs exactly as stored, after the
 * header's counts), so a blob can carry all metadata verbatim. */
const uint8_t *gguf_get_kv_bytes(const gguf_ctx *ctx, uint64_t *len);

/* ---- tensors (all splits) ---- */
int64_t gguf_get_n_tensors(const gguf_ctx *ctx);
const gguf_tensor *gguf_get_tensor(const gguf_ctx *ctx, int64_t i); /* NULL if out of range */
const gguf_tensor *gguf_find_tensor(const gguf_ctx *ctx, const char *name); /* NULL if absent */

#endif
