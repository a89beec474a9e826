/* libFuzzer target: arbitrary HTTP request bodies through glm5-serve's request parser
 * (srv_api_parse: JSON -> validated srv_params, which renders chat messages through the chat
 * template of runtime/text/chat.c and encodes the prompt) and the /tokenize and /detokenize
 * bodies. The first byte picks the endpoint and the chat format; the rest is the body.
 * Properties checked: every body gets 0 or a 4xx/5xx status with a message; an accepted
 * request has a prompt of in-range ids that fits the context, and its stop strings are within
 * the limits. The server is a bare srv_server with a small in-memory vocabulary (no model). */
#include "runtime/serve/serve_int.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

static srv_server g_srv;

static size_t put_cp(uint32_t cp, char *o) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    o[0] = (char)(0xc0 | cp >> 6);
    o[1] = (char)(0x80 | (cp & 63));
    return 2;
}

/* All 256 byte symbols plus the chat template's special tokens, so rendered prompts encode. */
static tok_ctx *make_vocab(void) {
    static char sym[256][4];
    static const char *extra[] = {"[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>",
                                  "<|observation|>", "<think>", "</think>", "<tool_call>",
                                  "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
                                  "</arg_value>", "<tool_response>", "</tool_response>",
                                  "<|endoftext|>", "th", "the"};
    enum { N_EXTRA = 19, N_MERGES = 2 };
    static const char *merges[] = {"t h", "th e"};
    const char *toks[256 + N_EXTRA];
    uint64_t lens[256 + N_EXTRA];
    int32_t types[256 + N_EXTRA];
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; b++) { /* GPT-2 bytes_to_unicode */
        int printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
        lens[b] = put_cp(printable ? b : next++, sym[b]);
        toks[b] = sym[b];
        types[b] = 1;
    }
    for (int i = 0; i < N_EXTRA; i++) {
        toks[256 + i] = extra[i];
        lens[256 + i] = strlen(extra[i]);
        types[256 + i] = i < N_EXTRA - 2 ? 3 : 1;
    }
    uint64_t mlens[N_MERGES];
    for (int i = 0; i < N_MERGES; i++) mlens[i] = strlen(merges[i]);
    tok_vocab_desc d = {256 + N_EXTRA, toks, lens, types, N_MERGES, merges, mlens,
                        -1, 256 + 16, -1, -1, -1, -1};
    tok_ctx *t = NULL;
    if (tok_create_from_vocab(&d, &t, NULL) != G5_OK) abort();
    return t;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_srv.tok) {
        g_srv.tok = make_vocab();
        g_srv.n_vocab = tok_n_vocab(g_srv.tok);
        g_srv.max_ctx = 512;
        g_srv.model_name = "glm-5";
        g_srv.load = SRV_READY;
    }
    if (size < 1) return 0;
    g_srv.chat_fmt = (data[0] >> 2) & 1 ? CHAT_FORMAT_GLM45 : CHAT_FORMAT_GLM5;
    const char *body = (const char *)data + 1;
    const size_t len = size - 1;
    char msg[512];
    msg[0] = 0;
    const char *param = NULL;
    const int ep = data[0] & 3;
    if (ep < 2) {
        srv_params p;
        int rc = srv_api_parse(&g_srv, ep ? SRV_KIND_CHAT : SRV_KIND_COMPLETION, body, len, &p, msg,
                               sizeof msg, &param);
        if (rc == 0) {
            if (p.n_prompt == 0 || !p.prompt || p.n_prompt > g_srv.max_ctx) abort();
            if ((uint64_t)p.n_prompt + p.max_tokens > g_srv.max_ctx) abort();
            for (uint32_t i = 0; i < p.n_prompt; i++)
                if (p.prompt[i] < 0 || (uint32_t)p.prompt[i] >= g_srv.n_vocab) abort();
            for (uint32_t i = 0; i < p.n_force; i++)
                if (p.force[i] < 0 || (uint32_t)p.force[i] >= g_srv.n_vocab) abort();
            if (p.n_stops > SRV_MAX_STOPS) abort();
            for (size_t i = 0; i < p.n_stops; i++)
                if (!p.stops[i] || strlen(p.stops[i]) > SRV_MAX_STOP_LEN) abort();
            srv_params_clear(&p);
        } else {
            if (rc < 400 || rc > 599 || !msg[0]) abort();
        }
    } else {
        char *out = NULL;
        int rc = ep == 2 ? srv_api_tokenize(&g_srv, body, len, &out, msg, sizeof msg, &param)
                         : srv_api_detokenize(&g_srv, body, len, &out, msg, sizeof msg, &param);
        if (rc == 0) {
            json_t *j = out ? json_loads(out, JSON_ALLOW_NUL, NULL) : NULL;
            if (!json_is_object(j)) abort(); /* \u0000 is valid JSON: token 0 decodes to a NUL byte */
            json_decref(j);
        } else if (rc < 400 || rc > 599 || !msg[0]) {
            abort();
        }
        free(out);
    }
    return 0;
}
