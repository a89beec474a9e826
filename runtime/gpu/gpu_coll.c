/* The GPU model's processes and collectives (gpu_model.h, "Processes and devices"): which device
 * each of this process's ranks runs on, the agreement between the processes of a launch at the
 * two points of rt_gpu_model_create where one of them can fail alone, NCCL (loaded at run time;
 * its unique id made by process 0 and broadcast through rt_comm), and the vocabulary-split
 * logits completed on every process. Compiled to nothing unless G5_WITH_CUDA.
 *
 * With one process (rt_comm size 1) nothing here exchanges anything: the agreement steps return
 * the local status and the logits are already complete. */
#ifdef G5_WITH_CUDA

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/cpu/comm.h"
#include "runtime/gpu/gpu_int.h"
#include "cuda/cuk_device.h"

/* ---- agreement: every process learns whether all got through a step ----
 * Each process sends its status (and, failed, its message) with a step's payload; all then fail
 * alike, naming the first process that failed, instead of the healthy ones waiting forever in
 * the next collective for a process that has given up. */

typedef struct agree_hdr {
    int32_t st;
    char msg[1020];                  /* a failed process's message (g5_error.msg) */
} agree_hdr;

static g5_status agree(rt_comm *c, g5_status st, const void *mine, size_t len, void *all, const char *step,
                       g5_error *err) {
    const uint32_t P = rt_comm_size(c);
    const size_t rec = (sizeof(agree_hdr) + len + 7) & ~(size_t)7;
    uint8_t *buf = calloc((size_t)P + 1, rec);
    if (!buf) return st ? st : g5_fail(err, G5_ERR_NOMEM, "%s: exchange of %u x %zu bytes", step, P, rec);
    agree_hdr *h = (agree_hdr *)(void *)buf;
    h->st = (int32_t)st;
    if (st && err) memcpy(h->msg, err->msg, strnlen(err->msg, sizeof h->msg - 1)); /* buf is zeroed */
    if (len && !st) memcpy(buf + sizeof *h, mine, len);
    uint8_t *recs = buf + rec;
    g5_status cs = rt_comm_allgather(c, buf, rec, recs, err);
    if (!cs && !st) {
        for (uint32_t p = 0; p < P; p++) {
            const agree_hdr *hp = (const agree_hdr *)(void *)(recs + (size_t)p * rec);
            if (hp->st) {
                g5_status ps = hp->st > 0 && hp->st < G5_STATUS_COUNT ? (g5_status)hp->st : G5_ERR_INTERNAL;
                cs = g5_fail(err, ps, "process %u of %u failed (%s): %.*s", p, P, step, (int)sizeof hp->msg, hp->msg);
                break;
            }
        }
    }
    if (!cs && !st && len)
        for (uint32_t p = 0; p < P; p++) memcpy((uint8_t *)all + (size_t)p * len, recs + (size_t)p * rec + sizeof *h, len);
    free(buf);
    return st ? st : cs; /* a process that failed keeps its own message */
}

/* ---- devices ---- */

g5_status gm_coll_place(rt_gpu_model *g, const rt_gpu_opts *opts, int ndev, g5_error *err) {
    const uint32_t P = rt_comm_size(g->comm), lr = rt_comm_local_rank(g->comm);
    const int device0 = opts->device0, want_nccl = opts->collective == RT_GPU_COLL_NCCL;
    if (opts->collective != RT_GPU_COLL_AUTO && opts->collective != RT_GPU_COLL_NCCL)
        return g5_fail(err, G5_ERR_INVALID_ARG, "collective %d: not one of auto, nccl", (int)opts->collective);
    if (P == 1) {
        const uint32_t used = g->T < (uint32_t)ndev ? g->T : (uint32_t)ndev;
        g->info.n_devices = used;
        if (g->T == 1) {
            /* opts.collective NCCL: a one-rank NCCL communicator instead of none, so that the NCCL
             * path (library, communicator, all-reduce) runs, and is tested, on a machine with one GPU */
            g->coll = want_nccl ? COLL_NCCL : COLL_NONE;
        } else if (used == 1 && want_nccl) {
            return g5_fail(err, G5_ERR_UNSUPPORTED,
                           "collective nccl: %u ranks on one device (NCCL takes one GPU per rank; auto sums on the device)",
                           g->T);
        } else if (used == 1) {
            g->coll = COLL_DEVICE;
        } else if (g->T <= (uint32_t)ndev) {
            g->coll = COLL_NCCL;
        } else {
            return g5_fail(err, G5_ERR_UNSUPPORTED,
                           "%u ranks on %d devices: give one device per rank, or a single device for all", g->T, ndev);
        }
    } else {
        /* ranks in other processes are reached only through NCCL, which takes one GPU per rank */
        if (g->T > (uint32_t)ndev)
            return g5_fail(err, G5_ERR_UNSUPPORTED,
                           "process %u: its %u ranks need %u GPUs of their own (NCCL takes one GPU per rank), it sees %d",
                           rt_comm_rank(g->comm), g->T, g->T, ndev);
        g->coll = COLL_NCCL;
        g->info.n_devices = g->T_all; /* distinct: gm_coll_agree_devices checks it */
    }
#ifndef G5_HAVE_NCCL
    if (g->coll == COLL_NCCL)
        return g5_fail(err, G5_ERR_UNSUPPORTED, "%u ranks on %u devices need NCCL, and this build has no nccl.h", g->T_all,
                       g->info.n_devices);
#endif
    for (uint32_t r = 0; r < g->T; r++)
        g->rk[r].dev = g->coll == COLL_DEVICE ? device0 : (int)(((uint64_t)device0 + (uint64_t)lr * g->T + r) % (uint64_t)ndev);
    /* each device's context read once, and checked against the kernels' table (cuda/cuk_limits.h)
     * before anything is loaded: a device that cannot run a kernel is named with the limit */
    for (uint32_t r = 0; r < g->T; r++) {
        cuk_device d;
        g5_status st = cuk_device_get(g->rk[r].dev, &d, err);
        if (!st) st = cuk_device_check(&d, err);
        if (st) return st;
    }
    return G5_OK;
}

int gm_coll_same_gpu(const gm_dev_id *ids, uint32_t n, uint32_t *a, uint32_t *b) {
    static const uint8_t zero[16];
    for (uint32_t j = 1; j < n; j++)
        for (uint32_t i = 0; i < j; i++) {
            const int ui = memcmp(ids[i].uuid, zero, 16) != 0, uj = memcmp(ids[j].uuid, zero, 16) != 0;
            const int same = ui && uj ? !memcmp(ids[i].uuid, ids[j].uuid, 16)
                                      : !strncmp(ids[i].host, ids[j].host, sizeof ids[i].host) &&
                                            !strncmp(ids[i].bus, ids[j].bus, sizeof ids[i].bus);
            if (same) {
                *a = i;
                *b = j;
                return 1;
            }
        }
    return 0;
}

g5_status gm_coll_agree_devices(rt_gpu_model *g, g5_status st, g5_error *err) {
    rt_comm *c = g->comm;
    const uint32_t P = rt_comm_size(c);
    if (P == 1) return st;
    gm_dev_id *ids = calloc((size_t)g->T_all + g->T, sizeof *ids);
    if (!ids) return st ? st : g5_fail(err, G5_ERR_NOMEM, "device ids");
    gm_dev_id *mine = ids + g->T_all;
    char host[64] = "?";
    gethostname(host, sizeof host - 1);
    for (uint32_t r = 0; r < g->T && !st; r++) {
        struct cudaDeviceProp prop;
        cudaError_t ce = cudaGetDeviceProperties(&prop, g->rk[r].dev);
        if (ce == cudaSuccess) ce = cudaDeviceGetPCIBusId(mine[r].bus, (int)sizeof mine[r].bus, g->rk[r].dev);
        if (ce != cudaSuccess) {
            st = g5_fail(err, G5_ERR_INTERNAL, "device %d: %s", g->rk[r].dev, cudaGetErrorString(ce));
            break;
        }
        memcpy(mine[r].uuid, prop.uuid.bytes, 16);
        mine[r].bus[sizeof mine[r].bus - 1] = 0;
        memcpy(mine[r].host, host, sizeof mine[r].host);
    }
    /* process p's ranks are global ranks p * T .. : the gathered ids are in global rank order */
    st = agree(c, st, mine, (size_t)g->T * sizeof *mine, ids, "placing its ranks on GPUs", err);
    uint32_t a, b;
    if (!st && gm_coll_same_gpu(ids, g->T_all, &a, &b))
        st = g5_fail(err, G5_ERR_UNSUPPORTED,
                     "ranks %u (process %u) and %u (process %u) are on the same GPU (%s on %s): NCCL takes one GPU "
                     "per rank; start at most one process per GPU of a node, each seeing its own GPUs "
                     "(CUDA_VISIBLE_DEVICES, srun --gpus-per-task) or all of them (rank i on local GPU "
                     "local_rank * ranks_per_process + i)",
                     a, a / g->T, b, b / g->T, ids[a].bus, ids[a].host);
    free(ids);
    return st;
}

/* ---- after loading: status, the loader's report, the vocabulary split ---- */

typedef struct load_rec {
    uint32_t lo, w;              /* logits columns this process's ranks write */
    int32_t verified, n_threads;
    uint64_t bytes, direct, buffered, wbytes, xbytes;
    double seconds;
} load_rec;

g5_status gm_coll_vocab_check(const uint32_t *lo, const uint32_t *w, uint32_t P, uint32_t V, g5_error *err) {
    uint64_t next = 0;
    for (uint32_t p = 0; p < P; p++) {
        if (!w[p]) continue;
        if (lo[p] != next)
            return g5_fail(err, G5_ERR_MODEL, "process %u writes logits columns %u..%u, but the processes before it end at %llu",
                           p, lo[p], lo[p] + w[p], (unsigned long long)next);
        next += w[p];
    }
    if (next != V)
        return g5_fail(err, G5_ERR_MODEL, "the processes write %llu logits columns of %u", (unsigned long long)next, V);
    return G5_OK;
}

g5_status gm_coll_agree_load(rt_gpu_model *g, g5_status st, g5_error *err) {
    rt_comm *c = g->comm;
    const uint32_t P = rt_comm_size(c);
    if (P == 1) return st;
    load_rec me;
    memset(&me, 0, sizeof me);
    if (!st) {
        /* the local writers' columns: contiguous (the CPU model splits lm_head evenly by rank) */
        uint64_t lo = UINT64_MAX, hi = 0, w = 0;
        for (uint32_t r = 0; r < g->T; r++) {
            const gl_rank *rk = &g->rk[r];
            if (!rk->head_write) continue;
            if (rk->head_col0 < lo) lo = rk->head_col0;
            if (rk->head_col0 + (uint64_t)rk->head.m > hi) hi = rk->head_col0 + (uint64_t)rk->head.m;
            w += (uint64_t)rk->head.m;
        }
        if (w && hi - lo != w)
            st = g5_fail(err, G5_ERR_MODEL, "process %u: its ranks' logits columns are not contiguous", rt_comm_rank(c));
        me.lo = w ? (uint32_t)lo : 0;
        me.w = (uint32_t)w;
        me.verified = g->info.load.verified;
        me.n_threads = (int32_t)g->info.load.n_threads;
        me.bytes = g->info.load.bytes;
        me.direct = g->info.load.direct_reads;
        me.buffered = g->info.load.buffered_reads;
        me.wbytes = g->info.weight_bytes;
        me.xbytes = g->info.extra_bytes;
        me.seconds = g->info.load.seconds;
    }
    load_rec *all = calloc(P, sizeof *all);
    free(g->vcol);
    g->vcol = calloc(2 * (size_t)P, sizeof *g->vcol);
    if (!all || !g->vcol) {
        free(all);
        return st ? st : g5_fail(err, G5_ERR_NOMEM, "load records");
    }
    st = agree(c, st, &me, sizeof me, all, "loading its ranks", err);
    if (!st) {
        rt_gpu_info *in = &g->info;
        rt_gpu_load_stats *ls = &in->load;
        ls->bytes = ls->direct_reads = ls->buffered_reads = 0;
        in->weight_bytes = in->extra_bytes = 0;
        for (uint32_t p = 0; p < P; p++) {
            const load_rec *a = &all[p];
            g->vcol[p] = a->lo;
            g->vcol[P + p] = a->w;
            ls->bytes += a->bytes;
            ls->direct_reads += a->direct;
            ls->buffered_reads += a->buffered;
            in->weight_bytes += a->wbytes;
            in->extra_bytes += a->xbytes;
            if (a->seconds > ls->seconds) ls->seconds = a->seconds; /* the processes load at once */
            ls->verified = ls->verified && a->verified;
        }
        ls->gb_per_s = ls->seconds > 0 ? (double)ls->bytes / ls->seconds / 1e9 : 0;
        st = gm_coll_vocab_check(g->vcol, g->vcol + P, P, g->hp.n_vocab, err);
    }
    free(all);
    return st;
}

/* ---- logits ----
 * Process p's ranks wrote columns [lo_p, lo_p + w_p) of each row; the others are exchanged. One
 * row in place; several rows packed, a bounded number at a time. */

#define GATHER_BYTES ((size_t)32 << 20)

g5_status gm_coll_gather_logits(rt_gpu_model *g, float *logits, uint32_t rows, g5_error *err) {
    rt_comm *c = g->comm;
    const uint32_t P = rt_comm_size(c), me = rt_comm_rank(c), V = g->hp.n_vocab;
    if (P == 1 || !logits || !rows) return G5_OK;
    const uint32_t *lo = g->vcol, *w = g->vcol + P;
    size_t *lens = malloc(2 * (size_t)P * sizeof *lens);
    if (!lens) return g5_fail(err, G5_ERR_NOMEM, "logits gather");
    size_t *offs = lens + P;
    g5_status st = G5_OK;
    if (rows == 1) {
        for (uint32_t p = 0; p < P; p++) {
            lens[p] = (size_t)w[p] * 4;
            offs[p] = (size_t)lo[p] * 4;
        }
        st = rt_comm_allgatherv(c, logits + lo[me], lens, offs, logits, err);
        free(lens);
        return st;
    }
    uint32_t chunk = (uint32_t)(GATHER_BYTES / ((size_t)V * 4));
    if (chunk < 1) chunk = 1;
    if (chunk > rows) chunk = rows;
    float *buf = malloc(((size_t)chunk * w[me] + (size_t)chunk * V) * sizeof *buf);
    if (!buf) {
        free(lens);
        return g5_fail(err, G5_ERR_NOMEM, "logits gather of %u rows", chunk);
    }
    float *pack = buf, *all = buf + (size_t)chunk * w[me];
    for (uint32_t t0 = 0; t0 < rows && !st; t0 += chunk) {
        const uint32_t n = rows - t0 < chunk ? rows - t0 : chunk;
        /* block p of `all` holds process p's n rows of w_p columns: it starts at n * lo_p */
        for (uint32_t p = 0; p < P; p++) {
            lens[p] = (size_t)n * w[p] * 4;
            offs[p] = (size_t)n * lo[p] * 4;
        }
        for (uint32_t t = 0; t < n; t++)
            memcpy(pack + (size_t)t * w[me], logits + (size_t)(t0 + t) * V + lo[me], (size_t)w[me] * 4);
        st = rt_comm_allgatherv(c, pack, lens, offs, all, err);
        for (uint32_t p = 0; p < P && !st; p++) {
            if (p == me) continue;
            for (uint32_t t = 0; t < n; t++)
                memcpy(logits + (size_t)(t0 + t) * V + lo[p], all + (size_t)n * lo[p] + (size_t)t * w[p], (size_t)w[p] * 4);
        }
    }
    free(buf);
    free(lens);
    return st;
}

g5_status gm_coll_gather_argmax(rt_gpu_model *g, int32_t *ids, float *vals, uint32_t rows, g5_error *err) {
    rt_comm *c = g->comm;
    const uint32_t P = rt_comm_size(c), me = rt_comm_rank(c);
    if (P == 1 || !rows) return G5_OK;
    typedef struct {
        int32_t id;
        float v;
    } pair;
    _Static_assert(sizeof(pair) == 8, "pair is two 4-byte fields");
    pair *all = malloc((size_t)P * rows * sizeof *all);
    size_t *lens = malloc(2 * (size_t)P * sizeof *lens);
    if (!all || !lens) {
        free(all);
        free(lens);
        return g5_fail(err, G5_ERR_NOMEM, "argmax gather of %u rows", rows);
    }
    size_t *offs = lens + P;
    for (uint32_t p = 0; p < P; p++) {
        lens[p] = (size_t)rows * sizeof *all;
        offs[p] = (size_t)p * rows * sizeof *all;
    }
    pair *mine = all + (size_t)me * rows;
    for (uint32_t t = 0; t < rows; t++) mine[t] = (pair){ids[t], vals[t]};
    g5_status st = rt_comm_allgatherv(c, mine, lens, offs, all, err);
    for (uint32_t t = 0; t < rows && !st; t++) {
        int64_t best = -1;
        float bv = NAN;
        for (uint32_t p = 0; p < P; p++) {
            const pair q = all[(size_t)p * rows + t];
            gm_argmax_take(&best, &bv, q.id, q.v);
        }
        ids[t] = (int32_t)best;
        vals[t] = best < 0 ? NAN : bv;
    }
    free(all);
    free(lens);
    return st;
}

/* ---- NCCL (loaded at run time: a one-device run never needs the library) ---- */

#ifdef G5_HAVE_NCCL
g5_status gm_nccl_open(rt_gpu_model *g, g5_error *err) {
    nccl_api *a = &g->nccl;
    a->lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!a->lib) a->lib = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
    if (!a->lib)
        return g5_fail(err, G5_ERR_UNSUPPORTED, "%u ranks on %u devices need NCCL: libnccl.so.2 not found (%s)",
                       g->T_all, g->info.n_devices, dlerror());
#define SYM(field, name)                                                                      \
    do {                                                                                      \
        *(void **)(&a->field) = dlsym(a->lib, name);                                          \
        if (!a->field) return g5_fail(err, G5_ERR_UNSUPPORTED, "NCCL: no symbol %s", name);   \
    } while (0)
    SYM(get_unique_id, "ncclGetUniqueId");
    SYM(comm_init_rank, "ncclCommInitRank");
    SYM(all_reduce, "ncclAllReduce");
    SYM(group_start, "ncclGroupStart");
    SYM(group_end, "ncclGroupEnd");
    SYM(comm_destroy, "ncclCommDestroy");
    SYM(error_string, "ncclGetErrorString");
#undef SYM
    if (rt_comm_rank(g->comm) == 0) {
        CUK_CHECK_NCCL(a->get_unique_id(&a->id), a->error_string);
    }
    return G5_OK;
}

g5_status gm_nccl_init(rt_gpu_model *g, g5_error *err) {
    nccl_api *a = &g->nccl;
    if (rt_comm_size(g->comm) > 1) CK(rt_comm_bcast(g->comm, &a->id, sizeof a->id, 0, err));
    /* one code path for one process and many: each rank joins the T_all-rank communicator under
     * its global index; the group lets one thread initialize all of its process's ranks */
    ncclResult_t nr = a->group_start();
    cudaError_t ce = cudaSuccess;
    for (uint32_t r = 0; r < g->T && nr == ncclSuccess && ce == cudaSuccess; r++) {
        ce = cudaSetDevice(g->rk[r].dev);
        if (ce == cudaSuccess) nr = a->comm_init_rank(&g->rk[r].comm, (int)g->T_all, a->id, (int)(g->first + r));
    }
    const ncclResult_t ne = a->group_end();
    if (ce != cudaSuccess) return g5_fail(err, G5_ERR_INTERNAL, "NCCL setup: cudaSetDevice: %s", cudaGetErrorString(ce));
    if (nr != ncclSuccess || ne != ncclSuccess)
        return g5_fail(err, G5_ERR_INTERNAL, "ncclCommInitRank (%u ranks, %u here from rank %u): %s", g->T_all, g->T,
                       g->first, a->error_string(nr != ncclSuccess ? nr : ne));
    return G5_OK;
}
#endif

typedef int rt_gpu_coll_unused_;
#endif
