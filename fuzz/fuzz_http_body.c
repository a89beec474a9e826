/* libFuzzer target: arbitrary HTTP request bodies through glm5-serve's request parser
 * (srv_api_parse: JSON -> validated srv_params, which renders chat messages through the chat
 * template of runtime/text/chat.c and encodes the prompt) and the /tokenize and /detokenize
 * bodies. The first byte picks the endpoint and the chat format; the rest is the body.
 * Properties checked: every body gets 0 or a 4xx/5xx status with a message; an accepted
 * request has a prompt of in-range ids that fits the context, and its stop strings are within
 * the limits. The server is a bare srv_server with a small in-memory vocabulary (no model). */
#include "runtime/serve/serve_int.h"
#include "fuzz/fuzz_vocab.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

static srv_server g_srv;

/* All 256 byte symbols plus the chat template's special tokens, so rendered prompts encode. */
static tok_ctx *make_vocab(void) {
    static const char *const extra[] = {"[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>",
                                        "<|observation|>", "<think>", "</think>", "<tool_call>",
                                        "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
                                        "</arg_value>", "<tool_response>", "</tool_response>",
                                        "<|endoftext|>", "th", "the"};
    static const int32_t extra_type[] = {3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 1, 1};
    static const char *const merges[] = {"t h", "th e"};
    return fuzz_byte_vocab(extra, extra_type, 19, merges, 2, 256 + 16);
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
