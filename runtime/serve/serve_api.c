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

static int parse_messages(srv_server *s, json_t *root, srv_params *p, pctx *c) {
    json_t *ms = json_object_get(root, "messages");
    if (!json_is_array(ms) || json_array_size(ms) == 0)
        return bad(c, "messages", "'messages' must be a non-empty array");
    size_t n = json_array_size(ms);
    if (n > SRV_MAX_MESSAGES) return bad(c, "messages", "at most %d messages", SRV_MAX_MESSAGES);
    chat_message *cm = calloc(n, sizeof *cm);
    char **contents = calloc(n, sizeof *contents);
    int rc = 0;
    size_t total = 64;
    if (!cm || !contents) rc = bad(c, "messages", "out of memory");
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
        contents[i] = message_content(m, i, c);
        if (!contents[i]) {
            rc = -1;
            break;
        }
        cm[i].role = r;
        cm[i].content = contents[i];
        total += strlen(contents[i]) + 64;
    }
    chat_options co;
    chat_options_default(&co);
    co.format = s->chat_fmt;
    json_t *kw = json_object_get(root, "chat_template_kwargs");
    if (rc == 0 && kw && !json_is_null(kw)) {
        if (!json_is_object(kw)) rc = bad(c, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
        else if (get_bool(kw, "enable_thinking", &co.enable_thinking, c) < 0) rc = -1;
    }
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
        g5_status st = chat_build_prompt(cm, n, &co, text, total, &need, &e);
        if (st == G5_OK) break;
        if (st != G5_ERR_BOUNDS || tries == 1) rc = bad(c, "messages", "messages: %s", e.msg);
        total = need;
    }
    if (rc == 0) rc = encode_text(s, text, need, &p->prompt, &p->n_prompt, "messages", c);
    free(text);
    for (size_t i = 0; contents && i < n; i++) free(contents[i]);
    free(contents);
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
    pctx c = {msg, msg_cap, param};
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
        rc = 400;
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
    return json_pack("{s:I,s:I,s:I}", "prompt_tokens", (json_int_t)r->p.n_prompt, "completion_tokens",
                     (json_int_t)r->n_out, "total_tokens", (json_int_t)r->p.n_prompt + r->n_out);
}

static json_t *choice_json(srv_server *s, const srv_req *r, uint32_t a, uint32_t b, size_t t0,
                           size_t t1, int stream, int first, int final) {
    json_t *ch = json_object();
    json_object_set_new(ch, "index", json_integer(0));
    json_t *text = jstr(r->text ? r->text + t0 : "", t1 - t0);
    if (r->p.kind == SRV_KIND_COMPLETION) {
        json_object_set_new(ch, "text", text);
    } else if (!stream) {
        json_object_set_new(ch, "message", json_pack("{s:s,s:o}", "role", "assistant", "content", text));
    } else {
        json_t *delta = json_object();
        if (first) json_object_set_new(delta, "role", json_string("assistant"));
        if (t1 > t0 || first) json_object_set_new(delta, "content", text);
        else json_decref(text);
        json_object_set_new(ch, "delta", delta);
    }
    json_t *lp = json_null();
    if (r->p.logprobs && (b > a || !stream)) {
        json_decref(lp);
        lp = r->p.kind == SRV_KIND_COMPLETION ? logprobs_completion(s, r, a, b) : logprobs_chat(s, r, a, b);
    }
    json_object_set_new(ch, "logprobs", lp);
    json_object_set_new(ch, "finish_reason", final && r->finish ? json_string(r->finish) : json_null());
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
    json_array_append_new(choices, choice_json(s, r, 0, r->n_out, 0, r->text_len, 0, 1, 1));
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

char *srv_api_stream_chunk(srv_server *s, const srv_req *r, uint32_t from_tok, size_t from_text,
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
