/* The blob loader's threading (runtime/gpu/gpu_load.c) on the CPU, against cuda_stub.c: random
 * configurations (readers, slot and pread sizes, ring depth, helping, checksums, O_DIRECT,
 * pinning, a device change between loads) over blobs with 4 KiB, 64 KiB and 1 MiB hash chunks
 * and random bytes must give the file's data region exactly; a flipped byte must be refused
 * naming its tensor, through rt_gpu_loader_load and rt_gpu_load_blob. Built and run by run.sh
 * (no GPU needed); bench_load and test_gpu_model cover the real thing on the device. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/blob.h"
#include "format/gguf_write.h"
#include "format/quant.h"
#include "runtime/gpu/gpu_load.h"
#include "tests/test_util.h"

extern int stub_delay_us, stub_register_fails;

static uint64_t g_rs = 88172645463325252ull;
static uint32_t rnd(void) {
    g_rs ^= g_rs << 13;
    g_rs ^= g_rs >> 7;
    g_rs ^= g_rs << 17;
    return (uint32_t)g_rs;
}

/* ntens F32 tensors of random sizes (4 KB .. 800 KB) and random bytes, chunk_size chunks. */
static int make_blob(const char *path, int ntens, uint64_t chunk) {
    gguf_writer *gw = gguf_writer_create();
    uint8_t *meta = NULL;
    uint64_t meta_len = 0;
    gguf_writer_set_str(gw, "general.architecture", "glm-dsa", 7);
    g5_status st = gguf_writer_write_buffer(gw, &meta, &meta_len);
    gguf_writer_free(gw);
    if (st) return -1;
    blob_writer_tensor wt[64];
    char names[64][32];
    uint64_t total = 0;
    for (int i = 0; i < ntens && i < 64; i++) {
        snprintf(names[i], sizeof names[i], "t%02d.weight", i);
        const uint64_t ne = 1000 + rnd() % 200000;
        wt[i] = (blob_writer_tensor){names[i], QT_F32, 1, {ne, 1, 1, 1}, {ne, 1, 1, 1}, BLOB_AXIS_NONE, 0, 1, 0};
        total += ne * 4;
    }
    blob_source_desc src = {"synthetic.gguf", 1, 1, {0}, {0}};
    blob_writer_params p;
    memset(&p, 0, sizeof p);
    p.tp = 1;
    p.placement = BLOB_PLACE_TP;
    p.kv_b_type = QT_F32;
    p.meta = meta;
    p.meta_len = meta_len;
    p.n_sources = 1;
    p.sources = &src;
    p.chunk_size = chunk;
    blob_writer *w = NULL;
    g5_error e = {0};
    st = blob_writer_create(path, &p, wt, (uint64_t)ntens, &w, &e);
    free(meta);
    if (st) {
        printf("blob writer: %s\n", e.msg);
        return -1;
    }
    uint8_t buf[1 << 16];
    for (uint64_t done = 0; done < total && !st;) {
        const uint64_t nb = total - done < sizeof buf ? total - done : sizeof buf;
        for (uint64_t i = 0; i < nb; i++) buf[i] = (uint8_t)rnd();
        st = blob_writer_write(w, buf, nb, &e);
        done += nb;
    }
    if (!st) st = blob_writer_finish(w, NULL, &e);
    blob_writer_free(w);
    if (st) printf("blob writer: %s\n", e.msg);
    return st ? -1 : 0;
}

static void random_opts(rt_gpu_load_opts *o) {
    static const uint64_t bufs[5] = {4096, 12288, 65536, 300000, 2u << 20};
    rt_gpu_load_opts_default(o);
    o->n_threads = 1 + rnd() % 9;
    o->buf_bytes = bufs[rnd() % 5];
    o->read_bytes = rnd() % 2 ? 0 : 4096 * (1 + rnd() % 8);
    o->bufs_per_thread = 1 + rnd() % 4;
    o->verify = rnd() % 4 != 0;
    o->no_help = rnd() % 4 == 0;
    o->direct = rnd() % 5 == 0;
    o->pin = (int)(rnd() % 4);
}

static void check_blob(const char *path, int ntens, uint64_t chunk) {
    if (make_blob(path, ntens, chunk)) {
        T_CHECK(0, "blob with %llu-byte chunks", (unsigned long long)chunk);
        return;
    }
    blob *b = NULL;
    g5_error e = {0};
    T_CHECK(blob_open(path, &b, &e) == G5_OK, "open: %s", e.msg);
    if (!b) return;
    const blob_info *in = blob_get_info(b);
    uint64_t len;
    const uint8_t *img = blob_get_bytes(b, &len);
    uint64_t helped = 0;
    for (int trial = 0; trial < 40; trial++) {
        rt_gpu_load_opts o;
        random_opts(&o);
        stub_delay_us = rnd() % 3 ? 50 : 0;
        stub_register_fails = rnd() % 3 == 0;
        rt_gpu_loader *ld = NULL;
        g5_status st = rt_gpu_loader_create(0, &o, &ld, &e);
        if (o.pin == RT_PIN_REGISTER && stub_register_fails) {
            T_CHECK(st == G5_ERR_NOMEM && !ld, "an explicit RT_PIN_REGISTER that fails is an error: %s", g5_strerror(st));
            continue;
        }
        T_CHECK(st == G5_OK, "create: %s", e.msg);
        if (st) continue;
        for (int dev_id = 0; dev_id < 2; dev_id++) { /* the second load remakes the streams */
            void *dev = NULL;
            rt_gpu_load_stats ls;
            st = rt_gpu_loader_load(ld, b, dev_id, &o, &dev, &ls, &e);
            T_CHECK(st == G5_OK, "load T=%u slot %llu: %s", o.n_threads, (unsigned long long)o.buf_bytes, e.msg);
            if (st) continue;
            T_CHECK(memcmp(dev, img + in->data_offset, in->data_size) == 0,
                    "bytes differ: T=%u slot %llu read %llu ring %u verify %d help %d", o.n_threads,
                    (unsigned long long)o.buf_bytes, (unsigned long long)o.read_bytes, o.bufs_per_thread, o.verify, !o.no_help);
            T_CHECK(ls.bytes == in->data_size && ls.verified == o.verify, "stats");
            const int want_pin = o.pin == RT_PIN_AUTO ? (stub_register_fails ? RT_PIN_ALLOC : RT_PIN_REGISTER) : o.pin;
            T_CHECK(ls.pin == want_pin, "pinned with %d, expected %d", ls.pin, want_pin);
            T_CHECK(!o.no_help || ls.helped_bytes == 0, "no help asked, %llu bytes helped", (unsigned long long)ls.helped_bytes);
            helped += ls.helped_bytes;
            free(dev);
        }
        rt_gpu_loader_free(ld);
    }
    printf("%llu chunks of %llu bytes: 80 loads, %llu bytes read by helpers\n", (unsigned long long)in->n_chunks,
           (unsigned long long)chunk, (unsigned long long)helped);
    if (in->n_chunks < 40) T_CHECK(helped > 0, "helpers ran with few chunks");

    const blob_tensor *bt = blob_get_tensor(b, blob_n_tensors(b) / 2);
    char victim[64];
    snprintf(victim, sizeof victim, "%s", bt->name);
    const uint64_t off = bt->offset + bt->size / 3;
    blob_free(b);
    int fd = open(path, O_RDWR);
    uint8_t byte = 0;
    T_CHECK(fd >= 0 && pread(fd, &byte, 1, (off_t)off) == 1, "read the victim byte");
    byte ^= 4;
    T_CHECK(fd >= 0 && pwrite(fd, &byte, 1, (off_t)off) == 1, "flip it");
    if (fd >= 0) close(fd);
    b = NULL;
    T_CHECK(blob_open(path, &b, &e) == G5_OK, "reopen: %s", e.msg);
    if (!b) return;
    for (int trial = 0; trial < 12; trial++) {
        rt_gpu_load_opts o;
        random_opts(&o);
        o.verify = 1;
        o.pin = RT_PIN_AUTO;
        void *dev = NULL;
        memset(&e, 0, sizeof e);
        const g5_status st = rt_gpu_load_blob(b, 0, &o, &dev, NULL, &e);
        T_CHECK(st == G5_ERR_CHECKSUM && strstr(e.msg, victim) && !dev, "damaged %s: %s: %s", victim, g5_strerror(st), e.msg);
        if (trial == 0) printf("damaged: %s\n", e.msg);
    }
    rt_gpu_load_release();
    blob_free(b);
}

int main(void) {
    const char *dir = t_tmpdir();
    char path[4200];
    snprintf(path, sizeof path, "%s/t.g5b", dir);
    check_blob(path, 7, 4096);
    check_blob(path, 16, 65536);
    check_blob(path, 25, 1 << 20);
    t_rmtree(dir);
    return t_report("check_load");
}
