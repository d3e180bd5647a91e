/* hdf5_util.c - HDF5 helpers shared by trace/ (contracts in hdf5_util.h). */
#include "hdf5_util.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fmoe/error.h"
#include "files.h"
#include "hdf5_guard.h"
#include "zstd_filter.h"

/* HDF5 keeps a chunk's byte size in 32 bits. */
#define H5_CHUNK_LIMIT ((uint64_t)UINT32_MAX)

/* ---------------------------------------------------------------------------------------
 * Library setup and error messages
 * ------------------------------------------------------------------------------------- */

static pthread_mutex_t h5_mutex;
static pthread_once_t h5_mutex_once = PTHREAD_ONCE_INIT;

static void h5_mutex_init(void) {
    /* No H5close at exit. libhdf5 1.10.8 frees a file whose H5Fclose failed (its last
     * flush hit a full disk) but keeps its id; the H5close that H5open registers with
     * atexit then closes that id again and crashes in H5F__close_cb (exit 139 after a
     * disk-full error). Every fmoe file is closed explicitly, so nothing
     * is lost by skipping it. It must precede the library's initialisation: this runs
     * before our first HDF5 call. */
    H5dont_atexit();
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&h5_mutex, &a);
    pthread_mutexattr_destroy(&a);
}

void fmoe__h5_lock(void) {
    pthread_once(&h5_mutex_once, h5_mutex_init);
    pthread_mutex_lock(&h5_mutex);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

void fmoe__h5_unlock(void) { pthread_mutex_unlock(&h5_mutex); }

int fmoe_hdf5_register_zstd(void) {
    fmoe__h5_lock();
    /* H5Zregister replaces a class already registered under the same id, so calling it
     * again is harmless; it is also cheap, and calling it every time (rather than once per
     * process) survives an application that shuts HDF5 down with H5close and restarts it. */
    int rc = 0;
    if (H5Zregister(&fmoe__h5z_zstd_class) < 0) {
        char msg[256];
        rc = fmoe_error_set(FMOE_EIO, "cannot register the zstd HDF5 filter (id %d): %s",
                            FMOE_H5Z_FILTER_ZSTD, fmoe__h5_errmsg(msg, sizeof msg));
    }
    fmoe__h5_unlock();
    return rc;
}

int fmoe__h5_init(void) {
    /* HDF5 prints its whole error stack to stderr by default; libraries never print, and
     * our details carry the useful innermost line instead. (fmoe__h5_lock does this too,
     * for entry points that do not come through here.) */
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    return fmoe_hdf5_register_zstd();
}

hid_t fmoe__h5_open_image(const void *image, size_t size, const char *name) {
    char msg[256];
    FMOE_RETURN_ERROR_IF(!image || size < 8, FMOE_EFORMAT, "%s: not an HDF5 file (%zu bytes)",
                         name, size);
    FMOE_FORWARD_IF_ERROR(fmoe__h5_precheck(-1, image, size, name));
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0) return fmoe_error_set(FMOE_EINTERNAL, "%s: cannot create a property list", name);
    hid_t file = -1;
    if (H5Pset_fapl_core(fapl, 64 * 1024, 0) >= 0 && H5Pset_file_image(fapl, (void *)image, size) >= 0)
        file = H5Fopen(name, H5F_ACC_RDONLY, fapl);
    H5Pclose(fapl);
    if (file < 0)
        return fmoe_error_set(FMOE_EFORMAT, "%s: damaged or truncated HDF5 file: %s", name,
                              fmoe__h5_errmsg(msg, sizeof msg));
    return file;
}

hid_t fmoe__h5_open_read(const char *path, const void *image, size_t size, const char *what) {
    if (image) return fmoe__h5_open_image(image, size, path);
    int fd = fmoe__open_regular(path); /* a FIFO would block HDF5's open forever */
    if (fd < 0) return fd;
    int rc = fmoe__h5_precheck(fd, NULL, 0, path); /* what H5Fopen would trust (hdf5_guard.h) */
    close(fd);
    if (rc < 0) return rc;
    /* "cannot read the file" (EIO) apart from "the bytes are not HDF5" (EFORMAT), so the
     * message says which */
    char msg[256];
    htri_t is = H5Fis_hdf5(path);
    if (is < 0)
        return fmoe_error_set(FMOE_EIO, "%s: cannot read: %s", path,
                              fmoe__h5_errmsg(msg, sizeof msg));
    FMOE_RETURN_ERROR_IF(is == 0, FMOE_EFORMAT,
                         "%s: not an HDF5 file (no HDF5 signature), expected an fmoe %s", path,
                         what);
    hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (file < 0)
        return fmoe_error_set(FMOE_EFORMAT, "%s: damaged or truncated HDF5 file: %s", path,
                              fmoe__h5_errmsg(msg, sizeof msg));
    return file;
}

typedef struct errwalk {
    char *buf;
    size_t cap;
    int found;
} errwalk;

static herr_t errwalk_cb(unsigned n, const H5E_error2_t *e, void *data) {
    (void)n; /* the entry's depth in HDF5's stack: the first with a description is enough */
    errwalk *w = data;
    if (w->found || !e->desc || !e->desc[0]) return 0;
    /* A failed system call (the sec2 driver's "file write failed: time = ..., errno = 28,
     * error message = 'No space left on device', ...", several lines) becomes its errno's
     * message alone: one line, and the reason a person can act on. Anything else is cut
     * at its first line break. */
    const char *en = strstr(e->desc, "errno = ");
    char *end = NULL;
    long code = en ? strtol(en + 8, &end, 10) : 0;
    if (en && end != en + 8 && code > 0 && code < 4096) {
        snprintf(w->buf, w->cap, "%s", strerror((int)code));
    } else {
        snprintf(w->buf, w->cap, "%s", e->desc);
        w->buf[strcspn(w->buf, "\r\n")] = '\0';
    }
    w->found = 1;
    return 0;
}

const char *fmoe__h5_errmsg(char *buf, size_t cap) {
    if (cap == 0) return buf;
    buf[0] = '\0';
    errwalk w = {buf, cap, 0};
    /* Walking upward starts at the function that detected the problem ("truncated file:
     * eof = 96, ...") rather than the API call that reported it. */
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, errwalk_cb, &w);
    if (!w.found) snprintf(buf, cap, "HDF5 call failed");
    return buf;
}

/* ---------------------------------------------------------------------------------------
 * Types
 * ------------------------------------------------------------------------------------- */

hid_t fmoe__h5_half_type(void) {
    /* HDF5 1.10 has no predefined binary16; this is the construction h5py itself uses, so
     * h5py maps it to numpy float16. Fields are set before shrinking the size because
     * H5Tset_size refuses sizes the current fields do not fit in. */
    hid_t t = H5Tcopy(H5T_IEEE_F32LE);
    if (t < 0) return -1;
    if (H5Tset_fields(t, 15, 10, 5, 0, 10) < 0 || H5Tset_size(t, 2) < 0 ||
        H5Tset_ebias(t, 15) < 0) {
        H5Tclose(t);
        return -1;
    }
    return t;
}

hid_t fmoe__h5_utf8_type(void) {
    hid_t t = H5Tcopy(H5T_C_S1);
    if (t < 0) return -1;
    if (H5Tset_size(t, H5T_VARIABLE) < 0 || H5Tset_cset(t, H5T_CSET_UTF8) < 0) {
        H5Tclose(t);
        return -1;
    }
    return t;
}

int fmoe__h5_is_half(hid_t type) {
    if (H5Tget_class(type) != H5T_FLOAT || H5Tget_size(type) != 2) return 0;
    size_t spos, epos, esize, mpos, msize;
    if (H5Tget_fields(type, &spos, &epos, &esize, &mpos, &msize) < 0) return 0;
    return spos == 15 && epos == 10 && esize == 5 && mpos == 0 && msize == 10 &&
           H5Tget_ebias(type) == 15;
}

const char *fmoe__h5_type_name(hid_t type, char *buf, size_t cap) {
    size_t bits = H5Tget_size(type) * 8;
    switch (H5Tget_class(type)) {
    case H5T_INTEGER:
        snprintf(buf, cap, "%sint%zu", H5Tget_sign(type) == H5T_SGN_NONE ? "u" : "", bits);
        break;
    case H5T_FLOAT: snprintf(buf, cap, "float%zu", bits); break;
    case H5T_STRING: snprintf(buf, cap, "string"); break;
    case H5T_COMPOUND: snprintf(buf, cap, "compound"); break;
    case H5T_ENUM: snprintf(buf, cap, "enum"); break;
    case H5T_ARRAY: snprintf(buf, cap, "array"); break;
    case H5T_VLEN: snprintf(buf, cap, "vlen"); break;
    case H5T_OPAQUE: snprintf(buf, cap, "opaque"); break;
    case H5T_REFERENCE: snprintf(buf, cap, "reference"); break;
    case H5T_BITFIELD: snprintf(buf, cap, "bitfield"); break;
    default: snprintf(buf, cap, "unknown type"); break;
    }
    return buf;
}

/* ---------------------------------------------------------------------------------------
 * Attributes and string datasets
 * ------------------------------------------------------------------------------------- */

/* One scalar attribute: value points at one element of mem_type, stored as file_type. */
static int attr_write_scalar(hid_t loc, const char *path, const char *name, hid_t file_type,
                             hid_t mem_type, const void *value) {
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t a = space < 0 ? -1 : H5Acreate2(loc, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT);
    int ok = a >= 0 && H5Awrite(a, mem_type, value) >= 0;
    if (a >= 0) H5Aclose(a);
    if (space >= 0) H5Sclose(space);
    if (!ok) {
        char msg[256];
        return fmoe_error_set(FMOE_EIO, "%s: cannot write attribute '%s': %s", path, name,
                              fmoe__h5_errmsg(msg, sizeof msg));
    }
    return 0;
}

int fmoe__h5_attr_write_str(hid_t loc, const char *path, const char *name, const char *value) {
    hid_t type = fmoe__h5_utf8_type();
    if (type < 0) return attr_write_scalar(loc, path, name, -1, -1, NULL);
    int rc = attr_write_scalar(loc, path, name, type, type, &value);
    H5Tclose(type);
    return rc;
}

int fmoe__h5_attr_write_int(hid_t loc, const char *path, const char *name, hid_t file_type,
                            int64_t value) {
    return attr_write_scalar(loc, path, name, file_type, H5T_NATIVE_INT64, &value);
}

int fmoe__h5_attrs_write(hid_t loc, const char *path, const fmoe__h5_str_attr *strs, size_t ns,
                         const fmoe__h5_int_attr *ints, size_t ni) {
    for (size_t i = 0; i < ns; i++)
        FMOE_FORWARD_IF_ERROR(fmoe__h5_attr_write_str(loc, path, strs[i].name, strs[i].value));
    for (size_t i = 0; i < ni; i++)
        FMOE_FORWARD_IF_ERROR(
            fmoe__h5_attr_write_int(loc, path, ints[i].name, ints[i].type, ints[i].value));
    return 0;
}

int fmoe__h5_attr_write_f64(hid_t loc, const char *path, const char *name, double value) {
    return attr_write_scalar(loc, path, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
}

/* Copies src[n] into out[cap] NUL-terminated, cutting at a UTF-8 character boundary. */
static void copy_truncated(char *out, size_t cap, const char *src, size_t n) {
    if (cap == 0) return;
    if (n > cap - 1) {
        n = cap - 1;
        while (n > 0 && ((unsigned char)src[n] & 0xc0u) == 0x80u) n--;
    }
    memcpy(out, src, n);
    out[n] = '\0';
}

/* Reads a one-element string from an attribute (is_attr) or dataset into a malloc'ed copy.
 * `what` names the object in messages. */
static int read_string_object(hid_t obj, int is_attr, const char *path, const char *what,
                              char **out) {
    int rc = 0;
    char msg[256], tname[32];
    hid_t type = is_attr ? H5Aget_type(obj) : H5Dget_type(obj);
    hid_t space = is_attr ? H5Aget_space(obj) : H5Dget_space(obj);
    hid_t mem = -1;
    char *copy = NULL;
    if (type < 0 || space < 0) goto h5fail;
    if (H5Tget_class(type) != H5T_STRING) {
        rc = fmoe_error_set(FMOE_EFORMAT, "%s: %s is %s, expected a string", path, what,
                            fmoe__h5_type_name(type, tname, sizeof tname));
        goto done;
    }
    hssize_t npoints = H5Sget_simple_extent_npoints(space);
    if (npoints != 1) {
        rc = fmoe_error_set(FMOE_EFORMAT, "%s: %s holds %lld strings, expected one", path, what,
                            (long long)npoints);
        goto done;
    }
    htri_t vlen = H5Tis_variable_str(type);
    if (vlen < 0) goto h5fail;
    if (vlen) {
        /* libhdf5 follows a stored heap id blindly (hdf5_guard.c): check it first */
        if ((rc = fmoe__h5_vlen_check(obj, is_attr, 1, path, what)) < 0) goto done;
        mem = H5Tcopy(H5T_C_S1);
        if (mem < 0 || H5Tset_size(mem, H5T_VARIABLE) < 0 ||
            H5Tset_cset(mem, H5Tget_cset(type)) < 0)
            goto h5fail;
        char *s = NULL;
        herr_t e =
            is_attr ? H5Aread(obj, mem, &s) : fmoe__h5_dread(obj, mem, H5S_ALL, H5S_ALL, &s);
        if (e < 0) goto h5fail;
        copy = strdup(s ? s : "");
        if (s) H5free_memory(s);
    } else {
        size_t size = H5Tget_size(type);
        if (size == 0 || size > ((size_t)1 << 30)) {
            rc = fmoe_error_set(FMOE_EFORMAT, "%s: %s has a string size of %zu bytes", path, what,
                                size);
            goto done;
        }
        copy = calloc(size + 1, 1);
        if (!copy) {
            rc = fmoe_error_set(FMOE_ENOMEM, "%s: %s: out of memory", path, what);
            goto done;
        }
        herr_t e = is_attr ? H5Aread(obj, type, copy)
                           : fmoe__h5_dread(obj, type, H5S_ALL, H5S_ALL, copy);
        if (e < 0) goto h5fail;
    }
    if (!copy) {
        rc = fmoe_error_set(FMOE_ENOMEM, "%s: %s: out of memory", path, what);
        goto done;
    }
    *out = copy;
    copy = NULL;
    goto done;
h5fail:
    rc = fmoe_error_set(FMOE_EIO, "%s: cannot read %s: %s", path, what,
                        fmoe__h5_errmsg(msg, sizeof msg));
done:
    free(copy);
    if (mem >= 0) H5Tclose(mem);
    if (space >= 0) H5Sclose(space);
    if (type >= 0) H5Tclose(type);
    return rc;
}

/* Opens attribute `name` of `loc`: the id, FMOE_ENOTFOUND, or FMOE_EIO (detail set). */
static hid_t attr_open(hid_t loc, const char *path, const char *obj, const char *name) {
    char msg[256];
    htri_t ex = H5Aexists(loc, name);
    if (ex < 0)
        return fmoe_error_set(FMOE_EIO, "%s: %s: cannot look up attribute '%s': %s", path, obj,
                              name, fmoe__h5_errmsg(msg, sizeof msg));
    if (ex == 0)
        return fmoe_error_set(FMOE_ENOTFOUND, "%s: %s: attribute '%s' is missing", path, obj, name);
    hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
    if (a < 0)
        return fmoe_error_set(FMOE_EIO, "%s: %s: cannot open attribute '%s': %s", path, obj, name,
                              fmoe__h5_errmsg(msg, sizeof msg));
    return a;
}

int fmoe__h5_attr_read_str(hid_t loc, const char *path, const char *obj, const char *name,
                           char *out, size_t cap) {
    hid_t a = attr_open(loc, path, obj, name);
    if (a < 0) return (int)a;
    char what[160];
    snprintf(what, sizeof what, "%s: attribute '%s'", obj, name);
    char *s = NULL;
    int rc = read_string_object(a, 1, path, what, &s);
    H5Aclose(a);
    if (rc < 0) return rc;
    copy_truncated(out, cap, s, strlen(s));
    free(s);
    return 0;
}

int fmoe__h5_attr_read_int(hid_t loc, const char *path, const char *obj, const char *name,
                           int64_t *out) {
    hid_t a = attr_open(loc, path, obj, name);
    if (a < 0) return (int)a;
    int rc = 0;
    char msg[256], tname[32];
    hid_t type = H5Aget_type(a);
    hid_t space = H5Aget_space(a);
    if (type < 0 || space < 0) {
        rc = fmoe_error_set(FMOE_EIO, "%s: %s: cannot read attribute '%s': %s", path, obj, name,
                            fmoe__h5_errmsg(msg, sizeof msg));
    } else if (H5Tget_class(type) != H5T_INTEGER) {
        rc = fmoe_error_set(FMOE_EFORMAT, "%s: %s: attribute '%s' is %s, expected an integer", path,
                            obj, name, fmoe__h5_type_name(type, tname, sizeof tname));
    } else if (H5Sget_simple_extent_npoints(space) != 1) {
        rc = fmoe_error_set(FMOE_EFORMAT, "%s: %s: attribute '%s' holds %lld values, expected one",
                            path, obj, name, (long long)H5Sget_simple_extent_npoints(space));
    } else {
        /* HDF5 converts any integer width; values past int64 saturate, which the callers'
         * range checks then refuse. */
        int64_t v = 0;
        if (H5Aread(a, H5T_NATIVE_INT64, &v) < 0)
            rc = fmoe_error_set(FMOE_EIO, "%s: %s: cannot read attribute '%s': %s", path, obj, name,
                                fmoe__h5_errmsg(msg, sizeof msg));
        else
            *out = v;
    }
    if (space >= 0) H5Sclose(space);
    if (type >= 0) H5Tclose(type);
    H5Aclose(a);
    return rc;
}

int fmoe__h5_root_attr_str(hid_t file, const char *path, const char *name, char *out,
                           size_t cap) {
    int rc = fmoe__h5_attr_read_str(file, path, "/", name, out, cap);
    return rc == FMOE_ENOTFOUND ? FMOE_EFORMAT : rc;
}

int fmoe__h5_root_attr_int(hid_t file, const char *path, const char *name, int64_t lo,
                           int64_t hi, int64_t *out) {
    int rc = fmoe__h5_attr_read_int(file, path, "/", name, out);
    if (rc == FMOE_ENOTFOUND) rc = FMOE_EFORMAT;
    if (rc < 0) return rc;
    FMOE_RETURN_ERROR_IF(*out < lo || *out > hi, FMOE_EFORMAT,
                         "%s: /: attribute %s = %lld, expected %lld..%lld", path, name,
                         (long long)*out, (long long)lo, (long long)hi);
    return 0;
}

static hid_t lcpl_intermediate(void) {
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    if (lcpl >= 0 && H5Pset_create_intermediate_group(lcpl, 1) < 0) {
        H5Pclose(lcpl);
        return -1;
    }
    return lcpl;
}

/* A dataset of variable-length UTF-8 strings over `space` (scalar or 1-D), written from
 * `values` (n_values pointers; nothing is written when 0). Intermediate groups are made. */
static int write_str_dataset(hid_t file, const char *path, const char *name, hid_t space,
                             const char *const *values, hsize_t n_values) {
    int rc = 0;
    hid_t type = fmoe__h5_utf8_type();
    hid_t lcpl = lcpl_intermediate();
    hid_t d = -1;
    if (type < 0 || space < 0 || lcpl < 0) goto h5fail;
    d = H5Dcreate2(file, name, type, space, lcpl, H5P_DEFAULT, H5P_DEFAULT);
    if (d < 0) goto h5fail;
    if (n_values > 0 && H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values) < 0)
        goto h5fail;
    goto done;
h5fail:;
    char msg[256];
    rc = fmoe_error_set(FMOE_EIO, "%s: %s: cannot write: %s", path, name,
                        fmoe__h5_errmsg(msg, sizeof msg));
done:
    if (d >= 0) H5Dclose(d);
    if (lcpl >= 0) H5Pclose(lcpl);
    if (type >= 0) H5Tclose(type);
    return rc;
}

int fmoe__h5_dataset_write_str(hid_t file, const char *path, const char *name, const char *value) {
    hid_t space = H5Screate(H5S_SCALAR);
    int rc = write_str_dataset(file, path, name, space, &value, 1);
    if (space >= 0) H5Sclose(space);
    return rc;
}

int fmoe__h5_write_str_array(hid_t file, const char *path, const char *name,
                             const char *const *values, hsize_t n) {
    hid_t space = H5Screate_simple(1, &n, NULL);
    int rc = write_str_dataset(file, path, name, space, values, n);
    if (space >= 0) H5Sclose(space);
    return rc;
}

int fmoe__h5_dataset_read_str(hid_t file, const char *path, const char *name, char **out) {
    int ex = fmoe__h5_exists(file, path, name);
    if (ex < 0) return ex;
    if (ex == 0) return fmoe_error_set(FMOE_ENOTFOUND, "%s: %s is missing", path, name);
    hid_t d = H5Dopen2(file, name, H5P_DEFAULT);
    if (d < 0) {
        char msg[256];
        return fmoe_error_set(FMOE_EFORMAT, "%s: %s: cannot open as a dataset: %s", path, name,
                              fmoe__h5_errmsg(msg, sizeof msg));
    }
    int rc = read_string_object(d, 0, path, name, out);
    H5Dclose(d);
    return rc;
}

/* ---------------------------------------------------------------------------------------
 * Chunked, extendible datasets
 * ------------------------------------------------------------------------------------- */

static uint64_t chunk_bytes(int rank, const hsize_t *chunk, size_t elem) {
    uint64_t b = elem;
    for (int i = 0; i < rank; i++) {
        if (chunk[i] != 0 && b > UINT64_MAX / chunk[i]) return UINT64_MAX;
        b *= chunk[i];
    }
    return b;
}

int fmoe__h5_chunk_shape(int rank, const hsize_t *dims, size_t elem, int64_t rows_hint,
                         hsize_t *chunk) {
    chunk[0] = 1;
    for (int i = 1; i < rank; i++) {
        if (dims[i] == 0) return fmoe_error_set(FMOE_EINVAL, "chunk shape: empty dimension");
        chunk[i] = dims[i];
    }
    uint64_t row = chunk_bytes(rank, chunk, elem);
    if (rows_hint > 0) {
        chunk[0] = (hsize_t)rows_hint;
        uint64_t b = chunk_bytes(rank, chunk, elem);
        if (b > H5_CHUNK_LIMIT)
            return fmoe_error_set(FMOE_EINVAL,
                                  "chunk_tokens %lld makes chunks of %llu bytes, above "
                                  "HDF5's limit of 4 GiB",
                                  (long long)rows_hint, (unsigned long long)b);
        return 0;
    }
    if (row <= FMOE_H5_CHUNK_MAX) {
        uint64_t rows = FMOE_H5_CHUNK_TARGET / row;
        chunk[0] = rows > 0 ? (hsize_t)rows : 1;
        return 0;
    }
    /* One row alone is too big (e.g. [L][S][J] speculative gates of a large model): keep
     * one row per chunk and halve the outer inner dimensions first, so a chunk still holds
     * whole innermost rows where it can. */
    for (int i = 1; i < rank; i++) {
        while (chunk[i] > 1 && chunk_bytes(rank, chunk, elem) > FMOE_H5_CHUNK_TARGET)
            chunk[i] = (chunk[i] + 1) / 2;
    }
    return 0;
}

static void set_chunk_cache(hid_t dapl, uint64_t one_chunk, double w0) {
    /* Two chunks (at least 1 MiB, at most 256 MiB) so appends and consecutive range reads
     * touch each chunk's compressed bytes once. 12421 is a prime, as HDF5 recommends. */
    uint64_t bytes = one_chunk * 2;
    if (bytes < ((uint64_t)1 << 20)) bytes = (uint64_t)1 << 20;
    if (bytes > ((uint64_t)256 << 20)) bytes = (uint64_t)256 << 20;
    H5Pset_chunk_cache(dapl, 12421, (size_t)bytes, w0);
}

hid_t fmoe__h5_dataset_create_rows(hid_t file, const char *path, const char *name, hid_t file_type,
                                   int rank, const hsize_t *dims,
                                   const fmoe_trace_write_options *opts) {
    hsize_t cur[8], max[8], chunk[8];
    if (rank < 1 || rank > 8) return fmoe_error_set(FMOE_EINTERNAL, "%s: bad rank", name);
    size_t elem = H5Tget_size(file_type);
    int rc = fmoe__h5_chunk_shape(rank, dims, elem, opts->chunk_tokens, chunk);
    if (rc < 0) {
        fmoe_error_prefix("%s: %s", path, name);
        return rc;
    }
    for (int i = 0; i < rank; i++) {
        cur[i] = i == 0 ? 0 : dims[i];
        max[i] = i == 0 ? H5S_UNLIMITED : dims[i];
    }

    hid_t d = -1;
    hid_t space = H5Screate_simple(rank, cur, max);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    hid_t dapl = H5Pcreate(H5P_DATASET_ACCESS);
    hid_t lcpl = lcpl_intermediate();
    if (space < 0 || dcpl < 0 || dapl < 0 || lcpl < 0) goto h5fail;
    if (H5Pset_chunk(dcpl, rank, chunk) < 0) goto h5fail;
    /* No modification times in object headers: the same input gives the same bytes. */
    if (H5Pset_obj_track_times(dcpl, 0) < 0) goto h5fail;
    if (opts->compression != FMOE_COMPRESSION_NONE && elem > 1) {
        /* Byte shuffling groups the exponent bytes of floats and the high bytes of small
         * integers; both codecs then compress noticeably better. Built into every HDF5. */
        if (H5Pset_shuffle(dcpl) < 0) goto h5fail;
    }
    if (opts->compression == FMOE_COMPRESSION_ZSTD) {
        unsigned level = (unsigned)(opts->level > 0 ? opts->level : FMOE_ZSTD_DEFAULT_LEVEL);
        if (H5Pset_filter(dcpl, FMOE_H5Z_FILTER_ZSTD, H5Z_FLAG_MANDATORY, 1, &level) < 0)
            goto h5fail;
    } else if (opts->compression == FMOE_COMPRESSION_DEFLATE) {
        unsigned level = (unsigned)(opts->level > 0 ? opts->level : FMOE_H5_DEFLATE_DEFAULT_LEVEL);
        if (H5Pset_deflate(dcpl, level) < 0) goto h5fail;
    }
    /* w0 = 1: a chunk the appender has filled is the first to leave the cache. */
    set_chunk_cache(dapl, chunk_bytes(rank, chunk, elem), 1.0);
    d = H5Dcreate2(file, name, file_type, space, lcpl, dcpl, dapl);
    if (d < 0) goto h5fail;
    goto done;
h5fail:;
    char msg[256];
    fmoe_error_set(FMOE_EIO, "%s: %s: cannot create dataset: %s", path, name,
                   fmoe__h5_errmsg(msg, sizeof msg));
    if (d >= 0) H5Dclose(d);
    d = FMOE_EIO;
done:
    if (lcpl >= 0) H5Pclose(lcpl);
    if (dapl >= 0) H5Pclose(dapl);
    if (dcpl >= 0) H5Pclose(dcpl);
    if (space >= 0) H5Sclose(space);
    return d;
}

/* Selects rows [row0, row0+nrows) of d's dataspace and does the transfer. */
static int transfer_rows(hid_t d, const char *path, const char *name, hid_t mem_type, hsize_t row0,
                         hsize_t nrows, void *rbuf, const void *wbuf) {
    if (nrows == 0) return 0;
    int rc = 0;
    hsize_t dims[8], start[8], count[8];
    hid_t mspace = -1;
    hid_t fspace = H5Dget_space(d);
    if (fspace < 0) goto h5fail;
    int rank = H5Sget_simple_extent_ndims(fspace);
    if (rank < 1 || rank > 8 || H5Sget_simple_extent_dims(fspace, dims, NULL) < 0) goto h5fail;
    if (row0 > dims[0] || nrows > dims[0] - row0) {
        rc = fmoe_error_set(FMOE_ERANGE, "%s: %s: rows [%llu, %llu) past its %llu rows", path, name,
                            (unsigned long long)row0, (unsigned long long)(row0 + nrows),
                            (unsigned long long)dims[0]);
        goto done;
    }
    for (int i = 0; i < rank; i++) {
        start[i] = i == 0 ? row0 : 0;
        count[i] = i == 0 ? nrows : dims[i];
    }
    if (H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, NULL, count, NULL) < 0) goto h5fail;
    mspace = H5Screate_simple(rank, count, NULL);
    if (mspace < 0) goto h5fail;
    herr_t e = wbuf ? H5Dwrite(d, mem_type, mspace, fspace, H5P_DEFAULT, wbuf)
                    : fmoe__h5_dread(d, mem_type, mspace, fspace, rbuf);
    if (e < 0) goto h5fail;
    goto done;
h5fail:;
    char msg[256];
    rc = fmoe_error_set(wbuf ? FMOE_EIO : FMOE_EFORMAT, "%s: %s: cannot %s rows [%llu, %llu): %s",
                        path, name, wbuf ? "write" : "read", (unsigned long long)row0,
                        (unsigned long long)(row0 + nrows), fmoe__h5_errmsg(msg, sizeof msg));
done:
    if (mspace >= 0) H5Sclose(mspace);
    if (fspace >= 0) H5Sclose(fspace);
    return rc;
}

int fmoe__h5_dataset_append_rows(hid_t d, const char *path, const char *name, hid_t mem_type,
                                 hsize_t nrows, const void *data) {
    if (nrows == 0) return 0;
    hsize_t dims[8];
    hid_t fspace = H5Dget_space(d);
    int rank = fspace < 0 ? -1 : H5Sget_simple_extent_ndims(fspace);
    int ok = rank >= 1 && rank <= 8 && H5Sget_simple_extent_dims(fspace, dims, NULL) >= 0;
    if (fspace >= 0) H5Sclose(fspace);
    hsize_t row0 = ok ? dims[0] : 0;
    if (ok) {
        dims[0] += nrows;
        ok = H5Dset_extent(d, dims) >= 0;
    }
    if (!ok) {
        char msg[256];
        return fmoe_error_set(FMOE_EIO, "%s: %s: cannot extend: %s", path, name,
                              fmoe__h5_errmsg(msg, sizeof msg));
    }
    return transfer_rows(d, path, name, mem_type, row0, nrows, NULL, data);
}

int fmoe__h5_dataset_write_rows(hid_t d, const char *path, const char *name, hid_t mem_type,
                                hsize_t row0, hsize_t nrows, const void *data) {
    return transfer_rows(d, path, name, mem_type, row0, nrows, NULL, data);
}

int fmoe__h5_dataset_read_rows(hid_t d, const char *path, const char *name, hid_t mem_type,
                               hsize_t row0, hsize_t nrows, void *data) {
    return transfer_rows(d, path, name, mem_type, row0, nrows, data, NULL);
}

int fmoe__h5_exists(hid_t loc, const char *path, const char *name) {
    /* H5Lexists fails (rather than answering 0) when an intermediate group is missing, so
     * walk the path one component at a time; each component's object header is checked
     * before the next step (or the caller's open) makes libhdf5 load it. */
    char buf[256], msg[256];
    size_t n = strlen(name);
    if (n == 0 || n >= sizeof buf)
        return fmoe_error_set(FMOE_EINVAL, "%s: %s: bad object name", path, name);
    memcpy(buf, name, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0') continue;
        char c = buf[i];
        buf[i] = '\0';
        htri_t ex = H5Lexists(loc, buf, H5P_DEFAULT);
        int rc = ex > 0 ? fmoe__h5_link_check(loc, buf, path) : 0;
        buf[i] = c;
        if (ex < 0)
            return fmoe_error_set(FMOE_EFORMAT, "%s: %s: cannot look up: %s", path, name,
                                  fmoe__h5_errmsg(msg, sizeof msg));
        if (rc < 0) return rc;
        if (ex == 0) return 0;
    }
    return 1;
}

herr_t fmoe__h5_dread(hid_t d, hid_t mem_type, hid_t mem_space, hid_t file_space, void *buf) {
    /* The zstd frame of a chunk decodes to the chunk's bytes when every filter before zstd
     * in the pipeline keeps the size (shuffle): then that is what it must decode to. Not
     * for variable-length elements, whose stored size (a heap id) the type does not say. */
    size_t chunk_bytes = 0;
    hid_t dcpl = H5Dget_create_plist(d), type = H5Dget_type(d);
    hsize_t dims[32];
    int rank = dcpl >= 0 && H5Pget_layout(dcpl) == H5D_CHUNKED ? H5Pget_chunk(dcpl, 32, dims) : 0;
    const int nf = rank > 0 ? H5Pget_nfilters(dcpl) : 0;
    int zstd_at = -1, others = 0;
    for (int i = 0; i < nf; i++) {
        unsigned flags = 0;
        size_t nv = 0;
        const H5Z_filter_t id = H5Pget_filter2(dcpl, (unsigned)i, &flags, &nv, NULL, 0, NULL, NULL);
        if (id == FMOE_H5Z_FILTER_ZSTD && zstd_at < 0) zstd_at = i;
        else if (zstd_at < 0 && id != H5Z_FILTER_SHUFFLE) others = 1;
    }
    if (zstd_at >= 0 && !others && type >= 0 && H5Tdetect_class(type, H5T_VLEN) <= 0 &&
        H5Tis_variable_str(type) <= 0) {
        chunk_bytes = H5Tget_size(type);
        for (int i = 0; i < rank; i++) chunk_bytes *= (size_t)dims[i];
    }
    if (type >= 0) H5Tclose(type);
    if (dcpl >= 0) H5Pclose(dcpl);
    fmoe__h5z_zstd_expect(chunk_bytes);
    const herr_t e = H5Dread(d, mem_type, mem_space, file_space, H5P_DEFAULT, buf);
    fmoe__h5z_zstd_expect(0);
    return e;
}

hid_t fmoe__h5_dataset_open(hid_t file, const char *path, const char *name) {
    char msg[256];
    int ex = fmoe__h5_exists(file, path, name);
    if (ex < 0) return ex;
    if (ex == 0) return fmoe_error_set(FMOE_ENOTFOUND, "%s: %s is missing", path, name);
    hid_t d = H5Dopen2(file, name, H5P_DEFAULT);
    if (d < 0)
        return fmoe_error_set(FMOE_EFORMAT, "%s: %s: cannot open as a dataset: %s", path, name,
                              fmoe__h5_errmsg(msg, sizeof msg));
    /* Size the chunk cache from the chunk shape the file declares; reopening is the only
     * way to apply a dataset access property to an existing dataset. */
    hid_t dcpl = H5Dget_create_plist(d);
    hid_t type = H5Dget_type(d);
    hsize_t chunk[8];
    int crank = -1;
    if (dcpl >= 0 && H5Pget_layout(dcpl) == H5D_CHUNKED) crank = H5Pget_chunk(dcpl, 8, chunk);
    if (crank > 0 && type >= 0) {
        uint64_t bytes = chunk_bytes(crank, chunk, H5Tget_size(type));
        if (bytes * 2 > ((uint64_t)1 << 20)) {
            hid_t dapl = H5Pcreate(H5P_DATASET_ACCESS);
            if (dapl >= 0) {
                set_chunk_cache(dapl, bytes, 0.75);
                hid_t d2 = H5Dopen2(file, name, dapl);
                if (d2 >= 0) {
                    H5Dclose(d);
                    d = d2;
                }
                H5Pclose(dapl);
            }
        }
    }
    if (type >= 0) H5Tclose(type);
    if (dcpl >= 0) H5Pclose(dcpl);
    return d;
}

int fmoe__h5_check_stored(hid_t d, const char *path, const char *name) {
    int rc = 0;
    char msg[256];
    hsize_t dims[8], chunk[8];
    hid_t dcpl = H5Dget_create_plist(d);
    hid_t space = H5Dget_space(d);
    hid_t type = H5Dget_type(d);
    int rank = space >= 0 ? H5Sget_simple_extent_ndims(space) : -1;
    if (dcpl < 0 || type < 0 || rank < 0 || rank > 8 ||
        H5Sget_simple_extent_dims(space, dims, NULL) < 0)
        goto h5fail;
    uint64_t npoints = 1;
    for (int i = 0; i < rank; i++)
        npoints = dims[i] && npoints > UINT64_MAX / dims[i] ? UINT64_MAX : npoints * dims[i];
    if (npoints == 0) goto done;
    switch (H5Pget_layout(dcpl)) {
    case H5D_CHUNKED: {
        if (H5Pget_chunk(dcpl, rank, chunk) != rank) goto h5fail;
        uint64_t want = 1;
        for (int i = 0; i < rank; i++) {
            uint64_t n = chunk[i] ? (dims[i] + chunk[i] - 1) / chunk[i] : UINT64_MAX;
            want = n && want > UINT64_MAX / n ? UINT64_MAX : want * n;
        }
        hsize_t have = 0;
        if (H5Dget_num_chunks(d, space, &have) < 0) goto h5fail;
        if (have != want)
            rc = fmoe_error_set(FMOE_EFORMAT,
                                "%s: %s: %llu of the %llu chunks covering its extent are "
                                "stored, expected all (damaged file, or rows never written)",
                                path, name, (unsigned long long)have, (unsigned long long)want);
        break;
    }
    case H5D_CONTIGUOUS: {
        uint64_t want =
            npoints > UINT64_MAX / H5Tget_size(type) ? UINT64_MAX : npoints * H5Tget_size(type);
        uint64_t have = H5Dget_storage_size(d);
        if (have < want)
            rc = fmoe_error_set(FMOE_EFORMAT,
                                "%s: %s: stores %llu bytes, expected %llu (damaged file, or "
                                "data never written)",
                                path, name, (unsigned long long)have, (unsigned long long)want);
        break;
    }
    default: break; /* compact: the data lives in the object header itself */
    }
    goto done;
h5fail:
    rc = fmoe_error_set(FMOE_EFORMAT, "%s: %s: cannot inspect its storage: %s", path, name,
                        fmoe__h5_errmsg(msg, sizeof msg));
done:
    if (type >= 0) H5Tclose(type);
    if (space >= 0) H5Sclose(space);
    if (dcpl >= 0) H5Pclose(dcpl);
    return rc;
}

int fmoe__h5_check_format(hid_t file, const char *path, const char *what,
                          const char *expected_format, int expected_version,
                          const char *hint_format, const char *hint) {
    char format[64];
    int rc = fmoe__h5_attr_read_str(file, path, "/", "format", format, sizeof format);
    if (rc == FMOE_ENOTFOUND)
        return fmoe_error_set(FMOE_EFORMAT,
                              "%s: /: no 'format' attribute, expected format = '%s' (not an "
                              "fmoe %s)",
                              path, expected_format, what);
    if (rc < 0) return rc;
    FMOE_RETURN_ERROR_IF(strcmp(format, expected_format) != 0, FMOE_EFORMAT,
                         "%s: /: attribute format = '%s', expected '%s'%s", path, format,
                         expected_format,
                         hint_format && hint && strcmp(format, hint_format) == 0 ? hint : "");
    int64_t version = 0;
    rc = fmoe__h5_attr_read_int(file, path, "/", "version", &version);
    if (rc == FMOE_ENOTFOUND) rc = FMOE_EFORMAT;
    if (rc < 0) return rc;
    FMOE_RETURN_ERROR_IF(version != expected_version, FMOE_EUNSUPPORTED,
                         "%s: /: attribute version = %lld, expected %d%s", path,
                         (long long)version, expected_version,
                         version > expected_version ? " (written by a newer fmoe?)" : "");
    return 0;
}

int fmoe__h5_write_atomically(const char *path, fmoe__h5_write_fn write, const void *ctx) {
    const size_t n = strlen(path);
    char *partial = malloc(n + sizeof ".partial");
    if (!partial) return fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", path);
    memcpy(partial, path, n);
    memcpy(partial + n, ".partial", sizeof ".partial");
    char msg[256];
    int rc;
    /* a regular output, a fresh partial created exclusively (never through a symlink) */
    if ((rc = fmoe__output_check(path)) < 0 || (rc = fmoe__partial_prepare(partial)) < 0) {
        free(partial);
        return rc;
    }
    hid_t file = H5Fcreate(partial, H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT);
    if (file < 0) {
        rc = fmoe_error_set(FMOE_EIO, "%s: cannot create: %s", partial,
                            fmoe__h5_errmsg(msg, sizeof msg));
        /* HDF5 may have made the file and failed writing its superblock (a full disk);
         * a file that was there first (someone else's) is left alone */
        if (strcmp(msg, strerror(EEXIST)) != 0) unlink(partial);
        free(partial);
        return rc;
    }
    rc = write(file, partial, ctx);
    /* A close that fails (its flush hit a full disk) leaves HDF5's id dangling; nothing
     * touches it again (see h5_mutex_init), and the partial is removed below. */
    if (H5Fclose(file) < 0 && rc == 0)
        rc = fmoe_error_set(FMOE_EIO, "%s: cannot close: %s", partial,
                            fmoe__h5_errmsg(msg, sizeof msg));
    if (rc == 0) rc = fmoe__partial_commit(partial, path);
    if (rc < 0) unlink(partial);
    free(partial);
    return rc;
}
