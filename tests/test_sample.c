/* Sampler: each filter is checked on small hand-made logit vectors whose surviving set and
 * probabilities are worked out here independently (softmax written out in the test), plus
 * reproducibility, the draw's distribution, penalties and stop strings. */
#include "tests/test_util.h"

#include "runtime/text/sample.h"
#include "format/det_exp.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 42;
static double urand(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0;
}

static samp_params base(void) {
    samp_params p;
    samp_params_default(&p);
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 0;
    p.seed = 1;
    return p;
}

/* Runs samp_candidates and returns the surviving ids in order (n_out of them). */
static size_t cands(const samp_params *p, const float *logits, uint32_t n, samp_cand *out,
                    const int32_t *hist, size_t n_hist) {
    samp_ctx *s = NULL;
    size_t m = 0;
    if (samp_create(p, n, &s, NULL) != G5_OK) return (size_t)-1;
    for (size_t i = 0; i < n_hist; i++) samp_accept(s, hist[i]);
    g5_status st = samp_candidates(s, logits, out, 64, &m, NULL);
    samp_free(s);
    return st == G5_OK ? m : (size_t)-1;
}

static int ids_are(const samp_cand *c, size_t n, const int32_t *want, size_t nw) {
    if (n != nw) return 0;
    for (size_t i = 0; i < n; i++)
        if (c[i].id != want[i]) return 0;
    return 1;
}

static void test_greedy(void) {
    float l[6] = {0.5f, 3.0f, -1.0f, 3.0f, NAN, 2.9f};
    samp_params p = base();
    p.temperature = 0.0f;
    p.top_k = 3;
    p.top_p = 0.5f;
    samp_ctx *s = NULL;
    T_CHECK(samp_create(&p, 6, &s, NULL) == G5_OK, "create");
    int32_t id = -1;
    T_CHECK(samp_sample(s, l, &id, NULL) == G5_OK && id == 1, "greedy tie -> lower id, got %d", id);
    samp_free(s);

    /* Random vectors: greedy, and top_k = 1 at any temperature, both pick the argmax. */
    int bad_greedy = 0, bad_topk1 = 0;
    float v[300];
    for (int iter = 0; iter < 200; iter++) {
        int32_t arg = 0;
        for (int i = 0; i < 300; i++) {
            v[i] = (float)(urand() * 20 - 10);
            if (v[i] > v[arg]) arg = i;
        }
        samp_params g = base();
        g.temperature = 0;
        g.seed = (uint64_t)iter;
        samp_params k1 = base();
        k1.top_k = 1;
        k1.temperature = 1.5f;
        k1.seed = (uint64_t)iter;
        samp_ctx *a = NULL, *b = NULL;
        int32_t ia = -1, ib = -1;
        samp_create(&g, 300, &a, NULL);
        samp_create(&k1, 300, &b, NULL);
        if (!a || samp_sample(a, v, &ia, NULL) != G5_OK || ia != arg) bad_greedy++;
        if (!b || samp_sample(b, v, &ib, NULL) != G5_OK || ib != arg) bad_topk1++;
        samp_free(a);
        samp_free(b);
    }
    T_CHECK(bad_greedy == 0, "greedy missed the argmax %d times", bad_greedy);
    T_CHECK(bad_topk1 == 0, "top_k=1 missed the argmax %d times", bad_topk1);

    float dead[3] = {-INFINITY, NAN, -INFINITY};
    T_CHECK(samp_create(&p, 3, &s, NULL) == G5_OK, "create");
    g5_error err = {0};
    T_CHECK(samp_sample(s, dead, &id, &err) == G5_ERR_INVALID_ARG && err.msg[0], "all -inf");
    samp_free(s);
}

static void test_reproducible(void) {
    enum { V = 1000, STEPS = 300 };
    static float logits[STEPS][V];
    for (int t = 0; t < STEPS; t++)
        for (int i = 0; i < V; i++) logits[t][i] = (float)(urand() * 6);
    samp_params p;
    samp_params_default(&p);
    p.seed = 1234;
    p.repeat_penalty = 1.1f;
    int32_t a[STEPS], b[STEPS], c[STEPS], d[STEPS];
    samp_ctx *s1 = NULL, *s2 = NULL, *s3 = NULL;
    samp_create(&p, V, &s1, NULL);
    samp_create(&p, V, &s2, NULL);
    p.seed = 1235;
    samp_create(&p, V, &s3, NULL);
    T_CHECK(s1 && s2 && s3, "create");
    if (!s1 || !s2 || !s3) return;
    for (int t = 0; t < STEPS; t++) {
        samp_sample(s1, logits[t], &a[t], NULL);
        samp_accept(s1, a[t]);
        samp_sample(s2, logits[t], &b[t], NULL);
        samp_accept(s2, b[t]);
        samp_sample(s3, logits[t], &c[t], NULL);
        samp_accept(s3, c[t]);
    }
    T_CHECK(memcmp(a, b, sizeof a) == 0, "same seed, different tokens");
    T_CHECK(memcmp(a, c, sizeof a) != 0, "different seeds, same 300 tokens");
    samp_reset(s1);
    for (int t = 0; t < STEPS; t++) {
        samp_sample(s1, logits[t], &d[t], NULL);
        samp_accept(s1, d[t]);
    }
    T_CHECK(memcmp(a, d, sizeof a) == 0, "reset does not restart the sequence");
    samp_free(s1);
    samp_free(s2);
    samp_free(s3);

    /* The random stream is xoshiro256** seeded by splitmix64: values lie in [0, 1) and the same
     * seed gives the same stream. */
    samp_params q = base();
    q.seed = 99;
    samp_ctx *r1 = NULL, *r2 = NULL;
    samp_create(&q, 4, &r1, NULL);
    samp_create(&q, 4, &r2, NULL);
    int ok = 1;
    double mean = 0;
    for (int i = 0; i < 10000; i++) {
        double x = samp_rand(r1), y = samp_rand(r2);
        ok &= x == y && x >= 0 && x < 1;
        mean += x;
    }
    T_CHECK(ok && fabs(mean / 10000 - 0.5) < 0.02, "random stream (mean %.4f)", mean / 10000);
    samp_free(r1);
    samp_free(r2);
}

static void test_filters(void) {
    samp_cand c[64];
    size_t n;
    /* top-k */
    float l5[5] = {1, 5, 3, 4, 2};
    samp_params p = base();
    p.top_k = 2;
    p.temperature = 0.5f;
    n = cands(&p, l5, 5, c, NULL, 0);
    int32_t want_k[] = {1, 3};
    T_CHECK(ids_are(c, n, want_k, 2), "top_k=2 keeps ids 1, 3 (got %zu)", n);
    /* softmax of [5, 4] / 0.5 = [10, 8]: p0 = 1 / (1 + e^-2) */
    double p0 = 1.0 / (1.0 + exp(-2.0));
    T_CHECK(n == 2 && fabs(c[0].p - p0) < 1e-6 && fabs(c[1].p - (1 - p0)) < 1e-6,
            "top_k probabilities %g %g, want %g", n ? c[0].p : 0, n > 1 ? c[1].p : 0, p0);
    p.top_k = 7; /* larger than the vocabulary: no-op */
    n = cands(&p, l5, 5, c, NULL, 0);
    int32_t all5[] = {1, 3, 2, 4, 0};
    T_CHECK(ids_are(c, n, all5, 5), "top_k past the vocabulary keeps everything, sorted");

    /* Probabilities 0.5, 0.25, 0.15, 0.1 given as logits in a shuffled order. */
    float lp[4] = {logf(0.15f), logf(0.5f), logf(0.1f), logf(0.25f)};
    p = base();
    p.top_p = 0.70f;
    n = cands(&p, lp, 4, c, NULL, 0);
    int32_t w2[] = {1, 3}, w3[] = {1, 3, 0}, w4[] = {1, 3, 0, 2};
    T_CHECK(ids_are(c, n, w2, 2), "top_p 0.70 keeps 0.5 + 0.25 (got %zu)", n);
    T_CHECK(n == 2 && fabs(c[0].p - 0.5 / 0.75) < 1e-5, "top_p renormalizes: %g", c[0].p);
    p.top_p = 0.80f;
    n = cands(&p, lp, 4, c, NULL, 0);
    T_CHECK(ids_are(c, n, w3, 3), "top_p 0.80 keeps three (got %zu)", n);
    p.top_p = 0.30f;
    n = cands(&p, lp, 4, c, NULL, 0);
    T_CHECK(n == 1 && c[0].id == 1, "top_p 0.30 keeps the top token only");
    p.top_p = 0.95f;
    n = cands(&p, lp, 4, c, NULL, 0);
    T_CHECK(ids_are(c, n, w4, 4), "top_p 0.95 keeps all four");

    p = base();
    p.min_p = 0.4f; /* threshold 0.2: keeps 0.5, 0.25 */
    n = cands(&p, lp, 4, c, NULL, 0);
    T_CHECK(ids_are(c, n, w2, 2), "min_p 0.4 (got %zu)", n);
    p.min_p = 0.25f; /* threshold 0.125: keeps 0.5, 0.25, 0.15 */
    n = cands(&p, lp, 4, c, NULL, 0);
    T_CHECK(ids_are(c, n, w3, 3), "min_p 0.25 (got %zu)", n);
    p.min_p = 1.0f;
    n = cands(&p, lp, 4, c, NULL, 0);
    T_CHECK(n == 1 && c[0].id == 1, "min_p 1 keeps the top token");

    /* Chained: top_k 3 leaves 0.5, 0.25, 0.15 (renormalized over 0.9); top_p 0.8 measured there
     * needs 0.5/0.9 + 0.25/0.9 = 0.833 -> two survive; min_p 0.45 would keep only p >= 0.225. */
    p = base();
    p.top_k = 3;
    p.top_p = 0.8f;
    n = cands(&p, lp, 4, c, NULL, 0);
    T_CHECK(ids_are(c, n, w2, 2), "top_k then top_p (got %zu)", n);
    p.top_p = 0.5f; /* 0.5/0.9 = 0.556 >= 0.5 -> one */
    n = cands(&p, lp, 4, c, NULL, 0);
    T_CHECK(n == 1 && c[0].id == 1, "top_p measured after top_k (got %zu)", n);

    /* Temperature: probabilities are softmax(l / T), computed here directly. */
    float lt[3] = {2.0f, 1.0f, 0.0f};
    p = base();
    p.temperature = 0.7f;
    n = cands(&p, lt, 3, c, NULL, 0);
    double e0 = exp(2 / 0.7), e1 = exp(1 / 0.7), e2 = 1, z = e0 + e1 + e2;
    T_CHECK(n == 3 && fabs(c[0].p - e0 / z) < 1e-6 && fabs(c[1].p - e1 / z) < 1e-6 &&
            fabs(c[2].p - e2 / z) < 1e-6, "temperature 0.7 probabilities");
    p.temperature = 0.0f;
    n = cands(&p, lt, 3, c, NULL, 0);
    T_CHECK(n == 1 && c[0].id == 0 && c[0].p == 1.0f, "temperature 0 is greedy");

    /* The draw follows the probabilities: 0.5 / 0.3 / 0.2. */
    float ld[3] = {logf(0.3f), logf(0.5f), logf(0.2f)};
    p = base();
    p.seed = 7;
    samp_ctx *s = NULL;
    samp_create(&p, 3, &s, NULL);
    int count[3] = {0};
    for (int i = 0; i < 20000; i++) {
        int32_t id = -1;
        if (samp_sample(s, ld, &id, NULL) == G5_OK && id >= 0 && id < 3) count[id]++;
    }
    samp_free(s);
    T_CHECK(fabs(count[1] / 20000.0 - 0.5) < 0.015 && fabs(count[0] / 20000.0 - 0.3) < 0.015 &&
            fabs(count[2] / 20000.0 - 0.2) < 0.015, "draw frequencies %d %d %d", count[0],
            count[1], count[2]);

    /* A filtered-out token is never drawn. */
    p = base();
    p.top_k = 2;
    samp_create(&p, 4, &s, NULL);
    int outside = 0;
    for (int i = 0; i < 2000; i++) {
        int32_t id = -1;
        samp_sample(s, lp, &id, NULL);
        outside += id != 1 && id != 3;
    }
    samp_free(s);
    T_CHECK(outside == 0, "drew %d tokens outside top-k", outside);

    samp_cand one[1];
    size_t m = 0;
    p = base();
    samp_create(&p, 4, &s, NULL);
    T_CHECK(samp_candidates(s, lp, one, 1, &m, NULL) == G5_ERR_BOUNDS && m == 4 && one[0].id == 1,
            "small candidate buffer");
    samp_free(s);
}

static void test_penalties(void) {
    samp_cand c[64];
    float l[5] = {2.0f, -2.0f, 1.0f, 0.5f, 0.0f};
    samp_params p = base();
    p.repeat_penalty = 2.0f;
    p.repeat_last_n = 8;
    int32_t hist[] = {0, 1, 0, 4};
    size_t n = cands(&p, l, 5, c, hist, 4);
    /* positive divided, negative multiplied, zero multiplied (stays 0), others untouched */
    float want[5] = {1.0f, -4.0f, 1.0f, 0.5f, 0.0f};
    int ok = n == 5;
    for (size_t i = 0; ok && i < n; i++) ok = c[i].logit == want[c[i].id];
    T_CHECK(ok, "repeat penalty logits");
    /* ties 0 and 2 at 1.0 sort by id */
    T_CHECK(n == 5 && c[0].id == 0 && c[1].id == 2 && c[2].id == 3 && c[3].id == 4 && c[4].id == 1,
            "order after penalty");

    /* Only the last repeat_last_n accepted tokens count. */
    p.repeat_last_n = 2;
    n = cands(&p, l, 5, c, hist, 4); /* window {0, 4} */
    float want2[5] = {1.0f, -2.0f, 1.0f, 0.5f, 0.0f};
    ok = n == 5;
    for (size_t i = 0; ok && i < n; i++) ok = c[i].logit == want2[c[i].id];
    T_CHECK(ok, "penalty window");

    /* Frequency and presence: id 0 seen twice, 1 and 4 once. */
    p = base();
    p.repeat_last_n = 8;
    p.frequency_penalty = 0.25f;
    p.presence_penalty = 0.125f;
    n = cands(&p, l, 5, c, hist, 4);
    float want3[5] = {2.0f - 0.5f - 0.125f, -2.0f - 0.25f - 0.125f, 1.0f, 0.5f, -0.375f};
    ok = n == 5;
    for (size_t i = 0; ok && i < n; i++) ok = fabsf(c[i].logit - want3[c[i].id]) < 1e-6f;
    T_CHECK(ok, "frequency / presence penalties");

    /* The penalty can change the greedy choice. */
    float g[3] = {3.0f, 2.0f, 1.0f};
    p = base();
    p.temperature = 0;
    p.repeat_penalty = 2.0f;
    p.repeat_last_n = 4;
    int32_t h0[] = {0};
    n = cands(&p, g, 3, c, h0, 1);
    T_CHECK(n == 1 && c[0].id == 1, "penalized argmax moves to id 1");

    samp_ctx *s = NULL;
    p.repeat_penalty = 0.0f;
    T_CHECK(samp_create(&p, 3, &s, NULL) == G5_ERR_INVALID_ARG && !s, "repeat_penalty 0 refused");
    p.repeat_penalty = 1.0f;
    p.top_p = NAN;
    T_CHECK(samp_create(&p, 3, &s, NULL) == G5_ERR_INVALID_ARG, "NaN refused");
    samp_free(NULL);
}

static void test_stops(void) {
    const char *stops[] = {"<|user|>", "", "STOP", NULL, "\n\n"};
    const size_t ns = 5;
    const char *pieces[] = {"Hel", "lo <|", "us", "er|> more"};
    char text[128];
    size_t len = 0, pos = 99;
    int found = -1, at_piece = -1;
    size_t hold[4];
    for (int i = 0; i < 4 && found < 0; i++) {
        size_t l = strlen(pieces[i]);
        memcpy(text + len, pieces[i], l);
        len += l;
        found = samp_stop_find(text, len, l, stops, ns, &pos);
        hold[i] = samp_stop_holdback(text, len, stops, ns);
        if (found >= 0) at_piece = i;
    }
    T_CHECK(found == 0 && at_piece == 3 && pos == 6, "stop across three tokens: %d at piece %d pos %zu",
            found, at_piece, pos);
    T_CHECK(hold[0] == 0 && hold[1] == 2 && hold[2] == 4, "hold back %zu %zu %zu", hold[0], hold[1],
            hold[2]);

    /* Earliest occurrence wins; a match wholly inside already-checked text is not new. */
    const char *t2 = "aSTOP b\n\n";
    size_t l2 = strlen(t2);
    T_CHECK(samp_stop_find(t2, l2, l2, stops, ns, &pos) == 2 && pos == 1, "earliest stop");
    T_CHECK(samp_stop_find(t2, l2, 2, stops, ns, &pos) == 4 && pos == 7, "only new matches");
    T_CHECK(samp_stop_find(t2, l2, 0, stops, ns, &pos) == -1, "nothing new");
    T_CHECK(samp_stop_find("STO", 3, 3, stops, ns, &pos) == -1, "partial is not a stop");
    T_CHECK(samp_stop_holdback("xxSTO", 5, stops, ns) == 3, "hold back STO");
    T_CHECK(samp_stop_holdback("xx\n", 3, stops, ns) == 1, "hold back newline");
    T_CHECK(samp_stop_holdback("xyz", 3, stops, ns) == 0, "nothing to hold");
    T_CHECK(samp_stop_holdback("STOP", 4, stops, ns) == 0, "a whole stop is not a proper prefix");
    const char *empty[] = {""};
    T_CHECK(samp_stop_find("abc", 3, 3, empty, 1, &pos) == -1, "empty stops never match");
}

/* Speculative sampling: drafts drawn from q, verified against p, must come out distributed as p.
 * p and q are worked out here (softmax of the top-k logits at the temperature), differ in
 * their supports (top-k keeps other tokens), and are far enough apart that keeping every draft
 * would fail the same bound. */
static void softmax_topk(const float *l, int n, int k, double temp, double *out) {
    for (int i = 0; i < n; i++) {
        int better_n = 0;
        for (int j = 0; j < n; j++) better_n += l[j] > l[i] || (l[j] == l[i] && j < i);
        out[i] = better_n < k ? exp(l[i] / temp) : 0;
    }
    double z = 0;
    for (int i = 0; i < n; i++) z += out[i];
    for (int i = 0; i < n; i++) out[i] /= z;
}

static void test_speculative(void) {
    enum { V = 6, N = 200000 };
    const float tl[V] = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f, 0.0f}; /* top-4: 1, 4, 0, 2 */
    const float dl[V] = {2.5f, 0.0f, -2.0f, 1.0f, 1.2f, 0.8f}; /* top-4: 0, 4, 3, 5 */
    samp_params sp = base();
    sp.temperature = 0.7f;
    sp.top_k = 4;
    sp.seed = 7;
    double p[V], q[V];
    softmax_topk(tl, V, 4, 0.7, p);
    softmax_topk(dl, V, 4, 0.7, q);
    samp_ctx *s = NULL;
    T_CHECK(samp_create(&sp, V, &s, NULL) == G5_OK, "create");
    if (!s) return;
    long cnt[V] = {0}, cnt_q[V] = {0}, n_acc = 0, bad = 0, fails = 0;
    for (int t = 0; t < N; t++) {
        int32_t x = -1, id = -1;
        int acc = -1;
        fails += samp_sample(s, dl, &x, NULL) != G5_OK;
        fails += samp_sample_spec(s, tl, dl, x, &id, &acc, NULL) != G5_OK;
        if (x < 0 || x >= V || id < 0 || id >= V) {
            bad++;
            continue;
        }
        cnt_q[x]++;
        cnt[id]++;
        n_acc += acc == 1;
        bad += (acc == 1) != (id == x); /* a rejection never yields the draft */
    }
    T_CHECK(fails == 0 && bad == 0, "%ld failed calls, %ld inconsistent results", fails, bad);
    double worst = 0, worst_q = 0, acc_want = 0;
    for (int i = 0; i < V; i++) {
        const double sd = sqrt(p[i] * (1 - p[i]) / N) + 1e-9;
        const double dev = fabs((double)cnt[i] / N - p[i]) / sd, dev_q = fabs((double)cnt_q[i] / N - p[i]) / sd;
        if (dev > worst) worst = dev;
        if (dev_q > worst_q) worst_q = dev_q;
        acc_want += p[i] < q[i] ? p[i] : q[i];
    }
    T_CHECK(worst < 5, "output frequencies off p by %.1f standard deviations", worst);
    T_CHECK(worst_q > 50, "the drafts alone are within %.1f standard deviations of p: the test proves nothing", worst_q);
    T_CHECK(cnt[3] == 0 && cnt[5] == 0, "tokens outside p's top-k came out (%ld, %ld)", cnt[3], cnt[5]);
    const double acc = (double)n_acc / N, sd_acc = sqrt(acc_want * (1 - acc_want) / N);
    T_CHECK(fabs(acc - acc_want) < 5 * sd_acc, "acceptance rate %.4f, want sum min(p, q) = %.4f", acc, acc_want);
    samp_free(s);

    /* the same seed, the same tokens */
    samp_ctx *a = NULL, *b = NULL;
    samp_create(&sp, V, &a, NULL);
    samp_create(&sp, V, &b, NULL);
    int same = a && b;
    for (int t = 0; t < 1000 && same; t++) {
        int32_t xa, xb, ia, ib;
        samp_sample(a, dl, &xa, NULL);
        samp_sample(b, dl, &xb, NULL);
        samp_sample_spec(a, tl, dl, xa, &ia, NULL, NULL);
        samp_sample_spec(b, tl, dl, xb, &ib, NULL, NULL);
        same = xa == xb && ia == ib;
    }
    T_CHECK(same, "speculative sampling is not reproducible");
    samp_free(a);
    samp_free(b);

    /* greedy: the target's argmax whatever the draft */
    sp.temperature = 0;
    samp_ctx *g = NULL;
    samp_create(&sp, V, &g, NULL);
    int32_t id = -1;
    int acc1 = -1, acc2 = -1;
    T_CHECK(g && samp_sample_spec(g, tl, dl, 0, &id, &acc1, NULL) == G5_OK && id == 1 && acc1 == 0, "greedy reject: %d", id);
    T_CHECK(g && samp_sample_spec(g, tl, dl, 1, &id, &acc2, NULL) == G5_OK && id == 1 && acc2 == 1, "greedy accept: %d", id);
    T_CHECK(g && samp_sample_spec(g, tl, dl, V, &id, NULL, NULL) == G5_OK && id == 1, "greedy, draft out of range");
    samp_free(g);
    sp.temperature = 1;
    samp_create(&sp, V, &g, NULL);
    T_CHECK(g && samp_sample_spec(g, tl, dl, V, &id, NULL, NULL) == G5_ERR_INVALID_ARG, "draft token out of range");
    samp_free(g);
}

/* ---- the chain against its definition, written out ----
 * ref_chain is the chain as sample.h and specs/numerics.md define it, without the one-pass scan,
 * the radix sort or top-p's partial ranking: every candidate copied, penalties applied by id, the
 * -inf dropped, then the heap selection of top_k, min-p, the ranking (when top-k cut or top-p is
 * on), top-p, the probabilities. The chain must give the same candidates, logits, probabilities
 * and draws, bit for bit. */
typedef struct ref_cand {
    int32_t id;
    float logit, p;
} ref_cand;

__extension__ typedef unsigned __int128 ref_u128;

static int ref_better(const ref_cand *a, const ref_cand *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}
static int ref_cmp(const void *a, const void *b) {
    const ref_cand *x = a, *y = b;
    return ref_better(x, y) ? -1 : ref_better(y, x) ? 1 : 0;
}
static int ref_cmp_id(const void *a, const void *b) {
    const ref_cand *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}
static int ref_cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* The chain's candidates for logits[0..n) with the window hist[0..nh) (its last repeat_last_n
 * entries), into c[0..n) in the order the draw walks; returns their count (0: every logit NaN or
 * -inf). */
static size_t ref_chain(const samp_params *p, const float *logits, uint32_t n, const int32_t *hist, size_t nh,
                        ref_cand *c, uint64_t *mass, uint64_t *total) {
    for (uint32_t i = 0; i < n; i++) c[i] = (ref_cand){(int32_t)i, isnan(logits[i]) ? -INFINITY : logits[i], 0};
    size_t w = nh < (size_t)p->repeat_last_n ? nh : (size_t)p->repeat_last_n;
    if (w && !(p->repeat_penalty == 1.0f && p->frequency_penalty == 0.0f && p->presence_penalty == 0.0f)) {
        int32_t sorted[256];
        memcpy(sorted, hist + (nh - w), w * sizeof *sorted);
        qsort(sorted, w, sizeof *sorted, ref_cmp_i32);
        for (size_t i = 0; i < w;) {
            size_t j = i;
            while (j < w && sorted[j] == sorted[i]) j++;
            if (sorted[i] >= 0 && (uint32_t)sorted[i] < n) {
                ref_cand *x = &c[sorted[i]];
                if (x->logit <= 0) x->logit *= p->repeat_penalty;
                else x->logit /= p->repeat_penalty;
                x->logit -= (float)(j - i) * p->frequency_penalty + p->presence_penalty;
            }
            i = j;
        }
    }
    size_t m = 0;
    for (uint32_t i = 0; i < n; i++)
        if (c[i].logit > -INFINITY) c[m++] = c[i];
    if (m == 0) return 0;
    const size_t n_finite = m;
    if (!(p->temperature > 0)) {
        size_t best = 0;
        for (size_t i = 1; i < m; i++)
            if (ref_better(&c[i], &c[best])) best = i;
        c[0] = c[best];
        c[0].p = 1.0f;
        return 1;
    }
    if (p->top_k > 0 && (size_t)p->top_k < m) {
        const size_t k = (size_t)p->top_k;
        for (size_t i = 1; i < k; i++)
            for (size_t j = i; j > 0 && ref_better(&c[(j - 1) / 2], &c[j]); j = (j - 1) / 2) {
                ref_cand t = c[j]; c[j] = c[(j - 1) / 2]; c[(j - 1) / 2] = t;
            }
        for (size_t i = k; i < m; i++) {
            if (!ref_better(&c[i], &c[0])) continue;
            c[0] = c[i];
            for (size_t j = 0;;) {
                size_t l = 2 * j + 1, b = j;
                if (l < k && ref_better(&c[b], &c[l])) b = l;
                if (l + 1 < k && ref_better(&c[b], &c[l + 1])) b = l + 1;
                if (b == j) break;
                ref_cand t = c[j]; c[j] = c[b]; c[b] = t;
                j = b;
            }
        }
        m = k;
    }
    (void)n_finite;
    qsort(c, m, sizeof *c, ref_cmp); /* ranked: ties of equal logits by id */
    float maxl = -INFINITY;
    for (size_t i = 0; i < m; i++)
        if (c[i].logit > maxl) maxl = c[i].logit;
    /* masses: weight e^((l - maxl) / T) (1 at maxl) times 2^(63 - bit length of n), truncated */
    int bits = 0;
    while ((n >> bits) != 0) bits++;
    const double scale = ldexp(1.0, 63 - bits);
#define REF_W(l, T) ((l) == maxl ? 1.0 : dx_exp_neg(((double)(l) - (double)maxl) / (double)(T)))
    uint64_t z = 0;
    for (size_t i = 0; i < m; i++) z += (uint64_t)(REF_W(c[i].logit, 1.0f) * scale);
    if (p->min_p > 0 && p->min_p <= 1) {
        size_t k = 0;
        for (size_t i = 0; i < m; i++)
            if (REF_W(c[i].logit, 1.0f) >= (double)p->min_p) c[k++] = c[i];
        m = k;
    }
    if (p->top_p < 1.0f) { /* the largest logit v whose group and those above it hold at least
                            * top_p z (at least 1), compared exactly as cum 2^sh >= a z (top_p = a 2^-sh;
                            * sh <= 64 for every top_p >= 2^-40); every candidate >= v kept */
        int e;
        const uint64_t a = (uint64_t)ldexpf(frexpf(p->top_p, &e), 24);
        const int sh = 24 - e;
        uint64_t cum = 0;
        for (size_t i = 0; i < m;) {
            size_t j = i; /* the group of logit c[i].logit */
            while (j < m && c[j].logit == c[i].logit) cum += (uint64_t)(REF_W(c[j].logit, 1.0f) * scale), j++;
            if (cum >= 1 && (!(p->top_p > 0) || (sh <= 64 && ((ref_u128)cum << sh) >= (ref_u128)a * z))) {
                m = j;
                break;
            }
            i = j;
        }
    }
    qsort(c, m, sizeof *c, ref_cmp_id); /* the draw walks ascending ids */
    *total = 0;
    for (size_t i = 0; i < m; i++) *total += mass[i] = (uint64_t)(REF_W(c[i].logit, p->temperature) * scale);
    for (size_t i = 0; i < m; i++) {
        c[i].p = (float)((double)mass[i] / (double)*total);
        c[i].logit /= p->temperature;
    }
#undef REF_W
    return m;
}

static int same_f(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

/* Random vocabularies (ties, +0 and -0, NaN, +-inf, all -inf), random chains (greedy, top-k below,
 * at and above the count of finite logits, min-p, top-p, temperature, every penalty), random
 * windows; lists of more than 256 candidates in id order take the radix sort and top-p's partial
 * ranking, shorter ones and top-k heaps qsort; untruncated lists are drawn in id order. */
static void test_chain_equals_definition(void) {
    enum { NV = 3000, CASES = 600 };
    float *l = malloc(NV * sizeof *l);
    ref_cand *rc = malloc(NV * sizeof *rc);
    uint64_t *rmass = malloc(NV * sizeof *rmass);
    samp_cand *got = malloc(NV * sizeof *got);
    int bad = 0, n_err_same = 0, draw_same = 0;
    for (int c = 0; c < CASES && l && rc && got && rmass; c++) {
        const uint32_t n = 1 + (uint32_t)(urand() * (c % 3 == 0 ? 40 : NV - 1));
        const int kind = c % 5; /* 0 random, 1 coarse (ties), 2 some NaN/inf, 3 mostly -inf, 4 all -inf */
        for (uint32_t i = 0; i < n; i++) {
            double u = urand();
            l[i] = kind == 1 ? (float)(int)(u * 8) : (float)(u * 20 - 10);
            if (kind == 1 && l[i] == 0.0f && urand() < 0.5) l[i] = -0.0f; /* ties of +0 and -0 */
            if (kind == 2 && urand() < 0.05) l[i] = urand() < 0.5 ? NAN : urand() < 0.5 ? -INFINITY : INFINITY;
            if ((kind == 3 && urand() < 0.97) || kind == 4) l[i] = urand() < 0.5 ? -INFINITY : NAN;
        }
        samp_params p = base();
        p.temperature = c % 7 == 0 ? 0.0f : c % 7 == 3 ? 1.0f : (float)(0.2 + urand() * 1.5); /* 1: one exp each */
        const int tk = (int)(urand() * 4);
        p.top_k = tk == 0 ? 0 : tk == 1 ? 1 + (int)(urand() * 50) : tk == 2 ? (int)n : (int)n + 5;
        p.top_p = urand() < 0.5 ? 1.0f : (float)(0.3 + urand() * 0.7);
        p.min_p = urand() < 0.5 ? 0.0f : (float)(urand() * 0.3);
        p.repeat_last_n = (int)(urand() * 64);
        p.repeat_penalty = urand() < 0.5 ? 1.0f : (float)(0.5 + urand() * 1.5);
        p.frequency_penalty = urand() < 0.7 ? 0.0f : (float)(urand() * 0.5);
        p.presence_penalty = urand() < 0.7 ? 0.0f : (float)(urand() * 0.5);
        int32_t hist[200];
        const size_t nh = (size_t)(urand() * 200);
        for (size_t i = 0; i < nh; i++) hist[i] = (int32_t)(urand() * (n + 4)) - 2; /* a few out of range */
        uint64_t total = 0;
        const size_t want = ref_chain(&p, l, n, hist, nh, rc, rmass, &total);
        samp_ctx *s = NULL, *d = NULL, *u = NULL;
        size_t m = 0;
        int32_t drawn = -1;
        g5_status st = samp_create(&p, n, &s, NULL), sd = samp_create(&p, n, &d, NULL);
        if (!sd) sd = samp_create(&p, n, &u, NULL);
        for (size_t i = 0; i < nh && s && d; i++) samp_accept(s, hist[i]), samp_accept(d, hist[i]);
        if (!st) st = samp_candidates(s, l, got, NV, &m, NULL);
        if (!sd) sd = samp_sample(d, l, &drawn, NULL);
        const double r = samp_rand(u); /* the draw's random number: d's first */
        samp_free(s), samp_free(d), samp_free(u);
        if (want == 0) {
            n_err_same += st == G5_ERR_INVALID_ARG && sd == G5_ERR_INVALID_ARG;
            bad += st != G5_ERR_INVALID_ARG || sd != G5_ERR_INVALID_ARG;
            continue;
        }
        /* the draw walks the chain's order (rc's): the first whose running mass passes
         * floor(r total), r = k / 2^53 */
        int32_t want_id = rc[0].id;
        if (want > 1) {
            const uint64_t k = (uint64_t)ldexp(r, 53);
            const uint64_t t = (uint64_t)(((ref_u128)k * total) >> 53);
            uint64_t cum = 0;
            for (size_t i = 0; i < want; i++)
                if (t < (cum += rmass[i])) {
                    want_id = rc[i].id;
                    break;
                }
        }
        draw_same += sd == G5_OK && drawn == want_id;
        qsort(rc, want, sizeof *rc, ref_cmp); /* samp_candidates lists them ranked */
        int ok = st == G5_OK && m == want && sd == G5_OK && drawn == want_id;
        for (size_t i = 0; ok && i < m; i++)
            ok = got[i].id == rc[i].id && same_f(got[i].logit, rc[i].logit) && same_f(got[i].p, rc[i].p);
        if (!ok && bad < 3)
            printf("  case %d: n %u, temp %g, top_k %d, top_p %g, min_p %g, penalties %g/%g/%g over %d: %zu vs %zu "
                   "candidates, drew %d vs %d\n", c, n, p.temperature, p.top_k, p.top_p, p.min_p, p.repeat_penalty,
                   p.frequency_penalty, p.presence_penalty, p.repeat_last_n, m, want, drawn, want_id);
        bad += !ok;
    }
    T_CHECK(bad == 0 && n_err_same > 0, "the chain equals its written-out definition bit for bit: %d of %d cases "
            "differ (%d all-dropped cases refused alike, %d draws equal)", bad, CASES, n_err_same, draw_same);
    free(l), free(rc), free(got), free(rmass);
}

/* samp_is_argmax: where it says 1, samp_sample's token is cuk_argmax's rule applied to the logits
 * (larger, then lower id, NaN never; refused where that logit is not > -inf), on vectors with
 * ties, NaN and infinities; it says 0 for sampling and for penalties over a non-empty window. */
static void test_is_argmax(void) {
    int bad = 0, said = 0;
    float v[64];
    for (int iter = 0; iter < 400; iter++) {
        for (int i = 0; i < 64; i++) {
            const double u = urand();
            v[i] = u < 0.05 ? NAN : u < 0.08 ? -INFINITY : u < 0.09 ? INFINITY : (float)((int)(urand() * 8) - 4);
        }
        if (iter % 50 == 0)
            for (int i = 0; i < 64; i++) v[i] = i % 2 ? NAN : -INFINITY; /* refused */
        int32_t best = -1;
        for (int i = 0; i < 64; i++)
            if (v[i] == v[i] && (best < 0 || v[i] > v[best])) best = i;
        samp_params g = base();
        g.temperature = 0;
        g.repeat_penalty = iter % 3 ? 1.0f : 1.3f; /* the window is empty: no penalty applies yet */
        g.repeat_last_n = 8;
        samp_ctx *a = NULL;
        if (samp_create(&g, 64, &a, NULL) != G5_OK) {
            bad++;
            continue;
        }
        said += samp_is_argmax(a);
        int32_t id = -1;
        const g5_status st = samp_sample(a, v, &id, NULL);
        const int refused = best < 0 || !(v[best] > -INFINITY);
        if (refused ? st != G5_ERR_INVALID_ARG : st != G5_OK || id != best) bad++;
        samp_accept(a, 3);
        if (samp_is_argmax(a) != (g.repeat_penalty == 1.0f)) bad++; /* penalties over {3} now */
        if (samp_params_argmax(&g) != (g.repeat_penalty == 1.0f)) bad++; /* whatever the window */
        samp_free(a);
    }
    T_CHECK(said == 400, "samp_is_argmax said 1 for %d of 400 greedy samplers with an empty window", said);
    T_CHECK(bad == 0, "samp_is_argmax: %d of 400 vectors disagree with the argmax rule", bad);
    samp_params t = base();
    samp_ctx *b = NULL;
    T_CHECK(samp_create(&t, 8, &b, NULL) == G5_OK && !samp_is_argmax(b), "a sampling chain is no argmax");
    samp_free(b);
}

/* dx_exp_neg (format/det_exp.h), the weights' exp: these bits on every host and on the GPU
 * (recorded from this implementation; gcc -O0 / -O2 and clang give them alike), within 3 ulp of
 * libm's exp over [-708, 0], 0 below and for NaN, 1 at 0. */
static void test_det_exp(void) {
    static const struct { double x; uint64_t bits; } gold[] = {
        {-0x1.641db6ca2c08ap-7, 0x3fefa773f86cad98ull}, {-0x1p-1, 0x3fe368b2fc6f960bull},
        {-0x1p+0, 0x3fd78b56362cef38ull}, {-0x1.26bb1bbb55516p+1, 0x3fb9999999999998ull},
        {-0x1.48p+3, 0x3f02899a7a835446ull}, {-0x1.f19999999999ap+4, 0x3d218904a8660eb3ull},
        {-0x1.9p+6, 0x36ea8c1f14e2af5eull}, {-0x1.eb73b645a1cacp+8, 0x139fa939f3d2f13eull},
        {-0x1.61f3333333333p+9, 0x001a4904f4342895ull},
    };
    int same = 0;
    for (size_t i = 0; i < sizeof gold / sizeof gold[0]; i++) {
        const double v = dx_exp_neg(gold[i].x);
        uint64_t b;
        memcpy(&b, &v, sizeof b);
        same += b == gold[i].bits;
    }
    T_CHECK(same == (int)(sizeof gold / sizeof gold[0]), "dx_exp_neg: %d of %zu recorded values", same,
            sizeof gold / sizeof gold[0]);
    double worst = 0;
    for (int i = 0; i <= 200000; i++) {
        const double x = i % 2 ? -708.0 * i / 200000.0 : -12.0 * i / 200000.0, a = dx_exp_neg(x), e = exp(x);
        const double u = fabs(a - e) / (nextafter(e, INFINITY) - e);
        if (u > worst) worst = u;
    }
    T_CHECK(worst <= 3.0, "dx_exp_neg within %.1f ulp of exp over [-708, 0]", worst);
    int need_bad = 0; /* dx_top_p_need against the 128-bit ceiling written out */
    for (int i = 0; i < 20000; i++) {
        const float tp = i % 97 == 0 ? 0.0f : i % 89 == 0 ? 1e-30f : (float)urand();
        const uint64_t z = i % 3 == 0 ? (uint64_t)(urand() * 1e6) : ((uint64_t)(urand() * 4294967296.0) << 31) + 1;
        int e;
        const uint64_t a = (uint64_t)ldexpf(frexpf(tp, &e), 24);
        const int sh = 24 - e;
        const ref_u128 prod = (ref_u128)a * z;
        uint64_t want = 1;
        if (tp > 0 && sh < 128) want = (uint64_t)((prod + (((ref_u128)1 << sh) - 1)) >> sh);
        if (want == 0) want = 1;
        need_bad += dx_top_p_need(tp, z) != want;
    }
    T_CHECK(need_bad == 0, "dx_top_p_need: max(1, ceil(top_p z)) exactly (%d of 20000 differ)", need_bad);
    T_CHECK(dx_exp_neg(0.0) == 1.0 && dx_exp_neg(-0.0) == 1.0 && dx_exp_neg(-709.0) == 0.0 && dx_exp_neg(NAN) == 0.0 &&
                dx_exp_neg(-INFINITY) == 0.0,
            "dx_exp_neg: 1 at 0, 0 below -708, for NaN and -inf");
}

/* samp_device_row and samp_device_draw (the device's arithmetic, cuda/cuk_sample.h's contract:
 * raw logits, NaN as -inf, the argmax for greedy rows, else dx_mass over every id with min-p by
 * dx_min_p_keeps, r = floor(k total / 2^53), the first id in ascending order whose running mass
 * passes r): where samp_device_row says 1, the draw gives samp_sample's token on a twin sampler,
 * draw after draw (so the random streams stay together); where it says 0 (top-k cut, top-p,
 * penalties in force) nothing is taken from the stream. */
static void test_device_row(void) {
    enum { V = 700 };
    float l[V];
    int bad = 0, said = 0, refused = 0;
    for (int c = 0; c < 300; c++) {
        samp_params p = base();
        p.seed = (uint64_t)c * 7919;
        p.temperature = c % 9 == 0 ? 0.0f : (float)(0.3 + urand() * 1.4);
        p.min_p = urand() < 0.5 ? 0.0f : (float)(urand() * 0.5);
        const int kind = c % 6, pen = c % 4 == 1; /* 4: top-k cut; 5: top-p; penalties beside any */
        p.top_k = kind == 4 ? 20 : kind == 3 ? V : 0;
        p.top_p = kind == 5 || (kind == 4 && c % 4 == 0) ? 0.9f : 1.0f; /* top-k with top-p too */
        p.repeat_last_n = 8;
        p.repeat_penalty = pen ? 1.3f : 1.0f;
        p.frequency_penalty = pen && c % 3 ? 0.4f : 0.0f;
        p.presence_penalty = pen && c % 5 ? 0.7f : 0.0f;
        samp_ctx *a = NULL, *b = NULL;
        if (samp_create(&p, V, &a, NULL) || samp_create(&p, V, &b, NULL)) {
            bad++;
            samp_free(a);
            continue;
        }
        samp_accept(a, 5), samp_accept(b, 5);
        bad += !samp_params_device(&p, V); /* every draw is the device's, whatever the window */
        for (int d = 0; d < 4; d++) {
            for (int i = 0; i < V; i++) {
                const double u = urand();
                l[i] = u < 0.02 ? NAN : u < 0.05 ? -INFINITY : c % 7 == 2 ? (float)(int)(urand() * 6) /* ties */
                                                                : (float)(urand() * 24 - 12);
            }
            if (c % 50 == 7 && d == 1)
                for (int i = 0; i < V; i++) l[i] = -INFINITY; /* refused alike */
            samp_dev_row row;
            const int dev = samp_device_row(a, &row);
            int32_t want = -1, got = -1;
            const g5_status st = samp_sample(b, l, &want, NULL);
            if (!dev) {
                bad++;
                break;
            }
            said++;
            got = samp_device_draw(&row, l, V);
            if (got < 0) { /* refused alike, each having taken its number: the streams go on together */
                refused += st == G5_ERR_INVALID_ARG;
                bad += st != G5_ERR_INVALID_ARG;
                continue;
            }
            if (st != G5_OK || got != want)
                printf("  device row %d/%d: temp %g min_p %g top_k %d: device %d, host %d (%s)\n", c, d, p.temperature,
                       p.min_p, p.top_k, got, want, g5_strerror(st));
            bad += st != G5_OK || got != want;
            samp_accept(a, want), samp_accept(b, want);
        }
        samp_free(a), samp_free(b);
    }
    T_CHECK(bad == 0 && said > 500 && refused > 0, "samp_device_row: the device's arithmetic draws samp_sample's token "
            "(%d rows, %d refused alike, %d differ)", said, refused, bad);
}

int main(void) {
    test_det_exp();
    test_device_row();
    test_chain_equals_definition();
    test_greedy();
    test_is_argmax();
    test_reproducible();
    test_filters();
    test_penalties();
    test_stops();
    test_speculative();
    return t_report("test_sample");
}
