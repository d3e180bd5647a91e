/*
 * test_plot_svg.c - the SVG chart writer of `fmoe simulate --plot` (cmd/plot_svg.c): tick
 * values at nice numbers, escaping, degenerate series, atomic writes.
 */
#include "plot_svg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fmoe/error.h"
#include "harness.h"

static void expect_ticks(int *harness_failed, double lo, double hi, const double *want,
                         int32_t n) {
    double got[16];
    const int32_t m = plot_nice_ticks(lo, hi, 6, got, 16);
    int ok = m == n;
    for (int32_t i = 0; ok && i < n; i++) ok = got[i] == want[i];
    if (!ok) {
        fprintf(stderr, "  ticks of [%g, %g]:", lo, hi);
        for (int32_t i = 0; i < m; i++) fprintf(stderr, " %.17g", got[i]);
        fprintf(stderr, "\n");
        HARNESS_FAIL("ticks of [%g, %g]: %d ticks, %d wanted", lo, hi, (int)m, (int)n);
    }
}

TEST(ticks_are_nice_and_cover_the_range) {
    expect_ticks(harness_failed, 0, 1, (const double[]){0, 0.2, 0.4, 0.6, 0.8, 1}, 6);
    expect_ticks(harness_failed, 0, 97, (const double[]){0, 20, 40, 60, 80, 100}, 6);
    expect_ticks(harness_failed, 5, 43, (const double[]){0, 10, 20, 30, 40, 50}, 6);
    expect_ticks(harness_failed, 0, 0.38, (const double[]){0, 0.1, 0.2, 0.3, 0.4}, 5);
    expect_ticks(harness_failed, 30, 270, (const double[]){0, 100, 200, 300}, 4);
    double t[16];
    const int32_t n = plot_nice_ticks(7, 7, 6, t, 16); /* one value: a range around it */
    ASSERT_TRUE(n >= 2 && t[0] <= 7 && t[n - 1] >= 7);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static char buf[1 << 16];
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

TEST(escapes_text_and_draws_single_points) {
    char path[600], partial[620];
    snprintf(path, sizeof path, "%s/fmoe-test-plot-%d.svg", getenv("TMPDIR") ? getenv("TMPDIR")
                                                                            : "/tmp",
             (int)getpid());
    snprintf(partial, sizeof partial, "%s.partial", path);
    const double x[] = {8}, y[] = {42.5};
    const plot_series s[] = {{"a<b & \"c\"", 1, x, y}};
    const plot_panel p[] = {{"hit > rate", "cache", "%", 1, s}};
    ASSERT_OK(plot_svg_write(path, "t&t", p, 1));
    const char *svg = slurp(path);
    ASSERT_TRUE(svg != NULL);
    ASSERT_CONTAINS(svg, "xmlns=\"http://www.w3.org/2000/svg\"");
    ASSERT_CONTAINS(svg, "a&lt;b &amp; &quot;c&quot;");
    ASSERT_CONTAINS(svg, "hit &gt; rate");
    ASSERT_CONTAINS(svg, "<title>t&amp;t</title>");
    ASSERT_TRUE(strstr(svg, "a<b") == NULL);
    ASSERT_CONTAINS(svg, "<polyline class=\"series\"");
    ASSERT_TRUE(fopen(partial, "r") == NULL);
    remove(path);
}

TEST(unwritable_path_is_an_error_and_leaves_nothing) {
    const double x[] = {1, 2}, y[] = {3, 4};
    const plot_series s[] = {{"lru", 2, x, y}};
    const plot_panel p[] = {{"t", "x", "y", 1, s}};
    ASSERT_EQ(plot_svg_write("/nonexistent-dir/p.svg", "t", p, 1), FMOE_EIO);
    ASSERT_CONTAINS(fmoe_error_detail(), "/nonexistent-dir/p.svg");
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
