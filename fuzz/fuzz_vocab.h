/* The small in-memory vocabulary the fuzz targets tokenize with: all 256 byte symbols (GPT-2's
 * bytes_to_unicode mapping, so every input encodes) plus the target's extra tokens and merges. */
#ifndef G5_FUZZ_VOCAB_H
#define G5_FUZZ_VOCAB_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/text/tokenizer.h"

enum { FUZZ_VOCAB_MAX_EXTRA = 64, FUZZ_VOCAB_MAX_MERGES = 64 };

static inline size_t fuzz_put_cp(uint32_t cp, char *o) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    o[0] = (char)(0xc0 | cp >> 6);
    o[1] = (char)(0x80 | (cp & 63));
    return 2;
}

/* extra[i] gets token id 256 + i and type extra_type[i]; eos is a token id. Aborts on failure. */
static inline tok_ctx *fuzz_byte_vocab(const char *const *extra, const int32_t *extra_type, int n_extra,
                                       const char *const *merges, int n_merges, int32_t eos) {
    static char sym[256][4];
    const char *toks[256 + FUZZ_VOCAB_MAX_EXTRA];
    uint64_t lens[256 + FUZZ_VOCAB_MAX_EXTRA];
    int32_t types[256 + FUZZ_VOCAB_MAX_EXTRA];
    uint64_t mlens[FUZZ_VOCAB_MAX_MERGES];
    if (n_extra > FUZZ_VOCAB_MAX_EXTRA || n_merges > FUZZ_VOCAB_MAX_MERGES) abort();
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
        lens[b] = fuzz_put_cp(printable ? b : next++, sym[b]);
        toks[b] = sym[b];
        types[b] = 1;
    }
    for (int i = 0; i < n_extra; i++) {
        toks[256 + i] = extra[i];
        lens[256 + i] = strlen(extra[i]);
        types[256 + i] = extra_type[i];
    }
    for (int i = 0; i < n_merges; i++) mlens[i] = strlen(merges[i]);
    tok_vocab_desc d = {(uint32_t)(256 + n_extra), toks, lens, types, (uint64_t)n_merges, merges,
                        mlens, -1, eos, -1, -1, -1, -1};
    tok_ctx *t = NULL;
    if (tok_create_from_vocab(&d, &t, NULL) != G5_OK) abort();
    return t;
}

#endif
