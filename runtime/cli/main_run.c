/* glm5-run: runs GLM-5 from a blob set (any TP degree) or a GGUF (TP = 1) on the CPU.
 *
 *   glm5-run -m BLOBDIR|MODEL.gguf (-p TEXT | --tokens ID,ID,...) [options]
 *
 * Streams the generated text to stdout (or the ids with --ids); timing goes to stderr.
 * --dump-logits FILE writes the logits of every prompt position as little-endian float32
 * [n_prompt_tokens, n_vocab] (temporary file, fsync, rename). Exit status: 0 success, 1 a
 * runtime failure (its message on stderr), 2 a usage error, 3 --check found a difference past
 * tolerance.
 *
 * --device cuda needs the CUDA build (build/gpu/bin/glm5-run, `make gpu`, which defines
 * G5_WITH_CUDA); --check N runs the CPU reference beside the GPU for the first N tokens.
 *
 * Under a launcher (`mpirun -np P`, `srun -n P`; comm.h) each of the P processes opens and runs
 * T / P of the blob set's T ranks (the other ranks' files may be absent on its node); they agree
 * on success before the first forward pass (every process exits with the first failing one's
 * status), process 0 samples each token and broadcasts it, and only process 0 prints the output
 * and timing and writes --dump-logits. Errors are prefixed "rank P:" (the process). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "format/blob.h"
#include "format/glm5.h"
#include "runtime/text/chat.h"
#include "runtime/cpu/comm.h"
#include "runtime/draft.h"
#include "runtime/cpu/model.h"
#include "runtime/text/sample.h"
#include "runtime/text/tokenizer.h"
#include "runtime/cpu/weights.h"
#ifdef G5_WITH_CUDA
#include "runtime/gpu/gpu_model.h"
#endif

#define MAX_STOPS 16

typedef struct args {
    const char *model;
    const char *device;
    const char *prompt;
    const char *tokens;
    const char *system;
    const char *dump_logits;
    long n_predict;
    int chat, think, ids, quiet;
    int cuda, fast, no_verify, kv_cache, cuda_graph, nccl;
    long check, tp, gpu0;
    int draft;                   /* --draft mtp */
    uint32_t threads;
    rt_mla_mode mla;
    samp_params sp;
    const char *stops[MAX_STOPS];
    size_t n_stops;
} args;

static void usage(FILE *f) {
    fprintf(f,
            "usage: glm5-run -m BLOBDIR|MODEL.gguf (-p TEXT | --tokens ID,ID,...) [options]\n"
            "  -m PATH              a blob set directory (glm5-shard convert) or a GGUF (TP 1)\n"
            "  --device cpu|cuda    where to run (cuda: the CUDA build, build/gpu/bin/glm5-run)\n"
            "  --tp N               tensor-parallel ranks: must equal the blob set's (a GGUF is\n"
            "                       TP 1: `glm5-shard convert --tp N` first). With --device cuda\n"
            "                       rank r runs on GPU (gpu0 + r) %% n_gpus, all ranks started by\n"
            "                       this process, NCCL between distinct GPUs; under mpirun/srun\n"
            "                       (P processes) local rank i of the process with node index L\n"
            "                       on GPU (gpu0 + L * T/P + i) %% n_gpus, NCCL, one GPU per rank\n"
            "  --gpu0 K             first CUDA device (default 0)\n"
            "  --precision precise|fast  GPU arithmetic (precise: float32 activations and cache;\n"
            "                       fast: bf16 latent cache; see specs/numerics.md)\n"
            "  --kv-cache f32|bf16|f16  GPU latent cache type (default f32 precise, bf16 fast)\n"
            "  --cuda-graph on|off   GPU decode steps as CUDA graph launches (default off)\n"
            "  --collective auto|nccl  GPU: between ranks (auto: none for one rank, a device-side\n"
            "                       sum on one GPU, NCCL across GPUs; nccl: also for TP 1)\n"
            "  --check N            GPU: run the CPU reference beside it for the first N tokens,\n"
            "                       print per layer/stage differences (and the MTP block's\n"
            "                       draft logits); exit 3 past tolerance\n"
            "  --no-verify          GPU: skip the blob checksums while loading\n"
            "  -p, --prompt TEXT    prompt text (special tokens such as [gMASK] are recognized)\n"
            "  --tokens IDS         prompt token ids, comma-separated\n"
            "  --chat               wrap the prompt as a user message in GLM's chat format\n"
            "  --system TEXT        system message (with --chat)\n"
            "  --no-think           chat: thinking off\n"
            "  -n N                 tokens to generate (default 64; 0: only evaluate the prompt)\n"
            "  --draft mtp|none     greedy decoding drafting one token per step with the MTP block,\n"
            "                       verified by a two-token forward pass; prints the acceptance rate\n"
            "                       (one process only; default none)\n"
            "  --temp T             temperature (default 0.8; 0 = greedy)\n"
            "  --top-k K            (default 40; 0 = off)\n"
            "  --top-p P            (default 0.95; 1 = off)\n"
            "  --min-p P            (default 0.05; 0 = off)\n"
            "  --repeat-penalty R   (default 1 = off)\n"
            "  --repeat-last-n N    penalty window (default 64)\n"
            "  --seed S             random seed (default 0)\n"
            "  --stop TEXT          stop when the output contains TEXT (repeatable)\n"
            "  --ids                print generated token ids (space-separated) instead of text\n"
            "  --dump-logits FILE   write float32 LE [n_prompt, n_vocab] logits of the prompt\n"
            "  --threads N          CPU threads in all (default: online cores)\n"
            "  --mla absorbed|expanded  attention formulation (default absorbed)\n"
            "  -q, --quiet          no timing on stderr\n");
}

static int parse_long(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

static int parse_float(const char *s, float *out) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end) return 0;
    *out = v;
    return 1;
}

static int parse_args(int argc, char **argv, args *a) {
    memset(a, 0, sizeof *a);
    a->n_predict = 64;
    a->think = 1;
    a->device = "cpu";
    a->mla = RT_MLA_ABSORBED;
    samp_params_default(&a->sp);
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        long lv;
#define NEED() do { if (!v) { fprintf(stderr, "glm5-run: %s needs a value\n", o); return 0; } i++; } while (0)
#define BAD() do { fprintf(stderr, "glm5-run: bad value for %s: '%s'\n", o, v); return 0; } while (0)
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            return -1;
        } else if (!strcmp(o, "-m") || !strcmp(o, "--model")) {
            NEED(); a->model = v;
        } else if (!strcmp(o, "--device")) {
            NEED(); a->device = v;
        } else if (!strcmp(o, "--tp")) {
            NEED(); if (!parse_long(v, 1, 4096, &a->tp)) BAD();
        } else if (!strcmp(o, "--gpu0")) {
            NEED(); if (!parse_long(v, 0, 4095, &a->gpu0)) BAD();
        } else if (!strcmp(o, "--precision")) {
            NEED();
            if (!strcmp(v, "precise")) a->fast = 0;
            else if (!strcmp(v, "fast")) a->fast = 1;
            else BAD();
        } else if (!strcmp(o, "--cuda-graph")) {
            NEED();
            if (!strcmp(v, "on")) a->cuda_graph = 1;
            else if (!strcmp(v, "off")) a->cuda_graph = 0;
            else BAD();
        } else if (!strcmp(o, "--collective")) {
            NEED();
            if (!strcmp(v, "auto")) a->nccl = 0;
            else if (!strcmp(v, "nccl")) a->nccl = 1;
            else BAD();
        } else if (!strcmp(o, "--kv-cache")) {
            NEED();
            if (!strcmp(v, "f32")) a->kv_cache = 1;
            else if (!strcmp(v, "bf16")) a->kv_cache = 2;
            else if (!strcmp(v, "f16")) a->kv_cache = 3;
            else BAD();
        } else if (!strcmp(o, "--draft")) {
            NEED();
            if (!strcmp(v, "mtp")) a->draft = 1;
            else if (!strcmp(v, "none")) a->draft = 0;
            else BAD();
        } else if (!strcmp(o, "--check")) {
            NEED(); if (!parse_long(v, 0, INT32_MAX, &a->check)) BAD();
        } else if (!strcmp(o, "--no-verify")) {
            a->no_verify = 1;
        } else if (!strcmp(o, "-p") || !strcmp(o, "--prompt")) {
            NEED(); a->prompt = v;
        } else if (!strcmp(o, "--tokens")) {
            NEED(); a->tokens = v;
        } else if (!strcmp(o, "--system")) {
            NEED(); a->system = v;
        } else if (!strcmp(o, "--chat")) {
            a->chat = 1;
        } else if (!strcmp(o, "--no-think")) {
            a->think = 0;
        } else if (!strcmp(o, "-n") || !strcmp(o, "--n-predict")) {
            NEED(); if (!parse_long(v, 0, INT32_MAX, &a->n_predict)) BAD();
        } else if (!strcmp(o, "--temp")) {
            NEED(); if (!parse_float(v, &a->sp.temperature)) BAD();
        } else if (!strcmp(o, "--top-k")) {
            NEED(); if (!parse_long(v, 0, INT32_MAX, &lv)) BAD(); a->sp.top_k = (int32_t)lv;
        } else if (!strcmp(o, "--top-p")) {
            NEED(); if (!parse_float(v, &a->sp.top_p)) BAD();
        } else if (!strcmp(o, "--min-p")) {
            NEED(); if (!parse_float(v, &a->sp.min_p)) BAD();
        } else if (!strcmp(o, "--repeat-penalty")) {
            NEED(); if (!parse_float(v, &a->sp.repeat_penalty) || a->sp.repeat_penalty <= 0) BAD();
        } else if (!strcmp(o, "--repeat-last-n")) {
            NEED(); if (!parse_long(v, 0, INT32_MAX, &lv)) BAD(); a->sp.repeat_last_n = (int32_t)lv;
        } else if (!strcmp(o, "--seed")) {
            NEED();
            char *end;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 10);
            if (errno || end == v || *end) BAD();
            a->sp.seed = s;
        } else if (!strcmp(o, "--stop")) {
            NEED();
            if (a->n_stops == MAX_STOPS) { fprintf(stderr, "glm5-run: at most %d --stop\n", MAX_STOPS); return 0; }
            a->stops[a->n_stops++] = v;
        } else if (!strcmp(o, "--ids")) {
            a->ids = 1;
        } else if (!strcmp(o, "--dump-logits")) {
            NEED(); a->dump_logits = v;
        } else if (!strcmp(o, "--threads") || !strcmp(o, "-t")) {
            NEED(); if (!parse_long(v, 1, 1024, &lv)) BAD(); a->threads = (uint32_t)lv;
        } else if (!strcmp(o, "--mla")) {
            NEED();
            if (!strcmp(v, "absorbed")) a->mla = RT_MLA_ABSORBED;
            else if (!strcmp(v, "expanded")) a->mla = RT_MLA_EXPANDED;
            else BAD();
        } else if (!strcmp(o, "-q") || !strcmp(o, "--quiet")) {
            a->quiet = 1;
        } else {
            fprintf(stderr, "glm5-run: unknown option '%s'\n", o);
            return 0;
        }
#undef NEED
#undef BAD
    }
    if (!a->model) { fprintf(stderr, "glm5-run: -m is required\n"); return 0; }
    if (!!a->prompt == !!a->tokens) { fprintf(stderr, "glm5-run: give exactly one of -p and --tokens\n"); return 0; }
    if (a->chat && !a->prompt) { fprintf(stderr, "glm5-run: --chat needs -p\n"); return 0; }
    a->cuda = !strcmp(a->device, "cuda");
    if (strcmp(a->device, "cpu") != 0 && !a->cuda) {
        fprintf(stderr, "glm5-run: unknown device '%s' (cpu or cuda)\n", a->device);
        return 0;
    }
#ifndef G5_WITH_CUDA
    if (a->cuda) {
        fprintf(stderr, "glm5-run: this build has no CUDA; use build/gpu/bin/glm5-run (make gpu)\n");
        return 0;
    }
#endif
    if (a->check && !a->cuda) { fprintf(stderr, "glm5-run: --check compares the GPU with the CPU: needs --device cuda\n"); return 0; }
    if (a->draft && a->sp.temperature > 0) { fprintf(stderr, "glm5-run: --draft mtp is greedy only (--temp 0)\n"); return 0; }
    if (a->draft && a->check) { fprintf(stderr, "glm5-run: --draft mtp and --check cannot be combined\n"); return 0; }
    return 1;
}

/* Where forward passes run: the CPU model, or the GPU (with the CPU beside it under --check). */
typedef struct engine {
    rt_model *m;
    rt_state *s;
#ifdef G5_WITH_CUDA
    rt_gpu_model *g;
    rt_gpu_check *chk;
#endif
} engine;

static g5_status eng_forward(engine *en, const int32_t *ids, uint32_t n, float *logits, int all,
                             g5_error *e) {
#ifdef G5_WITH_CUDA
    if (en->g) {
        rt_gpu_outputs go = {.logits = logits, .all_logits = all};
        return en->chk ? rt_gpu_check_forward(en->chk, ids, n, &go, e) : rt_gpu_forward(en->g, ids, n, &go, e);
    }
#endif
    rt_outputs ro = {.logits = logits, .all_logits = all};
    return rt_model_forward(en->m, en->s, ids, n, &ro, e);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* "rank P: " when several processes run (set once the communicator exists). */
static char g_who[32];

static int fail(const g5_error *e, g5_status st, const char *what) {
    fprintf(stderr, "glm5-run: %s%s: %s (%s)\n", g_who, what, e->msg[0] ? e->msg : g5_strerror(st), g5_strerror(st));
    return 1;
}

/* Points where the processes agree that all got there (SYNC_LOAD: weights and model, before any
 * GPU collective; SYNC_RUN: before the first forward pass). A process that fails earlier makes
 * the remaining agreements on its way out, so none waits for it. */
enum { SYNC_LOAD, SYNC_RUN, N_SYNC };

/* All processes' rc at one agreement point: 0, or the first failing process's rc. */
static int agree(rt_comm *c, int rc, int *n_synced) {
    (*n_synced)++;
    const uint32_t P = rt_comm_size(c);
    if (P == 1) return rc;
    int32_t mine = rc, *all = malloc((size_t)P * sizeof *all);
    g5_error e = {0};
    g5_status st = all ? rt_comm_allgather(c, &mine, sizeof mine, all, &e) : g5_fail(&e, G5_ERR_NOMEM, "agreement");
    if (st) {
        free(all);
        return rc ? rc : fail(&e, st, "processes");
    }
    for (uint32_t q = 0; q < P && !rc; q++)
        if (all[q]) {
            rc = all[q];
            fprintf(stderr, "glm5-run: %sstopping: process %u failed (exit %d)\n", g_who, q, rc);
        }
    free(all);
    return rc;
}

/* Every process runs process 0's prompt with its output shape (an MPMD launch may give the
 * processes different arguments): the ids and whether all prompt logits are kept. 0, or 1. */
static int share_prompt(rt_comm *c, int32_t **ids, size_t *n_ids, int *all_logits, float **logits, size_t V) {
    g5_error e = {0};
    g5_status st;
    uint64_t hdr[2] = {*n_ids, (uint64_t)*all_logits};
    if ((st = rt_comm_bcast(c, hdr, sizeof hdr, 0, &e))) return fail(&e, st, "prompt broadcast");
    if (hdr[0] != *n_ids || hdr[1] != (uint64_t)*all_logits) {
        int32_t *ni = hdr[0] < SIZE_MAX / V / sizeof(float) ? realloc(*ids, hdr[0] * sizeof *ni) : NULL;
        if (ni) *ids = ni;
        float *nl = ni ? realloc(*logits, (hdr[1] ? hdr[0] : 1) * V * sizeof *nl) : NULL;
        if (!ni || !nl) {
            fprintf(stderr, "glm5-run: %sout of memory for process 0's prompt of %llu tokens\n", g_who,
                    (unsigned long long)hdr[0]);
            return 1;
        }
        *logits = nl;
        *n_ids = (size_t)hdr[0];
        *all_logits = (int)hdr[1];
    }
    if ((st = rt_comm_bcast(c, *ids, *n_ids * sizeof **ids, 0, &e))) return fail(&e, st, "prompt broadcast");
    return 0;
}

/* Process p opens its ranks of a blob set; a GGUF (one rank) cannot be divided. 0, or the exit
 * status. */
static int open_weights(const args *a, rt_comm *comm, rt_wset **ws) {
    g5_error e = {0};
    g5_status st;
    const uint32_t P = rt_comm_size(comm);
    if (P == 1) {
        if ((st = rt_wset_open(a->model, ws, &e))) return fail(&e, st, a->model);
        return 0;
    }
    struct stat sb;
    if (stat(a->model, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "glm5-run: %s%s is not a blob set: a GGUF is one rank and %u processes need at least %u; "
                "write a set with `glm5-shard convert --tp T -o DIR MODEL.gguf` (T a multiple of %u)\n",
                g_who, a->model, P, P, P);
        return 2;
    }
    blob_set_record rec = {0};
    if ((st = blob_set_record_read(a->model, &rec, &e))) return fail(&e, st, a->model);
    const uint32_t T = rec.tp;
    blob_set_record_clear(&rec);
    if (a->tp && (uint32_t)a->tp != T) {
        fprintf(stderr, "glm5-run: %s--tp %ld: %s holds %u rank%s (blobs)\n", g_who, a->tp, a->model, T, T > 1 ? "s" : "");
        return 2;
    }
    uint32_t first, count;
    if ((st = rt_comm_ranks(comm, T, &first, &count, &e))) {
        fprintf(stderr, "glm5-run: %s%s holds %u rank%s, which %u processes cannot share evenly (T %% P = %u %% %u = %u); "
                "start a number of processes that divides %u, or convert with --tp a multiple of %u\n",
                g_who, a->model, T, T > 1 ? "s" : "", P, T, P, T % P, T, P);
        return 2;
    }
    if ((st = rt_wset_open_blobs_ranks(a->model, first, count, ws, &e))) return fail(&e, st, a->model);
    return 0;
}

/* "12,34, 56" -> ids (malloc'ed). 0 on a malformed list. */
static int parse_ids(const char *s, int32_t **out, size_t *n) {
    size_t cap = 16, cnt = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    const char *p = s;
    while (ids) {
        while (*p == ' ') p++;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX) break;
        if (cnt == cap) {
            int32_t *q = realloc(ids, (cap *= 2) * sizeof *ids);
            if (!q) break;
            ids = q;
        }
        ids[cnt++] = (int32_t)v;
        p = end;
        while (*p == ' ') p++;
        if (*p == '\0') {
            *out = ids;
            *n = cnt;
            return 1;
        }
        if (*p != ',') break;
        p++;
    }
    free(ids);
    return 0;
}

static int write_all(int fd, const void *buf, size_t len) {
    const uint8_t *p = buf;
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0) {
            if (errno == EINTR) continue;
            return 0;
        }
        p += w;
        len -= (size_t)w;
    }
    return 1;
}

/* float32 little-endian, through a temporary name, fsync'ed, renamed into place. */
static int dump_logits(const char *path, const float *logits, size_t count) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        fprintf(stderr, "glm5-run: %s: %s\n", tmp, strerror(errno));
        return 0;
    }
    uint8_t buf[1 << 16];
    size_t fill = 0;
    int ok = 1;
    for (size_t i = 0; i < count && ok; i++) {
        uint32_t u;
        memcpy(&u, &logits[i], 4);
        g5_wr_u32(buf + fill, u);
        fill += 4;
        if (fill == sizeof buf || i + 1 == count) {
            ok = write_all(fd, buf, fill);
            fill = 0;
        }
    }
    if (ok) ok = fsync(fd) == 0;
    if (close(fd) != 0) ok = 0;
    if (ok) ok = rename(tmp, path) == 0;
    if (!ok) {
        fprintf(stderr, "glm5-run: writing %s: %s\n", path, strerror(errno));
        unlink(tmp);
    }
    return ok;
}

int main(int argc, char **argv) {
    g5_error e = {0};
    g5_status st;
    rt_comm *comm = NULL;
    /* first: MPI may rewrite argv */
    rt_comm_env cenv;
    rt_comm_env_read(&cenv, getenv);
    if ((st = rt_comm_create(&cenv, &argc, &argv, &comm, &e))) return fail(&e, st, "processes");
    const int lead = rt_comm_rank(comm) == 0;
    if (rt_comm_size(comm) > 1) snprintf(g_who, sizeof g_who, "rank %u: ", rt_comm_rank(comm));
    args a;
    int pa = parse_args(argc, argv, &a);
    if (pa <= 0) {
        if (lead) usage(pa < 0 ? stdout : stderr);
        rt_comm_free(comm);
        return pa < 0 ? 0 : 2;
    }
    int n_synced = 0;
    int bc_open = 0; /* process 0: the others wait for the next token */
    int unclean = 0; /* failed inside an exchange: the others may wait for this process forever */
    int all_logits = a.dump_logits != NULL;
    rt_wset *ws = NULL;
    rt_model *m = NULL;
    rt_state *s = NULL;
    tok_ctx *tok = NULL;
    tok_stream *stream = NULL;
    samp_ctx *samp = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    float *logits = NULL;
    char *text = NULL, *gen = NULL;
    int rc = 1;
    engine en = {0};
    rt_drafter *dr = NULL;

    double t0 = now_s();
    if ((rc = open_weights(&a, comm, &ws))) goto out;
    rc = 1;
    if (a.tp && (uint32_t)a.tp != rt_wset_n_ranks(ws)) {
        fprintf(stderr, "glm5-run: --tp %ld: %s holds %u rank%s (%s); write a TP %ld set with "
                "`glm5-shard convert --tp %ld -o DIR MODEL.gguf`\n", a.tp, a.model, rt_wset_n_ranks(ws),
                rt_wset_n_ranks(ws) > 1 ? "s" : "", rt_wset_source(ws), a.tp, a.tp);
        rc = 2;
        goto out;
    }
    rt_model_opts mo = {.n_threads = a.threads, .mla = a.mla, .comm = comm};
    if ((st = rt_model_create(ws, &mo, &m, &e))) { rc = fail(&e, st, "model"); goto out; }
    if ((st = tok_create(rt_wset_meta(ws), &tok, &e))) { rc = fail(&e, st, "tokenizer"); goto out; }
    if ((rc = agree(comm, 0, &n_synced))) goto out;
    rc = 1;
    const glm5_hparams *hp = rt_model_hparams(m);
#ifdef G5_WITH_CUDA
    if (a.cuda) {
        rt_gpu_opts go;
        rt_gpu_opts_default(&go);
        go.device0 = (int)a.gpu0;
        go.precision = a.fast ? RT_GPU_FAST : RT_GPU_PRECISE;
        go.cache = (rt_gpu_cache)a.kv_cache; /* 0 default, 1 f32, 2 bf16, 3 f16 */
        go.load.verify = !a.no_verify;
        go.cuda_graph = a.cuda_graph;
        go.collective = a.nccl ? RT_GPU_COLL_NCCL : RT_GPU_COLL_AUTO;
        if (!strcmp(rt_wset_source(ws), "blobs")) go.blob_dir = a.model;
        if ((st = rt_gpu_model_create(m, &go, &en.g, &e))) { rc = fail(&e, st, "GPU"); goto out; }
        const rt_gpu_info *gi = rt_gpu_model_info(en.g);
        if (!a.quiet && lead)
            fprintf(stderr, "glm5-run: GPU %s: %u rank%s on %u device%s (collective %s), %s, %s latent cache; weights "
                    "%.3f GB in %.3f s (%.2f GB/s, %u reader threads, checksums %s, %llu O_DIRECT / %llu buffered reads)\n",
                    gi->device_name, gi->n_ranks, gi->n_ranks > 1 ? "s" : "", gi->n_devices, gi->n_devices > 1 ? "s" : "",
                    gi->collective, gi->precision, gi->cache, gi->load.bytes / 1e9, gi->load.seconds, gi->load.gb_per_s, gi->load.n_threads,
                    go.blob_dir ? (gi->load.verified ? "verified" : "skipped") : "n/a (not a blob set)",
                    (unsigned long long)gi->load.direct_reads, (unsigned long long)gi->load.buffered_reads);
        if (a.check) {
            rt_gpu_check_opts co;
            rt_gpu_check_opts_default(&co);
            co.n_tokens = (uint32_t)a.check;
            if (a.fast || a.kv_cache > 1) { /* bf16/f16 rounding: the float32 tolerances would not hold */
                co.tol_stage = 5e-2;
                co.tol_logits = 5e-2;
                co.min_overlap = 0.9;
            }
            if ((st = rt_gpu_check_create(m, en.g, &co, &en.chk, &e))) { rc = fail(&e, st, "check"); goto out; }
        }
    }
#endif
    double t_load = now_s() - t0;

    if (a.tokens) {
        if (!parse_ids(a.tokens, &ids, &n_ids)) {
            fprintf(stderr, "glm5-run: --tokens: expected comma-separated non-negative ids\n");
            rc = 2;
            goto out;
        }
    } else {
        const char *src = a.prompt;
        size_t len = strlen(src);
        if (a.chat) {
            chat_message msgs[2];
            size_t nm = 0;
            if (a.system) msgs[nm++] = (chat_message){"system", a.system};
            msgs[nm++] = (chat_message){"user", a.prompt};
            chat_options co;
            chat_options_default(&co);
            co.enable_thinking = a.think;
            size_t cap = strlen(a.prompt) + (a.system ? strlen(a.system) : 0) + 256, need = 0;
            for (int tries = 0; tries < 2; tries++) {
                free(text);
                text = malloc(cap);
                if (!text) { fprintf(stderr, "glm5-run: out of memory\n"); goto out; }
                st = chat_build_prompt(msgs, nm, &co, text, cap, &need, &e);
                if (st != G5_ERR_BOUNDS) break;
                cap = need;
            }
            if (st) { rc = fail(&e, st, "chat prompt"); goto out; }
            src = text;
            len = need;
        }
        ids = malloc((len ? len : 1) * sizeof *ids);
        if (!ids) { fprintf(stderr, "glm5-run: out of memory\n"); goto out; }
        if ((st = tok_encode(tok, src, len, 1, ids, len, &n_ids, &e))) { rc = fail(&e, st, "tokenize"); goto out; }
    }
    if (n_ids == 0) {
        fprintf(stderr, "glm5-run: the prompt is empty\n");
        rc = 2;
        goto out;
    }
    for (size_t i = 0; i < n_ids; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= hp->n_vocab) {
            fprintf(stderr, "glm5-run: token id %d is outside the vocabulary (%u)\n", ids[i], hp->n_vocab);
            rc = 2;
            goto out;
        }
    if (n_ids > UINT32_MAX / 2) { fprintf(stderr, "glm5-run: prompt too long\n"); rc = 2; goto out; }

    const size_t V = hp->n_vocab;
    logits = malloc((a.dump_logits ? n_ids : 1) * V * sizeof(float));
    if (!logits) { fprintf(stderr, "glm5-run: out of memory for %zu x %zu logits\n", n_ids, V); goto out; }
    if ((st = rt_state_create(m, &s, &e))) { rc = fail(&e, st, "state"); goto out; }
    en.m = m;
    en.s = s;
    if (a.draft) {
        if (!rt_model_has_mtp(m) || rt_comm_size(comm) > 1) {
            fprintf(stderr, "glm5-run: --draft mtp needs a model with a NextN/MTP block and one process\n");
            rc = 2;
            goto out;
        }
        rt_draft_ops dops;
#ifdef G5_WITH_CUDA
        if (en.g) rt_gpu_draft_ops(en.g, &dops);
        else
#endif
            rt_draft_ops_cpu(m, s, &dops);
        if ((st = rt_drafter_create(&dops, &dr, &e))) { rc = fail(&e, st, "drafter"); goto out; }
    }
    if ((st = samp_create(&a.sp, hp->n_vocab, &samp, &e))) { rc = fail(&e, st, "sampler"); goto out; }
    if ((st = tok_stream_create(tok, 0, &stream, &e))) { rc = fail(&e, st, "decoder"); goto out; }
    if ((rc = agree(comm, 0, &n_synced))) goto out;
    rc = 1;
    if (rt_comm_size(comm) > 1 && (rc = share_prompt(comm, &ids, &n_ids, &all_logits, &logits, hp->n_vocab))) {
        unclean = 1;
        goto out;
    }
    rc = 1;

    double t1 = now_s();
    st = dr ? rt_drafter_prompt(dr, ids, (uint32_t)n_ids, logits, all_logits, &e)
            : eng_forward(&en, ids, (uint32_t)n_ids, logits, all_logits, &e);
    if (st) { rc = fail(&e, st, "prompt"); unclean = 1; goto out; }
    double t_prompt = now_s() - t1;
    if (!lead) { /* process 0 samples: feed what it broadcasts until it says stop */
        for (;;) {
            int32_t next;
            if ((st = rt_comm_bcast(comm, &next, sizeof next, 0, &e))) { rc = fail(&e, st, "token broadcast"); unclean = 1; goto out; }
            if (next < 0) {
                rc = next == -1 ? 0 : 1; /* -2: process 0 failed and said why */
                goto out;
            }
            if ((st = eng_forward(&en, &next, 1, logits, 0, &e))) { rc = fail(&e, st, "decode step"); unclean = 1; goto out; }
        }
    }
    bc_open = rt_comm_size(comm) > 1;
    if (a.dump_logits && !dump_logits(a.dump_logits, logits, n_ids * V)) goto out;
    for (size_t i = 0; i < n_ids; i++) samp_accept(samp, ids[i]);
    const float *last = logits + (a.dump_logits ? (n_ids - 1) * V : 0);

    size_t gen_len = 0, gen_cap = 4096, printed = 0;
    gen = malloc(gen_cap);
    if (!gen) goto out;
    long n_gen = 0;
    int stopped = 0;
    double t2 = now_s();
    while (n_gen < a.n_predict && !stopped) {
        int32_t id;
        if ((st = samp_sample(samp, last, &id, &e))) { rc = fail(&e, st, "sampling"); goto out; }
        if (tok_is_eog(tok, id)) break;
        samp_accept(samp, id);
        n_gen++;
        if (a.ids) {
            printf(n_gen > 1 ? " %d" : "%d", id);
            fflush(stdout);
        }
        const char *bytes;
        size_t nb;
        if ((st = tok_stream_push(stream, id, &bytes, &nb, &e))) { rc = fail(&e, st, "decode"); goto out; }
        if (gen_len + nb > gen_cap) {
            while (gen_len + nb > gen_cap) gen_cap *= 2;
            char *q = realloc(gen, gen_cap);
            if (!q) goto out;
            gen = q;
        }
        memcpy(gen + gen_len, bytes, nb);
        gen_len += nb;
        size_t pos;
        if (a.n_stops && samp_stop_find(gen, gen_len, nb, a.stops, a.n_stops, &pos) >= 0) {
            gen_len = pos;
            stopped = 1;
        }
        size_t safe = gen_len - (stopped || !a.n_stops ? 0 : samp_stop_holdback(gen, gen_len, a.stops, a.n_stops));
        if (!a.ids && safe > printed) {
            fwrite(gen + printed, 1, safe - printed, stdout);
            fflush(stdout);
            printed = safe;
        }
        if (stopped || n_gen == a.n_predict) break;
        if (bc_open && (st = rt_comm_bcast(comm, &id, sizeof id, 0, &e))) { rc = fail(&e, st, "token broadcast"); unclean = 1; goto out; }
        st = dr ? rt_drafter_step(dr, id, logits, &e) : eng_forward(&en, &id, 1, logits, 0, &e);
        if (st) { rc = fail(&e, st, "decode step"); unclean = 1; goto out; }
        last = logits;
    }
    if (!stopped) {
        const char *bytes;
        size_t nb;
        tok_stream_flush(stream, &bytes, &nb);
        if (!a.ids) {
            fwrite(gen + printed, 1, gen_len - printed, stdout);
            fwrite(bytes, 1, nb, stdout);
        }
    }
    if (a.ids || n_gen) fputc('\n', stdout);
    fflush(stdout);
    double t_gen = now_s() - t2;
    if (!a.quiet)
        fprintf(stderr,
                "glm5-run: %s on %s, %u rank%s (%u process%s), %u threads; load %.2f s; prompt %zu tokens in %.2f s "
                "(%.1f tok/s); generated %ld tokens in %.2f s (%.2f tok/s)\n",
                rt_wset_source(ws), a.cuda ? "cuda" : "cpu", rt_model_n_ranks(m), rt_model_n_ranks(m) > 1 ? "s" : "",
                rt_comm_size(comm), rt_comm_size(comm) > 1 ? "es" : "",
                rt_model_n_threads(m), t_load, n_ids, t_prompt, n_ids / (t_prompt > 0 ? t_prompt : 1e-9),
                n_gen, t_gen, n_gen / (t_gen > 0 ? t_gen : 1e-9));
    if (dr && !a.quiet) {
        rt_draft_stats ds;
        rt_drafter_get_stats(dr, &ds);
        fprintf(stderr, "glm5-run: draft mtp: %llu drafted, %llu accepted (%.1f%%); %llu main forward calls for %ld "
                "generated tokens\n", (unsigned long long)ds.drafted, (unsigned long long)ds.accepted,
                ds.drafted ? 100.0 * (double)ds.accepted / (double)ds.drafted : 0.0, (unsigned long long)ds.forwards, n_gen);
    }
    rc = 0;
#ifdef G5_WITH_CUDA
    if (en.chk) {
        rt_gpu_check_summary cs;
        rt_gpu_check_get_summary(en.chk, &cs);
        fprintf(stderr, "glm5-run: check %s over %u tokens: stage max rel diff attn %.3e moe %.3e, layer %.3e, "
                "logits rel L2 %.3e, top-k overlap >= %.4f", cs.ok ? "PASSED" : "FAILED", cs.n_tokens,
                cs.max_stage_attn, cs.max_stage_ffn, cs.max_layer, cs.logits_rel_l2, cs.min_overlap_mean);
        if (cs.mtp_n) fprintf(stderr, ", MTP draft logits rel L2 %.3e over %u positions", cs.mtp_rel_l2, cs.mtp_n);
        fputc('\n', stderr);
        if (!cs.ok) rc = 3;
    }
#endif
out:
    if (unclean && rt_comm_size(comm) > 1) {
        fflush(stdout);
        fflush(stderr);
        rt_comm_abort(comm, rc);
    }
    if (bc_open) { /* the others wait for a token: tell them to stop */
        int32_t stop = rc ? -2 : -1;
        if ((st = rt_comm_bcast(comm, &stop, sizeof stop, 0, &e)) && !rc) rc = fail(&e, st, "token broadcast");
    }
    while (n_synced < N_SYNC) rc = agree(comm, rc ? rc : 1, &n_synced);
#ifdef G5_WITH_CUDA
    rt_gpu_check_free(en.chk);
#endif
    rt_drafter_free(dr); /* before the models its operations use */
#ifdef G5_WITH_CUDA
    rt_gpu_model_free(en.g);
#endif
    free(gen);
    free(text);
    free(logits);
    free(ids);
    tok_stream_free(stream);
    samp_free(samp);
    tok_free(tok);
    rt_state_free(s);
    rt_model_free(m);
    rt_wset_free(ws);
    rt_comm_free(comm);
    return rc;
}
