/* `glm5-shard inspect`: a report on a GGUF (metadata, tensor table, totals by type) with, for
 * arch glm-dsa, an architecture audit against GLM-5's expected tensor set; and a tensor dump to
 * float32.
 *
 * The report is built once as a JSON document (jansson) and rendered as text from it, so the
 * text and --json outputs always carry the same facts. Document layout (stable, for scripts):
 *   kind "gguf", file, version, alignment, n_splits, splits[{path, size, data_offset}],
 *   n_kv, metadata[{key, type, value} | {key, type: "array", elem_type, count, values,
 *                   truncated}],
 *   n_tensors, tensors[{name, type, type_id, shape[], n_elems, bytes, split, offset,
 *                       file_offset, role, group}],
 *   total_bytes, totals_by_type[{type, count, bytes}],
 *   audit{architecture, applicable, passed, hparams{...} | null, problems[], unknown[],
 *         missing[], shape_mismatch[{name, expected[], actual[]}],
 *         unsupported_type[{name, type, reason}], groups[{group, count, bytes}]}
 * audit.passed is true for other architectures (nothing to audit: applicable = false). */
#ifndef G5_INSPECT_H
#define G5_INSPECT_H

#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "format/blob.h"
#include "format/gguf.h"
#include "format/status.h"

typedef struct inspect_opts {
    uint32_t max_array;   /* array elements shown (JSON and text); default 8 */
    uint32_t max_string;  /* text output: string values cut after this many bytes; default 160 */
} inspect_opts;

void inspect_opts_init(inspect_opts *o);

/* Builds the report of an open GGUF. `path` is what the report calls the file. The caller owns
 * *report (json_decref). Fails only on out-of-memory; audit findings are data, not errors. */
g5_status inspect_gguf(const gguf_ctx *ctx, const char *path, const inspect_opts *o,
                       json_t **report, g5_error *err);

/* Summary of a blob set directory (convert's output): the set record, every rank file's index
 * (opened and validated; tensor data is not hashed, that is verify's job), rank agreement, the
 * sources, the model, the plan (tensors and bytes per split axis), rank 0's tensor table with
 * global and local shapes, and bytes per rank by type. Findings (a missing, foreign or damaged
 * rank, no set record) are data: the report's "passed" says whether the set opens as a whole.
 * Layout: kind "blobset", dir, passed, problems[], record{tp, placement, converter_version,
 * set_id} | null, ranks[{rank, path, opened, error, file_size, header_hash, n_tensors,
 * data_size, chunk_size, n_chunks, meta_size, meta_raw_size, meta_zstd}], sources[{split, name,
 * file_size, header_size, header_hash}], model{architecture, n_kv, kv_b_type, hparams},
 * plan[{split, axis, count, bytes_per_rank}], tensors[{name, type, shape, local_shape, axis,
 * split_count, bytes, offset, derived}], totals_by_type[{type, count, bytes}] (per rank). */
g5_status inspect_blobset(const char *dir, const inspect_opts *o, json_t **report, g5_error *err);

/* 1 if the report's audit passed (or did not apply), 0 otherwise. */
int inspect_report_passed(const json_t *report);

/* Renders a report from inspect_gguf or inspect_blobset as text to f. */
g5_status inspect_print_text(const json_t *report, const inspect_opts *o, FILE *f);

/* Writes tensor `name` dequantized to little-endian float32, ggml element order (ne[0]
 * fastest), to out_path (OUT.tmp, fsync, rename). Streams row by row: bounded memory. */
g5_status inspect_dump_tensor(const gguf_ctx *ctx, const char *name, const char *out_path,
                              g5_error *err);

#endif
