/*
 * quantize_imatrix.h - llama.cpp's importance-matrix files for `fmoe quantize --imatrix`
 * (internal to runtime/model; runtime/model/quantize_imatrix.c).
 *
 * An importance matrix holds, for each weight matrix of a model, the mean squared value of
 * each input column over a calibration text (per expert for stacked expert tensors): the
 * quantisers weigh each weight's error by it. llama-imatrix writes it as a GGUF file with
 * tensors "NAME.in_sum2" (F32, [experts][cols] sums of squares) and "NAME.counts" (F32,
 * [experts] how many activations were summed), and the keys imatrix.datasets,
 * imatrix.chunk_count, imatrix.chunk_size.
 */
#ifndef FMOE_QUANTIZE_IMATRIX_H
#define FMOE_QUANTIZE_IMATRIX_H

#include <stdint.h>

typedef struct fmoe__imatrix fmoe__imatrix;

/* Opens and checks an imatrix GGUF file: the three keys present (llama-quantize refuses a
 * file without them), every .in_sum2 with its .counts, both F32, the sums a whole number
 * of columns per count, every value finite. @return 0 and *out, or FMOE_EIO / FMOE_EFORMAT
 * (one-line detail naming the file and the entry; the legacy .dat format is refused with a
 * hint), FMOE_ENOMEM. */
int fmoe__imatrix_open(const char *path, fmoe__imatrix **out);
void fmoe__imatrix_close(fmoe__imatrix *m);

/* The importance of GGUF tensor `name`'s columns, [experts][cols] (experts 1 for a 2-D
 * weight), as llama-quantize normalises it: sums / round(count) per expert, 1 where an
 * expert's count is 0. @return 0 and *out a malloc'd array (the caller frees it), or 0 and
 * *out NULL when the file has no entry for `name`; FMOE_EFORMAT when its size is not
 * cols · experts (llama-quantize's error too), FMOE_ENOMEM. */
int fmoe__imatrix_get(const fmoe__imatrix *m, const char *name, int64_t cols, int64_t experts,
                      float **out);

#endif
