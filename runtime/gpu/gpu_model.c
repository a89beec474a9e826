/* GLM-5 forward pass on CUDA GPUs (gpu_model.h): setup from the CPU model, weights on the
 * devices, side work, the collectives and the forward calls (the attention stage is in
 * gpu_attn.c, the FFN stage in gpu_ffn.c, the weight products in gpu_prod.c; placement, the
 * processes' exchanges and NCCL's set-up in gpu_coll.c).
 * Compiled to nothing unless G5_WITH_CUDA.
 *
 * The stage code below follows runtime/cpu/attn.c and runtime/cpu/model.c line by line; comments there
 * explain the math. */
#ifdef G5_WITH_CUDA

#include "runtime/gpu/gpu_model.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/cuk.h"
#include "cuda/cuk_model.h"
#include "cuda/cuk_q8.h"
#include "format/blob.h"
#include "format/quant.h"
#include "runtime/gpu/gpu_linear.h"
#include "runtime/cpu/model_tensors.h"

#include "runtime/gpu/gpu_int.h"

void rt_gpu_opts_default(rt_gpu_opts *o) {
    memset(o, 0, sizeof *o);
    o->precision = RT_GPU_PRECISE;
    rt_gpu_load_opts_default(&o->load);
}

const rt_gpu_info *rt_gpu_model_info(const rt_gpu_model *g) { return &g->info; }
void rt_gpu_reset(rt_gpu_model *g) { rt_gpu_seq_reset(g->def); }
uint32_t rt_gpu_n_past(const rt_gpu_model *g) { return g->def->n_past; }
rt_gpu_seq *rt_gpu_default_seq(rt_gpu_model *g) { return g->def; }
void rt_gpu_seq_reset(rt_gpu_seq *s) { s->n_past = s->mtp_n_past = 0; }
uint32_t rt_gpu_seq_n_past(const rt_gpu_seq *s) { return s->n_past; }
uint32_t rt_gpu_seq_capacity(const rt_gpu_seq *s) { return s->cap; }

double gm_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- weights: host ranges to device addresses ---- */

static int cmp_seg(const void *a, const void *b) {
    const uint8_t *x = ((const seg *)a)->h, *y = ((const seg *)b)->h;
    return (x > y) - (x < y);
}

/* Device address of host bytes [p, p + len) of the rank's weight set; NULL if not uploaded. */
static const void *dptr(const gl_rank *rk, const void *p, uint64_t len) {
    const uint8_t *q = p;
    uint64_t lo = 0, hi = rk->n_segs;
    while (lo < hi) {
        const uint64_t mid = lo + (hi - lo) / 2;
        if (rk->segs[mid].h <= q) lo = mid + 1;
        else hi = mid;
    }
    if (lo == 0) return NULL;
    const seg *s = &rk->segs[lo - 1];
    const uint64_t off = (uint64_t)(q - s->h);
    if (off > s->n || len > s->n - off) return NULL;
    return s->d + off;
}

static g5_status dmat_of(const gl_rank *rk, const rt_mat *m, const char *what, uint32_t il,
                         dmat *out, g5_error *err) {
    const void *d = dptr(rk, m->data, m->nrows * m->row_bytes);
    if (!d)
        return g5_fail(err, G5_ERR_INTERNAL, "rank %u layer %u: %s is not in the uploaded weights", rk->rg, il, what);
    if (!cuk_gemv_supported(m->type))
        return g5_fail(err, G5_ERR_UNSUPPORTED, "rank %u layer %u: %s is %s, which the GPU kernels do not handle",
                       rk->rg, il, what, quant_type_name(m->type));
    out->type = m->type;
    out->w = d;
    out->k = (int64_t)m->ncols;
    out->m = (int64_t)m->nrows;
    return G5_OK;
}

/* A float32 copy in the extras arena. */
static g5_status put_f32(gl_rank *rk, const float *host, uint64_t n, const float **out, g5_error *err) {
    const uint64_t bytes = (n * sizeof(float) + 255) & ~(uint64_t)255;
    if (rk->xoff + bytes > rk->xcap)
        return g5_fail(err, G5_ERR_INTERNAL, "rank %u: extras arena too small", rk->rg);
    float *d = (float *)(void *)(rk->xmem + rk->xoff);
    rk->xoff += bytes;
    if (host) CUK_CHECK(cudaMemcpy(d, host, n * sizeof(float), cudaMemcpyHostToDevice));
    *out = d;
    return G5_OK;
}

static uint64_t up256(uint64_t b) { return (b + 255) & ~(uint64_t)255; }

g5_status gm_dmat_of(const gl_rank *rk, const rt_mat *m, const char *what, uint32_t il, dmat *out, g5_error *err) {
    return dmat_of(rk, m, what, il, out, err);
}
g5_status gm_put_f32(gl_rank *rk, const float *host, uint64_t n, const float **out, g5_error *err) {
    return put_f32(rk, host, n, out, err);
}

/* Weight tensors of rank r: from the blob file (checksummed reader threads) or copied. */
static g5_status load_rank_weights(rt_gpu_model *g, gl_rank *rk, const blob *b,
                                   const rt_gpu_opts *o, rt_gpu_load_stats *ls, g5_error *err) {
    const rt_weights *w = rk->c->w;
    const uint64_t nt = rt_weights_n_tensors(w);
    rk->segs = calloc(nt ? nt : 1, sizeof *rk->segs);
    if (!rk->segs) return g5_fail(err, G5_ERR_NOMEM, "rank %u: tensor table", rk->rg);
    CUK_CHECK(cudaSetDevice(rk->dev));
    if (b) {
        CK(rt_gpu_load_blob(b, rk->dev, &o->load, &rk->wmem, ls, err));
        const blob_info *in = blob_get_info(b);
        rk->wbytes = in->data_size;
        for (uint64_t i = 0; i < nt; i++) {
            const rt_tensor *t = rt_weights_tensor(w, i);
            const blob_tensor *bt = blob_find_tensor(b, t->name);
            if (!bt || bt->size != t->nbytes)
                return g5_fail(err, G5_ERR_MISMATCH, "rank %u: tensor '%s' of the weight set is not in %s as such",
                               rk->rg, t->name, blob_get_path(b));
            rk->segs[i] = (seg){(const uint8_t *)t->data, t->nbytes, (uint8_t *)rk->wmem + (bt->offset - in->data_offset)};
        }
    } else {
        uint64_t total = 0;
        for (uint64_t i = 0; i < nt; i++) total += up256(rt_weights_tensor(w, i)->nbytes);
        const double t0 = gm_now_s();
        CUK_CHECK(cudaMalloc(&rk->wmem, total ? total : 256));
        rk->wbytes = total;
        uint64_t off = 0;
        for (uint64_t i = 0; i < nt; i++) {
            const rt_tensor *t = rt_weights_tensor(w, i);
            uint8_t *d = (uint8_t *)rk->wmem + off;
            if (t->nbytes) CUK_CHECK(cudaMemcpy(d, t->data, t->nbytes, cudaMemcpyHostToDevice));
            rk->segs[i] = (seg){(const uint8_t *)t->data, t->nbytes, d};
            off += up256(t->nbytes);
        }
        if (ls) {
            memset(ls, 0, sizeof *ls);
            ls->bytes = total;
            ls->seconds = gm_now_s() - t0;
            ls->gb_per_s = ls->seconds > 0 ? (double)total / ls->seconds / 1e9 : 0;
            ls->n_threads = 1;
        }
    }
    rk->n_segs = nt;
    qsort(rk->segs, nt, sizeof *rk->segs, cmp_seg);
    (void)g;
    return G5_OK;
}

/* The bytes of kv_b's exact int8 form where the layer's attn_k_b / attn_v_b give one, else 0. The
 * CPU model took the pair only with rows of whole blocks (rt_mat_view), and every block of these
 * types is whole 32-element sub-blocks, so cuk_kvb_exact's shapes hold. */
static uint64_t kvx_bytes(const glm5_hparams *hp, const rt_layer *cl, uint64_t H) {
    const uint64_t KL = hp->kv_lora, NOPE = hp->qk_nope, V = hp->v_head;
    if (!cl->k_b.data || !cl->v_b.data || !cuk_kvb_exact_takes(cl->k_b.type) || !cuk_kvb_exact_takes(cl->v_b.type))
        return 0;
    return up256(H * (NOPE + V) * KL) + up256(H * (NOPE / 16) * KL * 4) + up256(H * V * (KL / 16) * 4);
}

/* kv_b's exact int8 form for decode's W_UK / W_UV (a quarter of the float32 bytes, the same bits:
 * cuk_kvb_exact) where the layer has one and every product proves equal to the float32 kv_b just
 * made; otherwise its arena space is given back and the kernels read the float32 kv_b. */
static g5_status kvb_exact(gl_rank *rk, const glm5_hparams *hp, const rt_layer *cl, gl_layer *L, g5_error *err) {
    const uint64_t KL = hp->kv_lora, NOPE = hp->qk_nope, V = hp->v_head, H = rk->c->H_l;
    const void *kb = dptr(rk, cl->k_b.data, cl->k_b.nrows * cl->k_b.row_bytes);
    const void *vb = dptr(rk, cl->v_b.data, cl->v_b.nrows * cl->v_b.row_bytes);
    if (!kvx_bytes(hp, cl, H) || !kb || !vb) return G5_OK;
    const uint64_t off0 = rk->xoff;
    const float *q = NULL, *sk = NULL, *sv = NULL;
    CK(put_f32(rk, NULL, (H * (NOPE + V) * KL + 3) / 4, &q, err));
    CK(put_f32(rk, NULL, H * (NOPE / 16) * KL, &sk, err));
    CK(put_f32(rk, NULL, H * V * (KL / 16), &sv, err));
    const cuk_kvb_exact_args a = {.k_type = cl->k_b.type, .v_type = cl->v_b.type, .k_b = kb, .v_b = vb,
                                  .n_head = (int32_t)H, .nope = (int32_t)NOPE, .v = (int32_t)V, .kv_lora = (int32_t)KL,
                                  .kvb = L->kvb, .kq = (int8_t *)(void *)q, .ksk = (float *)sk, .ksv = (float *)sv};
    uint64_t bad = 0;
    CK(cuk_kvb_exact(&a, NULL, &bad, err));
    if (bad) {
        rk->xoff = off0;
        return G5_OK;
    }
    L->kq = (const int8_t *)(const void *)q;
    L->ksk = sk, L->ksv = sv;
    rk->kvx_layers++;
    return G5_OK;
}

static g5_status setup_rank(rt_gpu_model *g, gl_rank *rk, g5_error *err) {
    const glm5_hparams *hp = &g->hp;
    const rt_rank_tensors *c = rk->c;
    const uint64_t E = hp->n_embd, KL = hp->kv_lora, NOPE = hp->qk_nope, V = hp->v_head;
    const uint64_t kvb_rows = (uint64_t)c->H_l * (NOPE + V);
    const uint32_t NL = hp->n_layer_main + (g->has_mtp ? 1 : 0); /* the NextN layer last */
    /* extras arena: every vector, and a float32 kv_b for each layer whose kv_b is not float32
     * already, each 256-byte aligned */
    uint64_t cap = up256(E * 4) + 256 + (g->has_mtp ? GM_MTP_EXTRA_BYTES(E) : 0);
    for (uint32_t il = 0; il < NL; il++)
        cap += up256(E * 4) * 2 + up256(hp->q_lora * 4) + up256(KL * 4) + up256(hp->idx_head_dim * 4) * 2 +
               up256((uint64_t)hp->n_expert * 4) + (c->layers[il].kv_b.type == QT_F32 ? 0 : up256(kvb_rows * KL * 4)) +
               kvx_bytes(hp, &c->layers[il], c->H_l);
    CUK_CHECK(cudaSetDevice(rk->dev));
    CUK_CHECK(cudaMalloc((void **)&rk->xmem, cap));
    rk->xcap = cap;
    rk->L = calloc(NL, sizeof *rk->L);
    if (!rk->L) return g5_fail(err, G5_ERR_NOMEM, "layers");
    CK(dmat_of(rk, &c->tok_embd, "token_embd", 0, &rk->tok_embd, err));
    CK(dmat_of(rk, &c->output.mat, "output", 0, &rk->head, err));
    rk->head_col0 = c->output.col0;
    rk->head_write = c->output.write;
    CK(put_f32(rk, c->output_norm, E, &rk->out_norm, err));
    for (uint32_t il = 0; il < NL; il++) {
        const rt_layer *cl = &c->layers[il];
        gl_layer *L = &rk->L[il];
        if (!cl->present) return g5_fail(err, G5_ERR_MODEL, "rank %u: layer %u missing", rk->rg, il);
        L->dense = cl->dense;
        L->has_idx = cl->has_indexer;
        if (il == 0 && !L->has_idx)
            return g5_fail(err, G5_ERR_MODEL, "layer 0 has no indexer of its own (nothing to share)");
        CK(put_f32(rk, cl->attn_norm, E, &L->attn_norm, err));
        CK(put_f32(rk, cl->q_a_norm, hp->q_lora, &L->q_a_norm, err));
        CK(put_f32(rk, cl->kv_a_norm, KL, &L->kv_a_norm, err));
        CK(put_f32(rk, cl->ffn_norm, E, &L->ffn_norm, err));
        CK(dmat_of(rk, &cl->q_a, "attn_q_a", il, &L->q_a, err));
        CK(dmat_of(rk, &cl->q_b, "attn_q_b", il, &L->q_b, err));
        CK(dmat_of(rk, &cl->kv_a, "attn_kv_a_mqa", il, &L->kv_a, err));
        CK(dmat_of(rk, &cl->o, "attn_output", il, &L->o, err));
        /* kv_b as float32: the absorption reads W_UK columns, the W_UV GEMV reads rows */
        const void *kvq = dptr(rk, cl->kv_b.data, kvb_rows * cl->kv_b.row_bytes);
        if (!kvq || cl->kv_b.nrows != kvb_rows)
            return g5_fail(err, G5_ERR_INTERNAL, "rank %u layer %u: attn_kv_b not uploaded", rk->rg, il);
        if (cl->kv_b.type == QT_F32) {
            L->kvb = kvq;
        } else {
            const float *d = NULL;
            CK(put_f32(rk, NULL, kvb_rows * KL, &d, err));
            const cuk_dequant_rows_args dq = {.w_type = cl->kv_b.type, .w = kvq, .k = (int64_t)KL,
                                              .n_rows_w = (int64_t)kvb_rows, .n = (int64_t)kvb_rows,
                                              .out = (float *)d, .ldo = (int64_t)KL};
            CK(cuk_dequant_rows(&dq, NULL, err));
            L->kvb = d;
        }
        CK(kvb_exact(rk, hp, cl, L, err));
        if (L->has_idx) {
            CK(dmat_of(rk, &cl->idx_q_b, "indexer.attn_q_b", il, &L->idx_q_b, err));
            CK(dmat_of(rk, &cl->idx_k, "indexer.attn_k", il, &L->idx_k, err));
            CK(dmat_of(rk, &cl->idx_proj, "indexer.proj", il, &L->idx_proj, err));
            CK(put_f32(rk, cl->idx_k_norm, hp->idx_head_dim, &L->idx_k_norm, err));
            CK(put_f32(rk, cl->idx_k_norm_b, hp->idx_head_dim, &L->idx_k_norm_b, err));
        }
        if (L->dense) {
            CK(dmat_of(rk, &cl->ffn_gate, "ffn_gate", il, &L->ffn_gate, err));
            CK(dmat_of(rk, &cl->ffn_up, "ffn_up", il, &L->ffn_up, err));
            CK(dmat_of(rk, &cl->ffn_down, "ffn_down", il, &L->ffn_down, err));
        } else {
            CK(dmat_of(rk, &cl->router, "ffn_gate_inp", il, &L->router, err));
            if (cl->router_b) CK(put_f32(rk, cl->router_b, hp->n_expert, &L->router_b, err));
            const rt_tensor *tg = cl->exp_gate, *tu = cl->exp_up, *td = cl->exp_down;
            if (tg->type != tu->type)
                return g5_fail(err, G5_ERR_UNSUPPORTED, "rank %u layer %u: ffn_gate_exps is %s but ffn_up_exps is %s: "
                               "the fused expert kernel needs one type", rk->rg, il, quant_type_name(tg->type), quant_type_name(tu->type));
            if (!cuk_gemv_supported(tg->type) || !cuk_gemv_supported(td->type))
                return g5_fail(err, G5_ERR_UNSUPPORTED, "rank %u layer %u: expert types %s/%s not handled by the GPU kernels",
                               rk->rg, il, quant_type_name(tg->type), quant_type_name(td->type));
            L->exp_type = tg->type;
            L->exp_down_type = td->type;
            L->exp_gate = dptr(rk, tg->data, tg->nbytes);
            L->exp_up = dptr(rk, tu->data, tu->nbytes);
            L->exp_down = dptr(rk, td->data, td->nbytes);
            if (!L->exp_gate || !L->exp_up || !L->exp_down)
                return g5_fail(err, G5_ERR_INTERNAL, "rank %u layer %u: expert tensors not uploaded", rk->rg, il);
            L->sh_contrib = hp->n_expert_shared && cl->sh_contrib;
            L->sh_l = cl->sh_l;
            if (L->sh_contrib) {
                CK(dmat_of(rk, &cl->sh_gate, "ffn_gate_shexp", il, &L->sh_gate, err));
                CK(dmat_of(rk, &cl->sh_up, "ffn_up_shexp", il, &L->sh_up, err));
                CK(dmat_of(rk, &cl->sh_down, "ffn_down_shexp", il, &L->sh_down, err));
            }
        }
    }
    if (g->has_mtp) CK(gm_mtp_setup_rank(g, rk, err));
    CUK_CHECK(cudaDeviceSynchronize()); /* kv_b dequantization */
    return G5_OK;
}

/* ---- creation ---- */

g5_status rt_gpu_model_create(const rt_model *cpu, const rt_gpu_opts *opts, rt_gpu_model **out,
                              g5_error *err) {
    *out = NULL;
    rt_gpu_opts def;
    if (!opts) {
        rt_gpu_opts_default(&def);
        opts = &def;
    }
    if (opts->precision != RT_GPU_PRECISE && opts->precision != RT_GPU_FAST && opts->precision != RT_GPU_BF16ACT)
        return g5_fail(err, G5_ERR_INVALID_ARG, "precision %d", (int)opts->precision);
    rt_gpu_model *g = calloc(1, sizeof *g);
    if (!g) return g5_fail(err, G5_ERR_NOMEM, "GPU model");
    g->cpu = cpu;
    g->hp = *rt_model_hparams(cpu);
    g->T = rt_model_n_local(cpu);
    g->T_all = rt_model_n_ranks(cpu);
    g->first = rt_model_rank_first(cpu);
    g->comm = rt_model_comm(cpu);
    g->has_mtp = rt_model_has_mtp(cpu);
    const int fast = opts->precision != RT_GPU_PRECISE;
    const int bf16act = opts->precision == RT_GPU_BF16ACT;
    /* fast: f16, since every fast-mode reader of the cache (k_mla_dec, the flash prefill) computes
     * in fp16: a bf16 row gains no range there and loses three bits, and its conversion costs the
     * decode attention a pass over each tile (specs/numerics.md) */
    rt_gpu_cache ct = opts->cache ? opts->cache : fast ? RT_GPU_CACHE_F16 : RT_GPU_CACHE_F32;
    g->lat_type = ct == RT_GPU_CACHE_BF16 ? CUK_BF16 : ct == RT_GPU_CACHE_F16 ? CUK_F16 : CUK_F32;
    g->lat_es = g->lat_type == CUK_F32 ? 4 : 2;
    g->info.precision = bf16act ? "bf16act" : fast ? "fast" : "precise";
    g->info.cache = g->lat_type == CUK_BF16 ? "bf16" : g->lat_type == CUK_F16 ? "f16" : "f32";
    g->info.h16_products = fast && !bf16act && opts->h16_products;
    g->rk = calloc(g->T, sizeof *g->rk);
    const blob_set *set = opts->blobs;
    g5_status st = G5_OK;
    if (!g->rk) {
        st = g5_fail(err, G5_ERR_NOMEM, "GPU ranks");
        goto fail;
    }
    g->info.n_ranks = g->T_all;
    g->info.n_local_ranks = g->T;
    g->info.n_processes = rt_comm_size(g->comm);
    for (uint32_t r = 0; r < g->T; r++) {
        g->rk[r].r = r;
        g->rk[r].rg = g->first + r;
    }
    /* From here a process that fails still joins the next exchange of its launch's processes
     * (gm_coll_agree_*: nothing with one process), so that all of them fail together. */
    int ndev = 0;
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess || ndev < 1)
        st = g5_fail(err, G5_ERR_UNSUPPORTED, "no CUDA device (%s)", ce != cudaSuccess ? cudaGetErrorString(ce) : "count 0");
    else if (opts->device0 < 0 || opts->device0 >= ndev)
        st = g5_fail(err, G5_ERR_INVALID_ARG, "device %d of %d", opts->device0, ndev);
    else
        st = gm_coll_place(g, opts, ndev, err);
    if ((st = gm_coll_agree_devices(g, st, err))) goto fail;
    g->info.collective = g->coll == COLL_NONE ? "none" : g->coll == COLL_DEVICE ? "device-sum" : "nccl";
    /* runtime/gpu/gpu_graph.c: one capture per stream (rank 0's for the device-side sum, each rank's
     * own under NCCL) */
    g->info.cuda_graph = opts->cuda_graph != 0;
    /* One process driving several GPUs through NCCL launches several communicators' graphs from
     * one thread, which NCCL documents as able to deadlock, and which has not run here (the
     * two-GPU machine was lent only before this path existed): plain launches there. One NCCL
     * rank per process (mpirun, one process per GPU: what NCCL recommends) keeps graphs. */
    if (g->coll == COLL_NCCL && g->T > 1) g->info.cuda_graph = 0;
    /* graphs under NCCL want NCCL_GRAPH_MIXING_SUPPORT=0 in the environment, which the program
     * sets (gpu_model.h, rt_gpu_model_create: library code reads and writes no environment) */
    gl_lin_cfg lcfg;
    if ((st = gl_lin_cfg_resolve(opts, &lcfg, err))) goto loaded;
    g->info.gemm = gl_lin_mode_name(lcfg.mode);
    g->info.gemm_min = (int)lcfg.min_tokens;
    g->info.gemm_min_expert = (int)lcfg.min_rows_expert;
    if (set) { /* the weight set's own blobs: this process's ranks must be open in it */
        if (blob_set_tp(set) != g->T_all || blob_set_first(set) > g->first ||
            blob_set_first(set) + blob_set_count(set) < g->first + g->T) {
            st = g5_fail(err, G5_ERR_MISMATCH, "the blob set holds ranks %u..%u of %u, the model runs %u..%u of %u",
                         blob_set_first(set), blob_set_first(set) + blob_set_count(set) - 1, blob_set_tp(set), g->first,
                         g->first + g->T - 1, g->T_all);
            goto loaded;
        }
    }
    const double t0 = gm_now_s();
    for (uint32_t r = 0; r < g->T; r++) {
        gl_rank *rk = &g->rk[r];
        if ((st = rt_model_rank_tensors(cpu, r, &rk->ctab, err))) goto loaded;
        rk->c = &rk->ctab;
        rk->fast = bf16act;
        rk->q8 = fast;
        rk->h16 = g->info.h16_products;
        rk->attn_tc = fast;
        if ((ce = cudaSetDevice(rk->dev)) != cudaSuccess) {
            st = g5_fail(err, G5_ERR_INTERNAL, "cudaSetDevice(%d): %s", rk->dev, cudaGetErrorString(ce));
            goto loaded;
        }
        if (r == 0 || g->coll != COLL_DEVICE) {
            if ((ce = cudaStreamCreateWithFlags(&rk->st, cudaStreamNonBlocking)) != cudaSuccess) {
                st = g5_fail(err, G5_ERR_INTERNAL, "stream: %s", cudaGetErrorString(ce));
                goto loaded;
            }
            rk->own_stream = 1;
            if ((ce = cudaStreamCreateWithFlags(&rk->st2, cudaStreamNonBlocking)) != cudaSuccess) {
                rk->st2 = NULL;
                st = g5_fail(err, G5_ERR_INTERNAL, "side stream: %s", cudaGetErrorString(ce));
                goto loaded;
            }
            if ((ce = cudaStreamCreateWithFlags(&rk->st3, cudaStreamNonBlocking)) != cudaSuccess) {
                rk->st3 = NULL;
                st = g5_fail(err, G5_ERR_INTERNAL, "third stream: %s", cudaGetErrorString(ce));
                goto loaded;
            }
        } else {
            rk->st = g->rk[0].st; /* ranks sharing a device share one stream: stage order is kept */
            rk->st2 = g->rk[0].st2;
            rk->st3 = g->rk[0].st3;
        }
        for (int i = 0; i < 4; i++)
            if ((ce = cudaEventCreateWithFlags(&rk->side_ev[i], cudaEventDisableTiming)) != cudaSuccess) {
                rk->side_ev[i] = NULL;
                st = g5_fail(err, G5_ERR_INTERNAL, "side event: %s", cudaGetErrorString(ce));
                goto loaded;
            }
        for (int i = 0; i < 2; i++)
            if ((ce = cudaEventCreateWithFlags(&rk->aux_ev[i], cudaEventDisableTiming)) != cudaSuccess) {
                rk->aux_ev[i] = NULL;
                st = g5_fail(err, G5_ERR_INTERNAL, "third stream's event: %s", cudaGetErrorString(ce));
                goto loaded;
            }
        rt_gpu_load_stats ls;
        memset(&ls, 0, sizeof ls);
        if ((st = load_rank_weights(g, rk, set ? blob_set_rank(set, rk->rg) : NULL, opts, &ls, err))) goto loaded;
        g->info.load.bytes += ls.bytes;
        g->info.load.n_threads = ls.n_threads;
        g->info.load.direct_reads += ls.direct_reads;
        g->info.load.buffered_reads += ls.buffered_reads;
        g->info.load.verified = ls.verified;
        g->info.weight_bytes += rk->wbytes;
        if ((st = setup_rank(g, rk, err))) {
            g5_error_prefix(err, "GPU setup");
            goto loaded;
        }
        g->info.extra_bytes += rk->xoff;
        g->info.kvb_exact_layers += rk->kvx_layers;
        if ((st = gl_lin_create(&lcfg, (cuk_stream)rk->st, &g->info, &rk->lin, err))) goto loaded;
    }
    rt_gpu_load_release(); /* the loader's pinned ring, kept across the ranks, is not needed after */
    g->info.load.seconds = gm_now_s() - t0;
    g->info.load.gb_per_s = g->info.load.seconds > 0 ? (double)g->info.load.bytes / g->info.load.seconds / 1e9 : 0;
    /* device draws (out->draw): one rank of one process holds the whole vocabulary's head */
    g->info.draws = g->T == 1 && g->info.n_processes == 1 && g->rk[0].head_write && g->rk[0].head_col0 == 0 &&
                    (uint64_t)g->rk[0].head.m == g->hp.n_vocab;
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, g->rk[0].dev) == cudaSuccess)
        snprintf(g->info.device_name, sizeof g->info.device_name, "%s", prop.name);
#ifdef G5_HAVE_NCCL
    if (g->coll == COLL_NCCL) st = gm_nccl_open(g, err);
#endif
loaded:
    if ((st = gm_coll_agree_load(g, st, err))) goto fail;
#ifdef G5_HAVE_NCCL
    if (g->coll == COLL_NCCL && (st = gm_nccl_init(g, err))) goto fail;
#endif
    if ((st = rt_gpu_seq_create(g, 0, &g->def, err))) goto fail;
    *out = g;
    return G5_OK;
fail:
    rt_gpu_model_free(g);
    return st;
}

static void free_work(gl_rank *rk) {
    if (rk->work) cudaFree(rk->work);
    if (rk->sc) cudaFree(rk->sc);
    if (rk->dpi) cudaFree(rk->dpi);
    if (rk->dpc) cudaFree(rk->dpc);
    rk->work = NULL;
    rk->sc = NULL;
    rk->dpi = NULL;
    rk->dpc = NULL;
    rk->ncap = 0;
    rk->sc_cap = 0;
    rk->dpen_cap = 0;
}

/* out->draw's penalty list on rank rk (the one holding the head), before the call's device work:
 * the device arrays grown to it, geometrically (the previous call's work has ended: forward_plan
 * synchronizes before it returns), then copied on the rank's stream. The host list may be
 * pageable: the caller keeps it until forward_plan returns, which waits for the stream first, on
 * failure too. */
static g5_status draw_pen_upload(gl_rank *rk, const rt_gpu_outputs *out, g5_error *err) {
    const uint32_t n = out->draw_n_pen;
    if (!n) return G5_OK;
    if (!out->draw_pen_ids || !out->draw_pen_counts)
        return g5_fail(err, G5_ERR_INVALID_ARG, "device draws: %u penalized ids without their arrays", n);
    CUK_CHECK(cudaSetDevice(rk->dev));
    if (n > rk->dpen_cap) {
        const uint32_t cap = n > 2 * rk->dpen_cap ? n : 2 * rk->dpen_cap;
        if (rk->dpi) cudaFree(rk->dpi);
        if (rk->dpc) cudaFree(rk->dpc);
        rk->dpi = NULL;
        rk->dpc = NULL;
        rk->dpen_cap = 0;
        CUK_CHECK(cudaMalloc((void **)&rk->dpi, (size_t)cap * sizeof *rk->dpi));
        CUK_CHECK(cudaMalloc((void **)&rk->dpc, (size_t)cap * sizeof *rk->dpc));
        rk->dpen_cap = cap;
    }
    cudaError_t ce = cudaMemcpyAsync(rk->dpi, out->draw_pen_ids, (size_t)n * sizeof *rk->dpi, cudaMemcpyHostToDevice, rk->st);
    if (ce == cudaSuccess)
        ce = cudaMemcpyAsync(rk->dpc, out->draw_pen_counts, (size_t)n * sizeof *rk->dpc, cudaMemcpyHostToDevice, rk->st);
    if (ce != cudaSuccess) {
        (void)cudaStreamSynchronize(rk->st); /* a copy already queued ends before the list is freed */
        return g5_fail(err, G5_ERR_INTERNAL, "device draws: penalty upload: %s", cudaGetErrorString(ce));
    }
    return G5_OK;
}

static void argmax_free(rt_gpu_model *g);

void rt_gpu_model_free(rt_gpu_model *g) {
    if (!g) return;
    /* ranks sharing a device share rank 0's stream: only owners touch (and destroy) a stream */
    for (uint32_t r = 0; g->rk && r < g->T; r++) {
        gl_rank *rk = &g->rk[r];
        cudaSetDevice(rk->dev);
        if (rk->own_stream) cudaStreamSynchronize(rk->st);
        if (rk->own_stream && rk->st2) cudaStreamSynchronize(rk->st2);
        if (rk->own_stream && rk->st3) cudaStreamSynchronize(rk->st3);
    }
    gm_graph_free(g);
    argmax_free(g);
    rt_gpu_seq_free(g->def);
    for (uint32_t r = 0; g->rk && r < g->T; r++) {
        gl_rank *rk = &g->rk[r];
        cudaSetDevice(rk->dev);
#ifdef G5_HAVE_NCCL
        if (rk->comm && g->nccl.comm_destroy) g->nccl.comm_destroy(rk->comm);
#endif
        free_work(rk);
        gl_lin_free(rk->lin);
        if (rk->wmem) cudaFree(rk->wmem);
        if (rk->xmem) cudaFree(rk->xmem);
        free(rk->segs);
        free(rk->L);
    }
    for (uint32_t r = 0; g->rk && r < g->T; r++) {
        gl_rank *rk = &g->rk[r];
        cudaSetDevice(rk->dev);
        for (int i = 0; i < 4; i++)
            if (rk->side_ev[i]) cudaEventDestroy(rk->side_ev[i]);
        for (int i = 0; i < 2; i++)
            if (rk->aux_ev[i]) cudaEventDestroy(rk->aux_ev[i]);
        if (rk->own_stream) {
            cudaStreamDestroy(rk->st);
            if (rk->st2) cudaStreamDestroy(rk->st2);
            if (rk->st3) cudaStreamDestroy(rk->st3);
        }
    }
#ifdef G5_HAVE_NCCL
    if (g->nccl.lib) dlclose(g->nccl.lib);
#endif
    free(g->vcol);
    free(g->rk);
    free(g);
}

void *rt_gpu_host_alloc(size_t bytes) {
    void *p = NULL;
    if (bytes && cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
        (void)cudaGetLastError(); /* not sticky: clear it for the next check */
        return NULL;
    }
    return p;
}

void rt_gpu_host_free(void *p) {
    if (p) (void)cudaFreeHost(p);
}

/* ---- state and work buffers ---- */

uint64_t gm_lat_w(const glm5_hparams *hp) { return (uint64_t)hp->kv_lora + hp->qk_rope; }

/* Layer il of sequence s's caches on rank r. */
uint8_t *gm_seq_lat(const rt_gpu_model *g, const rt_gpu_seq *s, uint32_t r, uint32_t il) {
    if (il >= g->hp.n_layer_main) return s->mrk[r].lat;
    return (uint8_t *)s->rk[r].lat + (uint64_t)il * s->cap * gm_lat_w(&g->hp) * g->lat_es;
}
/* Indexer keys exist for full layers only (IndexShare: a shared layer reuses a full layer's
 * top-k and keeps no keys): slot = full layers before il. NULL for a shared layer. */
static uint64_t idx_slot(const glm5_hparams *hp, uint32_t il) {
    uint64_t k = 0;
    for (uint32_t j = 0; j < il; j++) k += hp->idx_full[j];
    return k;
}
float *gm_seq_idxk(const rt_gpu_model *g, const rt_gpu_seq *s, uint32_t r, uint32_t il) {
    if (il >= g->hp.n_layer_main) return s->mrk[r].idxk;
    if (!g->hp.idx_full[il]) return NULL;
    return s->rk[r].idxk + idx_slot(&g->hp, il) * s->cap * g->hp.idx_head_dim;
}

uint64_t rt_gpu_seq_bytes(const rt_gpu_model *g, uint32_t positions) {
    const glm5_hparams *hp = &g->hp;
    const uint64_t per = (uint64_t)hp->n_layer_main * gm_lat_w(hp) * g->lat_es +
                         (uint64_t)glm5_n_idx_full(hp) * hp->idx_head_dim * 4;
    return per * positions * g->T;
}

/* Caches of exactly nc >= s->n_past positions on every rank, keeping the first n_past of each
 * layer: all new buffers are allocated before any old one is given up, so a failure (NOMEM)
 * leaves s as it was. */
static g5_status seq_resize(rt_gpu_seq *s, uint32_t nc, g5_error *err) {
    rt_gpu_model *g = s->g;
    const glm5_hparams *hp = &g->hp;
    const uint64_t LW = gm_lat_w(hp), ID = hp->idx_head_dim, Lm = hp->n_layer_main, es = g->lat_es;
    const uint64_t Lf = glm5_n_idx_full(hp); /* layers with indexer keys */
    seq_rank *nr = calloc(g->T, sizeof *nr);
    if (!nr) return g5_fail(err, G5_ERR_NOMEM, "sequence caches");
    g5_status st = G5_OK;
    for (uint32_t r = 0; r < g->T && !st; r++) {
        cudaError_t ce = cudaSetDevice(g->rk[r].dev);
        if (ce == cudaSuccess) ce = cudaMalloc(&nr[r].lat, (size_t)(Lm * nc * LW * es));
        if (ce == cudaSuccess) ce = cudaMalloc((void **)&nr[r].idxk, (size_t)(Lf * nc * ID * sizeof(float)));
        if (ce != cudaSuccess) {
            (void)cudaGetLastError(); /* an allocation failure must not surface at a later launch check */
            st = g5_fail(err, ce == cudaErrorMemoryAllocation ? G5_ERR_NOMEM : G5_ERR_INTERNAL,
                         "rank %u: GPU caches for %u positions (%.1f MB): %s", g->rk[r].rg, nc,
                         (double)rt_gpu_seq_bytes(g, nc) / g->T / 1e6, cudaGetErrorString(ce));
        }
    }
    for (uint32_t r = 0; r < g->T && !st && s->n_past; r++) {
        gl_rank *rk = &g->rk[r];
        cudaError_t ce = cudaSetDevice(rk->dev);
        for (uint32_t il = 0; il < Lm && ce == cudaSuccess; il++) {
            ce = cudaMemcpyAsync((uint8_t *)nr[r].lat + (uint64_t)il * nc * LW * es, gm_seq_lat(g, s, r, il),
                                 (size_t)s->n_past * LW * es, cudaMemcpyDeviceToDevice, rk->st);
            if (ce == cudaSuccess && hp->idx_full[il])
                ce = cudaMemcpyAsync(nr[r].idxk + idx_slot(hp, il) * nc * ID, gm_seq_idxk(g, s, r, il),
                                     (size_t)s->n_past * ID * 4, cudaMemcpyDeviceToDevice, rk->st);
        }
        if (ce == cudaSuccess) ce = cudaStreamSynchronize(rk->st);
        if (ce != cudaSuccess)
            st = g5_fail(err, G5_ERR_INTERNAL, "rank %u: cache copy: %s", g->rk[r].rg, cudaGetErrorString(ce));
    }
    seq_rank *old = st ? nr : s->rk;
    for (uint32_t r = 0; r < g->T; r++) {
        if (!old[r].lat && !old[r].idxk) continue;
        cudaSetDevice(g->rk[r].dev);
        if (old[r].lat) cudaFree(old[r].lat);
        if (old[r].idxk) cudaFree(old[r].idxk);
    }
    free(old);
    if (st) return st;
    s->rk = nr;
    s->cap = nc;
    return G5_OK;
}

/* Caches for `need` positions: grown by doubling from 256 (rt_gpu_forward's policy). */
g5_status gm_seq_need(rt_gpu_seq *s, uint32_t need, g5_error *err) {
    if (need <= s->cap) return G5_OK;
    uint32_t nc = s->cap ? s->cap : 256;
    while (nc < need) nc = nc > UINT32_MAX / 2 ? need : nc * 2;
    return seq_resize(s, nc, err);
}

g5_status rt_gpu_seq_create(rt_gpu_model *g, uint32_t reserve, rt_gpu_seq **out, g5_error *err) {
    *out = NULL;
    rt_gpu_seq *s = calloc(1, sizeof *s);
    if (s) s->rk = calloc(g->T, sizeof *s->rk);
    if (!s || !s->rk) {
        if (s) free(s->rk);
        free(s);
        return g5_fail(err, G5_ERR_NOMEM, "GPU sequence");
    }
    s->g = g;
    if (reserve) {
        g5_status st = seq_resize(s, reserve, err);
        if (st) {
            rt_gpu_seq_free(s);
            return st;
        }
    }
    *out = s;
    return G5_OK;
}

g5_status rt_gpu_seq_reserve(rt_gpu_seq *s, uint32_t positions, g5_error *err) {
    return positions <= s->cap ? G5_OK : seq_resize(s, positions, err);
}

void rt_gpu_seq_free(rt_gpu_seq *s) {
    if (!s) return;
    gm_mtp_seq_free(s);
    for (uint32_t r = 0; s->rk && r < s->g->T; r++) {
        if (!s->rk[r].lat && !s->rk[r].idxk) continue;
        cudaSetDevice(s->g->rk[r].dev);
        if (s->rk[r].lat) cudaFree(s->rk[r].lat);
        if (s->rk[r].idxk) cudaFree(s->rk[r].idxk);
    }
    free(s->rk);
    free(s);
}

typedef struct carve {
    uint8_t *base;
    uint64_t off;
} carve;

static void *take(carve *c, uint64_t bytes) {
    void *p = c->base ? c->base + c->off : NULL;
    c->off += up256(bytes);
    return p;
}

static uint64_t work_layout(const rt_gpu_model *g, gl_rank *rk, uint64_t N, uint8_t *base) {
    const glm5_hparams *hp = &g->hp;
    const uint64_t E = hp->n_embd, H = rk->c->H_l, F = 4, U = hp->n_expert_used;
    const uint64_t FR = rk->c->max_rows ? rk->c->max_rows : 1;
    carve c = {base, 0};
    rk->x = take(&c, N * E * F);
    rk->h = take(&c, N * E * F);
    rk->part = take(&c, N * E * F);
    rk->red = take(&c, N * E * F);
    rk->qr = take(&c, N * hp->q_lora * F);
    rk->kv = take(&c, N * gm_lat_w(hp) * F);
    rk->q = take(&c, N * H * (hp->qk_nope + hp->qk_rope) * F);
    rk->qlat = take(&c, N * H * hp->kv_lora * F);
    rk->olat = take(&c, N * H * hp->kv_lora * F);
    rk->ao = take(&c, N * H * hp->v_head * F);
    rk->iq = take(&c, N * hp->idx_n_head * hp->idx_head_dim * F);
    rk->iw = take(&c, N * hp->idx_n_head * F);
    rk->ga = take(&c, N * FR * F);
    rk->gb = take(&c, N * FR * F);
    rk->gu = take(&c, N * U * (rk->c->ffe_l ? rk->c->ffe_l : 1) * F);
    rk->moe = take(&c, N * E * F);
    rk->rl = take(&c, N * hp->n_expert * F);
    rk->wts = take(&c, N * U * F);
    rk->wts_l = take(&c, N * U * F);
    uint64_t head_m = (uint64_t)rk->head.m; /* the MTP head may be whole where output is split */
    if (g->has_mtp && (uint64_t)rk->mtp.head.m > head_m) head_m = (uint64_t)rk->mtp.head.m;
    rk->lg = take(&c, (uint64_t)CUK_GEMV_MAX_N * head_m * F);
    rk->ami = take(&c, N * 4);
    rk->amv = take(&c, N * 4);
    rk->drr = take(&c, N * sizeof *rk->drr);
    rk->dri = take(&c, N * 4);
    rk->drs = take(&c, cuk_sample_scratch_bytes(CUK_GEMV_MAX_N));
    rk->latf = take(&c, N * gm_lat_w(hp) * F);
    rk->ikf = take(&c, N * hp->idx_head_dim * F);
    rk->cat = take(&c, g->has_mtp ? N * 2 * E * F : 16);
    uint64_t xbn = N * (rk->c->max_ncols > E ? rk->c->max_ncols : E);
    if (N * U * rk->c->ffe_l > xbn) xbn = N * U * rk->c->ffe_l;
    if (N * H * hp->kv_lora > xbn) xbn = N * H * hp->kv_lora; /* every head's W_UV input at once */
    rk->xb = take(&c, rk->fast ? xbn * 2 : 16);
    uint64_t q8n = xbn > N * 2 * E ? xbn : N * 2 * E; /* + the NextN input [n][2E] */
    q8n = (q8n + 63) / 64 * 64;                         /* the upper half's q and ds 16-byte aligned */
    rk->q8n = rk->q8 ? q8n : 0;
    rk->q8q = take(&c, rk->q8 ? 2 * q8n : 16); /* two planes where gemv_q8x2 runs */
    rk->q8d = take(&c, rk->q8 ? 2 * q8n / 16 * 4 : 16);
    /* cuk_gemv_q8t's scratch for the widest product's k (max_ncols: every weight's row length) */
    rk->q8x_bytes = rk->q8 ? (uint64_t)CUK_Q8T_SCRATCH_PER_K * (rk->c->max_ncols > E ? rk->c->max_ncols : E) : 16;
    rk->q8x = take(&c, rk->q8x_bytes);
    rk->q8x2 = take(&c, rk->q8x_bytes);
    rk->q8x3 = take(&c, rk->q8x_bytes);
    rk->h16n = rk->h16 ? xbn : 0; /* every weight's k for N rows */
    rk->h16x = take(&c, rk->h16 ? xbn * 2 : 16);
    rk->h16u = take(&c, rk->h16 ? N * 4 : 16);
    rk->ids = take(&c, N * U * 4);
    rk->ids_l = take(&c, N * U * 4);
    const uint64_t nch = (N + GM_MOE_CHUNK - 1) / GM_MOE_CHUNK, chn = N < GM_MOE_CHUNK ? N : GM_MOE_CHUNK;
    rk->mplan = take(&c, nch * (uint64_t)cuk_moe_plan_words(GM_MOE_CHUNK, (int32_t)U) * 4);
    rk->mpart = take(&c, chn * U * E * F);
    rk->sel = take(&c, N * hp->idx_top_k * 4);
    rk->n_sel = take(&c, N * 4);
    rk->tok = take(&c, N * 4);
    rk->pos = take(&c, N * 4);
    rk->mrows = take(&c, N * (hp->n_layer_main + 1) * sizeof(cuk_seq_row)); /* + the NextN layer */
    return c.off;
}

/* Work buffers for n rows and sc_need indexer scores (the largest tokens x positions of one
 * sequence in the call). */
static g5_status work_reserve(rt_gpu_model *g, gl_rank *rk, uint32_t n, uint64_t sc_need, g5_error *err) {
    CUK_CHECK(cudaSetDevice(rk->dev));
    if (n > rk->ncap) {
        if (rk->work) {
            CUK_CHECK(cudaStreamSynchronize(rk->st));
            cudaFree(rk->work);
            rk->work = NULL;
            rk->ncap = 0;
        }
        uint32_t nc = n < 16 ? 16 : n;
        const uint64_t bytes = work_layout(g, rk, nc, NULL);
        void *p = NULL;
        if (cudaMalloc(&p, bytes) != cudaSuccess) {
            (void)cudaGetLastError(); /* not to be reported by a later launch check */
            return g5_fail(err, G5_ERR_NOMEM, "rank %u: %llu bytes of GPU work buffers for %u tokens", rk->rg,
                           (unsigned long long)bytes, nc);
        }
        rk->work = p;
        rk->ncap = nc;
        work_layout(g, rk, nc, p);
    }
    const uint64_t need = sc_need;
    if (need > rk->sc_cap) {
        if (rk->sc) {
            CUK_CHECK(cudaStreamSynchronize(rk->st));
            cudaFree(rk->sc);
            rk->sc = NULL;
            rk->sc_cap = 0;
        }
        uint64_t nc = need < 4096 ? 4096 : need + need / 2;
        if (cudaMalloc((void **)&rk->sc, nc * sizeof(float)) != cudaSuccess) {
            (void)cudaGetLastError();
            rk->sc = NULL;
            return g5_fail(err, G5_ERR_NOMEM, "rank %u: %llu indexer scores", rk->rg, (unsigned long long)need);
        }
        rk->sc_cap = nc;
    }
    return G5_OK;
}

g5_status gm_work_reserve(rt_gpu_model *g, gl_rank *rk, uint32_t n, uint64_t sc_need, g5_error *err) {
    return work_reserve(g, rk, n, sc_need, err);
}

/* ---- sub-step profiler (rt_gpu_debug_profile) ---- */


void gm_prof_mark(const rt_gpu_model *g, const gl_rank *rk, const char *stage, const char *label) {
    gprof *p = g->prof;
    if (p->ce != cudaSuccess) return;
    if (p->n >= p->cap) {
        p->overflow = 1;
        return;
    }
    if (p->scan_rows) gm_prof_scan(g, rk, p);
    else p->ce = cudaEventRecordWithFlags(p->ev[p->n], rk->st, p->external ? cudaEventRecordExternal : cudaEventRecordDefault);
    p->stage[p->n] = stage;
    p->label[p->n] = label;
    p->n++;
}

/* ---- side work (gpu_int.h) ---- */

/* The main stream and its q8t scratch exchanged with another stream's (side work, the third
 * stream): every helper queues where rk->st points. */
static void swap_main(gl_rank *rk, cudaStream_t *st, void **q8x) {
    cudaStream_t t = rk->st;
    rk->st = *st;
    *st = t;
    void *q = rk->q8x;
    rk->q8x = *q8x;
    *q8x = q;
}

static void side_swap(gl_rank *rk) { swap_main(rk, &rk->st2, &rk->q8x2); }

g5_status gm_side_begin(const rt_gpu_model *g, gl_rank *rk, int on, g5_error *err) {
    if (rk->side == 2) CK(gm_side_wait(rk, GM_SIDE_JOIN, err));
    if (!on || g->prof || !rk->st2 || rk->side) return G5_OK;
    CUK_CHECK(cudaEventRecord(rk->side_ev[0], rk->st));
    CUK_CHECK(cudaStreamWaitEvent(rk->st2, rk->side_ev[0], 0));
    side_swap(rk);
    rk->side = 1;
    rk->side_rec = 0;
    return G5_OK;
}

g5_status gm_side_point(gl_rank *rk, int i, g5_error *err) {
    if (rk->side != 1) return G5_OK;
    if (i < 1 || i >= GM_SIDE_JOIN) return g5_fail(err, G5_ERR_INTERNAL, "side point %d outside 1..%d", i, GM_SIDE_JOIN - 1);
    CUK_CHECK(cudaEventRecord(rk->side_ev[i], rk->st));
    rk->side_rec |= 1 << i;
    return G5_OK;
}

g5_status gm_side_end(gl_rank *rk, g5_error *err) {
    if (rk->side != 1) return G5_OK;
    side_swap(rk);
    rk->side = 2;
    CUK_CHECK(cudaEventRecord(rk->side_ev[GM_SIDE_JOIN], rk->st2));
    return G5_OK;
}

/* A point not recorded in this side run (its work was queued on the main stream, or never) waits
 * for the join: never less than what it names. */
g5_status gm_side_wait(gl_rank *rk, int i, g5_error *err) {
    if (rk->side != 2) return G5_OK;
    if (i < 1 || i > GM_SIDE_JOIN || !(rk->side_rec & (1 << i))) i = GM_SIDE_JOIN;
    CUK_CHECK(cudaStreamWaitEvent(rk->st, rk->side_ev[i], 0));
    if (i == GM_SIDE_JOIN) rk->side = 0;
    return G5_OK;
}

static void aux_swap(gl_rank *rk) { swap_main(rk, &rk->st3, &rk->q8x3); }

g5_status gm_aux_begin(const rt_gpu_model *g, gl_rank *rk, int on, g5_error *err) {
    if (!on || g->prof || !rk->st3 || rk->aux == 1 || rk->side == 1) return gm_aux_wait(rk, err);
    /* with a join pending (aux 2) the third stream goes on after what it holds, now also after
     * what the main stream holds; gm_aux_wait then joins all of it */
    CUK_CHECK(cudaEventRecord(rk->aux_ev[0], rk->st));
    CUK_CHECK(cudaStreamWaitEvent(rk->st3, rk->aux_ev[0], 0));
    aux_swap(rk);
    rk->aux = 1;
    return G5_OK;
}

g5_status gm_aux_end(gl_rank *rk, g5_error *err) {
    if (rk->aux != 1) return G5_OK;
    aux_swap(rk);
    rk->aux = 2;
    CUK_CHECK(cudaEventRecord(rk->aux_ev[1], rk->st3));
    return G5_OK;
}

g5_status gm_aux_wait(gl_rank *rk, g5_error *err) {
    if (rk->aux != 2) return G5_OK;
    CUK_CHECK(cudaStreamWaitEvent(rk->st, rk->aux_ev[1], 0));
    rk->aux = 0;
    return G5_OK;
}

/* After a failed stage (gm_attn_stage, gm_ffn_stage): the main stream back in rk->st, so that a
 * capture ends on the stream it began on (the side's and the third stream's work is not waited
 * for). Work is queued on at most one of them at a time: the side's swap or the third's is undone. */
void gm_side_reset(gl_rank *rk) {
    if (rk->side == 1) side_swap(rk);
    if (rk->aux == 1) aux_swap(rk);
    rk->side = 0;
    rk->aux = 0;
}

/* ---- stages ---- */

/* rk->h = RMSNorm(x) * w over n rows, the pending residual add folded in first. */
g5_status gm_norm_x(gl_rank *rk, const float *w, uint32_t n, int64_t E, float eps, g5_error *err) {
    cuk_q8_act none;
    return gm_norm_x_q8(rk, w, n, E, eps, 0, &none, err);
}

/* The norm of gm_norm_x*: rk->h = RMSNorm(x + the pending addends) * w */
static cuk_add_rms_norm_args norm_x_args(const gl_rank *rk, const float *w, uint32_t n, int64_t E, float eps) {
    return (cuk_add_rms_norm_args){.x = rk->x, .ldx = E, .a = rk->pa, .b = rk->pa ? rk->pb : NULL, .lda = E,
                                   .w = w, .y = rk->h, .ldy = E, .n_rows = n, .dim = E, .eps = eps};
}

g5_status gm_norm_x_q8(gl_rank *rk, const float *w, uint32_t n, int64_t E, float eps, int planes, cuk_q8_act *o,
                       g5_error *err) {
    const cuk_add_rms_norm_args na = norm_x_args(rk, w, n, E, eps);
    CK(gm_norm_q8(rk, &na, planes, o, err));
    rk->pa = rk->pb = NULL;
    return G5_OK;
}

g5_status gm_norm_x_h16(gl_rank *rk, const float *w, uint32_t n, int64_t E, float eps, cuk_h16_act *o, g5_error *err) {
    const cuk_add_rms_norm_args na = norm_x_args(rk, w, n, E, eps);
    CK(gm_norm_h16(rk, &na, o, err));
    rk->pa = rk->pb = NULL;
    return G5_OK;
}

g5_status gm_embed(gl_rank *rk, uint32_t n, int64_t E, g5_error *err) {
    const cuk_dequant_rows_args dq = {.w_type = rk->tok_embd.type, .w = rk->tok_embd.w, .k = E,
                                      .n_rows_w = rk->tok_embd.m, .rows = rk->tok, .n = n, .out = rk->x, .ldo = E};
    CK(cuk_dequant_rows(&dq, (cuk_stream)rk->st, err));
    rk->pa = rk->pb = NULL;
    return G5_OK;
}

/* The pending residual add on its own, for readers of x other than the norms (debug copies). */
static g5_status flush_x(gl_rank *rk, uint32_t n, int64_t E, g5_error *err) {
    if (!rk->pa) return G5_OK;
    const cuk_stream cs = (cuk_stream)rk->st;
    if (rk->pb) { /* the order of the unfused adds: experts + shared into part, then x + part */
        CK(cuk_add(rk->pa, rk->pb, rk->part, (int64_t)n * E, cs, err));
        rk->pa = rk->part;
    }
    CK(cuk_add(rk->x, rk->pa, rk->x, (int64_t)n * E, cs, err));
    rk->pa = rk->pb = NULL;
    return G5_OK;
}

static g5_status d2h(const gl_rank *rk, void *dst, const void *src, size_t bytes, g5_error *err) {
    CUK_CHECK(cudaSetDevice(rk->dev));
    CUK_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, rk->st));
    CUK_CHECK(cudaStreamSynchronize(rk->st));
    return G5_OK;
}

/* x += sum over ranks (rank order) of the stage outputs, on every rank; dbg (host) gets the
 * sum. The add into x itself is left pending (rk->pa, pb) for the norm that reads x next; one
 * device runs no collective work at all (no launch unless dbg). */
g5_status gm_collective(rt_gpu_model *g, uint32_t n, float *dbg, g5_error *err) {
    const int64_t cnt = (int64_t)n * g->hp.n_embd;
    gl_rank *r0 = &g->rk[0];
    const float *sum = r0->part;
    if (g->coll == COLL_NONE) {
        if (dbg && r0->ob) {
            CUK_CHECK(cudaSetDevice(r0->dev));
            CK(cuk_add(r0->oa, r0->ob, r0->part, cnt, (cuk_stream)r0->st, err));
            r0->oa = r0->part;
            r0->ob = NULL;
        }
        r0->pa = r0->oa;
        r0->pb = r0->ob;
        sum = r0->oa;
    } else if (g->coll == COLL_DEVICE) {
        CUK_CHECK(cudaSetDevice(r0->dev));
        CUK_CHECK(cudaMemcpyAsync(r0->red, r0->part, (size_t)cnt * 4, cudaMemcpyDeviceToDevice, r0->st));
        for (uint32_t r = 1; r < g->T; r++) CK(cuk_add(r0->red, g->rk[r].part, r0->red, cnt, (cuk_stream)r0->st, err));
        for (uint32_t r = 0; r < g->T; r++) { /* red is rewritten only by the next collective */
            g->rk[r].pa = r0->red;
            g->rk[r].pb = NULL;
        }
        sum = r0->red;
    } else {
#ifdef G5_HAVE_NCCL
        nccl_api *a = &g->nccl;
        ncclResult_t nr = a->group_start();
        for (uint32_t r = 0; r < g->T && nr == ncclSuccess; r++) {
            gl_rank *rk = &g->rk[r];
            CUK_CHECK(cudaSetDevice(rk->dev));
            nr = a->all_reduce(rk->part, rk->part, (size_t)cnt, ncclFloat32, ncclSum, rk->comm, rk->st);
        }
        ncclResult_t ne = a->group_end();
        if (nr != ncclSuccess || ne != ncclSuccess)
            return g5_fail(err, G5_ERR_INTERNAL, "ncclAllReduce: %s", a->error_string(nr != ncclSuccess ? nr : ne));
        for (uint32_t r = 0; r < g->T; r++) {
            g->rk[r].pa = g->rk[r].part;
            g->rk[r].pb = NULL;
        }
#else
        return g5_fail(err, G5_ERR_UNSUPPORTED, "no NCCL in this build");
#endif
    }
    if (dbg) CK(d2h(r0, dbg, sum, (size_t)cnt * 4, err));
    return G5_OK;
}

/* The device work of one forward call after the token and position upload: embedding, layers,
 * final norm and (logits) the head GEMVs into rk->lg (copied out here unless `graph`). With
 * `graph` (one token, no debugging outputs) every call below only enqueues on the ranks' streams
 * (rank 0's for all under the device-side sum), which are being captured (gpu_graph.c). */
static g5_status forward_head(rt_gpu_model *g, const fplan *pl, const rt_gpu_outputs *out, int graph,
                              g5_error *err);

g5_status gm_forward_device(rt_gpu_model *g, const fplan *pl, const rt_gpu_outputs *out, int graph,
                            g5_error *err) {
    const glm5_hparams *hp = &g->hp;
    const uint32_t n = pl->n;
    const uint64_t E = hp->n_embd, Lm = hp->n_layer_main, K = hp->idx_top_k;
    for (uint32_t r = 0; r < g->T; r++) {
        gl_rank *rk = &g->rk[r];
        CUK_CHECK(cudaSetDevice(rk->dev));
        CK(gm_embed(rk, n, (int64_t)E, err));
    }
    gl_rank *r0 = &g->rk[0];
    const uint64_t nE = (uint64_t)n * E;
    if (out && out->layer_hidden) CK(d2h(r0, out->layer_hidden, r0->x, nE * 4, err));
    for (uint32_t il = 0; il < Lm; il++) {
        for (uint32_t r = 0; r < g->T; r++) CK(gm_attn_stage(g, &g->rk[r], il, pl, err));
        CK(gm_collective(g, n, out && out->attn_out ? out->attn_out + il * nE : NULL, err));
        for (uint32_t r = 0; r < g->T; r++) CK(gm_ffn_stage(g, &g->rk[r], il, n, err));
        CK(gm_collective(g, n, out && out->ffn_out ? out->ffn_out + il * nE : NULL, err));
        if (out && out->layer_hidden) {
            CUK_CHECK(cudaSetDevice(r0->dev));
            CK(flush_x(r0, n, (int64_t)E, err));
            CK(d2h(r0, out->layer_hidden + (il + 1) * nE, r0->x, nE * 4, err));
        }
        if (out && out->topk) CK(d2h(r0, out->topk + il * n * K, r0->sel, (size_t)n * K * 4, err));
        if (out && out->experts) {
            int32_t *ex = out->experts + il * n * hp->n_expert_used;
            if (r0->L[il].dense) {
                for (uint64_t i = 0; i < (uint64_t)n * hp->n_expert_used; i++) ex[i] = -1;
            } else {
                CK(d2h(r0, ex, r0->ids, (size_t)n * hp->n_expert_used * 4, err));
            }
        }
    }
    const int head = out && (out->logits || out->argmax || out->draw);
    const uint32_t first = head && out->all_logits ? 0 : n - 1;
    for (uint32_t r = 0; r < g->T; r++) {
        gl_rank *rk = &g->rk[r];
        CUK_CHECK(cudaSetDevice(rk->dev));
        /* every row to the head (decode steps), each chunk with int8 inputs: the final norm
         * quantizes them in its launch (cuk_norm_q8), the same bits as the chunks' own */
        int h8 = head && !first && rk->head_write;
        for (uint32_t t0 = 0; t0 < n && h8; t0 += CUK_GEMV_MAX_N)
            h8 = gm_q8_takes(rk, &rk->head, n - t0 < CUK_GEMV_MAX_N ? n - t0 : CUK_GEMV_MAX_N);
        CK(gm_norm_x_q8(rk, rk->out_norm, n, (int64_t)E, hp->rms_eps, h8, &rk->head_q8, err));
    }
    if (!graph && out && out->hidden) CK(d2h(r0, out->hidden, r0->h, nE * 4, err));
    return graph == GM_DEV_BODY ? G5_OK : forward_head(g, pl, out, graph, err);
}

/* The output head of forward_device after its final norm: the head GEMVs into rk->lg, and unless
 * `graph` the logits copies, argmax and draws of each chunk of rows. */
static g5_status forward_head(rt_gpu_model *g, const fplan *pl, const rt_gpu_outputs *out, int graph,
                              g5_error *err) {
    const uint32_t n = pl->n;
    const uint64_t E = g->hp.n_embd, V = g->hp.n_vocab;
    const int head = out && (out->logits || out->argmax || out->draw);
    const uint32_t first = head && out->all_logits ? 0 : n - 1;
    if (head) {
        for (uint32_t r = 0; r < g->T; r++) {
            gl_rank *rk = &g->rk[r];
            if (!rk->head_write) continue;
            CUK_CHECK(cudaSetDevice(rk->dev));
            const int64_t VL = rk->head.m;
            const cuk_q8_act *hq = &rk->head_q8;
            for (uint32_t t0 = first; t0 < n; t0 += CUK_GEMV_MAX_N) {
                const uint32_t c = n - t0 < CUK_GEMV_MAX_N ? n - t0 : CUK_GEMV_MAX_N;
                /* ranks sharing a device share rk->lg's stream but not rk->lg: a graph keeps each
                 * rank's last chunk (graph calls have one token: one chunk) for the copy after it */
                if (hq->q) {
                    const cuk_q8_act x = gm_q8_rows(hq, t0);
                    CK(gm_gemv_q8_in(rk, &rk->head, &x, c, rk->lg, VL, err));
                } else {
                    CK(gm_gemv_q8(rk, &rk->head, rk->h + (uint64_t)t0 * E, (int64_t)E, c, rk->lg, VL, err));
                }
                if (!graph && out->logits)
                    CUK_CHECK(cudaMemcpy2DAsync(out->logits + (uint64_t)(t0 - first) * V + rk->head_col0, V * 4, rk->lg,
                                         VL * 4, VL * 4, c, cudaMemcpyDeviceToHost, rk->st));
                if (!graph && out->argmax) CK(gm_head_argmax(rk, t0 - first, c, err));
                if (!graph && out->draw) CK(gm_head_draw(g, rk, t0 - first, c, err));
            }
            if (!graph && out->argmax) CK(gm_head_argmax_out(g, rk, n - first, err));
            if (!graph && out->draw) CK(gm_head_draw_out(g, rk, n - first, err));
        }
    }
    return G5_OK;
}

g5_status gm_forward_head(rt_gpu_model *g, const fplan *pl, const rt_gpu_outputs *out, g5_error *err) {
    return forward_head(g, pl, out, GM_DEV_PLAIN, err);
}

g5_status gm_head_argmax(gl_rank *rk, uint32_t row0, uint32_t c, g5_error *err) {
    const int64_t VL = rk->head.m;
    CK(cuk_argmax(rk->lg, VL, c, VL, rk->ami + row0, rk->amv + row0, (cuk_stream)rk->st, err));
    return G5_OK;
}

g5_status gm_head_argmax_out(rt_gpu_model *g, gl_rank *rk, uint32_t rows, g5_error *err) {
    if ((uint64_t)rows * g->T > g->amh_cap)
        return g5_fail(err, G5_ERR_INTERNAL, "argmax staging for %u rows of %u ranks holds %llu", rows, g->T,
                       (unsigned long long)g->amh_cap);
    CUK_CHECK(cudaMemcpyAsync(g->amh_i + (size_t)rk->r * rows, rk->ami, rows * 4, cudaMemcpyDeviceToHost, rk->st));
    CUK_CHECK(cudaMemcpyAsync(g->amh_v + (size_t)rk->r * rows, rk->amv, rows * 4, cudaMemcpyDeviceToHost, rk->st));
    return G5_OK;
}

g5_status gm_head_draw(rt_gpu_model *g, gl_rank *rk, uint32_t row0, uint32_t c, g5_error *err) {
    const int64_t VL = rk->head.m;
    CUK_CHECK(cudaMemcpyAsync(rk->drr + row0, g->drh + row0, c * sizeof *rk->drr, cudaMemcpyHostToDevice, rk->st));
    int32_t any_top_p = 0, any_top_k = 0, any_pen = 0;
    for (uint32_t i = row0; i < row0 + c; i++) {
        any_top_p |= g->drh[i].temperature > 0 && g->drh[i].top_p < 1.0f;
        any_top_k |= g->drh[i].temperature > 0 && g->drh[i].top_k > 0 && g->drh[i].top_k < VL;
        any_pen |= g->drh[i].n_pen > 0;
    }
    const cuk_sample_args a = {rk->lg, VL, (int32_t)VL, (int32_t)c, rk->drr + row0, rk->drs, rk->dri + row0, any_top_p,
                               any_top_k, rk->dpi, rk->dpc, any_pen};
    CK(cuk_sample(&a, (cuk_stream)rk->st, err));
    return G5_OK;
}

g5_status gm_head_draw_out(rt_gpu_model *g, gl_rank *rk, uint32_t rows, g5_error *err) {
    if (rows > g->amh_cap) return g5_fail(err, G5_ERR_INTERNAL, "draw staging for %u rows holds %llu", rows,
                                          (unsigned long long)g->amh_cap);
    CUK_CHECK(cudaMemcpyAsync(g->amh_i, rk->dri, rows * 4, cudaMemcpyDeviceToHost, rk->st));
    return G5_OK;
}

/* out->argmax of `rows` rows from the ranks' copies (after their streams are synchronized): the
 * larger logit wins, then the lower vocabulary id, as within each rank's columns (cuk_argmax),
 * so the result is the whole row's argmax whatever the split. */
static void argmax_combine(const rt_gpu_model *g, uint32_t rows, int32_t *ids, float *vals) {
    for (uint32_t t = 0; t < rows; t++) {
        int64_t best = -1;
        float bv = NAN;
        for (uint32_t r = 0; r < g->T; r++) {
            const int32_t i = g->amh_i[(size_t)r * rows + t];
            if (g->rk[r].head_write && i >= 0)
                gm_argmax_take(&best, &bv, (int64_t)i + g->rk[r].head_col0, g->amh_v[(size_t)r * rows + t]);
        }
        ids[t] = (int32_t)best;
        vals[t] = best < 0 ? NAN : bv;
    }
}

static void argmax_free(rt_gpu_model *g) {
    if (g->amh_paged) free(g->drh);
    else rt_gpu_host_free(g->drh);
    g->drh = NULL;
    g->amh_i = NULL;
    g->amh_v = NULL;
    g->amh_cap = 0;
}

/* The host staging of out->argmax and out->draw for `rows` rows (of every rank): the draws' rows,
 * then the ids and logits. Page-locked, since a copy into pageable memory returns only when done,
 * which would hold each rank's head launches until the rank before it had finished (malloc'ed if
 * the driver has no page-locked memory to give). */
static g5_status argmax_room(rt_gpu_model *g, uint32_t rows, g5_error *err) {
    const uint64_t need = (uint64_t)rows * g->T;
    if (need <= g->amh_cap) return G5_OK;
    argmax_free(g);
    const size_t bytes = (size_t)need * (sizeof *g->drh + sizeof *g->amh_i + sizeof *g->amh_v);
    void *p = rt_gpu_host_alloc(bytes);
    g->amh_paged = !p;
    if (!p && !(p = malloc(bytes))) return g5_fail(err, G5_ERR_NOMEM, "argmax staging for %u rows", rows);
    g->drh = p;
    g->amh_i = (int32_t *)(void *)(g->drh + need);
    g->amh_v = (float *)(void *)(g->amh_i + need);
    g->amh_cap = need;
    return G5_OK;
}

/* The per-layer tables of a batched decode step (rk->mrows): row i's sequence's caches of layer
 * il and its position, entry il * n + i, for the layers l0 .. l1 - 1 (the NextN layer's, at
 * n_layer_main, are the sequence's NextN caches). The copy is synchronous to the host (pageable
 * memory). */
g5_status gm_write_rows(rt_gpu_model *g, const fplan *pl, uint32_t l0, uint32_t l1, g5_error *err) {
    const uint32_t n = pl->n;
    cuk_seq_row *h = malloc((size_t)(l1 - l0) * n * sizeof *h);
    if (!h) return g5_fail(err, G5_ERR_NOMEM, "batch tables");
    g5_status st = G5_OK;
    for (uint32_t r = 0; r < g->T && !st; r++) {
        gl_rank *rk = &g->rk[r];
        for (uint32_t il = l0; il < l1; il++)
            for (uint32_t i = 0; i < n; i++) {
                cuk_seq_row *e = &h[(size_t)(il - l0) * n + pl->row0[i]];
                const int mtp = il >= g->hp.n_layer_main;
                e->lat = gm_seq_lat(g, pl->seq[i], r, il);
                e->idxk = rk->L[il].has_idx ? gm_seq_idxk(g, pl->seq[i], r, il) : NULL;
                e->cap = (int32_t)(mtp ? pl->seq[i]->mtp_cap : pl->seq[i]->cap);
                e->pos = (int32_t)pl->pos0[i];
            }
        cudaError_t ce = cudaSetDevice(rk->dev);
        if (ce == cudaSuccess)
            ce = cudaMemcpyAsync(rk->mrows + (size_t)l0 * n, h, (size_t)(l1 - l0) * n * sizeof *h,
                                 cudaMemcpyHostToDevice, rk->st);
        if (ce == cudaSuccess) ce = cudaStreamSynchronize(rk->st);
        if (ce != cudaSuccess) st = g5_fail(err, G5_ERR_INTERNAL, "batch table upload: %s", cudaGetErrorString(ce));
    }
    free(h);
    return st;
}

/* One forward call over the plan's rows (tokens [pl->n]): caches and work buffers reserved, tokens
 * and positions uploaded, the device work (a graph launch for a single one-token sequence
 * under opts.cuda_graph: the uploads are that step's parameters), then every sequence advanced. */
static g5_status forward_plan(rt_gpu_model *g, const fplan *pl, const int32_t *tokens, const rt_gpu_outputs *out,
                              g5_error *err) {
    const glm5_hparams *hp = &g->hp;
    const uint32_t n = pl->n;
    if (out && out->draw && (!g->info.draws || !out->draw_ids || out->argmax))
        return g5_fail(err, G5_ERR_INVALID_ARG, "device draws: %s", !g->info.draws ? "the output head is split over "
                       "ranks or processes (rt_gpu_info.draws)" : !out->draw_ids ? "no draw_ids" : "not with argmax");
    for (uint32_t t = 0; t < n; t++)
        if (tokens[t] < 0 || (uint32_t)tokens[t] >= hp->n_vocab)
            return g5_fail(err, G5_ERR_INVALID_ARG, "token %d at index %u is outside the vocabulary (%u)", tokens[t],
                           t, hp->n_vocab);
    uint64_t sc_need = 0;
    for (uint32_t i = 0; i < pl->n_seg; i++) {
        if (pl->pos0[i] > INT32_MAX - pl->len[i]) return g5_fail(err, G5_ERR_OVERFLOW, "position overflow");
        const uint32_t P = pl->pos0[i] + pl->len[i];
        CK(gm_seq_need(pl->seq[i], P, err));
        if ((uint64_t)pl->len[i] * P > sc_need) sc_need = (uint64_t)pl->len[i] * P;
    }
    /* a batched decode step (one token per sequence): its attention runs as one launch per
     * kernel over a table of the sequences' caches (gm_attn_stage); scores [n][max P] */
    uint32_t multi = pl->n_seg > 1 && pl->n_seg == n;
    for (uint32_t i = 0; i < pl->n_seg && multi; i++) multi = pl->len[i] == 1;
    if (multi) {
        uint32_t mp = 1;
        for (uint32_t i = 0; i < pl->n_seg; i++)
            if (pl->pos0[i] + 1 > mp) mp = pl->pos0[i] + 1;
        multi = mp;
        if ((uint64_t)n * mp > sc_need) sc_need = (uint64_t)n * mp;
    }
    const int dbg = out && (out->layer_hidden || out->attn_out || out->ffn_out || out->topk || out->experts);
    const int graph = g->info.cuda_graph && n == 1 && pl->n_seg == 1 && !dbg;
    /* a graph step: its launches shaped for `bound` key positions, the score buffer too; a
     * batched one (gm_forward_graph_rows): its attention's (multi), for every row */
    const uint32_t bound = graph ? gm_graph_bound(pl->pos0[0] + 1, pl->seq[0]->cap) : 0;
    if (bound > sc_need) sc_need = bound;
    /* only where every layer's attention takes the multi launches: a per-sequence one would hold
     * the capturing step's sequences and positions */
    int rgraph = g->info.cuda_graph && multi && n <= GM_RGRAPH_MAX && !dbg;
    for (uint32_t r = 0; r < g->T && rgraph; r++) rgraph = gm_attn_multi(g, &g->rk[r], n);
    if (rgraph) {
        multi = gm_graph_bound(multi, UINT32_MAX);
        if ((uint64_t)n * multi > sc_need) sc_need = (uint64_t)n * multi;
    }
    int32_t *pos = malloc(n * sizeof *pos);
    if (!pos) return g5_fail(err, G5_ERR_NOMEM, "positions");
    for (uint32_t i = 0; i < pl->n_seg; i++)
        for (uint32_t t = 0; t < pl->len[i]; t++) pos[pl->row0[i] + t] = (int32_t)(pl->pos0[i] + t);
    g5_status st = G5_OK;
    /* allocation (seq_need, work_reserve) and the uploads stay outside any capture */
    for (uint32_t r = 0; r < g->T && !st; r++) {
        gl_rank *rk = &g->rk[r];
        st = work_reserve(g, rk, n, sc_need, err);
        cudaError_t ce = cudaSuccess;
        if (!st) ce = cudaSetDevice(rk->dev);
        if (!st && ce == cudaSuccess) ce = cudaMemcpyAsync(rk->tok, tokens, n * 4, cudaMemcpyHostToDevice, rk->st);
        if (!st && ce == cudaSuccess) ce = cudaMemcpyAsync(rk->pos, pos, n * 4, cudaMemcpyHostToDevice, rk->st);
        if (!st && ce == cudaSuccess) ce = cudaStreamSynchronize(rk->st); /* pos is freed below */
        if (!st && ce != cudaSuccess) st = g5_fail(err, G5_ERR_INTERNAL, "token upload: %s", cudaGetErrorString(ce));
    }
    free(pos);
    if (st) return st;
    if (multi) CK(gm_write_rows(g, pl, 0, hp->n_layer_main, err));
    const uint32_t out_rows = out && out->all_logits ? n : 1;
    if (out && (out->argmax || out->draw)) CK(argmax_room(g, out_rows, err));
    if (out && out->draw) {
        memcpy(g->drh, out->draw, (size_t)out_rows * sizeof *g->drh);
        for (uint32_t i = 0; i < out_rows; i++)
            if ((uint64_t)g->drh[i].pen_off + g->drh[i].n_pen > out->draw_n_pen)
                return g5_fail(err, G5_ERR_INVALID_ARG, "device draws: row %u's penalties past the list of %u", i,
                               out->draw_n_pen);
        for (uint32_t j = 0; j < out->draw_n_pen; j++) /* the kernel writes these logits */
            if (!out->draw_pen_ids || out->draw_pen_ids[j] < 0 || (uint32_t)out->draw_pen_ids[j] >= hp->n_vocab)
                return g5_fail(err, G5_ERR_INVALID_ARG, "device draws: penalized id %d outside the vocabulary (%u)",
                               out->draw_pen_ids ? out->draw_pen_ids[j] : -1, hp->n_vocab);
        for (uint32_t i = 0; i < out_rows; i++) /* ascending within a row: distinct, so no two threads share a logit */
            for (uint32_t j = 1; j < g->drh[i].n_pen; j++)
                if (out->draw_pen_ids[g->drh[i].pen_off + j] <= out->draw_pen_ids[g->drh[i].pen_off + j - 1])
                    return g5_fail(err, G5_ERR_INVALID_ARG, "device draws: row %u's penalized ids are not ascending", i);
        CK(draw_pen_upload(&g->rk[0], out, err)); /* rt_gpu_info.draws: rank 0 holds the head */
    }
    /* the prefill GEMM path serves single-sequence calls: a decode batch's rows stay bit-identical
     * to one-token calls (its GEMV kernels sum each row alike) */
    for (uint32_t r = 0; r < g->T; r++) {
        gl_lin_arm(g->rk[r].lin, pl->n_seg == 1);
        g->rk[r].batch_rows = pl->n_seg > 1;
        g->rk[r].multi = multi;
    }
    const g5_status fst = graph    ? gm_forward_graph(g, pl, bound, out, err)
                          : rgraph ? gm_forward_graph_rows(g, pl, multi, out, err)
                                   : gm_forward_device(g, pl, out, GM_DEV_PLAIN, err);
    for (uint32_t r = 0; r < g->T; r++) {
        g->rk[r].batch_rows = 0;
        g->rk[r].multi = 0;
        if (fst != G5_OK) { /* copies already queued into the caller's (page-locked) rows end first */
            if (cudaSetDevice(g->rk[r].dev) == cudaSuccess) (void)cudaStreamSynchronize(g->rk[r].st);
            continue;
        }
        CUK_CHECK(cudaSetDevice(g->rk[r].dev));
        CUK_CHECK(cudaStreamSynchronize(g->rk[r].st));
    }
    if (fst != G5_OK) return fst;
    /* several processes: each wrote only its ranks' vocabulary columns */
    if (out && out->logits) CK(gm_coll_gather_logits(g, out->logits, out->all_logits ? n : 1, err));
    if (out && out->argmax) {
        argmax_combine(g, out_rows, out->argmax, out->argmax_logit);
        CK(gm_coll_gather_argmax(g, out->argmax, out->argmax_logit, out_rows, err));
    }
    if (out && out->draw) memcpy(out->draw_ids, g->amh_i, (size_t)out_rows * sizeof *out->draw_ids);
    for (uint32_t i = 0; i < pl->n_seg; i++) pl->seq[i]->n_past = pl->pos0[i] + pl->len[i];
    return G5_OK;
}

g5_status rt_gpu_forward_seq(rt_gpu_model *g, rt_gpu_seq *s, const int32_t *tokens, uint32_t n,
                             const rt_gpu_outputs *out, g5_error *err) {
    if (n == 0) return G5_OK;
    if (!s || s->g != g) return g5_fail(err, G5_ERR_INVALID_ARG, "the sequence belongs to another GPU model");
    rt_gpu_seq *const seqs[1] = {s};
    const uint32_t pos0 = s->n_past, len = n, row0 = 0;
    const fplan pl = {n, 1, seqs, &pos0, &len, &row0};
    return forward_plan(g, &pl, tokens, out, err);
}

g5_status rt_gpu_forward(rt_gpu_model *g, const int32_t *tokens, uint32_t n,
                         const rt_gpu_outputs *out, g5_error *err) {
    return rt_gpu_forward_seq(g, g->def, tokens, n, out, err);
}

/* The plan of a rows step: one segment of one token per row, a sequence's rows at its next
 * positions in order (the last one's n_past is the sequence's after the call). */
g5_status gm_rows_plan(rt_gpu_model *g, rt_gpu_seq *const *seqs, const uint32_t *n_tok, uint32_t n_seq, int mtp,
                       gm_rows *rw, g5_error *err) {
    memset(rw, 0, sizeof *rw);
    uint64_t n = 0;
    for (uint32_t i = 0; i < n_seq; i++) {
        if (!seqs[i] || seqs[i]->g != g)
            return g5_fail(err, G5_ERR_INVALID_ARG, "batch entry %u: not a sequence of this GPU model", i);
        if (n_tok && !n_tok[i]) return g5_fail(err, G5_ERR_INVALID_ARG, "batch entry %u has no tokens", i);
        for (uint32_t j = 0; j < i; j++)
            if (seqs[j] == seqs[i])
                return g5_fail(err, G5_ERR_INVALID_ARG, "batch entries %u and %u are the same sequence", j, i);
        const uint32_t c = n_tok ? n_tok[i] : 1, p0 = mtp ? seqs[i]->mtp_n_past : seqs[i]->n_past;
        if (p0 > INT32_MAX - c) return g5_fail(err, G5_ERR_OVERFLOW, "batch entry %u: position overflow", i);
        n += c;
    }
    if (n > UINT32_MAX / 4) return g5_fail(err, G5_ERR_OVERFLOW, "batch of %llu rows", (unsigned long long)n);
    uint32_t *a = malloc((size_t)n * 3 * sizeof *a);
    rt_gpu_seq **sq = malloc((size_t)n * sizeof *sq);
    if (!a || !sq) {
        free(a);
        free(sq);
        return g5_fail(err, G5_ERR_NOMEM, "batch of %llu rows", (unsigned long long)n);
    }
    uint32_t *pos0 = a, *len = a + n, *row0 = a + 2 * n, t = 0;
    for (uint32_t i = 0; i < n_seq; i++)
        for (uint32_t j = 0, c = n_tok ? n_tok[i] : 1; j < c; j++, t++) {
            sq[t] = seqs[i];
            pos0[t] = (mtp ? seqs[i]->mtp_n_past : seqs[i]->n_past) + j;
            len[t] = 1;
            row0[t] = t;
        }
    rw->a = a;
    rw->sq = sq;
    rw->pl = (fplan){(uint32_t)n, (uint32_t)n, sq, pos0, len, row0};
    return G5_OK;
}

void gm_rows_free(gm_rows *rw) {
    free(rw->a);
    free(rw->sq);
}

g5_status rt_gpu_forward_rows(rt_gpu_model *g, rt_gpu_seq *const *seqs, const uint32_t *n_tok, uint32_t n_seq,
                              const int32_t *tokens, const rt_gpu_outputs *out, g5_error *err) {
    if (n_seq == 0) return G5_OK;
    if (out && (out->layer_hidden || out->attn_out || out->ffn_out || out->topk || out->experts || !out->all_logits))
        return g5_fail(err, G5_ERR_INVALID_ARG, "a rows step gives every row's logits and hidden states, nothing else");
    gm_rows rw;
    CK(gm_rows_plan(g, seqs, n_tok, n_seq, 0, &rw, err));
    /* one row of one sequence: the one-token call itself (a graph step where those are) */
    g5_status st = rw.pl.n == 1 ? rt_gpu_forward_seq(g, seqs[0], tokens, 1, out, err)
                                : forward_plan(g, &rw.pl, tokens, out, err);
    gm_rows_free(&rw);
    return st;
}

g5_status rt_gpu_forward_batch(rt_gpu_model *g, rt_gpu_seq *const *seqs, const int32_t *tokens,
                               uint32_t n_seq, float *logits, g5_error *err) {
    const rt_gpu_outputs out = {.logits = logits, .all_logits = 1};
    return rt_gpu_forward_rows(g, seqs, NULL, n_seq, tokens, logits ? &out : NULL, err);
}

typedef int rt_gpu_model_unused_;
#endif
