/*
 * fuzz_arrivals.c - fuzz target for the Azure LLM inference trace reader
 * (fmoe_arrivals_load_azure, datasets/arrivals.c). The reader opens a
 * path, so the input goes into a memfd (fuzz_file.h). Invariants: a failure carries a
 * detail; a success has non-negative, non-decreasing arrival times and token counts.
 * Build and run: tests/fuzz/README.md.
 */
#include <stdio.h>
#include <stdlib.h>

#include "fmoe/datasets.h"
#include "fmoe/error.h"
#include "fuzz_file.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);
int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    const char *path = fuzz_memfile(0, data, size);
    fmoe_arrivals *a = NULL;
    fmoe_error_clear();
    int rc = fmoe_arrivals_load_azure(path, &a);
    if (rc < 0 && !fmoe_error_detail()[0]) {
        fprintf(stderr, "fuzz_arrivals: error %d without a detail\n", rc);
        abort();
    }
    for (int64_t i = 0; rc == 0 && i < a->count; i++)
        if (!(a->arrival_s[i] >= 0) || a->context_tokens[i] < 0 || a->generated_tokens[i] < 0 ||
            (i > 0 && a->arrival_s[i] < a->arrival_s[i - 1])) {
            fprintf(stderr, "fuzz_arrivals: row %lld out of range or order\n", (long long)i);
            abort();
        }
    fmoe_arrivals_free(a);
    return 0;
}
