/* Test hooks of the blob writer, for tests and convert/'s test API only (never set by a program):
 * not part of blob.h's public parameters. */
#ifndef G5_BLOB_TEST_H
#define G5_BLOB_TEST_H

#include <stdint.h>

#include "blob.h"

/* From now on the write that would take W's file past FILE_BYTES fails with ENOSPC (an injected
 * full disk), handled like a real write error; 0 turns the hook off. */
void blob_writer_test_fail_after(blob_writer *w, uint64_t file_bytes);

#endif
