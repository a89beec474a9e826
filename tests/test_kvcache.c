/* The paged cache pool (runtime/cpu/kvcache.h) and paged decoding states (runtime/cpu/model.h):
 * allocation, exhaustion (all or nothing), reuse, the position -> (block, row) mapping of every
 * rank/layer region without overlap, truncation returning blocks, growable pools, concurrent
 * use from several threads, per-position rows (rt_kvpool_keep_rows: their own region of each
 * block, copied by unshare, refused once blocks exist), and on the oracle model the block
 * accounting of paged states. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/cpu/kvcache.h"
#include "runtime/cpu/model.h"
#include "runtime/cpu/weights.h"
#include "tests/test_util.h"

enum { NR = 2, NL = 3, KVW = 5, IDW = 3, BT = 4 };
static const uint8_t has_idx[NL] = {1, 0, 1};

static rt_kvlayout layout(void) {
    rt_kvlayout l = {.n_ranks = NR, .il0 = 7, .n_layers = NL, .kv_width = KVW, .idx_width = IDW, .has_idx = has_idx};
    return l;
}

static float tag(uint32_t r, uint32_t il, uint32_t pos, uint32_t j, int idx) {
    return (float)(((pos * 8 + r) * 16 + il) * 16 + j) + (idx ? 0.5f : 0.0f);
}

/* Writes a distinct value into every float of every (rank, layer, position) region of t, then
 * reads them all back: any two regions sharing memory would clobber each other. */
static int fill_and_check(const rt_kvtab *t, uint32_t n_pos) {
    const rt_kvpool *p = t->pool;
    for (uint32_t pos = 0; pos < n_pos; pos++)
        for (uint32_t r = 0; r < NR; r++)
            for (uint32_t l = 0; l < NL; l++) {
                const uint32_t il = 7 + l;
                float *lat = rt_kvtab_lat(t, r, il, pos);
                const float *blk = t->ptr[pos / BT];
                if (lat < blk || lat + KVW > blk + p->block_floats) return 0;
                for (uint32_t j = 0; j < KVW; j++) lat[j] = tag(r, il, pos, j, 0);
                if (!has_idx[l]) continue;
                float *ik = rt_kvtab_idx(t, r, il, pos);
                if (ik < blk || ik + IDW > blk + p->block_floats) return 0;
                for (uint32_t j = 0; j < IDW; j++) ik[j] = tag(r, il, pos, j, 1);
            }
    for (uint32_t pos = 0; pos < n_pos; pos++)
        for (uint32_t r = 0; r < NR; r++)
            for (uint32_t l = 0; l < NL; l++) {
                const uint32_t il = 7 + l;
                const float *lat = rt_kvtab_lat(t, r, il, pos);
                for (uint32_t j = 0; j < KVW; j++)
                    if (lat[j] != tag(r, il, pos, j, 0)) return 0;
                if (!has_idx[l]) continue;
                const float *ik = rt_kvtab_idx(t, r, il, pos);
                for (uint32_t j = 0; j < IDW; j++)
                    if (ik[j] != tag(r, il, pos, j, 1)) return 0;
            }
    return 1;
}

static void test_pool(void) {
    g5_error e = {0};
    rt_kvlayout lay = layout();
    rt_kvpool *p = NULL;
    T_CHECK(rt_kvpool_create_layout(&lay, 4, 0, &p, &e) == G5_ERR_INVALID_ARG && !p, "0-token blocks refused");
    T_CHECK(rt_kvpool_create_layout(&lay, 4, BT, &p, &e) == G5_OK, "create: %s", e.msg);
    if (!p) return;
    /* per rank: 3 latent regions of BT*KVW, 2 key regions of BT*IDW */
    T_CHECK(rt_kvpool_block_bytes(p) == (uint64_t)NR * BT * (NL * KVW + 2 * IDW) * sizeof(float),
            "block bytes %llu", (unsigned long long)rt_kvpool_block_bytes(p));
    T_CHECK(rt_kvpool_n_blocks(p) == 4 && rt_kvpool_n_free(p) == 4 && rt_kvpool_block_tokens(p) == BT, "counts");

    rt_kvtab a = {.pool = p}, b = {.pool = p};
    T_CHECK(rt_kvtab_blocks_for(&a, 0) == 0 && rt_kvtab_blocks_for(&a, 1) == 1 && rt_kvtab_blocks_for(&a, 4) == 1 &&
                rt_kvtab_blocks_for(&a, 5) == 2,
            "blocks for n tokens");
    T_CHECK(rt_kvtab_reserve(&a, 9, &e) == G5_OK && a.n == 3 && rt_kvpool_n_free(p) == 1, "9 tokens: 3 blocks");
    T_CHECK(a.ids[0] == 0 && a.ids[1] == 1 && a.ids[2] == 2, "lowest ids first");
    T_CHECK(a.ptr[0] != a.ptr[1] && a.ptr[1] != a.ptr[2] && a.ptr[0] != a.ptr[2], "distinct block memory");
    T_CHECK(fill_and_check(&a, 12), "every rank/layer/position region distinct and inside its block");
    T_CHECK(rt_kvtab_reserve(&a, 12, &e) == G5_OK && a.n == 3, "within its blocks: nothing taken");
    /* exhaustion: all or nothing */
    memset(&e, 0, sizeof e);
    g5_status st = rt_kvtab_reserve(&b, 5, &e);
    T_CHECK(st == G5_ERR_NOMEM && strstr(e.msg, "kv pool exhausted: 4 blocks"), "exhausted: %s", e.msg);
    T_CHECK(b.n == 0 && rt_kvpool_n_free(p) == 1, "refused reservation took nothing");
    T_CHECK(rt_kvtab_reserve(&b, 4, &e) == G5_OK && b.n == 1 && b.ids[0] == 3 && rt_kvpool_n_free(p) == 0, "last block");
    T_CHECK(rt_kvtab_reserve(&a, 13, &e) == G5_ERR_NOMEM && a.n == 3, "full pool");
    T_CHECK(fill_and_check(&a, 12), "a's data intact after the refusals");

    /* shrinking returns the tail; the freed block is the next one handed out (reuse) */
    float *freed = a.ptr[2];
    rt_kvtab_shrink_blocks(&a, rt_kvtab_blocks_for(&a, 5));
    T_CHECK(a.n == 2 && rt_kvpool_n_free(p) == 1, "truncate to 5 tokens keeps 2 blocks");
    T_CHECK(rt_kvtab_reserve(&b, 8, &e) == G5_OK && b.n == 2 && b.ids[1] == 2 && b.ptr[1] == freed, "freed block reused");
    T_CHECK(fill_and_check(&b, 8), "b's regions");
    rt_kvtab_shrink_blocks(&b, 5); /* more than it holds: no-op */
    T_CHECK(b.n == 2, "shrink beyond: no-op");
    rt_kvtab_release(&a);
    T_CHECK(rt_kvpool_n_free(p) == 2 && a.n == 0 && !a.ids && !a.pool, "release returns every block");
    rt_kvtab_release(&a); /* twice: a no-op */
    rt_kvtab_release(&b);
    T_CHECK(rt_kvpool_n_free(p) == 4, "all back (%u)", rt_kvpool_n_free(p));
    /* many cycles: no drift, no leak (ASan) */
    int ok = 1;
    for (int i = 0; i < 200 && ok; i++) {
        rt_kvtab t = {.pool = p};
        ok = rt_kvtab_reserve(&t, (uint64_t)(i % 17), &e) == G5_OK && t.n == (uint32_t)((i % 17 + BT - 1) / BT);
        rt_kvtab_shrink_blocks(&t, t.n / 2);
        rt_kvtab_release(&t);
        ok = ok && rt_kvpool_n_free(p) == 4;
    }
    T_CHECK(ok, "alloc/free cycles");
    rt_kvpool_free(p);
    rt_kvpool_free(NULL);

    /* a growable pool (n_blocks 0) doubles its id space */
    T_CHECK(rt_kvpool_create_layout(&lay, 0, BT, &p, &e) == G5_OK, "growable");
    if (p) {
        rt_kvtab t = {.pool = p, .own = 1};
        T_CHECK(rt_kvtab_reserve(&t, 100, &e) == G5_OK && t.n == 25, "100 tokens: 25 blocks");
        T_CHECK(rt_kvpool_n_blocks(p) >= 25 && rt_kvpool_n_free(p) == rt_kvpool_n_blocks(p) - 25, "grew");
        T_CHECK(fill_and_check(&t, 100), "grown pool regions");
        rt_kvtab_shrink_blocks(&t, 10);
        T_CHECK(rt_kvtab_reserve(&t, 300, &e) == G5_OK && t.n == 75, "grows again after reuse");
        int distinct = 1;
        for (uint32_t i = 0; i < t.n; i++)
            for (uint32_t j = 0; j < i; j++) distinct &= t.ids[i] != t.ids[j] && t.ptr[i] != t.ptr[j];
        T_CHECK(distinct, "no id handed out twice");
        rt_kvtab_release(&t); /* owns the pool: frees it */
    }
}

/* Threads drawing on one pool: every block they hold is theirs alone. */
typedef struct thr_arg {
    rt_kvpool *p;
    uint32_t id;
    int ok;
} thr_arg;

static void *thr_main(void *va) {
    thr_arg *a = va;
    a->ok = 1;
    for (int it = 0; it < 300; it++) {
        rt_kvtab t = {.pool = a->p};
        if (rt_kvtab_reserve(&t, (uint64_t)(1 + (it + a->id) % 3) * BT, NULL) != G5_OK) {
            rt_kvtab_release(&t); /* pool busy: the table's arrays may have grown */
            continue;
        }
        for (uint32_t i = 0; i < t.n; i++)
            for (uint32_t j = 0; j < (uint32_t)(t.pool->block_floats); j++) t.ptr[i][j] = (float)a->id;
        for (uint32_t i = 0; i < t.n; i++)
            for (uint32_t j = 0; j < (uint32_t)(t.pool->block_floats); j++) a->ok &= t.ptr[i][j] == (float)a->id;
        rt_kvtab_release(&t);
    }
    return NULL;
}

static void test_threads(void) {
    rt_kvlayout lay = layout();
    rt_kvpool *p = NULL;
    g5_error e = {0};
    T_CHECK(rt_kvpool_create_layout(&lay, 8, BT, &p, &e) == G5_OK, "pool");
    if (!p) return;
    pthread_t th[4];
    thr_arg args[4];
    for (uint32_t i = 0; i < 4; i++) {
        args[i] = (thr_arg){p, i + 1, 0};
        pthread_create(&th[i], NULL, thr_main, &args[i]);
    }
    int ok = 1;
    for (uint32_t i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        ok &= args[i].ok;
    }
    T_CHECK(ok, "4 threads: no block shared");
    T_CHECK(rt_kvpool_n_free(p) == 8, "every block back");
    rt_kvpool_free(p);
}

/* Paged states on the oracle model: blocks follow the positions. */
static void test_states(void) {
    struct stat sb;
    if (stat(T_ORACLE_GGUF, &sb) != 0) {
        T_CHECK(0, "oracle model present at %s", T_ORACLE_GGUF);
        return;
    }
    rt_wset *ws = NULL;
    rt_model *m = NULL;
    g5_error e = {0};
    T_CHECK(rt_wset_open(T_ORACLE_GGUF, &ws, &e) == G5_OK, "open: %s", e.msg);
    rt_model_opts opts = {.n_threads = 2};
    if (ws) T_CHECK(rt_model_create(ws, &opts, &m, &e) == G5_OK, "model: %s", e.msg);
    if (!m) {
        rt_wset_free(ws);
        return;
    }
    const glm5_hparams *hp = rt_model_hparams(m);
    rt_kvpool *p = NULL;
    T_CHECK(rt_kvpool_create(m, 0, 16, &p, &e) == G5_ERR_INVALID_ARG, "0 blocks refused");
    T_CHECK(rt_kvpool_create(m, 8, 16, &p, &e) == G5_OK, "pool: %s", e.msg);
    if (!p) goto out;
    /* a block: every main layer's latent and (where the layer has an indexer) keys */
    uint64_t per_tok = 0;
    for (uint32_t il = 0; il < hp->n_layer_main; il++)
        per_tok += hp->kv_lora + hp->qk_rope + (hp->idx_full[il] ? hp->idx_head_dim : 0);
    T_CHECK(rt_kvpool_block_bytes(p) == per_tok * 16 * sizeof(float), "block bytes");
    rt_state *s = NULL, *s2 = NULL;
    T_CHECK(rt_state_create_paged(m, NULL, &s, &e) == G5_ERR_INVALID_ARG && !s, "no pool refused");
    T_CHECK(rt_state_create_paged(m, p, &s, &e) == G5_OK && rt_state_create_paged(m, p, &s2, &e) == G5_OK, "states");
    int32_t toks[40];
    for (int i = 0; i < 40; i++) toks[i] = (int32_t)(i * 37 % 1000);
    T_CHECK(rt_model_forward(m, s, toks, 40, NULL, &e) == G5_OK, "forward: %s", e.msg);
    T_CHECK(rt_state_n_blocks(s) == 3 && rt_kvpool_n_free(p) == 5, "40 positions: 3 blocks");
    T_CHECK(rt_model_forward(m, s, toks, 8, NULL, &e) == G5_OK && rt_state_n_blocks(s) == 3, "48: still 3");
    T_CHECK(rt_model_forward(m, s, toks, 1, NULL, &e) == G5_OK && rt_state_n_blocks(s) == 4, "49: 4");
    T_CHECK(rt_state_reserve(s2, 64, &e) == G5_OK && rt_state_n_blocks(s2) == 4 && rt_kvpool_n_free(p) == 0,
            "reserve 64 positions up front");
    T_CHECK(rt_state_reserve(s2, 65, &e) == G5_ERR_NOMEM && rt_state_n_blocks(s2) == 4, "reserve past the pool");
    T_CHECK(rt_state_truncate(s, 17, 0, &e) == G5_OK && rt_state_n_blocks(s) == 2 && rt_kvpool_n_free(p) == 2,
            "truncate to 17: 2 blocks");
    rt_state_reset(s);
    T_CHECK(rt_state_n_blocks(s) == 0 && rt_kvpool_n_free(p) == 4 && rt_state_n_past(s) == 0, "reset");
    rt_state_free(s2);
    T_CHECK(rt_kvpool_n_free(p) == 8, "free returns blocks");
    /* an unpaged state draws on a private pool: the shared one is untouched */
    rt_state *u = NULL;
    T_CHECK(rt_state_create(m, &u, &e) == G5_OK && rt_model_forward(m, u, toks, 40, NULL, &e) == G5_OK &&
                rt_kvpool_n_free(p) == 8 && rt_state_n_blocks(u) >= 1,
            "unpaged state");
    rt_state_free(u);
    rt_state_free(s);
    rt_state_free(NULL);
    rt_kvpool_free(p);
out:
    rt_model_free(m);
    rt_wset_free(ws);
}

/* Prefix caching in the pool: registered blocks shared by reference, cached when released,
 * counted as free, evicted oldest first, a shared block copied before a truncated table writes
 * into it. */
static void test_prefix_pool(void) {
    rt_kvlayout lay = layout();
    rt_kvpool *p = NULL;
    g5_error e = {0};
    T_CHECK(rt_kvpool_create_layout(&lay, 0, BT, &p, &e) == G5_OK && rt_kvpool_enable_prefix(p, &e) == G5_ERR_INVALID_ARG,
            "growable pool: no prefix cache");
    rt_kvpool_free(p);
    T_CHECK(rt_kvpool_create_layout(&lay, 6, BT, &p, &e) == G5_OK && rt_kvpool_enable_prefix(p, &e) == G5_OK, "pool");
    if (!p) return;
    int32_t toks[24];
    for (int i = 0; i < 24; i++) toks[i] = 100 + i;
    uint64_t h[6], h2[6];
    rt_kv_prefix_hashes(toks, 6, BT, h);
    toks[5] = 7; /* differs in block 1: blocks 1.. get other names */
    rt_kv_prefix_hashes(toks, 6, BT, h2);
    T_CHECK(h[0] == h2[0] && h[1] != h2[1] && h[2] != h2[2], "hashes chain the prefix");
    rt_kvtab a = {.pool = p}, b = {.pool = p}, c = {.pool = p};
    uint32_t k = 9;
    T_CHECK(rt_kvtab_attach(&a, h, 3, &k, &e) == G5_OK && k == 0, "nothing cached yet");
    T_CHECK(rt_kvtab_reserve(&a, 3 * BT, &e) == G5_OK && fill_and_check(&a, 3 * BT), "a: 3 blocks");
    rt_kvtab_publish(&a, h, 3);
    T_CHECK(rt_kvtab_attach(&b, h, 2, &k, &e) == G5_OK && k == 2 && b.ids[0] == a.ids[0] && b.ids[1] == a.ids[1] &&
                rt_kvpool_n_free(p) == 3,
            "b shares a's first 2 blocks (%u)", k);
    rt_kvtab_release(&a);
    T_CHECK(rt_kvpool_n_cached(p) == 1 && rt_kvpool_n_free(p) == 4, "a gone: its third block cached, counted free");
    T_CHECK(rt_kvtab_attach(&c, h2, 3, &k, &e) == G5_OK && k == 1 && c.ids[0] == b.ids[0], "c: only block 0 matches");
    rt_kvtab_release(&c);
    /* b writes past its shared blocks into new ones; unshare copies a shared block */
    float before = rt_kvtab_lat(&b, 1, 8, 5)[2];
    uint32_t old = b.ids[1];
    T_CHECK(rt_kvtab_unshare(&b, 1, &e) == G5_OK && b.ids[1] != old && rt_kvtab_lat(&b, 1, 8, 5)[2] == before,
            "unshare: a copy with the same contents");
    rt_kvtab_release(&b);
    T_CHECK(rt_kvpool_n_cached(p) == 3 && rt_kvpool_n_free(p) == 6, "all back: 3 cached");
    /* a table that needs the whole pool evicts the cached blocks (release empties a table) */
    a.pool = c.pool = p;
    T_CHECK(rt_kvtab_reserve(&c, 6 * BT, &e) == G5_OK && rt_kvpool_n_cached(p) == 0 && rt_kvpool_n_evicted(p) == 3,
            "evicted for a full table");
    rt_kvtab_release(&c);
    T_CHECK(rt_kvtab_attach(&a, h, 3, &k, &e) == G5_OK && k == 0, "evicted blocks are not found");
    rt_kvtab_release(&a);
    rt_kvpool_free(p);
}

/* On the oracle model: a state that starts from another's cached prefix gives bit-identical
 * logits to one that runs the whole prompt; truncating into a shared block leaves the other
 * state's cache unchanged. */
static void test_prefix_states(void) {
    rt_wset *ws = NULL;
    rt_model *m = NULL;
    g5_error e = {0};
    if (rt_wset_open(T_ORACLE_GGUF, &ws, &e) != G5_OK) return;
    rt_model_opts opts = {.n_threads = 2};
    if (rt_model_create(ws, &opts, &m, &e) != G5_OK) {
        rt_wset_free(ws);
        return;
    }
    const uint32_t V = rt_model_hparams(m)->n_vocab;
    rt_kvpool *p = NULL;
    T_CHECK(rt_kvpool_create(m, 16, 16, &p, &e) == G5_OK && rt_kvpool_enable_prefix(p, &e) == G5_OK, "pool");
    int32_t toks[60];
    for (int i = 0; i < 60; i++) toks[i] = (int32_t)((i * 53 + 11) % 2000);
    float *l_ref = malloc(V * sizeof *l_ref), *l_got = malloc(V * sizeof *l_got), *l_a = malloc(V * sizeof *l_a);
    rt_state *a = NULL, *b = NULL, *r = NULL;
    rt_state_create_paged(m, p, &a, &e);
    rt_state_create_paged(m, p, &b, &e);
    rt_state_create(m, &r, &e);
    rt_outputs oa = {.logits = l_a}, og = {.logits = l_got}, orf = {.logits = l_ref};
    T_CHECK(rt_model_forward(m, a, toks, 40, &oa, &e) == G5_OK && rt_state_publish_prefix(a, toks, &e) == G5_OK,
            "a: 40 tokens, published");
    /* b: the same first 40 tokens then 20 others: 2 blocks (32 positions) reused */
    int32_t tb[60];
    memcpy(tb, toks, sizeof tb);
    for (int i = 40; i < 60; i++) tb[i] = (int32_t)(i * 7 % 2000);
    uint32_t reused = 0;
    T_CHECK(rt_state_attach_prefix(b, tb, 60, &reused, &e) == G5_OK && reused == 32 && rt_state_n_past(b) == 32,
            "b reuses 32 positions (%u)", reused);
    T_CHECK(rt_model_forward(m, b, tb + 32, 28, &og, &e) == G5_OK && rt_model_forward(m, r, tb, 60, &orf, &e) == G5_OK,
            "forwards: %s", e.msg);
    T_CHECK(!memcmp(l_got, l_ref, V * sizeof *l_got), "logits with the reused prefix are bit-identical");
    /* b truncates into a shared block and writes: a's cache must not change */
    T_CHECK(rt_state_truncate(b, 20, 0, &e) == G5_OK && rt_model_forward(m, b, tb + 45, 3, NULL, &e) == G5_OK, "b rewrites");
    T_CHECK(rt_model_forward(m, a, toks + 40, 1, &oa, &e) == G5_OK, "a goes on");
    rt_state_reset(r);
    T_CHECK(rt_model_forward(m, r, toks, 41, &orf, &e) == G5_OK && !memcmp(l_a, l_ref, V * sizeof *l_a),
            "a's cache untouched by b's writes");
    /* the whole prompt cached: at least one token is left to run */
    rt_state_free(b);
    b = NULL;
    rt_state_create_paged(m, p, &b, &e);
    T_CHECK(rt_state_attach_prefix(b, toks, 32, &reused, &e) == G5_OK && reused == 16, "32-token prompt: 16 reused (%u)", reused);
    rt_state_free(a);
    rt_state_free(b);
    rt_state_free(r);
    free(l_ref);
    free(l_got);
    free(l_a);
    rt_kvpool_free(p);
    rt_model_free(m);
    rt_wset_free(ws);
}


/* rt_kvpool_keep_rows: one row of W floats per position in a region of its own (the other regions
 * keep their contents), copied with the block by unshare; refused after blocks were handed out. */
static void test_rows(void) {
    enum { W = 6 };
    rt_kvlayout lay = layout();
    rt_kvpool *p = NULL;
    g5_error e = {0};
    T_CHECK(rt_kvpool_create_layout(&lay, 4, BT, &p, &e) == G5_OK && rt_kvpool_enable_prefix(p, &e) == G5_OK, "pool");
    if (!p) return;
    const size_t plain = p->block_floats;
    T_CHECK(rt_kvpool_keep_rows(p, W, &e) == G5_OK && p->block_floats == plain + BT * W && rt_kvpool_keep_rows(p, W, &e) == G5_OK,
            "rows: block of %zu floats (was %zu)", p->block_floats, plain);
    rt_kvtab a = {.pool = p}, b = {.pool = p};
    int ok = rt_kvtab_reserve(&a, 2 * BT, &e) == G5_OK;
    for (uint32_t pos = 0; ok && pos < 2 * BT; pos++)
        for (uint32_t j = 0; j < W; j++) rt_kvtab_row(&a, pos)[j] = -(float)(pos * 16 + j) - 1;
    ok = ok && fill_and_check(&a, 2 * BT); /* the other regions' writes leave the rows alone */
    for (uint32_t pos = 0; ok && pos < 2 * BT; pos++) {
        const float *r = rt_kvtab_row(&a, pos), *blk = a.ptr[pos / BT];
        ok = r >= blk && r + W <= blk + p->block_floats;
        for (uint32_t j = 0; ok && j < W; j++) ok = r[j] == -(float)(pos * 16 + j) - 1;
    }
    T_CHECK(ok, "rows in a region of their own");
    uint64_t h[2] = {1, 2};
    uint32_t k = 0;
    rt_kvtab_publish(&a, h, 2);
    T_CHECK(rt_kvtab_attach(&b, h, 2, &k, &e) == G5_OK && k == 2 && rt_kvtab_unshare(&b, 1, &e) == G5_OK &&
                b.ids[1] != a.ids[1] && rt_kvtab_row(&b, BT + 3)[W - 1] == -(float)((BT + 3) * 16 + W - 1) - 1,
            "unshare copies the rows");
    T_CHECK(rt_kvpool_keep_rows(p, W + 1, &e) == G5_ERR_INVALID_ARG, "rows after blocks were handed out: %s", e.msg);
    rt_kvtab_release(&a);
    rt_kvtab_release(&b);
    rt_kvpool_free(p);
}

int main(void) {
    test_rows();
    test_prefix_pool();
    test_prefix_states();
    test_pool();
    test_threads();
    test_states();
    return t_report("test_kvcache");
}
