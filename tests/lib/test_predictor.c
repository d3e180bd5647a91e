/*
 * test_predictor.c - the learned expert predictor (lib/predictor.c, lib/predictor_eval.c,
 * trace/predictor_file.c): the backward pass against finite differences of a float64
 * reference, Adam against a step worked by hand, a synthetic routing rule learned to > 99%
 * top-1 accuracy, bitwise-identical weights for one seed, top-K and the token table, and
 * the predictor file written, read back and refused when damaged.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fmoe/error.h"
#include "fmoe/predictor.h"
#include "harness.h"
#include "predictor_test_util.h"

/* ---------------------------------------------------------------- float64 reference */

typedef struct ref_params {
    double *w1, *b1, *w2, *b2; /* same layout as fmoe_mlp */
} ref_params;

/* Mean cross-entropy of the MLP in float64. */
static double ref_loss(const ref_params *p, int D, int H, int J, const float *x, const float *t,
                       int n) {
    double total = 0;
    double z[64], l[64];
    for (int r = 0; r < n; r++) {
        for (int j = 0; j < H; j++) {
            double s = p->b1[j];
            for (int i = 0; i < D; i++) s += p->w1[j * D + i] * x[r * D + i];
            z[j] = s > 0 ? s : 0;
        }
        double mx = -1e300;
        for (int o = 0; o < J; o++) {
            double s = p->b2[o];
            for (int j = 0; j < H; j++) s += p->w2[o * H + j] * z[j];
            l[o] = s;
            if (s > mx) mx = s;
        }
        double se = 0;
        for (int o = 0; o < J; o++) se += exp(l[o] - mx);
        for (int o = 0; o < J; o++) total -= t[r * J + o] * (l[o] - mx - log(se));
    }
    return total / n;
}

/* Central differences of ref_loss with respect to every parameter, in float64 (step 1e-6:
 * truncation O(step²) ~ 1e-12, rounding O(1e-16/step) ~ 1e-10). */
TEST(mlp_backward_matches_finite_differences) {
    enum { D = 7, H = 5, J = 4, N = 6 };
    fmoe_mlp m, g;
    fmoe_mlp_work w;
    ASSERT_OK(fmoe_mlp_init(&m, D, H, J));
    ASSERT_OK(fmoe_mlp_init(&g, D, H, J));
    ASSERT_OK(fmoe_mlp_work_init(&w, &m, N));
    fmoe_mlp_randomize(&m, 11);
    float x[N * D], t[N * J];
    rng_state = 0x1234567;
    for (int i = 0; i < N * D; i++) x[i] = (float)(4.0 * rnd() - 2.0);
    for (int r = 0; r < N; r++) { /* each target a random distribution */
        double s = 0, e[J];
        for (int o = 0; o < J; o++) s += e[o] = exp(3.0 * rnd());
        for (int o = 0; o < J; o++) t[r * J + o] = (float)(e[o] / s);
    }
    const double loss = fmoe_mlp_loss_grad(&m, &w, x, t, N, &g);

    /* No pre-activation sits within the step of relu's kink, where differences lie. */
    for (int i = 0; i < N * H; i++) ASSERT_TRUE(fabs(w.z[i]) > 1e-4);

    double pw1[H * D], pb1[H], pw2[J * H], pb2[J];
    for (int i = 0; i < H * D; i++) pw1[i] = m.w1[i];
    for (int i = 0; i < H; i++) pb1[i] = m.b1[i];
    for (int i = 0; i < J * H; i++) pw2[i] = m.w2[i];
    for (int i = 0; i < J; i++) pb2[i] = m.b2[i];
    ref_params p = {pw1, pb1, pw2, pb2};
    ASSERT_NEAR(loss, ref_loss(&p, D, H, J, x, t, N), 1e-5);

    struct {
        double *ref;
        const float *analytic;
        int n;
        const char *name;
    } groups[] = {{pw1, g.w1, H * D, "W1"}, {pb1, g.b1, H, "b1"}, {pw2, g.w2, J * H, "W2"},
                  {pb2, g.b2, J, "b2"}};
    /* Bound: |analytic - numeric| <= 1e-5 + 1e-3 |numeric| element by element (the analytic
     * gradient is float32: about 1e-7 relative rounding per sum of <= 8 terms), and the
     * relative error of each tensor's gradient as a whole below 1e-4. */
    for (size_t k = 0; k < sizeof groups / sizeof groups[0]; k++) {
        double num2 = 0, diff2 = 0;
        for (int i = 0; i < groups[k].n; i++) {
            const double h = 1e-6, keep = groups[k].ref[i];
            groups[k].ref[i] = keep + h;
            const double up = ref_loss(&p, D, H, J, x, t, N);
            groups[k].ref[i] = keep - h;
            const double down = ref_loss(&p, D, H, J, x, t, N);
            groups[k].ref[i] = keep;
            const double numeric = (up - down) / (2 * h), analytic = groups[k].analytic[i];
            if (!(fabs(analytic - numeric) <= 1e-5 + 1e-3 * fabs(numeric)))
                HARNESS_FAIL("d%s[%d]: analytic %.9g, numeric %.9g", groups[k].name, i, analytic,
                             numeric);
            num2 += numeric * numeric;
            diff2 += (analytic - numeric) * (analytic - numeric);
        }
        if (!(sqrt(diff2) <= 1e-4 * sqrt(num2) + 1e-9))
            HARNESS_FAIL("d%s: relative error %.3g", groups[k].name, sqrt(diff2 / num2));
    }
    fmoe_mlp_work_free(&w);
    fmoe_mlp_free(&g);
    fmoe_mlp_free(&m);
}

/* θ = 1, lr 0.1, β 0.9/0.999, ε 1e-8, gradients 0.5 then -1, worked by hand:
 *   t=1: m = 0.05, v = 0.00025, m̂ = 0.5, v̂ = 0.25, θ = 1 - 0.1·0.5/0.5 = 0.9
 *   t=2: m = -0.055, v = 0.00124975, m̂ = -0.055/0.19 = -0.2894737,
 *        v̂ = 0.00124975/0.001999 = 0.6251876, θ = 0.9 + 0.1·0.2894737/0.7906881 = 0.9366104
 * A parameter whose gradient is 0 does not move. */
TEST(adam_matches_hand_computed_steps) {
    fmoe_mlp p, g;
    fmoe_adam a;
    ASSERT_OK(fmoe_mlp_init(&p, 1, 1, 1));
    ASSERT_OK(fmoe_mlp_init(&g, 1, 1, 1));
    ASSERT_OK(fmoe_adam_init(&a, &p, 0.1));
    p.w1[0] = p.b1[0] = p.w2[0] = p.b2[0] = 1.0f;
    g.w1[0] = 0.5f;
    g.w2[0] = -2.0f;
    fmoe_adam_step(&a, &p, &g);
    ASSERT_NEAR(a.m.w1[0], 0.05, 1e-7); /* float32 moments */
    ASSERT_NEAR(a.v.w1[0], 0.00025, 1e-8);
    ASSERT_NEAR(p.w1[0], 0.9, 1e-5); /* float32 moments: ~1e-5 relative */
    ASSERT_NEAR(p.w2[0], 1.1, 1e-5); /* the first step is lr·sign(g) whatever |g| */
    ASSERT_NEAR(p.b1[0], 1.0, 0);
    g.w1[0] = -1.0f;
    fmoe_adam_step(&a, &p, &g);
    ASSERT_EQ(a.step, 2);
    ASSERT_NEAR(a.m.w1[0], -0.055, 1e-7);
    ASSERT_NEAR(a.v.w1[0], 0.00124975, 2e-7); /* (1 - β2) is 0.00099998713 in float32 */
    ASSERT_NEAR(p.w1[0], 0.9366104, 1e-5);
    fmoe_adam_free(&a);
    fmoe_mlp_free(&g);
    fmoe_mlp_free(&p);
}

/* ---------------------------------------------------------------- a synthetic routing rule */

enum { SD = 16, SJ = 8, SH = 64, STRAIN = 6000, SVAL = 1500 };
#define SMARGIN 0.25

/* Inputs uniform in [-1, 1]^16, routed by a fixed linear gate: the expert is argmax of A·x,
 * the target one-hot. Inputs whose two best scores lie within SMARGIN of each other are
 * drawn again, so that the rule is learnable to > 99% from a few thousand rows (a gate
 * whose top two are that close is a coin toss for any predictor). */
static void synthetic(float *x, float *t, int32_t *label, int n, uint64_t seed) {
    double A[SJ][SD];
    rng_state = 0xA5A5A5A5u;
    for (int o = 0; o < SJ; o++)
        for (int i = 0; i < SD; i++) A[o][i] = 2.0 * rnd() - 1.0;
    rng_state = seed;
    for (int r = 0; r < n; r++) {
        int best, second;
        double sc[SJ];
        do {
            for (int i = 0; i < SD; i++) x[r * SD + i] = (float)(2.0 * rnd() - 1.0);
            best = 0;
            for (int o = 0; o < SJ; o++) {
                double s = 0;
                for (int i = 0; i < SD; i++) s += A[o][i] * x[r * SD + i];
                sc[o] = s;
                if (s > sc[best]) best = o;
            }
            second = best == 0 ? 1 : 0;
            for (int o = 0; o < SJ; o++)
                if (o != best && sc[o] > sc[second]) second = o;
        } while (sc[best] - sc[second] < SMARGIN);
        for (int o = 0; o < SJ; o++) t[r * SJ + o] = o == best ? 1.0f : 0.0f;
        label[r] = best;
    }
}

typedef struct synth_data {
    float *xt, *tt, *xv, *tv;
    int32_t *lt, *lv;
} synth_data;

static int synth_alloc(synth_data *d) {
    d->xt = malloc(sizeof(float) * STRAIN * SD);
    d->tt = malloc(sizeof(float) * STRAIN * SJ);
    d->xv = malloc(sizeof(float) * SVAL * SD);
    d->tv = malloc(sizeof(float) * SVAL * SJ);
    d->lt = malloc(sizeof(int32_t) * STRAIN);
    d->lv = malloc(sizeof(int32_t) * SVAL);
    if (!d->xt || !d->tt || !d->xv || !d->tv || !d->lt || !d->lv) return -1;
    synthetic(d->xt, d->tt, d->lt, STRAIN, 1);
    synthetic(d->xv, d->tv, d->lv, SVAL, 2);
    return 0;
}

static void synth_free(synth_data *d) {
    free(d->xt);
    free(d->tt);
    free(d->xv);
    free(d->tv);
    free(d->lt);
    free(d->lv);
}

static const fmoe_mlp_train_params synth_params = {
    .batch = 64, .max_epochs = 200, .patience = 10, .lr = 3e-3, .seed = 42};

TEST(learns_a_synthetic_routing_rule) {
    synth_data d;
    ASSERT_TRUE(synth_alloc(&d) == 0);
    fmoe_mlp m;
    fmoe_mlp_work w;
    ASSERT_OK(fmoe_mlp_init(&m, SD, SH, SJ));
    fmoe_mlp_train_report rep;
    ASSERT_OK(fmoe_mlp_train(&m, d.xt, d.tt, STRAIN, d.xv, d.tv, SVAL, &synth_params, &rep));
    ASSERT_OK(fmoe_mlp_work_init(&w, &m, SVAL));
    fmoe_mlp_forward(&m, &w, d.xv, SVAL);
    int correct = 0;
    for (int r = 0; r < SVAL; r++) {
        int32_t top;
        fmoe_topk_indices(w.p + (size_t)r * SJ, SJ, 1, &top);
        correct += top == d.lv[r];
    }
    const double acc = (double)correct / SVAL;
    fprintf(stderr, "  synthetic rule: top-1 %.4f on %d held-out rows after %d epochs (best %d, "
                    "val loss %.4f)\n",
            acc, SVAL, rep.epochs, rep.best_epoch, rep.val_loss);
    if (!(acc > 0.99)) HARNESS_FAIL("top-1 accuracy %.4f, expected > 0.99", acc);
    ASSERT_TRUE(rep.best_epoch >= 1 && rep.best_epoch <= rep.epochs);
    fmoe_mlp_work_free(&w);
    fmoe_mlp_free(&m);
    synth_free(&d);
}

TEST(one_seed_gives_bitwise_identical_weights) {
    synth_data d;
    ASSERT_TRUE(synth_alloc(&d) == 0);
    fmoe_mlp_train_params p = synth_params;
    p.max_epochs = 5;
    fmoe_mlp a, b, c;
    ASSERT_OK(fmoe_mlp_init(&a, SD, SH, SJ));
    ASSERT_OK(fmoe_mlp_init(&b, SD, SH, SJ));
    ASSERT_OK(fmoe_mlp_init(&c, SD, SH, SJ));
    ASSERT_OK(fmoe_mlp_train(&a, d.xt, d.tt, STRAIN, d.xv, d.tv, SVAL, &p, NULL));
    ASSERT_OK(fmoe_mlp_train(&b, d.xt, d.tt, STRAIN, d.xv, d.tv, SVAL, &p, NULL));
    p.seed = 43;
    ASSERT_OK(fmoe_mlp_train(&c, d.xt, d.tt, STRAIN, d.xv, d.tv, SVAL, &p, NULL));
    ASSERT_TRUE(memcmp(a.w1, b.w1, sizeof(float) * SH * SD) == 0);
    ASSERT_TRUE(memcmp(a.b1, b.b1, sizeof(float) * SH) == 0);
    ASSERT_TRUE(memcmp(a.w2, b.w2, sizeof(float) * SJ * SH) == 0);
    ASSERT_TRUE(memcmp(a.b2, b.b2, sizeof(float) * SJ) == 0);
    ASSERT_TRUE(memcmp(a.w1, c.w1, sizeof(float) * SH * SD) != 0); /* the seed matters */
    fmoe_mlp_free(&a);
    fmoe_mlp_free(&b);
    fmoe_mlp_free(&c);
    synth_free(&d);
}

/* ---------------------------------------------------------------- evaluation helpers */

TEST(topk_breaks_ties_to_the_lower_index) {
    const float s[6] = {0.1f, 0.5f, 0.5f, 0.2f, 0.9f, 0.2f};
    int32_t top[3];
    fmoe_topk_indices(s, 6, 3, top);
    ASSERT_EQ(top[0], 4);
    ASSERT_EQ(top[1], 1);
    ASSERT_EQ(top[2], 2);
    const uint16_t actual[3] = {2, 3, 4};
    ASSERT_EQ(fmoe_topk_overlap(top, actual, 3), 2);
}

TEST(token_table_predicts_the_most_frequent_experts_per_token) {
    /* K = 2 of J = 4; token 7 chose {1,2} twice and {1,3} once; token 9 chose {0,3};
     * the overall counts are 0:1 1:3 2:2 3:2. */
    const int32_t ids[5] = {7, 9, 7, -1, 7};
    const uint16_t ex[5][2] = {{1, 2}, {0, 3}, {2, 1}, {0, 0}, {3, 1}};
    fmoe_token_table *t = NULL;
    ASSERT_OK(fmoe_token_table_build(&t, 4, 2, ids, &ex[0][0], 2, 5));
    int32_t p[2];
    fmoe_token_table_predict(t, 7, p);
    ASSERT_EQ(p[0], 1);
    ASSERT_EQ(p[1], 2);
    fmoe_token_table_predict(t, 9, p);
    ASSERT_EQ(p[0], 0);
    ASSERT_EQ(p[1], 3);
    fmoe_token_table_predict(t, 1000, p); /* unseen: the overall counts, ties to lower ids */
    ASSERT_EQ(p[0], 1);
    ASSERT_EQ(p[1], 2);
    fmoe_token_table_free(t);
}

/* ---------------------------------------------------------------- the file */

TEST(predictor_file_round_trip_and_damage) {
    char path[] = "/tmp/fmoe-test-predictor-XXXXXX";
    fmoe_predictor *p = NULL, *q = NULL;
    ASSERT_OK(fmoe_predictor_alloc(&p, 4, 8, 2, 16, 6, 2));
    ASSERT_EQ(p->source_layer[1], 0);
    ASSERT_EQ(p->source_layer[2], 0);
    ASSERT_EQ(p->source_layer[3], 1);
    strcpy(p->model_fingerprint, "abc123");
    strcpy(p->target, "full");
    p->seed = 5;
    p->split = 0.7;
    for (int i = 1; i < 4; i++) {
        fmoe_mlp_randomize(&p->layers[i], (uint64_t)i);
        p->val_accuracy[i] = 0.5f + 0.1f * (float)i;
    }
    predictor_round_trip(harness_failed, p, path, &q);
    ASSERT_STR_EQ(q->kind, "promoe");
    ASSERT_STR_EQ(q->model_fingerprint, "abc123");
    ASSERT_EQ(q->stride, 2);
    ASSERT_EQ(q->num_layers, 4);
    ASSERT_EQ(q->mlp_hidden, 6);
    ASSERT_EQ(q->seed, 5);
    ASSERT_NEAR(q->split, 0.7, 0);
    for (int i = 1; i < 4; i++) {
        ASSERT_TRUE(memcmp(p->layers[i].w1, q->layers[i].w1, sizeof(float) * 6 * 16) == 0);
        ASSERT_TRUE(memcmp(p->layers[i].b2, q->layers[i].b2, sizeof(float) * 8) == 0);
        ASSERT_NEAR(q->val_accuracy[i], p->val_accuracy[i], 0);
    }
    fmoe_predictor_free(q);
    q = NULL;

    predictor_expect_truncated_refused(harness_failed, path, 1000);

    /* Not HDF5 at all. */
    FILE *f = fopen(path, "wb");
    ASSERT_TRUE(f != NULL);
    fputs("not a predictor\n", f);
    fclose(f);
    ASSERT_EQ(fmoe_predictor_read(path, &q), FMOE_EFORMAT);
    ASSERT_CONTAINS(fmoe_error_detail(), "not an HDF5 file");
    unlink(path);
    fmoe_predictor_free(p);
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
