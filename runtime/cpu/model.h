/* The GLM-5 (glm-dsa) forward pass on the CPU, in float32: the project's numerical reference.
 *
 * Per main layer: RMSNorm -> MLA attention with the DSA lightning indexer's top-k key selection
 * -> residual -> RMSNorm -> dense SwiGLU FFN (leading layers) or sigmoid-routed MoE with a shared
 * expert -> residual. Then the final RMSNorm and lm_head. The NextN/MTP block turns the final
 * hidden state and the next token into draft logits.
 *
 * Tensor parallelism: a weight set of T ranks runs as T rank workers (threads), each reading only
 * its own shard. The replicated parts (norms, q_a, kv_a, the indexer and its top-k, the router)
 * are divided among the ranks by token rows, each rank using its own copy of those weights, and
 * the rows are exchanged (an all-gather): every token's arithmetic is the same whichever rank
 * does it, so this equals each rank computing everything, without paying for it T times. Each
 * rank keeps its own copy of the latent and indexer-key caches. Partial outputs of the attention
 * output projection and of the FFN/MoE down projections are summed in rank order (the CPU
 * stand-in for an all-reduce), and every rank adds the same sum, so all ranks carry identical
 * hidden states. lm_head rows (the vocabulary) are split: each rank writes its own columns of the
 * logits (an all-gather). nextn.eh_proj may be whole, or split by rows or by columns.
 *
 * Processes: with opts.comm of size P > 1 (several processes under mpirun/srun, comm.h), process
 * p owns ranks [p * T / P, (p + 1) * T / P) (T % P == 0) and runs only those, as above; the
 * weight set needs only those ranks open (rt_wset_open_blobs_ranks). Every exchange above then
 * also crosses processes: the first local rank, on the thread that called the forward function,
 * all-gathers this process's part through the communicator after the local ranks meet. Sums
 * still run over ranks 0 .. T - 1 in rank order, so every output is bit-identical to one
 * process running all T ranks, and complete on every process. All processes make the same
 * calls (forward, batch, MTP, state and pool calls) with the same inputs and the same output
 * pointers set or NULL; states and pools hold this process's ranks only.
 *
 * Threads: opts.n_threads CPU threads in all, split evenly over the local ranks (at least one each);
 * matrix products are parallel over output rows. Results do not depend on the thread count, and
 * feeding tokens one at a time gives bit-identical results to feeding them together.
 *
 * Caches are paged (rt_kvpool: fixed-size token blocks); rt_model_forward_batch runs one decode
 * token for each of several sequences with the weight products shared by all rows.
 *
 * A model is used by one caller at a time (forward calls on one model must not overlap). */
#ifndef G5_RT_MODEL_H
#define G5_RT_MODEL_H

#include <stdint.h>

#include "runtime/cpu/comm.h"
#include "format/glm5.h"
#include "format/status.h"
#include "runtime/cpu/weights.h"

typedef struct rt_model rt_model;
typedef struct rt_state rt_state;

typedef enum rt_mla_mode {
    /* q_nope goes through W_UK into the latent space; attention runs over the 576-wide latent
     * cache; the output goes through W_UV. What a decoder does. */
    RT_MLA_ABSORBED = 0,
    /* K and V are expanded from the latent cache through kv_b for every attended position, as
     * in transformers. The check for the absorbed form. */
    RT_MLA_EXPANDED = 1,
} rt_mla_mode;

typedef struct rt_model_opts {
    uint32_t n_threads;   /* CPU threads in all; 0 = the number of online cores */
    rt_mla_mode mla;
    rt_comm *comm;        /* the run's processes; NULL: this process owns every rank */
} rt_model_opts;

/* Reads the hyperparameters from the set's metadata, finds and checks every tensor of every
 * local rank (names, shapes against the shard layout, types dequantizable), and starts the
 * threads. The set (and comm) must outlive the model. G5_ERR_SHARDING when T % P != 0;
 * G5_ERR_INVALID_ARG when a local rank is not open in the set. */
g5_status rt_model_create(const rt_wset *ws, const rt_model_opts *opts, rt_model **out,
                          g5_error *err);
void rt_model_free(rt_model *m); /* accepts NULL */

const glm5_hparams *rt_model_hparams(const rt_model *m);
uint32_t rt_model_n_ranks(const rt_model *m);    /* T, over all processes */
uint32_t rt_model_rank_first(const rt_model *m); /* this process's ranks: [first, first + n_local) */
uint32_t rt_model_n_local(const rt_model *m);
rt_comm *rt_model_comm(const rt_model *m);       /* opts.comm (NULL: single process) */
const rt_wset *rt_model_wset(const rt_model *m); /* the set it was created over */
uint32_t rt_model_n_threads(const rt_model *m);
void rt_model_set_mla(rt_model *m, rt_mla_mode mode);
int rt_model_has_mtp(const rt_model *m); /* a NextN block is present */

/* Decoding state: per rank and layer the latent cache (kv_lora normalized latent + qk_rope
 * roped key per position) and the indexer key cache (idx_head_dim per position); the MTP block
 * has its own. The caches are paged (fixed-size token blocks, see rt_kvpool below); a state
 * from rt_state_create draws its blocks from a private pool that grows as needed. */
g5_status rt_state_create(const rt_model *m, rt_state **out, g5_error *err);
void rt_state_free(rt_state *s); /* accepts NULL */
void rt_state_reset(rt_state *s);
uint32_t rt_state_n_past(const rt_state *s);
uint32_t rt_state_mtp_n_past(const rt_state *s);
/* Forgets positions >= n_past (e.g. rejected draft tokens). n_past must not exceed the current
 * count; likewise for the MTP block. Blocks no longer needed go back to the pool (as they do on
 * rt_state_reset and rt_state_free). */
g5_status rt_state_truncate(rt_state *s, uint32_t n_past, uint32_t mtp_n_past, g5_error *err);

/* ---- paged caches ----
 * A pool of n_blocks blocks of block_tokens positions each; a block holds those positions'
 * latent and indexer-key caches for every main layer and rank of the model (all allocated and
 * freed together). States made with rt_state_create_paged take their main-layer blocks from it
 * (position p in the state's block p / block_tokens); the MTP block's cache stays private to
 * the state. A forward call that needs a block when none is free fails with G5_ERR_NOMEM
 * ("kv pool exhausted: N blocks ...") and leaves the state as it was. Results are bit-identical
 * whatever the block size, pool, or unpaged state. The pool is thread-safe; it must outlive its
 * states (free them first). */
typedef struct rt_kvpool rt_kvpool;
g5_status rt_kvpool_create(const rt_model *m, uint32_t n_blocks, uint32_t block_tokens,
                           rt_kvpool **out, g5_error *err);
void rt_kvpool_free(rt_kvpool *p); /* accepts NULL */
uint32_t rt_kvpool_n_blocks(const rt_kvpool *p);
uint32_t rt_kvpool_n_free(const rt_kvpool *p);
uint32_t rt_kvpool_block_tokens(const rt_kvpool *p);
uint64_t rt_kvpool_block_bytes(const rt_kvpool *p);
g5_status rt_state_create_paged(const rt_model *m, rt_kvpool *pool, rt_state **out, g5_error *err);
/* Makes the state hold blocks for positions [0, n_tokens) now (all or nothing), so that forward
 * calls up to that length cannot run out. Never gives blocks back. */
g5_status rt_state_reserve(rt_state *s, uint32_t n_tokens, g5_error *err);
uint32_t rt_state_n_blocks(const rt_state *s); /* main-cache blocks held */

/* Prefix caching (runtime/cpu/kvcache.h has the rules): on a fixed pool, full blocks are named
 * by the hash of the tokens up to their end and shared between states; blocks no state holds
 * stay cached until the pool needs them (oldest released first), and count as free. Results
 * are bit-identical with and without it (a block holds what running its prefix again would
 * write). */
g5_status rt_kvpool_enable_prefix(rt_kvpool *p, g5_error *err); /* before any state uses it */
uint32_t rt_kvpool_n_cached(const rt_kvpool *p);  /* cached blocks no state holds */
uint64_t rt_kvpool_n_evicted(const rt_kvpool *p);
/* An empty state takes the cached blocks of the longest cached prefix of tokens[0, n) that is a
 * whole number of blocks and leaves at least one token to run; *n_reused receives the
 * positions it now holds (its n_past). */
g5_status rt_state_attach_prefix(rt_state *s, const int32_t *tokens, uint32_t n, uint32_t *n_reused,
                                 g5_error *err);
/* Registers the state's full blocks for reuse; tokens: the state's first n_past tokens. */
g5_status rt_state_publish_prefix(rt_state *s, const int32_t *tokens, g5_error *err);
/* MTP drafting over a cached prefix: the NextN block of a state that attached a prefix has not
 * seen those positions (its own cache stays private and starts empty), and its input at MTP
 * position p is the main model's final-normed hidden state at p. rt_kvpool_keep_hidden (before
 * any state uses the pool) makes every block also hold those hidden states, [block_tokens]
 * [n_embd] once per block (not per rank): every forward call writes its rows' states there
 * (rt_model_forward, _batch, _rows alike), so a cached block carries the states of its
 * positions, bit-identical to what running the prefix again would give, and rt_state_hidden
 * reads them back: the drafter (runtime/draft.h, rt_drafter_resume) then runs the MTP block over
 * the attached positions exactly as it would have after prefilling them. */
g5_status rt_kvpool_keep_hidden(rt_kvpool *p, g5_error *err);
/* out [n][n_embd] = the hidden states at positions p0 .. p0 + n - 1 (< n_past) of a state whose
 * pool keeps them; G5_ERR_UNSUPPORTED otherwise. */
g5_status rt_state_hidden(const rt_state *s, uint32_t p0, uint32_t n, float *out, g5_error *err);

/* What a forward call writes (any pointer may be NULL). */
typedef struct rt_outputs {
    float *logits;         /* all_logits ? [n][n_vocab] : [n_vocab] (last token only) */
    int all_logits;
    float *hidden;         /* [n][n_embd]: final-normed hidden states (the MTP block's input) */
    /* Debugging and tests (written by the first local rank: every rank holds the same): */
    float *layer_hidden;   /* [n_layer_main + 1][n][n_embd]: the embeddings, then each main
                              layer's output (before the final norm) */
    int32_t *topk;         /* [n_layer_main][n][idx_top_k]: key positions each query attended,
                              ascending, -1 padded (all visible ones when <= top_k are) */
} rt_outputs;

/* Runs n tokens at positions n_past .. n_past + n - 1 and appends them to the caches.
 * Token ids must be < n_vocab. */
g5_status rt_model_forward(rt_model *m, rt_state *s, const int32_t *tokens, uint32_t n,
                           const rt_outputs *out, g5_error *err);

/* Batched decode: one token per sequence, tokens[i] at position rt_state_n_past(states[i]),
 * appended to states[i] (distinct states of this model). The weight-reading products run once
 * over all n_seq rows; attention and the indexer run per sequence over its own cache.
 * logits: [n_seq][n_vocab] (may be NULL). Bit-identical to rt_model_forward of each sequence
 * alone. On failure (bad token, pool exhausted, ...) no state has changed. */
g5_status rt_model_forward_batch(rt_model *m, rt_state *const *states, const int32_t *tokens,
                                 uint32_t n_seq, float *logits, g5_error *err);

/* Batched rows (speculative verification): n_tok[i] >= 1 consecutive tokens for states[i]
 * (distinct states), at positions rt_state_n_past(states[i]) ..; tokens [sum n_tok] grouped by
 * state in order, and so are out's rows: logits [rows][n_vocab] and hidden [rows][n_embd] (out
 * and either may be NULL; all_logits is implied, the debugging outputs are not written). One
 * weight pass over all rows, as rt_model_forward_batch (which is this call with n_tok all 1);
 * bit-identical to rt_model_forward of each state alone with its n_tok[i] tokens. On failure no
 * state has changed. */
g5_status rt_model_forward_rows(rt_model *m, rt_state *const *states, const uint32_t *n_tok, uint32_t n_seq,
                                const int32_t *tokens, const rt_outputs *out, g5_error *err);

/* The first NextN/MTP block at MTP positions mtp_n_past .. + n - 1: for each i, from the main
 * model's final-normed hidden state hidden[i] (position p) and the token that follows it,
 * next_tokens[i] (position p + 1), the draft logits for the token after that.
 * draft_logits: all_logits ? [n][n_vocab] : [n_vocab] (last only). G5_ERR_UNSUPPORTED if the
 * model has no NextN block. The hidden input is the final-normed state (rt_outputs.hidden), as
 * vLLM and SGLang feed their MTP modules; enorm/hnorm are applied on top. With several NextN
 * blocks only the first is run. */
g5_status rt_model_mtp(rt_model *m, rt_state *s, const float *hidden, const int32_t *next_tokens,
                       uint32_t n, float *draft_logits, int all_logits, g5_error *err);

/* model.c: chooses one token's experts. logits [n_expert] become the gating scores (sigmoid, or
 * softmax when expert_gating_func = 1); the choice is by score + bias (bias may be NULL) among
 * the topk_group best groups (a group scores the sum of its two best choice values); the weights
 * are the chosen experts' unbiased scores, normalized if expert_weights_norm, times
 * expert_weights_scale. ch/cw [n_expert_used] come out in ascending expert order (the order the
 * experts' outputs are summed in). Ties go to the lower index. Scratch: choice [n_expert],
 * allowed [n_expert], gscore [n_group]. The GPU's router kernel is tested against it. */
void rt_moe_route(const glm5_hparams *hp, float *logits, const float *bias, float *choice,
                  uint8_t *allowed, float *gscore, int32_t *ch, float *cw);

/* ---- stage runs (the GPU --check) ----
 * One stage of one main layer recomputed on the CPU from a caller's input (the GPU's own input
 * to that stage), with the forward pass's own code (attn.c's rt_attn_layer, model.c's FFN/MoE),
 * on caches of the stage run's own, so that each difference is that stage's own error. Needs a
 * model of one rank (G5_ERR_UNSUPPORTED otherwise). A call is rt_stage_begin for n tokens at
 * positions pos0 .., then, layer by layer in order, rt_stage_attn and rt_stage_ffn; positions
 * must follow on from the previous call's (the attention writes its caches at them). */
typedef struct rt_stage rt_stage;
g5_status rt_stage_create(rt_model *m, rt_stage **out, g5_error *err);
void rt_stage_free(rt_stage *s); /* accepts NULL */
g5_status rt_stage_begin(rt_stage *s, uint32_t pos0, uint32_t n, g5_error *err);
/* Main layer il's attention over its input x [n][n_embd]: out [n][n_embd] (the output projection,
 * before the residual add); sel [n][idx_top_k] (may be NULL): the key positions each token
 * attended, ascending, -1 padded. */
void rt_stage_attn(rt_stage *s, uint32_t il, const float *x, float *out, int32_t *sel);
/* Main layer il's FFN or MoE from the residual stream xmid [n][n_embd] after the attention
 * (RMSNorm'ed here): out [n][n_embd]; experts [n][n_expert_used] (may be NULL; MoE layers only):
 * the routed experts, ascending. */
void rt_stage_ffn(rt_stage *s, uint32_t il, const float *xmid, float *out, int32_t *experts);
/* The output head (final RMSNorm and lm_head) over the last main layer's output x [n][n_embd]:
 * logits [n][n_vocab]. */
void rt_stage_head(rt_stage *s, const float *x, float *logits);

#endif
