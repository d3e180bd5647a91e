/*
 * cmd_train_predictor.c - `fmoe train-predictor --kind promoe|duoserve`. --kind duoserve
 * (the ExpertMLP of "DuoServe-MoE: Dual-Phase Expert Prefetch and Cache Scheduling for
 * Efficient MoE LLM Inference", from expert ids alone) is train_duoserve.c, called once the
 * common options are checked. --kind promoe: traces recorded with
 * `fmoe record --hidden` -> one learned expert predictor per MoE layer (the ProMoE paper,
 * "ProMoE: Fast MoE-based LLM Serving using Proactive Caching", §4.4) in a predictor file,
 * and ACCURACY_i(k) per layer on a validation split next to ProMoE's two baselines
 * (ProMoE §4.2).
 *
 * defaults -> parse -> validate (the traces agree; hidden states present; stride < L) ->
 * split requests (seeded shuffle) -> per layer i = 1..L-1: gather rows (input: layer
 * max(i-k, 0)'s gate input; target: layer i's gate distribution), train (fmoe_mlp_train),
 * score on the validation split -> write the file (.partial, rename) -> table or JSON.
 *
 * The predictor's width (ProMoE §4.4): "two-layer MLP with a parameter size of
 * approximately 2M", i.e. H ≈ 2,000,000 / (h + J) (about 950 for DS-2's 2048 -> 64, 550 for
 * QW-2's 3584 -> 64). On a small model that rule gives H far above h (7,575 for fmoe-tiny's
 * 256 -> 8: 2M parameters fitted to a few thousand tokens), so we cap it at h/2 (at least
 * 16): the real models of the paper are untouched by the cap (950 < 1024, 550 < 1792).
 */
#include <cblas.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cmd_common.h"
#include "fmoe/error.h"
#include "fmoe/predictor.h"
#include "fmoe/trace.h"
#include "paths.h"
#include "train_common.h"
#include "train_duoserve.h"

int cmd_train_predictor(int argc, char **argv);

static const char *const CMD = "train-predictor";

/* "fMoE: Fine-Grained Expert Offloading for Large Mixture-of-Experts Serving" §6.1 sets
 * ProMoE's distance to 3; ProMoE itself does not say. */
#define DEFAULT_STRIDE 3

/* --kind's choices, indexed by fmoe_predictor_kind_id. */
static const char *const kind_names[] = {
    [FMOE_PREDICTOR_PROMOE] = FMOE_PREDICTOR_KIND_PROMOE,
    [FMOE_PREDICTOR_DUOSERVE] = FMOE_PREDICTOR_KIND_DUOSERVE,
    [FMOE_PREDICTOR_NUM_KINDS] = NULL,
};

typedef struct options {
    cmd_opt_strings traces;
    const char *output;
    int32_t kind;
    int32_t stride;
    double split;
    int64_t seed;
    int32_t epochs;
    int32_t patience;
    int32_t batch;
    double lr;
    int32_t mlp_hidden;
    int32_t threads;
    int json;
    int quiet;
} options;

static const cmd_option train_options[] = {
    {.name = "kind", .kind = CMD_OPT_ENUM, .value_name = "K",
     .help = "the predictor: " FMOE_PREDICTOR_KIND_PROMOE " (one MLP per layer from gate "
             "inputs, ProMoE §4.4) or " FMOE_PREDICTOR_KIND_DUOSERVE " (one ExpertMLP from "
             "expert ids, DuoServe-MoE §4)",
     .default_text = FMOE_PREDICTOR_KIND_PROMOE, .offset = offsetof(options, kind),
     .choices = kind_names},
    {.name = "trace", .kind = CMD_OPT_STRINGS, .io = CMD_IO_INPUT, .value_name = "FILE",
     .help = "a trace recorded with 'fmoe record --hidden'; repeatable (one model)",
     .offset = offsetof(options, traces)},
    {.name = "output", .short_name = 'o', .kind = CMD_OPT_STRING, .io = CMD_IO_OUTPUT,
     .value_name = "FILE",
     .help = "the predictor file to write", .offset = offsetof(options, output)},
    {.name = "stride", .kind = CMD_OPT_INT32, .value_name = "k",
     .help = "promoe: layers ahead: predictor i reads layer i-k's gate input (below the "
             "number of MoE layers); duoserve predicts the next layer",
     .default_text = "3", .offset = offsetof(options, stride), .min = 1, .max = 65535},
    {.name = "split", .kind = CMD_OPT_DOUBLE, .value_name = "S",
     .help = "share of requests trained on, in (0, 1); the rest validate (early stopping and "
             "the accuracy table)",
     .default_text = "0.7", .offset = offsetof(options, split), .fmin = 0, .fmax = 1},
    {.name = "seed", .kind = CMD_OPT_INT64, .value_name = "S",
     .help = "the split, the initial weights and the shuffles", .default_text = "0",
     .offset = offsetof(options, seed), .min = 0, .max = INT64_MAX},
    {.name = "epochs", .kind = CMD_OPT_INT32, .value_name = "N",
     .help = "at most N passes over the training rows per layer", .default_text = "100",
     .offset = offsetof(options, epochs), .min = 1, .max = 100000},
    {.name = "patience", .kind = CMD_OPT_INT32, .value_name = "N",
     .help = "stop a layer after N epochs without a better validation loss",
     .default_text = "3", .offset = offsetof(options, patience), .min = 1, .max = 100000},
    {.name = "batch", .kind = CMD_OPT_INT32, .value_name = "N", .help = "rows per Adam step",
     .default_text = "64", .offset = offsetof(options, batch), .min = 1, .max = 1 << 20},
    {.name = "lr", .kind = CMD_OPT_DOUBLE, .value_name = "X", .help = "Adam's step size",
     .default_text = "0.001", .offset = offsetof(options, lr), .fmin = 1e-8, .fmax = 10},
    {.name = "mlp-hidden", .kind = CMD_OPT_INT32, .value_name = "H",
     .help = "the MLP's hidden width; 0: min(2M / (h + J), h / 2), about 2M parameters at "
             "real sizes (duoserve: the first of its six hidden widths, the rest halving; 0: "
             "2048 -> 64 scaled by min(1, (L+1)·J / 264))",
     .default_text = "0", .offset = offsetof(options, mlp_hidden), .min = 0, .max = 1 << 16},
    {.name = "threads", .kind = CMD_OPT_INT32, .value_name = "N",
     .help = "OpenBLAS threads (one seed and one thread count give identical weights)",
     .default_text = "1", .offset = offsetof(options, threads), .min = 1, .max = 1024},
    {.name = "json", .kind = CMD_OPT_FLAG, .help = "print the report as JSON",
     .offset = offsetof(options, json)},
    {.name = "quiet", .short_name = 'q', .kind = CMD_OPT_FLAG, .help = "no progress bar",
     .offset = offsetof(options, quiet)},
    {0},
};

static void init(void *base) {
    options *o = base;
    memset(o, 0, sizeof *o);
    o->kind = FMOE_PREDICTOR_PROMOE;
    o->stride = DEFAULT_STRIDE;
    o->split = 0.7;
    o->epochs = 100;
    o->patience = 3;
    o->batch = 64;
    o->lr = 1e-3;
    o->threads = 1;
}

const cmd_spec cmd_train_predictor_spec = {
    .name = "train-predictor",
    .usage = "train-predictor --kind promoe|duoserve --trace T.h5 [--trace T2.h5 ...] -o P.h5 "
             "[options]",
    .description =
        "Train ProMoE's learned expert predictors (ProMoE paper §4.4): for each MoE\n"
        "layer i >= 1 a two-layer MLP (h -> H, ReLU, H -> J, softmax) that predicts layer\n"
        "i's gate distribution from the gate input of layer max(i-k, 0), trained with Adam\n"
        "on cross-entropy, with early stopping on the validation requests. Reports\n"
        "ACCURACY_i(k), the share of the true top-K experts among the predicted top-K, on\n"
        "the validation split, next to the skip-based (layer i's gate on layer i-k's input,\n"
        "from /tokens/speculative) and token-based (most frequent experts per token id)\n"
        "baselines.\n"
        "\n"
        "--kind duoserve trains DuoServe-MoE's predictor (DuoServe-MoE paper §4) from\n"
        "expert ids alone: the popularity (Eq. 2) and affinity (Eq. 3) tables of the training\n"
        "requests, and one ExpertMLP (seven FC layers, BatchNorm + ReLU + dropout 0.1, widths\n"
        "2048 -> 64 scaled to the model) that predicts layer l's experts from the experts of\n"
        "layers 0..l-1, P_l and the affinity rows of layer l-1's experts, on binary cross-\n"
        "entropy with Adam and early stopping. Reports the hit rates of the paper's Table 3\n"
        "(all K experts predicted; at least one) per layer on the validation split, next to\n"
        "the popularity and affinity heuristics.\n",
    .options = train_options,
    .epilog = "--kind promoe needs /tokens/hidden: record the traces with 'fmoe record --hidden'\n"
              "(and --speculative S >= k for the skip-based baseline). --kind duoserve reads\n"
              "the expert ids only (any trace, 'fmoe trace import' of an ids-only log too).\n",
    .size = sizeof(options),
    .init = init,
};

/* ---------------------------------------------------------------------------------------
 * Data
 * ------------------------------------------------------------------------------------- */

typedef cmd_request_ref req_ref; /* train_split.h */

/* The rows of one layer's predictor over a set of requests. */
typedef struct rows {
    int64_t n;
    float *x;          /* [n][h] layer src's gate input */
    float *t;          /* [n][J] layer i's gate distribution (the target) */
    int32_t *token_id; /* [n] */
    uint16_t *experts; /* [n][K] layer i's chosen experts */
    float *skip;       /* [n][J] layer i's gate on layer src's input; NULL: not recorded */
} rows;

static void rows_free(rows *r) {
    free(r->x);
    free(r->t);
    free(r->token_id);
    free(r->experts);
    free(r->skip);
    memset(r, 0, sizeof *r);
}

typedef struct ctx {
    fmoe_trace_reader **readers; /* the traces', by cmd_request_ref.trace */
    int32_t L, J, K, h, S;
    fmoe_probs_kind probs_kind;
    int64_t max_req_tokens;
    /* one request's token buffers */
    float *hid;   /* [max][L][h] */
    float *probs; /* [max][L][J] or NULL */
    uint16_t *ex; /* [max][L][K] */
    int32_t *tok; /* [max] */
    float *spec;  /* [max][L][S][J] or NULL */
} ctx;

static int64_t count_tokens(const ctx *c, const req_ref *reqs, int64_t n) {
    int64_t total = 0;
    for (int64_t i = 0; i < n; i++)
        total += fmoe_trace_reader_requests(c->readers[reqs[i].trace])[reqs[i].index].token_count;
    return total;
}

/* Fills `out` with layer `layer`'s rows (input from layer `from`) over the requests. */
static int gather(ctx *c, int32_t layer, int32_t from, const req_ref *reqs, int64_t nreq,
                  rows *out) {
    const size_t L = (size_t)c->L, J = (size_t)c->J, K = (size_t)c->K, h = (size_t)c->h,
                 S = (size_t)c->S;
    const int32_t depth = layer - from; /* the speculative row: gate of from+depth on from */
    const int with_skip = c->S > 0 && depth >= 1 && depth <= c->S;
    memset(out, 0, sizeof *out);
    const int64_t n = count_tokens(c, reqs, nreq);
    const size_t nn = (size_t)(n > 0 ? n : 1);
    out->x = malloc(nn * h * sizeof(float));
    out->t = malloc(nn * J * sizeof(float));
    out->token_id = malloc(nn * sizeof(int32_t));
    out->experts = malloc(nn * K * sizeof(uint16_t));
    out->skip = with_skip ? malloc(nn * J * sizeof(float)) : NULL;
    if (!out->x || !out->t || !out->token_id || !out->experts || (with_skip && !out->skip)) {
        rows_free(out);
        return fmoe_error_set(FMOE_ENOMEM, "training rows of layer %d: out of memory", layer);
    }
    int64_t row = 0;
    for (int64_t q = 0; q < nreq; q++) {
        fmoe_trace_reader *reader = c->readers[reqs[q].trace];
        const fmoe_trace_request_info *ri = &fmoe_trace_reader_requests(reader)[reqs[q].index];
        const fmoe_trace_token_buffers buf = {.token_id = c->tok, .experts = c->ex,
                                              .probs = c->probs, .hidden = c->hid,
                                              .speculative = with_skip ? c->spec : NULL};
        int rc = fmoe_trace_reader_read_tokens(reader, ri->token_begin, ri->token_count, &buf);
        if (rc < 0) {
            rows_free(out);
            return rc;
        }
        for (int64_t t = 0; t < ri->token_count; t++, row++) {
            memcpy(out->x + (size_t)row * h, c->hid + ((size_t)t * L + (size_t)from) * h,
                   h * sizeof(float));
            const uint16_t *e = c->ex + ((size_t)t * L + (size_t)layer) * K;
            memcpy(out->experts + (size_t)row * K, e, K * sizeof(uint16_t));
            out->token_id[row] = c->tok[t];
            float *tr = out->t + (size_t)row * J;
            double sum = 0;
            if (c->probs) {
                memcpy(tr, c->probs + ((size_t)t * L + (size_t)layer) * J, J * sizeof(float));
                for (size_t j = 0; j < J; j++) sum += tr[j];
            }
            if (sum > 0) { /* float16 storage leaves sums a little off 1 */
                for (size_t j = 0; j < J; j++) tr[j] = (float)(tr[j] / sum);
            } else { /* ids only: the multi-hot top-k divided by K */
                memset(tr, 0, J * sizeof(float));
                for (size_t k = 0; k < K; k++) tr[e[k]] = 1.0f / (float)K;
            }
            if (with_skip)
                memcpy(out->skip + (size_t)row * J,
                       c->spec + (((size_t)t * L + (size_t)from) * S + (size_t)(depth - 1)) * J,
                       J * sizeof(float));
        }
    }
    out->n = n;
    return 0;
}

/* ---------------------------------------------------------------------------------------
 * Progress: a bar whose label carries the layer and the losses
 * ------------------------------------------------------------------------------------- */

typedef struct progress_ctx {
    cmd_train_progress bar;
    int32_t layer, num_layers, max_epochs;
} progress_ctx;

static void on_epoch(void *vctx, int32_t epoch, double train_loss, double val_loss) {
    progress_ctx *p = vctx;
    snprintf(p->bar.label, sizeof p->bar.label, "layer %d/%d loss %.4f val %.4f", p->layer,
             p->num_layers - 1, train_loss, val_loss);
    fmoe_progress_report(&p->bar.cb, (int64_t)(p->layer - 1) * p->max_epochs + epoch,
                         (int64_t)(p->num_layers - 1) * p->max_epochs, "epochs");
}

/* ---------------------------------------------------------------------------------------
 * The command
 * ------------------------------------------------------------------------------------- */

typedef struct layer_result {
    int32_t source_layer;
    fmoe_mlp_train_report train;
    double learned, skip, token; /* ACCURACY on the validation rows; skip NAN: none */
    int64_t val_rows;
} layer_result;


/* Scores layer `i` on the validation rows; trains nothing. */
static int score_layer(const fmoe_mlp *m, const rows *val, const rows *train, int32_t J,
                       int32_t K, layer_result *res) {
    fmoe_mlp_work w = {0};
    fmoe_token_table *table = NULL;
    int32_t *pred = malloc((size_t)K * sizeof *pred);
    int rc = pred ? 0 : fmoe_error_set(FMOE_ENOMEM, "scoring: out of memory");
    if (rc == 0) rc = fmoe_mlp_work_init(&w, m, 256);
    if (rc == 0)
        rc = fmoe_token_table_build(&table, J, K, train->token_id, train->experts, K, train->n);
    if (rc < 0) goto done;
    int64_t hit_l = 0, hit_s = 0, hit_t = 0;
    for (int64_t r0 = 0; r0 < val->n; r0 += w.max_batch) {
        const int32_t b = (int32_t)(val->n - r0 < w.max_batch ? val->n - r0 : w.max_batch);
        fmoe_mlp_forward(m, &w, val->x + (size_t)r0 * m->in, b);
        for (int32_t r = 0; r < b; r++) {
            const int64_t row = r0 + r;
            const uint16_t *actual = val->experts + (size_t)row * K;
            fmoe_topk_indices(w.p + (size_t)r * J, J, K, pred);
            hit_l += fmoe_topk_overlap(pred, actual, K);
            if (val->skip) {
                fmoe_topk_indices(val->skip + (size_t)row * J, J, K, pred);
                hit_s += fmoe_topk_overlap(pred, actual, K);
            }
            fmoe_token_table_predict(table, val->token_id[row], pred);
            hit_t += fmoe_topk_overlap(pred, actual, K);
        }
    }
    const double denom = (double)val->n * K;
    res->val_rows = val->n;
    res->learned = val->n ? (double)hit_l / denom : NAN;
    res->skip = val->skip && val->n ? (double)hit_s / denom : NAN;
    res->token = val->n ? (double)hit_t / denom : NAN;
done:
    fmoe_token_table_free(table);
    fmoe_mlp_work_free(&w);
    free(pred);
    return rc;
}

static void print_report(const options *o, const ctx *c, const cmd_train_traces *tt,
                         const fmoe_predictor *p, const layer_result *res, int64_t train_rows,
                         int64_t val_rows, double secs) {
    const int64_t params = fmoe_mlp_num_params(&p->layers[1]);
    double mean_l = 0, mean_s = 0, mean_t = 0;
    int32_t n_s = 0, beats = 0;
    for (int32_t i = 1; i < c->L; i++) {
        mean_l += res[i].learned;
        mean_t += res[i].token;
        beats += res[i].learned >= res[i].token;
        if (isfinite(res[i].skip)) mean_s += res[i].skip, n_s++;
    }
    mean_l /= c->L - 1;
    mean_t /= c->L - 1;
    mean_s = n_s ? mean_s / n_s : NAN;
    if (o->json) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "output", o->output);
        cJSON_AddStringToObject(d, "kind", p->kind);
        cJSON_AddNumberToObject(d, "stride", p->stride);
        cJSON_AddNumberToObject(d, "num_layers", p->num_layers);
        cJSON_AddNumberToObject(d, "num_experts", p->num_experts);
        cJSON_AddNumberToObject(d, "top_k", p->top_k);
        cJSON_AddNumberToObject(d, "hidden_size", p->hidden_size);
        cJSON_AddNumberToObject(d, "mlp_hidden", p->mlp_hidden);
        cJSON_AddNumberToObject(d, "params_per_layer", (double)params);
        cJSON_AddStringToObject(d, "target", p->target);
        cmd_train_json_run(d, o->seed, o->split, o->threads, tt);
        cJSON_AddNumberToObject(d, "train_rows", (double)train_rows);
        cJSON_AddNumberToObject(d, "validation_rows", (double)val_rows);
        cmd_train_json_validation(d, tt);
        cJSON *ls = cJSON_AddArrayToObject(d, "layers");
        for (int32_t i = 1; i < c->L; i++) {
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "layer", i);
            cJSON_AddNumberToObject(e, "source_layer", res[i].source_layer);
            cJSON_AddNumberToObject(e, "epochs", res[i].train.epochs);
            cJSON_AddNumberToObject(e, "best_epoch", res[i].train.best_epoch);
            cJSON_AddItemToObject(e, "train_loss", cmd_json_finite_or_null(res[i].train.train_loss));
            cJSON_AddItemToObject(e, "val_loss", cmd_json_finite_or_null(res[i].train.val_loss));
            cJSON_AddItemToObject(e, "accuracy", cmd_json_finite_or_null(res[i].learned));
            cJSON_AddItemToObject(e, "skip_accuracy", cmd_json_finite_or_null(res[i].skip));
            cJSON_AddItemToObject(e, "token_accuracy", cmd_json_finite_or_null(res[i].token));
            cJSON_AddItemToArray(ls, e);
        }
        cJSON *mean = cJSON_AddObjectToObject(d, "mean");
        cJSON_AddItemToObject(mean, "accuracy", cmd_json_finite_or_null(mean_l));
        cJSON_AddItemToObject(mean, "skip_accuracy", cmd_json_finite_or_null(mean_s));
        cJSON_AddItemToObject(mean, "token_accuracy", cmd_json_finite_or_null(mean_t));
        cJSON_AddNumberToObject(d, "seconds", secs);
        cmd_print_json(d);
        return;
    }
    printf("%s: ProMoE predictors for %s, stride %d, layers 1..%d\n", o->output,
           p->model_name[0] ? p->model_name : "(unnamed model)", p->stride, p->num_layers - 1);
    printf("  model        %d MoE layers x %d experts, top-%d, hidden %d\n", p->num_layers,
           p->num_experts, p->top_k, p->hidden_size);
    printf("  predictor    MLP %d -> %d (ReLU) -> %d, softmax: %lld parameters per layer\n",
           p->hidden_size, p->mlp_hidden, p->num_experts, (long long)params);
    cmd_train_print_data(tt, train_rows, val_rows, o->seed);
    printf("  target       %s\n",
           c->probs_kind == FMOE_PROBS_NONE ? "the multi-hot top-k / K (the trace has ids only)"
                                            : "the gate probabilities, cross-entropy");
    printf("  took         %.2f s\n\n", secs);
    printf("ACCURACY_i(k) on the validation split (share of the true top-%d in the predicted "
           "top-%d):\n",
           p->top_k, p->top_k);
    printf("  layer  from  epochs  val_loss  learned   skip  token\n");
    for (int32_t i = 1; i < c->L; i++) {
        char skip[16];
        if (isfinite(res[i].skip))
            snprintf(skip, sizeof skip, "%5.1f%%", 100 * res[i].skip);
        else
            snprintf(skip, sizeof skip, "%6s", "-");
        printf("  %5d  %4d  %6d  %8.4f  %6.1f%%  %s  %4.1f%%\n", i, res[i].source_layer,
               res[i].train.epochs, res[i].train.val_loss, 100 * res[i].learned, skip,
               100 * res[i].token);
    }
    char skip[16];
    if (isfinite(mean_s))
        snprintf(skip, sizeof skip, "%5.1f%%", 100 * mean_s);
    else
        snprintf(skip, sizeof skip, "%6s", "-");
    printf("  %5s  %4s  %6s  %8s  %6.1f%%  %s  %4.1f%%\n", "mean", "", "", "", 100 * mean_l, skip,
           100 * mean_t);
    printf("\n  learned >= token-based on %d of %d layers\n", beats, c->L - 1);
    if (n_s < c->L - 1)
        printf("  skip: layer i's gate on layer i-k's input needs /tokens/speculative of depth "
               ">= i - source (the trace has %d); '-' where it has not\n",
               c->S);
}

/* The geometry the training reads: the first trace's, with the speculative depth and
 * the probabilities that every trace has. */
static void trace_geometry(ctx *c, const cmd_train_traces *tt, int32_t num_traces) {
    c->readers = tt->readers;
    const fmoe_trace_header *h0 = tt->h0;
    c->L = h0->num_layers;
    c->J = h0->num_experts;
    c->K = h0->top_k;
    c->h = h0->hidden_dim;
    c->S = h0->speculative_depth;
    c->probs_kind = h0->probs_kind;
    for (int32_t s = 1; s < num_traces; s++) {
        const fmoe_trace_header *h = fmoe_trace_reader_header(tt->readers[s]);
        if (h->speculative_depth < c->S) c->S = h->speculative_depth;
        if (h->probs_kind == FMOE_PROBS_NONE) c->probs_kind = FMOE_PROBS_NONE;
    }
}

/* One request's token buffers, sized for the longest request of any trace. @return 0 or
 * -1 (out of memory). */
static int alloc_token_buffers(ctx *c, const cmd_train_traces *tt, int32_t num_traces) {
    if (c->S > 0)
        for (int32_t s = 0; s < num_traces; s++)
            if (fmoe_trace_reader_header(tt->readers[s])->speculative_depth != c->S) {
                c->S = 0; /* differing depths: the [L][S][J] rows would not line up */
                break;
            }
    for (int32_t s = 0; s < num_traces; s++) {
        const fmoe_trace_request_info *ri = fmoe_trace_reader_requests(tt->readers[s]);
        for (int64_t r = 0; r < fmoe_trace_reader_num_requests(tt->readers[s]); r++)
            if (ri[r].token_count > c->max_req_tokens) c->max_req_tokens = ri[r].token_count;
    }
    const size_t M = (size_t)(c->max_req_tokens > 0 ? c->max_req_tokens : 1), L = (size_t)c->L;
    c->hid = malloc(M * L * (size_t)c->h * sizeof(float));
    c->probs =
        c->probs_kind != FMOE_PROBS_NONE ? malloc(M * L * (size_t)c->J * sizeof(float)) : NULL;
    c->ex = malloc(M * L * (size_t)c->K * sizeof(uint16_t));
    c->tok = malloc(M * sizeof(int32_t));
    c->spec = c->S > 0 ? malloc(M * L * (size_t)c->S * (size_t)c->J * sizeof(float)) : NULL;
    if (!c->hid || !c->ex || !c->tok || (c->probs_kind != FMOE_PROBS_NONE && !c->probs) ||
        (c->S > 0 && !c->spec))
        return -1;
    return 0;
}

static void free_token_buffers(ctx *c) {
    free(c->hid);
    free(c->probs);
    free(c->ex);
    free(c->tok);
    free(c->spec);
}

/* Trains and scores predictor layers 1..L-1 in turn, each on its own rows gathered from
 * the training requests and validated on the held-out ones; *train_rows and *val_rows
 * are the last layer's. @return 0 or a negative FMOE_E* code (detail set). */
static int train_layers(ctx *c, const options *o, const cmd_train_traces *tt,
                        fmoe_predictor *pred, layer_result *res, int64_t *train_rows,
                        int64_t *val_rows) {
    rows train = {0}, val = {0};
    int rc = 0;
    openblas_set_num_threads(o->threads);
    progress_ctx prog = {.num_layers = c->L, .max_epochs = o->epochs};
    cmd_train_progress_start(&prog.bar, "training", o->quiet);
    for (int32_t i = 1; i < c->L; i++) {
        const int32_t from = fmoe_promoe_source_layer(i, o->stride);
        res[i].source_layer = from;
        if ((rc = gather(c, i, from, tt->reqs, tt->num_train, &train)) < 0 ||
            (rc = gather(c, i, from, tt->reqs + tt->num_train, tt->num_requests - tt->num_train,
                         &val)) < 0)
            break;
        *train_rows = train.n;
        *val_rows = val.n;
        if (train.n < 1) {
            rc = fmoe_error_set(FMOE_EINVAL, "the training requests hold no tokens");
            break;
        }
        prog.layer = i;
        const fmoe_mlp_train_params tp = {.batch = o->batch,
                                          .max_epochs = o->epochs,
                                          .patience = o->patience,
                                          .lr = o->lr,
                                          /* one stream per layer from the one seed */
                                          .seed = (uint64_t)o->seed * 0x100000001B3ull + (uint64_t)i,
                                          .on_epoch = on_epoch,
                                          .ctx = &prog};
        if ((rc = fmoe_mlp_train(&pred->layers[i], train.x, train.t, train.n, val.x, val.t, val.n,
                                 &tp, &res[i].train)) < 0 ||
            (rc = score_layer(&pred->layers[i], &val, &train, c->J, c->K, &res[i])) < 0)
            break;
        pred->val_accuracy[i] = (float)res[i].learned;
        rows_free(&train);
        rows_free(&val);
    }
    cmd_progress_bar_done(&prog.bar.bar);
    rows_free(&train);
    rows_free(&val);
    return rc;
}

int cmd_train_predictor(int argc, char **argv) {
    options o;
    init(&o);
    int rc = cmd_options_parse(&cmd_train_predictor_spec, &o, argc, argv, NULL);
    if (rc) return rc < 0 ? CMD_EXIT_OK : rc;
    if (o.traces.n == 0) return cmd_usage_error(CMD, "--trace is required");
    if (!o.output) return cmd_usage_error(CMD, "-o P.h5 is required");
    if (!(o.split > 0 && o.split < 1))
        return cmd_usage_error(CMD, "--split must be in (0, 1): the share of requests trained "
                                    "on, got %g",
                               o.split);
    if (o.kind == FMOE_PREDICTOR_DUOSERVE) {
        if (o.stride != DEFAULT_STRIDE)
            return cmd_usage_error(CMD, "--stride is for --kind promoe; duoserve predicts the "
                                        "next layer (distance 1)");
        const cmd_train_duoserve_args da = {
            .traces = (const char *const *)o.traces.items, .num_traces = o.traces.n,
            .output = o.output, .split = o.split, .seed = o.seed, .epochs = o.epochs,
            .patience = o.patience, .batch = o.batch, .threads = o.threads, .lr = o.lr,
            .first_width = o.mlp_hidden, .json = o.json, .quiet = o.quiet};
        return cmd__train_duoserve(CMD, &da);
    }

    ctx c = {0};
    cmd_train_traces tt;
    layer_result *res = NULL;
    fmoe_predictor *pred = NULL;
    int exit_code =
        cmd_train_traces_open(CMD, (const char *const *)o.traces.items, o.traces.n, 1, &tt);
    if (exit_code != 0) goto done;
    exit_code = CMD_EXIT_FAILURE;
    trace_geometry(&c, &tt, o.traces.n);
    if (o.stride >= c.L) {
        exit_code = cmd_usage_error(CMD, "--stride must be below the number of MoE layers (%d in "
                                         "%s), got %d",
                                    c.L, tt.paths[0], o.stride);
        goto done;
    }
    if ((exit_code = cmd_train_traces_split(CMD, &tt, o.split, o.seed)) != 0) goto done;
    exit_code = CMD_EXIT_FAILURE;
    res = calloc((size_t)c.L, sizeof *res);
    if (!res || alloc_token_buffers(&c, &tt, o.traces.n) < 0) {
        exit_code = cmd_failf(CMD, "out of memory");
        goto done;
    }

    int32_t H = o.mlp_hidden;
    if (H == 0) { /* ProMoE §4.4: ~2M parameters, capped at h/2 (see the top) */
        H = fmoe_promoe_default_hidden(c.h, c.J);
    }
    if ((rc = fmoe_predictor_alloc(&pred, c.L, c.J, c.K, c.h, H, o.stride)) < 0) {
        exit_code = cmd_fail(CMD, rc);
        goto done;
    }
    cmd_train_label_predictor(&tt, pred, fmoe_probs_kind_name(c.probs_kind), o.seed, o.split);

    const double t0 = cmd_now();
    int64_t train_rows = 0, val_rows = 0;
    if ((rc = train_layers(&c, &o, &tt, pred, res, &train_rows, &val_rows)) < 0) {
        exit_code = cmd_fail(CMD, rc);
        goto done;
    }
    const double secs = cmd_now() - t0;
    if ((rc = fmoe_predictor_write(o.output, pred)) < 0) {
        exit_code = cmd_fail(CMD, rc);
        goto done;
    }
    print_report(&o, &c, &tt, pred, res, train_rows, val_rows, secs);
    exit_code = CMD_EXIT_OK;
done:
    fmoe_predictor_free(pred);
    free_token_buffers(&c);
    free(res);
    cmd_train_traces_close(&tt);
    return exit_code;
}
