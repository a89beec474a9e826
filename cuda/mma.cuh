/* Internal to cuda/: the warp-level tensor-core and async-copy instructions the hand-written
 * kernels share (sm_80 and later): mma.sync m16n8k16 with fp16 inputs and float32 accumulators,
 * ldmatrix of four 8x8 b16 tiles (plain and transposed), and 16-byte cp.async with zero fill.
 *
 * Fragments of mma m16n8k16 (row.col), for lane l, g = l / 4, c = l % 4:
 *   A (16 x 16, row-major): a[0] = A[g][2c..], a[1] = A[g + 8][2c..], a[2] = A[g][2c + 8..],
 *     a[3] = A[g + 8][2c + 8..]; ldmatrix.x4 with lane l addressing row (l & 15), column 8 (l >> 4).
 *   B (16 x 8, given as 8 rows n of 16 k): b0 = B[n = g][k = 2c..], b1 = B[g][2c + 8..].
 *   C (16 x 8): c[0..1] = C[g][2c..], c[2..3] = C[g + 8][2c..]. */
#ifndef G5_CUDA_MMA_CUH
#define G5_CUDA_MMA_CUH

#include <stdint.h>

namespace cuk {

__device__ __forceinline__ void mma_f16(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldsm4(uint32_t *r, uint32_t a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

__device__ __forceinline__ void ldsm4t(uint32_t *r, uint32_t a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/* 16 bytes global -> shared; ok false: 16 zero bytes (src is not read) */
__device__ __forceinline__ void cp16(uint32_t dst, const void *src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

} // namespace cuk

#endif
