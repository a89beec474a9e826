/* The oracle GGUF as a blob set, for the GPU tests that run from blobs: converted at TP tp into
 * <tmp>/tp<tp> (dir: cap bytes). Returns 1 on success; a failed conversion is a test failure
 * that names the TP. Needs convert/ and tests/test_util.h (T_ORACLE_GGUF, T_CHECK). */
#ifndef G5_TESTS_GPU_ORACLE_BLOBS_H
#define G5_TESTS_GPU_ORACLE_BLOBS_H

#include <stdint.h>
#include <stdio.h>

#include "convert/convert.h"
#include "tests/test_util.h"

static inline int t_oracle_blobs(const char *tmp, uint32_t tp, char *dir, size_t cap) {
    snprintf(dir, cap, "%s/tp%u", tmp, tp);
    convert_options co;
    convert_options_init(&co);
    co.tp = tp;
    g5_error e = {0};
    const g5_status st = convert_run(T_ORACLE_GGUF, dir, &co, NULL, &e);
    T_CHECK(st == G5_OK, "convert TP=%u: %s", tp, e.msg);
    return st == G5_OK;
}

#endif
