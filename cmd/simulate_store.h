/*
 * simulate_store.h - the expert-map store part of `fmoe simulate`. cmd_simulate.c
 * parses --store, --store-mode, --holdout, --store-capacity and --match-delay into a
 * cmd_sim_store (rows of its option table) and calls, in order:
 *
 *     cmd_sim_store_init -> (parse) -> cmd_sim_store_validate
 *     -> cmd_sim_store_prepare (trace open, before reading it) -> cmd_sim_store_costs
 *     -> cmd_sim_store_apply (per sweep cell) -> cmd_sim_store_free
 *
 * The functions that report print "fmoe <cmd>: ..." and return an exit status (0, 1 or 2).
 *
 * The store's mode and capacity are settings of the fmoe policies (store_mode,
 * store_capacity: fmoe/policy.h); --store-mode and --store-capacity are their shorthands,
 * folded with --policy-opt by cmd_simulate.c, and cmd_sim_store_apply hands them to each
 * cell as settings. The --policy-opt helpers live here too, for simulate and the live
 * commands (offload_cli.c) alike.
 */
#ifndef FMOE_CMD_SIMULATE_STORE_H
#define FMOE_CMD_SIMULATE_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "options.h"
#include "fmoe/policy.h"
#include "fmoe/sim.h"
#include "fmoe/store.h"
#include "fmoe/trace.h"

typedef struct cmd_sim_store {
    const char *path;      /* --store STORE.h5 */
    int32_t mode;          /* --store-mode: fmoe_store_mode */
    int mode_given;
    int holdout;           /* --holdout */
    int32_t capacity;      /* --store-capacity (online mode), 0: the default */
    double match_delay_s;  /* --match-delay, < 0: the profile's */
    fmoe_store_file *file; /* the loaded store */
    uint8_t *keep;         /* [R] requests to replay (--holdout), NULL: all */
    int64_t kept;
    int64_t tokens;        /* the trace's tokens: the most entries a run can add */
} cmd_sim_store;

/* The defaults: no store, mode chosen by validate, the profile's match delay. */
void cmd_sim_store_init(cmd_sim_store *s);

/* Checks the options against each other and the chosen policies. @return 0 or 2. */
int cmd_sim_store_validate(const char *cmd, cmd_sim_store *s, char *const *policies, int n);

/* Loads the store (checking it is for the trace's model), selects the --holdout requests,
 * and adds FMOE_SIM_WANT_SEMANTIC to *want when the policies can use the embeddings.
 * @return 0 or 1. */
int cmd_sim_store_prepare(const char *cmd, cmd_sim_store *s, char *const *policies, int n,
                          const char *trace_path, fmoe_trace_reader *r, uint32_t *want,
                          int quiet);

/* The prefetch distance the loaded store was built for (build-store --prefetch-distance),
 * which the fmoe policies run at unless --prefetch-distance says otherwise; 0 without a
 * store (or for a store built for distance 0). */
int32_t cmd_sim_store_distance(const cmd_sim_store *s);

/* One note on stderr when a cell[n] of a policy that takes the store and prefetches runs at
 * another distance than the store was built for (a --prefetch-distance that differs);
 * nothing without a store or when they agree. */
void cmd_sim_store_distance_note(const char *cmd, const cmd_sim_store *s,
                                 const fmoe_sim_config *cells, size_t n);

/* --match-delay overrides the profile's matcher delay. */
void cmd_sim_store_costs(const cmd_sim_store *s, fmoe_sim_costs *costs);

/* Hands the store, mode and capacity to a sweep cell whose policy takes a store. */
void cmd_sim_store_apply(const cmd_sim_store *s, fmoe_sim_config *cell);

/* Frees what prepare loaded; the struct may be reused after init. */
void cmd_sim_store_free(cmd_sim_store *s);

/* Refuses a store built for another model than `what` (a trace, or a model directory, of
 * model `what_name`): another fingerprint when both are known, or another geometry.
 * Shared by simulate and the live commands. @return 0 or 1 (printed). */
int cmd_store_check_model(const char *cmd, const char *store_path, const fmoe_store_file *f,
                          const char *what, const char *what_name, const char *fingerprint,
                          int32_t layers, int32_t experts, int32_t top_k);

#endif
