/* Blob -> GPU load rate (runtime/gpu_load.h) against the two ceilings measured in the same run:
 * pinned host-to-device copies (cudaMemcpyAsync from pinned memory) and a parallel read of the
 * same blob's data region with the same number of threads (pread into pinned buffers, the
 * loader's 64 MiB chunks and 16 MiB buffers, no hashing, no GPU). Ratio = load GB/s /
 * min(H2D, read). Warm = the blob is in the page cache; cold = caches dropped before every
 * measurement (root: sync + /proc/sys/vm/drop_caches; otherwise posix_fadvise DONTNEED, which
 * is said in the output).
 *
 *   bench_load [--threads 4,8,16] [--cold-threads 4,16] [--cold-ranks N] [--reps N]
 *              [--budget SECONDS] [--no-warm] [--no-cold] [--no-gpu] BLOB...
 *
 * --no-gpu measures only the reads (malloc'd buffers): the CPU half, for machines without a GPU.
 * "load" is the loader's own timer (first read to last copy done, like the ceilings, which
 * exclude buffer allocation); "e2e" is the whole rt_gpu_load_blob call (cudaMalloc, pinned
 * buffers, threads, frees included). Per-rank lines go to stderr; the table to stdout. */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "format/blob.h"
#include "runtime/gpu_load.h"

#define BUF_BYTES (16ull << 20)
#define NBUF 2
#define MAX_T 64
#define MAX_CFG 64

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(3);                                                                               \
        }                                                                                          \
    } while (0)

static int use_gpu = 1;
static double t_start, budget_s = 1e9;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static int over_budget(void) { return now_s() - t_start > budget_s; }

/* ---- dropping the page cache ---- */

static const char *drop_how = "not needed";

static void drop_cache(const char *path) {
    sync();
    FILE *f = fopen("/proc/sys/vm/drop_caches", "w");
    if (f && fputs("3\n", f) >= 0 && fclose(f) == 0) {
        drop_how = "sync + drop_caches=3";
        return;
    }
    if (f) fclose(f);
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
        fdatasync(fd);
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
    drop_how = "posix_fadvise DONTNEED (not root)";
}

/* ---- the read ceiling: the loader's read pattern without hashing or copies ---- */

typedef struct rd_shared {
    int fd;
    int direct;
    uint64_t data_offset, data_size, chunk_size, n_chunks;
    atomic_uint_fast64_t next;
    atomic_int failed;
} rd_shared;

typedef struct rd_thread {
    rd_shared *s;
    uint8_t *buf[NBUF];
} rd_thread;

static void *rd_main(void *arg) {
    rd_thread *th = arg;
    rd_shared *s = th->s;
    uint64_t slot = 0;
    for (;;) {
        const uint64_t ci = atomic_fetch_add(&s->next, 1);
        if (ci >= s->n_chunks || atomic_load(&s->failed)) break;
        const uint64_t c0 = ci * s->chunk_size;
        const uint64_t c1 = c0 + s->chunk_size < s->data_size ? c0 + s->chunk_size : s->data_size;
        for (uint64_t p = c0; p < c1; p += BUF_BYTES) {
            uint64_t len = c1 - p < BUF_BYTES ? c1 - p : BUF_BYTES;
            if (s->direct) len = (len + 4095) / 4096 * 4096;
            uint8_t *b = th->buf[slot++ % NBUF];
            uint64_t got = 0;
            while (got < len) {
                ssize_t r = pread(s->fd, b + got, len - got, (off_t)(s->data_offset + p + got));
                if (r < 0 && errno == EINTR) continue;
                if (r < 0) {
                    atomic_store(&s->failed, errno);
                    return NULL;
                }
                if (r == 0) break; /* the end of the file inside a rounded-up O_DIRECT read */
                got += (uint64_t)r;
            }
        }
    }
    return NULL;
}

/* Returns GB/s of reading b's data region with nt threads, or a negative value on failure. */
static double read_rate(const blob *b, uint32_t nt, int direct) {
    const blob_info *in = blob_get_info(b);
    rd_shared s = {.direct = direct, .data_offset = in->data_offset, .data_size = in->data_size,
                   .chunk_size = in->chunk_size, .n_chunks = in->n_chunks};
    atomic_init(&s.next, 0);
    atomic_init(&s.failed, 0);
    s.fd = open(blob_get_path(b), O_RDONLY | (direct ? O_DIRECT : 0));
    if (s.fd < 0) return -1;
    if (nt > in->n_chunks) nt = (uint32_t)in->n_chunks;
    rd_thread th[MAX_T];
    pthread_t tid[MAX_T];
    for (uint32_t i = 0; i < nt; i++) {
        th[i].s = &s;
        for (int k = 0; k < NBUF; k++) {
            if (use_gpu) CK(cudaHostAlloc((void **)&th[i].buf[k], BUF_BYTES, cudaHostAllocDefault));
            else if (posix_memalign((void **)&th[i].buf[k], 4096, BUF_BYTES)) exit(2);
            memset(th[i].buf[k], 0, BUF_BYTES); /* fault the pages in before timing */
        }
    }
    const double t0 = now_s();
    for (uint32_t i = 0; i < nt; i++)
        if (pthread_create(&tid[i], NULL, rd_main, &th[i])) exit(2);
    for (uint32_t i = 0; i < nt; i++) pthread_join(tid[i], NULL);
    const double dt = now_s() - t0;
    for (uint32_t i = 0; i < nt; i++)
        for (int k = 0; k < NBUF; k++) {
            if (use_gpu) cudaFreeHost(th[i].buf[k]);
            else free(th[i].buf[k]);
        }
    close(s.fd);
    if (atomic_load(&s.failed)) {
        fprintf(stderr, "bench_load: read of %s failed: %s\n", blob_get_path(b), strerror((int)atomic_load(&s.failed)));
        return -1;
    }
    return (double)in->data_size / dt / 1e9;
}

/* ---- the H2D ceiling ---- */

/* Best of: one stream copying a 256 MiB pinned buffer, and ns streams copying 16 MiB pieces
 * from their own pinned buffers (the loader's pattern); 4 GiB each. */
static double h2d_rate(uint32_t ns) {
    const uint64_t total = 4ull << 30;
    uint8_t *dev = NULL;
    CK(cudaMalloc((void **)&dev, 1ull << 30));
    double best = 0;
    cudaEvent_t a, z;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&z));
    { /* one stream, big copies */
        uint8_t *h = NULL;
        CK(cudaHostAlloc((void **)&h, 256ull << 20, cudaHostAllocDefault));
        memset(h, 1, 256ull << 20);
        CK(cudaMemcpy(dev, h, 256ull << 20, cudaMemcpyHostToDevice));
        CK(cudaEventRecord(a, 0));
        for (uint64_t p = 0; p < total; p += 256ull << 20)
            CK(cudaMemcpyAsync(dev + p % (1ull << 30), h, 256ull << 20, cudaMemcpyHostToDevice, 0));
        CK(cudaEventRecord(z, 0));
        CK(cudaEventSynchronize(z));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, a, z));
        const double r = (double)total / (ms * 1e-3) / 1e9;
        fprintf(stderr, "bench_load: H2D one stream 256 MiB copies: %.1f GB/s\n", r);
        if (r > best) best = r;
        CK(cudaFreeHost(h));
    }
    { /* ns streams, 16 MiB pieces */
        cudaStream_t st[MAX_T];
        uint8_t *h[MAX_T];
        for (uint32_t i = 0; i < ns; i++) {
            CK(cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking));
            CK(cudaHostAlloc((void **)&h[i], BUF_BYTES, cudaHostAllocDefault));
            memset(h[i], 1, BUF_BYTES);
        }
        CK(cudaDeviceSynchronize());
        const double t0 = now_s();
        uint64_t k = 0;
        for (uint64_t p = 0; p < total; p += BUF_BYTES, k++)
            CK(cudaMemcpyAsync(dev + p % (1ull << 30), h[k % ns], BUF_BYTES, cudaMemcpyHostToDevice, st[k % ns]));
        CK(cudaDeviceSynchronize());
        const double r = (double)total / (now_s() - t0) / 1e9;
        fprintf(stderr, "bench_load: H2D %u streams 16 MiB copies: %.1f GB/s\n", ns, r);
        if (r > best) best = r;
        for (uint32_t i = 0; i < ns; i++) {
            CK(cudaFreeHost(h[i]));
            CK(cudaStreamDestroy(st[i]));
        }
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(z));
    CK(cudaFree(dev));
    return best;
}

/* ---- results ---- */

typedef struct cfg_acc {
    int cold;
    uint32_t threads;
    int verify, direct; /* direct -1: a read ceiling row */
    uint32_t ranks;
    double bytes, sec, sec_e2e;       /* loads */
    double rd_bytes, rd_sec;          /* the ceiling read beside these loads (buffered) */
    double rdd_bytes, rdd_sec;        /* O_DIRECT ceiling read (cold only) */
} cfg_acc;

static cfg_acc acc[MAX_CFG];
static int n_acc;

static cfg_acc *get_acc(int cold, uint32_t t, int verify, int direct) {
    for (int i = 0; i < n_acc; i++)
        if (acc[i].cold == cold && acc[i].threads == t && acc[i].verify == verify && acc[i].direct == direct)
            return &acc[i];
    if (n_acc == MAX_CFG) exit(2);
    cfg_acc *a = &acc[n_acc++];
    memset(a, 0, sizeof *a);
    a->cold = cold;
    a->threads = t;
    a->verify = verify;
    a->direct = direct;
    return a;
}

/* One load; returns 0 on success and adds to the config's sums. */
static int one_load(const blob *b, int cold, uint32_t t, int verify, int direct, int rank) {
    rt_gpu_load_opts o;
    rt_gpu_load_opts_default(&o);
    o.n_threads = t;
    o.verify = verify;
    o.direct = direct;
    if (cold) drop_cache(blob_get_path(b));
    void *dev = NULL;
    rt_gpu_load_stats st;
    g5_error e = {0};
    const double t0 = now_s();
    g5_status s = rt_gpu_load_blob(b, 0, &o, &dev, &st, &e);
    if (!s) CK(cudaFree(dev));
    const double e2e = now_s() - t0;
    if (s) {
        fprintf(stderr, "bench_load: load of %s failed: %s\n", blob_get_path(b), e.msg);
        return -1;
    }
    fprintf(stderr, "bench_load: rank %d %s T=%u verify=%d direct=%d: %.3f GB, loader %.3f s (%.2f GB/s), e2e %.3f s, "
            "%llu O_DIRECT / %llu buffered reads, %u threads\n", rank, cold ? "cold" : "warm", t, verify, direct,
            st.bytes / 1e9, st.seconds, st.gb_per_s, e2e, (unsigned long long)st.direct_reads,
            (unsigned long long)st.buffered_reads, st.n_threads);
    cfg_acc *a = get_acc(cold, t, verify, direct);
    a->ranks++;
    a->bytes += (double)st.bytes;
    a->sec += st.seconds;
    a->sec_e2e += e2e;
    return 0;
}

static int parse_list(const char *s, uint32_t *out, int cap) {
    int n = 0;
    while (*s && n < cap) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > MAX_T) return -1;
        out[n++] = (uint32_t)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

int main(int argc, char **argv) {
    uint32_t warm_t[8] = {4, 8, 16}, cold_t[8] = {4, 16};
    int n_warm_t = 3, n_cold_t = 2, reps = 2, do_warm = 1, do_cold = 1, cold_ranks = 1 << 30;
    int ai = 1;
    for (; ai < argc && argv[ai][0] == '-'; ai++) {
        const char *a = argv[ai], *v = ai + 1 < argc ? argv[ai + 1] : NULL;
        if (!strcmp(a, "--threads") && v) { n_warm_t = parse_list(v, warm_t, 8); ai++; }
        else if (!strcmp(a, "--cold-threads") && v) { n_cold_t = parse_list(v, cold_t, 8); ai++; }
        else if (!strcmp(a, "--cold-ranks") && v) { cold_ranks = atoi(v); ai++; }
        else if (!strcmp(a, "--reps") && v) { reps = atoi(v); ai++; }
        else if (!strcmp(a, "--budget") && v) { budget_s = atof(v); ai++; }
        else if (!strcmp(a, "--no-warm")) do_warm = 0;
        else if (!strcmp(a, "--no-cold")) do_cold = 0;
        else if (!strcmp(a, "--no-gpu")) use_gpu = 0;
        else { fprintf(stderr, "bench_load: unknown option %s\n", a); return 2; }
        if (n_warm_t < 0 || n_cold_t < 0 || reps < 1) { fprintf(stderr, "bench_load: bad %s\n", a); return 2; }
    }
    if (ai >= argc) {
        fprintf(stderr, "usage: bench_load [--threads 4,8,16] [--cold-threads 4,16] [--cold-ranks N] [--reps N] "
                        "[--budget S] [--no-warm] [--no-cold] [--no-gpu] BLOB...\n");
        return 2;
    }
    t_start = now_s();
    uint32_t max_t = 1;
    for (int i = 0; i < n_warm_t; i++) if (warm_t[i] > max_t) max_t = warm_t[i];
    for (int i = 0; i < n_cold_t; i++) if (cold_t[i] > max_t) max_t = cold_t[i];
    double h2d = 0;
    if (use_gpu) {
        CK(cudaFree(0)); /* context creation outside every timing */
        struct cudaDeviceProp p;
        CK(cudaGetDeviceProperties(&p, 0));
        fprintf(stderr, "bench_load: device %s\n", p.name);
        h2d = h2d_rate(max_t);
    }
    const int n_blobs = argc - ai;
    for (int r = 0; r < n_blobs; r++) {
        blob *b = NULL;
        g5_error e = {0};
        if (blob_open(argv[ai + r], &b, &e)) {
            fprintf(stderr, "bench_load: %s\n", e.msg);
            return 3;
        }
        const int rank = (int)blob_get_info(b)->rank;
        if (do_warm && !over_budget()) {
            read_rate(b, 16, 0); /* untimed: bring the whole data region into the page cache */
            for (int ti = 0; ti < n_warm_t; ti++) {
                const uint32_t t = warm_t[ti];
                double best = 0;
                for (int k = 0; k < reps; k++) {
                    const double g = read_rate(b, t, 0);
                    if (g > best) best = g;
                }
                fprintf(stderr, "bench_load: rank %d warm read T=%u: %.2f GB/s\n", rank, t, best);
                const double bytes = (double)blob_get_info(b)->data_size;
                for (int v = 1; v >= 0 && use_gpu; v--) {
                    /* best of reps, like the ceiling */
                    double bs = 1e30, be = 1e30;
                    for (int k = 0; k < reps; k++) {
                        cfg_acc *a = get_acc(0, t, v, 0);
                        const double s0 = a->sec, e0 = a->sec_e2e;
                        if (one_load(b, 0, t, v, 0, rank)) return 3;
                        if (a->sec - s0 < bs) bs = a->sec - s0;
                        if (a->sec_e2e - e0 < be) be = a->sec_e2e - e0;
                        a->sec = s0; a->sec_e2e = e0; a->bytes -= bytes; a->ranks--;
                    }
                    cfg_acc *a = get_acc(0, t, v, 0);
                    a->sec += bs; a->sec_e2e += be; a->bytes += bytes; a->ranks++;
                    a->rd_bytes += bytes; a->rd_sec += bytes / (best * 1e9);
                }
                if (!use_gpu) {
                    cfg_acc *a = get_acc(0, t, 1, -1);
                    a->ranks++;
                    a->rd_bytes += bytes; a->rd_sec += bytes / (best * 1e9);
                }
                /* glm5-run's default (O_DIRECT on) on a cached file, once, at its 4 threads */
                if (use_gpu && t == 4 && r < 2) {
                    if (one_load(b, 0, t, 1, 1, rank)) return 3;
                    cfg_acc *a = get_acc(0, t, 1, 1);
                    a->rd_bytes += bytes; a->rd_sec += bytes / (best * 1e9);
                }
            }
        }
        if (do_cold && r < cold_ranks) {
            for (int ti = 0; ti < n_cold_t && !over_budget(); ti++) {
                const uint32_t t = cold_t[ti];
                const double bytes = (double)blob_get_info(b)->data_size;
                drop_cache(blob_get_path(b));
                const double gb = read_rate(b, t, 0);
                drop_cache(blob_get_path(b));
                const double gd = read_rate(b, t, 1);
                fprintf(stderr, "bench_load: rank %d cold read T=%u: buffered %.2f GB/s, O_DIRECT %.2f GB/s (%s)\n",
                        rank, t, gb, gd, drop_how);
                const int nv = use_gpu ? 2 : 0;
                for (int c = 0; c < 2 * nv; c++) {
                    const int v = c < 2 ? 1 : 0, d = c % 2 == 0 ? 1 : 0;
                    if (over_budget()) break;
                    if (one_load(b, 1, t, v, d, rank)) return 3;
                    cfg_acc *a = get_acc(1, t, v, d);
                    if (gb > 0) { a->rd_bytes += bytes; a->rd_sec += bytes / (gb * 1e9); }
                    if (gd > 0) { a->rdd_bytes += bytes; a->rdd_sec += bytes / (gd * 1e9); }
                }
                if (!use_gpu) {
                    cfg_acc *a = get_acc(1, t, 1, -1);
                    a->ranks++;
                    if (gb > 0) { a->rd_bytes += bytes; a->rd_sec += bytes / (gb * 1e9); }
                    if (gd > 0) { a->rdd_bytes += bytes; a->rdd_sec += bytes / (gd * 1e9); }
                }
            }
        }
        blob_free(b);
    }
    if (use_gpu) {
        const double h2 = h2d_rate(max_t);
        if (h2 > h2d) h2d = h2;
    }

    printf("\nLoad of TP rank blobs, one at a time, to GPU 0 (%d blob(s) given; cold = %s before every measurement)\n",
           n_blobs, drop_how);
    printf("H2D ceiling (best of 1 stream x 256 MiB and %u streams x 16 MiB, pinned, measured before and after): %.1f GB/s\n",
           max_t, h2d);
    printf("read ceiling = parallel pread of the same data region, same threads, pinned 16 MiB buffers, no hash; "
           "cold: best of buffered and O_DIRECT\n");
    printf("ratio = load GB/s / min(H2D, read); load = loader's timer; e2e = the whole call (cudaMalloc, pinned "
           "buffers, threads)\n\n");
    printf("| cache | threads | checksums | O_DIRECT | ranks | GB | load GB/s | e2e GB/s | read GB/s | H2D GB/s | ratio | ratio e2e |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (int i = 0; i < n_acc; i++) {
        const cfg_acc *a = &acc[i];
        double rd = a->rd_sec > 0 ? a->rd_bytes / a->rd_sec / 1e9 : 0;
        const double rdd = a->rdd_sec > 0 ? a->rdd_bytes / a->rdd_sec / 1e9 : 0;
        if (rdd > rd) rd = rdd;
        if (a->direct < 0) {
            printf("| %s | %u | - | - | %u | %.2f | - | - | %.2f (buffered %.2f, O_DIRECT %.2f) | - | - | - |\n",
                   a->cold ? "cold" : "warm", a->threads, a->ranks, a->rd_bytes / 1e9, rd,
                   a->rd_sec > 0 ? a->rd_bytes / a->rd_sec / 1e9 : 0, rdd);
            continue;
        }
        const double ld = a->bytes / a->sec / 1e9, le = a->bytes / a->sec_e2e / 1e9;
        const double ceil = rd < h2d ? rd : h2d;
        printf("| %s | %u | %s | %s | %u | %.2f | %.2f | %.2f | %.2f | %.1f | %.3f | %.3f |\n",
               a->cold ? "cold" : "warm", a->threads, a->verify ? "on" : "off", a->direct ? "on" : "off",
               a->ranks, a->bytes / 1e9, ld, le, rd, h2d, ceil > 0 ? ld / ceil : 0, ceil > 0 ? le / ceil : 0);
    }
    printf("\nbench_load: %.1f s%s\n", now_s() - t_start, over_budget() ? " (budget reached: some cold rows skipped)" : "");
    return 0;
}
