/*
 * fuzz_gguf_split.c - fuzz target for a split GGUF model's shard set (lib/gguf.c,
 * fmoe_gguf_parse_split): each shard parsed as fuzz_gguf parses a file, then the join that
 * fmoe_gguf_open does for PREFIX-0000i-of-0000N.gguf: every shard's place, the checks that
 * tie a shard to shard 1 (GGUF version, split.tensors.count, keys both carry), the total,
 * no tensor in two shards. On what it accepts, every tensor must lie inside its own shard's
 * bytes and the first row of each one fmoe computes with is dequantised and dotted, so a
 * join that mixes up shards shows up as a read past an input (ASan) or an abort.
 *
 * Input: byte 0 gives the shard count, 1 + byte % 4; then, for every shard but the last, a
 * little-endian uint16 length and that many bytes (fewer where the input ends); the last
 * shard is the rest. Each shard is handed over as an exact-size copy.
 *
 * With libFuzzer (tests/fuzz/README.md): CC=clang meson setup build-fuzz -Dfuzzing=true ...
 * Without (the `fuzz` suite of meson test): replays corpus/gguf_split.tar.zst (seeds from
 * the seeded replay below with FMOE_FUZZ_WRITE_SEEDS=DIR, grown by a libFuzzer run), then
 * seeded mutations of a 3-shard model built here: every prefix of every shard, edits inside one shard (bytes, counts and
 * lengths set to extremes, cuts), and shard sets out of order, short, padded, or with a
 * shard of another model (another total, version or architecture) in place of one.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/gguf.h"
#include "fmoe/quant.h"

#define MAX_SHARDS 4
#define MAX_ROW 4096

static int last_rc; /* the join's result for the last input, for the seeded replay */

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);
int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    if (size == 0) return 0;
    const int32_t n = 1 + data[0] % MAX_SHARDS;
    unsigned char *buf[MAX_SHARDS] = {0};
    const void *bytes[MAX_SHARDS];
    uint64_t sizes[MAX_SHARDS];
    size_t at = 1;
    for (int32_t i = 0; i < n; i++) {
        size_t len = size - at;
        if (i < n - 1) {
            len = 0;
            if (at < size) len = data[at++];
            if (at < size) len |= (size_t)data[at++] << 8;
            if (len > size - at) len = size - at;
        }
        buf[i] = malloc(len ? len : 1); /* an exact-size copy: a read past it is ASan's */
        if (!buf[i]) abort();
        memcpy(buf[i], data + at, len);
        at += len;
        bytes[i] = buf[i];
        sizes[i] = len;
    }
    fmoe_gguf *g = NULL;
    const int rc = fmoe_gguf_parse_split(bytes, sizes, n, "fuzz.gguf", &g);
    last_rc = rc;
    if (rc != 0) {
        if (rc > 0 || fmoe_error_detail()[0] == '\0' || strchr(fmoe_error_detail(), '\n')) {
            fprintf(stderr, "fuzz_gguf_split: error %d without a one-line detail\n", rc);
            abort();
        }
        for (int32_t i = 0; i < n; i++) free(buf[i]);
        return 0;
    }
    /* the promises of the join */
    if (fmoe_gguf_shard_count(g) != n) abort();
    int64_t total = 0;
    if (n > 1 && (fmoe_gguf_get_int(g, "split.tensors.count", &total) != 0 ||
                  total != fmoe_gguf_tensor_count(g)))
        abort();
    double sink = 0;
    static float row[MAX_ROW], x[MAX_ROW];
    for (int64_t i = 0; i < fmoe_gguf_tensor_count(g); i++) {
        const fmoe_gguf_tensor *t = fmoe_gguf_tensor_at(g, i);
        if (fmoe_gguf_find_tensor(g, t->name) != t) abort(); /* and no name twice */
        if (t->shard < 0 || t->shard >= n) abort();
        if (strcmp(t->file, fmoe_gguf_shard_name(g, t->shard)) != 0) abort();
        const unsigned char *lo = buf[t->shard], *p = t->data;
        if (p < lo || t->offset + (uint64_t)t->nbytes > sizes[t->shard] ||
            p != lo + t->offset)
            abort(); /* inside its own shard */
        if (!fmoe_quant_supported(t->type) || t->numel == 0 || t->ne[0] > MAX_ROW) continue;
        fmoe_quant_dequantize_row(t->type, t->data, row, t->ne[0]);
        for (int64_t k = 0; k < t->ne[0]; k++) x[k] = (float)(k % 5) - 2;
        sink += fmoe_quant_dot(t->type, t->data, x, t->ne[0]) + row[t->ne[0] - 1];
    }
    fmoe_gguf_close(g);
    for (int32_t i = 0; i < n; i++) free(buf[i]);
    volatile double keep = sink; /* the reads must happen */
    (void)keep;
    return 0;
}

#ifndef FMOE_LIBFUZZER
static unsigned long long rng_state = 0x73706c6974ull; /* "split" */
static unsigned long long rng(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

typedef struct shard {
    unsigned char b[2048];
    size_t n;
} shard;

static void put(shard *s, const void *p, size_t n) {
    memcpy(s->b + s->n, p, n);
    s->n += n;
}
static void u16(shard *s, uint16_t v) { put(s, &v, 2); }
static void u32(shard *s, uint32_t v) { put(s, &v, 4); }
static void u64(shard *s, uint64_t v) { put(s, &v, 8); }
static void str(shard *s, const char *t) {
    u64(s, strlen(t));
    put(s, t, strlen(t));
}

/* Shard `no` of `count` of a model of `total` tensors, GGUF `version`; shard 0 carries
 * general.architecture `arch`, as llama.cpp's llama-gguf-split writes it (when `copy_arch`,
 * every shard does). Tensors: shard `no` holds type types[no % 4], two rows, named by
 * `tag` and no. */
static void build_shard(shard *s, int no, int count, int total, uint32_t version,
                        const char *arch, int copy_arch, char tag) {
    static const uint32_t types[] = {FMOE_GGML_F32, FMOE_GGML_Q8_0, FMOE_GGML_Q4_K,
                                     FMOE_GGML_BF16};
    const int with_arch = no == 0 || copy_arch;
    s->n = 0;
    put(s, "GGUF", 4);
    u32(s, version);
    u64(s, 1);
    u64(s, 3 + (uint64_t)with_arch);
    if (with_arch) {
        str(s, "general.architecture");
        u32(s, FMOE_GGUF_STRING);
        str(s, arch);
    }
    str(s, "split.no");
    u32(s, FMOE_GGUF_UINT16);
    u16(s, (uint16_t)no);
    str(s, "split.count");
    u32(s, FMOE_GGUF_UINT16);
    u16(s, (uint16_t)count);
    str(s, "split.tensors.count");
    u32(s, FMOE_GGUF_INT32);
    u32(s, (uint32_t)total);
    const uint32_t type = types[no % 4];
    const int64_t ne0 = fmoe_ggml_block_size(type) == 256 ? 256 : 32;
    char name[16];
    snprintf(name, sizeof name, "%c%d.weight", tag, no);
    str(s, name);
    u32(s, 2);
    u64(s, (uint64_t)ne0);
    u64(s, 2);
    u32(s, type);
    u64(s, 0);
    while (s->n % 32) s->b[s->n++] = 0;
    const size_t bytes = 2 * (size_t)fmoe_quant_row_bytes(type, ne0);
    for (size_t i = 0; i < bytes; i++)
        s->b[s->n++] = (unsigned char)((i * 31 + (size_t)no) % 251 % 60);
}

/* Packs n shards into one input (the format above) and runs it (the join's result in
 * last_rc); with
 * FMOE_FUZZ_WRITE_SEEDS=DIR, also writes it there when `seed` (how the committed corpus was
 * made). */
static void run_set(const shard *const *set, int n, int seed) {
    static unsigned char in[MAX_SHARDS * (sizeof(shard) + 2) + 1];
    size_t len = 0;
    in[len++] = (unsigned char)(n - 1 + 4 * (rng() % 8)); /* any byte of that count */
    for (int i = 0; i < n; i++) {
        if (i < n - 1) {
            in[len++] = (unsigned char)(set[i]->n & 0xff);
            in[len++] = (unsigned char)(set[i]->n >> 8);
        }
        memcpy(in + len, set[i]->b, set[i]->n);
        len += set[i]->n;
    }
    LLVMFuzzerTestOneInput(in, len);
    const char *dir = getenv("FMOE_FUZZ_WRITE_SEEDS");
    static int written;
    if (!dir || !seed) return;
    char path[1024];
    snprintf(path, sizeof path, "%s/seed-%04d", dir, ++written);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(in, 1, len, f) != len) {
        fprintf(stderr, "fuzz_gguf_split: cannot write %s\n", path);
        abort();
    }
    fclose(f);
}

/* One to three edits inside a shard, as fuzz_gguf's: a byte, a count or length set to an
 * extreme, a cut, a bit. */
static void edit(shard *s) {
    static const uint64_t extremes[] = {0, 1, 2, 3, 255, 65535, 0xffffffffull, 1ull << 62};
    const int edits = 1 + (int)(rng() % 3);
    for (int e = 0; e < edits && s->n > 0; e++) {
        const size_t at = rng() % s->n;
        switch (rng() % 4) {
        case 0: s->b[at] = (unsigned char)rng(); break;
        case 1: {
            const uint64_t v = extremes[rng() % 8];
            const size_t w = rng() % 3 == 0 ? 2 : rng() % 2 ? 8 : 4;
            if (at + w <= s->n) memcpy(s->b + at, &v, w);
            break;
        }
        case 2: s->n = at; break;
        default: s->b[at] ^= (unsigned char)(1u << (rng() % 8)); break;
        }
    }
}

int fuzz_seeded_replay(void);
int fuzz_seeded_replay(void) {
    enum { N = 3 };
    static shard good[N], other_total[N], other_version[N], other_arch[N], copied[N], m;
    for (int i = 0; i < N; i++) {
        build_shard(&good[i], i, N, N, 3, "llama", 0, 't');
        build_shard(&other_total[i], i, N, N + 1, 3, "llama", 0, 't');
        build_shard(&other_version[i], i, N, N, 2, "llama", 0, 't');
        build_shard(&other_arch[i], i, N, N, 3, "olmoe", 1, 't');
        build_shard(&copied[i], i, N, N, 3, "llama", 1, 't');
    }
    const shard *set[MAX_SHARDS];
    long runs = 0, joined = 0;
    /* whole sets: the model, its keys copied into every shard, each shard alone */
    for (int i = 0; i < N; i++) set[i] = &good[i];
    run_set(set, N, 1), runs++;
    if (last_rc != 0) {
        fprintf(stderr, "fuzz_gguf_split: the seed model is refused: %s\n", fmoe_error_detail());
        abort();
    }
    for (int i = 0; i < N; i++) set[i] = &copied[i];
    run_set(set, N, 1), runs++;
    if (last_rc != 0) abort(); /* keys copied into every shard, of the same values */
    for (int i = 0; i < N; i++) {
        set[0] = &good[i];
        run_set(set, 1, 1), runs++;
        if (last_rc == 0) abort(); /* shard 1 is short of its shards; the others are not 1 */
    }
    /* a shard of another model in each place; shards swapped, repeated, missing, extra */
    const shard *const foreign[3][N] = {
        {&other_total[0], &other_total[1], &other_total[2]},
        {&other_version[0], &other_version[1], &other_version[2]},
        {&other_arch[0], &other_arch[1], &other_arch[2]},
    };
    for (int f = 0; f < 3; f++)
        for (int k = 0; k < N; k++) {
            for (int i = 0; i < N; i++) set[i] = i == k ? foreign[f][i] : &good[i];
            run_set(set, N, 1), runs++;
            /* A shard of another model is not joined when what ties shards differs: its
             * total, its version, or a key both carry (shards 2 and 3 carry no
             * architecture, so another shard 1 of the same total and version joins them:
             * nothing in the format tells it apart). */
            if (last_rc != (f == 2 && k == 0 ? 0 : FMOE_EFORMAT)) {
                fprintf(stderr, "fuzz_gguf_split: foreign shard %d of kind %d: %d\n", k, f,
                        last_rc);
                abort();
            }
        }
    const int orders[][MAX_SHARDS] = {{0, 2, 1}, {1, 0, 2}, {0, 1, 1},
                                      {0, 0, 2}, {0, 1, 2, 2}, {0, 1}};
    const int lens[] = {3, 3, 3, 3, 4, 2};
    for (int o = 0; o < 6; o++) {
        for (int i = 0; i < lens[o]; i++) set[i] = &good[orders[o][i]];
        run_set(set, lens[o], 1), runs++;
    }
    /* every prefix of every shard */
    for (int k = 0; k < N; k++)
        for (size_t cut = 0; cut < good[k].n; cut++, runs++) {
            m = good[k];
            m.n = cut;
            for (int i = 0; i < N; i++) set[i] = i == k ? &m : &good[i];
            run_set(set, N, 0);
        }
    /* edits inside one shard, sometimes with a shard of another model beside it */
    for (int r = 0; r < 30000; r++, runs++) {
        const int k = (int)(rng() % N);
        m = good[k];
        edit(&m);
        for (int i = 0; i < N; i++) set[i] = i == k ? &m : &good[i];
        if (rng() % 8 == 0) {
            const int j = (int)(rng() % N);
            if (j != k) set[j] = foreign[rng() % 3][j];
        }
        run_set(set, N, r % 1000 == 0);
        joined += last_rc == 0;
    }
    printf("fuzz_gguf_split: %ld inputs (%ld edited sets joined), no crash\n", runs, joined);
    return 0;
}
#endif
