/* The glm5-shard command line, run as a user would: usage errors and exit codes, synth ->
 * inspect round trips, split sets, --dry-run, --json, --dump, errors naming their cause, and
 * convert -> verify -> inspect OUTDIR on a synthetic model, with a damaged blob and a refusal.
 * The binary is $G5_BIN_DIR/glm5-shard, else $BUILD/bin/glm5-shard, else build/bin/. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <jansson.h>

#include "format/gguf.h"
#include "test_util.h"

static char g_bin[4096];
static char g_dir[4096];

static void find_bin(void) {
    const char *dir = getenv("G5_BIN_DIR");
    if (dir && *dir) {
        snprintf(g_bin, sizeof g_bin, "%s/glm5-shard", dir);
    } else {
        const char *b = getenv("BUILD");
        snprintf(g_bin, sizeof g_bin, "%s/bin/glm5-shard", b && *b ? b : "build");
    }
}

/* Runs `glm5-shard ARGS` (ARGS is shell text), stdout+stderr into *out (malloc'ed, may be
 * NULL). Returns the exit status, -1 if it did not exit normally. */
static int sh(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int sh(char **out, const char *fmt, ...) {
    char args[8192], cmd[8192 + 4096 + 16];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", g_bin, args);
    return t_run_capture(cmd, out);
}

static int has(const char *out, const char *needle) { return out && strstr(out, needle); }

static const char *path_in(const char *name) {
    static char buf[8][4300];
    static int slot;
    char *b = buf[slot++ & 7];
    snprintf(b, sizeof buf[0], "%s/%s", g_dir, name);
    return b;
}

static void test_usage(void) {
    char *out = NULL;
    int rc = sh(&out, "--help");
    T_CHECK(rc == 0 && has(out, "inspect") && has(out, "synth") && has(out, "convert --tp") &&
                has(out, "verify OUTDIR"),
            "--help: exit %d", rc);
    free(out);
    T_CHECK(sh(NULL, "%s", "") == 2, "no command: exit 2");
    rc = sh(&out, "frobnicate");
    T_CHECK(rc == 2 && has(out, "frobnicate"), "unknown command named, exit %d", rc);
    free(out);
    T_CHECK(sh(NULL, "inspect") == 2, "inspect without a file");
    T_CHECK(sh(NULL, "inspect a.gguf b.gguf") == 2, "inspect with two files");
    rc = sh(&out, "inspect x.gguf --dump blk.0.attn_norm.weight");
    T_CHECK(rc == 2 && has(out, "-o"), "--dump without -o: exit %d", rc);
    free(out);
    rc = sh(&out, "inspect x.gguf --frob");
    T_CHECK(rc == 2 && has(out, "--frob"), "unknown option named: exit %d", rc);
    free(out);
    rc = sh(&out, "synth -o x.gguf");
    T_CHECK(rc == 2 && has(out, "--preset"), "synth without --preset: exit %d", rc);
    free(out);
    rc = sh(&out, "synth --preset huge -o x.gguf");
    T_CHECK(rc == 2 && has(out, "huge"), "bad preset named: exit %d", rc);
    free(out);
    T_CHECK(sh(NULL, "synth --preset tiny") == 2, "synth without -o");
    T_CHECK(sh(NULL, "synth --preset tiny --layers 0 -o x.gguf") == 2, "--layers 0");
    T_CHECK(sh(NULL, "synth --preset tiny --split-size 12Q -o x.gguf") == 2, "bad --split-size");
    T_CHECK(sh(NULL, "synth --preset tiny --seed -3 -o x.gguf") == 2, "bad --seed");
    rc = sh(&out, "synth --preset tiny --tp-friendly --experts 6 -o '%s'", path_in("x.gguf"));
    T_CHECK(rc == 3 && has(out, "multiple of 8"), "tp-friendly with 6 experts: exit %d", rc);
    free(out);
    T_CHECK(access(path_in("x.gguf"), F_OK) != 0, "nothing written on a refusal");
}

static void test_synth_inspect(void) {
    char *out = NULL;
    const char *a = path_in("a.gguf"), *b = path_in("b.gguf");
    int rc = sh(&out, "synth --preset tiny --seed 5 -o '%s'", a);
    T_CHECK(rc == 0 && has(out, a) && has(out, "94 tensors"), "synth tiny: exit %d: %s", rc,
            out ? out : "");
    free(out);
    rc = sh(NULL, "synth --preset=tiny --seed=5 --output='%s'", b);
    T_CHECK(rc == 0 && t_file_equal(a, b), "same seed through the CLI: same bytes");

    rc = sh(&out, "inspect '%s'", a);
    T_CHECK(rc == 0 && has(out, "audit: PASSED") && has(out, "blk.3.nextn.eh_proj.weight") &&
                has(out, "totals by type"),
            "inspect synth: exit %d", rc);
    free(out);
    rc = sh(&out, "inspect '%s' --json --max-array 3", a);
    json_error_t je;
    json_t *j = rc == 0 && out ? json_loads(out, 0, &je) : NULL;
    T_CHECK(j != NULL, "--json parses (exit %d)", rc);
    if (j) {
        T_CHECK(json_integer_value(json_object_get(j, "n_tensors")) == 94, "json: 94 tensors");
        size_t i;
        json_t *m;
        json_array_foreach(json_object_get(j, "metadata"), i, m)
            if (!strcmp(json_string_value(json_object_get(m, "key")), "tokenizer.ggml.merges"))
                T_CHECK(json_array_size(json_object_get(m, "values")) == 3, "--max-array 3");
        json_decref(j);
    }
    free(out);

    /* --dump */
    const char *f32 = path_in("norm.f32");
    rc = sh(&out, "inspect '%s' --dump blk.1.attn_norm.weight -o '%s'", a, f32);
    struct stat sb;
    T_CHECK(rc == 0 && stat(f32, &sb) == 0 && sb.st_size == 512 * 4, "dump a norm: exit %d", rc);
    free(out);
    FILE *f = fopen(f32, "rb");
    float v[512];
    int near_one = f && fread(v, 4, 512, f) == 512;
    for (int i = 0; near_one && i < 512; i++) near_one = v[i] > 0.8f && v[i] < 1.2f;
    if (f) fclose(f);
    T_CHECK(near_one, "synth norms are near 1.0");
    rc = sh(&out, "inspect '%s' --dump blk.9.nothing.weight -o '%s'", a, path_in("n.f32"));
    T_CHECK(rc == 3 && has(out, "blk.9.nothing.weight"), "dump of a missing tensor: exit %d", rc);
    free(out);

    /* errors */
    rc = sh(&out, "inspect '%s'", path_in("missing.gguf"));
    T_CHECK(rc == 3 && has(out, "missing.gguf") && has(out, "No such file"),
            "missing file: exit %d", rc);
    free(out);
    FILE *g = fopen(path_in("junk.gguf"), "wb");
    if (g) {
        fputs("GGUF\x03\0\0\0 this is not a model", g);
        fclose(g);
    }
    rc = sh(&out, "inspect '%s'", path_in("junk.gguf"));
    T_CHECK(rc == 3 && has(out, "at byte"), "junk file: exit %d, offset in %s", rc, out ? out : "");
    free(out);
    rc = sh(&out, "inspect '%s'", g_dir);
    T_CHECK(rc == 1 && has(out, "FAILED"), "a directory without blobs: exit %d", rc);
    free(out);
}

static void test_split_and_dry_run(void) {
    char *out = NULL;
    int rc = sh(&out, "synth --preset tiny --seed 5 --split-size 8M -o '%s'", path_in("s.gguf"));
    T_CHECK(rc == 0 && has(out, "splits"), "synth split: exit %d", rc);
    free(out);
    const char *s1 = path_in("s-00001-of-00004.gguf"), *s2 = path_in("s-00002-of-00004.gguf");
    T_CHECK(access(s1, F_OK) == 0 && access(s2, F_OK) == 0, "4 splits of 8 MiB for 27 MiB");
    rc = sh(&out, "inspect '%s'", s2);
    T_CHECK(rc == 0 && has(out, "audit: PASSED") && has(out, "4 split file(s)"),
            "inspect through split 2: exit %d", rc);
    free(out);
    gguf_ctx *ctx = NULL;
    T_CHECK(gguf_open(s1, &ctx, NULL) == G5_OK && gguf_get_n_tensors(ctx) == 94, "split set opens");
    gguf_free(ctx);

    rc = sh(&out, "synth --preset glm5 --layers 2 --experts 16 --dry-run");
    T_CHECK(rc == 0 && has(out, "blk.0.ffn_down.weight") && has(out, "{2048, 16384}") &&
                has(out, "blk.1.ffn_gate_exps.weight") && has(out, "{6144, 2048, 16}"),
            "glm5 dry run: exit %d", rc);
    free(out);
}


/* Flips one byte of a file in place. */
static int flip_byte(const char *path, long off) {
    FILE *f = fopen(path, "r+b");
    if (!f) return -1;
    int rc = -1;
    if (fseek(f, off, SEEK_SET) == 0) {
        int c = fgetc(f);
        if (c != EOF && fseek(f, off, SEEK_SET) == 0 && fputc(c ^ 0x40, f) != EOF) rc = 0;
    }
    fclose(f);
    return rc;
}

static void test_convert_verify(void) {
    char *out = NULL;
    long damage_at = -1;
    const char *model = path_in("a.gguf"), *od = path_in("tp2");
    int rc = sh(&out, "convert --tp 2 --quiet -o '%s' '%s'", od, model);
    T_CHECK(rc == 0 && has(out, "rank-00001-of-00002.g5b"), "convert --tp 2: exit %d: %s", rc,
            out ? out : "");
    free(out);
    rc = sh(&out, "verify '%s'", od);
    T_CHECK(rc == 0 && has(out, "rank-00000-of-00002.g5b: OK") && has(out, "verify: OK"),
            "verify: exit %d", rc);
    free(out);
    rc = sh(&out, "verify '%s' --deep '%s' --jobs 2", od, model);
    T_CHECK(rc == 0 && has(out, "verify: OK"), "verify --deep: exit %d", rc);
    free(out);

    /* inspect OUTDIR: the set as the converter described it */
    rc = sh(&out, "inspect '%s'", od);
    T_CHECK(rc == 0 && has(out, "set record: tp 2") && has(out, "blob set: OK") &&
                has(out, "blk.0.attn_kv_b.weight"),
            "inspect OUTDIR: exit %d", rc);
    free(out);
    rc = sh(&out, "inspect '%s' --json", od);
    json_error_t je;
    json_t *j = rc == 0 && out ? json_loads(out, 0, &je) : NULL;
    T_CHECK(j != NULL, "inspect OUTDIR --json parses (exit %d)", rc);
    if (j) {
        T_CHECK(!strcmp(json_string_value(json_object_get(j, "kind")), "blobset"), "kind blobset");
        T_CHECK(json_integer_value(json_object_get(j, "tp")) == 2 &&
                    json_array_size(json_object_get(j, "ranks")) == 2,
                "2 ranks");
        /* 94 source tensors, all carried, plus one attn_kv_b rebuilt per layer: 4 layers */
        T_CHECK(json_integer_value(json_object_get(j, "n_tensors")) == 94 + 4, "98 blob tensors");
        size_t i;
        json_t *t;
        /* per rank: the main layers' attention reads q_a, q_b, kv_a, attn_output as stored and
         * W_UK/W_UV as kv_b's exact int8 form made from the attn_k_b/attn_v_b carried beside it
         * (the oracle's Q5_0/Q6_K have one: 1.25 bytes per element), not the float32 kv_b */
        const json_t *mj = json_object_get(j, "model"), *dpt = json_object_get(mj, "decode_per_token");
        const long long nlm = json_integer_value(json_object_get(json_object_get(mj, "hparams"), "n_layer_main"));
        double want_attn = 0, got_attn = -1;
        json_array_foreach(json_object_get(j, "tensors"), i, t) {
            const char *nm = json_string_value(json_object_get(t, "name"));
            int layer = -1, off = 0;
            if (!nm || sscanf(nm, "blk.%d.%n", &layer, &off) != 1 || !off || layer >= nlm) continue;
            if (!strcmp(nm + off, "attn_k_b.weight") || !strcmp(nm + off, "attn_v_b.weight")) {
                double e = 1.25;
                const json_t *l = json_object_get(t, "local_shape");
                for (size_t d = 0; d < json_array_size(l); d++) e *= (double)json_integer_value(json_array_get(l, d));
                want_attn += e;
            } else if (!strcmp(nm + off, "attn_q_a.weight") || !strcmp(nm + off, "attn_q_b.weight") ||
                       !strcmp(nm + off, "attn_kv_a_mqa.weight") || !strcmp(nm + off, "attn_output.weight")) {
                want_attn += (double)json_integer_value(json_object_get(t, "bytes"));
            }
        }
        json_array_foreach(json_object_get(dpt, "groups"), i, t)
            if (!strcmp(json_string_value(json_object_get(t, "group")), "attention"))
                got_attn = json_real_value(json_object_get(t, "bytes"));
        T_CHECK(nlm == 3 && want_attn > 0 && fabs(got_attn - want_attn) < 1e-9 * want_attn &&
                    json_real_value(json_object_get(dpt, "total_bytes")) > got_attn,
                "blob set: decode attention bytes per rank %.0f (want %.0f: the pair's int8 form, not kv_b)",
                got_attn, want_attn);
        int bad = 0;
        json_array_foreach(json_object_get(j, "tensors"), i, t) {
            const json_t *ax = json_object_get(t, "axis");
            const json_t *g = json_object_get(t, "shape"), *l = json_object_get(t, "local_shape");
            for (size_t d = 0; d < json_array_size(g); d++) {
                json_int_t gd = json_integer_value(json_array_get(g, d));
                json_int_t ld = json_integer_value(json_array_get(l, d));
                int split_here = json_is_integer(ax) && (size_t)json_integer_value(ax) == d;
                if (split_here ? gd != 2 * ld : gd != ld) bad++;
            }
        }
        T_CHECK(bad == 0, "%d local shapes are not the global shape cut in 2 along the axis", bad);
        /* the middle of blk.1.attn_q_b.weight, for the damage below */
        json_array_foreach(json_object_get(j, "tensors"), i, t)
            if (!strcmp(json_string_value(json_object_get(t, "name")), "blk.1.attn_q_b.weight"))
                damage_at = (long)(json_integer_value(json_object_get(t, "offset")) +
                                   json_integer_value(json_object_get(t, "bytes")) / 2);
        json_decref(j);
    }
    free(out);

    /* a damaged data byte: verify fails naming the rank file and the tensor; the index is fine */
    char r1[4300];
    snprintf(r1, sizeof r1, "%s/rank-00001-of-00002.g5b", od);
    struct stat sb;
    T_CHECK(stat(r1, &sb) == 0, "rank 1 exists");
    T_CHECK(damage_at > 0 && damage_at < sb.st_size && flip_byte(r1, damage_at) == 0,
            "damage rank 1 at %ld", damage_at);
    rc = sh(&out, "verify '%s'", od);
    T_CHECK(rc == 1 && has(out, "rank-00001-of-00002.g5b: FAILED") &&
                has(out, "tensor 'blk.1.attn_q_b.weight'") &&
                has(out, "rank-00000-of-00002.g5b: OK"),
            "verify after damage: exit %d: %s", rc, out ? out : "");
    free(out);
    /* a damaged header byte: the index no longer opens, inspect says so */
    T_CHECK(flip_byte(r1, 40) == 0, "damage rank 1's header");
    rc = sh(&out, "inspect '%s'", od);
    T_CHECK(rc == 1 && has(out, "rank 1") && has(out, "FAILED"), "inspect damaged set: exit %d", rc);
    free(out);
    /* no set record: an unfinished conversion */
    char rec[4300];
    snprintf(rec, sizeof rec, "%s/blobset.g5s", od);
    T_CHECK(unlink(rec) == 0, "remove the set record");
    rc = sh(&out, "inspect '%s'", od);
    T_CHECK(rc == 1 && has(out, "set record"), "inspect without a set record: exit %d", rc);
    free(out);
    rc = sh(&out, "verify '%s'", od);
    T_CHECK(rc == 1, "verify without a set record: exit %d", rc);
    free(out);

    /* refusal: tiny's ffn_down_exps (Q5_K, ne[0] 512) cannot be cut 4 ways */
    const char *od4 = path_in("tp4");
    rc = sh(&out, "convert --tp 4 -o '%s' '%s'", od4, model);
    T_CHECK(rc == 3 && has(out, "ffn_down_exps") && has(out, "Q5_K") && has(out, "--ep"),
            "convert --tp 4 refused: exit %d: %s", rc, out ? out : "");
    free(out);
    T_CHECK(access(od4, F_OK) != 0, "a refusal writes nothing");
    rc = sh(&out, "convert --tp 4 --ep --quiet -o '%s' '%s'", od4, model);
    T_CHECK(rc == 0, "convert --tp 4 --ep: exit %d: %s", rc, out ? out : "");
    free(out);
    rc = sh(&out, "verify '%s'", od4);
    T_CHECK(rc == 0, "verify ep set: exit %d", rc);
    free(out);
    rc = sh(&out, "inspect '%s'", od4);
    T_CHECK(rc == 0 && has(out, "placement ep"), "inspect ep set: exit %d", rc);
    free(out);

    /* --dry-run and --json */
    rc = sh(&out, "convert --tp 2 --dry-run '%s'", model);
    T_CHECK(rc == 0 && has(out, "blk.0.attn_kv_b.weight") && has(out, "nothing written"),
            "dry run: exit %d", rc);
    free(out);
    const char *odj = path_in("tp2j");
    rc = sh(&out, "convert --tp 2 --json -o '%s' '%s'", odj, model);
    j = rc == 0 && out ? json_loads(out, 0, &je) : NULL;
    T_CHECK(j && json_integer_value(json_object_get(j, "tp")) == 2, "convert --json (exit %d)", rc);
    json_decref(j);
    free(out);

    /* --tp-friendly: T = 8 works (one main layer keeps it small) */
    const char *tf = path_in("tf.gguf"), *od8 = path_in("tp8");
    rc = sh(&out, "synth --preset tiny --tp-friendly --layers 1 -o '%s'", tf);
    T_CHECK(rc == 0, "synth --tp-friendly: exit %d", rc);
    free(out);
    rc = sh(&out, "convert --tp 8 --quiet -o '%s' '%s'", od8, tf);
    T_CHECK(rc == 0, "tp-friendly converts at T = 8: exit %d: %s", rc, out ? out : "");
    free(out);
    rc = sh(&out, "verify '%s' --deep '%s'", od8, tf);
    T_CHECK(rc == 0, "and verifies deeply: exit %d", rc);
    free(out);

    /* usage */
    T_CHECK(sh(NULL, "convert -o x '%s'", model) == 2, "convert without --tp");
    T_CHECK(sh(NULL, "convert --tp 2 '%s'", model) == 2, "convert without -o");
    T_CHECK(sh(NULL, "convert --tp 2 --kv-b-type q4_0 -o x '%s'", model) == 2, "bad --kv-b-type");
    T_CHECK(sh(NULL, "verify") == 2, "verify without a directory");
}

int main(void) {
    find_bin();
    if (access(g_bin, X_OK) != 0) {
        T_CHECK(0, "binary %s not found (build it, or set G5_BIN_DIR / BUILD)", g_bin);
        return t_report("test_cli");
    }
    snprintf(g_dir, sizeof g_dir, "%s", t_tmpdir());
    test_usage();
    test_synth_inspect();
    test_split_and_dry_run();
    test_convert_verify();
    t_rmtree(g_dir);
    return t_report("test_cli");
}
