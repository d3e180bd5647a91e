/*
 * decision_log_compare.c - reading decision logs and comparing two (fmoe/decision_log.h),
 * for `fmoe compare-logs`.
 *
 * Both logs are streamed line by line through one reused getline buffer each: a long run's
 * log reaches gigabytes, and the totals need every line even when the logs part early.
 * Decision lines are read by a parser for exactly their flat shape (one object of string
 * and number values, each key of the format at most once) rather than by a general JSON
 * parser: it allocates nothing, and it refuses what the format does not allow. That
 * strictness matters here: a key it skipped would be a field the comparison silently
 * ignored. Key order and white space are not checked, so hand-written logs read too. The
 * header, whose "meta" is free JSON and which is read once, goes through cJSON.
 */
#include "decision_log_impl.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "fmoe/error.h"
#include "files.h"

#define READ_BUFFER_BYTES (1 << 20)

/* ---------------------------------------------------------------- one decision line */

enum line_key {
    KEY_EVENT, KEY_ITERATION, KEY_LAYER, KEY_EXPERT, KEY_SLOT, KEY_VICTIM, KEY_RESULT,
    KEY_PRIORITY, KEY_T, NUM_KEYS
};
static const char *const key_names[NUM_KEYS] = {
    "event", "iteration", "layer", "expert", "slot", "victim", "result", "priority", "t",
};

typedef struct cursor {
    const char *start, *p, *end;
    char *why;  /* what is wrong, for the caller's "F:LINE: why" */
    size_t why_cap;
} cursor;

static int fail(cursor *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(cursor *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->why, c->why_cap, fmt, ap);
    va_end(ap);
    return -1;
}

static void skip_space(cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t')) c->p++;
}

static int expect(cursor *c, char ch) {
    skip_space(c);
    if (c->p >= c->end || *c->p != ch)
        return fail(c, "expected '%c' at column %td", ch, c->p - c->start + 1);
    c->p++;
    return 0;
}

/* A string without escapes (no name of this format needs one). */
static int scan_string(cursor *c, const char **s, size_t *n) {
    skip_space(c);
    if (c->p >= c->end || *c->p != '"') return fail(c, "expected a string");
    const char *start = ++c->p;
    while (c->p < c->end && *c->p != '"') {
        if (*c->p == '\\' || (unsigned char)*c->p < 0x20)
            return fail(c, "escapes and control characters are not part of this format");
        c->p++;
    }
    if (c->p >= c->end) return fail(c, "unterminated string");
    *s = start;
    *n = (size_t)(c->p - start);
    c->p++;
    return 0;
}

static int is_digit(const char *p, const char *end) { return p < end && *p >= '0' && *p <= '9'; }

/* The length of the JSON number at p (RFC 8259 grammar: strtod alone would also take
 * "0x1p3", "inf" or "1."), 0 when there is none. *integer: no fraction, no exponent. */
static size_t scan_number(const char *p, const char *end, int *integer) {
    const char *q = p;
    *integer = 1;
    if (q < end && *q == '-') q++;
    if (q < end && *q == '0') {
        q++;
    } else if (is_digit(q, end)) {
        while (is_digit(q, end)) q++;
    } else {
        return 0;
    }
    if (q < end && *q == '.') {
        *integer = 0;
        if (!is_digit(++q, end)) return 0;
        while (is_digit(q, end)) q++;
    }
    if (q < end && (*q == 'e' || *q == 'E')) {
        *integer = 0;
        q++;
        if (q < end && (*q == '+' || *q == '-')) q++;
        if (!is_digit(q, end)) return 0;
        while (is_digit(q, end)) q++;
    }
    return (size_t)(q - p);
}

static int parse_integer(cursor *c, const char *key, int64_t min, int64_t max, int64_t *out) {
    skip_space(c);
    int integer = 0;
    const size_t n = scan_number(c->p, c->end, &integer);
    if (n == 0 || !integer) return fail(c, "\"%s\" must be an integer", key);
    /* The line is NUL-terminated and the number is followed by a non-digit, so strtoll
     * stops where the scan did. */
    errno = 0;
    const long long v = strtoll(c->p, NULL, 10);
    if (errno == ERANGE || v < min || v > max)
        return fail(c, "\"%s\" is %.*s, out of [%lld, %lld]", key, (int)n, c->p, (long long)min,
                    (long long)max);
    c->p += n;
    *out = v;
    return 0;
}

/* A JSON number, or the non-finite values as Python's json module writes them. */
static int parse_double(cursor *c, const char *key, double *out) {
    static const struct { const char *text; double value; } special[] = {
        {"NaN", NAN}, {"Infinity", INFINITY}, {"-Infinity", -INFINITY},
    };
    skip_space(c);
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) {
        const size_t n = strlen(special[i].text);
        if ((size_t)(c->end - c->p) >= n && memcmp(c->p, special[i].text, n) == 0) {
            c->p += n;
            *out = special[i].value;
            return 0;
        }
    }
    int integer = 0;
    const size_t n = scan_number(c->p, c->end, &integer);
    if (n == 0) return fail(c, "\"%s\" must be a number", key);
    char *e = NULL;
    *out = strtod(c->p, &e); /* ERANGE is fine: 1e999 is infinity, as in Python */
    if (e != c->p + n) return fail(c, "\"%s\" must be a number", key);
    c->p += n;
    return 0;
}

/* The index of the name s[0..n) in names[0..count), -1 when absent. */
static int find_name(const char *const *names, int count, const char *s, size_t n) {
    for (int i = 0; i < count; i++)
        if (strlen(names[i]) == n && memcmp(names[i], s, n) == 0) return i;
    return -1;
}

static int parse_enum(cursor *c, const char *key, const char *const *names, int count,
                      int *out) {
    const char *s;
    size_t n;
    if (scan_string(c, &s, &n) < 0) return fail(c, "\"%s\" must be a string", key);
    if ((*out = find_name(names, count, s, n)) < 0)
        return fail(c, "unknown %s \"%.*s\"", key, (int)(n < 40 ? n : 40), s);
    return 0;
}

static int parse_value(cursor *c, int key, fmoe_decision *d) {
    int64_t v = 0;
    int e = 0;
    switch (key) {
    case KEY_EVENT:
        if (parse_enum(c, "event", fmoe__decision_event_names, FMOE__DECISION_KINDS, &e) < 0)
            return -1;
        d->kind = (fmoe_decision_kind)e;
        return 0;
    case KEY_RESULT:
        if (parse_enum(c, "result", fmoe__access_result_names, FMOE__ACCESS_RESULTS, &e) < 0)
            return -1;
        d->result = e;
        return 0;
    case KEY_ITERATION:
        return parse_integer(c, "iteration", -1, INT64_MAX, &d->iteration);
    case KEY_PRIORITY: return parse_double(c, "priority", &d->priority);
    case KEY_T: return parse_double(c, "t", &d->time_s);
    default: break;
    }
    /* The int32 fields: layer and expert are >= 0, slot and victim -1 for none. */
    const int64_t min = key == KEY_LAYER || key == KEY_EXPERT ? 0 : -1;
    if (parse_integer(c, key_names[key], min, INT32_MAX, &v) < 0) return -1;
    int32_t *field = key == KEY_LAYER    ? &d->layer
                     : key == KEY_EXPERT ? &d->expert
                     : key == KEY_SLOT   ? &d->slot
                                         : &d->victim;
    *field = (int32_t)v;
    return 0;
}

/* Which keys a line of this kind carries beyond the ones every line has. */
static int kind_has_victim(fmoe_decision_kind k) {
    return k == FMOE_DECISION_PREFETCH || k == FMOE_DECISION_EVICT;
}
static int kind_has_priority(fmoe_decision_kind k) {
    return k == FMOE_DECISION_PREFETCH || k == FMOE_DECISION_PROMOTE;
}

/* Every line has event, iteration, layer, expert, slot and t; result exactly on access,
 * priority exactly on prefetch and promote, victim only on prefetch and evict. */
static int check_keys(cursor *c, const int *seen, const fmoe_decision *d) {
    static const int required[] = {KEY_EVENT, KEY_ITERATION, KEY_LAYER, KEY_EXPERT, KEY_SLOT,
                                   KEY_T};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        if (!seen[required[i]]) return fail(c, "no \"%s\"", key_names[required[i]]);
    const char *event = fmoe__decision_event_names[d->kind];
    const int access = d->kind == FMOE_DECISION_ACCESS;
    if (access != seen[KEY_RESULT])
        return fail(c, access ? "an access without \"result\"" : "\"result\" on a %s line",
                    event);
    if (kind_has_priority(d->kind) != seen[KEY_PRIORITY])
        return fail(c,
                    seen[KEY_PRIORITY] ? "\"priority\" on a %s line" : "a %s without \"priority\"",
                    event);
    if (seen[KEY_VICTIM] && !kind_has_victim(d->kind))
        return fail(c, "\"victim\" on a %s line", event);
    return 0;
}

/* Parses line[0..len) (NUL-terminated at len) into *d. @return 0, or -1 with c's why. */
static int parse_decision(const char *line, size_t len, fmoe_decision *d, char *why,
                          size_t why_cap) {
    cursor c = {.start = line, .p = line, .end = line + len, .why = why, .why_cap = why_cap};
    int seen[NUM_KEYS] = {0};
    *d = (fmoe_decision){.victim = -1, .slot = -1};
    if (expect(&c, '{') < 0) return -1;
    skip_space(&c);
    if (c.p < c.end && *c.p == '}') return fail(&c, "an empty object");
    for (;;) {
        const char *name;
        size_t n;
        if (scan_string(&c, &name, &n) < 0) return fail(&c, "expected a key");
        const int key = find_name(key_names, NUM_KEYS, name, n);
        if (key < 0) return fail(&c, "unknown key \"%.*s\"", (int)(n < 40 ? n : 40), name);
        if (seen[key]) return fail(&c, "\"%s\" twice", key_names[key]);
        seen[key] = 1;
        if (expect(&c, ':') < 0 || parse_value(&c, key, d) < 0) return -1;
        skip_space(&c);
        if (c.p < c.end && *c.p == ',') {
            c.p++;
            continue;
        }
        if (c.p < c.end && *c.p == '}') {
            c.p++;
            break;
        }
        return fail(&c, "expected ',' or '}' after \"%s\" at column %td", key_names[key],
                    c.p - c.start + 1);
    }
    skip_space(&c);
    if (c.p != c.end) return fail(&c, "text after the object");
    return check_keys(&c, seen, d);
}

/* ---------------------------------------------------------------- one log */

typedef struct log_reader {
    const char *path;
    FILE *f;
    char *buffer;   /* stdio's, [READ_BUFFER_BYTES] */
    char *line;     /* getline's, grown to the longest line, reused */
    size_t cap;
    size_t len;     /* of the current line, its newline removed */
    int64_t lineno; /* of the current line, 1-based */
    fmoe_decision_log_totals *totals;
} log_reader;

static void reader_close(log_reader *r) {
    if (r->f) fclose(r->f);
    free(r->line);
    free(r->buffer);
    memset(r, 0, sizeof *r);
}

/* The next line into r->line; *eof = 1 at the end of the file. */
static int read_line(log_reader *r, int *eof) {
    *eof = 0;
    errno = 0;
    ssize_t n = getline(&r->line, &r->cap, r->f);
    if (n < 0) {
        if (errno == ENOMEM)
            return fmoe_error_set(FMOE_ENOMEM, "%s:%lld: line too long for memory", r->path,
                                  (long long)r->lineno + 1);
        if (ferror(r->f))
            return fmoe_error_set(FMOE_EIO, "%s: cannot read: %s", r->path, strerror(errno));
        *eof = 1;
        return 0;
    }
    r->lineno++;
    if (n > 0 && r->line[n - 1] == '\n') r->line[--n] = '\0';
    if (n > 0 && r->line[n - 1] == '\r') r->line[--n] = '\0'; /* a log edited on Windows */
    r->len = (size_t)n;
    return 0;
}

static int check_header(log_reader *r) {
    cJSON *h = cJSON_ParseWithLength(r->line, r->len);
    const cJSON *version = cJSON_GetObjectItemCaseSensitive(h, "fmoe_decision_log");
    const cJSON *source = cJSON_GetObjectItemCaseSensitive(h, "source");
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(h, "meta");
    int rc = 0;
    if (!cJSON_IsObject(h) || !cJSON_IsNumber(version))
        rc = fmoe_error_set(FMOE_EFORMAT,
                            "%s:1: not a decision log header (expected {\"fmoe_decision_log\":%d,"
                            "\"source\":...})",
                            r->path, FMOE_DECISION_LOG_VERSION);
    else if (version->valuedouble != FMOE_DECISION_LOG_VERSION)
        rc = fmoe_error_set(FMOE_EUNSUPPORTED,
                            "%s:1: decision log version %g; this fmoe reads version %d", r->path,
                            version->valuedouble, FMOE_DECISION_LOG_VERSION);
    else if (!cJSON_IsString(source))
        rc = fmoe_error_set(FMOE_EFORMAT, "%s:1: the header has no \"source\" string", r->path);
    else if (meta && !cJSON_IsObject(meta))
        rc = fmoe_error_set(FMOE_EFORMAT, "%s:1: the header's \"meta\" is not an object", r->path);
    cJSON_Delete(h);
    return rc;
}

static int reader_open(log_reader *r, const char *path, fmoe_decision_log_totals *totals) {
    *r = (log_reader){.path = path, .totals = totals};
    /* regular files only (lib/files.h): a FIFO would block the open, /dev/zero one line
     * without end */
    struct stat st;
    if (stat(path, &st) != 0 && errno == ENOENT)
        return fmoe_error_set(FMOE_ENOTFOUND, "%s: cannot open: %s", path, strerror(ENOENT));
    FMOE_FORWARD_IF_ERROR(fmoe__fopen_regular(path, &r->f));
    /* Without its own buffer, stdio reads in 4 KiB pieces. Not fatal when it is missing. */
    if ((r->buffer = malloc(READ_BUFFER_BYTES)))
        setvbuf(r->f, r->buffer, _IOFBF, READ_BUFFER_BYTES);
    int eof = 0;
    FMOE_FORWARD_IF_ERROR(read_line(r, &eof));
    FMOE_RETURN_ERROR_IF(eof, FMOE_EFORMAT, "%s:1: empty file, expected a decision log header",
                         path);
    return check_header(r);
}

static void count(fmoe_decision_log_totals *t, const fmoe_decision *d) {
    t->lines++;
    t->by_kind[d->kind]++;
    if (d->kind != FMOE_DECISION_ACCESS) return;
    if (d->result == FMOE_ACCESS_HIT) t->hits++;
    else if (d->result == FMOE_ACCESS_LATE_HIT) t->late++;
    else t->misses++;
}

/* The next compared decision (landed lines are counted and passed over); *eof at the end. */
static int reader_next(log_reader *r, fmoe_decision *d, int *eof) {
    for (;;) {
        FMOE_FORWARD_IF_ERROR(read_line(r, eof));
        if (*eof) return 0;
        char why[200];
        if (parse_decision(r->line, r->len, d, why, sizeof why) < 0)
            return fmoe_error_set(FMOE_EFORMAT, "%s:%lld: %s", r->path, (long long)r->lineno, why);
        count(r->totals, d);
        if (d->kind != FMOE_DECISION_LANDED) return 0;
    }
}

/* ---------------------------------------------------------------- comparing */

static int same_double(double a, double b) { return a == b || (isnan(a) && isnan(b)); }

static int32_t compared_result(const fmoe_decision *d, int late_is_hit) {
    if (late_is_hit && d->result == FMOE_ACCESS_LATE_HIT) return FMOE_ACCESS_HIT;
    return d->result;
}

/* parse_decision leaves result, victim and priority at their defaults on the lines without
 * them, so comparing every field is comparing what the lines say. */
static int decisions_equal(const fmoe_decision *a, const fmoe_decision *b, int late_is_hit) {
    return a->kind == b->kind && a->iteration == b->iteration && a->layer == b->layer &&
           a->expert == b->expert && a->slot == b->slot && a->victim == b->victim &&
           compared_result(a, late_is_hit) == compared_result(b, late_is_hit) &&
           same_double(a->priority, b->priority);
}

/* The diverging line of one side: its number and text, or 0 and "" when it ended. */
static void note_side(const log_reader *r, int eof, int64_t *line, char *text, size_t cap) {
    *line = eof ? 0 : r->lineno;
    snprintf(text, cap, "%.*s", eof ? 0 : (int)(r->len < cap ? r->len : cap - 1), r->line);
}

int fmoe_decision_log_compare(const char *path_a, const char *path_b, int late_is_hit,
                              fmoe_decision_log_diff *out) {
    FMOE_RETURN_ERROR_IF(!path_a || !path_b || !out, FMOE_EINVAL,
                         "fmoe_decision_log_compare: NULL argument");
    memset(out, 0, sizeof *out);
    out->identical = 1;
    out->index = -1;
    log_reader a, b;
    memset(&b, 0, sizeof b);
    int rc = reader_open(&a, path_a, &out->ta);
    if (rc == 0) rc = reader_open(&b, path_b, &out->tb);
    /* Past the first divergence both files are still read to the end, for the totals and
     * so that a malformed line anywhere is reported. */
    for (int64_t index = 0; rc == 0; index++) {
        fmoe_decision da, db;
        int end_a = 0, end_b = 0;
        if ((rc = reader_next(&a, &da, &end_a)) < 0 || (rc = reader_next(&b, &db, &end_b)) < 0)
            break;
        if (end_a && end_b) break;
        if (out->identical && (end_a || end_b || !decisions_equal(&da, &db, late_is_hit))) {
            out->identical = 0;
            out->index = index;
            note_side(&a, end_a, &out->line_a, out->a, sizeof out->a);
            note_side(&b, end_b, &out->line_b, out->b, sizeof out->b);
        }
    }
    reader_close(&a);
    reader_close(&b);
    return rc;
}
