/* Private to format/blob*.c: the on-disk layout of blob files (specs/blob-format.md) and small
 * helpers shared by the reader and the writer. */
#ifndef G5_BLOB_INT_H
#define G5_BLOB_INT_H

#include <string.h>
#include <xxhash.h>

#include "blob.h"
#include "quant.h"

_Static_assert(sizeof(XXH128_canonical_t) == 16, "canonical XXH3-128 is 16 bytes");

/* Header field offsets (specs/blob-format.md, "Header"). */
enum {
    H_MAGIC = 0, H_VERSION = 8, H_HSIZE = 12, H_FLAGS = 16, H_TP = 20, H_RANK = 24,
    H_PLACE = 28, H_CONV = 32, H_KVB = 36, H_SETID = 40, H_NSRC = 56, H_RES0 = 60,
    H_NTENS = 64, H_CHUNK = 72, H_NCHUNK = 80, H_SRC_OFF = 88, H_SRC_SIZE = 96,
    H_TAB_OFF = 104, H_TAB_SIZE = 112, H_CHK_OFF = 120, H_CHK_SIZE = 128, H_STR_OFF = 136,
    H_STR_SIZE = 144, H_META_OFF = 152, H_META_SIZE = 160, H_META_RAW = 168, H_DATA_OFF = 176,
    H_DATA_SIZE = 184, H_FILE_SIZE = 192, H_HASH_SRC = 200, H_HASH_TAB = 216, H_HASH_CHK = 232,
    H_HASH_STR = 248, H_HASH_META = 264, H_RES1 = 280, H_HASH_HDR = 304, H_END = 320
};
_Static_assert(H_END == BLOB_HEADER_SIZE, "header layout");

/* Source entry offsets. */
enum { S_SPLIT = 0, S_NAMELEN = 4, S_NAMEOFF = 8, S_FSIZE = 16, S_HSIZE = 24, S_HASH = 32,
       S_SAMPLE = 48, S_END = 64 };
_Static_assert(S_END == BLOB_SOURCE_ENTRY_SIZE, "source entry layout");

/* Tensor entry offsets. */
enum { T_NAMEOFF = 0, T_NAMELEN = 8, T_TYPE = 12, T_NDIMS = 16, T_AXIS = 20, T_SINDEX = 24,
       T_SCOUNT = 28, T_NE = 32, T_NEG = 64, T_OFF = 96, T_SIZE = 104, T_FLAGS = 112,
       T_RES = 116, T_HASH = 128, T_EHASH = 144, T_END = 160 };
_Static_assert(T_END == BLOB_TENSOR_ENTRY_SIZE, "tensor entry layout");

/* Set record offsets. */
enum { R_MAGIC = 0, R_VERSION = 8, R_TP = 12, R_PLACE = 16, R_CONV = 20, R_SETID = 24,
       R_RES = 40, R_HASH = 48, R_END = 64,
       RE_RANK = 0, RE_RES0 = 4, RE_FSIZE = 8, RE_HASH = 16, RE_RES1 = 32, RE_END = 64 };
_Static_assert(R_END == BLOB_SET_HEADER_SIZE && RE_END == BLOB_SET_ENTRY_SIZE, "record layout");

#define MAX_SOURCES 10000u
#define MAX_TENSORS (1ull << 24)
#define MAX_TP 4096u
#define MAX_META_RAW (1ull << 32)

static inline void state_digest(XXH3_state_t *st, uint8_t out[16]) {
    XXH128_hash_t h = XXH3_128bits_digest(st);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, h);
    memcpy(out, c.digest, 16);
}

static inline uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

static inline int all_zero(const uint8_t *p, uint64_t n) {
    for (uint64_t i = 0; i < n; i++)
        if (p[i]) return 0;
    return 1;
}

/* Header hash: XXH3-128 of the header's first H_HASH_HDR bytes. */
static inline void header_hash(const uint8_t *hdr, uint8_t out[16]) { blob_hash128(hdr, H_HASH_HDR, out); }

/* Entry hash: XXH3-128 of the entry's first T_EHASH bytes. */
static inline void entry_hash(const uint8_t *e, uint8_t out[16]) { blob_hash128(e, T_EHASH, out); }

/* Size in bytes of a tensor of `type` and shape ne. */
static inline g5_status tensor_bytes(uint32_t type, const uint64_t ne[4], uint64_t *out) {
    uint64_t row, n = 1;
    g5_status st = quant_row_bytes(type, ne[0], &row);
    if (st) return st;
    if (g5_mul_u64(ne[1], ne[2], &n) || g5_mul_u64(n, ne[3], &n) || g5_mul_u64(n, row, out))
        return G5_ERR_OVERFLOW;
    return G5_OK;
}

static inline const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* fsync of the directory holding path (after a rename). */
g5_status blob_i_fsync_dir_of(const char *path, g5_error *err);

#endif
