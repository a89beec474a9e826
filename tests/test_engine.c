/* The engine (runtime/engine.h) on the CPU, on the oracle: every call is the CPU model's own call,
 * so its results are bit-identical to rt_model_* on a model of its own over the same set:
 * prefill (last and all logits, hidden states), a batched decode step of three sequences (each
 * row equal to that sequence's one-token call), truncation and replay, batched rows of several
 * tokens per sequence (rt_eng_decode_rows, equal to each sequence's own call), the MTP block; the
 * shared pool's counts and its exhaustion (G5_ERR_NOMEM, nothing changed); MTP drafting over a
 * prefix attached from the cache (the pool keeping hidden states: rt_eng_seq_hidden equal to the
 * prefill's, rt_drafter_resume giving the MTP calls and logits of a run without the cache, bit
 * for bit; refused where not kept); the refusals: a
 * sequence before rt_eng_load, a decode with another engine's sequence, and RT_ENG_CUDA in a
 * build without CUDA. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/cpu/model.h"
#include "runtime/cpu/weights.h"
#include "runtime/draft.h"
#include "runtime/engine.h"
#include "tests/test_util.h"

enum { NP = 12, NS = 3 };

static int same(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }


/* MTP calls seen by a drafter's observer: each call's first position, pair count and draft logits. */
enum { MAXC = 16 };
typedef struct mtp_log {
    uint32_t n_calls, p0[MAXC], n[MAXC];
    float *draft;                /* [MAXC][V] */
    size_t V;
} mtp_log;

static g5_status log_mtp(void *user, uint32_t p0, const float *hidden, const int32_t *next, uint32_t n, float *draft,
                         g5_error *err) {
    (void)hidden, (void)next, (void)err;
    mtp_log *l = user;
    if (l->n_calls < MAXC) {
        l->p0[l->n_calls] = p0;
        l->n[l->n_calls] = n;
        memcpy(l->draft + l->n_calls * l->V, draft, l->V * sizeof(float));
    }
    l->n_calls++;
    return G5_OK;
}

/* A drafter on q: optionally resumed over q's first n_reused positions, then the rest of prompt
 * [0, np) in one call and ng greedy steps; out_logits [ng + 1][V] (the prompt's, then each
 * step's), out_ids [ng]. */
static g5_status draft_run(rt_eng_seq *q, const int32_t *prompt, uint32_t np, uint32_t n_reused, uint32_t ng, size_t V,
                           float *out_logits, int32_t *out_ids, mtp_log *l, rt_draft_stats *ds, g5_error *e) {
    rt_drafter *d = NULL;
    g5_status st = rt_drafter_create(q, &d, e);
    if (!st) rt_drafter_set_observer(d, log_mtp, l);
    if (!st) st = rt_drafter_resume(d, prompt, n_reused, e);
    if (!st) st = rt_drafter_prompt(d, prompt + n_reused, np - n_reused, out_logits, 0, e);
    for (uint32_t k = 0; k < ng && !st; k++) {
        const float *lg = out_logits + k * V;
        int32_t best = 0;
        for (uint32_t v = 1; v < V; v++)
            if (lg[v] > lg[best]) best = (int32_t)v;
        out_ids[k] = best;
        st = rt_drafter_step(d, best, out_logits + (k + 1) * V, e);
    }
    if (d) rt_drafter_get_stats(d, ds);
    rt_drafter_free(d);
    return st;
}

/* --draft mtp with the prefix cache: a sequence attached to a cached prefix, its drafter resumed
 * from the hidden states the pool keeps, makes the MTP calls of a run without the cache and gets
 * its logits, bit for bit. */
static void test_prefix_draft(const rt_wset *ws, const rt_eng_opts *eo, rt_eng *plain) {
    enum { PN = 21, G = 6, BT = 8 };
    const glm5_hparams *hp = rt_eng_hparams(plain);
    const size_t V = hp->n_vocab, E = hp->n_embd;
    if (!rt_eng_has_mtp(plain)) {
        T_CHECK(0, "the oracle has a NextN block");
        return;
    }
    g5_error e = {0};
    int32_t prompt[PN], ids_a[G], ids_b[G];
    uint64_t rng = 0x9876;
    for (int i = 0; i < PN; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        prompt[i] = (int32_t)((rng >> 33) % V);
    }
    float *lg_a = malloc((G + 1) * V * sizeof(float)), *lg_b = malloc((G + 1) * V * sizeof(float));
    float *h_a = malloc((PN + G) * E * sizeof(float)), *h_b = malloc((PN + G) * E * sizeof(float));
    mtp_log la = {.V = V, .draft = malloc(MAXC * V * sizeof(float))}, lb = {.V = V, .draft = malloc(MAXC * V * sizeof(float))};
    rt_draft_stats da = {0}, db = {0};
    rt_eng *ep = NULL;
    rt_eng_seq *r = NULL, *a = NULL, *b = NULL;
    /* the reference: no pool, no cache */
    g5_status st = rt_eng_seq_create(plain, 0, &r, &e);
    if (!st) st = draft_run(r, prompt, PN, 0, G, V, lg_a, ids_a, &la, &da, &e);
    T_CHECK(!st, "reference drafting run: %s", e.msg);
    T_CHECK(rt_eng_seq_hidden(r, 0, 1, h_b, &e) == G5_ERR_UNSUPPORTED, "no pool: hidden states not kept (%s)", e.msg);
    rt_eng_opts po = *eo;
    po.kv_blocks = 8;
    po.kv_block_tokens = BT;
    po.kv_prefix_cache = 1;
    po.kv_prefix_hidden = 1;
    st = st ? st : rt_eng_create(ws, &po, &ep, &e);
    if (!st) st = rt_eng_load(ep, &e);
    T_CHECK(!st, "prefix + hidden engine: %s", e.msg);
    if (!st) { /* the first sequence runs the prompt (two calls), publishes it and ends */
        st = rt_eng_seq_create(ep, 0, &a, &e);
        if (!st) st = rt_eng_prefill(a, prompt, 13, &(rt_eng_out){.hidden = h_a}, &e);
        if (!st) st = rt_eng_prefill(a, prompt + 13, PN - 13, &(rt_eng_out){.hidden = h_a + 13 * E}, &e);
        if (!st) st = rt_eng_seq_hidden(a, 0, PN, h_b, &e);
        T_CHECK(!st && same(h_a, h_b, PN * E), "the pool's hidden states are the prefill's: %s", e.msg);
        if (!st) st = rt_eng_seq_publish_prefix(a, prompt, &e);
        rt_eng_seq_free(a);
        a = NULL;
        T_CHECK(!st && rt_eng_pool_n_cached(ep) == 2, "2 blocks cached (%u): %s", rt_eng_pool_n_cached(ep), e.msg);
    }
    uint32_t reused = 0;
    if (!st) st = rt_eng_seq_create(ep, 0, &b, &e);
    if (!st) st = rt_eng_seq_attach_prefix(b, prompt, PN, &reused, &e);
    T_CHECK(!st && reused == 2 * BT && rt_eng_seq_mtp_n_past(b) == 0, "attached %u positions, MTP %u", reused,
            b ? rt_eng_seq_mtp_n_past(b) : 0);
    if (!st) st = draft_run(b, prompt, PN, reused, G, V, lg_b, ids_b, &lb, &db, &e);
    T_CHECK(!st, "drafting over the attached prefix: %s", e.msg);
    if (!st) {
        int calls = la.n_calls == lb.n_calls && la.n_calls <= MAXC && la.n_calls == G;
        for (uint32_t k = 0; calls && k < la.n_calls; k++)
            calls = la.p0[k] == lb.p0[k] && la.n[k] == lb.n[k] && same(la.draft + k * V, lb.draft + k * V, V);
        T_CHECK(calls && la.p0[0] == 0 && la.n[0] == PN, "MTP calls as without the cache: %u and %u, first over %u pairs",
                la.n_calls, lb.n_calls, lb.n[0]);
        T_CHECK(same(lg_a, lg_b, (G + 1) * V) && !memcmp(ids_a, ids_b, sizeof ids_a), "logits and ids as without the cache");
        T_CHECK(da.drafted == db.drafted && da.accepted == db.accepted && db.drafted == G && db.forwards == da.forwards,
                "draft stats alike: %llu/%llu drafted, %llu/%llu accepted", (unsigned long long)da.drafted,
                (unsigned long long)db.drafted, (unsigned long long)da.accepted, (unsigned long long)db.accepted);
        /* the steps' positions keep their hidden states too (verification calls write them) */
        const uint32_t nv = PN + G; /* the prompt and the steps' tokens; a pending draft after them */
        int32_t full[PN + G];
        memcpy(full, prompt, sizeof prompt);
        memcpy(full + PN, ids_b, sizeof ids_b);
        rt_eng_seq_reset(r);
        st = rt_eng_prefill(r, full, nv, &(rt_eng_out){.hidden = h_a}, &e);
        if (!st) st = rt_eng_seq_hidden(b, 0, nv, h_b, &e);
        T_CHECK(!st && same(h_a, h_b, (size_t)nv * E), "hidden states of %u positions after the steps: %s", nv, e.msg);
        T_CHECK(rt_eng_seq_hidden(b, 0, rt_eng_seq_n_past(b) + 1, h_b, &e) == G5_ERR_BOUNDS, "past n_past refused");
    }
    /* batched rows and decode steps keep their positions' states too */
    rt_eng_seq *c = NULL;
    if (ep && r && rt_eng_seq_create(ep, 0, &c, &e) == G5_OK) {
        const uint32_t one[1] = {2};
        st = rt_eng_prefill(c, prompt + 3, 5, NULL, &e);
        if (!st) st = rt_eng_decode_rows(ep, &c, one, 1, prompt + 8, &(rt_eng_out){.hidden = h_a + 5 * E}, &e);
        if (!st) st = rt_eng_decode(ep, &c, prompt + 10, 1, NULL, &e);
        rt_eng_seq_reset(r);
        if (!st) st = rt_eng_prefill(r, prompt + 3, 8, &(rt_eng_out){.hidden = h_b}, &e);
        T_CHECK(!st && same(h_a + 5 * E, h_b + 5 * E, 2 * E), "rows' hidden states: %s", e.msg);
        if (!st) st = rt_eng_seq_hidden(c, 0, 8, h_a, &e);
        T_CHECK(!st && same(h_a, h_b, 8 * E), "prefill, rows and decode keep their hidden states: %s", e.msg);
    }
    rt_eng_seq_free(c);
    /* a drafter in use cannot resume, nor one over more positions than the sequence holds */
    rt_drafter *d = NULL;
    rt_eng_seq_free(b);
    b = NULL;
    if (ep && rt_eng_seq_create(ep, 0, &b, &e) == G5_OK && rt_eng_seq_attach_prefix(b, prompt, PN, &reused, &e) == G5_OK &&
        rt_drafter_create(b, &d, &e) == G5_OK) {
        T_CHECK(reused == 2 * BT && rt_drafter_resume(d, prompt, reused + 1, &e) == G5_ERR_INVALID_ARG,
                "resume past n_past refused (%u attached)", reused);
        T_CHECK(rt_drafter_resume(d, prompt, reused, &e) == G5_OK && rt_drafter_resume(d, prompt, 4, &e) == G5_ERR_INVALID_ARG,
                "resume twice refused");
    }
    rt_drafter_free(d);
    rt_eng_seq_free(b);
    rt_eng_seq_free(r);
    rt_eng_free(ep);
    /* the GPU store keeps the hidden states too (tests/gpu/test_gpu_mtp.c); this CPU build refuses
       the device, not the option */
    po.device = RT_ENG_CUDA;
    po.kv_blocks = 0;
    ep = NULL;
    T_CHECK(rt_eng_create(ws, &po, &ep, &e) == G5_ERR_UNSUPPORTED && !ep && !strstr(e.msg, "kv_prefix_hidden"),
            "CUDA refused for the build, not for kv_prefix_hidden: %s", e.msg);
    free(lg_a);
    free(lg_b);
    free(h_a);
    free(h_b);
    free(la.draft);
    free(lb.draft);
}

int main(void) {
    struct stat sb;
    if (stat(T_ORACLE_GGUF, &sb) != 0) {
        printf("oracle missing at %s\n", T_ORACLE_GGUF);
        T_CHECK(0, "oracle present");
        return t_report("test_engine");
    }
    g5_error e = {0};
    rt_wset *ws = NULL;
    T_CHECK(rt_wset_open_gguf(T_ORACLE_GGUF, &ws, &e) == G5_OK, "open: %s", e.msg);
    if (!ws) return t_report("test_engine");
    rt_eng_opts eo;
    rt_eng_opts_default(&eo);
    eo.n_threads = 2;
    rt_eng *en = NULL, *en2 = NULL;
    rt_model *m = NULL;
    const rt_model_opts mo = {.n_threads = 2, .mla = RT_MLA_ABSORBED};
    T_CHECK(rt_eng_create(ws, &eo, &en, &e) == G5_OK, "engine: %s", e.msg);
    T_CHECK(rt_model_create(ws, &mo, &m, &e) == G5_OK, "reference model: %s", e.msg);
    if (!en || !m) goto out;
    rt_eng_seq *sq[NS] = {0};
    T_CHECK(rt_eng_seq_create(en, 0, &sq[0], &e) == G5_ERR_INVALID_ARG && !sq[0], "a sequence before rt_eng_load");
    T_CHECK(rt_eng_load(en, &e) == G5_OK, "load: %s", e.msg);
    T_CHECK(rt_eng_device_of(en) == RT_ENG_CPU && rt_eng_n_ranks(en) == 1 && rt_eng_has_mtp(en) == rt_model_has_mtp(m),
            "engine facts");
    char line[64] = "x";
    rt_eng_describe(en, line, sizeof line);
    T_CHECK(line[0] == 0 && rt_eng_load_bytes(en) == 0 && rt_eng_pool_n_blocks(en) == 0, "CPU: no GPU line, no pool");
    rt_eng_check_result cr;
    T_CHECK(!rt_eng_check_result_get(en, &cr), "no check on the CPU");
    const glm5_hparams *hp = rt_eng_hparams(en);
    const size_t V = hp->n_vocab, E = hp->n_embd;
    float *la = malloc(NP * V * sizeof(float)), *lb = malloc(NP * V * sizeof(float));
    float *ha = malloc(NP * E * sizeof(float)), *hb = malloc(NP * E * sizeof(float));
    float *da = malloc(NS * V * sizeof(float)), *db = malloc(NS * V * sizeof(float));
    int32_t toks[NS][NP];
    uint64_t rng = 0x1234;
    for (int s = 0; s < NS; s++)
        for (int i = 0; i < NP; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            toks[s][i] = (int32_t)((rng >> 33) % V);
        }
    rt_state *st[NS] = {0};
    int ok = 1;
    for (int s = 0; s < NS && ok; s++) {
        ok = rt_eng_seq_create(en, 0, &sq[s], &e) == G5_OK && rt_state_create(m, &st[s], &e) == G5_OK;
        T_CHECK(ok, "sequence %d: %s", s, e.msg);
        const uint32_t n = NP - (uint32_t)s; /* different lengths */
        const rt_eng_out eout = {.logits = la, .all_logits = s == 0, .hidden = ha};
        const rt_outputs mout = {.logits = lb, .all_logits = s == 0, .hidden = hb};
        ok = ok && rt_eng_prefill(sq[s], toks[s], n, &eout, &e) == G5_OK &&
             rt_model_forward(m, st[s], toks[s], n, &mout, &e) == G5_OK;
        T_CHECK(ok, "prefill %d: %s", s, e.msg);
        if (ok)
            T_CHECK(same(la, lb, (s == 0 ? n : 1) * V) && same(ha, hb, n * E), "prefill %d bit-identical", s);
        T_CHECK(rt_eng_seq_n_past(sq[s]) == n, "n_past %u", rt_eng_seq_n_past(sq[s]));
    }
    if (ok) { /* a batched step against each sequence's own one-token call */
        const int32_t next[NS] = {5, 7, 11};
        rt_state *sts[NS] = {st[0], st[1], st[2]};
        ok = rt_eng_decode(en, sq, next, NS, da, &e) == G5_OK && rt_model_forward_batch(m, sts, next, NS, db, &e) == G5_OK;
        T_CHECK(ok, "decode: %s", e.msg);
        if (ok) T_CHECK(same(da, db, NS * V), "batched decode bit-identical to rt_model_forward_batch");
        /* and to one-token calls: drop the step, run it per sequence */
        for (int s = 0; s < NS && ok; s++) {
            const uint32_t n = rt_eng_seq_n_past(sq[s]);
            ok = rt_eng_truncate(sq[s], n - 1, rt_eng_seq_mtp_n_past(sq[s]), &e) == G5_OK &&
                 rt_eng_seq_n_past(sq[s]) == n - 1 &&
                 rt_eng_prefill(sq[s], &next[s], 1, &(rt_eng_out){.logits = la}, &e) == G5_OK;
            T_CHECK(ok && same(la, da + (size_t)s * V, V), "sequence %d: truncated and replayed one token: %s", s, e.msg);
        }
        /* the greedy form of the step: each sequence's argmax (larger, then lower id) and its logit */
        int32_t ids[NS] = {0};
        float lv[NS] = {0};
        for (int s = 0; s < NS && ok; s++)
            ok = rt_eng_truncate(sq[s], rt_eng_seq_n_past(sq[s]) - 1, rt_eng_seq_mtp_n_past(sq[s]), &e) == G5_OK;
        ok = ok && rt_eng_decode_argmax(en, sq, next, NS, ids, lv, &e) == G5_OK;
        T_CHECK(ok, "decode_argmax: %s", e.msg);
        for (int s = 0; s < NS && ok; s++) {
            const float *x = da + (size_t)s * V;
            int32_t w = 0;
            for (uint32_t j = 1; j < V; j++)
                if (x[j] > x[w]) w = (int32_t)j;
            T_CHECK(ids[s] == w && same(&lv[s], &x[w], 1), "sequence %d: decode_argmax %d (%g), the logits' argmax %d (%g)", s,
                    ids[s], (double)lv[s], w, (double)x[w]);
        }
        /* the drawn form: a greedy row and two sampled ones (one with min-p), each the token a twin
         * sampler's samp_sample draws from the step's logits (the CPU engine draws on the host) */
        samp_ctx *sa[NS] = {0}, *sb[NS] = {0};
        samp_dev_row rows[NS];
        int32_t dids[NS] = {0};
        for (int s = 0; s < NS && ok; s++) {
            samp_params sp;
            samp_params_default(&sp);
            sp.temperature = s == 0 ? 0.0f : 0.6f + 0.4f * (float)s;
            sp.top_k = 0;
            sp.top_p = 1.0f;
            sp.min_p = s == 2 ? 0.05f : 0.0f;
            sp.seed = 100 + (uint64_t)s;
            ok = samp_create(&sp, V, &sa[s], &e) == G5_OK && samp_create(&sp, V, &sb[s], &e) == G5_OK &&
                 samp_device_row(sa[s], &rows[s]) &&
                 rt_eng_truncate(sq[s], rt_eng_seq_n_past(sq[s]) - 1, rt_eng_seq_mtp_n_past(sq[s]), &e) == G5_OK;
        }
        ok = ok && !rt_eng_draws_on_device(en) && rt_eng_decode_draw(en, sq, next, NS, rows, dids, &e) == G5_OK;
        T_CHECK(ok, "decode_draw: %s", e.msg);
        for (int s = 0; s < NS && ok; s++) {
            int32_t want = -1;
            T_CHECK(samp_sample(sb[s], da + (size_t)s * V, &want, &e) == G5_OK && dids[s] == want,
                    "sequence %d: decode_draw %d, samp_sample %d", s, dids[s], want);
        }
        for (int s = 0; s < NS; s++) samp_free(sa[s]), samp_free(sb[s]);
    }
    if (ok) { /* batched rows (MTP verification): 2, 1 and 2 tokens against each sequence's own call */
        const uint32_t nt[NS] = {2, 1, 2};
        const int32_t rt[5] = {9, 13, 17, 19, 23};
        float *rl = malloc(5 * V * sizeof(float)), *rh = malloc(5 * E * sizeof(float));
        ok = rl && rh && rt_eng_decode_rows(en, sq, nt, NS, rt, &(rt_eng_out){.logits = rl, .hidden = rh}, &e) == G5_OK;
        T_CHECK(ok, "decode rows: %s", e.msg);
        for (uint32_t s = 0, r0 = 0; s < NS && ok; r0 += nt[s++]) {
            const rt_outputs mout = {.logits = lb, .all_logits = 1, .hidden = hb};
            ok = rt_model_forward(m, st[s], rt + r0, nt[s], &mout, &e) == G5_OK;
            T_CHECK(ok && same(rl + (size_t)r0 * V, lb, nt[s] * V) && same(rh + (size_t)r0 * E, hb, nt[s] * E) &&
                        rt_eng_seq_n_past(sq[s]) == rt_state_n_past(st[s]),
                    "rows of sequence %u bit-identical to its own %u-token call: %s", s, nt[s], e.msg);
        }
        rt_eng_seq *dup[2] = {sq[0], sq[0]};
        const uint32_t n_dup[2] = {1, 1};
        const uint32_t n_past0 = rt_eng_seq_n_past(sq[0]);
        T_CHECK(rt_eng_decode_rows(en, dup, n_dup, 2, rt, NULL, &e) == G5_ERR_INVALID_ARG && rt_eng_seq_n_past(sq[0]) == n_past0,
                "rows sharing a sequence refused");
        free(rl);
        free(rh);
    }
    if (ok && rt_eng_has_mtp(en)) { /* the MTP block on the engine's sequence and on the model's state */
        const int32_t nx[2] = {3, 4};
        for (int i = 0; i < 2; i++) memcpy(ha + i * E, hb, E * sizeof(float));
        ok = rt_eng_mtp(sq[1], ha, nx, 2, da, 1, &e) == G5_OK && rt_model_mtp(m, st[1], ha, nx, 2, db, 1, &e) == G5_OK;
        T_CHECK(ok && same(da, db, 2 * V) && rt_eng_seq_mtp_n_past(sq[1]) == 2, "MTP bit-identical: %s", e.msg);
    }
    rt_eng_seq_reset(sq[2]);
    T_CHECK(rt_eng_seq_n_past(sq[2]) == 0 && rt_eng_seq_mtp_n_past(sq[2]) == 0, "reset");
    /* another engine's sequence is refused */
    T_CHECK(rt_eng_create(ws, &eo, &en2, &e) == G5_OK && rt_eng_load(en2, &e) == G5_OK, "second engine: %s", e.msg);
    if (en2) {
        rt_eng_seq *o = NULL;
        T_CHECK(rt_eng_seq_create(en2, 0, &o, &e) == G5_OK, "sequence of the second engine");
        rt_eng_seq *mix[2] = {sq[0], o};
        const int32_t t2[2] = {1, 2};
        if (o) T_CHECK(rt_eng_decode(en, mix, t2, 2, da, &e) == G5_ERR_INVALID_ARG, "another engine's sequence refused");
        rt_eng_seq_free(o);
    }
    for (int s = 0; s < NS; s++) {
        rt_eng_seq_free(sq[s]);
        rt_state_free(st[s]);
    }
    /* the shared pool: 4 blocks of 8 positions */
    {
        rt_eng *ep = NULL;
        rt_eng_opts po = eo;
        po.kv_blocks = 4;
        po.kv_block_tokens = 8;
        T_CHECK(rt_eng_create(ws, &po, &ep, &e) == G5_OK && rt_eng_load(ep, &e) == G5_OK, "pooled engine: %s", e.msg);
        rt_eng_seq *a = NULL, *b = NULL;
        if (ep) {
            T_CHECK(rt_eng_pool_n_blocks(ep) == 4 && rt_eng_pool_n_free(ep) == 4 && rt_eng_pool_block_tokens(ep) == 8,
                    "pool counts");
            T_CHECK(rt_eng_seq_create(ep, 20, &a, &e) == G5_OK && rt_eng_seq_n_blocks(a) == 3 &&
                        rt_eng_pool_n_free(ep) == 1,
                    "a sequence reserving 20 positions holds 3 blocks (%u free)", rt_eng_pool_n_free(ep));
            T_CHECK(rt_eng_seq_create(ep, 0, &b, &e) == G5_OK, "second sequence");
            if (b) {
                g5_status s2 = rt_eng_prefill(b, toks[0], NP, NULL, &e);
                T_CHECK(s2 == G5_ERR_NOMEM && rt_eng_seq_n_past(b) == 0, "pool exhausted: %s (%s)", g5_strerror(s2), e.msg);
            }
            rt_eng_seq_free(a);
            T_CHECK(rt_eng_pool_n_free(ep) == 4, "blocks back on free (%u)", rt_eng_pool_n_free(ep));
            if (b) T_CHECK(rt_eng_prefill(b, toks[0], NP, NULL, &e) == G5_OK, "then it fits: %s", e.msg);
            rt_eng_seq_free(b);
        }
        rt_eng_free(ep);
        po.device = RT_ENG_CPU;
        po.kv_block_tokens = 0;
        ep = NULL;
        T_CHECK(rt_eng_create(ws, &po, &ep, &e) == G5_ERR_INVALID_ARG && !ep, "a pool without a block size refused");
        /* prefix caching's interface on the CPU: the pool's, the GPU store's options refused */
        po.kv_block_tokens = 8;
        po.kv_prefix_cache = 1;
        rt_eng_prefix_info pi = {.on = -1};
        T_CHECK(rt_eng_create(ws, &po, &ep, &e) == G5_OK && rt_eng_load(ep, &e) == G5_OK, "prefix engine: %s", e.msg);
        if (ep) rt_eng_prefix_get_info(ep, &pi);
        T_CHECK(pi.on == 1 && pi.block_tokens == 8 && pi.n_blocks == 4 && pi.n_cached == 0 && pi.block_bytes == 0,
                "CPU prefix info: on %d, %u blocks of %u", pi.on, pi.n_blocks, pi.block_tokens);
        rt_eng_free(ep);
        ep = NULL;
        rt_eng_prefix_get_info(en, &pi);
        T_CHECK(pi.on == 0 && pi.n_blocks == 0, "no pool: no prefix cache");
        po.prefix_block_tokens = 32;
        T_CHECK(rt_eng_create(ws, &po, &ep, &e) == G5_ERR_INVALID_ARG && !ep && strstr(e.msg, "CUDA only"),
                "a GPU prefix store on the CPU refused: %s", e.msg);
    }
    test_prefix_draft(ws, &eo, en);
    /* CUDA in this build */
    {
        rt_eng *eg = NULL;
        rt_eng_opts go = eo;
        go.device = RT_ENG_CUDA;
        const g5_status s3 = rt_eng_create(ws, &go, &eg, &e);
        if (rt_eng_cuda_available()) {
            printf("CUDA build: the RT_ENG_CUDA refusal is not checked here (tests/gpu)\n");
            if (!s3) rt_eng_free(eg);
        } else {
            T_CHECK(s3 == G5_ERR_UNSUPPORTED && !eg && strstr(e.msg, "CUDA"), "RT_ENG_CUDA without CUDA: %s", e.msg);
        }
    }
    free(la);
    free(lb);
    free(ha);
    free(hb);
    free(da);
    free(db);
out:
    rt_eng_free(en2);
    rt_eng_free(en);
    rt_model_free(m);
    rt_wset_free(ws);
    return t_report("test_engine");
}
