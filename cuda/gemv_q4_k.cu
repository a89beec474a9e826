/* GEMV kernels for Q4_K (one file per type so that the types compile in parallel). */
#include "cuda/gemv_impl.cuh"

CUK_GEMV_INSTANTIATE(QT_Q4_K)
