/* Tokenizer and chat formatting against the oracle: tokenizer_cases.json lists the ids that
 * Hugging Face's tokenizer gives for each text with the GGUF's own vocabulary. Besides those, a
 * deliberately naive BPE written here (linear scans over the GGUF's merge list, no hashing)
 * checks single pre-tokens, random strings must round-trip, the streaming decoder must agree
 * with the full decode, and a synthetic GLM-5-sized vocabulary must stay fast. */
#include "tests/test_util.h"

#include "format/gguf.h"
#include "format/gguf_write.h"
#include "runtime/text/chat.h"
#include "runtime/text/tokenizer.h"

#include <jansson.h>
#include <stdint.h>
#include <time.h>

/* ---- small helpers ---- */

static uint64_t rng_state = 0x5eed1234abcdULL;
static uint64_t rnd(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static uint32_t rndn(uint32_t n) { return (uint32_t)(rnd() % n); }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static size_t put_cp(uint32_t cp, char *o) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xc0 | cp >> 6); o[1] = (char)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | cp >> 12); o[1] = (char)(0x80 | ((cp >> 6) & 63));
        o[2] = (char)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (char)(0xf0 | cp >> 18); o[1] = (char)(0x80 | ((cp >> 12) & 63));
    o[2] = (char)(0x80 | ((cp >> 6) & 63)); o[3] = (char)(0x80 | (cp & 63));
    return 4;
}

/* Strict UTF-8 validation (no overlongs, surrogates or values past U+10FFFF). */
static int utf8_valid(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t len;
        uint32_t v, min;
        if (c < 0x80) { i++; continue; }
        if (c >= 0xc2 && c <= 0xdf) { len = 2; v = c & 0x1f; min = 0x80; }
        else if (c >= 0xe0 && c <= 0xef) { len = 3; v = c & 0xf; min = 0x800; }
        else if (c >= 0xf0 && c <= 0xf4) { len = 4; v = c & 7; min = 0x10000; }
        else return 0;
        if (i + len > n) return 0;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return 0;
            v = v << 6 | (s[i + k] & 0x3f);
        }
        if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return 0;
        i += len;
    }
    return 1;
}

/* A random code point from a mix of scripts and classes the pre-tokenizer treats differently. */
static uint32_t random_cp(void) {
    static const uint32_t ws[] = {' ', ' ', ' ', '\t', '\n', '\r', 0x0b, 0x0c, 0x85, 0xa0,
                                  0x1680, 0x2002, 0x2028, 0x2029, 0x202f, 0x3000};
    switch (rndn(14)) {
    case 0: case 1: case 2: return 'a' + rndn(26);
    case 3: return 'A' + rndn(26);
    case 4: return '0' + rndn(10);
    case 5: return ws[rndn(sizeof ws / sizeof ws[0])];
    case 6: return "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"[rndn(32)];
    case 7: return 0xc0 + rndn(0x180);             /* Latin-1 supplement / extended */
    case 8: return 0x300 + rndn(0x70);             /* combining marks */
    case 9: return 0x4e00 + rndn(0x5200);          /* CJK */
    case 10: return 0x1f300 + rndn(0x300);         /* emoji and pictographs */
    case 11: return 0x660 + rndn(10);              /* Arabic-Indic digits */
    case 12: return rndn(2) ? 0x200d : 0xfe0f;     /* ZWJ, variation selector */
    default: {
        uint32_t cp;
        do cp = 1 + rndn(0x10ffff); while (cp >= 0xd800 && cp <= 0xdfff);
        return cp;
    }
    }
}

static size_t random_utf8(char *buf, size_t max_cps) {
    size_t n = 0, cps = rndn((uint32_t)max_cps + 1);
    for (size_t i = 0; i < cps; i++) {
        if (rndn(8) == 0) { /* runs stress the whitespace and digit rules */
            uint32_t cp = random_cp();
            size_t run = 2 + rndn(6);
            for (size_t k = 0; k < run; k++) n += put_cp(cp, buf + n);
        } else {
            n += put_cp(random_cp(), buf + n);
        }
    }
    return n;
}

/* ---- naive reference BPE over the GGUF's own arrays ---- */

typedef struct naive_vocab {
    uint64_t n_tokens, n_merges;
    const char **tok;
    uint64_t *tok_len;
    const char **merge;
    uint64_t *merge_len;
} naive_vocab;

/* GPT-2's bytes_to_unicode, computed directly from its definition. */
static uint32_t naive_byte_cp(unsigned b) {
    int printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    if (printable) return b;
    uint32_t k = 0;
    for (unsigned x = 0; x < b; x++)
        if (!((x >= '!' && x <= '~') || (x >= 0xa1 && x <= 0xac) || (x >= 0xae && x <= 0xff))) k++;
    return 256 + k;
}

static int64_t naive_rank(const naive_vocab *v, const char *a, size_t la, const char *b, size_t lb) {
    for (uint64_t r = 0; r < v->n_merges; r++) {
        if (v->merge_len[r] != la + 1 + lb) continue;
        const char *m = v->merge[r];
        if (memcmp(m, a, la) == 0 && m[la] == ' ' && memcmp(m + la + 1, b, lb) == 0) return (int64_t)r;
    }
    return -1;
}

static int32_t naive_id(const naive_vocab *v, const char *s, size_t len) {
    for (uint64_t i = 0; i < v->n_tokens; i++)
        if (v->tok_len[i] == len && memcmp(v->tok[i], s, len) == 0) return (int32_t)i;
    return -1;
}

/* BPE of one pre-token: repeatedly merge the leftmost pair of lowest rank. */
static size_t naive_bpe(const naive_vocab *v, const char *word, size_t n, int32_t *out) {
    char sym[256][64];
    size_t sl[256], ns = 0;
    for (size_t i = 0; i < n; i++) sl[ns] = put_cp(naive_byte_cp((unsigned char)word[i]), sym[ns]), ns++;
    for (;;) {
        int64_t best = -1;
        size_t at = 0;
        for (size_t i = 0; i + 1 < ns; i++) {
            int64_t r = naive_rank(v, sym[i], sl[i], sym[i + 1], sl[i + 1]);
            if (r >= 0 && (best < 0 || r < best)) best = r, at = i;
        }
        if (best < 0) break;
        memcpy(sym[at] + sl[at], sym[at + 1], sl[at + 1]);
        sl[at] += sl[at + 1];
        memmove(&sym[at + 1], &sym[at + 2], (ns - at - 2) * sizeof sym[0]);
        memmove(&sl[at + 1], &sl[at + 2], (ns - at - 2) * sizeof sl[0]);
        ns--;
    }
    for (size_t i = 0; i < ns; i++) out[i] = naive_id(v, sym[i], sl[i]);
    return ns;
}

static int load_naive(const gguf_ctx *g, naive_vocab *v) {
    gguf_vtype et;
    if (gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &v->n_tokens, NULL) != G5_OK) return -1;
    if (gguf_get_arr(g, "tokenizer.ggml.merges", &et, &v->n_merges, NULL) != G5_OK) return -1;
    v->tok = malloc(v->n_tokens * sizeof *v->tok);
    v->tok_len = malloc(v->n_tokens * sizeof *v->tok_len);
    v->merge = malloc(v->n_merges * sizeof *v->merge);
    v->merge_len = malloc(v->n_merges * sizeof *v->merge_len);
    for (uint64_t i = 0; i < v->n_tokens; i++)
        if (gguf_get_arr_str(g, "tokenizer.ggml.tokens", i, &v->tok[i], &v->tok_len[i], NULL)) return -1;
    for (uint64_t i = 0; i < v->n_merges; i++)
        if (gguf_get_arr_str(g, "tokenizer.ggml.merges", i, &v->merge[i], &v->merge_len[i], NULL)) return -1;
    return 0;
}

static void free_naive(naive_vocab *v) {
    free(v->tok);
    free(v->tok_len);
    free(v->merge);
    free(v->merge_len);
}

/* ---- tests against the oracle vocabulary ---- */

static int32_t json_special(json_t *specials, const char *name) {
    json_t *v = json_object_get(specials, name);
    return json_is_integer(v) ? (int32_t)json_integer_value(v) : -2;
}

static void test_oracle_cases(const tok_ctx *tok) {
    json_error_t je;
    json_t *root = json_load_file(t_shared("oracle/glm5-tiny/tokenizer_cases.json"), 0, &je);
    T_CHECK(root && json_is_array(root), "tokenizer_cases.json: %s", root ? "not an array" : je.text);
    if (!root) return;
    size_t i;
    json_t *c;
    json_array_foreach(root, i, c) {
        const char *text = json_string_value(json_object_get(c, "text"));
        size_t len = json_string_length(json_object_get(c, "text"));
        json_t *want = json_object_get(c, "ids");
        T_CHECK(text && json_is_array(want), "case %zu malformed", i);
        if (!text || !want) continue;
        size_t nw = json_array_size(want), n = 0;
        int32_t *ids = malloc((len + 1) * sizeof *ids);
        g5_error err = {0};
        g5_status st = tok_encode(tok, text, len, 1, ids, len + 1, &n, &err);
        T_CHECK(st == G5_OK, "case %zu: %s", i, err.msg);
        int same = n == nw;
        size_t first_diff = 0;
        for (size_t k = 0; same && k < n; k++)
            if (ids[k] != (int32_t)json_integer_value(json_array_get(want, k))) same = 0, first_diff = k;
        T_CHECK(same, "case %zu (%.40s...): %zu ids, oracle %zu, first difference at %zu", i, text,
                n, nw, first_diff);
        char *back = malloc(len + 16);
        size_t nb = 0;
        st = tok_decode(tok, ids, n, TOK_DECODE_SPECIAL, back, len + 16, &nb, &err);
        T_CHECK(st == G5_OK && nb == len && memcmp(back, text, len) == 0,
                "case %zu: decode does not give the text back", i);
        free(back);
        free(ids);
    }
    T_CHECK(json_array_size(root) >= 9, "only %zu oracle cases", json_array_size(root));
    json_decref(root);
}

static void test_specials(const tok_ctx *tok, json_t *specials) {
    const char *key;
    json_t *v;
    size_t n = 0;
    json_object_foreach(specials, key, v) {
        int32_t id = (int32_t)json_integer_value(v);
        T_CHECK(tok_lookup(tok, key, strlen(key)) == id, "special %s: lookup %d, oracle %d", key,
                (int)tok_lookup(tok, key, strlen(key)), (int)id);
        T_CHECK(tok_token_type(tok, id) == TOK_TYPE_CONTROL, "special %s is not CONTROL", key);
        size_t l;
        const char *t = tok_token_text(tok, id, &l);
        T_CHECK(t && l == strlen(key) && memcmp(t, key, l) == 0, "special %s: text differs", key);
        /* With parse_special the text is that one token; without, it is ordinary text. */
        int32_t ids[64];
        size_t m = 0;
        T_CHECK(tok_encode(tok, key, strlen(key), 1, ids, 64, &m, NULL) == G5_OK && m == 1 &&
                ids[0] == id, "special %s does not encode to itself", key);
        T_CHECK(tok_encode(tok, key, strlen(key), 0, ids, 64, &m, NULL) == G5_OK && m > 1,
                "special %s encoded as a token without parse_special", key);
        n++;
    }
    T_CHECK(n >= 20, "reference.json lists %zu specials", n);
    struct { tok_special w; const char *name; } by_name[] = {
        {TOK_SP_GMASK, "[gMASK]"}, {TOK_SP_SOP, "<sop>"}, {TOK_SP_EOP, "<eop>"},
        {TOK_SP_SYSTEM, "<|system|>"}, {TOK_SP_USER, "<|user|>"},
        {TOK_SP_ASSISTANT, "<|assistant|>"}, {TOK_SP_OBSERVATION, "<|observation|>"},
        {TOK_SP_THINK, "<think>"}, {TOK_SP_END_THINK, "</think>"}, {TOK_SP_NOTHINK, "/nothink"},
        {TOK_SP_ENDOFTEXT, "<|endoftext|>"},
    };
    for (size_t i = 0; i < sizeof by_name / sizeof by_name[0]; i++)
        T_CHECK(tok_special_id(tok, by_name[i].w) == json_special(specials, by_name[i].name),
                "%s: %d, oracle %d", by_name[i].name, (int)tok_special_id(tok, by_name[i].w),
                (int)json_special(specials, by_name[i].name));
    /* The GGUF names [gMASK] as BOS, <|endoftext|> as EOS, <|user|> as EOT, <|observation|> as EOM. */
    T_CHECK(tok_special_id(tok, TOK_SP_BOS) == json_special(specials, "[gMASK]"), "bos");
    T_CHECK(tok_special_id(tok, TOK_SP_EOS) == json_special(specials, "<|endoftext|>"), "eos");
    T_CHECK(tok_special_id(tok, TOK_SP_EOT) == json_special(specials, "<|user|>"), "eot");
    T_CHECK(tok_special_id(tok, TOK_SP_EOM) == json_special(specials, "<|observation|>"), "eom");
    T_CHECK(tok_is_eog(tok, json_special(specials, "<|endoftext|>")) &&
            tok_is_eog(tok, json_special(specials, "<|user|>")) &&
            tok_is_eog(tok, json_special(specials, "<|observation|>")) &&
            !tok_is_eog(tok, json_special(specials, "<|assistant|>")) &&
            !tok_is_eog(tok, json_special(specials, "<think>")) && !tok_is_eog(tok, 0),
            "end-of-generation set");
    T_CHECK(tok_token_text(tok, -1, NULL) == NULL && tok_token_text(tok, 1 << 30, NULL) == NULL,
            "out-of-range ids have no text");
}

/* Single pre-tokens (letter runs with an optional leading space or mark, digit groups of at most
 * three) against the naive BPE. */
static void test_naive_bpe(const tok_ctx *tok, const naive_vocab *v) {
    int bad = 0, total = 0;
    char word[128];
    int32_t a[256], b[256];
    for (int iter = 0; iter < 400; iter++) {
        size_t n = 0;
        int kind = iter % 4;
        if (kind == 0 || kind == 1) {
            if (kind == 1) word[n++] = " -'\"("[rndn(5)];
            size_t len = 1 + rndn(14);
            for (size_t k = 0; k < len; k++) word[n++] = (char)("etaoinshrdlucmfwypvbgkjqxz"[rndn(rndn(2) ? 8 : 26)] - (rndn(6) == 0 ? 32 : 0));
        } else if (kind == 2) {
            size_t len = 1 + rndn(3);
            for (size_t k = 0; k < len; k++) word[n++] = (char)('0' + rndn(10));
        } else {
            size_t len = 1 + rndn(5);
            for (size_t k = 0; k < len; k++) n += put_cp(0x4e00 + rndn(0x400), word + n);
        }
        size_t na = naive_bpe(v, word, n, a), nb = 0;
        g5_status st = tok_encode(tok, word, n, 0, b, 256, &nb, NULL);
        total++;
        int same = st == G5_OK && na == nb && memcmp(a, b, na * sizeof *a) == 0;
        if (!same && bad++ < 5) T_CHECK(same, "word '%.*s': naive BPE and tokenizer differ", (int)n, word);
    }
    T_CHECK(bad == 0, "%d of %d words differ from the naive BPE", bad, total);
}

static void test_round_trip(const tok_ctx *tok, json_t *specials) {
    static char text[8192], back[8192];
    static int32_t ids[8192];
    int bad_rt = 0, bad_stream = 0, bad_chunk = 0, held = 0, strings = 0;
    size_t total_ids = 0;
    tok_stream *s = NULL;
    T_CHECK(tok_stream_create(tok, 0, &s, NULL) == G5_OK, "stream create");
    for (int iter = 0; iter < 1500; iter++) {
        size_t len = random_utf8(text, 150);
        if (!utf8_valid((unsigned char *)text, len)) { T_CHECK(0, "generator made bad UTF-8"); break; }
        size_t n = 0, nb = 0;
        g5_status st = tok_encode(tok, text, len, 0, ids, 8192, &n, NULL);
        int ok = st == G5_OK && n <= len;
        for (size_t k = 0; ok && k < n; k++) ok = ids[k] >= 0 && (uint32_t)ids[k] < tok_n_vocab(tok);
        ok = ok && tok_decode(tok, ids, n, 0, back, sizeof back, &nb, NULL) == G5_OK && nb == len &&
             memcmp(back, text, len) == 0;
        if (!ok && bad_rt++ < 5) T_CHECK(ok, "round trip fails for a %zu-byte string", len);
        total_ids += n;
        strings++;
        /* Streaming: every chunk must be valid UTF-8 by itself and the chunks must add up. */
        size_t got = 0;
        int chunk_ok = 1;
        for (size_t k = 0; k < n; k++) {
            const char *p;
            size_t m;
            if (tok_stream_push(s, ids[k], &p, &m, NULL) != G5_OK) { chunk_ok = 0; break; }
            if (!utf8_valid((const unsigned char *)p, m)) chunk_ok = 0;
            if (tok_stream_pending(s)) held++;
            if (got + m <= sizeof back) memcpy(back + got, p, m);
            got += m;
        }
        const char *p;
        size_t m;
        tok_stream_flush(s, &p, &m);
        if (m) chunk_ok = 0; /* the text was valid: nothing may be left over */
        if (!chunk_ok && bad_chunk++ < 5) T_CHECK(chunk_ok, "stream emitted broken UTF-8");
        int same = got == len && memcmp(back, text, len) == 0;
        if (!same && bad_stream++ < 5) T_CHECK(same, "stream output differs from the text");
    }
    T_CHECK(bad_rt == 0, "%d of %d strings do not round-trip", bad_rt, strings);
    T_CHECK(bad_stream == 0 && bad_chunk == 0, "stream: %d differ, %d broke UTF-8", bad_stream,
            bad_chunk);
    /* Multi-byte characters split over tokens are the point of the hold-back. */
    T_CHECK(held > 100, "the stream held back bytes only %d times", held);
    printf("round trip: %d strings, %zu ids, stream held back %d times\n", strings, total_ids, held);

    /* Arbitrary bytes (invalid UTF-8 included) still round-trip, and the stream matches. */
    int bad_bytes = 0;
    for (int iter = 0; iter < 300; iter++) {
        size_t len = rndn(64), n = 0, nb = 0;
        for (size_t k = 0; k < len; k++) text[k] = (char)(rndn(3) ? rnd() : 0x80 + rndn(0x40));
        int ok = tok_encode(tok, text, len, 0, ids, 8192, &n, NULL) == G5_OK &&
                 tok_decode(tok, ids, n, 0, back, sizeof back, &nb, NULL) == G5_OK && nb == len &&
                 memcmp(back, text, len) == 0;
        size_t got = 0;
        for (size_t k = 0; ok && k < n; k++) {
            const char *p;
            size_t m;
            ok = tok_stream_push(s, ids[k], &p, &m, NULL) == G5_OK;
            memcpy(back + got, p, m);
            got += m;
        }
        const char *p;
        size_t m;
        tok_stream_flush(s, &p, &m);
        memcpy(back + got, p, m);
        got += m;
        ok = ok && got == len && memcmp(back, text, len) == 0;
        if (!ok) bad_bytes++;
    }
    T_CHECK(bad_bytes == 0, "%d random byte strings do not round-trip", bad_bytes);

    /* Specials among text: with parse_special they become tokens and decode back with the flag;
     * without the flag CONTROL tokens decode to nothing. */
    const char *names[] = {"[gMASK]", "<sop>", "<|user|>", "<|assistant|>", "<think>", "</think>",
                           "/nothink", "<|observation|>"};
    int bad_sp = 0;
    for (int iter = 0; iter < 200; iter++) {
        size_t len = 0, n_sp = 0, plain = 0;
        char plain_text[4096];
        for (int part = 0; part < 4; part++) {
            size_t l = random_utf8(text + len, 12);
            memcpy(plain_text + plain, text + len, l);
            plain += l;
            len += l;
            const char *nm = names[rndn(8)];
            memcpy(text + len, nm, strlen(nm));
            len += strlen(nm);
            n_sp++;
        }
        size_t n = 0, nb = 0, n_ctl = 0;
        int ok = tok_encode(tok, text, len, 1, ids, 8192, &n, NULL) == G5_OK &&
                 tok_decode(tok, ids, n, TOK_DECODE_SPECIAL, back, sizeof back, &nb, NULL) == G5_OK &&
                 nb == len && memcmp(back, text, len) == 0;
        for (size_t k = 0; k < n; k++) n_ctl += tok_token_type(tok, ids[k]) == TOK_TYPE_CONTROL;
        ok = ok && n_ctl == n_sp;
        ok = ok && tok_decode(tok, ids, n, 0, back, sizeof back, &nb, NULL) == G5_OK &&
             nb == plain && memcmp(back, plain_text, plain) == 0;
        if (!ok) bad_sp++;
    }
    T_CHECK(bad_sp == 0, "%d strings with specials do not round-trip", bad_sp);
    (void)specials;
    tok_stream_free(s);
}

static void test_api_edges(const tok_ctx *tok) {
    int32_t ids[4];
    size_t n = 123;
    g5_error err = {0};
    T_CHECK(tok_encode(tok, "", 0, 1, ids, 4, &n, NULL) == G5_OK && n == 0, "empty text");
    const char *t = "Hello world, this is a longer text";
    g5_status st = tok_encode(tok, t, strlen(t), 0, ids, 2, &n, &err);
    T_CHECK(st == G5_ERR_BOUNDS && n > 2, "small cap: status %d n %zu", (int)st, n);
    size_t need = n;
    int32_t *all = malloc(need * sizeof *all);
    T_CHECK(tok_encode(tok, t, strlen(t), 0, all, need, &n, NULL) == G5_OK && n == need,
            "exact cap");
    T_CHECK(memcmp(all, ids, 2 * sizeof *ids) == 0, "truncated output is a prefix");
    char out[8];
    st = tok_decode(tok, all, need, 0, out, sizeof out, &n, NULL);
    T_CHECK(st == G5_ERR_BOUNDS && n == strlen(t) && memcmp(out, t, 8) == 0, "decode small cap");
    free(all);
    int32_t bad = (int32_t)tok_n_vocab(tok);
    T_CHECK(tok_decode(tok, &bad, 1, 0, out, sizeof out, &n, NULL) == G5_ERR_INVALID_ARG,
            "decode of an id past the vocabulary");
    tok_stream *s;
    T_CHECK(tok_stream_create(tok, 0, &s, NULL) == G5_OK, "stream");
    const char *p;
    T_CHECK(tok_stream_push(s, -1, &p, &n, NULL) == G5_ERR_INVALID_ARG, "stream bad id");
    tok_stream_free(s);
    tok_stream_free(NULL);
    tok_free(NULL);
}

/* ---- chat ---- */

static void check_prompt(const chat_message *m, size_t n, chat_format f, int gen, int think,
                         const char *want) {
    chat_options o;
    chat_options_default(&o);
    o.format = f;
    o.add_generation_prompt = gen;
    o.enable_thinking = think;
    char buf[1024];
    size_t len = 0;
    g5_error err = {0};
    g5_status st = chat_build_prompt(m, n, &o, buf, sizeof buf, &len, &err);
    T_CHECK(st == G5_OK && len == strlen(want) && memcmp(buf, want, len) == 0,
            "prompt differs:\n  got  '%.*s'\n  want '%s' (%s)", (int)len, buf, want, err.msg);
}

static void test_chat(const tok_ctx *tok, json_t *specials) {
    chat_message su[] = {{.role = "system", .content = "You are helpful."}, {.role = "user", .content = "Hello"}};
    check_prompt(su, 2, CHAT_FORMAT_GLM5, 1, 1,
                 "[gMASK]<sop><|system|>You are helpful.<|user|>Hello<|assistant|><think>");
    check_prompt(su, 2, CHAT_FORMAT_GLM5, 1, 0,
                 "[gMASK]<sop><|system|>You are helpful.<|user|>Hello<|assistant|></think>");
    check_prompt(su, 2, CHAT_FORMAT_GLM5, 0, 1, "[gMASK]<sop><|system|>You are helpful.<|user|>Hello");
    check_prompt(su, 2, CHAT_FORMAT_GLM45, 1, 1,
                 "[gMASK]<sop><|system|>\nYou are helpful.<|user|>\nHello<|assistant|>");
    check_prompt(su, 2, CHAT_FORMAT_GLM45, 1, 0,
                 "[gMASK]<sop><|system|>\nYou are helpful.<|user|>\nHello/nothink<|assistant|>\n"
                 "<think></think>");
    chat_message nt[] = {{.role = "user", .content = "Hi /nothink"}};
    check_prompt(nt, 1, CHAT_FORMAT_GLM45, 1, 0,
                 "[gMASK]<sop><|user|>\nHi /nothink<|assistant|>\n<think></think>");

    /* History: reasoning before the last user message is dropped, after it kept. */
    chat_message hist[] = {{.role = "user", .content = "What is 2+2?"},
                           {.role = "assistant", .content = "<think>2+2=4</think>\n4"},
                           {.role = "user", .content = "What about 3+3?"},
                           {.role = "assistant", .content = "<think>\nadd them\n</think>\n\n6 "}};
    check_prompt(hist, 3, CHAT_FORMAT_GLM5, 1, 1,
                 "[gMASK]<sop><|user|>What is 2+2?<|assistant|></think>4<|user|>What about 3+3?"
                 "<|assistant|><think>");
    check_prompt(hist, 4, CHAT_FORMAT_GLM5, 0, 1,
                 "[gMASK]<sop><|user|>What is 2+2?<|assistant|></think>4<|user|>What about 3+3?"
                 "<|assistant|><think>add them</think>6");
    check_prompt(hist, 4, CHAT_FORMAT_GLM45, 0, 1,
                 "[gMASK]<sop><|user|>\nWhat is 2+2?<|assistant|>\n<think></think>\n4<|user|>\n"
                 "What about 3+3?<|assistant|>\n<think>add them</think>\n6");
    chat_message plain[] = {{.role = "user", .content = "hi"}, {.role = "assistant", .content = "  hello!  "}};
    check_prompt(plain, 2, CHAT_FORMAT_GLM5, 0, 1, "[gMASK]<sop><|user|>hi<|assistant|></think>hello!");
    check_prompt(plain, 2, CHAT_FORMAT_GLM45, 0, 1,
                 "[gMASK]<sop><|user|>\nhi<|assistant|>\n<think></think>\nhello!");
    chat_message tool[] = {{.role = "user", .content = "weather?"}, {.role = "tool", .content = "sunny"}, {.role = "tool", .content = "72F"}};
    check_prompt(tool, 3, CHAT_FORMAT_GLM5, 1, 1,
                 "[gMASK]<sop><|user|>weather?<|observation|><tool_response>sunny</tool_response>"
                 "<tool_response>72F</tool_response><|assistant|><think>");
    check_prompt(tool, 2, CHAT_FORMAT_GLM45, 1, 1,
                 "[gMASK]<sop><|user|>\nweather?<|observation|>\n<tool_response>\nsunny\n"
                 "</tool_response><|assistant|>");
    check_prompt(NULL, 0, CHAT_FORMAT_GLM5, 1, 1, "[gMASK]<sop><|assistant|><think>");

    chat_options o;
    chat_options_default(&o);
    char small[5];
    size_t len = 0;
    T_CHECK(chat_build_prompt(su, 2, &o, small, sizeof small, &len, NULL) == G5_ERR_BOUNDS &&
            len == strlen("[gMASK]<sop><|system|>You are helpful.<|user|>Hello<|assistant|><think>") &&
            memcmp(small, "[gMA", 4) == 0, "small buffer");
    chat_message bad[] = {{.role = "narrator", .content = "x"}};
    T_CHECK(chat_build_prompt(bad, 1, &o, NULL, 0, &len, NULL) == G5_ERR_INVALID_ARG, "bad role");
    o.format = (chat_format)7;
    T_CHECK(chat_build_prompt(su, 2, &o, NULL, 0, &len, NULL) == G5_ERR_INVALID_ARG, "bad format");

    /* Token ids: [gMASK] <sop> first, role markers as single special tokens. */
    chat_options_default(&o);
    char buf[512];
    T_CHECK(chat_build_prompt(su, 2, &o, buf, sizeof buf, &len, NULL) == G5_OK, "build");
    int32_t ids[512];
    size_t n = 0;
    T_CHECK(tok_encode(tok, buf, len, 1, ids, 512, &n, NULL) == G5_OK, "encode prompt");
    T_CHECK(n > 6 && ids[0] == json_special(specials, "[gMASK]") &&
            ids[1] == json_special(specials, "<sop>") && ids[2] == json_special(specials, "<|system|>") &&
            ids[n - 2] == json_special(specials, "<|assistant|>") &&
            ids[n - 1] == json_special(specials, "<think>"), "prompt ids");
    int users = 0;
    for (size_t k = 0; k < n; k++) users += ids[k] == json_special(specials, "<|user|>");
    T_CHECK(users == 1, "<|user|> appears %d times", users);
    /* The user text between the markers encodes as it does alone. */
    int32_t hello[16];
    size_t nh = 0;
    T_CHECK(tok_encode(tok, "Hello", 5, 1, hello, 16, &nh, NULL) == G5_OK && nh < 8, "Hello");
    int found = 0;
    for (size_t k = 0; k + nh <= n; k++)
        if (ids[k] == json_special(specials, "<|user|>") && memcmp(ids + k + 1, hello, nh * sizeof *hello) == 0)
            found = 1;
    T_CHECK(found, "user content tokens follow <|user|>");
}

/* ---- a GLM-5-sized synthetic vocabulary ---- */

typedef struct strset {
    uint32_t mask;
    int32_t *slot;
    char **s;
    uint32_t *len;
} strset;

static uint32_t fnv(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

/* Index of s, or -1 after recording `next` as its index when add is set. */
static int32_t strset_get(strset *t, char **strs, uint32_t *lens, const char *s, uint32_t n,
                          int32_t next, int add) {
    for (uint32_t i = fnv(s, n) & t->mask;; i = (i + 1) & t->mask) {
        int32_t k = t->slot[i];
        if (k < 0) {
            if (add) t->slot[i] = next;
            return -1;
        }
        if (lens[k] == n && memcmp(strs[k], s, n) == 0) return k;
    }
}

static void test_scaling(void) {
    const uint32_t n_tok = 150000, n_merge_target = 150000;
    char **tok = malloc(n_tok * sizeof *tok);
    uint32_t *tlen = malloc(n_tok * sizeof *tlen);
    int32_t *ttype = malloc(n_tok * sizeof *ttype);
    char **mer = malloc((n_merge_target + 10) * sizeof *mer);
    uint64_t *mlen = malloc((n_merge_target + 10) * sizeof *mlen);
    strset set = {(1u << 19) - 1, malloc((1u << 19) * sizeof(int32_t)), NULL, NULL};
    memset(set.slot, 0xff, (1u << 19) * sizeof(int32_t));
    uint32_t nt = 0, nm = 0;
    for (unsigned b = 0; b < 256; b++) { /* the 256 byte-level symbols */
        char u[4];
        uint32_t l = (uint32_t)put_cp(naive_byte_cp(b), u);
        tok[nt] = malloc(l);
        memcpy(tok[nt], u, l);
        tlen[nt] = l;
        ttype[nt] = TOK_TYPE_NORMAL;
        strset_get(&set, tok, tlen, u, l, (int32_t)nt, 1);
        nt++;
    }
    const char *sp[] = {"[gMASK]", "<sop>", "<|user|>", "<|assistant|>", "<think>"};
    uint32_t n_special = 5;
    /* Low ranks for space+letter and letter+letter, as a trained vocabulary would have. */
    for (unsigned x = 0; x < 27; x++) {
        for (unsigned y = 0; y < 26; y++) {
            uint32_t a = x < 26 ? 'a' + x : 0x20, b = 'a' + y; /* byte 0x20 is the space symbol */
            uint32_t l = tlen[a] + tlen[b];
            tok[nt] = malloc(l);
            memcpy(tok[nt], tok[a], tlen[a]);
            memcpy(tok[nt] + tlen[a], tok[b], tlen[b]);
            tlen[nt] = l;
            ttype[nt] = TOK_TYPE_NORMAL;
            strset_get(&set, tok, tlen, tok[nt], l, (int32_t)nt, 1);
            nt++;
            mer[nm] = malloc(l + 1);
            memcpy(mer[nm], tok[a], tlen[a]);
            mer[nm][tlen[a]] = ' ';
            memcpy(mer[nm] + tlen[a] + 1, tok[b], tlen[b]);
            mlen[nm++] = l + 1;
        }
    }
    /* Merges of two existing tokens, biased to letters and short tokens so ordinary text merges
     * deeply, until both counts are reached. */
    while (nt < n_tok - n_special || nm < n_merge_target) {
        uint32_t a, b;
        if (rndn(3) == 0) a = 'a' + rndn(26); else a = rndn(nt);
        if (rndn(3) == 0) b = 'a' + rndn(26); else b = rndn(nt < 3000 ? nt : 3000);
        if (tlen[a] + tlen[b] > 24) continue;
        char buf[64];
        memcpy(buf, tok[a], tlen[a]);
        memcpy(buf + tlen[a], tok[b], tlen[b]);
        uint32_t l = tlen[a] + tlen[b];
        int full = nt >= n_tok - n_special;
        int32_t have = strset_get(&set, tok, tlen, buf, l, (int32_t)nt, !full);
        if (have < 0) {
            if (full) continue;
            tok[nt] = malloc(l);
            memcpy(tok[nt], buf, l);
            tlen[nt] = l;
            ttype[nt] = TOK_TYPE_NORMAL;
            nt++;
        } else if (nm >= n_merge_target) {
            continue;
        }
        if (nm < n_merge_target) {
            mer[nm] = malloc(tlen[a] + 1 + tlen[b]);
            memcpy(mer[nm], tok[a], tlen[a]);
            mer[nm][tlen[a]] = ' ';
            memcpy(mer[nm] + tlen[a] + 1, tok[b], tlen[b]);
            mlen[nm] = tlen[a] + 1 + tlen[b];
            nm++;
        }
    }
    for (uint32_t i = 0; i < n_special; i++) {
        tlen[nt] = (uint32_t)strlen(sp[i]);
        tok[nt] = malloc(tlen[nt]);
        memcpy(tok[nt], sp[i], tlen[nt]);
        ttype[nt] = TOK_TYPE_CONTROL;
        nt++;
    }
    uint64_t *tlen64 = malloc(nt * sizeof *tlen64);
    for (uint32_t i = 0; i < nt; i++) tlen64[i] = tlen[i];

    gguf_writer *w = gguf_writer_create();
    T_CHECK(w != NULL, "writer");
    g5_status st = G5_OK;
    st |= gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2", 4);
    st |= gguf_writer_set_str(w, "tokenizer.ggml.pre", "glm4", 4);
    st |= gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tok, tlen64, nt);
    st |= gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, ttype, nt);
    st |= gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)mer, mlen, nm);
    st |= gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", nt - 1);
    T_CHECK(st == G5_OK, "writer setters");
    uint8_t *img = NULL;
    uint64_t img_len = 0;
    T_CHECK(gguf_writer_write_buffer(w, &img, &img_len) == G5_OK, "write buffer");
    gguf_ctx *g = NULL;
    g5_error err = {0};
    T_CHECK(gguf_parse_buffer(img, img_len, "synthetic", &g, &err) == G5_OK, "parse: %s", err.msg);

    /* A few KB of text: words from the alphabet, punctuation, digits, a special token. */
    static char text[6000];
    size_t len = 0;
    while (len < 5000) {
        size_t wl = 1 + rndn(9);
        text[len++] = ' ';
        for (size_t k = 0; k < wl; k++) text[len++] = (char)('a' + rndn(26));
        if (rndn(10) == 0) text[len++] = ',';
        if (rndn(40) == 0) len += (size_t)sprintf(text + len, " %u", rndn(100000));
        if (rndn(100) == 0) len += (size_t)sprintf(text + len, "<|user|>");
    }
    tok_ctx *t = NULL;
    double t0 = now_s();
    st = g ? tok_create(g, &t, &err) : G5_ERR_INTERNAL;
    double t1 = now_s();
    T_CHECK(st == G5_OK && tok_n_vocab(t) == nt, "create: %s", err.msg);
    static int32_t ids[6000];
    size_t n = 0;
    double t2 = now_s(), t3 = t2;
    if (t) {
        st = tok_encode(t, text, len, 1, ids, 6000, &n, &err);
        t3 = now_s();
        T_CHECK(st == G5_OK && n > 0 && n < len, "encode: %s", err.msg);
        static char back[6000];
        size_t nb = 0;
        T_CHECK(tok_decode(t, ids, n, TOK_DECODE_SPECIAL, back, sizeof back, &nb, NULL) == G5_OK &&
                nb == len && memcmp(back, text, len) == 0, "synthetic round trip");
        /* Merges must actually fire: far fewer ids than bytes. */
        T_CHECK(n * 3 < len * 2, "%zu ids for %zu bytes: merges do not apply", n, len);
    }
    printf("scaling: %u tokens, %u merges: create %.3f s, encode %zu bytes -> %zu ids %.4f s\n", nt,
           nm, t1 - t0, len, n, t3 - t2);
    tok_free(t);
    gguf_free(g);
    free(img);
    gguf_writer_free(w);
    for (uint32_t i = 0; i < nt; i++) free(tok[i]);
    for (uint32_t i = 0; i < nm; i++) free(mer[i]);
    free(tok); free(tlen); free(ttype); free(mer); free(mlen); free(tlen64); free(set.slot);
}

/* Refusals: wrong tokenizer model or pre-tokenizer, missing arrays, inconsistent types. */
static void test_refusals(void) {
    struct { const char *model, *pre; int tokens, types_n; g5_status want; } cases[] = {
        {"gpt2", "glm4", 1, 3, G5_OK},
        {"llama", "glm4", 1, 3, G5_ERR_UNSUPPORTED},
        {"gpt2", "qwen2", 1, 3, G5_ERR_UNSUPPORTED},
        {"gpt2", "glm4", 0, 3, G5_ERR_NOT_FOUND},
        {"gpt2", "glm4", 1, 2, G5_ERR_FORMAT},
    };
    const char *toks[] = {"a", "b", "ab"};
    uint64_t tl[] = {1, 1, 2};
    const char *merges[] = {"a b"};
    uint64_t ml[] = {3};
    int32_t types[] = {1, 1, 1};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gguf_writer *w = gguf_writer_create();
        gguf_writer_set_str(w, "tokenizer.ggml.model", cases[i].model, strlen(cases[i].model));
        gguf_writer_set_str(w, "tokenizer.ggml.pre", cases[i].pre, strlen(cases[i].pre));
        if (cases[i].tokens) gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, tl, 3);
        gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, types,
                            (uint64_t)cases[i].types_n);
        gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, ml, 1);
        uint8_t *img = NULL;
        uint64_t len = 0;
        gguf_ctx *g = NULL;
        tok_ctx *t = NULL;
        g5_error err = {0};
        g5_status st = G5_ERR_INTERNAL;
        if (gguf_writer_write_buffer(w, &img, &len) == G5_OK &&
            gguf_parse_buffer(img, len, "refusal", &g, NULL) == G5_OK)
            st = tok_create(g, &t, &err);
        T_CHECK(st == cases[i].want, "case %zu: status %d (%s), want %d", i, (int)st, err.msg,
                (int)cases[i].want);
        T_CHECK(st != G5_OK || t, "case %zu: no context", i);
        T_CHECK(st == G5_OK || (t == NULL && err.msg[0]), "case %zu: no message", i);
        if (t) {
            int32_t ids[4];
            size_t n = 0;
            T_CHECK(tok_encode(t, "ab", 2, 0, ids, 4, &n, NULL) == G5_OK && n == 1 && ids[0] == 2,
                    "tiny vocab merges a+b");
        }
        tok_free(t);
        gguf_free(g);
        free(img);
        gguf_writer_free(w);
    }
}

int main(void) {
    gguf_ctx *g = NULL;
    g5_error err = {0};
    g5_status st = gguf_open(T_ORACLE_GGUF, &g, &err);
    T_CHECK(st == G5_OK, "open oracle GGUF: %s", err.msg);
    tok_ctx *tok = NULL;
    if (g) {
        double t0 = now_s();
        st = tok_create(g, &tok, &err);
        T_CHECK(st == G5_OK, "tok_create: %s", err.msg);
        printf("oracle vocabulary: %u tokens, created in %.4f s\n", tok_n_vocab(tok), now_s() - t0);
    }
    json_error_t je;
    json_t *ref = json_load_file(t_shared("oracle/glm5-tiny/reference.json"), 0, &je);
    T_CHECK(ref != NULL, "reference.json: %s", je.text);
    json_t *specials = ref ? json_object_get(ref, "specials") : NULL;
    if (tok && specials) {
        T_CHECK(tok_n_vocab(tok) == 2048, "vocab size %u", tok_n_vocab(tok));
        test_oracle_cases(tok);
        test_specials(tok, specials);
        naive_vocab v;
        memset(&v, 0, sizeof v);
        T_CHECK(load_naive(g, &v) == 0, "naive vocabulary");
        test_naive_bpe(tok, &v);
        free_naive(&v);
        test_round_trip(tok, specials);
        test_api_edges(tok);
        test_chat(tok, specials);
    }
    test_refusals();
    test_scaling();
    json_decref(ref);
    tok_free(tok);
    gguf_free(g);
    return t_report("test_tokenizer");
}
