/*
 * simulate_units.c - `fmoe simulate`'s units: one trace on one hardware profile, read and
 * compiled into a workload, and its cells (simulate_impl.h).
 */
#include <cjson/cJSON.h>
#include <glob.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <errno.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>

#include "cmd_common.h"
#include "plot_svg.h"
#include "paths.h"
#include "simulate_store.h" /* the fmoe policies' expert-map store */
#include "policy_opts.h"    /* --policy-opt and its shorthands */
#include "sweep.h"          /* --sweep-out, --resume, MPI ranks */
#include "fmoe/datasets.h"
#include "fmoe/decision_log.h"
#include "fmoe/error.h"
#include "files.h"
#include "sha256.h"
#include "fmoe/geometry.h"
#include "fmoe/gguf.h"
#include "fmoe/hardware.h"
#include "fmoe/policy.h"
#include "fmoe/predictor.h"
#include "fmoe/sim.h"
#include "fmoe/trace.h"
#include "simulate_impl.h"

static const char *const CMD = SIM_CMD;

/* ------------------------------------------------------------------ units */


void simulate_unit_free(sim_unit *u) {
    free(u->arrivals);
    free(u->es.layers);
    fmoe_sim_workload_free(&u->w);
    cmd_sim_store_free(&u->store);
    for (int i = 0; i < MAX_PREDICTORS; i++) fmoe_predictor_free(u->predictors[i]);
}

/* The options as they apply to unit u (the helpers above read o->trace, o->profile, ...). */
options simulate_unit_options(const options *o, const sim_unit *u) {
    options uo = *o;
    uo.trace = u->trace;
    uo.profile = u->profile;
    uo.hardware = u->hardware;
    return uo;
}

/* Grows the cell list to hold `more` cells. @return 0 or 1 (printed). */
static int reserve_cells(fmoe_sim_config **cells, size_t n, size_t *cap, size_t more) {
    if (n + more <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < n + more) c *= 2;
    fmoe_sim_config *g = realloc(*cells, c * sizeof *g);
    if (!g) return cmd_failf(CMD, "out of memory");
    *cells = g;
    *cap = c;
    return 0;
}

/* What --sweep-out keys a trace's cells by besides its path, so that a trace replaced
 * under the same path is not taken for the one the file's cells ran on: sha256 of the
 * header's `created` time, model fingerprint and dataset, and of the routing replayed
 * (every token's chosen experts, and the requests' token counts), as read. Hashing the
 * file would cost a pass over gigabytes on every resume; the routing is in memory already
 * and is what the cells computed from, and `created` (a new one for every recording and
 * import) covers the gate probabilities and embeddings, which are not hashed. */
static void trace_identity(const fmoe_trace_header *h, const fmoe_sim_workload *w,
                           char hex[65]) {
    fmoe_sha256 s;
    fmoe_sha256_init(&s);
    fmoe_sha256_update(&s, h->created, strlen(h->created) + 1);
    fmoe_sha256_update(&s, h->model_fingerprint, strlen(h->model_fingerprint) + 1);
    fmoe_sha256_update(&s, h->dataset, strlen(h->dataset) + 1);
    const int64_t shape[4] = {w->num_requests, w->num_tokens, w->num_layers, w->top_k};
    fmoe_sha256_update(&s, shape, sizeof shape);
    for (int64_t r = 0; r < w->num_requests; r++) {
        const int64_t n[2] = {w->requests[r].prompt_tokens, w->requests[r].output_tokens};
        fmoe_sha256_update(&s, n, sizeof n);
    }
    fmoe_sha256_update(&s, w->experts,
                       (size_t)w->num_tokens * (size_t)w->num_layers * (size_t)w->top_k *
                           sizeof *w->experts);
    uint8_t d[32];
    fmoe_sha256_final(&s, d);
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", d[i]);
}

/* What the unit's policies need of its trace (the gate rows, served passes, the store's
 * semantic rows: `want`), checked against its header; the predictors, the store and the
 * cost model loaded. @return 0, 1 or 2 (printed). */
static int prepare_inputs(const options *o, sim_unit *u, fmoe_trace_reader *reader,
                          uint32_t *want) {
    const fmoe_trace_header *h = fmoe_trace_reader_header(reader);
    int exit_code, rc;
    if ((exit_code = simulate_gate_needs(o, h, want))) return exit_code;
    if ((exit_code = simulate_check_distances(o, h->num_layers))) return exit_code;
    if ((exit_code = simulate_load_predictors(o, h, u->predictors))) return exit_code;
    if (o->batch_trace) { /* the served passes: only a trace of fmoe serve has them */
        if (!h->served)
            return cmd_failf(CMD,
                             "%s: --batch trace needs a trace of fmoe serve --trace-out "
                             "(no /tokens/served_iteration)",
                             o->trace);
        *want |= FMOE_SIM_WANT_SERVED;
    }
    exit_code = cmd_sim_store_prepare(CMD, &u->store, o->policies, o->n_policies, o->trace,
                                      reader, want, o->quiet); /* may add the semantic rows */
    if (exit_code) return exit_code;
    rc = simulate_load_costs(o, reader, &u->costs, &u->expert_bytes, &u->es, &u->hw);
    if (rc < 0) return cmd_fail(CMD, rc);
    cmd_sim_store_costs(&u->store, &u->costs); /* --match-delay */
    if (o->miss_mode != FMOE_SIM_MISS_LOAD && !fmoe_sim_costs_have_host(&u->costs))
        return cmd_failf(CMD,
                         "%s: --miss %s needs host compute figures (host.expert_s, or "
                         "host.peak_flops and host.memory_bandwidth_bytes_per_s); measure "
                         "them with 'fmoe calibrate' and pass --profile",
                         o->profile ? o->profile : u->hw.name, simulate_miss_name(o->miss_mode));
    return 0;
}

/* Cache sizes in slots: --cache-experts as given, then each --cache-gb in experts of
 * expert_bytes. @return 0 or 2 (printed). */
static int cache_slots(const options *o, int64_t expert_bytes, int32_t caches[MAX_LIST],
                       int *n_caches) {
    *n_caches = o->n_caches;
    memcpy(caches, o->caches, sizeof o->caches);
    for (int i = 0; i < o->n_cache_gb; i++) {
        const double slots = floor(o->cache_gb[i] * 1073741824.0 / (double)expert_bytes);
        if (slots < 1) {
            char b[32];
            return cmd_usage_error(CMD, "--cache-gb %g holds no expert (one is %s)",
                                   o->cache_gb[i],
                                   cmd_format_bytes((double)expert_bytes, b, sizeof b));
        }
        caches[(*n_caches)++] = slots > INT32_MAX ? INT32_MAX : (int32_t)slots;
    }
    return 0;
}

/* The workload as the policies want it (--holdout's rows kept out), with the gate inputs
 * for promoe's predictor and, with --model-config, the model's expert sizes. @return 0 or
 * 1 (printed). */
static int read_workload(const options *o, sim_unit *u, fmoe_trace_reader *reader,
                         uint32_t want) {
    cmd_progress_bar bar;
    cmd_progress_bar_init(&bar, "reading trace", o->quiet);
    fmoe_progress p = cmd_progress_bar_callback(&bar);
    int rc = fmoe_sim_workload_read_filtered(&u->w, reader, want, u->store.keep, &p); /* --holdout */
    if (rc == 0 && simulate_needs_hidden(o)) /* the gate inputs, for promoe's predictor */
        rc = fmoe_sim_workload_read_hidden(&u->w, reader, u->store.keep);
    cmd_progress_bar_done(&bar);
    if (rc < 0) {
        if (!strstr(fmoe_error_detail(), o->trace)) fmoe_error_prefix("%s", o->trace);
        return cmd_fail(CMD, rc);
    }
    if (o->sweep_out) trace_identity(fmoe_trace_reader_header(reader), &u->w, u->trace_id);
    if (o->model_config) { /* its size, not the trace's, per layer as it stores them */
        u->w.expert_bytes = u->expert_bytes;
        for (int32_t l = 0; l < u->w.num_layers; l++)
            u->w.layer_expert_bytes[l] = u->es.layers ? u->es.layers[l] : u->expert_bytes;
    }
    return 0;
}

/* The byte counters are int64: each access loads at most one expert, and each iteration's
 * layer prefetches at most J, so loads <= A + I*L*J. Refuse a size that could overflow
 * them (a trace imported elsewhere with an absurd expert size) instead of printing
 * negative bytes; 2^60 keeps an 8x margin. @return 0 or 1 (printed). */
static int check_byte_counters(const options *o, const sim_unit *u) {
    const int64_t expert_bytes = u->expert_bytes;
    const double loads = (double)u->w.num_accesses +
                         (double)u->w.num_iterations * u->w.num_layers * (double)u->w.num_experts;
    if (expert_bytes > MAX_EXPERT_BYTES || (double)expert_bytes * loads > 0x1p60) {
        char b[32];
        return cmd_failf(CMD,
                         "%s: an expert of %lld bytes (%s) is too large to count its "
                         "loads over %.0f accesses; at most %s",
                         o->trace, (long long)expert_bytes,
                         cmd_format_bytes((double)expert_bytes, b, sizeof b),
                         (double)u->w.num_accesses, "1 TiB and 2^60 bytes in all");
    }
    return 0;
}

/* The iterations fmoe serve --parallel B would run (--batch B), or those it ran (--batch
 * trace), in place of the requests one at a time. @return 0, 1 or 2 (printed). */
static int batch_workload(const options *o, sim_unit *u) {
    if (!(o->batch > 1 || o->batch_trace)) return 0;
    fmoe_sim_workload batched;
    /* the budget: the option, else what the server ran with (its trace's chunk) */
    const int32_t budget = o->batch_tokens         ? o->batch_tokens
                           : u->w.prefill_chunk > 0 ? u->w.prefill_chunk
                                                    : FMOE_BATCH_TOKENS;
    if (!o->batch_trace && o->batch > budget)
        return cmd_usage_error(CMD,
                               "%s: --batch %d exceeds the trace's %d tokens a pass "
                               "(its prefill_chunk); give --batch-tokens",
                               o->trace, (int)o->batch, (int)budget);
    int rc = o->batch_trace ? fmoe_sim_workload_served(&batched, &u->w)
                            : fmoe_sim_workload_batch(&batched, &u->w, o->batch, budget,
                                                      u->arrivals, &u->costs);
    if (rc < 0) {
        if (!strstr(fmoe_error_detail(), o->trace)) fmoe_error_prefix("%s", o->trace);
        return cmd_fail(CMD, rc);
    }
    fmoe_sim_workload_free(&u->w);
    u->w = batched;
    return 0;
}

/* Appends the unit's cells: each policy at each cache size and, when it prefetches, each
 * distance. @return 0 or 1 (printed). */
static int add_cells(const options *o, sim_unit *u, const int32_t *caches, int n_caches,
                     fmoe_sim_config **cells, size_t *n, size_t *cap) {
    int exit_code;
    const size_t most = (size_t)o->n_policies * (size_t)n_caches * (size_t)o->n_distances;
    if ((exit_code = reserve_cells(cells, *n, cap, most)) != 0) return exit_code;
    /* MoE-Infinity's collections take one EAM per request, and are allocated whole up
     * front: beyond the trace's requests the rows stay empty and nothing is evicted, so the
     * capacity is sized to them (--eamc-capacity 10000000 asked for gigabytes). */
    const int32_t eamc_capacity =
        u->w.num_requests > 0 && u->w.num_requests < o->eamc_capacity ? (int32_t)u->w.num_requests
                                                                       : o->eamc_capacity;
    /* A policy that does not prefetch runs once per cache size, whatever the distances.
     * A policy that takes the store runs, when --prefetch-distance leaves it to the policy,
     * at the distance the store was built for (its redundancy scores weight the layers for
     * it), not at its own default; cmd_sim_store_distance_note says when a given one
     * differs. */
    const int32_t store_d = cmd_sim_store_distance(&u->store);
    size_t k = *n;
    for (int p = 0; p < o->n_policies; p++) {
        const fmoe_policy_ops *ops = fmoe_policy_find(o->policies[p]);
        const int by_store = store_d > 0 && (ops->flags & FMOE_POLICY_TAKES_STORE) &&
                             (ops->flags & FMOE_POLICY_PREFETCHES);
        int noted = 0;
        for (int c = 0; c < n_caches; c++)
            for (int d = 0; d < o->n_distances; d++) {
                int32_t dist = o->distances[d];
                if (dist == 0 && by_store) dist = store_d;
                if (dist == 0 && (dist = simulate_default_distance(o->policies[p],
                                                                   u->w.num_layers, &noted)) < 0)
                    continue;
                if (d == 0 || (ops->flags & FMOE_POLICY_PREFETCHES)) {
                    fmoe_sim_config *cell = &(*cells)[k++];
                    *cell = (fmoe_sim_config){
                        .policy = o->policies[p], .cache_experts = caches[c],
                        .prefetch_distance = dist, .costs = &u->costs,
                        .miss_mode = o->miss_mode, .arrival_s = u->arrivals,
                        .copy_chunks = o->copy_chunks,
                        .feedback = cmd_feedback_request(o->feedback),
                        .gap_split = o->gap_split,
                        /* each policy the predictor of its kind */
                        .predictor = simulate_predictor_for(o->policies[p], u->predictors)};
                    /* each policy the settings it declares */
                    fmoe_policy_settings_select(&cell->policy_settings, ops, &o->settings);
                    const char *eamc_key = cmd_policy_opt_key("--eamc-capacity");
                    if (fmoe_policy_settings_get(&cell->policy_settings, eamc_key)) {
                        char v[24];
                        snprintf(v, sizeof v, "%d", (int)eamc_capacity);
                        fmoe_policy_settings_set(&cell->policy_settings, eamc_key, v);
                    }
                }
            }
    }
    if (k == *n)
        return cmd_failf(CMD, "%s: none of the policies can run on a 1-layer trace", o->trace);
    for (size_t i = *n; i < k; i++) cmd_sim_store_apply(&u->store, &(*cells)[i]);
    if (!sim_notes_off) cmd_sim_store_distance_note(CMD, &u->store, *cells + *n, k - *n);
    u->ncells = k - *n;
    *n = k;
    return 0;
}

/* Reads the unit's trace (with what its policies need) and appends its cells to
 * cells[*n]. @return 0, 1 or 2 (printed). */
int simulate_prepare_unit(const options *base, sim_unit *u, fmoe_sim_config **cells, size_t *n,
                        size_t *cap) {
    options o = simulate_unit_options(base, u);
    fmoe_trace_reader *reader = NULL;
    uint32_t want = 0;
    int32_t caches[MAX_LIST];
    int n_caches = 0;
    u->cell0 = *n;
    int rc = fmoe_trace_reader_open(&reader, o.trace);
    if (rc < 0) return cmd_fail(CMD, rc); /* nothing opened */
    int exit_code = prepare_inputs(&o, u, reader, &want);
    if (!exit_code) exit_code = cache_slots(&o, u->expert_bytes, caches, &n_caches);
    if (!exit_code) exit_code = read_workload(&o, u, reader, want);
    fmoe_trace_reader_close(reader);
    if (exit_code) return exit_code;
    if ((exit_code = check_byte_counters(&o, u))) return exit_code;
    /* More slots than the model has experts change nothing but the memory they take. */
    for (int i = 0; i < n_caches; i++) {
        const int32_t all = u->w.num_layers * u->w.num_experts;
        if (caches[i] > all) {
            if (!sim_notes_off)
                fprintf(stderr, "fmoe simulate: note: a cache of %d experts holds all %d (L x J); "
                                "simulating %d\n", (int)caches[i], (int)all, (int)all);
            caches[i] = all;
        }
    }
    if (o.arrivals && (exit_code = simulate_load_arrivals(&o, &u->w, &u->arrivals)))
        return exit_code;
    if ((exit_code = batch_workload(&o, u))) return exit_code;
    return add_cells(&o, u, caches, n_caches, cells, n, cap);
}

/* Every --trace, its globs expanded (in glob's sorted order), each path once, into a
 * malloc'd list of malloc'd paths. @return 0, 1 or 2 (printed). */
int simulate_expand_traces(const options *o, char ***out, int *n) {
    *out = NULL;
    *n = 0;
    size_t cap = 0;
    char **list = NULL;
    for (int i = 0; i < o->trace_args.n; i++) {
        const char *arg = o->trace_args.items[i];
        glob_t g = {0};
        const int pattern = strpbrk(arg, "*?[") != NULL;
        if (pattern) {
            const int grc = glob(arg, 0, NULL, &g);
            if (grc == GLOB_NOMATCH || (grc == 0 && g.gl_pathc == 0)) {
                globfree(&g);
                for (int k = 0; k < *n; k++) free(list[k]);
                free(list);
                return cmd_failf(CMD, "--trace %s: no file matches", arg);
            }
            if (grc != 0) {
                globfree(&g);
                for (int k = 0; k < *n; k++) free(list[k]);
                free(list);
                return cmd_failf(CMD, "--trace %s: cannot expand the pattern", arg);
            }
        }
        const size_t m = pattern ? g.gl_pathc : 1;
        if ((size_t)*n + m > cap) {
            cap = ((size_t)*n + m) * 2;
            char **grown = realloc(list, cap * sizeof *grown);
            if (!grown) {
                globfree(&g);
                for (int k = 0; k < *n; k++) free(list[k]);
                free(list);
                return cmd_failf(CMD, "out of memory");
            }
            list = grown;
        }
        for (size_t k = 0; k < m; k++) {
            const char *path = pattern ? g.gl_pathv[k] : arg;
            int seen = 0; /* a trace named twice (a glob and its match) is one trace */
            for (int j = 0; j < *n && !seen; j++) seen = strcmp(list[j], path) == 0;
            if (seen) continue;
            list[*n] = strdup(path);
            if (!list[*n]) {
                globfree(&g);
                for (int j = 0; j < *n; j++) free(list[j]);
                free(list);
                return cmd_failf(CMD, "out of memory");
            }
            (*n)++;
        }
        if (pattern) globfree(&g);
    }
    *out = list;
    return 0;
}

/* The settings of a sweep besides its grid, for --sweep-out's first line: a file resumes
 * only a sweep that computes the same cells. */
void simulate_sweep_settings(const options *o, char *buf, size_t cap) {
    size_t at = 0;
#define ADD(...)                                                                               \
    do {                                                                                       \
        if (at < cap) at += (size_t)snprintf(buf + at, cap - at, __VA_ARGS__);                 \
    } while (0)
    ADD("miss=%s batch=%s%d eamc-capacity=%d copy-chunks=%d feedback=%d", simulate_miss_name(o->miss_mode),
        o->batch_trace ? "trace/" : "", (int)o->batch, (int)o->eamc_capacity,
        (int)o->copy_chunks, (int)o->feedback);
    if (o->batch_tokens) ADD(" batch-tokens=%d", (int)o->batch_tokens);
    if (o->arrivals)
        ADD(" arrivals=%s start=%lld speedup=%.17g", o->arrivals, (long long)o->arrivals_start,
            o->arrivals_speedup);
    if (o->model_config) ADD(" model-config=%s", o->model_config);
    if (o->store.path) ADD(" store=%s", o->store.path);
    ADD(" store-mode=%d holdout=%d store-capacity=%d match-delay=%.17g", (int)o->store.mode,
        o->store.holdout, (int)o->store.capacity, o->store.match_delay_s);
    for (int i = 0; i < o->predictors.n; i++) ADD(" predictor=%s", o->predictors.items[i]);
    /* the settings besides the shorthands' (written above as they always were) */
    for (int32_t i = 0; i < o->settings.n; i++) {
        const char *key = o->settings.item[i].key;
        if (strcmp(key, cmd_policy_opt_key("--eamc-capacity")) &&
            strcmp(key, cmd_policy_opt_key("--store-mode")) &&
            strcmp(key, cmd_policy_opt_key("--store-capacity")))
            ADD(" policy-opt=%s=%s", key, o->settings.item[i].value);
    }
#undef ADD
}
