/*
 * expert_tier.c - the slow tier of live offloading (expert_tier.h).
 *
 * The routed experts of one layer have the same three shapes and types (slices of one
 * stacked tensor, or the same checkpoint dtype); layers may differ (a llama-quantize mix
 * such as Q4_K_M stores some layers' down projections with more bits), so each layer has
 * its format: an expert is `bytes` = gate + up + down bytes of its layer, a byte range of
 * it maps to at most three pieces of its matrices, and its matrices sit in a slot at its
 * layer's regions. A slot is as large as the largest layer's layout. host: one block of
 * every expert's bytes, layer after layer, filled at open; a read is a memcpy.
 * file: each matrix's file and offset (fmoe_model_expert_tensors), a read is its matrix
 * pieces read at once, in segments several requests deep (lib/preader.h); with O_DIRECT the range is widened to the device's alignment and read
 * straight into the slot, whose regions keep each matrix's file alignment (no copy: the
 * disk's DMA fills the slot). Only when a matrix's file offset does not suit its dtype is
 * it read through a bounce buffer (one per reading thread: the copy engine has one).
 * Experts of a GGUF file hold their quantized bytes (rows of ggml blocks) all the way:
 * the tier, the slots and the transfers move blocks, never widened values.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "expert_tier.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fmoe/error.h"
#include "files.h"
#include "preader.h"

#define DIRECT_ALIGN 4096

/* The format of one layer's experts. */
typedef struct layer_format {
    fmoe_st_dtype dtype[3];     /* gate, up, down */
    uint32_t quant[3];          /* 0, or the matrix's ggml block type (a GGUF file, where
                                   a row too short for the blocks keeps its float type) */
    int64_t rows[3], cols[3];
    int64_t mat_bytes[3];
    int64_t bytes;              /* per expert */
    /* Where matrix i of an expert sits in a slot: at region[i], plus, in place, the
     * matrix's file offset modulo DIRECT_ALIGN (so O_DIRECT reads land in the slot itself,
     * aligned, with no bounce copy). */
    int64_t region[3];
    int64_t host_base;          /* the layer's first expert in the host block */
} layer_format;

struct fmoe_expert_tier {
    fmoe_tier_kind kind;
    int32_t L, J;
    layer_format *lf;           /* [L] */
    int64_t bytes;              /* the largest layer's expert */
    int64_t slot_bytes;         /* a slot's size, a multiple of DIRECT_ALIGN: the largest
                                   layer's layout */
    int in_place;
    const fmoe_model *m;
    uint8_t *host;              /* every expert's bytes, layer by layer (host) */
    int64_t host_bytes;
    /* file */
    int direct;
    int32_t num_files;
    char **paths;               /* [num_files] */
    int *fds;                   /* [num_files] */
    int32_t *file_of;           /* [L·J·3] */
    int64_t *offset_of;         /* [L·J·3] byte offset of the matrix in its file */
    uint8_t *bounce;            /* O_DIRECT staging */
    int64_t bounce_bytes;
    /* The reads of one fmoe__expert_tier_read are split into segments, up to `depth` in
     * flight (lib/preader.h): a disk at queue depth 1 is idle between requests. */
    fmoe__preader *reader;
    /* Fault injection for the tests of a failing disk: with FMOE_FAULT_READ_EIO_AFTER=n
     * in the environment, every file-tier read after the first n fails with EIO; with
     * FMOE_FAULT_READ_EIO_SEGMENT=k, segment k of every read fails with EIO as the disk
     * would (the others are read, the whole read fails). */
    int64_t reads, fail_after;
};

/* ------------------------------------------------------------------ open / close */

void fmoe__expert_tier_close(fmoe_expert_tier *t) {
    if (!t) return;
    free(t->lf);
    free(t->host);
    for (int32_t i = 0; i < t->num_files; i++) {
        if (t->fds && t->fds[i] >= 0) close(t->fds[i]);
        free(t->paths ? t->paths[i] : NULL);
    }
    free(t->paths);
    free(t->fds);
    free(t->file_of);
    free(t->offset_of);
    free(t->bounce);
    fmoe__preader_close(t->reader);
    free(t);
}

/* The file index of `path`, opened once. */
static int file_index(fmoe_expert_tier *t, const char *path, int32_t *out) {
    for (int32_t i = 0; i < t->num_files; i++)
        if (strcmp(t->paths[i], path) == 0) {
            *out = i;
            return 0;
        }
    char **np = realloc(t->paths, (size_t)(t->num_files + 1) * sizeof *np);
    if (!np) return fmoe_error_set(FMOE_ENOMEM, "out of memory");
    t->paths = np;
    int *nf = realloc(t->fds, (size_t)(t->num_files + 1) * sizeof *nf);
    if (!nf) return fmoe_error_set(FMOE_ENOMEM, "out of memory");
    t->fds = nf;
    t->paths[t->num_files] = strdup(path);
    t->fds[t->num_files] = -1;
    if (!t->paths[t->num_files]) return fmoe_error_set(FMOE_ENOMEM, "out of memory");
    const int fd = open(path, O_RDONLY | O_CLOEXEC | (t->direct ? O_DIRECT : 0));
    t->num_files++;
    if (fd < 0)
        return fmoe_error_set(FMOE_EIO, "%s: %s%s", path, strerror(errno),
                              t->direct ? " (O_DIRECT: try without --direct-io)" : "");
    t->fds[t->num_files - 1] = fd;
    *out = t->num_files - 1;
    return 0;
}

static int64_t free_ram_bytes(void) {
    const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (int64_t)pages * page : 0;
}

fmoe_tier_kind fmoe_offload_resolve_tier(const fmoe_model *m, fmoe_tier_kind kind) {
    if (kind != FMOE_TIER_AUTO) return kind;
    return fmoe_model_routed_expert_bytes(m) <= free_ram_bytes() / 2 ? FMOE_TIER_HOST
                                                                       : FMOE_TIER_FILE;
}

int fmoe__expert_tier_open(fmoe_expert_tier **out, const fmoe_model *m, fmoe_tier_kind kind,
                           int direct_io, int32_t read_depth) {
    *out = NULL;
    const fmoe_model_geometry *g = fmoe_model_get_geometry(m);
    fmoe_expert_tier *t = calloc(1, sizeof *t);
    if (!t) return fmoe_error_set(FMOE_ENOMEM, "out of memory");
    t->m = m;
    t->L = g->num_moe_layers;
    t->J = g->num_experts;
    t->direct = direct_io;
    const char *fault = getenv("FMOE_FAULT_READ_EIO_AFTER");
    t->fail_after = fault && fault[0] ? strtoll(fault, NULL, 10) : -1;
    const int64_t n = (int64_t)t->L * t->J;
    int rc = 0;
    t->lf = calloc((size_t)(t->L > 0 ? t->L : 1), sizeof *t->lf);
    if (!t->lf) {
        rc = fmoe_error_set(FMOE_ENOMEM, "out of memory");
        goto fail;
    }
    for (int64_t e = 0; e < n && rc == 0; e++) {
        fmoe_expert_tensors x;
        const int32_t l = (int32_t)(e / t->J), j = (int32_t)(e % t->J);
        rc = fmoe_model_expert_tensors(m, l, j, &x);
        if (rc < 0) break;
        layer_format *f = &t->lf[l];
        const fmoe_expert_tensor *mats[3] = {&x.gate, &x.up, &x.down};
        for (int i = 0; i < 3; i++) {
            if (j == 0) {
                f->dtype[i] = mats[i]->view.dtype;
                f->quant[i] = mats[i]->view.quant;
                f->rows[i] = mats[i]->view.rows;
                f->cols[i] = mats[i]->view.cols;
                f->mat_bytes[i] = fmoe_matrix_view_bytes(&mats[i]->view);
            } else if (mats[i]->view.dtype != f->dtype[i] ||
                       mats[i]->view.quant != f->quant[i] || mats[i]->view.rows != f->rows[i] ||
                       mats[i]->view.cols != f->cols[i]) {
                rc = fmoe_error_set(FMOE_EUNSUPPORTED,
                                    "expert (%d, %d) differs in shape or type from expert "
                                    "(%d, 0): offloading needs a layer's experts alike",
                                    l, j, l);
            }
        }
        if (j == 0) {
            f->bytes = f->mat_bytes[0] + f->mat_bytes[1] + f->mat_bytes[2];
            f->host_base = t->host_bytes;
            t->host_bytes += (int64_t)t->J * f->bytes;
            t->bytes = f->bytes > t->bytes ? f->bytes : t->bytes;
        }
    }
    if (rc < 0) goto fail;
    kind = fmoe_offload_resolve_tier(m, kind); /* host_bytes: the same sum */
    t->kind = kind;
    if (kind == FMOE_TIER_HOST) {
        t->host = malloc((size_t)t->host_bytes);
        if (!t->host) {
            rc = fmoe_error_set(FMOE_ENOMEM, "host tier of %lld experts (%.1f GiB): use the "
                                "file tier", (long long)n, (double)t->host_bytes / (1 << 30));
            goto fail;
        }
        for (int64_t e = 0; e < n; e++) {
            fmoe_expert_tensors x;
            const int32_t l = (int32_t)(e / t->J), j = (int32_t)(e % t->J);
            const layer_format *f = &t->lf[l];
            fmoe_model_expert_tensors(m, l, j, &x);
            uint8_t *dst = t->host + f->host_base + j * f->bytes;
            memcpy(dst, x.gate.view.data, (size_t)f->mat_bytes[0]);
            memcpy(dst + f->mat_bytes[0], x.up.view.data, (size_t)f->mat_bytes[1]);
            memcpy(dst + f->mat_bytes[0] + f->mat_bytes[1], x.down.view.data,
                   (size_t)f->mat_bytes[2]);
        }
    } else {
        t->file_of = malloc((size_t)n * 3 * sizeof *t->file_of);
        t->offset_of = malloc((size_t)n * 3 * sizeof *t->offset_of);
        if (!t->file_of || !t->offset_of) {
            rc = fmoe_error_set(FMOE_ENOMEM, "out of memory");
            goto fail;
        }
        for (int64_t e = 0; e < n && rc == 0; e++) {
            fmoe_expert_tensors x;
            fmoe_model_expert_tensors(m, (int32_t)(e / t->J), (int32_t)(e % t->J), &x);
            const fmoe_expert_tensor *mats[3] = {&x.gate, &x.up, &x.down};
            for (int i = 0; i < 3 && rc == 0; i++) {
                /* a matrix rebuilt at load (gpt-oss's transposed experts) has no file
                 * range holding its bytes */
                if (!mats[i]->file) {
                    rc = fmoe_error_set(FMOE_EUNSUPPORTED,
                                        "expert (%lld, %lld): its weights were rebuilt at "
                                        "load, so no file holds them as used; use --tier host",
                                        (long long)(e / t->J), (long long)(e % t->J));
                    break;
                }
                rc = file_index(t, mats[i]->file, &t->file_of[e * 3 + i]);
                t->offset_of[e * 3 + i] = mats[i]->offset;
            }
        }
        if (rc < 0) goto fail;
        rc = fmoe__preader_open(&t->reader,
                                read_depth > 0 ? read_depth : FMOE_PREADER_DEFAULT_DEPTH);
        if (rc < 0) goto fail;
        const char *seg = getenv("FMOE_FAULT_READ_EIO_SEGMENT");
        if (seg && seg[0]) fmoe__preader_inject_eio(t->reader, (int32_t)strtol(seg, NULL, 10));
        /* O_DIRECT straight into the slot needs each matrix's bytes to keep, in memory,
         * their file offset's alignment, which must suit the dtype. */
        t->in_place = direct_io;
        for (int64_t i = 0; i < n * 3 && t->in_place; i++) {
            const layer_format *f = &t->lf[i / 3 / t->J];
            const int k = (int)(i % 3); /* blocks need no alignment: memcpy'd / loadu */
            const int64_t es = f->quant[k] ? 1 : fmoe_st_dtype_size(f->dtype[k]);
            t->in_place = t->offset_of[i] % es == 0;
        }
        if (direct_io && !t->in_place) {
            /* the largest piece of one matrix, widened on both sides to the alignment */
            int64_t widest = 0;
            for (int32_t l = 0; l < t->L; l++)
                for (int i = 0; i < 3; i++)
                    widest = t->lf[l].mat_bytes[i] > widest ? t->lf[l].mat_bytes[i] : widest;
            t->bounce_bytes = (widest + 2 * DIRECT_ALIGN + DIRECT_ALIGN - 1) / DIRECT_ALIGN *
                              DIRECT_ALIGN;
            t->bounce = aligned_alloc(DIRECT_ALIGN, (size_t)t->bounce_bytes);
            if (!t->bounce) {
                rc = fmoe_error_set(FMOE_ENOMEM, "O_DIRECT buffer of %lld bytes",
                                    (long long)t->bounce_bytes);
                goto fail;
            }
        }
    }
    for (int32_t l = 0; l < t->L; l++) {
        layer_format *f = &t->lf[l];
        int64_t at = 0;
        for (int i = 0; i < 3; i++) {
            f->region[i] = at;
            at += t->in_place ? (f->mat_bytes[i] + DIRECT_ALIGN - 1) / DIRECT_ALIGN *
                                        DIRECT_ALIGN + DIRECT_ALIGN
                              : f->mat_bytes[i];
        }
        at = (at + DIRECT_ALIGN - 1) / DIRECT_ALIGN * DIRECT_ALIGN;
        t->slot_bytes = at > t->slot_bytes ? at : t->slot_bytes;
    }
    *out = t;
    return 0;
fail:
    fmoe__expert_tier_close(t);
    return rc;
}

int64_t fmoe__expert_tier_expert_bytes(const fmoe_expert_tier *t) { return t->bytes; }
int64_t fmoe__expert_tier_layer_bytes(const fmoe_expert_tier *t, int32_t l) {
    return t->lf[l].bytes;
}
int64_t fmoe__expert_tier_slot_bytes(const fmoe_expert_tier *t) { return t->slot_bytes; }
fmoe_tier_kind fmoe__expert_tier_kind(const fmoe_expert_tier *t) { return t->kind; }

/* ------------------------------------------------------------------ reads */

/* Bytes [offset, offset + bytes) of one matrix stored at file f, byte `base`, through the
 * bounce buffer: O_DIRECT where a matrix's file offset does not suit an in-place read (a
 * rare layout), one request at a time. */
static int read_bounced(fmoe_expert_tier *t, int32_t f, int64_t base, int64_t offset,
                        int64_t bytes, uint8_t *dst) {
    while (bytes > 0) { /* aligned windows through the bounce buffer */
        const int64_t at = base + offset;
        const int64_t lo = at / DIRECT_ALIGN * DIRECT_ALIGN;
        int64_t take = bytes < t->bounce_bytes - 2 * DIRECT_ALIGN ? bytes : t->bounce_bytes - 2 * DIRECT_ALIGN;
        const int64_t hi = (at + take + DIRECT_ALIGN - 1) / DIRECT_ALIGN * DIRECT_ALIGN;
        /* O_DIRECT reads may end early only at the end of the file */
        int64_t got = 0;
        while (got < hi - lo) {
            const ssize_t r = pread(t->fds[f], t->bounce + got, (size_t)(hi - lo - got),
                                    (off_t)(lo + got));
            if (r < 0 && errno == EINTR) continue;
            if (r < 0)
                return fmoe_error_set(FMOE_EIO, "%s: read at %lld: %s", t->paths[f],
                                      (long long)(lo + got), strerror(errno));
            if (r == 0) break;
            got += r;
        }
        if (got < at - lo + take)
            return fmoe_error_set(FMOE_EIO, "%s: read at %lld: end of file", t->paths[f],
                                  (long long)at);
        memcpy(dst, t->bounce + (at - lo), (size_t)take);
        dst += take;
        offset += take;
        bytes -= take;
    }
    return 0;
}

/* Bytes [lo, hi) of a matrix stored at file f, byte `base`, whose slot region is `region`,
 * as one extent of the reader; *need: the file offset the read must reach. In place
 * (O_DIRECT), the aligned window around them is read straight into the region (the
 * window's extra bytes land in the region's margins, or are the matrix's own bytes,
 * identical); else exactly those bytes, at their place in the region. */
static void piece_extent(const fmoe_expert_tier *t, int32_t f, int64_t base, int64_t lo,
                         int64_t hi, uint8_t *region, fmoe__pread_extent *x, int64_t *need) {
    if (t->in_place) {
        const int64_t first = (base + lo) / DIRECT_ALIGN * DIRECT_ALIGN;
        const int64_t last = (base + hi + DIRECT_ALIGN - 1) / DIRECT_ALIGN * DIRECT_ALIGN;
        *x = (fmoe__pread_extent){.fd = t->fds[f], .offset = first, .bytes = last - first,
                                  .dst = region + (first - base / DIRECT_ALIGN * DIRECT_ALIGN)};
    } else {
        *x = (fmoe__pread_extent){.fd = t->fds[f], .offset = base + lo, .bytes = hi - lo,
                                  .dst = region + lo};
    }
    *need = base + hi;
}

/* The error of a piece read as extent x, the one the single request loop before reads
 * were split gave: in place, the offset a request failed at, or where the file ended
 * (O_DIRECT may end inside the last aligned block, past the bytes needed); else the
 * piece's start, EIO also when the file ends first. */
static int piece_error(const fmoe_expert_tier *t, int32_t f, const fmoe__pread_extent *x,
                       int64_t need) {
    if (t->in_place) {
        if (x->err)
            return fmoe_error_set(FMOE_EIO, "%s: read at %lld: %s", t->paths[f],
                                  (long long)x->err_at, strerror(x->err));
        if (x->offset + x->got < need)
            return fmoe_error_set(FMOE_EIO, "%s: read at %lld: end of file", t->paths[f],
                                  (long long)(x->offset + x->got));
        return 0;
    }
    if (x->err || x->got < x->bytes)
        return fmoe_error_set(FMOE_EIO, "%s: read at %lld: %s", t->paths[f],
                              (long long)x->offset, strerror(x->err ? x->err : EIO));
    return 0;
}

int fmoe__expert_tier_read(fmoe_expert_tier *t, int32_t l, int32_t j, int64_t offset,
                           int64_t bytes, void *slot) {
    const int64_t e = (int64_t)l * t->J + j;
    const layer_format *lf = &t->lf[l];
    if (t->kind == FMOE_TIER_HOST) { /* packed layout: logical offset = slot offset */
        memcpy((uint8_t *)slot + offset, t->host + lf->host_base + j * lf->bytes + offset,
               (size_t)bytes);
        return 0;
    }
    if (t->fail_after >= 0 && t->reads++ >= t->fail_after) {
        const int32_t f = t->file_of[e * 3];
        return fmoe_error_set(FMOE_EIO, "%s: read at %lld: %s (injected by "
                              "FMOE_FAULT_READ_EIO_AFTER)", t->paths[f],
                              (long long)t->offset_of[e * 3], strerror(EIO));
    }
    /* the pieces of the matrices the range touches, all read at once */
    fmoe__pread_extent x[3];
    int32_t file[3];
    int64_t need[3];
    int32_t n = 0;
    int64_t start = 0;
    for (int i = 0; i < 3 && bytes > 0; i++) {
        const int64_t end = start + lf->mat_bytes[i];
        if (offset < end) {
            const int64_t within = offset - start;
            const int64_t take = bytes < end - offset ? bytes : end - offset;
            const int32_t f = t->file_of[e * 3 + i];
            const int64_t base = t->offset_of[e * 3 + i];
            uint8_t *region = (uint8_t *)slot + lf->region[i];
            if (t->direct && !t->in_place) {
                FMOE_FORWARD_IF_ERROR(read_bounced(t, f, base, within, take, region + within));
            } else {
                piece_extent(t, f, base, within, within + take, region, &x[n], &need[n]);
                file[n++] = f;
            }
            offset += take;
            bytes -= take;
        }
        start = end;
    }
    if (n == 0 || fmoe__preader_read(t->reader, x, n, t->direct ? DIRECT_ALIGN : 1) == 0)
        return 0;
    for (int32_t i = 0; i < n; i++) FMOE_FORWARD_IF_ERROR(piece_error(t, file[i], &x[i], need[i]));
    return 0;
}

int32_t fmoe__expert_tier_ranges(const fmoe_expert_tier *t, int32_t l, int32_t j,
                                 int64_t offset, int64_t bytes, fmoe__tier_range out[3]) {
    const int64_t e = (int64_t)l * t->J + j;
    const layer_format *lf = &t->lf[l];
    int32_t n = 0;
    int64_t start = 0;
    for (int i = 0; i < 3 && bytes > 0; i++) {
        const int64_t end = start + lf->mat_bytes[i];
        if (offset < end) {
            const int64_t within = offset - start;
            const int64_t take = bytes < end - offset ? bytes : end - offset;
            /* as piece_extent and read_bounced place them, and the view describes them */
            const int64_t shift = t->in_place ? t->offset_of[e * 3 + i] % DIRECT_ALIGN : 0;
            const fmoe__tier_range r = {.slot_offset = lf->region[i] + shift + within,
                                        .offset = offset, .bytes = take};
            if (n > 0 && out[n - 1].slot_offset + out[n - 1].bytes == r.slot_offset &&
                out[n - 1].offset + out[n - 1].bytes == r.offset)
                out[n - 1].bytes += take;
            else
                out[n++] = r;
            offset += take;
            bytes -= take;
        }
        start = end;
    }
    return n;
}

int fmoe__expert_tier_host_block(const fmoe_expert_tier *t, uint8_t **p, int64_t *bytes) {
    const int host = t->kind == FMOE_TIER_HOST;
    *p = host ? t->host : NULL;
    *bytes = host ? t->host_bytes : 0;
    return host;
}

int64_t fmoe__expert_tier_host_offset(const fmoe_expert_tier *t, int32_t l, int32_t j) {
    return t->lf[l].host_base + j * t->lf[l].bytes;
}

void fmoe__expert_tier_view(const fmoe_expert_tier *t, int32_t l, int32_t j,
                            const uint8_t *base, fmoe_expert_view *out) {
    const int64_t e = (int64_t)l * t->J + j;
    const layer_format *f = &t->lf[l];
    fmoe_matrix_view *mats[3] = {&out->gate, &out->up, &out->down};
    for (int i = 0; i < 3; i++) {
        const int64_t shift = t->in_place ? t->offset_of[e * 3 + i] % DIRECT_ALIGN : 0;
        *mats[i] = (fmoe_matrix_view){.data = base + f->region[i] + shift,
                                      .dtype = f->dtype[i], .rows = f->rows[i],
                                      .cols = f->cols[i], .quant = f->quant[i]};
    }
}
