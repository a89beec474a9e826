/* Blob -> GPU loader: one rank's whole tensor data region into one device allocation.
 *
 * Reader threads (pread; O_DIRECT when the file offsets and buffers allow it, buffered reads
 * otherwise) take the blob's 64 MiB hash chunks in turn, read each through a ring of pinned
 * buffers of their own, hash it as it arrives (XXH3-128, checked against the blob's chunk hash)
 * and copy each buffer with cudaMemcpyAsync on their own stream, so reading, hashing and
 * copying overlap. A chunk whose hash does not match stops every reader; the tensor whose
 * stored hash fails is named (or the chunk, if every tensor in it holds: damaged padding).
 * Tensors are views: tensor t lives at dev + (t->offset - data_offset).
 *
 * Built only with CUDA (cuda/model.mk defines G5_WITH_CUDA); the CPU build compiles nothing. */
#ifndef G5_RT_GPU_LOAD_H
#define G5_RT_GPU_LOAD_H

#include <stdint.h>

#include "format/blob.h"
#include "format/status.h"

typedef struct rt_gpu_load_opts {
    uint32_t n_threads;       /* reader threads; 0 = 4 */
    uint64_t buf_bytes;       /* each pinned buffer; 0 = 16 MiB (rounded up to 4096) */
    uint32_t bufs_per_thread; /* ring depth per reader; 0 = 2 */
    int verify;               /* check chunk hashes while reading (default 1) */
    int direct;               /* try O_DIRECT (default 0: with one read in flight per thread,
                                 bench/load.sh measured O_DIRECT at 0.061 of the ceiling warm and
                                 0.67 cold, buffered reads at 0.61 and 1.015) */
} rt_gpu_load_opts;

void rt_gpu_load_opts_default(rt_gpu_load_opts *o);

typedef struct rt_gpu_load_stats {
    uint64_t bytes;           /* data bytes read and copied */
    double seconds;           /* first read to the last copy complete */
    double gb_per_s;          /* bytes / seconds / 1e9 */
    uint32_t n_threads;
    uint64_t direct_reads, buffered_reads; /* pread calls of each kind */
    int verified;             /* 1 if every chunk hash was checked */
} rt_gpu_load_stats;

/* Allocates data_size bytes on `device` and fills them from b's file. *dev_out receives the
 * allocation (cudaFree it); stats may be NULL. On failure nothing stays allocated. */
g5_status rt_gpu_load_blob(const blob *b, int device, const rt_gpu_load_opts *o, void **dev_out,
                           rt_gpu_load_stats *stats, g5_error *err);

#endif
