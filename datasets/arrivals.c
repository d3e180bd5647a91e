/*
 * arrivals.c - the Azure LLM inference arrival trace (Patel et al., "Splitwise", ISCA
 * 2024; github.com/Azure/AzurePublicDataset, AzureLLMInferenceTrace_{code,conv}.csv).
 *
 *     TIMESTAMP,ContextTokens,GeneratedTokens
 *     2023-11-16 18:17:03.9799600,4808,10
 *
 * Timestamps are civil times without a zone; only differences matter, so they are turned
 * into whole seconds since 1970 (proleptic Gregorian, no leap seconds) plus nanoseconds,
 * and arrival_s is the difference to the first row computed in integers first, so the
 * seven fractional digits survive (a double of seconds-since-1970 would keep only ~0.2 µs).
 * Rows must not go back in time. Blank lines are skipped.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datasets_impl.h"
#include "fmoe/datasets.h"
#include "fmoe/error.h"

static const char HEADER[] = "TIMESTAMP,ContextTokens,GeneratedTokens";

/* Days from 1970-01-01 to y-m-d (Howard Hinnant's days_from_civil). */
static int64_t days_from_civil(int64_t y, int m, int d) {
    y -= m <= 2;
    const int64_t era = (y >= 0 ? y : y - 399) / 400;
    const int64_t yoe = y - era * 400;
    const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static int days_in_month(int y, int m) {
    static const int n[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return m == 2 ? 28 + leap : n[m - 1];
}

/* Reads exactly `n` digits. */
static int digits(const char **p, const char *end, int n, int *out) {
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (*p >= end || **p < '0' || **p > '9') return -1;
        v = v * 10 + (**p - '0');
        (*p)++;
    }
    *out = v;
    return 0;
}

static int expect(const char **p, const char *end, char c) {
    if (*p >= end || **p != c) return -1;
    (*p)++;
    return 0;
}

/* "YYYY-MM-DD HH:MM:SS[.f...]" (or 'T' between date and time) -> seconds + nanoseconds. */
static int parse_timestamp(const char *s, const char *end, int64_t *sec, int64_t *nsec) {
    const char *p = s;
    int y, mo, d, h, mi, se;
    if (digits(&p, end, 4, &y) || expect(&p, end, '-') || digits(&p, end, 2, &mo) ||
        expect(&p, end, '-') || digits(&p, end, 2, &d))
        return -1;
    if (p >= end || (*p != ' ' && *p != 'T')) return -1;
    p++;
    if (digits(&p, end, 2, &h) || expect(&p, end, ':') || digits(&p, end, 2, &mi) ||
        expect(&p, end, ':') || digits(&p, end, 2, &se))
        return -1;
    if (mo < 1 || mo > 12 || d < 1 || d > days_in_month(y, mo) || h > 23 || mi > 59 || se > 60)
        return -1;
    int64_t ns = 0;
    if (p < end && *p == '.') {
        p++;
        int n = 0;
        while (p < end && *p >= '0' && *p <= '9') {
            if (n < 9) ns = ns * 10 + (*p - '0');
            n++;
            p++;
        }
        if (n == 0) return -1;
        for (int i = n; i < 9; i++) ns *= 10;
    }
    if (p != end) return -1;
    *sec = days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + se;
    *nsec = ns;
    return 0;
}

/* A non-negative decimal integer that fits int32, spanning [s, end) exactly. */
static int parse_count(const char *s, const char *end, int32_t *out) {
    if (s == end) return -1;
    int64_t v = 0;
    for (const char *p = s; p < end; p++) {
        if (*p < '0' || *p > '9') return -1;
        v = v * 10 + (*p - '0');
        if (v > INT32_MAX) return -1;
    }
    *out = (int32_t)v;
    return 0;
}

void fmoe_arrivals_free(fmoe_arrivals *a) {
    if (!a) return;
    free(a->arrival_s);
    free(a->context_tokens);
    free(a->generated_tokens);
    free(a);
}

int fmoe_arrivals_load_azure(const char *path, fmoe_arrivals **out) {
    *out = NULL;
    char *base = NULL;
    const char *data;
    size_t len;
    FMOE_FORWARD_IF_ERROR(fmoe__ds_read_file(path, &base, &data, &len));

    int rc = 0;
    fmoe_arrivals *a = calloc(1, sizeof *a);
    /* One row per line at most: size the arrays once. */
    int64_t rows = 1;
    for (size_t i = 0; i < len; i++) rows += data[i] == '\n';
    if (a) {
        a->arrival_s = malloc((size_t)rows * sizeof *a->arrival_s);
        a->context_tokens = malloc((size_t)rows * sizeof *a->context_tokens);
        a->generated_tokens = malloc((size_t)rows * sizeof *a->generated_tokens);
    }
    if (!a || !a->arrival_s || !a->context_tokens || !a->generated_tokens) {
        rc = fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", path);
        goto fail;
    }

    fmoe__ds_line_iter it;
    fmoe__ds_line ln = {"", 0, 0};
    fmoe__ds_line_iter_init(&it, data, len);
    if (!fmoe__ds_line_next(&it, &ln) || ln.len != sizeof HEADER - 1 ||
        memcmp(ln.begin, HEADER, ln.len) != 0) {
        rc = fmoe_error_set(FMOE_EFORMAT, "%s:1: header is '%.*s', expected '%s'", path,
                            (int)(ln.len > 80 ? 80 : ln.len), ln.begin,
                            HEADER);
        goto fail;
    }
    int64_t sec0 = 0, nsec0 = 0, prev_sec = 0, prev_nsec = 0;
    while (fmoe__ds_line_next(&it, &ln)) {
        if (fmoe__ds_is_blank(ln.begin, ln.len)) continue;
        const char *b = ln.begin, *e = ln.begin + ln.len;
        const char *c1 = memchr(b, ',', ln.len);
        const char *c2 = c1 ? memchr(c1 + 1, ',', (size_t)(e - c1 - 1)) : NULL;
        if (!c1 || !c2 || memchr(c2 + 1, ',', (size_t)(e - c2 - 1))) {
            rc = fmoe_error_set(FMOE_EFORMAT, "%s:%lld: expected 3 comma-separated fields",
                                path, (long long)ln.number);
            goto fail;
        }
        int64_t sec, nsec;
        int32_t ctx, gen;
        if (parse_timestamp(b, c1, &sec, &nsec) < 0) {
            rc = fmoe_error_set(FMOE_EFORMAT,
                                "%s:%lld: bad timestamp '%.*s' (expected YYYY-MM-DD "
                                "HH:MM:SS[.fraction])",
                                path, (long long)ln.number, (int)(c1 - b > 64 ? 64 : c1 - b),
                                b);
            goto fail;
        }
        if (parse_count(c1 + 1, c2, &ctx) < 0 || parse_count(c2 + 1, e, &gen) < 0) {
            rc = fmoe_error_set(FMOE_EFORMAT,
                                "%s:%lld: ContextTokens and GeneratedTokens must be "
                                "non-negative integers",
                                path, (long long)ln.number);
            goto fail;
        }
        if (a->count == 0) {
            sec0 = sec;
            nsec0 = nsec;
        } else if (sec < prev_sec || (sec == prev_sec && nsec < prev_nsec)) {
            rc = fmoe_error_set(FMOE_EFORMAT,
                                "%s:%lld: timestamp goes back in time (rows must be sorted)",
                                path, (long long)ln.number);
            goto fail;
        }
        prev_sec = sec;
        prev_nsec = nsec;
        a->arrival_s[a->count] = (double)(sec - sec0) + (double)(nsec - nsec0) * 1e-9;
        a->context_tokens[a->count] = ctx;
        a->generated_tokens[a->count] = gen;
        a->count++;
    }
    free(base);
    *out = a;
    return 0;
fail:
    fmoe_arrivals_free(a);
    free(base);
    return rc;
}
