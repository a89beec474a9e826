/* Decode attention as the runtime launches it (cuk_mla_attend_fresh for one sequence,
 * cuk_mla_attend_multi for a batch), precise mode's float32 kernel (tc 0, k_attend_hg) against
 * fast mode's tensor-core kernel (tc 1, cuda/attn_dec.cu), over a bf16 latent cache with the
 * step's own row in float32: GLM-5's 64 heads (TP 1) and 8 (TP 8), 1 and 32 sequences, contexts
 * of 512, 4096 and 32768 keys (index_topk 2048 selected, at random, past 2048). Each sequence has
 * its own cache; per call: us, the selected latent rows' bytes, GB/s and the ratio to a D2D copy
 * measured in the same run (time: 20 launches captured in one CUDA graph, replayed, as a decode
 * step runs them); the two kernels' outputs compared (max abs difference).
 * Usage: bench_mla_dec [HEADS SEQS KEYS] (one case alone, e.g. under ncu) */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuk_model.h"
#include "format/quant.h"

#include "tests/gpu/bench_util.h"

enum { NOPE = 192, R = 64, KL = 512, KVW = KL + R, TOPK = 2048, MAXB = 32 };

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint64_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static float unif(float a, float b) { return a + (b - a) * (float)((rnd() >> 40) * (1.0 / 16777216.0)); }

static double copy_gbs;

static double run(int H, int B, int P, uint32_t tc, float *out_h) {
    const int pos = P - 1;
    const int64_t qw = (int64_t)H * (NOPE + R), lw = (int64_t)H * KL;
    float *q = malloc((size_t)B * qw * 4), *ql = malloc((size_t)B * lw * 4), *fr = malloc((size_t)B * KVW * 4);
    uint16_t *lat = malloc((size_t)P * KVW * 2);
    int32_t *sel = malloc((size_t)B * TOPK * 4), *ns = malloc((size_t)B * 4);
    uint8_t *used = calloc((size_t)P, 1);
    if (!q || !ql || !fr || !lat || !sel || !ns || !used) exit(2);
    rng = 0x2545F4914F6CDD1Dull + (uint64_t)H * 131 + (uint64_t)B * 7 + (uint64_t)P; /* the same inputs for both kernels */
    for (int64_t i = 0; i < B * qw; i++) q[i] = unif(-1, 1);
    for (int64_t i = 0; i < B * lw; i++) ql[i] = unif(-1, 1);
    for (int64_t i = 0; i < B * KVW; i++) fr[i] = unif(-1, 1);
    for (int64_t i = 0; i < (int64_t)P * KVW; i++) lat[i] = quant_f32_to_bf16(unif(-1, 1));
    cuk_seq_row rows[MAXB];
    void *dl[MAXB];
    for (int b = 0; b < B; b++) {
        int32_t *s = sel + (int64_t)b * TOPK;
        if (P <= TOPK) {
            for (int u = 0; u < P; u++) s[u] = u;
            ns[b] = P;
        } else {
            memset(used, 0, (size_t)P);
            for (int u = 0; u < TOPK; u++) {
                int64_t j;
                do j = (int64_t)(rnd() % (uint64_t)P); while (used[j]);
                used[j] = 1;
            }
            int u = 0;
            for (int j = 0; j < P; j++)
                if (used[j]) s[u++] = j;
            ns[b] = TOPK;
        }
        dl[b] = dup_d(lat, (size_t)P * KVW * 2);
        rows[b] = (cuk_seq_row){dl[b], NULL, P, pos};
    }
    float *dq = dup_d(q, (size_t)B * qw * 4), *dql = dup_d(ql, (size_t)B * lw * 4), *dfr = dup_d(fr, (size_t)B * KVW * 4);
    int32_t *dsel = dup_d(sel, (size_t)B * TOPK * 4), *dns = dup_d(ns, (size_t)B * 4);
    cuk_seq_row *drows = dup_d(rows, sizeof rows[0] * (size_t)B);
    float *dout = dalloc((size_t)B * lw * 4);
    const float scale = (float)(1.0 / sqrt((double)(NOPE + R)));
    const cuk_mla_attend_args a = {.d = {1, H, NOPE, R, KL}, .q = dq, .qlat = dql, .lat = dl[0], .lat_type = CUK_BF16,
                                   .fresh = dfr, .fresh0 = pos, .n_pos = P, .sel = dsel, .ld_sel = TOPK, .n_sel = dns,
                                   .max_sel = TOPK, .scale = scale, .out = dout, .tc = tc};
    const cuk_attend_multi_args m = {{B, H, NOPE, R, KL}, dq, dql, CUK_BF16, dfr, drows, P, dsel, TOPK, dns, TOPK,
                                     scale, dout, tc};
    cudaEvent_t e0, e1;
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    /* one graph of `iters` launches, replayed: the kernel's own time, no host launch gaps */
    const int iters = 20;
    for (int i = 0; i < 3; i++) {
        if (B == 1) GK(cuk_mla_attend_fresh(&a, (cuk_stream)st, &err_));
        else GK(cuk_mla_attend_multi(&m, (cuk_stream)st, &err_));
    }
    CK(cudaStreamSynchronize(st));
    cudaGraph_t gr;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < iters; i++) {
        if (B == 1) GK(cuk_mla_attend_fresh(&a, (cuk_stream)st, &err_));
        else GK(cuk_mla_attend_multi(&m, (cuk_stream)st, &err_));
    }
    CK(cudaStreamEndCapture(st, &gr));
    CK(cudaGraphInstantiate(&ge, gr, 0));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(e0, st));
    for (int r = 0; r < 5; r++) CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    ms /= 5;
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(gr));
    CK(cudaStreamDestroy(st));
    CK(cudaMemcpy(out_h, dout, (size_t)B * lw * 4, cudaMemcpyDeviceToHost));
    for (int b = 0; b < B; b++) cudaFree(dl[b]);
    cudaFree(dq), cudaFree(dql), cudaFree(dfr), cudaFree(dsel), cudaFree(dns), cudaFree(drows), cudaFree(dout);
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    free(q), free(ql), free(fr), free(lat), free(sel), free(ns), free(used);
    return ms * 1e3 / iters;
}

int main(int argc, char **argv) {
    copy_gbs = bench_copy_gbs();
    int heads[] = {64, 8}, batches[] = {1, 32}, ctx[] = {512, 4096, 32768}, nh = 2, nb = 2, nc = 3;
    if (argc == 4) {
        heads[0] = atoi(argv[1]);
        batches[0] = atoi(argv[2]);
        ctx[0] = atoi(argv[3]);
        nh = nb = nc = 1;
        if (heads[0] < 1 || heads[0] > 128 || batches[0] < 1 || batches[0] > MAXB || ctx[0] < 1) {
            fprintf(stderr, "bench_mla_dec: HEADS 1..128, SEQS 1..%d, KEYS >= 1\n", MAXB);
            return 2;
        }
    } else if (argc != 1) {
        fprintf(stderr, "usage: bench_mla_dec [HEADS SEQS KEYS]\n");
        return 2;
    }
    printf("| heads | seqs | keys | f32 kernel us | tensor-core us | MB read | tc GB/s (of copy) | max |diff| |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
    int bad = 0;
    for (int hi = 0; hi < nh; hi++)
        for (int bi = 0; bi < nb; bi++)
            for (int ci = 0; ci < nc; ci++) {
                const int H = heads[hi], B = batches[bi], P = ctx[ci];
                const size_t n = (size_t)B * H * KL;
                float *o0 = malloc(n * 4), *o1 = malloc(n * 4);
                if (!o0 || !o1) exit(2);
                const double u0 = run(H, B, P, 0, o0), u1 = run(H, B, P, 1, o1);
                double dmax = 0;
                for (size_t i = 0; i < n; i++) {
                    const double d = fabs((double)o0[i] - o1[i]);
                    if (!(d <= dmax)) dmax = d;
                }
                const double mb = (double)B * (P < TOPK ? P : TOPK) * KVW * 2 / 1e6;
                printf("| %d | %d | %d | %.2f | %.2f | %.2f | %.0f (%.3f) | %.2e |\n", H, B, P, u0, u1, mb,
                       mb * 1e3 / u1, mb * 1e3 / u1 / copy_gbs, dmax);
                bad += !(dmax < 2e-2);
                free(o0);
                free(o1);
                fflush(stdout);
            }
    printf("%s\n", bad ? "MISMATCH between the kernels" : "kernels agree (max |diff| < 2e-2)");
    return bad ? 1 : 0;
}
