/*
 * fmoe/log.h - logging through a callback that the CLI installs and tests capture.
 * Libraries never print: they call fmoe_log(), which does nothing until a sink is set.
 */
#ifndef FMOE_LOG_H
#define FMOE_LOG_H

typedef enum fmoe_log_level {
    FMOE_LOG_DEBUG = 0,
    FMOE_LOG_INFO = 1,
    FMOE_LOG_WARN = 2,
    FMOE_LOG_ERROR = 3,
} fmoe_log_level;

typedef void (*fmoe_log_fn)(void *ctx, fmoe_log_level level, const char *message);

/* Installs the process-wide sink (NULL removes it). Not thread-safe against fmoe_log. */
void fmoe_log_set_sink(fmoe_log_fn fn, void *ctx);

void fmoe_log(fmoe_log_level level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#endif
