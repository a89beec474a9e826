/* Self-speculative decoding with the NextN/MTP block (draft.h). */
#include "runtime/draft.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TRY(call)                                                                             \
    do {                                                                                      \
        g5_status st_ = (call);                                                               \
        if (st_) return st_;                                                                  \
    } while (0)

struct rt_drafter {
    rt_eng_seq *s;
    uint32_t n_vocab, n_embd;
    rt_draft_observer obs;
    void *obs_user;
    float *lg;                   /* [2][V] the last verifying call's logits */
    float *hid;                  /* [2][E] its hidden states */
    float *dr;                   /* [V] draft logits */
    float *ph;                   /* [cap][E] MTP inputs not run yet */
    int32_t *pt;                 /* [cap] the token following each */
    uint32_t np, cap;
    float *hlast;                /* [E] hidden state of the last main position (have_last) */
    int have_last;
    int pending;                 /* the main caches end with the unverified draft token dtok */
    int32_t dtok;
    uint32_t verifying;          /* rt_drafter_begin asked for this many tokens to be run */
    samp_ctx *samp;              /* draws the draft (NULL: the draft logits' argmax) */
    rt_draft_stats st;
};

static g5_status pairs_reserve(rt_drafter *d, uint64_t need, g5_error *err) {
    if (need <= d->cap) return G5_OK;
    const uint64_t E = d->n_embd;
    uint64_t nc = d->cap ? d->cap : 4, bytes;
    while (nc < need) nc *= 2;
    if (nc > UINT32_MAX || g5_mul_u64(nc, E * sizeof(float), &bytes) || bytes > SIZE_MAX)
        return g5_fail(err, G5_ERR_OVERFLOW, "draft: %llu pending MTP inputs", (unsigned long long)need);
    float *ph = realloc(d->ph, (size_t)bytes);
    if (!ph) return g5_fail(err, G5_ERR_NOMEM, "draft: %llu pending MTP inputs", (unsigned long long)need);
    d->ph = ph;
    int32_t *pt = realloc(d->pt, (size_t)nc * sizeof *pt);
    if (!pt) return g5_fail(err, G5_ERR_NOMEM, "draft: %llu pending MTP inputs", (unsigned long long)need);
    d->pt = pt;
    d->cap = (uint32_t)nc;
    return G5_OK;
}

/* Appends (hidden state at p, token at p + 1) for the next MTP call (capacity reserved). */
static void pair_add(rt_drafter *d, const float *h, int32_t next) {
    const size_t E = d->n_embd;
    memcpy(d->ph + (size_t)d->np * E, h, E * sizeof(float));
    d->pt[d->np++] = next;
}

g5_status rt_drafter_create(rt_eng_seq *s, rt_drafter **out, g5_error *err) {
    *out = NULL;
    if (!s) return g5_fail(err, G5_ERR_INVALID_ARG, "draft: no sequence");
    const rt_eng *e = rt_eng_seq_engine(s);
    if (!rt_eng_has_mtp(e)) return g5_fail(err, G5_ERR_UNSUPPORTED, "draft: the model has no NextN/MTP block");
    rt_drafter *d = calloc(1, sizeof *d);
    if (!d) return g5_fail(err, G5_ERR_NOMEM, "drafter");
    d->s = s;
    d->n_vocab = rt_eng_hparams(e)->n_vocab;
    d->n_embd = rt_eng_hparams(e)->n_embd;
    const size_t V = d->n_vocab, E = d->n_embd;
    d->lg = malloc(2 * V * sizeof(float));
    d->hid = malloc(2 * E * sizeof(float));
    d->dr = malloc(V * sizeof(float));
    d->hlast = malloc(E * sizeof(float));
    g5_status st = d->lg && d->hid && d->dr && d->hlast ? pairs_reserve(d, 4, err)
                                                        : g5_fail(err, G5_ERR_NOMEM, "drafter");
    if (st) {
        rt_drafter_free(d);
        return st;
    }
    *out = d;
    return G5_OK;
}

void rt_drafter_set_observer(rt_drafter *d, rt_draft_observer fn, void *user) {
    d->obs = fn;
    d->obs_user = user;
}

void rt_drafter_free(rt_drafter *d) {
    if (!d) return;
    free(d->lg);
    free(d->hid);
    free(d->dr);
    free(d->ph);
    free(d->pt);
    free(d->hlast);
    free(d);
}

void rt_drafter_get_stats(const rt_drafter *d, rt_draft_stats *out) { *out = d->st; }

/* An unverified draft token at the end of the main caches is dropped; the hidden state before it
 * becomes the last one. */
static g5_status settle(rt_drafter *d, g5_error *err) {
    if (!d->pending) return G5_OK;
    const uint32_t n_past = rt_eng_seq_n_past(d->s);
    if (!n_past) return g5_fail(err, G5_ERR_INVALID_ARG, "draft: nothing to drop");
    TRY(rt_eng_truncate(d->s, n_past - 1, rt_eng_seq_mtp_n_past(d->s), err));
    d->pending = 0;
    memcpy(d->hlast, d->hid, d->n_embd * sizeof(float));
    return G5_OK;
}

g5_status rt_drafter_prompt(rt_drafter *d, const int32_t *ids, uint32_t n, float *logits, int all, g5_error *err) {
    if (n == 0) return G5_OK;
    const size_t E = d->n_embd;
    float *hidden = malloc((size_t)n * E * sizeof(float));
    if (!hidden) return g5_fail(err, G5_ERR_NOMEM, "draft: hidden states of %u tokens", n);
    g5_status st = settle(d, err);
    if (!st) st = pairs_reserve(d, (uint64_t)d->np + n, err);
    if (!st) st = rt_eng_prefill(d->s, ids, n, &(rt_eng_out){.logits = logits, .all_logits = all, .hidden = hidden}, err);
    if (!st) {
        d->st.forwards++;
        if (d->have_last) pair_add(d, d->hlast, ids[0]);
        for (uint32_t t = 0; t + 1 < n; t++) pair_add(d, hidden + (size_t)t * E, ids[t + 1]);
        memcpy(d->hlast, hidden + (size_t)(n - 1) * E, E * sizeof(float));
        d->have_last = 1;
    }
    free(hidden);
    return st;
}

g5_status rt_drafter_resume(rt_drafter *d, const int32_t *ids, uint32_t n, g5_error *err) {
    if (n == 0) return G5_OK;
    if (d->have_last || d->np || d->pending || d->verifying || rt_eng_seq_mtp_n_past(d->s))
        return g5_fail(err, G5_ERR_INVALID_ARG, "draft: resuming over %u cached positions with a drafter in use", n);
    if (rt_eng_seq_n_past(d->s) < n)
        return g5_fail(err, G5_ERR_INVALID_ARG, "draft: resuming over %u positions, the sequence holds %u", n,
                       rt_eng_seq_n_past(d->s));
    TRY(pairs_reserve(d, n, err));
    /* position t's state goes straight into its pair slot; the last one becomes hlast */
    TRY(rt_eng_seq_hidden(d->s, 0, n - 1, d->ph, err));
    TRY(rt_eng_seq_hidden(d->s, n - 1, 1, d->hlast, err));
    for (uint32_t t = 0; t + 1 < n; t++) d->pt[t] = ids[t + 1];
    d->np = n - 1;
    d->have_last = 1;
    return G5_OK;
}

/* begin up to the MTP call: 1 in *mtp when d->np pairs wait for it (tokens[0] = y set). */
static g5_status begin_prep(rt_drafter *d, int32_t y, int draft, const float **ready, int32_t tokens[2],
                            uint32_t *n_verify, int *mtp, g5_error *err) {
    const size_t V = d->n_vocab, E = d->n_embd;
    *ready = NULL;
    *n_verify = 0;
    *mtp = 0;
    if (!d->have_last) return g5_fail(err, G5_ERR_INVALID_ARG, "draft: a step before the prompt");
    if (d->verifying) return g5_fail(err, G5_ERR_INVALID_ARG, "draft: a step before the last one's verification");
    TRY(pairs_reserve(d, (uint64_t)d->np + 2, err));
    if (d->pending && y == d->dtok) { /* accepted: the logits after y are there */
        d->pending = 0;
        d->st.accepted++;
        pair_add(d, d->hid, y);
        memcpy(d->hlast, d->hid + E, E * sizeof(float));
        *ready = d->lg + V;
        return G5_OK;
    }
    TRY(settle(d, err));
    pair_add(d, d->hlast, y);
    tokens[0] = y;
    *n_verify = 1;
    *mtp = draft != 0;
    if (!draft) {
        d->verifying = 1;
        d->dtok = -1;
    }
    return G5_OK;
}

/* begin after the MTP call of d's d->np pairs at MTP positions p0 .., whose draft logits are in
 * d->dr: the observer, the draft token. */
static g5_status begin_finish(rt_drafter *d, uint32_t p0, int32_t tokens[2], uint32_t *n_verify, g5_error *err) {
    const size_t V = d->n_vocab;
    if (d->obs) TRY(d->obs(d->obs_user, p0, d->ph, d->pt, d->np, d->dr, err));
    d->np = 0;
    int32_t best = 0;
    if (d->samp) { /* drawn from the request's own chain (greedy: its argmax) */
        TRY(samp_sample(d->samp, d->dr, &best, err));
    } else { /* greedy draft; ties to the lowest id */
        for (uint32_t v = 1; v < V; v++)
            if (d->dr[v] > d->dr[best]) best = (int32_t)v;
    }
    tokens[1] = best;
    *n_verify = 2;
    d->verifying = 2;
    d->dtok = best;
    return G5_OK;
}

g5_status rt_drafter_begin(rt_drafter *d, int32_t y, int draft, const float **ready, int32_t tokens[2], uint32_t *n_verify,
                           g5_error *err) {
    int mtp;
    TRY(begin_prep(d, y, draft, ready, tokens, n_verify, &mtp, err));
    if (!mtp) return G5_OK;
    rt_eng_seq *s = d->s;
    const uint32_t p0 = rt_eng_seq_mtp_n_past(s);
    TRY(rt_eng_mtp_rows(rt_eng_seq_engine(s), &s, &d->np, 1, d->ph, d->pt, d->dr, err));
    return begin_finish(d, p0, tokens, n_verify, err);
}

g5_status rt_drafter_begin_many(rt_drafter *const *d, uint32_t n, const int32_t *y, const int *draft,
                                const float **ready, int32_t *tokens, uint32_t *n_verify, g5_error *err) {
    if (n == 0) return G5_OK;
    const size_t V = d[0]->n_vocab, E = d[0]->n_embd;
    int *mtp = malloc(n * sizeof *mtp);
    uint32_t *np = malloc(n * sizeof *np), *p0 = malloc(n * sizeof *p0), *at = malloc(n * sizeof *at);
    rt_eng_seq **seqs = malloc(n * sizeof *seqs);
    int32_t (*tk)[2] = malloc(n * sizeof *tk);
    g5_status st = mtp && np && p0 && at && seqs && tk ? G5_OK : g5_fail(err, G5_ERR_NOMEM, "draft: %u drafters", n);
    uint32_t k = 0, rows = 0;
    for (uint32_t i = 0; i < n && !st; i++) {
        st = begin_prep(d[i], y[i], draft[i], &ready[i], tk[i], &n_verify[i], &mtp[i], err);
        if (st || !mtp[i]) continue;
        seqs[k] = d[i]->s;
        np[k] = d[i]->np;
        p0[k] = rt_eng_seq_mtp_n_past(d[i]->s);
        at[k++] = i;
        rows += d[i]->np;
    }
    float *hs = NULL, *dr = NULL;
    int32_t *nx = NULL;
    if (!st && k) { /* the pairs of every drafting sequence side by side */
        hs = malloc((size_t)rows * E * sizeof *hs);
        nx = malloc((size_t)rows * sizeof *nx);
        dr = malloc((size_t)k * V * sizeof *dr);
        if (!hs || !nx || !dr) st = g5_fail(err, G5_ERR_NOMEM, "draft: %u MTP rows", rows);
        for (uint32_t j = 0, r0 = 0; j < k && !st; r0 += np[j++]) {
            memcpy(hs + (size_t)r0 * E, d[at[j]]->ph, (size_t)np[j] * E * sizeof *hs);
            memcpy(nx + r0, d[at[j]]->pt, (size_t)np[j] * sizeof *nx);
        }
        if (!st) st = rt_eng_mtp_rows(rt_eng_seq_engine(seqs[0]), seqs, np, k, hs, nx, dr, err);
        for (uint32_t j = 0; j < k && !st; j++) {
            memcpy(d[at[j]]->dr, dr + (size_t)j * V, V * sizeof *dr);
            st = begin_finish(d[at[j]], p0[j], tk[at[j]], &n_verify[at[j]], err);
        }
    }
    for (uint32_t i = 0, r = 0; i < n && !st; r += n_verify[i++])
        memcpy(tokens + r, tk[i], n_verify[i] * sizeof *tokens);
    free(mtp);
    free(np);
    free(p0);
    free(at);
    free(seqs);
    free(tk);
    free(hs);
    free(nx);
    free(dr);
    return st;
}

g5_status rt_drafter_end(rt_drafter *d, const float *logits, const float *hidden, g5_error *err) {
    const size_t V = d->n_vocab, E = d->n_embd;
    const uint32_t n = d->verifying;
    if (!n) return g5_fail(err, G5_ERR_INVALID_ARG, "draft: no verification pending");
    d->verifying = 0;
    d->st.forwards++;
    if (logits != d->lg) memcpy(d->lg, logits, n * V * sizeof(float));
    if (hidden != d->hid) memcpy(d->hid, hidden, n * E * sizeof(float));
    if (n == 2) {
        d->st.drafted++;
        d->pending = 1;
    } else {
        memcpy(d->hlast, d->hid, E * sizeof(float));
    }
    return G5_OK;
}

void rt_drafter_abort(rt_drafter *d) { d->verifying = 0; }

const float *rt_drafter_draft(const rt_drafter *d, int32_t *tok) {
    if (!d->pending) return NULL;
    *tok = d->dtok;
    return d->dr;
}

void rt_drafter_set_sampler(rt_drafter *d, samp_ctx *samp) { d->samp = samp; }

g5_status rt_drafter_step(rt_drafter *d, int32_t y, float *logits, g5_error *err) {
    const size_t V = d->n_vocab;
    const float *ready;
    int32_t two[2];
    uint32_t n;
    TRY(rt_drafter_begin(d, y, 1, &ready, two, &n, err));
    if (ready) {
        memcpy(logits, ready, V * sizeof(float));
        return G5_OK;
    }
    /* d->lg / d->hid are the verification's outputs directly; rows of a decode step, so that
     * on the GPU each has a one-token step's bits */
    rt_eng_seq *s = d->s;
    g5_status st = rt_eng_decode_rows(rt_eng_seq_engine(s), &s, &n, 1, two,
                                      &(rt_eng_out){.logits = d->lg, .all_logits = 1, .hidden = d->hid}, err);
    if (st) {
        rt_drafter_abort(d);
        return st;
    }
    TRY(rt_drafter_end(d, d->lg, d->hid, err));
    memcpy(logits, d->lg, V * sizeof(float));
    return G5_OK;
}
