/* int8-activation products for fast-mode decode (issue 14): an input vector is quantized per 32
 * elements to int8 with one float32 scale, and the weights' integer quants are multiplied with it
 * by __dp4a (4 products per instruction), exact in int32 per sub-block, then scaled in float32.
 * specs/numerics.md says which tensor roles take this path (the routed and shared experts, the
 * output head, the NextN input projection): only those whose products stay within the fast-mode
 * bar on the oracle with int8 inputs.
 *
 * Quantization of x (one 32-element block, as the CPU emulation in tests/gpu/test_gemv_q8.c):
 *   d = amax / 127 (float32 division), q[i] = rint(x[i] / d) (ties to even; 0 where d = 0),
 *   s = d * (float)sum(q), stored as ds[2b] = d, ds[2b + 1] = s.
 * Two planes (planes = 2: about 16 bits of x, for the products whose inputs feed near-tied
 * choices): the residual r = fma(-d, q, x) quantized again with d2 = d / 254 (q2 = rint(r / d2)),
 * stored k bytes after q and k / 16 floats after ds as (d2, 0) pairs, and s = fma(d2, sum q2, s):
 * the second plane is an ordinary int8 row whose products are added to the first's.
 * Products: per weight sub-block, the int32 dot product of the integer quants with q is scaled by
 * the weight scale and d; min terms (Q4_K, Q5_K) use s, Q2_K's the integer sum of q over its
 * 16-element run. Every output element is the sum of its
 * row's 64-element units in one fixed order: unit u goes to residue u % 32, each residue sums its
 * units in ascending order (plane 0 then plane 1 of each), and the 32 residue sums are added as
 * the pairwise tree over residues 0..31 in order; every rounding is explicit (cuda/q8_load.cuh).
 * Bits never depend on n, on the batch, or on which of the two GEMV kernels ran. */
#ifndef G5_CUK_Q8_H
#define G5_CUK_Q8_H

#include <stdint.h>

#include "cuda/cuk.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CUK_Q8_BLOCK 32
#define CUK_Q8_MAX_N 8 /* vectors per pass over the weights */

/* An int8 operand: rows of q [rows][ldq] (bytes) and their block pairs ds [rows][ldds]
 * (floats: d, s per block). */
typedef struct cuk_q8_act {
    const int8_t *q;   /* 16-byte aligned */
    int64_t ldq;       /* bytes between rows; >= planes * k, a multiple of 16 */
    const float *ds;   /* 16-byte aligned */
    int64_t ldds;      /* floats between rows; >= planes * k / 16, a multiple of 4 */
    int32_t planes;    /* 1 or 2 */
} cuk_q8_act;

/* q, ds of x [n][ldx] (float32), k a multiple of 32 (of 64 for a Q8_0 product's input and for
 * two planes). */
typedef struct cuk_q8_quantize_args {
    const float *x;
    int64_t ldx;       /* >= k */
    int64_t k;
    int64_t n;         /* rows, >= 1 */
    int8_t *q;         /* [n][ldq] */
    int64_t ldq;
    float *ds;         /* [n][ldds] */
    int64_t ldds;
    int32_t planes;    /* 1 or 2 */
} cuk_q8_quantize_args;
g5_status cuk_q8_quantize(const cuk_q8_quantize_args *a, cuk_stream stream, g5_error *err);

/* cuk_rms_norm (norm.a NULL) or cuk_add_rms_norm (norm.a given) of the rows, whose outputs y are
 * also quantized into q, ds as cuk_q8_quantize does (planes 1 or 2), in one launch: x, y, q and ds
 * bit for bit those of the two launches it replaces. Takes the dims cuk_norm_q8_fits says (a
 * multiple of 64 whose row spreads evenly over the norm's threads: 512, 2048, 6144, 16384, ..). */
typedef struct cuk_norm_q8_args {
    cuk_add_rms_norm_args norm; /* norm.a == NULL: plain RMSNorm, y may equal x */
    int8_t *q;                  /* [n_rows][ldq], ldq >= planes * dim, a multiple of 16 */
    int64_t ldq;
    float *ds;                  /* [n_rows][ldds], ldds >= planes * dim / 16, a multiple of 4 */
    int64_t ldds;
    int32_t planes;             /* 1 or 2 */
} cuk_norm_q8_args;
int cuk_norm_q8_fits(int64_t dim);
g5_status cuk_norm_q8(const cuk_norm_q8_args *a, cuk_stream stream, g5_error *err);

/* y = silu(g) * u as cuk_silu_mul, with y's rows also quantized as cuk_q8_quantize does (planes 1
 * or 2; dim a multiple of 32, of 64 for two planes), in one launch: the bits of the two. */
typedef struct cuk_silu_mul_q8_args {
    const float *g;
    int64_t ldg;
    const float *u;
    int64_t ldu;
    float *y;                   /* [n_rows][ldy]; may equal g or u */
    int64_t ldy;
    int64_t n_rows, dim;
    int8_t *q;
    int64_t ldq;
    float *ds;
    int64_t ldds;
    int32_t planes;
} cuk_silu_mul_q8_args;
g5_status cuk_silu_mul_q8(const cuk_silu_mul_q8_args *a, cuk_stream stream, g5_error *err);

/* 1 if the int8 kernels take weights of this type with rows of k elements: Q4_K, Q5_K, Q6_K
 * and the low-bit types Q2_K, Q3_K, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_XS,
 * TQ1_0, TQ2_0 (k % 256 == 0), Q8_0, IQ4_NL, MXFP4, NVFP4, Q4_0, Q4_1, Q5_0 and Q5_1 (k % 64 == 0). The low-bit types' units:
 * cuda/q8_lowbit.cuh (each weight an exact int8 times a per-16 or per-32 float scale). */
int cuk_q8_takes(uint32_t w_type, int64_t k);

/* y[v][i] = sum_j W[i][j] x'[v][j], x' the dequantized int8 rows of x, v < n <= CUK_Q8_MAX_N. */
typedef struct cuk_gemv_q8_args {
    uint32_t w_type;
    const void *w;     /* [m][row_bytes], 16-byte aligned */
    int64_t k, m;
    cuk_q8_act x;      /* [n] rows */
    int32_t n;
    float *y;          /* [n][ldy] */
    int64_t ldy;       /* >= m */
    const void *w2;    /* cuk_gemv_q8 only: NULL, or a second matrix of w's type and shape, its product
                        * with the same x in the same launch (each row's bits as alone) */
    float *y2;         /* with w2: its outputs [n][ldy], apart from y's */
} cuk_gemv_q8_args;
g5_status cuk_gemv_q8(const cuk_gemv_q8_args *a, cuk_stream stream, g5_error *err);
/* cuk_gemv_q8_xf's input: float32 rows x [n][ldx], 16-byte aligned, ldx a multiple of 4; with nw
 * non-NULL, each row RMS-normed first (weights nw [k], 16-byte aligned; eps >= 0) as cuk_rms_norm
 * does it. */
typedef struct cuk_q8_xf {
    const float *x;
    int64_t ldx;
    const float *nw;
    float eps;
} cuk_q8_xf;
/* cuk_gemv_q8 on float32 x rows (a->x gives only the planes, 1 or 2): each CTA quantizes the rows
 * (normed, with nw) into shared memory and reads them there, one launch instead of two or three.
 * The outputs are those of cuk_q8_quantize followed by cuk_gemv_q8 (with nw: of cuk_norm_q8
 * followed by cuk_gemv_q8), bit for bit. Where cuk_gemv_q8_xf_takes says so: Q4_K, Q5_K, Q8_0,
 * at most 46 KB of staged rows. */
g5_status cuk_gemv_q8_xf(const cuk_gemv_q8_args *a, const cuk_q8_xf *xf, cuk_stream stream, g5_error *err);
int cuk_gemv_q8_xf_takes(uint32_t t, int64_t k, int32_t n, int32_t planes);
/* cuk_gemv_q8 with each CTA's x rows staged in shared memory first (the xs form; weights Q4_K,
 * Q5_K or Q8_0): the same bits. For tests and bench_q8, which compare the two (bench/NOTES.md,
 * session 29); G5_ERR_UNSUPPORTED for other types or where n x planes x k x 1.25 bytes exceed
 * what the device gives a block. */
g5_status cuk_gemv_q8_xs(const cuk_gemv_q8_args *a, cuk_stream stream, g5_error *err);

/* The same product on the tensor cores (cuda/gemv_q8t.cu): up to CUK_Q8T_MAX_N vectors in one
 * pass, weights Q4_K, Q5_K, Q6_K or Q8_0 with k % 256 == 0 (cuk_q8t_takes), with cuk_gemv_q8's
 * bits for every row (the order above). scratch: NULL, or >= k * CUK_Q8T_SCRATCH_PER_K bytes,
 * 16-byte aligned, where launches of more than 8 columns (vectors x planes) on matrices the x-staged
 * form does not take re-lay x out first (faster; the same bits), and two planes of more than 16
 * vectors (weights but Q6_K) run so as one launch of 64 columns instead of two, except on the tall
 * matrices of k <= 4096 that the x-staged form takes. Launches on one stream may share it. */
#define CUK_Q8T_MAX_N 32
#define CUK_Q8T_SCRATCH_PER_K 80
int cuk_q8t_takes(uint32_t w_type, int64_t k);
g5_status cuk_gemv_q8t(const cuk_gemv_q8_args *a, void *scratch, size_t scratch_bytes, cuk_stream stream,
                       g5_error *err);
/* cuk_gemv_q8t in its second form for every launch (x staged in shared memory per k-range, the
 * ranges a thread-block cluster; two planes of 17-32 vectors in one launch of 64 columns where the
 * weights are not Q6_K; cuk_gemv_q8t takes it by shape): the same bits. For tests and
 * bench_q8, which compare the forms; G5_ERR_UNSUPPORTED where the device cannot give a block its
 * 216 KB of shared memory (sm_120). */
g5_status cuk_gemv_q8t_sx(const cuk_gemv_q8_args *a, cuk_stream stream, g5_error *err);

/* cuk_moe_gate_up with int8 inputs: x holds the n_tok tokens' rows; out, plan, ids as there. */
typedef struct cuk_moe_gate_up_q8_args {
    uint32_t w_type;
    const void *w_gate, *w_up; /* [n_expert][m][row_bytes] each */
    int64_t k, m;
    int32_t n_expert;
    const int32_t *ids;
    int32_t top_k;
    int64_t ld_ids;
    cuk_q8_act x;              /* [n_tok] rows */
    int32_t n_tok;
    float *out;                /* [n_tok * top_k][ldo] */
    int64_t ldo;
    const int32_t *plan;
} cuk_moe_gate_up_q8_args;
g5_status cuk_moe_gate_up_q8(const cuk_moe_gate_up_q8_args *a, cuk_stream stream, g5_error *err);

/* cuk_moe_down with int8 inputs: h holds the n_tok * top_k pairs' rows. Or, cuk_moe_down_q8 only
 * and where cuk_moe_down_q8_hf_takes says so, hf non-NULL: the pairs' rows in float32 (one plane,
 * h unused), each CTA quantizing the rows it reads as cuk_q8_quantize would (the same bits), so
 * that the decode step needs no quantize launch between gate_up and down. */
typedef struct cuk_moe_down_q8_args {
    uint32_t w_type;
    const void *w;             /* [n_expert][m][row_bytes] */
    int64_t k, m;
    int32_t n_expert;
    const int32_t *ids;
    const float *wts;
    int32_t top_k;
    int64_t ld_ids, ld_wts;
    cuk_q8_act h;              /* [n_tok * top_k] rows */
    int32_t n_tok;
    float *y;                  /* [n_tok][ldy] */
    int64_t ldy;
    const int32_t *plan;
    float *part;               /* [n_tok * top_k][ldp] scratch */
    int64_t ldp;
    const float *hf;           /* NULL, or [n_tok * top_k][ldhf] rows of k (16-byte aligned) */
    int64_t ldhf;
} cuk_moe_down_q8_args;
g5_status cuk_moe_down_q8(const cuk_moe_down_q8_args *a, cuk_stream stream, g5_error *err);
/* 1 where cuk_moe_down_q8 takes float32 rows (hf) for weights of type t with rows of k and n_tok
 * tokens: Q4_K, Q5_K, Q8_0 (the types whose int8 unit is 64 contiguous elements), rows staged in
 * at most 46 KB of shared memory. */
int cuk_moe_down_q8_hf_takes(uint32_t t, int64_t k, int32_t n_tok);

/* The two MoE products on the tensor cores (cuda/gemv_q8t.cu): the same arguments and, for every
 * pair's row, the same bits as cuk_moe_gate_up_q8 / cuk_moe_down_q8 (the order above); an
 * expert's weights are read once for up to 8 of its pairs. Weights Q4_K, Q5_K or Q8_0 with
 * k % 256 == 0 and one-plane inputs (cuk_moe_q8t_takes). */
int cuk_moe_q8t_takes(uint32_t w_type, int64_t k, int32_t planes);
g5_status cuk_moe_gate_up_q8t(const cuk_moe_gate_up_q8_args *a, cuk_stream stream, g5_error *err);
g5_status cuk_moe_down_q8t(const cuk_moe_down_q8_args *a, cuk_stream stream, g5_error *err);
/* The same in the L1 form alone (each warp reads its x columns from global memory): what the
 * two above launch where the device cannot give a block the xs form's x slots beside its weight
 * ring (sm_90: k > 16128; sm_120's 99 KB: k > 6400 for Q4_K, 5376 for Q5_K, 3072 for Q8_0). For
 * tests and bench_q8, which compare the forms: the same bits. */
g5_status cuk_moe_gate_up_q8t_l1(const cuk_moe_gate_up_q8_args *a, cuk_stream stream, g5_error *err);
g5_status cuk_moe_down_q8t_l1(const cuk_moe_down_q8_args *a, cuk_stream stream, g5_error *err);

#ifdef __cplusplus
}
#endif

#endif
