/* The attention stage of the GPU forward pass (gm_attn_stage): MLA with the DSA indexer, after
 * runtime/cpu/attn.c line by line (its comments explain the math). W_UK / W_UV come from the
 * float32 kv_b (specs/numerics.md). Compiled to nothing unless G5_WITH_CUDA. */
#ifdef G5_WITH_CUDA

#include <math.h>
#include <string.h>

#include "cuda/cuk.h"
#include "cuda/cuk_head_gemv.h"
#include "cuda/cuk_model.h"
#include "cuda/cuk_q8.h"
#include "format/quant.h"
#include "runtime/gpu/gpu_int.h"
#include "runtime/gpu/gpu_linear.h"

/* Where a step's new indexer keys go: straight into a single sequence's cache, else rk->ikf. */
static float *idx_key_rows(rt_gpu_model *g, gl_rank *rk, uint32_t il, const fplan *pl) {
    const int64_t ID = g->hp.idx_head_dim;
    return pl->n_seg == 1 && !g->graph_bound ? gm_seq_idxk(g, pl->seq[0], rk->r, il) + (int64_t)pl->pos0[0] * ID
                                             : rk->ikf;
}

/* 1 where every token of the call sees at most idx_top_k keys: a graph step's bound, a batched
 * step's bucket (multi), else each sequence's last position + 1. The indexer then selects every
 * key without reading a score (cuk_idx_topk), so the step needs its keys (the cache) but not its
 * query and weight projections; a graph step's attention reads every key without a list
 * (cuk_mla_attend_args.sel NULL), so it needs no top-k launch either (the other paths keep theirs:
 * a debug call's out->topk reads the list; a graph step has none). */
static int idx_all_keys(const rt_gpu_model *g, const gl_rank *rk, const fplan *pl, int multi) {
    const uint64_t K = g->hp.idx_top_k;
    if (g->graph_bound) return g->graph_bound <= K;
    if (multi) return (uint64_t)rk->multi <= K;
    for (uint32_t i = 0; i < pl->n_seg; i++)
        if ((uint64_t)pl->pos0[i] + pl->len[i] > K) return 0;
    return 1;
}

/* The indexer's key and (unless every key is selected: all) weight projections of h (float32
 * input, so no shared input buffer: they may run as side work). */
static g5_status idx_key_proj(rt_gpu_model *g, gl_rank *rk, uint32_t il, const fplan *pl, int tc, int all,
                              g5_error *err) {
    const gl_layer *L = &rk->L[il];
    const int64_t E = g->hp.n_embd, ID = g->hp.idx_head_dim, IH = g->hp.idx_n_head;
    CK(gm_gemv_k(rk, &L->idx_k, rk->h, E, pl->n, idx_key_rows(g, rk, il, pl), ID, !tc, err));
    PMARK("attn", "idx_k gemv");
    if (!all) {
        CK(gm_gemv_k(rk, &L->idx_proj, rk->h, E, pl->n, rk->iw, IH, !tc, err));
        PMARK("attn", "idx_proj gemv");
    }
    return G5_OK;
}

/* The indexer's query projection (of a layer with an indexer). */
static g5_status idx_query(rt_gpu_model *g, gl_rank *rk, uint32_t il, const fplan *pl, int tc, const cuk_q8_act *qq,
                           const cuk_h16_act *qh, const cuk_q8_xf *xn, g5_error *err) {
    const glm5_hparams *hp = &g->hp;
    const gl_layer *L = &rk->L[il];
    const int64_t QL = hp->q_lora, IH = hp->idx_n_head, ID = hp->idx_head_dim;
    const uint32_t n = pl->n;
    /* the indexer's query from q_b's two int8 planes of qr where q_b took them (*qq, still in
     * rk->q8q, or made per CTA from q_a's rows as q_b's, xn) and its weights have an int8 kernel
     * (specs/numerics.md), else from float32 qr */
    if (xn)
        CK(gm_gemv_xf(rk, &L->idx_q_b, xn, 2, rk->iq, IH * ID, err));
    else if (qh->x && gm_h16_takes(rk, &L->idx_q_b, n)) /* qr's fp16 copy, made for q_b or for this */
        CK(gm_gemv_h16_in(rk, &L->idx_q_b, qh, n, rk->iq, IH * ID, err));
    else if (qq->planes == 2 && gm_q8x2_takes(rk, &L->idx_q_b, n))
        CK(gm_gemv_q8_in(rk, &L->idx_q_b, qq, n, rk->iq, IH * ID, err));
    else
        CK(gm_gemv_k(rk, &L->idx_q_b, rk->qr, QL, n, rk->iq, IH * ID, !tc, err));
    PMARK("attn", "idx_q_b gemv");
    return G5_OK;
}

static g5_status idx_prep(rt_gpu_model *g, gl_rank *rk, uint32_t il, const fplan *pl, int all, int qrot,
                          g5_error *err) {
    const glm5_hparams *hp = &g->hp;
    const gl_layer *L = &rk->L[il];
    const int64_t R = hp->qk_rope, IH = hp->idx_n_head, ID = hp->idx_head_dim;
    const int64_t H = rk->c->H_l, NOPE = hp->qk_nope;
    /* rope(q), layer_norm + rope(k), scale(w): one launch, the four kernels' bits; it also ropes
     * the attention's query rk->q unless the absorption does (qrot); every key selected (all): the
     * key (and rk->q) alone */
    const cuk_idx_prep_args ip = {.q = rk->iq, .k = idx_key_rows(g, rk, il, pl), .w = rk->iw,
                                  .k_norm_w = L->idx_k_norm, .k_norm_b = L->idx_k_norm_b, .n_tok = (int32_t)pl->n,
                                  .n_head = all ? 0 : (int32_t)IH, .dim = (int32_t)ID, .n_rot = (int32_t)R,
                                  .theta = hp->rope_theta, .pos = rk->pos, .eps = RT_IDX_NORM_EPS,
                                  .w_scale = (float)(1.0 / sqrt((double)ID * (double)IH)), .q2 = qrot ? NULL : rk->q,
                                  .tok_stride2 = H * (NOPE + R), .n_head2 = (int32_t)H,
                                  .head_stride2 = (int32_t)(NOPE + R), .rot_off2 = (int32_t)NOPE};
    CK(cuk_idx_prep(&ip, (cuk_stream)rk->st, err));
    PMARK("attn", "idx rope+norm+rope+scale, q rope (cuk_idx_prep)");
    return G5_OK;
}

/* A graph step's new latent and key rows into the sequence's caches, one launch */
static g5_status idx_cache_rows(rt_gpu_model *g, gl_rank *rk, uint32_t il, const fplan *pl,
                                cuk_cache_write_rows_args *cw, g5_error *err) {
    cw->key_new = rk->ikf;
    cw->key_w = g->hp.idx_head_dim;
    cw->key = gm_seq_idxk(g, pl->seq[0], rk->r, il);
    CK(cuk_cache_write_rows(cw, (cuk_stream)rk->st, err));
    return G5_OK;
}

/* The scores and top-k selection of the call's tokens into rk->sel and rk->n_sel: of a graph step
 * (g->graph_bound; its new latent and key rows written first, by *cw), of a batched decode step
 * (multi) or of each sequence in turn. */
static g5_status idx_select(rt_gpu_model *g, gl_rank *rk, uint32_t il, const fplan *pl, int tc, int multi, int all,
                            cuk_cache_write_rows_args *cw, g5_error *err) {
    const glm5_hparams *hp = &g->hp;
    const cuk_stream cs = (cuk_stream)rk->st;
    const int64_t R = hp->qk_rope, IH = hp->idx_n_head, ID = hp->idx_head_dim;
    const int64_t K = hp->idx_top_k, KVW = (int64_t)hp->kv_lora + R, mpb = rk->multi;
    const uint32_t n = pl->n, bound = g->graph_bound;
    const int one = pl->n_seg == 1;
    const cuk_seq_row *rows = multi ? rk->mrows + (size_t)il * n : NULL;
    /* the scores and selections of the call's tokens: bound, multi or per sequence below. While a
     * launch's tokens see at most K keys each (its bound, or its last position + 1, <= K), every
     * key is selected: the top-k writes 0 .. count - 1 without reading a score, so the scores
     * are not computed (the same selections) */
    cuk_idx_scores_args sa = {.q = rk->iq, .w = rk->iw, .n_tok = (int32_t)n, .n_head = (int32_t)IH,
                              .dim = (int32_t)ID, .sc = rk->sc};
    cuk_idx_topk_args ta = {.sc = rk->sc, .n_tok = (int32_t)n, .k = (int32_t)K, .sel = rk->sel, .ld_sel = K,
                            .n_sel = rk->n_sel};
    if (bound) { /* the latent and key rows in one launch, then the kernels' device-position forms */
        CK(idx_cache_rows(g, rk, il, pl, cw, err));
        sa.k = cw->key;
        sa.pos0_dev = ta.pos0_dev = rk->pos;
        sa.pos_bound = sa.ld_sc = ta.pos_bound = ta.ld_sc = bound;
        if (bound > K) CK(cuk_idx_scores_dev(&sa, cs, err));
        if (!all) CK(cuk_idx_topk_dev(&ta, cs, err)); /* all: the attention reads every key */
    }
    if (multi) { /* new rows, scores and selections of all sequences, a launch each */
        CK(cuk_cache_write_multi(rk->latf, KVW, g->lat_type, rk->ikf, ID, rows, (int32_t)n, cs, err));
        sa.rows = ta.rows = rows;
        sa.pos_bound = sa.ld_sc = ta.pos_bound = ta.ld_sc = mpb;
        if (mpb > K) {
            CK(cuk_idx_scores_multi(&sa, cs, err));
            PMARK("attn", "idx_scores");
        }
        CK(cuk_idx_topk_multi(&ta, cs, err)); /* every key (all) still listed: out->topk may read it */
        PMARK("attn", "idx_topk");
    }
    /* per sequence, in stream order: the score buffer is reused by each */
    for (uint32_t i = 0; i < pl->n_seg && !bound && !multi; i++) {
        float *kc = gm_seq_idxk(g, pl->seq[i], rk->r, il);
        const int64_t p0 = pl->pos0[i], P = p0 + pl->len[i], t0 = pl->row0[i];
        if (!one)
            CUK_CHECK(cudaMemcpyAsync(kc + p0 * ID, rk->ikf + t0 * ID, (size_t)pl->len[i] * ID * 4,
                               cudaMemcpyDeviceToDevice, rk->st));
        sa.q = rk->iq + t0 * IH * ID;
        sa.w = rk->iw + t0 * IH;
        sa.k = kc;
        sa.n_tok = ta.n_tok = (int32_t)pl->len[i];
        sa.pos0 = ta.pos0 = p0;
        sa.ld_sc = ta.ld_sc = P;
        ta.sel = rk->sel + t0 * K;
        ta.n_sel = rk->n_sel + t0;
        if (P > K) {
            CK(tc ? gl_lin_idx_scores(rk->lin, &sa, err) : cuk_idx_scores(&sa, cs, err)); /* tc: one sequence */
            PMARK("attn", "idx_scores");
        }
        CK(cuk_idx_topk(&ta, cs, err));
        PMARK("attn", "idx_topk");
    }
    return G5_OK;
}

/* ao = W_UV o_lat per head for the call's n rows: a prompt's TF32 product (tc), its per-head
 * GEMMs, or one launch for all heads. */
static g5_status attn_wuv(const glm5_hparams *hp, gl_rank *rk, const gl_layer *L, uint32_t n, int tc, g5_error *err) {
    const cuk_stream cs = (cuk_stream)rk->st;
    const int64_t KL = hp->kv_lora, NOPE = hp->qk_nope, V = hp->v_head, H = rk->c->H_l;
    if (tc) {
        CK(gl_lin_wuv(rk->lin, L->kvb + NOPE * KL, (NOPE + V) * KL, (int32_t)H, KL, V, rk->olat, n, rk->ao, err));
    } else if (gl_lin_use(rk->lin, n)) {
        for (int64_t h = 0; h < H; h++) {
            const dmat wuv = {QT_F32, L->kvb + (h * (NOPE + V) + NOPE) * KL, KL, V};
            CK(gm_gemv(rk, &wuv, rk->olat + h * KL, H * KL, n, rk->ao + h * V, H * V, err));
        }
    } else { /* every head's input converted in one launch (fast mode), not one per head */
        g5_status st;
        int64_t ld;
        uint32_t xt;
        const void *xin = gm_act_in(rk, rk->olat, H * KL, n, H * KL, &ld, &xt, 0, &st, err);
        if (st) return st;
        /* all heads in one launch (a row's bits independent of n: batched decode stays exact),
         * from kv_b's exact int8 form where the layer has it (wq): a quarter of the bytes, same bits */
        const cuk_head_gemv_args hg = {L->kvb + NOPE * KL, (NOPE + V) * KL, KL, (int32_t)H, (int32_t)V,
                                       (int32_t)KL, xin, xt, ld, KL, (int32_t)n, rk->ao, H * V, V,
                                       L->kq ? L->kq + NOPE * KL : NULL, L->ksv, V * (KL / 16), KL / 16};
        if (cuk_head_gemv_fits(&hg)) {
            CK(cuk_head_gemv(&hg, cs, err));
        } else {
            const int64_t es = xt == CUK_ACT_BF16 ? 2 : 4;
            for (int64_t h = 0; h < H; h++) {
                const dmat wuv = {QT_F32, L->kvb + (h * (NOPE + V) + NOPE) * KL, KL, V};
                CK(gm_gemv_in(rk, &wuv, (const uint8_t *)xin + h * KL * es, xt, ld, n, rk->ao + h * V, H * V, err));
            }
        }
    }
    return G5_OK;
}

int gm_attn_multi(const rt_gpu_model *g, const gl_rank *rk, uint32_t n) {
    const glm5_hparams *hp = &g->hp;
    const cuk_mla_dims dm = {(int32_t)n, (int32_t)rk->c->H_l, (int32_t)hp->qk_nope, (int32_t)hp->qk_rope,
                             (int32_t)hp->kv_lora};
    return cuk_mla_attend_multi_fits(&dm, g->lat_type) &&
           cuk_idx_multi_fits((int32_t)hp->idx_n_head, (int32_t)hp->idx_head_dim);
}

static g5_status attn_stage(rt_gpu_model *g, gl_rank *rk, uint32_t il, const fplan *pl, g5_error *err) {
    const glm5_hparams *hp = &g->hp;
    const gl_layer *L = &rk->L[il];
    const cuk_stream cs = (cuk_stream)rk->st;
    const int64_t E = hp->n_embd, QL = hp->q_lora, KL = hp->kv_lora, R = hp->qk_rope, NOPE = hp->qk_nope;
    const int64_t V = hp->v_head, H = rk->c->H_l, KVW = KL + R, IH = hp->idx_n_head, ID = hp->idx_head_dim;
    const int64_t K = hp->idx_top_k;
    const uint32_t n = pl->n;
    const int one = pl->n_seg == 1;
    const float eps = hp->rms_eps, theta = hp->rope_theta;
    /* fast mode, one sequence, many tokens: indexer scores, absorption, attention and W_UV as
     * tensor-core products (gpu_linear.h) */
    const int tc = one && !g->graph_bound && gl_lin_use(rk->lin, n) && gl_lin_fast(rk->lin);
    /* a graph step being captured (g->graph_bound): nothing below may depend on pl->pos0, which
     * only holds the capturing step's position */
    const uint32_t bound = g->graph_bound;
    if (bound && (!one || pl->row0[0] || il >= hp->n_layer_main || bound > pl->seq[0]->cap ||
                  (uint64_t)bound > rk->sc_cap))
        return g5_fail(err, G5_ERR_INTERNAL, "graph step: bound %u for %u segment(s), layer %u, capacity %u", bound,
                       pl->n_seg, il, pl->seq[0]->cap);
    /* a batched decode step whose attention kernels run once for all sequences */
    const cuk_mla_dims dm = {(int32_t)n, (int32_t)H, (int32_t)NOPE, (int32_t)R, (int32_t)KL};
    const int multi = rk->multi && !bound && cuk_mla_attend_multi_fits(&dm, g->lat_type) &&
                      (!L->has_idx || cuk_idx_multi_fits((int32_t)IH, (int32_t)ID));
    const cuk_seq_row *rows = multi ? rk->mrows + (size_t)il * n : NULL;
    const int64_t mpb = rk->multi;
    const int all = L->has_idx && idx_all_keys(g, rk, pl, multi); /* no indexer query, weights (or top-k) */
    /* one token: the absorption ropes the attention's query (cuk_mla_absorb_rotates) and runs on
     * the main chain right after q_b, so neither idx_prep nor a rope launch comes between q_b and
     * the attention. A graph step that selects every key (all) then needs the indexer only for its
     * key: its norm + rope and the cache writes follow idx_k on the side stream, and the critical
     * path is q_a, q_b, absorption, attention. The same kernels on the same inputs: the same bits. */
    const cuk_mla_dims d = {(int32_t)n, (int32_t)H, (int32_t)NOPE, (int32_t)R, (int32_t)KL};
    const int qrot = !tc && cuk_mla_absorb_rotates(&d);
    const int key_side = qrot && all && bound;
    CUK_CHECK(cudaSetDevice(rk->dev));
    /* q_a and kv_a read the same h: one two-plane quantization of it serves both, made by the
     * norm's launch (cuk_norm_q8) where its width allows */
    const int qa8 = gm_q8x2_takes(rk, &L->q_a, n), kva8 = gm_q8x2_takes(rk, &L->kv_a, n);
    cuk_q8_act hq = {0};
    CK(gm_norm_x_q8(rk, L->attn_norm, n, E, eps, qa8 || kva8 ? 2 : 0, &hq, err));
    PMARK("attn", "attn_norm (+ residual add, + int8 quantize of h)");
    /* a decode step's side work (gm_side_begin; on the GEMV paths, and not where products share
     * rk->xb's bf16 copy of h): the latent path (kv_a, its norm and RoPE, the cache writes) on the
     * side stream, the indexer's key and weight projections after it there or (from two tokens on)
     * on a third stream (gm_aux_begin), and idx_q_b on the third stream, run beside q_a, q_a_norm
     * and q_b; then the absorption beside the indexer's scores and selection. The same kernels on
     * the same inputs: the same bits as in one stream. */
    const int side = !tc && !gl_lin_use(rk->lin, n) && !rk->fast;
    CK(gm_side_begin(g, rk, side, err));
    if (kva8) CK(gm_gemv_q8_in(rk, &L->kv_a, &hq, n, rk->kv, KVW, err));
    else CK(gm_gemv(rk, &L->kv_a, rk->h, E, n, rk->kv, KVW, err));
    PMARK("attn", "kv_a gemv");
    CK(gm_side_point(rk, 1, err)); /* hq read: q_a_norm may overwrite rk->q8q */
    /* the new latents in float32: straight into the f32 cache of a single sequence, else staged
     * in rk->latf and copied (f32) or converted into each sequence's cache (a graph step: by
     * cuk_cache_write_rows at the positions in rk->pos, below); norm, copy of the rope part and
     * its RoPE in one launch */
    const cuk_stream ss = (cuk_stream)rk->st; /* the side stream from gm_side_begin to gm_side_end */
    const int direct = one && !bound && g->lat_type == CUK_F32;
    float *lat_new = direct ? (float *)(void *)(gm_seq_lat(g, pl->seq[0], rk->r, il) + (int64_t)pl->pos0[0] * KVW * 4)
                            : rk->latf;
    const cuk_norm_rope_args nr = {.x = rk->kv, .ldx = KVW, .w = L->kv_a_norm, .y = lat_new, .ldy = KVW, .n_rows = n,
                                   .dim = KL, .eps = eps, .n_rot = R, .theta = theta, .pos = rk->pos};
    CK(cuk_norm_rope(&nr, ss, err));
    /* a graph step's new rows (the keys too, with an indexer: idx_select) */
    cuk_cache_write_rows_args cw = {.lat_new = rk->latf, .lat_w = KVW, .lat_type = g->lat_type,
                                    .lat = bound ? gm_seq_lat(g, pl->seq[0], rk->r, il) : NULL,
                                    .cap = bound ? pl->seq[0]->cap : 0, .pos = rk->pos, .n_rows = n};
    if (bound && !L->has_idx) CK(cuk_cache_write_rows(&cw, ss, err));
    if (multi && !L->has_idx) CK(cuk_cache_write_multi(rk->latf, KVW, g->lat_type, NULL, 0, rows, (int32_t)n, ss, err));
    for (uint32_t i = 0; i < pl->n_seg && !direct && !bound && !multi; i++) {
        uint8_t *dst = gm_seq_lat(g, pl->seq[i], rk->r, il) + (int64_t)pl->pos0[i] * KVW * g->lat_es;
        const float *src = rk->latf + (int64_t)pl->row0[i] * KVW;
        if (g->lat_type == CUK_F32)
            CUK_CHECK(cudaMemcpyAsync(dst, src, (size_t)pl->len[i] * KVW * 4, cudaMemcpyDeviceToDevice, rk->st));
        else
            CK(cuk_convert(src, KVW, dst, g->lat_type, KVW, pl->len[i], KVW, ss, err));
    }
    PMARK("attn", "latent norm+rope+cache write");
    /* the indexer's key and weight projections of h: after the latent path on the side stream at
     * one token, on the third stream from two tokens on. There the side chain (kv_a, latent, idx_k,
     * idx_proj) was the step's longest; moving them gains 0.18 ms a step at batch 32 and 0.08 at 8
     * (H100), but moved at one token too they cost 0.01 there (bench/RESULTS.md, session 39): the
     * third stream's fork costs more than the chains' overlap gives. idx_q_b follows them there
     * (idx_query), and idx_prep reads their outputs after gm_aux_wait. */
    const int key_aux = side && n > 1;
    if (L->has_idx && !key_aux) CK(idx_key_proj(g, rk, il, pl, tc, all, err));
    if (key_side) {
        CK(idx_prep(g, rk, il, pl, all, qrot, err));
        CK(idx_cache_rows(g, rk, il, pl, &cw, err));
    }
    CK(gm_side_end(rk, err));
    if (L->has_idx && key_aux) {
        CK(gm_aux_begin(g, rk, 1, err));
        CK(idx_key_proj(g, rk, il, pl, tc, all, err));
        CK(gm_aux_end(rk, err));
    }
    /* qr feeds the indexer: float32 input on the GEMV path; bf16 on fast mode's tensor cores,
     * whose indexer still picks in float32 */
    if (qa8) CK(gm_gemv_q8_in(rk, &L->q_a, &hq, n, rk->qr, QL, err));
    else CK(gm_gemv_k(rk, &L->q_a, rk->h, E, n, rk->qr, QL, L->has_idx && !tc, err));
    PMARK("attn", "q_a gemv");
    CK(gm_side_wait(rk, 1, err));
    /* q_a_norm in place, with q_b's two-plane input quantized by the same launch (rk->q8q: h's
     * copy is no longer read) */
    const int qbh = gm_h16_takes(rk, &L->q_b, n), qb8 = !qbh && gm_q8x2_takes(rk, &L->q_b, n);
    cuk_q8_act qq = {0};
    cuk_h16_act qh = {0};
    const cuk_add_rms_norm_args qn = {.x = rk->qr, .ldx = QL, .w = L->q_a_norm, .y = rk->qr, .ldy = QL, .n_rows = n,
                                      .dim = QL, .eps = eps};
    /* qr in fp16 for q_b and the indexer's q_b where their weights have the fp16 kernel: made on
     * the main chain, before the third stream forks, and read by both; by the norm's launch where
     * no int8 copy is wanted */
    const int qrh = qbh || (L->has_idx && !all && gm_h16_takes(rk, &L->idx_q_b, n));
    /* one token whose q_b and indexer q_b both take two int8 planes of short rows (gm_xf_takes): no
     * norm launch, each GEMV norms and quantizes q_a's row per CTA with cuk_norm_q8's bits, so
     * rk->qr keeps q_a's output, which nothing else reads */
    const int qxn = qb8 && !qrh && gm_xf_takes(rk, &L->q_b, n, 2) && (uintptr_t)L->q_a_norm % 16 == 0 &&
                    (!L->has_idx || all ||
                     (gm_q8x2_takes(rk, &L->idx_q_b, n) && gm_xf_takes(rk, &L->idx_q_b, n, 2)));
    const cuk_q8_xf xn = {rk->qr, QL, L->q_a_norm, eps};
    if (!qxn) {
        if (qrh && !qb8) {
            CK(gm_norm_h16(rk, &qn, &qh, err));
        } else {
            CK(gm_norm_q8(rk, &qn, qb8 ? 2 : 0, &qq, err));
            if (qrh) CK(gm_h16_in(rk, rk->qr, QL, n, QL, &qh, err));
        }
        PMARK("attn", "q_a_norm (+ int8 or fp16 copy of qr)");
    }
    /* the indexer's query on the third stream, beside q_b and the side's key chain: it reads qq
     * (the lower half of rk->q8q) or qr, which nothing writes before the joins, and writes rk->iq,
     * which nothing reads before them; in order after q_b where the third stream is off */
    if (L->has_idx && !all) {
        CK(gm_aux_begin(g, rk, side, err));
        if (rk->aux == 1) CK(idx_query(g, rk, il, pl, tc, &qq, &qh, qxn ? &xn : NULL, err));
        CK(gm_aux_end(rk, err));
    }
    if (qxn) CK(gm_gemv_xf(rk, &L->q_b, &xn, 2, rk->q, H * (NOPE + R), err));
    else if (qbh) CK(gm_gemv_h16_in(rk, &L->q_b, &qh, n, rk->q, H * (NOPE + R), err));
    else if (qb8) CK(gm_gemv_q8_in(rk, &L->q_b, &qq, n, rk->q, H * (NOPE + R), err));
    else CK(gm_gemv_q8x2(rk, &L->q_b, rk->qr, QL, n, rk->q, H * (NOPE + R), err));
    PMARK("attn", "q_b gemv");
    if (L->has_idx && !all && rk->aux != 2) CK(idx_query(g, rk, il, pl, tc, &qq, &qh, qxn ? &xn : NULL, err));
    const cuk_mla_absorb_args ab = {.d = d, .q = rk->q, .kvb = L->kvb, .head_rows = (int32_t)(NOPE + V),
                                    .qlat = rk->qlat, .kq = L->kq, .ksk = L->ksk, .q_rot = qrot ? rk->q : NULL,
                                    .pos = rk->pos, .theta = theta};
    if (qrot) { /* reads q_b's output alone: beside the side and third streams' remaining work */
        CK(cuk_mla_absorb(&ab, cs, err));
        PMARK("attn", "mla_absorb (+ q rope)");
    }
    CK(gm_side_wait(rk, GM_SIDE_JOIN, err));
    CK(gm_aux_wait(rk, err));
    if (L->has_idx && !key_side) { /* q roped here unless the absorption did it */
        CK(idx_prep(g, rk, il, pl, all, qrot, err));
    } else if (!L->has_idx && !qrot) {
        const cuk_rope_args rq = {.x = rk->q, .n_tok = n, .tok_stride = H * (NOPE + R), .n_head = H,
                                  .head_stride = NOPE + R, .rot_off = NOPE, .n_rot = R, .theta = theta, .pos = rk->pos};
        CK(cuk_rope(&rq, cs, err));
        PMARK("attn", "q rope");
    }
    if (!qrot) {
        CK(gm_side_begin(g, rk, side && L->has_idx, err));
        CK(tc ? gl_lin_absorb(rk->lin, &ab, err) : cuk_mla_absorb(&ab, (cuk_stream)rk->st, err));
        PMARK("attn", "mla_absorb");
        CK(gm_side_end(rk, err));
    }
    if (L->has_idx && !key_side) CK(idx_select(g, rk, il, pl, tc, multi, all, &cw, err));
    CK(gm_side_wait(rk, GM_SIDE_JOIN, err));
    /* per sequence: this call's own tokens from their float32 latents (rk->latf), earlier ones
     * from the sequence's cache */
    const int nolist = bound && all; /* a graph step that selects every key: no list, no top-k launch */
    cuk_mla_attend_args at = {.d = d, .q = rk->q, .qlat = rk->qlat, .lat = gm_seq_lat(g, pl->seq[0], rk->r, il),
                              .lat_type = g->lat_type, .fresh = g->lat_type == CUK_F32 ? NULL : rk->latf,
                              .pos0_dev = rk->pos, .pos_bound = bound, .sel = nolist ? NULL : rk->sel,
                              .ld_sel = K, .n_sel = nolist ? NULL : rk->n_sel, .max_sel = (int32_t)K,
                              .scale = (float)(1.0 / sqrt((double)(NOPE + R))), .out = rk->olat,
                              .tc = (uint32_t)rk->attn_tc};
    if (bound) CK(cuk_mla_attend_dev(&at, cs, err));
    if (multi) {
        const cuk_attend_multi_args ma = {dm, rk->q, rk->qlat, g->lat_type,
                                          g->lat_type == CUK_F32 ? NULL : rk->latf, rows, mpb, rk->sel, K,
                                          rk->n_sel, (int32_t)K, (float)(1.0 / sqrt((double)(NOPE + R))), rk->olat,
                                          (uint32_t)rk->attn_tc};
        CK(cuk_mla_attend_multi(&ma, cs, err));
    }
    if (tc) { /* one sequence: the call's tokens are its last n positions */
        at.fresh0 = pl->pos0[0];
        at.n_pos = (int64_t)pl->pos0[0] + n;
        CK(gl_lin_mla_attend(rk->lin, &at, err));
    }
    for (uint32_t i = 0; i < pl->n_seg && !bound && !multi && !tc; i++) {
        const int64_t p0 = pl->pos0[i], P = p0 + pl->len[i], t0 = pl->row0[i];
        at.d.n_tok = (int32_t)pl->len[i];
        at.q = rk->q + t0 * H * (NOPE + R);
        at.qlat = rk->qlat + t0 * H * KL;
        at.lat = gm_seq_lat(g, pl->seq[i], rk->r, il);
        at.fresh = g->lat_type == CUK_F32 ? NULL : rk->latf + t0 * KVW;
        at.fresh0 = p0;
        at.n_pos = P;
        at.sel = rk->sel + t0 * K;
        at.n_sel = rk->n_sel + t0;
        at.out = rk->olat + t0 * H * KL;
        CK(cuk_mla_attend_fresh(&at, cs, err));
    }
    PMARK("attn", "mla_attend");
    CK(attn_wuv(hp, rk, L, n, tc, err));
    PMARK("attn", "W_UV gemv (all heads, one launch)");
    CK(gm_gemv_q8x2(rk, &L->o, rk->ao, H * V, n, rk->part, E, err));
    PMARK("attn", "attn_output gemv");
    rk->oa = rk->part;
    rk->ob = NULL;
    return G5_OK;
}

/* attn_stage, and after a failure the rank's main stream back in rk->st (the stage may have failed
 * between gm_side_begin and gm_side_end): every caller finds the streams as they were. */
g5_status gm_attn_stage(rt_gpu_model *g, gl_rank *rk, uint32_t il, const fplan *pl, g5_error *err) {
    const g5_status st = attn_stage(g, rk, il, pl, err);
    if (st) gm_side_reset(rk);
    return st;
}

#endif /* G5_WITH_CUDA */
