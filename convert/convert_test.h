/* Fault injection into convert_run, for tests only (tests/test_convert.c): a program never sets
 * these, and they are not part of convert.h's public options. */
#ifndef G5_CONVERT_TEST_H
#define G5_CONVERT_TEST_H

#include <stdint.h>

#include "convert/convert.h"

typedef struct convert_test_hooks {
    /* Simulate a crash once this many bytes have been written in total (all ranks): stop at
     * once, leave the temporary files as a killed process would, write no set record, return
     * G5_ERR_INTERNAL ("stopped by test hook ..."). 0: off. */
    uint64_t stop_after_bytes;
    /* The write that would take any rank file past this many bytes fails with ENOSPC (an
     * injected full disk): handled like a real write error (temporary files removed, G5_ERR_IO).
     * 0: off. (format/blob_test.h) */
    uint64_t fail_write_after_bytes;
    /* Write a set as converter 1.0 did (attn_k_b/attn_v_b not carried, version 1.0.0 in its
     * headers and record): the older sets verify and the runtime must still take. */
    int legacy_1_0;
} convert_test_hooks;

/* convert_run with HOOKS (NULL: none, exactly convert_run). */
g5_status convert_run_hooked(const char *model, const char *outdir, const convert_options *opt,
                             const convert_test_hooks *hooks, convert_result **out, g5_error *err);

#endif
