/*
 * test_docs_options.c - the command pages (docs/cmd/fmoe-<command>.md) agree with the option
 * tables (cmd/options.h), so a page cannot drift from what the command parses:
 *
 *   - every command spec has a page: fmoe-<first word of its name>.md ("trace import" is in
 *     fmoe-trace.md);
 *   - the page has the spec's Options section: a heading "Options" for the page's own
 *     command, "Options of fmoe trace import" for a subcommand;
 *   - every row of the table appears there as a list item that opens with the option in
 *     backticks ("- `--cache-experts N` — ..."; "- `-o`, `--output FILE` — ..." when the
 *     row has a short name, which the item must then show too);
 *   - every option such an item names is a row of the table (or the built-in --help), and
 *     no option is listed twice.
 *
 * Usage: test_docs_options DOCS_CMD_DIR [name-filter]. meson passes the source tree's
 * docs/cmd; without the argument, $FMOE_SOURCE_ROOT/docs/cmd.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_cli.h"
#include "cmd_common.h"
#include "files.h"
#include "harness.h"
#include "options.h"

static const cmd_spec *const specs[] = {
    &cmd_simulate_spec,       &cmd_generate_spec,      &cmd_record_spec,
    &cmd_build_store_spec,    &cmd_inspect_spec,       &cmd_trace_spec,
    &cmd_trace_import_spec,   &cmd_trace_recover_spec, &cmd_trace_merge_spec,
    &cmd_tokenize_spec,
    &cmd_calibrate_spec,      &cmd_demo_spec,          &cmd_compare_logs_spec,
    &cmd_serve_spec,          &cmd_train_predictor_spec, &cmd_quantize_spec,
};
#define NUM_SPECS (sizeof specs / sizeof specs[0])

/* Commands of cmd/main.c without an exported spec (no options of their own): they still
 * need a page. */
static const char *const optionless_commands[] = {"version", "help"};

static const char *docs_dir;

/* ------------------------------------------------------------------ reading a page */

/* The file's bytes, NUL-terminated (malloc'd), or NULL when it cannot be read. */
static char *read_file(const char *path) {
    char *text = NULL;
    size_t len = 0;
    if (fmoe__read_file_bounded(path, "a command page", (long long)16 << 20, 0, &text, &len) < 0)
        return NULL;
    return text;
}

/* A Markdown heading line outside code fences: its level (number of '#'), else 0; *text
 * and *text_len give the heading's text without the marks and trailing blanks. */
static int heading_level(const char *line, size_t len, const char **text, size_t *text_len) {
    size_t level = 0;
    while (level < len && line[level] == '#') level++;
    if (level == 0 || level > 6 || level >= len || line[level] != ' ') return 0;
    const char *t = line + level + 1;
    size_t n = len - level - 1;
    while (n > 0 && isspace((unsigned char)t[n - 1])) n--;
    *text = t;
    *text_len = n;
    return (int)level;
}

/* The options one section lists. */
typedef struct listed {
    char name[64];  /* the long name, without "--" */
    char short_name; /* the item's -x, or 0 */
    int line;       /* in the page */
} listed;

enum { MAX_LISTED = 128 };

typedef struct section {
    int found, line;          /* the heading's line */
    listed items[MAX_LISTED];
    int n;
    int problems;             /* items that do not open with options in backticks */
} section;

/* Reads one list item's leading backtick spans ("`-o`, `--output FILE` — ...") into *it.
 * @return 1 when the item opens with exactly one long option, else 0. */
static int parse_item(const char *p, const char *end, listed *it) {
    memset(it, 0, sizeof *it);
    int got_long = 0;
    for (;;) {
        if (p >= end || *p != '`') break;
        const char *close = memchr(p + 1, '`', (size_t)(end - p - 1));
        if (!close) break;
        const char *s = p + 1;
        if (close - s >= 3 && s[0] == '-' && s[1] == '-') {
            size_t n = 0;
            s += 2;
            while (s + n < close && (isalnum((unsigned char)s[n]) || s[n] == '-')) n++;
            if (n == 0 || n >= sizeof it->name || got_long) return 0; /* one long name an item */
            memcpy(it->name, s, n);
            it->name[n] = '\0';
            got_long = 1;
        } else if (close - s == 2 && s[0] == '-' && isalnum((unsigned char)s[1])) {
            it->short_name = s[1];
        } else {
            break;
        }
        p = close + 1;
        if (p + 2 <= end && p[0] == ',' && p[1] == ' ') p += 2; /* another span follows */
        else break;
    }
    return got_long;
}

/* Finds the section headed `title` in page and collects its top-level list items. */
static void read_section(const char *page, const char *title, section *sec) {
    memset(sec, 0, sizeof *sec);
    int in_fence = 0, level = 0, lineno = 0;
    for (const char *p = page; *p;) {
        const char *nl = strchr(p, '\n');
        const char *end = nl ? nl : p + strlen(p);
        const size_t len = (size_t)(end - p);
        lineno++;
        if (len >= 3 && (strncmp(p, "```", 3) == 0 || strncmp(p, "~~~", 3) == 0)) {
            in_fence = !in_fence;
        } else if (!in_fence) {
            const char *text;
            size_t text_len;
            const int h = heading_level(p, len, &text, &text_len);
            if (h && level && h <= level) break; /* the section ended */
            if (h && !level && text_len == strlen(title) && !memcmp(text, title, text_len)) {
                level = h;
                sec->found = 1;
                sec->line = lineno;
            } else if (level && len >= 2 && p[0] == '-' && p[1] == ' ') {
                listed it;
                if (parse_item(p + 2, end, &it) && sec->n < MAX_LISTED) {
                    it.line = lineno;
                    sec->items[sec->n++] = it;
                } else {
                    fprintf(stderr, "  line %d: a list item of '%s' that does not open with "
                                    "one long option in backticks: %.*s\n",
                            lineno, title, (int)(len > 80 ? 80 : len), p);
                    sec->problems++;
                }
            }
        }
        p = nl ? nl + 1 : end;
    }
}

/* The page of a command ("trace import" -> fmoe-trace.md), its path in buf. */
static const char *page_path(const char *command, char *buf, size_t cap) {
    const size_t word = strcspn(command, " ");
    snprintf(buf, cap, "%s/fmoe-%.*s.md", docs_dir, (int)word, command);
    return buf;
}

/* ------------------------------------------------------------------ the checks */

/* Every difference between spec's table and its section of the page, one line each on
 * stderr. @return how many. */
static int check_spec(const cmd_spec *spec) {
    char path[4096], title[160];
    page_path(spec->name, path, sizeof path);
    if (strchr(spec->name, ' ')) snprintf(title, sizeof title, "Options of fmoe %s", spec->name);
    else snprintf(title, sizeof title, "Options");
    char *page = read_file(path);
    if (!page) {
        fprintf(stderr, "%s: cannot read the page of 'fmoe %s'\n", path, spec->name);
        return 1;
    }
    static section sec;
    read_section(page, title, &sec);
    free(page);
    if (!sec.found) {
        fprintf(stderr, "%s: no '%s' heading for 'fmoe %s'\n", path, title, spec->name);
        return 1;
    }
    int bad = sec.problems;
    if (sec.problems)
        fprintf(stderr, "%s: %d list item(s) of '%s' name no option (above)\n", path,
                sec.problems, title);
    /* table -> page */
    for (const cmd_option *o = spec->options; o->name; o++) {
        const listed *hit = NULL;
        for (int i = 0; i < sec.n && !hit; i++)
            if (!strcmp(sec.items[i].name, o->name)) hit = &sec.items[i];
        if (!hit) {
            fprintf(stderr, "%s: option --%s of 'fmoe %s' is not listed in its '%s' section\n",
                    path, o->name, spec->name, title);
            bad++;
        } else if (hit->short_name != o->short_name) {
            fprintf(stderr, "%s:%d: --%s of 'fmoe %s': the page shows short name '%c', the "
                            "table '%c' (0: none)\n",
                    path, hit->line, o->name, spec->name, hit->short_name ? hit->short_name : '0',
                    o->short_name ? o->short_name : '0');
            bad++;
        }
    }
    /* page -> table */
    for (int i = 0; i < sec.n; i++) {
        const listed *it = &sec.items[i];
        int known = !strcmp(it->name, "help"); /* built into every command */
        for (const cmd_option *o = spec->options; o->name && !known; o++)
            known = !strcmp(o->name, it->name);
        if (!known) {
            fprintf(stderr, "%s:%d: '%s' lists --%s, which 'fmoe %s' does not have\n", path,
                    it->line, title, it->name, spec->name);
            bad++;
        }
        for (int j = 0; j < i; j++)
            if (!strcmp(sec.items[j].name, it->name)) {
                fprintf(stderr, "%s:%d: --%s is listed twice in '%s' (first at line %d)\n", path,
                        it->line, it->name, title, sec.items[j].line);
                bad++;
            }
    }
    return bad;
}

TEST(every_option_table_matches_its_page) {
    int bad = 0;
    for (size_t s = 0; s < NUM_SPECS; s++) bad += check_spec(specs[s]);
    if (bad) HARNESS_FAIL("%d difference(s) between the option tables and docs/cmd (above)", bad);
}

TEST(every_command_has_a_page) {
    char path[4096];
    for (size_t i = 0; i < sizeof optionless_commands / sizeof *optionless_commands; i++) {
        char *page = read_file(page_path(optionless_commands[i], path, sizeof path));
        if (!page) HARNESS_FAIL("%s: cannot read the page of 'fmoe %s'", path,
                                optionless_commands[i]);
        free(page);
    }
}

/* The checker itself: a page missing a row, or listing one the table lacks, is caught. */
TEST(the_checker_finds_a_missing_and_an_unknown_option) {
    static const char page[] = "# fmoe x\n"
                               "## Options\n"
                               "- `-o`, `--output FILE` — where\n"
                               "  - a nested note, not an option\n"
                               "- `--bogus` — not in the table\n"
                               "```\n"
                               "## Options\n"
                               "- `--inside-a-fence`\n"
                               "```\n"
                               "## Exit status\n"
                               "- `--after` the section\n";
    static section sec;
    read_section(page, "Options", &sec);
    ASSERT_TRUE(sec.found);
    ASSERT_EQ(sec.n, 2);
    ASSERT_EQ(sec.problems, 0);
    ASSERT_STR_EQ(sec.items[0].name, "output");
    ASSERT_EQ(sec.items[0].short_name, 'o');
    ASSERT_STR_EQ(sec.items[1].name, "bogus");
    ASSERT_EQ(sec.items[1].short_name, 0);
}

int main(int argc, char **argv) {
    static char fallback[4096];
    if (argc > 1) {
        docs_dir = argv[1];
        argc--, argv++; /* a name filter, if any, follows */
    } else {
        const char *root = getenv("FMOE_SOURCE_ROOT");
        snprintf(fallback, sizeof fallback, "%s/docs/cmd", root ? root : ".");
        docs_dir = fallback;
    }
    return RUN_TESTS(argc, argv);
}
