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
#include "convert/synth.h"
#include "format/blob.h"
#include "format/glm5.h"
#include "format/gguf.h"
#include "format/gguf_write.h"
#include "format/quant.h"
#include "runtime/cpu/weights.h"
#include "format/mapguard.h"
#include "tests/test_util.h"
#include "tests/http_client.h"

/* the exit status of a failed load (corrupt input), glm5-run and glm5-serve */
#define EXIT_ERR 3

static char g_bin[4096];
static const char *g_tmp;

static char *pathf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Formatted paths and strings, kept until the end (freed by free_kept: no leak under ASan). */
static char *g_kept[4096];
static int g_n_kept;

static char *keep(char *p) {
    if (!p) abort();
    if (g_n_kept < (int)(sizeof g_kept / sizeof g_kept[0])) g_kept[g_n_kept++] = p;
    return p;
}

static void free_kept(void) {
    while (g_n_kept) free(g_kept[--g_n_kept]);
}

static char *pathf(const char *fmt, ...) {
    char *b = keep(malloc(4096));
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b, 4096, fmt, ap);
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

static int exists(const char *path) { return access(path, F_OK) == 0; }

static int n_entries(const char *dir);

/* Starts glm5-serve -m model --port 0 (extra: more arguments, NULL-terminated, or NULL) with its
 * stderr in log; waits for its "listening on" line. The pid (port in *port), or -1. */
static pid_t start_serve(const char *model, const char *log, uint16_t *port, char *const *extra) {
    char *argv[40];
    int n = 0;
    argv[n++] = pathf("%s/glm5-serve", g_bin);
    argv[n++] = "-m";
    argv[n++] = (char *)model;
    argv[n++] = "--port";
    argv[n++] = "0";
    argv[n++] = "--threads";
    argv[n++] = "1";
    for (int i = 0; extra && extra[i] && n < 38; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    *port = 0;
    unlink(log); /* no earlier server's line may be read as this one's */
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) _exit(127);
        dup2(fd, 1);
        dup2(fd, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    for (int i = 0; i < 1500 && !*port; i++) {
        const char *p = strstr(text_of(log), "listening on http://127.0.0.1:");
        unsigned u;
        if (p && sscanf(p, "listening on http://127.0.0.1:%u", &u) == 1) *port = (uint16_t)u;
        else usleep(20000);
    }
    return pid;
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

/* ---- 2. one validation: each bad GGUF refused alike by convert, inspect and run ---- */

typedef enum edit_kind {
    E_RETYPE,      /* tensor `name` stored as `type` (zero data) */
    E_DROP_KEY,    /* key `name` removed */
    E_TOKENS_INT,  /* tokenizer.ggml.tokens as an i32 array */
    E_TOKENS_3,    /* tokenizer.ggml.tokens with 3 entries */
    E_MERGE_BAD,   /* a merge without its space */
    E_U32,         /* key `name` set to u32 `u` */
    E_F32,         /* key `name` set to f32 `f` */
    E_NAN_TENSOR,  /* element 7 of F32 tensor `name` set to NaN */
    E_BOOL_2,      /* bool key `name` stored as the byte 2 */
} edit_kind;

typedef struct edit {
    const char *what;
    edit_kind kind;
    const char *name;
    uint32_t type, u;
    float f;
    const char *expect; /* in every refusal message */
} edit;

static const edit k_edits[] = {
    {"output_norm as I8", E_RETYPE, "output_norm.weight", QT_I8, 0, 0, "I8"},
    {"attn_output as Q8_K", E_RETYPE, "blk.1.attn_output.weight", QT_Q8_K, 0, 0, "Q8_K"},
    {"no tokenizer.ggml.tokens", E_DROP_KEY, "tokenizer.ggml.tokens", 0, 0, 0, "tokenizer.ggml.tokens"},
    {"no tokenizer.ggml.merges", E_DROP_KEY, "tokenizer.ggml.merges", 0, 0, 0, "tokenizer.ggml.merges"},
    {"tokens as integers", E_TOKENS_INT, NULL, 0, 0, 0, "tokenizer.ggml.tokens"},
    {"3 tokens", E_TOKENS_3, NULL, 0, 0, 0, "tokenizer.ggml.tokens has 3 entries"},
    {"malformed merge", E_MERGE_BAD, NULL, 0, 0, 0, "tokenizer.ggml.merges[5]"},
    {"eos_token_id 999999", E_U32, "tokenizer.ggml.eos_token_id", 0, 999999, 0, "eos_token_id = 999999"},
    {"rms epsilon NaN", E_F32, "glm-dsa.attention.layer_norm_rms_epsilon", 0, 0, NAN, "layer_norm_rms_epsilon"},
    {"rope.freq_base inf", E_F32, "glm-dsa.rope.freq_base", 0, 0, INFINITY, "rope.freq_base"},
    {"NaN in output_norm", E_NAN_TENSOR, "output_norm.weight", 0, 0, 0, "output_norm.weight': element 7"},
    {"NaN in a layer norm", E_NAN_TENSOR, "blk.2.attn_kv_a_norm.weight", 0, 0, 0, "blk.2.attn_kv_a_norm.weight"},
    {"context_length 0", E_U32, "glm-dsa.context_length", 0, 0, 0, "context_length is 0"},
    {"boolean value 2", E_BOOL_2, "glm-dsa.expert_weights_norm", 0, 0, 0, "boolean value 2"},
    {"head_count 0xFFFFFFFF", E_U32, "glm-dsa.attention.head_count", 0, 0xFFFFFFFFu, 0, "head_count = 4294967295"},
    {"head_count 8 (shapes disagree)", E_U32, "glm-dsa.attention.head_count", 0, 8, 0, "shape"},
};

/* Writes the oracle GGUF with one edit to path. 0 on success. */
static int write_edited(const gguf_ctx *src, const edit *ed, const char *path) {
    gguf_writer *w = gguf_writer_create();
    int ok = w != NULL;
    for (int64_t i = 0; ok && i < gguf_get_n_kv(src); i++) ok = gguf_writer_copy_kv(w, src, i) == G5_OK;
    static char tok[3][8] = {"a", "b", "c"};
    switch (ed->kind) {
    case E_DROP_KEY: ok = ok && gguf_writer_remove_key(w, ed->name) == G5_OK; break;
    case E_TOKENS_INT: {
        int32_t v[2048];
        for (int i = 0; i < 2048; i++) v[i] = i;
        ok = ok && gguf_writer_set_arr(w, "tokenizer.ggml.tokens", GGUF_VT_INT32, v, 2048) == G5_OK;
        break;
    }
    case E_TOKENS_3: {
        const char *strs[3] = {tok[0], tok[1], tok[2]};
        uint64_t lens[3] = {1, 1, 1};
        ok = ok && gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", strs, lens, 3) == G5_OK;
        break;
    }
    case E_MERGE_BAD: {
        gguf_vtype et;
        uint64_t n;
        ok = ok && gguf_get_arr(src, "tokenizer.ggml.merges", &et, &n, NULL) == G5_OK;
        const char **strs = malloc(n * sizeof *strs);
        uint64_t *lens = malloc(n * sizeof *lens);
        for (uint64_t i = 0; ok && i < n; i++) ok = gguf_get_arr_str(src, "tokenizer.ggml.merges", i, &strs[i], &lens[i], NULL) == G5_OK;
        if (ok) strs[5] = "nospace", lens[5] = 7;
        ok = ok && gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", strs, lens, n) == G5_OK;
        free(strs);
        free(lens);
        break;
    }
    case E_U32: ok = ok && gguf_writer_set_u32(w, ed->name, ed->u) == G5_OK; break;
    case E_F32: ok = ok && gguf_writer_set_f32(w, ed->name, ed->f) == G5_OK; break;
    default: break;
    }
    uint8_t *zero = NULL, *nan_copy = NULL;
    for (int64_t i = 0; ok && i < gguf_get_n_tensors(src); i++) {
        const gguf_tensor *t = gguf_get_tensor(src, i);
        const void *data = t->data;
        uint32_t type = t->type;
        if (ed->name && !strcmp(t->name, ed->name) && ed->kind == E_RETYPE) {
            type = ed->type;
            zero = calloc(1, t->n_elems * 4 + 4096); /* more than any type needs */
            data = zero;
        } else if (ed->name && !strcmp(t->name, ed->name) && ed->kind == E_NAN_TENSOR) {
            nan_copy = malloc(t->nbytes);
            memcpy(nan_copy, t->data, t->nbytes);
            float q = NAN;
            memcpy(nan_copy + 7 * 4, &q, 4);
            data = nan_copy;
        }
        ok = gguf_writer_add_tensor(w, t->name, type, t->n_dims, t->ne, data, NULL) == G5_OK;
    }
    uint8_t *img = NULL;
    uint64_t len = 0;
    ok = ok && gguf_writer_write_buffer(w, &img, &len) == G5_OK;
    if (ok && ed->kind == E_BOOL_2) { /* the key, its type (u32 7 = bool), then the value byte */
        const size_t kl = strlen(ed->name);
        uint8_t *hit = memmem(img, len, ed->name, kl);
        ok = hit && hit[kl] == 7 && hit[kl + 4] == 1;
        if (ok) hit[kl + 4] = 2;
    }
    ok = ok && t_write_file(path, img, len) == 0;
    free(img);
    free(zero);
    free(nan_copy);
    gguf_writer_free(w);
    return ok ? 0 : -1;
}

static int n_entries(const char *dir) { /* -1 or 0 when absent */
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "ls -A '%s' 2>/dev/null | wc -l", dir);
    FILE *p = popen(cmd, "r");
    int n = -1;
    if (p && fscanf(p, "%d", &n) != 1) n = -1;
    if (p) pclose(p);
    return n;
}

static void test_bad_models(void) {
    gguf_ctx *src = NULL;
    g5_error e = {0};
    T_CHECK(gguf_open(T_ORACLE_GGUF, &src, &e) == G5_OK, "oracle: %s", e.msg);
    if (!src) return;
    glm5_hparams hp;
    T_CHECK(glm5_model_validate(src, &hp, &e) == G5_OK, "the oracle validates: %s", e.msg);
    char log[4200], path[4200];
    snprintf(log, sizeof log, "%s/bad.log", g_tmp);
    for (size_t k = 0; k < sizeof k_edits / sizeof k_edits[0]; k++) {
        const edit *ed = &k_edits[k];
        snprintf(path, sizeof path, "%s/bad-%zu.gguf", g_tmp, k);
        if (write_edited(src, ed, path)) {
            T_CHECK(0, "%s: cannot write the edited GGUF", ed->what);
            continue;
        }
        /* convert: refused before writing anything */
        const char *out = pathf("%s/bad-out-%zu", g_tmp, k);
        g5_error_clear(&e);
        g5_status st = convert_to(path, out, 1, 0, &e);
        T_CHECK(st != G5_OK && strstr(e.msg, ed->expect) && n_entries(out) <= 0, "%s: convert: %s", ed->what, e.msg);
        /* the runtime's open refuses it alike, before any allocation sized from it */
        rt_wset *ws = NULL;
        g5_error_clear(&e);
        st = rt_wset_open(path, &ws, &e);
        T_CHECK(st != G5_OK && st != G5_ERR_NOMEM && strstr(e.msg, ed->expect), "%s: run: %s", ed->what, e.msg);
        rt_wset_free(ws);
        /* inspect's audit fails (exit 1) or the file does not parse (exit 3) */
        char *insp[] = {pathf("%s/glm5-shard", g_bin), "inspect", path, NULL};
        int rc = run_cmd(insp, log);
        T_CHECK((rc == 1 || rc == 3) && strstr(text_of(log), ed->expect), "%s: inspect: exit %d", ed->what, rc);
        /* glm5-run on it */
        char *run[] = {pathf("%s/glm5-run", g_bin), "-m", path, "--tokens", "1,2", "-n", "1", "-q", NULL};
        rc = run_cmd(run, log);
        T_CHECK(rc == EXIT_ERR && strstr(text_of(log), ed->expect), "%s: glm5-run: exit %d: %s", ed->what, rc, text_of(log));
    }
    gguf_free(src);
}

/* ---- 3. files truncated under a mapping: an error naming the file, never SIGBUS ---- */

static const char *g_trunc_path;
static uint64_t g_trunc_to;
static int g_truncated;

static void truncate_once(void *user, const convert_progress *p) {
    (void)user;
    if (p->phase == CONVERT_PHASE_WRITE && !g_truncated) {
        g_truncated = 1;
        if (truncate(g_trunc_path, (off_t)g_trunc_to) != 0) _exit(120);
    }
}

static int copy_file(const char *from, const char *to) {
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", from, to);
    return system(cmd);
}

/* Waits for pid; its exit status, 128 + signal, or -1 after timeout_s (then kills it). */
static int wait_exit(pid_t pid, double timeout_s) {
    for (int i = 0; i < (int)(timeout_s * 50); i++) {
        int status;
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        usleep(20000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

static void test_truncation(void) {
    /* convert: the source GGUF cut to its header once writing has begun */
    char src[4200], out[4200], log[4200];
    snprintf(src, sizeof src, "%s/trunc.gguf", g_tmp);
    snprintf(out, sizeof out, "%s/trunc-out", g_tmp);
    snprintf(log, sizeof log, "%s/trunc.log", g_tmp);
    T_CHECK(copy_file(T_ORACLE_GGUF, src) == 0, "copy the oracle");
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 2);
        g5_mapguard_install("glm5-shard", 3);
        g_trunc_path = src;
        g_trunc_to = 70000; /* the header and the first tensor's first bytes */
        convert_options o;
        convert_options_init(&o);
        o.tp = 2;
        o.jobs = 2;
        o.progress = truncate_once;
        o.progress_interval_s = 0;
        g5_error e = {0};
        g5_status st = convert_run(src, out, &o, NULL, &e);
        fprintf(stderr, "convert_run returned %d: %s\n", (int)st, e.msg);
        _exit(st ? 4 : 0); /* not expected: the truncated data is read after the callback */
    }
    int rc = wait_exit(pid, 60);
    const char *t = text_of(log);
    T_CHECK(rc == 3 && strstr(t, src) && strstr(t, "truncated or changed while in use"),
            "source truncated during convert: exit %d (not 135): %s", rc, t);
    T_CHECK(n_entries(out) <= 0, "no file of the set left behind (%d entries)", n_entries(out));

    /* the in-process mechanism, deterministic: a mapping read past its file's new end */
    char tmpout[4200];
    snprintf(tmpout, sizeof tmpout, "%s/pending.g5b.tmp", g_tmp);
    T_CHECK(copy_file(T_ORACLE_GGUF, src) == 0, "copy the oracle again");
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 2);
        g5_mapguard_install("probe", 3);
        gguf_ctx *g = NULL;
        if (gguf_open(src, &g, NULL)) _exit(121);
        if (t_write_file(tmpout, "x", 1)) _exit(122);
        g5_mapguard_add_output(tmpout);
        if (truncate(src, 4096)) _exit(123);
        const gguf_tensor *last = gguf_get_tensor(g, gguf_get_n_tensors(g) - 1);
        volatile uint8_t sink = last->data[last->nbytes - 1];
        (void)sink;
        _exit(0);
    }
    rc = wait_exit(pid, 30);
    t = text_of(log);
    T_CHECK(rc == 3 && strstr(t, "probe: ") && strstr(t, src) && strstr(t, "removed 1 unfinished output"),
            "read past a truncated mapping: exit %d: %s", rc, t);
    T_CHECK(!exists(tmpout), "the unfinished output was removed");

    /* glm5-serve: a rank file cut under it while it serves */
    char dir[4200], cmd[9000];
    snprintf(dir, sizeof dir, "%s/trunc-set", g_tmp);
    g5_error e = {0};
    T_CHECK(convert_to(T_ORACLE_GGUF, dir, 2, 0, &e) == G5_OK, "set: %s", e.msg);
    uint16_t port = 0;
    pid = start_serve(dir, log, &port, NULL);
    T_CHECK(pid > 0 && port, "glm5-serve started: %s", text_of(log));
    if (pid <= 0 || !port) return;
    hresp h;
    int ok = 0;
    for (int i = 0; i < 500 && !ok; i++) {
        ok = http_do(port, "GET", "/health", NULL, NULL, &h) == 0 && h.status == 200;
        hresp_free(&h);
        if (!ok) usleep(20000);
    }
    T_CHECK(ok, "healthy before the truncation");
    snprintf(cmd, sizeof cmd, "%s/rank-00001-of-00002.g5b", dir);
    T_CHECK(truncate(cmd, 8192) == 0, "truncate rank 1");
    http_do(port, "POST", "/v1/completions", NULL, "{\"prompt\":\"Once upon a time\",\"max_tokens\":4}", &h);
    hresp_free(&h);
    rc = wait_exit(pid, 30);
    t = text_of(log);
    T_CHECK(rc == EXIT_ERR && strstr(t, "rank-00001-of-00002.g5b: the file was truncated or changed while in use"),
            "glm5-serve with a rank file truncated under it: exit %d (not 135): %s", rc, t);
}


/* ---- 4. sets written as sets: synth --split-size on a full disk ---- */

static void test_synth_full_disk(void) {
    char dir[4200], path[4300];
    snprintf(dir, sizeof dir, "%s/splits", g_tmp);
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/tiny.gguf", dir);
    synth_opts o;
    synth_opts_init(&o);
    o.split_size = 4u << 20;
    synth_result r;
    g5_error e = {0};
    g5_status st = synth_write(&o, path, &r, &e);
    T_CHECK(st == G5_OK && r.n_files >= 3, "a split set: %s (%u files)", e.msg, r.n_files);
    const uint64_t total = r.file_bytes;
    char cmd[4300];
    snprintf(cmd, sizeof cmd, "rm -f '%s'/*", dir);
    T_CHECK(system(cmd) == 0 && n_entries(dir) == 0, "emptied");
    o.test_fail_after_bytes = total / 2; /* the disk fills in the middle of the set */
    st = synth_write(&o, path, &r, &e);
    T_CHECK(st == G5_ERR_IO && strstr(e.msg, "No space left on device"), "full disk: %s", e.msg);
    T_CHECK(n_entries(dir) == 0, "no split of the failed set left behind (%d files)", n_entries(dir));
}

/* ---- 6. the context length ---- */

static char *id_list(int n) {
    char *s = keep(malloc((size_t)n * 6 + 1));
    size_t off = 0;
    for (int i = 0; i < n; i++) off += (size_t)sprintf(s + off, i ? ",%d" : "%d", 100 + i % 900);
    return s;
}

static int count_ids(const char *text) {
    int n = 0;
    for (const char *p = text; *p; p++)
        if (*p >= '0' && *p <= '9' && (p == text || p[-1] < '0' || p[-1] > '9')) n++;
    return n;
}

static void test_context(void) {
    char log[4200], out[4200];
    snprintf(log, sizeof log, "%s/ctx.log", g_tmp);
    snprintf(out, sizeof out, "%s/ctx.out", g_tmp);
    char *run = pathf("%s/glm5-run", g_bin);
    /* 4200 tokens on a 4096-token model: refused at once, both numbers given */
    char *long_prompt[] = {run, "-m", (char *)T_ORACLE_GGUF, "--tokens", id_list(4200), "-n", "4", NULL};
    int rc = run_cmd(long_prompt, log);
    T_CHECK(rc == 2 && strstr(text_of(log), "4200 tokens") && strstr(text_of(log), "context length is 4096"),
            "a 4200-token prompt on a 4096-token model: exit %d: %s", rc, text_of(log));
    char *over[] = {run, "-m", (char *)T_ORACLE_GGUF, "--tokens", "1,2", "--ctx-size", "8192", NULL};
    rc = run_cmd(over, log);
    T_CHECK(rc == 2 && strstr(text_of(log), "8192") && strstr(text_of(log), "4096"), "--ctx-size above the model's: exit %d", rc);
    char *capped[] = {run, "-m", (char *)T_ORACLE_GGUF, "--tokens", id_list(20), "--ctx-size", "16", NULL};
    rc = run_cmd(capped, log);
    T_CHECK(rc == 2 && strstr(text_of(log), "20 tokens") && strstr(text_of(log), "context length is 16 (--ctx-size)"),
            "--ctx-size 16 and 20 tokens: exit %d: %s", rc, text_of(log));
    /* --truncate keeps the end and leaves room to generate; generation stops at the context */
    char *cut[] = {run, "-m", (char *)T_ORACLE_GGUF, "--tokens", id_list(20), "--ctx-size", "16", "--truncate", "-n", "4",
                   "--ids", "--temp", "0", NULL};
    rc = run_cmd(cut, log);
    T_CHECK(rc == 0 && strstr(text_of(log), "cut to its last 12"), "--truncate: exit %d: %s", rc, text_of(log));
    char *stop[] = {run, "-m", (char *)T_ORACLE_GGUF, "--tokens", id_list(14), "--ctx-size", "16", "-n", "10", "--ids",
                    "--temp", "0", NULL};
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644), fe = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fe, 2);
        execv(stop[0], stop);
        _exit(127);
    }
    rc = wait_exit(pid, 120);
    T_CHECK(rc == 0 && count_ids(text_of(out)) <= 2 && strstr(text_of(log), "at most 2 of -n 10"),
            "generation bounded by the context: exit %d, %d ids: %s", rc, count_ids(text_of(out)), text_of(log));
}

/* ---- 7. server limits: slow clients cannot lock out /health ---- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* n connections that each send half a request and then idle; fds into fds. The count opened. */
static int open_slow(uint16_t port, int n, int *fds) {
    static const char half[] = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\nX-Slow: ";
    int k = 0;
    for (; k < n; k++) {
        fds[k] = tcp_connect(port);
        if (fds[k] < 0 || send_all(fds[k], half, sizeof half - 1)) break;
    }
    return k;
}

/* Whether the server closed fd (recv 0 or an error) within timeout_s. */
static int closed_by_server(int fd, double timeout_s) {
    struct timeval tv = {(time_t)timeout_s, (suseconds_t)((timeout_s - (double)(time_t)timeout_s) * 1e6)};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char b[256];
    ssize_t r = recv(fd, b, sizeof b, 0);
    return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

static int health_ms(uint16_t port, double *ms) {
    double t0 = now_s();
    hresp h;
    int ok = http_do(port, "GET", "/health", NULL, NULL, &h) == 0 && h.status == 200;
    hresp_free(&h);
    *ms = 1e3 * (now_s() - t0);
    return ok;
}

static void test_slow_clients(void) {
    char log[4200];
    snprintf(log, sizeof log, "%s/slow.log", g_tmp);
    uint16_t port;
    pid_t pid = start_serve(T_ORACLE_GGUF, log, &port, NULL);
    T_CHECK(pid > 0 && port && strstr(text_of(log), "connections <= 512, <= 256 per address, idle timeout 30 s"),
            "glm5-serve started with the default limits: %s", text_of(log));
    if (pid <= 0 || !port) return;
    double ms = 0;
    int ok = 0;
    for (int i = 0; i < 1500 && !ok; i++) {
        ok = health_ms(port, &ms);
        if (!ok) usleep(20000);
    }
    T_CHECK(ok, "healthy");
    static int fds[256];
    int n = open_slow(port, 200, fds);
    T_CHECK(n == 200, "200 half-sent requests from one address: %d", n);
    usleep(200000); /* let the server accept them all */
    ok = health_ms(port, &ms);
    T_CHECK(ok && ms < 1000, "/health answered beside 200 idle connections: %d in %.1f ms", ok, ms);
    hresp h;
    ok = http_do(port, "POST", "/v1/completions", NULL, "{\"prompt\":\"Once\",\"max_tokens\":2,\"temperature\":0}", &h) == 0 &&
         h.status == 200;
    T_CHECK(ok, "a fresh request from the same address is served: %d", h.status);
    hresp_free(&h);
    /* the context is enforced by the server too: 400 naming both numbers */
    char *body = malloc(64 + 4200 * 6);
    int off = sprintf(body, "{\"prompt\":[");
    for (int i = 0; i < 4200; i++) off += sprintf(body + off, i ? ",%d" : "%d", 100 + i % 900);
    sprintf(body + off, "],\"max_tokens\":2}");
    ok = http_do(port, "POST", "/v1/completions", NULL, body, &h) == 0 && h.status == 400 && h.body &&
         strstr(h.body, "4200") && strstr(h.body, "4096");
    T_CHECK(ok, "a 4200-token prompt: %d %s", h.status, h.body ? h.body : "");
    hresp_free(&h);
    free(body);
    for (int i = 0; i < n; i++) close(fds[i]);
    kill(pid, SIGTERM);
    T_CHECK(wait_exit(pid, 30) == 0, "stopped on SIGTERM");

    /* --timeout 1 closes half-sent requests; --max-connections-per-ip 3 refuses a 4th */
    char *extra[] = {"--timeout", "1", "--max-connections-per-ip", "3", NULL};
    pid = start_serve(T_ORACLE_GGUF, log, &port, extra);
    T_CHECK(pid > 0 && port && strstr(text_of(log), "<= 3 per address, idle timeout 1 s"), "options: %s", text_of(log));
    if (pid <= 0 || !port) return;
    n = open_slow(port, 3, fds);
    int extra_fd = tcp_connect(port);
    T_CHECK(n == 3 && extra_fd >= 0 && closed_by_server(extra_fd, 2.0), "a 4th connection from the address is refused");
    if (extra_fd >= 0) close(extra_fd);
    double t0 = now_s();
    int closed = 0;
    for (int i = 0; i < n; i++) closed += closed_by_server(fds[i], 5.0);
    T_CHECK(closed == 3, "--timeout 1: the half-sent requests closed by the server (%d of 3, %.1f s)", closed, now_s() - t0);
    for (int i = 0; i < n; i++) close(fds[i]);
    /* the server learns of the closes asynchronously: poll for up to 5 s */
    for (int tries = 0; tries < 50 && !(ok = health_ms(port, &ms)); tries++) usleep(100000);
    T_CHECK(ok, "served again once they are gone");
    kill(pid, SIGTERM);
    T_CHECK(wait_exit(pid, 30) == 0, "stopped on SIGTERM");
}

/* ---- 5. a used output directory ---- */

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

/* A one-rank set written here through the blob writer, self-consistent (every hash right) but
 * with the metadata of an edited GGUF: what an older converter could have written. */
static int write_set_with_meta(const char *good_dir, const gguf_ctx *meta_src, const char *dir) {
    blob *b = NULL;
    if (blob_open(pathf("%s/rank-00000-of-00001.g5b", good_dir), &b, NULL)) return -1;
    const blob_info *in = blob_get_info(b);
    gguf_writer *gw = gguf_writer_create();
    int ok = gw != NULL;
    for (int64_t i = 0; ok && i < gguf_get_n_kv(meta_src); i++) ok = gguf_writer_copy_kv(gw, meta_src, i) == G5_OK;
    uint8_t *meta = NULL;
    uint64_t meta_len = 0;
    ok = ok && gguf_writer_write_buffer(gw, &meta, &meta_len) == G5_OK;
    gguf_writer_free(gw);
    const uint64_t nt = blob_n_tensors(b);
    blob_writer_tensor *wt = calloc(nt, sizeof *wt);
    blob_source_desc *sd = calloc(in->n_sources, sizeof *sd);
    for (uint64_t i = 0; ok && i < nt; i++) {
        const blob_tensor *t = blob_get_tensor(b, i);
        wt[i] = (blob_writer_tensor){t->name, t->type, t->n_dims, {t->ne[0], t->ne[1], t->ne[2], t->ne[3]},
                                     {t->ne_global[0], t->ne_global[1], t->ne_global[2], t->ne_global[3]},
                                     t->split_axis, t->split_index, t->split_count, t->flags};
    }
    for (uint32_t i = 0; ok && i < in->n_sources; i++) {
        const blob_source *bs = blob_get_source(b, i);
        sd[i].name = bs->name;
        sd[i].file_size = bs->file_size;
        sd[i].header_size = bs->header_size;
        memcpy(sd[i].header_hash, bs->header_hash, 16);
        memcpy(sd[i].sample_hash, bs->sample_hash, 16);
    }
    blob_writer_params bp = {0};
    bp.tp = 1;
    bp.placement = in->placement;
    bp.converter_version = in->converter_version;
    bp.kv_b_type = in->kv_b_type;
    memcpy(bp.set_id, in->set_id, 16);
    bp.meta = meta;
    bp.meta_len = meta_len;
    bp.n_sources = in->n_sources;
    bp.sources = sd;
    mkdir(dir, 0755);
    blob_writer *w = NULL;
    uint8_t hh[16];
    ok = ok && blob_writer_create(pathf("%s/rank-00000-of-00001.g5b", dir), &bp, wt, nt, &w, NULL) == G5_OK;
    for (uint64_t i = 0; ok && i < nt; i++) {
        const blob_tensor *t = blob_get_tensor(b, i);
        ok = blob_writer_write(w, t->data, t->size, NULL) == G5_OK;
    }
    ok = ok && blob_writer_finish(w, hh, NULL) == G5_OK;
    blob_writer_free(w);
    blob_set_record rec = {BLOB_SET_VERSION, 1, in->placement, in->converter_version, {0}, NULL};
    memcpy(rec.set_id, in->set_id, 16);
    blob_set_entry ent;
    struct stat sb;
    ok = ok && stat(pathf("%s/rank-00000-of-00001.g5b", dir), &sb) == 0;
    ent.file_size = (uint64_t)sb.st_size;
    memcpy(ent.header_hash, hh, 16);
    rec.ranks = &ent;
    ok = ok && blob_set_record_write(dir, &rec, NULL) == G5_OK;
    free(meta);
    free(wt);
    free(sd);
    blob_free(b);
    return ok ? 0 : -1;
}

static void test_bad_set(void) {
    const char *good = pathf("%s/good1", g_tmp), *bad = pathf("%s/bad-meta-set", g_tmp);
    g5_error e = {0};
    T_CHECK(convert_to(T_ORACLE_GGUF, good, 1, 0, &e) == G5_OK, "TP 1 set: %s", e.msg);
    /* the metadata of "eos_token_id 999999", in a set whose every hash holds */
    const char *edited = pathf("%s/eos.gguf", g_tmp);
    gguf_ctx *src = NULL, *ed = NULL;
    T_CHECK(gguf_open(T_ORACLE_GGUF, &src, &e) == G5_OK, "oracle");
    const edit eos = {"eos", E_U32, "tokenizer.ggml.eos_token_id", 0, 999999, 0, "eos_token_id = 999999"};
    T_CHECK(src && write_edited(src, &eos, edited) == 0 && gguf_open(edited, &ed, &e) == G5_OK, "edited GGUF");
    T_CHECK(ed && write_set_with_meta(good, ed, bad) == 0, "a self-consistent set with the edited metadata");
    gguf_free(src);
    gguf_free(ed);
    rt_wset *ws = NULL;
    g5_status st = rt_wset_open(bad, &ws, &e);
    T_CHECK(st != G5_OK && strstr(e.msg, "eos_token_id = 999999"), "the runtime's blob open refuses it: %s", e.msg);
    rt_wset_free(ws);
    convert_verify_options vo;
    convert_verify_options_init(&vo);
    convert_verify_result *vr = NULL;
    st = convert_verify(bad, &vo, &vr, &e);
    int named = 0;
    for (uint64_t i = 0; vr && i < vr->n_findings_stored; i++) named |= strstr(vr->findings[i].msg, "eos_token_id") != NULL;
    T_CHECK(vr && vr->n_findings > 0 && named, "verify does not bless it (%llu findings)",
            vr ? (unsigned long long)vr->n_findings : 0ull);
    convert_verify_result_free(vr);
    vr = NULL;
    st = convert_verify(good, &vo, &vr, &e);
    T_CHECK(st == G5_OK && vr && vr->n_findings == 0, "the good set verifies");
    convert_verify_result_free(vr);
    const char *log = pathf("%s/verify.log", g_tmp);
    char *ver[] = {pathf("%s/glm5-shard", g_bin), "verify", (char *)bad, NULL};
    int rc = run_cmd(ver, log);
    T_CHECK(rc == 1 && strstr(text_of(log), "eos_token_id"), "glm5-shard verify: exit %d", rc);
}

int main(int argc, char **argv) {
    (void)argc;
    const char *b = getenv("BUILD");
    snprintf(g_bin, sizeof g_bin, "%s/bin", b && *b ? b : "build");
    (void)argv;
    signal(SIGPIPE, SIG_IGN);
    g_tmp = t_tmpdir();
    if (access(T_ORACLE_GGUF, R_OK) != 0) {
        printf("oracle GGUF not found at %s (set GLM5_SHARED)\n", T_ORACLE_GGUF);
        T_CHECK(0, "oracle present");
        t_rmtree(g_tmp);
        return t_report("test_trust");
    }
    test_checksums();
    test_used_outdir();
    test_bad_models();
    test_bad_set();
    test_truncation();
    test_synth_full_disk();
    test_context();
    test_slow_clients();
    t_rmtree(g_tmp);
    free_kept();
    return t_report("test_trust");
}
