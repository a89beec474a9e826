/* glm5-shard: the one status enum, and an error record that names the place.
 *
 * Library code returns a g5_status and, where the caller passed a g5_error, fills it with a
 * human-readable message naming the file, tensor or field and (when it applies) the byte offset.
 * Only main() turns a status into an exit code and prints the message. */
#ifndef G5_STATUS_H
#define G5_STATUS_H

#include <stdint.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum g5_status {
    G5_OK = 0,
    G5_ERR_INVALID_ARG,     /* caller passed something impossible */
    G5_ERR_NOMEM,
    G5_ERR_IO,              /* open/read/write/fsync/rename/mmap failed (errno in message) */
    G5_ERR_TRUNCATED,       /* file or buffer ends before a field it must hold */
    G5_ERR_BAD_MAGIC,
    G5_ERR_VERSION,         /* unsupported format version */
    G5_ERR_COUNT,           /* absurd count (tensors, kv pairs, array length) */
    G5_ERR_OVERFLOW,        /* a size or offset product/sum overflows */
    G5_ERR_BOUNDS,          /* offset/size past the end of the file or buffer */
    G5_ERR_ALIGN,           /* misaligned offset, or a row not a multiple of the block size */
    G5_ERR_OVERLAP,         /* two tensors' bytes overlap */
    G5_ERR_DUPLICATE,       /* duplicate key or tensor name */
    G5_ERR_NDIMS,           /* n_dims outside 1..4 or a zero/negative dimension */
    G5_ERR_VALUE_TYPE,      /* unknown metadata value type, or a nested array we refuse */
    G5_ERR_TENSOR_TYPE,     /* unknown ggml type id */
    G5_ERR_UNSUPPORTED,     /* known but unsupported (ggml type, feature) */
    G5_ERR_SIZE,            /* byte size inconsistent with type and shape */
    G5_ERR_SPLIT,           /* split.* metadata inconsistent across a split set */
    G5_ERR_MISSING_SPLIT,   /* a sibling file of a split set is absent */
    G5_ERR_NOT_FOUND,       /* key or tensor not present */
    G5_ERR_WRONG_TYPE,      /* typed getter called on a value of another type */
    G5_ERR_CHECKSUM,        /* stored and computed hash differ */
    G5_ERR_FORMAT,          /* structurally invalid content not covered above */
    G5_ERR_SHARDING,        /* a tensor cannot be sliced as asked (alignment, divisibility) */
    G5_ERR_MODEL,           /* model hyperparameters or tensor set inconsistent */
    G5_ERR_MISMATCH,        /* blobs from another rank/source/plan */
    G5_ERR_COMPRESS,        /* zstd failure */
    G5_ERR_EXISTS,          /* the output place holds something we refuse to replace */
    G5_ERR_INTERNAL,
    G5_STATUS_COUNT
} g5_status;

/* A short fixed name for the status, e.g. "truncated". Never NULL. */
const char *g5_strerror(g5_status s);

typedef struct g5_error {
    g5_status status;
    int has_offset;        /* 1 if offset names a byte position in `msg`'s file */
    uint64_t offset;
    char msg[1024];        /* "FILE: tensor 'blk.0.x': ..." */
} g5_error;

/* Records a formatted message in err (if non-NULL) and returns s. Use as
 * `return g5_fail(err, G5_ERR_TRUNCATED, "%s: ...", path);` */
g5_status g5_fail(g5_error *err, g5_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Same, with a byte offset that is appended to the message ("at byte N"). */
g5_status g5_fail_at(g5_error *err, g5_status s, uint64_t offset, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Prepends "prefix: " to an existing message (for adding a file name at a higher level). */
void g5_error_prefix(g5_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void g5_error_clear(g5_error *err);

/* Checked arithmetic on sizes that come from files. Return 0 on success, 1 on overflow. */
static inline int g5_mul_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_mul_overflow(a, b, out);
}
static inline int g5_add_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_add_overflow(a, b, out);
}

/* Little-endian field helpers for on-disk structures (host may be any endianness). */
static inline uint16_t g5_rd_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t g5_rd_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t g5_rd_u64(const uint8_t *p) {
    return (uint64_t)g5_rd_u32(p) | ((uint64_t)g5_rd_u32(p + 4) << 32);
}
static inline void g5_wr_u16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void g5_wr_u32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}
static inline void g5_wr_u64(uint8_t *p, uint64_t v) { g5_wr_u32(p, (uint32_t)v); g5_wr_u32(p + 4, (uint32_t)(v >> 32)); }

#ifdef __cplusplus
}
#endif

#endif
