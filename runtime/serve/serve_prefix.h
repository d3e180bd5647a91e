/*
 * serve_prefix.h - the prefix cache beyond the sequence slots (fmoe serve
 * --prefix-cache-gb): KV caches of finished requests, each with the tokens it holds, kept
 * in sessions of their own so that more conversations than --parallel keep their prefixes
 * between turns. The engine (serve_engine.c) saves a slot's cache here before another
 * request takes the slot, and copies an entry's prefix into a slot when it spares more of
 * a new prompt than the slot's own cache (fmoe_session_copy_prefix). Entries are replaced
 * least recently used first, except one whose tokens a new cache extends (the same chat,
 * one turn on), which the new cache replaces. Scheduler thread only; the counters may be
 * read from any thread (relaxed: they are gauges).
 */
#ifndef FMOE_SERVE_PREFIX_H
#define FMOE_SERVE_PREFIX_H

#include <stdint.h>

#include "fmoe/model.h"

typedef struct serve_prefix_pool serve_prefix_pool;

/* Tokens a and b have in common from their start. */
int32_t fmoe_serve_common_prefix(const int32_t *a, int32_t na, const int32_t *b, int32_t nb);

/* A pool of as many entries as `bytes` holds KV caches of `so`'s context (at least one
 * when bytes > 0; *out NULL when bytes is 0). @return 0, FMOE_EINVAL (a model whose
 * prefixes cannot be reused), FMOE_ENOMEM (the detail says how much). */
int fmoe_serve_prefix_pool_new(const fmoe_model *m, const fmoe_session_options *so,
                               int64_t bytes, serve_prefix_pool **out);
void fmoe_serve_prefix_pool_free(serve_prefix_pool *p);

/* The entry that spares most of prompt[0..n) (its common prefix, at most n - 1: the last
 * prompt token always runs) into *keep, or -1 (and 0) when none spares anything. */
int32_t fmoe_serve_prefix_pool_best(const serve_prefix_pool *p, const int32_t *prompt,
                                    int32_t n, int32_t *keep);

/* Keeps src's first n positions, whose tokens are tokens[0..n), in an entry other than
 * `except` (-1: none): the entry a prefix of these tokens was kept in, else the least
 * recently used. @return 0, or copy_prefix's error (nothing kept). */
int fmoe_serve_prefix_pool_save(serve_prefix_pool *p, const fmoe_session *src,
                                const int32_t *tokens, int32_t n, int32_t except);

/* Copies entry's first keep positions into dst (its position then keep) and marks the
 * entry used. @return 0 or copy_prefix's error. */
int fmoe_serve_prefix_pool_load(serve_prefix_pool *p, int32_t entry, fmoe_session *dst,
                                int32_t keep);

typedef struct serve_prefix_stats {
    int32_t entries;        /* the pool's size */
    int64_t bytes;          /* its KV memory, allocated at start */
    int64_t held_tokens;    /* tokens the entries hold now */
    int64_t evictions;      /* entries holding tokens replaced by another conversation's */
} serve_prefix_stats;

void fmoe_serve_prefix_pool_stats(const serve_prefix_pool *p, serve_prefix_stats *out);

#endif
