/* Sampling chain and stop strings. Semantics are documented in sample.h. */
#include "runtime/text/sample.h"

#include "format/det_exp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct samp_ctx {
    samp_params p;
    uint32_t n_vocab;
    uint64_t rng[4];
    samp_cand *cand;   /* [n_vocab] working set */
    samp_cand *tmp;    /* [n_vocab] once a list of over 256 is sorted: the radix sort's and top-p's
                        * partition scratch (cand_scratch) */
    float *qp;         /* [n_vocab] speculative sampling: q by id (0 off the draft's set) */
    int32_t *hist;     /* ring of the last repeat_last_n accepted ids */
    int32_t *sorted;   /* scratch for counting the window */
    uint32_t *pen_n;   /* [hist_cap] occurrences of sorted[i]'s id in the window (penalties) */
    uint32_t hist_cap, hist_n, hist_head;
    double scale;      /* 2^K: weights to masses (run_chain) */
    double xmin;       /* -K ln2 - 1e-6: exponents whose mass is certainly 0 */
    uint64_t *mass;    /* [n_vocab] once a list of over 256 is weighed */
    uint64_t *mw;      /* the last chain's masses, cand's order: mass or mass_small */
    uint64_t *m1;      /* [n_vocab] by id: top-p's masses at temperature 1 (lists of over 256),
                        * so its running sum and a temperature-1 draw take no second exp */
    int m1_on;         /* the last chain filled m1 */
    uint64_t total;    /* their sum */
    uint64_t mass_small[256];
};

void samp_params_default(samp_params *p) {
    if (!p) return;
    memset(p, 0, sizeof *p);
    p->temperature = 0.8f;
    p->top_k = 40;
    p->top_p = 0.95f;
    p->min_p = 0.05f;
    p->repeat_penalty = 1.0f;
    p->repeat_last_n = 64;
}

/* ---- random numbers: xoshiro256** seeded by splitmix64 ---- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(uint64_t s[4]) {
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

static void seed_rng(samp_ctx *s) {
    uint64_t x = s->p.seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
}

double samp_rand(samp_ctx *s) {
    if (!s) return 0.0;
    return (double)(xoshiro_next(s->rng) >> 11) * (1.0 / 9007199254740992.0);
}

/* ---- lifecycle ---- */

g5_status samp_create(const samp_params *p, uint32_t n_vocab, samp_ctx **out, g5_error *err) {
    if (!p || !out || n_vocab == 0 || n_vocab > (1u << 30))
        return g5_fail(err, G5_ERR_INVALID_ARG, "samp_create: bad arguments (n_vocab %u)", n_vocab);
    *out = NULL;
    if (isnan(p->temperature) || isnan(p->top_p) || isnan(p->min_p) || !(p->repeat_penalty > 0) ||
        isnan(p->frequency_penalty) || isnan(p->presence_penalty) || p->repeat_last_n < 0)
        return g5_fail(err, G5_ERR_INVALID_ARG, "samp_create: bad parameters (repeat_penalty "
                       "must be > 0, repeat_last_n >= 0, no NaN)");
    samp_ctx *s = calloc(1, sizeof *s);
    if (!s) return g5_fail(err, G5_ERR_NOMEM, "samp_create: out of memory");
    s->p = *p;
    s->n_vocab = n_vocab;
    const int k = dx_mass_bits(n_vocab);
    s->scale = ldexp(1.0, k);
    s->xmin = dx_mass_xmin(k);
    s->hist_cap = (uint32_t)p->repeat_last_n;
    s->cand = malloc((size_t)n_vocab * sizeof *s->cand);
    if (s->hist_cap) {
        s->hist = malloc(s->hist_cap * sizeof *s->hist);
        s->sorted = malloc(s->hist_cap * sizeof *s->sorted);
        s->pen_n = malloc(s->hist_cap * sizeof *s->pen_n);
    }
    if (!s->cand || (s->hist_cap && (!s->hist || !s->sorted || !s->pen_n))) {
        samp_free(s);
        return g5_fail(err, G5_ERR_NOMEM, "samp_create: out of memory for %u candidates", n_vocab);
    }
    seed_rng(s);
    *out = s;
    return G5_OK;
}

void samp_free(samp_ctx *s) {
    if (!s) return;
    free(s->cand);
    free(s->tmp);
    free(s->mass);
    free(s->m1);
    free(s->qp);
    free(s->hist);
    free(s->sorted);
    free(s->pen_n);
    free(s);
}

void samp_accept(samp_ctx *s, int32_t id) {
    if (!s || !s->hist_cap) return;
    s->hist[s->hist_head] = id;
    s->hist_head = (s->hist_head + 1) % s->hist_cap;
    if (s->hist_n < s->hist_cap) s->hist_n++;
}

void samp_reset(samp_ctx *s) {
    if (!s) return;
    s->hist_n = s->hist_head = 0;
    seed_rng(s);
}

/* ---- the chain ---- */

/* Total order: larger logit first, then lower id. */
static int better(const samp_cand *a, const samp_cand *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int cmp_cand(const void *a, const void *b) {
    const samp_cand *x = a, *y = b;
    return better(x, y) ? -1 : better(y, x) ? 1 : 0;
}

/* s->tmp, allocated at first use; NULL when out of memory (the callers fall back on qsort or a
 * full sort). */
static samp_cand *cand_scratch(samp_ctx *s) {
    if (!s->tmp) s->tmp = malloc((size_t)s->n_vocab * sizeof *s->tmp);
    return s->tmp;
}

/* c[0..m) into ascending order of the 32-bit keys in their p: a stable LSD radix sort, 11 bits a
 * pass (a pass whose digit is the same for every key is skipped). O(m), where qsort took 25 ms at
 * GLM-5's 154880 tokens. The chain fills p afterwards. */
static void sort_keyed(samp_cand *c, samp_cand *tmp, size_t m) {
    samp_cand *src = c, *dst = tmp;
    for (int sh = 0; sh < 32; sh += 11) {
        size_t cnt[2048] = {0};
        uint32_t k;
        for (size_t i = 0; i < m; i++) {
            memcpy(&k, &src[i].p, sizeof k);
            cnt[k >> sh & 2047]++;
        }
        memcpy(&k, &src[0].p, sizeof k);
        if (cnt[k >> sh & 2047] == m) continue;
        for (size_t b = 0, off = 0; b < 2048; b++) {
            const size_t t = cnt[b];
            cnt[b] = off;
            off += t;
        }
        for (size_t i = 0; i < m; i++) {
            memcpy(&k, &src[i].p, sizeof k);
            dst[cnt[k >> sh & 2047]++] = src[i];
        }
        samp_cand *t = src;
        src = dst;
        dst = t;
    }
    if (src != c) memcpy(c, src, m * sizeof *c);
}

/* c[0..m), given in ascending id order, into cmp_cand's order (the stable sort on dx_desc_key,
 * larger logits first with -0 as +0, keeps equal logits' lower id first; never NaN here: the chain
 * drops NaN as -inf). */
static void sort_by_logit(samp_cand *c, samp_cand *tmp, size_t m) {
    for (size_t i = 0; i < m; i++) {
        const uint32_t k = dx_desc_key(c[i].logit);
        memcpy(&c[i].p, &k, sizeof k);
    }
    sort_keyed(c, tmp, m);
}

static int cmp_id(const void *a, const void *b) {
    const samp_cand *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

/* c[0..m) into ascending id order: the radix sort on the id where a scratch list exists and the
 * list is long, else qsort. */
static void sort_ids(samp_ctx *s, samp_cand *c, size_t m) {
    if (m <= 256 || !cand_scratch(s)) {
        qsort(c, m, sizeof *c, cmp_id);
        return;
    }
    for (size_t i = 0; i < m; i++) {
        const uint32_t k = (uint32_t)c[i].id;
        memcpy(&c[i].p, &k, sizeof k);
    }
    sort_keyed(c, s->tmp, m);
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* 1: the penalties leave every logit as it is (whatever the window holds). */
static int penalties_off(const samp_params *p) {
    return p->repeat_penalty == 1.0f && p->frequency_penalty == 0.0f && p->presence_penalty == 0.0f;
}

/* The window's distinct in-vocabulary ids, ascending, into s->sorted[0..n) with their counts in
 * s->pen_n; 0 when no penalty applies. */
static uint32_t window_penalties(samp_ctx *s) {
    const samp_params *p = &s->p;
    if (!s->hist_n || penalties_off(p)) return 0;
    int32_t *ids = s->sorted;
    memcpy(ids, s->hist, s->hist_n * sizeof *ids);
    qsort(ids, s->hist_n, sizeof *ids, cmp_i32);
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->hist_n;) {
        uint32_t j = i;
        while (j < s->hist_n && ids[j] == ids[i]) j++;
        if (ids[i] >= 0 && (uint32_t)ids[i] < s->n_vocab) {
            ids[n] = ids[i];
            s->pen_n[n++] = j - i;
        }
        i = j;
    }
    return n;
}

/* A penalized logit: repeat penalty (toward lower), then count x frequency + presence. */
static float penalized(const samp_params *p, float l, uint32_t count) {
    return dx_penalized(l, p->repeat_penalty, p->frequency_penalty, p->presence_penalty, count);
}

/* Sifts c[j] up the min-heap c[0..) (worst of the kept at the root). */
static void heap_up(samp_cand *c, size_t j) {
    while (j > 0 && better(&c[(j - 1) / 2], &c[j])) {
        samp_cand t = c[j]; c[j] = c[(j - 1) / 2]; c[(j - 1) / 2] = t;
        j = (j - 1) / 2;
    }
}

/* Replaces the root of the min-heap c[0..k) by x and sifts it down. */
static void heap_replace_root(samp_cand *c, size_t k, samp_cand x) {
    c[0] = x;
    size_t j = 0;
    for (;;) {
        size_t l = 2 * j + 1, m = j;
        if (l < k && better(&c[m], &c[l])) m = l;
        if (l + 1 < k && better(&c[m], &c[l + 1])) m = l + 1;
        if (m == j) break;
        samp_cand t = c[j]; c[j] = c[m]; c[m] = t;
        j = m;
    }
}

/* The candidates kept so far by one pass (run_chain): greedy's best, or the first `top` in id
 * order and then the min-heap of the `top` best. */
typedef struct chain_pass {
    samp_cand *cand;
    size_t m, top;
    int greedy;
    samp_cand best;
    float thr; /* a later token matters only above this: -inf while filling, else the heap's root
                * (a tie loses to the root's lower id) or greedy's best */
} chain_pass;

/* The heap half of pass_take: c joins once the heap of the top best is full. */
static void pass_heap(chain_pass *q, samp_cand c) {
    if (q->m == q->top)
        for (size_t j = 1; j < q->top; j++) heap_up(q->cand, j);
    if (better(&c, &q->cand[0])) heap_replace_root(q->cand, q->top, c);
    q->thr = q->cand[0].logit;
}

/* Token c (its logit > -inf) into the pass. Inline: while the list fills, every token comes here. */
static inline void pass_take(chain_pass *q, samp_cand c) {
    if (q->greedy) { /* c beats thr, the best so far: ascending ids, so a tie never got here */
        q->best = c;
        q->thr = c.logit;
    } else if (q->m < q->top) {
        q->cand[q->m] = c;
    } else {
        pass_heap(q, c);
    }
    q->m++;
}

/* Sorts c[0..m), given in ascending id order, into better()'s order: more than 256 by the radix
 * sort (stable: ties stay in id order), fewer by qsort (whose order is a total one). */
static void rank_cands(samp_ctx *s, samp_cand *c, size_t m) {
    if (m > 256 && cand_scratch(s)) sort_by_logit(c, s->tmp, m);
    else qsort(c, m, sizeof *c, cmp_cand);
}

/* ---- weights and masses (format/det_exp.h: dx_mass, dx_min_p_keeps) ----
 * Sums of masses are exact in any order: top-p's running sum and the draw compare integers. */

static uint64_t cand_mass(const samp_ctx *s, float l, float maxl, float T) {
    return dx_mass(l, maxl, T, s->scale, s->xmin);
}

/* Candidate c's mass at temperature 1: top-p's, kept by id where m1_on. */
static uint64_t cand_mass1(const samp_ctx *s, const samp_cand *c, float maxl) {
    return s->m1_on ? s->m1[c->id] : cand_mass(s, c->logit, maxl, 1.0f);
}


enum { RANK_BUCKETS = 2048 };

/* A candidate's bucket for top-p's partial ranking: eighths of a nat below the largest logit, the
 * last bucket holding everything further (and the NaN an infinite maxl gives). Each float step is
 * monotone, so a larger logit never lands in a later bucket: buckets 0..B hold a prefix of the
 * ranked order, ties never split. */
static uint32_t rank_bucket(float maxl, float l) {
    const float d = (maxl - l) * 8.0f;
    return d < (float)(RANK_BUCKETS - 1) ? (uint32_t)d : RANK_BUCKETS - 1;
}

/* top-p over c[0..m) (ascending ids, m > 256): ranks only as much of the list as the cut needs and
 * returns how many are kept, the ranked prefix whose running sum of masses at temperature 1 first
 * reaches need (all m if none), left at the front of c. mass[b] (bucket b's masses, min-p's
 * dropped candidates included) chooses the buckets ranked first: those moved to the front in id
 * order and sorted. If min-p dropped some of their mass, the running sum may not reach need there;
 * the rest is then sorted behind them (every one of them ranks below every front one), so the kept
 * prefix is the one a full sort gives. */
static size_t top_p_cut(samp_ctx *s, size_t m, float maxl, uint64_t need, const uint64_t *mass) {
    samp_cand *c = s->cand;
    uint32_t nb = RANK_BUCKETS;
    uint64_t acc = 0;
    for (uint32_t b = 0; b < RANK_BUCKETS; b++)
        if ((acc += mass[b]) >= need) {
            nb = b + 1;
            break;
        }
    size_t k = 0;
    if (nb < RANK_BUCKETS && cand_scratch(s)) {
        size_t r = 0; /* a stable partition: buckets below nb to the front */
        for (size_t i = 0; i < m; i++) {
            if (rank_bucket(maxl, c[i].logit) < nb) c[k++] = c[i];
            else s->tmp[r++] = c[i];
        }
        memcpy(c + k, s->tmp, r * sizeof *c);
    } else {
        k = m;
    }
    rank_cands(s, c, k);
    uint64_t cum = 0;
    for (size_t i = 0; i < m; i++) {
        if (i == k) rank_cands(s, c + k, m - k); /* the running sum needs the rest too */
        cum += cand_mass1(s, &c[i], maxl);
        if (cum >= need) return i + 1;
    }
    return m;
}

/* Runs the chain into s->cand[0..*n), in ascending id order, and their masses at the chain's
 * temperature into s->mw[0..*n) (s->total their sum), with probabilities (mass / total) filled in.
 *
 * One pass over the vocabulary: each token's logit (NaN as -inf, then its window penalties) is
 * dropped at -inf, else greedy keeps the best (larger logit, then lower id), and otherwise the
 * tokens are kept in id order until top_k of them are, from then on as a min-heap of the top_k
 * best (built by sifting up in order, then root replacements). Between penalized ids the scan is
 * one compare per token with thr (NaN compares false): while the heap fills thr is -inf, so every
 * token is kept until it is full (or greedy has a best), after which only the tokens that change
 * the result are looked at. */
static g5_status run_chain(samp_ctx *s, const float *logits, size_t *n_out, g5_error *err) {
    const samp_params *p = &s->p;
    const uint32_t n = s->n_vocab, np = window_penalties(s);
    chain_pass q = {s->cand, 0, p->top_k > 0 ? (size_t)p->top_k : SIZE_MAX, !(p->temperature > 0),
                    {-1, -INFINITY, 0}, -INFINITY};
    for (uint32_t i = 0, pi = 0; i < n;) {
        const uint32_t end = pi < np ? (uint32_t)s->sorted[pi] : n;
        if (!q.greedy && q.m < q.top) { /* filling (thr -inf): every logit > -inf kept, no branch */
            size_t m = q.m;
            for (; i < end && m < q.top; i++) {
                const float l = logits[i];
                q.cand[m] = (samp_cand){(int32_t)i, l, 0}; /* m <= i < n_vocab */
                m += l > -INFINITY;
            }
            q.m = m;
        }
        float thr = q.thr; /* a register: the scan compares each token with it */
        for (; i < end; i++) {
            const float l = logits[i];
            if (l > thr) {
                pass_take(&q, (samp_cand){(int32_t)i, l, 0});
                thr = q.thr;
            }
        }
        if (i == n) break;
        float l = logits[i];
        l = penalized(p, isnan(l) ? -INFINITY : l, s->pen_n[pi++]);
        if (l > q.thr) pass_take(&q, (samp_cand){(int32_t)i, l, 0});
        i++;
    }
    size_t m = q.m;
    if (m == 0) return samp_argmax_check(NAN, err); /* the refusal, worded in one place */
    if (q.greedy) {
        s->cand[0] = q.best;
        s->cand[0].p = 1.0f;
        s->mw = s->mass_small;
        s->mw[0] = s->total = 1;
        *n_out = 1;
        return G5_OK;
    }
    const int by_id = m <= q.top; /* no heap: the candidates are in ascending id order */
    if (m > q.top) m = q.top;
    if (m > 256 && !s->mass && !(s->mass = malloc((size_t)n * sizeof *s->mass)))
        return g5_fail(err, G5_ERR_NOMEM, "sampler: out of memory for %u masses", n);
    uint64_t *const mass = s->mw = m > 256 ? s->mass : s->mass_small;
    if (!by_id) sort_ids(s, s->cand, m); /* the top_k of the heap, in id order */
    float maxl = -INFINITY;
    for (size_t i = 0; i < m; i++)
        if (s->cand[i].logit > maxl) maxl = s->cand[i].logit;

    /* top-p measures masses over the set top-k left (before min-p), at temperature 1 */
    const int top_p = p->top_p < 1.0f, partial = top_p && m > 256, min_p = p->min_p > 0 && p->min_p <= 1;
    uint64_t z = 0, bmass[RANK_BUCKETS];
    if (partial) memset(bmass, 0, sizeof bmass);
    if (partial && !s->m1) s->m1 = malloc((size_t)n * sizeof *s->m1); /* else computed again */
    uint64_t *const m1 = partial ? s->m1 : NULL;
    s->m1_on = 0;
    for (size_t i = 0; top_p && i < m; i++) {
        const uint64_t w = cand_mass(s, s->cand[i].logit, maxl, 1.0f);
        z += w;
        if (partial) bmass[rank_bucket(maxl, s->cand[i].logit)] += w;
        if (m1) m1[s->cand[i].id] = w;
    }
    s->m1_on = m1 != NULL;
    /* min-p keeps the candidates whose weight at temperature 1 is at least min_p (the largest's
     * is 1), in their order */
    if (min_p) {
        const double lmin = log((double)p->min_p);
        size_t k = 0;
        for (size_t i = 0; i < m; i++)
            if (dx_min_p_keeps(s->cand[i].logit, maxl, p->min_p, lmin)) s->cand[k++] = s->cand[i];
        m = k;
    }
    /* top-p keeps every candidate whose logit is at least that of the ranked prefix's last, the
     * prefix whose running mass first reaches need (its ties included: the largest logit v with
     * the mass of the logits >= v at least need); then back into id order */
    if (top_p) {
        const uint64_t need = dx_top_p_need(p->top_p, z);
        size_t kr = m;
        if (partial && m > 256) {
            kr = top_p_cut(s, m, maxl, need, bmass);
        } else {
            rank_cands(s, s->cand, m);
            uint64_t cum = 0;
            for (size_t i = 0; i < m; i++)
                if ((cum += cand_mass1(s, &s->cand[i], maxl)) >= need) {
                    kr = i + 1;
                    break;
                }
        }
        /* the cut's ties follow it in the ranked part (one bucket holds them all) */
        while (kr < m && s->cand[kr].logit == s->cand[kr - 1].logit) kr++;
        m = kr;
        sort_ids(s, s->cand, m);
    }
    uint64_t total = 0;
    for (size_t i = 0; i < m; i++)
        total += mass[i] = p->temperature == 1.0f ? cand_mass1(s, &s->cand[i], maxl)
                                                  : cand_mass(s, s->cand[i].logit, maxl, p->temperature);
    s->total = total;
    *n_out = m;
    return G5_OK;
}

/* The candidates' p (mass / total) and logit / T, for the callers that show or compare them; a
 * draw reads only the masses (samp_sample). Greedy's one candidate keeps p 1 and its logit. */
static void cand_probs(samp_ctx *s, size_t m) {
    if (!(s->p.temperature > 0)) return;
    for (size_t i = 0; i < m; i++) {
        s->cand[i].p = (float)((double)s->mw[i] / (double)s->total);
        s->cand[i].logit /= s->p.temperature;
    }
}

g5_status samp_candidates(samp_ctx *s, const float *logits, samp_cand *out, size_t cap, size_t *n,
                          g5_error *err) {
    if (n) *n = 0;
    if (!s || !logits || (!out && cap) || !n)
        return g5_fail(err, G5_ERR_INVALID_ARG, "samp_candidates: bad arguments");
    size_t m;
    g5_status st = run_chain(s, logits, &m, err);
    if (st != G5_OK) return st;
    cand_probs(s, m);
    qsort(s->cand, m, sizeof *s->cand, cmp_cand); /* the draw's id order, shown ranked (not by the radix
                                                   * sort: it would take p for its keys) */
    memcpy(out, s->cand, (m < cap ? m : cap) * sizeof *out);
    *n = m;
    if (m > cap)
        return g5_fail(err, G5_ERR_BOUNDS, "samp_candidates: %zu candidates do not fit in %zu", m,
                       cap);
    return G5_OK;
}

int samp_is_argmax(const samp_ctx *s) { return !(s->p.temperature > 0) && (!s->hist_n || penalties_off(&s->p)); }

int samp_params_argmax(const samp_params *p) {
    return !(p->temperature > 0) && (p->repeat_last_n == 0 || penalties_off(p));
}

g5_status samp_argmax_check(float logit, g5_error *err) {
    return logit > -INFINITY ? G5_OK : g5_fail(err, G5_ERR_INVALID_ARG, "sampler: every logit is NaN or -inf");
}

int samp_device_ok(const samp_ctx *s) { return s != NULL; }

int samp_params_device(const samp_params *p, uint32_t n_vocab) {
    (void)n_vocab;
    return p != NULL;
}

int samp_device_row(samp_ctx *s, samp_dev_row *row) {
    if (!row || !samp_device_ok(s)) return 0;
    const samp_params *p = &s->p;
    memset(row, 0, sizeof *row);
    row->top_p = 1.0f;
    row->repeat_penalty = p->repeat_penalty;
    row->frequency_penalty = p->frequency_penalty;
    row->presence_penalty = p->presence_penalty;
    row->n_pen = window_penalties(s); /* the window as the chain would see it now */
    row->pen_ids = s->sorted;
    row->pen_counts = s->pen_n;
    if (!(p->temperature > 0)) return 1;
    row->temperature = p->temperature;
    row->top_p = p->top_p < 1.0f ? p->top_p : 1.0f;
    row->top_k = p->top_k > 0 && (uint32_t)p->top_k < s->n_vocab ? p->top_k : 0;
    if (p->min_p > 0 && p->min_p <= 1) {
        row->min_p = p->min_p;
        row->lmin = log((double)p->min_p);
    }
    row->k = xoshiro_next(s->rng) >> 11; /* samp_sample's number */
    return 1;
}

static int cmp_u64(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* samp_device_draw's view of a row: its logits (NaN read as -inf) and the bounds of its set. */
typedef struct dev_view {
    const samp_dev_row *row;
    const float *logits;
    uint32_t n;
    float maxl;
    double scale, xmin;
    uint32_t kk, kt; /* top-k's key and top-p's, UINT32_MAX where off */
    int32_t idk;     /* the last of kk's ties in the set, by id */
} dev_view;

static float dv_logit(const dev_view *v, uint32_t i) { return v->logits[i] != v->logits[i] ? -INFINITY : v->logits[i]; }

/* 1 if id i (its logit > -inf, key k) is in the top-k set. */
static int dv_in_top_k(const dev_view *v, uint32_t k, uint32_t i) {
    return v->kk == UINT32_MAX || k < v->kk || (k == v->kk && (int32_t)i <= v->idk);
}

/* The (key << 32 | id) of the logits > -inf of v (those of the top-k set with min-p's survivors
 * only where `kept`), sorted; *m their count. NULL when out of memory. */
static uint64_t *dv_sorted(const dev_view *v, int kept, uint32_t *m) {
    uint64_t *ki = malloc((size_t)v->n * sizeof *ki);
    *m = 0;
    for (uint32_t i = 0; ki && i < v->n; i++) {
        const float l = dv_logit(v, i);
        if (!(l > -INFINITY)) continue;
        const uint32_t k = dx_desc_key(l);
        if (kept && (!dv_in_top_k(v, k, i) || (v->row->min_p > 0 && !dx_min_p_keeps(l, v->maxl, v->row->min_p, v->row->lmin))))
            continue;
        ki[(*m)++] = (uint64_t)k << 32 | i;
    }
    if (ki) qsort(ki, *m, sizeof *ki, cmp_u64);
    return ki;
}

static int32_t device_draw(const samp_dev_row *row, const float *logits, uint32_t n_vocab);

int32_t samp_device_draw(const samp_dev_row *row, const float *logits, uint32_t n_vocab) {
    float *pl = NULL; /* the penalized copy where penalties are in force */
    if (row->n_pen) {
        if (!(pl = malloc((size_t)n_vocab * sizeof *pl))) return -1;
        memcpy(pl, logits, (size_t)n_vocab * sizeof *pl);
        for (uint32_t j = 0; j < row->n_pen; j++) {
            const int32_t i = row->pen_ids[j];
            const float l = pl[i] != pl[i] ? -INFINITY : pl[i];
            pl[i] = dx_penalized(l, row->repeat_penalty, row->frequency_penalty, row->presence_penalty, row->pen_counts[j]);
        }
        logits = pl;
    }
    const int32_t id = device_draw(row, logits, n_vocab);
    free(pl);
    return id;
}

static int32_t device_draw(const samp_dev_row *row, const float *logits, uint32_t n_vocab) {
    dev_view v = {row, logits, n_vocab, -INFINITY, 0, 0, UINT32_MAX, UINT32_MAX, 0};
    int32_t best = -1;
    for (uint32_t i = 0; i < n_vocab; i++)
        if (logits[i] > v.maxl) v.maxl = logits[i], best = (int32_t)i;
    if (best < 0 || !(row->temperature > 0)) return best;
    const int kb = dx_mass_bits(n_vocab);
    v.scale = ldexp(1.0, kb), v.xmin = dx_mass_xmin(kb);
    uint32_t m;
    if (row->top_k > 0 && (uint32_t)row->top_k < n_vocab) { /* the top_k-th of (key, id), if it cuts */
        uint64_t *ki = dv_sorted(&v, 0, &m);
        if (ki && m > (uint32_t)row->top_k) v.kk = (uint32_t)(ki[row->top_k - 1] >> 32), v.idk = (int32_t)(uint32_t)ki[row->top_k - 1];
        free(ki);
    }
    if (row->top_p < 1.0f) { /* the least key at which the kept masses reach need */
        uint64_t z = 0, cum = 0;
        for (uint32_t i = 0; i < n_vocab; i++) {
            const float l = dv_logit(&v, i);
            if (l > -INFINITY && dv_in_top_k(&v, dx_desc_key(l), i)) z += dx_mass(l, v.maxl, 1.0f, v.scale, v.xmin);
        }
        const uint64_t need = dx_top_p_need(row->top_p, z);
        uint64_t *ki = dv_sorted(&v, 1, &m);
        for (uint32_t j = 0; ki && j < m; j++)
            if ((cum += dx_mass(logits[(uint32_t)ki[j]], v.maxl, 1.0f, v.scale, v.xmin)) >= need) {
                v.kt = (uint32_t)(ki[j] >> 32);
                break;
            }
        free(ki);
    }
    uint64_t total = 0;
    for (int pass = 0; pass < 2; pass++) { /* the total, then the walk to r */
        const uint64_t r = pass ? dx_draw_point(row->k, total) : 0;
        uint64_t cum = 0;
        for (uint32_t i = 0; i < n_vocab; i++) {
            const float l = dv_logit(&v, i);
            if (!(l > -INFINITY)) continue;
            const uint32_t k = dx_desc_key(l);
            const int keep = dv_in_top_k(&v, k, i) &&
                             (row->min_p <= 0 || dx_min_p_keeps(l, v.maxl, row->min_p, row->lmin)) &&
                             (v.kt == UINT32_MAX || k <= v.kt);
            const uint64_t mass = keep ? dx_mass(l, v.maxl, row->temperature, v.scale, v.xmin) : 0;
            if (!pass) total += mass;
            else if (r < (cum += mass)) return (int32_t)i;
        }
    }
    return best; /* not reached: r < total */
}

g5_status samp_sample(samp_ctx *s, const float *logits, int32_t *id, g5_error *err) {
    if (!s || !logits || !id) return g5_fail(err, G5_ERR_INVALID_ARG, "samp_sample: bad arguments");
    /* Every sampled draw takes one number first, a single candidate or refused logits too, so the
     * stream does not depend on the logits (a device draw takes its number before the logits
     * exist: samp_device_row). */
    const int sampled = s->p.temperature > 0;
    const uint64_t k = sampled ? xoshiro_next(s->rng) >> 11 : 0;
    size_t m;
    g5_status st = run_chain(s, logits, &m, err);
    if (st != G5_OK) return st;
    if (!sampled) { /* greedy: the argmax, no random number */
        *id = s->cand[0].id;
        return G5_OK;
    }
    /* r = floor(u * total) for samp_rand's u = k / 2^53, uniform in [0, total) up to 2^-53: the
     * first candidate whose running mass passes r */
    const uint64_t r = dx_draw_point(k, s->total);
    uint64_t cum = 0;
    for (size_t i = 0; i < m; i++)
        if (r < (cum += s->mw[i])) {
            *id = s->cand[i].id;
            return G5_OK;
        }
    *id = s->cand[m - 1].id; /* not reached: r < total */
    return G5_OK;
}

g5_status samp_sample_spec(samp_ctx *s, const float *target_logits, const float *draft_logits, int32_t x,
                           int32_t *id, int *accepted, g5_error *err) {
    if (accepted) *accepted = 0;
    if (!s || !target_logits || !draft_logits || !id)
        return g5_fail(err, G5_ERR_INVALID_ARG, "samp_sample_spec: bad arguments");
    if (!(s->p.temperature > 0)) {
        g5_status st = samp_sample(s, target_logits, id, err);
        if (!st && accepted) *accepted = *id == x;
        return st;
    }
    if (x < 0 || (uint32_t)x >= s->n_vocab)
        return g5_fail(err, G5_ERR_INVALID_ARG, "samp_sample_spec: draft token %d outside the vocabulary (%u)", x,
                       s->n_vocab);
    if (!s->qp && !(s->qp = calloc(s->n_vocab, sizeof *s->qp)))
        return g5_fail(err, G5_ERR_NOMEM, "samp_sample_spec: out of memory for %u probabilities", s->n_vocab);
    size_t mq, m;
    g5_status st = run_chain(s, draft_logits, &mq, err);
    if (st != G5_OK) return st;
    cand_probs(s, mq);
    /* q as samp_sample draws: the kept probabilities renormalized (so are p's below) */
    double qsum = 0;
    for (size_t i = 0; i < mq; i++) qsum += s->cand[i].p;
    for (size_t i = 0; i < mq; i++) s->qp[s->cand[i].id] = (float)(s->cand[i].p / qsum);
    const double qx = s->qp[x];
    st = run_chain(s, target_logits, &m, err);
    if (st == G5_OK) cand_probs(s, m);
    if (st == G5_OK) {
        double px = 0, sum = 0;
        for (size_t i = 0; i < m; i++) {
            if (s->cand[i].id == x) px = s->cand[i].p;
            sum += s->cand[i].p;
        }
        px /= sum;
        if (samp_rand(s) * qx < px) {
            *id = x;
            if (accepted) *accepted = 1;
        } else {
            /* the residual max(0, p - q): zero at x, since rejection means p(x) < q(x) */
            double rs = 0;
            for (size_t i = 0; i < m; i++) {
                double w = (double)s->cand[i].p / sum - s->qp[s->cand[i].id];
                s->cand[i].p = w > 0 ? (float)w : 0.0f;
                rs += s->cand[i].p;
            }
            int32_t pick = -1;
            if (rs > 0) {
                double r = samp_rand(s) * rs, cum = 0;
                for (size_t i = 0; i < m && pick < 0; i++) {
                    if (!(s->cand[i].p > 0)) continue;
                    cum += s->cand[i].p;
                    if (r < cum) pick = s->cand[i].id;
                }
                for (size_t i = m; pick < 0 && i-- > 0;) /* r rounded up to the total */
                    if (s->cand[i].p > 0) pick = s->cand[i].id;
            } else { /* p == q up to rounding (and x rejected): p itself, without x */
                for (size_t i = 0; i < m && pick < 0; i++)
                    if (s->cand[i].id != x) pick = s->cand[i].id;
                if (pick < 0) pick = x;
            }
            *id = pick;
        }
    }
    memset(s->qp, 0, (size_t)s->n_vocab * sizeof *s->qp);
    return st;
}

/* ---- stop strings ---- */

int samp_stop_find(const char *text, size_t len, size_t new_len, const char *const *stops,
                   size_t n_stops, size_t *pos) {
    if (!text || !stops || new_len > len) return -1;
    size_t maxl = 0;
    for (size_t k = 0; k < n_stops; k++) {
        size_t l = stops[k] ? strlen(stops[k]) : 0;
        if (l > maxl) maxl = l;
    }
    if (maxl == 0) return -1;
    size_t old_end = len - new_len;
    size_t start = old_end > maxl - 1 ? old_end - (maxl - 1) : 0;
    for (size_t p = start; p < len; p++) {
        for (size_t k = 0; k < n_stops; k++) {
            if (!stops[k]) continue;
            size_t l = strlen(stops[k]);
            if (l == 0 || l > len - p || p + l <= old_end) continue;
            if (memcmp(text + p, stops[k], l) == 0) {
                if (pos) *pos = p;
                return (int)k;
            }
        }
    }
    return -1;
}

size_t samp_stop_holdback(const char *text, size_t len, const char *const *stops, size_t n_stops) {
    if (!text || !stops) return 0;
    size_t best = 0;
    for (size_t k = 0; k < n_stops; k++) {
        if (!stops[k]) continue;
        size_t l = strlen(stops[k]);
        if (l == 0) continue;
        size_t h = l - 1 < len ? l - 1 : len; /* a proper prefix is shorter than the stop */
        for (; h > best; h--) {
            if (memcmp(text + len - h, stops[k], h) == 0) {
                best = h;
                break;
            }
        }
    }
    return best;
}
