/*
 * calibrate.c - the CPU measurements behind `fmoe calibrate` and the fit that turns them
 * into a hardware profile (fmoe/hardware.h; the CUDA measurements are runtime/cuda/
 * cuda_calibrate.cu).
 *
 * Every measurement times one operation at a time with CLOCK_MONOTONIC and keeps the
 * median of its runs: at least `reps`, more while the point has taken under MIN_POINT_S
 * in total (small copies take microseconds; one run would be noise), at most MAX_REPS.
 * Buffers are touched before timing so that page faults are not measured.
 *
 * The matcher test times the fMoE trajectory search (fmoe/expertmap.h) the way the fmoe
 * policy runs it: a full store, one query stepping through every layer.
 *
 * The file test measures what an expert load from a model file costs when the model does
 * not fit in RAM: a scratch file is written and synced, and before every read the page
 * cache of the file is dropped (posix_fadvise DONTNEED works for unprivileged users on
 * clean pages), so each pread goes to the device. On tmpfs nothing can be dropped and the
 * caller is told so. Both file tests read as the live file tier does: each read split into
 * segments kept `depth` requests deep (lib/preader.h), so the link they measure is the one
 * a live run at that --read-depth sees.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "fmoe/error.h"
#include "fmoe/expertmap.h"
#include "files.h"
#include "fmoe/hardware.h"
#include "fmoe/predictor.h"
#include "monotonic.h"
#include "preader.h"

#define MIN_POINT_S 0.02
#define MAX_REPS 1000
#define TMPFS_MAGIC_ 0x01021994

/* ------------------------------------------------------------------ fit */

int fmoe_calibrate_fit(const double *x, const double *y, int32_t n, fmoe_linear_fit *out) {
    memset(out, 0, sizeof *out);
    FMOE_RETURN_ERROR_IF(n < 2, FMOE_EINVAL, "fit: %d points, need at least 2", n);
    double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (int32_t i = 0; i < n; i++) {
        FMOE_RETURN_ERROR_IF(!(y[i] > 0) || !isfinite(x[i]), FMOE_EINVAL,
                             "fit: point %d is (%g, %g)", i, x[i], y[i]);
        const double w = 1.0 / (y[i] * y[i]);
        sw += w;
        sx += w * x[i];
        sy += w * y[i];
        sxx += w * x[i] * x[i];
        sxy += w * x[i] * y[i];
    }
    const double det = sw * sxx - sx * sx;
    FMOE_RETURN_ERROR_IF(!(fabs(det) > 1e-300 * sw * sxx), FMOE_EINVAL,
                         "fit: all %d points have the same x", n);
    out->b = (sw * sxy - sx * sy) / det;
    out->a = (sy - out->b * sx) / sw;
    out->n = n;
    double se = 0;
    for (int32_t i = 0; i < n; i++) {
        const double r = fabs(out->a + out->b * x[i] - y[i]) / y[i];
        se += r * r;
        if (r > out->max_rel) out->max_rel = r;
    }
    out->rms_rel = sqrt(se / n);
    return 0;
}

/* ------------------------------------------------------------------ copies */

int fmoe_calibrate_copy_ram(const int64_t *sizes, int32_t n, int32_t reps, double *seconds) {
    int64_t max = 0;
    for (int32_t i = 0; i < n; i++) {
        FMOE_RETURN_ERROR_IF(sizes[i] < 1, FMOE_EINVAL, "copy size %lld", (long long)sizes[i]);
        if (sizes[i] > max) max = sizes[i];
    }
    if (reps < 1) reps = 1;
    char *src = malloc((size_t)max), *dst = malloc((size_t)max);
    double *t = malloc(MAX_REPS * sizeof *t);
    if (!src || !dst || !t) {
        free(src);
        free(dst);
        free(t);
        return fmoe_error_set(FMOE_ENOMEM, "copy buffers of %lld bytes", (long long)max);
    }
    memset(src, 1, (size_t)max);
    memset(dst, 2, (size_t)max);
    for (int32_t i = 0; i < n; i++) {
        int32_t k = 0;
        double total = 0;
        while (k < MAX_REPS && (k < reps || total < MIN_POINT_S)) {
            const double t0 = fmoe__now_s();
            memcpy(dst, src, (size_t)sizes[i]);
            t[k] = fmoe__now_s() - t0;
            total += t[k++];
            src[k % max] ^= dst[(k * 7) % max]; /* keep the copies observable */
        }
        seconds[i] = fmoe__median(t, k);
    }
    free(src);
    free(dst);
    free(t);
    return 0;
}

/* Exactly `bytes` of fd at `at` into buf through the reader. @return 0 or -1 with errno
 * set (EIO when the file ends first). */
static int read_deep(fmoe__preader *p, int fd, void *buf, int64_t bytes, int64_t at,
                     int64_t align) {
    fmoe__pread_extent x = {.fd = fd, .offset = at, .bytes = bytes, .dst = buf};
    if (fmoe__preader_read(p, &x, 1, align) == 0) return 0;
    errno = x.err ? x.err : EIO;
    return -1;
}

int fmoe_calibrate_read_file(const char *path, const int64_t *sizes, int32_t n, int32_t reps,
                             int32_t depth, double *seconds) {
    enum { ALIGN = 4096 };
    fmoe__preader *rd = NULL;
    FMOE_FORWARD_IF_ERROR(fmoe__preader_open(&rd, depth > 0 ? depth : FMOE_PREADER_DEFAULT_DEPTH));
    /* a regular file first (lib/files.h: a FIFO would block this open), then O_DIRECT,
     * which Linux lets fcntl set */
    const int fd = fmoe__open_regular(path);
    if (fd < 0) {
        fmoe__preader_close(rd);
        return fd;
    }
    const int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_DIRECT) != 0) {
        const int e = errno;
        close(fd);
        fmoe__preader_close(rd);
        return fmoe_error_set(FMOE_EIO, "%s: cannot open with O_DIRECT: %s", path, strerror(e));
    }
    struct stat st;
    int rc = fstat(fd, &st) == 0 ? 0 : fmoe_error_set(FMOE_EIO, "%s: %s", path, strerror(errno));
    const int64_t file = rc == 0 ? (int64_t)st.st_size / ALIGN * ALIGN : 0;
    int64_t max = 0;
    for (int32_t i = 0; rc == 0 && i < n; i++) {
        const int64_t len = (sizes[i] + ALIGN - 1) / ALIGN * ALIGN;
        if (sizes[i] < 1 || len > file)
            rc = fmoe_error_set(FMOE_EINVAL, "%s: %lld bytes, too small for reads of %lld",
                                path, (long long)file, (long long)sizes[i]);
        max = len > max ? len : max;
    }
    if (reps < 1) reps = 1;
    void *buf = rc == 0 ? aligned_alloc(ALIGN, (size_t)max) : NULL;
    double *t = malloc((size_t)reps * (size_t)(n > 0 ? n : 1) * sizeof *t);
    if (rc == 0 && (!buf || !t)) rc = fmoe_error_set(FMOE_ENOMEM, "read buffer of %lld bytes", (long long)max);
    /* Repetition-major: each repetition reads every size once, so a device whose speed
     * drifts over the seconds this takes (a shared virtual disk) slows every size alike
     * instead of bending the fit through the sizes measured in its slow moment. */
    for (int32_t k = -1; rc == 0 && k < reps; k++) { /* k = -1: untimed */
        for (int32_t i = 0; rc == 0 && i < n; i++) {
            const int64_t len = (sizes[i] + ALIGN - 1) / ALIGN * ALIGN;
            const int64_t span = file - len + ALIGN; /* offsets [0, span) in ALIGN steps */
            const int64_t at =
                ((int64_t)(k + 1) * (len + (1 << 20)) + (int64_t)i * (7 << 20)) % span / ALIGN *
                ALIGN;
            const double t0 = fmoe__now_s();
            if (read_deep(rd, fd, buf, len, at, ALIGN) < 0) {
                rc = fmoe_error_set(FMOE_EIO, "%s: reading %lld bytes at %lld: %s", path,
                                    (long long)len, (long long)at, strerror(errno));
                break;
            }
            if (k >= 0) t[(size_t)i * (size_t)reps + (size_t)k] = fmoe__now_s() - t0;
        }
    }
    for (int32_t i = 0; rc == 0 && i < n; i++) seconds[i] = fmoe__median(t + (size_t)i * (size_t)reps, reps);
    close(fd);
    fmoe__preader_close(rd);
    free(buf);
    free(t);
    return rc;
}

int fmoe_calibrate_copy_file(const char *dir, const int64_t *sizes, int32_t n, int32_t reps,
                             int32_t depth, double *seconds, fmoe_file_cache *cache) {
    int64_t max = 0;
    for (int32_t i = 0; i < n; i++) {
        FMOE_RETURN_ERROR_IF(sizes[i] < 1, FMOE_EINVAL, "read size %lld", (long long)sizes[i]);
        if (sizes[i] > max) max = sizes[i];
    }
    if (reps < 1) reps = 1;
    /* Each timed read gets its own region, so a read never benefits from the one before
     * (read-ahead included): the file holds `slots` regions of the largest size. */
    const int32_t slots = reps + 1;
    const int64_t file_bytes = max * slots;
    char path[4096];
    snprintf(path, sizeof path, "%s/fmoe-calibrate-%ld.tmp", dir && dir[0] ? dir : "/tmp",
             (long)getpid());
    const int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        return fmoe_error_set(FMOE_EIO, "%s: cannot create the scratch file: %s", path,
                              strerror(errno));
    unlink(path); /* gone when closed, even if we are killed */
    fmoe__preader *rd = NULL;
    int rc = fmoe__preader_open(&rd, depth > 0 ? depth : FMOE_PREADER_DEFAULT_DEPTH);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    const size_t chunk = (size_t)(4 << 20);
    char *buf = malloc(chunk > (size_t)max ? chunk : (size_t)max);
    double *t = malloc((size_t)reps * sizeof *t);
    if (!buf || !t) {
        rc = fmoe_error_set(FMOE_ENOMEM, "read buffer of %lld bytes", (long long)max);
        goto done;
    }
    for (size_t i = 0; i < chunk; i++) buf[i] = (char)(i * 131 + 7);
    for (int64_t off = 0; off < file_bytes; off += (int64_t)chunk) {
        const size_t len = (size_t)(file_bytes - off < (int64_t)chunk ? file_bytes - off : (int64_t)chunk);
        /* A full disk first shows as a short write without errno; only writing the rest
         * returns the reason (ENOSPC, EFBIG). Reporting errno after a short write printed
         * whatever an earlier call had left there. */
        for (size_t done_ = 0; done_ < len;) {
            const ssize_t w = pwrite(fd, buf + done_, len - done_, off + (int64_t)done_);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) {
                rc = fmoe_error_set(FMOE_EIO, "%s: writing %lld bytes of scratch data: %s",
                                    path, (long long)file_bytes,
                                    strerror(w < 0 ? errno : ENOSPC));
                goto done;
            }
            done_ += (size_t)w;
        }
    }
    if (fdatasync(fd) != 0) {
        rc = fmoe_error_set(FMOE_EIO, "%s: fdatasync: %s", path, strerror(errno));
        goto done;
    }
    struct statfs sf;
    const int tmpfs = fstatfs(fd, &sf) == 0 && (unsigned long)sf.f_type == TMPFS_MAGIC_;
    int dropped = !tmpfs;
    for (int32_t i = 0; i < n; i++) {
        for (int32_t k = 0; k < reps; k++) {
            if (!tmpfs && posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) != 0) dropped = 0;
            const int64_t off = (int64_t)k * max;
            const double t0 = fmoe__now_s();
            fmoe__pread_extent x = {.fd = fd, .offset = off, .bytes = sizes[i], .dst = buf};
            if (fmoe__preader_read(rd, &x, 1, 1) != 0) {
                rc = fmoe_error_set(FMOE_EIO, "%s: reading %lld bytes at %lld: %s", path,
                                    (long long)sizes[i], (long long)off,
                                    x.err ? strerror(x.err) : "end of file");
                goto done;
            }
            t[k] = fmoe__now_s() - t0;
        }
        seconds[i] = fmoe__median(t, reps);
    }
    *cache = tmpfs ? FMOE_FILE_CACHE_TMPFS : dropped ? FMOE_FILE_CACHE_DROPPED
                                                     : FMOE_FILE_CACHE_WARM;
done:
    close(fd);
    fmoe__preader_close(rd);
    free(buf);
    free(t);
    return rc;
}

/* ------------------------------------------------------------------ matcher */

int fmoe_calibrate_matcher(int32_t layers, int32_t experts, int32_t top_k, int32_t capacity,
                           int32_t reps, double *match_s, double *search_s) {
    FMOE_RETURN_ERROR_IF(layers < 1 || experts < 1 || capacity < 1, FMOE_EINVAL,
                         "matcher timing: %d layers x %d experts, %d entries", layers, experts,
                         capacity);
    if (top_k < 1 || top_k > experts) top_k = experts < 2 ? experts : 2;
    if (reps < 1) reps = 1;
    const fmoe_expertmap_config cfg = {.capacity = capacity, .num_layers = layers,
                                       .num_experts = experts, .top_k = top_k,
                                       .prefetch_distance = layers > 3 ? 3 : layers - 1};
    enum { QUERIES = 16 };
    const size_t LJ = (size_t)layers * (size_t)experts;
    fmoe_expertmap *s = NULL;
    fmoe_matcher *m = NULL;
    float *map = malloc((QUERIES + 1) * LJ * sizeof *map);
    double *t = malloc(MAX_REPS * sizeof *t);
    int rc = 0;
    if (!map || !t) {
        rc = fmoe_error_set(FMOE_ENOMEM, "matcher timing over %d entries", capacity);
        goto done;
    }
    if ((rc = fmoe_expertmap_init(&s, &cfg)) < 0 || (rc = fmoe_matcher_init(&m, s, 1)) < 0)
        goto done;
    /* A full store of softmax-like rows (sharpened, so that entries differ), and queries
     * of the same kind: the search does the same work whatever the values are. */
    uint32_t x = 2463534242u;
    for (int32_t y = 0; y < capacity + QUERIES; y++) {
        float *row = y < capacity ? map : map + (size_t)(y - capacity + 1) * LJ;
        for (size_t r = 0; r < (size_t)layers; r++) {
            float *p = row + r * (size_t)experts;
            double sum = 0;
            for (int32_t j = 0; j < experts; j++) {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                const float v = (float)(x & 0xffff) / 65536.0f;
                p[j] = v * v * v * v + 1e-6f;
                sum += p[j];
            }
            for (int32_t j = 0; j < experts; j++) p[j] = (float)(p[j] / sum);
        }
        if (y < capacity && (rc = fmoe_expertmap_set(s, y, NULL, map, 0)) < 0) goto done;
    }
    /* One trajectory (a decode token through every layer) per run: the step of each
     * layer is one match. Warm the caches first: the store is what every match reads. */
    int32_t best = 0;
    float score = 0;
    int32_t k = 0;
    double total = 0;
    for (int32_t warm = -1; k < MAX_REPS && (k < reps || total < MIN_POINT_S); warm = 0) {
        const float *q = map + (size_t)(1 + (k % QUERIES)) * LJ;
        const double t0 = fmoe__now_s();
        fmoe_matcher_trajectory_begin(m, 1);
        for (int32_t l = 0; l < layers; l++)
            fmoe_matcher_trajectory_add(m, l, q + (size_t)l * experts, experts, &best, &score);
        const double dt = fmoe__now_s() - t0;
        if (warm < 0) continue;
        t[k] = dt;
        total += t[k++];
    }
    const double per_token = fmoe__median(t, k);
    if (search_s) *search_s = per_token;
    if (match_s) *match_s = per_token / layers;
done:
    fmoe_matcher_free(m);
    fmoe_expertmap_free(s);
    free(map);
    free(t);
    return rc;
}

/* ------------------------------------------------------------------ learned predictor */

/* One token's pass of a learned predictor, as its policy runs it (no BLAS, one thread). */
typedef struct pass {
    const fmoe_mlp *mlp;              /* ProMoE's, or */
    fmoe_mlp_work *work;
    const fmoe_expert_mlp *emlp;      /* DuoServe's ExpertMLP */
    fmoe_expert_mlp_work *ework;
    const float *x;
    float *logits;
} pass;

static void run_pass(const pass *p) {
    if (p->mlp) fmoe_mlp_infer(p->mlp, p->work, p->x, 1);
    else fmoe_expert_mlp_infer(p->emlp, p->ework, p->x, 1, p->logits);
}

/* The median of at least `reps` passes (more while under MIN_POINT_S), after one to warm
 * the caches, into *pass_s. x[in] gets a fixed input first. */
static int time_passes(pass *p, float *x, int32_t in, int32_t reps, double *pass_s) {
    double *t = malloc(MAX_REPS * sizeof *t);
    if (!t) return fmoe_error_set(FMOE_ENOMEM, "predictor timing");
    for (int32_t i = 0; i < in; i++) x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    p->x = x;
    int32_t k = 0;
    double total = 0;
    if (reps < 1) reps = 1;
    for (int32_t warm = -1; k < MAX_REPS && (k < reps || total < MIN_POINT_S); warm = 0) {
        const double t0 = fmoe__now_s();
        run_pass(p);
        const double dt = fmoe__now_s() - t0;
        if (warm < 0) continue;
        t[k] = dt;
        total += t[k++];
    }
    *pass_s = fmoe__median(t, k);
    free(t);
    return 0;
}

int fmoe_calibrate_predictor(int32_t in, int32_t hidden, int32_t out, int32_t reps,
                             double *pass_s) {
    FMOE_RETURN_ERROR_IF(in < 1 || hidden < 1 || out < 1, FMOE_EINVAL,
                         "predictor timing: %d -> %d -> %d", in, hidden, out);
    fmoe_mlp mlp = {0};
    fmoe_mlp_work work = {0};
    float *x = malloc((size_t)in * sizeof *x);
    int rc = x ? 0 : fmoe_error_set(FMOE_ENOMEM, "predictor timing: %d -> %d -> %d", in,
                                    hidden, out);
    if (rc == 0 && (rc = fmoe_mlp_init(&mlp, in, hidden, out)) == 0 &&
        (rc = fmoe_mlp_work_init(&work, &mlp, 1)) == 0) {
        fmoe_mlp_randomize(&mlp, 1); /* the pass does the same work whatever the values */
        pass p = {.mlp = &mlp, .work = &work};
        rc = time_passes(&p, x, in, reps, pass_s);
    }
    fmoe_mlp_work_free(&work);
    fmoe_mlp_free(&mlp);
    free(x);
    return rc;
}

int fmoe_calibrate_duoserve(int32_t layers, int32_t experts, int32_t reps, double *pass_s) {
    FMOE_RETURN_ERROR_IF(layers < 1 || experts < 1, FMOE_EINVAL,
                         "predictor timing: %d layers x %d experts", layers, experts);
    int32_t widths[FMOE_EXPERT_MLP_MAX_FC + 1];
    const int32_t fc = fmoe_duoserve_widths(layers, experts, 0, widths);
    fmoe_expert_mlp mlp;
    memset(&mlp, 0, sizeof mlp);
    fmoe_expert_mlp_work work;
    memset(&work, 0, sizeof work);
    float *x = malloc((size_t)widths[0] * sizeof *x);
    float *logits = malloc((size_t)experts * sizeof *logits);
    int rc = x && logits ? 0 : fmoe_error_set(FMOE_ENOMEM, "predictor timing");
    if (rc == 0 && (rc = fmoe_expert_mlp_init(&mlp, fc, widths)) == 0 &&
        (rc = fmoe_expert_mlp_work_init(&work, &mlp, 1)) == 0) {
        fmoe_expert_mlp_randomize(&mlp, 1);
        pass p = {.emlp = &mlp, .ework = &work, .logits = logits};
        rc = time_passes(&p, x, widths[0], reps, pass_s);
    }
    fmoe_expert_mlp_work_free(&work);
    fmoe_expert_mlp_free(&mlp);
    free(x);
    free(logits);
    return rc;
}
