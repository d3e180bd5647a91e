/*
 * fuzz_replay_main.c - the main of every fuzz target when it is not built with libFuzzer
 * (meson's default, `-Dfuzzing=false`; suite `fuzz` of meson test): each argument is a
 * file or a folder (its regular files, not recursively, hidden ones skipped), and every
 * file goes through LLVMFuzzerTestOneInput once, as an exact-size heap copy so that a read
 * past the end is an ASan report. Then the target's own seeded replay runs when it has one
 * (fuzz_seeded_replay: mutations of fixtures, cheap) unless FMOE_FUZZ_CORPUS_ONLY is set.
 * A missing folder is not an error (crashes/<target>/ may not exist); a crash, a
 * sanitizer report or an abort() from the target's invariants fails the run.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int fuzz_seeded_replay(void) __attribute__((weak));

static long inputs;

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "fuzz replay: cannot open %s\n", path);
        return 1;
    }
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            uint8_t *b = realloc(buf, cap *= 2);
            if (!b) free(buf);
            buf = b;
        }
    }
    fclose(f);
    if (!buf) return 1;
    uint8_t *exact = malloc(n ? n : 1);
    if (!exact) return 1;
    memcpy(exact, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    inputs++;
    return 0;
}

static int cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int run_path(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) return 0;
    if (!S_ISDIR(st.st_mode)) return run_file(path);
    DIR *d = opendir(path);
    if (!d) return 1;
    char **names = NULL;
    size_t count = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        if (count == cap && !(names = realloc(names, (cap = cap ? 2 * cap : 64) * sizeof *names)))
            abort();
        if (!(names[count++] = strdup(e->d_name))) abort();
    }
    closedir(d);
    if (count) qsort(names, count, sizeof *names, cmp); /* a stable order for the log */
    int bad = 0;
    for (size_t i = 0; i < count; i++) {
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", path, names[i]);
        if (stat(p, &st) == 0 && S_ISREG(st.st_mode)) bad |= run_file(p);
        free(names[i]);
    }
    free(names);
    return bad;
}

/* Under ASan, an allocation larger than ASan supports (1 TiB) aborts instead of returning
 * NULL as glibc's malloc does. libhdf5 1.10.8 sizes some buffers from a damaged file's
 * bytes before it checks them against the file's end (object header chunks: a forged
 * continuation length asked for 5 TB). fmoe checks the root group's header before
 * H5Fopen (trace/hdf5_guard.c), but the headers of the objects opened later are loaded
 * by libhdf5 alone; there a plain build gets NULL and a one-line "memory allocation
 * failed" error. Returning NULL here too keeps the replay to the behaviour the fmoe
 * binary has; ASAN_OPTIONS from the environment still override it. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

int main(int argc, char **argv) {
    int bad = 0;
    for (int i = 1; i < argc; i++) bad |= run_path(argv[i]);
    printf("%s: %ld corpus and crash inputs replayed\n", argv[0], inputs);
    if (fuzz_seeded_replay && !getenv("FMOE_FUZZ_CORPUS_ONLY")) bad |= fuzz_seeded_replay() != 0;
    return bad;
}
