/*
 * tests/tokenizer/tiny.h - hand-made tokenizer.json files for the tokenizer tests, written
 * into a temporary folder: a SentencePiece-style BPE (byte fallback, `▁`) and a byte-level
 * BPE (GPT-2 alphabet), each small enough to reason about by hand.
 */
#ifndef FMOE_TESTS_TOKENIZER_TINY_H
#define FMOE_TESTS_TOKENIZER_TINY_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct sbuf {
    char *p;
    size_t len, cap;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (b->p && (size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        b->cap = (b->cap + (size_t)n + 1) * 2;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
        if (b->len == 0) b->p[0] = '\0';
    }
}

/* A temporary folder for the test's files (removed by tiny_cleanup). */
static char tiny_dir[256];

static const char *tiny_tmpdir(void) {
    if (!tiny_dir[0]) {
        snprintf(tiny_dir, sizeof tiny_dir, "/tmp/fmoe-tok-test-XXXXXX");
        if (!mkdtemp(tiny_dir)) abort();
    }
    return tiny_dir;
}

/* Writes text to <tmpdir>/<name> (name may start with one subfolder, created as needed)
 * and returns the path (from a rotating set of 8 buffers). */
static const char *tiny_write(const char *name, const char *text, size_t len) {
    static char paths[8][512];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, 512, "%s/%s", tiny_tmpdir(), name);
    char *slash = strrchr(p, '/');
    if (slash > p + strlen(tiny_tmpdir())) {
        *slash = '\0';
        mkdir(p, 0700);
        *slash = '/';
    }
    FILE *f = fopen(p, "wb");
    if (!f) abort();
    fwrite(text, 1, len, f);
    fclose(f);
    return p;
}

static void tiny_cleanup(void) {
    if (!tiny_dir[0]) return;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tiny_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tiny_dir);
    tiny_dir[0] = '\0';
}

/*
 * SentencePiece-style (Mixtral-like): ids 0..2 <unk> <s> </s>, 3..258 <0x00>..<0xFF>,
 * then ▁ h e l o w r d and merges building "▁hello" and "▁world". `merges_as_pairs` writes
 * the merges in the [a, b] form instead of "a b". `extra_added` is spliced into
 * added_tokens (starting with a comma), `decoder` replaces the decoder when not NULL.
 */
static char *tiny_sp_json(int merges_as_pairs, const char *extra_added) {
    sbuf b = {0};
    static const char *const chars[] = {"\xE2\x96\x81", "h", "e", "l", "o", "w", "r", "d"};
    static const char *const merges[][2] = {
        {"\xE2\x96\x81", "h"}, {"l", "l"}, {"\xE2\x96\x81h", "e"}, {"ll", "o"},
        {"\xE2\x96\x81he", "llo"}, {"\xE2\x96\x81", "w"}, {"o", "r"}, {"\xE2\x96\x81w", "or"},
        {"l", "d"}, {"\xE2\x96\x81wor", "ld"}};
    sb_printf(&b, "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null,\n"
                  "\"added_tokens\": [\n"
                  " {\"id\": 0, \"content\": \"<unk>\", \"single_word\": false, \"lstrip\": false,"
                  " \"rstrip\": false, \"normalized\": false, \"special\": true},\n"
                  " {\"id\": 1, \"content\": \"<s>\", \"single_word\": false, \"lstrip\": false,"
                  " \"rstrip\": false, \"normalized\": false, \"special\": true},\n"
                  " {\"id\": 2, \"content\": \"</s>\", \"single_word\": false, \"lstrip\": false,"
                  " \"rstrip\": false, \"normalized\": false, \"special\": true}%s],\n",
              extra_added ? extra_added : "");
    sb_printf(&b, "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": ["
                  "{\"type\": \"Prepend\", \"prepend\": \"\xE2\x96\x81\"},"
                  "{\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\xE2\x96\x81\"}]},\n"
                  "\"pre_tokenizer\": null,\n"
                  "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": ["
                  "{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}},"
                  "{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}],"
                  " \"pair\": [], \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [1],"
                  " \"tokens\": [\"<s>\"]}}},\n"
                  "\"decoder\": {\"type\": \"Sequence\", \"decoders\": ["
                  "{\"type\": \"Replace\", \"pattern\": {\"String\": \"\xE2\x96\x81\"}, \"content\": \" \"},"
                  "{\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"},"
                  "{\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]},\n");
    sb_printf(&b, "\"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": \"<unk>\","
                  " \"continuing_subword_prefix\": null, \"end_of_word_suffix\": null,"
                  " \"fuse_unk\": true, \"byte_fallback\": true,\n \"vocab\": {"
                  "\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2");
    for (int i = 0; i < 256; i++) sb_printf(&b, ", \"<0x%02X>\": %d", i, 3 + i);
    int id = 259;
    for (size_t i = 0; i < sizeof chars / sizeof chars[0]; i++)
        sb_printf(&b, ", \"%s\": %d", chars[i], id++);
    for (size_t i = 0; i < sizeof merges / sizeof merges[0]; i++)
        sb_printf(&b, ", \"%s%s\": %d", merges[i][0], merges[i][1], id++);
    sb_printf(&b, "},\n \"merges\": [");
    for (size_t i = 0; i < sizeof merges / sizeof merges[0]; i++) {
        if (merges_as_pairs)
            sb_printf(&b, "%s[\"%s\", \"%s\"]", i ? ", " : "", merges[i][0], merges[i][1]);
        else
            sb_printf(&b, "%s\"%s %s\"", i ? ", " : "", merges[i][0], merges[i][1]);
    }
    sb_printf(&b, "]}}\n");
    return b.p;
}

/* GPT-2's byte alphabet: the code point byte b is written as. */
static unsigned tiny_byte_cp(int b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))
        return (unsigned)b;
    unsigned n = 0;
    for (int x = 0; x < b; x++)
        if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF)))
            n++;
    return 256 + n;
}

static void sb_cp(sbuf *b, unsigned cp) {
    if (cp == '"' || cp == '\\') sb_printf(b, "\\%c", (char)cp);
    else if (cp < 0x80) sb_printf(b, "%c", (char)cp);
    else if (cp < 0x800) sb_printf(b, "%c%c", (char)(0xC0 | (cp >> 6)), (char)(0x80 | (cp & 0x3F)));
    else sb_printf(b, "%c%c%c", (char)(0xE0 | (cp >> 12)), (char)(0x80 | ((cp >> 6) & 0x3F)),
                   (char)(0x80 | (cp & 0x3F)));
}

/*
 * Byte-level (GPT-2 style): ids 0..255 are the bytes (id = byte value), then merges for
 * "hello", " world" (as "Ġworld"), "bc" and "ab" (ids 256..266); the ByteLevel
 * pre-tokenizer with the GPT-2 regex; added tokens <|endoftext|> 267 (special) and <x> 268
 * (not special). `merge_order` 0 or 1
 * picks one of two merge lists that differ only in order (see test merges_order).
 */
static char *tiny_bytelevel_json(int merge_order, const char *pre_tokenizer) {
    sbuf b = {0};
    /* pairs of strings in the byte alphabet (ASCII letters are themselves; Ġ is space) */
    static const char *const m0[][2] = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"},
                                        {"\xC4\xA0", "w"}, {"o", "r"}, {"\xC4\xA0w", "or"},
                                        {"l", "d"}, {"\xC4\xA0wor", "ld"}, {"b", "c"}, {"a", "b"}};
    static const char *const m1[][2] = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"},
                                        {"\xC4\xA0", "w"}, {"o", "r"}, {"\xC4\xA0w", "or"},
                                        {"l", "d"}, {"\xC4\xA0wor", "ld"}, {"a", "b"}, {"b", "c"}};
    const char *const(*m)[2] = merge_order ? m1 : m0;
    size_t nm = sizeof m0 / sizeof m0[0];
    sb_printf(&b, "{\"version\": \"1.0\", \"added_tokens\": ["
                  "{\"id\": 267, \"content\": \"<|endoftext|>\", \"single_word\": false,"
                  " \"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": true},"
                  "{\"id\": 268, \"content\": \"<x>\", \"single_word\": false,"
                  " \"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": false}],\n"
                  "\"normalizer\": null,\n\"pre_tokenizer\": %s,\n"
                  "\"post_processor\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false,"
                  " \"trim_offsets\": false, \"use_regex\": false},\n"
                  "\"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false,"
                  " \"trim_offsets\": false, \"use_regex\": false},\n"
                  "\"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null,"
                  " \"fuse_unk\": false, \"byte_fallback\": false, \"ignore_merges\": false,"
                  " \"vocab\": {",
              pre_tokenizer ? pre_tokenizer
                            : "{\"type\": \"ByteLevel\", \"add_prefix_space\": false,"
                              " \"trim_offsets\": true, \"use_regex\": true}");
    for (int i = 0; i < 256; i++) {
        sb_printf(&b, "%s\"", i ? ", " : "");
        sb_cp(&b, tiny_byte_cp(i));
        sb_printf(&b, "\": %d", i);
    }
    /* merged tokens get ids 256.. in the order of m0 (same set for m1) */
    for (size_t i = 0; i < nm; i++) sb_printf(&b, ", \"%s%s\": %zu", m0[i][0], m0[i][1], 256 + i);
    sb_printf(&b, "},\n \"merges\": [");
    for (size_t i = 0; i < nm; i++) sb_printf(&b, "%s[\"%s\", \"%s\"]", i ? ", " : "", m[i][0], m[i][1]);
    sb_printf(&b, "]}}\n");
    return b.p;
}

#endif
