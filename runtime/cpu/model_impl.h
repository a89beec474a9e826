/* Internals of the CPU forward pass shared by model.c (setup, FFN/MoE, orchestration) and
 * attn.c (MLA attention and the DSA lightning indexer). Not a public interface. */
#ifndef G5_RT_MODEL_IMPL_H
#define G5_RT_MODEL_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "runtime/cpu/cpu_ops.h"
#include "runtime/cpu/kvcache.h"
#include "runtime/cpu/model.h"
#include "runtime/cpu/model_tensors.h"


typedef struct rt_rank {
    uint32_t r;                  /* global rank index (m->ranks[i].r = m->rank0 + i) */
    const rt_weights *w;
    rt_pool *pool;
    uint32_t H_l;                /* attention heads here */
    uint32_t ff_l;               /* dense FFN rows here */
    uint32_t ffe_l;              /* rows of each routed expert here */
    uint32_t n_exp_l, exp0;      /* routed experts here: global ids exp0 .. exp0 + n_exp_l - 1 */
    uint64_t max_ncols;          /* widest matrix row (matmul scratch) */
    uint64_t max_rows;           /* widest FFN activation (ff_l, ffe_l, sh_l) */
    rt_mat tok_embd;
    rt_head output;
    float *output_norm;
    rt_layer *layers;            /* [n_layer] */
} rt_rank;

struct rt_model {
    glm5_hparams hp;
    const rt_wset *ws;
    uint32_t n_ranks;            /* T, all processes' ranks */
    uint32_t rank0, n_local;     /* this process's: rank0 .. rank0 + n_local - 1 */
    rt_comm *comm;               /* NULL: one process owns every rank */
    uint32_t n_threads;
    rt_mla_mode mla;
    int has_mtp;
    rt_rank *ranks;              /* [n_local] */
    void **owned;
    uint64_t n_owned, cap_owned;
};

/* One rank's caches for one layer, contiguous: what rt_attn_layer reads and writes when given
 * one (a caller's own caches, e.g. --check's stage run); states use paged caches instead. */
typedef struct rt_layer_cache {
    float *lat;                  /* [cap][kv_lora + qk_rope]: normalized latent, roped k_pe */
    float *idxk;                 /* [cap][idx_head_dim]: indexer keys (normed, roped) */
} rt_layer_cache;

struct rt_state {
    const rt_model *m;
    uint32_t n_past, mtp_n_past;
    rt_kvtab main;               /* main layers' blocks (shared pool, or a private one) */
    rt_kvtab mtp;                /* the NextN block's (private pool); pool NULL without MTP */
};

/* The layout of a pool for layers [il0, il1) of m (kvcache.h). */
g5_status rt_kvpool_for_layers(const rt_model *m, uint32_t il0, uint32_t il1, uint32_t n_blocks,
                               uint32_t block_tokens, rt_kvpool **out, g5_error *err);

/* A barrier whose party count can shrink (when a rank worker cannot be started). */
typedef struct rt_barrier {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t parties, waiting;
    uint64_t gen;
} rt_barrier;

/* A forward call shared by the rank workers. Row t of the call is token t of state s at
 * position pos0 + t, or, when ss is set (batched decode), a token of state ss[t] at position
 * pos[t]. */
typedef struct rt_fwd {
    rt_model *m;
    rt_state *s;
    uint32_t n;                  /* tokens in this call */
    uint32_t pos0;               /* position of the first */
    rt_state *const *ss;         /* [n] or NULL */
    const uint32_t *pos;         /* [n] or NULL */
    rt_barrier bar;
    void **pub;                  /* [n_local] buffers each local rank publishes for a collective */
    atomic_int failed;
    /* Several processes (model_comm.c): the exchange buffer, allocated by the first local rank
     * (the calling thread, the only one that talks to the other processes) before the first
     * collective, and its first failure. */
    uint8_t *xb;
    size_t xcap;
    g5_status xst;
    g5_error xerr;
} rt_fwd;

/* One rank's working buffers for one call (sized for n tokens, P = pos0 + n positions). */
typedef struct rt_work {
    float *x;                    /* [n][n_embd] residual stream */
    float *h;                    /* [n][n_embd] normed input of a sublayer */
    float *part;                 /* [n][n_embd] this rank's partial output */
    float *qr;                   /* [n][q_lora] */
    float *kv;                   /* [n][kv_lora + qk_rope] */
    float *q;                    /* [n][H_l * (qk_nope + qk_rope)] */
    float *qlat;                 /* [n][H_l * kv_lora] absorbed queries, then latent outputs */
    float *olat;                 /* [n][H_l * kv_lora] */
    float *ao;                   /* [n][H_l * v_head] attention output */
    float *iq;                   /* [n][idx_n_head * idx_head_dim] */
    float *ik;                   /* [n][idx_head_dim] */
    float *iw;                   /* [n][idx_n_head] */
    int32_t *sel;                /* [n][idx_top_k] selected key positions, ascending */
    uint32_t *n_sel;             /* [n] */
    float *rope;                 /* [n][qk_rope] cos/sin per position */
    float *wuk;                  /* [qk_nope][kv_lora] one head's W_UK, dequantized */
    float *kvx;                  /* [P][H_l * (qk_nope + v_head)] expanded K/V (expanded mode) */
    float *latg;                 /* [P][kv_lora] gathered latents (expanded mode) */
    int32_t *row_of;             /* [P] position -> row of kvx, -1 if not needed */
    float *ga, *gb;              /* [n][max(ff_l, ffe_l, sh_l)] FFN activations */
    float *xe;                   /* [n][n_embd] tokens routed to one expert */
    float *ye;                   /* [n][n_embd] */
    float *moe;                  /* [n][n_embd] routed experts' sum */
    float *rl;                   /* [n][n_expert] router scores */
    float *choice;               /* [n_expert] routing scratch */
    uint8_t *allowed;            /* [n_expert] */
    float *gscore;               /* [n_group] */
    int32_t *ch_e;               /* [n][n_expert_used] chosen experts, ascending */
    float *ch_w;                 /* [n][n_expert_used] their weights */
    int32_t *tok_list;           /* [n] */
    int32_t *slot_list;          /* [n] */
    float *cat;                  /* [n][2 * n_embd] MTP input */
    float *gath;                 /* [n][n_embd] all-gather target (MTP eh_proj split by rows) */
} rt_work;

static inline rt_state *rt_fwd_state(const rt_fwd *f, uint32_t t) { return f->ss ? f->ss[t] : f->s; }
static inline uint32_t rt_fwd_pos(const rt_fwd *f, uint32_t t) { return f->pos ? f->pos[t] : f->pos0 + t; }

/* The replicated per-token work (norms, q_a, kv_a, the indexer, the router) is divided among the
 * ranks by token rows, each rank using its own copy of the weights, and the rows are then
 * exchanged (an all-gather). Each token's arithmetic is the same whichever rank does it, so this
 * equals every rank computing everything, without the T-fold cost. Rank r takes tokens
 * [a, b) of n. */
static inline void rt_token_range(uint32_t n, uint32_t T, uint32_t r, uint32_t *a, uint32_t *b) {
    *a = (uint32_t)((uint64_t)n * r / T);
    *b = (uint32_t)((uint64_t)n * (r + 1) / T);
}

/* ---- collectives between rank workers (model_comm.c) ----
 * Every rank worker of the call makes each of them, in the same order. Within a process they
 * meet at f->bar and read each other's published buffers; with several processes (m->comm of
 * size > 1) the first local rank then exchanges this process's part with the others through
 * rt_comm (so MPI is called from the thread that called the forward function: FUNNELED), and
 * the local ranks read the other processes' parts from f->xb. Sums run over ranks 0 .. T - 1 in
 * that order whatever the split, so results are bit-identical to one process running all. */
void rt_barrier_init(rt_barrier *b, uint32_t parties);
void rt_barrier_destroy(rt_barrier *b);
void rt_barrier_wait(rt_barrier *b);
void rt_barrier_shrink(rt_barrier *b, uint32_t parties); /* fewer parties; releases if all there */

/* Bytes the exchange buffer needs for a call of n rows (0 in one process). */
size_t rt_xchg_bytes(const rt_model *m, uint32_t n);
/* After each local rank has set f->failed or not: makes every process agree (any failure fails
 * them all; a process that did not fail itself gets "process q failed" in f->xerr). */
void rt_agree_failed(rt_fwd *f, rt_rank *rk);
/* w->x += sum over ranks (in rank order) of each rank's w->part [n][n_embd]. */
void rt_allreduce_add(rt_fwd *f, rt_rank *rk, rt_work *w, uint32_t n);
/* Row t of the call's n rows lives at base + t * stride (row_bytes long) in every rank's own
 * buffer; afterwards each rank's buffer holds every rank's rows of its token range
 * (rt_token_range). A no-op at T = 1. */
void rt_allgather_rows(rt_fwd *f, uint32_t rank, void *base, size_t stride, size_t row_bytes);
/* dst [n][n_embd] from the columns [r * cols, (r + 1) * cols) rank r computed into its own src
 * (ld n_embd). */
void rt_allgather_cols(rt_fwd *f, rt_rank *rk, float *src, uint32_t n, uint32_t cols, float *dst);
/* After the ranks wrote their vocabulary columns of logits ([n_rows][n_vocab]; head->write,
 * head->col0): the other processes' columns, so every process holds whole rows. */
void rt_gather_vocab(rt_fwd *f, rt_rank *rk, const rt_head *head, float *logits, uint32_t n_rows);

/* attn.c: one layer's attention for one rank: reads w->x, leaves the rank's partial output in
 * w->part (o_proj of its heads). Writes each row's latent and indexer key to the caches at the
 * row's position: C's contiguous ones when C is given (rows at pos0 + t), otherwise each row's
 * state's (paged; blocks already reserved). When the layer shares the previous full layer's
 * choice (no indexer), w->sel already holds it. Expanded MLA needs all rows in one state. */
void rt_attn_layer(rt_fwd *f, rt_rank *rk, rt_layer *L, rt_layer_cache *C, rt_work *w);

/* The FFN stages on one rank (w->h holds the normed input; the output lands in w->part):
 * the dense SwiGLU FFN; the MoE (the router on this rank's token rows, the choices exchanged,
 * then the routed experts and the shared expert); the routed experts (choices already in
 * w->ch_e / w->ch_w for all n tokens) plus the shared expert. The stage runs (stages.c, the
 * public rt_stage_* of model.h) call them too. */
void rt_ffn_dense(rt_rank *rk, const rt_layer *L, rt_work *w, uint32_t n, uint32_t E);
void rt_ffn_moe(rt_fwd *f, rt_rank *rk, const rt_layer *L, rt_work *w, uint32_t n);
void rt_ffn_experts(rt_rank *rk, const rt_layer *L, rt_work *w, uint32_t n, const glm5_hparams *hp);

/* One rank's work buffers for a call of n tokens over P positions (one allocation, *mem, to
 * free), and the rank's pool scratch for them. */
g5_status rt_work_alloc(const rt_model *m, rt_rank *rk, uint32_t n, uint32_t P, uint8_t **mem, rt_work *w,
                        g5_error *err);

/* Scratch each pool worker needs for attention and indexer tasks over P positions. */
size_t rt_attn_scratch(const glm5_hparams *hp, uint32_t P);

#endif
