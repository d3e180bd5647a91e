/* test_analysis.c - the routing statistics behind `fmoe inspect`, on hand-worked cases. */
#include <math.h>

#include "fmoe/analysis.h"
#include "fmoe/error.h"
#include "harness.h"

TEST(entropy_of_known_distributions) {
    ASSERT_NEAR(fmoe_entropy_bits((int64_t[]){1, 1, 1, 1}, 4), 2.0, 1e-12);
    ASSERT_NEAR(fmoe_entropy_bits((int64_t[]){5, 0, 0, 0}, 4), 0.0, 1e-12);
    ASSERT_NEAR(fmoe_entropy_bits((int64_t[]){0, 0}, 2), 0.0, 1e-12);
    /* [1/2, 1/4, 1/4] -> 1.5 bits */
    ASSERT_NEAR(fmoe_entropy_bits((int64_t[]){2, 1, 1}, 3), 1.5, 1e-12);
}

/*
 * One layer, 4 experts, top-2. Request: a prefill of two tokens that both choose {0,1},
 * then one decode token choosing {2,3}.
 *   fine:   prefill counts [2,2,0,0] -> 1 bit; decode [0,0,1,1] -> 1 bit; mean 1 bit.
 *   coarse: request counts [2,2,1,1] -> p = [1/3,1/3,1/6,1/6]
 *           H = 2/3 log2 3 + 1/3 log2 6 = 1.918296 bits.
 *   aggregated (Fig. 3c): after 1 iteration 1 bit, after 2 the coarse value.
 */
TEST(coarse_versus_fine_hand_worked) {
    fmoe_routing_stats *s = NULL;
    ASSERT_OK(fmoe_routing_stats_init(&s, 1, 4, 2, 8));
    const uint16_t prefill[] = {0, 1, 1, 0};
    const uint16_t decode[] = {2, 3};
    fmoe_routing_stats_begin_request(s);
    fmoe_routing_stats_add_iteration(s, 0, 2, prefill);
    fmoe_routing_stats_add_iteration(s, 1, 1, decode);
    fmoe_routing_stats_end_request(s);
    fmoe_routing_stats_finish(s);
    double coarse = 2.0 / 3.0 * log2(3.0) + 1.0 / 3.0 * log2(6.0);
    ASSERT_NEAR(s->fine_entropy[0], 1.0, 1e-12);
    ASSERT_NEAR(s->coarse_entropy[0], coarse, 1e-12);
    ASSERT_EQ(s->aggregated_len, 2);
    ASSERT_NEAR(s->aggregated_entropy[0], 1.0, 1e-12);
    ASSERT_NEAR(s->aggregated_entropy[1], coarse, 1e-12);
    ASSERT_EQ(s->prefill_tokens, 2);
    ASSERT_EQ(s->decode_tokens, 1);
    ASSERT_EQ(s->iterations, 2);
    ASSERT_EQ(s->requests, 1);
    ASSERT_EQ(s->expert_counts[0], 2);
    ASSERT_EQ(s->expert_counts[3], 1);
    fmoe_routing_stats_free(s);
}

/* Two layers are kept apart: layer 1 always picks the same pair, so its coarse entropy is
 * 1 bit while layer 0 (spread over all four) is 2 bits; means are per layer over two
 * requests. */
TEST(layers_and_requests_are_separate) {
    fmoe_routing_stats *s = NULL;
    ASSERT_OK(fmoe_routing_stats_init(&s, 2, 4, 2, 0));
    /* tokens [t][l][k] */
    const uint16_t it_a[] = {0, 1, 2, 3};
    const uint16_t it_b[] = {2, 3, 2, 3};
    for (int r = 0; r < 2; r++) {
        fmoe_routing_stats_begin_request(s);
        fmoe_routing_stats_add_iteration(s, 1, 1, it_a);
        fmoe_routing_stats_add_iteration(s, 1, 1, it_b);
        fmoe_routing_stats_end_request(s);
    }
    fmoe_routing_stats_finish(s);
    ASSERT_NEAR(s->coarse_entropy[0], 2.0, 1e-12);
    ASSERT_NEAR(s->coarse_entropy[1], 1.0, 1e-12);
    ASSERT_NEAR(s->fine_entropy[0], 1.0, 1e-12);
    ASSERT_EQ(s->requests, 2);
    ASSERT_EQ(s->aggregated_len, 0);
    fmoe_routing_stats_free(s);
}

TEST(bad_geometry_is_refused) {
    fmoe_routing_stats *s = NULL;
    ASSERT_EQ(fmoe_routing_stats_init(&s, 0, 4, 2, 0), FMOE_EINVAL);
    ASSERT_TRUE(s == NULL);
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
