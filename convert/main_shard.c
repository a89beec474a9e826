/* glm5-shard: inspect, synth, convert and verify GLM-5 GGUFs and blob sets.
 *
 * Exit codes: 0 success; 1 a check failed (inspect's audit, verify); 2 usage error; 3 an error
 * (unreadable or corrupt input, refusal, I/O). */
#include <errno.h>
#include <math.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "format/mapguard.h"
#include "convert/convert.h"
#include "convert/inspect.h"
#include "convert/synth.h"
#include "format/args.h"
#include "format/gguf.h"
#include "format/quant.h"
#include "format/status.h"
#include "format/version.h"

#define EXIT_CHECK 1
#define EXIT_USAGE 2
#define EXIT_ERROR 3

static const char *prog = "glm5-shard";

static void usage(FILE *f) {
    fprintf(f,
            "usage: %s COMMAND [options]\n"
            "\n"
            "commands:\n"
            "  inspect FILE.gguf [--json] [--max-array N]\n"
            "        metadata, tensor table, totals by type and (glm-dsa) the architecture\n"
            "        audit; exit 0 only if the audit passes (any split of a set will do)\n"
            "  inspect OUTDIR [--json]\n"
            "        blob set summary: set record, ranks, sources, plan, tensors, types;\n"
            "        exit 0 only if every rank's index opens and agrees with the set\n"
            "  inspect FILE.gguf --dump TENSOR -o OUT.f32\n"
            "        write one tensor dequantized to little-endian float32 (ggml order)\n"
            "  synth --preset tiny|glm5 [--layers N] [--experts N] [--tp-friendly] [--seed S]\n"
            "        [--split-size BYTES] [--types PRESET] [--type-map ROLE=TYPE,...] [--centred]\n"
            "        [--dry-run] -o FILE.gguf\n"
            "        write a synthetic GLM-5 GGUF (random weights, real layout); with\n"
            "        --split-size, FILE-0000k-of-0000n.gguf (BYTES may end in K, M, G: x1024);\n"
            "        --layers bounds the main layers (the NextN layer stays); --dry-run lists\n"
            "        the tensors and sizes without writing; --types picks a type mix\n"
            "        (ud-q4_k_xl: the default, ud-q3_k_xl, ud-q2_k_xl, ud-iq2_xxs, ud-iq1_m,\n"
            "        ud-iq1_s, ud-fp4), --type-map then sets roles (ffn_up_exps=IQ2_XXS;\n"
            "        groups exps, exps_gate_up, shexp, ffn, ffn_gate_up, attn); --centred makes\n"
            "        the Q2_K/Q4_K/Q5_K blocks zero-mean like trained weights (without it their\n"
            "        weights average about +0.1 and activations grow with depth)\n"
            "\n"
            "  convert --tp T [--ep] [--kv-b-type f32|bf16|f16|q8_0] [--jobs N] [--resume]\n"
            "        [--force] [--dry-run] [--quiet] [--json] -o OUTDIR MODEL.gguf\n"
            "        one checksummed blob per tensor-parallel rank (MODEL: any split of a set);\n"
            "        --ep places whole experts on ranks; --dry-run prints the plan and checks\n"
            "        it; --resume keeps ranks that verify; an OUTDIR holding another set is\n"
            "        refused unless --force, which removes that set's files first;\n"
            "        progress on stderr (a terminal)\n"
            "  verify OUTDIR [--deep MODEL.gguf] [--jobs N] [--quiet] [--json]\n"
            "        check every checksum of a blob set (like xxhsum -c); --deep re-derives\n"
            "        every slice (and kv_b) from the source GGUF and compares\n"
            "\n"
            "exit status: 0 ok, 1 check failed (audit, verify), 2 usage error,\n"
            "             3 error (unreadable or corrupt input, refusal, I/O)\n",
            prog);
}

static int fail_usage(const char *fmt, const char *arg) {
    fprintf(stderr, "%s: ", prog);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(try '%s --help')\n", prog);
    return EXIT_USAGE;
}

/* One command's options and positional arguments (format/args.h): 0 parsed, -1 help (printed),
 * or EXIT_USAGE with the message printed. */
static int parse_cmd(const char *cmd, const g5_arg *tab, size_t n, int argc, char **argv, const char **pos,
                     size_t max_pos, size_t *n_pos) {
    char msg[512];
    g5_args_result r = g5_args_parse(tab, n, argc, argv, 1, pos, max_pos, n_pos, msg, sizeof msg);
    if (r == G5_ARGS_HELP) {
        usage(stdout);
        return -1;
    }
    if (r) {
        fprintf(stderr, "%s: %s: %s\n(try '%s --help')\n", prog, cmd, msg, prog);
        return EXIT_USAGE;
    }
    return 0;
}

static int fail_error(const g5_error *e) {
    fprintf(stderr, "%s: error: %s\n", prog, e->msg[0] ? e->msg : g5_strerror(e->status));
    return EXIT_ERROR;
}

/* ---- inspect ---- */

/* Prints (and frees) a report; exit status from its verdict. */
static int print_report(json_t *rep, int json, const inspect_opts *io, const char *path,
                        const char *what) {
    if (json) {
        if (json_dumpf(rep, stdout, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9)))
            fprintf(stderr, "%s: cannot write JSON\n", prog);
        fputc('\n', stdout);
    } else {
        inspect_print_text(rep, io, stdout);
    }
    int passed = inspect_report_passed(rep);
    json_decref(rep);
    if (fflush(stdout) != 0) return EXIT_ERROR;
    if (!passed) fprintf(stderr, "%s: %s: %s FAILED\n", prog, path, what);
    return passed ? 0 : EXIT_CHECK;
}

static int cmd_inspect(int argc, char **argv) {
    int json = 0;
    const char *dump = NULL, *out = NULL;
    inspect_opts io;
    inspect_opts_init(&io);
    int64_t max_array = io.max_array;
    const g5_arg tab[] = {
        {.name = "--json", .alias = "-j", .kind = G5_ARG_FLAG, .dst = &json},
        {.name = "--dump", .alias = "-d", .kind = G5_ARG_STR, .dst = &dump},
        {.name = "--output", .alias = "-o", .kind = G5_ARG_STR, .dst = &out},
        {.name = "--max-array", .alias = "-m", .kind = G5_ARG_INT, .dst = &max_array, .lo = 0, .hi = 1000000},
    };
    const char *pos[2];
    size_t np = 0;
    int pr = parse_cmd("inspect", tab, sizeof tab / sizeof tab[0], argc, argv, pos, 2, &np);
    if (pr) return pr < 0 ? 0 : pr;
    io.max_array = (uint32_t)max_array;
    if (np != 1) return fail_usage("inspect: expected one FILE.gguf or OUTDIR%s", "");
    const char *path = pos[0];
    if (dump && !out) return fail_usage("inspect: --dump %s needs -o OUT.f32", dump);
    if (out && !dump) return fail_usage("inspect: -o %s is only for --dump", out);

    g5_error e;
    g5_error_clear(&e);
    json_t *rep = NULL;
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        if (dump) return fail_usage("inspect: --dump needs a GGUF file, %s is a directory", path);
        if (inspect_blobset(path, &io, &rep, &e) != G5_OK) return fail_error(&e);
        return print_report(rep, json, &io, path, "blob set check");
    }
    gguf_ctx *ctx = NULL;
    if (gguf_open(path, &ctx, &e) != G5_OK) return fail_error(&e);
    if (dump) {
        g5_status st = inspect_dump_tensor(ctx, dump, out, &e);
        gguf_free(ctx);
        if (st) return fail_error(&e);
        return 0;
    }
    if (inspect_gguf(ctx, path, &io, &rep, &e) != G5_OK) {
        gguf_free(ctx);
        return fail_error(&e);
    }
    gguf_free(ctx);
    return print_report(rep, json, &io, path, "architecture audit");
}

/* ---- synth ---- */

static int synth_dry_run(const synth_opts *so) {
    synth_plan *p = NULL;
    g5_error e;
    g5_error_clear(&e);
    if (synth_plan_build(so, &p, &e) != G5_OK) return fail_error(&e);
    printf("  %-5s %-40s %-7s %-26s %14s %5s\n", "#", "name", "type", "shape", "bytes", "split");
    for (uint64_t i = 0; i < p->n_tensors; i++) {
        const synth_tensor_info *t = &p->tensors[i];
        char shp[96];
        int o = snprintf(shp, sizeof shp, "{%" PRIu64, t->ne[0]);
        for (uint32_t d = 1; d < t->n_dims && o > 0 && (size_t)o < sizeof shp; d++)
            o += snprintf(shp + o, sizeof shp - (size_t)o, ", %" PRIu64, t->ne[d]);
        if (o > 0 && (size_t)o < sizeof shp) snprintf(shp + o, sizeof shp - (size_t)o, "}");
        printf("  %-5" PRIu64 " %-40s %-7s %-26s %14" PRIu64 " %5u\n", i, t->name,
               quant_type_name(t->type), shp, t->nbytes, t->split);
    }
    printf("synth (dry run): %" PRIu64 " tensors, %" PRIu64 " bytes of tensor data "
           "(%.2f GiB), %" PRIu64 " parameters, %u file(s); %u layers (%u main, %u dense, "
           "+ %u NextN), %u experts\n",
           p->n_tensors, p->data_bytes, (double)p->data_bytes / (1ull << 30), p->n_params,
           p->n_splits, p->hp.n_layer, p->hp.n_layer_main, p->hp.n_leading_dense, p->hp.n_nextn,
           p->hp.n_expert);
    synth_plan_free(p);
    return fflush(stdout) ? EXIT_ERROR : 0;
}

static int cmd_synth(int argc, char **argv) {
    int dry_run = 0;
    const char *type_preset = NULL, *type_map = NULL;
    synth_opts so;
    synth_opts_init(&so);
    const char *out = NULL, *preset = NULL;
    int64_t layers = 0, experts = 0;
    int have_layers = 0, have_experts = 0, have_split = 0;
    uint64_t seed = so.seed, split = 0;
    g5_error e;
    g5_error_clear(&e);
    const g5_arg tab[] = {
        {.name = "--preset", .alias = "-p", .kind = G5_ARG_STR, .dst = &preset},
        {.name = "--layers", .alias = "-l", .kind = G5_ARG_INT, .dst = &layers, .lo = 1, .hi = 511, .seen = &have_layers},
        {.name = "--experts", .alias = "-e", .kind = G5_ARG_INT, .dst = &experts, .lo = 1, .hi = 65536,
         .seen = &have_experts},
        {.name = "--tp-friendly", .alias = "-t", .kind = G5_ARG_FLAG, .dst = &so.tp_friendly},
        {.name = "--centred", .kind = G5_ARG_FLAG, .dst = &so.centred},
        {.name = "--seed", .alias = "-s", .kind = G5_ARG_U64, .dst = &seed},
        {.name = "--split-size", .alias = "-S", .kind = G5_ARG_SIZE, .dst = &split, .lo = 1, .seen = &have_split},
        {.name = "--output", .alias = "-o", .kind = G5_ARG_STR, .dst = &out},
        {.name = "--dry-run", .alias = "-n", .kind = G5_ARG_FLAG, .dst = &dry_run},
        {.name = "--types", .alias = "-T", .kind = G5_ARG_STR, .dst = &type_preset},
        {.name = "--type-map", .alias = "-M", .kind = G5_ARG_STR, .dst = &type_map},
    };
    int pr = parse_cmd("synth", tab, sizeof tab / sizeof tab[0], argc, argv, NULL, 0, NULL);
    if (pr) return pr < 0 ? 0 : pr;
    int have_preset = preset != NULL;
    if (preset && synth_preset_from_name(preset, &so.preset, &e))
        return fail_usage("synth: unknown --preset '%s' (tiny, glm5)", preset);
    if (have_layers) so.n_layers = layers;
    if (have_experts) so.n_experts = experts;
    so.seed = seed;
    if (have_split) so.split_size = split;
    if (!have_preset) return fail_usage("synth: --preset tiny|glm5 is required%s", "");
    /* the preset first, the map's items on top of it */
    if (type_preset && synth_type_preset(type_preset, &so, &e)) return fail_usage("%s", e.msg);
    if (type_map && synth_type_map_parse(type_map, &so, &e)) return fail_usage("%s", e.msg);
    if (dry_run) return synth_dry_run(&so);
    if (!out) return fail_usage("synth: -o FILE.gguf is required%s", "");
    synth_result res;
    if (synth_write(&so, out, &res, &e) != G5_OK) return fail_error(&e);
    if (res.n_files == 1)
        printf("synth: wrote %s: %" PRIu64 " tensors, %" PRIu64 " bytes\n", res.first_path,
               res.n_tensors, res.file_bytes);
    else
        printf("synth: wrote %u splits (%s ...): %" PRIu64 " tensors, %" PRIu64 " bytes\n",
               res.n_files, res.first_path, res.n_tensors, res.file_bytes);
    return fflush(stdout) ? EXIT_ERROR : 0;
}


/* ---- convert / verify ---- */

typedef struct progress_state {
    int on;                 /* stderr is a terminal and not --quiet */
    int shown;              /* a progress line is on screen */
    convert_phase phase;
} progress_state;

static void progress_cb(void *user, const convert_progress *p) {
    progress_state *ps = user;
    if (!ps->on) return;
    if (ps->shown && p->phase != ps->phase) fputc('\n', stderr);
    ps->phase = p->phase;
    char eta[32] = "";
    if (p->eta_s >= 0) snprintf(eta, sizeof eta, "ETA %.0fs", p->eta_s);
    fprintf(stderr, "\r%-7s %9.3f / %.3f GB  %6.2f GB/s  %-10s %-44.44s",
            convert_phase_name(p->phase), (double)p->bytes_done / 1e9,
            (double)p->bytes_total / 1e9, p->gb_per_s, eta, p->tensor ? p->tensor : "");
    fflush(stderr);
    ps->shown = 1;
}

static void progress_end(progress_state *ps) {
    if (ps->on && ps->shown) fputc('\n', stderr);
    ps->shown = 0;
}

static int print_json_text(char *txt) {
    if (!txt) {
        fprintf(stderr, "%s: cannot build the JSON summary\n", prog);
        return EXIT_ERROR;
    }
    fputs(txt, stdout);
    fputc('\n', stdout);
    free(txt);
    return 0;
}

static int cmd_convert(int argc, char **argv) {
    convert_options co;
    convert_options_init(&co);
    int quiet = 0, json = 0;
    const char *out = NULL, *kvb = NULL;
    int64_t tp = 0, jobs = co.jobs;
    const g5_arg tab[] = {
        {.name = "--tp", .alias = "-t", .kind = G5_ARG_INT, .dst = &tp, .lo = 1, .hi = 65536},
        {.name = "--ep", .alias = "-E", .kind = G5_ARG_FLAG, .dst = &co.ep},
        {.name = "--kv-b-type", .alias = "-k", .kind = G5_ARG_STR, .dst = &kvb},
        {.name = "--jobs", .alias = "-j", .kind = G5_ARG_INT, .dst = &jobs, .lo = 0, .hi = 4096},
        {.name = "--resume", .alias = "-r", .kind = G5_ARG_FLAG, .dst = &co.resume},
        {.name = "--force", .alias = "-F", .kind = G5_ARG_FLAG, .dst = &co.force},
        {.name = "--dry-run", .alias = "-n", .kind = G5_ARG_FLAG, .dst = &co.dry_run},
        {.name = "--quiet", .alias = "-q", .kind = G5_ARG_FLAG, .dst = &quiet},
        {.name = "--json", .alias = "-J", .kind = G5_ARG_FLAG, .dst = &json},
        {.name = "--output", .alias = "-o", .kind = G5_ARG_STR, .dst = &out},
    };
    const char *pos[2];
    size_t np = 0;
    int pr = parse_cmd("convert", tab, sizeof tab / sizeof tab[0], argc, argv, pos, 2, &np);
    if (pr) return pr < 0 ? 0 : pr;
    co.tp = (uint32_t)tp;
    co.jobs = (uint32_t)jobs;
    if (kvb) {
        int t = quant_type_from_name(kvb);
        if (t != QT_F32 && t != QT_BF16 && t != QT_F16 && t != QT_Q8_0)
            return fail_usage("convert: bad --kv-b-type '%s' (f32, bf16, f16, q8_0)", kvb);
        co.kv_b_type = (uint32_t)t;
    }
    if (co.tp == 0) return fail_usage("convert: --tp T is required%s", "");
    if (np != 1) return fail_usage("convert: expected one MODEL.gguf%s", "");
    if (!out && !co.dry_run) return fail_usage("convert: -o OUTDIR is required%s", "");
    const char *model = pos[0];
    progress_state ps = {!quiet && !json && isatty(STDERR_FILENO), 0, CONVERT_PHASE_PLAN};
    co.progress = progress_cb;
    co.progress_user = &ps;

    convert_result *res = NULL;
    g5_error e;
    g5_error_clear(&e);
    g5_status st = convert_run(model, out ? out : "", &co, &res, &e);
    progress_end(&ps);
    if (st != G5_OK) {
        convert_result_free(res);
        return fail_error(&e);
    }
    int rc = 0;
    if (json) {
        rc = print_json_text(convert_result_json(res, co.dry_run));
    } else if (co.dry_run) {
        char line[1024];
        for (uint64_t i = 0; res->plan && i < res->plan->n_tensors; i++) {
            shard_format_tensor(res->plan, i, line, sizeof line);
            printf("  %s\n", line);
        }
        printf("plan OK (nothing written): tp %u%s, %" PRIu64 " source tensors -> %" PRIu64
               " per rank, %" PRIu64 " data bytes per rank, kv_b as %s\n",
               res->tp, res->ep ? " (ep)" : "", res->n_tensors_in, res->n_tensors_out,
               res->plan ? res->plan->data_size : 0, quant_type_name(res->kv_b_type));
    } else {
        for (uint32_t r = 0; res->ranks && r < res->tp; r++) {
            const convert_rank_result *rr = &res->ranks[r];
            char hex[33];
            blob_hash_hex(rr->header_hash, hex);
            printf("  rank %u: %s  %" PRIu64 " bytes  header %s%s\n", rr->rank, rr->path,
                   rr->file_size, hex, rr->reused ? "  (kept: verified)" : "");
        }
        printf("converted %s -> %s: tp %u%s, %u ranks x %" PRIu64 " bytes, %" PRIu64
               " tensors each, %.2f s (%.2f GB/s); kv_b as %s, max abs error %.3g",
               model, out, res->tp, res->ep ? " (ep)" : "", res->tp, res->rank_bytes,
               res->n_tensors_out, res->seconds, res->gb_per_s, quant_type_name(res->kv_b_type),
               res->kv_b_max_abs_err);
        if (res->kv_b_max_abs > 0)
            printf(" (%.3g relative to max |kv_b|)", res->kv_b_max_abs_err / res->kv_b_max_abs);
        if (res->n_ranks_reused) printf("; %u ranks kept by --resume", res->n_ranks_reused);
        printf("\n");
    }
    if (res->plan && res->plan->src_unused)
        printf("left out: %" PRIu64 " indexer tensors of shared layers (%" PRIu64 " bytes): IndexShare layers reuse "
               "a full layer's top-k and never read them (recorded as glm5shard.indexer.dropped)\n",
               res->plan->src_unused, res->plan->src_unused_bytes);
    convert_result_free(res);
    if (fflush(stdout) != 0) return EXIT_ERROR;
    return rc;
}

static int cmd_verify(int argc, char **argv) {
    convert_verify_options vo;
    convert_verify_options_init(&vo);
    int quiet = 0, json = 0;
    int64_t jobs = vo.jobs;
    const g5_arg tab[] = {
        {.name = "--deep", .alias = "-d", .kind = G5_ARG_STR, .dst = &vo.deep_source},
        {.name = "--jobs", .alias = "-j", .kind = G5_ARG_INT, .dst = &jobs, .lo = 0, .hi = 4096},
        {.name = "--quiet", .alias = "-q", .kind = G5_ARG_FLAG, .dst = &quiet},
        {.name = "--json", .alias = "-J", .kind = G5_ARG_FLAG, .dst = &json},
    };
    const char *pos[2];
    size_t np = 0;
    int pr = parse_cmd("verify", tab, sizeof tab / sizeof tab[0], argc, argv, pos, 2, &np);
    if (pr) return pr < 0 ? 0 : pr;
    vo.jobs = (uint32_t)jobs;
    if (np != 1) return fail_usage("verify: expected one OUTDIR%s", "");
    const char *dir = pos[0];
    progress_state ps = {!quiet && !json && isatty(STDERR_FILENO), 0, CONVERT_PHASE_VERIFY};
    vo.progress = progress_cb;
    vo.progress_user = &ps;
    convert_verify_result *res = NULL;
    g5_error e;
    g5_error_clear(&e);
    g5_status st = convert_verify(dir, &vo, &res, &e);
    progress_end(&ps);
    if (!res) return fail_error(&e);
    int ok = st == G5_OK && res->ok;
    if (json) {
        int rc = print_json_text(convert_verify_result_json(res));
        convert_verify_result_free(res);
        fflush(stdout);
        return rc ? rc : ok ? 0 : EXIT_CHECK;
    }
    for (uint32_t r = 0; r < res->n_ranks; r++) {
        const convert_verify_rank *vr = &res->ranks[r];
        const char *name = strrchr(vr->path, '/');
        name = name ? name + 1 : vr->path;
        int rank_ok = vr->opened && !vr->n_tensors_bad && !vr->n_chunks_bad && !vr->n_deep_bad;
        for (uint64_t k = 0; k < res->n_findings_stored; k++) rank_ok &= res->findings[k].rank != (int32_t)r;
        if (!vr->opened) {
            printf("%s: FAILED (cannot open)\n", name);
            continue;
        }
        printf("%s: %s (%" PRIu64 " tensors, %" PRIu64 " chunks", name, rank_ok ? "OK" : "FAILED",
               vr->n_tensors, vr->n_chunks);
        if (vr->n_tensors_bad || vr->n_chunks_bad)
            printf("; %" PRIu64 " bad tensors, %" PRIu64 " bad chunks", vr->n_tensors_bad,
                   vr->n_chunks_bad);
        if (vo.deep_source)
            printf("; deep: %" PRIu64 " re-derived, %" PRIu64 " differ, kv_b max error %.3g",
                   vr->n_deep_checked, vr->n_deep_bad, vr->kv_b_max_abs_err);
        printf(")\n");
    }
    for (uint64_t k = 0; k < res->n_findings_stored; k++) printf("  %s\n", res->findings[k].msg);
    if (res->n_findings > res->n_findings_stored)
        printf("  ... and %" PRIu64 " more findings\n", res->n_findings - res->n_findings_stored);
    if (ok)
        printf("verify: OK: %u ranks, %" PRIu64 " bytes hashed in %.2f s (%.2f GB/s)%s\n",
               res->n_ranks, res->bytes_hashed, res->seconds,
               res->seconds > 0 ? (double)res->bytes_hashed / res->seconds / 1e9 : 0.0,
               vo.deep_source ? "; every slice matches the source" : "");
    else
        printf("verify: FAILED: %" PRIu64 " findings\n", res->n_findings ? res->n_findings : 1);
    convert_verify_result_free(res);
    if (!ok) fprintf(stderr, "%s: verify %s: %s\n", prog, dir, e.msg[0] ? e.msg : "FAILED");
    if (fflush(stdout) != 0) return EXIT_ERROR;
    return ok ? 0 : EXIT_CHECK;
}

int main(int argc, char **argv) {
    g5_mapguard_install(prog, EXIT_ERROR); /* an input truncated under us: an error, never SIGBUS */
    if (argc < 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        g5_print_version(stdout, "glm5-shard");
        return 0;
    }
    if (!strcmp(cmd, "inspect")) return cmd_inspect(argc - 1, argv + 1);
    if (!strcmp(cmd, "synth")) return cmd_synth(argc - 1, argv + 1);
    if (!strcmp(cmd, "convert")) return cmd_convert(argc - 1, argv + 1);
    if (!strcmp(cmd, "verify")) return cmd_verify(argc - 1, argv + 1);
    return fail_usage("unknown command '%s'", cmd);
}
