/* Internal to cuda/: the int8 quantization of one 32-element block (cuda/cuk_q8.h's rule), shared by
 * cuk_q8_quantize and the kernels that quantize the row they just computed (cuk_norm_q8,
 * cuk_silu_mul_q8), so that a fused launch writes the bytes and floats of the separate ones. */
#ifndef G5_Q8_QUANT_CUH
#define G5_Q8_QUANT_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/cuk_q8.h"

namespace cuk {

/* The checks of an int8 operand of rows of k (cuda/cuk_q8.h cuk_q8_act: pointers, 16-byte
 * alignment, planes 1 or 2, k % 64 for two planes, ldq and ldds), messages naming `what` and
 * the operand `name`; gemv_q8.cu. */
g5_status q8_check_act(const char *what, const char *name, const cuk_q8_act *x, int64_t k, g5_error *err);

namespace q8q {

/* One block held by G = 32 / E consecutive lanes (aligned to G within the warp), lane gl of the
 * group holding elements E gl .. E gl + E - 1 in v. Writes the block's plane-0 quants at q[0..32)
 * (plane 1 at q[k..k + 32)), and (d, s) at ds[2b], ds[2b + 1] (plane 1: ds[k / 16 + 2b], ..);
 * q2 / ds2 >= 0 put plane 1 at q[q2 ..] and ds[ds2 + 2b ..] instead (a staged layout).
 * Every lane of the warp must call it together (shuffles over the full mask). The amax is a max
 * and the sums are of integers, so their order does not matter: the bits are those of a
 * one-element-per-lane warp (E = 1) whatever E is. */
template <int E, int P>
__device__ __forceinline__ void quant_block(const float (&v)[E], int gl, int8_t *q, int64_t k, float *ds, int64_t b,
                                            int64_t q2 = -1, int64_t ds2 = -1) {
    if (q2 < 0) q2 = k;
    if (ds2 < 0) ds2 = k / 16;
    constexpr int G = 32 / E;
    float amax = fabsf(v[0]);
    int bad = !isfinite(v[0]);
#pragma unroll
    for (int e = 1; e < E; e++) {
        amax = fmaxf(amax, fabsf(v[e]));
        bad |= !isfinite(v[e]);
    }
#pragma unroll
    for (int o = G / 2; o > 0; o >>= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        bad |= __shfl_xor_sync(0xffffffffu, bad, o);
    }
    const float d = amax / 127.0f;
    int qi[E], sum = 0;
    uint32_t word = 0;
#pragma unroll
    for (int e = 0; e < E; e++) {
        qi[e] = d > 0.0f ? __float2int_rn(v[e] / d) : 0;
        sum += qi[e];
        word |= ((uint32_t)qi[e] & 0xffu) << (8 * e);
    }
#pragma unroll
    for (int o = G / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (E == 4) *(uint32_t *)(void *)(q + 4 * gl) = word;
    else q[gl] = (int8_t)qi[0];
    const float dd = bad ? __int_as_float(0x7fc00000) : d;
    float stot = dd * (float)sum;
    if (P == 2) {
        const float d2 = d / 254.0f;
        int sum2 = 0;
        uint32_t word2 = 0;
#pragma unroll
        for (int e = 0; e < E; e++) {
            const float r = fmaf(-d, (float)qi[e], v[e]);
            int q2 = d2 > 0.0f ? __float2int_rn(r / d2) : 0;
            q2 = q2 > 127 ? 127 : q2 < -127 ? -127 : q2;
            sum2 += q2;
            word2 |= ((uint32_t)q2 & 0xffu) << (8 * e);
        }
#pragma unroll
        for (int o = G / 2; o > 0; o >>= 1) sum2 += __shfl_xor_sync(0xffffffffu, sum2, o);
        if (E == 4) *(uint32_t *)(void *)(q + q2 + 4 * gl) = word2;
        else q[q2 + gl] = (int8_t)word2;
        stot = fmaf(d2, (float)sum2, stot);
        if (gl == 0) {
            ds[ds2 + 2 * b] = bad ? dd : d2;
            ds[ds2 + 2 * b + 1] = 0.0f;
        }
    }
    if (gl == 0) {
        ds[2 * b] = dd;
        ds[2 * b + 1] = stot;
    }
}

} // namespace q8q
} // namespace cuk

#endif
