/*
 * serve_prefix.c - the prefix cache beyond the sequence slots (serve_prefix.h).
 */
#include "serve_prefix.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"

typedef struct entry {
    fmoe_session *session;
    int32_t *tokens;  /* [max_context] */
    int32_t n;        /* tokens held; 0: empty */
    int64_t used_at;  /* the pool's clock when last saved or loaded */
} entry;

struct serve_prefix_pool {
    entry *e;
    int32_t count;
    int32_t max_context;
    int64_t clock;
    int64_t bytes;
    atomic_llong held_tokens, evictions;
};

int32_t fmoe_serve_common_prefix(const int32_t *a, int32_t na, const int32_t *b, int32_t nb) {
    const int32_t most = na < nb ? na : nb;
    int32_t n = 0;
    while (n < most && a[n] == b[n]) n++;
    return n;
}

void fmoe_serve_prefix_pool_free(serve_prefix_pool *p) {
    if (!p) return;
    for (int32_t i = 0; p->e && i < p->count; i++) {
        fmoe_session_free(p->e[i].session);
        free(p->e[i].tokens);
    }
    free(p->e);
    free(p);
}

int fmoe_serve_prefix_pool_new(const fmoe_model *m, const fmoe_session_options *so,
                               int64_t bytes, serve_prefix_pool **out) {
    *out = NULL;
    if (bytes <= 0) return 0;
    FMOE_RETURN_ERROR_IF(!fmoe_model_prefix_reusable(m), FMOE_EINVAL,
                         "--prefix-cache-gb: this model's rotary embedding depends on the "
                         "whole call's length, so its prefixes cannot be reused");
    /* entries hold a KV cache only: one row of activations, one sequence */
    fmoe_session_options o = *so;
    o.max_batch = 1;
    o.max_sequences = 1;
    o.all_logits = 0;
    o.speculative_depth = 0;
    fmoe_session *first = NULL;
    FMOE_FORWARD_IF_ERROR(fmoe_session_init(m, &o, &first));
    const int64_t kv = fmoe_session_kv_bytes(first);
    int64_t count = kv > 0 ? bytes / kv : 1;
    if (count < 1) count = 1;
    if (count > 4096) count = 4096;
    serve_prefix_pool *p = calloc(1, sizeof *p);
    if (p) p->e = calloc((size_t)count, sizeof *p->e);
    if (!p || !p->e) {
        fmoe_session_free(first);
        free(p);
        return fmoe_error_set(FMOE_ENOMEM, "out of memory for the prefix cache");
    }
    p->count = (int32_t)count;
    p->max_context = o.max_context;
    p->bytes = count * kv;
    p->e[0].session = first;
    int rc = 0;
    for (int32_t i = 0; i < p->count && rc == 0; i++) {
        if (i > 0) rc = fmoe_session_init(m, &o, &p->e[i].session);
        if (rc == 0 && !(p->e[i].tokens = malloc((size_t)o.max_context * sizeof(int32_t))))
            rc = fmoe_error_set(FMOE_ENOMEM, "out of memory for the prefix cache");
    }
    if (rc < 0) {
        fmoe_error_prefix("--prefix-cache-gb: %d caches of %.1f MiB", p->count,
                          (double)kv / (1 << 20));
        fmoe_serve_prefix_pool_free(p);
        return rc;
    }
    *out = p;
    return 0;
}

int32_t fmoe_serve_prefix_pool_best(const serve_prefix_pool *p, const int32_t *prompt,
                                    int32_t n, int32_t *keep) {
    int32_t best = -1, best_keep = 0;
    for (int32_t i = 0; p && i < p->count; i++) {
        int32_t k = fmoe_serve_common_prefix(p->e[i].tokens, p->e[i].n, prompt, n);
        if (k > n - 1) k = n - 1;
        if (k > best_keep) {
            best = i;
            best_keep = k;
        }
    }
    *keep = best_keep;
    return best;
}

int fmoe_serve_prefix_pool_save(serve_prefix_pool *p, const fmoe_session *src,
                                const int32_t *tokens, int32_t n, int32_t except) {
    if (!p || n <= 0 || n > p->max_context) return 0;
    int32_t slot = -1;
    for (int32_t i = 0; i < p->count && slot < 0; i++) /* the same chat, a turn before */
        if (i != except && p->e[i].n > 0 && p->e[i].n <= n &&
            fmoe_serve_common_prefix(p->e[i].tokens, p->e[i].n, tokens, n) == p->e[i].n)
            slot = i;
    for (int32_t i = 0; i < p->count && slot < 0; i++) /* an empty one */
        if (i != except && p->e[i].n == 0) slot = i;
    if (slot < 0) /* else the least recently used */
        for (int32_t i = 0; i < p->count; i++)
            if (i != except && (slot < 0 || p->e[i].used_at < p->e[slot].used_at)) slot = i;
    if (slot < 0) return 0; /* a pool of one entry, which is `except` */
    entry *e = &p->e[slot];
    const int superseded = e->n > 0 && e->n <= n &&
                           fmoe_serve_common_prefix(e->tokens, e->n, tokens, n) == e->n;
    if (e->n > 0 && !superseded) atomic_fetch_add(&p->evictions, 1);
    atomic_fetch_sub(&p->held_tokens, e->n);
    e->n = 0;
    FMOE_FORWARD_IF_ERROR(fmoe_session_copy_prefix(e->session, src, n));
    memcpy(e->tokens, tokens, (size_t)n * sizeof *tokens);
    e->n = n;
    e->used_at = ++p->clock;
    atomic_fetch_add(&p->held_tokens, n);
    return 0;
}

int fmoe_serve_prefix_pool_load(serve_prefix_pool *p, int32_t entry_index, fmoe_session *dst,
                                int32_t keep) {
    entry *e = &p->e[entry_index];
    FMOE_FORWARD_IF_ERROR(fmoe_session_copy_prefix(dst, e->session, keep));
    e->used_at = ++p->clock;
    return 0;
}

void fmoe_serve_prefix_pool_stats(const serve_prefix_pool *p, serve_prefix_stats *out) {
    memset(out, 0, sizeof *out);
    if (!p) return;
    out->entries = p->count;
    out->bytes = p->bytes;
    out->held_tokens = atomic_load_explicit(&((serve_prefix_pool *)p)->held_tokens,
                                            memory_order_relaxed);
    out->evictions = atomic_load_explicit(&((serve_prefix_pool *)p)->evictions,
                                          memory_order_relaxed);
}
