/*
 * test_tokenizer.c - unit tests of runtime/tokenizer on hand-made tokenizer.json files
 * (tiny.h) and on the real Mixtral fixture: merge order, both merge formats, byte fallback,
 * unk fusing, added tokens and their flags, the decoders, NFC, chat templates, malformed
 * and unsupported files (one-line errors naming file and field), random bytes as input,
 * and concurrent encoding from several threads.
 */
#include <pthread.h>
#include <stdint.h>

#include "fmoe/error.h"
#include "fmoe/tokenizer.h"
#include "harness.h"
#include "tiny.h"
#include "tokenizer_impl.h" /* fmoe__unicode_normalize */

/* ---- helpers ------------------------------------------------------------------------------ */

static fmoe_tokenizer *load_text_n(const char *json, size_t n) {
    const char *path = tiny_write("tokenizer.json", json, n);
    fmoe_tokenizer *tok = NULL;
    if (fmoe_tokenizer_load(path, &tok) < 0) {
        fprintf(stderr, "  load failed: %s\n", fmoe_error_detail());
        return NULL;
    }
    return tok;
}

static fmoe_tokenizer *load_text(const char *json) { return load_text_n(json, strlen(json)); }

/* Encodes s and compares with the expected ids; returns 1 when equal. */
static int encodes_to(const fmoe_tokenizer *tok, const char *s, size_t len, int add_special,
                      const int32_t *want, size_t n_want) {
    int32_t *ids;
    size_t n;
    if (fmoe_tokenizer_encode_alloc(tok, s, len, add_special, &ids, &n) < 0) {
        fprintf(stderr, "  encode failed: %s\n", fmoe_error_detail());
        return 0;
    }
    int ok = n == n_want && (n == 0 || memcmp(ids, want, n * sizeof *ids) == 0);
    if (!ok) {
        fprintf(stderr, "  encode(\"%.*s\") = [", (int)len, s);
        for (size_t i = 0; i < n; i++) fprintf(stderr, "%s%d", i ? ", " : "", ids[i]);
        fprintf(stderr, "], want [");
        for (size_t i = 0; i < n_want; i++) fprintf(stderr, "%s%d", i ? ", " : "", want[i]);
        fprintf(stderr, "]\n");
    }
    free(ids);
    return ok;
}

#define ENCODES(tok, s, special, ...)                                                   \
    do {                                                                                \
        static const int32_t want_[] = {__VA_ARGS__};                                   \
        ASSERT_TRUE(encodes_to(tok, s, strlen(s), special, want_,                       \
                               sizeof want_ / sizeof want_[0]));                        \
    } while (0)

/* decode(ids) as a NUL-terminated malloc'd string. */
static char *decode(const fmoe_tokenizer *tok, const int32_t *ids, size_t n, int skip) {
    char *text = NULL;
    size_t len;
    if (fmoe_tokenizer_decode(tok, ids, n, skip, &text, &len) < 0) return NULL;
    return text;
}

static char *round_trip(const fmoe_tokenizer *tok, const char *s) {
    int32_t *ids;
    size_t n;
    if (fmoe_tokenizer_encode_alloc(tok, s, strlen(s), 0, &ids, &n) < 0) return NULL;
    char *t = decode(tok, ids, n, 0);
    free(ids);
    return t;
}

/* ---- SentencePiece-style ---------------------------------------------------------------------- */

/* ids in tiny_sp_json: 259 ▁, 260 h, 261 e, 262 l, 263 o, 264 w, 265 r, 266 d, then merges
 * 267 ▁h, 268 ll, 269 ▁he, 270 llo, 271 ▁hello, 272 ▁w, 273 or, 274 ▁wor, 275 ld, 276 ▁world */
TEST(sp_merges_and_bos) {
    char *json = tiny_sp_json(0, NULL);
    fmoe_tokenizer *tok = load_text(json);
    free(json);
    ASSERT_TRUE(tok);
    ENCODES(tok, "hello world", 1, 1, 271, 276);
    ENCODES(tok, "hello world", 0, 271, 276);
    ENCODES(tok, "hello", 0, 271);
    ENCODES(tok, "hell", 0, 269, 268);   /* ▁he + ll: "▁he ll" is no merge */
    ENCODES(tok, " hello", 0, 259, 271); /* Prepend then Replace: ▁▁hello */
    ENCODES(tok, "", 1, 1);
    ASSERT_EQ(fmoe_tokenizer_encode(tok, "", 0, 0, NULL, 0), 0);
    ASSERT_EQ(fmoe_tokenizer_bos_id(tok), 1);
    ASSERT_EQ(fmoe_tokenizer_eos_id(tok), 2);
    ASSERT_EQ(fmoe_tokenizer_vocab_size(tok), 277);
    ASSERT_STR_EQ(fmoe_tokenizer_id_to_token(tok, 271), "\xE2\x96\x81hello");
    ASSERT_EQ(fmoe_tokenizer_token_to_id(tok, "\xE2\x96\x81world"), 276);
    ASSERT_EQ(fmoe_tokenizer_token_to_id(tok, "nope"), -1);
    ASSERT_TRUE(fmoe_tokenizer_id_to_token(tok, 277) == NULL);
    const char *piece;
    size_t plen;
    ASSERT_OK(fmoe_tokenizer_token_to_piece(tok, 271, &piece, &plen));
    ASSERT_EQ(plen, 6);
    ASSERT_TRUE(memcmp(piece, " hello", 6) == 0);
    ASSERT_OK(fmoe_tokenizer_token_to_piece(tok, 3 + 0x41, &piece, &plen)); /* <0x41> */
    ASSERT_TRUE(plen == 1 && piece[0] == 'A');
    ASSERT_EQ(fmoe_tokenizer_token_to_piece(tok, 9999, &piece, &plen), FMOE_ERANGE);
    fmoe_tokenizer_free(tok);
}

TEST(sp_merge_formats_agree) {
    char *a = tiny_sp_json(0, NULL), *b = tiny_sp_json(1, NULL);
    fmoe_tokenizer *ta = load_text(a), *tb = load_text(b);
    free(a);
    free(b);
    ASSERT_TRUE(ta && tb);
    static const char *const texts[] = {"hello world", "world hello", "hellohello", "ldor", " "};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        int32_t *x, *y;
        size_t nx, ny;
        ASSERT_OK(fmoe_tokenizer_encode_alloc(ta, texts[i], strlen(texts[i]), 1, &x, &nx));
        ASSERT_OK(fmoe_tokenizer_encode_alloc(tb, texts[i], strlen(texts[i]), 1, &y, &ny));
        ASSERT_EQ(nx, ny);
        ASSERT_TRUE(memcmp(x, y, nx * sizeof *x) == 0);
        free(x);
        free(y);
    }
    fmoe_tokenizer_free(ta);
    fmoe_tokenizer_free(tb);
}

TEST(sp_byte_fallback) {
    char *json = tiny_sp_json(0, NULL);
    fmoe_tokenizer *tok = load_text(json);
    free(json);
    ASSERT_TRUE(tok);
    /* é = C3 A9 is not in the vocabulary: its bytes; then ▁hello */
    ENCODES(tok, "\xC3\xA9 hello", 0, 259, 3 + 0xC3, 3 + 0xA9, 271);
    char *t = round_trip(tok, "\xC3\xA9 hello w\xE2\x82\xAC");
    ASSERT_STR_EQ(t, "\xC3\xA9 hello w\xE2\x82\xAC");
    free(t);
    /* a lone continuation byte decodes to U+FFFD, one per byte */
    int32_t ids[] = {3 + 0xA9, 3 + 0xA9, 271};
    t = decode(tok, ids, 3, 0);
    ASSERT_STR_EQ(t, "\xEF\xBF\xBD\xEF\xBF\xBD hello");
    free(t);
    /* special tokens: kept or skipped; the decoder strips one leading space */
    int32_t ids2[] = {1, 271, 276, 2};
    t = decode(tok, ids2, 4, 0);
    ASSERT_STR_EQ(t, "<s> hello world</s>");
    free(t);
    t = decode(tok, ids2, 4, 1);
    ASSERT_STR_EQ(t, "hello world");
    free(t);
    /* ids outside the vocabulary are skipped */
    int32_t ids3[] = {271, -5, 100000, 276};
    t = decode(tok, ids3, 4, 0);
    ASSERT_STR_EQ(t, "hello world");
    free(t);
    fmoe_tokenizer_free(tok);
}

TEST(sp_unk_fused_without_byte_fallback) {
    char *json = tiny_sp_json(0, NULL);
    /* switch byte fallback off: unknown characters become one fused <unk> */
    char *p = strstr(json, "\"byte_fallback\": true");
    ASSERT_TRUE(p);
    memcpy(p, "\"byte_fallback\":false", 21);
    fmoe_tokenizer *tok = load_text(json);
    free(json);
    ASSERT_TRUE(tok);
    ENCODES(tok, "\xC3\xA9\xC3\xA9 hello", 0, 259, 0, 271);
    fmoe_tokenizer_free(tok);
}

TEST(sp_added_tokens) {
    const char *extra =
        ", {\"id\": 277, \"content\": \"<tool>\", \"single_word\": false, \"lstrip\": true,"
        " \"rstrip\": true, \"normalized\": false, \"special\": true}"
        ", {\"id\": 278, \"content\": \"<to\", \"single_word\": false, \"lstrip\": false,"
        " \"rstrip\": false, \"normalized\": false, \"special\": false}"
        ", {\"id\": 279, \"content\": \"wor\", \"single_word\": true, \"lstrip\": false,"
        " \"rstrip\": false, \"normalized\": false, \"special\": false}";
    char *json = tiny_sp_json(0, extra);
    fmoe_tokenizer *tok = load_text(json);
    free(json);
    ASSERT_TRUE(tok);
    ASSERT_EQ(fmoe_tokenizer_vocab_size(tok), 280);
    /* <s> in the text is the special token; each text piece gets its own ▁ prefix */
    ENCODES(tok, "hello<s>world", 0, 271, 1, 276);
    /* the longest match wins (<tool> over <to); lstrip/rstrip take the spaces */
    ENCODES(tok, "hello  <tool>  world", 0, 271, 277, 276);
    ENCODES(tok, "<to", 0, 278);
    /* single_word: "wor" alone is the added token, inside "world" it is not */
    ENCODES(tok, "wor", 0, 279);
    ENCODES(tok, "world", 0, 276);
    ASSERT_TRUE(fmoe_tokenizer_is_special(tok, 277));
    ASSERT_TRUE(!fmoe_tokenizer_is_special(tok, 278));
    int32_t ids[] = {271, 277, 278, 276};
    char *t = decode(tok, ids, 4, 1);
    ASSERT_STR_EQ(t, "hello<to world");
    free(t);
    fmoe_tokenizer_free(tok);
}

/* ---- byte-level ---------------------------------------------------------------------------------- */

TEST(bytelevel_merges_order) {
    char *j0 = tiny_bytelevel_json(0, NULL), *j1 = tiny_bytelevel_json(1, NULL);
    fmoe_tokenizer *t0 = load_text(j0), *t1 = load_text(j1);
    free(j0);
    free(j1);
    ASSERT_TRUE(t0 && t1);
    /* "b c" ranked before "a b" gives a + bc; the other order ab + c */
    ENCODES(t0, "abc", 0, 'a', 265);
    ENCODES(t1, "abc", 0, 266, 'c');
    ENCODES(t0, "hello world", 0, 259, 264);
    ENCODES(t0, "hello<|endoftext|><x>", 1, 259, 267, 268);
    ENCODES(t0, "hello  world", 0, 259, ' ', 264);
    fmoe_tokenizer_free(t0);
    fmoe_tokenizer_free(t1);
}

TEST(bytelevel_pieces_and_decode) {
    char *json = tiny_bytelevel_json(0, NULL);
    fmoe_tokenizer *tok = load_text(json);
    free(json);
    ASSERT_TRUE(tok);
    char *t = round_trip(tok, "hello world \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80!\n\t<x>");
    ASSERT_STR_EQ(t, "hello world \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80!\n\t<x>");
    free(t);
    int32_t ids[] = {259, 267, 268, 264};
    t = decode(tok, ids, 4, 1);
    ASSERT_STR_EQ(t, "hello<x> world");
    free(t);
    /* half a character: U+FFFD, as from_utf8_lossy */
    int32_t half[] = {0xE4, 0xB8, 'a'};
    t = decode(tok, half, 3, 0);
    ASSERT_STR_EQ(t, "\xEF\xBF\xBD" "a");
    free(t);
    const char *piece;
    size_t plen;
    ASSERT_OK(fmoe_tokenizer_token_to_piece(tok, 264, &piece, &plen));
    ASSERT_TRUE(plen == 6 && memcmp(piece, " world", 6) == 0);
    ASSERT_OK(fmoe_tokenizer_token_to_piece(tok, 0xE4, &piece, &plen));
    ASSERT_TRUE(plen == 1 && (unsigned char)piece[0] == 0xE4);
    ASSERT_EQ(fmoe_tokenizer_bos_id(tok), -1);
    ASSERT_EQ(fmoe_tokenizer_eos_id(tok), 267);
    fmoe_tokenizer_free(tok);
}

/* Random bytes, valid or not: never a crash; byte-level keeps every byte (the pieces of the
 * ids concatenate to the input). */
TEST(bytelevel_random_bytes_round_trip) {
    char *json = tiny_bytelevel_json(0, NULL);
    fmoe_tokenizer *tok = load_text(json);
    free(json);
    ASSERT_TRUE(tok);
    uint64_t x = 88172645463325252ULL;
    for (int iter = 0; iter < 2000; iter++) {
        char buf[96];
        size_t n = (size_t)(iter % 96);
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            /* mostly ASCII with some high bytes, or fully random */
            buf[i] = (char)(iter % 3 ? (x % 5 ? 'a' + x % 26 : (int)(x >> 8) & 0xFF) : (x >> 8) & 0xFF);
        }
        int32_t *ids;
        size_t nids;
        ASSERT_OK(fmoe_tokenizer_encode_alloc(tok, buf, n, 1, &ids, &nids));
        char back[512];
        size_t k = 0;
        for (size_t i = 0; i < nids; i++) {
            const char *piece;
            size_t plen;
            ASSERT_OK(fmoe_tokenizer_token_to_piece(tok, ids[i], &piece, &plen));
            ASSERT_TRUE(k + plen <= sizeof back);
            memcpy(back + k, piece, plen);
            k += plen;
        }
        ASSERT_EQ(k, n);
        ASSERT_TRUE(memcmp(back, buf, n) == 0);
        char *t = decode(tok, ids, nids, 0); /* valid UTF-8 always */
        ASSERT_TRUE(t);
        free(t);
        free(ids);
    }
    fmoe_tokenizer_free(tok);
}

TEST(bytelevel_prefix_space_and_split) {
    /* add_prefix_space puts Ġ before the text; a Split with Removed drops the digits */
    const char *pre = "{\"type\": \"Sequence\", \"pretokenizers\": ["
                      "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\d+\"},"
                      " \"behavior\": \"Removed\", \"invert\": false},"
                      "{\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true,"
                      " \"use_regex\": true}]}";
    char *json = tiny_bytelevel_json(0, pre);
    fmoe_tokenizer *tok = load_text(json);
    free(json);
    ASSERT_TRUE(tok);
    ENCODES(tok, "world", 0, 264);
    ENCODES(tok, "wor123ld", 0, 262, ' ', 263); /* Ġwor + Ġ ld: both pieces get Ġ */
    fmoe_tokenizer_free(tok);
}

/* ---- errors --------------------------------------------------------------------------------------- */

/* Loads json and expects `code` with a detail containing each of the needles. */
static int load_fails(const char *json, int code, const char *n1, const char *n2) {
    const char *path = tiny_write("bad.json", json, strlen(json));
    fmoe_tokenizer *tok = NULL;
    int rc = fmoe_tokenizer_load(path, &tok);
    const char *d = fmoe_error_detail();
    int ok = rc == code && tok == NULL && strstr(d, "bad.json") && (!n1 || strstr(d, n1)) &&
             (!n2 || strstr(d, n2)) && !strchr(d, '\n');
    if (!ok) fprintf(stderr, "  rc %d (want %d), detail: %s\n", rc, code, d);
    fmoe_tokenizer_free(tok);
    return ok;
}

static char *replace_once(const char *s, const char *from, const char *to) {
    const char *p = strstr(s, from);
    if (!p) return NULL;
    size_t a = (size_t)(p - s), fl = strlen(from), tl = strlen(to), n = strlen(s);
    char *out = malloc(n - fl + tl + 1);
    memcpy(out, s, a);
    memcpy(out + a, to, tl);
    memcpy(out + a + tl, p + fl, n - a - fl + 1);
    return out;
}

TEST(errors_malformed_json) {
    char *json = tiny_sp_json(0, NULL);
    json[strlen(json) / 2] = '\0'; /* truncated */
    ASSERT_TRUE(load_fails(json, FMOE_EFORMAT, "invalid JSON at line", NULL));
    free(json);
    ASSERT_TRUE(load_fails("[1, 2]", FMOE_EFORMAT, "top level", NULL));
    ASSERT_TRUE(load_fails("{}", FMOE_EFORMAT, "model", NULL));
    ASSERT_TRUE(load_fails("", FMOE_EFORMAT, "invalid JSON", NULL));
    ASSERT_TRUE(load_fails("{\"model\": \"\xC3\x28\"}", FMOE_EFORMAT, "not valid UTF-8 at byte 11", NULL));
    /* a string quoted from the file cannot break the one-line message */
    ASSERT_TRUE(load_fails("{\"model\": {\"type\": \"Uni\ngram\"}}", FMOE_EUNSUPPORTED, "\"Uni gram\"", NULL));
}

/* One JSON value and whitespace, nothing more: bytes after it are refused at their byte
 * (they were ignored). A file of 16 MiB or more has its end checked before it is read: a
 * sparse 64 MiB of NUL bytes after the object is refused naming its last byte. */
TEST(errors_bytes_after_the_json_value) {
    char *json = tiny_sp_json(0, NULL);
    const size_t n = strlen(json);
    char *more = malloc(n + 64);
    ASSERT_TRUE(more);
    char want[96];
    static const char *const tails[] = {" x", "\n{}", "\0", "}"};
    for (size_t t = 0; t < sizeof tails / sizeof tails[0]; t++) {
        const size_t k = t == 2 ? 1 : strlen(tails[t]);
        memcpy(more, json, n);
        memcpy(more + n, tails[t], k);
        const size_t at = n + (tails[t][0] == ' ' || tails[t][0] == '\n');
        snprintf(want, sizeof want, "bytes after the JSON value, from byte %zu", at);
        const char *path = tiny_write("bad.json", more, n + k);
        fmoe_tokenizer *tok = NULL;
        ASSERT_EQ(fmoe_tokenizer_load(path, &tok), FMOE_EFORMAT);
        ASSERT_CONTAINS(fmoe_error_detail(), "bad.json: ");
        ASSERT_CONTAINS(fmoe_error_detail(), want);
        ASSERT_TRUE(strchr(fmoe_error_detail(), '\n') == NULL);
    }
    /* whitespace after it is JSON */
    memcpy(more, json, n);
    memcpy(more + n, " \r\n\t\n", 5);
    fmoe_tokenizer *tok = load_text_n(more, n + 5);
    ASSERT_TRUE(tok != NULL);
    fmoe_tokenizer_free(tok);
    /* 64 MiB of NUL bytes (a sparse file): refused by its last byte, before it is read */
    const char *path = tiny_write("big.json", json, n);
    ASSERT_EQ(truncate(path, (off_t)n + (64 << 20)), 0);
    ASSERT_EQ(fmoe_tokenizer_load(path, &tok), FMOE_EFORMAT);
    snprintf(want, sizeof want, "byte %lld of %lld, is 0x00, not the '}'",
             (long long)n + (64 << 20) - 1, (long long)n + (64 << 20));
    ASSERT_CONTAINS(fmoe_error_detail(), want);
    ASSERT_CONTAINS(fmoe_error_detail(), "big.json: ");
    unlink(path);
    free(more);
    free(json);
}

TEST(errors_bad_fields) {
    char *json = tiny_sp_json(0, NULL);
    struct {
        const char *from, *to, *n1, *n2;
    } cases[] = {
        {"\"vocab\": {", "\"vocab\": [], \"x\": {", "model.vocab", "expected an object"},
        {"\"<s>\": 1,", "\"<s>\": -1,", "model.vocab[\"<s>\"]", "integer"},
        {"\"<s>\": 1,", "\"<s>\": 1.5,", "model.vocab[\"<s>\"]", "integer"},
        {"\"merges\": [", "\"merges\": [\"a b c\", ", "model.merges[0]", "two tokens"},
        {"\"merges\": [", "\"merges\": [\"zz yy\", ", "model.merges[0]", "\"zz\" is not in model.vocab"},
        {"\"merges\": [", "\"merges\": [7, ", "model.merges[0]", NULL},
        {"\"content\": \"<unk>\"", "\"content\": 5", "added_tokens[0]", "\"content\" must be a string"},
        {"\"lstrip\": false", "\"lstrip\": \"no\"", "added_tokens[0]", "\"lstrip\" must be a boolean"},
        {"\"start\": 1", "\"start\": \"one\"", "decoder.decoders[3].start", NULL},
        {"{\"type\": \"Prepend\", \"prepend\": \"\xE2\x96\x81\"}", "{\"type\": \"Prepend\"}",
         "normalizer.normalizers[0]", "\"prepend\" is missing"},
        {"\"ids\": [1]", "\"ids\": [\"x\"]", "post_processor.single[0]", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *bad = replace_once(json, cases[i].from, cases[i].to);
        ASSERT_TRUE(bad);
        ASSERT_TRUE(load_fails(bad, FMOE_EFORMAT, cases[i].n1, cases[i].n2));
        free(bad);
    }
    free(json);
}

TEST(errors_unsupported_types) {
    char *json = tiny_sp_json(0, NULL);
    struct {
        const char *from, *to, *n1;
    } cases[] = {
        {"\"type\": \"BPE\"", "\"type\": \"Unigram\"", "model type \"Unigram\""},
        {"\"type\": \"BPE\"", "\"type\": \"WordPiece\"", "model type \"WordPiece\""},
        {"\"type\": \"Prepend\"", "\"type\": \"NFKC\"", "normalizer type \"NFKC\""},
        {"\"pre_tokenizer\": null", "\"pre_tokenizer\": {\"type\": \"Whitespace\"}",
         "pre-tokenizer type \"Whitespace\""},
        {"\"type\": \"Fuse\"", "\"type\": \"WordPiece\"", "decoder type \"WordPiece\""},
        {"\"type\": \"TemplateProcessing\"", "\"type\": \"Mystery\"",
         "post-processor type \"Mystery\""},
        {"\"dropout\": null", "\"dropout\": 0.1", "dropout"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *bad = replace_once(json, cases[i].from, cases[i].to);
        ASSERT_TRUE(bad);
        ASSERT_TRUE(load_fails(bad, FMOE_EUNSUPPORTED, cases[i].n1, NULL));
        free(bad);
    }
    free(json);
    fmoe_tokenizer *tok = NULL;
    ASSERT_EQ(fmoe_tokenizer_load("/nonexistent/tokenizer.json", &tok), FMOE_EIO);
    ASSERT_CONTAINS(fmoe_error_detail(), "/nonexistent/tokenizer.json");
    const char *other = tiny_write("empty/README", "x", 1); /* a folder without one */
    char dir[512];
    snprintf(dir, sizeof dir, "%s", other);
    *strrchr(dir, '/') = '\0';
    ASSERT_EQ(fmoe_tokenizer_load(dir, &tok), FMOE_EIO);
    ASSERT_CONTAINS(fmoe_error_detail(), "tokenizer.json");
    fmoe_tokenizer_free(NULL);
}

/* ---- unicode ----------------------------------------------------------------------------------------- */

static char *nf(const char *s, int compose) {
    tok_buf b = {0};
    if (fmoe__unicode_normalize(s, strlen(s), compose, &b) < 0) return NULL;
    return b.p;
}

TEST(unicode_nfc_nfd) {
    struct {
        const char *in, *nfc, *nfd;
    } cases[] = {
        {"abc", "abc", "abc"},
        {"e\xCC\x81", "\xC3\xA9", "e\xCC\x81"},                     /* e + acute */
        {"\xC3\xA9", "\xC3\xA9", "e\xCC\x81"},
        {"\xE1\xB8\x8B\xCC\xA3", "\xE1\xB8\x8D\xCC\x87", "d\xCC\xA3\xCC\x87"}, /* reorder */
        {"\xE2\x84\xAB", "\xC3\x85", "A\xCC\x8A"},                  /* Angstrom sign */
        {"\xEA\xB0\x81", "\xEA\xB0\x81", "\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"}, /* Hangul */
        {"\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8", "\xEA\xB0\x81", "\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"},
        {"\xEF\xAC\x81", "\xEF\xAC\x81", "\xEF\xAC\x81"},           /* fi ligature: compat only */
        {"a\xCC\x80\xCC\x81", "\xC3\xA0\xCC\x81", "a\xCC\x80\xCC\x81"}, /* blocked second mark */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *c = nf(cases[i].in, 1), *d = nf(cases[i].in, 0);
        ASSERT_STR_EQ(c, cases[i].nfc);
        ASSERT_STR_EQ(d, cases[i].nfd);
        free(c);
        free(d);
    }
}

TEST(unicode_utf8) {
    uint32_t cp;
    ASSERT_EQ(fmoe__utf8_decode((const unsigned char *)"\xF0\x9F\x98\x80", 4, &cp), 4);
    ASSERT_EQ(cp, 0x1F600);
    ASSERT_EQ(fmoe__utf8_decode((const unsigned char *)"\xED\xA0\x80", 3, &cp), 0); /* surrogate */
    ASSERT_EQ(fmoe__utf8_decode((const unsigned char *)"\xC0\xAF", 2, &cp), 0);     /* overlong */
    ASSERT_EQ(fmoe__utf8_decode((const unsigned char *)"\xF4\x90\x80\x80", 4, &cp), 0);
    ASSERT_EQ(fmoe__utf8_invalid_len((const unsigned char *)"\xE2\x82" "a", 3), 2);
    ASSERT_EQ(fmoe__utf8_invalid_len((const unsigned char *)"\xED\xA0\x80", 3), 1);
    tok_buf b = {0};
    ASSERT_OK(fmoe__utf8_lossy("a\xE2\x82" "b\xFF", 5, &b));
    ASSERT_STR_EQ(b.p, "a\xEF\xBF\xBD" "b\xEF\xBF\xBD");
    fmoe__tok_buf_free(&b);
}

/* ---- chat templates ---------------------------------------------------------------------------------- */

static const char *write_config(const char *template_json) {
    char cfg[4096];
    snprintf(cfg, sizeof cfg,
             "{\"bos_token\": \"<s>\", \"eos_token\": {\"content\": \"</s>\"}, \"chat_template\": %s}",
             template_json);
    return tiny_write("chat/tokenizer_config.json", cfg, strlen(cfg));
}

static char *render(const fmoe_tokenizer *tok, const char *name, const fmoe_chat_message *m,
                    size_t n, int gen, int no_think) {
    fmoe_chat_options o = {.template_name = name, .add_generation_prompt = gen,
                           .disable_thinking = no_think};
    char *text = NULL;
    size_t len;
    int rc = fmoe_tokenizer_apply_chat_template(tok, m, n, &o, &text, &len);
    if (rc < 0) fprintf(stderr, "  render: %s\n", fmoe_error_detail());
    return text;
}

#define MSG(r, c) {.role = (r), .content = (c)}

TEST(chat_templates) {
    char *json = tiny_sp_json(0, NULL);
    const char *tpath = tiny_write("chat/tokenizer.json", json, strlen(json));
    free(json);
    char dir[512];
    snprintf(dir, sizeof dir, "%s", tpath);
    *strrchr(dir, '/') = '\0';
    write_config("\"{{ bos_token }}{% for message in messages %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% endfor %}\"");
    fmoe_tokenizer *tok = NULL;
    ASSERT_OK(fmoe_tokenizer_load(dir, &tok));
    ASSERT_STR_EQ(fmoe_tokenizer_chat_template(tok), "mixtral");
    fmoe_chat_message conv[] = {MSG("system", "Be brief."), MSG("user", "Hi"),
                                MSG("assistant", "Hello."), MSG("user", "Bye")};
    /* the template as written (what transformers renders), then the fixed renderer */
    char *t = render(tok, NULL, conv, 4, 1, 0);
    ASSERT_STR_EQ(t, "<s>[INST] Be brief. [/INST][INST] Hi [/INST][INST] Hello. [/INST]"
                     "[INST] Bye [/INST]");
    free(t);
    t = render(tok, "jinja", conv, 1, 1, 0);
    ASSERT_STR_EQ(t, "<s>[INST] Be brief. [/INST]");
    free(t);
    t = render(tok, "mixtral", conv, 4, 1, 0);
    ASSERT_STR_EQ(t, "<s>[INST] Be brief.\n\nHi [/INST]Hello.</s>[INST] Bye [/INST]");
    free(t);
    fmoe_chat_message bad[] = {MSG("user", "a"), MSG("user", "b")};
    fmoe_chat_options o = {.template_name = "mixtral", .add_generation_prompt = 1};
    size_t len;
    ASSERT_EQ(fmoe_tokenizer_apply_chat_template(tok, bad, 2, &o, &t, &len), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "alternate");
    o.template_name = "nonesuch";
    ASSERT_EQ(fmoe_tokenizer_apply_chat_template(tok, conv, 4, &o, &t, &len), FMOE_EINVAL);

    /* chatml with no default system prompt, and with the Qwen2 one */
    t = render(tok, "chatml", conv + 1, 3, 1, 0);
    ASSERT_STR_EQ(t, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n"
                     "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
    free(t);
    /* qwen3: thinking of earlier turns dropped, kept after the last user message */
    fmoe_chat_message q[] = {MSG("user", "Q1"), MSG("assistant", "<think>\nr1\n</think>\n\nA1"),
                             MSG("user", "Q2"), MSG("assistant", "<think>r2</think>A2")};
    t = render(tok, "qwen3", q, 4, 0, 0);
    ASSERT_STR_EQ(t, "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
                     "<|im_start|>user\nQ2<|im_end|>\n"
                     "<|im_start|>assistant\n<think>\nr2\n</think>\n\nA2<|im_end|>\n");
    free(t);
    t = render(tok, "qwen3", q, 1, 1, 1);
    ASSERT_STR_EQ(t, "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    free(t);
    fmoe_chat_message tool[] = {MSG("user", "Q"), MSG("assistant", "call"), MSG("tool", "r1"),
                                MSG("tool", "r2")};
    t = render(tok, "qwen3", tool, 4, 0, 0);
    ASSERT_STR_EQ(t, "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\ncall<|im_end|>\n<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n"
                     "<tool_response>\nr2\n</tool_response><|im_end|>\n");
    free(t);
    /* olmoe (Tulu): the template here has no bos_token, so none is written */
    t = render(tok, "olmoe", conv, 3, 1, 0);
    ASSERT_STR_EQ(t, "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\nHello.</s><|assistant|>\n");
    free(t);
    fmoe_tokenizer_free(tok);

    /* detection of chatml with a default system message; rendered as written, so with no
     * generation prompt: this template has none */
    write_config("\"{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                 "{{ '<|im_start|>system\\\\nYou are a helpful assistant.<|im_end|>\\\\n' }}{% endif %}"
                 "{{'<|im_start|>' + message['role'] + '\\\\n' + message['content'] + '<|im_end|>' + '\\\\n'}}"
                 "{% endfor %}\"");
    ASSERT_OK(fmoe_tokenizer_load(dir, &tok));
    ASSERT_STR_EQ(fmoe_tokenizer_chat_template(tok), "chatml");
    t = render(tok, NULL, conv + 1, 1, 1, 0);
    ASSERT_STR_EQ(t, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                     "<|im_start|>user\nHi<|im_end|>\n");
    free(t);
    t = render(tok, "chatml", conv + 1, 1, 1, 0);
    ASSERT_STR_EQ(t, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                     "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    free(t);
    fmoe_tokenizer_free(tok);

    /* olmoe detected, with BOS */
    write_config("\"{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
                 "{{ '<|user|>\\\\n' + message['content'] + '\\\\n' }}{% elif message['role'] == 'assistant' %}"
                 "{{ '<|assistant|>\\\\n'  + message['content'] + eos_token }}{% endif %}{% endfor %}\"");
    ASSERT_OK(fmoe_tokenizer_load(dir, &tok));
    ASSERT_STR_EQ(fmoe_tokenizer_chat_template(tok), "olmoe");
    t = render(tok, NULL, conv + 1, 3, 1, 0);
    ASSERT_STR_EQ(t, "<s><|user|>\nHi\n<|assistant|>\nHello.</s><|user|>\nBye\n");
    free(t);
    t = render(tok, "olmoe", conv + 1, 3, 1, 0);
    ASSERT_STR_EQ(t, "<s><|user|>\nHi\n<|assistant|>\nHello.</s>\n<|user|>\nBye\n<|assistant|>\n");
    free(t);
    fmoe_tokenizer_free(tok);

    /* a template the interpreter refuses: the family's fixed renderer, unless "jinja" */
    write_config("\"{% include 'x.jinja' %}{% for m in messages %}[INST] {{ m.content }}{% endfor %}\"");
    ASSERT_OK(fmoe_tokenizer_load(dir, &tok));
    ASSERT_STR_EQ(fmoe_tokenizer_chat_template(tok), "mixtral");
    t = render(tok, NULL, conv + 1, 1, 1, 0);
    ASSERT_STR_EQ(t, "<s>[INST] Hi [/INST]");
    free(t);
    o.template_name = "jinja";
    ASSERT_EQ(fmoe_tokenizer_apply_chat_template(tok, conv, 1, &o, &t, &len), FMOE_EUNSUPPORTED);
    ASSERT_CONTAINS(fmoe_error_detail(), "line 1: '{% include %}' is not supported");
    fmoe_tokenizer_free(tok);

    /* an unknown family now chats; message fields, tools and keyword arguments reach it */
    write_config("[{\"name\": \"default\", \"template\": \"{% for m in messages %}<{{ m.role }}>"
                 "{{ m.content }}{% if m.tool_calls %}{{ m.tool_calls|tojson }}{% endif %}"
                 "{% endfor %}{% if add_generation_prompt %}<bot>{% endif %}"
                 "{% if enable_thinking is false %}/no_think{% endif %}{{ greeting }}\"},"
                 " {\"name\": \"tool_use\", \"template\": \"tools={{ tools|length }}\"}]");
    ASSERT_OK(fmoe_tokenizer_load(dir, &tok));
    ASSERT_TRUE(fmoe_tokenizer_chat_template(tok) == NULL);
    fmoe_chat_message calls[] = {
        MSG("user", "Hi"),
        {.role = "assistant", .content = NULL,
         .fields_json = "{\"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]}"}};
    fmoe_chat_options ko = {.add_generation_prompt = 1, .disable_thinking = 1,
                            .kwargs_json = "{\"greeting\": \"!\"}"};
    ASSERT_OK(fmoe_tokenizer_apply_chat_template(tok, calls, 2, &ko, &t, &len));
    ASSERT_STR_EQ(t, "<user>Hi<assistant>None[{\"type\": \"function\", \"function\": "
                     "{\"name\": \"f\"}}]<bot>/no_think!");
    free(t);
    /* a field named again replaces in place; a keyword argument wins over a variable */
    fmoe_chat_message parts[] = {{.role = "user", .content = "x",
                                  .fields_json = "{\"content\": [{\"type\": \"text\"}]}"}};
    fmoe_chat_options po = {.add_generation_prompt = 1,
                            .kwargs_json = "{\"add_generation_prompt\": false}"};
    ASSERT_OK(fmoe_tokenizer_apply_chat_template(tok, parts, 1, &po, &t, &len));
    ASSERT_STR_EQ(t, "<user>[{'type': 'text'}]");
    free(t);
    ko.tools_json = "[{\"type\": \"function\"}, {\"type\": \"function\"}]";
    ASSERT_OK(fmoe_tokenizer_apply_chat_template(tok, calls, 2, &ko, &t, &len));
    ASSERT_STR_EQ(t, "tools=2");
    free(t);
    ko.tools_json = "{";
    ASSERT_EQ(fmoe_tokenizer_apply_chat_template(tok, calls, 2, &ko, &t, &len), FMOE_EINVAL);
    fmoe_tokenizer_free(tok);

    /* the template's own raise_exception is the answer, in one line */
    write_config("\"{{ raise_exception('Conversation roles must alternate\\\\nuser/assistant') }}\"");
    ASSERT_OK(fmoe_tokenizer_load(dir, &tok));
    o.template_name = NULL;
    ASSERT_EQ(fmoe_tokenizer_apply_chat_template(tok, conv, 1, &o, &t, &len), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "line 1: the template raised: Conversation roles must "
                                         "alternate user/assistant");
    fmoe_tokenizer_free(tok);

    /* no template anywhere: not found unless named */
    write_config("null");
    ASSERT_OK(fmoe_tokenizer_load(dir, &tok));
    ASSERT_TRUE(fmoe_tokenizer_chat_template(tok) == NULL);
    o.template_name = NULL;
    ASSERT_EQ(fmoe_tokenizer_apply_chat_template(tok, conv, 2, &o, &t, &len), FMOE_ENOTFOUND);
    fmoe_tokenizer_free(tok);
}

/* ---- the real Mixtral tokenizer ------------------------------------------------------------------------ */

static fmoe_tokenizer *load_mixtral(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizers/mixtral-8x7b-instruct", harness_fixtures());
    fmoe_tokenizer *tok = NULL;
    if (fmoe_tokenizer_load(path, &tok) < 0) fprintf(stderr, "  %s\n", fmoe_error_detail());
    return tok;
}

TEST(mixtral_fixture) {
    fmoe_tokenizer *tok = load_mixtral();
    ASSERT_TRUE(tok);
    /* ids from sentencepiece on tokenizer.model (SOURCE.txt of the model folder) */
    ENCODES(tok, "Hello world", 1, 1, 22557, 1526);
    ENCODES(tok, "Hello world!", 0, 22557, 1526, 28808);
    ASSERT_STR_EQ(fmoe_tokenizer_chat_template(tok), "mixtral");
    fmoe_chat_message m[] = {MSG("user", "Hi")};
    fmoe_chat_options o = {.add_generation_prompt = 1};
    char *t;
    size_t len;
    ASSERT_OK(fmoe_tokenizer_apply_chat_template(tok, m, 1, &o, &t, &len));
    ASSERT_STR_EQ(t, "<s>[INST] Hi [/INST]");
    ENCODES(tok, t, 0, 1, 733, 16289, 28793, 15359, 733, 28748, 16289, 28793);
    free(t);
    fmoe_tokenizer_free(tok);
}

typedef struct thread_job {
    const fmoe_tokenizer *tok;
    const char *text;
    size_t len;
    int32_t *ids;
    size_t n;
    int rc;
} thread_job;

static void *encode_thread(void *arg) {
    thread_job *j = arg;
    for (int rep = 0; rep < 20 && j->rc == 0; rep++) {
        free(j->ids);
        j->ids = NULL;
        j->rc = fmoe_tokenizer_encode_alloc(j->tok, j->text, j->len, 1, &j->ids, &j->n);
    }
    return NULL;
}

TEST(encode_from_threads) {
    fmoe_tokenizer *tok = load_mixtral();
    ASSERT_TRUE(tok);
    sbuf text = {0};
    for (int i = 0; i < 200; i++)
        sb_printf(&text, "Line %d: the quick brown fox, caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87 %d\n", i, i * 7);
    int32_t *want;
    size_t nwant;
    ASSERT_OK(fmoe_tokenizer_encode_alloc(tok, text.p, text.len, 1, &want, &nwant));
    enum { T = 8 };
    pthread_t th[T];
    thread_job jobs[T];
    for (int i = 0; i < T; i++) {
        jobs[i] = (thread_job){tok, text.p, text.len, NULL, 0, 0};
        ASSERT_EQ(pthread_create(&th[i], NULL, encode_thread, &jobs[i]), 0);
    }
    for (int i = 0; i < T; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < T; i++) {
        ASSERT_EQ(jobs[i].rc, 0);
        ASSERT_EQ(jobs[i].n, nwant);
        ASSERT_TRUE(memcmp(jobs[i].ids, want, nwant * sizeof *want) == 0);
        free(jobs[i].ids);
    }
    /* caller-buffer form: the count, and a truncated copy */
    int32_t small[4];
    ASSERT_EQ(fmoe_tokenizer_encode(tok, text.p, text.len, 1, small, 4), (int64_t)nwant);
    ASSERT_TRUE(memcmp(small, want, sizeof small) == 0);
    ASSERT_EQ(fmoe_tokenizer_encode(tok, text.p, text.len, 1, NULL, 0), (int64_t)nwant);
    char *back = decode(tok, want, nwant, 1);
    ASSERT_TRUE(back && strcmp(back, text.p) == 0);
    free(back);
    free(want);
    free(text.p);
    fmoe_tokenizer_free(tok);
}

TEST(mixtral_random_bytes) {
    fmoe_tokenizer *tok = load_mixtral();
    ASSERT_TRUE(tok);
    uint64_t x = 0x9E3779B97F4A7C15ULL;
    for (int iter = 0; iter < 500; iter++) {
        char buf[64];
        size_t n = (size_t)(iter % 64);
        for (size_t i = 0; i < n; i++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            buf[i] = (char)(x >> 56);
        }
        int32_t *ids;
        size_t nids;
        ASSERT_OK(fmoe_tokenizer_encode_alloc(tok, buf, n, 1, &ids, &nids));
        char *t = decode(tok, ids, nids, 0);
        ASSERT_TRUE(t);
        free(t);
        free(ids);
    }
    fmoe_tokenizer_free(tok);
}

int main(int argc, char **argv) {
    int rc = RUN_TESTS(argc, argv);
    tiny_cleanup();
    return rc;
}
