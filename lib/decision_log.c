/*
 * decision_log.c - writing the decision log (fmoe/decision_log.h).
 *
 * The writer sits on the executors' hot path: the simulator emits a few lines per access,
 * tens of millions in a long trace. So a line is formatted into a stack buffer and copied
 * into a 1 MiB buffer; nothing is allocated per line, and errors are remembered rather
 * than returned (the callback has no status to return).
 *
 * Crash safety: the log is written at F.partial and renamed (after an fsync) when closed,
 * so F is the whole log or absent whatever instant the process dies at. The buffer is our
 * own rather than stdio's and goes out only as whole lines (stdio would split a line at
 * its buffer's edge), so the .partial a killed run leaves holds whole lines, every one
 * of them a valid decision, up to the last write; only a write(2) cut by the kill itself
 * can end it with part of a line.
 */
#include "decision_log_impl.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fmoe/error.h"
#include "files.h"

/* Static asserts that the tables below follow the enums. */
_Static_assert(FMOE_DECISION_LANDED == FMOE__DECISION_KINDS - 1, "decision kinds");
_Static_assert(FMOE_ACCESS_MISS == 0 && FMOE_ACCESS_HIT == 1 && FMOE_ACCESS_LATE_HIT == 2,
               "access results");

const char *const fmoe__decision_event_names[FMOE__DECISION_KINDS] = {
    "access", "prefetch", "dropped", "cancel", "evict", "host", "promote", "landed",
};
const char *const fmoe__access_result_names[FMOE__ACCESS_RESULTS] = {"miss", "hit", "late"};

#define BUFFER_BYTES (1 << 20)
/* The longest line: the keys (~90 bytes), six integers of at most 20 characters and two
 * doubles of at most 24 (%.17g). */
#define LINE_CAP 384

struct fmoe_decision_log {
    int fd;         /* the .partial, or -1 once closed */
    char *path;     /* the final name */
    char *partial;  /* path + ".partial", the file being written */
    char *buffer;   /* [BUFFER_BYTES] whole lines not yet written */
    size_t used;    /* bytes of buffer in use */
    off_t written;  /* bytes of whole lines in the file (the header's included) */
    int error;      /* the first error (a negative code), 0 none */
    char detail[512]; /* its detail, restored at close (the thread-local one will be stale) */
};

/* Remembers the first error only: later ones are usually its consequences. */
static void remember(fmoe_decision_log *log, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void remember(fmoe_decision_log *log, int code, const char *fmt, ...) {
    if (log->error) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(log->detail, sizeof log->detail, fmt, ap);
    va_end(ap);
    log->error = code;
}

/* Writes out the buffered lines. A write that fails part way (a full disk takes what fits)
 * is cut back to the last whole line, so the .partial left ends with a whole decision. */
static void flush_buffer(fmoe_decision_log *log) {
    if (log->used == 0 || log->fd < 0 || log->error) {
        log->used = 0;
        return;
    }
    if (fmoe__write_all(log->fd, log->buffer, log->used) != 0) {
        const int e = errno;
        if (ftruncate(log->fd, log->written) == 0) lseek(log->fd, log->written, SEEK_SET);
        remember(log, FMOE_EIO, "%s: cannot write: %s", log->partial, strerror(e));
    } else {
        log->written += (off_t)log->used;
    }
    log->used = 0;
}

/* Adds one whole line (n <= LINE_CAP) to the buffer, writing the buffer out first when the
 * line does not fit, so a write never ends inside a line. */
static void put_line(fmoe_decision_log *log, const char *line, size_t n) {
    if (log->used + n > BUFFER_BYTES) flush_buffer(log);
    memcpy(log->buffer + log->used, line, n);
    log->used += n;
}

/* Writes x in the shortest "%.Ng" that reads back as x (N = 15, 16 or 17: 17 always
 * does), so priorities compare exactly after a round trip and common values stay short.
 * Non-finite values as Python's json module writes them, which it also reads. */
static int format_double(char *out, size_t cap, double x) {
    if (isnan(x)) return snprintf(out, cap, "NaN");
    if (isinf(x)) return snprintf(out, cap, "%s", x > 0 ? "Infinity" : "-Infinity");
    for (int prec = 15; prec < 17; prec++) {
        int n = snprintf(out, cap, "%.*g", prec, x);
        if (strtod(out, NULL) == x) return n;
    }
    return snprintf(out, cap, "%.17g", x);
}

/* Appends to line[*n..cap); the caller sized the buffer for the longest line. */
static void put(char *line, size_t *n, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void put(char *line, size_t *n, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(line + *n, cap - *n, fmt, ap);
    va_end(ap);
    if (k > 0) *n += (size_t)k < cap - *n ? (size_t)k : cap - *n - 1;
}

static void put_double(char *line, size_t *n, size_t cap, const char *key, double x) {
    char num[32];
    format_double(num, sizeof num, x);
    put(line, n, cap, ",\"%s\":%s", key, num);
}

void fmoe_decision_log_write(void *ctx, const fmoe_decision *d) {
    fmoe_decision_log *log = ctx;
    if (!log || !d || log->error) return;
    if ((unsigned)d->kind >= FMOE__DECISION_KINDS) {
        remember(log, FMOE_EINVAL, "%s: decision of unknown kind %d", log->partial, (int)d->kind);
        return;
    }
    const int access = d->kind == FMOE_DECISION_ACCESS;
    if (access && (d->result < 0 || d->result >= FMOE__ACCESS_RESULTS)) {
        remember(log, FMOE_EINVAL, "%s: access of unknown result %d", log->partial,
                 (int)d->result);
        return;
    }
    char line[LINE_CAP];
    size_t n = 0;
    put(line, &n, sizeof line,
        "{\"event\":\"%s\",\"iteration\":%" PRId64 ",\"layer\":%" PRId32 ",\"expert\":%" PRId32
        ",\"slot\":%" PRId32,
        fmoe__decision_event_names[d->kind], d->iteration, d->layer, d->expert, d->slot);
    if ((d->kind == FMOE_DECISION_PREFETCH || d->kind == FMOE_DECISION_EVICT) && d->victim >= 0)
        put(line, &n, sizeof line, ",\"victim\":%" PRId32, d->victim);
    if (access)
        put(line, &n, sizeof line, ",\"result\":\"%s\"", fmoe__access_result_names[d->result]);
    if (d->kind == FMOE_DECISION_PREFETCH || d->kind == FMOE_DECISION_PROMOTE)
        put_double(line, &n, sizeof line, "priority", d->priority);
    put_double(line, &n, sizeof line, "t", d->time_s);
    put(line, &n, sizeof line, "}\n");
    put_line(log, line, n);
}

/* ---------------------------------------------------------------- open and close */

/* The header line, malloc'd, without its newline: built with cJSON so that the source is
 * escaped and meta, however it was laid out, lands on one line. */
static int header_line(const char *path, const char *source, const char *meta_json, char **out) {
    cJSON *meta = NULL;
    if (meta_json) {
        meta = cJSON_Parse(meta_json);
        if (!cJSON_IsObject(meta)) {
            cJSON_Delete(meta);
            return fmoe_error_set(FMOE_EINVAL, "%s: the decision log's meta is not a JSON object",
                                  path);
        }
    }
    cJSON *h = cJSON_CreateObject();
    if (h && cJSON_AddNumberToObject(h, "fmoe_decision_log", FMOE_DECISION_LOG_VERSION) &&
        cJSON_AddStringToObject(h, "source", source) &&
        (!meta || cJSON_AddItemToObject(h, "meta", meta))) {
        meta = NULL; /* owned by h now */
        *out = cJSON_PrintUnformatted(h);
    } else {
        *out = NULL;
    }
    cJSON_Delete(meta);
    cJSON_Delete(h);
    return *out ? 0 : fmoe_error_set(FMOE_ENOMEM, "%s: decision log header", path);
}

static void log_free(fmoe_decision_log *log) {
    free(log->path);
    free(log->partial);
    free(log->buffer);
    free(log);
}

int fmoe_decision_log_open(fmoe_decision_log **out, const char *path, const char *source,
                           const char *meta_json) {
    FMOE_RETURN_ERROR_IF(!out || !path || !*path || !source, FMOE_EINVAL,
                         "fmoe_decision_log_open: NULL argument");
    *out = NULL;
    char *header = NULL;
    FMOE_FORWARD_IF_ERROR(header_line(path, source, meta_json, &header));
    fmoe_decision_log *log = calloc(1, sizeof *log);
    const size_t n = strlen(path);
    const size_t hn = strlen(header);
    int rc = 0;
    if (log) log->fd = -1;
    if (!log || !(log->path = malloc(n + 1)) || !(log->partial = malloc(n + sizeof ".partial")) ||
        !(log->buffer = malloc(BUFFER_BYTES))) {
        rc = fmoe_error_set(FMOE_ENOMEM, "%s: decision log buffers", path);
        goto fail;
    }
    memcpy(log->path, path, n + 1);
    memcpy(log->partial, path, n);
    memcpy(log->partial + n, ".partial", sizeof ".partial");
    if ((rc = fmoe__output_check(log->path)) < 0) goto fail;
    if ((log->fd = fmoe__partial_create(log->partial, O_WRONLY)) < 0) {
        rc = log->fd;
        goto fail;
    }
    /* the header goes out at once: a killed run's .partial still says what it is */
    if (fmoe__write_all(log->fd, header, hn) != 0 || fmoe__write_all(log->fd, "\n", 1) != 0) {
        rc = fmoe_error_set(FMOE_EIO, "%s: cannot write: %s", log->partial, strerror(errno));
        close(log->fd);
        unlink(log->partial);
        goto fail;
    }
    log->written = (off_t)hn + 1;
    free(header);
    *out = log;
    return 0;

fail:
    free(header);
    if (log) log_free(log);
    return rc;
}

int fmoe_decision_log_flush(void *ctx) {
    fmoe_decision_log *log = ctx;
    if (!log) return 0;
    flush_buffer(log);
    if (log->error) return fmoe_error_set(log->error, "%s", log->detail);
    return 0;
}

int fmoe_decision_log_close(fmoe_decision_log *log, int keep) {
    if (!log) return 0;
    /* the buffer first: with 1 MiB of it most write errors (a full disk) appear only here */
    flush_buffer(log);
    if (close(log->fd) != 0)
        remember(log, FMOE_EIO, "%s: cannot close: %s", log->partial, strerror(errno));
    log->fd = -1;
    if (!keep) {
        unlink(log->partial);
    } else if (log->error) {
        /* Like the trace writer: what was written before the failure stays for a look. */
        char why[sizeof log->detail];
        memcpy(why, log->detail, sizeof why);
        snprintf(log->detail, sizeof log->detail, "%.360s (left as it is, not renamed to %.100s)",
                 why, log->path);
    } else if (fmoe__partial_commit(log->partial, log->path) < 0) {
        remember(log, FMOE_EIO, "%s", fmoe_error_detail());
    }
    const int rc = log->error;
    if (rc) fmoe_error_set(rc, "%s", log->detail);
    log_free(log);
    return rc;
}
