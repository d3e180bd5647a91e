/*
 * fmoe/store.h - the expert-map store file (HDF5, format "fmoe-store", version 1;
 * docs/design.md §5, docs/formats/store.md). Implemented in trace/store_writer.c and
 * trace/store_reader.c; this header is plain C. The in-memory store it saves and restores is
 * fmoe/expertmap.h.
 *
 * Layout (E = entries held, <= capacity C; h = semantic_dim):
 *
 *     /maps                     float32 [E, L, J]  expert maps (gate probabilities)
 *     /semantic                 float32 [E, h]     their semantic embeddings (absent: h = 0)
 *     /hits                     uint32  [E]        times each entry was the best match
 *     /sources/path             string  [S]        the traces the store was built from
 *     /sources/created          string  [S]        each trace's `created` attribute
 *     /sources/dataset          string  [S]        each trace's `dataset` attribute
 *     /sources/num_requests     int64   [S]        requests in each trace
 *     /requests/used_source     int32   [U]        index into /sources of each request that
 *     /requests/used_id         int64   [U]          went into the store, and its id
 *     /requests/held_out_source int32   [H]        the requests --split held out
 *     /requests/held_out_id     int64   [H]
 *
 * Root attributes: format, version, model_name, model_fingerprint, capacity, size (E),
 * num_layers, num_experts, top_k, semantic_dim, prefetch_distance, probs_kind (the weakest
 * of the sources: full | topk), semantic_kind, split (share of each trace's requests put
 * in the store; 1 = all), split_seed, requests_used (U), requests_held_out (H),
 * tokens_used, capacity_asked (build-store's --capacity, >= capacity; optional: absent in
 * stores written before it, read as capacity), source_traces (the paths, one per line,
 * for a quick look), created, fmoe_version.
 *
 * The writer works on "<path>.partial" and renames it when complete. The reader checks
 * format, version, every attribute's range, every dataset's type and shape, that every
 * map value is a probability and every embedding finite, and that request lists point at
 * existing sources; errors name the file and the dataset.
 */
#ifndef FMOE_STORE_H
#define FMOE_STORE_H

#include <stdint.h>

#include "fmoe/expertmap.h"
#include "fmoe/progress.h"
#include "fmoe/trace.h"

#define FMOE_STORE_FORMAT "fmoe-store"
#define FMOE_STORE_VERSION 1

/* One trace the store was built from. */
typedef struct fmoe_store_source {
    char path[1024];     /* as given to build-store */
    char created[32];    /* the trace's `created` attribute: with num_requests, identifies it */
    char dataset[256];
    int64_t num_requests;
} fmoe_store_source;

typedef struct fmoe_store_file {
    char model_name[256];
    char model_fingerprint[65]; /* sha256 hex of the canonical config.json, or "" */
    fmoe_probs_kind probs_kind; /* FULL or TOPK */
    char semantic_kind[32];     /* "embedding" | "projection" | "" (h = 0) */
    double split;               /* (0, 1]: share of each trace's requests in the store */
    uint64_t split_seed;
    int64_t tokens_used;        /* tokens streamed into the store */
    int32_t capacity_asked;     /* build-store's --capacity: the store is sized to the tokens
                                   it holds when they are fewer, and offline updates grow it
                                   up to this (0: the store's capacity) */
    char created[32];           /* the writer fills it when empty */
    char fmoe_version[32];      /* the writer fills it when empty */
    int32_t num_sources;
    fmoe_store_source *sources; /* [num_sources] */
    int64_t num_used;
    int32_t *used_source;       /* [num_used] index into sources */
    int64_t *used_id;           /* [num_used] request id */
    int64_t num_held_out;
    int32_t *held_out_source;   /* [num_held_out] */
    int64_t *held_out_id;       /* [num_held_out] */
    fmoe_expertmap *store;      /* capacity, geometry, d and the entries */
} fmoe_store_file;

/*
 * Writes `f` (all of it borrowed) to `path` through "<path>.partial". opts may be NULL
 * (zstd). @return 0, FMOE_EINVAL (a bad field: the detail names it), FMOE_EIO.
 */
int fmoe_store_write(const char *path, const fmoe_store_file *f,
                     const fmoe_trace_write_options *opts);

/*
 * Reads and validates a store file into a new fmoe_store_file (*out, free with
 * fmoe_store_file_free): every array is owned, the store is made with `max_batch`
 * (fmoe_expertmap_config; 0 = default). @return 0, FMOE_EIO (unreadable),
 * FMOE_EFORMAT (not a store, bad shape or value: the detail names file and dataset),
 * FMOE_EUNSUPPORTED (another version), FMOE_ENOMEM.
 */
int fmoe_store_read(const char *path, int32_t max_batch, fmoe_store_file **out);

/* Frees a file read by fmoe_store_read (the store included). NULL is a no-op. */
void fmoe_store_file_free(fmoe_store_file *f);

/*
 * The source of `f` that is the trace with header `h` and `num_requests` requests
 * (matched by `created` and request count, the path only breaking ties), or -1.
 */
int32_t fmoe_store_find_source(const fmoe_store_file *f, const fmoe_trace_header *h,
                               int64_t num_requests, const char *path);

/* ------------------------------------------------------------------ building */

typedef struct fmoe_store_build_options {
    int32_t capacity;          /* C >= 1 */
    int32_t prefetch_distance; /* d in [0, L) */
    double split;              /* (0, 1]: share of each trace's requests streamed in */
    uint64_t seed;             /* which requests the split holds out */
    int32_t batch;             /* tokens scored per sgemm batch (0: 256) */
    const fmoe_progress *progress; /* counts tokens; may be NULL */
} fmoe_store_build_options;

/* What a build saw, for the command to report. */
typedef struct fmoe_store_build_report {
    int64_t tokens;            /* tokens streamed into the store */
    int64_t appended;          /* entries appended while there was room */
    int64_t replaced;          /* entries placed by deduplication */
    int semantic_skipped;      /* some trace had no /tokens/semantic (or dims differ): the
                                  store has none and simulate falls back to popularity for
                                  the first d layers */
    int probs_topk;            /* some trace held top-k probabilities only: maps hold the
                                  known weights, the rest 0 */
    int ids_only;              /* some trace held expert ids only (probs_kind none): its
                                  maps hold 1/K on each chosen expert, as the fmoe policies
                                  read such traces; the store says topk */
} fmoe_store_build_report;

/*
 * Streams the requests of traces[0..n) kept by the split into a new store (the
 * deduplication rule of fmoe/expertmap.h), token by token in trace order. With split < 1,
 * each trace's requests are shuffled with a generator seeded by (seed, trace index) and
 * the first round(split · R) (at least 1) go into the store; the others are listed as held
 * out. The result (*out, free with fmoe_store_file_free) is ready for fmoe_store_write.
 * @return 0, FMOE_EINVAL (capacity 0, d >= L, no traces), FMOE_EMISMATCH (traces of
 * different models: the detail names both fingerprints, or the geometries),
 * FMOE_EINCOMPLETE (no tokens), or the
 * trace reader's error.
 */
int fmoe_store_build(const char *const *traces, int32_t n, const fmoe_store_build_options *o,
                     fmoe_store_file **out, fmoe_store_build_report *report);

/* The split of one trace, as fmoe_store_build makes it: keep[r] = 1 when request r (trace
 * order) goes into the store. @return the number kept. */
int64_t fmoe_store_split(int64_t num_requests, double split, uint64_t seed, int32_t source,
                         uint8_t *keep);

#endif
