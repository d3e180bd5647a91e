/*
 * offload_cli.c - the options of an offloaded live run, shared by generate and record
 * (offload_cli.h).
 */
#include "offload_cli.h"

#include <stdio.h>
#include <string.h>

#include "cmd_common.h"
#include "paths.h"
#include "simulate_store.h"
#include "policy_opts.h"
#include "fmoe/error.h"
#include "fmoe/geometry.h"
#include "fmoe/hardware.h"
#include "fmoe/policy.h"
#include "fmoe/predictor.h"
#include "fmoe/sim.h"

const char *const cmd_offload_tiers[] = {"auto", "host", "file", NULL};
const char *const cmd_offload_misses[] = {"load", "cpu", "auto", NULL};
/* the values are fmoe_store_mode's: offline 0, offline-update 2 (online needs no store and
 * is a simulate mode) */
const char *const cmd_offload_store_modes[] = {"offline", "online", "offline-update", NULL};

void cmd_offload_args_init(cmd_offload_args *a) {
    memset(a, 0, sizeof *a);
    a->copy_chunks = 4;
    a->tier = FMOE_TIER_AUTO;
    a->store_mode = FMOE_STORE_OFFLINE;
    a->backend = FMOE_BACKEND_CPU;
}

/* --miss auto's figures from the profile, for this model's expert (the simulator's cost
 * model, sim/costs.c: measured linear fits, else its rooflines), into o. @return 0 or 1
 * (printed). */
static int auto_costs(const char *cmd, const char *path, const fmoe_model *m,
                      fmoe_offload_options *o) {
    const fmoe_model_geometry *g = fmoe_model_get_geometry(m);
    fmoe_hardware_profile hw;
    fmoe_sim_costs c;
    const int64_t eb = fmoe_model_expert_bytes(m);
    int rc = fmoe_hardware_load(path, &hw);
    if (rc == 0) {
        rc = fmoe_sim_costs_init(&c, &hw, g, eb, g->hidden_size, 0);
        if (rc < 0) fmoe_error_prefix("%s", path);
    }
    if (rc < 0) return cmd_fail(cmd, rc);
    if (!fmoe_sim_costs_have_host(&c))
        return cmd_failf(cmd, "%s: --miss auto needs host compute figures (host.expert_s, or "
                              "host.peak_flops and host.memory_bandwidth_bytes_per_s); measure "
                              "them with 'fmoe calibrate'", path);
    o->link_alpha_s = c.alpha_s;
    o->link_bytes_per_s = c.beta_bytes_per_s;
    /* fmoe_sim_expert_s and fmoe_sim_host_expert_s in fmoe_offload_cost's form */
    const double flops_per_token = 2 * c.expert_params;
    if (c.expert.present)
        o->fast_expert = (fmoe_offload_cost){c.expert.base_s, c.expert.per_token_s, 0};
    else
        o->fast_expert = (fmoe_offload_cost){c.launch_s, flops_per_token / c.peak_flops,
                                             (double)c.expert_bytes / c.mem_bw};
    if (c.host_expert.present)
        o->host_expert =
            (fmoe_offload_cost){c.host_expert.base_s, c.host_expert.per_token_s, 0};
    else
        o->host_expert = (fmoe_offload_cost){0, flops_per_token / c.host_peak_flops,
                                             (double)c.expert_bytes / c.host_mem_bw};
    return 0;
}

/* --policy-opt with the --store-mode shorthand folded in (its key: cmd_policy_opt_key), for `policy`:
 * *settings the keys it declares, *mode the store mode they say. @return 0 or 2 (printed). */
static int offload_settings(const char *cmd, const cmd_offload_args *a, const char *policy,
                            fmoe_policy_settings *settings, int32_t *mode) {
    char *const policies[1] = {(char *)policy};
    fmoe_policy_settings all;
    int rc = cmd_policy_opts_parse(cmd, &a->policy_opts, policies, 1, &all);
    *mode = a->store_mode;
    if (rc == 0 && a->store_mode_given)
        rc = cmd_policy_opt_shorthand(cmd, &all, "--store-mode",
                                      cmd_offload_store_modes[a->store_mode]);
    if (rc) return rc;
    const char *m = fmoe_policy_settings_get(&all, cmd_policy_opt_key("--store-mode"));
    for (int32_t i = 0; m && cmd_offload_store_modes[i]; i++)
        if (strcmp(cmd_offload_store_modes[i], m) == 0) *mode = i;
    fmoe_policy_settings_select(settings, fmoe_policy_find(policy), &all);
    return 0;
}

/* --memory-gb: the slots that fit beside the non-expert weights (attention, embeddings,
 * norms, routers, shared experts: resident, read once from the file) in the budget, each
 * slot the tier's size for the largest expert (O_DIRECT's alignment margins included),
 * plus the scratch slot. Refused below top-k slots, the least a layer can compute from,
 * with the minimum in the message. */
static int slots_of_budget(const char *cmd, const cmd_offload_args *a, const fmoe_model *m,
                           int quiet, int64_t *n) {
    const fmoe_model_geometry *g = fmoe_model_get_geometry(m);
    const int64_t other = fmoe_model_weight_bytes(m) - fmoe_model_routed_expert_bytes(m);
    const int64_t page = 4096, eb = fmoe_model_expert_bytes(m);
    const int64_t slot = (eb + (a->direct_io ? 6 * page : 0) + page - 1) / page * page;
    const double gib = (double)(1 << 30), budget = a->memory_gb * gib;
    const double min = (double)other + (double)slot * (g->top_k + 1);
    if (eb <= 0 || other < 0 || budget < min)
        return cmd_usage_error(cmd, "--memory-gb %g is below this model's minimum of %.2f: "
                               "%.2f GiB of non-expert weights and %d expert slots of %.1f MiB "
                               "(top-k %d and one scratch)", a->memory_gb, min / gib,
                               (double)other / gib, g->top_k + 1, (double)slot / (1 << 20),
                               g->top_k);
    *n = (int64_t)((budget - (double)other) / (double)slot) - 1;
    if (!quiet)
        fprintf(stderr, "fmoe %s: --memory-gb %g: %.2f GiB of non-expert weights resident, "
                        "%lld expert slots of %.1f MiB (and one scratch)\n", cmd, a->memory_gb,
                (double)other / gib, (long long)*n, (double)slot / (1 << 20));
    return 0;
}

int cmd_offload_check_args(const char *cmd, const cmd_offload_args *a) {
    const int on = a->cache_experts > 0 || a->cache_gb > 0 || a->memory_gb > 0;
    if (a->miss == FMOE_OFFLOAD_MISS_AUTO && !a->profile)
        return cmd_usage_error(cmd, "--miss auto needs --profile P.json (fmoe calibrate) to "
                                    "estimate where each miss ends first");
    if (a->profile && a->miss != FMOE_OFFLOAD_MISS_AUTO)
        return cmd_usage_error(cmd, "--profile is read by --miss auto only");
    if (!on) {
        if (a->policy || a->store || a->store_out || a->predictor || a->decision_log ||
            a->direct_io || a->read_depth || a->sync_transfers || a->sync_predictions || a->profile ||
            a->policy_opts.n > 0)
            return cmd_usage_error(cmd, "--policy, --policy-opt, --store, --store-out, "
                                        "--predictor, --decision-log, --direct-io, --read-depth, "
                                        "--sync-transfers, --sync-predictions and --profile "
                                        "need an offloaded run: give "
                                        "--cache-experts N, --cache-gb X or --memory-gb X");
        return 0;
    }
    if ((a->cache_experts > 0) + (a->cache_gb > 0) + (a->memory_gb > 0) > 1)
        return cmd_usage_error(cmd, "give one of --cache-experts, --cache-gb and --memory-gb");
    if (a->direct_io && a->tier == FMOE_TIER_HOST)
        return cmd_usage_error(cmd, "--direct-io reads the file tier; it has no meaning with "
                                    "--tier host");
    if (a->read_depth && a->tier == FMOE_TIER_HOST)
        return cmd_usage_error(cmd, "--read-depth sets the file tier's reads; it has no "
                                    "meaning with --tier host");
    const char *policy = a->policy ? a->policy : "lru";
    const fmoe_policy_ops *ops = fmoe_policy_find(policy);
    if (!ops)
        return cmd_usage_error(cmd, "unknown policy '%s' (valid: %s)", policy,
                               fmoe_policy_names());
    fmoe_policy_settings settings; /* checked here; cmd_offload_open makes them again */
    int32_t mode;
    const int rc = offload_settings(cmd, a, policy, &settings, &mode);
    if (rc) return rc;
    if (mode == FMOE_STORE_ONLINE)
        return cmd_usage_error(cmd, "--store-mode online is a simulate mode; live runs use "
                                    "offline or offline-update with --store");
    if ((ops->flags & FMOE_POLICY_TAKES_STORE) && !a->store)
        return cmd_usage_error(cmd, "policy %s needs an expert-map store: --store S.h5 "
                                    "(fmoe build-store)", policy);
    if (!(ops->flags & FMOE_POLICY_TAKES_STORE) && a->store)
        return cmd_usage_error(cmd, "policy %s takes no store", policy);
    /* the policies that predict with a learned predictor (ops->predictor_kind), as
     * simulate's check; fmoe_policy_init refuses a predictor of another kind */
    const char *kind = ops->predictor_kind;
    if (kind && !a->predictor)
        return cmd_usage_error(cmd, "policy %s needs --predictor P.h5 (fmoe train-predictor "
                                    "--kind %s)", ops->name, kind);
    if (!kind && a->predictor)
        return cmd_usage_error(cmd, "--predictor is for policies %s; policy %s takes none",
                               fmoe_policy_predictor_names(), ops->name);
    if (a->store_out && mode != FMOE_STORE_OFFLINE_UPDATE)
        return cmd_usage_error(cmd, "--store-out writes the store a run updates: give "
                                    "--store-mode offline-update");
    return 0;
}

/* Reads --predictor into out->predictor and checks it is for the loaded model: a
 * fingerprint mismatch is refused naming both (as simulate's check against a trace), a
 * predictor without one by the width of its input (the policy's init checks the rest of
 * the geometry). @return 0 or 1 (printed). */
static int load_predictor(const char *cmd, const char *path, const fmoe_model_geometry *g,
                          const char *fingerprint, cmd_offload *out) {
    int rc = fmoe_predictor_read(path, &out->predictor);
    if (rc < 0) return cmd_fail(cmd, rc);
    const fmoe_predictor *p = out->predictor;
    if (p->model_fingerprint[0] && fingerprint[0] &&
        strcmp(p->model_fingerprint, fingerprint) != 0)
        return cmd_failf(cmd,
                         "%s is a predictor for model %s (fingerprint %s) but the model loaded "
                         "is %s (fingerprint %s); train one on traces of this model",
                         path, p->model_name[0] ? p->model_name : "(unnamed)",
                         p->model_fingerprint, g->model_type[0] ? g->model_type : "(unnamed)",
                         fingerprint);
    if (fmoe_predictor_kind_id_of(p->kind) == FMOE_PREDICTOR_PROMOE &&
        p->hidden_size != g->hidden_size)
        return cmd_failf(cmd, "%s reads gate inputs of width %d; the model loaded has %d",
                         path, p->hidden_size, g->hidden_size);
    return 0;
}

/* The distance a policy that takes the store runs at: --prefetch-distance when given, else
 * the one the store was built for (its redundancy scores weight the layers for it), as
 * simulate runs its cells; a given one that differs is said once. 0: the policy's own. */
static int32_t store_distance(const char *cmd, const cmd_offload_args *a, const char *policy,
                              const fmoe_store_file *f, int quiet) {
    const fmoe_policy_ops *ops = fmoe_policy_find(policy);
    const int32_t d = fmoe_expertmap_config_of(f->store)->prefetch_distance;
    if (!ops || !(ops->flags & FMOE_POLICY_PREFETCHES)) return a->prefetch_distance;
    const int32_t ran = a->prefetch_distance > 0 ? a->prefetch_distance
                        : d > 0                  ? d
                                                 : ops->default_distance;
    if (ran != d && !quiet)
        fprintf(stderr, "fmoe %s: note: %s was built for prefetch distance %d; policy %s runs "
                        "at %d%s\n",
                cmd, a->store, (int)d, policy, (int)ran,
                a->prefetch_distance > 0 ? ", as --prefetch-distance asks"
                                         : " (its own default: it cannot run at 0)");
    return a->prefetch_distance > 0 ? a->prefetch_distance : d;
}

int cmd_offload_open(const char *cmd, const cmd_offload_args *a, fmoe_model *m,
                     int32_t prefill_chunk, int quiet, cmd_offload *out) {
    memset(out, 0, sizeof *out);
    int rc = cmd_offload_check_args(cmd, a);
    if (rc != 0) return rc;
    if (!(a->cache_experts > 0 || a->cache_gb > 0 || a->memory_gb > 0)) {
        /* every weight read in place on the CPU: its pages mapped now, not faulted in
         * during the first prompt and decode steps (fmoe_model_populate) */
        if (a->backend == FMOE_BACKEND_CPU) fmoe_model_populate(m);
        return 0;
    }
    const char *policy = a->policy ? a->policy : "lru";
    out->store_out = a->store_out;

    const fmoe_model_geometry *g = fmoe_model_get_geometry(m);
    char fp[65] = "";
    if (a->store || a->predictor) {
        const char *json = fmoe_model_config_json(m);
        if ((rc = fmoe_config_fingerprint(json, strlen(json), fp)) < 0) return cmd_fail(cmd, rc);
    }
    if (a->store) {
        if ((rc = fmoe_store_read(a->store, 0, &out->store)) < 0) return cmd_fail(cmd, rc);
        if ((rc = cmd_store_check_model(cmd, a->store, out->store, "the model loaded", g->model_type,
                                        fp, g->num_moe_layers, g->num_experts, g->top_k))) {
            cmd_offload_close(cmd, out, 0);
            return rc;
        }
    }
    if (a->predictor && (rc = load_predictor(cmd, a->predictor, g, fp, out)) != 0) {
        cmd_offload_close(cmd, out, 0);
        return rc;
    }
    fmoe_offload_options o = fmoe_offload_defaults();
    o.policy = policy;
    o.backend = a->backend; /* the session's: fmoe_offload_attach needs them equal */
    const int64_t total = (int64_t)g->num_moe_layers * g->num_experts;
    int64_t n = a->cache_experts;
    if (a->cache_gb > 0) {
        /* expert bytes as the model stores them, as record writes them to the trace and
         * simulate converts --cache-gb */
        const int64_t eb = fmoe_model_expert_bytes(m);
        n = eb > 0 ? (int64_t)(a->cache_gb * (double)(1 << 30) / (double)eb) : 0;
        if (n < 1) {
            cmd_offload_close(cmd, out, 0);
            return cmd_usage_error(cmd, "--cache-gb %g holds no expert of %lld bytes",
                                   a->cache_gb, (long long)eb);
        }
    }
    if (a->memory_gb > 0 && (rc = slots_of_budget(cmd, a, m, quiet, &n)) != 0) {
        cmd_offload_close(cmd, out, 0);
        return rc;
    }
    if (n > total) {
        if (!quiet)
            fprintf(stderr, "fmoe %s: --cache-%s asks for %lld experts; the model has %lld: "
                            "clamped to %lld (nothing is offloaded)\n", cmd,
                    a->cache_gb > 0 ? "gb" : "experts", (long long)n, (long long)total,
                    (long long)total);
        n = total;
    }
    o.cache_experts = (int32_t)n;
    o.prefetch_distance = a->prefetch_distance;
    if (out->store) /* the distance the store was built for, unless one is given */
        o.prefetch_distance = store_distance(cmd, a, policy, out->store, quiet);
    o.copy_chunks = a->copy_chunks;
    o.tier = (fmoe_tier_kind)a->tier;
    o.direct_io = a->direct_io;
    o.read_depth = a->read_depth;
    o.miss = a->miss;
    if (a->miss == FMOE_OFFLOAD_MISS_AUTO && (rc = auto_costs(cmd, a->profile, m, &o))) {
        cmd_offload_close(cmd, out, 0);
        return rc;
    }
    o.prefill_chunk = prefill_chunk;
    o.sync_transfers = a->sync_transfers;
    o.sync_predictions = a->sync_predictions;
    o.probs_f32 = a->probs_f32;
    o.feedback = cmd_feedback_request(a->feedback);
    int32_t mode;
    if ((rc = offload_settings(cmd, a, policy, &o.policy_settings, &mode)) != 0) {
        cmd_offload_close(cmd, out, 0);
        return rc;
    }
    if (out->store) {
        o.expert_store = out->store->store;
        /* the store's settings, as simulate hands them to its cells: the mode (the
         * --store-mode default included), and the capacity build-store was asked for
         * unless --policy-opt gives the --store-capacity setting */
        char v[24];
        snprintf(v, sizeof v, "%d", (int)out->store->capacity_asked);
        if (fmoe_policy_settings_set(&o.policy_settings, cmd_policy_opt_key("--store-mode"),
                                     cmd_offload_store_modes[mode]) < 0 ||
            (!fmoe_policy_settings_get(&o.policy_settings, cmd_policy_opt_key("--store-capacity")) &&
             out->store->capacity_asked > 0 &&
             fmoe_policy_settings_set(&o.policy_settings, cmd_policy_opt_key("--store-capacity"), v) < 0)) {
            cmd_offload_close(cmd, out, 0);
            return cmd_fail(cmd, FMOE_EINVAL);
        }
    }
    o.predictor = out->predictor;
    if (a->decision_log) {
        char meta[256];
        cmd_decision_log_meta(meta, sizeof meta, policy, o.cache_experts, o.prefetch_distance,
                              a->copy_chunks > 0 ? a->copy_chunks : 4);
        if ((rc = fmoe_decision_log_open(&out->log, a->decision_log, cmd, meta)) < 0) {
            cmd_offload_close(cmd, out, 0);
            return cmd_fail(cmd, rc);
        }
        o.decision = fmoe_decision_log_write;
        o.decision_flush = fmoe_decision_log_flush;
        o.decision_ctx = out->log;
    }
    /* Experts read from the model's file on the CPU: the weights every token reads become
     * the process's own, so that the kernel, short of memory, cannot evict them and fault
     * them back in each token (fmoe_model_own_weights). On a device they live in device
     * memory; their host pages are read once. */
    if (a->backend == FMOE_BACKEND_CPU &&
        fmoe_offload_resolve_tier(m, (fmoe_tier_kind)a->tier) == FMOE_TIER_FILE &&
        (rc = fmoe_model_own_weights(m)) < 0) {
        cmd_offload_close(cmd, out, 0);
        return cmd_fail(cmd, rc);
    }
    out->policy = policy;
    out->sync_transfers = a->sync_transfers;
    if ((rc = fmoe_offload_init(&out->x, m, &o)) < 0) {
        cmd_offload_close(cmd, out, 0);
        return cmd_fail(cmd, rc);
    }
    return 0;
}

int cmd_offload_close(const char *cmd, cmd_offload *o, int ok) {
    int exit_code = 0;
    if (ok && o->x && o->store_out && o->store) {
        /* the input store's provenance, with the entries as this run left them */
        fmoe_store_file f = *o->store;
        f.store = (fmoe_expertmap *)fmoe_offload_expert_store(o->x);
        f.created[0] = '\0';
        f.fmoe_version[0] = '\0';
        const int rc = f.store ? fmoe_store_write(o->store_out, &f, NULL) : 0;
        if (rc < 0) exit_code = cmd_fail(cmd, rc);
    }
    fmoe_offload_free(o->x);
    o->x = NULL;
    if (o->log) {
        const int rc = fmoe_decision_log_close(o->log, ok);
        if (rc < 0 && ok) exit_code = cmd_fail(cmd, rc);
        o->log = NULL;
    }
    fmoe_store_file_free(o->store);
    o->store = NULL;
    fmoe_predictor_free(o->predictor); /* after the executor that borrowed it */
    o->predictor = NULL;
    return exit_code;
}

int cmd_offload_forward(cmd_offload *o, fmoe_session *s, const int32_t *tokens, int32_t n,
                        int32_t phase, const fmoe_forward_trace *trace, float *logits) {
    if (o->x) return fmoe_offload_forward(o->x, s, tokens, n, phase, trace, logits);
    return fmoe_session_forward(s, tokens, n, trace, logits);
}

void cmd_offload_describe(const cmd_offload *o, char *buf, size_t cap) {
    if (!o->x) {
        snprintf(buf, cap, "every expert resident");
        return;
    }
    snprintf(buf, cap, "offload %d slots, policy %s", fmoe_offload_capacity(o->x),
             o->policy ? o->policy : "lru");
}

void cmd_offload_summary(const cmd_offload *o, char *buf, size_t cap) {
    if (!o->x) {
        snprintf(buf, cap, "all experts resident");
        return;
    }
    fmoe_offload_stats s;
    fmoe_offload_get_stats(o->x, &s);
    const double acc = s.accesses > 0 ? (double)s.accesses : 1;
    /* the copy engine's own measure: none with untimed copies, none without copies */
    char link[96];
    if (o->sync_transfers)
        snprintf(link, sizeof link, "link not measured (--sync-transfers)");
    else if (!(s.io_busy_s > 0))
        snprintf(link, sizeof link, "link not measured (no copies)");
    else
        snprintf(link, sizeof link, "link %.2f GiB/s measured (decode %.2f)",
                 (double)s.io_bytes / s.io_busy_s / (1 << 30),
                 s.io_busy_s_decode > 0
                     ? (double)s.io_bytes_decode / s.io_busy_s_decode / (1 << 30)
                     : 0.0);
    snprintf(buf, cap,
             "offload %d slots: %.1f%% hits (%lld late), %lld misses, %lld prefetches, "
             "%.1f MiB loaded, %.1f MiB awaited (decode %.2f MiB per token), %.3f s stalled, "
             "%s",
             fmoe_offload_capacity(o->x), 100.0 * (double)s.hits / acc, (long long)s.late_hits,
             (long long)s.misses, (long long)s.prefetches, (double)s.bytes_loaded / (1 << 20),
             (double)s.awaited_bytes / (1 << 20),
             s.decode_iterations > 0
                 ? (double)s.awaited_bytes_decode / (1 << 20) / (double)s.decode_iterations
                 : 0.0,
             s.stall_s, link);
}
