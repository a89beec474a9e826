/* glm5-shard convert / verify: GLM-5 GGUF (single file or split set) -> one checksummed blob per
 * tensor-parallel rank (specs/blob-format.md), following the sharding plan (convert/shard.h,
 * specs/sharding.md).
 *
 * convert streams: one reader walks the (memory-mapped) source tensors in file order in windows
 * of whole rows, so every byte is read from disk once; one writer thread per rank group cuts its
 * slices out of each window and appends them to its rank's file while hashing (tensor, chunk,
 * section hashes). Memory is bounded by a fixed window budget (256 MiB queued, windows unmapped
 * once consumed) plus per-thread kv_b buffers, independent of the model size. Each rank
 * is written to NAME.tmp, fsynced and renamed; the set record (blob.h: BLOB_SET_RECORD) is
 * written last, after every rank is in place, so an interrupted run leaves no set that opens or
 * verifies. Nothing is printed: progress goes to a callback, results to convert_result.
 *
 * Output directory layout: OUTDIR/rank-00000-of-0000T.g5b ... and OUTDIR/blobset.g5s. */
#ifndef G5_CONVERT_H
#define G5_CONVERT_H

#include <stdint.h>

#include "convert/shard.h"
#include "format/blob.h"
#include "format/status.h"

#define CONVERT_VERSION_MAJOR 1
#define CONVERT_VERSION_MINOR 1
#define CONVERT_VERSION_PATCH 0
/* (major << 16) | (minor << 8) | patch, as stored in blob headers. */
#define CONVERT_VERSION ((CONVERT_VERSION_MAJOR << 16) | (CONVERT_VERSION_MINOR << 8) | CONVERT_VERSION_PATCH)
/* 1.1.0: attn_k_b/attn_v_b carried beside kv_b. Sets of earlier versions lack them (shard_options
 * no_pair gives their plan). */
#define CONVERT_VERSION_PAIR ((1 << 16) | (1 << 8))
#define CONVERT_VERSION_1_0 (1 << 16)

/* ---- progress ---- */

typedef enum convert_phase {
    CONVERT_PHASE_PLAN = 0,   /* building the plan (no bytes yet) */
    CONVERT_PHASE_RESUME,     /* verifying existing rank files for --resume */
    CONVERT_PHASE_WRITE,      /* streaming tensor data */
    CONVERT_PHASE_FINISH,     /* writing indexes, fsync, rename, set record */
    CONVERT_PHASE_VERIFY,     /* convert_verify: hashing */
    CONVERT_PHASE_DONE
} convert_phase;

const char *convert_phase_name(convert_phase p); /* "plan", "resume", "write", ... */

typedef struct convert_progress {
    convert_phase phase;
    uint64_t bytes_done;     /* write: source bytes consumed; verify: bytes hashed */
    uint64_t bytes_total;    /* the amount bytes_done runs up to */
    double elapsed_s;        /* since the phase started */
    double gb_per_s;         /* bytes_done / elapsed_s / 1e9 */
    double eta_s;            /* remaining time estimate, < 0 when unknown */
    const char *tensor;      /* tensor being read, or NULL */
} convert_progress;

/* Called from the thread that calls convert_run / convert_verify, at most every
 * progress_interval_s seconds, and once at the end of each phase. */
typedef void (*convert_progress_fn)(void *user, const convert_progress *p);

/* ---- convert ---- */

typedef struct convert_options {
    uint32_t tp;              /* tensor-parallel degree T >= 1 (required) */
    int ep;                   /* 1: whole routed experts per rank (E/T each), expert tensors unsplit */
    uint32_t kv_b_type;       /* storage of the rebuilt attn_kv_b: QT_F32 (default, lossless),
                               * QT_BF16, QT_F16 or QT_Q8_0 (quant.h ids) */
    uint32_t jobs;            /* writer threads (each serves ranks r = k mod jobs) and verify
                               * threads for --resume; 0 = T */
    int resume;               /* keep rank files that verify and belong to this plan; redo the rest */
    int force;                /* outdir holds another set: remove its files first (else refused) */
    int dry_run;              /* build and check the plan only; write nothing */
    convert_progress_fn progress;  /* may be NULL */
    void *progress_user;
    double progress_interval_s;    /* default 0.5 */
} convert_options;

/* Defaults: tp 0 (must be set), no ep, F32 kv_b, jobs 0, progress every 0.5 s. (Fault
 * injection for tests: convert/convert_test.h.) */
void convert_options_init(convert_options *o);

typedef struct convert_rank_result {
    uint32_t rank;
    char path[4096];          /* final path of the rank file */
    uint64_t file_size;
    uint8_t header_hash[16];  /* XXH3-128 (canonical) of the rank's header: identifies the file */
    int reused;               /* 1 if --resume kept an existing file that verified */
} convert_rank_result;

typedef struct convert_result {
    uint32_t tp;
    int ep;
    uint32_t kv_b_type;
    int dry_run;
    uint8_t set_id[16];
    uint32_t n_sources;           /* source split files */
    uint64_t source_bytes;        /* sum of the source files' sizes */
    uint64_t source_tensor_bytes; /* tensor data read from the source */
    uint64_t n_tensors_in;        /* source tensors */
    uint64_t n_tensors_out;       /* blob tensors per rank */
    uint64_t bytes_written;       /* all rank files together (0 on dry run) */
    uint64_t rank_bytes;          /* size of each rank file (all equal) */
    uint32_t n_ranks_written;
    uint32_t n_ranks_reused;
    double seconds;
    double gb_per_s;              /* source tensor bytes per second of the write phase */
    /* kv_b: max |stored - exact| over every rebuilt kv_b element, after storage in kv_b_type
     * (0 for F32) and the largest |exact| value for scale. */
    double kv_b_max_abs_err;
    double kv_b_max_abs;
    convert_rank_result *ranks;   /* tp entries (NULL on dry run) */
    shard_plan *plan;             /* the plan (kept for dry-run output and --json); owned */
} convert_result;

void convert_result_free(convert_result *r); /* accepts NULL; frees ranks and plan */

/* Converts `model` (a .gguf, or any split of a set) into outdir (created if absent; its parent
 * must exist). On a refusal (G5_ERR_SHARDING, G5_ERR_MODEL, G5_ERR_EXISTS: outdir holds another
 * set's files, rank-*-of-*.g5b or blobset.g5s, and neither --force nor, for this conversion's own
 * ranks, --resume was given) nothing is written or removed; with force every such file is removed
 * before the first byte is written. On
 * any failure after writing began, the temporary files are removed (except for the crash
 * simulation hook), no set record exists, and an existing set record in outdir was removed
 * before the first byte was written (so stale and new ranks cannot be mistaken for a set).
 * *out (may be NULL) receives the result also on failure where one was produced, for
 * reporting; free it with convert_result_free. */
g5_status convert_run(const char *model, const char *outdir, const convert_options *opt,
                      convert_result **out, g5_error *err);

/* JSON text (malloc'ed, caller frees) summarizing a result: options, set id, sources, per-rank
 * files, bytes, timing, kv_b error, and, with with_plan, the plan per tensor. */
char *convert_result_json(const convert_result *r, int with_plan);

/* ---- verify ---- */

typedef struct convert_verify_options {
    uint32_t jobs;                /* hashing threads; 0 = online CPUs */
    const char *deep_source;      /* non-NULL: re-derive every slice from this GGUF and compare */
    convert_progress_fn progress; /* may be NULL */
    void *progress_user;
    double progress_interval_s;
} convert_verify_options;

void convert_verify_options_init(convert_verify_options *o);

/* One finding, worst first is not implied: in rank order, then file order. */
typedef struct convert_finding {
    int32_t rank;                 /* -1: the set as a whole (record, missing files) */
    int64_t tensor;               /* tensor index in the rank's table, or -1 */
    int64_t chunk;                /* chunk index, or -1 */
    g5_status status;
    char msg[1024];               /* names the file, the tensor or chunk, and byte offsets */
} convert_finding;

typedef struct convert_verify_rank {
    uint32_t rank;
    char path[4096];
    int opened;                   /* 0: the file is missing or its index failed to validate */
    uint64_t file_size;
    uint64_t n_tensors, n_tensors_bad;
    uint64_t n_chunks, n_chunks_bad;
    uint64_t n_deep_checked, n_deep_bad; /* --deep: tensors re-derived / differing */
    double kv_b_max_abs_err;      /* --deep: max |blob kv_b - exact rebuilt kv_b| */
    uint8_t *tensor_bad;          /* n_tensors flags (1 = hash or deep mismatch); may be NULL */
} convert_verify_rank;

typedef struct convert_verify_result {
    int ok;                       /* 1 only if every check held */
    uint32_t tp;                  /* from the set record (0 if it could not be read) */
    uint8_t set_id[16];
    uint64_t bytes_hashed;
    double seconds;
    uint32_t n_ranks;
    convert_verify_rank *ranks;   /* n_ranks entries */
    uint64_t n_findings;          /* all findings; only the first CONVERT_MAX_FINDINGS stored */
    uint64_t n_findings_stored;
    convert_finding *findings;
} convert_verify_result;

#define CONVERT_MAX_FINDINGS 1024

void convert_verify_result_free(convert_verify_result *r); /* accepts NULL */

/* Verifies the blob set in outdir: the set record, every rank's index (header, section and
 * table hashes and structure), every chunk and tensor hash, cross-rank agreement (set id, tp,
 * placement, sources, metadata, tensor list); with deep_source also every slice's bytes against
 * the source and kv_b's values. Returns G5_OK only if everything holds; otherwise the status
 * of the first finding, with err naming it, and *out (may be NULL) holding the full report. */
g5_status convert_verify(const char *outdir, const convert_verify_options *opt,
                         convert_verify_result **out, g5_error *err);

/* JSON text (malloc'ed) of a verify result: per rank and per bad tensor/chunk findings. */
char *convert_verify_result_json(const convert_verify_result *r);

#endif
