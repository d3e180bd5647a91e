/*
 * expert_tier.h - the slow tier of live offloading (fmoe/offload.h): where every routed
 * expert lives, and the one operation the copy engine needs, "bytes [lo, hi) of expert
 * (l, j) into a slot". An expert's bytes are its three matrices as stored (the
 * checkpoint's dtype, or a GGUF file's blocks), gate then up then down, each row-major; a
 * slot holds each matrix in a region of its own and fmoe__expert_tier_view describes them
 * to the forward pass. A layer's experts are alike; layers may differ in types and so in
 * bytes (a llama-quantize mix), and every slot is large enough for any layer's expert.
 *
 * Kinds: host (every routed expert copied once into one RAM block at open) and file
 * (pread from the model's files, O_DIRECT when asked, each read split into segments kept
 * up to read_depth requests deep by reader threads the tier owns: lib/preader.h).
 * Thread safety: reads may run on any thread once open returned, one at a time.
 */
#ifndef FMOE_EXPERT_TIER_H
#define FMOE_EXPERT_TIER_H

#include <stdint.h>

#include "fmoe/model.h"
#include "fmoe/offload.h"

typedef struct fmoe_expert_tier fmoe_expert_tier;

/* read_depth: the file tier's requests in flight per read (0: FMOE_PREADER_DEFAULT_DEPTH;
 * 1: one request per matrix piece, in order, no thread). @return 0, FMOE_EUNSUPPORTED
 * (experts of one layer of mixed types or shapes), FMOE_EIO (a file cannot be opened;
 * named), FMOE_EINVAL (a depth over FMOE_PREADER_MAX_DEPTH), FMOE_ENOMEM. */
int fmoe__expert_tier_open(fmoe_expert_tier **out, const fmoe_model *m, fmoe_tier_kind kind,
                           int direct_io, int32_t read_depth);
void fmoe__expert_tier_close(fmoe_expert_tier *t);

/* Bytes of the largest routed expert (all three matrices): what a slot must hold. */
int64_t fmoe__expert_tier_expert_bytes(const fmoe_expert_tier *t);
/* Bytes of one routed expert of layer l: what a transfer of it moves. */
int64_t fmoe__expert_tier_layer_bytes(const fmoe_expert_tier *t, int32_t l);
/* Bytes of a slot, a multiple of 4096: more than the expert's when O_DIRECT reads land in
 * the slot in place (each matrix keeps its file offset's alignment). Slots must start
 * 4096-aligned. */
int64_t fmoe__expert_tier_slot_bytes(const fmoe_expert_tier *t);
/* FMOE_TIER_HOST or FMOE_TIER_FILE: what AUTO chose. */
fmoe_tier_kind fmoe__expert_tier_kind(const fmoe_expert_tier *t);

/* Copies bytes [offset, offset + bytes) of expert (l, j) (its matrices concatenated) into
 * their places in `slot`. @return 0 or FMOE_EIO ("model-00003.safetensors: read at
 * 123456: Input/output error"). */
int fmoe__expert_tier_read(fmoe_expert_tier *t, int32_t l, int32_t j, int64_t offset,
                           int64_t bytes, void *slot);

/* The matrices of expert (l, j) as laid out at `base` (a slot's bytes). Pointer
 * arithmetic only: `base` is never read, so it may be a device slot's address (the views'
 * on_device is left 0 for the caller to set). */
void fmoe__expert_tier_view(const fmoe_expert_tier *t, int32_t l, int32_t j,
                            const uint8_t *base, fmoe_expert_view *out);

/* A run of an expert's bytes in a slot: bytes [offset, offset + bytes) of the expert (its
 * matrices concatenated) lie at [slot_offset, slot_offset + bytes) of a slot. */
typedef struct fmoe__tier_range {
    int64_t slot_offset;
    int64_t offset;
    int64_t bytes;
} fmoe__tier_range;

/* Where fmoe__expert_tier_read(t, l, j, offset, bytes, slot) puts the bytes it was asked
 * for: at most three runs (one per matrix they touch; runs that continue each other in
 * both the slot and the expert are merged, so a tier without O_DIRECT's in-place layout
 * gives one), in order, covering exactly `bytes` bytes. A copy of a slot that moves only
 * these runs (a device slot filled from a staging slot) moves exactly the bytes read; the
 * margins an O_DIRECT read fills around them are not the expert's. @return the count. */
int32_t fmoe__expert_tier_ranges(const fmoe_expert_tier *t, int32_t l, int32_t j,
                                 int64_t offset, int64_t bytes, fmoe__tier_range out[3]);

/* The host tier's block: expert (l, j)'s bytes, in order, at
 * fmoe__expert_tier_host_offset(t, l, j) of *p, *bytes in all (every expert's bytes);
 * read-only after open, alive until close (a device executor pins it and copies to its
 * slots straight from it). @return 1 for the host tier; 0 and NULL, 0 for the file
 * tier. */
int fmoe__expert_tier_host_block(const fmoe_expert_tier *t, uint8_t **p, int64_t *bytes);
/* Where expert (l, j) starts in the host block (layers one after another, each layer's
 * experts at its own size). */
int64_t fmoe__expert_tier_host_offset(const fmoe_expert_tier *t, int32_t l, int32_t j);

#endif
