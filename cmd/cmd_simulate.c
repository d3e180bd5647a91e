/*
 * cmd_simulate.c - `fmoe simulate`: replay a trace through expert-cache policies on a
 * hardware model and report hits, bytes moved, stall time and latency (docs/design.md §7).
 *
 * defaults -> parse -> validate -> per trace and hardware profile (a unit): read the trace
 * (with the gate data the chosen policies need) and list its cells -> sweep (policies x
 * cache sizes x prefetch distances of every unit, in parallel threads; over MPI ranks when
 * launched by mpirun/srun, rank 0 handing out cells; every finished cell to --sweep-out as
 * it finishes, which --resume reads back) -> print a table per unit (best first), JSON or
 * CSV, in grid order whichever rank ran which cell (docs/scaling-out.md).
 */
#include <cjson/cJSON.h>
#include <glob.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <errno.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>

#include "cmd_common.h"
#include "plot_svg.h"
#include "paths.h"
#include "simulate_store.h" /* the fmoe policies' expert-map store */
#include "policy_opts.h"    /* --policy-opt and its shorthands */
#include "sweep.h"          /* --sweep-out, --resume, MPI ranks */
#include "fmoe/datasets.h"
#include "fmoe/decision_log.h"
#include "fmoe/error.h"
#include "files.h"
#include "sha256.h"
#include "fmoe/geometry.h"
#include "fmoe/gguf.h"
#include "fmoe/hardware.h"
#include "fmoe/policy.h"
#include "fmoe/predictor.h"
#include "fmoe/sim.h"
#include "fmoe/trace.h"
#include "simulate_impl.h"

static const char *const CMD = SIM_CMD;

int sim_notes_off;

int cmd_simulate(int argc, char **argv);

/* ------------------------------------------------------------------ the sweep as a job */

typedef struct sim_job {
    const sim_unit *units;
    const size_t *cell_unit;      /* [n] */
    const fmoe_sim_config *cells; /* [n] */
    fmoe_sim_result *results;     /* [n] rank 0 */
    cmd_sweep_file *file;         /* --sweep-out, rank 0 */
    const char *file_path;
} sim_job;

static cmd_sweep_key cell_key(const sim_job *j, size_t i) {
    const sim_unit *u = &j->units[j->cell_unit[i]];
    return (cmd_sweep_key){u->trace, u->hw_key, j->cells[i].policy, j->cells[i].cache_experts,
                           j->cells[i].prefetch_distance, u->trace_id};
}

static char *run_cell(void *ctx, size_t i, int *rc) {
    const sim_job *j = ctx;
    fmoe_sim_result r;
    const double t0 = cmd_now();
    *rc = fmoe_sim_run(&j->units[j->cell_unit[i]].w, &j->cells[i], &r);
    if (*rc < 0) return NULL;
    const cmd_sweep_key k = cell_key(j, i);
    char *line = cmd_sweep_line(&k, &r, cmd_now() - t0);
    fmoe_sim_result_free(&r);
    if (!line) *rc = fmoe_error_set(FMOE_ENOMEM, "the result line of a cell");
    return line;
}

/* Rank 0: the line to the result file, then into results[i] as read back (what every rank's
 * cells give, so the output does not depend on where a cell ran). */
static int cell_done(void *ctx, size_t i, const char *line) {
    sim_job *j = ctx;
    if (j->file && cmd_sweep_file_append(j->file, line) < 0)
        return fmoe_error_set(FMOE_EIO, "%s: cannot write: %s", j->file_path, strerror(errno));
    fmoe__fault_point("sweep-cell"); /* tests: a kill after the Nth line */
    char key[8192];
    fmoe_sim_result r;
    if (cmd_sweep_line_parse(line, key, sizeof key, &r) < 0)
        return fmoe_error_set(FMOE_EINTERNAL, "cell %zu: its result line does not read back", i);
    fmoe_sim_result_free(&j->results[i]);
    j->results[i] = r;
    return 0;
}

/* Progress of an MPI sweep whose stderr is not a terminal (mpirun forwards it through a
 * pipe; a cluster job's log): a line at most every 10 s, with the ETA. */
typedef struct line_progress {
    double started, last;
    int64_t first; /* cells done at the start (resumed) */
} line_progress;

static void progress_line(void *ctx, int64_t done, int64_t total, const char *unit) {
    line_progress *lp = ctx;
    const double now = cmd_now();
    if (lp->started == 0) {
        lp->started = lp->last = now;
        lp->first = done;
        return;
    }
    if (done < total && now - lp->last < 10) return;
    lp->last = now;
    const double rate = (double)(done - lp->first) / (now - lp->started > 0 ? now - lp->started : 1);
    fprintf(stderr, "fmoe simulate: %lld/%lld %s (%.0f%%), eta %.0fs\n", (long long)done,
            (long long)total, unit, total ? 100.0 * (double)done / (double)total : 100.0,
            rate > 0 ? (double)(total - done) / rate : 0.0);
}

/* Runs every cell as a job (over MPI ranks, or with --sweep-out): results[] on rank 0.
 * @return 0, 1 or 2 (printed). */
static int run_job(const options *o, const cmd_mpi_world *world, const sim_unit *units,
                   int nunits, const fmoe_sim_config *cells, size_t n, fmoe_sim_result *results) {
    size_t *cell_unit = malloc((n ? n : 1) * sizeof *cell_unit);
    char **keys = calloc(n ? n : 1, sizeof *keys);
    uint8_t *skip = calloc(n ? n : 1, 1);
    int exit_code = 0;
    sim_job j = {.units = units, .cell_unit = cell_unit, .cells = cells, .results = results,
                 .file_path = o->sweep_out};
    cmd_sweep_outcome out = {0};
    if (!cell_unit || !keys || !skip) {
        exit_code = cmd_failf(CMD, "out of memory");
        goto agree;
    }
    for (int u = 0; u < nunits; u++)
        for (size_t i = units[u].cell0; i < units[u].cell0 + units[u].ncells; i++) cell_unit[i] = (size_t)u;
    size_t resumed = 0;
    if (o->sweep_out && world->rank == 0) {
        char key[8192];
        for (size_t i = 0; i < n; i++) {
            const cmd_sweep_key k = cell_key(&j, i);
            if (!(keys[i] = strdup(cmd_sweep_key_string(&k, key, sizeof key)))) {
                exit_code = cmd_failf(CMD, "out of memory");
                goto agree;
            }
        }
        char settings[8192];
        simulate_sweep_settings(o, settings, sizeof settings);
        exit_code = cmd_sweep_file_open(CMD, o->sweep_out, settings, o->resume, n, keys, results,
                                        skip, &resumed, &j.file);
        if (exit_code) goto agree;
        if (o->resume && !o->quiet)
            fprintf(stderr, "fmoe simulate: %s holds %zu of the %zu cells; running %zu\n",
                    o->sweep_out, resumed, n, n - resumed);
    }
agree:
    if (world->size > 1) { /* the result file opened on rank 0, or all stop */
        const int agreed = cmd_mpi_agree(world, exit_code);
        if (!exit_code) exit_code = agreed;
    }
    if (exit_code) goto done;
    cmd_progress_bar bar;
    cmd_progress_bar_init(&bar, "simulating", o->quiet || world->rank != 0);
    line_progress lp = {0};
    fmoe_progress p = cmd_progress_bar_callback(&bar);
    if (!bar.enabled && world->size > 1 && world->rank == 0 && !o->quiet)
        p = (fmoe_progress){.fn = progress_line, .ctx = &lp};
    const cmd_sweep_job job = {.n = n, .skip = skip, .threads = o->threads, .run = run_cell,
                               .done = cell_done, .ctx = &j, .progress = &p,
                               .rank_timeout_s = o->rank_timeout_s};
    int rc = cmd_sweep_run(world, &job, &out);
    cmd_progress_bar_done(&bar);
    if (cmd_sweep_file_close(j.file) < 0 && rc == 0)
        rc = fmoe_error_set(FMOE_EIO, "%s: cannot write: %s", o->sweep_out, strerror(errno));
    j.file = NULL;
    if (rc < 0) {
        exit_code = cmd_fail(CMD, rc);
        goto done;
    }
    if (world->rank == 0 && out.missing > 0) {
        if (o->sweep_out)
            exit_code = cmd_failf(CMD, "%zu of %zu cells missing: rank%s %s stopped answering; "
                                       "the %zu finished are in %s: run the same command with "
                                       "--resume to complete it",
                                  out.missing, n, out.dead_ranks == 1 ? "" : "s", out.dead,
                                  n - out.missing, o->sweep_out);
        else
            exit_code = cmd_failf(CMD, "%zu of %zu cells missing: rank%s %s stopped answering "
                                       "(with --sweep-out F.jsonl the finished cells are kept "
                                       "and --resume completes them)",
                                  out.missing, n, out.dead_ranks == 1 ? "" : "s", out.dead);
    }
done:
    cmd_sweep_file_close(j.file);
    if (keys)
        for (size_t i = 0; i < n; i++) free(keys[i]);
    free(keys);
    free(skip);
    free(cell_unit);
    free(out.missing_cells);
    return exit_code;
}

/* ------------------------------------------------------------------ main */

/* The one cell of --decision-log, its decisions written to the log as they are made.
 * @return 0 or a negative FMOE_E* code (detail set). */
static int run_logged_cell(const options *o, sim_unit *u, fmoe_sim_config *cell,
                           fmoe_sim_result *res) {
    fmoe_decision_log *log = NULL;
    char meta[256];
    cmd_decision_log_meta(meta, sizeof meta, cell->policy, cell->cache_experts,
                          cell->prefetch_distance, o->copy_chunks);
    int rc = fmoe_decision_log_open(&log, o->decision_log, "simulate", meta);
    if (rc < 0) return rc;
    cell->decision = fmoe_decision_log_write;
    cell->decision_ctx = log;
    rc = fmoe_sim_run(&u->w, cell, res);
    const int rc2 = fmoe_decision_log_close(log, rc == 0);
    return rc == 0 ? rc2 : rc;
}

/* The results as asked: --csv, --plot, then --json or the table (per unit, in order;
 * order[n] is the table's scratch for its sorting).
 * @return the exit status. */
static int print_results(const options *o, const sim_unit *units, int nunits,
                         const fmoe_sim_result *res, size_t n, size_t *order) {
    if (o->csv) {
        const char **prefix = NULL;
        if (nunits > 1 && !(prefix = calloc(2 * n, sizeof *prefix)))
            return cmd_failf(CMD, "out of memory");
        for (int u = 0; prefix && u < nunits; u++)
            for (size_t i = units[u].cell0; i < units[u].cell0 + units[u].ncells; i++) {
                prefix[2 * i] = units[u].trace;
                prefix[2 * i + 1] = units[u].hw_key;
            }
        const int exit_code = simulate_write_csv(o->csv, res, n, prefix);
        free(prefix);
        if (exit_code) return exit_code;
    }
    int rc;
    if (o->plot && (rc = simulate_write_plot(o->plot, units[0].trace, res, n)) < 0)
        return cmd_fail(CMD, rc);
    if (o->json) {
        /* one unit: its document, as ever; several: {"sweeps": [one per unit]} */
        cJSON *all = nunits > 1 ? cJSON_CreateObject() : NULL;
        cJSON *list = all ? cJSON_AddArrayToObject(all, "sweeps") : NULL;
        cJSON *doc = NULL;
        for (int u = 0; u < nunits; u++) {
            const sim_unit *x = &units[u];
            const options uo = simulate_unit_options(o, x);
            doc = simulate_unit_json(&uo, &x->hw, x->expert_bytes, &x->es, &x->w, res + x->cell0, x->ncells);
            if (list) cJSON_AddItemToArray(list, doc);
        }
        if (cmd_print_json(all ? all : doc) != 0) return cmd_failf(CMD, "out of memory");
    } else if (!o->csv || strcmp(o->csv, "-") != 0) {
        for (int u = 0; u < nunits; u++) {
            const sim_unit *x = &units[u];
            const options uo = simulate_unit_options(o, x);
            if (u) printf("\n");
            simulate_print_table(&uo, &x->hw, x->expert_bytes, &x->es, &x->w, res + x->cell0, x->ncells,
                        order + x->cell0);
            if (uo.gap_split) simulate_print_gap_split(res + x->cell0, x->ncells, order + x->cell0);
        }
    }
    return CMD_EXIT_OK;
}

static int simulate(options *o, const cmd_mpi_world *world) {
    char **traces = NULL;
    int ntraces = 0, nunits = 0;
    sim_unit *units = NULL;
    fmoe_sim_config *cells = NULL;
    fmoe_sim_result *res = NULL;
    size_t *order = NULL, n = 0, cap = 0;
    int exit_code = simulate_expand_traces(o, &traces, &ntraces), rc = 0;
    if (exit_code) return exit_code;
    const int nhw = o->profiles.n ? o->profiles.n : o->n_hardware ? o->n_hardware : 1;
    nunits = ntraces * nhw;
    if (nunits > 1 && (o->plot || o->decision_log)) {
        exit_code = cmd_usage_error(CMD, "%s is for one trace on one hardware; this sweep has %d "
                                         "(%d trace%s x %d hardware profile%s)",
                                    o->plot ? "--plot" : "--decision-log", nunits, ntraces,
                                    ntraces == 1 ? "" : "s", nhw, nhw == 1 ? "" : "s");
        goto prepared;
    }
    if (o->decision_log && (o->sweep_out || world->size > 1)) {
        exit_code = cmd_usage_error(CMD, "--decision-log runs one cell in one process: no "
                                         "--sweep-out, no mpirun");
        goto prepared;
    }
    if (o->gap_split && (o->sweep_out || world->size > 1)) { /* its count is not in a line */
        exit_code = cmd_usage_error(CMD, "--gap-split is for one process's table or --json: no "
                                         "--sweep-out, no mpirun");
        goto prepared;
    }
    /* every file written was checked against every file read by the parse (cmd/outputs.h) */
    units = calloc((size_t)nunits, sizeof *units);
    if (!units) {
        exit_code = cmd_failf(CMD, "out of memory");
        goto prepared;
    }
    for (int t = 0; t < ntraces; t++)
        for (int h = 0; h < nhw; h++) {
            sim_unit *u = &units[t * nhw + h];
            u->trace = traces[t];
            u->profile = o->profiles.n ? o->profiles.items[h] : NULL;
            u->hardware = !o->profiles.n && o->n_hardware ? o->hardware_list[h] : NULL;
            u->hw_key = u->profile ? u->profile : u->hardware ? u->hardware : DEFAULT_HARDWARE;
            u->store = o->store; /* the settings; prepare loads the store for the trace */
            if ((exit_code = simulate_prepare_unit(o, u, &cells, &n, &cap)) != 0) goto prepared;
        }
    res = calloc(n ? n : 1, sizeof *res);
    order = calloc(n ? n : 1, sizeof *order);
    if (!res || !order) {
        exit_code = cmd_failf(CMD, "out of memory");
        goto prepared;
    }
prepared:
    /* Every rank has read the same files: they all go on, or none (a rank left waiting for
     * cells would wait for ever). */
    if (world->size > 1) {
        const int agreed = cmd_mpi_agree(world, exit_code);
        if (agreed && !exit_code && world->rank == 0)
            fprintf(stderr, "fmoe simulate: another rank failed before the sweep (its line "
                            "above)\n");
        if (!exit_code) exit_code = agreed;
    }
    if (exit_code) goto done;
    if (o->decision_log) { /* one cell, its decisions to the log */
        if (n != 1) {
            exit_code = cmd_usage_error(CMD, "--decision-log needs one policy, one cache size "
                                             "and one distance (%zu runs asked)", n);
            goto done;
        }
        if ((rc = run_logged_cell(o, &units[0], &cells[0], &res[0])) < 0) goto fail;
    } else if (o->sweep_out || world->size > 1) {
        if ((exit_code = run_job(o, world, units, nunits, cells, n, res)) != 0) goto done;
    } else {
        for (int u = 0; u < nunits; u++) {
            cmd_progress_bar bar;
            cmd_progress_bar_init(&bar, "simulating", o->quiet);
            fmoe_progress p = cmd_progress_bar_callback(&bar);
            rc = fmoe_sim_sweep(&units[u].w, cells + units[u].cell0, units[u].ncells,
                                o->threads, res + units[u].cell0, &p);
            cmd_progress_bar_done(&bar);
            if (rc < 0) goto fail;
        }
    }
    if (world->rank == 0) /* rank 0 prints the one result */
        exit_code = print_results(o, units, nunits, res, n, order);
    goto done;
fail:
    exit_code = cmd_fail(CMD, rc);
done:
    if (res)
        for (size_t i = 0; i < n; i++) fmoe_sim_result_free(&res[i]);
    free(res);
    free(cells);
    free(order);
    for (int u = 0; units && u < nunits; u++) simulate_unit_free(&units[u]);
    free(units);
    for (int i = 0; i < ntraces; i++) free(traces[i]);
    free(traces);
    return exit_code;
}

int cmd_simulate(int argc, char **argv) {
    options o;
    simulate_init(&o);
    int rc = simulate_parse_options(argc, argv, &o);
    if (rc != 0) return rc == CMD_OPTIONS_HELP ? CMD_EXIT_OK : rc;
    cmd_mpi_world world;
    if ((rc = cmd_mpi_start(CMD, &world)) != 0) return rc;
    if (world.rank > 0) { /* rank 0 says what there is to say */
        o.quiet = 1;
        sim_notes_off = 1;
    }
    rc = simulate(&o, &world);
    fflush(stdout);
    cmd_mpi_finish(&world, rc);
    return rc;
}

