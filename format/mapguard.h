/* Signal-safe ends for files that change under a mapping.
 *
 * A mapped file that is truncated (or replaced in place) while it is read raises SIGBUS on the
 * next access to a page past its new end: a crash (exit 135) instead of an error. The readers
 * that map files (gguf_open, blob_open) register each mapping here, and the writers register each
 * temporary output (NAME.tmp) while it is being written. A program's main() installs the
 * handler once (g5_mapguard_install): on SIGBUS inside a registered mapping it prints
 *     PROG: FILE: the file was truncated or changed while in use (bus error at byte N of its mapping)
 * removes every registered temporary output (nothing half-written stays behind) and ends the
 * process with the given exit status; a SIGBUS elsewhere is reported as such, with the same exit.
 * The registry is a fixed table (no allocation, safe to read from the handler); registration is
 * thread-safe. Without the handler installed, registration costs a table slot and nothing else. */
#ifndef G5_MAPGUARD_H
#define G5_MAPGUARD_H

#include <stddef.h>

/* Registers [base, base + len) as a mapping of path (shown in the message). Ignored if full. */
void g5_mapguard_add(const void *base, size_t len, const char *path);
void g5_mapguard_remove(const void *base); /* before munmap; NULL and unknown bases ignored */
/* A temporary output file that the handler removes. Ignored if the table is full. */
void g5_mapguard_add_output(const char *tmp_path);
void g5_mapguard_remove_output(const char *tmp_path);

/* For main() only: installs the SIGBUS handler (prog prefixes the message). */
void g5_mapguard_install(const char *prog, int exit_status);

#endif
