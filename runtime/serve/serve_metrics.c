/*
 * serve_metrics.c - the server's Prometheus metrics in text exposition format 0.0.4.
 *
 * Histograms keep one count per fixed bucket (non-cumulative, so an observation is one
 * increment) and are made cumulative when rendered, as the format wants `le` buckets.
 * HTTP status counters are an array over the codes 100..599: no allocation when a new code
 * shows up. Every family gets its # HELP and # TYPE lines even with no samples yet, so a
 * scraper sees the same families from the first scrape.
 */
#include "serve_metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"

/* Seconds. Latencies of whole requests span milliseconds (a cached short answer) to a
 * minute (a long answer under load); inter-token gaps are milliseconds, seconds at worst
 * when an expert load stalls. */
static const double latency_le[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                    1,     2.5,  5,     10,   30,  60};
static const double itl_le[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075,
                                0.1,   0.15,   0.2,   0.3,  0.5,   1,    2.5, 5};
#define NLAT (sizeof latency_le / sizeof latency_le[0])
#define NITL (sizeof itl_le / sizeof itl_le[0])
#define MAX_BUCKETS 16

typedef struct histogram {
    const char *name, *help;
    const double *le; /* [n] upper bounds; +Inf is implicit */
    size_t n;
    int64_t counts[MAX_BUCKETS + 1]; /* [n + 1] per bucket, not cumulative; last: +Inf */
    double sum;
} histogram;

enum { H_TTFT, H_ITL, H_E2E, H_QUEUE, NUM_HIST };
enum { MIN_CODE = 100, MAX_CODE = 599 };

struct serve_metrics {
    pthread_mutex_t mu;
    histogram h[NUM_HIST];
    int64_t prompt_tokens, generation_tokens;
    int64_t cached_tokens; /* prompt tokens served from the prefix cache */
    int64_t finished[SERVE_FINISH_ERROR + 1];         /* by serve_finish */
    int64_t http[MAX_CODE - MIN_CODE + 1];            /* by status code - MIN_CODE */
    int64_t trace_failures;
    char *model_name;
};

serve_metrics *fmoe_serve_metrics_new(void) {
    serve_metrics *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    if (pthread_mutex_init(&m->mu, NULL) != 0) {
        free(m);
        return NULL;
    }
    m->h[H_TTFT] = (histogram){"fmoe_time_to_first_token_seconds",
                               "Time from a request's arrival to its first generated token.",
                               latency_le, NLAT, {0}, 0};
    m->h[H_ITL] = (histogram){"fmoe_inter_token_latency_seconds",
                              "Time between consecutive generated tokens of a request.",
                              itl_le, NITL, {0}, 0};
    m->h[H_E2E] = (histogram){"fmoe_request_latency_seconds",
                              "Time from a request's arrival to its end.", latency_le, NLAT,
                              {0}, 0};
    m->h[H_QUEUE] = (histogram){"fmoe_request_queue_time_seconds",
                                "Time a request waited before its first forward pass.",
                                latency_le, NLAT, {0}, 0};
    return m;
}

void fmoe_serve_metrics_free(serve_metrics *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m->model_name);
    free(m);
}

static void observe(serve_metrics *m, int which, double s) {
    if (!m || !(s >= 0)) return; /* NaN and negative durations are clock trouble: dropped */
    histogram *h = &m->h[which];
    size_t b = 0;
    while (b < h->n && s > h->le[b]) b++;
    pthread_mutex_lock(&m->mu);
    h->counts[b]++;
    h->sum += s;
    pthread_mutex_unlock(&m->mu);
}

void fmoe_serve_metrics_observe_ttft(serve_metrics *m, double s) { observe(m, H_TTFT, s); }
void fmoe_serve_metrics_observe_itl(serve_metrics *m, double s) { observe(m, H_ITL, s); }
void fmoe_serve_metrics_observe_e2e(serve_metrics *m, double s) { observe(m, H_E2E, s); }
void fmoe_serve_metrics_observe_queue(serve_metrics *m, double s) { observe(m, H_QUEUE, s); }

void fmoe_serve_metrics_add_tokens(serve_metrics *m, int64_t prompt, int64_t generated) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += prompt > 0 ? prompt : 0;
    m->generation_tokens += generated > 0 ? generated : 0;
    pthread_mutex_unlock(&m->mu);
}

void fmoe_serve_metrics_add_cached_tokens(serve_metrics *m, int64_t cached) {
    if (!m || cached <= 0) return;
    pthread_mutex_lock(&m->mu);
    m->cached_tokens += cached;
    pthread_mutex_unlock(&m->mu);
}

void fmoe_serve_metrics_request_done(serve_metrics *m, int32_t finish) {
    if (!m || finish < SERVE_FINISH_STOP || finish > SERVE_FINISH_ERROR) return;
    pthread_mutex_lock(&m->mu);
    m->finished[finish]++;
    pthread_mutex_unlock(&m->mu);
}

void fmoe_serve_metrics_http_status(serve_metrics *m, int code) {
    if (!m || code < MIN_CODE || code > MAX_CODE) return;
    pthread_mutex_lock(&m->mu);
    m->http[code - MIN_CODE]++;
    pthread_mutex_unlock(&m->mu);
}

void fmoe_serve_metrics_trace_failure(serve_metrics *m) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->trace_failures++;
    pthread_mutex_unlock(&m->mu);
}

int fmoe_serve_metrics_set_model_name(serve_metrics *m, const char *name) {
    if (!m) return 0;
    char *copy = NULL;
    if (name && !(copy = strdup(name)))
        return fmoe_error_set(FMOE_ENOMEM, "serve metrics: out of memory");
    pthread_mutex_lock(&m->mu);
    free(m->model_name);
    m->model_name = copy;
    pthread_mutex_unlock(&m->mu);
    return 0;
}

size_t fmoe_serve_metrics_escape_label(const char *v, char *out, size_t cap) {
    size_t need = 0, at = 0;
    int full = 0;
    for (const char *p = v ? v : ""; *p; p++) {
        const char *e = *p == '\\' ? "\\\\" : *p == '"' ? "\\\"" : *p == '\n' ? "\\n" : NULL;
        size_t k = e ? 2 : 1;
        need += k;
        if (full || at + k + 1 > cap) {
            full = 1;
            continue;
        }
        if (e) memcpy(out + at, e, 2);
        else out[at] = *p;
        at += k;
    }
    if (cap) out[at] = '\0';
    return need;
}

/* ---------------------------------------------------------------------------------------
 * Rendering into a growing buffer
 * ------------------------------------------------------------------------------------ */

typedef struct buf {
    char *s;
    size_t len, cap;
    int failed;
} buf;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void bprintf(buf *b, const char *fmt, ...) {
    if (b->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = 1;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)n + 1;
        char *s = realloc(b->s, cap);
        if (!s) {
            b->failed = 1;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
}

/* The shortest %g form that reads back as v (Prometheus parses Go floats). */
static const char *fmt_float(double v, char out[32]) {
    if (isinf(v)) return v > 0 ? "+Inf" : "-Inf";
    if (isnan(v)) return "NaN";
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(out, 32, "%.*g", prec, v);
        if (strtod(out, NULL) == v) break;
    }
    return out;
}

static void family(buf *b, const char *name, const char *type, const char *help) {
    bprintf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void render_histogram(buf *b, const histogram *h) {
    family(b, h->name, "histogram", h->help);
    int64_t cum = 0;
    char f[32];
    for (size_t i = 0; i <= h->n; i++) {
        cum += h->counts[i];
        bprintf(b, "%s_bucket{le=\"%s\"} %lld\n", h->name,
                i < h->n ? fmt_float(h->le[i], f) : "+Inf", (long long)cum);
    }
    bprintf(b, "%s_sum %s\n%s_count %lld\n", h->name, fmt_float(h->sum, f), h->name,
            (long long)cum);
}

/* One per-layer family: `get` reads the value of layer l. */
static void render_layers(buf *b, const char *name, const char *type, const char *help,
                          const serve_layer_counters *layers, int32_t n,
                          double (*get)(const serve_layer_counters *)) {
    family(b, name, type, help);
    char f[32];
    for (int32_t l = 0; l < n; l++)
        bprintf(b, "%s{layer=\"%d\"} %s\n", name, (int)l, fmt_float(get(&layers[l]), f));
}

static double l_hits(const serve_layer_counters *c) { return (double)c->hits; }
static double l_misses(const serve_layer_counters *c) { return (double)c->misses; }
static double l_late(const serve_layer_counters *c) { return (double)c->late; }
static double l_issued(const serve_layer_counters *c) { return (double)c->prefetch_issued; }
static double l_useful(const serve_layer_counters *c) { return (double)c->prefetch_useful; }
static double l_bytes(const serve_layer_counters *c) { return (double)c->load_bytes; }
static double l_resident(const serve_layer_counters *c) { return (double)c->resident; }
static double l_stall(const serve_layer_counters *c) { return c->stall_s; }

int fmoe_serve_metrics_render(serve_metrics *m, const serve_engine_gauges *g,
                         const serve_layer_counters *layers, int32_t num_layers, char **out,
                         size_t *len) {
    buf b = {malloc(8192), 0, 8192, 0};
    if (!b.s) return fmoe_error_set(FMOE_ENOMEM, "serve metrics: out of memory");
    b.s[0] = '\0';

    if (m) {
        /* A consistent snapshot: copy under the lock, format outside it. */
        pthread_mutex_lock(&m->mu);
        struct serve_metrics snap = *m;
        char *name = m->model_name ? strdup(m->model_name) : NULL;
        int name_oom = m->model_name && !name;
        pthread_mutex_unlock(&m->mu);
        if (name_oom) b.failed = 1;

        for (int i = 0; i < NUM_HIST; i++) render_histogram(&b, &snap.h[i]);
        family(&b, "fmoe_prompt_tokens_total", "counter", "Prompt tokens of finished prefills.");
        bprintf(&b, "fmoe_prompt_tokens_total %lld\n", (long long)snap.prompt_tokens);
        family(&b, "fmoe_generation_tokens_total", "counter", "Generated tokens.");
        bprintf(&b, "fmoe_generation_tokens_total %lld\n", (long long)snap.generation_tokens);
        family(&b, "fmoe_prefix_cache_hit_tokens_total", "counter",
               "Prompt tokens not run: their keys and values were kept from an earlier "
               "request with the same prefix.");
        bprintf(&b, "fmoe_prefix_cache_hit_tokens_total %lld\n", (long long)snap.cached_tokens);
        family(&b, "fmoe_requests_total", "counter", "Finished requests by finish reason.");
        static const char *const reasons[] = {NULL, "stop", "length", "cancelled", "error"};
        for (int f = SERVE_FINISH_STOP; f <= SERVE_FINISH_ERROR; f++)
            bprintf(&b, "fmoe_requests_total{finish_reason=\"%s\"} %lld\n", reasons[f],
                    (long long)snap.finished[f]);
        family(&b, "fmoe_http_requests_total", "counter", "HTTP responses by status code.");
        for (int c = MIN_CODE; c <= MAX_CODE; c++)
            if (snap.http[c - MIN_CODE])
                bprintf(&b, "fmoe_http_requests_total{code=\"%d\"} %lld\n", c,
                        (long long)snap.http[c - MIN_CODE]);
        family(&b, "fmoe_trace_write_failures_total", "counter",
               "Requests failed (507) or refused (503) because the trace (--trace-out) could "
               "not record them.");
        bprintf(&b, "fmoe_trace_write_failures_total %lld\n", (long long)snap.trace_failures);
        if (name) {
            size_t need = fmoe_serve_metrics_escape_label(name, NULL, 0);
            char *esc = malloc(need + 1);
            if (esc) {
                fmoe_serve_metrics_escape_label(name, esc, need + 1);
                family(&b, "fmoe_model_info", "gauge", "The served model (always 1).");
                bprintf(&b, "fmoe_model_info{model=\"%s\"} 1\n", esc);
            } else {
                b.failed = 1;
            }
            free(esc);
            free(name);
        }
    }

    family(&b, "fmoe_requests_running", "gauge", "Requests in the running batch.");
    bprintf(&b, "fmoe_requests_running %d\n", g ? (int)g->running : 0);
    family(&b, "fmoe_requests_waiting", "gauge", "Requests queued for a batch slot.");
    bprintf(&b, "fmoe_requests_waiting %d\n", g ? (int)g->waiting : 0);
    family(&b, "fmoe_prefix_cache_bytes", "gauge",
           "KV memory kept for prompt prefixes beyond the sequence slots (--prefix-cache-gb).");
    bprintf(&b, "fmoe_prefix_cache_bytes %lld\n", g ? (long long)g->prefix_cache_bytes : 0);
    family(&b, "fmoe_prefix_cache_tokens", "gauge", "Tokens those kept prefixes hold.");
    bprintf(&b, "fmoe_prefix_cache_tokens %lld\n", g ? (long long)g->prefix_cache_tokens : 0);
    family(&b, "fmoe_prefix_cache_evictions_total", "counter",
           "Kept prefixes replaced by another conversation's.");
    bprintf(&b, "fmoe_prefix_cache_evictions_total %lld\n",
            g ? (long long)g->prefix_cache_evictions : 0);

    int32_t L = layers ? num_layers : 0;
    render_layers(&b, "fmoe_expert_cache_hits_total", "counter",
                  "Expert accesses served from the cache, per MoE layer.", layers, L, l_hits);
    render_layers(&b, "fmoe_expert_cache_misses_total", "counter",
                  "Expert accesses that had to load the expert, per MoE layer.", layers, L,
                  l_misses);
    render_layers(&b, "fmoe_expert_cache_late_total", "counter",
                  "Expert accesses that waited for a prefetch in flight, per MoE layer.", layers,
                  L, l_late);
    render_layers(&b, "fmoe_expert_prefetch_issued_total", "counter",
                  "Expert prefetches issued, per MoE layer.", layers, L, l_issued);
    render_layers(&b, "fmoe_expert_prefetch_useful_total", "counter",
                  "Prefetched experts used before eviction, per MoE layer.", layers, L, l_useful);
    render_layers(&b, "fmoe_expert_load_bytes_total", "counter",
                  "Bytes of expert weights loaded, per MoE layer.", layers, L, l_bytes);
    render_layers(&b, "fmoe_expert_cache_resident", "gauge",
                  "Experts of the layer resident now.", layers, L, l_resident);
    render_layers(&b, "fmoe_expert_stall_seconds_total", "counter",
                  "Time the forward pass waited for expert loads, per MoE layer.", layers, L,
                  l_stall);

    if (b.failed) {
        free(b.s);
        return fmoe_error_set(FMOE_ENOMEM, "serve metrics: out of memory");
    }
    *out = b.s;
    *len = b.len;
    return 0;
}
