/* The draw pool of glm5-serve's engine thread (serve_int.h srv_pool): threads that run a decode
 * step's per-sequence token draws beside the engine thread. Each item is one sequence's draw,
 * which touches only that sequence's sampler and text stream, so items run in any order on any
 * thread; the engine thread publishes them in order afterwards. */
#include <stdlib.h>

#include "runtime/serve/serve_int.h"

struct srv_pool {
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    pthread_t *th;
    uint32_t n_th, n_started;
    uint64_t gen;              /* one per srv_pool_run */
    int stop;
    void (*fn)(void *ctx, uint32_t i);
    void *ctx;
    uint32_t n_items, next, n_done;
};

/* Runs the current job's items until none is left; under p->mu, which it drops around fn. */
static void take_items_locked(srv_pool *p) {
    while (p->next < p->n_items) {
        const uint32_t i = p->next++;
        void (*fn)(void *, uint32_t) = p->fn;
        void *ctx = p->ctx;
        pthread_mutex_unlock(&p->mu);
        fn(ctx, i);
        pthread_mutex_lock(&p->mu);
        if (++p->n_done == p->n_items) pthread_cond_signal(&p->done);
    }
}

static void *worker_main(void *arg) {
    srv_pool *p = arg;
    pthread_mutex_lock(&p->mu);
    uint64_t seen = p->gen;
    for (;;) {
        while (!p->stop && p->gen == seen) pthread_cond_wait(&p->go, &p->mu);
        if (p->stop) break;
        seen = p->gen;
        take_items_locked(p);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

g5_status srv_pool_create(uint32_t n_workers, srv_pool **out, g5_error *err) {
    *out = NULL;
    srv_pool *p = calloc(1, sizeof *p);
    if (!p) return g5_fail(err, G5_ERR_NOMEM, "draw pool");
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    p->th = n_workers ? calloc(n_workers, sizeof *p->th) : NULL;
    if (n_workers && !p->th) {
        srv_pool_free(p);
        return g5_fail(err, G5_ERR_NOMEM, "draw pool of %u threads", n_workers);
    }
    p->n_th = n_workers;
    for (; p->n_started < n_workers; p->n_started++)
        if (pthread_create(&p->th[p->n_started], NULL, worker_main, p) != 0) {
            srv_pool_free(p);
            return g5_fail(err, G5_ERR_NOMEM, "draw pool: thread %u of %u not started", p->n_started + 1, n_workers);
        }
    *out = p;
    return G5_OK;
}

void srv_pool_free(srv_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (uint32_t i = 0; i < p->n_started; i++) pthread_join(p->th[i], NULL);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    free(p->th);
    free(p);
}

void srv_pool_run(srv_pool *p, uint32_t n, void (*fn)(void *ctx, uint32_t i), void *ctx) {
    if (!p || !p->n_th || n < 2) {
        for (uint32_t i = 0; i < n; i++) fn(ctx, i);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n_items = n;
    p->next = p->n_done = 0;
    p->gen++;
    pthread_cond_broadcast(&p->go);
    take_items_locked(p); /* the caller works too */
    while (p->n_done < p->n_items) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
