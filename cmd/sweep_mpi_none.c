/*
 * sweep_mpi_none.c - the MPI part of sweep.h in a build without MPI (meson -Dmpi=disabled,
 * or no MPI found): one process, its threads. Launched by mpirun or srun as one of several
 * ranks, the command refuses to run: each rank would run the whole sweep and write the same
 * files.
 */
#include <string.h>

#include "cmd_common.h"
#include "sweep.h"

int cmd_mpi_start(const char *cmd, cmd_mpi_world *w) {
    *w = (cmd_mpi_world){.rank = 0, .size = 1};
    const int n = cmd_mpi_launched_size();
    if (n > 1)
        return cmd_failf(cmd, "launched as one of %d ranks, but this fmoe was built without MPI: "
                              "every rank would run the whole command (rebuild with "
                              "'meson configure -Dmpi=enabled' and the MPI development files)",
                         n);
    return 0;
}

void cmd_mpi_finish(cmd_mpi_world *w, int status) {
    (void)status;
    w->initialised = 0;
}

const char *cmd_mpi_describe(void) { return "not compiled (built without MPI)"; }

int cmd_mpi_agree(const cmd_mpi_world *w, int status) {
    (void)w;
    return status;
}

int cmd_sweep_run(const cmd_mpi_world *w, const cmd_sweep_job *job, cmd_sweep_outcome *out) {
    (void)w;
    memset(out, 0, sizeof *out);
    return cmd_sweep_run_local(job);
}
