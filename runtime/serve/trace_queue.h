/*
 * trace_queue.h - `fmoe serve --trace-out` off the scheduler thread: finished requests are
 * queued and a thread of their own appends them to the trace (each append flushes the
 * file, milliseconds per request that would otherwise stall every running sequence), then
 * reports each one done, so a request's client is told only once it is in the file.
 *
 *     serve_trace_queue *q;
 *     fmoe_serve_trace_queue_start(writer, on_done, ctx, &q);
 *     fmoe_serve_trace_queue_push(q, &req, tag);   // req's arrays are the queue's now
 *     ...
 *     rc = fmoe_serve_trace_queue_stop(q);         // appends what is queued, joins, frees
 */
#ifndef FMOE_SERVE_TRACE_QUEUE_H
#define FMOE_SERVE_TRACE_QUEUE_H

#include "fmoe/trace.h"

typedef struct serve_trace_queue serve_trace_queue;

/* Runs on the queue's thread after tag's request was appended (rc 0) or not (rc < 0: the
 * first append error; later requests are not written but still reported). */
typedef void (*serve_trace_done_fn)(void *ctx, void *tag, int rc);

/* @return 0, FMOE_ENOMEM (the thread could not start). The writer is borrowed. */
int fmoe_serve_trace_queue_start(fmoe_trace_writer *w, serve_trace_done_fn done, void *ctx,
                            serve_trace_queue **out);

/* Queues a request. Its arrays token_id, phase, experts, probs, semantic, speculative,
 * served_iteration and served_s must come from malloc: the queue frees them after the
 * append. @return 0 or FMOE_ENOMEM (then nothing was taken: the caller owns the arrays). */
int fmoe_serve_trace_queue_push(serve_trace_queue *q, const fmoe_trace_request *req, void *tag);

/* Appends everything queued, stops the thread and frees. NULL is a no-op (0).
 * @return 0 or the first append error (its detail is set on this thread). */
int fmoe_serve_trace_queue_stop(serve_trace_queue *q);

#endif
