/* GEMV kernels for Q8_0 (one file per type so that the types compile in parallel): the CUDA-core
 * kernels and the tensor-core ones (cuda/gemv_tc.cuh). */
#include "cuda/gemv_impl.cuh"
#include "cuda/gemv_tc.cuh"

CUK_GEMV_INSTANTIATE(QT_Q8_0)
CUK_GEMV_TC_INSTANTIATE(QT_Q8_0)
