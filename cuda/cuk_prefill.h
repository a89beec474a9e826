/* The elementwise and row kernels of fast mode's tensor-core prefill attention and indexer
 * (cuda/attn_prefill.cu; runtime/gpu/gpu_linear.c runs them between cuBLAS products).
 *
 * MLA prefill attention: queries and keys packed to fp16 once per layer (Q = [qlat | q_pe], K =
 * the latent rows [c_kv | k_pe], 576 wide for GLM-5), then one fused tensor-core kernel
 * (cuk_mla_flash: scores, float32 online softmax over each query's selected keys, P V) whose
 * scores never leave the chip. The indexer:
 * S = q_idx k_idx^T (TF32, float32 data), then sc[t][j] = sum_h w[t][h] relu(S[t][h][j]) in head
 * order, from which cuk_idx_topk picks in float32 as before.
 *
 * Same conventions as cuk.h: C-linkage launchers that validate shapes on the host, enqueue on
 * `stream`, never synchronize or allocate. */
#ifndef G5_CUK_PREFILL_H
#define G5_CUK_PREFILL_H

#include <stdint.h>

#include "cuda/cuk.h"

#ifdef __cplusplus
extern "C" {
#endif

/* qb[t][h][0..kv_lora) = qlat[t][h], qb[t][h][kv_lora..kv_lora + rope) = q_pe[t][h], rounded to
 * et, for t < n_tok. q: [n_tok][n_head][nope + rope], qlat: [n_tok][n_head][kv_lora], qb: [n_tok]
 * [n_head][kv_lora + rope] of et. */
typedef struct cuk_mla_pack_q_args {
    const float *q, *qlat;
    int32_t n_tok, n_head, nope, rope, kv_lora;
    void *qb;
    uint32_t et;                 /* qb's type: CUK_BF16 or CUK_F16 (cuk_model.h) */
} cuk_mla_pack_q_args;
g5_status cuk_mla_pack_q(const cuk_mla_pack_q_args *a, cuk_stream stream, g5_error *err);

/* kb[j] = latent row j rounded to et, for j < n_pos: rows < fresh0 from the cache lat (lat_type: CUK_F32,
 * CUK_BF16, CUK_F16), rows fresh0 .. from fresh (float32 [n_pos - fresh0][w]); fresh NULL: all
 * from lat. w = kv_lora + rope; kb: [n_pos][w] of et. */
typedef struct cuk_mla_pack_k_args {
    const void *lat;
    uint32_t lat_type;
    const float *fresh;
    int64_t fresh0, n_pos;
    int32_t w;
    void *kb;
    uint32_t et;                 /* kb's type: CUK_BF16 or CUK_F16 */
} cuk_mla_pack_k_args;
g5_status cuk_mla_pack_k(const cuk_mla_pack_k_args *a, cuk_stream stream, g5_error *err);

/* Fused MLA attention of a prompt (cuda/attn_flash.cu): for each query row i = t * n_head + h
 * (t < n_tok, position pos0 + t), the keys j its token sees (n_sel[t] of them: all of 0 .. pos0 + t
 * when n_sel[t] = pos0 + t + 1, the dense case, else sel[t][0..n_sel[t])):
 * out[i] = sum_j p_j kb[j][0..kv_lora), p = softmax over j of scale * (qb[i] . kb[j]), with the
 * products in fp16 x fp16 -> float32 on the tensor cores, the softmax in float32 (online, exp of
 * the running maximum's differences), p rounded to fp16 before its product with the values and
 * the normalization in float32 at the end. qb: [n_tok * n_head][kv_lora + rope] fp16
 * (cuk_mla_pack_q), kb: [>= pos0 + n_tok][kv_lora + rope] fp16 (cuk_mla_pack_k), out: [n_tok *
 * n_head][kv_lora] float32. Built for kv_lora = 512, rope = 64 (GLM-5); any n_head. A count
 * outside [1, max_sel] or a listed key outside [0, pos0 + t] gives that token NaN rows. */
typedef struct cuk_mla_flash_args {
    const void *qb, *kb;
    int32_t n_tok, n_head, kv_lora, rope;
    int64_t pos0;
    const int32_t *sel;          /* [n_tok][ld_sel], device */
    int64_t ld_sel;
    const int32_t *n_sel;        /* [n_tok], device */
    int32_t max_sel;
    float scale;
    float *out;
    uint32_t et;                 /* qb's and kb's type: CUK_F16 */
} cuk_mla_flash_args;
g5_status cuk_mla_flash(const cuk_mla_flash_args *a, cuk_stream stream, g5_error *err);

/* sc[t][j] = sum over h < n_head, in order, of w[t][h] * max(0, s[(t - t0) * n_head + h][j]) for
 * t0 <= t < t0 + n_tok and j <= pos0 + t (later columns untouched): cuk_idx_scores' sum from a
 * product's head scores. s: [n_tok * n_head][ld_s], w: [>= t0 + n_tok][n_head], sc: [..][ld_sc]. */
typedef struct cuk_idx_reduce_args {
    const float *s;
    int64_t ld_s;
    const float *w;
    int32_t n_tok, n_head;
    int64_t t0, pos0;
    float *sc;
    int64_t ld_sc;
} cuk_idx_reduce_args;
g5_status cuk_idx_reduce(const cuk_idx_reduce_args *a, cuk_stream stream, g5_error *err);

/* ---- MoE prefill, fast mode: every local expert's tokens in one compact row list ---- */

/* From cuk_moe_group's lists (rows/rw [n_local][ld_rows], cnt [n_local]): the compact list
 * crow[i], crw[i] for i < sum(cnt), expert by expert ascending (expert e's rows start at
 * off_e = cnt[0] + .. + cnt[e - 1]), and inv[t][s] = the compact index of token t's slot s, for
 * the first slot of each local expert the token chose; every other entry of inv ([n_tok][top_k],
 * dense) is -1. ids: [n_tok][top_k] global ids. */
typedef struct cuk_moe_compact_args {
    const int32_t *ids;
    int32_t n_tok, top_k, exp0, n_local;
    const int32_t *rows;
    const float *rw;
    int64_t ld_rows;
    const int32_t *cnt;
    int32_t *crow;
    float *crw;
    int32_t *inv;
} cuk_moe_compact_args;
g5_status cuk_moe_compact(const cuk_moe_compact_args *a, cuk_stream stream, g5_error *err);

/* out[i][0..k) = x[rows[i]][0..k) rounded to et (CUK_BF16 or CUK_F16) for i < n (a row outside
 * [0, n_rows_x): NaN). out: [n][k] of et. */
g5_status cuk_gather_rows_16(const float *x, int64_t ldx, int64_t n_rows_x, const int32_t *rows, int64_t n,
                             int64_t k, void *out, uint32_t et, cuk_stream stream, g5_error *err);

/* y[i][c] = silu(g[i][c]) * u[i][c] (cuk_silu_mul's float32 value) rounded to et (CUK_BF16 or
 * CUK_F16) for i < n_rows, c < dim; g, u: [n_rows][dim] float32, y: [n_rows][dim] of et. */
g5_status cuk_silu_mul_16(const float *g, const float *u, int64_t n_rows, int64_t dim, void *y, uint32_t et,
                          cuk_stream stream, g5_error *err);

/* y[t][c] = sum over the slots s of token t with inv[t][s] >= 0, in slot order, of
 * crw[inv[t][s]] * d[inv[t][s]][c] (product and sum rounded separately, starting from 0), for
 * t < n_tok, c < m: the tokens' weighted expert outputs, one launch (cuk_scatter_add_rows'
 * arithmetic, experts in slot order). d: [..][m] float32, y: [n_tok][ldy]. */
g5_status cuk_moe_combine(const float *d, int64_t m, const int32_t *inv, const float *crw, int32_t n_tok,
                          int32_t top_k, float *y, int64_t ldy, cuk_stream stream, g5_error *err);

/* Rows of one CTA of cuk_moe_mm: an expert with c rows has ceil(c / CUK_MOE_MM_BM) row tiles. */
#define CUK_MOE_MM_BM 64

/* 1 when cuk_moe_mm takes weights of w_type with rows of k elements and n rows per expert:
 * Q4_K or Q5_K, k a multiple of 256, n of 8. */
int cuk_moe_mm_takes(uint32_t w_type, int64_t k, int64_t n);

/* Every local expert's product in one launch, weights decoded inside the tile (cuda/moe_mm.cu):
 * for each expert e < n_local with rows i in [off_e, off_e + cnt[e]) of the compact list
 * (off_e = cnt[0] + .. + cnt[e - 1], cuk_moe_compact's order):
 *   w1 NULL:  out[i][c] = sum_j W0_e[c][j] x[i][j]                    (float32 out)
 *   w1 set:   out[i][c] = fp16(silu(W0_e x_i)[c] * (W1_e x_i)[c])     (fp16 out; gate, up)
 * for c < n, with W rounded to fp16 from its float32 decode (the values cuk_dequant_rows_16
 * gives), x fp16, products on the tensor cores, float32 sums. W0, W1: [n_local][n][k] of w_type
 * (rows as in the blob); x: [sum cnt][k] fp16; out: [sum cnt][ldo]; x and out 16-byte aligned.
 * n_tiles: the sum over experts of ceil(cnt[e] / CUK_MOE_MM_BM) (the caller's count of cnt,
 * device array, which the kernel reads again; a count below 0 counts as 0). */
typedef struct cuk_moe_mm_args {
    uint32_t w_type;
    const void *w0, *w1;
    int64_t k, n;
    const void *x;
    const int32_t *cnt;
    int32_t n_local, n_tiles;
    void *out;
    int64_t ldo;
} cuk_moe_mm_args;
g5_status cuk_moe_mm(const cuk_moe_mm_args *a, cuk_stream stream, g5_error *err);

#ifdef __cplusplus
}
#endif

#endif
