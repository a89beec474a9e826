/* MLA attention with the DSA lightning indexer (one rank, one layer).
 *
 * Math (transformers' GlmMoeDsaAttention / GlmMoeDsaIndexer, llama.cpp's glm-dsa graph):
 *   qr   = RMSNorm(q_a(h))                         h = RMSNorm(x) (attn_norm)
 *   q    = q_b(qr), per head [q_nope (qk_nope) | q_pe (qk_rope)], RoPE on q_pe
 *   kv   = kv_a(h) = [latent (kv_lora) | k_pe (qk_rope)]; latent RMSNorm'ed, RoPE on k_pe
 *   kv_b = per head qk_nope rows of W_UK then v_head rows of W_UV (each kv_lora wide)
 *   score(t, s) = (q_nope . W_UK latent_s + q_pe . k_pe_s) / sqrt(qk_nope + qk_rope)
 *   out_h = sum_s softmax(score)_s W_UV latent_s, over the keys the indexer selected
 * RoPE rotates adjacent pairs (interleaved) with theta from the metadata, for both MLA and the
 * indexer (checked against the oracle: the split-half variant does not reproduce it; transformers
 * 5.24's GLM-MoE-DSA indexer says interleaved too, and tests/data/glm52-tiny agrees).
 * IndexShare (GLM-5.2): a shared layer (!L->has_indexer) skips all of the indexer and attends the
 * keys in w->sel, which the last full layer left there (specs/model-family.md).
 * Indexer: iq = idx_q_b(qr) per head [rope part (first qk_rope dims) | rest],
 *   ik = LayerNorm(idx_k(h)) with weight and bias, same RoPE on its first qk_rope dims,
 *   w = idx_proj(h) / sqrt(idx_head_dim * idx_n_head),
 *   I(t, s) = sum_h w_h relu(iq_h . ik_s) over causal s <= t;
 *   query t attends its top_k keys by I when more than top_k are visible, otherwise all visible
 *   keys. (transformers takes topk(min(top_k, T)) of I + causal mask and then applies the causal
 *   mask again, which is the same thing.) Ties go to the lower position. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "format/quant.h"
#include "runtime/cpu/model_impl.h"

size_t rt_attn_scratch(const glm5_hparams *hp, uint32_t P) {
    return ((size_t)P + hp->idx_top_k + 64) * sizeof(float) * 2;
}

/* ---- cache rows ----
 * Where one row's cache lives: a contiguous rt_layer_cache (one "block" as long as any
 * position), or its state's block table. Only addresses differ; the arithmetic on the rows is
 * the same, so paged and contiguous caches give the same bits. */

typedef struct kv_view {
    float *const *lat_blk;
    float *const *idx_blk;
    size_t lat_off, idx_off;
    uint32_t bt, kvw, idw;
} kv_view;

static inline float *kv_lat(const kv_view *v, uint32_t pos) {
    return v->lat_blk[pos / v->bt] + v->lat_off + (size_t)(pos % v->bt) * v->kvw;
}
static inline float *kv_idx(const kv_view *v, uint32_t pos) {
    return v->idx_blk[pos / v->bt] + v->idx_off + (size_t)(pos % v->bt) * v->idw;
}

static void kv_view_of(const rt_fwd *f, uint32_t r, uint32_t il, const rt_layer_cache *C, uint32_t t,
                       kv_view *v) {
    const glm5_hparams *hp = &f->m->hp;
    v->kvw = hp->kv_lora + hp->qk_rope;
    v->idw = hp->idx_head_dim;
    if (C) {
        v->lat_blk = &C->lat;
        v->idx_blk = &C->idxk;
        v->lat_off = v->idx_off = 0;
        v->bt = UINT32_MAX;
        return;
    }
    const rt_state *st = rt_fwd_state(f, t);
    const rt_kvtab *tab = il >= hp->n_layer_main ? &st->mtp : &st->main;
    const rt_kvpool *p = tab->pool;
    const size_t i = (size_t)(r - f->m->rank0) * p->nl + (il - p->il0); /* pools hold local ranks */
    v->lat_blk = v->idx_blk = tab->ptr;
    v->lat_off = p->lat_off[i];
    v->idx_off = p->idx_off[i];
    v->bt = p->bt;
}

/* ---- indexer ---- */

typedef struct idx_ctx {
    const glm5_hparams *hp;
    rt_pool *pool;
    const rt_fwd *f;
    uint32_t r, il;
    const rt_layer_cache *C;
    rt_work *w;
} idx_ctx;

/* a is a better key than b */
static inline int key_better(const float *sc, int32_t a, int32_t b) {
    return sc[a] > sc[b] || (sc[a] == sc[b] && a < b);
}

static void heap_sift_down(int32_t *heap, uint32_t n, uint32_t i, const float *sc) {
    /* min-heap by key quality: the root is the worst key kept */
    for (;;) {
        uint32_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && key_better(sc, heap[m], heap[l])) m = l;
        if (r < n && key_better(sc, heap[m], heap[r])) m = r;
        if (m == i) return;
        int32_t tmp = heap[i];
        heap[i] = heap[m];
        heap[m] = tmp;
        i = m;
    }
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void idx_task(void *vc, uint64_t t, uint32_t worker) {
    const idx_ctx *c = vc;
    const glm5_hparams *hp = c->hp;
    rt_work *w = c->w;
    const uint32_t K = hp->idx_top_k, IH = hp->idx_n_head, ID = hp->idx_head_dim;
    const uint32_t p = rt_fwd_pos(c->f, (uint32_t)t);
    int32_t *sel = w->sel + t * K;
    if (p + 1 <= K) {
        for (uint32_t s = 0; s <= p; s++) sel[s] = (int32_t)s;
        for (uint32_t s = p + 1; s < K; s++) sel[s] = -1;
        w->n_sel[t] = p + 1;
        return;
    }
    float *sc = rt_pool_scratch(c->pool, worker);           /* [p + 1] */
    int32_t *heap = (int32_t *)(void *)(sc + p + 1);        /* [K] */
    const float *iq = w->iq + t * (size_t)IH * ID;          /* [IH][ID] */
    const float *iw = w->iw + t * (size_t)IH;
    kv_view v;
    kv_view_of(c->f, c->r, c->il, c->C, (uint32_t)t, &v);
    for (uint32_t s = 0; s <= p; s++) {
        const float *k = kv_idx(&v, s);
        float acc = 0.0f;
        for (uint32_t h = 0; h < IH; h++) {
            float d = rt_dot(iq + (size_t)h * ID, k, ID);
            if (d > 0.0f) acc += iw[h] * d;
        }
        sc[s] = acc;
    }
    uint32_t nh = 0;
    for (uint32_t s = 0; s <= p; s++) {
        if (nh < K) {
            /* sift up */
            uint32_t i = nh++;
            heap[i] = (int32_t)s;
            while (i) {
                uint32_t par = (i - 1) / 2;
                if (!key_better(sc, heap[par], heap[i])) break;
                int32_t tmp = heap[i];
                heap[i] = heap[par];
                heap[par] = tmp;
                i = par;
            }
        } else if (key_better(sc, (int32_t)s, heap[0])) {
            heap[0] = (int32_t)s;
            heap_sift_down(heap, nh, 0, sc);
        }
    }
    memcpy(sel, heap, K * sizeof *sel);
    qsort(sel, K, sizeof *sel, cmp_i32);
    w->n_sel[t] = K;
}

/* Indexer projections for tokens [a, b): queries, weights and the keys (w->ik, for the cache). */
static void indexer_project(rt_model *m, rt_rank *rk, rt_layer *L, rt_work *w, uint32_t a,
                            uint32_t b) {
    const glm5_hparams *hp = &m->hp;
    const uint32_t E = hp->n_embd, IH = hp->idx_n_head, ID = hp->idx_head_dim, R = hp->qk_rope;
    const size_t QW = (size_t)IH * ID;
    rt_matmul(rk->pool, &L->idx_q_b, w->qr + (size_t)a * hp->q_lora, hp->q_lora, b - a, w->iq + a * QW, QW);
    rt_matmul(rk->pool, &L->idx_k, w->h + (size_t)a * E, E, b - a, w->ik + (size_t)a * ID, ID);
    rt_matmul(rk->pool, &L->idx_proj, w->h + (size_t)a * E, E, b - a, w->iw + (size_t)a * IH, IH);
    const float wscale = (float)(1.0 / sqrt((double)ID * (double)IH));
    for (uint32_t t = a; t < b; t++) {
        const float *cs = w->rope + (size_t)t * R;
        for (uint32_t h = 0; h < IH; h++) rt_rope_apply(w->iq + ((size_t)t * IH + h) * ID, R, cs);
        float *k = w->ik + (size_t)t * ID;
        rt_layernorm(k, L->idx_k_norm, L->idx_k_norm_b, ID, RT_IDX_NORM_EPS, k);
        rt_rope_apply(k, R, cs);
        for (uint32_t h = 0; h < IH; h++) w->iw[(size_t)t * IH + h] *= wscale;
    }
}

typedef struct idx_range_ctx {
    idx_ctx c;
    uint32_t a;
} idx_range_ctx;

static void idx_range_task(void *vc, uint64_t t, uint32_t worker) {
    const idx_range_ctx *c = vc;
    idx_task((void *)&c->c, c->a + t, worker);
}

/* ---- attention cores ---- */

typedef struct att_ctx {
    const glm5_hparams *hp;
    rt_pool *pool;
    const rt_fwd *f;
    uint32_t r, il;
    const rt_layer_cache *C;
    rt_work *w;
    uint32_t H_l;
    float scale;
} att_ctx;

/* softmax over sc[0..n) in place, returns nothing; weights sum to 1 */
static void softmax_inplace(float *sc, uint32_t n) {
    float mx = -INFINITY;
    for (uint32_t j = 0; j < n; j++) mx = sc[j] > mx ? sc[j] : mx;
    double sum = 0;
    for (uint32_t j = 0; j < n; j++) {
        sc[j] = expf(sc[j] - mx);
        sum += sc[j];
    }
    float inv = (float)(1.0 / sum);
    for (uint32_t j = 0; j < n; j++) sc[j] *= inv;
}

/* Absorbed: queries and outputs live in the kv_lora latent space. */
static void att_absorbed_task(void *vc, uint64_t task, uint32_t worker) {
    const att_ctx *c = vc;
    const glm5_hparams *hp = c->hp;
    rt_work *w = c->w;
    const uint32_t H_l = c->H_l, KL = hp->kv_lora, NOPE = hp->qk_nope, R = hp->qk_rope;
    const uint64_t t = task / H_l, h = task % H_l;
    const uint32_t K = hp->idx_top_k;
    const int32_t *sel = w->sel + t * K;
    const uint32_t ns = w->n_sel[t];
    const float *ql = w->qlat + (t * H_l + h) * KL;
    const float *qpe = w->q + (t * H_l + h) * (NOPE + R) + NOPE;
    float *sc = rt_pool_scratch(c->pool, worker);
    kv_view v;
    kv_view_of(c->f, c->r, c->il, c->C, (uint32_t)t, &v);
    for (uint32_t j = 0; j < ns; j++) {
        const float *row = kv_lat(&v, (uint32_t)sel[j]);
        sc[j] = (rt_dot(ql, row, KL) + rt_dot(qpe, row + KL, R)) * c->scale;
    }
    softmax_inplace(sc, ns);
    float *out = w->olat + (t * H_l + h) * KL;
    memset(out, 0, KL * sizeof(float));
    for (uint32_t j = 0; j < ns; j++) rt_axpy(sc[j], kv_lat(&v, (uint32_t)sel[j]), out, KL);
}

typedef struct absorb_ctx {
    const glm5_hparams *hp;
    rt_work *w;
    uint32_t H_l, h, n;
    const float *wuk;   /* [qk_nope][kv_lora] */
} absorb_ctx;

#define ABSORB_TOKENS 8 /* tokens per task: each W_UK row is loaded once for all of them */

/* qlat[t][h] = sum_d q_nope[t][h][d] W_UK[h][d][:], for a block of tokens. The sum runs over d
 * in order for every token, so blocking does not change the result. */
static void absorb_task(void *vc, uint64_t task, uint32_t worker) {
    (void)worker;
    const absorb_ctx *c = vc;
    const uint32_t KL = c->hp->kv_lora, NOPE = c->hp->qk_nope, R = c->hp->qk_rope;
    const uint64_t t0 = task * ABSORB_TOKENS;
    const uint64_t t1 = t0 + ABSORB_TOKENS < c->n ? t0 + ABSORB_TOKENS : c->n;
    for (uint64_t t = t0; t < t1; t++) memset(c->w->qlat + (t * c->H_l + c->h) * KL, 0, KL * sizeof(float));
    for (uint32_t d = 0; d < NOPE; d++) {
        const float *wd = c->wuk + (size_t)d * KL;
        for (uint64_t t = t0; t < t1; t++) {
            const float *qn = c->w->q + (t * c->H_l + c->h) * (NOPE + R);
            rt_axpy(qn[d], wd, c->w->qlat + (t * c->H_l + c->h) * KL, KL);
        }
    }
}

static void attn_absorbed(rt_fwd *f, rt_rank *rk, rt_layer *L, uint32_t il, rt_layer_cache *C,
                          rt_work *w, uint32_t n) {
    rt_model *m = f->m;
    const glm5_hparams *hp = &m->hp;
    const uint32_t H_l = rk->H_l, KL = hp->kv_lora, NOPE = hp->qk_nope, V = hp->v_head;
    for (uint32_t h = 0; h < H_l; h++) {
        const uint64_t r0 = (uint64_t)h * (NOPE + V);
        const float *wuk;
        if (L->kv_b.type == QT_F32) {
            wuk = (const float *)(const void *)(L->kv_b.data + r0 * L->kv_b.row_bytes);
        } else {
            for (uint32_t d = 0; d < NOPE; d++) rt_mat_row(&L->kv_b, r0 + d, w->wuk + (size_t)d * KL);
            wuk = w->wuk;
        }
        absorb_ctx ac = {hp, w, H_l, h, n, wuk};
        rt_pool_run(rk->pool, (n + ABSORB_TOKENS - 1) / ABSORB_TOKENS, absorb_task, &ac);
    }
    att_ctx c = {hp, rk->pool, f, rk->r, il, C, w, H_l, (float)(1.0 / sqrt((double)(NOPE + hp->qk_rope)))};
    rt_pool_run(rk->pool, (uint64_t)n * H_l, att_absorbed_task, &c);
    for (uint32_t h = 0; h < H_l; h++) {
        rt_mat wuv = L->kv_b;
        wuv.data += ((uint64_t)h * (NOPE + V) + NOPE) * wuv.row_bytes;
        wuv.nrows = V;
        rt_matmul(rk->pool, &wuv, w->olat + (size_t)h * KL, (size_t)H_l * KL, n, w->ao + (size_t)h * V,
                  (size_t)H_l * V);
    }
}

/* Expanded: K = [W_UK latent | k_pe], V = W_UV latent per head, for the attended positions. */
static void att_expanded_task(void *vc, uint64_t task, uint32_t worker) {
    const att_ctx *c = vc;
    const glm5_hparams *hp = c->hp;
    rt_work *w = c->w;
    const uint32_t H_l = c->H_l, KL = hp->kv_lora, NOPE = hp->qk_nope, R = hp->qk_rope, V = hp->v_head;
    const size_t XW = (size_t)H_l * (NOPE + V);
    const uint64_t t = task / H_l, h = task % H_l;
    const uint32_t K = hp->idx_top_k;
    const int32_t *sel = w->sel + t * K;
    const uint32_t ns = w->n_sel[t];
    const float *qn = w->q + (t * H_l + h) * (NOPE + R);
    const float *qpe = qn + NOPE;
    float *sc = rt_pool_scratch(c->pool, worker);
    kv_view v;
    kv_view_of(c->f, c->r, c->il, c->C, (uint32_t)t, &v);
    for (uint32_t j = 0; j < ns; j++) {
        const float *kx = w->kvx + (size_t)w->row_of[sel[j]] * XW + h * (NOPE + V);
        const float *kpe = kv_lat(&v, (uint32_t)sel[j]) + KL;
        sc[j] = (rt_dot(qn, kx, NOPE) + rt_dot(qpe, kpe, R)) * c->scale;
    }
    softmax_inplace(sc, ns);
    float *out = w->ao + (t * H_l + h) * V;
    memset(out, 0, V * sizeof(float));
    for (uint32_t j = 0; j < ns; j++) {
        const float *vx = w->kvx + (size_t)w->row_of[sel[j]] * XW + h * (NOPE + V) + NOPE;
        rt_axpy(sc[j], vx, out, V);
    }
}

/* All rows in one sequence (row_of is by position). */
static void attn_expanded(rt_fwd *f, rt_rank *rk, rt_layer *L, uint32_t il, rt_layer_cache *C,
                          rt_work *w, uint32_t n, uint32_t P) {
    rt_model *m = f->m;
    const glm5_hparams *hp = &m->hp;
    kv_view v;
    kv_view_of(f, rk->r, il, C, 0, &v);
    const uint32_t H_l = rk->H_l, KL = hp->kv_lora, R = hp->qk_rope, K = hp->idx_top_k;
    for (uint32_t s = 0; s < P; s++) w->row_of[s] = -1;
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t j = 0; j < w->n_sel[t]; j++) w->row_of[w->sel[(size_t)t * K + j]] = 0;
    uint32_t np = 0;
    for (uint32_t s = 0; s < P; s++) {
        if (w->row_of[s] < 0) continue;
        memcpy(w->latg + (size_t)np * KL, kv_lat(&v, s), KL * sizeof(float));
        w->row_of[s] = (int32_t)np++;
    }
    rt_matmul(rk->pool, &L->kv_b, w->latg, KL, np, w->kvx, (size_t)H_l * (hp->qk_nope + hp->v_head));
    att_ctx c = {hp, rk->pool, f, rk->r, il, C, w, H_l, (float)(1.0 / sqrt((double)(hp->qk_nope + R)))};
    rt_pool_run(rk->pool, (uint64_t)n * H_l, att_expanded_task, &c);
}

/* ---- the layer ---- */

void rt_attn_layer(rt_fwd *f, rt_rank *rk, rt_layer *L, rt_layer_cache *C, rt_work *w) {
    rt_model *m = f->m;
    const glm5_hparams *hp = &m->hp;
    const uint32_t n = f->n, il = (uint32_t)(L - rk->layers);
    const uint32_t E = hp->n_embd, QL = hp->q_lora, KL = hp->kv_lora, R = hp->qk_rope;
    const uint32_t NOPE = hp->qk_nope, H_l = rk->H_l, K = hp->idx_top_k, ID = hp->idx_head_dim;
    const uint32_t KVW = KL + R;
    uint32_t a, b;
    rt_token_range(n, m->n_ranks, rk->r, &a, &b);

    /* replicated projections, this rank's tokens */
    for (uint32_t t = a; t < b; t++)
        rt_rmsnorm(w->x + (size_t)t * E, L->attn_norm, E, hp->rms_eps, w->h + (size_t)t * E);
    rt_matmul(rk->pool, &L->q_a, w->h + (size_t)a * E, E, b - a, w->qr + (size_t)a * QL, QL);
    for (uint32_t t = a; t < b; t++)
        rt_rmsnorm(w->qr + (size_t)t * QL, L->q_a_norm, QL, hp->rms_eps, w->qr + (size_t)t * QL);
    rt_matmul(rk->pool, &L->kv_a, w->h + (size_t)a * E, E, b - a, w->kv + (size_t)a * KVW, KVW);
    for (uint32_t t = a; t < b; t++) {
        float *row = w->kv + (size_t)t * KVW; /* becomes the cache row: [normed latent | roped k_pe] */
        rt_rmsnorm(row, L->kv_a_norm, KL, hp->rms_eps, row);
        rt_rope_apply(row + KL, R, w->rope + (size_t)t * R);
    }
    if (L->has_indexer) indexer_project(m, rk, L, w, a, b);
    rt_allgather_rows(f, rk->r, w->qr, QL * sizeof(float), QL * sizeof(float));
    rt_allgather_rows(f, rk->r, w->kv, KVW * sizeof(float), KVW * sizeof(float));
    if (L->has_indexer) rt_allgather_rows(f, rk->r, w->ik, ID * sizeof(float), ID * sizeof(float));
    /* every rank keeps its own copy of the caches */
    for (uint32_t t = 0; t < n; t++) {
        kv_view v;
        kv_view_of(f, rk->r, il, C, t, &v);
        const uint32_t p = rt_fwd_pos(f, t);
        memcpy(kv_lat(&v, p), w->kv + (size_t)t * KVW, KVW * sizeof(float));
        if (L->has_indexer) memcpy(kv_idx(&v, p), w->ik + (size_t)t * ID, ID * sizeof(float));
    }
    if (L->has_indexer) {
        /* top-k for this rank's queries, then everyone's */
        idx_range_ctx c = {{hp, rk->pool, f, rk->r, il, C, w}, a};
        rt_pool_run(rk->pool, b - a, idx_range_task, &c);
        rt_allgather_rows(f, rk->r, w->sel, K * sizeof(int32_t), K * sizeof(int32_t));
        rt_allgather_rows(f, rk->r, w->n_sel, sizeof(uint32_t), sizeof(uint32_t));
    }

    /* this rank's heads, all tokens */
    rt_matmul(rk->pool, &L->q_b, w->qr, QL, n, w->q, (size_t)H_l * (NOPE + R));
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t h = 0; h < H_l; h++)
            rt_rope_apply(w->q + ((size_t)t * H_l + h) * (NOPE + R) + NOPE, R, w->rope + (size_t)t * R);

    if (m->mla == RT_MLA_EXPANDED)
        attn_expanded(f, rk, L, il, C, w, n, rt_fwd_pos(f, n - 1) + 1);
    else
        attn_absorbed(f, rk, L, il, C, w, n);

    rt_matmul(rk->pool, &L->o, w->ao, (size_t)H_l * hp->v_head, n, w->part, E);
}
