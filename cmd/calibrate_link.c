/*
 * calibrate_link.c - `fmoe calibrate --link-file MODEL` (calibrate_link.h): the file link
 * timed on the model's own experts by the live file tier's reads
 * (fmoe_offload_time_file_reads).
 *
 * Why not reads of the file's bytes: a live run reads an expert as its matrices' slices
 * (a GGUF keeps each layer's gate, up and down experts stacked, so one expert is three
 * ranges far apart), each split into segments several requests deep. On the development
 * VM's virtual disk contiguous ranges of the same sizes read 20-40% slower than the copy
 * engine's decode transfers of a Qwen3-30B-A3B-shaped file, and simulate's transfers with
 * them came out that much too long (docs/results.md).
 */
#include "calibrate_link.h"

#include <string.h>
#include <sys/stat.h>

#include "fmoe/error.h"
#include "fmoe/gguf.h"
#include "fmoe/model.h"
#include "fmoe/offload.h"

int calibrate_link_is_model(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) return 0;
    return S_ISDIR(st.st_mode) || fmoe_gguf_is_file(path);
}

int calibrate_expert_reads_run(const char *path, int32_t depth, int quick,
                               calibrate_expert_reads *out) {
    memset(out, 0, sizeof *out);
    static const int32_t pieces[CALIBRATE_EXPERT_POINTS] = {8, 4, 2, 1};
    fmoe_model *m = NULL;
    FMOE_FORWARD_IF_ERROR(fmoe_model_load(path, NULL, &m));
    int rc = fmoe_offload_time_file_reads(m, 1, depth, pieces, CALIBRATE_EXPERT_POINTS,
                                          quick ? 4 : 24, quick ? 0.2 : 3.0, out->bytes,
                                          out->seconds, &out->reads);
    if (rc == 0) {
        out->n = CALIBRATE_EXPERT_POINTS;
        out->expert_bytes = fmoe_model_expert_bytes(m);
    } else {
        fmoe_error_prefix("%s", path);
    }
    fmoe_model_free(m);
    return rc;
}
