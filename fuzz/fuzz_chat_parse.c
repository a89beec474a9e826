/* libFuzzer target: arbitrary model output through the GLM-5 output parser (chat_parse.h).
 * The first byte picks thinking on/off, tool parsing on/off and a piece size; the rest is fed
 * whole to one parser and in pieces to another. Properties checked: both give the same
 * reasoning, content and tool calls, and every partial result of the piecewise parser is a
 * prefix of its final one (what was streamed never changes). */
#include "runtime/text/chat_parse.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int prefix_of(const char *a, size_t na, const char *b, size_t nb) {
    return na <= nb && memcmp(a, b, na) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int think = data[0] & 1, tools = (data[0] >> 1) & 1;
    const size_t piece = (size_t)(data[0] >> 2) + 1;
    const char *text = (const char *)data + 1;
    const size_t len = size - 1;
    chat_parser *w = NULL, *p = NULL;
    if (chat_parser_create(think, tools, &w, NULL) != G5_OK) return 0;
    if (chat_parser_create(think, tools, &p, NULL) != G5_OK) {
        chat_parser_free(w);
        return 0;
    }
    chat_parser_feed(w, text, len, NULL);
    chat_parser_finish(w, NULL);
    size_t wr, wc, r0 = 0, c0 = 0;
    const char *wrs = chat_parser_reasoning(w, &wr), *wcs = chat_parser_content(w, &wc);
    size_t calls0 = 0;
    for (size_t off = 0; off < len; off += piece) {
        size_t k = len - off < piece ? len - off : piece;
        chat_parser_feed(p, text + off, k, NULL);
        size_t rl, cl;
        const char *r = chat_parser_reasoning(p, &rl), *c = chat_parser_content(p, &cl);
        /* growing, and already equal to the whole parse where it got to */
        if (rl < r0 || cl < c0 || !prefix_of(r, rl, wrs, wr) || !prefix_of(c, cl, wcs, wc)) abort();
        if (chat_parser_n_calls(p) < calls0 || chat_parser_n_calls(p) > chat_parser_n_calls(w)) abort();
        r0 = rl;
        c0 = cl;
        calls0 = chat_parser_n_calls(p);
    }
    chat_parser_finish(p, NULL);
    size_t pr, pc;
    const char *prs = chat_parser_reasoning(p, &pr), *pcs = chat_parser_content(p, &pc);
    if (pr != wr || pc != wc || memcmp(prs, wrs, wr) || memcmp(pcs, wcs, wc)) abort();
    if (chat_parser_n_calls(p) != chat_parser_n_calls(w)) abort();
    for (size_t i = 0; i < chat_parser_n_calls(p); i++) {
        const chat_parsed_call *a = chat_parser_call(p, i), *b = chat_parser_call(w, i);
        if (strcmp(a->name, b->name) || a->n_args != b->n_args || !a->name[0]) abort();
        for (size_t j = 0; j < a->n_args; j++)
            if (strcmp(a->keys[j], b->keys[j]) || strcmp(a->values[j], b->values[j])) abort();
    }
    chat_parser_free(w);
    chat_parser_free(p);
    return 0;
}
