/* GEMV kernels for IQ4_XS (one file per type so that the types compile in parallel). */
#include "cuda/gemv_impl.cuh"

CUK_GEMV_INSTANTIATE(QT_IQ4_XS)
