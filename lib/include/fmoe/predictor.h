/*
 * fmoe/predictor.h - learned expert predictors (ProMoE, "ProMoE: Fast MoE-based LLM Serving
 * using Proactive Caching" §4.4): a small two-layer perceptron per MoE layer that predicts
 * layer i's gate distribution from the gate input of layer i-k, trained in C with Adam on
 * OpenBLAS, and the predictor file (HDF5, format "fmoe-predictor") that holds them.
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
 * DuoServe-MoE's predictor ("DuoServe-MoE: Dual-Phase Expert Prefetch and Cache Scheduling
 * for Efficient MoE LLM Inference" §4.1-§4.2): the
 * popularity and affinity tables (Eq. 2, Eq. 3) and the ExpertMLP, a seven-layer perceptron
 * with BatchNorm, ReLU and dropout trained on binary cross-entropy (Eq. 6) from expert ids
 * alone; in lib/predictor_duoserve.c, its section at the end of this header.
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
/* The predictor kinds' names (a file's root attribute kind, train-predictor --kind, a
 * policy's ops->predictor_kind): the only place they are spelled; each has its number in
 * fmoe_predictor_kind_id below. */
#define FMOE_PREDICTOR_KIND_PROMOE "promoe"
#define FMOE_PREDICTOR_KIND_DUOSERVE "duoserve"
/* The layout of a duoserve predictor's file under format version 1 (root attribute
 * duoserve_version): bumped when that layout changes. */
#define FMOE_PREDICTOR_DUOSERVE_VERSION 1

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
/* splitmix64 (Steele, Lea, Flood 2014): the random stream of the predictors' training and of
 * train-predictor's split, the same on every platform. Advances *state. */
uint64_t fmoe_splitmix64(uint64_t *state);
/* A ProMoE predictor's default hidden width for gate inputs of width h and J experts: about
 * 2M parameters (ProMoE §4.4, "approximately 2M"), min(2M / (h + J), h / 2), at least 16 (our
 * sizing: docs/policies.md#learned-predictors). train-predictor's default, and the shape fmoe
 * calibrate times. */
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

/* ProMoE's token-based baseline (ProMoE §4.2): from a
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
 * 0 when i < k" (ProMoE §4.4 footnote), so layers 1..L-1 have
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
    fmoe_mlp *layers;            /* [num_layers]; layers[0] is zeroed (no predictor);
                                    NULL for kind duoserve */
    int32_t *source_layer;       /* [num_layers]; -1 for layer 0 */
    float *val_accuracy;         /* [num_layers] ACCURACY on the validation split; NaN: none */
    /* Kind duoserve (fmoe_predictor_alloc_duoserve; NULL for promoe). stride is 1, the
     * hidden_size and mlp_hidden fields 0: the predictor reads expert ids only. */
    struct fmoe_expert_mlp *expert_mlp; /* the ExpertMLP, shared by all target layers */
    float *popularity;           /* [L][J] Eq. 2: P_l(j), each row sums to 1 */
    float *affinity;             /* [L-1][J][J] Eq. 3: A_{l,l+1}(i, j), each row summing to 1
                                    (or all 0: expert i never chosen at layer l) */
    float *val_all_correct;      /* [L] Table 3 "Top-K": share of validation tokens whose K
                                    experts at layer l were all predicted; NaN at layer 0 */
    float *val_one_correct;      /* [L] Table 3 "at least one": share with >= 1 predicted */
} fmoe_predictor;

/* Allocates a set with zeroed MLPs of the given geometry (kind "promoe", source layers
 * from the stride). @return 0, FMOE_EINVAL, FMOE_ENOMEM. */
int fmoe_predictor_alloc(fmoe_predictor **out, int32_t num_layers, int32_t num_experts,
                         int32_t top_k, int32_t hidden_size, int32_t mlp_hidden, int32_t stride);
void fmoe_predictor_free(fmoe_predictor *p); /* NULL is a no-op */

/* Writes "<path>.partial" and renames it to path (lib/files.h). Kind duoserve: see
 * fmoe_predictor_alloc_duoserve. Kind promoe: root attributes: format,
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

/* The predictor kinds as numbers, for code that picks something by a predictor's kind (a
 * policy's ops->predictor_kind, a file's kind) without comparing names. */
typedef enum fmoe_predictor_kind_id {
    FMOE_PREDICTOR_PROMOE = 0,   /* FMOE_PREDICTOR_KIND_PROMOE */
    FMOE_PREDICTOR_DUOSERVE = 1, /* FMOE_PREDICTOR_KIND_DUOSERVE */
    FMOE_PREDICTOR_NUM_KINDS
} fmoe_predictor_kind_id;

/* @return the fmoe_predictor_kind_id of the kind named `kind`, or -1 (NULL, another name). */
int fmoe_predictor_kind_id_of(const char *kind);

/* ---------------------------------------------------------------------------------------
 * DuoServe-MoE's predictor (its paper's §4.1-§4.2)
 * ------------------------------------------------------------------------------------- */

#define FMOE_EXPERT_MLP_MAX_FC 8

/* The ExpertMLP (§4.2): fully connected layers 0..num_fc-1; every one but the last is
 * followed by BatchNorm, ReLU and dropout; the last gives one logit per expert, and σ of it
 * the expert's probability of being chosen. All trainable parameters sit in one array
 * `params` at the offsets below, so a gradient or an optimiser moment is an array of the same
 * layout; the BatchNorm running statistics are state, not parameters. Owned once
 * fmoe_expert_mlp_init succeeded; fmoe_expert_mlp_free of a zeroed struct is a no-op. */
typedef struct fmoe_expert_mlp {
    int32_t num_fc;                              /* FC layers, the output one included */
    int32_t width[FMOE_EXPERT_MLP_MAX_FC + 1];   /* width[0] the input D, width[i+1] FC i's
                                                    output; width[num_fc] the experts J */
    float dropout;                               /* training only; 0.1 (§4.2) */
    float bn_eps;                                /* 1e-5 (PyTorch's BatchNorm1d) */
    float bn_momentum;                           /* 0.1, running = (1-m) running + m batch */
    int64_t num_params;
    int64_t w_off[FMOE_EXPERT_MLP_MAX_FC];       /* W_i [width[i+1]][width[i]] (nn.Linear) */
    int64_t b_off[FMOE_EXPERT_MLP_MAX_FC];       /* b_i [width[i+1]] */
    int64_t gamma_off[FMOE_EXPERT_MLP_MAX_FC];   /* hidden i: BatchNorm scale [width[i+1]] */
    int64_t beta_off[FMOE_EXPERT_MLP_MAX_FC];    /* hidden i: BatchNorm shift [width[i+1]] */
    float *params;                               /* [num_params] */
    float *running_mean[FMOE_EXPERT_MLP_MAX_FC]; /* hidden i: [width[i+1]], views of `stats` */
    float *running_var[FMOE_EXPERT_MLP_MAX_FC];  /* hidden i: [width[i+1]] (unbiased) */
    float *stats;                                /* one allocation for the running stats */
} fmoe_expert_mlp;

/* widths[0..num_fc] as fmoe_expert_mlp.width. Parameters zeroed, BatchNorm scale 1, running
 * mean 0 and variance 1 (PyTorch's initial state). @return 0, FMOE_EINVAL (num_fc outside
 * 1..FMOE_EXPERT_MLP_MAX_FC, a width < 1), FMOE_ENOMEM. */
int fmoe_expert_mlp_init(fmoe_expert_mlp *m, int32_t num_fc, const int32_t *widths);
void fmoe_expert_mlp_free(fmoe_expert_mlp *m);
/* nn.Linear's initialisation for every W and b (uniform in ±1/sqrt(fan_in)) from a
 * splitmix64 stream; BatchNorm scale 1, shift 0, running mean 0, variance 1. */
void fmoe_expert_mlp_randomize(fmoe_expert_mlp *m, uint64_t seed);
/* Copies parameters and running statistics between two models of one shape. */
void fmoe_expert_mlp_copy(fmoe_expert_mlp *dst, const fmoe_expert_mlp *src);

/* The widths DuoServe's ExpertMLP gets for a model (our reading of DuoServe-MoE §4.2,
 * docs/policies.md#learned-predictors: 2048 -> 1024 -> 512 -> 256 -> 128 -> 64 -> J, seven FC
 * layers, for Mixtral-8x7B's input of (32+1)·8 = 264), scaled to an input of D = (L+1)·J:
 * every hidden width times min(1, D/264), at least 16. first_width > 0 sets the first hidden
 * width instead (the rest halve, at least 16). Fills widths[0..7]. @return the number of FC
 * layers (7). */
int32_t fmoe_duoserve_widths(int32_t num_layers, int32_t num_experts, int32_t first_width,
                             int32_t *widths);

/* Working memory for batches of up to max_batch rows, allocated once. */
typedef struct fmoe_expert_mlp_work {
    int32_t max_batch;
    float *z[FMOE_EXPERT_MLP_MAX_FC];      /* [B][width[i+1]] FC i's output (the last: logits) */
    float *xhat[FMOE_EXPERT_MLP_MAX_FC];   /* hidden i: [B][width[i+1]] normalised z */
    float *y[FMOE_EXPERT_MLP_MAX_FC];      /* hidden i: [B][width[i+1]] γ·xhat + β */
    float *a[FMOE_EXPERT_MLP_MAX_FC];      /* hidden i: [B][width[i+1]] dropout(relu(y)) */
    float *mask[FMOE_EXPERT_MLP_MAX_FC];   /* hidden i: [B][width[i+1]] 0 or 1/(1-p) */
    float *mean[FMOE_EXPERT_MLP_MAX_FC];   /* hidden i: [width[i+1]] the batch's mean */
    float *invstd[FMOE_EXPERT_MLP_MAX_FC]; /* hidden i: [width[i+1]] 1/sqrt(var + eps) */
    float *g0, *g1;                        /* [B][max width] backward scratch */
} fmoe_expert_mlp_work;

int fmoe_expert_mlp_work_init(fmoe_expert_mlp_work *w, const fmoe_expert_mlp *m,
                              int32_t max_batch);
void fmoe_expert_mlp_work_free(fmoe_expert_mlp_work *w);

/* Training-mode loss of n rows (2 <= n <= max_batch) x [n][D] against multi-hot targets
 * t [n][J]: BatchNorm on the batch's statistics (biased variance), dropout masks drawn from a
 * splitmix64 stream seeded by `dropout_seed` (the same seed, the same masks), and the mean
 * binary cross-entropy with logits over the n·J outputs (Eq. 6 averaged, as PyTorch's
 * BCEWithLogitsLoss). When grad is not NULL ([num_params], overwritten) it receives dL/dθ by
 * the hand-written backward pass. When update_stats, the running statistics move towards the
 * batch's (momentum; variance unbiased). @return the loss. */
double fmoe_expert_mlp_loss_grad(fmoe_expert_mlp *m, fmoe_expert_mlp_work *w, const float *x,
                                 const float *t, int32_t n, uint64_t dropout_seed, float *grad,
                                 int update_stats);

/* Inference (eval mode: running statistics, no dropout) of n <= max_batch rows into
 * logits [n][J], every product summed in index order without BLAS, so the same input gives
 * the same bits in every executor and at any thread count. */
void fmoe_expert_mlp_infer(const fmoe_expert_mlp *m, fmoe_expert_mlp_work *w, const float *x,
                           int32_t n, float *logits);

/* Mean eval-mode binary cross-entropy over n rows of any count. */
double fmoe_expert_mlp_loss(const fmoe_expert_mlp *m, fmoe_expert_mlp_work *w, const float *x,
                            const float *t, int64_t n);

/* Trains m (shape set by init; re-initialised from params->seed) with Adam on mini-batches,
 * early stopping on the validation loss (eval mode) exactly as fmoe_mlp_train (its params
 * and report; a final batch of one row is skipped: BatchNorm needs two). The best epoch's
 * parameters and running statistics are left in m. @return 0, FMOE_EINVAL, FMOE_ENOMEM. */
int fmoe_expert_mlp_train(fmoe_expert_mlp *m, const float *x_train, const float *t_train,
                          int64_t n_train, const float *x_val, const float *t_val, int64_t n_val,
                          const fmoe_mlp_train_params *params, fmoe_mlp_train_report *report);

/* Rows made on demand, for training sets too large to hold as dense arrays: fill writes
 * rows idx[0..n) into x [n][D] and their targets into t [n][J]. */
typedef void (*fmoe_rows_fn)(void *ctx, const int64_t *idx, int32_t n, float *x, float *t);
typedef struct fmoe_row_source {
    int64_t n;        /* rows */
    fmoe_rows_fn fill;
    void *ctx;
} fmoe_row_source;

/* fmoe_expert_mlp_train over row sources (val->n may be 0): the same steps, the same bits
 * as over dense arrays holding the same rows. */
int fmoe_expert_mlp_train_rows(fmoe_expert_mlp *m, const fmoe_row_source *train,
                               const fmoe_row_source *val, const fmoe_mlp_train_params *params,
                               fmoe_mlp_train_report *report);

/* Mean eval-mode binary cross-entropy over a row source, in batches of w->max_batch (rows
 * 0..n-1 in order). scratch_x [max_batch][D], scratch_t [max_batch][J]. */
double fmoe_expert_mlp_loss_rows(const fmoe_expert_mlp *m, fmoe_expert_mlp_work *w,
                                 const fmoe_row_source *rows, float *scratch_x,
                                 float *scratch_t);

/* Allocates a duoserve predictor (kind "duoserve", stride 1) with an ExpertMLP of the given
 * widths (widths[0] must be (L+1)·J) and zeroed tables; val_* NaN. The file holds, besides
 * the root attributes of every predictor (format, version, kind, model_fingerprint,
 * model_name, num_layers, num_experts, top_k, target, seed, split, created, fmoe_version),
 * duoserve_version, num_fc, dropout, bn_eps; float32 datasets /popularity [L][J],
 * /affinity [L-1][J][J], /val_all_correct [L], /val_one_correct [L]; and per FC layer i the
 * group /expert_mlp/<i> with W [width[i+1]][width[i]], b, and for hidden layers
 * bn_gamma, bn_beta, bn_running_mean, bn_running_var [width[i+1]].
 * @return 0, FMOE_EINVAL, FMOE_ENOMEM. */
int fmoe_predictor_alloc_duoserve(fmoe_predictor **out, int32_t num_layers, int32_t num_experts,
                                  int32_t top_k, int32_t num_fc, const int32_t *widths);

/* The input width of the ExpertMLP: (L-1)·J + J + J (Eq. 5). */
static inline int32_t fmoe_duoserve_input_dim(int32_t num_layers, int32_t num_experts) {
    return (num_layers + 1) * num_experts;
}

/* Fills the popularity (Eq. 2) and affinity (Eq. 3) tables of p from n episodes (tokens):
 * experts [n][L][K] (row stride L·K), every token's K distinct experts per layer.
 * @return 0 or FMOE_EINVAL (an expert id >= J). */
int fmoe_duoserve_tables(fmoe_predictor *p, const uint16_t *experts, int64_t n);

/* The state s_l = [h_l, p_l, a_{l-1,l}] (DuoServe-MoE Eq. 4-5, §4.2) for target layer l
 * (1 <= l < L) of one token whose experts at layer m are chosen[m·layer_stride + k]
 * (k < K; only layers m < l are read), into s [(L+1)·J]:
 *   s[m·J + j]        m in [0, L-1): 1 when expert j was chosen at layer m < l, else 0 (the
 *                     history as an (L-1)×J multi-hot, zero-padded past l-1: §4.2's "zero-
 *                     padding to a fixed length" without index 0 colliding with padding);
 *   s[(L-1)·J + j]    P_l(j), the popularity of the target layer;
 *   s[L·J + j]        the mean over the K experts i chosen at layer l-1 of A_{l-1,l}(i, j)
 *                     (§5.3: "the inter-layer affinity vector from the previous layer's
 *                     expert selection"). */
void fmoe_duoserve_state(const fmoe_predictor *p, int32_t l, const uint16_t *chosen,
                         int64_t layer_stride, float *s);

#endif
