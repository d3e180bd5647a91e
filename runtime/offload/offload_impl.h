/*
 * offload_impl.h - internals of the live executor (fmoe/offload.h) shared with its tests.
 */
#ifndef FMOE_OFFLOAD_IMPL_H
#define FMOE_OFFLOAD_IMPL_H

#include "../model/model_impl.h"
#include "fmoe/offload.h"

/*
 * fmoe_offload_init with the fast tier's backend table given instead of chosen from
 * o->backend (which is ignored): fmoe__cpu_backend gives host slots, exactly as
 * FMOE_BACKEND_CPU; a table whose host_memory is 0 gives device slots (offload.c's design
 * comment, "Device slots"). Tests pass a fake device table (ordinary memory that counts
 * and checks its calls) to run the device-slot path without a device. `be` must outlive
 * the executor. @return as fmoe_offload_init, or the table's init/alloc error.
 */
int fmoe__offload_init_backend(fmoe_offload **out, const fmoe_model *m,
                               const fmoe_offload_options *o, const fmoe__backend_ops *be);

/* Bytes [lo, hi) of piece `piece` of an expert of `bytes` bytes in `chunks` pieces: a
 * --copy-chunks transfer's pieces, ceil(bytes / chunks) each, the last shorter (the copy
 * engine's, and what fmoe_offload_time_file_reads times). */
static inline void fmoe__piece_range(int64_t bytes, int32_t chunks, int32_t piece, int64_t *lo,
                                     int64_t *hi) {
    const int64_t step = (bytes + chunks - 1) / chunks;
    *lo = step * piece < bytes ? step * piece : bytes;
    *hi = step * (piece + 1) < bytes ? step * (piece + 1) : bytes;
}

#endif
