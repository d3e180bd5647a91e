/*
 * trace_journal.h - internal: the journal of complete requests that a trace writer keeps
 * beside its "<path>.partial" (trace_journal.c has the design and the format).
 *
 * Why a journal and not the HDF5 file itself: HDF5 updates its metadata (B-tree nodes,
 * object headers, the free-space it reuses) in place, so a process killed in the middle of
 * an append or a flush can leave a .partial whose earlier requests no longer read back.
 * The journal is append-only and every record carries its length and a CRC, so a kill at
 * any instant leaves a prefix of whole records plus at most one torn record at the end,
 * which the reader recognises and drops. Damage anywhere else (a flipped bit, a block the
 * disk lost) costs only the records it touches: the reader skips to the next record that
 * checks out and counts what it skipped. `fmoe trace recover` rebuilds a trace from it.
 */
#ifndef FMOE_TRACE_JOURNAL_H
#define FMOE_TRACE_JOURNAL_H

#include <stdint.h>

#include "fmoe/trace.h"

typedef struct fmoe__journal fmoe__journal;

/* Creates PATH exclusively (fmoe__partial_create: a stale journal of ours is NOT replaced
 * here, the caller decides) and writes the file header and the trace header record (the
 * header after the writer filled its defaults, config_json, the write options).
 * @return 0 with *out, or FMOE_EIO/FMOE_ENOMEM naming PATH. */
int fmoe__journal_create(fmoe__journal **out, const char *path, const fmoe_trace_header *h,
                         const char *config_json, const fmoe_trace_write_options *opts);

/* Appends one request (already validated against the header) as one record; when this
 * returns 0 the record is in the kernel's hands (it survives the process, not a power
 * cut: there is no fsync). On failure the file is cut back to its last whole record (best
 * effort). @return 0, FMOE_EIO naming the file and the reason (a full disk), FMOE_ENOMEM. */
int fmoe__journal_append(fmoe__journal *j, const fmoe_trace_request *q);

/* Closes the journal; remove = 1 also unlinks it. NULL is a no-op. */
void fmoe__journal_close(fmoe__journal *j, int remove);

/* Reading, for recovery. */
typedef struct fmoe__journal_reader fmoe__journal_reader;

/* Opens PATH (a regular file), checks the file header and reads the trace header record:
 * *h (config_json pointing into the reader, valid until close) and *opts.
 * @return 0; FMOE_EFORMAT when PATH is not a journal, is of another version or byte
 * order, or ends before its header record is whole; FMOE_EIO. */
int fmoe__journal_reader_open(fmoe__journal_reader **out, const char *path, fmoe_trace_header *h,
                              fmoe_trace_write_options *opts);

/* The next request record that checks out (its checksum holds and its size is the one the
 * header gives it): 1 with *q (arrays owned by the reader, valid until the next call), 0 at
 * the end, < 0 on a read error. Bytes that do not check are skipped up to the next record
 * that does (fmoe__journal_reader_damaged); when none follows, they are the torn tail a
 * kill leaves (fmoe__journal_reader_dropped) if they look like one (a request record with
 * CRC 0, its length at least the bytes left and the one its fixed fields give), else damage
 * too: a record whose CRC was written was whole, whatever its length field now says. */
int fmoe__journal_reader_next(fmoe__journal_reader *r, fmoe_trace_request *q);

/* Bytes of the torn last record (a request the kill cut short), once next returned 0. */
int64_t fmoe__journal_reader_dropped(const fmoe__journal_reader *r);

/* The offset just past the last record that checked out (the header record's end when no
 * request did): where a journal cut short at a record boundary ends. */
int64_t fmoe__journal_reader_whole_end(const fmoe__journal_reader *r);

/* Bytes skipped as damage so far; *first_at (may be NULL) the first of them (-1: none),
 * *regions (may be NULL) how many separate stretches. */
int64_t fmoe__journal_reader_damaged(const fmoe__journal_reader *r, int64_t *first_at,
                                     int32_t *regions);

void fmoe__journal_reader_close(fmoe__journal_reader *r); /* NULL is a no-op */

#endif
