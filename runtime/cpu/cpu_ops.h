/* CPU building blocks of the reference runtime: a small thread pool and float32 kernels
 * (matrix-vector products over quantized weight rows, norms, RoPE, activations).
 *
 * All arithmetic is float32 (sums of squares in double). A kernel's result for one output element
 * never depends on the number of threads, on how the work is split, or on how many tokens are
 * processed together: every output is one dot product computed in a fixed order. That is what
 * makes incremental decoding bit-identical to a full recomputation. */
#ifndef G5_RT_CPU_OPS_H
#define G5_RT_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "format/status.h"

/* ---- thread pool ---- */

typedef struct rt_pool rt_pool;

/* A pool of n_threads workers, the calling thread counted as worker 0 (n_threads - 1 helper
 * threads are started). n_threads >= 1. */
g5_status rt_pool_create(uint32_t n_threads, rt_pool **out, g5_error *err);
void rt_pool_free(rt_pool *p); /* accepts NULL */
uint32_t rt_pool_size(const rt_pool *p);

/* Runs fn(ctx, task, worker) for task in [0, n_tasks), spread over the workers, and returns when
 * all are done. Tasks must write disjoint outputs. Not reentrant: fn must not call rt_pool_run
 * on the same pool. */
typedef void (*rt_task_fn)(void *ctx, uint64_t task, uint32_t worker);
void rt_pool_run(rt_pool *p, uint64_t n_tasks, rt_task_fn fn, void *ctx);

/* Per-worker scratch memory, at least `bytes` long, 64-byte aligned. Reserve before running
 * (rt_pool_reserve grows every worker's buffer); inside a task use rt_pool_scratch. */
g5_status rt_pool_reserve(rt_pool *p, size_t bytes, g5_error *err);
float *rt_pool_scratch(rt_pool *p, uint32_t worker);
size_t rt_pool_scratch_bytes(const rt_pool *p);

/* ---- weight matrices ---- */

/* A row-major view of quantized weight rows: row o holds `ncols` elements of `type` in
 * row_bytes bytes (ggml order: ne[0] = ncols is contiguous). */
typedef struct rt_mat {
    uint32_t type;
    uint64_t ncols;
    uint64_t nrows;
    uint64_t row_bytes;
    const uint8_t *data;
} rt_mat;

/* Rows [row0, row0 + nrows) of a matrix with ncols columns stored at data. */
g5_status rt_mat_view(uint32_t type, const void *data, uint64_t ncols, uint64_t row0,
                      uint64_t nrows, rt_mat *out, g5_error *err);

/* Rows the matmul kernel dequantizes at once (its scratch holds this many rows). */
#define RT_MATMUL_ROWS 8
/* Scratch bytes rt_matmul needs per worker for a matrix of ncols columns. */
size_t rt_matmul_scratch(uint64_t ncols);

/* y[t][o] = sum_i W[o][i] * x[t][i] for t < n, o < W->nrows.
 * x: [n][ldx] (only the first W->ncols of each row are read); y: [n][ldy]. */
void rt_matmul(rt_pool *p, const rt_mat *W, const float *x, size_t ldx, uint32_t n, float *y,
               size_t ldy);

/* Dequantizes one row of W into dst[W->ncols]. */
void rt_mat_row(const rt_mat *W, uint64_t row, float *dst);

/* ---- vector kernels ---- */

float rt_dot(const float *a, const float *b, uint64_t n);
/* y += a * x */
void rt_axpy(float a, const float *x, float *y, uint64_t n);
/* out = x / sqrt(mean(x^2) + eps) * w (out may alias x). */
void rt_rmsnorm(const float *x, const float *w, uint64_t n, float eps, float *out);
/* out = (x - mean) / sqrt(var + eps) * w + b (biased variance; out may alias x). */
void rt_layernorm(const float *x, const float *w, const float *b, uint64_t n, float eps,
                  float *out);
/* Rotary embedding of x[0..n_rot) at one position, rotating adjacent pairs (x[2i], x[2i+1]) by
 * angle pos * theta^(-2i/n_rot) ("interleaved", ggml's NORM mode). cs holds the cos/sin table of
 * the position from rt_rope_table. */
void rt_rope_table(uint32_t pos, uint32_t n_rot, float theta, float *cs /* [n_rot] */);
void rt_rope_apply(float *x, uint32_t n_rot, const float *cs);
float rt_silu(float x);
float rt_sigmoid(float x);

#endif
