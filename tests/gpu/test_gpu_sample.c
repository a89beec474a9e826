/* cuk_sample (cuda/sample.cu) against the host sampler (runtime/text/sample.c): each row has two
 * samplers with the same parameters and seed; one gives its samp_device_row (and so its random
 * number) to the device, the other runs samp_sample on the same logits. The tokens must be equal,
 * draw after draw (so the random streams stay together), for greedy and sampled rows, with and
 * without top-k, top-p, min-p and penalties (the window's logits penalized in place first), at
 * GLM-5's vocabulary and small ones, with NaN, infinities, ties and rows that
 * hold no logit > -inf (-1 on the device, refused on the host). */
#define G5_TEST_NAME "test_gpu_sample"
#define G5_TEST_SEED 0x5a3e1eull

#include <math.h>

#include "tests/test_util.h"

#include "tests/gpu/gpu_test_util.h"

#include "cuda/cuk_sample.h"
#include "runtime/text/sample.h"

/* Row r's logits: a spread of about 3 around 0 with a few tokens far above (trained logits' shape),
 * or coarse values (ties), with NaN, -inf and now and then +inf; every 11th row all -inf. */
static void fill_row(float *l, int32_t V, int r, int round) {
    const int coarse = (r + round) % 4 == 1;
    for (int32_t i = 0; i < V; i++) {
        const float u = unif(0, 1);
        float v = coarse ? (float)(int)unif(0, 6) : unif(-3, 3) + unif(-3, 3);
        if (u < 0.002f) v += 14;
        if (u > 0.99f) v = NAN;
        else if (u > 0.97f) v = -INFINITY;
        l[i] = v;
    }
    if (r % 13 == 5 && round == 1) l[V / 2] = INFINITY;
    if (r % 11 == 3 && round == 2)
        for (int32_t i = 0; i < V; i++) l[i] = i % 3 ? -INFINITY : NAN;
}

static void one_case(int32_t V, int32_t R) {
    const int64_t ldx = V + 3;
    samp_ctx **a = xmalloc((size_t)R * sizeof *a), **b = xmalloc((size_t)R * sizeof *b);
    for (int32_t r = 0; r < R; r++) {
        samp_params p;
        samp_params_default(&p);
        p.temperature = r % 5 == 4 ? 0.0f : unif(0.3f, 1.5f); /* row 0 samples (the one-row cases) */
        p.top_k = r % 3 == 0 ? V : r % 3 == 1 && V > 40 ? 1 + (int32_t)(rnd() % 40) : 0; /* off, or a cut */
        p.min_p = r % 2 ? unif(0.001f, 0.3f) : 0.0f;
        p.top_p = r % 7 >= 3 ? unif(0.3f, 0.99f) : 1.0f; /* top-p rows beside rows without */
        if (r % 4 == 2) { /* penalties over the window (64 tokens: the draws so far) */
            p.repeat_penalty = 1.3f;
            p.frequency_penalty = r % 3 ? 0.4f : 0.0f;
            p.presence_penalty = 0.6f;
        }
        p.seed = rnd();
        a[r] = b[r] = NULL;
        T_CHECK(samp_create(&p, (uint32_t)V, &a[r], NULL) == G5_OK && samp_create(&p, (uint32_t)V, &b[r], NULL) == G5_OK,
                "samplers");
        for (int j = 0; j < 40 && a[r] && b[r]; j++) { /* a window of repeats: counts up to 14 */
            const int32_t t = (int32_t)((r * 7 + j % 3 + (j % 5 == 0 ? j : 0)) % V);
            samp_accept(a[r], t), samp_accept(b[r], t);
        }
    }
    float *hl = xmalloc((size_t)R * ldx * sizeof *hl), *dl = NULL;
    cuk_sample_row *hr = xmalloc((size_t)R * sizeof *hr), *dr = NULL;
    int32_t *hout = xmalloc((size_t)R * sizeof *hout), *dout = NULL;
    void *scratch = NULL;
    int32_t *hpi = xmalloc((size_t)R * 64 * sizeof *hpi), *dpi = NULL; /* the rows' penalized ids, counts */
    uint32_t *hpc = xmalloc((size_t)R * 64 * sizeof *hpc), *dpc = NULL;
    CK(cudaMalloc((void **)&dpi, (size_t)R * 64 * sizeof *dpi));
    CK(cudaMalloc((void **)&dpc, (size_t)R * 64 * sizeof *dpc));
    CK(cudaMalloc((void **)&dl, (size_t)R * ldx * sizeof *dl));
    CK(cudaMalloc((void **)&dr, (size_t)R * sizeof *dr));
    CK(cudaMalloc((void **)&dout, (size_t)R * sizeof *dout));
    CK(cudaMalloc(&scratch, cuk_sample_scratch_bytes(R)));
    int same = 0, refused = 0, sampled = 0, bad = 0, penalized = 0;
    for (int round = 0; round < 3; round++) {
        int32_t any_tp = 0, any_tk = 0, any_pen = 0;
        uint32_t np = 0;
        for (int32_t r = 0; r < R; r++) {
            fill_row(hl + (size_t)r * ldx, V, r, round);
            samp_dev_row d;
            if (!a[r] || !samp_device_row(a[r], &d)) {
                bad++;
                memset(&d, 0, sizeof d);
            }
            if (d.n_pen > 64) { /* the window is 64 tokens */
                bad++;
                d.n_pen = 0;
            }
            hr[r] = (cuk_sample_row){.temperature = d.temperature, .min_p = d.min_p, .top_p = d.top_p, .top_k = d.top_k,
                                     .lmin = d.lmin, .k = d.k, .repeat_penalty = d.repeat_penalty,
                                     .frequency_penalty = d.frequency_penalty, .presence_penalty = d.presence_penalty,
                                     .pen_off = np, .n_pen = d.n_pen};
            if (d.n_pen) memcpy(hpi + np, d.pen_ids, d.n_pen * sizeof *hpi), memcpy(hpc + np, d.pen_counts, d.n_pen * sizeof *hpc);
            np += d.n_pen;
            any_pen |= d.n_pen > 0;
            any_tp |= d.temperature > 0 && d.top_p < 1.0f;
            any_tk |= d.temperature > 0 && d.top_k > 0;
            sampled += d.temperature > 0;
        }
        CK(cudaMemcpy(dl, hl, (size_t)R * ldx * sizeof *dl, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dr, hr, (size_t)R * sizeof *dr, cudaMemcpyHostToDevice));
        if (np) CK(cudaMemcpy(dpi, hpi, np * sizeof *hpi, cudaMemcpyHostToDevice));
        if (np) CK(cudaMemcpy(dpc, hpc, np * sizeof *hpc, cudaMemcpyHostToDevice));
        penalized += np > 0;
        g5_error e = {0};
        const cuk_sample_args sa = {dl, ldx, V, R, dr, scratch, dout, any_tp, any_tk, dpi, dpc, any_pen};
        T_CHECK(cuk_sample(&sa, NULL, &e) == G5_OK, "cuk_sample V=%d R=%d: %s", (int)V, (int)R, e.msg);
        CK(cudaMemcpy(hout, dout, (size_t)R * sizeof *hout, cudaMemcpyDeviceToHost));
        for (int32_t r = 0; r < R; r++) {
            int32_t want = -1;
            const g5_status st = b[r] ? samp_sample(b[r], hl + (size_t)r * ldx, &want, NULL) : G5_ERR_INVALID_ARG;
            if (st != G5_OK) {
                refused += hout[r] == -1 && st == G5_ERR_INVALID_ARG;
                bad += hout[r] != -1;
                continue;
            }
            if (hout[r] == want) same++;
            else if (bad++ < 5)
                printf("  V=%d row %d round %d (temp %g, min_p %g): device %d, host %d\n", (int)V, (int)r, round,
                       (double)hr[r].temperature, (double)hr[r].min_p, (int)hout[r], (int)want);
            samp_accept(a[r], want), samp_accept(b[r], want);
        }
    }
    T_CHECK(bad == 0 && same > 0 && sampled > 0 && (R < 5 || (sampled < 3 * R && penalized > 0)),
            "V=%d, %d rows x 3 draws: %d tokens equal to the host's (%d sampled rows, %d calls with penalties), %d refused "
            "alike, %d differ", (int)V, (int)R, same, sampled, penalized, refused, bad);
    for (int32_t r = 0; r < R; r++) samp_free(a[r]), samp_free(b[r]);
    free(a), free(b), free(hl), free(hr), free(hout), free(hpi), free(hpc);
    cudaFree(dl), cudaFree(dr), cudaFree(dout), cudaFree(scratch), cudaFree(dpi), cudaFree(dpc);
}

static void test_refusals(void) {
    g5_error e = {0};
    float *x = NULL;
    void *s = NULL;
    int32_t *o = NULL;
    cuk_sample_row *rw = NULL;
    CK(cudaMalloc((void **)&x, 4096));
    CK(cudaMalloc(&s, 4096));
    CK(cudaMalloc((void **)&o, 64));
    CK(cudaMalloc((void **)&rw, 256));
    cuk_sample_args a = {x, 64, 64, 2, rw, s, o, 0, 0, NULL, NULL, 0};
    a.n_rows = 0;
    T_CHECK(cuk_sample(&a, NULL, &e) == G5_ERR_INVALID_ARG && strstr(e.msg, "n_rows"), "refused: n_rows 0 (%s)", e.msg);
    a.n_rows = 2;
    a.ldx = 63;
    T_CHECK(cuk_sample(&a, NULL, &e) == G5_ERR_INVALID_ARG && strstr(e.msg, "ldx"), "refused: ldx < n (%s)", e.msg);
    a.ldx = 64;
    a.rows = NULL;
    T_CHECK(cuk_sample(&a, NULL, &e) == G5_ERR_INVALID_ARG && strstr(e.msg, "NULL"), "refused: no rows (%s)", e.msg);
    T_CHECK(cuk_sample_scratch_bytes(3) >= 3 * 16 * 16 && cuk_sample_scratch_bytes(0) == 0, "scratch sizes");
    cudaFree(x), cudaFree(s), cudaFree(o), cudaFree(rw);
}

int main(void) {
    if (!t_need_device()) return t_report(G5_TEST_NAME);
    test_refusals();
    one_case(154880, 33);
    one_case(154880, 1);
    one_case(1000, 7);
    one_case(65, 12);
    one_case(5, 3);
    return t_report(G5_TEST_NAME);
}
