/*
 * predictor.c - the learned expert predictor of ProMoE ("ProMoE: Fast MoE-based LLM Serving
 * using Proactive Caching" §4.4): a two-layer perceptron, its hand-written backward pass,
 * Adam, and its trainer: mini-batches with early stopping, in the loop it shares with
 * DuoServe-MoE's predictor (predictor_train.c). Contracts in fmoe/predictor.h.
 *
 * What the paper leaves open and we chose (docs/policies.md#learned-predictors):
 *   - loss: cross-entropy against the layer's gate distribution (the softmax the model
 *     computed), one of the two natural choices (the other: BCE against the multi-hot
 *     top-k); with ids only the target is the multi-hot top-k divided by K, the same
 *     distribution family;
 *   - optimiser Adam (lr 1e-3, β 0.9/0.999), batches of 64, at most 100 epochs, early stop
 *     after 3 epochs without a 0.01% better validation loss, the best epoch's weights kept.
 *
 * Cost per step of n rows: three sgemm of n·h·H and two of n·H·J multiply-adds; the
 * element-wise parts are O(n·(H + J)). Nothing allocates inside an epoch.
 *
 * Determinism: the bias gradients and losses are sums over rows in row order; the shuffle
 * is our own splitmix64 stream; sgemm is deterministic for one thread count and kernel.
 */
#include <cblas.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/predictor.h"
#include "predictor_train.h"

/* ---------------------------------------------------------------------------------------
 * Random numbers: splitmix64 (Steele, Lea, Flood 2014), the same on every platform
 * ------------------------------------------------------------------------------------- */

uint64_t fmoe_splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* ---------------------------------------------------------------------------------------
 * The MLP
 * ------------------------------------------------------------------------------------- */

int fmoe_mlp_init(fmoe_mlp *m, int32_t in, int32_t hidden, int32_t out) {
    FMOE_RETURN_ERROR_IF(!m, FMOE_EINVAL, "fmoe_mlp_init: NULL model");
    memset(m, 0, sizeof *m);
    FMOE_RETURN_ERROR_IF(in < 1 || hidden < 1 || out < 1, FMOE_EINVAL,
                         "fmoe_mlp_init: sizes %d -> %d -> %d, expected all >= 1", in, hidden,
                         out);
    m->in = in;
    m->hidden = hidden;
    m->out = out;
    m->w1 = calloc((size_t)hidden * (size_t)in, sizeof(float));
    m->b1 = calloc((size_t)hidden, sizeof(float));
    m->w2 = calloc((size_t)out * (size_t)hidden, sizeof(float));
    m->b2 = calloc((size_t)out, sizeof(float));
    if (!m->w1 || !m->b1 || !m->w2 || !m->b2) {
        fmoe_mlp_free(m);
        return fmoe_error_set(FMOE_ENOMEM, "MLP %d -> %d -> %d: out of memory", in, hidden, out);
    }
    return 0;
}

void fmoe_mlp_free(fmoe_mlp *m) {
    if (!m) return;
    free(m->w1);
    free(m->b1);
    free(m->w2);
    free(m->b2);
    memset(m, 0, sizeof *m);
}

static void fill_uniform(float *v, size_t n, float bound, uint64_t *s) {
    for (size_t i = 0; i < n; i++) v[i] = (2.0f * fmoe__uniform01(s) - 1.0f) * bound;
}

void fmoe_mlp_randomize(fmoe_mlp *m, uint64_t seed) {
    uint64_t s = seed;
    const float k1 = 1.0f / sqrtf((float)m->in), k2 = 1.0f / sqrtf((float)m->hidden);
    fill_uniform(m->w1, (size_t)m->hidden * (size_t)m->in, k1, &s);
    fill_uniform(m->b1, (size_t)m->hidden, k1, &s);
    fill_uniform(m->w2, (size_t)m->out * (size_t)m->hidden, k2, &s);
    fill_uniform(m->b2, (size_t)m->out, k2, &s);
}

void fmoe_mlp_copy(fmoe_mlp *dst, const fmoe_mlp *src) {
    memcpy(dst->w1, src->w1, (size_t)src->hidden * (size_t)src->in * sizeof(float));
    memcpy(dst->b1, src->b1, (size_t)src->hidden * sizeof(float));
    memcpy(dst->w2, src->w2, (size_t)src->out * (size_t)src->hidden * sizeof(float));
    memcpy(dst->b2, src->b2, (size_t)src->out * sizeof(float));
}

int64_t fmoe_mlp_num_params(const fmoe_mlp *m) {
    return (int64_t)m->in * m->hidden + m->hidden + (int64_t)m->hidden * m->out + m->out;
}

int fmoe_mlp_work_init(fmoe_mlp_work *w, const fmoe_mlp *m, int32_t max_batch) {
    FMOE_RETURN_ERROR_IF(!w || !m || max_batch < 1, FMOE_EINVAL,
                         "fmoe_mlp_work_init: bad arguments");
    memset(w, 0, sizeof *w);
    const size_t B = (size_t)max_batch, H = (size_t)m->hidden, J = (size_t)m->out;
    w->max_batch = max_batch;
    w->z = malloc(B * H * sizeof(float));
    w->a = malloc(B * H * sizeof(float));
    w->dz = malloc(B * H * sizeof(float));
    w->logit = malloc(B * J * sizeof(float));
    w->p = malloc(B * J * sizeof(float));
    w->g = malloc(B * J * sizeof(float));
    if (!w->z || !w->a || !w->dz || !w->logit || !w->p || !w->g) {
        fmoe_mlp_work_free(w);
        return fmoe_error_set(FMOE_ENOMEM, "MLP workspace of %d rows: out of memory", max_batch);
    }
    return 0;
}

void fmoe_mlp_work_free(fmoe_mlp_work *w) {
    if (!w) return;
    free(w->z);
    free(w->a);
    free(w->dz);
    free(w->logit);
    free(w->p);
    free(w->g);
    memset(w, 0, sizeof *w);
}

/* z += b1, a = relu(z), over n rows of H. */
static void bias_relu(const fmoe_mlp *m, fmoe_mlp_work *w, int32_t n) {
    const int H = m->hidden;
    for (int32_t r = 0; r < n; r++) {
        float *z = w->z + (size_t)r * H, *a = w->a + (size_t)r * H;
        for (int j = 0; j < H; j++) {
            z[j] += m->b1[j];
            a[j] = z[j] > 0.0f ? z[j] : 0.0f;
        }
    }
}

/* logit += b2, p = softmax(logit), over n rows of J. */
static void bias_softmax(const fmoe_mlp *m, fmoe_mlp_work *w, int32_t n) {
    const int J = m->out;
    for (int32_t r = 0; r < n; r++) {
        float *l = w->logit + (size_t)r * J, *p = w->p + (size_t)r * J;
        float mx = -FLT_MAX;
        for (int j = 0; j < J; j++) {
            l[j] += m->b2[j];
            if (l[j] > mx) mx = l[j];
        }
        double sum = 0.0;
        for (int j = 0; j < J; j++) sum += (double)(p[j] = expf(l[j] - mx));
        const float inv = (float)(1.0 / sum);
        for (int j = 0; j < J; j++) p[j] *= inv;
    }
}

void fmoe_mlp_forward(const fmoe_mlp *m, fmoe_mlp_work *w, const float *x, int32_t n) {
    FMOE_ASSERT(n >= 0 && n <= w->max_batch);
    if (n == 0) return;
    const int H = m->hidden, J = m->out, D = m->in;
    /* z = x · W1ᵀ + b1, a = relu(z) */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, H, D, 1.0f, x, D, m->w1, D, 0.0f,
                w->z, H);
    bias_relu(m, w, n);
    /* logit = a · W2ᵀ + b2, p = softmax(logit) */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, J, H, 1.0f, w->a, H, m->w2, H, 0.0f,
                w->logit, J);
    bias_softmax(m, w, n);
}

/* y[r][o] = x[r] · w[o] over D, summed in index order. */
static void dense_in_order(const float *x, int32_t n, int D, const float *wt, int O, float *y) {
    for (int32_t r = 0; r < n; r++)
        for (int o = 0; o < O; o++) {
            const float *xr = x + (size_t)r * D, *wo = wt + (size_t)o * D;
            float acc = 0.0f;
            for (int d = 0; d < D; d++) acc += xr[d] * wo[d];
            y[(size_t)r * O + o] = acc;
        }
}

void fmoe_mlp_infer(const fmoe_mlp *m, fmoe_mlp_work *w, const float *x, int32_t n) {
    FMOE_ASSERT(n >= 0 && n <= w->max_batch);
    if (n == 0) return;
    dense_in_order(x, n, m->in, m->w1, m->hidden, w->z);
    bias_relu(m, w, n);
    dense_in_order(w->a, n, m->hidden, m->w2, m->out, w->logit);
    bias_softmax(m, w, n);
}

/* Cross-entropy of the rows of the last forward pass, summed over rows (not averaged). */
static double loss_sum(const fmoe_mlp_work *w, const float *t, int32_t n, int32_t J) {
    double total = 0.0;
    for (int32_t r = 0; r < n; r++) {
        const float *l = w->logit + (size_t)r * J, *tr = t + (size_t)r * J;
        float mx = -FLT_MAX;
        for (int j = 0; j < J; j++)
            if (l[j] > mx) mx = l[j];
        double se = 0.0;
        for (int j = 0; j < J; j++) se += exp((double)l[j] - mx);
        const double lse = mx + log(se);
        for (int j = 0; j < J; j++)
            if (tr[j] != 0.0f) total -= (double)tr[j] * ((double)l[j] - lse);
    }
    return total;
}

double fmoe_mlp_loss_grad(const fmoe_mlp *m, fmoe_mlp_work *w, const float *x, const float *t,
                          int32_t n, fmoe_mlp *grad) {
    if (n <= 0) return 0.0;
    fmoe_mlp_forward(m, w, x, n);
    const int H = m->hidden, J = m->out, D = m->in;
    const double loss = loss_sum(w, t, n, J) / n;
    if (!grad) return loss;
    const float inv_n = 1.0f / (float)n;
    for (size_t i = 0; i < (size_t)n * J; i++) w->g[i] = (w->p[i] - t[i]) * inv_n;
    /* dW2 = gᵀ · a, db2 = Σ_r g */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, J, H, n, 1.0f, w->g, J, w->a, H, 0.0f,
                grad->w2, H);
    memset(grad->b2, 0, (size_t)J * sizeof(float));
    for (int32_t r = 0; r < n; r++)
        for (int j = 0; j < J; j++) grad->b2[j] += w->g[(size_t)r * J + j];
    /* dz = (g · W2) ⊙ [z > 0] */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, H, J, 1.0f, w->g, J, m->w2, H, 0.0f,
                w->dz, H);
    for (size_t i = 0; i < (size_t)n * H; i++)
        if (!(w->z[i] > 0.0f)) w->dz[i] = 0.0f;
    /* dW1 = dzᵀ · x, db1 = Σ_r dz */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, H, D, n, 1.0f, w->dz, H, x, D, 0.0f,
                grad->w1, D);
    memset(grad->b1, 0, (size_t)H * sizeof(float));
    for (int32_t r = 0; r < n; r++)
        for (int j = 0; j < H; j++) grad->b1[j] += w->dz[(size_t)r * H + j];
    return loss;
}

double fmoe_mlp_loss(const fmoe_mlp *m, fmoe_mlp_work *w, const float *x, const float *t,
                     int64_t n) {
    if (n <= 0) return 0.0;
    double total = 0.0;
    for (int64_t r0 = 0; r0 < n; r0 += w->max_batch) {
        const int32_t b = (int32_t)(n - r0 < w->max_batch ? n - r0 : w->max_batch);
        fmoe_mlp_forward(m, w, x + (size_t)r0 * m->in, b);
        total += loss_sum(w, t + (size_t)r0 * m->out, b, m->out);
    }
    return total / (double)n;
}

/* ---------------------------------------------------------------------------------------
 * Adam
 * ------------------------------------------------------------------------------------- */

int fmoe_adam_init(fmoe_adam *a, const fmoe_mlp *shape, double lr) {
    memset(a, 0, sizeof *a);
    a->lr = lr;
    a->beta1 = 0.9;
    a->beta2 = 0.999;
    a->eps = 1e-8;
    int rc = fmoe_mlp_init(&a->m, shape->in, shape->hidden, shape->out);
    if (rc == 0) rc = fmoe_mlp_init(&a->v, shape->in, shape->hidden, shape->out);
    if (rc < 0) fmoe_adam_free(a);
    return rc;
}

void fmoe_adam_free(fmoe_adam *a) {
    if (!a) return;
    fmoe_mlp_free(&a->m);
    fmoe_mlp_free(&a->v);
}

void fmoe_adam_step(fmoe_adam *a, fmoe_mlp *params, const fmoe_mlp *grad) {
    a->step++;
    const size_t H = (size_t)params->hidden, D = (size_t)params->in, J = (size_t)params->out;
    fmoe__adam_update(a, params->w1, grad->w1, a->m.w1, a->v.w1, H * D);
    fmoe__adam_update(a, params->b1, grad->b1, a->m.b1, a->v.b1, H);
    fmoe__adam_update(a, params->w2, grad->w2, a->m.w2, a->v.w2, J * H);
    fmoe__adam_update(a, params->b2, grad->b2, a->m.b2, a->v.b2, J);
}

/* ---------------------------------------------------------------------------------------
 * Training
 * ------------------------------------------------------------------------------------- */

/* fmoe_mlp_train's model, as the shared loop sees it (predictor_train.h). */
typedef struct mlp_trainee {
    fmoe_mlp *m, grad, best;
    fmoe_mlp_work work;
    fmoe_adam adam;
    const float *x_train, *t_train, *x_val, *t_val;
    int64_t n_val;
    float *xb, *tb; /* the batch's rows, gathered */
} mlp_trainee;

static double mlp_step(void *ctx, const int64_t *rows, int32_t n) {
    mlp_trainee *c = ctx;
    const size_t D = (size_t)c->m->in, J = (size_t)c->m->out;
    for (int32_t r = 0; r < n; r++) {
        memcpy(c->xb + (size_t)r * D, c->x_train + (size_t)rows[r] * D, D * sizeof(float));
        memcpy(c->tb + (size_t)r * J, c->t_train + (size_t)rows[r] * J, J * sizeof(float));
    }
    const double loss = fmoe_mlp_loss_grad(c->m, &c->work, c->xb, c->tb, n, &c->grad);
    fmoe_adam_step(&c->adam, c->m, &c->grad);
    return loss;
}

static double mlp_val_loss(void *ctx) {
    mlp_trainee *c = ctx;
    return fmoe_mlp_loss(c->m, &c->work, c->x_val, c->t_val, c->n_val);
}

static void mlp_keep_best(void *ctx) {
    mlp_trainee *c = ctx;
    fmoe_mlp_copy(&c->best, c->m);
}

static void mlp_restore_best(void *ctx) {
    mlp_trainee *c = ctx;
    fmoe_mlp_copy(c->m, &c->best);
}

int fmoe_mlp_train(fmoe_mlp *m, const float *x_train, const float *t_train, int64_t n_train,
                   const float *x_val, const float *t_val, int64_t n_val,
                   const fmoe_mlp_train_params *params, fmoe_mlp_train_report *report) {
    FMOE_RETURN_ERROR_IF(!m || !m->w1 || !params || n_train < 1 || n_val < 0 ||
                             (n_val > 0 && (!x_val || !t_val)),
                         FMOE_EINVAL, "fmoe_mlp_train: bad arguments (%lld training rows)",
                         (long long)n_train);
    const fmoe__train_settings s = fmoe__train_settings_of(params);
    const size_t D = (size_t)m->in, J = (size_t)m->out;
    mlp_trainee c = {.m = m, .x_train = x_train, .t_train = t_train, .x_val = x_val,
                     .t_val = t_val, .n_val = n_val};
    c.xb = malloc((size_t)s.batch * D * sizeof(float));
    c.tb = malloc((size_t)s.batch * J * sizeof(float));
    int rc = c.xb && c.tb ? 0 : fmoe_error_set(FMOE_ENOMEM, "training: out of memory");
    if (rc == 0) rc = fmoe_mlp_init(&c.grad, m->in, m->hidden, m->out);
    if (rc == 0) rc = fmoe_mlp_init(&c.best, m->in, m->hidden, m->out);
    if (rc == 0) rc = fmoe_mlp_work_init(&c.work, m, s.batch);
    if (rc == 0) rc = fmoe_adam_init(&c.adam, m, s.lr);
    if (rc == 0) {
        fmoe_mlp_randomize(m, params->seed);
        const fmoe__trainee t = {&c, mlp_step, mlp_val_loss, mlp_keep_best, mlp_restore_best};
        rc = fmoe__train_early_stop(&t, n_train, n_val, &s, 1, params, report);
    }
    fmoe_adam_free(&c.adam);
    fmoe_mlp_work_free(&c.work);
    fmoe_mlp_free(&c.best);
    fmoe_mlp_free(&c.grad);
    free(c.tb);
    free(c.xb);
    return rc;
}

/* ---------------------------------------------------------------------------------------
 * The predictor set (its file is read and written in trace/predictor_file.c)
 * ------------------------------------------------------------------------------------- */

int fmoe_predictor_alloc(fmoe_predictor **out, int32_t num_layers, int32_t num_experts,
                         int32_t top_k, int32_t hidden_size, int32_t mlp_hidden, int32_t stride) {
    FMOE_RETURN_ERROR_IF(!out, FMOE_EINVAL, "fmoe_predictor_alloc: NULL argument");
    *out = NULL;
    FMOE_RETURN_ERROR_IF(num_layers < 2 || num_experts < 1 || top_k < 1 || top_k > num_experts ||
                             hidden_size < 1 || mlp_hidden < 1 || stride < 1 ||
                             stride >= num_layers,
                         FMOE_EINVAL,
                         "predictor geometry: L %d, J %d, K %d, h %d, H %d, stride %d: expected "
                         "L >= 2, 1 <= K <= J, h, H >= 1, 1 <= stride < L",
                         num_layers, num_experts, top_k, hidden_size, mlp_hidden, stride);
    fmoe_predictor *p = calloc(1, sizeof *p);
    if (!p) return fmoe_error_set(FMOE_ENOMEM, "predictor: out of memory");
    strcpy(p->kind, FMOE_PREDICTOR_KIND_PROMOE);
    p->stride = stride;
    p->num_layers = num_layers;
    p->num_experts = num_experts;
    p->top_k = top_k;
    p->hidden_size = hidden_size;
    p->mlp_hidden = mlp_hidden;
    p->layers = calloc((size_t)num_layers, sizeof *p->layers);
    p->source_layer = malloc((size_t)num_layers * sizeof *p->source_layer);
    p->val_accuracy = malloc((size_t)num_layers * sizeof *p->val_accuracy);
    int rc = p->layers && p->source_layer && p->val_accuracy
                 ? 0
                 : fmoe_error_set(FMOE_ENOMEM, "predictor: out of memory");
    for (int32_t i = 0; rc == 0 && i < num_layers; i++) {
        p->source_layer[i] = i == 0 ? -1 : fmoe_promoe_source_layer(i, stride);
        p->val_accuracy[i] = NAN;
        if (i > 0) rc = fmoe_mlp_init(&p->layers[i], hidden_size, mlp_hidden, num_experts);
    }
    if (rc < 0) {
        fmoe_predictor_free(p);
        return rc;
    }
    *out = p;
    return 0;
}

void fmoe_predictor_free(fmoe_predictor *p) {
    if (!p) return;
    if (p->layers)
        for (int32_t i = 0; i < p->num_layers; i++) fmoe_mlp_free(&p->layers[i]);
    free(p->layers);
    free(p->source_layer);
    free(p->val_accuracy);
    fmoe_expert_mlp_free(p->expert_mlp);
    free(p->expert_mlp);
    free(p->popularity);
    free(p->affinity);
    free(p->val_all_correct);
    free(p->val_one_correct);
    free(p);
}

/* Indexed by fmoe_predictor_kind_id. */
static const char *const kind_names[FMOE_PREDICTOR_NUM_KINDS] = {
    [FMOE_PREDICTOR_PROMOE] = FMOE_PREDICTOR_KIND_PROMOE,
    [FMOE_PREDICTOR_DUOSERVE] = FMOE_PREDICTOR_KIND_DUOSERVE,
};

int fmoe_predictor_kind_id_of(const char *kind) {
    for (int i = 0; kind && i < FMOE_PREDICTOR_NUM_KINDS; i++)
        if (strcmp(kind, kind_names[i]) == 0) return i;
    return -1;
}

int32_t fmoe_promoe_default_hidden(int32_t h, int32_t J) {
    const double full = floor(2000000.0 / (double)(h + J));
    const double cap = h / 2 > 16 ? h / 2 : 16;
    return (int32_t)(full < cap ? full : cap);
}
