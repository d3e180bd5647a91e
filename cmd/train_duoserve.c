/*
 * train_duoserve.c - `fmoe train-predictor --kind duoserve`: routing traces (expert ids
 * alone; probabilities and gate inputs are not read) -> DuoServe-MoE's predictor
 * (the DuoServe-MoE paper, "DuoServe-MoE: Dual-Phase Expert Prefetch and Cache Scheduling
 * for Efficient MoE LLM Inference", §4.1-§4.2) in a predictor file, and the
 * predictor's hit rates of Table 3 per layer on a validation split.
 *
 * validate (the traces agree on the model) -> split requests (the seeded shuffle of --kind
 * promoe: one seed splits both kinds alike) -> read every token's experts -> popularity
 * (Eq. 2) and affinity (Eq. 3) from the training tokens only (the validation tokens stay
 * unseen, §6.1 "unseen data") -> rows, made on demand: for every token and target layer
 * l = 1..L-1 the state s_l (Eq. 5) and the multi-hot E_l -> train the ExpertMLP (BCE, Adam, early stop on the
 * validation loss) -> score -> write (.partial, rename) -> table or JSON.
 *
 * Table 3's two hit rates per target layer, over the validation tokens: "Top-K" (the paper's
 * "Top-2", both experts correct): the predicted top-K equals the chosen K; "at least one":
 * they share an expert. Beside them the heuristics the paper argues a learned predictor
 * beats (§2.1, Challenge #1): the layer's K most popular experts (Eq. 2), and the K largest
 * of the mean affinity row of the previous layer's experts (Eq. 3).
 */
#include "train_duoserve.h"

#include <cblas.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd_common.h"
#include "fmoe/error.h"
#include "fmoe/predictor.h"
#include "fmoe/trace.h"
#include "train_common.h"

/* Every token's experts [n][L][K] of the requests, in order, into *out (malloc'd). */
static int read_experts(fmoe_trace_reader **readers, const cmd_request_ref *reqs, int64_t nreq,
                        int32_t L, int32_t K, uint16_t **out, int64_t *n_out) {
    int64_t n = 0;
    for (int64_t q = 0; q < nreq; q++)
        n += fmoe_trace_reader_requests(readers[reqs[q].trace])[reqs[q].index].token_count;
    const size_t row = (size_t)L * K;
    uint16_t *ex = malloc((size_t)(n > 0 ? n : 1) * row * sizeof *ex);
    if (!ex) return fmoe_error_set(FMOE_ENOMEM, "expert ids of %lld tokens", (long long)n);
    int64_t at = 0;
    for (int64_t q = 0; q < nreq; q++) {
        fmoe_trace_reader *r = readers[reqs[q].trace];
        const fmoe_trace_request_info *ri = &fmoe_trace_reader_requests(r)[reqs[q].index];
        const fmoe_trace_token_buffers buf = {.experts = ex + (size_t)at * row};
        int rc = fmoe_trace_reader_read_tokens(r, ri->token_begin, ri->token_count, &buf);
        if (rc < 0) {
            free(ex);
            return rc;
        }
        at += ri->token_count;
    }
    *out = ex;
    *n_out = n;
    return 0;
}

/* The rows of n tokens, made on demand (a dense copy would take n·(L-1)·(L+1)·J floats:
 * gigabytes for a long trace of a large model): row t·(L-1) + l-1 is token t's state s_l
 * (x) and multi-hot E_l (t), for l = 1..L-1. */
typedef struct token_rows {
    const fmoe_predictor *p;
    const uint16_t *ex; /* [n][L][K] */
} token_rows;

static void fill_rows(void *vctx, const int64_t *idx, int32_t n, float *x, float *t) {
    const token_rows *c = vctx;
    const int32_t L = c->p->num_layers, J = c->p->num_experts, K = c->p->top_k;
    const size_t D = (size_t)fmoe_duoserve_input_dim(L, J);
    memset(t, 0, (size_t)n * J * sizeof *t);
    for (int32_t r = 0; r < n; r++) {
        const int64_t tok = idx[r] / (L - 1);
        const int32_t l = (int32_t)(idx[r] % (L - 1)) + 1;
        const uint16_t *e = c->ex + (size_t)tok * L * K;
        fmoe_duoserve_state(c->p, l, e, K, x + (size_t)r * D);
        for (int32_t k = 0; k < K; k++) t[(size_t)r * J + e[(size_t)l * K + k]] = 1.0f;
    }
}

typedef struct layer_score {
    int64_t tokens;
    int64_t all[3], one[3]; /* learned, popularity, affinity */
} layer_score;

static void count(layer_score *s, int m, int32_t overlap, int32_t K) {
    s->all[m] += overlap == K;
    s->one[m] += overlap >= 1;
}

/* Table 3's hit rates per target layer over the validation tokens. */
static int score(const fmoe_predictor *p, const uint16_t *ex, int64_t n, layer_score *res) {
    const int32_t L = p->num_layers, J = p->num_experts, K = p->top_k;
    const size_t D = (size_t)fmoe_duoserve_input_dim(L, J);
    fmoe_expert_mlp_work w = {0};
    float *s = malloc(D * sizeof *s), *logits = malloc((size_t)J * sizeof *logits);
    int32_t *pred = malloc((size_t)K * sizeof *pred);
    int rc = s && logits && pred ? 0 : fmoe_error_set(FMOE_ENOMEM, "scoring");
    if (rc == 0) rc = fmoe_expert_mlp_work_init(&w, p->expert_mlp, 1);
    for (int64_t tok = 0; rc == 0 && tok < n; tok++) {
        const uint16_t *e = ex + (size_t)tok * L * K;
        for (int32_t l = 1; l < L; l++) {
            const uint16_t *actual = e + (size_t)l * K;
            fmoe_duoserve_state(p, l, e, K, s);
            fmoe_expert_mlp_infer(p->expert_mlp, &w, s, 1, logits); /* as the policy does */
            fmoe_topk_indices(logits, J, K, pred);
            count(&res[l], 0, fmoe_topk_overlap(pred, actual, K), K);
            fmoe_topk_indices(p->popularity + (size_t)l * J, J, K, pred);
            count(&res[l], 1, fmoe_topk_overlap(pred, actual, K), K);
            fmoe_topk_indices(s + (size_t)L * J, J, K, pred); /* the mean affinity row */
            count(&res[l], 2, fmoe_topk_overlap(pred, actual, K), K);
            res[l].tokens++;
        }
    }
    fmoe_expert_mlp_work_free(&w);
    free(s);
    free(logits);
    free(pred);
    return rc;
}

typedef struct progress_ctx {
    cmd_train_progress bar;
    int32_t max_epochs;
} progress_ctx;

static void on_epoch(void *vctx, int32_t epoch, double train_loss, double val_loss) {
    progress_ctx *p = vctx;
    snprintf(p->bar.label, sizeof p->bar.label, "ExpertMLP loss %.4f val %.4f", train_loss,
             val_loss);
    fmoe_progress_report(&p->bar.cb, epoch, p->max_epochs, "epochs");
}

static double rate(int64_t k, int64_t n) { return n > 0 ? (double)k / (double)n : NAN; }

static void print_report(const cmd_train_duoserve_args *a, const cmd_train_traces *tt,
                         const fmoe_predictor *p, const layer_score *res,
                         const fmoe_mlp_train_report *tr, int64_t train_tokens,
                         int64_t val_tokens, double secs) {
    const fmoe_expert_mlp *m = p->expert_mlp;
    const int32_t L = p->num_layers, K = p->top_k;
    double mean[3][2] = {{0}};
    for (int32_t l = 1; l < L; l++)
        for (int q = 0; q < 3; q++) {
            mean[q][0] += rate(res[l].all[q], res[l].tokens) / (L - 1);
            mean[q][1] += rate(res[l].one[q], res[l].tokens) / (L - 1);
        }
    static const char *const names[3] = {"", "popularity_", "affinity_"};
    if (a->json) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "output", a->output);
        cJSON_AddStringToObject(d, "kind", p->kind);
        cJSON_AddNumberToObject(d, "num_layers", L);
        cJSON_AddNumberToObject(d, "num_experts", p->num_experts);
        cJSON_AddNumberToObject(d, "top_k", K);
        cJSON *wd = cJSON_AddArrayToObject(d, "widths");
        for (int32_t i = 0; i <= m->num_fc; i++) cJSON_AddItemToArray(wd, cJSON_CreateNumber(m->width[i]));
        cJSON_AddNumberToObject(d, "params", (double)m->num_params);
        cmd_train_json_run(d, a->seed, a->split, a->threads, tt);
        cJSON_AddNumberToObject(d, "train_tokens", (double)train_tokens);
        cJSON_AddNumberToObject(d, "validation_tokens", (double)val_tokens);
        cmd_train_json_validation(d, tt);
        cJSON_AddNumberToObject(d, "epochs", tr->epochs);
        cJSON_AddNumberToObject(d, "best_epoch", tr->best_epoch);
        cJSON_AddItemToObject(d, "train_loss", cmd_json_finite_or_null(tr->train_loss));
        cJSON_AddItemToObject(d, "val_loss", cmd_json_finite_or_null(tr->val_loss));
        cJSON *ls = cJSON_AddArrayToObject(d, "layers");
        char key[48];
        for (int32_t l = 1; l < L; l++) {
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "layer", l);
            cJSON_AddNumberToObject(e, "tokens", (double)res[l].tokens);
            for (int q = 0; q < 3; q++) {
                const double all = rate(res[l].all[q], res[l].tokens),
                             one = rate(res[l].one[q], res[l].tokens);
                snprintf(key, sizeof key, "%sall_correct", names[q]);
                cJSON_AddItemToObject(e, key, cmd_json_finite_or_null(all));
                snprintf(key, sizeof key, "%sone_correct", names[q]);
                cJSON_AddItemToObject(e, key, cmd_json_finite_or_null(one));
            }
            cJSON_AddItemToArray(ls, e);
        }
        cJSON *mn = cJSON_AddObjectToObject(d, "mean");
        for (int q = 0; q < 3; q++) {
            snprintf(key, sizeof key, "%sall_correct", names[q]);
            cJSON_AddItemToObject(mn, key, cmd_json_finite_or_null(mean[q][0]));
            snprintf(key, sizeof key, "%sone_correct", names[q]);
            cJSON_AddItemToObject(mn, key, cmd_json_finite_or_null(mean[q][1]));
        }
        cJSON_AddNumberToObject(d, "seconds", secs);
        cmd_print_json(d);
        return;
    }
    printf("%s: DuoServe-MoE predictor for %s, layers 1..%d\n", a->output,
           p->model_name[0] ? p->model_name : "(unnamed model)", L - 1);
    printf("  model        %d MoE layers x %d experts, top-%d\n", L, p->num_experts, K);
    printf("  predictor    ExpertMLP");
    for (int32_t i = 0; i <= m->num_fc; i++) printf("%s%d", i ? " -> " : " ", m->width[i]);
    printf(" (BatchNorm, ReLU, dropout %.1f): %lld parameters, one for all layers\n",
           (double)m->dropout, (long long)m->num_params);
    printf("  input        history %d x %d multi-hot, popularity %d, affinity %d (Eq. 4-5)\n",
           L - 1, p->num_experts, p->num_experts, p->num_experts);
    cmd_train_print_data(tt, train_tokens, val_tokens, a->seed);
    printf("  training     %d epochs (best %d), BCE train %.4f, validation %.4f; %.2f s\n\n",
           tr->epochs, tr->best_epoch, tr->train_loss, tr->val_loss, secs);
    printf("Hit rates on the validation split (DuoServe-MoE paper, Table 3): top-%d = all "
           "%d experts predicted, one = at least one\n",
           K, K);
    char topk[16];
    snprintf(topk, sizeof topk, "top-%d", K);
    printf("  %5s  %7s   %-15s   %-15s   %-15s\n", "", "", "learned", "popularity", "affinity");
    printf("  %5s  %7s   %6s  %7s   %6s  %7s   %6s  %7s\n", "layer", "tokens", topk, "one", topk,
           "one", topk, "one");
    for (int32_t l = 1; l < L; l++) {
        printf("  %5d  %7lld", l, (long long)res[l].tokens);
        for (int q = 0; q < 3; q++)
            printf("   %5.1f%%  %6.1f%%", 100 * rate(res[l].all[q], res[l].tokens),
                   100 * rate(res[l].one[q], res[l].tokens));
        printf("\n");
    }
    printf("  %5s  %7s", "mean", "");
    for (int q = 0; q < 3; q++) printf("   %5.1f%%  %6.1f%%", 100 * mean[q][0], 100 * mean[q][1]);
    printf("\n");
}

int cmd__train_duoserve(const char *cmd, const cmd_train_duoserve_args *a) {
    cmd_train_traces tt;
    uint16_t *ex_train = NULL, *ex_val = NULL;
    layer_score *res = NULL;
    fmoe_predictor *pred = NULL;
    int rc, exit_code = cmd_train_traces_open(cmd, a->traces, a->num_traces, 0, &tt);
    if (exit_code != 0) goto done;
    exit_code = CMD_EXIT_FAILURE;
    const int32_t L = tt.h0->num_layers, J = tt.h0->num_experts, K = tt.h0->top_k;
    if (L < 2 || J < 2) {
        exit_code = cmd_failf(cmd, "%s has %d MoE layer%s of %d experts: DuoServe predicts layer "
                                   "l+1 from layers 0..l, which needs at least 2 layers and 2 "
                                   "experts",
                              a->traces[0], L, L == 1 ? "" : "s", J);
        goto done;
    }
    if ((exit_code = cmd_train_traces_split(cmd, &tt, a->split, a->seed)) != 0) goto done;
    exit_code = CMD_EXIT_FAILURE;
    res = calloc((size_t)L, sizeof *res);
    if (!res) {
        exit_code = cmd_failf(cmd, "out of memory");
        goto done;
    }

    const int64_t ntrain = tt.num_train, nreq = tt.num_requests;
    int64_t n_train = 0, n_val = 0;
    if ((rc = read_experts(tt.readers, tt.reqs, ntrain, L, K, &ex_train, &n_train)) < 0 ||
        (rc = read_experts(tt.readers, tt.reqs + ntrain, nreq - ntrain, L, K, &ex_val, &n_val)) <
            0) {
        exit_code = cmd_fail(cmd, rc);
        goto done;
    }
    if (n_train < 2) {
        exit_code = cmd_failf(cmd, "the training requests hold %lld token%s; the ExpertMLP's "
                                   "BatchNorm needs at least 2",
                              (long long)n_train, n_train == 1 ? "" : "s");
        goto done;
    }
    int32_t widths[FMOE_EXPERT_MLP_MAX_FC + 1];
    const int32_t F = fmoe_duoserve_widths(L, J, a->first_width, widths);
    if ((rc = fmoe_predictor_alloc_duoserve(&pred, L, J, K, F, widths)) < 0 ||
        (rc = fmoe_duoserve_tables(pred, ex_train, n_train)) < 0) {
        exit_code = cmd_fail(cmd, rc);
        goto done;
    }
    cmd_train_label_predictor(&tt, pred, "none", a->seed, a->split); /* expert ids only */

    openblas_set_num_threads(a->threads);
    progress_ctx prog = {.max_epochs = a->epochs};
    cmd_train_progress_start(&prog.bar, "ExpertMLP", a->quiet);
    const double t0 = cmd_now();
    fmoe_mlp_train_report tr = {0};
    const fmoe_mlp_train_params tp = {.batch = a->batch, .max_epochs = a->epochs,
                                      .patience = a->patience, .lr = a->lr,
                                      .seed = (uint64_t)a->seed * 0x100000001B3ull + 0xD0u,
                                      .on_epoch = on_epoch, .ctx = &prog};
    token_rows rows_train = {pred, ex_train}, rows_val = {pred, ex_val};
    const fmoe_row_source src_train = {n_train * (L - 1), fill_rows, &rows_train},
                          src_val = {n_val * (L - 1), fill_rows, &rows_val};
    rc = fmoe_expert_mlp_train_rows(pred->expert_mlp, &src_train, &src_val, &tp, &tr);
    cmd_progress_bar_done(&prog.bar.bar);
    if (rc == 0) rc = score(pred, ex_val, n_val, res);
    if (rc < 0) {
        exit_code = cmd_fail(cmd, rc);
        goto done;
    }
    for (int32_t l = 1; l < L; l++) {
        pred->val_all_correct[l] = (float)rate(res[l].all[0], res[l].tokens);
        pred->val_one_correct[l] = (float)rate(res[l].one[0], res[l].tokens);
    }
    const double secs = cmd_now() - t0;
    if ((rc = fmoe_predictor_write(a->output, pred)) < 0) {
        exit_code = cmd_fail(cmd, rc);
        goto done;
    }
    print_report(a, &tt, pred, res, &tr, n_train, n_val, secs);
    exit_code = CMD_EXIT_OK;
done:
    fmoe_predictor_free(pred);
    free(ex_train);
    free(ex_val);
    free(res);
    cmd_train_traces_close(&tt);
    return exit_code;
}
