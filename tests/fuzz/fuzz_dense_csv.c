/*
 * fuzz_dense_csv.c - fuzz target for the dense-CSV routing importer (fmoe_import_dense_csv,
 * datasets/import_dense_csv.c, the FLAME-MoE layout) with a geometry of
 * 2 layers, 4 experts, top-2 and 2 tokens per request. The input holds both layer files,
 * separated by a line "--" ("layer 0\n--\nlayer 1"); without one, both layers read the
 * same bytes. Invariants: a failure carries a detail and leaves neither the output nor its
 * .partial; a success writes a trace that the reader opens.
 * Build and run: tests/fuzz/README.md.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fmoe/datasets.h"
#include "fmoe/error.h"
#include "fmoe/geometry.h"
#include "fmoe/trace.h"
#include "fuzz_file.h"
#include "fuzz_import.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);
int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    static char out[512], partial[600];
    if (!out[0]) {
        snprintf(out, sizeof out, "%s/out.h5", fuzz_dir());
        snprintf(partial, sizeof partial, "%s.partial", out);
    }
    size_t cut = size, next = size;
    for (size_t i = 0; i + 3 <= size; i++)
        if (data[i] == '\n' && data[i + 1] == '-' && data[i + 2] == '-') {
            cut = i + 1;
            next = i + 3 < size && data[i + 3] == '\n' ? i + 4 : i + 3;
            break;
        }
    const char *files[2];
    files[0] = fuzz_memfile(0, data, cut);
    files[1] = cut < size ? fuzz_memfile(1, data + next, size - next) : files[0];
    fmoe_model_geometry g;
    fmoe_geometry_generic(2, 4, 2, 0, &g);
    fmoe_import_options o = {.geometry = &g, .write = {.compression = FMOE_COMPRESSION_NONE}};
    fmoe_import_report rep;
    fmoe_error_clear();
    int rc = fmoe_import_dense_csv(files, 2, 2, &o, out, &rep);
    fuzz_check_import("fuzz_dense_csv", rc, out, partial);
    return 0;
}
