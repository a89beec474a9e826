/* Command-line options (args.h). */
#include "format/args.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Decimal digits only, into a magnitude; -1 on anything else or past UINT64_MAX. */
static int digits(const char *s, uint64_t *out) {
    if (!*s) return -1;
    uint64_t v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9') return -1;
        const uint64_t d = (uint64_t)(*s - '0');
        if (v > (UINT64_MAX - d) / 10) return -1;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

int g5_args_int(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (!s) return -1;
    const int neg = *s == '-';
    uint64_t mag;
    if (digits(s + neg, &mag)) return -1;
    int64_t v;
    if (neg) {
        if (mag > (uint64_t)INT64_MAX + 1) return -1;
        v = mag == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)mag;
    } else {
        if (mag > (uint64_t)INT64_MAX) return -1;
        v = (int64_t)mag;
    }
    if (v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int g5_args_u64(const char *s, uint64_t *out) { return s ? digits(s, out) : -1; }

int g5_args_size(const char *s, uint64_t *out) {
    if (!s) return -1;
    size_t nd = 0;
    while (s[nd] >= '0' && s[nd] <= '9') nd++;
    if (nd == 0 || nd > 40) return -1;
    char num[41];
    memcpy(num, s, nd);
    num[nd] = 0;
    uint64_t v, mul = 1;
    if (digits(num, &v)) return -1;
    const char *e = s + nd;
    if (*e) {
        switch (*e) {
        case 'k': case 'K': mul = 1ull << 10; break;
        case 'm': case 'M': mul = 1ull << 20; break;
        case 'g': case 'G': mul = 1ull << 30; break;
        case 't': case 'T': mul = 1ull << 40; break;
        default: return -1;
        }
        e++;
        if (*e == 'i' || *e == 'I') e++;
        if (*e == 'b' || *e == 'B') e++;
        if (*e) return -1;
    }
    if (v > UINT64_MAX / mul) return -1;
    *out = v * mul;
    return 0;
}

int g5_args_float(const char *s, double lo, double hi, float *out) {
    if (!s || !*s || *s == ' ' || *s == '\t' || *s == '+') return -1;
    for (const char *p = s; *p; p++) /* decimal forms only: no hex floats, inf or nan */
        if (!((*p >= '0' && *p <= '9') || *p == '.' || *p == '-' || *p == 'e' || *p == 'E' || *p == '+')) return -1;
    char *end;
    const float v = strtof(s, &end);
    if (end == s || *end || !isfinite(v) || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static g5_args_result fail(char *msg, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static g5_args_result fail(char *msg, size_t cap, const char *fmt, ...) {
    if (cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, cap, fmt, ap);
        va_end(ap);
    }
    return G5_ARGS_ERROR;
}

/* What a bad value should have been, for the message. */
static void expected(const g5_arg *a, char *buf, size_t cap) {
    switch (a->kind) {
    case G5_ARG_INT:
        snprintf(buf, cap, "a decimal integer %lld..%lld", (long long)a->lo, (long long)a->hi);
        break;
    case G5_ARG_U64: snprintf(buf, cap, "a decimal integer 0..%llu", (unsigned long long)UINT64_MAX); break;
    case G5_ARG_SIZE:
        if (a->hi > 0) snprintf(buf, cap, "a size %lld..%lld, K/M/G/T suffixes allowed", (long long)a->lo, (long long)a->hi);
        else snprintf(buf, cap, "a size of at least %lld, K/M/G/T suffixes allowed", (long long)a->lo);
        break;
    case G5_ARG_FLOAT: snprintf(buf, cap, "a number %g..%g", a->flo, a->fhi); break;
    case G5_ARG_CHOICE: {
        size_t o = 0;
        for (size_t i = 0; a->choices[i] && o < cap; i++)
            o += (size_t)snprintf(buf + o, cap - o, "%s%s", i ? (a->choices[i + 1] ? ", " : " or ") : "", a->choices[i]);
        break;
    }
    default: snprintf(buf, cap, "a value"); break;
    }
}

static g5_args_result set_value(const g5_arg *a, const char *v, char *msg, size_t cap) {
    int bad = 0;
    switch (a->kind) {
    case G5_ARG_STR: *(const char **)a->dst = v; break;
    case G5_ARG_INT: {
        int64_t x;
        if (!(bad = g5_args_int(v, a->lo, a->hi, &x))) *(int64_t *)a->dst = x;
        break;
    }
    case G5_ARG_U64: {
        uint64_t x;
        if (!(bad = g5_args_u64(v, &x))) *(uint64_t *)a->dst = x;
        break;
    }
    case G5_ARG_SIZE: {
        uint64_t x;
        bad = g5_args_size(v, &x) || x < (uint64_t)a->lo || (a->hi > 0 && x > (uint64_t)a->hi);
        if (!bad) *(uint64_t *)a->dst = x;
        break;
    }
    case G5_ARG_FLOAT: {
        float x;
        if (!(bad = g5_args_float(v, a->flo, a->fhi, &x))) *(float *)a->dst = x;
        break;
    }
    case G5_ARG_CHOICE: {
        bad = 1;
        for (size_t i = 0; a->choices[i]; i++)
            if (!strcmp(a->choices[i], v)) {
                *(int *)a->dst = a->values[i];
                bad = 0;
                break;
            }
        break;
    }
    case G5_ARG_LIST:
        if (*a->count >= a->max) return fail(msg, cap, "%s: at most %zu times", a->name, a->max);
        ((const char **)a->dst)[(*a->count)++] = v;
        break;
    case G5_ARG_FLAG:
    case G5_ARG_OFF: break;
    }
    if (bad) {
        char want[256];
        expected(a, want, sizeof want);
        return fail(msg, cap, "bad value for %s: '%s' (%s)", a->name, v, want);
    }
    return G5_ARGS_OK;
}

g5_args_result g5_args_parse(const g5_arg *tab, size_t n, int argc, char **argv, int first, const char **pos,
                             size_t max_pos, size_t *n_pos, char *msg, size_t msg_cap) {
    size_t np = 0;
    int only_pos = 0;
    if (msg_cap) msg[0] = 0;
    if (n_pos) *n_pos = 0;
    for (int i = first; i < argc; i++) {
        const char *o = argv[i];
        if (only_pos || o[0] != '-' || !o[1]) {
            if (np == max_pos) return fail(msg, msg_cap, "unexpected argument '%s'", o);
            pos[np++] = o;
            if (n_pos) *n_pos = np;
            continue;
        }
        if (!strcmp(o, "--")) {
            only_pos = 1;
            continue;
        }
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) return G5_ARGS_HELP;
        /* --name=value */
        const char *eq = o[1] == '-' ? strchr(o, '=') : NULL;
        const size_t len = eq ? (size_t)(eq - o) : strlen(o);
        const g5_arg *a = NULL;
        for (size_t k = 0; k < n && !a; k++)
            if ((strlen(tab[k].name) == len && !strncmp(tab[k].name, o, len)) ||
                (!eq && tab[k].alias && !strcmp(tab[k].alias, o)))
                a = &tab[k];
        if (!a) return fail(msg, msg_cap, "unknown option '%.*s'", (int)len, o);
        if (a->seen) *a->seen = 1;
        if (a->kind == G5_ARG_FLAG || a->kind == G5_ARG_OFF) {
            if (eq) return fail(msg, msg_cap, "%s takes no value", a->name);
            *(int *)a->dst = a->kind == G5_ARG_FLAG;
            continue;
        }
        const char *v = eq ? eq + 1 : NULL;
        if (!v) {
            if (i + 1 >= argc) return fail(msg, msg_cap, "%s needs a value", o);
            v = argv[++i];
        }
        g5_args_result r = set_value(a, v, msg, msg_cap);
        if (r) return r;
    }
    return G5_ARGS_OK;
}
