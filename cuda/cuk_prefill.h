/* The elementwise and row kernels of fast mode's tensor-core prefill attention and indexer
 * (cuda/attn_prefill.cu; runtime/gpu/gpu_linear.c runs them between cuBLAS products).
 *
 * MLA prefill attention as products: per chunk of query tokens, S = Q K^T (16-bit inputs, bf16
 * or fp16, f32 accumulation: Q = [qlat | q_pe] and K = the latent rows [c_kv | k_pe], 576 wide for GLM-5),
 * then a row softmax in float32 over each query's selected keys (all earlier keys while there
 * are at most index_topk of them, else the indexer's top-k), written as 16-bit probabilities with
 * zeros elsewhere, then O = P V (V = the first kv_lora columns of the latent rows). The indexer:
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

/* Row softmax of a chunk of query rows. Row i < n_rows is token t = t0 + i / n_head (of the
 * call; position pos0 + t) and sees keys 0 .. pos0 + t; n_sel[t] of them, listed in
 * sel[t][0..n_sel[t]) (all of them when n_sel[t] = pos0 + t + 1, the dense case). For the
 * selected keys j: p_j = exp(scale s_j - max) / sum (float32), written as et to pb[i][j];
 * every other column of pb[i][0..n_cols) is 0. s: [n_rows][ld] float32, pb: [n_rows][ld] of et,
 * n_cols <= ld. A count outside [1, max_sel] or a position past pos0 + t gives a NaN row. */
typedef struct cuk_mla_softmax_args {
    const float *s;
    void *pb;
    int64_t ld, n_cols;
    int32_t n_rows, n_head;
    int64_t t0, pos0;
    const int32_t *sel;          /* [n_tok][ld_sel], device */
    int64_t ld_sel;
    const int32_t *n_sel;        /* [n_tok], device */
    int32_t max_sel;
    float scale;
    uint32_t et;                 /* pb's type: CUK_BF16 or CUK_F16 */
} cuk_mla_softmax_args;
g5_status cuk_mla_softmax(const cuk_mla_softmax_args *a, cuk_stream stream, g5_error *err);

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

#ifdef __cplusplus
}
#endif

#endif
