/*
 * test_zstd_filter.c - the zstd HDF5 filter (trace/zstd_filter.c) called directly on
 * hand-made buffers: round trips, other writers' multi-frame chunks, and the frames it
 * must refuse without crashing or allocating what a header claims.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "fmoe/error.h"
#include "fmoe/trace.h"
#include "harness.h"
#include "zstd_filter.h"

/* Runs the filter the way HDF5's pipeline does: *buf is malloc'ed and owned by the caller
 * (HDF5), and the filter swaps it on success. */
static size_t run_filter(unsigned flags, size_t ncd, const unsigned *cd, void **buf,
                         size_t *buf_size, size_t nbytes) {
    return fmoe__h5z_zstd_class.filter(flags, ncd, cd, nbytes, buf_size, buf);
}

static void *dup_bytes(const void *p, size_t n) {
    void *q = malloc(n ? n : 1);
    if (q && n) memcpy(q, p, n);
    return q;
}

static void fill_pattern(unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)((i * 7) % 13 + (i / 1000));
}

TEST(class_layout) {
    ASSERT_EQ(fmoe__h5z_zstd_class.version, H5Z_CLASS_T_VERS);
    ASSERT_EQ(fmoe__h5z_zstd_class.id, 32015);
    ASSERT_STR_EQ(fmoe__h5z_zstd_class.name, "zstd");
    ASSERT_EQ(fmoe__h5z_zstd_class.encoder_present, 1);
    ASSERT_EQ(fmoe__h5z_zstd_class.decoder_present, 1);
    ASSERT_OK(fmoe_hdf5_register_zstd());
    ASSERT_OK(fmoe_hdf5_register_zstd()); /* idempotent */
}

TEST(round_trip_levels) {
    enum { N = 100000 };
    unsigned char *src = malloc(N);
    ASSERT_TRUE(src != NULL);
    fill_pattern(src, N);
    const unsigned levels[] = {1, 3, 19, 0, 1000, (unsigned)-5};
    for (size_t li = 0; li < sizeof levels / sizeof levels[0]; li++) {
        size_t size = N;
        void *buf = dup_bytes(src, N);
        size_t n = run_filter(0, 1, &levels[li], &buf, &size, N);
        ASSERT_TRUE(n > 0 && n < N);
        /* The frame must carry its content size: other readers size buffers from it. */
        ASSERT_EQ(ZSTD_getFrameContentSize(buf, n), N);
        size_t out = run_filter(H5Z_FLAG_REVERSE, 1, &levels[li], &buf, &size, n);
        ASSERT_EQ(out, N);
        ASSERT_TRUE(size >= N);
        ASSERT_TRUE(memcmp(buf, src, N) == 0);
        free(buf);
    }
    /* No cd_values at all: the default level. */
    size_t size = N;
    void *buf = dup_bytes(src, N);
    size_t n = run_filter(0, 0, NULL, &buf, &size, N);
    ASSERT_TRUE(n > 0);
    ASSERT_EQ(run_filter(H5Z_FLAG_REVERSE, 0, NULL, &buf, &size, n), N);
    ASSERT_TRUE(memcmp(buf, src, N) == 0);
    free(buf);
    free(src);
}

TEST(decodes_concatenated_frames) {
    /* Other writers may emit a chunk as several frames; each has its content size. */
    unsigned char a[3000], b[5000];
    fill_pattern(a, sizeof a);
    fill_pattern(b, sizeof b);
    size_t cap = ZSTD_compressBound(sizeof a) + ZSTD_compressBound(sizeof b);
    unsigned char *frames = malloc(cap);
    ASSERT_TRUE(frames != NULL);
    size_t na = ZSTD_compress(frames, cap, a, sizeof a, 3);
    ASSERT_TRUE(!ZSTD_isError(na));
    size_t nb = ZSTD_compress(frames + na, cap - na, b, sizeof b, 3);
    ASSERT_TRUE(!ZSTD_isError(nb));
    size_t size = cap;
    void *buf = frames;
    size_t out = run_filter(H5Z_FLAG_REVERSE, 0, NULL, &buf, &size, na + nb);
    ASSERT_EQ(out, sizeof a + sizeof b);
    ASSERT_TRUE(memcmp(buf, a, sizeof a) == 0);
    ASSERT_TRUE(memcmp((unsigned char *)buf + sizeof a, b, sizeof b) == 0);
    free(buf);
}

/* A refused decode returns 0 and leaves the caller's buffer alone. */
static int refused(const void *bytes, size_t n) {
    void *buf = dup_bytes(bytes, n);
    void *orig = buf;
    size_t size = n;
    size_t out = run_filter(H5Z_FLAG_REVERSE, 0, NULL, &buf, &size, n);
    int ok = out == 0 && buf == orig && size == n && (n == 0 || memcmp(buf, bytes, n) == 0);
    free(buf);
    return ok;
}

TEST(refuses_frame_without_content_size) {
    unsigned char src[4096];
    fill_pattern(src, sizeof src);
    ZSTD_CCtx *cctx = ZSTD_createCCtx();
    ASSERT_TRUE(cctx != NULL);
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 0);
    unsigned char dst[8192];
    ZSTD_outBuffer out = {dst, sizeof dst, 0};
    ZSTD_inBuffer in = {src, sizeof src, 0};
    /* Streaming without a pledged size: the frame header has no content size. */
    size_t left = ZSTD_compressStream2(cctx, &out, &in, ZSTD_e_end);
    ZSTD_freeCCtx(cctx);
    ASSERT_EQ(left, 0);
    ASSERT_EQ(ZSTD_getFrameContentSize(dst, out.pos), ZSTD_CONTENTSIZE_UNKNOWN);
    ASSERT_TRUE(refused(dst, out.pos));
}

TEST(refuses_frame_claiming_huge_size) {
    /* A valid, empty frame whose header claims 2^40 bytes: refused before any allocation
     * of that size (ASan would report the attempt). */
    const unsigned char frame[] = {
        0x28, 0xb5, 0x2f, 0xfd, /* magic */
        0xe0, /* 8-byte content size, one segment */
        0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, /* 2^40, little endian */
        0x01, 0x00, 0x00, /* last block, raw, 0 bytes */
    };
    ASSERT_EQ(ZSTD_getFrameContentSize(frame, sizeof frame), 1ULL << 40);
    ASSERT_TRUE(refused(frame, sizeof frame));
}

TEST(refuses_garbage_and_truncation) {
    unsigned char junk[256];
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (unsigned char)(i * 31 + 7);
    ASSERT_TRUE(refused(junk, sizeof junk));
    ASSERT_TRUE(refused(junk, 1));

    unsigned char src[20000];
    fill_pattern(src, sizeof src);
    size_t cap = ZSTD_compressBound(sizeof src);
    unsigned char *frame = malloc(cap);
    ASSERT_TRUE(frame != NULL);
    size_t n = ZSTD_compress(frame, cap, src, sizeof src, 3);
    ASSERT_TRUE(!ZSTD_isError(n) && n > 16);
    ASSERT_TRUE(refused(frame, n / 2)); /* header intact, data cut */
    ASSERT_TRUE(refused(frame, 5)); /* header cut */
    frame[0] ^= 0xff; /* bad magic */
    ASSERT_TRUE(refused(frame, n));
    free(frame);
}

TEST(refuses_content_size_mismatch) {
    /* Same raw block, header declaring one byte more than the block holds. */
    const unsigned char frame[] = {
        0x28, 0xb5, 0x2f, 0xfd, /* magic */
        0x20, /* single segment, 1-byte content size */
        0x05, /* content size 5 */
        0x21, 0x00, 0x00, /* last block, raw, 4 bytes */
        'a',  'b',  'c',  'd',
    };
    ASSERT_TRUE(refused(frame, sizeof frame));
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
