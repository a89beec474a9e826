/* The argmax rule of the device's greedy draws (cuk_argmax in ops.cu, cuk_sample in sample.cu):
 * the larger value wins, equal values the lower index, NaN never (callers skip NaN before). */
#ifndef G5_CUDA_ARGMAX_CUH
#define G5_CUDA_ARGMAX_CUH

/* (v, i) replaces (bv, bi) if it is larger, or equal with a lower index; i < 0 is no candidate. */
template <typename I> __device__ __forceinline__ void argmax_take(float &bv, I &bi, float v, I i) {
    if (i < 0) return;
    if (bi < 0 || v > bv || (v == bv && i < bi)) bv = v, bi = i;
}

/* The warp's best (bv, bi) into every lane: a butterfly of argmax_take (the rule is a total
 * order, so the result does not depend on the pairing). */
template <typename I> __device__ __forceinline__ void argmax_warp(float &bv, I &bi) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const I oi = __shfl_xor_sync(0xffffffffu, bi, o);
        argmax_take(bv, bi, ov, oi);
    }
}

#endif
