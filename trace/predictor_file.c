/*
 * predictor_file.c - the learned-predictor file (HDF5, format "fmoe-predictor", version 1;
 * contract in fmoe/predictor.h), and a reader of a trace's gate inputs (/tokens/hidden).
 *
 * Layout:
 *   /                root attributes: format, version, kind, stride, model_fingerprint,
 *                    model_name, num_layers, num_experts, top_k, hidden_size, mlp_hidden,
 *                    target, seed, split, created, fmoe_version
 *   /layers/<i>/     for i = 1..L-1 (layer 0 has no predictor: nothing precedes it);
 *                    attributes source_layer (max(i - stride, 0)), val_accuracy;
 *                    W1 float32 [H][h], b1 [H], W2 [J][H], b2 [J] (nn.Linear layout:
 *                    p = softmax(W2 · relu(W1 · x + b1) + b2))
 *
 * Kind duoserve (DuoServe-MoE's ExpertMLP and tables, fmoe_predictor_alloc_duoserve):
 *   /                the common root attributes (format, version, kind, model_fingerprint,
 *                    model_name, num_layers, num_experts, top_k, target, seed, split,
 *                    created, fmoe_version) and duoserve_version, stride (1), num_fc,
 *                    dropout, bn_eps
 *   /popularity      float32 [L][J] (Eq. 2)      /affinity  float32 [L-1][J][J] (Eq. 3)
 *   /val_all_correct, /val_one_correct  float32 [L], NaN at layer 0 (Table 3)
 *   /expert_mlp/<i>/ for FC layer i = 0..num_fc-1: W [w_{i+1}][w_i], b [w_{i+1}]; hidden
 *                    layers also bn_gamma, bn_beta, bn_running_mean, bn_running_var
 *                    [w_{i+1}] (PyTorch's BatchNorm1d weight, bias, running_mean,
 *                    running_var); the widths are the shapes of the W
 *
 * The weights are small (about 2M parameters per layer at real sizes), so the datasets are
 * contiguous and uncompressed: any HDF5 reader opens them without a filter. Written as
 * "<path>.partial" and renamed when complete, as every fmoe file (lib/files.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fmoe/error.h"
#include "half.h"
#include "fmoe/predictor.h"
#include "fmoe/trace.h"
#include "fmoe_config.h"
#include "hdf5_util.h"
#include "predictor_impl.h"

#define MAX_LAYERS 65535
#define MAX_EXPERTS 65535
#define MAX_WIDTH (1 << 24)
#define MAX_MATRIX ((int64_t)1 << 30) /* elements of one weight matrix */

/* ---------------------------------------------------------------------------------------
 * Writing
 * ------------------------------------------------------------------------------------- */

static int write_f32(hid_t loc, const char *path, const char *name, int rank, const hsize_t *dims,
                     const float *data) {
    char msg[256];
    hid_t space = H5Screate_simple(rank, dims, NULL);
    hid_t d = space < 0 ? -1
                        : H5Dcreate2(loc, name, H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT,
                                     H5P_DEFAULT);
    const int ok = d >= 0 && H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0;
    /* The reason first: the closes below clear HDF5's error stack, which left only "HDF5
     * call failed" where a full disk should say "No space left on device". */
    if (!ok) fmoe__h5_errmsg(msg, sizeof msg);
    if (d >= 0) H5Dclose(d);
    if (space >= 0) H5Sclose(space);
    if (!ok) return fmoe_error_set(FMOE_EIO, "%s: cannot write %s: %s", path, name, msg);
    return 0;
}

static int write_layer(hid_t file, const char *path, const fmoe_predictor *p, int32_t i) {
    char name[64], msg[256];
    snprintf(name, sizeof name, "/layers/%d", i);
    hid_t g = H5Gcreate2(file, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (g < 0)
        return fmoe_error_set(FMOE_EIO, "%s: cannot create %s: %s", path, name,
                              fmoe__h5_errmsg(msg, sizeof msg));
    const fmoe_mlp *m = &p->layers[i];
    const hsize_t d_w1[2] = {(hsize_t)m->hidden, (hsize_t)m->in}, d_b1[1] = {(hsize_t)m->hidden},
                  d_w2[2] = {(hsize_t)m->out, (hsize_t)m->hidden}, d_b2[1] = {(hsize_t)m->out};
    int rc = fmoe__h5_attr_write_int(g, path, "source_layer", H5T_STD_I32LE, p->source_layer[i]);
    if (rc == 0) rc = fmoe__h5_attr_write_f64(g, path, "val_accuracy", p->val_accuracy[i]);
    if (rc == 0) rc = write_f32(g, path, "W1", 2, d_w1, m->w1);
    if (rc == 0) rc = write_f32(g, path, "b1", 1, d_b1, m->b1);
    if (rc == 0) rc = write_f32(g, path, "W2", 2, d_w2, m->w2);
    if (rc == 0) rc = write_f32(g, path, "b2", 1, d_b2, m->b2);
    H5Gclose(g);
    return rc;
}

static int write_duoserve(hid_t file, const char *path, const fmoe_predictor *p);

static int write_all(hid_t file, const char *path, const fmoe_predictor *p) {
    char created[32], msg[256];
    if (p->created[0]) {
        snprintf(created, sizeof created, "%s", p->created);
    } else {
        time_t now = time(NULL);
        struct tm tm;
        gmtime_r(&now, &tm);
        strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%SZ", &tm);
    }
    const fmoe__h5_str_attr sattrs[] = {
        {"format", FMOE_PREDICTOR_FORMAT},
        {"kind", p->kind},
        {"model_fingerprint", p->model_fingerprint},
        {"model_name", p->model_name},
        {"target", p->target},
        {"created", created},
        {"fmoe_version", p->fmoe_version[0] ? p->fmoe_version : FMOE_VERSION},
    };
    const int duo = strcmp(p->kind, FMOE_PREDICTOR_KIND_DUOSERVE) == 0;
    const fmoe__h5_int_attr iattrs[] = {
        {"version", H5T_STD_I32LE, FMOE_PREDICTOR_VERSION},
        {"stride", H5T_STD_I32LE, p->stride},
        {"num_layers", H5T_STD_I32LE, p->num_layers},
        {"num_experts", H5T_STD_I32LE, p->num_experts},
        {"top_k", H5T_STD_I32LE, p->top_k},
        {"seed", H5T_STD_I64LE, p->seed},
        /* promoe only (a duoserve predictor reads no gate input) */
        {"hidden_size", H5T_STD_I32LE, p->hidden_size},
        {"mlp_hidden", H5T_STD_I32LE, p->mlp_hidden},
    };
    FMOE_FORWARD_IF_ERROR(fmoe__h5_attrs_write(file, path, sattrs,
                                               sizeof sattrs / sizeof sattrs[0], iattrs,
                                               sizeof iattrs / sizeof iattrs[0] - 2 * duo));
    FMOE_FORWARD_IF_ERROR(fmoe__h5_attr_write_f64(file, path, "split", p->split));
    if (duo) return write_duoserve(file, path, p);
    hid_t g = H5Gcreate2(file, "/layers", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (g < 0)
        return fmoe_error_set(FMOE_EIO, "%s: cannot create /layers: %s", path,
                              fmoe__h5_errmsg(msg, sizeof msg));
    H5Gclose(g);
    for (int32_t i = 1; i < p->num_layers; i++) FMOE_FORWARD_IF_ERROR(write_layer(file, path, p, i));
    return 0;
}

static int make_group(hid_t file, const char *path, const char *name) {
    char msg[256];
    hid_t g = H5Gcreate2(file, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (g < 0)
        return fmoe_error_set(FMOE_EIO, "%s: cannot create %s: %s", path, name,
                              fmoe__h5_errmsg(msg, sizeof msg));
    H5Gclose(g);
    return 0;
}

static int write_duoserve(hid_t file, const char *path, const fmoe_predictor *p) {
    const fmoe_expert_mlp *m = p->expert_mlp;
    const hsize_t L = (hsize_t)p->num_layers, J = (hsize_t)p->num_experts;
    FMOE_FORWARD_IF_ERROR(fmoe__h5_attr_write_int(file, path, "duoserve_version", H5T_STD_I32LE,
                                                  FMOE_PREDICTOR_DUOSERVE_VERSION));
    FMOE_FORWARD_IF_ERROR(fmoe__h5_attr_write_int(file, path, "num_fc", H5T_STD_I32LE, m->num_fc));
    FMOE_FORWARD_IF_ERROR(fmoe__h5_attr_write_f64(file, path, "dropout", m->dropout));
    FMOE_FORWARD_IF_ERROR(fmoe__h5_attr_write_f64(file, path, "bn_eps", m->bn_eps));
    const hsize_t d_pop[2] = {L, J}, d_aff[3] = {L - 1, J, J}, d_val[1] = {L};
    FMOE_FORWARD_IF_ERROR(write_f32(file, path, "popularity", 2, d_pop, p->popularity));
    FMOE_FORWARD_IF_ERROR(write_f32(file, path, "affinity", 3, d_aff, p->affinity));
    FMOE_FORWARD_IF_ERROR(write_f32(file, path, "val_all_correct", 1, d_val, p->val_all_correct));
    FMOE_FORWARD_IF_ERROR(write_f32(file, path, "val_one_correct", 1, d_val, p->val_one_correct));
    FMOE_FORWARD_IF_ERROR(make_group(file, path, "/expert_mlp"));
    char name[64], msg[256];
    for (int32_t i = 0; i < m->num_fc; i++) {
        snprintf(name, sizeof name, "/expert_mlp/%d", i);
        hid_t g = H5Gcreate2(file, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        if (g < 0)
            return fmoe_error_set(FMOE_EIO, "%s: cannot create %s: %s", path, name,
                                  fmoe__h5_errmsg(msg, sizeof msg));
        const hsize_t d_w[2] = {(hsize_t)m->width[i + 1], (hsize_t)m->width[i]},
                      d_b[1] = {(hsize_t)m->width[i + 1]};
        int rc = write_f32(g, path, "W", 2, d_w, m->params + m->w_off[i]);
        if (rc == 0) rc = write_f32(g, path, "b", 1, d_b, m->params + m->b_off[i]);
        if (i < m->num_fc - 1) {
            if (rc == 0) rc = write_f32(g, path, "bn_gamma", 1, d_b, m->params + m->gamma_off[i]);
            if (rc == 0) rc = write_f32(g, path, "bn_beta", 1, d_b, m->params + m->beta_off[i]);
            if (rc == 0) rc = write_f32(g, path, "bn_running_mean", 1, d_b, m->running_mean[i]);
            if (rc == 0) rc = write_f32(g, path, "bn_running_var", 1, d_b, m->running_var[i]);
        }
        H5Gclose(g);
        FMOE_FORWARD_IF_ERROR(rc);
    }
    return 0;
}

static int check_predictor(const char *path, const fmoe_predictor *p) {
    if (strcmp(p->kind, FMOE_PREDICTOR_KIND_DUOSERVE) == 0) {
        const fmoe_expert_mlp *m = p->expert_mlp;
        FMOE_RETURN_ERROR_IF(!m || !m->params || !p->popularity || !p->affinity ||
                                 !p->val_all_correct || !p->val_one_correct ||
                                 p->num_layers < 2 ||
                                 m->width[0] != fmoe_duoserve_input_dim(p->num_layers,
                                                                        p->num_experts) ||
                                 m->width[m->num_fc] != p->num_experts,
                             FMOE_EINVAL, "%s: an incomplete duoserve predictor", path);
        return 0;
    }
    FMOE_RETURN_ERROR_IF(strcmp(p->kind, FMOE_PREDICTOR_KIND_PROMOE) != 0, FMOE_EINVAL,
                         "%s: kind '%s', expected promoe or duoserve", path, p->kind);
    FMOE_RETURN_ERROR_IF(p->num_layers < 2 || p->stride < 1 || p->stride >= p->num_layers,
                         FMOE_EINVAL, "%s: %d layers, stride %d", path, p->num_layers, p->stride);
    for (int32_t i = 1; i < p->num_layers; i++) {
        const fmoe_mlp *m = &p->layers[i];
        FMOE_RETURN_ERROR_IF(!m->w1 || m->in != p->hidden_size || m->hidden != p->mlp_hidden ||
                                 m->out != p->num_experts,
                             FMOE_EINVAL, "%s: layer %d: MLP %d -> %d -> %d, expected %d -> %d -> %d",
                             path, i, m->in, m->hidden, m->out, p->hidden_size, p->mlp_hidden,
                             p->num_experts);
    }
    return 0;
}

static int write_predictor(hid_t file, const char *partial, const void *ctx) {
    return write_all(file, partial, ctx);
}

static int predictor_write(const char *path, const fmoe_predictor *p) {
    FMOE_RETURN_ERROR_IF(!path || !path[0] || !p, FMOE_EINVAL, "fmoe_predictor_write: NULL argument");
    FMOE_FORWARD_IF_ERROR(check_predictor(path, p));
    FMOE_FORWARD_IF_ERROR(fmoe__h5_init());
    return fmoe__h5_write_atomically(path, write_predictor, p);
}

int fmoe_predictor_write(const char *path, const fmoe_predictor *p) {
    fmoe__h5_lock();
    int rc = predictor_write(path, p);
    fmoe__h5_unlock();
    return rc;
}

/* ---------------------------------------------------------------------------------------
 * Reading
 * ------------------------------------------------------------------------------------- */

static int read_int_attr(hid_t loc, const char *path, const char *obj, const char *name,
                         int64_t lo, int64_t hi, int64_t *out) {
    int rc = fmoe__h5_attr_read_int(loc, path, obj, name, out);
    if (rc == FMOE_ENOTFOUND) rc = FMOE_EFORMAT;
    if (rc < 0) return rc;
    FMOE_RETURN_ERROR_IF(*out < lo || *out > hi, FMOE_EFORMAT,
                         "%s: %s: attribute '%s' is %lld, expected %lld..%lld", path, obj, name,
                         (long long)*out, (long long)lo, (long long)hi);
    return 0;
}

static int read_f64_attr(hid_t loc, const char *path, const char *obj, const char *name,
                         double *out) {
    char msg[256];
    if (!H5Aexists(loc, name))
        return fmoe_error_set(FMOE_EFORMAT, "%s: %s: attribute '%s' is missing", path, obj, name);
    hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
    hid_t type = a >= 0 ? H5Aget_type(a) : -1;
    hid_t space = a >= 0 ? H5Aget_space(a) : -1;
    int rc = 0;
    if (type < 0 || space < 0)
        rc = fmoe_error_set(FMOE_EIO, "%s: %s: cannot read attribute '%s': %s", path, obj, name,
                            fmoe__h5_errmsg(msg, sizeof msg));
    else if (H5Tget_class(type) != H5T_FLOAT || H5Sget_simple_extent_npoints(space) != 1)
        rc = fmoe_error_set(FMOE_EFORMAT, "%s: %s: attribute '%s' is not one float", path, obj,
                            name);
    else if (H5Aread(a, H5T_NATIVE_DOUBLE, out) < 0)
        rc = fmoe_error_set(FMOE_EIO, "%s: %s: cannot read attribute '%s': %s", path, obj, name,
                            fmoe__h5_errmsg(msg, sizeof msg));
    if (space >= 0) H5Sclose(space);
    if (type >= 0) H5Tclose(type);
    if (a >= 0) H5Aclose(a);
    return rc;
}

static int read_str_attr(hid_t loc, const char *path, const char *name, char *out, size_t cap) {
    int rc = fmoe__h5_attr_read_str(loc, path, "/", name, out, cap);
    if (rc == FMOE_ENOTFOUND) rc = fmoe_error_set(FMOE_EFORMAT, "%s: attribute '%s' is missing", path, name);
    return rc;
}

/* Reads float32 dataset `name` of group g, exactly dims[rank], all finite (NaN allowed
 * when allow_nan: "none"). */
static int read_f32_ex(hid_t g, const char *path, const char *obj, const char *name, int rank,
                       const hsize_t *want, float *out, int allow_nan) {
    char msg[256];
    const int ex = fmoe__h5_exists(g, path, name);
    if (ex <= 0)
        return ex < 0 ? ex : fmoe_error_set(FMOE_EFORMAT, "%s: %s/%s is missing", path, obj, name);
    hid_t d = H5Dopen2(g, name, H5P_DEFAULT);
    if (d < 0)
        return fmoe_error_set(FMOE_EFORMAT, "%s: %s/%s: cannot open as a dataset: %s", path, obj,
                              name, fmoe__h5_errmsg(msg, sizeof msg));
    hid_t type = H5Dget_type(d), space = H5Dget_space(d);
    int rc = 0;
    hsize_t dims[8] = {0};
    const int r = space >= 0 ? H5Sget_simple_extent_ndims(space) : -1;
    if (type < 0 || space < 0 || r < 0) {
        rc = fmoe_error_set(FMOE_EIO, "%s: %s/%s: cannot read: %s", path, obj, name,
                            fmoe__h5_errmsg(msg, sizeof msg));
    } else if (H5Tget_class(type) != H5T_FLOAT) {
        rc = fmoe_error_set(FMOE_EFORMAT, "%s: %s/%s is not a float dataset", path, obj, name);
    } else {
        int same = r == rank;
        if (same && r <= 8) H5Sget_simple_extent_dims(space, dims, NULL);
        for (int i = 0; same && i < rank; i++) same = dims[i] == want[i];
        if (!same) {
            char got[96] = "", exp[96] = "";
            for (int i = 0; i < r && i < 8; i++)
                snprintf(got + strlen(got), sizeof got - strlen(got), "%s%llu", i ? "," : "",
                         (unsigned long long)dims[i]);
            for (int i = 0; i < rank; i++)
                snprintf(exp + strlen(exp), sizeof exp - strlen(exp), "%s%llu", i ? "," : "",
                         (unsigned long long)want[i]);
            rc = fmoe_error_set(FMOE_EFORMAT, "%s: %s/%s has shape [%s], expected [%s]", path, obj,
                                name, got, exp);
        } else if (fmoe__h5_dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, out) < 0) {
            rc = fmoe_error_set(FMOE_EIO, "%s: %s/%s: cannot read: %s", path, obj, name,
                                fmoe__h5_errmsg(msg, sizeof msg));
        } else {
            hsize_t count = 1;
            for (int i = 0; i < rank; i++) count *= want[i];
            for (hsize_t i = 0; i < count && rc == 0; i++)
                if (!isfinite(out[i]) && !(allow_nan && isnan(out[i])))
                    rc = fmoe_error_set(FMOE_EFORMAT, "%s: %s/%s: element %llu is %g, expected a "
                                                      "finite weight",
                                        path, obj, name, (unsigned long long)i, (double)out[i]);
        }
    }
    if (space >= 0) H5Sclose(space);
    if (type >= 0) H5Tclose(type);
    H5Dclose(d);
    return rc;
}

static int read_f32(hid_t g, const char *path, const char *obj, const char *name, int rank,
                    const hsize_t *want, float *out) {
    return read_f32_ex(g, path, obj, name, rank, want, out, 0);
}

static int read_layers(hid_t file, const char *path, fmoe_predictor *p) {
    char obj[64];
    for (int32_t i = 1; i < p->num_layers; i++) {
        snprintf(obj, sizeof obj, "/layers/%d", i);
        int ex = fmoe__h5_exists(file, path, obj);
        if (ex < 0) return ex;
        FMOE_RETURN_ERROR_IF(ex == 0, FMOE_EFORMAT,
                             "%s: %s is missing (a promoe predictor has layers 1..%d)", path, obj,
                             p->num_layers - 1);
        hid_t g = H5Gopen2(file, obj, H5P_DEFAULT);
        FMOE_RETURN_ERROR_IF(g < 0, FMOE_EFORMAT, "%s: %s is not a group", path, obj);
        int64_t src = 0;
        const int32_t want_src = fmoe_promoe_source_layer(i, p->stride);
        int rc = read_int_attr(g, path, obj, "source_layer", want_src, want_src, &src);
        double acc = NAN;
        if (rc == 0 && H5Aexists(g, "val_accuracy") > 0)
            rc = read_f64_attr(g, path, obj, "val_accuracy", &acc);
        p->val_accuracy[i] = (float)acc;
        fmoe_mlp *m = &p->layers[i];
        const hsize_t d_w1[2] = {(hsize_t)m->hidden, (hsize_t)m->in},
                      d_b1[1] = {(hsize_t)m->hidden},
                      d_w2[2] = {(hsize_t)m->out, (hsize_t)m->hidden}, d_b2[1] = {(hsize_t)m->out};
        if (rc == 0) rc = read_f32(g, path, obj, "W1", 2, d_w1, m->w1);
        if (rc == 0) rc = read_f32(g, path, obj, "b1", 1, d_b1, m->b1);
        if (rc == 0) rc = read_f32(g, path, obj, "W2", 2, d_w2, m->w2);
        if (rc == 0) rc = read_f32(g, path, obj, "b2", 1, d_b2, m->b2);
        H5Gclose(g);
        FMOE_FORWARD_IF_ERROR(rc);
    }
    return 0;
}

/* The shape of dataset `name` of group g into dims (rank 2 expected). */
static int dataset_dims2(hid_t g, const char *path, const char *obj, const char *name,
                         hsize_t *dims) {
    const int ex = fmoe__h5_exists(g, path, name);
    if (ex <= 0)
        return ex < 0 ? ex : fmoe_error_set(FMOE_EFORMAT, "%s: %s/%s is missing", path, obj, name);
    hid_t d = H5Dopen2(g, name, H5P_DEFAULT);
    if (d < 0) return fmoe_error_set(FMOE_EFORMAT, "%s: %s/%s is not a dataset", path, obj, name);
    hid_t space = H5Dget_space(d);
    const int r = space >= 0 ? H5Sget_simple_extent_ndims(space) : -1;
    int rc = 0;
    if (r != 2)
        rc = fmoe_error_set(FMOE_EFORMAT, "%s: %s/%s has rank %d, expected 2", path, obj, name, r);
    else
        H5Sget_simple_extent_dims(space, dims, NULL);
    if (space >= 0) H5Sclose(space);
    H5Dclose(d);
    return rc;
}

/* Every value of v[n] in [lo, hi]; rows of `row` values summing to 1 (within 1e-3) or to 0
 * when row > 0. */
static int check_table(const char *path, const char *name, const float *v, int64_t n,
                       int64_t row, double lo, double hi) {
    for (int64_t i = 0; i < n; i++)
        FMOE_RETURN_ERROR_IF(!(v[i] >= lo && v[i] <= hi), FMOE_EFORMAT,
                             "%s: /%s: element %lld is %g, expected %g..%g", path, name,
                             (long long)i, (double)v[i], lo, hi);
    for (int64_t r0 = 0; row > 0 && r0 < n; r0 += row) {
        double s = 0;
        for (int64_t i = 0; i < row; i++) s += v[r0 + i];
        FMOE_RETURN_ERROR_IF(s != 0 && fabs(s - 1) > 1e-3, FMOE_EFORMAT,
                             "%s: /%s: row %lld sums to %g, expected 1 (a distribution) or 0",
                             path, name, (long long)(r0 / row), s);
    }
    return 0;
}

/* The root attributes both kinds of predictor file carry (write_all writes them). */
static int read_common_attrs(hid_t file, const char *path, fmoe_predictor *p) {
    int rc = read_str_attr(file, path, "model_fingerprint", p->model_fingerprint,
                           sizeof p->model_fingerprint);
    if (rc == 0) rc = read_str_attr(file, path, "model_name", p->model_name, sizeof p->model_name);
    if (rc == 0) rc = read_str_attr(file, path, "target", p->target, sizeof p->target);
    if (rc == 0) rc = read_str_attr(file, path, "created", p->created, sizeof p->created);
    if (rc == 0)
        rc = read_str_attr(file, path, "fmoe_version", p->fmoe_version, sizeof p->fmoe_version);
    if (rc == 0) rc = read_f64_attr(file, path, "/", "split", &p->split);
    return rc;
}

static int read_duoserve_body(hid_t file, const char *path, fmoe_predictor *p) {
    const fmoe_expert_mlp *m = p->expert_mlp;
    const hsize_t L = (hsize_t)p->num_layers, J = (hsize_t)p->num_experts;
    const hsize_t d_pop[2] = {L, J}, d_aff[3] = {L - 1, J, J}, d_val[1] = {L};
    FMOE_FORWARD_IF_ERROR(read_f32(file, path, "", "popularity", 2, d_pop, p->popularity));
    FMOE_FORWARD_IF_ERROR(check_table(path, "popularity", p->popularity, (int64_t)(L * J),
                                      (int64_t)J, 0, 1));
    FMOE_FORWARD_IF_ERROR(read_f32(file, path, "", "affinity", 3, d_aff, p->affinity));
    FMOE_FORWARD_IF_ERROR(check_table(path, "affinity", p->affinity, (int64_t)((L - 1) * J * J),
                                      (int64_t)J, 0, 1));
    FMOE_FORWARD_IF_ERROR(
        read_f32_ex(file, path, "", "val_all_correct", 1, d_val, p->val_all_correct, 1));
    FMOE_FORWARD_IF_ERROR(
        read_f32_ex(file, path, "", "val_one_correct", 1, d_val, p->val_one_correct, 1));
    char obj[64];
    for (int32_t i = 0; i < m->num_fc; i++) {
        snprintf(obj, sizeof obj, "/expert_mlp/%d", i);
        const int ex = fmoe__h5_exists(file, path, obj);
        if (ex < 0) return ex;
        hid_t g = ex ? H5Gopen2(file, obj, H5P_DEFAULT) : -1;
        FMOE_RETURN_ERROR_IF(g < 0, FMOE_EFORMAT, "%s: %s is missing", path, obj);
        const hsize_t d_w[2] = {(hsize_t)m->width[i + 1], (hsize_t)m->width[i]},
                      d_b[1] = {(hsize_t)m->width[i + 1]};
        int rc = read_f32(g, path, obj, "W", 2, d_w, m->params + m->w_off[i]);
        if (rc == 0) rc = read_f32(g, path, obj, "b", 1, d_b, m->params + m->b_off[i]);
        if (i < m->num_fc - 1) {
            if (rc == 0) rc = read_f32(g, path, obj, "bn_gamma", 1, d_b, m->params + m->gamma_off[i]);
            if (rc == 0) rc = read_f32(g, path, obj, "bn_beta", 1, d_b, m->params + m->beta_off[i]);
            if (rc == 0)
                rc = read_f32(g, path, obj, "bn_running_mean", 1, d_b, m->running_mean[i]);
            if (rc == 0) rc = read_f32(g, path, obj, "bn_running_var", 1, d_b, m->running_var[i]);
            for (int32_t j = 0; rc == 0 && j < m->width[i + 1]; j++)
                if (!(m->running_var[i][j] >= 0))
                    rc = fmoe_error_set(FMOE_EFORMAT,
                                        "%s: %s/bn_running_var: element %d is %g, expected >= 0",
                                        path, obj, j, (double)m->running_var[i][j]);
        }
        H5Gclose(g);
        FMOE_FORWARD_IF_ERROR(rc);
    }
    return 0;
}

static int read_duoserve(hid_t file, const char *path, fmoe_predictor **out) {
    int64_t v, L, J, K, F, seed, stride;
    FMOE_FORWARD_IF_ERROR(read_int_attr(file, path, "/", "duoserve_version", 0, INT32_MAX, &v));
    FMOE_RETURN_ERROR_IF(v != FMOE_PREDICTOR_DUOSERVE_VERSION, FMOE_EUNSUPPORTED,
                         "%s: duoserve predictor layout version %lld, this fmoe reads %d", path,
                         (long long)v, FMOE_PREDICTOR_DUOSERVE_VERSION);
    FMOE_FORWARD_IF_ERROR(read_int_attr(file, path, "/", "num_layers", 2, 4096, &L));
    FMOE_FORWARD_IF_ERROR(read_int_attr(file, path, "/", "num_experts", 2, 4096, &J));
    FMOE_FORWARD_IF_ERROR(read_int_attr(file, path, "/", "top_k", 1, J, &K));
    FMOE_FORWARD_IF_ERROR(read_int_attr(file, path, "/", "stride", 1, 1, &stride));
    FMOE_RETURN_ERROR_IF((L - 1) * J * J > MAX_MATRIX, FMOE_EFORMAT,
                         "%s: %lld layers of %lld experts: the affinity tables would hold more "
                         "than %lld values",
                         path, (long long)L, (long long)J, (long long)MAX_MATRIX);
    FMOE_FORWARD_IF_ERROR(read_int_attr(file, path, "/", "num_fc", 1, FMOE_EXPERT_MLP_MAX_FC, &F));
    FMOE_FORWARD_IF_ERROR(read_int_attr(file, path, "/", "seed", 0, INT64_MAX, &seed));
    /* the widths: the shapes of the W, each layer's input the previous one's output */
    int32_t widths[FMOE_EXPERT_MLP_MAX_FC + 1];
    char obj[64];
    for (int32_t i = 0; i < (int32_t)F; i++) {
        snprintf(obj, sizeof obj, "/expert_mlp/%d", i);
        const int ex = fmoe__h5_exists(file, path, obj);
        if (ex < 0) return ex;
        FMOE_RETURN_ERROR_IF(ex == 0, FMOE_EFORMAT,
                             "%s: %s is missing (the ExpertMLP has %lld FC layers)", path, obj,
                             (long long)F);
        hid_t g = H5Gopen2(file, obj, H5P_DEFAULT);
        FMOE_RETURN_ERROR_IF(g < 0, FMOE_EFORMAT, "%s: %s is not a group", path, obj);
        hsize_t dims[2] = {0, 0};
        int rc = dataset_dims2(g, path, obj, "W", dims);
        H5Gclose(g);
        FMOE_FORWARD_IF_ERROR(rc);
        FMOE_RETURN_ERROR_IF(dims[0] < 1 || dims[0] > MAX_WIDTH || dims[1] < 1 ||
                                 dims[1] > MAX_WIDTH ||
                                 (int64_t)(dims[0] * dims[1]) > MAX_MATRIX ||
                                 (i > 0 && (int32_t)dims[1] != widths[i]),
                             FMOE_EFORMAT, "%s: %s/W has shape [%llu,%llu], expected [*,%d]", path,
                             obj, (unsigned long long)dims[0], (unsigned long long)dims[1],
                             i > 0 ? widths[i] : (int)fmoe_duoserve_input_dim((int32_t)L, (int32_t)J));
        widths[i] = (int32_t)dims[1];
        widths[i + 1] = (int32_t)dims[0];
    }
    const int32_t D = fmoe_duoserve_input_dim((int32_t)L, (int32_t)J);
    FMOE_RETURN_ERROR_IF(widths[0] != D || widths[F] != (int32_t)J, FMOE_EFORMAT,
                         "%s: the ExpertMLP maps %d -> %d, expected (L+1)·J = %d -> J = %lld",
                         path, widths[0], widths[F], D, (long long)J);
    fmoe_predictor *p = NULL;
    FMOE_FORWARD_IF_ERROR(fmoe_predictor_alloc_duoserve(&p, (int32_t)L, (int32_t)J, (int32_t)K,
                                                        (int32_t)F, widths));
    p->seed = seed;
    double dropout = 0, eps = 0;
    int rc = read_common_attrs(file, path, p);
    if (rc == 0) rc = read_f64_attr(file, path, "/", "dropout", &dropout);
    if (rc == 0) rc = read_f64_attr(file, path, "/", "bn_eps", &eps);
    if (rc == 0 && (!(dropout >= 0 && dropout < 1) || !(eps > 0 && eps < 1)))
        rc = fmoe_error_set(FMOE_EFORMAT, "%s: dropout %g, bn_eps %g: expected [0, 1) and (0, 1)",
                            path, dropout, eps);
    if (rc == 0) {
        p->expert_mlp->dropout = (float)dropout;
        p->expert_mlp->bn_eps = (float)eps;
        rc = read_duoserve_body(file, path, p);
    }
    if (rc < 0) {
        fmoe_predictor_free(p);
        return rc;
    }
    *out = p;
    return 0;
}

static int read_file(hid_t file, const char *path, fmoe_predictor **out) {
    FMOE_FORWARD_IF_ERROR(fmoe__h5_check_format(
        file, path, "predictor", FMOE_PREDICTOR_FORMAT, FMOE_PREDICTOR_VERSION, FMOE_TRACE_FORMAT,
        " (this is a trace: train a predictor from it with fmoe train-predictor)"));
    char kind[32];
    FMOE_FORWARD_IF_ERROR(read_str_attr(file, path, "kind", kind, sizeof kind));
    if (strcmp(kind, FMOE_PREDICTOR_KIND_DUOSERVE) == 0) return read_duoserve(file, path, out);
    FMOE_RETURN_ERROR_IF(strcmp(kind, FMOE_PREDICTOR_KIND_PROMOE) != 0, FMOE_EUNSUPPORTED,
                         "%s: predictor kind '%s', this fmoe reads promoe and duoserve", path,
                         kind);
    int64_t L, J, K, h, H, k, seed;
    FMOE_FORWARD_IF_ERROR(read_int_attr(file, path, "/", "num_layers", 2, MAX_LAYERS, &L));
    FMOE_FORWARD_IF_ERROR(read_int_attr(file, path, "/", "num_experts", 1, MAX_EXPERTS, &J));
    FMOE_FORWARD_IF_ERROR(read_int_attr(file, path, "/", "top_k", 1, J, &K));
    FMOE_FORWARD_IF_ERROR(read_int_attr(file, path, "/", "hidden_size", 1, MAX_WIDTH, &h));
    FMOE_FORWARD_IF_ERROR(read_int_attr(file, path, "/", "mlp_hidden", 1, MAX_WIDTH, &H));
    FMOE_FORWARD_IF_ERROR(read_int_attr(file, path, "/", "stride", 1, L - 1, &k));
    FMOE_FORWARD_IF_ERROR(read_int_attr(file, path, "/", "seed", 0, INT64_MAX, &seed));
    FMOE_RETURN_ERROR_IF(h * H > MAX_MATRIX || J * H > MAX_MATRIX, FMOE_EFORMAT,
                         "%s: MLP %lld -> %lld -> %lld is too large (at most %lld weights a "
                         "matrix)",
                         path, (long long)h, (long long)H, (long long)J, (long long)MAX_MATRIX);
    fmoe_predictor *p = NULL;
    FMOE_FORWARD_IF_ERROR(fmoe_predictor_alloc(&p, (int32_t)L, (int32_t)J, (int32_t)K, (int32_t)h,
                                               (int32_t)H, (int32_t)k));
    p->seed = seed;
    int rc = read_common_attrs(file, path, p);
    if (rc == 0) rc = read_layers(file, path, p);
    if (rc < 0) {
        fmoe_predictor_free(p);
        return rc;
    }
    *out = p;
    return 0;
}

/* Reads the predictor at `path`, or from the file image (`size` bytes at `image`, `path`
 * its label) when `image` is not NULL. Call with the HDF5 lock held. */
static int predictor_read(const char *path, const void *image, size_t size, fmoe_predictor **out) {
    FMOE_FORWARD_IF_ERROR(fmoe__h5_init());
    hid_t file = fmoe__h5_open_read(path, image, size, "predictor");
    if (file < 0) return (int)file;
    int rc = read_file(file, path, out);
    H5Fclose(file);
    return rc;
}

int fmoe_predictor_read(const char *path, fmoe_predictor **out) {
    FMOE_RETURN_ERROR_IF(!path || !out, FMOE_EINVAL, "fmoe_predictor_read: NULL argument");
    *out = NULL;
    fmoe__h5_lock();
    int rc = predictor_read(path, NULL, 0, out);
    fmoe__h5_unlock();
    return rc;
}

int fmoe__predictor_read_image(const void *image, size_t size, const char *name,
                               fmoe_predictor **out) {
    FMOE_RETURN_ERROR_IF(!name || !out, FMOE_EINVAL, "fmoe__predictor_read_image: NULL argument");
    *out = NULL;
    fmoe__h5_lock();
    int rc = predictor_read(name, image ? image : "", size, out);
    fmoe__h5_unlock();
    return rc;
}
