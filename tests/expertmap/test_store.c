/*
 * test_store.c - the store file (trace/store_*.c): round trips, the .partial protocol,
 * and refusals that name the file and the dataset.
 */
#include <unistd.h>

#include "harness.h"
#include "sample_store.h"

static void tmp_path(char *buf, size_t cap, const char *name) {
    const char *dir = getenv("TMPDIR");
    snprintf(buf, cap, "%s/fmoe-test-store-%d-%s", dir ? dir : "/tmp", (int)getpid(), name);
}

TEST(store_round_trip_all_compressions) {
    const char *codecs[] = {"zstd", "deflate", "none"};
    for (int c = 0; c < 3; c++) {
        char path[512], partial[600];
        tmp_path(path, sizeof path, codecs[c]);
        snprintf(partial, sizeof partial, "%s.partial", path);
        fmoe_store_file f;
        ASSERT_OK(ss_make(&f));
        fmoe_trace_write_options o = {.compression = FMOE_COMPRESSION_ZSTD};
        ASSERT_OK(fmoe_compression_parse(codecs[c], &o.compression));
        ASSERT_OK(fmoe_store_write(path, &f, &o));
        fmoe_expertmap_free(f.store);
        ASSERT_TRUE(access(partial, F_OK) != 0);
        fmoe_store_file *g = NULL;
        ASSERT_OK(fmoe_store_read(path, 0, &g));
        const char *diff = ss_verify(g);
        if (diff) HARNESS_FAIL("%s: %s differs", codecs[c], diff);
        /* the loaded store works: the matcher finds entry 3 from its own map */
        fmoe_matcher *m = NULL;
        ASSERT_OK(fmoe_matcher_init(&m, g->store, 1));
        ASSERT_OK(fmoe_matcher_trajectory_begin(m, 1));
        int32_t best;
        float score;
        for (int l = 0; l < SS_L; l++) {
            float row[SS_J];
            for (int j = 0; j < SS_J; j++) row[j] = ss_map(3, l, j);
            ASSERT_OK(fmoe_matcher_trajectory_add(m, l, row, SS_J, &best, &score));
        }
        ASSERT_NEAR(score, 1.0, 1e-6);
        float got[SS_J];
        fmoe_expertmap_get_row(g->store, best, 1, got);
        ASSERT_EQ(got[1], ss_map(3, 1, 1));
        fmoe_matcher_free(m);
        fmoe_store_file_free(g);
        unlink(path);
    }
}

TEST(store_finds_its_source_trace) {
    fmoe_store_file f;
    ASSERT_OK(ss_make(&f));
    fmoe_trace_header h;
    memset(&h, 0, sizeof h);
    snprintf(h.created, sizeof h.created, "2026-01-02T00:00:00Z");
    ASSERT_EQ(fmoe_store_find_source(&f, &h, 3, "/elsewhere/b.h5"), 1);
    ASSERT_EQ(fmoe_store_find_source(&f, &h, 4, "b.h5"), -1); /* other request count */
    snprintf(h.created, sizeof h.created, "2026-01-01T00:00:00Z");
    ASSERT_EQ(fmoe_store_find_source(&f, &h, 4, NULL), 0);
    fmoe_expertmap_free(f.store);
}

TEST(store_reader_refuses_what_is_not_a_store) {
    char path[512];
    tmp_path(path, sizeof path, "notastore");
    fmoe_store_file *g = NULL;
    ASSERT_EQ(fmoe_store_read(path, 0, &g), FMOE_EIO); /* missing */
    ASSERT_CONTAINS(fmoe_error_detail(), path);
    FILE *fp = fopen(path, "w");
    ASSERT_TRUE(fp != NULL);
    fputs("not hdf5 at all\n", fp);
    fclose(fp);
    ASSERT_EQ(fmoe_store_read(path, 0, &g), FMOE_EFORMAT);
    ASSERT_CONTAINS(fmoe_error_detail(), "not an HDF5 file");
    unlink(path);
    ASSERT_TRUE(g == NULL);
}

TEST(store_writer_refuses_bad_fields) {
    char path[512];
    tmp_path(path, sizeof path, "bad");
    fmoe_store_file f;
    ASSERT_OK(ss_make(&f));
    f.split = 0;
    ASSERT_EQ(fmoe_store_write(path, &f, NULL), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "split");
    f.split = 0.7;
    int32_t bad[3] = {0, 2, 0};
    f.used_source = bad;
    ASSERT_EQ(fmoe_store_write(path, &f, NULL), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "source 2 of 2");
    ASSERT_TRUE(access(path, F_OK) != 0);
    fmoe_expertmap_free(f.store);
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
