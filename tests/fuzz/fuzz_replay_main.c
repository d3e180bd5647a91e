/*
 * fuzz_replay_main.c - the main of every fuzz target when it is not built with libFuzzer
 * (meson's default, `-Dfuzzing=false`; suite `fuzz` of meson test): each argument is a
 * file, a folder (its regular files, not recursively, hidden ones skipped) or a packed
 * corpus, `<target>.tar.zst` (tests/fuzz/pack-corpus.sh), and every file goes through
 * LLVMFuzzerTestOneInput once, as an exact-size heap copy so that a read past the end is
 * an ASan report. Then the target's own seeded replay runs when it has one
 * (fuzz_seeded_replay: mutations of fixtures, cheap) unless FMOE_FUZZ_CORPUS_ONLY is set.
 *
 * An archive is unpacked with `tar -I zstd` into `--unpack-into=DIR`/<target>/ (meson
 * passes the build folder's tests/fuzz/corpus; emptied first, so only the archive's files
 * are replayed, and left there to look at) or, without that option, into a temporary
 * folder removed afterwards; the source tree is never written. A missing or unreadable
 * archive fails the run, as a corpus silently replayed as empty would hide everything;
 * a missing folder is not an error (crashes/<target>/ may not exist). A crash, a
 * sanitizer report or an abort() from the target's invariants fails the run. One line per
 * argument says how many inputs it gave.
 */
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

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

/* ---- packed corpora ---------------------------------------------------------------- */

static const char archive_ext[] = ".tar.zst";

static int is_archive(const char *path) {
    size_t n = strlen(path), e = sizeof archive_ext - 1;
    return n > e && strcmp(path + n - e, archive_ext) == 0;
}

/* Runs argv (searched in PATH) and waits; 0 when it exited 0. */
static int run_command(char *const argv[]) {
    pid_t pid;
    int err = posix_spawnp(&pid, argv[0], NULL, NULL, argv, environ);
    if (err) {
        fprintf(stderr, "fuzz replay: cannot run %s: %s\n", argv[0], strerror(err));
        return -1;
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

/* Removes path and everything under it (symbolic links themselves, never their targets);
 * a path that is not there is fine. */
static int remove_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : -1;
    return nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static int make_dirs(const char *path) {
    char p[4096];
    if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p) return -1;
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        if (mkdir(p, 0777) != 0 && errno != EEXIST) return -1;
        *s = '/';
    }
    return mkdir(p, 0777) != 0 && errno != EEXIST ? -1 : 0;
}

/* Unpacks archive into into/<name>/ (name: the archive's without .tar.zst), emptied first,
 * or into a new temporary folder when into is NULL; dir gets the folder. */
static int unpack(const char *archive, const char *into, char *dir, size_t cap) {
    struct stat st;
    if (stat(archive, &st) != 0 || !S_ISREG(st.st_mode)) {
        fprintf(stderr, "fuzz replay: %s: no such archive\n", archive);
        return -1;
    }
    if (into) {
        const char *base = strrchr(archive, '/');
        base = base ? base + 1 : archive;
        int n = (int)(strlen(base) - (sizeof archive_ext - 1));
        if (snprintf(dir, cap, "%s/%.*s", into, n, base) >= (int)cap || make_dirs(into) != 0 ||
            remove_tree(dir) != 0 || mkdir(dir, 0777) != 0) {
            fprintf(stderr, "fuzz replay: cannot make an empty %s/%.*s: %s\n", into, n, base,
                    strerror(errno));
            return -1;
        }
    } else {
        const char *tmp = getenv("TMPDIR");
        if (snprintf(dir, cap, "%s/fmoe-fuzz-corpus-XXXXXX", tmp && *tmp ? tmp : "/tmp") >=
                (int)cap ||
            !mkdtemp(dir)) {
            fprintf(stderr, "fuzz replay: cannot make a temporary folder: %s\n", strerror(errno));
            return -1;
        }
    }
    char *tar[] = {"tar", "-I", "zstd", "-xf", (char *)archive, "-C", dir, NULL};
    if (run_command(tar) != 0) {
        fprintf(stderr, "fuzz replay: %s: tar -I zstd could not unpack it into %s (tar says "
                        "why above; zstd must be installed)\n", archive, dir);
        if (!into) remove_tree(dir);
        return -1;
    }
    return 0;
}

/* ---- main ------------------------------------------------------------------------- */

int main(int argc, char **argv) {
    static const char opt[] = "--unpack-into=";
    const char *into = NULL;
    int bad = 0;
    for (int i = 1; i < argc; i++)
        if (strncmp(argv[i], opt, sizeof opt - 1) == 0) into = argv[i] + sizeof opt - 1;
    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], opt, sizeof opt - 1) == 0) continue;
        long before = inputs;
        if (!is_archive(argv[i])) {
            bad |= run_path(argv[i]);
            printf("%s: %ld inputs from %s\n", argv[0], inputs - before, argv[i]);
            continue;
        }
        char dir[4096];
        if (unpack(argv[i], into, dir, sizeof dir) != 0) {
            bad = 1;
            continue;
        }
        bad |= run_path(dir);
        printf("%s: %ld inputs from %s (unpacked in %s)\n", argv[0], inputs - before, argv[i],
               into ? dir : "a temporary folder");
        if (!into && remove_tree(dir) != 0) fprintf(stderr, "fuzz replay: cannot remove %s\n", dir);
    }
    printf("%s: %ld corpus and crash inputs replayed\n", argv[0], inputs);
    if (fuzz_seeded_replay && !getenv("FMOE_FUZZ_CORPUS_ONLY")) bad |= fuzz_seeded_replay() != 0;
    return bad;
}
