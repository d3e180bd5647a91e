/*
 * sweep.h - running the cells of an `fmoe simulate` sweep as a job: in this process's
 * threads, or over MPI ranks, with every finished cell written as one JSON line to a
 * result file that an interrupted sweep resumes from (docs/scaling-out.md).
 *
 *   cell lines   sweep_lines.c: a cell's key and its whole fmoe_sim_result as one JSON
 *                line, and back, bit for bit (doubles print with enough digits to read
 *                back the same value), so a result that travelled between ranks or
 *                through the file is the one computed
 *   result file  sweep_lines.c: --sweep-out F (--resume): a settings line, then one line
 *                per finished cell, flushed as it finishes
 *   job          sweep_run.c: the threads of one process; sweep_mpi.c (built with MPI
 *                only): rank 0 hands out cells one at a time as ranks finish them
 *                (dynamic balancing: cells differ in cost by 100x), and collects the
 *                lines; sweep_mpi_none.c stands in without MPI
 *
 * The command prepares the same cells on every rank (the same options read the same
 * files), so a cell travels as its index and only its result line comes back.
 */
#ifndef FMOE_CMD_SWEEP_H
#define FMOE_CMD_SWEEP_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "fmoe/progress.h"
#include "fmoe/sim.h"

/* ------------------------------------------------------------------ cell lines */

/* What names a cell in a result file: the trace, the hardware (preset name or profile
 * path), and the grid point; and the trace's identity (what it holds, not its path: a
 * trace replaced under the same path is another trace), which resume compares. */
typedef struct cmd_sweep_key {
    const char *trace;
    const char *hardware;
    const char *policy;
    int32_t cache_experts;
    int32_t prefetch_distance;
    const char *trace_id; /* hex digest (cmd_simulate.c says of what); NULL: "" */
} cmd_sweep_key;

/* The key as one string (fields separated by '\x1f'), into buf. @return buf. */
const char *cmd_sweep_key_string(const cmd_sweep_key *k, char *buf, size_t cap);

/* One JSON line (no newline) holding the key, every field of r, and wall_s, the seconds the
 * cell took where it ran (for the cost model of tests/bench/bench_mpi_sweep.py; not read
 * back). malloc'd; NULL when out of memory. */
char *cmd_sweep_line(const cmd_sweep_key *k, const fmoe_sim_result *r, double wall_s);

/* Reads a line of cmd_sweep_line back: the key string into key[cap], the result into *r
 * (owned by the caller: fmoe_sim_result_free). @return 0, or -1 when the line is not a
 * whole cell line (a torn last line, another file). */
int cmd_sweep_line_parse(const char *line, char *key, size_t cap, fmoe_sim_result *r);

/* ------------------------------------------------------------------ result file */

typedef struct cmd_sweep_file cmd_sweep_file;

/* Opens the result file `path` for a sweep of n cells whose keys are keys[n] (strings of
 * cmd_sweep_key_string) and whose other settings read `settings` (one line of text).
 * Without `resume` the file must not exist; it is created with the settings line. With
 * `resume` an existing file must hold the same settings; every whole line whose key is a
 * cell of the sweep fills results[i] and sets done[i] (*n_done counts them); a line of a
 * trace path the sweep has under another identity (the trace was replaced) is refused,
 * naming both identities; a torn last
 * line (a kill mid-write) is cut off; the file is then appended to. A file that does not
 * exist yet is created as without resume. Prints one line and returns 1 (2 for usage:
 * exists without --resume) on failure; 0 with *out. */
int cmd_sweep_file_open(const char *cmd, const char *path, const char *settings, int resume,
                        size_t n, char *const *keys, fmoe_sim_result *results, uint8_t *done,
                        size_t *n_done, cmd_sweep_file **out);

/* Appends a line and its newline and flushes it to the file. @return 0 or -1 (errno). */
int cmd_sweep_file_append(cmd_sweep_file *f, const char *line);

/* Closes; @return 0 or -1 when a write failed. NULL is a no-op. */
int cmd_sweep_file_close(cmd_sweep_file *f);

/* ------------------------------------------------------------------ job */

/* The MPI world this process is part of: size 1 when not launched by mpirun/srun (MPI is
 * then never initialised) or built without MPI. */
typedef struct cmd_mpi_world {
    int rank;
    int size;
    int initialised; /* MPI_Init was called: call cmd_mpi_finish */
} cmd_mpi_world;

/* Joins the MPI world when the process was launched as one of several ranks (Open MPI's,
 * MPICH's or Slurm's PMI variables say so). Built without MPI, such a launch is refused:
 * every rank would run the whole command. Prints one line on failure. @return 0 or 1. */
int cmd_mpi_start(const char *cmd, cmd_mpi_world *w);

/* The MPI library this fmoe was built with, in one line ("Open MPI v4.1.4, ..."), or "not
 * compiled (built without MPI)"; safe without MPI_Init (fmoe version). */
const char *cmd_mpi_describe(void);

/* Every rank's status before a collective step: the largest (0 when all are 0). All ranks
 * must call it; without MPI it returns `status`. */
int cmd_mpi_agree(const cmd_mpi_world *w, int status);

/* The number of ranks a launcher (mpirun, srun) started this process among, from its
 * environment; 0 when it was not launched as one of several (sweep_run.c). */
int cmd_mpi_launched_size(void);

/* Leaves the world (MPI_Finalize) when start joined it. `status` is the command's exit
 * status (kept for a runtime that would pass it on; Open MPI's mpirun takes it from the
 * process's exit). */
void cmd_mpi_finish(cmd_mpi_world *w, int status);

/* The rank's number among the ranks of its node, from the launcher's environment
 * (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID, MPI_LOCALRANKID), else the world rank
 * (mpi_gpu.c). */
int cmd_mpi_local_rank(const cmd_mpi_world *w);

/* The device local rank r takes: entry r mod count of `visible` (a CUDA_VISIBLE_DEVICES
 * list; empty entries skipped; set and empty: none) when it is set, else r mod `present` (the
 * node's device count). Writes it to pick[cap]. @return 1, or 0 when there is none (no
 * device, nothing listed, cap too small). */
int cmd_mpi_pick_gpu(int local_rank, const char *visible, int present, char *pick, size_t cap);

/* Narrows CUDA_VISIBLE_DEVICES to this rank's device (cmd_mpi_pick_gpu over /dev/nvidia*),
 * before the CUDA runtime starts. @return 1 with the device in pick, 0 when none. */
int cmd_mpi_pin_gpu(const cmd_mpi_world *w, char *pick, size_t cap);

/* The cells of a job. run and done are the command's. */
typedef struct cmd_sweep_job {
    size_t n;                /* cells */
    const uint8_t *skip;     /* [n] 1: already done (resumed); NULL: none */
    int threads;             /* per rank; <= 0: one per core */
    /* Runs cell i on any thread of any rank: its result line (malloc'd), or NULL with *rc
     * < 0 and the fmoe error detail set. */
    char *(*run)(void *ctx, size_t i, int *rc);
    /* Rank 0, its calling thread only: cell i finished with `line` (borrowed). A negative
     * return stops the job with that error. */
    int (*done)(void *ctx, size_t i, const char *line);
    void *ctx;
    const fmoe_progress *progress; /* rank 0: cells finished (resumed ones included) */
    double rank_timeout_s;   /* a rank silent this long is dead (MPI only; <= 0: 60) */
} cmd_sweep_job;

typedef struct cmd_sweep_outcome {
    size_t missing;          /* cells of dead ranks, never done (rank 0) */
    int dead_ranks;
    char dead[256];          /* "2, 5": the ranks, for the message */
    uint8_t *missing_cells;  /* [n] 1: missing (malloc'd when missing > 0; free it) */
} cmd_sweep_outcome;

/* Runs the job over the world: in this process's threads when w->size == 1, else over
 * every rank (all ranks call it with the same job). On rank 0, done() has seen every cell
 * that finished; the other ranks return once rank 0 has no more cells for them.
 * @return 0 (rank 0: cells may be missing, see *out), or a cell's or done()'s error. */
int cmd_sweep_run(const cmd_mpi_world *w, const cmd_sweep_job *job, cmd_sweep_outcome *out);

/* The threads of one process (sweep_run.c); cmd_sweep_run's size-1 case. */
int cmd_sweep_run_local(const cmd_sweep_job *job);

/* A pool of threads running cells (sweep_run.c), for the runners. */
typedef struct cmd_sweep_pool cmd_sweep_pool;
int cmd_sweep_pool_start(cmd_sweep_pool **out, int threads, const cmd_sweep_job *job);
int cmd_sweep_pool_threads(const cmd_sweep_pool *p);
void cmd_sweep_pool_push(cmd_sweep_pool *p, size_t i);
/* Waits up to timeout_s (< 0: for ever) for a finished cell. @return 1 with *i, *line
 * (malloc'd, or NULL with *rc < 0 and *detail set), 0 on timeout. */
int cmd_sweep_pool_pop(cmd_sweep_pool *p, double timeout_s, size_t *i, char **line, int *rc,
                       char *detail, size_t cap);
void cmd_sweep_pool_stop(cmd_sweep_pool *p); /* joins; NULL is a no-op */

#endif
