/* GEMV kernels for Q8_0 (one file per type so that the types compile in parallel): the CUDA-core
 * kernels (the tensor-core ones lost on every Q8_0 shape, bench/NOTES.md). */
#include "cuda/gemv_impl.cuh"

CUK_GEMV_INSTANTIATE(QT_Q8_0)
