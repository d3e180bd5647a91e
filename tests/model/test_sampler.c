/* test_sampler - greedy, temperature, top-k, top-p and the seeded generator. */
#include <math.h>
#include <stdlib.h>

#include "fmoe/error.h"
#include "fmoe/sampler.h"
#include "harness.h"

static int32_t draw(fmoe_sampler_params p, const float *logits, int32_t V) {
    fmoe_sampler *s;
    if (fmoe_sampler_init(&p, V, &s) < 0) return -1;
    int32_t t = fmoe_sampler_sample(s, logits);
    fmoe_sampler_free(s);
    return t;
}

TEST(greedy_is_argmax_lowest_on_ties) {
    const float l[6] = {0.1f, 3.0f, -2.0f, 3.0f, NAN, 1.0f};
    ASSERT_EQ(fmoe_argmax(l, 6), 1);
    fmoe_sampler_params p = {0.0f, 3, 0.5f, 42};
    ASSERT_EQ(draw(p, l, 6), 1);
    const float nan_first[3] = {NAN, -1.0f, 2.0f};
    ASSERT_EQ(fmoe_argmax(nan_first, 3), 2);
}

TEST(same_seed_same_tokens) {
    float l[100];
    for (int i = 0; i < 100; i++) l[i] = sinf((float)i) * 3;
    fmoe_sampler_params p = {0.8f, 0, 0.95f, 1234};
    fmoe_sampler *a, *b, *c;
    ASSERT_OK(fmoe_sampler_init(&p, 100, &a));
    ASSERT_OK(fmoe_sampler_init(&p, 100, &b));
    p.seed = 1235;
    ASSERT_OK(fmoe_sampler_init(&p, 100, &c));
    int differ = 0;
    for (int i = 0; i < 200; i++) {
        int32_t x = fmoe_sampler_sample(a, l), y = fmoe_sampler_sample(b, l);
        ASSERT_EQ(x, y);
        differ |= fmoe_sampler_sample(c, l) != x;
    }
    ASSERT_TRUE(differ);
    fmoe_sampler_free(a);
    fmoe_sampler_free(b);
    fmoe_sampler_free(c);
    fmoe_rng r1, r2;
    fmoe_rng_seed(&r1, 7);
    fmoe_rng_seed(&r2, 7);
    for (int i = 0; i < 10; i++) ASSERT_EQ(fmoe_rng_next(&r1), fmoe_rng_next(&r2));
    for (int i = 0; i < 1000; i++) {
        float u = fmoe_rng_float(&r1);
        ASSERT_TRUE(u >= 0.0f && u < 1.0f);
    }
}

/* Frequencies of 20000 draws against the distribution the options define. */
static void frequencies(fmoe_sampler_params p, const float *l, int32_t V, double *freq) {
    fmoe_sampler *s;
    if (fmoe_sampler_init(&p, V, &s) < 0) return;
    for (int i = 0; i < V; i++) freq[i] = 0;
    for (int i = 0; i < 20000; i++) freq[fmoe_sampler_sample(s, l)] += 1.0 / 20000;
    fmoe_sampler_free(s);
}

TEST(temperature_top_k_top_p_distributions) {
    const float l[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    double f[4];
    frequencies((fmoe_sampler_params){1.0f, 0, 1.0f, 1}, l, 4, f);
    ASSERT_NEAR(f[0], 0.5, 0.02);
    ASSERT_NEAR(f[1], 0.3, 0.02);
    ASSERT_NEAR(f[3], 0.05, 0.01);
    /* top-k 2: renormalised over {0.5, 0.3} */
    frequencies((fmoe_sampler_params){1.0f, 2, 1.0f, 2}, l, 4, f);
    ASSERT_NEAR(f[0], 0.625, 0.02);
    ASSERT_NEAR(f[2] + f[3], 0, 0);
    /* top-p 0.6: the smallest prefix reaching 0.6 is {0.5, 0.3} */
    frequencies((fmoe_sampler_params){1.0f, 0, 0.6f, 3}, l, 4, f);
    ASSERT_NEAR(f[0], 0.625, 0.02);
    ASSERT_NEAR(f[2] + f[3], 0, 0);
    /* top-p 0.4: only the first */
    frequencies((fmoe_sampler_params){1.0f, 0, 0.4f, 4}, l, 4, f);
    ASSERT_NEAR(f[0], 1.0, 1e-9);
    /* temperature 0.5 squares the odds: 0.25 : 0.09 : 0.0225 : 0.0025 */
    frequencies((fmoe_sampler_params){0.5f, 0, 1.0f, 5}, l, 4, f);
    ASSERT_NEAR(f[0], 0.25 / 0.365, 0.02);
    /* top-k 1 is greedy */
    frequencies((fmoe_sampler_params){2.0f, 1, 1.0f, 6}, l, 4, f);
    ASSERT_NEAR(f[0], 1.0, 1e-9);
}

/* A temperature so small that logit / T overflows a float (1e-40, a subnormal; 1e-38 with
 * logits of 10) tends to greedy, its limit; before, every scaled logit was inf, the softmax
 * NaN, and the last token came out each step. */
TEST(tiny_temperatures_are_greedy) {
    const float l[6] = {3.0f, 10.0f, -2.0f, 9.5f, 0.0f, -7.0f};
    const float temps[4] = {1e-40f, 1e-38f, 1e-30f, 1e-20f};
    for (int t = 0; t < 4; t++)
        for (int top_k = 0; top_k <= 3; top_k += 3) {
            fmoe_sampler *s = NULL;
            ASSERT_EQ(fmoe_sampler_init(&(fmoe_sampler_params){temps[t], top_k, 1.0f, 9}, 6, &s),
                      0);
            for (int i = 0; i < 20; i++) ASSERT_EQ(fmoe_sampler_sample(s, l), 1);
            fmoe_sampler_free(s);
        }
}

TEST(bad_parameters_refused) {
    fmoe_sampler *s = NULL;
    ASSERT_EQ(fmoe_sampler_init(&(fmoe_sampler_params){-1.0f, 0, 1.0f, 0}, 10, &s), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "temperature");
    ASSERT_EQ(fmoe_sampler_init(&(fmoe_sampler_params){1.0f, 0, 0.0f, 0}, 10, &s), FMOE_EINVAL);
    ASSERT_EQ(fmoe_sampler_init(&(fmoe_sampler_params){1.0f, -2, 1.0f, 0}, 10, &s), FMOE_EINVAL);
    ASSERT_EQ(fmoe_sampler_init(&(fmoe_sampler_params){1.0f, 0, 1.0f, 0}, 0, &s), FMOE_EINVAL);
    ASSERT_TRUE(s == NULL);
    fmoe_sampler_free(NULL);
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
