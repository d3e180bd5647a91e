/*
 * test_decision_log.c - the decision log (fmoe/decision_log.h): the writer's lines and its
 * .partial lifecycle, and the comparison behind `fmoe compare-logs` on logs that differ in
 * known places. Expected lines are written here from the format's description, not taken
 * from the writer.
 */
#include <errno.h>
#include <ftw.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fmoe/decision_log.h"
#include "fmoe/error.h"
#include "harness.h"

/* ---------------------------------------------------------------- scratch files */

static char scratch_dir[512];

static int rm_entry(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(p);
}

static void remove_scratch(void) {
    if (scratch_dir[0]) nftw(scratch_dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
}

/* "<scratch dir>/<name>" in a static buffer that the 8th next call reuses. */
static const char *tmp_path(const char *name) {
    static char bufs[8][1024];
    static int next;
    if (!scratch_dir[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(scratch_dir, sizeof scratch_dir, "%s/fmoe-test-dlog-XXXXXX",
                 base && base[0] ? base : "/tmp");
        if (!mkdtemp(scratch_dir)) {
            perror("mkdtemp");
            abort();
        }
        atexit(remove_scratch);
    }
    char *b = bufs[next++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", scratch_dir, name);
    return b;
}

static int file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

static const char *partial_of(const char *path) {
    static char b[1100];
    snprintf(b, sizeof b, "%s.partial", path);
    return b;
}

static int write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    int ok = fputs(text, f) != EOF;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* The whole file (malloc'd), NULL when it cannot be read. */
static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = calloc(1, 1 << 16);
    if (buf) fread(buf, 1, (1 << 16) - 1, f);
    fclose(f);
    return buf;
}

/* Line `n` (1-based) of text into out, without its newline; "" past the end. */
static const char *nth_line(const char *text, int n, char *out, size_t cap) {
    const char *p = text;
    for (int i = 1; i < n && p; i++) {
        p = strchr(p, '\n');
        if (p) p++;
    }
    const char *e = p ? strchr(p, '\n') : NULL;
    snprintf(out, cap, "%.*s", p ? (int)(e ? e - p : (ptrdiff_t)strlen(p)) : 0, p ? p : "");
    return out;
}

/* ---------------------------------------------------------------- decisions */

#define HEADER "{\"fmoe_decision_log\":1,\"source\":\"simulate\"}\n"

/* One decision of every kind, with the fields each kind carries. */
static const fmoe_decision every_kind[] = {
    {.kind = FMOE_DECISION_ACCESS, .iteration = 3, .layer = 1, .expert = 5, .slot = 2,
     .victim = -1, .result = FMOE_ACCESS_HIT, .time_s = 0.001234},
    {.kind = FMOE_DECISION_PREFETCH, .iteration = 3, .layer = 2, .expert = 0, .slot = 4,
     .victim = 13, .priority = 0.75, .time_s = 0.5},
    {.kind = FMOE_DECISION_DROPPED, .iteration = 3, .layer = 2, .expert = 1, .slot = -1,
     .victim = -1, .time_s = 0.5},
    {.kind = FMOE_DECISION_CANCEL, .iteration = 4, .layer = 2, .expert = 0, .slot = 4,
     .victim = -1, .time_s = 1},
    {.kind = FMOE_DECISION_EVICT, .iteration = 4, .layer = 0, .expert = 7, .slot = 1,
     .victim = 9, .time_s = 1.25},
    {.kind = FMOE_DECISION_HOST, .iteration = 4, .layer = 0, .expert = 6, .slot = -1,
     .victim = -1, .time_s = 1.5},
    {.kind = FMOE_DECISION_PROMOTE, .iteration = -1, .layer = 3, .expert = 2, .slot = 0,
     .victim = -1, .priority = -2, .time_s = 2},
    {.kind = FMOE_DECISION_LANDED, .iteration = 5, .layer = 3, .expert = 2, .slot = 0,
     .victim = -1, .time_s = 2.5},
    {.kind = FMOE_DECISION_ACCESS, .iteration = 5, .layer = 3, .expert = 2, .slot = 0,
     .victim = -1, .result = FMOE_ACCESS_LATE_HIT, .time_s = 3},
    {.kind = FMOE_DECISION_ACCESS, .iteration = 5, .layer = 3, .expert = 3, .slot = -1,
     .victim = -1, .result = FMOE_ACCESS_MISS, .time_s = 3.5},
};
#define NUM_EVERY (int)(sizeof every_kind / sizeof every_kind[0])

/* The same decisions as the format describes them, typed by hand: the lines a writer must
 * produce, key order included. */
static const char *const every_kind_lines[NUM_EVERY] = {
    "{\"event\":\"access\",\"iteration\":3,\"layer\":1,\"expert\":5,\"slot\":2,\"result\":\"hit\",\"t\":0.001234}",
    "{\"event\":\"prefetch\",\"iteration\":3,\"layer\":2,\"expert\":0,\"slot\":4,\"victim\":13,\"priority\":0.75,\"t\":0.5}",
    "{\"event\":\"dropped\",\"iteration\":3,\"layer\":2,\"expert\":1,\"slot\":-1,\"t\":0.5}",
    "{\"event\":\"cancel\",\"iteration\":4,\"layer\":2,\"expert\":0,\"slot\":4,\"t\":1}",
    "{\"event\":\"evict\",\"iteration\":4,\"layer\":0,\"expert\":7,\"slot\":1,\"victim\":9,\"t\":1.25}",
    "{\"event\":\"host\",\"iteration\":4,\"layer\":0,\"expert\":6,\"slot\":-1,\"t\":1.5}",
    "{\"event\":\"promote\",\"iteration\":-1,\"layer\":3,\"expert\":2,\"slot\":0,\"priority\":-2,\"t\":2}",
    "{\"event\":\"landed\",\"iteration\":5,\"layer\":3,\"expert\":2,\"slot\":0,\"t\":2.5}",
    "{\"event\":\"access\",\"iteration\":5,\"layer\":3,\"expert\":2,\"slot\":0,\"result\":\"late\",\"t\":3}",
    "{\"event\":\"access\",\"iteration\":5,\"layer\":3,\"expert\":3,\"slot\":-1,\"result\":\"miss\",\"t\":3.5}",
};

/* Writes decisions d[0..n) to path through the API and keeps the file. */
static int write_log(const char *path, const fmoe_decision *d, int n) {
    fmoe_decision_log *log = NULL;
    int rc = fmoe_decision_log_open(&log, path, "simulate", NULL);
    if (rc < 0) return rc;
    for (int i = 0; i < n; i++) fmoe_decision_log_write(log, &d[i]);
    return fmoe_decision_log_close(log, 1);
}

/* ---------------------------------------------------------------- the writer */

TEST(writer_lines_follow_the_format) {
    const char *path = tmp_path("every.jsonl");
    fmoe_decision_log *log = NULL;
    ASSERT_OK(fmoe_decision_log_open(&log, path, "simulate", "{\"policy\": \"lru\",\n \"capacity\": 8}"));
    ASSERT_TRUE(file_exists(partial_of(path)));
    ASSERT_TRUE(!file_exists(path));
    for (int i = 0; i < NUM_EVERY; i++) fmoe_decision_log_write(log, &every_kind[i]);
    ASSERT_OK(fmoe_decision_log_close(log, 1));
    ASSERT_TRUE(!file_exists(partial_of(path)));
    ASSERT_TRUE(file_exists(path));

    char *text = read_text(path);
    ASSERT_TRUE(text != NULL);
    char line[512];
    /* meta given on two lines lands on the header's one line */
    ASSERT_STR_EQ(nth_line(text, 1, line, sizeof line),
                  "{\"fmoe_decision_log\":1,\"source\":\"simulate\",\"meta\":{\"policy\":\"lru\","
                  "\"capacity\":8}}");
    for (int i = 0; i < NUM_EVERY; i++) {
        nth_line(text, i + 2, line, sizeof line);
        if (strcmp(line, every_kind_lines[i]) != 0) {
            free(text);
            HARNESS_FAIL("line %d: %s, expected %s", i + 2, line, every_kind_lines[i]);
        }
    }
    ASSERT_STR_EQ(nth_line(text, NUM_EVERY + 2, line, sizeof line), "");
    free(text);
}

TEST(writer_close_without_keep_leaves_nothing) {
    const char *path = tmp_path("dropped.jsonl");
    fmoe_decision_log *log = NULL;
    ASSERT_OK(fmoe_decision_log_open(&log, path, "generate", NULL));
    for (int i = 0; i < NUM_EVERY; i++) fmoe_decision_log_write(log, &every_kind[i]);
    ASSERT_OK(fmoe_decision_log_close(log, 0));
    ASSERT_TRUE(!file_exists(partial_of(path)));
    ASSERT_TRUE(!file_exists(path));
    ASSERT_EQ(fmoe_decision_log_close(NULL, 1), 0);
    fmoe_decision_log_write(NULL, &every_kind[0]); /* a no-op, not a crash */
}

TEST(writer_rejects_bad_arguments) {
    fmoe_decision_log *log = NULL;
    ASSERT_EQ(fmoe_decision_log_open(&log, tmp_path("m.jsonl"), "simulate", "[1, 2]"), FMOE_EINVAL);
    ASSERT_EQ(fmoe_decision_log_open(&log, tmp_path("m.jsonl"), "simulate", "{\"a\":"), FMOE_EINVAL);
    ASSERT_EQ(fmoe_decision_log_open(&log, NULL, "simulate", NULL), FMOE_EINVAL);
    ASSERT_TRUE(log == NULL);
    ASSERT_TRUE(!file_exists(partial_of(tmp_path("m.jsonl"))));
    const char *nodir = tmp_path("no/such/dir/x.jsonl");
    ASSERT_EQ(fmoe_decision_log_open(&log, nodir, "simulate", NULL), FMOE_EIO);
    ASSERT_CONTAINS(fmoe_error_detail(), "x.jsonl.partial");
}

/* A decision the format cannot say is the log's first error: close returns it and keeps
 * the .partial (what was written before it) instead of renaming it. */
TEST(writer_remembers_the_first_error) {
    const char *path = tmp_path("bad-kind.jsonl");
    fmoe_decision_log *log = NULL;
    ASSERT_OK(fmoe_decision_log_open(&log, path, "simulate", NULL));
    fmoe_decision_log_write(log, &every_kind[0]);
    fmoe_decision bad = every_kind[0];
    bad.result = 7;
    fmoe_decision_log_write(log, &bad);
    bad.kind = (fmoe_decision_kind)9;
    fmoe_decision_log_write(log, &bad);
    fmoe_error_clear();
    ASSERT_EQ(fmoe_decision_log_close(log, 1), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "unknown result 7");
    ASSERT_TRUE(file_exists(partial_of(path)));
    ASSERT_TRUE(!file_exists(path));
}

/* Priorities compare exactly, so the text must read back as the very same double. */
TEST(writer_priorities_round_trip) {
    fmoe_decision d = every_kind[1];
    d.priority = 0.1 + 0.2; /* 0.30000000000000004: 17 digits */
    const char *a = tmp_path("pri-a.jsonl"), *b = tmp_path("pri-b.jsonl");
    ASSERT_OK(write_log(a, &d, 1));
    ASSERT_OK(write_text(b, HEADER "{\"event\":\"prefetch\",\"iteration\":3,\"layer\":2,\"expert\":0,"
                                   "\"slot\":4,\"victim\":13,\"priority\":0.30000000000000004,\"t\":0}\n"));
    fmoe_decision_log_diff diff;
    ASSERT_OK(fmoe_decision_log_compare(a, b, 0, &diff));
    ASSERT_EQ(diff.identical, 1);
    ASSERT_OK(write_text(b, HEADER "{\"event\":\"prefetch\",\"iteration\":3,\"layer\":2,\"expert\":0,"
                                   "\"slot\":4,\"victim\":13,\"priority\":0.3,\"t\":0}\n"));
    ASSERT_OK(fmoe_decision_log_compare(a, b, 0, &diff));
    ASSERT_EQ(diff.identical, 0);
    ASSERT_EQ(diff.index, 0);
}

/* ---------------------------------------------------------------- comparing */

/* A copy of every_kind's lines as a file: header, then the lines, with `extra` (a whole
 * line, or NULL) put before line index `at` and line index `replace_at` replaced by
 * `replacement` (or dropped when it is "") and the lines from `stop` on left out. */
typedef struct edit {
    int at;
    const char *extra;
    int replace_at;
    const char *replacement;
    int stop;
} edit;

static int write_edited(const char *path, edit e) {
    char text[8192];
    size_t n = (size_t)snprintf(text, sizeof text, "%s", HEADER);
    const int stop = e.stop > 0 ? e.stop : NUM_EVERY;
    for (int i = 0; i < stop; i++) {
        if (e.extra && i == e.at) n += (size_t)snprintf(text + n, sizeof text - n, "%s\n", e.extra);
        const char *line = e.replacement && i == e.replace_at ? e.replacement : every_kind_lines[i];
        if (*line) n += (size_t)snprintf(text + n, sizeof text - n, "%s\n", line);
    }
    return write_text(path, text);
}

TEST(compare_identical_logs) {
    const char *a = tmp_path("same-a.jsonl"), *b = tmp_path("same-b.jsonl");
    ASSERT_OK(write_log(a, every_kind, NUM_EVERY));
    ASSERT_OK(write_edited(b, (edit){.at = -1})); /* the hand-typed lines */
    fmoe_decision_log_diff d;
    ASSERT_OK(fmoe_decision_log_compare(a, b, 0, &d));
    ASSERT_EQ(d.identical, 1);
    ASSERT_EQ(d.index, -1);
    ASSERT_EQ(d.line_a, 0);
    ASSERT_STR_EQ(d.a, "");
    /* totals, counted from every_kind by hand: 10 lines, 3 accesses (hit, late, miss) */
    ASSERT_EQ(d.ta.lines, 10);
    ASSERT_EQ(d.ta.by_kind[FMOE_DECISION_ACCESS], 3);
    for (int k = 1; k < 8; k++) ASSERT_EQ(d.ta.by_kind[k], 1);
    ASSERT_EQ(d.ta.hits, 1);
    ASSERT_EQ(d.ta.late, 1);
    ASSERT_EQ(d.ta.misses, 1);
    ASSERT_TRUE(memcmp(&d.ta, &d.tb, sizeof d.ta) == 0);
}

TEST(compare_finds_a_changed_slot) {
    /* every_kind index 4 (the evict) gets slot 3; B also has a landed line before it, so
     * its file line is one further on. Compared index 4: the landed line is index 7. */
    const char *a = tmp_path("slot-a.jsonl"), *b = tmp_path("slot-b.jsonl");
    const char *changed =
        "{\"event\":\"evict\",\"iteration\":4,\"layer\":0,\"expert\":7,\"slot\":3,\"victim\":9,\"t\":1.25}";
    ASSERT_OK(write_edited(a, (edit){.at = -1}));
    ASSERT_OK(write_edited(b, (edit){.at = 2,
                                     .extra = "{\"event\":\"landed\",\"iteration\":3,\"layer\":2,"
                                              "\"expert\":0,\"slot\":4,\"t\":0.75}",
                                     .replace_at = 4, .replacement = changed}));
    fmoe_decision_log_diff d;
    ASSERT_OK(fmoe_decision_log_compare(a, b, 0, &d));
    ASSERT_EQ(d.identical, 0);
    ASSERT_EQ(d.index, 4);
    ASSERT_EQ(d.line_a, 6); /* header + 5th decision */
    ASSERT_EQ(d.line_b, 7);
    ASSERT_STR_EQ(d.a, every_kind_lines[4]);
    ASSERT_STR_EQ(d.b, changed);
    ASSERT_EQ(d.ta.lines, 10);
    ASSERT_EQ(d.tb.lines, 11);
    ASSERT_EQ(d.tb.by_kind[FMOE_DECISION_LANDED], 2);
}

TEST(compare_each_field_matters) {
    static const char *const variants[] = {
        "{\"event\":\"evict\",\"iteration\":5,\"layer\":0,\"expert\":7,\"slot\":1,\"victim\":9,\"t\":1.25}",
        "{\"event\":\"evict\",\"iteration\":4,\"layer\":1,\"expert\":7,\"slot\":1,\"victim\":9,\"t\":1.25}",
        "{\"event\":\"evict\",\"iteration\":4,\"layer\":0,\"expert\":6,\"slot\":1,\"victim\":9,\"t\":1.25}",
        "{\"event\":\"evict\",\"iteration\":4,\"layer\":0,\"expert\":7,\"slot\":1,\"victim\":8,\"t\":1.25}",
        "{\"event\":\"evict\",\"iteration\":4,\"layer\":0,\"expert\":7,\"slot\":1,\"t\":1.25}",
        "{\"event\":\"prefetch\",\"iteration\":4,\"layer\":0,\"expert\":7,\"slot\":1,\"victim\":9,\"priority\":0,\"t\":1.25}",
    };
    const char *a = tmp_path("field-a.jsonl"), *b = tmp_path("field-b.jsonl");
    ASSERT_OK(write_edited(a, (edit){.at = -1}));
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        ASSERT_OK(write_edited(b, (edit){.at = -1, .replace_at = 4, .replacement = variants[v]}));
        fmoe_decision_log_diff d;
        ASSERT_OK(fmoe_decision_log_compare(a, b, 1, &d));
        if (d.identical || d.index != 4) HARNESS_FAIL("variant %zu: identical %d, index %lld", v,
                                                      d.identical, (long long)d.index);
    }
}

TEST(compare_ignores_timestamps_and_layout) {
    const char *a = tmp_path("time-a.jsonl"), *b = tmp_path("time-b.jsonl");
    ASSERT_OK(write_edited(a, (edit){.at = -1}));
    /* every t changed; one line with its keys reordered and spaced */
    fmoe_decision shifted[NUM_EVERY];
    for (int i = 0; i < NUM_EVERY; i++) {
        shifted[i] = every_kind[i];
        shifted[i].time_s = every_kind[i].time_s * 3 + 100;
    }
    ASSERT_OK(write_log(b, shifted, NUM_EVERY));
    fmoe_decision_log_diff d;
    ASSERT_OK(fmoe_decision_log_compare(a, b, 0, &d));
    ASSERT_EQ(d.identical, 1);
    ASSERT_OK(write_edited(b, (edit){.at = -1, .replace_at = 1,
                                     .replacement = " { \"t\" : 9 , \"priority\":7.5e-1,\"victim\":13,"
                                                    "\"slot\":4,\"expert\":0,\"layer\":2,"
                                                    "\"iteration\":3,\"event\":\"prefetch\" } "}));
    ASSERT_OK(fmoe_decision_log_compare(a, b, 0, &d));
    ASSERT_EQ(d.identical, 1);
}

TEST(compare_late_versus_hit) {
    /* index 7 among compared decisions: the late access (every_kind 8, after the landed) */
    const char *a = tmp_path("late-a.jsonl"), *b = tmp_path("late-b.jsonl");
    const char *hit =
        "{\"event\":\"access\",\"iteration\":5,\"layer\":3,\"expert\":2,\"slot\":0,\"result\":\"hit\",\"t\":3}";
    ASSERT_OK(write_edited(a, (edit){.at = -1}));
    ASSERT_OK(write_edited(b, (edit){.at = -1, .replace_at = 8, .replacement = hit}));
    fmoe_decision_log_diff d;
    ASSERT_OK(fmoe_decision_log_compare(a, b, 0, &d));
    ASSERT_EQ(d.identical, 0);
    ASSERT_EQ(d.index, 7);
    ASSERT_EQ(d.line_a, 10);
    ASSERT_EQ(d.line_b, 10);
    ASSERT_EQ(d.ta.late, 1);
    ASSERT_EQ(d.tb.late, 0);
    ASSERT_EQ(d.tb.hits, 2);
    ASSERT_OK(fmoe_decision_log_compare(a, b, 1, &d));
    ASSERT_EQ(d.identical, 1);
    /* late_is_hit does not make a miss a hit */
    const char *miss =
        "{\"event\":\"access\",\"iteration\":5,\"layer\":3,\"expert\":2,\"slot\":0,\"result\":\"miss\",\"t\":3}";
    ASSERT_OK(write_edited(b, (edit){.at = -1, .replace_at = 8, .replacement = miss}));
    ASSERT_OK(fmoe_decision_log_compare(a, b, 1, &d));
    ASSERT_EQ(d.identical, 0);
}

TEST(compare_landed_lines_are_not_compared) {
    const char *a = tmp_path("landed-a.jsonl"), *b = tmp_path("landed-b.jsonl");
    /* A without its landed line (index 7); B with two more, one of them at the very end */
    ASSERT_OK(write_edited(a, (edit){.at = -1, .replace_at = 7, .replacement = ""}));
    char text[8192];
    ASSERT_OK(write_edited(b, (edit){.at = 0, .extra = every_kind_lines[7]}));
    char *bt = read_text(b);
    ASSERT_TRUE(bt != NULL);
    snprintf(text, sizeof text, "%s%s\n", bt, every_kind_lines[7]);
    free(bt);
    ASSERT_OK(write_text(b, text));
    fmoe_decision_log_diff d;
    ASSERT_OK(fmoe_decision_log_compare(a, b, 0, &d));
    ASSERT_EQ(d.identical, 1);
    ASSERT_EQ(d.ta.by_kind[FMOE_DECISION_LANDED], 0);
    ASSERT_EQ(d.tb.by_kind[FMOE_DECISION_LANDED], 3);
    ASSERT_EQ(d.ta.lines, 9);
    ASSERT_EQ(d.tb.lines, 12);
}

TEST(compare_a_log_that_ends_early) {
    /* B holds the first 5 decisions of A: they part at compared index 5, A's line 7 */
    const char *a = tmp_path("short-a.jsonl"), *b = tmp_path("short-b.jsonl");
    ASSERT_OK(write_edited(a, (edit){.at = -1}));
    ASSERT_OK(write_edited(b, (edit){.at = -1, .stop = 5}));
    fmoe_decision_log_diff d;
    ASSERT_OK(fmoe_decision_log_compare(a, b, 0, &d));
    ASSERT_EQ(d.identical, 0);
    ASSERT_EQ(d.index, 5);
    ASSERT_EQ(d.line_a, 7);
    ASSERT_STR_EQ(d.a, every_kind_lines[5]);
    ASSERT_EQ(d.line_b, 0);
    ASSERT_STR_EQ(d.b, "");
    ASSERT_EQ(d.ta.lines, 10); /* A read to its end all the same */
    ASSERT_EQ(d.tb.lines, 5);
    /* the other way round, and a log with no decision at all */
    ASSERT_OK(fmoe_decision_log_compare(b, a, 0, &d));
    ASSERT_EQ(d.index, 5);
    ASSERT_EQ(d.line_a, 0);
    ASSERT_EQ(d.line_b, 7);
    ASSERT_OK(write_text(b, HEADER));
    ASSERT_OK(fmoe_decision_log_compare(a, b, 0, &d));
    ASSERT_EQ(d.index, 0);
    ASSERT_EQ(d.line_a, 2);
    ASSERT_EQ(d.line_b, 0);
    ASSERT_OK(fmoe_decision_log_compare(b, b, 0, &d));
    ASSERT_EQ(d.identical, 1);
}

/* Each malformed line, put at decision index 3 of B (file line 5), is refused with
 * FMOE_EFORMAT naming the file and line, and what is wrong. */
TEST(compare_refuses_malformed_lines) {
    static const struct { const char *line, *why; } bad[] = {
        {"{\"event\":\"cancel\",\"iteration\":4,\"layer\":2,\"expert\":0,\"slot\":4,\"t\":1",
         "expected ',' or '}'"},
        {"{\"event\":\"cancel\",\"iteration\":4,\"layer\":2,\"expert\":0,\"slot\":4,\"t\":1,\"x\":1}",
         "unknown key \"x\""},
        {"{\"event\":\"cancel\",\"iteration\":4,\"layer\":2,\"expert\":0,\"t\":1}", "no \"slot\""},
        {"{\"event\":\"cancel\",\"iteration\":4,\"layer\":2,\"expert\":0,\"slot\":4,\"slot\":4,\"t\":1}",
         "\"slot\" twice"},
        {"{\"event\":\"cancelled\",\"iteration\":4,\"layer\":2,\"expert\":0,\"slot\":4,\"t\":1}",
         "unknown event"},
        {"{\"event\":\"cancel\",\"iteration\":4.5,\"layer\":2,\"expert\":0,\"slot\":4,\"t\":1}",
         "\"iteration\" must be an integer"},
        {"{\"event\":\"cancel\",\"iteration\":4,\"layer\":-1,\"expert\":0,\"slot\":4,\"t\":1}",
         "\"layer\" is -1"},
        {"{\"event\":\"cancel\",\"iteration\":4,\"layer\":2,\"expert\":0,\"slot\":4,\"result\":\"hit\",\"t\":1}",
         "\"result\" on a cancel line"},
        {"{\"event\":\"cancel\",\"iteration\":4,\"layer\":2,\"expert\":0,\"slot\":4,\"victim\":3,\"t\":1}",
         "\"victim\" on a cancel line"},
        {"{\"event\":\"access\",\"iteration\":4,\"layer\":2,\"expert\":0,\"slot\":4,\"t\":1}",
         "without \"result\""},
        {"{\"event\":\"prefetch\",\"iteration\":4,\"layer\":2,\"expert\":0,\"slot\":4,\"t\":1}",
         "without \"priority\""},
        {"{\"event\":\"cancel\",\"iteration\":4,\"layer\":2,\"expert\":0,\"slot\":4,\"t\":0x10}",
         "\"t\" must be a number"},
        {"{\"event\":\"cancel\",\"iteration\":4,\"layer\":2,\"expert\":0,\"slot\":4,\"t\":1} x",
         "text after the object"},
        {"{\"event\":\"cancel\",\"iteration\":99999999999999999999,\"layer\":2,\"expert\":0,\"slot\":4,\"t\":1}",
         "out of"},
        {"", "expected '{'"},
        {"[1,2]", "expected '{'"},
    };
    const char *a = tmp_path("bad-a.jsonl"), *b = tmp_path("bad-b.jsonl");
    ASSERT_OK(write_edited(a, (edit){.at = -1}));
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ASSERT_OK(write_edited(b, (edit){.at = 3, .extra = bad[i].line, .replace_at = 3,
                                         .replacement = ""}));
        fmoe_decision_log_diff d;
        fmoe_error_clear();
        const int rc = fmoe_decision_log_compare(a, b, 0, &d);
        char where[1100];
        snprintf(where, sizeof where, "%s:5: ", b);
        if (rc != FMOE_EFORMAT || !strstr(fmoe_error_detail(), where) ||
            !strstr(fmoe_error_detail(), bad[i].why))
            HARNESS_FAIL("case %zu (%s): rc %d, detail \"%s\", expected \"%s...%s\"", i,
                         bad[i].line, rc, fmoe_error_detail(), where, bad[i].why);
    }
    /* a malformed line after the divergence is still found: totals need every line */
    ASSERT_OK(write_edited(b, (edit){.at = 9, .extra = "{}", .replace_at = 0,
                                     .replacement = every_kind_lines[1]}));
    fmoe_decision_log_diff d;
    ASSERT_EQ(fmoe_decision_log_compare(a, b, 0, &d), FMOE_EFORMAT);
    ASSERT_CONTAINS(fmoe_error_detail(), ":11: ");
}

TEST(compare_refuses_bad_headers_and_missing_files) {
    const char *a = tmp_path("hdr-a.jsonl"), *b = tmp_path("hdr-b.jsonl");
    ASSERT_OK(write_edited(a, (edit){.at = -1}));
    fmoe_decision_log_diff d;

    ASSERT_OK(write_text(b, every_kind_lines[0])); /* a decision where the header belongs */
    ASSERT_EQ(fmoe_decision_log_compare(a, b, 0, &d), FMOE_EFORMAT);
    ASSERT_CONTAINS(fmoe_error_detail(), "hdr-b.jsonl:1: ");

    ASSERT_OK(write_text(b, ""));
    ASSERT_EQ(fmoe_decision_log_compare(a, b, 0, &d), FMOE_EFORMAT);
    ASSERT_CONTAINS(fmoe_error_detail(), "hdr-b.jsonl:1: ");

    ASSERT_OK(write_text(b, "{\"fmoe_decision_log\":2,\"source\":\"simulate\"}\n"));
    ASSERT_EQ(fmoe_decision_log_compare(a, b, 0, &d), FMOE_EUNSUPPORTED);
    ASSERT_CONTAINS(fmoe_error_detail(), "hdr-b.jsonl:1: ");

    ASSERT_OK(write_text(b, "{\"fmoe_decision_log\":1,\"source\":\"simulate\",\"meta\":3}\n"));
    ASSERT_EQ(fmoe_decision_log_compare(a, b, 0, &d), FMOE_EFORMAT);

    const char *missing = tmp_path("missing.jsonl");
    ASSERT_EQ(fmoe_decision_log_compare(missing, a, 0, &d), FMOE_ENOTFOUND);
    ASSERT_CONTAINS(fmoe_error_detail(), "missing.jsonl");
    ASSERT_EQ(fmoe_decision_log_compare(a, missing, 0, &d), FMOE_ENOTFOUND);
    ASSERT_CONTAINS(fmoe_error_detail(), "missing.jsonl");
    /* a folder opens but cannot be read */
    char dir[1100];
    snprintf(dir, sizeof dir, "%s", tmp_path("a-folder"));
    ASSERT_EQ(mkdir(dir, 0700), 0);
    ASSERT_EQ(fmoe_decision_log_compare(a, dir, 0, &d), FMOE_EIO);
    ASSERT_CONTAINS(fmoe_error_detail(), "a-folder");
    ASSERT_EQ(fmoe_decision_log_compare(a, b, 0, NULL), FMOE_EINVAL);
}

/* Non-finite priorities are written as Python's json writes them and compare equal to
 * themselves (NaN included: the same decision, not a divergence). */
TEST(writer_non_finite_priorities) {
    fmoe_decision d[3] = {every_kind[1], every_kind[1], every_kind[1]};
    d[0].priority = INFINITY;
    d[1].priority = -INFINITY;
    d[2].priority = NAN;
    const char *a = tmp_path("inf-a.jsonl"), *b = tmp_path("inf-b.jsonl");
    ASSERT_OK(write_log(a, d, 3));
    char *text = read_text(a);
    ASSERT_TRUE(text != NULL);
    char line[512];
    ASSERT_CONTAINS(nth_line(text, 2, line, sizeof line), "\"priority\":Infinity,");
    ASSERT_CONTAINS(nth_line(text, 3, line, sizeof line), "\"priority\":-Infinity,");
    ASSERT_CONTAINS(nth_line(text, 4, line, sizeof line), "\"priority\":NaN,");
    free(text);
    ASSERT_OK(write_log(b, d, 3));
    fmoe_decision_log_diff diff;
    ASSERT_OK(fmoe_decision_log_compare(a, b, 0, &diff));
    ASSERT_EQ(diff.identical, 1);
    d[2].priority = 1e308;
    ASSERT_OK(write_log(b, d, 3));
    ASSERT_OK(fmoe_decision_log_compare(a, b, 0, &diff));
    ASSERT_EQ(diff.index, 2);
}

/* For tests/python/test_compare_logs.py, which reads the writer's lines with Python's json
 * module: logs written into $FMOE_TEST_DLOG_OUT (nothing to do without it). */
TEST(writer_log_for_python) {
    const char *dir = getenv("FMOE_TEST_DLOG_OUT");
    if (!dir || !*dir) return;
    char path[1024];
    snprintf(path, sizeof path, "%s/every-kind.jsonl", dir);
    fmoe_decision_log *log = NULL;
    ASSERT_OK(fmoe_decision_log_open(&log, path, "record",
                                     "{\"model\": \"a \\\"quoted\\\" name\\nand a tab\\t\",\n"
                                     " \"unicode\": \"\u00e9\", \"n\": [1, 2.5, null]}"));
    for (int i = 0; i < NUM_EVERY; i++) fmoe_decision_log_write(log, &every_kind[i]);
    fmoe_decision odd[4] = {every_kind[1], every_kind[1], every_kind[6], every_kind[0]};
    odd[0].priority = INFINITY;
    odd[1].priority = NAN;
    odd[2].priority = 1.0 / 3.0;
    odd[3].time_s = 123456.78901234567;
    for (int i = 0; i < 4; i++) fmoe_decision_log_write(log, &odd[i]);
    ASSERT_OK(fmoe_decision_log_close(log, 1));
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
