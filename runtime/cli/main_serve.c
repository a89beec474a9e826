/* glm5-serve: OpenAI-compatible HTTP server for a GLM-5 blob set or GGUF (see runtime/serve/serve.h).
 *
 * Logs to stderr (the listening address first, then one line per request). Stops on SIGINT or
 * SIGTERM. Exit status: 0 after a signal, 1 when the server cannot start or the model fails to
 * load, 2 on a usage error or when a launcher (mpirun/srun) started several processes: one
 * glm5-serve drives every rank. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

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
            "  --kv-cache f32|bf16|f16  GPU latent cache type (default f32 precise, bf16 fast)\n"
            "  --no-verify          GPU: skip the blob checksums while loading\n"
            "  --block-tokens N     tokens per cache block (default 16)\n"
            "  --threads N          model threads (default: online cores)\n"
            "  --max-body BYTES     request body limit (default 1048576)\n"
            "  --name ID            model id reported by the API (default: the file's base name)\n"
            "  --no-prefault        do not read all weight pages at load\n");
}

static int parse_u(const char *s, unsigned long lo, unsigned long hi, unsigned long *out) {
    char *end;
    errno = 0;
    if (!s || *s == '-') return 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return 0;
    *out = v;
    return 1;
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
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        unsigned long u;
#define NEED()                                                                   \
    do {                                                                         \
        if (!v) {                                                                \
            fprintf(stderr, "glm5-serve: %s needs a value\n", o);                \
            return 2;                                                            \
        }                                                                        \
        i++;                                                                     \
    } while (0)
#define NUM(lo, hi)                                                              \
    do {                                                                         \
        NEED();                                                                  \
        if (!parse_u(v, lo, hi, &u)) {                                           \
            fprintf(stderr, "glm5-serve: bad value for %s: '%s'\n", o, v);       \
            return 2;                                                            \
        }                                                                        \
    } while (0)
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(o, "-m") || !strcmp(o, "--model")) {
            NEED();
            c.model_path = v;
        } else if (!strcmp(o, "--host")) {
            NEED();
            c.host = v;
        } else if (!strcmp(o, "--port")) {
            NUM(0, 65535);
            c.port = (uint16_t)u;
        } else if (!strcmp(o, "--api-key")) {
            NEED();
            c.api_key = v;
        } else if (!strcmp(o, "--max-batch")) {
            NUM(1, 4096);
            c.max_batch = (uint32_t)u;
        } else if (!strcmp(o, "--max-queue")) {
            NUM(1, 1000000);
            c.max_queue = (uint32_t)u;
        } else if (!strcmp(o, "--ctx-size") || !strcmp(o, "-c")) {
            NUM(2, 1ul << 30);
            c.ctx_size = (uint32_t)u;
        } else if (!strcmp(o, "--block-tokens")) {
            NUM(1, 65536);
            c.block_tokens = (uint32_t)u;
        } else if (!strcmp(o, "--threads") || !strcmp(o, "-t")) {
            NUM(0, 4096);
            c.n_threads = (uint32_t)u;
        } else if (!strcmp(o, "--max-body")) {
            NUM(1024, 1ul << 30);
            c.max_body = u;
        } else if (!strcmp(o, "--name")) {
            NEED();
            c.model_name = v;
        } else if (!strcmp(o, "--no-prefault")) {
            c.prefault = 0;
        } else if (!strcmp(o, "--device")) {
            NEED();
            if (!strcmp(v, "cpu")) c.device = SRV_DEVICE_CPU;
            else if (!strcmp(v, "cuda")) c.device = SRV_DEVICE_CUDA;
            else {
                fprintf(stderr, "glm5-serve: unknown device '%s' (cpu or cuda)\n", v);
                return 2;
            }
        } else if (!strcmp(o, "--gpu0")) {
            NUM(0, 4095);
            c.gpu0 = (int)u;
        } else if (!strcmp(o, "--precision")) {
            NEED();
            if (!strcmp(v, "precise")) c.gpu_fast = 0;
            else if (!strcmp(v, "fast")) c.gpu_fast = 1;
            else {
                fprintf(stderr, "glm5-serve: bad value for --precision: '%s' (precise or fast)\n", v);
                return 2;
            }
        } else if (!strcmp(o, "--kv-cache")) {
            NEED();
            if (!strcmp(v, "f32")) c.gpu_kv_cache = 1; /* rt_gpu_cache: 1 f32, 2 bf16, 3 f16 */
            else if (!strcmp(v, "bf16")) c.gpu_kv_cache = 2;
            else if (!strcmp(v, "f16")) c.gpu_kv_cache = 3;
            else {
                fprintf(stderr, "glm5-serve: bad value for --kv-cache: '%s' (f32, bf16 or f16)\n", v);
                return 2;
            }
        } else if (!strcmp(o, "--no-verify")) {
            c.gpu_no_verify = 1;
        } else {
            fprintf(stderr, "glm5-serve: unknown option '%s'\n", o);
            usage(stderr);
            return 2;
        }
#undef NUM
#undef NEED
    }
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
        return 1;
    }
    char line[512];
    snprintf(line, sizeof line, "listening on http://%s:%u (device %s, max batch %u, queue %u, context %u%s)",
             c.host, srv_port(s), c.device == SRV_DEVICE_CUDA ? "cuda" : "cpu", c.max_batch, c.max_queue, c.ctx_size,
             c.api_key && *c.api_key ? ", API key required" : "");
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
            rc = 1;
            break;
        }
    }
    srv_free(s);
    return rc;
}
