/*
 * mpi_gpu.c - which GPU a rank of `mpirun -n R fmoe record --backend cuda` takes (contract
 * in sweep.h).
 *
 * Ranks are numbered per node by the launcher (Open MPI's OMPI_COMM_WORLD_LOCAL_RANK,
 * Slurm's SLURM_LOCALID, MPICH's MPI_LOCALRANKID); rank r of a node takes the node's device
 * r mod count, so R ranks on a node with fewer GPUs share them round-robin. The devices are
 * the ones CUDA_VISIBLE_DEVICES already lists (a scheduler that hands a job some GPUs of a
 * node says so there; set but empty, it hides them all), or /dev/nvidia0.. when it is
 * unset. The choice is written back to CUDA_VISIBLE_DEVICES before the CUDA runtime starts,
 * so the rank's process sees one device, device 0: nothing else in fmoe needs to know.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sweep.h"

int cmd_mpi_local_rank(const cmd_mpi_world *w) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID",
                                       "MPI_LOCALRANKID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        char *end;
        if (!v || !v[0]) continue;
        const long r = strtol(v, &end, 10);
        if (*end == '\0' && r >= 0 && r < 1 << 30) return (int)r;
    }
    return w->rank; /* one rank per node, or a launcher that does not say: the world rank */
}

int cmd_mpi_pick_gpu(int local_rank, const char *visible, int present, char *pick,
                     size_t cap) {
    if (cap) pick[0] = '\0';
    if (local_rank < 0 || cap == 0) return 0;
    if (visible) {
        /* the list's entries, empty ones skipped; set but empty, it hides every device
         * from the CUDA runtime, so there is none to take */
        int count = 0;
        for (const char *p = visible; *p;) {
            const size_t n = strcspn(p, ",");
            if (n) count++;
            p += n + (p[n] == ',');
        }
        if (count == 0) return 0;
        int k = 0;
        for (const char *p = visible; *p;) {
            const size_t n = strcspn(p, ",");
            if (n && k++ == local_rank % count) {
                if (n >= cap) return 0;
                memcpy(pick, p, n);
                pick[n] = '\0';
                return 1;
            }
            p += n + (p[n] == ',');
        }
        return 0;
    }
    if (present <= 0) return 0; /* no GPU: the CPU backend, nothing to pin */
    return snprintf(pick, cap, "%d", local_rank % present) < (int)cap;
}

int cmd_mpi_pin_gpu(const cmd_mpi_world *w, char *pick, size_t cap) {
    int present = 0;
    for (char dev[32]; present < 256; present++) {
        snprintf(dev, sizeof dev, "/dev/nvidia%d", present);
        if (access(dev, F_OK) != 0) break;
    }
    if (!cmd_mpi_pick_gpu(cmd_mpi_local_rank(w), getenv("CUDA_VISIBLE_DEVICES"), present, pick,
                          cap))
        return 0;
    return setenv("CUDA_VISIBLE_DEVICES", pick, 1) == 0;
}
