/* options.c - table-driven option parsing and --help for cmd/ (see options.h). */
#include "options.h"

#include <ctype.h>
#include <string.h>

#include "cmd_common.h"
#include "outputs.h"

/* ------------------------------------------------------------------ parsing */

static int seen(const cmd_option *opt, void *base) {
    if (opt->seen_offset > 0) *(int *)((char *)base + opt->seen_offset) = 1;
    return 0;
}

/* "a, b or c" into buf. */
static const char *choice_list(const char *const *choices, char *buf, size_t cap) {
    size_t n = 0, len = 0;
    while (choices[n]) n++;
    buf[0] = '\0';
    for (size_t i = 0; i < n && len < cap; i++) {
        const char *sep = i == 0 ? "" : i + 1 == n ? " or " : ", ";
        int w = snprintf(buf + len, cap - len, "%s%s", sep, choices[i]);
        if (w < 0) break;
        len += (size_t)w;
    }
    return buf;
}

/* Stores `value` (NULL for a flag) into the row's target. @return 0 or CMD_EXIT_USAGE. */
static int apply(const char *cmd, const cmd_option *opt, void *base, const char *value) {
    void *t = cmd_opt_target(opt, base);
    char flag[128];
    snprintf(flag, sizeof flag, "--%s", opt->name);
    int rc = 0;
    switch (opt->kind) {
    case CMD_OPT_FLAG: *(int *)t = 1; break;
    case CMD_OPT_STRING: *(const char **)t = value; break;
    case CMD_OPT_STRINGS: {
        cmd_opt_strings *list = t;
        if (list->n == CMD_OPT_STRINGS_MAX)
            return cmd_usage_error(cmd, "%s is given more than %d times", flag,
                                   CMD_OPT_STRINGS_MAX);
        list->items[list->n++] = value;
        break;
    }
    case CMD_OPT_INT32: {
        int64_t v;
        rc = cmd_parse_i64(cmd, flag, value, opt->min, opt->max, &v);
        if (rc == 0) *(int32_t *)t = (int32_t)v;
        break;
    }
    case CMD_OPT_INT64: rc = cmd_parse_i64(cmd, flag, value, opt->min, opt->max, t); break;
    case CMD_OPT_DOUBLE: rc = cmd_parse_f64(cmd, flag, value, opt->fmin, opt->fmax, t); break;
    case CMD_OPT_ENUM: {
        for (int32_t i = 0; opt->choices[i]; i++)
            if (strcmp(opt->choices[i], value) == 0) {
                *(int32_t *)t = opt->choice_values ? opt->choice_values[i] : i;
                return seen(opt, base);
            }
        char names[256];
        return cmd_usage_error(cmd, "%s must be %s, got '%s'", flag,
                               choice_list(opt->choices, names, sizeof names), value);
    }
    case CMD_OPT_CALLBACK: rc = opt->handler(cmd, opt, base, value); break;
    }
    return rc ? rc : seen(opt, base);
}

/* The row named by a long option (exact, else an unambiguous prefix). *ambiguous is set
 * when several rows start with `name`. */
static const cmd_option *find_long(const cmd_option *opts, const char *name, size_t len,
                                   int *ambiguous) {
    const cmd_option *prefix = NULL;
    int matches = 0;
    *ambiguous = 0;
    for (const cmd_option *o = opts; o->name; o++) {
        if (strncmp(o->name, name, len) != 0) continue;
        if (o->name[len] == '\0') return o;
        prefix = o;
        matches++;
    }
    if (matches > 1) *ambiguous = 1;
    return matches == 1 ? prefix : NULL;
}

static const cmd_option *find_short(const cmd_option *opts, char c) {
    for (const cmd_option *o = opts; o->name; o++)
        if (o->short_name && o->short_name == c) return o;
    return NULL;
}

int cmd_options_parse(const cmd_spec *spec, void *base, int argc, char **argv, int *npos) {
    const char *cmd = spec->name;
    int n = 0, only_positional = 0;
    for (int i = 1; i < argc; i++) {
        char *arg = argv[i];
        if (only_positional || arg[0] != '-' || arg[1] == '\0') {
            if (spec->max_positional >= 0 && n >= spec->max_positional)
                return cmd_usage_error(cmd, "unexpected argument '%s'", arg);
            argv[1 + n++] = arg;
            continue;
        }
        if (strcmp(arg, "--") == 0) {
            only_positional = 1;
            continue;
        }
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            cmd_options_help(spec, stdout);
            return CMD_OPTIONS_HELP;
        }
        const cmd_option *opt;
        const char *value = NULL;
        int inline_value = 0;
        char shown[64]; /* the option as the user should read it in errors */
        if (arg[1] == '-') {
            const char *name = arg + 2;
            const char *eq = strchr(name, '=');
            const size_t len = eq ? (size_t)(eq - name) : strlen(name);
            int ambiguous;
            opt = find_long(spec->options, name, len, &ambiguous);
            if (!opt) {
                if (ambiguous)
                    return cmd_usage_error(cmd, "option '--%.*s' is ambiguous", (int)len, name);
                return cmd_usage_error(cmd, "unknown option '--%.*s'", (int)len, name);
            }
            snprintf(shown, sizeof shown, "--%s", opt->name);
            if (eq) {
                value = eq + 1;
                inline_value = 1;
            }
        } else {
            opt = find_short(spec->options, arg[1]);
            if (!opt) return cmd_usage_error(cmd, "unknown option '-%c'", arg[1]);
            snprintf(shown, sizeof shown, "-%c", arg[1]);
            if (arg[2] != '\0') {
                if (!opt->value_name)
                    return cmd_usage_error(cmd, "unknown option '%s'", arg);
                value = arg + 2;
                inline_value = 1;
            }
        }
        if (opt->value_name && !inline_value) {
            if (i + 1 >= argc) return cmd_usage_error(cmd, "option '%s' needs a value", shown);
            value = argv[++i];
        } else if (!opt->value_name && inline_value) {
            return cmd_usage_error(cmd, "option '%s' takes no value", shown);
        }
        int rc = apply(cmd, opt, base, value);
        if (rc) return rc;
    }
    if (npos) *npos = n;
    /* here, so that no command can leave an output unchecked */
    return cmd_check_outputs(spec, base, argv + 1, n);
}

/* ------------------------------------------------------------------ help */

enum { HELP_WIDTH = 84, HELP_MAX_COLUMN = 28 };

/* "-o, --output FILE" into buf; @return its length. */
static int left_part(const cmd_option *o, char *buf, size_t cap) {
    int n;
    if (o->short_name)
        n = snprintf(buf, cap, "-%c, --%s", o->short_name, o->name);
    else
        n = snprintf(buf, cap, "--%s", o->name);
    if (o->value_name && n >= 0 && (size_t)n < cap)
        n += snprintf(buf + n, cap - (size_t)n, " %s", o->value_name);
    return n;
}

/* Writes `text` from column `col` (the cursor is there), wrapped at HELP_WIDTH with
 * continuation lines indented to `indent`. */
static void wrap(FILE *out, const char *text, int col, int indent) {
    const char *p = text;
    int first = 1;
    while (*p) {
        while (*p == ' ') p++;
        size_t w = strcspn(p, " ");
        if (!first && col + 1 + (int)w > HELP_WIDTH) {
            fprintf(out, "\n%*s", indent, "");
            col = indent;
            first = 1;
        }
        if (!first) {
            fputc(' ', out);
            col++;
        }
        fwrite(p, 1, w, out);
        col += (int)w;
        p += w;
        first = 0;
    }
    fputc('\n', out);
}

static void help_row(FILE *out, const char *left, const char *help, int column) {
    int col = fprintf(out, "  %s", left);
    if (col + 2 > column) {
        fputs("  ", out);
        col += 2;
    } else {
        fprintf(out, "%*s", column - col, "");
        col = column;
    }
    wrap(out, help, col, column);
}

void cmd_options_help(const cmd_spec *spec, FILE *out) {
    const char *u = spec->usage;
    int first = 1;
    while (u && *u) {
        size_t len = strcspn(u, "\n");
        if (u[0] == ' ') /* a continuation of the line above */
            fprintf(out, "%.*s\n", (int)len, u);
        else
            fprintf(out, "%sfmoe %.*s\n", first ? "usage: " : "       ", (int)len, u);
        u += len + (u[len] == '\n');
        first = 0;
    }
    if (spec->description) fprintf(out, "\n%s", spec->description);
    int column = 0;
    char left[128], help[1024];
    for (const cmd_option *o = spec->options; o->name; o++) {
        int w = left_part(o, left, sizeof left) + 4;
        if (w <= HELP_MAX_COLUMN && w > column) column = w;
    }
    if (column < 16) column = 16;
    fprintf(out, "\noptions:\n");
    for (const cmd_option *o = spec->options; o->name; o++) {
        left_part(o, left, sizeof left);
        if (o->default_text)
            /* "(default 128)", "(default: all cores)" */
            snprintf(help, sizeof help, "%s (default%s %s)", o->help,
                     strchr(o->default_text, ' ') && !isdigit((unsigned char)o->default_text[0])
                         ? ":"
                         : "",
                     o->default_text);
        else
            snprintf(help, sizeof help, "%s", o->help);
        help_row(out, left, help, column);
    }
    help_row(out, "-h, --help", "show this help", column);
    if (spec->help_extra) spec->help_extra(out);
    if (spec->epilog) fprintf(out, "\n%s", spec->epilog);
}
