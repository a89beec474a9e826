/* The prefill GEMM path of the GPU forward pass (internal to runtime/gpu/gpu_model.c; the GPU tests
 * call it directly to time it against the GEMV kernels).
 *
 * A forward call of one sequence with many tokens runs each weight product as a GEMM: the
 * weight (quantized in ggml layout) is dequantized in row chunks into a float32 (precise) or fp16
 * (fast) scratch tile bounded by opts.gemm_tile_kb and multiplied by cuBLAS. Weights already
 * stored in the compute's type are used in place. The routed experts are grouped by expert:
 * precise mode gathers each local expert's tokens, runs gate/up GEMMs, SwiGLU and the down GEMM
 * and adds them back weighted, experts in ascending order, which (the router's ids being
 * ascending per token) is each token's slot order; fast mode does the same with one compact row
 * list for all experts, a batch of experts' weights dequantized per launch and one combine.
 * Fast mode also runs the attention, the indexer scores, the MLA absorption and W_UV of a prompt
 * as products (the functions at the end; specs/numerics.md "Fast mode: the tensor-core
 * prefill").
 *
 * One gl_lin per rank, made on the rank's device for the rank's stream; it owns the rank's
 * cuBLAS handle and its scratch buffers (grown on demand, never shrunk, freed with it). Built
 * only with CUDA (G5_WITH_CUDA). */
#ifndef G5_RT_GPU_LINEAR_H
#define G5_RT_GPU_LINEAR_H

#include <stdint.h>

#include "cuda/cuk.h"
#include "cuda/cuk_model.h"
#include "runtime/gpu/gpu_model.h"

typedef struct gl_lin gl_lin;

/* The resolved options; the same for every rank. */
typedef struct gl_lin_cfg {
    uint32_t mode;               /* CUK_GEMM_* for products whose inputs may be rounded */
    int64_t min_tokens;          /* calls of at least this many tokens; 0: the path is off */
    int64_t min_rows_expert;     /* experts with fewer rows run the GEMV kernels */
    uint64_t tile_bytes;         /* bound of each dequantized weight tile */
} gl_lin_cfg;

/* opts (precision, gemm, gemm_min, gemm_min_expert, gemm_tile_kb) into c; a gemm compute other
 * than DEFAULT, F32 or F16 is G5_ERR_INVALID_ARG. */
g5_status gl_lin_cfg_resolve(const rt_gpu_opts *o, gl_lin_cfg *c, g5_error *err);
const char *gl_lin_mode_name(uint32_t mode); /* "f32", "f16" */

/* On the current device, for work on `stream`. info (may be NULL) receives the counters. */
g5_status gl_lin_create(const gl_lin_cfg *c, cuk_stream stream, rt_gpu_info *info, gl_lin **out,
                        g5_error *err);
void gl_lin_free(gl_lin *l); /* accepts NULL; its device must be current */

/* The path is taken only while armed (the single-sequence forward call arms it; decode
 * batches never do, so their rows stay bit-identical to single-token calls). */
void gl_lin_arm(gl_lin *l, int on);

/* 1 if a product over n rows should take the GEMM path now: armed, n >= min_tokens, and the
 * stream is not being captured into a CUDA graph (the MoE path reads counts on the host). */
int gl_lin_use(const gl_lin *l, int64_t n);

/* A weight matrix on the device: m rows of k elements of ggml type `type`. */
typedef struct gl_wmat {
    uint32_t type;
    const void *w;
    int64_t k, m;
} gl_wmat;

/* y[t][0..m) = W x[t] for t < n (y overwritten). keep_f32: the F32 compute whatever the mode
 * (router and indexer inputs). x: [n][ldx] float32, y: [n][ldy]. */
g5_status gl_lin_matmul(gl_lin *l, const gl_wmat *w, const float *x, int64_t ldx, int64_t n, float *y,
                        int64_t ldy, int keep_f32, g5_error *err);

/* The routed experts of one rank:
 *   y[t] = sum over the slots s of token t whose expert e_s is local (exp0 <= e_s < exp0 + n_local),
 *          in ascending expert order, of wts[t][s] * Wd[e_s] (silu(Wg[e_s] x_t) * (Wu[e_s] x_t)),
 * with y = 0 for a token that chose no local expert. Synchronizes the stream once (the per-expert
 * token counts are read on the host). */
typedef struct gl_moe_args {
    uint32_t gu_type, down_type;
    const void *w_gate, *w_up;   /* [n_local][FE][row] of gu_type */
    const void *w_down;          /* [n_local][E][row] of down_type */
    int64_t E, FE;
    int32_t n_expert;            /* all experts of the model */
    int32_t exp0, n_local;
    const int32_t *ids;          /* [n][top_k] global expert ids (cuk_moe_route), device */
    const float *wts;            /* [n][top_k] routing weights, device */
    int32_t top_k;
    const float *x;              /* [n][ldx] */
    int64_t ldx;
    int64_t n;
    float *y;                    /* [n][ldy] */
    int64_t ldy;
} gl_moe_args;

g5_status gl_lin_moe(gl_lin *l, const gl_moe_args *a, g5_error *err);

/* ---- fast mode (fp16 compute): the attention and indexer of a prompt on tensor cores ---- */

/* 1 if the products run in fp16 (fast mode): the attention/indexer functions below apply. */
int gl_lin_fast(const gl_lin *l);

/* cuk_mla_absorb (same arguments) as one batched TF32 product over the heads (float32 q and
 * kv_b). */
g5_status gl_lin_absorb(gl_lin *l, const cuk_mla_absorb_args *a, g5_error *err);

/* ao[t][h][0..v_head) = W_UV[h] olat[t][h] for t < n, h < n_head: one batched TF32 product.
 * kvb_uv: head 0's first W_UV row ([v_head][kv_lora] float32), head h at + h * head_stride;
 * olat: [n][n_head][kv_lora]; ao: [n][n_head][v_head]. */
g5_status gl_lin_wuv(gl_lin *l, const float *kvb_uv, int64_t head_stride, int32_t n_head, int64_t kv_lora,
                     int64_t v_head, const float *olat, int64_t n, float *ao, g5_error *err);

/* cuk_idx_scores' result (same arguments) from TF32 products in chunks of tokens, then the
 * ReLU-weighted head sum in float32 (cuk_idx_reduce). */
g5_status gl_lin_idx_scores(gl_lin *l, const cuk_idx_scores_args *a, g5_error *err);

/* cuk_mla_attend_fresh's result for one sequence (same arguments; its query tokens are the last
 * d.n_tok of the n_pos positions) on the tensor cores: keys and queries packed to fp16 once, then
 * the fused kernel cuk_mla_flash (fp16 products with float32 sums, a float32 online softmax over
 * each query's selected keys; cuda/cuk_prefill.h). */
g5_status gl_lin_mla_attend(gl_lin *l, const cuk_mla_attend_args *a, g5_error *err);

#endif
