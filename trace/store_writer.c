/*
 * store_writer.c - writes expert-map store files (docs/design.md §5; contract in
 * fmoe/store.h).
 *
 * Same conventions as the trace writer: "<path>.partial" first, renamed when complete;
 * chunked datasets compressed with zstd by default (deflate or none on request); the
 * earliest HDF5 file format, so that stock h5py and h5dump read it. A store is written in
 * one go (it is at most C·(h + L·J) floats), so there is no append protocol.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fmoe/error.h"
#include "files.h"
#include "fmoe/expertmap.h"
#include "fmoe/store.h"
#include "fmoe_config.h"
#include "hdf5_util.h"
#include "store_impl.h"

/* A whole numeric dataset of `rank` dims (dims[0] rows), chunked and compressed. */
static int write_rows(hid_t file, const char *path, const char *name, hid_t file_type,
                      hid_t mem_type, int rank, const hsize_t *dims, const void *data,
                      const fmoe_trace_write_options *opts) {
    hid_t d = fmoe__h5_dataset_create_rows(file, path, name, file_type, rank, dims, opts);
    if (d < 0) return (int)d;
    int rc = fmoe__h5_dataset_append_rows(d, path, name, mem_type, dims[0], data);
    H5Dclose(d);
    return rc;
}

/* /maps [E][L][J]: the store keeps its maps layer-major, so entries are gathered a block at
 * a time (bounded memory) and appended. */
static int write_maps(hid_t file, const char *path, const fmoe_expertmap *st,
                      const fmoe_trace_write_options *opts) {
    const fmoe_expertmap_config *c = fmoe_expertmap_config_of(st);
    const int32_t E = fmoe_expertmap_size(st);
    const size_t LJ = (size_t)c->num_layers * (size_t)c->num_experts;
    const hsize_t dims[3] = {0, (hsize_t)c->num_layers, (hsize_t)c->num_experts};
    hid_t d = fmoe__h5_dataset_create_rows(file, path, "/maps", H5T_IEEE_F32LE, 3, dims, opts);
    if (d < 0) return (int)d;
    const int32_t B = 1024;
    float *buf = malloc((size_t)(E < B ? (E ? E : 1) : B) * LJ * sizeof *buf);
    int rc = buf ? 0 : fmoe_error_set(FMOE_ENOMEM, "%s: /maps: out of memory", path);
    for (int32_t y0 = 0; rc == 0 && y0 < E; y0 += B) {
        const int32_t n = E - y0 < B ? E - y0 : B;
        for (int32_t i = 0; i < n; i++) fmoe_expertmap_copy_map(st, y0 + i, buf + (size_t)i * LJ);
        rc = fmoe__h5_dataset_append_rows(d, path, "/maps", H5T_NATIVE_FLOAT, (hsize_t)n, buf);
    }
    free(buf);
    H5Dclose(d);
    return rc;
}

static int check_file(const char *path, const fmoe_store_file *f) {
    FMOE_RETURN_ERROR_IF(!f->store, FMOE_EINVAL, "%s: no store to write", path);
    FMOE_RETURN_ERROR_IF(f->probs_kind != FMOE_PROBS_FULL && f->probs_kind != FMOE_PROBS_TOPK,
                         FMOE_EINVAL, "%s: probs_kind %d, expected full or topk", path,
                         (int)f->probs_kind);
    FMOE_RETURN_ERROR_IF(!(f->split > 0 && f->split <= 1), FMOE_EINVAL,
                         "%s: split %g, expected a share in (0, 1]", path, f->split);
    FMOE_RETURN_ERROR_IF(f->num_sources < 0 || (f->num_sources > 0 && !f->sources), FMOE_EINVAL,
                         "%s: %d sources", path, f->num_sources);
    FMOE_RETURN_ERROR_IF(f->num_used < 0 || f->num_held_out < 0 || f->tokens_used < 0,
                         FMOE_EINVAL, "%s: negative counts", path);
    FMOE_RETURN_ERROR_IF((f->num_used && (!f->used_source || !f->used_id)) ||
                             (f->num_held_out && (!f->held_out_source || !f->held_out_id)),
                         FMOE_EINVAL, "%s: request lists missing", path);
    for (int64_t i = 0; i < f->num_used; i++)
        FMOE_RETURN_ERROR_IF(f->used_source[i] < 0 || f->used_source[i] >= f->num_sources,
                             FMOE_EINVAL, "%s: used request %lld names source %d of %d", path,
                             (long long)i, f->used_source[i], f->num_sources);
    for (int64_t i = 0; i < f->num_held_out; i++)
        FMOE_RETURN_ERROR_IF(f->held_out_source[i] < 0 || f->held_out_source[i] >= f->num_sources,
                             FMOE_EINVAL, "%s: held-out request %lld names source %d of %d",
                             path, (long long)i, f->held_out_source[i], f->num_sources);
    return 0;
}

static int write_all(hid_t file, const char *p, const fmoe_store_file *f,
                     const fmoe_trace_write_options *opts) {
    const fmoe_expertmap_config *c = fmoe_expertmap_config_of(f->store);
    const int32_t E = fmoe_expertmap_size(f->store);
    char created[32], version[32];
    snprintf(created, sizeof created, "%s", f->created);
    snprintf(version, sizeof version, "%s", f->fmoe_version[0] ? f->fmoe_version : FMOE_VERSION);
    if (!created[0]) {
        time_t now = time(NULL);
        struct tm tm;
        if (gmtime_r(&now, &tm)) strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%SZ", &tm);
    }
    /* source_traces: the paths, one per line */
    size_t len = 1;
    for (int32_t s = 0; s < f->num_sources; s++) len += strlen(f->sources[s].path) + 1;
    char *joined = calloc(len, 1);
    const char **strs = calloc((size_t)(f->num_sources ? f->num_sources : 1), sizeof *strs);
    int64_t *nreq = calloc((size_t)(f->num_sources ? f->num_sources : 1), sizeof *nreq);
    int rc = 0;
    if (!joined || !strs || !nreq) {
        rc = fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", p);
        goto done;
    }
    for (int32_t s = 0; s < f->num_sources; s++) {
        if (s) strcat(joined, "\n");
        strcat(joined, f->sources[s].path);
    }
    const fmoe__h5_str_attr sattrs[] = {
        {"format", FMOE_STORE_FORMAT},
        {"model_name", f->model_name},
        {"model_fingerprint", f->model_fingerprint},
        {"probs_kind", fmoe_probs_kind_name(f->probs_kind)},
        {"semantic_kind", c->semantic_dim > 0 ? f->semantic_kind : ""},
        {"source_traces", joined},
        {"created", created},
        {"fmoe_version", version},
    };
    const fmoe__h5_int_attr iattrs[] = {
        {"version", H5T_STD_I32LE, FMOE_STORE_VERSION},
        {"capacity", H5T_STD_I32LE, c->capacity},
        {"size", H5T_STD_I32LE, E},
        {"num_layers", H5T_STD_I32LE, c->num_layers},
        {"num_experts", H5T_STD_I32LE, c->num_experts},
        {"top_k", H5T_STD_I32LE, c->top_k},
        {"semantic_dim", H5T_STD_I32LE, c->semantic_dim},
        {"prefetch_distance", H5T_STD_I32LE, c->prefetch_distance},
        {"requests_used", H5T_STD_I64LE, f->num_used},
        {"requests_held_out", H5T_STD_I64LE, f->num_held_out},
        {"tokens_used", H5T_STD_I64LE, f->tokens_used},
        {"capacity_asked", H5T_STD_I32LE,
         f->capacity_asked > c->capacity ? f->capacity_asked : c->capacity},
    };
    if ((rc = fmoe__h5_attrs_write(file, p, sattrs, sizeof sattrs / sizeof sattrs[0], iattrs,
                                   sizeof iattrs / sizeof iattrs[0])) < 0)
        goto done;
    if ((rc = fmoe__h5_attr_write_f64(file, p, "split", f->split)) < 0) goto done;
    {
        /* the seed is a full uint64; fmoe__h5_attr_write_int takes int64 values */
        hid_t space = H5Screate(H5S_SCALAR);
        hid_t a = space < 0 ? -1
                            : H5Acreate2(file, "split_seed", H5T_STD_U64LE, space, H5P_DEFAULT,
                                         H5P_DEFAULT);
        const int ok = a >= 0 && H5Awrite(a, H5T_NATIVE_UINT64, &f->split_seed) >= 0;
        if (a >= 0) H5Aclose(a);
        if (space >= 0) H5Sclose(space);
        if (!ok) {
            char msg[256];
            rc = fmoe_error_set(FMOE_EIO, "%s: cannot write attribute 'split_seed': %s", p,
                                fmoe__h5_errmsg(msg, sizeof msg));
            goto done;
        }
    }

    if ((rc = write_maps(file, p, f->store, opts)) < 0) goto done;
    if (c->semantic_dim > 0) {
        const hsize_t ds[2] = {(hsize_t)E, (hsize_t)c->semantic_dim};
        if ((rc = write_rows(file, p, "/semantic", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 2, ds,
                             fmoe_expertmap_semantic(f->store), opts)) < 0)
            goto done;
    }
    const hsize_t dh[1] = {(hsize_t)E};
    if ((rc = write_rows(file, p, "/hits", H5T_STD_U32LE, H5T_NATIVE_UINT32, 1, dh,
                         fmoe_expertmap_hits(f->store), opts)) < 0)
        goto done;

    const hsize_t ns = (hsize_t)f->num_sources;
    const struct {
        const char *name;
        size_t off;
    } sfields[] = {
        {"/sources/path", offsetof(fmoe_store_source, path)},
        {"/sources/created", offsetof(fmoe_store_source, created)},
        {"/sources/dataset", offsetof(fmoe_store_source, dataset)},
    };
    for (size_t k = 0; k < sizeof sfields / sizeof sfields[0]; k++) {
        for (int32_t s = 0; s < f->num_sources; s++)
            strs[s] = (const char *)&f->sources[s] + sfields[k].off;
        if ((rc = fmoe__h5_write_str_array(file, p, sfields[k].name, strs, ns)) < 0) goto done;
    }
    for (int32_t s = 0; s < f->num_sources; s++) nreq[s] = f->sources[s].num_requests;
    const hsize_t dn[1] = {ns}, du[1] = {(hsize_t)f->num_used}, dhh[1] = {(hsize_t)f->num_held_out};
    if ((rc = write_rows(file, p, "/sources/num_requests", H5T_STD_I64LE, H5T_NATIVE_INT64, 1,
                         dn, nreq, opts)) < 0 ||
        (rc = write_rows(file, p, "/requests/used_source", H5T_STD_I32LE, H5T_NATIVE_INT32, 1,
                         du, f->used_source, opts)) < 0 ||
        (rc = write_rows(file, p, "/requests/used_id", H5T_STD_I64LE, H5T_NATIVE_INT64, 1, du,
                         f->used_id, opts)) < 0 ||
        (rc = write_rows(file, p, "/requests/held_out_source", H5T_STD_I32LE, H5T_NATIVE_INT32,
                         1, dhh, f->held_out_source, opts)) < 0 ||
        (rc = write_rows(file, p, "/requests/held_out_id", H5T_STD_I64LE, H5T_NATIVE_INT64, 1,
                         dhh, f->held_out_id, opts)) < 0)
        goto done;
done:
    free(joined);
    free(strs);
    free(nreq);
    return rc;
}

struct store_args {
    const fmoe_store_file *f;
    const fmoe_trace_write_options *opts;
};

static int write_store(hid_t file, const char *partial, const void *ctx) {
    const struct store_args *a = ctx;
    return write_all(file, partial, a->f, a->opts);
}

static int store_write(const char *path, const fmoe_store_file *f,
                       const fmoe_trace_write_options *opts) {
    FMOE_RETURN_ERROR_IF(!path || !path[0] || !f, FMOE_EINVAL, "fmoe_store_write: NULL argument");
    static const fmoe_trace_write_options default_opts = {.compression = FMOE_COMPRESSION_ZSTD};
    if (!opts) opts = &default_opts;
    FMOE_FORWARD_IF_ERROR(check_file(path, f));
    FMOE_FORWARD_IF_ERROR(fmoe__h5_init());
    const struct store_args args = {f, opts};
    return fmoe__h5_write_atomically(path, write_store, &args);
}

int fmoe_store_write(const char *path, const fmoe_store_file *f,
                     const fmoe_trace_write_options *opts) {
    fmoe__h5_lock();
    int rc = store_write(path, f, opts);
    fmoe__h5_unlock();
    return rc;
}
