#include "mapguard.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#define N_MAPS 1024
#define N_OUTS 256
#define PATH_CAP 1024

typedef struct map_slot {
    _Atomic(uintptr_t) base;     /* 0: free */
    size_t len;
    char path[PATH_CAP];
} map_slot;

typedef struct out_slot {
    _Atomic int used;
    char path[PATH_CAP];
} out_slot;

static map_slot g_maps[N_MAPS];
static out_slot g_outs[N_OUTS];
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static char g_prog[64] = "glm5";
static int g_exit = 3;

static void copy_path(char *dst, const char *src) {
    size_t n = strlen(src);
    if (n >= PATH_CAP) n = PATH_CAP - 1;
    memcpy(dst, src, n);
    dst[n] = 0;
}

void g5_mapguard_add(const void *base, size_t len, const char *path) {
    if (!base || !len) return;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < N_MAPS; i++) {
        if (atomic_load_explicit(&g_maps[i].base, memory_order_relaxed)) continue;
        g_maps[i].len = len;
        copy_path(g_maps[i].path, path ? path : "?");
        atomic_store_explicit(&g_maps[i].base, (uintptr_t)base, memory_order_release);
        break;
    }
    pthread_mutex_unlock(&g_lock);
}

void g5_mapguard_remove(const void *base) {
    if (!base) return;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < N_MAPS; i++)
        if (atomic_load_explicit(&g_maps[i].base, memory_order_relaxed) == (uintptr_t)base) {
            atomic_store_explicit(&g_maps[i].base, 0, memory_order_release);
            break;
        }
    pthread_mutex_unlock(&g_lock);
}

void g5_mapguard_add_output(const char *tmp_path) {
    if (!tmp_path || strlen(tmp_path) >= PATH_CAP) return;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < N_OUTS; i++) {
        if (atomic_load_explicit(&g_outs[i].used, memory_order_relaxed)) continue;
        copy_path(g_outs[i].path, tmp_path);
        atomic_store_explicit(&g_outs[i].used, 1, memory_order_release);
        break;
    }
    pthread_mutex_unlock(&g_lock);
}

void g5_mapguard_remove_output(const char *tmp_path) {
    if (!tmp_path) return;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < N_OUTS; i++)
        if (atomic_load_explicit(&g_outs[i].used, memory_order_relaxed) && !strcmp(g_outs[i].path, tmp_path)) {
            atomic_store_explicit(&g_outs[i].used, 0, memory_order_release);
            break;
        }
    pthread_mutex_unlock(&g_lock);
}

/* ---- the handler: async-signal-safe calls only (write, unlink, _exit) ---- */

static void put(const char *s) {
    size_t n = strlen(s);
    while (n) {
        ssize_t w = write(2, s, n);
        if (w <= 0) return;
        s += w;
        n -= (size_t)w;
    }
}

static void put_u64(uint64_t v) {
    char b[24];
    int i = 23;
    b[i] = 0;
    do {
        b[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v && i > 0);
    put(b + i);
}

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
    (void)sig;
    (void)uc;
    const uintptr_t a = (uintptr_t)si->si_addr;
    int found = 0;
    put(g_prog);
    put(": ");
    for (int i = 0; i < N_MAPS && !found; i++) {
        uintptr_t b = atomic_load_explicit(&g_maps[i].base, memory_order_acquire);
        if (b && a >= b && a - b < g_maps[i].len) {
            put(g_maps[i].path);
            put(": the file was truncated or changed while in use (bus error at byte ");
            put_u64((uint64_t)(a - b));
            put(" of its mapping)");
            found = 1;
        }
    }
    if (!found) put("bus error outside any mapped input file");
    int removed = 0;
    for (int i = 0; i < N_OUTS; i++)
        if (atomic_load_explicit(&g_outs[i].used, memory_order_acquire) && unlink(g_outs[i].path) == 0) removed++;
    if (removed) {
        put("; removed ");
        put_u64((uint64_t)removed);
        put(" unfinished output file(s)");
    }
    put("\n");
    _exit(g_exit);
}

void g5_mapguard_install(const char *prog, int exit_status) {
    if (prog) {
        size_t n = strlen(prog);
        if (n >= sizeof g_prog) n = sizeof g_prog - 1;
        memcpy(g_prog, prog, n);
        g_prog[n] = 0;
    }
    g_exit = exit_status;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
}
