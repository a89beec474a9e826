/* The exact int8 form of kv_b (cuda/cuk_model.h, cuk_kvb_exact): decode's W_UK and W_UV read
 * int8 values and float32 scales instead of the float32 kv_b, each weight formed by the one
 * rounded product the CPU's dequantization makes, so the kernels that read it give the bits of
 * the float32 ones. Built once at load from attn_k_b / attn_v_b and proved against kv_b there. */
#include <stdint.h>

#include "cuda/cuk_internal.cuh"
#include "cuda/cuk_model.h"
#include "cuda/deq_sub.h"
#include "format/quant.h"

#define BAD(...) g5_fail(err, G5_ERR_INVALID_ARG, __VA_ARGS__)

namespace {

/* grid over the 32-element sub-blocks of attn_k_b (nk of them, column c fastest, so the byte
 * and scale stores of a warp are contiguous) and then of attn_v_b; one thread each. It decodes
 * its sub-block's integers and two scales (deq_sub_i8), stores them in kv_b's order and counts
 * the elements whose product differs from kv_b's float bit for bit. */
__global__ void k_kvb_exact(cuk_kvb_exact_args a, int64_t k_row_bytes, int kbb, int kbe, int64_t v_row_bytes,
                            int vbb, int vbe, int64_t nk, int64_t nv, unsigned long long *n_bad) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= nk + nv) return;
    const int KL = a.kv_lora, HR = a.nope + a.v;
    float sc[2];
    int8_t q[32];
    unsigned bad = 0;
    if (t < nk) { /* W_UK: attn_k_b row h * KL + c is column c of W_UK[h]; sub-block sb runs down it */
        const int c = (int)(t % KL), sb = (int)(t / KL % (a.nope / 32)), h = (int)(t / KL / (a.nope / 32));
        const uint8_t *row = (const uint8_t *)a.k_b + ((int64_t)h * KL + c) * k_row_bytes;
        deq_sub_i8(a.k_type, row + (int64_t)(32 * sb / kbe) * kbb, sb % (kbe / 32), sc, q);
        for (int g = 0; g < 2; g++) a.ksk[((int64_t)h * (a.nope / 16) + 2 * sb + g) * KL + c] = sc[g];
        for (int l = 0; l < 32; l++) {
            const int64_t e = ((int64_t)h * HR + 32 * sb + l) * KL + c;
            a.kq[e] = q[l];
            bad += __float_as_uint(__fmul_rn(sc[l / 16], (float)q[l])) != __float_as_uint(a.kvb[e]);
        }
    } else { /* W_UV: attn_v_b row h * v + j is row j of W_UV[h]; sub-block sb runs along it */
        const int64_t u = t - nk;
        const int sb = (int)(u % (KL / 32)), j = (int)(u / (KL / 32) % a.v), h = (int)(u / (KL / 32) / a.v);
        const uint8_t *row = (const uint8_t *)a.v_b + ((int64_t)h * a.v + j) * v_row_bytes;
        deq_sub_i8(a.v_type, row + (int64_t)(32 * sb / vbe) * vbb, sb % (vbe / 32), sc, q);
        for (int g = 0; g < 2; g++) a.ksv[((int64_t)h * a.v + j) * (KL / 16) + 2 * sb + g] = sc[g];
        for (int l = 0; l < 32; l++) {
            const int64_t e = ((int64_t)h * HR + a.nope + j) * KL + 32 * sb + l;
            a.kq[e] = q[l];
            bad += __float_as_uint(__fmul_rn(sc[l / 16], (float)q[l])) != __float_as_uint(a.kvb[e]);
        }
    }
    if (bad) atomicAdd(n_bad, (unsigned long long)bad);
}

} // namespace

/* format's list of the types (tests/test_deq_sub.c checks that deq_sub_i8 takes exactly those) */
extern "C" int cuk_kvb_exact_takes(uint32_t type) { return quant_exact_i8(type); }

extern "C" g5_status cuk_kvb_exact(const cuk_kvb_exact_args *a, cuk_stream stream, uint64_t *n_bad, g5_error *err) {
    if (!a || !n_bad) return BAD("kvb_exact: no args");
    if (!a->k_b || !a->v_b || !a->kvb || !a->kq || !a->ksk || !a->ksv) return BAD("kvb_exact: NULL pointer");
    if (!cuk_kvb_exact_takes(a->k_type) || !cuk_kvb_exact_takes(a->v_type))
        return BAD("kvb_exact: types %s / %s have no exact int8 form", quant_type_name(a->k_type),
                   quant_type_name(a->v_type));
    const quant_type_info *kt = quant_type_get(a->k_type), *vt = quant_type_get(a->v_type);
    const int kbe = (int)kt->block_elems, vbe = (int)vt->block_elems;
    if (a->n_head < 1 || a->v < 1 || a->nope < 32 || a->kv_lora < 32 || a->nope % 32 || a->kv_lora % 32 ||
        a->nope % kbe || a->kv_lora % vbe || a->nope > 4096 || a->v > 4096 || a->kv_lora > 4096 || a->n_head > 65536)
        return BAD("kvb_exact: n_head=%d nope=%d v=%d kv_lora=%d (%s / %s blocks)", a->n_head, a->nope, a->v,
                   a->kv_lora, kt->name, vt->name);
    const int64_t nk = (int64_t)a->n_head * a->kv_lora * (a->nope / 32);
    const int64_t nv = (int64_t)a->n_head * a->v * (a->kv_lora / 32);
    unsigned long long *d_bad = NULL;
    CUK_CHECK(cudaMalloc((void **)&d_bad, sizeof *d_bad));
    unsigned long long h_bad = 0;
    cudaError_t e = cudaMemsetAsync(d_bad, 0, sizeof *d_bad, (cudaStream_t)stream);
    if (e == cudaSuccess) {
        k_kvb_exact<<<(unsigned)((nk + nv + 255) / 256), 256, 0, (cudaStream_t)stream>>>(
            *a, (int64_t)(a->nope / kbe) * kt->block_bytes, (int)kt->block_bytes, kbe,
            (int64_t)(a->kv_lora / vbe) * vt->block_bytes, (int)vt->block_bytes, vbe, nk, nv, d_bad);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess) e = cudaMemcpyAsync(&h_bad, d_bad, sizeof h_bad, cudaMemcpyDeviceToHost, (cudaStream_t)stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize((cudaStream_t)stream);
    cudaFree(d_bad);
    CUK_CHECK(e);
    *n_bad = h_bad;
    return G5_OK;
}
