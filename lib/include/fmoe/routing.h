/*
 * fmoe/routing.h - the words of a routing record that the trace format and the core both
 * use: what its gate probabilities hold (the trace attribute probs_kind; the policies'
 * fmoe_policy_config) and a token's phase (/tokens/phase; fmoe/analysis.h). Here, below
 * trace/ and lib/'s policies alike, so that lib/ never includes fmoe/trace.h.
 */
#ifndef FMOE_ROUTING_H
#define FMOE_ROUTING_H

typedef enum fmoe_probs_kind {
    FMOE_PROBS_NONE = 0, /* no /tokens/probs: probabilities unknown */
    FMOE_PROBS_TOPK = 1, /* only the chosen experts' weights are known; others stored as 0 */
    FMOE_PROBS_FULL = 2, /* the full gate distribution over J experts */
} fmoe_probs_kind;

/* A token's phase: prompt (prefill) or generated (decode). */
enum { FMOE_PHASE_PREFILL = 0, FMOE_PHASE_DECODE = 1 };

#endif
