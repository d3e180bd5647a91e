/*
 * fuzz_gguf.c - fuzz target for the GGUF reader (lib/gguf.c) and, on what it accepts, the
 * block-format kernels (lib/quant*.c): every key's values are read through the typed
 * accessors, and the first row of every tensor fmoe computes with is dequantised and
 * dotted with a vector (f32, and 8-bit where the type has that path), so a validation gap shows up as a read past the input (ASan).
 *
 * With libFuzzer (tests/fuzz/README.md): CC=clang meson setup build-fuzz -Dfuzzing=true ...
 * Without (the `fuzz` suite of meson test): replays corpus/gguf.tar.zst (files written by
 * gguf-py's GGUFWriter and by hand), then seeded mutations of a file built here: every
 * prefix and 40,000 edits (bytes flipped, counts and lengths set to extremes, cuts).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/gguf.h"
#include "fmoe/quant.h"
#include "fmoe/quant_act.h"

#define MAX_ROW 4096 /* values dotted per tensor: the first row, up to this */

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);
int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    /* An exact-size copy: any read past `size` is an ASan report. */
    unsigned char *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    fmoe_gguf *g = NULL;
    const int rc = fmoe_gguf_parse(buf, size, "fuzz.gguf", &g);
    if (rc != 0) {
        if (rc > 0 || fmoe_error_detail()[0] == '\0' || strchr(fmoe_error_detail(), '\n')) {
            fprintf(stderr, "fuzz_gguf: error %d without a one-line detail\n", rc);
            abort();
        }
        free(buf);
        return 0;
    }
    double sink = 0;
    for (int64_t i = 0; i < fmoe_gguf_kv_count(g); i++) {
        const fmoe_gguf_kv *kv = fmoe_gguf_kv_at(g, i);
        if (fmoe_gguf_find_kv(g, kv->key) != kv) abort();
        for (uint64_t k = 0; k < kv->count && k < 64; k++) {
            if (kv->elem == FMOE_GGUF_STRING) sink += kv->strs[k].len ? (unsigned char)kv->strs[k].ptr[kv->strs[k].len - 1] : 0;
            else sink += fmoe_gguf_kv_number(kv, k);
        }
        int64_t v;
        double f;
        fmoe_gguf_str s;
        (void)fmoe_gguf_get_int(g, kv->key, &v);
        (void)fmoe_gguf_get_float(g, kv->key, &f);
        (void)fmoe_gguf_get_str(g, kv->key, &s);
    }
    static float row[MAX_ROW], x[MAX_ROW];
    for (int64_t i = 0; i < fmoe_gguf_tensor_count(g); i++) {
        const fmoe_gguf_tensor *t = fmoe_gguf_tensor_at(g, i);
        if (fmoe_gguf_find_tensor(g, t->name) != t) abort();
        if (t->offset + (uint64_t)t->nbytes > size) abort(); /* the reader's promise */
        if (!fmoe_quant_supported(t->type) || t->numel == 0 || t->ne[0] > MAX_ROW) continue;
        const fmoe_gguf_tensor *got;
        if (fmoe_gguf_get_tensor(g, t->name, t->ndim, t->ne, &got) != 0 || got != t) abort();
        fmoe_quant_dequantize_row(t->type, t->data, row, t->ne[0]);
        for (int64_t k = 0; k < t->ne[0]; k++) x[k] = (float)(k % 7) - 3;
        sink += fmoe_quant_dot(t->type, t->data, x, t->ne[0]);
        sink += fmoe_quant_dot_ref(t->type, t->data, x, t->ne[0]);
        /* and the 8-bit-activation dots of the types that have them */
        static uint8_t qx[MAX_ROW / 32 * FMOE_Q8_0_BYTES + MAX_ROW / 256 * FMOE_Q8_K_BYTES];
        if (fmoe_quant_act_bytes(t->type, t->ne[0]) > 0) {
            fmoe_quant_act_quantize(t->type, x, qx, t->ne[0]);
            sink += fmoe_quant_act_dot(t->type, t->data, qx, t->ne[0]);
            sink += fmoe_quant_act_dot_ref(t->type, t->data, qx, t->ne[0]);
        }
    }
    fmoe_gguf_close(g);
    free(buf);
    volatile double keep = sink; /* the reads must happen */
    (void)keep;
    return 0;
}

#ifndef FMOE_LIBFUZZER
static unsigned long long rng_state = 0x9e3779b97f4a7c15ull;
static unsigned long long rng(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

typedef struct seedbuf {
    unsigned char b[4096];
    size_t n;
} seedbuf;

static void put(seedbuf *s, const void *p, size_t n) {
    memcpy(s->b + s->n, p, n);
    s->n += n;
}
static void u32(seedbuf *s, uint32_t v) { put(s, &v, 4); }
static void u64(seedbuf *s, uint64_t v) { put(s, &v, 8); }
static void str(seedbuf *s, const char *t) {
    u64(s, strlen(t));
    put(s, t, strlen(t));
}

/* A file with a string, an array of strings, a float and tensors of every supported type,
 * the 32-value Q4_0 .. IQ4_NL, the low-bit Q2_K, Q3_K, IQ4_XS and the i-quants IQ2_XXS ..
 * IQ1_M included (one row each, values from a counter). */
static void build_seed(seedbuf *s) {
    static const uint32_t types[] = {FMOE_GGML_F32,  FMOE_GGML_F16,  FMOE_GGML_BF16,
                                     FMOE_GGML_Q8_0, FMOE_GGML_Q4_K, FMOE_GGML_Q5_K,
                                     FMOE_GGML_Q6_K, FMOE_GGML_Q4_0, FMOE_GGML_Q4_1,
                                     FMOE_GGML_Q5_0, FMOE_GGML_Q5_1, FMOE_GGML_IQ4_NL,
                                     FMOE_GGML_Q2_K, FMOE_GGML_Q3_K, FMOE_GGML_IQ4_XS,
                                     FMOE_GGML_IQ2_XXS, FMOE_GGML_IQ2_XS, FMOE_GGML_IQ2_S,
                                     FMOE_GGML_IQ3_XXS, FMOE_GGML_IQ3_S, FMOE_GGML_IQ1_S,
                                     FMOE_GGML_IQ1_M};
    enum { NT = sizeof types / sizeof types[0] };
    s->n = 0;
    put(s, "GGUF", 4);
    u32(s, 3);
    u64(s, NT);
    u64(s, 3);
    str(s, "general.architecture");
    u32(s, FMOE_GGUF_STRING);
    str(s, "olmoe");
    str(s, "tokenizer.ggml.tokens");
    u32(s, FMOE_GGUF_ARRAY);
    u32(s, FMOE_GGUF_STRING);
    u64(s, 2);
    str(s, "a");
    str(s, "bc");
    str(s, "general.alignment");
    u32(s, FMOE_GGUF_UINT32);
    u32(s, 32);
    uint64_t off = 0;
    for (int i = 0; i < NT; i++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", i);
        str(s, name);
        u32(s, 1);
        const int64_t n = fmoe_ggml_block_size(types[i]) == 256 ? 256 : 32;
        u64(s, (uint64_t)n);
        u32(s, types[i]);
        u64(s, off);
        off += (uint64_t)(fmoe_quant_row_bytes(types[i], n) + 31) / 32 * 32;
    }
    while (s->n % 32) s->b[s->n++] = 0;
    for (uint64_t i = 0; i < off; i++) s->b[s->n++] = (unsigned char)(i * 29 % 251 % 60);
}

int fuzz_seeded_replay(void);
int fuzz_seeded_replay(void) {
    seedbuf seed, m;
    build_seed(&seed);
    long runs = 0;
    LLVMFuzzerTestOneInput(seed.b, seed.n);
    for (size_t cut = 0; cut < seed.n; cut++, runs++) LLVMFuzzerTestOneInput(seed.b, cut);
    static const uint64_t extremes[] = {0, 1, 255, 65535, 0xffffffffull, 1ull << 32,
                                        1ull << 62, ~0ull};
    for (int r = 0; r < 40000; r++, runs++) {
        m = seed;
        const int edits = 1 + (int)(rng() % 3);
        for (int e = 0; e < edits && m.n > 0; e++) {
            const size_t at = rng() % m.n;
            switch (rng() % 4) {
            case 0: m.b[at] = (unsigned char)rng(); break;
            case 1: { /* a count, length or offset set to an extreme */
                const uint64_t v = extremes[rng() % 8];
                const size_t w = rng() % 2 ? 8 : 4;
                if (at + w <= m.n) memcpy(m.b + at, &v, w);
                break;
            }
            case 2: m.n = at; break;
            default: m.b[at] ^= (unsigned char)(1u << (rng() % 8)); break;
            }
        }
        LLVMFuzzerTestOneInput(m.b, m.n);
    }
    printf("fuzz_gguf: %ld inputs, no crash\n", runs);
    return 0;
}
#endif
