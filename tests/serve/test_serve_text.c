/*
 * test_serve_text.c - stop strings and held-back tails (runtime/serve/serve_text.h), with
 * expected values worked out by hand.
 */
#include <string.h>

#include "harness.h"
#include "serve_text.h"

static size_t stop_at(const char *const *stop, int32_t n, const char *text) {
    return fmoe_serve_text_stop_at(stop, n, text, strlen(text));
}

static size_t visible(const char *const *stop, int32_t n, const char *text) {
    return fmoe_serve_text_visible(stop, n, text, strlen(text));
}

TEST(stop_at_is_the_earliest_occurrence_of_any) {
    const char *stop[] = {"END", "\n\n", "x"};
    ASSERT_EQ(stop_at(stop, 3, "abc"), 3);            /* none: the whole text */
    ASSERT_EQ(stop_at(stop, 1, "abcEND def"), 3);
    ASSERT_EQ(stop_at(stop, 3, "ab\n\ncd END"), 2);   /* "\n\n" comes before "END" */
    ASSERT_EQ(stop_at(stop, 3, "ENDx"), 0);
    ASSERT_EQ(stop_at(stop, 3, "abcx"), 3);
    ASSERT_EQ(stop_at(stop, 1, "EN"), 2);             /* a prefix is not an occurrence */
    ASSERT_EQ(stop_at(stop, 0, "END"), 3);            /* no stop strings */
}

TEST(empty_stop_strings_never_match_or_hold_back) {
    const char *stop[] = {"", "b"};
    ASSERT_EQ(stop_at(stop, 1, "abc"), 3);
    ASSERT_EQ(stop_at(stop, 2, "abc"), 1);
    ASSERT_EQ(visible(stop, 1, "abc"), 3);
}

TEST(visible_holds_back_a_tail_that_could_become_a_stop_string) {
    const char *stop[] = {"STOP", "the end"};
    ASSERT_EQ(visible(stop, 2, "hello"), 5);
    ASSERT_EQ(visible(stop, 2, "hello S"), 6);        /* "S" may start "STOP" */
    ASSERT_EQ(visible(stop, 2, "hello ST"), 6);
    ASSERT_EQ(visible(stop, 2, "hello STO"), 6);
    ASSERT_EQ(visible(stop, 2, "hello STa"), 9);       /* no longer a prefix */
    ASSERT_EQ(visible(stop, 2, "and the en"), 4);      /* "the en" held: "and " shown */
    ASSERT_EQ(visible(stop, 2, "th"), 0);              /* the whole text may be a prefix */
    ASSERT_EQ(visible(stop, 2, "t"), 0);
}

TEST(visible_holds_back_an_incomplete_utf8_sequence) {
    /* decode writes U+FFFD (EF BF BD) for bytes of a character still being generated */
    const char text[] = "ab\xEF\xBF\xBD\xEF\xBF\xBD";
    ASSERT_EQ(fmoe_serve_text_visible(NULL, 0, text, sizeof text - 1), 2);
    const char done[] = "ab\xC3\xA9"; /* é, complete */
    ASSERT_EQ(fmoe_serve_text_visible(NULL, 0, done, sizeof done - 1), 4);
    /* both: the stop prefix is looked for before the replacement characters */
    const char *stop[] = {"b!"};
    ASSERT_EQ(fmoe_serve_text_visible(stop, 1, text, sizeof text - 1), 1);
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
