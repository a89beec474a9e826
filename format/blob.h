/* Per-rank blob files (specs/blob-format.md, version 1) and blob sets.
 *
 * A blob carries everything one tensor-parallel rank needs, so the runtime never opens the GGUF:
 * all GGUF metadata (tokenizer included) as an embedded tensor-less GGUF image (optionally
 * zstd-compressed) readable through the gguf.h API, the plan facts (TP degree, rank, placement,
 * set id, converter version, kv_b storage type), the source identity (every split's size, the
 * XXH3-128 of its header region and of 64 samples of its data), a tensor table (name, type, local and global shape, split
 * axis/index/count, offset, size, XXH3-128) and the tensor data, every tensor 4096-aligned in one
 * contiguous region at the end of the file, with an XXH3-128 per 64 MiB chunk of that region.
 *
 * Integrity is a hash tree: the header's own hash covers the header, which holds the hash of
 * every index section (sources, table, chunk hashes, strings, metadata); every table entry
 * carries its own hash too (so a damaged entry is named), and the chunk hashes cover every data
 * byte. Hashes are XXH3-128 stored in canonical form (big-endian, as xxhsum -H2 prints them).
 *
 * A blob set is OUTDIR/rank-%05u-of-%05u.g5b for ranks 0..T-1 plus the set record
 * OUTDIR/blobset.g5s, written last by the converter: it lists every rank's size and header hash.
 *
 * Typical runtime use:
 *     blob_set *set; g5_error e;
 *     if (blob_set_open(dir, &set, &e)) { report e.msg; }
 *     const blob *b = blob_set_rank(set, my_rank);
 *     const gguf_ctx *meta = blob_get_meta(b);               // hyperparameters, tokenizer
 *     const blob_tensor *t = blob_find_tensor(b, "blk.0.attn_kv_b.weight");
 *     // t->data, t->size, t->type, t->ne (local), t->ne_global, t->split_axis ...
 *     blob_set_free(set);
 * blob_open validates the index completely (every hash of the index and every structural field);
 * tensor data is checked only by blob_verify_data / blob_verify_tensor (it can be hundreds of GB).
 */
#ifndef G5_BLOB_H
#define G5_BLOB_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "status.h"

#define BLOB_MAGIC "GLM5BLOB"        /* 8 bytes, no terminator */
#define BLOB_VERSION 1
#define BLOB_HEADER_SIZE 320
#define BLOB_SOURCE_ENTRY_SIZE 64
#define BLOB_TENSOR_ENTRY_SIZE 160
#define BLOB_CHUNK_ENTRY_SIZE 16
#define BLOB_DATA_ALIGN 4096         /* data region start and every tensor offset */
#define BLOB_DEFAULT_CHUNK_SIZE (64ull << 20)
#define BLOB_AXIS_NONE 0xFFFFFFFFu   /* split_axis of a replicated tensor */
#define BLOB_MAX_NAME 255

#define BLOB_FLAG_META_ZSTD 1u       /* header flags: metadata section is one zstd frame */
#define BLOB_TFLAG_DERIVED 1u        /* tensor flags: computed (kv_b), not a byte copy */

#define BLOB_SET_MAGIC "G5BLOBST"
#define BLOB_SET_VERSION 1
#define BLOB_SET_RECORD "blobset.g5s"
#define BLOB_SET_HEADER_SIZE 64
#define BLOB_SET_ENTRY_SIZE 64

typedef enum blob_placement {
    BLOB_PLACE_TP = 0, /* routed experts split inside every expert (like every other tensor) */
    BLOB_PLACE_EP = 1  /* routed experts whole, E/T per rank */
} blob_placement;

const char *blob_placement_name(uint32_t p); /* "tp", "ep", "?" */

/* ---- hashing helpers ---- */

/* XXH3-128 of len bytes in canonical (big-endian) form. */
void blob_hash128(const void *data, size_t len, uint8_t out[16]);
/* 32 lowercase hex digits + NUL. */
void blob_hash_hex(const uint8_t h[16], char out[33]);

/* The file name of rank r of T: "rank-%05u-of-%05u.g5b" (cap >= 32). */
void blob_rank_filename(uint32_t rank, uint32_t tp, char *out, size_t cap);

/* ---- reading ---- */

typedef struct blob blob; /* one opened, index-validated blob; opaque */

typedef struct blob_info {
    uint32_t version;
    uint32_t flags;
    uint32_t tp, rank;
    uint32_t placement;          /* blob_placement */
    uint32_t converter_version;  /* (major << 16) | (minor << 8) | patch */
    uint32_t kv_b_type;          /* ggml type of the attn_kv_b tensors */
    uint8_t set_id[16];          /* shared by every rank of one conversion */
    uint32_t n_sources;
    uint64_t n_tensors;
    uint64_t chunk_size, n_chunks;
    uint64_t meta_offset, meta_size, meta_raw_size;
    uint64_t data_offset, data_size, file_size;
    uint8_t header_hash[16];     /* identifies the whole file (hash tree root) */
    uint8_t meta_hash[16];
} blob_info;

typedef struct blob_source {
    uint32_t split;              /* index in the split set (0 for a single file) */
    const char *name;            /* the split's file name (no directory) */
    uint64_t file_size;
    uint64_t header_size;        /* the split's data offset: the region [0, header_size) hashed */
    uint8_t header_hash[16];     /* XXH3-128 of that region */
    uint8_t sample_hash[16];     /* XXH3-128 of 64 evenly spaced 4 KiB samples of its data */
} blob_source;

typedef struct blob_tensor {
    const char *name;            /* NUL-terminated, valid while the blob is open */
    uint32_t type;               /* ggml type id (quant.h) */
    uint32_t n_dims;             /* 1..4 */
    uint64_t ne[4];              /* local (this rank's) shape, ggml order; unused dims 1 */
    uint64_t ne_global[4];       /* the whole tensor's shape */
    uint32_t split_axis;         /* 0..3, or BLOB_AXIS_NONE */
    uint32_t split_index;        /* this slice's index along the axis: it covers
                                  * [split_index * ne[axis], (split_index + 1) * ne[axis]) */
    uint32_t split_count;        /* ne_global[axis] / ne[axis]; 1 when replicated */
    uint32_t flags;              /* BLOB_TFLAG_* */
    uint64_t offset;             /* absolute file offset (4096-aligned) */
    uint64_t size;               /* bytes */
    uint8_t hash[16];            /* XXH3-128 of the size bytes */
    const uint8_t *data;         /* into the mapped file (or the parsed buffer) */
} blob_tensor;

#define BLOB_PARSE_NO_HASH 1u    /* skip hash checks (fuzzing the structural checks) */

/* Parses and validates a blob image in memory (the whole file). The buffer must outlive the
 * blob. `name` is used in messages. Checks, in order: magic, version, header size, header hash,
 * every section's bounds/order/alignment and hash, zero padding between sections, each table
 * entry's hash and fields (name, type, shapes, split consistency, size = type x shape, offsets
 * aligned, ordered and in bounds), unique names, source entries, chunk count, the metadata
 * (decompressed and parsed as GGUF) and file size = data_offset + data_size. */
g5_status blob_parse_buffer(const void *buf, size_t len, const char *name, uint32_t flags,
                            blob **out, g5_error *err);
/* Maps the file read-only and parses it. */
g5_status blob_open(const char *path, blob **out, g5_error *err);
void blob_free(blob *b); /* accepts NULL */

const blob_info *blob_get_info(const blob *b);
const char *blob_get_path(const blob *b);     /* the path or buffer name given */
const uint8_t *blob_get_bytes(const blob *b, uint64_t *len); /* the whole image */
const gguf_ctx *blob_get_meta(const blob *b); /* all GGUF metadata of the source (no tensors) */
uint32_t blob_n_sources(const blob *b);
const blob_source *blob_get_source(const blob *b, uint32_t i); /* NULL if out of range */
uint64_t blob_n_tensors(const blob *b);
const blob_tensor *blob_get_tensor(const blob *b, uint64_t i); /* NULL if out of range */
const blob_tensor *blob_find_tensor(const blob *b, const char *name); /* NULL if absent */
int64_t blob_find_tensor_index(const blob *b, const char *name);     /* -1 if absent */

/* Chunk i covers data bytes [i * chunk_size, min((i+1) * chunk_size, data_size)) of the data
 * region, i.e. file bytes from data_offset + i * chunk_size. */
const uint8_t *blob_get_chunk_hash(const blob *b, uint64_t i); /* NULL if out of range */
/* "chunk 3 (file bytes 201330688..268439552, tensors 'a' .. 'b')" into buf. */
void blob_describe_chunk(const blob *b, uint64_t i, char *buf, size_t cap);

/* Checks one tensor's data hash (single-threaded). G5_ERR_CHECKSUM names tensor and offset. */
g5_status blob_verify_tensor(const blob *b, uint64_t i, g5_error *err);

/* ---- data verification, parallel over any number of blobs ---- */

typedef struct blob_verify_stats {
    uint64_t bytes;              /* data bytes hashed */
    uint64_t n_chunks_bad;
    uint64_t n_tensors_bad;
    uint64_t *bad_chunks;        /* n_chunks_bad indexes, ascending (malloc'ed) */
    uint64_t *bad_tensors;       /* n_tensors_bad indexes, ascending (malloc'ed) */
} blob_verify_stats;

void blob_verify_stats_clear(blob_verify_stats *s); /* frees the arrays, zeroes */

typedef void (*blob_progress_fn)(void *user, uint64_t bytes_done, uint64_t bytes_total);

/* Hashes every data byte of every blob once, with `jobs` threads (0 = online CPUs), checking
 * every chunk hash and every tensor hash. stats: n_blobs entries (filled). Returns G5_OK if all
 * hold, G5_ERR_CHECKSUM otherwise with err naming the first bad tensor (or chunk) of the first
 * bad blob and its byte offset; G5_ERR_NOMEM / G5_ERR_INTERNAL on resource failures. progress
 * (may be NULL) is called from the calling thread about every interval_s seconds. */
g5_status blob_verify_data(const blob *const *blobs, uint32_t n_blobs, uint32_t jobs,
                           blob_verify_stats *stats, blob_progress_fn progress, void *user,
                           double interval_s, g5_error *err);

/* ---- writing (streaming) ---- */

typedef struct blob_writer blob_writer;

typedef struct blob_writer_tensor {
    const char *name;
    uint32_t type, n_dims;
    uint64_t ne[4], ne_global[4];
    uint32_t split_axis, split_index, split_count;
    uint32_t flags;
} blob_writer_tensor;

typedef struct blob_source_desc {
    const char *name;            /* file name (directory stripped by the writer) */
    uint64_t file_size, header_size;
    uint8_t header_hash[16];
    uint8_t sample_hash[16];     /* see blob_source */
} blob_source_desc;

typedef struct blob_writer_params {
    uint32_t tp, rank, placement, converter_version, kv_b_type;
    uint8_t set_id[16];
    const void *meta;            /* tensor-less GGUF image of the metadata */
    uint64_t meta_len;
    int meta_zstd_level;         /* 0: store raw; else compress (kept only if smaller) */
    uint32_t n_sources;
    const blob_source_desc *sources;
    uint64_t chunk_size;         /* 0: BLOB_DEFAULT_CHUNK_SIZE; else a power of two >= 4096 */
} blob_writer_params;

/* Lays the file out (tensor sizes follow from type and local shape), opens PATH.tmp and
 * positions it at the data region. Tensor data then follows in table order through
 * blob_writer_write; padding is inserted automatically. */
g5_status blob_writer_create(const char *path, const blob_writer_params *p,
                             const blob_writer_tensor *tensors, uint64_t n_tensors,
                             blob_writer **out, g5_error *err);
/* Appends data to the current tensor, moving to the next when one is full. Hashes as it goes. */
g5_status blob_writer_write(blob_writer *w, const void *data, uint64_t len, g5_error *err);
/* Index of the tensor the next byte goes to (n_tensors when all are complete). */
uint64_t blob_writer_current(const blob_writer *w);
uint64_t blob_writer_file_bytes(const blob_writer *w); /* bytes written to the file so far */
/* Layout facts known at creation: data offset of tensor i (relative to the data region), total
 * file size. */
uint64_t blob_writer_tensor_offset(const blob_writer *w, uint64_t i);
uint64_t blob_writer_file_size(const blob_writer *w);
/* Checks every tensor is complete, writes the index (hashes), fsyncs, renames PATH.tmp to PATH
 * and fsyncs the directory. header_hash (may be NULL) receives the file's header hash. */
g5_status blob_writer_finish(blob_writer *w, uint8_t header_hash[16], g5_error *err);
/* Frees the writer; an unfinished PATH.tmp is removed unless keep_tmp (crash simulation). */
void blob_writer_abort(blob_writer *w, int keep_tmp);
void blob_writer_free(blob_writer *w); /* = blob_writer_abort(w, 0); accepts NULL */

/* ---- sets ---- */

typedef struct blob_set_entry {
    uint64_t file_size;
    uint8_t header_hash[16];
} blob_set_entry;

typedef struct blob_set_record {
    uint32_t version, tp, placement, converter_version;
    uint8_t set_id[16];
    blob_set_entry *ranks;       /* tp entries (malloc'ed) */
} blob_set_record;

void blob_set_record_clear(blob_set_record *r);
/* Parses and validates a set record image (hash, magic, version, size = 64 + 64 * tp). */
g5_status blob_set_record_parse(const void *buf, size_t len, const char *name,
                                blob_set_record *out, g5_error *err);
g5_status blob_set_record_read(const char *dir, blob_set_record *out, g5_error *err);
/* Writes DIR/blobset.g5s (tmp, fsync, rename, fsync dir). */
g5_status blob_set_record_write(const char *dir, const blob_set_record *r, g5_error *err);
/* Serializes a record (malloc'ed image, for tests). */
g5_status blob_set_record_bytes(const blob_set_record *r, uint8_t **buf, uint64_t *len);

/* Checks that b is rank `rank` of the set the record describes: header tp, rank, placement, set
 * id, file size and header hash. G5_ERR_MISMATCH naming the field otherwise. */
g5_status blob_check_rank(const blob *b, const blob_set_record *rec, uint32_t rank,
                          g5_error *err);
/* Checks that two ranks of one set agree: set id, tp, placement, converter version, kv_b type,
 * sources, metadata, and tensor list (names, types, global shapes, split axes and counts,
 * offsets and sizes). G5_ERR_MISMATCH naming the first difference. */
g5_status blob_check_compatible(const blob *a, const blob *b, g5_error *err);

typedef struct blob_set blob_set;

/* Opens DIR's set: the record, then every rank 0..T-1 (blob_open), each checked against the
 * record and against rank 0. Any missing, foreign or inconsistent rank fails the open. */
g5_status blob_set_open(const char *dir, blob_set **out, g5_error *err);
/* Opens only ranks [first, first + count) (count >= 1) with the same checks (record, rank,
 * compatibility with the first of them): a process of a multi-process run opens its own ranks'
 * files, and the other ranks' files need not exist on its node. G5_ERR_INVALID_ARG when the
 * range is not inside the set. */
g5_status blob_set_open_ranks(const char *dir, uint32_t first, uint32_t count, blob_set **out,
                              g5_error *err);
void blob_set_free(blob_set *s); /* accepts NULL */
uint32_t blob_set_tp(const blob_set *s);
const blob_set_record *blob_set_get_record(const blob_set *s);
/* NULL if out of range or not opened (blob_set_open_ranks). */
const blob *blob_set_rank(const blob_set *s, uint32_t rank);
uint32_t blob_set_first(const blob_set *s); /* the ranks opened: [first, first + count) */
uint32_t blob_set_count(const blob_set *s);

#endif
