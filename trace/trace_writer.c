/*
 * trace_writer.c - writes fmoe traces (docs/design.md §4; contract in fmoe/trace.h).
 *
 * The writer works on "<path>.partial". Every dataset is chunked and extendible along its
 * first dimension; an append validates the whole request first (so a refused request
 * changes nothing), then extends and writes the token datasets, the request tables, and
 * last /requests/token_offset, and flushes. A process killed between appends therefore
 * leaves a .partial holding every finished request, which the reader opens as is.
 *
 * The file uses HDF5's default (earliest) format on purpose: newer superblocks record
 * "open for writing" in the file, and a killed writer would leave a file that nothing
 * opens without `h5clear`.
 *
 * What a kill costs: between appends, nothing (the file on disk is exactly the state of
 * the last flush). During an append, HDF5 may already have written part of the next state
 * (an evicted chunk, a B-tree node) and may reuse space the flushed state still points
 * to, so a kill inside that window (milliseconds per request) can leave a .partial that
 * does not open, fails a check, or in the worst case holds a chunk overwritten by another.
 * So a writer that flushes per request also keeps a journal, "<path>.partial.journal":
 * each request is appended there as one checksummed record before it goes into the HDF5
 * file, and `fmoe trace recover` rebuilds a valid trace from it after a kill at any
 * instant (trace_journal.c weighs this against SWMR and explains the format). The journal
 * is removed when the trace is renamed into place.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fmoe/error.h"
#include "files.h"
#include "half.h"
#include "fmoe/trace.h"
#include "fmoe_config.h"
#include "hdf5_util.h"
#include "trace_impl.h"
#include "trace_journal.h"

/* Datasets in the order an append writes them (token_offset last: it commits). */
enum {
    DS_TOKEN_ID,
    DS_PHASE,
    DS_EXPERTS,
    DS_PROBS,
    DS_SEMANTIC,
    DS_SPECULATIVE,
    DS_HIDDEN,
    DS_LAYER_S,
    DS_ITERATION_S,
    DS_ACCESS_OUTCOME,
    DS_SERVED_ITERATION,
    DS_SERVED_S,
    DS_REQ_ID,
    DS_REQ_ARRIVAL,
    DS_REQ_PROMPT,
    DS_REQ_OUTPUT,
    DS_REQ_OFFSET,
    DS_COUNT
};

static const char *const ds_names[DS_COUNT] = {
    "/tokens/token_id",
    "/tokens/phase",
    "/tokens/experts",
    "/tokens/probs",
    "/tokens/semantic",
    "/tokens/speculative",
    "/tokens/hidden",
    "/timing/layer_s",
    "/timing/iteration_s",
    "/timing/access_outcome",
    "/tokens/served_iteration",
    "/tokens/served_s",
    "/requests/id",
    "/requests/arrival_s",
    "/requests/prompt_tokens",
    "/requests/output_tokens",
    "/requests/token_offset",
};

struct fmoe_trace_writer {
    char *path; /* final name */
    char *partial; /* path + ".partial", the file being written */
    char *journal_path; /* partial + ".journal", or NULL: this writer keeps no journal */
    fmoe__journal *journal; /* open while writing, or NULL */
    fmoe_trace_header header; /* copy; config_json is NULL (borrowed only during open) */
    fmoe_trace_write_options opts;
    hid_t file;
    hid_t half; /* IEEE binary16 type, or -1 when storing float32 */
    hid_t hidden_half; /* binary16 type for /tokens/hidden, or -1 when absent */
    hid_t ds[DS_COUNT]; /* -1 for datasets this trace does not have */
    int64_t num_requests;
    int64_t num_tokens; /* T so far = last token_offset */
    int broken; /* an HDF5 write failed mid-append: refuse further appends */
    char broken_why[256]; /* that failure's detail, for a close that fails after it */
    int32_t unflushed; /* requests appended since the last flush */
    uint16_t *scratch; /* float32 -> binary16 staging, [scratch_cap] */
    size_t scratch_cap;
};

static void writer_close_handles(fmoe_trace_writer *w) {
    for (int i = 0; i < DS_COUNT; i++) {
        if (w->ds[i] >= 0) H5Dclose(w->ds[i]);
        w->ds[i] = -1;
    }
    if (w->half >= 0) H5Tclose(w->half);
    w->half = -1;
    if (w->hidden_half >= 0) H5Tclose(w->hidden_half);
    w->hidden_half = -1;
}

static void writer_free(fmoe_trace_writer *w) {
    if (!w) return;
    fmoe__journal_close(w->journal, 0);
    free(w->journal_path);
    free(w->scratch);
    free(w->partial);
    free(w->path);
    free(w);
}

static int check_options(const char *path, const fmoe_trace_write_options *o) {
    switch (o->compression) {
    case FMOE_COMPRESSION_ZSTD:
        FMOE_RETURN_ERROR_IF(o->level < 0 || o->level > 19, FMOE_EINVAL,
                             "%s: zstd level %d, expected 1..19 (0 = default 3)", path, o->level);
        break;
    case FMOE_COMPRESSION_DEFLATE:
        FMOE_RETURN_ERROR_IF(o->level < 0 || o->level > 9, FMOE_EINVAL,
                             "%s: deflate level %d, expected 1..9 (0 = default 4)", path, o->level);
        break;
    case FMOE_COMPRESSION_NONE: break;
    default:
        return fmoe_error_set(FMOE_EINVAL, "%s: unknown compression %d", path, (int)o->compression);
    }
    FMOE_RETURN_ERROR_IF(o->chunk_tokens < 0, FMOE_EINVAL,
                         "%s: chunk_tokens %lld, expected >= 0 (0 = automatic)", path,
                         (long long)o->chunk_tokens);
    return 0;
}

static void fill_defaults(fmoe_trace_header *h) {
    if (!h->created[0]) {
        time_t now = time(NULL);
        struct tm tm;
        if (gmtime_r(&now, &tm)) strftime(h->created, sizeof h->created, "%Y-%m-%dT%H:%M:%SZ", &tm);
    }
    if (!h->fmoe_version[0]) snprintf(h->fmoe_version, sizeof h->fmoe_version, "%s", FMOE_VERSION);
    if (h->semantic_dim > 0 && !h->semantic_kind[0])
        snprintf(h->semantic_kind, sizeof h->semantic_kind, "embedding");
}

static int write_root_attributes(fmoe_trace_writer *w) {
    const fmoe_trace_header *h = &w->header;
    hid_t f = w->file;
    const char *p = w->partial;
    const fmoe__h5_str_attr strs[] = {
        {"format", FMOE_TRACE_FORMAT},
        {"model_name", h->model_name},
        {"model_fingerprint", h->model_fingerprint},
        {"dtype", h->dtype},
        {"dataset", h->dataset},
        {"created", h->created},
        {"fmoe_version", h->fmoe_version},
        {"recorded_on", h->recorded_on},
        {"probs_kind", fmoe_probs_kind_name(h->probs_kind)},
        {"semantic_kind", h->semantic_kind},
    };
    const hid_t i32 = H5T_STD_I32LE;
    const fmoe__h5_int_attr ints[] = {
        {"version", i32, FMOE_TRACE_VERSION},
        {"num_layers", i32, h->num_layers},
        {"num_experts", i32, h->num_experts},
        {"top_k", i32, h->top_k},
        {"hidden_size", i32, h->hidden_size},
        {"shared_experts", i32, h->shared_experts},
        {"semantic_dim", i32, h->semantic_dim},
        {"speculative_depth", i32, h->speculative_depth},
        {"hidden_dim", i32, h->hidden_dim},
        {"timing_layers", i32, h->timing_layers},
        {"prefill_chunk", i32, h->prefill_chunk},
        {"offload_cache_experts", i32, h->offload_cache_experts},
        {"served", i32, h->served},
    };
    FMOE_FORWARD_IF_ERROR(fmoe__h5_attrs_write(f, p, strs, sizeof strs / sizeof strs[0], ints,
                                               sizeof ints / sizeof ints[0]));
    if (h->offload_cache_experts > 0)
        FMOE_FORWARD_IF_ERROR(fmoe__h5_attr_write_str(f, p, "offload_policy", h->offload_policy));
    if (h->activations[0])
        FMOE_FORWARD_IF_ERROR(fmoe__h5_attr_write_str(f, p, "activations", h->activations));
    return fmoe__h5_attr_write_int(f, p, "expert_bytes", H5T_STD_I64LE, h->expert_bytes);
}

static int create_datasets(fmoe_trace_writer *w) {
    const fmoe_trace_header *h = &w->header;
    const hsize_t L = (hsize_t)h->num_layers, J = (hsize_t)h->num_experts, K = (hsize_t)h->top_k,
                  S = (hsize_t)h->speculative_depth, H = (hsize_t)h->semantic_dim,
                  Hh = (hsize_t)h->hidden_dim, Lt = (hsize_t)h->timing_layers;
    hid_t gate_type = w->half >= 0 ? w->half : H5T_IEEE_F32LE;
    const struct {
        int id;
        int present;
        hid_t type;
        int rank;
        hsize_t dims[4];
    } specs[] = {
        {DS_TOKEN_ID, 1, H5T_STD_I32LE, 1, {0}},
        {DS_PHASE, 1, H5T_STD_U8LE, 1, {0}},
        {DS_EXPERTS, 1, H5T_STD_U16LE, 3, {0, L, K}},
        {DS_PROBS, h->probs_kind != FMOE_PROBS_NONE, gate_type, 3, {0, L, J}},
        {DS_SEMANTIC, H > 0, H5T_IEEE_F32LE, 2, {0, H}},
        {DS_SPECULATIVE, S > 0, gate_type, 4, {0, L, S, J}},
        {DS_HIDDEN, Hh > 0, w->hidden_half, 3, {0, L, Hh}},
        {DS_LAYER_S, Lt > 0, H5T_IEEE_F32LE, 2, {0, Lt}},
        {DS_ITERATION_S, Lt > 0, H5T_IEEE_F32LE, 1, {0}},
        {DS_ACCESS_OUTCOME, h->offload_cache_experts > 0, H5T_STD_U8LE, 1, {0}},
        {DS_SERVED_ITERATION, h->served > 0, H5T_STD_I64LE, 1, {0}},
        {DS_SERVED_S, h->served > 0, H5T_IEEE_F32LE, 1, {0}},
        {DS_REQ_ID, 1, H5T_STD_I64LE, 1, {0}},
        {DS_REQ_ARRIVAL, 1, H5T_IEEE_F64LE, 1, {0}},
        {DS_REQ_PROMPT, 1, H5T_STD_I32LE, 1, {0}},
        {DS_REQ_OUTPUT, 1, H5T_STD_I32LE, 1, {0}},
        {DS_REQ_OFFSET, 1, H5T_STD_I64LE, 1, {0}},
    };
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        if (!specs[i].present) continue;
        /* chunk_tokens sizes the token datasets; the request tables keep automatic chunks
         * (their rows are requests, not tokens). */
        fmoe_trace_write_options o = w->opts;
        if (specs[i].id >= DS_LAYER_S) o.chunk_tokens = 0;
        /* /timing is small and its last chunk is rewritten with every request: stored
         * uncompressed, a writer killed in the middle of that rewrite leaves the rows of the
         * requests before intact (the same bytes), where a torn compressed chunk cannot be
         * decoded at all */
        if (specs[i].id >= DS_LAYER_S && specs[i].id <= DS_ACCESS_OUTCOME)
            o.compression = FMOE_COMPRESSION_NONE;
        hid_t d = fmoe__h5_dataset_create_rows(w->file, w->partial, ds_names[specs[i].id],
                                               specs[i].type, specs[i].rank, specs[i].dims, &o);
        if (d < 0) return (int)d;
        w->ds[specs[i].id] = d;
    }
    const int64_t zero = 0;
    return fmoe__h5_dataset_append_rows(w->ds[DS_REQ_OFFSET], w->partial, ds_names[DS_REQ_OFFSET],
                                        H5T_NATIVE_INT64, 1, &zero);
}

static int flush(fmoe_trace_writer *w) {
    if (H5Fflush(w->file, H5F_SCOPE_LOCAL) < 0) {
        char msg[256];
        return fmoe_error_set(FMOE_EIO, "%s: cannot flush: %s", w->partial,
                              fmoe__h5_errmsg(msg, sizeof msg));
    }
    return 0;
}

/* 1 when the header gives per-layer expert bytes that differ from expert_bytes somewhere
 * (only then is /model/layer_expert_bytes written: a uniform model's trace is as before). */
static int layers_differ(const fmoe_trace_header *h) {
    for (int32_t l = 0; h->layer_expert_bytes && l < h->num_layers; l++)
        if (h->layer_expert_bytes[l] != h->expert_bytes) return 1;
    return 0;
}

/* /model/layer_expert_bytes int64 [L] (fmoe/trace.h), small and written once. */
static int write_layer_bytes(fmoe_trace_writer *w, const int64_t *bytes) {
    const char *name = "/model/layer_expert_bytes";
    const hsize_t dims[1] = {0};
    fmoe_trace_write_options o = w->opts;
    o.chunk_tokens = 0;
    o.compression = FMOE_COMPRESSION_NONE;
    hid_t d = fmoe__h5_dataset_create_rows(w->file, w->partial, name, H5T_STD_I64LE, 1, dims, &o);
    if (d < 0) return (int)d;
    const int rc = fmoe__h5_dataset_append_rows(d, w->partial, name, H5T_NATIVE_INT64,
                                                (hsize_t)w->header.num_layers, bytes);
    H5Dclose(d);
    return rc;
}

/* The journal of a writer that flushes per request, its header record from the writer's
 * copy with what is borrowed only during open (the per-layer expert bytes) put back. */
static int journal_create(fmoe_trace_writer *w, const fmoe_trace_header *header,
                          const char *config) {
    fmoe_trace_header h = w->header;
    h.layer_expert_bytes = layers_differ(header) ? header->layer_expert_bytes : NULL;
    return fmoe__journal_create(&w->journal, w->journal_path, &h, config, &w->opts);
}

static int writer_open(fmoe_trace_writer **out, const char *path, const fmoe_trace_header *header,
                       const fmoe_trace_write_options *opts) {
    if (!out || !path || !path[0] || !header)
        return fmoe_error_set(FMOE_EINVAL, "fmoe_trace_writer_open: NULL argument");
    *out = NULL;
    static const fmoe_trace_write_options default_opts = {.compression = FMOE_COMPRESSION_ZSTD};
    if (!opts) opts = &default_opts;
    FMOE_FORWARD_IF_ERROR(check_options(path, opts));
    FMOE_FORWARD_IF_ERROR(fmoe__trace_header_check(header, path, FMOE_EINVAL, 0));
    const char *config = header->config_json ? header->config_json : "";
    FMOE_RETURN_ERROR_IF(!fmoe__utf8_valid(config, strlen(config)), FMOE_EINVAL,
                         "%s: header.config_json is not valid UTF-8", path);
    if (header->semantic_dim > 0 && header->semantic_kind[0]) {
        FMOE_RETURN_ERROR_IF(strcmp(header->semantic_kind, "embedding") != 0 &&
                                 strcmp(header->semantic_kind, "projection") != 0,
                             FMOE_EINVAL,
                             "%s: header.semantic_kind = '%s', expected embedding or "
                             "projection",
                             path, header->semantic_kind);
    }
    FMOE_RETURN_ERROR_IF(header->hidden_dim < 0 || header->hidden_dim > FMOE_TRACE_MAX_SEMANTIC,
                         FMOE_EINVAL, "%s: header.hidden_dim = %d, expected 0..%d", path,
                         header->hidden_dim, FMOE_TRACE_MAX_SEMANTIC);
    FMOE_RETURN_ERROR_IF(header->served < 0 || header->served > 1, FMOE_EINVAL,
                         "%s: header.served = %d, expected 0 or 1", path, header->served);
    FMOE_RETURN_ERROR_IF(header->timing_layers < 0 || header->timing_layers > FMOE_TRACE_MAX_LAYERS,
                         FMOE_EINVAL, "%s: header.timing_layers = %d, expected 0..%d", path,
                         header->timing_layers, FMOE_TRACE_MAX_LAYERS);
    FMOE_RETURN_ERROR_IF(header->prefill_chunk < 0 || header->prefill_chunk > (1 << 20),
                         FMOE_EINVAL, "%s: header.prefill_chunk = %d, expected 0..%d", path,
                         header->prefill_chunk, 1 << 20);
    FMOE_RETURN_ERROR_IF(header->offload_cache_experts < 0, FMOE_EINVAL,
                         "%s: header.offload_cache_experts = %d, expected >= 0", path,
                         header->offload_cache_experts);
    FMOE_FORWARD_IF_ERROR(fmoe__h5_init());

    fmoe_trace_writer *w = calloc(1, sizeof *w);
    if (!w) return fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", path);
    w->file = -1;
    w->half = -1;
    w->hidden_half = -1;
    for (int i = 0; i < DS_COUNT; i++) w->ds[i] = -1;
    w->header = *header;
    w->header.config_json = NULL;
    w->header.layer_expert_bytes = NULL;
    w->opts = *opts;
    fill_defaults(&w->header);
    int rc = 0;
    size_t n = strlen(path);
    w->path = strdup(path);
    w->partial = malloc(n + sizeof ".partial");
    if (!w->path || !w->partial) {
        rc = fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    memcpy(w->partial, path, n);
    memcpy(w->partial + n, ".partial", sizeof ".partial");
    if (w->opts.flush_requests <= 1) {
        /* durable per request: journal too (trace_journal.c) */
        w->journal_path = malloc(n + sizeof ".partial.journal");
        if (!w->journal_path) {
            rc = fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", path);
            goto fail;
        }
        memcpy(w->journal_path, w->partial, n + sizeof ".partial" - 1);
        memcpy(w->journal_path + n + sizeof ".partial" - 1, ".journal", sizeof ".journal");
        struct stat st;
        if (lstat(w->journal_path, &st) == 0) {
            /* A journal holds the requests of a run that never finished; starting over
             * would throw them away. */
            rc = fmoe_error_set(FMOE_EIO,
                                "%s: the journal of an unfinished run is there; recover its "
                                "requests with 'fmoe trace recover %s', or remove it",
                                w->journal_path, w->partial);
            goto fail;
        }
    }

    if (w->header.probs_half) {
        w->half = fmoe__h5_half_type();
        if (w->half < 0) {
            rc = fmoe_error_set(FMOE_EINTERNAL, "%s: cannot build the float16 type", path);
            goto fail;
        }
    }
    if (w->header.hidden_dim > 0) {
        w->hidden_half = fmoe__h5_half_type();
        if (w->hidden_half < 0) {
            rc = fmoe_error_set(FMOE_EINTERNAL, "%s: cannot build the float16 type", path);
            goto fail;
        }
    }
    /* lib/files.h: the output must be absent or a regular file, a stale partial a regular
     * file of ours (replaced), and the partial is created exclusively (no symlink followed). */
    if ((rc = fmoe__output_check(w->path)) < 0 || (rc = fmoe__partial_prepare(w->partial)) < 0)
        goto fail;
    /* the journal first: a kill between the two leaves nothing that recovery misreads */
    if (w->journal_path &&
        (rc = journal_create(w, header, config)) < 0)
        goto fail;
    w->file = H5Fcreate(w->partial, H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT);
    if (w->file < 0) {
        char msg[256];
        rc = fmoe_error_set(FMOE_EIO, "%s: cannot create: %s", w->partial,
                            fmoe__h5_errmsg(msg, sizeof msg));
        /* HDF5 may have made the file and failed writing its superblock (a full disk);
         * a file that was there first (someone else's) is left alone */
        if (strcmp(msg, strerror(EEXIST)) != 0) unlink(w->partial);
        goto fail;
    }
    if ((rc = write_root_attributes(w)) < 0) goto fail;
    if ((rc = fmoe__h5_dataset_write_str(w->file, w->partial, "/model/config_json", config)) < 0)
        goto fail;
    if (layers_differ(header) && (rc = write_layer_bytes(w, header->layer_expert_bytes)) < 0)
        goto fail;
    if ((rc = create_datasets(w)) < 0) goto fail;
    if ((rc = flush(w)) < 0) goto fail;
    *out = w;
    return 0;

fail:
    writer_close_handles(w);
    if (w->file >= 0) {
        H5Fclose(w->file);
        unlink(w->partial);
    }
    if (w->journal) {
        fmoe__journal_close(w->journal, 1);
        w->journal = NULL;
    }
    writer_free(w);
    return rc;
}

/* ---------------------------------------------------------------------------------------
 * Append
 * ------------------------------------------------------------------------------------- */

static int prob_ok(float p) {
    return isfinite(p) && p >= -FMOE_TRACE_PROB_TOL && p <= 1.0f + FMOE_TRACE_PROB_TOL;
}

/* Checks everything about one request before anything is written. */
static int check_request(const fmoe_trace_writer *w, const fmoe_trace_request *q, int64_t T) {
    const fmoe_trace_header *h = &w->header;
    const char *p = w->path;
    const long long id = (long long)q->id;
    const int64_t L = h->num_layers, J = h->num_experts, K = h->top_k, S = h->speculative_depth,
                  H = h->semantic_dim;
    FMOE_RETURN_ERROR_IF(q->prompt_tokens < 0 || q->output_tokens < 0, FMOE_EINVAL,
                         "%s: request %lld: prompt_tokens %d / output_tokens %d, expected >= 0", p,
                         id, q->prompt_tokens, q->output_tokens);
    FMOE_RETURN_ERROR_IF(!isfinite(q->arrival_s) || q->arrival_s < 0, FMOE_EINVAL,
                         "%s: request %lld: arrival_s %g, expected a finite time >= 0", p, id,
                         q->arrival_s);
    /* Sizes of the largest per-request arrays must fit in memory arithmetic. */
    int64_t big = 0;
    FMOE_RETURN_ERROR_IF(
        __builtin_mul_overflow(T, L * (S > 0 ? S : 1) * J, &big) || big > INT64_MAX / 4,
        FMOE_EINVAL, "%s: request %lld: %lld tokens is too large", p, id, (long long)T);
    if (h->timing_layers > 0) {
        const int64_t I =
            fmoe_trace_request_iterations(q->prompt_tokens, q->output_tokens, h->prefill_chunk);
        FMOE_RETURN_ERROR_IF(I > 0 && (!q->layer_s || !q->iteration_s), FMOE_EINVAL,
                             "%s: request %lld: layer_s and iteration_s are required "
                             "(header.timing_layers > 0)",
                             p, id);
        for (int64_t i = 0; i < I * h->timing_layers; i++)
            FMOE_RETURN_ERROR_IF(!isfinite(q->layer_s[i]) || q->layer_s[i] < 0, FMOE_EINVAL,
                                 "%s: request %lld: layer_s[%lld][%lld] = %g, expected seconds "
                                 ">= 0",
                                 p, id, (long long)(i / h->timing_layers),
                                 (long long)(i % h->timing_layers), q->layer_s[i]);
        for (int64_t i = 0; i < I; i++)
            FMOE_RETURN_ERROR_IF(!isfinite(q->iteration_s[i]) || q->iteration_s[i] < 0,
                                 FMOE_EINVAL,
                                 "%s: request %lld: iteration_s[%lld] = %g, expected seconds >= 0",
                                 p, id, (long long)i, q->iteration_s[i]);
    } else {
        FMOE_RETURN_ERROR_IF(q->layer_s || q->iteration_s, FMOE_EINVAL,
                             "%s: request %lld: timings given but header.timing_layers is 0", p,
                             id);
    }
    if (h->offload_cache_experts > 0) {
        FMOE_RETURN_ERROR_IF(q->num_access_outcomes < 0 ||
                                 (q->num_access_outcomes > 0 && !q->access_outcome),
                             FMOE_EINVAL, "%s: request %lld: %lld access outcomes without data",
                             p, id, (long long)q->num_access_outcomes);
        for (int64_t i = 0; i < q->num_access_outcomes; i++)
            FMOE_RETURN_ERROR_IF(q->access_outcome[i] > 3, FMOE_EINVAL,
                                 "%s: request %lld: access_outcome[%lld] = %u, expected 0..3", p,
                                 id, (long long)i, q->access_outcome[i]);
    } else {
        FMOE_RETURN_ERROR_IF(q->access_outcome, FMOE_EINVAL,
                             "%s: request %lld: access outcomes given but the header says the "
                             "recording was not offloaded",
                             p, id);
    }
    if (h->served > 0) {
        FMOE_RETURN_ERROR_IF(T > 0 && (!q->served_iteration || !q->served_s), FMOE_EINVAL,
                             "%s: request %lld: served_iteration and served_s are required "
                             "(header.served)",
                             p, id);
        for (int64_t t = 0; t < T; t++)
            FMOE_RETURN_ERROR_IF(q->served_iteration[t] < 0 || !isfinite(q->served_s[t]) ||
                                     q->served_s[t] < 0,
                                 FMOE_EINVAL,
                                 "%s: request %lld: token %lld: served iteration %lld in %g s, "
                                 "expected >= 0",
                                 p, id, (long long)t, (long long)q->served_iteration[t],
                                 q->served_s[t]);
    } else {
        FMOE_RETURN_ERROR_IF(q->served_iteration || q->served_s, FMOE_EINVAL,
                             "%s: request %lld: served iterations given but header.served is 0",
                             p, id);
    }
    if (T == 0) return 0;

#define REQUIRE(cond, field, why)                                                                  \
    FMOE_RETURN_ERROR_IF(!(cond), FMOE_EINVAL, "%s: request %lld: %s %s", p, id, field, why)
    REQUIRE(q->token_id, "token_id", "is NULL");
    REQUIRE(q->phase, "phase", "is NULL");
    REQUIRE(q->experts, "experts", "is NULL");
    if (h->probs_kind == FMOE_PROBS_NONE)
        REQUIRE(!q->probs, "probs", "is given but header.probs_kind is none");
    else
        REQUIRE(q->probs, "probs", "is NULL but header.probs_kind is not none");
    if (H == 0)
        REQUIRE(!q->semantic, "semantic", "is given but header.semantic_dim is 0");
    else
        REQUIRE(q->semantic, "semantic", "is NULL but header.semantic_dim > 0");
    if (S == 0)
        REQUIRE(!q->speculative, "speculative", "is given but header.speculative_depth is 0");
    else
        REQUIRE(q->speculative, "speculative", "is NULL but header.speculative_depth > 0");
    if (h->hidden_dim == 0)
        REQUIRE(!q->hidden, "hidden", "is given but header.hidden_dim is 0");
    else
        REQUIRE(q->hidden, "hidden", "is NULL but header.hidden_dim > 0");
#undef REQUIRE

    for (int64_t t = 0; t < T; t++) {
        const uint8_t want = t < q->prompt_tokens ? FMOE_PHASE_PREFILL : FMOE_PHASE_DECODE;
        FMOE_RETURN_ERROR_IF(q->phase[t] != want, FMOE_EINVAL,
                             "%s: request %lld: phase[%lld] = %u, expected %u (%s: the first "
                             "prompt_tokens = %d tokens are prefill)",
                             p, id, (long long)t, q->phase[t], want, want ? "decode" : "prefill",
                             q->prompt_tokens);
        FMOE_RETURN_ERROR_IF(q->token_id[t] < -1, FMOE_EINVAL,
                             "%s: request %lld: token_id[%lld] = %d, expected >= -1", p, id,
                             (long long)t, q->token_id[t]);
        for (int64_t l = 0; l < L; l++) {
            const uint16_t *row = q->experts + (t * L + l) * K;
            for (int64_t k = 0; k < K; k++)
                FMOE_RETURN_ERROR_IF(row[k] >= J, FMOE_EINVAL,
                                     "%s: request %lld: experts[%lld][%lld][%lld] = %u, "
                                     "expected < num_experts (%lld)",
                                     p, id, (long long)t, (long long)l, (long long)k, row[k],
                                     (long long)J);
            FMOE_RETURN_ERROR_IF(!fmoe__experts_distinct(row, (int32_t)K), FMOE_EINVAL,
                                 "%s: request %lld: experts[%lld][%lld] repeats an expert, "
                                 "expected %lld distinct ids",
                                 p, id, (long long)t, (long long)l, (long long)K);
        }
    }
    if (q->probs) {
        for (int64_t i = 0; i < T * L * J; i++)
            FMOE_RETURN_ERROR_IF(!prob_ok(q->probs[i]), FMOE_EINVAL,
                                 "%s: request %lld: probs[%lld][%lld][%lld] = %g, expected a "
                                 "probability in [0, 1]",
                                 p, id, (long long)(i / (L * J)), (long long)(i / J % L),
                                 (long long)(i % J), q->probs[i]);
    }
    if (q->semantic) {
        for (int64_t i = 0; i < T * H; i++)
            FMOE_RETURN_ERROR_IF(!isfinite(q->semantic[i]), FMOE_EINVAL,
                                 "%s: request %lld: semantic[%lld][%lld] = %g, expected finite", p,
                                 id, (long long)(i / H), (long long)(i % H), q->semantic[i]);
    }
    if (q->hidden) {
        const int64_t Hh = h->hidden_dim;
        for (int64_t i = 0; i < T * L * Hh; i++)
            FMOE_RETURN_ERROR_IF(!isfinite(q->hidden[i]), FMOE_EINVAL,
                                 "%s: request %lld: hidden[%lld][%lld][%lld] = %g, expected "
                                 "finite",
                                 p, id, (long long)(i / (L * Hh)), (long long)(i / Hh % L),
                                 (long long)(i % Hh), q->hidden[i]);
    }
    if (q->speculative) {
        for (int64_t i = 0; i < T * L * S * J; i++)
            FMOE_RETURN_ERROR_IF(!prob_ok(q->speculative[i]), FMOE_EINVAL,
                                 "%s: request %lld: speculative[%lld][%lld][%lld][%lld] = %g, "
                                 "expected a probability in [0, 1]",
                                 p, id, (long long)(i / (L * S * J)), (long long)(i / (S * J) % L),
                                 (long long)(i / J % S), (long long)(i % J), q->speculative[i]);
    }
    return 0;
}

/* Returns the data to write for a gate array of n floats: the array itself, or (half
 * storage) its binary16 conversion in the scratch buffer; NULL when out of memory. */
static const void *half_data(fmoe_trace_writer *w, const float *src, size_t n) {
    if (n > w->scratch_cap) {
        uint16_t *s = realloc(w->scratch, n * sizeof *s);
        if (!s) return NULL;
        w->scratch = s;
        w->scratch_cap = n;
    }
    for (size_t i = 0; i < n; i++) w->scratch[i] = fmoe_float_to_half(src[i]);
    return w->scratch;
}

static const void *gate_data(fmoe_trace_writer *w, const float *src, size_t n) {
    return w->half < 0 ? (const void *)src : half_data(w, src, n);
}

static int append_gate(fmoe_trace_writer *w, int ds, const float *src, size_t per_token,
                       int64_t T) {
    const void *data = gate_data(w, src, (size_t)T * per_token);
    if (!data)
        return fmoe_error_set(FMOE_ENOMEM, "%s: %s: out of memory", w->partial, ds_names[ds]);
    return fmoe__h5_dataset_append_rows(w->ds[ds], w->partial, ds_names[ds],
                                        w->half >= 0 ? w->half : H5T_NATIVE_FLOAT, (hsize_t)T,
                                        data);
}

static int append_rows(fmoe_trace_writer *w, int ds, hid_t mem, int64_t n, const void *data) {
    return fmoe__h5_dataset_append_rows(w->ds[ds], w->partial, ds_names[ds], mem, (hsize_t)n, data);
}

static int writer_append(fmoe_trace_writer *w, const fmoe_trace_request *req) {
    if (!w || !req)
        return fmoe_error_set(FMOE_EINVAL, "fmoe_trace_writer_append_request: NULL argument");
    FMOE_RETURN_ERROR_IF(w->broken, FMOE_EIO,
                         "%s: an earlier append failed; the writer accepts no more requests",
                         w->partial);
    const int64_t T = (int64_t)req->prompt_tokens + req->output_tokens;
    FMOE_FORWARD_IF_ERROR(check_request(w, req, T));
    if (w->journal) {
        /* the journal before the HDF5 file: once this returns the request survives a kill */
        int jrc = fmoe__journal_append(w->journal, req);
        if (jrc < 0) {
            w->broken = 1;
            snprintf(w->broken_why, sizeof w->broken_why, "%s", fmoe_error_detail());
            return jrc;
        }
    }

    const fmoe_trace_header *h = &w->header;
    const size_t L = (size_t)h->num_layers, J = (size_t)h->num_experts;
    const size_t S = (size_t)h->speculative_depth;
    const int64_t end = w->num_tokens + T;
    int rc = 0;
    if (T > 0) {
        if ((rc = append_rows(w, DS_TOKEN_ID, H5T_NATIVE_INT32, T, req->token_id)) < 0 ||
            (rc = append_rows(w, DS_PHASE, H5T_NATIVE_UINT8, T, req->phase)) < 0 ||
            (rc = append_rows(w, DS_EXPERTS, H5T_NATIVE_UINT16, T, req->experts)) < 0)
            goto fail;
        if (req->probs && (rc = append_gate(w, DS_PROBS, req->probs, L * J, T)) < 0) goto fail;
        if (req->semantic &&
            (rc = append_rows(w, DS_SEMANTIC, H5T_NATIVE_FLOAT, T, req->semantic)) < 0)
            goto fail;
        if (req->speculative &&
            (rc = append_gate(w, DS_SPECULATIVE, req->speculative, L * S * J, T)) < 0)
            goto fail;
        if (h->served > 0 &&
            ((rc = append_rows(w, DS_SERVED_ITERATION, H5T_NATIVE_INT64, T,
                               req->served_iteration)) < 0 ||
             (rc = append_rows(w, DS_SERVED_S, H5T_NATIVE_FLOAT, T, req->served_s)) < 0))
            goto fail;
        if (req->hidden) {
            const void *data = half_data(w, req->hidden, (size_t)T * L * (size_t)h->hidden_dim);
            if (!data) {
                rc = fmoe_error_set(FMOE_ENOMEM, "%s: %s: out of memory", w->partial,
                                    ds_names[DS_HIDDEN]);
                goto fail;
            }
            if ((rc = append_rows(w, DS_HIDDEN, w->hidden_half, T, data)) < 0) goto fail;
        }
    }
    const int64_t iters =
        fmoe_trace_request_iterations(req->prompt_tokens, req->output_tokens, h->prefill_chunk);
    if (h->timing_layers > 0 && iters > 0 &&
        ((rc = append_rows(w, DS_LAYER_S, H5T_NATIVE_FLOAT, iters, req->layer_s)) < 0 ||
         (rc = append_rows(w, DS_ITERATION_S, H5T_NATIVE_FLOAT, iters, req->iteration_s)) < 0))
        goto fail;
    if (h->offload_cache_experts > 0 && req->num_access_outcomes > 0 &&
        (rc = append_rows(w, DS_ACCESS_OUTCOME, H5T_NATIVE_UINT8, req->num_access_outcomes,
                          req->access_outcome)) < 0)
        goto fail;
    if ((rc = append_rows(w, DS_REQ_ID, H5T_NATIVE_INT64, 1, &req->id)) < 0 ||
        (rc = append_rows(w, DS_REQ_ARRIVAL, H5T_NATIVE_DOUBLE, 1, &req->arrival_s)) < 0 ||
        (rc = append_rows(w, DS_REQ_PROMPT, H5T_NATIVE_INT32, 1, &req->prompt_tokens)) < 0 ||
        (rc = append_rows(w, DS_REQ_OUTPUT, H5T_NATIVE_INT32, 1, &req->output_tokens)) < 0 ||
        (rc = append_rows(w, DS_REQ_OFFSET, H5T_NATIVE_INT64, 1, &end)) < 0)
        goto fail;
    if (++w->unflushed >= (w->opts.flush_requests > 0 ? w->opts.flush_requests : 1)) {
        if ((rc = flush(w)) < 0) goto fail;
        w->unflushed = 0;
    }
    w->num_tokens = end;
    w->num_requests++;
    return 0;

fail:
    /* Some datasets may have grown and others not; the file on disk still ends at the
     * last flush, but this writer can no longer extend it consistently. */
    w->broken = 1;
    snprintf(w->broken_why, sizeof w->broken_why, "%s", fmoe_error_detail());
    return rc;
}

/* ---------------------------------------------------------------------------------------
 * Close and abort
 * ------------------------------------------------------------------------------------- */

/* What a failed close leaves. Without a journal (an importer, a merge: run again),
 * nothing. With one, the journal and the .partial both, as a kill would leave them: the
 * journal holds every request, and the .partial (flushed per request) may hold them too;
 * `fmoe trace recover` reads both and removes them only once its trace holds everything
 * they do. (It once removed the .partial here, so a journal that was damaged as well left
 * no second copy.) */
static int close_failed(fmoe_trace_writer *w, int rc) {
    if (!w->journal) {
        unlink(w->partial);
        return rc;
    }
    fmoe__journal_close(w->journal, 0);
    w->journal = NULL;
    char why[512];
    snprintf(why, sizeof why, "%s", fmoe_error_detail());
    return fmoe_error_set(rc, "%s; the requests are kept in %s and %s ('fmoe trace recover "
                              "%s' rebuilds the trace)",
                          why, w->journal_path, w->partial, w->partial);
}

/* The reason a close failed: after a failed append, that append's (libhdf5's own message
 * then is about its internal state, "slist already enabled?"), else libhdf5's. */
static int close_error(fmoe_trace_writer *w) {
    char msg[256];
    if (w->broken && w->broken_why[0])
        return fmoe_error_set(FMOE_EIO, "%s: cannot close after a failed append (%s)",
                              w->partial, w->broken_why);
    return fmoe_error_set(FMOE_EIO, "%s: cannot close: %s", w->partial,
                          fmoe__h5_errmsg(msg, sizeof msg));
}

static int writer_close(fmoe_trace_writer *w) {
    if (!w) return fmoe_error_set(FMOE_EINVAL, "fmoe_trace_writer_close: NULL writer");
    int rc = 0;
    writer_close_handles(w);
    /* A close that fails (its last flush hit a full disk) leaves HDF5's id dangling; it is
     * never touched again (hdf5_util.c, h5_mutex_init). */
    if (H5Fclose(w->file) < 0) {
        rc = close_failed(w, close_error(w));
    } else if (w->broken) {
        /* Keep the .partial (and the journal): they hold every request appended before the
         * failure. */
        rc = fmoe_error_set(FMOE_EIO, "%s: not renamed to %s because an append failed", w->partial,
                            w->path);
    } else {
        /* The .partial is whole: the journal goes first, so that a kill from here on
         * leaves a whole .partial (which recover renames) or the trace, never a journal
         * beside a finished trace (which would block the next run). */
        fmoe__journal_close(w->journal, 1);
        w->journal = NULL;
        if ((rc = fmoe__partial_commit(w->partial, w->path)) < 0 && !w->journal_path)
            unlink(w->partial); /* a writer that journals keeps its whole .partial */
    }
    writer_free(w);
    return rc;
}

static int writer_close_partial(fmoe_trace_writer *w) {
    if (!w) return fmoe_error_set(FMOE_EINVAL, "fmoe_trace_writer_close_partial: NULL writer");
    int rc = 0;
    writer_close_handles(w);
    if (H5Fclose(w->file) < 0) rc = close_failed(w, close_error(w));
    writer_free(w); /* keeps the journal */
    return rc;
}

static void writer_abort(fmoe_trace_writer *w) {
    if (!w) return;
    writer_close_handles(w);
    H5Fclose(w->file);
    unlink(w->partial);
    fmoe__journal_close(w->journal, 1);
    w->journal = NULL;
    writer_free(w);
}

/* ---------------------------------------------------------------------------------------
 * Public entry points: each holds the HDF5 lock (hdf5_util.h) for its whole call
 * ------------------------------------------------------------------------------------- */

int fmoe_trace_writer_open(fmoe_trace_writer **out, const char *path,
                           const fmoe_trace_header *header, const fmoe_trace_write_options *opts) {
    fmoe__h5_lock();
    int rc = writer_open(out, path, header, opts);
    fmoe__h5_unlock();
    return rc;
}

int fmoe_trace_writer_append_request(fmoe_trace_writer *w, const fmoe_trace_request *req) {
    fmoe__h5_lock();
    int rc = writer_append(w, req);
    fmoe__h5_unlock();
    fmoe__fault_point("trace-request");
    return rc;
}

int fmoe_trace_writer_close(fmoe_trace_writer *w) {
    fmoe__h5_lock();
    int rc = writer_close(w);
    fmoe__h5_unlock();
    return rc;
}

int fmoe_trace_writer_close_partial(fmoe_trace_writer *w) {
    fmoe__h5_lock();
    int rc = writer_close_partial(w);
    fmoe__h5_unlock();
    return rc;
}

void fmoe_trace_writer_abort(fmoe_trace_writer *w) {
    fmoe__h5_lock();
    writer_abort(w);
    fmoe__h5_unlock();
}
