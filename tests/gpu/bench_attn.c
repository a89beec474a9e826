/* The attention stage's own kernels at GLM-5 TP8 shapes (8 local heads, kv_lora 512, rope 64,
 * nope 192, v_head 256; indexer 32 heads x 128, top-k 2048): cuk_mla_absorb, cuk_idx_scores,
 * cuk_idx_topk, cuk_mla_attend_fresh, as the launchers pick their kernels by shape. Decode
 * (n_tok 1) at contexts 1k / 8k / 32k with an f32 and a bf16 latent cache (bf16: the step's own
 * row from float32, as runtime/gpu/gpu_model.c does), and prefill (n_tok 512 at positions
 * 3584..4095). The per-layer inputs that decode reads from DRAM (W_UK, the indexer keys, the
 * latent cache) rotate over copies filling >= 256 MB, so that L2 does not hold them between
 * calls; the small per-step buffers stay. Per launcher: us per call, MB read (logical: W_UK,
 * keys + scores, scores, selected latent rows per token), GB/s, against a D2D copy rate measured
 * in the same run (the ceiling). Sanity checks (tests/gpu/test_kernels has the CPU references):
 * absorb and attention outputs finite and not all zero, every top-k count min(position + 1,
 * 2048) with distinct in-range positions. (The old-vs-split and lane-vs-thread-per-key
 * comparisons of the kernel choices: bench/NOTES.md, bench/RESULTS.md.) First, W_UV
 * (bench_wuv): 8 per-head GEMVs against one cuk_head_gemv launch. Usage: bench_attn [only_decode] */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuk_head_gemv.h"
#include "cuda/cuk_model.h"
#include "format/quant.h"

#include "tests/gpu/bench_util.h"
#define E (&err_) /* the error struct GK declares */

enum { H = 8, NOPE = 192, R = 64, KL = 512, VH = 256, IH = 32, ID = 128, TOPK = 2048 };
enum { KVW = KL + R, QW = NOPE + R, HR = NOPE + VH };
#define ROT_BYTES (256ull << 20)

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float unif(float a, float b) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return a + (b - a) * (float)((rng >> 40) * (1.0 / 16777216.0));
}

static float *rand_h(size_t n, float a, float b) {
    float *h = malloc(n * 4);
    if (!h) exit(2);
    for (size_t i = 0; i < n; i++) h[i] = unif(a, b);
    return h;
}
static double copy_gbs; /* D2D copy, bytes read + written per second */

typedef struct cfg {
    const char *name;
    int n_tok;
    int64_t P;     /* positions attended by the last token (context incl. the step's tokens) */
    uint32_t lt;   /* latent cache type */
} cfg;

typedef struct bufs {
    int nc;                         /* rotation copies */
    float *q, *qlat, *iq, *iw, *sc, *out;
    float *kvb, *ik;                /* [nc] copies */
    uint8_t *lat;                   /* [nc] copies */
    float *fresh;                   /* the step's own rows in float32, or NULL */
    int32_t *sel, *ns;
    size_t kvb_b, ik_b, lat_b;
} bufs;

typedef enum { L_ABSORB, L_SCORES, L_TOPK, L_ATTEND, N_L } launcher;
static const char *const LNAME[N_L] = {"absorb", "idx_scores", "idx_topk", "attend"};

static void run_one(const cfg *c, const bufs *b, launcher l, int copy) {
    const int n = c->n_tok;
    const int64_t pos0 = c->P - n;
    const cuk_mla_dims d = {n, H, NOPE, R, KL};
    const cuk_mla_absorb_args ab = {.d = d, .q = b->q, .kvb = (const float *)((const uint8_t *)b->kvb + copy * b->kvb_b),
                                    .head_rows = HR, .qlat = b->qlat};
    const cuk_idx_scores_args sa = {.q = b->iq, .w = b->iw, .k = (const float *)((const uint8_t *)b->ik + copy * b->ik_b),
                                    .n_tok = n, .n_head = IH, .dim = ID, .pos0 = pos0, .sc = b->sc, .ld_sc = c->P};
    const cuk_idx_topk_args ta = {.sc = b->sc, .ld_sc = c->P, .n_tok = n, .pos0 = pos0, .k = TOPK, .sel = b->sel,
                                  .ld_sel = TOPK, .n_sel = b->ns};
    const cuk_mla_attend_args at = {.d = d, .q = b->q, .qlat = b->qlat, .lat = b->lat + copy * b->lat_b, .lat_type = c->lt,
                                    .fresh = b->fresh, .fresh0 = pos0, .n_pos = c->P, .sel = b->sel, .ld_sel = TOPK,
                                    .n_sel = b->ns, .max_sel = TOPK, .scale = (float)(1.0 / sqrt((double)QW)),
                                    .out = b->out};
    switch (l) {
    case L_ABSORB: GK(cuk_mla_absorb(&ab, NULL, E)); break;
    case L_SCORES: GK(cuk_idx_scores(&sa, NULL, E)); break;
    case L_TOPK: GK(cuk_idx_topk(&ta, NULL, E)); break;
    case L_ATTEND: GK(cuk_mla_attend_fresh(&at, NULL, E)); break;
    default: break;
    }
}

/* Logical bytes read per call. */
static double bytes_of(const cfg *c, launcher l) {
    const int n = c->n_tok;
    const int64_t pos0 = c->P - n;
    const size_t es = c->lt == CUK_F32 ? 4 : 2;
    double rows = 0;
    for (int t = 0; t < n; t++) rows += (double)(pos0 + t + 1 < TOPK ? pos0 + t + 1 : TOPK);
    switch (l) {
    case L_ABSORB: return (double)H * NOPE * KL * 4;
    case L_SCORES: return (double)c->P * ID * 4 + (double)n * c->P * 4; /* keys + scores written */
    case L_TOPK: return (double)n * c->P * 4;
    case L_ATTEND: return rows * KVW * es;
    default: return 0;
    }
}

static double time_us(const cfg *c, const bufs *b, launcher l) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    run_one(c, b, l, 0); /* warm-up (and the one-time opt-ins) */
    CK(cudaEventRecord(e0, NULL));
    run_one(c, b, l, 1 % b->nc);
    CK(cudaEventRecord(e1, NULL));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    int iters = ms > 0 ? (int)(30.0 / ms) : 50; /* about 30 ms of calls */
    if (iters < 3) iters = 3;
    if (iters > 200) iters = 200;
    CK(cudaEventRecord(e0, NULL));
    for (int i = 0; i < iters; i++) run_one(c, b, l, (i + 2) % b->nc);
    CK(cudaEventRecord(e1, NULL));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return ms * 1e3 / iters;
}

static double max_abs(const float *x, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fabs(x[i]) > m || x[i] != x[i] ? (x[i] != x[i] ? INFINITY : fabs(x[i])) : m;
    return m;
}

/* Top-k rows of n tokens ending at P keys: counts min(pos + 1, TOPK), distinct positions in
 * [0, pos]; returns the number of bad rows. */
static int topk_bad_rows(const int32_t *sel, const int32_t *ns, int n, int64_t P) {
    int bad_rows = 0;
    uint8_t *seen = calloc((size_t)P, 1);
    if (!seen) exit(2);
    for (int t = 0; t < n; t++) {
        const int64_t pos = P - n + t, want = pos + 1 < TOPK ? pos + 1 : TOPK;
        int bad = ns[t] != want;
        for (int i = 0; !bad && i < ns[t]; i++) {
            const int32_t s = sel[(int64_t)t * TOPK + i];
            bad = s < 0 || s > pos || seen[s];
            if (!bad) seen[s] = 1;
        }
        for (int i = 0; i < ns[t] && i < TOPK; i++) {
            const int32_t s = sel[(int64_t)t * TOPK + i];
            if (s >= 0 && s < P) seen[s] = 0;
        }
        bad_rows += bad;
    }
    free(seen);
    return bad_rows;
}

static double max_diff(const float *x, const float *y, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)x[i] - y[i]);
        if (d > m || d != d) m = d != d ? INFINITY : d;
    }
    return m;
}

static int fails;

static void bench_cfg(const cfg *c) {
    const int n = c->n_tok;
    const int64_t P = c->P, pos0 = P - n;
    const size_t es = c->lt == CUK_F32 ? 4 : 2;
    bufs b = {0};
    b.kvb_b = ((size_t)H * HR * KL * 4 + 255) & ~(size_t)255;
    b.ik_b = ((size_t)P * ID * 4 + 255) & ~(size_t)255;
    b.lat_b = ((size_t)P * KVW * es + 255) & ~(size_t)255;
    const size_t per = b.kvb_b + b.ik_b + b.lat_b;
    b.nc = (int)((ROT_BYTES + per - 1) / per);
    if (b.nc < 2) b.nc = 2;
    if (b.nc > 64) b.nc = 64;
    /* inputs: queries around the trained scale, latents normalized-ish */
    float *q = rand_h((size_t)n * H * QW, -1, 1), *kvb = rand_h((size_t)H * HR * KL, -0.1f, 0.1f);
    float *iq = rand_h((size_t)n * IH * ID, -1, 1), *iw = rand_h((size_t)n * IH, -0.2f, 0.2f);
    float *ik = rand_h((size_t)P * ID, -1, 1), *lat = rand_h((size_t)P * KVW, -1, 1);
    b.q = dup_d(q, (size_t)n * H * QW * 4);
    b.iq = dup_d(iq, (size_t)n * IH * ID * 4);
    b.iw = dup_d(iw, (size_t)n * IH * 4);
    { /* nc copies of each per-layer input */
        uint8_t *d = dalloc(b.kvb_b * b.nc);
        for (int i = 0; i < b.nc; i++) CK(cudaMemcpy(d + i * b.kvb_b, kvb, (size_t)H * HR * KL * 4, cudaMemcpyHostToDevice));
        b.kvb = (float *)d;
        d = dalloc(b.ik_b * b.nc);
        for (int i = 0; i < b.nc; i++) CK(cudaMemcpy(d + i * b.ik_b, ik, (size_t)P * ID * 4, cudaMemcpyHostToDevice));
        b.ik = (float *)d;
        void *lh = lat;
        uint16_t *raw = NULL;
        if (c->lt != CUK_F32) {
            raw = malloc((size_t)P * KVW * 2);
            if (!raw) exit(2);
            for (int64_t i = 0; i < P * KVW; i++) raw[i] = quant_f32_to_bf16(lat[i]);
            lh = raw;
        }
        b.lat = dalloc(b.lat_b * b.nc);
        for (int i = 0; i < b.nc; i++) CK(cudaMemcpy(b.lat + i * b.lat_b, lh, (size_t)P * KVW * es, cudaMemcpyHostToDevice));
        free(raw);
    }
    /* a 16-bit cache: the step's own rows come from float32 beside it */
    b.fresh = c->lt == CUK_F32 ? NULL : dup_d(lat + pos0 * KVW, (size_t)n * KVW * 4);
    b.qlat = dalloc((size_t)n * H * KL * 4);
    b.out = dalloc((size_t)n * H * KL * 4);
    b.sc = dalloc((size_t)n * P * 4);
    b.sel = dalloc((size_t)n * TOPK * 4);
    b.ns = dalloc((size_t)n * 4);

    printf("== %s: n_tok %d, positions %lld, %s cache, %d rotation copies\n", c->name, n, (long long)P,
           c->lt == CUK_F32 ? "f32" : "bf16", b.nc);
    /* the stage once on copy 0, in order, for the sanity checks; then each launcher timed */
    float *r_ql = malloc((size_t)n * H * KL * 4), *r_out = malloc((size_t)n * H * KL * 4);
    int32_t *r_sel = malloc((size_t)n * TOPK * 4), *r_ns = malloc((size_t)n * 4);
    if (!r_ql || !r_out || !r_sel || !r_ns) exit(2);
    for (int l = 0; l < N_L; l++) run_one(c, &b, (launcher)l, 0);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(r_ql, b.qlat, (size_t)n * H * KL * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(r_out, b.out, (size_t)n * H * KL * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(r_sel, b.sel, (size_t)n * TOPK * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(r_ns, b.ns, (size_t)n * 4, cudaMemcpyDeviceToHost));
    double us[N_L], tot = 0;
    for (int l = 0; l < N_L; l++) {
        us[l] = time_us(c, &b, (launcher)l);
        tot += us[l];
        const double by = bytes_of(c, (launcher)l);
        printf("  %-10s %8.2f MB %9.2f us %7.0f GB/s  (%.2f of copy)\n", LNAME[l], by / 1e6, us[l],
               by / (us[l] * 1e3), by / (us[l] * 1e3) / copy_gbs);
    }
    printf("  %-10s             %9.2f us\n", "sum", tot);
    const double ql_m = max_abs(r_ql, (size_t)n * H * KL), o_m = max_abs(r_out, (size_t)n * H * KL);
    const int sel_bad = topk_bad_rows(r_sel, r_ns, n, P);
    const int ok = isfinite(ql_m) && ql_m > 0 && isfinite(o_m) && o_m > 0 && sel_bad == 0;
    printf("  sanity: absorb max |q_lat| %.2e, attend max |out| %.2e, top-k %d/%d rows bad: %s\n", ql_m, o_m,
           sel_bad, n, ok ? "ok" : "MISMATCH");
    fails += !ok;
    fflush(stdout);
    free(r_ql);
    free(r_out);
    free(r_sel);
    free(r_ns);
    free(q);
    free(kvb);
    free(iq);
    free(iw);
    free(ik);
    free(lat);
    cudaFree(b.q);
    cudaFree(b.iq);
    cudaFree(b.iw);
    cudaFree(b.kvb);
    cudaFree(b.ik);
    cudaFree(b.lat);
    cudaFree(b.fresh);
    cudaFree(b.qlat);
    cudaFree(b.out);
    cudaFree(b.sc);
    cudaFree(b.sel);
    cudaFree(b.ns);
}

/* W_UV at decode: y[t][h][0..VH) = W_UV[h] o_lat[t][h] for the 8 heads, as 8 cuk_gemv launches
 * (one per head, the former path) and as one cuk_head_gemv launch, for n = 1, 4, 16 rows, f32
 * and bf16 inputs. Checks: head_gemv against a double CPU product (max |diff| / max |ref|), each
 * row of a batched call bitwise equal to a one-row call of that row (the server's batched decode
 * needs it), and the agreement with the per-head GEMVs. Weights rotate over >= 256 MB. */
static void bench_wuv(void) {
    const size_t wb = ((size_t)H * HR * KL * 4 + 255) & ~(size_t)255;
    const int nc = (int)((ROT_BYTES + wb - 1) / wb);
    float *kvb = rand_h((size_t)H * HR * KL, -0.1f, 0.1f);
    uint8_t *dw = dalloc(wb * nc);
    for (int i = 0; i < nc; i++) CK(cudaMemcpy(dw + i * wb, kvb, (size_t)H * HR * KL * 4, cudaMemcpyHostToDevice));
    enum { NMAX = 16 };
    float *x = rand_h((size_t)NMAX * H * KL, -1, 1);
    uint16_t *xb = malloc((size_t)NMAX * H * KL * 2);
    float *xbf = malloc((size_t)NMAX * H * KL * 4); /* the bf16 inputs as float32 */
    float *y = malloc((size_t)NMAX * H * VH * 4), *y1 = malloc((size_t)NMAX * H * VH * 4);
    float *yg = malloc((size_t)NMAX * H * VH * 4);
    if (!xb || !xbf || !y || !y1 || !yg) exit(2);
    for (size_t i = 0; i < (size_t)NMAX * H * KL; i++) {
        xb[i] = quant_f32_to_bf16(x[i]);
        xbf[i] = quant_bf16_to_f32(xb[i]);
    }
    void *dx = dup_d(x, (size_t)NMAX * H * KL * 4), *dxb = dup_d(xb, (size_t)NMAX * H * KL * 2);
    float *dy = dalloc((size_t)NMAX * H * VH * 4);
    printf("== W_UV (%d heads x %d x %d float32, %.1f MB, %d rotation copies)\n", H, VH, KL, (double)H * VH * KL * 4 / 1e6,
           nc);
    static const int ns[] = {1, 4, 16};
    for (int xt = 0; xt < 2; xt++)
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
            const int n = ns[ni];
            const void *xin = xt ? dxb : dx;
            const size_t es = xt ? 2 : 4;
            double us[2];
            for (int v = 0; v < 2; v++) { /* 0: per-head cuk_gemv, 1: cuk_head_gemv */
                cudaEvent_t e0, e1;
                CK(cudaEventCreate(&e0));
                CK(cudaEventCreate(&e1));
                const int iters = 200;
                for (int it = -1; it < iters; it++) {
                    if (it == 0) CK(cudaEventRecord(e0, NULL));
                    const float *w = (const float *)(dw + (size_t)((it + 1) % nc) * wb);
                    if (v == 0) {
                        for (int h = 0; h < H; h++) {
                            const cuk_gemv_args a = {QT_F32, w + ((size_t)h * HR + NOPE) * KL, KL, VH,
                                                     (const uint8_t *)xin + (size_t)h * KL * es, (uint32_t)xt, H * KL, n,
                                                     dy + h * VH, H * VH};
                            GK(cuk_gemv(&a, NULL, E));
                        }
                    } else {
                        const cuk_head_gemv_args a = {w + NOPE * KL, HR * KL, KL, H, VH, KL, xin, (uint32_t)xt, H * KL,
                                                      KL, n, dy, H * VH, VH, NULL, NULL, 0, 0};
                        GK(cuk_head_gemv(&a, NULL, E));
                    }
                }
                CK(cudaEventRecord(e1, NULL));
                CK(cudaEventSynchronize(e1));
                float ms = 0;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                us[v] = ms * 1e3 / iters;
                CK(cudaEventDestroy(e0));
                CK(cudaEventDestroy(e1));
                CK(cudaMemcpy(v ? y : yg, dy, (size_t)n * H * VH * 4, cudaMemcpyDeviceToHost));
            }
            /* the last iteration used copy iters % nc: every copy holds the same weights */
            int rows_bad = 0;
            for (int t = 0; t < n; t++) { /* row t alone */
                const cuk_head_gemv_args a = {(const float *)dw + NOPE * KL, HR * KL, KL, H, VH, KL,
                                              (const uint8_t *)xin + (size_t)t * H * KL * es, (uint32_t)xt, H * KL, KL, 1,
                                              dy + (size_t)t * H * VH, H * VH, VH, NULL, NULL, 0, 0};
                GK(cuk_head_gemv(&a, NULL, E));
            }
            CK(cudaMemcpy(y1, dy, (size_t)n * H * VH * 4, cudaMemcpyDeviceToHost));
            for (int t = 0; t < n; t++) rows_bad += memcmp(y1 + (size_t)t * H * VH, y + (size_t)t * H * VH, H * VH * 4) != 0;
            double dmax = 0, rmax = 0;
            const float *xr = xt ? xbf : x;
            for (int t = 0; t < n; t++)
                for (int h = 0; h < H; h++)
                    for (int r = 0; r < VH; r++) {
                        double acc = 0;
                        const float *wr = kvb + ((size_t)h * HR + NOPE + r) * KL, *xv = xr + ((size_t)t * H + h) * KL;
                        for (int c = 0; c < KL; c++) acc += (double)wr[c] * xv[c];
                        const double got = y[((size_t)t * H + h) * VH + r];
                        if (fabs(got - acc) > dmax || got != got) dmax = got != got ? INFINITY : fabs(got - acc);
                        if (fabs(acc) > rmax) rmax = fabs(acc);
                    }
            const double gd = max_diff(y, yg, (size_t)n * H * VH);
            const int ok = rows_bad == 0 && dmax <= 1e-5 * rmax && rmax > 0;
            const double mb = (double)H * VH * KL * 4 / 1e6;
            printf("  %s n %2d: per-head gemv %7.2f us (%5.0f GB/s)  head_gemv %7.2f us (%5.0f GB/s, %.2f of copy)  "
                   "err vs double %.1e of %.1e, vs gemv %.1e, batched rows != single: %d: %s\n",
                   xt ? "bf16" : "f32 ", n, us[0], mb * 1e3 / us[0], us[1], mb * 1e3 / us[1],
                   mb * 1e3 / us[1] / copy_gbs, dmax, rmax, gd, rows_bad, ok ? "ok" : "MISMATCH");
            fails += !ok;
        }
    fflush(stdout);
    cudaFree(dw);
    cudaFree(dx);
    cudaFree(dxb);
    cudaFree(dy);
    free(kvb);
    free(x);
    free(xb);
    free(xbf);
    free(y);
    free(y1);
    free(yg);
}

int main(int argc, char **argv) {
    const int only_decode = argc > 1 && atoi(argv[1]) != 0;
    copy_gbs = bench_copy_gbs();
    static const cfg cfgs[] = {
        {"decode 1k", 1, 1024, CUK_F32},  {"decode 8k", 1, 8192, CUK_F32},  {"decode 32k", 1, 32768, CUK_F32},
        {"decode 1k", 1, 1024, CUK_BF16}, {"decode 8k", 1, 8192, CUK_BF16}, {"decode 32k", 1, 32768, CUK_BF16},
        {"decode 4 tok 8k", 4, 8192, CUK_BF16},
        {"prefill 512 @4k", 512, 4096, CUK_F32}, {"prefill 512 @4k", 512, 4096, CUK_BF16},
    };
    bench_wuv();
    const size_t nc = sizeof cfgs / sizeof cfgs[0];
    for (size_t i = 0; i < nc; i++) {
        if (only_decode && cfgs[i].n_tok > 8) continue;
        bench_cfg(&cfgs[i]);
    }
    printf("bench_attn: %d mismatching configs\n", fails);
    return fails ? 1 : 0;
}
