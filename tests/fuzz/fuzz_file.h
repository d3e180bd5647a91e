/*
 * fuzz_file.h - inputs as files for the fuzz targets whose parsers open a path (prompt
 * datasets, arrivals, importers): the bytes go into a memfd, named /proc/self/fd/N, so no
 * disk is touched and nothing is left behind; and a private folder for importer outputs.
 */
#ifndef FMOE_TESTS_FUZZ_FILE_H
#define FMOE_TESTS_FUZZ_FILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* Holds data[0..size) in memfd number `slot` (0..3, reused across calls) and returns its
 * path, valid until the next call with the same slot. Aborts when the system refuses. */
static inline const char *fuzz_memfile(int slot, const uint8_t *data, size_t size) {
    static int fds[4] = {-1, -1, -1, -1};
    static char paths[4][64];
    if (fds[slot] < 0) {
        fds[slot] = memfd_create("fmoe-fuzz", MFD_CLOEXEC);
        if (fds[slot] < 0) abort();
        snprintf(paths[slot], sizeof paths[slot], "/proc/self/fd/%d", fds[slot]);
    }
    if (ftruncate(fds[slot], 0) != 0) abort();
    size_t done = 0;
    while (done < size) {
        ssize_t w = pwrite(fds[slot], data + done, size - done, (off_t)done);
        if (w <= 0) abort();
        done += (size_t)w;
    }
    return paths[slot];
}

static char fuzz_dir_path[256];

static void fuzz_dir_remove(void) {
    if (!fuzz_dir_path[0]) return;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", fuzz_dir_path);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", fuzz_dir_path);
}

/* A private temporary folder (in /dev/shm when there is one), removed at exit. */
static inline const char *fuzz_dir(void) {
    if (fuzz_dir_path[0]) return fuzz_dir_path;
    snprintf(fuzz_dir_path, sizeof fuzz_dir_path, "%s/fmoe-fuzz-XXXXXX",
             access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    if (!mkdtemp(fuzz_dir_path)) abort();
    atexit(fuzz_dir_remove);
    return fuzz_dir_path;
}

#endif
