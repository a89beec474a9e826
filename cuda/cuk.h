/* CUDA kernels for the GPU runtime: launchers with C linkage, callable from C11.
 *
 * cuda/ knows nothing about files or models: every launcher takes device pointers, shapes and a
 * stream, checks every shape on the host before touching the GPU (G5_ERR_INVALID_ARG with a
 * message naming the bad argument), enqueues its kernel(s) on the stream and returns without
 * synchronizing. A CUDA error (launch failure, or one left behind by an earlier asynchronous
 * failure) comes back as G5_ERR_INTERNAL naming the call. Nothing is allocated per call.
 *
 * Weights are in ggml layout: a matrix of m rows of k elements (ggml ne[0] = k contiguous) stores
 * row i at w + i * row_bytes with row_bytes = k / block_elems * block_bytes; an expert tensor
 * stores n_expert such matrices back to back. Weight pointers must be 16-byte aligned. All
 * accumulation is float32 (norm statistics in float64). */
#ifndef G5_CUK_H
#define G5_CUK_H

#include <stddef.h>
#include <stdint.h>

/* format/ headers have no C++ guards of their own. */
#ifdef __cplusplus
extern "C" {
#endif

#include "format/status.h"

/* Same type as cudaStream_t; NULL is the legacy default stream. Declared here so that C code
 * can call the launchers without the CUDA headers. */
typedef struct CUstream_st *cuk_stream;

/* Activation (input vector) element types for the GEMV kernels. */
enum { CUK_ACT_F32 = 0, CUK_ACT_BF16 = 1 };

#define CUK_GEMV_MAX_N 16

/* 1 if the dequantizing GEMV kernels handle ggml type `type` (F32, F16, BF16, Q8_0, Q4_0,
 * Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS). */
int cuk_gemv_supported(uint32_t type);

/* 1 if cuk_gemv runs a GEMV of this type and shape on the tensor cores: Q4_K with m * k >= 2^25
 * weights (the MoE launchers: every Q4_K expert shape that fits), k % 256 == 0 and the
 * converted x of one vector fits in shared memory (k <= about 16K). From the weight shape, never
 * from n: that path runs up to 4 vectors per pass over W (2 for k > 4096, 1 for k > 8192), so
 * larger n costs more passes, and each output vector is bit-identical whatever n is. Every other
 * call runs the CUDA-core kernels. Both keep float32 inputs. */
int cuk_gemv_takes_tc(uint32_t type, int64_t m, int64_t k, int32_t n);

/* y[v][i] = sum_j W[i][j] * x[v][j] for v < n, i < m, j < k. */
typedef struct cuk_gemv_args {
    uint32_t w_type;   /* ggml type id of W */
    const void *w;     /* [m][row_bytes], 16-byte aligned */
    int64_t k;         /* elements per row; a multiple of the type's block (and of 8) */
    int64_t m;         /* rows */
    const void *x;     /* [n][ldx] of x_type; 16-byte aligned (8 for bf16) */
    uint32_t x_type;   /* CUK_ACT_F32 or CUK_ACT_BF16 */
    int64_t ldx;       /* elements between input vectors; >= k, a multiple of 4 */
    int32_t n;         /* input vectors, 1..CUK_GEMV_MAX_N; all share one pass over W */
    float *y;          /* [n][ldy] */
    int64_t ldy;       /* >= m */
} cuk_gemv_args;

g5_status cuk_gemv(const cuk_gemv_args *a, cuk_stream stream, g5_error *err);

/* Routing plan of one MoE call: the (token, slot) pairs p = t * top_k + s grouped by expert, so
 * that the expert kernels decode each expert's weights once for all of its tokens (a batched
 * decode step routes many tokens to the same experts). Built on the device by cuk_moe_plan from
 * ids and wts; int32 words, P = n_tok * top_k, G = P (capacity):
 *   [0]                 n_groups
 *   [1, 1+G)            group expert e
 *   [1+G, 1+2G)         group start: its pairs are list[start .. start + count)
 *   [1+2G, 1+3G)        group count, 1..CUK_MOE_GROUP
 *   [1+3G, 1+3G+P)      list: the pairs, by expert, then by pair index
 *   [1+3G+P, 1+3G+2P)   flag per pair: 1 computed, 0 skipped (weight 0: another rank's expert),
 *                       -1 id outside [0, n_expert) (the token's output becomes NaN)
 * An expert with more than CUK_MOE_GROUP pairs has several groups. Deterministic: the plan
 * depends on ids and wts only. */
#define CUK_MOE_GROUP 4
#define CUK_MOE_PLAN_MAX_PAIRS 4096
int64_t cuk_moe_plan_words(int32_t n_tok, int32_t top_k);

typedef struct cuk_moe_plan_args {
    const int32_t *ids;  /* [n_tok][ld_ids], device */
    const float *wts;    /* [n_tok][ld_wts], device */
    int32_t n_tok, top_k;
    int64_t ld_ids, ld_wts;
    int32_t n_expert;    /* local experts: ids index [0, n_expert) */
    int32_t *plan;       /* [cuk_moe_plan_words(n_tok, top_k)], device */
} cuk_moe_plan_args;

/* n_tok * top_k <= CUK_MOE_PLAN_MAX_PAIRS (callers split larger batches). One CTA. */
g5_status cuk_moe_plan(const cuk_moe_plan_args *a, cuk_stream stream, g5_error *err);

/* Routed experts, gate and up fused: for token t < n_tok and slot s < top_k, with
 * e = ids[t * ld_ids + s] (device memory, 0 <= e < n_expert),
 *   out[(t * top_k + s) * ldo + i] = silu(Wg[e] x_t)[i] * (Wu[e] x_t)[i]   for i < m,
 * silu(g) = g / (1 + exp(-g)). Wg and Wu are [n_expert][m][row_bytes] of the same type.
 * The pairs computed are the plan's (cuk_moe_plan of the same ids and wts): rows of skipped
 * pairs (weight 0) are left as they were; an id outside [0, n_expert) cannot be checked on the
 * host: its output row is written as NaN (low-bit types) or left (the others; cuk_moe_down
 * poisons the token). Each pair's row is bit-identical whatever n_tok is. */
typedef struct cuk_moe_gate_up_args {
    uint32_t w_type;
    const void *w_gate;  /* [n_expert][m][row_bytes] */
    const void *w_up;    /* [n_expert][m][row_bytes] */
    int64_t k;           /* input width (n_embd) */
    int64_t m;           /* expert width (n_ff_exp, per rank) */
    int32_t n_expert;
    const int32_t *ids;  /* [n_tok][ld_ids], device */
    int32_t top_k;
    int64_t ld_ids;      /* >= top_k */
    const void *x;       /* [n_tok][ldx] of x_type */
    uint32_t x_type;
    int64_t ldx;         /* >= k, a multiple of 4 */
    int32_t n_tok;
    float *out;          /* [n_tok * top_k][ldo] */
    int64_t ldo;         /* >= m */
    const int32_t *plan; /* cuk_moe_plan of ids (and the routing weights), device */
} cuk_moe_gate_up_args;

g5_status cuk_moe_gate_up(const cuk_moe_gate_up_args *a, cuk_stream stream, g5_error *err);

/* Routed experts, down projection with the routing weights applied and the experts summed:
 *   y[t * ldy + i] = sum_{s < top_k} wts[t * ld_wts + s] * (Wd[e_s] h_{t,s})[i]   for i < m,
 * with e_s = ids[t * ld_ids + s] and h_{t,s} = h + (t * top_k + s) * ldh (the layout
 * cuk_moe_gate_up writes). Each computed pair's product goes to part (float32), then the slots
 * are summed in slot order (pairs of weight 0 skipped): y[t] is bit-identical whatever n_tok
 * is. An out-of-range id makes the token's output row NaN. */
typedef struct cuk_moe_down_args {
    uint32_t w_type;
    const void *w;       /* [n_expert][m][row_bytes] */
    int64_t k;           /* expert width (n_ff_exp, per rank) */
    int64_t m;           /* output width (n_embd) */
    int32_t n_expert;
    const int32_t *ids;  /* [n_tok][ld_ids], device */
    const float *wts;    /* [n_tok][ld_wts], device: routing weights (already normalized/scaled) */
    int32_t top_k;
    int64_t ld_ids;      /* >= top_k */
    int64_t ld_wts;      /* >= top_k */
    const void *h;       /* [n_tok * top_k][ldh] of h_type */
    uint32_t h_type;
    int64_t ldh;         /* >= k, a multiple of 4 */
    int32_t n_tok;
    float *y;            /* [n_tok][ldy] */
    int64_t ldy;         /* >= m */
    const int32_t *plan; /* cuk_moe_plan of ids and wts, device */
    float *part;         /* [n_tok * top_k][ldp] scratch, device (low-bit types: unused) */
    int64_t ldp;         /* >= m */
} cuk_moe_down_args;

g5_status cuk_moe_down(const cuk_moe_down_args *a, cuk_stream stream, g5_error *err);

/* y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, row by row (sum of squares in float64, as the
 * CPU reference). x: [n_rows][ldx], y: [n_rows][ldy] (y may equal x), w: [dim]. */
g5_status cuk_rms_norm(const float *x, int64_t ldx, const float *w, float *y, int64_t ldy,
                       int64_t n_rows, int64_t dim, float eps, cuk_stream stream, g5_error *err);

/* x[r] += (b ? a[r] + b[r] : a[r]), then y[r] = cuk_rms_norm of the new x[r]: bit for bit
 * what cuk_add (a + b first) then cuk_add into x then cuk_rms_norm give, in one launch. */
typedef struct cuk_add_rms_norm_args {
    float *x;            /* [n_rows][ldx], updated in place */
    int64_t ldx;
    const float *a;      /* [n_rows][lda] */
    const float *b;      /* [n_rows][lda], or NULL */
    int64_t lda;
    const float *w;      /* [dim] */
    float *y;            /* [n_rows][ldy]; must not alias x, a or b */
    int64_t ldy;
    int64_t n_rows, dim;
    float eps;
} cuk_add_rms_norm_args;
g5_status cuk_add_rms_norm(const cuk_add_rms_norm_args *a, cuk_stream stream, g5_error *err);

/* The new MLA latent rows in one launch: y[r][0..dim) = cuk_rms_norm of x[r][0..dim), and
 * y[r][dim..dim + n_rot) = x[r][dim..dim + n_rot) rotated as cuk_rope does (one head, rot_off
 * dim) at pos[r]: bit for bit the norm, copy and RoPE launches it replaces. */
typedef struct cuk_norm_rope_args {
    const float *x;      /* [n_rows][ldx], ldx >= dim + n_rot */
    int64_t ldx;
    const float *w;      /* [dim] */
    float *y;            /* [n_rows][ldy]; x itself (ldy == ldx) or not overlapping it */
    int64_t ldy;
    int64_t n_rows, dim;
    float eps;
    int64_t n_rot;       /* even, 2..256 */
    float theta;
    const int32_t *pos;  /* [n_rows] int32, device */
} cuk_norm_rope_args;
g5_status cuk_norm_rope(const cuk_norm_rope_args *a, cuk_stream stream, g5_error *err);

/* y[r] = (x[r] - mean) / sqrt(var + eps) * w + b (biased variance; mean and variance in
 * float64, two passes). */
typedef struct cuk_layer_norm_args {
    const float *x;      /* [n_rows][ldx] */
    int64_t ldx;
    const float *w, *b;  /* [dim] each */
    float *y;            /* [n_rows][ldy]; may equal x */
    int64_t ldy;
    int64_t n_rows, dim;
    float eps;
} cuk_layer_norm_args;
g5_status cuk_layer_norm(const cuk_layer_norm_args *a, cuk_stream stream, g5_error *err);

/* Interleaved rotary embedding in place ("NORM" mode: adjacent pairs). For token t, head h and
 * pair i < n_rot / 2, with p = x + t * tok_stride + h * head_stride + rot_off:
 *   (p[2i], p[2i+1]) rotated by angle pos[t] * inv_i, inv_i = 1 / theta^(2i / n_rot),
 * with inv_i and the angle formed in float32 exactly as the CPU reference does (inv_i computed
 * on the host with powf, passed by value), cos/sin taken in float64 of the float angle. */
typedef struct cuk_rope_args {
    float *x;            /* [n_tok][tok_stride], heads head_stride apart within a token */
    int64_t n_tok, tok_stride;
    int64_t n_head, head_stride;
    int64_t rot_off;     /* the first rotated element of a head */
    int64_t n_rot;       /* rotated elements per head: even, 2..256 */
    float theta;
    const int32_t *pos;  /* [n_tok] int32, device */
} cuk_rope_args;
g5_status cuk_rope(const cuk_rope_args *a, cuk_stream stream, g5_error *err);

/* y[i] = a[i] + b[i] for i < n (y may equal a or b). */
g5_status cuk_add(const float *a, const float *b, float *y, int64_t n, cuk_stream stream,
                  g5_error *err);

/* out[r] = index of the largest x[r][i], i < n (lowest index on ties, NaN never chosen; -1 if
 * the whole row is NaN) and, where val is not NULL, val[r] = that x (NaN for a row of NaN).
 * x: [n_rows][ldx]; out, val: [n_rows], device. */
g5_status cuk_argmax(const float *x, int64_t ldx, int64_t n_rows, int64_t n, int32_t *out, float *val,
                     cuk_stream stream, g5_error *err);

/* A debugging scan of x[0 .. n): out[0] = the bits of max(out[0] as float, largest finite
 * |x[i]|), out[1] += the number of non-finite x[i] (the caller zeroes out first). out: [2], device. */
g5_status cuk_absmax_scan(const float *x, int64_t n, uint32_t *out, cuk_stream stream, g5_error *err);

#ifdef __cplusplus
}
#endif

#endif
