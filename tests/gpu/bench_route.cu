/* cuk_moe_route alone at GLM-5's routing (256 experts, 8 per token, one group, sigmoid gating,
 * bias, normalized weights times 2.5), n_tok 1 and 8: the old and the warp kernel
 * (cuda/route_select.h) through the launcher, and probes that time parts of the old kernel:
 *   probe copy      a copy of k_route's path for these parameters (no groups, no NaN): should
 *                   time as the old kernel does
 *   probe no-rank   the same without the rank loop (the first n_used experts are "picked")
 *   probe no-tail   the same with thread 0's float64 sum and divisions replaced by score * scale
 *   probe bare      neither (loads, sigmoid, stores and the barriers)
 *   empty           an empty kernel of the same grid and block: the launch floor
 * Each row: us per launch, launched one after another (NB launches between two events) and as
 * one captured graph of NB launches (launch overhead removed). The kernel overwrites its logits
 * with the scores, so every launch of a batch gets its own copy of the logits, refreshed from a
 * master copy before each batch (outside the timed interval). Last: old vs warp outputs on the
 * benchmark's inputs (must be the same bits; tests/gpu/test_rowops.c checks adversarial inputs).
 * Usage: bench_route [reps] */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuk_model.h"
#include "cuda/route_select.h"
#include "format/status.h"

#include "tests/gpu/bench_util.h"

enum { NE = 256, U = 8, NB = 100, MAX_TOK = 8, THREADS = 256 };
static const float SCALE = 2.5f;

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float unif(float a, float b) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return a + (b - a) * (float)((rng >> 40) * (1.0 / 16777216.0));
}

enum { P_NO_RANK = 1, P_NO_TAIL = 2 };

/* k_route (cuda/model_ops.cu) for sigmoid gating, one group and no NaN choice, parts removed by
 * MODE; the same shared-memory layout and barriers. */
template <int MODE> __global__ void __launch_bounds__(1024) k_probe(cuk_route_args a) {
    extern __shared__ float sh[];
    const int ne = a.n_expert, u = a.n_used, G = a.n_group;
    float *choice = sh;                                    /* [ne] */
    float *score = sh + ne;                                /* [ne] */
    int32_t *pick = (int32_t *)(score + ne + G);           /* [64] */
    int32_t *wcnt = pick + 64;                             /* [32] */
    const int t = blockIdx.x, e = threadIdx.x, lane = e & 31, warp = e >> 5;
    const bool mine = e < ne;
    float *lg = a.logits + (int64_t)t * a.ld_logits;
    const float l = mine ? lg[e] : 0.0f;
    const float bias = mine && a.bias ? a.bias[e] : 0.0f;
    const float sc = 1.0f / (1.0f + expf(-l));
    if (mine) {
        lg[e] = sc;
        score[e] = sc;
        choice[e] = __fadd_rn(sc, bias);
    }
    __syncthreads();
    const bool elig = mine;
    const float ce = mine ? choice[e] : 0.0f;
    if (__syncthreads_or(elig && ce != ce)) return; /* not benchmarked */
    __syncthreads();
    int rank = 0;
    if (MODE & P_NO_RANK) rank = e;
    else if (elig)
        for (int i = 0; i < ne && rank < u; i++) {
            const float o = choice[i];
            rank += o > ce || (o == ce && i < e);
        }
    const bool sel = elig && rank < u;
    const unsigned bal = __ballot_sync(0xffffffffu, sel);
    if (lane == 0) wcnt[warp] = __popc(bal);
    __syncthreads();
    if (sel) {
        int p = __popc(bal & ((1u << lane) - 1u));
        for (int i = 0; i < warp; i++) p += wcnt[i];
        pick[p] = e;
    }
    __syncthreads();
    if (e != 0) return;
    int32_t *ch = a.ids + (int64_t)t * u;
    float *cw = a.wts + (int64_t)t * u;
    if (MODE & P_NO_TAIL) {
        for (int k = 0; k < u; k++) {
            ch[k] = pick[k];
            cw[k] = __fmul_rn(score[pick[k]], a.scale);
        }
        return;
    }
    double sum = 0;
    float w[64];
    for (int k = 0; k < u; k++) sum += (w[k] = score[pick[k]]);
    for (int k = 0; k < u; k++) {
        float v = w[k];
        if (a.norm) v = (float)(v / (sum + 1e-20));
        ch[k] = pick[k];
        cw[k] = __fmul_rn(v, a.scale);
    }
}

__global__ void k_empty(cuk_route_args a) {
    if (threadIdx.x == 1023) a.ids[0] = 0; /* never: keeps the argument live */
}

typedef enum { V_OLD, V_WARP, V_COPY, V_NO_RANK, V_NO_TAIL, V_BARE, V_EMPTY, N_V } variant;
static const char *const VNAME[N_V] = {"old (k_route)",  "warp (k_route_warp)", "probe copy", "probe no-rank",
                                       "probe no-tail", "probe bare",          "empty"};

static void launch(variant v, const cuk_route_args *a, cudaStream_t st) {
    const size_t smem = (size_t)(2 * NE + 1) * 4 + (64 + 32) * 4 + NE + 16;
    switch (v) {
    case V_OLD:
    case V_WARP:
    {
        cuk_route_set_warp(v == V_WARP);
        g5_error err;
        memset(&err, 0, sizeof err); /* C++: no {0} for the status member */
        if (cuk_moe_route(a, st, &err) != G5_OK) {
            fprintf(stderr, "cuk_moe_route: %s\n", err.msg);
            exit(1);
        }
        return;
    }
    case V_COPY: k_probe<0><<<a->n_tok, THREADS, smem, st>>>(*a); break;
    case V_NO_RANK: k_probe<P_NO_RANK><<<a->n_tok, THREADS, smem, st>>>(*a); break;
    case V_NO_TAIL: k_probe<P_NO_TAIL><<<a->n_tok, THREADS, smem, st>>>(*a); break;
    case V_BARE: k_probe<P_NO_RANK | P_NO_TAIL><<<a->n_tok, THREADS, smem, st>>>(*a); break;
    default: k_empty<<<a->n_tok, THREADS, 0, st>>>(*a); break;
    }
    CK(cudaGetLastError());
}

typedef struct bufs {
    float *src, *work, *bias, *wts; /* src, work: [NB][MAX_TOK][NE]; wts: [NB][MAX_TOK][U] */
    int32_t *ids;                   /* [NB][MAX_TOK][U] */
} bufs;

static cuk_route_args args_for(const bufs *b, int i, int n_tok) {
    const size_t off = (size_t)i * MAX_TOK;
    cuk_route_args a = {b->work + off * NE, NE, b->bias, n_tok, NE, U, 1, 1, 2, 1, SCALE, b->ids + off * U,
                        b->wts + off * U};
    return a;
}

/* us per launch of v over reps batches of NB launches: [0] launched, [1] one graph per batch */
static void time_variant(variant v, const bufs *b, int n_tok, int reps, cudaStream_t st, double us[2]) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const size_t bytes = (size_t)NB * MAX_TOK * NE * 4;
    for (int i = 0; i < NB; i++) { /* warm-up */
        const cuk_route_args a = args_for(b, i, n_tok);
        launch(v, &a, st);
    }
    double tot = 0;
    for (int r = 0; r < reps; r++) {
        CK(cudaMemcpyAsync(b->work, b->src, bytes, cudaMemcpyDeviceToDevice, st));
        CK(cudaEventRecord(e0, st));
        for (int i = 0; i < NB; i++) {
            const cuk_route_args a = args_for(b, i, n_tok);
            launch(v, &a, st);
        }
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        tot += ms;
    }
    us[0] = tot * 1e3 / ((double)reps * NB);
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < NB; i++) {
        const cuk_route_args a = args_for(b, i, n_tok);
        launch(v, &a, st);
    }
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphLaunch(ge, st)); /* warm-up */
    tot = 0;
    for (int r = 0; r < reps; r++) {
        CK(cudaMemcpyAsync(b->work, b->src, bytes, cudaMemcpyDeviceToDevice, st));
        CK(cudaEventRecord(e0, st));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        tot += ms;
    }
    us[1] = tot * 1e3 / ((double)reps * NB);
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
}

/* ids and weights of v on fresh copies of every batch slot, all n_tok tokens */
static void outputs(variant v, const bufs *b, int n_tok, cudaStream_t st, int32_t *ids, float *w) {
    const size_t bytes = (size_t)NB * MAX_TOK * NE * 4;
    CK(cudaMemsetAsync(b->ids, 0xff, (size_t)NB * MAX_TOK * U * 4, st));
    CK(cudaMemsetAsync(b->wts, 0xff, (size_t)NB * MAX_TOK * U * 4, st));
    CK(cudaMemcpyAsync(b->work, b->src, bytes, cudaMemcpyDeviceToDevice, st));
    for (int i = 0; i < NB; i++) {
        const cuk_route_args a = args_for(b, i, n_tok);
        launch(v, &a, st);
    }
    CK(cudaStreamSynchronize(st));
    CK(cudaMemcpy(ids, b->ids, (size_t)NB * MAX_TOK * U * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(w, b->wts, (size_t)NB * MAX_TOK * U * 4, cudaMemcpyDeviceToHost));
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 20;
    if (reps < 1) {
        fprintf(stderr, "usage: bench_route [reps >= 1]\n");
        return 2;
    }
    const size_t nl = (size_t)NB * MAX_TOK * NE, no = (size_t)NB * MAX_TOK * U;
    float *h = (float *)malloc(nl * 4), hb[NE];
    int32_t *ids0 = (int32_t *)malloc(no * 4), *ids1 = (int32_t *)malloc(no * 4);
    float *w0 = (float *)malloc(no * 4), *w1 = (float *)malloc(no * 4);
    if (!h || !ids0 || !ids1 || !w0 || !w1) return 2;
    /* router logits of a trained model are a few units wide; the selection bias is small */
    for (size_t i = 0; i < nl; i++) h[i] = unif(-4.0f, 4.0f);
    for (int i = 0; i < NE; i++) hb[i] = unif(-0.05f, 0.05f);
    bufs b;
    CK(cudaMalloc((void **)&b.src, nl * 4));
    CK(cudaMalloc((void **)&b.work, nl * 4));
    CK(cudaMalloc((void **)&b.bias, NE * 4));
    CK(cudaMalloc((void **)&b.wts, no * 4));
    CK(cudaMalloc((void **)&b.ids, no * 4));
    CK(cudaMemcpy(b.src, h, nl * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b.bias, hb, NE * 4, cudaMemcpyHostToDevice));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("bench_route: %s, NE %d U %d sigmoid bias norm scale %.1f; %d launches per batch, %d batches\n", prop.name,
           NE, U, SCALE, NB, reps);
    printf("  %-22s %6s %12s %12s\n", "variant", "n_tok", "launched us", "graph us");
    static const int toks[] = {1, 8};
    for (int ti = 0; ti < 2; ti++)
        for (int v = 0; v < N_V; v++) {
            double us[2];
            time_variant((variant)v, &b, toks[ti], reps, st, us);
            printf("  %-22s %6d %12.2f %12.2f\n", VNAME[v], toks[ti], us[0], us[1]);
        }
    cuk_route_set_warp(-1);
    for (int ti = 0; ti < 2; ti++) {
        const int n_tok = toks[ti];
        outputs(V_OLD, &b, n_tok, st, ids0, w0);
        const variant cmp[] = {V_WARP, V_COPY};
        for (int c = 0; c < 2; c++) {
            outputs(cmp[c], &b, n_tok, st, ids1, w1);
            long bad_i = 0, bad_w = 0;
            for (int i = 0; i < NB; i++)
                for (int k = 0; k < n_tok * U; k++) {
                    const size_t j = (size_t)i * MAX_TOK * U + k;
                    bad_i += ids0[j] != ids1[j];
                    bad_w += memcmp(&w0[j], &w1[j], 4) != 0;
                }
            printf("n_tok %d: %s vs old: %ld ids and %ld weights differ (of %d)\n", n_tok, VNAME[cmp[c]], bad_i, bad_w,
                   NB * n_tok * U);
        }
    }
    cuk_route_set_warp(-1);
    cudaFree(b.src), cudaFree(b.work), cudaFree(b.bias), cudaFree(b.wts), cudaFree(b.ids);
    free(h), free(ids0), free(ids1), free(w0), free(w1);
    return 0;
}
