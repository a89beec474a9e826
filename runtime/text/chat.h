/* Chat prompt formatting for GLM models.
 *
 * The published GGUFs of GLM-5 carry a Jinja chat template; we do not interpret Jinja but
 * reproduce what the official templates render (HF's renderer trims the first newline after a
 * block tag, so the layout is exactly the text below), for plain text messages without tools:
 *
 * CHAT_FORMAT_GLM5 (zai-org GLM-5 / GLM-4.7 chat_template.jinja, the default):
 *   "[gMASK]<sop>"
 *   system:    "<|system|>" + content
 *   user:      "<|user|>" + content
 *   assistant: "<|assistant|>" + ("<think>" + reasoning.strip() + "</think>"  if the message
 *              comes after the last user message and has reasoning, else "</think>")
 *              + content.strip()
 *   tool:      "<|observation|>" (only before the first of consecutive tool messages)
 *              + "<tool_response>" + content + "</tool_response>"
 *   generation prompt: "<|assistant|><think>" (thinking on) or "<|assistant|></think>" (off)
 *   tools (chat_options.tools, when there is at least one), right after "[gMASK]<sop>":
 *              "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the
 *              user query.\n\nYou are provided with function signatures within <tools></tools>
 *              XML tags:\n<tools>\n" + (tool JSON + "\n") for each tool + "</tools>\n\nFor each
 *              function call, output the function name and arguments within the following XML
 *              format:\n<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>
 *              {arg-value-1}</arg_value><arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}
 *              </arg_value>...</tool_call>" (one line, no breaks inside the tag example); the
 *              template writes each tool with Jinja's tojson (Python json.dumps, ", " and ": "
 *              separators, keys in request order, non-ASCII as is): the caller passes that text.
 *   assistant tool calls, after the content: "<tool_call>" + name + ("<arg_key>" + key +
 *              "</arg_key><arg_value>" + value + "</arg_value>") per argument + "</tool_call>",
 *              a string value as is, any other as its tojson text (the caller renders values).
 *   An assistant message's reasoning_content, when given, is used instead of splitting it out
 *   of the content.
 *
 * CHAT_FORMAT_GLM45 (zai-org GLM-4.5 / GLM-4.6 chat_template):
 *   "[gMASK]<sop>"
 *   system:    "<|system|>\n" + content
 *   user:      "<|user|>\n" + content + ("/nothink" if thinking is off and content does not
 *              already end with it)
 *   assistant: "<|assistant|>" + ("\n<think>" + reasoning.strip() + "</think>" if after the
 *              last user message and has reasoning, else "\n<think></think>")
 *              + ("\n" + content.strip() if that is not empty)
 *   tool:      "<|observation|>" (before the first of consecutive tool messages)
 *              + "\n<tool_response>\n" + content + "\n</tool_response>"
 *   generation prompt: "<|assistant|>" (thinking on) or "<|assistant|>\n<think></think>" (off)
 *
 * An assistant message's reasoning is the text of its content between "<think>" and "</think>"
 * as the templates split it: reasoning = content before the first "</think>", cut after its
 * last "<think>", with newlines trimmed at both ends; the visible content is what follows the
 * last "</think>" with leading newlines trimmed. strip() removes ASCII whitespace (Python's
 * str.strip also removes Unicode spaces; a message starting or ending in one differs).
 *
 * Encode the result with tok_encode(..., parse_special = 1): the role markers are special
 * tokens. Message text that happens to spell a special token becomes that token, exactly as
 * with Hugging Face's apply_chat_template followed by encode. */
#ifndef G5_CHAT_H
#define G5_CHAT_H

#include <stddef.h>

#include "format/status.h"

typedef enum chat_format {
    CHAT_FORMAT_GLM5 = 0,
    CHAT_FORMAT_GLM45 = 1,
} chat_format;

/* One tool call of an assistant message, its argument values already rendered as text. */
typedef struct chat_tool_call {
    const char *name;
    const char *const *arg_keys;   /* [n_args] */
    const char *const *arg_values; /* [n_args] */
    size_t n_args;
} chat_tool_call;

typedef struct chat_message {
    const char *role;    /* "system", "user", "assistant" or "tool"; NUL-terminated */
    const char *content; /* NUL-terminated UTF-8 */
    const char *reasoning;            /* assistant: reasoning_content, or NULL (split from content) */
    const chat_tool_call *tool_calls; /* assistant: [n_tool_calls] (GLM5 format only) */
    size_t n_tool_calls;
} chat_message;

typedef struct chat_options {
    chat_format format;
    int add_generation_prompt; /* end with the assistant's opening so the model answers */
    int enable_thinking;       /* 1: the model reasons in <think>...</think> first */
    const char *const *tools;  /* [n_tools] each tool's JSON text (GLM5 format only) */
    size_t n_tools;
} chat_options;

/* GLM5 format, generation prompt on, thinking on. */
void chat_options_default(chat_options *o);

/* Writes the prompt text (no NUL terminator) into out; *n_out receives its full length.
 * G5_ERR_BOUNDS if cap is too small (nothing past cap is written; call again with *n_out),
 * G5_ERR_INVALID_ARG for an unknown role or a NULL field, G5_ERR_UNSUPPORTED for tools or
 * tool calls in the GLM45 format. */
g5_status chat_build_prompt(const chat_message *msgs, size_t n_msgs, const chat_options *opts,
                            char *out, size_t cap, size_t *n_out, g5_error *err);

#endif
