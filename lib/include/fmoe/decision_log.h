/*
 * fmoe/decision_log.h - the decision log: every slot decision of a run (fmoe/slots.h) as
 * JSON Lines, in one format that the simulator and the live executor both write, and the
 * comparison behind `fmoe compare-logs`. The same trace through both executors must give
 * the same decisions (policies are pure and both executors run one slot protocol); this is
 * how that is checked.
 *
 * Format, version 1. The first line is the header:
 *
 *     {"fmoe_decision_log":1,"source":"simulate","meta":{...}}
 *
 * ("meta" only when the writer was given one: free JSON about the run). Then one line per
 * fmoe_decision, its keys always in this order (so two logs diff well line by line):
 *
 *     {"event":"prefetch","iteration":3,"layer":1,"expert":5,"slot":2,"victim":13,"priority":0.75,"t":0.001234}
 *
 *     event      access | prefetch | dropped | cancel | evict | host | promote | landed
 *                (fmoe_decision_kind 0..7)
 *     iteration  the iteration index in the run, -1 outside one
 *     layer      l, and expert j: the expert concerned
 *     expert
 *     slot       its slot, -1 none
 *     victim     the evicted expert's id l*J+j: only on prefetch and evict, only when >= 0
 *     result     only on access: hit | late | miss (FMOE_ACCESS_HIT, _LATE_HIT, _MISS)
 *     priority   only on prefetch and promote: the policy's priority, written in the
 *                shortest form that reads back as the same double (Infinity, -Infinity
 *                and NaN as Python's json module writes them)
 *     t          the executor's time in seconds (simulated or measured), same form
 *
 * A log being written lives at F.partial and is renamed to F when it is closed, so a run
 * that fails never leaves a half-written log under the final name.
 */
#ifndef FMOE_DECISION_LOG_H
#define FMOE_DECISION_LOG_H

#include <stdint.h>

#include "fmoe/slots.h"

/* The version in the header line; a reader refuses any other. */
#define FMOE_DECISION_LOG_VERSION 1

/* ---------------------------------------------------------------- writing */

typedef struct fmoe_decision_log fmoe_decision_log;

/* Opens `path` for writing at "<path>.partial" (truncating one left over) and writes the
 * header. source: who writes ("simulate", "generate", "record"); meta_json: NULL, or the
 * text of a JSON object stored as the header's "meta" (re-serialised on one line).
 * @return 0 and *out; FMOE_EINVAL (NULL path or source, meta_json not a JSON object),
 *         FMOE_ENOMEM, FMOE_EIO (cannot create the file). */
int fmoe_decision_log_open(fmoe_decision_log **out, const char *path, const char *source,
                           const char *meta_json);

/* Appends one decision line. `log` is void * so that the function is an
 * fmoe_slots_hooks.decision callback as it is (ctx = the log). Never allocates. Errors are
 * not returned: the first one (a failed write, an unknown kind or result) is remembered,
 * later decisions are dropped, and close returns it. NULL log is a no-op. */
void fmoe_decision_log_write(void *log, const fmoe_decision *d);

/* Writes the buffered lines out now (a live run calls it after each iteration or request,
 * so that a full disk stops the run where it happens, not at close). A write that fails
 * part way is cut back to the last whole line. `log` is void * so that the function is an
 * fmoe_offload_options.decision_flush callback as it is. Not thread-safe against write:
 * the caller serialises them. NULL is a no-op.
 * @return 0, or the log's first error (detail set: FMOE_EIO "F.partial: cannot write:
 *         No space left on device"); once failed, every later call returns it. */
int fmoe_decision_log_flush(void *log);

/* Flushes and closes. keep = 1: renames "<path>.partial" to path (atomically, replacing
 * it), unless a write failed, when the .partial is left as it is for inspection (whole
 * lines: the decisions written before the failure); keep = 0:
 * removes the .partial (a run that failed). Frees the log; NULL is a no-op returning 0.
 * @return 0, or the first error of the log's life: FMOE_EIO naming the file, FMOE_EINVAL
 *         for a decision that could not be written. */
int fmoe_decision_log_close(fmoe_decision_log *log, int keep);

/* ---------------------------------------------------------------- comparing */

/* What one log holds. lines: decision lines (the header not counted), = the sum of by_kind;
 * by_kind: per fmoe_decision_kind; hits, late, misses: access lines by result. */
typedef struct fmoe_decision_log_totals {
    int64_t lines, by_kind[8], hits, late, misses;
} fmoe_decision_log_totals;

typedef struct fmoe_decision_log_diff {
    int identical;                 /* 1 when the decision sequences are equal */
    int64_t index;                 /* 0-based index among compared decisions of the first divergence, -1 none */
    int64_t line_a, line_b;        /* 1-based file lines of the divergence (0 = that file ended) */
    char a[256], b[256];           /* the two diverging lines, as text ("" = end of file; longer lines cut) */
    fmoe_decision_log_totals ta, tb;
} fmoe_decision_log_diff;

/* Compares the decisions of two logs, in order. Compared are all kinds but landed (a
 * transfer's completion is timing, which differs between executors; landed lines are
 * counted in the totals only). Two decisions are equal when kind, iteration, layer,
 * expert, slot, victim, result and priority are (priority as parsed doubles, exactly);
 * "t" is ignored. late_is_hit: an access "late" equals a "hit" (a live executor's
 * transfer may land before the simulator's would, or after).
 * Both files are streamed to the end (memory does not grow with their length), and the
 * totals cover them whole, also past a divergence.
 * @return 0 and *out filled (identical or not); FMOE_ENOTFOUND or FMOE_EIO naming a file
 *         that cannot be opened or read; FMOE_EFORMAT "F:LINE: ..." for a line that is not
 *         this format (the header included); FMOE_EUNSUPPORTED for another version;
 *         FMOE_EINVAL for NULL arguments; FMOE_ENOMEM. */
int fmoe_decision_log_compare(const char *path_a, const char *path_b, int late_is_hit,
                              fmoe_decision_log_diff *out);

#endif
