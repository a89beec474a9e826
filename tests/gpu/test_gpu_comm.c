/* The GPU model and the processes of a launch (runtime/gpu/gpu_coll.c; gpu_model.h, "Processes and
 * devices").
 *
 * One process (the GPU machine, `make test-gpu`): the placement rules' pure parts on made-up
 * devices (the same GPU found by UUID, or by host and PCI bus id where a device has no UUID) and
 * the vocabulary tiling check; then on the oracle converted here: a GPU model built on a CPU model
 * that has a single-process rt_comm gives bit-identical logits (prompt, all positions, then greedy
 * decode steps) to one built with comm NULL, for TP=1 and for TP=2 on one device (device-side
 * sum), with info.n_processes 1 and n_local_ranks = n_ranks; opts.collective NCCL runs TP=1
 * through a one-rank NCCL communicator (made by ncclGetUniqueId + ncclCommInitRank in a group,
 * the code path of several processes), logits within 1e-6 relative of the plain run and the same
 * greedy tokens.
 *
 * Several processes (`mpirun -np P build/gpu/tests/test_gpu_comm` on a build with MPI; no GPU is
 * needed, no CUDA call is made): the exchanges on a model stub whose one rank per process writes
 * uneven logits columns: the load report summed (seconds: the largest), the columns of every
 * process (checked to tile the vocabulary), logits gathered for one row (in place), a few rows
 * and more rows than one 32 MB exchange holds; then one process failing at the load agreement
 * fails them all, each other process naming it and its message; and a "whole" lm_head (process 0
 * writes every column). */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "convert/convert.h"
#include "runtime/cpu/comm.h"
#include "runtime/gpu/gpu_int.h"
#include "runtime/gpu/gpu_model.h"
#include "runtime/cpu/weights.h"
#include "tests/test_util.h"
#include "tests/gpu/oracle_blobs.h"

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        printf("FAIL: out of host memory (%zu bytes)\n", n);
        exit(2);
    }
    return p;
}

/* ---- pure parts ---- */

static void test_same_gpu(void) {
    gm_dev_id id[4];
    memset(id, 0, sizeof id);
    for (int i = 0; i < 4; i++) {
        id[i].uuid[0] = (uint8_t)(1 + i);
        snprintf(id[i].bus, sizeof id[i].bus, "0000:%02x:00.0", 0x10 + i);
        snprintf(id[i].host, sizeof id[i].host, "node%d", i / 2);
    }
    uint32_t a = 99, b = 99;
    T_CHECK(!gm_coll_same_gpu(id, 4, &a, &b), "distinct UUIDs: found %u/%u", a, b);
    id[3].uuid[0] = id[1].uuid[0];
    T_CHECK(gm_coll_same_gpu(id, 4, &a, &b) && a == 1 && b == 3, "same UUID: %u/%u", a, b);
    /* one process per GPU, each seeing only its own: bus ids repeat across nodes, UUIDs do not */
    for (int i = 0; i < 4; i++) {
        id[i].uuid[0] = (uint8_t)(1 + i);
        snprintf(id[i].bus, sizeof id[i].bus, "0000:10:00.0");
    }
    T_CHECK(!gm_coll_same_gpu(id, 4, &a, &b), "same bus id, distinct UUIDs");
    for (int i = 0; i < 4; i++) memset(id[i].uuid, 0, 16);
    T_CHECK(gm_coll_same_gpu(id, 4, &a, &b) && a == 0 && b == 1, "no UUID, same host and bus: %u/%u", a, b);
    for (int i = 0; i < 4; i++) snprintf(id[i].bus, sizeof id[i].bus, "0000:%02x:00.0", 0x10 + i % 2);
    T_CHECK(!gm_coll_same_gpu(id, 4, &a, &b), "no UUID, the same bus ids on two hosts: %u/%u", a, b);
}

static void test_vocab_check(void) {
    g5_error e = {0};
    const uint32_t lo[] = {0, 4, 7}, w[] = {4, 3, 3};
    T_CHECK(gm_coll_vocab_check(lo, w, 3, 10, &e) == G5_OK, "even tiling: %s", e.msg);
    const uint32_t lo1[] = {0, 0, 0}, w1[] = {10, 0, 0};
    T_CHECK(gm_coll_vocab_check(lo1, w1, 3, 10, &e) == G5_OK, "whole head on process 0: %s", e.msg);
    const uint32_t lo2[] = {0, 5, 7}, w2[] = {4, 2, 3};
    T_CHECK(gm_coll_vocab_check(lo2, w2, 3, 10, &e) == G5_ERR_MODEL, "gap refused");
    const uint32_t lo3[] = {0, 3, 7}, w3[] = {4, 4, 3};
    T_CHECK(gm_coll_vocab_check(lo3, w3, 3, 10, &e) == G5_ERR_MODEL, "overlap refused");
    const uint32_t lo4[] = {0, 4, 0}, w4[] = {4, 3, 0};
    T_CHECK(gm_coll_vocab_check(lo4, w4, 3, 10, &e) == G5_ERR_MODEL && strstr(e.msg, "7 logits columns of 10"),
            "short: %s", e.msg);
    const uint32_t lo5[] = {4, 0}, w5[] = {6, 4};
    T_CHECK(gm_coll_vocab_check(lo5, w5, 2, 10, &e) == G5_ERR_MODEL, "out of process order refused");
}

/* ---- several processes: the exchanges on a stub ---- */

static float val(uint32_t t, uint32_t col) { return (float)t * 0.5f + (float)col + 0.25f; }

/* rows x V logits holding process p's columns only (the rest NaN), gathered, compared. */
static void gather_case(rt_gpu_model *g, uint32_t rows, uint32_t lo, uint32_t w, const char *what) {
    const uint32_t V = g->hp.n_vocab;
    float *lg = xmalloc((size_t)rows * V * sizeof *lg);
    for (uint64_t i = 0; i < (uint64_t)rows * V; i++) lg[i] = NAN;
    for (uint32_t t = 0; t < rows; t++)
        for (uint32_t c = lo; c < lo + w; c++) lg[(size_t)t * V + c] = val(t, c);
    g5_error e = {0};
    g5_status st = gm_coll_gather_logits(g, lg, rows, &e);
    T_CHECK(st == G5_OK, "%s: gather: %s", what, e.msg);
    uint64_t bad = 0, first = 0;
    for (uint32_t t = 0; t < rows && !st; t++)
        for (uint32_t c = 0; c < V; c++)
            if (lg[(size_t)t * V + c] != val(t, c) && !bad++) first = (uint64_t)t * V + c;
    T_CHECK(bad == 0, "%s: %llu of %llu values wrong, the first at row %llu column %llu", what, (unsigned long long)bad,
            (unsigned long long)rows * V, (unsigned long long)(first / V), (unsigned long long)(first % V));
    free(lg);
}

static void test_processes(rt_comm *c) {
    const uint32_t P = rt_comm_size(c), p = rt_comm_rank(c);
    /* process q writes w_q = base + 3 q columns: uneven widths, odd V */
    const uint32_t base = 9973;
    uint32_t V = 0, lo = 0;
    for (uint32_t q = 0; q < P; q++) {
        if (q == p) lo = V;
        V += base + 3 * q;
    }
    const uint32_t w = base + 3 * p;
    rt_gpu_model g;
    memset(&g, 0, sizeof g);
    gl_rank rk;
    memset(&rk, 0, sizeof rk);
    rk.head_write = 1;
    rk.head_col0 = lo;
    rk.head.m = w;
    g.comm = c;
    g.hp.n_vocab = V;
    g.T = 1;
    g.T_all = P;
    g.first = p;
    g.rk = &rk;
    g.info.load.bytes = 1000 + p;
    g.info.load.direct_reads = 1;
    g.info.load.buffered_reads = 2 * p;
    g.info.load.seconds = p == 0 ? 5.0 + P : 1.0 + p; /* the slowest is not the last */
    g.info.load.verified = 1;
    g.info.weight_bytes = 10 * (p + 1);
    g.info.extra_bytes = 3;
    g5_error e = {0};
    g5_status st = gm_coll_agree_load(&g, G5_OK, &e);
    T_CHECK(st == G5_OK, "agree_load: %s", e.msg);
    if (st) return;
    uint64_t want_bytes = 0, want_w = 0, want_buf = 0;
    for (uint32_t q = 0; q < P; q++) {
        want_bytes += 1000 + q;
        want_w += 10 * (q + 1);
        want_buf += 2 * q;
    }
    T_CHECK(g.info.load.bytes == want_bytes && g.info.weight_bytes == want_w && g.info.extra_bytes == 3ull * P &&
                g.info.load.direct_reads == P && g.info.load.buffered_reads == want_buf,
            "sums: bytes %llu weights %llu extras %llu reads %llu/%llu", (unsigned long long)g.info.load.bytes,
            (unsigned long long)g.info.weight_bytes, (unsigned long long)g.info.extra_bytes,
            (unsigned long long)g.info.load.direct_reads, (unsigned long long)g.info.load.buffered_reads);
    T_CHECK(g.info.load.seconds == 5.0 + P && g.info.load.verified == 1, "seconds %.1f (the slowest: %.1f), verified %d",
            g.info.load.seconds, 5.0 + P, g.info.load.verified);
    uint32_t acc = 0;
    for (uint32_t q = 0; q < P; q++) {
        T_CHECK(g.vcol[q] == acc && g.vcol[P + q] == base + 3 * q, "process %u's columns %u+%u", q, g.vcol[q], g.vcol[P + q]);
        acc += base + 3 * q;
    }
    gather_case(&g, 1, lo, w, "one row");
    gather_case(&g, 5, lo, w, "five rows");
    /* 32 MB / (V * 4) rows go in one exchange: 2.5 of those */
    const uint32_t chunk = (uint32_t)(((size_t)32 << 20) / ((size_t)V * 4));
    gather_case(&g, chunk * 2 + chunk / 2, lo, w, "several exchanges");

    /* one process fails: every process fails, naming it */
    const uint32_t bad = P - 1;
    g5_error e2 = {0};
    g5_status mine = G5_OK;
    if (p == bad) mine = g5_fail(&e2, G5_ERR_IO, "disk on fire at rank %u", p);
    st = gm_coll_agree_load(&g, mine, &e2);
    T_CHECK(st != G5_OK, "a failed process fails all");
    if (p == bad) {
        T_CHECK(st == G5_ERR_IO && strstr(e2.msg, "disk on fire"), "the failed process keeps its message: %s", e2.msg);
    } else {
        char want[64];
        snprintf(want, sizeof want, "process %u of %u failed", bad, P);
        T_CHECK(st == G5_ERR_IO && strstr(e2.msg, want) && strstr(e2.msg, "disk on fire"), "names process %u: %s", bad,
                e2.msg);
    }

    /* a whole lm_head on every rank: the first process writes all columns, the others none */
    rk.head_col0 = 0;
    rk.head.m = V;
    rk.head_write = p == 0;
    st = gm_coll_agree_load(&g, G5_OK, &e);
    T_CHECK(st == G5_OK, "whole head: %s", e.msg);
    if (!st) gather_case(&g, 3, 0, p == 0 ? V : 0, "whole head, three rows");
    free(g.vcol);
}

/* ---- one process on the GPU ---- */

/* Prompt 1 of the oracle (tests/gpu/run_device.sh's P1), first 40 tokens. */
static const int32_t k_prompt[] = {958, 523, 83,  303, 279, 530,  309,  1624, 578, 1571, 1040, 299, 350, 387,
                                   71,  25,  277, 640, 488, 304,  384,  713,  643, 468,  11,   277, 1013, 290,
                                   870, 468, 1316, 65, 496, 840,  11,   277,  1646, 82,  468,  405};
enum { N_PROMPT = sizeof k_prompt / sizeof k_prompt[0], N_DECODE = 8 };

static uint32_t argmax(const float *x, uint32_t n) {
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* The prompt's logits at every position, then N_DECODE greedy steps' logits, into *lg
 * [N_PROMPT + N_DECODE][*V] (malloc'ed here); the tokens chosen into ids. 0 on failure
 * (reported). */
static rt_gpu_coll g_collective; /* what run() asks for */

static int run(const char *dir, rt_comm *comm, const char *label, float **lgp, uint32_t *Vp, int32_t *ids,
               rt_gpu_info *info) {
    g5_error e = {0};
    rt_wset *ws = NULL;
    rt_model *m = NULL;
    rt_gpu_model *g = NULL;
    int ok = 0;
    g5_status st = rt_wset_open_blobs(dir, &ws, &e);
    rt_model_opts mo = {.n_threads = 0, .mla = RT_MLA_ABSORBED, .comm = comm};
    if (!st) st = rt_model_create(ws, &mo, &m, &e);
    rt_gpu_opts go;
    rt_gpu_opts_default(&go);
    go.collective = g_collective;
    if (!st) go.blobs = rt_wset_blobs(rt_model_wset(m));
    if (!st) st = rt_gpu_model_create(m, &go, &g, &e);
    T_CHECK(st == G5_OK, "%s: create: %s", label, e.msg);
    if (st) goto out;
    *info = *rt_gpu_model_info(g);
    const uint32_t V = *Vp = rt_model_hparams(m)->n_vocab;
    float *lg = *lgp = xmalloc((size_t)(N_PROMPT + N_DECODE) * V * sizeof *lg);
    rt_gpu_outputs out = {.logits = lg, .all_logits = 1};
    st = rt_gpu_forward(g, k_prompt, N_PROMPT, &out, &e);
    for (uint32_t t = 0; t < N_DECODE && !st; t++) {
        const float *prev = lg + (size_t)(N_PROMPT - 1 + t) * V;
        ids[t] = (int32_t)argmax(prev, V);
        rt_gpu_outputs o1 = {.logits = lg + (size_t)(N_PROMPT + t) * V};
        st = rt_gpu_forward(g, &ids[t], 1, &o1, &e);
    }
    T_CHECK(st == G5_OK, "%s: forward: %s", label, e.msg);
    ok = !st;
    printf("%s: %u rank(s), %u local, %u process(es), %u device(s), collective %s\n", label, info->n_ranks,
           info->n_local_ranks, info->n_processes, info->n_devices, info->collective);
out:
    rt_gpu_model_free(g);
    rt_model_free(m);
    rt_wset_free(ws);
    return ok;
}

static double rel_l2(const float *a, const float *b, size_t n) {
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        r += (double)b[i] * b[i];
    }
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

static void test_gpu(rt_comm *comm) {
    struct stat sb;
    if (stat(T_ORACLE_GGUF, &sb) != 0) {
        T_CHECK(0, "oracle present at %s", T_ORACLE_GGUF);
        return;
    }
    const char *tmp = t_tmpdir();
    char dir[2][4200];
    for (uint32_t tp = 1; tp <= 2; tp++) {
        if (!t_oracle_blobs(tmp, tp, dir[tp - 1], sizeof dir[0])) {
            t_rmtree(tmp);
            return;
        }
    }
    const size_t rows = N_PROMPT + N_DECODE;
    int32_t ia[N_DECODE], ib[N_DECODE];
    rt_gpu_info ga, gb;
    for (uint32_t tp = 1; tp <= 2; tp++) {
        char la[64], lb[64];
        snprintf(la, sizeof la, "TP=%u, comm NULL", tp);
        snprintf(lb, sizeof lb, "TP=%u, single-process rt_comm", tp);
        float *a = NULL, *b = NULL;
        uint32_t Va = 0, Vb = 0;
        if (run(dir[tp - 1], NULL, la, &a, &Va, ia, &ga) && run(dir[tp - 1], comm, lb, &b, &Vb, ib, &gb)) {
            T_CHECK(ga.n_ranks == tp && ga.n_local_ranks == tp && ga.n_processes == 1 && gb.n_processes == 1 &&
                        gb.n_local_ranks == tp,
                    "TP=%u info: ranks %u/%u local %u/%u processes %u/%u", tp, ga.n_ranks, gb.n_ranks, ga.n_local_ranks,
                    gb.n_local_ranks, ga.n_processes, gb.n_processes);
            T_CHECK(!strcmp(ga.collective, tp == 1 ? "none" : "device-sum") && !strcmp(ga.collective, gb.collective),
                    "TP=%u collective %s / %s", tp, ga.collective, gb.collective);
            T_CHECK(Va == Vb && !memcmp(a, b, rows * Va * 4) && !memcmp(ia, ib, sizeof ia),
                    "TP=%u: comm NULL and single comm bit-identical", tp);
        }
        free(a);
        free(b);
    }
    /* the NCCL path on one GPU */
    float *a = NULL, *b = NULL;
    uint32_t Va = 0, Vb = 0;
    g_collective = RT_GPU_COLL_NCCL;
    const int rb = run(dir[0], comm, "TP=1, collective nccl", &b, &Vb, ib, &gb);
    g_collective = RT_GPU_COLL_AUTO;
    if (rb && run(dir[0], NULL, "TP=1, no collective", &a, &Va, ia, &ga)) {
        T_CHECK(!strcmp(gb.collective, "nccl"), "collective %s", gb.collective);
        const double rel = rel_l2(b, a, rows * Va);
        printf("one-rank NCCL vs none: logits rel L2 %.3e (%s)\n", rel,
               memcmp(a, b, rows * Va * 4) ? "not bit-identical" : "bit-identical");
        T_CHECK(rel <= 1e-6, "one-rank NCCL logits rel L2 %.3e", rel);
        T_CHECK(!memcmp(ia, ib, sizeof ia), "one-rank NCCL greedy tokens");
    }
    free(a);
    free(b);
    t_rmtree(tmp);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    rt_comm *comm = NULL;
    g5_error e = {0};
    rt_comm_env cenv;
    rt_comm_env_read(&cenv, getenv);
    g5_status st = rt_comm_create(&cenv, &argc, &argv, &comm, &e);
    T_CHECK(st == G5_OK, "rt_comm_create: %s", e.msg);
    if (st) return t_report("test_gpu_comm");
    test_same_gpu();
    test_vocab_check();
    if (rt_comm_size(comm) > 1) {
        test_processes(comm);
        char name[64];
        snprintf(name, sizeof name, "test_gpu_comm (process %u of %u)", rt_comm_rank(comm), rt_comm_size(comm));
        const int rc = t_report(name);
        rt_comm_free(comm);
        return rc;
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        T_CHECK(0, "a CUDA device");
    } else {
        test_gpu(comm);
    }
    rt_comm_free(comm);
    return t_report("test_gpu_comm");
}
