/*
 * fmoe/cache.h - the expert-slot cache: which routed experts occupy the fast tier.
 *
 * N slots, each holding one routed expert (layer l, expert j), identified by the expert
 * id e = l * J + j. A slot is free, loading (a transfer into it is in flight) or resident.
 * Pins keep a slot from being chosen as a victim. The cache also keeps the bookkeeping that
 * eviction policies read: per slot the access tick of the last access and the number of
 * accesses since the expert was loaded; per expert the lifetime access count and last tick.
 *
 * The cache is pure state shared by both executors (sim/ and, later, runtime/): it knows
 * nothing of time, transfers or policies. The executor decides hits and misses, asks the
 * policy for a victim and calls insert/evict/touch; policies read the cache through the
 * const view (fmoe_cache_view), which stays valid for the cache's lifetime.
 *
 * "Tick" is a logical clock: the number of accesses touched so far. Thread safety: none; one
 * cache per executor thread. No allocation after init.
 */
#ifndef FMOE_CACHE_H
#define FMOE_CACHE_H

#include <stdint.h>

typedef enum fmoe_slot_state {
    FMOE_SLOT_FREE = 0,
    FMOE_SLOT_LOADING = 1,  /* reserved for an expert whose transfer has not completed */
    FMOE_SLOT_RESIDENT = 2,
} fmoe_slot_state;

/* What policies may read. All arrays are owned by the cache. */
typedef struct fmoe_cache_view {
    int32_t num_layers;             /* L */
    int32_t num_experts;            /* J */
    int32_t capacity;               /* N slots */
    int32_t used;                   /* slots not free */
    uint64_t tick;                  /* accesses touched so far */
    uint64_t version;               /* bumped by every change to the cache (a policy may keep
                                       what it computed from the view while it is the same) */
    const int32_t *slot_expert;     /* [N] expert id l*J+j, -1 when free */
    const uint8_t *slot_state;      /* [N] fmoe_slot_state */
    const uint16_t *slot_pins;      /* [N] pin count; pinned slots are never victims */
    const uint64_t *slot_last_access; /* [N] tick of the last access (the load tick before any) */
    const uint64_t *slot_accesses;  /* [N] accesses since the expert was loaded */
    const uint64_t *slot_loaded_at; /* [N] tick at which the expert was inserted */
    const int32_t *expert_slot;     /* [L*J] slot holding the expert, -1 when absent */
    const uint64_t *expert_accesses;    /* [L*J] lifetime accesses (survive eviction) */
    const uint64_t *expert_last_access; /* [L*J] tick of the last access, 0 = never */
} fmoe_cache_view;

typedef struct fmoe_cache fmoe_cache;

/* Creates an empty cache of `capacity` slots for L layers of J experts.
 * @return 0, FMOE_EINVAL (capacity < 1, L or J < 1, or L*J too large), FMOE_ENOMEM. */
int fmoe_cache_init(fmoe_cache **out, int32_t num_layers, int32_t num_experts, int32_t capacity);

/* Frees the cache. NULL is a no-op. */
void fmoe_cache_free(fmoe_cache *c);

/* Empties every slot and zeroes all bookkeeping (the tick included). */
void fmoe_cache_reset(fmoe_cache *c);

/* @return the view; valid until fmoe_cache_free. */
const fmoe_cache_view *fmoe_cache_view_of(const fmoe_cache *c);

/* @return the slot holding expert id `e` (any state but free), or -1. */
static inline int32_t fmoe_cache_lookup(const fmoe_cache_view *v, int32_t e) {
    return v->expert_slot[e];
}

/* @return 1 when slot s may be evicted: resident and unpinned. */
static inline int fmoe_cache_evictable(const fmoe_cache_view *v, int32_t s) {
    return v->slot_state[s] == FMOE_SLOT_RESIDENT && v->slot_pins[s] == 0;
}

/* @return a free slot, or -1 when all are taken. O(1). */
int32_t fmoe_cache_free_slot(const fmoe_cache *c);

/* Puts expert `e` into free slot `s` as `state` (LOADING or RESIDENT). Its accesses-since-
 * load count starts at 0 and its last-access tick at the current tick.
 * @return 0, or FMOE_EINVAL (slot not free, expert already cached, bad ids). */
int fmoe_cache_insert(fmoe_cache *c, int32_t s, int32_t e, fmoe_slot_state state);

/* Empties slot `s`. @return 0, or FMOE_EINVAL (slot free or pinned). Evicting a LOADING slot
 * is allowed (a cancelled transfer). */
int fmoe_cache_evict(fmoe_cache *c, int32_t s);

/* LOADING -> RESIDENT (the transfer completed). @return 0 or FMOE_EINVAL. */
int fmoe_cache_mark_resident(fmoe_cache *c, int32_t s);

/* Records one access to the expert in slot `s`: advances the tick, stamps the slot and the
 * expert, and counts it. Allowed in any non-free state. */
void fmoe_cache_touch(fmoe_cache *c, int32_t s);

/* Records an access to expert `e` that is not cached (a bypassed miss): the tick advances
 * and the expert's lifetime counters change, no slot does. */
void fmoe_cache_touch_uncached(fmoe_cache *c, int32_t e);

/* Pin counting. Unpinning an unpinned slot is FMOE_EINVAL. */
int fmoe_cache_pin(fmoe_cache *c, int32_t s);
int fmoe_cache_unpin(fmoe_cache *c, int32_t s);

#endif
