/*
 * store_reader.c - reads and validates expert-map store files (docs/design.md §5; contract in
 * fmoe/store.h).
 *
 * Everything a file claims is checked before it sizes an allocation or reaches the
 * matcher: attribute ranges, each dataset's element class and shape against the
 * attributes, that the datasets are backed by stored data (a forged extent is refused),
 * that map values are probabilities and embeddings finite, and that request lists point
 * at listed sources. Entries go into the in-memory store with fmoe_expertmap_set (no
 * deduplication: the file already is the store), read a block of rows at a time.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/expertmap.h"
#include "fmoe/store.h"
#include "hdf5_guard.h"
#include "hdf5_util.h"
#include "store_impl.h"
#include "trace_impl.h"

#define BLOCK_ROWS 1024

typedef struct reader {
    const char *path;
    hid_t file;
} reader;

static int int_attr(reader *r, const char *name, int64_t lo, int64_t hi, int64_t *out) {
    return fmoe__h5_root_attr_int(r->file, r->path, name, lo, hi, out);
}

static int str_attr(reader *r, const char *name, char *out, size_t cap) {
    return fmoe__h5_root_attr_str(r->file, r->path, name, out, cap);
}

static int scalar_attr(reader *r, const char *name, H5T_class_t cls, hid_t mem, void *out) {
    char msg[256];
    htri_t ex = H5Aexists(r->file, name);
    FMOE_RETURN_ERROR_IF(ex <= 0, FMOE_EFORMAT, "%s: /: attribute '%s' is missing", r->path, name);
    hid_t a = H5Aopen(r->file, name, H5P_DEFAULT);
    hid_t t = a >= 0 ? H5Aget_type(a) : -1;
    hid_t sp = a >= 0 ? H5Aget_space(a) : -1;
    int rc = 0;
    if (a < 0 || t < 0 || sp < 0)
        rc = fmoe_error_set(FMOE_EFORMAT, "%s: /: cannot read attribute '%s': %s", r->path, name,
                            fmoe__h5_errmsg(msg, sizeof msg));
    else if (H5Tget_class(t) != cls || H5Sget_simple_extent_npoints(sp) != 1)
        rc = fmoe_error_set(FMOE_EFORMAT, "%s: /: attribute '%s' is not a scalar %s", r->path,
                            name, cls == H5T_FLOAT ? "float" : "integer");
    else if (H5Aread(a, mem, out) < 0)
        rc = fmoe_error_set(FMOE_EFORMAT, "%s: /: cannot read attribute '%s': %s", r->path, name,
                            fmoe__h5_errmsg(msg, sizeof msg));
    if (sp >= 0) H5Sclose(sp);
    if (t >= 0) H5Tclose(t);
    if (a >= 0) H5Aclose(a);
    return rc;
}

/* Opens `name`, checks its class and shape (want[i] < 0: any; *rows gets dims[0]). */
static hid_t open_ds(reader *r, const char *name, H5T_class_t cls, int rank, const int64_t *want,
                     int64_t *rows) {
    char msg[256], tname[32];
    hid_t d = fmoe__h5_dataset_open(r->file, r->path, name);
    if (d < 0) return d == FMOE_ENOTFOUND ? FMOE_EFORMAT : d;
    hid_t t = H5Dget_type(d), sp = H5Dget_space(d);
    hsize_t dims[8] = {0};
    int rc = 0;
    int n = sp >= 0 ? H5Sget_simple_extent_ndims(sp) : -1;
    if (t < 0 || sp < 0 || n < 0 || n > 8 || H5Sget_simple_extent_dims(sp, dims, NULL) < 0) {
        rc = fmoe_error_set(FMOE_EFORMAT, "%s: %s: cannot read its type and shape: %s", r->path,
                            name, fmoe__h5_errmsg(msg, sizeof msg));
    } else if (H5Tget_class(t) != cls) {
        rc = fmoe_error_set(FMOE_EFORMAT, "%s: %s has type %s, expected %s", r->path, name,
                            fmoe__h5_type_name(t, tname, sizeof tname),
                            cls == H5T_FLOAT     ? "a float type"
                            : cls == H5T_INTEGER ? "an integer type"
                                                 : "strings");
    } else {
        int ok = n == rank;
        for (int i = 0; ok && i < rank; i++) ok = want[i] < 0 || (int64_t)dims[i] == want[i];
        if (!ok) {
            int64_t got[8], w[8];
            char gs[128], ws[128];
            for (int i = 0; i < n; i++) got[i] = (int64_t)dims[i];
            for (int i = 0; i < rank; i++) w[i] = want[i] < 0 ? (int64_t)dims[i] : want[i];
            rc = fmoe_error_set(FMOE_EFORMAT, "%s: %s has shape %s, expected %s", r->path, name,
                                fmoe__dims_str(gs, sizeof gs, n, got),
                                fmoe__dims_str(ws, sizeof ws, rank, w));
        } else if (cls != H5T_STRING) {
            rc = fmoe__h5_check_stored(d, r->path, name);
        }
    }
    if (rc == 0 && rows) *rows = (int64_t)dims[0];
    if (sp >= 0) H5Sclose(sp);
    if (t >= 0) H5Tclose(t);
    if (rc < 0) {
        H5Dclose(d);
        return rc;
    }
    return d;
}

/* Reads a 1-D integer dataset of exactly n rows. */
static int read_ints(reader *r, const char *name, int64_t n, hid_t mem, void *out) {
    const int64_t want[1] = {n};
    hid_t d = open_ds(r, name, H5T_INTEGER, 1, want, NULL);
    if (d < 0) return (int)d;
    int rc = fmoe__h5_dataset_read_rows(d, r->path, name, mem, 0, (hsize_t)n, out);
    H5Dclose(d);
    return rc;
}

/* Reads n variable-length strings into dst + i * stride (cap bytes each, truncated). */
static int read_strs(reader *r, const char *name, int64_t n, char *dst, size_t stride, size_t cap) {
    const int64_t want[1] = {n};
    hid_t d = open_ds(r, name, H5T_STRING, 1, want, NULL);
    if (d < 0) return (int)d;
    char msg[256];
    int rc = 0;
    hid_t ft = H5Dget_type(d);
    hid_t mem = H5Tcopy(H5T_C_S1);
    char **v = calloc((size_t)(n ? n : 1), sizeof *v);
    if (ft < 0 || mem < 0 || !v) {
        rc = fmoe_error_set(FMOE_ENOMEM, "%s: %s: out of memory", r->path, name);
        goto done;
    }
    if (H5Tis_variable_str(ft) <= 0) {
        rc = fmoe_error_set(FMOE_EFORMAT, "%s: %s: expected variable-length strings", r->path, name);
        goto done;
    }
    if ((rc = fmoe__h5_vlen_check(d, 0, n, r->path, name)) < 0) goto done;
    if (H5Tset_size(mem, H5T_VARIABLE) < 0 || H5Tset_cset(mem, H5Tget_cset(ft)) < 0 ||
        (n > 0 && fmoe__h5_dread(d, mem, H5S_ALL, H5S_ALL, v) < 0)) {
        rc = fmoe_error_set(FMOE_EFORMAT, "%s: %s: cannot read: %s", r->path, name,
                            fmoe__h5_errmsg(msg, sizeof msg));
        goto done;
    }
    for (int64_t i = 0; i < n; i++) {
        const char *s = v[i] ? v[i] : "";
        const size_t len = strlen(s);
        if (!fmoe__utf8_valid(s, len)) {
            rc = fmoe_error_set(FMOE_EFORMAT, "%s: %s[%lld] is not valid UTF-8", r->path, name,
                                (long long)i);
            break;
        }
        snprintf(dst + (size_t)i * stride, cap, "%s", s);
    }
    for (int64_t i = 0; i < n; i++)
        if (v[i]) H5free_memory(v[i]);
done:
    free(v);
    if (mem >= 0) H5Tclose(mem);
    if (ft >= 0) H5Tclose(ft);
    H5Dclose(d);
    return rc;
}

static int read_entries(reader *r, fmoe_store_file *f, int32_t E) {
    const fmoe_expertmap_config *c = fmoe_expertmap_config_of(f->store);
    const int64_t L = c->num_layers, J = c->num_experts, h = c->semantic_dim;
    const int64_t wm[3] = {E, L, J}, ws[2] = {E, h}, wh[1] = {E};
    hid_t dm = -1, ds = -1, dh = -1;
    float *maps = NULL, *sem = NULL;
    uint32_t *hits = NULL;
    int rc = 0;
    if ((dm = open_ds(r, "/maps", H5T_FLOAT, 3, wm, NULL)) < 0) return (int)dm;
    if (h > 0 && (ds = open_ds(r, "/semantic", H5T_FLOAT, 2, ws, NULL)) < 0) {
        rc = (int)ds;
        goto done;
    }
    const int sem_ex = h == 0 ? fmoe__h5_exists(r->file, r->path, "/semantic") : 0;
    if (sem_ex != 0) {
        rc = sem_ex < 0 ? sem_ex
                        : fmoe_error_set(FMOE_EFORMAT,
                                         "%s: /semantic is present but attribute semantic_dim "
                                         "is 0",
                                         r->path);
        goto done;
    }
    if ((dh = open_ds(r, "/hits", H5T_INTEGER, 1, wh, NULL)) < 0) {
        rc = (int)dh;
        goto done;
    }
    const int64_t B = E < BLOCK_ROWS ? (E ? E : 1) : BLOCK_ROWS;
    maps = malloc((size_t)B * L * J * sizeof *maps);
    sem = h ? malloc((size_t)B * h * sizeof *sem) : NULL;
    hits = malloc((size_t)B * sizeof *hits);
    if (!maps || (h && !sem) || !hits) {
        rc = fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", r->path);
        goto done;
    }
    for (int64_t y0 = 0; y0 < E; y0 += B) {
        const int64_t n = E - y0 < B ? E - y0 : B;
        if ((rc = fmoe__h5_dataset_read_rows(dm, r->path, "/maps", H5T_NATIVE_FLOAT, (hsize_t)y0,
                                             (hsize_t)n, maps)) < 0 ||
            (h && (rc = fmoe__h5_dataset_read_rows(ds, r->path, "/semantic", H5T_NATIVE_FLOAT,
                                                   (hsize_t)y0, (hsize_t)n, sem)) < 0) ||
            (rc = fmoe__h5_dataset_read_rows(dh, r->path, "/hits", H5T_NATIVE_UINT32, (hsize_t)y0,
                                             (hsize_t)n, hits)) < 0)
            goto done;
        for (int64_t i = 0; i < n * L * J; i++) {
            const float p = maps[i];
            if (!isfinite(p) || p < -FMOE_TRACE_PROB_TOL || p > 1.0f + FMOE_TRACE_PROB_TOL) {
                const int64_t e = y0 + i / (L * J);
                rc = fmoe_error_set(FMOE_EFORMAT,
                                    "%s: /maps[%lld][%lld][%lld] = %g, expected a probability in "
                                    "[0, 1]",
                                    r->path, (long long)e, (long long)(i / J % L),
                                    (long long)(i % J), (double)p);
                goto done;
            }
        }
        for (int64_t i = 0; i < n * h; i++) {
            if (!isfinite(sem[i])) {
                rc = fmoe_error_set(FMOE_EFORMAT, "%s: /semantic[%lld][%lld] = %g, expected finite",
                                    r->path, (long long)(y0 + i / h), (long long)(i % h),
                                    (double)sem[i]);
                goto done;
            }
        }
        for (int64_t i = 0; i < n; i++)
            if ((rc = fmoe_expertmap_set(f->store, (int32_t)(y0 + i), h ? sem + i * h : NULL,
                                         maps + i * L * J, hits[i])) < 0)
                goto done;
    }
done:
    free(maps);
    free(sem);
    free(hits);
    if (dm >= 0) H5Dclose(dm);
    if (ds >= 0) H5Dclose(ds);
    if (dh >= 0) H5Dclose(dh);
    return rc;
}

static int read_file(reader *r, int32_t max_batch, fmoe_store_file *f) {
    const char *p = r->path;
    FMOE_FORWARD_IF_ERROR(fmoe__h5_check_format(
        r->file, p, "store", FMOE_STORE_FORMAT, FMOE_STORE_VERSION, FMOE_TRACE_FORMAT,
        " (this is a trace: build a store from it with fmoe build-store)"));
    int64_t C, E, L, J, K, h, d, U, H, T;
    FMOE_FORWARD_IF_ERROR(int_attr(r, "capacity", 1, INT32_MAX, &C));
    FMOE_FORWARD_IF_ERROR(int_attr(r, "size", 0, C, &E));
    FMOE_FORWARD_IF_ERROR(int_attr(r, "num_layers", 1, FMOE_TRACE_MAX_LAYERS, &L));
    FMOE_FORWARD_IF_ERROR(int_attr(r, "num_experts", 1, FMOE_TRACE_MAX_EXPERTS, &J));
    FMOE_FORWARD_IF_ERROR(int_attr(r, "top_k", 1, J, &K));
    FMOE_FORWARD_IF_ERROR(int_attr(r, "semantic_dim", 0, FMOE_TRACE_MAX_SEMANTIC, &h));
    FMOE_FORWARD_IF_ERROR(int_attr(r, "prefetch_distance", 0, L - 1, &d));
    FMOE_FORWARD_IF_ERROR(int_attr(r, "requests_used", 0, INT64_MAX, &U));
    FMOE_FORWARD_IF_ERROR(int_attr(r, "requests_held_out", 0, INT64_MAX, &H));
    FMOE_FORWARD_IF_ERROR(int_attr(r, "tokens_used", 0, INT64_MAX, &T));
    FMOE_FORWARD_IF_ERROR(scalar_attr(r, "split", H5T_FLOAT, H5T_NATIVE_DOUBLE, &f->split));
    FMOE_RETURN_ERROR_IF(!(f->split > 0 && f->split <= 1), FMOE_EFORMAT,
                         "%s: /: attribute split = %g, expected a share in (0, 1]", p, f->split);
    FMOE_FORWARD_IF_ERROR(
        scalar_attr(r, "split_seed", H5T_INTEGER, H5T_NATIVE_UINT64, &f->split_seed));
    FMOE_FORWARD_IF_ERROR(str_attr(r, "model_name", f->model_name, sizeof f->model_name));
    FMOE_FORWARD_IF_ERROR(
        str_attr(r, "model_fingerprint", f->model_fingerprint, sizeof f->model_fingerprint));
    char kind[32];
    FMOE_FORWARD_IF_ERROR(str_attr(r, "probs_kind", kind, sizeof kind));
    FMOE_RETURN_ERROR_IF(fmoe__probs_kind_parse(kind, &f->probs_kind) < 0 ||
                             f->probs_kind == FMOE_PROBS_NONE,
                         FMOE_EFORMAT, "%s: /: attribute probs_kind = '%s', expected full or topk",
                         p, kind);
    FMOE_FORWARD_IF_ERROR(str_attr(r, "semantic_kind", f->semantic_kind, sizeof f->semantic_kind));
    FMOE_FORWARD_IF_ERROR(str_attr(r, "created", f->created, sizeof f->created));
    FMOE_FORWARD_IF_ERROR(str_attr(r, "fmoe_version", f->fmoe_version, sizeof f->fmoe_version));
    FMOE_RETURN_ERROR_IF(C * (L * J + h) > ((int64_t)1 << 36), FMOE_EFORMAT,
                         "%s: /: capacity %lld of %lld-float entries is too large", p,
                         (long long)C, (long long)(L * J + h));
    f->tokens_used = T;
    /* optional (stores written before it have none): the capacity asked at build time */
    int64_t asked = C;
    const int rc_asked = fmoe__h5_attr_read_int(r->file, r->path, "/", "capacity_asked", &asked);
    if (rc_asked < 0 && rc_asked != FMOE_ENOTFOUND) return rc_asked;
    FMOE_RETURN_ERROR_IF(asked < C || asked > INT32_MAX, FMOE_EFORMAT,
                         "%s: /: attribute capacity_asked = %lld, expected %lld..%d", p,
                         (long long)asked, (long long)C, INT32_MAX);
    f->capacity_asked = (int32_t)asked;

    const fmoe_expertmap_config cfg = {.capacity = (int32_t)C, .num_layers = (int32_t)L,
                                       .num_experts = (int32_t)J, .top_k = (int32_t)K,
                                       .semantic_dim = (int32_t)h,
                                       .prefetch_distance = (int32_t)d, .max_batch = max_batch};
    int rc = fmoe_expertmap_init(&f->store, &cfg);
    if (rc < 0) {
        fmoe_error_prefix("%s", p);
        return rc;
    }
    FMOE_FORWARD_IF_ERROR(read_entries(r, f, (int32_t)E));

    /* sources: their count is the extent of /sources/path */
    int64_t S = 0;
    const int64_t any[1] = {-1};
    hid_t dp = open_ds(r, "/sources/path", H5T_STRING, 1, any, &S);
    if (dp < 0) return (int)dp;
    H5Dclose(dp);
    FMOE_RETURN_ERROR_IF(S > 1000000, FMOE_EFORMAT, "%s: /sources/path lists %lld traces", p,
                         (long long)S);
    f->num_sources = (int32_t)S;
    f->sources = calloc((size_t)(S ? S : 1), sizeof *f->sources);
    int64_t *nreq = calloc((size_t)(S ? S : 1), sizeof *nreq);
    if (!f->sources || !nreq) {
        free(nreq);
        return fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", p);
    }
    const size_t st = sizeof *f->sources;
    if ((rc = read_strs(r, "/sources/path", S, f->sources[0].path, st, sizeof f->sources[0].path)) < 0 ||
        (rc = read_strs(r, "/sources/created", S, f->sources[0].created, st,
                        sizeof f->sources[0].created)) < 0 ||
        (rc = read_strs(r, "/sources/dataset", S, f->sources[0].dataset, st,
                        sizeof f->sources[0].dataset)) < 0 ||
        (rc = read_ints(r, "/sources/num_requests", S, H5T_NATIVE_INT64, nreq)) < 0) {
        free(nreq);
        return rc;
    }
    for (int64_t s = 0; s < S; s++) f->sources[s].num_requests = nreq[s];
    free(nreq);

    /* request lists: their lengths must agree with the attributes */
    f->num_used = U;
    f->num_held_out = H;
    f->used_source = malloc((size_t)(U ? U : 1) * sizeof *f->used_source);
    f->used_id = malloc((size_t)(U ? U : 1) * sizeof *f->used_id);
    f->held_out_source = malloc((size_t)(H ? H : 1) * sizeof *f->held_out_source);
    f->held_out_id = malloc((size_t)(H ? H : 1) * sizeof *f->held_out_id);
    if (!f->used_source || !f->used_id || !f->held_out_source || !f->held_out_id)
        return fmoe_error_set(FMOE_ENOMEM, "%s: request lists of %lld + %lld", p, (long long)U,
                              (long long)H);
    FMOE_FORWARD_IF_ERROR(read_ints(r, "/requests/used_source", U, H5T_NATIVE_INT32, f->used_source));
    FMOE_FORWARD_IF_ERROR(read_ints(r, "/requests/used_id", U, H5T_NATIVE_INT64, f->used_id));
    FMOE_FORWARD_IF_ERROR(
        read_ints(r, "/requests/held_out_source", H, H5T_NATIVE_INT32, f->held_out_source));
    FMOE_FORWARD_IF_ERROR(read_ints(r, "/requests/held_out_id", H, H5T_NATIVE_INT64, f->held_out_id));
    for (int64_t i = 0; i < U; i++)
        FMOE_RETURN_ERROR_IF(f->used_source[i] < 0 || f->used_source[i] >= S, FMOE_EFORMAT,
                             "%s: /requests/used_source[%lld] = %d, expected 0..%lld (a source)",
                             p, (long long)i, f->used_source[i], (long long)S - 1);
    for (int64_t i = 0; i < H; i++)
        FMOE_RETURN_ERROR_IF(f->held_out_source[i] < 0 || f->held_out_source[i] >= S,
                             FMOE_EFORMAT,
                             "%s: /requests/held_out_source[%lld] = %d, expected 0..%lld", p,
                             (long long)i, f->held_out_source[i], (long long)S - 1);
    return 0;
}

void fmoe_store_file_free(fmoe_store_file *f) {
    if (!f) return;
    fmoe_expertmap_free(f->store);
    free(f->sources);
    free(f->used_source);
    free(f->used_id);
    free(f->held_out_source);
    free(f->held_out_id);
    free(f);
}

static int store_read(const char *path, int32_t max_batch, const void *image, size_t size,
                      fmoe_store_file **out) {
    FMOE_RETURN_ERROR_IF(!path || !out, FMOE_EINVAL, "fmoe_store_read: NULL argument");
    *out = NULL;
    FMOE_FORWARD_IF_ERROR(fmoe__h5_init());
    reader r = {.path = path, .file = fmoe__h5_open_read(path, image, size, "store")};
    if (r.file < 0) return (int)r.file;
    fmoe_store_file *f = calloc(1, sizeof *f);
    int rc = f ? read_file(&r, max_batch, f) : fmoe_error_set(FMOE_ENOMEM, "%s", path);
    H5Fclose(r.file);
    if (rc < 0) {
        fmoe_store_file_free(f);
        return rc;
    }
    *out = f;
    return 0;
}

int fmoe_store_read(const char *path, int32_t max_batch, fmoe_store_file **out) {
    fmoe__h5_lock();
    int rc = store_read(path, max_batch, NULL, 0, out);
    fmoe__h5_unlock();
    return rc;
}

int fmoe__store_read_image(const void *image, size_t size, const char *name, int32_t max_batch,
                           fmoe_store_file **out) {
    fmoe__h5_lock();
    int rc = store_read(name, max_batch, image ? image : "", size, out);
    fmoe__h5_unlock();
    return rc;
}

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

int32_t fmoe_store_find_source(const fmoe_store_file *f, const fmoe_trace_header *h,
                               int64_t num_requests, const char *path) {
    int32_t found = -1;
    for (int32_t s = 0; s < f->num_sources; s++) {
        const fmoe_store_source *src = &f->sources[s];
        if (src->num_requests != num_requests || strcmp(src->created, h->created) != 0) continue;
        if (found < 0) found = s;
        if (path && strcmp(base_name(src->path), base_name(path)) == 0) return s;
    }
    return found;
}
