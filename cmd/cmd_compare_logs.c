/*
 * cmd_compare_logs.c - `fmoe compare-logs A B`: are two decision logs (fmoe/decision_log.h)
 * the same decisions? The check that the simulator and the live executor decide alike on
 * one trace (a differential test: docs/TESTING.md).
 *
 * Like cmp(1), the exit status is the answer: 0 identical, 1 different, 2 the question
 * could not be asked (a usage error, a file missing or not a decision log).
 *
 * defaults -> parse -> validate -> compare (library) -> report.
 */
#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdlib.h>

#include "cmd_common.h"
#include "fmoe/decision_log.h"
#include "fmoe/error.h"

static const char *const CMD = "compare-logs";

/* The event names of the totals, by fmoe_decision_kind (the log's own names). */
static const char *const kind_names[8] = {
    "access", "prefetch", "dropped", "cancel", "evict", "host", "promote", "landed",
};

typedef struct compare_logs_opts {
    int late_is_hit, json, quiet;
} compare_logs_opts;

#define OPT(field) offsetof(compare_logs_opts, field)
static const cmd_option compare_logs_options[] = {
    {.name = "late-is-hit", .kind = CMD_OPT_FLAG,
     .help = "count an access that waited for its prefetch (\"late\") as a \"hit\"",
     .offset = OPT(late_is_hit)},
    {.name = "json", .kind = CMD_OPT_FLAG, .help = "print one JSON document instead of text",
     .offset = OPT(json)},
    {.name = "quiet", .short_name = 'q', .kind = CMD_OPT_FLAG,
     .help = "print nothing: the exit status is the answer", .offset = OPT(quiet)},
    {0},
};
#undef OPT

const cmd_spec cmd_compare_logs_spec = {
    .name = "compare-logs",
    .usage = "compare-logs A.jsonl B.jsonl [--late-is-hit] [--json] [--quiet]",
    .description =
        "Compare two decision logs (JSON Lines, written by simulate, generate or record)\n"
        "decision by decision: every event but 'landed', on kind, iteration, layer,\n"
        "expert, slot, victim, result and priority; times are ignored. Prints the first\n"
        "divergence and both logs' totals.\n",
    .options = compare_logs_options,
    .epilog = "Exit status: 0 identical, 1 different, 2 usage error or unreadable or\n"
              "malformed log.\n",
    .max_positional = -1, /* exactly two, checked below with its own message */
    .size = sizeof(compare_logs_opts),
};

/* ------------------------------------------------------------------ text */

static void print_totals_row(const char *name, int64_t a, int64_t b) {
    printf("  %-10s %14lld %14lld%s\n", name, (long long)a, (long long)b, a != b ? "  *" : "");
}

static void print_text(const char *path_a, const char *path_b, int late_is_hit,
                       const fmoe_decision_log_diff *d) {
    printf("A: %s\nB: %s\n", path_a, path_b);
    const int64_t compared = d->ta.lines - d->ta.by_kind[FMOE_DECISION_LANDED];
    if (d->identical) {
        printf("identical: %lld decisions%s\n", (long long)compared,
               late_is_hit ? " (late counted as hit)" : "");
    } else {
        printf("first divergence at decision %lld (0-based; landed lines not counted)\n",
               (long long)d->index);
        if (d->line_a) printf("  A line %lld: %s\n", (long long)d->line_a, d->a);
        else printf("  A ended\n");
        if (d->line_b) printf("  B line %lld: %s\n", (long long)d->line_b, d->b);
        else printf("  B ended\n");
    }
    printf("\ntotals (* where they differ)\n  %-10s %14s %14s\n", "", "A", "B");
    print_totals_row("lines", d->ta.lines, d->tb.lines);
    for (int k = 0; k < 8; k++) print_totals_row(kind_names[k], d->ta.by_kind[k], d->tb.by_kind[k]);
    print_totals_row("hits", d->ta.hits, d->tb.hits);
    print_totals_row("late", d->ta.late, d->tb.late);
    print_totals_row("misses", d->ta.misses, d->tb.misses);
}

/* ------------------------------------------------------------------ JSON */

static cJSON *totals_json(const fmoe_decision_log_totals *t) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddNumberToObject(o, "lines", (double)t->lines);
    for (int k = 0; k < 8; k++) cJSON_AddNumberToObject(o, kind_names[k], (double)t->by_kind[k]);
    cJSON_AddNumberToObject(o, "hits", (double)t->hits);
    cJSON_AddNumberToObject(o, "late", (double)t->late);
    cJSON_AddNumberToObject(o, "misses", (double)t->misses);
    return o;
}

static int print_json(const fmoe_decision_log_diff *d) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return -1;
    cJSON_AddBoolToObject(o, "identical", d->identical);
    if (d->identical) {
        cJSON_AddNullToObject(o, "first_divergence");
    } else {
        cJSON *f = cJSON_AddObjectToObject(o, "first_divergence");
        cJSON_AddNumberToObject(f, "index", (double)d->index);
        cJSON_AddNumberToObject(f, "line_a", (double)d->line_a);
        cJSON_AddNumberToObject(f, "line_b", (double)d->line_b);
        cJSON_AddStringToObject(f, "a", d->a);
        cJSON_AddStringToObject(f, "b", d->b);
    }
    cJSON *totals = cJSON_AddObjectToObject(o, "totals");
    cJSON_AddItemToObject(totals, "a", totals_json(&d->ta));
    cJSON_AddItemToObject(totals, "b", totals_json(&d->tb));
    return cmd_print_json(o);
}

/* ------------------------------------------------------------------ the command */

int cmd_compare_logs(int argc, char **argv) {
    compare_logs_opts o = {0};
    int npos = 0;
    int rc = cmd_options_parse(&cmd_compare_logs_spec, &o, argc, argv, &npos);
    if (rc) return rc == CMD_OPTIONS_HELP ? CMD_EXIT_OK : rc;
    if (npos != 2)
        return cmd_usage_error(CMD, "expected two decision logs A and B, got %d argument%s",
                               npos, npos == 1 ? "" : "s");
    if (o.json && o.quiet) return cmd_usage_error(CMD, "--json and --quiet exclude each other");

    fmoe_decision_log_diff *d = malloc(sizeof *d);
    if (!d) {
        cmd_failf(CMD, "out of memory");
        return CMD_EXIT_USAGE;
    }
    rc = fmoe_decision_log_compare(argv[1], argv[2], o.late_is_hit, d);
    if (rc < 0) {
        /* Bad input is 2, not the runtime failure's 1: 1 already means "different". */
        cmd_fail(CMD, rc);
        free(d);
        return CMD_EXIT_USAGE;
    }
    int status = d->identical ? CMD_EXIT_OK : CMD_EXIT_FAILURE;
    if (o.json && print_json(d) < 0) {
        cmd_failf(CMD, "out of memory");
        status = CMD_EXIT_USAGE;
    } else if (!o.json && !o.quiet) {
        print_text(argv[1], argv[2], o.late_is_hit, d);
    }
    free(d);
    return status;
}
