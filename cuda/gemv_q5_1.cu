/* GEMV kernels for Q5_1 (one file per type so that the types compile in parallel). */
#include "cuda/gemv_impl.cuh"

CUK_GEMV_INSTANTIATE(QT_Q5_1)
