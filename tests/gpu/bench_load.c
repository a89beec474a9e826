/* Blob -> GPU load rate (runtime/gpu/gpu_load.h) against the two ceilings measured in the same run:
 * pinned host-to-device copies (cudaMemcpyAsync from pinned memory) and a parallel read of the
 * same blob's data region with the same number of threads (pread into pinned buffers, no hash,
 * no GPU), best of three read patterns: the blob's 64 MiB chunks as work items (16 MiB preads),
 * 16 MiB items and slot-sized (2 MiB) items handed out in turn. Ratio = load GB/s /
 * min(H2D, read). Warm = the blob is in the page cache; cold = caches dropped before every
 * measurement (root: sync + /proc/sys/vm/drop_caches; otherwise posix_fadvise DONTNEED, which
 * is said in the output).
 *
 *   bench_load [--threads 4,8,16] [--cold-threads 4,16] [--warm-ranks N] [--cold-ranks N]
 *              [--reps N] [--budget SECONDS] [--no-warm] [--no-cold] [--no-gpu] BLOB...
 *
 * Rows: "load" = the loader's own timer (first read to last copy done: the steady state, a
 * loader made beforehand); "call" = the whole rt_gpu_loader_load call plus cudaFree of the
 * result. The e2e rows time a process's whole load as glm5-run does it: rt_gpu_load_blob for
 * every rank in turn (its first call pins the ring) then rt_gpu_load_release, against the sum
 * of the ceilings' times for the same ranks. Warm rows also try other rings and no helping at
 * the largest thread count. --no-gpu measures only the reads (malloc'd buffers). Per-measurement
 * lines go to stderr; the table to stdout. */
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
#include "runtime/gpu/gpu_load.h"

#define MAX_T 64
#define MAX_ROWS 96
#define MAX_BLOBS 64
#define MiB (1ull << 20)

#define BENCH_EXIT 3
#include "tests/gpu/bench_util.h"

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

/* ---- the read ceiling: parallel preads of the data region, no hashing, no copies ---- */

typedef struct rd_shared {
    int fd;
    int direct;
    uint64_t data_offset, data_size, item, piece, n_items;
    atomic_uint_fast64_t next;
    atomic_int failed;
} rd_shared;

typedef struct rd_thread {
    rd_shared *s;
    uint8_t *buf[2];
} rd_thread;

static void *rd_main(void *arg) {
    rd_thread *th = arg;
    rd_shared *s = th->s;
    uint64_t slot = 0;
    for (;;) {
        const uint64_t ci = atomic_fetch_add(&s->next, 1);
        if (ci >= s->n_items || atomic_load(&s->failed)) break;
        const uint64_t c0 = ci * s->item;
        const uint64_t c1 = c0 + s->item < s->data_size ? c0 + s->item : s->data_size;
        for (uint64_t p = c0; p < c1; p += s->piece) {
            uint64_t len = c1 - p < s->piece ? c1 - p : s->piece;
            if (s->direct) len = (len + 4095) / 4096 * 4096;
            uint8_t *b = th->buf[slot++ % 2];
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

/* Two 16 MiB buffers per reader, pinned (malloc'd with --no-gpu) once for the whole run:
 * pinning 512 MiB costs more than a warm read of a rank. */
#define RD_BUF (16 * MiB)
static uint8_t *rd_pool[MAX_T][2];
static uint8_t *rd_buf(uint32_t i, int k) {
    if (!rd_pool[i][k]) {
        if (use_gpu) CK(cudaHostAlloc((void **)&rd_pool[i][k], RD_BUF, cudaHostAllocDefault));
        else if (posix_memalign((void **)&rd_pool[i][k], 4096, RD_BUF)) exit(2);
        memset(rd_pool[i][k], 0, RD_BUF); /* fault the pages in before timing */
    }
    return rd_pool[i][k];
}

/* GB/s of reading b's data region with nt threads taking `item`-byte work items in turn, each
 * read in `piece`-byte preads into two alternating buffers per thread; negative on failure. */
static double read_rate(const blob *b, uint32_t nt, int direct, uint64_t item, uint64_t piece) {
    const blob_info *in = blob_get_info(b);
    if (piece > item) piece = item;
    if (piece > RD_BUF) piece = RD_BUF;
    rd_shared s = {.direct = direct, .data_offset = in->data_offset, .data_size = in->data_size, .item = item,
                   .piece = piece, .n_items = (in->data_size + item - 1) / item};
    atomic_init(&s.next, 0);
    atomic_init(&s.failed, 0);
    s.fd = open(blob_get_path(b), O_RDONLY | (direct ? O_DIRECT : 0));
    if (s.fd < 0) return -1;
    if (nt > s.n_items) nt = (uint32_t)s.n_items;
    rd_thread th[MAX_T];
    pthread_t tid[MAX_T];
    for (uint32_t i = 0; i < nt; i++) {
        th[i].s = &s;
        th[i].buf[0] = rd_buf(i, 0);
        th[i].buf[1] = rd_buf(i, 1);
    }
    const double t0 = now_s();
    for (uint32_t i = 0; i < nt; i++)
        if (pthread_create(&tid[i], NULL, rd_main, &th[i])) exit(2);
    for (uint32_t i = 0; i < nt; i++) pthread_join(tid[i], NULL);
    const double dt = now_s() - t0;
    close(s.fd);
    if (atomic_load(&s.failed)) {
        fprintf(stderr, "bench_load: read of %s failed: %s\n", blob_get_path(b), strerror((int)atomic_load(&s.failed)));
        return -1;
    }
    return (double)in->data_size / dt / 1e9;
}

/* Best of reps x {64 MiB chunks, 16 MiB items, 2 MiB items}; prints each. */
static double read_ceiling(const blob *b, uint32_t t, int direct, int reps, const char *what, int rank) {
    const uint64_t chunk = blob_get_info(b)->chunk_size;
    const uint64_t items[3] = {chunk, 16 * MiB, 2 * MiB}, pieces[3] = {16 * MiB, 16 * MiB, 2 * MiB};
    double g[3] = {0, 0, 0}, best = 0;
    for (int v = 0; v < 3; v++)
        for (int k = 0; k < reps; k++) {
            const double r = read_rate(b, t, direct, items[v], pieces[v]);
            if (r > g[v]) g[v] = r;
        }
    for (int v = 0; v < 3; v++)
        if (g[v] > best) best = g[v];
    fprintf(stderr, "bench_load: rank %d %s read%s T=%u: chunks %.2f, 16 MiB items %.2f, 2 MiB items %.2f GB/s\n", rank,
            what, direct ? " O_DIRECT" : "", t, g[0], g[1], g[2]);
    return best;
}

/* ---- the H2D ceiling ---- */

/* One stream copying a 256 MiB pinned buffer, ns streams copying 16 MiB pieces and ns streams
 * copying slot-sized pieces (the loader's pattern), 4 GiB each; returns the best. */
static double h2d_rate(uint32_t ns, uint64_t slot) {
    const uint64_t total = 4ull << 30;
    uint8_t *dev = NULL;
    CK(cudaMalloc((void **)&dev, 1ull << 30));
    double best = 0;
    { /* one stream, big copies */
        uint8_t *h = NULL;
        CK(cudaHostAlloc((void **)&h, 256 * MiB, cudaHostAllocDefault));
        memset(h, 1, 256 * MiB);
        CK(cudaMemcpy(dev, h, 256 * MiB, cudaMemcpyHostToDevice));
        CK(cudaDeviceSynchronize());
        const double t0 = now_s();
        for (uint64_t p = 0; p < total; p += 256 * MiB)
            CK(cudaMemcpyAsync(dev + p % (1ull << 30), h, 256 * MiB, cudaMemcpyHostToDevice, 0));
        CK(cudaDeviceSynchronize());
        const double r = (double)total / (now_s() - t0) / 1e9;
        fprintf(stderr, "bench_load: H2D one stream 256 MiB copies: %.1f GB/s\n", r);
        if (r > best) best = r;
        CK(cudaFreeHost(h));
    }
    const uint64_t sizes[2] = {16 * MiB, slot};
    for (int v = 0; v < 2; v++) {
        const uint64_t sz = sizes[v];
        cudaStream_t st[MAX_T];
        uint8_t *h[MAX_T];
        for (uint32_t i = 0; i < ns; i++) {
            CK(cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking));
            CK(cudaHostAlloc((void **)&h[i], sz, cudaHostAllocDefault));
            memset(h[i], 1, sz);
        }
        CK(cudaDeviceSynchronize());
        const double t0 = now_s();
        uint64_t k = 0;
        for (uint64_t p = 0; p + sz <= total; p += sz, k++)
            CK(cudaMemcpyAsync(dev + p % (1ull << 30), h[k % ns], sz, cudaMemcpyHostToDevice, st[k % ns]));
        CK(cudaDeviceSynchronize());
        const double r = (double)(k * sz) / (now_s() - t0) / 1e9;
        fprintf(stderr, "bench_load: H2D %u streams %llu KiB copies: %.1f GB/s\n", ns, (unsigned long long)(sz >> 10), r);
        if (r > best) best = r;
        for (uint32_t i = 0; i < ns; i++) {
            CK(cudaFreeHost(h[i]));
            CK(cudaStreamDestroy(st[i]));
        }
    }
    CK(cudaFree(dev));
    return best;
}

/* ---- loader configurations and results ---- */

typedef struct cfg {
    const char *label;
    uint32_t threads;
    uint64_t buf, rd;            /* 0: defaults */
    int no_help;
    rt_gpu_loader *ld;
} cfg;

typedef struct row {
    char what[48];               /* "load", "e2e" */
    int cold;
    uint32_t threads;
    char label[40];
    int verify;
    uint32_t ranks;
    double bytes, sec, sec_call; /* loads (sec: the loader's timer, sec_call: the whole call) */
    double rd_sec;               /* the read ceiling's time for the same bytes */
    double helped;
} row;

static row rows[MAX_ROWS];
static int n_rows;

static row *get_row(const char *what, int cold, uint32_t t, const char *label, int verify) {
    for (int i = 0; i < n_rows; i++)
        if (!strcmp(rows[i].what, what) && rows[i].cold == cold && rows[i].threads == t && !strcmp(rows[i].label, label) &&
            rows[i].verify == verify)
            return &rows[i];
    if (n_rows == MAX_ROWS) exit(2);
    row *r = &rows[n_rows++];
    memset(r, 0, sizeof *r);
    snprintf(r->what, sizeof r->what, "%s", what);
    snprintf(r->label, sizeof r->label, "%s", label);
    r->cold = cold;
    r->threads = t;
    r->verify = verify;
    return r;
}

static rt_gpu_loader *cfg_loader(cfg *c) {
    if (c->ld) return c->ld;
    rt_gpu_load_opts o;
    rt_gpu_load_opts_default(&o);
    o.n_threads = c->threads;
    o.buf_bytes = c->buf;
    o.read_bytes = c->rd;
    g5_error e = {0};
    if (rt_gpu_loader_create(0, &o, &c->ld, &e)) {
        fprintf(stderr, "bench_load: loader %s T=%u: %s\n", c->label, c->threads, e.msg);
        exit(3);
    }
    fprintf(stderr, "bench_load: loader %s T=%u made in %.3f s\n", c->label, c->threads, rt_gpu_loader_setup_seconds(c->ld));
    return c->ld;
}

/* One load with configuration c; returns its stats (exits on failure). */
static rt_gpu_load_stats one_load(const blob *b, cfg *c, int verify, double *call_s, int rank, int cold) {
    rt_gpu_loader *ld = cfg_loader(c);
    rt_gpu_load_opts o;
    rt_gpu_load_opts_default(&o);
    o.verify = verify;
    o.no_help = c->no_help;
    void *dev = NULL;
    rt_gpu_load_stats st;
    g5_error e = {0};
    const double t0 = now_s();
    g5_status s = rt_gpu_loader_load(ld, b, 0, &o, &dev, &st, &e);
    if (!s) CK(cudaFree(dev));
    *call_s = now_s() - t0;
    if (s) {
        fprintf(stderr, "bench_load: load of %s failed: %s\n", blob_get_path(b), e.msg);
        exit(3);
    }
    fprintf(stderr, "bench_load: rank %d %s %s T=%u verify=%d: %.3f GB, loader %.4f s (%.2f GB/s), call %.4f s, "
            "%.0f MB helped, %llu reads\n", rank, cold ? "cold" : "warm", c->label, st.n_threads, verify, st.bytes / 1e9,
            st.seconds, st.gb_per_s, *call_s, st.helped_bytes / 1e6, (unsigned long long)st.buffered_reads + st.direct_reads);
    return st;
}

/* Best of reps loads into row (label c->label, verify), against the read ceiling rd GB/s. */
static void measure(const blob *b, cfg *c, int verify, int reps, double rd, int rank, int cold) {
    double bs = 1e30, bc = 1e30, helped = 0;
    const double bytes = (double)blob_get_info(b)->data_size;
    for (int k = 0; k < reps; k++) {
        double call;
        const rt_gpu_load_stats st = one_load(b, c, verify, &call, rank, cold);
        if (st.seconds < bs) {
            bs = st.seconds;
            helped = (double)st.helped_bytes;
        }
        if (call < bc) bc = call;
    }
    row *r = get_row("load", cold, c->threads, c->label, verify);
    r->ranks++;
    r->bytes += bytes;
    r->sec += bs;
    r->sec_call += bc;
    r->rd_sec += rd > 0 ? bytes / (rd * 1e9) : 0;
    r->helped += helped;
}

/* A process's load of blobs [0, n) as glm5-run does it (rt_gpu_load_blob, the process's loader
 * made by the first call, released at the end), with the given threads; rd_sec: the ceiling's
 * time for the same bytes. */
static const char *pin_name(int pin) {
    return pin == RT_PIN_AUTO ? "auto" : pin == RT_PIN_REGISTER ? "huge pages + cudaHostRegister"
         : pin == RT_PIN_ALLOC ? "cudaHostAlloc" : "cudaHostAlloc per reader, in parallel";
}

static void e2e_pass(blob **bs, int n, uint32_t t, double rd_sec, int cold, int pin) {
    rt_gpu_load_opts o;
    rt_gpu_load_opts_default(&o);
    o.n_threads = t;
    o.pin = pin;
    double bytes = 0, loader_s = 0, setup = 0;
    int used = pin;
    if (cold)
        for (int i = 0; i < n; i++) drop_cache(blob_get_path(bs[i]));
    const double t0 = now_s();
    for (int i = 0; i < n; i++) {
        void *dev = NULL;
        rt_gpu_load_stats st;
        g5_error e = {0};
        if (rt_gpu_load_blob(bs[i], 0, &o, &dev, &st, &e)) {
            fprintf(stderr, "bench_load: e2e load of %s failed: %s\n", blob_get_path(bs[i]), e.msg);
            exit(3);
        }
        CK(cudaFree(dev));
        bytes += (double)st.bytes;
        loader_s += st.seconds;
        setup += st.setup_seconds;
        used = st.pin;
    }
    rt_gpu_load_release();
    const double dt = now_s() - t0;
    fprintf(stderr, "bench_load: e2e %s T=%u pin=%s (%s): %d ranks, %.2f GB in %.3f s (loader setup %.3f s, loaders' timers %.3f s)\n",
            cold ? "cold" : "warm", t, pin_name(pin), pin_name(used), n, bytes / 1e9, dt, setup, loader_s);
    char label[40];
    snprintf(label, sizeof label, "pin %s", pin == RT_PIN_AUTO ? "auto (default)" : pin == RT_PIN_REGISTER ? "register"
             : pin == RT_PIN_ALLOC ? "alloc" : "alloc parallel");
    row *r = get_row("e2e", cold, t, label, 1);
    r->ranks += (uint32_t)n;
    r->bytes += bytes;
    r->sec += loader_s;
    r->sec_call += dt;
    r->rd_sec += rd_sec;
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

/* Pinning the default ring each way (gpu_load.h, RT_PIN_*), each made and freed once. */
static void setup_bench(uint32_t t) {
    for (int pin = RT_PIN_REGISTER; pin <= RT_PIN_ALLOC_PARALLEL; pin++) {
        rt_gpu_load_opts o;
        rt_gpu_load_opts_default(&o);
        o.n_threads = t;
        o.pin = pin;
        rt_gpu_loader *ld = NULL;
        g5_error e = {0};
        const double t0 = now_s();
        g5_status s = rt_gpu_loader_create(0, &o, &ld, &e);
        const double t1 = now_s();
        rt_gpu_loader_free(ld);
        const double t2 = now_s();
        if (s) fprintf(stderr, "bench_load: setup pin=%d: %s\n", pin, e.msg);
        else fprintf(stderr, "bench_load: setup pin=%d (%s) T=%u: make %.3f s, free %.3f s\n", pin, pin_name(pin), t,
                     t1 - t0, t2 - t1);
    }
}

int main(int argc, char **argv) {
    uint32_t warm_t[8] = {4, 8, 16}, cold_t[8] = {4, 16};
    int n_warm_t = 3, n_cold_t = 2, reps = 2, do_warm = 1, do_cold = 1, cold_ranks = 2, warm_ranks = 4;
    int ai = 1;
    for (; ai < argc && argv[ai][0] == '-'; ai++) {
        const char *a = argv[ai], *v = ai + 1 < argc ? argv[ai + 1] : NULL;
        if (!strcmp(a, "--threads") && v) { n_warm_t = parse_list(v, warm_t, 8); ai++; }
        else if (!strcmp(a, "--cold-threads") && v) { n_cold_t = parse_list(v, cold_t, 8); ai++; }
        else if (!strcmp(a, "--cold-ranks") && v) { cold_ranks = atoi(v); ai++; }
        else if (!strcmp(a, "--warm-ranks") && v) { warm_ranks = atoi(v); ai++; }
        else if (!strcmp(a, "--reps") && v) { reps = atoi(v); ai++; }
        else if (!strcmp(a, "--budget") && v) { budget_s = atof(v); ai++; }
        else if (!strcmp(a, "--no-warm")) do_warm = 0;
        else if (!strcmp(a, "--no-cold")) do_cold = 0;
        else if (!strcmp(a, "--no-gpu")) use_gpu = 0;
        else { fprintf(stderr, "bench_load: unknown option %s\n", a); return 2; }
        if (n_warm_t < 0 || n_cold_t < 0 || reps < 1) { fprintf(stderr, "bench_load: bad %s\n", a); return 2; }
    }
    const int n_blobs = argc - ai;
    if (n_blobs < 1 || n_blobs > MAX_BLOBS) {
        fprintf(stderr, "usage: bench_load [--threads 4,8,16] [--cold-threads 4,16] [--warm-ranks N] [--cold-ranks N] [--reps N] "
                        "[--budget S] [--no-warm] [--no-cold] [--no-gpu] BLOB... (at most %d)\n", MAX_BLOBS);
        return 2;
    }
    t_start = now_s();
    const long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    const uint32_t t_def = ncpu < 1 ? 4 : ncpu > 16 ? 16 : (uint32_t)ncpu; /* the loader's default (gpu_load.h) */
    uint32_t max_t = t_def;
    for (int i = 0; i < n_warm_t; i++) if (warm_t[i] > max_t) max_t = warm_t[i];
    for (int i = 0; i < n_cold_t; i++) if (cold_t[i] > max_t) max_t = cold_t[i];
    double h2d = 0;
    if (use_gpu) {
        CK(cudaFree(0)); /* context creation outside every timing */
        struct cudaDeviceProp p;
        CK(cudaGetDeviceProperties(&p, 0));
        fprintf(stderr, "bench_load: device %s, %ld CPUs, default readers %u\n", p.name, ncpu, t_def);
        h2d = h2d_rate(max_t, 2 * MiB);
        setup_bench(t_def);
    }
    blob *bs[MAX_BLOBS];
    double warm_rd_def[MAX_BLOBS], cold_rd_def[MAX_BLOBS]; /* ceilings at the default threads */
    for (int r = 0; r < n_blobs; r++) {
        g5_error e = {0};
        if (blob_open(argv[ai + r], &bs[r], &e)) {
            fprintf(stderr, "bench_load: %s\n", e.msg);
            return 3;
        }
        warm_rd_def[r] = cold_rd_def[r] = 0;
    }
    /* Configurations: per thread count the default ring; at the largest, other rings and no help. */
    cfg cfgs[32];
    int n_cfg = 0;
    uint32_t tmax_warm = 0;
    for (int i = 0; i < n_warm_t; i++) {
        cfgs[n_cfg++] = (cfg){"default", warm_t[i], 0, 0, 0, NULL};
        if (warm_t[i] > tmax_warm) tmax_warm = warm_t[i];
    }
    const int first_variant = n_cfg;
    cfgs[n_cfg++] = (cfg){"no help", tmax_warm, 0, 0, 1, NULL};
    cfgs[n_cfg++] = (cfg){"8M slots, 1M reads", tmax_warm, 8 * MiB, 1 * MiB, 0, NULL};
    cfgs[n_cfg++] = (cfg){"1M slots, 256K reads", tmax_warm, 1 * MiB, 256 << 10, 0, NULL};
    cfgs[n_cfg++] = (cfg){"2M slots, 2M reads", tmax_warm, 2 * MiB, 2 * MiB, 0, NULL};
    const int n_variants = n_cfg - first_variant;

    if (do_warm) {
        for (int r = 0; r < n_blobs && r < warm_ranks && !over_budget(); r++) {
            const blob *b = bs[r];
            const int rank = (int)blob_get_info(b)->rank;
            read_rate(b, 16, 0, 16 * MiB, 16 * MiB); /* untimed: bring the whole data region into the page cache */
            double rd_max = 0;
            for (int ti = 0; ti < n_warm_t; ti++) {
                const uint32_t t = warm_t[ti];
                const double rd = read_ceiling(b, t, 0, reps, "warm", rank);
                if (t == t_def) warm_rd_def[r] = rd;
                if (t == tmax_warm) rd_max = rd;
                if (!use_gpu) {
                    row *w = get_row("read only", 0, t, "-", 0);
                    w->ranks++;
                    w->bytes += (double)blob_get_info(b)->data_size;
                    w->rd_sec += (double)blob_get_info(b)->data_size / (rd * 1e9);
                    continue;
                }
                for (int v = 1; v >= 0; v--) measure(b, &cfgs[ti], v, reps, rd, rank, 0);
            }
            for (int k = 0; k < n_variants && use_gpu; k++) measure(b, &cfgs[first_variant + k], 1, reps, rd_max, rank, 0);
        }
        /* the process's view: every rank (those not measured above get their ceiling now) */
        if (use_gpu && !over_budget()) {
            double rd_sec = 0;
            for (int r = 0; r < n_blobs; r++) {
                if (warm_rd_def[r] <= 0) {
                    read_rate(bs[r], 16, 0, 16 * MiB, 16 * MiB);
                    warm_rd_def[r] = read_ceiling(bs[r], t_def, 0, 1, "warm", (int)blob_get_info(bs[r])->rank);
                }
                rd_sec += (double)blob_get_info(bs[r])->data_size / (warm_rd_def[r] * 1e9);
            }
            for (int k = 0; k < reps; k++) e2e_pass(bs, n_blobs, t_def, rd_sec, 0, RT_PIN_AUTO);
            for (int pin = RT_PIN_REGISTER; pin <= RT_PIN_ALLOC_PARALLEL && !over_budget(); pin++)
                e2e_pass(bs, n_blobs, t_def, rd_sec, 0, pin);
        }
    }
    for (int i = 0; i < n_cfg; i++) rt_gpu_loader_free(cfgs[i].ld), cfgs[i].ld = NULL;

    if (do_cold) {
        cfg ccfg[8];
        for (int ti = 0; ti < n_cold_t; ti++) ccfg[ti] = (cfg){"default", cold_t[ti], 0, 0, 0, NULL};
        for (int r = 0; r < n_blobs && r < cold_ranks; r++) {
            const blob *b = bs[r];
            const int rank = (int)blob_get_info(b)->rank;
            const double bytes = (double)blob_get_info(b)->data_size;
            for (int ti = 0; ti < n_cold_t && !over_budget(); ti++) {
                const uint32_t t = cold_t[ti];
                drop_cache(blob_get_path(b));
                const double gb = read_rate(b, t, 0, 16 * MiB, 16 * MiB);
                drop_cache(blob_get_path(b));
                const double gd = read_rate(b, t, 1, 16 * MiB, 16 * MiB);
                const double rd = gb > gd ? gb : gd;
                if (t == t_def) cold_rd_def[r] = rd;
                fprintf(stderr, "bench_load: rank %d cold read T=%u (16 MiB items): buffered %.2f GB/s, O_DIRECT %.2f GB/s (%s)\n",
                        rank, t, gb, gd, drop_how);
                if (!use_gpu) {
                    row *w = get_row("read only", 1, t, "-", 0);
                    w->ranks++;
                    w->bytes += bytes;
                    w->rd_sec += bytes / (rd * 1e9);
                    continue;
                }
                for (int v = 1; v >= 0 && !over_budget(); v--) {
                    drop_cache(blob_get_path(b));
                    measure(b, &ccfg[ti], v, 1, rd, rank, 1);
                }
            }
        }
        for (int ti = 0; ti < n_cold_t; ti++) rt_gpu_loader_free(ccfg[ti].ld);
        /* the process's view, cold: the ranks whose cold ceiling at the default threads was measured */
        int nc = 0;
        double rd_sec = 0;
        while (nc < n_blobs && cold_rd_def[nc] > 0) {
            rd_sec += (double)blob_get_info(bs[nc])->data_size / (cold_rd_def[nc] * 1e9);
            nc++;
        }
        if (use_gpu && nc > 0 && !over_budget()) e2e_pass(bs, nc, t_def, rd_sec, 1, RT_PIN_AUTO);
    }
    for (int r = 0; r < n_blobs; r++) blob_free(bs[r]);
    if (use_gpu) {
        const double h2 = h2d_rate(max_t, 2 * MiB);
        if (h2 > h2d) h2d = h2;
    }

    printf("\nLoad of TP rank blobs, one at a time, to GPU 0 (%d blob(s) given; cold = %s before every measurement)\n",
           n_blobs, drop_how);
    printf("H2D ceiling (best of 1 stream x 256 MiB, %u streams x 16 MiB and x 2 MiB, pinned, measured before and after): "
           "%.1f GB/s\n", max_t, h2d);
    printf("read ceiling = parallel pread of the same data region, same threads, no hash; warm: best of 64 MiB chunks, "
           "16 MiB and 2 MiB items; cold: best of buffered and O_DIRECT (16 MiB items)\n");
    printf("ratio = GB/s / min(H2D, read). load = the loader's timer (steady state: loader made beforehand); call = "
           "rt_gpu_loader_load + cudaFree; e2e rows = rt_gpu_load_blob on each rank in turn, ring pinned by the "
           "first call, then released (glm5-run's path), timed whole\n\n");
    printf("| what | cache | threads | ring | checksums | ranks | GB | load GB/s | call / e2e GB/s | helped | read GB/s | "
           "H2D GB/s | ratio load | ratio call / e2e |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (int i = 0; i < n_rows; i++) {
        const row *a = &rows[i];
        const double rd = a->rd_sec > 0 ? a->bytes / a->rd_sec / 1e9 : 0;
        if (!strcmp(a->what, "read only")) {
            printf("| read only | %s | %u | - | - | %u | %.2f | - | - | - | %.2f | - | - | - |\n", a->cold ? "cold" : "warm",
                   a->threads, a->ranks, a->bytes / 1e9, rd);
            continue;
        }
        const double ld = a->sec > 0 ? a->bytes / a->sec / 1e9 : 0, lc = a->sec_call > 0 ? a->bytes / a->sec_call / 1e9 : 0;
        const double ceil = rd < h2d ? rd : h2d;
        printf("| %s | %s | %u | %s | %s | %u | %.2f | %.2f | %.2f | %.0f%% | %.2f | %.1f | %.3f | %.3f |\n", a->what,
               a->cold ? "cold" : "warm", a->threads, a->label, a->verify ? "on" : "off", a->ranks, a->bytes / 1e9, ld, lc,
               a->bytes > 0 ? 100.0 * a->helped / a->bytes : 0, rd, h2d, ceil > 0 ? ld / ceil : 0, ceil > 0 ? lc / ceil : 0);
    }
    printf("\nbench_load: %.1f s%s\n", now_s() - t_start, over_budget() ? " (budget reached: some rows skipped)" : "");
    return 0;
}
