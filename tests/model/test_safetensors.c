/*
 * test_safetensors - the safetensors reader on good files, sharded checkpoints and every
 * kind of bad input a checkpoint can hold: each a one-line error naming file and tensor, never
 * a crash (this test runs under ASan/UBSan), plus mutated files through the in-memory
 * validator.
 */
#include "fmoe/safetensors.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fmoe/error.h"
#include "harness.h"
#include "st_writer.h"

static char dir[512];

static void setup(void) {
    if (!dir[0]) make_tmpdir(dir, sizeof dir, "st");
}

static const char *path_of(const char *name) {
    static char p[1024];
    setup();
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return p;
}

/* A valid two-tensor file: a [2,3] F32 and b [4] BF16. */
static void write_good(const char *path) {
    st_builder b;
    stb_init(&b);
    const float a[6] = {1, 2, 3, 4, 5, 6}, v[4] = {0.5f, -1, 2, 8};
    stb_add_f(&b, "a", "F32", 2, (int64_t[]){2, 3}, a);
    stb_add_f(&b, "b", "BF16", 1, (int64_t[]){4}, v);
    stb_write(&b, path, 8, 0);
    stb_free(&b);
}

/* Opens `path` expecting failure `code` with a detail containing `needle`. */
#define EXPECT_OPEN_FAILS(path, code, needle)                                               \
    do {                                                                                  \
        fmoe_safetensors *st_ = (fmoe_safetensors *)1;                                    \
        int rc_ = fmoe_safetensors_open((path), &st_);                                    \
        if (rc_ != (code))                                                                \
            HARNESS_FAIL("open %s returned %d, expected %d (%s)", (path), rc_, (code),    \
                         fmoe_error_detail());                                            \
        ASSERT_TRUE(st_ == NULL);                                                         \
        ASSERT_CONTAINS(fmoe_error_detail(), (needle));                                   \
        ASSERT_TRUE(strchr(fmoe_error_detail(), '\n') == NULL);                           \
    } while (0)

TEST(good_file_opens_and_reads) {
    const char *p = path_of("good.safetensors");
    write_good(p);
    fmoe_safetensors *st;
    ASSERT_OK(fmoe_safetensors_open(p, &st));
    ASSERT_EQ(fmoe_safetensors_count(st), 2);
    ASSERT_EQ(fmoe_safetensors_data_bytes(st), 24 + 8);
    const fmoe_st_tensor *a = fmoe_safetensors_find(st, "a");
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(a->dtype, FMOE_ST_F32);
    ASSERT_EQ(a->ndim, 2);
    ASSERT_EQ(a->shape[1], 3);
    ASSERT_EQ(a->numel, 6);
    float f;
    memcpy(&f, (const char *)a->data + 5 * 4, 4);
    ASSERT_NEAR(f, 6, 0);
    ASSERT_STR_EQ(a->file, p);
    ASSERT_TRUE(fmoe_safetensors_find(st, "c") == NULL);
    ASSERT_STR_EQ(fmoe_safetensors_at(st, 1)->name, "b");
    const fmoe_st_tensor *t;
    ASSERT_OK(fmoe_safetensors_get(st, "b", 1, (int64_t[]){4}, &t));
    ASSERT_OK(fmoe_safetensors_get(st, "a", 2, (int64_t[]){-1, 3}, &t));
    ASSERT_EQ(fmoe_safetensors_get(st, "a", 2, (int64_t[]){3, 2}, &t), FMOE_EMISMATCH);
    ASSERT_CONTAINS(fmoe_error_detail(), "tensor a has shape [2,3], expected [3,2]");
    ASSERT_EQ(fmoe_safetensors_get(st, "zz", 1, (int64_t[]){1}, &t), FMOE_ENOTFOUND);
    ASSERT_CONTAINS(fmoe_error_detail(), "missing tensor zz");
    fmoe_safetensors_close(st);
    fmoe_safetensors_close(NULL);
}

/* A multimodal checkpoint's text model (Llama 4's language_model.) found by its own
 * names; a renamed tensor that collides with another is refused, naming it. */
TEST(strip_prefix_renames_and_refuses_collisions) {
    const char *p = path_of("prefixed.safetensors");
    st_builder b;
    stb_init(&b);
    const float v[2] = {1, 2};
    stb_add_f(&b, "lm.model.w", "F32", 1, (int64_t[]){2}, v);
    stb_add_f(&b, "vision.w", "F32", 1, (int64_t[]){2}, v);
    stb_write(&b, p, 8, 0);
    stb_free(&b);
    fmoe_safetensors *st;
    ASSERT_OK(fmoe_safetensors_open(p, &st));
    ASSERT_EQ(fmoe_safetensors_strip_prefix(st, "lm."), 1);
    ASSERT_TRUE(fmoe_safetensors_find(st, "model.w") != NULL);
    ASSERT_TRUE(fmoe_safetensors_find(st, "lm.model.w") == NULL);
    ASSERT_TRUE(fmoe_safetensors_find(st, "vision.w") != NULL);
    ASSERT_EQ(fmoe_safetensors_strip_prefix(st, "absent."), 0);
    fmoe_safetensors_close(st);

    p = path_of("colliding.safetensors");
    stb_init(&b);
    stb_add_f(&b, "lm.w", "F32", 1, (int64_t[]){2}, v);
    stb_add_f(&b, "w", "F32", 1, (int64_t[]){2}, v);
    stb_write(&b, p, 8, 0);
    stb_free(&b);
    ASSERT_OK(fmoe_safetensors_open(p, &st));
    ASSERT_EQ(fmoe_safetensors_strip_prefix(st, "lm."), FMOE_EFORMAT);
    ASSERT_CONTAINS(fmoe_error_detail(), "tensor \"w\" appears twice");
    fmoe_safetensors_close(st);
}

TEST(directory_with_single_file) {
    char sub[600];
    snprintf(sub, sizeof sub, "%s", path_of("single"));
    mkdir(sub, 0755);
    char f[700];
    snprintf(f, sizeof f, "%s/model.safetensors", sub);
    write_good(f);
    fmoe_safetensors *st;
    ASSERT_OK(fmoe_safetensors_open(sub, &st));
    ASSERT_EQ(fmoe_safetensors_count(st), 2);
    fmoe_safetensors_close(st);
    snprintf(sub, sizeof sub, "%s", path_of("empty-dir"));
    mkdir(sub, 0755);
    EXPECT_OPEN_FAILS(sub, FMOE_ENOTFOUND, "no model.safetensors");
}

TEST(truncated_file) {
    const char *p = path_of("trunc.safetensors");
    write_good(p);
    FILE *f = fopen(p, "rb");
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    f = fopen(p, "wb");
    fwrite(buf, 1, n - 3, f);
    fclose(f);
    EXPECT_OPEN_FAILS(p, FMOE_EFORMAT, "run past the end of the data area");
    ASSERT_CONTAINS(fmoe_error_detail(), "tensor \"b\"");
    ASSERT_CONTAINS(fmoe_error_detail(), "trunc.safetensors");
    /* Cut inside the header, and below the 8-byte length. */
    f = fopen(p, "wb");
    fwrite(buf, 1, 20, f);
    fclose(f);
    EXPECT_OPEN_FAILS(p, FMOE_EFORMAT, "header length");
    f = fopen(p, "wb");
    fwrite(buf, 1, 5, f);
    fclose(f);
    EXPECT_OPEN_FAILS(p, FMOE_EFORMAT, "too short");
    f = fopen(p, "wb");
    fclose(f);
    EXPECT_OPEN_FAILS(p, FMOE_EFORMAT, "0 bytes");
}

TEST(header_length_larger_than_file) {
    const char *p = path_of("hlen.safetensors");
    FILE *f = fopen(p, "wb");
    const uint8_t len[8] = {0x00, 0x00, 0x00, 0x10, 0, 0, 0, 0}; /* 256 MiB */
    fwrite(len, 1, 8, f);
    fputs("{}", f);
    fclose(f);
    EXPECT_OPEN_FAILS(p, FMOE_EFORMAT, "header length 268435456 exceeds");
    const uint8_t huge[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    f = fopen(p, "wb");
    fwrite(huge, 1, 8, f);
    fputs("{}", f);
    fclose(f);
    EXPECT_OPEN_FAILS(p, FMOE_EFORMAT, "exceeds");
}

TEST(offsets_past_end) {
    const char *p = path_of("past.safetensors");
    const char *h = "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                    "\"y\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,1000016]}}";
    uint8_t data[32] = {0};
    raw_file(p, h, strlen(h), data, sizeof data);
    EXPECT_OPEN_FAILS(p, FMOE_EFORMAT, "tensor \"y\": data_offsets [16, 1000016] run past the end");
    h = "{\"x\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}";
    raw_file(p, h, strlen(h), data, sizeof data);
    EXPECT_OPEN_FAILS(p, FMOE_EFORMAT, "end before they begin");
    h = "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}";
    raw_file(p, h, strlen(h), data, sizeof data);
    EXPECT_OPEN_FAILS(p, FMOE_EFORMAT, "non-negative integers");
}

TEST(overlapping_tensors) {
    const char *p = path_of("overlap.safetensors");
    const char *h = "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                    "\"y\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[12,20]}}";
    uint8_t data[32] = {0};
    raw_file(p, h, strlen(h), data, sizeof data);
    EXPECT_OPEN_FAILS(p, FMOE_EFORMAT, "overlap");
    ASSERT_CONTAINS(fmoe_error_detail(), "\"x\" and \"y\"");
    /* both ranges as they are, not a clipped first range such as [16, 16) */
    ASSERT_CONTAINS(fmoe_error_detail(), "bytes [0, 16) and [12, 20)");
    /* Adjacent is fine; so is an empty tensor at a boundary. */
    h = "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
        "\"e\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[16,16]},"
        "\"y\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[16,24]}}";
    raw_file(p, h, strlen(h), data, 24);
    fmoe_safetensors *st;
    ASSERT_OK(fmoe_safetensors_open(p, &st));
    ASSERT_EQ(fmoe_safetensors_find(st, "e")->numel, 0);
    fmoe_safetensors_close(st);
}

/* The data area ends with the last tensor's data: a byte more (a space, a NUL, 10 GB of a
 * sparse file's zeros) is refused, naming where it starts; a hole between tensors is not. */
TEST(trailing_bytes_after_the_last_tensor) {
    const char *p = path_of("trailing.safetensors");
    const char *h = "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
                    "\"y\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    const size_t at = 8 + strlen(h) + 16; /* the end of x's data */
    uint8_t data[17] = {0};
    raw_file(p, h, strlen(h), data, 16);
    fmoe_safetensors *st;
    ASSERT_OK(fmoe_safetensors_open(p, &st));
    fmoe_safetensors_close(st);
    char want[160];
    snprintf(want, sizeof want, "1 byte after the last tensor's data, from byte %zu to the end "
             "of the file at %zu", at, at + 1);
    for (int c = 0; c < 3; c++) {
        data[16] = (uint8_t)(c == 0 ? ' ' : c == 1 ? 0 : 'x');
        raw_file(p, h, strlen(h), data, 17);
        EXPECT_OPEN_FAILS(p, FMOE_EFORMAT, want);
        ASSERT_CONTAINS(fmoe_error_detail(), "trailing.safetensors: ");
    }
    /* 10 GB more, as a sparse file: refused at once, nothing read */
    raw_file(p, h, strlen(h), data, 16);
    ASSERT_EQ(truncate(p, (off_t)at + (10ll << 30)), 0);
    snprintf(want, sizeof want, "%lld bytes after the last tensor's data, from byte %zu",
             10ll << 30, at);
    EXPECT_OPEN_FAILS(p, FMOE_EFORMAT, want);
    unlink(p);
    /* no tensors at all: no data either */
    h = "{\"__metadata__\":{\"format\":\"pt\"}}";
    raw_file(p, h, strlen(h), data, 4);
    EXPECT_OPEN_FAILS(p, FMOE_EFORMAT, "4 bytes after the last tensor's data");
    raw_file(p, h, strlen(h), data, 0);
    ASSERT_OK(fmoe_safetensors_open(p, &st));
    fmoe_safetensors_close(st);
    /* a hole between two tensors is accepted (the design comment of safetensors.c) */
    h = "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
        "\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    raw_file(p, h, strlen(h), data, 16);
    ASSERT_OK(fmoe_safetensors_open(p, &st));
    fmoe_safetensors_close(st);
    /* the in-memory validator (the fuzz target's) says the same */
    uint8_t mem[256];
    const size_t hl = strlen(h);
    for (int i = 0; i < 8; i++) mem[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(mem + 8, h, hl);
    memset(mem + 8 + hl, 0, 17);
    ASSERT_OK(fmoe_safetensors_validate(mem, 8 + hl + 16, "m"));
    ASSERT_EQ(fmoe_safetensors_validate(mem, 8 + hl + 17, "m"), FMOE_EFORMAT);
    ASSERT_CONTAINS(fmoe_error_detail(), "m: 1 byte after the last tensor's data");
}

TEST(dtype_shape_mismatch) {
    const char *p = path_of("mismatch.safetensors");
    const char *h = "{\"w\":{\"dtype\":\"BF16\",\"shape\":[3,4],\"data_offsets\":[0,12]}}";
    uint8_t data[32] = {0};
    raw_file(p, h, strlen(h), data, sizeof data);
    EXPECT_OPEN_FAILS(p, FMOE_EFORMAT, "tensor \"w\": dtype BF16 and shape hold 24 bytes, but "
                                       "data_offsets span 12");
    h = "{\"w\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296,4],\"data_offsets\":[0,8]}}";
    raw_file(p, h, strlen(h), data, sizeof data);
    EXPECT_OPEN_FAILS(p, FMOE_EFORMAT, "hold over");
    h = "{\"w\":{\"dtype\":\"Q4_K\",\"shape\":[4],\"data_offsets\":[0,8]}}";
    raw_file(p, h, strlen(h), data, sizeof data);
    EXPECT_OPEN_FAILS(p, FMOE_EFORMAT, "unknown dtype \"Q4_K\"");
    h = "{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,8]}}";
    raw_file(p, h, strlen(h), data, sizeof data);
    EXPECT_OPEN_FAILS(p, FMOE_EFORMAT, "shape[0] is not a non-negative integer");
    h = "{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}";
    raw_file(p, h, strlen(h), data, sizeof data);
    EXPECT_OPEN_FAILS(p, FMOE_EFORMAT, "9 dimensions");
}

TEST(other_dtypes_listed_but_refused_for_use) {
    const char *p = path_of("i64.safetensors");
    const char *h = "{\"pos\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]},"
                    "\"__metadata__\":{\"format\":\"pt\"}}";
    uint8_t data[16] = {0};
    raw_file(p, h, strlen(h), data, sizeof data);
    fmoe_safetensors *st;
    ASSERT_OK(fmoe_safetensors_open(p, &st));
    const fmoe_st_tensor *t;
    ASSERT_EQ(fmoe_safetensors_get(st, "pos", 1, (int64_t[]){2}, &t), FMOE_EUNSUPPORTED);
    ASSERT_CONTAINS(fmoe_error_detail(), "tensor pos has dtype I64");
    fmoe_safetensors_close(st);
}

TEST(malformed_header_json) {
    const char *p = path_of("json.safetensors");
    const char *bad[] = {
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}",   /* unclosed */
        "[1,2,3]",                                                         /* not an object */
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}xx", /* trailing */
        "{\"w\":5}",                                                       /* entry not obj */
        "{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}",                     /* no dtype */
        "{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}",                 /* no shape */
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}",     /* 1 offset */
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
        "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",    /* duplicate */
        "{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",    /* empty name */
        "{\"__metadata__\":[1]}",
        "{",
    };
    const char *needles[] = {"malformed header JSON", "starting with '{'", "unexpected bytes",
                             "not a JSON object", "dtype", "shape", "[begin, end]",
                             "appears twice", "empty name", "__metadata__", "too short for a JSON object"};
    uint8_t data[8] = {0};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        raw_file(p, bad[i], strlen(bad[i]), data, sizeof data);
        EXPECT_OPEN_FAILS(p, FMOE_EFORMAT, needles[i]);
    }
}

/* A sharded checkpoint: two shards and an index. */
static void write_shards(const char *d, const char *index) {
    char f[900];
    st_builder b;
    stb_init(&b);
    const float v[4] = {1, 2, 3, 4};
    stb_add_f(&b, "a", "F32", 1, (int64_t[]){4}, v);
    snprintf(f, sizeof f, "%s/model-00001-of-00002.safetensors", d);
    stb_write(&b, f, 8, 0);
    stb_free(&b);
    stb_init(&b);
    stb_add_f(&b, "b", "F16", 1, (int64_t[]){4}, v);
    snprintf(f, sizeof f, "%s/model-00002-of-00002.safetensors", d);
    stb_write(&b, f, 8, 0);
    stb_free(&b);
    snprintf(f, sizeof f, "%s/model.safetensors.index.json", d);
    write_text(f, index);
}

TEST(sharded_checkpoints) {
    char d[600];
    snprintf(d, sizeof d, "%s", path_of("sharded"));
    mkdir(d, 0755);
    write_shards(d, "{\"metadata\":{\"total_size\":24},\"weight_map\":{"
                    "\"a\":\"model-00001-of-00002.safetensors\","
                    "\"b\":\"model-00002-of-00002.safetensors\"}}");
    fmoe_safetensors *st;
    ASSERT_OK(fmoe_safetensors_open(d, &st));
    ASSERT_EQ(fmoe_safetensors_count(st), 2);
    ASSERT_CONTAINS(fmoe_safetensors_find(st, "b")->file, "model-00002-of-00002");
    fmoe_safetensors_close(st);

    write_shards(d, "{\"weight_map\":{\"a\":\"model-00002-of-00002.safetensors\","
                    "\"b\":\"model-00002-of-00002.safetensors\"}}");
    EXPECT_OPEN_FAILS(d, FMOE_ENOTFOUND, "tensor \"a\" is not in");
    write_shards(d, "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                    "\"b\":\"model-00001-of-00002.safetensors\",\"c\":\"model-00002-of-00002."
                    "safetensors\"}}");
    EXPECT_OPEN_FAILS(d, FMOE_EFORMAT, "tensor \"b\" is in");
    write_shards(d, "{\"weight_map\":{\"a\":\"model-00003-of-00002.safetensors\"}}");
    EXPECT_OPEN_FAILS(d, FMOE_EIO, "model-00003-of-00002.safetensors");
    write_shards(d, "{\"weight_map\":{\"a\":\"../../etc/passwd\"}}");
    EXPECT_OPEN_FAILS(d, FMOE_EFORMAT, "not a file name in the model directory");
    write_shards(d, "{\"weights\":{}}");
    EXPECT_OPEN_FAILS(d, FMOE_EFORMAT, "weight_map");
    write_shards(d, "{\"weight_map\":{\"a\":\"model-000");
    EXPECT_OPEN_FAILS(d, FMOE_EFORMAT, "malformed JSON");

    /* The same tensor in two shards. */
    char f[900];
    st_builder b;
    stb_init(&b);
    const float v[4] = {1, 2, 3, 4};
    stb_add_f(&b, "a", "F32", 1, (int64_t[]){4}, v);
    snprintf(f, sizeof f, "%s/model-00002-of-00002.safetensors", d);
    stb_write(&b, f, 8, 0);
    stb_free(&b);
    snprintf(f, sizeof f, "%s/model.safetensors.index.json", d);
    write_text(f, "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                  "\"x\":\"model-00002-of-00002.safetensors\"}}");
    EXPECT_OPEN_FAILS(d, FMOE_EFORMAT, "is in both");
}

/* Every truncation and thousands of byte mutations of a good file through the in-memory
 * validator: errors or success, never a crash or an out-of-bounds read (ASan). */
TEST(mutations_never_crash) {
    const char *p = path_of("mut.safetensors");
    write_good(p);
    FILE *f = fopen(p, "rb");
    uint8_t good[4096];
    size_t n = fread(good, 1, sizeof good, f);
    fclose(f);
    ASSERT_OK(fmoe_safetensors_validate(good, n, "good"));
    for (size_t cut = 0; cut < n; cut++) {
        uint8_t *copy = malloc(cut ? cut : 1); /* exact size, so ASan sees overreads */
        memcpy(copy, good, cut);
        int rc = fmoe_safetensors_validate(copy, cut, "cut");
        free(copy);
        if (rc == 0) HARNESS_FAIL("truncation to %zu bytes accepted", cut);
    }
    uint64_t seed = 99;
    const char interesting[] = "{}[]\",:0123456789-e. \x00\xff";
    for (int iter = 0; iter < 20000; iter++) {
        uint8_t *copy = malloc(n);
        memcpy(copy, good, n);
        for (int m = 0; m < 1 + iter % 4; m++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            const size_t at = (size_t)(seed >> 33) % n;
            copy[at] = (seed >> 20) & 1 ? (uint8_t)(seed >> 8)
                                        : (uint8_t)interesting[(seed >> 12) % (sizeof interesting - 1)];
        }
        (void)fmoe_safetensors_validate(copy, n, "mutant");
        free(copy);
    }
}

int main(int argc, char **argv) {
    int rc = RUN_TESTS(argc, argv);
    if (dir[0]) remove_tree(dir);
    return rc;
}
