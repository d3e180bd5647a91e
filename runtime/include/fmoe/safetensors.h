/*
 * fmoe/safetensors.h - read-only, validated, memory-mapped safetensors checkpoints.
 *
 *     fmoe_safetensors *st;
 *     if (fmoe_safetensors_open("model_dir", &st) < 0) fail(fmoe_error_detail());
 *     const fmoe_st_tensor *t = fmoe_safetensors_find(st, "model.norm.weight");
 *     ... t->data, t->dtype, t->shape ...
 *     fmoe_safetensors_close(st);
 *
 * Everything is validated at open, before any tensor is handed out: the 8-byte header
 * length fits in the file, the header is one well-formed JSON object, every entry has a
 * known dtype, a non-negative shape and data_offsets [begin, end) inside the data area,
 * dtype size times element count equals end - begin, and no two tensors overlap. Sharded
 * checkpoints are read through model.safetensors.index.json; every tensor its weight_map
 * names must be in the shard it names, and no tensor may appear in two shards. Every error
 * is one line naming the file and, where there is one, the tensor.
 *
 * Tensor data stays in the page cache: `data` points into a read-only private mapping
 * that lives until close. Tensors of any safetensors dtype are listed (their sizes are
 * checked like the others); fmoe_safetensors_get() is the accessor that refuses, by name,
 * anything but F32, F16 and BF16.
 *
 * Thread safety: an open handle is immutable; any number of threads may read it.
 */
#ifndef FMOE_SAFETENSORS_H
#define FMOE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define FMOE_ST_MAX_DIMS 8

/* The dtypes of the safetensors format. Only F32, F16 and BF16 are computed with. */
typedef enum fmoe_st_dtype {
    FMOE_ST_F32 = 0,
    FMOE_ST_F16 = 1,
    FMOE_ST_BF16 = 2,
    FMOE_ST_F64 = 3,
    FMOE_ST_I64 = 4,
    FMOE_ST_I32 = 5,
    FMOE_ST_I16 = 6,
    FMOE_ST_I8 = 7,
    FMOE_ST_U64 = 8,
    FMOE_ST_U32 = 9,
    FMOE_ST_U16 = 10,
    FMOE_ST_U8 = 11,
    FMOE_ST_BOOL = 12,
    FMOE_ST_F8_E4M3 = 13,
    FMOE_ST_F8_E5M2 = 14,
} fmoe_st_dtype;

/* One tensor: a borrowed view, valid until fmoe_safetensors_close. */
typedef struct fmoe_st_tensor {
    const char *name;             /* tensor name, NUL-terminated */
    const char *file;             /* the path of the file that holds it */
    fmoe_st_dtype dtype;
    int32_t ndim;                 /* 0 (a scalar) .. FMOE_ST_MAX_DIMS */
    int64_t shape[FMOE_ST_MAX_DIMS];
    int64_t numel;                /* product of shape (1 for a scalar) */
    int64_t nbytes;               /* numel * element size */
    int64_t offset;               /* byte offset of the data in its file */
    const void *data;             /* nbytes bytes in the read-only mapping */
} fmoe_st_tensor;

typedef struct fmoe_safetensors fmoe_safetensors;

/*
 * Opens `path`: a .safetensors file, or a directory holding model.safetensors.index.json
 * (sharded) or model.safetensors (single file). Maps and validates every file.
 * @return 0 and *out, or FMOE_EIO (cannot open/stat/map), FMOE_EFORMAT (a malformed
 *         header: the detail names the file, the tensor and what was wrong),
 *         FMOE_ENOTFOUND (a directory without a checkpoint; a shard without a tensor its
 *         index names), FMOE_ENOMEM.
 */
int fmoe_safetensors_open(const char *path, fmoe_safetensors **out);

/* Unmaps everything; NULL is a no-op. Pointers from the handle become invalid. */
void fmoe_safetensors_close(fmoe_safetensors *st);

/* Drops the mapped pages of every file from the process (they fault back in when
 * touched), as fmoe_gguf_release_pages. */
void fmoe_safetensors_release_pages(fmoe_safetensors *st);

/* Maps every page of every file into the process now, as fmoe_gguf_populate_pages. */
void fmoe_safetensors_populate_pages(fmoe_safetensors *st);

/* Number of tensors over all shards. */
int64_t fmoe_safetensors_count(const fmoe_safetensors *st);

/* The i-th tensor in name order (0 <= i < count), or NULL. */
const fmoe_st_tensor *fmoe_safetensors_at(const fmoe_safetensors *st, int64_t i);

/* Renames every tensor whose name starts with `prefix` to the rest of its name (a
 * multimodal checkpoint's text model, "language_model.model.norm.weight" ->
 * "model.norm.weight"), so that it is found by that name; the others keep theirs.
 * @return the number renamed, or FMOE_EFORMAT when a new name is already taken (the
 * checkpoint is then unusable: close it). */
int64_t fmoe_safetensors_strip_prefix(fmoe_safetensors *st, const char *prefix);

/* The tensor called `name`, or NULL when absent (no error detail is set). O(log n). */
const fmoe_st_tensor *fmoe_safetensors_find(const fmoe_safetensors *st, const char *name);

/*
 * The tensor `name`, checked for use: present, of dtype F32, F16 or BF16, and of the
 * `ndim` dimensions in `shape` (a -1 entry matches any extent).
 * @return 0 and *out, FMOE_ENOTFOUND ("model.safetensors: missing tensor X"),
 *         FMOE_EUNSUPPORTED (another dtype, named), FMOE_EMISMATCH ("... has shape [a,b],
 *         expected [c,d]").
 */
int fmoe_safetensors_get(const fmoe_safetensors *st, const char *name, int32_t ndim,
                         const int64_t *shape, const fmoe_st_tensor **out);

/* The total bytes of tensor data over all shards. */
int64_t fmoe_safetensors_data_bytes(const fmoe_safetensors *st);

/* "F32", "BF16", ... as written in safetensors headers. */
const char *fmoe_st_dtype_name(fmoe_st_dtype d);

/* Bytes per element (F8: 1, BOOL: 1). */
int32_t fmoe_st_dtype_size(fmoe_st_dtype d);

/*
 * Validates one safetensors file held in memory (`size` bytes) without mapping anything;
 * `name` is used in error details. This is the parser behind open, exposed for the fuzz
 * target and the tests. @return 0 or the codes of open.
 */
int fmoe_safetensors_validate(const void *bytes, uint64_t size, const char *name);

#endif
