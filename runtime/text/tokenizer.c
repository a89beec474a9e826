/* Byte-level BPE tokenizer with GLM-4's pre-tokenizer. See tokenizer.h for the contract. */
#include "runtime/text/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <xxhash.h>

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* GLM-4's pre-tokenizer regex.
 *
 * tokenizer.json (Split, behavior Isolated) and llama.cpp (LLAMA_VOCAB_PRE_TYPE_CHATGLM4, which
 * "glm4" and "chatglm-bpe" select) both use
 *   (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|
 *   \p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * The oracle's engine (Oniguruma) reads \s as the Unicode White_Space property; PCRE2's UCP \s
 * is "Z category plus \t\n\v\f\r", which lacks U+0085. \s is therefore spelled out as the
 * White_Space set so that e.g. "  \x85 d" splits as the oracle does.
 * \p{L} and \p{N} come from PCRE2's Unicode tables (Unicode 14 in PCRE2 10.42): letters added
 * in later Unicode versions (e.g. Kawi, Egyptian Hieroglyphs Extended-A, CJK Extension H) are
 * unassigned there and split differently from a newer oracle. */
#define WS "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}" \
           "\\x{202F}\\x{205F}\\x{3000}"
static const char k_glm4_pattern[] =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
    "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+"
    "|\\p{N}{1,3}"
    "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*"
    "|[" WS "]*[\\r\\n]+"
    "|[" WS "]+(?![^" WS "])"
    "|[" WS "]+";
#undef WS

/* ------------------------------------------------------------------------------------------ */
/* Hash tables. Open addressing, linear probing, power-of-two capacity at most ~60% full. */

typedef struct str_map {
    uint32_t mask;
    int32_t *slot;   /* token id, -1 = empty */
    uint32_t *hash;  /* low 32 bits of the key's hash, to skip most memcmp calls */
} str_map;

typedef struct merge_slot {
    uint64_t key;    /* (left << 32) | right; MERGE_EMPTY when free */
    uint32_t rank;
    int32_t result;  /* id of the merged token */
} merge_slot;
#define MERGE_EMPTY UINT64_MAX

struct tok_ctx {
    uint32_t n_vocab;
    char *text;            /* GGUF texts of all tokens, concatenated */
    uint64_t *text_off;    /* [n_vocab + 1] */
    char *piece;           /* decoded bytes of all tokens, concatenated */
    uint64_t *piece_off;   /* [n_vocab + 1] */
    uint8_t *type;         /* [n_vocab] tok_type */

    str_map normal;        /* text -> id over all non-special tokens */
    str_map special;       /* text -> id over CONTROL and USER_DEFINED tokens */
    uint32_t merge_mask;
    merge_slot *merges;

    int32_t byte_tok[256]; /* token of each byte's byte-level code point, -1 if none */

    /* Special-token scan: distinct lengths, longest first, and which bytes can start one. */
    uint32_t n_sp_lens;
    uint32_t *sp_lens;
    uint8_t sp_first[256];

    int32_t sp[TOK_SP_COUNT];
    int32_t eog[6];
    uint32_t n_eog;

    pcre2_code *re;
};

static uint64_t mix64(uint64_t x) {
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27; x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static uint32_t pow2_cap(uint64_t n) {
    uint64_t c = 16;
    while (c < n + n / 2 + 1) c <<= 1;
    return (uint32_t)c;
}

static int str_map_init(str_map *m, uint64_t n) {
    if (n > (1u << 29)) return -1;
    uint32_t cap = pow2_cap(n);
    m->mask = cap - 1;
    m->slot = malloc((size_t)cap * sizeof *m->slot);
    m->hash = malloc((size_t)cap * sizeof *m->hash);
    if (!m->slot || !m->hash) return -1;
    memset(m->slot, 0xff, (size_t)cap * sizeof *m->slot);
    return 0;
}

static void str_map_free(str_map *m) {
    free(m->slot);
    free(m->hash);
}

static int32_t str_map_find(const tok_ctx *c, const str_map *m, const char *s, size_t len) {
    if (!m->slot) return -1;
    uint64_t h = XXH3_64bits(s, len);
    uint32_t h32 = (uint32_t)h;
    for (uint32_t i = (uint32_t)(h >> 32) & m->mask;; i = (i + 1) & m->mask) {
        int32_t id = m->slot[i];
        if (id < 0) return -1;
        if (m->hash[i] == h32) {
            uint64_t off = c->text_off[id], l = c->text_off[id + 1] - off;
            if (l == len && memcmp(c->text + off, s, len) == 0) return id;
        }
    }
}

/* Inserts id under its own text unless that text is already present (first id wins). */
static void str_map_add(tok_ctx *c, str_map *m, int32_t id) {
    const char *s = c->text + c->text_off[id];
    size_t len = c->text_off[id + 1] - c->text_off[id];
    uint64_t h = XXH3_64bits(s, len);
    uint32_t h32 = (uint32_t)h;
    for (uint32_t i = (uint32_t)(h >> 32) & m->mask;; i = (i + 1) & m->mask) {
        int32_t o = m->slot[i];
        if (o < 0) {
            m->slot[i] = id;
            m->hash[i] = h32;
            return;
        }
        if (m->hash[i] == h32 && c->text_off[o + 1] - c->text_off[o] == len &&
            memcmp(c->text + c->text_off[o], s, len) == 0)
            return;
    }
}

static const merge_slot *merge_find(const tok_ctx *c, int32_t l, int32_t r) {
    uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
    for (uint32_t i = (uint32_t)mix64(key) & c->merge_mask;; i = (i + 1) & c->merge_mask) {
        const merge_slot *s = &c->merges[i];
        if (s->key == key) return s;
        if (s->key == MERGE_EMPTY) return NULL;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* GPT-2 bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes are
 * numbered from U+0100 upwards in byte order. */

static uint32_t byte_to_cp(uint8_t b) {
    if ((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae)) return b;
    uint32_t n = 0;
    for (uint32_t x = 0; x < b; x++)
        if (!((x >= 0x21 && x <= 0x7e) || (x >= 0xa1 && x <= 0xac) || (x >= 0xae))) n++;
    return 256 + n;
}

static size_t put_utf8(uint32_t cp, char *out) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Decodes one UTF-8 sequence at s (n > 0 bytes left). Returns its length, or 0 if invalid. */
static size_t get_utf8(const uint8_t *s, size_t n, uint32_t *cp) {
    uint8_t b = s[0];
    if (b < 0x80) { *cp = b; return 1; }
    size_t len;
    uint32_t v, min;
    if (b >= 0xc2 && b <= 0xdf) { len = 2; v = b & 0x1f; min = 0x80; }
    else if (b >= 0xe0 && b <= 0xef) { len = 3; v = b & 0x0f; min = 0x800; }
    else if (b >= 0xf0 && b <= 0xf4) { len = 4; v = b & 0x07; min = 0x10000; }
    else return 0;
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3f);
    }
    if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return 0;
    *cp = v;
    return len;
}

/* ------------------------------------------------------------------------------------------ */
/* Construction */

static int is_special_type(uint8_t t) {
    return t == TOK_TYPE_CONTROL || t == TOK_TYPE_USER_DEFINED;
}

static int cmp_u32_desc(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

static g5_status build(tok_ctx *c, const tok_vocab_desc *d, g5_error *err) {
    uint32_t n = d->n_tokens;
    if (n == 0 || n > (1u << 30))
        return g5_fail(err, G5_ERR_COUNT, "tokenizer: vocabulary of %u tokens", n);
    c->n_vocab = n;

    /* Texts. */
    uint64_t total = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (!d->tokens[i] && d->token_lens[i])
            return g5_fail(err, G5_ERR_INVALID_ARG, "tokenizer: token %u has no text", i);
        if (g5_add_u64(total, d->token_lens[i], &total) || total > ((uint64_t)1 << 40))
            return g5_fail(err, G5_ERR_OVERFLOW, "tokenizer: token texts too large");
    }
    c->text = malloc(total ? total : 1);
    c->piece = malloc(total ? total : 1);
    c->text_off = malloc(((size_t)n + 1) * sizeof *c->text_off);
    c->piece_off = malloc(((size_t)n + 1) * sizeof *c->piece_off);
    c->type = malloc(n);
    if (!c->text || !c->piece || !c->text_off || !c->piece_off || !c->type)
        return g5_fail(err, G5_ERR_NOMEM, "tokenizer: out of memory for %u tokens", n);

    int16_t cp_byte[324];  /* byte-level code point (< 324) -> byte, -1 if not a byte */
    for (int i = 0; i < 324; i++) cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) cp_byte[byte_to_cp((uint8_t)b)] = (int16_t)b;

    uint64_t off = 0, poff = 0;
    for (uint32_t i = 0; i < n; i++) {
        int32_t t = d->token_types ? d->token_types[i] : TOK_TYPE_NORMAL;
        if (t < 0 || t > TOK_TYPE_BYTE)
            return g5_fail(err, G5_ERR_FORMAT, "tokenizer: token %u has type %d", i, (int)t);
        c->type[i] = (uint8_t)t;
        uint64_t len = d->token_lens[i];
        c->text_off[i] = off;
        if (len) memcpy(c->text + off, d->tokens[i], len);
        c->piece_off[i] = poff;
        const uint8_t *s = (const uint8_t *)c->text + off;
        if (is_special_type((uint8_t)t)) {
            memcpy(c->piece + poff, s, len);
            poff += len;
        } else {
            /* Undo the byte-level mapping; a code point outside it stands for its own UTF-8
             * bytes (llama.cpp does the same), so decoding never loses text. */
            for (uint64_t k = 0; k < len;) {
                uint32_t cp;
                size_t l = get_utf8(s + k, len - k, &cp);
                if (l == 0) {
                    c->piece[poff++] = (char)s[k++];
                } else if (cp < 324 && cp_byte[cp] >= 0) {
                    c->piece[poff++] = (char)cp_byte[cp];
                    k += l;
                } else {
                    memcpy(c->piece + poff, s + k, l);
                    poff += l;
                    k += l;
                }
            }
        }
        off += len;
    }
    c->text_off[n] = off;
    c->piece_off[n] = poff;

    /* Text maps. */
    uint32_t n_special = 0;
    for (uint32_t i = 0; i < n; i++) n_special += is_special_type(c->type[i]);
    if (str_map_init(&c->normal, n - n_special) || (n_special && str_map_init(&c->special, n_special)))
        return g5_fail(err, G5_ERR_NOMEM, "tokenizer: out of memory for the token map");
    uint32_t *lens = n_special ? malloc(n_special * sizeof *lens) : NULL;
    if (n_special && !lens) return g5_fail(err, G5_ERR_NOMEM, "tokenizer: out of memory");
    uint32_t nl = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t len = c->text_off[i + 1] - c->text_off[i];
        if (is_special_type(c->type[i])) {
            if (len == 0 || len > UINT32_MAX) continue; /* an empty special can never match */
            str_map_add(c, &c->special, (int32_t)i);
            c->sp_first[(uint8_t)c->text[c->text_off[i]]] = 1;
            lens[nl++] = (uint32_t)len;
        } else {
            str_map_add(c, &c->normal, (int32_t)i);
        }
    }
    if (nl) {
        qsort(lens, nl, sizeof *lens, cmp_u32_desc);
        uint32_t k = 0;
        for (uint32_t i = 0; i < nl; i++)
            if (k == 0 || lens[k - 1] != lens[i]) lens[k++] = lens[i];
        nl = k;
    }
    c->sp_lens = lens;
    c->n_sp_lens = nl;

    for (int b = 0; b < 256; b++) {
        char u[4];
        size_t l = put_utf8(byte_to_cp((uint8_t)b), u);
        c->byte_tok[b] = str_map_find(c, &c->normal, u, l);
    }

    /* Merges: "LEFT RIGHT", split at the first space after the first byte (a token may not
     * contain a space in byte-level form, but llama.cpp allows one to start with it). */
    if (d->n_merges > (1u << 28))
        return g5_fail(err, G5_ERR_COUNT, "tokenizer: %llu merges",
                       (unsigned long long)d->n_merges);
    uint32_t mcap = pow2_cap(d->n_merges);
    c->merge_mask = mcap - 1;
    c->merges = malloc((size_t)mcap * sizeof *c->merges);
    if (!c->merges) return g5_fail(err, G5_ERR_NOMEM, "tokenizer: out of memory for merges");
    for (uint32_t i = 0; i < mcap; i++) c->merges[i].key = MERGE_EMPTY;
    char *tmp = NULL;
    size_t tmp_cap = 0;
    for (uint64_t r = 0; r < d->n_merges; r++) {
        const char *s = d->merges[r];
        uint64_t len = d->merge_lens[r];
        if (!s && len) return g5_fail(err, G5_ERR_INVALID_ARG, "tokenizer: merge %llu has no text",
                                      (unsigned long long)r);
        uint64_t sp = 1;
        while (sp < len && s[sp] != ' ') sp++;
        if (sp >= len) {
            free(tmp);
            return g5_fail(err, G5_ERR_FORMAT,
                           "tokenizer: tokenizer.ggml.merges[%llu] has no space separator",
                           (unsigned long long)r);
        }
        int32_t l = str_map_find(c, &c->normal, s, sp);
        int32_t rt = str_map_find(c, &c->normal, s + sp + 1, len - sp - 1);
        if (l < 0 || rt < 0) continue; /* cannot apply to anything we produce */
        if (len > tmp_cap) {
            char *t2 = realloc(tmp, len);
            if (!t2) { free(tmp); return g5_fail(err, G5_ERR_NOMEM, "tokenizer: out of memory"); }
            tmp = t2;
            tmp_cap = len;
        }
        memcpy(tmp, s, sp);
        memcpy(tmp + sp, s + sp + 1, len - sp - 1);
        int32_t res = str_map_find(c, &c->normal, tmp, len - 1);
        /* A merge whose result is not a token would leave a piece we cannot emit; HF refuses
         * such files, llama.cpp falls back to bytes. Skipping it keeps every symbol a token. */
        if (res < 0) continue;
        uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)rt;
        for (uint32_t i = (uint32_t)mix64(key) & c->merge_mask;; i = (i + 1) & c->merge_mask) {
            merge_slot *m = &c->merges[i];
            if (m->key == key) break; /* duplicate merge: the lower rank stays */
            if (m->key == MERGE_EMPTY) {
                m->key = key;
                m->rank = (uint32_t)r;
                m->result = res;
                break;
            }
        }
    }
    free(tmp);

    /* Well-known ids. */
    int32_t meta[6] = {d->bos, d->eos, d->eot, d->eom, d->unk, d->pad};
    static const char *const meta_key[6] = {"bos", "eos", "eot", "eom", "unknown", "padding"};
    for (int i = 0; i < 6; i++) {
        if (meta[i] >= (int64_t)n)
            return g5_fail(err, G5_ERR_FORMAT, "tokenizer: tokenizer.ggml.%s_token_id = %d is not "
                           "below the vocabulary size %u", meta_key[i], (int)meta[i], n);
        c->sp[i] = meta[i] < 0 ? -1 : meta[i];
    }
    static const struct { tok_special which; const char *name; } by_name[] = {
        {TOK_SP_EOS, "<|endoftext|>"},       {TOK_SP_EOT, "<|user|>"},
        {TOK_SP_EOM, "<|observation|>"},     {TOK_SP_ENDOFTEXT, "<|endoftext|>"},
        {TOK_SP_GMASK, "[gMASK]"},           {TOK_SP_SOP, "<sop>"},
        {TOK_SP_EOP, "<eop>"},               {TOK_SP_SYSTEM, "<|system|>"},
        {TOK_SP_USER, "<|user|>"},           {TOK_SP_ASSISTANT, "<|assistant|>"},
        {TOK_SP_OBSERVATION, "<|observation|>"}, {TOK_SP_THINK, "<think>"},
        {TOK_SP_END_THINK, "</think>"},      {TOK_SP_NOTHINK, "/nothink"},
    };
    for (int i = TOK_SP_ENDOFTEXT; i < TOK_SP_COUNT; i++) c->sp[i] = -1;
    for (size_t i = 0; i < sizeof by_name / sizeof by_name[0]; i++) {
        if (c->sp[by_name[i].which] >= 0) continue;
        c->sp[by_name[i].which] =
            str_map_find(c, &c->special, by_name[i].name, strlen(by_name[i].name));
    }
    const tok_special eog[] = {TOK_SP_EOS, TOK_SP_EOT, TOK_SP_EOM,
                               TOK_SP_ENDOFTEXT, TOK_SP_USER, TOK_SP_OBSERVATION};
    for (size_t i = 0; i < sizeof eog / sizeof eog[0]; i++) {
        int32_t id = c->sp[eog[i]];
        if (id < 0) continue;
        int dup = 0;
        for (uint32_t k = 0; k < c->n_eog; k++) dup |= c->eog[k] == id;
        if (!dup) c->eog[c->n_eog++] = id;
    }

    /* Regex. JIT is optional: without it PCRE2's interpreter gives the same matches. */
    int ecode;
    PCRE2_SIZE eoff;
    c->re = pcre2_compile((PCRE2_SPTR)k_glm4_pattern, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &ecode, &eoff, NULL);
    if (!c->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ecode, msg, sizeof msg);
        return g5_fail(err, G5_ERR_INTERNAL, "tokenizer: PCRE2 rejects the glm4 pattern at %zu: %s",
                       (size_t)eoff, (const char *)msg);
    }
    (void)pcre2_jit_compile(c->re, PCRE2_JIT_COMPLETE);
    return G5_OK;
}

g5_status tok_create_from_vocab(const tok_vocab_desc *desc, tok_ctx **out, g5_error *err) {
    if (!desc || !out || (desc->n_tokens && (!desc->tokens || !desc->token_lens)) ||
        (desc->n_merges && (!desc->merges || !desc->merge_lens)))
        return g5_fail(err, G5_ERR_INVALID_ARG, "tokenizer: bad vocabulary description");
    *out = NULL;
    tok_ctx *c = calloc(1, sizeof *c);
    if (!c) return g5_fail(err, G5_ERR_NOMEM, "tokenizer: out of memory");
    g5_status st = build(c, desc, err);
    if (st != G5_OK) {
        tok_free(c);
        return st;
    }
    *out = c;
    return G5_OK;
}

static g5_status get_id(const gguf_ctx *g, const char *key, int32_t *out, g5_error *err) {
    int64_t v;
    g5_status st = gguf_get_int(g, key, &v, err);
    if (st == G5_ERR_NOT_FOUND) {
        *out = -1;
        g5_error_clear(err);
        return G5_OK;
    }
    if (st != G5_OK) return st;
    if (v < 0 || v > INT32_MAX) return g5_fail(err, G5_ERR_FORMAT, "tokenizer: %s = %lld", key,
                                                (long long)v);
    *out = (int32_t)v;
    return G5_OK;
}

static int str_eq(const char *s, uint64_t len, const char *lit) {
    return len == strlen(lit) && memcmp(s, lit, len) == 0;
}

g5_status tok_create(const gguf_ctx *g, tok_ctx **out, g5_error *err) {
    if (!g || !out) return g5_fail(err, G5_ERR_INVALID_ARG, "tokenizer: NULL argument");
    *out = NULL;
    const char *s;
    uint64_t len;
    g5_status st = gguf_get_str(g, "tokenizer.ggml.model", &s, &len, err);
    if (st != G5_OK) return st;
    if (!str_eq(s, len, "gpt2"))
        return g5_fail(err, G5_ERR_UNSUPPORTED, "tokenizer: tokenizer.ggml.model '%.*s' is not "
                       "supported (only 'gpt2')", (int)(len > 64 ? 64 : len), s);
    st = gguf_get_str(g, "tokenizer.ggml.pre", &s, &len, err);
    if (st != G5_OK) return st;
    if (!str_eq(s, len, "glm4") && !str_eq(s, len, "chatglm-bpe"))
        return g5_fail(err, G5_ERR_UNSUPPORTED, "tokenizer: tokenizer.ggml.pre '%.*s' is not "
                       "supported (only 'glm4', 'chatglm-bpe')", (int)(len > 64 ? 64 : len), s);

    tok_vocab_desc d;
    memset(&d, 0, sizeof d);
    gguf_vtype et;
    uint64_t n;
    st = gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, err);
    if (st != G5_OK) return st;
    if (et != GGUF_VT_STRING)
        return g5_fail(err, G5_ERR_WRONG_TYPE, "tokenizer: tokenizer.ggml.tokens holds %s, not "
                       "strings", gguf_vtype_name(et));
    if (n == 0 || n > (1u << 30))
        return g5_fail(err, G5_ERR_COUNT, "tokenizer: tokenizer.ggml.tokens has %llu entries",
                       (unsigned long long)n);
    d.n_tokens = (uint32_t)n;

    uint64_t n_merges = 0;
    st = gguf_get_arr(g, "tokenizer.ggml.merges", &et, &n_merges, err);
    if (st != G5_OK) return st;
    if (et != GGUF_VT_STRING)
        return g5_fail(err, G5_ERR_WRONG_TYPE, "tokenizer: tokenizer.ggml.merges holds %s, not "
                       "strings", gguf_vtype_name(et));
    if (n_merges > (1u << 28))
        return g5_fail(err, G5_ERR_COUNT, "tokenizer: tokenizer.ggml.merges has %llu entries",
                       (unsigned long long)n_merges);
    d.n_merges = n_merges;

    const char **tokens = malloc(n * sizeof *tokens);
    uint64_t *tlens = malloc(n * sizeof *tlens);
    int32_t *types = malloc(n * sizeof *types);
    const char **merges = malloc((n_merges ? n_merges : 1) * sizeof *merges);
    uint64_t *mlens = malloc((n_merges ? n_merges : 1) * sizeof *mlens);
    if (!tokens || !tlens || !types || !merges || !mlens) {
        st = g5_fail(err, G5_ERR_NOMEM, "tokenizer: out of memory");
        goto done;
    }
    for (uint64_t i = 0; i < n; i++) {
        st = gguf_get_arr_str(g, "tokenizer.ggml.tokens", i, &tokens[i], &tlens[i], err);
        if (st != G5_OK) goto done;
    }
    for (uint64_t i = 0; i < n_merges; i++) {
        st = gguf_get_arr_str(g, "tokenizer.ggml.merges", i, &merges[i], &mlens[i], err);
        if (st != G5_OK) goto done;
    }
    uint64_t nt = 0;
    st = gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &nt, err);
    if (st == G5_ERR_NOT_FOUND) {
        g5_error_clear(err);
        for (uint64_t i = 0; i < n; i++) types[i] = TOK_TYPE_NORMAL;
    } else if (st != G5_OK) {
        goto done;
    } else {
        if ((et != GGUF_VT_INT32 && et != GGUF_VT_UINT32) || nt != n) {
            st = g5_fail(err, G5_ERR_FORMAT, "tokenizer: tokenizer.ggml.token_type is %llu x %s, "
                         "expected %llu x i32", (unsigned long long)nt, gguf_vtype_name(et),
                         (unsigned long long)n);
            goto done;
        }
        const void *data;
        st = gguf_get_arr_data(g, "tokenizer.ggml.token_type", &data, err);
        if (st != G5_OK) goto done;
        for (uint64_t i = 0; i < n; i++)
            types[i] = (int32_t)g5_rd_u32((const uint8_t *)data + 4 * i);
    }
    d.tokens = tokens;
    d.token_lens = tlens;
    d.token_types = types;
    d.merges = merges;
    d.merge_lens = mlens;
    if ((st = get_id(g, "tokenizer.ggml.bos_token_id", &d.bos, err)) != G5_OK ||
        (st = get_id(g, "tokenizer.ggml.eos_token_id", &d.eos, err)) != G5_OK ||
        (st = get_id(g, "tokenizer.ggml.eot_token_id", &d.eot, err)) != G5_OK ||
        (st = get_id(g, "tokenizer.ggml.eom_token_id", &d.eom, err)) != G5_OK ||
        (st = get_id(g, "tokenizer.ggml.unknown_token_id", &d.unk, err)) != G5_OK ||
        (st = get_id(g, "tokenizer.ggml.padding_token_id", &d.pad, err)) != G5_OK)
        goto done;
    st = tok_create_from_vocab(&d, out, err);
done:
    free(tokens);
    free(tlens);
    free(types);
    free(merges);
    free(mlens);
    return st;
}

void tok_free(tok_ctx *c) {
    if (!c) return;
    free(c->text);
    free(c->text_off);
    free(c->piece);
    free(c->piece_off);
    free(c->type);
    str_map_free(&c->normal);
    str_map_free(&c->special);
    free(c->merges);
    free(c->sp_lens);
    if (c->re) pcre2_code_free(c->re);
    free(c);
}

/* ------------------------------------------------------------------------------------------ */
/* Queries */

uint32_t tok_n_vocab(const tok_ctx *c) { return c ? c->n_vocab : 0; }

int32_t tok_special_id(const tok_ctx *c, tok_special which) {
    if (!c || (unsigned)which >= TOK_SP_COUNT) return -1;
    return c->sp[which];
}

int tok_is_eog(const tok_ctx *c, int32_t id) {
    if (!c || id < 0) return 0;
    for (uint32_t i = 0; i < c->n_eog; i++)
        if (c->eog[i] == id) return 1;
    return 0;
}

tok_type tok_token_type(const tok_ctx *c, int32_t id) {
    if (!c || id < 0 || (uint32_t)id >= c->n_vocab) return TOK_TYPE_UNDEFINED;
    return (tok_type)c->type[id];
}

int32_t tok_lookup(const tok_ctx *c, const char *text, size_t len) {
    if (!c || (!text && len)) return -1;
    int32_t id = str_map_find(c, &c->special, text, len);
    return id >= 0 ? id : str_map_find(c, &c->normal, text, len);
}

const char *tok_token_text(const tok_ctx *c, int32_t id, size_t *len) {
    if (!c || id < 0 || (uint32_t)id >= c->n_vocab) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = c->piece_off[id + 1] - c->piece_off[id];
    return c->piece + c->piece_off[id];
}

/* ------------------------------------------------------------------------------------------ */
/* Encoding */

typedef struct bpe_sym {
    int32_t id;
    int32_t prev, next; /* -1 at the ends */
    int32_t alive;
} bpe_sym;

typedef struct bpe_cand {
    uint32_t rank;
    int32_t left;       /* symbol index */
    int32_t lid, rid;   /* ids when pushed; the entry is stale once either changed */
} bpe_cand;

typedef struct enc_state {
    const tok_ctx *c;
    int32_t *ids;
    size_t cap, n;
    bpe_sym *sym;
    bpe_cand *heap;
    size_t sym_cap, heap_cap, heap_n;
    pcre2_match_data *md;
    g5_error *err;
} enc_state;

static void emit(enc_state *e, int32_t id) {
    if (e->n < e->cap) e->ids[e->n] = id;
    e->n++;
}

static int cand_less(const bpe_cand *a, const bpe_cand *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void heap_push(enc_state *e, bpe_cand x) {
    size_t i = e->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&x, &e->heap[p])) break;
        e->heap[i] = e->heap[p];
        i = p;
    }
    e->heap[i] = x;
}

static bpe_cand heap_pop(enc_state *e) {
    bpe_cand top = e->heap[0], x = e->heap[--e->heap_n];
    size_t i = 0, n = e->heap_n;
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        if (l >= n) break;
        m = l;
        if (l + 1 < n && cand_less(&e->heap[l + 1], &e->heap[l])) m = l + 1;
        if (!cand_less(&e->heap[m], &x)) break;
        e->heap[i] = e->heap[m];
        i = m;
    }
    if (n) e->heap[i] = x;
    return top;
}

static void try_pair(enc_state *e, int32_t left) {
    if (left < 0) return;
    int32_t right = e->sym[left].next;
    if (right < 0) return;
    int32_t l = e->sym[left].id, r = e->sym[right].id;
    if (l < 0 || r < 0) return;
    const merge_slot *m = merge_find(e->c, l, r);
    if (!m) return;
    bpe_cand x = {m->rank, left, l, r};
    heap_push(e, x);
}

static g5_status bpe_word(enc_state *e, const uint8_t *w, size_t n) {
    const tok_ctx *c = e->c;
    if (n == 1 && c->byte_tok[w[0]] >= 0) {
        emit(e, c->byte_tok[w[0]]);
        return G5_OK;
    }
    if (n > e->sym_cap) {
        size_t cap = n < 64 ? 64 : n;
        bpe_sym *s = realloc(e->sym, cap * sizeof *s);
        if (!s) return g5_fail(e->err, G5_ERR_NOMEM, "tokenizer: out of memory");
        e->sym = s;
        e->sym_cap = cap;
    }
    /* Every merge pushes at most two candidates and there are fewer than n merges. */
    if (3 * n > e->heap_cap) {
        size_t cap = 3 * n < 192 ? 192 : 3 * n;
        bpe_cand *h = realloc(e->heap, cap * sizeof *h);
        if (!h) return g5_fail(e->err, G5_ERR_NOMEM, "tokenizer: out of memory");
        e->heap = h;
        e->heap_cap = cap;
    }
    bpe_sym *s = e->sym;
    for (size_t i = 0; i < n; i++) {
        s[i].id = c->byte_tok[w[i]];
        s[i].prev = (int32_t)i - 1;
        s[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
        s[i].alive = 1;
    }
    e->heap_n = 0;
    for (size_t i = 0; i + 1 < n; i++) try_pair(e, (int32_t)i);
    while (e->heap_n) {
        bpe_cand x = heap_pop(e);
        bpe_sym *l = &s[x.left];
        if (!l->alive || l->id != x.lid || l->next < 0) continue;
        bpe_sym *r = &s[l->next];
        if (r->id != x.rid) continue;
        l->id = merge_find(c, x.lid, x.rid)->result;
        r->alive = 0;
        l->next = r->next;
        if (r->next >= 0) s[r->next].prev = x.left;
        try_pair(e, l->prev);
        try_pair(e, x.left);
    }
    for (int32_t i = 0; i >= 0; i = s[i].next) {
        if (s[i].id >= 0) {
            emit(e, s[i].id);
        } else if (c->sp[TOK_SP_UNK] >= 0) {
            emit(e, c->sp[TOK_SP_UNK]);
        } else {
            return g5_fail(e->err, G5_ERR_NOT_FOUND, "tokenizer: the vocabulary has no token for "
                           "byte 0x%02x and no unknown token", (unsigned)w[i]);
        }
    }
    return G5_OK;
}

/* Splits a stretch of ordinary text with the pre-tokenizer regex and BPE-encodes each piece.
 * Text the regex does not match (only invalid UTF-8 can be left over) becomes pieces too. */
static g5_status encode_raw(enc_state *e, const uint8_t *t, size_t len) {
    size_t pos = 0;
    while (pos < len) {
        int rc = pcre2_match(e->c->re, t, len, pos, 0, e->md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(e->c->re, t, len, pos, PCRE2_NO_JIT, e->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) return bpe_word(e, t + pos, len - pos);
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return g5_fail(e->err, G5_ERR_INTERNAL, "tokenizer: PCRE2 match failed at byte %zu: %s",
                           pos, (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        size_t s = ov[0], end = ov[1];
        if (s < pos || end < s || end > len)
            return g5_fail(e->err, G5_ERR_INTERNAL, "tokenizer: PCRE2 returned a bad range");
        g5_status st;
        if (s > pos && (st = bpe_word(e, t + pos, s - pos)) != G5_OK) return st;
        if (end == s) { /* the pattern cannot match empty; never loop on one that did */
            end = s + 1;
            while (end < len && (t[end] & 0xc0) == 0x80) end++;
        }
        if ((st = bpe_word(e, t + s, end - s)) != G5_OK) return st;
        pos = end;
    }
    return G5_OK;
}

g5_status tok_encode(const tok_ctx *c, const char *text, size_t len, int parse_special,
                     int32_t *ids, size_t cap, size_t *n_out, g5_error *err) {
    if (n_out) *n_out = 0;
    if (!c || (!text && len) || (!ids && cap) || !n_out)
        return g5_fail(err, G5_ERR_INVALID_ARG, "tok_encode: bad arguments");
    enc_state e;
    memset(&e, 0, sizeof e);
    e.c = c;
    e.ids = ids;
    e.cap = cap;
    e.err = err;
    e.md = pcre2_match_data_create_from_pattern(c->re, NULL);
    if (!e.md) return g5_fail(err, G5_ERR_NOMEM, "tokenizer: out of memory");

    const uint8_t *t = (const uint8_t *)text;
    g5_status st = G5_OK;
    size_t frag = 0, pos = 0;
    while (pos < len && st == G5_OK) {
        int32_t hit = -1;
        uint32_t hit_len = 0;
        if (c->sp_first[t[pos]]) {
            for (uint32_t k = 0; k < c->n_sp_lens; k++) {
                uint32_t L = c->sp_lens[k];
                if (L > len - pos) continue;
                int32_t id = str_map_find(c, &c->special, text + pos, L);
                if (id >= 0 && (parse_special || c->type[id] == TOK_TYPE_USER_DEFINED)) {
                    hit = id;
                    hit_len = L;
                    break;
                }
            }
        }
        if (hit < 0) {
            pos++;
            continue;
        }
        if (pos > frag) st = encode_raw(&e, t + frag, pos - frag);
        emit(&e, hit);
        pos += hit_len;
        frag = pos;
    }
    if (st == G5_OK && len > frag) st = encode_raw(&e, t + frag, len - frag);
    pcre2_match_data_free(e.md);
    free(e.sym);
    free(e.heap);
    if (st != G5_OK) return st;
    *n_out = e.n;
    if (e.n > cap)
        return g5_fail(err, G5_ERR_BOUNDS, "tok_encode: %zu ids do not fit in %zu", e.n, cap);
    return G5_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Decoding */

static const char *piece_for(const tok_ctx *c, int32_t id, unsigned flags, size_t *len) {
    if (c->type[id] == TOK_TYPE_CONTROL && !(flags & TOK_DECODE_SPECIAL)) {
        *len = 0;
        return "";
    }
    *len = c->piece_off[id + 1] - c->piece_off[id];
    return c->piece + c->piece_off[id];
}

g5_status tok_decode(const tok_ctx *c, const int32_t *ids, size_t n, unsigned flags, char *out,
                     size_t cap, size_t *n_out, g5_error *err) {
    if (n_out) *n_out = 0;
    if (!c || (!ids && n) || (!out && cap) || !n_out)
        return g5_fail(err, G5_ERR_INVALID_ARG, "tok_decode: bad arguments");
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= c->n_vocab)
            return g5_fail(err, G5_ERR_INVALID_ARG, "tok_decode: id %d at position %zu is outside "
                           "the vocabulary of %u", (int)ids[i], i, c->n_vocab);
        size_t l;
        const char *p = piece_for(c, ids[i], flags, &l);
        if (total < cap) memcpy(out + total, p, l < cap - total ? l : cap - total);
        total += l;
    }
    *n_out = total;
    if (total > cap)
        return g5_fail(err, G5_ERR_BOUNDS, "tok_decode: %zu bytes do not fit in %zu", total, cap);
    return G5_OK;
}

struct tok_stream {
    const tok_ctx *c;
    unsigned flags;
    char hold[4];
    size_t n_hold;
    char *buf;
    size_t cap;
};

g5_status tok_stream_create(const tok_ctx *c, unsigned flags, tok_stream **out, g5_error *err) {
    if (!c || !out) return g5_fail(err, G5_ERR_INVALID_ARG, "tok_stream_create: NULL argument");
    tok_stream *s = calloc(1, sizeof *s);
    if (!s) return g5_fail(err, G5_ERR_NOMEM, "tokenizer: out of memory");
    s->c = c;
    s->flags = flags;
    *out = s;
    return G5_OK;
}

void tok_stream_free(tok_stream *s) {
    if (!s) return;
    free(s->buf);
    free(s);
}

size_t tok_stream_pending(const tok_stream *s) { return s ? s->n_hold : 0; }

/* Length of the prefix of b[0..n) that can be shown now: everything except a trailing sequence
 * that is a valid but incomplete start of a UTF-8 character. */
static size_t utf8_safe_prefix(const uint8_t *b, size_t n) {
    size_t back = 0;
    while (back < 3 && back < n && (b[n - 1 - back] & 0xc0) == 0x80) back++;
    if (back == n) return n;
    size_t i = n - 1 - back;
    uint8_t lead = b[i];
    size_t need;
    if (lead >= 0xc2 && lead <= 0xdf) need = 2;
    else if (lead >= 0xe0 && lead <= 0xef) need = 3;
    else if (lead >= 0xf0 && lead <= 0xf4) need = 4;
    else return n;
    if (n - i >= need) return n; /* complete (or it was never going to be) */
    if (n - i >= 2) {
        uint8_t b1 = b[i + 1];
        if ((lead == 0xe0 && b1 < 0xa0) || (lead == 0xed && b1 > 0x9f) ||
            (lead == 0xf0 && b1 < 0x90) || (lead == 0xf4 && b1 > 0x8f))
            return n; /* overlong / surrogate / out of range: can never complete */
    }
    return i;
}

g5_status tok_stream_push(tok_stream *s, int32_t id, const char **bytes, size_t *n, g5_error *err) {
    if (bytes) *bytes = "";
    if (n) *n = 0;
    if (!s || !bytes || !n) return g5_fail(err, G5_ERR_INVALID_ARG, "tok_stream_push: NULL argument");
    if (id < 0 || (uint32_t)id >= s->c->n_vocab)
        return g5_fail(err, G5_ERR_INVALID_ARG, "tok_stream_push: id %d is outside the vocabulary "
                       "of %u", (int)id, s->c->n_vocab);
    size_t l;
    const char *p = piece_for(s->c, id, s->flags, &l);
    size_t total = s->n_hold + l;
    if (total > s->cap) {
        size_t cap = total < 64 ? 64 : total * 2;
        char *b = realloc(s->buf, cap);
        if (!b) return g5_fail(err, G5_ERR_NOMEM, "tokenizer: out of memory");
        s->buf = b;
        s->cap = cap;
    }
    if (total == 0) return G5_OK;
    memcpy(s->buf, s->hold, s->n_hold);
    memcpy(s->buf + s->n_hold, p, l);
    size_t k = utf8_safe_prefix((const uint8_t *)s->buf, total);
    s->n_hold = total - k;
    memcpy(s->hold, s->buf + k, s->n_hold);
    *bytes = s->buf;
    *n = k;
    return G5_OK;
}

void tok_stream_flush(tok_stream *s, const char **bytes, size_t *n) {
    if (!s) {
        if (bytes) *bytes = "";
        if (n) *n = 0;
        return;
    }
    /* Held bytes came from a push, which left buf at least 64 bytes long. */
    if (s->n_hold) memcpy(s->buf, s->hold, s->n_hold);
    if (bytes) *bytes = s->n_hold ? s->buf : "";
    if (n) *n = s->n_hold;
    s->n_hold = 0;
}
