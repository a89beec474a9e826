/* Self-speculative decoding with the NextN/MTP block (glm5-run --draft mtp) on one sequence of
 * an engine (engine.h: the CPU model or the GPU model alike).
 *
 * Each step drafts one token: the MTP block, fed the main model's final-normed hidden state of
 * the last position and the token just chosen there (plus any pairs it has not seen yet), gives
 * draft logits whose argmax d is the guess for the token after it. One two-token forward call of
 * the main model over [chosen, d] then yields the logits after the chosen token (what a plain
 * decode step gives) and, speculatively, those after d. When the caller's next choice equals d
 * (accepted), those logits are already there and no forward call is needed; otherwise (rejected)
 * d's position is dropped from the main caches and the step drafts again from the new choice.
 * Acceptance is an exact match with the token the caller chose from the main model's own
 * logits, so the output equals plain decoding wherever a two-token call gives the logits of two
 * one-token calls (the CPU reference: bit for bit; the GPU: gpu_model.h, "MTP").
 *
 * Sampling (rt_drafter_set_sampler): the draft is drawn from the caller's sampler over the draft
 * logits (its chain: penalties, top-k/p, temperature; greedy: its argmax), and the caller chooses
 * the next token with samp_sample_spec(target logits, rt_drafter_draft's logits and token), so
 * the draft is kept with probability min(1, p/q) and the output distribution is the model's
 * (a rejected draft is never the token chosen, so "chosen == draft" still means accepted).
 *
 * A step in two halves (rt_drafter_begin, then the caller runs the tokens it names, then
 * rt_drafter_end) lets a server verify the drafts of many sequences in one batched call
 * (rt_eng_decode_rows, and the drafts of many in one rt_eng_mtp_rows call: rt_drafter_begin_many);
 * rt_drafter_step is begin + one rt_eng_decode_rows of its sequence + end.
 *
 * MTP position p holds (hidden state at main position p, token at p + 1); rejected drafts never
 * reach the MTP block, so its caches need no truncation. */
#ifndef G5_RT_DRAFT_H
#define G5_RT_DRAFT_H

#include <stdint.h>

#include "format/status.h"
#include "runtime/engine.h"
#include "runtime/text/sample.h"

typedef struct rt_drafter rt_drafter;

typedef struct rt_draft_stats {
    uint64_t drafted;            /* draft tokens verified */
    uint64_t accepted;           /* of those, equal to the token then chosen */
    uint64_t forwards;           /* main-model forward calls, the prompt's included */
} rt_draft_stats;

/* A drafter on sequence s (its engine must have a NextN block; s outlives the drafter). After a
 * failed call a drafter (and its sequence) must not be used again. */
g5_status rt_drafter_create(rt_eng_seq *s, rt_drafter **out, g5_error *err);
void rt_drafter_free(rt_drafter *d); /* accepts NULL */
/* The prompt (the sequence empty or not): logits all ? [n][V] : [V] (the last). */
g5_status rt_drafter_prompt(rt_drafter *d, const int32_t *ids, uint32_t n, float *logits, int all, g5_error *err);
/* The sequence already holds positions [0, n) of tokens ids[0, n) that the drafter has not seen
 * (a prefix attached from the cache: rt_eng_seq_attach_prefix's n_reused), the drafter being
 * new: their hidden states are read back from the cache (rt_eng_seq_hidden: CPU,
 * opts.kv_prefix_hidden) and queued as the MTP inputs a prompt of those tokens would have left,
 * so the following rt_drafter_prompt and steps make the same MTP calls, bit for bit, as if the
 * prefix had been run. n = 0: nothing. */
g5_status rt_drafter_resume(rt_drafter *d, const int32_t *ids, uint32_t n, g5_error *err);
/* Token y was chosen after the last logits given: the logits [V] of the position after y. */
g5_status rt_drafter_step(rt_drafter *d, int32_t y, float *logits, g5_error *err);
void rt_drafter_get_stats(const rt_drafter *d, rt_draft_stats *out);

/* The first half of rt_drafter_step: token y was chosen after the last logits given. If y is the
 * pending draft (accepted), *ready points at the logits [V] after y (valid until the next call
 * on d) and *n_verify = 0: nothing to run. Otherwise a rejected draft's position is dropped and,
 * with draft set, the MTP block drafts the token after y: tokens[0 .. *n_verify) = [y, draft]
 * (or [y] without draft) must be run on the sequence, and their logits [n][V] and hidden states
 * [n][E] handed to rt_drafter_end before any other call (or rt_drafter_abort if that failed). */
g5_status rt_drafter_begin(rt_drafter *d, int32_t y, int draft, const float **ready, int32_t tokens[2], uint32_t *n_verify,
                           g5_error *err);
/* rt_drafter_begin for n drafters on distinct sequences of one engine, draft[i] and y[i] each;
 * the MTP calls of those that draft are one rt_eng_mtp_rows call (one batched step on the GPU,
 * each row with the bits it has alone). ready[i] and n_verify[i] as begin's; tokens: the rows to
 * run, drafter after drafter (n_verify[i] each), as rt_eng_decode_rows takes them. */
g5_status rt_drafter_begin_many(rt_drafter *const *d, uint32_t n, const int32_t *y, const int *draft,
                                const float **ready, int32_t *tokens, uint32_t *n_verify, g5_error *err);
g5_status rt_drafter_end(rt_drafter *d, const float *logits, const float *hidden, g5_error *err);
/* The verifying call failed (the sequence has not advanced): begin's state is forgotten; the
 * drafter must not be used again (its pairs may name positions that never ran). */
void rt_drafter_abort(rt_drafter *d);
/* The pending (unverified) draft: its token in *tok and the draft logits [V] it was drawn from,
 * valid until the next call on d; NULL when none is pending. */
const float *rt_drafter_draft(const rt_drafter *d, int32_t *tok);
/* The draft is drawn with samp (which must outlive its use here; NULL: the draft logits' argmax,
 * the default). */
void rt_drafter_set_sampler(rt_drafter *d, samp_ctx *samp);

/* Called after each MTP call with its n input pairs (at MTP positions p0 .. p0 + n - 1) and the
 * draft logits [n_vocab] of the last, which it may rewrite (tests drive both the accept and the
 * reject path with it); a failure fails the step. NULL: none. */
typedef g5_status (*rt_draft_observer)(void *user, uint32_t p0, const float *hidden, const int32_t *next,
                                       uint32_t n, float *draft, g5_error *err);
void rt_drafter_set_observer(rt_drafter *d, rt_draft_observer fn, void *user);

#endif
