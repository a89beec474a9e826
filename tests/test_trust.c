/* Trust at run time (issue 16): the CPU load path checks every tensor's checksum, one model
 * validation refuses the same files in convert, inspect and run, changed files end in an error
 * (never a signal death), sets are written and replaced as sets, the context length is
 * enforced, and the server's connection limits keep /health answered under slow clients. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "convert/convert.h"
#include "format/blob.h"
#include "format/glm5.h"
#include "format/gguf.h"
#include "format/gguf_write.h"
#include "format/quant.h"
#include "runtime/cpu/weights.h"
#include "tests/test_util.h"

/* the exit status of a failed load (corrupt input), glm5-run and glm5-serve */
#define EXIT_ERR 1

static char g_bin[4096];
static const char *g_tmp;

static char *pathf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *pathf(const char *fmt, ...) {
    static char buf[16][4096];
    static int slot;
    char *b = buf[slot++ & 15];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b, sizeof buf[0], fmt, ap);
    va_end(ap);
    return b;
}

/* Runs argv with stdout and stderr into err_path (or /dev/null); the exit code, or 128 + signal. */
static int run_cmd(char *const *argv, const char *err_path) {
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        int fd = open(err_path ? err_path : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) _exit(127);
        dup2(fd, 1);
        dup2(fd, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    int status;
    if (waitpid(pid, &status, 0) < 0) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The file's text (static buffer, NUL-terminated, truncated at 64 KiB). */
static const char *text_of(const char *path) {
    static char buf[65536];
    buf[0] = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return buf;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

static g5_status convert_to(const char *model, const char *dir, uint32_t tp, int force, g5_error *e) {
    convert_options o;
    convert_options_init(&o);
    o.tp = tp;
    o.jobs = 1;
    o.force = force;
    convert_result *r = NULL;
    g5_status st = convert_run(model, dir, &o, &r, e);
    convert_result_free(r);
    return st;
}

/* Flips one byte at offset off of path (pread/pwrite, not a mapping). 0 on success. */
static int flip_byte(const char *path, uint64_t off) {
    int fd = open(path, O_RDWR);
    if (fd < 0) return -1;
    uint8_t b;
    int ok = pread(fd, &b, 1, (off_t)off) == 1;
    b ^= 0x5a;
    ok = ok && pwrite(fd, &b, 1, (off_t)off) == 1;
    close(fd);
    return ok ? 0 : -1;
}

/* ---- 1. checksums on the CPU load path ---- */

static void test_checksums(void) {
    const char *dir = pathf("%s/set2", g_tmp);
    g5_error e = {0};
    g5_status st = convert_to(T_ORACLE_GGUF, dir, 2, 0, &e);
    T_CHECK(st == G5_OK, "convert: %s", e.msg);
    if (st) return;
    rt_wset *ws = NULL;
    rt_wset_load_info li;
    st = rt_wset_open_ex(dir, NULL, &ws, &li, &e);
    T_CHECK(st == G5_OK && li.verified && li.bytes > 0, "clean set verifies: %s", e.msg);
    rt_wset_free(ws);

    /* a copy of the set with one data byte of output.weight flipped in rank 1 */
    const char *bad = pathf("%s/bad2", g_tmp);
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", dir, bad);
    T_CHECK(system(cmd) == 0, "copy set");
    const char *rank1 = pathf("%s/rank-00001-of-00002.g5b", bad);
    blob *b = NULL;
    uint64_t off = 0, size = 0;
    if (blob_open(rank1, &b, &e) == G5_OK) {
        const blob_tensor *t = blob_find_tensor(b, "output.weight");
        if (t) off = t->offset, size = t->size;
        blob_free(b);
    }
    T_CHECK(size > 0 && flip_byte(rank1, off + size / 2) == 0, "corrupt output.weight");
    ws = NULL;
    g5_error_clear(&e);
    st = rt_wset_open_ex(bad, NULL, &ws, &li, &e);
    char want[64];
    snprintf(want, sizeof want, "bytes %llu..%llu", (unsigned long long)off, (unsigned long long)(off + size));
    T_CHECK(st == G5_ERR_CHECKSUM && strstr(e.msg, "rank-00001-of-00002.g5b") && strstr(e.msg, "'output.weight'") &&
                strstr(e.msg, want) && !ws,
            "corrupt tensor refused, naming file, tensor and bytes: %s", e.msg);
    rt_wset_free(ws);
    ws = NULL;
    rt_wset_opts nv = {.no_verify = 1};
    st = rt_wset_open_ex(bad, &nv, &ws, &li, &e);
    T_CHECK(st == G5_OK && !li.verified, "--no-verify opens it");
    rt_wset_free(ws);
    /* the old entry points verify too */
    ws = NULL;
    st = rt_wset_open(bad, &ws, &e);
    T_CHECK(st == G5_ERR_CHECKSUM, "rt_wset_open verifies");
    rt_wset_free(ws);

    /* glm5-run: refuses (exit 3 with the error), --no-verify runs and says so */
    const char *log = pathf("%s/run.log", g_tmp);
    char *run_bad[] = {pathf("%s/glm5-run", g_bin), "-m", (char *)bad, "--tokens", "1,2", "-n", "2", "--ids", "--temp", "0", NULL};
    int rc = run_cmd(run_bad, log);
    T_CHECK(rc == EXIT_ERR && strstr(text_of(log), "output.weight") && strstr(text_of(log), "XXH3-128 mismatch"),
            "glm5-run on a corrupt set: exit %d: %s", rc, text_of(log));
    char *run_nv[] = {pathf("%s/glm5-run", g_bin), "-m", (char *)bad, "--tokens", "1,2", "-n", "2", "--ids", "--temp", "0",
                      "--no-verify", NULL};
    rc = run_cmd(run_nv, log);
    T_CHECK(rc == 0 && strstr(text_of(log), "checksums skipped (--no-verify)"), "--no-verify: exit %d: %s", rc, text_of(log));
    char *run_ok[] = {pathf("%s/glm5-run", g_bin), "-m", (char *)dir, "--tokens", "1,2", "-n", "2", "--ids", "--temp", "0", NULL};
    rc = run_cmd(run_ok, log);
    T_CHECK(rc == 0 && strstr(text_of(log), "checksums verified: "), "load line: exit %d: %s", rc, text_of(log));

    /* glm5-serve refuses to start on the corrupt set */
    char *serve_bad[] = {pathf("%s/glm5-serve", g_bin), "-m", (char *)bad, "--port", "0", "--threads", "1", NULL};
    rc = run_cmd(serve_bad, log);
    T_CHECK(rc == EXIT_ERR && strstr(text_of(log), "output.weight") && strstr(text_of(log), "XXH3-128 mismatch"),
            "glm5-serve on a corrupt set: exit %d: %s", rc, text_of(log));
}

static int exists(const char *path) { return access(path, F_OK) == 0; }

/* ---- 4. a used output directory ---- */

static void test_used_outdir(void) {
    const char *dir = pathf("%s/used", g_tmp);
    g5_error e = {0};
    T_CHECK(convert_to(T_ORACLE_GGUF, dir, 2, 0, &e) == G5_OK, "TP 2 set: %s", e.msg);
    const char *notes = pathf("%s/NOTES.txt", dir);
    T_CHECK(t_write_file(notes, "mine", 4) == 0, "a file of the user's");
    g5_status st = convert_to(T_ORACLE_GGUF, dir, 1, 0, &e);
    T_CHECK(st == G5_ERR_EXISTS && strstr(e.msg, "already holds a blob set") && strstr(e.msg, "--force"),
            "TP 1 into a TP 2 set refused: %s", e.msg);
    T_CHECK(exists(pathf("%s/rank-00001-of-00002.g5b", dir)) && !exists(pathf("%s/rank-00000-of-00001.g5b", dir)),
            "the old set untouched after a refusal");
    rt_wset *ws = NULL;
    T_CHECK(rt_wset_open(dir, &ws, &e) == G5_OK && rt_wset_n_ranks(ws) == 2, "the old set still opens: %s", e.msg);
    rt_wset_free(ws);
    st = convert_to(T_ORACLE_GGUF, dir, 1, 1, &e);
    T_CHECK(st == G5_OK, "--force: %s", e.msg);
    T_CHECK(!exists(pathf("%s/rank-00000-of-00002.g5b", dir)) && !exists(pathf("%s/rank-00001-of-00002.g5b", dir)) &&
                exists(pathf("%s/rank-00000-of-00001.g5b", dir)) && exists(notes),
            "--force leaves no rank file of the old set (and the user's file)");
    ws = NULL;
    T_CHECK(rt_wset_open(dir, &ws, &e) == G5_OK && rt_wset_n_ranks(ws) == 1, "the new set opens: %s", e.msg);
    rt_wset_free(ws);
    /* the CLI: exit 3 naming --force */
    const char *log = pathf("%s/conv.log", g_tmp);
    char *conv[] = {pathf("%s/glm5-shard", g_bin), "convert", "--tp", "2", "-q", "-o", (char *)dir, (char *)T_ORACLE_GGUF, NULL};
    int rc = run_cmd(conv, log);
    T_CHECK(rc == 3 && strstr(text_of(log), "--force"), "glm5-shard convert into a used directory: exit %d: %s", rc, text_of(log));
}

int main(int argc, char **argv) {
    (void)argc;
    const char *b = getenv("BUILD");
    snprintf(g_bin, sizeof g_bin, "%s/bin", b && *b ? b : "build");
    (void)argv;
    signal(SIGPIPE, SIG_IGN);
    g_tmp = t_tmpdir();
    test_checksums();
    test_used_outdir();
    t_rmtree(g_tmp);
    return t_report("test_trust");
}
