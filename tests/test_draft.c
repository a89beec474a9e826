/* Self-speculative decoding (runtime/draft.h) on the oracle's CPU model: greedy decoding with
 * the drafter gives the tokens and the logits, bit for bit, of plain one-token decoding.
 *  - with the model's own MTP block (the oracle's random weights: drafts are rarely right, so
 *    this covers the reject path: the main caches dropping the draft's position);
 *  - with a stand-in MTP operation that still runs the real block (its caches advance) but
 *    replaces its draft by the true next token in a fixed pattern of right and wrong guesses,
 *    so both paths run with a known count; it also checks every pair the drafter feeds the block:
 *    at MTP position p, the main model's hidden state at p (bit for bit that of the plain run)
 *    and the token at p + 1, positions consecutive.
 * Everything runs through the engine (runtime/engine.h) on the CPU.
 * Also the refusals: a step before the prompt, no sequence. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/cpu/weights.h"
#include "runtime/draft.h"
#include "runtime/engine.h"
#include "tests/test_util.h"

enum { N_PROMPT = 40, N_GEN = 30 };

static uint32_t argmax_f(const float *v, uint32_t n) {
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

/* The plain run: tokens S[0 .. N_PROMPT + N_GEN), hidden states H[p] and the logits L[j] each
 * generated token was chosen from. */
typedef struct plain {
    int32_t seq[N_PROMPT + N_GEN];
    float *hid;                  /* [N_PROMPT + N_GEN][E] */
    float *lg;                   /* [N_GEN][V] */
} plain;

/* The stand-in MTP operation (see the top): an observer of the real block's calls. */
typedef struct cheat {
    const plain *pl;
    uint32_t E, V;
    uint32_t bad_pairs, calls;
} cheat;

static g5_status cheat_mtp(void *user, uint32_t p0, const float *hidden, const int32_t *next, uint32_t n,
                           float *draft, g5_error *err) {
    (void)err;
    cheat *c = user;
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t p = p0 + i;
        const int ok = p + 1 < N_PROMPT + N_GEN && next[i] == c->pl->seq[p + 1] &&
                       memcmp(hidden + (size_t)i * c->E, c->pl->hid + (size_t)p * c->E, c->E * sizeof(float)) == 0;
        c->bad_pairs += !ok;
    }
    c->calls++;
    /* the last pair is (hidden at q, token at q + 1): the draft guesses the token at q + 2 */
    const uint32_t q2 = p0 + n + 1;
    if (q2 < N_PROMPT + N_GEN) {
        for (uint32_t v = 0; v < c->V; v++) draft[v] = 0.0f;
        const int right = (q2 - N_PROMPT) % 3 != 2; /* generated token k = q2 - N_PROMPT */
        const int32_t t = c->pl->seq[q2];
        draft[right ? t : (t + 1) % (int32_t)c->V] = 1.0f;
    }
    return G5_OK;
}

/* Greedy decoding through a drafter; the tokens and logits must be the plain run's. */
static void run_drafted(rt_eng *en, const plain *pl, cheat *c, const char *label, rt_draft_stats *stats) {
    const uint32_t V = rt_eng_hparams(en)->n_vocab;
    g5_error e = {0};
    rt_eng_seq *s = NULL;
    rt_drafter *d = NULL;
    T_CHECK(rt_eng_seq_create(en, 0, &s, &e) == G5_OK, "%s: sequence: %s", label, e.msg);
    if (s) T_CHECK(rt_drafter_create(s, &d, &e) == G5_OK, "%s: create: %s", label, e.msg);
    if (!d) {
        rt_eng_seq_free(s);
        return;
    }
    if (c) rt_drafter_set_observer(d, cheat_mtp, c);
    float *lg = malloc((size_t)V * sizeof(float));
    uint32_t tok_bad = 0, lg_bad = 0;
    g5_status st = rt_drafter_prompt(d, pl->seq, N_PROMPT, lg, 0, &e);
    T_CHECK(st == G5_OK, "%s: prompt: %s", label, e.msg);
    for (uint32_t j = 0; j < N_GEN && !st; j++) {
        lg_bad += memcmp(lg, pl->lg + (size_t)j * V, (size_t)V * sizeof(float)) != 0;
        const int32_t y = (int32_t)argmax_f(lg, V);
        tok_bad += y != pl->seq[N_PROMPT + j];
        if (j + 1 < N_GEN) {
            st = rt_drafter_step(d, y, lg, &e);
            T_CHECK(st == G5_OK, "%s: step %u: %s", label, j, e.msg);
        }
    }
    rt_drafter_get_stats(d, stats);
    printf("%s: %u generated tokens, %u differ from plain decoding, %u logits rows not bit-identical; "
           "%llu drafted, %llu accepted, %llu forward calls\n", label, N_GEN, tok_bad, lg_bad,
           (unsigned long long)stats->drafted, (unsigned long long)stats->accepted,
           (unsigned long long)stats->forwards);
    T_CHECK(tok_bad == 0 && lg_bad == 0, "%s: %u tokens, %u logits rows differ", label, tok_bad, lg_bad);
    T_CHECK(stats->drafted + stats->accepted == N_GEN - 1, "%s: %llu drafted + %llu accepted != %u steps", label,
            (unsigned long long)stats->drafted, (unsigned long long)stats->accepted, N_GEN - 1);
    free(lg);
    rt_drafter_free(d);
    rt_eng_seq_free(s);
}

int main(void) {
    struct stat sb;
    if (stat(T_ORACLE_GGUF, &sb) != 0) {
        printf("oracle missing at %s\n", T_ORACLE_GGUF);
        T_CHECK(0, "oracle present");
        return t_report("test_draft");
    }
    g5_error e = {0};
    rt_wset *ws = NULL;
    rt_eng *en = NULL;
    T_CHECK(rt_wset_open_gguf(T_ORACLE_GGUF, &ws, &e) == G5_OK, "open: %s", e.msg);
    rt_eng_opts eo;
    rt_eng_opts_default(&eo);
    eo.n_threads = 2;
    if (ws) T_CHECK(rt_eng_create(ws, &eo, &en, &e) == G5_OK && rt_eng_load(en, &e) == G5_OK, "engine: %s", e.msg);
    if (!en) {
        rt_wset_free(ws);
        return t_report("test_draft");
    }
    T_CHECK(rt_eng_has_mtp(en), "the oracle has a NextN block");
    const uint32_t V = rt_eng_hparams(en)->n_vocab, E = rt_eng_hparams(en)->n_embd;

    /* the plain run */
    plain pl;
    pl.hid = malloc((size_t)(N_PROMPT + N_GEN) * E * sizeof(float));
    pl.lg = malloc((size_t)N_GEN * V * sizeof(float));
    uint64_t rng = 0x5eed;
    for (uint32_t i = 0; i < N_PROMPT; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        pl.seq[i] = (int32_t)((rng >> 33) % V);
    }
    rt_eng_seq *s = NULL;
    g5_status st = rt_eng_seq_create(en, 0, &s, &e);
    T_CHECK(st == G5_OK, "sequence: %s", e.msg);
    rt_eng_out o = {.logits = pl.lg, .hidden = pl.hid};
    if (!st) st = rt_eng_prefill(s, pl.seq, N_PROMPT, &o, &e);
    for (uint32_t j = 0; j < N_GEN && !st; j++) {
        pl.seq[N_PROMPT + j] = (int32_t)argmax_f(pl.lg + (size_t)j * V, V);
        if (j + 1 == N_GEN) break;
        o.logits = pl.lg + (size_t)(j + 1) * V;
        o.hidden = pl.hid + (size_t)(N_PROMPT + j) * E;
        st = rt_eng_prefill(s, &pl.seq[N_PROMPT + j], 1, &o, &e);
    }
    T_CHECK(st == G5_OK, "plain run: %s", e.msg);
    /* the last generated token's hidden state (the stand-in compares up to it) */
    if (!st) {
        o.logits = NULL;
        o.hidden = pl.hid + (size_t)(N_PROMPT + N_GEN - 1) * E;
        st = rt_eng_prefill(s, &pl.seq[N_PROMPT + N_GEN - 1], 1, &o, &e);
    }
    rt_eng_seq_free(s);
    s = NULL;

    if (!st) {
        /* the model's own block */
        rt_draft_stats ds;
        run_drafted(en, &pl, NULL, "draft, the oracle's MTP block", &ds);
        T_CHECK(ds.forwards == 1 + ds.drafted, "forward calls %llu", (unsigned long long)ds.forwards);

        /* the stand-in: right twice, wrong once */
        cheat c = {.pl = &pl, .E = E, .V = V};
        run_drafted(en, &pl, &c, "draft, stand-in MTP right 2 of 3", &ds);
        printf("stand-in MTP: %u calls, %u pairs not (hidden at p, token at p + 1)\n", c.calls, c.bad_pairs);
        T_CHECK(c.bad_pairs == 0, "%u MTP input pairs wrong", c.bad_pairs);
        T_CHECK(ds.accepted >= (N_GEN - 1) / 3, "only %llu drafts accepted", (unsigned long long)ds.accepted);
        T_CHECK(ds.forwards < N_GEN, "%llu forward calls: no saving", (unsigned long long)ds.forwards);

        /* refusals */
        T_CHECK(rt_eng_seq_create(en, 0, &s, &e) == G5_OK, "sequence: %s", e.msg);
        rt_drafter *d = NULL;
        float *lg = malloc((size_t)V * sizeof(float));
        if (s) T_CHECK(rt_drafter_create(s, &d, &e) == G5_OK, "create: %s", e.msg);
        if (d) T_CHECK(rt_drafter_step(d, 1, lg, &e) == G5_ERR_INVALID_ARG, "a step before the prompt accepted");
        rt_drafter_free(d);
        d = NULL;
        T_CHECK(rt_drafter_create(NULL, &d, &e) == G5_ERR_INVALID_ARG && !d, "a drafter without a sequence accepted");
        free(lg);
        rt_eng_seq_free(s);
    }
    free(pl.hid);
    free(pl.lg);
    rt_eng_free(en);
    rt_wset_free(ws);
    return t_report("test_draft");
}
