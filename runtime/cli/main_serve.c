/* glm5-serve: OpenAI-compatible HTTP server for a GLM-5 blob set or GGUF (see runtime/serve/serve.h).
 *
 * Logs to stderr (the listening address first, then one line per request). Stops on SIGINT or
 * SIGTERM. Exit status (the table of glm5-shard and glm5-run): 0 after a signal, 2 on a usage
 * error or when a launcher (mpirun/srun) started several processes (one glm5-serve drives every
 * rank), 3 when the server cannot start or the model fails to load (a corrupt or refused set, a
 * weight file truncated under it). */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "format/args.h"
#include "format/mapguard.h"
#include "format/version.h"
#include "runtime/cpu/comm.h"
#include "runtime/serve/serve.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: glm5-serve -m BLOBDIR|MODEL.gguf [options]\n"
            "  -m, --model PATH     a blob set directory (glm5-shard convert) or a GGUF (TP 1)\n"
            "  --host H             address to listen on (default 127.0.0.1)\n"
            "  --port P             TCP port (default 8080; 0: any free port, logged at start)\n"
            "  --api-key K          require 'Authorization: Bearer K' (default: $GLM5_API_KEY if set)\n"
            "  --max-batch N        sequences decoded together (default 8)\n"
            "  --max-queue N        requests waiting for a slot before 429 (default 64)\n"
            "  --ctx-size N         cache tokens for all sequences together (cuda: per sequence);\n"
            "                       also the longest prompt + max_tokens of one request (default 4096)\n"
            "  --device cpu|cuda    where the model runs (cuda: the CUDA build, build/gpu/bin/glm5-serve;\n"
            "                       caches for --max-batch x --ctx-size positions are reserved at load)\n"
            "  --gpu0 K             first CUDA device (default 0)\n"
            "  --precision precise|fast  GPU arithmetic, as glm5-run (default precise)\n"
            "  --kv-cache f32|bf16|f16  GPU latent cache type (default f32 precise, f16 fast)\n"
            "  --no-verify          skip the blob checksums while loading (CPU and GPU)\n"
            "  --cuda-graph on|off   GPU: decode steps (batched ones too) as CUDA graph launches\n"
            "                       (default on; the same tokens as plain launches; off where one\n"
            "                       process drives several GPUs through NCCL)\n"
            "  --block-tokens N     tokens per cache block (default 16)\n"
            "  --threads N          model threads (default: online cores)\n"
            "  --draw-threads N     threads drawing a decode step's sampled tokens, the engine's\n"
            "                       included (default: online cores / 2, at most 8; 1: serial)\n"
            "  --prefill-chunk N    most prompt tokens a sequence runs per engine step; the decode\n"
            "                       steps of the others run between its chunks (default 256); cuda:\n"
            "                       whole --gpu-prefix-block blocks (N rounded down, at least one\n"
            "                       block), giving the bits of the whole prompt at once (with\n"
            "                       --gpu-prefix-block 0: the whole prompt in one step)\n"
            "  --max-body BYTES     request body limit (default 1048576)\n"
            "  --max-connections N  simultaneous connections, one thread each (default 512, at least\n"
            "                       max-batch + max-queue + 32; raise `ulimit -n` to go far above)\n"
            "  --max-connections-per-ip N  from one address (default 256)\n"
            "  --timeout S          close a connection idle (or sending its request) this long\n"
            "                       (default 30; 0: never); not counted while waiting for the model\n"
            "  --name ID, --alias ID  model id reported by the API (default: the file's base name);\n"
            "                       a request naming another model gets 404\n"
            "  --cors ORIGIN        CORS headers for browsers at ORIGIN (\"*\": any); OPTIONS\n"
            "                       preflights answered (default: none)\n"
            "  --no-prefix-cache    do not reuse cache blocks of earlier prompts\n"
            "  --gpu-prefix-cache-mb N  cuda: device memory per rank for the prefix store, copies of\n"
            "                       earlier prompts' cache blocks (default 2048; 0: none)\n"
            "  --gpu-prefix-block N cuda: tokens per prefix block; prompts are prefilled in calls ending\n"
            "                       at its multiples, with or without the store (default 256; 0: one\n"
            "                       call per prompt, no prefix cache)\n"
            "  --draft mtp|none     speculative decoding with the model's NextN/MTP block: one draft\n"
            "                       token per sequence and step, verified in the batched step (greedy:\n"
            "                       kept when it is the argmax; sampled: speculative sampling, the\n"
            "                       model's distribution); counters in /metrics; turns the prefix\n"
            "                       cache off (default none)\n"
            "  --version            print the version and exit\n"
            "  --no-prefault        do not read all weight pages at load\n"
            "  --no-warmup          cuda: do not run a prompt chunk and decode steps at load (they\n"
            "                       set up kernels, buffers and graphs the first requests would)\n");
}

static void log_line(void *user, const char *line) {
    (void)user;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    localtime_r(&tv.tv_sec, &tm);
    char ts[32];
    strftime(ts, sizeof ts, "%Y-%m-%d %H:%M:%S", &tm);
    fprintf(stderr, "%s.%03ld glm5-serve: %s\n", ts, (long)(tv.tv_usec / 1000), line);
}

int main(int argc, char **argv) {
    g5_mapguard_install("glm5-serve", 3); /* a weight file truncated under us: an error, never SIGBUS */
    {
        /* several processes (mpirun/srun) would each serve the whole model: not supported */
        rt_comm *comm = NULL;
        g5_error ce = {0};
        rt_comm_env cenv;
        rt_comm_env_read(&cenv, getenv);
        g5_status cst = rt_comm_create(&cenv, &argc, &argv, &comm, &ce);
        uint32_t np = rt_comm_size(comm);
        rt_comm_free(comm);
        if (cst || np > 1) {
            fprintf(stderr, "glm5-serve: %s; run one glm5-serve process (it drives every rank of the set)\n",
                    cst ? ce.msg : "started as one of several processes by a launcher");
            return 2;
        }
    }
    srv_config c;
    srv_config_default(&c);
    c.log = log_line;
    c.api_key = getenv("GLM5_API_KEY");
    int64_t port = c.port, max_batch = c.max_batch, max_queue = c.max_queue, ctx = c.ctx_size;
    int64_t block = c.block_tokens, threads = c.n_threads, body = (int64_t)c.max_body, gpu0 = c.gpu0;
    int64_t draw_threads = c.draw_threads;
    int64_t max_conn = c.max_connections, max_per_ip = c.max_per_ip, timeout = c.timeout_s;
    int64_t gpu_pfx_mb = c.gpu_prefix_cache_mb, gpu_pfx_block = c.gpu_prefix_block, chunk = c.prefill_chunk;
    int device = (int)c.device, version = 0;
    static const char *const devices[] = {"cpu", "cuda", NULL}, *const precisions[] = {"precise", "fast", NULL};
    static const char *const caches[] = {"f32", "bf16", "f16", NULL}, *const drafts[] = {"none", "mtp", NULL};
    static const char *const onoff[] = {"off", "on", NULL};
    static const int vdev[] = {SRV_DEVICE_CPU, SRV_DEVICE_CUDA}, v01[] = {0, 1};
    static const int vcache[] = {1, 2, 3}; /* srv_config.gpu_kv_cache: 1 f32, 2 bf16, 3 f16 */
    const g5_arg tab[] = {
        {.name = "--model", .alias = "-m", .kind = G5_ARG_STR, .dst = &c.model_path},
        {.name = "--host", .kind = G5_ARG_STR, .dst = &c.host},
        {.name = "--port", .kind = G5_ARG_INT, .dst = &port, .lo = 0, .hi = 65535},
        {.name = "--api-key", .kind = G5_ARG_STR, .dst = &c.api_key},
        {.name = "--max-batch", .kind = G5_ARG_INT, .dst = &max_batch, .lo = 1, .hi = 4096},
        {.name = "--max-queue", .kind = G5_ARG_INT, .dst = &max_queue, .lo = 1, .hi = 1000000},
        {.name = "--ctx-size", .alias = "-c", .kind = G5_ARG_INT, .dst = &ctx, .lo = 2, .hi = 1l << 30},
        {.name = "--block-tokens", .kind = G5_ARG_INT, .dst = &block, .lo = 1, .hi = 65536},
        {.name = "--threads", .alias = "-t", .kind = G5_ARG_INT, .dst = &threads, .lo = 0, .hi = 4096},
        {.name = "--draw-threads", .kind = G5_ARG_INT, .dst = &draw_threads, .lo = 1, .hi = 256},
        {.name = "--prefill-chunk", .kind = G5_ARG_INT, .dst = &chunk, .lo = 1, .hi = INT32_MAX},
        {.name = "--max-connections", .kind = G5_ARG_INT, .dst = &max_conn, .lo = 1, .hi = 1000000},
        {.name = "--max-connections-per-ip", .kind = G5_ARG_INT, .dst = &max_per_ip, .lo = 1, .hi = 1000000},
        {.name = "--timeout", .kind = G5_ARG_INT, .dst = &timeout, .lo = 0, .hi = 1000000},
        {.name = "--max-body", .kind = G5_ARG_INT, .dst = &body, .lo = 1024, .hi = 1l << 30},
        {.name = "--name", .alias = "--alias", .kind = G5_ARG_STR, .dst = &c.model_name},
        {.name = "--cors", .kind = G5_ARG_STR, .dst = &c.cors_origin},
        {.name = "--no-prefix-cache", .kind = G5_ARG_OFF, .dst = &c.prefix_cache},
        {.name = "--gpu-prefix-cache-mb", .kind = G5_ARG_INT, .dst = &gpu_pfx_mb, .lo = 0, .hi = 1l << 24},
        {.name = "--gpu-prefix-block", .kind = G5_ARG_INT, .dst = &gpu_pfx_block, .lo = 0, .hi = 65536},
        {.name = "--draft", .kind = G5_ARG_CHOICE, .dst = &c.draft_mtp, .choices = drafts, .values = v01},
        {.name = "--version", .kind = G5_ARG_FLAG, .dst = &version},
        {.name = "--no-prefault", .kind = G5_ARG_OFF, .dst = &c.prefault},
        {.name = "--no-warmup", .kind = G5_ARG_OFF, .dst = &c.warmup},
        {.name = "--device", .kind = G5_ARG_CHOICE, .dst = &device, .choices = devices, .values = vdev},
        {.name = "--gpu0", .kind = G5_ARG_INT, .dst = &gpu0, .lo = 0, .hi = 4095},
        {.name = "--precision", .kind = G5_ARG_CHOICE, .dst = &c.gpu_fast, .choices = precisions, .values = v01},
        {.name = "--kv-cache", .kind = G5_ARG_CHOICE, .dst = &c.gpu_kv_cache, .choices = caches, .values = vcache},
        {.name = "--no-verify", .kind = G5_ARG_FLAG, .dst = &c.gpu_no_verify},
        {.name = "--cuda-graph", .kind = G5_ARG_CHOICE, .dst = &c.gpu_graph, .choices = onoff, .values = v01},
    };
    char msg[512];
    g5_args_result r = g5_args_parse(tab, sizeof tab / sizeof tab[0], argc, argv, 1, NULL, 0, NULL, msg, sizeof msg);
    if (r == G5_ARGS_HELP) {
        usage(stdout);
        return 0;
    }
    if (r) {
        fprintf(stderr, "glm5-serve: %s\n", msg);
        usage(stderr);
        return 2;
    }
    if (version) {
        g5_print_version(stdout, "glm5-serve");
        return 0;
    }
    c.port = (uint16_t)port;
    c.max_batch = (uint32_t)max_batch;
    c.max_queue = (uint32_t)max_queue;
    c.ctx_size = (uint32_t)ctx;
    c.block_tokens = (uint32_t)block;
    c.n_threads = (uint32_t)threads;
    c.draw_threads = (uint32_t)draw_threads;
    c.prefill_chunk = (uint32_t)chunk;
    c.max_body = (uint64_t)body;
    c.max_connections = (uint32_t)max_conn;
    c.max_per_ip = (uint32_t)max_per_ip;
    c.timeout_s = (uint32_t)timeout;
    c.gpu_prefix_cache_mb = (uint32_t)gpu_pfx_mb;
    c.gpu_prefix_block = (uint32_t)gpu_pfx_block;
    c.gpu0 = (int)gpu0;
    c.device = (srv_device)device;
    if (!c.model_path) {
        fprintf(stderr, "glm5-serve: -m is required\n");
        usage(stderr);
        return 2;
    }
    if (c.device == SRV_DEVICE_CUDA && !srv_cuda_available()) {
        fprintf(stderr, "glm5-serve: this build has no CUDA; use build/gpu/bin/glm5-serve (make gpu-model)\n");
        return 2;
    }

    /* Every thread inherits this mask; the main thread alone takes the signals. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    srv_server *s = NULL;
    g5_error e = {0};
    g5_status st = srv_create(&c, &s, &e);
    if (st != G5_OK) {
        fprintf(stderr, "glm5-serve: %s (%s)\n", e.msg[0] ? e.msg : g5_strerror(st), g5_strerror(st));
        return 3;
    }
    char line[512];
    snprintf(line, sizeof line, "listening on http://%s:%u (device %s, max batch %u, queue %u, context %u%s%s; "
             "connections <= %u, <= %u per address, idle timeout %u s)",
             c.host, srv_port(s), c.device == SRV_DEVICE_CUDA ? "cuda" : "cpu", c.max_batch, c.max_queue, c.ctx_size,
             c.draft_mtp ? ", draft mtp" : "", c.api_key && *c.api_key ? ", API key required" : "", c.max_connections, c.max_per_ip, c.timeout_s);
    log_line(NULL, line);

    int rc = 0;
    for (;;) {
        struct timespec ts = {0, 200 * 1000 * 1000};
        int sig = sigtimedwait(&set, NULL, &ts);
        if (sig == SIGINT || sig == SIGTERM) {
            snprintf(line, sizeof line, "%s: shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM");
            log_line(NULL, line);
            break;
        }
        g5_error le = {0};
        if (srv_get_load_state(s, &le) == SRV_FAILED) {
            fprintf(stderr, "glm5-serve: cannot load %s: %s (%s)\n", c.model_path, le.msg,
                    g5_strerror(le.status));
            rc = 3;
            break;
        }
    }
    srv_free(s);
    return rc;
}
