#include "runtime/cpu/cpu_ops.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "format/quant.h"

/* ---- thread pool ---- */

struct rt_pool {
    uint32_t n;
    pthread_t *threads;        /* [n - 1] helpers */
    pthread_mutex_t mu;
    pthread_cond_t cv_start, cv_done;
    uint64_t generation;
    int stop;
    uint32_t n_busy;           /* helpers still inside the current generation */
    rt_task_fn fn;
    void *ctx;
    uint64_t n_tasks;
    atomic_uint_fast64_t next;
    float **scratch;           /* [n] */
    size_t scratch_bytes;
};

typedef struct worker_arg {
    rt_pool *p;
    uint32_t id;
} worker_arg;

static void run_tasks(rt_pool *p, uint32_t worker) {
    for (;;) {
        uint64_t t = atomic_fetch_add(&p->next, 1);
        if (t >= p->n_tasks) break;
        p->fn(p->ctx, t, worker);
    }
}

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    rt_pool *p = wa->p;
    uint32_t id = wa->id;
    free(wa);
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->generation == seen) pthread_cond_wait(&p->cv_start, &p->mu);
        if (p->stop) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        run_tasks(p, id);
        pthread_mutex_lock(&p->mu);
        if (--p->n_busy == 0) pthread_cond_signal(&p->cv_done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

g5_status rt_pool_create(uint32_t n_threads, rt_pool **out, g5_error *err) {
    *out = NULL;
    if (n_threads == 0 || n_threads > 1024)
        return g5_fail(err, G5_ERR_INVALID_ARG, "thread count %u (must be 1..1024)", n_threads);
    rt_pool *p = calloc(1, sizeof *p);
    if (!p) return g5_fail(err, G5_ERR_NOMEM, "thread pool");
    p->n = n_threads;
    p->scratch = calloc(n_threads, sizeof *p->scratch);
    p->threads = calloc(n_threads, sizeof *p->threads);
    if (!p->scratch || !p->threads) {
        free(p->scratch);
        free(p->threads);
        free(p);
        return g5_fail(err, G5_ERR_NOMEM, "thread pool");
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_start, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    atomic_init(&p->next, 0);
    for (uint32_t i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        int rc = wa ? 0 : -1;
        if (wa) {
            wa->p = p;
            wa->id = i;
            rc = pthread_create(&p->threads[i - 1], NULL, worker_main, wa);
            if (rc) free(wa);
        }
        if (rc) {
            p->n = i; /* helpers 1..i-1 exist */
            rt_pool_free(p);
            return g5_fail(err, G5_ERR_INTERNAL, "cannot start worker thread %u of %u", i,
                           n_threads);
        }
    }
    *out = p;
    return G5_OK;
}

void rt_pool_free(rt_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    for (uint32_t i = 1; i < p->n; i++) pthread_join(p->threads[i - 1], NULL);
    for (uint32_t i = 0; i < p->n; i++) free(p->scratch[i]);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_start);
    pthread_cond_destroy(&p->cv_done);
    free(p->scratch);
    free(p->threads);
    free(p);
}

uint32_t rt_pool_size(const rt_pool *p) { return p->n; }

void rt_pool_run(rt_pool *p, uint64_t n_tasks, rt_task_fn fn, void *ctx) {
    if (n_tasks == 0) return;
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store(&p->next, 0);
    if (p->n == 1 || n_tasks == 1) {
        run_tasks(p, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->n_busy = p->n - 1;
    p->generation++;
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    run_tasks(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->n_busy) pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

g5_status rt_pool_reserve(rt_pool *p, size_t bytes, g5_error *err) {
    if (bytes <= p->scratch_bytes) return G5_OK;
    bytes = (bytes + 63) & ~(size_t)63;
    for (uint32_t i = 0; i < p->n; i++) {
        void *m = NULL;
        if (posix_memalign(&m, 64, bytes)) {
            return g5_fail(err, G5_ERR_NOMEM, "worker scratch of %zu bytes", bytes);
        }
        free(p->scratch[i]);
        p->scratch[i] = m;
    }
    p->scratch_bytes = bytes;
    return G5_OK;
}

float *rt_pool_scratch(rt_pool *p, uint32_t worker) { return p->scratch[worker]; }
size_t rt_pool_scratch_bytes(const rt_pool *p) { return p->scratch_bytes; }

/* ---- matrices ---- */

g5_status rt_mat_view(uint32_t type, const void *data, uint64_t ncols, uint64_t row0,
                      uint64_t nrows, rt_mat *out, g5_error *err) {
    uint64_t rb, off;
    g5_status st = quant_row_bytes(type, ncols, &rb);
    if (st) return g5_fail(err, st, "%s rows of %llu elements", quant_type_name(type),
                           (unsigned long long)ncols);
    if (g5_mul_u64(rb, row0, &off))
        return g5_fail(err, G5_ERR_OVERFLOW, "row offset %llu", (unsigned long long)row0);
    out->type = type;
    out->ncols = ncols;
    out->nrows = nrows;
    out->row_bytes = rb;
    out->data = (const uint8_t *)data + off;
    return G5_OK;
}

void rt_mat_row(const rt_mat *W, uint64_t row, float *dst) {
    const uint8_t *src = W->data + row * W->row_bytes;
    if (W->type == QT_F32)
        memcpy(dst, src, W->ncols * sizeof(float));
    else
        (void)quant_dequantize(W->type, src, W->ncols, dst); /* type checked at model load */
}

size_t rt_matmul_scratch(uint64_t ncols) { return (size_t)RT_MATMUL_ROWS * ncols * sizeof(float); }

typedef struct matmul_ctx {
    rt_pool *p;
    const rt_mat *W;
    const float *x;
    size_t ldx;
    uint32_t n;
    float *y;
    size_t ldy;
} matmul_ctx;

static void matmul_task(void *vctx, uint64_t task, uint32_t worker) {
    const matmul_ctx *c = vctx;
    const rt_mat *W = c->W;
    uint64_t r0 = task * RT_MATMUL_ROWS;
    uint64_t r1 = r0 + RT_MATMUL_ROWS < W->nrows ? r0 + RT_MATMUL_ROWS : W->nrows;
    float *buf = rt_pool_scratch(c->p, worker);
    const float *rows[RT_MATMUL_ROWS];
    for (uint64_t r = r0; r < r1; r++) {
        const uint8_t *src = W->data + r * W->row_bytes;
        if (W->type == QT_F32 && ((uintptr_t)src & 3) == 0) {
            rows[r - r0] = (const float *)(const void *)src;
        } else {
            float *d = buf + (r - r0) * W->ncols;
            rt_mat_row(W, r, d);
            rows[r - r0] = d;
        }
    }
    for (uint32_t t = 0; t < c->n; t++) {
        const float *xt = c->x + (size_t)t * c->ldx;
        float *yt = c->y + (size_t)t * c->ldy;
        for (uint64_t r = r0; r < r1; r++) yt[r] = rt_dot(rows[r - r0], xt, W->ncols);
    }
}

void rt_matmul(rt_pool *p, const rt_mat *W, const float *x, size_t ldx, uint32_t n, float *y,
               size_t ldy) {
    if (n == 0 || W->nrows == 0) return;
    matmul_ctx c = {p, W, x, ldx, n, y, ldy};
    rt_pool_run(p, (W->nrows + RT_MATMUL_ROWS - 1) / RT_MATMUL_ROWS, matmul_task, &c);
}

/* ---- vector kernels ---- */

typedef float v4f __attribute__((vector_size(16)));

static inline v4f load4(const float *p) {
    v4f v;
    memcpy(&v, p, sizeof v);
    return v;
}

float rt_dot(const float *a, const float *b, uint64_t n) {
    v4f s0 = {0, 0, 0, 0}, s1 = s0, s2 = s0, s3 = s0;
    uint64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 += load4(a + i) * load4(b + i);
        s1 += load4(a + i + 4) * load4(b + i + 4);
        s2 += load4(a + i + 8) * load4(b + i + 8);
        s3 += load4(a + i + 12) * load4(b + i + 12);
    }
    for (; i + 4 <= n; i += 4) s0 += load4(a + i) * load4(b + i);
    v4f s = (s0 + s1) + (s2 + s3);
    float r = (s[0] + s[1]) + (s[2] + s[3]);
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

static inline void store4(float *p, v4f v) { memcpy(p, &v, sizeof v); }

void rt_axpy(float a, const float *x, float *y, uint64_t n) {
    const v4f va = {a, a, a, a};
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v4f y0 = load4(y + i) + va * load4(x + i);
        v4f y1 = load4(y + i + 4) + va * load4(x + i + 4);
        store4(y + i, y0);
        store4(y + i + 4, y1);
    }
    for (; i < n; i++) y[i] += a * x[i];
}

void rt_rmsnorm(const float *x, const float *w, uint64_t n, float eps, float *out) {
    double ss = 0;
    for (uint64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float scale = (float)(1.0 / sqrt(ss / (double)n + eps));
    for (uint64_t i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

void rt_layernorm(const float *x, const float *w, const float *b, uint64_t n, float eps,
                  float *out) {
    double mean = 0, var = 0;
    for (uint64_t i = 0; i < n; i++) mean += x[i];
    mean /= (double)n;
    for (uint64_t i = 0; i < n; i++) var += ((double)x[i] - mean) * ((double)x[i] - mean);
    var /= (double)n;
    double inv = 1.0 / sqrt(var + eps);
    for (uint64_t i = 0; i < n; i++) out[i] = (float)(((double)x[i] - mean) * inv) * w[i] + b[i];
}

/* The angles are formed in float32 the way the reference (transformers) forms them:
 * inv_freq = 1 / theta^(2i/d) and angle = pos * inv_freq, each rounded to float. */
void rt_rope_table(uint32_t pos, uint32_t n_rot, float theta, float *cs) {
    for (uint32_t i = 0; i < n_rot / 2; i++) {
        float inv = 1.0f / powf(theta, (float)(2 * i) / (float)n_rot);
        float ang = (float)pos * inv;
        cs[2 * i] = (float)cos((double)ang);
        cs[2 * i + 1] = (float)sin((double)ang);
    }
}

void rt_rope_apply(float *x, uint32_t n_rot, const float *cs) {
    for (uint32_t i = 0; i < n_rot / 2; i++) {
        float c = cs[2 * i], s = cs[2 * i + 1];
        float a = x[2 * i], b = x[2 * i + 1];
        x[2 * i] = a * c - b * s;
        x[2 * i + 1] = a * s + b * c;
    }
}

float rt_silu(float x) { return x / (1.0f + expf(-x)); }
float rt_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
