/* The low-bit types' GEMV and MoE kernels (cuda/gemv_lowbit.cu), for cuda/gemv.cu's dispatch:
 * arguments already validated by the cuk_gemv / cuk_moe_* launchers. C++ only. */
#ifndef G5_CUDA_GEMV_LOWBIT_H
#define G5_CUDA_GEMV_LOWBIT_H

#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/cuk.h"

namespace cuk {
int lowbit_handles(uint32_t type); /* Q2_K, Q3_K, the i-quants but IQ4_*, TQ*, MXFP4, NVFP4 */
int lowbit_block(uint32_t type);   /* elements per block, 0 for other types */
g5_status lowbit_gemv(const cuk_gemv_args *a, cudaStream_t s, g5_error *err);
g5_status lowbit_gate_up(const cuk_moe_gate_up_args *a, cudaStream_t s, g5_error *err);
g5_status lowbit_down(const cuk_moe_down_args *a, cudaStream_t s, g5_error *err);
} // namespace cuk

#endif
