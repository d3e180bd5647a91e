/*
 * serve_logprobs.h - the log-probabilities `fmoe serve` reports (OpenAI's `logprobs`):
 * those of the model's raw distribution, log_softmax(logits), before temperature, top-k
 * and top-p shape it for sampling (as OpenAI and vLLM report them by default), so the same
 * token has the same logprob whatever the sampling settings.
 *
 * Cost per token, V the vocabulary and k the top alternatives asked (k <= 20): one pass for
 * the maximum, one for the log-sum-exp (in double, from the maximum down: stable), and a
 * bounded min-heap of k candidates for the top ones, O(V log k) at worst and O(V) when
 * few logits beat the heap's root, never a sort of the vocabulary.
 */
#ifndef FMOE_SERVE_LOGPROBS_H
#define FMOE_SERVE_LOGPROBS_H

#include <stdint.h>

/* The most alternatives a request may ask for: chat's top_logprobs (completions: 5). */
#define SERVE_MAX_TOP_LOGPROBS 20

/* One generated token's log-probability and its top alternatives. */
typedef struct serve_token_logprob {
    int32_t id;
    float logprob;                               /* log p(id); -inf for a NaN logit */
    int32_t num_top;
    int32_t top_id[SERVE_MAX_TOP_LOGPROBS];      /* most likely first, lower id on ties */
    float top_logprob[SERVE_MAX_TOP_LOGPROBS];
    /* the engine's: bytes of the request's text once this token was decoded (without a
     * trailing incomplete UTF-8 sequence); the token's text starts at the previous one's */
    uint64_t text_end;
} serve_token_logprob;

/* Fills *out for token `id` of logits[0..V) (NaN counts as -inf) with the top k
 * (clamped to [0, min(V, SERVE_MAX_TOP_LOGPROBS)]) alternatives. Allocates nothing. */
void fmoe_serve_logprobs_of(const float *logits, int32_t V, int32_t id, int32_t k,
                            serve_token_logprob *out);

#endif
