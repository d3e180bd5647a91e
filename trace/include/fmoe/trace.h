/*
 * fmoe/trace.h - the trace file (HDF5, format "fmoe-trace", version 1; docs/design.md §4,
 * docs/formats/trace.md).
 *
 * Implemented in trace/ (the only code that includes <hdf5.h>); this header is plain C.
 *
 * Writing: open a writer with a header, append requests one by one (each append extends
 * the datasets and, by default, flushes and journals, so a kill loses no finished request;
 * see flush_requests and fmoe_trace_recover), then close. The writer works on
 * "<path>.partial" and renames it to <path> on close; abort removes it. A killed writer
 * leaves "<path>.partial" and its journal, from which fmoe_trace_recover rebuilds a valid
 * trace of every request appended before the kill.
 *
 * Reading: open validates format, version, attributes and every dataset's shape, and
 * reads the small per-request tables. Token data is read in ranges with bounds checks
 * (expert ids < J, probabilities finite). Every error names the file and the dataset.
 */
#ifndef FMOE_TRACE_H
#define FMOE_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "fmoe/routing.h" /* fmoe_probs_kind, FMOE_PHASE_* */

#define FMOE_TRACE_FORMAT "fmoe-trace"
#define FMOE_TRACE_VERSION 1


typedef enum fmoe_compression {
    FMOE_COMPRESSION_ZSTD = 0, /* HDF5 filter 32015, level in cd_values[0] */
    FMOE_COMPRESSION_DEFLATE = 1,
    FMOE_COMPRESSION_NONE = 2,
} fmoe_compression;

/* Root attributes of a trace. Strings are NUL-terminated and truncated to fit. */
typedef struct fmoe_trace_header {
    char model_name[256];
    char model_fingerprint[65]; /* sha256 hex of the canonical config.json, or "" */
    int32_t num_layers;         /* L */
    int32_t num_experts;        /* J */
    int32_t top_k;              /* K */
    int32_t hidden_size;        /* h (0 if unknown) */
    int32_t shared_experts;
    int64_t expert_bytes;       /* one routed expert at `dtype` */
    char dtype[16];
    char dataset[256];
    char created[32];           /* ISO 8601 UTC; the writer fills it when empty */
    char fmoe_version[32];      /* the writer fills it when empty */
    char recorded_on[128];      /* "cpu", "cuda:H100", "import:jsonl", ... */
    fmoe_probs_kind probs_kind;
    int32_t probs_half;         /* 1: /tokens/probs stored as IEEE float16, else float32 */
    int32_t semantic_dim;       /* columns of /tokens/semantic; 0: absent */
    char semantic_kind[32];     /* "embedding" (the embedding layer's output) | "projection" */
    int32_t speculative_depth;  /* S of /tokens/speculative; 0: absent */
    const char *config_json;    /* /model/config_json; writer borrows it, NULL or "" = none */
    /* Added later (new fields go at the end; files without them read as 0). */
    int32_t hidden_dim;         /* h of /tokens/hidden float16 [T][L][h] (gate inputs, for
                                   training predictors); 0: absent */
    int32_t timing_layers;      /* columns of /timing/layer_s (the decoder layers, dense ones
                                   included); 0: no /timing group */
    /* How the prompt was run: 0, one iteration (layer-major over the whole prompt); c > 0,
     * chunks of c tokens, each its own iteration, as fmoe record's forward pass runs it
     * (docs/design.md §7.1). The replay and /timing follow it. */
    int32_t prefill_chunk;
    /* A live offloaded recording (fmoe record --cache-experts): the fast tier's size and
     * the policy it ran with, and /timing/access_outcome [A] uint8, the measured outcome
     * of each access in replay order (0 miss, 1 hit, 2 late hit, 3 computed on the host).
     * 0 and "": not offloaded, no dataset. */
    int32_t offload_cache_experts;
    char offload_policy[64];
    /* Recorded by fmoe serve (--trace-out): 1 adds /tokens/served_iteration [T] int64, the
     * index of the server's batched forward pass each token ran in (tokens with one index
     * ran together, whatever request they belong to: the batch composition), and
     * /tokens/served_s [T] float32, that pass's wall seconds. 0: absent. */
    int32_t served;
    /* What the recording's forward pass multiplied quantized weights by ("f32", or "q8":
     * inputs quantised to 8 bits; fmoe_activations_name, the commands' --activations),
     * which moves the logits and so the routing. "": not known (an import, a trace
     * written before the attribute), and no attribute written. */
    char activations[8];
    /* [num_layers] bytes of one routed expert of each MoE layer, where layers differ (a
     * llama-quantize mix such as Q4_K_M gives some layers' down projections more bits):
     * each in 1..expert_bytes, and expert_bytes is then the largest (one slot's contents).
     * NULL: every layer's are expert_bytes. Stored as /model/layer_expert_bytes int64 [L],
     * written only when the layers differ. The writer borrows it during open, as
     * config_json; a reader's stays valid until the reader is closed. */
    const int64_t *layer_expert_bytes;
} fmoe_trace_header;

/* Iterations of a request in replay order: its prefill chunks, then one per output token. */
static inline int64_t fmoe_trace_request_iterations(int64_t prompt_tokens, int64_t output_tokens,
                                                    int32_t prefill_chunk) {
    const int64_t prefill = prompt_tokens <= 0 ? 0
                            : prefill_chunk > 0 ? (prompt_tokens + prefill_chunk - 1) / prefill_chunk
                                                : 1;
    return prefill + output_tokens;
}

/* One request's data for the writer; all arrays borrowed for the call. T = prompt + output. */
typedef struct fmoe_trace_request {
    int64_t id;
    double arrival_s;
    int32_t prompt_tokens;
    int32_t output_tokens;
    const int32_t *token_id;    /* [T] (-1 where unknown) */
    const uint8_t *phase;       /* [T] FMOE_PHASE_*; prefill tokens first */
    const uint16_t *experts;    /* [T][L][K] chosen experts, in gate order */
    const float *probs;         /* [T][L][J] gate probabilities; NULL iff probs_kind NONE */
    const float *semantic;      /* [T][semantic_dim]; NULL iff semantic_dim == 0 */
    const float *speculative;   /* [T][L][S][J]; NULL iff speculative_depth == 0 */
    /* Added later; zero-initialised callers write neither. */
    const float *hidden;        /* [T][L][hidden_dim], stored as float16; NULL iff
                                   hidden_dim == 0 */
    /* Measured times of the request's iterations, in replay order (the prefill chunks,
     * then each decode token): I = fmoe_trace_request_iterations(...) rows, appended to /timing/layer_s [I][timing_layers] (wall seconds per decoder
     * layer) and /timing/iteration_s [I] (wall seconds of the whole forward pass).
     * Both NULL iff timing_layers == 0. */
    const float *layer_s;
    const float *iteration_s;
    /* With header.offload_cache_experts > 0: the measured outcome of each of the
     * request's accesses, in replay order (see the header). */
    const uint8_t *access_outcome;
    int64_t num_access_outcomes;
    /* With header.served: [T] each token's forward pass and its wall seconds. */
    const int64_t *served_iteration;
    const float *served_s;
} fmoe_trace_request;

typedef struct fmoe_trace_write_options {
    fmoe_compression compression;
    int level;            /* zstd 1..19 (default 3), deflate 1..9 (default 4); 0 = default */
    int64_t chunk_tokens; /* rows per chunk along T; 0 = automatic */
    /* Flush the file after every `flush_requests` appended requests; 0 means 1, so a
     * killed writer (fmoe record) loses at most the request in progress. Each flush
     * recompresses the partly filled chunks, so importers, which leave nothing behind on
     * failure anyway, pass INT32_MAX and get one flush at close. */
    int32_t flush_requests; /* <= 1 also keeps a journal: see fmoe_trace_recover */
} fmoe_trace_write_options;

typedef struct fmoe_trace_writer fmoe_trace_writer;

/* Creates "<path>.partial" and writes the header. `opts` may be NULL (zstd, defaults).
 * @return 0 or a negative code (bad header values: FMOE_EINVAL naming the field). */
int fmoe_trace_writer_open(fmoe_trace_writer **out, const char *path,
                           const fmoe_trace_header *header,
                           const fmoe_trace_write_options *opts);

/* Appends one request and flushes. Validates expert ids < J and array presence. */
int fmoe_trace_writer_append_request(fmoe_trace_writer *w, const fmoe_trace_request *req);

/* Finishes the file and renames it into place; frees `w` whatever the outcome. When it
 * fails, or an append failed before, a writer that keeps a journal leaves the journal and
 * the .partial for fmoe_trace_recover (a failed close no longer removes the .partial); one
 * without a journal leaves nothing. @return 0 or FMOE_EIO naming the file and the reason. */
int fmoe_trace_writer_close(fmoe_trace_writer *w);

/* Removes the partial file (and its journal) and frees `w`. NULL is a no-op. */
void fmoe_trace_writer_abort(fmoe_trace_writer *w);

/* Closes the file but leaves it as "<path>.partial", with its journal when it keeps one:
 * what a killed writer leaves, but a whole HDF5 file, for a run stopped on purpose
 * (SIGINT) or by an error after some requests. fmoe_trace_recover turns it into <path>.
 * Frees `w` whatever the outcome. @return 0 or FMOE_EIO (the close failed). */
int fmoe_trace_writer_close_partial(fmoe_trace_writer *w);

/* Crash safety. A writer with flush_requests <= 1 (fmoe record, fmoe serve --trace-out)
 * also keeps "<path>.partial.journal": every appended request, as one checksummed record,
 * before the append returns (trace/trace_journal.c has the design). A process killed at
 * any instant leaves the journal holding every request whose append returned;
 * fmoe_trace_recover rebuilds the trace from it. Such a writer refuses to start while a
 * journal is there (the requests of an unfinished run: recover them or remove it).
 * Importers (flush_requests = INT32_MAX) keep no journal: they can be run again. */
typedef struct fmoe_trace_recover_report {
    int from_journal;      /* 1: rebuilt from the journal; 0: from the .partial (renamed when
                              there is no journal, copied when the journal was worse) */
    int64_t requests;      /* requests in the recovered trace */
    int64_t tokens;
    int64_t dropped_bytes; /* journal bytes of its torn last record (a request the kill cut) */
    char output[4096];     /* the trace written */
    /* Damage: bytes that do not check anywhere but in the torn tail, which a kill cannot
     * leave (a flipped bit, a block the disk lost, a length field changed), or a journal
     * lacking requests the .partial lists (cut short at a record boundary). The records
     * that check out are recovered, the .partial's copy used when it holds them and more,
     * and both leftovers are kept; the caller should report a failure. */
    int damaged;              /* 1: damage was found (the fields below say where) */
    int64_t damaged_bytes;    /* journal bytes skipped as damage */
    int64_t damaged_at;       /* the first of them (with none: where a journal lacking
                                 the .partial's requests ends), -1: no damage */
    int32_t damaged_regions;  /* separate damaged stretches */
    int64_t journal_requests; /* requests that checked out in the journal, -1: its header
                                 record could not be read */
    int64_t partial_requests; /* requests the .partial holds when it was read whole as
                                 the second source (on damage) and reads as a trace,
                                 else -1 */
    int kept;                 /* 1: the journal and the .partial were left in place */
    char damage[1024];        /* with damaged: one line, what and where */
} fmoe_trace_recover_report;

/* Turns PARTIAL ("TRACE.h5.partial", left by a killed or interrupted writer) into a valid
 * trace at `output` (NULL: TRACE.h5): from PARTIAL.journal when there is one, else by
 * checking that PARTIAL reads as a whole trace and renaming it. A journal torn only at its
 * end (what a kill leaves: a last record with CRC 0) gives every request before the tear;
 * when PARTIAL lists no request the journal lacks (or does not open), the journal and
 * PARTIAL are then removed: the output holds everything they did. A journal damaged
 * anywhere (its end too: a record whose CRC was written was whole), or one that lacks
 * requests PARTIAL lists (cut short at a record boundary), gives the records that still
 * check out, or PARTIAL's requests when PARTIAL reads as a trace holding all of those and
 * more; rep->damaged is set (rep->damaged_at: the damage, or where the short journal
 * ends), rep->damage says which, and nothing is removed. The
 * output is written as "OUTPUT.recovering" and linked into place; an existing `output`
 * (or OUTPUT.recovering) is never replaced. @return 0 with *rep; FMOE_EINVAL (PARTIAL does
 * not end in .partial), FMOE_EIO (output exists, cannot write), FMOE_EFORMAT (no journal
 * and PARTIAL is damaged; a journal whose header record is torn or damaged and no PARTIAL
 * that reads), ... */
int fmoe_trace_recover(const char *partial, const char *output, fmoe_trace_recover_report *rep);

/* Per-request table, read at open. */
typedef struct fmoe_trace_request_info {
    int64_t id;
    double arrival_s;
    int32_t prompt_tokens;
    int32_t output_tokens;
    int64_t token_begin;  /* first token row in /tokens */
    int64_t token_count;  /* rows owned: token_offset[r+1] - token_offset[r] */
} fmoe_trace_request_info;

/* One forward pass: a prefill holds all of a request's consecutive prefill tokens; each
 * decode token is its own iteration (docs/design.md §7.1). */
typedef struct fmoe_trace_iteration {
    int64_t request;      /* index into the request table */
    int32_t phase;        /* FMOE_PHASE_* */
    int32_t num_tokens;
    int64_t token_begin;
} fmoe_trace_iteration;

/* Destination buffers for fmoe_trace_reader_read_tokens; NULL members are skipped. */
typedef struct fmoe_trace_token_buffers {
    int32_t *token_id;    /* [n] */
    uint8_t *phase;       /* [n] */
    uint16_t *experts;    /* [n][L][K] */
    float *probs;         /* [n][L][J] (converted to float32); error if probs_kind NONE */
    float *semantic;      /* [n][semantic_dim]; error if absent */
    float *speculative;   /* [n][L][S][J]; error if absent */
    /* Added later; zero-initialised callers read none. */
    int64_t *served_iteration; /* [n] /tokens/served_iteration (the server's pass of each
                                  token, >= 0); error if the trace is not served */
    float *hidden;        /* [n][L][hidden_dim] the gate inputs (/tokens/hidden) as float32;
                             FMOE_ENOTFOUND if absent (fmoe_trace_reader_check_hidden) */
    float *served_s;      /* [n] /tokens/served_s (wall seconds of each token's pass);
                             error if the trace is not served */
} fmoe_trace_token_buffers;

typedef struct fmoe_trace_reader fmoe_trace_reader;

int fmoe_trace_reader_open(fmoe_trace_reader **out, const char *path);
void fmoe_trace_reader_close(fmoe_trace_reader *r); /* NULL is a no-op */

const fmoe_trace_header *fmoe_trace_reader_header(const fmoe_trace_reader *r);
int64_t fmoe_trace_reader_num_requests(const fmoe_trace_reader *r);
int64_t fmoe_trace_reader_num_tokens(const fmoe_trace_reader *r);
/* [num_requests] entries, owned by the reader. */
const fmoe_trace_request_info *fmoe_trace_reader_requests(const fmoe_trace_reader *r);
/* [num_iterations] entries in replay order, owned by the reader. */
const fmoe_trace_iteration *fmoe_trace_reader_iterations(const fmoe_trace_reader *r,
                                                         int64_t *num_iterations);

/* 0 when the trace holds gate inputs (/tokens/hidden), else FMOE_ENOTFOUND with a detail
 * saying to record with 'fmoe record --hidden'. */
int fmoe_trace_reader_check_hidden(const fmoe_trace_reader *r);

/* Reads tokens [t0, t0 + n) into the buffers, bounds-checked. */
int fmoe_trace_reader_read_tokens(fmoe_trace_reader *r, int64_t t0, int64_t n,
                                  const fmoe_trace_token_buffers *buf);

/* The measured data the replay does not read, for copying a trace whole (fmoe trace
 * merge). Rarely read: each call opens its datasets.
 *
 * read_timing: iterations [i0, i0 + n) of /timing, replay order, into layer_s
 * [n][timing_layers] and iteration_s [n] (either may be NULL); FMOE_EINVAL when the trace
 * has no /timing (timing_layers 0), FMOE_ERANGE past the end.
 * read_access_outcomes: entries [a0, a0 + n) of /timing/access_outcome into out[n];
 * *total (may be NULL) gets the dataset's length; FMOE_EINVAL when the trace is not an
 * offloaded recording (offload_cache_experts 0). Values > 3 are FMOE_EFORMAT. */
int fmoe_trace_reader_read_timing(fmoe_trace_reader *r, int64_t i0, int64_t n, float *layer_s,
                                  float *iteration_s);
int fmoe_trace_reader_read_access_outcomes(fmoe_trace_reader *r, int64_t a0, int64_t n,
                                           uint8_t *out, int64_t *total);

/* Names: "zstd", "deflate", "none". @return 0 or FMOE_EINVAL. */
int fmoe_compression_parse(const char *name, fmoe_compression *out);
const char *fmoe_probs_kind_name(fmoe_probs_kind k); /* "none" | "topk" | "full" */

/* Registers fmoe's zstd filter (id 32015) with the HDF5 library in this process.
 * Idempotent; the reader and writer call it themselves. */
int fmoe_hdf5_register_zstd(void);

/* Reads the root "format" attribute of any HDF5 file ("fmoe-trace", "fmoe-store", ...)
 * into out[cap]. @return 0, FMOE_EIO (unreadable), FMOE_EFORMAT (not HDF5, damaged or
 * truncated), FMOE_ENOTFOUND (no attr). */
int fmoe_hdf5_read_format(const char *path, char *out, size_t cap);

#endif
