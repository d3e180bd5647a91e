/*
 * fuzz_decision_log.c - fuzz target for the decision log reader behind
 * fmoe_decision_log_compare: logs come from other machines and other
 * builds, and from hand edits.
 *
 * With libFuzzer (or simply meson -Dfuzzing=true, tests/fuzz/README.md):
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -DFMOE_LIBFUZZER \
 *     -Ilib/include -Ilib \
 *     tests/fuzz/fuzz_decision_log.c lib/decision_log.c lib/decision_log_compare.c \
 *     lib/error.c -lcjson -lm -o fuzz_decision_log && \
 *     ./fuzz_decision_log tests/fixtures/decision_logs
 * Without (the `fuzz` suite of meson test): replays every fixture log, each of its
 * prefixes, and a fixed set of seeded mutations, under the build's sanitizers. The input is
 * compared with itself and with the unchanged fixture; any crash, sanitizer report or
 * broken invariant fails the run.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fmoe/decision_log.h"
#include "fmoe/error.h"

static char input_path[512];     /* the input, written to a scratch file */
static const char *reference;    /* a valid log to compare it with, or NULL */

static void fail(const char *what) {
    fprintf(stderr, "fuzz_decision_log: invariant broken: %s (detail: %s)\n", what,
            fmoe_error_detail());
    abort();
}

static void check_totals(const fmoe_decision_log_totals *t) {
    int64_t sum = 0;
    for (int k = 0; k < 8; k++) sum += t->by_kind[k];
    if (sum != t->lines) fail("lines != the sum of by_kind");
    if (t->hits + t->late + t->misses != t->by_kind[FMOE_DECISION_ACCESS])
        fail("hits + late + misses != accesses");
}

static void check_diff(const fmoe_decision_log_diff *d) {
    if (!memchr(d->a, 0, sizeof d->a) || !memchr(d->b, 0, sizeof d->b)) fail("unterminated line");
    if (d->identical != (d->index < 0)) fail("identical and index disagree");
    if (!d->identical && d->line_a == 0 && d->line_b == 0) fail("both logs ended at a divergence");
    check_totals(&d->ta);
    check_totals(&d->tb);
}

/* Codes the reader may return for bad bytes in a file that exists. */
static void check_rc(int rc) {
    if (rc != 0 && rc != FMOE_EFORMAT && rc != FMOE_EUNSUPPORTED && rc != FMOE_ENOMEM)
        fail("unexpected status");
    if (rc != 0 && !strstr(fmoe_error_detail(), input_path)) fail("the detail does not name the file");
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);
int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    if (!input_path[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(input_path, sizeof input_path, "%s/fuzz-decision-log-%ld.jsonl",
                 tmp && *tmp ? tmp : "/tmp", (long)getpid());
    }
    FILE *f = fopen(input_path, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    fmoe_decision_log_diff d;
    int rc = fmoe_decision_log_compare(input_path, input_path, 0, &d);
    check_rc(rc);
    if (rc == 0) {
        check_diff(&d);
        if (!d.identical || memcmp(&d.ta, &d.tb, sizeof d.ta) != 0) fail("a log differs from itself");
    }
    if (reference) {
        int rc2 = fmoe_decision_log_compare(input_path, reference, 1, &d);
        if ((rc2 == 0) != (rc == 0)) fail("the input reads once and not twice");
        check_rc(rc2);
        if (rc2 == 0) check_diff(&d);
    }
    return 0;
}

#ifndef FMOE_LIBFUZZER
#include "fuzz_mutate.h"


static const char *const tokens[] = {
    "{", "}", ",", ":", "\"", "\n", "\r", " ", "-", "-1", "0", "1e999", "2147483648",
    "9223372036854775808", "NaN", "Infinity", "0x10", "1.", ".5", "\\n", "\"event\"",
    "\"landed\"", "\"result\":\"late\"", "\"victim\":3,", "\"priority\":1,", "{}",
    "{\"fmoe_decision_log\":1,\"source\":\"x\"}\n",
};
static fuzz_mutator mutator = {0x9e3779b97f4a7c15ull, tokens, sizeof tokens / sizeof tokens[0]};

static int replay_file(const char *path, int mutations) {
    size_t n;
    char *src = fuzz_read_fixture("fuzz_decision_log", path, 1 << 20, &n);
    if (!src) return 1;
    reference = path;
    /* the fixture itself must read, and equal itself */
    fmoe_decision_log_diff d;
    if (fmoe_decision_log_compare(path, path, 0, &d) != 0 || !d.identical) {
        fprintf(stderr, "fuzz_decision_log: %s: %s\n", path, fmoe_error_detail());
        free(src);
        return 1;
    }
    fuzz_replay(&mutator, src, n, 1, mutations, LLVMFuzzerTestOneInput);
    free(src);
    return 0;
}

int fuzz_seeded_replay(void);
int fuzz_seeded_replay(void) {
    int bad = 0, files = 0;
    {
        const char *fix = getenv("FMOE_FIXTURES");
        char dir[1024], path[2048];
        snprintf(dir, sizeof dir, "%s/decision_logs", fix ? fix : "tests/fixtures");
        DIR *dd = opendir(dir);
        if (!dd) {
            fprintf(stderr, "fuzz_decision_log: cannot open %s\n", dir);
            return 1;
        }
        struct dirent *e;
        while ((e = readdir(dd))) {
            if (e->d_name[0] == '.') continue;
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            bad |= replay_file(path, 3000);
            files++;
        }
        closedir(dd);
        printf("fuzz_decision_log: %d logs replayed with prefixes and 3000 mutations each\n",
               files);
    }
    if (input_path[0]) unlink(input_path);
    return bad || files == 0;
}
#endif
