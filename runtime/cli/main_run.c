/* glm5-run: runs GLM-5 from a blob set (any TP degree) or a GGUF (TP = 1) on the CPU.
 *
 *   glm5-run -m BLOBDIR|MODEL.gguf (-p TEXT | -f FILE | --tokens ID,ID,...) [options]
 *
 * Streams the generated text to stdout (or the ids with --ids); timing goes to stderr.
 * --dump-logits FILE writes the logits of every prompt position as little-endian float32
 * [n_prompt_tokens, n_vocab] (temporary file, fsync, rename). Exit status: 0 success, 1
 * --check found a difference past tolerance, 2 a usage error (a prompt past the context
 * included), 3 an error (its message on stderr: unreadable, corrupt or refused model files, I/O,
 * a failure while running).
 *
 * --device cuda needs the CUDA build (build/gpu/bin/glm5-run, `make gpu`, which defines
 * G5_WITH_CUDA); --check N runs the CPU reference beside the GPU for the first N tokens. Every
 * forward call goes through the engine (runtime/engine.h), on either device; the options through
 * the programs' shared parser (format/args.h).
 *
 * Under a launcher (`mpirun -np P`, `srun -n P`; comm.h) each of the P processes opens and runs
 * T / P of the blob set's T ranks (the other ranks' files may be absent on its node); they agree
 * on success before the first forward pass (every process exits with the first failing one's
 * status), process 0 samples each token and broadcasts it, and only process 0 prints the output
 * and timing and writes --dump-logits. Errors are prefixed "rank P:" (the process). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "format/args.h"
#include "format/blob.h"
#include "format/glm5.h"
#include "format/mapguard.h"
#include "format/version.h"
#include "runtime/cpu/comm.h"
#include "runtime/cpu/weights.h"
#include "runtime/draft.h"
#include "runtime/engine.h"
#include "runtime/text/chat.h"
#include "runtime/text/sample.h"
#include "runtime/text/tokenizer.h"

#define MAX_STOPS 16

/* Exit status, the same table as glm5-shard's and glm5-serve's (README "Commands"): 0 success,
 * 1 a check failed (--check past tolerance), 2 usage (also a prompt past the context), 3 an
 * error (unreadable, corrupt or refused input, I/O, a failure while running). */
#define EXIT_CHECK 1
#define EXIT_USAGE 2
#define EXIT_ERR 3

/* Prompt tokens per forward call: the GPU's work buffers (attention scores, expert rows) are
 * sized by the call, so a 128k-token prompt runs in calls of this many tokens. */
#define DEFAULT_PREFILL_CHUNK 4096

typedef struct args {
    const char *model;
    const char *prompt;
    const char *prompt_file;   /* -f FILE ("-": stdin) */
    char *prompt_text;         /* its contents (freed at exit) */
    const char *tokens;
    const char *system;
    const char *dump_logits;
    int64_t n_predict;
    int chat, think, ids, quiet;
    int cuda, fast, no_verify, kv_cache, cuda_graph, nccl;
    int products;                /* --products: 1 fp16 (rt_eng_opts.h16_products) */
    int64_t check, tp, gpu0;
    int64_t ctx_size;            /* --ctx-size (0: the model's context_length) */
    int truncate;                /* --truncate: cut a prompt past the context to its end */
    int64_t prefill_chunk;       /* --prefill-chunk: most prompt tokens per forward call */
    int draft;                   /* --draft mtp */
    int64_t threads;             /* 0: online cores */
    int mla;                     /* rt_mla_mode */
    samp_params sp;
    const char *stops[MAX_STOPS];
    size_t n_stops;
} args;

static void usage(FILE *f) {
    fprintf(f,
            "usage: glm5-run -m BLOBDIR|MODEL.gguf (-p TEXT | -f FILE | --tokens ID,ID,...) [options]\n"
            "  -m PATH              a blob set directory (glm5-shard convert) or a GGUF (TP 1)\n"
            "  -f FILE              the prompt is FILE's text (\"-\": standard input), as with -p\n"
            "  --version            print the version and exit\n"
            "  --device cpu|cuda    where to run (cuda: the CUDA build, build/gpu/bin/glm5-run)\n"
            "  --tp N               tensor-parallel ranks: must equal the blob set's (a GGUF is\n"
            "                       TP 1: `glm5-shard convert --tp N` first). With --device cuda\n"
            "                       rank r runs on GPU (gpu0 + r) %% n_gpus, all ranks started by\n"
            "                       this process, NCCL between distinct GPUs; under mpirun/srun\n"
            "                       (P processes) local rank i of the process with node index L\n"
            "                       on GPU (gpu0 + L * T/P + i) %% n_gpus, NCCL, one GPU per rank\n"
            "  --gpu0 K             first CUDA device (default 0)\n"
            "  --precision precise|fast  GPU arithmetic (precise: float32 activations and cache;\n"
            "                       fast: f16 latent cache; see specs/numerics.md)\n"
            "  --kv-cache f32|bf16|f16  GPU latent cache type (default f32 precise, f16 fast)\n"
            "  --products int8|fp16  GPU fast mode's attention and dense products: int8 (default,\n"
            "                       the fastest single stream) or fp16, glm5-serve's with\n"
            "                       --max-batch > 1 (then the same tokens as that server)\n"
            "  --cuda-graph on|off   GPU decode steps as CUDA graph launches (the same tokens as plain\n"
            "                       launches; default on in one process, off under mpirun/srun\n"
            "                       and with --collective nccl, where graphs have not run yet)\n"
            "  --collective auto|nccl  GPU: between ranks (auto: none for one rank, a device-side\n"
            "                       sum on one GPU, NCCL across GPUs; nccl: also for TP 1)\n"
            "  --check N            GPU: run the CPU reference beside it for the first N tokens,\n"
            "                       print per layer/stage differences (and the MTP block's\n"
            "                       draft logits); exit 1 past tolerance\n"
            "  --no-verify          skip the blob checksums while loading (CPU and GPU)\n"
            "  -p, --prompt TEXT    prompt text (special tokens such as [gMASK] are recognized)\n"
            "  --tokens IDS         prompt token ids, comma-separated\n"
            "  --chat               wrap the prompt as a user message in GLM's chat format\n"
            "  --system TEXT        system message (with --chat)\n"
            "  --no-think           chat: thinking off\n"
            "  -n N                 tokens to generate (default 64; 0: only evaluate the prompt);\n"
            "                       generation stops at the context length\n"
            "  --ctx-size N         context length, at most the model's context_length (default:\n"
            "                       that); a longer prompt is refused (exit 2) unless --truncate\n"
            "  --truncate           keep the end of a prompt past the context (leaving room for\n"
            "                       min(-n, context/2) generated tokens)\n"
            "  --prefill-chunk N    run the prompt in forward calls of at most N tokens, each\n"
            "                       appending to the cache, so a long prompt's work buffers stay\n"
            "                       those of N tokens (default 4096; the GPU's bits depend on the\n"
            "                       split: specs/numerics.md)\n"
            "  --draft mtp|none     speculative decoding drafting one token per step with the MTP\n"
            "                       block, verified by a two-token forward pass (greedy: kept when it\n"
            "                       is the argmax; sampling: speculative sampling, so the output\n"
            "                       distribution is the model's); prints the acceptance rate (one\n"
            "                       process only; default none)\n"
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

/* The whole of FILE ("-": standard input) as a string; NULL (message printed) if it cannot be
 * read or holds a NUL byte. */
static char *read_prompt(const char *path) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) {
        fprintf(stderr, "glm5-run: -f %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    for (;;) {
        if (b && n + 1 >= cap) {
            char *q = cap < ((size_t)1 << 31) ? realloc(b, cap * 2) : NULL;
            if (!q) {
                free(b);
                b = NULL;
            }
            b = q;
            cap *= 2;
        }
        if (!b) break;
        size_t k = fread(b + n, 1, cap - n - 1, f);
        n += k;
        if (k == 0) break;
    }
    int err = ferror(f);
    if (f != stdin) fclose(f);
    if (!b || err || memchr(b, 0, n)) {
        fprintf(stderr, "glm5-run: -f %s: %s\n", path, !b ? "out of memory" : err ? "read error" : "the file holds a NUL byte");
        free(b);
        return NULL;
    }
    b[n] = 0;
    return b;
}

/* 1 ok, 0 usage error (printed), -1 help, -2 version. */
static int parse_args(int argc, char **argv, args *a) {
    memset(a, 0, sizeof *a);
    a->n_predict = 64;
    a->prefill_chunk = DEFAULT_PREFILL_CHUNK;
    a->think = 1;
    a->cuda_graph = -1; /* main: on for one process without --collective nccl */
    a->mla = RT_MLA_ABSORBED;
    samp_params_default(&a->sp);
    int64_t top_k = a->sp.top_k, last_n = a->sp.repeat_last_n;
    int no_think = 0, version = 0;
    static const char *const devices[] = {"cpu", "cuda", NULL}, *const precisions[] = {"precise", "fast", NULL};
    static const char *const onoff[] = {"off", "on", NULL}, *const caches[] = {"f32", "bf16", "f16", NULL};
    static const char *const drafts[] = {"none", "mtp", NULL}, *const mlas[] = {"absorbed", "expanded", NULL};
    static const char *const colls[] = {"auto", "nccl", NULL}, *const prods[] = {"int8", "fp16", NULL};
    static const int v01[] = {0, 1}, v123[] = {1, 2, 3}, vmla[] = {RT_MLA_ABSORBED, RT_MLA_EXPANDED};
    const g5_arg tab[] = {
        {.name = "--model", .alias = "-m", .kind = G5_ARG_STR, .dst = &a->model},
        {.name = "--device", .kind = G5_ARG_CHOICE, .dst = &a->cuda, .choices = devices, .values = v01},
        {.name = "--tp", .kind = G5_ARG_INT, .dst = &a->tp, .lo = 1, .hi = 4096},
        {.name = "--gpu0", .kind = G5_ARG_INT, .dst = &a->gpu0, .lo = 0, .hi = 4095},
        {.name = "--precision", .kind = G5_ARG_CHOICE, .dst = &a->fast, .choices = precisions, .values = v01},
        {.name = "--cuda-graph", .kind = G5_ARG_CHOICE, .dst = &a->cuda_graph, .choices = onoff, .values = v01},
        {.name = "--collective", .kind = G5_ARG_CHOICE, .dst = &a->nccl, .choices = colls, .values = v01},
        {.name = "--kv-cache", .kind = G5_ARG_CHOICE, .dst = &a->kv_cache, .choices = caches, .values = v123},
        {.name = "--products", .kind = G5_ARG_CHOICE, .dst = &a->products, .choices = prods, .values = v01},
        {.name = "--draft", .kind = G5_ARG_CHOICE, .dst = &a->draft, .choices = drafts, .values = v01},
        {.name = "--check", .kind = G5_ARG_INT, .dst = &a->check, .lo = 0, .hi = INT32_MAX},
        {.name = "--no-verify", .kind = G5_ARG_FLAG, .dst = &a->no_verify},
        {.name = "--ctx-size", .alias = "-c", .kind = G5_ARG_INT, .dst = &a->ctx_size, .lo = 1, .hi = INT32_MAX},
        {.name = "--truncate", .kind = G5_ARG_FLAG, .dst = &a->truncate},
        {.name = "--prefill-chunk", .kind = G5_ARG_INT, .dst = &a->prefill_chunk, .lo = 1, .hi = INT32_MAX},
        {.name = "--prompt", .alias = "-p", .kind = G5_ARG_STR, .dst = &a->prompt},
        {.name = "--file", .alias = "-f", .kind = G5_ARG_STR, .dst = &a->prompt_file},
        {.name = "--version", .kind = G5_ARG_FLAG, .dst = &version},
        {.name = "--tokens", .kind = G5_ARG_STR, .dst = &a->tokens},
        {.name = "--system", .kind = G5_ARG_STR, .dst = &a->system},
        {.name = "--chat", .kind = G5_ARG_FLAG, .dst = &a->chat},
        {.name = "--no-think", .kind = G5_ARG_FLAG, .dst = &no_think},
        {.name = "--n-predict", .alias = "-n", .kind = G5_ARG_INT, .dst = &a->n_predict, .lo = 0, .hi = INT32_MAX},
        {.name = "--temp", .kind = G5_ARG_FLOAT, .dst = &a->sp.temperature, .flo = 0, .fhi = 1e6},
        {.name = "--top-k", .kind = G5_ARG_INT, .dst = &top_k, .lo = 0, .hi = INT32_MAX},
        {.name = "--top-p", .kind = G5_ARG_FLOAT, .dst = &a->sp.top_p, .flo = 0, .fhi = 1},
        {.name = "--min-p", .kind = G5_ARG_FLOAT, .dst = &a->sp.min_p, .flo = 0, .fhi = 1},
        {.name = "--repeat-penalty", .kind = G5_ARG_FLOAT, .dst = &a->sp.repeat_penalty, .flo = 1e-6, .fhi = 1e6},
        {.name = "--repeat-last-n", .kind = G5_ARG_INT, .dst = &last_n, .lo = 0, .hi = INT32_MAX},
        {.name = "--seed", .kind = G5_ARG_U64, .dst = &a->sp.seed},
        {.name = "--stop", .kind = G5_ARG_LIST, .dst = a->stops, .count = &a->n_stops, .max = MAX_STOPS},
        {.name = "--ids", .kind = G5_ARG_FLAG, .dst = &a->ids},
        {.name = "--dump-logits", .kind = G5_ARG_STR, .dst = &a->dump_logits},
        {.name = "--threads", .alias = "-t", .kind = G5_ARG_INT, .dst = &a->threads, .lo = 1, .hi = 1024},
        {.name = "--mla", .kind = G5_ARG_CHOICE, .dst = &a->mla, .choices = mlas, .values = vmla},
        {.name = "--quiet", .alias = "-q", .kind = G5_ARG_FLAG, .dst = &a->quiet},
    };
    char msg[512];
    g5_args_result r = g5_args_parse(tab, sizeof tab / sizeof tab[0], argc, argv, 1, NULL, 0, NULL, msg, sizeof msg);
    if (r == G5_ARGS_HELP) return -1;
    if (r) {
        fprintf(stderr, "glm5-run: %s\n", msg);
        return 0;
    }
    if (version) return -2;
    a->sp.top_k = (int32_t)top_k;
    a->sp.repeat_last_n = (int32_t)last_n;
    if (no_think) a->think = 0;
    if (!a->model) { fprintf(stderr, "glm5-run: -m is required\n"); return 0; }
    if (a->prompt_file && a->prompt) { fprintf(stderr, "glm5-run: give one of -p and -f\n"); return 0; }
    if (a->prompt_file && !(a->prompt = a->prompt_text = read_prompt(a->prompt_file))) return 0;
    if (!!a->prompt == !!a->tokens) { fprintf(stderr, "glm5-run: give exactly one of -p, -f and --tokens\n"); return 0; }
    if (a->chat && !a->prompt) { fprintf(stderr, "glm5-run: --chat needs -p\n"); return 0; }
    if (a->cuda && !rt_eng_cuda_available()) {
        fprintf(stderr, "glm5-run: this build has no CUDA; use build/gpu/bin/glm5-run (make gpu)\n");
        return 0;
    }
    if (a->check && !a->cuda) { fprintf(stderr, "glm5-run: --check compares the GPU with the CPU: needs --device cuda\n"); return 0; }
    if (a->draft && a->check) { fprintf(stderr, "glm5-run: --draft mtp and --check cannot be combined\n"); return 0; }
    if (a->products && !(a->cuda && a->fast)) {
        fprintf(stderr, "glm5-run: --products fp16 chooses GPU fast mode's products: needs --device cuda --precision fast\n");
        return 0;
    }
    return 1;
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
    return EXIT_ERR;
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
            return EXIT_ERR;
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
static int open_weights(const args *a, rt_comm *comm, rt_wset **ws, rt_wset_load_info *li) {
    g5_error e = {0};
    g5_status st;
    const uint32_t P = rt_comm_size(comm);
    /* the GPU loader verifies the blobs itself as it streams them */
    rt_wset_opts wo = {.no_verify = a->no_verify || a->cuda, .jobs = a->threads};
    if (P == 1) {
        if ((st = rt_wset_open_ex(a->model, &wo, ws, li, &e))) return fail(&e, st, a->model);
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
        fprintf(stderr, "glm5-run: %s--tp %ld: %s holds %u rank%s (blobs)\n", g_who, (long)a->tp, a->model, T, T > 1 ? "s" : "");
        return 2;
    }
    uint32_t first, count;
    if ((st = rt_comm_ranks(comm, T, &first, &count, &e))) {
        fprintf(stderr, "glm5-run: %s%s holds %u rank%s, which %u processes cannot share evenly (T %% P = %u %% %u = %u); "
                "start a number of processes that divides %u, or convert with --tp a multiple of %u\n",
                g_who, a->model, T, T > 1 ? "s" : "", P, T, P, T % P, T, P);
        return 2;
    }
    wo.first = first;
    wo.count = count;
    if ((st = rt_wset_open_ex(a->model, &wo, ws, li, &e))) return fail(&e, st, a->model);
    return 0;
}

/* The context: the model's context_length, or --ctx-size below it. A prompt past it is refused
 * with both numbers (or, with --truncate, cut to its end); generation is bounded to what is
 * left. 0, or the exit status. */
static int fit_context(args *a, const glm5_hparams *hp, int32_t *ids, size_t *n_ids) {
    const uint64_t model_ctx = hp->n_ctx_train;
    if (a->ctx_size && model_ctx && (uint64_t)a->ctx_size > model_ctx) {
        fprintf(stderr, "glm5-run: --ctx-size %ld exceeds the model's context length %llu\n", a->ctx_size,
                (unsigned long long)model_ctx);
        return 2;
    }
    const uint64_t ctx = a->ctx_size ? (uint64_t)a->ctx_size : model_ctx;
    if (!ctx) return 0; /* the model states none */
    const char *src = a->ctx_size ? "--ctx-size" : "the model's context_length";
    if (*n_ids > ctx) {
        if (!a->truncate) {
            fprintf(stderr, "glm5-run: the prompt has %zu tokens; the context length is %llu (%s): shorten it, or "
                    "--truncate to keep its end\n", *n_ids, (unsigned long long)ctx, src);
            return 2;
        }
        uint64_t room = (uint64_t)a->n_predict < ctx / 2 ? (uint64_t)a->n_predict : ctx / 2;
        size_t keep = (size_t)(ctx - room);
        fprintf(stderr, "glm5-run: --truncate: the prompt of %zu tokens cut to its last %zu (context length %llu, %s)\n",
                *n_ids, keep, (unsigned long long)ctx, src);
        memmove(ids, ids + (*n_ids - keep), keep * sizeof *ids);
        *n_ids = keep;
    }
    if (*n_ids + (uint64_t)a->n_predict > ctx) {
        long left = (long)(ctx - *n_ids);
        if (!a->quiet)
            fprintf(stderr, "glm5-run: generation stops at the context length %llu (%s): at most %ld of -n %ld tokens\n",
                    (unsigned long long)ctx, src, left, a->n_predict);
        a->n_predict = left;
    }
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

/* The prompt in forward calls of at most `chunk` tokens (the last one's logits, or every
 * position's with all_logits: logits [n][V]), through the drafter when there is one. */
static g5_status prompt_chunks(rt_eng_seq *seq, rt_drafter *dr, const int32_t *ids, size_t n, size_t chunk,
                               float *logits, int all_logits, size_t V, g5_error *e) {
    for (size_t done = 0; done < n;) {
        const uint32_t c = (uint32_t)(n - done < chunk ? n - done : chunk);
        float *lg = all_logits ? logits + done * V : logits;
        const g5_status st = dr ? rt_drafter_prompt(dr, ids + done, c, lg, all_logits, e)
                                : rt_eng_prefill(seq, ids + done, c, &(rt_eng_out){.logits = lg, .all_logits = all_logits}, e);
        if (st) return st;
        done += c;
    }
    return G5_OK;
}

int main(int argc, char **argv) {
    g5_mapguard_install("glm5-run", EXIT_ERR); /* a weight file truncated under us: an error, never SIGBUS */
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
    if (pa == -2) {
        if (lead) g5_print_version(stdout, "glm5-run");
        rt_comm_free(comm);
        return 0;
    }
    if (pa <= 0) {
        if (lead) usage(pa < 0 ? stdout : stderr);
        free(a.prompt_text);
        rt_comm_free(comm);
        return pa < 0 ? 0 : 2;
    }
    if (a.cuda_graph < 0) a.cuda_graph = rt_comm_size(comm) == 1 && !a.nccl;
    /* CUDA graphs under NCCL (--collective nccl, or one rank per process under a launcher):
     * NCCL_GRAPH_MIXING_SUPPORT=0 before any communicator exists, a value the user set kept
     * (runtime/gpu/gpu_model.h, rt_gpu_model_create, says why) */
    if (a.cuda && a.cuda_graph) setenv("NCCL_GRAPH_MIXING_SUPPORT", "0", 0);
    int n_synced = 0;
    int bc_open = 0; /* process 0: the others wait for the next token */
    int unclean = 0; /* failed inside an exchange: the others may wait for this process forever */
    int all_logits = a.dump_logits != NULL;
    rt_wset *ws = NULL;
    rt_eng *en = NULL;
    rt_eng_seq *seq = NULL;
    tok_ctx *tok = NULL;
    tok_stream *stream = NULL;
    samp_ctx *samp = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    float *logits = NULL;
    char *text = NULL, *gen = NULL;
    int rc = EXIT_ERR;
    rt_drafter *dr = NULL;

    double t0 = now_s();
    rt_wset_load_info li = {0};
    if ((rc = open_weights(&a, comm, &ws, &li))) goto out;
    rc = EXIT_ERR;
    if (a.tp && (uint32_t)a.tp != rt_wset_n_ranks(ws)) {
        fprintf(stderr, "glm5-run: --tp %ld: %s holds %u rank%s (%s); write a TP %ld set with "
                "`glm5-shard convert --tp %ld -o DIR MODEL.gguf`\n", (long)a.tp, a.model, rt_wset_n_ranks(ws),
                rt_wset_n_ranks(ws) > 1 ? "s" : "", rt_wset_source(ws), (long)a.tp, (long)a.tp);
        rc = 2;
        goto out;
    }
    rt_eng_opts eo;
    rt_eng_opts_default(&eo);
    eo.device = a.cuda ? RT_ENG_CUDA : RT_ENG_CPU;
    eo.n_threads = (uint32_t)a.threads;
    eo.mla = (rt_mla_mode)a.mla;
    eo.comm = comm;
    eo.gpu0 = (int)a.gpu0;
    eo.precision = a.fast ? RT_ENG_FAST : RT_ENG_PRECISE;
    eo.cache = (rt_eng_cache)a.kv_cache; /* 0 default, 1 f32, 2 bf16, 3 f16 */
    eo.verify = !a.no_verify;
    eo.cuda_graph = a.cuda_graph;
    eo.h16_products = a.products;
    eo.collective_nccl = a.nccl;
    eo.check_tokens = (uint32_t)a.check;
    if (a.check && (a.fast || a.kv_cache > 1)) { /* bf16/f16 rounding: the float32 tolerances would not hold */
        eo.check_tol_stage = 5e-2;
        eo.check_tol_logits = 5e-2;
        eo.check_min_overlap = 0.9;
    }
    if ((st = rt_eng_create(ws, &eo, &en, &e))) { rc = fail(&e, st, "model"); goto out; }
    if ((st = tok_create(rt_wset_meta(ws), &tok, &e))) { rc = fail(&e, st, "tokenizer"); goto out; }
    if ((rc = agree(comm, 0, &n_synced))) goto out;
    rc = EXIT_ERR;
    const glm5_hparams *hp = rt_eng_hparams(en);
    if ((st = rt_eng_load(en, &e))) { rc = fail(&e, st, "engine"); goto out; }
    if (a.cuda && !a.quiet && lead) {
        char line[1024];
        rt_eng_describe(en, line, sizeof line);
        fprintf(stderr, "glm5-run: %s\n", line);
    }
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
            if (a.system) msgs[nm++] = (chat_message){.role = "system", .content = a.system};
            msgs[nm++] = (chat_message){.role = "user", .content = a.prompt};
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
    if ((rc = fit_context(&a, hp, ids, &n_ids))) goto out;
    rc = EXIT_ERR;

    const size_t V = hp->n_vocab;
    logits = malloc((a.dump_logits ? n_ids : 1) * V * sizeof(float));
    if (!logits) { fprintf(stderr, "glm5-run: out of memory for %zu x %zu logits\n", n_ids, V); goto out; }
    if ((st = rt_eng_seq_create(en, 0, &seq, &e))) { rc = fail(&e, st, "state"); goto out; }
    if (a.draft) {
        if (!rt_eng_has_mtp(en) || rt_comm_size(comm) > 1) {
            fprintf(stderr, "glm5-run: --draft mtp needs a model with a NextN/MTP block and one process\n");
            rc = 2;
            goto out;
        }
        if ((st = rt_drafter_create(seq, &dr, &e))) { rc = fail(&e, st, "drafter"); goto out; }
    }
    if ((st = samp_create(&a.sp, hp->n_vocab, &samp, &e))) { rc = fail(&e, st, "sampler"); goto out; }
    if (dr) rt_drafter_set_sampler(dr, samp); /* drafts drawn by the same chain they are verified with */
    if ((st = tok_stream_create(tok, 0, &stream, &e))) { rc = fail(&e, st, "decoder"); goto out; }
    if ((rc = agree(comm, 0, &n_synced))) goto out;
    rc = EXIT_ERR;
    if (rt_comm_size(comm) > 1 && (rc = share_prompt(comm, &ids, &n_ids, &all_logits, &logits, hp->n_vocab))) {
        unclean = 1;
        goto out;
    }
    rc = EXIT_ERR;

    /* CUDA, greedy with no penalty (decided from the options alone: every process must make the
     * same calls): each decode step gives the argmax and its logit computed on the GPU, not the
     * vocabulary's logits (rt_eng_decode_argmax); --check follows plain prefill calls */
    const int argmax_steps = a.cuda && !dr && !a.check && samp_params_argmax(&a.sp);
    /* else, one process drawing on its GPU (rt_eng_draws_on_device), with no draft or --check:
     * each decode step gives the token drawn there (penalties included), the sampler's random
     * number taken beforehand (rt_eng_decode_draw) */
    const int draw_steps = !argmax_steps && a.cuda && !dr && !a.check && rt_comm_size(comm) == 1 &&
                           rt_eng_draws_on_device(en) && samp_params_device(&a.sp, (uint32_t)V);
    samp_dev_row drow;
    int32_t pick = -1;
    float pick_logit = 0;
    double t1 = now_s();
    st = prompt_chunks(seq, dr, ids, n_ids, (size_t)a.prefill_chunk, logits, all_logits, V, &e);
    if (st) { rc = fail(&e, st, "prompt"); unclean = 1; goto out; }
    double t_prompt = now_s() - t1;
    if (!lead) { /* process 0 samples: feed what it broadcasts until it says stop */
        for (;;) {
            int32_t next;
            if ((st = rt_comm_bcast(comm, &next, sizeof next, 0, &e))) { rc = fail(&e, st, "token broadcast"); unclean = 1; goto out; }
            if (next < 0) {
                rc = next == -1 ? 0 : EXIT_ERR; /* -2: process 0 failed and said why */
                goto out;
            }
            st = argmax_steps ? rt_eng_decode_argmax(en, &seq, &next, 1, &pick, &pick_logit, &e)
                              : rt_eng_prefill(seq, &next, 1, &(rt_eng_out){.logits = logits}, &e);
            if (st) { rc = fail(&e, st, "decode step"); unclean = 1; goto out; }
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
    int stopped = 0, picked = 0; /* picked: the step gave pick, not logits (argmax_steps) */
    double t2 = now_s();
    while (n_gen < a.n_predict && !stopped) {
        int32_t id, x = -1;
        const float *q = dr ? rt_drafter_draft(dr, &x) : NULL; /* a draft pending verification */
        if (picked) { /* the sampler's token and its refusal, from the argmax or draw the step gave */
            id = pick;
            st = samp_argmax_check(draw_steps ? (pick >= 0 ? 0.0f : NAN) : pick_logit, &e);
            if (st && a.fast) snprintf(e.msg, sizeof e.msg, "%s", RT_ENG_FAST_RANGE_MSG);
        } else {
            st = q ? samp_sample_spec(samp, last, q, x, &id, NULL, &e) : samp_sample(samp, last, &id, &e);
            if (st && a.cuda && a.fast && !rt_eng_any_finite(last, V)) snprintf(e.msg, sizeof e.msg, "%s", RT_ENG_FAST_RANGE_MSG);
        }
        if (st) { rc = fail(&e, st, "sampling"); goto out; }
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
        if (draw_steps && !samp_device_row(samp, &drow)) st = g5_fail(&e, G5_ERR_INTERNAL, "device draw refused");
        else
            st = dr             ? rt_drafter_step(dr, id, logits, &e)
                 : argmax_steps ? rt_eng_decode_argmax(en, &seq, &id, 1, &pick, &pick_logit, &e)
                 : draw_steps   ? rt_eng_decode_draw(en, &seq, &id, 1, &drow, &pick, &e)
                                : rt_eng_prefill(seq, &id, 1, &(rt_eng_out){.logits = logits}, &e);
        if (st) { rc = fail(&e, st, "decode step"); unclean = 1; goto out; }
        picked = argmax_steps || draw_steps;
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
    char load_what[160];
    if (li.verified)
        snprintf(load_what, sizeof load_what, "checksums verified: %.3f GB in %.2f s, %u threads", li.bytes / 1e9,
                 li.seconds, li.jobs);
    else
        snprintf(load_what, sizeof load_what, "checksums %s", strcmp(rt_wset_source(ws), "blobs") ? "n/a (not a blob set)"
                 : a.cuda ? (a.no_verify ? "skipped (--no-verify)" : "verified by the GPU loader") : "skipped (--no-verify)");
    if (!a.quiet)
        fprintf(stderr,
                "glm5-run: %s on %s, %u rank%s (%u process%s), %u threads; load %.2f s (%s); prompt %zu tokens in %.2f s "
                "(%.1f tok/s); generated %ld tokens in %.2f s (%.2f tok/s)\n",
                rt_wset_source(ws), a.cuda ? "cuda" : "cpu", rt_eng_n_ranks(en), rt_eng_n_ranks(en) > 1 ? "s" : "",
                rt_comm_size(comm), rt_comm_size(comm) > 1 ? "es" : "",
                rt_eng_n_threads(en), t_load, load_what, n_ids, t_prompt, n_ids / (t_prompt > 0 ? t_prompt : 1e-9),
                n_gen, t_gen, n_gen / (t_gen > 0 ? t_gen : 1e-9));
    if (dr && !a.quiet) {
        rt_draft_stats ds;
        rt_drafter_get_stats(dr, &ds);
        fprintf(stderr, "glm5-run: draft mtp: %llu drafted, %llu accepted (%.1f%%); %llu main forward calls for %ld "
                "generated tokens\n", (unsigned long long)ds.drafted, (unsigned long long)ds.accepted,
                ds.drafted ? 100.0 * (double)ds.accepted / (double)ds.drafted : 0.0, (unsigned long long)ds.forwards, n_gen);
    }
    rc = 0;
    rt_eng_check_result cs;
    if (en && rt_eng_check_result_get(en, &cs)) {
        fprintf(stderr, "glm5-run: check %s over %u tokens: stage max rel diff attn %.3e moe %.3e, layer %.3e, "
                "logits rel L2 %.3e, head logits rel L2 %.3e, top-k overlap >= %.4f, experts differ at <= %u tokens a layer",
                cs.ok ? "PASSED" : "FAILED", cs.n_tokens, cs.max_stage_attn, cs.max_stage_ffn, cs.max_layer, cs.logits_rel_l2,
                cs.head_rel_l2, cs.min_overlap_mean, cs.max_exp_diff);
        if (cs.mtp_n)
            fprintf(stderr, ", MTP draft logits rel L2 %.3e over %u positions (argmax agrees at %u)", cs.mtp_rel_l2, cs.mtp_n,
                    cs.mtp_agree);
        fputc('\n', stderr);
        if (!cs.ok) rc = EXIT_CHECK;
    }
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
    while (n_synced < N_SYNC) rc = agree(comm, rc ? rc : EXIT_ERR, &n_synced);
    rt_drafter_free(dr); /* before the sequence it drafts for */
    rt_eng_seq_free(seq);
    rt_eng_free(en);
    free(gen);
    free(text);
    free(logits);
    free(ids);
    tok_stream_free(stream);
    samp_free(samp);
    tok_free(tok);
    rt_wset_free(ws);
    rt_comm_free(comm);
    free(a.prompt_text);
    return rc;
}
