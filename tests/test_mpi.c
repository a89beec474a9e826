/* Several processes (runtime/cpu/comm.h): the single-process communicator; blob_set_open_ranks and
 * rt_wset_open_blobs_ranks with the other ranks' files absent; and, when mpirun is installed,
 * the oracle model converted to TP 2 and TP 4 and run by `mpirun -np P` (P = 2, 4, and 2 on the
 * TP 4 set: two ranks per process) against one process running the same set:
 *  - the model API (this program re-run as `test_mpi --worker`): forward with every output,
 *    a decode step, MTP draft logits, a batched decode, expanded MLA, a paged state; each
 *    process writes all it got, which must equal the one-process bytes (bit-identical, and
 *    complete on every process);
 *  - glm5-run: --ids greedy, --dump-logits, text and seeded sampling equal byte for byte to the
 *    one-process run (so printed once), each process given only its own ranks' files (MPMD),
 *    T % P != 0 and a GGUF refused with exit 2, a process missing its files named with its rank.
 * Without mpirun the launcher part prints "skipped: no mpirun"; with a build without MPI it
 * checks that glm5-run refuses to run under mpirun and skips the rest. */
#include <stdarg.h>
#include <sys/stat.h>

#include "convert/convert.h"
#include "format/blob.h"
#include "runtime/cpu/comm.h"
#include "runtime/cpu/model.h"
#include "runtime/cpu/weights.h"
#include "tests/test_util.h"

#define N_PROMPT 40 /* past the oracle's index_topk (32): the indexer's selection matters */

static const char *const g_launcher_env[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK",
                                             "SLURM_STEP_NUM_TASKS", "SLURM_PROCID"};

static void prompt_tokens(uint32_t n_vocab, int32_t *ids, uint32_t n, uint32_t seed) {
    uint64_t x = 0x9E3779B97F4A7C15ull ^ seed;
    for (uint32_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((x >> 33) % n_vocab);
    }
}

static int put(FILE *f, const void *p, size_t n) { return fwrite(p, 1, n, f) == n; }

/* Runs the fixed sequence of model calls and writes every output to f. 0 on success. */
static int scenario(rt_model *m, FILE *f, g5_error *e) {
    const glm5_hparams *hp = rt_model_hparams(m);
    const uint32_t V = hp->n_vocab, E = hp->n_embd, L = hp->n_layer_main, K = hp->idx_top_k, n = N_PROMPT;
    int32_t ids[N_PROMPT + 1], nxt[N_PROMPT];
    prompt_tokens(V, ids, n + 1, 1);
    float *logits = malloc((size_t)n * V * sizeof(float)), *hidden = malloc((size_t)n * E * sizeof(float));
    float *lh = malloc((size_t)(L + 1) * n * E * sizeof(float)), *draft = malloc((size_t)n * V * sizeof(float));
    int32_t *topk = malloc((size_t)L * n * K * sizeof(int32_t));
    rt_state *s = NULL, *s1 = NULL, *s2 = NULL, *s3 = NULL;
    rt_kvpool *pool = NULL;
    int ok = 0;
    if (!logits || !hidden || !lh || !draft || !topk) goto out;
    /* prompt with every output, one decode step */
    rt_outputs o = {.logits = logits, .all_logits = 1, .hidden = hidden, .layer_hidden = lh, .topk = topk};
    if (rt_state_create(m, &s, e) || rt_model_forward(m, s, ids, n, &o, e)) goto out;
    if (!put(f, logits, (size_t)n * V * 4) || !put(f, hidden, (size_t)n * E * 4) ||
        !put(f, lh, (size_t)(L + 1) * n * E * 4) || !put(f, topk, (size_t)L * n * K * 4))
        goto out;
    rt_outputs o1 = {.logits = logits};
    if (rt_model_forward(m, s, ids + n, 1, &o1, e) || !put(f, logits, (size_t)V * 4)) goto out;
    /* MTP: the prompt's hidden states with the tokens that follow them */
    if (rt_model_has_mtp(m)) {
        memcpy(nxt, ids + 1, n * sizeof *nxt);
        if (rt_model_mtp(m, s, hidden, nxt, n, draft, 1, e) || !put(f, draft, (size_t)n * V * 4)) goto out;
    }
    /* batched decode over two sequences of different lengths, in a paged pool */
    if (rt_kvpool_create(m, 16, 4, &pool, e) || rt_state_create_paged(m, pool, &s1, e) ||
        rt_state_create_paged(m, pool, &s2, e))
        goto out;
    if (rt_model_forward(m, s1, ids, 3, NULL, e) || rt_model_forward(m, s2, ids + 5, 9, NULL, e)) goto out;
    rt_state *const ss[2] = {s1, s2};
    const int32_t bt[2] = {ids[7], ids[8]};
    if (rt_model_forward_batch(m, ss, bt, 2, logits, e) || !put(f, logits, (size_t)2 * V * 4)) goto out;
    /* expanded MLA */
    rt_model_set_mla(m, RT_MLA_EXPANDED);
    rt_outputs o3 = {.logits = logits, .all_logits = 1};
    g5_status st = rt_state_create(m, &s3, e);
    if (!st) st = rt_model_forward(m, s3, ids, n, &o3, e);
    rt_model_set_mla(m, RT_MLA_ABSORBED);
    if (st || !put(f, logits, (size_t)n * V * 4)) goto out;
    ok = 1;
out:
    rt_state_free(s);
    rt_state_free(s1);
    rt_state_free(s2);
    rt_state_free(s3);
    rt_kvpool_free(pool);
    free(logits);
    free(hidden);
    free(lh);
    free(draft);
    free(topk);
    return ok ? 0 : 1;
}

/* test_mpi --worker DIR OUT: one process of `mpirun -np P`: its ranks of DIR, the scenario to
 * OUT.<process>. */
static int worker(int argc, char **argv) {
    rt_comm *c = NULL;
    rt_wset *ws = NULL;
    rt_model *m = NULL;
    g5_error e = {0};
    int rc = 1;
    rt_comm_env env;
    rt_comm_env_read(&env, getenv);
    if (rt_comm_create(&env, &argc, &argv, &c, &e)) {
        fprintf(stderr, "worker: %s\n", e.msg);
        return 1;
    }
    blob_set_record rec = {0};
    uint32_t first = 0, count = 0;
    char path[4200];
    snprintf(path, sizeof path, "%s.%u", argv[3], rt_comm_rank(c));
    FILE *f = NULL;
    if (!blob_set_record_read(argv[2], &rec, &e) && !rt_comm_ranks(c, rec.tp, &first, &count, &e) &&
        !rt_wset_open_blobs_ranks(argv[2], first, count, &ws, &e)) {
        rt_model_opts mo = {.n_threads = 1, .comm = c};
        if (!rt_model_create(ws, &mo, &m, &e) && rt_model_n_local(m) == count && rt_model_rank_first(m) == first &&
            rt_model_n_ranks(m) == rec.tp && rt_model_comm(m) == c && (f = fopen(path, "wb")))
            rc = scenario(m, f, &e);
    }
    if (f && fclose(f)) rc = 1;
    if (rc) fprintf(stderr, "worker %u: %s\n", rt_comm_rank(c), e.msg);
    blob_set_record_clear(&rec);
    rt_model_free(m);
    rt_wset_free(ws);
    rt_comm_free(c);
    return rc;
}

/* ---- helpers of the launching side ---- */

static char g_run[4096], g_self[4096], g_dir[4096];
static char g_mpirun[8192]; /* the launch prefix: environment and mpirun options */

/* Sanitizer builds: the launched processes run without LeakSanitizer. Its exit-time tracer
 * crashed in them ("Tracer caught signal 11", 1 to 7 of the 64 checks per run on a Debian 12 CI-like
 * machine, 2026-12-02, with Open MPI's own leaks suppressed by library), which is the sanitizer's
 * failure, not the program's; the same code runs leak-checked in the one-process tests, and ASan
 * and UBSan stay on in the launched processes. */
static void set_mpirun(void) {
    const char *asan = getenv("ASAN_OPTIONS");
    snprintf(g_mpirun, sizeof g_mpirun, "ASAN_OPTIONS='%s%sfast_unwind_on_malloc=0:detect_leaks=0' "
             "mpirun --oversubscribe --bind-to none",
             asan ? asan : "", asan && *asan ? ":" : "");
}

/* system() of a formatted command line; its exit status (-1 if it did not exit). */
static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
    char cmd[16384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char *slurp(const char *name) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    size_t n;
    uint8_t *b = t_read_file(path, &n);
    char *s = b ? realloc(b, n + 1) : NULL;
    if (s) s[n] = 0;
    else free(b);
    return s;
}

static int same(const char *a, const char *b) {
    char pa[4200], pb[4200];
    snprintf(pa, sizeof pa, "%s/%s", g_dir, a);
    snprintf(pb, sizeof pb, "%s/%s", g_dir, b);
    return t_file_equal(pa, pb);
}

/* A fake environment for rt_comm_env_read: "NAME=value" entries of g_fake_env. */
static const char *const *g_fake_env;
static char *fake_lookup(const char *name) {
    const size_t n = strlen(name);
    for (const char *const *p = g_fake_env; *p; p++)
        if (!strncmp(*p, name, n) && (*p)[n] == '=') return (char *)(*p + n + 1);
    return NULL;
}

static void env_checks(void) {
    static const struct { const char *vars[4]; int launched; unsigned long size; } k[] = {
        {{NULL}, 0, 0},
        {{"HOME=/root", "OMPI_COMM_WORLDX=4", NULL}, 0, 0},
        {{"OMPI_COMM_WORLD_SIZE=4", NULL}, 1, 4},
        {{"PMI_SIZE=3", NULL}, 1, 3},
        {{"SLURM_STEP_NUM_TASKS=2", "SLURM_PROCID=0", NULL}, 1, 2},
        {{"SLURM_PROCID=5", NULL}, 1, 6},
        {{"PMIX_RANK=0", NULL}, 1, 0},
        {{"OMPI_COMM_WORLD_SIZE=x", NULL}, 1, 0},
        {{"PMI_SIZE=", NULL}, 0, 0},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        g_fake_env = k[i].vars;
        rt_comm_env env = {.launched = 7, .size = 7};
        rt_comm_env_read(&env, fake_lookup);
        T_CHECK(env.launched == k[i].launched && env.size == k[i].size, "launcher env case %zu: launched %d size %lu",
                i, env.launched, env.size);
    }
}

static void unit_checks(void) {
    env_checks();
    g5_error e = {0};
    rt_comm *c = NULL;
    T_CHECK(rt_comm_create(NULL, NULL, NULL, &c, &e) == G5_OK && c, "single communicator: %s", e.msg);
    if (!c) return;
    T_CHECK(rt_comm_rank(c) == 0 && rt_comm_size(c) == 1 && rt_comm_local_rank(c) == 0 && rt_comm_local_size(c) == 1 &&
                !strcmp(rt_comm_kind(c), "single"),
            "rank %u size %u local %u/%u kind %s", rt_comm_rank(c), rt_comm_size(c), rt_comm_local_rank(c),
            rt_comm_local_size(c), rt_comm_kind(c));
    T_CHECK(rt_comm_rank(NULL) == 0 && rt_comm_size(NULL) == 1 && !strcmp(rt_comm_kind(NULL), "single"), "NULL is single");
    uint32_t first = 9, count = 9;
    T_CHECK(rt_comm_ranks(c, 4, &first, &count, &e) == G5_OK && first == 0 && count == 4, "ranks of 4: %u+%u", first, count);
    T_CHECK(rt_comm_ranks(c, 0, &first, &count, &e) == G5_ERR_SHARDING, "ranks of 0 refused");
    char all[16] = "................";
    const size_t lens[1] = {5}, offs[1] = {3};
    T_CHECK(rt_comm_allgatherv(c, "hello", lens, offs, all, &e) == G5_OK && !memcmp(all, "...hello...", 11),
            "allgatherv copies to its offset: %.11s", all);
    char all2[8] = {0};
    T_CHECK(rt_comm_allgather(c, "abc", 3, all2, &e) == G5_OK && !memcmp(all2, "abc", 3), "allgather copies");
    int32_t v = 42;
    T_CHECK(rt_comm_bcast(c, &v, sizeof v, 0, &e) == G5_OK && v == 42, "bcast from 0 keeps the value");
    T_CHECK(rt_comm_bcast(c, &v, sizeof v, 1, &e) == G5_ERR_INVALID_ARG, "bcast from process 1 of 1 refused");
    T_CHECK(rt_comm_barrier(c, &e) == G5_OK, "barrier");
    rt_comm_abort(c, 3); /* a no-op in one process */
    rt_comm_free(c);
    rt_comm_free(NULL);
}

/* Per-process directories of the TP 4 set: pa holds ranks 0 and 1, pb ranks 2 and 3. */
static int split_dirs(const char *tp4) {
    return sh("mkdir -p '%s/pa' '%s/pb' && cp '%s/blobset.g5s' '%s/pa/' && cp '%s/blobset.g5s' '%s/pb/' && "
              "cp '%s'/rank-0000[01]-of-00004.g5b '%s/pa/' && cp '%s'/rank-0000[23]-of-00004.g5b '%s/pb/'",
              g_dir, g_dir, tp4, g_dir, tp4, g_dir, tp4, g_dir, tp4, g_dir);
}

static void subset_checks(const char *tp4) {
    char pa[4200], pb[4200];
    snprintf(pa, sizeof pa, "%s/pa", g_dir);
    snprintf(pb, sizeof pb, "%s/pb", g_dir);
    g5_error e = {0};
    blob_set *s = NULL;
    T_CHECK(blob_set_open(pa, &s, &e) == G5_ERR_IO && strstr(e.msg, "rank-00002-of-00004.g5b"),
            "the whole set does not open without ranks 2, 3: %s", e.msg);
    blob_set_free(s);
    s = NULL;
    T_CHECK(blob_set_open_ranks(pa, 0, 2, &s, &e) == G5_OK, "ranks 0..1 open: %s", e.msg);
    if (s) {
        T_CHECK(blob_set_tp(s) == 4 && blob_set_first(s) == 0 && blob_set_count(s) == 2 && blob_set_rank(s, 0) &&
                    blob_set_rank(s, 1) && !blob_set_rank(s, 2) && !blob_set_rank(s, 3) && !blob_set_rank(s, 4),
                "ranks 0, 1 opened, 2, 3 not");
        T_CHECK(s && blob_get_info(blob_set_rank(s, 1))->rank == 1, "rank 1 is rank 1");
    }
    blob_set_free(s);
    s = NULL;
    T_CHECK(blob_set_open_ranks(pa, 1, 2, &s, &e) == G5_ERR_IO && strstr(e.msg, "rank-00002"), "ranks 1..2: %s", e.msg);
    T_CHECK(blob_set_open_ranks(tp4, 3, 2, &s, &e) == G5_ERR_INVALID_ARG, "ranks 3..4 of 4: %s", e.msg);
    T_CHECK(blob_set_open_ranks(tp4, 0, 0, &s, &e) == G5_ERR_INVALID_ARG, "no ranks: %s", e.msg);
    rt_wset *ws = NULL;
    T_CHECK(rt_wset_open_blobs_ranks(pb, 2, 2, &ws, &e) == G5_OK, "weights of ranks 2..3: %s", e.msg);
    if (ws) {
        T_CHECK(rt_wset_n_ranks(ws) == 4 && rt_wset_rank_first(ws) == 2 && rt_wset_rank_count(ws) == 2 &&
                    !rt_wset_rank(ws, 0) && !rt_wset_rank(ws, 1) && rt_wset_rank(ws, 2) && rt_wset_rank(ws, 3) &&
                    rt_weights_find(rt_wset_rank(ws, 3), "output.weight"),
                "weight set holds ranks 2, 3 of 4");
        rt_model *m = NULL;
        rt_model_opts mo = {.n_threads = 1};
        T_CHECK(rt_model_create(ws, &mo, &m, &e) == G5_ERR_INVALID_ARG && strstr(e.msg, "rank 0 is not open"),
                "one process needs every rank open: %s", e.msg);
        rt_model_free(m);
    }
    rt_wset_free(ws);
    /* the checks still apply to the ranks opened: rank 2's file under rank 1's name */
    char bad[4200];
    snprintf(bad, sizeof bad, "%s/bad", g_dir);
    sh("mkdir -p '%s' && cp '%s/blobset.g5s' '%s/' && cp '%s/rank-00002-of-00004.g5b' '%s/rank-00001-of-00004.g5b'",
       bad, tp4, bad, tp4, bad);
    s = NULL;
    T_CHECK(blob_set_open_ranks(bad, 1, 1, &s, &e) == G5_ERR_MISMATCH, "rank 2's file under rank 1's name: %s", e.msg);
    blob_set_free(s);
}

/* One-process glm5-run output vs `mpirun -np P` of it on the same set: stdout and the logits
 * dump byte for byte. */
static void run_pair(const char *label, const char *set, int np, const char *args) {
    int r1 = sh("'%s' -m '%s' %s --dump-logits '%s/one.f32' >'%s/one.out' 2>'%s/one.err'", g_run, set, args, g_dir,
                g_dir, g_dir);
    int r2 = sh("%s -np %d '%s' -m '%s' %s --dump-logits '%s/many.f32' >'%s/many.out' 2>'%s/many.err'", g_mpirun, np,
                g_run, set, args, g_dir, g_dir, g_dir);
    char *o1 = slurp("one.out"), *o2 = slurp("many.out");
    T_CHECK(r1 == 0 && r2 == 0, "%s: exit %d / %d", label, r1, r2);
    T_CHECK(o1 && o2 && strlen(o1) > 1 && !strcmp(o1, o2), "%s: output printed once and equal: '%s' vs '%s'", label,
            o1 ? o1 : "?", o2 ? o2 : "?");
    T_CHECK(same("one.f32", "many.f32"), "%s: dumped logits bit-identical", label);
    if (r2) {
        char *er = slurp("many.err");
        printf("%s stderr:\n%s\n", label, er ? er : "");
        free(er);
    }
    free(o1);
    free(o2);
}

/* The model API under mpirun: every process's bytes equal the one-process run's. */
static void api_check(const char *label, const char *set, int np, const char *ref) {
    int rc = sh("%s -np %d '%s' --worker '%s' '%s/api' 2>'%s/api.err'", g_mpirun, np, g_self, set, g_dir, g_dir);
    T_CHECK(rc == 0, "%s: workers exit %d", label, rc);
    if (rc) {
        char *er = slurp("api.err");
        printf("%s stderr:\n%s\n", label, er ? er : "");
        free(er);
    }
    for (int p = 0; p < np; p++) {
        char name[64];
        snprintf(name, sizeof name, "api.%d", p);
        T_CHECK(same(name, ref), "%s: process %d's outputs (logits, hidden, layers, top-k, decode, MTP, batch, "
                "expanded) bit-identical to one process", label, p);
        sh("rm -f '%s/%s'", g_dir, name);
    }
}

static int api_reference(const char *set, const char *name) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    g5_error e = {0};
    rt_wset *ws = NULL;
    rt_model *m = NULL;
    FILE *f = NULL;
    int rc = 1;
    rt_model_opts mo = {.n_threads = 2};
    if (!rt_wset_open_blobs(set, &ws, &e) && !rt_model_create(ws, &mo, &m, &e) && (f = fopen(path, "wb")))
        rc = scenario(m, f, &e);
    if (f && fclose(f)) rc = 1;
    T_CHECK(rc == 0, "one-process reference on %s: %s", set, e.msg);
    rt_model_free(m);
    rt_wset_free(ws);
    return rc == 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--worker")) return worker(argc, argv);
    /* this program and the one-process runs are not processes of a launch, whatever started it */
    for (size_t i = 0; i < sizeof g_launcher_env / sizeof g_launcher_env[0]; i++) unsetenv(g_launcher_env[i]);
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    const char *build = getenv("BUILD");
    snprintf(g_run, sizeof g_run, "%s/bin/glm5-run", build && *build ? build : "build");
    if (!realpath(argv[0], g_self)) snprintf(g_self, sizeof g_self, "%s", argv[0]);
    unit_checks();

    struct stat sb;
    T_CHECK(stat(g_run, &sb) == 0, "binary %s exists", g_run);
    snprintf(g_dir, sizeof g_dir, "%s", t_tmpdir());
    set_mpirun();
    char tp2[4200], tp4[4200];
    snprintf(tp2, sizeof tp2, "%s/tp2", g_dir);
    snprintf(tp4, sizeof tp4, "%s/tp4", g_dir);
    g5_error e = {0};
    convert_options co;
    convert_options_init(&co);
    co.tp = 2;
    g5_status s2 = convert_run(T_ORACLE_GGUF, tp2, &co, NULL, &e);
    T_CHECK(s2 == G5_OK, "convert TP 2: %s", e.msg);
    co.tp = 4;
    co.ep = 1; /* TP 4 needs whole experts on the oracle (test_oracle_logits says why) */
    g5_status s4 = convert_run(T_ORACLE_GGUF, tp4, &co, NULL, &e);
    T_CHECK(s4 == G5_OK, "convert TP 4 --ep: %s", e.msg);
    if (s2 || s4) goto done;
    T_CHECK(split_dirs(tp4) == 0, "per-process directories");
    subset_checks(tp4);

    if (sh("command -v mpirun >/dev/null 2>&1") != 0) {
        printf("test_mpi: skipped: no mpirun (install openmpi-bin; scripts/deps.sh does)\n");
        goto done;
    }
    /* a build without MPI must refuse to run under a launcher */
    char *er = NULL;
    int rc = sh("%s -np 2 '%s' -m '%s' --tokens 1,2 -n 1 -q >/dev/null 2>'%s/probe.err'", g_mpirun, g_run, tp2, g_dir);
    er = slurp("probe.err");
    if (er && strstr(er, "this build has no MPI")) {
        T_CHECK(rc == 3, "a build without MPI refuses under mpirun: exit %d", rc);
        printf("test_mpi: skipped: this build has no MPI (its refusal under mpirun checked)\n");
        free(er);
        goto done;
    }
    T_CHECK(rc == 0, "glm5-run under mpirun -np 2: exit %d: %s", rc, er ? er : "");
    free(er);

    double t0 = t_now_s();
    /* the model API, every output */
    if (api_reference(tp2, "ref2") && api_reference(tp4, "ref4")) {
        api_check("API TP 2, 2 processes", tp2, 2, "ref2");
        api_check("API TP 4, 4 processes", tp4, 4, "ref4");
        api_check("API TP 4, 2 processes", tp4, 2, "ref4");
    }
    /* glm5-run */
    const char *greedy = "--tokens 5,77,301,1024,9,12,13,400,2000,3 -n 12 --temp 0 --ids -q --threads 2";
    run_pair("glm5-run TP 2, 2 processes, greedy ids", tp2, 2, greedy);
    run_pair("glm5-run TP 4, 4 processes, greedy ids", tp4, 4, greedy);
    run_pair("glm5-run TP 2, 2 processes, text", tp2, 2, "-p 'The sparse attention' -n 16 --temp 0 -q");
    run_pair("glm5-run TP 4, 2 processes, sampling", tp4, 2, "--tokens 1,2,3 -n 16 --seed 5 --temp 0.9 --ids -q");

    /* each process only its own ranks' files (MPMD: one directory each) */
    rc = sh("'%s' -m '%s' %s >'%s/one.out' 2>/dev/null", g_run, tp4, greedy, g_dir);
    int rc2 = sh("%s -np 1 '%s' -m '%s/pa' %s : -np 1 '%s' -m '%s/pb' %s >'%s/many.out' 2>'%s/many.err'", g_mpirun, g_run,
                 g_dir, greedy, g_run, g_dir, greedy, g_dir, g_dir);
    T_CHECK(rc == 0 && rc2 == 0 && same("one.out", "many.out"),
            "TP 4 over 2 processes, each with only its ranks' files: exit %d, same ids", rc2);

    /* refusals */
    rc = sh("%s -np 3 '%s' -m '%s' --tokens 1,2 -n 1 -q >/dev/null 2>'%s/err3'", g_mpirun, g_run, tp4, g_dir);
    er = slurp("err3");
    T_CHECK(rc == 2 && er && strstr(er, "4 ranks, which 3 processes"), "T 4 over P 3: exit %d: %s", rc, er ? er : "");
    free(er);
    rc = sh("%s -np 2 '%s' -m '%s' --tokens 1,2 -n 1 -q >/dev/null 2>'%s/errg'", g_mpirun, g_run, T_ORACLE_GGUF, g_dir);
    er = slurp("errg");
    T_CHECK(rc == 2 && er && strstr(er, "not a blob set"), "a GGUF under 2 processes: exit %d: %s", rc, er ? er : "");
    free(er);
    /* both processes given pa: process 1 lacks ranks 2, 3 and says so; process 0 stops too */
    rc = sh("%s -np 2 '%s' -m '%s/pa' --tokens 1,2 -n 1 -q >/dev/null 2>'%s/errm'", g_mpirun, g_run, g_dir, g_dir);
    er = slurp("errm");
    T_CHECK(rc == 3 && er && strstr(er, "rank 1: ") && strstr(er, "rank-00002-of-00004.g5b") &&
                strstr(er, "rank 0: stopping: process 1 failed"),
            "a process missing its files: exit %d: %s", rc, er ? er : "");
    free(er);
    printf("test_mpi: launcher checks in %.1f s\n", t_now_s() - t0);
done:
    t_rmtree(g_dir);
    return t_report("test_mpi");
}
