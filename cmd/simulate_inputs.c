/*
 * simulate_inputs.c - what a trace needs before `fmoe simulate` replays it: the gate data the
 * policies read, learned predictors, arrivals, the expert size and the cost model
 * (simulate_impl.h).
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

/* The gate data the chosen policies need; fails (one line) when the trace lacks it, notes
 * top-k-only probabilities. */
int simulate_gate_needs(const options *o, const fmoe_trace_header *h, uint32_t *want) {
    *want = 0;
    const fmoe_policy_config have = {.probs_kind = h->probs_kind,
                                     .speculative_depth = h->speculative_depth};
    int noted_ids_only = 0;
    for (int i = 0; i < o->n_policies; i++) {
        const fmoe_policy_ops *ops = fmoe_policy_find(o->policies[i]);
        if (fmoe_policy_check_inputs(ops, &have) < 0) {
            fmoe_error_prefix("%s", o->trace);
            return cmd_fail(CMD, FMOE_EUNSUPPORTED);
        }
        if (ops->flags & (FMOE_POLICY_NEEDS_PROBS | FMOE_POLICY_USES_PROBS)) {
            *want |= FMOE_SIM_WANT_PROBS;
            if (h->probs_kind == FMOE_PROBS_TOPK && !o->quiet)
                fprintf(stderr,
                        "fmoe %s: note: %s holds top-k probabilities only; policy %s sees 0 "
                        "for the experts not chosen\n",
                        CMD, o->trace, ops->name);
            if (h->probs_kind == FMOE_PROBS_NONE && !o->quiet && !noted_ids_only++)
                fprintf(stderr,
                        "fmoe %s: note: %s holds expert ids only (no probabilities); the fmoe "
                        "policies take each chosen expert at 1/K\n",
                        CMD, o->trace);
        }
        if (ops->flags & FMOE_POLICY_NEEDS_SPECULATIVE) *want |= FMOE_SIM_WANT_SPECULATIVE;
        if ((ops->flags & FMOE_POLICY_NEEDS_HIDDEN) && h->hidden_dim < 1)
            return cmd_failf(CMD,
                             "%s has no hidden states (/tokens/hidden), which policy %s reads: "
                             "record the trace with 'fmoe record --hidden'",
                             o->trace, ops->name);
    }
    return 0;
}

/* --prefetch-distance counts layers ahead: one the trace's L layers cannot hold is a usage
 * error, like any other value out of range (checked for every policy: the same list applies
 * to all of them). */
int simulate_check_distances(const options *o, int32_t L) {
    for (int i = 0; i < o->n_distances; i++)
        if (o->distances[i] >= L)
            return cmd_usage_error(CMD,
                                   "--prefetch-distance %d is not below the %d MoE layers of "
                                   "%s (at most %d)",
                                   (int)o->distances[i], (int)L, o->trace, (int)L - 1);
    return 0;
}

/* The distance a cell runs at when --prefetch-distance leaves it to the policy (0): the
 * policy's default, clamped to L - 1 when the trace has fewer layers than that default needs
 * (fmoe's 3 on a 2-layer model), with one note per policy, so the rest of a sweep runs.
 * @return the distance to run at, 0 (the executor's default), or -1: the trace has a single
 *         layer, so the policy cannot prefetch at all: skip its cells. */
int32_t simulate_default_distance(const char *policy, int32_t L, int *noted) {
    const fmoe_policy_ops *ops = fmoe_policy_find(policy);
    if (!(ops->flags & FMOE_POLICY_PREFETCHES) || ops->default_distance < L) return 0;
    if (L < 2) {
        if (!(*noted)++ && !sim_notes_off)
            fprintf(stderr, "fmoe simulate: note: policy %s prefetches layers ahead and the "
                            "trace has %d MoE layer; skipped\n", ops->name, (int)L);
        return -1;
    }
    if (!(*noted)++ && !sim_notes_off)
        fprintf(stderr, "fmoe simulate: note: policy %s's default prefetch distance %d is not "
                        "below the trace's %d MoE layers; running it at %d\n",
                ops->name, (int)ops->default_distance, (int)L, (int)L - 1);
    return L - 1;
}

/* Whether a policy of the run reads the gate inputs. */
int simulate_needs_hidden(const options *o) {
    for (int i = 0; i < o->n_policies; i++)
        if (fmoe_policy_find(o->policies[i])->flags & FMOE_POLICY_NEEDS_HIDDEN) return 1;
    return 0;
}

/* Reads one --predictor and checks it is for the trace's model (a fingerprint mismatch is
 * refused naming both; a trace or predictor without one is checked by geometry, in the
 * policy's init). */
static int load_predictor(const options *o, const char *path, const fmoe_trace_header *h,
                          fmoe_predictor **out) {
    *out = NULL;
    int rc = fmoe_predictor_read(path, out);
    if (rc < 0) return cmd_fail(CMD, rc);
    const fmoe_predictor *p = *out;
    if (p->model_fingerprint[0] && h->model_fingerprint[0] &&
        strcmp(p->model_fingerprint, h->model_fingerprint) != 0)
        return cmd_failf(CMD,
                         "%s is a predictor for model %s (fingerprint %s) but %s is model %s "
                         "(fingerprint %s); train one on traces of this model",
                         path, p->model_name[0] ? p->model_name : "(unnamed)",
                         p->model_fingerprint, o->trace,
                         h->model_name[0] ? h->model_name : "(unnamed)", h->model_fingerprint);
    if (fmoe_predictor_kind_id_of(p->kind) == FMOE_PREDICTOR_PROMOE &&
        p->hidden_size != h->hidden_dim)
        return cmd_failf(CMD, "%s reads gate inputs of width %d; %s holds %d-wide ones",
                         path, p->hidden_size, o->trace, h->hidden_dim);
    return 0;
}

/* The first built-in policy that predicts with a predictor of `kind` (the kind itself when
 * none does, which a file the reader accepted cannot be). */
static const char *policy_taking(const char *kind) {
    const fmoe_policy_ops *const *all = NULL;
    const size_t n = fmoe_policy_registry(&all);
    for (size_t i = 0; i < n; i++)
        if (fmoe_policy_takes_predictor(all[i], kind)) return all[i]->name;
    return kind;
}

/* Reads every --predictor into out[MAX_PREDICTORS] (one per kind) and checks that each
 * policy that takes one finds one of its kind, and each is taken. @return 0 or 1/2
 * (printed). */
int simulate_load_predictors(const options *o, const fmoe_trace_header *h,
                           fmoe_predictor **out) {
    if (o->predictors.n > MAX_PREDICTORS)
        return cmd_usage_error(CMD, "--predictor given %d times: at most one per kind (%s, %s)",
                               (int)o->predictors.n, FMOE_PREDICTOR_KIND_PROMOE,
                               FMOE_PREDICTOR_KIND_DUOSERVE);
    for (int i = 0; i < o->predictors.n; i++) {
        int rc = load_predictor(o, o->predictors.items[i], h, &out[i]);
        if (rc) return rc;
        for (int k = 0; k < i; k++)
            if (strcmp(out[k]->kind, out[i]->kind) == 0)
                return cmd_usage_error(CMD, "%s and %s are both %s predictors: give one per kind",
                                       o->predictors.items[k], o->predictors.items[i],
                                       out[i]->kind);
    }
    for (int p = 0; p < o->n_policies; p++) {
        const fmoe_policy_ops *ops = fmoe_policy_find(o->policies[p]);
        const char *kind = ops->predictor_kind;
        int found = 0;
        for (int i = 0; i < o->predictors.n; i++)
            found |= fmoe_policy_takes_predictor(ops, out[i]->kind);
        if (kind && !found)
            return cmd_failf(CMD, "policy %s needs a predictor of kind %s; %s is a %s predictor "
                                  "(train one with 'fmoe train-predictor --kind %s')",
                             o->policies[p], kind, o->predictors.items[0], out[0]->kind, kind);
    }
    for (int i = 0; i < o->predictors.n; i++) {
        int taken = 0;
        for (int p = 0; p < o->n_policies; p++)
            taken |= fmoe_policy_takes_predictor(fmoe_policy_find(o->policies[p]), out[i]->kind);
        if (!taken)
            return cmd_usage_error(CMD, "%s is a %s predictor, for policy %s, which --policy "
                                        "does not run",
                                   o->predictors.items[i], out[i]->kind,
                                   policy_taking(out[i]->kind));
    }
    return 0;
}

/* The predictor of the kind `policy` takes, or NULL. */
const fmoe_predictor *simulate_predictor_for(const char *policy, fmoe_predictor *const *loaded) {
    const fmoe_policy_ops *ops = fmoe_policy_find(policy);
    for (int i = 0; i < MAX_PREDICTORS; i++)
        if (loaded[i] && fmoe_policy_takes_predictor(ops, loaded[i]->kind)) return loaded[i];
    return NULL;
}

/* Arrival times per request of the workload (malloc'd into *out). */
int simulate_load_arrivals(const options *o, const fmoe_sim_workload *w, double **out) {
    *out = NULL;
    const int64_t R = w->num_requests;
    double *t = malloc((size_t)(R ? R : 1) * sizeof *t);
    if (!t) return cmd_failf(CMD, "out of memory");
    if (strcmp(o->arrivals, "trace") == 0) {
        for (int64_t i = 0; i < R; i++) t[i] = w->requests[i].arrival_s / o->arrivals_speedup;
        *out = t;
        return 0;
    }
    fmoe_arrivals *a = NULL;
    int rc = fmoe_arrivals_load_azure(o->arrivals, &a);
    if (rc < 0) {
        free(t);
        return cmd_fail(CMD, rc);
    }
    if (o->arrivals_start > a->count || a->count - o->arrivals_start < R) {
        int ex = cmd_failf(CMD,
                           "%s: %lld arrivals from row %lld, but the trace has %lld requests "
                           "(use --arrivals-start)",
                           o->arrivals, (long long)(o->arrivals_start < a->count
                                                        ? a->count - o->arrivals_start
                                                        : 0),
                           (long long)o->arrivals_start, (long long)R);
        fmoe_arrivals_free(a);
        free(t);
        return ex;
    }
    const double t0 = R ? a->arrival_s[o->arrivals_start] : 0;
    for (int64_t i = 0; i < R; i++)
        t[i] = (a->arrival_s[o->arrivals_start + i] - t0) / o->arrivals_speedup;
    fmoe_arrivals_free(a);
    *out = t;
    return 0;
}

/* ------------------------------------------------------------------ model and hardware */


/* Bytes of one routed expert of each MoE layer of a GGUF file, counted from its stacked
 * expert tensors as the forward pass stores them (runtime/model/parts.c counts the same):
 * a llama-quantize mix such as Q4_K_M gives some layers' down projections more bits.
 * *out NULL (and 0 returned) when a layer's gate, up or down tensor is not found, so the
 * geometry's uniform size applies. @return 0 or the GGUF reader's error. */
static int gguf_layer_expert_bytes(const char *path, const fmoe_model_geometry *g,
                                   int64_t **out) {
    *out = NULL;
    fmoe_gguf *f = NULL;
    int rc = fmoe_gguf_open(path, &f);
    if (rc < 0) return rc;
    int64_t *b = calloc((size_t)g->num_moe_layers, sizeof *b);
    if (!b) {
        fmoe_gguf_close(f);
        return fmoe_error_set(FMOE_ENOMEM, "out of memory");
    }
    static const char *const parts[] = {"gate", "up", "down"};
    for (int32_t l = 0; l < g->num_moe_layers && b; l++)
        for (int p = 0; p < 3 && b; p++)
            for (int bias = 0; bias < 2; bias++) {
                char name[96];
                snprintf(name, sizeof name, "blk.%d.ffn_%s_exps.%s", g->moe_layer_index[l],
                         parts[p], bias ? "bias" : "weight");
                const fmoe_gguf_tensor *t = fmoe_gguf_find_tensor(f, name);
                if (t) b[l] += t->nbytes / g->num_experts;
                else if (!bias) { /* not a layout counted here */
                    free(b);
                    b = NULL;
                    break;
                }
            }
    fmoe_gguf_close(f);
    *out = b;
    return 0;
}

int simulate_load_costs(const options *o, fmoe_trace_reader *r, fmoe_sim_costs *costs,
                      int64_t *expert_bytes, expert_size *es, fmoe_hardware_profile *hw) {
    const fmoe_trace_header *h = fmoe_trace_reader_header(r);
    fmoe_model_geometry g;
    int have_g = 0, rc;
    if (o->model_config) {
        rc = fmoe_geometry_load(o->model_config, &g);
        if (rc < 0) return rc;
        have_g = 1;
    } else if (h->config_json && h->config_json[0]) {
        /* A stored config that does not parse (e.g. an unsupported family) is not fatal:
         * the header's sizes still give a rough roofline. */
        have_g = fmoe_geometry_parse(h->config_json, strlen(h->config_json), &g) == 0;
        fmoe_error_clear();
    }
    if (have_g && (g.num_moe_layers != h->num_layers || g.num_experts != h->num_experts ||
                   g.top_k != h->top_k))
        return fmoe_error_set(FMOE_EMISMATCH,
                              "%s: model has %d MoE layers, %d experts, top-%d; the trace has "
                              "%d, %d, top-%d",
                              o->model_config ? o->model_config : "the trace's config.json",
                              g.num_moe_layers, g.num_experts, g.top_k, h->num_layers,
                              h->num_experts, h->top_k);
    *expert_bytes = h->expert_bytes;
    es->trace_bytes = h->expert_bytes > 0 ? h->expert_bytes : 0;
    es->from = "trace";
    if (o->model_config) { /* the file given: its experts' stored type and layers */
        *expert_bytes = fmoe_geometry_expert_bytes(&g, g.expert_dtype);
        es->from = "model-config";
        free(es->layers);
        es->layers = NULL;
        if (fmoe_gguf_is_file(o->model_config) &&
            (rc = gguf_layer_expert_bytes(o->model_config, &g, &es->layers)) < 0)
            return rc;
        if (es->layers) {
            int64_t most = 0, least = INT64_MAX;
            for (int32_t l = 0; l < g.num_moe_layers; l++) {
                most = es->layers[l] > most ? es->layers[l] : most;
                least = es->layers[l] < least ? es->layers[l] : least;
            }
            *expert_bytes = most;
            if (least == most) { /* uniform: one size says it */
                free(es->layers);
                es->layers = NULL;
            }
        }
    } else if (*expert_bytes <= 0 && have_g) {
        *expert_bytes = fmoe_geometry_expert_bytes(&g, g.expert_dtype);
        es->from = "trace config.json";
    }
    if (*expert_bytes <= 0)
        return fmoe_error_set(FMOE_EINVAL,
                              "%s: the trace does not say how large an expert is; pass "
                              "--model-config config.json",
                              o->trace);
    if (o->profile) {
        rc = fmoe_hardware_load(o->profile, hw);
    } else {
        rc = fmoe_hardware_preset(o->hardware ? o->hardware : DEFAULT_HARDWARE, hw);
    }
    if (rc < 0) return rc;
    fmoe_dtype dt;
    double bits = fmoe_dtype_parse(h->dtype, &dt) == 0 ? fmoe_dtype_bits(dt) : 16;
    if (o->model_config) bits = fmoe_dtype_bits(g.expert_dtype);
    fmoe_error_clear();
    rc = fmoe_sim_costs_init(costs, hw, have_g ? &g : NULL, *expert_bytes, h->hidden_size, bits);
    if (rc < 0 && o->profile) fmoe_error_prefix("%s", o->profile);
    return rc;
}
