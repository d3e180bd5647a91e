/*
 * tests/harness.h - a tiny test harness.
 *
 *     TEST(sha256_empty) { ASSERT_STR_EQ(hex, "e3b0..."); }
 *     int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
 *
 * Tests register themselves through constructors; RUN_TESTS runs them all (or the ones
 * whose names contain argv[1]) and prints "N passed, N failed". A failed assertion
 * prints both values with file:line and ends that test, also when it fails in a helper
 * the test called: it jumps straight back to the runner (longjmp), past every caller, so
 * no test goes on after a failed check whether or not its helpers' callers look at
 * *harness_failed. Cleanup after the failed check is skipped; the test has failed anyway.
 * A helper that takes `int *harness_failed` can use every ASSERT_* macro.
 *
 * Assertions run on the test's own thread: a longjmp cannot leave another thread, so an
 * assertion on another thread aborts the whole program instead (still a failure).
 */
#ifndef FMOE_TEST_HARNESS_H
#define FMOE_TEST_HARNESS_H

#include <math.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*harness_test_fn)(int *failed);

struct harness_test {
    const char *name;
    harness_test_fn fn;
};

#ifndef HARNESS_MAX_TESTS
#define HARNESS_MAX_TESTS 1024
#endif
static struct harness_test harness_tests[HARNESS_MAX_TESTS];
static int harness_num_tests;

/* Where a failed assertion resumes: harness_run, just after it started the test. */
static jmp_buf harness_jmp;
/* Set while harness_run runs a test, on its thread only (see the note at the top). */
static _Thread_local int harness_on_test_thread;
/* The running test's failure flag; statics keep their values across the longjmp. */
static int harness_test_failed;

/* Ends the running test after a failed check: back to harness_run. */
_Noreturn static inline void harness_stop(void) {
    if (!harness_on_test_thread) {
        fprintf(stderr, "harness: an assertion failed outside the test's thread\n");
        abort();
    }
    longjmp(harness_jmp, 1);
}

/* More tests than HARNESS_MAX_TESTS is a hard error (exit 99, meson's "error"), never a
 * silent drop. */
static inline void harness_register(const char *name, harness_test_fn fn) {
    if (harness_num_tests == HARNESS_MAX_TESTS) {
        fprintf(stderr, "harness: test %s is test %d, more than HARNESS_MAX_TESTS (%d); raise "
                        "it in tests/harness.h\n",
                name, HARNESS_MAX_TESTS + 1, HARNESS_MAX_TESTS);
        exit(99);
    }
    harness_tests[harness_num_tests++] = (struct harness_test){name, fn};
}

#define TEST(name)                                                                \
    static void test_##name(int *harness_failed);                                 \
    __attribute__((constructor)) static void harness_register_##name(void) {      \
        harness_register(#name, test_##name);                                     \
    }                                                                             \
    static void test_##name(int *harness_failed)

/* Prints the failure and ends the test (not only the function it is in). */
#define HARNESS_FAIL(...)                                                         \
    do {                                                                          \
        fprintf(stderr, "  %s:%d: ", __FILE__, __LINE__);                         \
        fprintf(stderr, __VA_ARGS__);                                             \
        fprintf(stderr, "\n");                                                    \
        *harness_failed = 1;                                                      \
        harness_stop();                                                           \
    } while (0)

#define ASSERT_TRUE(cond)                                                         \
    do {                                                                          \
        if (!(cond)) HARNESS_FAIL("expected true: %s", #cond);                    \
    } while (0)

#define ASSERT_EQ(a, b)                                                           \
    do {                                                                          \
        long long harness_a = (long long)(a), harness_b = (long long)(b);         \
        if (harness_a != harness_b)                                               \
            HARNESS_FAIL("%s == %s: %lld != %lld", #a, #b, harness_a, harness_b); \
    } while (0)

#define ASSERT_NE(a, b)                                                           \
    do {                                                                          \
        long long harness_a = (long long)(a), harness_b = (long long)(b);         \
        if (harness_a == harness_b)                                               \
            HARNESS_FAIL("%s != %s: both %lld", #a, #b, harness_a);               \
    } while (0)

#define ASSERT_NEAR(a, b, tol)                                                    \
    do {                                                                          \
        double harness_a = (double)(a), harness_b = (double)(b);                  \
        if (!(fabs(harness_a - harness_b) <= (tol)))                              \
            HARNESS_FAIL("%s ~ %s: %.9g vs %.9g (tol %g)", #a, #b, harness_a,     \
                         harness_b, (double)(tol));                               \
    } while (0)

#define ASSERT_STR_EQ(a, b)                                                       \
    do {                                                                          \
        const char *harness_a = (a), *harness_b = (b);                            \
        if (!harness_a || !harness_b || strcmp(harness_a, harness_b) != 0)        \
            HARNESS_FAIL("%s == %s: \"%s\" != \"%s\"", #a, #b,                    \
                         harness_a ? harness_a : "(null)",                        \
                         harness_b ? harness_b : "(null)");                       \
    } while (0)

#define ASSERT_CONTAINS(haystack, needle)                                         \
    do {                                                                          \
        const char *harness_h = (haystack), *harness_n = (needle);                \
        if (!harness_h || !strstr(harness_h, harness_n))                          \
            HARNESS_FAIL("\"%s\" does not contain \"%s\"",                        \
                         harness_h ? harness_h : "(null)", harness_n);            \
    } while (0)

/* Asserts an fmoe call returned 0; prints the error detail otherwise. */
#define ASSERT_OK(expr)                                                           \
    do {                                                                          \
        int harness_rc = (expr);                                                  \
        if (harness_rc != 0)                                                      \
            HARNESS_FAIL("%s returned %d: %s", #expr, harness_rc,                 \
                         fmoe_error_detail());                                    \
    } while (0)

static inline int harness_run(int argc, char **argv) {
    const char *filter = argc > 1 ? argv[1] : NULL;
    /* volatile: a non-volatile local of the function that calls setjmp may lose its value
     * across the longjmp (C11 7.13.2.1), and gcc's -Wclobbered says so */
    volatile int passed = 0, failed = 0;
    for (volatile int i = 0; i < harness_num_tests; i++) {
        if (filter && !strstr(harness_tests[i].name, filter)) continue;
        harness_test_failed = 0;
        harness_on_test_thread = 1;
        if (setjmp(harness_jmp) == 0) harness_tests[i].fn(&harness_test_failed);
        else harness_test_failed = 1;
        harness_on_test_thread = 0;
        if (harness_test_failed) {
            fprintf(stderr, "FAIL %s\n", harness_tests[i].name);
            failed++;
        } else {
            fprintf(stderr, "ok   %s\n", harness_tests[i].name);
            passed++;
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

#define RUN_TESTS(argc, argv) harness_run((argc), (argv))

/* Directory of test fixtures, set by meson through the FMOE_FIXTURES environment. */
static inline const char *harness_fixtures(void) {
    const char *d = getenv("FMOE_FIXTURES");
    return d ? d : "tests/fixtures";
}

#endif
