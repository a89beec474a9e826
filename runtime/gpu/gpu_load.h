/* Blob -> GPU loader: one rank's whole tensor data region into one device allocation.
 *
 * A loader (rt_gpu_loader) owns a ring of pinned slots (bufs_per_thread x buf_bytes per reader)
 * and one stream per reader; pinning memory is the slow part of setting up (about 1.4 ms per
 * MiB with cudaHostAlloc), so a process makes the loader once and loads every rank with it.
 *
 * One load: reader threads take the blob's hash chunks (64 MiB from the converter) in turn. The
 * owner of a chunk reads it slot by slot, each slot in read_bytes preads, and hashes every pread
 * right after it while the bytes are still in the core's cache (XXH3-128 streamed over the
 * chunk), then copies the slot with cudaMemcpyAsync on its stream; the copy of one slot overlaps
 * the reads of the next. A chunk hash must be computed in order by one thread, so when no chunk
 * is left to own, readers help the unfinished chunks: they read and copy the chunks' next slots
 * and hand them to the owner, which hashes them from the helper's slot (the last round of chunks
 * would otherwise leave most readers idle). A chunk whose hash does not match stops every
 * reader; the tensor whose stored hash fails is named (or the chunk, if every tensor in it holds:
 * damaged padding). Tensors are views: tensor t lives at dev + (t->offset - data_offset).
 *
 * Built only with CUDA (cuda/model.mk defines G5_WITH_CUDA); the CPU build compiles nothing. */
#ifndef G5_RT_GPU_LOAD_H
#define G5_RT_GPU_LOAD_H

#include <stdint.h>

#include "format/blob.h"
#include "format/status.h"

typedef struct rt_gpu_load_opts {
    uint32_t n_threads;       /* reader threads; 0 = min(16, online CPUs) */
    uint64_t buf_bytes;       /* each pinned slot = one cudaMemcpyAsync; 0 = 2 MiB (rounded up to 4096) */
    uint64_t read_bytes;      /* one pread, hashed at once (keep it below the L2 size); 0 = 512 KiB,
                                 at most buf_bytes (rounded up to 4096) */
    uint32_t bufs_per_thread; /* slots per reader; 0 = 4 */
    int verify;               /* check chunk hashes while reading (default 1) */
    int direct;               /* try O_DIRECT (default 0: with one read in flight per thread,
                                 bench/load.sh measured O_DIRECT at 0.061 of the ceiling warm and
                                 0.67 cold, buffered reads at 0.61 and 1.015) */
    int pin;                  /* how the ring is pinned: RT_PIN_* (default RT_PIN_AUTO) */
    int no_help;              /* 1: readers do not help unfinished chunks (for measurements) */
} rt_gpu_load_opts;

/* Pinning the ring: cudaHostAlloc took ~23 ms per 16 MiB on the H200 host (the kernel zeroes,
 * pins and maps every 4 KiB page), which a load of a few GB at 40 GB/s notices. */
enum {
    RT_PIN_AUTO = 0,          /* RT_PIN_REGISTER, or RT_PIN_ALLOC where registering fails */
    RT_PIN_REGISTER = 1,      /* 2 MiB-aligned malloc with MADV_HUGEPAGE, then cudaHostRegister */
    RT_PIN_ALLOC = 2,         /* one cudaHostAlloc */
    RT_PIN_ALLOC_PARALLEL = 3 /* one cudaHostAlloc per reader, from as many threads at once */
};

void rt_gpu_load_opts_default(rt_gpu_load_opts *o);

typedef struct rt_gpu_load_stats {
    uint64_t bytes;           /* data bytes read and copied */
    double seconds;           /* first read to the last copy complete */
    double gb_per_s;          /* bytes / seconds / 1e9 */
    uint32_t n_threads;
    uint64_t direct_reads, buffered_reads; /* pread calls of each kind */
    int verified;             /* 1 if every chunk hash was checked */
    uint64_t helped_bytes;    /* bytes read by a reader that did not own their chunk */
    double setup_seconds;     /* rt_gpu_load_blob only: making its loader in this call (0 if reused) */
    int pin;                  /* RT_PIN_* the loader's ring was pinned with (never AUTO) */
} rt_gpu_load_stats;

typedef struct rt_gpu_loader rt_gpu_loader;

/* Pins the ring and makes the streams (on `device`). Only n_threads, buf_bytes, read_bytes,
 * bufs_per_thread and pin are fixed here; verify, direct and no_help are read from the opts
 * given to each load (NULL: defaults). */
g5_status rt_gpu_loader_create(int device, const rt_gpu_load_opts *o, rt_gpu_loader **out, g5_error *err);
void rt_gpu_loader_free(rt_gpu_loader *l);
/* Seconds rt_gpu_loader_create took (pinning and streams). */
double rt_gpu_loader_setup_seconds(const rt_gpu_loader *l);

/* Allocates data_size bytes on `device` and fills them from b's file. *dev_out receives the
 * allocation (cudaFree it); stats may be NULL; o may be NULL (the loader's opts). A loader runs
 * one load at a time (concurrent calls on one loader wait for each other). On failure nothing
 * stays allocated. A device other than the loader's remakes its streams (the ring is pinned
 * for every device). */
g5_status rt_gpu_loader_load(rt_gpu_loader *l, const blob *b, int device, const rt_gpu_load_opts *o,
                             void **dev_out, rt_gpu_load_stats *stats, g5_error *err);

/* rt_gpu_loader_load with a loader kept by the process: made at the first call, kept for the
 * next ones, remade when o asks for another ring. rt_gpu_load_release frees it (its pinned
 * memory); the next call makes a new one. */
g5_status rt_gpu_load_blob(const blob *b, int device, const rt_gpu_load_opts *o, void **dev_out,
                           rt_gpu_load_stats *stats, g5_error *err);
void rt_gpu_load_release(void);

#endif
