/* libFuzzer target: the blob parser (structural checks with and without hashes), the accessors a
 * loader uses on an accepted image, and the set record parser. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "format/blob.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void exercise(const blob *b) {
    const blob_info *in = blob_get_info(b);
    for (uint64_t i = 0; i < blob_n_tensors(b); i++) {
        const blob_tensor *t = blob_get_tensor(b, i);
        if (blob_find_tensor(b, t->name) != t) __builtin_trap(); /* names are unique */
        blob_verify_tensor(b, i, NULL);
    }
    for (uint32_t i = 0; i < blob_n_sources(b); i++) (void)strlen(blob_get_source(b, i)->name);
    char buf[256];
    for (uint64_t c = 0; c < in->n_chunks && c < 4; c++) blob_describe_chunk(b, c, buf, sizeof buf);
    const gguf_ctx *m = blob_get_meta(b);
    for (int64_t i = 0; i < gguf_get_n_kv(m); i++) (void)gguf_get_key(m, i);
    blob_verify_stats st;
    const blob *list[1] = {b};
    blob_verify_data(list, 1, 1, &st, NULL, NULL, 0, NULL);
    blob_verify_stats_clear(&st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    blob *b = NULL;
    if (blob_parse_buffer(data, size, "fuzz", BLOB_PARSE_NO_HASH, &b, NULL) == G5_OK) exercise(b);
    blob_free(b);
    b = NULL;
    if (blob_parse_buffer(data, size, "fuzz", 0, &b, NULL) == G5_OK) exercise(b);
    blob_free(b);
    blob_set_record rec;
    if (blob_set_record_parse(data, size, "fuzz", &rec, NULL) == G5_OK) blob_set_record_clear(&rec);
    return 0;
}
