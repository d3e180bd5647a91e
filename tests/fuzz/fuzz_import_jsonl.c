/*
 * fuzz_import_jsonl.c - fuzz target for the JSON Lines routing-trace importer
 * (fmoe_import_jsonl, datasets/import_jsonl.c), with a geometry of 2
 * layers, 8 experts, top-2. The input goes into a memfd (fuzz_file.h), the output into a
 * private folder. Invariants: a failure carries a detail and leaves neither the output
 * nor its .partial; a success writes a trace that the reader opens.
 * Build and run: tests/fuzz/README.md.
 */
#include <stdio.h>
#include <stdlib.h>
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
    const char *in = fuzz_memfile(0, data, size);
    fmoe_model_geometry g;
    fmoe_geometry_generic(2, 8, 2, 0, &g);
    fmoe_import_options o = {.geometry = &g, .write = {.compression = FMOE_COMPRESSION_NONE},
                             .drop_incomplete = size > 0 && data[0] == ' '};
    fmoe_import_report rep;
    fmoe_error_clear();
    int rc = fmoe_import_jsonl(in, &o, out, &rep);
    fuzz_check_import("fuzz_import_jsonl", rc, out, partial);
    return 0;
}
