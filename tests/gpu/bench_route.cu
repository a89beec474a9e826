/* cuk_moe_route alone at GLM-5's routing (256 experts, 8 per token, one group, sigmoid gating,
 * bias, normalized weights times 2.5), n_tok 1 and 8, against an empty kernel of the same grid
 * and block (the launch floor). Each row: us per launch, launched one after another (NB launches
 * between two events) and as one captured graph of NB launches (launch overhead removed). The
 * kernel overwrites its logits with the scores, so every launch of a batch gets its own copy of
 * the logits, refreshed from a master copy before each batch (outside the timed interval).
 * tests/gpu/test_rowops.c checks the kernel's picks and weights. Usage: bench_route [reps] */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuk_model.h"
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

__global__ void k_empty(cuk_route_args a) {
    if (threadIdx.x == 1023) a.ids[0] = 0; /* never: keeps the argument live */
}

typedef enum { V_ROUTE, V_EMPTY, N_V } variant;
static const char *const VNAME[N_V] = {"cuk_moe_route", "empty"};

static void launch(variant v, const cuk_route_args *a, cudaStream_t st) {
    if (v == V_ROUTE) {
        g5_error err;
        memset(&err, 0, sizeof err); /* C++: no {0} for the status member */
        if (cuk_moe_route(a, st, &err) != G5_OK) {
            fprintf(stderr, "cuk_moe_route: %s\n", err.msg);
            exit(1);
        }
        return;
    }
    k_empty<<<a->n_tok, THREADS, 0, st>>>(*a);
    CK(cudaGetLastError());
}

typedef struct bufs {
    float *src, *work, *bias, *wts; /* src, work: [NB][MAX_TOK][NE]; wts: [NB][MAX_TOK][U] */
    int32_t *ids;                   /* [NB][MAX_TOK][U] */
} bufs;

static cuk_route_args args_for(const bufs *b, int i, int n_tok) {
    const size_t off = (size_t)i * MAX_TOK;
    cuk_route_args a = {b->work + off * NE, NE, b->bias, n_tok, NE, U, 1, 1, 2, 1, SCALE, b->ids + off * U,
                        b->wts + off * U, NULL};
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

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 20;
    if (reps < 1) {
        fprintf(stderr, "usage: bench_route [reps >= 1]\n");
        return 2;
    }
    const size_t nl = (size_t)NB * MAX_TOK * NE, no = (size_t)NB * MAX_TOK * U;
    float *h = (float *)malloc(nl * 4), hb[NE];
    if (!h) return 2;
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
    cudaFree(b.src), cudaFree(b.work), cudaFree(b.bias), cudaFree(b.wts), cudaFree(b.ids);
    free(h);
    return 0;
}
