/*
 * fuzz_datasets.c - fuzz target for the parsers of datasets/ (STYLE.md rule 15): prompt
 * datasets in every format, the Azure arrival CSV, and both trace importers.
 *
 * The parsers read files, so each input is written to a temporary file first.
 * With libFuzzer:
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -DFMOE_LIBFUZZER ... \
 *     tests/datasets/fuzz_datasets.c <the fmoe-datasets, fmoe-trace, fmoe-core libraries>
 *   ./fuzz_datasets tests/fixtures/datasets
 * Without (the `fuzz` suite of meson test): replays every fixture under
 * tests/fixtures/datasets, its prefixes at a stride, and seeded byte mutations of it,
 * under the build's sanitizers. A crash, a sanitizer report, or an error without a
 * detail string fails the run.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fmoe/datasets.h"
#include "fmoe/error.h"
#include "fmoe/geometry.h"

static char dir[256];
static char in_path[300], out_path[300], partial_path[320];

static void setup(void) {
    if (dir[0]) return;
    snprintf(dir, sizeof dir, "/tmp/fmoe-fuzz-datasets-XXXXXX");
    if (!mkdtemp(dir)) abort();
    snprintf(in_path, sizeof in_path, "%s/input", dir);
    snprintf(out_path, sizeof out_path, "%s/out.h5", dir);
    snprintf(partial_path, sizeof partial_path, "%s.partial", out_path);
}

/* A failed import must leave neither the output nor its partial file. */
static void check_nothing_left(int rc) {
    if (rc < 0 && (access(out_path, F_OK) == 0 || access(partial_path, F_OK) == 0)) {
        fprintf(stderr, "fuzz_datasets: a failed import left a file behind\n");
        abort();
    }
    unlink(out_path);
}

static void need_detail(int rc, const char *what) {
    if (rc < 0 && !fmoe_error_detail()[0]) {
        fprintf(stderr, "fuzz_datasets: %s failed (%d) without a detail\n", what, rc);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);
int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    setup();
    FILE *f = fopen(in_path, "wb");
    if (!f) abort();
    fwrite(data, 1, size, f);
    fclose(f);

    for (int fmt = FMOE_PROMPTS_AUTO; fmt <= FMOE_PROMPTS_TEXT; fmt++) {
        fmoe_prompt_set *s = NULL;
        fmoe_error_clear();
        int rc = fmoe_prompts_load(in_path, (fmoe_prompt_format)fmt, &s);
        need_detail(rc, "fmoe_prompts_load");
        if (rc == 0)
            for (int64_t i = 0; i < s->count; i++)
                if (!s->ids[i] || !s->prompts[i] || !s->prompts[i][0]) abort();
        fmoe_prompt_set_free(s);
    }
    fmoe_arrivals *a = NULL;
    fmoe_error_clear();
    int rc = fmoe_arrivals_load_azure(in_path, &a);
    need_detail(rc, "fmoe_arrivals_load_azure");
    for (int64_t i = 0; rc == 0 && i < a->count; i++)
        if (a->arrival_s[i] < 0 || a->context_tokens[i] < 0 || a->generated_tokens[i] < 0)
            abort();
    fmoe_arrivals_free(a);

    fmoe_model_geometry g;
    fmoe_geometry_generic(2, 8, 2, 0, &g);
    fmoe_import_options o = {.geometry = &g, .write = {.compression = FMOE_COMPRESSION_NONE}};
    fmoe_import_report rep;
    fmoe_error_clear();
    rc = fmoe_import_jsonl(in_path, &o, out_path, &rep);
    need_detail(rc, "fmoe_import_jsonl");
    check_nothing_left(rc);

    fmoe_geometry_generic(2, 4, 2, 0, &g);
    const char *files[2] = {in_path, in_path};
    fmoe_error_clear();
    rc = fmoe_import_dense_csv(files, 2, 2, &o, out_path, &rep);
    need_detail(rc, "fmoe_import_dense_csv");
    check_nothing_left(rc);
    return 0;
}

#ifndef FMOE_LIBFUZZER
#include "fuzz_mutate.h"


static const char *const tokens[] = {
    "{", "}", "[", "]", ",", ":", "\"", "\n", "\r\n", "null", "-1", "0", "1e308", "65536",
    "2.5", "\\u0000", "\xff", "\"prefill\"", "\"layer\"", "\"experts\"", "\"probs\"",
    "\"request\"", "\"token\"", "0.000000", "2023-02-29 ", "99:99:99"};
static fuzz_mutator mutator = {0x2545f4914f6cdd1dull, tokens, sizeof tokens / sizeof tokens[0]};

static int replay_file(const char *path, int mutations) {
    size_t n;
    char *src = fuzz_read_fixture("fuzz_datasets", path, 1 << 16, &n);
    if (!src) return 1;
    fuzz_replay(&mutator, src, n, n / 24 + 1, mutations, LLVMFuzzerTestOneInput);
    free(src);
    return 0;
}

static int replay_dir(const char *d, int *files) {
    DIR *h = opendir(d);
    if (!h) return 1;
    int bad = 0;
    struct dirent *e;
    char path[2048];
    while ((e = readdir(h))) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", d, e->d_name);
        struct stat st;
        if (stat(path, &st) != 0) continue;
        if (S_ISDIR(st.st_mode)) {
            bad |= replay_dir(path, files);
        } else if (S_ISREG(st.st_mode) && !strstr(e->d_name, ".md")) {
            bad |= replay_file(path, 150);
            (*files)++;
        }
    }
    closedir(h);
    return bad;
}

static void cleanup(void) {
    if (!dir[0]) return;
    unlink(in_path);
    unlink(out_path);
    rmdir(dir);
}

int main(int argc, char **argv) {
    int bad = 0, files = 0;
    if (argc > 1) { /* explicit inputs, e.g. a crash file */
        for (int i = 1; i < argc; i++) bad |= replay_file(argv[i], 0);
        cleanup();
        return bad;
    }
    const char *fix = getenv("FMOE_FIXTURES");
    char d[1024];
    snprintf(d, sizeof d, "%s/datasets", fix ? fix : "tests/fixtures");
    bad = replay_dir(d, &files);
    cleanup();
    printf("fuzz_datasets: %d fixtures replayed with prefixes and 150 mutations each\n", files);
    return bad || files == 0;
}
#endif
