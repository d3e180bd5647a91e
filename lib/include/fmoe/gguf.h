/*
 * fmoe/gguf.h - read-only, validated, memory-mapped GGUF files (llama.cpp's model format).
 *
 *     fmoe_gguf *g;
 *     if (fmoe_gguf_open("model.gguf", &g) < 0) fail(fmoe_error_detail());
 *     const fmoe_gguf_kv *kv = fmoe_gguf_find_kv(g, "general.architecture");
 *     const fmoe_gguf_tensor *t = fmoe_gguf_find_tensor(g, "blk.0.ffn_down_exps.weight");
 *     ... t->type, t->ne, t->data ...
 *     fmoe_gguf_close(g);
 *
 * The format (GGUF versions 2 and 3, little-endian; docs/quantization.md): the magic
 * "GGUF", a uint32 version, uint64 tensor and key-value counts, the key-value pairs
 * (uint64-length strings as keys, a uint32 value type, the value; arrays are a uint32
 * element type, a uint64 count and the elements), the tensor infos (name, uint32 dims,
 * uint64 extents innermost first, uint32 ggml type, uint64 offset relative to the data
 * section), padding to general.alignment (a uint32; 32 when absent), then the data.
 *
 * Everything is validated at open, before anything is handed out: every count, length and
 * offset against the bytes that remain (a 4 GB string in a 1 KB file is refused before any
 * allocation), value types, a power-of-two alignment, tensor types known to ggml, extents
 * whose row length is a whole number of blocks, tensor offsets aligned, inside the file and
 * not overlapping, no two keys or tensors of one name. Every error is one line naming the
 * file, the key or tensor, and the byte offset where the problem is.
 *
 * Tensors of any ggml type are listed (fmoe inspect shows them); fmoe_gguf_get_tensor is
 * the accessor that refuses, by name and type, what fmoe cannot compute with.
 *
 * Split models (llama.cpp's llama-gguf-split, gguf-py's GGUFWriter with split_max_tensors or
 * split_max_size): shards PREFIX-00001-of-0000N.gguf .. PREFIX-0000N-of-0000N.gguf, each a
 * complete GGUF file with the keys split.no (0-based), split.count and split.tensors.count;
 * shard 1 holds every other key. fmoe_gguf_open given shard 1 opens them all and presents
 * one handle: the keys are shard 1's, the tensors those of every shard in shard order, each
 * with the file and offset of its own shard. Checked at open: the path given is shard 1 by
 * its name and its split.no, every shard exists and says its own number and the same count,
 * no tensor name is in two shards, and the tensors add up to split.tensors.count. What ties
 * a shard to shard 1, so that a shard of another model is refused: the same GGUF version,
 * the same split.tensors.count, and every key both carry of one value. Nothing else in the
 * format does: a shard of another model of the same config, split the same way, holding
 * tensors of the same names, types and shapes, is not told apart (llama.cpp checks less).
 *
 * Thread safety: an open handle is immutable; any number of threads may read it.
 */
#ifndef FMOE_GGUF_H
#define FMOE_GGUF_H

#include <stddef.h>
#include <stdint.h>

#define FMOE_GGUF_MAX_DIMS 4          /* GGML_MAX_DIMS */
#define FMOE_GGUF_MAX_NAME 63         /* tensor names are shorter than GGML_MAX_NAME (64) */
#define FMOE_GGUF_DEFAULT_ALIGNMENT 32

/* Value types of the key-value section. Explicit numbers: they are the format. */
typedef enum fmoe_gguf_value_type {
    FMOE_GGUF_UINT8 = 0,
    FMOE_GGUF_INT8 = 1,
    FMOE_GGUF_UINT16 = 2,
    FMOE_GGUF_INT16 = 3,
    FMOE_GGUF_UINT32 = 4,
    FMOE_GGUF_INT32 = 5,
    FMOE_GGUF_FLOAT32 = 6,
    FMOE_GGUF_BOOL = 7,
    FMOE_GGUF_STRING = 8,
    FMOE_GGUF_ARRAY = 9,
    FMOE_GGUF_UINT64 = 10,
    FMOE_GGUF_INT64 = 11,
    FMOE_GGUF_FLOAT64 = 12,
} fmoe_gguf_value_type;

/* A string inside the file: `len` bytes at `ptr`, not NUL-terminated. */
typedef struct fmoe_gguf_str {
    const char *ptr;
    uint64_t len;
} fmoe_gguf_str;

/* One key-value pair; views valid until fmoe_gguf_close. */
typedef struct fmoe_gguf_kv {
    const char *key;              /* NUL-terminated copy */
    fmoe_gguf_value_type type;    /* FMOE_GGUF_ARRAY for arrays */
    fmoe_gguf_value_type elem;    /* arrays: the element type; else == type */
    uint64_t count;               /* arrays: elements; else 1 */
    const void *data;             /* fixed-size values: count little-endian elements */
    const fmoe_gguf_str *strs;    /* strings: count strings (one for a plain string) */
    uint64_t offset;              /* file offset of the key's length field */
} fmoe_gguf_kv;

/* One tensor; a borrowed view valid until fmoe_gguf_close. */
typedef struct fmoe_gguf_tensor {
    const char *name;             /* NUL-terminated copy */
    uint32_t type;                /* ggml type number (fmoe/quant.h's fmoe_ggml_type) */
    int32_t ndim;                 /* 1 .. FMOE_GGUF_MAX_DIMS */
    int64_t ne[FMOE_GGUF_MAX_DIMS]; /* extents, ne[0] innermost (the row); 1 past ndim */
    int64_t numel;                /* product of ne */
    int64_t row_bytes;            /* bytes of one row of ne[0] values */
    int64_t nbytes;               /* row_bytes · numel / ne[0] */
    uint64_t offset;              /* absolute offset of the data in `file` */
    const void *data;             /* nbytes bytes in the read-only mapping */
    const char *file;             /* the file holding the data: the name given, or for a
                                     split model the shard's path */
    int32_t shard;                /* 0-based shard of a split model; 0 in a single file */
} fmoe_gguf_tensor;

typedef struct fmoe_gguf fmoe_gguf;

/*
 * Opens and maps `path` (a regular file) and validates it; the first shard of a split model
 * opens every shard (above).
 * @return 0 and *out, or FMOE_EIO (cannot open/stat/map), FMOE_EFORMAT (malformed: the
 *         detail names the file, the key or tensor and the offset; a split model's shard
 *         missing, of another count, a tensor in two shards, the wrong total; another
 *         shard than the first given), FMOE_EUNSUPPORTED
 *         (GGUF version 1, a big-endian file, nested arrays, a tensor type ggml does not
 *         define), FMOE_ENOMEM.
 */
int fmoe_gguf_open(const char *path, fmoe_gguf **out);

/* Validates `size` bytes in memory, borrowing them (they must outlive the handle); `name`
 * is used in error details. The parser behind open, for the fuzz target and the tests: one
 * file only (a split model's shard is parsed as itself, its split.* keys as plain keys).
 * @return as fmoe_gguf_open. */
int fmoe_gguf_parse(const void *bytes, uint64_t size, const char *name, fmoe_gguf **out);

/* A split model's shards in memory, bytes[i] of sizes[i] bytes for shard i + 1 (borrowed, as
 * fmoe_gguf_parse), joined and checked as fmoe_gguf_open joins the files: the split model
 * the fuzz target feeds. `name` is shard 1's (the others are named from it when it ends in
 * -00001-of-0000N.gguf, else "NAME (shard I)"); n must be shard 1's split.count (1 for a
 * single file). @return as fmoe_gguf_open, FMOE_EFORMAT also for n other than split.count. */
int fmoe_gguf_parse_split(const void *const *bytes, const uint64_t *sizes, int32_t n,
                          const char *name, fmoe_gguf **out);

/* Unmaps (when opened from a path) and frees; NULL is a no-op. */
void fmoe_gguf_close(fmoe_gguf *g);

/* Drops the mapped pages of the file (every shard's) from the process: the data stay
 * readable and fault back in when touched. For a caller that has copied what it reads
 * out of the mapping. A handle opened from memory: no-op. */
void fmoe_gguf_release_pages(fmoe_gguf *g);
/* The same for the whole pages of [p, p + n) only, when they lie in one of the file's
 * mappings (else nothing: never memory of another kind). */
void fmoe_gguf_release_range(fmoe_gguf *g, const void *p, size_t n);

/* Maps every page of the file (every shard's) into the process now, for a caller that
 * reads the tensors in place and would otherwise fault each page in on first use; the
 * file is read if it is not in the page cache. A handle opened from memory: no-op. */
void fmoe_gguf_populate_pages(fmoe_gguf *g);

uint32_t fmoe_gguf_version(const fmoe_gguf *g);
uint32_t fmoe_gguf_alignment(const fmoe_gguf *g);
uint64_t fmoe_gguf_data_offset(const fmoe_gguf *g); /* file offset of the data section */
const char *fmoe_gguf_name(const fmoe_gguf *g);     /* the path or name given */

/* Shards of a split model: their count (1 for a single file) and path i (0-based; shard 0
 * is fmoe_gguf_name; NULL past the count). */
int32_t fmoe_gguf_shard_count(const fmoe_gguf *g);
const char *fmoe_gguf_shard_name(const fmoe_gguf *g, int32_t i);

/* The shards a path names by its name alone, as fmoe_gguf_open finds them: when PATH ends in
 * "-KKKKK-of-NNNNN.gguf" (five digits each, 1 <= K <= N, N >= 2), shard i's path (0-based,
 * PATH with its suffix's K replaced by i + 1) into buf. For the output check (cmd/outputs.c):
 * every shard of a split model is read when any of them is given.
 * @return N and the path, or 0 when PATH is not a shard's name or i is not below N or the path
 *         does not fit in cap (buf then unchanged). No file is opened. */
int32_t fmoe_gguf_split_path(const char *path, int32_t i, char *buf, size_t cap);

int64_t fmoe_gguf_kv_count(const fmoe_gguf *g);
const fmoe_gguf_kv *fmoe_gguf_kv_at(const fmoe_gguf *g, int64_t i); /* file order; NULL past */
const fmoe_gguf_kv *fmoe_gguf_find_kv(const fmoe_gguf *g, const char *key); /* NULL: absent */

int64_t fmoe_gguf_tensor_count(const fmoe_gguf *g);
const fmoe_gguf_tensor *fmoe_gguf_tensor_at(const fmoe_gguf *g, int64_t i); /* file order (shard by shard) */
const fmoe_gguf_tensor *fmoe_gguf_find_tensor(const fmoe_gguf *g, const char *name);

/*
 * Typed reads of a scalar key. _int accepts any integer type (and bool) whose value fits
 * an int64; _float any integer or float type; _str a string.
 * @return 0 and *out, FMOE_ENOTFOUND ("FILE: missing key K"), FMOE_EFORMAT ("FILE: key K
 *         is <type>, expected <what>").
 */
int fmoe_gguf_get_int(const fmoe_gguf *g, const char *key, int64_t *out);
int fmoe_gguf_get_float(const fmoe_gguf *g, const char *key, double *out);
int fmoe_gguf_get_str(const fmoe_gguf *g, const char *key, fmoe_gguf_str *out);

/*
 * A file that `fmoe quantize` embedded: the string key fmoe.file.NAME (NAME such as
 * "tokenizer.json", "tokenizer_config.json", "generation_config.json"), copied into *data
 * (malloc'd, NUL-terminated; the caller frees) with its length in *len.
 * @return 0, 1 when the file has no such key (*data NULL), FMOE_EFORMAT (the key is not a
 *         string), FMOE_ENOMEM.
 */
int fmoe_gguf_get_file(const fmoe_gguf *g, const char *name, char **data, size_t *len);

/* 1 when `path` is a regular file that starts with GGUF's magic, else 0 (no error set). */
int fmoe_gguf_is_file(const char *path);

/* Element i of an integer or float array (or the scalar itself at i = 0) as a double. */
double fmoe_gguf_kv_number(const fmoe_gguf_kv *kv, uint64_t i);

/*
 * The tensor `name`, checked for use: present, of a type fmoe computes with
 * (fmoe_quant_supported), with `ndim` dimensions equal to `ne` (innermost first; -1
 * matches any extent).
 * @return 0 and *out, FMOE_ENOTFOUND, FMOE_EUNSUPPORTED ("FILE: tensor T has type IQ2_XS;
 *         fmoe computes with F32, F16, BF16, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS,
 *         Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL"), FMOE_EMISMATCH.
 */
int fmoe_gguf_get_tensor(const fmoe_gguf *g, const char *name, int32_t ndim, const int64_t *ne,
                         const fmoe_gguf_tensor **out);

/*
 * The HuggingFace config.json the file stands for, for fmoe_geometry_parse and
 * fmoe_config_fingerprint (lib/gguf_config.c): the key fmoe.hf_config verbatim when the
 * file has it (fmoe quantize writes it; *exact = 1: geometry and fingerprint are the
 * checkpoint's), else one built from llama.cpp's metadata keys for the architectures
 * llama (Mixtral), qwen2moe, qwen3moe, olmoe and deepseek (*exact = 0: the same geometry,
 * but the fingerprint is the built config's, not the original checkpoint's).
 * @return 0 and *json (malloc'd, NUL-terminated; the caller frees it), FMOE_EUNSUPPORTED
 *         (another architecture, named), FMOE_ENOTFOUND / FMOE_EFORMAT (a key the
 *         architecture needs is missing or of the wrong type), FMOE_ENOMEM.
 */
int fmoe_gguf_config_json(const fmoe_gguf *g, char **json, int *exact);

/* Where a HuggingFace tensor lives in a GGUF file laid out by llama.cpp's converter (and
 * fmoe quantize): lib/gguf_names.c. */
typedef struct fmoe_gguf_tensor_ref {
    char name[64];          /* the GGUF tensor, e.g. "blk.3.ffn_down_exps.weight" */
    int32_t expert;         /* >= 0: slice [expert] of a stacked *_exps tensor; -1: all of it */
    int32_t permute_heads;  /* > 0: rows permuted from rotate-half to adjacent pairs per head
                               (this many heads; llama and deepseek): undo on load */
} fmoe_gguf_tensor_ref;

/* The GGUF tensor for `hf_name` ("model.layers.3.mlp.experts.5.down_proj.weight") in a file
 * of architecture `arch`, whose attention has n_head query and n_head_kv key/value heads.
 * @return 0 and *out, or FMOE_ENOTFOUND ("no GGUF tensor for NAME (architecture A)"). */
int fmoe_gguf_tensor_for(const char *arch, int32_t n_head, int32_t n_head_kv,
                         const char *hf_name, fmoe_gguf_tensor_ref *out);

/* "UINT8", ..., "FLOAT64"; "?" for other numbers. */
const char *fmoe_gguf_value_type_name(uint32_t type);

#endif
