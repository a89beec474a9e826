/* bench_moe_mm over several cuk_moe_mm forms in one binary (bench/pending/s45-next.sh moeab): each
 * form's cuda/moe_mm.cu is compiled with its entry points renamed (cuk_moe_mm_NAME), and the last
 * argument names the form to time. One binary, so a device call needs no build.
 * Usage: moe_ab R,R,... --fused-only FORM (FORM: tree, rot, wa, wa32). */
#include <stdio.h>
#include <string.h>

#define main bench_moe_mm_main
#define cuk_moe_mm moe_ab_mm
#include "tests/gpu/bench_moe_mm.c"
#undef main
#undef cuk_moe_mm

typedef g5_status (*mm_entry)(const cuk_moe_mm_args *, cuk_stream, g5_error *);
g5_status cuk_moe_mm(const cuk_moe_mm_args *a, cuk_stream stream, g5_error *err);
g5_status cuk_moe_mm_rot(const cuk_moe_mm_args *a, cuk_stream stream, g5_error *err);
g5_status cuk_moe_mm_wa(const cuk_moe_mm_args *a, cuk_stream stream, g5_error *err);
g5_status cuk_moe_mm_wa32(const cuk_moe_mm_args *a, cuk_stream stream, g5_error *err);

static mm_entry chosen;

g5_status moe_ab_mm(const cuk_moe_mm_args *a, cuk_stream stream, g5_error *err) { return chosen(a, stream, err); }

int main(int argc, char **argv) {
    static const struct {
        const char *name;
        mm_entry fn;
    } forms[] = {{"tree", cuk_moe_mm}, {"rot", cuk_moe_mm_rot}, {"wa", cuk_moe_mm_wa}, {"wa32", cuk_moe_mm_wa32}};
    if (argc < 4) {
        fprintf(stderr, "usage: moe_ab R,R,... --fused-only FORM\n");
        return 2;
    }
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++)
        if (!strcmp(argv[argc - 1], forms[i].name)) chosen = forms[i].fn;
    if (!chosen) {
        fprintf(stderr, "moe_ab: no form '%s'\n", argv[argc - 1]);
        return 2;
    }
    printf("form %s\n", argv[argc - 1]);
    return bench_moe_mm_main(argc - 1, argv);
}
