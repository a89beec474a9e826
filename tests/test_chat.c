/* GLM-5 chat semantics as pure functions:
 *  - chat_build_prompt with tools, assistant tool calls, reasoning_content and tool results,
 *    against hand-rendered texts of GLM-5's (GLM-4.7's) chat_template.jinja, and the prompt's
 *    markers encoding to the oracle tokenizer's real special tokens (single ids);
 *  - chat_parser on hand-written model outputs: reasoning / content / tool calls, whole and fed
 *    in every split (byte by byte too) with identical results, malformed and unterminated calls,
 *    thinking off, tools off. */
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "runtime/text/chat.h"
#include "runtime/text/chat_parse.h"
#include "runtime/text/tokenizer.h"
#include "tests/test_util.h"

static char *build(const chat_message *m, size_t n, const chat_options *o, g5_status *st) {
    size_t need = 0;
    *st = chat_build_prompt(m, n, o, NULL, 0, &need, NULL);
    if (*st != G5_OK && *st != G5_ERR_BOUNDS) return NULL;
    char *b = malloc(need + 1);
    *st = chat_build_prompt(m, n, o, b, need, &need, NULL);
    b[need] = 0;
    return b;
}

#define TOOLS_HEAD                                                                                  \
    "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"  \
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
#define TOOLS_TAIL                                                                                  \
    "</tools>\n\nFor each function call, output the function name and arguments within the "        \
    "following XML format:\n<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>"    \
    "{arg-value-1}</arg_value><arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>"   \
    "...</tool_call>"

static const char *k_tool_weather =
    "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather "
    "of a city\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": "
    "\"string\"}}, \"required\": [\"city\"]}}}";

static void test_template(const tok_ctx *tok) {
    const char *tools[] = {k_tool_weather, "{\"type\": \"function\", \"function\": {\"name\": \"now\"}}"};
    chat_options o;
    chat_options_default(&o);
    o.tools = tools;
    o.n_tools = 2;
    const char *keys[] = {"city", "days"}, *vals[] = {"Paris", "3"};
    chat_tool_call tc[] = {{.name = "get_weather", .arg_keys = keys, .arg_values = vals, .n_args = 2},
                           {.name = "now"}};
    chat_message m[] = {
        {.role = "system", .content = "Be brief."},
        {.role = "user", .content = "Weather in Paris?"},
        {.role = "assistant", .content = " Let me check. ", .reasoning = " need the tool\n",
         .tool_calls = tc, .n_tool_calls = 2},
        {.role = "tool", .content = "{\"temp\": 21}"},
        {.role = "tool", .content = "12:00"},
    };
    g5_status st;
    char *p = build(m, 5, &o, &st);
    const char *want = "[gMASK]<sop>" TOOLS_HEAD
                       "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
                       "\"Weather of a city\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": "
                       "{\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n"
                       "{\"type\": \"function\", \"function\": {\"name\": \"now\"}}\n" TOOLS_TAIL
                       "<|system|>Be brief.<|user|>Weather in Paris?<|assistant|><think>need the tool</think>"
                       "Let me check.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
                       "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call><tool_call>now</tool_call>"
                       "<|observation|><tool_response>{\"temp\": 21}</tool_response><tool_response>12:00"
                       "</tool_response><|assistant|><think>";
    T_CHECK(st == G5_OK && p && strcmp(p, want) == 0, "tools prompt:\n got  %s\n want %s", p ? p : "-", want);

    /* The markers are the tokenizer's special tokens, one id each. */
    if (tok && p) {
        size_t len = strlen(p), n = 0;
        int32_t *ids = malloc(len * sizeof *ids);
        T_CHECK(tok_encode(tok, p, len, 1, ids, len, &n, NULL) == G5_OK, "encode");
        const char *marks[] = {"<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
                               "</arg_value>", "<tool_response>", "</tool_response>", "<|observation|>",
                               "<think>", "</think>"};
        for (size_t k = 0; k < sizeof marks / sizeof marks[0]; k++) {
            int32_t id = tok_lookup(tok, marks[k], strlen(marks[k]));
            size_t count = 0;
            for (size_t i = 0; i < n; i++) count += ids[i] == id;
            T_CHECK(id >= 0 && tok_token_type(tok, id) == TOK_TYPE_CONTROL && count >= 1,
                    "%s: id %d, %zu times", marks[k], id, count);
        }
        T_CHECK(tok_lookup(tok, "<tool_call>", 11) == 2039 && tok_lookup(tok, "</arg_value>", 12) == 2046,
                "oracle ids of <tool_call> / </arg_value>");
        free(ids);
    }
    free(p);

    /* Reasoning of an assistant message before the last user message is dropped; given
     * reasoning_content wins over a <think> block in the content (the content is kept as is). */
    chat_options_default(&o);
    chat_message h[] = {{.role = "user", .content = "a"},
                        {.role = "assistant", .content = "b", .reasoning = "r1"},
                        {.role = "user", .content = "c"},
                        {.role = "assistant", .content = "d", .reasoning = ""}};
    p = build(h, 4, &o, &st);
    T_CHECK(st == G5_OK && p && strcmp(p, "[gMASK]<sop><|user|>a<|assistant|></think>b<|user|>c<|assistant|></think>d<|assistant|><think>") == 0,
            "history: %s", p ? p : "-");
    free(p);
    o.enable_thinking = 0;
    p = build(h, 1, &o, &st);
    T_CHECK(st == G5_OK && p && strcmp(p, "[gMASK]<sop><|user|>a<|assistant|></think>") == 0, "no think: %s", p ? p : "-");
    free(p);

    /* Tools are GLM-5 only; a tool call needs an assistant message; NULL fields refused. */
    o.format = CHAT_FORMAT_GLM45;
    o.tools = tools;
    o.n_tools = 1;
    size_t need;
    T_CHECK(chat_build_prompt(h, 1, &o, NULL, 0, &need, NULL) == G5_ERR_UNSUPPORTED, "glm45 tools");
    chat_options_default(&o);
    chat_message bad[] = {{.role = "user", .content = "x", .tool_calls = tc, .n_tool_calls = 1}};
    T_CHECK(chat_build_prompt(bad, 1, &o, NULL, 0, &need, NULL) == G5_ERR_UNSUPPORTED, "user tool call");
    chat_tool_call nul = {.name = NULL};
    chat_message bad2[] = {{.role = "assistant", .content = "x", .tool_calls = &nul, .n_tool_calls = 1}};
    T_CHECK(chat_build_prompt(bad2, 1, &o, NULL, 0, &need, NULL) == G5_ERR_INVALID_ARG, "NULL name");
}

/* ---- parser ---- */

typedef struct want_call {
    const char *name;
    const char *kv[8]; /* key, value, ... NULL */
} want_call;

/* Parses text whole, then in pieces of every size from 1 to 13, and checks each result. */
static void check_parse(const char *label, const char *text, int think, int tools, const char *reasoning,
                        const char *content, const want_call *calls, size_t n_calls) {
    size_t len = strlen(text);
    for (size_t piece = 0; piece <= 13; piece++) {
        chat_parser *p = NULL;
        T_CHECK(chat_parser_create(think, tools, &p, NULL) == G5_OK, "create");
        if (!p) return;
        if (piece == 0) {
            chat_parser_feed(p, text, len, NULL);
        } else {
            size_t prev_r = 0, prev_c = 0;
            int monotone = 1;
            for (size_t off = 0; off < len; off += piece) {
                size_t k = len - off < piece ? len - off : piece;
                chat_parser_feed(p, text + off, k, NULL);
                size_t rl, cl;
                const char *r = chat_parser_reasoning(p, &rl), *c = chat_parser_content(p, &cl);
                /* what was reported is a prefix of the final result */
                monotone &= rl >= prev_r && cl >= prev_c && strncmp(r, reasoning, rl) == 0 &&
                            strncmp(c, content, cl) == 0;
                prev_r = rl;
                prev_c = cl;
            }
            T_CHECK(monotone, "%s: pieces of %zu: a partial result is not a prefix of the final one", label, piece);
        }
        chat_parser_finish(p, NULL);
        size_t rl, cl;
        const char *r = chat_parser_reasoning(p, &rl), *c = chat_parser_content(p, &cl);
        T_CHECK(rl == strlen(reasoning) && memcmp(r, reasoning, rl) == 0, "%s/%zu: reasoning '%s' want '%s'",
                label, piece, r, reasoning);
        T_CHECK(cl == strlen(content) && memcmp(c, content, cl) == 0, "%s/%zu: content '%s' want '%s'", label,
                piece, c, content);
        T_CHECK(chat_parser_n_calls(p) == n_calls, "%s/%zu: %zu calls, want %zu", label, piece,
                chat_parser_n_calls(p), n_calls);
        for (size_t i = 0; i < n_calls && i < chat_parser_n_calls(p); i++) {
            const chat_parsed_call *pc = chat_parser_call(p, i);
            int ok = strcmp(pc->name, calls[i].name) == 0;
            size_t na = 0;
            while (calls[i].kv[2 * na]) na++;
            ok &= pc->n_args == na;
            for (size_t a = 0; ok && a < na; a++)
                ok &= strcmp(pc->keys[a], calls[i].kv[2 * a]) == 0 && strcmp(pc->values[a], calls[i].kv[2 * a + 1]) == 0;
            T_CHECK(ok, "%s/%zu: call %zu (%s, %zu args)", label, piece, i, pc->name, pc->n_args);
        }
        chat_parser_free(p);
    }
}

static void test_parser(void) {
    check_parse("reasoning", "The user greets me.</think>Hello!", 1, 0, "The user greets me.", "Hello!", NULL, 0);
    check_parse("unfinished reasoning", "thinking still <", 1, 0, "thinking still <", "", NULL, 0);
    check_parse("no think", "Hi <there> </thin", 0, 1, "", "Hi <there> </thin", NULL, 0);
    check_parse("think opens content", "\n<think>hmm</think>\nok", 0, 0, "hmm", "\n\nok", NULL, 0);
    check_parse("late think is text", "a <think>b</think>", 0, 0, "", "a <think>b</think>", NULL, 0);
    want_call w1[] = {{"get_weather", {"city", "Paris", "days", "3", NULL}}};
    check_parse("one call",
                "Need weather.</think>Checking.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris"
                "</arg_value><arg_key>days</arg_key><arg_value>3</arg_value></tool_call>",
                1, 1, "Need weather.", "Checking.", w1, 1);
    want_call w2[] = {{"f", {"x", "1 < 2", NULL}}, {"g", {NULL}}, {"h", {"q", "line1\nline2", NULL}}};
    check_parse("three calls, GLM-4.5 spacing",
                "</think><tool_call>f\n<arg_key>x</arg_key>\n<arg_value>1 < 2</arg_value>\n</tool_call>\n"
                "<tool_call> g </tool_call><tool_call>h\n<arg_key> q </arg_key>\n<arg_value>\nline1\nline2\n"
                "</arg_value>\n</tool_call>",
                1, 1, "", "\n", w2, 3);
    check_parse("tools off",
                "<tool_call>f<arg_key>x</arg_key><arg_value>1</arg_value></tool_call>", 0, 0, "",
                "<tool_call>f<arg_key>x</arg_key><arg_value>1</arg_value></tool_call>", NULL, 0);
    check_parse("malformed call stays content", "<tool_call>f<arg_key>x</arg_key>oops</tool_call>done", 0, 1, "",
                "<tool_call>f<arg_key>x</arg_key>oops</tool_call>done", NULL, 0);
    check_parse("empty name", "<tool_call>  </tool_call>", 0, 1, "", "<tool_call>  </tool_call>", NULL, 0);
    want_call w3[] = {{"f", {"x", "1", NULL}}};
    check_parse("unterminated call", "<tool_call>f<arg_key>x</arg_key><arg_value>1</arg_value>", 0, 1, "", "", w3, 1);
    check_parse("unterminated bad call", "<tool_call>f<arg_key>x</arg", 0, 1, "", "<tool_call>f<arg_key>x</arg",
                NULL, 0);
    check_parse("utf-8", "é思考</think>答え<tool_call>天気<arg_key>都市</arg_key><arg_value>東京</arg_value></tool_call>",
                1, 1, "é思考", "答え", (want_call[]){{"天気", {"都市", "東京", NULL}}}, 1);
}

int main(void) {
    gguf_ctx *g = NULL;
    tok_ctx *tok = NULL;
    if (gguf_open(T_ORACLE_GGUF, &g, NULL) == G5_OK) tok_create(g, &tok, NULL);
    T_CHECK(tok != NULL, "oracle tokenizer (%s)", T_ORACLE_GGUF);
    gguf_free(g);
    test_template(tok);
    test_parser();
    tok_free(tok);
    return t_report("test_chat");
}
