/*
 * trace_reader.c - opens and validates fmoe traces (docs/design.md §4, §7.1; contract in
 * fmoe/trace.h).
 *
 * Open reads the root attributes and the small per-request tables, checks every dataset's
 * type and shape against them, checks token_offset and /tokens/phase, and builds the
 * iteration list. Bulk token data is read later in ranges (read_tokens), and each range is
 * checked as it is read, so a damaged token anywhere is reported when it is reached
 * rather than trusted. Every message is "<file>: <dataset>: what, expected what".
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fmoe/error.h"
#include "half.h"
#include "fmoe/trace.h"
#include "hdf5_util.h"
#include "trace_impl.h"

struct fmoe_trace_reader {
    char *path;
    hid_t file;
    fmoe_trace_header header; /* config_json points at config_json below */
    char *config_json; /* owned; NULL when the file's is empty */
    int64_t *layer_expert_bytes; /* [L] owned; NULL when every layer's are expert_bytes */
    int64_t num_requests; /* R */
    int64_t num_tokens; /* T */
    fmoe_trace_request_info *requests; /* [R] */
    fmoe_trace_iteration *iterations; /* [num_iterations] */
    int64_t num_iterations;
    hid_t token_id, phase, experts; /* always present */
    hid_t probs, semantic, speculative, hidden; /* -1 when absent */
    hid_t half; /* binary16 memory type for half datasets */
    int probs_is_half, speculative_is_half, hidden_is_half;
};

/* ---------------------------------------------------------------------------------------
 * Small helpers
 * ------------------------------------------------------------------------------------- */

static const char *class_word(H5T_class_t c) {
    return c == H5T_INTEGER ? "an integer type" : c == H5T_FLOAT ? "a float type" : "?";
}

/* Opens a dataset and checks its element class (and, where size != 0, element size and
 * signedness for integers) and its shape against want[rank] (entries < 0: any). */
static hid_t open_checked(fmoe_trace_reader *r, const char *name, H5T_class_t cls, size_t size,
                          int is_signed, int rank, const int64_t *want, int64_t *got_dims) {
    const char *p = r->path;
    char tname[32], got[128], exp[128];
    hid_t d = fmoe__h5_dataset_open(r->file, p, name);
    if (d < 0) return d == FMOE_ENOTFOUND ? FMOE_EFORMAT : d;
    int rc = 0;
    hid_t type = H5Dget_type(d);
    hid_t space = H5Dget_space(d);
    if (type < 0 || space < 0) {
        rc = fmoe_error_set(FMOE_EFORMAT, "%s: %s: cannot read its type and shape", p, name);
        goto done;
    }
    if (H5Tget_class(type) != cls ||
        (size && (H5Tget_size(type) != size ||
                  (cls == H5T_INTEGER && (H5Tget_sign(type) != H5T_SGN_NONE) != is_signed)))) {
        if (size) {
            snprintf(exp, sizeof exp, "%s%zu",
                     cls == H5T_FLOAT ? "float"
                     : is_signed      ? "int"
                                      : "uint",
                     size * 8);
        } else {
            snprintf(exp, sizeof exp, "%s", class_word(cls));
        }
        rc = fmoe_error_set(FMOE_EFORMAT, "%s: %s has type %s, expected %s", p, name,
                            fmoe__h5_type_name(type, tname, sizeof tname), exp);
        goto done;
    }
    int n = H5Sget_simple_extent_ndims(space);
    hsize_t dims[8] = {0};
    if (n < 0 || n > 8 || H5Sget_simple_extent_dims(space, dims, NULL) < 0) {
        rc = fmoe_error_set(FMOE_EFORMAT, "%s: %s: cannot read its shape", p, name);
        goto done;
    }
    int64_t d64[8];
    for (int i = 0; i < n; i++) d64[i] = (int64_t)dims[i];
    int match = n == rank;
    for (int i = 0; match && i < rank; i++) match = want[i] < 0 || want[i] == d64[i];
    if (!match) {
        /* Show "T" for a free dimension so the message reads as the expected shape. */
        size_t at = 0;
        exp[0] = '\0';
        for (int i = 0; i < rank && at < sizeof exp; i++) {
            int w = want[i] < 0 ? snprintf(exp + at, sizeof exp - at, "%sT", i ? "," : "[")
                                : snprintf(exp + at, sizeof exp - at, "%s%lld", i ? "," : "[",
                                           (long long)want[i]);
            if (w < 0) break;
            at += (size_t)w;
        }
        if (at < sizeof exp) snprintf(exp + at, sizeof exp - at, "]");
        rc = fmoe_error_set(FMOE_EFORMAT, "%s: %s has shape %s, expected %s", p, name,
                            fmoe__dims_str(got, sizeof got, n, d64), exp);
        goto done;
    }
    if ((rc = fmoe__h5_check_stored(d, p, name)) < 0) goto done;
    if (got_dims)
        for (int i = 0; i < n; i++) got_dims[i] = d64[i];
done:
    if (space >= 0) H5Sclose(space);
    if (type >= 0) H5Tclose(type);
    if (rc < 0) {
        H5Dclose(d);
        return rc;
    }
    return d;
}

/* Reads a whole 1-D integer or float table of n rows. */
static int read_table(fmoe_trace_reader *r, const char *name, H5T_class_t cls, int64_t n, hid_t mem,
                      void *out) {
    const int64_t want[1] = {n};
    hid_t d = open_checked(r, name, cls, 0, 0, 1, want, NULL);
    if (d < 0) return (int)d;
    int rc = fmoe__h5_dataset_read_rows(d, r->path, name, mem, 0, (hsize_t)n, out);
    H5Dclose(d);
    return rc;
}

/* ---------------------------------------------------------------------------------------
 * Open: attributes
 * ------------------------------------------------------------------------------------- */

static int read_int_attr(fmoe_trace_reader *r, const char *name, int64_t lo, int64_t hi,
                         int64_t *out) {
    return fmoe__h5_root_attr_int(r->file, r->path, name, lo, hi, out);
}

/* An attribute added after version 1 was first written: absent means 0. */
static int read_optional_i32_attr(fmoe_trace_reader *r, const char *name, int64_t hi,
                                  int32_t *out) {
    int64_t v = 0;
    int rc = fmoe__h5_attr_read_int(r->file, r->path, "/", name, &v);
    if (rc == FMOE_ENOTFOUND) {
        fmoe_error_clear();
        *out = 0;
        return 0;
    }
    if (rc < 0) return rc;
    FMOE_RETURN_ERROR_IF(v < 0 || v > hi, FMOE_EFORMAT,
                         "%s: /: attribute %s = %lld, expected 0..%lld", r->path, name,
                         (long long)v, (long long)hi);
    *out = (int32_t)v;
    return 0;
}

static int read_i32_attr(fmoe_trace_reader *r, const char *name, int32_t *out) {
    int64_t v = 0;
    FMOE_FORWARD_IF_ERROR(read_int_attr(r, name, INT32_MIN, INT32_MAX, &v));
    *out = (int32_t)v;
    return 0;
}

static int read_str_attr(fmoe_trace_reader *r, const char *name, char *out, size_t cap) {
    return fmoe__h5_root_attr_str(r->file, r->path, name, out, cap);
}

static int read_header(fmoe_trace_reader *r) {
    fmoe_trace_header *h = &r->header;
    const char *p = r->path;
    FMOE_FORWARD_IF_ERROR(fmoe__h5_check_format(r->file, p, "trace", FMOE_TRACE_FORMAT,
                                                FMOE_TRACE_VERSION, "fmoe-store",
                                                " (this is an expert-map store, not a trace)"));

    FMOE_FORWARD_IF_ERROR(read_str_attr(r, "model_name", h->model_name, sizeof h->model_name));
    FMOE_FORWARD_IF_ERROR(
        read_str_attr(r, "model_fingerprint", h->model_fingerprint, sizeof h->model_fingerprint));
    FMOE_FORWARD_IF_ERROR(read_i32_attr(r, "num_layers", &h->num_layers));
    FMOE_FORWARD_IF_ERROR(read_i32_attr(r, "num_experts", &h->num_experts));
    FMOE_FORWARD_IF_ERROR(read_i32_attr(r, "top_k", &h->top_k));
    FMOE_FORWARD_IF_ERROR(read_i32_attr(r, "hidden_size", &h->hidden_size));
    FMOE_FORWARD_IF_ERROR(read_i32_attr(r, "shared_experts", &h->shared_experts));
    FMOE_FORWARD_IF_ERROR(read_int_attr(r, "expert_bytes", 0, INT64_MAX, &h->expert_bytes));
    FMOE_FORWARD_IF_ERROR(read_str_attr(r, "dtype", h->dtype, sizeof h->dtype));
    FMOE_FORWARD_IF_ERROR(read_str_attr(r, "dataset", h->dataset, sizeof h->dataset));
    FMOE_FORWARD_IF_ERROR(read_str_attr(r, "created", h->created, sizeof h->created));
    FMOE_FORWARD_IF_ERROR(
        read_str_attr(r, "fmoe_version", h->fmoe_version, sizeof h->fmoe_version));
    FMOE_FORWARD_IF_ERROR(read_str_attr(r, "recorded_on", h->recorded_on, sizeof h->recorded_on));
    char kind[32];
    FMOE_FORWARD_IF_ERROR(read_str_attr(r, "probs_kind", kind, sizeof kind));
    FMOE_RETURN_ERROR_IF(fmoe__probs_kind_parse(kind, &h->probs_kind) < 0, FMOE_EFORMAT,
                         "%s: /: attribute probs_kind = '%s', expected none, topk or full", p,
                         kind);
    FMOE_FORWARD_IF_ERROR(read_i32_attr(r, "semantic_dim", &h->semantic_dim));
    FMOE_FORWARD_IF_ERROR(
        read_str_attr(r, "semantic_kind", h->semantic_kind, sizeof h->semantic_kind));
    FMOE_FORWARD_IF_ERROR(read_i32_attr(r, "speculative_depth", &h->speculative_depth));
    /* Optional parts written by fmoe record (/tokens/hidden, /timing). */
    FMOE_FORWARD_IF_ERROR(
        read_optional_i32_attr(r, "hidden_dim", FMOE_TRACE_MAX_SEMANTIC, &h->hidden_dim));
    FMOE_FORWARD_IF_ERROR(
        read_optional_i32_attr(r, "timing_layers", FMOE_TRACE_MAX_LAYERS, &h->timing_layers));
    FMOE_FORWARD_IF_ERROR(read_optional_i32_attr(r, "prefill_chunk", 1 << 20, &h->prefill_chunk));
    FMOE_FORWARD_IF_ERROR(read_optional_i32_attr(r, "offload_cache_experts", INT32_MAX,
                                                 &h->offload_cache_experts));
    if (h->offload_cache_experts > 0)
        FMOE_FORWARD_IF_ERROR(
            read_str_attr(r, "offload_policy", h->offload_policy, sizeof h->offload_policy));
    FMOE_FORWARD_IF_ERROR(read_optional_i32_attr(r, "served", 1, &h->served));
    /* absent from imports and from traces written before it: "" (not known) */
    int rc = fmoe__h5_attr_read_str(r->file, p, "/", "activations", h->activations,
                                    sizeof h->activations);
    if (rc == FMOE_ENOTFOUND) {
        fmoe_error_clear();
        h->activations[0] = '\0';
    } else if (rc < 0) {
        return rc;
    }
    h->probs_half = 0; /* set from /tokens/probs' type below */
    return fmoe__trace_header_check(h, p, FMOE_EFORMAT, 1);
}

/* ---------------------------------------------------------------------------------------
 * Open: datasets, request table, iterations
 * ------------------------------------------------------------------------------------- */

/* A dataset the header says is there or not: opened and checked (open_checked) into *out
 * when `present`, else refused if it exists (*out = -1). */
static int open_if_present(fmoe_trace_reader *r, const char *name, int present,
                           H5T_class_t cls, int rank, const int64_t *want, hid_t *out) {
    *out = -1;
    int ex = fmoe__h5_exists(r->file, r->path, name);
    if (ex < 0) return ex;
    if (!present) {
        FMOE_RETURN_ERROR_IF(ex > 0, FMOE_EFORMAT,
                             "%s: %s exists, expected none (the header says it is absent)", r->path,
                             name);
        return 0;
    }
    FMOE_RETURN_ERROR_IF(ex == 0, FMOE_EFORMAT, "%s: %s is missing", r->path, name);
    hid_t d = open_checked(r, name, cls, 0, 0, rank, want, NULL);
    if (d < 0) return (int)d;
    *out = d;
    return 0;
}

/* Opens a gate dataset ([T,L,J] or [T,L,S,J], float16 or float32) when `present`, and
 * refuses one that exists when it should not. */
static int open_gate(fmoe_trace_reader *r, const char *name, int present, int rank,
                     const int64_t *want, hid_t *out, int *is_half) {
    hid_t d;
    FMOE_FORWARD_IF_ERROR(open_if_present(r, name, present, H5T_FLOAT, rank, want, &d));
    if (d < 0) return 0; /* absent, as the header says */
    hid_t type = H5Dget_type(d);
    size_t size = type >= 0 ? H5Tget_size(type) : 0;
    int half = type >= 0 && fmoe__h5_is_half(type);
    if (type >= 0) H5Tclose(type);
    if (size != 4 && !half) {
        H5Dclose(d);
        return fmoe_error_set(FMOE_EFORMAT,
                              "%s: %s has a %zu-byte float type, expected float16 or float32",
                              r->path, name, size);
    }
    *out = d;
    *is_half = half;
    return 0;
}

static int open_datasets(fmoe_trace_reader *r) {
    const fmoe_trace_header *h = &r->header;
    const int64_t L = h->num_layers, J = h->num_experts, K = h->top_k, S = h->speculative_depth,
                  H = h->semantic_dim;
    int64_t dims[1];
    const int64_t any[1] = {-1};
    r->token_id = open_checked(r, "/tokens/token_id", H5T_INTEGER, 4, 1, 1, any, dims);
    if (r->token_id < 0) return (int)r->token_id;
    const int64_t T = r->num_tokens = dims[0];
    const int64_t w_t[1] = {T}, w_e[3] = {T, L, K}, w_p[3] = {T, L, J}, w_s[2] = {T, H},
                  w_x[4] = {T, L, S, J};
    r->phase = open_checked(r, "/tokens/phase", H5T_INTEGER, 1, 0, 1, w_t, NULL);
    if (r->phase < 0) return (int)r->phase;
    r->experts = open_checked(r, "/tokens/experts", H5T_INTEGER, 2, 0, 3, w_e, NULL);
    if (r->experts < 0) return (int)r->experts;
    FMOE_FORWARD_IF_ERROR(open_gate(r, "/tokens/probs", h->probs_kind != FMOE_PROBS_NONE, 3, w_p,
                                    &r->probs, &r->probs_is_half));
    r->header.probs_half = r->probs >= 0 && r->probs_is_half;
    int ex = fmoe__h5_exists(r->file, r->path, "/tokens/semantic");
    if (ex < 0) return ex;
    if (H > 0) {
        r->semantic = open_checked(r, "/tokens/semantic", H5T_FLOAT, 4, 0, 2, w_s, NULL);
        if (r->semantic < 0) return (int)r->semantic;
    } else {
        FMOE_RETURN_ERROR_IF(ex != 0, FMOE_EFORMAT,
                             "%s: /tokens/semantic exists, expected none (semantic_dim is 0)",
                             r->path);
    }
    FMOE_FORWARD_IF_ERROR(open_gate(r, "/tokens/speculative", S > 0, 4, w_x, &r->speculative,
                                    &r->speculative_is_half));
    const int64_t w_h[3] = {T, L, h->hidden_dim};
    return open_gate(r, "/tokens/hidden", h->hidden_dim > 0, 3, w_h, &r->hidden,
                     &r->hidden_is_half);
}

static int read_requests(fmoe_trace_reader *r) {
    const char *p = r->path;
    int64_t dims[1];
    const int64_t any[1] = {-1};
    hid_t d = open_checked(r, "/requests/id", H5T_INTEGER, 0, 0, 1, any, dims);
    if (d < 0) return (int)d;
    H5Dclose(d);
    const int64_t R = r->num_requests = dims[0];
    const int64_t T = r->num_tokens;

    int rc = 0;
    int64_t *id = malloc((size_t)(R ? R : 1) * sizeof *id);
    double *arrival = malloc((size_t)(R ? R : 1) * sizeof *arrival);
    int64_t *prompt = malloc((size_t)(R ? R : 1) * sizeof *prompt);
    int64_t *output = malloc((size_t)(R ? R : 1) * sizeof *output);
    int64_t *off = malloc((size_t)(R + 1) * sizeof *off);
    r->requests = calloc((size_t)(R ? R : 1), sizeof *r->requests);
    if (!id || !arrival || !prompt || !output || !off || !r->requests) {
        rc = fmoe_error_set(FMOE_ENOMEM, "%s: out of memory for %lld requests", p, (long long)R);
        goto done;
    }
    /* Integer tables are read as int64 whatever their stored width, so a table written by
     * another tool with numpy's default int64 reads, and every value is range-checked. */
    if ((rc = read_table(r, "/requests/id", H5T_INTEGER, R, H5T_NATIVE_INT64, id)) < 0 ||
        (rc = read_table(r, "/requests/arrival_s", H5T_FLOAT, R, H5T_NATIVE_DOUBLE, arrival)) < 0 ||
        (rc = read_table(r, "/requests/prompt_tokens", H5T_INTEGER, R, H5T_NATIVE_INT64, prompt)) <
            0 ||
        (rc = read_table(r, "/requests/output_tokens", H5T_INTEGER, R, H5T_NATIVE_INT64, output)) <
            0 ||
        (rc = read_table(r, "/requests/token_offset", H5T_INTEGER, R + 1, H5T_NATIVE_INT64, off)) <
            0)
        goto done;

    if (off[0] != 0) {
        rc = fmoe_error_set(FMOE_EFORMAT, "%s: /requests/token_offset[0] = %lld, expected 0", p,
                            (long long)off[0]);
        goto done;
    }
    for (int64_t i = 0; i < R; i++) {
        if (off[i + 1] < off[i]) {
            rc = fmoe_error_set(FMOE_EFORMAT,
                                "%s: /requests/token_offset[%lld] = %lld, expected >= "
                                "token_offset[%lld] = %lld (offsets must not decrease)",
                                p, (long long)(i + 1), (long long)off[i + 1], (long long)i,
                                (long long)off[i]);
            goto done;
        }
        if (prompt[i] < 0 || prompt[i] > INT32_MAX || output[i] < 0 || output[i] > INT32_MAX) {
            rc = fmoe_error_set(FMOE_EFORMAT,
                                "%s: /requests: request %lld has prompt_tokens %lld and "
                                "output_tokens %lld, expected 0..%d",
                                p, (long long)i, (long long)prompt[i], (long long)output[i],
                                INT32_MAX);
            goto done;
        }
        if (prompt[i] + output[i] != off[i + 1] - off[i]) {
            rc = fmoe_error_set(FMOE_EFORMAT,
                                "%s: /requests/token_offset: request %lld owns %lld tokens, "
                                "expected prompt_tokens + output_tokens = %lld",
                                p, (long long)i, (long long)(off[i + 1] - off[i]),
                                (long long)(prompt[i] + output[i]));
            goto done;
        }
        if (!isfinite(arrival[i]) || arrival[i] < 0) {
            rc = fmoe_error_set(FMOE_EFORMAT,
                                "%s: /requests/arrival_s[%lld] = %g, expected a finite time >= 0",
                                p, (long long)i, arrival[i]);
            goto done;
        }
        r->requests[i] = (fmoe_trace_request_info){
            .id = id[i],
            .arrival_s = arrival[i],
            .prompt_tokens = (int32_t)prompt[i],
            .output_tokens = (int32_t)output[i],
            .token_begin = off[i],
            .token_count = off[i + 1] - off[i],
        };
    }
    if (off[R] != T) {
        rc = fmoe_error_set(FMOE_EFORMAT,
                            "%s: /requests/token_offset ends at %lld, expected %lld (the "
                            "length of /tokens/token_id)",
                            p, (long long)off[R], (long long)T);
        goto done;
    }
done:
    free(off);
    free(output);
    free(prompt);
    free(arrival);
    free(id);
    return rc;
}

/* Reads /tokens/phase whole (one byte a token), checks it against prompt_tokens and builds
 * the iteration list: per request one prefill iteration holding its prompt tokens, then
 * one iteration per decode token (docs/design.md §7.1). */
static int build_iterations(fmoe_trace_reader *r) {
    const char *p = r->path;
    const int64_t T = r->num_tokens, R = r->num_requests;
    int rc = 0;
    uint8_t *phase = malloc((size_t)(T ? T : 1));
    if (!phase)
        return fmoe_error_set(FMOE_ENOMEM, "%s: out of memory for %lld tokens", p, (long long)T);
    if ((rc = fmoe__h5_dataset_read_rows(r->phase, p, "/tokens/phase", H5T_NATIVE_UINT8, 0,
                                         (hsize_t)T, phase)) < 0)
        goto done;
    int64_t n = 0;
    for (int64_t i = 0; i < R; i++) {
        const fmoe_trace_request_info *q = &r->requests[i];
        n += fmoe_trace_request_iterations(q->prompt_tokens, q->output_tokens,
                                           r->header.prefill_chunk);
    }
    r->iterations = malloc((size_t)(n ? n : 1) * sizeof *r->iterations);
    if (!r->iterations) {
        rc = fmoe_error_set(FMOE_ENOMEM, "%s: out of memory for %lld iterations", p, (long long)n);
        goto done;
    }
    int64_t at = 0;
    for (int64_t i = 0; i < R; i++) {
        const fmoe_trace_request_info *q = &r->requests[i];
        for (int64_t t = 0; t < q->token_count; t++) {
            const uint8_t want = t < q->prompt_tokens ? FMOE_PHASE_PREFILL : FMOE_PHASE_DECODE;
            const uint8_t got = phase[q->token_begin + t];
            if (got != want) {
                rc = fmoe_error_set(FMOE_EFORMAT,
                                    "%s: /tokens/phase[%lld] = %u (request %lld, token %lld), "
                                    "expected %u: a request's first prompt_tokens (%d) tokens "
                                    "are prefill (0), the rest decode (1)",
                                    p, (long long)(q->token_begin + t), got, (long long)i,
                                    (long long)t, want, q->prompt_tokens);
                goto done;
            }
        }
        const int32_t chunk = r->header.prefill_chunk > 0 ? r->header.prefill_chunk
                                                          : q->prompt_tokens;
        for (int32_t t = 0; t < q->prompt_tokens; t += chunk)
            r->iterations[at++] = (fmoe_trace_iteration){
                .request = i,
                .phase = FMOE_PHASE_PREFILL,
                .num_tokens = q->prompt_tokens - t < chunk ? q->prompt_tokens - t : chunk,
                .token_begin = q->token_begin + t,
            };
        for (int64_t t = q->prompt_tokens; t < q->token_count; t++)
            r->iterations[at++] = (fmoe_trace_iteration){
                .request = i,
                .phase = FMOE_PHASE_DECODE,
                .num_tokens = 1,
                .token_begin = q->token_begin + t,
            };
    }
    r->num_iterations = at;
done:
    free(phase);
    return rc;
}

/* ---------------------------------------------------------------------------------------
 * Open and close
 * ------------------------------------------------------------------------------------- */

static void reader_close(fmoe_trace_reader *r) {
    if (!r) return;
    hid_t *ds[] = {&r->token_id, &r->phase,       &r->experts,
                   &r->probs,    &r->semantic,    &r->speculative, &r->hidden};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++)
        if (*ds[i] >= 0) H5Dclose(*ds[i]);
    if (r->half >= 0) H5Tclose(r->half);
    if (r->file >= 0) H5Fclose(r->file);
    free(r->iterations);
    free(r->requests);
    free(r->config_json);
    free(r->layer_expert_bytes);
    free(r->path);
    free(r);
}

static int open_file(fmoe_trace_reader *r, const void *image, size_t size) {
    r->file = fmoe__h5_open_read(r->path, image, size, "trace");
    return r->file < 0 ? (int)r->file : 0;
}

/* Checks the shapes of the optional datasets fmoe record writes (not read by the replay):
 * /tokens/hidden [T,L,hidden_dim] and /timing/{layer_s [I,timing_layers], iteration_s [I]},
 * I = the iterations in replay order. Present exactly when the header says so. */
static int check_optional(fmoe_trace_reader *r, const char *name, int present,
                          H5T_class_t cls, int rank, const int64_t *want) {
    hid_t d;
    FMOE_FORWARD_IF_ERROR(open_if_present(r, name, present, cls, rank, want, &d));
    if (d >= 0) H5Dclose(d);
    return 0;
}

static int check_optional_datasets(fmoe_trace_reader *r) {
    const fmoe_trace_header *h = &r->header;
    const int64_t layer_s[2] = {r->num_iterations, h->timing_layers};
    const int64_t iteration_s[1] = {r->num_iterations};
    const int64_t outcomes[1] = {-1}; /* one per access: as many as the replay resolves */
    FMOE_FORWARD_IF_ERROR(
        check_optional(r, "/timing/layer_s", h->timing_layers > 0, H5T_FLOAT, 2, layer_s));
    FMOE_FORWARD_IF_ERROR(check_optional(r, "/timing/iteration_s", h->timing_layers > 0,
                                         H5T_FLOAT, 1, iteration_s));
    const int64_t per_token[1] = {r->num_tokens};
    FMOE_FORWARD_IF_ERROR(check_optional(r, "/tokens/served_iteration", h->served > 0,
                                         H5T_INTEGER, 1, per_token));
    FMOE_FORWARD_IF_ERROR(
        check_optional(r, "/tokens/served_s", h->served > 0, H5T_FLOAT, 1, per_token));
    return check_optional(r, "/timing/access_outcome", h->offload_cache_experts > 0,
                          H5T_INTEGER, 1, outcomes);
}

/* /model/layer_expert_bytes [L], where a model's layers' experts differ in size: each in
 * 1..expert_bytes (fmoe/trace.h). Absent: a uniform model, header pointer NULL. */
static int read_layer_expert_bytes(fmoe_trace_reader *r) {
    const char *p = r->path, *name = "/model/layer_expert_bytes";
    const fmoe_trace_header *h = &r->header;
    const int ex = fmoe__h5_exists(r->file, p, name);
    if (ex <= 0) return ex;
    const int64_t want[1] = {h->num_layers};
    hid_t d = open_checked(r, name, H5T_INTEGER, 0, 0, 1, want, NULL);
    if (d < 0) return (int)d;
    r->layer_expert_bytes = malloc((size_t)h->num_layers * sizeof *r->layer_expert_bytes);
    int rc = r->layer_expert_bytes
                 ? fmoe__h5_dataset_read_rows(d, p, name, H5T_NATIVE_INT64, 0,
                                              (hsize_t)h->num_layers, r->layer_expert_bytes)
                 : fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", p);
    H5Dclose(d);
    for (int32_t l = 0; rc == 0 && l < h->num_layers; l++)
        if (r->layer_expert_bytes[l] < 1 || r->layer_expert_bytes[l] > h->expert_bytes)
            rc = fmoe_error_set(FMOE_EFORMAT, "%s: %s: layer %d has %lld bytes, expected "
                                "1..expert_bytes (%lld)", p, name, l,
                                (long long)r->layer_expert_bytes[l], (long long)h->expert_bytes);
    if (rc == 0) r->header.layer_expert_bytes = r->layer_expert_bytes;
    return rc;
}

static int reader_open(fmoe_trace_reader **out, const char *path, const void *image,
                       size_t size) {
    if (!out || !path) return fmoe_error_set(FMOE_EINVAL, "fmoe_trace_reader_open: NULL argument");
    *out = NULL;
    FMOE_FORWARD_IF_ERROR(fmoe__h5_init());
    fmoe_trace_reader *r = calloc(1, sizeof *r);
    if (!r) return fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", path);
    r->file = r->token_id = r->phase = r->experts = -1;
    r->probs = r->semantic = r->speculative = r->hidden = r->half = -1;
    int rc = 0;
    if (!(r->path = strdup(path))) {
        rc = fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    if ((rc = open_file(r, image, size)) < 0 || (rc = read_header(r)) < 0) goto fail;
    rc = fmoe__h5_dataset_read_str(r->file, path, "/model/config_json", &r->config_json);
    if (rc == FMOE_ENOTFOUND) rc = FMOE_EFORMAT;
    if (rc < 0) goto fail;
    if (!r->config_json[0]) {
        free(r->config_json);
        r->config_json = NULL;
    }
    r->header.config_json = r->config_json;
    if ((rc = read_layer_expert_bytes(r)) < 0) goto fail;
    if ((rc = open_datasets(r)) < 0 || (rc = read_requests(r)) < 0 ||
        (rc = build_iterations(r)) < 0 || (rc = check_optional_datasets(r)) < 0)
        goto fail;
    r->half = fmoe__h5_half_type();
    if (r->half < 0) {
        rc = fmoe_error_set(FMOE_EINTERNAL, "%s: cannot build the float16 type", path);
        goto fail;
    }
    *out = r;
    return 0;
fail:
    reader_close(r);
    return rc;
}

const fmoe_trace_header *fmoe_trace_reader_header(const fmoe_trace_reader *r) { return &r->header; }
int64_t fmoe_trace_reader_num_requests(const fmoe_trace_reader *r) { return r->num_requests; }
int64_t fmoe_trace_reader_num_tokens(const fmoe_trace_reader *r) { return r->num_tokens; }
const fmoe_trace_request_info *fmoe_trace_reader_requests(const fmoe_trace_reader *r) {
    return r->requests;
}
const fmoe_trace_iteration *fmoe_trace_reader_iterations(const fmoe_trace_reader *r,
                                                         int64_t *num_iterations) {
    if (num_iterations) *num_iterations = r->num_iterations;
    return r->iterations;
}

/* ---------------------------------------------------------------------------------------
 * Token ranges
 * ------------------------------------------------------------------------------------- */

/* Reads gate values [t0, t0+n) x per_token into dst as float32. A binary16 dataset is read
 * into the upper half of dst itself and widened in place, front to back: element i's
 * float lands in bytes [4i, 4i+4), which never reach the halves not yet converted (they
 * start at byte 2*count + 2*(i+1)), so no scratch buffer is needed. */
int fmoe_trace_reader_check_hidden(const fmoe_trace_reader *r) {
    FMOE_RETURN_ERROR_IF(r->hidden < 0, FMOE_ENOTFOUND,
                         "%s has no hidden states (/tokens/hidden): record the trace with "
                         "'fmoe record --hidden'",
                         r->path);
    return 0;
}

static int read_gate(fmoe_trace_reader *r, hid_t d, int is_half, const char *name, int64_t t0,
                     int64_t n, size_t per_token, float *dst) {
    if (!is_half)
        return fmoe__h5_dataset_read_rows(d, r->path, name, H5T_NATIVE_FLOAT, (hsize_t)t0,
                                          (hsize_t)n, dst);
    const size_t count = (size_t)n * per_token;
    unsigned char *bytes = (unsigned char *)dst;
    unsigned char *halves = bytes + 2 * count;
    FMOE_FORWARD_IF_ERROR(
        fmoe__h5_dataset_read_rows(d, r->path, name, r->half, (hsize_t)t0, (hsize_t)n, halves));
    for (size_t i = 0; i < count; i++) {
        uint16_t hv;
        memcpy(&hv, halves + 2 * i, sizeof hv);
        dst[i] = fmoe_half_to_float(hv);
    }
    return 0;
}

static int check_gate(const fmoe_trace_reader *r, const char *name, const float *v, int64_t t0,
                      int64_t n, size_t per_token) {
    const size_t count = (size_t)n * per_token;
    for (size_t i = 0; i < count; i++) {
        const float x = v[i];
        if (isfinite(x) && x >= -FMOE_TRACE_PROB_TOL && x <= 1.0f + FMOE_TRACE_PROB_TOL) continue;
        return fmoe_error_set(FMOE_EFORMAT,
                              "%s: %s: token %lld holds %g at element %zu, expected a "
                              "probability in [0, 1]",
                              r->path, name, (long long)(t0 + (int64_t)(i / per_token)), (double)x,
                              i % per_token);
    }
    return 0;
}

/* Reads rows of a dataset the reader does not keep open (rarely read ones). */
static int read_rows_once(fmoe_trace_reader *r, const char *name, hid_t mem, hsize_t row0,
                          hsize_t rows, void *out) {
    hid_t d = fmoe__h5_dataset_open(r->file, r->path, name);
    if (d < 0) return d == FMOE_ENOTFOUND ? FMOE_EFORMAT : (int)d;
    const int rc = fmoe__h5_dataset_read_rows(d, r->path, name, mem, row0, rows, out);
    H5Dclose(d);
    return rc;
}

static int read_tokens(fmoe_trace_reader *r, int64_t t0, int64_t n,
                       const fmoe_trace_token_buffers *buf) {
    if (!r || !buf)
        return fmoe_error_set(FMOE_EINVAL, "fmoe_trace_reader_read_tokens: NULL argument");
    const char *p = r->path;
    FMOE_RETURN_ERROR_IF(t0 < 0 || n < 0 || t0 > r->num_tokens || n > r->num_tokens - t0,
                         FMOE_ERANGE, "%s: tokens [%lld, %lld) requested, the trace has %lld", p,
                         (long long)t0, (long long)(t0 + n), (long long)r->num_tokens);
    if (n == 0) return 0;
    const fmoe_trace_header *h = &r->header;
    const size_t L = (size_t)h->num_layers, J = (size_t)h->num_experts, K = (size_t)h->top_k,
                 S = (size_t)h->speculative_depth, H = (size_t)h->semantic_dim;
    const hsize_t row0 = (hsize_t)t0, rows = (hsize_t)n;

    if (buf->token_id) {
        FMOE_FORWARD_IF_ERROR(fmoe__h5_dataset_read_rows(
            r->token_id, p, "/tokens/token_id", H5T_NATIVE_INT32, row0, rows, buf->token_id));
        for (int64_t i = 0; i < n; i++)
            FMOE_RETURN_ERROR_IF(buf->token_id[i] < -1, FMOE_EFORMAT,
                                 "%s: /tokens/token_id: token %lld has id %d, expected >= -1", p,
                                 (long long)(t0 + i), buf->token_id[i]);
    }
    if (buf->phase) {
        FMOE_FORWARD_IF_ERROR(fmoe__h5_dataset_read_rows(r->phase, p, "/tokens/phase",
                                                         H5T_NATIVE_UINT8, row0, rows, buf->phase));
        for (int64_t i = 0; i < n; i++)
            FMOE_RETURN_ERROR_IF(buf->phase[i] > FMOE_PHASE_DECODE, FMOE_EFORMAT,
                                 "%s: /tokens/phase: token %lld has phase %u, expected 0 or 1", p,
                                 (long long)(t0 + i), buf->phase[i]);
    }
    if (buf->experts) {
        FMOE_FORWARD_IF_ERROR(fmoe__h5_dataset_read_rows(
            r->experts, p, "/tokens/experts", H5T_NATIVE_UINT16, row0, rows, buf->experts));
        for (size_t i = 0; i < (size_t)n * L; i++) {
            const uint16_t *row = buf->experts + i * K;
            for (size_t k = 0; k < K; k++)
                FMOE_RETURN_ERROR_IF(row[k] >= J, FMOE_EFORMAT,
                                     "%s: /tokens/experts: token %lld layer %zu has expert %u, "
                                     "expected < num_experts (%zu)",
                                     p, (long long)(t0 + (int64_t)(i / L)), i % L, row[k], J);
            FMOE_RETURN_ERROR_IF(!fmoe__experts_distinct(row, (int32_t)K), FMOE_EFORMAT,
                                 "%s: /tokens/experts: token %lld layer %zu repeats an expert, "
                                 "expected %zu distinct ids",
                                 p, (long long)(t0 + (int64_t)(i / L)), i % L, K);
        }
    }
    if (buf->probs) {
        FMOE_RETURN_ERROR_IF(r->probs < 0, FMOE_EINVAL,
                             "%s: /tokens/probs: requested, but the trace has none (probs_kind "
                             "none)",
                             p);
        FMOE_FORWARD_IF_ERROR(
            read_gate(r, r->probs, r->probs_is_half, "/tokens/probs", t0, n, L * J, buf->probs));
        FMOE_FORWARD_IF_ERROR(check_gate(r, "/tokens/probs", buf->probs, t0, n, L * J));
    }
    if (buf->semantic) {
        FMOE_RETURN_ERROR_IF(r->semantic < 0, FMOE_EINVAL,
                             "%s: /tokens/semantic: requested, but the trace has none "
                             "(semantic_dim 0)",
                             p);
        FMOE_FORWARD_IF_ERROR(fmoe__h5_dataset_read_rows(
            r->semantic, p, "/tokens/semantic", H5T_NATIVE_FLOAT, row0, rows, buf->semantic));
        for (size_t i = 0; i < (size_t)n * H; i++)
            FMOE_RETURN_ERROR_IF(!isfinite(buf->semantic[i]), FMOE_EFORMAT,
                                 "%s: /tokens/semantic: token %lld column %zu is %g, expected "
                                 "a finite value",
                                 p, (long long)(t0 + (int64_t)(i / H)), i % H,
                                 (double)buf->semantic[i]);
    }
    if (buf->speculative) {
        FMOE_RETURN_ERROR_IF(r->speculative < 0, FMOE_EINVAL,
                             "%s: /tokens/speculative: requested, but the trace has none "
                             "(speculative_depth 0)",
                             p);
        FMOE_FORWARD_IF_ERROR(read_gate(r, r->speculative, r->speculative_is_half,
                                        "/tokens/speculative", t0, n, L * S * J, buf->speculative));
        FMOE_FORWARD_IF_ERROR(
            check_gate(r, "/tokens/speculative", buf->speculative, t0, n, L * S * J));
    }
    if (buf->hidden) {
        FMOE_FORWARD_IF_ERROR(fmoe_trace_reader_check_hidden(r));
        const size_t per_token = L * (size_t)h->hidden_dim;
        FMOE_FORWARD_IF_ERROR(read_gate(r, r->hidden, r->hidden_is_half, "/tokens/hidden", t0, n,
                                        per_token, buf->hidden));
        for (size_t i = 0; i < (size_t)n * per_token; i++)
            FMOE_RETURN_ERROR_IF(!isfinite(buf->hidden[i]), FMOE_EFORMAT,
                                 "%s: /tokens/hidden: token %lld element %zu is %g, expected a "
                                 "finite value",
                                 p, (long long)(t0 + (int64_t)(i / per_token)), i % per_token,
                                 (double)buf->hidden[i]);
    }
    if (buf->served_iteration) { /* rarely read: opened for the call */
        FMOE_RETURN_ERROR_IF(!h->served, FMOE_EINVAL,
                             "%s: no /tokens/served_iteration: not a trace of fmoe serve", p);
        hid_t d = fmoe__h5_dataset_open(r->file, p, "/tokens/served_iteration");
        if (d < 0) return d == FMOE_ENOTFOUND ? FMOE_EFORMAT : (int)d;
        const int rc = fmoe__h5_dataset_read_rows(d, p, "/tokens/served_iteration",
                                                  H5T_NATIVE_INT64, row0, rows,
                                                  buf->served_iteration);
        H5Dclose(d);
        FMOE_FORWARD_IF_ERROR(rc);
        for (int64_t i = 0; i < n; i++)
            FMOE_RETURN_ERROR_IF(buf->served_iteration[i] < 0, FMOE_EFORMAT,
                                 "%s: /tokens/served_iteration: token %lld ran in pass %lld, "
                                 "expected >= 0",
                                 p, (long long)(t0 + i), (long long)buf->served_iteration[i]);
    }
    if (buf->served_s) {
        FMOE_RETURN_ERROR_IF(!h->served, FMOE_EINVAL,
                             "%s: no /tokens/served_s: not a trace of fmoe serve", p);
        FMOE_FORWARD_IF_ERROR(read_rows_once(r, "/tokens/served_s", H5T_NATIVE_FLOAT, row0,
                                             rows, buf->served_s));
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------
 * The measured extras (/timing, /timing/access_outcome): for copying a trace
 * ------------------------------------------------------------------------------------- */

static int read_timing(fmoe_trace_reader *r, int64_t i0, int64_t n, float *layer_s,
                       float *iteration_s) {
    const char *p = r->path;
    FMOE_RETURN_ERROR_IF(r->header.timing_layers < 1, FMOE_EINVAL,
                         "%s: no /timing (timing_layers 0)", p);
    FMOE_RETURN_ERROR_IF(i0 < 0 || n < 0 || i0 > r->num_iterations || n > r->num_iterations - i0,
                         FMOE_ERANGE, "%s: /timing: iterations [%lld, %lld) requested, the "
                         "trace has %lld", p, (long long)i0, (long long)(i0 + n),
                         (long long)r->num_iterations);
    if (n == 0) return 0;
    if (layer_s)
        FMOE_FORWARD_IF_ERROR(read_rows_once(r, "/timing/layer_s", H5T_NATIVE_FLOAT,
                                             (hsize_t)i0, (hsize_t)n, layer_s));
    if (iteration_s)
        FMOE_FORWARD_IF_ERROR(read_rows_once(r, "/timing/iteration_s", H5T_NATIVE_FLOAT,
                                             (hsize_t)i0, (hsize_t)n, iteration_s));
    return 0;
}

static int read_access_outcomes(fmoe_trace_reader *r, int64_t a0, int64_t n, uint8_t *out,
                                int64_t *total) {
    const char *p = r->path, *name = "/timing/access_outcome";
    FMOE_RETURN_ERROR_IF(r->header.offload_cache_experts < 1, FMOE_EINVAL,
                         "%s: no %s (not an offloaded recording)", p, name);
    int64_t dims[1];
    const int64_t any[1] = {-1};
    hid_t d = open_checked(r, name, H5T_INTEGER, 0, 0, 1, any, dims);
    if (d < 0) return (int)d;
    int rc = 0;
    if (total) *total = dims[0];
    if (a0 < 0 || n < 0 || a0 > dims[0] || n > dims[0] - a0)
        rc = fmoe_error_set(FMOE_ERANGE, "%s: %s: entries [%lld, %lld) requested, it has %lld",
                            p, name, (long long)a0, (long long)(a0 + n), (long long)dims[0]);
    else if (n > 0)
        rc = fmoe__h5_dataset_read_rows(d, p, name, H5T_NATIVE_UINT8, (hsize_t)a0, (hsize_t)n,
                                        out);
    H5Dclose(d);
    for (int64_t i = 0; rc == 0 && i < n; i++)
        if (out[i] > 3)
            rc = fmoe_error_set(FMOE_EFORMAT, "%s: %s: entry %lld is %u, expected 0..3", p, name,
                                (long long)(a0 + i), out[i]);
    return rc;
}

/* ---------------------------------------------------------------------------------------
 * Public entry points: each holds the HDF5 lock (hdf5_util.h) for its whole call
 * ------------------------------------------------------------------------------------- */

int fmoe_trace_reader_open(fmoe_trace_reader **out, const char *path) {
    fmoe__h5_lock();
    int rc = reader_open(out, path, NULL, 0);
    fmoe__h5_unlock();
    return rc;
}

int fmoe__trace_reader_open_image(fmoe_trace_reader **out, const void *image, size_t size,
                                  const char *name) {
    fmoe__h5_lock();
    int rc = reader_open(out, name, image ? image : "", size);
    fmoe__h5_unlock();
    return rc;
}

void fmoe_trace_reader_close(fmoe_trace_reader *r) {
    fmoe__h5_lock();
    reader_close(r);
    fmoe__h5_unlock();
}

int fmoe_trace_reader_read_tokens(fmoe_trace_reader *r, int64_t t0, int64_t n,
                                  const fmoe_trace_token_buffers *buf) {
    fmoe__h5_lock();
    int rc = read_tokens(r, t0, n, buf);
    fmoe__h5_unlock();
    return rc;
}

int fmoe_trace_reader_read_timing(fmoe_trace_reader *r, int64_t i0, int64_t n, float *layer_s,
                                  float *iteration_s) {
    if (!r) return fmoe_error_set(FMOE_EINVAL, "fmoe_trace_reader_read_timing: NULL reader");
    fmoe__h5_lock();
    int rc = read_timing(r, i0, n, layer_s, iteration_s);
    fmoe__h5_unlock();
    return rc;
}

int fmoe_trace_reader_read_access_outcomes(fmoe_trace_reader *r, int64_t a0, int64_t n,
                                           uint8_t *out, int64_t *total) {
    if (!r || (n > 0 && !out))
        return fmoe_error_set(FMOE_EINVAL, "fmoe_trace_reader_read_access_outcomes: NULL argument");
    fmoe__h5_lock();
    int rc = read_access_outcomes(r, a0, n, out, total);
    fmoe__h5_unlock();
    return rc;
}
