/* Parsing GLM-5 output into reasoning, visible content and tool calls, the inverse of chat.h.
 *
 * The model's text (decoded with the markers' special tokens rendered as their text) looks like
 *     [reasoning]</think>[content][<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>
 *     ...</tool_call>]...
 * where the reasoning part is there when the prompt ended in "<think>" (thinking on). The parser
 * is fed the text in pieces, as it is generated, and keeps three growing results:
 *  - reasoning: the text before "</think>" (thinking on), or after a "<think>" that opens the
 *    content (GLM-4.5 style, or a model that thinks although told not to) up to "</think>";
 *  - content: the rest, with every complete tool call cut out;
 *  - tool calls: NAME (whitespace trimmed) and the (key, value) pairs, keys trimmed, values as
 *    written (GLM-4.5 puts newlines around them: one leading and one trailing newline dropped).
 * A tool call whose name is empty or whose arguments are not well-formed pairs (or that holds
 * a NUL byte) stays in the content as written. A suffix that may be the start of a marker is held back until the next
 * piece decides it (chat_parser_finish releases it), so what has been reported never changes:
 * a streaming client is sent the growth of each result.
 *
 * Pure functions over (buf, len): no model, no tokenizer. */
#ifndef G5_CHAT_PARSE_H
#define G5_CHAT_PARSE_H

#include <stddef.h>

#include "format/status.h"

typedef struct chat_parser chat_parser;

typedef struct chat_parsed_call {
    char *name;
    char **keys, **values; /* [n_args], NUL-terminated */
    size_t n_args;
} chat_parsed_call;

/* in_reasoning: the prompt ended inside a <think> block. tools: cut out tool calls (else
 * "<tool_call>" is plain content). */
g5_status chat_parser_create(int in_reasoning, int tools, chat_parser **out, g5_error *err);
void chat_parser_free(chat_parser *p); /* accepts NULL */
/* G5_ERR_NOMEM leaves the parser failed (every later call fails too). */
g5_status chat_parser_feed(chat_parser *p, const char *text, size_t len, g5_error *err);
/* The end of the output: held-back text is released; an unterminated tool call becomes a call
 * if it has a name and well-formed arguments so far (the generation stopped inside it),
 * otherwise content. */
g5_status chat_parser_finish(chat_parser *p, g5_error *err);

/* The results so far (NUL-terminated; valid until the next feed/finish). */
const char *chat_parser_reasoning(const chat_parser *p, size_t *len);
const char *chat_parser_content(const chat_parser *p, size_t *len);
size_t chat_parser_n_calls(const chat_parser *p);
const chat_parsed_call *chat_parser_call(const chat_parser *p, size_t i);
/* 1 once any "</think>" or "<think>" marker was seen. */
int chat_parser_saw_think(const chat_parser *p);

#endif
