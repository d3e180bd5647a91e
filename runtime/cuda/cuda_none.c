/* cuda_none.c - the CUDA entry points of a build without CUDA: they say so. */
#include "fmoe/cuda.h"
#include "fmoe/error.h"

int fmoe_cuda_compiled(void) { return 0; }
int fmoe_cuda_device_count(void) { return 0; }
const char *fmoe_cuda_describe(void) { return "not compiled (built without CUDA)"; }
int fmoe_cuda_selftest(int n) {
    (void)n;
    return fmoe_error_set(FMOE_EUNSUPPORTED, "fmoe was built without CUDA");
}

/* Calibration (fmoe calibrate) without CUDA. */
int fmoe_cuda_calibrate_h2d(const int64_t *sizes, int32_t n, int32_t reps, double *seconds) {
    (void)sizes, (void)n, (void)reps, (void)seconds;
    return fmoe_error_set(FMOE_EUNSUPPORTED, "fmoe was built without CUDA");
}
int fmoe_cuda_calibrate_d2d(int64_t bytes, int32_t reps, double *bytes_per_s) {
    (void)bytes, (void)reps, (void)bytes_per_s;
    return fmoe_error_set(FMOE_EUNSUPPORTED, "fmoe was built without CUDA");
}
int fmoe_cuda_calibrate_gemms(const int32_t *rows, const int32_t *cols, int32_t mats,
                              const int32_t *tokens, int32_t n, int32_t reps, double *seconds) {
    (void)rows, (void)cols, (void)mats, (void)tokens, (void)n, (void)reps, (void)seconds;
    return fmoe_error_set(FMOE_EUNSUPPORTED, "fmoe was built without CUDA");
}
int fmoe_cuda_calibrate_attention(int32_t heads, int32_t kv_heads, int32_t head_dim,
                                  const int32_t *tokens, const int32_t *contexts, int32_t n,
                                  int32_t reps, double *seconds) {
    (void)heads, (void)kv_heads, (void)head_dim, (void)tokens, (void)contexts, (void)n,
        (void)reps, (void)seconds;
    return fmoe_error_set(FMOE_EUNSUPPORTED, "fmoe was built without CUDA");
}
