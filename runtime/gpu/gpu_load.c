/* Blob -> GPU loader (gpu_load.h). Compiled to nothing unless G5_WITH_CUDA. */
#ifdef G5_WITH_CUDA

#include "runtime/gpu/gpu_load.h"

#include <cuda_runtime_api.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#define LD_ALIGN 4096u
#define LD_HUGE (2u << 20)
#define LD_MAX_THREADS 256u
#define NO_PIECE UINT64_MAX

void rt_gpu_load_opts_default(rt_gpu_load_opts *o) {
    memset(o, 0, sizeof *o);
    o->verify = 1;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* The ring parameters a loader is made with, zeros replaced by the defaults. */
static void resolve_ring(const rt_gpu_load_opts *o, rt_gpu_load_opts *r) {
    rt_gpu_load_opts def;
    if (!o) {
        rt_gpu_load_opts_default(&def);
        o = &def;
    }
    *r = *o;
    if (!r->n_threads) {
        /* Warm loads are CPU-bound (page cache -> pinned copies + hashing): one reader per core.
         * More than 16 gained nothing on the 16-core device; cold loads need only ~4. */
        const long nc = sysconf(_SC_NPROCESSORS_ONLN);
        r->n_threads = nc < 1 ? 4 : nc > 16 ? 16 : (uint32_t)nc;
    }
    if (r->n_threads > LD_MAX_THREADS) r->n_threads = LD_MAX_THREADS;
    r->buf_bytes = round_up(r->buf_bytes ? r->buf_bytes : 2u << 20, LD_ALIGN);
    r->read_bytes = round_up(r->read_bytes ? r->read_bytes : 512u << 10, LD_ALIGN);
    if (r->read_bytes > r->buf_bytes) r->read_bytes = r->buf_bytes;
    if (!r->bufs_per_thread) r->bufs_per_thread = 4;
}

/* ---- the loader: pinned ring + streams ---- */

struct rt_gpu_loader {
    rt_gpu_load_opts o;          /* resolved */
    int device;                  /* the streams' and events' device */
    uint32_t nt, nbuf;
    uint64_t slot_bytes;
    uint8_t **tbuf;              /* [nt]: reader i's nbuf slots, slot_bytes each, pinned */
    uint8_t *block;              /* RT_PIN_REGISTER/ALLOC: the one allocation tbuf points into */
    int pin;                     /* RT_PIN_* used */
    cudaStream_t *stream;        /* [nt] */
    cudaEvent_t *ev;             /* [nt * nbuf]: the slot's last copy */
    pthread_mutex_t busy;        /* one load at a time */
    double setup_s;
};

static void free_streams(rt_gpu_loader *l) {
    if (l->ev)
        for (uint64_t i = 0; i < (uint64_t)l->nt * l->nbuf; i++)
            if (l->ev[i]) cudaEventDestroy(l->ev[i]);
    if (l->stream)
        for (uint32_t i = 0; i < l->nt; i++)
            if (l->stream[i]) cudaStreamDestroy(l->stream[i]);
    if (l->ev) memset(l->ev, 0, (uint64_t)l->nt * l->nbuf * sizeof *l->ev);
    if (l->stream) memset(l->stream, 0, l->nt * sizeof *l->stream);
}

static g5_status make_streams(rt_gpu_loader *l, int device, g5_error *err) {
    cudaError_t ce = cudaSetDevice(device);
    if (ce != cudaSuccess) return g5_fail(err, G5_ERR_INTERNAL, "loader: cudaSetDevice(%d): %s", device, cudaGetErrorString(ce));
    l->device = device;
    for (uint32_t i = 0; i < l->nt; i++)
        if ((ce = cudaStreamCreateWithFlags(&l->stream[i], cudaStreamNonBlocking)) != cudaSuccess)
            return g5_fail(err, G5_ERR_INTERNAL, "loader: stream: %s", cudaGetErrorString(ce));
    for (uint64_t i = 0; i < (uint64_t)l->nt * l->nbuf; i++)
        if ((ce = cudaEventCreateWithFlags(&l->ev[i], cudaEventDisableTiming)) != cudaSuccess)
            return g5_fail(err, G5_ERR_INTERNAL, "loader: event: %s", cudaGetErrorString(ce));
    return G5_OK;
}

typedef struct pin_job {
    uint8_t **out;
    uint64_t bytes;
    cudaError_t ce;
    int device;
} pin_job;

static void *pin_main(void *arg) {
    pin_job *j = arg;
    j->ce = cudaSetDevice(j->device);
    if (j->ce == cudaSuccess) j->ce = cudaHostAlloc((void **)j->out, j->bytes, cudaHostAllocPortable);
    if (j->ce != cudaSuccess) *j->out = NULL;
    return NULL;
}

static g5_status pin_ring(rt_gpu_loader *l, int device, g5_error *err) {
    const uint64_t per = l->slot_bytes * l->nbuf, total = per * l->nt;
    cudaError_t ce = cudaSuccess;
    l->pin = l->o.pin == RT_PIN_AUTO ? RT_PIN_REGISTER : l->o.pin;
    if (l->pin == RT_PIN_REGISTER) {
        /* Huge pages: 512 times fewer pages to fault in, pin and map. cudaHostRegister faults
         * them in itself. */
        void *p = NULL;
        const uint64_t len = round_up(total, LD_HUGE);
        if (posix_memalign(&p, LD_HUGE, len)) return g5_fail(err, G5_ERR_NOMEM, "loader: %llu bytes for the ring", (unsigned long long)len);
#ifdef MADV_HUGEPAGE
        madvise(p, len, MADV_HUGEPAGE);
#endif
        if ((ce = cudaHostRegister(p, len, cudaHostRegisterPortable)) == cudaSuccess) {
            l->block = p;
        } else {
            free(p);
            if (l->o.pin != RT_PIN_AUTO)
                return g5_fail(err, G5_ERR_NOMEM, "loader: cudaHostRegister of %llu bytes: %s", (unsigned long long)len,
                               cudaGetErrorString(ce));
            cudaGetLastError(); /* not sticky, but leave no trace for later checks */
            l->pin = RT_PIN_ALLOC;
        }
    }
    if (l->pin == RT_PIN_ALLOC_PARALLEL) {
        pin_job *jobs = calloc(l->nt, sizeof *jobs);
        pthread_t *tid = calloc(l->nt, sizeof *tid);
        uint32_t started = 0;
        if (!jobs || !tid) {
            free(jobs);
            free(tid);
            return g5_fail(err, G5_ERR_NOMEM, "loader: pin jobs");
        }
        for (uint32_t i = 0; i < l->nt; i++) {
            jobs[i] = (pin_job){&l->tbuf[i], per, cudaSuccess, device};
            if (pthread_create(&tid[i], NULL, pin_main, &jobs[i])) break;
            started++;
        }
        for (uint32_t i = 0; i < started; i++) pthread_join(tid[i], NULL);
        for (uint32_t i = 0; i < l->nt && ce == cudaSuccess; i++)
            ce = i < started ? jobs[i].ce : cudaErrorMemoryAllocation;
        free(jobs);
        free(tid);
        if (ce != cudaSuccess)
            return g5_fail(err, G5_ERR_NOMEM, "loader: %u x %llu bytes of pinned memory: %s", l->nt, (unsigned long long)per,
                           cudaGetErrorString(ce));
        return G5_OK;
    }
    if (l->pin == RT_PIN_ALLOC) {
        void *p = NULL;
        if ((ce = cudaHostAlloc(&p, total, cudaHostAllocPortable)) != cudaSuccess)
            return g5_fail(err, G5_ERR_NOMEM, "loader: %llu bytes of pinned memory: %s", (unsigned long long)total,
                           cudaGetErrorString(ce));
        l->block = p;
    }
    for (uint32_t i = 0; i < l->nt; i++) l->tbuf[i] = l->block + per * i;
    return G5_OK;
}

void rt_gpu_loader_free(rt_gpu_loader *l) {
    if (!l) return;
    free_streams(l);
    if (l->pin == RT_PIN_REGISTER && l->block) {
        cudaHostUnregister(l->block);
        free(l->block);
    } else if (l->pin == RT_PIN_ALLOC_PARALLEL && l->tbuf) {
        for (uint32_t i = 0; i < l->nt; i++)
            if (l->tbuf[i]) cudaFreeHost(l->tbuf[i]);
    } else if (l->block) {
        cudaFreeHost(l->block);
    }
    pthread_mutex_destroy(&l->busy);
    free(l->tbuf);
    free(l->stream);
    free(l->ev);
    free(l);
}

g5_status rt_gpu_loader_create(int device, const rt_gpu_load_opts *o, rt_gpu_loader **out, g5_error *err) {
    *out = NULL;
    const double t0 = now_s();
    rt_gpu_loader *l = calloc(1, sizeof *l);
    if (!l) return g5_fail(err, G5_ERR_NOMEM, "loader");
    resolve_ring(o, &l->o);
    if (l->o.pin < RT_PIN_AUTO || l->o.pin > RT_PIN_ALLOC_PARALLEL) {
        const int pin = l->o.pin;
        free(l);
        return g5_fail(err, G5_ERR_INVALID_ARG, "loader: pin %d (0..3)", pin);
    }
    l->nt = l->o.n_threads;
    l->nbuf = l->o.bufs_per_thread;
    l->slot_bytes = l->o.buf_bytes;
    pthread_mutex_init(&l->busy, NULL);
    l->tbuf = calloc(l->nt, sizeof *l->tbuf);
    l->stream = calloc(l->nt, sizeof *l->stream);
    l->ev = calloc((uint64_t)l->nt * l->nbuf, sizeof *l->ev);
    g5_status st = G5_OK;
    if (!l->tbuf || !l->stream || !l->ev) st = g5_fail(err, G5_ERR_NOMEM, "loader tables");
    if (!st) st = make_streams(l, device, err);
    if (!st) st = pin_ring(l, device, err);
    if (st) {
        rt_gpu_loader_free(l);
        return st;
    }
    l->setup_s = now_s() - t0;
    *out = l;
    return G5_OK;
}

double rt_gpu_loader_setup_seconds(const rt_gpu_loader *l) { return l ? l->setup_s : 0; }

/* ---- one load ---- */

enum { P_FREE = 0, P_OWNER, P_HELPER, P_PUBLISHED, P_DONE };

typedef struct ld_load {
    rt_gpu_loader *l;
    const blob *b;
    const blob_info *in;
    const char *path;
    uint8_t *dev;
    int verify, direct, help;
    uint64_t *piece0;            /* [n_chunks + 1]: chunk c's pieces are [piece0[c], piece0[c+1]) */
    /* under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;           /* a piece published or hashed, or a failure */
    uint64_t next_chunk;         /* chunks [0, next_chunk) have owners */
    uint64_t *front;             /* [n_chunks]: chunk c's next unclaimed piece */
    uint8_t *pstate;             /* [n_pieces] P_* */
    uint8_t **pbuf;              /* [n_pieces]: a helper's slot holding the piece */
    g5_status st;
    g5_error err;
    atomic_int failed;
    atomic_uint_fast64_t n_direct, n_buffered, helped;
} ld_load;

typedef struct ld_thread {
    ld_load *s;
    uint32_t i;
    int fd_buf, fd_direct;       /* fd_direct -1 when O_DIRECT is off or unavailable */
    uint64_t next_slot;
    uint64_t *held;              /* [nbuf]: the helped piece in the slot, until its owner hashed it */
    int *ev_live;                /* [nbuf] */
    XXH3_state_t *hs;
} ld_thread;

/* Records the first failure (later ones are consequences) and wakes every waiting reader. */
static void ld_fail(ld_load *s, const g5_error *e, g5_status st) {
    pthread_mutex_lock(&s->mu);
    if (!s->st) {
        s->st = st;
        s->err = *e;
        s->err.status = st;
    }
    atomic_store(&s->failed, 1);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Reads len bytes at file offset off into buf (room for cap bytes, a multiple of LD_ALIGN). */
static g5_status read_at(ld_thread *th, uint8_t *buf, uint64_t off, uint64_t len, uint64_t cap, g5_error *err) {
    ld_load *s = th->s;
    if (th->fd_direct >= 0 && off % LD_ALIGN == 0) {
        const uint64_t rlen = round_up(len, LD_ALIGN);
        if (rlen <= cap) {
            uint64_t got = 0;
            int ok = 1;
            while (got < len) {
                ssize_t r = pread(th->fd_direct, buf + got, rlen - got, (off_t)(off + got));
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
        ssize_t r = pread(th->fd_buf, buf + got, len - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return g5_fail_at(err, G5_ERR_IO, off + got, "%s: read: %s", s->path, strerror(errno));
        if (r == 0) return g5_fail_at(err, G5_ERR_TRUNCATED, off + got, "%s: file ends inside the data region", s->path);
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
    return g5_fail_at(err, G5_ERR_CHECKSUM, lo, "refusing to load: %s: %s: XXH3-128 mismatch (stored %s, computed %s)",
                      blob_get_path(b), desc, a, c);
}

/* Data-region bytes [*p, *p + *len) of global piece g of chunk c. */
static void piece_range(const ld_load *s, uint64_t c, uint64_t g, uint64_t *p, uint64_t *len) {
    const uint64_t c0 = c * s->in->chunk_size;
    uint64_t c1 = c0 + s->in->chunk_size;
    if (c1 > s->in->data_size) c1 = s->in->data_size;
    *p = c0 + (g - s->piece0[c]) * s->l->slot_bytes;
    *len = c1 - *p < s->l->slot_bytes ? c1 - *p : s->l->slot_bytes;
}

/* The thread's next ring slot, once its last copy is done and its helped piece (if any) hashed. */
static g5_status take_slot(ld_thread *th, uint32_t *k_out, g5_error *e) {
    ld_load *s = th->s;
    rt_gpu_loader *l = s->l;
    const uint32_t k = (uint32_t)(th->next_slot++ % l->nbuf);
    if (th->held[k] != NO_PIECE) {
        pthread_mutex_lock(&s->mu);
        while (s->pstate[th->held[k]] != P_DONE && !atomic_load(&s->failed)) pthread_cond_wait(&s->cv, &s->mu);
        pthread_mutex_unlock(&s->mu);
        th->held[k] = NO_PIECE;
        if (atomic_load(&s->failed)) return G5_ERR_INTERNAL; /* the failure is recorded already */
    }
    if (th->ev_live[k]) {
        cudaError_t ce = cudaEventSynchronize(l->ev[th->i * l->nbuf + k]);
        if (ce != cudaSuccess) return g5_fail(e, G5_ERR_INTERNAL, "loader: copy: %s", cudaGetErrorString(ce));
        th->ev_live[k] = 0;
    }
    *k_out = k;
    return G5_OK;
}

/* Reads data bytes [p, p + len) into slot k in read_bytes preads, hashing each one right after
 * it (still in cache) when hs is set, then starts its copy to the device. */
static g5_status fill_slot(ld_thread *th, uint32_t k, uint64_t p, uint64_t len, XXH3_state_t *hs, g5_error *e) {
    ld_load *s = th->s;
    rt_gpu_loader *l = s->l;
    uint8_t *buf = l->tbuf[th->i] + (uint64_t)k * l->slot_bytes;
    g5_status st;
    for (uint64_t q = 0; q < len; q += l->o.read_bytes) {
        const uint64_t n = len - q < l->o.read_bytes ? len - q : l->o.read_bytes;
        if ((st = read_at(th, buf + q, s->in->data_offset + p + q, n, l->slot_bytes - q, e))) return st;
        if (hs) XXH3_128bits_update(hs, buf + q, (size_t)n);
    }
    cudaError_t ce = cudaMemcpyAsync(s->dev + p, buf, (size_t)len, cudaMemcpyHostToDevice, l->stream[th->i]);
    if (ce == cudaSuccess) ce = cudaEventRecord(l->ev[th->i * l->nbuf + k], l->stream[th->i]);
    if (ce != cudaSuccess)
        return g5_fail(e, G5_ERR_INTERNAL, "loader: cudaMemcpyAsync of %llu bytes: %s", (unsigned long long)len,
                       cudaGetErrorString(ce));
    th->ev_live[k] = 1;
    return G5_OK;
}

/* Reads, hashes and copies chunk ci, whose owner this thread is. */
static g5_status own_chunk(ld_thread *th, uint64_t ci, g5_error *e) {
    ld_load *s = th->s;
    XXH3_state_t *hs = s->verify ? th->hs : NULL;
    g5_status st = G5_OK;
    if (hs) XXH3_128bits_reset(hs);
    for (uint64_t g = s->piece0[ci]; g < s->piece0[ci + 1]; g++) {
        uint64_t p, len;
        piece_range(s, ci, g, &p, &len);
        pthread_mutex_lock(&s->mu);
        const int mine = s->front[ci] == g;
        if (mine) {
            s->front[ci]++;
            s->pstate[g] = P_OWNER;
        }
        pthread_mutex_unlock(&s->mu);
        if (atomic_load(&s->failed)) return G5_ERR_INTERNAL;
        if (mine) {
            uint32_t k;
            if ((st = take_slot(th, &k, e)) || (st = fill_slot(th, k, p, len, hs, e))) return st;
            continue;
        }
        if (!hs) continue; /* a helper read and copied it; nothing to hash */
        pthread_mutex_lock(&s->mu);
        while (s->pstate[g] != P_PUBLISHED && !atomic_load(&s->failed)) pthread_cond_wait(&s->cv, &s->mu);
        const uint8_t *buf = s->pbuf[g];
        pthread_mutex_unlock(&s->mu);
        if (atomic_load(&s->failed)) return G5_ERR_INTERNAL;
        XXH3_128bits_update(hs, buf, (size_t)len);
        pthread_mutex_lock(&s->mu);
        s->pstate[g] = P_DONE;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
    }
    if (!hs) return G5_OK;
    XXH128_canonical_t cn;
    XXH128_canonicalFromHash(&cn, XXH3_128bits_digest(hs));
    const uint8_t *want = blob_get_chunk_hash(s->b, ci);
    if (!want || memcmp(cn.digest, want, 16) != 0) {
        st = name_damage(s->b, ci, cn.digest, e);
        if (!st) st = g5_fail(e, G5_ERR_CHECKSUM, "%s: chunk %llu", s->path, (unsigned long long)ci);
    }
    return st;
}

/* Once every chunk has an owner: reads and copies the next unclaimed piece of the unfinished
 * chunk with the most left, and hands it to the chunk's owner to hash; until none is left. */
static g5_status help(ld_thread *th, g5_error *e) {
    ld_load *s = th->s;
    const uint64_t nc = s->in->n_chunks;
    for (;;) {
        uint32_t k;
        g5_status st = take_slot(th, &k, e);
        if (st) return st;
        pthread_mutex_lock(&s->mu);
        uint64_t best = nc, left = 0;
        for (uint64_t c = 0; c < s->next_chunk && c < nc; c++)
            if (s->piece0[c + 1] - s->front[c] > left) {
                left = s->piece0[c + 1] - s->front[c];
                best = c;
            }
        uint64_t g = NO_PIECE;
        if (best < nc) {
            g = s->front[best]++;
            s->pstate[g] = P_HELPER;
        }
        pthread_mutex_unlock(&s->mu);
        if (g == NO_PIECE || atomic_load(&s->failed)) return G5_OK;
        uint64_t p, len;
        piece_range(s, best, g, &p, &len);
        if ((st = fill_slot(th, k, p, len, NULL, e))) return st;
        atomic_fetch_add(&s->helped, len);
        pthread_mutex_lock(&s->mu);
        s->pbuf[g] = s->l->tbuf[th->i] + (uint64_t)k * s->l->slot_bytes;
        s->pstate[g] = s->verify ? P_PUBLISHED : P_DONE;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        if (s->verify) th->held[k] = g;
    }
}

static void *ld_main(void *arg) {
    ld_thread *th = arg;
    ld_load *s = th->s;
    g5_error e = {0};
    g5_status st = G5_OK;
    cudaError_t ce = cudaSetDevice(s->l->device);
    if (ce != cudaSuccess) st = g5_fail(&e, G5_ERR_INTERNAL, "loader: cudaSetDevice(%d): %s", s->l->device, cudaGetErrorString(ce));
    /* Its own descriptors: the kernel's readahead state is per open file. */
    th->fd_buf = -1;
    th->fd_direct = -1;
    if (!st && (th->fd_buf = open(s->path, O_RDONLY | O_CLOEXEC)) < 0)
        st = g5_fail(&e, G5_ERR_IO, "%s: open: %s", s->path, strerror(errno));
    if (!st) posix_fadvise(th->fd_buf, (off_t)s->in->data_offset, (off_t)s->in->data_size, POSIX_FADV_SEQUENTIAL);
#ifdef O_DIRECT
    if (!st && s->direct) th->fd_direct = open(s->path, O_RDONLY | O_CLOEXEC | O_DIRECT);
#endif
    if (!st && s->verify && !(th->hs = XXH3_createState())) st = g5_fail(&e, G5_ERR_NOMEM, "loader: hash state");
    while (!st && !atomic_load(&s->failed)) {
        pthread_mutex_lock(&s->mu);
        const uint64_t ci = s->next_chunk < s->in->n_chunks ? s->next_chunk++ : NO_PIECE;
        pthread_mutex_unlock(&s->mu);
        if (ci == NO_PIECE) break;
        st = own_chunk(th, ci, &e);
    }
    if (!st && s->help && !atomic_load(&s->failed)) st = help(th, &e);
    if (th->hs) XXH3_freeState(th->hs);
    th->hs = NULL;
    if (th->fd_direct >= 0) close(th->fd_direct);
    if (th->fd_buf >= 0) close(th->fd_buf);
    if ((ce = cudaStreamSynchronize(s->l->stream[th->i])) != cudaSuccess && !st)
        st = g5_fail(&e, G5_ERR_INTERNAL, "loader: stream: %s", cudaGetErrorString(ce));
    /* G5_ERR_INTERNAL with no message: stopped by another reader's failure, which is recorded */
    if (st && e.msg[0]) ld_fail(s, &e, st);
    else if (st) atomic_store(&s->failed, 1);
    return NULL;
}

g5_status rt_gpu_loader_load(rt_gpu_loader *l, const blob *b, int device, const rt_gpu_load_opts *o,
                             void **dev_out, rt_gpu_load_stats *stats, g5_error *err) {
    *dev_out = NULL;
    if (!o) o = &l->o;
    const blob_info *in = blob_get_info(b);
    const char *path = blob_get_path(b);
    pthread_mutex_lock(&l->busy);
    g5_status st = G5_OK;
    if (device != l->device) {
        cudaSetDevice(l->device);
        free_streams(l);
        if ((st = make_streams(l, device, err))) {
            free_streams(l);
            pthread_mutex_unlock(&l->busy);
            return st;
        }
    }
    cudaError_t ce = cudaSetDevice(device);
    if (ce != cudaSuccess) {
        pthread_mutex_unlock(&l->busy);
        return g5_fail(err, G5_ERR_INTERNAL, "loader: cudaSetDevice(%d): %s", device, cudaGetErrorString(ce));
    }
    void *dev = NULL;
    if ((ce = cudaMalloc(&dev, in->data_size ? in->data_size : 16)) != cudaSuccess) {
        pthread_mutex_unlock(&l->busy);
        return g5_fail(err, G5_ERR_NOMEM, "%s: %llu bytes of device memory on device %d: %s", path,
                       (unsigned long long)in->data_size, device, cudaGetErrorString(ce));
    }
    ld_load s;
    memset(&s, 0, sizeof s);
    s.l = l;
    s.b = b;
    s.in = in;
    s.path = path;
    s.dev = dev;
    s.verify = o->verify;
    s.direct = o->direct && in->data_offset % LD_ALIGN == 0;
    s.help = !o->no_help;
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    atomic_init(&s.failed, 0);
    atomic_init(&s.n_direct, 0);
    atomic_init(&s.n_buffered, 0);
    atomic_init(&s.helped, 0);
    const uint64_t nc = in->n_chunks;
    const uint64_t per_chunk = (in->chunk_size + l->slot_bytes - 1) / l->slot_bytes;
    s.piece0 = calloc(nc + 1, sizeof *s.piece0);
    s.front = calloc(nc ? nc : 1, sizeof *s.front);
    uint64_t n_pieces = 0;
    for (uint64_t c = 0; s.piece0 && s.front && c < nc; c++) {
        const uint64_t c0 = c * in->chunk_size;
        const uint64_t clen = in->data_size - c0 < in->chunk_size ? in->data_size - c0 : in->chunk_size;
        s.piece0[c] = s.front[c] = n_pieces;
        n_pieces += c + 1 < nc ? per_chunk : (clen + l->slot_bytes - 1) / l->slot_bytes;
    }
    if (s.piece0) s.piece0[nc] = n_pieces;
    s.pstate = calloc(n_pieces ? n_pieces : 1, 1);
    s.pbuf = calloc(n_pieces ? n_pieces : 1, sizeof *s.pbuf);
    uint32_t nt = l->nt;
    if (nt > n_pieces) nt = n_pieces ? (uint32_t)n_pieces : 1;
    ld_thread *ths = calloc(nt, sizeof *ths);
    pthread_t *tid = calloc(nt, sizeof *tid);
    uint64_t *held = malloc((uint64_t)nt * l->nbuf * sizeof *held);
    int *ev_live = calloc((uint64_t)nt * l->nbuf, sizeof *ev_live);
    if (!s.piece0 || !s.front || !s.pstate || !s.pbuf || !ths || !tid || !held || !ev_live)
        st = g5_fail(err, G5_ERR_NOMEM, "loader tables");
    for (uint64_t i = 0; held && i < (uint64_t)nt * l->nbuf; i++) held[i] = NO_PIECE;
    uint32_t started = 0;
    const double t0 = now_s();
    for (uint32_t i = 0; i < nt && !st; i++) {
        ths[i] = (ld_thread){.s = &s, .i = i, .held = held + (uint64_t)i * l->nbuf, .ev_live = ev_live + (uint64_t)i * l->nbuf};
        if (pthread_create(&tid[i], NULL, ld_main, &ths[i])) {
            st = g5_fail(err, G5_ERR_INTERNAL, "loader: cannot start reader thread %u", i);
            pthread_mutex_lock(&s.mu);
            atomic_store(&s.failed, 1);
            pthread_cond_broadcast(&s.cv);
            pthread_mutex_unlock(&s.mu);
            break;
        }
        started++;
    }
    for (uint32_t i = 0; i < started; i++) pthread_join(tid[i], NULL);
    const double t1 = now_s();
    if (!st && s.st) {
        st = s.st;
        if (err) *err = s.err;
    } else if (!st && atomic_load(&s.failed)) {
        st = g5_fail(err, G5_ERR_INTERNAL, "%s: loader stopped without a recorded reason", path);
    }
    free(s.piece0);
    free(s.front);
    free(s.pstate);
    free(s.pbuf);
    free(ths);
    free(tid);
    free(held);
    free(ev_live);
    pthread_cond_destroy(&s.cv);
    pthread_mutex_destroy(&s.mu);
    pthread_mutex_unlock(&l->busy);
    if (st) {
        cudaFree(dev);
        return st;
    }
    if (stats) {
        memset(stats, 0, sizeof *stats);
        stats->bytes = in->data_size;
        stats->seconds = t1 - t0;
        stats->gb_per_s = stats->seconds > 0 ? (double)in->data_size / stats->seconds / 1e9 : 0;
        stats->n_threads = nt;
        stats->direct_reads = atomic_load(&s.n_direct);
        stats->buffered_reads = atomic_load(&s.n_buffered);
        stats->verified = s.verify;
        stats->helped_bytes = atomic_load(&s.helped);
        stats->pin = l->pin;
    }
    *dev_out = dev;
    return G5_OK;
}

/* ---- the process's loader ---- */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static rt_gpu_loader *g_ld;

static int same_ring(const rt_gpu_load_opts *a, const rt_gpu_load_opts *b) {
    return a->n_threads == b->n_threads && a->buf_bytes == b->buf_bytes && a->read_bytes == b->read_bytes &&
           a->bufs_per_thread == b->bufs_per_thread && a->pin == b->pin;
}

g5_status rt_gpu_load_blob(const blob *b, int device, const rt_gpu_load_opts *o, void **dev_out,
                           rt_gpu_load_stats *stats, g5_error *err) {
    *dev_out = NULL;
    rt_gpu_load_opts r;
    resolve_ring(o, &r);
    pthread_mutex_lock(&g_mu);
    if (g_ld && !same_ring(&g_ld->o, &r)) {
        rt_gpu_loader_free(g_ld);
        g_ld = NULL;
    }
    double setup = 0;
    g5_status st = G5_OK;
    if (!g_ld) {
        st = rt_gpu_loader_create(device, &r, &g_ld, err);
        setup = g_ld ? g_ld->setup_s : 0;
    }
    if (!st) st = rt_gpu_loader_load(g_ld, b, device, &r, dev_out, stats, err);
    pthread_mutex_unlock(&g_mu);
    if (!st && stats) stats->setup_seconds = setup;
    return st;
}

void rt_gpu_load_release(void) {
    pthread_mutex_lock(&g_mu);
    rt_gpu_loader_free(g_ld);
    g_ld = NULL;
    pthread_mutex_unlock(&g_mu);
}

#else
typedef int rt_gpu_load_unused_;
#endif
