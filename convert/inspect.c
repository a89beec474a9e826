#include "inspect.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/glm5.h"
#include "format/quant.h"

void inspect_opts_init(inspect_opts *o) {
    o->max_array = 8;
    o->max_string = 160;
}

/* ---- JSON helpers ---- */

/* A JSON string from bytes that may be invalid UTF-8 (replaced by U+FFFD) or hold NULs. */
static json_t *jstr(const char *s, uint64_t len) {
    json_t *j = json_stringn(s, (size_t)len);
    if (j) return j;
    char *buf = malloc((size_t)len * 3 + 1);
    if (!buf) return NULL;
    size_t o = 0;
    const uint8_t *p = (const uint8_t *)s;
    for (uint64_t i = 0; i < len;) {
        uint8_t c = p[i];
        int n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3
                : (c & 0xF8) == 0xF0 ? 4 : 0;
        int ok = n > 0 && i + (uint64_t)n <= len;
        for (int k = 1; ok && k < n; k++) ok = (p[i + k] & 0xC0) == 0x80;
        if (ok) {
            json_t *probe = json_stringn((const char *)p + i, (size_t)n);
            ok = probe != NULL; /* rejects overlong forms and surrogates */
            json_decref(probe);
        }
        if (ok) {
            memcpy(buf + o, p + i, (size_t)n);
            o += (size_t)n;
            i += (uint64_t)n;
        } else {
            memcpy(buf + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    j = json_stringn(buf, o);
    free(buf);
    return j;
}

static json_t *ju64(uint64_t v) {
    if (v <= (uint64_t)INT64_MAX) return json_integer((json_int_t)v);
    char b[32];
    snprintf(b, sizeof b, "%llu", (unsigned long long)v);
    return json_string(b);
}

/* weights, bytes_per_weight and bits_per_weight of a type total (what fits where). */
static void put_per_weight(json_t *e, uint64_t bytes, uint64_t elems) {
    json_object_set_new(e, "weights", ju64(elems));
    json_object_set_new(e, "bytes_per_weight", json_real(elems ? (double)bytes / (double)elems : 0.0));
    json_object_set_new(e, "bits_per_weight", json_real(elems ? 8.0 * (double)bytes / (double)elems : 0.0));
}

static json_t *jshape(const uint64_t *ne, uint32_t n_dims) {
    json_t *a = json_array();
    for (uint32_t d = 0; d < n_dims && a; d++) json_array_append_new(a, ju64(ne[d]));
    return a;
}

static size_t vtype_size(gguf_vtype t) {
    switch (t) {
    case GGUF_VT_UINT8: case GGUF_VT_INT8: case GGUF_VT_BOOL: return 1;
    case GGUF_VT_UINT16: case GGUF_VT_INT16: return 2;
    case GGUF_VT_UINT32: case GGUF_VT_INT32: case GGUF_VT_FLOAT32: return 4;
    case GGUF_VT_UINT64: case GGUF_VT_INT64: case GGUF_VT_FLOAT64: return 8;
    default: return 0;
    }
}

/* One element of a numeric array (raw little-endian bytes). */
static json_t *jelem(gguf_vtype t, const uint8_t *p) {
    switch (t) {
    case GGUF_VT_UINT8: return json_integer(p[0]);
    case GGUF_VT_INT8: return json_integer((int8_t)p[0]);
    case GGUF_VT_BOOL: return json_boolean(p[0] != 0);
    case GGUF_VT_UINT16: return json_integer(g5_rd_u16(p));
    case GGUF_VT_INT16: return json_integer((int16_t)g5_rd_u16(p));
    case GGUF_VT_UINT32: return json_integer(g5_rd_u32(p));
    case GGUF_VT_INT32: return json_integer((int32_t)g5_rd_u32(p));
    case GGUF_VT_UINT64: return ju64(g5_rd_u64(p));
    case GGUF_VT_INT64: return json_integer((json_int_t)g5_rd_u64(p));
    case GGUF_VT_FLOAT32: {
        uint32_t b = g5_rd_u32(p);
        float f;
        memcpy(&f, &b, 4);
        return json_real(f);
    }
    case GGUF_VT_FLOAT64: {
        uint64_t b = g5_rd_u64(p);
        double f;
        memcpy(&f, &b, 8);
        return json_real(f);
    }
    default: return json_null();
    }
}

static json_t *metadata_entry(const gguf_ctx *ctx, int64_t i, const inspect_opts *o) {
    gguf_value v;
    json_t *e = json_object();
    if (!e) return NULL;
    const char *key = gguf_get_key(ctx, i);
    json_object_set_new(e, "key", jstr(key, strlen(key)));
    if (gguf_get_value(ctx, i, &v) != G5_OK) {
        json_object_set_new(e, "type", json_string("?"));
        json_object_set_new(e, "value", json_null());
        return e;
    }
    json_object_set_new(e, "type", json_string(v.type == GGUF_VT_ARRAY ? "array"
                                                                      : gguf_vtype_name(v.type)));
    switch (v.type) {
    case GGUF_VT_UINT8: case GGUF_VT_UINT16: case GGUF_VT_UINT32: case GGUF_VT_UINT64:
        json_object_set_new(e, "value", ju64(v.v.u));
        break;
    case GGUF_VT_BOOL: json_object_set_new(e, "value", json_boolean(v.v.u != 0)); break;
    case GGUF_VT_INT8: case GGUF_VT_INT16: case GGUF_VT_INT32: case GGUF_VT_INT64:
        json_object_set_new(e, "value", json_integer((json_int_t)v.v.i));
        break;
    case GGUF_VT_FLOAT32: case GGUF_VT_FLOAT64:
        json_object_set_new(e, "value", json_real(v.v.f));
        break;
    case GGUF_VT_STRING: json_object_set_new(e, "value", jstr(v.v.str.s, v.v.str.len)); break;
    case GGUF_VT_ARRAY: {
        gguf_vtype et = v.v.arr.elem_type;
        uint64_t n = v.v.arr.n, shown = n < o->max_array ? n : o->max_array;
        json_object_set_new(e, "elem_type", json_string(gguf_vtype_name(et)));
        json_object_set_new(e, "count", ju64(n));
        json_t *vals = json_array();
        for (uint64_t k = 0; k < shown && vals; k++) {
            if (et == GGUF_VT_STRING) {
                const char *s;
                uint64_t len;
                if (gguf_get_arr_str_at(ctx, i, k, &s, &len) == G5_OK)
                    json_array_append_new(vals, jstr(s, len));
            } else if (vtype_size(et) && v.v.arr.data) {
                json_array_append_new(vals,
                                      jelem(et, (const uint8_t *)v.v.arr.data + k * vtype_size(et)));
            }
        }
        json_object_set_new(e, "values", vals);
        json_object_set_new(e, "truncated", json_boolean(shown < n));
        break;
    }
    default: json_object_set_new(e, "value", json_null()); break;
    }
    return e;
}

/* ---- the audit ---- */

static json_t *hparams_json(const glm5_hparams *hp) {
    json_t *h = json_object();
#define HU(f) json_object_set_new(h, #f, json_integer(hp->f))
    HU(n_layer); HU(n_nextn); HU(n_layer_main); HU(n_embd); HU(n_vocab); HU(n_ctx_train);
    HU(n_ff); HU(n_ff_exp); HU(n_head); HU(n_head_kv); HU(q_lora); HU(kv_lora); HU(qk_nope);
    HU(qk_rope); HU(v_head); HU(n_expert); HU(n_expert_used); HU(n_expert_shared); HU(n_group);
    HU(topk_group); HU(n_leading_dense); HU(expert_gating_func); HU(idx_n_head);
    HU(idx_head_dim); HU(idx_top_k);
#undef HU
    json_object_set_new(h, "expert_weights_scale", json_real(hp->expert_weights_scale));
    json_object_set_new(h, "expert_weights_norm", json_boolean(hp->expert_weights_norm));
    json_object_set_new(h, "rope_theta", json_real(hp->rope_theta));
    json_object_set_new(h, "rms_eps", json_real(hp->rms_eps));
    json_object_set_new(h, "indexer_full_layers", json_integer(glm5_n_idx_full(hp)));
    json_object_set_new(h, "model_version", json_string(glm5_version_name(hp->version)));
    char sched[1024];
    glm5_idx_schedule_str(hp, sched, sizeof sched);
    json_object_set_new(h, "indexer_schedule", json_string(sched));
    json_object_set_new(h, "indexer_schedule_source", json_string(glm5_idx_source_name(hp->idx_source)));
    json_t *types = json_array();
    for (uint32_t il = 0; il < hp->n_layer_main; il++) json_array_append_new(types, json_boolean(hp->idx_full[il]));
    json_object_set_new(h, "indexer_full", types);
    return h;
}

static void add_group(json_t *groups, const char *group, uint64_t bytes) {
    size_t i;
    json_t *g;
    json_array_foreach(groups, i, g) {
        if (strcmp(json_string_value(json_object_get(g, "group")), group) == 0) {
            json_object_set_new(g, "count",
                                json_integer(json_integer_value(json_object_get(g, "count")) + 1));
            json_object_set_new(g, "bytes",
                                json_integer(json_integer_value(json_object_get(g, "bytes")) +
                                             (json_int_t)bytes));
            return;
        }
    }
    g = json_object();
    json_object_set_new(g, "group", json_string(group));
    json_object_set_new(g, "count", json_integer(1));
    json_object_set_new(g, "bytes", json_integer((json_int_t)bytes));
    json_array_append_new(groups, g);
}

/* "decode_per_token": what one decode token reads of these tensors (one rank's), by group
 * (glm5_decode_bytes_of: the CUDA runtime's reads). */
static json_t *decode_json(const glm5_hparams *hp, const glm5_tensor_ref *refs, uint64_t n) {
    glm5_decode_bytes db;
    glm5_decode_bytes_of(hp, refs, n, &db);
    json_t *d = json_object(), *gs = json_array();
    for (int g = 0; g < GLM5_DB_COUNT; g++) {
        if (g == GLM5_DB_NEXTN) continue;
        json_t *e = json_object();
        json_object_set_new(e, "group", json_string(glm5_db_group_name((glm5_db_group)g)));
        json_object_set_new(e, "bytes", json_real(db.group[g]));
        json_array_append_new(gs, e);
    }
    json_object_set_new(d, "groups", gs);
    json_object_set_new(d, "total_bytes", json_real(db.total));
    json_object_set_new(d, "nextn_per_draft_bytes", json_real(db.group[GLM5_DB_NEXTN]));
    return d;
}

static void print_decode(FILE *f, const json_t *d, const char *indent, const char *what) {
    if (!json_is_object(d)) return;
    size_t i;
    const json_t *e;
    fprintf(f, "%sone decode token reads %.1f MB%s (W_UK/W_UV as the GPU decode reads them):\n", indent,
            json_real_value(json_object_get(d, "total_bytes")) / 1e6, what);
    json_array_foreach(json_object_get(d, "groups"), i, e)
        fprintf(f, "%s  %-18s %10.1f MB\n", indent, json_string_value(json_object_get(e, "group")),
                json_real_value(json_object_get(e, "bytes")) / 1e6);
    const double nx = json_real_value(json_object_get(d, "nextn_per_draft_bytes"));
    if (nx > 0) fprintf(f, "%s  NextN block: %.1f MB per drafted token (--draft mtp)\n", indent, nx / 1e6);
}

static void problem(json_t *audit, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends a formatted line to the "problems" array of a GGUF audit or a blob-set report. */
static void problem(json_t *audit, const char *fmt, ...) {
    char buf[1400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    json_array_append_new(json_object_get(audit, "problems"), jstr(buf, strlen(buf)));
}

static json_t *audit_glm5(const gguf_ctx *ctx) {
    json_t *a = json_object();
    json_object_set_new(a, "architecture", json_string(GLM5_ARCH));
    json_object_set_new(a, "applicable", json_true());
    json_object_set_new(a, "problems", json_array());
    json_object_set_new(a, "unknown", json_array());
    json_object_set_new(a, "missing", json_array());
    json_object_set_new(a, "unused_shared_indexer", json_array()); /* duplicates a converter drops */
    json_object_set_new(a, "shape_mismatch", json_array());
    json_object_set_new(a, "unsupported_type", json_array());
    json_object_set_new(a, "groups", json_array());

    glm5_hparams *hp = malloc(sizeof *hp);
    g5_error e;
    g5_error_clear(&e);
    if (!hp || glm5_hparams_read(ctx, hp, &e) != G5_OK) {
        json_object_set_new(a, "hparams", json_null());
        problem(a, "hyperparameters: %s", hp ? e.msg : "out of memory");
        json_object_set_new(a, "passed", json_false());
        free(hp);
        return a;
    }
    json_object_set_new(a, "hparams", hparams_json(hp));

    /* The tokenizer as the runtime needs it (glm5_tokenizer_check). */
    g5_error_clear(&e);
    if (glm5_tokenizer_check(ctx, hp->n_vocab, &e) != G5_OK) problem(a, "%s", e.msg);

    json_t *unknown = json_object_get(a, "unknown"), *missing = json_object_get(a, "missing");
    json_t *unused = json_object_get(a, "unused_shared_indexer");
    json_t *shapes = json_object_get(a, "shape_mismatch");
    json_t *types = json_object_get(a, "unsupported_type"), *groups = json_object_get(a, "groups");
    const int64_t nt = gguf_get_n_tensors(ctx);
    for (int64_t i = 0; i < nt; i++) {
        const gguf_tensor *t = gguf_get_tensor(ctx, i);
        glm5_tensor_spec s;
        if (glm5_spec_for(hp, t->name, &s) != G5_OK) {
            json_array_append_new(unknown, jstr(t->name, strlen(t->name)));
            problem(a, "unknown tensor '%s' (not part of this GLM-5 model)", t->name);
            continue;
        }
        if (s.unused) json_array_append_new(unused, jstr(t->name, strlen(t->name)));
        add_group(groups, s.unused ? "indexer, unused" : glm5_role_group(s.role), t->nbytes);
        int same = 1;
        for (int d = 0; d < 4; d++) same &= t->ne[d] == s.ne[d];
        if (!same) {
            json_t *m = json_object();
            json_object_set_new(m, "name", jstr(t->name, strlen(t->name)));
            json_object_set_new(m, "expected", jshape(s.ne, s.n_dims));
            json_object_set_new(m, "actual", jshape(t->ne, t->n_dims));
            json_array_append_new(shapes, m);
            char want[128], got[128];
            snprintf(want, sizeof want, "{%llu, %llu, %llu, %llu}", (unsigned long long)s.ne[0],
                     (unsigned long long)s.ne[1], (unsigned long long)s.ne[2],
                     (unsigned long long)s.ne[3]);
            snprintf(got, sizeof got, "{%llu, %llu, %llu, %llu}", (unsigned long long)t->ne[0],
                     (unsigned long long)t->ne[1], (unsigned long long)t->ne[2],
                     (unsigned long long)t->ne[3]);
            problem(a, "tensor '%s' (%s): shape %s, expected %s from the hyperparameters",
                    t->name, glm5_role_name(s.role), got, want);
        }
        g5_error te;
        g5_error_clear(&te);
        if (quant_check_supported(t->type, &te) != G5_OK) {
            json_t *m = json_object();
            json_object_set_new(m, "name", jstr(t->name, strlen(t->name)));
            json_object_set_new(m, "type", json_string(quant_type_name(t->type)));
            json_object_set_new(m, "reason", jstr(te.msg, strlen(te.msg)));
            json_array_append_new(types, m);
            problem(a, "tensor '%s': %s", t->name, te.msg);
        }
    }
    const uint64_t n_exp = glm5_n_expected(hp);
    for (uint64_t k = 0; k < n_exp; k++) {
        glm5_tensor_spec s;
        if (glm5_expected_tensor(hp, k, &s) != G5_OK) break;
        if (s.optional || gguf_find_tensor(ctx, s.name)) continue;
        json_array_append_new(missing, json_string(s.name));
        problem(a, "missing tensor '%s' (%s, %s)", s.name, glm5_role_name(s.role),
                glm5_role_group(s.role));
    }
    glm5_tensor_ref *refs = malloc((size_t)(nt > 0 ? nt : 1) * sizeof *refs);
    if (refs) {
        for (int64_t i = 0; i < nt; i++) {
            const gguf_tensor *t = gguf_get_tensor(ctx, i);
            refs[i] = (glm5_tensor_ref){t->name, t->type, {t->ne[0], t->ne[1], t->ne[2], t->ne[3]}, t->nbytes};
        }
        json_object_set_new(a, "decode_per_token", decode_json(hp, refs, (uint64_t)nt));
        free(refs);
    }
    /* What the audit found nothing against must also pass the one validation convert and the
     * runtime apply (tensor values, anything the list above does not cover). */
    g5_error_clear(&e);
    if (json_array_size(json_object_get(a, "problems")) == 0 && glm5_model_validate(ctx, hp, &e) != G5_OK)
        problem(a, "%s", e.msg);
    json_object_set_new(a, "passed",
                        json_boolean(json_array_size(json_object_get(a, "problems")) == 0));
    free(hp);
    return a;
}

/* ---- the report ---- */

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

g5_status inspect_gguf(const gguf_ctx *ctx, const char *path, const inspect_opts *o,
                       json_t **report, g5_error *err) {
    inspect_opts dflt;
    if (!o) {
        inspect_opts_init(&dflt);
        o = &dflt;
    }
    json_t *r = json_object();
    if (!r) return g5_fail(err, G5_ERR_NOMEM, "inspect: out of memory");
    json_object_set_new(r, "kind", json_string("gguf"));
    json_object_set_new(r, "file", jstr(path, strlen(path)));
    json_object_set_new(r, "version", json_integer(gguf_get_version(ctx)));
    json_object_set_new(r, "alignment", ju64(gguf_get_alignment(ctx)));
    const uint32_t ns = gguf_get_n_splits(ctx);
    json_object_set_new(r, "n_splits", json_integer(ns));
    json_t *splits = json_array();
    for (uint32_t s = 0; s < ns; s++) {
        json_t *e = json_object();
        const char *sp = gguf_get_split_path(ctx, s);
        json_object_set_new(e, "path", jstr(sp ? sp : "", sp ? strlen(sp) : 0));
        json_object_set_new(e, "size", ju64(gguf_get_split_size(ctx, s)));
        json_object_set_new(e, "data_offset", ju64(gguf_get_split_data_offset(ctx, s)));
        json_array_append_new(splits, e);
    }
    json_object_set_new(r, "splits", splits);

    const int64_t nkv = gguf_get_n_kv(ctx);
    json_object_set_new(r, "n_kv", json_integer(nkv));
    json_t *md = json_array();
    for (int64_t i = 0; i < nkv; i++) json_array_append_new(md, metadata_entry(ctx, i, o));
    json_object_set_new(r, "metadata", md);

    const int64_t nt = gguf_get_n_tensors(ctx);
    json_object_set_new(r, "n_tensors", json_integer(nt));
    json_t *tensors = json_array();
    uint64_t total = 0;
    uint32_t *tids = malloc((size_t)(nt > 0 ? nt : 1) * sizeof *tids);
    if (!tids) {
        json_decref(r);
        return g5_fail(err, G5_ERR_NOMEM, "inspect: out of memory");
    }
    for (int64_t i = 0; i < nt; i++) {
        const gguf_tensor *t = gguf_get_tensor(ctx, i);
        json_t *e = json_object();
        json_object_set_new(e, "name", jstr(t->name, strlen(t->name)));
        json_object_set_new(e, "type", json_string(quant_type_name(t->type)));
        json_object_set_new(e, "type_id", json_integer(t->type));
        json_object_set_new(e, "shape", jshape(t->ne, t->n_dims));
        json_object_set_new(e, "n_elems", ju64(t->n_elems));
        json_object_set_new(e, "bytes", ju64(t->nbytes));
        json_object_set_new(e, "split", json_integer(t->split));
        json_object_set_new(e, "offset", ju64(t->offset));
        json_object_set_new(e, "file_offset", ju64(t->file_offset));
        int32_t layer;
        glm5_role role = glm5_classify(t->name, &layer);
        json_object_set_new(e, "role", role ? json_string(glm5_role_name(role)) : json_null());
        json_object_set_new(e, "group", role ? json_string(glm5_role_group(role)) : json_null());
        json_array_append_new(tensors, e);
        total += t->nbytes;
        tids[i] = t->type;
    }
    json_object_set_new(r, "tensors", tensors);
    json_object_set_new(r, "total_bytes", ju64(total));

    /* totals by type, in type-id order */
    uint64_t total_elems = 0;
    qsort(tids, (size_t)nt, sizeof *tids, cmp_u32);
    json_t *totals = json_array();
    for (int64_t i = 0; i < nt;) {
        uint32_t ty = tids[i];
        uint64_t cnt = 0, bytes = 0, elems = 0;
        for (int64_t k = 0; k < nt; k++) {
            const gguf_tensor *t = gguf_get_tensor(ctx, k);
            if (t->type == ty) {
                cnt++;
                bytes += t->nbytes;
                elems += t->n_elems;
            }
        }
        json_t *e = json_object();
        json_object_set_new(e, "type", json_string(quant_type_name(ty)));
        json_object_set_new(e, "count", ju64(cnt));
        json_object_set_new(e, "bytes", ju64(bytes));
        put_per_weight(e, bytes, elems);
        total_elems += elems;
        json_array_append_new(totals, e);
        while (i < nt && tids[i] == ty) i++;
    }
    free(tids);
    json_object_set_new(r, "totals_by_type", totals);
    json_object_set_new(r, "total_weights", ju64(total_elems));
    json_object_set_new(r, "total_bits_per_weight", json_real(total_elems ? 8.0 * (double)total / (double)total_elems : 0.0));

    const char *arch;
    uint64_t alen;
    json_t *audit;
    if (gguf_get_str(ctx, "general.architecture", &arch, &alen, NULL) == G5_OK &&
        alen == strlen(GLM5_ARCH) && memcmp(arch, GLM5_ARCH, alen) == 0) {
        audit = audit_glm5(ctx);
    } else {
        audit = json_object();
        if (gguf_get_str(ctx, "general.architecture", &arch, &alen, NULL) == G5_OK)
            json_object_set_new(audit, "architecture", jstr(arch, alen));
        else
            json_object_set_new(audit, "architecture", json_null());
        json_object_set_new(audit, "applicable", json_false());
        json_object_set_new(audit, "passed", json_true());
        json_object_set_new(audit, "problems", json_array());
    }
    json_object_set_new(r, "audit", audit);
    *report = r;
    return G5_OK;
}

int inspect_report_passed(const json_t *report) {
    const json_t *kind = json_object_get(report, "kind");
    if (json_is_string(kind) && strcmp(json_string_value(kind), "blobset") == 0)
        return json_is_true(json_object_get(report, "passed"));
    return json_is_true(json_object_get(json_object_get(report, "audit"), "passed"));
}

/* ---- text rendering ---- */

static void print_blobset_text(const json_t *r, FILE *f);

static void put_escaped(FILE *f, const char *s, size_t len, size_t max) {
    fputc('"', f);
    size_t n = len < max ? len : max;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c < 0x20 || c == 0x7f) fprintf(f, "\\x%02x", c);
        else fputc(c, f);
    }
    fputc('"', f);
    if (n < len) fprintf(f, "... (%zu bytes)", len);
}

static void put_value(FILE *f, const json_t *v, const inspect_opts *o) {
    if (json_is_string(v)) put_escaped(f, json_string_value(v), json_string_length(v), o->max_string);
    else if (json_is_integer(v)) fprintf(f, "%lld", (long long)json_integer_value(v));
    else if (json_is_real(v)) fprintf(f, "%.9g", json_real_value(v));
    else if (json_is_true(v)) fputs("true", f);
    else if (json_is_false(v)) fputs("false", f);
    else fputs("null", f);
}

static void put_shape(FILE *f, const json_t *shape, char *buf, size_t cap) {
    size_t i, o = 0;
    json_t *d;
    o += (size_t)snprintf(buf + o, cap - o, "{");
    json_array_foreach(shape, i, d) {
        if (o < cap)
            o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "",
                                  (long long)json_integer_value(d));
    }
    if (o < cap) snprintf(buf + o, cap - o, "}");
    (void)f;
}

static const char *human(uint64_t b, char *buf, size_t cap) {
    if (b >= (1ull << 30)) snprintf(buf, cap, "%.2f GiB", (double)b / (1ull << 30));
    else if (b >= (1ull << 20)) snprintf(buf, cap, "%.2f MiB", (double)b / (1ull << 20));
    else if (b >= 1024) snprintf(buf, cap, "%.1f KiB", (double)b / 1024);
    else snprintf(buf, cap, "%llu B", (unsigned long long)b);
    return buf;
}

static uint64_t jget_u64(const json_t *o, const char *k) {
    const json_t *v = json_object_get(o, k);
    if (json_is_integer(v)) return (uint64_t)json_integer_value(v);
    if (json_is_string(v)) return strtoull(json_string_value(v), NULL, 10);
    return 0;
}

static void print_type_total(FILE *f, const json_t *e) {
    char hb[32];
    fprintf(f, "  %-7s %6llu tensors %16llu bytes  %-12s %13llu weights  %7.4f bits/weight\n",
            json_string_value(json_object_get(e, "type")), (unsigned long long)jget_u64(e, "count"),
            (unsigned long long)jget_u64(e, "bytes"), human(jget_u64(e, "bytes"), hb, sizeof hb),
            (unsigned long long)jget_u64(e, "weights"),
            json_real_value(json_object_get(e, "bits_per_weight")));
}

g5_status inspect_print_text(const json_t *r, const inspect_opts *o, FILE *f) {
    inspect_opts dflt;
    if (!o) {
        inspect_opts_init(&dflt);
        o = &dflt;
    }
    char hb[64], shp[128];
    size_t i;
    json_t *e;
    const json_t *kind = json_object_get(r, "kind");
    if (json_is_string(kind) && strcmp(json_string_value(kind), "blobset") == 0) {
        print_blobset_text(r, f);
        return G5_OK;
    }
    fprintf(f, "file: %s\n", json_string_value(json_object_get(r, "file")));
    fprintf(f, "GGUF v%lld, alignment %llu, %lld split file(s)\n",
            (long long)json_integer_value(json_object_get(r, "version")),
            (unsigned long long)jget_u64(r, "alignment"),
            (long long)json_integer_value(json_object_get(r, "n_splits")));
    json_array_foreach(json_object_get(r, "splits"), i, e) {
        fprintf(f, "  split %zu: %s  %llu bytes (%s), data at byte %llu\n", i,
                json_string_value(json_object_get(e, "path")),
                (unsigned long long)jget_u64(e, "size"), human(jget_u64(e, "size"), hb, sizeof hb),
                (unsigned long long)jget_u64(e, "data_offset"));
    }

    fprintf(f, "\nmetadata (%lld keys):\n", (long long)json_integer_value(json_object_get(r, "n_kv")));
    json_array_foreach(json_object_get(r, "metadata"), i, e) {
        const char *type = json_string_value(json_object_get(e, "type"));
        fprintf(f, "  %-44s ", json_string_value(json_object_get(e, "key")));
        if (strcmp(type, "array") == 0) {
            char tb[48];
            snprintf(tb, sizeof tb, "[%s x %llu]",
                     json_string_value(json_object_get(e, "elem_type")),
                     (unsigned long long)jget_u64(e, "count"));
            fprintf(f, "%-18s [", tb);
            size_t k;
            json_t *v;
            json_array_foreach(json_object_get(e, "values"), k, v) {
                if (k) fputs(", ", f);
                put_value(f, v, o);
            }
            if (json_is_true(json_object_get(e, "truncated"))) fputs(", ...", f);
            fputs("]\n", f);
        } else {
            fprintf(f, "%-18s ", type);
            put_value(f, json_object_get(e, "value"), o);
            fputc('\n', f);
        }
    }

    fprintf(f, "\ntensors (%lld):\n", (long long)json_integer_value(json_object_get(r, "n_tensors")));
    fprintf(f, "  %-5s %-40s %-7s %-22s %12s %5s %12s\n", "#", "name", "type", "shape", "bytes",
            "split", "offset");
    json_array_foreach(json_object_get(r, "tensors"), i, e) {
        put_shape(f, json_object_get(e, "shape"), shp, sizeof shp);
        fprintf(f, "  %-5zu %-40s %-7s %-22s %12llu %5lld %12llu\n", i,
                json_string_value(json_object_get(e, "name")),
                json_string_value(json_object_get(e, "type")), shp,
                (unsigned long long)jget_u64(e, "bytes"),
                (long long)json_integer_value(json_object_get(e, "split")),
                (unsigned long long)jget_u64(e, "file_offset"));
    }

    fprintf(f, "\ntotals by type:\n");
    json_array_foreach(json_object_get(r, "totals_by_type"), i, e)
        print_type_total(f, e);
    fprintf(f, "  %-7s %6lld tensors %16llu bytes  %-12s %13llu weights  %7.4f bits/weight\n", "total",
            (long long)json_integer_value(json_object_get(r, "n_tensors")),
            (unsigned long long)jget_u64(r, "total_bytes"),
            human(jget_u64(r, "total_bytes"), hb, sizeof hb),
            (unsigned long long)jget_u64(r, "total_weights"),
            json_real_value(json_object_get(r, "total_bits_per_weight")));

    const json_t *a = json_object_get(r, "audit");
    const json_t *arch = json_object_get(a, "architecture");
    if (!json_is_true(json_object_get(a, "applicable"))) {
        fprintf(f, "\naudit: not applicable (architecture %s; only " GLM5_ARCH " is audited)\n",
                json_is_string(arch) ? json_string_value(arch) : "(none)");
        return G5_OK;
    }
    fprintf(f, "\naudit (" GLM5_ARCH "):\n");
    const json_t *hp = json_object_get(a, "hparams");
    if (json_is_object(hp)) {
#define HV(k) (long long)json_integer_value(json_object_get(hp, k))
        fprintf(f, "  layers %lld (%lld main, first %lld dense, + %lld NextN), hidden %lld, "
                   "vocab %lld, ctx %lld\n",
                HV("n_layer"), HV("n_layer_main"), HV("n_leading_dense"), HV("n_nextn"),
                HV("n_embd"), HV("n_vocab"), HV("n_ctx_train"));
        fprintf(f, "  attention: %lld heads, q_lora %lld, kv_lora %lld, qk_nope %lld, qk_rope %lld, "
                   "v_head %lld\n",
                HV("n_head"), HV("q_lora"), HV("kv_lora"), HV("qk_nope"), HV("qk_rope"),
                HV("v_head"));
        fprintf(f, "  model: %s; RoPE theta %.6g\n", json_string_value(json_object_get(hp, "model_version")),
                json_real_value(json_object_get(hp, "rope_theta")));
        fprintf(f, "  indexer: %lld heads x %lld, top_k %lld, %lld of %lld main layers full (%s), the "
                   "others share the previous full layer's top-k\n",
                HV("idx_n_head"), HV("idx_head_dim"), HV("idx_top_k"), HV("indexer_full_layers"),
                HV("n_layer_main"), json_string_value(json_object_get(hp, "indexer_schedule")));
        fprintf(f, "  indexer schedule: %s\n", json_string_value(json_object_get(hp, "indexer_schedule_source")));
        fprintf(f, "  FFN: dense %lld; %lld experts of %lld, %lld used, %lld shared, groups %lld/%lld, "
                   "scale %.4g, gating %s\n",
                HV("n_ff"), HV("n_expert"), HV("n_ff_exp"), HV("n_expert_used"),
                HV("n_expert_shared"), HV("topk_group"), HV("n_group"),
                json_real_value(json_object_get(hp, "expert_weights_scale")),
                HV("expert_gating_func") == 1 ? "softmax" : "sigmoid");
#undef HV
    }
    fprintf(f, "  tensors by group:\n");
    json_array_foreach(json_object_get(a, "groups"), i, e) {
        fprintf(f, "    %-18s %6llu tensors %16llu bytes  (%s)\n",
                json_string_value(json_object_get(e, "group")),
                (unsigned long long)jget_u64(e, "count"), (unsigned long long)jget_u64(e, "bytes"),
                human(jget_u64(e, "bytes"), hb, sizeof hb));
    }
    print_decode(f, json_object_get(a, "decode_per_token"), "  ", " at TP 1");
    static const char *const lists[] = {"unknown", "missing"};
    for (size_t l = 0; l < 2; l++) {
        const json_t *arr = json_object_get(a, lists[l]);
        fprintf(f, "  %s tensors: %zu\n", lists[l], json_array_size(arr));
    }
    if (json_array_size(json_object_get(a, "unused_shared_indexer")))
        fprintf(f, "  unused tensors: %zu (shared layers' duplicate indexer tensors; convert leaves them out)\n",
                json_array_size(json_object_get(a, "unused_shared_indexer")));
    fprintf(f, "  shape mismatches: %zu, unsupported types: %zu\n",
            json_array_size(json_object_get(a, "shape_mismatch")),
            json_array_size(json_object_get(a, "unsupported_type")));
    json_array_foreach(json_object_get(a, "problems"), i, e)
        fprintf(f, "  problem: %s\n", json_string_value(e));
    fprintf(f, "audit: %s\n", inspect_report_passed(r) ? "PASSED" : "FAILED");
    return G5_OK;
}


/* ---- blob sets ---- */

static json_t *jhash(const uint8_t h[16]) {
    char hex[33];
    blob_hash_hex(h, hex);
    return json_string(hex);
}

static const char *axis_name(uint32_t axis) {
    switch (axis) {
    case BLOB_AXIS_NONE: return "replicated";
    case 0: return "ne[0] (columns)";
    case 1: return "ne[1] (rows)";
    case 2: return "ne[2] (experts)";
    default: return "ne[3]";
    }
}

/* Without a set record, the T of the rank files present (rank-*-of-T.g5b); 0 if none. */
static uint32_t guess_tp(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *de;
    uint32_t tp = 0;
    while ((de = readdir(d))) {
        unsigned r, t;
        char tail[8];
        if (sscanf(de->d_name, "rank-%5u-of-%5u.%4s", &r, &t, tail) == 3 &&
            strcmp(tail, "g5b") == 0 && t > tp && t <= 65536)
            tp = t;
    }
    closedir(d);
    return tp;
}

static void blobset_model(json_t *r, const blob *b0) {
    const gguf_ctx *meta = blob_get_meta(b0);
    json_t *m = json_object();
    const char *arch;
    uint64_t alen;
    if (meta && gguf_get_str(meta, "general.architecture", &arch, &alen, NULL) == G5_OK)
        json_object_set_new(m, "architecture", jstr(arch, alen));
    else
        json_object_set_new(m, "architecture", json_null());
    json_object_set_new(m, "n_kv", json_integer(meta ? gguf_get_n_kv(meta) : 0));
    json_object_set_new(m, "kv_b_type", json_string(quant_type_name(blob_get_info(b0)->kv_b_type)));
    glm5_hparams *hp = malloc(sizeof *hp);
    const uint64_t nt = blob_n_tensors(b0);
    glm5_tensor_ref *refs = malloc((size_t)(nt ? nt : 1) * sizeof *refs);
    if (hp && meta && glm5_hparams_read(meta, hp, NULL) == G5_OK) {
        json_object_set_new(m, "hparams", hparams_json(hp));
        for (uint64_t i = 0; i < nt && refs; i++) {
            const blob_tensor *t = blob_get_tensor(b0, i);
            refs[i] = (glm5_tensor_ref){t->name, t->type, {t->ne[0], t->ne[1], t->ne[2], t->ne[3]}, t->size};
        }
        if (refs) json_object_set_new(m, "decode_per_token", decode_json(hp, refs, nt));
    } else {
        json_object_set_new(m, "hparams", json_null());
    }
    free(refs);
    free(hp);
    json_object_set_new(r, "model", m);
}

static void blobset_tables(json_t *r, const blob *b0) {
    const uint64_t nt = blob_n_tensors(b0);
    json_t *tensors = json_array(), *plan = json_array(), *totals = json_array();
    for (uint64_t i = 0; i < nt; i++) {
        const blob_tensor *t = blob_get_tensor(b0, i);
        json_t *e = json_object();
        json_object_set_new(e, "name", jstr(t->name, strlen(t->name)));
        json_object_set_new(e, "type", json_string(quant_type_name(t->type)));
        json_object_set_new(e, "shape", jshape(t->ne_global, t->n_dims));
        json_object_set_new(e, "local_shape", jshape(t->ne, t->n_dims));
        json_object_set_new(e, "axis", t->split_axis == BLOB_AXIS_NONE ? json_null()
                                                                       : json_integer(t->split_axis));
        json_object_set_new(e, "split_count", json_integer(t->split_count));
        json_object_set_new(e, "bytes", ju64(t->size));
        json_object_set_new(e, "offset", ju64(t->offset)); /* the same in every rank */
        json_object_set_new(e, "derived", json_boolean(t->flags & BLOB_TFLAG_DERIVED));
        json_array_append_new(tensors, e);
    }
    /* plan: per split axis; totals: per type (both per rank) */
    static const uint32_t axes[] = {BLOB_AXIS_NONE, 0, 1, 2, 3};
    for (size_t a = 0; a < sizeof axes / sizeof axes[0]; a++) {
        uint64_t cnt = 0, bytes = 0;
        for (uint64_t i = 0; i < nt; i++) {
            const blob_tensor *t = blob_get_tensor(b0, i);
            if (t->split_axis == axes[a]) {
                cnt++;
                bytes += t->size;
            }
        }
        if (!cnt) continue;
        json_t *e = json_object();
        json_object_set_new(e, "split", json_string(axis_name(axes[a])));
        json_object_set_new(e, "axis", axes[a] == BLOB_AXIS_NONE ? json_null() : json_integer(axes[a]));
        json_object_set_new(e, "count", ju64(cnt));
        json_object_set_new(e, "bytes_per_rank", ju64(bytes));
        json_array_append_new(plan, e);
    }
    uint64_t all_bytes = 0, all_elems = 0;
    for (uint32_t ty = 0; ty < QT_TYPE_LIMIT; ty++) {
        uint64_t cnt = 0, bytes = 0, elems = 0;
        for (uint64_t i = 0; i < nt; i++) {
            const blob_tensor *t = blob_get_tensor(b0, i);
            if (t->type == ty) {
                cnt++;
                bytes += t->size;
                elems += t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
            }
        }
        if (!cnt) continue;
        json_t *e = json_object();
        json_object_set_new(e, "type", json_string(quant_type_name(ty)));
        json_object_set_new(e, "count", ju64(cnt));
        json_object_set_new(e, "bytes", ju64(bytes));
        put_per_weight(e, bytes, elems);
        json_array_append_new(totals, e);
        all_bytes += bytes;
        all_elems += elems;
    }
    json_t *tot = json_object();
    json_object_set_new(tot, "type", json_string("total"));
    json_object_set_new(tot, "count", ju64(nt));
    json_object_set_new(tot, "bytes", ju64(all_bytes));
    put_per_weight(tot, all_bytes, all_elems);
    json_object_set_new(r, "total_per_rank", tot);
    json_object_set_new(r, "n_tensors", ju64(nt));
    json_object_set_new(r, "tensors", tensors);
    json_object_set_new(r, "plan", plan);
    json_object_set_new(r, "totals_by_type", totals);
}

g5_status inspect_blobset(const char *dir, const inspect_opts *o, json_t **report, g5_error *err) {
    (void)o;
    json_t *r = json_object();
    if (!r) return g5_fail(err, G5_ERR_NOMEM, "inspect: out of memory");
    json_object_set_new(r, "kind", json_string("blobset"));
    json_object_set_new(r, "dir", jstr(dir, strlen(dir)));
    json_object_set_new(r, "problems", json_array());

    blob_set_record rec;
    memset(&rec, 0, sizeof rec);
    g5_error e;
    g5_error_clear(&e);
    uint32_t tp;
    int have_rec = blob_set_record_read(dir, &rec, &e) == G5_OK;
    if (have_rec) {
        json_t *j = json_object();
        json_object_set_new(j, "tp", json_integer(rec.tp));
        json_object_set_new(j, "placement", json_string(blob_placement_name(rec.placement)));
        char ver[32];
        snprintf(ver, sizeof ver, "%u.%u.%u", rec.converter_version >> 16,
                 (rec.converter_version >> 8) & 255, rec.converter_version & 255);
        json_object_set_new(j, "converter_version", json_string(ver));
        json_object_set_new(j, "set_id", jhash(rec.set_id));
        json_object_set_new(r, "record", j);
        tp = rec.tp;
    } else {
        json_object_set_new(r, "record", json_null());
        problem(r, "set record: %s", e.msg);
        tp = guess_tp(dir);
    }

    json_t *ranks = json_array();
    blob **bl = calloc(tp ? tp : 1, sizeof *bl);
    if (!bl) {
        blob_set_record_clear(&rec);
        json_decref(ranks);
        json_decref(r);
        return g5_fail(err, G5_ERR_NOMEM, "inspect: out of memory");
    }
    for (uint32_t k = 0; k < tp; k++) {
        char fn[64], path[4200];
        blob_rank_filename(k, tp, fn, sizeof fn);
        snprintf(path, sizeof path, "%s/%s", dir, fn);
        json_t *j = json_object();
        json_object_set_new(j, "rank", json_integer(k));
        json_object_set_new(j, "path", jstr(path, strlen(path)));
        g5_error_clear(&e);
        if (blob_open(path, &bl[k], &e) != G5_OK) {
            json_object_set_new(j, "opened", json_false());
            json_object_set_new(j, "error", jstr(e.msg, strlen(e.msg)));
            problem(r, "rank %u: %s", k, e.msg);
            json_array_append_new(ranks, j);
            continue;
        }
        const blob_info *in = blob_get_info(bl[k]);
        json_object_set_new(j, "opened", json_true());
        if (have_rec && blob_check_rank(bl[k], &rec, k, &e) != G5_OK) {
            json_object_set_new(j, "error", jstr(e.msg, strlen(e.msg)));
            problem(r, "rank %u: %s", k, e.msg);
        } else if (k > 0 && bl[0] && blob_check_compatible(bl[0], bl[k], &e) != G5_OK) {
            json_object_set_new(j, "error", jstr(e.msg, strlen(e.msg)));
            problem(r, "rank %u: %s", k, e.msg);
        } else {
            json_object_set_new(j, "error", json_null());
        }
        json_object_set_new(j, "file_size", ju64(in->file_size));
        json_object_set_new(j, "header_hash", jhash(in->header_hash));
        json_object_set_new(j, "n_tensors", ju64(in->n_tensors));
        json_object_set_new(j, "data_size", ju64(in->data_size));
        json_object_set_new(j, "chunk_size", ju64(in->chunk_size));
        json_object_set_new(j, "n_chunks", ju64(in->n_chunks));
        json_object_set_new(j, "meta_size", ju64(in->meta_size));
        json_object_set_new(j, "meta_raw_size", ju64(in->meta_raw_size));
        json_object_set_new(j, "meta_zstd", json_boolean(in->flags & BLOB_FLAG_META_ZSTD));
        json_array_append_new(ranks, j);
    }
    json_object_set_new(r, "tp", json_integer(tp));
    json_object_set_new(r, "ranks", ranks);
    if (tp == 0) problem(r, "%s: no rank files (rank-NNNNN-of-NNNNN.g5b)", dir);

    const blob *b0 = NULL;
    for (uint32_t k = 0; k < tp && !b0; k++) b0 = bl[k];
    json_t *sources = json_array();
    if (b0) {
        const blob_info *in = blob_get_info(b0);
        json_object_set_new(r, "placement", json_string(blob_placement_name(in->placement)));
        for (uint32_t i = 0; i < blob_n_sources(b0); i++) {
            const blob_source *src = blob_get_source(b0, i);
            json_t *j = json_object();
            json_object_set_new(j, "split", json_integer(src->split));
            json_object_set_new(j, "name", jstr(src->name, strlen(src->name)));
            json_object_set_new(j, "file_size", ju64(src->file_size));
            json_object_set_new(j, "header_size", ju64(src->header_size));
            json_object_set_new(j, "header_hash", jhash(src->header_hash));
            json_array_append_new(sources, j);
        }
        blobset_model(r, b0);
        blobset_tables(r, b0);
    }
    json_object_set_new(r, "sources", sources);
    json_object_set_new(r, "passed",
                        json_boolean(json_array_size(json_object_get(r, "problems")) == 0));
    for (uint32_t k = 0; k < tp; k++) blob_free(bl[k]);
    free(bl);
    blob_set_record_clear(&rec);
    *report = r;
    return G5_OK;
}

static void print_blobset_text(const json_t *r, FILE *f) {
    char hb[64], shp[128], lshp[128];
    size_t i;
    json_t *e;
    fprintf(f, "blob set: %s\n", json_string_value(json_object_get(r, "dir")));
    const json_t *rec = json_object_get(r, "record");
    if (json_is_object(rec))
        fprintf(f, "  set record: tp %lld, placement %s, converter %s, set id %s\n",
                (long long)json_integer_value(json_object_get(rec, "tp")),
                json_string_value(json_object_get(rec, "placement")),
                json_string_value(json_object_get(rec, "converter_version")),
                json_string_value(json_object_get(rec, "set_id")));
    else
        fprintf(f, "  set record: none\n");
    json_array_foreach(json_object_get(r, "ranks"), i, e) {
        if (!json_is_true(json_object_get(e, "opened"))) {
            fprintf(f, "  rank %zu: %s  cannot open\n", i, json_string_value(json_object_get(e, "path")));
            continue;
        }
        fprintf(f, "  rank %zu: %s  %llu bytes (%s), %llu tensors, %llu chunks, header %s%s\n", i,
                json_string_value(json_object_get(e, "path")),
                (unsigned long long)jget_u64(e, "file_size"),
                human(jget_u64(e, "file_size"), hb, sizeof hb),
                (unsigned long long)jget_u64(e, "n_tensors"),
                (unsigned long long)jget_u64(e, "n_chunks"),
                json_string_value(json_object_get(e, "header_hash")),
                json_is_string(json_object_get(e, "error")) ? "  MISMATCH" : "");
    }
    json_array_foreach(json_object_get(r, "sources"), i, e)
        fprintf(f, "  source %lld: %s  %llu bytes, header %llu bytes, hash %s\n",
                (long long)json_integer_value(json_object_get(e, "split")),
                json_string_value(json_object_get(e, "name")),
                (unsigned long long)jget_u64(e, "file_size"),
                (unsigned long long)jget_u64(e, "header_size"),
                json_string_value(json_object_get(e, "header_hash")));
    const json_t *m = json_object_get(r, "model");
    if (json_is_object(m)) {
        const json_t *arch = json_object_get(m, "architecture");
        fprintf(f, "  model: %s, %lld metadata keys, kv_b stored as %s\n",
                json_is_string(arch) ? json_string_value(arch) : "?",
                (long long)json_integer_value(json_object_get(m, "n_kv")),
                json_string_value(json_object_get(m, "kv_b_type")));
        const json_t *hp = json_object_get(m, "hparams");
        if (json_is_object(hp))
            fprintf(f, "         %lld layers, hidden %lld, %lld heads, %lld experts, vocab %lld\n",
                    (long long)json_integer_value(json_object_get(hp, "n_layer")),
                    (long long)json_integer_value(json_object_get(hp, "n_embd")),
                    (long long)json_integer_value(json_object_get(hp, "n_head")),
                    (long long)json_integer_value(json_object_get(hp, "n_expert")),
                    (long long)json_integer_value(json_object_get(hp, "n_vocab")));
        if (json_is_object(hp))
            fprintf(f, "         %s; indexer on %lld of %lld main layers (%s), the others share its top-k\n",
                    json_string_value(json_object_get(hp, "model_version")),
                    (long long)json_integer_value(json_object_get(hp, "indexer_full_layers")),
                    (long long)json_integer_value(json_object_get(hp, "n_layer_main")),
                    json_string_value(json_object_get(hp, "indexer_schedule")));
        print_decode(f, json_object_get(m, "decode_per_token"), "  ", " per rank");
    }
    if (json_object_get(r, "plan")) {
        fprintf(f, "\nplan (per rank):\n");
        json_array_foreach(json_object_get(r, "plan"), i, e)
            fprintf(f, "  %-18s %6llu tensors %16llu bytes  (%s)\n",
                    json_string_value(json_object_get(e, "split")),
                    (unsigned long long)jget_u64(e, "count"),
                    (unsigned long long)jget_u64(e, "bytes_per_rank"),
                    human(jget_u64(e, "bytes_per_rank"), hb, sizeof hb));
        fprintf(f, "\ntensors (%llu, as rank 0 holds them):\n",
                (unsigned long long)jget_u64(r, "n_tensors"));
        fprintf(f, "  %-5s %-40s %-7s %-20s %-20s %-6s %12s\n", "#", "name", "type", "global shape",
                "local shape", "split", "bytes/rank");
        json_array_foreach(json_object_get(r, "tensors"), i, e) {
            put_shape(f, json_object_get(e, "shape"), shp, sizeof shp);
            put_shape(f, json_object_get(e, "local_shape"), lshp, sizeof lshp);
            const json_t *ax = json_object_get(e, "axis");
            char axs[16];
            if (json_is_integer(ax)) snprintf(axs, sizeof axs, "ne[%lld]", (long long)json_integer_value(ax));
            else snprintf(axs, sizeof axs, "-");
            fprintf(f, "  %-5zu %-40s %-7s %-20s %-20s %-6s %12llu%s\n", i,
                    json_string_value(json_object_get(e, "name")),
                    json_string_value(json_object_get(e, "type")), shp, lshp, axs,
                    (unsigned long long)jget_u64(e, "bytes"),
                    json_is_true(json_object_get(e, "derived")) ? "  (derived)" : "");
        }
        fprintf(f, "\ntotals by type (per rank):\n");
        json_array_foreach(json_object_get(r, "totals_by_type"), i, e)
            print_type_total(f, e);
        if (json_object_get(r, "total_per_rank")) print_type_total(f, json_object_get(r, "total_per_rank"));
    }
    json_array_foreach(json_object_get(r, "problems"), i, e)
        fprintf(f, "problem: %s\n", json_string_value(e));
    fprintf(f, "blob set: %s (index checked; run 'glm5-shard verify' to hash the data)\n",
            inspect_report_passed(r) ? "OK" : "FAILED");
}

/* ---- dump ---- */

static g5_status write_all(int fd, const uint8_t *p, size_t n, const char *path, g5_error *err) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return g5_fail(err, G5_ERR_IO, "%s: write: %s", path, strerror(errno));
        }
        p += w;
        n -= (size_t)w;
    }
    return G5_OK;
}

g5_status inspect_dump_tensor(const gguf_ctx *ctx, const char *name, const char *out_path,
                              g5_error *err) {
    const gguf_tensor *t = gguf_find_tensor(ctx, name);
    if (!t) return g5_fail(err, G5_ERR_NOT_FOUND, "tensor '%s' not found", name);
    g5_status st = quant_check_supported(t->type, err);
    if (st) return st;
    uint64_t row_bytes;
    if ((st = quant_row_bytes(t->type, t->ne[0], &row_bytes)))
        return g5_fail(err, st, "tensor '%s': row of %llu elements", name,
                       (unsigned long long)t->ne[0]);
    const uint64_t n_rows = t->n_elems / t->ne[0];
    /* rows per chunk: about 4 Mi floats, at least one row */
    uint64_t chunk_rows = (4u << 20) / t->ne[0];
    if (chunk_rows == 0) chunk_rows = 1;
    uint64_t chunk_elems;
    if (g5_mul_u64(chunk_rows, t->ne[0], &chunk_elems) || chunk_elems > SIZE_MAX / 4)
        return g5_fail(err, G5_ERR_OVERFLOW, "tensor '%s': row too long", name);
    float *f = malloc((size_t)chunk_elems * sizeof *f);
    uint8_t *out = malloc((size_t)chunk_elems * 4);
    size_t plen = strlen(out_path);
    char *tmp = malloc(plen + 5);
    if (!f || !out || !tmp) {
        free(f);
        free(out);
        free(tmp);
        return g5_fail(err, G5_ERR_NOMEM, "dump: out of memory");
    }
    memcpy(tmp, out_path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        st = g5_fail(err, G5_ERR_IO, "%s: %s", tmp, strerror(errno));
        goto out;
    }
    for (uint64_t r = 0; r < n_rows && !st; r += chunk_rows) {
        uint64_t nr = n_rows - r < chunk_rows ? n_rows - r : chunk_rows;
        uint64_t ne = nr * t->ne[0];
        if ((st = quant_dequantize(t->type, t->data + r * row_bytes, ne, f))) {
            st = g5_fail(err, st, "tensor '%s': cannot dequantize rows %llu..%llu", name,
                         (unsigned long long)r, (unsigned long long)(r + nr));
            break;
        }
        for (uint64_t k = 0; k < ne; k++) {
            uint32_t bits;
            memcpy(&bits, &f[k], 4);
            g5_wr_u32(out + 4 * k, bits);
        }
        st = write_all(fd, out, (size_t)ne * 4, tmp, err);
    }
    if (!st && fsync(fd) != 0) st = g5_fail(err, G5_ERR_IO, "%s: fsync: %s", tmp, strerror(errno));
    if (close(fd) != 0 && !st) st = g5_fail(err, G5_ERR_IO, "%s: close: %s", tmp, strerror(errno));
    if (!st && rename(tmp, out_path) != 0)
        st = g5_fail(err, G5_ERR_IO, "rename %s -> %s: %s", tmp, out_path, strerror(errno));
    if (st) {
        unlink(tmp);
    } else {
        /* make the rename itself durable */
        char *dcopy = strdup(out_path);
        if (dcopy) {
            int dfd = open(dirname(dcopy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            if (dfd >= 0) {
                (void)fsync(dfd);
                close(dfd);
            }
            free(dcopy);
        }
    }
out:
    free(f);
    free(out);
    free(tmp);
    return st;
}
