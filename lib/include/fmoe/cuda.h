/*
 * fmoe/cuda.h - the plain-C face of the CUDA backend (runtime/cuda/). Core code never
 * includes CUDA headers (STYLE.md rule 10). When fmoe is built without CUDA these
 * functions exist and report that.
 */
#ifndef FMOE_CUDA_H
#define FMOE_CUDA_H

/* @return 1 when this build contains the CUDA backend, else 0. */
int fmoe_cuda_compiled(void);

/* Number of usable CUDA devices (0 when none or not compiled); never fails. */
int fmoe_cuda_device_count(void);

/* One line describing the CUDA build and device 0, e.g. "CUDA 13.0, cuBLAS 13.0, 1 device
 * (NVIDIA H100)" or "not compiled". Static storage. */
const char *fmoe_cuda_describe(void);

/*
 * Runs the SwiGLU kernel and a cuBLAS sgemm on device 0 over n deterministic values and
 * compares them with the plain-C reference. @return 0 (match), FMOE_EUNSUPPORTED (no
 * device or not compiled) or FMOE_EMISMATCH / FMOE_EINTERNAL with a detail.
 */
int fmoe_cuda_selftest(int n);

#endif
