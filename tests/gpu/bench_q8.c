/* int8-activation GEMV (cuda/cuk_q8.h: the dp4a cuk_gemv_q8 and the tensor-core cuk_gemv_q8t, the
 * latter also in its shared-x form for every launch, cuk_gemv_q8t_sx; one and two planes) against the float kernels fast decode ran before (cuk_gemv with bf16 x), n = 1,
 * 2, 4, 8 and 32, at the shapes of the roles that take it: the output head (154880 x
 * 6144 Q6_K at TP 1, 19360 x 6144 at TP 8), the shared expert (2048 x 6144, 6144 x 2048), and the
 * routed experts of one decode token (64 experts of 2048 x 6144 gate/up, 6144 x 2048 down, 8
 * chosen: cuk_moe_gate_up/_down vs the _q8 ones), and a batched step's routed experts (1 to 32
 * tokens on 8 of 64 experts each: the dp4a cuk_moe_*_q8 vs the tensor-core cuk_moe_*_q8t). Weights rotate through copies filling >= 1 GiB
 * so L2 holds none between launches; random blocks. Ceiling in the same run: D2D cudaMemcpy of
 * 512 MiB (read + written). Prints us per launch (mean of iters after 3 warm-ups), GB/s of
 * weight bytes and the ratio to the copy rate; the quantizer's time on its own.
 * Usage: bench_q8 [iters [TYPE M K N]]: with a shape, that one row alone (for ncu). */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuk.h"
#include "cuda/cuk_model.h"
#include "cuda/cuk_q8.h"
#include "format/quant.h"

#include "tests/gpu/bench_util.h"

#define POOL_BYTES (2ull << 30)

static cudaEvent_t ev_a, ev_b;
static int iters = 50;

static float elapsed_ms(void) {
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, ev_a, ev_b));
    return ms;
}

static double copy_rate(uint8_t *pool) {
    const size_t half = POOL_BYTES / 2;
    CK(cudaMemcpy(pool + half, pool, half, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(ev_a, NULL));
    for (int i = 0; i < 10; i++) CK(cudaMemcpyAsync(pool + half, pool, half, cudaMemcpyDeviceToDevice, NULL));
    CK(cudaEventRecord(ev_b, NULL));
    CK(cudaEventSynchronize(ev_b));
    return 2.0 * (double)half * 10 / (elapsed_ms() * 1e-3);
}

/* Fills the pool with copies of one random matrix set of `bytes`; returns the copy count. */
static int fill_pool(uint8_t *pool, uint32_t t, uint64_t bytes, uint64_t *stride) {
    const quant_type_info *ti = quant_type_get(t);
    *stride = (bytes + 255) & ~255ull;
    uint8_t *h = malloc(bytes);
    if (!h) exit(2);
    uint64_t st = 777;
    if (quant_fill_random(t, h, bytes / ti->block_bytes, &st) != G5_OK) exit(2);
    const int copies = (int)(POOL_BYTES / *stride);
    CK(cudaMemcpy(pool, h, bytes, cudaMemcpyHostToDevice));
    for (int i = 1; i < copies; i++) CK(cudaMemcpy(pool + i * *stride, pool, bytes, cudaMemcpyDeviceToDevice));
    free(h);
    return copies;
}

typedef struct ops {
    void *x16;       /* bf16 [32][32768] */
    float *xf;       /* f32 [32][32768] */
    int8_t *q;       /* [32][32768] */
    float *ds;       /* [32][2048] */
    int8_t *q2;      /* [32][32768]: two planes of the current shape's k */
    float *ds2;      /* [32][2048] */
    float *y, *part; /* [8 * 8][160000] */
    int32_t *ids, *plan;
    float *wts;
    void *fx;        /* cuk_gemv_q8t's scratch: 16384 * CUK_Q8T_SCRATCH_PER_K bytes */
} ops;

/* The variants of one shape at n vectors: cuk_gemv with bf16 x (n <= 8), cuk_gemv_q8 (dp4a, in
 * launches of 8 as the runtime makes them) with one and two planes, cuk_gemv_q8t (tensor cores,
 * its form by shape, with scratch as the runtime gives it), cuk_gemv_q8t_sx (the shared-x form
 * throughout), cuk_gemv_q8t without scratch (x never re-laid out) and cuk_gemv_q8_xs (the dp4a
 * kernel with x staged in shared memory, in launches of 8; Q4_K, Q5_K, Q8_0), each with one and
 * two planes. */
static void gemv_row(uint8_t *pool, const ops *o, uint32_t t, int64_t m, int64_t k, int n, double rate) {
    uint64_t rb = 0, stride = 0;
    if (quant_row_bytes(t, (uint64_t)k, &rb)) exit(2);
    const uint64_t bytes = rb * (uint64_t)m;
    const int copies = fill_pool(pool, t, bytes, &stride);
    const cuk_q8_quantize_args q2a = {o->xf, 32768, k, n, o->q2, 32768, o->ds2, 2048, 2};
    GK(cuk_q8_quantize(&q2a, NULL, &err_));
    double us[11];
    for (int v = 0; v < 11; v++) {
        us[v] = -1;
        if ((v == 0 && n > 8) || (v >= 3 && v <= 8 && !cuk_q8t_takes(t, k))) continue;
        /* the forms a device or type may refuse, probed once: a "-" where refused. The sx form needs
         * sm_90's shared memory; the dp4a xs form takes Q4_K, Q5_K, Q8_0 where the rows fit a block. */
        if ((v >= 5 && v <= 6) || v >= 9) {
            const int c = v >= 9 && n > CUK_Q8_MAX_N ? CUK_Q8_MAX_N : n;
            const cuk_q8_act xp = v == 10 ? (cuk_q8_act){o->q2, 32768, o->ds2, 2048, 2} : (cuk_q8_act){o->q, 32768, o->ds, 2048, 1};
            const cuk_gemv_q8_args g = {t, pool, k, m, xp, c, o->y, m, NULL, NULL};
            g5_error e = {0};
            const g5_status st = v >= 9 ? cuk_gemv_q8_xs(&g, NULL, &e) : cuk_gemv_q8t_sx(&g, NULL, &e);
            if (st == G5_ERR_UNSUPPORTED) continue;
            if (st != G5_OK) {
                fprintf(stderr, "bench_q8: %s: %s\n", v >= 9 ? "gemv_q8_xs" : "gemv_q8t_sx", e.msg);
                exit(BENCH_EXIT);
            }
        }
        for (int i = -3; i < iters; i++) {
            if (i == 0) CK(cudaEventRecord(ev_a, NULL));
            const void *w = pool + (uint64_t)((i + 3) % copies) * stride;
            const cuk_q8_act x1 = {o->q, 32768, o->ds, 2048, 1}, x2 = {o->q2, 32768, o->ds2, 2048, 2};
            if (v == 0) {
                const cuk_gemv_args g = {t, w, k, m, o->x16, CUK_ACT_BF16, 32768, n, o->y, m};
                GK(cuk_gemv(&g, NULL, &err_));
            } else if (v <= 2 || v >= 9) {
                for (int t0 = 0; t0 < n; t0 += CUK_Q8_MAX_N) {
                    cuk_q8_act x = v % 2 ? x1 : x2; /* v 1, 9: one plane */
                    x.q += t0 * x.ldq;
                    x.ds += t0 * x.ldds;
                    const int c = n - t0 < CUK_Q8_MAX_N ? n - t0 : CUK_Q8_MAX_N;
                    const cuk_gemv_q8_args g = {t, w, k, m, x, c, o->y + (int64_t)t0 * m, m, NULL, NULL};
                    GK(v <= 2 ? cuk_gemv_q8(&g, NULL, &err_) : cuk_gemv_q8_xs(&g, NULL, &err_));
                }
            } else {
                const cuk_gemv_q8_args g = {t, w, k, m, v % 2 ? x1 : x2, n, o->y, m, NULL, NULL};
                GK(v <= 4   ? cuk_gemv_q8t(&g, o->fx, (size_t)16384 * CUK_Q8T_SCRATCH_PER_K, NULL, &err_)
                   : v <= 6 ? cuk_gemv_q8t_sx(&g, NULL, &err_)
                            : cuk_gemv_q8t(&g, NULL, 0, NULL, &err_));
            }
        }
        CK(cudaEventRecord(ev_b, NULL));
        CK(cudaEventSynchronize(ev_b));
        us[v] = elapsed_ms() * 1e3 / iters;
    }
    printf("| %s | %lld x %lld | %d | %.1f |", quant_type_name(t), (long long)m, (long long)k, n, bytes / 1e6);
    for (int v = 0; v < 11; v++) {
        if (us[v] < 0) printf(" - |");
        else printf(" %.2f (%.3f) |", us[v], bytes / (us[v] * 1e-6) / rate);
    }
    printf("\n");
    fflush(stdout);
}

/* The pool's start: NE experts' gate and up (mg bytes each, t_gu) then down (md bytes, t_dn),
 * random blocks. */
static void fill_experts(uint8_t *pool, uint32_t t_gu, uint32_t t_dn, int NE, uint64_t mg, uint64_t md) {
    const uint64_t set = (uint64_t)NE * (2 * mg + md);
    const quant_type_info *ti_g = quant_type_get(t_gu), *ti_d = quant_type_get(t_dn);
    if (set > POOL_BYTES) exit(2);
    uint8_t *h = malloc(set);
    uint64_t st = 99;
    if (!h || quant_fill_random(t_gu, h, 2 * NE * mg / ti_g->block_bytes, &st) ||
        quant_fill_random(t_dn, h + 2 * NE * mg, NE * md / ti_d->block_bytes, &st))
        exit(2);
    CK(cudaMemcpy(pool, h, set, cudaMemcpyHostToDevice));
    free(h);
}

/* One decode token's routed experts: NE experts of (FE x E gate, up: t_gu) and (E x FE down: t_dn). */
static void moe_row(uint8_t *pool, const ops *o, uint32_t t_gu, uint32_t t_dn, double rate) {
    enum { TOPK = 8, E = 6144, FE = 2048 };
    uint64_t rg = 0, rd = 0;
    if (quant_row_bytes(t_gu, E, &rg) || quant_row_bytes(t_dn, FE, &rd)) exit(2);
    const uint64_t mg = rg * FE, md = rd * E;
    /* 64 experts where they fit the pool, else 32 (Q8_0): 8 rotating sets of 8 keep L2 cold */
    const int NE = 64 * (2 * mg + md) <= POOL_BYTES ? 64 : 32;
    const uint64_t set = (uint64_t)NE * (2 * mg + md);
    /* one pool copy: gate, up, down of all experts; experts differ per launch by rotating ids */
    uint64_t stride = 0;
    const quant_type_info *ti_g = quant_type_get(t_gu), *ti_d = quant_type_get(t_dn);
    fill_experts(pool, t_gu, t_dn, NE, mg, md);
    stride = set;
    const uint8_t *wg = pool, *wu = pool + NE * mg, *wd = pool + 2 * NE * mg;
    /* 8 rotating id sets of 8 distinct experts: 64 experts, every launch new weights */
    int32_t hid[8][TOPK];
    float hw[TOPK];
    for (int s = 0; s < 8; s++)
        for (int j = 0; j < TOPK; j++) hid[s][j] = (s * TOPK + j * 9) % NE;
    /* with 32 experts a set repeats every 4 launches: 4 x 8 distinct experts still exceed L2 */
    for (int j = 0; j < TOPK; j++) hw[j] = 0.125f;
    CK(cudaMemcpy(o->ids, hid, sizeof hid, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(o->wts, hw, sizeof hw, cudaMemcpyHostToDevice));
    const int64_t pw = cuk_moe_plan_words(1, TOPK);
    for (int s = 0; s < 8; s++) {
        const cuk_moe_plan_args pa = {o->ids + s * TOPK, o->wts, 1, TOPK, TOPK, TOPK, NE, o->plan + s * pw};
        GK(cuk_moe_plan(&pa, NULL, &err_));
    }
    double us[2][2];
    for (int v = 0; v < 2; v++)
        for (int part = 0; part < 2; part++) {
            for (int i = -3; i < iters; i++) {
                if (i == 0) CK(cudaEventRecord(ev_a, NULL));
                const int s = (i + 3) % 8;
                const int32_t *ids = o->ids + s * TOPK, *plan = o->plan + s * pw;
                if (v == 0 && part == 0) {
                    const cuk_moe_gate_up_args g = {t_gu, wg, wu, E, FE, NE, ids, TOPK, TOPK, o->x16, CUK_ACT_BF16,
                                                    32768, 1, o->y, FE, plan};
                    GK(cuk_moe_gate_up(&g, NULL, &err_));
                } else if (v == 0) {
                    const cuk_moe_down_args d = {t_dn, wd, FE, E, NE, ids, o->wts, TOPK, TOPK, TOPK, o->x16,
                                                 CUK_ACT_BF16, FE, 1, o->y, E, plan, o->part, E};
                    GK(cuk_moe_down(&d, NULL, &err_));
                } else if (part == 0) {
                    const cuk_moe_gate_up_q8_args g = {t_gu, wg, wu, E, FE, NE, ids, TOPK, TOPK,
                                                       {o->q, 32768, o->ds, 2048, 1}, 1, o->y, FE, plan};
                    GK(cuk_moe_gate_up_q8(&g, NULL, &err_));
                } else {
                    const cuk_moe_down_q8_args d = {t_dn, wd, FE, E, NE, ids, o->wts, TOPK, TOPK, TOPK,
                                                    {o->q, 2048, o->ds, 128, 1}, 1, o->y, E, plan, o->part, E, NULL, 0};
                    GK(cuk_moe_down_q8(&d, NULL, &err_));
                }
            }
            CK(cudaEventRecord(ev_b, NULL));
            CK(cudaEventSynchronize(ev_b));
            us[v][part] = elapsed_ms() * 1e3 / iters;
        }
    const double bg = (double)TOPK * 2 * mg, bd = (double)TOPK * md;
    printf("| experts gate+up %s (8 of %d) | %.1f MB | %.2f (%.3f) | %.2f (%.3f) |\n", ti_g->name, NE, bg / 1e6, us[0][0],
           bg / (us[0][0] * 1e-6) / rate, us[1][0], bg / (us[1][0] * 1e-6) / rate);
    printf("| experts down %s (8 of %d, + slot sum) | %.1f MB | %.2f (%.3f) | %.2f (%.3f) |\n", ti_d->name, NE, bd / 1e6,
           us[0][1], bd / (us[0][1] * 1e-6) / rate, us[1][1], bd / (us[1][1] * 1e-6) / rate);
    (void)stride;
}

#define MOE_BATCH_HEAD                                                                                         \
    "| routed experts, batched step | tokens | experts touched | MB | dp4a us (ratio) | q8t L1 form us (ratio) | q8t us (ratio) |\n" \
    "| --- | --- | --- | --- | --- | --- | --- |\n"

/* A batched decode step's routed experts: n_tok tokens, each routed to 8 of 64 experts (a fixed
 * pseudo-random draw per token, 4 rotating draws), gate+up (t_gu) and down (t_dn, + slot sum)
 * by the dp4a kernels (cuk_moe_*_q8) and the tensor-core ones (the L1 form, cuk_moe_*_q8t_l1, and
 * cuk_moe_*_q8t: each CTA's x staged in shared memory where it fits). MB: the weights of the
 * experts the draw touches (each read once at best). */
static void moe_batch_row(uint8_t *pool, const ops *o, uint32_t t_gu, uint32_t t_dn, int n_tok, double rate) {
    enum { TOPK = 8, E = 6144, FE = 2048, NE = 64, SETS = 4 };
    uint64_t rg = 0, rd = 0;
    if (quant_row_bytes(t_gu, E, &rg) || quant_row_bytes(t_dn, FE, &rd)) exit(2);
    const uint64_t mg = rg * FE, md = rd * E;
    if (n_tok > 32) exit(2);
    const quant_type_info *ti_g = quant_type_get(t_gu), *ti_d = quant_type_get(t_dn);
    fill_experts(pool, t_gu, t_dn, NE, mg, md);
    const uint8_t *wg = pool, *wu = pool + NE * mg, *wd = pool + 2 * NE * mg;
    static int32_t hid[SETS][32 * TOPK];
    static float hw[32 * TOPK];
    double touched = 0;
    uint64_t r = 12345;
    for (int s = 0; s < SETS; s++) {
        int used[NE] = {0};
        for (int t = 0; t < n_tok; t++)
            for (int j = 0; j < TOPK; j++) {
                int e;
                for (;;) { /* distinct experts within a token */
                    r = r * 6364136223846793005ull + 1442695040888963407ull;
                    e = (int)((r >> 33) % NE);
                    int dup = 0;
                    for (int i = 0; i < j; i++) dup |= hid[s][t * TOPK + i] == e;
                    if (!dup) break;
                }
                hid[s][t * TOPK + j] = e;
                used[e] = 1;
            }
        for (int e = 0; e < NE; e++) touched += used[e];
    }
    touched /= SETS;
    for (int i = 0; i < 32 * TOPK; i++) hw[i] = 0.125f;
    int32_t *ids = NULL, *plan = NULL;
    const int64_t pw = cuk_moe_plan_words(n_tok, TOPK);
    CK(cudaMalloc((void **)&ids, sizeof hid));
    CK(cudaMalloc((void **)&plan, (size_t)(SETS * pw) * 4));
    CK(cudaMemcpy(ids, hid, sizeof hid, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(o->wts, hw, sizeof hw, cudaMemcpyHostToDevice));
    for (int s = 0; s < SETS; s++) {
        const cuk_moe_plan_args pa = {ids + s * 32 * TOPK, o->wts, n_tok, TOPK, TOPK, TOPK, NE, plan + s * pw};
        GK(cuk_moe_plan(&pa, NULL, &err_));
    }
    double us[3][2];
    for (int v = 0; v < 3; v++)
        for (int part = 0; part < 2; part++) {
            for (int i = -3; i < iters; i++) {
                if (i == 0) CK(cudaEventRecord(ev_a, NULL));
                const int s = (i + 3) % SETS;
                const int32_t *id = ids + s * 32 * TOPK, *pl = plan + s * pw;
                if (part == 0) {
                    const cuk_moe_gate_up_q8_args g = {t_gu, wg, wu, E, FE, NE, id, TOPK, TOPK,
                                                       {o->q, 32768, o->ds, 2048, 1}, n_tok, o->y, FE, pl};
                    GK(v == 2 ? cuk_moe_gate_up_q8t(&g, NULL, &err_) : v ? cuk_moe_gate_up_q8t_l1(&g, NULL, &err_) : cuk_moe_gate_up_q8(&g, NULL, &err_));
                } else {
                    const cuk_moe_down_q8_args d = {t_dn, wd, FE, E, NE, id, o->wts, TOPK, TOPK, TOPK,
                                                    {o->q, 2048, o->ds, 128, 1}, n_tok, o->y, E, pl, o->part, E, NULL, 0};
                    GK(v == 2 ? cuk_moe_down_q8t(&d, NULL, &err_) : v ? cuk_moe_down_q8t_l1(&d, NULL, &err_) : cuk_moe_down_q8(&d, NULL, &err_));
                }
            }
            CK(cudaEventRecord(ev_b, NULL));
            CK(cudaEventSynchronize(ev_b));
            us[v][part] = elapsed_ms() * 1e3 / iters;
        }
    const double bg = touched * 2 * mg, bd = touched * md;
    printf("| gate+up %s | %d | %.1f | %.1f | %.2f (%.3f) | %.2f (%.3f) | %.2f (%.3f) |\n", ti_g->name, n_tok, touched,
           bg / 1e6, us[0][0], bg / (us[0][0] * 1e-6) / rate, us[1][0], bg / (us[1][0] * 1e-6) / rate, us[2][0],
           bg / (us[2][0] * 1e-6) / rate);
    printf("| down %s (+ slot sum) | %d | %.1f | %.1f | %.2f (%.3f) | %.2f (%.3f) | %.2f (%.3f) |\n", ti_d->name, n_tok,
           touched, bd / 1e6, us[0][1], bd / (us[0][1] * 1e-6) / rate, us[1][1], bd / (us[1][1] * 1e-6) / rate, us[2][1],
           bd / (us[2][1] * 1e-6) / rate);
    fflush(stdout);
    CK(cudaFree(ids));
    CK(cudaFree(plan));
}

int main(int argc, char **argv) {
    if (argc > 1) iters = atoi(argv[1]);
    /* one shape alone (for ncu: its launches are the only GEMV ones after the copy) */
    const int one = argc == 6;
    const int ot = one ? quant_type_from_name(argv[2]) : 0;
    const long long om = one ? atoll(argv[3]) : 0, ok = one ? atoll(argv[4]) : 0;
    const int on = one ? atoi(argv[5]) : 0;
    /* one batched MoE step alone (for ncu): bench_q8 ITERS moe N_TOK */
    const int moe1 = argc == 4 && !strcmp(argv[2], "moe"), mn = moe1 ? atoi(argv[3]) : 0;
    if (moe1 && (mn < 1 || mn > 32)) {
        fprintf(stderr, "usage: bench_q8 ITERS moe N_TOK (N_TOK 1..32)\n");
        return 2;
    }
    if (iters < 1 || (argc != 2 && argc != 1 && !one && !moe1) ||
        (one && (ot < 0 || om < 1 || om > 160000 || ok < 256 || ok > 16384 || ok % 256 || on < 1 || on > 32))) {
        fprintf(stderr, "usage: bench_q8 [iters >= 1 [TYPE M K N | moe N_TOK]] (K a multiple of 256 up to 16384, "
                        "N 1..32)\n");
        return 2;
    }
    CK(cudaEventCreate(&ev_a));
    CK(cudaEventCreate(&ev_b));
    uint8_t *pool;
    ops o;
    CK(cudaMalloc((void **)&pool, POOL_BYTES));
    CK(cudaMalloc(&o.x16, 32 * 32768 * 2));
    CK(cudaMalloc((void **)&o.xf, 32 * 32768 * 4));
    CK(cudaMalloc((void **)&o.q, 32 * 32768));
    CK(cudaMalloc((void **)&o.ds, 32 * 2048 * 4));
    CK(cudaMalloc((void **)&o.q2, 32 * 32768));
    CK(cudaMalloc((void **)&o.ds2, 32 * 2048 * 4));
    CK(cudaMalloc((void **)&o.y, (size_t)64 * 160000 * 4));
    CK(cudaMalloc((void **)&o.part, (size_t)64 * 160000 * 4));
    CK(cudaMalloc((void **)&o.ids, 64 * 4));
    CK(cudaMalloc((void **)&o.wts, 256 * 4));
    CK(cudaMalloc(&o.fx, (size_t)16384 * CUK_Q8T_SCRATCH_PER_K));
    CK(cudaMalloc((void **)&o.plan, 8 * (size_t)cuk_moe_plan_words(1, 8) * 4));
    float *hx = malloc(32 * 32768 * 4);
    if (!hx) return 2;
    for (int i = 0; i < 32 * 32768; i++) hx[i] = (float)((i * 37 % 101) - 50) / 50.0f;
    CK(cudaMemcpy(o.xf, hx, 32 * 32768 * 4, cudaMemcpyHostToDevice));
    free(hx);
    GK(cuk_convert(o.xf, 32768, o.x16, CUK_BF16, 32768, 32, 32768, NULL, &err_));
    const cuk_q8_quantize_args qa = {o.xf, 32768, 32768, 32, o.q, 32768, o.ds, 2048, 1};
    GK(cuk_q8_quantize(&qa, NULL, &err_));
    const double rate = copy_rate(pool);
    /* the quantizer alone: one 6144 row, as before each decode product */
    const cuk_q8_quantize_args q1 = {o.xf, 32768, 6144, 1, o.q2, 32768, o.ds2, 2048, 1};
    CK(cudaEventRecord(ev_a, NULL));
    for (int i = 0; i < iters; i++) GK(cuk_q8_quantize(&q1, NULL, &err_));
    CK(cudaEventRecord(ev_b, NULL));
    CK(cudaEventSynchronize(ev_b));
    printf("bench_q8: D2D copy %.0f GB/s (read + written); quantize 1 x 6144: %.2f us per launch\n", rate / 1e9,
           elapsed_ms() * 1e3 / iters);
    GK(cuk_q8_quantize(&qa, NULL, &err_));
    printf("| type | shape | n | MB | cuk_gemv bf16 us (ratio) | cuk_gemv_q8 us (ratio) | two planes | cuk_gemv_q8t "
           "(ratio) | q8t two planes | cuk_gemv_q8t_sx (ratio) | sx two planes | q8t no scratch (ratio) | two planes | "
           "cuk_gemv_q8_xs (ratio) | xs two planes |\n"
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    if (one) {
        gemv_row(pool, &o, (uint32_t)ot, om, ok, on, rate);
        return 0;
    }
    if (moe1) {
        fputs(MOE_BATCH_HEAD, stdout);
        moe_batch_row(pool, &o, QT_Q4_K, QT_Q5_K, mn, rate);
        return 0;
    }
    const uint32_t types[] = {QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_Q8_0};
    static const int NS[] = {1, 2, 4, 8, 32}, NA[] = {1, 2, 4, 32}; /* where q8t starts to win */
    for (int ti = 0; ti < 4; ti++)
        for (int i = 0; i < 5; i++) gemv_row(pool, &o, types[ti], 19360, 6144, NS[i], rate);
    gemv_row(pool, &o, QT_Q6_K, 154880, 6144, 1, rate);
    gemv_row(pool, &o, QT_Q6_K, 154880, 6144, 32, rate);
    /* the peer model's products (synth --preset glm5: convert/synth.c's types and dims): q_a, kv_a,
     * q_b (64 heads x 256), the indexer's q_b (32 x 128), attn_output (64 heads x v 256); dense FFN
     * gate (and up), down; the shared expert's gate (and up), down */
    for (int i = 0; i < 4; i++) {
        const int n = NA[i];
        gemv_row(pool, &o, QT_Q6_K, 2048, 6144, n, rate);
        gemv_row(pool, &o, QT_Q8_0, 576, 6144, n, rate);
        gemv_row(pool, &o, QT_Q5_K, 16384, 2048, n, rate);
        gemv_row(pool, &o, QT_Q5_K, 4096, 2048, n, rate);
        gemv_row(pool, &o, QT_Q5_K, 6144, 16384, n, rate);
        gemv_row(pool, &o, QT_Q4_K, 12288, 6144, n, rate);
        gemv_row(pool, &o, QT_Q4_K, 6144, 12288, n, rate);
        gemv_row(pool, &o, QT_Q8_0, 2048, 6144, n, rate);
        gemv_row(pool, &o, QT_Q8_0, 6144, 2048, n, rate);
    }
    printf("| routed experts, one token | MB | cuk_moe_* bf16 us (ratio) | _q8 us (ratio) |\n| --- | --- | --- | --- |\n");
    moe_row(pool, &o, QT_Q4_K, QT_Q5_K, rate);
    moe_row(pool, &o, QT_Q5_K, QT_Q6_K, rate);
    moe_row(pool, &o, QT_Q8_0, QT_Q8_0, rate);
    fputs(MOE_BATCH_HEAD, stdout);
    static const int NB[] = {1, 2, 4, 8, 16, 32};
    for (int i = 0; i < 6; i++) moe_batch_row(pool, &o, QT_Q4_K, QT_Q5_K, NB[i], rate);
    return 0;
}
