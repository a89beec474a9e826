/* Internals of the engine (engine.h) shared by its CPU implementation (engine.c) and its GPU one
 * (engine_gpu.c). Not a public interface. */
#ifndef G5_RT_ENGINE_INT_H
#define G5_RT_ENGINE_INT_H

#include "runtime/engine.h"

/* A device's implementation of the engine's calls. */
typedef struct rt_eng_ops {
    g5_status (*create)(rt_eng *e, g5_error *err); /* rt_eng_load: e->m is there; sets e->dev */
    void (*destroy)(rt_eng *e);
    void (*describe)(const rt_eng *e, char *buf, size_t cap);
    uint64_t (*load_bytes)(const rt_eng *e);
    uint64_t (*seq_bytes)(const rt_eng *e, uint32_t positions);
    int (*check_result)(const rt_eng *e, rt_eng_check_result *out);
    g5_status (*seq_create)(rt_eng_seq *s, uint32_t reserve, g5_error *err); /* sets s->dev */
    void (*seq_free)(rt_eng_seq *s);
    void (*seq_reset)(rt_eng_seq *s);
    uint32_t (*n_past)(const rt_eng_seq *s);
    uint32_t (*mtp_n_past)(const rt_eng_seq *s);
    g5_status (*reserve)(rt_eng_seq *s, uint32_t n_tokens, g5_error *err);
    uint32_t (*n_blocks)(const rt_eng_seq *s);
    g5_status (*truncate)(rt_eng_seq *s, uint32_t n_past, uint32_t mtp_n_past, g5_error *err);
    g5_status (*prefill)(rt_eng_seq *s, const int32_t *tokens, uint32_t n, const rt_eng_out *out, g5_error *err);
    g5_status (*decode)(rt_eng *e, rt_eng_seq *const *seqs, const int32_t *tokens, uint32_t n_seq, float *logits,
                        g5_error *err);
    /* NULL: rt_eng_decode_argmax takes the argmax of decode's logits on the host */
    g5_status (*decode_argmax)(rt_eng *e, rt_eng_seq *const *seqs, const int32_t *tokens, uint32_t n_seq,
                               int32_t *ids, float *logit, g5_error *err);
    /* NULL: rt_eng_decode_draw draws from decode's logits on the host (samp_device_draw);
     * draws_on_device says whether this engine's draws run on its device */
    g5_status (*decode_draw)(rt_eng *e, rt_eng_seq *const *seqs, const int32_t *tokens, uint32_t n_seq,
                             const samp_dev_row *rows, int32_t *ids, g5_error *err);
    int (*draws_on_device)(const rt_eng *e);
    /* NULL: rt_eng_decode_rows runs one prefill call per sequence */
    g5_status (*decode_rows)(rt_eng *e, rt_eng_seq *const *seqs, const uint32_t *n_tok, uint32_t n_seq,
                             const int32_t *tokens, const rt_eng_out *out, g5_error *err);
    g5_status (*mtp)(rt_eng_seq *s, const float *hidden, const int32_t *next, uint32_t n, float *draft, int all,
                     g5_error *err);
    /* NULL: rt_eng_mtp_rows runs one mtp call per sequence */
    g5_status (*mtp_rows)(rt_eng *e, rt_eng_seq *const *seqs, const uint32_t *n_tok, uint32_t n_seq,
                          const float *hidden, const int32_t *next, float *draft, g5_error *err);
    /* prefix caching (engine.h); NULL: the CPU pool's (engine.c) */
    g5_status (*attach)(rt_eng_seq *s, const int32_t *tokens, uint32_t n, uint32_t *n_reused, g5_error *err);
    g5_status (*publish)(rt_eng_seq *s, const int32_t *tokens, g5_error *err);
    void (*prefix_info)(const rt_eng *e, rt_eng_prefix_info *out);
    /* rt_eng_host_alloc / _free; NULL: malloc / free */
    void *(*host_alloc)(size_t bytes);
    void (*host_free)(void *p);
} rt_eng_ops;

struct rt_eng {
    rt_eng_opts o;
    const rt_wset *ws;
    rt_wset *own_ws;             /* rt_eng_open's */
    rt_model *m;                 /* the CPU model (the reference, and the GPU's tensor table) */
    rt_kvpool *pool;             /* CPU, opts.kv_blocks */
    rt_state **states;           /* CPU: [cap_states] decode step scratch */
    uint32_t cap_states;
    const rt_eng_ops *ops;
    void *dev;                   /* the device model's context (CUDA: engine_gpu.c's) */
    int loaded;                  /* rt_eng_load succeeded */
};

struct rt_eng_seq {
    rt_eng *e;
    void *dev;                   /* CPU: rt_state; CUDA: rt_gpu_seq */
    int def;                     /* CUDA: the GPU model's default sequence (--check runs on it) */
    uint32_t n_exact;            /* CUDA: positions [0, n_exact) hold what block-aligned calls from
                                    position 0 write (engine.h, prefix caching): what may be published */
    /* CUDA with opts.kv_prefix_hidden: the final-normed hidden states of positions [0, n_hid)
     * ([hid_cap][n_embd], host), which the prefill calls record and the prefix store keeps */
    float *hid;
    uint32_t n_hid, hid_cap;
};

/* rt_eng_decode_rows as one prefill call per sequence (all or nothing) and rt_eng_mtp_rows as one
 * mtp call per sequence: the CPU's way, and the GPU's where --check follows the calls. */
g5_status rt_eng_decode_rows_each(rt_eng *e, rt_eng_seq *const *seqs, const uint32_t *n_tok, uint32_t n_seq,
                                  const int32_t *tokens, const rt_eng_out *out, g5_error *err);
g5_status rt_eng_mtp_rows_each(rt_eng *e, rt_eng_seq *const *seqs, const uint32_t *n_tok, uint32_t n_seq,
                               const float *hidden, const int32_t *next, float *draft, g5_error *err);

/* engine_gpu.c: the CUDA implementation; NULL in a build without CUDA. */
const rt_eng_ops *rt_eng_gpu_ops(void);

#endif
