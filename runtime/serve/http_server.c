/*
 * http_server.c - libmicrohttpd glue of `fmoe serve`: listening, routing, auth, body
 * limits, and streaming a job's text as server-sent events.
 *
 * Threading: MHD's internal epoll loop on a small thread pool (POOL_THREADS), so a slow
 * or idle client costs a socket and a few hundred bytes, not a thread, and /health is
 * answered whatever the other connections do. Handlers therefore never block: a request
 * waiting for its job (a non-streamed one in the access handler, a stream in its content
 * reader) suspends its connection (MHD_suspend_connection) and is resumed when the engine
 * has news for the job (fmoe_serve_job_set_notify) and, by the ticker thread, every
 * WAIT_SLICE_S, so that a hang-up, a shutdown or a keep-alive comment is noticed while
 * nothing else happens. The ticker also enforces the request deadline: a connection must
 * deliver a whole request, head and body, within request_timeout_s of its start (or of
 * its previous request's end), however it trickles the bytes; MHD's own timeout only
 * counts idle time, which one byte every few seconds resets (slowloris). The request head
 * has a shorter deadline of its own (header_timeout_s), which also ends idle kept-alive
 * connections. One client (address) holds at most max_client_connections connections,
 * and the server max_connections: one more takes the place of the connection that has
 * waited longest for a request head, so that connections sending nothing useful, from any
 * number of addresses, cannot lock a legitimate client out (MHD's own limit, a little
 * higher, is only a backstop: at it MHD stops accepting, and clients wait in the backlog).
 *
 * The engine pointer and the quiesce/stop flags are atomics; the connection list and the
 * suspension flags are under conn_mu, and MHD's suspend and resume are called with it
 * held, so a wake-up cannot slip between deciding to suspend and suspending. Lock order:
 * a job's lock (its notify callback runs with it held), then conn_mu.
 *
 * We create the listening socket ourselves (MHD_OPTION_LISTEN_SOCKET): MHD_start_daemon
 * says only "failed", and an operator wants "127.0.0.1:8080: Address already in use".
 */
#include "http_server.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>
#include <signal.h>

#include "fmoe/error.h"
#include "openai_api.h"

/* A connection as the ticker and the wake-ups see it (MHD's socket_context). */
typedef struct conn_entry {
    struct conn_entry *prev, *next; /* in serve_http.conns */
    serve_http *h;
    struct MHD_Connection *c;
    int fd;
    double deadline;   /* monotonic seconds by which its request must be in; 0: none (a
                          request is being answered) */
    double head_deadline; /* monotonic seconds by which its request head must be in; 0:
                             none (the head is in) */
    double waiting_since; /* monotonic seconds it began waiting for a request head */
    int reaped;        /* shut down for missing the deadline */
    int suspended;     /* suspended by a handler, not yet resumed */
    int news;          /* a wake-up came while not suspended: do not suspend next time */
    serve_job *jobs[SERVE_API_MAX_N]; /* the jobs whose notify points here */
    int32_t njobs;
    int refs;          /* MHD's (until closed) and a stream's or waiting request's */
} conn_entry;

struct serve_http {
    struct MHD_Daemon *daemon;
    int listen_fd;               /* ours until quiesced; MHD closes it on stop otherwise */
    int port;
    char *api_key;               /* NULL: no auth */
    size_t api_key_len;
    size_t max_body;
    const fmoe_tokenizer *tok;
    serve_metrics *metrics;
    _Atomic(serve_engine *) engine;
    atomic_int quiesced;
    atomic_int stopping;
    atomic_int active;         /* requests begun and not yet completed */
    atomic_uint_fast64_t id_counter; /* mixed into ids if getrandom fails */
    double request_timeout_s;
    double header_timeout_s;
    uint32_t max_connections;
    uint32_t num_conns;        /* in conns */
    pthread_mutex_t conn_mu;   /* conns, every entry's fields, suspended */
    conn_entry *conns;
    int32_t suspended;         /* connections suspended now */
    int no_suspend;            /* MHD_stop_daemon is near: handlers must not suspend */
    pthread_t ticker;
    int ticker_started;
    atomic_int ticker_stop;
};

/* Seconds a stream or a waiting request sleeps per fmoe_serve_job_wait; the latency of noticing
 * a shutdown or a closed socket. */
#define WAIT_SLICE_S 0.25
/* An SSE comment after this long without text, so that proxies and clients with read
 * timeouts see the connection alive while a request waits in the queue. */
#define KEEPALIVE_S 15.0
/* After a shutdown cancelled a job, how long a stream waits for the engine to end it. */
#define STOP_WAIT_S 5.0
/* MHD's event-loop threads. Handlers never block, so a few serve any number of
 * connections; more only spread the parsing and the writes of many streams. */
#define POOL_THREADS 4

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---------------------------------------------------------------------------------------
 * Connections: start and end, the request deadline, suspension and wake-ups
 * ------------------------------------------------------------------------------------ */

/* Ends a connection from outside its handlers (conn_mu held): MHD sees the end of the
 * stream and closes it. */
static void reap(conn_entry *ce) {
    if (ce->reaped || ce->fd < 0) return;
    ce->reaped = 1;
    shutdown(ce->fd, SHUT_RDWR);
}

/* Over max_connections (conn_mu held): closes the connection that has waited longest for a
 * request head (idle or trickling one); if none, the one whose body has been arriving
 * longest; if none, `fresh`: every other connection is answering a request. Connections
 * already reaped and not yet closed do not count. */
static void make_room(serve_http *h, conn_entry *fresh) {
    uint32_t live = 0;
    conn_entry *no_head = NULL, *no_body = NULL;
    for (conn_entry *ce = h->conns; ce; ce = ce->next) {
        if (ce->reaped) continue;
        live++;
        if (ce == fresh || ce->fd < 0) continue;
        if (ce->head_deadline > 0) {
            if (!no_head || ce->waiting_since < no_head->waiting_since) no_head = ce;
        } else if (ce->deadline > 0) {
            if (!no_body || ce->waiting_since < no_body->waiting_since) no_body = ce;
        }
    }
    if (live <= h->max_connections) return;
    reap(no_head ? no_head : no_body ? no_body : fresh);
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    serve_http *h = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        conn_entry *ce = calloc(1, sizeof *ce);
        *socket_context = ce;
        if (!ce) return; /* no deadline for this one; it still works */
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        ce->h = h;
        ce->c = c;
        ce->refs = 1;
        ce->fd = ci ? ci->connect_fd : -1;
        const double now = mono_s();
        ce->deadline = now + h->request_timeout_s;
        ce->head_deadline = now + h->header_timeout_s;
        ce->waiting_since = now;
        pthread_mutex_lock(&h->conn_mu);
        ce->next = h->conns;
        if (h->conns) h->conns->prev = ce;
        h->conns = ce;
        if (++h->num_conns > h->max_connections) make_room(h, ce);
        pthread_mutex_unlock(&h->conn_mu);
        return;
    }
    conn_entry *ce = *socket_context;
    if (!ce) return;
    /* MHD calls this before it closes the socket, so the ticker never shuts down a
     * descriptor number that a new connection reuses. A job still pointing here (the
     * connection closed before its request ended) is detached first; the request's own
     * end runs on this same thread, so it cannot race with this. */
    for (int32_t i = 0; i < ce->njobs; i++) fmoe_serve_job_set_notify(ce->jobs[i], NULL, NULL);
    ce->njobs = 0;
    pthread_mutex_lock(&h->conn_mu);
    if (ce->prev) ce->prev->next = ce->next;
    else h->conns = ce->next;
    if (ce->next) ce->next->prev = ce->prev;
    h->num_conns--;
    if (ce->suspended) h->suspended--;
    ce->suspended = 0;
    ce->c = NULL;
    const int last = --ce->refs == 0;
    pthread_mutex_unlock(&h->conn_mu);
    if (last) free(ce);
    *socket_context = NULL;
}

/* A stream or a waiting request keeps the entry it watches from: whichever of it and the
 * connection's end comes last frees it. */
static conn_entry *entry_ref(conn_entry *ce) {
    if (!ce) return NULL;
    pthread_mutex_lock(&ce->h->conn_mu);
    ce->refs++;
    pthread_mutex_unlock(&ce->h->conn_mu);
    return ce;
}

static void entry_unref(conn_entry *ce) {
    if (!ce) return;
    pthread_mutex_lock(&ce->h->conn_mu);
    const int last = --ce->refs == 0;
    pthread_mutex_unlock(&ce->h->conn_mu);
    if (last) free(ce);
}

static conn_entry *entry_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* Sets the request deadline of a connection: `on` 1 from now (a request is awaited),
 * 0 none (its request is in and being answered). */
static void set_deadline(serve_http *h, conn_entry *ce, int on) {
    if (!ce) return;
    pthread_mutex_lock(&h->conn_mu);
    const double now = mono_s();
    ce->deadline = on ? now + h->request_timeout_s : 0;
    ce->head_deadline = on ? now + h->header_timeout_s : 0;
    if (on) ce->waiting_since = now;
    pthread_mutex_unlock(&h->conn_mu);
}

/* The request head is in: no head deadline; the request deadline still runs. */
static void head_arrived(serve_http *h, conn_entry *ce) {
    if (!ce) return;
    pthread_mutex_lock(&h->conn_mu);
    ce->head_deadline = 0;
    pthread_mutex_unlock(&h->conn_mu);
}

/* The job's notify (engine threads, the job's lock held): resume the connection. */
static void wake(void *arg) {
    conn_entry *ce = arg;
    serve_http *h = ce->h;
    pthread_mutex_lock(&h->conn_mu);
    if (ce->suspended) {
        ce->suspended = 0;
        h->suspended--;
        MHD_resume_connection(ce->c);
    } else {
        ce->news = 1;
    }
    pthread_mutex_unlock(&h->conn_mu);
}

/* Points the news of jobs[0..n) (a request's choices) at the connection (n 0: detaches
 * the current ones). */
static void watch(conn_entry *ce, serve_job *const *jobs, int32_t n) {
    if (!ce || (!ce->c && n)) return; /* closed: nothing to wake */
    for (int32_t i = 0; i < ce->njobs; i++) fmoe_serve_job_set_notify(ce->jobs[i], NULL, NULL);
    ce->njobs = n;
    for (int32_t i = 0; i < n; i++) {
        ce->jobs[i] = jobs[i];
        fmoe_serve_job_set_notify(jobs[i], wake, ce);
    }
}

/* Cancels and releases jobs[0..n). */
static void drop_jobs(serve_job *const *jobs, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        fmoe_serve_job_cancel(jobs[i]);
        fmoe_serve_job_release(jobs[i]);
    }
}

/* The usage of n choices: the prompt once (as OpenAI counts it), the completion tokens and
 * expert-cache figures of them all, the times of the slowest. */
static serve_job_status sum_status(const serve_job_status *st, int32_t n) {
    serve_job_status t = st[0];
    for (int32_t i = 1; i < n; i++) {
        t.completion_tokens += st[i].completion_tokens;
        t.cache.hits += st[i].cache.hits;
        t.cache.misses += st[i].cache.misses;
        t.cache.late += st[i].cache.late;
        t.cache.prefetched += st[i].cache.prefetched;
        t.cache.bytes_loaded += st[i].cache.bytes_loaded;
        t.cache.stall_ms += st[i].cache.stall_ms;
        if (st[i].predicted_ms > t.predicted_ms) t.predicted_ms = st[i].predicted_ms;
        if (st[i].prompt_ms > t.prompt_ms) t.prompt_ms = st[i].prompt_ms;
        if (st[i].queue_ms > t.queue_ms) t.queue_ms = st[i].queue_ms;
    }
    return t;
}

/* In a handler with nothing to do yet: suspends the connection until a wake-up. @return
 * 1 suspended (return to MHD), 0 when a wake-up already came or suspending is not allowed
 * now (look again; at shutdown after a short wait, so that this is no busy loop). */
static int park(serve_http *h, conn_entry *ce) {
    if (!ce) { /* no entry (out of memory at connect): poll, as the old model did */
        nanosleep(&(struct timespec){.tv_nsec = (long)(WAIT_SLICE_S * 1e9)}, NULL);
        return 0;
    }
    pthread_mutex_lock(&h->conn_mu);
    if (ce->news || h->no_suspend || !ce->c) {
        const int stopping = h->no_suspend;
        ce->news = 0;
        pthread_mutex_unlock(&h->conn_mu);
        if (stopping) nanosleep(&(struct timespec){.tv_nsec = 50000000L}, NULL);
        return 0;
    }
    ce->suspended = 1;
    h->suspended++;
    MHD_suspend_connection(ce->c);
    pthread_mutex_unlock(&h->conn_mu);
    return 1;
}

/* Every WAIT_SLICE_S: resumes the suspended connections (their handlers look for a
 * hang-up, a shutdown, a keep-alive due) and shuts down the ones past their request
 * deadline (MHD then sees the end of the stream and closes them). */
static void *ticker_main(void *arg) {
    serve_http *h = arg;
    while (!atomic_load(&h->ticker_stop)) {
        nanosleep(&(struct timespec){.tv_nsec = (long)(WAIT_SLICE_S * 1e9)}, NULL);
        const double now = mono_s();
        pthread_mutex_lock(&h->conn_mu);
        for (conn_entry *ce = h->conns; ce; ce = ce->next) {
            if (ce->suspended) {
                ce->suspended = 0;
                h->suspended--;
                MHD_resume_connection(ce->c);
            }
            if ((ce->deadline > 0 && now > ce->deadline) ||
                (ce->head_deadline > 0 && now > ce->head_deadline))
                reap(ce);
        }
        pthread_mutex_unlock(&h->conn_mu);
    }
    return NULL;
}

/* ---------------------------------------------------------------------------------------
 * Responses
 * ------------------------------------------------------------------------------------ */

static const char error_oom[] =
    "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,"
    "\"code\":null}}";

/* Queues body (malloc'd, taken; NULL: out of memory, answered with a fixed 500); close:
 * "Connection: close", the connection ends after it. */
static enum MHD_Result reply_ex(serve_http *h, struct MHD_Connection *c, int status,
                                const char *content_type, char *body, size_t len, int close) {
    struct MHD_Response *r;
    if (body) {
        r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
        if (!r) free(body);
    } else {
        status = 500;
        content_type = "application/json";
        r = MHD_create_response_from_buffer(sizeof error_oom - 1, (void *)error_oom,
                                            MHD_RESPMEM_PERSISTENT);
    }
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    if (status == 503) MHD_add_response_header(r, "Retry-After", "1");
    if (status == 401) MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (status == 405) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, POST");
    if (close || atomic_load(&h->quiesced))
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    if (ok == MHD_YES) fmoe_serve_metrics_http_status(h->metrics, status);
    return ok;
}

static enum MHD_Result reply(serve_http *h, struct MHD_Connection *c, int status,
                             const char *content_type, char *body, size_t len) {
    return reply_ex(h, c, status, content_type, body, len, 0);
}

static enum MHD_Result reply_json(serve_http *h, struct MHD_Connection *c, int status,
                                  char *json) {
    return reply(h, c, status, "application/json", json, json ? strlen(json) : 0);
}

static enum MHD_Result reply_error(serve_http *h, struct MHD_Connection *c, int status,
                                   const char *type, const char *param, const char *code,
                                   const char *message) {
    return reply_json(h, c, status, fmoe_serve_api_render_error(type, message, param, code));
}

static enum MHD_Result reply_busy(serve_http *h, struct MHD_Connection *c, const char *why) {
    return reply_error(h, c, 503, "overloaded_error", NULL, NULL, why);
}

static char *dup_str(const char *s) {
    return strdup(s);
}

/* ---------------------------------------------------------------------------------------
 * Routing and per-request state
 * ------------------------------------------------------------------------------------ */

enum route { R_CHAT, R_COMPLETIONS, R_MODELS, R_HEALTH, R_METRICS };

static const struct {
    const char *path;
    const char *method;
    int auth;
} routes[] = {
    [R_CHAT] = {"/v1/chat/completions", "POST", 1},
    [R_COMPLETIONS] = {"/v1/completions", "POST", 1},
    [R_MODELS] = {"/v1/models", "GET", 1},
    [R_HEALTH] = {"/health", "GET", 0},
    [R_METRICS] = {"/metrics", "GET", 0},
};
#define NUM_ROUTES ((int)(sizeof routes / sizeof routes[0]))

/* The access handler's con_cls: one per request. */
typedef struct request {
    int route;
    int responded;     /* a response is queued: the rest of the body is discarded */
    int too_large;     /* the body passed max_body: discarded, 413 when it ends */
    uint64_t discarded; /* bytes of a too large body read and dropped */
    char *body;        /* [len] bytes received so far (cap allocated) */
    size_t len, cap;
    /* a non-streamed request waiting for its jobs, one per choice (continue_wait) */
    serve_job *jobs[SERVE_API_MAX_N];
    int32_t njobs;
    conn_entry *ce;    /* referenced while njobs > 0 */
    serve_api_meta meta;
    char id[SERVE_API_ID_MAX];
    char *model;
    int cancelled;
    double stop_since; /* monotonic seconds the shutdown was first seen, 0: not yet */
} request;

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)c, (void)toe;
    serve_http *h = cls;
    request *r = *con_cls;
    /* the next request on a kept-alive connection gets the whole deadline again */
    set_deadline(h, entry_of(c), 1);
    if (!r) return;
    if (r->njobs) { /* the client went away while it waited */
        watch(r->ce, NULL, 0);
        drop_jobs(r->jobs, r->njobs);
        entry_unref(r->ce);
    }
    atomic_fetch_sub(&h->active, 1);
    free(r->model);
    free(r->body);
    free(r);
    *con_cls = NULL;
}

/* Constant time in the key's length whatever the guess: no early exit on a mismatch. */
static int auth_ok(const serve_http *h, struct MHD_Connection *c) {
    if (!h->api_key) return 1;
    const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!v || strncasecmp(v, "Bearer ", 7) != 0) return 0;
    const char *k = v + 7;
    while (*k == ' ') k++;
    size_t n = strlen(k);
    unsigned diff = n != h->api_key_len;
    for (size_t i = 0; i < h->api_key_len; i++)
        diff |= (unsigned char)h->api_key[i] ^ (unsigned char)(i < n ? k[i] : 0);
    return diff == 0;
}

/* ---------------------------------------------------------------------------------------
 * GET endpoints
 * ------------------------------------------------------------------------------------ */

static enum MHD_Result get_health(serve_http *h, struct MHD_Connection *c) {
    serve_engine *e = atomic_load(&h->engine);
    int stopping = atomic_load(&h->quiesced) || atomic_load(&h->stopping);
    serve_engine_gauges g = {0};
    if (e && !stopping) fmoe_serve_engine_get_gauges(e, &g);
    if (e && !stopping && g.trace_error) /* serving nothing it cannot record: out of rotation */
        return reply_json(h, c, 503, fmoe_serve_api_render_health("degraded", g.trace_error));
    if (e && !stopping && g.ready) return reply_json(h, c, 200, dup_str("{\"status\":\"ok\"}"));
    return reply_json(h, c, 503, dup_str(stopping ? "{\"status\":\"stopping\"}"
                                                  : "{\"status\":\"loading\"}"));
}

static enum MHD_Result get_metrics(serve_http *h, struct MHD_Connection *c) {
    serve_engine *e = atomic_load(&h->engine);
    serve_engine_gauges g = {0};
    serve_layer_counters *layers = NULL;
    int32_t L = 0;
    if (e) {
        serve_engine_info info;
        fmoe_serve_engine_get_info(e, &info);
        fmoe_serve_engine_get_gauges(e, &g);
        L = info.num_layers > 0 ? info.num_layers : 0;
        if (L && !(layers = calloc((size_t)L, sizeof *layers))) return reply_json(h, c, 500, NULL);
        if (L) fmoe_serve_engine_get_layers(e, layers);
    }
    /* Counted before rendering so that this scrape's own 200 shows in it. */
    fmoe_serve_metrics_http_status(h->metrics, 200);
    char *text = NULL;
    size_t len = 0;
    int rc = fmoe_serve_metrics_render(h->metrics, &g, layers, L, &text, &len);
    free(layers);
    if (rc < 0) return reply_json(h, c, 500, NULL);
    struct MHD_Response *r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8");
    enum MHD_Result ok = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result get_models(serve_http *h, struct MHD_Connection *c) {
    serve_engine *e = atomic_load(&h->engine);
    if (!e) return reply_busy(h, c, "the model is loading");
    serve_engine_info info;
    fmoe_serve_engine_get_info(e, &info);
    return reply_json(h, c, 200, fmoe_serve_api_render_models(&info));
}

/* ---------------------------------------------------------------------------------------
 * Streams: a content reader producing SSE events from fmoe_serve_job_wait
 * ------------------------------------------------------------------------------------ */

/* A read of 0 bytes from a peeked socket: the client closed its end. */
static int peer_closed(int fd) {
    if (fd < 0) return 0;
    char ch;
    ssize_t n = recv(fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* One choice of a stream. */
typedef struct stream_choice {
    serve_job *job;
    int finished;              /* its job finished (its last chunk went out) */
    serve_job_status st;       /* once finished: for the usage chunk */
    size_t have;               /* bytes of the job's text sent */
    int32_t lp_sent;           /* tokens whose logprobs were sent (meta.logprobs) */
    uint64_t lp_end;           /* where the last of them ended in the text */
    serve_tools_stream split;  /* tools or <think> (fmoe_serve_api_splits_output): what of
                                  the split text went out */
} stream_choice;

typedef struct stream {
    serve_http *h;
    stream_choice ch[SERVE_API_MAX_N];
    int32_t n;
    serve_api_meta meta;
    char id[SERVE_API_ID_MAX];
    char *model;               /* owned copy: the engine's string may go before we do */
    int include_usage;
    int role_sent;             /* chat: the first chunks ({"role":"assistant"}) went out */
    int done;                  /* [DONE] is in pend: end after it */
    int cancelled;
    int fd;                    /* the connection's socket, peeked for a hang-up; -1: unknown */
    conn_entry *ce;            /* what wakes it (referenced), or NULL */
    double last_sent;          /* monotonic seconds of the last event or keep-alive */
    double stop_since;         /* monotonic seconds it first saw the shutdown, 0: not yet */
    char *pend;                /* [pend_len] bytes to send, from pend_off */
    size_t pend_len, pend_off, pend_cap;
} stream;

static int pend_add(stream *s, const char *a, size_t n) {
    if (s->pend_len + n > s->pend_cap) {
        size_t cap = (s->pend_cap ? s->pend_cap * 2 : 1024) + n;
        char *p = realloc(s->pend, cap);
        if (!p) return -1;
        s->pend = p;
        s->pend_cap = cap;
    }
    memcpy(s->pend + s->pend_len, a, n);
    s->pend_len += n;
    return 0;
}

/* Queues "data: JSON\n\n"; takes json (NULL: out of memory). */
static int pend_event(stream *s, char *json) {
    if (!json) return -1;
    int rc = pend_add(s, "data: ", 6) || pend_add(s, json, strlen(json)) || pend_add(s, "\n\n", 2);
    free(json);
    return rc ? -1 : 0;
}

/* The events of choice i's news, if any: its new text (with the logprobs of its tokens)
 * and, once it finished, its last chunk or the error. @return 1 news, 0 none, -1 out of
 * memory; *failed 1 when the job failed (the stream ends). */
static int choice_next(stream *s, int32_t i, int *failed) {
    stream_choice *ch = &s->ch[i];
    char *text = NULL;
    size_t len = 0;
    serve_job_status st;
    int news = fmoe_serve_job_wait(ch->job, ch->have, 0, &text, &len, &st); /* never blocks */
    if (news != 1) {
        free(text);
        return 0;
    }
    int rc = 0;
    /* a chunk carries the logprobs of the tokens whose text it completes (all that are
     * left once the job finished): their strings concatenate to the chunks' text */
    serve_token_logprob *lp = NULL;
    int32_t nlp = 0, take = 0;
    if (s->meta.logprobs && fmoe_serve_job_logprobs(ch->job, ch->lp_sent, &lp, &nlp) < 0) {
        free(text);
        return -1;
    }
    while (take < nlp && (st.finished != SERVE_RUNNING || lp[take].text_end <= len)) take++;
    if (fmoe_serve_api_splits_output(&s->meta)) {
        /* the split text's new parts; the last parse (finished) lets go of held tails */
        serve_tools_delta d;
        rc = fmoe_serve_tools_stream_next(&ch->split, text ? text : "", len,
                                          st.finished != SERVE_RUNNING, &d);
        if (rc == 0 && (d.content_len || d.reasoning_len || d.num_calls || take > 0))
            rc = pend_event(s, fmoe_serve_api_render_chunk_tools(&s->meta, i, &d, NULL,
                                                                 s->include_usage, lp, take,
                                                                 (size_t)ch->lp_end));
        ch->lp_sent += take;
        if (take > 0) ch->lp_end = lp[take - 1].text_end;
    } else if (len > ch->have || take > 0) {
        rc = pend_event(s, fmoe_serve_api_render_chunk_lp(&s->meta, i, 0, text + ch->have,
                                                          len > ch->have ? len - ch->have : 0,
                                                          NULL, s->include_usage, lp, take,
                                                          (size_t)ch->lp_end));
        ch->lp_sent += take;
        if (take > 0) ch->lp_end = lp[take - 1].text_end;
    }
    free(lp);
    if (len > ch->have) ch->have = len;
    free(text);
    if (rc < 0 || st.finished == SERVE_RUNNING) return rc < 0 ? -1 : 1;

    ch->finished = 1;
    ch->st = st;
    if (st.finished == SERVE_FINISH_ERROR) {
        *failed = 1;
        rc = pend_event(s, fmoe_serve_api_render_error("server_error", st.error, NULL,
                                                  st.http_status == 507 ? "trace_write_failed"
                                                                        : NULL));
    } else {
        const char *finish = fmoe_serve_api_finish_reason(st.finished);
        if (ch->split.calls_sent > 0 && st.finished == SERVE_FINISH_STOP)
            finish = s->meta.tools.legacy ? "function_call" : "tool_calls";
        rc = pend_event(s, fmoe_serve_api_render_chunk_lp(&s->meta, i, 0, "", 0, finish,
                                                          s->include_usage, NULL, 0, 0));
    }
    return rc < 0 ? -1 : 1;
}

/* Produces the next events into pend (possibly none, after a wait slice). @return 0 or
 * -1 (out of memory, or the engine did not end a cancelled job in time). */
static int stream_next(stream *s) {
    int chat = s->meta.kind == SERVE_API_CHAT;
    if (chat && !s->role_sent) {
        s->role_sent = 1;
        for (int32_t i = 0; i < s->n; i++)
            if (pend_event(s, fmoe_serve_api_render_chunk_lp(&s->meta, i, 1, NULL, 0, NULL,
                                                             s->include_usage, NULL, 0, 0)) < 0)
                return -1;
        return 0;
    }
    const double now = mono_s();
    if (atomic_load(&s->h->stopping)) {
        if (!s->cancelled)
            for (int32_t i = 0; i < s->n; i++) fmoe_serve_job_cancel(s->ch[i].job);
        s->cancelled = 1;
        if (s->stop_since == 0) s->stop_since = now;
        if (now - s->stop_since > STOP_WAIT_S) return -1;
    }
    int any = 0, failed = 0, all = 1;
    for (int32_t i = 0; i < s->n && !failed; i++) {
        if (s->ch[i].finished) continue;
        const int rc = choice_next(s, i, &failed);
        if (rc < 0) return -1;
        any |= rc;
        all &= s->ch[i].finished;
    }
    if (!any) {
        /* MHD notices a hang-up only when a write fails, and nothing is written while the
         * job is queued or between slow tokens: look at the socket ourselves. */
        if (peer_closed(s->fd)) return -1;
        if (now - s->last_sent < KEEPALIVE_S) return 0;
        s->last_sent = now;
        return pend_add(s, ": keep-alive\n\n", 14);
    }
    s->last_sent = now;
    if (!failed && !all) return 0;
    int rc = 0;
    if (!failed && s->include_usage) {
        serve_job_status st[SERVE_API_MAX_N];
        for (int32_t i = 0; i < s->n; i++) st[i] = s->ch[i].st;
        const serve_job_status sum = sum_status(st, s->n);
        rc = pend_event(s, fmoe_serve_api_render_usage_chunk(&s->meta, &sum));
    }
    if (!rc) rc = pend_add(s, "data: [DONE]\n\n", 14);
    s->done = 1;
    return rc;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream *s = cls;
    for (;;) {
        if (s->pend_off < s->pend_len) {
            size_t n = s->pend_len - s->pend_off;
            if (n > max) n = max;
            memcpy(buf, s->pend + s->pend_off, n);
            s->pend_off += n;
            return (ssize_t)n;
        }
        s->pend_len = s->pend_off = 0;
        if (s->done) return MHD_CONTENT_READER_END_OF_STREAM;
        if (stream_next(s) < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
        /* nothing to send yet: wait off the event loop until the job has news (or the
         * ticker's next look); 0 bytes now, MHD asks again once resumed */
        if (s->pend_len == 0 && park(s->h, s->ce)) return 0;
    }
}

/* MHD frees the response when the connection is done with it: finished, or the client
 * went away (then the job is still running and is cancelled). */
static void stream_free(void *cls) {
    stream *s = cls;
    watch(s->ce, NULL, 0);
    entry_unref(s->ce);
    for (int32_t i = 0; i < s->n; i++) {
        if (!s->ch[i].finished) fmoe_serve_job_cancel(s->ch[i].job);
        fmoe_serve_job_release(s->ch[i].job);
        fmoe_serve_tools_stream_free(&s->ch[i].split);
    }
    free(s->model);
    free(s->pend);
    free(s);
}

static enum MHD_Result start_stream(serve_http *h, struct MHD_Connection *c,
                                    serve_job *const *jobs, int32_t n,
                                    const serve_api_meta *meta, int include_usage) {
    stream *s = calloc(1, sizeof *s);
    if (s) s->model = strdup(meta->model ? meta->model : "");
    if (!s || !s->model) {
        if (s) free(s);
        drop_jobs(jobs, n);
        return reply_json(h, c, 500, NULL);
    }
    s->h = h;
    s->n = n;
    for (int32_t i = 0; i < n; i++) {
        s->ch[i].job = jobs[i];
        fmoe_serve_tools_stream_init(&s->ch[i].split, &meta->tools);
    }
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    s->fd = ci ? ci->connect_fd : -1;
    s->include_usage = include_usage;
    s->last_sent = mono_s();
    s->ce = entry_ref(entry_of(c));
    watch(s->ce, jobs, n);
    s->meta = *meta;
    snprintf(s->id, sizeof s->id, "%s", meta->id);
    s->meta.id = s->id;
    s->meta.model = s->model;
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, s, stream_free);
    if (!r) {
        stream_free(s);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    enum MHD_Result ok = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r); /* stream_free runs when MHD lets go of it */
    if (ok == MHD_YES) fmoe_serve_metrics_http_status(h->metrics, 200);
    return ok;
}

/* ---------------------------------------------------------------------------------------
 * POST endpoints
 * ------------------------------------------------------------------------------------ */

static void new_id(serve_http *h, int32_t kind, char out[SERVE_API_ID_MAX]) {
    uint8_t rnd[12];
    if (getrandom(rnd, sizeof rnd, GRND_NONBLOCK) != (ssize_t)sizeof rnd) {
        /* No entropy yet (early boot): unique is enough for an id. */
        uint64_t a = atomic_fetch_add(&h->id_counter, 1), b = (uint64_t)time(NULL);
        for (int i = 0; i < 8; i++) rnd[i] = (uint8_t)(a >> (8 * i));
        for (int i = 0; i < 4; i++) rnd[8 + i] = (uint8_t)(b >> (8 * i));
    }
    fmoe_serve_api_make_id(kind, rnd, out);
}

/* A non-streamed request waiting for its job, in the access handler: answers once the job
 * finished, else cancels it when the client hung up or the server stops, and suspends the
 * connection until the job's next news (or the ticker's next look). */
static enum MHD_Result continue_wait(serve_http *h, struct MHD_Connection *c, request *r) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    const int fd = ci ? ci->connect_fd : -1;
    const int32_t n = r->njobs;
    for (;;) {
        char *text[SERVE_API_MAX_N] = {0};
        size_t len[SERVE_API_MAX_N] = {0};
        serve_job_status st[SERVE_API_MAX_N] = {{0}};
        int all = 1;
        /* have = SIZE_MAX: news only when a job finishes; never blocks */
        for (int32_t i = 0; i < n && all; i++)
            all = fmoe_serve_job_wait(r->jobs[i], SIZE_MAX, 0, &text[i], &len[i], &st[i]) == 1 &&
                  st[i].finished != SERVE_RUNNING;
        if (all) {
            /* the logprobs before the jobs go; -1: out of memory */
            serve_token_logprob *lp[SERVE_API_MAX_N] = {0};
            int32_t nlp[SERVE_API_MAX_N] = {0};
            int lp_rc = 0, failed = -1;
            for (int32_t i = 0; i < n; i++) {
                if (st[i].finished == SERVE_FINISH_ERROR && failed < 0) failed = i;
                if (r->meta.logprobs && st[i].finished != SERVE_FINISH_ERROR && lp_rc == 0)
                    lp_rc = fmoe_serve_job_logprobs(r->jobs[i], 0, &lp[i], &nlp[i]);
            }
            watch(r->ce, NULL, 0);
            entry_unref(r->ce);
            r->ce = NULL;
            for (int32_t i = 0; i < n; i++) fmoe_serve_job_release(r->jobs[i]);
            r->njobs = 0;
            enum MHD_Result ok = MHD_NO; /* nobody to answer */
            if (!(r->cancelled && peer_closed(fd))) {
                if (failed >= 0) {
                    const serve_job_status *f = &st[failed];
                    ok = reply_error(h, c, f->http_status ? f->http_status : 500, "server_error",
                                     NULL, f->http_status == 507 ? "trace_write_failed" : NULL,
                                     f->error[0] ? f->error : "generation failed");
                } else if (lp_rc < 0) {
                    ok = reply_error(h, c, 500, "server_error", NULL, NULL, "out of memory");
                } else {
                    /* tools or <think>: each choice's text split (serve_tools.h) */
                    serve_tools_parse parsed[SERVE_API_MAX_N];
                    const int split = fmoe_serve_api_splits_output(&r->meta);
                    int32_t nparsed = 0;
                    while (split && nparsed < n &&
                           fmoe_serve_tools_parse(&r->meta.tools, text[nparsed], len[nparsed], 1,
                                                  &parsed[nparsed]) == 0)
                        nparsed++;
                    serve_api_choice ch[SERVE_API_MAX_N];
                    for (int32_t i = 0; i < n; i++)
                        ch[i] = (serve_api_choice){text[i], len[i], st[i].finished, lp[i],
                                                   nlp[i], split ? &parsed[i] : NULL};
                    const serve_job_status sum = sum_status(st, n);
                    ok = split && nparsed < n
                             ? reply_error(h, c, 500, "server_error", NULL, NULL, "out of memory")
                             : reply_json(h, c, 200,
                                          fmoe_serve_api_render_response_n(&r->meta, ch, n, &sum));
                    for (int32_t i = 0; i < nparsed; i++) fmoe_serve_tools_parse_free(&parsed[i]);
                }
            }
            for (int32_t i = 0; i < n; i++) {
                free(text[i]);
                free(lp[i]);
            }
            return ok;
        }
        for (int32_t i = 0; i < n; i++) free(text[i]);
        if (!r->cancelled && (atomic_load(&h->stopping) || peer_closed(fd))) {
            for (int32_t i = 0; i < n; i++) fmoe_serve_job_cancel(r->jobs[i]);
            r->cancelled = 1;
        }
        if (park(h, r->ce)) return MHD_YES;
    }
}

static enum MHD_Result begin_wait(serve_http *h, struct MHD_Connection *c, request *r,
                                  serve_job *const *jobs, int32_t n, const serve_api_meta *meta) {
    for (int32_t i = 0; i < n; i++) r->jobs[i] = jobs[i];
    r->njobs = n;
    r->meta = *meta;
    snprintf(r->id, sizeof r->id, "%s", meta->id);
    r->meta.id = r->id;
    r->model = strdup(meta->model ? meta->model : ""); /* the engine's may go before us */
    r->meta.model = r->model ? r->model : "";
    r->ce = entry_ref(entry_of(c));
    watch(r->ce, jobs, n);
    return continue_wait(h, c, r);
}

static enum MHD_Result post_generate(serve_http *h, struct MHD_Connection *c, request *r) {
    serve_engine *e = atomic_load(&h->engine);
    if (!e) return reply_busy(h, c, "the model is loading");
    if (atomic_load(&h->quiesced)) return reply_busy(h, c, "the server is shutting down");

    size_t bad_at = fmoe_serve_api_utf8_invalid_at(r->body, r->len);
    if (bad_at < r->len) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body is not valid UTF-8 (byte %zu)", bad_at);
        return reply_error(h, c, 400, "invalid_request_error", NULL, NULL, msg);
    }
    serve_engine_info info;
    fmoe_serve_engine_get_info(e, &info);
    int32_t kind = r->route == R_CHAT ? SERVE_API_CHAT : SERVE_API_COMPLETION;
    serve_api_request req;
    serve_api_error err;
    if (fmoe_serve_api_parse(kind, r->body ? r->body : "", r->len, h->tok, info.max_context, &req,
                        &err) < 0)
        return reply_error(h, c, err.status, err.type, err.param, err.code, err.message);

    /* n choices are n sequences, each running the prompt (no KV cache shared between
     * them), with seeds seed, seed+1, ... when the request gives one (else the engine's
     * distinct ones); all are submitted or none. */
    int status = 500;
    char msg[256] = "";
    serve_job *jobs[SERVE_API_MAX_N] = {0};
    int32_t n = 0;
    for (; n < req.n; n++) {
        serve_sampling sp = req.sampling;
        sp.seed += (uint64_t)n;
        jobs[n] = fmoe_serve_engine_submit(e, req.prompt, req.num_prompt, &sp, &status, msg,
                                           sizeof msg);
        if (!jobs[n]) break;
    }
    serve_job *job = n == req.n ? jobs[0] : NULL;
    if (!job) drop_jobs(jobs, n);
    int stream = req.stream, include_usage = req.include_usage;
    const int32_t logprobs = req.sampling.logprobs;
    const serve_tools_config tools = req.tools;
    fmoe_serve_api_request_free(&req); /* submit copied the prompt and the stop strings */
    if (!job) {
        if (status == 503) return reply_busy(h, c, msg[0] ? msg : "the server is busy");
        if (status == 400)
            return reply_error(h, c, 400, "invalid_request_error", NULL, NULL, msg);
        return reply_error(h, c, 500, "server_error", NULL, NULL, msg[0] ? msg : "submit failed");
    }

    char id[SERVE_API_ID_MAX];
    new_id(h, kind, id);
    serve_api_meta meta = {kind, id, (int64_t)time(NULL), info.model_name ? info.model_name : "",
                           logprobs, h->tok, tools};
    if (stream) return start_stream(h, c, jobs, n, &meta, include_usage);
    return begin_wait(h, c, r, jobs, n, &meta);
}

/* How much of a too large body is read and dropped so that the client, still sending,
 * gets to read the 413 (closing with unread data makes the kernel reset the connection,
 * and most clients then report the reset, not the answer). Beyond it: drop the client. */
static uint64_t discard_limit(const serve_http *h) {
    return (uint64_t)h->max_body * 4 + (8u << 20);
}

/* Appends an upload piece; past max_body the rest is discarded and 413 answered when the
 * body ends (or the connection dropped past discard_limit). */
static enum MHD_Result take_body(serve_http *h, struct MHD_Connection *c, request *r,
                                 const char *data, size_t n) {
    if (r->too_large || r->len + n > h->max_body) {
        if (!r->too_large) {
            r->too_large = 1;
            r->discarded = r->len;
            free(r->body);
            r->body = NULL;
            r->len = r->cap = 0;
        }
        r->discarded += n;
        return r->discarded > discard_limit(h) ? MHD_NO : MHD_YES;
    }
    if (r->len + n > r->cap) {
        size_t cap = r->cap ? r->cap : 4096;
        while (cap < r->len + n) cap *= 2;
        if (cap > h->max_body) cap = h->max_body;
        char *b = realloc(r->body, cap);
        if (!b) {
            r->responded = 1;
            return reply_json(h, c, 500, NULL);
        }
        r->body = b;
        r->cap = cap;
    }
    memcpy(r->body + r->len, data, n);
    r->len += n;
    return MHD_YES;
}

static enum MHD_Result reply_too_large(serve_http *h, struct MHD_Connection *c) {
    char msg[128];
    snprintf(msg, sizeof msg, "the request body is larger than %zu bytes", h->max_body);
    return reply_error(h, c, 413, "invalid_request_error", NULL, NULL, msg);
}

/* ---------------------------------------------------------------------------------------
 * The access handler
 * ------------------------------------------------------------------------------------ */

/* What framing_check counts of a request's headers. */
typedef struct framing {
    int content_lengths;        /* Content-Length lines */
    int conflicting;            /* two of them with different values */
    int transfer_encoding;      /* Transfer-Encoding lines */
    const char *first_length;   /* the first Content-Length value (MHD's storage) */
} framing;

static enum MHD_Result framing_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                      const char *value) {
    (void)kind;
    framing *f = cls;
    if (!key) return MHD_YES;
    if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) {
        if (f->content_lengths++ == 0) f->first_length = value;
        else if (strcmp(value ? value : "", f->first_length ? f->first_length : "") != 0)
            f->conflicting = 1;
    } else if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0) {
        f->transfer_encoding++;
    }
    return MHD_YES;
}

/* Request smuggling material: a body whose length two parsers may read differently.
 * libmicrohttpd 0.9.75 accepts two Content-Length headers, and Transfer-Encoding beside
 * Content-Length, reading the body one way where a proxy in front may read it the other;
 * RFC 9112 section 6.3 makes both an error. @return NULL when the framing is unambiguous, else why not. */
static const char *framing_check(struct MHD_Connection *c) {
    framing f = {0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, framing_header, &f);
    if (f.conflicting) return "the request has Content-Length headers with different values";
    if (f.transfer_encoding && f.content_lengths)
        return "the request has both Transfer-Encoding and Content-Length";
    if (f.transfer_encoding > 1) return "the request has more than one Transfer-Encoding header";
    return NULL;
}

/* The first call for a request: framing, route, method, auth, declared length. A response
 * queued here means the body is never read. */
static enum MHD_Result first_call(serve_http *h, struct MHD_Connection *c, const char *url,
                                  const char *method, request *r) {
    const char *ambiguous = framing_check(c);
    if (ambiguous) {
        /* the connection closes after the answer: where its next request starts is what
         * the two readings disagree on */
        r->responded = 1;
        char *json = fmoe_serve_api_render_error("invalid_request_error", ambiguous, NULL,
                                            "ambiguous_framing");
        return reply_ex(h, c, 400, "application/json", json, json ? strlen(json) : 0, 1);
    }
    int route = -1;
    for (int i = 0; i < NUM_ROUTES; i++)
        if (strcmp(url, routes[i].path) == 0) route = i;
    r->route = route;
    char msg[256];
    if (route < 0) {
        r->responded = 1;
        snprintf(msg, sizeof msg, "no such endpoint: %.200s", url);
        return reply_error(h, c, 404, "invalid_request_error", NULL, "not_found", msg);
    }
    /* HEAD is GET without the body (MHD drops it), as RFC 9110 asks of every GET route */
    const int head_of_get =
        strcmp(method, "HEAD") == 0 && strcmp(routes[route].method, "GET") == 0;
    if (strcmp(method, routes[route].method) != 0 && !head_of_get) {
        r->responded = 1;
        snprintf(msg, sizeof msg, "%s takes %s, not %.32s", routes[route].path,
                 routes[route].method, method);
        return reply_error(h, c, 405, "invalid_request_error", NULL, "method_not_allowed", msg);
    }
    if (routes[route].auth && !auth_ok(h, c)) {
        r->responded = 1;
        return reply_error(h, c, 401, "authentication_error", NULL, "invalid_api_key",
                           "Incorrect or missing API key (Authorization: Bearer KEY).");
    }
    switch (route) {
    case R_HEALTH: r->responded = 1; return get_health(h, c);
    case R_METRICS: r->responded = 1; return get_metrics(h, c);
    case R_MODELS: r->responded = 1; return get_models(h, c);
    default: break;
    }
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                 MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl) {
        char *end;
        errno = 0;
        unsigned long long n = strtoull(cl, &end, 10);
        if (errno == 0 && end != cl && n > h->max_body) {
            /* A client waiting for "100 Continue" sends nothing more: answer now. */
            const char *expect =
                MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
            if (n > discard_limit(h) || (expect && strcasecmp(expect, "100-continue") == 0)) {
                r->responded = 1;
                return reply_too_large(h, c);
            }
            r->too_large = 1; /* read and drop it, then answer */
        }
    }
    if (!atomic_load(&h->engine)) {
        r->responded = 1;
        return reply_busy(h, c, "the model is loading");
    }
    if (atomic_load(&h->quiesced)) {
        r->responded = 1;
        return reply_busy(h, c, "the server is shutting down");
    }
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_size, void **con_cls) {
    (void)version;
    serve_http *h = cls;
    request *r = *con_cls;
    if (!r) {
        if (!(r = calloc(1, sizeof *r))) return MHD_NO;
        *con_cls = r;
        atomic_fetch_add(&h->active, 1);
        head_arrived(h, entry_of(c));
        return first_call(h, c, url, method, r);
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (r->responded) return MHD_YES;
        return take_body(h, c, r, upload_data, n);
    }
    if (r->njobs) return continue_wait(h, c, r); /* resumed */
    if (r->responded) return MHD_YES;
    r->responded = 1;
    set_deadline(h, entry_of(c), 0); /* the whole request is in: no deadline to answer */
    if (r->too_large) return reply_too_large(h, c);
    return post_generate(h, c, r);
}

/* ---------------------------------------------------------------------------------------
 * Lifetime
 * ------------------------------------------------------------------------------------ */

static int listen_on(const char *host, int port, int *fd_out, int *port_out, int *v6) {
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int g = getaddrinfo(host, service, &hints, &ai);
    if (g != 0)
        return fmoe_error_set(FMOE_EIO, "cannot listen on %s:%d: %s", host, port, gai_strerror(g));
    int fd = -1, err = 0;
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 128) == 0) {
            *v6 = a->ai_family == AF_INET6;
            break;
        }
        err = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0)
        return fmoe_error_set(FMOE_EIO, "cannot listen on %s:%d: %s", host, port, strerror(err));
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
        err = errno;
        close(fd);
        return fmoe_error_set(FMOE_EIO, "%s:%d: getsockname: %s", host, port, strerror(err));
    }
    *port_out = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    *fd_out = fd;
    return 0;
}

/* MHD's own connection limit: ours plus room for the connections being closed to make
 * room, spread over the pool's threads (MHD gives each thread an equal share). */
static unsigned backstop_limit(uint32_t max_connections) {
    uint64_t n = (uint64_t)max_connections + max_connections / 4 + 16 * POOL_THREADS;
    return n > 1u << 20 ? 1u << 20 : (unsigned)n;
}

int fmoe_serve_http_start(const serve_http_options *o, serve_http **out) {
    *out = NULL;
    FMOE_RETURN_ERROR_IF(!o || !o->tokenizer, FMOE_EINVAL, "fmoe_serve_http_start: no tokenizer");
    FMOE_RETURN_ERROR_IF(o->port < 0 || o->port > 65535, FMOE_EINVAL,
                         "fmoe_serve_http_start: port %d outside [0, 65535]", o->port);
    serve_http *h = calloc(1, sizeof *h);
    if (!h) return fmoe_error_set(FMOE_ENOMEM, "fmoe_serve_http_start: out of memory");
    h->listen_fd = -1;
    h->tok = o->tokenizer;
    h->metrics = o->metrics;
    h->max_body = o->max_body_bytes ? o->max_body_bytes : (size_t)1 << 20;
    if (o->api_key && o->api_key[0]) {
        if (!(h->api_key = strdup(o->api_key))) {
            free(h);
            return fmoe_error_set(FMOE_ENOMEM, "fmoe_serve_http_start: out of memory");
        }
        h->api_key_len = strlen(h->api_key);
    }
    const char *host = o->host && o->host[0] ? o->host : "127.0.0.1";
    const unsigned timeout = o->connection_timeout_s ? o->connection_timeout_s : 30;
    h->request_timeout_s = timeout;
    const unsigned head = o->header_timeout_s ? o->header_timeout_s : 10;
    h->header_timeout_s = head < timeout ? head : timeout;
    h->max_connections = o->max_connections ? o->max_connections : 512;
    pthread_mutex_init(&h->conn_mu, NULL);
    int v6 = 0;
    int rc = listen_on(host, o->port, &h->listen_fd, &h->port, &v6);
    if (rc < 0) {
        pthread_mutex_destroy(&h->conn_mu);
        free(h->api_key);
        free(h);
        return rc;
    }
    /* the ticker first: MHD may call on_connection as soon as it starts. Signals go to
     * the main thread (cmd_serve's pipe), not to ours */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    h->ticker_started = pthread_create(&h->ticker, NULL, ticker_main, h) == 0;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ITC |
                     MHD_ALLOW_SUSPEND_RESUME | (v6 ? MHD_USE_IPv6 : 0);
    if (h->ticker_started)
        h->daemon = MHD_start_daemon(
            flags, 0, NULL, NULL, on_request, h,
            MHD_OPTION_LISTEN_SOCKET, (MHD_socket)h->listen_fd,
            MHD_OPTION_THREAD_POOL_SIZE, (unsigned)POOL_THREADS,
            MHD_OPTION_CONNECTION_TIMEOUT, timeout,
            MHD_OPTION_CONNECTION_LIMIT, backstop_limit(h->max_connections),
            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)o->max_client_connections,
            MHD_OPTION_NOTIFY_COMPLETED, on_completed, (void *)h,
            MHD_OPTION_NOTIFY_CONNECTION, on_connection, (void *)h,
            MHD_OPTION_END);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!h->daemon) {
        if (h->ticker_started) {
            atomic_store(&h->ticker_stop, 1);
            pthread_join(h->ticker, NULL);
        }
        close(h->listen_fd);
        pthread_mutex_destroy(&h->conn_mu);
        free(h->api_key);
        free(h);
        return fmoe_error_set(FMOE_EIO, "%s:%d: libmicrohttpd failed to start", host, o->port);
    }
    *out = h;
    return 0;
}

int fmoe_serve_http_port(const serve_http *h) { return h ? h->port : 0; }

void fmoe_serve_http_set_engine(serve_http *h, serve_engine *e) {
    if (!h) return;
    if (e && h->metrics) {
        serve_engine_info info;
        fmoe_serve_engine_get_info(e, &info);
        (void)fmoe_serve_metrics_set_model_name(h->metrics, info.model_name); /* best effort */
    }
    atomic_store(&h->engine, e);
}

void fmoe_serve_http_quiesce(serve_http *h) {
    if (!h || atomic_exchange(&h->quiesced, 1)) return;
    MHD_socket fd = MHD_quiesce_daemon(h->daemon);
    /* MHD's thread may still sit in poll() on the socket, which keeps it alive (and
     * accepting into its backlog) past close(); shutdown() stops the listening at once. */
    if (fd != MHD_INVALID_SOCKET) {
        shutdown(fd, SHUT_RDWR);
        close(fd);
    }
    h->listen_fd = -1;
}

int fmoe_serve_http_wait_idle(serve_http *h, double seconds) {
    if (!h) return 1;
    for (double waited = 0; atomic_load(&h->active) > 0; waited += 0.01) {
        if (waited >= seconds) return 0;
        nanosleep(&(struct timespec){.tv_nsec = 10000000L}, NULL);
    }
    return 1;
}

void fmoe_serve_http_stop(serve_http *h) {
    if (!h) return;
    atomic_store(&h->stopping, 1);
    /* MHD must not be stopped with a connection suspended (libmicrohttpd's rule): from
     * here on handlers do not suspend, the ticker resumes whatever still is, and waiting
     * handlers poll briefly instead. Streams see `stopping`, cancel their jobs and end
     * within STOP_WAIT_S. */
    pthread_mutex_lock(&h->conn_mu);
    h->no_suspend = 1;
    pthread_mutex_unlock(&h->conn_mu);
    for (double waited = 0; waited < 2 * WAIT_SLICE_S + 1; waited += 0.01) {
        pthread_mutex_lock(&h->conn_mu);
        const int32_t left = h->suspended;
        pthread_mutex_unlock(&h->conn_mu);
        if (left == 0) break;
        nanosleep(&(struct timespec){.tv_nsec = 10000000L}, NULL);
    }
    if (h->ticker_started) {
        atomic_store(&h->ticker_stop, 1);
        pthread_join(h->ticker, NULL);
    }
    /* whatever the ticker left suspended (a wake-up racing its last round) goes now */
    pthread_mutex_lock(&h->conn_mu);
    for (conn_entry *ce = h->conns; ce; ce = ce->next)
        if (ce->suspended) {
            ce->suspended = 0;
            h->suspended--;
            MHD_resume_connection(ce->c);
        }
    pthread_mutex_unlock(&h->conn_mu);
    /* a not quiesced daemon closes the listening socket itself */
    MHD_stop_daemon(h->daemon);
    pthread_mutex_destroy(&h->conn_mu);
    free(h->api_key);
    free(h);
}
