/*
 * fmoe/cuda.h - the plain-C face of the CUDA backend (runtime/cuda/). Core code never
 * includes CUDA headers: CUDA builds only where meson finds it. When fmoe is built without
 * CUDA these functions exist and report that.
 */
#ifndef FMOE_CUDA_H
#define FMOE_CUDA_H

#include <stdint.h>

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

/* ---------------------------------------------------------------- calibration
 *
 * The GPU measurements of `fmoe calibrate` (runtime/cuda/cuda_calibrate.cu), on device 0.
 * Each point is the median of at least `reps` runs (more while the point has taken under
 * 20 ms, at most 1000), timed with CUDA events, in seconds. They allocate what they time.
 * @return 0, FMOE_EUNSUPPORTED (not compiled, or no device), FMOE_EINVAL, FMOE_ENOMEM or
 * FMOE_EINTERNAL (a CUDA or cuBLAS call failed: the detail names it).
 */

/* cudaMemcpyAsync host-to-device from pinned (cudaMallocHost) memory, sizes[n] bytes. */
int fmoe_cuda_calibrate_h2d(const int64_t *sizes, int32_t n, int32_t reps, double *seconds);

/* Device-to-device copies of `bytes`; *bytes_per_s counts the bytes read and written. */
int fmoe_cuda_calibrate_d2d(int64_t bytes, int32_t reps, double *bytes_per_s);

#endif
