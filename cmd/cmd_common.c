/* cmd_common.c - error reporting, option parsing, progress bar and log sink for cmd/. */
#include "cmd_common.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fmoe/error.h"
#include "fmoe/log.h"
#include "fmoe/tokenizer.h"
#include "fmoe/trace.h"
#include "files.h"
#include "fmoe_config.h"

int cmd_fail(const char *cmd, int code) {
    const char *detail = fmoe_error_detail();
    fprintf(stderr, "fmoe %s: %s\n", cmd, detail[0] ? detail : fmoe_strerror(code));
    return CMD_EXIT_FAILURE;
}

/* "fmoe CMD: message[ (see 'fmoe CMD --help')]" on one line. @return code. */
static int say(const char *cmd, int code, int hint, const char *fmt, va_list ap) {
    fprintf(stderr, "fmoe %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    if (hint) fprintf(stderr, " (see 'fmoe %s --help')", cmd);
    fputc('\n', stderr);
    return code;
}

int cmd_failf(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const int rc = say(cmd, CMD_EXIT_FAILURE, 0, fmt, ap);
    va_end(ap);
    return rc;
}

int cmd_check_chat_template(const char *cmd, const char *name) {
    if (!name) return 0;
    const char *const *names = fmoe_chat_template_names();
    char list[256] = "";
    for (size_t i = 0; names[i]; i++) {
        if (strcmp(names[i], name) == 0) return 0;
        size_t used = strlen(list);
        snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", names[i]);
    }
    return cmd_usage_error(cmd, "unknown --chat-template '%s' (valid: %s)", name, list);
}

int cmd_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const int rc = say(cmd, CMD_EXIT_USAGE, 1, fmt, ap);
    va_end(ap);
    return rc;
}

int cmd_refuse(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const int rc = say(cmd, CMD_EXIT_USAGE, 0, fmt, ap);
    va_end(ap);
    return rc;
}

int cmd_parse_i64(const char *cmd, const char *option, const char *text, int64_t min,
                  int64_t max, int64_t *out) {
    char *end = NULL;
    errno = 0;
    long long v = text ? strtoll(text, &end, 10) : 0;
    if (!text || !*text || *end || errno == ERANGE)
        return cmd_usage_error(cmd, "value '%s' of %s is not an integer", text ? text : "",
                               option);
    if (v < min || v > max)
        return cmd_usage_error(cmd, "%s must be in [%lld, %lld], got %lld", option,
                               (long long)min, (long long)max, v);
    *out = v;
    return 0;
}

int cmd_parse_i32(const char *cmd, const char *option, const char *text, int32_t min,
                  int32_t max, int32_t *out) {
    int64_t v;
    int rc = cmd_parse_i64(cmd, option, text, min, max, &v);
    if (rc == 0) *out = (int32_t)v;
    return rc;
}

int cmd_parse_f64(const char *cmd, const char *option, const char *text, double min,
                  double max, double *out) {
    char *end = NULL;
    errno = 0;
    double v = text ? strtod(text, &end) : 0;
    if (!text || !*text || *end || errno == ERANGE || !isfinite(v))
        return cmd_usage_error(cmd, "value '%s' of %s is not a number", text ? text : "", option);
    if (v < min || v > max)
        return cmd_usage_error(cmd, "%s must be in [%g, %g], got %g", option, min, max, v);
    *out = v;
    return 0;
}

int cmd_on_compression(const char *cmd, const cmd_option *opt, void *base, const char *value) {
    if (fmoe_compression_parse(value, cmd_opt_target(opt, base)) < 0)
        return cmd_usage_error(cmd, "--%s must be zstd, deflate or none, got '%s'", opt->name,
                               value);
    return 0;
}

int64_t cmd_peak_rss_bytes(void) {
    char *text = NULL;
    size_t len = 0;
    if (fmoe__read_file_bounded("/proc/self/status", "a status file", 1 << 20, 0, &text, &len) < 0)
        return 0;
    const char *hwm = strstr(text, "VmHWM:");
    long long kib = 0;
    if (!hwm || sscanf(hwm, "VmHWM: %lld kB", &kib) != 1) kib = 0;
    free(text);
    return (int64_t)kib * 1024;
}

double cmd_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ------------------------------------------------------------------ progress bar */

static void progress_draw(void *ctx, int64_t done, int64_t total, const char *unit) {
    cmd_progress_bar *bar = ctx;
    if (!bar->enabled) return;
    double now = cmd_now();
    int finished = total > 0 && done >= total;
    if (!finished && now - bar->last_draw < 0.1) return; /* at most 10 redraws a second */
    bar->last_draw = now;
    bar->drawn = 1;
    double elapsed = now - bar->started;
    double rate = elapsed > 0 ? (double)done / elapsed : 0.0;
    if (total > 0) {
        const int width = 30;
        double frac = (double)done / (double)total;
        if (frac > 1) frac = 1;
        int fill = (int)(frac * width);
        char cells[64];
        for (int i = 0; i < width; i++) cells[i] = i < fill ? '#' : '.';
        cells[width] = '\0';
        double eta = rate > 0 ? (double)(total - done) / rate : 0.0;
        fprintf(stderr, "\r%s [%s] %3.0f%% %lld/%lld %s, %.0f %s/s, eta %.0fs   ", bar->label,
                cells, 100.0 * frac, (long long)done, (long long)total, unit, rate, unit, eta);
    } else {
        fprintf(stderr, "\r%s %lld %s, %.0f %s/s   ", bar->label, (long long)done, unit, rate,
                unit);
    }
    fflush(stderr);
}

void cmd_progress_bar_init(cmd_progress_bar *bar, const char *label, int quiet) {
    memset(bar, 0, sizeof *bar);
    bar->label = label;
    bar->enabled = !quiet && isatty(STDERR_FILENO);
    bar->started = cmd_now();
}

fmoe_progress cmd_progress_bar_callback(cmd_progress_bar *bar) {
    return (fmoe_progress){.fn = progress_draw, .ctx = bar};
}

void cmd_progress_bar_done(cmd_progress_bar *bar) {
    if (bar->enabled && bar->drawn) {
        fprintf(stderr, "\r\033[K");
        fflush(stderr);
    }
    bar->drawn = 0;
}

/* ------------------------------------------------------------------ logging */

static void log_to_stderr(void *ctx, fmoe_log_level level, const char *message) {
    int verbose = (int)(intptr_t)ctx;
    if (level < FMOE_LOG_WARN && !verbose) return;
    static const char *names[] = {"debug", "info", "warning", "error"};
    fprintf(stderr, "fmoe: %s: %s\n", names[level], message);
}

void cmd_install_log_sink(int verbose) {
    fmoe_log_set_sink(log_to_stderr, (void *)(intptr_t)verbose);
}

/* ------------------------------------------------------------------ paths */

static int exe_dir(char *buf, size_t cap) {
    ssize_t n = readlink("/proc/self/exe", buf, cap - 1);
    if (n <= 0) return -1;
    buf[n] = '\0';
    char *slash = strrchr(buf, '/');
    if (!slash) return -1;
    *slash = '\0';
    return 0;
}

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

const char *cmd_plugin_dir(void) {
    static char dir[PATH_MAX];
    char exe[PATH_MAX], probe[PATH_MAX + 64];
    if (exe_dir(exe, sizeof exe) == 0) {
        /* run from the build tree: <build>/cmd/fmoe next to <build>/trace/libh5zstd.so */
        snprintf(probe, sizeof probe, "%s/../trace/libh5zstd.so", exe);
        if (is_file(probe) && realpath(probe, dir)) {
            *strrchr(dir, '/') = '\0';
            return dir;
        }
    }
    snprintf(dir, sizeof dir, "%s", FMOE_PLUGIN_DIR);
    return dir;
}

const char *cmd_samples_dir(void) {
    static char dir[PATH_MAX];
    char exe[PATH_MAX], probe[PATH_MAX + 64];
    const char *env = getenv("FMOE_SAMPLES_DIR");
    if (env && is_dir(env)) return env;
    if (exe_dir(exe, sizeof exe) == 0) {
        snprintf(probe, sizeof probe, "%s/../datasets/samples", exe); /* build tree */
        if (is_dir(probe) && realpath(probe, dir)) return dir;
    }
    snprintf(probe, sizeof probe, "%s/datasets/samples", FMOE_SOURCE_DIR);
    if (is_dir(probe) && realpath(probe, dir)) return dir;
    snprintf(probe, sizeof probe, "%s", FMOE_DATA_DIR "/samples");
    if (is_dir(probe) && realpath(probe, dir)) return dir;
    return NULL;
}

const char *cmd_format_bytes(double n, char *buf, size_t cap) {
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (n >= 1024.0 && u < 4) {
        n /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, cap, "%.0f B", n);
    else
        snprintf(buf, cap, "%.2f %s", n, units[u]);
    return buf;
}

void cmd_decision_log_meta(char *buf, size_t cap, const char *policy, int32_t cache_experts,
                           int32_t prefetch_distance, int32_t copy_chunks) {
    snprintf(buf, cap,
             "{\"policy\":\"%s\",\"cache_experts\":%d,\"prefetch_distance\":%d,"
             "\"copy_chunks\":%d}",
             policy, cache_experts, prefetch_distance, copy_chunks);
}

const char *const cmd_feedback_names[] = {"auto", "on", "off", NULL};

int cmd_print_json(void *doc) {
    char *text = cJSON_Print(doc);
    cJSON_Delete(doc);
    if (!text) return -1;
    printf("%s\n", text);
    free(text);
    return 0;
}

/* ------------------------------------------------------------------ signals */

static char remove_paths[4][4096];
static volatile sig_atomic_t remove_count;

static void remove_and_die(int sig) {
    for (int i = 0; i < remove_count; i++) unlink(remove_paths[i]);
    signal(sig, SIG_DFL); /* the signal is blocked in here: it lands when we return */
    raise(sig);
}

int cmd_remove_on_signal(const char *const *paths, int n) {
    remove_count = 0;
    int k = 0;
    for (int i = 0; i < n && k < 4; i++)
        if (paths[i] && strlen(paths[i]) < sizeof remove_paths[0])
            memcpy(remove_paths[k++], paths[i], strlen(paths[i]) + 1);
    remove_count = k;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = remove_and_die;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGINT);
    sigaddset(&sa.sa_mask, SIGTERM);
    sigaddset(&sa.sa_mask, SIGHUP);
    if (sigaction(SIGINT, &sa, NULL) != 0 || sigaction(SIGTERM, &sa, NULL) != 0 ||
        sigaction(SIGHUP, &sa, NULL) != 0)
        return -1;
    return 0;
}
