/*
 * test_duoserve_predictor.c - DuoServe-MoE's predictor (lib/predictor_duoserve.c,
 * trace/predictor_file.c): the ExpertMLP's hand-written backward pass (BatchNorm on batch
 * statistics, ReLU, dropout, BCE with logits) against central differences of a float64
 * reference, its eval-mode inference against the same reference with running statistics,
 * the popularity and affinity tables (Eq. 2, Eq. 3) and the state (Eq. 5) on a hand-worked
 * example, a deterministic routing rule learned to > 99% "all K correct", one seed giving
 * bitwise-identical parameters, and the file written, read back and refused when damaged.
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

enum { GF = 3, GN = 5 };                  /* FC layers, rows */
static const int32_t GW[GF + 1] = {6, 5, 4, 3}; /* widths */

/* The ExpertMLP in float64 over params p (the fmoe layout), training mode with the given
 * dropout masks (mask[i][r*w+j], hidden layers) or eval mode (mask NULL: running stats rm,
 * rv): the mean BCE with logits against t; logits out when not NULL. */
static double ref_loss(const fmoe_expert_mlp *m, const double *p, const float *const *mask,
                       const float *const *rm, const float *const *rv, const float *x,
                       const float *t, int n, double *logits_out) {
    double a[GN][16], z[GN][16];
    for (int r = 0; r < n; r++)
        for (int j = 0; j < m->width[0]; j++) a[r][j] = x[r * m->width[0] + j];
    for (int i = 0; i < m->num_fc; i++) {
        const int Di = m->width[i], Do = m->width[i + 1];
        const double *W = p + m->w_off[i], *b = p + m->b_off[i];
        for (int r = 0; r < n; r++)
            for (int o = 0; o < Do; o++) {
                double s = b[o];
                for (int d = 0; d < Di; d++) s += W[o * Di + d] * a[r][d];
                z[r][o] = s;
            }
        if (i == m->num_fc - 1) break;
        const double *g = p + m->gamma_off[i], *be = p + m->beta_off[i];
        for (int o = 0; o < Do; o++) {
            double mu, var;
            if (mask) {
                mu = 0;
                for (int r = 0; r < n; r++) mu += z[r][o];
                mu /= n;
                var = 0;
                for (int r = 0; r < n; r++) var += (z[r][o] - mu) * (z[r][o] - mu);
                var /= n;
            } else {
                mu = rm[i][o];
                var = rv[i][o];
            }
            for (int r = 0; r < n; r++) {
                const double y = g[o] * (z[r][o] - mu) / sqrt(var + m->bn_eps) + be[o];
                a[r][o] = (y > 0 ? y : 0) * (mask ? mask[i][r * Do + o] : 1.0);
            }
        }
    }
    const int J = m->width[m->num_fc];
    double total = 0;
    for (int r = 0; r < n; r++)
        for (int j = 0; j < J; j++) {
            const double xl = z[r][j], y = t[r * J + j];
            total += (xl > 0 ? xl : 0) - xl * y + log1p(exp(-fabs(xl)));
            if (logits_out) logits_out[r * J + j] = xl;
        }
    return total / (n * J);
}

static void make_batch(float *x, float *t) {
    rng_state = 0x51ED2701;
    for (int i = 0; i < GN * GW[0]; i++) x[i] = (float)(4.0 * rnd() - 2.0);
    for (int i = 0; i < GN * GW[GF]; i++) t[i] = rnd() < 0.4 ? 1.0f : 0.0f;
}

TEST(expert_mlp_backward_matches_finite_differences) {
    fmoe_expert_mlp m;
    fmoe_expert_mlp_work w;
    ASSERT_OK(fmoe_expert_mlp_init(&m, GF, GW));
    ASSERT_OK(fmoe_expert_mlp_work_init(&w, &m, GN));
    fmoe_expert_mlp_randomize(&m, 17);
    /* BatchNorm scale and shift away from 1 and 0, so their gradients are tested too */
    rng_state = 99;
    for (int i = 0; i < GF - 1; i++)
        for (int j = 0; j < GW[i + 1]; j++) {
            m.params[m.gamma_off[i] + j] = (float)(0.5 + rnd());
            m.params[m.beta_off[i] + j] = (float)(rnd() - 0.3);
        }
    m.dropout = 0.25f; /* masks drawn, some units dropped */
    float x[GN * 6], t[GN * 3];
    make_batch(x, t);
    float *grad = malloc((size_t)m.num_params * sizeof *grad);
    ASSERT_TRUE(grad != NULL);
    const double loss = fmoe_expert_mlp_loss_grad(&m, &w, x, t, GN, 1234, grad, 0);

    /* relu's kink lies outside every central difference's reach, and dropout did drop */
    int dropped = 0;
    for (int i = 0; i < GF - 1; i++)
        for (int q = 0; q < GN * GW[i + 1]; q++) {
            ASSERT_TRUE(fabs(w.y[i][q]) > 1e-4);
            dropped += w.mask[i][q] == 0.0f;
        }
    ASSERT_TRUE(dropped > 0);

    double *p = calloc((size_t)m.num_params, sizeof *p);
    ASSERT_TRUE(p != NULL);
    for (int64_t i = 0; i < m.num_params; i++) p[i] = m.params[i];
    const float *masks[GF] = {w.mask[0], w.mask[1], NULL};
    ASSERT_NEAR(loss, ref_loss(&m, p, masks, NULL, NULL, x, t, GN, NULL), 1e-5);
    /* Bound: |analytic - numeric| <= 1e-5 + 2e-3 |numeric| element by element (float32
     * sums of a few terms), and each parameter group's relative error below 1e-3. */
    double num2 = 0, diff2 = 0;
    for (int64_t i = 0; i < m.num_params; i++) {
        const double h = 1e-6, keep = p[i];
        p[i] = keep + h;
        const double up = ref_loss(&m, p, masks, NULL, NULL, x, t, GN, NULL);
        p[i] = keep - h;
        const double down = ref_loss(&m, p, masks, NULL, NULL, x, t, GN, NULL);
        p[i] = keep;
        const double numeric = (up - down) / (2 * h), analytic = grad[i];
        if (!(fabs(analytic - numeric) <= 1e-5 + 2e-3 * fabs(numeric)))
            HARNESS_FAIL("parameter %lld: analytic %.9g, numeric %.9g", (long long)i, analytic,
                         numeric);
        num2 += numeric * numeric;
        diff2 += (analytic - numeric) * (analytic - numeric);
    }
    if (!(sqrt(diff2) <= 1e-3 * sqrt(num2)))
        HARNESS_FAIL("gradient relative error %.3g", sqrt(diff2 / num2));
    ASSERT_TRUE(num2 > 0);

    /* Eval mode: the running statistics (moved once by a training step) and no dropout. */
    ASSERT_TRUE(fmoe_expert_mlp_loss_grad(&m, &w, x, t, GN, 1, NULL, 1) > 0);
    float logits[GN * 3];
    double ref_logits[GN * 3];
    fmoe_expert_mlp_infer(&m, &w, x, GN, logits);
    const float *rm[GF] = {m.running_mean[0], m.running_mean[1], NULL};
    const float *rv[GF] = {m.running_var[0], m.running_var[1], NULL};
    const double eval = ref_loss(&m, p, NULL, rm, rv, x, t, GN, ref_logits);
    for (int q = 0; q < GN * 3; q++) ASSERT_NEAR(logits[q], ref_logits[q], 1e-5);
    ASSERT_NEAR(fmoe_expert_mlp_loss(&m, &w, x, t, GN), eval, 1e-6);
    free(p);
    free(grad);
    fmoe_expert_mlp_work_free(&w);
    fmoe_expert_mlp_free(&m);
}

/* ---------------------------------------------------------------- tables and state */

/* L = 3, J = 4, K = 2; three tokens:
 *   token 0: {0,1} {2,3} {0,2}     token 1: {0,2} {2,1} {3,0}     token 2: {1,3} {3,2} {0,1}
 * Eq. 2, layer 0: counts 0:2 1:2 2:1 3:1 of 6 -> 1/3 1/3 1/6 1/6.
 * Eq. 3, A_{0,1} row 0 (token 0: 0 -> {2,3}; token 1: 0 -> {2,1}): 1:1 2:2 3:1 of 4;
 * row 3 (token 2: 3 -> {3,2}): 2: 1/2, 3: 1/2. */
TEST(tables_and_state_by_hand) {
    const uint16_t ex[3][3][2] = {{{0, 1}, {2, 3}, {0, 2}},
                                  {{0, 2}, {2, 1}, {3, 0}},
                                  {{1, 3}, {3, 2}, {0, 1}}};
    int32_t widths[8];
    const int32_t F = fmoe_duoserve_widths(3, 4, 0, widths);
    ASSERT_EQ(F, 7);
    ASSERT_EQ(widths[0], 16);
    ASSERT_EQ(widths[1], 124); /* 2048 · 16/264, rounded */
    ASSERT_EQ(widths[6], 16);  /* 3.9 -> the floor of 16 */
    ASSERT_EQ(widths[7], 4);
    fmoe_predictor *p = NULL;
    ASSERT_OK(fmoe_predictor_alloc_duoserve(&p, 3, 4, 2, F, widths));
    ASSERT_OK(fmoe_duoserve_tables(p, &ex[0][0][0], 3));
    ASSERT_NEAR(p->popularity[0], 1.0 / 3, 1e-7);
    ASSERT_NEAR(p->popularity[2], 1.0 / 6, 1e-7);
    const float *A0 = p->affinity; /* A_{0,1} */
    ASSERT_NEAR(A0[0 * 4 + 0], 0, 0);
    ASSERT_NEAR(A0[0 * 4 + 1], 0.25, 1e-7);
    ASSERT_NEAR(A0[0 * 4 + 2], 0.5, 1e-7);
    ASSERT_NEAR(A0[3 * 4 + 2], 0.5, 1e-7);
    ASSERT_NEAR(A0[3 * 4 + 3], 0.5, 1e-7);
    for (int l = 0; l < 2; l++) /* every row of a chosen expert sums to 1, the others 0 */
        for (int i = 0; i < 4; i++) {
            double s = 0;
            for (int j = 0; j < 4; j++) s += p->affinity[(size_t)l * 16 + i * 4 + j];
            ASSERT_NEAR(s, l == 1 && i == 0 ? 0.0 : 1.0, 1e-6); /* 0 is never chosen at 1 */
        }
    /* s_2 of token 0: history rows 0 {0,1} and 1 {2,3}; P_2; mean of A_{1,2} rows 2, 3 */
    float s[16];
    fmoe_duoserve_state(p, 2, &ex[0][0][0], 2, s);
    const float hist[8] = {1, 1, 0, 0, 0, 0, 1, 1};
    for (int j = 0; j < 8; j++) ASSERT_NEAR(s[j], hist[j], 0);
    for (int j = 0; j < 4; j++) ASSERT_NEAR(s[8 + j], p->popularity[8 + j], 0);
    const float *A1 = p->affinity + 16;
    for (int j = 0; j < 4; j++) ASSERT_NEAR(s[12 + j], (A1[2 * 4 + j] + A1[3 * 4 + j]) / 2, 1e-7);
    /* s_1: only row 0 of the history; the rest zero-padded */
    fmoe_duoserve_state(p, 1, &ex[0][0][0], 2, s);
    for (int j = 4; j < 8; j++) ASSERT_NEAR(s[j], 0, 0);
    /* an expert id out of range is refused */
    const uint16_t bad[3][2] = {{0, 9}, {0, 1}, {0, 1}};
    ASSERT_EQ(fmoe_duoserve_tables(p, &bad[0][0], 1), FMOE_EINVAL);
    fmoe_predictor_free(p);
}

/* ---------------------------------------------------------------- learning a rule */

/* Layer 0 picks a random pair; layer l+1's experts are (3e + 1) mod J of layer l's (a
 * bijection, so K distinct): the state's history determines the answer exactly. */
enum { RL = 4, RJ = 8, RK = 2, RTRAIN = 600, RVAL = 200 };

static void rule_tokens(uint16_t *ex, int n, uint64_t seed) {
    rng_state = seed;
    for (int t = 0; t < n; t++) {
        uint16_t *e = ex + (size_t)t * RL * RK;
        e[0] = (uint16_t)(rnd() * RJ);
        do e[1] = (uint16_t)(rnd() * RJ); while (e[1] == e[0]);
        for (int l = 1; l < RL; l++)
            for (int k = 0; k < RK; k++) e[l * RK + k] = (uint16_t)((3 * e[(l - 1) * RK + k] + 1) % RJ);
    }
}

static void rule_rows(const fmoe_predictor *p, const uint16_t *ex, int n, float *x, float *t) {
    const int D = fmoe_duoserve_input_dim(RL, RJ);
    memset(t, 0, sizeof(float) * (size_t)n * (RL - 1) * RJ);
    for (int tok = 0; tok < n; tok++)
        for (int l = 1; l < RL; l++) {
            const size_t r = (size_t)tok * (RL - 1) + (size_t)(l - 1);
            fmoe_duoserve_state(p, l, ex + (size_t)tok * RL * RK, RK, x + r * D);
            for (int k = 0; k < RK; k++) t[r * RJ + ex[(size_t)tok * RL * RK + l * RK + k]] = 1;
        }
}

static const fmoe_mlp_train_params rule_params = {
    .batch = 64, .max_epochs = 60, .patience = 5, .lr = 1e-3, .seed = 7};

static int train_rule(fmoe_predictor **out, int32_t epochs, uint64_t seed, double *acc) {
    uint16_t *tr = malloc(sizeof(uint16_t) * RTRAIN * RL * RK);
    uint16_t *va = malloc(sizeof(uint16_t) * RVAL * RL * RK);
    const int D = fmoe_duoserve_input_dim(RL, RJ);
    float *xt = malloc(sizeof(float) * RTRAIN * (RL - 1) * D);
    float *tt = malloc(sizeof(float) * RTRAIN * (RL - 1) * RJ);
    float *xv = malloc(sizeof(float) * RVAL * (RL - 1) * D);
    float *tv = malloc(sizeof(float) * RVAL * (RL - 1) * RJ);
    if (!tr || !va || !xt || !tt || !xv || !tv) return FMOE_ENOMEM;
    rule_tokens(tr, RTRAIN, 1);
    rule_tokens(va, RVAL, 2);
    int32_t widths[8];
    const int32_t F = fmoe_duoserve_widths(RL, RJ, 0, widths);
    int rc = fmoe_predictor_alloc_duoserve(out, RL, RJ, RK, F, widths);
    if (rc == 0) rc = fmoe_duoserve_tables(*out, tr, RTRAIN);
    if (rc == 0) {
        rule_rows(*out, tr, RTRAIN, xt, tt);
        rule_rows(*out, va, RVAL, xv, tv);
        fmoe_mlp_train_params tp = rule_params;
        tp.max_epochs = epochs;
        tp.seed = seed;
        rc = fmoe_expert_mlp_train((*out)->expert_mlp, xt, tt, RTRAIN * (RL - 1), xv, tv,
                                   RVAL * (RL - 1), &tp, NULL);
    }
    if (rc == 0 && acc) { /* "all K correct" over the validation rows */
        fmoe_expert_mlp_work w;
        rc = fmoe_expert_mlp_work_init(&w, (*out)->expert_mlp, 1);
        int all = 0;
        for (int r = 0; rc == 0 && r < RVAL * (RL - 1); r++) {
            float logits[RJ];
            int32_t top[RK];
            fmoe_expert_mlp_infer((*out)->expert_mlp, &w, xv + (size_t)r * D, 1, logits);
            fmoe_topk_indices(logits, RJ, RK, top);
            all += tv[(size_t)r * RJ + top[0]] == 1 && tv[(size_t)r * RJ + top[1]] == 1;
        }
        *acc = (double)all / (RVAL * (RL - 1));
        fmoe_expert_mlp_work_free(&w);
    }
    free(tr);
    free(va);
    free(xt);
    free(tt);
    free(xv);
    free(tv);
    return rc;
}

TEST(learns_a_deterministic_routing_rule) {
    fmoe_predictor *p = NULL;
    double acc = 0;
    ASSERT_OK(train_rule(&p, 60, 7, &acc));
    fprintf(stderr, "  rule (3e+1) mod 8: all %d experts right on %.4f of %d held-out rows\n",
            RK, acc, RVAL * (RL - 1));
    if (!(acc > 0.99)) HARNESS_FAIL("all-correct %.4f, expected > 0.99", acc);
    fmoe_predictor_free(p);
}

TEST(one_seed_gives_bitwise_identical_parameters) {
    fmoe_predictor *a = NULL, *b = NULL, *c = NULL;
    ASSERT_OK(train_rule(&a, 3, 7, NULL));
    ASSERT_OK(train_rule(&b, 3, 7, NULL));
    ASSERT_OK(train_rule(&c, 3, 8, NULL));
    const fmoe_expert_mlp *ma = a->expert_mlp, *mb = b->expert_mlp, *mc = c->expert_mlp;
    ASSERT_TRUE(memcmp(ma->params, mb->params, sizeof(float) * (size_t)ma->num_params) == 0);
    ASSERT_TRUE(memcmp(ma->running_var[0], mb->running_var[0],
                       sizeof(float) * (size_t)ma->width[1]) == 0);
    ASSERT_TRUE(memcmp(ma->params, mc->params, sizeof(float) * (size_t)ma->num_params) != 0);
    fmoe_predictor_free(a);
    fmoe_predictor_free(b);
    fmoe_predictor_free(c);
}

/* ---------------------------------------------------------------- the file */

TEST(duoserve_file_round_trip_and_damage) {
    char path[] = "/tmp/fmoe-test-duoserve-XXXXXX";
    fmoe_predictor *p = NULL, *q = NULL;
    ASSERT_OK(train_rule(&p, 2, 7, NULL));
    strcpy(p->model_fingerprint, "feed");
    strcpy(p->target, "none");
    p->seed = 7;
    p->split = 0.7;
    p->val_all_correct[2] = 0.5f;
    predictor_round_trip(harness_failed, p, path, &q);
    ASSERT_STR_EQ(q->kind, "duoserve");
    ASSERT_STR_EQ(q->model_fingerprint, "feed");
    ASSERT_EQ(q->num_layers, RL);
    ASSERT_EQ(q->top_k, RK);
    ASSERT_EQ(q->expert_mlp->num_fc, p->expert_mlp->num_fc);
    for (int i = 0; i <= p->expert_mlp->num_fc; i++)
        ASSERT_EQ(q->expert_mlp->width[i], p->expert_mlp->width[i]);
    ASSERT_TRUE(memcmp(p->expert_mlp->params, q->expert_mlp->params,
                       sizeof(float) * (size_t)p->expert_mlp->num_params) == 0);
    ASSERT_TRUE(memcmp(p->expert_mlp->running_mean[3], q->expert_mlp->running_mean[3],
                       sizeof(float) * (size_t)p->expert_mlp->width[4]) == 0);
    ASSERT_TRUE(memcmp(p->affinity, q->affinity, sizeof(float) * (RL - 1) * RJ * RJ) == 0);
    ASSERT_TRUE(isnan(q->val_all_correct[0]));
    ASSERT_NEAR(q->val_all_correct[2], 0.5, 0);
    ASSERT_NEAR(q->expert_mlp->dropout, 0.1, 1e-7);
    fmoe_predictor_free(q);

    predictor_expect_truncated_refused(harness_failed, path, 4000);
    unlink(path);
    fmoe_predictor_free(p);
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
