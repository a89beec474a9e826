/* The int8-input GEMV and MoE kernels (cuda/gemv_q8_kern.cuh) for Q2_K, Q3_K, TQ1_0, TQ2_0, IQ4_NL and IQ4_XS
 * (units: cuda/q8_lowbit.cuh); one of three files so that the instances compile in parallel. */
#include "cuda/q8_lowbit.cuh"

int cuk::q8_lb_run_a(int kind, uint32_t t, const void *a, int nv, int64_t rb, int64_t k, int planes,
                     cudaStream_t st) {
    switch (t) {
    case QT_Q2_K: q8_lb_run<QT_Q2_K>(kind, a, nv, rb, k, planes, st); return 1;
    case QT_Q3_K: q8_lb_run<QT_Q3_K>(kind, a, nv, rb, k, planes, st); return 1;
    case QT_TQ1_0: q8_lb_run<QT_TQ1_0>(kind, a, nv, rb, k, planes, st); return 1;
    case QT_TQ2_0: q8_lb_run<QT_TQ2_0>(kind, a, nv, rb, k, planes, st); return 1;
    case QT_IQ4_NL: q8_lb_run<QT_IQ4_NL>(kind, a, nv, rb, k, planes, st); return 1;
    case QT_IQ4_XS: q8_lb_run<QT_IQ4_XS>(kind, a, nv, rb, k, planes, st); return 1;
    default: return 0;
    }
}
