/* glm5-serve --draft mtp over real loopback HTTP on the oracle model (CPU engine): concurrent
 * greedy clients get plain greedy decoding's tokens with accepted and rejected drafts verified in
 * the batched step, the draft counters in /metrics move, seeded sampled requests with drafts are
 * reproducible and top_k 1 ones are greedy decoding; the same under preemption and up to a full
 * context; with the prefix cache (on by default, its blocks then keeping the hidden states the
 * drafter rebuilds the NextN cache of a reused prefix from): requests sharing a long prefix report
 * cached tokens and get the ids of a server without the cache and of plain greedy decoding, the
 * draft counters of both servers equal (the same MTP calls), also after cached blocks were
 * evicted. (tests/test_sample.c proves the speculative sampling rule itself.) */
#include "tests/serve_harness.h"

/* --draft mtp. The oracle's random MTP block almost never guesses right, so an observer rewrites
 * the draft logits of some steps to point at the reference continuation of the sequence the
 * MTP inputs belong to (found by its tokens): the batched verification then sees accepted and
 * rejected drafts side by side, and every client must still get exactly the plain greedy
 * tokens. Sampled requests: a seed gives the same tokens twice. */
enum { MTP_NC = 6, MTP_NP = 6, MTP_NG = 16 };
typedef struct mtp_cheat {
    pthread_mutex_t mu;
    int32_t full[MTP_NC][MTP_NP + 32]; /* prompt, then the greedy continuation */
    uint32_t n_full[MTP_NC];
    uint64_t calls, steered;
    uint32_t V;
} mtp_cheat;

/* The steering both observers do: pair j of an MTP call is (hidden at position p0 + j, token at
 * p0 + j + 1) and its draft is for position p0 + n + 1; the first of the nr known sequences
 * (full[i], ld apart, n_full[i] tokens) whose tokens match next gets its token there raised far
 * above every draft logit (the oracle's logits are small). Returns 1 when one was steered. */
static int steer_draft(const int32_t *full, size_t ld, const uint32_t *n_full, int nr, uint32_t V, uint32_t p0,
                       const int32_t *next, uint32_t n, float *draft) {
    const uint32_t want_pos = p0 + n + 1;
    for (int i = 0; i < nr; i++) {
        const int32_t *f = full + (size_t)i * ld;
        if (want_pos >= n_full[i]) continue;
        int match = 1;
        for (uint32_t j = 0; j < n && match; j++) match = f[p0 + j + 1] == next[j];
        if (!match) continue;
        float mx = draft[0];
        for (uint32_t v = 1; v < V; v++) mx = draft[v] > mx ? draft[v] : mx;
        draft[f[want_pos]] = mx + 100.0f;
        return 1;
    }
    return 0;
}

static g5_status mtp_observer(void *user, uint32_t p0, const float *hidden, const int32_t *next, uint32_t n, float *draft,
                              g5_error *err) {
    (void)hidden, (void)err;
    mtp_cheat *c = user;
    pthread_mutex_lock(&c->mu);
    c->calls++;
    if (c->calls % 3 != 0) /* two steps in three point at the right token */
        c->steered += (uint64_t)steer_draft(&c->full[0][0], MTP_NP + 32, c->n_full, MTP_NC, c->V, p0, next, n, draft);
    pthread_mutex_unlock(&c->mu);
    return G5_OK;
}

static void test_draft_mtp(ref *R, const oracle *o) {
    static mtp_cheat ch;
    pthread_mutex_init(&ch.mu, NULL);
    ch.V = R->V;
    int32_t want[MTP_NC][MTP_NG + 16];
    uint32_t nw[MTP_NC];
    for (int i = 0; i < MTP_NC; i++) {
        const int32_t *p = o->p2 + 37 * i;
        nw[i] = ref_greedy(R, p, MTP_NP, MTP_NG, want[i]);
        memcpy(ch.full[i], p, MTP_NP * sizeof *p);
        memcpy(ch.full[i] + MTP_NP, want[i], nw[i] * sizeof *p);
        ch.n_full[i] = MTP_NP + nw[i];
    }
    srv_config c;
    srv_config_default(&c);
    c.max_batch = 4; /* 6 clients: sequences join and leave the batch */
    c.draft_mtp = 1;
    c.draft_observer = mtp_observer;
    c.draft_observer_user = &ch;
    logbuf lb = {0};
    srv_server *s = start_server(T_ORACLE_GGUF, &c, &lb);
    if (!s) return;
    uint16_t port = srv_port(s);
    T_CHECK(wait_health(port, 60), "health");
    T_CHECK(metric(port, "glm5_draft_tokens_total") == 0 && metric(port, "glm5_draft_accepted_tokens_total") == 0,
            "draft counters start at 0");
    client_job jobs[MTP_NC];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, MTP_NC);
    pthread_t th[MTP_NC];
    for (int i = 0; i < MTP_NC; i++) {
        jobs[i] = (client_job){.port = port, .stream = i % 2, .bar = &bar};
        jobs[i].body = completion_body(o->p2 + 37 * i, MTP_NP, NULL, MTP_NG, jobs[i].stream, NULL);
        pthread_create(&th[i], NULL, client_main, &jobs[i]);
    }
    for (int i = 0; i < MTP_NC; i++) pthread_join(th[i], NULL);
    int all_equal = 1;
    for (int i = 0; i < MTP_NC; i++) {
        const int eq = jobs[i].g.status == 200 && ids_equal(jobs[i].g.ids, jobs[i].g.n, want[i], nw[i]);
        T_CHECK(eq, "draft client %d: status %d, %u tokens vs %u of plain greedy decoding", i, jobs[i].g.status, jobs[i].g.n,
                nw[i]);
        all_equal &= eq;
        free(jobs[i].body);
    }
    pthread_barrier_destroy(&bar);
    const double drafted = metric(port, "glm5_draft_tokens_total"), acc = metric(port, "glm5_draft_accepted_tokens_total");
    const double ratio = metric(port, "glm5_draft_acceptance_ratio");
    srv_stats st;
    srv_get_stats(s, &st);
    printf("draft mtp: %d clients x %u tokens %s plain greedy; %.0f drafts verified, %.0f accepted (ratio %.3f), %llu of "
           "%llu MTP calls steered, peak batch %u\n", MTP_NC, MTP_NG, all_equal ? "equal to" : "DIFFER from", drafted, acc,
           ratio, (unsigned long long)ch.steered, (unsigned long long)ch.calls, st.peak_running);
    T_CHECK(drafted > 0 && acc > 0 && acc < drafted, "draft counters move: %.0f verified, %.0f accepted", drafted, acc);
    T_CHECK(st.draft_proposed == drafted && st.draft_accepted == acc, "srv_get_stats agrees with /metrics");
    T_CHECK(fabs(ratio - acc / drafted) < 1e-6, "acceptance ratio %.6f", ratio);
    T_CHECK(st.peak_running == 4 && st.blocks_in_use == 0, "peak batch %u, %u blocks in use", st.peak_running,
            st.blocks_in_use);

    /* sampled requests: they run, and a seed gives the same tokens twice */
    gen g[3];
    const char *extra[3] = {"\"temperature\":0.9,\"seed\":11", "\"temperature\":0.9,\"seed\":11",
                            "\"temperature\":0.9,\"seed\":12"};
    for (int k = 0; k < 3; k++) {
        char *body = completion_body(o->p2 + 200, MTP_NP, NULL, MTP_NG, k == 1, extra[k]);
        gen_request(port, "/v1/completions", body, k == 1, &g[k]);
        free(body);
    }
    T_CHECK(g[0].status == 200 && g[1].status == 200 && g[0].n > 1 && ids_equal(g[0].ids, g[0].n, g[1].ids, g[1].n),
            "sampled with draft: seed 11 twice gives %u and %u tokens, equal: %d", g[0].n, g[1].n,
            ids_equal(g[0].ids, g[0].n, g[1].ids, g[1].n));
    T_CHECK(g[2].status == 200 && !ids_equal(g[0].ids, g[0].n, g[2].ids, g[2].n), "sampled with draft: seeds 11 and 12 agree");
    T_CHECK(metric(port, "glm5_draft_tokens_total") > drafted, "sampled requests draft too");
    /* sampling with top_k 1: the speculative rule on one-hot p and q must give plain greedy
     * decoding, steered drafts accepted and the others replaced by the argmax */
    const double acc1 = metric(port, "glm5_draft_accepted_tokens_total");
    for (int i = 0; i < 2; i++) {
        char *body = completion_body(o->p2 + 37 * i, MTP_NP, NULL, MTP_NG, i, "\"temperature\":0.9,\"top_k\":1,\"seed\":3");
        gen_request(port, "/v1/completions", body, i, &g[0]);
        free(body);
        T_CHECK(g[0].status == 200 && ids_equal(g[0].ids, g[0].n, want[i], nw[i]),
                "sampled, top_k 1, with draft: client %d differs from plain greedy (%u vs %u tokens)", i, g[0].n, nw[i]);
    }
    T_CHECK(metric(port, "glm5_draft_accepted_tokens_total") > acc1, "sampled drafts accepted");
    srv_free(s);

    /* a pool of 4 blocks of 8 tokens: drafting sequences preempt each other (their drafters start
     * again from the recomputed prompt and output) and one request fills the whole context */
    c.ctx_size = 32;
    c.block_tokens = 8;
    s = start_server(T_ORACLE_GGUF, &c, &lb);
    if (!s) return;
    port = srv_port(s);
    T_CHECK(wait_health(port, 60), "health");
    enum { NQ = 3 };
    int32_t wq[NQ][32];
    uint32_t nq[NQ];
    pthread_barrier_init(&bar, NULL, NQ);
    for (int i = 0; i < NQ; i++) {
        const int32_t *p = o->p2 + 37 * i;
        nq[i] = ref_greedy(R, p, MTP_NP, 20, wq[i]);
        jobs[i] = (client_job){.port = port, .stream = i == 1, .bar = &bar};
        jobs[i].body = completion_body(p, MTP_NP, NULL, 20, jobs[i].stream, NULL);
        pthread_create(&th[i], NULL, client_main, &jobs[i]);
    }
    for (int i = 0; i < NQ; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < NQ; i++) {
        T_CHECK(jobs[i].g.status == 200 && ids_equal(jobs[i].g.ids, jobs[i].g.n, wq[i], nq[i]),
                "draft + preemption client %d: %d, %u vs %u tokens", i, jobs[i].g.status, jobs[i].g.n, nq[i]);
        free(jobs[i].body);
    }
    pthread_barrier_destroy(&bar);
    nq[0] = ref_greedy(R, o->p2, MTP_NP, 32 - MTP_NP, wq[0]);
    char *body = completion_body(o->p2, MTP_NP, NULL, 32 - MTP_NP, 0, NULL);
    gen gf;
    gen_request(port, "/v1/completions", body, 0, &gf);
    free(body);
    T_CHECK(gf.status == 200 && ids_equal(gf.ids, gf.n, wq[0], nq[0]) && (nq[0] < 32 - MTP_NP || !strcmp(gf.finish, "length")),
            "draft filling the context: %d, %u vs %u tokens, finish %s", gf.status, gf.n, nq[0], gf.finish);
    srv_get_stats(s, &st);
    printf("draft mtp with a 4-block pool: %llu preemptions, %llu drafts verified, %llu accepted\n",
           (unsigned long long)st.preemptions, (unsigned long long)st.draft_proposed, (unsigned long long)st.draft_accepted);
    T_CHECK(st.preemptions > 0 && st.draft_accepted > 0 && st.blocks_in_use == 0, "draft + preemption: %llu preemptions, "
            "%u blocks in use", (unsigned long long)st.preemptions, st.blocks_in_use);
    srv_free(s);
    pthread_mutex_destroy(&ch.mu);
}


/* --draft mtp with the prefix cache. Requests in order, alike on a server with the cache and one
 * without: A (100 tokens), B (A's first 80, then 30 others), C (100 others: its blocks evict
 * cached ones from a pool of 10 blocks of 16), A again. An observer steers some drafts to the
 * right token (as above, by the tokens of the MTP inputs), so drafts are accepted and rejected;
 * since a drafter over an attached prefix makes the MTP calls of one that ran it, both servers
 * must count the same drafts and acceptances. */
enum { PX_NR = 4, PX_NG = 12, PX_MAX = 112 };
typedef struct px_cheat {
    int32_t full[PX_NR][PX_MAX + PX_NG];
    uint32_t n_full[PX_NR];
    uint64_t calls, steered;
    uint32_t V;
} px_cheat;

static g5_status px_observer(void *user, uint32_t p0, const float *hidden, const int32_t *next, uint32_t n, float *draft,
                             g5_error *err) {
    (void)hidden, (void)err;
    px_cheat *c = user; /* requests run one at a time: no lock needed */
    if (++c->calls % 3 == 0) return G5_OK;
    c->steered += (uint64_t)steer_draft(&c->full[0][0], PX_MAX + PX_NG, c->n_full, PX_NR, c->V, p0, next, n, draft);
    return G5_OK;
}

static void test_prefix_mtp(ref *R) {
    static int32_t pr[PX_NR][PX_MAX];
    static px_cheat ch[2];
    uint32_t np[PX_NR] = {100, 110, 100, 100};
    for (int i = 0; i < 100; i++) pr[0][i] = (int32_t)(1500 + (i * 29) % 500);
    memcpy(pr[1], pr[0], 80 * sizeof **pr);
    for (int i = 80; i < 110; i++) pr[1][i] = (int32_t)(100 + i);
    for (int i = 0; i < 100; i++) pr[2][i] = (int32_t)(700 + (i * 13) % 600);
    memcpy(pr[3], pr[0], 100 * sizeof **pr);
    int32_t want[PX_NR][PX_NG];
    uint32_t nw[PX_NR];
    for (int k = 0; k < 2; k++) ch[k].V = R->V;
    for (int i = 0; i < PX_NR; i++) {
        nw[i] = ref_greedy(R, pr[i], np[i], PX_NG, want[i]);
        for (int k = 0; k < 2; k++) {
            memcpy(ch[k].full[i], pr[i], np[i] * sizeof **pr);
            memcpy(ch[k].full[i] + np[i], want[i], nw[i] * sizeof **pr);
            ch[k].n_full[i] = np[i] + nw[i];
        }
    }
    static gen g[2][PX_NR];
    srv_stats st[2];
    double evicted[2] = {0, 0}, hits[2] = {0, 0};
    for (int k = 0; k < 2; k++) { /* k = 0: the prefix cache; 1: none */
        srv_config c;
        srv_config_default(&c);
        c.draft_mtp = 1;
        c.prefix_cache = k == 0;
        c.ctx_size = 160;
        c.block_tokens = 16;
        c.draft_observer = px_observer;
        c.draft_observer_user = &ch[k];
        logbuf lb = {0};
        srv_server *s = start_server(T_ORACLE_GGUF, &c, &lb);
        if (!s) return;
        const uint16_t port = srv_port(s);
        T_CHECK(wait_health(port, 60), "health");
        for (int i = 0; i < PX_NR; i++) {
            char *body = completion_body(pr[i], np[i], NULL, PX_NG, i == 3, i == 3 ? "\"stream_options\":{\"include_usage\":true}" : NULL);
            gen_request(port, "/v1/completions", body, i == 3, &g[k][i]);
            free(body);
        }
        evicted[k] = metric(port, "glm5_prefix_cache_evictions_total");
        hits[k] = metric(port, "glm5_prefix_cache_hits_total");
        srv_get_stats(s, &st[k]);
        T_CHECK(st[k].blocks_in_use == 0, "server %d: %u blocks in use after the requests", k, st[k].blocks_in_use);
        srv_free(s);
    }
    static const char *const name[PX_NR] = {"A", "B (A's first 80 tokens)", "C (evicting)", "A again"};
    for (int i = 0; i < PX_NR; i++) {
        T_CHECK(g[0][i].status == 200 && g[1][i].status == 200, "request %s: %d / %d", name[i], g[0][i].status, g[1][i].status);
        T_CHECK(ids_equal(g[0][i].ids, g[0][i].n, g[1][i].ids, g[1][i].n) && ids_equal(g[0][i].ids, g[0][i].n, want[i], nw[i]),
                "request %s: the same %u ids with the cache, without it (%u) and in plain greedy decoding (%u)", name[i],
                g[0][i].n, g[1][i].n, nw[i]);
        T_CHECK(g[1][i].cached_tokens == 0, "no cache: request %s cached %ld", name[i], g[1][i].cached_tokens);
    }
    T_CHECK(g[0][0].cached_tokens == 0 && g[0][1].cached_tokens == 80 && g[0][2].cached_tokens == 0,
            "cached tokens: A %ld, B %ld (want 80), C %ld", g[0][0].cached_tokens, g[0][1].cached_tokens,
            g[0][2].cached_tokens);
    T_CHECK(g[0][3].cached_tokens >= 0 && g[0][3].cached_tokens < 96 && evicted[0] > 0 && evicted[1] == 0,
            "after C's evictions A again reuses %ld tokens (< 96); %.0f evictions", g[0][3].cached_tokens, evicted[0]);
    T_CHECK(hits[0] == 80 + g[0][3].cached_tokens && hits[1] == 0, "hits counter %.0f", hits[0]);
    printf("draft mtp + prefix cache: cached tokens %ld / %ld / %ld / %ld, %.0f evictions; drafts %llu verified, %llu "
           "accepted (without the cache: %llu, %llu); %llu of %llu MTP calls steered\n",
           g[0][0].cached_tokens, g[0][1].cached_tokens, g[0][2].cached_tokens, g[0][3].cached_tokens, evicted[0],
           (unsigned long long)st[0].draft_proposed, (unsigned long long)st[0].draft_accepted,
           (unsigned long long)st[1].draft_proposed, (unsigned long long)st[1].draft_accepted,
           (unsigned long long)ch[0].steered, (unsigned long long)ch[0].calls);
    T_CHECK(st[0].draft_proposed > 0 && st[0].draft_accepted > 0 && st[0].draft_accepted < st[0].draft_proposed,
            "draft counters move with the cache: %llu verified, %llu accepted", (unsigned long long)st[0].draft_proposed,
            (unsigned long long)st[0].draft_accepted);
    T_CHECK(st[0].draft_proposed == st[1].draft_proposed && st[0].draft_accepted == st[1].draft_accepted &&
                ch[0].calls == ch[1].calls && ch[0].steered == ch[1].steered,
            "the same MTP calls and drafts with and without the cache");
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    static oracle o;
    ref R;
    if (!ref_open(&R, &o, "test_serve_mtp")) {
        ref_close(&R);
        return t_report("test_serve_mtp");
    }
    test_draft_mtp(&R, &o);
    test_prefix_mtp(&R);
    ref_close(&R);
    return t_report("test_serve_mtp");
}
