/* files.c - regular-file inputs and partial-then-rename outputs (fmoe/files.h). */
#include "fmoe/files.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
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

int fmoe__partial_fopen(const char *output, const char *partial, const char *mode, FILE **out) {
    *out = NULL;
    FMOE_FORWARD_IF_ERROR(fmoe__output_check(output));
    FMOE_FORWARD_IF_ERROR(fmoe__partial_prepare(partial));
    int access = strchr(mode, '+') ? O_RDWR : O_WRONLY;
    int fd = open(partial, access | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd < 0) return fmoe_error_set(FMOE_EIO, "%s: cannot create: %s", partial, strerror(errno));
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
