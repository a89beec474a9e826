/* Command-line options, one parser for the three programs (glm5-shard, glm5-run, glm5-serve).
 *
 * A program describes its options in a table of g5_arg and hands argv to g5_args_parse, which
 * writes each value where its entry points and refuses, with a message naming the option:
 *  - an unknown option ("unknown option '--foo'"), a missing value, a value given to a flag;
 *  - numbers that are not plain decimal: digits only (a '-' first where the range allows
 *    negatives); no sign '+', no spaces, no 0x or octal: "010" is ten; outside [lo, hi];
 *  - a choice not in its list; a repeatable option given more than max times.
 * Values come as "--name VALUE" or "--name=VALUE" (short aliases: "-n VALUE"); anything not
 * starting with '-' (and "-" itself) is positional, as is everything after "--". "-h"/"--help"
 * is reported as G5_ARGS_HELP. Nothing is printed: the caller prints msg and its usage. The
 * number parsers below are the same ones, for values that arrive some other way. */
#ifndef G5_ARGS_H
#define G5_ARGS_H

#include <stddef.h>
#include <stdint.h>

typedef enum g5_arg_kind {
    G5_ARG_FLAG = 0,             /* no value: *(int *)dst = 1 */
    G5_ARG_OFF,                  /* no value: *(int *)dst = 0 ("--no-prefault") */
    G5_ARG_STR,                  /* *(const char **)dst = the value */
    G5_ARG_INT,                  /* *(int64_t *)dst, decimal in [lo, hi] */
    G5_ARG_U64,                  /* *(uint64_t *)dst, decimal, any 64-bit value (seeds) */
    G5_ARG_SIZE,                 /* *(uint64_t *)dst, decimal with an optional K/M/G/T suffix
                                    (powers of 1024, "KiB"/"KB"/"k" alike), in [lo, hi] (hi 0:
                                    no bound) */
    G5_ARG_FLOAT,                /* *(float *)dst, finite, in [flo, fhi] */
    G5_ARG_CHOICE,               /* *(int *)dst = values[i] for the value choices[i] */
    G5_ARG_LIST,                 /* repeatable string: ((const char **)dst)[(*count)++], at most
                                    max times */
} g5_arg_kind;

typedef struct g5_arg {
    const char *name;            /* "--tp" */
    const char *alias;           /* "-t", or NULL */
    g5_arg_kind kind;
    void *dst;
    int64_t lo, hi;              /* INT, SIZE */
    double flo, fhi;             /* FLOAT */
    const char *const *choices;  /* CHOICE: NULL-terminated */
    const int *values;           /* CHOICE: one per choice */
    size_t *count, max;          /* LIST */
    int *seen;                   /* optional: set to 1 when the option is given */
} g5_arg;

typedef enum g5_args_result {
    G5_ARGS_OK = 0,
    G5_ARGS_HELP = 1,            /* -h or --help was given */
    G5_ARGS_ERROR = 2,           /* msg says why */
} g5_args_result;

/* Parses argv[first .. argc - 1] against tab[0 .. n - 1]. Positional arguments go to
 * pos[0 .. max_pos - 1] (*n_pos of them; more than max_pos is an error; pos may be NULL when
 * max_pos is 0). Stops at the first error. */
g5_args_result g5_args_parse(const g5_arg *tab, size_t n, int argc, char **argv, int first, const char **pos,
                             size_t max_pos, size_t *n_pos, char *msg, size_t msg_cap);

/* The number syntax alone. 0 on success, -1 on a malformed or out-of-range value. */
int g5_args_int(const char *s, int64_t lo, int64_t hi, int64_t *out);
int g5_args_u64(const char *s, uint64_t *out);
int g5_args_size(const char *s, uint64_t *out);
int g5_args_float(const char *s, double lo, double hi, float *out);

#endif
