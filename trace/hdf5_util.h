/*
 * hdf5_util.h - internal HDF5 helpers shared by every on-disk format in trace/.
 *
 * All helpers report failure the fmoe way: a negative FMOE_E* code and a one-line detail
 * naming the file and the object ("t.h5: /tokens/probs: ..."). `path` arguments are used
 * only in those messages. HDF5's own error stack is never printed (fmoe__h5_init turns
 * automatic printing off); its innermost message is folded into our detail instead.
 *
 * Threads: HDF5 built without --enable-threadsafe (the default of a source build, conda's
 * and Homebrew's) must never be entered from two threads at once. Every public trace/
 * function that calls HDF5 holds fmoe__h5_lock() for its duration, so the public API is
 * safe from any thread whichever HDF5 it links (Debian's happens to be threadsafe); the
 * helpers here assume the caller holds it.
 */
#ifndef FMOE_TRACE_HDF5_UTIL_H
#define FMOE_TRACE_HDF5_UTIL_H

#include <hdf5.h>
#include <stddef.h>
#include <stdint.h>

#include "fmoe/trace.h"

/* Chunk sizing: aim for chunks of about CHUNK_TARGET bytes, never above CHUNK_MAX unless a
 * single row is larger and cannot be split further. */
#define FMOE_H5_CHUNK_TARGET (512u * 1024u)
#define FMOE_H5_CHUNK_MAX (1024u * 1024u)
#define FMOE_H5_DEFLATE_DEFAULT_LEVEL 4

/* The process-wide HDF5 lock (recursive: a locked entry point may call another). Taking
 * it also turns off HDF5's error printing for the calling thread: a threadsafe HDF5 keeps
 * one error stack, and one auto-print setting, per thread. */
void fmoe__h5_lock(void);
void fmoe__h5_unlock(void);

/* Turns off HDF5's automatic error printing and registers the zstd filter. Cheap and
 * idempotent; every entry point that touches HDF5 calls it first. @return 0 or FMOE_EIO. */
int fmoe__h5_init(void);

/* Writes HDF5's innermost (most specific) error message of the current thread's error
 * stack into buf[cap] ("" when the stack is empty) and returns buf. Useful right after a
 * failed call, before anything else touches HDF5. */
const char *fmoe__h5_errmsg(char *buf, size_t cap);

/* Opens an HDF5 file image (`size` bytes at `image`, copied by HDF5) read-only through the
 * in-memory (core) driver, with `name` as its label. For the fuzz targets: no file on
 * disk. @return the file id, or < 0 with a detail naming `name` (FMOE_EFORMAT). */
hid_t fmoe__h5_open_image(const void *image, size_t size, const char *name);

/* Opens an fmoe file read-only for a reader: the image (`size` bytes, as
 * fmoe__h5_open_image, `path` its label) when `image` is not NULL, else the file at `path`,
 * refused before HDF5 sees it when it is not a regular file (a FIFO would block HDF5's open
 * forever) or when fmoe__h5_precheck refuses it. `what` names the kind of file expected in
 * messages ("trace", "store"). @return the file id, or < 0: FMOE_EIO (the file cannot be
 * read), FMOE_EFORMAT (not HDF5, damaged or truncated), the detail saying which. */
hid_t fmoe__h5_open_read(const char *path, const void *image, size_t size, const char *what);

/* New datatype ids; the caller closes them with H5Tclose. < 0 on failure. */
hid_t fmoe__h5_half_type(void); /* IEEE binary16, little endian: numpy float16 in h5py */
hid_t fmoe__h5_utf8_type(void); /* variable-length UTF-8 string: str in h5py */

/* 1 when `type` is a 2-byte IEEE-style float (binary16 in any byte order). */
int fmoe__h5_is_half(hid_t type);

/* Describes a datatype briefly for messages: "int32", "uint16", "float16", "string",
 * "compound", ... into buf[cap]; returns buf. */
const char *fmoe__h5_type_name(hid_t type, char *buf, size_t cap);

/* Scalar attributes on `loc`. Strings are written as variable-length UTF-8. */
int fmoe__h5_attr_write_str(hid_t loc, const char *path, const char *name, const char *value);
int fmoe__h5_attr_write_f64(hid_t loc, const char *path, const char *name, double value);
/* Writes a whole HDF5 file atomically: `path` must be absent or a regular file (lib/files.h);
 * PATH.partial is created exclusively, write(file, partial_name, ctx) fills it, and it is
 * closed and renamed to path, or removed on any failure. Call with the HDF5 lock held.
 * @return 0, or write's error or the create/close/rename error (naming the file). */
typedef int (*fmoe__h5_write_fn)(hid_t file, const char *partial, const void *ctx);
int fmoe__h5_write_atomically(const char *path, fmoe__h5_write_fn write, const void *ctx);

/* Tables of root attributes, written in order (each file format lists its own). */
typedef struct fmoe__h5_str_attr {
    const char *name, *value;
} fmoe__h5_str_attr;
typedef struct fmoe__h5_int_attr {
    const char *name;
    hid_t type;       /* file type, e.g. H5T_STD_I32LE */
    int64_t value;
} fmoe__h5_int_attr;
/* @return 0 or the first attribute's error (naming it and path). */
int fmoe__h5_attrs_write(hid_t loc, const char *path, const fmoe__h5_str_attr *strs, size_t ns,
                         const fmoe__h5_int_attr *ints, size_t ni);

int fmoe__h5_attr_write_int(hid_t loc, const char *path, const char *name, hid_t file_type,
                            int64_t value);

/* Reads a scalar (or one-element) string attribute, variable or fixed length, truncated to
 * out[cap]. @return 0, FMOE_ENOTFOUND (no such attribute), FMOE_EFORMAT (not a string,
 * not scalar), FMOE_EIO. `obj` names `loc` in messages ("/"). */
int fmoe__h5_attr_read_str(hid_t loc, const char *path, const char *obj, const char *name,
                           char *out, size_t cap);
/* Reads a scalar integer attribute of any integer type. Same codes as above. */
int fmoe__h5_attr_read_int(hid_t loc, const char *path, const char *obj, const char *name,
                           int64_t *out);

/* A root attribute an fmoe file must have (absent: FMOE_EFORMAT, not FMOE_ENOTFOUND): a
 * string truncated to out[cap], or an integer in lo..hi (else FMOE_EFORMAT with the range). */
int fmoe__h5_root_attr_str(hid_t file, const char *path, const char *name, char *out, size_t cap);
int fmoe__h5_root_attr_int(hid_t file, const char *path, const char *name, int64_t lo, int64_t hi,
                           int64_t *out);

/* Writes a scalar variable-length UTF-8 string dataset `name` (e.g. "/model/config_json"). */
int fmoe__h5_dataset_write_str(hid_t file, const char *path, const char *name, const char *value);
/* A 1-D dataset of n variable-length UTF-8 strings (n may be 0). */
int fmoe__h5_write_str_array(hid_t file, const char *path, const char *name,
                             const char *const *values, hsize_t n);
/* Reads a scalar string dataset into a malloc'ed NUL-terminated copy (*out, caller frees).
 * Variable and fixed length both work. */
int fmoe__h5_dataset_read_str(hid_t file, const char *path, const char *name, char **out);

/* Chunk shape for a dataset whose rows are `rank-1`-dimensional `dims[1..]` of `elem`
 * bytes: chunk[0] rows of whole rows near FMOE_H5_CHUNK_TARGET bytes (or exactly
 * `rows_hint` rows when > 0), splitting the inner dimensions only when one row alone
 * exceeds FMOE_H5_CHUNK_MAX. @return 0, or FMOE_EINVAL when rows_hint makes chunks past
 * HDF5's 4 GiB limit. */
int fmoe__h5_chunk_shape(int rank, const hsize_t *dims, size_t elem, int64_t rows_hint,
                         hsize_t *chunk);

/* Creates an extendible, chunked, compressed dataset `name` with dims[0] = 0 rows
 * (maxdims[0] unlimited, the rest fixed at dims[1..]). @return the dataset id, or a
 * negative FMOE_E* code with the detail set. */
hid_t fmoe__h5_dataset_create_rows(hid_t file, const char *path, const char *name, hid_t file_type,
                                   int rank, const hsize_t *dims,
                                   const fmoe_trace_write_options *opts);

/* Extends dataset `d` (named `name`) along dimension 0 by `nrows` rows and writes them
 * from `data` (mem_type, rows of the dataset's inner shape). @return 0 or FMOE_EIO. */
int fmoe__h5_dataset_append_rows(hid_t d, const char *path, const char *name, hid_t mem_type,
                                 hsize_t nrows, const void *data);

/* Writes rows [row0, row0 + nrows) of an existing dataset (no extension). */
int fmoe__h5_dataset_write_rows(hid_t d, const char *path, const char *name, hid_t mem_type,
                                hsize_t row0, hsize_t nrows, const void *data);

/* Reads rows [row0, row0 + nrows) of dataset `d` into `data` as mem_type. */
int fmoe__h5_dataset_read_rows(hid_t d, const char *path, const char *name, hid_t mem_type,
                               hsize_t row0, hsize_t nrows, void *data);

/* Opens dataset `name` with a chunk cache big enough to hold two of its chunks, so reading
 * a file in small consecutive ranges decompresses each chunk once. < 0 (FMOE_E*) on error;
 * FMOE_ENOTFOUND when the link does not exist (detail set). */
hid_t fmoe__h5_dataset_open(hid_t file, const char *path, const char *name);

/* H5Dread that first tells our zstd filter the bytes each chunk of `d` must decode to
 * (fmoe__h5z_zstd_expect), so a damaged frame that decodes short fails the read instead of
 * letting libhdf5 copy a whole chunk out of it. Every read of a dataset goes through it. */
herr_t fmoe__h5_dread(hid_t d, hid_t mem_type, hid_t mem_space, hid_t file_space, void *buf);

/* Checks that every element of dataset `d` is backed by stored data: all chunks covering
 * its extent are allocated (chunked layout), or its whole storage is (contiguous). A
 * dataset whose extent grew without data written (a forged or damaged header) would read
 * as fill values, and its declared size could not be trusted to size allocations.
 * @return 0 or FMOE_EFORMAT naming the dataset. */
int fmoe__h5_check_stored(hid_t d, const char *path, const char *name);

/* 1 when a link `name` ("/tokens/probs") of `loc` exists, following each group on the
 * way; 0 when not. Every object header on the way (the last included) is checked
 * against the file's bytes before libhdf5 loads it (fmoe__h5_link_check). < 0 on error,
 * with the error set, naming `path` (the file) and `name`. */
int fmoe__h5_exists(hid_t loc, const char *path, const char *name);

/* Checks the root attributes `format` == expected_format and `version` == expected_version
 * of an fmoe file. `hint` (may be NULL) is appended when the format is `hint_format`, e.g.
 * to tell a user who passed a trace where a store was expected what to do. Errors:
 * FMOE_EFORMAT (missing or other format), FMOE_EUNSUPPORTED (other version). */
int fmoe__h5_check_format(hid_t file, const char *path, const char *what,
                          const char *expected_format, int expected_version,
                          const char *hint_format, const char *hint);

#endif
