/* Token draws on the device from each row's logits (cuda/sample.cu): the host sampler's chain
 * (runtime/text/sample.h, specs/numerics.md "Token draws") for the draws samp_device_row admits,
 * with the same integer masses (format/det_exp.h), so the same token for the same logits and
 * random number:
 *   temperature <= 0: the argmax (larger logit, then lower id; NaN never);
 *   else each id's mass dx_mass(l, maxl, T), 0 for NaN and -inf and where
 *     top-k drops it (0 < top_k < n: the set is the top_k best by dx_desc_key, then id),
 *     min-p drops it, or
 *     top-p drops it (top_p < 1: it keeps the keys at most kt, the least key at which the
 *     temperature-1 masses of the set's min-p survivors at or below it reach
 *     dx_top_p_need(top_p, z), z the temperature-1 mass of the set);
 *   total their sum, r = floor(k * total / 2^53), and the first id in ascending order whose
 *   running mass exceeds r.
 * First, the logits of each row's penalized ids become dx_penalized's (NaN read as -inf), as the
 * host chain applies its window's penalties. A row with no logit > -inf gives -1 (the host
 * sampler refuses those logits). */
#ifndef G5_CUDA_CUK_SAMPLE_H
#define G5_CUDA_CUK_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "cuda/cuk.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cuk_sample_row {
    float temperature; /* <= 0: the argmax */
    float min_p;       /* <= 0: off */
    float top_p;       /* >= 1: off */
    int32_t top_k;     /* <= 0 or >= n: off */
    double lmin;       /* log(min_p) where on */
    uint64_t k;        /* 53 random bits */
    float repeat_penalty, frequency_penalty, presence_penalty;
    uint32_t pen_off, n_pen; /* the row's penalized ids: pen_ids[pen_off .. pen_off + n_pen) */
} cuk_sample_row;

typedef struct cuk_sample_args {
    float *x;                   /* [n_rows][ldx], n logits a row; a row's penalized ids rewritten
                                 * in place with their penalized logits (a second call on the same
                                 * rows would penalize them twice) */
    int64_t ldx;
    int32_t n, n_rows;          /* n <= 2^31 - 1, n_rows <= 65535 */
    const cuk_sample_row *rows; /* [n_rows], device */
    void *scratch;              /* cuk_sample_scratch_bytes(n_rows), device, 16-byte aligned */
    int32_t *out;               /* [n_rows], device */
    int32_t any_top_p;          /* some sampled row has top_p < 1 (its threshold's passes run; 0:
                                 * skipped, so it must not be 0 then) */
    int32_t any_top_k;          /* some sampled row has 0 < top_k < n (likewise) */
    const int32_t *pen_ids;     /* device: the rows' penalized ids (distinct within a row, < n) */
    const uint32_t *pen_counts; /* device: their counts in the window */
    int32_t any_pen;            /* some row has n_pen > 0 (likewise) */
} cuk_sample_args;

size_t cuk_sample_scratch_bytes(int32_t n_rows);
g5_status cuk_sample(const cuk_sample_args *a, cuk_stream stream, g5_error *err);

#ifdef __cplusplus
}
#endif

#endif
