/* glm5-serve's GLM-5 chat semantics and API surface over loopback, CPU engine, oracle model:
 *  - GET /v1/models/{id} (404 for another id), POST /tokenize and /detokenize (vLLM's and
 *    llama-server's fields) against the tokenizer, a chat with tools, tool calls and tool results
 *    tokenized as chat_build_prompt renders it;
 *  - requests that cannot be honoured: 404 for an unknown model, 400 naming the field for
 *    response_format json_object/json_schema, guided decoding, n > 1, bad tools / tool_choice /
 *    tool_calls, tools on /v1/completions;
 *  - reasoning_content / content / tool_calls of real greedy outputs equal the parser's reading of
 *    the returned token ids (the engine's text with the markers), streamed deltas joined equal
 *    the whole answer; thinking off gives no reasoning;
 *  - tool_choice named / required force "<tool_call>NAME" (thinking off: from the first token),
 *    and the forced call comes back as tool_calls (streamed too);
 *  - srv_api_parse called directly on bodies refused after part of them was taken apart
 *    (fuzz_http_body's leak input among them): 400 naming the field, and nothing left allocated
 *    (`make check`'s LeakSanitizer fails the program otherwise). */
#include <jansson.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "format/gguf.h"
#include "runtime/serve/serve.h"
#include "runtime/serve/serve_int.h"
#include "runtime/text/chat.h"
#include "runtime/text/chat_parse.h"
#include "runtime/text/tokenizer.h"
#include "tests/test_util.h"
#include "tests/http_client.h"

#define MODEL "glm5-tiny-UD-Q4_K_XL"

static tok_ctx *g_tok;

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void log_cb(void *user, const char *line) {
    (void)user;
    if (getenv("G5_SERVE_LOG")) fprintf(stderr, "%s\n", line);
}

/* POST (or GET when body is NULL); the parsed JSON body (NULL if none), *status. */
static json_t *call(uint16_t port, const char *method, const char *path, const char *body, int *status,
                    char **raw) {
    hresp h;
    json_t *j = NULL;
    *status = -1;
    if (http_do(port, method, path, NULL, body, &h) == 0) {
        *status = h.status;
        j = json_loadb(h.body, h.body_len, 0, NULL);
        if (raw) *raw = strdup(h.body);
    }
    hresp_free(&h);
    return j;
}

static const char *err_param(json_t *j) {
    return json_string_value(json_object_get(json_object_get(j, "error"), "param"));
}

static int ids_of(json_t *a, int32_t *ids, int cap) {
    int n = 0;
    for (size_t i = 0; i < json_array_size(a) && n < cap; i++) ids[n++] = (int32_t)json_integer_value(json_array_get(a, i));
    return n;
}

/* ---- endpoints ---- */

static void test_endpoints(uint16_t port) {
    int st;
    json_t *j = call(port, "GET", "/v1/models/" MODEL, NULL, &st, NULL);
    T_CHECK(st == 200 && !strcmp(json_string_value(json_object_get(j, "id")) ?: "", MODEL) &&
                json_integer_value(json_object_get(j, "max_model_len")) == 4096,
            "GET /v1/models/{id}: %d", st);
    json_decref(j);
    j = call(port, "GET", "/v1/models/other-model", NULL, &st, NULL);
    T_CHECK(st == 404 && err_param(j) && !strcmp(err_param(j), "model"), "unknown model id: %d", st);
    json_decref(j);
    j = call(port, "POST", "/v1/models/" MODEL, "{}", &st, NULL);
    T_CHECK(st == 405, "POST /v1/models/{id}: %d", st);
    json_decref(j);

    const char *text = "[gMASK]<sop>Hello world, tokens!";
    int32_t want[256];
    size_t nw = 0;
    tok_encode(g_tok, text, strlen(text), 1, want, 256, &nw, NULL);
    const char *bodies[] = {"{\"prompt\":\"[gMASK]<sop>Hello world, tokens!\",\"return_token_strs\":true}",
                            "{\"content\":\"[gMASK]<sop>Hello world, tokens!\",\"with_pieces\":true,\"model\":\"" MODEL "\"}"};
    for (int b = 0; b < 2; b++) {
        j = call(port, "POST", "/tokenize", bodies[b], &st, NULL);
        int32_t got[256];
        int n = ids_of(json_object_get(j, "tokens"), got, 256);
        json_t *strs = json_object_get(j, b ? "pieces" : "token_strs");
        T_CHECK(st == 200 && (size_t)n == nw && !memcmp(got, want, nw * sizeof *got) &&
                    json_integer_value(json_object_get(j, "count")) == (json_int_t)nw &&
                    json_array_size(strs) == nw && !strcmp(json_string_value(json_array_get(strs, 0)) ?: "", "[gMASK]"),
                "/tokenize %d: %d, %d ids vs %zu", b, st, n, nw);
        json_decref(j);
    }
    /* detokenize gives the text back (special tokens as their text) */
    json_t *req = json_object();
    json_t *a = json_array();
    for (size_t i = 0; i < nw; i++) json_array_append_new(a, json_integer(want[i]));
    json_object_set_new(req, "tokens", a);
    char *rb = json_dumps(req, 0);
    j = call(port, "POST", "/detokenize", rb, &st, NULL);
    T_CHECK(st == 200 && !strcmp(json_string_value(json_object_get(j, "prompt")) ?: "", text) &&
                !strcmp(json_string_value(json_object_get(j, "content")) ?: "", text),
            "/detokenize: %d", st);
    json_decref(j);
    free(rb);
    json_decref(req);
    static const struct { const char *path, *body; int status; const char *param; } bad[] = {
        {"/detokenize", "{\"tokens\":[1,99999]}", 400, "tokens"},
        {"/detokenize", "{\"tokens\":\"x\"}", 400, "tokens"},
        {"/detokenize", "{\"tokens\":[1],\"model\":\"nope\"}", 404, "model"},
        {"/tokenize", "{\"prompt\":5}", 400, "prompt"},
        {"/tokenize", "[1]", 400, NULL},
        {"/tokenize", "{\"prompt\":\"x\",\"model\":\"nope\"}", 404, "model"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        j = call(port, "POST", bad[i].path, bad[i].body, &st, NULL);
        const char *p = err_param(j);
        T_CHECK(st == bad[i].status && (bad[i].param ? p && !strcmp(p, bad[i].param) : 1), "%s %s: %d param %s",
                bad[i].path, bad[i].body, st, p ? p : "-");
        json_decref(j);
    }
    j = call(port, "GET", "/tokenize", NULL, &st, NULL);
    T_CHECK(st == 405, "GET /tokenize: %d", st);
    json_decref(j);
}

/* A conversation with tools, an assistant tool call and its results: the server's prompt tokens
 * are chat_build_prompt's with the tools as tojson writes them and the arguments rendered. */
static void test_tool_prompt(uint16_t port) {
    const char *body =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
        "{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"use the tool\",\"tool_calls\":[{\"id\":\"c1\","
        "\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Paris\\\", "
        "\\\"days\\\": 3, \\\"opts\\\": {\\\"unit\\\": \\\"C\\\", \\\"hourly\\\": [1, 2]}}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"21 C\"}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather\","
        "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}]}";
    const char *tools[] = {"{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
                           "\"Weather\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": "
                           "{\"type\": \"string\"}}, \"required\": [\"city\"]}}}"};
    const char *keys[] = {"city", "days", "opts"}, *vals[] = {"Paris", "3", "{\"unit\": \"C\", \"hourly\": [1, 2]}"};
    chat_tool_call tc = {.name = "get_weather", .arg_keys = keys, .arg_values = vals, .n_args = 3};
    chat_message m[] = {{.role = "user", .content = "Weather in Paris?"},
                        {.role = "assistant", .content = "", .reasoning = "use the tool", .tool_calls = &tc, .n_tool_calls = 1},
                        {.role = "tool", .content = "21 C"}};
    chat_options o;
    chat_options_default(&o);
    o.tools = tools;
    o.n_tools = 1;
    char buf[4096];
    size_t len = 0;
    T_CHECK(chat_build_prompt(m, 3, &o, buf, sizeof buf, &len, NULL) == G5_OK, "local prompt");
    int32_t want[4096];
    size_t nw = 0;
    tok_encode(g_tok, buf, len, 1, want, 4096, &nw, NULL);
    int st;
    json_t *j = call(port, "POST", "/tokenize", body, &st, NULL);
    int32_t got[4096];
    int n = ids_of(json_object_get(j, "tokens"), got, 4096);
    T_CHECK(st == 200 && (size_t)n == nw && !memcmp(got, want, nw * sizeof *got), "tool conversation tokens: %d, %d vs %zu\n%.*s",
            st, n, nw, (int)len, buf);
    json_decref(j);
    /* tool_choice "none": the tools are left out of the prompt */
    char body2[4096];
    snprintf(body2, sizeof body2, "%.*s,\"tool_choice\":\"none\"}", (int)strlen(body) - 1, body);
    o.n_tools = 0;
    chat_build_prompt(m, 3, &o, buf, sizeof buf, &len, NULL);
    tok_encode(g_tok, buf, len, 1, want, 4096, &nw, NULL);
    j = call(port, "POST", "/tokenize", body2, &st, NULL);
    n = ids_of(json_object_get(j, "tokens"), got, 4096);
    T_CHECK(st == 200 && (size_t)n == nw && !memcmp(got, want, nw * sizeof *got), "tool_choice none: no tools (%d vs %zu)", n, nw);
    json_decref(j);
}

static void test_refusals(uint16_t port) {
#define U "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"
#define T "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]"
    static const struct { const char *path, *body; int status; const char *param; } cases[] = {
        {"/v1/chat/completions", "{\"model\":\"gpt-4\"," U "}", 404, "model"},
        {"/v1/completions", "{\"model\":\"gpt-4\",\"prompt\":\"x\"}", 404, "model"},
        {"/v1/chat/completions", "{" U ",\"response_format\":{\"type\":\"json_object\"}}", 400, "response_format"},
        {"/v1/chat/completions", "{" U ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{}}}", 400, "response_format"},
        {"/v1/chat/completions", "{" U ",\"response_format\":\"json\"}", 400, "response_format"},
        {"/v1/completions", "{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_object\"}}", 400, "response_format"},
        {"/v1/chat/completions", "{" U ",\"guided_json\":{}}", 400, "guided_json"},
        {"/v1/chat/completions", "{" U ",\"n\":2}", 400, "n"},
        {"/v1/chat/completions", "{" U ",\"tools\":{}}", 400, "tools"},
        {"/v1/chat/completions", "{" U ",\"tools\":[{\"type\":\"function\"}]}", 400, "tools"},
        {"/v1/chat/completions", "{" U ",\"tools\":[{\"type\":\"retrieval\",\"function\":{\"name\":\"f\"}}]}", 400, "tools"},
        {"/v1/chat/completions", "{" U ",\"tool_choice\":\"required\"}", 400, "tool_choice"},
        {"/v1/chat/completions", "{" U "," T ",\"tool_choice\":\"sometimes\"}", 400, "tool_choice"},
        {"/v1/chat/completions", "{" U "," T ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g\"}}}", 400, "tool_choice"},
        {"/v1/chat/completions", "{" U "," T ",\"parallel_tool_calls\":1}", 400, "parallel_tool_calls"},
        {"/v1/completions", "{\"prompt\":\"x\"," T "}", 400, "tools"},
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"function\":"
                                 "{\"name\":\"f\",\"arguments\":\"[1]\"}}]}]}", 400, "messages"},
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{}]}]}", 400, "messages"},
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":3}]}", 400, "messages"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int st;
        json_t *j = call(port, "POST", cases[i].path, cases[i].body, &st, NULL);
        const char *p = err_param(j);
        const char *msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
        T_CHECK(st == cases[i].status && p && !strcmp(p, cases[i].param), "%s %s: %d param %s (%s)", cases[i].path,
                cases[i].body, st, p ? p : "-", msg ? msg : "-");
        json_decref(j);
    }
    /* what is fine: response_format text, the right model name, tool_choice auto / none */
    const char *ok[] = {"{" U ",\"response_format\":{\"type\":\"text\"},\"max_tokens\":1}",
                        "{\"model\":\"" MODEL "\"," U ",\"max_tokens\":1}",
                        "{" U "," T ",\"tool_choice\":\"auto\",\"max_tokens\":1}",
                        "{" U "," T ",\"tool_choice\":\"none\",\"max_tokens\":1}"};
    for (size_t i = 0; i < 4; i++) {
        int st;
        json_t *j = call(port, "POST", "/v1/chat/completions", ok[i], &st, NULL);
        T_CHECK(st == 200, "%s: %d", ok[i], st);
        json_decref(j);
    }
#undef U
#undef T
}

/* ---- outputs ---- */

/* The text the engine keeps for a chat: normal tokens' bytes, the parser's markers as text,
 * other control tokens nothing. */
static int is_marker(const char *t, size_t k) {
    static const char *const marks[] = {"<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>",
                                        "</arg_key>", "<arg_value>", "</arg_value>"};
    for (size_t i = 0; t && i < sizeof marks / sizeof marks[0]; i++)
        if (k == strlen(marks[i]) && !memcmp(t, marks[i], k)) return 1;
    return 0;
}

static size_t render_ids(const int32_t *ids, int n, char *out, size_t cap) {
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        size_t k = 0;
        const char *t = tok_token_text(g_tok, ids[i], &k);
        if (tok_token_type(g_tok, ids[i]) == TOK_TYPE_CONTROL && !is_marker(t, k)) continue;
        if (len + k < cap) memcpy(out + len, t, k);
        len += k;
    }
    if (len < cap) out[len] = 0;
    return len;
}

/* The response objects: the one body, or each SSE event of a streamed one. */
static json_t *events(json_t *j, const char *raw, int stream) {
    json_t *evs = json_array();
    if (!stream && j) json_array_append(evs, j);
    for (const char *p = raw; stream && p && (p = strstr(p, "data: "));) {
        p += 6;
        const char *e = strstr(p, "\n\n");
        if (!e) break;
        json_t *ev = json_loadb(p, (size_t)(e - p), 0, NULL);
        if (ev) json_array_append_new(evs, ev);
        p = e;
    }
    return evs;
}

typedef struct answer {
    int status;
    char reasoning[16384], content[16384];
    int has_reasoning;
    char names[8][128], args[8][1024];
    int n_calls;
    int32_t ids[512];
    int n_ids;
    char finish[32];
} answer;

static void cat(char *dst, size_t cap, const char *s) {
    if (s && strlen(dst) + strlen(s) < cap) strcat(dst, s);
}

/* A chat answer, streamed (deltas joined, tool calls by index) or not. */
static void chat(uint16_t port, const char *body, int stream, answer *a) {
    memset(a, 0, sizeof *a);
    char *raw = NULL;
    json_t *j = call(port, "POST", "/v1/chat/completions", body, &a->status, stream ? &raw : NULL);
    json_t *evs = events(j, raw, stream);
    size_t i;
    json_t *ev;
    json_array_foreach(evs, i, ev) {
        json_t *ch = json_array_get(json_object_get(ev, "choices"), 0);
        json_t *m = json_object_get(ch, stream ? "delta" : "message");
        cat(a->content, sizeof a->content, json_string_value(json_object_get(m, "content")));
        json_t *rc = json_object_get(m, "reasoning_content");
        if (json_is_string(rc)) a->has_reasoning = 1;
        cat(a->reasoning, sizeof a->reasoning, json_string_value(rc));
        json_t *tcs = json_object_get(m, "tool_calls");
        for (size_t k = 0; k < json_array_size(tcs); k++) {
            json_t *tc = json_array_get(tcs, k);
            size_t idx = stream ? (size_t)json_integer_value(json_object_get(tc, "index")) : k;
            if (idx >= 8) continue;
            if ((int)idx + 1 > a->n_calls) a->n_calls = (int)idx + 1;
            json_t *fn = json_object_get(tc, "function");
            cat(a->names[idx], sizeof a->names[idx], json_string_value(json_object_get(fn, "name")));
            cat(a->args[idx], sizeof a->args[idx], json_string_value(json_object_get(fn, "arguments")));
        }
        json_t *ids = json_object_get(ch, "token_ids");
        a->n_ids += ids_of(ids, a->ids + a->n_ids, 512 - a->n_ids);
        json_t *fr = json_object_get(ch, "finish_reason");
        if (json_is_string(fr)) snprintf(a->finish, sizeof a->finish, "%s", json_string_value(fr));
    }
    json_decref(evs);
    json_decref(j);
    free(raw);
}

/* The server's answer against the parser's reading of its own token ids. */
static void check_answer(const char *label, const answer *a, int think, int tools) {
    static char text[65536];
    size_t len = render_ids(a->ids, a->n_ids, text, sizeof text);
    chat_parser *p = NULL;
    chat_parser_create(think, tools, &p, NULL);
    chat_parser_feed(p, text, len, NULL);
    chat_parser_finish(p, NULL);
    size_t rl, cl;
    const char *r0 = chat_parser_reasoning(p, &rl), *c0 = chat_parser_content(p, &cl);
    char *r = srv_utf8_clean(r0, rl, NULL), *c = srv_utf8_clean(c0, cl, &cl); /* as the server sends it */
    int calls = (int)chat_parser_n_calls(p);
    T_CHECK(a->status == 200 && a->n_ids > 0, "%s: status %d, %d ids", label, a->status, a->n_ids);
    T_CHECK(!strcmp(a->reasoning, r) && (calls && strspn(c, " \n\t\r") == cl ? a->content[0] == 0 : !strcmp(a->content, c)),
            "%s: reasoning '%s' / '%s', content '%s' / '%s'", label, a->reasoning, r, a->content, c);
    T_CHECK(a->n_calls == calls, "%s: %d tool calls, parser %d", label, a->n_calls, calls);
    for (int i = 0; i < calls && i < a->n_calls; i++) {
        const char *nm = chat_parser_call(p, i)->name;
        char *clean = srv_utf8_clean(nm, strlen(nm), NULL);
        T_CHECK(clean && !strcmp(a->names[i], clean), "%s: call %d name '%s' vs '%s'", label, i, a->names[i], nm);
        free(clean);
    }
    chat_parser_free(p);
    free(r);
    free(c);
}

static void same_answer(const char *label, const answer *x, const answer *y) {
    int ok = x->n_ids == y->n_ids && !memcmp(x->ids, y->ids, (size_t)x->n_ids * sizeof *x->ids) &&
             !strcmp(x->reasoning, y->reasoning) && !strcmp(x->content, y->content) && x->n_calls == y->n_calls &&
             !strcmp(x->finish, y->finish);
    for (int i = 0; ok && i < x->n_calls; i++) ok = !strcmp(x->names[i], y->names[i]) && !strcmp(x->args[i], y->args[i]);
    T_CHECK(ok, "%s: streamed and whole answers differ ('%s'/'%s', '%s'/'%s', %d/%d calls, finish %s/%s)", label,
            x->reasoning, y->reasoning, x->content, y->content, x->n_calls, y->n_calls, x->finish, y->finish);
}

static void test_outputs(uint16_t port) {
    static answer a, b;
    const char *think = "{\"messages\":[{\"role\":\"user\",\"content\":\"Think, then answer: 2+2?\"}],\"max_tokens\":24,"
                        "\"temperature\":0,\"return_token_ids\":true,\"stream\":%s%s}";
    char body[2048];
    const char *tools = ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":"
                        "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}]";
    for (int t = 0; t < 2; t++) {
        snprintf(body, sizeof body, think, "false", t ? tools : "");
        chat(port, body, 0, &a);
        check_answer(t ? "thinking, tools" : "thinking", &a, 1, t);
        T_CHECK(a.has_reasoning && a.reasoning[0], "thinking on: reasoning_content '%s'", a.reasoning);
        snprintf(body, sizeof body, think, "true", t ? tools : "");
        chat(port, body, 1, &b);
        same_answer(t ? "thinking, tools" : "thinking", &a, &b);
    }
    const char *nothink = "{\"messages\":[{\"role\":\"user\",\"content\":\"Answer: 2+2?\"}],\"max_tokens\":16,"
                          "\"temperature\":0,\"return_token_ids\":true,\"chat_template_kwargs\":{\"enable_thinking\":false},"
                          "\"stream\":%s}";
    snprintf(body, sizeof body, nothink, "false");
    chat(port, body, 0, &a);
    check_answer("thinking off", &a, 0, 0);
    T_CHECK(!a.has_reasoning && a.content[0], "thinking off: no reasoning_content, content '%s'", a.content);
    snprintf(body, sizeof body, nothink, "true");
    chat(port, body, 1, &b);
    same_answer("thinking off", &a, &b);

    /* Forced calls: tool_choice named / required, thinking off: the output starts with
     * <tool_call> (and the name), and comes back as a tool call named get_weather. */
    int32_t name_ids[32];
    size_t nn = 0;
    tok_encode(g_tok, "get_weather", 11, 0, name_ids, 32, &nn, NULL);
    const char *forced = "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}],\"max_tokens\":%zu,"
                         "\"temperature\":0,\"return_token_ids\":true,\"chat_template_kwargs\":{\"enable_thinking\":false},"
                         "\"tool_choice\":%s%s,\"stream\":%s}";
    const char *named = "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}";
    for (int st = 0; st < 2; st++) {
        snprintf(body, sizeof body, forced, nn + 1, named, tools, st ? "true" : "false");
        chat(port, body, st, st ? &b : &a);
        answer *x = st ? &b : &a;
        int ok = x->n_ids == (int)nn + 1 && x->ids[0] == tok_lookup(g_tok, "<tool_call>", 11);
        for (size_t i = 0; ok && i < nn; i++) ok = x->ids[1 + i] == name_ids[i];
        T_CHECK(ok, "named tool_choice%s: forced <tool_call>get_weather (%d ids)", st ? " stream" : "", x->n_ids);
        T_CHECK(x->n_calls == 1 && !strcmp(x->names[0], "get_weather") && !strcmp(x->args[0], "{}") &&
                    x->content[0] == 0,
                "named tool_choice%s: tool call '%s' args '%s', content '%s'", st ? " stream" : "", x->names[0],
                x->args[0], x->content);
        check_answer(st ? "named stream" : "named", x, 0, 1);
    }
    same_answer("named", &a, &b);
    /* "required" with one tool: that tool; with two: "<tool_call>" and the model names one */
    snprintf(body, sizeof body, forced, nn + 1, "\"required\"", tools, "false");
    chat(port, body, 0, &a);
    T_CHECK(a.n_ids == (int)nn + 1 && a.ids[0] == tok_lookup(g_tok, "<tool_call>", 11) && a.n_calls == 1 &&
                !strcmp(a.names[0], "get_weather"),
            "required, one tool: a call of it (%d calls, '%s')", a.n_calls, a.names[0]);
    check_answer("required", &a, 0, 1);
    const char *two = ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}},"
                      "{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}}]";
    snprintf(body, sizeof body, forced, (size_t)6, "\"required\"", two, "false");
    chat(port, body, 0, &a);
    T_CHECK(a.n_ids >= 1 && a.ids[0] == tok_lookup(g_tok, "<tool_call>", 11), "required, two tools: starts with <tool_call>");
    check_answer("required, two tools", &a, 0, 1);
}

/* ---- prefix caching ---- */

typedef struct comp {
    int status;
    int32_t ids[64];
    int n;
    long cached;
} comp;

static void complete(uint16_t port, const int32_t *prompt, int np, int stream, comp *c) {
    json_t *req = json_pack("{s:i,s:i,s:b,s:b,s:{s:b}}", "max_tokens", 8, "temperature", 0, "return_token_ids", 1,
                            "stream", stream, "stream_options", "include_usage", 1);
    json_t *a = json_array();
    for (int i = 0; i < np; i++) json_array_append_new(a, json_integer(prompt[i]));
    json_object_set_new(req, "prompt", a);
    if (!stream) json_object_del(req, "stream_options");
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    memset(c, 0, sizeof *c);
    c->cached = -1;
    char *raw = NULL;
    json_t *j = call(port, "POST", "/v1/completions", body, &c->status, &raw);
    free(body);
    json_t *evs = events(j, raw, stream);
    size_t i;
    json_t *ev;
    json_array_foreach(evs, i, ev) {
        json_t *ch = json_array_get(json_object_get(ev, "choices"), 0);
        c->n += ids_of(json_object_get(ch, "token_ids"), c->ids + c->n, 64 - c->n);
        json_t *d = json_object_get(json_object_get(json_object_get(ev, "usage"), "prompt_tokens_details"), "cached_tokens");
        if (json_is_integer(d)) c->cached = (long)json_integer_value(d);
    }
    json_decref(evs);
    json_decref(j);
    free(raw);
}

static long metric(uint16_t port, const char *name) {
    int st;
    char *raw = NULL;
    json_t *j = call(port, "GET", "/metrics", NULL, &st, &raw);
    json_decref(j);
    long v = -1;
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = raw ? strstr(raw, key) : NULL;
    if (p) v = strtol(p + strlen(key), NULL, 10);
    free(raw);
    return v;
}

/* A second request sharing a long prefix reports cached tokens and gets the output a server
 * without the cache gives; the hit counters move. */
static void test_prefix(uint16_t port, uint16_t port_nc) {
    int32_t a[100], b[110];
    for (int i = 0; i < 100; i++) a[i] = (int32_t)(1500 + (i * 29) % 500);
    memcpy(b, a, 80 * sizeof *b);
    for (int i = 80; i < 110; i++) b[i] = (int32_t)(100 + i);
    static comp c1, c2, c3, r1, r2, s3;
    long h0 = metric(port, "glm5_prefix_cache_hits_total");
    complete(port, a, 100, 0, &c1);
    complete(port, b, 110, 0, &c2);
    complete(port, a, 100, 0, &c3);
    complete(port, a, 100, 1, &s3);
    complete(port_nc, a, 100, 0, &r1);
    complete(port_nc, b, 110, 0, &r2);
    T_CHECK(c1.status == 200 && c1.cached == 0 && c1.n == 8, "first request: %d, cached %ld", c1.status, c1.cached);
    T_CHECK(c2.status == 200 && c2.cached == 80, "shared 80-token prefix: cached %ld (want 80: 5 blocks)", c2.cached);
    T_CHECK(c3.cached == 96 && s3.cached == 96, "same prompt again: cached %ld / streamed %ld (want 96: 6 blocks, one "
                                                "token left to run)", c3.cached, s3.cached);
    T_CHECK(r1.cached == 0 && r2.cached == 0, "no prefix cache: cached %ld %ld", r1.cached, r2.cached);
    T_CHECK(c1.n == r1.n && !memcmp(c1.ids, r1.ids, sizeof c1.ids) && c3.n == r1.n &&
                !memcmp(c3.ids, r1.ids, sizeof c1.ids) && s3.n == r1.n && !memcmp(s3.ids, r1.ids, sizeof c1.ids),
            "prompt A: same output with and without the cache");
    T_CHECK(c2.n == r2.n && r2.n == 8 && !memcmp(c2.ids, r2.ids, sizeof c2.ids), "prompt B: same output with and without the cache");
    long h1 = metric(port, "glm5_prefix_cache_hits_total");
    T_CHECK(h1 - h0 == 80 + 96 + 96, "hits counter: +%ld", h1 - h0);
    T_CHECK(metric(port, "glm5_prefix_cache_queries_total") >= 400 && metric(port, "glm5_prefix_cache_blocks") > 0 &&
                metric(port_nc, "glm5_prefix_cache_hits_total") == 0,
            "prefix metrics");
    T_CHECK(metric(port, "glm5_cache_blocks_in_use") == 0, "cached blocks are not in use");
}

/* --cors: preflights answered 204 without a key, the origin header on every reply; without it
 * OPTIONS is not an allowed method and no header is sent. */
static void test_cors(uint16_t port, uint16_t port_plain) {
    hresp h;
    int rc = http_do(port, "OPTIONS", "/v1/chat/completions", "Origin: https://app.example\r\n"
                     "Access-Control-Request-Method: POST\r\n", NULL, &h);
    T_CHECK(rc == 0 && h.status == 204 && strstr(h.raw, "Access-Control-Allow-Origin: https://app.example") &&
                strstr(h.raw, "Access-Control-Allow-Headers: Authorization, Content-Type"),
            "preflight: %d", h.status);
    hresp_free(&h);
    rc = http_do(port, "GET", "/v1/models", NULL, NULL, &h);
    T_CHECK(rc == 0 && h.status == 200 && strstr(h.raw, "Access-Control-Allow-Origin: https://app.example"), "origin header");
    hresp_free(&h);
    rc = http_do(port_plain, "OPTIONS", "/v1/chat/completions", NULL, NULL, &h);
    T_CHECK(rc == 0 && h.status == 405 && !strstr(h.raw, "Access-Control"), "no --cors: OPTIONS %d", h.status);
    hresp_free(&h);
}

/* ---- srv_api_parse without a server ----
 * Error returns after part of a request was taken apart: every one must free what it made (the
 * sanitizer pass of `make check` fails this program on a leak). The first body is
 * fuzz_http_body's LeakSanitizer finding (fuzz/seeds/fuzz_http_body/leak-9207378a without its
 * first byte): tools[0] valid, tools[1] the number 9, so parse_tools had already rendered
 * tools[0]'s text when it refused. */
static void test_parse_errors(void) {
    static srv_server bare;
    bare.tok = g_tok;
    bare.n_vocab = tok_n_vocab(g_tok);
    bare.max_ctx = 4096;
    bare.model_name = MODEL;
    bare.load = SRV_READY;
    bare.chat_fmt = CHAT_FORMAT_GLM5;
#define U "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"
#define F(n) "{\"type\":\"function\",\"function\":{\"name\":\"" n "\"}}"
    static const struct { const char *body, *param; } cases[] = {
        {
        "{\"messages\":[{\"role\":\"user\",\"content\":\"w?\"},{\"role\":\"assistant\",\"contool_ca"
        "ll_id\":\"c1\",\"content\":\"okcsi|>:th$ezz|>:th$e:th$ez:th</think>\"}],\"tools\":[{\"type"
        "\":\"function\",\"function\":{\"name\":\"get\",\"paramete\":{\"type\":\"object\",\"propert"
        "ies\":{\"x\":{\"type\":\"integer\"}}}}},9,0,11,11,11,210,9,1,210,20,229,129,129,0,12,262,2"
        ",21,21,210,20,229,129],\"tool_choice\":\"required\"}",
         "tools"},
        {"{" U ",\"tools\":[" F("f") "," F("g") ",{\"type\":\"function\"}]}", "tools"},
        {"{" U ",\"tools\":[" F("f") ",9],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}}", "tools"},
        /* tool_choice has made the forced prefix when a later message is refused */
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"robot\"}],\"tools\":[" F("f")
         "],\"tool_choice\":\"required\"}", "messages"},
        /* a tool call taken apart, the next one refused */
        {"{\"messages\":[{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"function\":{\"name\":\"f\","
         "\"arguments\":{\"a\":1,\"b\":\"x\"}}},{\"function\":{\"name\":\"g\",\"arguments\":\"{\\\"c\\\":[2]}\"}},{}]}]}",
         "messages"},
        /* one stop string kept, the next refused */
        {"{" U ",\"stop\":[\"ab\",\"\"]}", "stop"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        srv_params p;
        char msg[512] = "";
        const char *param = NULL;
        int rc = srv_api_parse(&bare, SRV_KIND_CHAT, cases[i].body, strlen(cases[i].body), &p, msg, sizeof msg, &param);
        T_CHECK(rc == 400 && param && !strcmp(param, cases[i].param) && msg[0], "parse case %zu: %d param %s (%s)", i,
                rc, param ? param : "-", msg);
        if (rc == 0) srv_params_clear(&p);
    }
    /* one valid tool with "required": accepted, its call forced from "<tool_call>" */
    const char *ok = "{" U ",\"tools\":[" F("f") "],\"tool_choice\":\"required\",\"max_tokens\":4}";
    srv_params p;
    char msg[512] = "";
    const char *param = NULL;
    int rc = srv_api_parse(&bare, SRV_KIND_CHAT, ok, strlen(ok), &p, msg, sizeof msg, &param);
    T_CHECK(rc == 0 && p.n_force >= 1 && p.force[0] == tok_lookup(g_tok, "<tool_call>", 11) && p.n_prompt > 0,
            "parse: required with one tool forces its call: %d (%s)", rc, msg);
    if (rc == 0) srv_params_clear(&p);
#undef U
#undef F
}

int main(void) {
    gguf_ctx *g = NULL;
    if (gguf_open(T_ORACLE_GGUF, &g, NULL) == G5_OK) tok_create(g, &g_tok, NULL);
    gguf_free(g);
    T_CHECK(g_tok != NULL, "oracle tokenizer: %s", T_ORACLE_GGUF);
    if (!g_tok) return t_report("test_serve_api");
    test_parse_errors();
    srv_config c;
    srv_config_default(&c);
    c.model_path = T_ORACLE_GGUF;
    c.port = 0;
    c.n_threads = 2;
    c.max_batch = 4;
    c.log = log_cb;
    c.cors_origin = "https://app.example";
    srv_server *s = NULL;
    g5_error e = {0};
    T_CHECK(srv_create(&c, &s, &e) == G5_OK, "srv_create: %s", e.msg);
    if (s) {
        uint16_t port = srv_port(s);
        for (int i = 0; i < 3000 && srv_get_load_state(s, NULL) == SRV_LOADING; i++) sleep_ms(20);
        T_CHECK(srv_get_load_state(s, NULL) == SRV_READY, "model loaded");
        test_endpoints(port);
        test_tool_prompt(port);
        test_refusals(port);
        test_outputs(port);
        srv_config c2 = c;
        c2.prefix_cache = 0;
        c2.cors_origin = NULL;
        srv_server *s2 = NULL;
        T_CHECK(srv_create(&c2, &s2, &e) == G5_OK, "srv_create without prefix cache: %s", e.msg);
        if (s2) {
            for (int i = 0; i < 3000 && srv_get_load_state(s2, NULL) == SRV_LOADING; i++) sleep_ms(20);
            test_prefix(port, srv_port(s2));
            test_cors(port, srv_port(s2));
            srv_free(s2);
        }
        srv_free(s);
    }
    tok_free(g_tok);
    return t_report("test_serve_api");
}
