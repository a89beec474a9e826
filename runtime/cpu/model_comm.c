/* Collectives between the rank workers of one forward call (model_impl.h), within a process
 * (threads meeting at a barrier and reading each other's buffers) and, when the model's
 * communicator has several processes, across them.
 *
 * Across processes the first local rank (the thread that called the forward function, the only
 * one that talks to MPI) packs this process's part into f->xb, all-gathers the parts in process
 * order (= rank order: process p owns ranks rank0 .. rank0 + n_local - 1, contiguous), and the
 * local ranks read everyone's part from there. Two barriers suffice: the publishers wait while
 * the first local rank packs, and f->xb is rewritten only after the next collective's first
 * barrier, which every reader has reached. Each operation does the same arithmetic in the same
 * order as in one process (sums from rank 0 to T - 1), hence bit-identical results.
 *
 * An exchange that fails (MPI) marks the call failed; later collectives of the call then skip
 * their work on this process, which returns the error (mpirun/srun then end the job). */
#include <stdlib.h>
#include <string.h>

#include "runtime/cpu/model_impl.h"

void rt_barrier_init(rt_barrier *b, uint32_t parties) {
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    b->parties = parties;
    b->waiting = 0;
    b->gen = 0;
}

void rt_barrier_destroy(rt_barrier *b) {
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
}

void rt_barrier_wait(rt_barrier *b) {
    pthread_mutex_lock(&b->mu);
    uint64_t gen = b->gen;
    if (++b->waiting >= b->parties) {
        b->waiting = 0;
        b->gen++;
        pthread_cond_broadcast(&b->cv);
    } else {
        while (gen == b->gen) pthread_cond_wait(&b->cv, &b->mu);
    }
    pthread_mutex_unlock(&b->mu);
}

void rt_barrier_shrink(rt_barrier *b, uint32_t parties) {
    pthread_mutex_lock(&b->mu);
    b->parties = parties;
    if (b->waiting && b->waiting >= b->parties) {
        b->waiting = 0;
        b->gen++;
        pthread_cond_broadcast(&b->cv);
    }
    pthread_mutex_unlock(&b->mu);
}

/* ---- the exchange buffer ---- */

static int multi(const rt_model *m) { return rt_comm_size(m->comm) > 1; }
static uint32_t local_index(const rt_model *m, const rt_rank *rk) { return (uint32_t)(rk - m->ranks); }

/* Per process: lens, offs (size_t each) and a vocabulary range (two uint64). */
#define XTAIL_PER_PROC 32

/* The largest packed part of any collective for n rows, in bytes (SIZE_MAX on overflow). */
static size_t xmain_bytes(const rt_model *m, uint32_t n) {
    const glm5_hparams *hp = &m->hp;
    const size_t F = sizeof(float);
    size_t row = hp->q_lora;
    const size_t widths[] = {(size_t)hp->kv_lora + hp->qk_rope, hp->idx_head_dim, hp->idx_top_k,
                             hp->n_expert_used, 1};
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++)
        if (widths[i] > row) row = widths[i];
    size_t need[4];
    if (__builtin_mul_overflow((size_t)m->n_ranks * n, (size_t)hp->n_embd * F, &need[0]) || /* all-reduce */
        __builtin_mul_overflow((size_t)n, row * F, &need[1]) ||                             /* rows */
        __builtin_mul_overflow((size_t)n, (size_t)hp->n_embd * F, &need[2]) ||              /* columns */
        __builtin_mul_overflow((size_t)n, (size_t)hp->n_vocab * F, &need[3]))               /* vocabulary */
        return SIZE_MAX;
    size_t mx = 64;
    for (int i = 0; i < 4; i++)
        if (need[i] > mx) mx = need[i];
    return (mx + 63) & ~(size_t)63;
}

size_t rt_xchg_bytes(const rt_model *m, uint32_t n) {
    if (!multi(m)) return 0;
    size_t main = xmain_bytes(m, n), tail = (size_t)rt_comm_size(m->comm) * XTAIL_PER_PROC, all;
    return main == SIZE_MAX || __builtin_add_overflow(main, tail, &all) ? SIZE_MAX : all;
}

/* The tail of f->xb: [P] lens, [P] offs. */
static void xtail(rt_fwd *f, size_t **lens, size_t **offs, uint64_t **range) {
    const uint32_t P = rt_comm_size(f->m->comm);
    uint8_t *t = f->xb + xmain_bytes(f->m, f->n);
    *lens = (size_t *)(void *)t;
    *offs = *lens + P;
    if (range) *range = (uint64_t *)(void *)(*offs + P);
}

static int failed(rt_fwd *f) { return atomic_load(&f->failed); }

/* Records the first failed exchange. */
static void xcheck(rt_fwd *f, g5_status st) {
    if (!st) return;
    if (!f->xst) f->xst = st;
    atomic_store(&f->failed, 1);
}

void rt_agree_failed(rt_fwd *f, rt_rank *rk) {
    rt_model *m = f->m;
    if (!multi(m)) return;
    if (local_index(m, rk) == 0) {
        const uint32_t P = rt_comm_size(m->comm), me = rt_comm_rank(m->comm);
        int32_t *all = malloc((size_t)P * sizeof *all);
        int32_t mine = failed(f);
        g5_status st = all ? rt_comm_allgather(m->comm, &mine, sizeof mine, all, &f->xerr)
                           : g5_fail(&f->xerr, G5_ERR_NOMEM, "failure agreement of %u processes", P);
        for (uint32_t q = 0; !st && q < P; q++)
            if (all[q] && q != me && !mine) {
                st = g5_fail(&f->xerr, G5_ERR_INTERNAL, "process %u of %u could not run its ranks (see its error)", q, P);
                break;
            }
        xcheck(f, st);
        free(all);
    }
    rt_barrier_wait(&f->bar);
}

/* ---- the collectives ---- */

void rt_allreduce_add(rt_fwd *f, rt_rank *rk, rt_work *w, uint32_t n) {
    rt_model *m = f->m;
    const size_t cnt = (size_t)n * m->hp.n_embd;
    const uint32_t T = m->n_ranks, L = m->n_local, li = local_index(m, rk);
    if (T == 1) {
        for (size_t i = 0; i < cnt; i++) w->x[i] += w->part[i];
        return;
    }
    f->pub[li] = w->part;
    rt_barrier_wait(&f->bar);
    if (!multi(m)) {
        const float *const *part = (const float *const *)f->pub;
        for (size_t i = 0; i < cnt; i++) {
            float s = part[0][i];
            for (uint32_t r = 1; r < T; r++) s += part[r][i];
            w->x[i] += s;
        }
        rt_barrier_wait(&f->bar); /* nobody reuses its buffer before all have read it */
        return;
    }
    float *all = (float *)(void *)f->xb; /* [T][cnt] */
    if (li == 0 && !failed(f)) {
        for (uint32_t l = 0; l < L; l++) memcpy(all + (size_t)(m->rank0 + l) * cnt, f->pub[l], cnt * sizeof(float));
        xcheck(f, rt_comm_allgather(m->comm, all + (size_t)m->rank0 * cnt, (size_t)L * cnt * sizeof(float), all,
                                    &f->xerr));
    }
    rt_barrier_wait(&f->bar);
    if (failed(f)) return;
    for (size_t i = 0; i < cnt; i++) {
        float s = all[i];
        for (uint32_t r = 1; r < T; r++) s += all[(size_t)r * cnt + i];
        w->x[i] += s;
    }
}

void rt_allgather_rows(rt_fwd *f, uint32_t rank, void *base, size_t stride, size_t row_bytes) {
    rt_model *m = f->m;
    const uint32_t T = m->n_ranks, L = m->n_local, li = rank - m->rank0;
    if (T == 1) return;
    f->pub[li] = base;
    rt_barrier_wait(&f->bar);
    if (!multi(m)) {
        for (uint32_t r = 0; r < T; r++) {
            if (r == rank) continue;
            uint32_t a, b;
            rt_token_range(f->n, T, r, &a, &b);
            for (uint32_t t = a; t < b; t++)
                memcpy((uint8_t *)base + t * stride, (const uint8_t *)f->pub[r] + t * stride, row_bytes);
        }
        rt_barrier_wait(&f->bar);
        return;
    }
    uint8_t *g = f->xb; /* [n][row_bytes] */
    if (li == 0 && !failed(f)) {
        const uint32_t P = rt_comm_size(m->comm), me = rt_comm_rank(m->comm);
        for (uint32_t l = 0; l < L; l++) {
            uint32_t a, b;
            rt_token_range(f->n, T, m->rank0 + l, &a, &b);
            for (uint32_t t = a; t < b; t++)
                memcpy(g + (size_t)t * row_bytes, (const uint8_t *)f->pub[l] + t * stride, row_bytes);
        }
        size_t *lens, *offs;
        xtail(f, &lens, &offs, NULL);
        for (uint32_t q = 0; q < P; q++) {
            uint32_t a, b, a2, b2; /* process q's rows: its first rank's start .. its last's end */
            rt_token_range(f->n, T, q * L, &a, &b);
            rt_token_range(f->n, T, q * L + L - 1, &a2, &b2);
            offs[q] = (size_t)a * row_bytes;
            lens[q] = (size_t)(b2 - a) * row_bytes;
        }
        xcheck(f, rt_comm_allgatherv(m->comm, g + offs[me], lens, offs, g, &f->xerr));
    }
    rt_barrier_wait(&f->bar);
    if (failed(f)) return;
    uint32_t a, b;
    rt_token_range(f->n, T, rank, &a, &b);
    for (uint32_t t = 0; t < f->n; t++)
        if (t < a || t >= b) memcpy((uint8_t *)base + t * stride, g + (size_t)t * row_bytes, row_bytes);
}

void rt_allgather_cols(rt_fwd *f, rt_rank *rk, float *src, uint32_t n, uint32_t cols, float *dst) {
    rt_model *m = f->m;
    const size_t E = m->hp.n_embd;
    const uint32_t L = m->n_local, li = local_index(m, rk);
    f->pub[li] = src;
    rt_barrier_wait(&f->bar);
    if (!multi(m)) {
        for (uint32_t r = 0; r < m->n_ranks; r++)
            for (uint32_t t = 0; t < n; t++)
                memcpy(dst + t * E + (size_t)r * cols, (const float *)f->pub[r] + t * E + (size_t)r * cols,
                       cols * sizeof(float));
        rt_barrier_wait(&f->bar);
        return;
    }
    /* [P][n][L * cols]: process q's block holds columns [q * L * cols, (q + 1) * L * cols) */
    const size_t lc = (size_t)L * cols, blk = (size_t)n * lc;
    const uint32_t P = rt_comm_size(m->comm);
    float *g = (float *)(void *)f->xb;
    if (li == 0 && !failed(f)) {
        float *mine = g + (size_t)rt_comm_rank(m->comm) * blk;
        for (uint32_t l = 0; l < L; l++)
            for (uint32_t t = 0; t < n; t++)
                memcpy(mine + t * lc + (size_t)l * cols,
                       (const float *)f->pub[l] + t * E + (size_t)(m->rank0 + l) * cols, cols * sizeof(float));
        xcheck(f, rt_comm_allgather(m->comm, mine, blk * sizeof(float), g, &f->xerr));
    }
    rt_barrier_wait(&f->bar);
    if (failed(f)) return;
    for (uint32_t q = 0; q < P; q++)
        for (uint32_t t = 0; t < n; t++)
            memcpy(dst + t * E + q * lc, g + q * blk + t * lc, lc * sizeof(float));
}

void rt_gather_vocab(rt_fwd *f, rt_rank *rk, const rt_head *head, float *logits, uint32_t n_rows) {
    rt_model *m = f->m;
    if (!multi(m) || !logits) return;
    rt_barrier_wait(&f->bar); /* every local rank has written its columns */
    if (local_index(m, rk) != 0 || failed(f)) return;
    const uint32_t P = rt_comm_size(m->comm), me = rt_comm_rank(m->comm), V = m->hp.n_vocab;
    /* this process's columns: a split head's local ranks' slices (contiguous), or a whole head
     * on the process holding rank 0 */
    const uint64_t rows = head->mat.nrows;
    uint64_t mine[2] = {head->col0, rows == V ? (head->write ? V : 0) : rows * m->n_local};
    size_t *lens, *offs;
    uint64_t *range;
    xtail(f, &lens, &offs, &range);
    g5_status st = rt_comm_allgather(m->comm, mine, sizeof mine, range, &f->xerr);
    size_t total = 0;
    for (uint32_t q = 0; !st && q < P; q++) {
        const uint64_t c0 = range[2 * q], nc = range[2 * q + 1];
        if (c0 > V || nc > V - c0 || (total += nc) > V)
            st = g5_fail(&f->xerr, G5_ERR_SHARDING, "vocabulary gather: process %u holds columns %llu..+%llu of %u",
                         q, (unsigned long long)c0, (unsigned long long)nc, V);
        lens[q] = (size_t)nc * n_rows * sizeof(float);
        offs[q] = q ? offs[q - 1] + lens[q - 1] : 0;
    }
    if (st) {
        xcheck(f, st);
        return;
    }
    uint8_t *g = f->xb; /* per process q: [n_rows][nc_q] at offs[q] */
    const size_t nc = (size_t)mine[1];
    for (uint32_t i = 0; i < n_rows; i++)
        memcpy(g + offs[me] + i * nc * sizeof(float), logits + (size_t)i * V + mine[0], nc * sizeof(float));
    st = rt_comm_allgatherv(m->comm, g + offs[me], lens, offs, g, &f->xerr);
    if (st) {
        xcheck(f, st);
        return;
    }
    for (uint32_t q = 0; q < P; q++) {
        if (q == me) continue;
        const size_t c0 = (size_t)range[2 * q], ncq = (size_t)range[2 * q + 1];
        for (uint32_t i = 0; i < n_rows; i++)
            memcpy(logits + (size_t)i * V + c0, g + offs[q] + i * ncq * sizeof(float), ncq * sizeof(float));
    }
}
