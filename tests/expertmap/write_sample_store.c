/*
 * write_sample_store.c - writes the sample store of sample_store.h, or checks that a file
 * holds exactly it, for tests/python/test_store.py (h5py, hdf5plugin, h5dump). A test
 * helper; not installed.
 *
 *     write_sample_store OUT.h5 [zstd|deflate|none]
 *     write_sample_store --verify IN.h5
 *
 * --verify reads with fmoe's store reader: exit 0 when the file holds the sample, 1 with
 * the reader's error (or the first difference) on stderr.
 */
#include "sample_store.h"

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "--verify") == 0) {
        fmoe_store_file *f = NULL;
        int rc = fmoe_store_read(argv[2], 0, &f);
        if (rc < 0) {
            fprintf(stderr, "write_sample_store: %s\n", fmoe_error_detail());
            return 1;
        }
        const char *diff = ss_verify(f);
        if (diff) fprintf(stderr, "write_sample_store: %s: %s differs\n", argv[2], diff);
        fmoe_store_file_free(f);
        return diff ? 1 : 0;
    }
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: write_sample_store OUT.h5 [zstd|deflate|none]\n"
                        "       write_sample_store --verify IN.h5\n");
        return 2;
    }
    fmoe_trace_write_options o = {.compression = FMOE_COMPRESSION_ZSTD};
    if (argc == 3 && fmoe_compression_parse(argv[2], &o.compression) < 0) {
        fprintf(stderr, "write_sample_store: %s\n", fmoe_error_detail());
        return 2;
    }
    fmoe_store_file f;
    int rc = ss_make(&f);
    if (rc == 0) rc = fmoe_store_write(argv[1], &f, &o);
    fmoe_expertmap_free(f.store);
    if (rc < 0) {
        fprintf(stderr, "write_sample_store: %s\n", fmoe_error_detail());
        return 1;
    }
    return 0;
}
