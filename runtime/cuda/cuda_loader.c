/*
 * cuda_loader.c - the fmoe/cuda.h entry points on the host side. They load the CUDA
 * backend, libfmoe-cuda.so, with dlopen on first use (see cuda_module.h for why it is
 * not linked in) and forward to its table. In a build without CUDA, or where the module
 * cannot be loaded (no CUDA runtime or driver on this machine), they say so.
 *
 * Where the module is looked for, in order: $FMOE_CUDA_MODULE; next to the build tree's
 * fmoe binary (<build>/runtime/libfmoe-cuda.so); the installed <libdir>/fmoe/.
 */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../backend/backend_impl.h"
#include "cuda_module.h"
#include "fmoe/cuda.h"
#include "fmoe/error.h"
#include "fmoe_config.h"

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static const fmoe_cuda_module_api *module;
static char load_error[512];

#if FMOE_HAVE_CUDA
static void *open_candidate(const char *path) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        /* keep the first informative reason (a missing file is the least informative) */
        if (!load_error[0] || strstr(load_error, "No such file"))
            snprintf(load_error, sizeof load_error, "%.500s", why ? why : path);
    }
    return h;
}
#endif

static void load_module(void) {
#if FMOE_HAVE_CUDA
    char candidates[3][PATH_MAX];
    int n = 0;
    const char *env = getenv("FMOE_CUDA_MODULE");
    if (env && *env) snprintf(candidates[n++], PATH_MAX, "%s", env);
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            snprintf(candidates[n++], PATH_MAX, "%.3800s/../runtime/libfmoe-cuda.so", exe);
        }
    }
    snprintf(candidates[n++], PATH_MAX, "%s/libfmoe-cuda.so", FMOE_CUDA_MODULE_DIR);
    for (int i = 0; i < n && !module; i++) {
        if (i > 0 && access(candidates[i], F_OK) != 0) continue;
        void *h = open_candidate(candidates[i]);
        if (!h) continue;
        fmoe_cuda_module_api_fn get = (fmoe_cuda_module_api_fn)dlsym(h, FMOE_CUDA_MODULE_SYMBOL);
        const fmoe_cuda_module_api *api = get ? get() : NULL;
        if (!api) {
            snprintf(load_error, sizeof load_error, "%.400s: not an fmoe CUDA module",
                     candidates[i]);
            dlclose(h);
            continue;
        }
        if (api->abi != FMOE_CUDA_MODULE_ABI) {
            /* Most often a stale build: meson 1.0 tracks no header a .cu file includes, so
             * an incremental build can keep objects compiled from older headers. */
            snprintf(load_error, sizeof load_error,
                     "%.300s: module of ABI %d, this binary needs ABI %d: rebuild the module "
                     "(delete its objects, runtime/libfmoe-cuda.so.p/*.o, then build)",
                     candidates[i], api->abi, FMOE_CUDA_MODULE_ABI);
            dlclose(h);
            continue;
        }
        if (api->backend_layout != FMOE_CUDA_BACKEND_LAYOUT) {
            snprintf(load_error, sizeof load_error,
                     "%.300s: built from other fmoe headers (backend struct layout %#llx, "
                     "this binary's %#llx): rebuild the two together",
                     candidates[i], (unsigned long long)api->backend_layout,
                     (unsigned long long)FMOE_CUDA_BACKEND_LAYOUT);
            dlclose(h);
            continue;
        }
        module = api; /* the handle stays open for the life of the process */
    }
    if (!module && !load_error[0])
        snprintf(load_error, sizeof load_error, "libfmoe-cuda.so not found (set FMOE_CUDA_MODULE)");
#else
    snprintf(load_error, sizeof load_error, "fmoe was built without CUDA");
#endif
}

static const fmoe_cuda_module_api *get_module(void) {
    pthread_once(&load_once, load_module);
    return module;
}

static int unavailable(void) {
    return fmoe_error_set(FMOE_EUNSUPPORTED, "CUDA backend unavailable: %s", load_error);
}

/* Re-raises the module's error detail in this thread. */
static int forward(int rc) {
    if (rc < 0) fmoe_error_set(rc, "%s", module->error_detail());
    return rc;
}

int fmoe_cuda_compiled(void) { return FMOE_HAVE_CUDA; }

int fmoe_cuda_device_count(void) { return get_module() ? module->device_count() : 0; }

const char *fmoe_cuda_describe(void) {
    static char text[640];
    if (!FMOE_HAVE_CUDA) return "not compiled (built without CUDA)";
    if (!get_module()) {
        snprintf(text, sizeof text, "compiled, not loadable here (%s)", load_error);
        return text;
    }
    return module->describe();
}

int fmoe_cuda_selftest(int n) {
    if (!get_module()) return unavailable();
    return forward(module->selftest(n));
}

int fmoe_cuda_calibrate_h2d(const int64_t *sizes, int32_t n, int32_t reps, double *seconds) {
    if (!get_module()) return unavailable();
    return forward(module->calibrate_h2d(sizes, n, reps, seconds));
}

int fmoe_cuda_calibrate_d2d(int64_t bytes, int32_t reps, double *bytes_per_s) {
    if (!get_module()) return unavailable();
    return forward(module->calibrate_d2d(bytes, reps, bytes_per_s));
}

/* ---------------------------------------------------------------------------------- */
/* The backend table                                                                  */
/* ---------------------------------------------------------------------------------- */

/*
 * The module's fmoe__backend_ops, with the entries that can fail wrapped: the module sets
 * its error detail in its own copy of lib/error.c, so a wrapper re-raises it in the
 * calling thread's (the entries that return nothing record a sticky error that the next
 * download or sync returns, and so reach a wrapper too).
 */
#if FMOE_HAVE_CUDA
static const fmoe__backend_ops *inner;
static fmoe__backend_ops outer;
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static int w_init(const fmoe__backend_limits *limits, void **ctx) {
    return forward(inner->init(limits, ctx));
}

static void *w_alloc(void *ctx, int64_t bytes) {
    void *p = inner->alloc(ctx, bytes);
    if (!p) fmoe_error_set(FMOE_ENOMEM, "%s", module->error_detail());
    return p;
}

static int w_download(void *ctx, void *dst, const void *src, int64_t bytes) {
    return forward(inner->download(ctx, dst, src, bytes));
}

static int w_sync(void *ctx) { return forward(inner->sync(ctx)); }

static int w_elapsed(void *ctx, int32_t a, int32_t b, double *seconds) {
    return forward(inner->elapsed(ctx, a, b, seconds));
}

static int w_write_slot(void *ctx, void *dst, const void *src, int64_t bytes) {
    return forward(inner->write_slot(ctx, dst, src, bytes));
}

static int w_host_register(void *ctx, void *p, int64_t bytes) {
    return forward(inner->host_register(ctx, p, bytes));
}

static void *w_fence_new(void *ctx) {
    void *f = inner->fence_new(ctx);
    if (!f) fmoe_error_set(FMOE_ENOMEM, "%s", module->error_detail());
    return f;
}

static int w_fence_record(void *ctx, void *fence) {
    return forward(inner->fence_record(ctx, fence));
}

static int w_fence_wait(void *ctx, void *fence) { return forward(inner->fence_wait(ctx, fence)); }

static void make_table(void) {
    inner = module->backend_ops ? module->backend_ops() : NULL;
    if (!inner) return;
    outer = *inner;
    outer.init = w_init;
    outer.alloc = w_alloc;
    outer.download = w_download;
    outer.sync = w_sync;
    outer.elapsed = w_elapsed;
    outer.write_slot = w_write_slot;
    outer.host_register = w_host_register;
    outer.fence_new = w_fence_new;
    outer.fence_record = w_fence_record;
    outer.fence_wait = w_fence_wait;
}
#endif

const fmoe__backend_ops *fmoe__cuda_backend(void) {
    if (!get_module()) { /* load_module wrote why, "fmoe was built without CUDA" included */
        unavailable();
        return NULL;
    }
#if FMOE_HAVE_CUDA
    /* "no CUDA device", or a driver older than the runtime (which a device count alone
     * reports as no device). */
    if (module->backend_probe() < 0) {
        fmoe_error_set(FMOE_EUNSUPPORTED, "CUDA backend unavailable: %s", module->error_detail());
        return NULL;
    }
    pthread_once(&table_once, make_table);
    if (!inner) {
        fmoe_error_set(FMOE_EINTERNAL, "CUDA module has no backend table");
        return NULL;
    }
    return &outer;
#else
    return NULL; /* not reached: get_module() is NULL without CUDA */
#endif
}
