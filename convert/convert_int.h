/* Private to convert/convert.c and convert/verify.c: helpers shared by the converter and the
 * deep verifier (slice selection over row windows, the kv_b builder, source identity, set id). */
#ifndef G5_CONVERT_INT_H
#define G5_CONVERT_INT_H

#include <stdint.h>

#include "convert/convert.h"
#include "convert/shard.h"
#include "format/blob.h"
#include "format/gguf.h"

double convert_i_now(void); /* monotonic seconds */

/* Receives consecutive pieces of a rank's slice. */
typedef g5_status (*convert_i_put)(void *ctx, const uint8_t *p, uint64_t n);

/* Emits rank's part of rows [r0, r1) of a copied tensor; src holds those rows (row r0 first). */
g5_status convert_i_select_rows(const shard_tensor *t, const shard_sel *s, const uint8_t *src,
                                uint64_t r0, uint64_t r1, convert_i_put put, void *ctx);

/* Builds one rank's kv_b slice: rebuilt float32 rows, stored as plan->kv_b_type. */
typedef struct convert_i_kvb {
    float *f32;      /* [local rows, kv_lora] exact values */
    float *scratch;  /* glm5_rebuild_kv_b scratch */
    float *back;     /* stored values read back (error measurement) */
    uint8_t *out;    /* stored bytes, t->local_bytes */
    uint64_t n_elems;
} convert_i_kvb;

g5_status convert_i_kvb_init(convert_i_kvb *k, const shard_plan *p, const shard_tensor *t, g5_error *err);
void convert_i_kvb_free(convert_i_kvb *k);
/* Fills k->f32 and k->out for rank; max_err/max_abs are raised (not reset) to the largest
 * |stored - exact| and |exact| seen. */
g5_status convert_i_kvb_build(convert_i_kvb *k, const shard_plan *p, const shard_tensor *t,
                              uint32_t rank, const gguf_tensor *k_b, const gguf_tensor *v_b,
                              double *max_err, double *max_abs, g5_error *err);

/* Identity of every source split: size, header region size and its XXH3-128, and the XXH3-128
 * of 64 evenly spaced 4 KiB samples of its data region (all of it if smaller). descs[i].name
 * points into the gguf context. Caller frees *descs. */
g5_status convert_i_source_identity(const gguf_ctx *src, blob_source_desc **descs, uint32_t *n,
                                    g5_error *err);
/* The set id: XXH3-128 over the converter and blob versions, tp, placement, kv_b type and the
 * source identity (not the file names). Deterministic, so a resumed run writes the same bytes. */
void convert_i_set_id(const shard_plan *p, const blob_source_desc *src, uint32_t n_src, uint8_t out[16]);
/* The converter version a plan's layout belongs to: CONVERT_VERSION, or 1.0.0 for a no_pair plan. */
uint32_t convert_i_version(const shard_plan *p);

/* The metadata image carried by every blob: a tensor-less GGUF v3 with all of the source's kv
 * pairs except split.* (which describe the source's file layout, recorded in the source table). */
g5_status convert_i_meta_image(const gguf_ctx *src, const shard_plan *p, uint8_t **buf, uint64_t *len,
                               g5_error *err);

/* Blob tensor descriptors of the plan for rank r (names point into the plan). */
void convert_i_writer_tensors(const shard_plan *p, uint32_t rank, blob_writer_tensor *out);

#endif
