/*
 * fuzz_datasets.c - fuzz target for the prompt dataset readers of datasets/prompts.c:
 * every format (auto-detected, JSON Lines, ShareGPT/LMSYS JSON, text).
 * The Azure arrivals CSV and the two trace importers have their own targets
 * (fuzz_arrivals.c, fuzz_import_jsonl.c, fuzz_dense_csv.c).
 *
 * The readers open a path, so each input goes into a memfd first (fuzz_file.h).
 * Build and run: tests/fuzz/README.md. The replay mode (meson test --suite fuzz) also
 * replays every fixture under tests/fixtures/datasets, its prefixes at a stride, and
 * seeded byte mutations of it. A crash, a sanitizer report, an error without a detail
 * string or an empty prompt fails the run.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fmoe/datasets.h"
#include "fmoe/error.h"
#include "fuzz_file.h"

static void need_detail(int rc, const char *what) {
    if (rc < 0 && !fmoe_error_detail()[0]) {
        fprintf(stderr, "fuzz_datasets: %s failed (%d) without a detail\n", what, rc);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);
int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    const char *in_path = fuzz_memfile(0, data, size);
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

int fuzz_seeded_replay(void);
int fuzz_seeded_replay(void) {
    int bad = 0, files = 0;
    const char *fix = getenv("FMOE_FIXTURES");
    char d[1024];
    snprintf(d, sizeof d, "%s/datasets", fix ? fix : "tests/fixtures");
    bad = replay_dir(d, &files);
    printf("fuzz_datasets: %d fixtures replayed with prefixes and 150 mutations each\n", files);
    return bad || files == 0;
}
#endif
