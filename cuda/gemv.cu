/* C launchers of the GEMV kernels: host-side validation of every shape, then dispatch on the
 * ggml type to the per-type instantiations (cuda/gemv_<type>.cu, kernels in gemv_impl.cuh). */
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/cuk_internal.cuh"
#include "cuda/gemv_lowbit.h"
#include "cuda/gemv_tc.cuh" /* tc::applies; the kernels are instantiated per type */

namespace cuk {
template <int T> g5_status gemv_run(const cuk_gemv_args *, cudaStream_t, g5_error *);
template <int T> g5_status gate_up_run(const cuk_moe_gate_up_args *, cudaStream_t, g5_error *);
template <int T> g5_status down_run(const cuk_moe_down_args *, cudaStream_t, g5_error *);
} // namespace cuk
CUK_GEMV_TC_EXTERN(QT_Q4_K)

/* ---- which kernels a call runs ---- */

/* Measured on H200 (bench/NOTES.md, GEMV rounds 1-3): the tensor-core Q4_K kernels win on the
 * 119M-weight lm_head and the MoE experts, the CUDA-core ones on the 3-13M-weight attention/dense
 * shapes and on every Q8_0 shape. */
static int64_t tc_min(void) { return 1LL << 25; }

/* 1: the tensor-core kernels for a call of this type; weights: m * k of one matrix; moe: an
 * expert launcher. From the weight shape alone, never from n: a batched launch keeps the bits
 * of one-vector launches. */
static bool tc_picked(uint32_t type, int64_t weights, bool moe) {
    return type == QT_Q4_K && (moe || weights >= tc_min());
}

extern "C" int cuk_gemv_takes_tc(uint32_t type, int64_t m, int64_t k, int32_t n) {
    if (k <= 0 || k > (1LL << 20) || n < 1 || n > CUK_GEMV_MAX_N || m <= 0) return 0;
    return tc_picked(type, m * k, false) && cuk::tc::max_nv<QT_Q4_K>(k) > 0;
}

/* Runs the tensor-core kernel of fn where tc_picked says so; *done = 0: not taken (the shape
 * does not fit it, or the CUDA-core kernels were picked). */
#define TRY_TC(fn, type, weights, moe, a, s, done, err)                                         \
    do {                                                                                        \
        *(done) = 0;                                                                            \
        if (tc_picked(type, weights, moe)) {                                                    \
            g5_status st_ = cuk::tc::fn<QT_Q4_K>(a, done, s, err);                              \
            if (st_ != G5_OK || *(done)) return st_;                                            \
        }                                                                                       \
    } while (0)

/* Elements per block of the GPU kernels' types (0: no GPU kernel). */
static int gpu_block(uint32_t type) {
    switch (type) {
    case QT_F32: case QT_F16: case QT_BF16: return 1;
    case QT_Q8_0: case QT_Q4_0: case QT_Q4_1: case QT_Q5_0: case QT_Q5_1: case QT_IQ4_NL: return 32;
    case QT_Q4_K: case QT_Q5_K: case QT_Q6_K: case QT_IQ4_XS: return 256;
    default: return cuk::lowbit_block(type); /* cuda/gemv_lowbit.cu */
    }
}

extern "C" int cuk_gemv_supported(uint32_t type) { return gpu_block(type) != 0; }

#define BAD(...) g5_fail(err, G5_ERR_INVALID_ARG, __VA_ARGS__)

/* Checks shared by the three launchers: type, k, m, weight alignment and the total byte size
 * n_mat * m * row_bytes (must fit int64). what: the launcher's name for messages. */
static g5_status check_weights(const char *what, uint32_t type, const void *w, const char *wname,
                               int64_t k, int64_t m, int64_t n_mat, g5_error *err) {
    const int blk = gpu_block(type);
    if (!blk)
        return g5_fail(err, G5_ERR_UNSUPPORTED, "%s: type %s (%u) has no GPU kernel", what,
                       quant_type_name(type), type);
    if (!w) return BAD("%s: %s is NULL", what, wname);
    if ((uintptr_t)w % 16) return BAD("%s: %s is not 16-byte aligned", what, wname);
    if (k <= 0) return BAD("%s: k=%lld must be positive", what, (long long)k);
    if (k > (1LL << 30)) return BAD("%s: k=%lld exceeds 2^30", what, (long long)k);
    if (k % blk)
        return BAD("%s: k=%lld is not a multiple of the %s block size %d", what, (long long)k,
                   quant_type_name(type), blk);
    if (k % 8) return BAD("%s: k=%lld is not a multiple of 8", what, (long long)k);
    if (m <= 0) return BAD("%s: m=%lld must be positive", what, (long long)m);
    uint64_t rb = 0, total = 0;
    if (quant_row_bytes(type, (uint64_t)k, &rb) != G5_OK || g5_mul_u64(rb, (uint64_t)m, &total) ||
        g5_mul_u64(total, (uint64_t)n_mat, &total) || total > (uint64_t)INT64_MAX)
        return BAD("%s: m=%lld rows of k=%lld overflow", what, (long long)m, (long long)k);
    return G5_OK;
}

/* An activation operand: [rows][ld] of x_type, rows >= 1, ld >= k and a multiple of 4,
 * aligned for the vector loads. */
static g5_status check_act(const char *what, const void *x, const char *xname, uint32_t x_type,
                           int64_t ld, const char *ldname, int64_t k, g5_error *err) {
    if (!x) return BAD("%s: %s is NULL", what, xname);
    if (x_type != CUK_ACT_F32 && x_type != CUK_ACT_BF16)
        return BAD("%s: %s type %u is neither CUK_ACT_F32 nor CUK_ACT_BF16", what, xname, x_type);
    if ((uintptr_t)x % (x_type == CUK_ACT_F32 ? 16 : 8))
        return BAD("%s: %s is not %d-byte aligned", what, xname, x_type == CUK_ACT_F32 ? 16 : 8);
    if (ld < k) return BAD("%s: %s=%lld < k=%lld", what, ldname, (long long)ld, (long long)k);
    if (ld % 4) return BAD("%s: %s=%lld is not a multiple of 4", what, ldname, (long long)ld);
    return G5_OK;
}

#define DISPATCH(fn, type, a, s, err)                                                          \
    switch (type) {                                                                           \
    case QT_F32: return cuk::fn<QT_F32>(a, s, err);                                           \
    case QT_F16: return cuk::fn<QT_F16>(a, s, err);                                           \
    case QT_BF16: return cuk::fn<QT_BF16>(a, s, err);                                         \
    case QT_Q8_0: return cuk::fn<QT_Q8_0>(a, s, err);                                         \
    case QT_Q4_0: return cuk::fn<QT_Q4_0>(a, s, err);                                         \
    case QT_Q4_1: return cuk::fn<QT_Q4_1>(a, s, err);                                         \
    case QT_Q5_0: return cuk::fn<QT_Q5_0>(a, s, err);                                         \
    case QT_Q5_1: return cuk::fn<QT_Q5_1>(a, s, err);                                         \
    case QT_IQ4_NL: return cuk::fn<QT_IQ4_NL>(a, s, err);                                     \
    case QT_Q4_K: return cuk::fn<QT_Q4_K>(a, s, err);                                         \
    case QT_Q5_K: return cuk::fn<QT_Q5_K>(a, s, err);                                         \
    case QT_Q6_K: return cuk::fn<QT_Q6_K>(a, s, err);                                         \
    case QT_IQ4_XS: return cuk::fn<QT_IQ4_XS>(a, s, err);                                     \
    default: return g5_fail(err, G5_ERR_INTERNAL, #fn ": type %u slipped through", type);     \
    }

extern "C" g5_status cuk_gemv(const cuk_gemv_args *a, cuk_stream stream, g5_error *err) {
    if (!a) return BAD("gemv: args is NULL");
    g5_status st = check_weights("gemv", a->w_type, a->w, "w", a->k, a->m, 1, err);
    if (st != G5_OK) return st;
    if (a->n < 1 || a->n > CUK_GEMV_MAX_N)
        return BAD("gemv: n=%d outside 1..%d", (int)a->n, CUK_GEMV_MAX_N);
    st = check_act("gemv", a->x, "x", a->x_type, a->ldx, "ldx", a->k, err);
    if (st != G5_OK) return st;
    if (!a->y) return BAD("gemv: y is NULL");
    if (a->ldy < a->m) return BAD("gemv: ldy=%lld < m=%lld", (long long)a->ldy, (long long)a->m);
    int done = 0;
    TRY_TC(gemv_run, a->w_type, a->m * a->k, false, a, (cudaStream_t)stream, &done, err);
    if (cuk::lowbit_handles(a->w_type)) return cuk::lowbit_gemv(a, (cudaStream_t)stream, err);
    DISPATCH(gemv_run, a->w_type, a, (cudaStream_t)stream, err)
}

/* Routing operands shared by the MoE launchers. */
static g5_status check_route(const char *what, int32_t n_expert, const int32_t *ids, int32_t top_k,
                             int64_t ld_ids, int32_t n_tok, g5_error *err) {
    if (n_expert < 1) return BAD("%s: n_expert=%d must be positive", what, (int)n_expert);
    if (!ids) return BAD("%s: ids is NULL", what);
    if (top_k < 1 || top_k > n_expert)
        return BAD("%s: top_k=%d outside 1..n_expert=%d", what, (int)top_k, (int)n_expert);
    if (top_k > 65535) return BAD("%s: top_k=%d exceeds 65535", what, (int)top_k);
    if (ld_ids < top_k) return BAD("%s: ld_ids=%lld < top_k=%d", what, (long long)ld_ids, (int)top_k);
    if (n_tok < 1 || n_tok > 65535) return BAD("%s: n_tok=%d outside 1..65535", what, (int)n_tok);
    return G5_OK;
}

extern "C" g5_status cuk_moe_gate_up(const cuk_moe_gate_up_args *a, cuk_stream stream,
                                     g5_error *err) {
    if (!a) return BAD("moe_gate_up: args is NULL");
    g5_status st = check_weights("moe_gate_up", a->w_type, a->w_gate, "w_gate", a->k, a->m,
                                 a->n_expert > 0 ? a->n_expert : 1, err);
    if (st != G5_OK) return st;
    st = check_weights("moe_gate_up", a->w_type, a->w_up, "w_up", a->k, a->m,
                       a->n_expert > 0 ? a->n_expert : 1, err);
    if (st != G5_OK) return st;
    st = check_route("moe_gate_up", a->n_expert, a->ids, a->top_k, a->ld_ids, a->n_tok, err);
    if (st != G5_OK) return st;
    st = check_act("moe_gate_up", a->x, "x", a->x_type, a->ldx, "ldx", a->k, err);
    if (st != G5_OK) return st;
    if (!a->out) return BAD("moe_gate_up: out is NULL");
    if (a->ldo < a->m) return BAD("moe_gate_up: ldo=%lld < m=%lld", (long long)a->ldo, (long long)a->m);
    if (!a->plan) return BAD("moe_gate_up: plan is NULL");
    if ((int64_t)a->n_tok * a->top_k > CUK_MOE_PLAN_MAX_PAIRS)
        return BAD("moe_gate_up: n_tok=%d x top_k=%d pairs exceed %d", (int)a->n_tok, (int)a->top_k, CUK_MOE_PLAN_MAX_PAIRS);
    int done = 0;
    TRY_TC(gate_up_run, a->w_type, a->m * a->k, true, a, (cudaStream_t)stream, &done, err);
    if (cuk::lowbit_handles(a->w_type)) return cuk::lowbit_gate_up(a, (cudaStream_t)stream, err);
    DISPATCH(gate_up_run, a->w_type, a, (cudaStream_t)stream, err)
}

extern "C" g5_status cuk_moe_down(const cuk_moe_down_args *a, cuk_stream stream, g5_error *err) {
    if (!a) return BAD("moe_down: args is NULL");
    g5_status st = check_weights("moe_down", a->w_type, a->w, "w", a->k, a->m,
                                 a->n_expert > 0 ? a->n_expert : 1, err);
    if (st != G5_OK) return st;
    st = check_route("moe_down", a->n_expert, a->ids, a->top_k, a->ld_ids, a->n_tok, err);
    if (st != G5_OK) return st;
    if (!a->wts) return BAD("moe_down: wts is NULL");
    if (a->ld_wts < a->top_k)
        return BAD("moe_down: ld_wts=%lld < top_k=%d", (long long)a->ld_wts, (int)a->top_k);
    st = check_act("moe_down", a->h, "h", a->h_type, a->ldh, "ldh", a->k, err);
    if (st != G5_OK) return st;
    if (!a->y) return BAD("moe_down: y is NULL");
    if (a->ldy < a->m) return BAD("moe_down: ldy=%lld < m=%lld", (long long)a->ldy, (long long)a->m);
    if (!a->plan) return BAD("moe_down: plan is NULL");
    if ((int64_t)a->n_tok * a->top_k > CUK_MOE_PLAN_MAX_PAIRS)
        return BAD("moe_down: n_tok=%d x top_k=%d pairs exceed %d", (int)a->n_tok, (int)a->top_k, CUK_MOE_PLAN_MAX_PAIRS);
    if (!cuk::lowbit_handles(a->w_type)) {
        if (!a->part) return BAD("moe_down: part is NULL");
        if (a->ldp < a->m) return BAD("moe_down: ldp=%lld < m=%lld", (long long)a->ldp, (long long)a->m);
    }
    int done = 0;
    TRY_TC(down_run, a->w_type, a->m * a->k, true, a, (cudaStream_t)stream, &done, err);
    if (cuk::lowbit_handles(a->w_type)) return cuk::lowbit_down(a, (cudaStream_t)stream, err);
    DISPATCH(down_run, a->w_type, a, (cudaStream_t)stream, err)
}
