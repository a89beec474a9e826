/* The release of glm5-shard, printed by every program's --version. */
#ifndef G5_VERSION_H
#define G5_VERSION_H

#include <stdio.h>

#define G5_VERSION "0.3.0"

/* "PROG (glm5-shard) 0.3.0" and the compiler, one line each. */
static inline void g5_print_version(FILE *f, const char *prog) {
    fprintf(f, "%s (glm5-shard) %s\ncompiler: %s\n", prog, G5_VERSION, __VERSION__);
}

#endif
