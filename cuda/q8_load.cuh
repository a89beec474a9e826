/* Internal to cuda/: what the int8-input kernels (gemv_q8.cu, the dp4a GEMV and MoE kernels;
 * gemv_q8t.cu, the tensor-core GEMV) read weights and scales with: non-coherent loads of 4, 8 and
 * 16 bytes, fp16 bits to float, the Q4_K/Q5_K packed scales, and the float32 value of one
 * 64-element unit from its exact integer dot products. Both kernels build every output from these
 * unit values in one order (cuda/cuk_q8.h), so a row's bits are the same from either kernel: the
 * roundings are spelled out (__fmul_rn, __fadd_rn: no contraction into fma that one kernel's
 * compile might do and the other's not). */
#ifndef G5_Q8_LOAD_CUH
#define G5_Q8_LOAD_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/cuk_q8.h"

namespace cuk {
namespace q8l {

__device__ __forceinline__ uint4 ldg128(const void *p) {
    uint4 v;
    asm("ld.global.nc.v4.b32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ uint2 ldg64(const void *p) {
    uint2 v;
    asm("ld.global.nc.v2.b32 {%0,%1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}
__device__ __forceinline__ uint32_t ldg32(const void *p) {
    uint32_t v;
    asm("ld.global.nc.b32 %0, [%1];\n" : "=r"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ float4 ldg_f4(const float *p) {
    const uint4 u = ldg128(p);
    return make_float4(__uint_as_float(u.x), __uint_as_float(u.y), __uint_as_float(u.z), __uint_as_float(u.w));
}
__device__ __forceinline__ float h2f(uint32_t bits) {
    return __half2float(__ushort_as_half((unsigned short)(bits & 0xFFFFu)));
}

/* Q4_K/Q5_K sub-block j (0..7) scale and min from the 12 packed bytes (ggml get_scale_min_k4),
 * times the block's d and dmin; hdr is the block's first 16 bytes. */
__device__ __forceinline__ void k4_scale(const uint4 &hdr, int j, float &d1, float &m1) {
    const int jj = j & 3;
    const uint32_t b0 = (hdr.y >> (8 * jj)) & 0xFFu, b1 = (hdr.z >> (8 * jj)) & 0xFFu;
    const uint32_t b2 = (hdr.w >> (8 * jj)) & 0xFFu;
    uint32_t sc, mn;
    if (j < 4) {
        sc = b0 & 63u;
        mn = b1 & 63u;
    } else {
        sc = (b2 & 0xFu) | ((b0 >> 6) << 4);
        mn = (b2 >> 4) | ((b1 >> 6) << 4);
    }
    d1 = h2f(hdr.x) * (float)sc;
    m1 = h2f(hdr.x >> 16) * (float)mn;
}

/* A Q4_K/Q5_K header unpacked once per block for k4_scale_of: d and dmin as floats, the 8
 * sub-blocks' 6-bit scales and mins as bytes (j < 4 in lo, j >= 4 in hi). */
struct K4Hdr {
    float d, dm;
    uint32_t s_lo, m_lo, s_hi, m_hi;
};
__device__ __forceinline__ K4Hdr k4_unpack(const uint4 &hdr) {
    K4Hdr k;
    k.d = h2f(hdr.x);
    k.dm = h2f(hdr.x >> 16);
    k.s_lo = hdr.y & 0x3F3F3F3Fu;
    k.m_lo = hdr.z & 0x3F3F3F3Fu;
    k.s_hi = (hdr.w & 0x0F0F0F0Fu) | ((hdr.y >> 2) & 0x30303030u);
    k.m_hi = ((hdr.w >> 4) & 0x0F0F0F0Fu) | ((hdr.z >> 2) & 0x30303030u);
    return k;
}
/* k4_scale's d1, m1 (the same bits: the same integers times the same floats). */
__device__ __forceinline__ void k4_scale_of(const K4Hdr &k, int j, float &d1, float &m1) {
    const int sh = 8 * (j & 3);
    d1 = k.d * (float)(((j < 4 ? k.s_lo : k.s_hi) >> sh) & 0xFFu);
    m1 = k.dm * (float)(((j < 4 ? k.m_lo : k.m_hi) >> sh) & 0xFFu);
}

/* Q4_K/Q5_K unit: sub-blocks 0 and 1 with weight scales d0, d1 and mins m0, m1, x's (d, s) of the
 * two blocks, the exact dot products i0, i1 as floats. */
__device__ __forceinline__ float unit_k4(float d0, float m0, float d1, float m1, float dx0, float sx0, float dx1,
                                         float sx1, float i0, float i1) {
    const float a = __fsub_rn(__fmul_rn(d0, __fmul_rn(dx0, i0)), __fmul_rn(m0, sx0));
    const float b = __fsub_rn(__fmul_rn(d1, __fmul_rn(dx1, i1)), __fmul_rn(m1, sx1));
    return __fadd_rn(a, b);
}
/* Q8_0 unit: blocks 0 and 1 with scales w0, w1. */
__device__ __forceinline__ float unit_q8_0(float w0, float w1, float dx0, float dx1, float i0, float i1) {
    return __fadd_rn(__fmul_rn(w0, __fmul_rn(dx0, i0)), __fmul_rn(w1, __fmul_rn(dx1, i1)));
}
/* Q6_K unit: acc over its four 16-element quarters j = 0..3 in order, from acc = 0:
 * acc += (d * sc_j) * (dx_j * i_j), ws = d * sc_j already rounded. */
__device__ __forceinline__ float q6_add(float acc, float ws, float dx, float i) {
    return __fadd_rn(acc, __fmul_rn(ws, __fmul_rn(dx, i)));
}

} // namespace q8l

/* Host side, gemv_q8.cu: the argument checks of the MoE calls (what names the caller in the
 * message; *rb gets the weight row's bytes) and the slot sum after a down kernel, shared by the
 * dp4a and the tensor-core MoE kernels. */
g5_status q8_moe_gate_up_check(const char *what, const cuk_moe_gate_up_q8_args *a, int64_t *rb, g5_error *err);
g5_status q8_moe_down_check(const char *what, const cuk_moe_down_q8_args *a, int64_t *rb, g5_error *err);
g5_status q8_moe_combine(const cuk_moe_down_q8_args *a, cudaStream_t stream, g5_error *err);

} // namespace cuk

#endif
