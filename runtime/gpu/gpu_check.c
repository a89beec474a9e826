/* --check: the CPU reference beside the GPU (gpu_model.h). Compiled to nothing unless
 * G5_WITH_CUDA.
 *
 * Two CPU runs accompany each checked GPU call:
 *  - the full reference: rt_model_forward on its own state, giving logits, every layer's output
 *    and the indexer's choices, to compare end to end (errors accumulate through the layers);
 *  - the stage run (one-rank models only): each stage of each layer recomputed on the CPU from
 *    the GPU's own input to that stage (attention from the GPU's layer input; the FFN/MoE from
 *    the GPU's post-attention residual) by the CPU model's public stage functions (rt_stage_*,
 *    model.h: the forward pass's own attention and FFN/MoE code), with its own caches fed the
 *    same way. Its differences are each stage's own error, which is what localizes a wrong
 *    kernel. The output head is a stage too (the CPU's head over the GPU's last layer output).
 * Precise mode is judged on both; fast mode (opts.stagewise) on the stage run alone where there is
 * one: its fp16 products flip near-tied indexer/router choices of the random-weight oracle, and a
 * flip changes that token's layer output by 10-60%, which then travels end to end. */
#ifdef G5_WITH_CUDA

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "format/quant.h"
#include "runtime/cpu/model.h"
#include "runtime/gpu/gpu_model.h"

struct rt_gpu_check {
    rt_model *cpu;
    rt_gpu_model *gpu;
    rt_gpu_check_opts o;
    rt_state *s_ref;             /* full CPU reference */
    rt_stage *stage;             /* the stage run (one-rank models) */
    uint32_t checked;
    rt_gpu_check_summary sum;
    float *mtp_h;                /* [E] the last checked call's last GPU hidden state (MTP) */
    int mtp_have;
    /* The share criteria are judged over the whole checked run, not per call: a decode step is one
     * token, so per call they would allow no near-tie flip at all there (rt_gpu_check_ok). */
    uint32_t *exp_diff;          /* [n_layer_main] checked tokens whose expert set differs (stage run) */
    uint64_t mtp_agree, mtp_k;   /* NextN draft argmax agreements over positions checked */
};

void rt_gpu_check_opts_default(rt_gpu_check_opts *o) {
    memset(o, 0, sizeof *o);
    o->n_tokens = 0;
    o->tol_stage = 1e-3;
    o->tol_logits = 1e-3;
    o->min_overlap = 0.95;
    o->report = NULL;
}

g5_status rt_gpu_check_create(rt_model *cpu, rt_gpu_model *gpu, const rt_gpu_check_opts *o,
                              rt_gpu_check **out, g5_error *err) {
    *out = NULL;
    rt_gpu_check *c = calloc(1, sizeof *c);
    if (!c) return g5_fail(err, G5_ERR_NOMEM, "check");
    c->cpu = cpu;
    c->gpu = gpu;
    if (o) c->o = *o;
    else rt_gpu_check_opts_default(&c->o);
    c->sum.ok = 1;
    c->sum.min_overlap_mean = 1.0;
    /* several processes compute the same report (their CPU and GPU outputs are whole): one writes it */
    if (rt_comm_rank(rt_model_comm(cpu)) != 0) c->o.report = NULL;
    else if (!c->o.report) c->o.report = stderr;
    g5_status st = rt_state_create(cpu, &c->s_ref, err);
    if (!st && !(c->exp_diff = calloc(rt_model_hparams(cpu)->n_layer_main + 1, sizeof(uint32_t))))
        st = g5_fail(err, G5_ERR_NOMEM, "check: expert counts");
    if (!st && rt_model_has_mtp(cpu) && !(c->mtp_h = malloc((size_t)rt_model_hparams(cpu)->n_embd * sizeof(float))))
        st = g5_fail(err, G5_ERR_NOMEM, "check: MTP input");
    if (!st && rt_model_n_ranks(cpu) == 1) st = rt_stage_create(cpu, &c->stage, err);
    if (st) {
        rt_gpu_check_free(c);
        return st;
    }
    *out = c;
    return G5_OK;
}

void rt_gpu_check_free(rt_gpu_check *c) {
    if (!c) return;
    rt_state_free(c->s_ref);
    free(c->mtp_h);
    free(c->exp_diff);
    rt_stage_free(c->stage);
    free(c);
}

/* The per-call verdicts (sum.ok) and the run's shares: in each layer at most 1 - min_overlap of
 * the checked tokens with another expert set than the CPU stage's, and in fast mode the NextN
 * draft argmax agreeing at >= 0.9 of its positions. */
static int shares_ok(const rt_gpu_check *c) {
    const uint32_t Lm = rt_model_hparams(c->cpu)->n_layer_main;
    for (uint32_t il = 0; il < Lm; il++)
        if (c->exp_diff[il] > (1.0 - c->o.min_overlap) * c->checked) return 0;
    return !c->o.stagewise || (double)c->mtp_agree >= 0.9 * (double)c->mtp_k;
}
int rt_gpu_check_ok(const rt_gpu_check *c) { return c->sum.ok && shares_ok(c); }
uint32_t rt_gpu_check_n_checked(const rt_gpu_check *c) { return c->checked; }
void rt_gpu_check_get_summary(const rt_gpu_check *c, rt_gpu_check_summary *s) {
    *s = c->sum;
    s->ok = rt_gpu_check_ok(c);
    const uint32_t Lm = rt_model_hparams(c->cpu)->n_layer_main;
    s->max_exp_diff = 0;
    for (uint32_t il = 0; il < Lm; il++)
        if (c->exp_diff[il] > s->max_exp_diff) s->max_exp_diff = c->exp_diff[il];
    s->mtp_agree = (uint32_t)c->mtp_agree;
}

/* max |a - b| / max |b| over rows [n][w]; rows with skip[r] set count only in the denominator. */
static double max_rel_rows(const float *a, const float *b, uint64_t n, uint64_t w, const uint8_t *skip) {
    double md = 0, mb = 0;
    for (uint64_t r = 0; r < n; r++)
        for (uint64_t i = r * w; i < (r + 1) * w; i++) {
            if (fabs((double)b[i]) > mb) mb = fabs((double)b[i]);
            if (skip && skip[r]) continue;
            const double d = fabs((double)a[i] - (double)b[i]);
            if (d > md || d != d) md = d != d ? INFINITY : d;
        }
    return mb > 0 ? md / mb : md;
}
static double max_rel(const float *a, const float *b, uint64_t n) { return max_rel_rows(a, b, 1, n, NULL); }

static double rel_l2(const float *a, const float *b, uint64_t n) {
    double num = 0, den = 0;
    for (uint64_t i = 0; i < n; i++) {
        const double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    if (num != num) return INFINITY;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* |A ∩ B| / |B| for two ascending, -1 padded selections of k. */
static double overlap(const int32_t *a, const int32_t *b, uint32_t k) {
    uint32_t nb = 0, both = 0, i = 0, j = 0;
    for (uint32_t q = 0; q < k; q++) nb += b[q] >= 0;
    while (i < k && j < k && a[i] >= 0 && b[j] >= 0) {
        if (a[i] == b[j]) {
            both++;
            i++;
            j++;
        } else if (a[i] < b[j]) {
            i++;
        } else {
            j++;
        }
    }
    return nb ? (double)both / nb : 1.0;
}

/* Rows of a and b ([n][V] logits) whose argmax (first on ties) is the same. */
static uint32_t argmax_agree(const float *a, const float *b, uint32_t n, uint64_t V) {
    uint32_t agree = 0;
    for (uint32_t t = 0; t < n; t++) {
        uint64_t ia = 0, ib = 0;
        for (uint64_t v = 1; v < V; v++) {
            if (a[t * V + v] > a[t * V + ia]) ia = v;
            if (b[t * V + v] > b[t * V + ib]) ib = v;
        }
        agree += ia == ib;
    }
    return agree;
}

/* ---- the NextN/MTP block ---- */

/* Both blocks run from the GPU's hidden states, so the difference is the block's own: pairs
 * (hidden state at p, token at p + 1), the previous call's last hidden state pairing with this
 * call's first token. The MTP positions advance on both sides alike. */
static g5_status check_mtp(rt_gpu_check *c, const int32_t *tokens, uint32_t n, const float *g_hid, int *ok,
                           g5_error *err) {
    const glm5_hparams *hp = rt_model_hparams(c->cpu);
    const uint64_t E = hp->n_embd, V = hp->n_vocab;
    const uint32_t k = (c->mtp_have ? 1 : 0) + n - 1;
    if (rt_state_mtp_n_past(c->s_ref) != rt_gpu_mtp_n_past(c->gpu))
        return g5_fail(err, G5_ERR_INVALID_ARG, "check: the CPU reference's MTP block is at position %u, the GPU's at %u",
                       rt_state_mtp_n_past(c->s_ref), rt_gpu_mtp_n_past(c->gpu));
    g5_status st = G5_OK;
    if (k) {
        float *hin = malloc(k * E * sizeof(float)), *gd = malloc(k * V * sizeof(float));
        float *cd = malloc(k * V * sizeof(float));
        int32_t *nx = malloc(k * sizeof(int32_t));
        if (!hin || !gd || !cd || !nx) {
            st = g5_fail(err, G5_ERR_NOMEM, "check: MTP buffers for %u tokens", k);
        } else {
            uint32_t j = 0;
            if (c->mtp_have) {
                memcpy(hin, c->mtp_h, E * sizeof(float));
                nx[j++] = tokens[0];
            }
            for (uint32_t t = 0; t + 1 < n; t++, j++) {
                memcpy(hin + j * E, g_hid + t * E, E * sizeof(float));
                nx[j] = tokens[t + 1];
            }
            st = rt_gpu_mtp(c->gpu, hin, nx, k, gd, 1, err);
            if (!st && (st = rt_model_mtp(c->cpu, c->s_ref, hin, nx, k, cd, 1, err)))
                g5_error_prefix(err, "check: CPU MTP");
        }
        if (!st) {
            const double rel = rel_l2(gd, cd, k * V);
            const uint32_t agree = argmax_agree(gd, cd, k, V);
            /* fast mode: the NextN block's router sees its int8-input projection (specs/numerics.md),
             * so near-tied expert choices flip as in the main model: its drafts are held to the fast
             * bar's tightest value (0.09) with argmax agreement >= 0.9 over the run (shares_ok) */
            const double tol = c->o.stagewise ? 0.09 : c->o.tol_logits;
            const int mok = rel <= tol;
            *ok &= mok;
            c->mtp_agree += agree;
            c->mtp_k += k;
            if (c->o.report)
                fprintf(c->o.report, "check: mtp draft logits rel L2 %.3e (tolerance %.1e), argmax agrees at %u/%u "
                        "positions (NextN block, both from the GPU's hidden states)%s\n", rel, tol, agree,
                        k, mok ? "" : "  <-- past tolerance");
            if (rel > c->sum.mtp_rel_l2 || rel != rel) c->sum.mtp_rel_l2 = rel;
            c->sum.mtp_n += k;
        }
        free(hin);
        free(gd);
        free(cd);
        free(nx);
    }
    if (!st) {
        memcpy(c->mtp_h, g_hid + (uint64_t)(n - 1) * E, E * sizeof(float));
        c->mtp_have = 1;
    }
    return st;
}

/* ---- the checked call ---- */

g5_status rt_gpu_check_forward(rt_gpu_check *c, const int32_t *tokens, uint32_t n,
                               const rt_gpu_outputs *out, g5_error *err) {
    if (n == 0) return G5_OK;
    if (c->checked >= c->o.n_tokens) return rt_gpu_forward(c->gpu, tokens, n, out, err);
    rt_model *m = c->cpu;
    const glm5_hparams *hp = rt_model_hparams(m);
    const uint64_t E = hp->n_embd, Lm = hp->n_layer_main, K = hp->idx_top_k, V = hp->n_vocab, N = n;
    const uint32_t pos0 = rt_gpu_n_past(c->gpu);
    if (rt_state_n_past(c->s_ref) != pos0)
        return g5_fail(err, G5_ERR_INVALID_ARG, "check: the CPU reference is at position %u, the GPU at %u",
                       rt_state_n_past(c->s_ref), pos0);
    FILE *rf = c->o.report;
    g5_status st = G5_OK;
    float *g_lh = malloc((Lm + 1) * N * E * sizeof(float));
    float *g_att = malloc(Lm * N * E * sizeof(float));
    float *g_ffn = malloc(Lm * N * E * sizeof(float));
    int32_t *g_tk = malloc(Lm * N * K * sizeof(int32_t));
    float *g_lg = malloc(N * V * sizeof(float));
    float *c_lh = malloc((Lm + 1) * N * E * sizeof(float));
    int32_t *c_tk = malloc(Lm * N * K * sizeof(int32_t));
    float *c_lg = malloc(N * V * sizeof(float));
    float *g_hid = malloc(N * E * sizeof(float));
    const uint64_t U = hp->n_expert_used;
    int32_t *g_ex = malloc(Lm * N * U * sizeof(int32_t));
    uint8_t *skip = malloc(N);
    const int stages = c->stage != NULL;
    float *s_att = stages ? malloc(N * E * sizeof(float)) : NULL, *s_ffn = stages ? malloc(N * E * sizeof(float)) : NULL;
    float *xmid = stages ? malloc(N * E * sizeof(float)) : NULL, *s_lg = stages ? malloc(N * V * sizeof(float)) : NULL;
    int32_t *s_sel = stages ? malloc(N * K * sizeof(int32_t)) : NULL, *s_ex = stages ? malloc(N * U * sizeof(int32_t)) : NULL;
    if (!g_lh || !g_att || !g_ffn || !g_tk || !g_lg || !c_lh || !c_tk || !c_lg || !g_hid || !g_ex || !skip ||
        (stages && (!s_att || !s_ffn || !xmid || !s_lg || !s_sel || !s_ex))) {
        st = g5_fail(err, G5_ERR_NOMEM, "check buffers for %u tokens", n);
        goto done;
    }
    rt_gpu_outputs go = {.logits = g_lg, .all_logits = 1, .hidden = g_hid, .layer_hidden = g_lh,
                         .attn_out = g_att, .ffn_out = g_ffn, .topk = g_tk, .experts = g_ex};
    if ((st = rt_gpu_forward(c->gpu, tokens, n, &go, err))) goto done;
    rt_outputs co = {.logits = c_lg, .all_logits = 1, .layer_hidden = c_lh, .topk = c_tk};
    if ((st = rt_model_forward(m, c->s_ref, tokens, n, &co, err))) {
        g5_error_prefix(err, "check: CPU reference");
        goto done;
    }
    const uint32_t n_ranks = rt_model_n_ranks(m);
    if (stages && (st = rt_stage_begin(c->stage, pos0, n, err))) goto done;
    if (rf) fprintf(rf, "check: tokens %u..%u, %u rank%s on the CPU, GPU %s (%s); max |gpu - cpu| / max |cpu|%s\n", pos0,
            pos0 + n - 1, n_ranks, n_ranks > 1 ? "s" : "", rt_gpu_model_info(c->gpu)->device_name,
            rt_gpu_model_info(c->gpu)->collective,
            stages ? "; stages recomputed on the CPU from the GPU's stage inputs" : "; stage columns need one rank");
    if (rf) fprintf(rf, "check: %5s %12s %6s %17s %12s %6s %12s %17s\n", "layer", "attn_out", "keys!=", "topk_overlap",
            "moe_out", "exp!=", "layer_out", "topk_vs_cpu_run");
    int ok = 1;
    for (uint32_t il = 0; il < Lm; il++) {
        double d_att = NAN, d_ffn = NAN, ov_mean = 1, ov_min = 1, rv_mean = 1, rv_min = 1;
        uint32_t keys_diff = 0, exp_diff = 0;
        const float *xin = g_lh + il * N * E;
        const float *gatt = g_att + il * N * E, *gffn = g_ffn + il * N * E;
        const int32_t *gsel = g_tk + il * N * K;
        if (stages) {
            rt_stage_attn(c->stage, il, xin, s_att, s_sel);
            double s = 0;
            ov_min = 1;
            for (uint32_t t = 0; t < n; t++) {
                const double o = overlap(gsel + t * K, s_sel + (size_t)t * K, (uint32_t)K);
                s += o;
                if (o < ov_min) ov_min = o;
                skip[t] = memcmp(gsel + t * K, s_sel + (size_t)t * K, K * sizeof(int32_t)) != 0;
                keys_diff += skip[t];
            }
            ov_mean = s / n;
            d_att = max_rel_rows(gatt, s_att, N, E, skip);
            for (uint64_t i = 0; i < N * E; i++) xmid[i] = xin[i] + gatt[i];
            const int dense = glm5_layer_is_dense(hp, il);
            rt_stage_ffn(c->stage, il, xmid, s_ffn, s_ex);
            for (uint32_t t = 0; t < n; t++) {
                skip[t] = !dense && memcmp(g_ex + (il * N + t) * U, s_ex + (size_t)t * U, U * sizeof(int32_t)) != 0;
                exp_diff += skip[t];
            }
            d_ffn = max_rel_rows(gffn, s_ffn, N, E, skip);
        }
        double s = 0;
        for (uint32_t t = 0; t < n; t++) {
            const double o = overlap(gsel + t * K, c_tk + (il * N + t) * K, (uint32_t)K);
            s += o;
            if (o < rv_min) rv_min = o;
        }
        rv_mean = s / n;
        const double d_lay = max_rel(g_lh + (il + 1) * N * E, c_lh + (il + 1) * N * E, N * E);
        const double ov_used = stages ? ov_mean : rv_mean;
        c->exp_diff[il] += exp_diff; /* its share is judged over the run (shares_ok) */
        const int lok = (!stages || (d_att <= c->o.tol_stage && d_ffn <= c->o.tol_stage)) && ov_used >= c->o.min_overlap;
        ok &= lok;
        if (rf) fprintf(rf, "check: %5u %12.3e %6u %8.4f/%8.4f %12.3e %6u %12.3e %8.4f/%8.4f%s\n", il, d_att, keys_diff, ov_mean,
                ov_min, d_ffn, exp_diff, d_lay, rv_mean, rv_min, lok ? "" : "  <-- past tolerance");
        if (stages && d_att > c->sum.max_stage_attn) c->sum.max_stage_attn = d_att;
        if (stages && d_ffn > c->sum.max_stage_ffn) c->sum.max_stage_ffn = d_ffn;
        if (d_lay > c->sum.max_layer || d_lay != d_lay) c->sum.max_layer = d_lay;
        if (ov_used < c->sum.min_overlap_mean) c->sum.min_overlap_mean = ov_used;
    }
    const int judged = !(c->o.stagewise && stages); /* the end-to-end logits join the verdict */
    if (stages) {
        rt_stage_head(c->stage, g_lh + Lm * N * E, s_lg);
        const double hrel = rel_l2(g_lg, s_lg, N * V);
        const int hok = hrel <= c->o.tol_logits;
        ok &= hok;
        if (rf) fprintf(rf, "check: head logits rel L2 %.3e (tolerance %.1e), argmax agrees at %u/%u positions (output head "
                "from the GPU's last layer output)%s\n", hrel, c->o.tol_logits, argmax_agree(g_lg, s_lg, n, V), n,
                hok ? "" : "  <-- past tolerance");
        if (hrel > c->sum.head_rel_l2 || hrel != hrel) c->sum.head_rel_l2 = hrel;
    }
    const double lrel = rel_l2(g_lg, c_lg, N * V);
    const uint32_t agree = argmax_agree(g_lg, c_lg, n, V);
    const int lok = lrel <= c->o.tol_logits;
    if (judged) ok &= lok;
    if (rf) fprintf(rf, "check: logits rel L2 %.3e (tolerance %.1e), argmax agrees at %u/%u positions%s\n", lrel,
            c->o.tol_logits, agree, n, !judged ? "  (end to end: reported, not judged)" : lok ? "" : "  <-- past tolerance");
    if (lrel > c->sum.logits_rel_l2 || lrel != lrel) c->sum.logits_rel_l2 = lrel;
    if (rt_model_has_mtp(m) && (st = check_mtp(c, tokens, n, g_hid, &ok, err))) goto done;
    c->sum.ok &= ok;
    c->checked += n;
    c->sum.n_tokens = c->checked;
    if (out) {
        if (out->logits)
            memcpy(out->logits, out->all_logits ? g_lg : g_lg + (N - 1) * V,
                   (out->all_logits ? N : 1) * V * sizeof(float));
        if (out->hidden) memcpy(out->hidden, g_hid, N * E * sizeof(float));
        if (out->layer_hidden) memcpy(out->layer_hidden, g_lh, (Lm + 1) * N * E * sizeof(float));
        if (out->attn_out) memcpy(out->attn_out, g_att, Lm * N * E * sizeof(float));
        if (out->ffn_out) memcpy(out->ffn_out, g_ffn, Lm * N * E * sizeof(float));
        if (out->topk) memcpy(out->topk, g_tk, Lm * N * K * sizeof(int32_t));
        if (out->experts) memcpy(out->experts, g_ex, Lm * N * U * sizeof(int32_t));
    }
done:
    free(s_att);
    free(s_ffn);
    free(xmid);
    free(s_lg);
    free(s_sel);
    free(s_ex);
    free(g_lh);
    free(g_att);
    free(g_ffn);
    free(g_tk);
    free(g_lg);
    free(c_lh);
    free(c_tk);
    free(c_lg);
    free(g_hid);
    free(g_ex);
    free(skip);
    return st;
}

#else
typedef int rt_gpu_check_unused_;
#endif
