/* Internals of the CUDA model shared by runtime/gpu_model.c (setup, stages, forward) and
 * runtime/gpu_debug.c (the benchmark and profiling hooks of gpu_model.h): the device-side
 * structures and the stage functions. Not an API: nothing outside those two files includes it.
 * Built only with G5_WITH_CUDA. */
#ifndef G5_RT_GPU_INT_H
#define G5_RT_GPU_INT_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "cuda/cuk.h"
#include "cuda/cuk_model.h"
#include "gpu_linear.h"
#include "gpu_model.h"
#include "model_impl.h"

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
    dmat idx_q_b, idx_k, idx_proj;
    dmat ffn_gate, ffn_up, ffn_down, router;
    uint32_t exp_type, exp_down_type;
    const void *exp_gate, *exp_up, *exp_down;        /* [n_exp_l][ffe_l or E][row] */
    dmat sh_gate, sh_up, sh_down;
    int sh_contrib;
    uint32_t sh_l;
} gl_layer;

/* Host range [h, h + n) of the weight set is at d on the device. */
typedef struct seg {
    const uint8_t *h;
    uint64_t n;
    uint8_t *d;
} seg;

typedef struct gl_rank {
    uint32_t r;
    int dev;
    cudaStream_t st;
    int own_stream;
    const rt_rank *c;                /* the CPU model's rank */
    void *wmem;                      /* all tensor data, one allocation */
    uint64_t wbytes;
    uint8_t *xmem;                   /* float32 extras */
    uint64_t xcap, xoff;
    seg *segs;
    uint64_t n_segs;
    gl_layer *L;                     /* [n_layer_main] */
    dmat tok_embd, head;
    uint32_t head_col0;
    int head_write;
    const float *out_norm;
    int fast;                        /* bf16 inputs to the weight products (RT_GPU_BF16ACT only) */
    /* work buffers for up to ncap tokens */
    void *work;
    uint32_t ncap;
    float *x, *h, *part, *red, *qr, *kv, *q, *qlat, *olat, *ao, *iq, *iw;
    float *ga, *gb, *gu, *moe, *rl, *wts, *wts_l, *lg;
    /* The residual adds are folded into the RMSNorm that reads x next (cuk_add_rms_norm): a
     * stage leaves its output as oa (+ ob: the routed and the shared experts, one device only),
     * the collective turns it into the pending addends pa (+ pb) that x still lacks. */
    float *oa, *ob, *pa, *pb;
    float *latf;                     /* [n][KVW] new latents before conversion (non-f32 cache) or
                                        before the copy into each sequence's cache (batches) */
    float *ikf;                      /* [n][ID] new indexer keys of a batch, before the copies */
    int batch_rows;                  /* a batched decode step is running: GEMV launches use only
                                        widths whose kernel family is that of one row (gemv_k) */
    void *xb;                        /* bf16 copies of product inputs (fast mode) */
    gl_lin *lin;                     /* the prefill GEMM path: cuBLAS handle, scratch */
    int32_t *ids, *ids_l, *sel, *n_sel, *tok, *pos;
    float *sc;                       /* [n][P] indexer scores */
    uint64_t sc_cap;
#ifdef G5_HAVE_NCCL
    ncclComm_t comm;
#endif
} gl_rank;

#ifdef G5_HAVE_NCCL
typedef struct nccl_api {
    void *lib;
    ncclResult_t (*comm_init_all)(ncclComm_t *, int, const int *);
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                               cudaStream_t);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
    ncclResult_t (*comm_destroy)(ncclComm_t);
    const char *(*error_string)(ncclResult_t);
} nccl_api;
#endif

struct rt_gpu_model {
    const rt_model *cpu;
    glm5_hparams hp;
    uint32_t T;
    gl_rank *rk;
    int coll;
    uint32_t lat_type;               /* CUK_F32, CUK_BF16, CUK_F16 */
    uint32_t lat_es;                 /* its element size */
    rt_gpu_seq *def;                 /* rt_gpu_forward's sequence */
    cudaGraphExec_t gexec;           /* the decode step's executable graph (opts.cuda_graph) */
    rt_gpu_info info;
    struct gprof *prof;              /* sub-step events while rt_gpu_debug_profile runs, else NULL */
#ifdef G5_HAVE_NCCL
    nccl_api nccl;
#endif
};

/* One rank's caches of a sequence. */
typedef struct seq_rank {
    void *lat;                       /* [Lm][cap][KVW] latents of the model's lat_type */
    float *idxk;                     /* [Lm][cap][ID] indexer keys */
} seq_rank;

struct rt_gpu_seq {
    rt_gpu_model *g;
    uint32_t n_past, cap;
    seq_rank *rk;                    /* [T] */
};

#define CU(call)                                                                              \
    do {                                                                                      \
        cudaError_t ce_ = (call);                                                             \
        if (ce_ != cudaSuccess)                                                               \
            return g5_fail(err, G5_ERR_INTERNAL, "%s:%d: %s: %s", __FILE__, __LINE__, #call,  \
                           cudaGetErrorString(ce_));                                          \
    } while (0)
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
} gprof;

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

/* Records a sub-step mark (g->prof set: rt_gpu_debug_profile is running). */
void gm_prof_mark(const rt_gpu_model *g, const gl_rank *rk, const char *stage, const char *label);
#define PMARK(stage, label)                                                                   \
    do {                                                                                      \
        if (g->prof) gm_prof_mark(g, rk, (stage), (label));                                   \
    } while (0)

double gm_now_s(void);
uint64_t gm_lat_w(const glm5_hparams *hp);
/* Sequence s's latent cache ([cap][lat_w] of the model's cache type) and indexer keys
 * ([cap][idx_head_dim] float32) of layer il on rank r. */
uint8_t *gm_seq_lat(const rt_gpu_model *g, const rt_gpu_seq *s, uint32_t r, uint32_t il);
float *gm_seq_idxk(const rt_gpu_model *g, const rt_gpu_seq *s, uint32_t r, uint32_t il);
/* Grows s to hold at least `need` positions (contents kept). */
g5_status gm_seq_need(rt_gpu_seq *s, uint32_t need, g5_error *err);
/* rk->h = RMSNorm(x) * w over n rows, the pending residual add folded in first. */
g5_status gm_norm_x(gl_rank *rk, const float *w, uint32_t n, int64_t E, float eps, g5_error *err);
g5_status gm_gemv(const gl_rank *rk, const dmat *W, const float *x, int64_t ldx, uint32_t n, float *y,
                  int64_t ldy, g5_error *err);
g5_status gm_attn_stage(rt_gpu_model *g, gl_rank *rk, uint32_t il, const fplan *pl, g5_error *err);
g5_status gm_ffn_stage(rt_gpu_model *g, gl_rank *rk, uint32_t il, uint32_t n, g5_error *err);
/* The partial outputs summed over the ranks and added to every rank's residual stream (at one
 * rank: recorded as the pending add of the next norm). dbg: rank 0's sum, host, or NULL. */
g5_status gm_collective(rt_gpu_model *g, uint32_t n, float *dbg, g5_error *err);

#endif
