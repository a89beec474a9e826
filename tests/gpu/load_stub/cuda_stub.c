/* A CPU stand-in for the CUDA runtime calls runtime/gpu/gpu_load.c and tests/gpu/bench_load.c make,
 * to test the loader's threading (owners, helpers, slot reuse, failures) on a machine without a
 * GPU: every stream is a worker thread running its copies in order after a random delay (so a
 * slot reused before its copy ran shows up as wrong bytes), an event marks a stream position,
 * "device" and pinned memory are malloc'd. Linked only into check_load (run.sh). */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int stub_delay_us = 200;      /* each copy waits up to this long before it runs */
int stub_register_fails;      /* cudaHostRegister fails (the loader must fall back) */

typedef struct op {
    struct op *next;
    void *dst;
    const void *src;
    size_t n;
} op;

struct CUstream_st {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    op *head, *tail;
    unsigned long long enq, done; /* copies queued, copies run */
    int stop;
};

struct CUevent_st {
    struct CUstream_st *s;
    unsigned long long target;    /* complete once s->done reaches it */
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned g_rnd = 12345;
static struct CUstream_st *g_streams[1024];

static unsigned rnd(void) {
    pthread_mutex_lock(&g_mu);
    g_rnd = g_rnd * 1103515245u + 12345u;
    const unsigned r = g_rnd >> 8;
    pthread_mutex_unlock(&g_mu);
    return r;
}

static void *worker(void *arg) {
    struct CUstream_st *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stop) pthread_cond_wait(&s->cv, &s->mu);
        if (!s->head) break;
        op *o = s->head;
        pthread_mutex_unlock(&s->mu);
        if (stub_delay_us > 0) usleep(rnd() % (unsigned)stub_delay_us);
        memcpy(o->dst, o->src, o->n);
        pthread_mutex_lock(&s->mu);
        s->head = o->next;
        if (!s->head) s->tail = NULL;
        free(o);
        s->done++;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

const char *cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "stub error"; }
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaSetDevice(int d) { return d >= 0 ? cudaSuccess : cudaErrorInvalidDevice; }

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d) {
    (void)d;
    memset(p, 0, sizeof *p);
    strcpy(p->name, "CPU stub");
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t n) {
    *p = malloc(n ? n : 1);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void *p) {
    free(p);
    return cudaSuccess;
}
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags) {
    (void)flags;
    return cudaMalloc(p, n);
}
cudaError_t cudaFreeHost(void *p) { return cudaFree(p); }
cudaError_t cudaHostRegister(void *p, size_t n, unsigned flags) {
    (void)p, (void)n, (void)flags;
    return stub_register_fails ? cudaErrorInvalidValue : cudaSuccess;
}
cudaError_t cudaHostUnregister(void *p) {
    (void)p;
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k) {
    (void)k;
    memcpy(d, s, n);
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned flags) {
    (void)flags;
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (!s) return cudaErrorMemoryAllocation;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->th, NULL, worker, s)) {
        free(s);
        return cudaErrorMemoryAllocation;
    }
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < 1024; i++)
        if (!g_streams[i]) {
            g_streams[i] = s;
            break;
        }
    pthread_mutex_unlock(&g_mu);
    *out = s;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    pthread_mutex_lock(&s->mu);
    while (s->done < s->enq) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    cudaStreamSynchronize(s);
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < 1024; i++)
        if (g_streams[i] == s) g_streams[i] = NULL;
    pthread_mutex_unlock(&g_mu);
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->th, NULL);
    free(s);
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    pthread_mutex_lock(&g_mu);
    struct CUstream_st *all[1024];
    memcpy(all, g_streams, sizeof all);
    pthread_mutex_unlock(&g_mu);
    for (int i = 0; i < 1024; i++)
        if (all[i]) cudaStreamSynchronize(all[i]);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind k, cudaStream_t s) {
    (void)k;
    if (!s) return cudaMemcpy(dst, src, n, k); /* the legacy default stream: synchronous here */
    op *o = calloc(1, sizeof *o);
    if (!o) return cudaErrorMemoryAllocation;
    *o = (op){NULL, dst, src, n};
    pthread_mutex_lock(&s->mu);
    if (s->tail) s->tail->next = o;
    else s->head = o;
    s->tail = o;
    s->enq++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    (void)flags;
    *e = calloc(1, sizeof **e);
    return *e ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    free(e);
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    pthread_mutex_lock(&s->mu);
    e->s = s;
    e->target = s->enq;
    pthread_mutex_unlock(&s->mu);
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    struct CUstream_st *s = e->s;
    if (!s) return cudaSuccess;
    pthread_mutex_lock(&s->mu);
    while (s->done < e->target) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    return cudaSuccess;
}
