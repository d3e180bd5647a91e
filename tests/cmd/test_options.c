/*
 * test_options.c - the option tables of cmd/ (cmd/options.h): every option of every
 * command is documented in its generated --help and is parsed into its target; usage
 * errors have one phrasing each and exit status 2. Also: the harness refuses more tests
 * than it can hold.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include "backend_cli.h"
#include "cmd_common.h"
#include "fmoe/policy.h"
#include "harness.h"
#include "options.h"

static const cmd_spec *const specs[] = {
    &cmd_simulate_spec, &cmd_generate_spec, &cmd_record_spec,       &cmd_build_store_spec,
    &cmd_inspect_spec,  &cmd_trace_spec,    &cmd_trace_import_spec, &cmd_tokenize_spec,
    &cmd_calibrate_spec, &cmd_demo_spec, &cmd_compare_logs_spec, &cmd_serve_spec, &cmd_train_predictor_spec,
    &cmd_trace_recover_spec, &cmd_trace_merge_spec, &cmd_quantize_spec,
};
#define NUM_SPECS (sizeof specs / sizeof specs[0])

/* ------------------------------------------------------------------ helpers */

/* The --help text of a spec (malloc'd), with every run of white space (a wrapped line and
 * its indentation) made one space, so a wrapped phrase reads as written in the table. */
static char *help_text(const cmd_spec *spec) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    cmd_options_help(spec, f);
    fclose(f);
    size_t w = 0;
    for (size_t r = 0; r < len; r++) {
        const int space = buf[r] == ' ' || buf[r] == '\n';
        if (space && w > 0 && buf[w - 1] == ' ') continue;
        buf[w++] = space ? ' ' : buf[r];
    }
    buf[w] = '\0';
    return buf;
}

/* Runs cmd_options_parse with stderr captured into err (cap bytes). */
static int parse_capturing(const cmd_spec *spec, void *base, int argc, char **argv, int *npos,
                           char *err, size_t cap) {
    fflush(stderr);
    FILE *tmp = tmpfile();
    int saved = dup(STDERR_FILENO);
    if (!tmp || saved < 0) return -100;
    dup2(fileno(tmp), STDERR_FILENO);
    int rc = cmd_options_parse(spec, base, argc, argv, npos);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    rewind(tmp);
    size_t n = fread(err, 1, cap - 1, tmp);
    err[n] = '\0';
    fclose(tmp);
    return rc;
}

/* A fresh options struct for spec, with its defaults. */
static void *fresh(const cmd_spec *spec) {
    void *base = calloc(1, spec->size ? spec->size : 1);
    if (base && spec->init) spec->init(base);
    return base;
}

/* ------------------------------------------------------------------ every table */

TEST(every_option_is_documented) {
    for (size_t s = 0; s < NUM_SPECS; s++) {
        const cmd_spec *spec = specs[s];
        char *text = help_text(spec);
        ASSERT_TRUE(text != NULL);
        char usage[128];
        snprintf(usage, sizeof usage, "usage: fmoe %s", spec->name);
        if (strncmp(text, usage, strlen(usage)) != 0) {
            free(text);
            HARNESS_FAIL("%s: help does not start with '%s'", spec->name, usage);
        }
        for (const cmd_option *o = spec->options; o->name; o++) {
            char needle[160];
            if (!o->help || !o->help[0]) {
                free(text);
                HARNESS_FAIL("%s --%s: no help text", spec->name, o->name);
            }
            snprintf(needle, sizeof needle, "--%s%s%s", o->name, o->value_name ? " " : "",
                     o->value_name ? o->value_name : "");
            if (!strstr(text, needle)) {
                free(text);
                HARNESS_FAIL("%s: '%s' is not in --help", spec->name, needle);
            }
            if (o->short_name) {
                snprintf(needle, sizeof needle, "-%c, --%s", o->short_name, o->name);
                if (!strstr(text, needle)) {
                    free(text);
                    HARNESS_FAIL("%s: '%s' is not in --help", spec->name, needle);
                }
            }
            if (o->default_text) {
                char colon[160];
                snprintf(needle, sizeof needle, "(default %.100s)", o->default_text);
                snprintf(colon, sizeof colon, "(default: %.100s)", o->default_text);
                if (!strstr(text, needle) && !strstr(text, colon)) {
                    free(text);
                    HARNESS_FAIL("%s --%s: default '%s' is not in --help", spec->name, o->name,
                                 o->default_text);
                }
            }
        }
        ASSERT_CONTAINS(text, "-h, --help");
        free(text);
    }
}

/* An option whose help says which --policy-opt key it stands for ("... (--policy-opt
 * store_mode=M)") names the key that the policies' settings tables give that option
 * (fmoe_policy_setting.option): a key renamed in a policy's table cannot leave a help line
 * naming the old one, and the key is never the command's own choice. */
TEST(policy_opt_keys_in_help_are_the_tables) {
    int seen = 0;
    for (size_t s = 0; s < NUM_SPECS; s++)
        for (const cmd_option *o = specs[s]->options; o->name; o++) {
            const char *p = o->help ? strstr(o->help, "--policy-opt ") : NULL;
            if (!p) continue;
            p += strlen("--policy-opt ");
            const size_t n = strcspn(p, "=");
            const fmoe_policy_setting *row = fmoe_policy_setting_of_option(o->name);
            if (!row)
                HARNESS_FAIL("%s --%s: its help names --policy-opt, but no policy's table "
                             "gives option '%s'", specs[s]->name, o->name, o->name);
            if (strlen(row->name) != n || strncmp(row->name, p, n) != 0)
                HARNESS_FAIL("%s --%s: its help names key '%.*s', the tables '%s'",
                             specs[s]->name, o->name, (int)n, p, row->name);
            seen++;
        }
    ASSERT_TRUE(seen > 0); /* simulate's --eamc-capacity, --store-mode, --store-capacity */
}

TEST(names_are_unique) {
    for (size_t s = 0; s < NUM_SPECS; s++) {
        const cmd_spec *spec = specs[s];
        for (const cmd_option *a = spec->options; a->name; a++) {
            if (strcmp(a->name, "help") == 0 || a->short_name == 'h')
                HARNESS_FAIL("%s: --help/-h are built in", spec->name);
            for (const cmd_option *b = a + 1; b->name; b++) {
                if (strcmp(a->name, b->name) == 0)
                    HARNESS_FAIL("%s: --%s twice", spec->name, a->name);
                if (a->short_name && a->short_name == b->short_name)
                    HARNESS_FAIL("%s: -%c twice", spec->name, a->short_name);
            }
        }
    }
}

/* A valid value for a typed row, different from `current` where the range allows. */
static void valid_value(const cmd_option *o, const void *target, char *buf, size_t cap) {
    switch (o->kind) {
    case CMD_OPT_INT32:
    case CMD_OPT_INT64: {
        const int64_t now = o->kind == CMD_OPT_INT32 ? *(const int32_t *)target
                                                     : *(const int64_t *)target;
        int64_t v = o->min < o->max ? o->min + 1 : o->min;
        if (v == now) v = o->min;
        snprintf(buf, cap, "%lld", (long long)v);
        break;
    }
    case CMD_OPT_DOUBLE: {
        double v = o->fmin + (o->fmax - o->fmin) / 4;
        if (v == *(const double *)target) v = o->fmax;
        snprintf(buf, cap, "%.17g", v);
        break;
    }
    case CMD_OPT_ENUM: {
        int last = 0;
        while (o->choices[last + 1]) last++;
        snprintf(buf, cap, "%s", o->choices[last]);
        break;
    }
    case CMD_OPT_CALLBACK: snprintf(buf, cap, "%s", o->example ? o->example : ""); break;
    default: snprintf(buf, cap, "some-value"); break;
    }
}

/* Parses one option in `form` (0: --name VALUE, 1: --name=VALUE, 2: -x VALUE) and checks
 * what landed in its target. */
static int check_option(const cmd_spec *spec, const cmd_option *o, int form, char *why,
                        size_t cap) {
    void *base = fresh(spec), *before = fresh(spec);
    char value[128], flag[160], err[512];
    valid_value(o, cmd_opt_target(o, base), value, sizeof value);
    char *argv[4] = {(char *)spec->name};
    int argc = 1;
    if (form == 2) {
        snprintf(flag, sizeof flag, "-%c", o->short_name);
        argv[argc++] = flag;
        if (o->value_name) argv[argc++] = value;
    } else if (form == 1 && o->value_name) {
        snprintf(flag, sizeof flag, "--%s=%s", o->name, value);
        argv[argc++] = flag;
    } else {
        snprintf(flag, sizeof flag, "--%s", o->name);
        argv[argc++] = flag;
        if (o->value_name) argv[argc++] = value;
    }
    int npos = 0, ok = 1;
    int rc = parse_capturing(spec, base, argc, argv, &npos, err, sizeof err);
    void *t = cmd_opt_target(o, base);
    why[0] = '\0';
    if (rc != 0) {
        snprintf(why, cap, "parse returned %d: %s", rc, err);
        ok = 0;
    } else if (o->kind == CMD_OPT_CALLBACK && !o->example) {
        snprintf(why, cap, "a callback row needs .example");
        ok = 0;
    } else {
        const char *expect = form == 1 && o->value_name ? strchr(flag, '=') + 1 : value;
        switch (o->kind) {
        case CMD_OPT_FLAG: ok = *(int *)t == 1; break;
        case CMD_OPT_STRING: ok = *(const char **)t && strcmp(*(const char **)t, expect) == 0; break;
        case CMD_OPT_STRINGS: {
            const cmd_opt_strings *l = t;
            ok = l->n == 1 && strcmp(l->items[0], expect) == 0;
            break;
        }
        case CMD_OPT_INT32: ok = *(int32_t *)t == (int32_t)strtoll(expect, NULL, 10); break;
        case CMD_OPT_INT64: ok = *(int64_t *)t == (int64_t)strtoll(expect, NULL, 10); break;
        case CMD_OPT_DOUBLE: ok = *(double *)t == strtod(expect, NULL); break;
        case CMD_OPT_ENUM: {
            int last = 0;
            while (o->choices[last + 1]) last++;
            ok = *(int32_t *)t == (o->choice_values ? o->choice_values[last] : last);
            break;
        }
        case CMD_OPT_CALLBACK: ok = memcmp(base, before, spec->size) != 0; break;
        }
        if (!ok) snprintf(why, cap, "'%s' did not land in its target", expect);
        if (ok && o->seen_offset > 0 && *(int *)((char *)base + o->seen_offset) != 1) {
            snprintf(why, cap, "its 'given' field was not set");
            ok = 0;
        }
    }
    free(base);
    free(before);
    return ok;
}

TEST(every_option_parses_into_its_target) {
    int checked = 0;
    for (size_t s = 0; s < NUM_SPECS; s++) {
        const cmd_spec *spec = specs[s];
        for (const cmd_option *o = spec->options; o->name; o++) {
            char why[700];
            for (int form = 0; form < 3; form++) {
                if (form == 2 && !o->short_name) continue;
                if (!check_option(spec, o, form, why, sizeof why))
                    HARNESS_FAIL("%s --%s (form %d): %s", spec->name, o->name, form, why);
                checked++;
            }
        }
    }
    ASSERT_TRUE(checked > 100);
}

TEST(help_option_prints_help) {
    char *argv[] = {"demo", "--help", NULL};
    void *base = fresh(&cmd_demo_spec);
    char err[64];
    fflush(stdout);
    int saved = dup(STDOUT_FILENO), devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, STDOUT_FILENO);
    const int rc = parse_capturing(&cmd_demo_spec, base, 2, argv, NULL, err, sizeof err);
    fflush(stdout);
    dup2(saved, STDOUT_FILENO);
    close(saved);
    close(devnull);
    free(base);
    ASSERT_EQ(rc, CMD_OPTIONS_HELP);
}

/* ------------------------------------------------------------------ error phrasings */

typedef struct toy {
    int32_t n;
    double x;
    int32_t mode;
    int flag;
    const char *name;
} toy;

static const char *const toy_modes[] = {"fast", "slow", "auto", NULL};
static const cmd_option toy_options[] = {
    {.name = "count", .short_name = 'n', .kind = CMD_OPT_INT32, .value_name = "N",
     .help = "a count", .offset = offsetof(toy, n), .min = 1, .max = 8},
    {.name = "ratio", .kind = CMD_OPT_DOUBLE, .value_name = "X", .help = "a ratio",
     .offset = offsetof(toy, x), .fmin = 0, .fmax = 1},
    {.name = "mode", .kind = CMD_OPT_ENUM, .value_name = "M", .help = "a mode",
     .offset = offsetof(toy, mode), .choices = toy_modes},
    {.name = "flag", .kind = CMD_OPT_FLAG, .help = "a flag", .offset = offsetof(toy, flag)},
    {.name = "name", .kind = CMD_OPT_STRING, .value_name = "S", .help = "a name",
     .offset = offsetof(toy, name)},
    {.name = "name-prefix", .kind = CMD_OPT_STRING, .value_name = "S", .help = "another",
     .offset = offsetof(toy, name)},
    {0},
};
static const cmd_spec toy_spec = {
    .name = "toy", .usage = "toy [options] [FILE]", .options = toy_options,
    .max_positional = 1, .size = sizeof(toy),
};

/* Parses argv (NULL-terminated) into a toy; checks the exit status and stderr. */
#define EXPECT_ERROR(expected, ...)                                                     \
    do {                                                                                \
        char *argv_[] = {"toy", __VA_ARGS__, NULL};                                     \
        int argc_ = (int)(sizeof argv_ / sizeof argv_[0]) - 1;                          \
        toy t_ = {0};                                                                   \
        char err_[512];                                                                 \
        int npos_ = 0;                                                                  \
        ASSERT_EQ(parse_capturing(&toy_spec, &t_, argc_, argv_, &npos_, err_,           \
                                  sizeof err_),                                         \
                  CMD_EXIT_USAGE);                                                      \
        ASSERT_STR_EQ(err_, "fmoe toy: " expected " (see 'fmoe toy --help')\n");        \
    } while (0)

TEST(error_missing_value) {
    EXPECT_ERROR("option '--count' needs a value", "--count");
    EXPECT_ERROR("option '-n' needs a value", "-n");
    EXPECT_ERROR("option '--name' needs a value", "--flag", "--name");
}

TEST(error_unknown_option) {
    EXPECT_ERROR("unknown option '--bogus'", "--bogus");
    EXPECT_ERROR("unknown option '--bogus'", "--bogus=1");
    EXPECT_ERROR("unknown option '-z'", "-z");
    EXPECT_ERROR("option '--flag' takes no value", "--flag=1");
}

TEST(error_bad_number) {
    EXPECT_ERROR("value 'abc' of --count is not an integer", "--count", "abc");
    EXPECT_ERROR("value '3x' of --count is not an integer", "--count=3x");
    EXPECT_ERROR("value '' of --count is not an integer", "--count", "");
    EXPECT_ERROR("value 'half' of --ratio is not a number", "--ratio", "half");
}

TEST(error_out_of_range) {
    EXPECT_ERROR("--count must be in [1, 8], got 9", "--count", "9");
    EXPECT_ERROR("--count must be in [1, 8], got 0", "-n", "0");
    EXPECT_ERROR("--ratio must be in [0, 1], got 1.5", "--ratio", "1.5");
}

TEST(error_enum_and_arguments) {
    EXPECT_ERROR("--mode must be fast, slow or auto, got 'quick'", "--mode", "quick");
    EXPECT_ERROR("unexpected argument 'b'", "a", "b");
    EXPECT_ERROR("option '--na' is ambiguous", "--na", "x");
}

TEST(error_phrasing_of_a_real_command) {
    char *argv[] = {"simulate", "--trace", "t.h5", "--cache-experts", NULL};
    void *base = fresh(&cmd_simulate_spec);
    char err[512];
    ASSERT_EQ(parse_capturing(&cmd_simulate_spec, base, 4, argv, NULL, err, sizeof err),
              CMD_EXIT_USAGE);
    free(base);
    ASSERT_STR_EQ(err, "fmoe simulate: option '--cache-experts' needs a value (see 'fmoe "
                       "simulate --help')\n");
}

TEST(accepted_forms) {
    char *argv[] = {"toy", "FILE", "-n3", "--ratio=0.25", "--mode", "slow", "--fl",
                    "--name-p", "x", "--", NULL};
    toy t = {0};
    char err[256];
    int npos = 0;
    ASSERT_EQ(parse_capturing(&toy_spec, &t, 10, argv, &npos, err, sizeof err), 0);
    ASSERT_EQ(npos, 1);
    ASSERT_STR_EQ(argv[1], "FILE");
    ASSERT_EQ(t.n, 3);
    ASSERT_NEAR(t.x, 0.25, 0);
    ASSERT_EQ(t.mode, 1);
    ASSERT_EQ(t.flag, 1);
    ASSERT_STR_EQ(t.name, "x");
    /* a value may start with '-'; after "--" everything is positional */
    char *argv2[] = {"toy", "--name", "-n", "--", "--count", NULL};
    toy t2 = {0};
    ASSERT_EQ(parse_capturing(&toy_spec, &t2, 5, argv2, &npos, err, sizeof err), 0);
    ASSERT_STR_EQ(t2.name, "-n");
    ASSERT_EQ(npos, 1);
    ASSERT_STR_EQ(argv2[1], "--count");
}

/* ------------------------------------------------------------------ the harness itself */

/* --backend's device name, from fmoe_cuda_describe()'s text (runtime/cuda/cuda_backend.cu
 * and the loader's forms), for the backend line and recorded_on "cuda:<name>". */
TEST(cuda_device_name_from_describe) {
    char b[64];
    ASSERT_STR_EQ(cmd_cuda_device_name("CUDA runtime 13.0, 1 device (NVIDIA H100 80GB HBM3)",
                                       b, sizeof b),
                  "NVIDIA H100 80GB HBM3");
    ASSERT_STR_EQ(cmd_cuda_device_name("CUDA runtime 12.4, 2 devices (A (rev 2)) ", b, sizeof b),
                  "A (rev 2)");
    ASSERT_STR_EQ(cmd_cuda_device_name("CUDA runtime 13.0, 0 devices", b, sizeof b), "");
    ASSERT_STR_EQ(cmd_cuda_device_name("not compiled (built without CUDA", b, sizeof b), "");
    ASSERT_STR_EQ(cmd_cuda_device_name("x)", b, sizeof b), "");
    ASSERT_STR_EQ(cmd_cuda_device_name(NULL, b, sizeof b), "");
    ASSERT_STR_EQ(cmd_cuda_device_name("1 device (NVIDIA H100)", b, 5), "NVID");
    ASSERT_STR_EQ(cmd_backend_describe(FMOE_BACKEND_CPU, b, sizeof b), "cpu");
    ASSERT_STR_EQ(cmd_backend_recorded_on(FMOE_BACKEND_CPU, b, sizeof b), "cpu");
}

/* --activations: auto is resolved once, before anything is loaded, into what the run then
 * passes, prints and records; an explicit choice stays, q8 off the CPU is refused. */
TEST(activations_resolve) {
    const fmoe_backend_kind cpu = FMOE_BACKEND_CPU, cuda = FMOE_BACKEND_CUDA;
    int32_t a = FMOE_ACTIVATIONS_AUTO;
    ASSERT_EQ(cmd_activations_resolve("test", cpu, &a), 0);
    ASSERT_EQ(a, FMOE_ACTIVATIONS_Q8);
    a = FMOE_ACTIVATIONS_AUTO;
    ASSERT_EQ(cmd_activations_resolve("test", cuda, &a), 0);
    ASSERT_EQ(a, FMOE_ACTIVATIONS_F32);
    a = FMOE_ACTIVATIONS_F32;
    ASSERT_EQ(cmd_activations_resolve("test", cpu, &a), 0);
    ASSERT_EQ(a, FMOE_ACTIVATIONS_F32);
    a = FMOE_ACTIVATIONS_Q8;
    ASSERT_EQ(cmd_activations_resolve("test", cpu, &a), 0);
    ASSERT_EQ(a, FMOE_ACTIVATIONS_Q8);
    ASSERT_EQ(cmd_activations_resolve("test", cuda, &a), CMD_EXIT_USAGE); /* one line printed */
    ASSERT_STR_EQ(fmoe_activations_name(FMOE_ACTIVATIONS_AUTO), "auto");
    ASSERT_EQ(fmoe_activations_resolve(FMOE_ACTIVATIONS_Q8, cuda), FMOE_ACTIVATIONS_Q8);
    /* the option's names map to the enum's values, whatever their order in --help */
    for (int i = 0; cmd_activations_names[i]; i++)
        ASSERT_STR_EQ(fmoe_activations_name((fmoe_activations)cmd_activations_values[i]),
                      cmd_activations_names[i]);
}

static void dummy_test(int *failed) { (void)failed; }

TEST(harness_refuses_too_many_tests) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) dup2(devnull, STDERR_FILENO);
        for (int i = 0; i <= HARNESS_MAX_TESTS; i++) harness_register("extra", dummy_test);
        _exit(0); /* not reached: the registration past the limit exits 99 */
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    ASSERT_EQ(WEXITSTATUS(status), 99);
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
