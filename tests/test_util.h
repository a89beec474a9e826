/* Minimal test harness: plain C programs, one per module. Each check prints FAIL with its
 * location when it does not hold; t_report() prints `NAME: N passed, M failed` last. */
#ifndef G5_TEST_UTIL_H
#define G5_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

static int t_passed, t_failed;

#define T_CHECK(cond, ...)                                                               \
    do {                                                                                 \
        if (cond) {                                                                      \
            t_passed++;                                                                  \
        } else {                                                                         \
            t_failed++;                                                                  \
            fprintf(stdout, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);              \
            fprintf(stdout, __VA_ARGS__);                                                \
            fputc('\n', stdout);                                                         \
        }                                                                                \
    } while (0)

static inline int t_report(const char *name) {
    printf("%s: %d passed, %d failed\n", name, t_passed, t_failed);
    return t_failed ? 1 : 0;
}

/* Path under the shared reference data ($GLM5_SHARED, default ../shared). */
static inline const char *t_shared(const char *rel) {
    static char buf[8][4096];
    static int slot;
    const char *root = getenv("GLM5_SHARED");
    if (!root || !*root) root = "../shared";
    char *b = buf[slot++ & 7];
    snprintf(b, sizeof buf[0], "%s/%s", root, rel);
    return b;
}
#define T_ORACLE_GGUF t_shared("oracle/glm5-tiny/glm5-tiny-UD-Q4_K_XL.gguf")

/* A fresh private directory under $TMPDIR (or /tmp); removed by t_rmtree at the end. */
static inline const char *t_tmpdir(void) {
    static char dir[4096];
    const char *base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    snprintf(dir, sizeof dir, "%s/g5test.XXXXXX", base);
    if (!mkdtemp(dir)) { perror("mkdtemp"); exit(2); }
    return dir;
}
static inline void t_rmtree(const char *dir) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
}

/* Whole file into a malloc'ed buffer (NULL if it cannot be read); *len = its size. */
static inline uint8_t *t_read_file(const char *path, size_t *len) {
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = (uint8_t *)malloc(n > 0 ? (size_t)n : 1);
    if (b && n > 0 && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) *len = (size_t)(n > 0 ? n : 0);
    return b;
}

/* Writes n bytes to path (plainly: tests build corrupt inputs with it). 0 on success. */
static inline int t_write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = n == 0 || fwrite(p, 1, n, f) == n;
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

/* Runs a shell command, captures stdout+stderr into *out (malloc'ed, NUL-terminated; out may be
 * NULL) and returns the exit code (-1 if it did not exit normally). */
static inline int t_run_capture(const char *cmd, char **out) {
    if (out) *out = NULL;
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t cap = 1 << 16, n = 0, r;
    char *buf = (char *)malloc(cap);
    while (buf && (r = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += r;
        if (cap - n < 2) {
            char *nb = (char *)realloc(buf, cap * 2);
            if (!nb) break;
            buf = nb;
            cap *= 2;
        }
    }
    if (buf) buf[n] = 0;
    int st = pclose(p);
    if (out) *out = buf;
    else free(buf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* 1 if both files exist and hold the same bytes. */
static inline int t_file_equal(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int eq = fa && fb;
    while (eq) {
        int ca = fgetc(fa), cb = fgetc(fb);
        if (ca != cb) eq = 0;
        if (ca == EOF || cb == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return eq;
}

/* Path of a built program: $G5_BIN_DIR/NAME, else $BUILD/bin/NAME (BUILD default "build"). */
static inline const char *t_bin(const char *name) {
    static char buf[4][4096];
    static int slot;
    char *b = buf[slot++ & 3];
    const char *dir = getenv("G5_BIN_DIR");
    if (dir && *dir) {
        snprintf(b, sizeof buf[0], "%s/%s", dir, name);
    } else {
        const char *bd = getenv("BUILD");
        snprintf(b, sizeof buf[0], "%s/bin/%s", bd && *bd ? bd : "build", name);
    }
    return b;
}

/* Monotonic seconds, for the timings tests print (never assert on). */
static inline double t_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
