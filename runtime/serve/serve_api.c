/* glm5-serve API layer: OpenAI request parameters (validated) and response JSON. */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/serve/serve_int.h"

/* ---- UTF-8 ---- */

/* Length of the well-formed sequence at s (Unicode table 3-7), or 0. */
static size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) len = 3, lo = 0xA0;
    else if (c >= 0xE1 && c <= 0xEC) len = 3;
    else if (c == 0xED) len = 3, hi = 0x9F;
    else if (c >= 0xEE && c <= 0xEF) len = 3;
    else if (c == 0xF0) len = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else if (c == 0xF4) len = 4, hi = 0x8F;
    else return 0;
    if (n < len) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return len;
}

char *srv_utf8_clean(const char *s, size_t len, size_t *out_len) {
    const unsigned char *u = (const unsigned char *)s;
    size_t need = 0;
    for (size_t i = 0; i < len;) {
        size_t k = utf8_seq(u + i, len - i);
        need += k ? k : 3;
        i += k ? k : 1;
    }
    char *o = malloc(need + 1);
    if (!o) return NULL;
    size_t w = 0;
    for (size_t i = 0; i < len;) {
        size_t k = utf8_seq(u + i, len - i);
        if (k) {
            memcpy(o + w, s + i, k);
            w += k;
            i += k;
        } else {
            memcpy(o + w, "\xEF\xBF\xBD", 3);
            w += 3;
            i++;
        }
    }
    o[w] = 0;
    if (out_len) *out_len = w;
    return o;
}

/* A JSON string from arbitrary bytes (invalid UTF-8 replaced). */
static json_t *jstr(const char *s, size_t len) {
    size_t n;
    char *c = srv_utf8_clean(s, len, &n);
    if (!c) return NULL;
    json_t *j = json_stringn(c, n);
    free(c);
    return j;
}

/* json_real refuses non-finite values. */
static json_t *jreal(double v) {
    if (isnan(v)) v = 0;
    if (v < -1e30) v = -9999.0;
    if (v > 1e30) v = 9999.0;
    return json_real(v);
}

/* ---- parameters ---- */

typedef struct pctx {
    char *msg;
    size_t cap;
    const char **param;
    int status; /* 0: 400 */
} pctx;

static int bad(pctx *c, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(pctx *c, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg, c->cap, fmt, ap);
    va_end(ap);
    *c->param = param;
    return -1;
}

/* 0: absent or null; 1: *out set; -1: wrong type or out of range (message set). */
static int get_num(json_t *o, const char *key, double lo, double hi, double *out, pctx *c) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return bad(c, key, "'%s' must be a number", key);
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi))
        return bad(c, key, "'%s' must be between %g and %g (got %g)", key, lo, hi, d);
    *out = d;
    return 1;
}

static int get_int(json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out, pctx *c) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    int64_t x;
    if (json_is_integer(v)) {
        x = (int64_t)json_integer_value(v);
    } else if (json_is_real(v) && floor(json_real_value(v)) == json_real_value(v) &&
               fabs(json_real_value(v)) < 9e18) {
        x = (int64_t)json_real_value(v);
    } else {
        return bad(c, key, "'%s' must be an integer", key);
    }
    if (x < lo || x > hi)
        return bad(c, key, "'%s' must be between %lld and %lld (got %lld)", key, (long long)lo,
                   (long long)hi, (long long)x);
    *out = x;
    return 1;
}

static int get_bool(json_t *o, const char *key, int *out, pctx *c) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return bad(c, key, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 1;
}

static int encode_text(srv_server *s, const char *text, size_t len, int32_t **ids, uint32_t *n,
                       const char *param, pctx *c) {
    int32_t *buf = malloc((len ? len : 1) * sizeof *buf);
    if (!buf) return bad(c, param, "out of memory");
    size_t got = 0;
    g5_error e = {0};
    if (tok_encode(s->tok, text, len, 1, buf, len, &got, &e) != G5_OK) {
        free(buf);
        return bad(c, param, "cannot tokenize '%s': %s", param, e.msg);
    }
    if (got > UINT32_MAX) {
        free(buf);
        return bad(c, param, "'%s' is too long", param);
    }
    *ids = buf;
    *n = (uint32_t)got;
    return 0;
}

static int ids_from_array(srv_server *s, json_t *a, int32_t **ids, uint32_t *n, pctx *c) {
    size_t k = json_array_size(a);
    int32_t *buf = malloc((k ? k : 1) * sizeof *buf);
    if (!buf) return bad(c, "prompt", "out of memory");
    for (size_t i = 0; i < k; i++) {
        json_t *v = json_array_get(a, i);
        json_int_t x = json_integer_value(v);
        if (!json_is_integer(v) || x < 0 || x >= (json_int_t)s->n_vocab) {
            free(buf);
            return bad(c, "prompt", "'prompt' token %zu is not a token id below %u", i, s->n_vocab);
        }
        buf[i] = (int32_t)x;
    }
    *ids = buf;
    *n = (uint32_t)k;
    return 0;
}

static int all_integers(json_t *a) {
    size_t i;
    json_t *v;
    json_array_foreach(a, i, v) if (!json_is_integer(v)) return 0;
    return 1;
}

static int parse_prompt(srv_server *s, json_t *root, srv_params *p, pctx *c) {
    json_t *pr = json_object_get(root, "prompt");
    if (!pr || json_is_null(pr)) return bad(c, "prompt", "'prompt' is required");
    if (json_is_string(pr))
        return encode_text(s, json_string_value(pr), json_string_length(pr), &p->prompt, &p->n_prompt,
                           "prompt", c);
    if (json_is_array(pr) && json_array_size(pr) > 0) {
        if (all_integers(pr)) return ids_from_array(s, pr, &p->prompt, &p->n_prompt, c);
        json_t *e0 = json_array_get(pr, 0);
        if (json_array_size(pr) == 1 && json_is_string(e0))
            return encode_text(s, json_string_value(e0), json_string_length(e0), &p->prompt,
                               &p->n_prompt, "prompt", c);
        if (json_array_size(pr) == 1 && json_is_array(e0) && json_array_size(e0) > 0 && all_integers(e0))
            return ids_from_array(s, e0, &p->prompt, &p->n_prompt, c);
        if (json_array_size(pr) > 1 && (json_is_string(e0) || json_is_array(e0)))
            return bad(c, "prompt", "batched prompts are not supported: send one prompt per request");
    }
    return bad(c, "prompt", "'prompt' must be a string, a non-empty array of token ids, or a "
                            "one-element array holding either");
}

/* Message content: a string, null, or an array of {"type": "text", "text": ...} parts (joined
 * with newlines). Returns a malloc'ed string. */
static char *message_content(json_t *m, size_t idx, pctx *c) {
    json_t *v = json_object_get(m, "content");
    if (!v || json_is_null(v)) return strdup("");
    if (json_is_string(v)) return strndup(json_string_value(v), json_string_length(v));
    if (!json_is_array(v)) {
        bad(c, "messages", "messages[%zu].content must be a string or an array of text parts", idx);
        return NULL;
    }
    size_t total = 1, i;
    json_t *part;
    json_array_foreach(v, i, part) {
        json_t *ty = json_object_get(part, "type"), *tx = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(ty) || strcmp(json_string_value(ty), "text") != 0 ||
            !json_is_string(tx)) {
            bad(c, "messages", "messages[%zu].content[%zu]: only {\"type\": \"text\", \"text\": ...} "
                               "parts are supported", idx, i);
            return NULL;
        }
        total += json_string_length(tx) + 1;
    }
    char *out = malloc(total), *w = out;
    if (!out) {
        bad(c, "messages", "out of memory");
        return NULL;
    }
    json_array_foreach(v, i, part) {
        json_t *tx = json_object_get(part, "text");
        if (i) *w++ = '\n';
        memcpy(w, json_string_value(tx), json_string_length(tx));
        w += json_string_length(tx);
    }
    *w = 0;
    return out;
}

/* JSON text as Jinja's tojson writes it (Python json.dumps: ", " and ": ", keys in order,
 * non-ASCII as is). Reals may differ in their last digits (jansson prints 17 significant). */
static char *tojson(json_t *v) { return json_dumps(v, JSON_ENCODE_ANY); }

/* Per-message storage for chat_build_prompt. */
typedef struct msg_store {
    char *content, *reasoning;
    chat_tool_call *calls;
    size_t n_calls;
    char **strs; /* everything else owned: names, keys, values */
    size_t n_strs, cap_strs;
} msg_store;

static char *keep(msg_store *m, char *s) {
    if (!s) return NULL;
    if (m->n_strs == m->cap_strs) {
        size_t nc = m->cap_strs ? m->cap_strs * 2 : 8;
        char **q = realloc(m->strs, nc * sizeof *q);
        if (!q) {
            free(s);
            return NULL;
        }
        m->strs = q;
        m->cap_strs = nc;
    }
    return m->strs[m->n_strs++] = s;
}

static void msg_store_clear(msg_store *m) {
    free(m->content);
    free(m->reasoning);
    for (size_t k = 0; k < m->n_calls; k++) {
        free((void *)m->calls[k].arg_keys);
        free((void *)m->calls[k].arg_values);
    }
    free(m->calls);
    for (size_t k = 0; k < m->n_strs; k++) free(m->strs[k]);
    free(m->strs);
}

/* An assistant message's tool_calls: [{"type": "function", "function": {"name", "arguments"}}],
 * arguments a JSON object or a string holding one (as the OpenAI API sends it). */
static int parse_msg_calls(json_t *tcs, size_t idx, msg_store *ms, size_t *bytes, pctx *c) {
    if (!json_is_array(tcs)) return bad(c, "messages", "messages[%zu].tool_calls must be an array", idx);
    size_t n = json_array_size(tcs);
    ms->calls = calloc(n ? n : 1, sizeof *ms->calls);
    if (!ms->calls) return bad(c, "messages", "out of memory");
    for (size_t k = 0; k < n; k++) {
        json_t *tc = json_array_get(tcs, k), *fn = json_object_get(tc, "function");
        json_t *name = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
        if (!json_is_object(fn) || !json_is_string(name))
            return bad(c, "messages", "messages[%zu].tool_calls[%zu] needs function.name", idx, k);
        json_t *obj = NULL;
        if (json_is_string(args)) {
            obj = json_loads(json_string_value(args), 0, NULL);
            if (!json_is_object(obj)) {
                json_decref(obj);
                return bad(c, "messages", "messages[%zu].tool_calls[%zu].function.arguments is not a JSON "
                                          "object", idx, k);
            }
        } else if (json_is_object(args)) {
            obj = json_incref(args);
        } else if (args && !json_is_null(args)) {
            return bad(c, "messages", "messages[%zu].tool_calls[%zu].function.arguments must be a JSON "
                                      "object or a string holding one", idx, k);
        }
        chat_tool_call *t = &ms->calls[ms->n_calls++];
        t->name = keep(ms, strdup(json_string_value(name)));
        size_t na = obj ? json_object_size(obj) : 0;
        const char **keys = calloc(na ? na : 1, sizeof *keys), **vals = calloc(na ? na : 1, sizeof *vals);
        t->arg_keys = keys;
        t->arg_values = vals;
        int ok = t->name && keys && vals;
        const char *key;
        json_t *v;
        size_t a = 0;
        if (obj && ok) json_object_foreach(obj, key, v) {
            keys[a] = keep(ms, strdup(key));
            vals[a] = keep(ms, json_is_string(v) ? strdup(json_string_value(v)) : tojson(v));
            if (!keys[a] || !vals[a]) ok = 0;
            else *bytes += strlen(keys[a]) + strlen(vals[a]) + 48;
            a++;
        }
        t->n_args = a;
        json_decref(obj);
        if (!ok) return bad(c, "messages", "out of memory");
        *bytes += strlen(t->name) + 32;
    }
    return 0;
}

static void free_texts(char **t, size_t n) {
    for (size_t i = 0; t && i < n; i++) free(t[i]);
    free(t);
}

/* tools: [{"type": "function", "function": {"name": ..., ...}}]; each rendered as its tojson
 * text. Returns the number of tools (0: none or null) and sets *texts (the caller frees them),
 * or -1 on error with *texts NULL and nothing left allocated. */
static int parse_tools(json_t *root, char ***texts, size_t *bytes, pctx *c) {
    *texts = NULL;
    json_t *tools = json_object_get(root, "tools");
    if (!tools || json_is_null(tools)) return 0;
    if (!json_is_array(tools)) return bad(c, "tools", "'tools' must be an array");
    size_t n = json_array_size(tools);
    if (n > 1024) return bad(c, "tools", "at most 1024 tools");
    char **tx = calloc(n ? n : 1, sizeof *tx);
    if (!tx) return bad(c, "tools", "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(tools, i), *ty = json_object_get(t, "type"), *fn = json_object_get(t, "function");
        if (!json_is_object(t) || !json_is_string(ty) || strcmp(json_string_value(ty), "function") != 0 ||
            !json_is_object(fn) || !json_is_string(json_object_get(fn, "name")) ||
            json_string_length(json_object_get(fn, "name")) == 0) {
            free_texts(tx, i); /* the texts of tools[0 .. i) made so far */
            return bad(c, "tools", "tools[%zu] must be {\"type\": \"function\", \"function\": {\"name\": ...}}", i);
        }
        if (!(tx[i] = tojson(t))) {
            free_texts(tx, i);
            return bad(c, "tools", "out of memory");
        }
        *bytes += strlen(tx[i]) + 2;
    }
    *texts = tx;
    return (int)n;
}

/* tool_choice: "none", "auto", "required" or {"type": "function", "function": {"name": N}}.
 * Sets p->tools and p->force; renders tools into the prompt unless "none". */
static int parse_tool_choice(srv_server *s, json_t *root, int n_tools, srv_params *p, int *render, pctx *c) {
    json_t *tc = json_object_get(root, "tool_choice");
    const char *name = NULL;
    *render = n_tools > 0;
    p->tools = n_tools > 0;
    if (!tc || json_is_null(tc)) return 0;
    if (json_is_string(tc)) {
        const char *v = json_string_value(tc);
        if (!strcmp(v, "none")) {
            *render = p->tools = 0;
            return 0;
        }
        if (strcmp(v, "auto") && strcmp(v, "required"))
            return bad(c, "tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or a "
                                         "named function");
        if (!n_tools) return bad(c, "tool_choice", "'tool_choice' \"%s\" needs 'tools'", v);
        if (!strcmp(v, "auto")) return 0;
        if (n_tools == 1) /* "required" with one tool: that one */
            name = json_string_value(json_object_get(json_object_get(json_array_get(p->tool_defs, 0), "function"), "name"));
    } else {
        json_t *fn = json_object_get(tc, "function");
        if (!json_is_object(tc) || !json_is_string(json_object_get(tc, "type")) ||
            strcmp(json_string_value(json_object_get(tc, "type")), "function") != 0 || !json_is_object(fn) ||
            !json_is_string(json_object_get(fn, "name")))
            return bad(c, "tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                         "{\"type\": \"function\", \"function\": {\"name\": ...}}");
        name = json_string_value(json_object_get(fn, "name"));
        int found = 0;
        size_t i;
        json_t *t;
        json_array_foreach(p->tool_defs, i, t) {
            const char *tn = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
            if (tn && !strcmp(tn, name)) found = 1;
        }
        if (!found) return bad(c, "tool_choice", "'tool_choice' names function '%.64s', which is not in 'tools'", name);
    }
    int32_t open = tok_lookup(s->tok, "<tool_call>", 11);
    if (open < 0) return bad(c, "tool_choice", "the tokenizer has no <tool_call> token");
    size_t nl = name ? strlen(name) : 0;
    p->force = malloc((nl + 1) * sizeof *p->force);
    if (!p->force) return bad(c, "tool_choice", "out of memory");
    p->force[0] = open;
    size_t got = 0;
    if (nl && tok_encode(s->tok, name, nl, 0, p->force + 1, nl, &got, NULL) != G5_OK)
        return bad(c, "tool_choice", "cannot tokenize the function name");
    p->n_force = (uint32_t)(1 + got);
    return 0;
}

static int parse_messages(srv_server *s, json_t *root, srv_params *p, pctx *c) {
    json_t *ms = json_object_get(root, "messages");
    if (!json_is_array(ms) || json_array_size(ms) == 0)
        return bad(c, "messages", "'messages' must be a non-empty array");
    size_t n = json_array_size(ms);
    if (n > SRV_MAX_MESSAGES) return bad(c, "messages", "at most %d messages", SRV_MAX_MESSAGES);
    chat_message *cm = calloc(n, sizeof *cm);
    msg_store *st = calloc(n, sizeof *st);
    char **tools = NULL;
    int n_tools = 0, render = 0;
    int rc = 0;
    size_t total = 64;
    if (!cm || !st) rc = bad(c, "messages", "out of memory");
    json_t *td = json_object_get(root, "tools");
    if (rc == 0 && json_is_array(td)) p->tool_defs = json_incref(td);
    if (rc == 0 && (n_tools = parse_tools(root, &tools, &total, c)) < 0) rc = -1;
    if (rc == 0 && parse_tool_choice(s, root, n_tools, p, &render, c) < 0) rc = -1;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        json_t *m = json_array_get(ms, i);
        json_t *role = json_object_get(m, "role");
        if (!json_is_object(m) || !json_is_string(role)) {
            rc = bad(c, "messages", "messages[%zu] must be an object with a string 'role'", i);
            break;
        }
        const char *r = json_string_value(role);
        if (!strcmp(r, "developer")) r = "system";
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool")) {
            rc = bad(c, "messages", "messages[%zu].role must be system, developer, user, assistant or "
                                    "tool", i);
            break;
        }
        st[i].content = message_content(m, i, c);
        if (!st[i].content) {
            rc = -1;
            break;
        }
        cm[i].role = r;
        cm[i].content = st[i].content;
        total += strlen(st[i].content) + 64;
        if (!strcmp(r, "assistant")) {
            json_t *rs = json_object_get(m, "reasoning_content");
            if (!rs || json_is_null(rs)) rs = json_object_get(m, "reasoning");
            if (rs && !json_is_null(rs)) {
                if (!json_is_string(rs)) {
                    rc = bad(c, "messages", "messages[%zu].reasoning_content must be a string", i);
                    break;
                }
                if (!(st[i].reasoning = strdup(json_string_value(rs)))) {
                    rc = bad(c, "messages", "out of memory");
                    break;
                }
                cm[i].reasoning = st[i].reasoning;
                total += strlen(st[i].reasoning) + 32;
            }
            json_t *tcs = json_object_get(m, "tool_calls");
            if (tcs && !json_is_null(tcs)) {
                if (s->chat_fmt != CHAT_FORMAT_GLM5) {
                    rc = bad(c, "messages", "tool calls need the GLM-5 chat format");
                    break;
                }
                if ((rc = parse_msg_calls(tcs, i, &st[i], &total, c)) < 0) break;
                cm[i].tool_calls = st[i].calls;
                cm[i].n_tool_calls = st[i].n_calls;
            }
        }
    }
    if (rc == 0 && render && s->chat_fmt != CHAT_FORMAT_GLM5)
        rc = bad(c, "tools", "'tools' need the GLM-5 chat format (this model's template is GLM-4.5's)");
    chat_options co;
    chat_options_default(&co);
    co.format = s->chat_fmt;
    if (render) {
        co.tools = (const char *const *)tools;
        co.n_tools = (size_t)n_tools;
    }
    json_t *kw = json_object_get(root, "chat_template_kwargs");
    if (rc == 0 && kw && !json_is_null(kw)) {
        if (!json_is_object(kw)) rc = bad(c, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
        else if (get_bool(kw, "enable_thinking", &co.enable_thinking, c) < 0) rc = -1;
    }
    /* GLM-5 generation prompts end in "<think>" with thinking on; GLM-4.5's in nothing (the model
     * opens <think> itself, which the parser also takes as reasoning). */
    p->think = co.enable_thinking && co.format == CHAT_FORMAT_GLM5;
    char *text = NULL;
    size_t need = 0;
    g5_error e = {0};
    for (int tries = 0; rc == 0 && tries < 2; tries++) {
        free(text);
        text = malloc(total);
        if (!text) {
            rc = bad(c, "messages", "out of memory");
            break;
        }
        g5_status gs = chat_build_prompt(cm, n, &co, text, total, &need, &e);
        if (gs == G5_OK) break;
        if (gs != G5_ERR_BOUNDS || tries == 1) rc = bad(c, "messages", "messages: %s", e.msg);
        total = need;
    }
    if (rc == 0) rc = encode_text(s, text, need, &p->prompt, &p->n_prompt, "messages", c);
    free(text);
    for (size_t i = 0; st && i < n; i++) msg_store_clear(&st[i]);
    free_texts(tools, n_tools > 0 ? (size_t)n_tools : 0);
    free(st);
    free(cm);
    return rc;
}

static int parse_stop(json_t *root, srv_params *p, pctx *c) {
    json_t *v = json_object_get(root, "stop");
    if (!v || json_is_null(v)) return 0;
    size_t n = 1;
    if (json_is_array(v)) {
        n = json_array_size(v);
        if (n > SRV_MAX_STOPS) return bad(c, "stop", "at most %d stop strings", SRV_MAX_STOPS);
    } else if (!json_is_string(v)) {
        return bad(c, "stop", "'stop' must be a string or an array of strings");
    }
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_string(e)) return bad(c, "stop", "'stop' must be a string or an array of strings");
        size_t len = json_string_length(e);
        if (len == 0 || len > SRV_MAX_STOP_LEN)
            return bad(c, "stop", "stop strings must be 1 to %d bytes long", SRV_MAX_STOP_LEN);
        if (memchr(json_string_value(e), 0, len)) return bad(c, "stop", "stop strings must not contain NUL");
        p->stops[p->n_stops] = strndup(json_string_value(e), len);
        if (!p->stops[p->n_stops]) return bad(c, "stop", "out of memory");
        p->n_stops++;
    }
    return 0;
}

static uint64_t default_seed(void) {
    static atomic_uint_fast64_t counter;
    uint64_t z = (uint64_t)(srv_now() * 1e9) ^ (atomic_fetch_add(&counter, 1) * 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int parse_all(srv_server *s, srv_kind kind, json_t *root, srv_params *p, pctx *c) {
    p->kind = kind;
    json_t *model = json_object_get(root, "model");
    if (model && !json_is_null(model) && !json_is_string(model))
        return bad(c, "model", "'model' must be a string");
    if (json_is_string(model) && strcmp(json_string_value(model), s->model_name) != 0) {
        c->status = 404; /* as vLLM answers */
        return bad(c, "model", "The model `%.200s` does not exist (this server has `%.200s`).",
                   json_string_value(model), s->model_name);
    }
    json_t *rf = json_object_get(root, "response_format");
    if (rf && !json_is_null(rf)) {
        json_t *ty = json_object_get(rf, "type");
        if (!json_is_object(rf) || !json_is_string(ty))
            return bad(c, "response_format", "'response_format' must be an object with a string 'type'");
        if (strcmp(json_string_value(ty), "text") != 0)
            return bad(c, "response_format", "'response_format' type '%.64s' is not supported: this server "
                       "has no constrained decoding (only \"text\")", json_string_value(ty));
    }
    static const char *const guided[] = {"guided_json", "guided_regex", "guided_choice", "guided_grammar",
                                         "structured_outputs", "grammar", "json_schema"};
    for (size_t i = 0; i < sizeof guided / sizeof guided[0]; i++) {
        json_t *g = json_object_get(root, guided[i]);
        if (g && !json_is_null(g))
            return bad(c, guided[i], "'%s' is not supported: this server has no constrained decoding", guided[i]);
    }
    if (kind == SRV_KIND_COMPLETION) {
        static const char *const chat_only[] = {"tools", "tool_choice", "messages"};
        for (size_t i = 0; i < 3; i++) {
            json_t *g = json_object_get(root, chat_only[i]);
            if (g && !json_is_null(g))
                return bad(c, chat_only[i], "'%s' belongs to /v1/chat/completions", chat_only[i]);
        }
    }
    p->parallel_tool_calls = 1;
    if (get_bool(root, "parallel_tool_calls", &p->parallel_tool_calls, c) < 0) return -1;

    samp_params_default(&p->sp);
    p->sp.temperature = 1.0f;
    p->sp.top_k = 0;
    p->sp.top_p = 1.0f;
    p->sp.min_p = 0.0f;
    p->sp.seed = default_seed();
    double d;
    int64_t x;
    int r;
    if ((r = get_num(root, "temperature", 0, 2, &d, c)) < 0) return -1;
    if (r) p->sp.temperature = (float)d;
    if ((r = get_num(root, "top_p", 0, 1, &d, c)) < 0) return -1;
    if (r) p->sp.top_p = (float)d;
    if ((r = get_int(root, "top_k", -1, (int64_t)s->n_vocab, &x, c)) < 0) return -1;
    if (r) p->sp.top_k = x < 0 ? 0 : (int32_t)x;
    if ((r = get_num(root, "min_p", 0, 1, &d, c)) < 0) return -1;
    if (r) p->sp.min_p = (float)d;
    if ((r = get_num(root, "frequency_penalty", -2, 2, &d, c)) < 0) return -1;
    if (r) p->sp.frequency_penalty = (float)d;
    if ((r = get_num(root, "presence_penalty", -2, 2, &d, c)) < 0) return -1;
    if (r) p->sp.presence_penalty = (float)d;
    if ((r = get_num(root, "repetition_penalty", 0.01, 10, &d, c)) < 0) return -1;
    if (r) p->sp.repeat_penalty = (float)d;
    if ((r = get_int(root, "seed", INT64_MIN, INT64_MAX, &x, c)) < 0) return -1;
    if (r) p->sp.seed = (uint64_t)x;
    if (get_bool(root, "stream", &p->stream, c) < 0) return -1;
    json_t *so = json_object_get(root, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) return bad(c, "stream_options", "'stream_options' must be an object");
        if (get_bool(so, "include_usage", &p->include_usage, c) < 0) return -1;
    }
    if (get_bool(root, "return_token_ids", &p->return_token_ids, c) < 0) return -1;
    if ((r = get_int(root, "n", 1, 1, &x, c)) < 0) {
        snprintf(c->msg, c->cap, "only n = 1 is supported");
        return -1;
    }
    if ((r = get_int(root, "best_of", 1, 1, &x, c)) < 0) {
        snprintf(c->msg, c->cap, "only best_of = 1 is supported");
        return -1;
    }
    int echo = 0;
    if (get_bool(root, "echo", &echo, c) < 0) return -1;
    if (echo) return bad(c, "echo", "'echo' is not supported");
    json_t *suffix = json_object_get(root, "suffix");
    if (suffix && !json_is_null(suffix) && !(json_is_string(suffix) && json_string_length(suffix) == 0))
        return bad(c, "suffix", "'suffix' is not supported");
    json_t *lb = json_object_get(root, "logit_bias");
    if (lb && !json_is_null(lb) && !(json_is_object(lb) && json_object_size(lb) == 0))
        return bad(c, "logit_bias", "'logit_bias' is not supported");

    if (kind == SRV_KIND_COMPLETION) {
        json_t *lpv = json_object_get(root, "logprobs");
        if (json_is_boolean(lpv) && json_is_false(lpv)) lpv = NULL;
        if (lpv && (r = get_int(root, "logprobs", 0, SRV_MAX_TOP_LOGPROBS, &x, c)) < 0) return -1;
        if (lpv && r) {
            p->logprobs = 1;
            p->top_logprobs = (uint32_t)x;
        }
    } else {
        if (get_bool(root, "logprobs", &p->logprobs, c) < 0) return -1;
        if ((r = get_int(root, "top_logprobs", 0, SRV_MAX_TOP_LOGPROBS, &x, c)) < 0) return -1;
        if (r && x > 0 && !p->logprobs)
            return bad(c, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
        if (r) p->top_logprobs = (uint32_t)x;
    }
    if (parse_stop(root, p, c) < 0) return -1;

    if (kind == SRV_KIND_COMPLETION) {
        if (parse_prompt(s, root, p, c) < 0) return -1;
    } else {
        if (parse_messages(s, root, p, c) < 0) return -1;
    }
    const char *pname = kind == SRV_KIND_COMPLETION ? "prompt" : "messages";
    if (p->n_prompt == 0) return bad(c, pname, "the prompt is empty");
    if (p->n_prompt >= s->max_ctx)
        return bad(c, pname, "the prompt has %u tokens; the context length is %u", p->n_prompt, s->max_ctx);

    const char *mt_key = "max_tokens";
    if (kind == SRV_KIND_CHAT && json_object_get(root, "max_completion_tokens") &&
        !json_is_null(json_object_get(root, "max_completion_tokens")))
        mt_key = "max_completion_tokens";
    if ((r = get_int(root, mt_key, 1, s->max_ctx, &x, c)) < 0) return -1;
    if (r) {
        p->max_tokens = (uint32_t)x;
        if ((uint64_t)p->n_prompt + p->max_tokens > s->max_ctx)
            return bad(c, mt_key, "the prompt (%u tokens) + %s (%u) exceeds the context length %u",
                       p->n_prompt, mt_key, p->max_tokens, s->max_ctx);
    } else {
        p->max_tokens = s->max_ctx - p->n_prompt;
        if (kind == SRV_KIND_COMPLETION && p->max_tokens > 16) p->max_tokens = 16;
    }
    return 0;
}

int srv_api_parse(srv_server *s, srv_kind kind, const char *body, size_t len, srv_params *p,
                  char *msg, size_t msg_cap, const char **param) {
    memset(p, 0, sizeof *p);
    *param = NULL;
    pctx c = {msg, msg_cap, param, 0};
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        snprintf(msg, msg_cap, "invalid JSON body (line %d, column %d): %s", je.line, je.column, je.text);
        return 400;
    }
    int rc = 0;
    if (!json_is_object(root)) {
        snprintf(msg, msg_cap, "the request body must be a JSON object");
        rc = 400;
    } else if (parse_all(s, kind, root, p, &c) < 0) {
        rc = c.status ? c.status : 400;
    }
    json_decref(root);
    if (rc) srv_params_clear(p);
    return rc;
}

/* ---- responses ---- */

static char *dump(json_t *j) {
    if (!j) return NULL;
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return s;
}

char *srv_api_error_json(int http_status, const char *msg, const char *param) {
    const char *type = "invalid_request_error", *code = NULL;
    switch (http_status) {
    case 401: type = "authentication_error"; code = "invalid_api_key"; break;
    case 404: type = "not_found_error"; break;
    case 405: code = "method_not_allowed"; break;
    case 413: code = "request_too_large"; break;
    case 429: type = "rate_limit_error"; code = "queue_full"; break;
    case 503: type = "unavailable_error"; break;
    default:
        if (http_status >= 500) type = "server_error";
    }
    json_t *e = json_pack("{s:s%,s:s,s:s?,s:s?}", "message", msg ? msg : "", strlen(msg ? msg : ""),
                          "type", type, "param", param, "code", code);
    if (!e) { /* a message that is not UTF-8 */
        char *c = srv_utf8_clean(msg ? msg : "", strlen(msg ? msg : ""), NULL);
        e = json_pack("{s:s,s:s,s:s?,s:s?}", "message", c ? c : "error", "type", type, "param", param,
                      "code", code);
        free(c);
    }
    return dump(json_pack("{s:o}", "error", e));
}

static json_t *token_json(srv_server *s, int32_t id) {
    size_t n = 0;
    const char *t = tok_token_text(s->tok, id, &n);
    return jstr(t ? t : "", n);
}

static json_t *bytes_json(srv_server *s, int32_t id) {
    size_t n = 0;
    const unsigned char *t = (const unsigned char *)tok_token_text(s->tok, id, &n);
    json_t *a = json_array();
    for (size_t i = 0; a && t && i < n; i++) json_array_append_new(a, json_integer(t[i]));
    return a;
}

/* Completions: {tokens, token_logprobs, top_logprobs, text_offset} for outputs [a, b). */
static json_t *logprobs_completion(srv_server *s, const srv_req *r, uint32_t a, uint32_t b) {
    json_t *toks = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    for (uint32_t i = a; i < b; i++) {
        json_array_append_new(toks, token_json(s, r->out_ids[i]));
        json_array_append_new(lps, jreal(r->out_lp[i]));
        json_t *o = json_object();
        for (uint32_t k = 0; k < r->p.top_logprobs; k++) {
            const srv_top *t = &r->out_top[(size_t)i * r->p.top_logprobs + k];
            if (t->id < 0) continue;
            size_t n = 0;
            const char *tx = tok_token_text(s->tok, t->id, &n);
            char *key = srv_utf8_clean(tx ? tx : "", n, NULL);
            if (key) json_object_set_new(o, key, jreal(t->logprob));
            free(key);
        }
        json_array_append_new(tops, o);
        json_array_append_new(offs, json_integer(i ? r->out_text_end[i - 1] : 0));
    }
    return json_pack("{s:o,s:o,s:o,s:o}", "tokens", toks, "token_logprobs", lps, "top_logprobs", tops,
                     "text_offset", offs);
}

/* Chat: {content: [{token, logprob, bytes, top_logprobs}]} for outputs [a, b). */
static json_t *logprobs_chat(srv_server *s, const srv_req *r, uint32_t a, uint32_t b) {
    json_t *content = json_array();
    for (uint32_t i = a; i < b; i++) {
        json_t *tops = json_array();
        for (uint32_t k = 0; k < r->p.top_logprobs; k++) {
            const srv_top *t = &r->out_top[(size_t)i * r->p.top_logprobs + k];
            if (t->id < 0) continue;
            json_array_append_new(tops, json_pack("{s:o,s:o,s:o}", "token", token_json(s, t->id),
                                                  "logprob", jreal(t->logprob), "bytes",
                                                  bytes_json(s, t->id)));
        }
        json_array_append_new(content, json_pack("{s:o,s:o,s:o,s:o}", "token", token_json(s, r->out_ids[i]),
                                                 "logprob", jreal(r->out_lp[i]), "bytes",
                                                 bytes_json(s, r->out_ids[i]), "top_logprobs", tops));
    }
    return json_pack("{s:o}", "content", content);
}

static json_t *token_ids_json(const srv_req *r, uint32_t a, uint32_t b) {
    json_t *ids = json_array();
    for (uint32_t i = a; i < b; i++) json_array_append_new(ids, json_integer(r->out_ids[i]));
    return ids;
}

static json_t *usage_json(const srv_req *r) {
    return json_pack("{s:I,s:I,s:I,s:{s:I}}", "prompt_tokens", (json_int_t)r->p.n_prompt, "completion_tokens",
                     (json_int_t)r->n_out, "total_tokens", (json_int_t)r->p.n_prompt + r->n_out,
                     "prompt_tokens_details", "cached_tokens", (json_int_t)r->cached_tokens);
}

/* The JSON type a tool's parameter declares ("string", "integer", ...), or NULL. */
static const char *param_type(const srv_req *r, const char *fn, const char *key) {
    size_t i;
    json_t *t;
    json_array_foreach(r->p.tool_defs, i, t) {
        json_t *f = json_object_get(t, "function");
        const char *name = json_string_value(json_object_get(f, "name"));
        if (!name || strcmp(name, fn) != 0) continue;
        json_t *prop = json_object_get(json_object_get(json_object_get(f, "parameters"), "properties"), key);
        return json_string_value(json_object_get(prop, "type"));
    }
    return NULL;
}

/* A parsed call's arguments as a compact JSON object text: a value the tool declares a string
 * stays text; any other is JSON if it parses as JSON, else text (GLM writes strings bare). */
static json_t *call_args(const srv_req *r, const chat_parsed_call *pc) {
    json_t *o = json_object();
    for (size_t a = 0; o && a < pc->n_args; a++) {
        const char *ty = param_type(r, pc->name, pc->keys[a]);
        json_t *v = NULL;
        if (!ty || strcmp(ty, "string") != 0) v = json_loads(pc->values[a], JSON_DECODE_ANY, NULL);
        if (!v) v = jstr(pc->values[a], strlen(pc->values[a]));
        json_object_set_new(o, pc->keys[a], v);
    }
    char *txt = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    json_t *j = txt ? jstr(txt, strlen(txt)) : NULL;
    free(txt);
    return j;
}

static json_t *tool_call_json(const srv_req *r, const chat_parsed_call *pc, size_t i, int stream) {
    char id[96];
    const char *dash = strchr(r->id, '-');
    snprintf(id, sizeof id, "call_%s_%zu", dash ? dash + 1 : r->id, i);
    json_t *fn = json_pack("{s:o,s:o}", "name", jstr(pc->name, strlen(pc->name)), "arguments", call_args(r, pc));
    json_t *tc = json_pack("{s:s,s:s,s:o}", "id", id, "type", "function", "function", fn);
    if (tc && stream) json_object_set_new(tc, "index", json_integer((json_int_t)i));
    return tc;
}

static size_t n_calls_shown(const srv_req *r, const chat_parser *cp) {
    size_t n = chat_parser_n_calls(cp);
    return !r->p.parallel_tool_calls && n > 1 ? 1 : n;
}

static int all_space(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strchr(" \t\r\n", s[i])) return 0;
    return 1;
}

/* The whole chat message of a finished request: content, reasoning_content, tool_calls. */
static json_t *chat_message_json(const srv_req *r, size_t *n_calls) {
    chat_parser *cp = NULL;
    *n_calls = 0;
    if (chat_parser_create(r->p.think, r->p.tools, &cp, NULL) != G5_OK ||
        chat_parser_feed(cp, r->text ? r->text : "", r->text_len, NULL) != G5_OK ||
        chat_parser_finish(cp, NULL) != G5_OK) {
        chat_parser_free(cp);
        return NULL;
    }
    size_t cl, rl;
    const char *content = chat_parser_content(cp, &cl), *reasoning = chat_parser_reasoning(cp, &rl);
    *n_calls = n_calls_shown(r, cp);
    json_t *m = json_pack("{s:s}", "role", "assistant");
    json_object_set_new(m, "content", *n_calls && all_space(content, cl) ? json_null() : jstr(content, cl));
    if (rl || r->p.think) json_object_set_new(m, "reasoning_content", rl ? jstr(reasoning, rl) : json_null());
    if (*n_calls) {
        json_t *a = json_array();
        for (size_t i = 0; i < *n_calls; i++) json_array_append_new(a, tool_call_json(r, chat_parser_call(cp, i), i, 0));
        json_object_set_new(m, "tool_calls", a);
    }
    chat_parser_free(cp);
    return m;
}

/* A streamed chat delta: what the parser's results grew by since the last chunk (text up to
 * upto fed; at the end, everything). Under mu; updates r's sent counters. */
static json_t *chat_delta_json(srv_req *r, size_t upto, int first, int final, size_t *n_calls) {
    json_t *d = json_object();
    *n_calls = 0;
    if (!r->cp && chat_parser_create(r->p.think, r->p.tools, &r->cp, NULL) != G5_OK) return d;
    if (upto > r->cp_fed) {
        chat_parser_feed(r->cp, r->text + r->cp_fed, upto - r->cp_fed, NULL);
        r->cp_fed = upto;
    }
    if (final) chat_parser_finish(r->cp, NULL);
    if (first) json_object_set_new(d, "role", json_string("assistant"));
    size_t cl, rl;
    const char *content = chat_parser_content(r->cp, &cl), *reasoning = chat_parser_reasoning(r->cp, &rl);
    if (rl > r->sent_r) json_object_set_new(d, "reasoning_content", jstr(reasoning + r->sent_r, rl - r->sent_r));
    if (cl > r->sent_c || (first && rl == 0)) json_object_set_new(d, "content", jstr(content + r->sent_c, cl - r->sent_c));
    r->sent_r = rl;
    r->sent_c = cl;
    size_t nc = n_calls_shown(r, r->cp);
    if (nc > r->sent_calls) {
        json_t *a = json_array();
        for (size_t i = r->sent_calls; i < nc; i++)
            json_array_append_new(a, tool_call_json(r, chat_parser_call(r->cp, i), i, 1));
        json_object_set_new(d, "tool_calls", a);
        r->sent_calls = nc;
    }
    *n_calls = nc;
    return d;
}

static json_t *choice_json(srv_server *s, srv_req *r, uint32_t a, uint32_t b, size_t t0,
                           size_t t1, int stream, int first, int final) {
    json_t *ch = json_object();
    json_object_set_new(ch, "index", json_integer(0));
    size_t n_calls = 0;
    if (r->p.kind == SRV_KIND_COMPLETION) {
        json_object_set_new(ch, "text", jstr(r->text ? r->text + t0 : "", t1 - t0));
    } else if (!stream) {
        json_object_set_new(ch, "message", chat_message_json(r, &n_calls));
    } else {
        json_object_set_new(ch, "delta", chat_delta_json(r, t1, first, final, &n_calls));
    }
    json_t *lp = json_null();
    if (r->p.logprobs && (b > a || !stream)) {
        json_decref(lp);
        lp = r->p.kind == SRV_KIND_COMPLETION ? logprobs_completion(s, r, a, b) : logprobs_chat(s, r, a, b);
    }
    json_object_set_new(ch, "logprobs", lp);
    const char *finish = final ? r->finish : NULL;
    if (finish && n_calls && !strcmp(finish, "stop")) finish = "tool_calls";
    json_object_set_new(ch, "finish_reason", finish ? json_string(finish) : json_null());
    if (r->p.return_token_ids) json_object_set_new(ch, "token_ids", token_ids_json(r, a, b));
    return ch;
}

static json_t *envelope(srv_server *s, const srv_req *r, int stream) {
    const char *object = r->p.kind == SRV_KIND_COMPLETION ? "text_completion"
                         : stream                           ? "chat.completion.chunk"
                                                            : "chat.completion";
    return json_pack("{s:s,s:s,s:I,s:s}", "id", r->id, "object", object, "created", (json_int_t)r->created,
                     "model", s->model_name);
}

char *srv_api_response_json(srv_server *s, const srv_req *r) {
    json_t *o = envelope(s, r, 0);
    if (!o) return NULL;
    json_t *choices = json_array();
    json_array_append_new(choices, choice_json(s, (srv_req *)r, 0, r->n_out, 0, r->text_len, 0, 1, 1));
    json_object_set_new(o, "choices", choices);
    json_object_set_new(o, "usage", usage_json(r));
    return dump(o);
}

static char *sse(char *json) {
    if (!json) return NULL;
    size_t n = strlen(json);
    char *o = malloc(n + 9);
    if (o) {
        memcpy(o, "data: ", 6);
        memcpy(o + 6, json, n);
        memcpy(o + 6 + n, "\n\n", 3);
    }
    free(json);
    return o;
}

char *srv_api_stream_chunk(srv_server *s, srv_req *r, uint32_t from_tok, size_t from_text,
                           size_t upto, int first, int final) {
    json_t *o = envelope(s, r, 1);
    if (!o) return NULL;
    json_t *choices = json_array();
    json_array_append_new(choices, choice_json(s, r, from_tok, r->n_out, from_text, upto, 1, first, final));
    json_object_set_new(o, "choices", choices);
    return sse(dump(o));
}

char *srv_api_stream_usage(srv_server *s, const srv_req *r) {
    json_t *o = envelope(s, r, 1);
    if (!o) return NULL;
    json_object_set_new(o, "choices", json_array());
    json_object_set_new(o, "usage", usage_json(r));
    return sse(dump(o));
}

char *srv_api_models_json(srv_server *s) {
    json_t *m = json_pack("{s:s,s:s,s:I,s:s}", "id", s->model_name, "object", "model", "created",
                          (json_int_t)s->created, "owned_by", "glm5-shard");
    if (m && s->load == SRV_READY) json_object_set_new(m, "max_model_len", json_integer(s->max_ctx));
    json_t *data = json_array();
    json_array_append_new(data, m);
    return dump(json_pack("{s:s,s:o}", "object", "list", "data", data));
}

char *srv_api_model_json(srv_server *s) {
    json_t *m = json_pack("{s:s,s:s,s:I,s:s,s:s}", "id", s->model_name, "object", "model", "created",
                          (json_int_t)s->created, "owned_by", "glm5-shard", "root", s->model_path);
    if (m && s->load == SRV_READY) json_object_set_new(m, "max_model_len", json_integer(s->max_ctx));
    return dump(m);
}

/* The body of /tokenize or /detokenize, with its model checked. NULL: *status and msg set. */
static json_t *load_body(srv_server *s, const char *body, size_t len, pctx *c) {
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(root)) {
        json_decref(root);
        bad(c, NULL, "the request body must be a JSON object");
        return NULL;
    }
    json_t *model = json_object_get(root, "model");
    if (model && !json_is_null(model) &&
        (!json_is_string(model) || strcmp(json_string_value(model), s->model_name) != 0)) {
        c->status = 404;
        bad(c, "model", "The model `%.200s` does not exist (this server has `%.200s`).",
            json_is_string(model) ? json_string_value(model) : "?", s->model_name);
        json_decref(root);
        return NULL;
    }
    return root;
}

/* vLLM's {"prompt": TEXT} or {"messages": [...]} and llama-server's {"content": TEXT}; the
 * answer carries both servers' fields: tokens, count, max_model_len (and token_strs / pieces
 * when asked: "return_token_strs" or "with_pieces"). Text is encoded as /v1/completions does
 * (special-token texts become those tokens); messages as /v1/chat/completions renders them. */
int srv_api_tokenize(srv_server *s, const char *body, size_t len, char **out, char *msg, size_t cap,
                     const char **param) {
    *param = NULL;
    *out = NULL;
    pctx c = {msg, cap, param, 0};
    json_t *root = load_body(s, body, len, &c);
    if (!root) return c.status ? c.status : 400;
    srv_params p;
    memset(&p, 0, sizeof p);
    int rc = 0, strs = 0, pieces = 0;
    json_t *text = json_object_get(root, "prompt");
    if (!text) text = json_object_get(root, "content");
    if (get_bool(root, "return_token_strs", &strs, &c) < 0 || get_bool(root, "with_pieces", &pieces, &c) < 0) {
        rc = -1;
    } else if (json_object_get(root, "messages")) {
        int gen = 1;
        if (get_bool(root, "add_generation_prompt", &gen, &c) < 0) rc = -1;
        else rc = parse_messages(s, root, &p, &c);
        if (rc == 0 && !gen) { /* drop the generation prompt: "<|assistant|>" and "<think>" or "</think>" */
            int32_t a = tok_lookup(s->tok, "<|assistant|>", 13);
            uint32_t k = p.n_prompt;
            if (k && s->chat_fmt == CHAT_FORMAT_GLM5) k--;
            if (k && p.prompt[k - 1] == a) p.n_prompt = k - 1;
        }
    } else if (json_is_string(text)) {
        rc = encode_text(s, json_string_value(text), json_string_length(text), &p.prompt, &p.n_prompt, "prompt", &c);
    } else {
        rc = bad(&c, "prompt", "'prompt' (or 'content') must be a string, or give 'messages'");
    }
    if (rc == 0) {
        json_t *ids = json_array(), *ts = json_array();
        for (uint32_t i = 0; i < p.n_prompt; i++) {
            json_array_append_new(ids, json_integer(p.prompt[i]));
            if (strs || pieces) json_array_append_new(ts, token_json(s, p.prompt[i]));
        }
        json_t *o = json_pack("{s:o,s:I,s:I}", "tokens", ids, "count", (json_int_t)p.n_prompt, "max_model_len",
                              (json_int_t)s->max_ctx);
        if (o && strs) json_object_set(o, "token_strs", ts);
        if (o && pieces) json_object_set(o, "pieces", ts);
        json_decref(ts);
        *out = dump(o);
    }
    srv_params_clear(&p);
    json_decref(root);
    return rc ? (c.status ? c.status : 400) : 0;
}

/* {"tokens": [ids]} -> {"prompt": TEXT, "content": TEXT} (vLLM's and llama-server's names); special
 * tokens are rendered as their text, so tokenize(detokenize(x)) = x for such ids. */
int srv_api_detokenize(srv_server *s, const char *body, size_t len, char **out, char *msg, size_t cap,
                       const char **param) {
    *param = NULL;
    *out = NULL;
    pctx c = {msg, cap, param, 0};
    json_t *root = load_body(s, body, len, &c);
    if (!root) return c.status ? c.status : 400;
    int32_t *ids = NULL;
    uint32_t n = 0;
    json_t *a = json_object_get(root, "tokens");
    int rc = 0;
    if (!json_is_array(a) || (json_array_size(a) && !all_integers(a))) {
        rc = bad(&c, "tokens", "'tokens' must be an array of token ids");
    } else if (json_array_size(a) == 0) {
        ids = malloc(sizeof *ids);
        if (!ids) rc = bad(&c, "tokens", "out of memory");
    } else {
        rc = ids_from_array(s, a, &ids, &n, &c);
        if (rc) *param = "tokens";
    }
    if (rc == 0) {
        size_t need = 0;
        g5_error e = {0};
        tok_decode(s->tok, ids, n, TOK_DECODE_SPECIAL, NULL, 0, &need, &e);
        char *t = malloc(need + 1);
        if (!t || tok_decode(s->tok, ids, n, TOK_DECODE_SPECIAL, t, need, &need, &e) != G5_OK) {
            rc = bad(&c, "tokens", "cannot decode: %s", e.msg[0] ? e.msg : "out of memory");
        } else {
            json_t *js = jstr(t, need);
            *out = dump(json_pack("{s:O,s:o}", "prompt", js, "content", js));
        }
        free(t);
    }
    free(ids);
    json_decref(root);
    return rc ? (c.status ? c.status : 400) : 0;
}
