/*
 * trace_journal.c - the journal of complete requests beside a trace's .partial
 * (trace_journal.h), and `fmoe trace recover` (fmoe_trace_recover, fmoe/trace.h).
 *
 * Design. A trace writer that promises "every finished request survives a kill" (fmoe
 * record, fmoe serve --trace-out: flush_requests <= 1) writes each request twice: first as
 * one record appended to "<path>.partial.journal", then into the HDF5 file. Three ways
 * were weighed:
 *
 *   - HDF5's SWMR mode (H5Fstart_swmr_write) orders its metadata writes so that a reader
 *     running beside a live writer sees a consistent file. It needs the 1.10 file format,
 *     whose superblock records "open for writing": a killed writer's file then opens only
 *     after `h5clear -s`, in every tool; and it promises consistency to concurrent readers
 *     of a live writer, not a file that survives the writer dying halfway through a flush.
 *   - Flushing after every request and truncating on recovery: HDF5 rewrites B-tree nodes
 *     and object headers in place and reuses freed space, so the bytes of the last flush
 *     are not a prefix of the file; nothing to truncate back to.
 *   - A journal: append-only, each record self-delimiting and checksummed, written with
 *     plain write(2). The file a kill leaves is a prefix of whole records and at most one
 *     torn record, which the CRC exposes. Cost: each request's bytes are written twice
 *     (uncompressed here, in the trace's own element types: float16 stays float16), which
 *     for fmoe record is small against the forward passes; importers, which can simply be
 *     run again, keep no journal.
 *
 * So the guarantee: when fmoe_trace_writer_append_request has returned, the request is in
 * the journal, and `fmoe trace recover TRACE.h5.partial` rebuilds a valid trace holding it
 * and every request before it, whatever instant the process was killed at. The HDF5
 * .partial itself usually also reads (it is still flushed per request) and is read as a
 * second source, which catches a journal that lost whole records at its end (no kill
 * does: the .partial never gets a request before the journal). No fsync per request: a
 * killed process loses nothing the kernel has; a power cut may lose the last requests
 * (the checksums still catch the damage).
 *
 * Format (native little-endian; the reader refuses another byte order):
 *
 *   file header  "FMOEJRNL", u32 version = 1, u32 0x01020304
 *   record       u32 kind, u32 crc, u64 length, then `length` payload bytes;
 *                crc = CRC-32C of (kind, length, payload)
 *   kind 1       the trace header (first record): strings as u32 length + bytes, integers
 *                as i64, in the order of put_header below, then the write options and
 *                config_json, then (added later; a record that ends before it reads as "")
 *                the activations string, then (later still; absent: none) i64 L' and L'
 *                i64 per-layer expert bytes (L' = 0: every layer's are expert_bytes)
 *   kind 2       one request: i64 id, f64 arrival_s, i32 prompt_tokens, i32 output_tokens,
 *                i64 num_access_outcomes, then its arrays in the order of enum array, each
 *                starting at a multiple of 8 bytes, present as the header says (the writer
 *                validated them), gates and hidden states in their file types
 *
 * A record is written as its 16-byte head with crc 0, then the payload, then the crc in
 * place: until that last 4-byte write the record does not check, so a record is whole
 * exactly when its append returned (or an instant before), and the record a kill tears
 * still has crc 0 (torn_tail below: a record with its crc written that does not check is
 * damage, wherever it is).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fmoe/error.h"
#include "files.h"
#include "half.h"
#include "fmoe/trace.h"
#include "trace_journal.h"

#define JOURNAL_MAGIC "FMOEJRNL"
#define JOURNAL_VERSION 1u
#define JOURNAL_BYTE_ORDER 0x01020304u
#define FILE_HEAD 16
#define RECORD_HEAD 16
enum { KIND_HEADER = 1, KIND_REQUEST = 2 };
/* A header record is a few KB plus config.json; anything past this is damage. */
#define MAX_HEADER_RECORD ((uint64_t)64 << 20)
#define STAGE_ELEMS 16384 /* float -> float16 staging while writing */

/* ---------------------------------------------------------------------------------------
 * CRC-32C (Castagnoli), byte at a time: the journal's cost is its writes, not this.
 * ------------------------------------------------------------------------------------- */

static uint32_t crc_table[256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
}

static uint32_t crc_update(uint32_t crc, const void *data, size_t n) {
    static int ready; /* the table is the same whoever builds it: a race is harmless */
    if (!ready) {
        crc_init();
        ready = 1;
    }
    const unsigned char *p = data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = crc_table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

/* ---------------------------------------------------------------------------------------
 * A request's arrays: which are present and how large, from the header alone
 * ------------------------------------------------------------------------------------- */

enum array {
    A_TOKEN_ID,
    A_PHASE,
    A_EXPERTS,
    A_PROBS,
    A_SEMANTIC,
    A_SPECULATIVE,
    A_HIDDEN,
    A_SERVED_ITERATION,
    A_SERVED_S,
    A_LAYER_S,
    A_ITERATION_S,
    A_ACCESS_OUTCOME,
    A_COUNT
};
#define REQUEST_FIXED 32 /* id, arrival_s, prompt, output, num_access_outcomes */

typedef struct layout {
    uint64_t count[A_COUNT]; /* elements */
    size_t elem[A_COUNT];    /* bytes per element in the journal */
    int half[A_COUNT];       /* 1: float data stored as float16 */
    uint64_t offset[A_COUNT];
    uint64_t total;          /* payload bytes */
} layout;

static int mul(uint64_t a, uint64_t b, uint64_t *out) { return __builtin_mul_overflow(a, b, out); }

/* Fills *lo for a request of T tokens, I iterations, nacc access outcomes. @return 0, or -1
 * when the sizes overflow (only a damaged record can do that). */
static int request_layout(const fmoe_trace_header *h, uint64_t T, uint64_t I, uint64_t nacc,
                          layout *lo) {
    const uint64_t L = (uint64_t)h->num_layers, J = (uint64_t)h->num_experts,
                   K = (uint64_t)h->top_k, S = (uint64_t)h->speculative_depth,
                   H = (uint64_t)h->semantic_dim, Hh = (uint64_t)h->hidden_dim,
                   Lt = (uint64_t)h->timing_layers;
    const int gh = h->probs_half != 0;
    const struct {
        uint64_t a, b, c, d; /* count = a * b * c * d */
        size_t elem;
        int half;
    } spec[A_COUNT] = {
        [A_TOKEN_ID] = {T, 1, 1, 1, 4, 0},
        [A_PHASE] = {T, 1, 1, 1, 1, 0},
        [A_EXPERTS] = {T, L, K, 1, 2, 0},
        [A_PROBS] = {h->probs_kind != FMOE_PROBS_NONE ? T : 0, L, J, 1, gh ? 2 : 4, gh},
        [A_SEMANTIC] = {T, H, 1, 1, 4, 0},
        [A_SPECULATIVE] = {T, L, S, J, gh ? 2 : 4, gh},
        [A_HIDDEN] = {T, L, Hh, 1, 2, 1},
        [A_SERVED_ITERATION] = {h->served > 0 ? T : 0, 1, 1, 1, 8, 0},
        [A_SERVED_S] = {h->served > 0 ? T : 0, 1, 1, 1, 4, 0},
        [A_LAYER_S] = {I, Lt, 1, 1, 4, 0},
        [A_ITERATION_S] = {Lt > 0 ? I : 0, 1, 1, 1, 4, 0},
        [A_ACCESS_OUTCOME] = {h->offload_cache_experts > 0 ? nacc : 0, 1, 1, 1, 1, 0},
    };
    uint64_t off = REQUEST_FIXED;
    for (int i = 0; i < A_COUNT; i++) {
        uint64_t n, bytes;
        if (mul(spec[i].a, spec[i].b, &n) || mul(n, spec[i].c, &n) || mul(n, spec[i].d, &n) ||
            mul(n, spec[i].elem, &bytes))
            return -1;
        lo->count[i] = n;
        lo->elem[i] = spec[i].elem;
        lo->half[i] = spec[i].half;
        off = (off + 7) & ~(uint64_t)7;
        lo->offset[i] = off;
        if (__builtin_add_overflow(off, bytes, &off)) return -1;
    }
    lo->total = off;
    return 0;
}

/* The request's array for slot i (NULL when absent). */
static const void *request_array(const fmoe_trace_request *q, int i) {
    switch (i) {
    case A_TOKEN_ID: return q->token_id;
    case A_PHASE: return q->phase;
    case A_EXPERTS: return q->experts;
    case A_PROBS: return q->probs;
    case A_SEMANTIC: return q->semantic;
    case A_SPECULATIVE: return q->speculative;
    case A_HIDDEN: return q->hidden;
    case A_SERVED_ITERATION: return q->served_iteration;
    case A_SERVED_S: return q->served_s;
    case A_LAYER_S: return q->layer_s;
    case A_ITERATION_S: return q->iteration_s;
    case A_ACCESS_OUTCOME: return q->access_outcome;
    default: return NULL;
    }
}

/* ---------------------------------------------------------------------------------------
 * Writing
 * ------------------------------------------------------------------------------------- */

struct fmoe__journal {
    int fd;
    char *path;
    fmoe_trace_header h; /* config_json NULL */
    uint64_t size;       /* bytes of whole records (and the file header) */
    uint32_t crc;        /* of the record being written */
    uint16_t *stage;     /* [STAGE_ELEMS] */
};

/* Writes n bytes at the end, adding them to the running crc. @return 0 or -1 (errno). */
static int put(fmoe__journal *j, const void *p, size_t n) {
    j->crc = crc_update(j->crc, p, n);
    return fmoe__write_all(j->fd, p, n);
}

static int put_zeros(fmoe__journal *j, size_t n) {
    static const char zeros[8];
    return n ? put(j, zeros, n) : 0;
}

/* Starts a record: its head with crc 0. */
static int record_begin(fmoe__journal *j, uint32_t kind, uint64_t length) {
    unsigned char head[RECORD_HEAD] = {0};
    memcpy(head, &kind, 4);
    memcpy(head + 8, &length, 8);
    if (fmoe__write_all(j->fd, head, sizeof head) != 0) return -1;
    j->crc = crc_update(0, &kind, 4);
    j->crc = crc_update(j->crc, &length, 8);
    return 0;
}

/* Ends it: the crc written into its head, which makes it whole. */
static int record_end(fmoe__journal *j, uint64_t start, uint64_t length) {
    const uint32_t crc = j->crc;
    for (;;) {
        ssize_t k = pwrite(j->fd, &crc, 4, (off_t)(start + 4));
        if (k == 4) break;
        if (k < 0 && errno == EINTR) continue;
        if (k >= 0) errno = EIO;
        return -1;
    }
    j->size = start + RECORD_HEAD + length;
    return 0;
}

/* After a failed record: cut the file back to its whole records, so the next append (if
 * the caller retries) does not follow a torn one. Best effort: recovery stops at the torn
 * record anyway. */
static int record_fail(fmoe__journal *j) {
    const int e = errno;
    if (ftruncate(j->fd, (off_t)j->size) == 0) lseek(j->fd, (off_t)j->size, SEEK_SET);
    return fmoe_error_set(FMOE_EIO, "%s: cannot write: %s", j->path, strerror(e));
}

typedef struct buf {
    unsigned char *p;
    size_t n, cap;
    int oom;
} buf;

static void buf_put(buf *b, const void *p, size_t n) {
    if (b->oom) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 1024;
        while (cap < b->n + n) cap *= 2;
        unsigned char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}

static void buf_str(buf *b, const char *s) {
    const uint32_t n = s ? (uint32_t)strlen(s) : 0;
    buf_put(b, &n, 4);
    if (n) buf_put(b, s, n);
}

static void buf_i64(buf *b, int64_t v) { buf_put(b, &v, 8); }

/* The header record's payload; get_header reads the same order. */
static void put_header(buf *b, const fmoe_trace_header *h, const char *config_json,
                       const fmoe_trace_write_options *o) {
    const char *strs[] = {h->model_name, h->model_fingerprint, h->dtype,         h->dataset,
                          h->created,    h->fmoe_version,      h->recorded_on,   h->semantic_kind,
                          h->offload_policy};
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++) buf_str(b, strs[i]);
    const int64_t ints[] = {h->num_layers,   h->num_experts,       h->top_k,
                            h->hidden_size,  h->shared_experts,    h->expert_bytes,
                            h->probs_kind,   h->probs_half,        h->semantic_dim,
                            h->speculative_depth, h->hidden_dim,   h->timing_layers,
                            h->prefill_chunk, h->offload_cache_experts, h->served,
                            o->compression,  o->level,             o->chunk_tokens};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) buf_i64(b, ints[i]);
    buf_str(b, config_json ? config_json : "");
    buf_str(b, h->activations);
    const int64_t nl = h->layer_expert_bytes ? h->num_layers : 0;
    buf_i64(b, nl);
    for (int64_t l = 0; l < nl; l++) buf_i64(b, h->layer_expert_bytes[l]);
}

int fmoe__journal_create(fmoe__journal **out, const char *path, const fmoe_trace_header *h,
                         const char *config_json, const fmoe_trace_write_options *opts) {
    *out = NULL;
    fmoe__journal *j = calloc(1, sizeof *j);
    buf b = {0};
    int rc = 0;
    if (!j || !(j->path = strdup(path)) || !(j->stage = malloc(STAGE_ELEMS * sizeof *j->stage))) {
        rc = fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    j->fd = -1;
    j->h = *h;
    j->h.config_json = NULL;
    j->h.layer_expert_bytes = NULL;
    put_header(&b, h, config_json, opts);
    if (b.oom) {
        rc = fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    if ((j->fd = fmoe__partial_create(path, O_RDWR)) < 0) {
        rc = j->fd;
        goto fail;
    }
    unsigned char head[FILE_HEAD];
    const uint32_t version = JOURNAL_VERSION, order = JOURNAL_BYTE_ORDER;
    memcpy(head, JOURNAL_MAGIC, 8);
    memcpy(head + 8, &version, 4);
    memcpy(head + 12, &order, 4);
    if (fmoe__write_all(j->fd, head, sizeof head) != 0 ||
        record_begin(j, KIND_HEADER, (uint64_t)b.n) != 0 || put(j, b.p, b.n) != 0 ||
        record_end(j, FILE_HEAD, (uint64_t)b.n) != 0) {
        rc = fmoe_error_set(FMOE_EIO, "%s: cannot write: %s", path, strerror(errno));
        close(j->fd);
        unlink(path);
        j->fd = -1;
        goto fail;
    }
    free(b.p);
    *out = j;
    return 0;
fail:
    free(b.p);
    if (j) {
        free(j->stage);
        free(j->path);
        free(j);
    }
    return rc;
}

int fmoe__journal_append(fmoe__journal *j, const fmoe_trace_request *q) {
    const fmoe_trace_header *h = &j->h;
    const uint64_t T = (uint64_t)q->prompt_tokens + (uint64_t)q->output_tokens;
    const uint64_t I = (uint64_t)fmoe_trace_request_iterations(q->prompt_tokens, q->output_tokens,
                                                               h->prefill_chunk);
    const uint64_t nacc = q->num_access_outcomes > 0 ? (uint64_t)q->num_access_outcomes : 0;
    layout lo;
    if (request_layout(h, T, I, nacc, &lo) != 0)
        return fmoe_error_set(FMOE_EINVAL, "%s: request %lld is too large to journal", j->path,
                              (long long)q->id);
    const uint64_t start = j->size;
    const int64_t nacc_field = (int64_t)nacc;
    if (record_begin(j, KIND_REQUEST, lo.total) != 0 || put(j, &q->id, 8) != 0 ||
        put(j, &q->arrival_s, 8) != 0 || put(j, &q->prompt_tokens, 4) != 0 ||
        put(j, &q->output_tokens, 4) != 0 || put(j, &nacc_field, 8) != 0)
        return record_fail(j);
    uint64_t at = REQUEST_FIXED;
    for (int i = 0; i < A_COUNT; i++) {
        if (put_zeros(j, (size_t)(lo.offset[i] - at)) != 0) return record_fail(j);
        at = lo.offset[i];
        const uint64_t n = lo.count[i];
        if (n == 0) continue;
        const void *src = request_array(q, i);
        if (!src) /* check_request lets only timing be absent with I > 0 rows: never here */
            return fmoe_error_set(FMOE_EINTERNAL, "%s: request %lld: array %d missing", j->path,
                                  (long long)q->id, i);
        if (!lo.half[i]) {
            if (put(j, src, (size_t)(n * lo.elem[i])) != 0) return record_fail(j);
        } else {
            const float *f = src;
            for (uint64_t k = 0; k < n; k += STAGE_ELEMS) {
                const size_t m = (size_t)(n - k < STAGE_ELEMS ? n - k : STAGE_ELEMS);
                for (size_t e = 0; e < m; e++) j->stage[e] = fmoe_float_to_half(f[k + e]);
                if (put(j, j->stage, m * 2) != 0) return record_fail(j);
            }
        }
        at += n * lo.elem[i];
    }
    if (record_end(j, start, lo.total) != 0) return record_fail(j);
    return 0;
}

void fmoe__journal_close(fmoe__journal *j, int remove) {
    if (!j) return;
    if (j->fd >= 0) close(j->fd);
    if (remove) unlink(j->path);
    free(j->stage);
    free(j->path);
    free(j);
}

/* ---------------------------------------------------------------------------------------
 * Reading
 * ------------------------------------------------------------------------------------- */

struct fmoe__journal_reader {
    int fd;
    char *path;
    fmoe_trace_header h;
    char *config_json;
    int64_t *layer_expert_bytes; /* [L] or NULL */
    uint64_t file_size, at; /* the next record's offset */
    int64_t dropped;        /* bytes of the torn tail */
    int64_t damaged;        /* bytes skipped before the tail (and a damaged last record) */
    int64_t damaged_at;     /* the first skipped byte, -1 none */
    int32_t damaged_regions;
    uint64_t whole_end;     /* the end of the last record that checked out */
    unsigned char *payload; /* the current record */
    size_t payload_cap;
    unsigned char *window;  /* [SCAN_WINDOW + SCAN_NEED] bytes the resync scan looks at */
    float *floats[A_COUNT]; /* float16 arrays widened back to float32 */
    size_t floats_cap[A_COUNT];
};

static int read_exact(int fd, void *p, size_t n, uint64_t off) {
    unsigned char *c = p;
    while (n > 0) {
        ssize_t k = pread(fd, c, n, (off_t)off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return k < 0 ? -1 : 1; /* 1: the file ended */
        c += k;
        n -= (size_t)k;
        off += (uint64_t)k;
    }
    return 0;
}

/* Whether a request record of `len` payload bytes starting with the 32 fixed bytes `p` has
 * the size the header gives it (the writer validated every request against that header,
 * so any other size is damage or another run's record). */
static int request_fits(const fmoe__journal_reader *r, const unsigned char *p, uint64_t len,
                        layout *lo) {
    if (len < REQUEST_FIXED) return 0;
    int32_t prompt, output;
    int64_t nacc;
    memcpy(&prompt, p + 16, 4);
    memcpy(&output, p + 20, 4);
    memcpy(&nacc, p + 24, 8);
    if (prompt < 0 || output < 0 || nacc < 0) return 0;
    return request_layout(&r->h, (uint64_t)prompt + (uint64_t)output,
                          (uint64_t)fmoe_trace_request_iterations(prompt, output,
                                                                  r->h.prefill_chunk),
                          (uint64_t)nacc, lo) == 0 &&
           lo->total == len;
}

/* Reads the record at byte `at` into r->payload. @return 1 when a whole record is there
 * (its checksum holds; kind in *kind, length in *len), 0 when none is, < 0 on a read
 * error. Does not move r->at. */
static int read_record(fmoe__journal_reader *r, uint64_t at, uint32_t *kind, uint64_t *len,
                       uint64_t cap) {
    unsigned char head[RECORD_HEAD];
    if (at > r->file_size || r->file_size - at < RECORD_HEAD) return 0;
    int e = read_exact(r->fd, head, sizeof head, at);
    if (e < 0) return fmoe_error_set(FMOE_EIO, "%s: cannot read: %s", r->path, strerror(errno));
    if (e > 0) return 0;
    uint32_t crc;
    memcpy(kind, head, 4);
    memcpy(&crc, head + 4, 4);
    memcpy(len, head + 8, 8);
    if ((*kind != KIND_HEADER && *kind != KIND_REQUEST) || *len > cap ||
        *len > r->file_size - at - RECORD_HEAD)
        return 0;
    if (*len > r->payload_cap) {
        unsigned char *p = realloc(r->payload, (size_t)*len);
        if (!p) return fmoe_error_set(FMOE_ENOMEM, "%s: a record of %llu bytes: out of memory",
                                      r->path, (unsigned long long)*len);
        r->payload = p;
        r->payload_cap = (size_t)*len;
    }
    e = read_exact(r->fd, r->payload, (size_t)*len, at + RECORD_HEAD);
    if (e < 0) return fmoe_error_set(FMOE_EIO, "%s: cannot read: %s", r->path, strerror(errno));
    if (e > 0) return 0;
    uint32_t c = crc_update(0, kind, 4);
    c = crc_update(c, len, 8);
    c = crc_update(c, r->payload, (size_t)*len);
    return c == crc;
}

/* Resynchronisation after damage: the first offset >= from where a request record checks
 * out (kind, a length that fits the file and the header, then the checksum). Every byte
 * offset is a candidate, since records are not aligned; the kind and the size check let
 * only a handful of them reach the checksum. @return 1 with *found, 0 when none does, < 0
 * on a read error. */
#define SCAN_WINDOW ((size_t)1 << 20)
#define SCAN_NEED (RECORD_HEAD + REQUEST_FIXED) /* bytes a candidate is judged on first */
static int scan_next(fmoe__journal_reader *r, uint64_t from, uint64_t *found) {
    if (!r->window && !(r->window = malloc(SCAN_WINDOW + SCAN_NEED)))
        return fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", r->path);
    for (uint64_t base = from; base < r->file_size && r->file_size - base >= SCAN_NEED;
         base += SCAN_WINDOW) {
        const uint64_t left = r->file_size - base;
        const size_t n = (size_t)(left < SCAN_WINDOW + SCAN_NEED ? left : SCAN_WINDOW + SCAN_NEED);
        int e = read_exact(r->fd, r->window, n, base);
        if (e != 0)
            return fmoe_error_set(FMOE_EIO, "%s: cannot read: %s", r->path,
                                  e < 0 ? strerror(errno) : "the file shrank");
        for (size_t i = 0; i + SCAN_NEED <= n && i < SCAN_WINDOW; i++) {
            const unsigned char *w = r->window + i;
            uint32_t kind;
            uint64_t len;
            memcpy(&kind, w, 4);
            if (kind != KIND_REQUEST) continue;
            memcpy(&len, w + 8, 8);
            layout lo;
            if (len > left - i - RECORD_HEAD || !request_fits(r, w + RECORD_HEAD, len, &lo))
                continue;
            uint32_t k2;
            uint64_t len2;
            e = read_record(r, base + i, &k2, &len2, UINT64_MAX);
            if (e < 0) return e;
            if (e == 1) {
                *found = base + i;
                return 1;
            }
        }
    }
    return 0;
}

/* Whether the bytes from `at` to the end are what a kill leaves of the last record. The
 * append writes a record's head with CRC 0 and puts the CRC in last, so the record a kill
 * cut short still has CRC 0 in its head: the file ends inside it (in its head or its
 * payload), or all of it is there but the CRC. Its length is then the one it was written
 * with: at least what is left of the file and, when its fixed fields are there, the size
 * they give. Anything else is damage, even at the end: a record whose CRC was written was
 * whole, so a file that ends inside it lost bytes, and a length that points past the end or
 * does not fit its fields was changed (a flipped bit in the last record's length field
 * once passed for a torn tail and cost the request). */
static int torn_tail(fmoe__journal_reader *r, uint64_t at) {
    unsigned char head[RECORD_HEAD + REQUEST_FIXED];
    const uint64_t left = r->file_size - at;
    const size_t have = left < sizeof head ? (size_t)left : sizeof head;
    if (read_exact(r->fd, head, have, at) != 0) return 0;
    unsigned char begun[8]; /* the first 8 head bytes as the append writes them: kind, CRC 0 */
    const uint32_t kind = KIND_REQUEST, zero = 0;
    memcpy(begun, &kind, 4);
    memcpy(begun + 4, &zero, 4);
    if (memcmp(head, begun, have < 8 ? have : 8) != 0) return 0;
    if (left < RECORD_HEAD) return 1; /* the head cut short: its length is not there */
    uint64_t len;
    memcpy(&len, head + 8, 8);
    if (len < REQUEST_FIXED || len < left - RECORD_HEAD) return 0;
    layout lo;
    return left < RECORD_HEAD + REQUEST_FIXED || request_fits(r, head + RECORD_HEAD, len, &lo);
}

static void note_damage(fmoe__journal_reader *r, uint64_t from, uint64_t to) {
    if (r->damaged_at < 0) r->damaged_at = (int64_t)from;
    r->damaged += (int64_t)(to - from);
    r->damaged_regions++;
}

typedef struct cursor {
    const unsigned char *p;
    size_t n, at;
    int bad;
} cursor;

static int64_t get_i64(cursor *c) {
    int64_t v = 0;
    if (c->n - c->at < 8) {
        c->bad = 1;
        return 0;
    }
    memcpy(&v, c->p + c->at, 8);
    c->at += 8;
    return v;
}

/* A string into out[cap]; longer than the field is damage. */
static void get_str(cursor *c, char *out, size_t cap) {
    uint32_t n = 0;
    if (c->n - c->at < 4) {
        c->bad = 1;
        return;
    }
    memcpy(&n, c->p + c->at, 4);
    c->at += 4;
    if (n >= cap || n > c->n - c->at) {
        c->bad = 1;
        return;
    }
    memcpy(out, c->p + c->at, n);
    out[n] = '\0';
    c->at += n;
}

static int get_header(fmoe__journal_reader *r, cursor *c, fmoe_trace_write_options *o) {
    fmoe_trace_header *h = &r->h;
    memset(h, 0, sizeof *h);
    struct {
        char *s;
        size_t cap;
    } strs[] = {{h->model_name, sizeof h->model_name},
                {h->model_fingerprint, sizeof h->model_fingerprint},
                {h->dtype, sizeof h->dtype},
                {h->dataset, sizeof h->dataset},
                {h->created, sizeof h->created},
                {h->fmoe_version, sizeof h->fmoe_version},
                {h->recorded_on, sizeof h->recorded_on},
                {h->semantic_kind, sizeof h->semantic_kind},
                {h->offload_policy, sizeof h->offload_policy}};
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++) get_str(c, strs[i].s, strs[i].cap);
    int64_t v[18];
    for (int i = 0; i < 18; i++) v[i] = get_i64(c);
    /* every value is range-checked again by the trace writer that recovery opens */
    for (int i = 0; i < 18; i++)
        if (i != 5 && i != 17 && (v[i] < INT32_MIN || v[i] > INT32_MAX)) c->bad = 1;
    h->num_layers = (int32_t)v[0];
    h->num_experts = (int32_t)v[1];
    h->top_k = (int32_t)v[2];
    h->hidden_size = (int32_t)v[3];
    h->shared_experts = (int32_t)v[4];
    h->expert_bytes = v[5];
    h->probs_kind = (fmoe_probs_kind)v[6];
    h->probs_half = (int32_t)v[7];
    h->semantic_dim = (int32_t)v[8];
    h->speculative_depth = (int32_t)v[9];
    h->hidden_dim = (int32_t)v[10];
    h->timing_layers = (int32_t)v[11];
    h->prefill_chunk = (int32_t)v[12];
    h->offload_cache_experts = (int32_t)v[13];
    h->served = (int32_t)v[14];
    *o = (fmoe_trace_write_options){.compression = (fmoe_compression)v[15],
                                    .level = (int)v[16],
                                    .chunk_tokens = v[17]};
    uint32_t n = 0;
    if (!c->bad && c->n - c->at >= 4) {
        memcpy(&n, c->p + c->at, 4);
        c->at += 4;
    } else {
        c->bad = 1;
    }
    if (!c->bad && n <= c->n - c->at) {
        r->config_json = malloc((size_t)n + 1);
        if (!r->config_json) return fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", r->path);
        memcpy(r->config_json, c->p + c->at, n);
        r->config_json[n] = '\0';
        c->at += n;
    } else {
        c->bad = 1;
    }
    /* the activations string ends the record, or nothing does (a journal written before
     * it); the trace writer that recovery opens checks its value */
    if (!c->bad && c->at < c->n) get_str(c, h->activations, sizeof h->activations);
    /* then the per-layer expert bytes, or nothing (a journal written before them) */
    const int64_t nl = !c->bad && c->at < c->n ? get_i64(c) : 0;
    if (nl != 0 && (nl != h->num_layers || nl < 1 || (uint64_t)nl > (c->n - c->at) / 8))
        c->bad = 1;
    if (!c->bad && nl > 0) {
        r->layer_expert_bytes = malloc((size_t)nl * sizeof *r->layer_expert_bytes);
        if (!r->layer_expert_bytes) return fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", r->path);
        for (int64_t l = 0; l < nl; l++) r->layer_expert_bytes[l] = get_i64(c);
    }
    if (c->at != c->n) c->bad = 1;
    if (c->bad || h->num_layers < 1 || h->num_experts < 1 || h->top_k < 1 ||
        h->speculative_depth < 0 || h->semantic_dim < 0 || h->hidden_dim < 0 ||
        h->timing_layers < 0 || h->offload_cache_experts < 0)
        return fmoe_error_set(FMOE_EFORMAT, "%s: damaged header record", r->path);
    h->config_json = r->config_json;
    h->layer_expert_bytes = r->layer_expert_bytes; /* checked by the writer recovery opens */
    return 0;
}

int fmoe__journal_reader_open(fmoe__journal_reader **out, const char *path, fmoe_trace_header *h,
                              fmoe_trace_write_options *opts) {
    *out = NULL;
    int fd = fmoe__open_regular(path);
    if (fd < 0) return fd;
    fmoe__journal_reader *r = calloc(1, sizeof *r);
    if (!r || !(r->path = strdup(path))) {
        close(fd);
        if (r) free(r);
        return fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", path);
    }
    r->fd = fd;
    int rc = 0;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = fmoe_error_set(FMOE_EIO, "%s: cannot stat: %s", path, strerror(errno));
        goto fail;
    }
    r->file_size = (uint64_t)st.st_size;
    unsigned char head[FILE_HEAD];
    uint32_t version = 0, order = 0;
    int e = r->file_size < FILE_HEAD ? 1 : read_exact(fd, head, sizeof head, 0);
    if (e < 0) {
        rc = fmoe_error_set(FMOE_EIO, "%s: cannot read: %s", path, strerror(errno));
        goto fail;
    }
    if (e == 0) {
        memcpy(&version, head + 8, 4);
        memcpy(&order, head + 12, 4);
    }
    if (e > 0 || memcmp(head, JOURNAL_MAGIC, 8) != 0) {
        rc = fmoe_error_set(FMOE_EFORMAT, "%s: not an fmoe trace journal%s", path,
                            e > 0 ? " (the run was killed before it began one)" : "");
        goto fail;
    }
    if (order != JOURNAL_BYTE_ORDER || version != JOURNAL_VERSION) {
        rc = fmoe_error_set(FMOE_EFORMAT, "%s: journal version %u%s, expected %u", path, version,
                            order != JOURNAL_BYTE_ORDER ? " of the other byte order" : "",
                            JOURNAL_VERSION);
        goto fail;
    }
    r->at = FILE_HEAD;
    r->damaged_at = -1;
    uint32_t kind;
    uint64_t len;
    e = read_record(r, FILE_HEAD, &kind, &len, MAX_HEADER_RECORD);
    if (e < 0) {
        rc = e;
        goto fail;
    }
    if (e == 0 || kind != KIND_HEADER) {
        /* torn (the file ends inside it, its CRC still 0: the writer puts it in last) or
         * damaged (all there but it does not check, or cut short after its CRC was
         * written) */
        uint64_t want = 0;
        uint32_t crc = 0;
        unsigned char rh[RECORD_HEAD] = {0};
        const uint64_t left = r->file_size - FILE_HEAD;
        if (left > 0 &&
            read_exact(fd, rh, left < RECORD_HEAD ? (size_t)left : RECORD_HEAD, FILE_HEAD) == 0) {
            memcpy(&crc, rh + 4, 4);
            memcpy(&want, rh + 8, 8);
        }
        if (crc == 0 && (left < RECORD_HEAD || want > left - RECORD_HEAD))
            rc = fmoe_error_set(FMOE_EFORMAT, "%s: no whole header record (the run was killed "
                                              "while starting): nothing to recover",
                                path);
        else
            rc = fmoe_error_set(FMOE_EFORMAT, "%s: the header record at byte %d is damaged (its "
                                              "checksum does not hold): the requests cannot be "
                                              "decoded",
                                path, FILE_HEAD);
        goto fail;
    }
    r->at = r->whole_end = FILE_HEAD + RECORD_HEAD + len;
    cursor c = {r->payload, (size_t)len, 0, 0};
    if ((rc = get_header(r, &c, opts)) < 0) goto fail;
    *h = r->h;
    *out = r;
    return 0;
fail:
    fmoe__journal_reader_close(r);
    return rc;
}

int fmoe__journal_reader_next(fmoe__journal_reader *r, fmoe_trace_request *q) {
    uint32_t kind = 0;
    uint64_t len = 0;
    layout lo;
    for (;;) {
        if (r->at >= r->file_size) return 0;
        int e = read_record(r, r->at, &kind, &len, UINT64_MAX);
        if (e < 0) return e;
        /* a record that checks but is no request of this header (a second header record,
         * another run's record) is damage like any other */
        if (e == 1 && kind == KIND_REQUEST && request_fits(r, r->payload, len, &lo)) break;
        /* Nothing whole here. A kill tears only the last record; so this is the torn tail
         * when nothing after it checks, and damage (a flipped bit, a lost block) when a
         * record further on does: skip to that one, so one bad byte costs one record. */
        uint64_t next = 0;
        if ((e = scan_next(r, r->at + 1, &next)) < 0) return e;
        if (e == 0) {
            if (torn_tail(r, r->at))
                r->dropped = (int64_t)(r->file_size - r->at);
            else
                note_damage(r, r->at, r->file_size);
            r->at = r->file_size;
            return 0;
        }
        note_damage(r, r->at, next);
        r->at = next;
    }
    r->at += RECORD_HEAD + len;
    r->whole_end = r->at;
    const unsigned char *p = r->payload;
    memset(q, 0, sizeof *q);
    int64_t nacc;
    memcpy(&q->id, p, 8);
    memcpy(&q->arrival_s, p + 8, 8);
    memcpy(&q->prompt_tokens, p + 16, 4);
    memcpy(&q->output_tokens, p + 20, 4);
    memcpy(&nacc, p + 24, 8);
    q->num_access_outcomes = nacc;
    const void *arr[A_COUNT];
    for (int i = 0; i < A_COUNT; i++) {
        arr[i] = NULL;
        const uint64_t n = lo.count[i];
        if (n == 0) continue;
        const unsigned char *src = p + lo.offset[i];
        if (!lo.half[i]) {
            arr[i] = src; /* 8-byte aligned in a malloc'd buffer */
            continue;
        }
        if (n > r->floats_cap[i]) {
            float *f = realloc(r->floats[i], (size_t)n * sizeof *f);
            if (!f) return fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", r->path);
            r->floats[i] = f;
            r->floats_cap[i] = (size_t)n;
        }
        const uint16_t *hsrc = (const uint16_t *)(const void *)src;
        for (uint64_t k = 0; k < n; k++) r->floats[i][k] = fmoe_half_to_float(hsrc[k]);
        arr[i] = r->floats[i];
    }
    q->token_id = arr[A_TOKEN_ID];
    q->phase = arr[A_PHASE];
    q->experts = arr[A_EXPERTS];
    q->probs = arr[A_PROBS];
    q->semantic = arr[A_SEMANTIC];
    q->speculative = arr[A_SPECULATIVE];
    q->hidden = arr[A_HIDDEN];
    q->served_iteration = arr[A_SERVED_ITERATION];
    q->served_s = arr[A_SERVED_S];
    q->layer_s = arr[A_LAYER_S];
    q->iteration_s = arr[A_ITERATION_S];
    q->access_outcome = arr[A_ACCESS_OUTCOME];
    return 1;
}

int64_t fmoe__journal_reader_dropped(const fmoe__journal_reader *r) { return r->dropped; }

int64_t fmoe__journal_reader_whole_end(const fmoe__journal_reader *r) {
    return (int64_t)r->whole_end;
}

int64_t fmoe__journal_reader_damaged(const fmoe__journal_reader *r, int64_t *first_at,
                                     int32_t *regions) {
    if (first_at) *first_at = r->damaged_at;
    if (regions) *regions = r->damaged_regions;
    return r->damaged;
}

void fmoe__journal_reader_close(fmoe__journal_reader *r) {
    if (!r) return;
    if (r->fd >= 0) close(r->fd);
    for (int i = 0; i < A_COUNT; i++) free(r->floats[i]);
    free(r->payload);
    free(r->window);
    free(r->config_json);
    free(r->layer_expert_bytes);
    free(r->path);
    free(r);
}

/* ---------------------------------------------------------------------------------------
 * Recovery (fmoe/trace.h)
 *
 * Nothing is lost to recovery itself: the output is built beside the leftovers (as
 * "OUTPUT.recovering", linked into place when whole), and the journal and the .partial are
 * removed only when the output holds everything they did: the journal checked out up to at
 * most a torn last record, and the .partial lists no request the journal lacks. The
 * .partial is read every time as the second source. The writer journals each request
 * before the .partial gets it, so a .partial listing more than the journal means the
 * journal lost records (cut short at a record boundary, or to its header), which no kill
 * does; and damage anywhere before a torn tail is no kill's doing either. Then the records
 * that still check out are recovered, or the .partial's copy when it reads whole and holds
 * all of them and more; the report says which and where the journal went wrong, and both
 * leftovers stay for whoever looks at the damage.
 * ------------------------------------------------------------------------------------- */

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int exists(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

static char *concat(const char *a, const char *b) {
    const size_t n = strlen(a), m = strlen(b);
    char *s = malloc(n + m + 1);
    if (s) {
        memcpy(s, a, n);
        memcpy(s + n, b, m + 1);
    }
    return s;
}

/* What a .partial holds, as the second source. */
typedef struct partial_info {
    int64_t listed; /* requests its table lists; -1: it does not open as a trace */
    int whole;      /* 1: it opens and every token's ids, phases, experts and probabilities
                       read back in range */
    int64_t tokens;
    int64_t *ids;   /* [listed] the request ids it lists, in file order (malloc'd) */
    char why[512];  /* when it does not open or is not whole: the reader's reason */
} partial_info;

/* Reads PATH as a .partial: *pi (pi->ids to free; *pi is reset first), its tokens too when
 * `tokens` (else pi->whole stays 0: a clean recovery needs only the ids, and a large trace
 * is not read twice for nothing). @return 0, or FMOE_ENOMEM; a .partial that does not read
 * is no error here (pi->listed, pi->whole say how far it read). */
#define CHECK_BATCH 256
static int partial_read(const char *path, int tokens, partial_info *pi) {
    free(pi->ids);
    *pi = (partial_info){.listed = -1};
    fmoe_trace_reader *tr = NULL;
    if (fmoe_trace_reader_open(&tr, path) < 0) {
        snprintf(pi->why, sizeof pi->why, "%s", fmoe_error_detail());
        return 0;
    }
    const fmoe_trace_header *h = fmoe_trace_reader_header(tr);
    const int64_t R = fmoe_trace_reader_num_requests(tr), T = fmoe_trace_reader_num_tokens(tr);
    const int64_t LK = (int64_t)h->num_layers * h->top_k, LJ = (int64_t)h->num_layers * h->num_experts;
    int32_t *tok = malloc(CHECK_BATCH * sizeof *tok);
    uint8_t *phase = malloc(CHECK_BATCH);
    uint16_t *experts = malloc((size_t)(CHECK_BATCH * LK) * sizeof *experts);
    float *probs = h->probs_kind != FMOE_PROBS_NONE
                       ? malloc((size_t)(CHECK_BATCH * LJ) * sizeof *probs)
                       : NULL;
    pi->ids = malloc((size_t)(R > 0 ? R : 1) * sizeof *pi->ids);
    int rc = 0;
    if (!tok || !phase || !experts || !pi->ids || (h->probs_kind != FMOE_PROBS_NONE && !probs)) {
        free(pi->ids);
        pi->ids = NULL;
        rc = fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", path);
        goto done;
    }
    const fmoe_trace_request_info *req = fmoe_trace_reader_requests(tr);
    for (int64_t i = 0; i < R; i++) pi->ids[i] = req[i].id;
    pi->listed = R;
    pi->tokens = T;
    pi->whole = tokens;
    for (int64_t t0 = 0; tokens && t0 < T; t0 += CHECK_BATCH) {
        fmoe_trace_token_buffers b = {
            .token_id = tok, .phase = phase, .experts = experts, .probs = probs};
        if (fmoe_trace_reader_read_tokens(tr, t0, T - t0 < CHECK_BATCH ? T - t0 : CHECK_BATCH,
                                          &b) < 0) {
            snprintf(pi->why, sizeof pi->why, "%s", fmoe_error_detail());
            pi->whole = 0;
            break;
        }
    }
done:
    free(tok);
    free(phase);
    free(experts);
    free(probs);
    fmoe_trace_reader_close(tr);
    return rc;
}

static int cmp_i64(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* How many ids of `sub` (n, sorted here) are not among `all` (m, sorted here), counted as
 * multisets (an id twice in `sub` needs it twice in `all`). */
static int64_t ids_missing(int64_t *sub, int64_t n, int64_t *all, int64_t m) {
    if (n > 0) qsort(sub, (size_t)n, sizeof *sub, cmp_i64);
    if (m > 0) qsort(all, (size_t)m, sizeof *all, cmp_i64);
    int64_t k = 0, missing = 0;
    for (int64_t i = 0; i < n; i++) {
        while (k < m && all[k] < sub[i]) k++;
        if (k == m || all[k] != sub[i]) {
            missing++;
            continue;
        }
        k++;
    }
    return missing;
}

/* Copies SRC to DST through DST.partial (created here, synced, renamed). */
static int copy_file(const char *src, const char *dst) {
    char *part = concat(dst, ".partial");
    unsigned char *b = malloc(1 << 20);
    int in = -1, out = -1, rc = 0;
    if (!part || !b) {
        rc = fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", dst);
        goto done;
    }
    if ((in = fmoe__open_regular(src)) < 0) {
        rc = in;
        goto done;
    }
    if ((out = fmoe__partial_create(part, O_WRONLY)) < 0) {
        rc = out;
        goto done;
    }
    for (;;) {
        ssize_t k = read(in, b, 1 << 20);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            rc = fmoe_error_set(FMOE_EIO, "%s: cannot read: %s", src, strerror(errno));
            break;
        }
        if (k == 0) break;
        if (fmoe__write_all(out, b, (size_t)k) != 0) {
            rc = fmoe_error_set(FMOE_EIO, "%s: cannot write: %s", part, strerror(errno));
            break;
        }
    }
    if (close(out) != 0 && rc == 0)
        rc = fmoe_error_set(FMOE_EIO, "%s: cannot write: %s", part, strerror(errno));
    out = -1;
    if (rc == 0) rc = fmoe__partial_commit(part, dst);
    if (rc < 0) unlink(part); /* ours */
done:
    if (in >= 0) close(in);
    free(b);
    free(part);
    return rc;
}

/* Puts the finished TMP (ours) at OUTPUT without replacing anything there: link(2) fails
 * when OUTPUT exists, rename(2) would not; rename only where the file system has no links. */
static int publish(const char *tmp, const char *output) {
    if (link(tmp, output) == 0) {
        unlink(tmp);
        return 0;
    }
    const int e = errno;
    if (e != EEXIST && !exists(output) && rename(tmp, output) == 0) return 0;
    unlink(tmp);
    return fmoe_error_set(FMOE_EIO, "%s: %s", output,
                          e == EEXIST ? "exists; give another output (-o) or move it away"
                                      : strerror(e));
}

int fmoe_trace_recover(const char *partial, const char *output, fmoe_trace_recover_report *rep) {
    FMOE_RETURN_ERROR_IF(!partial || !partial[0] || !rep, FMOE_EINVAL,
                         "fmoe_trace_recover: NULL argument");
    memset(rep, 0, sizeof *rep);
    rep->damaged_at = rep->journal_requests = rep->partial_requests = -1;
    FMOE_RETURN_ERROR_IF(!ends_with(partial, ".partial"), FMOE_EINVAL,
                         "%s: expected the .partial a writer left (TRACE.h5.partial)", partial);
    const size_t n = strlen(partial);
    char *def = strndup(partial, n - strlen(".partial"));
    char *journal = concat(partial, ".journal");
    char *tmp = NULL;
    int64_t *jids = NULL;
    int64_t njids = 0, jids_cap = 0;
    partial_info pi = {.listed = -1};
    int rc = 0;
    fmoe__journal_reader *jr = NULL;
    fmoe_trace_writer *w = NULL;
    if (!def || !journal) {
        rc = fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", partial);
        goto done;
    }
    if (!output || !output[0]) output = def;
    snprintf(rep->output, sizeof rep->output, "%s", output);
    /* never replace a trace: a complete one there may be the very run this .partial came
     * from (killed between its rename and removing its journal) or another run */
    if (exists(output)) {
        rc = fmoe_error_set(FMOE_EIO, "%s: exists; give another output (-o) or move it away",
                            output);
        goto done;
    }

    if (!exists(journal)) {
        /* No journal: a writer that keeps none (an importer) or one closed cleanly as a
         * .partial. Keep the file only when it reads as a whole trace; renaming moves
         * everything it holds into the output. */
        fmoe_trace_reader *tr = NULL;
        if ((rc = fmoe_trace_reader_open(&tr, partial)) < 0) {
            fmoe_error_prefix("%s: no journal (%s) and the file does not read as a trace",
                              partial, journal);
            goto done;
        }
        rep->requests = fmoe_trace_reader_num_requests(tr);
        rep->tokens = fmoe_trace_reader_num_tokens(tr);
        fmoe_trace_reader_close(tr);
        rc = fmoe__partial_commit(partial, output);
        goto done;
    }

    /* The output is built as OUTPUT.recovering: with the default output, the writer's own
     * partial would otherwise be PARTIAL itself. */
    if (!(tmp = concat(output, ".recovering"))) {
        rc = fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", partial);
        goto done;
    }
    if (exists(tmp)) {
        rc = fmoe_error_set(FMOE_EIO, "%s: exists (an interrupted recovery's output?); move it "
                                      "away first",
                            tmp);
        goto done;
    }
    const int have_partial = exists(partial);
    fmoe_trace_header h;
    fmoe_trace_write_options o;
    if ((rc = fmoe__journal_reader_open(&jr, journal, &h, &o)) < 0) {
        /* A journal whose header record is torn or damaged decodes nothing: the .partial
         * is the only source left. */
        if (rc != FMOE_EFORMAT || !have_partial) goto done;
        char why[768];
        snprintf(why, sizeof why, "%s", fmoe_error_detail());
        if ((rc = partial_read(partial, 1, &pi)) < 0) goto done;
        if (!pi.whole) {
            rc = fmoe_error_set(FMOE_EFORMAT, "%s; and %s does not read as a trace (%s)", why,
                                partial, pi.why);
            goto done;
        }
        rep->damaged = rep->kept = 1;
        rep->damaged_at = FILE_HEAD;
        rep->partial_requests = rep->requests = pi.listed;
        rep->tokens = pi.tokens;
        snprintf(rep->damage, sizeof rep->damage, "%s; the trace is %s's %lld requests", why,
                 partial, (long long)pi.listed);
        if ((rc = copy_file(partial, tmp)) == 0) rc = publish(tmp, output);
        goto done;
    }
    rep->from_journal = 1;
    o.flush_requests = INT32_MAX; /* no journal of the recovery itself; one flush at close */
    if ((rc = fmoe_trace_writer_open(&w, tmp, &h, &o)) < 0) goto done;
    fmoe_trace_request q;
    int e;
    while ((e = fmoe__journal_reader_next(jr, &q)) > 0) {
        if ((rc = fmoe_trace_writer_append_request(w, &q)) < 0) goto done;
        if (njids == jids_cap) {
            jids_cap = jids_cap ? 2 * jids_cap : 256;
            int64_t *p = realloc(jids, (size_t)jids_cap * sizeof *p);
            if (!p) {
                rc = fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", partial);
                goto done;
            }
            jids = p;
        }
        jids[njids++] = q.id;
        rep->requests++;
        rep->tokens += (int64_t)q.prompt_tokens + q.output_tokens;
    }
    if (e < 0) {
        rc = e;
        goto done;
    }
    rep->journal_requests = rep->requests;
    rep->dropped_bytes = fmoe__journal_reader_dropped(jr);
    rep->damaged_bytes =
        fmoe__journal_reader_damaged(jr, &rep->damaged_at, &rep->damaged_regions);

    /* The second source, read every time (see above): its ids, and all of it when the
     * journal turns out to lack something. */
    if (have_partial && (rc = partial_read(partial, rep->damaged_bytes > 0, &pi)) < 0) goto done;
    const int64_t lacked = pi.listed > 0 ? ids_missing(pi.ids, pi.listed, jids, njids) : 0;
    if (have_partial && lacked > 0 && rep->damaged_bytes == 0 &&
        (rc = partial_read(partial, 1, &pi)) < 0)
        goto done;
    rep->partial_requests = pi.whole ? pi.listed : -1;
    if (rep->damaged_bytes > 0 || lacked > 0) {
        rep->damaged = rep->kept = 1;
        int len;
        if (rep->damaged_bytes > 0) {
            len = snprintf(rep->damage, sizeof rep->damage,
                           "%s: damaged at byte %lld (%lld byte%s in %d stretch%s that do not "
                           "check out, which no kill leaves); the other %lld request%s "
                           "checked out",
                           journal, (long long)rep->damaged_at, (long long)rep->damaged_bytes,
                           rep->damaged_bytes == 1 ? "" : "s", (int)rep->damaged_regions,
                           rep->damaged_regions == 1 ? "" : "es", (long long)njids,
                           njids == 1 ? "" : "s");
        } else {
            rep->damaged_at = fmoe__journal_reader_whole_end(jr);
            len = snprintf(rep->damage, sizeof rep->damage,
                           "%s: cut short at byte %lld after %lld request%s, and %s lists %lld "
                           "it lacks (no kill does that: each request is journalled before "
                           "the .partial gets it)",
                           journal, (long long)rep->damaged_at, (long long)njids,
                           njids == 1 ? "" : "s", partial, (long long)lacked);
        }
        /* the .partial's copy wins when it reads whole and holds every request the journal
         * gave, and more */
        const int use_partial = pi.whole && pi.listed > njids &&
                                ids_missing(jids, njids, pi.ids, pi.listed) == 0;
        if (len > 0 && (size_t)len < sizeof rep->damage) {
            char *at = rep->damage + len;
            const size_t cap = sizeof rep->damage - (size_t)len;
            if (use_partial)
                snprintf(at, cap, "; %s holds them and more: the trace is its copy (%lld "
                                  "requests)",
                         partial, (long long)pi.listed);
            else if (!have_partial)
                snprintf(at, cap, "; %s is not there", partial);
            else if (pi.listed < 0)
                snprintf(at, cap, "; %s does not read as a trace", partial);
            else if (!pi.whole)
                snprintf(at, cap, "; %s does not read whole (%s): the trace is the journal's",
                         partial, pi.why);
            else if (lacked > 0)
                snprintf(at, cap, "; %s lacks some of the journal's: the trace is the "
                                  "journal's",
                         partial);
            else
                snprintf(at, cap, "; %s holds no more", partial);
        }
        if (use_partial) {
            fmoe_trace_writer_abort(w);
            w = NULL;
            rep->from_journal = 0;
            rep->requests = pi.listed;
            rep->tokens = pi.tokens;
            if ((rc = copy_file(partial, tmp)) == 0) rc = publish(tmp, output);
            goto done;
        }
    }
    rc = fmoe_trace_writer_close(w);
    w = NULL;
    if (rc < 0 || (rc = publish(tmp, output)) < 0) goto done;
    if (!rep->damaged) {
        /* the trace holds everything they did: the torn tail was no finished request, and
         * the .partial lists nothing the journal lacks (or does not open at all: a kill in
         * the middle of an HDF5 write, which the journal is there for) */
        unlink(journal);
        unlink(partial);
    }
done:
    if (w) fmoe_trace_writer_abort(w);
    fmoe__journal_reader_close(jr);
    free(jids);
    free(pi.ids);
    free(tmp);
    free(journal);
    free(def);
    return rc;
}
