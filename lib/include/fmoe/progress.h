/*
 * fmoe/progress.h - progress reporting for long work. Libraries call the callback; cmd/
 * draws the bar (on a terminal only). A NULL callback means no reporting.
 */
#ifndef FMOE_PROGRESS_H
#define FMOE_PROGRESS_H

#include <stdint.h>

/* `done` of `total` units (total <= 0: unknown); `unit` names them ("tokens", "bytes"). */
typedef void (*fmoe_progress_fn)(void *ctx, int64_t done, int64_t total, const char *unit);

typedef struct fmoe_progress {
    fmoe_progress_fn fn;
    void *ctx;
} fmoe_progress;

static inline void fmoe_progress_report(const fmoe_progress *p, int64_t done, int64_t total,
                                        const char *unit) {
    if (p && p->fn) p->fn(p->ctx, done, total, unit);
}

#endif
