/* fp16 tensor-core products for batched fast-mode decode (issue 14): the attention and dense
 * products under rt_gpu_opts.h16_products (glm5-serve with --max-batch > 1), bench/RESULTS.md and
 * bench/NOTES.md, sessions 40-42.
 *
 * Each weight is decoded in registers to float32 as d sc q - dmin m (one fma after the two scale
 * products the CPU's dequantizer makes) and rounded once to fp16 (session 42 measured the hfma2
 * decode of cuda/moe_mm.cu here, fp16(q fp16(d sc) - fp16(dmin m)): it broke test_gpu_model's fast
 * bar on prompt 0); x is rounded to fp16 after a power-of-two scale per vector (cuk_h16_prep: its
 * largest magnitude to [2^14, 2^15), so neither range end of fp16 is reached); mma.sync m16n8k16
 * multiplies them with float32 accumulators.
 * Every output is its warp's chain of mma over its k-range in k order, then the CUK_H16_KW warps'
 * partials added in warp order, then times the vector's 2^-e: nothing depends on n, so a vector's
 * outputs are bit-identical in every batch (tests/gpu/test_gemv_h16 checks it, and the decode
 * bit for bit). On the oracle (test_gpu_model, H100): prompt 0 / 1 logits rel L2 1.08e-2 /
 * 0.165 against the fast bar's 0.09 / 0.26, every dense argmax. */
#ifndef G5_CUK_H16_H
#define G5_CUK_H16_H

#include <stdint.h>

#include "cuda/cuk.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CUK_H16_MAX_N 32 /* vectors a launch; cuk_gemv_h16 takes more in launches of this many */
#define CUK_H16_KW 4     /* warps sharing a 16-row tile's k (the bits depend on it) */

/* An fp16 operand: rows of x' = fp16(x * 2^e) [n][ldx] (IEEE half bits) and 2^-e per row. */
typedef struct cuk_h16_act {
    const uint16_t *x;     /* 16-byte aligned */
    int64_t ldx;           /* elements between rows: >= k, a multiple of 8 */
    const float *unscale;  /* [n] */
} cuk_h16_act;

/* xh, unscale of x [n][ldx] (float32): per row e = 15 - (the exponent of its largest magnitude as
 * frexpf gives it), clamped to [-126, 126] (e = 0 for a row of zeros or with an infinity),
 * xh = fp16(ldexpf(x, e)) rounded to nearest even, unscale = ldexpf(1, -e). NaN stays NaN. */
typedef struct cuk_h16_prep_args {
    const float *x;
    int64_t ldx;     /* >= k */
    int64_t k;       /* >= 1 */
    int64_t n;       /* rows, >= 1 */
    uint16_t *xh;    /* [n][ldxh] */
    int64_t ldxh;    /* >= k */
    float *unscale;  /* [n] */
} cuk_h16_prep_args;
g5_status cuk_h16_prep(const cuk_h16_prep_args *a, cuk_stream stream, g5_error *err);

/* cuk_rms_norm (norm.a NULL) or cuk_add_rms_norm (norm.a given) of the rows, whose outputs y are
 * also made the fp16 operand xh, unscale as cuk_h16_prep does, in one launch: x, y, xh and unscale
 * bit for bit those of the two launches it replaces. Takes the dims cuk_norm_q8_fits says. */
typedef struct cuk_norm_h16_args {
    cuk_add_rms_norm_args norm; /* norm.a == NULL: plain RMSNorm, y may equal x */
    uint16_t *xh;               /* [n_rows][ldxh], 16-byte aligned */
    int64_t ldxh;               /* >= dim, a multiple of 8 */
    float *unscale;             /* [n_rows] */
} cuk_norm_h16_args;
g5_status cuk_norm_h16(const cuk_norm_h16_args *a, cuk_stream stream, g5_error *err);

/* y[v][o] = sum_i W[o][i] x[v][i] for v < n, o < m; W: m rows of k elements of `type`. */
typedef struct cuk_gemv_h16_args {
    uint32_t type;   /* cuk_h16_takes */
    const void *w;   /* [m][row bytes], 16-byte aligned */
    int64_t k;       /* a multiple of 256 */
    int64_t m;
    cuk_h16_act x;
    int64_t n;       /* >= 1 */
    float *y;        /* [n][ldy] */
    int64_t ldy;     /* >= m */
} cuk_gemv_h16_args;
/* 1 for the weight types cuk_gemv_h16 decodes (Q4_K, Q5_K) at row length k */
int cuk_h16_takes(uint32_t type, int64_t k);
g5_status cuk_gemv_h16(const cuk_gemv_h16_args *a, cuk_stream stream, g5_error *err);

#ifdef __cplusplus
}
#endif

#endif
