/*
 * test_outputs.c - no command can be told to write over a file it reads. The option tables
 * say what each path option is (cmd_option.io); this walks every table, so a new option
 * cannot miss the check:
 *
 *   - every string option says whether it is an input, an output or text;
 *   - every output of every command, given the same file as each of the command's inputs
 *     (each input row and the positional argument), is refused by the parse with exit 2 and
 *     "output is an input", also when the input is a directory holding the output, when the
 *     output is another name (a hard link) of the input, when the input is a pattern
 *     matching the output, when the input is the output's .partial, and when the input is a
 *     shard of a split GGUF model and the output another shard of it (by name or a hard
 *     link); and the same output given a new file is accepted (the check is not a refusal
 *     of everything);
 *   - a model option left out stands for the bundled model ($FMOE_BUNDLED_MODEL here).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmd_common.h"
#include "harness.h"
#include "options.h"

static const cmd_spec *const specs[] = {
    &cmd_simulate_spec,     &cmd_generate_spec,       &cmd_record_spec,
    &cmd_build_store_spec,  &cmd_inspect_spec,        &cmd_trace_spec,
    &cmd_trace_import_spec, &cmd_trace_recover_spec,  &cmd_trace_merge_spec,
    &cmd_tokenize_spec,     &cmd_calibrate_spec,      &cmd_demo_spec,
    &cmd_compare_logs_spec, &cmd_serve_spec,          &cmd_train_predictor_spec,
    &cmd_quantize_spec,
};
#define NUM_SPECS (sizeof specs / sizeof specs[0])

static char dir[256]; /* a fresh folder for this run's files */

static void touch(const char *path) {
    FILE *f = fopen(path, "w");
    if (f) {
        fputs("x\n", f);
        fclose(f);
    }
}

/* cmd_options_parse of a fresh options struct with stderr captured into err. */
static int parse(const cmd_spec *spec, int argc, char **argv, char *err, size_t cap) {
    void *base = calloc(1, spec->size ? spec->size : 1);
    if (!base) return -100;
    if (spec->init) spec->init(base);
    fflush(stderr);
    FILE *tmp = tmpfile();
    int saved = dup(STDERR_FILENO);
    if (!tmp || saved < 0) return -100;
    dup2(fileno(tmp), STDERR_FILENO);
    int npos = 0;
    const int rc = cmd_options_parse(spec, base, argc, argv, &npos);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    rewind(tmp);
    const size_t n = fread(err, 1, cap - 1, tmp);
    err[n] = '\0';
    fclose(tmp);
    free(base);
    return rc;
}

static int is_output(const cmd_option *o) {
    return o->io == CMD_IO_OUTPUT || o->io == CMD_IO_OUTPUT_OF_PARTIAL;
}

/* Parses `spec --out OUT` with the input IN given as row `in` (NULL: the positional
 * argument). @return the exit status; err holds what it printed. */
static int run_pair(const cmd_spec *spec, const cmd_option *out, const char *out_value,
                    const cmd_option *in, const char *in_value, char *err, size_t cap) {
    char oflag[128], iflag[128];
    char *argv[6] = {(char *)spec->name};
    int argc = 1;
    if (in) {
        snprintf(iflag, sizeof iflag, "--%s", in->name);
        argv[argc++] = iflag;
    }
    argv[argc++] = (char *)in_value;
    snprintf(oflag, sizeof oflag, "--%s", out->name);
    argv[argc++] = oflag;
    argv[argc++] = (char *)out_value;
    return parse(spec, argc, argv, err, cap);
}

TEST(every_string_option_says_what_it_names) {
    int rows = 0;
    for (size_t s = 0; s < NUM_SPECS; s++)
        for (const cmd_option *o = specs[s]->options; o->name; o++) {
            const int stringy = o->kind == CMD_OPT_STRING || o->kind == CMD_OPT_STRINGS;
            if (stringy && o->io == CMD_IO_UNSET)
                HARNESS_FAIL("%s --%s: a string option needs .io (input, output or text)",
                             specs[s]->name, o->name);
            if (!stringy && o->io != CMD_IO_UNSET)
                HARNESS_FAIL("%s --%s: .io on an option whose value is not a string",
                             specs[s]->name, o->name);
            rows += stringy;
        }
    ASSERT_TRUE(rows > 40);
}

/* One output row against one input (a row, or the positional argument when in is NULL);
 * harness_failed: the running test's (harness.h). */
static void check_pair(int *harness_failed, const cmd_spec *spec, const cmd_option *out,
                       const cmd_option *in) {
    char err[1024], f[512], g[512], sub[512], partial[512];
    const char *name = in ? in->name : "(positional)";
    snprintf(f, sizeof f, "%s/in.dat", dir);
    touch(f);
    int rc = run_pair(spec, out, f, in, f, err, sizeof err);
    if (rc != CMD_EXIT_USAGE || !strstr(err, "output is an input"))
        HARNESS_FAIL("%s --%s over the input %s: exit %d, '%s'", spec->name, out->name, name,
                     rc, err);
    /* another name of the same file */
    snprintf(g, sizeof g, "%s/link.dat", dir);
    unlink(g);
    ASSERT_EQ(link(f, g), 0);
    rc = run_pair(spec, out, g, in, f, err, sizeof err);
    if (rc != CMD_EXIT_USAGE || !strstr(err, "output is an input"))
        HARNESS_FAIL("%s --%s over a hard link of the input %s: exit %d, '%s'", spec->name,
                     out->name, name, rc, err);
    /* a directory input (a model directory) stands for its files */
    snprintf(sub, sizeof sub, "%s/model", dir);
    mkdir(sub, 0777);
    snprintf(g, sizeof g, "%s/model/config.json", dir);
    touch(g);
    rc = run_pair(spec, out, g, in, sub, err, sizeof err);
    if (rc != CMD_EXIT_USAGE || !strstr(err, "output is an input"))
        HARNESS_FAIL("%s --%s over a file of the input folder %s: exit %d, '%s'", spec->name,
                     out->name, name, rc, err);
    /* a pattern stands for the files it matches (simulate --trace 'runs/run*.h5') */
    snprintf(g, sizeof g, "%s/model/*.json", dir);
    snprintf(sub, sizeof sub, "%s/model/config.json", dir);
    rc = run_pair(spec, out, sub, in, g, err, sizeof err);
    if (rc != CMD_EXIT_USAGE || !strstr(err, "output is an input"))
        HARNESS_FAIL("%s --%s over a file the input pattern %s matches: exit %d, '%s'",
                     spec->name, out->name, name, rc, err);
    /* a shard of a split GGUF model stands for every shard (the loader reads them all):
     * shard 2 by name, shard 3 by a hard link, and the shards of a model given by shard 2 */
    char s1[512], s2[512], s3[512];
    snprintf(s1, sizeof s1, "%s/m-00001-of-00003.gguf", dir);
    snprintf(s2, sizeof s2, "%s/m-00002-of-00003.gguf", dir);
    snprintf(s3, sizeof s3, "%s/m-00003-of-00003.gguf", dir);
    touch(s1), touch(s2), touch(s3);
    snprintf(g, sizeof g, "%s/shard3-link.gguf", dir);
    unlink(g);
    ASSERT_EQ(link(s3, g), 0);
    const char *const shard_cases[][2] = {{s1, s2}, {s1, g}, {s2, s1}, {s2, s3}};
    for (size_t k = 0; k < sizeof shard_cases / sizeof shard_cases[0]; k++) {
        rc = run_pair(spec, out, shard_cases[k][1], in, shard_cases[k][0], err, sizeof err);
        if (rc != CMD_EXIT_USAGE || !strstr(err, "output is an input"))
            HARNESS_FAIL("%s --%s over %s, a shard of the split model the input %s is a "
                         "shard of: exit %d, '%s'",
                         spec->name, out->name, shard_cases[k][1], name, rc, err);
    }
    /* ... but a file of another split, or a name that is not a shard's, is not an input */
    snprintf(g, sizeof g, "%s/m-00002-of-00004.gguf", dir);
    touch(g);
    rc = run_pair(spec, out, g, in, s1, err, sizeof err);
    if (rc != 0)
        HARNESS_FAIL("%s --%s to %s, a shard of another split than the input %s: exit %d, "
                     "'%s'",
                     spec->name, out->name, g, name, rc, err);
    unlink(g);
    unlink(s1), unlink(s2), unlink(s3);
    /* the writer replaces OUTPUT.partial: it must not be an input either */
    if (out->io == CMD_IO_OUTPUT) {
        snprintf(g, sizeof g, "%s/new.out", dir);
        snprintf(partial, sizeof partial, "%s/new.out.partial", dir);
        touch(partial);
        rc = run_pair(spec, out, g, in, partial, err, sizeof err);
        unlink(partial);
        if (rc != CMD_EXIT_USAGE || !strstr(err, "output is an input"))
            HARNESS_FAIL("%s --%s whose .partial is the input %s: exit %d, '%s'", spec->name,
                         out->name, name, rc, err);
    }
    /* and a new file is fine */
    snprintf(g, sizeof g, "%s/fresh.out", dir);
    rc = run_pair(spec, out, g, in, f, err, sizeof err);
    if (rc != 0)
        HARNESS_FAIL("%s --%s to a new file with the input %s: exit %d, '%s'", spec->name,
                     out->name, name, rc, err);
}

TEST(every_output_is_checked_against_every_input) {
    int pairs = 0, outputs = 0;
    for (size_t s = 0; s < NUM_SPECS; s++) {
        const cmd_spec *spec = specs[s];
        for (const cmd_option *out = spec->options; out->name; out++) {
            if (!is_output(out)) continue;
            outputs++;
            int inputs = 0;
            for (const cmd_option *in = spec->options; in->name; in++) {
                if (in->io != CMD_IO_INPUT && in->io != CMD_IO_MODEL) continue;
                check_pair(harness_failed, spec, out, in);
                inputs++;
            }
            if (spec->max_positional != 0) {
                check_pair(harness_failed, spec, out, NULL);
                inputs++;
            }
            /* an output with nothing to check it against would pass whatever it names */
            if (inputs == 0) HARNESS_FAIL("%s --%s: no input to check", spec->name, out->name);
            pairs += inputs;
        }
    }
    ASSERT_TRUE(outputs >= 20);
    ASSERT_TRUE(pairs > outputs);
}

TEST(a_model_left_out_is_the_bundled_model) {
    char model[512], config[600], err[1024];
    snprintf(model, sizeof model, "%s/bundled", dir);
    mkdir(model, 0777);
    snprintf(config, sizeof config, "%s/config.json", model);
    touch(config);
    setenv("FMOE_BUNDLED_MODEL", model, 1);
    int checked = 0;
    for (size_t s = 0; s < NUM_SPECS; s++) {
        const cmd_option *m = NULL;
        for (const cmd_option *o = specs[s]->options; o->name; o++)
            if (o->io == CMD_IO_MODEL) m = o;
        if (!m) continue;
        for (const cmd_option *out = specs[s]->options; out->name; out++) {
            if (!is_output(out)) continue;
            char flag[128];
            snprintf(flag, sizeof flag, "--%s", out->name);
            char *argv[] = {(char *)specs[s]->name, flag, config};
            const int rc = parse(specs[s], 3, argv, err, sizeof err);
            if (rc != CMD_EXIT_USAGE || !strstr(err, "output is an input"))
                HARNESS_FAIL("%s --%s over the bundled model's config.json: exit %d, '%s'",
                             specs[s]->name, out->name, rc, err);
            checked++;
        }
    }
    unsetenv("FMOE_BUNDLED_MODEL");
    ASSERT_TRUE(checked >= 3); /* generate, record, serve */
}

int main(int argc, char **argv) {
    snprintf(dir, sizeof dir, "%s/fmoe-test-outputs-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    const int rc = RUN_TESTS(argc, argv);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return rc;
}
