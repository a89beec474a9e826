/* The decode step as a CUDA graph (gpu_model.h, opts.cuda_graph): captured once, then replayed
 * at every later position without being recorded again. Compiled to nothing unless
 * G5_WITH_CUDA.
 *
 * A one-token step of one sequence is gm_forward_device with g->graph_bound set: the same
 * launches as the plain path, except that the attention stage's position-dependent ones (the
 * cache writes, the indexer scores and top-k, the attention) read the position from rk->pos
 * (cuk_model.h, "positions in device memory"). rk->pos and rk->tok, uploaded by forward_plan
 * before every launch, are the step's parameters; everything else a replay depends on is the
 * key of struct gm_graph below, and the step is captured again only when that changed.
 *
 * Why buckets of the key count and not one graph for the capacity: the launch shapes of the
 * indexer grow with the key count (the score grid, up to a block per 128 keys past 16k; the
 * top-k cluster; the lane score kernel up to 16384 keys, the thread-per-key one above, 2-3x
 * apart). A graph shaped for a server's whole context would launch thousands of score blocks
 * that leave at once and the slower score kernel for short contexts. A power-of-two bucket
 * (gm_graph_bound) launches at most twice the blocks that have work (the others leave at once),
 * picks the plain path's score kernel (16384 is a bucket edge), and costs one capture per
 * doubling of the context. Above GM_GRAPH_STEP_FROM keys the bucket is the next multiple of
 * GM_GRAPH_STEP instead: a doubling there would launch up to 2x the thread-per-key score blocks
 * of the plain path (65536 keys' worth at 32769), while a capture per GM_GRAPH_STEP tokens costs
 * nothing next to the steps between them. The top-k's cluster is sized from the bound (its
 * selection is exact whatever the slices). The attention's own shape does not depend on the key count (its
 * cluster follows the top-k size), the other stages' not at all. */
#ifdef G5_WITH_CUDA

#include <stdlib.h>

#include "cuda/attn_select.h"
#include "cuda/idx_select.h"
#include "gpu_int.h"

/* Per rank, the addresses a captured step holds: the work buffers (their layout follows ncap),
 * the score buffer, and the sequence's caches. */
typedef struct gkey_rank {
    const void *work, *sc, *lat, *idxk;
    uint32_t ncap;
} gkey_rank;

struct gm_graph {
    cudaGraphExec_t exec;
    int valid;                       /* the key below is what exec was captured for */
    const rt_gpu_seq *seq;
    uint32_t cap, bound;             /* the sequence's capacity (its caches' layer stride); the
                                        bucket (g->graph_bound of the capture) */
    int logits;                      /* the head GEMVs were captured (out->logits) */
    int attn_old, idx_lane;          /* the process-wide kernel choices (attn_select.h, idx_select.h) */
    gkey_rank rk[];                  /* [T] */
};

uint32_t gm_graph_bound(uint32_t P, uint32_t cap) {
    uint64_t b = GM_GRAPH_MIN_BOUND;
    while (b < P && b < GM_GRAPH_STEP_FROM) b *= 2;
    if (b < P) b = ((uint64_t)P + GM_GRAPH_STEP - 1) / GM_GRAPH_STEP * GM_GRAPH_STEP;
    return b < cap ? (uint32_t)b : cap;
}

static gkey_rank key_rank(const rt_gpu_model *g, const fplan *pl, uint32_t r) {
    const gl_rank *rk = &g->rk[r];
    const rt_gpu_seq *s = pl->seq[0];
    return (gkey_rank){rk->work, rk->sc, s->rk[r].lat, s->rk[r].idxk, rk->ncap};
}

static int key_same(const struct gm_graph *k, const rt_gpu_model *g, const fplan *pl, uint32_t bound, int logits) {
    const rt_gpu_seq *s = pl->seq[0];
    if (!k->valid || k->seq != s || k->cap != s->cap || k->bound != bound || k->logits != logits ||
        k->attn_old != cuk_attn_old() || k->idx_lane != cuk_idx_scores_lane())
        return 0;
    for (uint32_t r = 0; r < g->T; r++) {
        const gkey_rank a = key_rank(g, pl, r), *b = &k->rk[r];
        if (a.work != b->work || a.sc != b->sc || a.lat != b->lat || a.idxk != b->idxk || a.ncap != b->ncap) return 0;
    }
    return 1;
}

static void key_store(struct gm_graph *k, const rt_gpu_model *g, const fplan *pl, uint32_t bound, int logits) {
    k->seq = pl->seq[0];
    k->cap = pl->seq[0]->cap;
    k->bound = bound;
    k->logits = logits;
    k->attn_old = cuk_attn_old();
    k->idx_lane = cuk_idx_scores_lane();
    for (uint32_t r = 0; r < g->T; r++) k->rk[r] = key_rank(g, pl, r);
    k->valid = 1;
}

/* gm_forward_device recorded on rank 0's stream (every rank works there: the collective is none
 * or device-sum) into a new gr->exec. Not an update in place (cudaGraphExecUpdate): between
 * buckets a node can change kernel (the score kernels), cluster shape or launch attributes, and
 * with accepted updates, bench_decode's contexts 32k, 8k, then 1k keys in one process gave
 * non-finite logits at 1k on the H200, and with a fresh instantiation per capture finite ones
 * (test_gpu_model's "graph shrink" checks that order against plain launches); captures are rare
 * (one per bucket, sequence or buffer change), so the instantiation's cost does not matter. */
static g5_status capture(rt_gpu_model *g, struct gm_graph *gr, const fplan *pl, uint32_t bound,
                         const rt_gpu_outputs *out, g5_error *err) {
    gl_rank *r0 = &g->rk[0];
    gr->valid = 0;
    CU(cudaStreamBeginCapture(r0->st, cudaStreamCaptureModeThreadLocal));
    g->graph_bound = bound;
    g5_status st = gm_forward_device(g, pl, out, 1, err);
    g->graph_bound = 0;
    cudaGraph_t graph = NULL;
    const cudaError_t ce = cudaStreamEndCapture(r0->st, &graph);
    g->info.graph_captures++;
    if (!st && ce != cudaSuccess)
        st = g5_fail(err, G5_ERR_INTERNAL, "CUDA graph capture of the decode step: %s", cudaGetErrorString(ce));
    if (st) {
        if (graph) cudaGraphDestroy(graph);
        return st;
    }
    if (gr->exec) {
        cudaGraphExecDestroy(gr->exec);
        gr->exec = NULL;
    }
    cudaError_t ge = cudaSuccess;
    if (!gr->exec) {
        ge = cudaGraphInstantiate(&gr->exec, graph, 0);
        if (ge == cudaSuccess) g->info.graph_instantiations++;
        else gr->exec = NULL;
    }
    cudaGraphDestroy(graph);
    if (ge != cudaSuccess)
        return g5_fail(err, G5_ERR_INTERNAL, "cudaGraphInstantiate (decode step): %s", cudaGetErrorString(ge));
    key_store(gr, g, pl, bound, out && out->logits);
    return G5_OK;
}

g5_status gm_forward_graph(rt_gpu_model *g, const fplan *pl, uint32_t bound, const rt_gpu_outputs *out,
                           g5_error *err) {
    gl_rank *r0 = &g->rk[0];
    const rt_gpu_seq *s = pl->seq[0];
    /* the bound the replayed kernels rely on (cuk_model.h), checked at every launch, not only at
     * the capture: a position past it would give NaN logits */
    if (pl->n != 1 || pl->n_seg != 1 || !bound || (uint64_t)pl->pos0[0] + 1 > bound || bound > s->cap)
        return g5_fail(err, G5_ERR_INTERNAL, "graph step: %u token(s) in %u segment(s) at position %u, bound %u, capacity %u",
                       pl->n, pl->n_seg, pl->pos0[0], bound, s->cap);
    for (uint32_t r = 0; r < g->T; r++)
        if (g->rk[r].sc_cap < bound)
            return g5_fail(err, G5_ERR_INTERNAL, "graph step: rank %u holds %llu scores, bound %u", r,
                           (unsigned long long)g->rk[r].sc_cap, bound);
    if (!g->graph) {
        g->graph = calloc(1, sizeof *g->graph + (size_t)g->T * sizeof(gkey_rank));
        if (!g->graph) return g5_fail(err, G5_ERR_NOMEM, "CUDA graph state");
    }
    struct gm_graph *gr = g->graph;
    CU(cudaSetDevice(r0->dev));
    if (!gr->exec || !key_same(gr, g, pl, bound, out && out->logits)) CK(capture(g, gr, pl, bound, out, err));
    CU(cudaGraphLaunch(gr->exec, r0->st));
    g->info.graph_steps++;
    const uint64_t E = g->hp.n_embd;
    if (out && out->hidden) CU(cudaMemcpyAsync(out->hidden, r0->h, E * 4, cudaMemcpyDeviceToHost, r0->st));
    if (out && out->logits)
        for (uint32_t r = 0; r < g->T; r++) {
            gl_rank *rk = &g->rk[r];
            if (rk->head_write)
                CU(cudaMemcpyAsync(out->logits + rk->head_col0, rk->lg, (size_t)rk->head.m * 4, cudaMemcpyDeviceToHost,
                                   rk->st));
        }
    return G5_OK;
}

void gm_graph_free(rt_gpu_model *g) {
    if (!g->graph) return;
    if (g->graph->exec) {
        cudaSetDevice(g->rk[0].dev);
        cudaGraphExecDestroy(g->graph->exec);
    }
    free(g->graph);
    g->graph = NULL;
}

typedef int rt_gpu_graph_unused_;
#endif
