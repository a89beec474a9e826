/* GEMV kernels for F16 (one file per type so that the types compile in parallel). */
#include "cuda/gemv_impl.cuh"

CUK_GEMV_INSTANTIATE(QT_F16)
