/* --check: the CPU reference beside the GPU (gpu_model.h). Compiled to nothing unless
 * G5_WITH_CUDA.
 *
 * Two CPU runs accompany each checked GPU call:
 *  - the full reference: rt_model_forward on its own state, giving logits, every layer's output
 *    and the indexer's choices, to compare end to end (errors accumulate through the layers);
 *  - the stage run (one-rank models only): each stage of each layer recomputed on the CPU from
 *    the GPU's own input to that stage (attention from the GPU's layer input, with the CPU's
 *    attention code runtime/cpu/attn.c; the FFN/MoE from the GPU's post-attention residual), with
 *    its own caches fed the same way. Its differences are each stage's own error, which is what
 *    localizes a wrong kernel. The FFN/MoE half mirrors model.c's ffn_dense/ffn_moe for T = 1
 *    (those are static there). */
#ifdef G5_WITH_CUDA

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "format/quant.h"
#include "runtime/gpu/gpu_model.h"
#include "runtime/cpu/model_impl.h"

struct rt_gpu_check {
    rt_model *cpu;
    rt_gpu_model *gpu;
    rt_gpu_check_opts o;
    rt_state *s_ref;             /* full CPU reference */
    rt_layer_cache *tf_cache;    /* [n_layer_main] stage-run caches (T = 1) */
    uint32_t tf_cap;
    uint32_t checked;
    rt_gpu_check_summary sum;
    float *mtp_h;                /* [E] the last checked call's last GPU hidden state (MTP) */
    int mtp_have;
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
    if (!st && cpu->has_mtp && !(c->mtp_h = malloc((size_t)cpu->hp.n_embd * sizeof(float))))
        st = g5_fail(err, G5_ERR_NOMEM, "check: MTP input");
    if (!st && cpu->n_ranks == 1) {
        c->tf_cache = calloc(cpu->hp.n_layer_main ? cpu->hp.n_layer_main : 1, sizeof *c->tf_cache);
        if (!c->tf_cache) st = g5_fail(err, G5_ERR_NOMEM, "check caches");
    }
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
    for (uint32_t il = 0; c->tf_cache && il < c->cpu->hp.n_layer_main; il++) {
        free(c->tf_cache[il].lat);
        free(c->tf_cache[il].idxk);
    }
    free(c->tf_cache);
    free(c);
}

int rt_gpu_check_ok(const rt_gpu_check *c) { return c->sum.ok; }
uint32_t rt_gpu_check_n_checked(const rt_gpu_check *c) { return c->checked; }
void rt_gpu_check_get_summary(const rt_gpu_check *c, rt_gpu_check_summary *s) { *s = c->sum; }

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

/* ---- the stage run (T = 1) ---- */

typedef struct tf_work {
    rt_work w;
    float *cpu_attn;             /* [n][E] */
    float *cpu_ffn;              /* [n][E] */
    float *xmid;                 /* [n][E] */
} tf_work;

static void *zalloc(size_t bytes, int *fail) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) *fail = 1;
    return p;
}

static void tf_free(tf_work *t) {
    rt_work *w = &t->w;
    void *ps[] = {w->x, w->h, w->part, w->qr, w->kv, w->q, w->qlat, w->olat, w->ao, w->iq, w->ik, w->iw,
                  w->sel, w->n_sel, w->rope, w->wuk, w->kvx, w->latg, w->row_of, w->ga, w->gb, w->xe,
                  w->ye, w->moe, w->rl, w->choice, w->allowed, w->gscore, w->ch_e, w->ch_w, w->tok_list,
                  w->slot_list, t->cpu_attn, t->cpu_ffn, t->xmid};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) free(ps[i]);
    memset(t, 0, sizeof *t);
}

static g5_status tf_alloc(const rt_model *m, const rt_rank *rk, uint32_t n, uint32_t P, tf_work *t,
                          g5_error *err) {
    const glm5_hparams *hp = &m->hp;
    const size_t E = hp->n_embd, H = rk->H_l, N = n, F = sizeof(float), I = sizeof(int32_t);
    const size_t np = P < N * hp->idx_top_k ? P : N * hp->idx_top_k;
    const size_t FR = rk->max_rows ? rk->max_rows : 1;
    int fail = 0;
    rt_work *w = &t->w;
    memset(t, 0, sizeof *t);
    w->x = zalloc(N * E * F, &fail);
    w->h = zalloc(N * E * F, &fail);
    w->part = zalloc(N * E * F, &fail);
    w->qr = zalloc(N * hp->q_lora * F, &fail);
    w->kv = zalloc(N * (hp->kv_lora + hp->qk_rope) * F, &fail);
    w->q = zalloc(N * H * (hp->qk_nope + hp->qk_rope) * F, &fail);
    w->qlat = zalloc(N * H * hp->kv_lora * F, &fail);
    w->olat = zalloc(N * H * hp->kv_lora * F, &fail);
    w->ao = zalloc(N * H * hp->v_head * F, &fail);
    w->iq = zalloc(N * hp->idx_n_head * hp->idx_head_dim * F, &fail);
    w->ik = zalloc(N * hp->idx_head_dim * F, &fail);
    w->iw = zalloc(N * hp->idx_n_head * F, &fail);
    w->sel = zalloc(N * hp->idx_top_k * I, &fail);
    w->n_sel = zalloc(N * I, &fail);
    w->rope = zalloc(N * hp->qk_rope * F, &fail);
    w->wuk = zalloc((size_t)hp->qk_nope * hp->kv_lora * F, &fail);
    w->kvx = zalloc(np * H * (hp->qk_nope + hp->v_head) * F, &fail);
    w->latg = zalloc(np * hp->kv_lora * F, &fail);
    w->row_of = zalloc((size_t)P * I, &fail);
    w->ga = zalloc(N * FR * F, &fail);
    w->gb = zalloc(N * FR * F, &fail);
    w->xe = zalloc(N * E * F, &fail);
    w->ye = zalloc(N * E * F, &fail);
    w->moe = zalloc(N * E * F, &fail);
    w->rl = zalloc(N * hp->n_expert * F, &fail);
    w->choice = zalloc(hp->n_expert * F, &fail);
    w->allowed = zalloc(hp->n_expert, &fail);
    w->gscore = zalloc(hp->n_group * F, &fail);
    w->ch_e = zalloc(N * hp->n_expert_used * I, &fail);
    w->ch_w = zalloc(N * hp->n_expert_used * F, &fail);
    w->tok_list = zalloc(N * I, &fail);
    w->slot_list = zalloc(N * I, &fail);
    t->cpu_attn = zalloc(N * E * F, &fail);
    t->cpu_ffn = zalloc(N * E * F, &fail);
    t->xmid = zalloc(N * E * F, &fail);
    if (fail) {
        tf_free(t);
        return g5_fail(err, G5_ERR_NOMEM, "check: CPU stage buffers for %u tokens", n);
    }
    return G5_OK;
}

static g5_status tf_reserve(rt_gpu_check *c, uint32_t need, g5_error *err) {
    if (need <= c->tf_cap) return G5_OK;
    const glm5_hparams *hp = &c->cpu->hp;
    uint32_t nc = c->tf_cap ? c->tf_cap : 64;
    while (nc < need) nc *= 2;
    const size_t lw = (size_t)hp->kv_lora + hp->qk_rope, iw = hp->idx_head_dim;
    for (uint32_t il = 0; il < hp->n_layer_main; il++) {
        float *a = realloc(c->tf_cache[il].lat, (size_t)nc * lw * sizeof(float));
        if (!a) return g5_fail(err, G5_ERR_NOMEM, "check: latent cache");
        c->tf_cache[il].lat = a;
        if (!hp->idx_full[il]) continue; /* a shared layer keeps no indexer keys */
        float *b = realloc(c->tf_cache[il].idxk, (size_t)nc * iw * sizeof(float));
        if (!b) return g5_fail(err, G5_ERR_NOMEM, "check: indexer cache");
        c->tf_cache[il].idxk = b;
    }
    c->tf_cap = nc;
    return G5_OK;
}

/* model.c's FFN stages at T = 1: w->h holds the normed input; output in w->part. */
static void tf_ffn(rt_model *m, rt_rank *rk, const rt_layer *L, rt_work *w, uint32_t n) {
    const glm5_hparams *hp = &m->hp;
    const uint32_t E = hp->n_embd, U = hp->n_expert_used, NE = hp->n_expert;
    if (L->dense) {
        rt_ffn_dense(rk, L, w, n, E);
        return;
    }
    rt_matmul(rk->pool, &L->router, w->h, E, n, w->rl, NE);
    for (uint32_t t = 0; t < n; t++)
        rt_moe_route(hp, w->rl + (size_t)t * NE, L->router_b, w->choice, w->allowed, w->gscore,
                     w->ch_e + (size_t)t * U, w->ch_w + (size_t)t * U);
    rt_ffn_experts(rk, L, w, n, hp);
}

/* ---- the NextN/MTP block ---- */

/* Both blocks run from the GPU's hidden states, so the difference is the block's own: pairs
 * (hidden state at p, token at p + 1), the previous call's last hidden state pairing with this
 * call's first token. The MTP positions advance on both sides alike. */
static g5_status check_mtp(rt_gpu_check *c, const int32_t *tokens, uint32_t n, const float *g_hid, int *ok,
                           g5_error *err) {
    const glm5_hparams *hp = &c->cpu->hp;
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
            const int mok = rel <= c->o.tol_logits;
            *ok &= mok;
            if (c->o.report)
                fprintf(c->o.report, "check: mtp draft logits rel L2 %.3e (tolerance %.1e), argmax agrees at %u/%u "
                        "positions (NextN block, both from the GPU's hidden states)%s\n", rel, c->o.tol_logits, agree,
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
    const glm5_hparams *hp = &m->hp;
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
    tf_work tw;
    memset(&tw, 0, sizeof tw);
    if (!g_lh || !g_att || !g_ffn || !g_tk || !g_lg || !c_lh || !c_tk || !c_lg || !g_hid || !g_ex || !skip) {
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
    const int stages = m->n_ranks == 1;
    rt_rank *rk = &m->ranks[0];
    if (stages) {
        if ((st = tf_reserve(c, pos0 + n, err))) goto done;
        if ((st = tf_alloc(m, rk, n, pos0 + n, &tw, err))) goto done;
        size_t scratch = rt_matmul_scratch(rk->max_ncols), as = rt_attn_scratch(hp, pos0 + n);
        if ((st = rt_pool_reserve(rk->pool, scratch > as ? scratch : as, err))) goto done;
        for (uint32_t t = 0; t < n; t++)
            rt_rope_table(pos0 + t, hp->qk_rope, hp->rope_theta, tw.w.rope + (size_t)t * hp->qk_rope);
    }
    if (rf) fprintf(rf, "check: tokens %u..%u, %u rank%s on the CPU, GPU %s (%s); max |gpu - cpu| / max |cpu|%s\n", pos0,
            pos0 + n - 1, m->n_ranks, m->n_ranks > 1 ? "s" : "", rt_gpu_model_info(c->gpu)->device_name,
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
            rt_fwd f = {.m = m, .s = NULL, .n = n, .pos0 = pos0};
            memcpy(tw.w.x, xin, N * E * sizeof(float));
            rt_attn_layer(&f, rk, &rk->layers[il], &c->tf_cache[il], &tw.w);
            double s = 0;
            ov_min = 1;
            for (uint32_t t = 0; t < n; t++) {
                const double o = overlap(gsel + t * K, tw.w.sel + (size_t)t * K, (uint32_t)K);
                s += o;
                if (o < ov_min) ov_min = o;
                skip[t] = memcmp(gsel + t * K, tw.w.sel + (size_t)t * K, K * sizeof(int32_t)) != 0;
                keys_diff += skip[t];
            }
            ov_mean = s / n;
            d_att = max_rel_rows(gatt, tw.w.part, N, E, skip);
            for (uint64_t i = 0; i < N * E; i++) tw.xmid[i] = xin[i] + gatt[i];
            for (uint32_t t = 0; t < n; t++)
                rt_rmsnorm(tw.xmid + t * E, rk->layers[il].ffn_norm, E, hp->rms_eps, tw.w.h + t * E);
            tf_ffn(m, rk, &rk->layers[il], &tw.w, n);
            for (uint32_t t = 0; t < n; t++) {
                skip[t] = !rk->layers[il].dense &&
                          memcmp(g_ex + (il * N + t) * U, tw.w.ch_e + (size_t)t * U, U * sizeof(int32_t)) != 0;
                exp_diff += skip[t];
            }
            d_ffn = max_rel_rows(gffn, tw.w.part, N, E, skip);
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
        const int lok = (!stages || (d_att <= c->o.tol_stage && d_ffn <= c->o.tol_stage &&
                                     exp_diff <= (uint32_t)((1.0 - c->o.min_overlap) * n))) &&
                        ov_used >= c->o.min_overlap;
        ok &= lok;
        if (rf) fprintf(rf, "check: %5u %12.3e %6u %8.4f/%8.4f %12.3e %6u %12.3e %8.4f/%8.4f%s\n", il, d_att, keys_diff, ov_mean,
                ov_min, d_ffn, exp_diff, d_lay, rv_mean, rv_min, lok ? "" : "  <-- past tolerance");
        if (stages && d_att > c->sum.max_stage_attn) c->sum.max_stage_attn = d_att;
        if (stages && d_ffn > c->sum.max_stage_ffn) c->sum.max_stage_ffn = d_ffn;
        if (d_lay > c->sum.max_layer || d_lay != d_lay) c->sum.max_layer = d_lay;
        if (ov_used < c->sum.min_overlap_mean) c->sum.min_overlap_mean = ov_used;
    }
    const double lrel = rel_l2(g_lg, c_lg, N * V);
    const uint32_t agree = argmax_agree(g_lg, c_lg, n, V);
    const int lok = lrel <= c->o.tol_logits;
    ok &= lok;
    if (rf) fprintf(rf, "check: logits rel L2 %.3e (tolerance %.1e), argmax agrees at %u/%u positions%s\n", lrel,
            c->o.tol_logits, agree, n, lok ? "" : "  <-- past tolerance");
    if (lrel > c->sum.logits_rel_l2 || lrel != lrel) c->sum.logits_rel_l2 = lrel;
    if (m->has_mtp && (st = check_mtp(c, tokens, n, g_hid, &ok, err))) goto done;
    c->sum.ok &= ok;
    c->checked += n;
    c->sum.n_tokens = c->checked;
    if (stages) {
        /* the stage caches are complete for these positions now (rt_attn_layer wrote them) */
    }
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
    tf_free(&tw);
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
