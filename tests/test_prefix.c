/* The prefix store's index and block rules (runtime/prefix.h), which the GPU engine's prefix
 * caching runs on (runtime/engine_gpu.c): the hash table and the LRU order against a naive
 * model under random chains (evictions, deletions by backward shift), a chain's tail evicted
 * before its head, chains longer than the store, drops, the budget in whole blocks, and the
 * prefill schedule: on a mock device whose cache rows depend on how the positions were split
 * into calls (as the GPU's do), a sequence that attaches published blocks and runs the rest
 * holds the same rows as one that ran everything, and only blocks run as exact block calls from
 * position 0 are published. */
#include <stdint.h>
#include <string.h>

#include "runtime/cpu/kvcache.h"
#include "runtime/prefix.h"
#include "tests/test_util.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* ---- basic behaviour ---- */

static void test_basic(void) {
    g5_error e = {0};
    rt_pfx *x = NULL;
    T_CHECK(rt_pfx_create(0, &x, &e) == G5_ERR_INVALID_ARG && !x, "0 slots refused");
    T_CHECK(rt_pfx_create(4, &x, &e) == G5_OK && x, "create: %s", e.msg);
    if (!x) return;
    const uint64_t A[3] = {11, 12, 13}, B[3] = {11, 12, 23}, X[1] = {31}, Y[6] = {41, 42, 43, 44, 45, 46};
    uint32_t s[8], s2[8];
    uint8_t f[8];
    T_CHECK(rt_pfx_find(x, A, 3, s) == 0, "empty index finds nothing");
    T_CHECK(rt_pfx_insert(x, A, 3, s, f) == 3 && f[0] && f[1] && f[2], "chain A stored fresh");
    T_CHECK(s[0] == 0 && s[1] == 1 && s[2] == 2, "lowest slots first: %u %u %u", s[0], s[1], s[2]);
    T_CHECK(rt_pfx_n_used(x) == 3 && rt_pfx_n_evicted(x) == 0, "3 used, none evicted");
    T_CHECK(rt_pfx_find(x, A, 3, s2) == 3 && !memcmp(s, s2, 3 * sizeof *s), "chain A found in its slots");
    T_CHECK(rt_pfx_find(x, A, 2, s2) == 2, "a shorter query finds its part");
    T_CHECK(rt_pfx_insert(x, A, 3, s2, f) == 3 && !f[0] && !f[1] && !f[2], "chain A again: nothing fresh");
    T_CHECK(rt_pfx_insert(x, B, 3, s2, f) == 3 && !f[0] && !f[1] && f[2] && s2[2] == 3, "chain B shares A's head");
    T_CHECK(rt_pfx_find(x, B, 3, s2) == 3, "chain B found");
    /* LRU now (oldest first): 13 (A's tail), 23, 12, 11: a new block evicts A's tail */
    T_CHECK(rt_pfx_insert(x, X, 1, s2, f) == 1 && f[0] && s2[0] == s[2], "X takes A's tail's slot (%u, want %u)", s2[0],
            s[2]);
    T_CHECK(rt_pfx_n_evicted(x) == 1 && rt_pfx_slot_of(x, 13) == RT_PFX_NONE, "A's tail evicted");
    T_CHECK(rt_pfx_find(x, A, 3, s2) == 2, "A's head still serves a 2-block prefix");
    T_CHECK(rt_pfx_find(x, B, 3, s2) == 3, "B whole");
    /* a chain longer than the store: its first 4 blocks, each in its own slot */
    T_CHECK(rt_pfx_insert(x, Y, 6, s, f) == 4 && f[0] && f[1] && f[2] && f[3], "Y: 4 of 6 blocks stored fresh");
    T_CHECK(s[0] != s[1] && s[0] != s[2] && s[0] != s[3] && s[1] != s[2] && s[1] != s[3] && s[2] != s[3],
            "Y's blocks in distinct slots");
    T_CHECK(rt_pfx_find(x, Y, 6, s2) == 4 && rt_pfx_n_evicted(x) == 5, "Y found 4 deep; evicted %llu (want 5)",
            (unsigned long long)rt_pfx_n_evicted(x));
    T_CHECK(rt_pfx_find(x, B, 3, s2) == 0 && rt_pfx_find(x, X, 1, s2) == 0, "the older chains are gone");
    rt_pfx_drop(x, s[1]);
    T_CHECK(rt_pfx_find(x, Y, 6, s2) == 1 && rt_pfx_n_used(x) == 3, "a dropped block ends the chain there");
    rt_pfx_drop(x, s[1]); /* twice: nothing */
    rt_pfx_drop(x, 99);
    T_CHECK(rt_pfx_n_used(x) == 3, "dropping a free or unknown slot changes nothing");
    T_CHECK(rt_pfx_insert(x, Y, 3, s2, f) == 3 && !f[0] && f[1] && !f[2] && s2[1] == s[1], "Y's block 1 again, fresh");
    rt_pfx_free(x);
    rt_pfx_free(NULL);
}

/* ---- random chains against a naive model ---- */

#define MODEL_MAX 64
typedef struct model {
    uint64_t h[MODEL_MAX]; /* oldest first */
    uint32_t n, cap;
    uint64_t evicted;
} model;

static int model_pos(const model *m, uint64_t h) {
    for (uint32_t i = 0; i < m->n; i++)
        if (m->h[i] == h) return (int)i;
    return -1;
}
static void model_touch(model *m, uint64_t h) {
    int i = model_pos(m, h);
    memmove(m->h + i, m->h + i + 1, (m->n - (uint32_t)i - 1) * sizeof *m->h);
    m->h[m->n - 1] = h;
}
static uint32_t model_find(model *m, const uint64_t *hs, uint32_t n) {
    uint32_t k = 0;
    while (k < n && model_pos(m, hs[k]) >= 0) k++;
    for (uint32_t i = k; i-- > 0;) model_touch(m, hs[i]);
    return k;
}
static uint32_t model_insert(model *m, const uint64_t *hs, uint32_t n) {
    const uint32_t k = n < m->cap ? n : m->cap;
    for (uint32_t i = 0; i < k; i++) {
        if (model_pos(m, hs[i]) >= 0) {
            model_touch(m, hs[i]);
            continue;
        }
        if (m->n == m->cap) {
            memmove(m->h, m->h + 1, (m->n - 1) * sizeof *m->h);
            m->n--;
            m->evicted++;
        }
        m->h[m->n++] = hs[i];
    }
    for (uint32_t i = k; i-- > 0;) model_touch(m, hs[i]);
    return k;
}

static void test_random(void) {
    static const uint32_t caps[] = {1, 2, 7, 37};
    for (size_t c = 0; c < sizeof caps / sizeof caps[0]; c++) {
        g5_error e = {0};
        rt_pfx *x = NULL;
        T_CHECK(rt_pfx_create(caps[c], &x, &e) == G5_OK, "create %u: %s", caps[c], e.msg);
        if (!x) continue;
        model m = {.cap = caps[c]};
        uint32_t bad = 0, bad_slots = 0;
        for (int it = 0; it < 4000; it++) {
            /* chains over a small alphabet of heads so that they share prefixes and collide in
             * the table; hashes colliding in their low bits too (multiples of 64) */
            uint64_t hs[12];
            const uint32_t n = 1 + (uint32_t)(rnd() % 12);
            uint64_t h = rnd() % 5;
            for (uint32_t k = 0; k < n; k++) {
                h = h * 31 + (rnd() % 3);
                hs[k] = (h + 1) << 6;
            }
            uint32_t s[12];
            uint8_t f[12];
            if (rnd() % 2) {
                if (rt_pfx_find(x, hs, n, s) != model_find(&m, hs, n)) bad++;
            } else {
                const uint32_t k = rt_pfx_insert(x, hs, n, s, f);
                if (k != model_insert(&m, hs, n)) bad++;
                for (uint32_t i = 0; i < k; i++)
                    for (uint32_t j = 0; j < i; j++)
                        if (s[i] == s[j] && hs[i] != hs[j]) bad_slots++;
            }
            if (rt_pfx_n_used(x) != m.n || rt_pfx_n_evicted(x) != m.evicted) bad++;
            for (uint32_t i = 0; i < m.n; i++)
                if (rt_pfx_slot_of(x, m.h[i]) == RT_PFX_NONE) bad++;
        }
        T_CHECK(bad == 0 && bad_slots == 0, "%u slots: %u disagreements with the naive LRU, %u shared slots", caps[c], bad,
                bad_slots);
        T_CHECK(m.evicted > 100, "%u slots: %llu evictions (the run must exercise them)", caps[c],
                (unsigned long long)m.evicted);
        rt_pfx_free(x);
    }
}

/* ---- block rules and the schedule on a mock device ---- */

static void test_rules(void) {
    T_CHECK(rt_pfx_slots_for(1000, 300) == 3 && rt_pfx_slots_for(299, 300) == 0 && rt_pfx_slots_for(5, 0) == 0,
            "whole blocks of the budget");
    T_CHECK(rt_pfx_slots_for(UINT64_MAX, 1) == 1u << 30, "at most 2^30 slots");
    T_CHECK(rt_pfx_call_len(0, 600, 256) == 256 && rt_pfx_call_len(256, 344, 256) == 256 &&
                rt_pfx_call_len(512, 88, 256) == 88 && rt_pfx_call_len(100, 600, 256) == 156 &&
                rt_pfx_call_len(100, 600, 0) == 600 && rt_pfx_call_len(255, 1, 256) == 1,
            "calls end at the multiples of the block");
    T_CHECK(rt_pfx_exact_after(0, 0, 256, 256) == 256 && rt_pfx_exact_after(256, 256, 256, 256) == 512 &&
                rt_pfx_exact_after(0, 0, 100, 256) == 0 && rt_pfx_exact_after(0, 256, 256, 256) == 0 &&
                rt_pfx_exact_after(256, 256, 0, 0) == 256,
            "only the exact block after n_exact extends it");
    T_CHECK(rt_pfx_attach_max(257, 256) == 1 && rt_pfx_attach_max(256, 256) == 0 && rt_pfx_attach_max(513, 256) == 2 &&
                rt_pfx_attach_max(1, 1) == 0 && rt_pfx_attach_max(2, 1) == 1 && rt_pfx_attach_max(9, 0) == 0,
            "attach leaves one token to run");
}

/* A mock sequence whose cache row at a position depends on the token, the row before it and the
 * call that wrote it (start, length): a split other than the fresh run's shows. */
#define MOCK_POS 2048
typedef struct mseq {
    uint64_t row[MOCK_POS];
    uint32_t n_past, n_exact;
} mseq;

static void mock_call(mseq *s, const int32_t *tok, uint32_t n) {
    const uint32_t p0 = s->n_past;
    for (uint32_t t = 0; t < n; t++) {
        const uint64_t prev = p0 + t ? s->row[p0 + t - 1] : 7;
        s->row[p0 + t] = (prev * 1000003u) ^ ((uint64_t)(uint32_t)tok[t] << 20) ^ ((uint64_t)p0 << 40) ^ n;
    }
    s->n_past += n;
}

static void mock_prefill(mseq *s, const int32_t *tok, uint32_t n, uint32_t bt, int decode) {
    for (uint32_t done = 0; done < n;) {
        const uint32_t len = decode ? 1 : rt_pfx_call_len(s->n_past, n - done, bt);
        const uint32_t p = s->n_past;
        mock_call(s, tok + done, len);
        if (!decode) s->n_exact = rt_pfx_exact_after(s->n_exact, p, len, bt);
        done += len;
    }
}

typedef struct mstore {
    rt_pfx *x;
    uint64_t blk[8][64]; /* 8 slots of up to 64 rows */
} mstore;

static void mock_publish(mstore *st, const mseq *s, const int32_t *tok, uint32_t bt) {
    const uint32_t nb = s->n_exact / bt;
    uint64_t h[64];
    uint32_t sl[64];
    uint8_t f[64];
    rt_kv_prefix_hashes(tok, nb, bt, h);
    const uint32_t m = rt_pfx_insert(st->x, h, nb, sl, f);
    for (uint32_t k = 0; k < m; k++)
        if (f[k]) memcpy(st->blk[sl[k]], s->row + (size_t)k * bt, bt * sizeof *s->row);
}

static uint32_t mock_attach(mstore *st, mseq *s, const int32_t *tok, uint32_t n, uint32_t bt) {
    uint64_t h[64];
    uint32_t sl[64];
    const uint32_t nb = rt_pfx_attach_max(n, bt);
    rt_kv_prefix_hashes(tok, nb, bt, h);
    const uint32_t k = rt_pfx_find(st->x, h, nb, sl);
    for (uint32_t i = 0; i < k; i++) memcpy(s->row + (size_t)i * bt, st->blk[sl[i]], bt * sizeof *s->row);
    s->n_past = s->n_exact = k * bt;
    return k * bt;
}

static void test_schedule(void) {
    enum { BT = 64 };
    static mstore st;
    static mseq a, b, c, d;
    g5_error e = {0};
    T_CHECK(rt_pfx_create(8, &st.x, &e) == G5_OK, "store: %s", e.msg);
    if (!st.x) return;
    int32_t pa[400], pb[400];
    for (int i = 0; i < 400; i++) pa[i] = (int32_t)(rnd() % 1000);
    memcpy(pb, pa, 300 * sizeof *pb); /* 4 whole blocks shared, then different */
    for (int i = 300; i < 400; i++) pb[i] = (int32_t)(1000 + i);
    /* A: prompt of 300 in block calls, then 40 decode steps (tokens 300.. of pa) */
    mock_prefill(&a, pa, 300, BT, 0);
    T_CHECK(a.n_exact == 256, "A's exact positions %u (want 4 blocks of 64)", a.n_exact);
    mock_prefill(&a, pa + 300, 40, BT, 1);
    T_CHECK(a.n_exact == 256 && a.n_past == 340, "decode steps are not exact (%u of %u)", a.n_exact, a.n_past);
    mock_publish(&st, &a, pa, BT);
    T_CHECK(rt_pfx_n_used(st.x) == 4, "A published %u blocks (want 4: not the decoded one)", rt_pfx_n_used(st.x));
    /* B shares A's first 300 tokens: takes 4 blocks, runs the rest; C runs B's prompt fresh */
    const uint32_t got = mock_attach(&st, &b, pb, 380, BT);
    T_CHECK(got == 256, "B reused %u positions (want 256)", got);
    mock_prefill(&b, pb + got, 380 - got, BT, 0);
    mock_prefill(&c, pb, 380, BT, 0);
    T_CHECK(b.n_past == 380 && !memcmp(b.row, c.row, 380 * sizeof *b.row), "B (attached) holds C's (fresh) rows");
    T_CHECK(b.n_exact == c.n_exact && c.n_exact == 320, "B and C exact to %u / %u (want 320)", b.n_exact, c.n_exact);
    /* the schedule matters: the same prompt as one call differs (the mock is split-dependent) */
    mock_call(&d, pb, 380);
    T_CHECK(memcmp(d.row, c.row, 380 * sizeof *d.row) != 0, "the mock tells splits apart (else this test proves nothing)");
    /* D: a prompt that is exactly A's 256 exact positions plus one: 4 blocks, one token to run */
    memset(&d, 0, sizeof d);
    T_CHECK(mock_attach(&st, &d, pa, 257, BT) == 256, "a prompt of 4 blocks + 1 token reuses 4 blocks");
    memset(&d, 0, sizeof d);
    T_CHECK(mock_attach(&st, &d, pa, 256, BT) == 192, "a prompt of exactly 4 blocks reuses 3 (one token to run)");
    rt_pfx_free(st.x);
}

int main(void) {
    test_basic();
    test_random();
    test_rules();
    test_schedule();
    return t_report("test_prefix");
}
