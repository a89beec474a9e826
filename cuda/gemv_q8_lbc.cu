/* The int8-input GEMV and MoE kernels (cuda/gemv_q8_kern.cuh) for IQ1_S, IQ1_M, MXFP4, NVFP4, Q5_0 and Q5_1
 * (units: cuda/q8_lowbit.cuh); one of three files so that the instances compile in parallel. */
#include "cuda/q8_lowbit.cuh"

int cuk::q8_lb_run_c(int kind, uint32_t t, const void *a, int nv, int64_t rb, int64_t k, int planes,
                     cudaStream_t st) {
    switch (t) {
    case QT_IQ1_S: q8_lb_run<QT_IQ1_S>(kind, a, nv, rb, k, planes, st); return 1;
    case QT_IQ1_M: q8_lb_run<QT_IQ1_M>(kind, a, nv, rb, k, planes, st); return 1;
    case QT_MXFP4: q8_lb_run<QT_MXFP4>(kind, a, nv, rb, k, planes, st); return 1;
    case QT_NVFP4: q8_lb_run<QT_NVFP4>(kind, a, nv, rb, k, planes, st); return 1;
    case QT_Q5_0: q8_lb_run<QT_Q5_0>(kind, a, nv, rb, k, planes, st); return 1;
    case QT_Q5_1: q8_lb_run<QT_Q5_1>(kind, a, nv, rb, k, planes, st); return 1;
    default: return 0;
    }
}
