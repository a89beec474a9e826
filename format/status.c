#include "status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const g5_status_names[G5_STATUS_COUNT] = {
    [G5_OK] = "ok",
    [G5_ERR_INVALID_ARG] = "invalid argument",
    [G5_ERR_NOMEM] = "out of memory",
    [G5_ERR_IO] = "I/O error",
    [G5_ERR_TRUNCATED] = "truncated",
    [G5_ERR_BAD_MAGIC] = "bad magic",
    [G5_ERR_VERSION] = "unsupported version",
    [G5_ERR_COUNT] = "absurd count",
    [G5_ERR_OVERFLOW] = "size overflow",
    [G5_ERR_BOUNDS] = "out of bounds",
    [G5_ERR_ALIGN] = "misaligned",
    [G5_ERR_OVERLAP] = "overlapping tensors",
    [G5_ERR_DUPLICATE] = "duplicate name",
    [G5_ERR_NDIMS] = "bad dimensions",
    [G5_ERR_VALUE_TYPE] = "bad metadata value type",
    [G5_ERR_TENSOR_TYPE] = "unknown tensor type",
    [G5_ERR_UNSUPPORTED] = "not supported",
    [G5_ERR_SIZE] = "size mismatch",
    [G5_ERR_SPLIT] = "inconsistent split set",
    [G5_ERR_MISSING_SPLIT] = "missing split file",
    [G5_ERR_NOT_FOUND] = "not found",
    [G5_ERR_WRONG_TYPE] = "wrong value type",
    [G5_ERR_CHECKSUM] = "checksum mismatch",
    [G5_ERR_FORMAT] = "invalid format",
    [G5_ERR_SHARDING] = "cannot shard",
    [G5_ERR_MODEL] = "inconsistent model",
    [G5_ERR_MISMATCH] = "mismatched blob set",
    [G5_ERR_COMPRESS] = "compression error",
    [G5_ERR_EXISTS] = "output exists",
    [G5_ERR_INTERNAL] = "internal error",
};

const char *g5_strerror(g5_status s) {
    if ((unsigned)s >= G5_STATUS_COUNT || !g5_status_names[s]) return "unknown status";
    return g5_status_names[s];
}

static g5_status g5_vfail(g5_error *err, g5_status s, int has_off, uint64_t off, const char *fmt,
                          va_list ap) {
    if (!err) return s;
    err->status = s;
    err->has_offset = has_off;
    err->offset = off;
    int n = vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    if (n < 0) err->msg[0] = 0;
    if (has_off) {
        size_t len = strlen(err->msg);
        snprintf(err->msg + len, sizeof err->msg - len, " (at byte %llu)", (unsigned long long)off);
    }
    return s;
}

g5_status g5_fail(g5_error *err, g5_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    g5_vfail(err, s, 0, 0, fmt, ap);
    va_end(ap);
    return s;
}

g5_status g5_fail_at(g5_error *err, g5_status s, uint64_t offset, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    g5_vfail(err, s, 1, offset, fmt, ap);
    va_end(ap);
    return s;
}

void g5_error_prefix(g5_error *err, const char *fmt, ...) {
    if (!err) return;
    char pre[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    char old[sizeof err->msg];
    memcpy(old, err->msg, sizeof old);
    /* The combined message may be cut at the buffer's end; the prefix (file name) is kept. */
    size_t n = strnlen(pre, sizeof err->msg - 3);
    memcpy(err->msg, pre, n);
    memcpy(err->msg + n, ": ", 2);
    size_t room = sizeof err->msg - n - 3;
    size_t m = strnlen(old, room);
    memcpy(err->msg + n + 2, old, m);
    err->msg[n + 2 + m] = 0;
}

void g5_error_clear(g5_error *err) {
    if (!err) return;
    memset(err, 0, sizeof *err);
}
