/* Would glm5-serve gain from prefilling prompts beside the decode steps of its running sequences?
 * (issue 14, serving: with 32 clients arriving at once the server spends 1.19 of its 2.99 s in
 * prefill calls while no decode step runs; bench/RESULTS.md session 42.) glm5-serve drives one
 * engine from one thread, so a prefill call and a decode step never overlap on the GPU. This
 * measures what overlapping them would give before the engine is built for it: two GPU models of
 * one blob set (its weights loaded twice: the peer model's 19.4 GB fits an H100 twice), D running
 * batched decode steps of B sequences (rt_gpu_forward_rows with each row's argmax on the device:
 * glm5-serve's greedy step) and P running prompt prefill calls of --chunk tokens (rt_gpu_forward
 * into its default sequence, --prompt tokens a prompt, then the next prompt from position 0), each
 * driven by a thread of its own:
 *   alone     S decode steps of D; then P's prefill calls for about as long
 *   together  S decode steps of D while P's thread prefills; then P is stopped
 * For each B it prints ms a decode step and prefill tok/s, alone and together, each together
 * figure as a fraction of its alone figure, and the sum of the two fractions: 1 is what running
 * them one after the other gives (the engine today), 2 would be each running as if alone.
 * --priority: D's streams at the device's greatest priority (rt_gpu_opts.stream_priority_high),
 * so the block scheduler starts D's waiting blocks before P's. The same ceiling as every figure
 * here, each workload alone, is measured in the same run.
 *
 *   bench_overlap -m DIR [--batch 8,32] [--chunk 256] [--prompt 512] [--steps 120] [--h16]
 *                 [--priority]
 * --h16: rt_gpu_opts.h16_products on both (what glm5-serve with --max-batch > 1 runs). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "format/glm5.h"
#include "format/status.h"
#include "runtime/cpu/model.h"
#include "runtime/cpu/weights.h"
#include "runtime/gpu/gpu_model.h"
#include "tests/gpu/bench_util.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void fill_tokens(int32_t *ids, uint32_t n, uint32_t vocab, uint64_t *seed) {
    for (uint32_t i = 0; i < n; i++) {
        *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((*seed >> 33) % vocab);
    }
}

/* P's prefill loop: calls of chunk tokens, a new prompt every prompt tokens, until stop is set
 * (or, with stop NULL, until `until` seconds of the clock); tokens and seconds of the calls. */
typedef struct pf_job {
    rt_gpu_model *g;
    const int32_t *ids;   /* [prompt] */
    uint32_t chunk, prompt;
    float *logits;        /* [n_vocab]: the last position's, as a prompt's last chunk gives */
    atomic_int *stop;
    double until;
    uint64_t tokens;
    double seconds;
} pf_job;

static void *pf_main(void *arg) {
    pf_job *j = arg;
    const rt_gpu_outputs out = {.logits = j->logits};
    uint32_t pos = 0;
    j->tokens = 0;
    const double a = now_s();
    while (j->stop ? !atomic_load(j->stop) : now_s() < j->until) {
        if (pos + j->chunk > j->prompt) {
            rt_gpu_reset(j->g);
            pos = 0;
        }
        GK(rt_gpu_forward(j->g, j->ids + pos, j->chunk, &out, &err_));
        pos += j->chunk;
        j->tokens += j->chunk;
    }
    j->seconds = now_s() - a;
    return NULL;
}

/* S decode steps of the B sequences: seconds a step */
static double decode_steps(rt_gpu_model *g, rt_gpu_seq *const *seqs, uint32_t B, uint32_t S, uint32_t vocab,
                           uint64_t *seed) {
    int32_t tok[64], am[64];
    float av[64];
    const rt_gpu_outputs oa = {.argmax = am, .argmax_logit = av, .all_logits = 1};
    const double a = now_s();
    for (uint32_t s = 0; s < S; s++) {
        fill_tokens(tok, B, vocab, seed);
        GK(rt_gpu_forward_rows(g, seqs, NULL, B, tok, &oa, &err_));
    }
    return (now_s() - a) / S;
}

int main(int argc, char **argv) {
    const char *model = NULL;
    int h16 = 0, prio = 0;
    uint32_t chunk = 256, prompt = 512, steps = 120, batch[16] = {8, 32}, nb = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--h16")) { h16 = 1; continue; }
        if (!strcmp(a, "--priority")) { prio = 1; continue; }
        if (!v) { fprintf(stderr, "bench_overlap: %s needs a value\n", a); return 2; }
        i++;
        if (!strcmp(a, "-m")) model = v;
        else if (!strcmp(a, "--chunk")) chunk = (uint32_t)atoi(v);
        else if (!strcmp(a, "--prompt")) prompt = (uint32_t)atoi(v);
        else if (!strcmp(a, "--steps")) steps = (uint32_t)atoi(v);
        else if (!strcmp(a, "--batch")) {
            nb = 0;
            for (const char *p = v; *p && nb < 16; p = strchr(p, ',') ? strchr(p, ',') + 1 : p + strlen(p))
                batch[nb++] = (uint32_t)atoi(p);
        } else { fprintf(stderr, "bench_overlap: unknown option %s\n", a); return 2; }
    }
    if (!model || !chunk || prompt < chunk || !steps || steps > 400) {
        fprintf(stderr, "usage: bench_overlap -m DIR [options] (see the source's top comment)\n");
        return 2;
    }
    for (uint32_t i = 0; i < nb; i++)
        if (!batch[i] || batch[i] > 64) {
            fprintf(stderr, "bench_overlap: batch %u (1 .. 64)\n", batch[i]);
            return 2;
        }
    rt_wset *ws = NULL;
    rt_model *m = NULL;
    rt_gpu_model *gd = NULL, *gp = NULL;
    GK(rt_wset_open(model, &ws, &err_));
    rt_model_opts mo = {0};
    GK(rt_model_create(ws, &mo, &m, &err_));
    const glm5_hparams *hp = rt_model_hparams(m);
    rt_gpu_opts go;
    rt_gpu_opts_default(&go);
    go.precision = RT_GPU_FAST;
    go.cuda_graph = 1;
    go.h16_products = h16;
    go.blobs = rt_wset_blobs(ws);
    GK(rt_gpu_model_create(m, &go, &gp, &err_)); /* P: default priority */
    go.stream_priority_high = prio;
    GK(rt_gpu_model_create(m, &go, &gd, &err_));
    const rt_gpu_info *gi = rt_gpu_model_info(gd);
    printf("bench_overlap: %s, GPU %s, fast%s; decode model's streams at %s priority; prefill calls of %u tokens, "
           "prompts of %u; %u decode steps a measurement\n",
           model, gi->device_name, gi->h16_products ? ", fp16 products" : "", prio ? "the greatest" : "the default",
           chunk, prompt, steps);
    int32_t *pids = malloc(sizeof *pids * prompt);
    float *plog = rt_gpu_host_alloc(sizeof *plog * hp->n_vocab), *dlog = rt_gpu_host_alloc(sizeof *dlog * hp->n_vocab);
    if (!pids || !plog || !dlog) return 1;
    uint64_t seed = 42;
    fill_tokens(pids, prompt, hp->n_vocab, &seed);
    for (uint32_t bi = 0; bi < nb; bi++) {
        const uint32_t B = batch[bi];
        rt_gpu_seq *seqs[64] = {0};
        const rt_gpu_outputs od = {.logits = dlog};
        for (uint32_t b = 0; b < B; b++) {
            GK(rt_gpu_seq_create(gd, prompt + 2 * steps + 8, &seqs[b], &err_));
            fill_tokens(pids, prompt, hp->n_vocab, &seed);
            GK(rt_gpu_forward_seq(gd, seqs[b], pids, prompt, &od, &err_));
        }
        decode_steps(gd, seqs, B, 2, hp->n_vocab, &seed); /* warm-up: the graph's capture */
        const double dec1 = decode_steps(gd, seqs, B, steps - 2, hp->n_vocab, &seed);
        pf_job j = {gp, pids, chunk, prompt, plog, NULL, 0, 0, 0};
        j.until = now_s() + 0.2; /* warm-up: P's first calls, then its alone run for S steps' time */
        pf_main(&j);
        j.until = now_s() + dec1 * steps;
        pf_main(&j);
        const double pf1 = j.tokens / j.seconds;
        atomic_int stop = 0;
        j.stop = &stop;
        pthread_t th;
        if (pthread_create(&th, NULL, pf_main, &j)) return 1;
        const double dec2 = decode_steps(gd, seqs, B, steps, hp->n_vocab, &seed);
        atomic_store(&stop, 1);
        pthread_join(th, NULL);
        const double pf2 = j.tokens / j.seconds, fd = dec1 / dec2, fp = pf2 / pf1;
        printf("batch %u: decode %.3f ms a step alone, %.3f together (%.3f); prefill %.0f tok/s alone, %.0f together "
               "(%.3f); sum %.3f\n",
               B, dec1 * 1e3, dec2 * 1e3, fd, pf1, pf2, fp, fd + fp);
        fflush(stdout);
        for (uint32_t b = 0; b < B; b++) rt_gpu_seq_free(seqs[b]);
    }
    rt_gpu_host_free(plog);
    rt_gpu_host_free(dlog);
    free(pids);
    rt_gpu_model_free(gd);
    rt_gpu_model_free(gp);
    rt_model_free(m);
    rt_wset_free(ws);
    return 0;
}
