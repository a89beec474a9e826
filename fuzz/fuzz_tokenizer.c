/* libFuzzer target: arbitrary bytes (invalid UTF-8 included) through the tokenizer, the
 * streaming decoder, the chat formatter and the stop-string helpers. Properties checked:
 * every byte string round-trips through encode/decode, the stream's output adds up to the full
 * decode, and no id is out of range. The vocabulary is a small one built in memory (all 256
 * byte symbols, a few merges, CONTROL and USER_DEFINED tokens), so no files are needed. */
#include "runtime/text/chat.h"
#include "runtime/text/sample.h"
#include "runtime/text/tokenizer.h"
#include "fuzz/fuzz_vocab.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static tok_ctx *g_tok;

static tok_ctx *make_vocab(void) {
    static const char *const extra[] = {"\xc4\xa0\xc4\xa0", "th", "the", "\xc4\xa0t", "\xc4\xa0the",
                                        "in", "ing", "\xc4\x8a\xc4\x8a", "<|user|>", "[gMASK]", "<sop>",
                                        "<x>", "<|assistant|>"};
    static const int32_t extra_type[] = {1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 4, 3};
    static const char *const merges[] = {"\xc4\xa0 \xc4\xa0", "t h", "th e", "\xc4\xa0 t",
                                         "\xc4\xa0t he", "i n", "in g", "\xc4\x8a \xc4\x8a"};
    return fuzz_byte_vocab(extra, extra_type, 13, merges, 8, 256 + 8);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_tok) g_tok = make_vocab();
    if (size == 0) return 0;
    int parse_special = data[0] & 1;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;

    int32_t *ids = malloc((len + 1) * sizeof *ids);
    char *back = malloc(len + 1);
    size_t n = 0, nb = 0;
    if (tok_encode(g_tok, text, len, parse_special, ids, len + 1, &n, NULL) != G5_OK) abort();
    if (n > len) abort();
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= tok_n_vocab(g_tok)) abort();
    if (tok_decode(g_tok, ids, n, TOK_DECODE_SPECIAL, back, len + 1, &nb, NULL) != G5_OK) abort();
    if (nb != len || memcmp(back, text, len) != 0) abort();

    tok_stream *s = NULL;
    if (tok_stream_create(g_tok, TOK_DECODE_SPECIAL, &s, NULL) != G5_OK) abort();
    size_t got = 0;
    for (size_t i = 0; i < n; i++) {
        const char *p;
        size_t m;
        if (tok_stream_push(s, ids[i], &p, &m, NULL) != G5_OK) abort();
        if (got + m > len || memcmp(text + got, p, m) != 0) abort();
        got += m;
        if (tok_stream_pending(s) > 3) abort();
    }
    const char *p;
    size_t m;
    tok_stream_flush(s, &p, &m);
    if (got + m != len || memcmp(text + got, p, m) != 0) abort();
    tok_stream_free(s);

    /* Chat: the input split at NUL bytes into messages with rotating roles. */
    char *copy = malloc(len + 1);
    memcpy(copy, text, len);
    copy[len] = 0;
    chat_message msgs[8];
    memset(msgs, 0, sizeof msgs);
    size_t nm = 0;
    static const char *roles[] = {"system", "user", "assistant", "tool"};
    for (char *c = copy; nm < 8 && c <= copy + len; c += strlen(c) + 1) {
        msgs[nm].role = roles[((data[0] >> 1) + nm) & 3];
        msgs[nm].content = c;
        nm++;
    }
    chat_options o;
    chat_options_default(&o);
    o.format = (data[0] >> 3) & 1 ? CHAT_FORMAT_GLM45 : CHAT_FORMAT_GLM5;
    o.enable_thinking = (data[0] >> 4) & 1;
    size_t need = 0;
    g5_status st = chat_build_prompt(msgs, nm, &o, NULL, 0, &need, NULL);
    if (st != G5_OK && st != G5_ERR_BOUNDS) abort();
    char *prompt = malloc(need + 1);
    size_t got_len = 0;
    if (chat_build_prompt(msgs, nm, &o, prompt, need, &got_len, NULL) != G5_OK || got_len != need)
        abort();

    const char *stops[] = {"<|user|>", "\n\n", "the"};
    size_t pos;
    int k = samp_stop_find(prompt, need, need < 5 ? need : 5, stops, 3, &pos);
    if (k >= 0 && (pos + strlen(stops[k]) > need || memcmp(prompt + pos, stops[k], strlen(stops[k]))))
        abort();
    if (samp_stop_holdback(prompt, need, stops, 3) > 7) abort();

    free(prompt);
    free(copy);
    free(ids);
    free(back);
    return 0;
}
