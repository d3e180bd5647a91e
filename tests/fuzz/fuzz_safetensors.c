/*
 * fuzz_safetensors.c - fuzz target for the safetensors header parser.
 *
 * With libFuzzer (or simply meson -Dfuzzing=true, tests/fuzz/README.md):
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -DFMOE_LIBFUZZER -Ilib/include -Iruntime/include \
 *     tests/fuzz/fuzz_safetensors.c runtime/model/safetensors.c lib/error.c -lcjson -lm \
 *     -o fuzz_safetensors && ./fuzz_safetensors
 * Without (the `fuzz` suite of meson test): replays a set of seed files built here (good
 * files of every dtype and rank, an empty header, metadata), every prefix of each, and a
 * fixed set of seeded mutations, under the build's sanitizers. Any crash, sanitizer report
 * or broken invariant fails the run.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/safetensors.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);
int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    /* An exact-size copy: any read past `size` is an ASan report. */
    unsigned char *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    int rc = fmoe_safetensors_validate(buf, size, "fuzz");
    if (rc != 0 && (rc > 0 || fmoe_error_detail()[0] == '\0')) {
        fprintf(stderr, "fuzz_safetensors: error %d without a detail\n", rc);
        abort();
    }
    free(buf);
    return 0;
}

#ifndef FMOE_LIBFUZZER
static unsigned long long rng_state = 0x2545f4914f6cdd1dull;
static unsigned long long rng(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

static const char *const tokens[] = {"{", "}", "[", "]", ",", ":", "\"", "null", "-1", "0",
                                     "1e308", "18446744073709551615", "9007199254740993",
                                     "\"F32\"", "\"BF16\"", "\"I64\"", "\"shape\"",
                                     "\"data_offsets\"", "\"__metadata__\"", "   "};

/* A seed: the 8-byte length, `header`, then `data_len` bytes of data. */
static size_t seed(unsigned char *out, const char *header, size_t data_len) {
    size_t h = strlen(header);
    for (int i = 0; i < 8; i++) out[i] = (unsigned char)((unsigned long long)h >> (8 * i));
    memcpy(out + 8, header, h);
    for (size_t i = 0; i < data_len; i++) out[8 + h + i] = (unsigned char)(i * 37);
    return 8 + h + data_len;
}

/* One seeded mutation of src (n bytes) into dst (capacity n + 64); returns the length. */
static size_t mutate(const unsigned char *src, size_t n, unsigned char *dst) {
    memcpy(dst, src, n);
    size_t len = n;
    int edits = 1 + (int)(rng() % 4);
    for (int e = 0; e < edits && len > 0; e++) {
        size_t at = rng() % len;
        switch (rng() % 5) {
        case 0: dst[at] = (unsigned char)(rng() & 0xff); break;
        case 1: memmove(dst + at, dst + at + 1, len - at - 1); len--; break;
        case 2: {
            const char *t = tokens[rng() % (sizeof tokens / sizeof tokens[0])];
            size_t tl = strlen(t);
            if (len + tl <= n + 64) {
                memmove(dst + at + tl, dst + at, len - at);
                memcpy(dst + at, t, tl);
                len += tl;
            }
            break;
        }
        case 3: dst[rng() % 8] = (unsigned char)(rng() & 0xff); break; /* header length */
        default: if (at > 8) len = at; break;                           /* truncate */
        }
    }
    return len;
}

int fuzz_seeded_replay(void);
int fuzz_seeded_replay(void) {
    static const struct {
        const char *header;
        size_t data;
    } seeds[] = {
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
         "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]}}",
         32},
        {"{\"__metadata__\":{\"format\":\"pt\"},\"s\":{\"dtype\":\"F16\",\"shape\":[],"
         "\"data_offsets\":[0,2]},\"e\":{\"dtype\":\"I64\",\"shape\":[0,7],"
         "\"data_offsets\":[2,2]},\"x\":{\"dtype\":\"U8\",\"shape\":[1,1,1,3],"
         "\"data_offsets\":[2,5]}}   ",
         5},
        {"{}", 0},
        {"{\"w\":{\"dtype\":\"F8_E4M3\",\"shape\":[16],\"data_offsets\":[0,16]}}", 16},
    };
    unsigned char src[1024], dst[1024 + 64];
    long runs = 0;
    for (size_t s = 0; s < sizeof seeds / sizeof seeds[0]; s++) {
        size_t n = seed(src, seeds[s].header, seeds[s].data);
        LLVMFuzzerTestOneInput(src, n);
        for (size_t cut = 0; cut < n; cut++, runs++) LLVMFuzzerTestOneInput(src, cut);
        for (int m = 0; m < 25000; m++, runs++) {
            size_t len = mutate(src, n, dst);
            LLVMFuzzerTestOneInput(dst, len);
        }
    }
    printf("fuzz_safetensors: %ld inputs, no crash\n", runs);
    return 0;
}
#endif
