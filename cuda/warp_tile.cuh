/* Internal to cuda/: the register-tile reductions of the GEMV kernels (gemv_impl.cuh, the float
 * kernels; gemv_q8.cu, the int8 ones): acc[R][NV] partial sums of R rows x NV vectors per lane. */
#ifndef G5_WARP_TILE_CUH
#define G5_WARP_TILE_CUH

#include <cuda_runtime.h>

namespace cuk {

/* Butterfly sum over the warp: every lane ends with the totals, in an order fixed by the lane
 * layout alone. */
template <int R, int NV> __device__ __forceinline__ void warp_sum(float (&a)[R][NV]) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int v = 0; v < NV; v++) a[r][v] += __shfl_xor_sync(0xffffffffu, a[r][v], off);
}

/* a[l / NV][l % NV] with compile-time register indices. */
template <int R, int NV> __device__ __forceinline__ float pick(const float (&a)[R][NV], int l) {
    float out = 0.0f;
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int v = 0; v < NV; v++)
            if (l == r * NV + v) out = a[r][v];
    return out;
}

} // namespace cuk

#endif
