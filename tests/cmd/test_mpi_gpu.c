/*
 * test_mpi_gpu.c - the GPU each rank of `mpirun fmoe record` takes (cmd/mpi_gpu.c): rank r
 * of a node takes entry r mod count of CUDA_VISIBLE_DEVICES (names and UUIDs kept as
 * written, empty entries skipped; an empty list hides all), else device r mod the node's
 * count; none without a device; the launcher's local rank before the world rank.
 */
#include "sweep.h"

#include <stdlib.h>

#include "harness.h"

static const char *pick(int rank, const char *visible, int present) {
    static char buf[64];
    return cmd_mpi_pick_gpu(rank, visible, present, buf, sizeof buf) ? buf : NULL;
}

TEST(ranks_share_the_listed_devices_round_robin) {
    const char *want[] = {"5", "7", "5", "7", "5"};
    for (int r = 0; r < 5; r++) ASSERT_STR_EQ(pick(r, "5,7", 8), want[r]);
    ASSERT_STR_EQ(pick(4, "3", 8), "3");
    ASSERT_STR_EQ(pick(1, "GPU-1a2b,GPU-3c4d,MIG-9", 0), "GPU-3c4d");
    ASSERT_STR_EQ(pick(2, ",4,,6,", 0), "4"); /* entries 4 and 6: rank 2 takes 4 */
    ASSERT_STR_EQ(pick(3, ",4,,6,", 0), "6");
}

TEST(without_a_list_the_node_devices) {
    ASSERT_STR_EQ(pick(0, NULL, 4), "0");
    ASSERT_STR_EQ(pick(6, NULL, 4), "2");
    ASSERT_STR_EQ(pick(9, NULL, 1), "0");
}

TEST(no_device_no_pick) {
    ASSERT_TRUE(pick(0, NULL, 0) == NULL);
    ASSERT_TRUE(pick(1, "", 4) == NULL); /* set but empty: CUDA sees no device */
    ASSERT_TRUE(pick(1, ",,", 3) == NULL); /* a list of nothing hides every device */
    ASSERT_TRUE(pick(-1, "0,1", 2) == NULL);
    char small[3];
    ASSERT_EQ(cmd_mpi_pick_gpu(0, "GPU-1a2b", 0, small, sizeof small), 0);
    ASSERT_STR_EQ(small, "");
}

TEST(local_rank_from_the_launcher) {
    cmd_mpi_world w = {.rank = 5, .size = 8};
    unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
    unsetenv("SLURM_LOCALID");
    unsetenv("MPI_LOCALRANKID");
    ASSERT_EQ(cmd_mpi_local_rank(&w), 5);
    setenv("SLURM_LOCALID", "2", 1);
    ASSERT_EQ(cmd_mpi_local_rank(&w), 2);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
    ASSERT_EQ(cmd_mpi_local_rank(&w), 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "x", 1); /* not a number: the next one */
    ASSERT_EQ(cmd_mpi_local_rank(&w), 2);
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
