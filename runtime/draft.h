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
 * MTP position p holds (hidden state at main position p, token at p + 1); rejected drafts never
 * reach the MTP block, so its caches need no truncation. */
#ifndef G5_RT_DRAFT_H
#define G5_RT_DRAFT_H

#include <stdint.h>

#include "format/status.h"
#include "runtime/engine.h"

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
/* Token y was chosen after the last logits given: the logits [V] of the position after y. */
g5_status rt_drafter_step(rt_drafter *d, int32_t y, float *logits, g5_error *err);
void rt_drafter_get_stats(const rt_drafter *d, rt_draft_stats *out);

/* Called after each MTP call with its n input pairs (at MTP positions p0 .. p0 + n - 1) and the
 * draft logits [n_vocab] of the last, which it may rewrite (tests drive both the accept and the
 * reject path with it); a failure fails the step. NULL: none. */
typedef g5_status (*rt_draft_observer)(void *user, uint32_t p0, const float *hidden, const int32_t *next,
                                       uint32_t n, float *draft, g5_error *err);
void rt_drafter_set_observer(rt_drafter *d, rt_draft_observer fn, void *user);

#endif
