/* Internals of the CUDA model shared by runtime/gpu/gpu_model.c (setup, FFN stage, forward),
 * runtime/gpu/gpu_attn.c (the attention stage), runtime/gpu/gpu_prod.c (the weight products),
 * runtime/gpu/gpu_debug.c (the benchmark and profiling hooks of gpu_model.h) and runtime/gpu/gpu_mtp.c
 * (the NextN/MTP block), runtime/gpu/gpu_coll.c (processes, NCCL): the device-side structures and
 * the stage functions. Not an API: nothing outside runtime/gpu/gpu_*.c includes it but
 * tests/gpu/test_gpu_comm.c (gpu_coll.c's exchanges on a model stub).
 * Built only with G5_WITH_CUDA. */
#ifndef G5_RT_GPU_INT_H
#define G5_RT_GPU_INT_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "cuda/cuk.h"
#include "cuda/cuk_check.h"
#include "cuda/cuk_h16.h"
#include "cuda/cuk_model.h"
#include "cuda/cuk_q8.h"
#include "cuda/cuk_sample.h"
#include "runtime/gpu/gpu_linear.h"
#include "runtime/gpu/gpu_model.h"
#include "runtime/cpu/model_tensors.h"

#if defined(__has_include)
#if __has_include(<nccl.h>)
#include <nccl.h>
#define G5_HAVE_NCCL 1
#endif
#endif

enum { COLL_NONE = 0, COLL_DEVICE = 1, COLL_NCCL = 2 };

/* A weight matrix on the device: m rows of k elements of `type`. */
typedef struct dmat {
    uint32_t type;
    const void *w;
    int64_t k, m;
} dmat;

typedef struct gl_layer {
    int dense, has_idx;
    const float *attn_norm, *q_a_norm, *kv_a_norm;   /* [E] [QL] [KL] */
    const float *idx_k_norm, *idx_k_norm_b;          /* [ID] */
    const float *ffn_norm, *router_b;                /* [E] [NE] (router_b may be NULL) */
    dmat q_a, q_b, kv_a, o;
    const float *kvb;                                /* [H_l * (NOPE + V)][KL] float32 */
    const int8_t *kq;                                /* kv_b's exact int8 form, or NULL (decode's
                                                        W_UK / W_UV read it: cuk_kvb_exact) */
    const float *ksk, *ksv;                          /* its scales: [H_l][NOPE/16][KL], [H_l][V][KL/16] */
    dmat idx_q_b, idx_k, idx_proj;
    dmat ffn_gate, ffn_up, ffn_down, router;
    uint32_t exp_type, exp_down_type;
    const void *exp_gate, *exp_up, *exp_down;        /* [n_exp_l][ffe_l or E][row] */
    dmat sh_gate, sh_up, sh_down;
    int sh_contrib;
    uint32_t sh_l;
} gl_layer;

/* The NextN/MTP block's parts beside its decoder layer (which is L[n_layer_main]): gpu_mtp.c. */
typedef struct gl_mtp {
    const float *enorm, *hnorm, *head_norm;          /* [E] */
    dmat eh;                                         /* eh_proj: [E][2E] whole, this rank's
                                                        [E/T][2E] rows or [E][2E/T] columns */
    int eh_split;                                    /* RT_SPLIT_NONE, _ROWS or _COLS */
    dmat embd;                                       /* nextn.embed_tokens, else token_embd */
    dmat head;                                       /* nextn.shared_head_head, else output */
    uint32_t head_col0;
    int head_write;
    int head_as_output;                              /* the same columns as output on this rank */
} gl_mtp;

/* Host range [h, h + n) of the weight set is at d on the device. */
typedef struct seg {
    const uint8_t *h;
    uint64_t n;
    uint8_t *d;
} seg;

typedef struct gl_rank {
    uint32_t r;                      /* index among this process's ranks (g->rk, s->rk) */
    uint32_t rg;                     /* global rank index: g->first + r (messages, NCCL rank) */
    int dev;
    cudaStream_t st;
    int own_stream;
    const rt_rank_tensors *c;        /* the CPU model's tensor table of this rank (&ctab) */
    rt_rank_tensors ctab;
    void *wmem;                      /* all tensor data, one allocation */
    uint64_t wbytes;
    uint8_t *xmem;                   /* float32 extras */
    uint64_t xcap, xoff;
    uint32_t kvx_layers;             /* layers whose kv_b has its exact int8 form (gl_layer.kq) */
    seg *segs;
    uint64_t n_segs;
    gl_layer *L;                     /* [n_layer_main (+ 1: the NextN layer, with MTP)] */
    gl_mtp mtp;                      /* with MTP only */
    dmat tok_embd, head;
    uint32_t head_col0;
    int head_write;
    const float *out_norm;
    cuk_q8_act head_q8;              /* the step's final norm output in int8 for the head (.q NULL: none) */
    int fast;                        /* bf16 inputs to the weight products (RT_GPU_BF16ACT only) */
    int q8;                          /* int8 inputs for gm_gemv_q8's roles (every mode but precise) */
    int h16;                         /* fp16 inputs for the two-plane roles (opts.h16_products) */
    int attn_tc;                     /* decode attention on the tensor cores (every mode but precise) */
    /* work buffers for up to ncap tokens */
    void *work;
    uint32_t ncap;
    float *x, *h, *part, *red, *qr, *kv, *q, *qlat, *olat, *ao, *iq, *iw;
    float *ga, *gb, *gu, *moe, *rl, *wts, *wts_l, *lg;
    int32_t *ami;                    /* [n] the argmax of each row's logits on this rank's columns */
    float *amv;                      /* [n] its logit (out->argmax: cuk_argmax) */
    cuk_sample_row *drr;             /* [n] out->draw's rows (uploaded by gm_head_draw) */
    int32_t *dri;                    /* [n] their tokens */
    void *drs;                       /* cuk_sample's scratch for CUK_GEMV_MAX_N rows */
    int32_t *dpi;                    /* [dpen_cap] out->draw's penalized ids (uploaded per call) */
    uint32_t *dpc;                   /* [dpen_cap] their counts */
    uint32_t dpen_cap;
    /* The residual adds are folded into the RMSNorm that reads x next (cuk_add_rms_norm): a
     * stage leaves its output as oa (+ ob: the routed and the shared experts, one device only),
     * the collective turns it into the pending addends pa (+ pb) that x still lacks. */
    float *oa, *ob, *pa, *pb;
    float *latf;                     /* [n][KVW] new latents before conversion (non-f32 cache) or
                                        before the copy into each sequence's cache (batches) */
    float *ikf;                      /* [n][ID] new indexer keys of a batch, before the copies */
    float *cat;                      /* [n][2E] the MTP block's [enorm(embd) | hnorm(hidden)] */
    int batch_rows;                  /* a batched decode step is running: GEMV launches use only
                                        widths whose kernel family is that of one row (gemv_k) */
    void *xb;                        /* bf16 copies of product inputs (fast mode) */
    int8_t *q8q;                     /* int8 copies of product inputs, rows of planes * k (fast
                                        mode, the roles of specs/numerics.md; cuda/cuk_q8.h) */
    float *q8d;                      /* their (d, s) pairs per 32 elements, rows of planes * k / 16 */
    uint64_t q8n;                    /* q8q's halves, in elements: side work's inputs use the upper
                                        (gm_q8_buf), so while it runs each chain has one */
    void *q8x;                       /* cuk_gemv_q8t's scratch: x in fragment order, q8x_bytes */
    uint64_t q8x_bytes;
    uint16_t *h16x;                  /* fp16 copies of the two-plane roles' inputs where their
                                        weights have an fp16 kernel (cuda/cuk_h16.h), rows of k */
    float *h16u;                     /* their 2^-e per row */
    uint64_t h16n;                   /* h16x's elements */
    /* side work (gm_side_begin): the second stream (rank 0's where ranks share a device), its
     * events ([0] fork, [1, GM_SIDE_JOIN) points, [GM_SIDE_JOIN] join) and its own q8t scratch;
     * side: 0 none, 1 queuing on the side (st and st2, q8x and q8x2 swapped), 2 join pending */
    cudaStream_t st2;
    cudaEvent_t side_ev[4];
    void *q8x2;
    int side, side_rec;
    /* the third stream (gm_aux_begin; rank 0's where ranks share a device), its fork and join
     * events and its q8t scratch; aux: 0 none, 1 queuing there (st and st3, q8x and q8x3
     * swapped), 2 join pending */
    cudaStream_t st3;
    cudaEvent_t aux_ev[2];
    void *q8x3;
    int aux;
    gl_lin *lin;                     /* the prefill GEMM path: cuBLAS handle, scratch */
    int32_t *ids, *ids_l, *sel, *n_sel, *tok, *pos;
    int32_t *mplan;                  /* MoE routing plans, one per GM_MOE_CHUNK tokens (cuk_moe_plan) */
    float *mpart;                    /* [GM_MOE_CHUNK * n_used][n_embd]: routed down products by pair */
    float *sc;                       /* [n][P] indexer scores */
    uint64_t sc_cap;
    cuk_seq_row *mrows;              /* [n_layer_main][n] a batched decode step's per-sequence caches
                                        and positions (cuda/cuk_model.h), written by forward_plan */
    uint32_t multi;                  /* 0, or the key bound (largest position + 1) of a batched
                                        decode step whose attention runs as one launch per kernel */
#ifdef G5_HAVE_NCCL
    ncclComm_t comm;
#endif
} gl_rank;

#ifdef G5_HAVE_NCCL
typedef struct nccl_api {
    void *lib;
    ncclResult_t (*get_unique_id)(ncclUniqueId *);
    ncclResult_t (*comm_init_rank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                               cudaStream_t);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
    ncclResult_t (*comm_destroy)(ncclComm_t);
    const char *(*error_string)(ncclResult_t);
    ncclUniqueId id;                 /* made by process 0, broadcast through rt_comm */
} nccl_api;
#endif

/* The most rows of a batched step run as a CUDA graph (gm_forward_graph_rows). */
#define GM_RGRAPH_MAX 64u

struct rt_gpu_model {
    const rt_model *cpu;
    glm5_hparams hp;
    uint32_t T;                      /* ranks of this process (the CPU model's local ranks) */
    uint32_t T_all, first;           /* ranks of the run; global index of rk[0] */
    rt_comm *comm;                   /* the CPU model's processes (NULL: this one only) */
    uint32_t *vcol;                  /* several processes: [2][P], process p writes logits columns
                                        [vcol[p], vcol[p] + vcol[P + p]) (gm_coll_agree_load) */
    gl_rank *rk;                     /* [T] */
    int coll;
    uint32_t lat_type;               /* CUK_F32, CUK_BF16, CUK_F16 */
    uint32_t lat_es;                 /* its element size */
    rt_gpu_seq *def;                 /* rt_gpu_forward's sequence */
    int has_mtp;                     /* the CPU model has a NextN block: set up on every rank */
    struct gm_graph *graph;          /* the decode step's CUDA graph (opts.cuda_graph; gpu_graph.c) */
    struct gm_graph *rgraph[GM_RGRAPH_MAX + 1]; /* a batched step's of n rows, by n (NULL: none yet) */
    int32_t *amh_i;                  /* out->argmax: [T][rows] each rank's argmax column (global) */
    float *amh_v;                    /* and its logit, copied from rk->ami / amv (host; one
                                      * allocation from amh_i, page-locked unless amh_paged) */
    uint64_t amh_cap;                /* rows of T entries they hold */
    int amh_paged;                   /* the page-locked allocation failed: malloc'ed */
    cuk_sample_row *drh;             /* out->draw's rows staged for upload (page-locked unless
                                      * amh_paged; in amh_i's allocation) */
    uint32_t graph_bound;            /* 0, or while gm_forward_graph captures a one-token step: the
                                        attention stage takes its position from rk->pos (pl->pos0
                                        is only the capturing step's), writes the caches through
                                        it and shapes its launches for graph_bound key positions
                                        (pos0 + 1 <= graph_bound <= the sequence's capacity and
                                        every rank's sc_cap) */
    rt_gpu_info info;
    struct gprof *prof;              /* sub-step events while rt_gpu_debug_profile runs, else NULL */
#ifdef G5_HAVE_NCCL
    nccl_api nccl;
#endif
};

/* One rank's caches of a sequence. */
typedef struct seq_rank {
    void *lat;                       /* [Lm][cap][KVW] latents of the model's lat_type */
    float *idxk;                     /* [full layers][cap][ID] indexer keys (gm_seq_idxk) */
} seq_rank;

struct rt_gpu_seq {
    rt_gpu_model *g;
    uint32_t n_past, cap;
    seq_rank *rk;                    /* [T] */
    /* the NextN layer's caches ([mtp_cap] positions, one layer), allocated by the first MTP call */
    uint32_t mtp_n_past, mtp_cap;
    seq_rank *mrk;                   /* [T], or NULL */
};

#define CK(call)                                                                              \
    do {                                                                                      \
        g5_status st_ = (call);                                                               \
        if (st_) return st_;                                                                  \
    } while (0)

/* Events recorded on the working stream between the sub-steps of the stages while g->prof is
 * set; the interval that ends at mark i is charged to (stage[i], label[i]). Labels are string
 * literals. Off (g->prof NULL), a mark costs one pointer test. */
typedef struct gprof {
    cudaEvent_t *ev;
    const char **stage, **label;
    uint32_t cap, n;
    int external;                    /* recording into a stream capture: event record nodes */
    int overflow;
    cudaError_t ce;                  /* the first recording error */
    /* rt_gpu_debug_scan: no events; at each mark the largest finite |v| and the non-finite count
     * of x, h, oa and ob over scan_rows rows (0: off) into hscan[mark] (cuk_absmax_scan) */
    uint32_t scan_rows;
    uint32_t *dscan;                 /* device [4][2] */
    uint32_t (*hscan)[4][2];         /* [cap] */
} gprof;

/* rt_gpu_debug_scan's work at a mark (gpu_debug.c). */
void gm_prof_scan(const rt_gpu_model *g, const gl_rank *rk, gprof *p);

/* The rows of one forward call: segment i is sequence seq[i]'s tokens at positions pos0[i] ..
 * pos0[i] + len[i] - 1, held in rows row0[i] .. row0[i] + len[i] - 1 of the work buffers. A
 * single-sequence call is one segment; a batched decode step one segment of one row per
 * sequence. Everything but the cache writes, the indexer scores/top-k and the attention is
 * per row, so it runs once over all n rows. */
typedef struct fplan {
    uint32_t n, n_seg;
    rt_gpu_seq *const *seq;
    const uint32_t *pos0, *len, *row0;
} fplan;

/* A rows step's plan (gm_rows_plan): every row a segment of its own, so the attention of a
 * batched decode step serves it; mtp: at the sequences' NextN positions. */
typedef struct gm_rows {
    fplan pl;
    uint32_t *a;
    rt_gpu_seq **sq;
} gm_rows;
g5_status gm_rows_plan(rt_gpu_model *g, rt_gpu_seq *const *seqs, const uint32_t *n_tok, uint32_t n_seq, int mtp,
                       gm_rows *rw, g5_error *err);
void gm_rows_free(gm_rows *rw);
g5_status gm_write_rows(rt_gpu_model *g, const fplan *pl, uint32_t l0, uint32_t l1, g5_error *err);

/* Records a sub-step mark (g->prof set: rt_gpu_debug_profile is running). */
void gm_prof_mark(const rt_gpu_model *g, const gl_rank *rk, const char *stage, const char *label);
#define PMARK(stage, label)                                                                   \
    do {                                                                                      \
        if (g->prof) gm_prof_mark(g, rk, (stage), (label));                                   \
    } while (0)

double gm_now_s(void);
uint64_t gm_lat_w(const glm5_hparams *hp);
/* Sequence s's latent cache ([cap][lat_w] of the model's cache type) and indexer keys
 * ([cap][idx_head_dim] float32) of layer il on rank r; il = n_layer_main: the NextN layer's
 * ([mtp_cap] positions). */
uint8_t *gm_seq_lat(const rt_gpu_model *g, const rt_gpu_seq *s, uint32_t r, uint32_t il);
float *gm_seq_idxk(const rt_gpu_model *g, const rt_gpu_seq *s, uint32_t r, uint32_t il);
/* Grows s to hold at least `need` positions (contents kept). */
g5_status gm_seq_need(rt_gpu_seq *s, uint32_t need, g5_error *err);
/* Work buffers of rank rk for n rows and sc_need indexer scores. */
g5_status gm_work_reserve(rt_gpu_model *g, gl_rank *rk, uint32_t n, uint64_t sc_need, g5_error *err);
/* Setup helpers: the device view of a CPU matrix (it must lie in the uploaded weights); a float32
 * copy of n host values (NULL: uninitialized) in the rank's extras arena. */
g5_status gm_dmat_of(const gl_rank *rk, const rt_mat *m, const char *what, uint32_t il, dmat *out, g5_error *err);
g5_status gm_put_f32(gl_rank *rk, const float *host, uint64_t n, const float **out, g5_error *err);
/* gpu_mtp.c: the NextN block's parts of rank rk (after its layers are set up; extras arena room:
 * GM_MTP_EXTRA_BYTES), and the sequence's MTP caches freed (rt_gpu_seq_free). */
#define GM_MTP_EXTRA_BYTES(E) (3 * (((uint64_t)(E) * 4 + 255) & ~(uint64_t)255))
g5_status gm_mtp_setup_rank(rt_gpu_model *g, gl_rank *rk, g5_error *err);
void gm_mtp_seq_free(rt_gpu_seq *s);
/* rk->h = RMSNorm(x) * w over n rows, the pending residual add folded in first. */
g5_status gm_norm_x(gl_rank *rk, const float *w, uint32_t n, int64_t E, float eps, g5_error *err);
/* gm_norm_x, then with planes 1 or 2 rk->h quantized as gm_q8_in would into *o (one launch where
 * cuk_norm_q8_fits E, the same bits either way); planes 0: gm_norm_x alone and
 * *o zeroed. */
g5_status gm_norm_x_q8(gl_rank *rk, const float *w, uint32_t n, int64_t E, float eps, int planes, cuk_q8_act *o,
                       g5_error *err);
/* gm_norm_x_q8 with h's fp16 operand (gm_norm_h16) instead of its int8 planes */
g5_status gm_norm_x_h16(gl_rank *rk, const float *w, uint32_t n, int64_t E, float eps, cuk_h16_act *o, g5_error *err);
/* rk->x = the token embeddings of rk->tok [n] (E wide), the pending residual add cleared. */
g5_status gm_embed(gl_rank *rk, uint32_t n, int64_t E, g5_error *err);
/* ---- products (gpu_prod.c) ---- */

/* The product input of a fast-mode rank: x [n][ldx] rounded to bf16 in rk->xb [n][k] (*ld = k,
 * *type CUK_ACT_BF16); x itself (CUK_ACT_F32) in precise mode or with keep_f32. */
const void *gm_act_in(const gl_rank *rk, const float *x, int64_t ldx, int64_t n, int64_t k, int64_t *ld,
                      uint32_t *type, int keep_f32, g5_status *st, g5_error *err);
/* y[t] = W x[t] for t < n: the prefill GEMM path where it takes n rows, else GEMV launches of
 * CUK_GEMV_MAX_N rows. keep_f32: float32 input in fast mode too (the router and the indexer:
 * their choices flip on bf16 rounding, and their weights are small). */
g5_status gm_gemv_k(const gl_rank *rk, const dmat *W, const float *x, int64_t ldx, uint32_t n, float *y,
                    int64_t ldy, int keep_f32, g5_error *err);
/* The GEMV launches of gm_gemv_k for an input gm_act_in made (xin [n][ld] of type xt), so that
 * several products of one input share one conversion. */
g5_status gm_gemv_in(const gl_rank *rk, const dmat *W, const void *xin, uint32_t xt, int64_t ld, uint32_t n,
                     float *y, int64_t ldy, g5_error *err);
/* gm_gemv_k without keep_f32. */
g5_status gm_gemv(const gl_rank *rk, const dmat *W, const float *x, int64_t ldx, uint32_t n, float *y,
                  int64_t ldy, g5_error *err);
/* 1: a fast-mode product of W over n rows takes int8 inputs (GEMV path, a type with a kernel);
 * gm_q8x2_takes: the same for the two-plane roles (attention projections, dense FFN). */
int gm_q8_takes(const gl_rank *rk, const dmat *W, uint32_t n);
int gm_q8x2_takes(const gl_rank *rk, const dmat *W, uint32_t n);
/* The rank's int8 buffer (rk->q8q / q8d) as rows of k in `planes` planes: the layout gm_q8_in and
 * the fused norms write; its upper half while side work is being queued (gm_side_begin). */
static inline uint64_t gm_q8_off(const gl_rank *rk) { return rk->side == 1 ? rk->q8n : 0; }
static inline cuk_q8_act gm_q8_buf(const gl_rank *rk, int64_t k, int planes) {
    const uint64_t o = gm_q8_off(rk);
    return (cuk_q8_act){rk->q8q + o, planes * k, rk->q8d + o / 16, planes * k / 16, planes};
}
/* x from its row t0 on. */
static inline cuk_q8_act gm_q8_rows(const cuk_q8_act *x, int64_t t0) {
    return (cuk_q8_act){x->q + t0 * x->ldq, x->ldq, x->ds + t0 * x->ldds, x->ldds, x->planes};
}
/* x [n][ldx] quantized into rk->q8q / q8d as rows of k in `planes` planes; *o describes them. */
g5_status gm_q8_in(const gl_rank *rk, const float *x, int64_t ldx, int64_t n, int64_t k, int planes,
                   cuk_q8_act *o, g5_error *err);
/* y[t] = W x'[t] for the int8 rows x (of W->k), dp4a or tensor-core launches by n. */
g5_status gm_gemv_q8_in(const gl_rank *rk, const dmat *W, const cuk_q8_act *x, uint32_t n, float *y,
                        int64_t ldy, g5_error *err);
/* y1 = W1 x', y2 = W2 x' for the same int8 rows x: one dp4a launch for both where the shapes and
 * types match and n is below the tensor-core kernel's width (the same bits as two launches). */
g5_status gm_gemv_q8_pair_in(const gl_rank *rk, const dmat *W1, const dmat *W2, const cuk_q8_act *x, uint32_t n,
                             float *y1, float *y2, int64_t ldy, g5_error *err);
/* 1: a one-vector product of W takes its input as float32 rows in `planes` int8 planes through
 * gm_gemv_xf (short rows: the GEMV quantizes them per CTA, cuda/cuk_q8.h's cuk_gemv_q8_xf). */
int gm_xf_takes(const gl_rank *rk, const dmat *W, uint32_t n, int planes);
/* y = W x' for the float32 row *x (normed first with x->nw), quantized in `planes` planes by the
 * GEMV's own CTAs: the bits of gm_q8_in (gm_norm_q8 with x->nw) and gm_gemv_q8_in. */
g5_status gm_gemv_xf(const gl_rank *rk, const dmat *W, const cuk_q8_xf *x, int planes, float *y, int64_t ldy,
                     g5_error *err);
/* 1: under opts.h16_products (rk->h16), a product of a two-plane role (gm_q8x2_takes) whose
 * weights have an fp16 kernel takes fp16 inputs instead (cuda/cuk_h16.h: batched rows at the
 * weights' rate, the same bits at any n). */
int gm_h16_takes(const gl_rank *rk, const dmat *W, uint32_t n);
/* x [n][ldx] as fp16 rows of k in rk->h16x (cuk_h16_prep); *o describes them. Main chain only: the
 * buffer has no half for side work. */
g5_status gm_h16_in(const gl_rank *rk, const float *x, int64_t ldx, int64_t n, int64_t k, cuk_h16_act *o,
                    g5_error *err);
/* The norm *na as gm_norm_q8's, with its rows y made the fp16 operand *o as gm_h16_in would: one
 * launch where cuk_norm_q8_fits the dim (cuk_norm_h16), the same bits either way. */
g5_status gm_norm_h16(const gl_rank *rk, const cuk_add_rms_norm_args *na, cuk_h16_act *o, g5_error *err);
/* y[t] = W x'[t] for the fp16 rows x (of W->k). */
g5_status gm_gemv_h16_in(const gl_rank *rk, const dmat *W, const cuk_h16_act *x, uint32_t n, float *y, int64_t ldy,
                         g5_error *err);
/* gm_gemv_k with fp16 inputs where gm_h16_takes, two int8 planes where gm_q8x2_takes, else bf16 /
 * float32 inputs. */
g5_status gm_gemv_q8x2(const gl_rank *rk, const dmat *W, const float *x, int64_t ldx, uint32_t n, float *y,
                       int64_t ldy, g5_error *err);
/* The norm *na (cuk_add_rms_norm's, or with na->a NULL cuk_rms_norm's, y == x allowed), then
 * with planes 1 or 2 its rows y quantized as gm_q8_in would into *o: one launch where
 * cuk_norm_q8_fits the dim, the same bits either way (planes 0: the norm alone, *o zeroed). */
g5_status gm_norm_q8(const gl_rank *rk, const cuk_add_rms_norm_args *na, int planes, cuk_q8_act *o, g5_error *err);
/* rk->ga [n][F] = silu(ga) * gb, then y = W ga: with `planes` int8 planes where W takes them
 * (planes 2: gm_q8x2_takes, 1: gm_q8_takes; the silu and the quantization in one launch), else as
 * gm_gemv_q8x2 (planes 2) or gm_gemv_q8 (planes 1) would. */
g5_status gm_silu_gemv(const gl_rank *rk, const dmat *W, int64_t F, uint32_t n, int planes, float *y, int64_t ldy,
                       g5_error *err);
/* gm_gemv with the input quantized to int8 per 32 elements in fast mode (cuda/cuk_q8.h) where the
 * weight type has an int8 kernel and the call is not on the prefill GEMM path: only for the roles
 * specs/numerics.md lists (output heads, routed and shared experts, the NextN projection). */
g5_status gm_gemv_q8(const gl_rank *rk, const dmat *W, const float *x, int64_t ldx, uint32_t n, float *y,
                     int64_t ldy, g5_error *err);
/* Side work of a decode step: what is queued between gm_side_begin and gm_side_end runs on the
 * rank's second stream (rk->st and rk->q8x are swapped meanwhile, so every helper queues there),
 * after all that the main stream held at gm_side_begin and beside what it queues after
 * gm_side_end; gm_side_wait(rk, i) makes the main stream wait for the side's work up to
 * gm_side_point(rk, i) (GM_SIDE_JOIN: all of it, which must come before the stage ends). Side work
 * must not touch what the main stream uses meanwhile: its int8 inputs go to the upper half of
 * rk->q8q / q8d (gm_q8_buf), and it never uses rk->xb (bf16 inputs). Off (all of it in order on the main stream) where `on` is 0,
 * under the profiler or without a second stream; no GEMM path (gl_lin: its own stream) inside. */
enum { GM_SIDE_JOIN = 3 };
g5_status gm_side_begin(const rt_gpu_model *g, gl_rank *rk, int on, g5_error *err);
g5_status gm_side_point(gl_rank *rk, int i, g5_error *err);
g5_status gm_side_end(gl_rank *rk, g5_error *err);
g5_status gm_side_wait(gl_rank *rk, int i, g5_error *err);
void gm_side_reset(gl_rank *rk);
/* Work on the rank's third stream, beside the main chain and the side work: what is queued
 * between gm_aux_begin and gm_aux_end runs after all that the main stream held at gm_aux_begin
 * (and after the third stream's earlier work, where no gm_aux_wait came between); gm_aux_wait
 * makes the main stream wait for all of it (before the stage ends). Only while no
 * side work is being queued; aux work quantizes nothing (no int8 buffer half of its own: q8_dst
 * refuses) and never uses rk->xb. Off (rk->aux stays 0: the caller queues the work in order)
 * where `on` is 0, under the profiler or without a third stream. gm_side_reset puts it back too. */
g5_status gm_aux_begin(const rt_gpu_model *g, gl_rank *rk, int on, g5_error *err);
g5_status gm_aux_end(gl_rank *rk, g5_error *err);
g5_status gm_aux_wait(gl_rank *rk, g5_error *err);
/* 1: a batched step of n rows runs the multi-sequence attention and indexer launches on rank rk
 * in every layer (gm_attn_stage takes them where rk->multi is set; every layer's, whether it has
 * an indexer or not, where this holds). */
int gm_attn_multi(const rt_gpu_model *g, const gl_rank *rk, uint32_t n);
g5_status gm_attn_stage(rt_gpu_model *g, gl_rank *rk, uint32_t il, const fplan *pl, g5_error *err);
g5_status gm_ffn_stage(rt_gpu_model *g, gl_rank *rk, uint32_t il, uint32_t n, g5_error *err);
/* The device work of one forward call after the token and position uploads (gpu_model.c). With
 * `graph` GM_DEV_GRAPH (one token, no debugging outputs, g->graph_bound set) it only enqueues on
 * the ranks' streams, which are being captured, and leaves the logits in each rank's rk->lg;
 * GM_DEV_BODY (a batched step being captured: no debugging outputs) it stops after the final
 * norm, and gm_forward_head runs the head after the replay. */
enum { GM_DEV_PLAIN = 0, GM_DEV_GRAPH = 1, GM_DEV_BODY = 2 };
g5_status gm_forward_device(rt_gpu_model *g, const fplan *pl, const rt_gpu_outputs *out, int graph, g5_error *err);
/* forward_device's head (the head GEMVs, logits copies, argmax, draws), launched plainly. */
g5_status gm_forward_head(rt_gpu_model *g, const fplan *pl, const rt_gpu_outputs *out, g5_error *err);
/* out->argmax on rank rk: the argmax of the c logits rows in rk->lg into rk->ami / amv at row0
 * (rows counted from the call's first logits row); then, after the last, the rank's `rows`
 * entries copied to g->amh_i / amh_v (staged for that many rows by forward_plan). */
g5_status gm_head_argmax(gl_rank *rk, uint32_t row0, uint32_t c, g5_error *err);
g5_status gm_head_argmax_out(rt_gpu_model *g, gl_rank *rk, uint32_t rows, g5_error *err);
/* out->draw on rank rk (the one holding the whole head): rows row0 .. row0 + c of g->drh
 * uploaded and drawn from the c logits rows in rk->lg (cuk_sample) into rk->dri at row0; then,
 * after the last, the `rows` tokens copied to g->amh_i. */
g5_status gm_head_draw(rt_gpu_model *g, gl_rank *rk, uint32_t row0, uint32_t c, g5_error *err);
g5_status gm_head_draw_out(rt_gpu_model *g, gl_rank *rk, uint32_t rows, g5_error *err);

/* ---- the decode step as a CUDA graph (gpu_graph.c) ---- */

/* graph_bound of a step of a sequence at key count P (its capacity cap >= P): the power of
 * two >= P (at least GM_GRAPH_MIN_BOUND) up to GM_GRAPH_STEP_FROM, above it the multiple of
 * GM_GRAPH_STEP >= P; at most cap. */
/* Tokens per routed-expert call on the decode (GEMV) path: n_used pairs each stay within
 * CUK_MOE_PLAN_MAX_PAIRS (top_k <= 64) and rk->mpart is sized for this many tokens. */
#define GM_MOE_CHUNK 64u
#define GM_GRAPH_MIN_BOUND 1024u
#define GM_GRAPH_STEP_FROM 16384u
#define GM_GRAPH_STEP 8192u
uint32_t gm_graph_bound(uint32_t P, uint32_t cap);
/* The one-token step pl (work buffers reserved for `bound` = gm_graph_bound(..) scores, token and
 * position uploaded) as a launch of g->graph, captured first only when what it was captured for
 * changed; then the logits (out->logits) and hidden state copies on the ranks' streams. */
g5_status gm_forward_graph(rt_gpu_model *g, const fplan *pl, uint32_t bound, const rt_gpu_outputs *out,
                           g5_error *err);
/* A batched step of n = pl->n rows, one a sequence or several of one at consecutive positions
 * (2 <= n <= GM_RGRAPH_MAX; every rank's rk->multi = bound = gm_graph_bound(its largest key count,
 * UINT32_MAX), work buffers reserved for n * bound scores, tokens, positions and rk->mrows
 * uploaded): its layers and final norm as a launch of g->rgraph[n], captured first only when
 * what it was captured for changed (the sequences are not: the attention reads their caches and
 * positions from rk->mrows); then the hidden state copy and gm_forward_head. */
g5_status gm_forward_graph_rows(rt_gpu_model *g, const fplan *pl, uint32_t bound, const rt_gpu_outputs *out,
                                g5_error *err);
void gm_graph_free(rt_gpu_model *g); /* g->graph and g->rgraph, each rank's executable graphs */
/* ---- processes and collectives (gpu_coll.c) ---- */

/* rk[i].dev for each local rank, g->coll and info.n_devices, by the rules of gpu_model.h
 * ("Processes and devices"); ndev devices visible, device0 the first to use. Local: no
 * exchange. */
g5_status gm_coll_place(rt_gpu_model *g, const rt_gpu_opts *opts, int ndev, g5_error *err);
/* Several processes: every process learns the others' status so far (st: this one's) and the
 * GPUs of all ranks; fails alike on all of them when one failed or two ranks share a GPU (which
 * NCCL refuses). One process: returns st. */
g5_status gm_coll_agree_devices(rt_gpu_model *g, g5_status st, g5_error *err);
/* The same after loading (st: this process's), and then: the loader's report and the byte
 * counts of info summed over the processes (seconds: the slowest), the logits columns of each
 * process (g->vcol, checked to tile the vocabulary). One process: returns st. */
g5_status gm_coll_agree_load(rt_gpu_model *g, g5_status st, g5_error *err);
/* logits [rows][n_vocab] (host) hold this process's columns of each row: the other processes'
 * columns are exchanged so that every process holds whole rows. Nothing at one process. Every
 * process calls it with the same rows. */
g5_status gm_coll_gather_logits(rt_gpu_model *g, float *logits, uint32_t rows, g5_error *err);
/* ids / vals [rows] hold the argmax over this process's columns (-1 where it has none): every
 * process gets the whole rows' argmax (larger logit, then lower id). Nothing at one process. */
g5_status gm_coll_gather_argmax(rt_gpu_model *g, int32_t *ids, float *vals, uint32_t rows, g5_error *err);
/* One candidate (id >= 0, logit v) into a running argmax (*best, -1 while empty; *bv): cuk_argmax's
 * rule, the larger logit, then the lower id, so partial results combine in any order. */
static inline void gm_argmax_take(int64_t *best, float *bv, int64_t id, float v) {
    if (id >= 0 && (*best < 0 || v > *bv || (v == *bv && id < *best))) *best = id, *bv = v;
}
#ifdef G5_HAVE_NCCL
/* The library and its symbols; process 0 makes the unique id. Local. */
g5_status gm_nccl_open(rt_gpu_model *g, g5_error *err);
/* Process 0's unique id to all (rt_comm_bcast), then each local rank's communicator: rank
 * g->first + r of g->T_all (ncclCommInitRank, all local ranks in one group). Collective. */
g5_status gm_nccl_init(rt_gpu_model *g, g5_error *err);
#endif
/* One rank's GPU as the processes compare them: the same UUID is the same GPU; a device without
 * one (all zero) is compared by host name and PCI bus id. */
typedef struct gm_dev_id {
    uint8_t uuid[16];
    char bus[16];                    /* "dddd:bb:dd.f" */
    char host[64];
} gm_dev_id;
/* 1 and the first pair i < j of ids[0 .. n) on one GPU, or 0 when they all differ. */
int gm_coll_same_gpu(const gm_dev_id *ids, uint32_t n, uint32_t *i, uint32_t *j);
/* Process p writes columns [lo[p], lo[p] + w[p]): these must tile [0, V) in process order
 * (processes writing nothing anywhere). G5_ERR_MODEL naming the first gap or overlap. */
g5_status gm_coll_vocab_check(const uint32_t *lo, const uint32_t *w, uint32_t P, uint32_t V, g5_error *err);

/* The partial outputs summed over the ranks and added to every rank's residual stream (at one
 * rank: recorded as the pending add of the next norm). dbg: rank 0's sum, host, or NULL. */
g5_status gm_collective(rt_gpu_model *g, uint32_t n, float *dbg, g5_error *err);

#endif
