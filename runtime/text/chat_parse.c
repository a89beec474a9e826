/* GLM-5 output parser: reasoning, content and tool calls (chat_parse.h). */
#include "runtime/text/chat_parse.h"

#include <stdlib.h>
#include <string.h>

#define M_THINK "<think>"
#define M_END_THINK "</think>"
#define M_CALL "<tool_call>"
#define M_END_CALL "</tool_call>"
#define M_KEY "<arg_key>"
#define M_END_KEY "</arg_key>"
#define M_VAL "<arg_value>"
#define M_END_VAL "</arg_value>"

typedef struct dbuf {
    char *p;
    size_t n, cap;
} dbuf;

static int db_put(dbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 64;
        while (nc < b->n + n + 1) nc *= 2;
        char *q = realloc(b->p, nc);
        if (!q) return 0;
        b->p = q;
        b->cap = nc;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 1;
}

typedef enum pstate { P_REASON = 0, P_CONTENT, P_CALL } pstate;

struct chat_parser {
    pstate st;
    int tools, failed, saw_think;
    dbuf pending;  /* text not decided yet */
    dbuf reasoning, content;
    dbuf call;     /* body of the open tool call */
    chat_parsed_call *calls;
    size_t n_calls, cap_calls;
};

g5_status chat_parser_create(int in_reasoning, int tools, chat_parser **out, g5_error *err) {
    *out = calloc(1, sizeof **out);
    if (!*out) return g5_fail(err, G5_ERR_NOMEM, "chat parser");
    (*out)->st = in_reasoning ? P_REASON : P_CONTENT;
    (*out)->tools = tools;
    if (!db_put(&(*out)->reasoning, "", 0) || !db_put(&(*out)->content, "", 0)) {
        chat_parser_free(*out);
        *out = NULL;
        return g5_fail(err, G5_ERR_NOMEM, "chat parser");
    }
    return G5_OK;
}

static void call_free(chat_parsed_call *c) {
    for (size_t i = 0; i < c->n_args; i++) {
        free(c->keys[i]);
        free(c->values[i]);
    }
    free(c->keys);
    free(c->values);
    free(c->name);
}

void chat_parser_free(chat_parser *p) {
    if (!p) return;
    for (size_t i = 0; i < p->n_calls; i++) call_free(&p->calls[i]);
    free(p->calls);
    free(p->pending.p);
    free(p->reasoning.p);
    free(p->content.p);
    free(p->call.p);
    free(p);
}

static const char *find(const char *s, size_t n, const char *m) {
    size_t k = strlen(m);
    for (size_t i = 0; i + k <= n; i++)
        if (s[i] == m[0] && memcmp(s + i, m, k) == 0) return s + i;
    return NULL;
}

/* Length of the longest suffix of s[0, n) that is a proper prefix of marker m. */
static size_t prefix_tail(const char *s, size_t n, const char *m) {
    size_t k = strlen(m);
    for (size_t len = k - 1 < n ? k - 1 : n; len > 0; len--)
        if (memcmp(s + n - len, m, len) == 0) return len;
    return 0;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static char *dup_trim(const char *b, const char *e, int all_ws) {
    if (all_ws) {
        while (b < e && is_ws(*b)) b++;
        while (e > b && is_ws(e[-1])) e--;
    } else { /* one newline each side */
        if (b < e && *b == '\n') b++;
        if (e > b && e[-1] == '\n') e--;
    }
    return strndup(b, (size_t)(e - b));
}

static int all_ws(const char *b, const char *e) {
    for (; b < e; b++)
        if (!is_ws(*b)) return 0;
    return 1;
}

/* Parses a tool call body "NAME<arg_key>K</arg_key><arg_value>V</arg_value>..." into c.
 * Returns 1 on success, 0 if it is not well-formed (c empty), -1 out of memory. */
static int parse_call(const char *s, size_t n, chat_parsed_call *c) {
    memset(c, 0, sizeof *c);
    if (memchr(s, 0, n)) return 0; /* names and arguments are C strings */
    const char *e = s + n;
    const char *k = find(s, n, M_KEY);
    const char *name_end = k ? k : e;
    const char *nb = s, *ne = name_end;
    while (nb < ne && is_ws(*nb)) nb++;
    while (ne > nb && is_ws(ne[-1])) ne--;
    if (nb == ne || find(nb, (size_t)(ne - nb), "<") || find(nb, (size_t)(ne - nb), "\n")) return 0;
    c->name = strndup(nb, (size_t)(ne - nb));
    if (!c->name) return -1;
    size_t cap = 0;
    const char *q = name_end;
    while (q < e) {
        if (!all_ws(q, e) && (size_t)(e - q) >= strlen(M_KEY) && memcmp(q, M_KEY, strlen(M_KEY)) == 0) {
            const char *kb = q + strlen(M_KEY);
            const char *ke = find(kb, (size_t)(e - kb), M_END_KEY);
            if (!ke) goto malformed;
            const char *vb = ke + strlen(M_END_KEY);
            while (vb < e && is_ws(*vb)) vb++;
            if ((size_t)(e - vb) < strlen(M_VAL) || memcmp(vb, M_VAL, strlen(M_VAL)) != 0) goto malformed;
            vb += strlen(M_VAL);
            const char *ve = find(vb, (size_t)(e - vb), M_END_VAL);
            if (!ve) goto malformed;
            if (c->n_args == cap) {
                size_t nc = cap ? cap * 2 : 4;
                char **nk = realloc(c->keys, nc * sizeof *nk);
                if (nk) c->keys = nk;
                char **nv = nk ? realloc(c->values, nc * sizeof *nv) : NULL;
                if (nv) c->values = nv;
                if (!nk || !nv) goto oom;
                cap = nc;
            }
            c->keys[c->n_args] = dup_trim(kb, ke, 1);
            c->values[c->n_args] = dup_trim(vb, ve, 0);
            c->n_args++;
            if (!c->keys[c->n_args - 1] || !c->values[c->n_args - 1]) goto oom;
            q = ve + strlen(M_END_VAL);
            while (q < e && is_ws(*q)) q++;
        } else if (all_ws(q, e)) {
            break;
        } else {
            goto malformed;
        }
    }
    return 1;
malformed:
    call_free(c);
    memset(c, 0, sizeof *c);
    return 0;
oom:
    call_free(c);
    memset(c, 0, sizeof *c);
    return -1;
}

/* Ends the open tool call (its body in p->call). Returns 0 on out of memory. */
static int close_call(chat_parser *p, int terminated) {
    chat_parsed_call c;
    int r = parse_call(p->call.p ? p->call.p : "", p->call.n, &c);
    if (r < 0) return 0;
    if (r == 0) { /* not a call: the text goes to the content as written */
        if (!db_put(&p->content, M_CALL, strlen(M_CALL)) || !db_put(&p->content, p->call.p ? p->call.p : "", p->call.n))
            return 0;
        if (terminated && !db_put(&p->content, M_END_CALL, strlen(M_END_CALL))) return 0;
    } else {
        if (p->n_calls == p->cap_calls) {
            size_t nc = p->cap_calls ? p->cap_calls * 2 : 4;
            chat_parsed_call *q = realloc(p->calls, nc * sizeof *q);
            if (!q) {
                call_free(&c);
                return 0;
            }
            p->calls = q;
            p->cap_calls = nc;
        }
        p->calls[p->n_calls++] = c;
    }
    p->call.n = 0;
    if (p->call.p) p->call.p[0] = 0;
    return 1;
}

/* Decides as much of p->pending as possible; with final, all of it. */
static int run(chat_parser *p, int final) {
    const char *s = p->pending.p ? p->pending.p : "";
    size_t n = p->pending.n, off = 0;
    while (off < n) {
        const char *b = s + off;
        size_t left = n - off;
        if (p->st == P_REASON) {
            const char *m = find(b, left, M_END_THINK);
            if (m) {
                if (!db_put(&p->reasoning, b, (size_t)(m - b))) return 0;
                off += (size_t)(m - b) + strlen(M_END_THINK);
                p->st = P_CONTENT;
                p->saw_think = 1;
                continue;
            }
            size_t hold = final ? 0 : prefix_tail(b, left, M_END_THINK);
            if (!db_put(&p->reasoning, b, left - hold)) return 0;
            off += left - hold;
            break;
        }
        if (p->st == P_CALL) {
            const char *m = find(b, left, M_END_CALL);
            size_t take = m ? (size_t)(m - b) : left - (final ? 0 : prefix_tail(b, left, M_END_CALL));
            if (!db_put(&p->call, b, take)) return 0;
            off += take;
            if (m) {
                off += strlen(M_END_CALL);
                p->st = P_CONTENT;
                if (!close_call(p, 1)) return 0;
                continue;
            }
            break;
        }
        /* content: "<think>" opens reasoning only before any visible text */
        const char *mt = all_ws(p->content.p, p->content.p + p->content.n) && !p->n_calls ? find(b, left, M_THINK) : NULL;
        const char *mc = p->tools ? find(b, left, M_CALL) : NULL;
        const char *m = mt && (!mc || mt < mc) ? mt : mc;
        if (m && m == mt && !all_ws(b, m)) m = mc, mt = NULL; /* text before it: not an opening */
        if (m) {
            if (!db_put(&p->content, b, (size_t)(m - b))) return 0;
            if (m == mt) {
                off += (size_t)(m - b) + strlen(M_THINK);
                p->st = P_REASON;
                p->saw_think = 1;
            } else {
                off += (size_t)(m - b) + strlen(M_CALL);
                p->st = P_CALL;
            }
            continue;
        }
        size_t hold = 0;
        if (!final) {
            if (p->tools) hold = prefix_tail(b, left, M_CALL);
            size_t h2 = prefix_tail(b, left, M_THINK);
            if (h2 > hold) hold = h2;
        }
        if (!db_put(&p->content, b, left - hold)) return 0;
        off += left - hold;
        break;
    }
    if (p->pending.p) {
        memmove(p->pending.p, s + off, n - off);
        p->pending.n = n - off;
        p->pending.p[p->pending.n] = 0;
    }
    if (final && p->st == P_CALL) {
        p->st = P_CONTENT;
        if (!close_call(p, 0)) return 0;
    }
    return 1;
}

g5_status chat_parser_feed(chat_parser *p, const char *text, size_t len, g5_error *err) {
    if (p->failed) return g5_fail(err, G5_ERR_NOMEM, "chat parser: out of memory earlier");
    if (!db_put(&p->pending, text, len) || !run(p, 0)) {
        p->failed = 1;
        return g5_fail(err, G5_ERR_NOMEM, "chat parser");
    }
    return G5_OK;
}

g5_status chat_parser_finish(chat_parser *p, g5_error *err) {
    if (p->failed) return g5_fail(err, G5_ERR_NOMEM, "chat parser: out of memory earlier");
    if (!run(p, 1)) {
        p->failed = 1;
        return g5_fail(err, G5_ERR_NOMEM, "chat parser");
    }
    return G5_OK;
}

const char *chat_parser_reasoning(const chat_parser *p, size_t *len) {
    if (len) *len = p->reasoning.n;
    return p->reasoning.p;
}

const char *chat_parser_content(const chat_parser *p, size_t *len) {
    if (len) *len = p->content.n;
    return p->content.p;
}

size_t chat_parser_n_calls(const chat_parser *p) { return p->n_calls; }

const chat_parsed_call *chat_parser_call(const chat_parser *p, size_t i) {
    return i < p->n_calls ? &p->calls[i] : NULL;
}

int chat_parser_saw_think(const chat_parser *p) { return p->saw_think; }
