/*
 * predictor_duoserve.c - DuoServe-MoE's expert predictor ("DuoServe-MoE: Dual-Phase Expert
 * Prefetch and Cache Scheduling for Efficient MoE LLM Inference" §4.1-§4.2): the popularity
 * and affinity tables, the state the State Constructor builds, and the ExpertMLP with its
 * hand-written backward pass and its trainer: Adam on mini-batches with early stopping, in
 * the loop it shares with ProMoE's predictor (predictor_train.c). Contracts in
 * fmoe/predictor.h.
 *
 * What the paper leaves open and we chose (docs/policies.md#learned-predictors):
 *   - an episode is one token's forward pass (§4.1), prefill and decode tokens alike;
 *   - the history h_l is an (L-1)×J multi-hot, zero past layer l-1 (rather than the paper's
 *     zero-padded index list, where index 0 would collide with the padding); a_{l-1,l} is
 *     the mean of the K affinity rows of the experts chosen at l-1 (§5.3: "the inter-layer
 *     affinity vector from the previous layer's expert selection");
 *   - one model shared by all target layers (the paper's singular "the predictor"); the
 *     layer is implicit in where the history stops and in p_l;
 *   - widths 2048 -> 1024 -> 512 -> 256 -> 128 -> 64 -> J: six hidden FC layers and the output,
 *     "seven fully connected layers" (§4.2), scaled to the model (fmoe_duoserve_widths);
 *     BatchNorm + ReLU + Dropout(0.1) after each hidden layer, none after the output (a
 *     ReLU there would make every σ >= 1/2);
 *   - Eq. 6 averaged over the n·J outputs (PyTorch's BCEWithLogitsLoss; the sum of the paper
 *     only rescales the step Adam normalises anyway); Adam lr 1e-3, batches of 64, early
 *     stop after 3 epochs without a 0.01% better validation loss, as fmoe_mlp_train.
 *
 * Cost per training step of n rows: for each FC layer i three sgemm of n·w_i·w_{i+1}
 * multiply-adds (forward, dW, dx) and O(n·w_{i+1}) for BatchNorm, ReLU and dropout. Nothing
 * allocates inside an epoch.
 *
 * Determinism: the batch statistics, bias and BatchNorm gradients and the losses are sums
 * over rows in row order; shuffles and dropout masks come from our own splitmix64 streams;
 * sgemm is deterministic for one thread count and CPU kernel. Inference for a policy
 * (fmoe_expert_mlp_infer) uses no BLAS at all.
 */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/predictor.h"
#include "predictor_train.h"

/* ---------------------------------------------------------------------------------------
 * The ExpertMLP
 * ------------------------------------------------------------------------------------- */

static int hidden_layer(const fmoe_expert_mlp *m, int32_t i) { return i < m->num_fc - 1; }

int fmoe_expert_mlp_init(fmoe_expert_mlp *m, int32_t num_fc, const int32_t *widths) {
    FMOE_RETURN_ERROR_IF(!m || !widths, FMOE_EINVAL, "fmoe_expert_mlp_init: NULL argument");
    memset(m, 0, sizeof *m);
    FMOE_RETURN_ERROR_IF(num_fc < 1 || num_fc > FMOE_EXPERT_MLP_MAX_FC, FMOE_EINVAL,
                         "ExpertMLP: %d fully connected layers, expected 1..%d", num_fc,
                         FMOE_EXPERT_MLP_MAX_FC);
    for (int32_t i = 0; i <= num_fc; i++)
        FMOE_RETURN_ERROR_IF(widths[i] < 1 || widths[i] > (1 << 20), FMOE_EINVAL,
                             "ExpertMLP: width %d of layer %d, expected 1..%d", widths[i], i,
                             1 << 20);
    m->num_fc = num_fc;
    memcpy(m->width, widths, (size_t)(num_fc + 1) * sizeof *widths);
    m->dropout = 0.1f;
    m->bn_eps = 1e-5f;
    m->bn_momentum = 0.1f;
    int64_t off = 0, nstats = 0;
    for (int32_t i = 0; i < num_fc; i++) {
        const int64_t in = widths[i], out = widths[i + 1];
        m->w_off[i] = off;
        off += in * out;
        m->b_off[i] = off;
        off += out;
        if (hidden_layer(m, i)) {
            m->gamma_off[i] = off;
            off += out;
            m->beta_off[i] = off;
            off += out;
            nstats += 2 * out;
        } else {
            m->gamma_off[i] = m->beta_off[i] = -1;
        }
    }
    m->num_params = off;
    m->params = calloc((size_t)off, sizeof(float));
    m->stats = calloc((size_t)(nstats > 0 ? nstats : 1), sizeof(float));
    if (!m->params || !m->stats) {
        fmoe_expert_mlp_free(m);
        return fmoe_error_set(FMOE_ENOMEM, "ExpertMLP of %lld parameters: out of memory",
                              (long long)off);
    }
    float *st = m->stats;
    for (int32_t i = 0; i < num_fc - 1; i++) {
        const int32_t out = widths[i + 1];
        m->running_mean[i] = st;
        m->running_var[i] = st + out;
        st += 2 * out;
        for (int32_t j = 0; j < out; j++) {
            m->running_var[i][j] = 1.0f;
            m->params[m->gamma_off[i] + j] = 1.0f;
        }
    }
    return 0;
}

void fmoe_expert_mlp_free(fmoe_expert_mlp *m) {
    if (!m) return;
    free(m->params);
    free(m->stats);
    memset(m, 0, sizeof *m);
}

static int64_t stats_len(const fmoe_expert_mlp *m) {
    int64_t n = 0;
    for (int32_t i = 0; i < m->num_fc - 1; i++) n += 2 * (int64_t)m->width[i + 1];
    return n;
}

void fmoe_expert_mlp_randomize(fmoe_expert_mlp *m, uint64_t seed) {
    uint64_t s = seed;
    for (int32_t i = 0; i < m->num_fc; i++) {
        const int32_t in = m->width[i], out = m->width[i + 1];
        const float k = 1.0f / sqrtf((float)in);
        float *w = m->params + m->w_off[i], *b = m->params + m->b_off[i];
        for (int64_t q = 0; q < (int64_t)in * out; q++)
            w[q] = (2.0f * fmoe__uniform01(&s) - 1.0f) * k;
        for (int32_t q = 0; q < out; q++) b[q] = (2.0f * fmoe__uniform01(&s) - 1.0f) * k;
        if (hidden_layer(m, i))
            for (int32_t q = 0; q < out; q++) {
                m->params[m->gamma_off[i] + q] = 1.0f;
                m->params[m->beta_off[i] + q] = 0.0f;
                m->running_mean[i][q] = 0.0f;
                m->running_var[i][q] = 1.0f;
            }
    }
}

void fmoe_expert_mlp_copy(fmoe_expert_mlp *dst, const fmoe_expert_mlp *src) {
    memcpy(dst->params, src->params, (size_t)src->num_params * sizeof(float));
    memcpy(dst->stats, src->stats, (size_t)stats_len(src) * sizeof(float));
}

int32_t fmoe_duoserve_widths(int32_t num_layers, int32_t num_experts, int32_t first_width,
                             int32_t *widths) {
    enum { NUM_FC = 7, PAPER_INPUT = 264 }; /* Mixtral-8x7B: (32 + 1) · 8 */
    const int32_t D = fmoe_duoserve_input_dim(num_layers, num_experts);
    const double scale = D < PAPER_INPUT ? (double)D / PAPER_INPUT : 1.0;
    const double first = first_width > 0 ? (double)first_width : 2048.0 * scale;
    widths[0] = D;
    for (int32_t i = 1; i < NUM_FC; i++) {
        const double w = floor(first / (double)(1 << (i - 1)) + 0.5);
        widths[i] = w < 16 ? 16 : (int32_t)w;
    }
    widths[NUM_FC] = num_experts;
    return NUM_FC;
}

int fmoe_expert_mlp_work_init(fmoe_expert_mlp_work *w, const fmoe_expert_mlp *m,
                              int32_t max_batch) {
    FMOE_RETURN_ERROR_IF(!w || !m || max_batch < 1, FMOE_EINVAL,
                         "fmoe_expert_mlp_work_init: bad arguments");
    memset(w, 0, sizeof *w);
    w->max_batch = max_batch;
    const size_t B = (size_t)max_batch;
    int32_t widest = 1;
    int ok = 1;
    for (int32_t i = 0; i < m->num_fc; i++) {
        const size_t out = (size_t)m->width[i + 1];
        if (m->width[i] > widest) widest = m->width[i];
        if (m->width[i + 1] > widest) widest = m->width[i + 1];
        ok &= (w->z[i] = malloc(B * out * sizeof(float))) != NULL;
        if (i < m->num_fc - 1) {
            ok &= (w->xhat[i] = malloc(B * out * sizeof(float))) != NULL;
            ok &= (w->y[i] = malloc(B * out * sizeof(float))) != NULL;
            ok &= (w->a[i] = malloc(B * out * sizeof(float))) != NULL;
            ok &= (w->mask[i] = malloc(B * out * sizeof(float))) != NULL;
            ok &= (w->mean[i] = malloc(out * sizeof(float))) != NULL;
            ok &= (w->invstd[i] = malloc(out * sizeof(float))) != NULL;
        }
    }
    ok &= (w->g0 = malloc(B * (size_t)widest * sizeof(float))) != NULL;
    ok &= (w->g1 = malloc(B * (size_t)widest * sizeof(float))) != NULL;
    if (!ok) {
        fmoe_expert_mlp_work_free(w);
        return fmoe_error_set(FMOE_ENOMEM, "ExpertMLP workspace of %d rows: out of memory",
                              max_batch);
    }
    return 0;
}

void fmoe_expert_mlp_work_free(fmoe_expert_mlp_work *w) {
    if (!w) return;
    for (int32_t i = 0; i < FMOE_EXPERT_MLP_MAX_FC; i++) {
        free(w->z[i]);
        free(w->xhat[i]);
        free(w->y[i]);
        free(w->a[i]);
        free(w->mask[i]);
        free(w->mean[i]);
        free(w->invstd[i]);
    }
    free(w->g0);
    free(w->g1);
    memset(w, 0, sizeof *w);
}

/* Binary cross-entropy with logits, summed over count outputs: max(x, 0) - x·y +
 * log(1 + exp(-|x|)), the stable form. */
static double bce_sum(const float *logit, const float *t, size_t count) {
    double total = 0;
    for (size_t i = 0; i < count; i++) {
        const double x = logit[i], y = t[i];
        total += (x > 0 ? x : 0) - x * y + log1p(exp(-fabs(x)));
    }
    return total;
}

static float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

double fmoe_expert_mlp_loss_grad(fmoe_expert_mlp *m, fmoe_expert_mlp_work *w, const float *x,
                                 const float *t, int32_t n, uint64_t dropout_seed, float *grad,
                                 int update_stats) {
    FMOE_ASSERT(n >= 2 && n <= w->max_batch);
    const int32_t F = m->num_fc;
    const float keep_scale = 1.0f / (1.0f - m->dropout);
    uint64_t ds = dropout_seed;
    /* forward */
    const float *in = x;
    for (int32_t i = 0; i < F; i++) {
        const int32_t Di = m->width[i], Do = m->width[i + 1];
        const float *W = m->params + m->w_off[i], *b = m->params + m->b_off[i];
        float *z = w->z[i];
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, Do, Di, 1.0f, in, Di, W, Di, 0.0f,
                    z, Do);
        for (int32_t r = 0; r < n; r++)
            for (int32_t j = 0; j < Do; j++) z[(size_t)r * Do + j] += b[j];
        if (i == F - 1) break;
        /* BatchNorm on the batch: mean and biased variance, in row order */
        const float *gamma = m->params + m->gamma_off[i], *beta = m->params + m->beta_off[i];
        float *mean = w->mean[i], *invstd = w->invstd[i];
        for (int32_t j = 0; j < Do; j++) {
            double s = 0, s2 = 0;
            for (int32_t r = 0; r < n; r++) s += z[(size_t)r * Do + j];
            const double mu = s / n;
            for (int32_t r = 0; r < n; r++) {
                const double d = z[(size_t)r * Do + j] - mu;
                s2 += d * d;
            }
            const double var = s2 / n;
            mean[j] = (float)mu;
            invstd[j] = (float)(1.0 / sqrt(var + m->bn_eps));
            if (update_stats) {
                const float mo = m->bn_momentum;
                m->running_mean[i][j] = (1 - mo) * m->running_mean[i][j] + mo * (float)mu;
                m->running_var[i][j] =
                    (1 - mo) * m->running_var[i][j] + mo * (float)(s2 / (n - 1));
            }
        }
        float *xh = w->xhat[i], *y = w->y[i], *a = w->a[i], *mk = w->mask[i];
        for (int32_t r = 0; r < n; r++)
            for (int32_t j = 0; j < Do; j++) {
                const size_t q = (size_t)r * Do + j;
                xh[q] = (z[q] - mean[j]) * invstd[j];
                y[q] = gamma[j] * xh[q] + beta[j];
                mk[q] = m->dropout > 0 && fmoe__uniform01(&ds) < m->dropout ? 0.0f : keep_scale;
                a[q] = (y[q] > 0 ? y[q] : 0.0f) * mk[q];
            }
        in = a;
    }
    const int32_t J = m->width[F];
    const float *logit = w->z[F - 1];
    const size_t count = (size_t)n * J;
    const double loss = bce_sum(logit, t, count) / (double)count;
    if (!grad) return loss;

    /* backward: g0 holds dL/d(FC i's output z_i) */
    float *dz = w->g0, *da = w->g1;
    const float inv = 1.0f / (float)count;
    for (size_t q = 0; q < count; q++) dz[q] = (sigmoidf_(logit[q]) - t[q]) * inv;
    for (int32_t i = F - 1; i >= 0; i--) {
        const int32_t Di = m->width[i], Do = m->width[i + 1];
        const float *a_in = i > 0 ? w->a[i - 1] : x;
        float *gW = grad + m->w_off[i], *gb = grad + m->b_off[i];
        const float *W = m->params + m->w_off[i];
        /* dW = dzᵀ · a_in, db = Σ_r dz */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Do, Di, n, 1.0f, dz, Do, a_in, Di,
                    0.0f, gW, Di);
        memset(gb, 0, (size_t)Do * sizeof(float));
        for (int32_t r = 0; r < n; r++)
            for (int32_t j = 0; j < Do; j++) gb[j] += dz[(size_t)r * Do + j];
        if (i == 0) break;
        /* da_in = dz · W */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, Di, Do, 1.0f, dz, Do, W, Di,
                    0.0f, da, Di);
        /* through dropout, ReLU and BatchNorm of hidden layer i-1 (width Di) */
        const int32_t h = i - 1;
        const float *y = w->y[h], *xh = w->xhat[h], *mk = w->mask[h], *istd = w->invstd[h];
        const float *gamma = m->params + m->gamma_off[h];
        float *gg = grad + m->gamma_off[h], *gbeta = grad + m->beta_off[h];
        for (size_t q = 0; q < (size_t)n * Di; q++) da[q] = y[q] > 0 ? da[q] * mk[q] : 0.0f;
        /* da now holds dL/dy; dγ = Σ dy·xhat, dβ = Σ dy;
         * dz = (γ·invstd/n)·(n·dy - Σ dy - xhat·Σ(dy·xhat)) */
        for (int32_t j = 0; j < Di; j++) {
            double sdy = 0, sdyx = 0;
            for (int32_t r = 0; r < n; r++) {
                const size_t q = (size_t)r * Di + j;
                sdy += da[q];
                sdyx += (double)da[q] * xh[q];
            }
            gg[j] = (float)sdyx;
            gbeta[j] = (float)sdy;
            const double c = (double)gamma[j] * istd[j] / n;
            for (int32_t r = 0; r < n; r++) {
                const size_t q = (size_t)r * Di + j;
                da[q] = (float)(c * ((double)n * da[q] - sdy - (double)xh[q] * sdyx));
            }
        }
        float *tmp = dz; /* da is the next dz */
        dz = da;
        da = tmp;
    }
    return loss;
}

/* y[r][o] = b[o] + x[r] · W[o], summed in index order. */
static void dense_in_order(const float *x, int32_t n, int32_t D, const float *W, const float *b,
                           int32_t O, float *y) {
    for (int32_t r = 0; r < n; r++)
        for (int32_t o = 0; o < O; o++) {
            const float *xr = x + (size_t)r * D, *wo = W + (size_t)o * D;
            float acc = 0.0f;
            for (int32_t d = 0; d < D; d++) acc += xr[d] * wo[d];
            y[(size_t)r * O + o] = acc + b[o];
        }
}

void fmoe_expert_mlp_infer(const fmoe_expert_mlp *m, fmoe_expert_mlp_work *w, const float *x,
                           int32_t n, float *logits) {
    FMOE_ASSERT(n >= 0 && n <= w->max_batch);
    if (n == 0) return;
    const float *in = x;
    for (int32_t i = 0; i < m->num_fc; i++) {
        const int32_t Di = m->width[i], Do = m->width[i + 1];
        const int last = i == m->num_fc - 1;
        float *z = last ? logits : w->z[i];
        dense_in_order(in, n, Di, m->params + m->w_off[i], m->params + m->b_off[i], Do, z);
        if (last) break;
        const float *gamma = m->params + m->gamma_off[i], *beta = m->params + m->beta_off[i];
        const float *rm = m->running_mean[i], *rv = m->running_var[i];
        float *a = w->a[i];
        for (int32_t j = 0; j < Do; j++) {
            const float is = 1.0f / sqrtf(rv[j] + m->bn_eps);
            for (int32_t r = 0; r < n; r++) {
                const size_t q = (size_t)r * Do + j;
                const float y = gamma[j] * ((z[q] - rm[j]) * is) + beta[j];
                a[q] = y > 0 ? y : 0.0f;
            }
        }
        in = a;
    }
}

double fmoe_expert_mlp_loss(const fmoe_expert_mlp *m, fmoe_expert_mlp_work *w, const float *x,
                            const float *t, int64_t n) {
    if (n <= 0) return 0.0;
    const int32_t D = m->width[0], J = m->width[m->num_fc];
    float *logits = w->g0;
    double total = 0;
    for (int64_t r0 = 0; r0 < n; r0 += w->max_batch) {
        const int32_t b = (int32_t)(n - r0 < w->max_batch ? n - r0 : w->max_batch);
        fmoe_expert_mlp_infer(m, w, x + (size_t)r0 * D, b, logits);
        total += bce_sum(logits, t + (size_t)r0 * J, (size_t)b * J);
    }
    return total / ((double)n * J);
}

/* ---------------------------------------------------------------------------------------
 * Training
 * ------------------------------------------------------------------------------------- */

double fmoe_expert_mlp_loss_rows(const fmoe_expert_mlp *m, fmoe_expert_mlp_work *w,
                                 const fmoe_row_source *rows, float *scratch_x,
                                 float *scratch_t) {
    if (rows->n <= 0) return 0.0;
    const int32_t J = m->width[m->num_fc];
    float *logits = w->g0;
    int64_t idx[256];
    double total = 0;
    for (int64_t r0 = 0; r0 < rows->n; r0 += w->max_batch) {
        const int32_t b = (int32_t)(rows->n - r0 < w->max_batch ? rows->n - r0 : w->max_batch);
        for (int32_t q0 = 0; q0 < b; q0 += 256) { /* fill in pieces of 256 indices */
            const int32_t k = b - q0 < 256 ? b - q0 : 256;
            for (int32_t q = 0; q < k; q++) idx[q] = r0 + q0 + q;
            rows->fill(rows->ctx, idx, k, scratch_x + (size_t)q0 * m->width[0],
                       scratch_t + (size_t)q0 * J);
        }
        fmoe_expert_mlp_infer(m, w, scratch_x, b, logits);
        total += bce_sum(logits, scratch_t, (size_t)b * J);
    }
    return total / ((double)rows->n * J);
}

/* The ExpertMLP as the shared training loop sees it (predictor_train.h). */
typedef struct expert_mlp_trainee {
    fmoe_expert_mlp *m, best;
    fmoe_expert_mlp_work work;
    const fmoe_row_source *train, *val;
    float *xb, *tb;       /* the batch's rows, filled */
    float *grad, *mo, *v; /* [num_params]: the gradient and Adam's moments */
    fmoe_adam adam;       /* Adam's step size, betas, eps and step count (not its moments) */
    uint64_t drop;        /* the dropout masks' stream */
} expert_mlp_trainee;

static double expert_mlp_step(void *ctx, const int64_t *rows, int32_t n) {
    expert_mlp_trainee *c = ctx;
    c->train->fill(c->train->ctx, rows, n, c->xb, c->tb);
    const double loss = fmoe_expert_mlp_loss_grad(c->m, &c->work, c->xb, c->tb, n,
                                                  fmoe_splitmix64(&c->drop), c->grad, 1);
    c->adam.step++;
    fmoe__adam_update(&c->adam, c->m->params, c->grad, c->mo, c->v, (size_t)c->m->num_params);
    return loss;
}

static double expert_mlp_val_loss(void *ctx) {
    expert_mlp_trainee *c = ctx;
    return fmoe_expert_mlp_loss_rows(c->m, &c->work, c->val, c->xb, c->tb);
}

static void expert_mlp_keep_best(void *ctx) {
    expert_mlp_trainee *c = ctx;
    fmoe_expert_mlp_copy(&c->best, c->m);
}

static void expert_mlp_restore_best(void *ctx) {
    expert_mlp_trainee *c = ctx;
    fmoe_expert_mlp_copy(c->m, &c->best);
}

int fmoe_expert_mlp_train_rows(fmoe_expert_mlp *m, const fmoe_row_source *train,
                               const fmoe_row_source *val, const fmoe_mlp_train_params *params,
                               fmoe_mlp_train_report *report) {
    FMOE_RETURN_ERROR_IF(!m || !m->params || !params || !train || !train->fill ||
                             train->n < 2 || (val && val->n < 0) ||
                             (val && val->n > 0 && !val->fill),
                         FMOE_EINVAL,
                         "fmoe_expert_mlp_train: bad arguments (%lld training rows; at least 2)",
                         train ? (long long)train->n : 0LL);
    fmoe__train_settings s = fmoe__train_settings_of(params);
    if (s.batch < 2) s.batch = 2; /* BatchNorm needs two rows */
    const size_t D = (size_t)m->width[0], J = (size_t)m->width[m->num_fc];
    const size_t P = (size_t)m->num_params;
    expert_mlp_trainee c = {.m = m, .train = train, .val = val,
                            .adam = {.lr = s.lr, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8},
                            /* the dropout masks' stream: the weights take the seed itself,
                             * the shuffles a third stream (predictor_train.c) */
                            .drop = params->seed ^ 0x8CB92BA72F3D8DD7ull};
    c.xb = malloc((size_t)s.batch * D * sizeof(float));
    c.tb = malloc((size_t)s.batch * J * sizeof(float));
    c.grad = malloc(P * sizeof(float));
    c.mo = calloc(P, sizeof(float));
    c.v = calloc(P, sizeof(float));
    int rc = c.xb && c.tb && c.grad && c.mo && c.v
                 ? 0
                 : fmoe_error_set(FMOE_ENOMEM, "ExpertMLP training: out of memory");
    if (rc == 0) rc = fmoe_expert_mlp_init(&c.best, m->num_fc, m->width);
    if (rc == 0) rc = fmoe_expert_mlp_work_init(&c.work, m, s.batch);
    if (rc == 0) {
        fmoe_expert_mlp_randomize(m, params->seed);
        const fmoe__trainee t = {&c, expert_mlp_step, expert_mlp_val_loss, expert_mlp_keep_best,
                                 expert_mlp_restore_best};
        /* min_batch 2: a last batch of one row has no batch statistics for BatchNorm */
        rc = fmoe__train_early_stop(&t, train->n, val ? val->n : 0, &s, 2, params, report);
    }
    fmoe_expert_mlp_work_free(&c.work);
    fmoe_expert_mlp_free(&c.best);
    free(c.v);
    free(c.mo);
    free(c.grad);
    free(c.tb);
    free(c.xb);
    return rc;
}

/* Rows of dense arrays. */
typedef struct dense_rows {
    const float *x, *t;
    size_t D, J;
} dense_rows;

static void dense_fill(void *ctx, const int64_t *idx, int32_t n, float *x, float *t) {
    const dense_rows *d = ctx;
    for (int32_t r = 0; r < n; r++) {
        memcpy(x + (size_t)r * d->D, d->x + (size_t)idx[r] * d->D, d->D * sizeof(float));
        memcpy(t + (size_t)r * d->J, d->t + (size_t)idx[r] * d->J, d->J * sizeof(float));
    }
}

int fmoe_expert_mlp_train(fmoe_expert_mlp *m, const float *x_train, const float *t_train,
                          int64_t n_train, const float *x_val, const float *t_val, int64_t n_val,
                          const fmoe_mlp_train_params *params, fmoe_mlp_train_report *report) {
    FMOE_RETURN_ERROR_IF(!m || !m->params || !x_train || !t_train || n_val < 0 ||
                             (n_val > 0 && (!x_val || !t_val)),
                         FMOE_EINVAL, "fmoe_expert_mlp_train: bad arguments");
    const size_t D = (size_t)m->width[0], J = (size_t)m->width[m->num_fc];
    dense_rows tr = {x_train, t_train, D, J}, va = {x_val, t_val, D, J};
    const fmoe_row_source train = {n_train, dense_fill, &tr}, val = {n_val, dense_fill, &va};
    return fmoe_expert_mlp_train_rows(m, &train, &val, params, report);
}

/* ---------------------------------------------------------------------------------------
 * The tables and the state (§4.1-§4.2)
 * ------------------------------------------------------------------------------------- */

int fmoe_predictor_alloc_duoserve(fmoe_predictor **out, int32_t num_layers, int32_t num_experts,
                                  int32_t top_k, int32_t num_fc, const int32_t *widths) {
    FMOE_RETURN_ERROR_IF(!out || !widths, FMOE_EINVAL,
                         "fmoe_predictor_alloc_duoserve: NULL argument");
    *out = NULL;
    FMOE_RETURN_ERROR_IF(num_layers < 2 || num_experts < 2 || top_k < 1 ||
                             top_k > num_experts || num_fc < 1 ||
                             num_fc > FMOE_EXPERT_MLP_MAX_FC,
                         FMOE_EINVAL,
                         "duoserve predictor geometry: L %d, J %d, K %d, %d FC layers: expected "
                         "L >= 2, 1 <= K <= J, J >= 2, 1..%d FC layers",
                         num_layers, num_experts, top_k, num_fc, FMOE_EXPERT_MLP_MAX_FC);
    FMOE_RETURN_ERROR_IF(widths[0] != fmoe_duoserve_input_dim(num_layers, num_experts) ||
                             widths[num_fc] != num_experts,
                         FMOE_EINVAL,
                         "duoserve predictor: ExpertMLP %d -> ... -> %d, expected input (L+1)·J "
                         "= %d and output J = %d",
                         widths[0], widths[num_fc], fmoe_duoserve_input_dim(num_layers, num_experts),
                         num_experts);
    fmoe_predictor *p = calloc(1, sizeof *p);
    if (!p) return fmoe_error_set(FMOE_ENOMEM, "predictor: out of memory");
    strcpy(p->kind, FMOE_PREDICTOR_KIND_DUOSERVE);
    p->stride = 1;
    p->num_layers = num_layers;
    p->num_experts = num_experts;
    p->top_k = top_k;
    const size_t L = (size_t)num_layers, J = (size_t)num_experts;
    p->expert_mlp = calloc(1, sizeof *p->expert_mlp);
    p->popularity = calloc(L * J, sizeof(float));
    p->affinity = calloc((L - 1) * J * J, sizeof(float));
    p->val_all_correct = malloc(L * sizeof(float));
    p->val_one_correct = malloc(L * sizeof(float));
    int rc = p->expert_mlp && p->popularity && p->affinity && p->val_all_correct &&
                     p->val_one_correct
                 ? 0
                 : fmoe_error_set(FMOE_ENOMEM, "predictor: out of memory");
    if (rc == 0) rc = fmoe_expert_mlp_init(p->expert_mlp, num_fc, widths);
    if (rc < 0) {
        fmoe_predictor_free(p);
        return rc;
    }
    for (size_t l = 0; l < L; l++) p->val_all_correct[l] = p->val_one_correct[l] = NAN;
    *out = p;
    return 0;
}

int fmoe_duoserve_tables(fmoe_predictor *p, const uint16_t *experts, int64_t n) {
    const int32_t L = p->num_layers, J = p->num_experts, K = p->top_k;
    const size_t JJ = (size_t)J * J;
    /* counts in double: exact to 2^53 episodes */
    double *pop = calloc((size_t)L * J, sizeof *pop);
    double *aff = calloc((size_t)(L - 1) * JJ, sizeof *aff);
    if (!pop || !aff) {
        free(pop);
        free(aff);
        return fmoe_error_set(FMOE_ENOMEM, "duoserve tables: out of memory");
    }
    int rc = 0;
    for (int64_t t = 0; t < n && rc == 0; t++) {
        const uint16_t *row = experts + (size_t)t * L * K;
        for (int32_t l = 0; l < L && rc == 0; l++)
            for (int32_t k = 0; k < K; k++) {
                const int32_t i = row[(size_t)l * K + k];
                if (i >= J) {
                    rc = fmoe_error_set(FMOE_EINVAL, "token %lld, layer %d: expert %d >= %d",
                                        (long long)t, l, i, J);
                    break;
                }
                pop[(size_t)l * J + i] += 1; /* Eq. 2's numerator: 1(e_i ∈ E_{l,n}) */
                if (l + 1 < L)
                    for (int32_t k2 = 0; k2 < K; k2++) {
                        const int32_t j = row[(size_t)(l + 1) * K + k2];
                        if (j < J) aff[(size_t)l * JJ + (size_t)i * J + j] += 1; /* Eq. 3 */
                    }
            }
    }
    for (int32_t l = 0; l < L && rc == 0; l++) {
        double s = 0; /* Eq. 2's denominator: every selection at layer l */
        for (int32_t j = 0; j < J; j++) s += pop[(size_t)l * J + j];
        for (int32_t j = 0; j < J; j++)
            p->popularity[(size_t)l * J + j] = s > 0 ? (float)(pop[(size_t)l * J + j] / s) : 0.0f;
        if (l + 1 == L) break;
        for (int32_t i = 0; i < J; i++) { /* Eq. 3: each row normalised over m */
            const double *a = aff + (size_t)l * JJ + (size_t)i * J;
            double r = 0;
            for (int32_t j = 0; j < J; j++) r += a[j];
            for (int32_t j = 0; j < J; j++)
                p->affinity[(size_t)l * JJ + (size_t)i * J + j] = r > 0 ? (float)(a[j] / r) : 0.0f;
        }
    }
    free(pop);
    free(aff);
    return rc;
}

void fmoe_duoserve_state(const fmoe_predictor *p, int32_t l, const uint16_t *chosen,
                         int64_t layer_stride, float *s) {
    const int32_t L = p->num_layers, J = p->num_experts, K = p->top_k;
    FMOE_ASSERT(l >= 1 && l < L);
    memset(s, 0, (size_t)(L + 1) * J * sizeof *s);
    for (int32_t m = 0; m < l; m++) /* h_l: the layers before l */
        for (int32_t k = 0; k < K; k++) {
            const int32_t j = chosen[(size_t)m * layer_stride + k];
            if (j < J) s[(size_t)m * J + j] = 1.0f;
        }
    memcpy(s + (size_t)(L - 1) * J, p->popularity + (size_t)l * J, (size_t)J * sizeof *s);
    float *a = s + (size_t)L * J; /* a_{l-1,l}: mean of the chosen experts' rows */
    const float *A = p->affinity + (size_t)(l - 1) * J * J;
    for (int32_t k = 0; k < K; k++) {
        const int32_t i = chosen[(size_t)(l - 1) * layer_stride + k];
        if (i >= J) continue;
        for (int32_t j = 0; j < J; j++) a[j] += A[(size_t)i * J + j] / (float)K;
    }
}
