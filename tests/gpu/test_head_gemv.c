/* cuk_head_gemv_q (cuda/head_gemv.cu: one GEMV per head over weights in their compact stored
 * type, the MLA decode path's W_UK^T from attn_k_b and W_UV from attn_v_b) against a host
 * emulation of its summation order (cuda/cuk_head_gemv.h: per 32-element piece an fmaf chain
 * from 0, the pieces added from 0 in order), over the host decoder the kernel itself uses
 * (cuda/deq_sub.h deq_row32, which tests/test_deq_sub.c holds bit-identical to quant_dequantize):
 * every output must match bit for bit, and lie within 1e-5 of a float64 product (relative to
 * the sum of |w x| of its row). Every weight type the converter carries whose blocks hold a
 * multiple of 32 elements, and F32/F16/BF16; shapes of the absorption (k = 192) and of W_UV
 * (k = 512) at GLM-5's widths, rows of several heads in one block (m = 37), the largest k; float32
 * and bf16 inputs; n = 1, 3, 9 and 17 input rows (rounds of 8). Outputs are poisoned first and
 * the padding between heads and rows must stay untouched. Runs on the device only. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuk.h"
#include "cuda/cuk_head_gemv.h"
#include "cuda/deq_sub.h"
#include "format/quant.h"
#include "tests/test_util.h"

#define G5_TEST_NAME "test_head_gemv"
#define G5_TEST_SEED 0x4ead9e3ull
#include "tests/gpu/gpu_test_util.h"

static int same_bits(float a, float b) {
    uint32_t x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    return x == y;
}

static uint16_t bf16_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

static float float_of_bf16(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Random weights of `type`: quant_fill_random's blocks, or finite random floats. */
static void fill_weights(uint32_t type, uint8_t *w, uint64_t n_elems, uint64_t row_bytes_total) {
    if (type == QT_F32) {
        for (uint64_t i = 0; i < n_elems; i++) {
            const float f = unif(-1.0f, 1.0f);
            memcpy(w + 4 * i, &f, 4);
        }
    } else if (type == QT_BF16) {
        for (uint64_t i = 0; i < n_elems; i++) {
            const uint16_t h = bf16_of(unif(-1.0f, 1.0f));
            memcpy(w + 2 * i, &h, 2);
        }
    } else if (type == QT_F16) { /* exponents 2^-5 .. 2^2, any sign and mantissa */
        for (uint64_t i = 0; i < n_elems; i++) {
            const uint16_t h = (uint16_t)((rnd() & 0x83FF) | ((10 + rnd() % 8) << 10));
            memcpy(w + 2 * i, &h, 2);
        }
    } else {
        const quant_type_info *qi = quant_type_get(type);
        uint64_t seed = rnd();
        if (quant_fill_random(type, w, row_bytes_total / qi->block_bytes, &seed) != G5_OK)
            T_CHECK(0, "%s: fill", qi->name);
    }
}

typedef struct hcase {
    int n_head, m, k;
} hcase;

static void run_case(uint32_t type, const hcase *c, int bf, int n) {
    const quant_type_info *qi = quant_type_get(type);
    const int H = c->n_head, m = c->m, k = c->k;
    uint64_t rb = 0;
    if (quant_row_bytes(type, (uint64_t)k, &rb) != G5_OK) {
        T_CHECK(0, "%s: row bytes of %d", qi->name, k);
        return;
    }
    const uint64_t rows = (uint64_t)H * m;
    uint8_t *w = xmalloc(rows * rb);
    fill_weights(type, w, rows * (uint64_t)k, rows * rb);
    /* inputs with padding between heads and rows (multiples of 8 elements: 16-byte pieces) */
    const int64_t ldxh = k + 8, ldx = H * ldxh + 16, ldyh = m + 3, ldy = H * ldyh + 5;
    float *x = xmalloc((size_t)(n * ldx) * 4);
    uint16_t *xb = xmalloc((size_t)(n * ldx) * 2);
    for (int64_t i = 0; i < n * ldx; i++) {
        x[i] = unif(-2.0f, 2.0f);
        xb[i] = bf16_of(x[i]);
        if (bf) x[i] = float_of_bf16(xb[i]); /* the values the kernel reads */
    }
    void *dw = dup_d(w, rows * rb), *dx = bf ? dup_d(xb, (size_t)(n * ldx) * 2) : dup_d(x, (size_t)(n * ldx) * 4);
    float *dy = dalloc((size_t)(n * ldy) * 4);
    CK(cudaMemset(dy, 0xFF, (size_t)(n * ldy) * 4)); /* NaN poison */
    const cuk_head_gemv_q_args a = {type, dw, H, m, k, dx, bf ? CUK_ACT_BF16 : CUK_ACT_F32, ldx, ldxh, n,
                                    dy, ldy, ldyh};
    g5_error e = {0};
    T_CHECK(cuk_head_gemv_q_fits(&a), "%s: fits", qi->name);
    T_CHECK(cuk_head_gemv_q(&a, NULL, &e) == G5_OK, "%s: launch: %s", qi->name, e.msg);
    float *y = xmalloc((size_t)(n * ldy) * 4);
    get(y, dy, (size_t)(n * ldy) * 4);
    /* the host emulation and a float64 product */
    float *wr = xmalloc((size_t)k * 4);
    int64_t bad_bits = 0, bad_val = 0, bad_pad = 0, written = 0;
    double worst = 0;
    for (int64_t h = 0; h < H; h++)
        for (int64_t r = 0; r < m; r++) {
            const uint8_t *row = w + (uint64_t)(h * m + r) * rb;
            for (int j = 0; j < k / 32; j++) (void)deq_row32(type, row, j, wr + 32 * j);
            for (int t = 0; t < n; t++) {
                const float *xv = x + t * ldx + h * ldxh;
                float sum = 0.0f;
                double ref = 0, mag = 0;
                for (int j = 0; j < k / 32; j++) {
                    float acc = 0.0f;
                    for (int l = 0; l < 32; l++) acc = fmaf(wr[32 * j + l], xv[32 * j + l], acc);
                    sum = sum + acc;
                }
                for (int i = 0; i < k; i++) {
                    ref += (double)wr[i] * xv[i];
                    mag += fabs((double)wr[i] * xv[i]);
                }
                const float got = y[t * ldy + h * ldyh + r];
                written++;
                bad_bits += !same_bits(got, sum);
                const double d = fabs((double)got - ref) / (mag > 0 ? mag : 1);
                if (!(d <= 1e-5)) bad_val++;
                if (d > worst || d != d) worst = d;
            }
        }
    for (int t = 0; t < n; t++) /* padding: never written */
        for (int64_t i = 0; i < ldy; i++) {
            const int64_t h = i / ldyh, r = i % ldyh;
            if (h < H && r < m) continue;
            uint32_t u;
            memcpy(&u, &y[t * ldy + i], 4);
            bad_pad += u != 0xFFFFFFFFu;
        }
    T_CHECK(bad_bits == 0 && bad_val == 0 && bad_pad == 0,
            "%s H %d m %d k %d %s n %d: %lld of %lld outputs differ from the emulated order, %lld past 1e-5 of "
            "float64 (worst %.2e), %lld padding writes",
            qi->name, H, m, k, bf ? "bf16" : "f32", n, (long long)bad_bits, (long long)written, (long long)bad_val,
            worst, (long long)bad_pad);
    free(w), free(x), free(xb), free(y), free(wr);
    cudaFree(dw), cudaFree(dx), cudaFree(dy);
}

int main(void) {
    if (!t_need_device()) return t_report(G5_TEST_NAME);
    /* 32-element blocks (and the floats): k = 192 (the absorption) and up */
    static const uint32_t t32[] = {QT_F32, QT_F16, QT_BF16, QT_Q4_0, QT_Q4_1, QT_Q5_0,
                                   QT_Q5_1, QT_Q8_0, QT_IQ4_NL, QT_MXFP4};
    /* 64- and 256-element blocks: k = 512 (W_UV) */
    static const uint32_t t256[] = {QT_NVFP4,  QT_Q2_K,   QT_Q3_K,    QT_Q4_K,  QT_Q5_K,  QT_Q6_K,
                                    QT_IQ4_XS, QT_IQ2_XXS, QT_IQ2_XS, QT_IQ2_S, QT_IQ3_XXS, QT_IQ3_S,
                                    QT_IQ1_S,  QT_IQ1_M,  QT_TQ1_0,   QT_TQ2_0};
    static const hcase c_abs = {4, 512, 192}, c_uv = {8, 256, 512}, c_odd = {3, 37, 256}, c_max = {2, 5, 8192};
    static const int ns[] = {1, 3, 9, 17};
    for (size_t i = 0; i < sizeof t32 / sizeof t32[0]; i++) {
        for (int bf = 0; bf < 2; bf++)
            for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++) run_case(t32[i], &c_abs, bf, ns[j]);
        run_case(t32[i], &c_uv, 1, 3);
    }
    for (size_t i = 0; i < sizeof t256 / sizeof t256[0]; i++) {
        for (int bf = 0; bf < 2; bf++)
            for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++) run_case(t256[i], &c_uv, bf, ns[j]);
        run_case(t256[i], &c_odd, 0, 9);
    }
    run_case(QT_Q8_0, &c_max, 0, 3);
    run_case(QT_Q6_K, &c_max, 1, 1);
    /* refusals: k not a multiple of the block, past the limit, misaligned input pieces */
    T_CHECK(!cuk_head_gemv_q_takes(QT_Q6_K, 192) && cuk_head_gemv_q_takes(QT_Q5_0, 192) &&
                !cuk_head_gemv_q_takes(QT_Q8_0, 8224) && !cuk_head_gemv_q_takes(QT_Q8_1, 512) &&
                !cuk_head_gemv_q_takes(QT_F32, 48),
            "cuk_head_gemv_q_takes: type and k limits");
    float *d = dalloc(4096);
    const cuk_head_gemv_q_args bad = {QT_Q8_0, d, 2, 4, 64, d, CUK_ACT_BF16, 132, 64, 1, d, 8, 4};
    g5_error e = {0};
    T_CHECK(!cuk_head_gemv_q_fits(&bad) && cuk_head_gemv_q(&bad, NULL, &e) == G5_ERR_INVALID_ARG,
            "misaligned bf16 rows refused: %s", e.msg);
    cudaFree(d);
    return t_report(G5_TEST_NAME);
}
