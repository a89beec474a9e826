/* The tiny GLM-5 oracle's reference outputs (reference.json and the files it names), shared by the
 * CPU golden test (tests/test_oracle_logits.c) and the GPU one (tests/gpu/test_gpu_model.c), and
 * the comparisons both make. Needs jansson, format/quant.h and tests/test_util.h. */
#ifndef G5_TESTS_ORACLE_REF_H
#define G5_TESTS_ORACLE_REF_H

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "format/quant.h"
#include "tests/test_util.h"

#define N_PROMPTS 3

static const double k_tol_logits[N_PROMPTS] = {1e-3, 1e-3, 5e-3};

typedef struct prompt {
    int32_t *ids;
    uint32_t n;
    float *ref;            /* [n][vocab] */
    int32_t *argmax;       /* [n] */
} prompt;

typedef struct oracle {
    prompt p[N_PROMPTS];
    float *hidden;         /* [4][n1][512] */
    int32_t *topk;         /* [layers][n2][32] */
    uint32_t topk_layers, topk_k;
    int32_t greedy[64];
    uint32_t n_greedy;
    uint32_t greedy_prompt;
} oracle;

static inline void *read_file(const char *path, size_t expect) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    void *buf = malloc(expect ? expect : 1);
    size_t got = buf ? fread(buf, 1, expect, f) : 0;
    int extra = fgetc(f) != EOF;
    fclose(f);
    if (got != expect || extra) {
        free(buf);
        return NULL;
    }
    return buf;
}

static inline float *read_f16(const char *path, size_t n) {
    uint8_t *raw = read_file(path, n * 2);
    if (!raw) return NULL;
    float *out = malloc(n * sizeof(float));
    for (size_t i = 0; out && i < n; i++) out[i] = quant_f16_to_f32((uint16_t)(raw[2 * i] | (raw[2 * i + 1] << 8)));
    free(raw);
    return out;
}

static inline int32_t *read_i32(const char *path, size_t n) {
    uint8_t *raw = read_file(path, n * 4);
    if (!raw) return NULL;
    int32_t *out = malloc(n * sizeof(int32_t));
    for (size_t i = 0; out && i < n; i++)
        out[i] = (int32_t)((uint32_t)raw[4 * i] | ((uint32_t)raw[4 * i + 1] << 8) |
                           ((uint32_t)raw[4 * i + 2] << 16) | ((uint32_t)raw[4 * i + 3] << 24));
    free(raw);
    return out;
}

static inline int32_t *json_ids(json_t *arr, uint32_t *n) {
    *n = (uint32_t)json_array_size(arr);
    int32_t *ids = malloc((*n ? *n : 1) * sizeof *ids);
    for (uint32_t i = 0; i < *n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(arr, i));
    return ids;
}

static inline int load_oracle(oracle *o, uint32_t vocab) {
    memset(o, 0, sizeof *o);
    json_error_t je;
    json_t *root = json_load_file(t_shared("oracle/glm5-tiny/reference.json"), 0, &je);
    if (!root) {
        printf("cannot read reference.json: %s\n", je.text);
        return 0;
    }
    json_t *mdl = json_object_get(json_object_get(root, "models"), "UD-Q4_K_XL");
    json_t *prompts = json_object_get(mdl, "prompts");
    int ok = json_array_size(prompts) == N_PROMPTS;
    for (int i = 0; ok && i < N_PROMPTS; i++) {
        json_t *p = json_array_get(prompts, (size_t)i);
        prompt *pr = &o->p[i];
        pr->ids = json_ids(json_object_get(p, "ids"), &pr->n);
        uint32_t na;
        pr->argmax = json_ids(json_object_get(p, "argmax"), &na);
        char rel[256];
        snprintf(rel, sizeof rel, "oracle/glm5-tiny/%s", json_string_value(json_object_get(p, "logits")));
        pr->ref = read_f16(t_shared(rel), (size_t)pr->n * vocab);
        ok = pr->ref && na == pr->n;
    }
    if (ok) {
        json_t *hs = json_object_get(mdl, "hidden_states");
        char rel[256];
        snprintf(rel, sizeof rel, "oracle/glm5-tiny/%s", json_string_value(json_object_get(hs, "file")));
        json_t *shape = json_object_get(hs, "shape");
        size_t cnt = 1;
        for (size_t k = 0; k < json_array_size(shape); k++) cnt *= (size_t)json_integer_value(json_array_get(shape, k));
        o->hidden = read_f16(t_shared(rel), cnt);
        json_t *tk = json_object_get(mdl, "topk");
        snprintf(rel, sizeof rel, "oracle/glm5-tiny/%s", json_string_value(json_object_get(tk, "file")));
        shape = json_object_get(tk, "shape");
        o->topk_layers = (uint32_t)json_integer_value(json_array_get(shape, 0));
        o->topk_k = (uint32_t)json_integer_value(json_array_get(shape, 2));
        o->topk = read_i32(t_shared(rel), (size_t)o->topk_layers * o->p[2].n * o->topk_k);
        json_t *gr = json_object_get(mdl, "greedy");
        o->greedy_prompt = (uint32_t)json_integer_value(json_object_get(gr, "prompt_index"));
        json_t *toks = json_object_get(gr, "tokens");
        o->n_greedy = (uint32_t)json_array_size(toks);
        if (o->n_greedy > 64) o->n_greedy = 64;
        for (uint32_t i = 0; i < o->n_greedy; i++) o->greedy[i] = (int32_t)json_integer_value(json_array_get(toks, i));
        ok = o->hidden && o->topk && o->greedy_prompt < N_PROMPTS;
    }
    json_decref(root);
    return ok;
}

static inline void free_oracle(oracle *o) {
    for (int i = 0; i < N_PROMPTS; i++) {
        free(o->p[i].ids);
        free(o->p[i].ref);
        free(o->p[i].argmax);
    }
    free(o->hidden);
    free(o->topk);
}

static inline double rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return num != num ? INFINITY : sqrt(num / den);
}

static inline uint32_t argmax(const float *v, uint32_t n) {
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

/* gap between the largest and second largest value */
static inline float top2_gap(const float *v, uint32_t n) {
    float a = -INFINITY, b = -INFINITY;
    for (uint32_t i = 0; i < n; i++) {
        if (v[i] > a) {
            b = a;
            a = v[i];
        } else if (v[i] > b) {
            b = v[i];
        }
    }
    return a - b;
}

#endif
