/* The FFN stage of the GPU forward pass (gm_ffn_stage): the dense FFN, and the MoE's router,
 * routing, routed experts (plan groups of the GEMV path or the prefill GEMMs, gpu_linear.h) and
 * shared expert, after runtime/cpu/model.c (its comments explain the math). Compiled to nothing
 * unless G5_WITH_CUDA. */
#ifdef G5_WITH_CUDA

#include <cuda_runtime_api.h>
#include <string.h>

#include "cuda/cuk.h"
#include "cuda/cuk_gemv_wide.h"
#include "cuda/cuk_model.h"
#include "cuda/cuk_q8.h"
#include "runtime/gpu/gpu_int.h"
#include "runtime/gpu/gpu_linear.h"

/* The routed experts' tensor-core kernels (cuk_moe_*_q8t: an expert's weights read once for up to 8
 * of its pairs, where the dp4a kernels read them once per 4 and repeat the integer work per pair)
 * for calls of at least MOE_Q8T_MIN_TOK tokens; the same bits either way (cuda/cuk_q8.h). Measured
 * (H100, bench/RESULTS.md session 29, the xs form): at 8 tokens bench_q8 gate+up 260.1 against
 * 266.2 us (dp4a), down 157.9 against 178.0; at 16 331.2 against 435.2, 202.0 against 282.2.
 * Session 28's L1 form lost at 8 tokens (280.7, 183.4). */
#define MOE_Q8T_MIN_TOK 8
static int moe_q8t_for(uint32_t type, int64_t k, uint32_t n) {
    return n >= MOE_Q8T_MIN_TOK && cuk_moe_q8t_takes(type, k, 1);
}

/* Which of a MoE layer's gate / up products take int8 inputs of h at n rows (bit 0: the routed
 * experts, bit 1: the shared expert's gate and up); 0 on the prefill GEMM path. */
static int moe_h_q8(const gl_rank *rk, const gl_layer *L, int64_t E, uint32_t n) {
    const dmat eg = {L->exp_type, L->exp_gate, E, rk->c->ffe_l};
    if (gl_lin_use(rk->lin, n)) return 0;
    return gm_q8_takes(rk, &eg, n) |
           (L->sh_contrib && gm_q8_takes(rk, &L->sh_gate, n) && L->sh_up.type == L->sh_gate.type) << 1;
}

/* The MoE products of a decode step (or a short call) from rk->h and, where hq8 (the stage's
 * moe_h_q8) says, its one-plane int8 copy *hq (made with the norm): the shared expert's gate and
 * up (unless sh_done: queued as side work, whose point 1 comes before gate*up overwrites *hq),
 * then the routed experts by plan group (cuda/cuk.h; planned: rk->mplan already holds the one
 * token's plan, made by the routing launch), their down products summed over slots into rk->moe.
 * Fast mode: int8 inputs for every product whose type has an int8 kernel (the roles of
 * specs/numerics.md), bf16 for the others; precise: float32. */
static g5_status moe_gemv_path(rt_gpu_model *g, gl_rank *rk, const gl_layer *L, const int32_t *ids,
                               const float *wts, uint32_t n, int hq8, const cuk_q8_act *hq_in, int sh_done,
                               int planned, g5_error *err) {
    const glm5_hparams *hp = &g->hp;
    const rt_rank_tensors *c = rk->c;
    const cuk_stream cs = (cuk_stream)rk->st;
    const int64_t E = hp->n_embd, U = hp->n_expert_used, FE = c->ffe_l, SL = L->sh_l;
    const char *const S = "moe";
    const dmat ed = {L->exp_down_type, L->exp_down, FE, E};
    const int q8_gu = hq8 & 1, q8_sh = hq8 >> 1, q8_dn = gm_q8_takes(rk, &ed, n);
    g5_status st;
    int64_t ld = E;
    uint32_t xt = CUK_ACT_F32;
    const void *xin = rk->h;
    const cuk_q8_act hq = *hq_in;
    if (!q8_gu || (L->sh_contrib && !q8_sh)) {
        /* h converted once (fast mode) for the products without int8 kernels; runs before rk->xb is
         * reused for the routed down's input */
        xin = gm_act_in(rk, rk->h, E, n, E, &ld, &xt, 0, &st, err);
        if (st) return st;
        if (rk->fast) PMARK(S, "bf16 convert of h");
    }
    if (L->sh_contrib && !sh_done) {
        if (q8_sh) {
            CK(gm_gemv_q8_pair_in(rk, &L->sh_gate, &L->sh_up, &hq, n, rk->ga, rk->gb, SL, err));
            PMARK(S, "shared gate + up gemv (int8 input)");
        } else {
            CK(gm_gemv_in(rk, &L->sh_gate, xin, xt, ld, n, rk->ga, SL, err));
            PMARK(S, "shared gate gemv");
            CK(gm_gemv_in(rk, &L->sh_up, xin, xt, ld, n, rk->gb, SL, err));
            PMARK(S, "shared up gemv");
        }
    }
    /* tokens in chunks of GM_MOE_CHUNK (a plan's pair limit and the size of rk->mpart); every
     * chunk's gate_up runs before gu is converted into rk->xb (or rk->q8q), which holds the input
     * until then */
    const size_t xs = xt == CUK_ACT_BF16 ? 2 : 4;
    const int64_t pw = cuk_moe_plan_words(GM_MOE_CHUNK, (int32_t)U);
    for (uint32_t t0 = 0; t0 < n; t0 += GM_MOE_CHUNK) {
        const uint32_t nc = n - t0 < GM_MOE_CHUNK ? n - t0 : GM_MOE_CHUNK;
        int32_t *plan = rk->mplan + (int64_t)(t0 / GM_MOE_CHUNK) * pw;
        const cuk_moe_plan_args pa = {ids + (int64_t)t0 * U, wts + (int64_t)t0 * U, (int32_t)nc, (int32_t)U,
                                      U, U, (int32_t)c->n_exp_l, plan};
        if (!planned) { /* else the routing launch wrote it (ffn_stage) */
            CK(cuk_moe_plan(&pa, cs, err));
            PMARK(S, "moe_plan");
        }
        if (q8_gu) {
            const cuk_moe_gate_up_q8_args gu = {
                L->exp_type, L->exp_gate, L->exp_up, E, FE, (int32_t)c->n_exp_l, ids + (int64_t)t0 * U, (int32_t)U, U,
                gm_q8_rows(&hq, t0), (int32_t)nc,
                rk->gu + (int64_t)t0 * U * FE, FE, plan};
            CK(moe_q8t_for(L->exp_type, E, nc) ? cuk_moe_gate_up_q8t(&gu, cs, err) : cuk_moe_gate_up_q8(&gu, cs, err));
            PMARK(S, "moe_gate_up (int8 input)");
        } else {
            cuk_moe_gate_up_args gu = {L->exp_type, L->exp_gate, L->exp_up, E, FE, (int32_t)c->n_exp_l,
                                       ids + (int64_t)t0 * U, (int32_t)U, U,
                                       (const uint8_t *)xin + (size_t)t0 * (size_t)ld * xs, xt, ld, (int32_t)nc,
                                       rk->gu + (int64_t)t0 * U * FE, FE, plan};
            CK(cuk_moe_gate_up(&gu, cs, err));
            PMARK(S, "moe_gate_up");
        }
    }
    const void *hin = NULL;
    cuk_q8_act gq = {0};
    /* the dp4a down kernel quantizes gate*up itself where it can (its CTAs stage the rows they
     * read, with cuk_q8_quantize's bits): one launch less between gate_up and down */
    const uint32_t n1 = n < GM_MOE_CHUNK ? n : GM_MOE_CHUNK; /* the first chunk's tokens */
    const int dn_hf = q8_dn && !moe_q8t_for(L->exp_down_type, FE, n1) &&
                      cuk_moe_down_q8_hf_takes(L->exp_down_type, FE, (int32_t)n1);
    if (q8_dn) {
        CK(gm_side_wait(rk, 1, err)); /* the shared expert's gate and up have read h's copy */
        if (!dn_hf) {
            CK(gm_q8_in(rk, rk->gu, FE, (int64_t)n * U, FE, 1, &gq, err));
            PMARK(S, "int8 quantize of gate*up");
        }
    } else {
        hin = gm_act_in(rk, rk->gu, FE, (int64_t)n * U, FE, &ld, &xt, 0, &st, err);
        if (st) return st;
        if (rk->fast) PMARK(S, "bf16 convert of gate*up");
    }
    const size_t hs = xt == CUK_ACT_BF16 ? 2 : 4;
    for (uint32_t t0 = 0; t0 < n; t0 += GM_MOE_CHUNK) {
        const uint32_t nc = n - t0 < GM_MOE_CHUNK ? n - t0 : GM_MOE_CHUNK;
        const int32_t *plan = rk->mplan + (int64_t)(t0 / GM_MOE_CHUNK) * pw;
        if (q8_dn) {
            const int64_t p0 = (int64_t)t0 * U;
            const cuk_moe_down_q8_args dn = {L->exp_down_type, L->exp_down, FE, E, (int32_t)c->n_exp_l,
                                             ids + (int64_t)t0 * U, wts + (int64_t)t0 * U, (int32_t)U, U, U,
                                             dn_hf ? (cuk_q8_act){0} : gm_q8_rows(&gq, p0), (int32_t)nc,
                                             rk->moe + (int64_t)t0 * E, E, plan, rk->mpart, E,
                                             dn_hf ? rk->gu + p0 * FE : NULL, FE};
            CK(!dn_hf && moe_q8t_for(L->exp_down_type, FE, nc) ? cuk_moe_down_q8t(&dn, cs, err) : cuk_moe_down_q8(&dn, cs, err));
            PMARK(S, dn_hf ? "moe_down (quantizes gate*up, + slot sum)" : "moe_down (int8 input, + slot sum)");
        } else {
            cuk_moe_down_args dn = {L->exp_down_type, L->exp_down, FE, E, (int32_t)c->n_exp_l,
                                    ids + (int64_t)t0 * U, wts + (int64_t)t0 * U, (int32_t)U, U, U,
                                    (const uint8_t *)hin + (size_t)t0 * U * (size_t)ld * hs, xt, ld, (int32_t)nc,
                                    rk->moe + (int64_t)t0 * E, E, plan, rk->mpart, E};
            CK(cuk_moe_down(&dn, cs, err));
            PMARK(S, "moe_down (+ slot sum)");
        }
    }
    return G5_OK;
}

static g5_status ffn_stage(rt_gpu_model *g, gl_rank *rk, uint32_t il, uint32_t n, g5_error *err) {
    const glm5_hparams *hp = &g->hp;
    const gl_layer *L = &rk->L[il];
    const rt_rank_tensors *c = rk->c;
    const cuk_stream cs = (cuk_stream)rk->st;
    const int64_t E = hp->n_embd, U = hp->n_expert_used, NE = hp->n_expert;
    CUK_CHECK(cudaSetDevice(rk->dev));
    const char *const S = L->dense ? "dense" : "moe";
    /* h's copy for the products that take one, made by the norm's launch: fp16 for the dense gate
     * and up under the fp16 products (cuk_norm_h16), else int8 (cuk_norm_q8), two planes for them,
     * one for the routed and shared experts' */
    const int denseh = L->dense && !gl_lin_use(rk->lin, n) && gm_h16_takes(rk, &L->ffn_gate, n) &&
                       gm_h16_takes(rk, &L->ffn_up, n);
    const int dense8 = !denseh && L->dense && !gl_lin_use(rk->lin, n) && gm_q8x2_takes(rk, &L->ffn_gate, n) &&
                       L->ffn_up.type == L->ffn_gate.type;
    cuk_q8_act hq = {0};
    cuk_h16_act hh = {0};
    const int moe8 = L->dense ? 0 : moe_h_q8(rk, L, E, n);
    if (denseh) CK(gm_norm_x_h16(rk, L->ffn_norm, n, E, hp->rms_eps, &hh, err)); /* one fp16 copy of h for both */
    else CK(gm_norm_x_q8(rk, L->ffn_norm, n, E, hp->rms_eps, dense8 ? 2 : moe8 ? 1 : 0, &hq, err));
    PMARK(S, "ffn_norm (+ residual add, + int8 or fp16 copy of h)");
    rk->oa = rk->part;
    rk->ob = NULL;
    if (L->dense) {
        const int64_t F = c->ff_l;
        if (gl_lin_use(rk->lin, n)) {
            CK(gm_gemv(rk, &L->ffn_gate, rk->h, E, n, rk->ga, F, err));
            PMARK(S, "ffn_gate gemv (+ bf16 convert of h)");
            CK(gm_gemv(rk, &L->ffn_up, rk->h, E, n, rk->gb, F, err));
        } else if (denseh) {
            CK(gm_gemv_h16_in(rk, &L->ffn_gate, &hh, n, rk->ga, F, err));
            PMARK(S, "ffn_gate gemv (fp16 input)");
            CK(gm_gemv_h16_in(rk, &L->ffn_up, &hh, n, rk->gb, F, err));
        } else if (dense8) { /* one two-plane quantization of h for both */
            CK(gm_gemv_q8_pair_in(rk, &L->ffn_gate, &L->ffn_up, &hq, n, rk->ga, rk->gb, F, err));
            PMARK(S, "ffn_gate + ffn_up gemv (int8 input, two planes)");
        } else { /* one conversion of h for both (fast mode) */
            g5_status st;
            int64_t ld;
            uint32_t xt;
            const void *xin = gm_act_in(rk, rk->h, E, n, E, &ld, &xt, 0, &st, err);
            if (st) return st;
            CK(gm_gemv_in(rk, &L->ffn_gate, xin, xt, ld, n, rk->ga, F, err));
            PMARK(S, "ffn_gate gemv (+ bf16 convert of h)");
            CK(gm_gemv_in(rk, &L->ffn_up, xin, xt, ld, n, rk->gb, F, err));
        }
        PMARK(S, "ffn_up gemv");
        CK(gm_silu_gemv(rk, &L->ffn_down, F, n, 2, rk->part, E, err));
        PMARK(S, "silu_mul (+ int8 quantize) + ffn_down gemv");
        return G5_OK;
    }
    /* a decode step's side work (gm_side_begin): the shared expert (int8 gate and up of h's copy,
     * point 1, silu into the upper half of rk->q8q, down into rk->part) beside the router, the
     * routing and the routed experts; moe_gemv_path waits for point 1 before it quantizes gate*up
     * over h's copy, and the stage for the join before part is read */
    const int64_t FE = c->ffe_l, SL = L->sh_l;
    /* moe_h_q8: 0 on the GEMM path; bf16 inputs (rk->fast) would share rk->xb between the chains */
    const int sh_want = L->sh_contrib && (moe8 >> 1) && !rk->fast;
    CK(gm_side_begin(g, rk, sh_want, err));
    /* where no side stream forked (the marked profile, g->prof), the shared expert runs with the
     * routed ones instead: queued first on the main stream, its silu's int8 rows would overwrite
     * h's int8 copy (offset 0 of rk->q8q outside side work) before the routed gate+up reads it */
    const int sh_side = sh_want && rk->side == 1;
    if (sh_side) {
        CK(gm_gemv_q8_pair_in(rk, &L->sh_gate, &L->sh_up, &hq, n, rk->ga, rk->gb, SL, err));
        PMARK(S, "shared gate + up gemv (int8 input)");
        CK(gm_side_point(rk, 1, err));
        CK(gm_silu_gemv(rk, &L->sh_down, SL, n, 1, rk->part, E, err));
        PMARK(S, "shared silu_mul (+ int8 quantize) + down gemv");
    }
    CK(gm_side_end(rk, err));
    /* fast modes' decode steps: the router's float32 product with all of its bytes in flight at
     * once (cuk_gemv_wide: its own order of the sums, a row's bits independent of n); precise
     * mode and prompt calls keep gm_gemv_k's */
    const cuk_gemv_args rw = {L->router.type, L->router.w, L->router.k, L->router.m, rk->h, CUK_ACT_F32, E,
                              (int32_t)n, rk->rl, NE};
    if (rk->q8 && !gl_lin_use(rk->lin, n) && cuk_gemv_wide_fits(&rw))
        CK(cuk_gemv_wide(&rw, cs, err));
    else
        CK(gm_gemv_k(rk, &L->router, rk->h, E, n, rk->rl, NE, 1, err));
    PMARK(S, "router gemv (f32 input)");
    cuk_route_args ra = {rk->rl, NE, L->router_b, (int32_t)n, (int32_t)NE, (int32_t)U, (int32_t)hp->n_group,
                         (int32_t)hp->topk_group, (int32_t)hp->expert_gating_func, hp->expert_weights_norm,
                         hp->expert_weights_scale, rk->ids, rk->wts, NULL};
    /* one token on the GEMV path with every expert local: the routing launch writes the plan too */
    const int planned = n == 1 && c->n_exp_l == hp->n_expert && !gl_lin_use(rk->lin, n);
    if (planned) ra.plan = rk->mplan;
    CK(cuk_moe_route(&ra, cs, err));
    PMARK(S, "route (k_route)");
    const int32_t *ids = rk->ids;
    const float *wts = rk->wts;
    if (c->n_exp_l != hp->n_expert) {
        CK(cuk_moe_localize(rk->ids, rk->wts, (int64_t)n * U, (int32_t)c->exp0, (int32_t)c->n_exp_l, rk->ids_l,
                            rk->wts_l, cs, err));
        ids = rk->ids_l;
        wts = rk->wts_l;
        PMARK(S, "localize");
    }
    if (gl_lin_use(rk->lin, n)) { /* prefill: tokens grouped by expert, GEMMs (gpu_linear.h) */
        const gl_moe_args ma = {L->exp_type, L->exp_down_type, L->exp_gate, L->exp_up, L->exp_down, E, FE,
                                (int32_t)NE, (int32_t)c->exp0, (int32_t)c->n_exp_l, rk->ids, rk->wts, (int32_t)U,
                                rk->h, E, n, rk->moe, E};
        CK(gl_lin_moe(rk->lin, &ma, err));
        PMARK(S, "experts (prefill GEMM path)");
        if (L->sh_contrib) {
            CK(gm_gemv(rk, &L->sh_gate, rk->h, E, n, rk->ga, SL, err));
            CK(gm_gemv(rk, &L->sh_up, rk->h, E, n, rk->gb, SL, err));
            PMARK(S, "shared gate+up (GEMM path)");
        }
    } else {
        CK(moe_gemv_path(g, rk, L, ids, wts, n, moe8, &hq, sh_side, planned, err));
    }
    if (L->sh_contrib && !sh_side) {
        CK(gm_silu_gemv(rk, &L->sh_down, SL, n, 1, rk->part, E, err));
        PMARK(S, "shared silu_mul (+ int8 quantize) + down gemv");
    }
    CK(gm_side_wait(rk, GM_SIDE_JOIN, err));
    /* one device: the next norm adds moe (+ part) to x itself; ranks to be summed need part */
    if (g->coll == COLL_NONE) {
        rk->oa = rk->moe;
        rk->ob = L->sh_contrib ? rk->part : NULL;
    } else if (L->sh_contrib) {
        CK(cuk_add(rk->moe, rk->part, rk->part, (int64_t)n * E, cs, err));
        PMARK(S, "experts + shared add");
    } else {
        CUK_CHECK(cudaMemcpyAsync(rk->part, rk->moe, (size_t)n * E * 4, cudaMemcpyDeviceToDevice, rk->st));
        PMARK(S, "experts copy to part");
    }
    return G5_OK;
}

/* ffn_stage, and after a failure the rank's main stream back in rk->st (as gm_attn_stage). */
g5_status gm_ffn_stage(rt_gpu_model *g, gl_rank *rk, uint32_t il, uint32_t n, g5_error *err) {
    const g5_status st = ffn_stage(g, rk, il, n, err);
    if (st) gm_side_reset(rk);
    return st;
}

#endif /* G5_WITH_CUDA */
