/*
 * safetensors.c - validated, memory-mapped safetensors files and sharded checkpoints.
 *
 * Design. A file is mapped read-only (MAP_PRIVATE) and its header parsed with cJSON into
 * a flat array of fmoe_st_tensor views; all shards' arrays are then merged into one array
 * sorted by name, so lookups are a binary search. The mapping is never written, and
 * nothing points into the header text after open: names are copied into one arena.
 *
 * What is checked, in the order a bad file fails (each a one-line error naming the file):
 *   1. at least 8 bytes; the little-endian u64 header length N fits in the file and is at
 *      most 100 MB (the reference implementation's limit);
 *   2. the N bytes are one JSON object (trailing spaces allowed: writers pad to 8 bytes);
 *   3. each member other than "__metadata__" is an object with a string dtype from the
 *      format's list, a shape of non-negative integers (at most 8 dims), and data_offsets
 *      [begin, end] with begin <= end <= data size (file size - 8 - N);
 *   4. element count times dtype size equals end - begin, without overflow;
 *   5. no two tensors share bytes (sorted by begin, each starts at or after every earlier
 *      one's end), and no name appears twice;
 *   6. the data area ends with the last tensor's data: no bytes after it (a file of 10 GB
 *      appended to its tensors was accepted, and mapped whole).
 * The reference implementation also demands that tensors tile the data area with no
 * holes; we accept holes between tensors (they are harmless for a reader) but never
 * overlaps or trailing bytes.
 */
#include "fmoe/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fmoe/error.h"
#include "files.h"

#define MAX_HEADER_BYTES 100000000ull
#define MAX_INDEX_BYTES (64 << 20)

static const struct {
    const char *name;
    int32_t size;
} dtype_table[] = {
    [FMOE_ST_F32] = {"F32", 4},      [FMOE_ST_F16] = {"F16", 2},
    [FMOE_ST_BF16] = {"BF16", 2},    [FMOE_ST_F64] = {"F64", 8},
    [FMOE_ST_I64] = {"I64", 8},      [FMOE_ST_I32] = {"I32", 4},
    [FMOE_ST_I16] = {"I16", 2},      [FMOE_ST_I8] = {"I8", 1},
    [FMOE_ST_U64] = {"U64", 8},      [FMOE_ST_U32] = {"U32", 4},
    [FMOE_ST_U16] = {"U16", 2},      [FMOE_ST_U8] = {"U8", 1},
    [FMOE_ST_BOOL] = {"BOOL", 1},    [FMOE_ST_F8_E4M3] = {"F8_E4M3", 1},
    [FMOE_ST_F8_E5M2] = {"F8_E5M2", 1},
};
#define NUM_DTYPES ((int)(sizeof dtype_table / sizeof dtype_table[0]))

const char *fmoe_st_dtype_name(fmoe_st_dtype d) {
    return (int)d >= 0 && (int)d < NUM_DTYPES ? dtype_table[d].name : "unknown";
}

int32_t fmoe_st_dtype_size(fmoe_st_dtype d) {
    return (int)d >= 0 && (int)d < NUM_DTYPES ? dtype_table[d].size : 0;
}

typedef struct st_file {
    char *path;
    void *map;     /* PROT_READ mapping of the whole file */
    uint64_t size;
} st_file;

struct fmoe_safetensors {
    st_file *files;
    int32_t num_files;
    fmoe_st_tensor *tensors; /* [n] sorted by name */
    int64_t n;
    int64_t cap;
    int64_t data_bytes;
    char **names;            /* [num_names] owned name strings */
    int64_t num_names;
    int64_t names_cap;
};

/* ---------------------------------------------------------------------------------- */
/* Header parsing                                                                     */
/* ---------------------------------------------------------------------------------- */

static int add_tensor(fmoe_safetensors *st, const fmoe_st_tensor *t, const char *name) {
    if (st->n == st->cap) {
        int64_t cap = st->cap ? st->cap * 2 : 64;
        fmoe_st_tensor *nt = realloc(st->tensors, (size_t)cap * sizeof *nt);
        if (!nt) return fmoe_error_set(FMOE_ENOMEM, "out of memory listing tensors");
        st->tensors = nt;
        st->cap = cap;
    }
    if (st->num_names == st->names_cap) {
        int64_t cap = st->names_cap ? st->names_cap * 2 : 64;
        char **nn = realloc(st->names, (size_t)cap * sizeof *nn);
        if (!nn) return fmoe_error_set(FMOE_ENOMEM, "out of memory listing tensors");
        st->names = nn;
        st->names_cap = cap;
    }
    char *copy = strdup(name);
    if (!copy) return fmoe_error_set(FMOE_ENOMEM, "out of memory listing tensors");
    st->names[st->num_names++] = copy;
    st->tensors[st->n] = *t;
    st->tensors[st->n].name = copy;
    st->n++;
    return 0;
}

/* A JSON number that is a non-negative integer below 2^53 (exact in a double). */
static int json_u53(const cJSON *it, int64_t *out) {
    if (!cJSON_IsNumber(it)) return -1;
    double d = it->valuedouble;
    if (!isfinite(d) || d < 0 || d != floor(d) || d > 9007199254740992.0) return -1;
    *out = (int64_t)d;
    return 0;
}

static int parse_dtype(const char *s, fmoe_st_dtype *out) {
    for (int i = 0; i < NUM_DTYPES; i++)
        if (strcmp(s, dtype_table[i].name) == 0) {
            *out = (fmoe_st_dtype)i;
            return 0;
        }
    return -1;
}

/* Parses one tensor entry of file `fname`. */
static int parse_entry(const cJSON *e, const char *fname, const uint8_t *data,
                       uint64_t data_size, fmoe_st_tensor *t) {
    const char *name = e->string;
    memset(t, 0, sizeof *t);
    FMOE_RETURN_ERROR_IF(!cJSON_IsObject(e), FMOE_EFORMAT,
                         "%s: tensor \"%.200s\": entry is not a JSON object", fname, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    FMOE_RETURN_ERROR_IF(!cJSON_IsString(dt), FMOE_EFORMAT,
                         "%s: tensor \"%.200s\": missing or non-string dtype", fname, name);
    FMOE_RETURN_ERROR_IF(parse_dtype(dt->valuestring, &t->dtype) < 0, FMOE_EFORMAT,
                         "%s: tensor \"%.200s\": unknown dtype \"%.32s\"", fname, name,
                         dt->valuestring);
    FMOE_RETURN_ERROR_IF(!cJSON_IsArray(sh), FMOE_EFORMAT,
                         "%s: tensor \"%.200s\": missing or non-array shape", fname, name);
    int nd = cJSON_GetArraySize(sh);
    FMOE_RETURN_ERROR_IF(nd > FMOE_ST_MAX_DIMS, FMOE_EFORMAT,
                         "%s: tensor \"%.200s\": %d dimensions (at most %d)", fname, name, nd,
                         FMOE_ST_MAX_DIMS);
    t->ndim = nd;
    const int64_t esize = fmoe_st_dtype_size(t->dtype);
    int64_t numel = 1;
    int overflow = 0;
    for (int i = 0; i < nd; i++) {
        int64_t d;
        FMOE_RETURN_ERROR_IF(json_u53(cJSON_GetArrayItem(sh, i), &d) < 0, FMOE_EFORMAT,
                             "%s: tensor \"%.200s\": shape[%d] is not a non-negative integer",
                             fname, name, i);
        t->shape[i] = d;
        if (d != 0 && numel > INT64_MAX / esize / d) overflow = 1;
        numel *= overflow ? 1 : d;
    }
    FMOE_RETURN_ERROR_IF(!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2, FMOE_EFORMAT,
                         "%s: tensor \"%.200s\": data_offsets must be [begin, end]", fname,
                         name);
    int64_t begin, end;
    FMOE_RETURN_ERROR_IF(json_u53(cJSON_GetArrayItem(off, 0), &begin) < 0 ||
                             json_u53(cJSON_GetArrayItem(off, 1), &end) < 0,
                         FMOE_EFORMAT,
                         "%s: tensor \"%.200s\": data_offsets must be non-negative integers",
                         fname, name);
    FMOE_RETURN_ERROR_IF(begin > end, FMOE_EFORMAT,
                         "%s: tensor \"%.200s\": data_offsets [%lld, %lld] end before they "
                         "begin",
                         fname, name, (long long)begin, (long long)end);
    FMOE_RETURN_ERROR_IF((uint64_t)end > data_size, FMOE_EFORMAT,
                         "%s: tensor \"%.200s\": data_offsets [%lld, %lld] run past the end "
                         "of the data area (%llu bytes; truncated file?)",
                         fname, name, (long long)begin, (long long)end,
                         (unsigned long long)data_size);
    FMOE_RETURN_ERROR_IF(overflow || numel * esize != end - begin, FMOE_EFORMAT,
                         "%s: tensor \"%.200s\": dtype %s and shape hold %s%lld bytes, but "
                         "data_offsets span %lld",
                         fname, name, dtype_table[t->dtype].name, overflow ? "over " : "",
                         overflow ? (long long)INT64_MAX : (long long)(numel * esize),
                         (long long)(end - begin));
    t->numel = numel;
    t->nbytes = end - begin;
    t->offset = begin; /* relative to the data area until the caller rebases it */
    t->data = data + begin;
    t->file = fname;
    return 0;
}

static int cmp_by_offset(const void *a, const void *b) {
    const fmoe_st_tensor *x = a, *y = b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return (x->nbytes > y->nbytes) - (x->nbytes < y->nbytes);
}

static int cmp_by_name(const void *a, const void *b) {
    return strcmp(((const fmoe_st_tensor *)a)->name, ((const fmoe_st_tensor *)b)->name);
}

/* Checks that tensors [first, st->n) of one file do not overlap; reorders them. */
static int check_overlap(fmoe_safetensors *st, int64_t first, const char *fname) {
    if (st->n <= first) return 0; /* no tensors: st->tensors may be NULL, and NULL + 0 is UB */
    fmoe_st_tensor *v = st->tensors + first;
    int64_t m = st->n - first;
    if (m > 1) qsort(v, (size_t)m, sizeof *v, cmp_by_offset);
    int64_t max_begin = 0, max_end = 0; /* the tensor reaching furthest so far */
    const char *max_name = NULL;
    for (int64_t i = 0; i < m; i++) {
        if (v[i].nbytes > 0 && v[i].offset < max_end)
            return fmoe_error_set(FMOE_EFORMAT,
                                  "%s: tensors \"%.200s\" and \"%.200s\" overlap (bytes "
                                  "[%lld, %lld) and [%lld, %lld) of the data area)",
                                  fname, max_name, v[i].name, (long long)max_begin,
                                  (long long)max_end, (long long)v[i].offset,
                                  (long long)(v[i].offset + v[i].nbytes));
        if (v[i].offset + v[i].nbytes > max_end) {
            max_begin = v[i].offset;
            max_end = v[i].offset + v[i].nbytes;
            max_name = v[i].name;
        }
    }
    return 0;
}

/* Parses the header of one file held in memory and appends its tensors to `st`. */
static int parse_file(fmoe_safetensors *st, const uint8_t *bytes, uint64_t size,
                      const char *fname) {
    FMOE_RETURN_ERROR_IF(size < 8, FMOE_EFORMAT,
                         "%s: %llu bytes is too short for a safetensors file (it starts with "
                         "an 8-byte header length)",
                         fname, (unsigned long long)size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | bytes[i];
    FMOE_RETURN_ERROR_IF(hlen > size - 8, FMOE_EFORMAT,
                         "%s: header length %llu exceeds the %llu bytes after it (truncated "
                         "or not a safetensors file)",
                         fname, (unsigned long long)hlen, (unsigned long long)(size - 8));
    FMOE_RETURN_ERROR_IF(hlen > MAX_HEADER_BYTES, FMOE_EFORMAT,
                         "%s: header length %llu exceeds the format's limit of %llu bytes",
                         fname, (unsigned long long)hlen, MAX_HEADER_BYTES);
    FMOE_RETURN_ERROR_IF(hlen < 2, FMOE_EFORMAT,
                         "%s: header length %llu is too short for a JSON object", fname,
                         (unsigned long long)hlen);
    const char *json = (const char *)bytes + 8;
    const uint8_t *data = bytes + 8 + hlen;
    const uint64_t data_size = size - 8 - hlen;

    FMOE_RETURN_ERROR_IF(json[0] != '{', FMOE_EFORMAT,
                         "%s: malformed header: it must be a JSON object starting with '{'",
                         fname);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, (size_t)hlen, &end, 0);
    if (!root) {
        size_t at = end && end >= json && (uint64_t)(end - json) <= hlen ? (size_t)(end - json)
                                                                         : 0;
        return fmoe_error_set(FMOE_EFORMAT, "%s: malformed header JSON near byte %zu", fname,
                              at + 8);
    }
    int rc = 0;
    for (size_t i = (size_t)(end - json); i < hlen; i++) {
        char c = json[i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r' && c != '\0') {
            rc = fmoe_error_set(FMOE_EFORMAT,
                                "%s: malformed header: unexpected bytes after the JSON object "
                                "at byte %zu",
                                fname, i + 8);
            goto done;
        }
    }
    if (!cJSON_IsObject(root)) {
        rc = fmoe_error_set(FMOE_EFORMAT, "%s: malformed header: not a JSON object", fname);
        goto done;
    }
    const int64_t first = st->n;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (!e->string || !e->string[0]) {
            rc = fmoe_error_set(FMOE_EFORMAT, "%s: a tensor has an empty name", fname);
            goto done;
        }
        if (strcmp(e->string, "__metadata__") == 0) {
            if (!cJSON_IsObject(e)) {
                rc = fmoe_error_set(FMOE_EFORMAT, "%s: __metadata__ is not a JSON object",
                                    fname);
                goto done;
            }
            continue;
        }
        fmoe_st_tensor t;
        rc = parse_entry(e, fname, data, data_size, &t);
        if (rc < 0) goto done;
        rc = add_tensor(st, &t, e->string);
        if (rc < 0) goto done;
    }
    rc = check_overlap(st, first, fname);
    if (rc < 0) goto done;
    /* The data area ends where the last tensor's data does (the format: "the byte buffer
     * needs to be entirely indexed"): bytes after it are appended to the file or belong to
     * tensors the header lost, and a reader cannot tell which. */
    uint64_t data_end = 0;
    for (int64_t i = first; i < st->n; i++)
        if ((uint64_t)(st->tensors[i].offset + st->tensors[i].nbytes) > data_end)
            data_end = (uint64_t)(st->tensors[i].offset + st->tensors[i].nbytes);
    if (data_end < data_size) {
        rc = fmoe_error_set(FMOE_EFORMAT,
                            "%s: %llu byte%s after the last tensor's data, from byte %llu to "
                            "the end of the file at %llu (the format allows none: bytes "
                            "appended, or tensors missing from the header?)",
                            fname, (unsigned long long)(data_size - data_end),
                            data_size - data_end == 1 ? "" : "s",
                            (unsigned long long)(8 + hlen + data_end),
                            (unsigned long long)size);
        goto done;
    }
    for (int64_t i = first; i < st->n; i++) {
        st->tensors[i].offset += (int64_t)(8 + hlen);
        st->data_bytes += st->tensors[i].nbytes;
    }
done:
    cJSON_Delete(root);
    return rc;
}

/* Sorts all tensors by name and refuses duplicates (within a file or across shards). */
static int sort_and_check_names(fmoe_safetensors *st) {
    if (st->n > 1) qsort(st->tensors, (size_t)st->n, sizeof *st->tensors, cmp_by_name);
    for (int64_t i = 1; i < st->n; i++)
        if (strcmp(st->tensors[i - 1].name, st->tensors[i].name) == 0) {
            if (strcmp(st->tensors[i - 1].file, st->tensors[i].file) == 0)
                return fmoe_error_set(FMOE_EFORMAT, "%s: tensor \"%.200s\" appears twice",
                                      st->tensors[i].file, st->tensors[i].name);
            return fmoe_error_set(FMOE_EFORMAT, "tensor \"%.200s\" is in both %s and %s",
                                  st->tensors[i].name, st->tensors[i - 1].file,
                                  st->tensors[i].file);
        }
    return 0;
}

/* ---------------------------------------------------------------------------------- */
/* Files                                                                              */
/* ---------------------------------------------------------------------------------- */

static void free_lists(fmoe_safetensors *st) {
    for (int64_t i = 0; i < st->num_names; i++) free(st->names[i]);
    free(st->names);
    free(st->tensors);
}

void fmoe_safetensors_release_pages(fmoe_safetensors *st) {
    for (int32_t i = 0; st && i < st->num_files; i++)
        if (st->files[i].map) madvise(st->files[i].map, (size_t)st->files[i].size, MADV_DONTNEED);
}

void fmoe_safetensors_populate_pages(fmoe_safetensors *st) {
    for (int32_t i = 0; st && i < st->num_files; i++)
        fmoe__populate_read(st->files[i].map, (size_t)st->files[i].size);
}

void fmoe_safetensors_close(fmoe_safetensors *st) {
    if (!st) return;
    for (int32_t i = 0; i < st->num_files; i++) {
        if (st->files[i].map) munmap(st->files[i].map, (size_t)st->files[i].size);
        free(st->files[i].path);
    }
    free(st->files);
    free_lists(st);
    free(st);
}

/* Maps `path` and parses its header into `st`. */
static int open_file(fmoe_safetensors *st, const char *path) {
    st_file *nf = realloc(st->files, (size_t)(st->num_files + 1) * sizeof *nf);
    if (!nf) return fmoe_error_set(FMOE_ENOMEM, "out of memory");
    st->files = nf;
    st_file *f = &st->files[st->num_files];
    memset(f, 0, sizeof *f);
    f->path = strdup(path);
    if (!f->path) return fmoe_error_set(FMOE_ENOMEM, "out of memory");
    st->num_files++;

    int fd = fmoe__open_regular(path); /* lib/files.h: a FIFO must not block the open */
    if (fd < 0) return fd;
    struct stat sb;
    if (fstat(fd, &sb) < 0) {
        int e = errno;
        close(fd);
        return fmoe_error_set(FMOE_EIO, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return fmoe_error_set(FMOE_EIO, "%s: not a regular file", path);
    }
    f->size = (uint64_t)sb.st_size;
    if (f->size < 8) {
        close(fd);
        return fmoe_error_set(FMOE_EFORMAT,
                              "%s: %llu bytes is too short for a safetensors file (it starts "
                              "with an 8-byte header length)",
                              path, (unsigned long long)f->size);
    }
    void *map = mmap(NULL, (size_t)f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return fmoe_error_set(FMOE_EIO, "%s: mmap: %s", path, strerror(e));
    f->map = map;
    return parse_file(st, map, f->size, f->path);
}

/* Reads a small text file (the index) into a NUL-terminated buffer (lib/files.h: a
 * regular file of at most MAX_INDEX_BYTES). */
static int read_text(const char *path, char **out, size_t *len) {
    return fmoe__read_file_bounded(path, "a safetensors index", MAX_INDEX_BYTES, 0, out, len);
}

static int is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* A shard name from an index: a plain file name in the model directory. */
static int safe_shard_name(const char *s) {
    return s[0] && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

/* Opens the shards listed by model.safetensors.index.json in `dir`. */
static int open_index(fmoe_safetensors *st, const char *dir, const char *index_path) {
    char *text = NULL;
    size_t len = 0;
    FMOE_FORWARD_IF_ERROR(read_text(index_path, &text, &len));
    int rc = 0;
    char *path = NULL;
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root || !cJSON_IsObject(root)) {
        rc = fmoe_error_set(FMOE_EFORMAT, "%s: malformed JSON", index_path);
        goto done;
    }
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm)) {
        rc = fmoe_error_set(FMOE_EFORMAT, "%s: missing \"weight_map\" object", index_path);
        goto done;
    }
    size_t cap = strlen(dir) + 512;
    path = malloc(cap);
    if (!path) {
        rc = fmoe_error_set(FMOE_ENOMEM, "out of memory");
        goto done;
    }
    /* Open each distinct shard once, in order of first mention. Checkpoints have far
     * fewer shards than tensors, so the shards opened so far are the list to search. */
    const size_t dlen = strlen(dir) + 1;
    for (const cJSON *e = wm->child; e; e = e->next) {
        if (!cJSON_IsString(e) || !safe_shard_name(e->valuestring) ||
            strlen(e->valuestring) > 400) {
            rc = fmoe_error_set(FMOE_EFORMAT,
                                "%s: weight_map[\"%.200s\"] is not a file name in the model "
                                "directory",
                                index_path, e->string ? e->string : "");
            goto done;
        }
        int seen = 0;
        for (int32_t f = 0; f < st->num_files && !seen; f++)
            seen = strcmp(st->files[f].path + dlen, e->valuestring) == 0;
        if (seen) continue;
        snprintf(path, cap, "%s/%s", dir, e->valuestring);
        rc = open_file(st, path);
        if (rc < 0) goto done;
    }
    rc = sort_and_check_names(st);
    if (rc < 0) goto done;
    /* Every tensor the index names is in the shard it names. */
    for (const cJSON *e = wm->child; e; e = e->next) {
        const fmoe_st_tensor *t = fmoe_safetensors_find(st, e->string);
        snprintf(path, cap, "%s/%s", dir, e->valuestring);
        if (!t) {
            rc = fmoe_error_set(FMOE_ENOTFOUND, "%s: tensor \"%.200s\" is not in %s",
                                index_path, e->string, path);
            goto done;
        }
        if (strcmp(t->file, path) != 0) {
            rc = fmoe_error_set(FMOE_EFORMAT, "%s: tensor \"%.200s\" is in %s, not in %s",
                                index_path, e->string, t->file, path);
            goto done;
        }
    }
done:
    free(path);
    cJSON_Delete(root);
    free(text);
    return rc;
}

int fmoe_safetensors_open(const char *path, fmoe_safetensors **out) {
    if (!path || !out) return fmoe_error_set(FMOE_EINVAL, "path or output is NULL");
    *out = NULL;
    fmoe_safetensors *st = calloc(1, sizeof *st);
    if (!st) return fmoe_error_set(FMOE_ENOMEM, "out of memory");
    int rc;
    if (is_dir(path)) {
        size_t cap = strlen(path) + 64;
        char *p = malloc(cap);
        if (!p) {
            rc = fmoe_error_set(FMOE_ENOMEM, "out of memory");
            goto fail;
        }
        snprintf(p, cap, "%s/model.safetensors.index.json", path);
        if (exists(p)) {
            rc = open_index(st, path, p);
        } else {
            snprintf(p, cap, "%s/model.safetensors", path);
            if (exists(p)) {
                rc = open_file(st, p);
                if (rc == 0) rc = sort_and_check_names(st);
            } else {
                rc = fmoe_error_set(FMOE_ENOTFOUND,
                                    "%s: no model.safetensors or model.safetensors.index.json",
                                    path);
            }
        }
        free(p);
    } else {
        rc = open_file(st, path);
        if (rc == 0) rc = sort_and_check_names(st);
    }
    if (rc < 0) goto fail;
    *out = st;
    return 0;
fail:
    fmoe_safetensors_close(st);
    return rc;
}

int fmoe_safetensors_validate(const void *bytes, uint64_t size, const char *name) {
    if (!bytes && size) return fmoe_error_set(FMOE_EINVAL, "bytes is NULL");
    fmoe_safetensors st = {0};
    int rc = parse_file(&st, bytes ? bytes : (const void *)"", size, name ? name : "input");
    if (rc == 0) rc = sort_and_check_names(&st);
    free_lists(&st);
    return rc;
}

/* ---------------------------------------------------------------------------------- */
/* Lookup                                                                             */
/* ---------------------------------------------------------------------------------- */

int64_t fmoe_safetensors_count(const fmoe_safetensors *st) { return st ? st->n : 0; }

int64_t fmoe_safetensors_data_bytes(const fmoe_safetensors *st) {
    return st ? st->data_bytes : 0;
}

const fmoe_st_tensor *fmoe_safetensors_at(const fmoe_safetensors *st, int64_t i) {
    return st && i >= 0 && i < st->n ? &st->tensors[i] : NULL;
}

const fmoe_st_tensor *fmoe_safetensors_find(const fmoe_safetensors *st, const char *name) {
    if (!st || !name) return NULL;
    int64_t lo = 0, hi = st->n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(st->tensors[mid].name, name);
        if (c == 0) return &st->tensors[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

int64_t fmoe_safetensors_strip_prefix(fmoe_safetensors *st, const char *prefix) {
    if (!st || !prefix) return fmoe_error_set(FMOE_EINVAL, "NULL argument");
    const size_t len = strlen(prefix);
    int64_t renamed = 0;
    for (int64_t i = 0; i < st->n; i++)
        if (strncmp(st->tensors[i].name, prefix, len) == 0) {
            st->tensors[i].name += len; /* into the owned string names[] keeps for free */
            renamed++;
        }
    if (renamed == 0) return 0;
    FMOE_FORWARD_IF_ERROR(sort_and_check_names(st));
    return renamed;
}

static void format_shape(char *buf, size_t cap, int32_t ndim, const int64_t *shape) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int32_t i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, i ? ",%lld" : "%lld", (long long)shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

int fmoe_safetensors_get(const fmoe_safetensors *st, const char *name, int32_t ndim,
                         const int64_t *shape, const fmoe_st_tensor **out) {
    if (!st || !name || !out) return fmoe_error_set(FMOE_EINVAL, "NULL argument");
    const fmoe_st_tensor *t = fmoe_safetensors_find(st, name);
    if (!t)
        return fmoe_error_set(FMOE_ENOTFOUND, "%s: missing tensor %s",
                              st->num_files == 1 ? st->files[0].path : "checkpoint", name);
    if (t->dtype != FMOE_ST_F32 && t->dtype != FMOE_ST_F16 && t->dtype != FMOE_ST_BF16)
        return fmoe_error_set(FMOE_EUNSUPPORTED,
                              "%s: tensor %s has dtype %s; fmoe computes with F32, F16 and "
                              "BF16",
                              t->file, name, fmoe_st_dtype_name(t->dtype));
    int ok = t->ndim == ndim;
    for (int32_t i = 0; ok && i < ndim; i++) ok = shape[i] < 0 || shape[i] == t->shape[i];
    if (!ok) {
        char got[160], want[160];
        format_shape(got, sizeof got, t->ndim, t->shape);
        format_shape(want, sizeof want, ndim, shape);
        return fmoe_error_set(FMOE_EMISMATCH, "%s: tensor %s has shape %s, expected %s",
                              t->file, name, got, want);
    }
    *out = t;
    return 0;
}
