/*
 * import_dense_csv.c - `fmoe trace import --format dense-csv`: router probabilities as
 * published with the FLAME-MoE traces (CMU-FLAME/FLAME-MoE-Traces, and the samples of
 * the DynaNDE simulator): one CSV file per MoE layer, given in layer order,
 *
 *     layer_id,token_id,expert_0,...,expert_{J-1}
 *     0,0,0.0,0.0312,...
 *
 * row i being token i in every file. Each row is the router's softmax over J experts
 * with only the chosen experts' scores kept, so it has exactly K non-zero entries: those
 * are the chosen experts, in gate order = decreasing probability (ties: lower expert id
 * first), and the row is stored as it is (probs_kind topk). The layer_id column is not
 * trusted (FLAME writes 0 in every file; the file's position gives the layer); token_id
 * must agree across the files of one row, which catches files that are not row-aligned,
 * and is not a vocabulary id (the trace's token_id is -1).
 *
 * Tokens are grouped into requests of `tokens_per_request` prefill tokens (the last one
 * may be shorter), or one request when 0: these traces are teacher-forced sequences, so
 * each request is one prefill iteration.
 *
 * Cost: each file is read whole (FLAME: 1.2 MB per layer) and parsed with strtod; memory
 * T·L·K·6 bytes plus one request's dense [T][L][J] probabilities.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <stdint.h>
#include "datasets_impl.h"
#include "fmoe/datasets.h"
#include "fmoe/error.h"

typedef struct dense {
    int32_t L, J, K;
    int64_t T;          /* rows per file */
    uint16_t *experts;  /* [T][L][K] chosen experts, gate order */
    float *vals;        /* [T][L][K] their probabilities */
    int64_t *token_col; /* [T] token_id column of the first file */
    float *row;         /* [J] scratch */
    int32_t *order;     /* [J] scratch */
} dense;

static int check_header(const char *path, const fmoe__ds_line *ln, int32_t J) {
    const char *p = ln->begin, *end = ln->begin + ln->len;
    int32_t col = 0;
    char want[32];
    while (p <= end) {
        const char *c = memchr(p, ',', (size_t)(end - p));
        const char *fe = c ? c : end;
        if (col == 0)
            snprintf(want, sizeof want, "layer_id");
        else if (col == 1)
            snprintf(want, sizeof want, "token_id");
        else
            snprintf(want, sizeof want, "expert_%d", (int)(col - 2));
        if (col - 2 < J && ((size_t)(fe - p) != strlen(want) || memcmp(p, want, strlen(want))))
            return fmoe_error_set(FMOE_EFORMAT, "%s:1: column %d is '%.*s', expected '%s'", path,
                                  (int)col + 1, (int)(fe - p > 40 ? 40 : fe - p), p, want);
        col++;
        if (!c) break;
        p = c + 1;
    }
    if (col - 2 != J)
        return fmoe_error_set(FMOE_EFORMAT, "%s:1: %d expert columns, expected J = %d", path,
                              (int)(col - 2 < 0 ? 0 : col - 2), (int)J);
    return 0;
}

static int64_t count_rows(const char *data, size_t len) {
    fmoe__ds_line_iter it;
    fmoe__ds_line ln;
    int64_t n = 0;
    fmoe__ds_line_iter_init(&it, data, len);
    fmoe__ds_line_next(&it, &ln); /* header */
    while (fmoe__ds_line_next(&it, &ln)) n += !fmoe__ds_is_blank(ln.begin, ln.len);
    return n;
}

/* An integer field spanning [p, e) exactly. */
static int parse_i64(const char *p, const char *e, int64_t *out) {
    if (p == e) return -1;
    int neg = *p == '-';
    if (neg || *p == '+') p++;
    if (p == e) return -1;
    int64_t v = 0;
    for (; p < e; p++) {
        if (*p < '0' || *p > '9' || v > (INT64_MAX - 9) / 10) return -1;
        v = v * 10 + (*p - '0');
    }
    *out = neg ? -v : v;
    return 0;
}

/* One data row of layer l's file into d (row t). */
static int parse_row(dense *d, const char *path, const fmoe__ds_line *ln, int32_t l, int64_t t,
                     const char *first_path) {
    const char *p = ln->begin, *end = ln->begin + ln->len;
    const int32_t J = d->J, K = d->K;
    int64_t lineno = ln->number, v;
    const char *c = memchr(p, ',', (size_t)(end - p));
    if (!c || parse_i64(p, c, &v) < 0)
        return fmoe_error_set(FMOE_EFORMAT, "%s:%lld: layer_id is not an integer", path,
                              (long long)lineno);
    p = c + 1;
    c = memchr(p, ',', (size_t)(end - p));
    if (!c || parse_i64(p, c, &v) < 0)
        return fmoe_error_set(FMOE_EFORMAT, "%s:%lld: token_id is not an integer", path,
                              (long long)lineno);
    if (l == 0)
        d->token_col[t] = v;
    else if (d->token_col[t] != v)
        return fmoe_error_set(FMOE_EMISMATCH,
                              "%s:%lld: token_id %lld, but row %lld of %s has %lld (files not "
                              "row-aligned)",
                              path, (long long)lineno, (long long)v, (long long)t + 1,
                              first_path, (long long)d->token_col[t]);
    p = c + 1;
    int32_t nz = 0;
    for (int32_t j = 0; j < J; j++) {
        const char *fe = memchr(p, ',', (size_t)(end - p));
        if (!fe) fe = end;
        if ((j < J - 1 && fe == end) || (j == J - 1 && fe != end))
            return fmoe_error_set(FMOE_EFORMAT, "%s:%lld: expected %d expert columns", path,
                                  (long long)lineno, (int)J);
        char buf[64];
        size_t n = (size_t)(fe - p);
        if (n == 0 || n >= sizeof buf)
            return fmoe_error_set(FMOE_EFORMAT, "%s:%lld: expert_%d is not a number", path,
                                  (long long)lineno, (int)j);
        memcpy(buf, p, n);
        buf[n] = '\0';
        char *stop;
        double x = strtod(buf, &stop);
        if (*stop != '\0')
            return fmoe_error_set(FMOE_EFORMAT, "%s:%lld: expert_%d = '%s' is not a number",
                                  path, (long long)lineno, (int)j, buf);
        if (!isfinite(x) || x < 0 || !isfinite((float)x))
            return fmoe_error_set(FMOE_ERANGE,
                                  "%s:%lld: expert_%d = %s is not a finite non-negative number",
                                  path, (long long)lineno, (int)j, buf);
        d->row[j] = (float)x;
        if (d->row[j] != 0.0f) d->order[nz++] = j;
        p = fe + 1;
    }
    if (nz != K)
        return fmoe_error_set(FMOE_EFORMAT, "%s:%lld: %d non-zero probabilities, expected K = %d",
                              path, (long long)lineno, (int)nz, (int)K);
    FMOE_FORWARD_IF_ERROR(fmoe__ds_check_probs(d->row, J, 0, path, lineno, "expert_"));
    /* Gate order: decreasing probability, ties by expert id (insertion sort, K is small). */
    for (int32_t i = 1; i < nz; i++) {
        int32_t j = d->order[i], k = i;
        while (k > 0 && d->row[d->order[k - 1]] < d->row[j]) {
            d->order[k] = d->order[k - 1];
            k--;
        }
        d->order[k] = j;
    }
    uint16_t *ex = d->experts + ((size_t)t * d->L + l) * K;
    float *va = d->vals + ((size_t)t * d->L + l) * K;
    for (int32_t k = 0; k < K; k++) {
        ex[k] = (uint16_t)d->order[k];
        va[k] = d->row[d->order[k]];
    }
    return 0;
}

static int read_layer(dense *d, const char *path, int32_t l, const char *first_path,
                      const fmoe_import_options *opts, fmoe_import_report *rep) {
    char *base = NULL;
    const char *data;
    size_t len;
    FMOE_FORWARD_IF_ERROR(fmoe__ds_read_file(path, &base, &data, &len));
    int rc = 0;
    fmoe__ds_line_iter it;
    fmoe__ds_line ln = {"", 0, 1};
    fmoe__ds_line_iter_init(&it, data, len);
    fmoe__ds_line_next(&it, &ln);
    rc = check_header(path, &ln, d->J);
    if (rc < 0) goto done;
    int64_t rows = count_rows(data, len);
    if (l == 0) {
        if (rows == 0) {
            rc = fmoe_error_set(FMOE_EFORMAT, "%s: no data rows", path);
            goto done;
        }
        d->T = rows;
        size_t cells = (size_t)rows * d->L * d->K;
        d->experts = malloc(cells * sizeof *d->experts);
        d->vals = malloc(cells * sizeof *d->vals);
        d->token_col = malloc((size_t)rows * sizeof *d->token_col);
        if (!d->experts || !d->vals || !d->token_col) {
            rc = fmoe_error_set(FMOE_ENOMEM, "%s: cannot allocate %lld rows", path,
                                (long long)rows);
            goto done;
        }
    } else if (rows != d->T) {
        rc = fmoe_error_set(FMOE_EMISMATCH, "%s: %lld rows, but %s has %lld", path,
                            (long long)rows, first_path, (long long)d->T);
        goto done;
    }
    int64_t t = 0;
    while (fmoe__ds_line_next(&it, &ln)) {
        if (fmoe__ds_is_blank(ln.begin, ln.len)) continue;
        rc = parse_row(d, path, &ln, l, t, first_path);
        if (rc < 0) goto done;
        t++;
        rep->lines++;
        if ((t & 1023) == 0)
            fmoe_progress_report(&opts->progress, (int64_t)l * d->T + t, d->T * d->L, "rows");
    }
    fmoe_progress_report(&opts->progress, (int64_t)(l + 1) * d->T, d->T * d->L, "rows");
done:
    free(base);
    return rc;
}

/* "dir/first..last" for the trace's dataset attribute. */
static void dataset_name(const char *const *files, int n, char *buf, size_t cap) {
    const char *first = fmoe__ds_basename(files[0]), *last = fmoe__ds_basename(files[n - 1]);
    const char *slash = strrchr(files[0], '/');
    char dir[128] = "";
    if (slash) {
        const char *s = slash;
        while (s > files[0] && s[-1] != '/') s--;
        snprintf(dir, sizeof dir, "%.*s/", (int)(slash - s), s);
    }
    if (n == 1)
        snprintf(buf, cap, "%s%s", dir, first);
    else
        snprintf(buf, cap, "%s%s..%s", dir, first, last);
}

static int write_trace(const dense *d, int64_t per_request, const char *dataset,
                       const fmoe_import_options *opts, const char *out_path,
                       fmoe_import_report *rep) {
    const int32_t L = d->L, J = d->J, K = d->K;
    const int64_t T = d->T, n = per_request > 0 && per_request < T ? per_request : T;
    if (n > INT32_MAX)
        return fmoe_error_set(FMOE_ERANGE, "%lld tokens in one request (at most %d)",
                              (long long)n, INT32_MAX);
    fmoe_trace_header h;
    FMOE_FORWARD_IF_ERROR(
        fmoe__ds_import_header(opts, dataset, "import:dense-csv", FMOE_PROBS_TOPK, &h));
    int32_t *token_id = malloc((size_t)n * sizeof *token_id);
    uint8_t *phase = malloc((size_t)n);
    float *probs = malloc((size_t)n * L * J * sizeof *probs);
    fmoe_trace_writer *w = NULL;
    int rc = 0;
    if (!token_id || !phase || !probs) {
        rc = fmoe_error_set(FMOE_ENOMEM, "cannot allocate a request of %lld tokens",
                            (long long)n);
        goto fail;
    }
    for (int64_t t = 0; t < n; t++) {
        token_id[t] = -1;
        phase[t] = FMOE_PHASE_PREFILL;
    }
    /* An import leaves nothing behind on failure, so per-request flushes (which
     * recompress partly filled chunks) buy nothing: flush once, at close. */
    fmoe_trace_write_options write_opts = opts->write;
    if (write_opts.flush_requests == 0) write_opts.flush_requests = INT32_MAX;
    rc = fmoe_trace_writer_open(&w, out_path, &h, &write_opts);
    if (rc < 0) goto fail;
    int64_t id = 0;
    for (int64_t t0 = 0; t0 < T; t0 += n, id++) {
        int64_t c = T - t0 < n ? T - t0 : n;
        memset(probs, 0, (size_t)c * L * J * sizeof *probs);
        for (int64_t t = 0; t < c; t++)
            for (int32_t l = 0; l < L; l++) {
                size_t cell = ((size_t)(t0 + t) * L + l) * K;
                float *row = probs + ((size_t)t * L + l) * J;
                for (int32_t k = 0; k < K; k++) row[d->experts[cell + k]] = d->vals[cell + k];
            }
        fmoe_trace_request req = {
            .id = id,
            .prompt_tokens = (int32_t)c,
            .output_tokens = 0,
            .token_id = token_id,
            .phase = phase,
            .experts = d->experts + (size_t)t0 * L * K,
            .probs = probs,
        };
        rc = fmoe_trace_writer_append_request(w, &req);
        if (rc < 0) goto fail;
        rep->requests++;
        rep->tokens += c;
    }
    rc = fmoe_trace_writer_close(w);
    w = NULL;
    if (rc < 0) goto fail;
    free(token_id);
    free(phase);
    free(probs);
    return 0;
fail:
    fmoe_trace_writer_abort(w);
    free(token_id);
    free(phase);
    free(probs);
    return rc;
}

int fmoe_import_dense_csv(const char *const *layer_files, int num_files,
                          int64_t tokens_per_request, const fmoe_import_options *opts,
                          const char *out_path, fmoe_import_report *report) {
    fmoe_import_report rep = {.probs_kind = FMOE_PROBS_TOPK};
    if (report) *report = rep;
    FMOE_RETURN_ERROR_IF(!layer_files || num_files < 1 || !out_path, FMOE_EINVAL,
                         "import: no input files or output path");
    FMOE_RETURN_ERROR_IF(tokens_per_request < 0, FMOE_EINVAL,
                         "import: tokens per request %lld is negative",
                         (long long)tokens_per_request);
    FMOE_FORWARD_IF_ERROR(fmoe__ds_import_check_options(opts));
    const fmoe_model_geometry *g = opts->geometry;
    FMOE_RETURN_ERROR_IF(num_files != g->num_moe_layers, FMOE_EINVAL,
                         "import: %d layer files given, but the model has L = %d MoE layers",
                         num_files, (int)g->num_moe_layers);
    dense d = {.L = g->num_moe_layers, .J = g->num_experts, .K = g->top_k};
    d.row = malloc((size_t)d.J * sizeof *d.row);
    d.order = malloc((size_t)d.J * sizeof *d.order);
    int rc = 0;
    if (!d.row || !d.order) {
        rc = fmoe_error_set(FMOE_ENOMEM, "out of memory");
        goto done;
    }
    for (int32_t l = 0; l < d.L; l++) {
        rc = read_layer(&d, layer_files[l], l, layer_files[0], opts, &rep);
        if (rc < 0) goto done;
    }
    char dataset[256];
    dataset_name(layer_files, num_files, dataset, sizeof dataset);
    rc = write_trace(&d, tokens_per_request, dataset, opts, out_path, &rep);
done:
    free(d.experts);
    free(d.vals);
    free(d.token_col);
    free(d.row);
    free(d.order);
    if (report) *report = rep;
    return rc < 0 ? rc : 0;
}
