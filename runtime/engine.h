/* The engine: the one interface glm5-run, the MTP drafter (draft.h) and glm5-serve run the model
 * through, whatever the device.
 *
 * An engine is a weight set (a blob set or a GGUF, opened once) with the CPU reference model
 * over it (runtime/cpu/model.h) and, for RT_ENG_CUDA, the GPU model built from that set and the
 * CPU model's public tensor table (runtime/gpu/gpu_model.h, runtime/cpu/model_tensors.h): the
 * GPU loads the blobs of the set the CPU side already opened (checksummed reader threads), or
 * copies a GGUF's tensors from host memory. Sequences (rt_eng_seq) are the per-sequence state:
 * the CPU model's rt_state (its own growing cache pool, or pages from the engine's shared pool
 * when opts.kv_blocks is set) or a GPU sequence.
 *
 * Calls:
 *  - rt_eng_prefill: n tokens of one sequence at its next positions (a prompt, a prompt chunk,
 *    one decode step of one sequence, the drafter's two-token verification); logits of the last
 *    position or of all, and the final-normed hidden states (the MTP block's input).
 *  - rt_eng_decode: one decode step for a batch of distinct sequences, one token each.
 *  - rt_eng_decode_rows: one step for a batch of distinct sequences, a few tokens each (the
 *    server's MTP verification: [chosen, draft] per sequence), with hidden states.
 *  - rt_eng_mtp, rt_eng_mtp_rows: the NextN/MTP block's draft logits (rt_model_mtp), of one
 *    sequence or of a batch.
 *  - rt_eng_truncate: forget positions (rejected draft tokens).
 *  - rt_eng_seq_attach_prefix / rt_eng_seq_publish_prefix: prefix caching (below).
 * Each call is the device model's own call with the same arguments (rt_model_forward,
 * rt_model_forward_batch, rt_gpu_forward_seq, rt_gpu_forward_batch, ...), so results are those
 * of the models: the CPU bit for bit, the GPU as gpu_model.h says.
 *
 * --check (opts.check_tokens > 0, CUDA): the CPU reference runs beside the GPU on the engine's
 * first sequence (prefill calls only) until that many tokens were checked (rt_gpu_check);
 * rt_eng_check_result_get gives the verdict.
 *
 * Processes (opts.comm of size P > 1): every call is collective as in model.h / gpu_model.h.
 * An engine is used by one thread at a time. Everything builds without CUDA; there
 * RT_ENG_CUDA fails with G5_ERR_UNSUPPORTED (rt_eng_cuda_available() is 0). */
#ifndef G5_RT_ENGINE_H
#define G5_RT_ENGINE_H

#include <stdint.h>
#include <stdio.h>

#include "format/glm5.h"
#include "format/status.h"
#include "runtime/cpu/comm.h"
#include "runtime/cpu/model.h"
#include "runtime/cpu/weights.h"
#include "runtime/text/sample.h"

typedef struct rt_eng rt_eng;
typedef struct rt_eng_seq rt_eng_seq;

typedef enum rt_eng_device { RT_ENG_CPU = 0, RT_ENG_CUDA = 1 } rt_eng_device;
/* GPU arithmetic (specs/numerics.md): precise float32, or fast (f16 latent cache by default). */
typedef enum rt_eng_precision { RT_ENG_PRECISE = 0, RT_ENG_FAST = 1 } rt_eng_precision;

/* What a caller reports when a fast-mode call's logits hold no finite value (rt_eng_any_finite
 * says so): fp16's range, the documented price of fast mode's products (specs/numerics.md). */
#define RT_ENG_FAST_RANGE_MSG                                                                           \
    "every logit is NaN or infinite after a --precision fast call: a product input left fp16's range " \
    "on this input (specs/numerics.md); --precision precise computes in float32"
/* 1 if any of logits[0..n) is finite. */
int rt_eng_any_finite(const float *logits, uint32_t n);
/* GPU latent cache type; DEFAULT: f32 when precise, f16 when fast. */
typedef enum rt_eng_cache {
    RT_ENG_CACHE_DEFAULT = 0, RT_ENG_CACHE_F32, RT_ENG_CACHE_BF16, RT_ENG_CACHE_F16
} rt_eng_cache;

typedef struct rt_eng_opts {
    rt_eng_device device;
    /* the CPU model (the whole model on the CPU; with CUDA the tensor table and --check) */
    uint32_t n_threads;          /* 0: online cores */
    rt_mla_mode mla;
    rt_comm *comm;               /* the run's processes; NULL: one */
    /* CPU: with kv_blocks > 0 every sequence takes its cache blocks from one pool of kv_blocks
     * blocks of kv_block_tokens positions (rt_kvpool; a full pool fails a call with
     * G5_ERR_NOMEM and changes nothing); 0: each sequence grows a private pool */
    uint32_t kv_blocks, kv_block_tokens;
    int kv_prefix_cache;         /* prefix caching (below): CPU: the shared pool shares full blocks
                                    by token prefix; CUDA: the prefix store of prefix_cache_bytes */
    int kv_prefix_hidden;        /* with kv_prefix_cache: the blocks also keep the final-normed
                                    hidden states of their positions, so MTP drafting works over an
                                    attached prefix (rt_eng_seq_hidden, draft.h rt_drafter_resume).
                                    CPU: in the shared pool (rt_kvpool_keep_hidden); CUDA: each
                                    sequence records its prefill calls' rows and the store keeps
                                    its blocks' rows, both in host memory (n_embd floats each) */
    /* CUDA */
    int gpu0;                    /* first device */
    /* > 0: rt_eng_prefill runs its tokens in GPU calls that end at the multiples of this many
     * positions (and at its last token), the prefix store's block; 0: one call (no store) */
    uint32_t prefix_block_tokens;
    uint64_t prefix_cache_bytes; /* with kv_prefix_cache: the prefix store's device memory per rank
                                    (whole blocks of it; less than one: no store) */
    rt_eng_precision precision;
    rt_eng_cache cache;
    int verify;                  /* checksum the blobs while loading (default 1) */
    int h16_products;            /* rt_gpu_opts.h16_products (fast precision) */
    int cuda_graph;              /* decode steps as CUDA graph launches (under NCCL the program
                                    sets NCCL_GRAPH_MIXING_SUPPORT first: rt_gpu_model_create) */
    int collective_nccl;         /* NCCL between ranks also for TP 1 (rt_gpu_opts.collective) */
    uint32_t check_tokens;       /* --check: tokens to compare with the CPU (0: none) */
    double check_tol_stage, check_tol_logits, check_min_overlap; /* 0: rt_gpu_check's defaults */
                                 /* fast precision checks stage by stage (rt_gpu_check_opts.stagewise) */
    FILE *check_report;          /* NULL: stderr */
} rt_eng_opts;

void rt_eng_opts_default(rt_eng_opts *o);
int rt_eng_cuda_available(void); /* 1 in the CUDA build */

/* An engine over an open weight set (which must outlive it), in two steps, so that the processes
 * of a launch can agree that every one has its CPU model before the GPU's collectives start:
 * rt_eng_create builds the CPU model (every tensor of the local ranks found and checked);
 * rt_eng_load then puts the model on its device: CUDA: the GPU model on the same set, whose blob
 * files the GPU loader reads through the set's open blobs (never reopened); collective across
 * the processes. CPU: the shared cache pool. Sequences need a loaded engine. */
g5_status rt_eng_create(const rt_wset *ws, const rt_eng_opts *o, rt_eng **out, g5_error *err);
g5_status rt_eng_load(rt_eng *e, g5_error *err);
/* Opens path (a blob set directory or a GGUF; with several processes this process's ranks of a
 * blob set), then rt_eng_create and rt_eng_load over it; the engine owns the set. */
g5_status rt_eng_open(const char *path, const rt_eng_opts *o, rt_eng **out, g5_error *err);
void rt_eng_free(rt_eng *e); /* accepts NULL; free its sequences first */
/* Host memory for the logits and hidden rows of e's calls: page-locked on CUDA, where the
 * device's copies then run at the bus rate (a pageable buffer is copied through a staging buffer
 * at a fraction of it), else malloc's. Free it with rt_eng_host_free (accepts NULL) before e. */
void *rt_eng_host_alloc(const rt_eng *e, size_t bytes);
void rt_eng_host_free(const rt_eng *e, void *p);

rt_eng_device rt_eng_device_of(const rt_eng *e);
const glm5_hparams *rt_eng_hparams(const rt_eng *e);
const rt_wset *rt_eng_wset(const rt_eng *e);
uint32_t rt_eng_n_ranks(const rt_eng *e);
uint32_t rt_eng_n_threads(const rt_eng *e);
int rt_eng_has_mtp(const rt_eng *e);
/* One line about the GPU model (device, ranks, collective, precision, cache, load rate and
 * checksums); "" on the CPU. */
void rt_eng_describe(const rt_eng *e, char *buf, size_t cap);
uint64_t rt_eng_load_bytes(const rt_eng *e); /* bytes the GPU loader moved (0 on the CPU) */
/* Device memory of one sequence's caches for `positions` positions (CUDA; 0 on the CPU). */
uint64_t rt_eng_seq_bytes(const rt_eng *e, uint32_t positions);

/* ---- sequences ---- */

/* A sequence with room for `reserve` positions now (0: none yet; caches grow on demand). */
g5_status rt_eng_seq_create(rt_eng *e, uint32_t reserve, rt_eng_seq **out, g5_error *err);
void rt_eng_seq_free(rt_eng_seq *s); /* accepts NULL; a paged one gives its blocks back */
void rt_eng_seq_reset(rt_eng_seq *s); /* empty again (MTP positions too) */
rt_eng *rt_eng_seq_engine(const rt_eng_seq *s);
uint32_t rt_eng_seq_n_past(const rt_eng_seq *s);
uint32_t rt_eng_seq_mtp_n_past(const rt_eng_seq *s);
/* Room for positions [0, n_tokens) now (all or nothing), so calls up to that length cannot run
 * out of cache. */
g5_status rt_eng_seq_reserve(rt_eng_seq *s, uint32_t n_tokens, g5_error *err);
uint32_t rt_eng_seq_n_blocks(const rt_eng_seq *s); /* CPU: cache blocks held; CUDA: 0 */
/* Forgets positions >= n_past of the main caches and >= mtp_n_past of the MTP block's. */
g5_status rt_eng_truncate(rt_eng_seq *s, uint32_t n_past, uint32_t mtp_n_past, g5_error *err);

/* The shared pool (opts.kv_blocks; all 0 without one). */
uint32_t rt_eng_pool_n_blocks(const rt_eng *e);
uint32_t rt_eng_pool_n_free(const rt_eng *e);
uint32_t rt_eng_pool_block_tokens(const rt_eng *e);
/* Prefix caching (opts.kv_prefix_cache), one interface for both devices: full cache blocks are
 * named by the chained hash of the tokens up to their end (rt_kv_prefix_hashes), and a later
 * sequence whose tokens start alike skips running those positions. Attach: an empty sequence
 * takes the blocks of the longest cached prefix of tokens[0, n) that is a whole number of blocks
 * and leaves one token to run (*n_reused: its n_past after). Publish: registers a sequence's
 * full blocks, tokens = its first n_past tokens. Without a prefix cache: nothing reused, nothing
 * registered. Results are bit-identical with and without it:
 *  - CPU (runtime/cpu/model.h has the rules): the shared pool's blocks themselves are shared
 *    (reference counts; cached blocks no sequence holds are counted free and evicted oldest
 *    first when the pool is short). Any split of the calls gives the same bits.
 *  - CUDA: a device-side store (rt_gpu_prefix, runtime/prefix.h's index) of copies: blocks of
 *    opts.prefix_block_tokens positions holding every cache a GPU sequence keeps per position
 *    (each main layer's latent rows in the cache type as they are, the indexer keys), on every
 *    rank, least recently used first out within opts.prefix_cache_bytes per rank. Attach copies
 *    the blocks into the sequence's caches (device to device on each rank's stream), publish
 *    copies a sequence's blocks out. The GPU's bits depend on how the positions were split into
 *    calls (the prefill GEMM path from gemm_min tokens, fast mode reading earlier calls' latents
 *    rounded from the cache), so with prefix_block_tokens every rt_eng_prefill is run in calls
 *    that end at the blocks' ends, whether or not a store exists: a block is then the output of
 *    the one call of exactly its positions after the blocks before it, which is what an attached
 *    sequence's next call follows too. A sequence publishes only blocks it ran that way from
 *    position 0 (or attached): never those written by decode steps (rt_eng_decode), a --check
 *    run, or calls that began elsewhere. With opts.kv_prefix_hidden a block is published only
 *    with the hidden states of its positions (recorded by the prefill calls), which an attach
 *    copies back.
 * MTP drafting (opts.kv_prefix_hidden): the NextN block's own cache is private to the
 * sequence and starts empty after an attach; its input at MTP position p is the main model's
 * hidden state at p, which the cached blocks keep, so the drafter rebuilds the NextN cache of
 * the attached positions from them (rt_eng_seq_hidden, rt_drafter_resume): one NextN layer over
 * the prefix instead of every layer, and the same MTP call, bit for bit, as after a prefill. */
g5_status rt_eng_seq_attach_prefix(rt_eng_seq *s, const int32_t *tokens, uint32_t n, uint32_t *n_reused,
                                   g5_error *err);
g5_status rt_eng_seq_publish_prefix(rt_eng_seq *s, const int32_t *tokens, g5_error *err);
/* out [n][n_embd] = the final-normed hidden states at positions p0 .. p0 + n - 1 as kept with
 * opts.kv_prefix_hidden: CPU: every position < n_past (the shared pool's blocks); CUDA: the
 * positions the sequence's prefill calls wrote from position 0 or an attach on (G5_ERR_BOUNDS
 * past them); G5_ERR_UNSUPPORTED without the option. */
g5_status rt_eng_seq_hidden(const rt_eng_seq *s, uint32_t p0, uint32_t n, float *out, g5_error *err);
/* CPU: cached blocks no sequence holds; CUDA: blocks in the store (none is held: they are copies) */
uint32_t rt_eng_pool_n_cached(const rt_eng *e);
uint64_t rt_eng_pool_n_evicted(const rt_eng *e); /* cached blocks dropped for others */
typedef struct rt_eng_prefix_info {
    int on;                      /* a prefix cache exists */
    uint32_t block_tokens;       /* positions per block (CUDA: opts.prefix_block_tokens, 0 without) */
    uint32_t n_blocks;           /* CPU: the pool's blocks; CUDA: the store's slots */
    uint32_t n_cached;           /* rt_eng_pool_n_cached */
    uint64_t n_evicted;
    uint64_t block_bytes;        /* CUDA: one block on one rank */
} rt_eng_prefix_info;
void rt_eng_prefix_get_info(const rt_eng *e, rt_eng_prefix_info *out);

/* ---- forward calls ---- */

typedef struct rt_eng_out {
    float *logits;               /* all_logits ? [n][n_vocab] : [n_vocab] (the last position) */
    int all_logits;
    float *hidden;               /* [n][n_embd] final-normed hidden states (may be NULL) */
} rt_eng_out;

/* n tokens of s at positions n_past .. n_past + n - 1, appended to its caches (out may be NULL).
 * CUDA with opts.prefix_block_tokens: run as GPU calls ending at the block ends (prefix caching
 * above), all or nothing. */
g5_status rt_eng_prefill(rt_eng_seq *s, const int32_t *tokens, uint32_t n, const rt_eng_out *out,
                         g5_error *err);
/* One decode step: tokens[i] for seqs[i] (distinct sequences of e) at its next position;
 * logits [n_seq][n_vocab] (may be NULL). On failure no sequence has advanced. */
g5_status rt_eng_decode(rt_eng *e, rt_eng_seq *const *seqs, const int32_t *tokens, uint32_t n_seq,
                        float *logits, g5_error *err);
/* rt_eng_decode giving each sequence's greedy token instead of its logits: ids[i] the argmax of
 * its next-token logits (the largest, the lowest id on ties, NaN never; -1 if every logit is
 * NaN) and logit[i] that logit (NaN then). CUDA computes it on the devices, so 8 bytes a
 * sequence cross the bus instead of the vocabulary's logits; the CPU from the logits. The ids
 * are those a greedy samp_sample takes from rt_eng_decode's logits where no penalty applies,
 * except that the sampler refuses a row whose largest logit is not > -inf: so must the caller.
 * On failure no sequence has advanced. */
g5_status rt_eng_decode_argmax(rt_eng *e, rt_eng_seq *const *seqs, const int32_t *tokens, uint32_t n_seq,
                               int32_t *ids, float *logit, g5_error *err);
/* rt_eng_decode giving each sequence's token drawn as rows[i] says (samp_device_row: any draw,
 * its penalties included): ids[i] is the token samp_sample
 * would have drawn from its next-token logits, -1 where no logit is > -inf (the sampler refuses
 * those: so must the caller). CUDA with rt_eng_draws_on_device draws on the device
 * (cuda/cuk_sample.h), so 4 bytes a sequence cross the bus and the host takes no pass over the
 * logits; elsewhere from the logits on the host (samp_device_draw). On failure no sequence has
 * advanced. */
g5_status rt_eng_decode_draw(rt_eng *e, rt_eng_seq *const *seqs, const int32_t *tokens, uint32_t n_seq,
                             const samp_dev_row *rows, int32_t *ids, g5_error *err);
int rt_eng_draws_on_device(const rt_eng *e);
/* Batched rows, the speculative verification of several sequences in one step: n_tok[i] >= 1
 * consecutive tokens for seqs[i] (distinct sequences of e) at its next positions; tokens and
 * out's rows grouped by sequence in order: logits [rows][n_vocab] (all_logits is implied) and
 * hidden [rows][n_embd] (out and either may be NULL). CPU: one weight pass over all rows
 * (rt_model_forward_rows, bit-identical to a prefill of each sequence alone); CUDA: one
 * rt_gpu_forward_rows call, every row as a batched decode step's row, so each row equals a
 * one-token decode step of its sequence bit for bit and a verified draft gives plain decoding's
 * output exactly (with --check's sequence among them: one rt_eng_prefill per sequence, which the
 * check follows). On failure no sequence has advanced. */
g5_status rt_eng_decode_rows(rt_eng *e, rt_eng_seq *const *seqs, const uint32_t *n_tok, uint32_t n_seq,
                             const int32_t *tokens, const rt_eng_out *out, g5_error *err);
/* The NextN/MTP block at s's MTP positions mtp_n_past .. + n - 1 over n pairs (hidden [n][n_embd],
 * the token after it); draft_logits all ? [n][n_vocab] : [n_vocab]. G5_ERR_UNSUPPORTED without
 * a NextN block. */
g5_status rt_eng_mtp(rt_eng_seq *s, const float *hidden, const int32_t *next_tokens, uint32_t n,
                     float *draft_logits, int all_logits, g5_error *err);
/* rt_eng_mtp for several distinct sequences of e at once, n_tok[i] pairs each (hidden [rows][n_embd]
 * and next_tokens [rows] grouped by sequence in order); draft_logits [n_seq][n_vocab] (may be
 * NULL): those after each sequence's last pair. CPU: rt_eng_mtp per sequence. CUDA: the
 * sequences of at most RT_ENG_MTP_ROWS pairs in one rt_gpu_mtp_rows call (each row the bits of a
 * one-token call, whatever the batch), longer ones (a prompt's pairs) each in a call of its own. */
#define RT_ENG_MTP_ROWS 8
g5_status rt_eng_mtp_rows(rt_eng *e, rt_eng_seq *const *seqs, const uint32_t *n_tok, uint32_t n_seq,
                          const float *hidden, const int32_t *next_tokens, float *draft_logits, g5_error *err);

/* ---- --check ---- */

typedef struct rt_eng_check_result {
    int ok;                      /* every checked value within tolerance */
    uint32_t n_tokens;           /* tokens checked */
    double max_stage_attn, max_stage_ffn, max_layer, logits_rel_l2, min_overlap_mean;
    double head_rel_l2;          /* the output head from the GPU's last layer (one rank) */
    double mtp_rel_l2;           /* the NextN block's draft logits; mtp_n positions (0: none) */
    uint32_t mtp_n, mtp_agree;   /* mtp_agree: positions whose draft argmax agrees */
    uint32_t max_exp_diff;       /* most tokens of one layer whose expert set differs (one rank) */
} rt_eng_check_result;
/* 1 and *out filled when the engine runs a check; 0 otherwise. */
int rt_eng_check_result_get(const rt_eng *e, rt_eng_check_result *out);

#endif
