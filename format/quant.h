/* ggml tensor types: the type table and CPU dequantizers (and the few quantizers we need).
 *
 * Block layouts follow ggml (ggml-common.h). All block fields are little-endian; fp16 scales are
 * IEEE half. Dequantization writes float32 in ggml element order. */
#ifndef G5_QUANT_H
#define G5_QUANT_H

#include <stdint.h>
#include <stddef.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ggml type ids (stable on disk). */
enum {
    QT_F32 = 0, QT_F16 = 1, QT_Q4_0 = 2, QT_Q4_1 = 3, QT_Q5_0 = 6, QT_Q5_1 = 7, QT_Q8_0 = 8,
    QT_Q8_1 = 9, QT_Q2_K = 10, QT_Q3_K = 11, QT_Q4_K = 12, QT_Q5_K = 13, QT_Q6_K = 14,
    QT_Q8_K = 15, QT_IQ2_XXS = 16, QT_IQ2_XS = 17, QT_IQ3_XXS = 18, QT_IQ1_S = 19,
    QT_IQ4_NL = 20, QT_IQ3_S = 21, QT_IQ2_S = 22, QT_IQ4_XS = 23, QT_I8 = 24, QT_I16 = 25,
    QT_I32 = 26, QT_I64 = 27, QT_F64 = 28, QT_IQ1_M = 29, QT_BF16 = 30, QT_TQ1_0 = 34,
    QT_TQ2_0 = 35, QT_MXFP4 = 39, QT_NVFP4 = 40, QT_Q1_0 = 41,
    QT_TYPE_LIMIT = 64 /* ids >= this are unknown */
};

typedef struct quant_type_info {
    uint32_t id;
    const char *name;      /* "Q4_K" */
    uint32_t block_elems;  /* elements per block (1 for F32/F16/BF16) */
    uint32_t block_bytes;  /* bytes per block */
    int supported;         /* 1 if we can dequantize it */
} quant_type_info;

/* NULL for an unknown id. Known-but-unsupported types return an entry with supported = 0. */
const quant_type_info *quant_type_get(uint32_t id);
/* "Q4_K", or "type#N" style "unknown" for unknown ids (static storage per call is NOT used:
 * returns "unknown" for unknown ids). */
const char *quant_type_name(uint32_t id);
/* Looks a type up by name, case-insensitive ("q8_0", "BF16"); -1 if none. */
int quant_type_from_name(const char *name);

/* Checks that `type` is known and supported; otherwise G5_ERR_TENSOR_TYPE ("type id 77: unknown")
 * or G5_ERR_UNSUPPORTED ("IQ2_XXS (16): not supported"). */
g5_status quant_check_supported(uint32_t type, g5_error *err);

/* 1 for the block types whose every element is one rounded product of a scale and an integer of
 * at most 8 bits (Q4_0, Q5_0, Q8_0, IQ4_NL, Q6_K, IQ4_XS): the GPU holds kv_b made of them in an
 * exact int8 form (cuda/deq_sub.h's deq_sub_i8, cuda/cuk_model.h's cuk_kvb_exact). */
int quant_exact_i8(uint32_t type);

/* Bytes for n elements of type (n must be a multiple of the block size). G5_ERR_ALIGN if not,
 * G5_ERR_OVERFLOW on overflow, G5_ERR_TENSOR_TYPE for an unknown type. */
g5_status quant_row_bytes(uint32_t type, uint64_t n_elems, uint64_t *out);

/* Dequantizes n_elems elements (a multiple of the block size) from src to dst.
 * src must hold exactly the row bytes for n_elems. */
g5_status quant_dequantize(uint32_t type, const void *src, uint64_t n_elems, float *dst);

/* Quantizers used by the converter (--kv-b-type): F32, F16, BF16, Q8_0.
 * Q8_0 follows ggml's reference quantize_row_q8_0 (round to nearest, d = amax/127). */
g5_status quant_quantize(uint32_t type, const float *src, uint64_t n_elems, void *dst);

/* Fills n_blocks blocks of `type` with random but valid content (finite fp16 scales of modest
 * magnitude, random quants), from a 64-bit state advanced in place. For synth. */
g5_status quant_fill_random(uint32_t type, void *dst, uint64_t n_blocks, uint64_t *rng_state);

/* Makes such blocks zero-mean the way trained weights are: Q2_K, Q4_K and Q5_K store
 * w = d sc q - dmin m with an independent min, so quant_fill_random's blocks average about
 * +0.1 per weight and every product then carries a common mode that grows over the layers
 * (bench/RESULTS.md, session 11). This sets each sub-block's m to its sc and dmin to fp16(h d),
 * h = (2^bits - 1) / 2, so w = d sc (q - h). The other types are symmetric (or, Q4_1 / Q5_1,
 * centred on average) already and are left as they are. G5_ERR_TENSOR_TYPE for an unknown type. */
g5_status quant_centre_blocks(uint32_t type, void *dst, uint64_t n_blocks);

/* Pair j < 8 of a Q4_K / Q5_K block's 12 packed bytes of 6-bit (scale, min) pairs (ggml's
 * get_scale_min_k4): the sub-block's scale *d and min *m. */
void quant_k4_scale_min(int j, const uint8_t *scales, uint8_t *d, uint8_t *m);

/* Half-precision helpers (IEEE binary16 and bfloat16), exact conversions, round-to-nearest-even. */
float quant_f16_to_f32(uint16_t h);
uint16_t quant_f32_to_f16(float f);
float quant_bf16_to_f32(uint16_t h);
uint16_t quant_f32_to_bf16(float f);

#ifdef __cplusplus
}
#endif

#endif
