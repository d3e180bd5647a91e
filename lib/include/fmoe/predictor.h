/*
 * fmoe/predictor.h - learned expert predictors (ProMoE, papers/promoe.txt §4.4 and
 * POLICIES.md §2.4): a small two-layer perceptron per MoE layer that predicts layer i's
 * gate distribution from the gate input of layer i-k, trained in C with Adam on OpenBLAS,
 * and the predictor file (HDF5, format "fmoe-predictor") that holds them.
 *
 * The MLP, its gradient, Adam and the trainer are in lib/predictor.c (no HDF5); top-K
 * selection, ACCURACY and the token-based baseline in lib/predictor_eval.c; the file's
 * writer and reader in trace/predictor_file.c (the only code that includes <hdf5.h>).
 *
 * Determinism: every reduction of ours runs in a fixed order, the shuffles use our own
 * seeded generator, and OpenBLAS's sgemm gives the same bits for the same shapes, the same
 * thread count and the same CPU kernel. So one seed and one thread count give one set of
 * weights, bit for bit, on one machine (another CPU may pick another OpenBLAS kernel).
 *
 * Threads: the functions here are reentrant (no globals); a model or workspace must not be
 * used by two threads at once. The file functions are thread-safe (trace/ holds its HDF5 lock).
 */
#ifndef FMOE_PREDICTOR_H
#define FMOE_PREDICTOR_H

#include <stddef.h>
#include <stdint.h>

#define FMOE_PREDICTOR_FORMAT "fmoe-predictor"
#define FMOE_PREDICTOR_VERSION 1
#define FMOE_PREDICTOR_KIND_PROMOE "promoe"

/* ---------------------------------------------------------------------------------------
 * The two-layer perceptron: p = softmax(W2 · relu(W1 · x + b1) + b2)
 * ------------------------------------------------------------------------------------- */

/* Weights in PyTorch's nn.Linear layout (out x in, row-major). Owned by the struct once
 * fmoe_mlp_init succeeded; a zeroed struct is "no model" and fmoe_mlp_free of it is a no-op.
 * The same struct holds gradients and Adam's moments (same shapes). */
typedef struct fmoe_mlp {
    int32_t in;     /* input width (the model's hidden size h) */
    int32_t hidden; /* H */
    int32_t out;    /* J, the experts of the predicted layer */
    float *w1;      /* [hidden][in] */
    float *b1;      /* [hidden] */
    float *w2;      /* [out][hidden] */
    float *b2;      /* [out] */
} fmoe_mlp;

/* Allocates zeroed weights. @return 0, FMOE_EINVAL (a size < 1), FMOE_ENOMEM. */
int fmoe_mlp_init(fmoe_mlp *m, int32_t in, int32_t hidden, int32_t out);
/* Frees the weights and zeroes the struct. NULL and a zeroed struct are no-ops. */
void fmoe_mlp_free(fmoe_mlp *m);
/* PyTorch's nn.Linear initialisation: every weight and bias uniform in
 * [-1/sqrt(fan_in), 1/sqrt(fan_in)], from a splitmix64 stream seeded by `seed`. */
void fmoe_mlp_randomize(fmoe_mlp *m, uint64_t seed);
/* Copies src's values into dst of the same shape. */
void fmoe_mlp_copy(fmoe_mlp *dst, const fmoe_mlp *src);
/* A ProMoE predictor's default hidden width for gate inputs of width h and J experts:
 * about 2M parameters (papers/promoe.txt §4.4, "approximately 2M"), min(2M / (h + J),
 * h / 2), at least 16 (POLICIES.md §2.4). train-predictor's default, and the shape
 * fmoe calibrate times. */
int32_t fmoe_promoe_default_hidden(int32_t h, int32_t J);
/* in*hidden + hidden + hidden*out + out. */
int64_t fmoe_mlp_num_params(const fmoe_mlp *m);

/* Working memory for batches of up to max_batch rows, allocated once (the training loop
 * never allocates). */
typedef struct fmoe_mlp_work {
    int32_t max_batch;
    float *z;     /* [max_batch][hidden] pre-activations W1 x + b1 */
    float *a;     /* [max_batch][hidden] relu(z) */
    float *logit; /* [max_batch][out] */
    float *p;     /* [max_batch][out] softmax(logit) */
    float *g;     /* [max_batch][out] dLoss/dlogit */
    float *dz;    /* [max_batch][hidden] dLoss/dz */
} fmoe_mlp_work;

int fmoe_mlp_work_init(fmoe_mlp_work *w, const fmoe_mlp *m, int32_t max_batch);
void fmoe_mlp_work_free(fmoe_mlp_work *w);

/* Forward pass of n <= w->max_batch rows x [n][in]: fills w->z, a, logit and p. */
void fmoe_mlp_forward(const fmoe_mlp *m, fmoe_mlp_work *w, const float *x, int32_t n);

/* The same forward pass for a policy: every product summed in index order, without BLAS,
 * so the predictions are the same bits in every executor, at any thread count and on any
 * machine (OpenBLAS's sgemm changes its summation with its threads). Slower than
 * fmoe_mlp_forward for large batches; a gate has a handful of rows. */
void fmoe_mlp_infer(const fmoe_mlp *m, fmoe_mlp_work *w, const float *x, int32_t n);

/* Mean cross-entropy of the forward pass against target distributions t [n][out] (each row
 * sums to 1): L = -(1/n) Σ_r Σ_j t[r][j] · log p[r][j], computed as a log-softmax. When
 * `grad` is not NULL (same shape as m) it receives dL/dθ, overwritten:
 *   dL/dlogit = (p - t)/n;  dW2 = dlogitᵀ·a;  db2 = Σ_r dlogit;  dz = (dlogit·W2) ⊙ [z > 0];
 *   dW1 = dzᵀ·x;  db1 = Σ_r dz  (sums over rows in row order).
 * @return the loss. */
double fmoe_mlp_loss_grad(const fmoe_mlp *m, fmoe_mlp_work *w, const float *x, const float *t,
                          int32_t n, fmoe_mlp *grad);

/* Mean cross-entropy over n rows of any count, in batches of w->max_batch. */
double fmoe_mlp_loss(const fmoe_mlp *m, fmoe_mlp_work *w, const float *x, const float *t,
                     int64_t n);

/* ---------------------------------------------------------------------------------------
 * Adam (Kingma & Ba 2015, Algorithm 1, with bias correction)
 * ------------------------------------------------------------------------------------- */

typedef struct fmoe_adam {
    double lr, beta1, beta2, eps;
    int64_t step;  /* t: steps taken */
    fmoe_mlp m, v; /* first and second moment estimates, the parameters' shapes */
} fmoe_adam;

/* Zero moments for `shape`; lr, beta1 0.9, beta2 0.999, eps 1e-8. @return 0 or FMOE_ENOMEM. */
int fmoe_adam_init(fmoe_adam *a, const fmoe_mlp *shape, double lr);
void fmoe_adam_free(fmoe_adam *a);
/* One step: t += 1; m = β1 m + (1-β1) g; v = β2 v + (1-β2) g²;
 * θ -= lr · (m / (1-β1^t)) / (sqrt(v / (1-β2^t)) + eps), element by element. */
void fmoe_adam_step(fmoe_adam *a, fmoe_mlp *params, const fmoe_mlp *grad);

/* ---------------------------------------------------------------------------------------
 * Training: mini-batch Adam, early stopping on a validation plateau
 * ------------------------------------------------------------------------------------- */

/* Called after every epoch (epoch counts from 1). */
typedef void (*fmoe_mlp_epoch_fn)(void *ctx, int32_t epoch, double train_loss, double val_loss);

typedef struct fmoe_mlp_train_params {
    int32_t batch;      /* rows per step (default 64 when 0) */
    int32_t max_epochs; /* default 100 when 0 */
    int32_t patience;   /* stop after this many epochs without a better validation loss
                           (default 3 when 0) */
    double lr;          /* Adam's step size (default 1e-3 when 0) */
    uint64_t seed;      /* the initial weights and every epoch's shuffle */
    fmoe_mlp_epoch_fn on_epoch; /* may be NULL */
    void *ctx;
} fmoe_mlp_train_params;

typedef struct fmoe_mlp_train_report {
    int32_t epochs;      /* epochs run */
    int32_t best_epoch;  /* the epoch whose weights are kept */
    double train_loss;   /* mean training loss of the best epoch */
    double val_loss;     /* validation loss of the kept weights (train loss when n_val = 0) */
} fmoe_mlp_train_report;

/* Trains `m` (shapes set by fmoe_mlp_init; weights re-initialised from params->seed) on
 * rows x_train [n_train][in] with targets t_train [n_train][out] (rows summing to 1).
 * Each epoch visits the rows in a fresh seeded permutation, in batches; after it, the loss
 * over x_val/t_val decides: a loss below (1 - 1e-4) x the best so far keeps these weights,
 * else the plateau grows, and `patience` epochs of plateau stop training. The kept (best)
 * weights are left in `m`. With n_val == 0 the training loss decides.
 * @return 0, FMOE_EINVAL (n_train < 1, shapes), FMOE_ENOMEM. */
int fmoe_mlp_train(fmoe_mlp *m, const float *x_train, const float *t_train, int64_t n_train,
                   const float *x_val, const float *t_val, int64_t n_val,
                   const fmoe_mlp_train_params *params, fmoe_mlp_train_report *report);

/* ---------------------------------------------------------------------------------------
 * Evaluation (lib/predictor_eval.c)
 * ------------------------------------------------------------------------------------- */

/* The K highest of scores[J] into out[K], highest first; ties go to the lower index. */
void fmoe_topk_indices(const float *scores, int32_t J, int32_t K, int32_t *out);

/* |pred ∩ actual| for K predicted and K actual expert ids. */
int32_t fmoe_topk_overlap(const int32_t *pred, const uint16_t *actual, int32_t K);

/* ProMoE's token-based baseline (papers/promoe.txt §4.2, POLICIES.md §2.3): from a
 * training trace, per input token id the experts most often chosen at one layer; a token id
 * never seen falls back to the layer's most often chosen experts overall. */
typedef struct fmoe_token_table fmoe_token_table;

/* Builds the table of one layer from n tokens: token_id[n] (ids < 0 are skipped) and
 * experts [n][K] (row stride `stride` uint16 elements, so a [n][L][K] array's layer l is
 * experts + l*K with stride L*K). @return 0, FMOE_EINVAL, FMOE_ENOMEM. */
int fmoe_token_table_build(fmoe_token_table **out, int32_t J, int32_t K, const int32_t *token_id,
                           const uint16_t *experts, int64_t stride, int64_t n);
void fmoe_token_table_free(fmoe_token_table *t); /* NULL is a no-op */
/* The K predicted experts of a token id into out[K] (most frequent first, ties to the lower
 * expert id). */
void fmoe_token_table_predict(const fmoe_token_table *t, int32_t token_id, int32_t *out);

/* ---------------------------------------------------------------------------------------
 * A ProMoE predictor set and its file (HDF5 read and written in trace/predictor_file.c)
 * ------------------------------------------------------------------------------------- */

/* Predictor i predicts layer i's gate from the gate input of layer i-k; "i-k falls back to
 * 0 when i < k" (papers/promoe.txt §4.4 footnote, POLICIES.md §2.4), so layers 1..L-1 have
 * one each and layer 0, which nothing precedes, has none. */
static inline int32_t fmoe_promoe_source_layer(int32_t layer, int32_t stride) {
    return layer > stride ? layer - stride : 0;
}

typedef struct fmoe_predictor {
    char kind[16];               /* "promoe" */
    char model_fingerprint[65];  /* of the traces it was trained on */
    char model_name[256];
    char target[16];             /* what it was trained on: "full" | "topk" | "none" probs */
    char created[32];            /* ISO 8601 UTC; the writer fills it when empty */
    char fmoe_version[32];       /* the writer fills it when empty */
    int32_t stride;              /* k */
    int32_t num_layers;          /* L MoE layers */
    int32_t num_experts;         /* J */
    int32_t top_k;               /* K */
    int32_t hidden_size;         /* h, the predictors' input width */
    int32_t mlp_hidden;          /* H */
    int64_t seed;
    double split;                /* share of requests trained on */
    fmoe_mlp *layers;            /* [num_layers]; layers[0] is zeroed (no predictor) */
    int32_t *source_layer;       /* [num_layers]; -1 for layer 0 */
    float *val_accuracy;         /* [num_layers] ACCURACY on the validation split; NaN: none */
} fmoe_predictor;

/* Allocates a set with zeroed MLPs of the given geometry (kind "promoe", source layers
 * from the stride). @return 0, FMOE_EINVAL, FMOE_ENOMEM. */
int fmoe_predictor_alloc(fmoe_predictor **out, int32_t num_layers, int32_t num_experts,
                         int32_t top_k, int32_t hidden_size, int32_t mlp_hidden, int32_t stride);
void fmoe_predictor_free(fmoe_predictor *p); /* NULL is a no-op */

/* Writes "<path>.partial" and renames it to path (fmoe/files.h). Root attributes: format,
 * version, kind, stride, model_fingerprint, model_name, num_layers, num_experts, top_k,
 * hidden_size, mlp_hidden, target, seed, split, created, fmoe_version; per predicted layer
 * i the group /layers/<i> (attributes source_layer, val_accuracy) with float32 datasets
 * W1 [H][h], b1 [H], W2 [J][H], b2 [J]. @return 0, FMOE_EINVAL, FMOE_EIO. */
int fmoe_predictor_write(const char *path, const fmoe_predictor *p);

/* Reads and validates a predictor file: the format and version, every attribute's range,
 * each layer's source layer and dataset shapes, finite weights. Errors name the file and
 * the object. @return 0 with *out set (free with fmoe_predictor_free), FMOE_EIO,
 * FMOE_EFORMAT, FMOE_EUNSUPPORTED (another version), FMOE_ENOMEM. */
int fmoe_predictor_read(const char *path, fmoe_predictor **out);

#endif
