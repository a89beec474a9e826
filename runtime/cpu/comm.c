/* rt_comm (comm.h): the single-process communicator, and MPI's world when a launcher started
 * the process and the build has MPI (G5_WITH_MPI, set by the Makefile when pkg-config finds
 * ompi-c or mpi; `make MPI=0` leaves it out).
 *
 * MPI is initialized only when the launcher's environment (rt_comm_env, read by main()) shows one, so that a plain `glm5-run`
 * never pays for (or depends on) MPI's start-up, and a build with MPI behaves like one without
 * it outside mpirun/srun. Errors return (MPI_ERRORS_RETURN) and become g5 errors. MPI counts
 * and displacements are ints: an all-gather whose layout does not fit them falls back to
 * per-process broadcasts of at most 1 GiB each, which have no such limit. */
#include "runtime/cpu/comm.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef G5_WITH_MPI
#include <mpi.h>
#endif

struct rt_comm {
    uint32_t rank, size, local_rank, local_size;
    int mpi;          /* the world is MPI's */
    int finalize;     /* rt_comm_create called MPI_Init_thread */
#ifdef G5_WITH_MPI
    MPI_Comm world;   /* a duplicate of MPI_COMM_WORLD, errors returned */
#endif
};

/* Largest piece of one broadcast (well under INT_MAX bytes). */
#define COMM_CHUNK ((size_t)1 << 30)

/* A decimal count (a value set but not one counts as 0). */
static unsigned long count_of(const char *v) {
    if (!v || !*v) return 0;
    char *end;
    unsigned long n = strtoul(v, &end, 10);
    return *end ? 0 : n;
}

void rt_comm_env_read(rt_comm_env *env, char *(*lookup)(const char *name)) {
    static const char *const size_vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"};
    memset(env, 0, sizeof *env);
    for (size_t i = 0; i < sizeof size_vars / sizeof size_vars[0]; i++) {
        const char *v = lookup(size_vars[i]);
        if (v && *v) {
            env->launched = 1;
            if (!env->size) env->size = count_of(v);
        }
    }
    /* PMIx and srun give ranks; a rank above 0 means several processes even without a size */
    static const char *const rank_vars[] = {"PMIX_RANK", "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof rank_vars / sizeof rank_vars[0]; i++) {
        const char *v = lookup(rank_vars[i]);
        if (v && *v) {
            env->launched = 1;
            unsigned long r = count_of(v);
            if (r + 1 > env->size && r > 0) env->size = r + 1;
        }
    }
}

static g5_status single(rt_comm **out, g5_error *err) {
    rt_comm *c = calloc(1, sizeof *c);
    if (!c) return g5_fail(err, G5_ERR_NOMEM, "communicator");
    c->size = c->local_size = 1;
    *out = c;
    return G5_OK;
}

#ifdef G5_WITH_MPI
static g5_status mpi_fail(g5_error *err, int code, const char *what) {
    char msg[MPI_MAX_ERROR_STRING + 1];
    int len = 0;
    if (MPI_Error_string(code, msg, &len) != MPI_SUCCESS) len = 0;
    msg[len] = 0;
    return g5_fail(err, G5_ERR_IO, "MPI %s: %s (error %d)", what, len ? msg : "unknown error", code);
}
#endif

g5_status rt_comm_create(const rt_comm_env *env, int *argc, char ***argv, rt_comm **out, g5_error *err) {
    *out = NULL;
    const int launched = env && env->launched;
#ifndef G5_WITH_MPI
    const unsigned long size = env ? env->size : 0;
    (void)argc;
    (void)argv;
    if (launched && size > 1)
        return g5_fail(err, G5_ERR_UNSUPPORTED,
                       "a launcher started %lu processes, but this build has no MPI: each would run "
                       "the whole model alone (install libopenmpi-dev and rebuild, or run one process)",
                       size);
    return single(out, err);
#else
    if (!launched) return single(out, err);
    rt_comm *c = calloc(1, sizeof *c);
    if (!c) return g5_fail(err, G5_ERR_NOMEM, "communicator");
    int inited = 0, rc;
    MPI_Initialized(&inited);
    if (!inited) {
        int provided = 0;
        if ((rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided)) != MPI_SUCCESS) {
            free(c);
            return g5_fail(err, G5_ERR_IO, "MPI_Init_thread failed (error %d)", rc);
        }
        c->finalize = 1;
        if (provided < MPI_THREAD_FUNNELED) {
            rt_comm_free(c);
            return g5_fail(err, G5_ERR_UNSUPPORTED, "MPI gives thread level %d, FUNNELED (%d) is needed",
                           provided, MPI_THREAD_FUNNELED);
        }
    }
    c->mpi = 1;
    g5_status st = G5_OK;
    int r = 0, s = 0, lr = 0, ls = 0;
    MPI_Comm local = MPI_COMM_NULL;
    if ((rc = MPI_Comm_dup(MPI_COMM_WORLD, &c->world)) != MPI_SUCCESS) {
        c->world = MPI_COMM_NULL;
        st = mpi_fail(err, rc, "Comm_dup");
    } else if ((rc = MPI_Comm_set_errhandler(c->world, MPI_ERRORS_RETURN)) != MPI_SUCCESS) {
        st = mpi_fail(err, rc, "Comm_set_errhandler");
    } else if ((rc = MPI_Comm_rank(c->world, &r)) != MPI_SUCCESS || (rc = MPI_Comm_size(c->world, &s)) != MPI_SUCCESS) {
        st = mpi_fail(err, rc, "Comm_rank/size");
    } else if ((rc = MPI_Comm_split_type(c->world, MPI_COMM_TYPE_SHARED, r, MPI_INFO_NULL, &local)) != MPI_SUCCESS) {
        st = mpi_fail(err, rc, "Comm_split_type(SHARED)");
    } else if ((rc = MPI_Comm_rank(local, &lr)) != MPI_SUCCESS || (rc = MPI_Comm_size(local, &ls)) != MPI_SUCCESS) {
        st = mpi_fail(err, rc, "local Comm_rank/size");
    }
    if (local != MPI_COMM_NULL) MPI_Comm_free(&local);
    if (st) {
        rt_comm_free(c);
        return st;
    }
    c->rank = (uint32_t)r;
    c->size = (uint32_t)s;
    c->local_rank = (uint32_t)lr;
    c->local_size = (uint32_t)ls;
    *out = c;
    return G5_OK;
#endif
}

void rt_comm_free(rt_comm *c) {
    if (!c) return;
#ifdef G5_WITH_MPI
    if (c->mpi && c->world != MPI_COMM_NULL) MPI_Comm_free(&c->world);
    if (c->finalize) {
        int done = 0;
        MPI_Finalized(&done);
        if (!done) MPI_Finalize();
    }
#endif
    free(c);
}

uint32_t rt_comm_rank(const rt_comm *c) { return c ? c->rank : 0; }
uint32_t rt_comm_size(const rt_comm *c) { return c ? c->size : 1; }
uint32_t rt_comm_local_rank(const rt_comm *c) { return c ? c->local_rank : 0; }
uint32_t rt_comm_local_size(const rt_comm *c) { return c ? c->local_size : 1; }
const char *rt_comm_kind(const rt_comm *c) { return c && c->mpi ? "mpi" : "single"; }

g5_status rt_comm_ranks(const rt_comm *c, uint32_t n_ranks, uint32_t *first, uint32_t *count,
                        g5_error *err) {
    const uint32_t P = rt_comm_size(c), p = rt_comm_rank(c);
    if (n_ranks == 0 || n_ranks % P)
        return g5_fail(err, G5_ERR_SHARDING,
                       "%u tensor-parallel rank%s cannot be divided evenly over %u processes "
                       "(T %% P must be 0)", n_ranks, n_ranks == 1 ? "" : "s", P);
    *count = n_ranks / P;
    *first = p * *count;
    return G5_OK;
}

void rt_comm_abort(rt_comm *c, int code) {
#ifdef G5_WITH_MPI
    if (c && c->mpi && c->size > 1) MPI_Abort(c->world, code);
#else
    (void)c;
    (void)code;
#endif
}

g5_status rt_comm_barrier(rt_comm *c, g5_error *err) {
#ifdef G5_WITH_MPI
    if (c && c->mpi) {
        int rc = MPI_Barrier(c->world);
        if (rc != MPI_SUCCESS) return mpi_fail(err, rc, "Barrier");
    }
#else
    (void)c;
    (void)err;
#endif
    return G5_OK;
}

g5_status rt_comm_bcast(rt_comm *c, void *buf, size_t len, uint32_t root, g5_error *err) {
    if (root >= rt_comm_size(c))
        return g5_fail(err, G5_ERR_INVALID_ARG, "broadcast from process %u of %u", root, rt_comm_size(c));
#ifdef G5_WITH_MPI
    if (c && c->mpi) {
        for (size_t off = 0; off < len; off += COMM_CHUNK) {
            size_t n = len - off < COMM_CHUNK ? len - off : COMM_CHUNK;
            int rc = MPI_Bcast((uint8_t *)buf + off, (int)n, MPI_BYTE, (int)root, c->world);
            if (rc != MPI_SUCCESS) return mpi_fail(err, rc, "Bcast");
        }
    }
#else
    (void)buf;
    (void)len;
#endif
    return G5_OK;
}

g5_status rt_comm_allgather(rt_comm *c, const void *mine, size_t len, void *all, g5_error *err) {
    const uint32_t P = rt_comm_size(c);
    size_t *lens = malloc(2 * (size_t)P * sizeof *lens);
    if (!lens) return g5_fail(err, G5_ERR_NOMEM, "all-gather of %u x %zu bytes", P, len);
    size_t *offs = lens + P;
    g5_status st = G5_OK;
    for (uint32_t p = 0; p < P && !st; p++) {
        lens[p] = len;
        if (__builtin_mul_overflow((size_t)p, len, &offs[p]))
            st = g5_fail(err, G5_ERR_OVERFLOW, "all-gather of %u x %zu bytes", P, len);
    }
    if (!st) st = rt_comm_allgatherv(c, mine, lens, offs, all, err);
    free(lens);
    return st;
}

g5_status rt_comm_allgatherv(rt_comm *c, const void *mine, const size_t *lens, const size_t *offs,
                             void *all, g5_error *err) {
    const uint32_t p = rt_comm_rank(c);
    uint8_t *dst = (uint8_t *)all + offs[p];
    if (!c || !c->mpi) {
        if (lens[p] && dst != mine) memmove(dst, mine, lens[p]);
        return G5_OK;
    }
#ifdef G5_WITH_MPI
    const uint32_t P = c->size;
    int fits = 1;
    for (uint32_t q = 0; q < P; q++)
        if (lens[q] > INT_MAX || offs[q] > INT_MAX) fits = 0;
    if (fits) {
        int *cnt = malloc(2 * (size_t)P * sizeof *cnt);
        if (!cnt) return g5_fail(err, G5_ERR_NOMEM, "all-gather counts for %u processes", P);
        int *disp = cnt + P;
        for (uint32_t q = 0; q < P; q++) {
            cnt[q] = (int)lens[q];
            disp[q] = (int)offs[q];
        }
        /* mine may already sit at its place in all */
        const void *send = dst == (const uint8_t *)mine ? MPI_IN_PLACE : mine;
        int rc = MPI_Allgatherv(send, cnt[p], MPI_BYTE, all, cnt, disp, MPI_BYTE, c->world);
        free(cnt);
        return rc == MPI_SUCCESS ? G5_OK : mpi_fail(err, rc, "Allgatherv");
    }
    if (lens[p] && dst != mine) memmove(dst, mine, lens[p]);
    for (uint32_t q = 0; q < P; q++) {
        g5_status st = rt_comm_bcast(c, (uint8_t *)all + offs[q], lens[q], q, err);
        if (st) return st;
    }
    return G5_OK;
#else
    (void)err;
    return G5_OK;
#endif
}
