/* GLM chat prompt formatting. The layouts and their sources are documented in chat.h. */
#include "runtime/text/chat.h"

#include <string.h>

typedef struct outbuf {
    char *p;
    size_t cap, n;
} outbuf;

static void put(outbuf *o, const char *s, size_t len) {
    if (o->n < o->cap) {
        size_t k = len < o->cap - o->n ? len : o->cap - o->n;
        memcpy(o->p + o->n, s, k);
    }
    o->n += len;
}

static void puts_(outbuf *o, const char *s) { put(o, s, strlen(s)); }

static int is_ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* A view [b, e) of a string. */
typedef struct span {
    const char *b, *e;
} span;

static span strip(span s) {
    while (s.b < s.e && is_ws(*s.b)) s.b++;
    while (s.e > s.b && is_ws(s.e[-1])) s.e--;
    return s;
}

static const char *find(span s, const char *needle) {
    size_t nl = strlen(needle);
    for (const char *p = s.b; p + nl <= s.e; p++)
        if (memcmp(p, needle, nl) == 0) return p;
    return NULL;
}

static const char *rfind(span s, const char *needle) {
    size_t nl = strlen(needle);
    if ((size_t)(s.e - s.b) < nl) return NULL;
    for (const char *p = s.e - nl;; p--) {
        if (memcmp(p, needle, nl) == 0) return p;
        if (p == s.b) return NULL;
    }
}

/* The templates' split of an assistant message into reasoning and visible content:
 *   reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')
 *   content   = content.split('</think>')[-1].lstrip('\n')
 * (only when '</think>' occurs; otherwise there is no reasoning). */
static void split_reasoning(const char *content, span *reasoning, span *visible) {
    span all = {content, content + strlen(content)};
    const char *first_end = find(all, "</think>");
    if (!first_end) {
        reasoning->b = reasoning->e = content;
        *visible = all;
        return;
    }
    span r = {content, first_end};
    while (r.e > r.b && r.e[-1] == '\n') r.e--;
    const char *open = rfind(r, "<think>");
    if (open) r.b = open + strlen("<think>");
    while (r.b < r.e && *r.b == '\n') r.b++;
    *reasoning = r;
    const char *last_end = rfind(all, "</think>");
    span v = {last_end + strlen("</think>"), all.e};
    while (v.b < v.e && *v.b == '\n') v.b++;
    *visible = v;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && memcmp(s + n - m, suffix, m) == 0;
}

void chat_options_default(chat_options *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->format = CHAT_FORMAT_GLM5;
    o->add_generation_prompt = 1;
    o->enable_thinking = 1;
}

g5_status chat_build_prompt(const chat_message *msgs, size_t n_msgs, const chat_options *opts,
                            char *out, size_t cap, size_t *n_out, g5_error *err) {
    if (n_out) *n_out = 0;
    if ((!msgs && n_msgs) || !opts || (!out && cap) || !n_out)
        return g5_fail(err, G5_ERR_INVALID_ARG, "chat_build_prompt: bad arguments");
    if (opts->format != CHAT_FORMAT_GLM5 && opts->format != CHAT_FORMAT_GLM45)
        return g5_fail(err, G5_ERR_INVALID_ARG, "chat_build_prompt: unknown format %d",
                       (int)opts->format);
    int glm45 = opts->format == CHAT_FORMAT_GLM45;
    if (opts->n_tools && !opts->tools)
        return g5_fail(err, G5_ERR_INVALID_ARG, "chat_build_prompt: NULL tools");
    if (glm45 && opts->n_tools)
        return g5_fail(err, G5_ERR_UNSUPPORTED, "chat_build_prompt: tools in the GLM-4.5 format");

    size_t last_user = (size_t)-1;
    for (size_t i = 0; i < n_msgs; i++) {
        if (!msgs[i].role || !msgs[i].content)
            return g5_fail(err, G5_ERR_INVALID_ARG, "chat_build_prompt: message %zu has a NULL "
                           "role or content", i);
        const char *r = msgs[i].role;
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool"))
            return g5_fail(err, G5_ERR_INVALID_ARG, "chat_build_prompt: message %zu has unknown "
                           "role '%.64s'", i, r);
        if (!strcmp(r, "user")) last_user = i;
        if (msgs[i].n_tool_calls && (glm45 || strcmp(r, "assistant") || !msgs[i].tool_calls))
            return g5_fail(err, G5_ERR_UNSUPPORTED, "chat_build_prompt: message %zu: tool calls "
                           "need an assistant message in the GLM-5 format", i);
        for (size_t k = 0; k < msgs[i].n_tool_calls; k++) {
            const chat_tool_call *tc = &msgs[i].tool_calls[k];
            if (!tc->name || (tc->n_args && (!tc->arg_keys || !tc->arg_values)))
                return g5_fail(err, G5_ERR_INVALID_ARG, "chat_build_prompt: message %zu tool call "
                               "%zu has a NULL field", i, k);
            for (size_t a = 0; a < tc->n_args; a++)
                if (!tc->arg_keys[a] || !tc->arg_values[a])
                    return g5_fail(err, G5_ERR_INVALID_ARG, "chat_build_prompt: message %zu tool "
                                   "call %zu argument %zu is NULL", i, k, a);
        }
    }
    for (size_t t = 0; t < opts->n_tools; t++)
        if (!opts->tools[t])
            return g5_fail(err, G5_ERR_INVALID_ARG, "chat_build_prompt: tool %zu is NULL", t);

    outbuf o = {out, cap, 0};
    puts_(&o, "[gMASK]<sop>");
    if (opts->n_tools) {
        puts_(&o, "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user "
                  "query.\n\nYou are provided with function signatures within <tools></tools> XML "
                  "tags:\n<tools>\n");
        for (size_t t = 0; t < opts->n_tools; t++) {
            puts_(&o, opts->tools[t]);
            puts_(&o, "\n");
        }
        puts_(&o, "</tools>\n\nFor each function call, output the function name and arguments within "
                  "the following XML format:\n<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key>"
                  "<arg_value>{arg-value-1}</arg_value><arg_key>{arg-key-2}</arg_key><arg_value>"
                  "{arg-value-2}</arg_value>...</tool_call>");
    }
    for (size_t i = 0; i < n_msgs; i++) {
        const char *role = msgs[i].role, *content = msgs[i].content;
        if (!strcmp(role, "system")) {
            puts_(&o, glm45 ? "<|system|>\n" : "<|system|>");
            puts_(&o, content);
        } else if (!strcmp(role, "user")) {
            puts_(&o, glm45 ? "<|user|>\n" : "<|user|>");
            puts_(&o, content);
            if (glm45 && !opts->enable_thinking && !ends_with(content, "/nothink"))
                puts_(&o, "/nothink");
        } else if (!strcmp(role, "assistant")) {
            span reasoning, visible;
            if (msgs[i].reasoning) { /* reasoning_content given: content is all visible */
                reasoning.b = msgs[i].reasoning;
                reasoning.e = reasoning.b + strlen(reasoning.b);
                visible.b = content;
                visible.e = content + strlen(content);
            } else {
                split_reasoning(content, &reasoning, &visible);
            }
            /* The templates test the reasoning before stripping it, so "<think> </think>" keeps
             * an empty <think></think> block. */
            int keep = (last_user == (size_t)-1 || i > last_user) && reasoning.e > reasoning.b;
            puts_(&o, "<|assistant|>");
            if (keep) {
                span r = strip(reasoning);
                puts_(&o, glm45 ? "\n<think>" : "<think>");
                put(&o, r.b, (size_t)(r.e - r.b));
                puts_(&o, "</think>");
            } else {
                puts_(&o, glm45 ? "\n<think></think>" : "</think>");
            }
            span v = strip(visible);
            if (v.e > v.b) {
                if (glm45) puts_(&o, "\n");
                put(&o, v.b, (size_t)(v.e - v.b));
            }
            for (size_t k = 0; k < msgs[i].n_tool_calls; k++) {
                const chat_tool_call *tc = &msgs[i].tool_calls[k];
                puts_(&o, "<tool_call>");
                puts_(&o, tc->name);
                for (size_t a = 0; a < tc->n_args; a++) {
                    puts_(&o, "<arg_key>");
                    puts_(&o, tc->arg_keys[a]);
                    puts_(&o, "</arg_key><arg_value>");
                    puts_(&o, tc->arg_values[a]);
                    puts_(&o, "</arg_value>");
                }
                puts_(&o, "</tool_call>");
            }
        } else { /* tool */
            if (i == 0 || strcmp(msgs[i - 1].role, "tool")) puts_(&o, "<|observation|>");
            puts_(&o, glm45 ? "\n<tool_response>\n" : "<tool_response>");
            puts_(&o, content);
            puts_(&o, glm45 ? "\n</tool_response>" : "</tool_response>");
        }
    }
    if (opts->add_generation_prompt) {
        puts_(&o, "<|assistant|>");
        if (glm45) {
            if (!opts->enable_thinking) puts_(&o, "\n<think></think>");
        } else {
            puts_(&o, opts->enable_thinking ? "<think>" : "</think>");
        }
    }
    *n_out = o.n;
    if (o.n > cap)
        return g5_fail(err, G5_ERR_BOUNDS, "chat_build_prompt: %zu bytes do not fit in %zu", o.n,
                       cap);
    return G5_OK;
}
