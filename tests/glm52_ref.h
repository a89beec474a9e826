/* The GLM-5.2 reference (tests/data/glm52-tiny, scripts/make_glm52_ref.py) for the CPU and GPU
 * tests: prompts, transformers' float64 logits, its top-k per layer on prompt 2, the greedy
 * continuation, and the comparisons both make. Include tests/test_util.h first. */
#ifndef G5_TESTS_GLM52_REF_H
#define G5_TESTS_GLM52_REF_H

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIR "tests/data/glm52-tiny/"
#define NP 3
static const double k_tol[NP] = {1e-3, 1e-3, 5e-3};

typedef struct ref {
    int32_t *ids[NP];
    uint32_t n[NP];
    float *logits[NP];
    int32_t *topk; /* [layers][n2][K], unordered */
    int32_t greedy[64];
    uint32_t n_greedy, greedy_prompt;
} ref;

static void *slurp(const char *path, size_t want) {
    size_t n = 0;
    void *b = t_read_file(path, &n);
    if (b && n != want) {
        printf("%s: %zu bytes, expected %zu\n", path, n, want);
        free(b);
        return NULL;
    }
    return b;
}

static int ref_load(ref *r, uint32_t V, uint32_t L, uint32_t K) {
    memset(r, 0, sizeof *r);
    json_error_t je;
    json_t *root = json_load_file(DIR "reference.json", 0, &je);
    if (!root) {
        printf("reference.json: %s\n", je.text);
        return 0;
    }
    json_t *ps = json_object_get(root, "prompts");
    int ok = json_array_size(ps) == NP;
    for (int i = 0; ok && i < NP; i++) {
        json_t *p = json_array_get(ps, (size_t)i), *ids = json_object_get(p, "ids");
        r->n[i] = (uint32_t)json_array_size(ids);
        r->ids[i] = malloc(r->n[i] * sizeof(int32_t));
        for (uint32_t k = 0; k < r->n[i]; k++) r->ids[i][k] = (int32_t)json_integer_value(json_array_get(ids, k));
        char path[256];
        snprintf(path, sizeof path, DIR "%s", json_string_value(json_object_get(p, "logits")));
        r->logits[i] = slurp(path, (size_t)r->n[i] * V * sizeof(float));
        ok = r->logits[i] != NULL;
    }
    if (ok) r->topk = slurp(DIR "p2.topk.i32", (size_t)L * r->n[2] * K * sizeof(int32_t));
    json_t *g = json_object_get(root, "greedy");
    r->n_greedy = (uint32_t)json_array_size(g);
    if (r->n_greedy > 64) r->n_greedy = 64;
    for (uint32_t i = 0; i < r->n_greedy; i++) r->greedy[i] = (int32_t)json_integer_value(json_array_get(g, i));
    r->greedy_prompt = (uint32_t)json_integer_value(json_object_get(root, "greedy_prompt"));
    json_decref(root);
    return ok && r->topk && r->n_greedy > 0 && r->greedy_prompt < NP;
}

static void ref_free(ref *r) {
    for (int i = 0; i < NP; i++) {
        free(r->ids[i]);
        free(r->logits[i]);
    }
    free(r->topk);
}

static uint32_t amax(const float *v, uint32_t n) {
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Prompt i's logits lg [n][V] against the reference: relative L2 and positions whose argmax agrees. */
static double ref_rel_l2(const ref *r, int i, const float *lg, uint32_t V, uint32_t *agree) {
    double num = 0, den = 0;
    *agree = 0;
    for (size_t k = 0; k < (size_t)r->n[i] * V; k++) {
        const double d = (double)lg[k] - r->logits[i][k];
        num += d * d;
        den += (double)r->logits[i][k] * r->logits[i][k];
    }
    for (uint32_t t = 0; t < r->n[i]; t++) *agree += amax(lg + (size_t)t * V, V) == amax(r->logits[i] + (size_t)t * V, V);
    return sqrt(num / den);
}

/* Queries t >= K of layer il (prompt 2) whose key set in tk [L][n][K] equals transformers'. */
static uint32_t ref_topk_same(const ref *r, const int32_t *tk, uint32_t il, uint32_t K) {
    const uint32_t n = r->n[2];
    uint32_t same = 0;
    int32_t a[64], b[64];
    for (uint32_t t = K; t < n && K <= 64; t++) {
        memcpy(a, tk + ((size_t)il * n + t) * K, K * sizeof(int32_t));
        memcpy(b, r->topk + ((size_t)il * n + t) * K, K * sizeof(int32_t));
        qsort(a, K, sizeof *a, cmp_i32);
        qsort(b, K, sizeof *b, cmp_i32);
        same += memcmp(a, b, K * sizeof(int32_t)) == 0;
    }
    return same;
}

#endif
