/*
 * test_http_server.c - runtime/serve/http_server.c over real sockets, in front of a fake
 * engine defined here (the serve_engine_* functions), so that routing, auth, limits,
 * streaming, cancellation on disconnect and shutdown are tested without a model. The
 * end-to-end test with the real engine is tests/python/test_serve.py.
 *
 * The fake engine's job "generates" FAKE_TEXT one byte every 5 ms from its submit; a
 * request with max_tokens 999 generates nothing and runs until cancelled; a request with
 * tools (the server keeps special tokens for those) "generates" FAKE_TOOL_TEXT, a Qwen3
 * answer that thinks, says a few words and calls a tool.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "fmoe/error.h"
#include "fmoe/tokenizer.h"
#include "harness.h"
#include "http_server.h"

#define FAKE_TEXT "Hello, \"world\"!\n"
#define FAKE_TOOL_TEXT                                                                     \
    "<think>\nweather\n</think>\n\nLet me look.\n<tool_call>\n{\"name\": \"get_weather\", " \
    "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
#define FAKE_STEP_S 0.005

/* ---------------------------------------------------------------------------------------
 * The fake engine
 * ------------------------------------------------------------------------------------ */

struct serve_engine {
    int ready;
    int submit_status; /* 0: accept; else refuse with this status */
};

struct serve_job {
    atomic_int refs;
    atomic_int cancelled;
    int endless;
    const char *text; /* what it "generates" */
    struct timespec start;
};

static atomic_int jobs_live, jobs_cancelled;

static double since(const struct timespec *t) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - t->tv_sec) + 1e-9 * (double)(now.tv_nsec - t->tv_nsec);
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

serve_job *fmoe_serve_engine_submit(serve_engine *e, const int32_t *ids, int32_t n,
                               const serve_sampling *s, int *http_status, char *msg, size_t cap) {
    (void)ids;
    if (e->submit_status) {
        *http_status = e->submit_status;
        snprintf(msg, cap, "fake refusal %d", e->submit_status);
        return NULL;
    }
    if (n < 1 || s->max_tokens < 1) {
        *http_status = 400;
        snprintf(msg, cap, "bad request reached the engine");
        return NULL;
    }
    serve_job *j = calloc(1, sizeof *j);
    atomic_store(&j->refs, 2);
    j->endless = s->max_tokens == 999;
    j->text = s->keep_special ? FAKE_TOOL_TEXT : FAKE_TEXT;
    clock_gettime(CLOCK_MONOTONIC, &j->start);
    atomic_fetch_add(&jobs_live, 1);
    /* The engine's reference is dropped at once: the fake has no scheduler. */
    fmoe_serve_job_release(j);
    return j;
}

int fmoe_serve_job_wait(serve_job *j, size_t have, double timeout_s, char **text, size_t *len,
                   serve_job_status *st) {
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const size_t full = strlen(j->text);
    for (;;) {
        size_t made = j->endless ? 0 : (size_t)(since(&j->start) / FAKE_STEP_S);
        if (made > full) made = full;
        int cancelled = atomic_load(&j->cancelled);
        int finished = cancelled ? SERVE_FINISH_CANCELLED : made == full ? SERVE_FINISH_STOP : 0;
        if (made > have || finished) {
            *text = malloc(made + 1);
            memcpy(*text, j->text, made);
            *len = made;
            memset(st, 0, sizeof *st);
            st->finished = finished;
            st->prompt_tokens = 3;
            st->completion_tokens = (int32_t)made;
            st->prompt_ms = 1;
            st->predicted_ms = 2;
            return 1;
        }
        if (since(&t0) >= timeout_s) return 0;
        sleep_s(0.001);
    }
}

/* The fake records no log-probabilities (the live tests check them). */
int fmoe_serve_job_logprobs(serve_job *j, int32_t from, serve_token_logprob **out, int32_t *n) {
    (void)j, (void)from;
    *out = NULL;
    *n = 0;
    return 0;
}

/* The fake tells no news: its jobs' text grows with the clock, so the server's waits move
 * on the ticker's resume every slice, which the real engine's news only shortens. */
void fmoe_serve_job_set_notify(serve_job *j, void (*fn)(void *), void *arg) {
    (void)j, (void)fn, (void)arg;
}

void fmoe_serve_job_cancel(serve_job *j) {
    if (!atomic_exchange(&j->cancelled, 1)) atomic_fetch_add(&jobs_cancelled, 1);
}

void fmoe_serve_job_release(serve_job *j) {
    if (atomic_fetch_sub(&j->refs, 1) == 1) {
        atomic_fetch_sub(&jobs_live, 1);
        free(j);
    }
}

void fmoe_serve_engine_get_info(const serve_engine *e, serve_engine_info *out) {
    (void)e;
    *out = (serve_engine_info){.model_name = "fake-model", .max_context = 1024, .parallel = 2,
                               .num_layers = 3, .created = 1700000000};
}

void fmoe_serve_engine_get_gauges(serve_engine *e, serve_engine_gauges *out) {
    *out = (serve_engine_gauges){.running = 1, .waiting = 0, .ready = e->ready};
}

void fmoe_serve_engine_get_layers(serve_engine *e, serve_layer_counters *out) {
    (void)e;
    for (int l = 0; l < 3; l++) out[l] = (serve_layer_counters){.hits = 10 * l, .resident = l};
}

/* ---------------------------------------------------------------------------------------
 * A small HTTP client
 * ------------------------------------------------------------------------------------ */

static int dial(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static void send_all(int fd, const char *s, size_t n) {
    while (n) {
        ssize_t k = send(fd, s, n, MSG_NOSIGNAL);
        if (k <= 0) return;
        s += k, n -= (size_t)k;
    }
}

typedef struct reply {
    int status;
    char *raw;  /* headers and body as received (chunked bodies not decoded) */
    char *body; /* into raw: after the blank line */
} reply;

/* Sends `req` (a whole request with "Connection: close") and reads to EOF. */
static reply http(int port, const char *req, size_t len) {
    reply r = {0};
    int fd = dial(port);
    if (fd < 0) return r;
    send_all(fd, req, len);
    size_t cap = 1 << 16, n = 0;
    r.raw = malloc(cap);
    for (;;) {
        if (n + 1 == cap) r.raw = realloc(r.raw, cap *= 2);
        ssize_t k = recv(fd, r.raw + n, cap - n - 1, 0);
        if (k <= 0) break;
        n += (size_t)k;
    }
    close(fd);
    r.raw[n] = '\0';
    sscanf(r.raw, "HTTP/1.%*d %d", &r.status);
    char *b = strstr(r.raw, "\r\n\r\n");
    r.body = b ? b + 4 : r.raw + n;
    return r;
}

static reply get(int port, const char *path, const char *extra) {
    char req[1024];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\n%sConnection: close\r\n\r\n",
                     path, extra ? extra : "");
    return http(port, req, (size_t)n);
}

static reply post(int port, const char *path, const char *body, size_t len, const char *extra) {
    size_t cap = len + 1024;
    char *req = malloc(cap);
    int n = snprintf(req, cap,
                     "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n%sConnection: close\r\n\r\n",
                     path, len, extra ? extra : "");
    memcpy(req + n, body, len);
    reply r = http(port, req, (size_t)n + len);
    free(req);
    return r;
}

/* ---------------------------------------------------------------------------------------
 * Fixtures
 * ------------------------------------------------------------------------------------ */

static fmoe_tokenizer *tok;
static serve_metrics *metrics;

static serve_http *start(const char *api_key, size_t max_body) {
    if (!tok) {
        const char *root = getenv("FMOE_SOURCE_ROOT");
        char path[4096];
        snprintf(path, sizeof path, "%s/datasets/fmoe-tiny", root ? root : ".");
        if (fmoe_tokenizer_load(path, &tok) < 0) abort();
        metrics = fmoe_serve_metrics_new();
    }
    serve_http *h = NULL;
    serve_http_options o = {.port = 0, .api_key = api_key, .max_body_bytes = max_body,
                            .tokenizer = tok, .metrics = metrics};
    if (fmoe_serve_http_start(&o, &h) < 0) {
        fprintf(stderr, "fmoe_serve_http_start: %s\n", fmoe_error_detail());
        abort();
    }
    return h;
}

#define CHAT "/v1/chat/completions"
#define MSGS "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

/* Removes the chunked transfer encoding from body in place. */
static void dechunk(char *body) {
    char *in = body, *out = body;
    for (;;) {
        unsigned long n = strtoul(in, &in, 16);
        in = strstr(in, "\r\n");
        if (!in || n == 0) break;
        in += 2;
        memmove(out, in, n);
        out += n, in += n + 2;
    }
    *out = '\0';
}

/* The concatenated "content" (chat) or "text" deltas of an SSE body. */
static void sse_text(const char *body, const char *key, char *out, size_t cap) {
    size_t at = 0;
    char pat[32];
    snprintf(pat, sizeof pat, "\"%s\":\"", key);
    for (const char *p = strstr(body, "data: {"); p; p = strstr(p + 1, "data: {")) {
        const char *end = strstr(p, "\n\n");
        const char *c = strstr(p, pat);
        if (!c || (end && c > end)) continue;
        c += strlen(pat);
        for (; *c && *c != '"' && at + 2 < cap; c++) {
            if (*c == '\\') {
                c++;
                out[at++] = *c == 'n' ? '\n' : *c;
            } else {
                out[at++] = *c;
            }
        }
    }
    out[at] = '\0';
}

/* ---------------------------------------------------------------------------------------
 * Tests
 * ------------------------------------------------------------------------------------ */

TEST(loading_then_ready) {
    serve_http *h = start(NULL, 0);
    int port = fmoe_serve_http_port(h);
    ASSERT_TRUE(port > 0);
    reply a = get(port, "/health", NULL);
    reply b = post(port, CHAT, "{" MSGS "}", strlen("{" MSGS "}"), NULL);
    serve_engine e = {.ready = 1};
    fmoe_serve_http_set_engine(h, &e);
    reply c = get(port, "/health", NULL);
    reply d = get(port, "/v1/models", NULL);
    fmoe_serve_http_stop(h);
    ASSERT_EQ(a.status, 503);
    ASSERT_CONTAINS(a.body, "\"loading\"");
    ASSERT_EQ(b.status, 503);
    ASSERT_CONTAINS(b.raw, "Retry-After: 1");
    ASSERT_EQ(c.status, 200);
    ASSERT_CONTAINS(c.body, "{\"status\":\"ok\"}");
    ASSERT_EQ(d.status, 200);
    ASSERT_CONTAINS(d.body, "\"id\":\"fake-model\"");
    free(a.raw), free(b.raw), free(c.raw), free(d.raw);
}

TEST(errors_404_405_400_413) {
    serve_http *h = start(NULL, 1024);
    serve_engine e = {.ready = 1};
    fmoe_serve_http_set_engine(h, &e);
    int port = fmoe_serve_http_port(h);
    reply nf = get(port, "/v1/nothing", NULL);
    reply na = get(port, CHAT, NULL);
    const char bad_utf8[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"a\xC3\x28\"}]}";
    reply bu = post(port, CHAT, bad_utf8, strlen(bad_utf8), NULL);
    reply bj = post(port, CHAT, "{\"messages\":", 12, NULL);
    reply bn = post(port, CHAT, "{" MSGS ",\"n\":9}", strlen("{" MSGS ",\"n\":9}"), NULL);
    char big[2048];
    memset(big, ' ', sizeof big);
    big[0] = '{', big[sizeof big - 1] = '}';
    reply tl = post(port, CHAT, big, sizeof big, NULL);
    /* Chunked, so that the limit is found while reading, not from Content-Length. */
    char req[4096];
    int n = snprintf(req, sizeof req, "POST " CHAT " HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
                                      "chunked\r\nConnection: close\r\n\r\n");
    for (int i = 0; i < 3; i++) {
        n += snprintf(req + n, sizeof req - (size_t)n, "258\r\n"); /* 600 bytes */
        memset(req + n, ' ', 600);
        n += 600;
        n += snprintf(req + n, sizeof req - (size_t)n, "\r\n");
    }
    n += snprintf(req + n, sizeof req - (size_t)n, "0\r\n\r\n");
    reply tc = http(port, req, (size_t)n);
    /* Expect: 100-continue, and no body sent: the answer comes without it. */
    n = snprintf(req, sizeof req, "POST " CHAT " HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n"
                                  "Expect: 100-continue\r\nConnection: close\r\n\r\n");
    reply te = http(port, req, (size_t)n);
    fmoe_serve_http_stop(h);
    ASSERT_EQ(te.status, 413);
    free(te.raw);
    ASSERT_EQ(nf.status, 404);
    ASSERT_CONTAINS(nf.body, "\"type\":\"invalid_request_error\"");
    ASSERT_EQ(na.status, 405);
    ASSERT_CONTAINS(na.raw, "Allow:");
    ASSERT_EQ(bu.status, 400);
    ASSERT_CONTAINS(bu.body, "not valid UTF-8 (byte 40)");
    ASSERT_EQ(bj.status, 400);
    ASSERT_CONTAINS(bj.body, "not valid JSON");
    ASSERT_EQ(bn.status, 400);
    ASSERT_CONTAINS(bn.body, "\"param\":\"n\"");
    ASSERT_EQ(tl.status, 413);
    ASSERT_EQ(tc.status, 413);
    free(nf.raw), free(na.raw), free(bu.raw), free(bj.raw), free(bn.raw), free(tl.raw),
        free(tc.raw);
}

TEST(auth) {
    serve_http *h = start("sekret", 0);
    serve_engine e = {.ready = 1};
    fmoe_serve_http_set_engine(h, &e);
    int port = fmoe_serve_http_port(h);
    const char *body = "{\"prompt\":\"x\",\"max_tokens\":4}";
    reply none = post(port, "/v1/completions", body, strlen(body), NULL);
    reply wrong = post(port, "/v1/completions", body, strlen(body), "Authorization: Bearer sekreT\r\n");
    reply longer = post(port, "/v1/completions", body, strlen(body), "Authorization: Bearer sekret1\r\n");
    reply right = post(port, "/v1/completions", body, strlen(body), "Authorization: Bearer sekret\r\n");
    reply models = get(port, "/v1/models", NULL);
    reply health = get(port, "/health", NULL);
    reply metrics_ = get(port, "/metrics", NULL);
    fmoe_serve_http_stop(h);
    ASSERT_EQ(none.status, 401);
    ASSERT_CONTAINS(none.body, "\"code\":\"invalid_api_key\"");
    ASSERT_EQ(wrong.status, 401);
    ASSERT_EQ(longer.status, 401);
    ASSERT_EQ(right.status, 200);
    ASSERT_CONTAINS(right.body, "\"object\":\"text_completion\"");
    ASSERT_EQ(models.status, 401);
    ASSERT_EQ(health.status, 200);
    ASSERT_EQ(metrics_.status, 200);
    free(none.raw), free(wrong.raw), free(longer.raw), free(right.raw), free(models.raw),
        free(health.raw), free(metrics_.raw);
}

TEST(generate_plain_and_streamed) {
    serve_http *h = start(NULL, 0);
    serve_engine e = {.ready = 1};
    fmoe_serve_http_set_engine(h, &e);
    int port = fmoe_serve_http_port(h);
    const char *b1 = "{" MSGS ",\"max_tokens\":50}";
    reply plain = post(port, CHAT, b1, strlen(b1), NULL);
    const char *b2 = "{" MSGS ",\"stream\":true,\"stream_options\":{\"include_usage\":true}}";
    reply sse = post(port, CHAT, b2, strlen(b2), NULL);
    const char *b3 = "{\"prompt\":\"x\",\"stream\":true}";
    reply sse2 = post(port, "/v1/completions", b3, strlen(b3), NULL);
    fmoe_serve_http_stop(h);
    ASSERT_EQ(plain.status, 200);
    ASSERT_CONTAINS(plain.body, "\"object\":\"chat.completion\"");
    ASSERT_CONTAINS(plain.body, "\"content\":\"Hello, \\\"world\\\"!\\n\"");
    ASSERT_CONTAINS(plain.body, "\"finish_reason\":\"stop\"");
    ASSERT_CONTAINS(plain.body, "\"model\":\"fake-model\"");
    ASSERT_EQ(sse.status, 200);
    ASSERT_CONTAINS(sse.raw, "Content-Type: text/event-stream");
    dechunk(sse.body);
    char text[256];
    sse_text(sse.body, "content", text, sizeof text);
    ASSERT_STR_EQ(text, FAKE_TEXT);
    ASSERT_CONTAINS(sse.body, "\"delta\":{\"role\":\"assistant\",\"content\":\"\"}");
    ASSERT_CONTAINS(sse.body, "\"finish_reason\":\"stop\"");
    ASSERT_CONTAINS(sse.body, "\"choices\":[],\"usage\":{\"prompt_tokens\":3");
    ASSERT_TRUE(strlen(sse.body) > 15 &&
                strcmp(sse.body + strlen(sse.body) - 14, "data: [DONE]\n\n") == 0);
    ASSERT_EQ(sse2.status, 200);
    dechunk(sse2.body);
    sse_text(sse2.body, "text", text, sizeof text);
    ASSERT_STR_EQ(text, FAKE_TEXT);
    ASSERT_TRUE(strstr(sse2.body, "\"usage\"") == NULL);
    free(plain.raw), free(sse.raw), free(sse2.raw);
}

TEST(engine_refusals) {
    serve_http *h = start(NULL, 0);
    serve_engine e = {.ready = 1, .submit_status = 503};
    fmoe_serve_http_set_engine(h, &e);
    int port = fmoe_serve_http_port(h);
    const char *b = "{" MSGS "}";
    reply busy = post(port, CHAT, b, strlen(b), NULL);
    e.submit_status = 400;
    reply bad = post(port, CHAT, b, strlen(b), NULL);
    fmoe_serve_http_stop(h);
    ASSERT_EQ(busy.status, 503);
    ASSERT_CONTAINS(busy.raw, "Retry-After: 1");
    ASSERT_CONTAINS(busy.body, "\"type\":\"overloaded_error\"");
    ASSERT_CONTAINS(busy.body, "fake refusal 503");
    ASSERT_EQ(bad.status, 400);
    ASSERT_CONTAINS(bad.body, "fake refusal 400");
    free(busy.raw), free(bad.raw);
}

static int wait_for(atomic_int *v, int want, double timeout_s) {
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (atomic_load(v) != want && since(&t0) < timeout_s) sleep_s(0.01);
    return atomic_load(v) == want;
}

TEST(disconnect_cancels_the_job) {
    serve_http *h = start(NULL, 0);
    serve_engine e = {.ready = 1};
    fmoe_serve_http_set_engine(h, &e);
    int port = fmoe_serve_http_port(h);
    int cancelled0 = atomic_load(&jobs_cancelled);
    /* Streamed: read the headers and the role chunk, then hang up. */
    const char *b = "{" MSGS ",\"max_tokens\":999,\"stream\":true}";
    char req[512];
    int n = snprintf(req, sizeof req, "POST " CHAT " HTTP/1.1\r\nHost: x\r\nContent-Length: "
                                      "%zu\r\n\r\n%s", strlen(b), b);
    int fd = dial(port);
    send_all(fd, req, (size_t)n);
    char buf[4096];
    ssize_t got = recv(fd, buf, sizeof buf - 1, 0);
    close(fd);
    int streamed = wait_for(&jobs_cancelled, cancelled0 + 1, 20.0);
    /* Not streamed: the handler waits; the closed socket is noticed while waiting. */
    const char *b2 = "{" MSGS ",\"max_tokens\":999}";
    n = snprintf(req, sizeof req, "POST " CHAT " HTTP/1.1\r\nHost: x\r\nContent-Length: "
                                  "%zu\r\n\r\n%s", strlen(b2), b2);
    fd = dial(port);
    send_all(fd, req, (size_t)n);
    sleep_s(0.3);
    close(fd);
    int plain = wait_for(&jobs_cancelled, cancelled0 + 2, 5.0);
    int released = wait_for(&jobs_live, 0, 5.0);
    fmoe_serve_http_stop(h);
    ASSERT_TRUE(got > 0);
    ASSERT_TRUE(streamed);
    ASSERT_TRUE(plain);
    ASSERT_TRUE(released);
}

TEST(stop_ends_open_streams_and_quiesce_refuses) {
    serve_http *h = start(NULL, 0);
    serve_engine e = {.ready = 1};
    fmoe_serve_http_set_engine(h, &e);
    int port = fmoe_serve_http_port(h);
    const char *b = "{" MSGS ",\"max_tokens\":999,\"stream\":true}";
    char req[512];
    int n = snprintf(req, sizeof req, "POST " CHAT " HTTP/1.1\r\nHost: x\r\nContent-Length: "
                                      "%zu\r\n\r\n%s", strlen(b), b);
    int fd = dial(port);
    send_all(fd, req, (size_t)n);
    char buf[4096];
    ssize_t got = recv(fd, buf, sizeof buf - 1, 0);
    fmoe_serve_http_quiesce(h);
    fmoe_serve_http_quiesce(h); /* idempotent */
    int refused = dial(port) < 0;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    fmoe_serve_http_stop(h); /* the stream is still open: stop must end it */
    double took = since(&t0);
    close(fd);
    ASSERT_TRUE(got > 0);
    ASSERT_TRUE(refused);
    ASSERT_TRUE(took < 8.0);
    ASSERT_TRUE(wait_for(&jobs_live, 0, 1.0));
}

TEST(port_in_use_is_a_one_line_error) {
    serve_http *a = start(NULL, 0);
    serve_http *b = NULL;
    serve_http_options o = {.host = "127.0.0.1", .port = fmoe_serve_http_port(a), .tokenizer = tok};
    int rc = fmoe_serve_http_start(&o, &b);
    char want[64];
    snprintf(want, sizeof want, "127.0.0.1:%d", fmoe_serve_http_port(a));
    fmoe_serve_http_stop(a);
    ASSERT_EQ(rc, FMOE_EIO);
    ASSERT_TRUE(b == NULL);
    ASSERT_CONTAINS(fmoe_error_detail(), want);
    ASSERT_CONTAINS(fmoe_error_detail(), "in use");
    serve_http_options bad = {.host = "no-such-host.invalid", .port = 0, .tokenizer = tok};
    ASSERT_TRUE(fmoe_serve_http_start(&bad, &b) < 0);
    ASSERT_CONTAINS(fmoe_error_detail(), "no-such-host.invalid:0");
}

TEST(metrics_count_statuses) {
    serve_http *h = start(NULL, 0);
    serve_engine e = {.ready = 1};
    fmoe_serve_http_set_engine(h, &e);
    int port = fmoe_serve_http_port(h);
    free(get(port, "/nope", NULL).raw);
    reply m = get(port, "/metrics", NULL);
    fmoe_serve_http_stop(h);
    ASSERT_EQ(m.status, 200);
    ASSERT_CONTAINS(m.raw, "Content-Type: text/plain; version=0.0.4");
    ASSERT_CONTAINS(m.body, "fmoe_http_requests_total{code=\"404\"}");
    ASSERT_CONTAINS(m.body, "fmoe_expert_cache_hits_total{layer=\"2\"} 20\n");
    ASSERT_CONTAINS(m.body, "fmoe_model_info{model=\"fake-model\"} 1\n");
    ASSERT_CONTAINS(m.body, "fmoe_requests_running 1\n");
    free(m.raw);
}

/* fmoe-tiny's tokenizer with Qwen3's chat template (tests/fixtures/chat_templates), which
 * offers tools and writes <tool_call> and <think>: in a fresh folder beside the build. */
static fmoe_tokenizer *qwen3_tokenizer(void) {
    const char *root = getenv("FMOE_SOURCE_ROOT");
    root = root ? root : ".";
    char dir[] = "/tmp/fmoe-http-qwen3-XXXXXX", path[4096], src[4096];
    if (!mkdtemp(dir)) abort();
    snprintf(src, sizeof src, "%s/datasets/fmoe-tiny/tokenizer.json", root);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (symlink(src, path) != 0) abort();
    snprintf(src, sizeof src, "%s/tests/fixtures/chat_templates/Qwen-Qwen3-0.6B.jinja", root);
    FILE *f = fopen(src, "rb");
    if (!f) abort();
    static char tmpl[1 << 16];
    tmpl[fread(tmpl, 1, sizeof tmpl - 1, f)] = '\0';
    fclose(f);
    snprintf(src, sizeof src, "%s/datasets/fmoe-tiny/tokenizer_config.json", root);
    f = fopen(src, "rb");
    static char cfg_text[1 << 16];
    cfg_text[f ? fread(cfg_text, 1, sizeof cfg_text - 1, f) : 0] = '\0';
    if (f) fclose(f);
    cJSON *cfg = cJSON_Parse(cfg_text);
    cJSON_ReplaceItemInObjectCaseSensitive(cfg, "chat_template", cJSON_CreateString(tmpl));
    char *out = cJSON_PrintUnformatted(cfg);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    f = fopen(path, "wb");
    fputs(out, f);
    fclose(f);
    cJSON_free(out);
    cJSON_Delete(cfg);
    fmoe_tokenizer *t = NULL;
    if (fmoe_tokenizer_load(dir, &t) < 0) abort();
    unlink(path);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    unlink(path);
    rmdir(dir);
    return t;
}

static const char *jstr(const cJSON *o, const char *name) {
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsString(s) ? s->valuestring : NULL;
}

/* A model's tool call, streamed and whole, through the HTTP layer: the stream's deltas
 * (the first of a call with id, type and name, then argument pieces) put together equal
 * the whole response's message, and the markup is in neither's content. */
TEST(tool_call_streamed_and_whole) {
    fmoe_tokenizer *qt = qwen3_tokenizer();
    if (!metrics) metrics = fmoe_serve_metrics_new();
    serve_http *h = NULL;
    serve_http_options o = {.port = 0, .tokenizer = qt, .metrics = metrics};
    ASSERT_OK(fmoe_serve_http_start(&o, &h));
    serve_engine e = {.ready = 1};
    fmoe_serve_http_set_engine(h, &e);
    const int port = fmoe_serve_http_port(h);
    const char *tools = ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
                        "\"get_weather\",\"parameters\":{\"type\":\"object\"}}}]";
    char b1[512], b2[512];
    snprintf(b1, sizeof b1, "{" MSGS "%s}", tools);
    snprintf(b2, sizeof b2, "{" MSGS "%s,\"stream\":true}", tools);
    reply whole = post(port, CHAT, b1, strlen(b1), NULL);
    reply sse = post(port, CHAT, b2, strlen(b2), NULL);
    fmoe_serve_http_stop(h);
    fmoe_tokenizer_free(qt);

    ASSERT_EQ(whole.status, 200);
    cJSON *w = cJSON_Parse(whole.body);
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(w, "choices"), 0);
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(c, "message");
    ASSERT_STR_EQ(jstr(c, "finish_reason"), "tool_calls");
    ASSERT_STR_EQ(jstr(msg, "content"), "\n\nLet me look.\n");
    ASSERT_STR_EQ(jstr(msg, "reasoning_content"), "\nweather\n");
    const cJSON *call = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(msg, "tool_calls"), 0);
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
    ASSERT_STR_EQ(jstr(fn, "name"), "get_weather");
    ASSERT_STR_EQ(jstr(fn, "arguments"), "{\"city\": \"Paris\"}");
    ASSERT_TRUE(jstr(call, "id") && strncmp(jstr(call, "id"), "call_", 5) == 0);

    ASSERT_EQ(sse.status, 200);
    dechunk(sse.body);
    char content[256] = "", reasoning[256] = "", args[256] = "", name[64] = "";
    int firsts = 0, events = 0;
    const char *finish = NULL;
    static char finish_buf[32];
    for (char *p = strstr(sse.body, "data: {"); p; p = strstr(p + 1, "data: {")) {
        char *end = strstr(p, "\n\n");
        if (!end) break;
        *end = '\0';
        cJSON *ev = cJSON_Parse(p + 6);
        *end = '\n';
        ASSERT_TRUE(ev != NULL);
        events++;
        const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(ev, "choices"), 0);
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(ch, "delta");
        if (jstr(ch, "finish_reason")) {
            snprintf(finish_buf, sizeof finish_buf, "%s", jstr(ch, "finish_reason"));
            finish = finish_buf;
        }
        if (jstr(d, "content")) strncat(content, jstr(d, "content"), 255 - strlen(content));
        if (jstr(d, "reasoning_content"))
            strncat(reasoning, jstr(d, "reasoning_content"), 255 - strlen(reasoning));
        const cJSON *tc;
        cJSON_ArrayForEach(tc, cJSON_GetObjectItemCaseSensitive(d, "tool_calls")) {
            const cJSON *f = cJSON_GetObjectItemCaseSensitive(tc, "function");
            ASSERT_EQ(cJSON_GetObjectItemCaseSensitive(tc, "index")->valuedouble, 0);
            if (jstr(f, "name")) { /* the first delta of the call: id, type, name */
                firsts++;
                ASSERT_TRUE(jstr(tc, "id") != NULL);
                ASSERT_STR_EQ(jstr(tc, "type"), "function");
                snprintf(name, sizeof name, "%s", jstr(f, "name"));
            } else {
                ASSERT_TRUE(jstr(tc, "id") == NULL);
            }
            if (jstr(f, "arguments")) strncat(args, jstr(f, "arguments"), 255 - strlen(args));
        }
        cJSON_Delete(ev);
    }
    ASSERT_EQ(firsts, 1);
    ASSERT_TRUE(events >= 3); /* the role, the text (in as many pieces as the waits saw), the end */
    ASSERT_STR_EQ(content, jstr(msg, "content"));
    ASSERT_STR_EQ(reasoning, jstr(msg, "reasoning_content"));
    ASSERT_STR_EQ(name, "get_weather");
    ASSERT_STR_EQ(args, jstr(fn, "arguments"));
    ASSERT_STR_EQ(finish, "tool_calls");
    ASSERT_TRUE(strstr(sse.body, "tool_call>") == NULL && strstr(sse.body, "think>") == NULL);
    cJSON_Delete(w);
    free(whole.raw), free(sse.raw);
}

int main(int argc, char **argv) {
    int rc = RUN_TESTS(argc, argv);
    fmoe_tokenizer_free(tok);
    fmoe_serve_metrics_free(metrics);
    return rc;
}
