/* glm5-run end to end ($BUILD/bin/glm5-run, default build/): --dump-logits against the oracle
 * from the GGUF and from a TP=2 blob set, --ids greedy continuation against the oracle's, stop
 * strings, --draft mtp against plain greedy decoding, --draft mtp sampling with a seed, and usage errors. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <fcntl.h>

#include "convert/convert.h"
#include "format/quant.h"
#include "tests/test_util.h"

static char g_bin[4096];

/* Runs argv with stdout to out_path (or /dev/null), stderr to /dev/null; returns the exit code. */
static int run(char *const *argv, const char *out_path) {
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        int fd = open(out_path ? out_path : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int dn = open("/dev/null", O_WRONLY);
        if (fd < 0 || dn < 0) _exit(127);
        dup2(fd, 1);
        dup2(dn, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    int status;
    if (waitpid(pid, &status, 0) < 0) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) buf[n] = 0;
    *len = (size_t)n;
    return buf;
}

static double rel_to_f16(const float *a, const uint8_t *ref16, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double b = quant_f16_to_f32((uint16_t)(ref16[2 * i] | (ref16[2 * i + 1] << 8)));
        num += (a[i] - b) * (a[i] - b);
        den += b * b;
    }
    return sqrt(num / den);
}

static double rel_f32(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / den);
}

static char *ids_csv(json_t *arr) {
    size_t n = json_array_size(arr);
    char *s = malloc(n * 12 + 1);
    size_t off = 0;
    for (size_t i = 0; i < n; i++)
        off += (size_t)sprintf(s + off, i ? ",%lld" : "%lld", (long long)json_integer_value(json_array_get(arr, i)));
    s[off] = 0;
    return s;
}

/* --dump-logits of a prompt; returns the floats (malloc'ed) or NULL. */
static float *dump(const char *model, const char *csv, const char *path, size_t expect_floats) {
    char *argv[] = {g_bin, "-m", (char *)model, "--tokens", (char *)csv, "-n", "0", "-q",
                    "--dump-logits", (char *)path, NULL};
    int rc = run(argv, NULL);
    T_CHECK(rc == 0, "%s --dump-logits exit %d", model, rc);
    size_t len = 0;
    char *raw = slurp(path, &len);
    T_CHECK(raw && len == expect_floats * 4, "dump size %zu, expected %zu", len, expect_floats * 4);
    if (!raw || len != expect_floats * 4) {
        free(raw);
        return NULL;
    }
    float *f = malloc(expect_floats * sizeof(float));
    for (size_t i = 0; i < expect_floats; i++) {
        uint32_t u = g5_rd_u32((const uint8_t *)raw + 4 * i);
        memcpy(&f[i], &u, 4);
    }
    free(raw);
    return f;
}

int main(void) {
    const char *build = getenv("BUILD");
    snprintf(g_bin, sizeof g_bin, "%s/bin/glm5-run", build && *build ? build : "build");
    struct stat sb;
    T_CHECK(stat(g_bin, &sb) == 0, "binary %s exists", g_bin);
    json_error_t je;
    json_t *root = json_load_file(t_shared("oracle/glm5-tiny/reference.json"), 0, &je);
    T_CHECK(root != NULL, "reference.json: %s", je.text);
    if (stat(g_bin, &sb) != 0 || !root) return t_report("test_run_cli");
    json_t *mdl = json_object_get(json_object_get(root, "models"), "UD-Q4_K_XL");
    json_t *p0 = json_array_get(json_object_get(mdl, "prompts"), 0);
    json_t *p1 = json_array_get(json_object_get(mdl, "prompts"), 1);
    const size_t V = 2048;
    const char *dir = t_tmpdir();
    char path[4200], path2[4200], outp[4200];
    snprintf(path, sizeof path, "%s/p0.f32", dir);

    /* logits of prompt 0 from the GGUF */
    char *csv0 = ids_csv(json_object_get(p0, "ids"));
    size_t n0 = json_array_size(json_object_get(p0, "ids"));
    float *l0 = dump(T_ORACLE_GGUF, csv0, path, n0 * V);
    char ref_rel[256];
    snprintf(ref_rel, sizeof ref_rel, "oracle/glm5-tiny/%s", json_string_value(json_object_get(p0, "logits")));
    size_t rlen = 0;
    char *ref0 = slurp(t_shared(ref_rel), &rlen);
    if (l0 && ref0 && rlen == n0 * V * 2) {
        double r = rel_to_f16(l0, (const uint8_t *)ref0, n0 * V);
        printf("glm5-run --dump-logits prompt 0 (GGUF): rel L2 %.3e\n", r);
        T_CHECK(r <= 1e-3, "prompt 0 logits rel L2 %.3e", r);
    }
    T_CHECK(access(path, F_OK) == 0, "dump file in place");

    /* greedy continuation of prompt 1 with --ids */
    char *csv1 = ids_csv(json_object_get(p1, "ids"));
    json_t *greedy = json_object_get(json_object_get(mdl, "greedy"), "tokens");
    char nbuf[16];
    snprintf(nbuf, sizeof nbuf, "%zu", json_array_size(greedy));
    snprintf(outp, sizeof outp, "%s/ids.txt", dir);
    char *argv_g[] = {g_bin, "-m", (char *)T_ORACLE_GGUF, "--tokens", csv1, "-n", nbuf, "--temp", "0",
                      "--ids", "-q", NULL};
    T_CHECK(run(argv_g, outp) == 0, "greedy run");
    size_t glen = 0;
    char *gout = slurp(outp, &glen);
    char *expect = gout ? malloc(json_array_size(greedy) * 12 + 2) : NULL;
    if (expect) {
        size_t off = 0;
        for (size_t i = 0; i < json_array_size(greedy); i++)
            off += (size_t)sprintf(expect + off, i ? " %lld" : "%lld", (long long)json_integer_value(json_array_get(greedy, i)));
        strcpy(expect + off, "\n");
        T_CHECK(strcmp(gout, expect) == 0, "--ids greedy output '%s' expected '%s'", gout, expect);
    }
    char *expect_ids = expect;
    /* the prompt in calls of 7 tokens (--prefill-chunk): the CPU's logits do not depend on the
     * split (bit for bit), and the greedy continuation, with and without MTP drafting, is the one above */
    {
        const size_t n1 = json_array_size(json_object_get(p1, "ids"));
        snprintf(path, sizeof path, "%s/p1_one.f32", dir);
        snprintf(path2, sizeof path2, "%s/p1_chunk.f32", dir);
        float *one = dump(T_ORACLE_GGUF, csv1, path, n1 * V);
        char *argv_c[] = {g_bin, "-m", (char *)T_ORACLE_GGUF, "--tokens", csv1, "-n", "0", "-q", "--prefill-chunk", "7",
                          "--dump-logits", path2, NULL};
        T_CHECK(run(argv_c, NULL) == 0, "--prefill-chunk 7 run");
        size_t clen = 0;
        char *craw = slurp(path2, &clen);
        T_CHECK(one && craw && clen == n1 * V * 4, "--prefill-chunk 7 dump size %zu", clen);
        if (one && craw && clen == n1 * V * 4) {
            size_t differ = 0;
            for (size_t i = 0; i < n1 * V; i++) {
                const uint32_t u = g5_rd_u32((const uint8_t *)craw + 4 * i);
                float f;
                memcpy(&f, &u, 4);
                differ += memcmp(&f, &one[i], 4) != 0;
            }
            T_CHECK(differ == 0, "--prefill-chunk 7: %zu of %zu logits differ from one call", differ, n1 * V);
        }
        free(one);
        free(craw);
        for (int d = 0; d < 2 && expect_ids; d++) {
            char *argv_d[] = {g_bin, "-m", (char *)T_ORACLE_GGUF, "--tokens", csv1, "-n", nbuf, "--temp", "0", "--ids",
                              "-q", "--prefill-chunk", "5", d ? "--draft" : NULL, "mtp", NULL};
            T_CHECK(run(argv_d, outp) == 0, "--prefill-chunk 5%s run", d ? " --draft mtp" : "");
            size_t dlen = 0;
            char *dout = slurp(outp, &dlen);
            T_CHECK(dout && strcmp(dout, expect_ids) == 0, "--prefill-chunk 5%s greedy '%s' expected '%s'",
                    d ? " --draft mtp" : "", dout ? dout : "", expect_ids);
            free(dout);
        }
        char *argv_z[] = {g_bin, "-m", (char *)T_ORACLE_GGUF, "--tokens", csv1, "-n", "0", "-q", "--prefill-chunk", "0",
                          NULL};
        T_CHECK(run(argv_z, NULL) == 2, "--prefill-chunk 0 refused (exit 2)");
    }
    free(expect_ids);
    free(gout);

    /* text generation and a stop string taken from its own output */
    snprintf(path2, sizeof path2, "%s/text.txt", dir);
    char *argv_t[] = {g_bin, "-m", (char *)T_ORACLE_GGUF, "--tokens", csv1, "-n", "24", "--temp", "0", "-q", NULL};
    T_CHECK(run(argv_t, path2) == 0, "text run");
    size_t tlen = 0;
    char *txt = slurp(path2, &tlen);
    T_CHECK(txt && tlen > 12, "generated text (%zu bytes)", tlen);
    if (txt && tlen > 12) {
        char stop[5];
        memcpy(stop, txt + 8, 4);
        stop[4] = 0;
        if (strlen(stop) == 4) {
            char *first = strstr(txt, stop);
            char *argv_s[] = {g_bin, "-m", (char *)T_ORACLE_GGUF, "--tokens", csv1, "-n", "24", "--temp", "0",
                              "-q", "--stop", stop, NULL};
            T_CHECK(run(argv_s, path2) == 0, "stop run");
            size_t slen = 0;
            char *st = slurp(path2, &slen);
            size_t want = (size_t)(first - txt);
            T_CHECK(st && slen == want + 1 && memcmp(st, txt, want) == 0 && st[want] == '\n',
                    "output stops before the stop string (%zu bytes, expected %zu)", slen, want + 1);
            free(st);
        }
    }
    free(txt);

    /* the same through a TP=2 blob set */
    char blobs[4200];
    snprintf(blobs, sizeof blobs, "%s/tp2", dir);
    convert_options co;
    convert_options_init(&co);
    co.tp = 2;
    g5_error e = {0};
    g5_status cst = convert_run(T_ORACLE_GGUF, blobs, &co, NULL, &e);
    T_CHECK(cst == G5_OK, "convert TP=2: %s", e.msg);
    if (cst == G5_OK) {
        size_t n1 = json_array_size(json_object_get(p1, "ids"));
        snprintf(path, sizeof path, "%s/p1_gguf.f32", dir);
        snprintf(path2, sizeof path2, "%s/p1_tp2.f32", dir);
        float *a = dump(T_ORACLE_GGUF, csv1, path, n1 * V);
        float *b = dump(blobs, csv1, path2, n1 * V);
        if (a && b) {
            double r = rel_f32(b, a, n1 * V);
            printf("glm5-run --dump-logits prompt 1: TP=2 blobs vs GGUF rel L2 %.3e\n", r);
            T_CHECK(r <= 1e-5, "TP=2 vs GGUF %.3e", r);
        }
        free(a);
        free(b);
        char *argv_b[] = {g_bin, "-m", blobs, "--tokens", csv1, "-n", nbuf, "--temp", "0", "--ids", "-q", NULL};
        T_CHECK(run(argv_b, outp) == 0, "greedy on blobs");
        size_t blen = 0;
        char *bout = slurp(outp, &blen);
        char *argv_c[] = {g_bin, "-m", (char *)T_ORACLE_GGUF, "--tokens", csv1, "-n", nbuf, "--temp", "0", "--ids", "-q", NULL};
        run(argv_c, path);
        size_t clen = 0;
        char *cout = slurp(path, &clen);
        T_CHECK(bout && cout && blen == clen && memcmp(bout, cout, blen) == 0, "greedy ids equal on TP=2 blobs");
        free(bout);
        free(cout);
    }

    /* --draft mtp: the ids of plain greedy decoding, from the GGUF and from the TP=2 blobs; the
     * acceptance line on stderr (tests/test_draft.c checks the drafter's accept path itself) */
    const char *dsrc[2] = {T_ORACLE_GGUF, blobs};
    for (int k = 0; k < (cst == G5_OK ? 2 : 1); k++) {
        char *argv_p[] = {g_bin, "-m", (char *)dsrc[k], "--tokens", csv1, "-n", nbuf, "--temp", "0", "--ids", "-q", NULL};
        T_CHECK(run(argv_p, path) == 0, "plain greedy on %s", dsrc[k]);
        char cmd[16384], *err_out = NULL;
        snprintf(cmd, sizeof cmd, "'%s' -m '%s' --tokens %s -n %s --temp 0 --ids --draft mtp 2>&1 >'%s'", g_bin, dsrc[k],
                 csv1, nbuf, path2);
        const int drc = t_run_capture(cmd, &err_out);
        const char *line = err_out ? strstr(err_out, "draft mtp: ") : NULL;
        printf("glm5-run --draft mtp on %s: exit %d, %.*s\n", k ? "TP=2 blobs" : "the GGUF", drc,
               line ? (int)strcspn(line, "\n") : 4, line ? line : "none");
        T_CHECK(drc == 0 && line && strstr(line, "accepted"), "--draft mtp run on %s (exit %d)", dsrc[k], drc);
        T_CHECK(t_file_equal(path, path2), "--draft mtp ids differ from plain greedy decoding on %s", dsrc[k]);
        free(err_out);
    }
    /* --draft mtp with sampling (speculative sampling; tests/test_sample.c proves the rule): runs,
     * reports its drafts, and a seed gives the same ids every time (another seed other ids) */
    {
        char *sout[3] = {0};
        size_t slen[3] = {0};
        const char *seeds[3] = {"5", "5", "6"};
        for (int k = 0; k < 3; k++) {
            char cmd[16384], *err_out = NULL;
            snprintf(cmd, sizeof cmd, "'%s' -m '%s' --tokens %s -n 24 --temp 0.9 --seed %s --ids --draft mtp 2>&1 >'%s'",
                     g_bin, T_ORACLE_GGUF, csv1, seeds[k], path2);
            const int drc = t_run_capture(cmd, &err_out);
            const char *line = err_out ? strstr(err_out, "draft mtp: ") : NULL;
            if (k == 0)
                printf("glm5-run --draft mtp --temp 0.9: exit %d, %.*s\n", drc, line ? (int)strcspn(line, "\n") : 4,
                       line ? line : "none");
            unsigned long long nd = 0, na = 0;
            const int got = line ? sscanf(line, "draft mtp: %llu drafted, %llu accepted", &nd, &na) : 0;
            /* 24 tokens: 23 steps, each one verifying a new draft or taking an accepted one */
            T_CHECK(drc == 0 && got == 2 && nd >= 1 && nd + na == 23, "--draft mtp --temp 0.9 --seed %s (exit %d, %llu drafted, "
                    "%llu accepted)", seeds[k], drc, nd, na);
            sout[k] = slurp(path2, &slen[k]);
            free(err_out);
        }
        T_CHECK(sout[0] && sout[1] && slen[0] > 24 && slen[0] == slen[1] && !memcmp(sout[0], sout[1], slen[0]),
                "--draft mtp sampling with one seed is not deterministic");
        T_CHECK(sout[0] && sout[2] && (slen[0] != slen[2] || memcmp(sout[0], sout[2], slen[0])),
                "--draft mtp sampling: seeds 5 and 6 gave the same ids");
        for (int k = 0; k < 3; k++) free(sout[k]);
        /* top-k 1: sampling's code path, greedy's tokens (p and q one-hot) */
        char *argv_g[] = {g_bin, "-m", (char *)T_ORACLE_GGUF, "--tokens", csv1, "-n", nbuf, "--temp", "0", "--ids", "-q", NULL};
        T_CHECK(run(argv_g, path) == 0, "plain greedy");
        char *argv_k[] = {g_bin, "-m", (char *)T_ORACLE_GGUF, "--tokens", csv1, "-n", nbuf, "--temp", "0.9", "--top-k", "1",
                          "--draft", "mtp", "--ids", "-q", NULL};
        T_CHECK(run(argv_k, path2) == 0 && t_file_equal(path, path2), "--draft mtp --temp 0.9 --top-k 1 differs from greedy");
    }
    char *bad11[] = {g_bin, "-m", (char *)T_ORACLE_GGUF, "--tokens", "1", "--draft", "eagle", NULL};
    T_CHECK(run(bad11, NULL) == 2, "--draft eagle: exit 2");

    /* usage and input errors */
    char *bad1[] = {g_bin, "--tokens", "1,2", NULL};
    T_CHECK(run(bad1, NULL) == 2, "missing -m: exit 2");
    char *bad2[] = {g_bin, "-m", (char *)T_ORACLE_GGUF, "-p", "x", "--tokens", "1", NULL};
    T_CHECK(run(bad2, NULL) == 2, "-p and --tokens: exit 2");
    char *bad3[] = {g_bin, "-m", (char *)T_ORACLE_GGUF, "--tokens", "1,99999", "-n", "1", NULL};
    T_CHECK(run(bad3, NULL) == 2, "token outside the vocabulary: exit 2");
    char *bad4[] = {g_bin, "-m", (char *)T_ORACLE_GGUF, "--tokens", "1,,2", NULL};
    T_CHECK(run(bad4, NULL) == 2, "malformed --tokens: exit 2");
    snprintf(path, sizeof path, "%s/absent.gguf", dir);
    char *bad5[] = {g_bin, "-m", path, "--tokens", "1", NULL};
    T_CHECK(run(bad5, NULL) == 3, "absent model: exit 3");
    char *bad6[] = {g_bin, "-m", (char *)T_ORACLE_GGUF, "--tokens", "1", "--device", "cuda", NULL};
    T_CHECK(run(bad6, NULL) == 2, "unavailable device: exit 2");
    char *bad7[] = {g_bin, "-m", (char *)T_ORACLE_GGUF, "--tokens", "1", "--tp", "2", NULL};
    T_CHECK(run(bad7, NULL) == 2, "--tp 2 on a GGUF (TP 1): exit 2");
    char *bad8[] = {g_bin, "-m", (char *)T_ORACLE_GGUF, "--tokens", "1", "--tp", "0", NULL};
    T_CHECK(run(bad8, NULL) == 2, "--tp 0: exit 2");
    char *bad12[] = {g_bin, "-m", (char *)T_ORACLE_GGUF, "--tokens", "1", "--products", "fp16", NULL};
    T_CHECK(run(bad12, NULL) == 2, "--products fp16 on the CPU: exit 2");
    char *bad13[] = {g_bin, "-m", (char *)T_ORACLE_GGUF, "--tokens", "1", "--products", "fp8", NULL};
    T_CHECK(run(bad13, NULL) == 2, "--products fp8: exit 2");
    char *ok0[] = {g_bin, "-m", (char *)T_ORACLE_GGUF, "--tokens", "1", "--tp", "1", "-n", "1", "-q", NULL};
    T_CHECK(run(ok0, NULL) == 0, "--tp 1 on a GGUF runs");
    if (cst == G5_OK) {
        char *bad9[] = {g_bin, "-m", blobs, "--tokens", "1", "--tp", "4", NULL};
        T_CHECK(run(bad9, NULL) == 2, "--tp 4 on a TP 2 set: exit 2");
        char *ok2[] = {g_bin, "-m", blobs, "--tokens", "1", "--tp", "2", "-n", "1", "-q", NULL};
        T_CHECK(run(ok2, NULL) == 0, "--tp 2 on a TP 2 set runs");
    }
    char *ok1[] = {g_bin, "-m", (char *)T_ORACLE_GGUF, "-p", "Hello", "--chat", "-n", "4", "--seed", "7", NULL};
    T_CHECK(run(ok1, NULL) == 0, "chat prompt with sampling runs");

    /* -f FILE and -f - (stdin) give what -p gives for the same text; --version on all three */
    {
        const char *text = "Once upon a time, [gMASK] a file\nwith two lines";
        char fpath[4300], o1[4300], o2[4300], o3[4300];
        snprintf(fpath, sizeof fpath, "%s/prompt.txt", dir);
        snprintf(o1, sizeof o1, "%s/o1", dir);
        snprintf(o2, sizeof o2, "%s/o2", dir);
        snprintf(o3, sizeof o3, "%s/o3", dir);
        FILE *f = fopen(fpath, "wb");
        if (f) fputs(text, f), fclose(f);
        char *pa[] = {g_bin, "-m", (char *)T_ORACLE_GGUF, "-p", (char *)text, "-n", "6", "--temp", "0", "--ids", "-q", NULL};
        char *fa[] = {g_bin, "-m", (char *)T_ORACLE_GGUF, "-f", fpath, "-n", "6", "--temp", "0", "--ids", "-q", NULL};
        T_CHECK(run(pa, o1) == 0 && run(fa, o2) == 0, "-p and -f run");
        char cmd[13000];
        snprintf(cmd, sizeof cmd, "'%s' -m '%s' -f - -n 6 --temp 0 --ids -q < '%s' > '%s' 2>/dev/null", g_bin,
                 T_ORACLE_GGUF, fpath, o3);
        T_CHECK(system(cmd) == 0, "-f - runs");
        size_t n1 = 0, n2 = 0, n3 = 0;
        char *a1 = slurp(o1, &n1), *a2 = slurp(o2, &n2), *a3 = slurp(o3, &n3);
        T_CHECK(a1 && a2 && a3 && n1 > 2 && n1 == n2 && n1 == n3 && !memcmp(a1, a2, n1) && !memcmp(a1, a3, n1),
                "-p / -f FILE / -f - give the same ids: '%s' '%s' '%s'", a1 ? a1 : "-", a2 ? a2 : "-", a3 ? a3 : "-");
        free(a1);
        free(a2);
        free(a3);
        char *nf[] = {g_bin, "-m", (char *)T_ORACLE_GGUF, "-f", "/nonexistent/prompt", NULL};
        T_CHECK(run(nf, NULL) == 2, "-f of a missing file: exit 2");
        char *both[] = {g_bin, "-m", (char *)T_ORACLE_GGUF, "-f", fpath, "-p", "x", NULL};
        T_CHECK(run(both, NULL) == 2, "-f with -p: exit 2");
        const char *bins[] = {"glm5-run", "glm5-serve", "glm5-shard"};
        const char *build = getenv("BUILD");
        for (int i = 0; i < 3; i++) {
            char b[4200];
            snprintf(b, sizeof b, "%s/bin/%s", build && *build ? build : "build", bins[i]);
            char *va[] = {b, "--version", NULL};
            T_CHECK(run(va, o1) == 0, "%s --version: exit 0", bins[i]);
            char *v = slurp(o1, &n1);
            T_CHECK(v && strstr(v, bins[i]) && strstr(v, "(glm5-shard) "), "%s --version prints '%s'", bins[i], v ? v : "-");
            free(v);
        }
    }

    free(l0);
    free(ref0);
    free(csv0);
    free(csv1);
    json_decref(root);
    t_rmtree(dir);
    return t_report("test_run_cli");
}
