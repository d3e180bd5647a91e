/*
 * trace_header.h - the root attributes of a trace recorded live from a loaded model,
 * shared by `fmoe record` and `fmoe serve --trace-out`.
 */
#ifndef FMOE_CMD_TRACE_HEADER_H
#define FMOE_CMD_TRACE_HEADER_H

#include <stddef.h>

#include "fmoe/model.h"
#include "fmoe/trace.h"

/* The last component of a path ("a/b/" -> "b") into buf. @return buf. */
const char *cmd_base_name(const char *path, char *buf, size_t cap);

/* Zeroes *h and fills what the model decides: the model name (model_name, else the
 * directory's name), fingerprint, L/J/K/h, shared experts, expert bytes and dtype,
 * recorded_on from the backend the run computes on ("cpu", or "cuda:<device name>") and
 * activations from what it multiplies quantized weights by ("f32" or "q8"; auto is
 * resolved with fmoe_activations_resolve, never written), full
 * probabilities (float16 unless probs_f32), the embedding as semantic rows, config.json.
 * The caller sets the rest (dataset, speculative, hidden, timing, prefill_chunk,
 * offload). @return 0 or the fingerprint's error. */
int cmd_trace_header_for_model(fmoe_trace_header *h, const fmoe_model *m, const char *dir,
                               const char *model_name, int probs_f32,
                               fmoe_backend_kind backend, fmoe_activations activations);

#endif
