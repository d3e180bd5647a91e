/*
 * preader.h - internal (fmoe__): one read of a few file extents kept several requests
 * deep. A single pread at a time leaves a disk (an NVMe drive, a cloud volume) at queue
 * depth 1, idle between requests: reads of a few MiB then reach a fraction of what the
 * device gives several requests in flight. The reader splits its extents into segments and
 * issues up to `depth` of them at once, from depth - 1 threads of its own and the caller;
 * the call returns when every segment is done, so to its caller it is one synchronous
 * read. Depth 1 starts no thread and reads each extent with one request, in order.
 *
 * The live engine's file tier (runtime/offload/expert_tier.c) and `fmoe calibrate`'s
 * O_DIRECT link test (sim/calibrate.c) read through it alike, so the link the simulator is
 * given is the one the live engine sees.
 *
 *     fmoe__preader *p;
 *     fmoe__preader_open(&p, 4);
 *     fmoe__pread_extent x = {.fd = fd, .offset = at, .bytes = n, .dst = buf};
 *     fmoe__preader_read(p, &x, 1, 4096);    // then x.err, x.got
 *     fmoe__preader_close(p);
 */
#ifndef FMOE_PREADER_H
#define FMOE_PREADER_H

#include <stdint.h>

/* Segments are at least this long (and whole multiples of the alignment): shorter
 * requests cost the device more per byte than the depth gains. */
#define FMOE_PREADER_MIN_SEGMENT (256 * 1024)
#define FMOE_PREADER_DEFAULT_DEPTH 4
#define FMOE_PREADER_MAX_DEPTH 64

typedef struct fmoe__preader fmoe__preader;

/* One extent: bytes [offset, offset + bytes) of fd into dst. The results: got, the bytes
 * read from `offset` on without a gap (less than `bytes` when the file ends first); err,
 * 0 or the errno of the first failing request in file order that comes before the file's
 * end, and err_at, the file offset that request failed at. */
typedef struct fmoe__pread_extent {
    int fd;
    int64_t offset;
    int64_t bytes;
    void *dst;
    int64_t got;
    int err;
    int64_t err_at;
} fmoe__pread_extent;

/* depth 1..FMOE_PREADER_MAX_DEPTH: requests in flight at most (depth - 1 threads).
 * @return 0, FMOE_EINVAL, FMOE_ENOMEM (also when a thread cannot be made). */
int fmoe__preader_open(fmoe__preader **out, int32_t depth);
/* Joins the threads. NULL: no-op. */
void fmoe__preader_close(fmoe__preader *p);
int32_t fmoe__preader_depth(const fmoe__preader *p);

/* Reads n extents (n >= 1) concurrently, each in segments of at least
 * FMOE_PREADER_MIN_SEGMENT bytes whose offsets and lengths stay multiples of `align` (an
 * O_DIRECT read's: 4096, with offsets, lengths and dst already aligned; else 1), retrying
 * EINTR and short reads; a read of 0 bytes is the file's end. Blocks until all are done;
 * one caller at a time (others wait). @return 0 when every extent was read whole, else -1
 * (see each extent's got and err). */
int fmoe__preader_read(fmoe__preader *p, fmoe__pread_extent *x, int32_t n, int64_t align);

/* Tests: from now on, segment `index` (0-based, in file order over the extents of a read)
 * of every read fails with EIO at its offset, without reading, as a failing disk would.
 * -1: none. */
void fmoe__preader_inject_eio(fmoe__preader *p, int32_t index);

#endif
