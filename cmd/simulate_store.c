/*
 * simulate_store.c - the expert-map store options of `fmoe simulate`: --store,
 * --store-mode, --holdout, --store-capacity, --match-delay (their rows are in
 * cmd_simulate.c's option table; this file validates and applies them).
 *
 * A store built by `fmoe build-store` is loaded once and shared read-only by every sweep
 * cell (the updating modes copy it per cell inside the policy). It must be for the trace's
 * model: a fingerprint mismatch is refused naming both. --holdout replays only the requests
 * the store's --split held out of this trace (the paper's 7:3 evaluation). Which policies
 * take the store is the registry's word (FMOE_POLICY_TAKES_STORE), not their names.
 */
#include "simulate_store.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd_common.h"
#include "policy_opts.h"
#include "fmoe/error.h"
#include "fmoe/policy.h"

/* The registry says which policies use a store (FMOE_POLICY_TAKES_STORE). */
static int takes_store(const char *name) {
    const fmoe_policy_ops *ops = fmoe_policy_find(name);
    return ops && (ops->flags & FMOE_POLICY_TAKES_STORE);
}

static const char *mode_name(int32_t m) {
    return m == FMOE_STORE_ONLINE ? "online" : m == FMOE_STORE_OFFLINE_UPDATE ? "offline-update"
                                                                             : "offline";
}

void cmd_sim_store_init(cmd_sim_store *s) {
    memset(s, 0, sizeof *s);
    s->match_delay_s = -1;
}

int cmd_sim_store_validate(const char *cmd, cmd_sim_store *s, char *const *policies, int n) {
    int any = 0;
    for (int i = 0; i < n; i++) any |= takes_store(policies[i]);
    if (!s->mode_given) s->mode = s->path ? FMOE_STORE_OFFLINE : FMOE_STORE_ONLINE;
    if (s->mode != FMOE_STORE_ONLINE && !s->path && any)
        return cmd_usage_error(cmd, "--store-mode %s needs --store STORE.h5", mode_name(s->mode));
    if (s->holdout && !s->path)
        return cmd_usage_error(cmd, "--holdout needs --store STORE.h5 (its split says which "
                                    "requests were held out)");
    if (s->path && s->mode == FMOE_STORE_ONLINE && !s->holdout)
        return cmd_usage_error(cmd, "--store-mode online starts from an empty store; drop "
                                    "--store, or use --store-mode offline-update");
    return 0;
}

int cmd_store_check_model(const char *cmd, const char *store_path, const fmoe_store_file *f,
                          const char *what, const char *what_name, const char *fingerprint,
                          int32_t layers, int32_t experts, int32_t top_k) {
    const fmoe_expertmap_config *c = fmoe_expertmap_config_of(f->store);
    if (f->model_fingerprint[0] && fingerprint[0] &&
        strcmp(f->model_fingerprint, fingerprint) != 0)
        return cmd_failf(cmd,
                         "%s was built for model %s (fingerprint %s) but %s is model %s "
                         "(fingerprint %s); build a store from traces of this model",
                         store_path, f->model_name[0] ? f->model_name : "(unnamed)",
                         f->model_fingerprint, what, what_name[0] ? what_name : "(unnamed)",
                         fingerprint);
    if (c->num_layers != layers || c->num_experts != experts || c->top_k != top_k)
        return cmd_failf(cmd,
                         "%s holds maps of %d MoE layers x %d experts, top-%d, but %s has %d x "
                         "%d, top-%d",
                         store_path, c->num_layers, c->num_experts, c->top_k, what, layers,
                         experts, top_k);
    return 0;
}

static const char *base_name(const char *p) {
    const char *b = strrchr(p, '/');
    return b ? b + 1 : p;
}

/* --holdout of a trace that matches none of the store's sources (fmoe_store_find_source:
 * by `created` and request count). Says what differs: a source of the same file name is
 * most likely this trace recorded or imported again after the store was built, so its
 * creation time and request count are set beside the trace's; else the sources are
 * listed. @return 1 (printed). */
static int not_a_source(const char *cmd, const cmd_sim_store *s, const fmoe_trace_header *h,
                        int64_t R, const char *trace_path) {
    const fmoe_store_file *f = s->file;
    for (int32_t i = 0; i < f->num_sources; i++) {
        const fmoe_store_source *src = &f->sources[i];
        if (strcmp(base_name(src->path), base_name(trace_path)) != 0) continue;
        return cmd_failf(cmd,
                         "%s is not the trace %s was built from, though it has its name: the "
                         "store's source %s was created %s with %lld requests, %s was created "
                         "%s with %lld (recorded or imported again since the store was "
                         "built?); --holdout needs the store's own trace: rebuild the store "
                         "from this one",
                         trace_path, s->path, src->path, src->created,
                         (long long)src->num_requests, trace_path,
                         h->created[0] ? h->created : "(unknown)", (long long)R);
    }
    char list[512] = "";
    size_t len = 0;
    for (int32_t i = 0; i < f->num_sources && len < sizeof list; i++)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%s (created %s, %lld requests)",
                                i ? ", " : "", f->sources[i].path, f->sources[i].created,
                                (long long)f->sources[i].num_requests);
    return cmd_failf(cmd,
                     "%s (created %s, %lld requests) is not one of the traces %s was built from "
                     "(%s); --holdout needs one of them",
                     trace_path, h->created[0] ? h->created : "(unknown)", (long long)R,
                     s->path, f->num_sources ? list : "none");
}

int cmd_sim_store_prepare(const char *cmd, cmd_sim_store *s, char *const *policies, int n,
                          const char *trace_path, fmoe_trace_reader *r, uint32_t *want,
                          int quiet) {
    const fmoe_trace_header *h = fmoe_trace_reader_header(r);
    int any = 0;
    for (int i = 0; i < n; i++) any |= takes_store(policies[i]);
    if (!s->path && !any) return 0;
    if (s->path) {
        int rc = fmoe_store_read(s->path, 0, &s->file);
        if (rc < 0) return cmd_fail(cmd, rc);
        if ((rc = cmd_store_check_model(cmd, s->path, s->file, trace_path, h->model_name,
                                        h->model_fingerprint, h->num_layers, h->num_experts,
                                        h->top_k)) != 0)
            return rc;
    }
    const int64_t R = fmoe_trace_reader_num_requests(r);
    const fmoe_trace_request_info *req = fmoe_trace_reader_requests(r);
    const int32_t src = s->file ? fmoe_store_find_source(s->file, h, R, trace_path) : -1;
    s->tokens = 0;
    for (int64_t q = 0; q < R; q++) s->tokens += req[q].token_count;
    if (s->holdout) {
        if (src < 0)
            return not_a_source(cmd, s, h, R, trace_path);
        s->keep = calloc((size_t)(R ? R : 1), 1);
        if (!s->keep) return cmd_failf(cmd, "out of memory");
        /* request ids are unique within a trace: match the held-out list by id */
        for (int64_t q = 0; q < R; q++)
            for (int64_t i = 0; i < s->file->num_held_out; i++)
                if (s->file->held_out_source[i] == src && s->file->held_out_id[i] == req[q].id) {
                    s->keep[q] = 1;
                    s->kept++;
                    break;
                }
        if (s->kept == 0)
            return cmd_failf(cmd, "%s holds no held-out requests of %s (built with --split 1?)",
                             s->path, trace_path);
        if (!quiet)
            fprintf(stderr, "fmoe %s: --holdout: replaying the %lld of %lld requests %s held out\n",
                    cmd, (long long)s->kept, (long long)R, s->path);
    } else if (src >= 0 && any && s->mode != FMOE_STORE_ONLINE && !quiet) {
        fprintf(stderr,
                "fmoe %s: note: %s was built from requests of %s; the fmoe policies are then "
                "evaluated partly on what they have seen (use --holdout)\n",
                cmd, s->path, trace_path);
    }
    if (!any) return 0;
    const int32_t store_h =
        s->file ? fmoe_expertmap_config_of(s->file->store)->semantic_dim : h->semantic_dim;
    if (h->semantic_dim > 0 && store_h == h->semantic_dim)
        *want |= FMOE_SIM_WANT_SEMANTIC;
    else if (!quiet)
        fprintf(stderr,
                "fmoe %s: note: no semantic embeddings (%s): the fmoe policies plan the first d "
                "layers from the store's most frequent experts\n",
                cmd,
                h->semantic_dim == 0 ? "the trace has none"
                : store_h == 0       ? "the store has none"
                                     : "the store's and the trace's sizes differ");
    if (s->file && !quiet) {
        const fmoe_expertmap_config *c = fmoe_expertmap_config_of(s->file->store);
        fprintf(stderr, "fmoe %s: store %s: %d of %d entries, mode %s\n", cmd, s->path,
                fmoe_expertmap_size(s->file->store), c->capacity, mode_name(s->mode));
    }
    return 0;
}

/* Sets a setting the cell's policy declares (the fmoe policies' settings behind
 * --store-mode and --store-capacity); the values are in range, so this cannot fail. */
static void set_setting(fmoe_sim_config *cell, const char *key, const char *value) {
    const int rc = fmoe_policy_settings_set(&cell->policy_settings, key, value);
    (void)rc;
    assert(rc == 0);
}

void cmd_sim_store_apply(const cmd_sim_store *s, fmoe_sim_config *cell) {
    if (!cell->policy || !takes_store(cell->policy)) return;
    cell->expert_store = s->file ? s->file->store : NULL;
    set_setting(cell, cmd_policy_opt_key("--store-mode"), mode_name(s->mode));
    int64_t cap = 0;
    if (s->capacity > 0)
        cap = s->capacity;
    else if (s->file) /* offline-update grows the store up to what build-store was asked */
        cap = s->file->capacity_asked > 0 ? s->file->capacity_asked
                                          : fmoe_expertmap_config_of(s->file->store)->capacity;
    /* The policy allocates the whole capacity up front, but a run adds at most one entry
     * per token of the trace, so rows beyond them stay empty (--store-capacity 100000000
     * asked for 116 GB): size it to what the run can fill, as build-store does. The
     * result is the same, since a store that never fills never evicts. */
    const int64_t fill =
        s->tokens + (s->file ? fmoe_expertmap_size(s->file->store) : 0);
    if (cap > fill) cap = fill > 0 ? fill : 1;
    if (cap > 0) { /* 0: the policy's default */
        char v[24];
        snprintf(v, sizeof v, "%lld", (long long)cap);
        set_setting(cell, cmd_policy_opt_key("--store-capacity"), v);
    }
}

int32_t cmd_sim_store_distance(const cmd_sim_store *s) {
    return s->file ? fmoe_expertmap_config_of(s->file->store)->prefetch_distance : 0;
}

void cmd_sim_store_distance_note(const char *cmd, const cmd_sim_store *s,
                                 const fmoe_sim_config *cells, size_t n) {
    if (!s->file) return;
    const int32_t d = cmd_sim_store_distance(s);
    char list[256] = "";
    size_t len = 0;
    int32_t seen[64];
    int n_seen = 0;
    for (size_t i = 0; i < n; i++) {
        const fmoe_policy_ops *ops = cells[i].policy ? fmoe_policy_find(cells[i].policy) : NULL;
        if (!ops || !(ops->flags & FMOE_POLICY_TAKES_STORE) ||
            !(ops->flags & FMOE_POLICY_PREFETCHES))
            continue;
        /* 0: the policy's own default, which it runs at */
        const int32_t ran = cells[i].prefetch_distance > 0 ? cells[i].prefetch_distance
                                                           : ops->default_distance;
        int dup = ran == d;
        for (int k = 0; k < n_seen && !dup; k++) dup = seen[k] == ran;
        if (dup || n_seen == (int)(sizeof seen / sizeof *seen)) continue;
        seen[n_seen++] = ran;
        if (len < sizeof list)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", len ? ", " : "",
                                    (int)ran);
    }
    if (n_seen == 0) return;
    if (d == 0)
        fprintf(stderr,
                "fmoe %s: note: %s was built for prefetch distance 0, which a prefetching "
                "policy cannot run at; the fmoe policies run at %s\n",
                cmd, s->path, list);
    else
        fprintf(stderr,
                "fmoe %s: note: %s was built for prefetch distance %d (its redundancy scores "
                "weight the layers for it); the fmoe policies also run at %s, as "
                "--prefetch-distance asks\n",
                cmd, s->path, (int)d, list);
}

void cmd_sim_store_costs(const cmd_sim_store *s, fmoe_sim_costs *costs) {
    if (s->match_delay_s >= 0) costs->match_delay_s = s->match_delay_s;
}

void cmd_sim_store_free(cmd_sim_store *s) {
    fmoe_store_file_free(s->file);
    free(s->keep);
    s->file = NULL;
    s->keep = NULL;
}
