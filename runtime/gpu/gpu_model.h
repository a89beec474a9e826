/* The GLM-5 forward pass on CUDA GPUs, mirroring the CPU reference (model.h) stage for stage.
 *
 * A GPU model is built from a CPU model (rt_model) through its public tensor table
 * (runtime/cpu/model_tensors.h: that model already found and checked every tensor of every rank
 * against the hyperparameters and the shard layout), and the CPU model stays the numerical
 * reference (rt_gpu_check, `glm5-run --check`). The weights go to the GPU once per rank: from
 * the files of the blob set the weight set already holds open (opts.blobs, rt_wset_blobs) by the
 * checksumming reader threads (gpu_load.h), or, for a GGUF or tables source, copied from the
 * weight set's host memory. Programs create it through the engine (runtime/engine.h). Norm weights and the router bias
 * (dequantized by the CPU model) and attn_kv_b as float32 (for the query absorption) are small
 * extra copies beside them.
 *
 * Tensor parallelism: the GPU model runs the CPU model's ranks: all T of them, or, under a
 * launcher (rt_model_comm of size P > 1), this process's T / P ranks, global ranks
 * first .. first + T / P - 1 (model.h "Processes"). Each rank computes the replicated parts
 * (norms, q_a, kv_a, the indexer, the router) itself, its own heads of the attention and its
 * share of the FFN/experts; the partial outputs of the attention output projection and of the
 * FFN/MoE down projections are summed over the ranks (NCCL all-reduce when the ranks have
 * devices of their own; a sum in rank order on the device when they share one, which is what
 * lets a TP set run, and be tested, on a single GPU) and added to every rank's residual stream.
 * The vocabulary-split lm_head is gathered on the host; with several processes each process's
 * columns then go to the others (rt_comm_allgatherv), so logits are whole on every process, and
 * so are the other outputs, which every rank holds alike after the all-reduces. NCCL sums in its
 * own order: the device-side sum and the CPU model are matched within float32 rounding, not bit
 * for bit.
 * opts.collective = RT_GPU_COLL_NCCL (glm5-run --collective nccl) runs a one-rank model through a
 * one-rank NCCL communicator (the only way to run the NCCL path where one GPU is available).
 *
 * Processes and devices (n_gpus: the CUDA devices this process sees; i: a local rank):
 *  - One process (no launcher, or P = 1): rank i on device (device0 + i) % n_gpus. T = 1: no
 *    collective; all T on one device when n_gpus = 1 (device-side sum); T <= n_gpus: NCCL, one
 *    GPU per rank; otherwise refused.
 *  - Several processes (`mpirun -np P` / `srun -n P`, T % P == 0): always NCCL, one GPU per rank.
 *    Local rank i of the process with node-local index L (rt_comm_local_rank) runs on device
 *    (device0 + L * T / P + i) % n_gpus, which serves both usual layouts: one process per GPU
 *    seeing only its own GPU (CUDA_VISIBLE_DEVICES, `srun --gpus-per-task=1`: device 0) or
 *    seeing all of the node's GPUs (device L), and one process per node driving its T / P GPUs.
 *    A process with more ranks than GPUs is refused, and so is a placement that puts two ranks
 *    of any processes on one GPU (GPU UUIDs compared across processes at creation), before any
 *    weight is loaded. Process 0 makes the NCCL unique id; rt_comm_bcast gives it to the others;
 *    each rank joins the T-rank communicator under its global index (ncclCommInitRank). Each
 *    process loads only its ranks' blobs (blob_set_open_ranks); with opts.cuda_graph and one
 *    rank per process each rank's decode step is its own CUDA graph (rt_gpu_forward), NCCL's
 *    all-reduces inside, captured on every process at once (run on one GPU with a one-rank
 *    communicator; not yet across GPUs). A process driving several NCCL ranks runs plain
 *    launches (NCCL documents one thread launching several communicators' graphs as able to
 *    deadlock, and that case has not run).
 *    rt_gpu_model_create and every forward call are collective: all processes make them in the
 *    same order with the same arguments. When one process fails at creation the others fail too
 *    (the status is exchanged after placing and after loading). What has run: one process with
 *    one GPU (device-side sum, one-rank NCCL); several GPUs or processes have not (one GPU lent).
 *
 * Precision policy (specs/numerics.md has the reasoning and the measurements). Every mode
 * accumulates in float32 (softmax sums in double) and keeps the residual stream, the norms, the
 * router and the DSA indexer (its q/k/weight projections, the k LayerNorm, its key cache, the
 * scores and the top-k) in float32; weights are dequantized inside the kernels.
 *   RT_GPU_PRECISE  float32 inputs to every weight product, float32 latent cache.
 *   RT_GPU_FAST     the same arithmetic, latent cache in f16 by default (bf16 or f32 on request:
 *                   half the cache bytes read per decoded token). Within one forward call the
 *                   attention reads the call's own tokens from their float32 latents and only
 *                   earlier calls' tokens from the cache, so a prompt's prefill is the precise
 *                   result whatever the cache type; each later call reads them rounded. The
 *                   product inputs stay float32 because the decode GEMVs are bound by weight
 *                   bytes, not by the input vector (a few KB against megabytes of weights), while
 *                   rounding it to bf16 cost 3e-3 relative per stage, enough on the oracle's
 *                   random model to flip near-tied indexer/router choices (argmax 0.89-0.98
 *                   instead of >= 0.99 on prompt 1).
 *   RT_GPU_BF16ACT  that former fast mode, kept for measurement: product inputs rounded to bf16
 *                   (attention, experts, dense FFN, lm_head; not q_a of indexer layers, whose
 *                   output qr feeds the indexer), cache as RT_GPU_FAST. Not reachable from the CLI.
 * Prefill GEMM path (opts.gemm_min, opts.gemm; runtime/gpu/gpu_linear.h): a single-sequence call of
 * at least gemm_min tokens (default 32) dequantizes each weight in row chunks into a scratch
 * tile and multiplies with cuBLAS, the routed experts grouped by expert. Precise mode: float32
 * weights and inputs, CUBLAS_COMPUTE_32F_PEDANTIC (no TF32), so it differs from the GEMV path
 * only by summation order. Fast and bf16act modes (the default compute, opts.gemm F16): weights
 * and inputs rounded to fp16, float32 accumulation on the tensor cores; there the indexer scores
 * (TF32 products, float32 sums and top-k), the MLA absorption and W_UV (TF32) and the attention
 * (fp16 products, float32 softmax) run as products too (specs/numerics.md "Fast mode"). The
 * router and the indexer's projections run in float32 (pedantic) in every mode. Decode
 * steps, CUDA-graph captures and batched decode (rt_gpu_forward_batch) keep the GEMV kernels.
 *
 * Everything here is built only with CUDA (cuda/model.mk defines G5_WITH_CUDA). One caller at a
 * time. A sequence's state (its caches, its position) is an rt_gpu_seq; the model holds a
 * built-in default one for rt_gpu_forward, and more can be created for batched decoding
 * (rt_gpu_forward_batch). The NextN/MTP block runs as rt_model_mtp does (rt_gpu_mtp, below). */
#ifndef G5_RT_GPU_MODEL_H
#define G5_RT_GPU_MODEL_H

#include <stdint.h>
#include <stdio.h>

#include "runtime/gpu/gpu_load.h"
#include "cuda/cuk_sample.h"
#include "runtime/cpu/model.h"

typedef struct rt_gpu_model rt_gpu_model;

typedef enum rt_gpu_precision { RT_GPU_PRECISE = 0, RT_GPU_FAST = 1, RT_GPU_BF16ACT = 2 } rt_gpu_precision;

/* Latent cache storage; DEFAULT: f32 when precise, f16 when fast. */
typedef enum rt_gpu_cache {
    RT_GPU_CACHE_DEFAULT = 0, RT_GPU_CACHE_F32, RT_GPU_CACHE_BF16, RT_GPU_CACHE_F16
} rt_gpu_cache;

/* Compute of the prefill GEMM path's weight products (specs/numerics.md "Prefill GEMM"):
 * F32 float32 (cuBLAS pedantic), F16 weights and inputs rounded to fp16, float32 accumulation.
 * (TF32 and bf16 variants were measured and withdrawn: bench/RESULTS.md.) */
typedef enum rt_gpu_gemm {
    RT_GPU_GEMM_DEFAULT = 0, RT_GPU_GEMM_F32, RT_GPU_GEMM_F16 = 4
} rt_gpu_gemm;

/* The collective between ranks. AUTO: none for one rank, the device-side sum when all ranks share
 * one GPU, NCCL across GPUs or processes. NCCL: NCCL also for a single rank (a one-rank
 * communicator: the NCCL path tested on one GPU); ranks sharing one GPU are then refused. */
typedef enum rt_gpu_coll { RT_GPU_COLL_AUTO = 0, RT_GPU_COLL_NCCL = 1 } rt_gpu_coll;

typedef struct rt_gpu_opts {
    int device0;                 /* first CUDA device */
    rt_gpu_coll collective;      /* default AUTO */
    rt_gpu_precision precision;
    rt_gpu_cache cache;
    /* The prefill GEMM path: a forward call of one sequence with at least gemm_min tokens runs
     * its weight products as dequantize-to-scratch + cuBLAS GEMM, the routed experts grouped
     * by expert; decode steps (and batched decode) keep the GEMV kernels. */
    int gemm_min;                /* tokens from which a call uses it; 0: default (32); < 0: never */
    int gemm_min_expert;         /* within the grouped experts, an expert with fewer rows than
                                    this runs the GEMV kernels on its gathered rows; 0: default
                                    (32); < 0: every expert so */
    rt_gpu_gemm gemm;            /* fast and bf16act modes; precise is always F32. DEFAULT: F16
                                    (F32 only for measurement). The router and the indexer
                                    projections are F32 in every mode. */
    uint32_t gemm_tile_kb;       /* bound of the dequantized weight tile per rank (weights
                                    are dequantized in row chunks that fit); 0: 262144 (256 MB) */
    const blob_set *blobs;       /* the open blob set the CPU model's weight set was opened
                                    from (rt_wset_blobs): its files are loaded by the reader
                                    threads (checksums per opts.load), never opened again;
                                    NULL: copy from the weight set's host memory */
    rt_gpu_load_opts load;
    int cuda_graph;              /* 1: single-token calls (decode steps) run as one CUDA graph
                                    launch (see rt_gpu_forward), batched steps (rt_gpu_forward_rows,
                                    up to 64 rows) as one launch of a graph per row count; 0
                                    (default): plain launches */
    /* 1: fast mode's two-plane products (q_b, the indexer's q_b, attn_output, the dense FFN) take
     * fp16 rows on the tensor cores wherever their weights have that kernel (Q4_K, Q5_K:
     * cuda/cuk_h16.h), at every row count: a batched step reads each weight once for all its rows
     * (the peer model's batch-32 step 15.41 -> 13.21 ms on the H100), a one-token step is slower
     * (2.84 -> 3.14 ms), and a row's bits do not depend on the batch either way. What a serving
     * engine that batches wants (glm5-serve with --max-batch > 1); 0 (default): two int8 planes,
     * the fastest one-token steps. Ignored in precise and bf16act modes. */
    int h16_products;
} rt_gpu_opts;

void rt_gpu_opts_default(rt_gpu_opts *o);

typedef struct rt_gpu_info {
    uint32_t n_ranks, n_devices;   /* of the run: T, and the GPUs all processes use */
    uint32_t n_local_ranks;        /* this process's ranks (n_ranks with one process) */
    uint32_t n_processes;
    const char *collective;      /* "none", "device-sum" (ranks share a device) or "nccl" */
    const char *precision;       /* "precise", "fast" or "bf16act" */
    const char *cache;           /* latent cache type: "f32", "bf16", "f16" */
    int h16_products;            /* opts.h16_products in fast mode */
    int cuda_graph;              /* decode steps replayed as CUDA graphs (opts.cuda_graph, and
                                    not several NCCL ranks in this process) */
    uint64_t graph_steps;        /* forward calls that ran as a graph launch */
    uint64_t graph_captures;     /* of those, how many recorded the step first (the first, then one
                                    per change of bucket, sequence or buffers; the rest replay) */
    uint64_t graph_instantiations; /* captures instantiated (each rank's executable graph; no
                                    update in place: runtime/gpu/gpu_graph.c says why) */
    uint64_t graph_nodes;        /* nodes of the last captured step's graph on its first rank:
                                    the step's kernels, copies and memsets, i.e. its launches */
    int draws;                   /* rt_gpu_outputs.draw is served: one process, one rank holding
                                    the whole output head */
    const char *gemm;            /* the prefill GEMM path's compute: "f32", "f16" */
    int gemm_min, gemm_min_expert; /* resolved thresholds (gemm_min 0: the path is off) */
    uint64_t gemm_calls;         /* cuBLAS GEMMs run so far (all ranks) */
    uint64_t gemm_expert_gemv;   /* grouped experts run by GEMV (fewer rows than gemm_min_expert) */
    char device_name[256];
    uint64_t weight_bytes;       /* all ranks, the loaded tensor data */
    uint64_t extra_bytes;        /* float32 copies (norms, biases, kv_b), kv_b's exact int8 form */
    uint32_t kvb_exact_layers;   /* layers (summed over this process's ranks) whose decode W_UK /
                                    W_UV read kv_b's exact int8 form (cuk_kvb_exact: attn_k_b and
                                    attn_v_b present, of types with one, every value proved equal) */
    rt_gpu_load_stats load;      /* summed over ranks (seconds: wall time of all loads; with
                                    several processes the slowest process's; these and the byte
                                    counts above cover all processes) */
} rt_gpu_info;

/* A GPU model of the CPU model's ranks in this process (opts NULL: rt_gpu_opts_default).
 * The environment is the program's: a program that may run opts.cuda_graph under NCCL (a
 * one-rank communicator, or one rank per process under mpirun) sets NCCL_GRAPH_MIXING_SUPPORT=0
 * before the first rt_gpu_model_create, keeping a value the user gave: NCCL reads it when a
 * communicator is made. Why: NCCL's default mode keeps
 * graph-captured and plain collectives outstanding at once correct, and is documented as able to
 * deadlock when one thread launches the graphs of several communicators; every forward call here
 * ends with each rank's stream synchronized, so no two collectives are ever outstanding and the
 * stream-ordered mode (0) serves. glm5-run (runtime/cli/main_run.c) and tests/gpu/test_gpu_graph
 * do so. */
g5_status rt_gpu_model_create(const rt_model *cpu, const rt_gpu_opts *opts, rt_gpu_model **out,
                              g5_error *err);
void rt_gpu_model_free(rt_gpu_model *g); /* accepts NULL */
/* Page-locked host memory of `bytes` (NULL when it cannot be had): the destination of a forward
 * call's logits or hidden rows copies straight from the device, where pageable memory goes
 * through the driver's staging buffer at a fraction of the rate (20 MB of logits per batched step
 * of 32 sequences). rt_gpu_host_free accepts NULL. */
void *rt_gpu_host_alloc(size_t bytes);
void rt_gpu_host_free(void *p);
const rt_gpu_info *rt_gpu_model_info(const rt_gpu_model *g);

void rt_gpu_reset(rt_gpu_model *g);
uint32_t rt_gpu_n_past(const rt_gpu_model *g);

/* What a forward call writes (any pointer may be NULL); host memory. */
typedef struct rt_gpu_outputs {
    float *logits;               /* all_logits ? [n][n_vocab] : [n_vocab] (last token) */
    int all_logits;
    float *hidden;               /* [n][n_embd] final-normed hidden states */
    /* The rows' (all_logits ? n : 1) argmax over the vocabulary, computed on the devices: the
     * largest logit, the lowest id on ties, NaN never (-1 for a row of NaN), and that logit (NaN
     * then): what a greedy draw takes, for 8 bytes a row instead of the row's logits (logits may
     * be NULL). Both or neither. */
    int32_t *argmax;
    float *argmax_logit;
    /* The rows' token draws made on the device where rt_gpu_info.draws (cuda/cuk_sample.h: the
     * host sampler's chain for what samp_device_row admits, the same token): draw[i] describes
     * row i's draw (samp_dev_row's fields), draw_ids[i] receives its token (-1 for a row with no
     * logit > -inf, which the sampler refuses). Both or neither; not with argmax. */
    const cuk_sample_row *draw;
    int32_t *draw_ids;
    const int32_t *draw_pen_ids;      /* the rows' penalized ids (ascending within a row) and counts, */
    const uint32_t *draw_pen_counts;  /* draw[i].pen_off and .n_pen indexing them (draw_n_pen in all) */
    uint32_t draw_n_pen;
    /* Debugging and --check (rank 0's view; all ranks hold the same after each all-reduce): */
    float *layer_hidden;         /* [n_layer_main + 1][n][n_embd], as rt_outputs.layer_hidden */
    float *attn_out;             /* [n_layer_main][n][n_embd]: attention output summed over ranks */
    float *ffn_out;              /* [n_layer_main][n][n_embd]: FFN/MoE output summed over ranks */
    int32_t *topk;               /* [n_layer_main][n][idx_top_k], as rt_outputs.topk */
    int32_t *experts;            /* [n_layer_main][n][n_expert_used]: routed experts (global ids,
                                    ascending; -1 for dense layers) */
} rt_gpu_outputs;

/* Runs n tokens at positions n_past .. n_past + n - 1 and appends them to the caches.
 * With opts.cuda_graph, a call of one token that asks for no debugging outputs (logits and
 * hidden are fine) is one launch of an executable CUDA graph of the whole step, recorded by
 * stream capture once and replayed at later positions: its parameters (token, position) are
 * uploaded to device memory before each launch, and the kernels whose work depends on the
 * position (cache writes, indexer scores and top-k, attention) read it there (cuk_model.h,
 * "positions in device memory"). Their launch shapes are made for a bucket of the key count,
 * the power of two >= n_past + 1 (at least 1024, at most the sequence's capacity), so a step is
 * captured again only when the bucket, the sequence, its capacity or the work buffers changed
 * (info.graph_captures; runtime/gpu/gpu_graph.c says why buckets). Each output is computed with the
 * same operations in the same order as in the plain path, so the results are bit-identical.
 * Under NCCL every rank's stream is captured into a graph of its own, NCCL's all-reduces
 * included, and each rank's graph is launched on its stream (the program sets
 * NCCL_GRAPH_MIXING_SUPPORT=0 first: rt_gpu_model_create says why). */
g5_status rt_gpu_forward(rt_gpu_model *g, const int32_t *tokens, uint32_t n,
                         const rt_gpu_outputs *out, g5_error *err);

/* ---- sequences: per-sequence GPU state, and decode steps over several at once ---- */

typedef struct rt_gpu_seq rt_gpu_seq;

/* A sequence of g (used only with g, freed before it) with caches for `reserve` positions
 * allocated now (0: none yet). Caches grow on demand (doubling, the content copied) unless a
 * limit is set; a server reserves the whole context up front so that no step allocates. */
g5_status rt_gpu_seq_create(rt_gpu_model *g, uint32_t reserve, rt_gpu_seq **out, g5_error *err);
void rt_gpu_seq_free(rt_gpu_seq *s); /* accepts NULL */
/* Makes the caches hold `positions` positions (keeping the cached ones). */
g5_status rt_gpu_seq_reserve(rt_gpu_seq *s, uint32_t positions, g5_error *err);
/* Forgets the cached tokens, MTP positions included (the memory stays reserved). */
void rt_gpu_seq_reset(rt_gpu_seq *s);
uint32_t rt_gpu_seq_n_past(const rt_gpu_seq *s);
uint32_t rt_gpu_seq_capacity(const rt_gpu_seq *s);
/* GPU memory of the main caches of one sequence for `positions` positions, all of this
 * process's ranks (the NextN caches, allocated by the first rt_gpu_mtp_seq call, come on top). */
uint64_t rt_gpu_seq_bytes(const rt_gpu_model *g, uint32_t positions);
/* The default sequence that rt_gpu_forward and rt_gpu_reset work on. */
rt_gpu_seq *rt_gpu_default_seq(rt_gpu_model *g);

/* rt_gpu_forward on sequence s (prefill or decode of one sequence); same outputs and the same
 * CUDA-graph rule. rt_gpu_forward(g, ...) is rt_gpu_forward_seq(g, rt_gpu_default_seq(g), ...). */
g5_status rt_gpu_forward_seq(rt_gpu_model *g, rt_gpu_seq *s, const int32_t *tokens, uint32_t n,
                             const rt_gpu_outputs *out, g5_error *err);

/* One decode step: token tokens[i] for sequence seqs[i] (at its own position) for i < n_seq
 * (distinct sequences of g), logits [n_seq][n_vocab] (host). Every weight product runs once for
 * all n_seq rows (GEMV launches of up to CUK_GEMV_MAX_N rows); the indexer and the attention
 * run per sequence against its own caches. The rows are computed by the same kernels with the
 * same per-row summation order as n_seq separate one-token rt_gpu_forward_seq calls, so each
 * row's logits equal those bit for bit (tests/gpu/test_gpu_serve.c checks it). With
 * opts.cuda_graph a step of up to 64 rows, its layers and final norm, is one launch of a CUDA
 * graph captured once per row count and key-count bucket (the sequences and their positions are
 * read from device tables, so any batch of that size replays it); the head runs after it. On
 * error no sequence advances. */
g5_status rt_gpu_forward_batch(rt_gpu_model *g, rt_gpu_seq *const *seqs, const int32_t *tokens,
                               uint32_t n_seq, float *logits, g5_error *err);
/* A batched step of a few tokens per sequence (the server's MTP verification: [token, draft]):
 * n_tok[i] tokens of tokens (in order, sequence after sequence) for seqs[i] at its next positions
 * (distinct sequences). Every row is run as a row of a batched decode step, the positions of one
 * sequence in order: each row's logits and hidden state equal those of a one-token
 * rt_gpu_forward_seq call at its position after the rows before it, bit for bit, so a verified
 * draft gives exactly plain decoding's output. out: all_logits [rows][n_vocab] and hidden
 * [rows][n_embd] (either may be NULL; no debugging outputs). On error no sequence advances. */
g5_status rt_gpu_forward_rows(rt_gpu_model *g, rt_gpu_seq *const *seqs, const uint32_t *n_tok, uint32_t n_seq,
                              const int32_t *tokens, const rt_gpu_outputs *out, g5_error *err);

/* ---- MTP: the NextN block (runtime/gpu/gpu_mtp.c) ----
 * rt_model_mtp on the GPU: the first NextN block at the sequence's MTP positions
 * mtp_n_past .. + n - 1, from the main model's final-normed hidden states hidden [n][n_embd]
 * (host; rt_gpu_outputs.hidden) and the tokens that follow them, next_tokens[i] (the token at
 * hidden[i]'s position + 1); draft_logits (host, may be NULL): all_logits ? [n][n_vocab] :
 * [n_vocab] (last only), the logits for the token after next_tokens[i]. The NextN layer runs the
 * main layers' kernels (same precision mode, latent cache type, prefill GEMM rule, collective)
 * over the sequence's own NextN caches, which the first call allocates (grown like the main
 * caches; one layer, so 1/n_layer_main of their size). eh_proj may be whole on every rank or
 * split by rows or columns. Never a CUDA graph. With several processes it is collective like the
 * forward calls, and the draft logits are whole on every process (the NextN head must then be
 * split like output). G5_ERR_UNSUPPORTED without a NextN block. */
int rt_gpu_has_mtp(const rt_gpu_model *g);
g5_status rt_gpu_mtp_seq(rt_gpu_model *g, rt_gpu_seq *s, const float *hidden, const int32_t *next_tokens,
                         uint32_t n, float *draft_logits, int all_logits, g5_error *err);
/* rt_gpu_mtp_seq for several sequences at once, n_tok[i] NextN positions each (distinct
 * sequences; hidden [rows][n_embd] and next_tokens [rows] sequence after sequence), draft_logits
 * [n_seq][n_vocab] (host, may be NULL): those after each sequence's last row. The rows run as a
 * batched decode step's (the main layers' batched attention over the NextN caches), so each
 * row equals a one-token rt_gpu_mtp_seq call at its position, bit for bit, whatever the batch. */
g5_status rt_gpu_mtp_rows(rt_gpu_model *g, rt_gpu_seq *const *seqs, const uint32_t *n_tok, uint32_t n_seq,
                          const float *hidden, const int32_t *next_tokens, float *draft_logits, g5_error *err);
/* On the default sequence. */
g5_status rt_gpu_mtp(rt_gpu_model *g, const float *hidden, const int32_t *next_tokens, uint32_t n,
                     float *draft_logits, int all_logits, g5_error *err);
uint32_t rt_gpu_seq_mtp_n_past(const rt_gpu_seq *s);
uint32_t rt_gpu_mtp_n_past(const rt_gpu_model *g);
/* Forgets positions >= n_past of the main caches and >= mtp_n_past of the NextN caches (e.g.
 * rejected draft tokens), as rt_state_truncate; neither may exceed the current count. The memory
 * stays reserved. (rt_gpu_seq_reset and rt_gpu_reset forget the MTP positions too.) */
g5_status rt_gpu_seq_truncate(rt_gpu_seq *s, uint32_t n_past, uint32_t mtp_n_past, g5_error *err);
/* Drafting (runtime/draft.h, glm5-run and glm5-serve --draft mtp) runs on these calls through
 * the engine (runtime/engine.h): its verifying rows are rt_gpu_forward_rows rows, so its output
 * equals plain decoding's bit for bit in both precisions, and its drafts (rt_gpu_mtp_rows for
 * the few pairs of a step, rt_gpu_mtp_seq for a prompt's) do not depend on the batch. */

/* ---- prefix store: copies of cache blocks for later sequences (gpu_prefix.c) ----
 * n_blocks slots on every rank, each holding bt positions of what a sequence keeps per
 * position on that rank: every main layer's latent rows (the model's latent cache type, copied
 * as they are) and every full layer's indexer keys. Nothing else of a sequence depends on its
 * positions' tokens (the NextN caches are not stored: a sequence loaded from the store has no
 * MTP positions; the engine keeps the hidden states they are rebuilt from). Copies are device to device on each rank's stream (cudaMemcpy2DAsync, one per
 * cache kind, rank and block), ordered with the forward calls on that stream; a slot is
 * overwritten only by a later save, so a load enqueued before it reads the old contents. Which
 * slot holds which prefix is the caller's (runtime/prefix.h; the engine, runtime/engine.h). */
typedef struct rt_gpu_prefix rt_gpu_prefix;
uint64_t rt_gpu_prefix_block_bytes(const rt_gpu_model *g, uint32_t bt); /* one slot, per rank */
g5_status rt_gpu_prefix_create(rt_gpu_model *g, uint32_t bt, uint32_t n_blocks, rt_gpu_prefix **out,
                               g5_error *err);
void rt_gpu_prefix_free(rt_gpu_prefix *p); /* accepts NULL; before the model */
uint32_t rt_gpu_prefix_n_blocks(const rt_gpu_prefix *p);
uint32_t rt_gpu_prefix_block_tokens(const rt_gpu_prefix *p);
/* s's positions [k bt, (k+1) bt) (< its n_past) into slot `slot`, every rank. */
g5_status rt_gpu_prefix_save(rt_gpu_prefix *p, const rt_gpu_seq *s, uint32_t k, uint32_t slot, g5_error *err);
/* An empty s (no positions, MTP ones included) takes slots[0, n) as its positions [0, n bt) on
 * every rank (its caches grown if needed) and then holds n bt positions. */
g5_status rt_gpu_prefix_load(rt_gpu_prefix *p, rt_gpu_seq *s, const uint32_t *slots, uint32_t n, g5_error *err);

/* ---- --check: the CPU reference beside the GPU (gpu_check.c) ---- */

typedef struct rt_gpu_check rt_gpu_check;

typedef struct rt_gpu_check_opts {
    uint32_t n_tokens;           /* check forward calls until this many tokens were checked */
    double tol_stage;            /* max relative difference per stage (default 1e-3) */
    double tol_logits;           /* logits relative L2 (default 1e-3) */
    double min_overlap;          /* indexer top-k overlap, mean per layer (default 0.95) */
    int stagewise;               /* 0 (default): the end-to-end logits join the verdict; 1 (fast
                                    mode): with stage runs (one rank) the verdict is stage by
                                    stage (attention, FFN/MoE, output head, NextN block, each from
                                    the GPU's own input) and the end-to-end figures are reported
                                    only: 16-bit rounding flips near-tied indexer/router choices,
                                    and a flip's effect travels to every later token */
    FILE *report;                /* where the per-layer table goes (stderr if NULL; written by
                                    process 0 only) */
} rt_gpu_check_opts;

void rt_gpu_check_opts_default(rt_gpu_check_opts *o);

/* The CPU model (its own decoding states are created here) checks the GPU model. Both must
 * come from the same weights. Stage-level comparisons (attention out, MoE out: the CPU stage
 * fed the GPU's stage input, so each number is that stage's own error) need a one-rank model;
 * with more ranks only whole layers, the top-k sets and the logits are compared. Under several
 * processes every process runs the check alongside (collective, like the forward calls: the CPU
 * and the GPU outputs are whole on each, so each reaches the same verdict); the report comes
 * from process 0. */
g5_status rt_gpu_check_create(rt_model *cpu, rt_gpu_model *gpu, const rt_gpu_check_opts *o,
                              rt_gpu_check **out, g5_error *err);
void rt_gpu_check_free(rt_gpu_check *c); /* accepts NULL */

/* rt_gpu_forward, plus (while fewer than n_tokens were checked) the CPU reference on the same
 * tokens and the per-layer, per-stage report. The verdict accumulates: see rt_gpu_check_ok.
 * A near-tie can make the GPU and the CPU pick a different key set (indexer) or expert set
 * (router) for a token; such tokens are counted and reported by the overlap columns, and left out
 * of that stage's difference (which would otherwise measure the choice, not the arithmetic).
 * With a NextN block each checked call also runs it on both sides (rt_gpu_mtp on the default
 * sequence, rt_model_mtp), both fed the GPU's hidden states paired with the following tokens
 * (the previous call's last one with this call's first), and compares the draft logits against
 * tol_logits (the "check: mtp" line; summary mtp_rel_l2). */
g5_status rt_gpu_check_forward(rt_gpu_check *c, const int32_t *tokens, uint32_t n,
                               const rt_gpu_outputs *out, g5_error *err);
/* 1 while every checked value was within tolerance (per call) and, over all checked tokens, each
 * layer's tokens with another expert set than the CPU stage's are at most 1 - min_overlap of them
 * and (fast, stagewise) the NextN draft argmax agrees at >= 0.9 of its positions. */
int rt_gpu_check_ok(const rt_gpu_check *c);
uint32_t rt_gpu_check_n_checked(const rt_gpu_check *c);
/* Largest differences seen (for summaries). */
typedef struct rt_gpu_check_summary {
    uint32_t n_tokens;
    double max_stage_attn, max_stage_ffn, max_layer, logits_rel_l2, min_overlap_mean;
    double head_rel_l2;          /* output head's logits from the GPU's last layer output (stage
                                    runs; largest per call) */
    double mtp_rel_l2;           /* NextN block's draft logits (largest per call), both sides fed
                                    the GPU's hidden states; mtp_n positions checked (0: no block) */
    uint32_t mtp_n, mtp_agree;   /* mtp_agree: positions whose draft argmax agrees */
    uint32_t max_exp_diff;       /* the layer with most checked tokens whose expert set differs
                                    from the CPU stage's: their count (stage runs) */
    int ok;                      /* rt_gpu_check_ok */
} rt_gpu_check_summary;
void rt_gpu_check_get_summary(const rt_gpu_check *c, rt_gpu_check_summary *s);

/* ---- benchmark hooks (tests/gpu/bench_decode.c; not for serving) ---- */

/* Makes the default sequence look as if n_past tokens had been decoded, without running them:
 * its caches are reserved for n_past + 256 positions and every layer's latent and indexer-key
 * cache rows [0, n_past) are filled with finite random values (from seed; each layer its own),
 * then n_past is set. What decode steps at a long context cost can then be timed without a
 * prefill of that length. */
g5_status rt_gpu_debug_set_context(rt_gpu_model *g, uint32_t n_past, uint64_t seed, g5_error *err);

/* Where the device time of one forward call goes: the last forward call of the default sequence
 * (n tokens, at positions n_past - n ..; it must have been a single-sequence call of n tokens)
 * is run again stage by stage with CUDA events between the stages (no graph), on a model whose
 * ranks share one device. The re-run rewrites those positions' cache entries with the same
 * values and leaves n_past as it is. Times in milliseconds, summed over the layers. */
typedef struct rt_gpu_stage_times {
    uint32_t n_tok;
    double embd_ms;              /* embedding rows */
    double attn_ms;              /* attention with the indexer, every layer */
    double dense_ms, moe_ms;     /* the FFN of the dense layers; the MoE (router, experts, shared
                                    expert) of the others */
    double add_ms;               /* the collectives: with ranks sharing a device, the device-side
                                    sum standing in for the all-reduce; the residual adds
                                    themselves run inside the next stage's RMSNorm
                                    (cuk_add_rms_norm), so one rank shows ~0 here */
    double head_ms;              /* final norm and lm_head of the last token */
    double total_ms;
} rt_gpu_stage_times;
g5_status rt_gpu_debug_stage_times(rt_gpu_model *g, uint32_t n, rt_gpu_stage_times *out, g5_error *err);

/* The same re-run with a CUDA event between every sub-step of the stages (each GEMV, norm,
 * rope, router, expert kernel, ...), printed to `report` as each sub-step's mean microseconds
 * per occurrence and its total over the call. Two variants: launched one by one (a step without
 * CUDA graph: a gap in which the device waits for the host is charged to the sub-step after it)
 * and, for n = 1, captured into a CUDA graph (a graph step: device time only); plus each
 * variant's total without the events, to show what the events themselves cost. Same conditions
 * as rt_gpu_debug_stage_times. For n > 1 (a prefill call, any n_past) a second table: the
 * launched variant's sub-steps by class (attention, indexer, dense weight products, routed
 * experts, lm_head, other; every label classified explicitly, an unknown one charged to other
 * and named), each class's FLOPs for this call from the hyper-parameters and the ranks' slices,
 * its TFLOP/s and the ratio to ref_tflops, a reference rate the caller measured in the same run
 * (tests/gpu/bench_peer.c: cuBLAS bf16 on an 8192^3 GEMM; 0: not measured, no ratio). For one
 * token of one sequence two more columns: the MB one occurrence of the sub-step reads (its
 * weights in their stored types, the latent rows attended, the indexer's keys and scores, a
 * norm's weight; what bench_decode's byte floor counts) and its graph time over those bytes' time
 * at copy_gbs, the caller's measured copy rate in GB/s (0: no ratio). */
g5_status rt_gpu_debug_profile(rt_gpu_model *g, uint32_t n, double ref_tflops, double copy_gbs, FILE *report,
                               g5_error *err);
/* The same for the last rt_gpu_forward_batch step of seqs[0 .. n_seq) (n_seq >= 2, the same
 * sequences in the same order), launched one by one (its lm_head line: the last row only). */
/* The last call (as rt_gpu_debug_profile, launched one by one) with a scan after every sub-step
 * of rank 0's residual, normed input and stage outputs: the largest finite magnitude per layer,
 * where the first non-finite value appears, and each sub-step's largest output (to find which
 * 16-bit product input overflows). Slow (a sync per sub-step): debugging only. */
g5_status rt_gpu_debug_scan(rt_gpu_model *g, uint32_t n, FILE *report, g5_error *err);
g5_status rt_gpu_debug_profile_batch(rt_gpu_model *g, rt_gpu_seq *const *seqs, uint32_t n_seq, FILE *report,
                                     g5_error *err);

#endif
