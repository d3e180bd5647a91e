/*
 * files.h - internal (fmoe__): how every part of fmoe opens the files it reads and creates
 * the files it writes, so that hostile paths behave the same everywhere.
 *
 * Inputs must be regular files: a FIFO would block the open (or the read) forever, and a
 * device such as /dev/zero would be read without end. Outputs are written to
 * "<path>.partial" and renamed over <path> when complete; <path> itself must be absent or a
 * regular file (renaming over /dev/null as root would replace the device node; over a
 * directory fails only at the end, after the work). A stale partial is replaced only when
 * it is a regular file we own: a symlink there could point the writer at any file, so it is
 * refused, and the new partial is created with O_CREAT|O_EXCL|O_NOFOLLOW so a symlink put
 * there after the check is refused too.
 */
#ifndef FMOE_FILES_H
#define FMOE_FILES_H

#include <stdio.h>

/* Opens PATH read-only when it is a regular file: O_NONBLOCK for the open itself (a FIFO
 * without a writer must not block), fstat, then blocking again. @return a file descriptor,
 * or FMOE_EIO with the detail "PATH: cannot open: <reason>" or "PATH: not a regular file". */
int fmoe__open_regular(const char *path);

/* fmoe__open_regular as a stdio stream ("rb"). @return 0 with *out set, or FMOE_EIO. */
int fmoe__fopen_regular(const char *path, FILE **out);

/* fmoe__read_file_bounded's flags. */
enum {
    /* A pipe, FIFO, socket or character device is read too (at most max_bytes + 1 bytes,
     * so /dev/zero ends in "too large"), and "-" is standard input. A FIFO's open waits
     * for its writer, as cat's would: only for inputs a user may pipe in. */
    FMOE_READ_PIPES = 1,
};

/* The one way fmoe reads a whole text or JSON input (a config.json, a profile, a
 * tokenizer.json, a dataset, tokenize --file): PATH opened with O_NONBLOCK (a FIFO without a
 * writer must not block the open), fstat, then
 *   - not a regular file, without FMOE_READ_PIPES: FMOE_EIO "PATH: not a regular file";
 *   - a directory: FMOE_EIO "PATH: is a directory";
 *   - more than max_bytes (st_size for a regular file, else counted while reading at most
 *     max_bytes + 1): FMOE_ERANGE "PATH: more than N bytes: too large for WHAT" (WHAT
 *     names the format, "a config.json"; each caller's limit is far above any real file
 *     of its format and far below what would exhaust memory);
 * else the bytes into *data (malloc'd, NUL-terminated; the caller frees) and their count
 * into *len (without the NUL). A file that grows while read is read to its end or the
 * limit, whichever comes first. @return 0, FMOE_EIO, FMOE_ERANGE or FMOE_ENOMEM, with a
 * detail naming PATH ("standard input" for "-"). */
int fmoe__read_file_bounded(const char *path, const char *what, long long max_bytes,
                            int flags, char **data, size_t *len);

/* 0 when PATH (followed through symlinks) is absent or a regular file, else FMOE_EIO with
 * "PATH: is a directory" or "PATH: exists and is not a regular file". */
int fmoe__output_check(const char *path);

/* Makes way for creating PARTIAL exclusively: absent is fine; a regular file owned by this
 * user (a stale partial of a killed run) is unlinked, which removes only that name; anything
 * else (symlink, FIFO, device, directory, another user's file) is refused with FMOE_EIO and
 * "PARTIAL: exists and is not a regular file of ours; remove it". */
int fmoe__partial_prepare(const char *partial);

/* Prepares PARTIAL (fmoe__partial_prepare) and creates it with
 * access|O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC (access: O_WRONLY or O_RDWR; mode 0666 &
 * ~umask). @return the file descriptor, or FMOE_EIO naming the file. */
int fmoe__partial_create(const char *partial, int access);

/* Checks OUTPUT (fmoe__output_check), prepares PARTIAL and creates it with
 * O_WRONLY|O_CREAT|O_EXCL|O_NOFOLLOW (mode 0666 & ~umask), opened as stdio with `mode`
 * ("w" or "wb+"). @return 0 with *out set, or FMOE_EIO naming the file. */
int fmoe__partial_fopen(const char *output, const char *partial, const char *mode, FILE **out);

/* write(2) until all n bytes are written, retrying EINTR and short writes. @return 0, or
 * -1 with errno set (ENOSPC, EFBIG, EIO, ...); bytes before the failure may be written. */
int fmoe__write_all(int fd, const void *buf, size_t n);

/* pread(2) of exactly n bytes at `offset`, retrying EINTR and short reads. @return 0, or
 * -1 with errno set (EIO when the file ends first). */
int fmoe__pread_all(int fd, void *buf, size_t n, long long offset);

/* Makes a finished PARTIAL the OUTPUT: fsync(PARTIAL), then rename(PARTIAL, OUTPUT)
 * (atomic: OUTPUT is the old file or the new one, never a mix, even after a power cut,
 * which could otherwise leave the new name on data never written). @return 0 or FMOE_EIO
 * naming the file and the reason. */
int fmoe__partial_commit(const char *partial, const char *output);

/* Maps every page of the read-only file mapping [map, map + n) into the process now
 * (MADV_POPULATE_READ, Linux 5.14; MADV_WILLNEED, a read-ahead without the mapping, where
 * the kernel lacks it), so that a forward pass reading weights in place does not take a
 * page fault per 4-64 KiB the first time it touches each: what llama.cpp's MAP_POPULATE
 * does at load. The file is read from the disk if it is not cached. Best effort: a failure
 * changes nothing but speed. */
void fmoe__populate_read(void *map, size_t n);

/* Deterministic fault injection for the crash-safety tests: with the environment variable
 * FMOE_FAULT_SIGNAL="POINT[#N][:SIGNUM]" the process raises SIGNUM (default SIGTERM) at the
 * Nth time (default the first) it passes fmoe__fault_point(POINT), so a test can place a
 * signal exactly where a race would only sometimes put it. Points in the code:
 *   "commit-before-rename"  the partial is complete and synced, not yet renamed
 *   "commit-after-rename"   the output is in place, the command has not yet exited
 *   "trace-request"         a request was handed to the trace writer (#N: the Nth)
 *   "sweep-cell"            simulate wrote a cell's line to --sweep-out (#N: the Nth)
 * Unset (every real run): one getenv per process, then a load per call. */
void fmoe__fault_point(const char *point);

#endif
