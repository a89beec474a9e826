/* CUDA kernels of the GLM-5 forward pass beyond cuk.h's GEMV/norm/RoPE set: row dequantization
 * (embedding lookup, kv_b to float32), SwiGLU, the MoE router, MLA absorbed attention over the
 * latent cache, and the DSA lightning indexer (scores, top-k).
 *
 * Same conventions as cuk.h: C-linkage launchers that validate every shape on the host
 * (G5_ERR_INVALID_ARG naming the argument), enqueue on `stream`, never synchronize, never
 * allocate, and report a CUDA error as G5_ERR_INTERNAL naming the call. A launcher with many
 * operands takes them in an args struct (NULL refused, naming the launcher); where several
 * launchers share one struct, each names the fields it reads and ignores the others. Indices that live in
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

typedef struct cuk_dequant_rows_args {
    uint32_t w_type;         /* ggml type of W: any type cuk_gemv_supported accepts */
    const void *w;           /* W: [n_rows_w][row_bytes] */
    int64_t k;               /* elements per row, a multiple of the type's block */
    int64_t n_rows_w;
    const int32_t *rows;     /* [n], device: the rows to take; NULL: rows 0 .. n - 1 */
    int64_t n;
    void *out;               /* [n][ldo]: float32 (cuk_dequant_rows) or out_type (_16) */
    uint32_t out_type;       /* cuk_dequant_rows_16 only: CUK_BF16 or CUK_F16 (cuk_dequant_rows
                                writes float32 whatever it holds) */
    int64_t ldo;             /* >= k */
} cuk_dequant_rows_args;

/* out[i][0..k) = row rows[i] of W dequantized to float32, for i < n. The results equal
 * format/quant.c's quant_dequantize bit for bit (same float operations, no fused multiply-add).
 * A row id outside [0, n_rows_w) gives a NaN row. */
g5_status cuk_dequant_rows(const cuk_dequant_rows_args *a, cuk_stream stream, g5_error *err);

/* cuk_dequant_rows with each value rounded once to out_type (nearest even) as it is stored: the
 * fast-mode prefill GEMM's weight tiles, one pass, no float32 copy. */
g5_status cuk_dequant_rows_16(const cuk_dequant_rows_args *a, cuk_stream stream, g5_error *err);

/* ---- elementwise ---- */

/* Storage types of the latent cache (and of converted activations). */
enum { CUK_F32 = 0, CUK_BF16 = 1, CUK_F16 = 2 };

/* y[r][i] = x[r][i] rounded to y_type (round to nearest even; CUK_F32 copies), for r < n_rows,
 * i < dim. y: [n_rows][ldy] of y_type, 4-byte aligned. */
g5_status cuk_convert(const float *x, int64_t ldx, void *y, uint32_t y_type, int64_t ldy,
                      int64_t n_rows, int64_t dim, cuk_stream stream, g5_error *err);

/* A step's cache writes at positions held in device memory (a CUDA-graph decode step, below):
 * for r < n_rows, row pos[r] of lat = lat_new[r] rounded as cuk_convert rounds, and, unless
 * key_new is NULL, row pos[r] of key = key_new[r]; one launch for both. A row whose pos[r] is
 * outside [0, cap) is not written. */
typedef struct cuk_cache_write_rows_args {
    const float *lat_new;    /* [n_rows][lat_w] float32 */
    int64_t lat_w;
    void *lat;               /* [cap][lat_w] of lat_type: the latent cache */
    uint32_t lat_type;       /* CUK_F32, CUK_BF16, CUK_F16 */
    const float *key_new;    /* [n_rows][key_w] float32, or NULL (no key rows) */
    int64_t key_w;
    float *key;              /* [cap][key_w] float32: the indexer key cache */
    int64_t cap;
    const int32_t *pos;      /* [n_rows], device */
    int64_t n_rows;
} cuk_cache_write_rows_args;
g5_status cuk_cache_write_rows(const cuk_cache_write_rows_args *a, cuk_stream stream, g5_error *err);

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
    int32_t *plan;          /* NULL, or (n_tok 1) where the same launch writes cuk_moe_plan's plan of
                               the token's ids and weights over n_expert experts
                               ([cuk_moe_plan_words(1, n_used)], device): the decode step's plan
                               without a launch of its own */
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

/* The exact int8 form of kv_b (decode's W_UK and W_UV bytes: 1.25 bytes an element, not 4),
 * made from the GGUF's own attn_k_b / attn_v_b where their type is one of deq_sub_i8's
 * (cuda/deq_sub.h: every element one rounded product of a scale and an integer). With
 * HR = nope + v rows a head, element (row h * HR + r, column c) of kv_b is the float32 product
 *   r < nope (W_UK):  ksk[(h * nope / 16 + r / 16) * kv_lora + c] * kq[(h * HR + r) * kv_lora + c]
 *   r >= nope (W_UV): ksv[(h * v + r - nope) * kv_lora / 16 + c / 16] * kq[(h * HR + r) * kv_lora + c]
 * (one __fmul_rn), the scales running along the source's own blocks: W_UK's down the rows (attn_k_b
 * rows are W_UK columns), W_UV's along them. cuk_kvb_exact writes the three arrays and compares
 * every product with the float32 kv_b the same weights gave (the CPU's dequantization): *n_bad is
 * the number of elements whose bits differ (0: the form is exact and the kernels may read it). */
typedef struct cuk_kvb_exact_args {
    uint32_t k_type, v_type; /* deq_sub_i8's types (cuk_kvb_exact_takes) */
    const void *k_b;         /* attn_k_b: [n_head * kv_lora] rows of nope elements */
    const void *v_b;         /* attn_v_b: [n_head * v] rows of kv_lora elements */
    int32_t n_head, nope, v, kv_lora; /* nope, kv_lora multiples of 32 and of their type's block */
    const float *kvb;        /* [n_head * (nope + v)][kv_lora]: the float32 kv_b to match */
    int8_t *kq;              /* out: [n_head * (nope + v)][kv_lora] */
    float *ksk;              /* out: [n_head][nope / 16][kv_lora] */
    float *ksv;              /* out: [n_head][v][kv_lora / 16] */
} cuk_kvb_exact_args;
int cuk_kvb_exact_takes(uint32_t type);
/* Synchronous (it reads the count back); G5_ERR_INVALID_ARG for shapes or types it does not take. */
g5_status cuk_kvb_exact(const cuk_kvb_exact_args *a, cuk_stream stream, uint64_t *n_bad, g5_error *err);

/* qlat[t][h][c] = sum over d < nope, in order, of q_nope[t][h][d] * W_UK[h][d][c], with
 * W_UK[h][d] = row h * head_rows + d of kvb (the kv_b layout: nope W_UK rows then v_head W_UV
 * rows per head). kq / ksk (optional, both or neither): kv_b's exact int8 form (cuk_kvb_exact,
 * head_rows = nope + v), read instead of kvb by the one-token launch: the same values, a quarter
 * of the bytes, the same bits. */
typedef struct cuk_mla_absorb_args {
    cuk_mla_dims d;
    const float *q;          /* [n_tok][n_head][nope + rope] */
    const float *kvb;        /* [n_head * head_rows][kv_lora] float32 */
    int32_t head_rows;       /* >= nope */
    float *qlat;             /* [n_tok][n_head][kv_lora] */
    const int8_t *kq;        /* optional: [n_head * head_rows][kv_lora] */
    const float *ksk;        /* with kq: [n_head][nope / 16][kv_lora] */
    float *q_rot;            /* optional, where cuk_mla_absorb_rotates: q itself, whose rope part
                                (nope .. nope + rope of each head) the launch also rotates in
                                place at position *pos, bit for bit cuk_rope: the attention's
                                query needs no RoPE launch of its own */
    const int32_t *pos;      /* with q_rot: [1], device */
    float theta;             /* with q_rot */
} cuk_mla_absorb_args;
g5_status cuk_mla_absorb(const cuk_mla_absorb_args *a, cuk_stream stream, g5_error *err);
/* 1 where cuk_mla_absorb takes q_rot: one token, nope a multiple of 32 up to 192 (its one-token
 * kernel), rope even, 2..128. */
int cuk_mla_absorb_rotates(const cuk_mla_dims *d);

/* Forward declaration: one sequence's caches and position (below, "several sequences"). */
typedef struct cuk_seq_row cuk_seq_row;

/* The operands of the one-sequence attention launchers: cuk_mla_attend and cuk_mla_attend_fresh
 * (positions from the host), cuk_mla_attend_dev (from device memory, below). */
typedef struct cuk_mla_attend_args {
    cuk_mla_dims d;
    const float *q;          /* [n_tok][n_head][nope + rope] */
    const float *qlat;       /* [n_tok][n_head][kv_lora] */
    const void *lat;         /* [>= n_pos][kv_lora + rope] of lat_type: the latent cache */
    uint32_t lat_type;       /* CUK_F32, CUK_BF16, CUK_F16 */
    const float *fresh;      /* _fresh, _dev: float32 rows [n_pos - fresh0][kv_lora + rope] of the
                                call's own positions, or NULL (lat alone); cuk_mla_attend: ignored */
    int64_t fresh0;          /* _fresh: the first position read from fresh (with fresh) */
    int64_t n_pos;           /* cuk_mla_attend, _fresh: key positions 0 .. n_pos - 1 */
    const int32_t *pos0_dev; /* _dev: [1], device: the first query token's position */
    int64_t pos_bound;       /* _dev: the caller's bound on pos0 + n_tok */
    const int32_t *sel;      /* [n_tok][ld_sel], device: selected key positions, ascending; or
                                NULL (n_sel too): token t (at position n_pos - n_tok + t, the
                                call's tokens being its last positions) attends every key 0 ..
                                its position, as the list 0, 1, .. (the indexer's selection while
                                a token sees <= idx_top_k keys) */
    int64_t ld_sel;          /* >= max_sel */
    const int32_t *n_sel;    /* [n_tok], device: how many of sel[t] to attend (NULL with sel) */
    int32_t max_sel;         /* 1..16384: the most any n_sel[t] (or n_pos without sel) may hold */
    float scale;
    float *out;              /* [n_tok][n_head][kv_lora] */
    uint32_t tc;             /* _fresh, _dev: 1 = fast mode's tensor-core kernel where it covers the
                                shape (below), 0 = the float32 kernels */
} cuk_mla_attend_args;

/* For each token and head, over the n_sel[t] key positions sel[t][0..] (ascending):
 *   score_j = (qlat . lat[s_j][0..kv_lora) + q_pe . lat[s_j][kv_lora..]) * scale,
 * with the cache elements of lat_type read as float32,
 *   p = softmax(score) (max-subtracted, sum in double),
 *   out = sum_j p_j lat[s_j][0..kv_lora), j ascending.
 * Reads d, q, qlat, lat, lat_type, n_pos, sel, ld_sel, n_sel, max_sel, scale, out. A position
 * outside [0, n_pos) or a count outside [1, max_sel] gives a NaN row. */
g5_status cuk_mla_attend(const cuk_mla_attend_args *a, cuk_stream stream, g5_error *err);

/* cuk_mla_attend with two key sources: positions < fresh0 are read from the cache lat
 * (lat_type), positions fresh0 .. n_pos - 1 from fresh (the latents a forward call has just
 * computed, before they were rounded into the cache). fresh NULL: lat alone (fresh0 ignored).
 * Within one call attention thus sees its own tokens at full precision whatever the cache type;
 * only later calls read them back rounded. Reads cuk_mla_attend's fields and fresh, fresh0. */
g5_status cuk_mla_attend_fresh(const cuk_mla_attend_args *a, cuk_stream stream, g5_error *err);

/* Fast mode (tc = 1, kv_lora 512, rope 64, a bf16 or f16 cache, the device's shared memory):
 * _fresh, _dev and _multi compute the same attention with fp16 queries, keys and probabilities
 * on the tensor cores (float32 products' sums, float32 softmax; the cache's bf16 rows and the
 * fresh float32 rows rounded to fp16), each token's keys split over a cluster of CTAs whose size
 * depends on n_head, max_sel and the device only: a token's bits are the same in all three.
 * specs/numerics.md has the order. Elsewhere tc is ignored. */

/* ---- DSA lightning indexer ---- */

/* The operands of the score launchers: cuk_idx_scores (position from the host), _dev (from
 * device memory) and _multi (several sequences), below. */
typedef struct cuk_idx_scores_args {
    const float *q;          /* [n_tok][n_head][dim] */
    const float *w;          /* [n_tok][n_head] */
    const float *k;          /* [>= pos0 + n_tok][dim]: the key cache (_multi: ignored, rows) */
    int32_t n_tok, n_head, dim;
    int64_t pos0;            /* cuk_idx_scores: the first query token's position */
    const int32_t *pos0_dev; /* _dev: [1], device */
    const cuk_seq_row *rows; /* _multi: [n_tok], device */
    int64_t pos_bound;       /* _dev, _multi */
    float *sc;               /* [n_tok][ld_sc] */
    int64_t ld_sc;           /* >= pos0 + n_tok (_dev, _multi: >= pos_bound) */
} cuk_idx_scores_args;

/* For token t (position pos0 + t) and every key position s <= pos0 + t:
 *   sc[t][s] = sum over h < n_head, in order, of w[t][h] * max(0, q[t][h] . k[s])
 * (the relu as the CPU's `if (d > 0) acc += w * d`); entries past pos0 + t are left untouched.
 * Reads q, w, k, n_tok, n_head, dim, pos0, sc, ld_sc. */
g5_status cuk_idx_scores(const cuk_idx_scores_args *a, cuk_stream stream, g5_error *err);

/* The operands of the top-k launchers: cuk_idx_topk, _dev and _multi, as the score launchers. */
typedef struct cuk_idx_topk_args {
    const float *sc;         /* [n_tok][ld_sc]: cuk_idx_scores' output */
    int64_t ld_sc;
    int32_t n_tok;
    int64_t pos0;            /* cuk_idx_topk */
    const int32_t *pos0_dev; /* _dev: [1], device */
    const cuk_seq_row *rows; /* _multi: [n_tok], device */
    int64_t pos_bound;       /* _dev, _multi */
    int32_t k;               /* keys to select, >= 1 */
    int32_t *sel;            /* [n_tok][ld_sel], device */
    int64_t ld_sel;          /* >= k */
    int32_t *n_sel;          /* [n_tok], device */
} cuk_idx_topk_args;

/* Top-k key selection from the scores: token t sees positions 0 .. p = pos0 + t. If p + 1 <= k
 * it attends all of them: sel[t] = 0 .. p, then -1 padding, n_sel[t] = p + 1. Otherwise the k
 * best positions by score (ties to the lower position; -0 equals +0), ascending, n_sel[t] = k.
 * Exact: no tolerance involved. Reads sc, ld_sc, n_tok, pos0, k, sel, ld_sel, n_sel. */
g5_status cuk_idx_topk(const cuk_idx_topk_args *a, cuk_stream stream, g5_error *err);

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
 * NaN attention rows (never a read or write out of bounds). Each reads its host-position form's
 * fields with pos0_dev and pos_bound in place of pos0 (the attention: of fresh0 and n_pos). */
g5_status cuk_idx_scores_dev(const cuk_idx_scores_args *a, cuk_stream stream, g5_error *err);
g5_status cuk_idx_topk_dev(const cuk_idx_topk_args *a, cuk_stream stream, g5_error *err);
g5_status cuk_mla_attend_dev(const cuk_mla_attend_args *a, cuk_stream stream, g5_error *err);

/* ---- several sequences in one launch (batched decode steps) ----
 *
 * A decode step of B sequences has one query token per sequence, each with its own caches and
 * position. These launchers take them from a table in device memory, rows[t] for query token t
 * (the caller writes it before the step): the sequence's latent and indexer key caches for this
 * layer and the token's position (keys 0 .. pos; its own new rows are written at pos). Each
 * token's outputs are computed with the same kernels, the same launch shape per token (the
 * attention's cluster size is the one-token launch's) and the same operations in the same order
 * as the one-token launchers at that position, so they are bit-identical to B one-token calls.
 * pos_bound: the caller's bound on every pos + 1 (the grid is shaped for it; ld_sc >= it). A
 * row whose pos is outside [0, min(cap, pos_bound)) writes nothing, a top-k count of 0 and a NaN
 * attention row. */
struct cuk_seq_row {
    void *lat;     /* [cap][kv_lora + rope] of the model's cache type */
    float *idxk;   /* [cap][idx dim], or NULL (a layer without indexer) */
    int32_t cap;   /* positions the two caches hold */
    int32_t pos;   /* the query token's position */
};

/* lat_new [n_tok][lat_w] rounded to lat_type into rows[t].lat at rows[t].pos, and (key_new
 * non-NULL) key_new [n_tok][key_w] into rows[t].idxk: cuk_cache_write_rows' rounding. */
g5_status cuk_cache_write_multi(const float *lat_new, int64_t lat_w, uint32_t lat_type, const float *key_new,
                                int64_t key_w, const cuk_seq_row *rows, int32_t n_tok, cuk_stream stream,
                                g5_error *err);
/* 1 if cuk_idx_scores_multi covers n_head x dim (at most 32 heads, dim a multiple of 4). */
int cuk_idx_multi_fits(int32_t n_head, int32_t dim);
/* cuk_idx_scores for token t over rows[t].idxk (keys 0 .. rows[t].pos). Reads q, w, rows,
 * n_tok, n_head, dim, pos_bound, sc, ld_sc. */
g5_status cuk_idx_scores_multi(const cuk_idx_scores_args *a, cuk_stream stream, g5_error *err);
/* cuk_idx_topk for token t over its rows[t].pos + 1 scores. Reads sc, ld_sc, n_tok, rows,
 * pos_bound, k, sel, ld_sel, n_sel. */
g5_status cuk_idx_topk_multi(const cuk_idx_topk_args *a, cuk_stream stream, g5_error *err);

/* cuk_mla_attend_fresh for several sequences: token t attends its selection over rows[t].lat;
 * fresh (non-NULL for a 16-bit cache) holds the tokens' own float32 rows [n_tok][kv_lora + rope],
 * row t standing for position rows[t].pos. */
typedef struct cuk_attend_multi_args {
    cuk_mla_dims d;          /* n_tok = the number of sequences */
    const float *q, *qlat;   /* [n_tok][n_head][nope + rope], [n_tok][n_head][kv_lora] */
    uint32_t lat_type;       /* CUK_F32, CUK_BF16, CUK_F16 */
    const float *fresh;
    const cuk_seq_row *rows; /* [n_tok], device */
    int64_t pos_bound;
    const int32_t *sel;      /* [n_tok][ld_sel], or NULL (n_sel too): every key of each sequence */
    int64_t ld_sel;
    const int32_t *n_sel;    /* [n_tok] */
    int32_t max_sel;
    float scale;
    float *out;              /* [n_tok][n_head][kv_lora] */
    uint32_t tc;             /* as cuk_mla_attend_args.tc */
} cuk_attend_multi_args;
/* 1 if cuk_mla_attend_multi covers the shape and cache type (the head-group attention kernel). */
int cuk_mla_attend_multi_fits(const cuk_mla_dims *d, uint32_t lat_type);
g5_status cuk_mla_attend_multi(const cuk_attend_multi_args *a, cuk_stream stream, g5_error *err);

/* The indexer's per-token preparation after its projections, in one launch (at decode four
 * latency-bound launches were ~11 us): q roped in place (cuk_rope with rot_off 0, n_rot, theta,
 * pos), k LayerNormed in place (k_norm_w, k_norm_b, eps) then roped the same way, w *= w_scale.
 * Bit for bit those four launches (cuk_rope, cuk_layer_norm, cuk_rope, cuk_scale), which it
 * falls back to for dim > 128. With q2, the attention's query is roped in the same launch: pairs
 * from rot_off2 of its n_head2 heads (head_stride2 apart, tokens tok_stride2 apart) at the same
 * positions, n_rot and theta, bit for bit cuk_rope on it. n_head 0: no indexer query or
 * weights (q and w unread, may be NULL): the key (and q2) alone, for a step whose tokens see at
 * most idx_top_k keys, where the indexer selects every key without a score. */
typedef struct cuk_idx_prep_args {
    float *q;                /* [n_tok][n_head][dim] */
    float *k;                /* [n_tok][dim] */
    float *w;                /* [n_tok][n_head] */
    const float *k_norm_w;   /* [dim] */
    const float *k_norm_b;   /* [dim] */
    int32_t n_tok, n_head, dim;
    int32_t n_rot;           /* even, 2..dim */
    float theta;
    const int32_t *pos;      /* [n_tok], device */
    float eps;
    float w_scale;
    float *q2;               /* NULL, or [n_tok][tok_stride2], not overlapping q, k or w */
    int64_t tok_stride2;
    int32_t n_head2, head_stride2, rot_off2;
} cuk_idx_prep_args;
g5_status cuk_idx_prep(const cuk_idx_prep_args *a, cuk_stream stream, g5_error *err);

#ifdef __cplusplus
}
#endif

#endif
