/* GEMV kernels for Q4_K (one file per type so that the types compile in parallel): the CUDA-core
 * kernels and the tensor-core ones (cuda/gemv_tc.cuh). */
#include "cuda/gemv_impl.cuh"
#include "cuda/gemv_tc.cuh"

CUK_GEMV_INSTANTIATE(QT_Q4_K)
CUK_GEMV_TC_INSTANTIATE(QT_Q4_K)
