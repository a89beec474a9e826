/* Tokenizer: GPT-2 style byte-level BPE as GGUF stores it (tokenizer.ggml.model = "gpt2"), with
 * GLM-4's pre-tokenizer (tokenizer.ggml.pre = "glm4" or "chatglm-bpe").
 *
 * Encoding follows Hugging Face `tokenizers` (the oracle's tokenizer.json) and llama.cpp:
 *  1. special tokens (token_type CONTROL or USER_DEFINED) are cut out first, leftmost-longest;
 *  2. the text between them is split by GLM-4's regex (see tokenizer.c);
 *  3. each piece is mapped byte -> printable code point (GPT-2 bytes_to_unicode) and merged by
 *     BPE, lowest merge rank first, leftmost first among equal ranks.
 * Known difference: character classes come from PCRE2's Unicode tables, so code points assigned
 * after that Unicode version (14 for PCRE2 10.42) may split differently than in the oracle.
 * No BOS is ever added: GLM prompts start with the explicit text "[gMASK]<sop>" (see chat.h),
 * and llama.cpp also disables the automatic BOS for the glm4 pre-tokenizer.
 *
 * Everything is built at tok_create() into hash tables (token text -> id, (left, right) merge
 * pair -> rank), so encoding costs do not grow with the vocabulary size. A tok_ctx is read-only
 * after creation: any number of threads may encode/decode with it concurrently. */
#ifndef G5_TOKENIZER_H
#define G5_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "format/gguf.h"
#include "format/status.h"

typedef struct tok_ctx tok_ctx;

/* tokenizer.ggml.token_type values (llama.cpp's llama_token_type). */
typedef enum tok_type {
    TOK_TYPE_UNDEFINED = 0,
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER_DEFINED = 4,
    TOK_TYPE_UNUSED = 5,
    TOK_TYPE_BYTE = 6,
} tok_type;

/* Well-known token ids. The first six come from tokenizer.ggml.*_token_id when present; the rest
 * (and any of the first six missing from the metadata, where a GLM name exists) are found by
 * their text among the special tokens. tok_special_id() returns -1 for one that is absent. */
typedef enum tok_special {
    TOK_SP_BOS,          /* metadata only; GLM: [gMASK]. Never added automatically. */
    TOK_SP_EOS,          /* <|endoftext|> */
    TOK_SP_EOT,          /* <|user|>: the model hands the turn back */
    TOK_SP_EOM,          /* <|observation|>: the model waits for a tool result */
    TOK_SP_UNK,
    TOK_SP_PAD,
    TOK_SP_ENDOFTEXT,    /* <|endoftext|> */
    TOK_SP_GMASK,        /* [gMASK] */
    TOK_SP_SOP,          /* <sop> */
    TOK_SP_EOP,          /* <eop> */
    TOK_SP_SYSTEM,       /* <|system|> */
    TOK_SP_USER,         /* <|user|> */
    TOK_SP_ASSISTANT,    /* <|assistant|> */
    TOK_SP_OBSERVATION,  /* <|observation|> */
    TOK_SP_THINK,        /* <think> */
    TOK_SP_END_THINK,    /* </think> */
    TOK_SP_NOTHINK,      /* /nothink */
    TOK_SP_COUNT
} tok_special;

/* A vocabulary given directly (tests, fuzzing); tok_create() fills one from GGUF metadata.
 * Token texts are in GGUF form: byte-level code points for normal tokens, plain text for
 * CONTROL / USER_DEFINED ones. Merges are "LEFT RIGHT" strings, rank = index. All memory is
 * copied; nothing needs to outlive the call. */
typedef struct tok_vocab_desc {
    uint32_t n_tokens;
    const char *const *tokens;   /* [n_tokens] */
    const uint64_t *token_lens;  /* [n_tokens] byte lengths */
    const int32_t *token_types;  /* [n_tokens] tok_type values, or NULL: all NORMAL */
    uint64_t n_merges;
    const char *const *merges;   /* [n_merges] */
    const uint64_t *merge_lens;  /* [n_merges] */
    /* tokenizer.ggml.{bos,eos,eot,eom,unknown,padding}_token_id, -1 when absent */
    int32_t bos, eos, eot, eom, unk, pad;
} tok_vocab_desc;

/* Reads tokenizer.ggml.{model,pre,tokens,token_type,merges,*_token_id} from the metadata.
 * The gguf_ctx may be freed afterwards. Errors: NOT_FOUND (tokens/merges missing),
 * UNSUPPORTED (model other than "gpt2", unknown pre-tokenizer), FORMAT (inconsistent arrays,
 * ids out of range), WRONG_TYPE, NOMEM, INTERNAL (PCRE2 failure). */
g5_status tok_create(const gguf_ctx *gguf, tok_ctx **out, g5_error *err);
g5_status tok_create_from_vocab(const tok_vocab_desc *desc, tok_ctx **out, g5_error *err);
void tok_free(tok_ctx *ctx); /* accepts NULL */

uint32_t tok_n_vocab(const tok_ctx *ctx);
int32_t tok_special_id(const tok_ctx *ctx, tok_special which); /* -1 if absent */
/* End of generation: EOS, EOT, EOM and <|endoftext|>, <|user|>, <|observation|> when present. */
int tok_is_eog(const tok_ctx *ctx, int32_t id);
tok_type tok_token_type(const tok_ctx *ctx, int32_t id); /* UNDEFINED if out of range */
/* Id of the token whose GGUF text is exactly (text, len): special tokens first, then normal
 * ones; -1 if none. E.g. tok_lookup(ctx, "<|user|>", 8). */
int32_t tok_lookup(const tok_ctx *ctx, const char *text, size_t len);
/* The bytes a token decodes to (byte-level mapping undone; special tokens: their text).
 * Not NUL-terminated. NULL (and *len = 0) if id is out of range. */
const char *tok_token_text(const tok_ctx *ctx, int32_t id, size_t *len);

/* Encodes len bytes of text. parse_special: 1 = CONTROL and USER_DEFINED token texts in the
 * input become those tokens (for prompts built by chat_build_prompt); 0 = only USER_DEFINED
 * ones do (llama.cpp's rule) and e.g. "<|user|>" typed by a user is encoded as plain text.
 * Writes at most cap ids; *n_out receives the total count. Returns G5_ERR_BOUNDS if cap was
 * too small (ids beyond cap are dropped but counted). Never produces more than len ids, so
 * cap = len always suffices. Invalid UTF-8 is accepted: its bytes are encoded like any other
 * bytes and decode back unchanged. */
g5_status tok_encode(const tok_ctx *ctx, const char *text, size_t len, int parse_special,
                     int32_t *ids, size_t cap, size_t *n_out, g5_error *err);

/* tok_decode / stream flags. */
#define TOK_DECODE_SPECIAL 1u /* render CONTROL tokens' text (otherwise they produce nothing) */

/* Concatenates the tokens' bytes. Writes at most cap bytes (no NUL); *n_out receives the total
 * size. G5_ERR_BOUNDS if cap was too small, G5_ERR_INVALID_ARG for an id out of range. */
g5_status tok_decode(const tok_ctx *ctx, const int32_t *ids, size_t n, unsigned flags, char *out,
                     size_t cap, size_t *n_out, g5_error *err);

/* Streaming decoder for generation: pushes one id at a time and returns the bytes that are safe
 * to show, holding back a trailing UTF-8 sequence that is not complete yet (tokens often split
 * a multi-byte character). Bytes that can never become valid UTF-8 are passed through as they
 * are, so the concatenation of all outputs plus the final flush equals tok_decode() of the
 * same ids. The returned pointer stays valid until the next call on the stream. */
typedef struct tok_stream tok_stream;
g5_status tok_stream_create(const tok_ctx *ctx, unsigned flags, tok_stream **out, g5_error *err);
void tok_stream_free(tok_stream *s); /* accepts NULL */
g5_status tok_stream_push(tok_stream *s, int32_t id, const char **bytes, size_t *n, g5_error *err);
/* Returns whatever is still held back (possibly an incomplete sequence) and empties the stream. */
void tok_stream_flush(tok_stream *s, const char **bytes, size_t *n);
size_t tok_stream_pending(const tok_stream *s); /* bytes currently held back (0..3) */

#endif
