/* Every weight type end to end on the CPU: synth's type presets (ud-q3_k_xl, ud-q2_k_xl,
 * ud-iq2_xxs, ud-iq1_m, ud-iq1_s, ud-fp4) cover every supported block type; each preset's tiny
 * model runs from the GGUF (TP 1), from TP 1 blobs and from TP 2 --ep blobs, and the logits (all
 * positions) and the NextN block's draft logits (all positions, from the GGUF run's hidden
 * states) agree to 1e-5 (relative L2). Also: the type-map
 * parser's refusals, synth's refusal of a width a block does not divide (naming the tensor), and
 * the converter's refusal of a split that cuts an i-quant block (naming the tensor). */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "convert/convert.h"
#include "convert/inspect.h"
#include "convert/synth.h"
#include "format/gguf.h"
#include "format/quant.h"
#include "runtime/cpu/model.h"
#include "runtime/cpu/weights.h"
#include "tests/test_util.h"

static const char *const k_presets[] = {"ud-q3_k_xl", "ud-q2_k_xl", "ud-iq2_xxs",
                                        "ud-iq1_m",   "ud-iq1_s",   "ud-fp4"};
#define N_PRESETS (sizeof k_presets / sizeof k_presets[0])

static double rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static int all_finite(const float *a, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(a[i])) return 0;
    return 1;
}

enum { N_TOK = 12 };

/* Logits of every prompt position and the NextN draft logits of every position of the
 * model at `path` (a GGUF or a blob directory); 0 on success. */
static int run_model(const char *path, int blobs, uint32_t want_ranks, float *logits, float *draft,
                     float *hidden_io, int hidden_given, uint32_t *n_vocab, const char *label) {
    g5_error e = {0};
    rt_wset *ws = NULL;
    rt_model *m = NULL;
    rt_state *s = NULL;
    int ok = (blobs ? rt_wset_open_blobs(path, &ws, &e) : rt_wset_open_gguf(path, &ws, &e)) == G5_OK;
    T_CHECK(ok, "%s: open: %s", label, e.msg);
    rt_model_opts opts = {.n_threads = 2, .mla = RT_MLA_ABSORBED};
    ok = ok && rt_model_create(ws, &opts, &m, &e) == G5_OK;
    T_CHECK(ok, "%s: model: %s", label, e.msg);
    if (ok) T_CHECK(rt_model_n_ranks(m) == want_ranks, "%s: %u ranks", label, rt_model_n_ranks(m));
    ok = ok && rt_state_create(m, &s, &e) == G5_OK;
    const uint32_t V = ok ? rt_model_hparams(m)->n_vocab : 0;
    const uint32_t E = ok ? rt_model_hparams(m)->n_embd : 0;
    float *hidden = ok && E <= 8192 ? malloc((size_t)N_TOK * E * sizeof(float)) : NULL;
    if (ok && V > *n_vocab) {
        T_CHECK(0, "%s: vocabulary %u too large", label, V);
        ok = 0;
    }
    int32_t tok[N_TOK], next[N_TOK];
    for (int i = 0; i < N_TOK; i++) tok[i] = (int32_t)((i * 131 + 7) % (V ? V : 1));
    for (int i = 0; i < N_TOK; i++) next[i] = i + 1 < N_TOK ? tok[i + 1] : 5;
    rt_outputs out = {.logits = logits, .all_logits = 1, .hidden = hidden};
    ok = ok && hidden && rt_model_forward(m, s, tok, N_TOK, &out, &e) == G5_OK;
    T_CHECK(ok, "%s: forward: %s", label, e.msg);
    /* The NextN block reads the reference run's hidden states, so that its own products are
     * what is compared (the main model's are, by the logits). */
    if (ok && hidden_given) memcpy(hidden, hidden_io, (size_t)N_TOK * E * sizeof(float));
    else if (ok) memcpy(hidden_io, hidden, (size_t)N_TOK * E * sizeof(float));
    ok = ok && rt_model_mtp(m, s, hidden, next, N_TOK, draft, 1, &e) == G5_OK;
    T_CHECK(ok, "%s: NextN block: %s", label, e.msg);
    if (ok) *n_vocab = V;
    free(hidden);
    rt_state_free(s);
    rt_model_free(m);
    rt_wset_free(ws);
    return ok ? 0 : -1;
}

static void test_presets_tp(const char *dir) {
    enum { VMAX = 4096 };
    int seen[QT_TYPE_LIMIT] = {0};
    float *ref = malloc((size_t)N_TOK * VMAX * sizeof(float)), *got = malloc((size_t)N_TOK * VMAX * sizeof(float));
    float *dref = malloc((size_t)N_TOK * VMAX * sizeof(float)), *dgot = malloc((size_t)N_TOK * VMAX * sizeof(float));
    float *hid = malloc((size_t)N_TOK * 8192 * sizeof(float));
    if (!ref || !got || !dref || !dgot || !hid) {
        T_CHECK(0, "oom");
        free(ref), free(got), free(dref), free(dgot), free(hid);
        return;
    }
    for (size_t p = 0; p < N_PRESETS; p++) {
        g5_error e = {0};
        synth_opts o;
        synth_opts_init(&o);
        o.seed = 11 + p;
        T_CHECK(synth_type_preset(k_presets[p], &o, &e) == G5_OK, "%s: %s", k_presets[p], e.msg);
        synth_plan *plan = NULL;
        if (synth_plan_build(&o, &plan, &e) == G5_OK) {
            for (uint64_t i = 0; i < plan->n_tensors; i++) seen[plan->tensors[i].type] = 1;
            synth_plan_free(plan);
        }
        char gguf[4200], tp1[4200], tp2[4200], label[96];
        snprintf(gguf, sizeof gguf, "%s/%s.gguf", dir, k_presets[p]);
        snprintf(tp1, sizeof tp1, "%s/%s-tp1", dir, k_presets[p]);
        snprintf(tp2, sizeof tp2, "%s/%s-tp2ep", dir, k_presets[p]);
        if (synth_write(&o, gguf, NULL, &e) != G5_OK) {
            T_CHECK(0, "%s: synth: %s", k_presets[p], e.msg);
            continue;
        }
        convert_options co;
        convert_options_init(&co);
        co.tp = 1;
        T_CHECK(convert_run(gguf, tp1, &co, NULL, &e) == G5_OK, "%s: convert TP 1: %s", k_presets[p], e.msg);
        co.tp = 2;
        co.ep = 1;
        T_CHECK(convert_run(gguf, tp2, &co, NULL, &e) == G5_OK, "%s: convert TP 2 --ep: %s", k_presets[p], e.msg);

        uint32_t V = VMAX;
        snprintf(label, sizeof label, "%s GGUF", k_presets[p]);
        if (run_model(gguf, 0, 1, ref, dref, hid, 0, &V, label)) continue;
        T_CHECK(all_finite(ref, (size_t)N_TOK * V) && all_finite(dref, (size_t)N_TOK * V), "%s: non-finite logits", label);
        const char *paths[2] = {tp1, tp2};
        for (int k = 0; k < 2; k++) {
            uint32_t V2 = VMAX;
            snprintf(label, sizeof label, "%s blobs TP %d%s", k_presets[p], k + 1, k ? " --ep" : "");
            if (run_model(paths[k], 1, (uint32_t)k + 1, got, dgot, hid, 1, &V2, label) || V2 != V) continue;
            const double r = rel_l2(got, ref, (size_t)N_TOK * V), rd = rel_l2(dgot, dref, (size_t)N_TOK * V);
            printf("%s: logits rel L2 vs the GGUF %.3e, NextN draft %.3e\n", label, r, rd);
            T_CHECK(r <= 1e-5, "%s: logits differ from TP 1 by %.3e", label, r);
            T_CHECK(rd <= 1e-5, "%s: NextN draft logits differ by %.3e", label, rd);
        }
    }
    /* Every block type the CPU dequantizes is in some preset. */
    for (uint32_t t = 0; t < QT_TYPE_LIMIT; t++) {
        const quant_type_info *qi = quant_type_get(t);
        if (qi && qi->supported && qi->block_elems > 1)
            T_CHECK(seen[t], "%s is in no preset", qi->name);
    }
    free(ref), free(got), free(dref), free(dgot), free(hid);
}

static void test_type_map(const char *dir) {
    g5_error e = {0};
    synth_opts o;
    synth_opts_init(&o);
    T_CHECK(synth_type_map_parse("ffn_up_exps=iq2_xxs,exps_gate_up=IQ1_S,attn_k_b=MXFP4", &o, &e) == G5_OK,
            "type map: %s", e.msg);
    T_CHECK(synth_opts_role_type(&o, GLM5_ROLE_EXP_UP) == QT_IQ1_S, "later items win");
    T_CHECK(synth_opts_role_type(&o, GLM5_ROLE_EXP_DOWN) == QT_Q5_K, "unmapped roles keep the mix");
    T_CHECK(synth_opts_role_type(&o, GLM5_ROLE_ATTN_K_B) == QT_MXFP4, "attn_k_b");
    T_CHECK(synth_type_map_parse("ffn_up_exps=Q8_K", &o, &e) == G5_ERR_INVALID_ARG && strstr(e.msg, "Q8_K"),
            "unsupported type refused: %s", e.msg);
    T_CHECK(synth_type_map_parse("attn_norm=Q8_0", &o, &e) == G5_ERR_INVALID_ARG && strstr(e.msg, "attn_norm"),
            "norm refused: %s", e.msg);
    T_CHECK(synth_type_map_parse("ffn_upp=Q8_0", &o, &e) == G5_ERR_INVALID_ARG && strstr(e.msg, "ffn_upp"),
            "unknown role refused: %s", e.msg);
    T_CHECK(synth_type_map_parse("ffn_up", &o, &e) == G5_ERR_INVALID_ARG, "item without '='");
    T_CHECK(synth_type_map_parse("ffn_up=Q8_0,,", &o, &e) == G5_ERR_INVALID_ARG, "empty item");
    T_CHECK(synth_type_preset("ud-iq9", &o, &e) == G5_ERR_INVALID_ARG && strstr(e.msg, "ud-iq1_s"),
            "unknown preset lists the presets: %s", e.msg);

    /* attn_k_b is 192 wide: a 256-element block cannot hold a row. */
    synth_opts_init(&o);
    T_CHECK(synth_type_map_parse("attn_k_b=IQ2_XXS", &o, &e) == G5_OK, "map");
    synth_plan *plan = NULL;
    T_CHECK(synth_plan_build(&o, &plan, &e) == G5_ERR_ALIGN && strstr(e.msg, "blk.0.attn_k_b.weight") &&
                strstr(e.msg, "IQ2_XXS") && strstr(e.msg, "256"),
            "misfit width refused naming the tensor: %s", e.msg);
    synth_plan_free(plan);

    /* TP 4 without --ep splits ffn_down_exps (512 wide) into 128 columns: IQ1_S blocks are 256. */
    synth_opts_init(&o);
    T_CHECK(synth_type_map_parse("ffn_down_exps=IQ1_S", &o, &e) == G5_OK, "map");
    char gguf[4200], out[4200];
    snprintf(gguf, sizeof gguf, "%s/misfit.gguf", dir);
    snprintf(out, sizeof out, "%s/misfit-tp4", dir);
    T_CHECK(synth_write(&o, gguf, NULL, &e) == G5_OK, "synth: %s", e.msg);
    convert_options co;
    convert_options_init(&co);
    co.tp = 4;
    const g5_status st = convert_run(gguf, out, &co, NULL, &e);
    T_CHECK(st != G5_OK && strstr(e.msg, "ffn_down_exps") && strstr(e.msg, "IQ1_S") && strstr(e.msg, "256"),
            "TP 4 split of IQ1_S refused naming the tensor: %s", e.msg);
}

/* inspect's bits per weight: each type's block bits (IQ1_S 50 B / 256 = 1.5625, ...), weights
 * summed over its tensors, and the file's total. */
static void test_inspect_bpw(const char *dir) {
    g5_error e = {0};
    synth_opts o;
    synth_opts_init(&o);
    char path[4200];
    snprintf(path, sizeof path, "%s/bpw.gguf", dir);
    T_CHECK(synth_type_preset("ud-iq1_s", &o, &e) == G5_OK && synth_write(&o, path, NULL, &e) == G5_OK,
            "synth: %s", e.msg);
    gguf_ctx *ctx = NULL;
    json_t *rep = NULL;
    if (gguf_open(path, &ctx, &e) == G5_OK) inspect_gguf(ctx, path, NULL, &rep, &e);
    T_CHECK(rep != NULL, "inspect: %s", e.msg);
    uint64_t sum_w = 0, sum_b = 0, want_w = 0;
    int checked = 0;
    for (int64_t i = 0; ctx && i < gguf_get_n_tensors(ctx); i++) want_w += gguf_get_tensor(ctx, i)->n_elems;
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(rep, "totals_by_type"), i, t) {
        const int type = quant_type_from_name(json_string_value(json_object_get(t, "type")));
        const quant_type_info *qi = type >= 0 ? quant_type_get((uint32_t)type) : NULL;
        const uint64_t w = (uint64_t)json_integer_value(json_object_get(t, "weights"));
        const uint64_t b = (uint64_t)json_integer_value(json_object_get(t, "bytes"));
        const double bpw = json_real_value(json_object_get(t, "bits_per_weight"));
        T_CHECK(qi && w * qi->block_bytes == b * qi->block_elems, "%s: %llu weights in %llu bytes",
                qi ? qi->name : "?", (unsigned long long)w, (unsigned long long)b);
        if (qi) T_CHECK(bpw == 8.0 * qi->block_bytes / qi->block_elems, "%s: %.4f bits/weight", qi->name, bpw);
        sum_w += w;
        sum_b += b;
        checked++;
    }
    T_CHECK(checked >= 8, "%d types listed", checked);
    T_CHECK(sum_w == want_w && (uint64_t)json_integer_value(json_object_get(rep, "total_weights")) == want_w,
            "total weights %llu, want %llu", (unsigned long long)sum_w, (unsigned long long)want_w);
    const double tot = json_real_value(json_object_get(rep, "total_bits_per_weight"));
    T_CHECK(want_w && fabs(tot - 8.0 * (double)sum_b / (double)want_w) < 1e-12 && tot > 1.5 && tot < 8,
            "total %.4f bits/weight", tot);
    json_decref(rep);
    gguf_free(ctx);
}

/* The CLI: --types and --type-map reach synth, their errors are usage errors (exit 2) or
 * refusals naming the tensor (exit 3), and inspect prints bits per weight. */
static void test_cli(const char *dir) {
    char cmd[9000], *out = NULL;
    const char *sh = t_bin("glm5-shard");
    snprintf(cmd, sizeof cmd, "'%s' synth --preset tiny --types ud-iq1_s --type-map ffn_down_exps=TQ2_0 --dry-run 2>&1", sh);
    int rc = t_run_capture(cmd, &out);
    const int has_iq1 = out && strstr(out, "IQ1_S");
    char *line = out ? strstr(out, "blk.1.ffn_down_exps.weight") : NULL;
    if (line && strchr(line, '\n')) *strchr(line, '\n') = 0; /* the tensor's line only */
    T_CHECK(rc == 0 && has_iq1 && line && strstr(line, " TQ2_0 "),
            "synth --types --type-map --dry-run: exit %d: %s", rc, line ? line : "");
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' synth --preset tiny --types ud-iq9 -o '%s/x.gguf' 2>&1", sh, dir);
    rc = t_run_capture(cmd, &out);
    T_CHECK(rc == 2 && out && strstr(out, "ud-iq1_s"), "unknown --types: exit %d: %s", rc, out ? out : "");
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' synth --preset tiny --type-map attn_k_b=IQ3_S -o '%s/x.gguf' 2>&1", sh, dir);
    rc = t_run_capture(cmd, &out);
    T_CHECK(rc == 3 && out && strstr(out, "blk.0.attn_k_b.weight"), "misfit --type-map: exit %d: %s", rc, out ? out : "");
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' synth --preset tiny --types ud-fp4 -o '%s/fp4.gguf' >/dev/null 2>&1 && '%s' inspect '%s/fp4.gguf' 2>&1",
             sh, dir, sh, dir);
    rc = t_run_capture(cmd, &out);
    T_CHECK(rc == 0 && out && strstr(out, "MXFP4") && strstr(out, "4.2500 bits/weight") &&
                strstr(out, "NVFP4") && strstr(out, "4.5000 bits/weight") && strstr(out, "TQ1_0") &&
                strstr(out, "1.6875 bits/weight"),
            "inspect prints bits per weight: exit %d", rc);
    free(out);
}

int main(void) {
    const char *dir = t_tmpdir();
    test_type_map(dir);
    test_inspect_bpw(dir);
    test_cli(dir);
    test_presets_tp(dir);
    t_rmtree(dir);
    return t_report("test_types");
}
