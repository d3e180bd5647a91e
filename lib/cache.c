/*
 * cache.c - the expert-slot cache (fmoe/cache.h).
 *
 * All arrays live in one allocation made at init (zstd's habit): slot arrays of N entries,
 * expert arrays of L*J entries, and a stack of free slots so that finding one is O(1).
 * The free stack is refilled in descending order so slots fill 0, 1, 2, ... from empty,
 * which keeps slot numbering (and therefore tie-breaking by slot) deterministic.
 */
#include "fmoe/cache.h"

#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"

struct fmoe_cache {
    fmoe_cache_view view;  /* const pointers below, seen by policies */
    int32_t *slot_expert;  /* [N] */
    uint8_t *slot_state;   /* [N] */
    uint16_t *slot_pins;   /* [N] */
    uint64_t *slot_last_access; /* [N] */
    uint64_t *slot_accesses;    /* [N] */
    uint64_t *slot_loaded_at;   /* [N] */
    int32_t *expert_slot;       /* [L*J] */
    uint64_t *expert_accesses;  /* [L*J] */
    uint64_t *expert_last_access; /* [L*J] */
    int32_t *free_stack;   /* [N] free slots; top at free_top - 1 */
    int32_t free_top;
    void *block;
};

#define MAX_EXPERT_IDS (1 << 30)

int fmoe_cache_init(fmoe_cache **out, int32_t num_layers, int32_t num_experts,
                    int32_t capacity) {
    *out = NULL;
    FMOE_RETURN_ERROR_IF(capacity < 1, FMOE_EINVAL, "cache capacity must be at least 1, got %d",
                         capacity);
    FMOE_RETURN_ERROR_IF(num_layers < 1 || num_experts < 1, FMOE_EINVAL,
                         "cache: %d layers of %d experts", num_layers, num_experts);
    FMOE_RETURN_ERROR_IF((int64_t)num_layers * num_experts > MAX_EXPERT_IDS, FMOE_EINVAL,
                         "cache: %d layers x %d experts is too many", num_layers, num_experts);
    const size_t n = (size_t)capacity, e = (size_t)num_layers * (size_t)num_experts;
    /* 8-byte arrays first, then 4-byte, then 2 and 1: every array stays aligned. */
    size_t bytes = sizeof(fmoe_cache) + 3 * n * 8 + 2 * e * 8 + e * 4 + 2 * n * 4 + n * 2 + n;
    fmoe_cache *c = calloc(1, bytes);
    if (!c) return fmoe_error_set(FMOE_ENOMEM, "cache of %d slots", capacity);
    char *p = (char *)(c + 1);
    c->slot_last_access = (uint64_t *)p; p += n * 8;
    c->slot_accesses = (uint64_t *)p; p += n * 8;
    c->slot_loaded_at = (uint64_t *)p; p += n * 8;
    c->expert_accesses = (uint64_t *)p; p += e * 8;
    c->expert_last_access = (uint64_t *)p; p += e * 8;
    c->expert_slot = (int32_t *)p; p += e * 4;
    c->slot_expert = (int32_t *)p; p += n * 4;
    c->free_stack = (int32_t *)p; p += n * 4;
    c->slot_pins = (uint16_t *)p; p += n * 2;
    c->slot_state = (uint8_t *)p;
    c->block = c;
    c->view = (fmoe_cache_view){
        .num_layers = num_layers,
        .num_experts = num_experts,
        .capacity = capacity,
        .slot_expert = c->slot_expert,
        .slot_state = c->slot_state,
        .slot_pins = c->slot_pins,
        .slot_last_access = c->slot_last_access,
        .slot_accesses = c->slot_accesses,
        .slot_loaded_at = c->slot_loaded_at,
        .expert_slot = c->expert_slot,
        .expert_accesses = c->expert_accesses,
        .expert_last_access = c->expert_last_access,
    };
    fmoe_cache_reset(c);
    *out = c;
    return 0;
}

void fmoe_cache_free(fmoe_cache *c) {
    if (!c) return;
    free(c->block);
}

void fmoe_cache_reset(fmoe_cache *c) {
    const int32_t n = c->view.capacity;
    const size_t e = (size_t)c->view.num_layers * (size_t)c->view.num_experts;
    for (int32_t s = 0; s < n; s++) {
        c->slot_expert[s] = -1;
        c->slot_state[s] = FMOE_SLOT_FREE;
        c->slot_pins[s] = 0;
        c->slot_last_access[s] = c->slot_accesses[s] = c->slot_loaded_at[s] = 0;
        c->free_stack[s] = n - 1 - s;
    }
    c->free_top = n;
    for (size_t i = 0; i < e; i++) {
        c->expert_slot[i] = -1;
        c->expert_accesses[i] = c->expert_last_access[i] = 0;
    }
    c->view.used = 0;
    c->view.tick = 0;
    c->view.version++;
}

const fmoe_cache_view *fmoe_cache_view_of(const fmoe_cache *c) { return &c->view; }

int32_t fmoe_cache_free_slot(const fmoe_cache *c) {
    return c->free_top > 0 ? c->free_stack[c->free_top - 1] : -1;
}

static int bad_slot(const fmoe_cache *c, int32_t s) { return s < 0 || s >= c->view.capacity; }

int fmoe_cache_insert(fmoe_cache *c, int32_t s, int32_t e, fmoe_slot_state state) {
    const int32_t ne = c->view.num_layers * c->view.num_experts;
    FMOE_RETURN_ERROR_IF(bad_slot(c, s) || e < 0 || e >= ne, FMOE_EINVAL,
                         "cache insert: slot %d, expert %d out of range", s, e);
    FMOE_RETURN_ERROR_IF(c->slot_state[s] != FMOE_SLOT_FREE, FMOE_EINVAL,
                         "cache insert: slot %d is not free", s);
    FMOE_RETURN_ERROR_IF(c->expert_slot[e] >= 0, FMOE_EINVAL,
                         "cache insert: expert %d already in slot %d", e, c->expert_slot[e]);
    FMOE_RETURN_ERROR_IF(state != FMOE_SLOT_LOADING && state != FMOE_SLOT_RESIDENT, FMOE_EINVAL,
                         "cache insert: bad state %d", (int)state);
    /* Remove s from the free stack; it is the top in the common case. */
    int32_t i = c->free_top - 1;
    while (i >= 0 && c->free_stack[i] != s) i--;
    FMOE_ASSERT(i >= 0);
    c->free_stack[i] = c->free_stack[c->free_top - 1];
    c->free_top--;
    c->slot_expert[s] = e;
    c->slot_state[s] = (uint8_t)state;
    c->slot_pins[s] = 0;
    c->slot_accesses[s] = 0;
    c->slot_last_access[s] = c->view.tick;
    c->slot_loaded_at[s] = c->view.tick;
    c->expert_slot[e] = s;
    c->view.used++;
    c->view.version++;
    return 0;
}

int fmoe_cache_evict(fmoe_cache *c, int32_t s) {
    FMOE_RETURN_ERROR_IF(bad_slot(c, s) || c->slot_state[s] == FMOE_SLOT_FREE, FMOE_EINVAL,
                         "cache evict: slot %d is not occupied", s);
    FMOE_RETURN_ERROR_IF(c->slot_pins[s] != 0, FMOE_EINVAL, "cache evict: slot %d is pinned", s);
    c->expert_slot[c->slot_expert[s]] = -1;
    c->slot_expert[s] = -1;
    c->slot_state[s] = FMOE_SLOT_FREE;
    c->free_stack[c->free_top++] = s;
    c->view.used--;
    c->view.version++;
    return 0;
}

int fmoe_cache_mark_resident(fmoe_cache *c, int32_t s) {
    FMOE_RETURN_ERROR_IF(bad_slot(c, s) || c->slot_state[s] != FMOE_SLOT_LOADING, FMOE_EINVAL,
                         "cache: slot %d is not loading", s);
    c->slot_state[s] = FMOE_SLOT_RESIDENT;
    c->view.version++;
    return 0;
}

void fmoe_cache_touch(fmoe_cache *c, int32_t s) {
    const uint64_t t = ++c->view.tick;
    const int32_t e = c->slot_expert[s];
    c->slot_last_access[s] = t;
    c->slot_accesses[s]++;
    c->expert_last_access[e] = t;
    c->expert_accesses[e]++;
    c->view.version++;
}

void fmoe_cache_touch_uncached(fmoe_cache *c, int32_t e) {
    const uint64_t t = ++c->view.tick;
    c->expert_last_access[e] = t;
    c->expert_accesses[e]++;
    c->view.version++;
}

int fmoe_cache_pin(fmoe_cache *c, int32_t s) {
    FMOE_RETURN_ERROR_IF(bad_slot(c, s) || c->slot_state[s] == FMOE_SLOT_FREE, FMOE_EINVAL,
                         "cache pin: slot %d is not occupied", s);
    FMOE_RETURN_ERROR_IF(c->slot_pins[s] == UINT16_MAX, FMOE_ERANGE, "cache pin: slot %d", s);
    c->slot_pins[s]++;
    c->view.version++;
    return 0;
}

int fmoe_cache_unpin(fmoe_cache *c, int32_t s) {
    FMOE_RETURN_ERROR_IF(bad_slot(c, s) || c->slot_pins[s] == 0, FMOE_EINVAL,
                         "cache unpin: slot %d is not pinned", s);
    c->slot_pins[s]--;
    c->view.version++;
    return 0;
}
