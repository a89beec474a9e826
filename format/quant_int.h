/* format/quant internals shared by quant.c and quant_lowbit.c. */
#ifndef G5_QUANT_INT_H
#define G5_QUANT_INT_H

#include <stdint.h>

#include "status.h"

/* Dequantizes nb blocks of a low-bit type (format/quant_blocks.h) from src into dst;
 * G5_ERR_INTERNAL for another type. */
g5_status quant_lowbit_dequant(uint32_t type, const uint8_t *src, uint64_t nb, float *dst);

/* Makes the random bytes of one block of a low-bit type valid with modest scales (|values|
 * about 0.01..1); 0 if the type is not one of them. */
int quant_lowbit_fill(uint32_t type, uint8_t *b, uint64_t *rng);

/* Uniform in [lo, hi) from a splitmix64 state (quant.c). */
float quant_rng_uniform(uint64_t *s, float lo, float hi);

#endif
