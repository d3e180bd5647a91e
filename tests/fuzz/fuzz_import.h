/*
 * fuzz_import.h - what every importer fuzz target checks after an import: a failure has a
 * detail and leaves no file (neither the output nor its .partial); a success is a trace
 * that reads. Aborts (a finding) otherwise.
 */
#ifndef FMOE_TESTS_FUZZ_IMPORT_H
#define FMOE_TESTS_FUZZ_IMPORT_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "fmoe/error.h"
#include "fmoe/trace.h"

static inline void fuzz_check_import(const char *target, int rc, const char *out,
                                     const char *partial) {
    if (rc < 0 && !fmoe_error_detail()[0]) {
        fprintf(stderr, "%s: error %d without a detail\n", target, rc);
        abort();
    }
    if (rc < 0 && (access(out, F_OK) == 0 || access(partial, F_OK) == 0)) {
        fprintf(stderr, "%s: a failed import left a file behind\n", target);
        abort();
    }
    if (rc == 0) {
        fmoe_trace_reader *r = NULL;
        if (fmoe_trace_reader_open(&r, out) < 0) {
            fprintf(stderr, "%s: the imported trace does not read: %s\n", target,
                    fmoe_error_detail());
            abort();
        }
        fmoe_trace_reader_close(r);
        unlink(out);
    }
}

#endif
