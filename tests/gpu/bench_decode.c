/* GLM-5 decode and prefill on one GPU at the shapes of one rank of a TP 8 deployment (issue 6,
 * benchmarks 3 and 4: bench/decode.sh, bench/prefill.sh).
 *
 * The model. A real rank blob of GLM-5 at T = 8 is ~60 GB: no synthetic GGUF + convert fits the
 * device's disk. So the rank is built in memory, from synthetic data, with exactly the per-rank
 * shapes and types the converter writes: the tensor list and types come from `synth --preset
 * glm5` (convert/synth.c: the UD-Q4_K_XL type per role), run through the converter's own
 * sharding plan (shard_plan_build at T = 8, kv_b F32, its default) over a header-only image of
 * that GGUF; rank 0's local shapes and types are taken from the plan. They are served as a TP 1
 * "rank-0-equivalent" model whose hyperparameters are the per-rank sizes (heads, dense FFN rows,
 * expert rows, vocabulary rows of lm_head all divided by 8, read from the plan), so the replicated
 * tensors (q_a, kv_a, the indexer, router, norms) keep their full size, as on a rank. Every
 * local shape is checked against what the equivalent hyperparameters expect; one cannot be
 * reproduced: token_embd (replicated, 154880 rows on a rank) gets the equivalent vocabulary's
 * rows, which changes memory but not the bytes a step reads (one row). The NextN/MTP block is left
 * out (the GPU path does not run it). The program prints all of this.
 *
 * Weights: random but valid blocks (quant_fill_random, Q4_K/Q5_K centred by quant_centre_blocks;
 * norms near 1, float matrices ~1/sqrt(k); kv_b rebuilt from attn_k_b / attn_v_b as the
 * converter writes it, so decode reads kv_b's exact int8 form as with a real blob) filled by all
 * cores into one host mapping, each tensor in a range of its own (the GPU model's
 * copy path then gives each tensor its own device memory: nothing shares a device range, so no
 * small matrix is read from L2 across layers), pinned when cudaHostRegister allows, then
 * rt_wset_from_tables -> rt_model_create -> rt_gpu_model_create (blobs NULL).
 *
 * Decode (--decode): for precise and fast mode, CUDA graphs off and on, and each context length,
 * the caches are filled with random finite values up to the context (rt_gpu_debug_set_context:
 * running a 32k prefill would take too long), then decode steps are timed one by one (wall time
 * of rt_gpu_forward with last-token logits, which synchronizes). Collectives are NOT run: a TP 1
 * rank has none (the residual adds after them are included); a TP 8 step adds 2 x n_layers
 * all-reduces of n_embd floats and a logits gather. The step time is compared with the bytes the
 * step must read (all weights a token touches: attention, indexer, router, dense FFN or shared
 * expert, the chosen experts' slices, lm_head, norms, one embedding row; the latent rows of the
 * selected keys and all indexer keys of every layer; the indexer scores; at most idx_top_k keys,
 * where every key is selected without a score, no indexer keys or scores, which the runtime does
 * not read there, nor the indexer's query and weight projections, whose outputs nothing then
 * needs and the runtime no longer computes), computed from the tensors' nbytes, divided by the
 * HBM rate of a device-to-device cudaMemcpy measured in the same run, counted as bytes read +
 * bytes written per second (the DRAM traffic rate; the ratio's denominator). Also printed: the
 * copy's read half, and a read-only rate (cublasSasum over the same buffer). Per-stage times come
 * from rt_gpu_debug_stage_times (CUDA events around every stage of a re-run of the last step),
 * and at the first context of the list, once per mode, rt_gpu_debug_profile's table: every
 * sub-step (each GEMV, norm, router, expert kernel, ...) in microseconds, launched one by one and
 * inside a CUDA graph, with the MB each occurrence reads and its graph time over those bytes at
 * the measured copy rate.
 *
 * Prefill (--prefill): tokens/s for a 4096-token prompt through rt_gpu_forward, once per product
 * path (--gemm: the GEMV kernels; the prefill GEMM path with f32, f16 compute; "default":
 * the mode's own, f16 for fast), each on a fresh GPU model: a probe of 256 tokens
 * first, then the prompt in --chunk calls (if the probe says the whole would take longer than
 * --prefill-cap seconds: chunks of 512 until the cap, the rate extrapolated). Which path really
 * ran is read from rt_gpu_info's GEMM counters. Also: the per-stage split (a re-run of the last
 * call) and the weight-product FLOP rate against cuBLAS bf16 GEMMs (cublasGemmEx, bf16 in,
 * float32 compute) of the same shapes measured in the same run.
 *
 * --prefill-profile: --prefill plus rt_gpu_debug_profile of each variant's last call (sub-steps
 * and the class table against the shape-matched cuBLAS rate). --prefill-scan: --prefill plus
 * rt_gpu_debug_scan of each variant's last call (magnitudes per layer, the first non-finite).
 *
 * --plan-only stops after the tables and the byte accounting (no weights allocated).
 * --cpu-dry-run builds the tables and the CPU model only (no CUDA call), prints the byte
 * accounting and runs one token through the CPU reference (logits finite): the check that the
 * construction is sound, runnable without a GPU (use --layers 4).
 *
 * Usage: bench_decode [--decode] [--prefill] [--prefill-profile] [--prefill-scan]
 *        [--cpu-dry-run] [--plan-only] [--layers N]
 *        [--ctx 1024,8192,32768]
 *        [--steps N] [--warmup N] [--modes precise,fast] [--graph off,on] [--prefill-tokens N]
 *        [--chunk N] [--prefill-cap S] [--prefill-mode precise|fast] [--gemm gemv,f32,f16,default]
 *        [--threads N] [--seed S] */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "convert/shard.h"
#include "cuda/cuk.h"
#include "convert/synth.h"
#include "format/gguf.h"
#include "format/gguf_write.h"
#include "format/glm5.h"
#include "format/quant.h"
#include "runtime/gpu/gpu_model.h"
#include "runtime/cpu/model.h"
#include "runtime/cpu/weights.h"

#define TP 8
#define MAX_CTX 8

#include "tests/gpu/bench_util.h"
/* A cuBLAS call (cuda/cuk_check.h's family). */
static inline int cublas_ok(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }
#define CB(call) CUK_TRY_OR_(cublasStatus_t, call, cublas_ok, cublasGetStatusString, exit(1))

typedef struct opts {
    int decode, prefill, dry, plan_only;
    int prefill_profile; /* --prefill-profile: rt_gpu_debug_profile of each variant's last call */
    int prefill_scan;    /* --prefill-scan: rt_gpu_debug_scan of each variant's last call */
    int64_t layers;
    uint32_t ctx[MAX_CTX], n_ctx;
    uint32_t steps, warmup;
    int mode_precise, mode_fast, graph_off, graph_on;
    uint32_t prefill_tokens, chunk;
    double prefill_cap;
    rt_gpu_precision prefill_prec;
    const char *gemm_list;       /* prefill variants: gemv, f32, f16, default */
    uint32_t threads;
    uint64_t seed;
} opts;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float unit(uint64_t *s) { /* [-1, 1) */
    return (float)((double)(splitmix(s) >> 11) / (double)(1ull << 52) - 1.0);
}

static uint64_t up4k(uint64_t b) { return (b + 4095) & ~(uint64_t)4095; }

static void *xcalloc(size_t n, size_t sz) {
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) {
        fprintf(stderr, "out of host memory\n");
        exit(2);
    }
    return p;
}

/* ---- the rank model ---- */

typedef struct rank_model {
    synth_plan *sp;              /* GLM-5 as synth writes it (global shapes, types per role) */
    gguf_ctx *smeta;             /* synth's metadata */
    uint8_t *smeta_img;
    uint8_t *src_map;            /* header-only image of the synthetic GGUF (data pages untouched) */
    uint64_t src_len;
    gguf_ctx *src;
    shard_plan *plan;            /* the converter's plan at T = 8 */
    uint8_t *meta_img;
    gguf_ctx *meta;              /* the rank-0-equivalent model's metadata */
    glm5_hparams hp;             /* its hyperparameters */
    rt_tensor *tab;              /* rank 0's tensors, as the equivalent model holds them */
    glm5_role *role;
    uint64_t n_tab;
    uint8_t *host;               /* all tensor data, each tensor at its own 4 KiB-aligned range */
    uint64_t host_bytes;
    int pinned;
    rt_wset *ws;
    rt_model *m;
    uint64_t rank_bytes_real;    /* what a real rank blob's tensors add up to (NextN included) */
} rank_model;

typedef struct fill_chunk {
    uint64_t t;                  /* tensor index */
    uint64_t off, len;           /* bytes of that tensor */
} fill_chunk;

typedef struct fill_ctx {
    const rank_model *R;
    fill_chunk *ch;
    uint64_t n_ch;
    uint64_t next;
    pthread_mutex_t mu;
    uint64_t seed;
    int failed;
} fill_ctx;

/* Float data as synth makes it: norms near 1, biases near 0, matrices ~ U(+-1/sqrt(k)). */
static void fill_float(const rt_tensor *t, glm5_role role, uint8_t *dst, uint64_t n, uint64_t *rng) {
    float center = 0.0f, spread = 1.0f / sqrtf((float)t->ne[0]);
    if (role == GLM5_ROLE_ROUTER_BIAS || role == GLM5_ROLE_IDX_K_NORM_BIAS) spread = 0.05f;
    else if (t->n_dims == 1) center = 1.0f, spread = 0.1f;
    for (uint64_t i = 0; i < n; i++) {
        const float v = center + spread * unit(rng);
        if (t->type == QT_F32) memcpy(dst + 4 * i, &v, 4);
        else if (t->type == QT_BF16) {
            const uint16_t b = quant_f32_to_bf16(v);
            memcpy(dst + 2 * i, &b, 2);
        } else {
            const uint16_t b = quant_f32_to_f16(v);
            memcpy(dst + 2 * i, &b, 2);
        }
    }
}

static void *fill_worker(void *arg) {
    fill_ctx *f = arg;
    for (;;) {
        pthread_mutex_lock(&f->mu);
        const uint64_t c = f->next++;
        pthread_mutex_unlock(&f->mu);
        if (c >= f->n_ch) break;
        const fill_chunk *k = &f->ch[c];
        const rt_tensor *t = &f->R->tab[k->t];
        uint8_t *dst = (uint8_t *)t->data + k->off;
        uint64_t rng = f->seed ^ (k->t * 0x9E3779B97F4A7C15ull) ^ (k->off * 0xD1B54A32D192ED03ull);
        splitmix(&rng);
        if (t->type == QT_F32 || t->type == QT_BF16 || t->type == QT_F16) {
            const uint64_t es = t->type == QT_F32 ? 4 : 2;
            fill_float(t, f->R->role[k->t], dst, k->len / es, &rng);
        } else {
            const quant_type_info *qi = quant_type_get(t->type);
            if (quant_fill_random(t->type, dst, k->len / qi->block_bytes, &rng) != G5_OK) f->failed = 1;
            if (quant_centre_blocks(t->type, dst, k->len / qi->block_bytes) != G5_OK) f->failed = 1;
        }
    }
    return NULL;
}

/* Fills every tensor with n_threads threads, in chunks of whole blocks (<= 16 MiB). */
static double fill_host(rank_model *R, uint32_t n_threads, uint64_t seed) {
    const double t0 = now_s();
    uint64_t cap = 1024, n = 0;
    fill_chunk *ch = xcalloc(cap, sizeof *ch);
    for (uint64_t i = 0; i < R->n_tab; i++) {
        const rt_tensor *t = &R->tab[i];
        uint64_t unit_b = 4;
        const quant_type_info *qi = quant_type_get(t->type);
        if (qi && qi->block_bytes) unit_b = qi->block_bytes;
        const uint64_t step = (16u << 20) / unit_b * unit_b;
        for (uint64_t off = 0; off < t->nbytes; off += step) {
            if (n == cap) {
                cap *= 2;
                ch = realloc(ch, cap * sizeof *ch);
                if (!ch) exit(2);
            }
            ch[n++] = (fill_chunk){i, off, t->nbytes - off < step ? t->nbytes - off : step};
        }
    }
    fill_ctx f = {R, ch, n, 0, PTHREAD_MUTEX_INITIALIZER, seed, 0};
    pthread_t *th = xcalloc(n_threads, sizeof *th);
    uint32_t started = 0;
    for (; started + 1 < n_threads; started++)
        if (pthread_create(&th[started], NULL, fill_worker, &f) != 0) break;
    fill_worker(&f);
    for (uint32_t k = 0; k < started; k++) pthread_join(th[k], NULL);
    free(th);
    free(ch);
    if (f.failed) {
        fprintf(stderr, "quant_fill_random failed\n");
        exit(1);
    }
    return now_s() - t0;
}

/* kv_b rebuilt from its layer's attn_k_b / attn_v_b as the converter writes it (glm5_rebuild_kv_b).
 * With random kv_b bytes the loader's proof of kv_b's exact int8 form fails and decode reads the
 * float32 kv_b (4 bytes an element, not the 1.25 a real rank blob's step reads and the byte floor
 * counts). Returns the layers rebuilt. */
static uint32_t rebuild_kvb(rank_model *R) {
    const glm5_hparams *hp = &R->hp;
    const uint32_t NL = hp->n_layer_main;
    const rt_tensor **kb = xcalloc(NL, sizeof *kb), **vb = xcalloc(NL, sizeof *vb), **kv = xcalloc(NL, sizeof *kv);
    for (uint64_t i = 0; i < R->n_tab; i++) {
        unsigned l = 0;
        if (sscanf(R->tab[i].name, "blk.%u.", &l) != 1 || l >= NL) continue;
        if (R->role[i] == GLM5_ROLE_ATTN_K_B) kb[l] = &R->tab[i];
        if (R->role[i] == GLM5_ROLE_ATTN_V_B) vb[l] = &R->tab[i];
        if (R->role[i] == GLM5_ROLE_ATTN_KV_B) kv[l] = &R->tab[i];
    }
    const uint64_t KL = hp->kv_lora, rows = (uint64_t)hp->n_head * (hp->qk_nope + hp->v_head);
    float *scratch = xcalloc((hp->qk_nope > hp->v_head ? hp->qk_nope : hp->v_head) * KL, sizeof *scratch);
    uint32_t n = 0;
    for (uint32_t l = 0; l < NL; l++) {
        if (!kb[l] || !vb[l] || !kv[l] || kv[l]->type != QT_F32 || kv[l]->nbytes != rows * KL * 4) continue;
        gguf_tensor t[2];
        const rt_tensor *src[2] = {kb[l], vb[l]};
        for (int k = 0; k < 2; k++) {
            t[k] = (gguf_tensor){.name = src[k]->name, .type = src[k]->type, .n_dims = src[k]->n_dims,
                                 .nbytes = src[k]->nbytes, .data = src[k]->data};
            memcpy(t[k].ne, src[k]->ne, sizeof t[k].ne);
            t[k].n_elems = t[k].ne[0] * t[k].ne[1] * t[k].ne[2] * t[k].ne[3];
        }
        GK(glm5_rebuild_kv_b(hp, &t[0], &t[1], 0, hp->n_head, (float *)(uintptr_t)kv[l]->data, scratch, &err_));
        n++;
    }
    free(scratch);
    free(kb), free(vb), free(kv);
    return n;
}

static const shard_tensor *plan_find(const shard_plan *p, const char *name) {
    for (uint64_t i = 0; i < p->n_tensors; i++)
        if (strcmp(p->tensors[i].name, name) == 0) return &p->tensors[i];
    return NULL;
}

static void fmt_ne(char *b, size_t cap, uint32_t nd, const uint64_t *ne) {
    int w = snprintf(b, cap, "{");
    for (uint32_t d = 0; d < nd; d++)
        w += snprintf(b + w, cap - (size_t)w, "%s%llu", d ? ", " : "", (unsigned long long)ne[d]);
    snprintf(b + w, cap - (size_t)w, "}");
}

/* The header-only synthetic GGUF, the plan, the equivalent metadata and the tensor table. */
static void build_tables(rank_model *R, const opts *o) {
    synth_opts so;
    synth_opts_init(&so);
    so.preset = SYNTH_PRESET_GLM5;
    so.n_layers = o->layers;
    GK(synth_plan_build(&so, &R->sp, &err_));
    uint64_t mlen = 0;
    GK(synth_metadata_image(&so, &R->smeta_img, &mlen, &err_));
    GK(gguf_parse_buffer(R->smeta_img, mlen, "synth-metadata", &R->smeta, &err_));

    /* The synthetic GGUF's header with the data section left as untouched anonymous pages
     * (hundreds of GB of address space at full depth, no memory): the plan reads no data. */
    gguf_writer *w = gguf_writer_create();
    if (!w) exit(2);
    for (int64_t i = 0; i < gguf_get_n_kv(R->smeta); i++) GK(gguf_writer_copy_kv(w, R->smeta, i));
    for (uint64_t i = 0; i < R->sp->n_tensors; i++) {
        const synth_tensor_info *t = &R->sp->tensors[i];
        int64_t idx;
        GK(gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, NULL, &idx));
    }
    uint8_t *hdr = NULL;
    uint64_t hlen = 0, dsize = 0;
    GK(gguf_writer_header_bytes(w, &hdr, &hlen, &dsize));
    gguf_writer_free(w);
    R->src_len = hlen + dsize;
    R->src_map = mmap(NULL, R->src_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (R->src_map == MAP_FAILED) {
        perror("mmap (header-only GGUF image)");
        exit(1);
    }
    memcpy(R->src_map, hdr, hlen);
    free(hdr);
    GK(gguf_parse_buffer(R->src_map, R->src_len, "synth-glm5-header", &R->src, &err_));
    shard_options so8 = {TP, 0, QT_F32, 0};
    GK(shard_plan_build(R->src, &so8, &R->plan, &err_));
    const shard_plan *p = R->plan;
    const glm5_hparams *ghp = &p->hp;
    printf("source: synth --preset glm5 --layers %u: %llu tensors, %.1f GB; converter plan T=%u, kv_b F32: "
           "%.2f GB per rank blob\n",
           ghp->n_layer_main, (unsigned long long)R->sp->n_tensors, (double)R->sp->data_bytes / 1e9, p->tp,
           (double)p->data_size / 1e9);

    /* per-rank sizes from the plan's local shapes */
    const shard_tensor *qb = plan_find(p, "blk.0.attn_q_b.weight");
    const shard_tensor *head = plan_find(p, "output.weight");
    const shard_tensor *fg = NULL, *eg = NULL;
    char nm[96];
    for (uint32_t il = 0; il < ghp->n_layer_main && (!fg || !eg); il++) {
        snprintf(nm, sizeof nm, "blk.%u.ffn_gate.weight", il);
        if (!fg) fg = plan_find(p, nm);
        snprintf(nm, sizeof nm, "blk.%u.ffn_gate_exps.weight", il);
        if (!eg) eg = plan_find(p, nm);
    }
    if (!qb || !head || !eg) {
        fprintf(stderr, "plan lacks attn_q_b / output / ffn_gate_exps\n");
        exit(1);
    }
    const uint32_t H_l = (uint32_t)(qb->ne_local[1] / (ghp->qk_nope + ghp->qk_rope));
    const uint32_t ff_l = fg ? (uint32_t)fg->ne_local[1] : ghp->n_ff / TP;
    const uint32_t ffe_l = (uint32_t)eg->ne_local[1];
    const uint32_t V_l = (uint32_t)head->ne_local[1];

    w = gguf_writer_create();
    if (!w) exit(2);
    for (int64_t i = 0; i < gguf_get_n_kv(R->smeta); i++) {
        const char *k = gguf_get_key(R->smeta, i);
        if (strncmp(k, "tokenizer.", 10) == 0) continue; /* the bench feeds token ids */
        GK(gguf_writer_copy_kv(w, R->smeta, i));
    }
    GK(gguf_writer_set_u32(w, GLM5_ARCH ".block_count", ghp->n_layer_main));
    GK(gguf_writer_set_u32(w, GLM5_ARCH ".nextn_predict_layers", 0));
    GK(gguf_writer_set_u32(w, GLM5_ARCH ".attention.head_count", H_l));
    GK(gguf_writer_set_u32(w, GLM5_ARCH ".feed_forward_length", ff_l));
    GK(gguf_writer_set_u32(w, GLM5_ARCH ".expert_feed_forward_length", ffe_l));
    GK(gguf_writer_set_u32(w, GLM5_ARCH ".vocab_size", V_l));
    uint64_t ilen = 0;
    GK(gguf_writer_write_buffer(w, &R->meta_img, &ilen));
    gguf_writer_free(w);
    GK(gguf_parse_buffer(R->meta_img, ilen, "rank0-equivalent", &R->meta, &err_));
    GK(glm5_hparams_read(R->meta, &R->hp, &err_));
    printf("rank-0-equivalent TP1 model: heads %u (of %u), dense FFN %u (of %u), expert rows %u (of %u), "
           "lm_head rows %u (of %u); replicated at full size: q_a, kv_a, indexer (%u heads), router (%u experts), "
           "norms; %u main layers (%u dense)\n",
           H_l, ghp->n_head, ff_l, ghp->n_ff, ffe_l, ghp->n_ff_exp, V_l, ghp->n_vocab, R->hp.idx_n_head,
           R->hp.n_expert, R->hp.n_layer_main, R->hp.n_leading_dense);

    R->tab = xcalloc(p->n_tensors, sizeof *R->tab);
    R->role = xcalloc(p->n_tensors, sizeof *R->role);
    uint64_t n_exact = 0, n_left = 0, left_bytes = 0;
    for (uint64_t i = 0; i < p->n_tensors; i++) {
        const shard_tensor *st = &p->tensors[i];
        R->rank_bytes_real += st->local_bytes;
        if (st->layer >= (int32_t)ghp->n_layer_main) {
            n_left++;
            left_bytes += st->local_bytes;
            continue;
        }
        glm5_tensor_spec spec;
        GK(glm5_spec_for(&R->hp, st->name, &spec));
        rt_tensor *t = &R->tab[R->n_tab];
        t->name = st->name;
        t->type = st->type;
        t->n_dims = st->n_dims;
        memcpy(t->ne, st->ne_local, sizeof t->ne);
        t->nbytes = st->local_bytes;
        if (memcmp(spec.ne, st->ne_local, sizeof spec.ne) != 0) {
            char a[96], b[96];
            fmt_ne(a, sizeof a, st->n_dims, st->ne_local);
            fmt_ne(b, sizeof b, spec.n_dims, spec.ne);
            uint64_t rb = 0;
            GK(quant_row_bytes(st->type, spec.ne[0], &rb));
            memcpy(t->ne, spec.ne, sizeof t->ne);
            t->n_dims = spec.n_dims;
            t->nbytes = rb * spec.ne[1] * spec.ne[2] * spec.ne[3];
            printf("NOT REPRODUCED: %s is %s on a real rank (%s, %.1f MB), %s here (%.1f MB): the equivalent "
                   "model's vocabulary is the lm_head slice%s\n",
                   st->name, a, quant_type_name(st->type), (double)st->local_bytes / 1e6, b,
                   (double)t->nbytes / 1e6, spec.role == GLM5_ROLE_TOKEN_EMBD ? "; a step reads one row either way" : "");
        } else {
            n_exact++;
        }
        R->role[R->n_tab] = spec.role;
        R->n_tab++;
    }
    printf("tensors: %llu with exactly the converter's rank-0 shape and type; %llu NextN/MTP tensors (%.2f GB) "
           "left out (not run on the GPU)\n",
           (unsigned long long)n_exact, (unsigned long long)n_left, (double)left_bytes / 1e9);
}

static void build_host(rank_model *R, const opts *o) {
    R->host_bytes = 0;
    for (uint64_t i = 0; i < R->n_tab; i++) R->host_bytes += up4k(R->tab[i].nbytes);
    double t0 = now_s();
    R->host = mmap(NULL, R->host_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (R->host == MAP_FAILED) {
        perror("mmap (weights)");
        exit(1);
    }
    (void)madvise(R->host, R->host_bytes, MADV_HUGEPAGE); /* faster first touch; advisory */
    uint64_t off = 0;
    for (uint64_t i = 0; i < R->n_tab; i++) {
        R->tab[i].data = R->host + off;
        off += up4k(R->tab[i].nbytes);
    }
    const double fs = fill_host(R, o->threads, o->seed);
    printf("host weights: %.2f GB in %llu tensors filled by %u threads in %.1f s\n", (double)R->host_bytes / 1e9,
           (unsigned long long)R->n_tab, o->threads, fs);
    printf("kv_b rebuilt from attn_k_b / attn_v_b (the converter's form) in %u of %u layers\n", rebuild_kvb(R),
           R->hp.n_layer_main);
    (void)t0;
    const rt_tensor *tabs[1] = {R->tab};
    GK(rt_wset_from_tables(R->meta, 1, 0, tabs, &R->n_tab, &R->ws, &err_));
    rt_model_opts mo = {.n_threads = o->dry ? o->threads : 1};
    t0 = now_s();
    GK(rt_model_create(R->ws, &mo, &R->m, &err_));
    printf("rt_model_create: %.2f s\n", now_s() - t0);
}

static void pin_host(rank_model *R) {
    const double t0 = now_s();
    cudaError_t ce = cudaHostRegister(R->host, R->host_bytes, cudaHostRegisterDefault);
    R->pinned = ce == cudaSuccess;
    if (!R->pinned) (void)cudaGetLastError();
    printf("cudaHostRegister of the host weights: %s (%.1f s)\n", R->pinned ? "pinned" : cudaGetErrorString(ce),
           now_s() - t0);
}

static void free_rank(rank_model *R) {
    rt_model_free(R->m);
    rt_wset_free(R->ws);
    if (R->pinned) cudaHostUnregister(R->host);
    if (R->host && R->host != MAP_FAILED) munmap(R->host, R->host_bytes);
    free(R->tab);
    free(R->role);
    gguf_free(R->meta);
    free(R->meta_img);
    shard_plan_free(R->plan);
    gguf_free(R->src);
    if (R->src_map && R->src_map != MAP_FAILED) munmap(R->src_map, R->src_len);
    gguf_free(R->smeta);
    free(R->smeta_img);
    synth_plan_free(R->sp);
}

/* ---- bytes a decode step must read ---- */

typedef struct step_bytes {
    double attn, idx, router, dense, shexp, experts, head, norms, embd; /* weights */
    double lat, idxk, scores;                                          /* caches, scores */
    double weights, total;
} step_bytes;

static int is_norm(glm5_role r) {
    return r == GLM5_ROLE_OUTPUT_NORM || r == GLM5_ROLE_ATTN_NORM || r == GLM5_ROLE_ATTN_Q_A_NORM ||
           r == GLM5_ROLE_ATTN_KV_A_NORM || r == GLM5_ROLE_FFN_NORM;
}

/* P: positions the step attends (context + the step's own token); lat_es: latent element size. */
static step_bytes bytes_per_step(const rank_model *R, uint64_t P, uint64_t lat_es) {
    step_bytes b;
    memset(&b, 0, sizeof b);
    const glm5_hparams *hp = &R->hp;
    /* at most idx_top_k keys: every key is selected without a score, so the indexer's keys,
     * scores, query and weight projections are not needed */
    const int all_keys = P <= hp->idx_top_k;
    /* W_UK/W_UV: the decode step reads kv_b's exact int8 form (1.25 bytes per element of the
     * attn_k_b/attn_v_b the plan carries beside kv_b, converter 1.1) where both have one (this
     * model's layers are all of one mix), else the float32 kv_b, whatever type it is stored in */
    int kx = 0, vx = 0;
    for (uint64_t i = 0; i < R->n_tab; i++) {
        if (R->role[i] == GLM5_ROLE_ATTN_K_B) kx = quant_exact_i8(R->tab[i].type);
        if (R->role[i] == GLM5_ROLE_ATTN_V_B) vx = quant_exact_i8(R->tab[i].type);
    }
    const int exact = kx && vx;
    for (uint64_t i = 0; i < R->n_tab; i++) {
        const rt_tensor *t = &R->tab[i];
        double nb = (double)t->nbytes;
        if (R->role[i] == GLM5_ROLE_ATTN_K_B || R->role[i] == GLM5_ROLE_ATTN_V_B) {
            if (!exact) continue;
            nb = 1.25 * (double)t->ne[0] * (double)t->ne[1] * (double)(t->ne[2] ? t->ne[2] : 1);
        }
        if (R->role[i] == GLM5_ROLE_ATTN_KV_B) {
            if (exact) continue;
            nb = 4.0 * (double)t->ne[0] * (double)t->ne[1];
        }
        switch (R->role[i]) {
        case GLM5_ROLE_TOKEN_EMBD: b.embd += nb / (double)t->ne[1]; break;
        case GLM5_ROLE_OUTPUT: b.head += nb; break;
        case GLM5_ROLE_EXP_GATE: case GLM5_ROLE_EXP_UP: case GLM5_ROLE_EXP_DOWN:
            b.experts += nb / (double)t->ne[2] * hp->n_expert_used;
            break;
        case GLM5_ROLE_IDX_Q_B: case GLM5_ROLE_IDX_PROJ:
            if (!all_keys) b.idx += nb;
            break;
        case GLM5_ROLE_IDX_K: case GLM5_ROLE_IDX_K_NORM: case GLM5_ROLE_IDX_K_NORM_BIAS:
            b.idx += nb;
            break;
        case GLM5_ROLE_ROUTER: case GLM5_ROLE_ROUTER_BIAS: b.router += nb; break;
        case GLM5_ROLE_FFN_GATE: case GLM5_ROLE_FFN_UP: case GLM5_ROLE_FFN_DOWN: b.dense += nb; break;
        case GLM5_ROLE_SHEXP_GATE: case GLM5_ROLE_SHEXP_UP: case GLM5_ROLE_SHEXP_DOWN: b.shexp += nb; break;
        default:
            if (is_norm(R->role[i])) b.norms += nb;
            else b.attn += nb; /* q_a, q_b, kv_a, W_UK/W_UV, attn_output */
            break;
        }
    }
    const uint64_t LW = (uint64_t)hp->kv_lora + hp->qk_rope, K = hp->idx_top_k;
    for (uint32_t il = 0; il < hp->n_layer_main; il++) {
        b.lat += (double)(P < K ? P : K) * (double)(LW * lat_es);
        if (hp->idx_full[il] && !all_keys) {
            b.idxk += (double)P * hp->idx_head_dim * 4.0;
            b.scores += (double)P * 4.0;
        }
    }
    b.weights = b.attn + b.idx + b.router + b.dense + b.shexp + b.experts + b.head + b.norms + b.embd;
    b.total = b.weights + b.lat + b.idxk + b.scores;
    return b;
}

static void print_bytes(const char *what, const step_bytes *b) {
    printf("%s: %.4f GB = weights %.4f (attention %.4f, indexer %.4f, router %.4f, dense FFN %.4f, shared expert "
           "%.4f, 8 experts %.4f, lm_head %.4f, norms %.4f, embedding row %.6f) + latent rows %.4f + indexer keys "
           "%.4f + indexer scores %.4f\n",
           what, b->total / 1e9, b->weights / 1e9, b->attn / 1e9, b->idx / 1e9, b->router / 1e9, b->dense / 1e9,
           b->shexp / 1e9, b->experts / 1e9, b->head / 1e9, b->norms / 1e9, b->embd / 1e9, b->lat / 1e9,
           b->idxk / 1e9, b->scores / 1e9);
}

/* ---- HBM ceilings ---- */

typedef struct hbm {
    double copy_rw;              /* D2D cudaMemcpy: (read + written) bytes per second */
    double copy_read;            /* its read half */
    double asum_read;            /* cublasSasum: bytes read per second */
} hbm;

static hbm measure_hbm(cublasHandle_t cb) {
    const size_t B = (size_t)2 << 30;
    void *a = NULL, *b = NULL;
    float *res = NULL;
    CK(cudaMalloc(&a, B));
    CK(cudaMalloc(&b, B));
    CK(cudaMalloc((void **)&res, sizeof(float)));
    CK(cudaMemset(a, 0x3c, B)); /* small finite floats for asum */
    CK(cudaMemset(b, 0, B));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const int reps = 10;
    for (int i = 0; i < 2; i++) CK(cudaMemcpy(b, a, B, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e0, 0));
    for (int i = 0; i < reps; i++) CK(cudaMemcpyAsync(b, a, B, cudaMemcpyDeviceToDevice, 0));
    CK(cudaEventRecord(e1, 0));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    hbm h;
    h.copy_rw = 2.0 * (double)B * reps / (ms * 1e-3);
    h.copy_read = h.copy_rw / 2;
    CB(cublasSetStream(cb, 0));
    CB(cublasSetPointerMode(cb, CUBLAS_POINTER_MODE_DEVICE));
    const int n = (int)(B / sizeof(float));
    for (int i = 0; i < 2; i++) CB(cublasSasum(cb, n, a, 1, res));
    CK(cudaEventRecord(e0, 0));
    for (int i = 0; i < reps; i++) CB(cublasSasum(cb, n, a, 1, res));
    CK(cudaEventRecord(e1, 0));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    h.asum_read = (double)n * 4.0 * reps / (ms * 1e-3);
    CB(cublasSetPointerMode(cb, CUBLAS_POINTER_MODE_HOST));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    cudaFree(res);
    printf("HBM: D2D cudaMemcpy of %.2f GB: %.0f GB/s counted as read + written (DRAM traffic; the ratio below "
           "uses this), %.0f GB/s of it read; cublasSasum read-only: %.0f GB/s\n",
           (double)B / 1e9, h.copy_rw / 1e9, h.copy_read / 1e9, h.asum_read / 1e9);
    return h;
}

/* ---- the fused residual add + RMSNorm against its unfused form ---- */

/* cuk_add_rms_norm must give the bits of cuk_add (a + b), cuk_add into x, cuk_rms_norm: the
 * decode step's residual adds rely on it (bit-identical results with the fusion). Rows of
 * n_embd and a few wider/narrower ones, with and without the second addend. 0 if all equal. */
static int check_add_norm(uint32_t dim) {
    const uint32_t dims[] = {dim, 1000, 8192 + 4}, rows = 3;
    int bad = 0;
    for (int di = 0; di < 3; di++) {
        const uint32_t d = dims[di];
        const size_t cnt = (size_t)rows * d;
        float *h = xcalloc(cnt * 4 + d, sizeof(float));
        uint64_t rng = 1234 + d;
        for (size_t i = 0; i < cnt * 4 + d; i++) h[i] = unit(&rng) * (i % 7 ? 1.0f : 30.0f);
        float *x1, *x2, *a, *b, *w, *y1, *y2, *t;
        CK(cudaMalloc((void **)&x1, cnt * 4));
        CK(cudaMalloc((void **)&x2, cnt * 4));
        CK(cudaMalloc((void **)&a, cnt * 4));
        CK(cudaMalloc((void **)&b, cnt * 4));
        CK(cudaMalloc((void **)&y1, cnt * 4));
        CK(cudaMalloc((void **)&y2, cnt * 4));
        CK(cudaMalloc((void **)&t, cnt * 4));
        CK(cudaMalloc((void **)&w, (size_t)d * 4));
        CK(cudaMemcpy(a, h + cnt, cnt * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(b, h + 2 * cnt, cnt * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(w, h + 4 * cnt, (size_t)d * 4, cudaMemcpyHostToDevice));
        for (int two = 0; two < 2; two++) {
            CK(cudaMemcpy(x1, h, cnt * 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(x2, h, cnt * 4, cudaMemcpyHostToDevice));
            const float *add = a;
            if (two) {
                GK(cuk_add(a, b, t, (int64_t)cnt, NULL, &err_));
                add = t;
            }
            GK(cuk_add(x1, add, x1, (int64_t)cnt, NULL, &err_));
            GK(cuk_rms_norm(x1, d, w, y1, d, rows, d, 1e-5f, NULL, &err_));
            const cuk_add_rms_norm_args an = {x2, d, a, two ? b : NULL, d, w, y2, d, rows, d, 1e-5f};
            GK(cuk_add_rms_norm(&an, NULL, &err_));
            CK(cudaDeviceSynchronize());
            float *hx1 = xcalloc(cnt, 4), *hx2 = xcalloc(cnt, 4), *hy1 = xcalloc(cnt, 4), *hy2 = xcalloc(cnt, 4);
            CK(cudaMemcpy(hx1, x1, cnt * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hx2, x2, cnt * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hy1, y1, cnt * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hy2, y2, cnt * 4, cudaMemcpyDeviceToHost));
            const int eq = !memcmp(hx1, hx2, cnt * 4) && !memcmp(hy1, hy2, cnt * 4);
            if (!eq) {
                bad = 1;
                printf("FUSED ADD+NORM DIFFERS: dim %u, %s addend%s\n", d, two ? "two" : "one", two ? "s" : "");
            }
            free(hx1);
            free(hx2);
            free(hy1);
            free(hy2);
        }
        cudaFree(x1);
        cudaFree(x2);
        cudaFree(a);
        cudaFree(b);
        cudaFree(y1);
        cudaFree(y2);
        cudaFree(t);
        cudaFree(w);
        free(h);
    }
    printf("fused residual add + RMSNorm (cuk_add_rms_norm) vs cuk_add(s) + cuk_rms_norm: %s\n",
           bad ? "DIFFERENT" : "bit-identical (x and y; 3 widths, 1 and 2 addends)");
    return bad;
}

/* ---- decode ---- */

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int all_finite(const float *x, uint64_t n) {
    for (uint64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

static void print_stages(const char *pre, const rt_gpu_stage_times *s, const glm5_hparams *hp) {
    printf("%s stages (CUDA events around each stage of a re-run of the last call, %u token%s): embedding %.3f ms, "
           "attention+indexer %.3f ms (%.1f us/layer), dense FFN %.3f ms (%.1f us/layer), MoE %.3f ms (%.1f "
           "us/layer), collectives (the residual adds run inside the next norm) %.3f ms, final norm+lm_head %.3f ms; sum %.3f ms\n",
           pre, s->n_tok, s->n_tok == 1 ? "" : "s", s->embd_ms, s->attn_ms, 1e3 * s->attn_ms / hp->n_layer_main,
           s->dense_ms, hp->n_leading_dense ? 1e3 * s->dense_ms / hp->n_leading_dense : 0.0, s->moe_ms,
           1e3 * s->moe_ms / (hp->n_layer_main - hp->n_leading_dense), s->add_ms, s->head_ms, s->total_ms);
}

/* A decode step's stages with the bytes each must read (bytes_per_step's groups: attention with
 * the indexer, its norms, latent rows, indexer keys and scores; dense FFN; router, shared and
 * routed experts; final norm and lm_head; the embedding row), the time those bytes take at the
 * copy rate, and the stage's time over it. Norms are counted with the attention. */
static void print_stage_bytes(const rt_gpu_stage_times *s, const step_bytes *b, double copy_rw) {
    const struct { const char *name; double ms, bytes; } st[] = {
        {"embedding", s->embd_ms, b->embd},
        {"attention+indexer", s->attn_ms, b->attn + b->idx + b->norms + b->lat + b->idxk + b->scores},
        {"dense FFN", s->dense_ms, b->dense},
        {"MoE", s->moe_ms, b->router + b->shexp + b->experts},
        {"final norm+lm_head", s->head_ms, b->head},
    };
    printf("    stage                   time ms    must read MB   at copy rate ms   time / floor\n");
    for (size_t i = 0; i < sizeof st / sizeof st[0]; i++) {
        const double fl = st[i].bytes / copy_rw * 1e3;
        printf("    %-20s %10.3f %15.1f %17.4f %14.2f\n", st[i].name, st[i].ms, st[i].bytes / 1e6, fl,
               fl > 0 ? st[i].ms / fl : 0.0);
    }
}

static void run_decode(rank_model *R, const opts *o, const hbm *h) {
    const glm5_hparams *hp = &R->hp;
    const uint32_t V = hp->n_vocab;
    float *logits = xcalloc(V, sizeof(float));
    uint64_t rng = o->seed ^ 0xdec0de;
    printf("\n== decode: one rank of GLM-5 TP%u, %u main layers; collectives NOT run (1 GPU: a TP1-equivalent rank "
           "has none; a TP%u step adds %u all-reduces of %u floats + a logits gather, not timed here); residual adds "
           "included\n",
           TP, hp->n_layer_main, TP, 2 * hp->n_layer_main, hp->n_embd);
    for (int prec = 0; prec < 2; prec++) {
        if ((prec == 0 && !o->mode_precise) || (prec == 1 && !o->mode_fast)) continue;
        for (int gr = 0; gr < 2; gr++) {
            if ((gr == 0 && !o->graph_off) || (gr == 1 && !o->graph_on)) continue;
            rt_gpu_opts go;
            rt_gpu_opts_default(&go);
            go.precision = prec ? RT_GPU_FAST : RT_GPU_PRECISE;
            go.cuda_graph = gr;
            rt_gpu_model *g = NULL;
            const double t0 = now_s();
            GK(rt_gpu_model_create(R->m, &go, &g, &err_));
            const rt_gpu_info *in = rt_gpu_model_info(g);
            printf("-- %s (cache %s), cuda graph %s: model on %s in %.1f s (%.2f GB weights + %.2f GB float32 extras, "
                   "%.1f GB/s)\n",
                   in->precision, in->cache, gr ? "on" : "off", in->device_name, now_s() - t0,
                   (double)in->weight_bytes / 1e9, (double)in->extra_bytes / 1e9, in->load.gb_per_s);
            const uint64_t lat_es = strcmp(in->cache, "f32") == 0 ? 4 : 2;
            for (uint32_t c = 0; c < o->n_ctx; c++) {
                const uint32_t ctx = o->ctx[c];
                const double ts = now_s();
                GK(rt_gpu_debug_set_context(g, ctx, o->seed + ctx, &err_));
                const double set_s = now_s() - ts;
                const uint32_t n = o->warmup + o->steps;
                double *st = xcalloc(n, sizeof *st);
                int finite = 1;
                for (uint32_t s = 0; s < n; s++) {
                    const int32_t tok = (int32_t)(splitmix(&rng) % V);
                    rt_gpu_outputs out = {.logits = logits};
                    const double a = now_s();
                    GK(rt_gpu_forward(g, &tok, 1, &out, &err_));
                    st[s] = now_s() - a;
                    finite &= all_finite(logits, V);
                }
                double *tm = st + o->warmup;
                qsort(tm, o->steps, sizeof *tm, cmp_d);
                const double med = tm[o->steps / 2], mn = tm[0];
                const uint32_t P_mid = ctx + o->warmup + o->steps / 2 + 1;
                const step_bytes b = bytes_per_step(R, P_mid, lat_es);
                const double ideal = b.total / h->copy_rw;
                printf("decode %-7s graph %-3s ctx %6u: step %.3f ms median of %u (min %.3f) | must read %.3f GB | "
                       "at the copy rate %.3f ms | RATIO %.2f (vs Sasum read rate %.2f) | %.0f GB/s effective | "
                       "logits %s | context fill %.2f s\n",
                       in->precision, gr ? "on" : "off", ctx, med * 1e3, o->steps, mn * 1e3, b.total / 1e9,
                       ideal * 1e3, med / ideal, med / (b.total / h->asum_read), b.total / med / 1e9,
                       finite ? "finite" : "NOT FINITE", set_s);
                if (!gr) {
                    rt_gpu_stage_times sg;
                    GK(rt_gpu_debug_stage_times(g, 1, &sg, &err_));
                    print_stages("   ", &sg, hp);
                    print_stage_bytes(&sg, &b, h->copy_rw);
                }
                /* the sub-step breakdown at the first context, once per mode */
                if (c == 0 && (!gr || !o->graph_off)) GK(rt_gpu_debug_profile(g, 1, 0, h->copy_rw / 1e9, stdout, &err_));
                free(st);
            }
            printf("   graph launches %llu, captures %llu, instantiations %llu; %llu nodes (launches) per step\n",
                   (unsigned long long)in->graph_steps, (unsigned long long)in->graph_captures,
                   (unsigned long long)in->graph_instantiations, (unsigned long long)in->graph_nodes);
            rt_gpu_model_free(g);
        }
    }
    free(logits);
}

/* ---- prefill ---- */

typedef struct gemm_shape {
    int64_t m, n, k;             /* tokens, outputs, inputs (cuBLAS: y[m][n] = x[m][k] w[n][k]^T) */
    int32_t batch;
    double count;                /* how many such GEMMs one prefill runs (all layers) */
    double tflops;               /* cuBLAS, measured */
} gemm_shape;

static void add_shape(gemm_shape *s, uint32_t *ns, int64_t m, int64_t n, int64_t k, int32_t batch, double count) {
    if (m < 1 || n < 1 || k < 1) return;
    for (uint32_t i = 0; i < *ns; i++)
        if (s[i].m == m && s[i].n == n && s[i].k == k && s[i].batch == batch) {
            s[i].count += count;
            return;
        }
    s[(*ns)++] = (gemm_shape){m, n, k, batch, count, 0};
}

/* The prefill's weight products as GEMMs, from the tensors: every 2-D matrix of each layer
 * (n_tok x its inputs -> its rows), kv_b split per head into the absorption (qk_nope -> kv_lora)
 * and W_UV (kv_lora -> v_head), experts as a batch of n_expert GEMMs of n_tok * used / n_expert
 * tokens (uniform routing). lm_head runs for the last token only and is left out. */
static uint32_t prefill_gemms(const rank_model *R, uint32_t n_tok, gemm_shape *s, double *flops) {
    const glm5_hparams *hp = &R->hp;
    uint32_t ns = 0;
    *flops = 0;
    for (uint64_t i = 0; i < R->n_tab; i++) {
        const rt_tensor *t = &R->tab[i];
        const glm5_role r = R->role[i];
        /* attn_k_b / attn_v_b are carried, not read: a prompt's products read kv_b */
        if (t->n_dims < 2 || r == GLM5_ROLE_TOKEN_EMBD || r == GLM5_ROLE_OUTPUT || r == GLM5_ROLE_ATTN_K_B ||
            r == GLM5_ROLE_ATTN_V_B)
            continue;
        const int64_t k = (int64_t)t->ne[0], rows = (int64_t)t->ne[1];
        if (r == GLM5_ROLE_ATTN_KV_B) {
            const int64_t H = rows / (hp->qk_nope + hp->v_head);
            add_shape(s, &ns, n_tok, hp->kv_lora, hp->qk_nope, (int32_t)H, 1);
            add_shape(s, &ns, n_tok, hp->v_head, hp->kv_lora, (int32_t)H, 1);
            *flops += 2.0 * n_tok * (double)H * hp->kv_lora * (hp->qk_nope + hp->v_head);
        } else if (t->n_dims == 3) {
            const int64_t ne = (int64_t)t->ne[2];
            const int64_t mt = ((int64_t)n_tok * hp->n_expert_used + ne - 1) / ne;
            add_shape(s, &ns, mt, rows, k, (int32_t)ne, 1);
            *flops += 2.0 * n_tok * hp->n_expert_used * (double)rows * (double)k;
        } else {
            add_shape(s, &ns, n_tok, rows, k, 1, 1);
            *flops += 2.0 * n_tok * (double)rows * (double)k;
        }
    }
    return ns;
}

static void time_gemms(cublasHandle_t cb, gemm_shape *s, uint32_t ns) {
    size_t wmax = 0, xmax = 0, ymax = 0;
    for (uint32_t i = 0; i < ns; i++) {
        const size_t b = (size_t)s[i].batch;
        if (b * s[i].n * s[i].k > wmax) wmax = b * s[i].n * s[i].k;
        if (b * s[i].m * s[i].k > xmax) xmax = b * s[i].m * s[i].k;
        if (b * s[i].m * s[i].n > ymax) ymax = b * s[i].m * s[i].n;
    }
    uint16_t *hw = xcalloc(1 << 20, 2);
    uint64_t rng = 77;
    for (int i = 0; i < 1 << 20; i++) hw[i] = quant_f32_to_bf16(0.02f * unit(&rng));
    void *w = NULL, *x = NULL, *y = NULL;
    CK(cudaMalloc(&w, wmax * 2));
    CK(cudaMalloc(&x, xmax * 2));
    CK(cudaMalloc(&y, ymax * 4));
    for (size_t off = 0; off < wmax; off += 1 << 20)
        CK(cudaMemcpy((uint16_t *)w + off, hw, (wmax - off < (1u << 20) ? wmax - off : 1u << 20) * 2, cudaMemcpyHostToDevice));
    for (size_t off = 0; off < xmax; off += 1 << 20)
        CK(cudaMemcpy((uint16_t *)x + off, hw, (xmax - off < (1u << 20) ? xmax - off : 1u << 20) * 2, cudaMemcpyHostToDevice));
    free(hw);
    CB(cublasSetStream(cb, 0));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const float alpha = 1.0f, beta = 0.0f;
    for (uint32_t i = 0; i < ns; i++) {
        gemm_shape *g = &s[i];
        const int reps = 10;
        for (int r = -2; r < reps; r++) {
            if (r == 0) CK(cudaEventRecord(e0, 0));
            if (g->batch == 1)
                CB(cublasGemmEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, (int)g->n, (int)g->m, (int)g->k, &alpha, w, CUDA_R_16BF,
                                (int)g->k, x, CUDA_R_16BF, (int)g->k, &beta, y, CUDA_R_32F, (int)g->n,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            else
                CB(cublasGemmStridedBatchedEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, (int)g->n, (int)g->m, (int)g->k, &alpha, w,
                                              CUDA_R_16BF, (int)g->k, g->n * g->k, x, CUDA_R_16BF, (int)g->k,
                                              g->m * g->k, &beta, y, CUDA_R_32F, (int)g->n, g->m * g->n, g->batch,
                                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        }
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        const double fl = 2.0 * g->m * g->n * g->k * g->batch;
        g->tflops = fl * reps / (ms * 1e-3) / 1e12;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(w);
    cudaFree(x);
    cudaFree(y);
}

/* One prefill of the prompt on a fresh GPU model with the given product path: a probe of the
 * first 256 tokens, then the prompt from position 0 in --chunk calls (chunks of at most 512,
 * stopped at --prefill-cap seconds, when the probe says the whole would not fit), then the stage
 * split of the last call. */
static void prefill_variant(rank_model *R, const opts *o, const char *variant, const int32_t *toks, double wflops,
                            double blas_tflops) {
    const glm5_hparams *hp = &R->hp;
    const uint32_t N = o->prefill_tokens, V = hp->n_vocab;
    rt_gpu_opts go;
    rt_gpu_opts_default(&go);
    go.precision = o->prefill_prec;
    if (!strcmp(variant, "gemv")) go.gemm_min = -1;
    else if (!strcmp(variant, "f32")) go.gemm = RT_GPU_GEMM_F32;
    else if (!strcmp(variant, "f16")) go.gemm = RT_GPU_GEMM_F16;
    /* "default": the options left at 0, the environment decides */
    rt_gpu_model *g = NULL;
    GK(rt_gpu_model_create(R->m, &go, &g, &err_));
    const rt_gpu_info *in = rt_gpu_model_info(g);
    printf("-- prefill path '%s': %s mode, GEMM compute %s from %d tokens per call (0: GEMM path off), experts by "
           "GEMM from %d rows\n",
           variant, in->precision, in->gemm ? in->gemm : "?", in->gemm_min, in->gemm_min_expert);
    float *logits = xcalloc(V, sizeof(float));
    rt_gpu_outputs out = {.logits = logits};
    const uint32_t probe = N < 256 ? N : 256;
    double t0 = now_s();
    GK(rt_gpu_forward(g, toks, probe, &out, &err_));
    const double tprobe = now_s() - t0;
    const double est = tprobe * N / probe;
    rt_gpu_reset(g);
    uint32_t chunk = o->chunk < N ? o->chunk : N, done = 0, last = 0;
    if (est > o->prefill_cap && chunk > 512) chunk = 512;
    const uint64_t calls0 = in->gemm_calls, egemv0 = in->gemm_expert_gemv;
    t0 = now_s();
    while (done < N) {
        last = N - done < chunk ? N - done : chunk;
        GK(rt_gpu_forward(g, toks + done, last, &out, &err_));
        done += last;
        if (now_s() - t0 > o->prefill_cap) break;
    }
    const double tp = now_s() - t0;
    const uint64_t calls = in->gemm_calls - calls0, egemv = in->gemm_expert_gemv - egemv0;
    uint32_t n_bad = 0;
    float amax = 0.0f;
    for (uint32_t i = 0; i < V; i++) {
        if (!isfinite(logits[i])) n_bad++;
        else if (fabsf(logits[i]) > amax) amax = fabsf(logits[i]);
    }
    const int finite = n_bad == 0;
    printf("   probe: %u tokens in %.3f s (the whole prompt ~%.1f s at that rate); cuBLAS GEMMs run: %llu, experts run "
           "by GEMV inside the grouped path: %llu => %s\n",
           probe, tprobe, est, (unsigned long long)calls, (unsigned long long)egemv,
           calls ? "the GEMM path ran" : "the GEMV kernels ran");
    rt_gpu_stage_times sg;
    GK(rt_gpu_debug_stage_times(g, last, &sg, &err_));
    print_stages("   last call's", &sg, hp);
    printf("   logits of the last position: %u of %u not finite, max |finite| %.4g\n", n_bad, V, (double)amax);
    if (o->prefill_profile) GK(rt_gpu_debug_profile(g, last, blas_tflops, 0, stdout, &err_));
    if (o->prefill_scan) GK(rt_gpu_debug_scan(g, last, stdout, &err_));
    const double t_prompt = tp * N / done; /* the whole prompt, extrapolated if stopped early */
    printf("PREFILL %-7s %u of %u tokens in %.3f s (calls of %u%s): %.0f tokens/s at %u layers; logits %s; "
           "weight-product FLOP rate %.1f TFLOP/s = %.3f of cuBLAS bf16's %.1f on the same GEMMs\n",
           variant, done, N, tp, chunk, done < N ? ", stopped at the time cap: rate extrapolated" : "", N / t_prompt,
           hp->n_layer_main, finite ? "finite" : "NOT FINITE", wflops / t_prompt / 1e12,
           wflops / t_prompt / 1e12 / blas_tflops, blas_tflops);
    /* full depth from the stage split: attention per layer x 78, dense and MoE per layer x GLM-5's
     * 3 and 75 */
    const uint32_t nd = hp->n_leading_dense, nm = hp->n_layer_main - nd;
    if (hp->n_layer_main != 78 && sg.total_ms > 0 && nm > 0) {
        const double full = sg.embd_ms + sg.head_ms + (sg.attn_ms + sg.add_ms) / hp->n_layer_main * 78 +
                            (nd ? sg.dense_ms / nd * 3 : 0) + sg.moe_ms / nm * 75;
        printf("   scaled to GLM-5's 78 layers (3 dense + 75 MoE) by the last call's stage split: %.0f tokens/s\n",
               N / (t_prompt * full / sg.total_ms));
    }
    rt_gpu_model_free(g);
    free(logits);
}

static void run_prefill(rank_model *R, const opts *o, cublasHandle_t cb) {
    const glm5_hparams *hp = &R->hp;
    const uint32_t N = o->prefill_tokens, V = hp->n_vocab;
    printf("\n== prefill: %u-token prompt, %u main layers (%u dense), %s mode, one rank of TP%u (collectives not "
           "run)\n",
           N, hp->n_layer_main, hp->n_leading_dense, o->prefill_prec == RT_GPU_FAST ? "fast" : "precise", TP);
    gemm_shape shapes[64];
    double wflops = 0;
    const uint32_t ns = prefill_gemms(R, N, shapes, &wflops);
    time_gemms(cb, shapes, ns);
    double blas_s = 0;
    for (uint32_t i = 0; i < ns; i++) {
        const gemm_shape *g = &shapes[i];
        blas_s += 2.0 * g->m * g->n * g->k * g->batch * g->count / (g->tflops * 1e12);
        printf("   cuBLAS bf16 GEMM tokens %5lld x outputs %5lld x inputs %5lld, batch %3d: %6.1f TFLOP/s (x %.0f per "
               "prefill)\n",
               (long long)g->m, (long long)g->n, (long long)g->k, g->batch, g->tflops, g->count);
    }
    const double blas_tflops = wflops / blas_s / 1e12;
    printf("weight-product FLOPs of the prefill (every matrix of every layer for every token, 8 experts' slices per "
           "token, kv_b per head; lm_head of the last token left out): %.2f TFLOP; cuBLAS bf16 runs them in %.3f s "
           "= %.1f TFLOP/s (experts as batched GEMMs of uniform routing)\n",
           wflops / 1e12, blas_s, blas_tflops);
    int32_t *toks = xcalloc(N, sizeof *toks);
    uint64_t rng = o->seed ^ 0x9f111;
    for (uint32_t i = 0; i < N; i++) toks[i] = (int32_t)(splitmix(&rng) % V);
    char list[256];
    snprintf(list, sizeof list, "%s", o->gemm_list);
    for (char *save = NULL, *v = strtok_r(list, ",", &save); v; v = strtok_r(NULL, ",", &save))
        prefill_variant(R, o, v, toks, wflops, blas_tflops);
    free(toks);
}

/* ---- main ---- */

static int parse_list(const char *s, uint32_t *out, uint32_t max) {
    uint32_t n = 0;
    while (*s && n < max) {
        char *end;
        const unsigned long v = strtoul(s, &end, 10);
        if (end == s) return -1;
        out[n++] = (uint32_t)v;
        s = *end == ',' ? end + 1 : end;
    }
    return (int)n;
}

static void usage(void) {
    fprintf(stderr, "usage: bench_decode [--decode] [--prefill] [--prefill-profile] [--prefill-scan] [--cpu-dry-run] [--plan-only] "
                    "[--layers N] [--ctx A,B,..] "
                    "[--steps N] [--warmup N] [--modes precise,fast] [--graph off,on] [--prefill-tokens N] "
                    "[--chunk N] [--prefill-cap S] [--prefill-mode precise|fast] [--gemm gemv,f32,f16,default] "
                    "[--threads N] [--seed S]\n");
    exit(2);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* lines reach a tee'd log even if a timeout kills the run */
    opts o;
    memset(&o, 0, sizeof o);
    o.layers = 78;
    o.n_ctx = (uint32_t)parse_list("1024,8192,32768", o.ctx, MAX_CTX);
    o.steps = 20;
    o.warmup = 3;
    o.mode_precise = o.mode_fast = o.graph_off = o.graph_on = 1;
    o.prefill_tokens = 4096;
    o.chunk = 4096;
    o.prefill_cap = 30;
    o.prefill_prec = RT_GPU_FAST;
    o.gemm_list = "f16,f32,gemv";
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    o.threads = nc > 0 ? (uint32_t)nc : 1;
    o.seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--decode")) o.decode = 1;
        else if (!strcmp(a, "--prefill")) o.prefill = 1;
        else if (!strcmp(a, "--prefill-profile")) o.prefill = 1, o.prefill_profile = 1;
        else if (!strcmp(a, "--prefill-scan")) o.prefill = 1, o.prefill_scan = 1;
        else if (!strcmp(a, "--cpu-dry-run")) o.dry = 1;
        else if (!strcmp(a, "--plan-only")) o.plan_only = 1;
        else if (!v) usage();
        else if (!strcmp(a, "--layers")) o.layers = atoll(v), i++;
        else if (!strcmp(a, "--ctx")) {
            int n = parse_list(v, o.ctx, MAX_CTX);
            if (n < 1) usage();
            o.n_ctx = (uint32_t)n;
            i++;
        } else if (!strcmp(a, "--steps")) o.steps = (uint32_t)atoi(v), i++;
        else if (!strcmp(a, "--warmup")) o.warmup = (uint32_t)atoi(v), i++;
        else if (!strcmp(a, "--modes")) {
            o.mode_precise = strstr(v, "precise") != NULL;
            o.mode_fast = strstr(v, "fast") != NULL;
            i++;
        } else if (!strcmp(a, "--graph")) {
            o.graph_off = strstr(v, "off") != NULL;
            o.graph_on = strstr(v, "on") != NULL;
            i++;
        } else if (!strcmp(a, "--prefill-tokens")) o.prefill_tokens = (uint32_t)atoi(v), i++;
        else if (!strcmp(a, "--chunk")) o.chunk = (uint32_t)atoi(v), i++;
        else if (!strcmp(a, "--prefill-cap")) o.prefill_cap = atof(v), i++;
        else if (!strcmp(a, "--prefill-mode")) o.prefill_prec = strcmp(v, "precise") ? RT_GPU_FAST : RT_GPU_PRECISE, i++;
        else if (!strcmp(a, "--gemm")) o.gemm_list = v, i++;
        else if (!strcmp(a, "--threads")) o.threads = (uint32_t)atoi(v), i++;
        else if (!strcmp(a, "--seed")) o.seed = strtoull(v, NULL, 10), i++;
        else usage();
    }
    if (!o.decode && !o.prefill && !o.dry) o.decode = 1;
    if (o.steps < 1 || o.threads < 1 || o.prefill_tokens < 1 || o.chunk < 1) usage();
    const double t_start = now_s();
    rank_model R;
    memset(&R, 0, sizeof R);
    build_tables(&R, &o);
    const step_bytes b1 = bytes_per_step(&R, 1025, 4), b32 = bytes_per_step(&R, 32769, 2);
    print_bytes("bytes a step must read at context 1k, f32 cache", &b1);
    print_bytes("bytes a step must read at context 32k, bf16 cache", &b32);
    printf("a real rank blob: %.2f GB of tensors (token_embd whole, NextN included)\n", (double)R.rank_bytes_real / 1e9);
    if (o.plan_only) {
        uint64_t hb = 0;
        for (uint64_t i = 0; i < R.n_tab; i++) hb += up4k(R.tab[i].nbytes);
        printf("this model: %.2f GB of tensors (nothing allocated: --plan-only)\n", (double)hb / 1e9);
        free_rank(&R);
        return 0;
    }
    build_host(&R, &o);
    if (o.dry) {
        rt_state *s = NULL;
        GK(rt_state_create(R.m, &s, &err_));
        const uint32_t V = R.hp.n_vocab;
        float *lg = xcalloc(V, sizeof(float));
        const int32_t tok[2] = {1, 2};
        rt_outputs out = {.logits = lg};
        const double t0 = now_s();
        GK(rt_model_forward(R.m, s, tok, 2, &out, &err_));
        const int fin = all_finite(lg, V);
        float mx = 0;
        for (uint32_t i = 0; i < V; i++) mx = fabsf(lg[i]) > mx ? fabsf(lg[i]) : mx;
        printf("CPU reference, 2 tokens: %.2f s, logits %s (max |logit| %.3g)\n", now_s() - t0,
               fin ? "finite" : "NOT FINITE", (double)mx);
        rt_state_free(s);
        free(lg);
        free_rank(&R);
        printf("dry run done in %.1f s\n", now_s() - t_start);
        return fin ? 0 : 1;
    }
    pin_host(&R);
    cublasHandle_t cb;
    CB(cublasCreate(&cb));
    const hbm h = measure_hbm(cb);
    if (check_add_norm(R.hp.n_embd)) exit(1);
    if (o.decode) run_decode(&R, &o, &h);
    if (o.prefill) run_prefill(&R, &o, cb);
    cublasDestroy(cb);
    free_rank(&R);
    printf("total %.1f s\n", now_s() - t_start);
    return 0;
}
