/* error.c - status codes and the thread-local "what and where" detail string. */
#include "fmoe/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DETAIL_CAP 1024

static _Thread_local char detail[DETAIL_CAP];

const char *fmoe_strerror(int code) {
    switch (code) {
#define FMOE__ERROR_CASE(name, value, msg) \
    case value:                            \
        return msg;
        FMOE_ERROR_TABLE(FMOE__ERROR_CASE)
#undef FMOE__ERROR_CASE
    default:
        return "unknown error";
    }
}

int fmoe_error_setv(int code, const char *fmt, va_list ap) {
    vsnprintf(detail, sizeof detail, fmt, ap);
    return code;
}

int fmoe_error_set(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fmoe_error_setv(code, fmt, ap);
    va_end(ap);
    return code;
}

void fmoe_error_prefix(const char *fmt, ...) {
    char prefix[DETAIL_CAP];
    char old[DETAIL_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, detail, sizeof old);
    snprintf(detail, sizeof detail, "%.300s: %.700s", prefix, old);
}

const char *fmoe_error_detail(void) { return detail; }

void fmoe_error_clear(void) { detail[0] = '\0'; }

void fmoe__assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "fmoe: internal error: assertion '%s' failed at %s:%d\n", expr, file, line);
    abort();
}
