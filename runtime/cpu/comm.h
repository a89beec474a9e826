/* The processes of one run and the few host-side exchanges between them.
 *
 * A run is one process (the default: `glm5-run --tp N` drives every rank itself) or several,
 * started by a launcher: `mpirun -np P` / `srun -n P`, rank and size from MPI (MPI_COMM_WORLD),
 * never from home-made cluster code. The T tensor-parallel ranks of a blob set are divided
 * evenly: process p owns ranks [p * T / P, (p + 1) * T / P) (T % P == 0), opens only those
 * ranks' blob files, and runs them; the rank-to-rank sums and gathers that cross processes go
 * through this module (the CPU model) or through NCCL, whose unique id is broadcast here (the
 * GPU model).
 *
 * Built with MPI when the build finds it (G5_WITH_MPI, `pkg-config ompi-c`); without it, or when
 * no launcher started the process, rt_comm_create gives the single-process communicator
 * (size 1), on which every exchange is a copy.
 *
 * Every call is collective (all processes make it, in the same order) and is made from the
 * thread that created the communicator (MPI_THREAD_FUNNELED). MPI errors are returned (never
 * abort the job) as G5_ERR_IO naming the call and MPI's message. */
#ifndef G5_RT_COMM_H
#define G5_RT_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "format/status.h"

typedef struct rt_comm rt_comm;

/* What the launcher told this process through its environment: mpirun OMPI_COMM_WORLD_SIZE,
 * MPICH/Hydra PMI_SIZE, PMIx PMIX_RANK, srun SLURM_STEP_NUM_TASKS / SLURM_PROCID. Library code
 * reads no environment: main() fills this from the process's (rt_comm_env_read) and passes it in. */
typedef struct rt_comm_env {
    int launched;                /* a launcher started this process */
    unsigned long size;          /* the process count it gives (0: unknown) */
} rt_comm_env;

/* Fills *env from LOOKUP (the C library's environment lookup in main(), or a test's table): a
 * variable's value, or NULL when unset. */
void rt_comm_env_read(rt_comm_env *env, char *(*lookup)(const char *name));

/* ENV (NULL: no launcher) says a launcher started this process and the build has MPI: initializes MPI
 * (MPI_Init_thread, FUNNELED) and returns the world, local rank and size from
 * MPI_Comm_split_type(MPI_COMM_TYPE_SHARED); otherwise the single-process communicator. argc/argv may be NULL. G5_ERR_UNSUPPORTED
 * when a launcher started several processes but the build has no MPI (every process would
 * otherwise run the whole model alone). */
g5_status rt_comm_create(const rt_comm_env *env, int *argc, char ***argv, rt_comm **out, g5_error *err);
void rt_comm_free(rt_comm *c); /* accepts NULL; finalizes MPI when rt_comm_create initialized it */

uint32_t rt_comm_rank(const rt_comm *c);       /* 0 .. size - 1; 0 for NULL */
uint32_t rt_comm_size(const rt_comm *c);       /* 1 for NULL */
uint32_t rt_comm_local_rank(const rt_comm *c); /* index among the processes on this host */
uint32_t rt_comm_local_size(const rt_comm *c);
const char *rt_comm_kind(const rt_comm *c);    /* "single" or "mpi" */

/* The ranks process p owns out of n_ranks: [first, first + count). G5_ERR_SHARDING when n_ranks
 * is not a multiple of the size. */
g5_status rt_comm_ranks(const rt_comm *c, uint32_t n_ranks, uint32_t *first, uint32_t *count,
                        g5_error *err);

/* Ends every process of the run with code (MPI_Abort), for a failure after which the others
 * could wait forever in a collective; returns (doing nothing) on the single-process
 * communicator, where the caller simply exits. */
void rt_comm_abort(rt_comm *c, int code);

g5_status rt_comm_barrier(rt_comm *c, g5_error *err);
/* root's len bytes at buf to every process. */
g5_status rt_comm_bcast(rt_comm *c, void *buf, size_t len, uint32_t root, g5_error *err);
/* Process p's len bytes (mine) to all[p * len .. ) on every process; all is [size][len]. */
g5_status rt_comm_allgather(rt_comm *c, const void *mine, size_t len, void *all, g5_error *err);
/* Process p's lens[p] bytes (mine) to all + offs[p] on every process. lens and offs ([size])
 * must be the same on every process; mine may be all + offs[p] itself. Layouts whose counts or
 * offsets exceed MPI's int are sent as per-process broadcasts of at most 1 GiB. */
g5_status rt_comm_allgatherv(rt_comm *c, const void *mine, const size_t *lens, const size_t *offs,
                             void *all, g5_error *err);

#endif
