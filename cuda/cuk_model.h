/* CUDA kernels of the GLM-5 forward pass beyond cuk.h's GEMV/norm/RoPE set: row dequantization
 * (embedding lookup, kv_b to float32), SwiGLU, the MoE router, MLA absorbed attention over the
 * latent cache, and the DSA lightning indexer (scores, top-k).
 *
 * Same conventions as cuk.h: C-linkage launchers that validate every shape on the host
 * (G5_ERR_INVALID_ARG naming the argument), enqueue on `stream`, never synchronize, never
 * allocate, and report a CUDA error as G5_ERR_INTERNAL naming the call. Indices that live in
 * device memory (token ids, expert ids, selected key positions) cannot be checked on the host:
 * an out-of-range one turns the affected output row into NaN rather than reading out of bounds.
 *
 * The arithmetic mirrors the CPU reference (runtime/cpu/cpu_ops.c, attn.c, model.c) operation for
 * operation where that is cheap (separately rounded multiplies and adds, the same summation
 * order along the reduced axis, double-precision softmax sums), so the GPU's precise mode differs
 * from the CPU only by the GEMV kernels' accumulation order and by the device's expf. */
#ifndef G5_CUK_MODEL_H
#define G5_CUK_MODEL_H

#include <stdint.h>

#include "cuda/cuk.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- dequantization ---- */

/* out[i][0..k) = row rows[i] of W dequantized to float32, for i < n (rows == NULL: row i).
 * W: [n_rows_w][row_bytes] of w_type (any type cuk_gemv_supported accepts), k elements per row
 * (a multiple of the type's block). The results equal format/quant.c's quant_dequantize bit for
 * bit (same float operations, no fused multiply-add). A row id outside [0, n_rows_w) gives a
 * NaN row. out: [n][ldo], ldo >= k. */
g5_status cuk_dequant_rows(uint32_t w_type, const void *w, int64_t k, int64_t n_rows_w,
                           const int32_t *rows, int64_t n, float *out, int64_t ldo,
                           cuk_stream stream, g5_error *err);

/* cuk_dequant_rows with each value rounded once to out_type (CUK_BF16 or CUK_F16, nearest even)
 * as it is stored: the fast-mode prefill GEMM's weight tiles, one pass, no float32 copy.
 * out: [n][ldo] of out_type. */
g5_status cuk_dequant_rows_16(uint32_t w_type, const void *w, int64_t k, int64_t n_rows_w,
                              const int32_t *rows, int64_t n, void *out, uint32_t out_type, int64_t ldo,
                              cuk_stream stream, g5_error *err);

/* ---- elementwise ---- */

/* Storage types of the latent cache (and of converted activations). */
enum { CUK_F32 = 0, CUK_BF16 = 1, CUK_F16 = 2 };

/* y[r][i] = x[r][i] rounded to y_type (round to nearest even; CUK_F32 copies), for r < n_rows,
 * i < dim. y: [n_rows][ldy] of y_type, 4-byte aligned. */
g5_status cuk_convert(const float *x, int64_t ldx, void *y, uint32_t y_type, int64_t ldy,
                      int64_t n_rows, int64_t dim, cuk_stream stream, g5_error *err);

/* A step's cache writes at positions held in device memory (a CUDA-graph decode step, below):
 * for r < n_rows, row pos[r] of lat ([cap][lat_w] of lat_type) = lat_new[r] ([n_rows][lat_w]
 * float32) rounded as cuk_convert rounds, and, unless key_new is NULL, row pos[r] of key
 * ([cap][key_w] float32) = key_new[r] ([n_rows][key_w]); one launch for both. pos: [n_rows],
 * device; a row whose pos[r] is outside [0, cap) is not written. */
g5_status cuk_cache_write_rows(const float *lat_new, int64_t lat_w, void *lat, uint32_t lat_type,
                               const float *key_new, int64_t key_w, float *key, int64_t cap,
                               const int32_t *pos, int64_t n_rows, cuk_stream stream, g5_error *err);

/* y[r][i] = silu(g[r][i]) * u[r][i], silu(v) = v / (1 + exp(-v)); y may equal g or u. */
g5_status cuk_silu_mul(const float *g, int64_t ldg, const float *u, int64_t ldu, float *y,
                       int64_t ldy, int64_t n_rows, int64_t dim, cuk_stream stream,
                       g5_error *err);

/* x[i] *= s for i < n. */
g5_status cuk_scale(float *x, int64_t n, float s, cuk_stream stream, g5_error *err);

/* ---- MoE routing ---- */

typedef struct cuk_route_args {
    float *logits;          /* [n_tok][ld_logits], device; overwritten with the gating scores */
    int64_t ld_logits;      /* >= n_expert */
    const float *bias;      /* [n_expert] selection bias (exp_probs_b), or NULL */
    int32_t n_tok;
    int32_t n_expert;       /* 1..1024 */
    int32_t n_used;         /* experts per token, 1..min(n_expert, 64) */
    int32_t n_group;        /* expert groups (n_expert % n_group == 0) */
    int32_t topk_group;     /* groups kept, 1..n_group */
    int32_t gating;         /* 1: softmax, otherwise sigmoid */
    int32_t norm;           /* normalize the chosen weights to sum 1 */
    float scale;            /* routed scaling factor, applied last */
    int32_t *ids;           /* [n_tok][n_used] chosen experts, ascending */
    float *wts;             /* [n_tok][n_used] their weights */
} cuk_route_args;

/* For each token, runtime/cpu/model.c's rt_moe_route: scores = sigmoid (or softmax) of the logits;
 * choice = score + bias; the topk_group best groups (a group scores the sum of its two best
 * choices, ties to the lower index) are eligible; the n_used best eligible experts by choice
 * (ties to the lower index), in ascending order; weights = unbiased scores, normalized (sum in
 * double) if norm, times scale. */
g5_status cuk_moe_route(const cuk_route_args *a, cuk_stream stream, g5_error *err);

/* Expert placement (whole experts per rank): ids_out = ids - exp0 where exp0 <= ids <
 * exp0 + n_local, with the weight kept; elsewhere id 0 with weight 0 (the expert is another
 * rank's). cnt = n_tok * n_used elements. */
g5_status cuk_moe_localize(const int32_t *ids, const float *wts, int64_t cnt, int32_t exp0,
                           int32_t n_local, int32_t *ids_out, float *wts_out, cuk_stream stream,
                           g5_error *err);

/* ---- MLA (absorbed) ---- */

/* Geometry shared by the MLA launchers. Per token t and head h:
 *   q    [n_tok][n_head][nope + rope]: q_nope then the roped q_pe
 *   qlat [n_tok][n_head][kv_lora]:     absorbed queries
 *   lat  [n_pos][kv_lora + rope]:      the latent cache (normalized latent, roped k_pe)
 *   out  [n_tok][n_head][kv_lora]:     attention output in the latent space */
typedef struct cuk_mla_dims {
    int32_t n_tok, n_head;
    int32_t nope, rope, kv_lora;
} cuk_mla_dims;

/* qlat[t][h][c] = sum over d < nope, in order, of q_nope[t][h][d] * W_UK[h][d][c], with
 * W_UK[h][d] = row h * head_rows + d of kvb ([n_head * head_rows][kv_lora] float32, the kv_b
 * layout: nope W_UK rows then v_head W_UV rows per head). */
g5_status cuk_mla_absorb(const cuk_mla_dims *d, const float *q, const float *kvb,
                         int32_t head_rows, float *qlat, cuk_stream stream, g5_error *err);

/* For each token and head, over the n_sel[t] key positions sel[t][0..] (ascending):
 *   score_j = (qlat . lat[s_j][0..kv_lora) + q_pe . lat[s_j][kv_lora..]) * scale,
 * with the cache elements of lat_type (CUK_F32, CUK_BF16, CUK_F16) read as float32,
 *   p = softmax(score) (max-subtracted, sum in double),
 *   out = sum_j p_j lat[s_j][0..kv_lora), j ascending.
 * sel: [n_tok][ld_sel] (ld_sel >= 1, at most max_sel <= ld_sel read per token), n_sel: [n_tok]
 * (device). A position outside [0, n_pos) or a count outside [1, max_sel] gives a NaN row. */
g5_status cuk_mla_attend(const cuk_mla_dims *d, const float *q, const float *qlat,
                         const void *lat, uint32_t lat_type, int64_t n_pos, const int32_t *sel,
                         int64_t ld_sel,
                         const int32_t *n_sel, int32_t max_sel, float scale, float *out,
                         cuk_stream stream, g5_error *err);

/* cuk_mla_attend with two key sources: positions < fresh0 are read from the cache lat
 * (lat_type), positions fresh0 .. n_pos - 1 from fresh, float32 [n_pos - fresh0][kv_lora + rope]
 * (the latents a forward call has just computed, before they were rounded into the cache).
 * fresh NULL: lat alone (fresh0 ignored). Within one call attention thus sees its own tokens at
 * full precision whatever the cache type; only later calls read them back rounded. */
g5_status cuk_mla_attend_fresh(const cuk_mla_dims *d, const float *q, const float *qlat,
                               const void *lat, uint32_t lat_type, const float *fresh,
                               int64_t fresh0, int64_t n_pos, const int32_t *sel, int64_t ld_sel,
                               const int32_t *n_sel, int32_t max_sel, float scale, float *out,
                               cuk_stream stream, g5_error *err);

/* ---- DSA lightning indexer ---- */

/* For token t (position pos0 + t) and every key position s <= pos0 + t:
 *   sc[t][s] = sum over h < n_head, in order, of w[t][h] * max(0, q[t][h] . k[s])
 * (the relu as the CPU's `if (d > 0) acc += w * d`). q: [n_tok][n_head][dim], w:
 * [n_tok][n_head], k: [>= pos0 + n_tok][dim], sc: [n_tok][ld_sc] with ld_sc >= pos0 + n_tok;
 * entries past pos0 + t are left untouched. */
g5_status cuk_idx_scores(const float *q, const float *w, const float *k, int32_t n_tok,
                         int32_t n_head, int32_t dim, int64_t pos0, float *sc, int64_t ld_sc,
                         cuk_stream stream, g5_error *err);

/* Top-k key selection from the scores: token t sees positions 0 .. p = pos0 + t. If p + 1 <= k
 * it attends all of them: sel[t] = 0 .. p, then -1 padding, n_sel[t] = p + 1. Otherwise the k
 * best positions by score (ties to the lower position; -0 equals +0), ascending, n_sel[t] = k.
 * sel: [n_tok][ld_sel], ld_sel >= k. Exact: no tolerance involved. */
g5_status cuk_idx_topk(const float *sc, int64_t ld_sc, int32_t n_tok, int64_t pos0, int32_t k,
                       int32_t *sel, int64_t ld_sel, int32_t *n_sel, cuk_stream stream,
                       g5_error *err);

/* ---- positions in device memory (CUDA-graph decode steps) ----
 *
 * A CUDA graph replays its kernels with the arguments they were captured with, so a decode step
 * that is recorded once and replayed at later positions cannot pass its position as a host
 * argument. These launchers take it from device memory instead: pos0_dev[0] is the first query
 * token's position (pos0 of the launchers above), read by the kernels when they run, and
 * everything else follows from it as above (n_pos = pos0 + n_tok key positions; the attention's
 * fresh rows, if any, are the call's own n_tok tokens: fresh0 = pos0). The launch shape (grid,
 * cluster size, which kernel) is made for pos_bound key positions instead of pos0 + n_tok, the
 * bound the caller guarantees: pos0 + n_tok <= pos_bound (the host checks it when it captures;
 * ld_sc >= pos_bound). The kernels are those of the host-position launchers and compute each
 * output with the same operations in the same order, so the results are bit-identical to theirs
 * at the same position; a shape made for more positions only adds blocks that find nothing to
 * do, and the top-k result does not depend on its cluster size (the selection is exact). A
 * device position outside [0, pos_bound - n_tok] writes no scores, a top-k count of 0, and
 * NaN attention rows (never a read or write out of bounds). */
g5_status cuk_idx_scores_dev(const float *q, const float *w, const float *k, int32_t n_tok,
                             int32_t n_head, int32_t dim, const int32_t *pos0_dev, int64_t pos_bound,
                             float *sc, int64_t ld_sc, cuk_stream stream, g5_error *err);
g5_status cuk_idx_topk_dev(const float *sc, int64_t ld_sc, int32_t n_tok, const int32_t *pos0_dev,
                           int64_t pos_bound, int32_t k, int32_t *sel, int64_t ld_sel, int32_t *n_sel,
                           cuk_stream stream, g5_error *err);
g5_status cuk_mla_attend_dev(const cuk_mla_dims *d, const float *q, const float *qlat,
                             const void *lat, uint32_t lat_type, const float *fresh,
                             const int32_t *pos0_dev, int64_t pos_bound, const int32_t *sel,
                             int64_t ld_sel, const int32_t *n_sel, int32_t max_sel, float scale,
                             float *out, cuk_stream stream, g5_error *err);

/* The indexer's per-token preparation after its projections, in one launch (at decode four
 * latency-bound launches were ~11 us): q [n_tok][n_head][dim] roped in place (cuk_rope with
 * rot_off 0, n_rot, theta, pos), k [n_tok][dim] LayerNormed in place (k_norm_w, k_norm_b [dim],
 * eps) then roped the same way, w [n_tok][n_head] *= w_scale. Bit for bit those four launches
 * (cuk_rope, cuk_layer_norm, cuk_rope, cuk_scale), which it falls back to for dim > 128. n_rot
 * even, 2..dim. */
g5_status cuk_idx_prep(float *q, float *k, float *w, const float *k_norm_w, const float *k_norm_b,
                       int32_t n_tok, int32_t n_head, int32_t dim, int32_t n_rot, float theta,
                       const int32_t *pos, float eps, float w_scale, cuk_stream stream, g5_error *err);

#ifdef __cplusplus
}
#endif

#endif
