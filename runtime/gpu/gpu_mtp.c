/* The NextN/MTP block on CUDA GPUs (gpu_model.h, "MTP"), mirroring rt_model_mtp in
 * runtime/cpu/model.c: enorm(embedding of the next token) beside hnorm(the main model's final-normed
 * hidden state), eh_proj over that concatenation, one decoder layer at layer index n_layer_main
 * run by the main layers' stage functions (gm_attn_stage, gm_ffn_stage) against the sequence's
 * own NextN caches, shared_head_norm, and the head. Compiled to nothing unless G5_WITH_CUDA.
 *
 * eh_proj split by ranks: by columns, each rank multiplies its slice of the concatenation and
 * the partial products are summed like any stage output (gm_collective into a zeroed x); by rows,
 * each rank writes its rows of x into a zeroed buffer and the same sum gathers them, exactly (every
 * element has one nonzero addend), so neither split needs a collective of its own. */
#ifdef G5_WITH_CUDA

#include "runtime/gpu/gpu_model.h"

#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuk.h"
#include "cuda/cuk_model.h"
#include "runtime/gpu/gpu_int.h"
#include "runtime/cpu/model_tensors.h"

/* ---- setup ---- */

g5_status gm_mtp_setup_rank(rt_gpu_model *g, gl_rank *rk, g5_error *err) {
    const glm5_hparams *hp = &g->hp;
    const uint32_t il = hp->n_layer_main;
    const uint64_t E = hp->n_embd;
    const rt_layer *cl = &rk->c->layers[il];
    gl_mtp *M = &rk->mtp;
    if (!cl->present || !cl->nextn)
        return g5_fail(err, G5_ERR_MODEL, "rank %u: NextN layer %u not set up by the CPU model", rk->rg, il);
    CK(gm_put_f32(rk, cl->enorm, E, &M->enorm, err));
    CK(gm_put_f32(rk, cl->hnorm, E, &M->hnorm, err));
    CK(gm_put_f32(rk, cl->shared_head_norm, E, &M->head_norm, err));
    CK(gm_dmat_of(rk, &cl->eh_proj, "nextn.eh_proj", il, &M->eh, err));
    M->eh_split = (int)cl->eh_split;
    if (M->eh_split == RT_SPLIT_COLS && (uint64_t)M->eh.k * g->T_all != 2 * E)
        return g5_fail(err, G5_ERR_SHARDING, "rank %u: nextn.eh_proj has %lld columns, not 2 x %llu / %u", rk->rg,
                       (long long)M->eh.k, (unsigned long long)E, g->T_all);
    if (M->eh_split == RT_SPLIT_ROWS && (uint64_t)M->eh.m * g->T_all != E)
        return g5_fail(err, G5_ERR_SHARDING, "rank %u: nextn.eh_proj has %lld rows, not %llu / %u", rk->rg,
                       (long long)M->eh.m, (unsigned long long)E, g->T_all);
    const int own_embd = cl->nextn_embed.data != NULL, own_head = cl->nextn_head.mat.data != NULL;
    CK(gm_dmat_of(rk, own_embd ? &cl->nextn_embed : &rk->c->tok_embd, own_embd ? "nextn.embed_tokens" : "token_embd",
                  il, &M->embd, err));
    const rt_head *h = own_head ? &cl->nextn_head : &rk->c->output;
    CK(gm_dmat_of(rk, &h->mat, own_head ? "nextn.shared_head_head" : "output", il, &M->head, err));
    M->head_col0 = h->col0;
    M->head_write = h->write;
    /* several processes gather the draft logits by the output head's columns (g->vcol) */
    M->head_as_output = M->head_col0 == rk->head_col0 && M->head.m == rk->head.m && M->head_write == rk->head_write;
    return G5_OK;
}

/* ---- the sequence's NextN caches ---- */

static void free_ranks(rt_gpu_model *g, seq_rank *a) {
    for (uint32_t r = 0; a && r < g->T; r++) {
        if (!a[r].lat && !a[r].idxk) continue;
        cudaSetDevice(g->rk[r].dev);
        if (a[r].lat) cudaFree(a[r].lat);
        if (a[r].idxk) cudaFree(a[r].idxk);
    }
    free(a);
}

void gm_mtp_seq_free(rt_gpu_seq *s) {
    free_ranks(s->g, s->mrk);
    s->mrk = NULL;
    s->mtp_cap = 0;
}

/* Caches of nc >= mtp_n_past positions, the cached ones kept; on failure s is as it was. */
static g5_status mtp_resize(rt_gpu_seq *s, uint32_t nc, g5_error *err) {
    rt_gpu_model *g = s->g;
    const glm5_hparams *hp = &g->hp;
    const uint64_t LW = gm_lat_w(hp), ID = hp->idx_head_dim, es = g->lat_es;
    seq_rank *nr = calloc(g->T, sizeof *nr);
    if (!nr) return g5_fail(err, G5_ERR_NOMEM, "MTP caches");
    g5_status st = G5_OK;
    for (uint32_t r = 0; r < g->T && !st; r++) {
        gl_rank *rk = &g->rk[r];
        cudaError_t ce = cudaSetDevice(rk->dev);
        if (ce == cudaSuccess) ce = cudaMalloc(&nr[r].lat, (size_t)(nc * LW * es));
        if (ce == cudaSuccess) ce = cudaMalloc((void **)&nr[r].idxk, (size_t)(nc * ID * sizeof(float)));
        if (ce == cudaSuccess && s->mtp_n_past) {
            ce = cudaMemcpyAsync(nr[r].lat, s->mrk[r].lat, (size_t)s->mtp_n_past * LW * es, cudaMemcpyDeviceToDevice,
                                 rk->st);
            if (ce == cudaSuccess)
                ce = cudaMemcpyAsync(nr[r].idxk, s->mrk[r].idxk, (size_t)s->mtp_n_past * ID * 4,
                                     cudaMemcpyDeviceToDevice, rk->st);
            if (ce == cudaSuccess) ce = cudaStreamSynchronize(rk->st);
        }
        if (ce != cudaSuccess) {
            (void)cudaGetLastError(); /* an allocation failure must not surface at a later launch check */
            st = g5_fail(err, ce == cudaErrorMemoryAllocation ? G5_ERR_NOMEM : G5_ERR_INTERNAL,
                         "rank %u: GPU MTP caches for %u positions: %s", rk->rg, nc, cudaGetErrorString(ce));
        }
    }
    if (st) {
        free_ranks(g, nr);
        return st;
    }
    free_ranks(g, s->mrk);
    s->mrk = nr;
    s->mtp_cap = nc;
    return G5_OK;
}

/* Grown by doubling from 256, as the main caches (gm_seq_need). */
static g5_status mtp_need(rt_gpu_seq *s, uint32_t need, g5_error *err) {
    if (need <= s->mtp_cap) return G5_OK;
    uint32_t nc = s->mtp_cap ? s->mtp_cap : 256;
    while (nc < need) nc = nc > UINT32_MAX / 2 ? need : nc * 2;
    return mtp_resize(s, nc, err);
}

/* ---- the block ---- */

/* draft [c][n_vocab] (host) = the head over rows first .. first + c - 1 of rk->h. */
static g5_status mtp_head(rt_gpu_model *g, float *draft, uint32_t first, uint32_t c, g5_error *err) {
    const int64_t E = g->hp.n_embd, V = g->hp.n_vocab;
    for (uint32_t r = 0; r < g->T; r++) {
        gl_rank *rk = &g->rk[r];
        const gl_mtp *M = &rk->mtp;
        if (!M->head_write) continue;
        CUK_CHECK(cudaSetDevice(rk->dev));
        const int64_t VL = M->head.m;
        for (uint32_t t0 = first; t0 < first + c; t0 += CUK_GEMV_MAX_N) {
            const uint32_t w = first + c - t0 < CUK_GEMV_MAX_N ? first + c - t0 : CUK_GEMV_MAX_N;
            CK(gm_gemv_q8(rk, &M->head, rk->h + (int64_t)t0 * E, E, w, rk->lg, VL, err));
            CUK_CHECK(cudaMemcpy2DAsync(draft + (int64_t)(t0 - first) * V + M->head_col0, (size_t)V * 4, rk->lg,
                                 (size_t)VL * 4, (size_t)VL * 4, w, cudaMemcpyDeviceToHost, rk->st));
        }
    }
    return G5_OK;
}

/* Device work after the uploads (tokens in rk->tok, positions in rk->pos, the hidden states in
 * rk->x of every rank). */
static g5_status mtp_device(rt_gpu_model *g, const fplan *pl, float *draft, int all, g5_error *err) {
    const glm5_hparams *hp = &g->hp;
    const uint32_t n = pl->n, il = hp->n_layer_main;
    const int64_t E = hp->n_embd;
    const float eps = hp->rms_eps;
    const int split = g->rk[0].mtp.eh_split;
    for (uint32_t r = 0; r < g->T; r++) {
        gl_rank *rk = &g->rk[r];
        const gl_mtp *M = &rk->mtp;
        const cuk_stream cs = (cuk_stream)rk->st;
        CUK_CHECK(cudaSetDevice(rk->dev));
        rk->pa = rk->pb = NULL;
        const cuk_dequant_rows_args dq = {.w_type = M->embd.type, .w = M->embd.w, .k = E, .n_rows_w = M->embd.m,
                                          .rows = rk->tok, .n = n, .out = rk->cat, .ldo = 2 * E};
        CK(cuk_dequant_rows(&dq, cs, err));
        CK(cuk_rms_norm(rk->cat, 2 * E, M->enorm, rk->cat, 2 * E, n, E, eps, cs, err));
        CK(cuk_rms_norm(rk->x, E, M->hnorm, rk->cat + E, 2 * E, n, E, eps, cs, err));
        if (split == RT_SPLIT_NONE) {
            CK(gm_gemv_q8(rk, &M->eh, rk->cat, 2 * E, n, rk->x, E, err));
            continue;
        }
        /* x = 0 + the sum over ranks of part (below) */
        CUK_CHECK(cudaMemsetAsync(rk->x, 0, (size_t)n * E * 4, rk->st));
        if (split == RT_SPLIT_COLS) {
            CK(gm_gemv_q8(rk, &M->eh, rk->cat + (int64_t)rk->rg * M->eh.k, 2 * E, n, rk->part, E, err));
        } else {
            CUK_CHECK(cudaMemsetAsync(rk->part, 0, (size_t)n * E * 4, rk->st));
            CK(gm_gemv_q8(rk, &M->eh, rk->cat, 2 * E, n, rk->part + (int64_t)rk->rg * M->eh.m, E, err));
        }
        rk->oa = rk->part;
        rk->ob = NULL;
    }
    if (split != RT_SPLIT_NONE) CK(gm_collective(g, n, NULL, err));
    for (uint32_t r = 0; r < g->T; r++) CK(gm_attn_stage(g, &g->rk[r], il, pl, err));
    CK(gm_collective(g, n, NULL, err));
    for (uint32_t r = 0; r < g->T; r++) CK(gm_ffn_stage(g, &g->rk[r], il, n, err));
    CK(gm_collective(g, n, NULL, err));
    for (uint32_t r = 0; r < g->T; r++) {
        gl_rank *rk = &g->rk[r];
        CUK_CHECK(cudaSetDevice(rk->dev));
        CK(gm_norm_x(rk, rk->mtp.head_norm, n, E, eps, err));
    }
    if (!draft) return G5_OK;
    const uint32_t first = all ? 0 : n - 1;
    return mtp_head(g, draft, first, n - first, err);
}

int rt_gpu_has_mtp(const rt_gpu_model *g) { return g->has_mtp; }
uint32_t rt_gpu_seq_mtp_n_past(const rt_gpu_seq *s) { return s->mtp_n_past; }
uint32_t rt_gpu_mtp_n_past(const rt_gpu_model *g) { return g->def->mtp_n_past; }

g5_status rt_gpu_seq_truncate(rt_gpu_seq *s, uint32_t n_past, uint32_t mtp_n_past, g5_error *err) {
    if (n_past > s->n_past || mtp_n_past > s->mtp_n_past)
        return g5_fail(err, G5_ERR_INVALID_ARG, "truncate to %u/%u positions, the sequence holds %u/%u", n_past,
                       mtp_n_past, s->n_past, s->mtp_n_past);
    s->n_past = n_past;
    s->mtp_n_past = mtp_n_past;
    return G5_OK;
}

/* Several processes gather the draft logits by the output head's columns. */
static g5_status head_layout_check(const rt_gpu_model *g, const float *draft, g5_error *err) {
    if (g->info.n_processes > 1 && draft)
        for (uint32_t r = 0; r < g->T; r++)
            if (!g->rk[r].mtp.head_as_output)
                return g5_fail(err, G5_ERR_UNSUPPORTED, "rank %u: the NextN head's vocabulary rows are laid out unlike "
                               "output's, which several processes need for the draft logits", g->rk[r].rg);
    return G5_OK;
}

g5_status rt_gpu_mtp_seq(rt_gpu_model *g, rt_gpu_seq *s, const float *hidden, const int32_t *next_tokens,
                         uint32_t n, float *draft_logits, int all_logits, g5_error *err) {
    if (!g->has_mtp) return g5_fail(err, G5_ERR_UNSUPPORTED, "the model has no NextN/MTP block");
    if (n == 0) return G5_OK;
    CK(head_layout_check(g, draft_logits, err));
    if (!s || s->g != g) return g5_fail(err, G5_ERR_INVALID_ARG, "the sequence belongs to another GPU model");
    const glm5_hparams *hp = &g->hp;
    for (uint32_t t = 0; t < n; t++)
        if (next_tokens[t] < 0 || (uint32_t)next_tokens[t] >= hp->n_vocab)
            return g5_fail(err, G5_ERR_INVALID_ARG, "token %d at index %u is outside the vocabulary (%u)",
                           next_tokens[t], t, hp->n_vocab);
    if (s->mtp_n_past > INT32_MAX - n) return g5_fail(err, G5_ERR_OVERFLOW, "MTP position overflow");
    const uint32_t pos0 = s->mtp_n_past, P = pos0 + n, row0 = 0;
    CK(mtp_need(s, P, err));
    int32_t *pos = malloc((size_t)n * sizeof *pos);
    if (!pos) return g5_fail(err, G5_ERR_NOMEM, "positions");
    for (uint32_t t = 0; t < n; t++) pos[t] = (int32_t)(pos0 + t);
    const size_t hbytes = (size_t)n * hp->n_embd * sizeof(float);
    g5_status st = G5_OK;
    for (uint32_t r = 0; r < g->T && !st; r++) {
        gl_rank *rk = &g->rk[r];
        st = gm_work_reserve(g, rk, n, (uint64_t)n * P, err);
        cudaError_t ce = cudaSuccess;
        if (!st) ce = cudaSetDevice(rk->dev);
        if (!st && ce == cudaSuccess) ce = cudaMemcpyAsync(rk->tok, next_tokens, n * 4, cudaMemcpyHostToDevice, rk->st);
        if (!st && ce == cudaSuccess) ce = cudaMemcpyAsync(rk->pos, pos, n * 4, cudaMemcpyHostToDevice, rk->st);
        if (!st && ce == cudaSuccess) ce = cudaMemcpyAsync(rk->x, hidden, hbytes, cudaMemcpyHostToDevice, rk->st);
        if (!st && ce == cudaSuccess) ce = cudaStreamSynchronize(rk->st); /* pos is freed below */
        if (!st && ce != cudaSuccess) st = g5_fail(err, G5_ERR_INTERNAL, "MTP upload: %s", cudaGetErrorString(ce));
    }
    free(pos);
    if (st) return st;
    for (uint32_t r = 0; r < g->T; r++) {
        gl_lin_arm(g->rk[r].lin, 1); /* one sequence: the prefill GEMM path may serve long calls */
        g->rk[r].batch_rows = 0;
    }
    rt_gpu_seq *const seqs[1] = {s};
    /* positions as host arguments (pos_bound 0): never a graph */
    const fplan pl = {.n = n, .n_seg = 1, .seq = seqs, .pos0 = &pos0, .len = &n, .row0 = &row0};
    CK(mtp_device(g, &pl, draft_logits, all_logits, err));
    for (uint32_t r = 0; r < g->T; r++) {
        CUK_CHECK(cudaSetDevice(g->rk[r].dev));
        CUK_CHECK(cudaStreamSynchronize(g->rk[r].st));
    }
    CK(gm_coll_gather_logits(g, draft_logits, all_logits ? n : 1, err));
    s->mtp_n_past = P;
    return G5_OK;
}

/* The uploads of a rows call: tokens, positions, hidden states and the NextN layer's table. */
static g5_status mtp_rows_upload(rt_gpu_model *g, const fplan *pl, const float *hidden, const int32_t *next,
                                 uint32_t mp, g5_error *err) {
    const uint32_t n = pl->n;
    const size_t hbytes = (size_t)n * g->hp.n_embd * sizeof(float);
    for (uint32_t r = 0; r < g->T; r++) {
        gl_rank *rk = &g->rk[r];
        CK(gm_work_reserve(g, rk, n, (uint64_t)n * mp, err));
        cudaError_t ce = cudaSetDevice(rk->dev);
        if (ce == cudaSuccess) ce = cudaMemcpyAsync(rk->tok, next, n * 4, cudaMemcpyHostToDevice, rk->st);
        /* the positions are < 2^31 (gm_rows_plan): the same bytes as int32 */
        if (ce == cudaSuccess) ce = cudaMemcpyAsync(rk->pos, pl->pos0, n * 4, cudaMemcpyHostToDevice, rk->st);
        if (ce == cudaSuccess) ce = cudaMemcpyAsync(rk->x, hidden, hbytes, cudaMemcpyHostToDevice, rk->st);
        if (ce == cudaSuccess) ce = cudaStreamSynchronize(rk->st);
        if (ce != cudaSuccess) return g5_fail(err, G5_ERR_INTERNAL, "MTP upload: %s", cudaGetErrorString(ce));
    }
    return gm_write_rows(g, pl, g->hp.n_layer_main, g->hp.n_layer_main + 1, err);
}

/* The device work of a rows call: the block over every row (the attention of a batched decode
 * step), each sequence's last row moved to row i (rows only move down, in stream order) and the
 * head over those n_seq rows. */
static g5_status mtp_rows_device(rt_gpu_model *g, const fplan *pl, const uint32_t *n_tok, uint32_t n_seq,
                                 float *draft, uint32_t mp, g5_error *err) {
    const uint64_t E = g->hp.n_embd;
    for (uint32_t r = 0; r < g->T; r++) {
        gl_lin_arm(g->rk[r].lin, 0);
        g->rk[r].batch_rows = 1;
        g->rk[r].multi = mp;
    }
    g5_status st = mtp_device(g, pl, NULL, 0, err);
    for (uint32_t r = 0; r < g->T; r++) g->rk[r].batch_rows = g->rk[r].multi = 0;
    if (st || !draft) return st;
    for (uint32_t r = 0; r < g->T; r++) {
        gl_rank *rk = &g->rk[r];
        CUK_CHECK(cudaSetDevice(rk->dev));
        for (uint32_t i = 0, last = 0; i < n_seq; i++) {
            last += n_tok ? n_tok[i] : 1;
            if (last - 1 != i)
                CUK_CHECK(cudaMemcpyAsync(rk->h + i * E, rk->h + (last - 1) * E, E * 4, cudaMemcpyDeviceToDevice,
                                          rk->st));
        }
    }
    return mtp_head(g, draft, 0, n_seq, err);
}

g5_status rt_gpu_mtp_rows(rt_gpu_model *g, rt_gpu_seq *const *seqs, const uint32_t *n_tok, uint32_t n_seq,
                          const float *hidden, const int32_t *next_tokens, float *draft_logits, g5_error *err) {
    if (!g->has_mtp) return g5_fail(err, G5_ERR_UNSUPPORTED, "the model has no NextN/MTP block");
    if (n_seq == 0) return G5_OK;
    CK(head_layout_check(g, draft_logits, err));
    gm_rows rw;
    CK(gm_rows_plan(g, seqs, n_tok, n_seq, 1, &rw, err));
    const fplan *pl = &rw.pl;
    const uint32_t n = pl->n;
    g5_status st = G5_OK;
    if (n == 1) { /* one row: the one-token call itself */
        st = rt_gpu_mtp_seq(g, seqs[0], hidden, next_tokens, 1, draft_logits, 0, err);
        gm_rows_free(&rw);
        return st;
    }
    uint32_t mp = 1;
    for (uint32_t t = 0; t < n && !st; t++) {
        if (next_tokens[t] < 0 || (uint32_t)next_tokens[t] >= g->hp.n_vocab)
            st = g5_fail(err, G5_ERR_INVALID_ARG, "token %d at row %u is outside the vocabulary (%u)", next_tokens[t],
                         t, g->hp.n_vocab);
        if (pl->pos0[t] + 1 > mp) mp = pl->pos0[t] + 1;
    }
    for (uint32_t i = 0; i < n_seq && !st; i++)
        st = mtp_need(seqs[i], seqs[i]->mtp_n_past + (n_tok ? n_tok[i] : 1), err);
    if (!st) st = mtp_rows_upload(g, pl, hidden, next_tokens, mp, err);
    if (!st) st = mtp_rows_device(g, pl, n_tok, n_seq, draft_logits, mp, err);
    for (uint32_t r = 0; r < g->T && !st; r++) {
        if (cudaSetDevice(g->rk[r].dev) != cudaSuccess || cudaStreamSynchronize(g->rk[r].st) != cudaSuccess)
            st = g5_fail(err, G5_ERR_INTERNAL, "MTP rows: %s", cudaGetErrorString(cudaGetLastError()));
    }
    if (!st) st = gm_coll_gather_logits(g, draft_logits, n_seq, err);
    if (!st)
        for (uint32_t t = 0; t < n; t++) pl->seq[t]->mtp_n_past = pl->pos0[t] + 1;
    gm_rows_free(&rw);
    return st;
}

g5_status rt_gpu_mtp(rt_gpu_model *g, const float *hidden, const int32_t *next_tokens, uint32_t n,
                     float *draft_logits, int all_logits, g5_error *err) {
    return rt_gpu_mtp_seq(g, g->def, hidden, next_tokens, n, draft_logits, all_logits, err);
}

#else
typedef int rt_gpu_mtp_unused_;
#endif
