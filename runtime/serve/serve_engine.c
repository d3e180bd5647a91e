/*
 * serve_engine.c - requests in, text out: the queue, the scheduler thread with continuous
 * batching, sampling, incremental detokenisation with stop strings, and per-request
 * figures (serve_engine.h).
 *
 * One scheduler iteration:
 *   admit waiting jobs into free sequence slots (FIFO), drop cancelled ones
 *   items = every decoding sequence's next token, then prompt chunks of prefilling
 *           sequences (oldest first) up to the iteration's token budget (batch_tokens,
 *           fmoe serve --batch-tokens)
 *   one batched forward (fmoe_offload_forward_batch, or fmoe_session_forward_batch when
 *           every expert is resident): each chosen expert is loaded and run once per layer
 *           for the whole batch
 *   per item with logits: (structured output) mask the tokens the JSON schema refuses,
 *           sample, the token's logprobs when the request asked for them
 *           (serve_logprobs.h: of the raw logits), append, detokenise, check EOS / stop
 *           strings / limits
 *   finished and cancelled sequences leave; their slots are free for the next admission
 *
 * Sequence slot 0's session is the runner of every batched call: it was made with the
 * executor's hooks and an activation budget of batch_tokens; the other slots' sessions hold only
 * a KV cache (max_batch 1).
 *
 * Text. After each token the whole generated sequence is decoded again (skipping special
 * tokens), as transformers' TextStreamer does, so the text is exactly decode(ids); a
 * trailing U+FFFD of an incomplete UTF-8 sequence and a tail that could still become a
 * stop string are held back from readers until they are resolved.
 */
#include "serve_engine.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fmoe/error.h"
#include "fmoe/log.h"
#include "fmoe/safetensors.h"
#include "fmoe/sampler.h"
#include "fmoe/slots.h" /* FMOE_BATCH_TOKENS */
#include "serve_metrics.h"
#include "serve_prefix.h"
#include "serve_text.h"
#include "trace_queue.h"
#include "monotonic.h"

/* ---------------------------------------------------------------------------------- */
/* Jobs                                                                               */
/* ---------------------------------------------------------------------------------- */

struct serve_job {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    atomic_int cancel;
    /* the request (immutable after submit) */
    int32_t *prompt;
    int32_t prompt_tokens;
    serve_sampling sampling;   /* stop points into stop_copy */
    char **stop_copy;
    /* produced (under mu) */
    char *text;                /* decode(generated), NUL-terminated */
    size_t text_len;
    size_t visible;            /* bytes readers may see */
    serve_job_status st;
    serve_token_logprob *lp;   /* [lp_len] of the generated tokens (sampling.logprobs) */
    int32_t lp_len, lp_cap;
    /* times (monotonic seconds; scheduler thread only until finished) */
    double t_submit, t_start, t_first, t_last;
    serve_job *next;           /* the engine's waiting queue */
    void (*notify)(void *);    /* called with mu held on news (fmoe_serve_job_set_notify) */
    void *notify_arg;
};

const char *fmoe_serve_finish_name(int32_t finish) {
    switch (finish) {
    case SERVE_FINISH_STOP: return "stop";
    case SERVE_FINISH_LENGTH: return "length";
    case SERVE_FINISH_CANCELLED: return "cancelled";
    case SERVE_FINISH_ERROR: return "error";
    default: return NULL;
    }
}

/* The CLOCK_REALTIME time `seconds` from now, for pthread_cond_timedwait. */
static struct timespec deadline_after(double seconds) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    const double secs = seconds > 0 ? seconds : 0;
    t.tv_sec += (time_t)secs;
    t.tv_nsec += (long)((secs - (double)(time_t)secs) * 1e9);
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}

static void job_free(serve_job *j) {
    fmoe_json_schema_free(j->sampling.json);
    for (int32_t i = 0; i < j->sampling.num_stop; i++) free(j->stop_copy[i]);
    free(j->stop_copy);
    free(j->prompt);
    free(j->text);
    free(j->lp);
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

void fmoe_serve_job_release(serve_job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    const int last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (last) job_free(j);
}

void fmoe_serve_job_set_notify(serve_job *j, void (*fn)(void *), void *arg) {
    pthread_mutex_lock(&j->mu); /* a call in progress holds it: none runs after this */
    j->notify = fn;
    j->notify_arg = arg;
    pthread_mutex_unlock(&j->mu);
}

void fmoe_serve_job_cancel(serve_job *j) {
    if (j) atomic_store(&j->cancel, 1);
}

int fmoe_serve_job_wait(serve_job *j, size_t have, double timeout_s, char **text, size_t *len,
                   serve_job_status *st) {
    const struct timespec until = deadline_after(timeout_s);
    pthread_mutex_lock(&j->mu);
    int rc = 0;
    while (j->visible <= have && j->st.finished == SERVE_RUNNING && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&j->cv, &j->mu, &until);
    const int news = j->visible > have || j->st.finished != SERVE_RUNNING;
    *len = j->visible;
    *text = NULL;
    if (j->visible > 0) {
        *text = malloc(j->visible + 1);
        if (*text) {
            memcpy(*text, j->text, j->visible);
            (*text)[j->visible] = 0;
        } else {
            *len = 0;
        }
    }
    *st = j->st;
    pthread_mutex_unlock(&j->mu);
    return news;
}

int fmoe_serve_job_logprobs(serve_job *j, int32_t from, serve_token_logprob **out, int32_t *n) {
    *out = NULL;
    *n = 0;
    pthread_mutex_lock(&j->mu);
    const int32_t f = from < 0 ? 0 : from;
    const int32_t k = j->lp_len > f ? j->lp_len - f : 0;
    int rc = 0;
    if (k > 0) {
        *out = malloc((size_t)k * sizeof **out);
        if (*out) {
            memcpy(*out, j->lp + f, (size_t)k * sizeof **out);
            *n = k;
        } else {
            rc = fmoe_error_set(FMOE_ENOMEM, "out of memory");
        }
    }
    pthread_mutex_unlock(&j->mu);
    return rc;
}

/* ---------------------------------------------------------------------------------- */
/* Engine                                                                             */
/* ---------------------------------------------------------------------------------- */

/* A sequence slot: free, running its prompt, decoding, or done (it leaves at the end of
 * the iteration; `finish` says how its job ends once it is in the trace). */
enum { SEQ_FREE = 0, SEQ_PREFILL = 1, SEQ_DECODE = 2, SEQ_DONE = 3 };

typedef struct seq {
    int state;
    serve_job *job;
    fmoe_session *session;
    fmoe_sampler *sampler;
    /* structured output (sampling.json): the request's matcher, NULL without one; the
     * mask and the masked logits, allocated by the first such request in this slot */
    fmoe_json_matcher *json;
    uint8_t *allowed;          /* [max(V, tokenizer vocabulary)] */
    float *masked;             /* [V] */
    int32_t fed;               /* prompt tokens already run */
    int32_t *generated;        /* [max_context] */
    int32_t num_generated;
    int32_t next;              /* the token to run next (decode) */
    int32_t decoded;           /* decode tokens run */
    /* Routing rows of the item being run (for attributing the iteration's accesses to
     * its job): [rows_cap][L][K]. With trace_out, rows of the whole request (prompt, then
     * decode tokens) and its probabilities, semantic rows, token ids and phases. */
    int64_t rows_cap;
    uint16_t *experts;
    float *probs;              /* [rows_cap][L][J] (trace_out) */
    float *semantic;           /* [rows_cap][h] (trace_out) */
    float *speculative;        /* [rows_cap][L][S][J] (trace_out with trace_speculative S) */
    int32_t *token_id;         /* [rows_cap] (trace_out) */
    uint8_t *phase;            /* [rows_cap] (trace_out) */
    int64_t *served_iteration; /* [rows_cap] the pass each row ran in (trace_out) */
    float *served_s;           /* [rows_cap] that pass's wall seconds (trace_out) */
    int64_t row0;              /* the first row of the item being run */
    float *logits;             /* [V] */
    int64_t order;             /* admission order: prefill goes oldest first */
    int32_t finish;            /* SEQ_DONE: the job's serve_finish, or 0 when already told */
    int begun;                 /* the executor was told the request started */
    /* Prefix reuse: the tokens whose keys and values the free slot's session holds, from
     * the request that last ran in it ([max_context]; num_cached 0: nothing kept), and
     * when it left (admissions: the least recently used slot goes first when none shares
     * a prefix). */
    int32_t *cached;
    int32_t num_cached;
    int64_t left_at;
} seq;

struct serve_engine {
    serve_engine_options o;
    const fmoe_model_geometry *geo;
    int32_t V, L, J, K;
    int32_t eos;               /* the tokenizer's EOS, or -1 */
    int32_t *stop_ids;         /* o.stop_ids and the chat format's own ends (harmony_stops);
                                  o.stop_ids points here */
    /* the token trie of structured output, built by the first request that asks for it
     * (scheduler thread only), shared by all */
    fmoe_json_vocab *json_vocab;
    const int64_t *layer_bytes; /* [L] one routed expert's weights, per MoE layer */
    seq *seqs;                 /* [parallel] */
    fmoe_batch_item *items;    /* [parallel] */
    fmoe_forward_trace *traces;/* [parallel] */
    int32_t *item_seq;         /* [parallel] seq index of each item */
    int32_t *by_age;           /* [parallel] running sequences, oldest admitted first */
    int32_t *age;              /* [parallel] plan_items' scratch */
    int32_t num_by_age;
    uint8_t *touched;          /* [parallel][L·J] */
    int64_t created;
    double t0;                 /* monotonic seconds at start: trace arrival times */
    int64_t admitted;
    int64_t passes;            /* batched forward passes run */
    serve_trace_queue *tq;     /* trace_out's writer thread, or NULL */
    /* The trace or the decision log could not be written (a full disk): set once, by the
     * trace queue's thread or the engine's (output_failed), after trace_error and
     * failed_output; from then on no request is answered that they lack. */
    atomic_int trace_failed;
    atomic_int fail_claimed;   /* output_failed's: the first failure writes the two below */
    char trace_error[384];
    const char *failed_output; /* "trace (--trace-out)" or "decision log (--decision-log)" */

    pthread_mutex_t mu;        /* the queue, the flags below, the gauges */
    pthread_cond_t cv;
    pthread_t thread;
    int thread_started;
    serve_job *q_head, *q_tail;
    int32_t waiting, running;
    int accepting;
    int draining;
    double drain_deadline;
    uint64_t seed_counter;
    int reuse_prefix;          /* o.prefix_cache, and the model and options allow it */
    int copy_prefix;           /* reuse_prefix and rows may be copied between sessions (the
                                  CPU backend: fmoe_session_copy_prefix) */
    serve_prefix_pool *pool;   /* o.prefix_cache_bytes' kept caches, or NULL */
    int64_t cleared;           /* sequences that left: seq.left_at's clock */
};

static void job_finish_status(serve_engine *e, serve_job *j, int32_t finish, const char *error,
                              int32_t http_status) {
    const double t = fmoe__now_s();
    pthread_mutex_lock(&j->mu);
    if (j->st.finished == SERVE_RUNNING) {
        j->st.finished = finish;
        j->st.http_status = http_status;
        if (error) snprintf(j->st.error, sizeof j->st.error, "%s", error);
        if (finish != SERVE_FINISH_ERROR) j->visible = j->text_len;
        /* Counted before the waiter wakes: a client that reads /metrics after its answer
         * must find its request there (the metrics lock is a leaf; nothing holds it while
         * taking a job's). Once per job: a second finish changes nothing. */
        if (e->o.metrics) {
            fmoe_serve_metrics_observe_e2e(e->o.metrics, t - j->t_submit);
            fmoe_serve_metrics_request_done(e->o.metrics, finish);
        }
    }
    pthread_cond_broadcast(&j->cv);
    if (j->notify) j->notify(j->notify_arg);
    pthread_mutex_unlock(&j->mu);
}

static void job_finish(serve_engine *e, serve_job *j, int32_t finish, const char *error) {
    job_finish_status(e, j, finish, error, 0);
}

/* Keeps what the finished sequence's session holds for a later prompt that starts the same
 * way: prompt[0..fed) and the generated tokens run after it, when that is exactly what its
 * cache holds (a failed pass or a cut prefill may leave it otherwise: then nothing). */
static void seq_keep_cache(serve_engine *e, seq *s) {
    s->num_cached = 0;
    if (!e->reuse_prefix || !s->job || s->finish == SERVE_FINISH_ERROR) return;
    const int32_t n = s->fed + s->decoded;
    if (n != fmoe_session_position(s->session) || n > e->o.max_context ||
        s->decoded > s->num_generated)
        return;
    memcpy(s->cached, s->job->prompt, (size_t)s->fed * sizeof *s->cached);
    memcpy(s->cached + s->fed, s->generated, (size_t)s->decoded * sizeof *s->cached);
    s->num_cached = n;
}

static void seq_clear(serve_engine *e, seq *s) {
    seq_keep_cache(e, s);
    s->left_at = ++e->cleared;
    if (s->job) {
        if (e->o.offload && s->begun) fmoe_offload_request_end(e->o.offload);
        fmoe_serve_job_release(s->job);
    }
    s->begun = 0;
    s->job = NULL;
    fmoe_sampler_free(s->sampler);
    s->sampler = NULL;
    fmoe_json_matcher_free(s->json);
    s->json = NULL;
    s->state = SEQ_FREE;
    s->fed = 0;
    s->num_generated = 0;
    if (!s->num_cached) fmoe_session_reset(s->session);
}

/* The prompt tokens a free slot's kept cache can spare job j: its common prefix with the
 * prompt, less one (the last prompt token always runs: its logits give the first token). */
static int32_t reusable(const seq *s, const serve_job *j) {
    return fmoe_serve_common_prefix(s->cached, s->num_cached, j->prompt, j->prompt_tokens - 1);
}

/* The free slot for job j. Taking a slot spares the prompt the tokens it shares with the
 * slot's kept cache and forgets the rest of that cache, which the request it came from
 * (the same chat's next turn) may still ask for. So a slot is worth what it spares less
 * half of what it forgets: the next turn of a chat goes back to its own slot (it spares
 * everything and forgets a few generated tokens at most), and a new chat that shares a
 * three-token role header with every cache does not take another chat's slot while one
 * is empty or older. When no slot is worth more than nothing, the least recently left
 * (empty slots first), with what it spares. Without prefix reuse, the first free slot.
 * -1: none free. */
static int32_t pick_slot(const serve_engine *e, const serve_job *j, int32_t *keep) {
    int32_t best = -1, lru = -1, best_keep = 0;
    double best_worth = 0;
    *keep = 0;
    for (int32_t i = 0; i < e->o.parallel; i++) {
        const seq *s = &e->seqs[i];
        if (s->state != SEQ_FREE) continue;
        if (!e->reuse_prefix) return i;
        if (lru < 0 || s->left_at < e->seqs[lru].left_at) lru = i;
        const int32_t k = reusable(s, j);
        const double worth = k - 0.5 * (s->num_cached - k);
        if (worth > best_worth) {
            best = i;
            best_worth = worth;
            best_keep = k;
        }
    }
    if (best < 0 && lru >= 0) {
        best = lru;
        best_keep = reusable(&e->seqs[lru], j);
    }
    *keep = best_keep;
    return best;
}

/* Grows sequence s's routing rows to hold `rows` tokens. @return 0 or FMOE_ENOMEM. */
static int seq_reserve(serve_engine *e, seq *s, int64_t rows) {
    if (rows <= s->rows_cap) return 0;
    const size_t L = (size_t)e->L, J = (size_t)e->J, K = (size_t)e->K;
    const size_t h = (size_t)e->geo->hidden_size, n = (size_t)rows;
    uint16_t *ex = realloc(s->experts, n * L * K * sizeof *ex);
    if (ex) s->experts = ex;
    int ok = ex != NULL;
    if (ok && e->o.trace_out) {
        float *p = realloc(s->probs, n * L * J * sizeof *p);
        if (p) s->probs = p;
        float *sm = realloc(s->semantic, n * h * sizeof *sm);
        if (sm) s->semantic = sm;
        int32_t *ti = realloc(s->token_id, n * sizeof *ti);
        if (ti) s->token_id = ti;
        uint8_t *ph = realloc(s->phase, n);
        if (ph) s->phase = ph;
        int64_t *si = realloc(s->served_iteration, n * sizeof *si);
        if (si) s->served_iteration = si;
        float *ss = realloc(s->served_s, n * sizeof *ss);
        if (ss) s->served_s = ss;
        ok = p && sm && ti && ph && si && ss;
        const size_t S = (size_t)e->o.trace_speculative;
        if (ok && S > 0) {
            float *sp = realloc(s->speculative, n * L * S * J * sizeof *sp);
            if (sp) s->speculative = sp;
            ok = sp != NULL;
        }
    }
    if (!ok) return fmoe_error_set(FMOE_ENOMEM, "out of memory for the routing of %lld tokens",
                                   (long long)rows);
    s->rows_cap = rows;
    return 0;
}

/* A request handed to the trace queue: its job, told `finish` once the request is in the
 * file (0: told already). */
typedef struct traced {
    serve_engine *e;
    serve_job *job;
    int32_t finish;
} traced;

/* The first output that cannot be written turns the server degraded: its reason is kept
 * (for /health and the refusals) and logged at once. Either thread may call it; the first
 * call wins. */
static void output_failed(serve_engine *e, const char *what, const char *short_what) {
    int no = 0;
    if (!atomic_compare_exchange_strong(&e->fail_claimed, &no, 1)) return;
    snprintf(e->trace_error, sizeof e->trace_error, "%s", fmoe_error_detail());
    e->failed_output = what;
    atomic_store(&e->trace_failed, 1);
    fmoe_log(FMOE_LOG_ERROR,
             "serve: the %s cannot be written (%s): requests now fail (507, 503) "
             "and /health says degraded; the requests %s before are kept",
             short_what, e->trace_error,
             strcmp(short_what, "trace") == 0 ? "journalled" : "logged");
}

/* The trace queue's report (its thread): the request is written, and its client may hear
 * that it finished; or it could not be written, and the request fails with 507, because
 * a request is answered only once it is in the trace (docs/serving.md). The first failure
 * is logged at once and turns the server degraded (/health 503, new requests refused with
 * 503): the writer accepts nothing after a failed append (fmoe/trace.h). */
static void on_traced(void *ctx, void *tag, int rc) {
    (void)ctx;
    traced *t = tag;
    serve_engine *e = t->e;
    if (rc < 0) {
        output_failed(e, "trace (--trace-out)", "trace");
        if (e->o.metrics) fmoe_serve_metrics_trace_failure(e->o.metrics);
        if (t->finish) {
            char msg[sizeof ((serve_job_status *)0)->error];
            snprintf(msg, sizeof msg, "the request could not be recorded in the %s: %.190s",
                     e->failed_output, e->trace_error);
            job_finish_status(e, t->job, SERVE_FINISH_ERROR, msg, 507);
        }
    } else if (t->finish) {
        job_finish(e, t->job, t->finish, NULL);
    }
    fmoe_serve_job_release(t->job);
    free(t);
}

/* Hands sequence s's request to the trace queue when it ran its whole prompt and did not
 * fail: the rows run (prompt, then each decode token fed back), its arrays with it (the
 * sequence gets new ones at its next admission). The queue tells the job `finish` after
 * the write. @return 1 when handed over; 0 when not (the caller tells the job). */
static int seq_record(serve_engine *e, seq *s, int32_t finish) {
    serve_job *j = s->job;
    if (!e->tq || !j || j->st.finished == SERVE_FINISH_ERROR || s->fed < j->prompt_tokens)
        return 0;
    traced *t = malloc(sizeof *t);
    if (!t) return 0;
    *t = (traced){.e = e, .job = j, .finish = finish};
    pthread_mutex_lock(&j->mu); /* the queue's reference, before it can release it */
    j->refs++;
    pthread_mutex_unlock(&j->mu);
    const fmoe_trace_request q = {
        .id = s->order, .arrival_s = j->t_submit - e->t0, .prompt_tokens = j->prompt_tokens,
        .output_tokens = s->decoded, .token_id = s->token_id, .phase = s->phase,
        .experts = s->experts, .probs = s->probs, .semantic = s->semantic,
        .speculative = e->o.trace_speculative > 0 ? s->speculative : NULL,
        .served_iteration = s->served_iteration, .served_s = s->served_s};
    if (fmoe_serve_trace_queue_push(e->tq, &q, t) < 0) {
        fmoe_serve_job_release(j);
        free(t);
        return 0;
    }
    s->token_id = NULL; /* the queue's now */
    s->phase = NULL;
    s->experts = NULL;
    s->probs = NULL;
    s->semantic = NULL;
    s->speculative = NULL;
    s->served_iteration = NULL;
    s->served_s = NULL;
    s->rows_cap = 0;
    return 1;
}

/* Structured output for slot s: the shared trie (built once), the slot's mask buffers
 * (once), a matcher for the request. @return 0 or a negative FMOE_E* (detail set). */
/* gpt-oss's harmony format ends an answer with <|return|> and a tool call with <|call|>
 * (<|end|> only ends one message of several): both end generation even when the
 * generation config does not list them (a converted GGUF, a test tokenizer). */
static int harmony_stops(serve_engine *e) {
    const char *tmpl = fmoe_tokenizer_chat_template_text(e->o.tokenizer, 1);
    if (!tmpl || !strstr(tmpl, "<|channel|>") || !strstr(tmpl, "<|message|>")) return 0;
    e->stop_ids = malloc(((size_t)e->o.num_stop_ids + 2) * sizeof *e->stop_ids);
    if (!e->stop_ids) return FMOE_ENOMEM;
    int32_t n = 0;
    for (int32_t i = 0; i < e->o.num_stop_ids; i++) e->stop_ids[n++] = e->o.stop_ids[i];
    static const char *const ends[] = {"<|return|>", "<|call|>"};
    for (int k = 0; k < 2; k++) {
        const int32_t id = fmoe_tokenizer_token_to_id(e->o.tokenizer, ends[k]);
        if (id >= 0) e->stop_ids[n++] = id;
    }
    e->o.stop_ids = e->stop_ids;
    e->o.num_stop_ids = n;
    return 0;
}

static int seq_json_begin(serve_engine *e, seq *s, const fmoe_json_schema *schema) {
    if (!e->json_vocab) {
        int32_t ends[65];
        int32_t n = 0;
        if (e->eos >= 0) ends[n++] = e->eos;
        for (int32_t i = 0; i < e->o.num_stop_ids && n < 65; i++) ends[n++] = e->o.stop_ids[i];
        FMOE_FORWARD_IF_ERROR(fmoe_json_vocab_init(e->o.tokenizer, ends, n, &e->json_vocab));
    }
    if (!s->allowed) {
        const int32_t vt = fmoe_json_vocab_size(e->json_vocab);
        s->allowed = calloc((size_t)(vt > e->V ? vt : e->V), 1);
        s->masked = malloc((size_t)e->V * sizeof *s->masked);
        if (!s->allowed || !s->masked)
            return fmoe_error_set(FMOE_ENOMEM, "out of memory for the JSON mask");
    }
    return fmoe_json_matcher_init(schema, e->json_vocab, &s->json);
}

/* Under e->mu: moves waiting jobs into free slots; cancelled waiting jobs finish. */
/* Readies slot s's session for job j, which its own cache spares `keep` tokens: a running
 * sequence's prompt rows or a kept cache beyond the slots (e->pool) that spare more are
 * copied in instead; the slot's own cache, about to be forgotten past what j shares with
 * it, is first saved in the pool. @return the prompt tokens the session holds for j. */
static int32_t take_cache(serve_engine *e, seq *s, const serve_job *j, int32_t keep) {
    if (!e->reuse_prefix) {
        fmoe_session_reset(s->session);
        return 0;
    }
    int32_t pool_keep = 0;
    const int32_t from = e->pool ? fmoe_serve_prefix_pool_best(e->pool, j->prompt,
                                                               j->prompt_tokens, &pool_keep)
                                 : -1;
    if (e->pool && s->num_cached > keep &&
        fmoe_serve_prefix_pool_save(e->pool, s->session, s->cached, s->num_cached,
                                    pool_keep > keep ? from : -1) < 0)
        fmoe_log(FMOE_LOG_WARN, "prefix cache: could not keep a finished request's cache: %s",
                      fmoe_error_detail());
    /* a running sequence whose prompt, as far as it has run, starts the same way (two
     * concurrent chats with one system prompt): its rows are final, copied between
     * passes; host memory only (fmoe_session_copy_prefix) */
    int32_t run_keep = 0;
    const seq *run = NULL;
    for (int32_t i = 0; e->copy_prefix && i < e->o.parallel; i++) {
        const seq *r = &e->seqs[i];
        if (r == s || (r->state != SEQ_PREFILL && r->state != SEQ_DECODE)) continue;
        const int32_t k = fmoe_serve_common_prefix(r->job->prompt, r->fed, j->prompt,
                                                   j->prompt_tokens - 1);
        if (k > run_keep) {
            run_keep = k;
            run = r;
        }
    }
    if (run && run_keep > keep && run_keep > pool_keep &&
        fmoe_session_copy_prefix(s->session, run->session, run_keep) == 0)
        return run_keep;
    if (from >= 0 && pool_keep > keep &&
        fmoe_serve_prefix_pool_load(e->pool, from, s->session, pool_keep) == 0)
        return pool_keep;
    /* the slot's own cache: its shared prefix stays, the rest is forgotten */
    if (keep > 0 && fmoe_session_keep_prefix(s->session, keep) < 0) keep = 0;
    if (keep == 0) fmoe_session_reset(s->session);
    return keep;
}

/* 1 when a running sequence is still prefilling the very prompt of job j (the choices
 * of one request with n > 1 arrive together): j then waits at the head of the queue until
 * that prefill is done and copies its rows (take_cache), rather than running the same
 * prompt again beside it. CPU backend (the copy's). */
static int same_prompt_running(const serve_engine *e, const serve_job *j) {
    if (!e->copy_prefix || j->prompt_tokens < 2) return 0;
    for (int32_t i = 0; i < e->o.parallel; i++) {
        const seq *r = &e->seqs[i];
        if (r->state == SEQ_PREFILL && r->job->prompt_tokens == j->prompt_tokens &&
            !atomic_load(&r->job->cancel) &&
            memcmp(r->job->prompt, j->prompt, (size_t)j->prompt_tokens * sizeof *j->prompt) == 0)
            return 1;
    }
    return 0;
}

static void admit(serve_engine *e) {
    while (e->q_head && e->running < e->o.parallel) {
        serve_job *j = NULL;
        while (e->q_head && !j) {
            j = e->q_head;
            e->q_head = j->next;
            if (!e->q_head) e->q_tail = NULL;
            e->waiting--;
            if (atomic_load(&j->cancel)) {
                job_finish(e, j, SERVE_FINISH_CANCELLED, NULL);
                fmoe_serve_job_release(j);
                j = NULL;
            }
        }
        if (!j) break;
        int32_t keep = 0;
        const int32_t i = same_prompt_running(e, j) ? -1 : pick_slot(e, j, &keep);
        if (i < 0) { /* back to the head: it waits for that prefill (or, not reached, a slot) */
            j->next = e->q_head;
            e->q_head = j;
            if (!e->q_tail) e->q_tail = j;
            e->waiting++;
            break;
        }
        seq *s = &e->seqs[i];
        const fmoe_sampler_params sp = {
            .temperature = j->sampling.temperature, .top_k = j->sampling.top_k,
            .top_p = j->sampling.top_p,
            .seed = j->sampling.has_seed ? j->sampling.seed : 0x5eed0000ULL + e->seed_counter++};
        const int64_t rows = e->o.trace_out ? (int64_t)j->prompt_tokens + j->sampling.max_tokens
                                            : e->o.batch_tokens;
        if (seq_reserve(e, s, rows) < 0 || fmoe_sampler_init(&sp, e->V, &s->sampler) < 0 ||
            (j->sampling.json && seq_json_begin(e, s, j->sampling.json) < 0)) {
            fmoe_sampler_free(s->sampler);
            s->sampler = NULL;
            job_finish(e, j, SERVE_FINISH_ERROR, fmoe_error_detail());
            fmoe_serve_job_release(j);
            continue; /* the slot is still free */
        }
        keep = take_cache(e, s, j, keep);
        s->num_cached = 0;
        s->job = j;
        s->state = SEQ_PREFILL;
        s->finish = 0;
        s->fed = keep;
        s->decoded = 0;
        s->num_generated = 0;
        if (e->o.trace_out) {
            memcpy(s->token_id, j->prompt, (size_t)j->prompt_tokens * sizeof *s->token_id);
            memset(s->phase, FMOE_PHASE_PREFILL, (size_t)j->prompt_tokens);
        }
        s->order = e->admitted++;
        e->running++;
        j->t_start = fmoe__now_s();
        pthread_mutex_lock(&j->mu);
        j->st.cached_tokens = keep;
        j->st.queue_ms = 1e3 * (j->t_start - j->t_submit);
        pthread_mutex_unlock(&j->mu);
        if (e->o.metrics) {
            fmoe_serve_metrics_observe_queue(e->o.metrics, j->t_start - j->t_submit);
            fmoe_serve_metrics_add_cached_tokens(e->o.metrics, keep);
        }
    }
}

static int is_stop_token(const serve_engine *e, int32_t id) {
    if (id == e->eos) return 1;
    for (int32_t i = 0; i < e->o.num_stop_ids; i++)
        if (e->o.stop_ids[i] == id) return 1;
    return 0;
}

/* Takes the sampled token of sequence s: appends and decodes it. @return 1 when a stop
 * token, a stop string, max_tokens or the context ends the job (s->finish says how; the
 * job is told when the sequence leaves, after it is in the trace), or on an error (the job
 * is told at once and s->finish is 0). */
static int take_token(serve_engine *e, seq *s, int32_t tok, serve_token_logprob *lp) {
    serve_job *j = s->job;
    const double t = fmoe__now_s();
    if (e->o.metrics) {
        if (s->num_generated == 0)
            fmoe_serve_metrics_observe_ttft(e->o.metrics, t - j->t_submit);
        else
            fmoe_serve_metrics_observe_itl(e->o.metrics, t - j->t_last);
    }
    if (s->num_generated == 0) j->t_first = t;
    j->t_last = t;
    /* a document's end token ends it, whatever ignore_eos says */
    if ((!j->sampling.ignore_eos || s->json) && is_stop_token(e, tok)) {
        pthread_mutex_lock(&j->mu);
        j->st.predicted_ms = 1e3 * (j->t_last - j->t_first);
        j->st.prompt_ms = 1e3 * (j->t_first - j->t_start);
        pthread_mutex_unlock(&j->mu);
        s->finish = SERVE_FINISH_STOP;
        return 1;
    }
    s->generated[s->num_generated++] = tok;
    s->next = tok;
    if (e->o.metrics) fmoe_serve_metrics_add_tokens(e->o.metrics, 0, 1);

    char *text = NULL;
    size_t len = 0;
    if (fmoe_tokenizer_decode(e->o.tokenizer, s->generated, (size_t)s->num_generated,
                              !j->sampling.keep_special, &text, &len) < 0) {
        job_finish(e, j, SERVE_FINISH_ERROR, "out of memory decoding the output");
        s->finish = 0;
        return 1;
    }
    const size_t stop_at =
        fmoe_serve_text_stop_at(j->sampling.stop, j->sampling.num_stop, text, len);
    int32_t finish = SERVE_RUNNING;
    if (stop_at < len) {
        len = stop_at;
        text[len] = 0;
        finish = SERVE_FINISH_STOP;
    } else if (s->num_generated >= j->sampling.max_tokens ||
               fmoe_session_position(s->session) >= e->o.max_context) {
        finish = SERVE_FINISH_LENGTH;
    }
    pthread_mutex_lock(&j->mu);
    free(j->text);
    j->text = text;
    j->text_len = len;
    if (lp) {
        /* grown by doubling: at most max_tokens records (<= the context) */
        if (j->lp_len == j->lp_cap) {
            const int32_t cap = j->lp_cap ? 2 * j->lp_cap : 16;
            serve_token_logprob *g = realloc(j->lp, (size_t)cap * sizeof *g);
            if (g) {
                j->lp = g;
                j->lp_cap = cap;
            }
        }
        if (j->lp_len < j->lp_cap) { /* out of memory: the record is dropped, not the job */
            const size_t stable = fmoe_text_stable_prefix(text, len);
            lp->text_end = stable;
            j->lp[j->lp_len++] = *lp;
        }
    }
    if (finish == SERVE_RUNNING) {
        const size_t vis = fmoe_serve_text_visible(j->sampling.stop, j->sampling.num_stop, text,
                                                   len);
        if (vis > j->visible) j->visible = vis;
    }
    j->st.completion_tokens = s->num_generated;
    j->st.prompt_ms = 1e3 * (j->t_first - j->t_start);
    j->st.predicted_ms = 1e3 * (j->t_last - j->t_first);
    pthread_cond_broadcast(&j->cv);
    if (j->notify) j->notify(j->notify_arg);
    pthread_mutex_unlock(&j->mu);
    s->finish = finish;
    return finish != SERVE_RUNNING;
}

/* Gives each item's job its share of the iteration's accesses: every access of (l, j)
 * counts for each item whose tokens routed to expert j at layer l. */
static void attribute_accesses(serve_engine *e, int32_t count) {
    if (!e->o.offload) return;
    const int64_t LJ = (int64_t)e->L * e->J;
    memset(e->touched, 0, (size_t)(count * LJ));
    for (int32_t i = 0; i < count; i++) {
        const uint16_t *ex = e->traces[i].experts;
        uint8_t *mark = e->touched + i * LJ;
        for (int64_t t = 0; t < e->items[i].n; t++)
            for (int32_t l = 0; l < e->L; l++)
                for (int32_t k = 0; k < e->K; k++)
                    mark[l * e->J + ex[(t * e->L + l) * e->K + k]] = 1;
    }
    int64_t n = 0;
    const fmoe_offload_access *acc = fmoe_offload_take_accesses(e->o.offload, &n);
    for (int32_t i = 0; i < count; i++) {
        serve_job *j = e->seqs[e->item_seq[i]].job;
        const uint8_t *mark = e->touched + i * LJ;
        serve_job_cache c = {0};
        for (int64_t a = 0; a < n; a++) {
            if (!mark[acc[a].layer * e->J + acc[a].expert]) continue;
            c.hits += acc[a].outcome == FMOE_ACCESS_HIT;
            c.late += acc[a].outcome == FMOE_ACCESS_LATE_HIT;
            c.prefetched += acc[a].prefetched;
            c.misses += acc[a].outcome == FMOE_ACCESS_MISS || acc[a].outcome == 3;
            c.bytes_loaded += acc[a].outcome == FMOE_ACCESS_MISS ? e->layer_bytes[acc[a].layer] : 0;
            c.stall_ms += 1e3 * acc[a].stall_s;
        }
        pthread_mutex_lock(&j->mu);
        j->st.cache.hits += c.hits;
        j->st.cache.late += c.late;
        j->st.cache.prefetched += c.prefetched;
        j->st.cache.misses += c.misses;
        j->st.cache.bytes_loaded += c.bytes_loaded;
        j->st.cache.stall_ms += c.stall_ms;
        pthread_mutex_unlock(&j->mu);
    }
}

/* Collects this iteration's items: decode tokens first, then prompt chunks (oldest
 * sequence first) within the token budget. @return the item count. */
static int32_t plan_items(serve_engine *e) {
    /* Running sequences oldest first: the order items take (decode tokens, then prompt
     * chunks) and sequences leave in, so a trace of the run says it (requests/id is the
     * admission order) and fmoe simulate --batch trace replays the same rows in the same
     * order. */
    int32_t *age = e->age, nage = 0;
    for (int32_t i = 0; i < e->o.parallel; i++) {
        if (e->seqs[i].state == SEQ_FREE) continue;
        int32_t at = nage++;
        while (at > 0 && e->seqs[age[at - 1]].order > e->seqs[i].order) {
            age[at] = age[at - 1];
            at--;
        }
        age[at] = i;
    }
    memcpy(e->by_age, age, (size_t)nage * sizeof *age);
    e->num_by_age = nage;
    int32_t count = 0, budget = e->o.batch_tokens;
    for (int32_t a = 0; a < nage; a++) {
        seq *s = &e->seqs[age[a]];
        if (s->state != SEQ_DECODE) continue;
        e->items[count] = (fmoe_batch_item){.session = s->session, .tokens = &s->next, .n = 1};
        e->item_seq[count++] = age[a];
        budget--;
    }
    for (int32_t a = 0; a < nage && budget > 0; a++) {
        seq *s = &e->seqs[age[a]];
        if (s->state != SEQ_PREFILL) continue;
        const int32_t left = s->job->prompt_tokens - s->fed;
        const int32_t n = left < budget ? left : budget;
        e->items[count] = (fmoe_batch_item){.session = s->session,
                                            .tokens = s->job->prompt + s->fed, .n = n};
        e->item_seq[count++] = age[a];
        budget -= n;
    }
    const int64_t LK = (int64_t)e->L * e->K, LJ = (int64_t)e->L * e->J;
    const int64_t h = e->geo->hidden_size;
    for (int32_t c = 0; c < count; c++) {
        seq *s = &e->seqs[e->item_seq[c]];
        const int decode = s->state == SEQ_DECODE;
        const int last = decode || s->fed + e->items[c].n == s->job->prompt_tokens;
        e->items[c].logits = last ? s->logits : NULL;
        fmoe_forward_trace *tr = &e->traces[c];
        if (e->o.trace_out) { /* the request's own rows */
            const int64_t r = decode ? (int64_t)s->job->prompt_tokens + s->decoded : s->fed;
            s->row0 = r;
            if (decode) {
                s->token_id[r] = s->next;
                s->phase[r] = FMOE_PHASE_DECODE;
            }
            const int64_t LSJ = LJ * e->o.trace_speculative;
            *tr = (fmoe_forward_trace){
                .experts = s->experts + r * LK, .probs = s->probs + r * LJ,
                .semantic = s->semantic + r * h,
                .speculative = LSJ > 0 ? s->speculative + r * LSJ : NULL};
        } else {
            *tr = (fmoe_forward_trace){.experts = s->experts};
        }
        e->items[c].trace = tr;
    }
    return count;
}

/* One batched iteration and what follows from it. */
static void run_iteration(serve_engine *e, int32_t count) {
    int rc;
    /* A request starts for the policy just before its first rows run (items are in
     * admission order), as fmoe simulate --batch trace replays it. */
    for (int32_t c = 0; e->o.offload && c < count; c++) {
        seq *s = &e->seqs[e->item_seq[c]];
        if (s->begun) continue;
        s->begun = 1;
        fmoe_offload_request_begin(e->o.offload, s->order, s->job->prompt,
                                   s->job->prompt_tokens);
    }
    const double t_pass = fmoe__now_s();
    if (e->o.offload)
        rc = fmoe_offload_forward_batch(e->o.offload, e->seqs[0].session, e->items, count);
    else
        rc = fmoe_session_forward_batch(e->seqs[0].session, e->items, count);
    const float pass_s = (float)(fmoe__now_s() - t_pass);
    /* --decision-log: the pass's decisions go out now, so that a log that cannot be
     * written fails the requests it lacks (507) and degrades the server, as --trace-out
     * does, rather than every request succeeding and the loss showing at exit */
    int log_failed = 0;
    if (rc == 0 && e->o.offload && (rc = fmoe_offload_flush_decisions(e->o.offload)) < 0) {
        output_failed(e, "decision log (--decision-log)", "decision log");
        log_failed = 1;
    }
    for (int32_t c = 0; rc == 0 && e->o.trace_out && c < count; c++) {
        seq *s = &e->seqs[e->item_seq[c]]; /* the batch composition, for the trace */
        for (int32_t t = 0; t < e->items[c].n; t++) {
            s->served_iteration[s->row0 + t] = e->passes;
            s->served_s[s->row0 + t] = pass_s;
        }
    }
    e->passes++;
    if (rc < 0) {
        char msg[256];
        if (log_failed)
            snprintf(msg, sizeof msg, "the request could not be recorded in the decision log "
                                      "(--decision-log): %.150s", fmoe_error_detail());
        else
            snprintf(msg, sizeof msg, "the forward pass failed: %s", fmoe_error_detail());
        for (int32_t c = 0; c < count; c++) {
            seq *s = &e->seqs[e->item_seq[c]];
            job_finish_status(e, s->job, SERVE_FINISH_ERROR, msg, log_failed ? 507 : 0);
            if (log_failed && e->o.metrics) fmoe_serve_metrics_trace_failure(e->o.metrics);
            s->state = SEQ_DONE; /* leaves below */
            s->finish = 0;
        }
    } else {
        attribute_accesses(e, count);
    }
    for (int32_t c = 0; rc == 0 && c < count; c++) {
        seq *s = &e->seqs[e->item_seq[c]];
        if (s->state == SEQ_DECODE) s->decoded++;
        if (s->state == SEQ_PREFILL) {
            s->fed += e->items[c].n;
            if (s->fed < s->job->prompt_tokens) continue;
            if (e->o.metrics) fmoe_serve_metrics_add_tokens(e->o.metrics, s->job->prompt_tokens, 0);
            s->state = SEQ_DECODE;
        }
        const float *logits = s->logits;
        if (s->json) {
            if (fmoe_json_matcher_mask(s->json, s->allowed) == 0) {
                /* a whole document and no end id to say so (a tokenizer without EOS):
                 * it ends here; else the schema needs bytes no token has */
                s->state = SEQ_DONE;
                s->finish = SERVE_FINISH_STOP;
                if (!fmoe_json_matcher_is_complete(s->json)) {
                    job_finish(e, s->job, SERVE_FINISH_ERROR,
                               "no token of the vocabulary continues the JSON document");
                    s->finish = 0;
                }
                continue;
            }
            for (int32_t i = 0; i < e->V; i++)
                s->masked[i] = s->allowed[i] ? s->logits[i] : -INFINITY;
            logits = s->masked;
        }
        const int32_t tok = fmoe_sampler_sample(s->sampler, logits);
        /* the mask admitted tok, so accept does not fail (an end id is not fed); were
         * it to, the request fails, not the server */
        if (s->json && !fmoe_json_matcher_is_end(s->json, tok) &&
            fmoe_json_matcher_accept(s->json, tok) < 0) {
            job_finish(e, s->job, SERVE_FINISH_ERROR, fmoe_error_detail());
            s->state = SEQ_DONE;
            s->finish = 0;
            continue;
        }
        serve_token_logprob lp;
        if (s->job->sampling.logprobs)
            fmoe_serve_logprobs_of(s->logits, e->V, tok, s->job->sampling.top_logprobs, &lp);
        if (take_token(e, s, tok, s->job->sampling.logprobs ? &lp : NULL)) s->state = SEQ_DONE;
    }
    /* Done and cancelled sequences leave (outside e->mu: only this thread touches the
     * sequences). With --trace-out a request goes to the trace queue, whose thread tells
     * its job after the write, so a request a client saw finish is in the trace and no
     * running sequence waits for the file. */
    for (int32_t a = 0; a < e->num_by_age; a++) {
        seq *s = &e->seqs[e->by_age[a]];
        if (s->state == SEQ_FREE) continue;
        if (s->state != SEQ_DONE) {
            if (!atomic_load(&s->job->cancel)) continue;
            s->finish = SERVE_FINISH_CANCELLED;
        }
        if (!seq_record(e, s, s->finish) && s->finish) job_finish(e, s->job, s->finish, NULL);
        seq_clear(e, s);
        pthread_mutex_lock(&e->mu);
        e->running--;
        pthread_mutex_unlock(&e->mu);
    }
}

static void cancel_everything(serve_engine *e) {
    while (e->q_head) {
        serve_job *j = e->q_head;
        e->q_head = j->next;
        e->waiting--;
        job_finish(e, j, SERVE_FINISH_CANCELLED, "the server is shutting down");
        fmoe_serve_job_release(j);
    }
    e->q_tail = NULL;
    for (int32_t i = 0; i < e->o.parallel; i++) {
        seq *s = &e->seqs[i];
        if (s->state == SEQ_FREE) continue;
        const int32_t finish = s->state == SEQ_DONE ? s->finish : SERVE_FINISH_CANCELLED;
        if (!seq_record(e, s, finish) && finish)
            job_finish(e, s->job, finish,
                       s->state == SEQ_DONE ? NULL : "the server is shutting down");
        seq_clear(e, s);
        e->running--;
    }
}

static void *scheduler_main(void *arg) {
    serve_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        if (e->draining && (fmoe__now_s() >= e->drain_deadline || (!e->q_head && e->running == 0))) {
            cancel_everything(e);
            break;
        }
        admit(e);
        if (e->running == 0) {
            const struct timespec until = deadline_after(0.1);
            pthread_cond_timedwait(&e->cv, &e->mu, &until);
            continue;
        }
        pthread_mutex_unlock(&e->mu);
        const int32_t count = plan_items(e);
        if (count > 0) run_iteration(e, count);
        pthread_mutex_lock(&e->mu);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* ---------------------------------------------------------------------------------- */
/* Start, stop, submit                                                                */
/* ---------------------------------------------------------------------------------- */

static void engine_free(serve_engine *e) {
    if (!e) return;
    fmoe_serve_trace_queue_stop(e->tq);
    fmoe_serve_prefix_pool_free(e->pool);
    for (int32_t i = 0; e->seqs && i < e->o.parallel; i++) {
        fmoe_session_free(e->seqs[i].session);
        fmoe_sampler_free(e->seqs[i].sampler);
        fmoe_json_matcher_free(e->seqs[i].json);
        free(e->seqs[i].allowed);
        free(e->seqs[i].masked);
        free(e->seqs[i].generated);
        free(e->seqs[i].cached);
        free(e->seqs[i].experts);
        free(e->seqs[i].probs);
        free(e->seqs[i].semantic);
        free(e->seqs[i].speculative);
        free(e->seqs[i].token_id);
        free(e->seqs[i].phase);
        free(e->seqs[i].served_iteration);
        free(e->seqs[i].served_s);
        free(e->seqs[i].logits);
    }
    free(e->seqs);
    free(e->items);
    free(e->traces);
    free(e->item_seq);
    free(e->by_age);
    free(e->age);
    free(e->touched);
    fmoe_json_vocab_free(e->json_vocab);
    free(e->stop_ids);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

int fmoe_serve_engine_start(const serve_engine_options *o, serve_engine **out) {
    *out = NULL;
    FMOE_RETURN_ERROR_IF(!o || !o->model || !o->tokenizer, FMOE_EINVAL,
                         "serve: a model and a tokenizer are needed");
    /* 0: the default budget, the one simulate --batch assumes. Every running sequence's
     * decode token goes into each iteration, so the budget must hold one token of each. */
    const int32_t budget = o->batch_tokens > 0 ? o->batch_tokens : FMOE_BATCH_TOKENS;
    FMOE_RETURN_ERROR_IF(o->batch_tokens < 0, FMOE_EINVAL, "--batch-tokens %d is below 1",
                         o->batch_tokens);
    FMOE_RETURN_ERROR_IF(o->parallel < 1 || o->parallel > budget, FMOE_EINVAL,
                         "--parallel %d is outside [1, %d] (--batch-tokens)", o->parallel,
                         budget);
    FMOE_RETURN_ERROR_IF(o->max_queue < 0, FMOE_EINVAL, "--max-queue %d is negative",
                         o->max_queue);
    serve_engine *e = calloc(1, sizeof *e);
    if (!e) return fmoe_error_set(FMOE_ENOMEM, "out of memory");
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->o = *o;
    e->o.batch_tokens = budget;
    e->geo = fmoe_model_get_geometry(o->model);
    e->V = (int32_t)e->geo->vocab_size;
    e->L = e->geo->num_moe_layers;
    e->J = e->geo->num_experts;
    e->K = e->geo->top_k;
    e->eos = fmoe_tokenizer_eos_id(o->tokenizer);
    if (harmony_stops(e) < 0) {
        free(e);
        return fmoe_error_set(FMOE_ENOMEM, "out of memory");
    }
    e->created = (int64_t)time(NULL);
    e->t0 = fmoe__now_s();
    const int32_t P = o->parallel;
    e->reuse_prefix = o->prefix_cache && !o->trace_out && fmoe_model_prefix_reusable(o->model);
    e->copy_prefix = e->reuse_prefix && o->backend == FMOE_BACKEND_CPU;
    if (e->o.max_context <= 0)
        e->o.max_context = e->geo->max_position_embeddings < 4096
                               ? (int32_t)e->geo->max_position_embeddings
                               : 4096;
    /* the stored bytes of one routed expert (quantized GGUF experts included) */
    e->layer_bytes = fmoe_model_layer_expert_bytes(o->model);
    e->seqs = calloc((size_t)P, sizeof *e->seqs);
    e->items = calloc((size_t)P, sizeof *e->items);
    e->traces = calloc((size_t)P, sizeof *e->traces);
    e->item_seq = calloc((size_t)P, sizeof *e->item_seq);
    e->by_age = calloc((size_t)P, sizeof *e->by_age);
    e->age = calloc((size_t)P, sizeof *e->age);
    e->touched = calloc((size_t)P * (size_t)e->L * (size_t)e->J, 1);
    int rc = 0;
    if (!e->seqs || !e->items || !e->traces || !e->item_seq || !e->by_age || !e->age ||
        !e->touched)
        rc = fmoe_error_set(FMOE_ENOMEM, "out of memory");
    for (int32_t i = 0; rc == 0 && i < P; i++) {
        fmoe_session_options so = fmoe_session_defaults();
        so.backend = o->backend;
        so.max_context = e->o.max_context;
        so.threads = o->threads;
        so.activations = o->activations;
        if (i == 0 && o->offload) fmoe_offload_attach(o->offload, &so);
        so.max_batch = i == 0 ? budget : 1;
        so.max_sequences = i == 0 ? P : 1; /* slot 0 runs every batch */
        rc = fmoe_session_init(o->model, &so, &e->seqs[i].session);
        if (rc < 0) break;
        seq *s = &e->seqs[i];
        s->generated = malloc((size_t)e->o.max_context * sizeof *s->generated);
        s->cached = malloc((size_t)e->o.max_context * sizeof *s->cached);
        s->logits = malloc((size_t)e->V * sizeof *s->logits);
        if (!s->generated || !s->cached || !s->logits)
            rc = fmoe_error_set(FMOE_ENOMEM, "out of memory");
        else
            rc = seq_reserve(e, s, budget);
    }
    if (rc == 0 && o->prefix_cache_bytes > 0 && o->backend != FMOE_BACKEND_CPU)
        rc = fmoe_error_set(FMOE_EUNSUPPORTED, "--prefix-cache-gb: the CPU backend only, for "
                                               "now (the slots' own caches are reused on "
                                               "every backend)");
    if (rc == 0 && e->reuse_prefix && o->prefix_cache_bytes > 0) {
        fmoe_session_options so = fmoe_session_defaults();
        so.backend = o->backend;
        so.max_context = e->o.max_context;
        so.threads = o->threads;
        so.activations = o->activations;
        rc = fmoe_serve_prefix_pool_new(o->model, &so, o->prefix_cache_bytes, &e->pool);
    }
    if (rc == 0 && o->trace_out)
        rc = fmoe_serve_trace_queue_start(o->trace_out, on_traced, e, &e->tq);
    if (rc < 0) {
        engine_free(e);
        return rc;
    }
    e->accepting = 1;
    if (pthread_create(&e->thread, NULL, scheduler_main, e) != 0) {
        engine_free(e);
        return fmoe_error_set(FMOE_ENOMEM, "cannot start the scheduler thread");
    }
    e->thread_started = 1;
    *out = e;
    return 0;
}

int fmoe_serve_engine_stop(serve_engine *e, double grace_s) {
    if (!e) return 0;
    pthread_mutex_lock(&e->mu);
    e->accepting = 0;
    e->draining = 1;
    e->drain_deadline = fmoe__now_s() + (grace_s > 0 ? grace_s : 0);
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (e->thread_started) pthread_join(e->thread, NULL);
    const int rc = fmoe_serve_trace_queue_stop(e->tq); /* what is queued is written first */
    e->tq = NULL;
    engine_free(e);
    return rc;
}

static char *dup_string(const char *s) {
    const size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d) memcpy(d, s, n + 1);
    return d;
}

serve_job *fmoe_serve_engine_submit(serve_engine *e, const int32_t *ids, int32_t n,
                               const serve_sampling *s, int *http_status, char *msg,
                               size_t cap) {
#define REFUSE(code, ...)                                                                    \
    do {                                                                                     \
        *http_status = (code);                                                               \
        snprintf(msg, cap, __VA_ARGS__);                                                     \
        return NULL;                                                                         \
    } while (0)
    if (n < 1) REFUSE(400, "the prompt is empty");
    if (s->max_tokens < 1) REFUSE(400, "max_tokens must be at least 1 (got %d)", s->max_tokens);
    if ((int64_t)n + s->max_tokens > e->o.max_context)
        REFUSE(400,
               "the prompt's %d tokens and max_tokens %d exceed the context of %d tokens", n,
               s->max_tokens, e->o.max_context);
    for (int32_t t = 0; t < n; t++)
        if (ids[t] < 0 || ids[t] >= e->V)
            REFUSE(400, "token %d at prompt index %d is outside the vocabulary [0, %d)", ids[t],
                   t, e->V);
    serve_job *j = calloc(1, sizeof *j);
    if (!j) REFUSE(500, "out of memory");
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 2;
    j->prompt = malloc((size_t)n * sizeof *j->prompt);
    j->sampling = *s;
    j->sampling.num_stop = 0;
    j->sampling.json = NULL; /* referenced below, once the job is whole */
    j->stop_copy = s->num_stop > 0 ? calloc((size_t)s->num_stop, sizeof(char *)) : NULL;
    int ok = j->prompt && (s->num_stop == 0 || j->stop_copy);
    for (int32_t i = 0; ok && i < s->num_stop; i++) {
        j->stop_copy[i] = dup_string(s->stop[i]);
        ok = j->stop_copy[i] != NULL;
        j->sampling.num_stop += ok;
    }
    if (!ok) {
        job_free(j);
        REFUSE(500, "out of memory");
    }
    j->sampling.stop = (const char *const *)j->stop_copy;
    j->sampling.json = fmoe_json_schema_retain(s->json);
    memcpy(j->prompt, ids, (size_t)n * sizeof *ids);
    j->prompt_tokens = n;
    j->st.prompt_tokens = n;
    j->t_submit = fmoe__now_s();

    pthread_mutex_lock(&e->mu);
    if (atomic_load(&e->trace_failed)) {
        pthread_mutex_unlock(&e->mu);
        job_free(j);
        if (e->o.metrics) fmoe_serve_metrics_trace_failure(e->o.metrics);
        REFUSE(503, "the %s cannot be written (%s): no request is answered that it cannot "
                    "record",
               e->failed_output, e->trace_error);
    }
    if (!e->accepting || e->waiting >= e->o.max_queue + (e->running < e->o.parallel
                                                            ? e->o.parallel - e->running
                                                            : 0)) {
        const int shutting = !e->accepting;
        pthread_mutex_unlock(&e->mu);
        job_free(j);
        if (shutting) REFUSE(503, "the server is shutting down");
        REFUSE(503, "the queue is full (%d waiting); retry later", e->o.max_queue);
    }
    if (e->q_tail)
        e->q_tail->next = j;
    else
        e->q_head = j;
    e->q_tail = j;
    e->waiting++;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    *http_status = 200;
    if (cap) msg[0] = 0;
    return j;
#undef REFUSE
}

void fmoe_serve_engine_get_info(const serve_engine *e, serve_engine_info *out) {
    *out = (serve_engine_info){.model_name = e->o.model_name,
                               .max_context = e->o.max_context,
                               .parallel = e->o.parallel,
                               .num_layers = e->L,
                               .offloaded = e->o.offload != NULL,
                               .backend = fmoe_backend_name(e->o.backend),
                               .created = e->created};
}

void fmoe_serve_engine_get_gauges(serve_engine *e, serve_engine_gauges *out) {
    pthread_mutex_lock(&e->mu);
    out->running = e->running;
    out->waiting = e->waiting;
    out->ready = e->accepting;
    pthread_mutex_unlock(&e->mu);
    serve_prefix_stats ps;
    fmoe_serve_prefix_pool_stats(e->pool, &ps);
    out->prefix_cache_bytes = ps.bytes;
    out->prefix_cache_tokens = ps.held_tokens;
    out->prefix_cache_evictions = ps.evictions;
    out->trace_error = atomic_load(&e->trace_failed) ? e->trace_error : NULL;
}

void fmoe_serve_engine_get_layers(serve_engine *e, serve_layer_counters *out) {
    memset(out, 0, (size_t)e->L * sizeof *out);
    if (!e->o.offload) return;
    fmoe_offload_layer_stats *ls = calloc((size_t)e->L, sizeof *ls);
    if (!ls) return;
    fmoe_offload_get_layer_stats(e->o.offload, ls);
    for (int32_t l = 0; l < e->L; l++)
        out[l] = (serve_layer_counters){.hits = ls[l].hits,
                                        .misses = ls[l].misses, /* host misses included */
                                        .late = ls[l].late_hits,
                                        .prefetch_issued = ls[l].prefetches,
                                        .prefetch_useful = ls[l].prefetch_hits,
                                        .load_bytes = ls[l].bytes_loaded,
                                        .resident = ls[l].resident,
                                        .stall_s = ls[l].stall_s};
    free(ls);
}
