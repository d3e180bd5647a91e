/*
 * test_gguf.c - lib/gguf.c on files built byte by byte here: a good file reads back, and
 * every kind of bad input is refused with one line naming the file, the key or tensor and
 * the offset; a split model's shards open as one handle (from files and from memory), and
 * each bad split is refused, a shard of another model among them.
 * (Files written by the gguf Python package are read in tests/python/test_gguf_quants.py and,
 * split, tests/python/test_gguf_split.py.)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fmoe/error.h"
#include "fmoe/gguf.h"
#include "fmoe/quant.h"
#include "harness.h"

/* ------------------------------------------------------------------ a byte builder */

typedef struct buf {
    uint8_t b[8192];
    size_t n;
} buf;

static void put(buf *b, const void *p, size_t n) {
    memcpy(b->b + b->n, p, n);
    b->n += n;
}
static void u32(buf *b, uint32_t v) { put(b, &v, 4); } /* little-endian host (x86, arm64) */
static void u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void str(buf *b, const char *s) {
    u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void header(buf *b, uint32_t version, uint64_t nt, uint64_t nkv) {
    b->n = 0;
    put(b, "GGUF", 4);
    u32(b, version);
    u64(b, nt);
    u64(b, nkv);
}
static void kv_u32(buf *b, const char *k, uint32_t v) {
    str(b, k);
    u32(b, FMOE_GGUF_UINT32);
    u32(b, v);
}
static void kv_str(buf *b, const char *k, const char *v) {
    str(b, k);
    u32(b, FMOE_GGUF_STRING);
    str(b, v);
}
static void tensor_info(buf *b, const char *name, uint32_t ndim, const uint64_t *ne,
                        uint32_t type, uint64_t off) {
    str(b, name);
    u32(b, ndim);
    for (uint32_t d = 0; d < ndim; d++) u64(b, ne[d]);
    u32(b, type);
    u64(b, off);
}
static void pad(buf *b, size_t align) {
    while (b->n % align) b->b[b->n++] = 0;
}

/* A good file: 3 keys (string, uint32 array, float), two tensors: F32 [4,2] and Q8_0 [32]. */
static void good_file(buf *b) {
    header(b, 3, 2, 3);
    kv_str(b, "general.architecture", "llama");
    str(b, "tokenizer.ggml.token_type");
    u32(b, FMOE_GGUF_ARRAY);
    u32(b, FMOE_GGUF_INT32);
    u64(b, 3);
    u32(b, 1), u32(b, 2), u32(b, (uint32_t)-3);
    str(b, "llama.rope.freq_base");
    u32(b, FMOE_GGUF_FLOAT32);
    const float theta = 10000.f;
    put(b, &theta, 4);
    const uint64_t ne0[] = {4, 2}, ne1[] = {32};
    tensor_info(b, "a.weight", 2, ne0, FMOE_GGML_F32, 0);
    tensor_info(b, "b.weight", 1, ne1, FMOE_GGML_Q8_0, 32);
    pad(b, 32);
    for (int i = 0; i < 8; i++) {
        const float f = (float)i;
        put(b, &f, 4);
    }
    const uint16_t d = 0x3c00; /* f16 1.0 */
    put(b, &d, 2);
    for (int i = 0; i < 32; i++) b->b[b->n++] = (uint8_t)(int8_t)(i - 16);
}

static int parse(const buf *b, fmoe_gguf **g) {
    fmoe_error_clear();
    return fmoe_gguf_parse(b->b, b->n, "t.gguf", g);
}

/* Parses and expects failure `code` with a detail containing `needle`. */
static void expect_fail(int *harness_failed, const buf *b, int code, const char *needle) {
    fmoe_gguf *g = NULL;
    const int rc = parse(b, &g);
    if (rc == 0) fmoe_gguf_close(g);
    ASSERT_EQ(rc, code);
    ASSERT_CONTAINS(fmoe_error_detail(), "t.gguf: ");
    ASSERT_CONTAINS(fmoe_error_detail(), needle);
    ASSERT_TRUE(strchr(fmoe_error_detail(), '\n') == NULL);
}

/* ------------------------------------------------------------------ good files */

TEST(good_file_reads_back) {
    buf b;
    good_file(&b);
    fmoe_gguf *g;
    ASSERT_OK(parse(&b, &g));
    ASSERT_EQ(fmoe_gguf_version(g), 3);
    ASSERT_EQ(fmoe_gguf_alignment(g), 32);
    ASSERT_EQ(fmoe_gguf_kv_count(g), 3);
    ASSERT_EQ(fmoe_gguf_tensor_count(g), 2);
    fmoe_gguf_str s;
    ASSERT_OK(fmoe_gguf_get_str(g, "general.architecture", &s));
    ASSERT_EQ(s.len, 5);
    ASSERT_TRUE(memcmp(s.ptr, "llama", 5) == 0);
    double theta;
    ASSERT_OK(fmoe_gguf_get_float(g, "llama.rope.freq_base", &theta));
    ASSERT_NEAR(theta, 10000.0, 0);
    const fmoe_gguf_kv *tt = fmoe_gguf_find_kv(g, "tokenizer.ggml.token_type");
    ASSERT_TRUE(tt != NULL);
    ASSERT_EQ(tt->count, 3);
    ASSERT_NEAR(fmoe_gguf_kv_number(tt, 2), -3, 0);
    int64_t v;
    ASSERT_EQ(fmoe_gguf_get_int(g, "general.architecture", &v), FMOE_EFORMAT);
    ASSERT_CONTAINS(fmoe_error_detail(), "key general.architecture is STRING, expected an integer");
    ASSERT_EQ(fmoe_gguf_get_int(g, "missing.key", &v), FMOE_ENOTFOUND);

    const fmoe_gguf_tensor *a, *q;
    const int64_t want_a[] = {4, -1};
    ASSERT_OK(fmoe_gguf_get_tensor(g, "a.weight", 2, want_a, &a));
    ASSERT_EQ(a->ne[1], 2);
    ASSERT_EQ(a->offset, fmoe_gguf_data_offset(g));
    ASSERT_EQ(a->nbytes, 32);
    ASSERT_NEAR(((const float *)a->data)[5], 5.0, 0);
    const int64_t want_q[] = {32};
    ASSERT_OK(fmoe_gguf_get_tensor(g, "b.weight", 1, want_q, &q));
    ASSERT_EQ(q->nbytes, 34);
    float y[32];
    fmoe_quant_dequantize_row(q->type, q->data, y, 32);
    ASSERT_NEAR(y[0], -16.0, 0);
    const int64_t wrong[] = {64};
    ASSERT_EQ(fmoe_gguf_get_tensor(g, "b.weight", 1, wrong, &q), FMOE_EMISMATCH);
    ASSERT_CONTAINS(fmoe_error_detail(), "tensor b.weight has extents [32], expected [64]");
    ASSERT_EQ(fmoe_gguf_get_tensor(g, "c.weight", 1, wrong, &q), FMOE_ENOTFOUND);
    fmoe_gguf_close(g);
}

TEST(version_2_and_custom_alignment) {
    buf b;
    header(&b, 2, 1, 1);
    kv_u32(&b, "general.alignment", 64);
    const uint64_t ne[] = {2};
    tensor_info(&b, "t", 1, ne, FMOE_GGML_F32, 64);
    pad(&b, 64);
    memset(b.b + b.n, 0, 72);
    b.n += 72;
    fmoe_gguf *g;
    ASSERT_OK(parse(&b, &g));
    ASSERT_EQ(fmoe_gguf_alignment(g), 64);
    ASSERT_EQ(fmoe_gguf_data_offset(g) % 64, 0);
    ASSERT_EQ(fmoe_gguf_tensor_at(g, 0)->offset, fmoe_gguf_data_offset(g) + 64);
    fmoe_gguf_close(g);
}

/* A type fmoe cannot compute with is listed, and refused by name at get. */
TEST(unsupported_type_refused_at_get) {
    buf b;
    header(&b, 3, 1, 0);
    const uint64_t ne[] = {256};
    tensor_info(&b, "blk.0.ffn_down_exps.weight", 1, ne, FMOE_GGML_TQ1_0, 0);
    pad(&b, 32);
    memset(b.b + b.n, 0, 54);
    b.n += 54;
    fmoe_gguf *g;
    ASSERT_OK(parse(&b, &g));
    const fmoe_gguf_tensor *t;
    ASSERT_EQ(fmoe_gguf_get_tensor(g, "blk.0.ffn_down_exps.weight", 1, (int64_t[]){256}, &t),
              FMOE_EUNSUPPORTED);
    ASSERT_CONTAINS(fmoe_error_detail(), "t.gguf: tensor blk.0.ffn_down_exps.weight has type TQ1_0");
    fmoe_gguf_close(g);
}

/* ------------------------------------------------------------------ bad files */

TEST(bad_magic_and_versions) {
    buf b;
    good_file(&b);
    b.b[3] = 'X';
    expect_fail(harness_failed, &b, FMOE_EFORMAT,
                "offset 0: not a GGUF file: magic 47 47 55 58 (\"GGUX\"), expected 47 47 55 46");
    b.b[0] = 0, b.b[1] = '"';
    expect_fail(harness_failed, &b, FMOE_EFORMAT, "magic 00 22 55 58 (\"..UX\")");
    good_file(&b);
    b.n = 3;
    expect_fail(harness_failed, &b, FMOE_EFORMAT,
                "offset 0: not a GGUF file: 3 bytes, shorter than the magic");
    good_file(&b);
    b.b[4] = 1;
    expect_fail(harness_failed, &b, FMOE_EUNSUPPORTED, "offset 4: GGUF version 1");
    good_file(&b);
    const uint32_t be = 0x03000000u;
    memcpy(b.b + 4, &be, 4);
    expect_fail(harness_failed, &b, FMOE_EUNSUPPORTED, "big-endian");
}

TEST(truncated_everywhere) {
    buf good;
    good_file(&good);
    /* Every cut inside the header and tensor infos fails cleanly; cuts in the data fail
     * as a tensor past the end. */
    for (size_t cut = 0; cut < good.n; cut++) {
        buf b = good;
        b.n = cut;
        fmoe_gguf *g = NULL;
        const int rc = parse(&b, &g);
        if (rc == 0) {
            fmoe_gguf_close(g);
            HARNESS_FAIL("a file cut to %zu of %zu bytes was accepted\n", cut, good.n);
        }
        ASSERT_CONTAINS(fmoe_error_detail(), "t.gguf: ");
    }
}

TEST(huge_counts_and_lengths) {
    buf b;
    header(&b, 3, 0, 1);
    str(&b, "general.name");
    u32(&b, FMOE_GGUF_STRING);
    u64(&b, 4000000000ull); /* a 4 GB string in a tiny file */
    put(&b, "abc", 3);
    expect_fail(harness_failed, &b, FMOE_EFORMAT,
                "offset 48: the value of key general.name has length 4000000000");
    header(&b, 3, 1ull << 60, 0);
    expect_fail(harness_failed, &b, FMOE_EFORMAT, "tensors cannot fit");
    header(&b, 3, 0, 1ull << 60);
    expect_fail(harness_failed, &b, FMOE_EFORMAT, "key-value pairs cannot fit");
    header(&b, 3, 0, 1);
    str(&b, "arr");
    u32(&b, FMOE_GGUF_ARRAY);
    u32(&b, FMOE_GGUF_UINT64);
    u64(&b, 1ull << 61);
    expect_fail(harness_failed, &b, FMOE_EFORMAT, "key arr holds 2305843009213693952 values");
    header(&b, 3, 0, 1);
    str(&b, "arr");
    u32(&b, FMOE_GGUF_ARRAY);
    u32(&b, FMOE_GGUF_STRING);
    u64(&b, 1ull << 40);
    expect_fail(harness_failed, &b, FMOE_EFORMAT, "key arr holds 1099511627776 strings");
}

TEST(bad_keys_and_types) {
    buf b;
    header(&b, 3, 0, 1);
    str(&b, "x");
    u32(&b, 13);
    u64(&b, 0);
    expect_fail(harness_failed, &b, FMOE_EFORMAT, "offset 33: key x has unknown value type 13");
    header(&b, 3, 0, 1);
    str(&b, "x");
    u32(&b, FMOE_GGUF_ARRAY);
    u32(&b, FMOE_GGUF_ARRAY);
    u64(&b, 0);
    expect_fail(harness_failed, &b, FMOE_EUNSUPPORTED, "key x is an array of arrays");
    header(&b, 3, 0, 1);
    str(&b, "");
    u32(&b, FMOE_GGUF_UINT32);
    u32(&b, 0);
    expect_fail(harness_failed, &b, FMOE_EFORMAT, "key 0 has length 0");
    header(&b, 3, 0, 1);
    kv_u32(&b, "a\nb", 1); /* would split the one-line error */
    expect_fail(harness_failed, &b, FMOE_EFORMAT, "offset 24: key 0 holds a control character");
    header(&b, 3, 0, 2);
    kv_u32(&b, "k", 1);
    kv_u32(&b, "k", 2);
    expect_fail(harness_failed, &b, FMOE_EFORMAT, "key k appears twice");
}

TEST(wrong_alignment) {
    buf b;
    header(&b, 3, 0, 1);
    kv_u32(&b, "general.alignment", 48);
    expect_fail(harness_failed, &b, FMOE_EFORMAT, "general.alignment must be a UINT32 power of two, got UINT32 48");
    header(&b, 3, 0, 1);
    kv_u32(&b, "general.alignment", 0);
    expect_fail(harness_failed, &b, FMOE_EFORMAT, "got UINT32 0");
    header(&b, 3, 0, 1);
    kv_str(&b, "general.alignment", "32");
    expect_fail(harness_failed, &b, FMOE_EFORMAT, "got STRING");
    /* A tensor offset that is not a multiple of the alignment. */
    header(&b, 3, 1, 0);
    tensor_info(&b, "t", 1, (uint64_t[]){2}, FMOE_GGML_F32, 4);
    pad(&b, 32);
    memset(b.b + b.n, 0, 64);
    b.n += 64;
    expect_fail(harness_failed, &b, FMOE_EFORMAT, "tensor t: data offset 4 is not a multiple of the alignment 32");
}

TEST(bad_tensor_infos) {
    buf b;
    header(&b, 3, 1, 0);
    tensor_info(&b, "t", 5, (uint64_t[]){1, 1, 1, 1, 1}, FMOE_GGML_F32, 0);
    expect_fail(harness_failed, &b, FMOE_EFORMAT, "offset 24: tensor t has 5 dimensions");
    header(&b, 3, 1, 0);
    tensor_info(&b, "t", 1, (uint64_t[]){32}, 99, 0);
    expect_fail(harness_failed, &b, FMOE_EUNSUPPORTED, "tensor t has type 99, which ggml does not define");
    header(&b, 3, 1, 0);
    tensor_info(&b, "t", 1, (uint64_t[]){100}, FMOE_GGML_Q4_K, 0);
    expect_fail(harness_failed, &b, FMOE_EFORMAT, "tensor t has rows of 100 values, not a multiple of Q4_K's block of 256");
    header(&b, 3, 1, 0);
    tensor_info(&b, "t", 2, (uint64_t[]){1ull << 40, 1ull << 40}, FMOE_GGML_F32, 0);
    expect_fail(harness_failed, &b, FMOE_EFORMAT, "tensor t has too many elements");
    header(&b, 3, 1, 0);
    tensor_info(&b, "t", 1, (uint64_t[]){1024}, FMOE_GGML_F32, 0);
    pad(&b, 32);
    memset(b.b + b.n, 0, 100);
    b.n += 100;
    expect_fail(harness_failed, &b, FMOE_EFORMAT, "tensor t: 4096 bytes at offset 64 run past the end of the file (164 bytes)");
    char longname[80];
    memset(longname, 'n', 64);
    longname[64] = 0;
    header(&b, 3, 1, 0);
    tensor_info(&b, longname, 1, (uint64_t[]){1}, FMOE_GGML_F32, 0);
    expect_fail(harness_failed, &b, FMOE_EFORMAT, "tensor 0 has a name of 64 bytes");
}

TEST(duplicate_and_overlapping_tensors) {
    buf b;
    header(&b, 3, 2, 0);
    tensor_info(&b, "t", 1, (uint64_t[]){8}, FMOE_GGML_F32, 0);
    tensor_info(&b, "t", 1, (uint64_t[]){8}, FMOE_GGML_F32, 32);
    pad(&b, 32);
    memset(b.b + b.n, 0, 64);
    b.n += 64;
    expect_fail(harness_failed, &b, FMOE_EFORMAT, "tensor t appears twice");
    header(&b, 3, 2, 0);
    tensor_info(&b, "t", 1, (uint64_t[]){16}, FMOE_GGML_F32, 0);
    tensor_info(&b, "u", 1, (uint64_t[]){8}, FMOE_GGML_F32, 32);
    pad(&b, 32);
    memset(b.b + b.n, 0, 64);
    b.n += 64;
    expect_fail(harness_failed, &b, FMOE_EFORMAT, "tensors t and u overlap at offset");
}

TEST(open_refuses_non_regular_and_missing) {
    fmoe_gguf *g;
    ASSERT_EQ(fmoe_gguf_open("/nonexistent/x.gguf", &g), FMOE_EIO);
    ASSERT_CONTAINS(fmoe_error_detail(), "/nonexistent/x.gguf");
    ASSERT_EQ(fmoe_gguf_open("/tmp", &g), FMOE_EIO);
    fmoe_gguf_close(NULL); /* a no-op */
}

/* ------------------------------------------------------------------ split models */

static void kv_u16(buf *b, const char *k, uint16_t v) {
    str(b, k);
    u32(b, FMOE_GGUF_UINT16);
    put(b, &v, 2);
}

/* Shard `no` of `count`: one F32 tensor [8] named `name` holding no·10 + k, GGUF version
 * `version`, split.tensors.count `total` (absent when negative) and, when `arch` is not
 * NULL, general.architecture `arch`. */
static void build_shard(buf *b, int no, int count, int total, const char *name,
                        uint32_t version, const char *arch) {
    header(b, version, 1, 2 + (total >= 0) + (arch != NULL));
    if (arch) kv_str(b, "general.architecture", arch);
    kv_u16(b, "split.no", (uint16_t)no);
    kv_u16(b, "split.count", (uint16_t)count);
    if (total >= 0) {
        str(b, "split.tensors.count");
        u32(b, FMOE_GGUF_INT32);
        u32(b, (uint32_t)total);
    }
    tensor_info(b, name, 1, (uint64_t[]){8}, FMOE_GGML_F32, 0);
    pad(b, 32);
    for (int k = 0; k < 8; k++) {
        const float f = (float)(no * 10 + k);
        put(b, &f, 4);
    }
}

/* build_shard at DIR/m-0000{no+1}-of-0000{count}.gguf. */
static void write_shard_ex(const char *dir, int no, int count, int total, const char *name,
                           uint32_t version, const char *arch) {
    buf b;
    build_shard(&b, no, count, total, name, version, arch);
    char path[256];
    snprintf(path, sizeof path, "%s/m-%05d-of-%05d.gguf", dir, no + 1, count);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    fwrite(b.b, 1, b.n, f);
    fclose(f);
}

/* A shard as llama.cpp's llama-gguf-split writes it: version 3, shard 0 with the model's
 * keys (general.architecture here), the others with the split.* keys alone. */
static void write_shard(const char *dir, int no, int count, int total, const char *name) {
    write_shard_ex(dir, no, count, total, name, 3, no == 0 ? "llama" : NULL);
}

static void write_split(const char *dir, int count) {
    for (int i = 0; i < count; i++) {
        char name[16];
        snprintf(name, sizeof name, "t%d.weight", i);
        write_shard(dir, i, count, count, name);
    }
}

static void remove_split(const char *dir, int count) {
    for (int i = 0; i < count; i++) {
        char path[256];
        snprintf(path, sizeof path, "%s/m-%05d-of-%05d.gguf", dir, i + 1, count);
        unlink(path);
    }
}

/* Opens `shard` (1-based) of DIR's 3-way split and expects failure `code` with `needle`. */
static void expect_split_fail(int *harness_failed, const char *dir, int shard, int code,
                              const char *needle) {
    char path[256];
    snprintf(path, sizeof path, "%s/m-%05d-of-00003.gguf", dir, shard);
    fmoe_gguf *g = NULL;
    fmoe_error_clear();
    const int rc = fmoe_gguf_open(path, &g);
    if (rc == 0) fmoe_gguf_close(g);
    ASSERT_EQ(rc, code);
    ASSERT_CONTAINS(fmoe_error_detail(), needle);
    ASSERT_TRUE(strchr(fmoe_error_detail(), '\n') == NULL);
}

TEST(split_model_opens_as_one) {
    char dir[] = "/tmp/fmoe-test-gguf-split-XXXXXX";
    ASSERT_TRUE(mkdtemp(dir) != NULL);
    write_split(dir, 3);
    char first[256], third[256];
    snprintf(first, sizeof first, "%s/m-00001-of-00003.gguf", dir);
    snprintf(third, sizeof third, "%s/m-00003-of-00003.gguf", dir);
    fmoe_gguf *g;
    ASSERT_OK(fmoe_gguf_open(first, &g));
    ASSERT_EQ(fmoe_gguf_shard_count(g), 3);
    ASSERT_STR_EQ(fmoe_gguf_shard_name(g, 0), first);
    ASSERT_STR_EQ(fmoe_gguf_shard_name(g, 2), third);
    ASSERT_TRUE(fmoe_gguf_shard_name(g, 3) == NULL);
    ASSERT_EQ(fmoe_gguf_tensor_count(g), 3);
    ASSERT_TRUE(fmoe_gguf_find_kv(g, "general.architecture") != NULL);
    for (int i = 0; i < 3; i++) {
        char name[16];
        snprintf(name, sizeof name, "t%d.weight", i);
        const fmoe_gguf_tensor *t = fmoe_gguf_find_tensor(g, name);
        ASSERT_TRUE(t != NULL);
        ASSERT_EQ(t->shard, i);
        ASSERT_STR_EQ(t->file, fmoe_gguf_shard_name(g, i));
        ASSERT_NEAR(((const float *)t->data)[7], i * 10 + 7, 0);
        ASSERT_TRUE(fmoe_gguf_tensor_at(g, i) == t); /* shard order */
    }
    fmoe_gguf_close(g);
    char renamed[256];
    snprintf(renamed, sizeof renamed, "%s/model.gguf", dir);
    ASSERT_EQ(rename(first, renamed), 0);
    ASSERT_EQ(fmoe_gguf_open(renamed, &g), FMOE_EFORMAT);
    ASSERT_CONTAINS(fmoe_error_detail(), "does not end in -00001-of-00003.gguf");
    ASSERT_EQ(rename(renamed, first), 0);

    expect_split_fail(harness_failed, dir, 2, FMOE_EFORMAT, "-00001-of-00003.gguf");
    expect_split_fail(harness_failed, dir, 2, FMOE_EFORMAT, "shard 2 of 3 of a split model");
    write_shard(dir, 2, 3, 3, "t0.weight");
    expect_split_fail(harness_failed, dir, 1, FMOE_EFORMAT, "tensor t0.weight is in two shards");
    write_shard(dir, 2, 4, 3, "t2.weight"); /* shard 3 of a 4-way split, named 3 of 3 */
    char moved[256];
    snprintf(moved, sizeof moved, "%s/m-00003-of-00004.gguf", dir);
    ASSERT_EQ(rename(moved, third), 0);
    expect_split_fail(harness_failed, dir, 1, FMOE_EFORMAT,
                      "says it is shard 3 of 4, expected shard 3 of 3");
    for (int i = 0; i < 3; i++) {
        char name[16];
        snprintf(name, sizeof name, "t%d.weight", i);
        write_shard(dir, i, 3, 4, name);
    }
    expect_split_fail(harness_failed, dir, 1, FMOE_EFORMAT,
                      "the 3 shards hold 3 tensors, split.tensors.count says 4");
    /* a shard of another model: every check of what ties a shard to shard 1 */
    write_split(dir, 3);
    write_shard(dir, 1, 3, 4, "t1.weight"); /* its model has 4 tensors */
    expect_split_fail(harness_failed, dir, 1, FMOE_EFORMAT,
                      "m-00002-of-00003.gguf: offset 71: split.tensors.count is 4, but shard 1");
    expect_split_fail(harness_failed, dir, 1, FMOE_EFORMAT, "says 3: a shard of another model");
    write_shard_ex(dir, 1, 3, 3, "t1.weight", 2, NULL);
    expect_split_fail(harness_failed, dir, 1, FMOE_EFORMAT,
                      "m-00002-of-00003.gguf: offset 4: GGUF version 2, but shard 1");
    write_shard_ex(dir, 2, 3, 3, "t2.weight", 3, "qwen3moe");
    write_shard(dir, 1, 3, 3, "t1.weight");
    expect_split_fail(harness_failed, dir, 1, FMOE_EFORMAT,
                      "m-00003-of-00003.gguf: offset 24: key general.architecture differs "
                      "from shard 1's");
    write_shard_ex(dir, 2, 3, 3, "t2.weight", 3, "llama"); /* the same value: fine */
    fmoe_gguf *ok = NULL;
    ASSERT_OK(fmoe_gguf_open(first, &ok));
    fmoe_gguf_close(ok);
    write_shard_ex(dir, 2, 3, -1, "t2.weight", 3, NULL);
    expect_split_fail(harness_failed, dir, 1, FMOE_EFORMAT,
                      "m-00003-of-00003.gguf: no key split.tensors.count");
    write_split(dir, 3);
    unlink(third);
    expect_split_fail(harness_failed, dir, 1, FMOE_EIO, "shard 3 of 3 is missing");
    expect_split_fail(harness_failed, dir, 1, FMOE_EIO, "m-00003-of-00003.gguf");
    remove_split(dir, 3);
    rmdir(dir);
}

/* Shards in memory (fmoe_gguf_parse_split, the fuzz target's entry): the same join. */
TEST(split_model_parses_from_memory) {
    buf b[3];
    const void *bytes[3];
    uint64_t sizes[3];
    for (int i = 0; i < 3; i++) {
        char name[16];
        snprintf(name, sizeof name, "t%d.weight", i);
        build_shard(&b[i], i, 3, 3, name, 3, i == 0 ? "llama" : NULL);
        bytes[i] = b[i].b;
        sizes[i] = b[i].n;
    }
    fmoe_gguf *g = NULL;
    ASSERT_OK(fmoe_gguf_parse_split(bytes, sizes, 3, "x-00001-of-00003.gguf", &g));
    ASSERT_EQ(fmoe_gguf_tensor_count(g), 3);
    ASSERT_STR_EQ(fmoe_gguf_shard_name(g, 2), "x-00003-of-00003.gguf");
    const fmoe_gguf_tensor *t = fmoe_gguf_find_tensor(g, "t2.weight");
    ASSERT_TRUE(t != NULL && t->shard == 2);
    ASSERT_NEAR(((const float *)t->data)[7], 27, 0);
    fmoe_gguf_close(g);
    ASSERT_EQ(fmoe_gguf_parse_split(bytes, sizes, 2, "x.gguf", &g), FMOE_EFORMAT);
    ASSERT_CONTAINS(fmoe_error_detail(), "x.gguf: 2 shards given, but split.count says 3");
    ASSERT_EQ(fmoe_gguf_parse_split(bytes + 1, sizes + 1, 2, "x.gguf", &g), FMOE_EFORMAT);
    ASSERT_CONTAINS(fmoe_error_detail(), "shard 2 of 3 of a split model");
    build_shard(&b[1], 1, 3, 5, "t1.weight", 3, NULL);
    ASSERT_EQ(fmoe_gguf_parse_split(bytes, sizes, 3, "x.gguf", &g), FMOE_EFORMAT);
    ASSERT_CONTAINS(fmoe_error_detail(), "x.gguf (shard 2): offset 71: split.tensors.count is 5");
    /* a single file is a set of one */
    buf one;
    good_file(&one);
    const void *ob[] = {one.b};
    const uint64_t os[] = {one.n};
    ASSERT_OK(fmoe_gguf_parse_split(ob, os, 1, "one.gguf", &g));
    ASSERT_EQ(fmoe_gguf_shard_count(g), 1);
    fmoe_gguf_close(g);
}

TEST(split_path_names_the_shards_by_name_alone) {
    char b[64];
    ASSERT_EQ(fmoe_gguf_split_path("d/m-00002-of-00003.gguf", 0, b, sizeof b), 3);
    ASSERT_STR_EQ(b, "d/m-00001-of-00003.gguf");
    ASSERT_EQ(fmoe_gguf_split_path("d/m-00002-of-00003.gguf", 2, b, sizeof b), 3);
    ASSERT_STR_EQ(b, "d/m-00003-of-00003.gguf");
    ASSERT_EQ(fmoe_gguf_split_path("-00001-of-00012.gguf", 11, b, sizeof b), 12);
    ASSERT_STR_EQ(b, "-00012-of-00012.gguf");
    strcpy(b, "unchanged");
    /* not a shard's name: no split, shard past the count, one shard, other digits or case */
    static const char *const not_shards[] = {
        "m.gguf", "m-00004-of-00003.gguf", "m-00000-of-00003.gguf", "m-00001-of-00001.gguf",
        "m-0001-of-00003.gguf", "m-00001-of-00003.GGUF", "m-00001_of-00003.gguf",
        "m-0000a-of-00003.gguf", "", "00001-of-00003.gguf"};
    for (size_t i = 0; i < sizeof not_shards / sizeof not_shards[0]; i++)
        ASSERT_EQ(fmoe_gguf_split_path(not_shards[i], 0, b, sizeof b), 0);
    ASSERT_EQ(fmoe_gguf_split_path("m-00001-of-00003.gguf", 3, b, sizeof b), 0);
    ASSERT_EQ(fmoe_gguf_split_path("m-00001-of-00003.gguf", -1, b, sizeof b), 0);
    ASSERT_EQ(fmoe_gguf_split_path("m-00001-of-00003.gguf", 0, b, 21), 0); /* no room */
    ASSERT_STR_EQ(b, "unchanged");
    ASSERT_EQ(fmoe_gguf_split_path("m-00001-of-00003.gguf", 0, b, 22), 3);
}

/* RssFile of /proc/self/status in KiB: the file pages mapped into this process. */
static long long rss_file_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[128];
    long long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "RssFile: %lld kB", &kb) == 1) break;
    fclose(f);
    return kb;
}

TEST(populate_maps_every_page_and_release_drops_them) {
    /* one F32 tensor of 16 MiB: parsing reads the header's pages only */
    enum { VALUES = 4 << 20 };
    buf b;
    header(&b, 3, 1, 1);
    kv_str(&b, "general.architecture", "llama");
    tensor_info(&b, "t.weight", 1, (uint64_t[]){VALUES}, FMOE_GGML_F32, 0);
    pad(&b, 32);
    char path[] = "/tmp/fmoe-test-gguf-populate-XXXXXX";
    const int fd = mkstemp(path);
    ASSERT_TRUE(fd >= 0);
    float *data = calloc(VALUES, sizeof *data);
    ASSERT_TRUE(data != NULL);
    ASSERT_TRUE(write(fd, b.b, b.n) == (ssize_t)b.n);
    ASSERT_TRUE(write(fd, data, (size_t)VALUES * 4) == (ssize_t)VALUES * 4);
    close(fd);
    free(data);
    fmoe_gguf *g = NULL;
    ASSERT_OK(fmoe_gguf_open(path, &g));
    const long long before = rss_file_kib();
    if (before < 0) { /* no /proc: nothing to observe */
        fmoe_gguf_close(g);
        unlink(path);
        return;
    }
    fmoe_gguf_populate_pages(g);
    const long long populated = rss_file_kib();
    fmoe_gguf_release_pages(g);
    const long long released = rss_file_kib();
    fmoe_gguf_close(g);
    unlink(path);
    ASSERT_TRUE(populated - before >= 15 * 1024); /* all but the header's 16 MiB */
    ASSERT_TRUE(populated - released >= 15 * 1024);
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
