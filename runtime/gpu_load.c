/* Blob -> GPU loader (gpu_load.h). Compiled to nothing unless G5_WITH_CUDA. */
#ifdef G5_WITH_CUDA

#include "gpu_load.h"

#include <cuda_runtime_api.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#define LD_ALIGN 4096u

void rt_gpu_load_opts_default(rt_gpu_load_opts *o) {
    memset(o, 0, sizeof *o);
    o->n_threads = 4;
    o->buf_bytes = 16u << 20;
    o->bufs_per_thread = 2;
    o->verify = 1;
    o->direct = 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct ld_shared {
    const blob *b;
    const blob_info *in;
    int device;
    uint8_t *dev;
    uint64_t buf_bytes;
    uint32_t nbuf;
    int verify;
    int fd_buf, fd_direct;       /* fd_direct -1 when O_DIRECT is unavailable */
    atomic_uint_fast64_t next_chunk;
    atomic_int failed;
    atomic_uint_fast64_t n_direct, n_buffered;
    pthread_mutex_t mu;
    g5_status st;
    g5_error err;
} ld_shared;

typedef struct ld_thread {
    ld_shared *s;
    cudaStream_t stream;
    void **buf;                  /* [nbuf] pinned */
    cudaEvent_t *ev;             /* [nbuf]: the buffer's last copy */
    int *ev_live;
} ld_thread;

/* Records the first failure (later ones are consequences) and stops every reader. */
static void ld_fail(ld_shared *s, const g5_error *e, g5_status st) {
    pthread_mutex_lock(&s->mu);
    if (!s->st) {
        s->st = st;
        s->err = *e;
        s->err.status = st;
    }
    pthread_mutex_unlock(&s->mu);
    atomic_store(&s->failed, 1);
}

/* Reads len bytes at off into buf (capacity cap, a multiple of LD_ALIGN). */
static g5_status read_at(ld_shared *s, uint8_t *buf, uint64_t off, uint64_t len, uint64_t cap,
                         g5_error *err) {
    if (s->fd_direct >= 0 && off % LD_ALIGN == 0) {
        const uint64_t rlen = (len + LD_ALIGN - 1) / LD_ALIGN * LD_ALIGN;
        if (rlen <= cap) {
            uint64_t got = 0;
            int ok = 1;
            while (got < len) {
                ssize_t r = pread(s->fd_direct, buf + got, rlen - got, (off_t)(off + got));
                if (r < 0 && errno == EINTR) continue;
                if (r <= 0) {
                    ok = 0; /* EINVAL (filesystem without O_DIRECT) or short: retry buffered */
                    break;
                }
                got += (uint64_t)r;
                if (got % LD_ALIGN) break; /* end of file */
            }
            if (ok && got >= len) {
                atomic_fetch_add(&s->n_direct, 1);
                return G5_OK;
            }
        }
    }
    uint64_t got = 0;
    while (got < len) {
        ssize_t r = pread(s->fd_buf, buf + got, len - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0)
            return g5_fail_at(err, G5_ERR_IO, off + got, "%s: read: %s", blob_get_path(s->b), strerror(errno));
        if (r == 0)
            return g5_fail_at(err, G5_ERR_TRUNCATED, off + got, "%s: file ends inside the data region",
                              blob_get_path(s->b));
        got += (uint64_t)r;
    }
    atomic_fetch_add(&s->n_buffered, 1);
    return G5_OK;
}

/* Names the damaged tensor of chunk ci (its stored tensor hash fails), or the chunk. */
static g5_status name_damage(const blob *b, uint64_t ci, const uint8_t got[16], g5_error *err) {
    const blob_info *in = blob_get_info(b);
    const uint64_t lo = in->data_offset + ci * in->chunk_size;
    uint64_t hi = lo + in->chunk_size;
    if (hi > in->data_offset + in->data_size) hi = in->data_offset + in->data_size;
    for (uint64_t i = 0; i < blob_n_tensors(b); i++) {
        const blob_tensor *t = blob_get_tensor(b, i);
        if (t->offset >= hi || t->offset + t->size <= lo) continue;
        g5_status st = blob_verify_tensor(b, i, err);
        if (st) {
            g5_error_prefix(err, "refusing to load");
            return st;
        }
    }
    char desc[512], a[33], c[33];
    blob_describe_chunk(b, ci, desc, sizeof desc);
    blob_hash_hex(blob_get_chunk_hash(b, ci), a);
    blob_hash_hex(got, c);
    return g5_fail_at(err, G5_ERR_CHECKSUM, lo,
                      "refusing to load: %s: %s: XXH3-128 mismatch (stored %s, computed %s)",
                      blob_get_path(b), desc, a, c);
}

static void *ld_main(void *arg) {
    ld_thread *th = arg;
    ld_shared *s = th->s;
    const blob_info *in = s->in;
    g5_error e = {0};
    g5_status st = G5_OK;
    cudaError_t ce = cudaSetDevice(s->device);
    if (ce != cudaSuccess) {
        st = g5_fail(&e, G5_ERR_INTERNAL, "loader: cudaSetDevice(%d): %s", s->device, cudaGetErrorString(ce));
        ld_fail(s, &e, st);
        return NULL;
    }
    uint64_t slot = 0;
    XXH3_state_t *hs = s->verify ? XXH3_createState() : NULL;
    if (s->verify && !hs) {
        st = g5_fail(&e, G5_ERR_NOMEM, "loader: hash state");
        ld_fail(s, &e, st);
        return NULL;
    }
    for (;;) {
        if (atomic_load(&s->failed)) break;
        const uint64_t ci = atomic_fetch_add(&s->next_chunk, 1);
        if (ci >= in->n_chunks) break;
        const uint64_t c0 = ci * in->chunk_size;
        uint64_t c1 = c0 + in->chunk_size;
        if (c1 > in->data_size) c1 = in->data_size;
        if (hs) XXH3_128bits_reset(hs);
        for (uint64_t p = c0; p < c1 && !atomic_load(&s->failed); p += s->buf_bytes) {
            const uint64_t len = c1 - p < s->buf_bytes ? c1 - p : s->buf_bytes;
            const uint32_t k = (uint32_t)(slot++ % s->nbuf);
            if (th->ev_live[k]) { /* the buffer's previous copy must be done before reuse */
                if ((ce = cudaEventSynchronize(th->ev[k])) != cudaSuccess) {
                    st = g5_fail(&e, G5_ERR_INTERNAL, "loader: copy: %s", cudaGetErrorString(ce));
                    break;
                }
            }
            if ((st = read_at(s, th->buf[k], in->data_offset + p, len, s->buf_bytes, &e))) break;
            if (hs) XXH3_128bits_update(hs, th->buf[k], (size_t)len);
            ce = cudaMemcpyAsync(s->dev + p, th->buf[k], (size_t)len, cudaMemcpyHostToDevice, th->stream);
            if (ce == cudaSuccess) ce = cudaEventRecord(th->ev[k], th->stream);
            if (ce != cudaSuccess) {
                st = g5_fail(&e, G5_ERR_INTERNAL, "loader: cudaMemcpyAsync of %llu bytes: %s",
                             (unsigned long long)len, cudaGetErrorString(ce));
                break;
            }
            th->ev_live[k] = 1;
        }
        if (st) break;
        if (hs && !atomic_load(&s->failed)) {
            XXH128_canonical_t cn;
            XXH128_canonicalFromHash(&cn, XXH3_128bits_digest(hs));
            const uint8_t *want = blob_get_chunk_hash(s->b, ci);
            if (!want || memcmp(cn.digest, want, 16) != 0) {
                st = name_damage(s->b, ci, cn.digest, &e);
                if (!st) st = g5_fail(&e, G5_ERR_CHECKSUM, "%s: chunk %llu", blob_get_path(s->b), (unsigned long long)ci);
                break;
            }
        }
    }
    if (hs) XXH3_freeState(hs);
    if ((ce = cudaStreamSynchronize(th->stream)) != cudaSuccess && !st)
        st = g5_fail(&e, G5_ERR_INTERNAL, "loader: stream: %s", cudaGetErrorString(ce));
    if (st) ld_fail(s, &e, st);
    return NULL;
}

static void free_thread(ld_thread *th, uint32_t nbuf) {
    if (th->buf)
        for (uint32_t k = 0; k < nbuf; k++)
            if (th->buf[k]) cudaFreeHost(th->buf[k]);
    if (th->ev)
        for (uint32_t k = 0; k < nbuf; k++)
            if (th->ev[k]) cudaEventDestroy(th->ev[k]);
    if (th->stream) cudaStreamDestroy(th->stream);
    free(th->buf);
    free(th->ev);
    free(th->ev_live);
}

g5_status rt_gpu_load_blob(const blob *b, int device, const rt_gpu_load_opts *o, void **dev_out,
                           rt_gpu_load_stats *stats, g5_error *err) {
    *dev_out = NULL;
    rt_gpu_load_opts def;
    if (!o) {
        rt_gpu_load_opts_default(&def);
        o = &def;
    }
    const blob_info *in = blob_get_info(b);
    const char *path = blob_get_path(b);
    ld_shared s;
    memset(&s, 0, sizeof s);
    s.b = b;
    s.in = in;
    s.device = device;
    s.verify = o->verify;
    s.buf_bytes = o->buf_bytes ? o->buf_bytes : 16u << 20;
    s.buf_bytes = (s.buf_bytes + LD_ALIGN - 1) / LD_ALIGN * LD_ALIGN;
    s.nbuf = o->bufs_per_thread ? o->bufs_per_thread : 2;
    uint32_t nt = o->n_threads ? o->n_threads : 4;
    if (in->n_chunks && nt > in->n_chunks) nt = (uint32_t)in->n_chunks;
    if (nt == 0) nt = 1;
    cudaError_t ce = cudaSetDevice(device);
    if (ce != cudaSuccess) return g5_fail(err, G5_ERR_INTERNAL, "loader: cudaSetDevice(%d): %s", device, cudaGetErrorString(ce));
    void *dev = NULL;
    if ((ce = cudaMalloc(&dev, in->data_size ? in->data_size : 16)) != cudaSuccess)
        return g5_fail(err, G5_ERR_NOMEM, "%s: %llu bytes of device memory on device %d: %s", path,
                       (unsigned long long)in->data_size, device, cudaGetErrorString(ce));
    s.dev = dev;
    s.fd_buf = open(path, O_RDONLY | O_CLOEXEC);
    if (s.fd_buf < 0) {
        cudaFree(dev);
        return g5_fail(err, G5_ERR_IO, "%s: open: %s", path, strerror(errno));
    }
    s.fd_direct = -1;
#ifdef O_DIRECT
    if (o->direct && in->data_offset % LD_ALIGN == 0 && in->chunk_size % LD_ALIGN == 0)
        s.fd_direct = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
#endif
    atomic_init(&s.next_chunk, 0);
    atomic_init(&s.failed, 0);
    atomic_init(&s.n_direct, 0);
    atomic_init(&s.n_buffered, 0);
    pthread_mutex_init(&s.mu, NULL);

    g5_status st = G5_OK;
    ld_thread *ths = calloc(nt, sizeof *ths);
    pthread_t *tid = calloc(nt, sizeof *tid);
    uint32_t started = 0;
    if (!ths || !tid) st = g5_fail(err, G5_ERR_NOMEM, "loader threads");
    for (uint32_t i = 0; i < nt && !st; i++) {
        ld_thread *th = &ths[i];
        th->s = &s;
        th->buf = calloc(s.nbuf, sizeof *th->buf);
        th->ev = calloc(s.nbuf, sizeof *th->ev);
        th->ev_live = calloc(s.nbuf, sizeof *th->ev_live);
        if (!th->buf || !th->ev || !th->ev_live) {
            st = g5_fail(err, G5_ERR_NOMEM, "loader buffers");
            break;
        }
        if ((ce = cudaStreamCreateWithFlags(&th->stream, cudaStreamNonBlocking)) != cudaSuccess) {
            st = g5_fail(err, G5_ERR_INTERNAL, "loader: stream: %s", cudaGetErrorString(ce));
            break;
        }
        for (uint32_t k = 0; k < s.nbuf && !st; k++) {
            if ((ce = cudaHostAlloc(&th->buf[k], s.buf_bytes, cudaHostAllocDefault)) != cudaSuccess)
                st = g5_fail(err, G5_ERR_NOMEM, "loader: %llu bytes of pinned memory: %s",
                             (unsigned long long)s.buf_bytes, cudaGetErrorString(ce));
            else if ((ce = cudaEventCreateWithFlags(&th->ev[k], cudaEventDisableTiming)) != cudaSuccess)
                st = g5_fail(err, G5_ERR_INTERNAL, "loader: event: %s", cudaGetErrorString(ce));
        }
    }
    const double t0 = now_s();
    for (uint32_t i = 0; i < nt && !st; i++) {
        if (pthread_create(&tid[i], NULL, ld_main, &ths[i])) {
            st = g5_fail(err, G5_ERR_INTERNAL, "loader: cannot start reader thread %u", i);
            atomic_store(&s.failed, 1);
            break;
        }
        started++;
    }
    for (uint32_t i = 0; i < started; i++) pthread_join(tid[i], NULL);
    const double t1 = now_s();
    if (!st && s.st) {
        st = s.st;
        if (err) *err = s.err;
    }
    for (uint32_t i = 0; ths && i < nt; i++) free_thread(&ths[i], s.nbuf); /* zeroed ones are no-ops */
    free(ths);
    free(tid);
    if (s.fd_direct >= 0) close(s.fd_direct);
    close(s.fd_buf);
    pthread_mutex_destroy(&s.mu);
    if (st) {
        cudaFree(dev);
        return st;
    }
    if (stats) {
        stats->bytes = in->data_size;
        stats->seconds = t1 - t0;
        stats->gb_per_s = stats->seconds > 0 ? (double)in->data_size / stats->seconds / 1e9 : 0;
        stats->n_threads = nt;
        stats->direct_reads = atomic_load(&s.n_direct);
        stats->buffered_reads = atomic_load(&s.n_buffered);
        stats->verified = s.verify;
    }
    *dev_out = dev;
    return G5_OK;
}

#else
typedef int rt_gpu_load_unused_;
#endif
