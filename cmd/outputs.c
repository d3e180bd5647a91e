/* outputs.c - outputs checked against inputs, once, for every command (see outputs.h). */
#include "outputs.h"

#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmd_common.h"
#include "fmoe/error.h"
#include "fmoe/gguf.h"
#include "files.h"
#include "paths.h"

static int same_file(const struct stat *a, const struct stat *b) {
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

/* 1 when `out` is the file `input` (for a shard of a split GGUF model, any of its shards)
 * or, for a directory input, a file directly in it; an input that names no file but is a
 * pattern (simulate --trace 'runs/run*.h5') stands for each file it matches. */
static int is_input(const struct stat *out, const char *input) {
    struct stat in;
    if (stat(input, &in) != 0) {
        glob_t g = {0};
        int found = 0;
        if (strpbrk(input, "*?[") && glob(input, 0, NULL, &g) == 0)
            for (size_t i = 0; !found && i < g.gl_pathc; i++)
                found = stat(g.gl_pathv[i], &in) == 0 && is_input(out, g.gl_pathv[i]);
        globfree(&g);
        return found;
    }
    if (same_file(out, &in)) return 1;
    if (!S_ISDIR(in.st_mode)) {
        /* a shard of a split GGUF model (PREFIX-00001-of-00003.gguf): the model is read
         * from every shard, which fmoe_gguf_open finds by this name */
        char shard[PATH_MAX];
        for (int32_t i = 0, n = 1; i < n; i++) {
            n = fmoe_gguf_split_path(input, i, shard, sizeof shard);
            if (n > 0 && stat(shard, &in) == 0 && same_file(out, &in)) return 1;
        }
        return 0;
    }
    DIR *d = opendir(input);
    if (!d) return 0;
    int found = 0;
    char p[PATH_MAX];
    for (struct dirent *e; !found && (e = readdir(d));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        if (snprintf(p, sizeof p, "%s/%s", input, e->d_name) >= (int)sizeof p) continue;
        found = stat(p, &in) == 0 && !S_ISDIR(in.st_mode) && same_file(out, &in);
    }
    closedir(d);
    return found;
}

/* cmd_check_output; with_partial 0: OUTPUT.partial is not the writer's, and may be read. */
static int check_output(const char *cmd, const char *output, const char *const *inputs,
                        int ninputs, int with_partial) {
    if (!output || strcmp(output, "-") == 0) return 0;
    char partial[PATH_MAX + 16];
    snprintf(partial, sizeof partial, "%s.partial", output);
    const char *mine[2] = {output, partial};
    for (int k = 0; k < 1 + with_partial; k++) {
        struct stat st;
        if (stat(mine[k], &st) != 0) continue;
        for (int i = 0; i < ninputs; i++)
            if (inputs[i] && is_input(&st, inputs[i]))
                return cmd_refuse(cmd, "output is an input (%s)", output);
    }
    if (fmoe__output_check(output) < 0) return cmd_refuse(cmd, "%s", fmoe_error_detail());
    /* The folder it goes in, now: the write comes after the work (a sweep, a training),
     * and a missing folder found then costs all of it. */
    char dir[PATH_MAX];
    const char *slash = strrchr(output, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else
        snprintf(dir, sizeof dir, "%.*s", slash == output ? 1 : (int)(slash - output), output);
    struct stat st;
    const char *why = stat(dir, &st) != 0 ? strerror(errno)
                      : !S_ISDIR(st.st_mode) ? strerror(ENOTDIR)
                      : access(dir, W_OK | X_OK) != 0 ? strerror(errno)
                                                       : NULL;
    if (why) return cmd_failf(cmd, "%s: cannot create: %s", output, why);
    return 0;
}

int cmd_check_output(const char *cmd, const char *output, const char *const *inputs,
                     int ninputs) {
    return check_output(cmd, output, inputs, ninputs, 1);
}

/* The string values of a row (one for CMD_OPT_STRING, the list for CMD_OPT_STRINGS). */
static int row_values(const cmd_option *o, const void *base, const char *const **v) {
    const void *t = (const char *)base + o->offset;
    if (o->kind == CMD_OPT_STRING) {
        *v = (const char *const *)t;
        return *(const char *const *)t ? 1 : 0;
    }
    if (o->kind == CMD_OPT_STRINGS) {
        const cmd_opt_strings *l = t;
        *v = l->items;
        return l->n;
    }
    return 0;
}

int cmd_check_outputs(const cmd_spec *spec, const void *base, char *const *positional,
                      int npos) {
    if (!base || !spec->options) return 0;
    int cap = npos, n = 0, rc = 0;
    for (const cmd_option *o = spec->options; o->name; o++)
        if (o->io == CMD_IO_INPUT || o->io == CMD_IO_MODEL)
            cap += o->kind == CMD_OPT_STRINGS ? CMD_OPT_STRINGS_MAX : 1;
    const char **inputs = malloc((size_t)(cap ? cap : 1) * sizeof *inputs);
    if (!inputs) return cmd_failf(spec->name, "out of memory");
    for (int i = 0; i < npos; i++) inputs[n++] = positional[i];
    for (const cmd_option *o = spec->options; o->name; o++) {
        if (o->io != CMD_IO_INPUT && o->io != CMD_IO_MODEL) continue;
        const char *const *v;
        const int k = row_values(o, base, &v);
        for (int i = 0; i < k; i++) inputs[n++] = v[i];
        /* the model a command loads when none is given (generate, record, serve) */
        if (k == 0 && o->io == CMD_IO_MODEL) inputs[n++] = cmd_bundled_model_dir();
    }
    for (const cmd_option *o = spec->options; o->name && rc == 0; o++) {
        if (o->io != CMD_IO_OUTPUT && o->io != CMD_IO_OUTPUT_OF_PARTIAL) continue;
        const char *const *v;
        const int k = row_values(o, base, &v);
        for (int i = 0; i < k && rc == 0; i++)
            rc = check_output(spec->name, v[i], inputs, n, o->io == CMD_IO_OUTPUT);
    }
    free(inputs);
    return rc;
}
