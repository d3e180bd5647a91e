/*
 * preader.c - reads kept several requests deep (preader.h).
 *
 * One job at a time: the caller publishes its extents under the lock, and it and the
 * threads take segments from a shared counter (under the lock: a segment is a request of
 * hundreds of KiB, the lock's cost is nothing beside it) until none is left; each reads its
 * segment unlocked and records how it ended. The caller waits until every segment is done,
 * so nothing of the job is touched once the call returns. Each extent keeps the first of
 * its segments in file order that ended early (the file's end or an error): what a single
 * sequential read of the extent would have stopped at, so callers report the same offset
 * and reason as before the reads were split.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "preader.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "fmoe/error.h"

#define MAX_EXTENTS 8

/* How an extent's first segment that ended early ended. */
typedef struct extent_end {
    int64_t seg;      /* its index within the extent; INT64_MAX: none ended early */
    int64_t end;      /* the file offset it read up to */
    int err;          /* 0: the file ended */
    int64_t err_at;
} extent_end;

struct fmoe__preader {
    int32_t depth;
    int32_t nthreads;
    pthread_t *threads;
    pthread_mutex_t call;   /* one caller at a time */
    pthread_mutex_t mu;     /* the job below */
    pthread_cond_t work;    /* threads: a segment to take, or stop */
    pthread_cond_t done_cv; /* the caller: every segment done */
    int stop;
    /* the job */
    fmoe__pread_extent *x;
    int32_t n;
    int64_t seg;            /* segment bytes */
    int64_t first[MAX_EXTENTS + 1]; /* extent i's segments are [first[i], first[i + 1]) */
    int64_t next, done;
    extent_end ends[MAX_EXTENTS];
    int32_t inject;         /* tests: this segment fails with EIO; -1 none */
};

/* The outcome of one segment. */
typedef struct seg_result {
    int32_t extent;
    int64_t seg, len, got;
    int err;
    int64_t err_at;
} seg_result;

/* Reads segment k of the job (its bounds read under the lock by the caller of this,
 * passed in r and the arguments), unlocked. */
static void read_segment(int fd, int64_t at, int64_t len, uint8_t *dst, int inject,
                         seg_result *r) {
    r->len = len;
    r->got = 0;
    r->err = 0;
    if (inject) {
        r->err = EIO;
        r->err_at = at;
        return;
    }
    while (r->got < len) {
        const ssize_t got = pread(fd, dst + r->got, (size_t)(len - r->got), (off_t)(at + r->got));
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            r->err = errno;
            r->err_at = at + r->got;
            return;
        }
        if (got == 0) return; /* the file ends here */
        r->got += got;
    }
}

/* Takes the next segment (under the lock), reads it (unlocked) and records it (under the
 * lock). @return 0 when there was none to take. Called with p->mu held. */
static int take_one(fmoe__preader *p) {
    if (p->next >= p->first[p->n]) return 0;
    const int64_t k = p->next++;
    seg_result r = {0};
    while (k >= p->first[r.extent + 1]) r.extent++;
    const fmoe__pread_extent *x = &p->x[r.extent];
    r.seg = k - p->first[r.extent];
    const int64_t skip = r.seg * p->seg;
    const int64_t len = x->bytes - skip < p->seg ? x->bytes - skip : p->seg;
    const int fd = x->fd;
    uint8_t *dst = (uint8_t *)x->dst + skip;
    const int64_t at = x->offset + skip;
    const int inject = p->inject >= 0 && k == p->inject;
    pthread_mutex_unlock(&p->mu);
    read_segment(fd, at, len, dst, inject, &r);
    pthread_mutex_lock(&p->mu);
    extent_end *e = &p->ends[r.extent];
    if ((r.err || r.got < r.len) && r.seg < e->seg)
        *e = (extent_end){.seg = r.seg, .end = at + r.got, .err = r.err, .err_at = r.err_at};
    if (++p->done == p->first[p->n]) pthread_cond_signal(&p->done_cv);
    return 1;
}

static void *thread_main(void *arg) {
    fmoe__preader *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->next >= p->first[p->n]) pthread_cond_wait(&p->work, &p->mu);
        if (p->stop) break;
        take_one(p);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

void fmoe__preader_close(fmoe__preader *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (int32_t i = 0; i < p->nthreads; i++) pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->done_cv);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->call);
    free(p->threads);
    free(p);
}

int fmoe__preader_open(fmoe__preader **out, int32_t depth) {
    *out = NULL;
    FMOE_RETURN_ERROR_IF(depth < 1 || depth > FMOE_PREADER_MAX_DEPTH, FMOE_EINVAL,
                         "read depth %d: 1 to %d", depth, FMOE_PREADER_MAX_DEPTH);
    fmoe__preader *p = calloc(1, sizeof *p);
    if (!p) return fmoe_error_set(FMOE_ENOMEM, "out of memory");
    p->depth = depth;
    p->inject = -1;
    p->threads = calloc((size_t)depth, sizeof *p->threads);
    pthread_mutex_init(&p->call, NULL);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    if (!p->threads) {
        fmoe__preader_close(p);
        return fmoe_error_set(FMOE_ENOMEM, "out of memory");
    }
    for (int32_t i = 0; i < depth - 1; i++) { /* the caller is the last request in flight */
        if (pthread_create(&p->threads[i], NULL, thread_main, p) != 0) {
            fmoe__preader_close(p);
            return fmoe_error_set(FMOE_ENOMEM, "cannot start reader thread %d of %d", i + 1,
                                  depth - 1);
        }
        p->nthreads++;
    }
    *out = p;
    return 0;
}

int32_t fmoe__preader_depth(const fmoe__preader *p) { return p->depth; }

void fmoe__preader_inject_eio(fmoe__preader *p, int32_t index) {
    pthread_mutex_lock(&p->mu);
    p->inject = index;
    pthread_mutex_unlock(&p->mu);
}

int fmoe__preader_read(fmoe__preader *p, fmoe__pread_extent *x, int32_t n, int64_t align) {
    if (n < 1) return 0;
    if (align < 1) align = 1;
    if (n > MAX_EXTENTS) { /* in groups: callers have at most three (an expert's matrices) */
        int rc = 0;
        for (int32_t i = 0; i < n; i += MAX_EXTENTS)
            rc |= fmoe__preader_read(p, x + i, n - i < MAX_EXTENTS ? n - i : MAX_EXTENTS, align);
        return rc;
    }
    int64_t total = 0;
    for (int32_t i = 0; i < n; i++) total += x[i].bytes > 0 ? x[i].bytes : 0;
    /* depth segments over all the bytes, none under the minimum: at depth 1 one request
     * per extent, as a plain read */
    int64_t seg = (total + p->depth - 1) / p->depth;
    seg = seg > FMOE_PREADER_MIN_SEGMENT ? seg : FMOE_PREADER_MIN_SEGMENT;
    seg = (seg + align - 1) / align * align;
    pthread_mutex_lock(&p->call);
    pthread_mutex_lock(&p->mu);
    p->x = x;
    p->n = n;
    p->seg = seg;
    p->first[0] = 0;
    for (int32_t i = 0; i < n; i++) {
        const int64_t b = x[i].bytes > 0 ? x[i].bytes : 0;
        p->first[i + 1] = p->first[i] + (b + seg - 1) / seg;
        p->ends[i] = (extent_end){.seg = INT64_MAX};
    }
    p->next = 0;
    p->done = 0;
    if (p->nthreads > 0 && p->first[n] > 1) pthread_cond_broadcast(&p->work);
    while (take_one(p)) {
    }
    while (p->done < p->first[n]) pthread_cond_wait(&p->done_cv, &p->mu);
    int rc = 0;
    for (int32_t i = 0; i < n; i++) {
        const extent_end *e = &p->ends[i];
        x[i].got = e->seg == INT64_MAX ? (x[i].bytes > 0 ? x[i].bytes : 0) : e->end - x[i].offset;
        x[i].err = e->seg == INT64_MAX ? 0 : e->err;
        x[i].err_at = e->seg == INT64_MAX ? 0 : e->err_at;
        if (e->seg != INT64_MAX) rc = -1;
    }
    p->x = NULL;
    p->n = 0;
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->call);
    return rc;
}
