/* The fp16 tensor-core GEMV of batched decode (cuda/gemv_h16.cu, which this file includes) against
 * the int8 forms the runtime runs now, at the peer model's Q4_K / Q5_K shapes and n = 1, 8, 32:
 * the copy rate (the ceiling); cuk_gemv_q8t one and two planes (the runtime's batched form);
 * cuk_gemv_q8_xs two planes at n = 1 (its one-token form); cuk_gemv_h16; and h16x (sc q exact in
 * fp16, x as two fp16 planes and per-block sums, d and dmin applied a block: the precision
 * reference, 30-70x closer to float64 than two int8 planes and slower: bench/RESULTS.md, session
 * 40). Also the error of each against a float64 product of the dequantized weights and the
 * float32 x (max over outputs of |y - ref| / sum |w x|), and that every column at n = 8 and 32
 * equals its one-vector launch bit for bit.
 *
 * (k_h16ring, the weights through a per-warp cp.async ring, lost at every n and is gone: bench/
 * RESULTS.md, session 41.) Built on the CPU machine, run on the device with no build there:
 * bench/pending/s44-next.sh (build, bench).
 * Usage: h16bench [reps]. Exits 1 on a failed check. */
#include <cuda_fp16.h>
#include <math.h>

#include "cuda/gemv_h16.cu"

#include "bench/pending/pending.cuh"
#include "cuda/cuk_q8.h"
#include "format/quant.h"

namespace h16 {

__device__ __forceinline__ __half2 u2h(uint32_t v) { return *(__half2 *)&v; }

/* The exact form (h16x): A = sc q, an integer below 2048 (6-bit scale times 5-bit quant), so every
 * weight enters the mma exactly; per 256-element block the mma sums P = sum sc q x (x as two fp16
 * planes, hi + lo: about 22 bits) and Pm = sum_sb m_sb S_sb (S_sb the x block sums, hi + lo, one
 * m16n8k16 a block), then C += d P - dmin Pm: two float products a block per output. x is scaled
 * per vector by a power of two (prep_x: its largest magnitude to [2^9, 2^10), so that a block sum
 * stays below 2^15), which y undoes exactly. */
struct XH {
    const __half *hi, *lo; /* [n][ldx] */
    const __half *sums;    /* [n][steps][16]: per lane c halves 4c..4c+3 = S_hi[2c], S_hi[2c+1], S_lo[2c], S_lo[2c+1] */
    const float *unscale;  /* [n] */
    int64_t ldx, ldsum;
};

/* One 256-element block s of the lane's rows into C (the order of k_h16x's top comment). */
template <int T, int NT, int XP>
__device__ __forceinline__ void h16x_step(const Blk<T> &cur, const XH &x, const int64_t (&xo)[NT], const int64_t (&so)[NT],
                                          int s, int c, float (&C)[NT][4]) {
    const __half2 k1024 = __float2half2_rn(1024.0f);
    const uint32_t msel = (uint32_t)((2 * c) & 3) | 0x40u | ((uint32_t)(((2 * c) & 3) + 1) << 8) | 0x4000u;
    const K4Hdr kh[2] = {k4_unpack(cur.h[0]), k4_unpack(cur.h[1])};
    float P[NT][4];
#pragma unroll
    for (int t = 0; t < NT; t++) P[t][0] = P[t][1] = P[t][2] = P[t][3] = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int sb = 2 * j + h;
            uint32_t A[2][4]; /* per 4-byte half, the A fragment (cuda/mma.cuh's order) */
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const uint32_t scb = ((sb < 4 ? kh[r].s_lo : kh[r].s_hi) >> (8 * (sb & 3))) & 0xFFu;
                const __half2 sc2 = __hsub2(u2h(0x64006400u | scb | (scb << 16)), k1024);
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const uint32_t word = hf ? cur.q[r][j].y : cur.q[r][j].x;
                    uint32_t v = (word >> (4 * h)) & 0x0F0F0F0Fu;
                    if (T == QT_Q5_K) v |= (((hf ? cur.qh[r].y : cur.qh[r].x) >> sb) & 0x01010101u) << 4;
                    A[hf][r] = h2u(__hmul2(__hsub2(u2h(__byte_perm(v, 0x64u, 0x4140)), k1024), sc2));
                    A[hf][2 + r] = h2u(__hmul2(__hsub2(u2h(__byte_perm(v, 0x64u, 0x4342)), k1024), sc2));
                }
            }
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const int64_t e = xo[t] + (int64_t)s * 256 + 64 * j + 32 * h;
                const uint4 b = __ldg((const uint4 *)(x.hi + e));
                cuk::mma_f16(P[t], A[0], b.x, b.y);
                cuk::mma_f16(P[t], A[1], b.z, b.w);
                if (XP == 2) {
                    const uint4 l = __ldg((const uint4 *)(x.lo + e));
                    cuk::mma_f16(P[t], A[0], l.x, l.y);
                    cuk::mma_f16(P[t], A[1], l.z, l.w);
                }
            }
        }
    /* the mins: m of sub-blocks 2c, 2c + 1 (rows g, g + 8) against S_hi and S_lo of x */
    uint32_t am[4]; /* the A fragment: m of rows g, g + 8 against S_hi (k 2c..) and S_lo (k 2c + 8..) */
#pragma unroll
    for (int r = 0; r < 2; r++) am[r] = am[2 + r] = h2u(__hsub2(u2h(__byte_perm(c < 2 ? kh[r].m_lo : kh[r].m_hi, 0x64u, msel)), k1024));
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const uint2 b = __ldg((const uint2 *)(x.sums + so[t] + (int64_t)s * 16));
        float Pm[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        cuk::mma_f16(Pm, am, b.x, b.y);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const K4Hdr &k = kh[e >> 1];
            C[t][e] = __fadd_rn(C[t][e], __fsub_rn(__fmul_rn(k.d, P[t][e]), __fmul_rn(k.dm, Pm[e])));
        }
    }
}

template <int NT>
__device__ __forceinline__ void h16x_cols(const XH &x, int n, int g, int c, int64_t (&xo)[NT], int64_t (&so)[NT]) {
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const int col = 8 * t + g < n ? 8 * t + g : n - 1;
        xo[t] = (int64_t)col * x.ldx + 8 * c;
        so[t] = (int64_t)col * x.ldsum + 4 * c;
    }
}

/* Grid and lanes as k_h16; the next block's weights held in registers while this one multiplies. */
template <int T, int NT, int KW, int XP>
__global__ void __launch_bounds__(KW * 32, (NT == 4 && XP == 2 ? 12 : 16) / KW) k_h16x(const uint8_t *__restrict__ w, int64_t rb, int64_t m,
                                                           int steps, XH x, int n, float *__restrict__ y, int64_t ldy) {
    __shared__ float red[KW][NT * 4][32];
    const int lane = threadIdx.x & 31, ks = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const uint8_t *rp[2];
    tile_rows(w, rb, m, g, rp);
    int64_t xo[NT], so[NT];
    h16x_cols<NT>(x, n, g, c, xo, so);
    float C[NT][4] = {};
    tile_blocks<T>(rp, steps, ks, c, [&](const Blk<T> &b, int s) { h16x_step<T, NT, XP>(b, x, xo, so, s, c, C); });
    tile_finish<NT, KW>(C, red, x.unscale, (int64_t)blockIdx.x * 16, m, n, y, ldy);
}


template <int T, int KW, int XP>
static void launch_x(const uint8_t *w, int64_t rb, int64_t m, int64_t k, const XH &x, int n, float *y, int64_t ldy) {
    const unsigned grid = (unsigned)((m + 15) / 16);
    const int steps = (int)(k / 256);
    const auto fn = n <= 8 ? k_h16x<T, 1, KW, XP> : n <= 16 ? k_h16x<T, 2, KW, XP> : k_h16x<T, 4, KW, XP>;
    fn<<<grid, KW * 32>>>(w, rb, m, steps, x, n, y, ldy);
    CK(cudaGetLastError());
}

/* the host side of XH for x [n][k] (float32): scale, planes, block sums */
static void prep_x(const float *x, int n, int64_t k, std::vector<__half> &hi, std::vector<__half> &lo,
                   std::vector<__half> &sums, std::vector<float> &unscale) {
    const int64_t steps = k / 256;
    hi.resize((size_t)n * k), lo.resize((size_t)n * k), sums.resize((size_t)n * steps * 16), unscale.resize((size_t)n);
    for (int v = 0; v < n; v++) {
        const float *xv = x + (size_t)v * k;
        float amax = 0;
        for (int64_t i = 0; i < k; i++) amax = fmaxf(amax, fabsf(xv[i]));
        int e = 0;
        if (amax > 0) {
            frexpf(amax, &e);       /* amax in [2^(e-1), 2^e) */
            e = 10 - e;             /* amax * 2^e in [2^9, 2^10): a block sum stays below 2^15 */
        }
        unscale[v] = ldexpf(1.0f, -e);
        for (int64_t b = 0; b < k / 32; b++) {
            float sum = 0;
            for (int i = 0; i < 32; i++) {
                const int64_t ix = b * 32 + i;
                const float xs = ldexpf(xv[ix], e);
                const __half h = __float2half_rn(xs);
                hi[(size_t)v * k + ix] = h;
                lo[(size_t)v * k + ix] = __float2half_rn(xs - __half2float(h));
                sum += xs;
            }
            const __half sh = __float2half_rn(sum), sl = __float2half_rn(sum - __half2float(sh));
            const int64_t s = b / 8, sb = b % 8, cc = sb / 2;
            __half *o = &sums[((size_t)v * steps + s) * 16 + 4 * cc];
            o[sb % 2] = sh;
            o[2 + sb % 2] = sl;
        }
    }
}

} // namespace h16

static const size_t POOL = (size_t)1 << 30;

static double copy_rate(uint8_t *pool) {
    const size_t half = POOL / 2;
    const float us = time_us(10, [&](int) { CK(cudaMemcpyAsync(pool + half, pool, half, cudaMemcpyDeviceToDevice, NULL)); });
    return 2.0 * (double)half / (us * 1e-6);
}

/* max over the checked outputs of |y - ref| / sum |w x| (rows 0 .. rows - 1, every column) */
static double rel_err(const float *y, const double *ref, const double *mag, int64_t m, int rows, int n) {
    double e = 0;
    for (int v = 0; v < n; v++)
        for (int r = 0; r < rows; r++) {
            const double d = fabs((double)y[(int64_t)v * m + r] - ref[v * rows + r]) / mag[v * rows + r];
            if (d > e) e = d;
        }
    return e;
}

static int failures = 0;

static void shape(uint8_t *pool, uint32_t t, int64_t m, int64_t k, const char *what, double rate, int reps) {
    uint64_t rb = 0;
    if (quant_row_bytes(t, (uint64_t)k, &rb)) exit(2);
    const uint64_t bytes = rb * (uint64_t)m, stride = (bytes + 255) & ~255ull;
    const int copies = (int)(POOL / stride);
    std::vector<uint8_t> hw(bytes);
    uint64_t st = 777;
    if (quant_fill_random(t, hw.data(), bytes / quant_type_get(t)->block_bytes, &st) != G5_OK) exit(2);
    CK(cudaMemcpy(pool, hw.data(), bytes, cudaMemcpyHostToDevice));
    for (int i = 1; i < copies; i++) CK(cudaMemcpy(pool + i * stride, pool, bytes, cudaMemcpyDeviceToDevice));
    /* x: 32 vectors of k, smooth plus a few outliers (attention outputs have some) */
    const int NV = 32;
    std::vector<float> hx((size_t)NV * k);
    for (size_t i = 0; i < hx.size(); i++) {
        hx[i] = unif(-1.0f, 1.0f);
        if (i % 997 == 0) hx[i] *= 20.0f;
    }
    float *xf, *ds, *y, *y1, *hun;
    int8_t *q1, *q2;
    float *ds2;
    uint16_t *xh;
    int8_t *fx;
    CK(cudaMalloc((void **)&xf, hx.size() * 4));
    CK(cudaMalloc((void **)&xh, hx.size() * 2));
    CK(cudaMalloc((void **)&hun, (size_t)NV * 4));
    CK(cudaMalloc((void **)&q1, (size_t)NV * 2 * k));
    CK(cudaMalloc((void **)&q2, (size_t)NV * 2 * k));
    CK(cudaMalloc((void **)&ds, (size_t)NV * k / 8 * 4));
    CK(cudaMalloc((void **)&ds2, (size_t)NV * k / 8 * 4));
    CK(cudaMalloc((void **)&y, (size_t)NV * m * 4));
    CK(cudaMalloc((void **)&y1, (size_t)NV * m * 4));
    CK(cudaMalloc((void **)&fx, (size_t)k * CUK_Q8T_SCRATCH_PER_K));
    CK(cudaMemcpy(xf, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
    const cuk_h16_prep_args hp = {xf, k, k, NV, xh, k, hun};
    GXX(cuk_h16_prep(&hp, NULL, &err_));
    const cuk_q8_quantize_args qa1 = {xf, k, k, NV, q1, 2 * k, ds, k / 8, 1};
    const cuk_q8_quantize_args qa2 = {xf, k, k, NV, q2, 2 * k, ds2, k / 8, 2};
    GXX(cuk_q8_quantize(&qa1, NULL, &err_));
    GXX(cuk_q8_quantize(&qa2, NULL, &err_));
    const cuk_q8_act x1 = {q1, 2 * k, ds, k / 8, 1}, x2 = {q2, 2 * k, ds2, k / 8, 2};
    /* the float64 reference of the first rows */
    const int RR = 48;
    std::vector<float> wd((size_t)k);
    std::vector<double> ref((size_t)NV * RR), mag((size_t)NV * RR);
    for (int r = 0; r < RR; r++) {
        if (quant_dequantize(t, hw.data() + (size_t)r * rb, (uint64_t)k, wd.data()) != G5_OK) exit(2);
        for (int v = 0; v < NV; v++) {
            double s = 0, a = 0;
            for (int64_t i = 0; i < k; i++) {
                const double p = (double)wd[i] * (double)hx[(size_t)v * k + i];
                s += p;
                a += fabs(p);
            }
            ref[v * RR + r] = s;
            mag[v * RR + r] = a;
        }
    }
    /* the h16x operand */
    std::vector<__half> xhi, xlo, xsum;
    std::vector<float> unsc;
    h16::prep_x(hx.data(), NV, k, xhi, xlo, xsum, unsc);
    __half *dhi, *dlo, *dsum;
    float *dun;
    CK(cudaMalloc((void **)&dhi, xhi.size() * 2));
    CK(cudaMalloc((void **)&dlo, xlo.size() * 2));
    CK(cudaMalloc((void **)&dsum, xsum.size() * 2));
    CK(cudaMalloc((void **)&dun, unsc.size() * 4));
    CK(cudaMemcpy(dhi, xhi.data(), xhi.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dlo, xlo.data(), xlo.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dsum, xsum.data(), xsum.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dun, unsc.data(), unsc.size() * 4, cudaMemcpyHostToDevice));
    /* form f on vectors v0 .. v0 + n - 1 into yo */
    enum { NF = 5 };
    static const char *const names[NF] = {"q8t one plane", "q8t two planes", "dp4a xs two planes", "cuk_gemv_h16",
                                          "h16x KW 4"};
    auto form = [&](int f, const uint8_t *wp, int v0, int n, float *yo) {
        const bool q5 = t == QT_Q5_K;
        h16::XH xa = {dhi + (size_t)v0 * k, dlo + (size_t)v0 * k, dsum + (size_t)v0 * (k / 256) * 16, dun + v0, k, k / 256 * 16};
        const cuk_h16_act xq16 = {xh + (size_t)v0 * k, k, hun + v0};
        if (f <= 2) {
            cuk_q8_act xq = f ? x2 : x1;
            xq.q += (int64_t)v0 * xq.ldq;
            xq.ds += (int64_t)v0 * xq.ldds;
            const cuk_gemv_q8_args g = {t, wp, k, m, xq, n, yo, m, NULL, NULL};
            if (f == 2) GXX(cuk_gemv_q8_xs(&g, NULL, &err_));
            else GXX(cuk_gemv_q8t(&g, fx, (size_t)k * CUK_Q8T_SCRATCH_PER_K, NULL, &err_));
        } else if (f == 3) {
            const cuk_gemv_h16_args g = {t, wp, k, m, xq16, n, yo, m};
            GXX(cuk_gemv_h16(&g, NULL, &err_));
        } else {
            if (q5) h16::launch_x<QT_Q5_K, 4, 2>(wp, (int64_t)rb, m, k, xa, n, yo, m);
            else h16::launch_x<QT_Q4_K, 4, 2>(wp, (int64_t)rb, m, k, xa, n, yo, m);
        }
    };
    std::vector<float> hy((size_t)NV * m), hy1((size_t)NV * m);
    static const int NS[] = {1, 8, 32};
    for (int ni = 0; ni < 3; ni++) {
        const int n = NS[ni];
        double us[NF], err[NF];
        for (int f = 0; f < NF; f++) {
            us[f] = err[f] = -1;
            if (f == 2 && n != 1) continue; /* the one-token dp4a form */
            us[f] = time_us(reps, [&](int i) { form(f, pool + (uint64_t)(i % copies) * stride, 0, n, y); });
            form(f, pool, 0, n, y); /* the copy at 0 holds the checked weights */
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(hy.data(), y, (size_t)n * m * 4, cudaMemcpyDeviceToHost));
            err[f] = rel_err(hy.data(), ref.data(), mag.data(), m, RR, n);
            if (f >= 3 && n > 1) { /* each column alone: the same bits */
                for (int v = 0; v < n; v++) form(f, pool, v, 1, y1 + (size_t)v * m);
                CK(cudaMemcpy(hy1.data(), y1, (size_t)n * m * 4, cudaMemcpyDeviceToHost));
                if (memcmp(hy.data(), hy1.data(), (size_t)n * m * 4)) {
                    fprintf(stderr, "h16bench: %s n %d %s: a column differs from its one-vector run\n", what, n, names[f]);
                    failures++;
                }
            }
        }
        printf("| %s %s %lld x %lld | %d | %.1f |", quant_type_name(t), what, (long long)m, (long long)k, n, bytes / 1e6);
        for (int f = 0; f < NF; f++) {
            if (us[f] < 0) printf(" - |");
            else printf(" %.2f (%.3f) %.1e |", us[f], bytes / (us[f] * 1e-6) / rate, err[f]);
        }
        printf("\n");
        fflush(stdout);
        /* h16x: no further from float64 than the two-plane int8 form */
        if (err[4] > 2 * err[1] + 1e-7 || err[4] < 0) {
            fprintf(stderr, "h16bench: %s n %d: h16x error %.2e against q8t two planes %.2e\n", what, n, err[4], err[1]);
            failures++;
        }
    }
    cudaFree(dhi), cudaFree(dlo), cudaFree(dsum), cudaFree(dun);
    cudaFree(hun);
    cudaFree(xf), cudaFree(xh), cudaFree(q1), cudaFree(q2), cudaFree(ds), cudaFree(ds2), cudaFree(y), cudaFree(y1), cudaFree(fx);
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 50;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    uint8_t *pool;
    CK(cudaMalloc((void **)&pool, POOL));
    CK(cudaMemset(pool, 0, POOL));
    const double rate = copy_rate(pool);
    printf("h16bench: %s, %d SMs; D2D copy %.0f GB/s (read + written); us per launch (ratio to the copy rate) and "
           "max |y - ref| / sum |w x| against float64\n\n",
           prop.name, prop.multiProcessorCount, rate / 1e9);
    printf("| shape | n | MB | q8t one plane | q8t two planes | dp4a xs two planes | cuk_gemv_h16 "
           "| h16x KW 4 |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n");
    shape(pool, QT_Q5_K, 6144, 16384, "attn_output", rate, reps);
    shape(pool, QT_Q5_K, 16384, 2048, "q_b", rate, reps);
    shape(pool, QT_Q4_K, 12288, 6144, "dense gate", rate, reps);
    shape(pool, QT_Q4_K, 6144, 12288, "dense down", rate, reps);
    printf("\n%d failed\n", failures);
    return failures ? 1 : 0;
}
