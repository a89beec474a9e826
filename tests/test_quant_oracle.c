/* Dequantizers against the oracle: dequant_reference.json lists, for every tensor of the oracle
 * GGUF, its type, shape, absolute byte offset and size, and the sum, sum of squares and 64 sampled
 * values of its dequantized float32 data as computed by gguf-py (an implementation we did not
 * write). Tensor bytes are read straight from the file at those offsets, without our GGUF reader. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>

#include "format/quant.h"
#include "tests/test_util.h"

#define REL_TOL 1e-6
#define N_SAMPLES 64

static int close_rel(double got, double want) {
    return fabs(got - want) <= REL_TOL * fabs(want);
}

static int read_at(FILE *f, uint64_t off, void *buf, size_t n) {
    if (fseeko(f, (off_t)off, SEEK_SET) != 0) return 0;
    return fread(buf, 1, n, f) == n;
}

int main(void) {
    const char *json_path = t_shared("oracle/glm5-tiny/dequant_reference.json");
    const char *gguf_path = T_ORACLE_GGUF;
    json_error_t jerr;
    json_t *root = json_load_file(json_path, 0, &jerr);
    T_CHECK(root != NULL, "%s: %s (line %d)", json_path, jerr.text, jerr.line);
    FILE *f = fopen(gguf_path, "rb");
    T_CHECK(f != NULL, "cannot open %s", gguf_path);
    if (!root || !f) {
        if (f) fclose(f);
        json_decref(root);
        return t_report("test_quant_oracle");
    }
    fseeko(f, 0, SEEK_END);
    const uint64_t file_size = (uint64_t)ftello(f);

    json_t *tensors = json_object_get(root, "tensors");
    const size_t n_tensors = json_array_size(tensors);
    T_CHECK(n_tensors == 94, "oracle lists %zu tensors, expected 94", n_tensors);
    T_CHECK(json_integer_value(json_object_get(root, "n_tensors")) == (json_int_t)n_tensors,
            "n_tensors field disagrees with the array");

    /* The offsets are absolute: the smallest one must lie past the header and tensor infos, which
     * start with the magic and name every tensor. */
    uint64_t min_off = UINT64_MAX;
    for (size_t i = 0; i < n_tensors; i++) {
        uint64_t off = (uint64_t)json_integer_value(json_object_get(json_array_get(tensors, i), "offset"));
        if (off < min_off) min_off = off;
    }
    if (n_tensors && min_off < file_size && min_off < (64u << 20)) {
        char *head = malloc(min_off);
        T_CHECK(head && read_at(f, 0, head, min_off), "cannot read the GGUF header");
        if (head) {
            T_CHECK(min_off >= 4 && memcmp(head, "GGUF", 4) == 0, "no GGUF magic at byte 0");
            const char *last = json_string_value(
                json_object_get(json_array_get(tensors, n_tensors - 1), "name"));
            T_CHECK(last && memmem(head, min_off, last, strlen(last)) != NULL,
                    "tensor infos (naming '%s') do not precede the first data offset %llu",
                    last ? last : "?", (unsigned long long)min_off);
            free(head);
        }
    }

    int types_seen[QT_TYPE_LIMIT] = {0};
    size_t exact = 0, n_samples_total = 0;
    for (size_t i = 0; i < n_tensors; i++) {
        json_t *t = json_array_get(tensors, i);
        const char *name = json_string_value(json_object_get(t, "name"));
        const char *tname = json_string_value(json_object_get(t, "type"));
        json_t *ne = json_object_get(t, "ne");
        const uint64_t off = (uint64_t)json_integer_value(json_object_get(t, "offset"));
        const uint64_t nbytes = (uint64_t)json_integer_value(json_object_get(t, "nbytes"));
        const double want_sum = json_number_value(json_object_get(t, "sum"));
        const double want_sumsq = json_number_value(json_object_get(t, "sumsq"));
        json_t *samples = json_object_get(t, "samples");
        if (!name) name = "?";

        int type = quant_type_from_name(tname ? tname : "");
        T_CHECK(type >= 0, "%s: unknown type name '%s'", name, tname ? tname : "(null)");
        if (type < 0) continue;
        types_seen[type]++;
        T_CHECK(quant_check_supported((uint32_t)type, NULL) == G5_OK, "%s: type %s unsupported", name, tname);

        uint64_t n = 1;
        for (size_t k = 0; k < json_array_size(ne); k++) n *= (uint64_t)json_integer_value(json_array_get(ne, k));
        uint64_t rb = 0;
        T_CHECK(quant_row_bytes((uint32_t)type, n, &rb) == G5_OK && rb == nbytes,
                "%s: %s x %llu elements -> %llu bytes, oracle says %llu", name, tname,
                (unsigned long long)n, (unsigned long long)rb, (unsigned long long)nbytes);
        T_CHECK(off % 32 == 0, "%s: offset %llu not 32-aligned", name, (unsigned long long)off);
        T_CHECK(off <= file_size && nbytes <= file_size - off, "%s: bytes past end of file", name);
        if (rb != nbytes || off > file_size || nbytes > file_size - off) continue;

        uint8_t *raw = malloc(nbytes ? nbytes : 1);
        float *val = malloc((n ? n : 1) * sizeof *val);
        if (!raw || !val) {
            T_CHECK(0, "%s: out of memory", name);
            free(raw);
            free(val);
            continue;
        }
        T_CHECK(read_at(f, off, raw, nbytes), "%s: short read", name);
        g5_status st = quant_dequantize((uint32_t)type, raw, n, val);
        T_CHECK(st == G5_OK, "%s: dequantize: %s", name, g5_strerror(st));

        double sum = 0, sumsq = 0;
        int finite = 1;
        for (uint64_t k = 0; k < n; k++) {
            const double v = val[k];
            finite &= isfinite(v) != 0;
            sum += v;
            sumsq += v * v;
        }
        T_CHECK(finite, "%s: non-finite dequantized value", name);
        T_CHECK(close_rel(sum, want_sum), "%s (%s): sum %.17g, oracle %.17g", name, tname, sum, want_sum);
        T_CHECK(close_rel(sumsq, want_sumsq), "%s (%s): sumsq %.17g, oracle %.17g", name, tname,
                sumsq, want_sumsq);

        T_CHECK(json_array_size(samples) == N_SAMPLES, "%s: %zu samples", name, json_array_size(samples));
        int bad = 0;
        for (size_t s = 0; s < json_array_size(samples) && n; s++) {
            json_t *pair = json_array_get(samples, s);
            const uint64_t idx = (uint64_t)json_integer_value(json_array_get(pair, 0));
            const double want = json_number_value(json_array_get(pair, 1));
            /* The documented sampling rule; checks we read the index the way it was written. */
            const uint64_t expect_idx = ((uint64_t)s * 2654435761u) % n;
            if (idx != expect_idx || idx >= n) {
                T_CHECK(0, "%s: sample %zu index %llu, rule gives %llu", name, s,
                        (unsigned long long)idx, (unsigned long long)expect_idx);
                bad++;
                continue;
            }
            n_samples_total++;
            if ((double)val[idx] == want) exact++;
            if (!close_rel(val[idx], want)) {
                if (bad++ < 3)
                    T_CHECK(0, "%s (%s): element %llu = %.9g, oracle %.9g", name, tname,
                            (unsigned long long)idx, val[idx], want);
            } else {
                t_passed++;
            }
        }
        T_CHECK(bad == 0, "%s: %d of %zu samples differ", name, bad, json_array_size(samples));
        free(raw);
        free(val);
    }

    printf("types:");
    for (int k = 0; k < QT_TYPE_LIMIT; k++)
        if (types_seen[k]) printf(" %s x%d", quant_type_name((uint32_t)k), types_seen[k]);
    printf("\nsamples bit-identical to the oracle: %zu of %zu\n", exact, n_samples_total);
    /* gguf-py evaluates the same float32 products as ggml, so agreement must be exact, not only
     * within the tolerance. */
    T_CHECK(exact == n_samples_total, "%zu samples within tolerance but not bit-identical",
            n_samples_total - exact);

    fclose(f);
    json_decref(root);
    return t_report("test_quant_oracle");
}
