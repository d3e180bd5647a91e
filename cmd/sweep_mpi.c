/*
 * sweep_mpi.c - a sweep over MPI ranks (contract in sweep.h; docs/scaling-out.md). Built
 * only when meson finds MPI (-Dmpi=auto|enabled); sweep_mpi_none.c stands in otherwise.
 *
 * Every rank has prepared the same cells. Rank 0 runs cells in its own threads and hands
 * the others out one at a time: a rank says how many threads it runs (HELLO), each thread
 * slot gets a cell index (CELL), and a finished cell's result line (RESULT) asks for the
 * next one for that slot; -1 retires the slot. Cells are handed out in grid order as ranks
 * finish, which balances cells whose costs differ by 100x without knowing them; only
 * indexes and result lines travel (a few KiB a cell), never workloads.
 *
 * A rank that dies: Open MPI ends the whole job unless mpirun runs with --enable-recovery
 * (Slurm's srun keeps the other tasks by default). Every rank's main thread sends a BEAT
 * when it has had nothing else to send for a while, so rank 0 can tell a dead rank from a
 * slow cell: a rank silent for rank_timeout_s is declared dead, the cells it held are
 * reported missing (not run again: the result file keeps every finished cell, and
 * --resume runs the rest), and rank 0 stops waiting for it.
 *
 * Only the main thread of each rank calls MPI (MPI_THREAD_FUNNELED); the cells run in the
 * pool of sweep_run.c. Waiting polls (MPI_Iprobe, then the pool for 2 ms): a blocking
 * receive would spin a core in Open MPI's progress loop, which a rank's own cells need.
 *
 * Fault injection (tests): FMOE_FAULT_RANK_KILL=R:K makes rank R (> 0) kill itself with
 * SIGKILL as it receives its K-th cell, which rank 0 then holds as that rank's: a dead
 * rank with a cell, whatever the timing.
 */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cmd_common.h"
#include "fmoe/error.h"
#include "monotonic.h"
#include "sweep.h"

enum { TAG_HELLO = 1, TAG_RESULT = 2, TAG_ERROR = 3, TAG_BEAT = 4, TAG_CELL = 5 };

#define POLL_S 0.002
#define DEFAULT_TIMEOUT_S 60.0

/* ------------------------------------------------------------------ world */

int cmd_mpi_start(const char *cmd, cmd_mpi_world *w) {
    *w = (cmd_mpi_world){.rank = 0, .size = 1};
    if (cmd_mpi_launched_size() == 0) return 0; /* a plain run: MPI stays untouched */
    int provided = 0;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        return cmd_failf(cmd, "MPI_Init_thread failed");
    w->initialised = 1;
    if (provided < MPI_THREAD_FUNNELED) {
        cmd_mpi_finish(w, 0);
        return cmd_failf(cmd, "the MPI library does not support threads (MPI_THREAD_FUNNELED)");
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &w->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &w->size);
    return 0;
}

/* Set on rank 0 when it declares a rank dead. */
static int a_rank_died;

void cmd_mpi_finish(cmd_mpi_world *w, int status) {
    if (!w->initialised) return;
    /* mpirun exits with the first non-zero status of a rank; under --enable-recovery it
     * exits 0 whatever they return (MPI_Abort included), which docs/scaling-out.md says.
     * After a rank died, MPI_Finalize would wait on it with the live ranks (Open MPI's
     * finalize fences every process of the job; a quick-tier run hung there for 300 s
     * once), so rank 0, its report written, ends the job instead. */
    if (a_rank_died) {
        fflush(stdout);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, status ? status : 1);
    }
    MPI_Finalize();
    w->initialised = 0;
}

const char *cmd_mpi_describe(void) {
    static char text[MPI_MAX_LIBRARY_VERSION_STRING + 1];
    int len = 0;
    if (MPI_Get_library_version(text, &len) != MPI_SUCCESS) return "compiled (version unknown)";
    text[len < (int)sizeof text ? len : (int)sizeof text - 1] = '\0';
    char *nl = strpbrk(text, "\r\n"); /* the first line: Open MPI adds its repository and date */
    if (nl) *nl = '\0';
    return text;
}

int cmd_mpi_agree(const cmd_mpi_world *w, int status) {
    if (!w->initialised || w->size <= 1) return status;
    int all = status;
    MPI_Allreduce(&status, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return all;
}

/* ------------------------------------------------------------------ rank 0 */

typedef struct peer {
    int hello;          /* said how many slots it runs */
    int dead;
    int active;         /* slots not yet retired */
    double last_seen;
} peer;

typedef struct master {
    const cmd_sweep_job *job;
    int size;
    peer *peers;        /* [size] */
    int *owner;         /* [n] rank running the cell, -1: none (done, local or not handed) */
    size_t next;        /* next cell to hand out */
    size_t finished, todo, resumed;
    int stop;           /* an error: hand out nothing more */
    int rc;
    cmd_sweep_outcome *out;
} master;

static long next_cell(master *m) {
    if (m->stop) return -1;
    while (m->next < m->job->n && m->job->skip && m->job->skip[m->next]) m->next++;
    return m->next < m->job->n ? (long)m->next++ : -1;
}

static void give(master *m, int rank) {
    const long c = next_cell(m);
    int64_t v = c;
    MPI_Send(&v, 1, MPI_INT64_T, rank, TAG_CELL, MPI_COMM_WORLD);
    if (c >= 0) m->owner[c] = rank;
    else m->peers[rank].active--;
}

static void cell_finished(master *m, size_t i, const char *line) {
    m->finished++;
    m->owner[i] = -1;
    if (line && m->rc == 0) {
        int rc = m->job->done(m->job->ctx, i, line);
        if (rc < 0) {
            m->rc = rc;
            m->stop = 1;
        }
    }
    fmoe_progress_report(m->job->progress, (int64_t)(m->resumed + m->finished),
                         (int64_t)m->job->n, "cells");
}

static int receive(master *m) {
    int flag = 0;
    MPI_Status st;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &st);
    if (!flag) return 0;
    int count = 0;
    MPI_Get_count(&st, MPI_CHAR, &count);
    char *buf = malloc((size_t)count + 1);
    if (!buf) {
        m->rc = fmoe_error_set(FMOE_ENOMEM, "a result of %d bytes from rank %d", count,
                               st.MPI_SOURCE);
        m->stop = 1;
        return 0;
    }
    MPI_Recv(buf, count, MPI_CHAR, st.MPI_SOURCE, st.MPI_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    buf[count] = '\0';
    const int r = st.MPI_SOURCE;
    peer *p = &m->peers[r];
    p->last_seen = fmoe__now_s();
    if (p->dead) { /* a rank declared dead spoke after all: its cells are missing already;
                      retire the slots it asks for, so that it ends */
        int slots = 1;
        if (st.MPI_TAG == TAG_HELLO && count >= (int)sizeof slots) memcpy(&slots, buf, sizeof slots);
        if (st.MPI_TAG == TAG_HELLO || st.MPI_TAG == TAG_RESULT || st.MPI_TAG == TAG_ERROR)
            for (int s = 0; s < slots; s++) {
                const int64_t none = -1;
                MPI_Send(&none, 1, MPI_INT64_T, r, TAG_CELL, MPI_COMM_WORLD);
            }
        free(buf);
        return 1;
    }
    int64_t cell = -1;
    if ((st.MPI_TAG == TAG_RESULT || st.MPI_TAG == TAG_ERROR) && count >= 8)
        memcpy(&cell, buf, 8);
    switch (st.MPI_TAG) {
    case TAG_HELLO: {
        int slots = 1;
        if (count >= (int)sizeof slots) memcpy(&slots, buf, sizeof slots);
        p->hello = 1;
        p->active = slots;
        for (int s = 0; s < slots; s++) give(m, r);
        break;
    }
    case TAG_RESULT:
        if (cell >= 0 && (size_t)cell < m->job->n && m->owner[cell] == r)
            cell_finished(m, (size_t)cell, buf + 8);
        give(m, r);
        break;
    case TAG_ERROR:
        if (cell >= 0 && (size_t)cell < m->job->n && m->owner[cell] == r) {
            if (m->rc == 0)
                m->rc = fmoe_error_set(FMOE_EINTERNAL, "rank %d: %s", r, buf + 8);
            m->stop = 1;
            cell_finished(m, (size_t)cell, NULL);
        }
        give(m, r);
        break;
    default: /* TAG_BEAT */
        break;
    }
    free(buf);
    return 1;
}

/* Declares ranks silent for longer than the timeout dead; their cells go missing. */
static void check_silent(master *m, double timeout) {
    const double t = fmoe__now_s();
    for (int r = 1; r < m->size; r++) {
        peer *p = &m->peers[r];
        if (p->dead || (p->hello && p->active == 0) || t - p->last_seen < timeout) continue;
        p->dead = 1;
        p->active = 0;
        a_rank_died = 1;
        cmd_sweep_outcome *o = m->out;
        o->dead_ranks++;
        size_t len = strlen(o->dead);
        snprintf(o->dead + len, sizeof o->dead - len, "%s%d", len ? ", " : "", r);
        for (size_t i = 0; i < m->job->n; i++)
            if (m->owner[i] == r) {
                if (!o->missing_cells) o->missing_cells = calloc(m->job->n, 1);
                if (o->missing_cells) o->missing_cells[i] = 1;
                o->missing++;
                m->owner[i] = -1;
                m->finished++; /* accounted for */
            }
    }
}

static int peers_done(const master *m) {
    for (int r = 1; r < m->size; r++) {
        const peer *p = &m->peers[r];
        if (!p->dead && (!p->hello || p->active > 0)) return 0;
    }
    return 1;
}

/* Takes one finished cell of rank 0's own pool (waiting up to timeout_s) and gives the
 * pool the next cell. @return 1 when one finished. */
static int take_local(master *m, cmd_sweep_pool *pool, double timeout_s, int *local) {
    size_t i;
    char *line = NULL, detail[256];
    int cell_rc = 0;
    if (*local == 0 ||
        !cmd_sweep_pool_pop(pool, timeout_s, &i, &line, &cell_rc, detail, sizeof detail))
        return 0;
    (*local)--;
    if (!line && m->rc == 0) {
        m->rc = fmoe_error_set(cell_rc, "%s", detail);
        m->stop = 1;
    }
    cell_finished(m, i, line);
    free(line);
    const long c = next_cell(m);
    if (c >= 0) {
        cmd_sweep_pool_push(pool, (size_t)c);
        (*local)++;
    }
    return 1;
}

static int run_master(const cmd_mpi_world *w, const cmd_sweep_job *job, cmd_sweep_outcome *out) {
    master m = {.job = job, .size = w->size, .out = out};
    for (size_t i = 0; i < job->n; i++) m.todo += !(job->skip && job->skip[i]);
    m.resumed = job->n - m.todo;
    m.peers = calloc((size_t)w->size, sizeof *m.peers);
    m.owner = malloc((job->n ? job->n : 1) * sizeof *m.owner);
    cmd_sweep_pool *pool = NULL;
    int rc = 0;
    if (!m.peers || !m.owner) {
        rc = fmoe_error_set(FMOE_ENOMEM, "sweep of %zu cells over %d ranks", job->n, w->size);
        goto done;
    }
    for (size_t i = 0; i < job->n; i++) m.owner[i] = -1;
    const double t0 = fmoe__now_s();
    for (int r = 0; r < w->size; r++) m.peers[r].last_seen = t0;
    const double timeout = job->rank_timeout_s > 0 ? job->rank_timeout_s : DEFAULT_TIMEOUT_S;
    fmoe_progress_report(job->progress, (int64_t)m.resumed, (int64_t)job->n, "cells");
    if ((rc = cmd_sweep_pool_start(&pool, job->threads, job)) < 0) goto done;
    int local = 0; /* cells in rank 0's pool */
    for (int t = cmd_sweep_pool_threads(pool); t > 0; t--) {
        const long c = next_cell(&m);
        if (c < 0) break;
        cmd_sweep_pool_push(pool, (size_t)c);
        local++;
    }
    while (local > 0 || !peers_done(&m)) {
        while (take_local(&m, pool, 0, &local)) {
        }
        int heard = 0;
        while (receive(&m)) heard = 1;
        check_silent(&m, timeout);
        /* nothing from the other ranks: wait on the own pool a little, or sleep */
        if (!heard && !take_local(&m, pool, POLL_S, &local) && local == 0)
            nanosleep(&(struct timespec){0, (long)(POLL_S * 1e9)}, NULL);
    }
    rc = m.rc;
done:
    cmd_sweep_pool_stop(pool);
    free(m.peers);
    free(m.owner);
    return rc;
}

/* ------------------------------------------------------------------ other ranks */

static void send_tagged(int tag, int64_t cell, const char *text) {
    const size_t len = text ? strlen(text) : 0;
    char *buf = malloc(8 + len);
    if (!buf) { /* cannot say more: the error with no text */
        char small[8];
        memcpy(small, &cell, 8);
        MPI_Send(small, 8, MPI_CHAR, 0, TAG_ERROR, MPI_COMM_WORLD);
        return;
    }
    memcpy(buf, &cell, 8);
    if (len) memcpy(buf + 8, text, len);
    MPI_Send(buf, (int)(8 + len), MPI_CHAR, 0, tag, MPI_COMM_WORLD);
    free(buf);
}

static int run_worker(const cmd_mpi_world *w, const cmd_sweep_job *job) {
    int kill_rank = -1, kill_after = 0;
    const char *fault = getenv("FMOE_FAULT_RANK_KILL");
    if (fault && sscanf(fault, "%d:%d", &kill_rank, &kill_after) != 2) kill_rank = -1;
    cmd_sweep_pool *pool = NULL;
    int rc = cmd_sweep_pool_start(&pool, job->threads, job);
    if (rc < 0) return rc; /* rank 0 declares this rank dead after the timeout */
    int slots = cmd_sweep_pool_threads(pool), retired = 0, received = 0;
    MPI_Send(&slots, (int)sizeof slots, MPI_CHAR, 0, TAG_HELLO, MPI_COMM_WORLD);
    const double timeout = job->rank_timeout_s > 0 ? job->rank_timeout_s : DEFAULT_TIMEOUT_S;
    const double beat = timeout / 8 < 1.0 ? timeout / 8 : 1.0;
    double last_send = fmoe__now_s(), last_heard = last_send;
    int inflight = 0; /* cells pushed to the pool and not yet popped */
    int heard = 0;    /* rank 0 has answered: it may take a while to read the traces first */
    while (retired < slots) {
        int flag = 0;
        MPI_Status st;
        MPI_Iprobe(0, TAG_CELL, MPI_COMM_WORLD, &flag, &st);
        if (flag) {
            int64_t c = -1;
            MPI_Recv(&c, 1, MPI_INT64_T, 0, TAG_CELL, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            last_heard = fmoe__now_s();
            heard = 1;
            if (c >= 0 && (size_t)c < job->n) {
                if (++received == kill_after && w->rank == kill_rank) raise(SIGKILL);
                cmd_sweep_pool_push(pool, (size_t)c);
                inflight++;
            } else {
                retired++;
            }
            continue;
        }
        size_t i;
        char *line = NULL, detail[256];
        int cell_rc = 0;
        if (cmd_sweep_pool_pop(pool, POLL_S, &i, &line, &cell_rc, detail, sizeof detail)) {
            inflight--;
            if (line) send_tagged(TAG_RESULT, (int64_t)i, line);
            else send_tagged(TAG_ERROR, (int64_t)i, detail);
            free(line);
            last_send = fmoe__now_s();
        } else if (heard && inflight == 0 && fmoe__now_s() - last_heard > timeout) {
            /* every slot waits for rank 0, which answers at once when alive */
            rc = fmoe_error_set(FMOE_EIO, "rank %d: rank 0 has not answered for %.0f s; "
                                          "giving up", w->rank, timeout);
            break;
        } else if (fmoe__now_s() - last_send > beat) {
            MPI_Send(NULL, 0, MPI_CHAR, 0, TAG_BEAT, MPI_COMM_WORLD);
            last_send = fmoe__now_s();
        }
    }
    cmd_sweep_pool_stop(pool);
    return rc;
}

int cmd_sweep_run(const cmd_mpi_world *w, const cmd_sweep_job *job, cmd_sweep_outcome *out) {
    memset(out, 0, sizeof *out);
    if (w->size <= 1) return cmd_sweep_run_local(job);
    return w->rank == 0 ? run_master(w, job, out) : run_worker(w, job);
}
