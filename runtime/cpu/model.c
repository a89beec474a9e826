/* GLM-5 forward pass: setup (tensor lookup and shard checks), decoding state, the rank workers,
 * dense FFN and MoE, final norm and lm_head, and the NextN/MTP block. Attention is in attn.c,
 * the exchanges between ranks (and processes) in model_comm.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/quant.h"
#include "runtime/cpu/model_impl.h"

/* ---- setup ---- */

static g5_status own(rt_model *m, void *p, g5_error *err) {
    if (m->n_owned == m->cap_owned) {
        uint64_t nc = m->cap_owned ? m->cap_owned * 2 : 256;
        void **q = realloc(m->owned, nc * sizeof *q);
        if (!q) {
            free(p);
            return g5_fail(err, G5_ERR_NOMEM, "model bookkeeping");
        }
        m->owned = q;
        m->cap_owned = nc;
    }
    m->owned[m->n_owned++] = p;
    return G5_OK;
}

static const rt_tensor *find_fmt(const rt_weights *w, char *name, size_t cap, const char *fmt,
                                 uint32_t il) {
    snprintf(name, cap, fmt, il);
    return rt_weights_find(w, name);
}

/* A matrix whose rows are ncols wide: checks the type, the width and (if nrows) the row count. */
static g5_status mat_of(const rt_rank *rk, const rt_tensor *t, const char *name, uint64_t ncols,
                        uint64_t nrows, rt_mat *out, g5_error *err) {
    if (!t) return g5_fail(err, G5_ERR_MODEL, "rank %u: tensor '%s' is missing", rk->r, name);
    g5_status st = quant_check_supported(t->type, err);
    if (st) {
        g5_error_prefix(err, "rank %u: tensor '%s'", rk->r, name);
        return st;
    }
    uint64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
    if (t->ne[0] != ncols || (nrows && rows != nrows))
        return g5_fail(err, G5_ERR_MODEL,
                       "rank %u: tensor '%s' has shape [%llu, %llu, %llu], expected rows of %llu "
                       "elements%s%llu",
                       rk->r, name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                       (unsigned long long)t->ne[2], (unsigned long long)ncols,
                       nrows ? " and row count " : "", (unsigned long long)nrows);
    if ((st = rt_mat_view(t->type, t->data, ncols, 0, rows, out, err))) {
        g5_error_prefix(err, "rank %u: tensor '%s'", rk->r, name);
        return st;
    }
    uint64_t total;
    if (g5_mul_u64(out->row_bytes, rows, &total) || total != t->nbytes)
        return g5_fail(err, G5_ERR_SIZE, "rank %u: tensor '%s': %llu bytes for %llu rows of %s",
                       rk->r, name, (unsigned long long)t->nbytes, (unsigned long long)rows,
                       quant_type_name(t->type));
    return G5_OK;
}

static g5_status need_mat(rt_rank *rk, const char *fmt, uint32_t il, uint64_t ncols, uint64_t nrows,
                          rt_mat *out, g5_error *err) {
    char name[128];
    const rt_tensor *t = find_fmt(rk->w, name, sizeof name, fmt, il);
    g5_status st = mat_of(rk, t, name, ncols, nrows, out, err);
    if (!st && ncols > rk->max_ncols) rk->max_ncols = ncols;
    return st;
}

/* A vector of n floats (norm weights, biases), dequantized into memory the model owns. */
static g5_status need_vec(rt_model *m, rt_rank *rk, const char *fmt, uint32_t il, uint64_t n,
                          float **out, g5_error *err) {
    char name[128];
    const rt_tensor *t = find_fmt(rk->w, name, sizeof name, fmt, il);
    rt_mat v;
    g5_status st = mat_of(rk, t, name, n, 1, &v, err);
    if (st) return st;
    float *f = malloc(n * sizeof(float));
    if (!f) return g5_fail(err, G5_ERR_NOMEM, "rank %u: %s", rk->r, name);
    if ((st = own(m, f, err))) return st;
    rt_mat_row(&v, 0, f);
    *out = f;
    return G5_OK;
}

/* A matrix the model may use where present with this shape and type (else *out zeroed). */
static void opt_mat(const rt_rank *rk, const char *fmt, uint32_t il, uint64_t ncols, uint64_t nrows, rt_mat *out) {
    char name[128];
    const rt_tensor *t = find_fmt(rk->w, name, sizeof name, fmt, il);
    g5_error e;
    memset(out, 0, sizeof *out);
    if (t && mat_of(rk, t, name, ncols, nrows, out, &e)) memset(out, 0, sizeof *out);
}

static int has_fmt(const rt_rank *rk, const char *fmt, uint32_t il) {
    char name[128];
    return find_fmt(rk->w, name, sizeof name, fmt, il) != NULL;
}

/* The vocabulary projection: split by rows evenly over the ranks, or whole on every rank (then
 * rank 0 writes it). */
static g5_status head_of(rt_model *m, rt_rank *rk, const char *fmt, uint32_t il, rt_head *out,
                         g5_error *err) {
    const uint32_t T = m->n_ranks, V = m->hp.n_vocab;
    char name[128];
    const rt_tensor *t = find_fmt(rk->w, name, sizeof name, fmt, il);
    if (!t) return g5_fail(err, G5_ERR_MODEL, "rank %u: tensor '%s' is missing", rk->r, name);
    uint64_t rows = t->ne[1];
    if (rows == V) {
        out->col0 = 0;
        out->write = rk->r == 0;
    } else if (rows * T == V) {
        out->col0 = (uint32_t)(rk->r * rows);
        out->write = 1;
    } else {
        return g5_fail(err, G5_ERR_SHARDING, "rank %u: '%s' has %llu vocabulary rows; expected %u or %u/%u",
                       rk->r, name, (unsigned long long)rows, V, V, T);
    }
    g5_status st = mat_of(rk, t, name, m->hp.n_embd, rows, &out->mat, err);
    if (!st && m->hp.n_embd > rk->max_ncols) rk->max_ncols = m->hp.n_embd;
    return st;
}

static g5_status setup_layer(rt_model *m, rt_rank *rk, uint32_t il, g5_error *err) {
    const glm5_hparams *hp = &m->hp;
    const uint64_t E = hp->n_embd, H_l = rk->H_l;
    rt_layer *L = &rk->layers[il];
    g5_status st;
    L->present = 1;
    L->dense = glm5_layer_is_dense(hp, il);
    L->nextn = glm5_layer_is_nextn(hp, il);
#define MAT(field, fmt, nc, nr) if ((st = need_mat(rk, fmt, il, nc, nr, &L->field, err))) return st
#define VEC(field, fmt, n) if ((st = need_vec(m, rk, fmt, il, n, &L->field, err))) return st
    VEC(attn_norm, "blk.%u.attn_norm.weight", E);
    VEC(q_a_norm, "blk.%u.attn_q_a_norm.weight", hp->q_lora);
    VEC(kv_a_norm, "blk.%u.attn_kv_a_norm.weight", hp->kv_lora);
    MAT(q_a, "blk.%u.attn_q_a.weight", E, hp->q_lora);
    MAT(q_b, "blk.%u.attn_q_b.weight", hp->q_lora, H_l * (hp->qk_nope + hp->qk_rope));
    MAT(kv_a, "blk.%u.attn_kv_a_mqa.weight", E, hp->kv_lora + hp->qk_rope);
    MAT(kv_b, "blk.%u.attn_kv_b.weight", hp->kv_lora, H_l * (hp->qk_nope + hp->v_head));
    opt_mat(rk, "blk.%u.attn_k_b.weight", il, hp->qk_nope, H_l * hp->kv_lora, &L->k_b);
    opt_mat(rk, "blk.%u.attn_v_b.weight", il, hp->kv_lora, H_l * hp->v_head, &L->v_b);
    MAT(o, "blk.%u.attn_output.weight", H_l * hp->v_head, E);
    /* NextN blocks run their own indexer; main layers per indexer.types */
    L->has_indexer = L->nextn ? 1 : hp->idx_full[il];
    if (L->has_indexer) {
        const uint64_t IH = hp->idx_n_head, ID = hp->idx_head_dim;
        MAT(idx_q_b, "blk.%u.indexer.attn_q_b.weight", hp->q_lora, IH * ID);
        MAT(idx_k, "blk.%u.indexer.attn_k.weight", E, ID);
        MAT(idx_proj, "blk.%u.indexer.proj.weight", E, IH);
        VEC(idx_k_norm, "blk.%u.indexer.k_norm.weight", ID);
        VEC(idx_k_norm_b, "blk.%u.indexer.k_norm.bias", ID);
    }
    VEC(ffn_norm, "blk.%u.ffn_norm.weight", E);
    if (L->dense) {
        MAT(ffn_gate, "blk.%u.ffn_gate.weight", E, rk->ff_l);
        MAT(ffn_up, "blk.%u.ffn_up.weight", E, rk->ff_l);
        MAT(ffn_down, "blk.%u.ffn_down.weight", rk->ff_l, E);
    } else {
        MAT(router, "blk.%u.ffn_gate_inp.weight", E, hp->n_expert);
        if (has_fmt(rk, "blk.%u.exp_probs_b.bias", il)) VEC(router_b, "blk.%u.exp_probs_b.bias", hp->n_expert);
        char name[128];
        const char *efmt[3] = {"blk.%u.ffn_gate_exps.weight", "blk.%u.ffn_up_exps.weight",
                               "blk.%u.ffn_down_exps.weight"};
        const rt_tensor **edst[3] = {&L->exp_gate, &L->exp_up, &L->exp_down};
        for (int k = 0; k < 3; k++) {
            const rt_tensor *t = find_fmt(rk->w, name, sizeof name, efmt[k], il);
            uint64_t nc = k == 2 ? rk->ffe_l : E, nr = k == 2 ? E : rk->ffe_l;
            rt_mat tmp;
            if ((st = mat_of(rk, t, name, nc, nr * rk->n_exp_l, &tmp, err))) return st;
            if (t->ne[2] != rk->n_exp_l || t->ne[1] != nr)
                return g5_fail(err, G5_ERR_MODEL, "rank %u: '%s' holds %llu experts of %llu rows, expected %u of %llu",
                               rk->r, name, (unsigned long long)t->ne[2], (unsigned long long)t->ne[1],
                               rk->n_exp_l, (unsigned long long)nr);
            if (nc > rk->max_ncols) rk->max_ncols = nc;
            *edst[k] = t;
        }
        if (hp->n_expert_shared) {
            const uint64_t full = (uint64_t)hp->n_ff_exp * hp->n_expert_shared;
            char nm[128];
            const rt_tensor *t = find_fmt(rk->w, nm, sizeof nm, "blk.%u.ffn_gate_shexp.weight", il);
            if (!t) return g5_fail(err, G5_ERR_MODEL, "rank %u: tensor '%s' is missing", rk->r, nm);
            L->sh_l = (uint32_t)t->ne[1];
            if (L->sh_l == full) {
                L->sh_contrib = rk->r == 0;
            } else if ((uint64_t)L->sh_l * m->n_ranks == full) {
                L->sh_contrib = 1;
            } else {
                return g5_fail(err, G5_ERR_SHARDING, "rank %u: '%s' has %u rows; expected %llu or %llu/%u",
                               rk->r, nm, L->sh_l, (unsigned long long)full, (unsigned long long)full,
                               m->n_ranks);
            }
            MAT(sh_gate, "blk.%u.ffn_gate_shexp.weight", E, L->sh_l);
            MAT(sh_up, "blk.%u.ffn_up_shexp.weight", E, L->sh_l);
            MAT(sh_down, "blk.%u.ffn_down_shexp.weight", L->sh_l, E);
            if (L->sh_l > rk->max_rows) rk->max_rows = L->sh_l;
        }
    }
    if (L->nextn) {
        VEC(enorm, "blk.%u.nextn.enorm.weight", E);
        VEC(hnorm, "blk.%u.nextn.hnorm.weight", E);
        VEC(shared_head_norm, "blk.%u.nextn.shared_head_norm.weight", E);
        char name[128];
        const rt_tensor *t = find_fmt(rk->w, name, sizeof name, "blk.%u.nextn.eh_proj.weight", il);
        if (!t) return g5_fail(err, G5_ERR_MODEL, "rank %u: tensor '%s' is missing", rk->r, name);
        const uint32_t T = m->n_ranks;
        if (t->ne[0] == 2 * E && t->ne[1] == E) L->eh_split = RT_SPLIT_NONE;
        else if (T > 1 && t->ne[0] * T == 2 * E && t->ne[1] == E) L->eh_split = RT_SPLIT_COLS;
        else if (T > 1 && t->ne[0] == 2 * E && t->ne[1] * T == E) L->eh_split = RT_SPLIT_ROWS;
        else
            return g5_fail(err, G5_ERR_SHARDING, "rank %u: '%s' has shape [%llu, %llu]", rk->r, name,
                           (unsigned long long)t->ne[0], (unsigned long long)t->ne[1]);
        if ((st = mat_of(rk, t, name, t->ne[0], t->ne[1], &L->eh_proj, err))) return st;
        if (t->ne[0] > rk->max_ncols) rk->max_ncols = t->ne[0];
        if (has_fmt(rk, "blk.%u.nextn.embed_tokens.weight", il))
            MAT(nextn_embed, "blk.%u.nextn.embed_tokens.weight", E, hp->n_vocab);
        if (has_fmt(rk, "blk.%u.nextn.shared_head_head.weight", il) &&
            (st = head_of(m, rk, "blk.%u.nextn.shared_head_head.weight", il, &L->nextn_head, err)))
            return st;
    }
#undef MAT
#undef VEC
    return G5_OK;
}

/* Local sizes from the first layer of each kind; setup_layer then checks every layer. */
static g5_status setup_rank(rt_model *m, rt_rank *rk, g5_error *err) {
    const glm5_hparams *hp = &m->hp;
    const uint32_t T = m->n_ranks;
    char name[128];
    const rt_tensor *t = find_fmt(rk->w, name, sizeof name, "blk.%u.attn_q_b.weight", 0);
    if (!t) return g5_fail(err, G5_ERR_MODEL, "rank %u: tensor '%s' is missing", rk->r, name);
    const uint64_t qw = hp->qk_nope + hp->qk_rope;
    if (t->ne[1] % qw || (t->ne[1] / qw) * T != hp->n_head)
        return g5_fail(err, G5_ERR_SHARDING, "rank %u: '%s' has %llu rows: not %u/%u heads of %llu",
                       rk->r, name, (unsigned long long)t->ne[1], hp->n_head, T, (unsigned long long)qw);
    rk->H_l = (uint32_t)(t->ne[1] / qw);
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        if (glm5_layer_is_dense(hp, il)) {
            if ((t = find_fmt(rk->w, name, sizeof name, "blk.%u.ffn_gate.weight", il))) {
                if (t->ne[1] * T != hp->n_ff)
                    return g5_fail(err, G5_ERR_SHARDING, "rank %u: '%s' has %llu rows, expected %u/%u",
                                   rk->r, name, (unsigned long long)t->ne[1], hp->n_ff, T);
                rk->ff_l = (uint32_t)t->ne[1];
            }
            break;
        }
    }
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        if (glm5_layer_is_dense(hp, il)) continue;
        if (!(t = find_fmt(rk->w, name, sizeof name, "blk.%u.ffn_gate_exps.weight", il)))
            return g5_fail(err, G5_ERR_MODEL, "rank %u: tensor '%s' is missing", rk->r, name);
        uint64_t rows = t->ne[1], ne = t->ne[2];
        if (ne == hp->n_expert && rows * T == hp->n_ff_exp) {
            rk->n_exp_l = hp->n_expert; /* rows of every expert split */
            rk->exp0 = 0;
        } else if (ne * T == hp->n_expert && rows == hp->n_ff_exp) {
            rk->n_exp_l = (uint32_t)ne; /* whole experts placed on ranks */
            rk->exp0 = rk->r * (uint32_t)ne;
        } else {
            return g5_fail(err, G5_ERR_SHARDING,
                           "rank %u: '%s' holds %llu experts of %llu rows: neither %u experts of "
                           "%u/%u rows nor %u/%u experts of %u rows",
                           rk->r, name, (unsigned long long)ne, (unsigned long long)rows,
                           hp->n_expert, hp->n_ff_exp, T, hp->n_expert, T, hp->n_ff_exp);
        }
        rk->ffe_l = (uint32_t)rows;
        break;
    }
    rk->max_rows = rk->ff_l > rk->ffe_l ? rk->ff_l : rk->ffe_l;
    g5_status st = need_mat(rk, "token_embd.weight%.0u", 0, hp->n_embd, hp->n_vocab, &rk->tok_embd, err);
    if (st) return st;
    if ((st = need_vec(m, rk, "output_norm.weight%.0u", 0, hp->n_embd, &rk->output_norm, err))) return st;
    if ((st = head_of(m, rk, "output.weight%.0u", 0, &rk->output, err))) return st;
    rk->layers = calloc(hp->n_layer, sizeof *rk->layers);
    if (!rk->layers) return g5_fail(err, G5_ERR_NOMEM, "layers");
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        if (glm5_layer_is_nextn(hp, il) && il != hp->n_layer_main) continue; /* only the first is run */
        if ((st = setup_layer(m, rk, il, err))) return st;
    }
    return G5_OK;
}

g5_status rt_model_create(const rt_wset *ws, const rt_model_opts *opts, rt_model **out,
                          g5_error *err) {
    *out = NULL;
    rt_model *m = calloc(1, sizeof *m);
    if (!m) return g5_fail(err, G5_ERR_NOMEM, "model");
    g5_status st = glm5_hparams_read(rt_wset_meta(ws), &m->hp, err);
    if (st) goto fail;
    m->ws = ws;
    m->n_ranks = rt_wset_n_ranks(ws);
    m->comm = opts ? opts->comm : NULL;
    if ((st = rt_comm_ranks(m->comm, m->n_ranks, &m->rank0, &m->n_local, err))) goto fail;
    for (uint32_t r = m->rank0; r < m->rank0 + m->n_local; r++)
        if (!rt_wset_rank(ws, r)) {
            st = g5_fail(err, G5_ERR_INVALID_ARG, "process %u of %u runs ranks %u..%u of %u, but rank %u is not open "
                         "in the weight set", rt_comm_rank(m->comm), rt_comm_size(m->comm), m->rank0,
                         m->rank0 + m->n_local - 1, m->n_ranks, r);
            goto fail;
        }
    m->mla = opts ? opts->mla : RT_MLA_ABSORBED;
    uint32_t nt = opts ? opts->n_threads : 0;
    if (nt == 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        nt = c > 0 ? (uint32_t)c : 1;
    }
    m->n_threads = nt;
    m->has_mtp = m->hp.n_nextn > 0;
    m->ranks = calloc(m->n_local, sizeof *m->ranks);
    if (!m->ranks) {
        st = g5_fail(err, G5_ERR_NOMEM, "model ranks");
        goto fail;
    }
    uint32_t per_rank = nt / m->n_local ? nt / m->n_local : 1;
    for (uint32_t i = 0; i < m->n_local; i++) {
        rt_rank *rk = &m->ranks[i];
        rk->r = m->rank0 + i;
        rk->w = rt_wset_rank(ws, rk->r);
        if ((st = setup_rank(m, rk, err))) goto fail;
        if ((st = rt_pool_create(per_rank, &rk->pool, err))) goto fail;
    }
    *out = m;
    return G5_OK;
fail:
    rt_model_free(m);
    return st;
}

void rt_model_free(rt_model *m) {
    if (!m) return;
    for (uint32_t i = 0; m->ranks && i < m->n_local; i++) {
        rt_pool_free(m->ranks[i].pool);
        free(m->ranks[i].layers);
    }
    free(m->ranks);
    for (uint64_t i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m);
}

const glm5_hparams *rt_model_hparams(const rt_model *m) { return &m->hp; }
uint32_t rt_model_n_ranks(const rt_model *m) { return m->n_ranks; }
uint32_t rt_model_rank_first(const rt_model *m) { return m->rank0; }
uint32_t rt_model_n_local(const rt_model *m) { return m->n_local; }
rt_comm *rt_model_comm(const rt_model *m) { return m->comm; }
uint32_t rt_model_n_threads(const rt_model *m) { return m->n_threads; }
void rt_model_set_mla(rt_model *m, rt_mla_mode mode) { m->mla = mode; }
int rt_model_has_mtp(const rt_model *m) { return m->has_mtp; }
const rt_wset *rt_model_wset(const rt_model *m) { return m->ws; }

g5_status rt_model_rank_tensors(const rt_model *m, uint32_t i, rt_rank_tensors *out, g5_error *err) {
    if (i >= m->n_local) return g5_fail(err, G5_ERR_INVALID_ARG, "local rank %u of %u", i, m->n_local);
    const rt_rank *rk = &m->ranks[i];
    *out = (rt_rank_tensors){.r = rk->r, .w = rk->w, .H_l = rk->H_l, .ff_l = rk->ff_l, .ffe_l = rk->ffe_l,
                             .n_exp_l = rk->n_exp_l, .exp0 = rk->exp0, .max_ncols = rk->max_ncols,
                             .max_rows = rk->max_rows, .tok_embd = rk->tok_embd, .output = rk->output,
                             .output_norm = rk->output_norm, .layers = rk->layers, .n_layers = m->hp.n_layer};
    return G5_OK;
}

/* ---- state ---- */

/* Tokens per block of the private pools of rt_state_create. */
#define RT_PRIVATE_BLOCK_TOKENS 64

g5_status rt_kvpool_for_layers(const rt_model *m, uint32_t il0, uint32_t il1, uint32_t n_blocks,
                               uint32_t block_tokens, rt_kvpool **out, g5_error *err) {
    const glm5_hparams *hp = &m->hp;
    uint8_t has_idx[GLM5_MAX_LAYERS];
    for (uint32_t il = il0; il < il1; il++) has_idx[il - il0] = (uint8_t)m->ranks[0].layers[il].has_indexer;
    rt_kvlayout lay = {.n_ranks = m->n_local, .il0 = il0, .n_layers = il1 - il0,
                       .kv_width = hp->kv_lora + hp->qk_rope, .idx_width = hp->idx_head_dim,
                       .has_idx = has_idx};
    g5_status st = rt_kvpool_create_layout(&lay, n_blocks, block_tokens, out, err);
    if (!st) (*out)->owner = m;
    return st;
}

g5_status rt_kvpool_create(const rt_model *m, uint32_t n_blocks, uint32_t block_tokens,
                           rt_kvpool **out, g5_error *err) {
    *out = NULL;
    if (n_blocks == 0 || block_tokens == 0)
        return g5_fail(err, G5_ERR_INVALID_ARG, "kv pool of %u blocks of %u tokens", n_blocks, block_tokens);
    return rt_kvpool_for_layers(m, 0, m->hp.n_layer_main, n_blocks, block_tokens, out, err);
}

static g5_status state_new(const rt_model *m, rt_kvpool *pool, rt_state **out, g5_error *err) {
    *out = NULL;
    if (pool && (pool->owner != m || pool->il0 != 0 || pool->nl != m->hp.n_layer_main))
        return g5_fail(err, G5_ERR_INVALID_ARG, "kv pool made for another model");
    rt_state *s = calloc(1, sizeof *s);
    if (!s) return g5_fail(err, G5_ERR_NOMEM, "decoding state");
    s->m = m;
    g5_status st = G5_OK;
    if (pool) {
        s->main.pool = pool;
    } else if (!(st = rt_kvpool_for_layers(m, 0, m->hp.n_layer_main, 0, RT_PRIVATE_BLOCK_TOKENS,
                                           &s->main.pool, err))) {
        s->main.own = 1;
    }
    if (!st && m->has_mtp &&
        !(st = rt_kvpool_for_layers(m, m->hp.n_layer_main, m->hp.n_layer_main + 1, 0,
                                    RT_PRIVATE_BLOCK_TOKENS, &s->mtp.pool, err)))
        s->mtp.own = 1;
    if (st) {
        rt_state_free(s);
        return st;
    }
    *out = s;
    return G5_OK;
}

g5_status rt_state_create(const rt_model *m, rt_state **out, g5_error *err) {
    return state_new(m, NULL, out, err);
}

g5_status rt_state_create_paged(const rt_model *m, rt_kvpool *pool, rt_state **out, g5_error *err) {
    if (!pool) {
        *out = NULL;
        return g5_fail(err, G5_ERR_INVALID_ARG, "paged state without a pool");
    }
    return state_new(m, pool, out, err);
}

void rt_state_free(rt_state *s) {
    if (!s) return;
    rt_kvtab_release(&s->main);
    rt_kvtab_release(&s->mtp);
    free(s);
}

void rt_state_reset(rt_state *s) {
    s->n_past = s->mtp_n_past = 0;
    rt_kvtab_shrink_blocks(&s->main, 0);
    if (s->mtp.pool) rt_kvtab_shrink_blocks(&s->mtp, 0);
}

uint32_t rt_state_n_past(const rt_state *s) { return s->n_past; }
uint32_t rt_state_mtp_n_past(const rt_state *s) { return s->mtp_n_past; }
uint32_t rt_state_n_blocks(const rt_state *s) { return s->main.n; }

g5_status rt_state_truncate(rt_state *s, uint32_t n_past, uint32_t mtp_n_past, g5_error *err) {
    if (n_past > s->n_past || mtp_n_past > s->mtp_n_past)
        return g5_fail(err, G5_ERR_INVALID_ARG, "truncate to %u/%u positions, state holds %u/%u",
                       n_past, mtp_n_past, s->n_past, s->mtp_n_past);
    s->n_past = n_past;
    s->mtp_n_past = mtp_n_past;
    rt_kvtab_shrink_blocks(&s->main, rt_kvtab_blocks_for(&s->main, n_past));
    if (s->mtp.pool) rt_kvtab_shrink_blocks(&s->mtp, rt_kvtab_blocks_for(&s->mtp, mtp_n_past));
    /* the next token is written into the partly kept block: it must not be a shared one */
    if (n_past % s->main.pool->bt) return rt_kvtab_unshare(&s->main, n_past / s->main.pool->bt, err);
    return G5_OK;
}

/* The prefix hashes of the first n_blocks blocks of tokens (malloc'ed), or NULL. */
static uint64_t *prefix_hashes(const rt_state *s, const int32_t *tokens, uint32_t n_blocks, g5_error *err) {
    uint64_t *h = malloc((n_blocks ? n_blocks : 1) * sizeof *h);
    if (!h) g5_fail(err, G5_ERR_NOMEM, "prefix hashes of %u blocks", n_blocks);
    else rt_kv_prefix_hashes(tokens, n_blocks, s->main.pool->bt, h);
    return h;
}

g5_status rt_state_attach_prefix(rt_state *s, const int32_t *tokens, uint32_t n, uint32_t *n_reused,
                                 g5_error *err) {
    *n_reused = 0;
    if (s->n_past || s->main.n || n < 2 || !s->main.pool->reg) return G5_OK;
    const uint32_t nb = (n - 1) / s->main.pool->bt;
    if (!nb) return G5_OK;
    uint64_t *h = prefix_hashes(s, tokens, nb, err);
    if (!h) return G5_ERR_NOMEM;
    uint32_t k = 0;
    g5_status st = rt_kvtab_attach(&s->main, h, nb, &k, err);
    free(h);
    if (st) return st;
    s->n_past = k * s->main.pool->bt;
    *n_reused = s->n_past;
    return G5_OK;
}

g5_status rt_state_publish_prefix(rt_state *s, const int32_t *tokens, g5_error *err) {
    if (!s->main.pool->reg) return G5_OK;
    const uint32_t nb = s->n_past / s->main.pool->bt;
    if (!nb) return G5_OK;
    uint64_t *h = prefix_hashes(s, tokens, nb, err);
    if (!h) return G5_ERR_NOMEM;
    rt_kvtab_publish(&s->main, h, nb);
    free(h);
    return G5_OK;
}

g5_status rt_kvpool_keep_hidden(rt_kvpool *p, g5_error *err) {
    const rt_model *m = p->owner;
    if (!m || p->il0 != 0 || p->nl != m->hp.n_layer_main)
        return g5_fail(err, G5_ERR_INVALID_ARG, "kv pool: hidden states kept only in a pool of a model's main layers");
    return rt_kvpool_keep_rows(p, m->hp.n_embd, err);
}

g5_status rt_state_hidden(const rt_state *s, uint32_t p0, uint32_t n, float *out, g5_error *err) {
    const uint32_t E = s->m->hp.n_embd;
    if (s->main.pool->hidw != E)
        return g5_fail(err, G5_ERR_UNSUPPORTED, "hidden states of positions %u..: the state's pool does not keep them", p0);
    if (p0 > s->n_past || n > s->n_past - p0)
        return g5_fail(err, G5_ERR_BOUNDS, "hidden states of positions %u + %u: the state holds %u", p0, n, s->n_past);
    for (uint32_t t = 0; t < n; t++) memcpy(out + (size_t)t * E, rt_kvtab_row(&s->main, p0 + t), E * sizeof(float));
    return G5_OK;
}

g5_status rt_state_reserve(rt_state *s, uint32_t n_tokens, g5_error *err) {
    return rt_kvtab_reserve(&s->main, n_tokens, err);
}

/* ---- per-call work buffers ---- */

typedef struct carve {
    uint8_t *base;
    size_t off;
} carve;

static void *take(carve *c, size_t bytes) {
    void *p = c->base ? c->base + c->off : NULL;
    c->off += (bytes + 63) & ~(size_t)63;
    return p;
}

/* Lays the buffers out (base NULL: only measures). */
static size_t work_layout(const rt_model *m, const rt_rank *rk, uint32_t n, uint32_t P,
                          uint8_t *base, rt_work *w) {
    const glm5_hparams *hp = &m->hp;
    const size_t E = hp->n_embd, H_l = rk->H_l, N = n, F = sizeof(float), I = sizeof(int32_t);
    carve c = {base, 0};
    w->x = take(&c, N * E * F);
    w->h = take(&c, N * E * F);
    w->part = take(&c, N * E * F);
    w->qr = take(&c, N * hp->q_lora * F);
    w->kv = take(&c, N * (hp->kv_lora + hp->qk_rope) * F);
    w->q = take(&c, N * H_l * (hp->qk_nope + hp->qk_rope) * F);
    w->qlat = take(&c, N * H_l * hp->kv_lora * F);
    w->olat = take(&c, N * H_l * hp->kv_lora * F);
    w->ao = take(&c, N * H_l * hp->v_head * F);
    w->iq = take(&c, N * hp->idx_n_head * hp->idx_head_dim * F);
    w->ik = take(&c, N * hp->idx_head_dim * F);
    w->iw = take(&c, N * hp->idx_n_head * F);
    w->sel = take(&c, N * hp->idx_top_k * I);
    w->n_sel = take(&c, N * I);
    w->rope = take(&c, N * hp->qk_rope * F);
    w->wuk = take(&c, (size_t)hp->qk_nope * hp->kv_lora * F);
    if (m->mla == RT_MLA_EXPANDED) {
        size_t np = P < N * hp->idx_top_k ? P : N * hp->idx_top_k;
        w->kvx = take(&c, np * H_l * (hp->qk_nope + hp->v_head) * F);
        w->latg = take(&c, np * hp->kv_lora * F);
        w->row_of = take(&c, (size_t)P * I);
    } else {
        w->kvx = w->latg = NULL;
        w->row_of = NULL;
    }
    size_t fr = rk->max_rows ? rk->max_rows : 1;
    w->ga = take(&c, N * fr * F);
    w->gb = take(&c, N * fr * F);
    w->xe = take(&c, N * E * F);
    w->ye = take(&c, N * E * F);
    w->moe = take(&c, N * E * F);
    w->rl = take(&c, N * hp->n_expert * F);
    w->choice = take(&c, hp->n_expert * F);
    w->allowed = take(&c, hp->n_expert);
    w->gscore = take(&c, hp->n_group * F);
    w->ch_e = take(&c, N * hp->n_expert_used * I);
    w->ch_w = take(&c, N * hp->n_expert_used * F);
    w->tok_list = take(&c, N * I);
    w->slot_list = take(&c, N * I);
    w->cat = take(&c, N * 2 * E * F);
    w->gath = take(&c, N * E * F);
    return c.off;
}

g5_status rt_work_alloc(const rt_model *m, rt_rank *rk, uint32_t n, uint32_t P, uint8_t **mem,
                        rt_work *w, g5_error *err) {
    size_t bytes = work_layout(m, rk, n, P, NULL, w);
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64))
        return g5_fail(err, G5_ERR_NOMEM, "rank %u: %zu bytes of work buffers for %u tokens", rk->r,
                       bytes, n);
    *mem = p;
    work_layout(m, rk, n, P, p, w);
    size_t scratch = rt_matmul_scratch(rk->max_ncols);
    size_t as = rt_attn_scratch(&m->hp, P);
    return rt_pool_reserve(rk->pool, scratch > as ? scratch : as, err);
}

/* The collectives between rank workers (rt_allreduce_add, rt_allgather_rows, ...) are in
 * model_comm.c. */

/* ---- FFN ---- */

static void swiglu(float *g, const float *u, size_t cnt) {
    for (size_t i = 0; i < cnt; i++) g[i] = rt_silu(g[i]) * u[i];
}

void rt_ffn_dense(rt_rank *rk, const rt_layer *L, rt_work *w, uint32_t n, uint32_t E) {
    rt_matmul(rk->pool, &L->ffn_gate, w->h, E, n, w->ga, rk->ff_l);
    rt_matmul(rk->pool, &L->ffn_up, w->h, E, n, w->gb, rk->ff_l);
    swiglu(w->ga, w->gb, (size_t)n * rk->ff_l);
    rt_matmul(rk->pool, &L->ffn_down, w->ga, rk->ff_l, n, w->part, E);
}

/* a scores better than b (ties to the lower index) */
static inline int better(const float *v, uint32_t a, uint32_t b) {
    return v[a] > v[b] || (v[a] == v[b] && a < b);
}

void rt_moe_route(const glm5_hparams *hp, float *logits, const float *bias, float *choice,
                  uint8_t *allowed, float *gscore, int32_t *ch, float *cw) {
    const uint32_t NE = hp->n_expert, U = hp->n_expert_used, G = hp->n_group;
    const uint32_t gs = NE / G;
    if (hp->expert_gating_func == 1) {
        float mx = -INFINITY;
        for (uint32_t e = 0; e < NE; e++) mx = logits[e] > mx ? logits[e] : mx;
        double sum = 0;
        for (uint32_t e = 0; e < NE; e++) sum += (logits[e] = expf(logits[e] - mx));
        for (uint32_t e = 0; e < NE; e++) logits[e] = (float)(logits[e] / sum);
    } else {
        for (uint32_t e = 0; e < NE; e++) logits[e] = rt_sigmoid(logits[e]);
    }
    for (uint32_t e = 0; e < NE; e++) choice[e] = logits[e] + (bias ? bias[e] : 0.0f);
    memset(allowed, 1, NE);
    if (G > 1 && hp->topk_group < G) {
        for (uint32_t g = 0; g < G; g++) {
            float b1 = -INFINITY, b2 = -INFINITY;
            for (uint32_t e = g * gs; e < (g + 1) * gs; e++) {
                if (choice[e] > b1) {
                    b2 = b1;
                    b1 = choice[e];
                } else if (choice[e] > b2) {
                    b2 = choice[e];
                }
            }
            gscore[g] = gs >= 2 ? b1 + b2 : b1;
        }
        memset(allowed, 0, NE);
        for (uint32_t k = 0; k < hp->topk_group; k++) {
            uint32_t best = UINT32_MAX;
            for (uint32_t g = 0; g < G; g++)
                if (!allowed[g * gs] && (best == UINT32_MAX || better(gscore, g, best))) best = g;
            memset(allowed + best * gs, 1, gs);
        }
    }
    for (uint32_t k = 0; k < U; k++) {
        uint32_t best = UINT32_MAX;
        for (uint32_t e = 0; e < NE; e++) {
            if (!allowed[e]) continue;
            if (best == UINT32_MAX || better(choice, e, best)) best = e;
        }
        ch[k] = (int32_t)best;
        allowed[best] = 0;
    }
    /* ascending expert order: the order their outputs are summed in */
    for (uint32_t i = 1; i < U; i++)
        for (uint32_t j = i; j > 0 && ch[j - 1] > ch[j]; j--) {
            int32_t t = ch[j];
            ch[j] = ch[j - 1];
            ch[j - 1] = t;
        }
    double sum = 0;
    for (uint32_t k = 0; k < U; k++) sum += (cw[k] = logits[ch[k]]);
    for (uint32_t k = 0; k < U; k++) {
        float v = cw[k];
        if (hp->expert_weights_norm) v = (float)(v / (sum + 1e-20));
        cw[k] = v * hp->expert_weights_scale;
    }
}

static void expert_mat(const rt_tensor *t, uint32_t e_l, uint64_t ncols, rt_mat *out) {
    uint64_t rows = t->ne[1];
    (void)rt_mat_view(t->type, t->data, ncols, (uint64_t)e_l * rows, rows, out, NULL); /* checked */
}

void rt_ffn_moe(rt_fwd *f, rt_rank *rk, const rt_layer *L, rt_work *w, uint32_t n) {
    rt_model *m = f->m;
    const glm5_hparams *hp = &m->hp;
    const uint32_t E = hp->n_embd, U = hp->n_expert_used, NE = hp->n_expert;
    /* routing is replicated: this rank's tokens, then exchanged */
    uint32_t a, b;
    rt_token_range(n, m->n_ranks, rk->r, &a, &b);
    rt_matmul(rk->pool, &L->router, w->h + (size_t)a * E, E, b - a, w->rl + (size_t)a * NE, NE);
    for (uint32_t t = a; t < b; t++)
        rt_moe_route(hp, w->rl + (size_t)t * NE, L->router_b, w->choice, w->allowed, w->gscore,
                     w->ch_e + (size_t)t * U, w->ch_w + (size_t)t * U);
    rt_allgather_rows(f, rk->r, w->ch_e, U * sizeof(int32_t), U * sizeof(int32_t));
    rt_allgather_rows(f, rk->r, w->ch_w, U * sizeof(float), U * sizeof(float));
    rt_ffn_experts(rk, L, w, n, hp);
}

void rt_ffn_experts(rt_rank *rk, const rt_layer *L, rt_work *w, uint32_t n, const glm5_hparams *hp) {
    const uint32_t E = hp->n_embd, U = hp->n_expert_used;
    memset(w->moe, 0, (size_t)n * E * sizeof(float));
    for (uint32_t el = 0; el < rk->n_exp_l; el++) {
        const int32_t e = (int32_t)(rk->exp0 + el);
        uint32_t cnt = 0;
        for (uint32_t t = 0; t < n; t++)
            for (uint32_t k = 0; k < U; k++)
                if (w->ch_e[(size_t)t * U + k] == e) {
                    w->tok_list[cnt] = (int32_t)t;
                    w->slot_list[cnt++] = (int32_t)k;
                }
        if (!cnt) continue;
        for (uint32_t i = 0; i < cnt; i++)
            memcpy(w->xe + (size_t)i * E, w->h + (size_t)w->tok_list[i] * E, E * sizeof(float));
        rt_mat g, u, d;
        expert_mat(L->exp_gate, el, E, &g);
        expert_mat(L->exp_up, el, E, &u);
        expert_mat(L->exp_down, el, rk->ffe_l, &d);
        rt_matmul(rk->pool, &g, w->xe, E, cnt, w->ga, rk->ffe_l);
        rt_matmul(rk->pool, &u, w->xe, E, cnt, w->gb, rk->ffe_l);
        swiglu(w->ga, w->gb, (size_t)cnt * rk->ffe_l);
        rt_matmul(rk->pool, &d, w->ga, rk->ffe_l, cnt, w->ye, E);
        for (uint32_t i = 0; i < cnt; i++) {
            const size_t t = (size_t)w->tok_list[i];
            rt_axpy(w->ch_w[t * U + (size_t)w->slot_list[i]], w->ye + (size_t)i * E, w->moe + t * E, E);
        }
    }
    if (hp->n_expert_shared && L->sh_contrib) {
        rt_matmul(rk->pool, &L->sh_gate, w->h, E, n, w->ga, L->sh_l);
        rt_matmul(rk->pool, &L->sh_up, w->h, E, n, w->gb, L->sh_l);
        swiglu(w->ga, w->gb, (size_t)n * L->sh_l);
        rt_matmul(rk->pool, &L->sh_down, w->ga, L->sh_l, n, w->part, E);
        for (size_t i = 0; i < (size_t)n * E; i++) w->part[i] = w->moe[i] + w->part[i];
    } else {
        memcpy(w->part, w->moe, (size_t)n * E * sizeof(float));
    }
}

/* ---- the rank workers ---- */

static void layer_forward(rt_fwd *f, rt_rank *rk, rt_work *w, uint32_t il) {
    const uint32_t n = f->n;
    rt_model *m = f->m;
    const uint32_t E = m->hp.n_embd;
    rt_layer *L = &rk->layers[il];
    rt_attn_layer(f, rk, L, NULL, w);
    rt_allreduce_add(f, rk, w, n);
    for (uint32_t t = 0; t < n; t++)
        rt_rmsnorm(w->x + (size_t)t * E, L->ffn_norm, E, m->hp.rms_eps, w->h + (size_t)t * E);
    if (L->dense)
        rt_ffn_dense(rk, L, w, n, E);
    else
        rt_ffn_moe(f, rk, L, w, n);
    rt_allreduce_add(f, rk, w, n);
}

/* Final-normed hidden states h [n][E] -> logits (all rows, or the last). */
static void project_vocab(rt_rank *rk, const rt_head *head, const float *h, uint32_t n, uint32_t E,
                          uint32_t V, float *logits, int all) {
    if (!logits || !head->write) return;
    if (all)
        rt_matmul(rk->pool, &head->mat, h, E, n, logits + head->col0, V);
    else
        rt_matmul(rk->pool, &head->mat, h + (size_t)(n - 1) * E, E, 1, logits + head->col0, V);
}

typedef struct rank_job {
    rt_fwd *f;
    rt_rank *rk;
    int mtp;
    const int32_t *tokens;
    const rt_outputs *out;       /* main pass */
    const float *hidden_in;      /* MTP pass */
    float *draft;
    int all;
    uint32_t P;
    g5_status st;
    g5_error err;
} rank_job;

static void *rank_main(void *arg) {
    rank_job *j = arg;
    rt_fwd *f = j->f;
    rt_model *m = f->m;
    rt_rank *rk = j->rk;
    const glm5_hparams *hp = &m->hp;
    const uint32_t n = f->n, E = hp->n_embd;
    uint8_t *mem = NULL;
    rt_work w;
    j->st = rt_work_alloc(m, rk, n, j->P, &mem, &w, &j->err);
    const size_t xb = rt_xchg_bytes(m, n);
    if (!j->st && xb && rk == m->ranks) { /* the exchange buffer, before any collective */
        f->xb = xb == SIZE_MAX ? NULL : malloc(xb);
        f->xcap = xb;
        if (!f->xb) j->st = g5_fail(&j->err, G5_ERR_NOMEM, "exchange buffer of %zu bytes for %u tokens", xb, n);
    }
    if (j->st) atomic_store(&f->failed, 1);
    if (m->n_local > 1) rt_barrier_wait(&f->bar);
    rt_agree_failed(f, rk);
    if (atomic_load(&f->failed)) {
        free(mem);
        return NULL;
    }
    for (uint32_t t = 0; t < n; t++)
        rt_rope_table(rt_fwd_pos(f, t), hp->qk_rope, hp->rope_theta, w.rope + (size_t)t * hp->qk_rope);

    if (!j->mtp) {
        const rt_outputs *o = j->out;
        for (uint32_t t = 0; t < n; t++) rt_mat_row(&rk->tok_embd, (uint64_t)j->tokens[t], w.x + (size_t)t * E);
        const int tr = rk == m->ranks && o; /* every rank holds the same: the first local one writes */
        if (tr && o->layer_hidden) memcpy(o->layer_hidden, w.x, (size_t)n * E * sizeof(float));
        for (uint32_t il = 0; il < hp->n_layer_main; il++) {
            layer_forward(f, rk, &w, il);
            if (tr && o->layer_hidden)
                memcpy(o->layer_hidden + (size_t)(il + 1) * n * E, w.x, (size_t)n * E * sizeof(float));
            if (tr && o->topk)
                memcpy(o->topk + (size_t)il * n * hp->idx_top_k, w.sel, (size_t)n * hp->idx_top_k * sizeof(int32_t));
        }
        for (uint32_t t = 0; t < n; t++)
            rt_rmsnorm(w.x + (size_t)t * E, rk->output_norm, E, hp->rms_eps, w.h + (size_t)t * E);
        if (tr && o->hidden) memcpy(o->hidden, w.h, (size_t)n * E * sizeof(float));
        if (rk == m->ranks) /* pools keeping hidden states (rt_kvpool_keep_hidden) get each row's */
            for (uint32_t t = 0; t < n; t++) {
                const rt_state *st = rt_fwd_state(f, t);
                if (st->main.pool->hidw)
                    memcpy(rt_kvtab_row(&st->main, rt_fwd_pos(f, t)), w.h + (size_t)t * E, E * sizeof(float));
            }
        if (o) {
            project_vocab(rk, &rk->output, w.h, n, E, hp->n_vocab, o->logits, o->all_logits);
            rt_gather_vocab(f, rk, &rk->output, o->logits, o->all_logits ? n : 1);
        }
    } else {
        const uint32_t il = hp->n_layer_main;
        rt_layer *L = &rk->layers[il];
        const rt_mat *emb = L->nextn_embed.data ? &L->nextn_embed : &rk->tok_embd;
        for (uint32_t t = 0; t < n; t++) {
            float *c = w.cat + (size_t)t * 2 * E;
            rt_mat_row(emb, (uint64_t)j->tokens[t], c);
            rt_rmsnorm(c, L->enorm, E, hp->rms_eps, c);
            rt_rmsnorm(j->hidden_in + (size_t)t * E, L->hnorm, E, hp->rms_eps, c + E);
        }
        const uint32_t T = m->n_ranks;
        if (L->eh_split == RT_SPLIT_NONE) {
            rt_matmul(rk->pool, &L->eh_proj, w.cat, 2 * E, n, w.x, E);
        } else if (L->eh_split == RT_SPLIT_COLS) {
            const size_t cols = L->eh_proj.ncols;
            rt_matmul(rk->pool, &L->eh_proj, w.cat + rk->r * cols, 2 * E, n, w.part, E);
            memset(w.x, 0, (size_t)n * E * sizeof(float));
            rt_allreduce_add(f, rk, &w, n);
        } else {
            const uint32_t rows = E / T;
            rt_matmul(rk->pool, &L->eh_proj, w.cat, 2 * E, n, w.gath + (size_t)rk->r * rows, E);
            rt_allgather_cols(f, rk, w.gath, n, rows, w.x);
        }
        layer_forward(f, rk, &w, il);
        for (uint32_t t = 0; t < n; t++)
            rt_rmsnorm(w.x + (size_t)t * E, L->shared_head_norm, E, hp->rms_eps, w.h + (size_t)t * E);
        const rt_head *head = L->nextn_head.mat.data ? &L->nextn_head : &rk->output;
        project_vocab(rk, head, w.h, n, E, hp->n_vocab, j->draft, j->all);
        rt_gather_vocab(f, rk, head, j->draft, j->all ? n : 1);
    }
    free(mem);
    return NULL;
}

/* Runs one rank job per local rank: the first on the calling thread (the one that talks to the
 * other processes), the others on their own threads. */
static g5_status run_ranks(rt_fwd *f, rank_job *proto, g5_error *err) {
    rt_model *m = f->m;
    const uint32_t T = m->n_local;
    rank_job *jobs = calloc(T, sizeof *jobs);
    pthread_t *th = calloc(T, sizeof *th);
    void **part = calloc(T, sizeof *part);
    if (!jobs || !th || !part) {
        free(jobs);
        free(th);
        free(part);
        return g5_fail(err, G5_ERR_NOMEM, "rank workers");
    }
    f->pub = part;
    atomic_init(&f->failed, 0);
    rt_barrier_init(&f->bar, T);
    uint32_t started = 1;
    g5_status st = G5_OK;
    for (uint32_t r = 0; r < T; r++) {
        jobs[r] = *proto;
        jobs[r].f = f;
        jobs[r].rk = &m->ranks[r];
    }
    for (uint32_t r = 1; r < T; r++) {
        if (pthread_create(&th[r], NULL, rank_main, &jobs[r])) {
            /* the started workers give up at their first barrier, which now counts only them
             * and rank 0 */
            atomic_store(&f->failed, 1);
            st = g5_fail(err, G5_ERR_INTERNAL, "cannot start the worker of rank %u", m->rank0 + r);
            rt_barrier_shrink(&f->bar, started);
            break;
        }
        started++;
    }
    rank_main(&jobs[0]);
    for (uint32_t r = 1; r < started; r++) pthread_join(th[r], NULL);
    rt_barrier_destroy(&f->bar);
    for (uint32_t r = 0; r < T && !st; r++)
        if (jobs[r].st) {
            st = jobs[r].st;
            if (err) *err = jobs[r].err;
        }
    if (!st && f->xst) {
        st = f->xst;
        if (err) *err = f->xerr;
    }
    free(f->xb);
    f->xb = NULL;
    free(jobs);
    free(th);
    free(part);
    return st;
}

static g5_status check_tokens(const rt_model *m, const int32_t *tokens, uint32_t n, g5_error *err) {
    for (uint32_t t = 0; t < n; t++)
        if (tokens[t] < 0 || (uint32_t)tokens[t] >= m->hp.n_vocab)
            return g5_fail(err, G5_ERR_INVALID_ARG, "token %d at index %u is outside the vocabulary (%u)",
                           tokens[t], t, m->hp.n_vocab);
    return G5_OK;
}

g5_status rt_model_forward(rt_model *m, rt_state *s, const int32_t *tokens, uint32_t n,
                           const rt_outputs *out, g5_error *err) {
    if (n == 0) return G5_OK;
    g5_status st = check_tokens(m, tokens, n, err);
    if (st) return st;
    if (s->m != m) return g5_fail(err, G5_ERR_INVALID_ARG, "state made for another model");
    if (s->n_past > UINT32_MAX - n) return g5_fail(err, G5_ERR_OVERFLOW, "position overflow");
    const uint32_t P = s->n_past + n, had = s->main.n;
    if ((st = rt_kvtab_reserve(&s->main, P, err))) return st;
    rt_fwd f = {.m = m, .s = s, .n = n, .pos0 = s->n_past};
    rank_job proto = {.mtp = 0, .tokens = tokens, .out = out, .P = P};
    if ((st = run_ranks(&f, &proto, err))) {
        rt_kvtab_shrink_blocks(&s->main, had);
        return st;
    }
    s->n_past = P;
    return G5_OK;
}

g5_status rt_model_forward_batch(rt_model *m, rt_state *const *states, const int32_t *tokens,
                                 uint32_t n_seq, float *logits, g5_error *err) {
    if (n_seq == 0) return G5_OK;
    uint32_t *ones = malloc((size_t)n_seq * sizeof *ones);
    if (!ones) return g5_fail(err, G5_ERR_NOMEM, "batch of %u", n_seq);
    for (uint32_t i = 0; i < n_seq; i++) ones[i] = 1;
    const rt_outputs o = {.logits = logits, .all_logits = 1};
    g5_status st = rt_model_forward_rows(m, states, ones, n_seq, tokens, &o, err);
    free(ones);
    return st;
}

/* Undoes the first n_done sequences of a failed rows call: positions and cache blocks back. */
static void rows_undo(rt_state *const *states, const uint32_t *n_tok, const uint32_t *had, uint32_t n_done,
                      int advanced) {
    for (uint32_t i = 0; i < n_done; i++) {
        if (advanced) states[i]->n_past -= n_tok[i];
        rt_kvtab_shrink_blocks(&states[i]->main, had[i]);
    }
}

g5_status rt_model_forward_rows(rt_model *m, rt_state *const *states, const uint32_t *n_tok, uint32_t n_seq,
                                const int32_t *tokens, const rt_outputs *out, g5_error *err) {
    if (n_seq == 0) return G5_OK;
    uint64_t rows64 = 0;
    for (uint32_t i = 0; i < n_seq; i++) {
        if (!n_tok[i]) return g5_fail(err, G5_ERR_INVALID_ARG, "batch row group %u: no tokens", i);
        rows64 += n_tok[i];
    }
    if (rows64 > UINT32_MAX / 2) return g5_fail(err, G5_ERR_OVERFLOW, "batch of %llu rows", (unsigned long long)rows64);
    const uint32_t rows = (uint32_t)rows64;
    g5_status st = check_tokens(m, tokens, rows, err);
    if (st) return st;
    uint32_t P = 0;
    for (uint32_t i = 0; i < n_seq; i++) {
        const rt_state *s = states[i];
        if (!s || s->m != m) return g5_fail(err, G5_ERR_INVALID_ARG, "batch row %u: no state, or one of another model", i);
        for (uint32_t j = 0; j < i; j++)
            if (states[j] == s) return g5_fail(err, G5_ERR_INVALID_ARG, "batch rows %u and %u share a state", j, i);
        if (s->n_past > UINT32_MAX - n_tok[i]) return g5_fail(err, G5_ERR_OVERFLOW, "position overflow");
        if (s->n_past + n_tok[i] > P) P = s->n_past + n_tok[i];
    }
    const uint32_t V = m->hp.n_vocab, E = m->hp.n_embd;
    float *lg = out ? out->logits : NULL, *hid = out ? out->hidden : NULL;
    uint32_t *had = malloc((size_t)n_seq * sizeof *had);
    if (!had) return g5_fail(err, G5_ERR_NOMEM, "batch of %u", n_seq);
    if (m->mla == RT_MLA_EXPANDED) {
        /* the expanded form gathers keys by position within one sequence: one call each (the
         * same arithmetic per row, so the same bits) */
        uint32_t done = 0, r0 = 0;
        for (; done < n_seq && !st; done++) {
            rt_outputs o = {.logits = lg ? lg + (size_t)r0 * V : NULL, .all_logits = 1,
                            .hidden = hid ? hid + (size_t)r0 * E : NULL};
            had[done] = states[done]->main.n;
            st = rt_model_forward(m, states[done], tokens + r0, n_tok[done], &o, err);
            r0 += n_tok[done];
        }
        if (st) rows_undo(states, n_tok, had, done - 1, 1); /* all or nothing: undo the calls that ran */
        free(had);
        return st;
    }
    rt_state **ss = malloc((size_t)rows * sizeof *ss);
    uint32_t *pos = malloc((size_t)rows * sizeof *pos);
    if (!ss || !pos) {
        free(had);
        free(ss);
        free(pos);
        return g5_fail(err, G5_ERR_NOMEM, "batch of %u rows", rows);
    }
    uint32_t nres = 0;
    for (uint32_t r = 0; nres < n_seq; nres++) {
        rt_state *s = states[nres];
        had[nres] = s->main.n;
        for (uint32_t t = 0; t < n_tok[nres]; t++, r++) {
            ss[r] = s;
            pos[r] = s->n_past + t;
        }
        if ((st = rt_kvtab_reserve(&s->main, (uint64_t)s->n_past + n_tok[nres], err))) {
            g5_error_prefix(err, "batch row %u", nres);
            break;
        }
    }
    if (!st) {
        /* rows of one state at consecutive positions: every row's cache entry is written before
         * any row attends, and each row sees the positions up to its own, as in a prefill */
        rt_fwd f = {.m = m, .s = NULL, .n = rows, .pos0 = 0, .ss = ss, .pos = pos};
        rt_outputs o = {.logits = lg, .all_logits = 1, .hidden = hid};
        rank_job proto = {.mtp = 0, .tokens = tokens, .out = &o, .P = P};
        st = run_ranks(&f, &proto, err);
    }
    if (st) {
        rows_undo(states, n_tok, had, st && nres < n_seq ? nres + 1 : nres, 0);
    } else {
        for (uint32_t i = 0; i < n_seq; i++) states[i]->n_past += n_tok[i];
    }
    free(had);
    free(ss);
    free(pos);
    return st;
}

g5_status rt_model_mtp(rt_model *m, rt_state *s, const float *hidden, const int32_t *next_tokens,
                       uint32_t n, float *draft_logits, int all_logits, g5_error *err) {
    if (!m->has_mtp) return g5_fail(err, G5_ERR_UNSUPPORTED, "the model has no NextN/MTP block");
    if (n == 0) return G5_OK;
    g5_status st = check_tokens(m, next_tokens, n, err);
    if (st) return st;
    if (s->m != m) return g5_fail(err, G5_ERR_INVALID_ARG, "state made for another model");
    if (s->mtp_n_past > UINT32_MAX - n) return g5_fail(err, G5_ERR_OVERFLOW, "position overflow");
    const uint32_t P = s->mtp_n_past + n, had = s->mtp.n;
    if ((st = rt_kvtab_reserve(&s->mtp, P, err))) return st;
    rt_fwd f = {.m = m, .s = s, .n = n, .pos0 = s->mtp_n_past};
    rank_job proto = {.mtp = 1, .tokens = next_tokens, .hidden_in = hidden, .draft = draft_logits,
                      .all = all_logits, .P = P};
    if ((st = run_ranks(&f, &proto, err))) {
        rt_kvtab_shrink_blocks(&s->mtp, had);
        return st;
    }
    s->mtp_n_past = P;
    return G5_OK;
}
