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
 * cluster follows the top-k size), the other stages' not at all.
 *
 * A batched step (one token of each of n sequences, or a rows step) is captured too, one graph
 * per row count: gm_forward_graph_rows, below. */
#ifdef G5_WITH_CUDA

#include <stdlib.h>

#include "runtime/gpu/gpu_int.h"

/* Per rank, the addresses a captured step holds: the work buffers (their layout follows ncap),
 * the score buffer, and the sequence's caches; with their sizes, which grow identically in every
 * process of a launch: a buffer is only ever replaced by a larger one, so a changed address comes
 * with a changed size and every process decides alike whether to capture again (NCCL requires a
 * graph-captured collective to be captured by all of its ranks together). */
typedef struct gkey_rank {
    const void *work, *sc, *lat, *idxk;
    uint32_t ncap;
    uint64_t sc_cap;
} gkey_rank;

typedef struct grank {
    cudaGraphExec_t exec;            /* on rk->st; NULL for a rank that shares rank 0's stream */
    gkey_rank key;
    cuk_q8_act head_q8;              /* a batched step's: rk->head_q8 as its captured final norm
                                        left it, for the head after each replay (other calls
                                        overwrite rk->head_q8 in between) */
} grank;

struct gm_graph {
    int valid;                       /* the key below is what every exec was captured for */
    int nccl_warm;                   /* the step's all-reduce ran once outside a capture */
    const rt_gpu_seq *seq;           /* NULL for a batched step's (its sequences are data) */
    uint32_t n;                      /* rows */
    uint32_t cap, bound;             /* the sequence's capacity (its caches' layer stride); the
                                        bucket (g->graph_bound of the capture, or rk->multi) */
    int logits;                      /* the head GEMVs were captured (out->logits or argmax) */
    grank rk[];                      /* [T] */
};

uint32_t gm_graph_bound(uint32_t P, uint32_t cap) {
    uint64_t b = GM_GRAPH_MIN_BOUND;
    while (b < P && b < GM_GRAPH_STEP_FROM) b *= 2;
    if (b < P) b = ((uint64_t)P + GM_GRAPH_STEP - 1) / GM_GRAPH_STEP * GM_GRAPH_STEP;
    return b < cap ? (uint32_t)b : cap;
}

/* The step's sequence, or NULL for a batched step (rows of several, read from rk->mrows). */
static const rt_gpu_seq *key_seq(const fplan *pl) { return pl->n_seg == 1 ? pl->seq[0] : NULL; }

static gkey_rank key_rank(const rt_gpu_model *g, const fplan *pl, uint32_t r) {
    const gl_rank *rk = &g->rk[r];
    const rt_gpu_seq *s = key_seq(pl);
    return (gkey_rank){rk->work, rk->sc, s ? s->rk[r].lat : NULL, s ? s->rk[r].idxk : NULL, rk->ncap, rk->sc_cap};
}

static int key_same(const struct gm_graph *k, const rt_gpu_model *g, const fplan *pl, uint32_t bound, int logits) {
    const rt_gpu_seq *s = key_seq(pl);
    if (!k->valid || k->seq != s || k->n != pl->n || k->cap != (s ? s->cap : 0) || k->bound != bound ||
        k->logits != logits)
        return 0;
    for (uint32_t r = 0; r < g->T; r++) {
        const gkey_rank a = key_rank(g, pl, r), *b = &k->rk[r].key;
        if (a.work != b->work || a.sc != b->sc || a.lat != b->lat || a.idxk != b->idxk || a.ncap != b->ncap ||
            a.sc_cap != b->sc_cap)
            return 0;
    }
    return 1;
}

static void key_store(struct gm_graph *k, const rt_gpu_model *g, const fplan *pl, uint32_t bound, int logits) {
    k->seq = key_seq(pl);
    k->n = pl->n;
    k->cap = k->seq ? k->seq->cap : 0;
    k->bound = bound;
    k->logits = logits;
    for (uint32_t r = 0; r < g->T; r++) k->rk[r].key = key_rank(g, pl, r);
    k->valid = 1;
}

static void execs_free(rt_gpu_model *g, struct gm_graph *gr) {
    for (uint32_t r = 0; r < g->T; r++)
        if (gr->rk[r].exec) {
            cudaSetDevice(g->rk[r].dev);
            cudaGraphExecDestroy(gr->rk[r].exec);
            gr->rk[r].exec = NULL;
        }
}

/* Recent NCCL versions connect an algorithm's transports at its first collective that uses it
 * (runtime connection, NCCL_RUNTIME_CONNECT): so that this setup (allocations, a handshake with
 * the peers) never has to happen inside a capture, one all-reduce of the step's size runs once
 * outside any, on rk->red (scratch: only the device-side sum uses it). Collective, like the
 * capture that follows on every process. */
static g5_status nccl_warm(rt_gpu_model *g, struct gm_graph *gr, g5_error *err) {
#ifdef G5_HAVE_NCCL
    if (g->coll != COLL_NCCL || gr->nccl_warm) return G5_OK;
    nccl_api *a = &g->nccl;
    const size_t cnt = g->hp.n_embd;
    ncclResult_t nr = a->group_start();
    cudaError_t ce = cudaSuccess;
    for (uint32_t r = 0; r < g->T && nr == ncclSuccess && ce == cudaSuccess; r++) {
        gl_rank *rk = &g->rk[r];
        ce = cudaSetDevice(rk->dev);
        if (ce == cudaSuccess) nr = a->all_reduce(rk->red, rk->red, cnt, ncclFloat32, ncclSum, rk->comm, rk->st);
    }
    const ncclResult_t ne = a->group_end();
    if (ce != cudaSuccess) return g5_fail(err, G5_ERR_INTERNAL, "cudaSetDevice: %s", cudaGetErrorString(ce));
    if (nr != ncclSuccess || ne != ncclSuccess)
        return g5_fail(err, G5_ERR_INTERNAL, "ncclAllReduce (before the graph capture): %s",
                       a->error_string(nr != ncclSuccess ? nr : ne));
    for (uint32_t r = 0; r < g->T; r++) {
        CUK_CHECK(cudaSetDevice(g->rk[r].dev));
        CUK_CHECK(cudaStreamSynchronize(g->rk[r].st));
    }
    gr->nccl_warm = 1;
#else
    (void)g;
    (void)gr;
    (void)err;
#endif
    return G5_OK;
}

/* gm_forward_device recorded into one graph per stream: every rank that owns its stream (each
 * rank under NCCL or alone; under the device-side sum all ranks work on rank 0's) is captured at
 * once, each on its own device, the ranks' launches interleaved as in the plain path and NCCL's
 * grouped all-reduces landing in each rank's capture; then one executable graph per such rank.
 * Thread-local capture mode: one thread drives all of the process's ranks, and NCCL switches
 * itself to relaxed mode where it must allocate during a capture.
 *
 * Not an update in place (cudaGraphExecUpdate): between buckets a node can change kernel (the
 * score kernels), cluster shape or launch attributes, and with accepted updates, bench_decode's
 * contexts 32k, 8k, then 1k keys in one process gave non-finite logits at 1k on the H200, and
 * with a fresh instantiation per capture finite ones (test_gpu_graph's "graph shrink" checks that
 * order against plain launches); captures are rare (one per bucket, sequence or buffer change),
 * so the instantiation's cost does not matter. */
static g5_status capture(rt_gpu_model *g, struct gm_graph *gr, const fplan *pl, uint32_t bound,
                         const rt_gpu_outputs *out, int mode, g5_error *err) {
    gr->valid = 0;
    execs_free(g, gr);
    CK(nccl_warm(g, gr, err));
    cudaGraph_t *graphs = calloc(g->T, sizeof *graphs);
    uint8_t *begun = calloc(g->T, 1);
    if (!graphs || !begun) {
        free(graphs);
        free(begun);
        return g5_fail(err, G5_ERR_NOMEM, "CUDA graph capture of %u ranks", g->T);
    }
    g5_status st = G5_OK;
    cudaError_t ce = cudaSuccess;
    for (uint32_t r = 0; r < g->T && ce == cudaSuccess; r++) {
        gl_rank *rk = &g->rk[r];
        if (!rk->own_stream) continue;
        ce = cudaSetDevice(rk->dev);
        if (ce == cudaSuccess) ce = cudaStreamBeginCapture(rk->st, cudaStreamCaptureModeThreadLocal);
        begun[r] = ce == cudaSuccess;
    }
    if (ce != cudaSuccess) {
        st = g5_fail(err, G5_ERR_INTERNAL, "CUDA graph capture of the decode step: begin: %s", cudaGetErrorString(ce));
    } else {
        g->graph_bound = mode == GM_DEV_GRAPH ? bound : 0; /* a batched step's bound is rk->multi */
        st = gm_forward_device(g, pl, out, mode, err);
        g->graph_bound = 0;
    }
    /* every capture begun is ended, whatever failed, so that the streams stay usable */
    for (uint32_t r = 0; r < g->T; r++) {
        if (!begun[r]) continue;
        cudaError_t ee = cudaSetDevice(g->rk[r].dev);
        if (ee == cudaSuccess) ee = cudaStreamEndCapture(g->rk[r].st, &graphs[r]);
        if (!st && ee != cudaSuccess)
            st = g5_fail(err, G5_ERR_INTERNAL, "CUDA graph capture of the decode step (rank %u): %s", g->rk[r].rg,
                         cudaGetErrorString(ee));
    }
    g->info.graph_captures++;
    for (uint32_t r = 0; r < g->T && !st && mode == GM_DEV_GRAPH; r++) { /* a one-token step's launch count */
        size_t nn = 0;
        if (graphs[r] && cudaGraphGetNodes(graphs[r], NULL, &nn) == cudaSuccess) {
            g->info.graph_nodes = nn;
            break;
        }
    }
    for (uint32_t r = 0; r < g->T && !st; r++) {
        if (!graphs[r]) continue;
        cudaError_t ge = cudaSetDevice(g->rk[r].dev);
        if (ge == cudaSuccess) ge = cudaGraphInstantiate(&gr->rk[r].exec, graphs[r], 0);
        if (ge != cudaSuccess) {
            gr->rk[r].exec = NULL;
            st = g5_fail(err, G5_ERR_INTERNAL, "cudaGraphInstantiate (decode step, rank %u): %s", g->rk[r].rg,
                         cudaGetErrorString(ge));
        }
    }
    for (uint32_t r = 0; r < g->T; r++)
        if (graphs[r]) {
            cudaSetDevice(g->rk[r].dev);
            cudaGraphDestroy(graphs[r]);
        }
    free(graphs);
    free(begun);
    if (st) {
        execs_free(g, gr);
        return st;
    }
    g->info.graph_instantiations++;
    key_store(gr, g, pl, bound, out && (out->logits || out->argmax || out->draw));
    for (uint32_t r = 0; r < g->T; r++) gr->rk[r].head_q8 = g->rk[r].head_q8;
    return G5_OK;
}

/* Every rank's graph launched before any is waited for: under NCCL each one's all-reduces wait
 * for the others'. */
static g5_status launch(rt_gpu_model *g, const struct gm_graph *gr, g5_error *err) {
    for (uint32_t r = 0; r < g->T; r++) {
        gl_rank *rk = &g->rk[r];
        if (!gr->rk[r].exec) continue;
        CUK_CHECK(cudaSetDevice(rk->dev));
        CUK_CHECK(cudaGraphLaunch(gr->rk[r].exec, rk->st));
    }
    g->info.graph_steps++;
    return G5_OK;
}

static struct gm_graph *graph_new(const rt_gpu_model *g) {
    return calloc(1, sizeof(struct gm_graph) + (size_t)g->T * sizeof(grank));
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
    if (!g->graph && !(g->graph = graph_new(g))) return g5_fail(err, G5_ERR_NOMEM, "CUDA graph state");
    struct gm_graph *gr = g->graph;
    if (!gr->rk[0].exec || !key_same(gr, g, pl, bound, out && (out->logits || out->argmax || out->draw)))
        CK(capture(g, gr, pl, bound, out, GM_DEV_GRAPH, err));
    CK(launch(g, gr, err));
    const uint64_t E = g->hp.n_embd;
    if (out && out->hidden) {
        CUK_CHECK(cudaSetDevice(r0->dev));
        CUK_CHECK(cudaMemcpyAsync(out->hidden, r0->h, E * 4, cudaMemcpyDeviceToHost, r0->st));
    }
    if (out && out->logits)
        for (uint32_t r = 0; r < g->T; r++) {
            gl_rank *rk = &g->rk[r];
            if (!rk->head_write) continue;
            CUK_CHECK(cudaSetDevice(rk->dev));
            CUK_CHECK(cudaMemcpyAsync(out->logits + rk->head_col0, rk->lg, (size_t)rk->head.m * 4, cudaMemcpyDeviceToHost,
                               rk->st));
        }
    /* after the replay, on each rank's stream: the row's argmax from the logits the graph left */
    if (out && out->argmax)
        for (uint32_t r = 0; r < g->T; r++) {
            gl_rank *rk = &g->rk[r];
            if (!rk->head_write) continue;
            CUK_CHECK(cudaSetDevice(rk->dev));
            CK(gm_head_argmax(rk, 0, 1, err));
            CK(gm_head_argmax_out(g, rk, 1, err));
        }
    if (out && out->draw) { /* rt_gpu_info.draws: rank 0 holds the whole head */
        gl_rank *rk = &g->rk[0];
        CUK_CHECK(cudaSetDevice(rk->dev));
        CK(gm_head_draw(g, rk, 0, 1, err));
        CK(gm_head_draw_out(g, rk, 1, err));
    }
    return G5_OK;
}

/* A batched step's rows are independent of the sequences they belong to: the attention kernels
 * read each row's caches, capacity and position from rk->mrows (uploaded before every launch),
 * the other stages see only the row count, and rk->multi (the key count the indexer's and the
 * attention's launches are shaped for) is the bucket: so one graph per row count serves every
 * batch of that size until the bucket or a work buffer changes. The head runs after the replay
 * (its logits copies go to the caller's rows, and a step of more than CUK_GEMV_MAX_N rows reuses
 * rk->lg between chunks). Bits: the kernels' per-row order does not depend on the key count they
 * are shaped for (cuk_model.h), so a replay gives the plain launches' rows. */
g5_status gm_forward_graph_rows(rt_gpu_model *g, const fplan *pl, uint32_t bound, const rt_gpu_outputs *out,
                                g5_error *err) {
    const uint32_t n = pl->n;
    if (n < 2 || n > GM_RGRAPH_MAX || pl->n_seg != n || !bound)
        return g5_fail(err, G5_ERR_INTERNAL, "batched graph step: %u row(s) in %u segment(s), bound %u", n, pl->n_seg,
                       bound);
    for (uint32_t r = 0; r < g->T; r++)
        if (g->rk[r].multi != bound || g->rk[r].sc_cap < (uint64_t)n * bound)
            return g5_fail(err, G5_ERR_INTERNAL, "batched graph step: rank %u shaped for %u keys, %llu scores; bound %u",
                           r, g->rk[r].multi, (unsigned long long)g->rk[r].sc_cap, bound);
    for (uint32_t i = 0; i < n; i++)
        if ((uint64_t)pl->pos0[i] + 1 > bound)
            return g5_fail(err, G5_ERR_INTERNAL, "batched graph step: row %u at position %u, bound %u", i, pl->pos0[i],
                           bound);
    if (!g->rgraph[n] && !(g->rgraph[n] = graph_new(g))) return g5_fail(err, G5_ERR_NOMEM, "CUDA graph state");
    struct gm_graph *gr = g->rgraph[n];
    const int head = out && (out->logits || out->argmax || out->draw);
    if (!gr->rk[0].exec || !key_same(gr, g, pl, bound, head)) CK(capture(g, gr, pl, bound, out, GM_DEV_BODY, err));
    CK(launch(g, gr, err));
    /* the head reads the int8 rows the replayed norm wrote, as the capture described them */
    for (uint32_t r = 0; r < g->T; r++) g->rk[r].head_q8 = gr->rk[r].head_q8;
    if (out && out->hidden) {
        gl_rank *r0 = &g->rk[0];
        CUK_CHECK(cudaSetDevice(r0->dev));
        CUK_CHECK(cudaMemcpyAsync(out->hidden, r0->h, (size_t)n * g->hp.n_embd * 4, cudaMemcpyDeviceToHost, r0->st));
    }
    return gm_forward_head(g, pl, out, err);
}

void gm_graph_free(rt_gpu_model *g) {
    if (g->graph) execs_free(g, g->graph);
    free(g->graph);
    g->graph = NULL;
    for (uint32_t n = 0; n <= GM_RGRAPH_MAX; n++) {
        if (g->rgraph[n]) execs_free(g, g->rgraph[n]);
        free(g->rgraph[n]);
        g->rgraph[n] = NULL;
    }
}

typedef int rt_gpu_graph_unused_;
#endif
