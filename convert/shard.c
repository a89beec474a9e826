#include "convert/shard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/blob.h"
#include "format/quant.h"

#define MAX_TP 4096u

const char *shard_rule_name(shard_rule r) {
    switch (r) {
    case SHARD_REPLICATE: return "replicated";
    case SHARD_ROWS: return "rows";
    case SHARD_COLS: return "cols";
    case SHARD_EXPERT_ROWS: return "expert-rows";
    case SHARD_EXPERT_COLS: return "expert-cols";
    case SHARD_EXPERTS: return "experts";
    case SHARD_KV_B: return "kv_b-heads";
    case SHARD_HEADS: return "heads";
    default: return "?";
    }
}

/* The rule for a role, and why (specs/sharding.md). */
static shard_rule role_rule(glm5_role r, int ep, const char **why) {
    switch (r) {
    case GLM5_ROLE_ATTN_Q_B: *why = "heads"; return SHARD_ROWS;
    case GLM5_ROLE_ATTN_KV_B: *why = "heads"; return SHARD_ROWS;
    case GLM5_ROLE_ATTN_K_B: case GLM5_ROLE_ATTN_V_B: *why = "heads (carried, unread)"; return SHARD_HEADS;
    case GLM5_ROLE_OUTPUT: *why = "vocabulary"; return SHARD_ROWS;
    case GLM5_ROLE_NEXTN_HEAD: *why = "vocabulary"; return SHARD_ROWS;
    case GLM5_ROLE_FFN_GATE: case GLM5_ROLE_FFN_UP: *why = "FFN rows"; return SHARD_ROWS;
    case GLM5_ROLE_SHEXP_GATE: case GLM5_ROLE_SHEXP_UP: *why = "shared-expert rows"; return SHARD_ROWS;
    case GLM5_ROLE_ATTN_OUT: *why = "input = heads x v_head"; return SHARD_COLS;
    case GLM5_ROLE_FFN_DOWN: *why = "input = FFN rows"; return SHARD_COLS;
    case GLM5_ROLE_SHEXP_DOWN: *why = "input = shared-expert rows"; return SHARD_COLS;
    case GLM5_ROLE_EXP_GATE: case GLM5_ROLE_EXP_UP:
        *why = ep ? "whole experts (--ep)" : "rows of every expert";
        return ep ? SHARD_EXPERTS : SHARD_EXPERT_ROWS;
    case GLM5_ROLE_EXP_DOWN:
        *why = ep ? "whole experts (--ep)" : "input of every expert";
        return ep ? SHARD_EXPERTS : SHARD_EXPERT_COLS;
    case GLM5_ROLE_TOKEN_EMBD: *why = "embedding lookup"; return SHARD_REPLICATE;
    case GLM5_ROLE_ATTN_Q_A: case GLM5_ROLE_ATTN_KV_A: *why = "shared latent projection"; return SHARD_REPLICATE;
    case GLM5_ROLE_IDX_Q_B: case GLM5_ROLE_IDX_K: case GLM5_ROLE_IDX_K_NORM:
    case GLM5_ROLE_IDX_K_NORM_BIAS: case GLM5_ROLE_IDX_PROJ: *why = "indexer (all heads per rank)"; return SHARD_REPLICATE;
    case GLM5_ROLE_ROUTER: case GLM5_ROLE_ROUTER_BIAS: *why = "router"; return SHARD_REPLICATE;
    case GLM5_ROLE_NEXTN_EH_PROJ: *why = "NextN projection (small, replicated)"; return SHARD_REPLICATE;
    case GLM5_ROLE_NEXTN_EMBED: *why = "embedding lookup"; return SHARD_REPLICATE;
    default: *why = "norm"; return SHARD_REPLICATE;
    }
}

static uint32_t rule_axis(shard_rule r) {
    switch (r) {
    case SHARD_ROWS: case SHARD_EXPERT_ROWS: case SHARD_KV_B: return 1;
    case SHARD_COLS: case SHARD_EXPERT_COLS: return 0;
    case SHARD_EXPERTS: case SHARD_HEADS: return 2;
    default: return BLOB_AXIS_NONE;
    }
}

typedef struct src_ref {
    int64_t idx;
    uint32_t split;
    uint64_t off;
} src_ref;

static int cmp_src(const void *a, const void *b) {
    const src_ref *x = a, *y = b;
    if (x->split != y->split) return x->split < y->split ? -1 : 1;
    if (x->off != y->off) return x->off < y->off ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

void shard_plan_free(shard_plan *p) {
    if (!p) return;
    free(p->tensors);
    free(p);
}

static void fmt_shape(const uint64_t ne[4], uint32_t nd, char *buf, size_t cap) {
    int n = snprintf(buf, cap, "{");
    for (uint32_t d = 0; d < nd && n > 0 && (size_t)n < cap; d++)
        n += snprintf(buf + n, cap - (size_t)n, "%s%llu", d ? ", " : "", (unsigned long long)ne[d]);
    if (n > 0 && (size_t)n < cap) snprintf(buf + n, cap - (size_t)n, "}");
}

/* Checks a split and fills local shape/sizes. Returns 0 or a refusal message in msg. */
static int check_split(const shard_plan *p, shard_tensor *t, const gguf_tensor *g, char *msg, size_t cap) {
    const uint32_t T = p->tp;
    const quant_type_info *qi = quant_type_get(t->type);
    const uint32_t blk = qi ? qi->block_elems : 1;
    memcpy(t->ne_local, t->ne_global, sizeof t->ne_local);
    t->axis = rule_axis(t->rule);
    t->split_count = t->axis == BLOB_AXIS_NONE ? 1 : T;
    if (t->axis != BLOB_AXIS_NONE) {
        const uint64_t n = t->ne_global[t->axis];
        uint64_t unit = 1; /* the axis must split into whole units (heads, experts) */
        const char *unit_name = "rows";
        if (t->rule == SHARD_ROWS && (t->role == GLM5_ROLE_ATTN_Q_B || t->role == GLM5_ROLE_ATTN_KV_B)) {
            unit = t->ne_global[1] / p->hp.n_head;
            unit_name = "heads";
        } else if (t->rule == SHARD_KV_B) {
            unit = (uint64_t)p->hp.qk_nope + p->hp.v_head;
            unit_name = "heads";
        } else if (t->role == GLM5_ROLE_ATTN_OUT) {
            unit = p->hp.v_head;
            unit_name = "heads";
        } else if (t->rule == SHARD_EXPERTS) {
            unit_name = "experts";
        } else if (t->rule == SHARD_HEADS) {
            unit_name = "heads";
        } else if (t->role == GLM5_ROLE_OUTPUT || t->role == GLM5_ROLE_NEXTN_HEAD) {
            unit_name = "vocabulary rows";
        } else if (t->axis == 0) {
            unit_name = "columns";
        }
        if (unit == 0 || n % unit || (n / unit) % T) {
            snprintf(msg, cap, "tensor '%s' (%s): %llu %s along ne[%u] do not divide among %u ranks",
                     t->name, quant_type_name(t->type), (unsigned long long)(unit ? n / unit : 0), unit_name,
                     t->axis, T);
            return 1;
        }
        t->ne_local[t->axis] = n / T;
        if (t->axis == 0 && t->ne_local[0] % blk) {
            snprintf(msg, cap,
                     "tensor '%s' (%s, block size %u): splitting ne[0] = %llu %u ways gives slices of %llu "
                     "columns, not a multiple of the %u-element block (never requantized silently)",
                     t->name, qi ? qi->name : "?", blk, (unsigned long long)n, T,
                     (unsigned long long)t->ne_local[0], blk);
            return 1;
        }
    }
    if (t->rule == SHARD_KV_B) {
        if (quant_row_bytes(t->type, t->ne_local[0], &t->row_bytes)) {
            snprintf(msg, cap, "tensor '%s': kv_lora %llu is not a multiple of %s's block of %u", t->name,
                     (unsigned long long)t->ne_local[0], quant_type_name(t->type), blk);
            return 1;
        }
        t->n_rows = t->ne_local[1];
        t->period = t->n_rows;
        t->local_bytes = t->row_bytes * t->n_rows;
        return 0;
    }
    if (quant_row_bytes(t->type, t->ne_global[0], &t->row_bytes)) {
        snprintf(msg, cap, "tensor '%s': ne[0] %llu is not a multiple of %s's block", t->name,
                 (unsigned long long)t->ne_global[0], quant_type_name(t->type));
        return 1;
    }
    t->n_rows = t->ne_global[1] * t->ne_global[2] * t->ne_global[3];
    t->period = t->rule == SHARD_EXPERT_ROWS ? t->ne_global[1] : t->n_rows;
    uint64_t lb = 0;
    if (quant_row_bytes(t->type, t->ne_local[0], &lb)) lb = 0;
    t->local_bytes = lb * t->ne_local[1] * t->ne_local[2] * t->ne_local[3];
    (void)g;
    return 0;
}

/* Checks t's split (the first refusal into msg) and gives it the next 4096-aligned data offset. */
static void plan_place(const shard_plan *p, shard_tensor *t, const gguf_tensor *g, uint64_t *off, char *msg,
                       size_t cap, uint64_t *n_refused) {
    char m[768];
    if (check_split(p, t, g, m, sizeof m)) {
        if (++*n_refused == 1) snprintf(msg, cap, "%s", m);
    }
    *off = (*off + BLOB_DATA_ALIGN - 1) / BLOB_DATA_ALIGN * BLOB_DATA_ALIGN;
    t->data_offset = *off;
    *off += t->local_bytes;
}

/* The whole plan for one T; msg receives the first refusal, *n_refused how many tensors. */
static g5_status plan_core(const gguf_ctx *src, const shard_options *opt, shard_plan **out,
                           char *msg, size_t cap, uint64_t *n_refused, g5_error *err) {
    *out = NULL;
    *n_refused = 0;
    msg[0] = 0;
    g5_status st;
    shard_plan *p = calloc(1, sizeof *p);
    if (!p) return g5_fail(err, G5_ERR_NOMEM, "plan");
    p->tp = opt->tp;
    p->ep = opt->ep;
    p->kv_b_type = opt->kv_b_type;
    p->no_pair = opt->no_pair;
    /* the runtime's own validation: convert writes nothing glm5-run would refuse */
    if ((st = glm5_model_validate(src, &p->hp, err))) goto fail;
    const glm5_hparams *hp = &p->hp;
    const int64_t n = gguf_get_n_tensors(src);
    p->n_src_tensors = (uint64_t)n;
    src_ref *ord = calloc(n ? (size_t)n : 1, sizeof *ord);
    /* every source tensor at most once, plus one derived kv_b per layer */
    p->tensors = calloc((size_t)n + hp->n_layer + 1, sizeof *p->tensors);
    int64_t *kb = calloc(hp->n_layer, sizeof *kb), *vb = calloc(hp->n_layer, sizeof *vb);
    uint8_t *has_kvb = calloc(hp->n_layer, 1);
    if (!ord || !p->tensors || !kb || !vb || !has_kvb) {
        free(ord); free(kb); free(vb); free(has_kvb);
        st = g5_fail(err, G5_ERR_NOMEM, "plan");
        goto fail;
    }
    for (uint32_t l = 0; l < hp->n_layer; l++) kb[l] = vb[l] = -1;
    for (int64_t i = 0; i < n; i++) {
        const gguf_tensor *g = gguf_get_tensor(src, i);
        ord[i] = (src_ref){i, g->split, g->file_offset};
    }
    qsort(ord, (size_t)n, sizeof *ord, cmp_src);

    /* Every tensor must be a glm-dsa tensor of the expected shape. */
    for (int64_t k = 0; k < n && !st; k++) {
        const gguf_tensor *g = gguf_get_tensor(src, ord[k].idx);
        glm5_tensor_spec spec;
        if (glm5_spec_for(hp, g->name, &spec) != G5_OK) {
            st = g5_fail(err, G5_ERR_MODEL, "tensor '%s' is not part of a glm-dsa model with these hyperparameters",
                         g->name);
            break;
        }
        if (memcmp(spec.ne, g->ne, sizeof spec.ne) != 0) {
            char a[96], b[96];
            fmt_shape(g->ne, 4, a, sizeof a);
            fmt_shape(spec.ne, 4, b, sizeof b);
            st = g5_fail(err, G5_ERR_MODEL, "tensor '%s': shape %s, expected %s", g->name, a, b);
            break;
        }
        if (spec.role == GLM5_ROLE_ATTN_K_B) kb[spec.layer] = ord[k].idx;
        if (spec.role == GLM5_ROLE_ATTN_V_B) vb[spec.layer] = ord[k].idx;
        if (spec.role == GLM5_ROLE_ATTN_KV_B) has_kvb[spec.layer] = 1;
    }
    /* Every required tensor present. */
    for (uint64_t i = 0, ne = glm5_n_expected(hp); i < ne && !st; i++) {
        glm5_tensor_spec spec;
        if (glm5_expected_tensor(hp, i, &spec)) continue;
        if (spec.optional) continue;
        int l = spec.layer;
        if ((spec.role == GLM5_ROLE_ATTN_K_B || spec.role == GLM5_ROLE_ATTN_V_B) && l >= 0 && has_kvb[l]) {
            if (kb[l] >= 0 || vb[l] >= 0)
                st = g5_fail(err, G5_ERR_MODEL, "layer %d holds attn_kv_b and attn_k_b/attn_v_b; ambiguous", l);
            continue;
        }
        if (!gguf_find_tensor(src, spec.name))
            st = g5_fail(err, G5_ERR_MODEL, "tensor '%s' is missing from the model", spec.name);
    }
    if (st) {
        free(ord); free(kb); free(vb); free(has_kvb);
        goto fail;
    }

    uint64_t nt = 0, off = 0;
    for (int64_t k = 0; k < n; k++) {
        const gguf_tensor *g = gguf_get_tensor(src, ord[k].idx);
        int32_t layer;
        glm5_role role = glm5_classify(g->name, &layer);
        if (layer >= 0 && glm5_role_is_indexer(role) && !glm5_layer_has_indexer(hp, (uint32_t)layer)) {
            p->src_dropped++; /* not read: it is not part of the model */
            p->src_unused++;
            p->src_unused_bytes += g->nbytes;
            continue;
        }
        p->src_tensor_bytes += g->nbytes;
        shard_tensor *t = &p->tensors[nt];
        memset(t, 0, sizeof *t);
        t->src = ord[k].idx;
        t->src_k_b = t->src_v_b = -1;
        t->layer = layer;
        const int pair = role == GLM5_ROLE_ATTN_K_B || role == GLM5_ROLE_ATTN_V_B;
        if (pair && p->no_pair) {
            p->src_dropped++;
        } else {
            snprintf(t->name, sizeof t->name, "%s", g->name);
            t->role = role;
            t->rule = role_rule(role, p->ep, &t->why);
            t->type = g->type;
            t->n_dims = g->n_dims;
            memcpy(t->ne_global, g->ne, sizeof t->ne_global);
            t->src_bytes = g->nbytes;
            plan_place(p, t, g, &off, msg, cap, n_refused);
            nt++;
        }
        if (!pair) continue;
        /* kv_b follows the later of the pair */
        const int64_t other = role == GLM5_ROLE_ATTN_K_B ? vb[layer] : kb[layer];
        int later = 0;
        for (int64_t j = 0; j < k; j++)
            if (ord[j].idx == other) later = 1;
        if (!later) continue;
        const gguf_tensor *k_b = gguf_get_tensor(src, kb[layer]);
        const gguf_tensor *v_b = gguf_get_tensor(src, vb[layer]);
        if ((st = quant_check_supported(k_b->type, err)) || (st = quant_check_supported(v_b->type, err))) {
            g5_error_prefix(err, "kv_b of layer %d needs dequantized attn_k_b/attn_v_b", layer);
            break;
        }
        t = &p->tensors[nt];
        memset(t, 0, sizeof *t);
        snprintf(t->name, sizeof t->name, "blk.%d.attn_kv_b.weight", (int)layer);
        t->layer = layer;
        t->role = GLM5_ROLE_ATTN_KV_B;
        t->rule = SHARD_KV_B;
        t->why = "heads (rebuilt from attn_k_b + attn_v_b)";
        t->type = p->kv_b_type;
        t->n_dims = 2;
        t->ne_global[0] = hp->kv_lora;
        t->ne_global[1] = (uint64_t)hp->n_head * (hp->qk_nope + hp->v_head);
        t->ne_global[2] = t->ne_global[3] = 1;
        t->src = -1;
        t->src_k_b = kb[layer];
        t->src_v_b = vb[layer];
        t->src_bytes = k_b->nbytes + v_b->nbytes; /* read again for the rebuild */
        plan_place(p, t, NULL, &off, msg, cap, n_refused);
        nt++;
    }
    free(ord); free(kb); free(vb); free(has_kvb);
    if (st) goto fail;
    p->n_tensors = nt;
    p->data_size = off;
    *out = p;
    return G5_OK;
fail:
    shard_plan_free(p);
    return st;
}

static int kv_b_type_ok(uint32_t t) {
    return t == QT_F32 || t == QT_F16 || t == QT_BF16 || t == QT_Q8_0;
}

void shard_working_tp(const gguf_ctx *src, uint32_t kv_b_type, uint32_t max_tp, uint64_t *tp_mask,
                      uint64_t *ep_mask) {
    *tp_mask = *ep_mask = 0;
    if (max_tp > 64) max_tp = 64;
    for (uint32_t t = 1; t <= max_tp; t++)
        for (int ep = 0; ep < 2; ep++) {
            shard_options o = {t, ep, kv_b_type, 0};
            shard_plan *p;
            char msg[8];
            uint64_t nr;
            if (plan_core(src, &o, &p, msg, sizeof msg, &nr, NULL) == G5_OK && nr == 0)
                *(ep ? ep_mask : tp_mask) |= 1ull << (t - 1);
            shard_plan_free(p);
        }
}

static void list_mask(uint64_t m, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = 0;
    for (int t = 0; t < 64 && n < cap; t++)
        if (m >> t & 1) n += (size_t)snprintf(buf + n, cap - n, "%s%d", n ? ", " : "", t + 1);
}

g5_status shard_plan_build(const gguf_ctx *src, const shard_options *opt, shard_plan **out, g5_error *err) {
    *out = NULL;
    if (opt->tp < 1 || opt->tp > MAX_TP)
        return g5_fail(err, G5_ERR_INVALID_ARG, "tensor-parallel degree %u (must be 1..%u)", opt->tp, MAX_TP);
    if (!kv_b_type_ok(opt->kv_b_type))
        return g5_fail(err, G5_ERR_INVALID_ARG, "kv_b type %s: must be f32, bf16, f16 or q8_0",
                       quant_type_name(opt->kv_b_type));
    char msg[768];
    uint64_t nr;
    shard_plan *p;
    g5_status st = plan_core(src, opt, &p, msg, sizeof msg, &nr, err);
    if (st) return st;
    if (nr == 0) {
        *out = p;
        return G5_OK;
    }
    shard_plan_free(p);
    /* Say what would work. */
    uint64_t tpm, epm;
    uint32_t lim = opt->tp > 16 ? opt->tp : 16;
    shard_working_tp(src, opt->kv_b_type, lim, &tpm, &epm);
    char a[256], b[256], more[64] = "";
    list_mask(tpm, a, sizeof a);
    list_mask(epm, b, sizeof b);
    if (nr > 1) snprintf(more, sizeof more, " (%llu tensors refused in all)", (unsigned long long)nr);
    const int ep_here = (epm >> (opt->tp - 1)) & 1;
    return g5_fail(err, G5_ERR_SHARDING,
                   "cannot shard at T = %u%s: %s%s. Would work: %swithout --ep T in {%s}; with --ep T in {%s} "
                   "(checked T <= %u)",
                   opt->tp, opt->ep ? " with --ep" : "", msg, more, ep_here && !opt->ep ? "--ep at this T; " : "",
                   a[0] ? a : "none", b[0] ? b : "none", lim);
}

void shard_select(const shard_plan *p, const shard_tensor *t, uint32_t rank, shard_sel *s) {
    const uint32_t T = p->tp;
    s->lo = 0;
    s->hi = t->period;
    s->b0 = 0;
    s->b1 = t->row_bytes;
    switch (t->rule) {
    case SHARD_ROWS: case SHARD_EXPERT_ROWS: case SHARD_KV_B:
        s->lo = t->period / T * rank;
        s->hi = s->lo + t->period / T;
        break;
    case SHARD_EXPERTS: case SHARD_HEADS: {
        const uint64_t per = t->ne_global[1] * (t->ne_global[2] / T);
        s->lo = per * rank;
        s->hi = s->lo + per;
        break;
    }
    case SHARD_COLS: case SHARD_EXPERT_COLS:
        s->b0 = t->row_bytes / T * rank;
        s->b1 = s->b0 + t->row_bytes / T;
        break;
    default: break;
    }
}

void shard_kv_b_heads(const shard_plan *p, uint32_t rank, uint32_t *h0, uint32_t *h1) {
    const uint32_t per = p->hp.n_head / p->tp;
    *h0 = per * rank;
    *h1 = *h0 + per;
}

void shard_gather(const shard_plan *p, const shard_tensor *t, uint32_t rank, const uint8_t *src, uint8_t *dst) {
    shard_sel s;
    shard_select(p, t, rank, &s);
    const uint64_t rb = t->row_bytes;
    if (s.b0 == 0 && s.b1 == rb) {
        for (uint64_t base = 0; base < t->n_rows; base += t->period) {
            memcpy(dst, src + (base + s.lo) * rb, (s.hi - s.lo) * rb);
            dst += (s.hi - s.lo) * rb;
        }
        return;
    }
    for (uint64_t i = 0; i < t->n_rows; i++) {
        memcpy(dst, src + i * rb + s.b0, s.b1 - s.b0);
        dst += s.b1 - s.b0;
    }
}

void shard_format_tensor(const shard_plan *p, uint64_t i, char *buf, size_t cap) {
    if (i >= p->n_tensors) {
        snprintf(buf, cap, "?");
        return;
    }
    const shard_tensor *t = &p->tensors[i];
    char g[96], l[96];
    fmt_shape(t->ne_global, t->n_dims, g, sizeof g);
    fmt_shape(t->ne_local, t->n_dims, l, sizeof l);
    snprintf(buf, cap, "%-34s %-5s %-22s -> %-22s %-11s (%s)  %llu B/rank", t->name, quant_type_name(t->type),
             g, l, shard_rule_name(t->rule), t->why, (unsigned long long)t->local_bytes);
}
