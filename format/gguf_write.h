/* GGUF writer: builds a GGUF (v3 by default) image from key/value pairs and tensors.
 * Used by `synth`, by tests (including deliberately corrupt files), and by the blob writer,
 * which embeds the model's metadata as a tensor-less GGUF image.
 *
 * Tensor data is either given up front (a pointer that must stay valid until written) or
 * produced on demand by a callback while the file is streamed, so multi-GB files never sit in
 * memory. Files are written to PATH.tmp, fsynced and renamed. */
#ifndef G5_GGUF_WRITE_H
#define G5_GGUF_WRITE_H

#include "gguf.h"

typedef struct gguf_writer gguf_writer;

gguf_writer *gguf_writer_create(void); /* version 3, alignment 32; NULL on OOM */
void gguf_writer_free(gguf_writer *w);  /* accepts NULL */
void gguf_writer_set_version(gguf_writer *w, uint32_t version);     /* 2 or 3 (tests: any) */
/* Alignment of tensor data; also written as general.alignment when not 32. */
void gguf_writer_set_alignment(gguf_writer *w, uint64_t alignment);

/* Key/value pairs, in insertion order. A repeated key replaces the earlier value. */
g5_status gguf_writer_set_u8(gguf_writer *w, const char *key, uint8_t v);
g5_status gguf_writer_set_i8(gguf_writer *w, const char *key, int8_t v);
g5_status gguf_writer_set_u16(gguf_writer *w, const char *key, uint16_t v);
g5_status gguf_writer_set_i16(gguf_writer *w, const char *key, int16_t v);
g5_status gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v);
g5_status gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v);
g5_status gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v);
g5_status gguf_writer_set_i64(gguf_writer *w, const char *key, int64_t v);
g5_status gguf_writer_set_f32(gguf_writer *w, const char *key, float v);
g5_status gguf_writer_set_f64(gguf_writer *w, const char *key, double v);
g5_status gguf_writer_set_bool(gguf_writer *w, const char *key, int v);
g5_status gguf_writer_set_str(gguf_writer *w, const char *key, const char *s, uint64_t len);
/* Numeric array: n elements of elem_type, raw little-endian bytes copied from data. */
g5_status gguf_writer_set_arr(gguf_writer *w, const char *key, gguf_vtype elem_type,
                              const void *data, uint64_t n);
g5_status gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *strs,
                                  const uint64_t *lens, uint64_t n);
/* Copies kv pair i of src (any type, arrays of strings included). */
g5_status gguf_writer_copy_kv(gguf_writer *w, const gguf_ctx *src, int64_t i);
g5_status gguf_writer_remove_key(gguf_writer *w, const char *key); /* NOT_FOUND if absent */

/* Adds a tensor; nbytes is computed from type and shape (the type must be known). data may be
 * NULL when the file is written with gguf_writer_write_file_cb. Returns the tensor index. */
g5_status gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t type,
                                 uint32_t n_dims, const uint64_t *ne, const void *data,
                                 int64_t *index);
int64_t gguf_writer_n_tensors(const gguf_writer *w);
uint64_t gguf_writer_tensor_nbytes(const gguf_writer *w, int64_t i);

/* Serializes header, metadata, tensor infos and padding up to the data section (malloc'ed, the
 * caller frees). *data_size receives the size of the data section that must follow. */
g5_status gguf_writer_header_bytes(const gguf_writer *w, uint8_t **buf, uint64_t *len,
                                   uint64_t *data_size);

/* Fills dst (nbytes) with tensor i's data. Return G5_OK or an error that aborts the write. */
typedef g5_status (*gguf_fill_fn)(void *user, int64_t i, uint8_t *dst, uint64_t nbytes);

/* Test hook: a write that would take the file past `bytes` fails with ENOSPC (0: off), as a
 * full disk would; the temporary file is removed as on any write error. */
void gguf_writer_set_test_fail_after(gguf_writer *w, uint64_t bytes);

/* Writes the whole file: PATH.tmp, fsync, rename. Tensors without data come from fill. */
g5_status gguf_writer_write_file(const gguf_writer *w, const char *path, gguf_fill_fn fill,
                                 void *user, g5_error *err);
/* Whole image in memory (tests, fuzz corpora). */
g5_status gguf_writer_write_buffer(const gguf_writer *w, uint8_t **buf, uint64_t *len);

#endif
