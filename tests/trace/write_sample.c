/*
 * write_sample.c - writes the deterministic sample trace of sample_trace.h, so that
 * independent readers (tests/python/test_trace_h5py.py: h5py, hdf5plugin, h5dump) can
 * check what fmoe writes. A test helper; not installed.
 *
 *     write_sample OUT.h5 [zstd|deflate|none] [f16|f32] [chunk_tokens]
 *     write_sample --verify IN.h5 [f16|f32]
 *
 * --verify opens a trace with fmoe's reader and checks it holds exactly the sample; the
 * Python tests use it on copies that h5py rewrote with hdf5plugin's zstd, to prove fmoe
 * reads files other tools write. Exit 0 when equal, 1 otherwise (reason on stderr).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/trace.h"
#include "sample_trace.h"

static int verify(const char *path, int half) {
    fmoe_trace_reader *r = NULL;
    int rc = fmoe_trace_reader_open(&r, path);
    if (rc < 0) {
        fprintf(stderr, "write_sample: %s: %s\n", fmoe_strerror(rc), fmoe_error_detail());
        return 1;
    }
    char why[256];
    const char *diff = sample_verify(r, SAMPLE_R, half, why, sizeof why);
    if (diff) fprintf(stderr, "write_sample: %s: %s (%s)\n", path, diff, fmoe_error_detail());
    fmoe_trace_reader_close(r);
    return diff ? 1 : 0;
}

static int parse_half(const char *s, int *half) {
    if (strcmp(s, "f16") != 0 && strcmp(s, "f32") != 0) {
        fprintf(stderr, "write_sample: probs type '%s', expected f16 or f32\n", s);
        return -1;
    }
    *half = strcmp(s, "f16") == 0;
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 3 && argc <= 4 && strcmp(argv[1], "--verify") == 0) {
        int half = 1;
        if (argc == 4 && parse_half(argv[3], &half) < 0) return 2;
        return verify(argv[2], half);
    }
    if (argc < 2 || argc > 5) {
        fprintf(stderr,
                "usage: %s OUT.h5 [zstd|deflate|none] [f16|f32] [chunk_tokens]\n"
                "       %s --verify IN.h5 [f16|f32]\n",
                argv[0], argv[0]);
        return 2;
    }
    fmoe_compression c = FMOE_COMPRESSION_ZSTD;
    if (argc > 2 && fmoe_compression_parse(argv[2], &c) < 0) {
        fprintf(stderr, "write_sample: %s\n", fmoe_error_detail());
        return 2;
    }
    int half = 1;
    if (argc > 3 && parse_half(argv[3], &half) < 0) return 2;
    long long chunk = argc > 4 ? atoll(argv[4]) : 0;
    int rc = sample_write(argv[1], c, half, chunk);
    if (rc < 0) {
        fprintf(stderr, "write_sample: %s: %s\n", fmoe_strerror(rc), fmoe_error_detail());
        return 1;
    }
    return 0;
}
