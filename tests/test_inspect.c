/* inspect: the report and audit on the oracle GGUF (checked against the oracle's own
 * dequant_reference.json, written by gguf-py), --json through the CLI, --dump against the
 * reference's dequantized samples and against quant_dequantize, audit failures on doctored synth
 * models (missing tensor, wrong shape, unknown tensor, unsupported type), corrupt files. */
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <jansson.h>

#include "convert/inspect.h"
#include "convert/synth.h"
#include "format/glm5.h"
#include "format/gguf.h"
#include "format/gguf_write.h"
#include "format/quant.h"
#include "test_util.h"

static json_t *load_json(const char *path) {
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j) printf("cannot load %s: %s (line %d)\n", path, je.text, je.line);
    return j;
}

static int json_list_has(const json_t *arr, const char *s) {
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v) if (json_is_string(v) && strcmp(json_string_value(v), s) == 0) return 1;
    return 0;
}

/* Compares a report against dequant_reference.json: tensor names, types, shapes, offsets,
 * sizes, and the scalar metadata values. */
static void check_report_vs_reference(const json_t *rep, const json_t *ref) {
    const json_t *rt = json_object_get(ref, "tensors"), *mt = json_object_get(rep, "tensors");
    T_CHECK(json_array_size(mt) == json_array_size(rt), "%zu tensors vs reference %zu",
            json_array_size(mt), json_array_size(rt));
    size_t i;
    json_t *e;
    int bad = 0;
    json_array_foreach(rt, i, e) {
        const json_t *m = json_array_get(mt, i);
        if (!m) break;
        const char *name = json_string_value(json_object_get(e, "name"));
        int ok = strcmp(name, json_string_value(json_object_get(m, "name"))) == 0 &&
                 strcmp(json_string_value(json_object_get(e, "type")),
                        json_string_value(json_object_get(m, "type"))) == 0 &&
                 json_equal(json_object_get(e, "ne"), json_object_get(m, "shape")) &&
                 json_integer_value(json_object_get(e, "offset")) ==
                     json_integer_value(json_object_get(m, "file_offset")) &&
                 json_integer_value(json_object_get(e, "nbytes")) ==
                     json_integer_value(json_object_get(m, "bytes"));
        if (!ok && bad++ < 5) printf("  tensor %zu (%s) differs from the reference\n", i, name);
    }
    T_CHECK(bad == 0, "%d tensors differ from dequant_reference.json", bad);

    const json_t *rmeta = json_object_get(ref, "metadata");
    const json_t *md = json_object_get(rep, "metadata");
    int n_checked = 0;
    bad = 0;
    json_array_foreach(md, i, e) {
        const char *key = json_string_value(json_object_get(e, "key"));
        const json_t *want = json_object_get(rmeta, key);
        T_CHECK(want != NULL, "report key '%s' not in the reference", key);
        if (!want || strcmp(json_string_value(json_object_get(e, "type")), "array") == 0) {
            if (want && json_is_string(want)) { /* "array[2048]" */
                char buf[64];
                snprintf(buf, sizeof buf, "array[%lld]",
                         (long long)json_integer_value(json_object_get(e, "count")));
                T_CHECK(strcmp(buf, json_string_value(want)) == 0, "%s: %s vs %s", key, buf,
                        json_string_value(want));
            } else if (want && json_is_array(want)) {
                T_CHECK(json_equal(want, json_object_get(e, "values")), "%s: array differs", key);
            }
            continue;
        }
        const json_t *got = json_object_get(e, "value");
        int ok;
        if (json_is_real(want) || json_is_real(got))
            ok = fabs(json_number_value(want) - json_number_value(got)) <=
                 1e-6 * fabs(json_number_value(want));
        else
            ok = json_equal(want, got);
        if (!ok) {
            bad++;
            printf("  metadata %s differs from the reference\n", key);
        }
        n_checked++;
    }
    T_CHECK(bad == 0 && n_checked >= 40, "%d metadata values differ (%d checked)", bad, n_checked);
    T_CHECK((size_t)json_integer_value(json_object_get(rmeta, "GGUF.kv_count")) == json_array_size(md),
            "kv count");
}

static void test_oracle_report(const json_t *ref) {
    gguf_ctx *ctx = NULL;
    g5_error e;
    g5_error_clear(&e);
    T_CHECK(gguf_open(T_ORACLE_GGUF, &ctx, &e) == G5_OK, "open oracle: %s", e.msg);
    if (!ctx) return;
    json_t *rep = NULL;
    T_CHECK(inspect_gguf(ctx, T_ORACLE_GGUF, NULL, &rep, &e) == G5_OK, "inspect: %s", e.msg);
    if (rep) {
        T_CHECK(json_integer_value(json_object_get(rep, "n_tensors")) == 94, "94 tensors");
        T_CHECK(inspect_report_passed(rep), "oracle audit passes");
        const json_t *a = json_object_get(rep, "audit");
        T_CHECK(json_is_true(json_object_get(a, "applicable")), "audit applies to glm-dsa");
        T_CHECK(json_array_size(json_object_get(a, "missing")) == 0, "nothing missing");
        T_CHECK(json_array_size(json_object_get(a, "unknown")) == 0, "nothing unknown");
        T_CHECK(json_array_size(json_object_get(a, "problems")) == 0, "no problems");
        /* every tensor belongs to a group; the groups and type totals add up */
        size_t i;
        json_t *g;
        json_int_t n = 0, bytes = 0, tb = 0;
        json_array_foreach(json_object_get(a, "groups"), i, g) {
            n += json_integer_value(json_object_get(g, "count"));
            bytes += json_integer_value(json_object_get(g, "bytes"));
        }
        json_array_foreach(json_object_get(rep, "tensors"), i, g)
            tb += json_integer_value(json_object_get(g, "bytes"));
        T_CHECK(n == 94 && bytes == tb, "groups cover %lld tensors, %lld of %lld bytes",
                (long long)n, (long long)bytes, (long long)tb);
        T_CHECK(json_integer_value(json_object_get(rep, "total_bytes")) == tb, "total bytes");
        n = 0;
        bytes = 0;
        json_array_foreach(json_object_get(rep, "totals_by_type"), i, g) {
            n += json_integer_value(json_object_get(g, "count"));
            bytes += json_integer_value(json_object_get(g, "bytes"));
        }
        T_CHECK(n == 94 && bytes == tb, "type totals");
        /* an array abbreviated to max_array elements, with its count */
        json_array_foreach(json_object_get(rep, "metadata"), i, g) {
            if (strcmp(json_string_value(json_object_get(g, "key")), "tokenizer.ggml.tokens"))
                continue;
            T_CHECK(json_integer_value(json_object_get(g, "count")) == 2048, "tokens count");
            T_CHECK(json_array_size(json_object_get(g, "values")) == 8, "tokens abbreviated");
            T_CHECK(json_is_true(json_object_get(g, "truncated")), "marked truncated");
        }
        /* what one decode token reads, recounted from the tensor list: main layers and globals,
         * the routed experts at n_expert_used / n_expert, one embedding row, W_UK/W_UV as kv_b's
         * exact int8 form (1.25 bytes per element of k_b + v_b: the oracle's are Q5_0 and Q6_K,
         * which have one) or else the float32 kv_b rebuilt from them (4 bytes per element) */
        const json_t *hp = json_object_get(a, "hparams"), *dpt = json_object_get(a, "decode_per_token");
        const double used = (double)json_integer_value(json_object_get(hp, "n_expert_used")) /
                            (double)json_integer_value(json_object_get(hp, "n_expert"));
        const long long nlm = json_integer_value(json_object_get(hp, "n_layer_main"));
        double want = 0, want_routed = 0, got_routed = -1;
        json_array_foreach(json_object_get(rep, "tensors"), i, g) {
            const char *nm = json_string_value(json_object_get(g, "name"));
            double b = (double)json_integer_value(json_object_get(g, "bytes"));
            int layer = -1;
            if (sscanf(nm, "blk.%d.", &layer) == 1 && layer >= nlm) continue;
            if (strstr(nm, "_exps.")) {
                want_routed += b * used;
                b *= used;
            }
            if (!strcmp(nm, "token_embd.weight"))
                b /= (double)json_integer_value(json_array_get(json_object_get(g, "shape"), 1));
            if (strstr(nm, ".attn_k_b.") || strstr(nm, ".attn_v_b.")) {
                b = quant_exact_i8((uint32_t)quant_type_from_name(json_string_value(json_object_get(g, "type")))) ? 1.25 : 4;
                for (size_t d = 0; d < json_array_size(json_object_get(g, "shape")); d++)
                    b *= (double)json_integer_value(json_array_get(json_object_get(g, "shape"), d));
            }
            want += b;
        }
        json_array_foreach(json_object_get(dpt, "groups"), i, g)
            if (!strcmp(json_string_value(json_object_get(g, "group")), "routed experts"))
                got_routed = json_real_value(json_object_get(g, "bytes"));
        const double got = json_real_value(json_object_get(dpt, "total_bytes"));
        T_CHECK(fabs(got - want) <= 1e-9 * want + 1e-3 && fabs(got_routed - want_routed) < 1e-6 * want_routed + 1e-3 &&
                    json_real_value(json_object_get(dpt, "nextn_per_draft_bytes")) > 0,
                "decode bytes per token %.0f (want %.0f), routed %.0f (want %.0f)", got, want, got_routed,
                want_routed);
        if (ref) check_report_vs_reference(rep, ref);
        char *txt = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&txt, &len);
        inspect_print_text(rep, NULL, f);
        fclose(f);
        T_CHECK(txt && strstr(txt, "audit: PASSED"), "text says PASSED");
        T_CHECK(txt && strstr(txt, "blk.3.nextn.eh_proj.weight"), "text lists tensors");
        T_CHECK(txt && strstr(txt, "[string x 2048]"), "text abbreviates arrays");
        T_CHECK(txt && strstr(txt, "one decode token reads") && strstr(txt, "routed experts"),
                "text gives the decode bytes per token");
        free(txt);
        json_decref(rep);
    }
    gguf_free(ctx);
}

static void test_cli_json(const json_t *ref) {
    char cmd[8192], *out = NULL;
    snprintf(cmd, sizeof cmd, "'%s' inspect '%s' --json 2>/dev/null", t_bin("glm5-shard"), T_ORACLE_GGUF);
    int rc = t_run_capture(cmd, &out);
    T_CHECK(rc == 0, "inspect --json exit %d", rc);
    json_error_t je;
    json_t *j = out ? json_loads(out, 0, &je) : NULL;
    T_CHECK(j != NULL, "--json output parses: %s", j ? "" : je.text);
    if (j) {
        T_CHECK(json_integer_value(json_object_get(j, "n_tensors")) == 94, "json n_tensors");
        T_CHECK(json_array_size(json_object_get(j, "tensors")) == 94, "json tensors");
        T_CHECK(json_is_true(json_object_get(json_object_get(j, "audit"), "passed")), "json audit");
        if (ref) check_report_vs_reference(j, ref);
        json_decref(j);
    }
    free(out);
}

/* --dump: equal to quant_dequantize of the tensor's bytes, and to the reference samples. */
static void test_dump(const char *dir, const json_t *ref) {
    gguf_ctx *ctx = NULL;
    g5_error e;
    g5_error_clear(&e);
    if (gguf_open(T_ORACLE_GGUF, &ctx, &e) != G5_OK) return;
    static const char *const names[] = {"blk.1.attn_k_b.weight", "blk.2.ffn_down_exps.weight",
                                        "blk.0.indexer.proj.weight", "output.weight",
                                        "blk.3.nextn.enorm.weight", "blk.1.attn_kv_a_mqa.weight"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        const gguf_tensor *t = gguf_find_tensor(ctx, names[k]);
        T_CHECK(t != NULL, "%s present", names[k]);
        if (!t) continue;
        char out[4200], cmd[12000];
        snprintf(out, sizeof out, "%s/dump%zu.f32", dir, k);
        if (k % 2 == 0) {
            T_CHECK(inspect_dump_tensor(ctx, names[k], out, &e) == G5_OK, "dump %s: %s",
                    names[k], e.msg);
        } else {
            snprintf(cmd, sizeof cmd, "'%s' inspect '%s' --dump %s -o '%s' 2>&1", t_bin("glm5-shard"),
                     T_ORACLE_GGUF, names[k], out);
            T_CHECK(t_run_capture(cmd, NULL) == 0, "CLI dump %s", names[k]);
        }
        struct stat sb;
        T_CHECK(stat(out, &sb) == 0 && (uint64_t)sb.st_size == t->n_elems * 4,
                "%s: dump size %lld, want %llu", names[k], (long long)sb.st_size,
                (unsigned long long)t->n_elems * 4);
        float *want = malloc(t->n_elems * sizeof *want);
        uint8_t *got = malloc(t->n_elems * 4);
        FILE *f = fopen(out, "rb");
        size_t nread = f && got ? fread(got, 1, t->n_elems * 4, f) : 0;
        if (f) fclose(f);
        if (want && got && nread == t->n_elems * 4 &&
            quant_dequantize(t->type, t->data, t->n_elems, want) == G5_OK) {
            uint64_t diff = 0;
            for (uint64_t i = 0; i < t->n_elems; i++) {
                uint32_t bits;
                memcpy(&bits, &want[i], 4);
                diff += g5_rd_u32(got + 4 * i) != bits;
            }
            T_CHECK(diff == 0, "%s: %llu elements differ from quant_dequantize", names[k],
                    (unsigned long long)diff);
            /* the oracle's samples (gguf-py's dequantizer) */
            size_t i;
            json_t *rt;
            json_array_foreach(json_object_get(ref, "tensors"), i, rt) {
                if (strcmp(json_string_value(json_object_get(rt, "name")), names[k])) continue;
                size_t s;
                json_t *smp;
                int bad = 0;
                json_array_foreach(json_object_get(rt, "samples"), s, smp) {
                    uint64_t idx = (uint64_t)json_integer_value(json_array_get(smp, 0));
                    double v = json_number_value(json_array_get(smp, 1));
                    uint32_t bits = g5_rd_u32(got + 4 * idx);
                    float fv;
                    memcpy(&fv, &bits, 4);
                    if (fabs(fv - v) > 1e-6 * fabs(v) + 1e-12) bad++;
                }
                T_CHECK(bad == 0 && s == 64, "%s: %d of %zu reference samples differ", names[k],
                        bad, s);
            }
        } else {
            T_CHECK(0, "%s: could not read back the dump", names[k]);
        }
        free(want);
        free(got);
        char tmp[4300];
        snprintf(tmp, sizeof tmp, "%s.tmp", out);
        T_CHECK(access(tmp, F_OK) != 0, "no temporary file left");
    }
    T_CHECK(inspect_dump_tensor(ctx, "no.such.tensor", "/nonexistent/x.f32", &e) == G5_ERR_NOT_FOUND &&
                strstr(e.msg, "no.such.tensor"),
            "unknown tensor named: %s", e.msg);
    gguf_free(ctx);
}

/* ---- doctored models ---- */

typedef struct doctor {
    const char *drop;         /* tensor to leave out */
    const char *reshape;      /* tensor whose ne[1] is changed */
    uint64_t new_ne1;
    const char *extra;        /* an extra (unknown) tensor name */
    const char *retype;       /* tensor stored as another type */
    uint32_t new_type;
} doctor;

/* Copies src (all metadata, all tensors) to dst with the changes in d. */
static int write_doctored(const char *src, const char *dst, const doctor *d) {
    gguf_ctx *ctx = NULL;
    if (gguf_open(src, &ctx, NULL) != G5_OK) return -1;
    gguf_writer *w = gguf_writer_create();
    void *bufs[4] = {0};
    int nb = 0, rc = 0;
    for (int64_t i = 0; i < gguf_get_n_kv(ctx); i++) rc |= gguf_writer_copy_kv(w, ctx, i) != G5_OK;
    uint64_t rng = 42;
    for (int64_t i = 0; i < gguf_get_n_tensors(ctx); i++) {
        const gguf_tensor *t = gguf_get_tensor(ctx, i);
        if (d->drop && strcmp(t->name, d->drop) == 0) continue;
        uint64_t ne[4];
        memcpy(ne, t->ne, sizeof ne);
        uint32_t type = t->type;
        const void *data = t->data;
        int changed = 0;
        if (d->reshape && strcmp(t->name, d->reshape) == 0) {
            ne[1] = d->new_ne1;
            changed = 1;
        }
        if (d->retype && strcmp(t->name, d->retype) == 0) {
            type = d->new_type;
            changed = 1;
        }
        if (changed) {
            const quant_type_info *qi = quant_type_get(type);
            uint64_t nblk = ne[0] * ne[1] * ne[2] * ne[3] / qi->block_elems;
            void *b = calloc(nblk, qi->block_bytes);
            if (qi->supported) quant_fill_random(type, b, nblk, &rng);
            bufs[nb++] = b;
            data = b;
        }
        rc |= gguf_writer_add_tensor(w, t->name, type, t->n_dims, ne, data, NULL) != G5_OK;
    }
    if (d->extra) {
        static float zeros[512];
        uint64_t ne[4] = {512, 1, 1, 1};
        rc |= gguf_writer_add_tensor(w, d->extra, QT_F32, 1, ne, zeros, NULL) != G5_OK;
    }
    g5_error e;
    if (gguf_writer_write_file(w, dst, NULL, NULL, &e) != G5_OK) {
        printf("write %s: %s\n", dst, e.msg);
        rc = -1;
    }
    gguf_writer_free(w);
    for (int k = 0; k < nb; k++) free(bufs[k]);
    gguf_free(ctx);
    return rc ? -1 : 0;
}

static json_t *report_of(const char *path) {
    gguf_ctx *ctx = NULL;
    g5_error e;
    g5_error_clear(&e);
    if (gguf_open(path, &ctx, &e) != G5_OK) {
        printf("open %s: %s\n", path, e.msg);
        return NULL;
    }
    json_t *rep = NULL;
    inspect_gguf(ctx, path, NULL, &rep, &e);
    gguf_free(ctx);
    return rep;
}

static void expect_audit_failure(const char *dir, const char *tag, const doctor *d,
                                 const char *list, const char *offender) {
    char src[4200], dst[4200], cmd[9000];
    snprintf(src, sizeof src, "%s/synth.gguf", dir);
    snprintf(dst, sizeof dst, "%s/%s.gguf", dir, tag);
    T_CHECK(write_doctored(src, dst, d) == 0, "%s: write doctored model", tag);
    json_t *rep = report_of(dst);
    T_CHECK(rep != NULL, "%s: report", tag);
    if (!rep) return;
    T_CHECK(!inspect_report_passed(rep), "%s: audit fails", tag);
    const json_t *a = json_object_get(rep, "audit");
    const json_t *l = json_object_get(a, list);
    int named = 0;
    if (!strcmp(list, "missing") || !strcmp(list, "unknown")) {
        named = json_list_has(l, offender);
    } else {
        size_t i;
        json_t *m;
        json_array_foreach(l, i, m) named |= !strcmp(json_string_value(json_object_get(m, "name")), offender);
    }
    T_CHECK(named, "%s: '%s' listed under %s", tag, offender, list);
    T_CHECK(json_array_size(json_object_get(a, "problems")) == 1, "%s: exactly one problem (%zu)",
            tag, json_array_size(json_object_get(a, "problems")));
    json_decref(rep);
    /* the CLI: exit 1 and the offender named */
    char *out = NULL;
    snprintf(cmd, sizeof cmd, "'%s' inspect '%s' 2>&1", t_bin("glm5-shard"), dst);
    int rc = t_run_capture(cmd, &out);
    T_CHECK(rc == 1, "%s: CLI exit %d, want 1", tag, rc);
    T_CHECK(out && strstr(out, offender) && strstr(out, "audit: FAILED"), "%s: CLI names '%s'",
            tag, offender);
    free(out);
}

static void test_audit_failures(const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/synth.gguf", dir);
    synth_opts o;
    synth_opts_init(&o);
    g5_error e;
    T_CHECK(synth_write(&o, path, NULL, &e) == G5_OK, "synth: %s", e.msg);
    json_t *rep = report_of(path);
    T_CHECK(rep && inspect_report_passed(rep), "the untouched synth model passes");
    json_decref(rep);

    doctor d;
    memset(&d, 0, sizeof d);
    d.drop = "blk.2.ffn_up_exps.weight";
    expect_audit_failure(dir, "dropped", &d, "missing", "blk.2.ffn_up_exps.weight");
    memset(&d, 0, sizeof d);
    d.reshape = "blk.1.attn_q_b.weight";
    d.new_ne1 = 1280; /* 5 heads' worth of rows with 4 heads in the metadata */
    expect_audit_failure(dir, "reshaped", &d, "shape_mismatch", "blk.1.attn_q_b.weight");
    memset(&d, 0, sizeof d);
    d.extra = "blk.1.attn_sinks.weight";
    expect_audit_failure(dir, "extra", &d, "unknown", "blk.1.attn_sinks.weight");
    memset(&d, 0, sizeof d);
    d.retype = "blk.0.ffn_gate.weight";
    d.new_type = QT_Q8_K; /* a real ggml type we do not dequantize (never a weight type) */
    expect_audit_failure(dir, "retyped", &d, "unsupported_type", "blk.0.ffn_gate.weight");
}


/* Other architectures are listed but not audited; a glm-dsa file without a required key fails
 * the audit naming the key. */
static void test_other_arch(const char *dir) {
    static float w[64];
    uint64_t ne[4] = {64, 1, 1, 1};
    const char *archs[] = {"llama", GLM5_ARCH};
    for (int k = 0; k < 2; k++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/arch%d.gguf", dir, k);
        gguf_writer *wr = gguf_writer_create();
        gguf_writer_set_str(wr, "general.architecture", archs[k], strlen(archs[k]));
        gguf_writer_add_tensor(wr, "output_norm.weight", QT_F32, 1, ne, w, NULL);
        g5_error e;
        T_CHECK(gguf_writer_write_file(wr, path, NULL, NULL, &e) == G5_OK, "write: %s", e.msg);
        gguf_writer_free(wr);
        json_t *rep = report_of(path);
        T_CHECK(rep != NULL, "report of %s", archs[k]);
        if (!rep) continue;
        const json_t *a = json_object_get(rep, "audit");
        if (k == 0) {
            T_CHECK(json_is_false(json_object_get(a, "applicable")) && inspect_report_passed(rep),
                    "llama: not audited, passes");
        } else {
            T_CHECK(!inspect_report_passed(rep), "glm-dsa without hyperparameters fails");
            const char *p0 = json_string_value(json_array_get(json_object_get(a, "problems"), 0));
            T_CHECK(p0 && strstr(p0, "glm-dsa.block_count"), "the missing key is named: %s",
                    p0 ? p0 : "(none)");
        }
        json_decref(rep);
    }
}

/* ---- corrupt files ---- */

static void test_corrupt(const char *dir) {
    FILE *f = fopen(T_ORACLE_GGUF, "rb");
    T_CHECK(f != NULL, "open oracle");
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *img = malloc((size_t)n);
    T_CHECK(img && fread(img, 1, (size_t)n, f) == (size_t)n, "read oracle");
    fclose(f);
    struct {
        const char *tag;
        long len;        /* bytes kept */
        long poke_at;    /* -1: none */
        uint8_t poke;
    } cases[] = {
        {"truncated-metadata", 5000, -1, 0},     /* inside the token strings */
        {"truncated-header", 20, -1, 0},
        {"truncated-data", n - 100000, -1, 0},   /* tensors past the end of the file */
        {"bad-magic", n, 0, 'X'},
        {"bad-version", n, 4, 99},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char path[4200], cmd[9000];
        snprintf(path, sizeof path, "%s/%s.gguf", dir, cases[k].tag);
        FILE *o = fopen(path, "wb");
        if (!o) continue;
        uint8_t saved = 0;
        if (cases[k].poke_at >= 0) {
            saved = img[cases[k].poke_at];
            img[cases[k].poke_at] = cases[k].poke;
        }
        fwrite(img, 1, (size_t)cases[k].len, o);
        fclose(o);
        if (cases[k].poke_at >= 0) img[cases[k].poke_at] = saved;
        char *out = NULL;
        snprintf(cmd, sizeof cmd, "'%s' inspect '%s' 2>&1", t_bin("glm5-shard"), path);
        int rc = t_run_capture(cmd, &out);
        T_CHECK(rc != 0 && rc != 1 && rc != -1, "%s: exit %d (want the error code)", cases[k].tag,
                rc);
        T_CHECK(out && strstr(out, "at byte "), "%s: message has a byte offset: %s", cases[k].tag,
                out ? out : "");
        T_CHECK(out && strstr(out, path), "%s: message names the file", cases[k].tag);
        free(out);
    }
    free(img);
}

/* W_UK/W_UV count as the GPU decode reads them: where attn_k_b and attn_v_b are both of types
 * with the exact int8 form (quant_exact_i8), that form, 1.25 bytes per element, and kv_b beside
 * them not at all; otherwise the float32 kv_b, whatever type kv_b is stored in (the pair beside
 * it not read; without kv_b, a GGUF, the pair counts as the float32 kv_b rebuilt from it: 4
 * bytes per element, the same bytes). */
static void test_decode_bytes_kv_b(void) {
    glm5_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.n_layer = hp.n_layer_main = 1;
    hp.n_expert = 8;
    hp.n_expert_used = 2;
    static const struct { const char *what; uint32_t kvb; int has_kvb, has_pair; uint32_t kt, vt; int i8; } c[] = {
        {"F32 kv_b and a Q5_0/Q6_K pair (converter 1.1)", QT_F32, 1, 1, QT_Q5_0, QT_Q6_K, 1},
        {"BF16 kv_b and a Q8_0/IQ4_XS pair", QT_BF16, 1, 1, QT_Q8_0, QT_IQ4_XS, 1},
        {"F32 kv_b and a Q5_1/Q6_K pair (Q5_1 has no int8 form)", QT_F32, 1, 1, QT_Q5_1, QT_Q6_K, 0},
        {"Q8_0 kv_b alone (--kv-b-type q8_0)", QT_Q8_0, 1, 0, 0, 0, 0},
        {"F32 kv_b alone (converter 1.0)", QT_F32, 1, 0, 0, 0, 0},
        {"a Q4_0/IQ4_NL pair alone (a GGUF)", QT_F32, 0, 1, QT_Q4_0, QT_IQ4_NL, 1},
        {"a Q5_0/Q5_K pair alone (Q5_K has no int8 form)", QT_F32, 0, 1, QT_Q5_0, QT_Q5_K, 0},
    };
    const double f32_kvb = 4.0 * 512 * 1792; /* kv_lora 512, 4 heads x (192 + 256) rows */
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        glm5_tensor_ref t[4];
        uint64_t n = 0;
        t[n++] = (glm5_tensor_ref){"blk.0.attn_q_a.weight", QT_Q8_0, {64, 32, 1, 1}, 1000};
        /* kv_b's stored bytes (7000 here, whatever its type) are never what counts */
        if (c[i].has_kvb) t[n++] = (glm5_tensor_ref){"blk.0.attn_kv_b.weight", c[i].kvb, {512, 1792, 1, 1}, 7000};
        if (c[i].has_pair) {
            t[n++] = (glm5_tensor_ref){"blk.0.attn_k_b.weight", c[i].kt, {192, 512, 4, 1}, 5000};
            t[n++] = (glm5_tensor_ref){"blk.0.attn_v_b.weight", c[i].vt, {512, 256, 4, 1}, 6000};
        }
        glm5_decode_bytes db;
        glm5_decode_bytes_of(&hp, t, n, &db);
        const double want = 1000 + (c[i].i8 ? f32_kvb / 4 * 1.25 : f32_kvb);
        T_CHECK(fabs(db.total - want) < 1e-6 && fabs(db.group[GLM5_DB_ATTN] - want) < 1e-6,
                "decode bytes, %s: total %.0f, attention %.0f (want %.0f)", c[i].what, db.total,
                db.group[GLM5_DB_ATTN], want);
    }
}

int main(void) {
    json_t *ref = load_json(t_shared("oracle/glm5-tiny/dequant_reference.json"));
    T_CHECK(ref != NULL, "dequant_reference.json loads");
    const char *dir = t_tmpdir();
    char *d = strdup(dir);
    test_decode_bytes_kv_b();
    test_oracle_report(ref);
    test_cli_json(ref);
    if (ref) test_dump(d, ref);
    test_audit_failures(d);
    test_other_arch(d);
    test_corrupt(d);
    json_decref(ref);
    t_rmtree(d);
    free(d);
    return t_report("test_inspect");
}
