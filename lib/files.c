/* files.c - regular-file inputs and partial-then-rename outputs (lib/files.h). */
#include "files.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fmoe/error.h"

int fmoe__open_regular(const char *path) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return fmoe_error_set(FMOE_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return fmoe_error_set(FMOE_EIO, "%s: not a regular file", path);
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
}

int fmoe__fopen_regular(const char *path, FILE **out) {
    *out = NULL;
    int fd = fmoe__open_regular(path);
    if (fd < 0) return fd;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int e = errno;
        close(fd);
        return fmoe_error_set(FMOE_EIO, "%s: cannot open: %s", path, strerror(e));
    }
    *out = f;
    return 0;
}

/* A bounded read's "too large". */
static int too_large(const char *name, const char *what, long long max_bytes) {
    return fmoe_error_set(FMOE_ERANGE, "%s: more than %lld bytes: too large for %s", name,
                          max_bytes, what);
}

int fmoe__read_file_bounded(const char *path, const char *what, long long max_bytes,
                            int flags, char **data, size_t *len) {
    *data = NULL;
    *len = 0;
    const int pipes = (flags & FMOE_READ_PIPES) != 0;
    const int is_stdin = pipes && strcmp(path, "-") == 0;
    const char *name = is_stdin ? "standard input" : path;
    int fd = is_stdin ? STDIN_FILENO : open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return fmoe_error_set(FMOE_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    int rc = 0;
    char *buf = NULL;
    size_t n = 0;
    if (fstat(fd, &st) != 0) {
        rc = fmoe_error_set(FMOE_EIO, "%s: cannot stat: %s", name, strerror(errno));
        goto done;
    }
    const int regular = S_ISREG(st.st_mode);
    if (S_ISDIR(st.st_mode)) {
        rc = fmoe_error_set(FMOE_EIO, "%s: is a directory", name);
        goto done;
    }
    if (!regular && !pipes) {
        rc = fmoe_error_set(FMOE_EIO, "%s: not a regular file", name);
        goto done;
    }
    if (regular && (long long)st.st_size > max_bytes) {
        rc = too_large(name, what, max_bytes);
        goto done;
    }
    if (!is_stdin && S_ISFIFO(st.st_mode)) {
        /* opened without blocking, a FIFO with no writer yet reads as empty: open it again,
         * waiting for the writer as any reader of a named pipe does */
        close(fd);
        if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
            return fmoe_error_set(FMOE_EIO, "%s: cannot open: %s", path, strerror(errno));
    } else if (!is_stdin) {
        const int fl = fcntl(fd, F_GETFL);
        if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    }
    const size_t limit = (size_t)max_bytes + 1; /* one byte more tells "too large" */
    size_t cap = regular ? (size_t)st.st_size + 1 : 65536; /* bytes, without the NUL */
    if (cap > limit) cap = limit;
    if (!(buf = malloc(cap + 1))) {
        rc = fmoe_error_set(FMOE_ENOMEM, "%s: cannot allocate %zu bytes", name, cap + 1);
        goto done;
    }
    for (;;) {
        if (n == cap) {
            if (cap == limit) break;
            const size_t ncap = cap > limit / 2 ? limit : cap * 2;
            char *nb = realloc(buf, ncap + 1);
            if (!nb) {
                rc = fmoe_error_set(FMOE_ENOMEM, "%s: cannot allocate %zu bytes", name,
                                    ncap + 1);
                goto done;
            }
            buf = nb;
            cap = ncap;
        }
        ssize_t k = read(fd, buf + n, cap - n);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            rc = fmoe_error_set(FMOE_EIO, "%s: cannot read: %s", name, strerror(errno));
            goto done;
        }
        if (k == 0) break;
        n += (size_t)k;
    }
    if (n > (size_t)max_bytes) {
        rc = too_large(name, what, max_bytes);
        goto done;
    }
    buf[n] = '\0';
    *data = buf;
    *len = n;
    buf = NULL;
done:
    free(buf);
    if (!is_stdin) close(fd);
    return rc;
}

int fmoe__output_check(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) return 0; /* absent (or unreachable: the create will say why) */
    FMOE_RETURN_ERROR_IF(S_ISDIR(st.st_mode), FMOE_EIO, "%s: is a directory", path);
    FMOE_RETURN_ERROR_IF(!S_ISREG(st.st_mode), FMOE_EIO, "%s: exists and is not a regular file",
                         path);
    return 0;
}

int fmoe__partial_prepare(const char *partial) {
    struct stat st;
    if (lstat(partial, &st) != 0) return 0;
    FMOE_RETURN_ERROR_IF(!S_ISREG(st.st_mode) || st.st_uid != geteuid(), FMOE_EIO,
                         "%s: exists and is not a regular file of ours; remove it", partial);
    if (unlink(partial) != 0 && errno != ENOENT)
        return fmoe_error_set(FMOE_EIO, "%s: cannot remove the stale partial file: %s", partial,
                              strerror(errno));
    return 0;
}

int fmoe__partial_create(const char *partial, int access) {
    FMOE_FORWARD_IF_ERROR(fmoe__partial_prepare(partial));
    int fd = open(partial, access | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd < 0) return fmoe_error_set(FMOE_EIO, "%s: cannot create: %s", partial, strerror(errno));
    return fd;
}

int fmoe__partial_fopen(const char *output, const char *partial, const char *mode, FILE **out) {
    *out = NULL;
    FMOE_FORWARD_IF_ERROR(fmoe__output_check(output));
    int fd = fmoe__partial_create(partial, strchr(mode, '+') ? O_RDWR : O_WRONLY);
    if (fd < 0) return fd;
    FILE *f = fdopen(fd, mode);
    if (!f) {
        int e = errno;
        close(fd);
        unlink(partial);
        return fmoe_error_set(FMOE_EIO, "%s: cannot create: %s", partial, strerror(e));
    }
    *out = f;
    return 0;
}

int fmoe__write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return -1;
        if (k == 0) { /* a regular file never says 0 for n > 0; do not spin if one does */
            errno = EIO;
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

int fmoe__pread_all(int fd, void *buf, size_t n, long long offset) {
    char *p = buf;
    while (n > 0) {
        ssize_t k = pread(fd, p, n, (off_t)offset);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return -1;
        if (k == 0) { /* the file ended first */
            errno = EIO;
            return -1;
        }
        p += k;
        offset += k;
        n -= (size_t)k;
    }
    return 0;
}

int fmoe__partial_commit(const char *partial, const char *output) {
    /* fsync before the rename: otherwise a machine crash soon after could leave the new
     * name pointing at a file whose data never reached the disk (an empty or short file
     * under the final name). A killed process needs none of this (the page cache
     * survives it); a power cut does. */
    int fd = open(partial, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return fmoe_error_set(FMOE_EIO, "%s: cannot open to sync: %s", partial,
                                      strerror(errno));
    if (fsync(fd) != 0 && errno != EINVAL && errno != EROFS) {
        int e = errno;
        close(fd);
        return fmoe_error_set(FMOE_EIO, "%s: cannot sync: %s", partial, strerror(e));
    }
    close(fd);
    /* The folder is not synced: after a power cut the rename may be undone, which leaves
     * the previous file (or none), never a damaged one; that is the promise. */
    fmoe__fault_point("commit-before-rename");
    if (rename(partial, output) != 0)
        return fmoe_error_set(FMOE_EIO, "%s: cannot rename to %s: %s", partial, output,
                              strerror(errno));
    fmoe__fault_point("commit-after-rename");
    return 0;
}

/* FMOE_FAULT_SIGNAL, parsed once: the point's name, which passage (1 = first) and signal. */
static struct {
    atomic_int state; /* 0 not parsed, 1 parsed and armed, 2 parsed and off */
    char point[64];
    long at;
    int sig;
    atomic_long passed;
} fault;

static void fault_parse(void) {
    const char *v = getenv("FMOE_FAULT_SIGNAL");
    int armed = 0;
    if (v && *v) {
        size_t n = strcspn(v, "#:");
        if (n > 0 && n < sizeof fault.point) {
            memcpy(fault.point, v, n);
            fault.point[n] = 0;
            fault.at = 1;
            fault.sig = SIGTERM;
            const char *p = v + n;
            if (*p == '#') fault.at = strtol(p + 1, (char **)&p, 10);
            if (*p == ':') fault.sig = (int)strtol(p + 1, (char **)&p, 10);
            armed = *p == 0 && fault.at >= 1 && fault.sig > 0;
        }
    }
    atomic_store(&fault.state, armed ? 1 : 2);
}

void fmoe__fault_point(const char *point) {
    int state = atomic_load_explicit(&fault.state, memory_order_acquire);
    if (state == 0) { /* racing first calls parse the same string to the same result */
        fault_parse();
        state = atomic_load(&fault.state);
    }
    if (state != 1 || strcmp(point, fault.point) != 0) return;
    if (atomic_fetch_add(&fault.passed, 1) + 1 == fault.at) raise(fault.sig);
}

void fmoe__populate_read(void *map, size_t n) {
    if (!map || n == 0) return;
#ifdef MADV_POPULATE_READ
    if (madvise(map, n, MADV_POPULATE_READ) == 0) return;
#endif
    (void)madvise(map, n, MADV_WILLNEED);
}
