/*
 * http_server.h - the HTTP side of `fmoe serve`: libmicrohttpd's epoll loop on a small
 * thread pool (handlers never block; http_server.c says how), routing the
 * OpenAI-compatible endpoints to the engine.
 *
 *     serve_http *h;
 *     if (fmoe_serve_http_start(&(serve_http_options){.port = 8080, .tokenizer = tok}, &h) < 0)
 *         die(fmoe_error_detail());
 *     fmoe_serve_http_set_engine(h, engine);   // until then /health says 503 "loading"
 *     ... SIGTERM ...
 *     fmoe_serve_http_quiesce(h);              // no new connections; streams go on
 *     fmoe_serve_engine_stop(engine, grace);   // finishes or cuts the jobs the streams read
 *     fmoe_serve_http_stop(h);
 *
 * Endpoints: POST /v1/chat/completions, POST /v1/completions (openai_api.h has the
 * fields; "stream": true answers with server-sent events), GET /v1/models, GET /health
 * (200 {"status":"ok"}; 503 {"status":"loading"} or {"status":"stopping"}), GET /metrics
 * (Prometheus text 0.0.4); HEAD on a GET endpoint is GET without the body. Anything else
 * 404; a known path with another method 405. Ambiguous body framing (two different
 * Content-Length headers, Transfer-Encoding with Content-Length) 400, and the connection
 * is closed.
 * Errors have OpenAI's shape {"error": {"message", "type", "param", "code"}}; the types
 * used: invalid_request_error (400, 404, 405, 413), authentication_error (401),
 * server_error (500), overloaded_error (503, with Retry-After: 1).
 *
 * A streamed request whose client goes away is cancelled in the engine (the response's
 * free callback); a non-streamed one is cancelled when the socket reads as closed while
 * it waits.
 */
#ifndef FMOE_SERVE_HTTP_SERVER_H
#define FMOE_SERVE_HTTP_SERVER_H

#include <stddef.h>

#include "fmoe/tokenizer.h"
#include "serve_engine.h"
#include "serve_metrics.h"

typedef struct serve_http serve_http;

typedef struct serve_http_options {
    const char *host;               /* NULL: "127.0.0.1"; a name or an IPv4/IPv6 address */
    int port;                       /* 0: an ephemeral port (fmoe_serve_http_port tells which) */
    const char *api_key;            /* NULL or "": no auth; else "Authorization: Bearer KEY"
                                       (compared in constant time), 401 otherwise; /health
                                       and /metrics need no key. Copied. */
    size_t max_body_bytes;          /* 0: 1 MiB; larger bodies -> 413 */
    unsigned connection_timeout_s;  /* 0: 30; a connection idle this long is closed, and so
                                       is one that has not sent a whole request (head and
                                       body) this long after it opened or after its previous
                                       request ended, however it trickles the bytes */
    unsigned header_timeout_s;      /* 0: 10; a connection must send a whole request head
                                       this long after it opened or after its previous
                                       request ended (capped at connection_timeout_s): an
                                       idle kept-alive connection ends then too */
    unsigned max_connections;       /* 0: 512. A connection beyond it takes the place of
                                       the one that has waited longest for its request
                                       head (idle or trickling); when every connection is
                                       answering a request, the new one is closed */
    unsigned max_client_connections; /* connections one client address may hold; 0: no
                                        limit (more are closed at once) */
    const fmoe_tokenizer *tokenizer; /* borrowed; outlives the server */
    serve_metrics *metrics;         /* borrowed; may be NULL */
} serve_http_options;

/* Binds and listens (threads start at once). @return 0 and *out, or FMOE_EINVAL (no
 * tokenizer), FMOE_EIO (host unknown, bind/listen failed: the detail names host:port and
 * the reason, e.g. "Address already in use"), FMOE_ENOMEM. */
int fmoe_serve_http_start(const serve_http_options *o, serve_http **out);

/* @return the port listened on (the ephemeral one when options.port was 0). */
int fmoe_serve_http_port(const serve_http *h);

/* Sets the engine requests go to (borrowed; NULL while loading: /health 503 "loading",
 * API requests 503). Thread-safe. The engine must outlive every request that used it:
 * stop the engine only after fmoe_serve_http_quiesce, and free it after fmoe_serve_http_stop. */
void fmoe_serve_http_set_engine(serve_http *h, serve_engine *e);

/* Stops accepting connections (the listening socket is closed); requests in flight
 * continue, and new API requests on kept-alive connections get 503 with
 * "Connection: close". /health then says 503 "stopping". Idempotent. */
void fmoe_serve_http_quiesce(serve_http *h);

/* Ends every stream still open (their jobs are cancelled), closes all connections, joins
 * the threads and frees. NULL is a no-op. */
/* After the engine stopped: waits up to `seconds` for the requests in progress to end (a
 * stream sends its last chunks, usage and [DONE] once its job is finished or cut), so
 * fmoe_serve_http_stop does not close them mid-write. @return 1 when none is left, 0 on timeout. */
int fmoe_serve_http_wait_idle(serve_http *h, double seconds);

void fmoe_serve_http_stop(serve_http *h);

#endif
