/* Token sampling and stop conditions.
 *
 * The chain follows llama.cpp's default order and semantics:
 *   repetition / frequency / presence penalties over the last repeat_last_n accepted tokens
 *   -> top-k -> top-p -> min-p -> temperature -> softmax -> one draw.
 * temperature <= 0 means greedy: the largest logit after the penalties (lowest id on ties).
 * Penalties (llama.cpp): a token seen in the window has its logit divided by repeat_penalty if
 * positive, multiplied by it if not; then count * frequency_penalty + presence_penalty is
 * subtracted.
 * top-p keeps the most probable tokens until their cumulative probability reaches top_p (the
 * token that crosses it included); min-p keeps tokens whose probability is at least
 * min_p * the largest probability. At least one token always survives.
 * Probabilities are integer masses: a candidate's weight e^((logit - largest logit) / T) (the
 * largest has 1; min-p and top-p use the weights at temperature 1) computed by format/det_exp.h,
 * times 2^K and truncated (K = 63 - the bit length of n_vocab: 45 for GLM-5's 154880 tokens, so a
 * token 2^-45 below the most probable one has mass 0). Sums of masses are exact in any order, so
 * top-p's running sum and the draw are the same on the host and on the GPU. min-p keeps the
 * tokens whose weight is at least min_p; top-p keeps the tokens whose logit is at least v, the
 * largest logit such that the tokens at or above it hold top_p of the mass of the set top-k left
 * (the shortest ranked prefix reaching it, with the ties of its last). The draw takes
 * r = floor(u * total mass) (u from the random stream, 53 bits) and the first kept token, by
 * ascending id, whose running mass passes r: no ranking order enters the draw, so a draw with
 * nothing to rank (OpenAI's defaults) needs no sort.
 *
 * Randomness comes from our own xoshiro256** seeded through splitmix64, the weights from our own
 * exp and the draw from integer sums, so a seed gives the same tokens on every platform and build
 * for the same logits. */
#ifndef G5_SAMPLE_H
#define G5_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "format/status.h"

typedef struct samp_params {
    float temperature;        /* <= 0: greedy */
    int32_t top_k;            /* <= 0: off */
    float top_p;              /* >= 1: off */
    float min_p;              /* <= 0: off */
    float repeat_penalty;     /* 1: off */
    float frequency_penalty;  /* 0: off */
    float presence_penalty;   /* 0: off */
    int32_t repeat_last_n;    /* window of accepted tokens the penalties look at; 0: off */
    uint64_t seed;
} samp_params;

/* temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, penalties off, repeat_last_n 64, seed 0
 * (llama.cpp's defaults, except the seed). */
void samp_params_default(samp_params *p);

typedef struct samp_ctx samp_ctx;

g5_status samp_create(const samp_params *p, uint32_t n_vocab, samp_ctx **out, g5_error *err);
void samp_free(samp_ctx *s); /* accepts NULL */

/* Records a token as part of the history the penalties see (prompt tokens too, if wanted). */
void samp_accept(samp_ctx *s, int32_t id);
/* Forgets the history and restarts the random stream from the seed. */
void samp_reset(samp_ctx *s);

/* One candidate after the chain: its id, the logit it ended with, its probability. */
typedef struct samp_cand {
    int32_t id;
    float logit;
    float p;
} samp_cand;

/* Runs the chain on logits[n_vocab] (not modified) without drawing: writes the surviving
 * candidates, most probable first (ties: lower id first, whatever order the draw walks), at most
 * cap of them; *n receives how
 * many survived. G5_ERR_BOUNDS if cap was too small; G5_ERR_INVALID_ARG if every logit is NaN or
 * -inf. Greedy mode yields the single argmax with p = 1. */
g5_status samp_candidates(samp_ctx *s, const float *logits, samp_cand *out, size_t cap, size_t *n,
                          g5_error *err);

/* 1 if samp_sample's next token is the argmax of the logits as given (greedy, and no penalty
 * applies to the window as it is now): the largest logit, the lowest id on ties, NaN never, and
 * G5_ERR_INVALID_ARG where that logit is not > -inf. A caller may then take the argmax computed
 * elsewhere (on the GPU: rt_eng_decode_argmax) instead of calling samp_sample, with
 * samp_argmax_check for the refusal. samp_params_argmax: 1 if every draw of a sampler made with
 * p is the argmax, whatever its window (decided from the options alone). */
int samp_is_argmax(const samp_ctx *s);
int samp_params_argmax(const samp_params *p);
/* G5_OK if an argmax whose logit is `logit` is the sampler's token, else samp_sample's refusal of
 * those logits (every logit NaN or -inf). */
g5_status samp_argmax_check(float logit, g5_error *err);

/* A draw a device makes from the raw logits of one row (cuda/cuk_sample.h: the same chain, the
 * same masses, the same token). */
typedef struct samp_dev_row {
    float temperature; /* <= 0: the argmax (larger logit, then lower id; NaN never) */
    float min_p;       /* <= 0: off */
    float top_p;       /* >= 1: off */
    int32_t top_k;     /* <= 0 or >= n_vocab: off */
    double lmin;       /* log(min_p) where on (only its neighbourhood matters: any libm's will do) */
    uint64_t k;        /* a sampled draw's 53 random bits */
    /* The penalties in force: the window's distinct ids, ascending, and their counts (n_pen 0:
     * none), in the sampler's own arrays (valid until its next call), applied to those ids'
     * logits first as the chain applies them (dx_penalized, NaN read as -inf). */
    float repeat_penalty, frequency_penalty, presence_penalty;
    uint32_t n_pen;
    const int32_t *pen_ids;
    const uint32_t *pen_counts;
} samp_dev_row;

/* 1 if samp_sample's next draw is one a device can make: every draw (greedy or sampled, with the
 * penalties in force passed along). */
int samp_device_ok(const samp_ctx *s);
/* 1 if every draw of a sampler made with p over n_vocab tokens is one a device makes, whatever its
 * window (decided from the options alone, as samp_params_argmax). */
int samp_params_device(const samp_params *p, uint32_t n_vocab);
/* Where samp_device_ok: 1 and *row describing the draw, a sampled draw's random number taken from
 * the stream as samp_sample would take it, so the device's token must be used as this draw. 0,
 * with nothing taken, where the draw needs samp_sample. */
int samp_device_row(samp_ctx *s, samp_dev_row *row);
/* The device's draw computed here (what rt_eng_decode_draw does without a device): the token
 * samp_sample would have drawn from logits[n_vocab], -1 where no logit is > -inf (samp_sample
 * refuses those). */
int32_t samp_device_draw(const samp_dev_row *row, const float *logits, uint32_t n_vocab);

/* Runs the chain and draws one token. Does not call samp_accept. */
g5_status samp_sample(samp_ctx *s, const float *logits, int32_t *id, g5_error *err);

/* Speculative sampling: x was drawn from the chain's distribution q over draft_logits (a
 * draft model's, with this context in the same state, e.g. samp_sample on them); draws the next
 * token so that its distribution is the chain's p over target_logits whatever q is: x is kept
 * with probability min(1, p(x) / q(x)), otherwise the token comes from normalize(max(0, p - q))
 * (never x then). Greedy mode: the argmax of target_logits (samp_sample), no randomness used.
 * *accepted (may be NULL): 1 if the result is x. Does not call samp_accept. */
g5_status samp_sample_spec(samp_ctx *s, const float *target_logits, const float *draft_logits, int32_t x,
                           int32_t *id, int *accepted, g5_error *err);

/* The next raw random number in [0, 1) (53 bits), for tests and callers that need one. */
double samp_rand(samp_ctx *s);

/* ---- stop strings ----
 * The caller keeps the generated text; after appending a token's bytes (new_len of them) it
 * asks whether a stop string now occurs. Only the region a new match can touch is searched (the
 * new bytes plus the longest stop's length - 1 before them), so stops that span several tokens
 * are found. Returns the index of the stop found (the earliest occurrence; at equal positions
 * the lower index) and its byte offset in *pos, or -1. Empty stop strings are ignored. */
int samp_stop_find(const char *text, size_t len, size_t new_len, const char *const *stops,
                   size_t n_stops, size_t *pos);
/* Length of the longest suffix of text that is a proper prefix of some stop string: bytes a
 * streaming printer should hold back because they may still turn into a stop. */
size_t samp_stop_holdback(const char *text, size_t len, const char *const *stops, size_t n_stops);

#endif
