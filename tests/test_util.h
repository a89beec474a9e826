/* Minimal test harness: plain C programs, one per module. Each check prints FAIL with its
 * location when it does not hold; t_report() prints `NAME: N passed, M failed` last. */
#ifndef G5_TEST_UTIL_H
#define G5_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    uint8_t *b = malloc(n > 0 ? (size_t)n : 1);
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

#endif
