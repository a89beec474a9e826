/* Internal to cuda/: the MMA tiles that fast mode's two MLA attention kernels share (the prefill
 * kernels of attn_flash.cu and the decode kernel of attn_dec.cu). Rows are GLM-5's absorbed
 * query/key rows: FD = 576 fp16 elements (kv_lora 512 + rope 64), the values their first
 * FDV = 512; a key tile holds FBN = 64 rows. Shared-memory tiles are stored in 16-byte chunks
 * XOR-swizzled by row (sw, swp), so that ldmatrix over 8 consecutive rows is conflict-free. */
#ifndef G5_CUDA_MLA_TILE_CUH
#define G5_CUDA_MLA_TILE_CUH

#include <stdint.h>

#include "cuda/mma.cuh"

namespace cuk {
namespace mla {

constexpr int FD = 576, FDV = 512, FCH = FD / 8; /* row width, value width, 16-byte chunks per row */
constexpr int FBN = 64;                          /* keys per tile */
constexpr int ROWB = FD * 2;                     /* bytes per Q/K row */
constexpr int SK_B = FBN * ROWB;                 /* bytes per key tile */

/* byte offset of 16-byte chunk c of row r in a [rows][FD] tile / a [rows][FBN] P tile */
__device__ __forceinline__ uint32_t sw(int r, int c) { return (uint32_t)(r * ROWB + ((c ^ (r & 7)) << 4)); }
__device__ __forceinline__ uint32_t swp(int r, int c) { return (uint32_t)(r * FBN * 2 + ((c ^ (r & 7)) << 4)); }

/* O[16 rows p0 ..][16 NP values from 16-byte chunk c0 of the key rows] += P[rows][FBN keys] V:
 * P from the swizzled fp16 tile at sp, V the key tile sk read transposed (ldmatrix .trans). */
template <int NP>
__device__ __forceinline__ void pv_acc(float (&o)[2 * NP][4], uint32_t sp, int p0, uint32_t sk, int c0, int lane) {
#pragma unroll
    for (int kk = 0; kk < FBN / 16; kk++) {
        uint32_t a[4];
        ldsm4(a, sp + swp(p0 + (lane & 15), kk * 2 + (lane >> 4)));
#pragma unroll
        for (int np = 0; np < NP; np++) {
            const int mi = lane >> 3, key = kk * 16 + (lane & 7) + ((mi & 1) << 3);
            uint32_t bb[4];
            ldsm4t(bb, sk + sw(key, c0 + np * 2 + (mi >> 1)));
            mma_f16(o[np * 2], a, bb[0], bb[1]);
            mma_f16(o[np * 2 + 1], a, bb[2], bb[3]);
        }
    }
}

} // namespace mla
} // namespace cuk

#endif
