/*
 * fuzz_tokenizer.c - fuzz target for the tokenizer.json loader and the encoder.
 *
 * Input: the first byte picks what the rest is: even -> a tokenizer.json (loaded; when it
 * loads, a few strings are encoded and decoded with it), odd -> text encoded with the two
 * hand-made tokenizers of tiny.h.
 *
 * With libFuzzer (or simply meson -Dfuzzing=true, tests/fuzz/README.md):
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -DFMOE_LIBFUZZER -Ilib/include -Iruntime/include \
 *     -Itests -Iruntime/tokenizer tests/fuzz/fuzz_tokenizer.c runtime/tokenizer/(star).c \
 *     lib/error.c lib/log.c -lcjson -lpcre2-8 -o fuzz_tokenizer && ./fuzz_tokenizer
 * Without (the `fuzz` suite of meson test): replays the hand-made files, prefixes of them,
 * and seeded byte mutations, plus random text, under the build's sanitizers. Any crash,
 * sanitizer report or broken invariant (a failure without a one-line detail naming the
 * file, a decode that is not valid UTF-8) fails the run.
 */
#include <stdint.h>

#include "fmoe/error.h"
#include "fmoe/tokenizer.h"
#include "harness.h"
#include "tiny.h"
#include "tokenizer_impl.h"

static fmoe_tokenizer *tiny_tok[2];

static void check_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = fmoe__utf8_decode((const unsigned char *)s + i, n - i, &cp);
        if (!k) {
            fprintf(stderr, "fuzz_tokenizer: decode produced invalid UTF-8\n");
            abort();
        }
        i += k;
    }
}

static void exercise(const fmoe_tokenizer *tok, const char *text, size_t len) {
    int32_t *ids;
    size_t n;
    if (fmoe_tokenizer_encode_alloc(tok, text, len, 1, &ids, &n) < 0) {
        fprintf(stderr, "fuzz_tokenizer: encode failed: %s\n", fmoe_error_detail());
        abort();
    }
    char *out;
    size_t olen;
    if (fmoe_tokenizer_decode(tok, ids, n, 0, &out, &olen) < 0) abort();
    check_utf8(out, olen);
    for (size_t i = 0; i < n; i++) {
        const char *piece;
        size_t plen;
        if (fmoe_tokenizer_token_to_piece(tok, ids[i], &piece, &plen) < 0) abort();
    }
    free(out);
    free(ids);
}

static void one_input(const uint8_t *data, size_t size) {
    if (size == 0) return;
    const char *rest = (const char *)data + 1;
    size_t n = size - 1;
    if (data[0] % 2 == 1) {
        for (int i = 0; i < 2; i++) exercise(tiny_tok[i], rest, n);
        return;
    }
    const char *path = tiny_write("fuzz/tokenizer.json", rest, n);
    fmoe_tokenizer *tok = NULL;
    int rc = fmoe_tokenizer_load(path, &tok);
    if (rc < 0) {
        const char *d = fmoe_error_detail();
        if (tok || !d[0] || strchr(d, '\n') || (rc != FMOE_ENOMEM && !strstr(d, "tokenizer.json"))) {
            fprintf(stderr, "fuzz_tokenizer: bad failure (rc %d): %s\n", rc, d);
            abort();
        }
        return;
    }
    static const char *const texts[] = {"hello world", " <s>x</s> ", "\xC3\xA9\xF0\x9F\x98\x80",
                                        ("a\xFF" "b"), "", "1234 abc'll  \n\n"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
        exercise(tok, texts[i], strlen(texts[i]));
    fmoe_tokenizer_free(tok);
}

static void teardown(void) {
    for (int i = 0; i < 2; i++) fmoe_tokenizer_free(tiny_tok[i]);
    tiny_cleanup();
}

static void setup(void) {
    if (tiny_tok[0]) return;
    atexit(teardown);
    char *j[2] = {tiny_sp_json(0, NULL), tiny_bytelevel_json(0, NULL)};
    for (int i = 0; i < 2; i++) {
        const char *p = tiny_write(i ? "b/tokenizer.json" : "a/tokenizer.json", j[i], strlen(j[i]));
        if (fmoe_tokenizer_load(p, &tiny_tok[i]) < 0) {
            fprintf(stderr, "fuzz_tokenizer: %s\n", fmoe_error_detail());
            abort();
        }
        free(j[i]);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    setup();
    one_input(data, size);
    return 0;
}

#ifndef FMOE_LIBFUZZER

static uint64_t rng = 0x2545F4914F6CDD1DULL;
static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* Replays: `json` as is, 64 of its prefixes and `mutations` mutated copies. */
static long replay_json(const char *json, int mutations) {
    size_t n = strlen(json);
    uint8_t *buf = malloc(n + 64);
    long runs = 0;
    buf[0] = 0;
    memcpy(buf + 1, json, n);
    one_input(buf, n + 1), runs++;
    for (int k = 1; k <= 64; k++) one_input(buf, 1 + n * (size_t)k / 65), runs++;
    static const char *const tokens[] = {"null", "[]", "{}", "\"Sequence\"", "1e9", "-1",
                                          "\"\\u0000\"", "\"BPE\"", "\"ByteLevel\"", ",", "\"("};
    for (int m = 0; m < mutations; m++) {
        memcpy(buf + 1, json, n);
        size_t len = n;
        int edits = 1 + (int)(next() % 4);
        for (int e = 0; e < edits; e++) {
            size_t at = (size_t)(next() % len);
            switch (next() % 4) {
            case 0: buf[1 + at] = (uint8_t)next(); break;
            case 1: buf[1 + at] ^= (uint8_t)(1u << (next() % 8)); break;
            case 2: { /* delete a run */
                size_t k = 1 + (size_t)(next() % 16);
                if (at + k > len) k = len - at;
                memmove(buf + 1 + at, buf + 1 + at + k, len - at - k);
                len -= k;
                break;
            }
            default: { /* overwrite with a JSON fragment */
                const char *t = tokens[next() % (sizeof tokens / sizeof tokens[0])];
                size_t k = strlen(t);
                if (at + k <= len) memcpy(buf + 1 + at, t, k);
            }
            }
            if (len == 0) break;
        }
        one_input(buf, len + 1), runs++;
    }
    free(buf);
    return runs;
}

int fuzz_seeded_replay(void);
int fuzz_seeded_replay(void) {
    setup();
    long runs = 0;
    char *sp = tiny_sp_json(0, NULL), *sp2 = tiny_sp_json(1, NULL),
         *bl = tiny_bytelevel_json(0, NULL);
    runs += replay_json(sp, 600);
    runs += replay_json(sp2, 300);
    runs += replay_json(bl, 600);
    free(sp);
    free(sp2);
    free(bl);
    /* random text through both tiny tokenizers */
    static const char alpha[] = "ab lo<s>\n\xC3\xA9";
    for (int i = 0; i < 3000; i++) {
        uint8_t buf[200];
        size_t n = 1 + (size_t)(next() % 199);
        buf[0] = 1;
        for (size_t k = 1; k < n; k++) {
            uint64_t r = next();
            buf[k] = r % 3 ? (uint8_t)alpha[r % (sizeof alpha - 1)] : (uint8_t)(r >> 8);
        }
        one_input(buf, n), runs++;
    }
    printf("fuzz_tokenizer: %ld inputs, no failure\n", runs);
    return 0;
}
#endif
