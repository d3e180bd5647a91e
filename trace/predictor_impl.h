/*
 * predictor_impl.h - internals of trace/predictor_file.c shared with the tests (the fuzz
 * target tests/fuzz/fuzz_predictor.c).
 */
#ifndef FMOE_PREDICTOR_IMPL_H
#define FMOE_PREDICTOR_IMPL_H

#include <stddef.h>

#include "fmoe/predictor.h"

/* fmoe_predictor_read of a file image in memory (HDF5's core driver), `name` standing for
 * the path in messages. Same checks, same results. */
int fmoe__predictor_read_image(const void *image, size_t size, const char *name,
                               fmoe_predictor **out);

#endif
