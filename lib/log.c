/* log.c - logging through a callback; silent until cmd/ (or a test) installs a sink. */
#include "fmoe/log.h"

#include <stdarg.h>
#include <stdio.h>

static fmoe_log_fn sink_fn;
static void *sink_ctx;

void fmoe_log_set_sink(fmoe_log_fn fn, void *ctx) {
    sink_fn = fn;
    sink_ctx = ctx;
}

void fmoe_log(fmoe_log_level level, const char *fmt, ...) {
    if (!sink_fn) return;
    char message[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    sink_fn(sink_ctx, level, message);
}
