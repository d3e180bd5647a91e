/*
 * fmoe/hardware.h - hardware profiles: the link and compute figures the simulator's cost
 * model needs (docs/design.md §7). Implemented in sim/hardware.c.
 *
 * A profile is JSON (written by `fmoe calibrate`, or by hand):
 *
 *     {
 *       "format": "fmoe-hardware", "version": 1,
 *       "name": "my-box",
 *       "source": "where the figures come from",
 *       "link":    {"alpha_s": 1.0e-5, "beta_bytes_per_s": 2.4e10},
 *       "device":  {"peak_flops": 7.1e13, "memory_bandwidth_bytes_per_s": 9.36e11,
 *                   "launch_s": 5e-6},
 *       "compute": {"attention_s": {"base": 1e-4, "per_token": 1e-6, "per_token_context": 0},
 *                   "expert_s":    {"base": 2e-4, "per_token": 5e-7},
 *                   "head_s":      {"base": 1e-4, "per_token": 0},
 *                   "layer_overhead_s": {"base": 6e-5, "per_token": 1e-7}},
 *       "host":    {"expert_s": {"base": 3e-3, "per_token": 2e-4},
 *                   "peak_flops": 1.5e12, "memory_bandwidth_bytes_per_s": 1e11}
 *     }
 *
 * "link" is required: a copy of b bytes takes alpha_s + b / beta_bytes_per_s.
 * "compute" holds measured linear models, per MoE layer (attention, gate, shared experts:
 * everything but the routed experts) and per routed expert, for n tokens at context c:
 *     layer  = base + per_token * n + per_token_context * n * c
 *     expert = base + per_token * n
 * and, optional, per iteration that yields a token (each decode step, the prefill's last
 * chunk): head = base + per_token (the final norm and the LM head over the vocabulary for
 * that one token; absent: 0, as in the presets, whose GPUs make it negligible), and
 * per MoE layer of n tokens: layer_overhead = base + per_token * n, what a live pass pays
 * besides the products, attention and experts (its small ops, the routing read back to
 * the host and the waits that takes; runtime/model/backend_bench.c; absent: 0, and
 * nothing is added).
 * Either part may be absent; what is absent falls back to a roofline from "device"
 * (max(FLOPs / peak_flops, bytes / memory_bandwidth) + launch_s), so "device" is required
 * unless both compute parts are given. "host" is optional: the CPU that computes missed
 * experts under `--miss cpu` (measured host.expert_s, else a roofline from its peak_flops
 * and memory bandwidth). Other fields (e.g. calibrate's "calibration" record) are ignored.
 * Errors name the file and the missing field.
 */
#ifndef FMOE_HARDWARE_H
#define FMOE_HARDWARE_H

#include <stddef.h>
#include <stdint.h>

#define FMOE_HARDWARE_FORMAT "fmoe-hardware"
#define FMOE_HARDWARE_VERSION 1

typedef struct fmoe_linear_cost {
    int32_t present;            /* 0: use the roofline */
    double base_s;
    double per_token_s;
    double per_token_context_s; /* attention only */
} fmoe_linear_cost;

typedef struct fmoe_hardware_profile {
    char name[64];
    char source[512];
    double alpha_s;                   /* per-copy latency, seconds */
    double beta_bytes_per_s;          /* host-to-device copy bandwidth */
    double peak_flops;                /* dense FLOP/s at the model dtype; 0 = unknown */
    double memory_bandwidth_bytes_per_s; /* device memory; 0 = unknown */
    double launch_s;                  /* fixed cost per kernel group (roofline only) */
    fmoe_linear_cost attention;       /* per MoE layer, all but routed experts */
    fmoe_linear_cost expert;          /* per routed expert */
    fmoe_linear_cost head;            /* per token-yielding iteration (absent: 0) */
    fmoe_linear_cost layer_overhead;  /* per MoE layer besides its compute (absent: 0) */
    fmoe_linear_cost host_expert;     /* per routed expert computed on the host CPU */
    double host_peak_flops;           /* host roofline; 0 = unknown */
    double host_memory_bandwidth_bytes_per_s;
    /* "matcher": {"match_s": x}: the fMoE matcher's time per match on this machine
     * (optional, 0 = free); see fmoe_sim_costs.match_delay_s. */
    double match_s;
    /* "predictor": {"promoe_s": x, "duoserve_s": y}: one token's pass of a learned
     * predictor of fmoe train-predictor's default shape for the model on this machine:
     * ProMoE's MLP (--kind promoe), DuoServe-MoE's ExpertMLP (--kind duoserve); each
     * optional, 0 = free; see fmoe_sim_costs.promoe_delay_s, duoserve_delay_s. */
    double promoe_s;
    double duoserve_s;
} fmoe_hardware_profile;

/* Fills `out` with a built-in preset. Names: fmoe_hardware_preset_names().
 * @return 0 or FMOE_ENOTFOUND (detail lists the presets). */
int fmoe_hardware_preset(const char *name, fmoe_hardware_profile *out);

/* "rtx3090-pcie4, a5000-pcie4, ..." */
const char *fmoe_hardware_preset_names(void);

/* Parses profile JSON (`len` bytes); `origin` names it in errors (a path or "<string>").
 * @return 0, FMOE_EFORMAT (malformed, missing or wrong-typed field), FMOE_ERANGE (a value
 * that must be positive is not). */
int fmoe_hardware_parse(const char *json, size_t len, const char *origin,
                        fmoe_hardware_profile *out);

/* Reads and parses a profile file. @return as parse, or FMOE_EIO. */
int fmoe_hardware_load(const char *path, fmoe_hardware_profile *out);

/* Writes the profile as JSON into a malloc'd string (*out; caller frees).
 * @return 0 or FMOE_ENOMEM. */
int fmoe_hardware_to_json(const fmoe_hardware_profile *p, char **out);

/* ---------------------------------------------------------------- calibration
 *
 * The measurements behind `fmoe calibrate` (implemented in sim/calibrate.c; the CUDA ones
 * are in fmoe/cuda.h). Each times one operation per size and reports the median of at
 * least `reps` runs (more while a point has taken under 20 ms in total, up to 1000), in
 * seconds. They read the clock and allocate what they time (never in a simulation);
 * not thread-safe with each other (OpenBLAS runs its own threads).
 */

/* y = a + b·x fitted by least squares weighted by 1/y² (relative error, so 4 KB copies
 * count as much as 64 MB ones), with the fit's relative errors |fit - y| / y. */
typedef struct fmoe_linear_fit {
    double a, b;        /* intercept, slope */
    double rms_rel;     /* root mean square relative error */
    double max_rel;     /* largest relative error */
    int32_t n;          /* points */
} fmoe_linear_fit;

/* @return 0, FMOE_EINVAL (fewer than 2 points, a y <= 0, all x equal). */
int fmoe_calibrate_fit(const double *x, const double *y, int32_t n, fmoe_linear_fit *out);

/* memcpy between two RAM buffers, for each of sizes[n] bytes. */
int fmoe_calibrate_copy_ram(const int64_t *sizes, int32_t n, int32_t reps, double *seconds);

/* Where a file read's bytes came from. */
typedef enum fmoe_file_cache {
    FMOE_FILE_CACHE_DROPPED = 0, /* the page cache was dropped before each read: the device */
    FMOE_FILE_CACHE_TMPFS = 1,   /* the directory is in RAM (tmpfs): reads are RAM copies */
    FMOE_FILE_CACHE_WARM = 2,    /* dropping failed: reads may come from the page cache */
    FMOE_FILE_CACHE_DIRECT = 3,  /* O_DIRECT: no page cache (fmoe_calibrate_read_file) */
} fmoe_file_cache;

/* Reads of sizes[n] bytes (each rounded up to 4 KiB) from an existing file `path` - the
 * model's own safetensors file, the slow tier a live `--tier file --direct-io` run reads -
 * with O_DIRECT into an aligned buffer, at offsets spread over the file (read k of a size
 * at k·size + k·1 MiB, wrapped), the median of `reps` reads (after one untimed) each, taken
 * repetition-major (every size once per repetition, so drift slows them alike). What
 * the live run's reads see, including a virtual disk's host-side caching of that file,
 * which a fresh scratch file does not show. Each read is split and kept `depth` requests
 * deep exactly as the live file tier reads at --read-depth (lib/preader.h; 0: its
 * default), so the link measured is the one the live engine sees. @return 0,
 * FMOE_EINVAL (a size above the file's, a depth out of range), FMOE_EIO (cannot open or
 * read: the detail names the file), FMOE_ENOMEM. */
int fmoe_calibrate_read_file(const char *path, const int64_t *sizes, int32_t n, int32_t reps,
                             int32_t depth, double *seconds);

/* pread of sizes[n] bytes from a scratch file written in `dir` (removed afterwards),
 * dropping the file's page cache before every read (posix_fadvise DONTNEED after
 * fdatasync) so that the device is measured. *cache says what was achieved. Reads are
 * kept `depth` requests deep as fmoe_calibrate_read_file's. @return 0, FMOE_EINVAL (a
 * depth out of range), FMOE_EIO (cannot write or read the scratch file: detail names it),
 * FMOE_ENOMEM. */
int fmoe_calibrate_copy_file(const char *dir, const int64_t *sizes, int32_t n, int32_t reps,
                             int32_t depth, double *seconds, fmoe_file_cache *cache);

/* The fMoE matcher (fmoe/expertmap.h) on this CPU: a full store of `capacity` random maps
 * of layers x experts, one query at a time stepping through every layer (the trajectory
 * search of a decode token), at least `reps` trajectories (more while under 20 ms). The
 * median trajectory's time per layer goes to *match_s (one match: the profile's
 * matcher.match_s), the whole trajectory's to *search_s (either may be NULL).
 * @return 0, FMOE_EINVAL, FMOE_ENOMEM. */
int fmoe_calibrate_matcher(int32_t layers, int32_t experts, int32_t top_k, int32_t capacity,
                           int32_t reps, double *match_s, double *search_s);

/* A ProMoE predictor pass (fmoe/predictor.h fmoe_mlp_infer, as the promoe policy runs it)
 * of one token through an MLP in -> hidden -> out of random weights on this CPU: the
 * median of at least `reps` passes (more while under 20 ms) into *pass_s (the profile's
 * predictor.promoe_s). @return 0, FMOE_EINVAL, FMOE_ENOMEM. */
int fmoe_calibrate_predictor(int32_t in, int32_t hidden, int32_t out, int32_t reps,
                             double *pass_s);

/* The same for DuoServe-MoE's ExpertMLP of the default widths for `layers` MoE layers of
 * `experts` (fmoe_duoserve_widths; fmoe_expert_mlp_infer, as the duoserve policy runs it):
 * *pass_s is the profile's predictor.duoserve_s. */
int fmoe_calibrate_duoserve(int32_t layers, int32_t experts, int32_t reps, double *pass_s);

#endif
