/*
 * fuzz_geometry.c - fuzz target for the config.json parser and the config fingerprint.
 *
 * With libFuzzer (or simply meson -Dfuzzing=true, tests/fuzz/README.md):
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -DFMOE_LIBFUZZER -Ilib/include \
 *     tests/fuzz/fuzz_geometry.c lib/geometry.c lib/fingerprint.c lib/error.c lib/sha256.c \
 *     -lcjson -lm -o fuzz_geometry && ./fuzz_geometry tests/fixtures/configs/(star)/config.json
 * Without (the `fuzz` suite of meson test): replays every fixture config, each of its
 * prefixes, and a fixed set of seeded byte mutations, under the build's sanitizers.
 * Any crash, sanitizer report or broken invariant fails the run.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/geometry.h"

/* Invariants every successful parse must hold. */
static void check(const fmoe_model_geometry *g) {
    int ok = g->num_hidden_layers >= 1 && g->num_hidden_layers <= FMOE_MAX_LAYERS &&
             g->num_moe_layers >= 1 && g->num_moe_layers <= g->num_hidden_layers &&
             g->num_experts >= 1 && g->top_k >= 1 && g->top_k <= g->num_experts &&
             g->n_group >= 1 && g->topk_group >= 1 && g->topk_group <= g->n_group &&
             g->hidden_size >= 1 && g->moe_intermediate_size >= 1 &&
             fmoe_geometry_expert_bytes(g, FMOE_DTYPE_BF16) > 0 &&
             fmoe_geometry_expert_bytes(g, FMOE_DTYPE_MXFP4) > 0 &&
             memchr(g->model_type, 0, sizeof g->model_type) != NULL &&
             memchr(g->topk_method, 0, sizeof g->topk_method) != NULL &&
             memchr(g->quant_method, 0, sizeof g->quant_method) != NULL;
    for (int32_t l = 0; ok && l < g->num_moe_layers; l++)
        ok = g->moe_layer_index[l] >= 0 && g->moe_layer_index[l] < g->num_hidden_layers &&
             (l == 0 || g->moe_layer_index[l] > g->moe_layer_index[l - 1]);
    if (!ok) {
        fprintf(stderr, "fuzz_geometry: invariant broken for model_type %.64s\n",
                g->model_type);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);
int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    /* An exact-size copy: any read past `size` is an ASan report. */
    char *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    fmoe_model_geometry g;
    if (fmoe_geometry_parse(buf, size, &g) == 0) check(&g);
    char hex[65];
    int rc = fmoe_config_fingerprint(buf, size, hex);
    if (rc == 0 && strlen(hex) != 64) abort();
    free(buf);
    return 0;
}

#ifndef FMOE_LIBFUZZER
#include "fuzz_mutate.h"


static const char *const tokens[] = {"{", "}", "[", "]", ",", ":", "\"", "null", "true",
                                     "-1", "0", "1e308", "4294967296", "2.5", "\\u0000",
                                     "\"model_type\"", "\"llama4\"", "\"text_config\"", "{}"};
static fuzz_mutator mutator = {0x9e3779b97f4a7c15ull, tokens, sizeof tokens / sizeof tokens[0]};

static int replay_file(const char *path, int mutations) {
    size_t n;
    char *src = fuzz_read_fixture("fuzz_geometry", path, 1 << 20, &n);
    if (!src) return 1;
    fuzz_replay(&mutator, src, n, 1, mutations, LLVMFuzzerTestOneInput);
    free(src);
    return 0;
}

int fuzz_seeded_replay(void);
int fuzz_seeded_replay(void) {
    const char *fix = getenv("FMOE_FIXTURES");
    char dir[1024], path[2048];
    snprintf(dir, sizeof dir, "%s/configs", fix ? fix : "tests/fixtures");
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "fuzz_geometry: cannot open %s\n", dir);
        return 1;
    }
    int files = 0, bad = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s/config.json", dir, e->d_name);
        FILE *probe = fopen(path, "rb");
        if (!probe) continue;
        fclose(probe);
        bad |= replay_file(path, 3000);
        files++;
    }
    closedir(d);
    printf("fuzz_geometry: %d configs replayed with prefixes and 3000 mutations each\n", files);
    return bad || files == 0;
}
#endif
