/* The int8-input GEMV and MoE kernels (cuda/gemv_q8_kern.cuh) for IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, Q4_0
 * and Q4_1
 * (units: cuda/q8_lowbit.cuh); one of three files so that the instances compile in parallel. */
#include "cuda/q8_lowbit.cuh"

int cuk::q8_lb_run_b(int kind, uint32_t t, const void *a, int nv, int64_t rb, int64_t k, int planes,
                     cudaStream_t st) {
    switch (t) {
    case QT_IQ2_XXS: q8_lb_run<QT_IQ2_XXS>(kind, a, nv, rb, k, planes, st); return 1;
    case QT_IQ2_XS: q8_lb_run<QT_IQ2_XS>(kind, a, nv, rb, k, planes, st); return 1;
    case QT_IQ2_S: q8_lb_run<QT_IQ2_S>(kind, a, nv, rb, k, planes, st); return 1;
    case QT_IQ3_XXS: q8_lb_run<QT_IQ3_XXS>(kind, a, nv, rb, k, planes, st); return 1;
    case QT_IQ3_S: q8_lb_run<QT_IQ3_S>(kind, a, nv, rb, k, planes, st); return 1;
    case QT_Q4_0: q8_lb_run<QT_Q4_0>(kind, a, nv, rb, k, planes, st); return 1;
    case QT_Q4_1: q8_lb_run<QT_Q4_1>(kind, a, nv, rb, k, planes, st); return 1;
    default: return 0;
    }
}
