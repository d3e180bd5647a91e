/*
 * fuzz_store.c - fuzz target for the expert-map store reader (trace/store_reader.c):
 * the input is the bytes of a store file, opened through HDF5's
 * in-memory (core) driver by fmoe__store_read_image (trace_impl.h). A failure must carry
 * a detail; a success must have its source and request tables inside their bounds.
 * Seeds: small stores written by fmoe build-store (tests/fuzz/README.md).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "fmoe/error.h"
#include "fmoe/store.h"
#include "trace_impl.h"

static void fail(const char *what) {
    fprintf(stderr, "fuzz_store: %s (%s)\n", what, fmoe_error_detail());
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fmoe_store_file *f = NULL;
    fmoe_error_clear();
    int rc = fmoe__store_read_image(data, size, "fuzz.h5", 4, &f);
    if (rc < 0) {
        if (!fmoe_error_detail()[0]) fail("error without a detail");
        return 0;
    }
    if (!f->store || f->num_sources < 0 || f->num_used < 0 || f->num_held_out < 0)
        fail("accepted bad counts");
    for (int64_t i = 0; i < f->num_used; i++)
        if (f->used_source[i] < 0 || f->used_source[i] >= f->num_sources) fail("bad used_source");
    for (int64_t i = 0; i < f->num_held_out; i++)
        if (f->held_out_source[i] < 0 || f->held_out_source[i] >= f->num_sources)
            fail("bad held_out_source");
    fmoe_store_file_free(f);
    return 0;
}
