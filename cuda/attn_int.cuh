/* Internal to cuda/: what the decode attention launchers of attn.cu share with fast mode's
 * tensor-core decode kernel (attn_dec.cu): one launch's operands and the key range of a token. */
#ifndef G5_CUDA_ATTN_INT_CUH
#define G5_CUDA_ATTN_INT_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/cuk_model.h"

/* The NaN a row gets when its token's positions or counts are invalid */
__device__ __forceinline__ float nanf_() { return __int_as_float(0x7fc00000); }

struct ac_args {
    cuk_mla_dims d;
    const float *q, *qlat; /* [n_tok][n_head][nope + rope], [n_tok][n_head][kv_lora] */
    const void *lat;       /* [n_pos][kv_lora + rope] of the cache type */
    const float *fresh;    /* [n_pos - fresh0][kv_lora + rope] or NULL */
    int64_t fresh0, n_pos; /* fresh0 = n_pos without fresh rows */
    const int32_t *dpos;   /* non-NULL: fresh0 and n_pos from *dpos (dev_range), at most bound */
    int64_t bound;
    const int32_t *sel;    /* [n_tok][ld_sel], or NULL: every key 0 .. n_pos - 1 */
    int64_t ld_sel;
    const int32_t *n_sel;  /* [n_tok] (with sel) */
    int32_t max_sel;
    float scale;
    float *out;            /* [n_tok][n_head][kv_lora] */
    const cuk_seq_row *rows; /* non-NULL: token t's cache, position and fresh row from rows[t] (multi) */
};

/* Where token t of a launch reads its keys: positions < fresh0 from the cache lat, fresh0 ..
 * n_pos - 1 from the float32 rows fresh (NULL: none). ok false: the position read from the
 * device (a graph step's *dpos, or rows[t]) is out of range, and the token's row is NaN. */
struct ac_range {
    const void *lat;
    const float *fresh;
    int64_t fresh0, n_pos;
    bool ok;
};

/* From the host's values; a graph step (dpos): n_pos = *dpos + n_tok, fresh rows the call's own
 * tokens from *dpos on, *dpos within [0, bound - n_tok]; several sequences (rows): token t's
 * cache, keys 0 .. rows[t].pos, its fresh row t standing for rows[t].pos. */
__device__ __forceinline__ ac_range ac_token_range(const ac_args &a, int t, int kvw) {
    ac_range r = {a.lat, a.fresh, a.fresh0, a.n_pos, true};
    if (a.dpos) {
        const int64_t p = *a.dpos;
        r.n_pos = p + a.d.n_tok;
        r.fresh0 = a.fresh ? p : r.n_pos;
        r.ok = p >= 0 && p + a.d.n_tok <= a.bound;
    }
    if (a.rows) {
        const cuk_seq_row rw = a.rows[t];
        r.ok = rw.pos >= 0 && rw.pos < a.bound && rw.pos < rw.cap && rw.lat;
        r.n_pos = (int64_t)rw.pos + 1;
        r.fresh0 = a.fresh ? (int64_t)rw.pos : r.n_pos;
        if (a.fresh) r.fresh = a.fresh + (int64_t)t * kvw;
        r.lat = rw.lat;
    }
    return r;
}

/* How many keys token t attends: n_sel[t], or without a list every key up to its position (a
 * sequence's n_tok tokens are its last positions; with rows each token is its own sequence's
 * last); more than max_sel counts as max_sel + 1: a NaN row, as an n_sel[t] past max_sel gives */
__device__ __forceinline__ int ac_n_sel(const ac_args &a, int t, const ac_range &r) {
    if (a.sel) return a.n_sel[t];
    const int64_t seen = a.rows ? r.n_pos : r.n_pos - (a.d.n_tok - 1 - t);
    return (int)min(seen, (int64_t)a.max_sel + 1);
}

/* Fast mode's decode attention on the tensor cores (attn_dec.cu): cuk_mla_attend's result for
 * the launch a (any of its three forms), fp16 products. mla_dec_fits: 1 if it covers the shape
 * and cache type on the current device (kv_lora 512, rope 64, a 16-bit cache, its shared memory);
 * the launchers ask it before mla_dec_run, which does not ask again. */
int mla_dec_fits(const cuk_mla_dims *d, uint32_t lat_type);
g5_status mla_dec_run(const ac_args &a, uint32_t lat_type, cudaStream_t st, g5_error *err);

#endif
