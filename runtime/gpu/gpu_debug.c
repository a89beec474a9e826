/* Benchmark and profiling hooks of the CUDA model (gpu_model.h: rt_gpu_debug_*), used by
 * tests/gpu/bench_decode.c and tests/gpu/bench_peer.c: filling the caches to a context without
 * running it, per-stage and per-sub-step timings of the last forward call, and for a prefill the
 * sub-steps by class with each class's FLOP rate. Compiled to nothing unless G5_WITH_CUDA. */
#ifdef G5_WITH_CUDA

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/quant.h"
#include "runtime/gpu/gpu_int.h"

/* ---- benchmark hooks (tests/gpu/bench_decode.c) ---- */

g5_status rt_gpu_debug_set_context(rt_gpu_model *g, uint32_t n_past, uint64_t seed, g5_error *err) {
    const glm5_hparams *hp = &g->hp;
    const uint64_t LW = gm_lat_w(hp), ID = hp->idx_head_dim, W = LW + ID;
    rt_gpu_seq *s = g->def;
    if (n_past > INT32_MAX - 4096) return g5_fail(err, G5_ERR_INVALID_ARG, "context %u", n_past);
    CK(gm_seq_need(s, n_past + 256, err)); /* room for the steps that follow */
    if (n_past) {
        /* one random [n_past][latent | indexer key] block, uploaded once per rank; each layer
         * gets it converted to the cache types, then it is scaled so the next layer differs */
        const uint64_t cnt = (uint64_t)n_past * W;
        float *h = malloc(cnt * sizeof *h);
        if (!h) return g5_fail(err, G5_ERR_NOMEM, "context fill of %u positions", n_past);
        uint64_t z = seed;
        for (uint64_t i = 0; i < cnt; i++) {
            z += 0x9E3779B97F4A7C15ull;
            uint64_t v = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            v = (v ^ (v >> 27)) * 0x94D049BB133111EBull;
            h[i] = (float)((double)((v ^ (v >> 31)) >> 11) / (double)(1ull << 52) - 1.0);
        }
        g5_status st = G5_OK;
        for (uint32_t r = 0; r < g->T && !st; r++) {
            gl_rank *rk = &g->rk[r];
            const cuk_stream cs = (cuk_stream)rk->st;
            float *d = NULL;
            cudaError_t ce = cudaSetDevice(rk->dev);
            if (ce == cudaSuccess) ce = cudaMalloc((void **)&d, cnt * sizeof *d);
            /* on the rank's stream, ahead of the conversions that read d: a cudaMemcpy (the
             * legacy stream) from pageable memory may return before its last DMA has landed,
             * and nothing orders it with rk->st (non-blocking), so the conversions could read
             * part of d stale; h outlives the copy (the synchronization below) */
            if (ce == cudaSuccess) ce = cudaMemcpyAsync(d, h, cnt * sizeof *d, cudaMemcpyHostToDevice, rk->st);
            if (ce != cudaSuccess) st = g5_fail(err, G5_ERR_INTERNAL, "context fill: %s", cudaGetErrorString(ce));
            for (uint32_t il = 0; il < hp->n_layer_main && !st; il++) {
                st = cuk_convert(d, (int64_t)W, gm_seq_lat(g, s, r, il), g->lat_type, (int64_t)LW, n_past, (int64_t)LW,
                                 cs, err);
                if (!st && hp->idx_full[il]) /* shared layers keep no indexer keys */
                    st = cuk_convert(d + LW, (int64_t)W, gm_seq_idxk(g, s, r, il), CUK_F32, (int64_t)ID, n_past,
                                     (int64_t)ID, cs, err);
                if (!st) st = cuk_scale(d, (int64_t)cnt, -0.999f, cs, err);
            }
            if (d) {
                ce = cudaStreamSynchronize(rk->st);
                if (!st && ce != cudaSuccess) st = g5_fail(err, G5_ERR_INTERNAL, "context fill: %s", cudaGetErrorString(ce));
                cudaFree(d);
            }
        }
        free(h);
        if (st) return st;
    }
    s->n_past = n_past;
    return G5_OK;
}

/* The plan of the default sequence's last call of n tokens (rt_gpu_debug_stage_times, _profile, _scan), held
 * in *lc; `what` names the caller in errors. */
typedef struct last_call {
    rt_gpu_seq *seqs[1];
    uint32_t pos0, len, row0;
    fplan pl;
} last_call;

static g5_status last_call_plan(rt_gpu_model *g, uint32_t n, const char *what, last_call *lc, g5_error *err) {
    rt_gpu_seq *s = g->def;
    const gl_rank *r0 = &g->rk[0];
    if (g->coll == COLL_NCCL) return g5_fail(err, G5_ERR_UNSUPPORTED, "%s: ranks on several devices", what);
    if (n == 0 || n > s->n_past || n > r0->ncap)
        return g5_fail(err, G5_ERR_INVALID_ARG, "%s: %u tokens (n_past %u, work buffers for %u)", what, n, s->n_past,
                       r0->ncap);
    lc->seqs[0] = s;
    lc->pos0 = s->n_past - n;
    lc->len = n;
    lc->row0 = 0;
    lc->pl = (fplan){n, 1, lc->seqs, &lc->pos0, &lc->len, &lc->row0};
    return G5_OK;
}

g5_status rt_gpu_debug_stage_times(rt_gpu_model *g, uint32_t n, rt_gpu_stage_times *out, g5_error *err) {
    const glm5_hparams *hp = &g->hp;
    gl_rank *r0 = &g->rk[0];
    memset(out, 0, sizeof *out);
    last_call lc;
    CK(last_call_plan(g, n, "stage times", &lc, err));
    const fplan pl = lc.pl;
    const uint64_t E = hp->n_embd, Lm = hp->n_layer_main;
    /* events on rank 0's stream, which every rank shares here: ev[0] before the embedding, then
     * one after each stage, which kind[] names */
    enum { K_EMBD, K_ATTN, K_ADD, K_DENSE, K_MOE, K_HEAD };
    CUK_CHECK(cudaSetDevice(r0->dev));
    const uint32_t n_ev = (uint32_t)(4 * Lm + 3);
    cudaEvent_t *ev = calloc(n_ev, sizeof *ev);
    uint8_t *kind = calloc(n_ev, 1);
    if (!ev || !kind) {
        free(ev);
        free(kind);
        return g5_fail(err, G5_ERR_NOMEM, "stage events");
    }
    g5_status st = G5_OK;
    uint32_t ne = 0;
    for (uint32_t i = 0; i < n_ev && !st; i++)
        if (cudaEventCreate(&ev[i]) != cudaSuccess) st = g5_fail(err, G5_ERR_INTERNAL, "cudaEventCreate");
        else ne++;
#define MARK(k)                                                                                \
    do {                                                                                       \
        if (!st && cudaEventRecord(ev[m], r0->st) != cudaSuccess)                              \
            st = g5_fail(err, G5_ERR_INTERNAL, "cudaEventRecord");                             \
        kind[m++] = (k);                                                                       \
    } while (0)
    uint32_t m = 0;
    for (uint32_t r = 0; r < g->T; r++) gl_lin_arm(g->rk[r].lin, 1);
    MARK(K_EMBD);
    for (uint32_t r = 0; r < g->T && !st; r++) {
        gl_rank *rk = &g->rk[r];
        st = gm_embed(rk, n, (int64_t)E, err);
    }
    MARK(K_EMBD);
    for (uint32_t il = 0; il < Lm && !st; il++) {
        for (uint32_t r = 0; r < g->T && !st; r++) st = gm_attn_stage(g, &g->rk[r], il, &pl, err);
        MARK(K_ATTN);
        if (!st) st = gm_collective(g, n, NULL, err);
        MARK(K_ADD);
        for (uint32_t r = 0; r < g->T && !st; r++) st = gm_ffn_stage(g, &g->rk[r], il, n, err);
        MARK(r0->L[il].dense ? K_DENSE : K_MOE);
        if (!st) st = gm_collective(g, n, NULL, err);
        MARK(K_ADD);
    }
    for (uint32_t r = 0; r < g->T && !st; r++) {
        gl_rank *rk = &g->rk[r];
        st = gm_norm_x(rk, rk->out_norm, n, (int64_t)E, hp->rms_eps, err);
        if (!st && rk->head_write) st = gm_gemv_q8(rk, &rk->head, rk->h + (uint64_t)(n - 1) * E, (int64_t)E, 1, rk->lg,
                                             rk->head.m, err);
    }
    MARK(K_HEAD);
#undef MARK
    if (!st && cudaStreamSynchronize(r0->st) != cudaSuccess) st = g5_fail(err, G5_ERR_INTERNAL, "stage times: sync");
    double *acc[] = {&out->embd_ms, &out->attn_ms, &out->add_ms, &out->dense_ms, &out->moe_ms, &out->head_ms};
    for (uint32_t i = 1; i < m && !st; i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, ev[i - 1], ev[i]) != cudaSuccess) {
            st = g5_fail(err, G5_ERR_INTERNAL, "cudaEventElapsedTime");
            break;
        }
        *acc[kind[i]] += ms;
        out->total_ms += ms;
    }
    out->n_tok = n;
    for (uint32_t i = 0; i < ne; i++) cudaEventDestroy(ev[i]);
    free(ev);
    free(kind);
    return st;
}

/* ---- sub-step profile (rt_gpu_debug_profile) ---- */

/* The last call's device work again (rt_gpu_debug_stage_times' sequence), with marks when
 * g->prof is set: embedding, the layers, the collectives, final norm and lm_head. */
static g5_status prof_replay(rt_gpu_model *g, const fplan *pl, g5_error *err) {
    const glm5_hparams *hp = &g->hp;
    const uint32_t n = pl->n;
    const uint64_t E = hp->n_embd;
    gl_rank *rk = &g->rk[0];
    CUK_CHECK(cudaSetDevice(rk->dev));
    PMARK("step", "start");
    for (uint32_t r = 0; r < g->T; r++) {
        rk = &g->rk[r];
        CK(gm_embed(rk, n, (int64_t)E, err));
    }
    PMARK("step", "embedding");
    for (uint32_t il = 0; il < hp->n_layer_main; il++) {
        for (uint32_t r = 0; r < g->T; r++) CK(gm_attn_stage(g, &g->rk[r], il, pl, err));
        CK(gm_collective(g, n, NULL, err));
        rk = &g->rk[0];
        PMARK("add", "collective after attention");
        for (uint32_t r = 0; r < g->T; r++) CK(gm_ffn_stage(g, &g->rk[r], il, n, err));
        CK(gm_collective(g, n, NULL, err));
        PMARK("add", "collective after FFN");
    }
    for (uint32_t r = 0; r < g->T; r++) {
        rk = &g->rk[r];
        /* as gm_forward_device: a one-token step's final norm writes the head's int8 input */
        const int h8 = n == 1 && rk->head_write ? gm_q8_takes(rk, &rk->head, 1) : 0;
        CK(gm_norm_x_q8(rk, rk->out_norm, n, (int64_t)E, hp->rms_eps, h8, &rk->head_q8, err));
        PMARK("step", "output_norm (+ residual add)");
        if (rk->head_write && rk->head_q8.q) {
            const cuk_q8_act x = gm_q8_rows(&rk->head_q8, 0);
            CK(gm_gemv_q8_in(rk, &rk->head, &x, 1, rk->lg, rk->head.m, err));
        } else if (rk->head_write) {
            CK(gm_gemv_q8(rk, &rk->head, rk->h + (uint64_t)(n - 1) * E, (int64_t)E, 1, rk->lg, rk->head.m, err));
        }
        PMARK("step", "lm_head gemv");
    }
    return G5_OK;
}

typedef struct prof_row {
    const char *stage, *label;
    double ms[2];                    /* [0] launched one by one, [1] CUDA graph */
    uint32_t cnt[2];
} prof_row;

enum { PROF_ROWS = 96 };

/* Adds the intervals between p's marks to rows (variant v). */
static g5_status prof_collect(const gprof *p, prof_row *rows, uint32_t *n_rows, int v, g5_error *err) {
    for (uint32_t i = 1; i < p->n; i++) {
        float ms = 0;
        CUK_CHECK(cudaEventElapsedTime(&ms, p->ev[i - 1], p->ev[i]));
        uint32_t j = 0;
        while (j < *n_rows && (strcmp(rows[j].stage, p->stage[i]) || strcmp(rows[j].label, p->label[i]))) j++;
        if (j == *n_rows) {
            if (*n_rows == PROF_ROWS) return g5_fail(err, G5_ERR_INTERNAL, "profile: more than %d sub-steps", PROF_ROWS);
            rows[j] = (prof_row){p->stage[i], p->label[i], {0, 0}, {0, 0}};
            (*n_rows)++;
        }
        rows[j].ms[v] += ms;
        rows[j].cnt[v]++;
    }
    return G5_OK;
}

/* Milliseconds of one graph launch (the mean of 3 after a warm-up launch). */
static g5_status prof_time_graph(cudaGraphExec_t ge, cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1, double *ms,
                                 g5_error *err) {
    CUK_CHECK(cudaGraphLaunch(ge, st));
    CUK_CHECK(cudaEventRecord(e0, st));
    for (int i = 0; i < 3; i++) CUK_CHECK(cudaGraphLaunch(ge, st));
    CUK_CHECK(cudaEventRecord(e1, st));
    CUK_CHECK(cudaEventSynchronize(e1));
    float f = 0;
    CUK_CHECK(cudaEventElapsedTime(&f, e0, e1));
    *ms = f / 3;
    return G5_OK;
}

/* prof_replay captured on rank 0's stream (marks as event record nodes when p) and
 * instantiated into *ge. */
static g5_status prof_capture(rt_gpu_model *g, const fplan *pl, gprof *p, cudaGraphExec_t *ge, g5_error *err) {
    gl_rank *r0 = &g->rk[0];
    *ge = NULL;
    CUK_CHECK(cudaStreamBeginCapture(r0->st, cudaStreamCaptureModeThreadLocal));
    if (p) {
        p->n = 0;
        p->external = 1;
        g->prof = p;
    }
    g5_status st = prof_replay(g, pl, err);
    g->prof = NULL;
    cudaGraph_t graph = NULL;
    const cudaError_t ce = cudaStreamEndCapture(r0->st, &graph);
    if (!st && ce != cudaSuccess) st = g5_fail(err, G5_ERR_INTERNAL, "profile: graph capture: %s", cudaGetErrorString(ce));
    if (!st && p && p->ce != cudaSuccess)
        st = g5_fail(err, G5_ERR_INTERNAL, "profile: event record node: %s", cudaGetErrorString(p->ce));
    if (!st && cudaGraphInstantiate(ge, graph, 0) != cudaSuccess) {
        *ge = NULL;
        st = g5_fail(err, G5_ERR_INTERNAL, "profile: cudaGraphInstantiate: %s", cudaGetErrorString(cudaGetLastError()));
    }
    if (graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    return st;
}

/* ---- the class table of a prefill profile (rt_gpu_debug_profile, n > 1 tokens) ---- */

enum { PC_ATTN, PC_IDX, PC_DENSE, PC_MOE, PC_HEAD, PC_OTHER, PC_N };

/* Every PMARK label of runtime/gpu/ (grep PMARK) and its class, but "start" (the first mark:
 * no interval ends there); a label not listed here is charged to "other" and named under the
 * table, so a new sub-step cannot hide in a class. */
static const struct {
    const char *label;
    int cls;
} k_prof_class[] = {
    {"embedding", PC_OTHER},
    {"collective after attention", PC_OTHER},
    {"collective after FFN", PC_OTHER},
    {"output_norm (+ residual add)", PC_OTHER},
    {"lm_head gemv", PC_HEAD},
    {"attn_norm (+ residual add, + int8 quantize of h)", PC_OTHER},
    {"q_a gemv", PC_DENSE},
    {"q_a_norm (+ int8 quantize of qr)", PC_OTHER},
    {"kv_a gemv", PC_DENSE},
    {"latent norm+rope+cache write", PC_OTHER},
    {"idx_q_b gemv", PC_IDX},
    {"idx_k gemv", PC_IDX},
    {"idx_proj gemv", PC_IDX},
    {"idx rope+norm+rope+scale, q rope (cuk_idx_prep)", PC_IDX},
    {"idx_scores", PC_IDX},
    {"idx_topk", PC_IDX},
    {"q_b gemv", PC_DENSE},
    {"q rope", PC_OTHER},
    {"mla_absorb", PC_ATTN},
    {"mla_absorb (+ q rope)", PC_ATTN},
    {"mla_attend", PC_ATTN},
    {"W_UV gemv (all heads, one launch)", PC_ATTN},
    {"attn_output gemv", PC_DENSE},
    {"ffn_norm (+ residual add, + int8 quantize of h)", PC_OTHER},
    {"ffn_gate gemv (+ bf16 convert of h)", PC_DENSE},
    {"ffn_gate + ffn_up gemv (int8 input, two planes)", PC_DENSE},
    {"ffn_up gemv", PC_DENSE},
    {"silu_mul (+ int8 quantize) + ffn_down gemv", PC_DENSE},
    {"router gemv (f32 input)", PC_DENSE},
    {"route (k_route)", PC_OTHER},
    {"localize", PC_OTHER},
    {"bf16 convert of h", PC_OTHER},
    {"shared gate + up gemv (int8 input)", PC_DENSE},
    {"shared gate gemv", PC_DENSE},
    {"shared up gemv", PC_DENSE},
    {"shared gate+up (GEMM path)", PC_DENSE},
    {"shared silu_mul (+ int8 quantize) + down gemv", PC_DENSE},
    {"moe_plan", PC_MOE},
    {"moe_gate_up (int8 input)", PC_MOE},
    {"moe_gate_up", PC_MOE},
    {"int8 quantize of gate*up", PC_OTHER},
    {"bf16 convert of gate*up", PC_OTHER},
    {"moe_down (int8 input, + slot sum)", PC_MOE},
    {"moe_down (quantizes gate*up, + slot sum)", PC_MOE},
    {"moe_down (+ slot sum)", PC_MOE},
    {"experts (prefill GEMM path)", PC_MOE},
    {"experts + shared add", PC_OTHER},
    {"experts copy to part", PC_OTHER},
};

/* The class of a label; -1: not listed (charged to other). */
static int prof_class_of(const char *label) {
    for (size_t i = 0; i < sizeof k_prof_class / sizeof k_prof_class[0]; i++)
        if (!strcmp(k_prof_class[i].label, label)) return k_prof_class[i].cls;
    return -1;
}

static double mk(const dmat *w) { return (double)w->m * (double)w->k; }

/* FLOPs (a multiply-add counted as 2) per class of one call of n tokens of one sequence at
 * positions pos0 .. pos0 + n - 1, as the GPU runs it: every rank of this process, each its own
 * slice (the profile times them all: they share one device); products sized as gpu_model.c sizes
 * them (the rank's dmat shapes, heads H_l, expert width ffe_l). Not counted: norms, rope,
 * softmax, routing, conversions (class other), the indexer's weighting by head. */
static void prof_class_flops(const rt_gpu_model *g, uint32_t pos0, uint32_t n, double fl[PC_N]) {
    const glm5_hparams *hp = &g->hp;
    const double E = hp->n_embd, KL = hp->kv_lora, R = hp->qk_rope, NOPE = hp->qk_nope, V = hp->v_head;
    const double IH = hp->idx_n_head, ID = hp->idx_head_dim, K = hp->idx_top_k, U = hp->n_expert_used;
    const double tok = n;
    /* (query, key) pairs of the call: causal (the query at position p sees p + 1 keys); the
     * attention's are at most top-k per query (DSA: cuk_idx_topk selects min(p + 1, k)) */
    double pairs = 0, sel = 0;
    for (uint32_t i = 0; i < n; i++) {
        const double keys = (double)pos0 + i + 1;
        pairs += keys;
        sel += K > 0 && keys > K ? K : keys;
    }
    memset(fl, 0, PC_N * sizeof *fl);
    for (uint32_t r = 0; r < g->T; r++) {
        const gl_rank *rk = &g->rk[r];
        const double H = rk->c->H_l, FE = rk->c->ffe_l;
        const double local = hp->n_expert ? (double)rk->c->n_exp_l / hp->n_expert : 0;
        for (uint32_t il = 0; il < hp->n_layer_main; il++) {
            const gl_layer *L = &rk->L[il];
            /* attention, the absorbed MLA form every path runs (mla_absorb, mla_attend, W_UV) */
            fl[PC_ATTN] += tok * 2 * H * NOPE * KL; /* absorb: q_nope through W_UK into the latent space */
            fl[PC_ATTN] += sel * 2 * H * (KL + R);  /* scores: q over the latent and rope dims (576) */
            fl[PC_ATTN] += sel * 2 * H * KL;        /* the softmax-weighted sum of latents (512) */
            fl[PC_ATTN] += tok * 2 * H * KL * V;    /* W_UV: the latent output into v_head per head */
            /* weight products, 2 m k per token: the attention projections */
            fl[PC_DENSE] += tok * 2 * (mk(&L->q_a) + mk(&L->kv_a) + mk(&L->q_b) + mk(&L->o));
            if (L->dense) { /* the dense FFN */
                fl[PC_DENSE] += tok * 2 * (mk(&L->ffn_gate) + mk(&L->ffn_up) + mk(&L->ffn_down));
            } else {
                fl[PC_DENSE] += tok * 2 * mk(&L->router); /* the router (every rank computes it) */
                if (L->sh_contrib) /* the shared expert's slice */
                    fl[PC_DENSE] += tok * 2 * (mk(&L->sh_gate) + mk(&L->sh_up) + mk(&L->sh_down));
                /* routed experts: gate and up (E -> FE) and down (FE -> E) per (token, slot) on this
                 * rank's experts: every slot at TP (FE its slice of the width), the expected share
                 * n_exp_l / n_expert of them with EP */
                fl[PC_MOE] += tok * U * local * 2 * 3 * E * FE;
            }
            if (L->has_idx) { /* the indexer: its key projection; past top-k keys (the last
                               * query's) its query and weights, then q . k per head and causal pair */
                fl[PC_IDX] += tok * 2 * mk(&L->idx_k);
                if ((double)pos0 + n > K) {
                    fl[PC_IDX] += tok * 2 * (mk(&L->idx_q_b) + mk(&L->idx_proj));
                    fl[PC_IDX] += pairs * 2 * IH * ID;
                }
            }
        }
        if (rk->head_write) fl[PC_HEAD] += 2 * mk(&rk->head); /* lm_head: the last position only */
    }
}

/* The second table of a prefill profile: rows' launched times by class, each class's FLOPs
 * (prof_class_flops) and rate, and the rate over ref_tflops (the caller's cuBLAS bf16 GEMM rate,
 * 0: not measured). */
static void prof_class_table(const rt_gpu_model *g, const fplan *pl, const prof_row *rows, uint32_t n_rows,
                             double ref_tflops, FILE *report) {
    static const char *const names[PC_N] = {"attention", "indexer", "dense", "moe", "lm_head", "other"};
    static const char *const what[PC_N] = {
        "mla_absorb, mla_attend, W_UV", "idx_* (projections, prep, scores, top-k)",
        "q_a, kv_a, q_b, attn_output, dense FFN, shared expert, router", "moe_* and experts* (routed experts)",
        "the last position's logits", "norms, rope, quantize/convert, routing, collectives, adds"};
    double ms[PC_N] = {0}, fl[PC_N];
    char unl[512] = "";
    size_t ul = 0;
    for (uint32_t j = 0; j < n_rows; j++) {
        const int c = prof_class_of(rows[j].label);
        ms[c < 0 ? PC_OTHER : c] += rows[j].ms[0];
        if (c < 0 && ul < sizeof unl)
            ul += (size_t)snprintf(unl + ul, sizeof unl - ul, "%s\"%s\"", ul ? ", " : "", rows[j].label);
    }
    prof_class_flops(g, pl->pos0[0], pl->n, fl);
    double tms = 0, tfl = 0;
    for (int c = 0; c < PC_N; c++) {
        tms += ms[c];
        tfl += c == PC_OTHER ? 0 : fl[c];
    }
    fprintf(report, "prefill classes (%u tokens at positions %u..%u; launched variant's ms; FLOPs from the "
                    "hyper-parameters, %u rank slice%s; ratio: over cuBLAS bf16 ",
            pl->n, pl->pos0[0], pl->pos0[0] + pl->n - 1, g->T, g->T == 1 ? "" : "s on one device");
    if (ref_tflops > 0) fprintf(report, "%.1f TFLOP/s measured in this run)\n", ref_tflops);
    else fprintf(report, "not measured)\n");
    fprintf(report, "  %-10s %10s %6s %10s %9s %9s  %s\n", "class", "ms", "share", "GFLOP", "TFLOP/s", "/ cuBLAS",
            "sub-steps");
    for (int c = 0; c < PC_N; c++) {
        const double tf = c != PC_OTHER && ms[c] > 0 ? fl[c] / (ms[c] * 1e-3) / 1e12 : 0;
        if (c == PC_OTHER)
            fprintf(report, "  %-10s %10.3f %5.1f%% %10s %9s %9s  %s\n", names[c], ms[c],
                    tms > 0 ? 100 * ms[c] / tms : 0.0, "-", "-", "-", what[c]);
        else if (ref_tflops > 0)
            fprintf(report, "  %-10s %10.3f %5.1f%% %10.2f %9.2f %9.4f  %s\n", names[c], ms[c],
                    tms > 0 ? 100 * ms[c] / tms : 0.0, fl[c] / 1e9, tf, tf / ref_tflops, what[c]);
        else
            fprintf(report, "  %-10s %10.3f %5.1f%% %10.2f %9.2f %9s  %s\n", names[c], ms[c],
                    tms > 0 ? 100 * ms[c] / tms : 0.0, fl[c] / 1e9, tf, "-", what[c]);
    }
    const double ttf = tms > 0 ? tfl / (tms * 1e-3) / 1e12 : 0;
    fprintf(report, "  %-10s %10.3f %5.1f%% %10.2f %9.2f ", "total", tms, 100.0, tfl / 1e9, ttf);
    if (ref_tflops > 0) fprintf(report, "%9.4f  (the counted FLOPs over all the time)\n", ttf / ref_tflops);
    else fprintf(report, "%9s  (the counted FLOPs over all the time)\n", "-");
    if (ul) fprintf(report, "  unclassified sub-steps, charged to other: %s\n", unl);
}

/* ---- the bytes of a one-token call's sub-steps ---- */

/* Bytes of n rows of k elements of type t (0 where the type has no row size) */
static double rows_bytes(uint32_t t, int64_t k, double n) {
    uint64_t rb = 0;
    return k > 0 && quant_row_bytes(t, (uint64_t)k, &rb) == G5_OK ? (double)rb * n : 0.0;
}

static double wb(const dmat *w) { return w->w ? rows_bytes(w->type, w->k, (double)w->m) : 0.0; }

static int has(const char *label, const char *prefix) { return !strncmp(label, prefix, strlen(prefix)); }

/* What one layer's sub-step (stage, label) reads in a one-token call at position pos: its weights
 * in their stored types (kv_b's W_UK / W_UV parts in the exact int8 form where the layer has it),
 * the latent rows the attention reads, the indexer's keys and scores past idx_top_k keys, a norm's
 * weight; 0 for the rest (rope, routing, conversions, the few activation rows). bench_decode's
 * byte floor counts the same. pair: dense gate and up ran as one launch ("ffn_up gemv" then marks
 * nothing). */
static double layer_bytes(const rt_gpu_model *g, const gl_rank *rk, const gl_layer *L, uint32_t pos,
                          const char *stage, const char *label, int pair) {
    const glm5_hparams *hp = &g->hp;
    const double E = hp->n_embd, KL = hp->kv_lora, R = hp->qk_rope, NOPE = hp->qk_nope, V = hp->v_head;
    const double ID = hp->idx_head_dim, K = hp->idx_top_k, U = hp->n_expert_used, H = rk->c->H_l;
    const double keys = (double)pos + 1;
    const int past = K > 0 && keys > K; /* past idx_top_k keys: scores and a selection */
    const double sel = past ? K : keys;
    if (!strcmp(stage, "attn")) {
        if (has(label, "attn_norm")) return E * 4;
        if (has(label, "kv_a gemv")) return wb(&L->kv_a);
        if (has(label, "latent norm")) return KL * 4;
        if (has(label, "q_a gemv")) return wb(&L->q_a);
        if (has(label, "q_a_norm")) return hp->q_lora * 4.0;
        if (has(label, "q_b gemv")) return wb(&L->q_b);
        if (has(label, "mla_absorb"))
            return L->kq ? H * NOPE * KL + H * (NOPE / 16) * KL * 4 : H * NOPE * KL * 4;
        if (has(label, "mla_attend")) return sel * (KL + R) * (double)g->lat_es;
        if (has(label, "W_UV")) return L->kq ? H * V * KL + H * V * (KL / 16) * 4 : H * V * KL * 4;
        if (has(label, "attn_output gemv")) return wb(&L->o);
        if (!L->has_idx) return 0;
        if (has(label, "idx_k gemv")) return wb(&L->idx_k);
        if (has(label, "idx_proj gemv")) return wb(&L->idx_proj);
        if (has(label, "idx_q_b gemv")) return wb(&L->idx_q_b);
        if (has(label, "idx rope")) return 2 * ID * 4;
        if (has(label, "idx_scores")) return past ? keys * ID * 4 : 0;
        if (has(label, "idx_topk")) return past ? keys * 4 : 0;
        return 0;
    }
    if (!strcmp(stage, "dense") && L->dense) {
        if (has(label, "ffn_norm")) return E * 4;
        if (has(label, "ffn_gate + ffn_up")) return wb(&L->ffn_gate) + wb(&L->ffn_up);
        if (has(label, "ffn_gate gemv")) return wb(&L->ffn_gate);
        if (has(label, "ffn_up gemv")) return pair ? 0 : wb(&L->ffn_up);
        if (has(label, "silu_mul")) return wb(&L->ffn_down);
        return 0;
    }
    if (!strcmp(stage, "moe") && !L->dense) {
        const double FE = rk->c->ffe_l, local = hp->n_expert ? (double)rk->c->n_exp_l / hp->n_expert : 0;
        if (has(label, "ffn_norm")) return E * 4;
        if (has(label, "router gemv")) return wb(&L->router);
        if (!L->sh_contrib && has(label, "shared")) return 0;
        if (has(label, "shared gate + up")) return wb(&L->sh_gate) + wb(&L->sh_up);
        if (has(label, "shared gate gemv")) return wb(&L->sh_gate);
        if (has(label, "shared up gemv")) return wb(&L->sh_up);
        if (has(label, "shared silu_mul")) return wb(&L->sh_down);
        /* the routed experts at one token: U slots, each expert's slice here (with EP the
         * expected share n_exp_l / n_expert of them) */
        if (has(label, "moe_gate_up")) return U * local * rows_bytes(L->exp_type, (int64_t)E, 2 * FE);
        if (has(label, "moe_down")) return U * local * rows_bytes(L->exp_down_type, (int64_t)FE, E);
    }
    return 0;
}

/* Bytes the one-token call at position pos read in each of rows[0 .. n_rows) (all its
 * occurrences: every layer and rank) into out[]. */
static void prof_row_bytes(const rt_gpu_model *g, uint32_t pos, const prof_row *rows, uint32_t n_rows, double *out) {
    const double E = g->hp.n_embd;
    int pair = 0;
    for (uint32_t j = 0; j < n_rows; j++) pair |= has(rows[j].label, "ffn_gate + ffn_up");
    for (uint32_t j = 0; j < n_rows; j++) {
        const prof_row *rw = &rows[j];
        double b = 0;
        for (uint32_t r = 0; r < g->T; r++) {
            const gl_rank *rk = &g->rk[r];
            if (!strcmp(rw->stage, "step")) {
                if (has(rw->label, "embedding")) b += wb(&rk->tok_embd) / (rk->tok_embd.m ? rk->tok_embd.m : 1);
                if (has(rw->label, "output_norm")) b += E * 4;
                if (has(rw->label, "lm_head") && rk->head_write) b += wb(&rk->head);
                continue;
            }
            for (uint32_t il = 0; il < g->hp.n_layer_main; il++)
                b += layer_bytes(g, rk, &rk->L[il], pos, rw->stage, rw->label, pair);
        }
        out[j] = b;
    }
}

static g5_status profile_plan(rt_gpu_model *g, const fplan *plp, double ref_tflops, double copy_gbs, FILE *report,
                             g5_error *err);

/* The profile line's end: with by, the MB an occurrence reads and its graph us over the bytes'
 * time at copy_gbs ("-" without bytes or a rate) */
static void prof_bytes_cols(FILE *report, int by, double bytes, double graph_us, double copy_gbs) {
    if (!by) {
        fputc('\n', report);
        return;
    }
    const double byte_us = copy_gbs > 0 ? bytes / (copy_gbs * 1e3) : 0;
    if (bytes > 0 && byte_us > 0 && graph_us > 0) fprintf(report, " %10.3f %12.1f\n", bytes / 1e6, graph_us / byte_us);
    else if (bytes > 0) fprintf(report, " %10.3f %12s\n", bytes / 1e6, "-");
    else fprintf(report, " %10s %12s\n", "-", "-");
}

g5_status rt_gpu_debug_profile(rt_gpu_model *g, uint32_t n, double ref_tflops, double copy_gbs, FILE *report,
                               g5_error *err) {
    last_call lc;
    CK(last_call_plan(g, n, "profile", &lc, err));
    return profile_plan(g, &lc.pl, ref_tflops, copy_gbs, report, err);
}

g5_status rt_gpu_debug_profile_batch(rt_gpu_model *g, rt_gpu_seq *const *seqs, uint32_t n_seq, FILE *report,
                                     g5_error *err) {
    gl_rank *r0 = &g->rk[0];
    if (g->coll == COLL_NCCL) return g5_fail(err, G5_ERR_UNSUPPORTED, "profile: ranks on several devices");
    if (n_seq < 2 || n_seq > r0->ncap)
        return g5_fail(err, G5_ERR_INVALID_ARG, "profile: batch of %u (work buffers for %u)", n_seq, r0->ncap);
    uint32_t *a = malloc((size_t)n_seq * 3 * sizeof *a);
    if (!a) return g5_fail(err, G5_ERR_NOMEM, "profile batch");
    uint32_t mp = 1;
    g5_status st = G5_OK;
    for (uint32_t i = 0; i < n_seq && !st; i++) {
        if (!seqs[i] || seqs[i]->g != g || seqs[i]->n_past == 0)
            st = g5_fail(err, G5_ERR_INVALID_ARG, "profile: batch entry %u has no last step", i);
        else {
            a[i] = seqs[i]->n_past - 1;
            a[n_seq + i] = 1;
            a[2 * n_seq + i] = i;
            if (a[i] + 1 > mp) mp = a[i] + 1;
        }
    }
    if (!st && (uint64_t)n_seq * mp > r0->sc_cap)
        st = g5_fail(err, G5_ERR_INVALID_ARG, "profile: not the last batch's sequences");
    if (!st) {
        const fplan pl = {n_seq, n_seq, seqs, a, a + n_seq, a + 2 * n_seq};
        /* the last rt_gpu_forward_batch call's tables (rk->mrows) hold these positions */
        for (uint32_t r = 0; r < g->T; r++) {
            g->rk[r].batch_rows = 1;
            g->rk[r].multi = mp;
        }
        st = profile_plan(g, &pl, 0, 0, report, err);
        for (uint32_t r = 0; r < g->T; r++) g->rk[r].batch_rows = g->rk[r].multi = 0;
    }
    free(a);
    return st;
}

static g5_status profile_plan(rt_gpu_model *g, const fplan *plp, double ref_tflops, double copy_gbs, FILE *report,
                             g5_error *err) {
    const glm5_hparams *hp = &g->hp;
    gl_rank *r0 = &g->rk[0];
    const fplan pl = *plp;
    const uint32_t n = pl.n;
    CUK_CHECK(cudaSetDevice(r0->dev));
    gprof p;
    memset(&p, 0, sizeof p);
    p.cap = 64u * hp->n_layer_main * g->T + 64u;
    p.ev = calloc(p.cap, sizeof *p.ev);
    p.stage = calloc(p.cap, sizeof *p.stage);
    p.label = calloc(p.cap, sizeof *p.label);
    prof_row *rows = calloc(PROF_ROWS, sizeof *rows);
    uint32_t n_rows = 0, n_ev = 0;
    cudaEvent_t e0 = NULL, e1 = NULL;
    cudaGraphExec_t ge_m = NULL, ge_p = NULL;
    g5_status st = G5_OK;
    if (!p.ev || !p.stage || !p.label || !rows) st = g5_fail(err, G5_ERR_NOMEM, "profile events");
    for (; !st && n_ev < p.cap; n_ev++)
        if (cudaEventCreate(&p.ev[n_ev]) != cudaSuccess) st = g5_fail(err, G5_ERR_INTERNAL, "profile: cudaEventCreate");
    if (!st && (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess))
        st = g5_fail(err, G5_ERR_INTERNAL, "profile: cudaEventCreate");
    for (uint32_t r = 0; r < g->T; r++) gl_lin_arm(g->rk[r].lin, pl.n_seg == 1);
    /* 1: launched one by one, without marks (also the warm-up), then with marks */
    double plain_ms = -1, marked_ms = 0, gplain_ms = -1, gmarked_ms = -1;
    if (!st && cudaEventRecord(e0, r0->st) != cudaSuccess) st = g5_fail(err, G5_ERR_INTERNAL, "cudaEventRecord");
    if (!st) st = prof_replay(g, &pl, err);
    if (!st && cudaEventRecord(e1, r0->st) != cudaSuccess) st = g5_fail(err, G5_ERR_INTERNAL, "cudaEventRecord");
    if (!st && cudaEventSynchronize(e1) != cudaSuccess) st = g5_fail(err, G5_ERR_INTERNAL, "profile: sync");
    float f = 0;
    if (!st && cudaEventElapsedTime(&f, e0, e1) == cudaSuccess) plain_ms = f;
    if (!st) {
        p.n = 0;
        p.external = 0;
        g->prof = &p;
        st = prof_replay(g, &pl, err);
        g->prof = NULL;
        if (!st && p.ce != cudaSuccess) st = g5_fail(err, G5_ERR_INTERNAL, "profile: cudaEventRecord: %s", cudaGetErrorString(p.ce));
        if (!st && cudaStreamSynchronize(r0->st) != cudaSuccess) st = g5_fail(err, G5_ERR_INTERNAL, "profile: sync");
        if (!st) st = prof_collect(&p, rows, &n_rows, 0, err);
        if (!st && p.n > 1 && cudaEventElapsedTime(&f, p.ev[0], p.ev[p.n - 1]) == cudaSuccess) marked_ms = f;
    }
    /* 2: one token: captured into a graph, with marks as event record nodes, and without */
    const char *gnote = n == 1 ? NULL : "not run (n > 1)";
    char gerr[200] = "";
    if (!st && n == 1 && pl.n_seg == 1) {
        g5_error e2;
        memset(&e2, 0, sizeof e2);
        g5_status s2 = prof_capture(g, &pl, NULL, &ge_p, &e2);
        if (!s2) s2 = prof_time_graph(ge_p, r0->st, e0, e1, &gplain_ms, &e2);
        if (!s2) s2 = prof_capture(g, &pl, &p, &ge_m, &e2);
        if (!s2) s2 = prof_time_graph(ge_m, r0->st, e0, e1, &gmarked_ms, &e2); /* the marks: last launch's */
        if (!s2) s2 = prof_collect(&p, rows, &n_rows, 1, &e2);
        if (s2) {
            snprintf(gerr, sizeof gerr, "failed: %.180s", e2.msg);
            gnote = gerr;
            (void)cudaGetLastError();
        }
    }
    for (uint32_t r = 0; r < g->T; r++) g->rk[r].pa = g->rk[r].pb = NULL;
    if (!st) {
        uint32_t nd = 0;
        for (uint32_t il = 0; il < hp->n_layer_main; il++) nd += r0->L[il].dense ? 1 : 0;
        const uint32_t nm = hp->n_layer_main - nd;
        fprintf(report, "profile of the last call (%u token%s in %u sequence%s, %u layers: %u dense, %u MoE; %u rank%s): mean us per "
                        "occurrence and total ms; [launched] one launch after another (host gaps included), [graph] "
                        "captured into one CUDA graph%s%s\n",
                n, n == 1 ? "" : "s", pl.n_seg, pl.n_seg == 1 ? "" : "s", hp->n_layer_main, nd, nm, g->T, g->T == 1 ? "" : "s on one device",
                gnote ? ": graph variant " : "", gnote ? gnote : "");
        /* one token: what each sub-step reads (MB an occurrence) and its graph time over those
         * bytes at copy_gbs (the caller's measured copy rate; 0: no ratio) */
        const int by = n == 1 && pl.n_seg == 1;
        double rb[PROF_ROWS] = {0};
        if (by) prof_row_bytes(g, pl.pos0[0], rows, n_rows, rb);
        fprintf(report, "  %-6s %-40s %10s %10s %7s %10s %10s%s\n", "stage", "sub-step", "launch us", "graph us", "count",
                "launch ms", "graph ms", by ? "   MB each  graph/bytes" : "");
        const char *stages[] = {"step", "attn", "dense", "moe", "add"};
        const uint32_t per[] = {1, hp->n_layer_main * g->T, nd * g->T, nm * g->T, 2 * hp->n_layer_main};
        for (int k = 0; k < 5; k++) {
            double sum[3] = {0, 0, 0};
            for (uint32_t j = 0; j < n_rows; j++) {
                const prof_row *rw = &rows[j];
                if (strcmp(rw->stage, stages[k])) continue;
                sum[0] += rw->ms[0];
                sum[1] += rw->ms[1];
                sum[2] += rb[j];
                const double gus = rw->cnt[1] ? 1e3 * rw->ms[1] / rw->cnt[1] : 0.0;
                fprintf(report, "  %-6s %-40s %10.2f %10.2f %7u %10.3f %10.3f", rw->stage, rw->label,
                        rw->cnt[0] ? 1e3 * rw->ms[0] / rw->cnt[0] : 0.0, gus, rw->cnt[0], rw->ms[0], rw->ms[1]);
                prof_bytes_cols(report, by, rw->cnt[0] ? rb[j] / rw->cnt[0] : 0.0, gus, copy_gbs);
            }
            if (per[k] && (sum[0] > 0 || sum[1] > 0)) {
                fprintf(report, "  %-6s %-40s %10.2f %10.2f %7u %10.3f %10.3f", stages[k],
                        k == 0 ? "== step parts, per call" : k == 4 ? "== per collective" : "== per layer (and rank)",
                        1e3 * sum[0] / per[k], 1e3 * sum[1] / per[k], per[k], sum[0], sum[1]);
                prof_bytes_cols(report, by, sum[2] / per[k], 1e3 * sum[1] / per[k], copy_gbs);
            }
        }
        fprintf(report, "  totals: launched %.3f ms with the marks, %.3f ms without; graph %.3f ms with the marks, "
                        "%.3f ms without (one launch, mean of 3)\n",
                marked_ms, plain_ms, gmarked_ms, gplain_ms);
        if (by) {
            double tb = 0;
            for (uint32_t j = 0; j < n_rows; j++) tb += rb[j];
            fprintf(report, "  bytes: the sub-steps read %.4f GB", tb / 1e9);
            if (copy_gbs > 0) fprintf(report, ", %.3f ms at %.0f GB/s", tb / (copy_gbs * 1e6), copy_gbs);
            fprintf(report, " (MB each: one occurrence; graph/bytes: its graph us over that)\n");
        }
        if (pl.n_seg == 1 && n > 1) prof_class_table(g, &pl, rows, n_rows, ref_tflops, report);
    }
    if (ge_m) cudaGraphExecDestroy(ge_m);
    if (ge_p) cudaGraphExecDestroy(ge_p);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    for (uint32_t i = 0; i < n_ev; i++) cudaEventDestroy(p.ev[i]);
    free(p.ev);
    free(p.stage);
    free(p.label);
    free(rows);
    return st;
}

/* ---- value scan (rt_gpu_debug_scan) ---- */

void gm_prof_scan(const rt_gpu_model *g, const gl_rank *rk, gprof *p) {
    const float *buf[4] = {rk->x, rk->h, rk->oa, rk->ob};
    const int64_t cnt = (int64_t)p->scan_rows * g->hp.n_embd;
    g5_error e;
    if ((p->ce = cudaMemsetAsync(p->dscan, 0, 8 * sizeof(uint32_t), rk->st)) != cudaSuccess) return;
    for (int b = 0; b < 4; b++)
        if (buf[b] && cuk_absmax_scan(buf[b], cnt, p->dscan + 2 * b, (cuk_stream)rk->st, &e)) {
            p->ce = cudaErrorLaunchFailure;
            return;
        }
    p->ce = cudaMemcpyAsync(p->hscan[p->n], p->dscan, 8 * sizeof(uint32_t), cudaMemcpyDeviceToHost, rk->st);
    if (p->ce == cudaSuccess) p->ce = cudaStreamSynchronize(rk->st);
}

static float scan_f(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* rt_gpu_debug_scan's report from the marks' scans in *p. */
static void scan_report(const rt_gpu_model *g, const gprof *p, FILE *report) {
    static const char *bn[4] = {"x", "h", "oa", "ob"};
    fprintf(report, "value scan of the last call (%u tokens, %u layers, rank 0): largest finite |v| of x (residual), "
                    "h (normed input), oa, ob (stage outputs) per layer over its sub-steps; '!' = non-finite values\n",
            p->scan_rows, g->hp.n_layer_main);
    int first = 1;
    uint32_t layer = 0;
    float lm[4] = {0, 0, 0, 0};
    uint32_t lb[4] = {0, 0, 0, 0};
    for (uint32_t i = 0; i < p->n; i++) {
        for (int b = 0; b < 4; b++) {
            const float v = scan_f(p->hscan[i][b][0]);
            if (v > lm[b]) lm[b] = v;
            lb[b] += p->hscan[i][b][1];
            if (first && p->hscan[i][b][1]) {
                fprintf(report, "  first non-finite: layer %u, after sub-step \"%s\" (%s): %u values of %s\n", layer,
                        p->label[i], p->stage[i], p->hscan[i][b][1], bn[b]);
                first = 0;
            }
        }
        const int end = !strcmp(p->label[i], "collective after FFN") || i + 1 == p->n;
        if (end) {
            fprintf(report, "  layer %2u:", layer);
            for (int b = 0; b < 4; b++) fprintf(report, "  %s %10.4g%s", bn[b], (double)lm[b], lb[b] ? "!" : " ");
            fprintf(report, "\n");
            memset(lm, 0, sizeof lm);
            memset(lb, 0, sizeof lb);
            layer++;
        }
    }
    /* the stage outputs by sub-step: which product's output grows */
    fprintf(report, "  by sub-step (max over layers of oa after it, count of marks with non-finite oa):\n");
    for (uint32_t i = 0; i < p->n; i++) {
        int seen = 0;
        for (uint32_t j = 0; j < i && !seen; j++) seen = !strcmp(p->label[j], p->label[i]);
        if (seen) continue;
        float m = 0;
        uint32_t nb = 0;
        for (uint32_t j = i; j < p->n; j++)
            if (!strcmp(p->label[j], p->label[i])) {
                const float v = scan_f(p->hscan[j][2][0]);
                if (v > m) m = v;
                nb += p->hscan[j][2][1] ? 1 : 0;
            }
        fprintf(report, "    %-48s %10.4g %5u\n", p->label[i], (double)m, nb);
    }
}

g5_status rt_gpu_debug_scan(rt_gpu_model *g, uint32_t n, FILE *report, g5_error *err) {
    const glm5_hparams *hp = &g->hp;
    last_call lc;
    CK(last_call_plan(g, n, "scan", &lc, err));
    CUK_CHECK(cudaSetDevice(g->rk[0].dev));
    gprof p;
    memset(&p, 0, sizeof p);
    p.cap = 64u * hp->n_layer_main * g->T + 64u;
    p.stage = calloc(p.cap, sizeof *p.stage);
    p.label = calloc(p.cap, sizeof *p.label);
    p.hscan = calloc(p.cap, sizeof *p.hscan);
    p.scan_rows = n;
    g5_status st = G5_OK;
    if (!p.stage || !p.label || !p.hscan) st = g5_fail(err, G5_ERR_NOMEM, "scan marks");
    if (!st && cudaMalloc((void **)&p.dscan, 8 * sizeof(uint32_t)) != cudaSuccess)
        st = g5_fail(err, G5_ERR_NOMEM, "scan: device counters");
    for (uint32_t r = 0; r < g->T; r++) gl_lin_arm(g->rk[r].lin, 1);
    /* the last call's values would show at the marks before each buffer's first write */
    for (uint32_t r = 0; r < g->T && !st; r++) {
        float *bufs[4] = {g->rk[r].x, g->rk[r].h, g->rk[r].oa, g->rk[r].ob};
        for (int b = 0; b < 4 && !st; b++)
            if (bufs[b] && cudaMemsetAsync(bufs[b], 0, (size_t)n * hp->n_embd * sizeof(float), g->rk[r].st) != cudaSuccess)
                st = g5_fail(err, G5_ERR_INTERNAL, "scan: cudaMemsetAsync");
    }
    if (!st) {
        g->prof = &p;
        st = prof_replay(g, &lc.pl, err);
        g->prof = NULL;
        if (!st && p.ce != cudaSuccess) st = g5_fail(err, G5_ERR_INTERNAL, "scan: %s", cudaGetErrorString(p.ce));
        if (!st && p.overflow) st = g5_fail(err, G5_ERR_INTERNAL, "scan: more than %u marks", p.cap);
    }
    for (uint32_t r = 0; r < g->T; r++) g->rk[r].pa = g->rk[r].pb = NULL;
    if (!st) scan_report(g, &p, report);
    cudaFree(p.dscan);
    free(p.stage);
    free(p.label);
    free(p.hscan);
    return st;
}

#else
typedef int rt_gpu_debug_unused_;
#endif
