/* synth's type maps: --type-map ROLE=TYPE,... and the presets that mimic published GLM-5
 * quantizations, so that every ggml type can be written into every tensor role. */
#include <string.h>
#include <strings.h>

#include "convert/synth.h"
#include "format/quant.h"

/* Role aliases for groups of matrices. */
static const struct { const char *name; glm5_role roles[6]; } k_aliases[] = {
    {"exps", {GLM5_ROLE_EXP_GATE, GLM5_ROLE_EXP_UP, GLM5_ROLE_EXP_DOWN}},
    {"exps_gate_up", {GLM5_ROLE_EXP_GATE, GLM5_ROLE_EXP_UP}},
    {"shexp", {GLM5_ROLE_SHEXP_GATE, GLM5_ROLE_SHEXP_UP, GLM5_ROLE_SHEXP_DOWN}},
    {"ffn", {GLM5_ROLE_FFN_GATE, GLM5_ROLE_FFN_UP, GLM5_ROLE_FFN_DOWN}},
    {"ffn_gate_up", {GLM5_ROLE_FFN_GATE, GLM5_ROLE_FFN_UP}},
    {"attn", {GLM5_ROLE_ATTN_Q_A, GLM5_ROLE_ATTN_Q_B, GLM5_ROLE_ATTN_KV_A, GLM5_ROLE_ATTN_K_B,
              GLM5_ROLE_ATTN_V_B, GLM5_ROLE_ATTN_OUT}},
};
#define N_ALIASES (sizeof k_aliases / sizeof k_aliases[0])

/* Roles whose type the runtime fixes (norms, router, biases: float32 vectors). */
static int role_fixed(glm5_role r) {
    switch (r) {
    case GLM5_ROLE_OUTPUT_NORM: case GLM5_ROLE_ATTN_NORM: case GLM5_ROLE_ATTN_Q_A_NORM:
    case GLM5_ROLE_ATTN_KV_A_NORM: case GLM5_ROLE_IDX_K_NORM: case GLM5_ROLE_IDX_K_NORM_BIAS:
    case GLM5_ROLE_FFN_NORM: case GLM5_ROLE_ROUTER: case GLM5_ROLE_ROUTER_BIAS:
    case GLM5_ROLE_NEXTN_ENORM: case GLM5_ROLE_NEXTN_HNORM: case GLM5_ROLE_NEXTN_SHARED_HEAD_NORM:
    case GLM5_ROLE_UNKNOWN: case GLM5_ROLE_COUNT:
        return 1;
    default: return 0;
    }
}

static g5_status set_role(synth_opts *o, glm5_role r, int type, const char *what, g5_error *err) {
    if (role_fixed(r))
        return g5_fail(err, G5_ERR_INVALID_ARG, "synth: --type-map: %s is always F32", what);
    o->role_type[r] = (uint8_t)(type + 1);
    return G5_OK;
}

g5_status synth_type_map_parse(const char *spec, synth_opts *o, g5_error *err) {
    if (!spec || !*spec) return g5_fail(err, G5_ERR_INVALID_ARG, "synth: --type-map is empty");
    const char *p = spec;
    while (*p) {
        const char *end = strchr(p, ',');
        const size_t n = end ? (size_t)(end - p) : strlen(p);
        char item[96];
        if (n == 0 || n >= sizeof item)
            return g5_fail(err, G5_ERR_INVALID_ARG, "synth: --type-map: bad item '%.*s' (ROLE=TYPE)",
                           (int)(n < 64 ? n : 64), p);
        memcpy(item, p, n);
        item[n] = 0;
        char *eq = strchr(item, '=');
        if (!eq) return g5_fail(err, G5_ERR_INVALID_ARG, "synth: --type-map: '%s' is not ROLE=TYPE", item);
        *eq = 0;
        const int type = quant_type_from_name(eq + 1);
        const quant_type_info *t = type >= 0 ? quant_type_get((uint32_t)type) : NULL;
        if (!t || !t->supported)
            return g5_fail(err, G5_ERR_INVALID_ARG, "synth: --type-map: '%s' is not a type we can write",
                           eq + 1);
        int found = 0;
        for (size_t a = 0; a < N_ALIASES && !found; a++) {
            if (strcmp(item, k_aliases[a].name)) continue;
            found = 1;
            for (int k = 0; k < 6 && k_aliases[a].roles[k]; k++) {
                g5_status st = set_role(o, k_aliases[a].roles[k], type, item, err);
                if (st) return st;
            }
        }
        for (int r = 1; r < GLM5_ROLE_COUNT && !found; r++) {
            if (strcmp(item, glm5_role_name((glm5_role)r))) continue;
            found = 1;
            g5_status st = set_role(o, (glm5_role)r, type, item, err);
            if (st) return st;
        }
        if (!found)
            return g5_fail(err, G5_ERR_INVALID_ARG,
                           "synth: --type-map: unknown role '%s' (a tensor role such as ffn_up_exps, "
                           "or exps, exps_gate_up, shexp, ffn, ffn_gate_up, attn)", item);
        p += n;
        if (*p == ',') p++;
    }
    return G5_OK;
}

/* Presets: the shape of each published mix (routed experts at the low bit width, attention,
 * shared experts and embeddings kept at 4-8 bits), on roles whose widths take the blocks:
 * attn_k_b rows are 192 wide, so only 32-element types fit there (llama.cpp's fallbacks for
 * k-quants: Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL). ud-fp4 has no published
 * GLM-5 counterpart: it carries the FP4 and ternary types (gpt-oss style MXFP4 experts). */
static const struct { const char *name, *map; } k_presets[] = {
    {"ud-q4_k_xl", ""},
    {"ud-q3_k_xl", "exps_gate_up=Q3_K,ffn_down_exps=Q4_K,ffn=Q4_K,shexp=Q5_K,attn_q_b=Q4_K,"
                   "attn_output=Q4_K,attn_k_b=Q5_1,token_embd=Q4_K,nextn.eh_proj=Q3_K"},
    {"ud-q2_k_xl", "exps_gate_up=Q2_K,ffn_down_exps=Q3_K,ffn_gate_up=Q3_K,ffn_down=Q4_K,shexp=Q4_K,"
                   "attn_q_b=Q4_K,attn_output=Q4_K,attn_k_b=Q4_0,token_embd=Q3_K,nextn.eh_proj=Q2_K"},
    {"ud-iq2_xxs", "exps_gate_up=IQ2_XXS,ffn_down_exps=IQ3_XXS,ffn_gate_up=IQ2_XS,ffn_down=IQ3_S,"
                   "shexp=IQ4_XS,attn_q_b=IQ4_XS,attn_output=IQ4_XS,attn_k_b=IQ4_NL,"
                   "token_embd=IQ4_XS,nextn.eh_proj=IQ2_XXS"},
    {"ud-iq1_m", "exps_gate_up=IQ1_M,ffn_down_exps=IQ2_S,ffn_gate_up=IQ2_S,ffn_down=IQ3_XXS,"
                 "shexp=Q4_K,attn_q_b=IQ4_XS,attn_output=IQ4_XS,attn_k_b=Q4_1,token_embd=Q4_K,"
                 "nextn.eh_proj=IQ1_M"},
    {"ud-iq1_s", "exps_gate_up=IQ1_S,ffn_down_exps=IQ2_XXS,ffn_gate_up=IQ2_XXS,ffn_down=IQ3_XXS,"
                 "shexp=Q4_K,attn_q_b=IQ4_XS,attn_output=IQ4_XS,token_embd=Q4_K,nextn.eh_proj=IQ1_S"},
    {"ud-fp4", "exps_gate_up=MXFP4,ffn_down_exps=NVFP4,ffn_gate_up=TQ1_0,ffn_down=TQ2_0,"
               "shexp=MXFP4,attn_k_b=MXFP4,attn_output=NVFP4,token_embd=MXFP4,output=NVFP4,"
               "nextn.eh_proj=TQ2_0"},
};
#define N_PRESETS (sizeof k_presets / sizeof k_presets[0])

g5_status synth_type_preset(const char *name, synth_opts *o, g5_error *err) {
    for (size_t i = 0; name && i < N_PRESETS; i++) {
        if (strcasecmp(name, k_presets[i].name)) continue;
        memset(o->role_type, 0, sizeof o->role_type);
        return k_presets[i].map[0] ? synth_type_map_parse(k_presets[i].map, o, err) : G5_OK;
    }
    return g5_fail(err, G5_ERR_INVALID_ARG, "synth: unknown --types '%s' (%s)", name ? name : "",
                   synth_type_preset_names());
}

const char *synth_type_preset_names(void) {
    return "ud-q4_k_xl, ud-q3_k_xl, ud-q2_k_xl, ud-iq2_xxs, ud-iq1_m, ud-iq1_s, ud-fp4";
}

uint32_t synth_opts_role_type(const synth_opts *o, glm5_role r) {
    if (o && r > 0 && r < GLM5_ROLE_COUNT && o->role_type[r]) return (uint32_t)o->role_type[r] - 1;
    return synth_role_type(r);
}
