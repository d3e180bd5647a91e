/*
 * workload.c - a trace compiled into the §7.1 access sequence (fmoe/sim.h).
 *
 * Compilation, per iteration and layer: walk the iteration's tokens in order and each
 * token's K experts in gate order; the first time an expert appears it becomes the next
 * access, later appearances add to its token count. A per-expert stamp array makes this
 * O(n·K) with no clearing. The result (expert ids and token counts) is what every cell of a
 * sweep replays, and exactly what belady's future knowledge is.
 *
 * fmoe_sim_workload_batch recompiles a workload into the iterations of continuous
 * batching (fmoe serve's scheduler, replayed here without a clock unless arrival times
 * make one necessary): the same per-iteration compilation over the gathered rows of all
 * the iteration's items, so belady and the oracle see the batched order as their future.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/sim.h"
#include "fmoe/trace.h"

int fmoe_sim_workload_init(fmoe_sim_workload *w, int32_t num_layers, int32_t num_experts,
                           int32_t top_k, int64_t expert_bytes) {
    memset(w, 0, sizeof *w);
    FMOE_RETURN_ERROR_IF(num_layers < 1 || num_experts < 1 || num_experts > 65535 ||
                             top_k < 1 || top_k > num_experts ||
                             (int64_t)num_layers * num_experts > (1 << 30),
                         FMOE_EINVAL, "workload: bad geometry L=%d J=%d K=%d", num_layers,
                         num_experts, top_k);
    FMOE_RETURN_ERROR_IF(expert_bytes < 0, FMOE_EINVAL, "workload: expert bytes %lld < 0",
                         (long long)expert_bytes);
    w->num_layers = num_layers;
    w->num_experts = num_experts;
    w->top_k = top_k;
    w->expert_bytes = expert_bytes;
    w->stamp = calloc((size_t)num_experts, sizeof *w->stamp);
    w->count = calloc((size_t)num_experts, sizeof *w->count);
    w->order = calloc((size_t)num_experts, sizeof *w->order);
    w->layer_expert_bytes = malloc((size_t)num_layers * sizeof *w->layer_expert_bytes);
    if (!w->stamp || !w->count || !w->order || !w->layer_expert_bytes) {
        fmoe_sim_workload_free(w);
        return fmoe_error_set(FMOE_ENOMEM, "workload scratch");
    }
    for (int32_t l = 0; l < num_layers; l++) w->layer_expert_bytes[l] = expert_bytes;
    return 0;
}

void fmoe_sim_workload_free(fmoe_sim_workload *w) {
    if (!w) return;
    free(w->requests);
    free(w->iterations);
    free(w->experts);
    free(w->access_expert);
    free(w->access_tokens);
    free(w->layer_accesses);
    free(w->stamp);
    free(w->layer_expert_bytes);
    free(w->count);
    free(w->order);
    free(w->probs);
    free(w->speculative);
    free(w->semantic);
    free(w->hidden);
    free(w->items);
    free(w->admit_order);
    free(w->leave_order);
    free(w->served_iteration);
    memset(w, 0, sizeof *w);
}

/* Grows *p (elements of `size` bytes, capacity *cap) to hold `need`. */
static int grow(void **p, int64_t *cap, int64_t need, size_t size) {
    if (need <= *cap) return 0;
    int64_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * size);
    if (!q) return fmoe_error_set(FMOE_ENOMEM, "workload: %lld elements", (long long)c);
    *p = q;
    *cap = c;
    return 0;
}

/* Room for `need` iterations (and their rows of the layer table). */
static int reserve_iterations(fmoe_sim_workload *w, int64_t need) {
    const int64_t cap_it = w->cap_iterations;
    FMOE_FORWARD_IF_ERROR(grow((void **)&w->iterations, &w->cap_iterations, need,
                               sizeof *w->iterations));
    if (w->cap_iterations != cap_it) {
        void *q = realloc(w->layer_accesses,
                          (size_t)w->cap_iterations * w->num_layers * sizeof(uint16_t));
        if (!q) return fmoe_error_set(FMOE_ENOMEM, "workload: layer table");
        w->layer_accesses = q;
    }
    return 0;
}

/* Room for `need` accesses. */
static int reserve_accesses(fmoe_sim_workload *w, int64_t need) {
    int64_t cap_acc = w->cap_accesses;
    FMOE_FORWARD_IF_ERROR(grow((void **)&w->access_expert, &cap_acc, need,
                               sizeof *w->access_expert));
    if (cap_acc != w->cap_accesses) {
        void *q = realloc(w->access_tokens, (size_t)cap_acc * sizeof *w->access_tokens);
        if (!q) return fmoe_error_set(FMOE_ENOMEM, "workload: access table");
        w->access_tokens = q;
        w->cap_accesses = cap_acc;
    }
    return 0;
}

/* Appends the §7.1 accesses of iteration w->num_iterations, whose n rows ([n][L][K]) are
 * at `rows`: per layer, each distinct expert once, in order of first appearance, with the
 * count of its tokens. Room must be reserved. */
static void compile_iteration(fmoe_sim_workload *w, const uint16_t *rows, int64_t n) {
    const int32_t L = w->num_layers, K = w->top_k, J = w->num_experts;
    uint16_t *la = w->layer_accesses + (size_t)w->num_iterations * L;
    for (int32_t l = 0; l < L; l++) {
        const uint64_t st = ++w->stamp_now;
        int32_t nd = 0;
        for (int64_t u = 0; u < n; u++) {
            const uint16_t *row = rows + ((size_t)u * L + l) * K;
            for (int32_t k = 0; k < K; k++) {
                const uint16_t j = row[k];
                if (w->stamp[j] != st) {
                    w->stamp[j] = st;
                    w->count[j] = 0;
                    w->order[nd++] = j;
                }
                w->count[j]++;
            }
        }
        for (int32_t q = 0; q < nd; q++) {
            w->access_expert[w->num_accesses] = (uint32_t)(l * J + w->order[q]);
            w->access_tokens[w->num_accesses] = w->count[w->order[q]];
            w->num_accesses++;
        }
        la[l] = (uint16_t)nd;
    }
}

int fmoe_sim_workload_keep_gates(fmoe_sim_workload *w, int32_t probs_kind,
                                 int32_t speculative_depth) {
    FMOE_RETURN_ERROR_IF(w->num_requests > 0, FMOE_EINVAL,
                         "workload: gate data must be chosen before the first request");
    FMOE_RETURN_ERROR_IF(probs_kind < FMOE_PROBS_NONE || probs_kind > FMOE_PROBS_FULL,
                         FMOE_EINVAL, "workload: bad probs kind %d", probs_kind);
    FMOE_RETURN_ERROR_IF(speculative_depth < 0 || speculative_depth > 1024, FMOE_EINVAL,
                         "workload: bad speculative depth %d", speculative_depth);
    w->probs_kind = probs_kind;
    w->speculative_depth = speculative_depth;
    return 0;
}

/* Grows a per-token float array of `row` floats per token from `old_cap` to w->cap_tokens
 * tokens. */
static int grow_rows(float **p, int64_t old_cap, int64_t new_cap, size_t row) {
    if (new_cap == 0 || (new_cap == old_cap && *p)) return 0;
    float *q = realloc(*p, (size_t)new_cap * row * sizeof *q);
    if (!q) return fmoe_error_set(FMOE_ENOMEM, "workload: gate data of %lld tokens",
                                  (long long)new_cap);
    *p = q;
    return 0;
}

int fmoe_sim_workload_add_request(fmoe_sim_workload *w, int64_t id, double arrival_s,
                                  int32_t prompt_tokens, int32_t output_tokens, int64_t n,
                                  const uint8_t *phase, const uint16_t *experts) {
    return fmoe_sim_workload_add_request_gates(w, id, arrival_s, prompt_tokens, output_tokens,
                                               n, phase, experts, NULL, NULL);
}

/* The end of the iteration starting at token t: a decode token alone; a run of prefill
 * tokens whole, or its next prefill_chunk tokens (docs/design.md §7.1). */
static int64_t iteration_end(const fmoe_sim_workload *w, const uint8_t *phase, int64_t n,
                             int64_t t) {
    int64_t e = t + 1;
    if (phase[t] != FMOE_PHASE_PREFILL) return e;
    while (e < n && phase[e] == FMOE_PHASE_PREFILL &&
           (w->prefill_chunk <= 0 || e - t < w->prefill_chunk))
        e++;
    return e;
}

int fmoe_sim_workload_add_request_gates(fmoe_sim_workload *w, int64_t id, double arrival_s,
                                        int32_t prompt_tokens, int32_t output_tokens, int64_t n,
                                        const uint8_t *phase, const uint16_t *experts,
                                        const float *probs, const float *speculative) {
    const int32_t L = w->num_layers, K = w->top_k, J = w->num_experts;
    const int32_t S = w->speculative_depth;
    FMOE_RETURN_ERROR_IF(n < 0, FMOE_EINVAL, "request %lld: %lld tokens", (long long)id,
                         (long long)n);
    FMOE_RETURN_ERROR_IF(w->probs_kind != FMOE_PROBS_NONE && n > 0 && !probs, FMOE_EINVAL,
                         "request %lld: the workload keeps probabilities but none were given",
                         (long long)id);
    FMOE_RETURN_ERROR_IF(S > 0 && n > 0 && !speculative, FMOE_EINVAL,
                         "request %lld: the workload keeps speculative rows but none were given",
                         (long long)id);
    for (int64_t i = 0; i < n * L * K; i++)
        FMOE_RETURN_ERROR_IF(experts[i] >= J, FMOE_EFORMAT,
                             "request %lld, token %lld, layer %lld: expert %u >= %d experts",
                             (long long)id, (long long)(i / ((int64_t)L * K)),
                             (long long)(i / K % L), experts[i], J);
    /* Count iterations first so every buffer grows once per request. */
    int64_t niter = 0, max_acc = 0;
    for (int64_t t = 0; t < n; t = iteration_end(w, phase, n, t)) niter++;
    max_acc = n * L * K;
    FMOE_FORWARD_IF_ERROR(grow((void **)&w->requests, &w->cap_requests, w->num_requests + 1,
                               sizeof *w->requests));
    FMOE_FORWARD_IF_ERROR(reserve_iterations(w, w->num_iterations + niter));
    const int64_t cap_tok = w->cap_tokens;
    FMOE_FORWARD_IF_ERROR(grow((void **)&w->experts, &w->cap_tokens, w->num_tokens + n,
                               (size_t)L * K * sizeof *w->experts));
    if (w->probs_kind != FMOE_PROBS_NONE)
        FMOE_FORWARD_IF_ERROR(grow_rows(&w->probs, cap_tok, w->cap_tokens, (size_t)L * J));
    if (S > 0)
        FMOE_FORWARD_IF_ERROR(
            grow_rows(&w->speculative, cap_tok, w->cap_tokens, (size_t)L * S * J));
    FMOE_FORWARD_IF_ERROR(reserve_accesses(w, w->num_accesses + max_acc));

    const int64_t tok0 = w->num_tokens;
    if (n) memcpy(w->experts + (size_t)tok0 * L * K, experts, (size_t)(n * L * K) * sizeof *experts);
    if (n && w->probs_kind != FMOE_PROBS_NONE)
        memcpy(w->probs + (size_t)tok0 * L * J, probs, (size_t)n * L * J * sizeof *probs);
    if (n && S > 0)
        memcpy(w->speculative + (size_t)tok0 * L * S * J, speculative,
               (size_t)n * L * S * J * sizeof *speculative);
    fmoe_sim_request *rq = &w->requests[w->num_requests];
    *rq = (fmoe_sim_request){.id = id, .arrival_s = arrival_s, .prompt_tokens = prompt_tokens,
                             .output_tokens = output_tokens,
                             .first_iteration = w->num_iterations, .num_iterations = niter};
    int64_t t = 0, context = 0;
    while (t < n) {
        const int64_t e = iteration_end(w, phase, n, t);
        context += e - t;
        fmoe_sim_iteration *it = &w->iterations[w->num_iterations];
        *it = (fmoe_sim_iteration){.request = w->num_requests,
                                   .phase = phase[t] == FMOE_PHASE_PREFILL ? 0 : 1,
                                   .num_tokens = (int32_t)(e - t), .context = context,
                                   .token_begin = tok0 + t, .access_begin = w->num_accesses};
        compile_iteration(w, experts + (size_t)t * L * K, e - t);
        w->num_iterations++;
        t = e;
    }
    w->num_tokens += n;
    w->num_requests++;
    return 0;
}

/* ------------------------------------------------------------------ continuous batching */

/* Why a copy and not a row-index list: the executor, the gate events and the iteration
 * events all read an iteration's rows as one contiguous block (chosen experts, gate
 * probabilities, speculative rows, semantic rows, gate inputs, with strides); gathering the rows once
 * here keeps every reader as it is, at the price of a second copy of the rows while both
 * workloads live (fmoe simulate frees the first).
 *
 * Two builders share the gathering: fmoe_sim_workload_batch schedules the iterations
 * itself, fmoe_sim_workload_served takes them from a served trace. Both open an iteration
 * (iteration_open), add its items in order (add_item) and close it (iteration_close),
 * which compiles its accesses and records which requests started and ended with it. */

/* The builders' view of one request of the source workload. */
typedef struct batch_req {
    int64_t row0;   /* its first row in the source */
    int64_t rows;   /* its rows: prompt, then decode */
    int64_t next;   /* rows run so far */
    int64_t rank;   /* admission order: items of a group go oldest first */
} batch_req;

/* A batched workload under construction. */
typedef struct batch_build {
    batch_req *rq;      /* [R] */
    uint8_t *phase;     /* [T] each source row's phase, 0 prompt, 1 decode */
    int64_t tok;        /* rows gathered so far */
    int64_t started;    /* entries of out->admit_order */
    int64_t left;       /* entries of out->leave_order */
} batch_build;

static void batch_build_free(batch_build *b) {
    free(b->rq);
    free(b->phase);
}

/* Initialises `out` for the rows of `in` (requests copied, every row buffer allocated
 * once) and `b`. */
static int batch_build_init(fmoe_sim_workload *out, const fmoe_sim_workload *in, int32_t batch,
                            batch_build *b) {
    memset(b, 0, sizeof *b);
    FMOE_FORWARD_IF_ERROR(fmoe_sim_workload_init(out, in->num_layers, in->num_experts,
                                                 in->top_k, in->expert_bytes));
    memcpy(out->layer_expert_bytes, in->layer_expert_bytes,
           (size_t)in->num_layers * sizeof *in->layer_expert_bytes);
    const int32_t L = in->num_layers, K = in->top_k;
    const int64_t R = in->num_requests, T = in->num_tokens;
    const size_t LJ = (size_t)L * in->num_experts;
    out->prefill_chunk = in->prefill_chunk;
    out->probs_kind = in->probs ? in->probs_kind : FMOE_PROBS_NONE;
    out->speculative_depth = in->speculative ? in->speculative_depth : 0;
    out->semantic_dim = in->semantic ? in->semantic_dim : 0;
    out->hidden_dim = in->hidden ? in->hidden_dim : 0;
    out->batch = batch;
    b->rq = calloc((size_t)(R ? R : 1), sizeof *b->rq);
    b->phase = malloc((size_t)(T ? T : 1));
    out->requests = calloc((size_t)(R ? R : 1), sizeof *out->requests);
    out->admit_order = malloc((size_t)(R ? R : 1) * sizeof *out->admit_order);
    out->leave_order = malloc((size_t)(R ? R : 1) * sizeof *out->leave_order);
    out->experts = malloc((size_t)(T ? T : 1) * L * K * sizeof *out->experts);
    if (out->probs_kind != FMOE_PROBS_NONE)
        out->probs = malloc((size_t)(T ? T : 1) * LJ * sizeof *out->probs);
    if (out->speculative_depth)
        out->speculative = malloc((size_t)(T ? T : 1) * LJ * out->speculative_depth *
                                  sizeof *out->speculative);
    if (out->semantic_dim)
        out->semantic = malloc((size_t)(T ? T : 1) * out->semantic_dim * sizeof *out->semantic);
    if (out->hidden_dim)
        out->hidden = malloc((size_t)(T ? T : 1) * (size_t)L * (size_t)out->hidden_dim *
                             sizeof *out->hidden);
    if (!b->rq || !b->phase || !out->requests || !out->admit_order || !out->leave_order ||
        !out->experts || (out->probs_kind != FMOE_PROBS_NONE && !out->probs) ||
        (out->speculative_depth && !out->speculative) || (out->semantic_dim && !out->semantic) ||
        (out->hidden_dim && !out->hidden)) {
        batch_build_free(b);
        fmoe_sim_workload_free(out);
        return fmoe_error_set(FMOE_ENOMEM, "batched workload of %lld tokens", (long long)T);
    }
    out->cap_requests = out->num_requests = R;
    out->cap_tokens = T;
    for (int64_t i = 0; i < in->num_iterations; i++)
        memset(b->phase + in->iterations[i].token_begin, in->iterations[i].phase ? 1 : 0,
               (size_t)in->iterations[i].num_tokens);
    for (int64_t q = 0; q < R; q++) {
        const fmoe_sim_request *s = &in->requests[q];
        out->requests[q] = *s;
        out->requests[q].num_iterations = 0;
        out->requests[q].leave_iteration = -1;
        if (s->num_iterations > 0) {
            const fmoe_sim_iteration *a = &in->iterations[s->first_iteration];
            const fmoe_sim_iteration *z = a + s->num_iterations - 1;
            b->rq[q].row0 = a->token_begin;
            b->rq[q].rows = z->token_begin + z->num_tokens - a->token_begin;
        }
    }
    return 0;
}

/* The compute-only time of the iteration just compiled (every expert resident): what the
 * executor would spend on it without a stall. */
static double nominal_s(const fmoe_sim_workload *w, const fmoe_sim_iteration *it,
                        const fmoe_sim_costs *c) {
    const uint16_t *la = w->layer_accesses + (size_t)(it - w->iterations) * w->num_layers;
    double t = 0;
    int64_t a = it->access_begin;
    for (int32_t l = 0; l < w->num_layers; l++) {
        t += fmoe_sim_layer_batch_s(c, it->num_tokens, (double)it->token_context,
                                    (double)it->kv_context);
        for (int32_t q = 0; q < la[l]; q++, a++)
            t += fmoe_sim_expert_s(c, (int32_t)w->access_tokens[a]);
    }
    return t + fmoe_sim_head_batch_s(c, it->yields);
}

/* Copies row `from` of `in` to row `to` of `out` (routing and whatever gate data: probs,
 * speculative, semantic and hidden rows). */
static void copy_row(fmoe_sim_workload *out, const fmoe_sim_workload *in, int64_t to,
                     int64_t from) {
    const size_t LK = (size_t)in->num_layers * in->top_k;
    const size_t LJ = (size_t)in->num_layers * in->num_experts;
    memcpy(out->experts + (size_t)to * LK, in->experts + (size_t)from * LK,
           LK * sizeof *in->experts);
    if (out->probs)
        memcpy(out->probs + (size_t)to * LJ, in->probs + (size_t)from * LJ, LJ * sizeof *in->probs);
    if (out->speculative) {
        const size_t n = LJ * (size_t)in->speculative_depth;
        memcpy(out->speculative + (size_t)to * n, in->speculative + (size_t)from * n,
               n * sizeof *in->speculative);
    }
    if (out->semantic) {
        const size_t h = (size_t)in->semantic_dim;
        memcpy(out->semantic + (size_t)to * h, in->semantic + (size_t)from * h,
               h * sizeof *in->semantic);
    }
    if (out->hidden) {
        const size_t n = (size_t)in->num_layers * (size_t)in->hidden_dim;
        memcpy(out->hidden + (size_t)to * n, in->hidden + (size_t)from * n, n * sizeof *in->hidden);
    }
}

/* Opens iteration out->num_iterations at the next row, with room for `max_items` items.
 * @return 0 or FMOE_ENOMEM. */
static int iteration_open(fmoe_sim_workload *out, const batch_build *b, int64_t max_items,
                          fmoe_sim_iteration **it) {
    FMOE_FORWARD_IF_ERROR(reserve_iterations(out, out->num_iterations + 1));
    FMOE_FORWARD_IF_ERROR(grow((void **)&out->items, &out->cap_items,
                               out->num_items + max_items, sizeof *out->items));
    *it = &out->iterations[out->num_iterations];
    **it = (fmoe_sim_iteration){.token_begin = b->tok, .item_begin = out->num_items};
    return 0;
}

/* Appends to iteration `it` request q's next n rows (its r->next on) as one item. */
static void add_item(fmoe_sim_workload *out, const fmoe_sim_workload *in,
                     fmoe_sim_iteration *it, batch_build *b, int64_t q, int64_t n) {
    const batch_req *r = &b->rq[q];
    const uint8_t *phase = b->phase;
    const int64_t context = r->next + n;
    const int prompt = phase[r->row0 + r->next] == 0;
    const int last_prompt = prompt && (context == r->rows || phase[r->row0 + context] != 0);
    out->items[out->num_items++] = (fmoe_sim_item){
        .request = q, .phase = !prompt, .num_tokens = (int32_t)n, .context = context,
        .last_prompt = last_prompt};
    for (int64_t u = 0; u < n; u++) copy_row(out, in, b->tok + u, r->row0 + r->next + u);
    b->tok += n;
    it->num_items++;
    it->num_tokens += (int32_t)n;
    it->yields += !prompt || last_prompt;
    if (context > it->context) it->context = context;
    it->kv_context += context;
    it->token_context += n * context;
}

/* Appends requests list[0..n) to `order` at *at, oldest admitted first (n is at most the
 * items of an iteration: an insertion sort). */
static void append_by_rank(int64_t *order, int64_t *at, int64_t *list, int64_t n,
                           const batch_req *rq) {
    for (int64_t i = 1; i < n; i++) {
        const int64_t v = list[i];
        int64_t j = i;
        for (; j > 0 && rq[list[j - 1]].rank > rq[v].rank; j--) list[j] = list[j - 1];
        list[j] = v;
    }
    memcpy(order + *at, list, (size_t)n * sizeof *list);
    *at += n;
}

/* Closes the open iteration: compiles its §7.1 accesses over its gathered rows, advances
 * its items' requests, and records the requests whose first rows it ran (they start
 * before it) and those whose last rows it ran (they end after it), oldest admitted first.
 * `scratch` holds an int64 per item. @return 0 or FMOE_ENOMEM. */
static int iteration_close(fmoe_sim_workload *out, batch_build *b, fmoe_sim_iteration *it,
                           int64_t *scratch) {
    const int32_t L = out->num_layers, K = out->top_k;
    const fmoe_sim_item *items = &out->items[it->item_begin];
    const int64_t ii = out->num_iterations;
    int32_t decode_items = 0;
    for (int32_t c = 0; c < it->num_items; c++) decode_items += items[c].phase != 0;
    it->request = items[0].request;
    it->phase = decode_items == it->num_items ? 1 : 0; /* decode only if all items are */
    it->access_begin = out->num_accesses;
    FMOE_FORWARD_IF_ERROR(reserve_accesses(out, out->num_accesses +
                                                    (int64_t)it->num_tokens * L * K));
    compile_iteration(out, out->experts + (size_t)it->token_begin * L * K, it->num_tokens);
    int64_t n = 0;
    for (int32_t c = 0; c < it->num_items; c++) {
        const int64_t q = items[c].request;
        if (b->rq[q].next > 0) continue;
        out->requests[q].admit_iteration = out->requests[q].first_iteration = ii;
        scratch[n++] = q;
    }
    append_by_rank(out->admit_order, &b->started, scratch, n, b->rq);
    n = 0;
    for (int32_t c = 0; c < it->num_items; c++) {
        const int64_t q = items[c].request;
        b->rq[q].next += items[c].num_tokens;
        if (b->rq[q].next < b->rq[q].rows) continue;
        out->requests[q].leave_iteration = ii;
        out->requests[q].num_iterations = ii + 1 - out->requests[q].admit_iteration;
        scratch[n++] = q;
    }
    append_by_rank(out->leave_order, &b->left, scratch, n, b->rq);
    out->num_iterations++;
    return 0;
}

/* A request without rows starts and ends at once, before iteration out->num_iterations. */
static void add_empty(fmoe_sim_workload *out, batch_build *b, int64_t q) {
    out->requests[q].admit_iteration = out->requests[q].first_iteration = out->num_iterations;
    out->requests[q].leave_iteration = -1;
    out->admit_order[b->started++] = q;
    out->leave_order[b->left++] = q;
}

int fmoe_sim_workload_batch(fmoe_sim_workload *out, const fmoe_sim_workload *in,
                            int32_t batch, int32_t batch_tokens, const double *arrival_s,
                            const fmoe_sim_costs *costs) {
    memset(out, 0, sizeof *out);
    FMOE_RETURN_ERROR_IF(batch < 1 || batch > (1 << 20), FMOE_EINVAL,
                         "batch must be in [1, %d], got %d", 1 << 20, batch);
    FMOE_RETURN_ERROR_IF(batch_tokens < batch, FMOE_EINVAL,
                         "batch %d exceeds the %d tokens of an iteration (each running "
                         "request's decode token must fit one)",
                         batch, batch_tokens);
    FMOE_RETURN_ERROR_IF(in->batch > 0, FMOE_EINVAL, "workload: already batched");
    FMOE_RETURN_ERROR_IF(arrival_s && !costs, FMOE_EINVAL,
                         "workload: batching with arrival times needs the cost model");
    for (int64_t q = 0; arrival_s && q < in->num_requests; q++)
        FMOE_RETURN_ERROR_IF(!(arrival_s[q] >= 0) || !isfinite(arrival_s[q]), FMOE_EINVAL,
                             "arrival time of request %lld is %g", (long long)q, arrival_s[q]);
    batch_build b;
    FMOE_FORWARD_IF_ERROR(batch_build_init(out, in, batch, &b));
    out->batch_tokens = batch_tokens;
    const int64_t R = in->num_requests;
    batch_req *rq = b.rq;
    /* [B] the running requests, oldest admitted first (admission is FIFO, so appending
     * keeps the order); scratch: [B] for iteration_close */
    int64_t *running = malloc((size_t)batch * sizeof *running);
    int64_t *scratch = malloc((size_t)batch * sizeof *scratch);
    uint8_t *taken = calloc((size_t)batch, 1); /* [B] running[i] has an item this iteration */
    int rc = 0;
    if (!running || !scratch || !taken) {
        rc = fmoe_error_set(FMOE_ENOMEM, "batch of %d", batch);
        goto done;
    }
    double now = 0;  /* the compute-only clock; only admissions with arrival times read it */
    int64_t head = 0, nrun = 0, admitted = 0;
    while (head < R || nrun > 0) {
        /* admission: the queue's head, while a slot is free and it has arrived */
        while (head < R && nrun < batch && (!arrival_s || arrival_s[head] <= now)) {
            const int64_t q = head++;
            rq[q].rank = admitted++;
            if (rq[q].rows == 0) { /* nothing to run: it leaves at once, holding no slot */
                add_empty(out, &b, q);
                continue;
            }
            running[nrun++] = q;
        }
        if (nrun == 0) { /* idle until the next arrival */
            if (head < R && arrival_s && arrival_s[head] > now) now = arrival_s[head];
            continue;
        }
        /* the items: decode rows, then prompt chunks, each oldest admitted first */
        fmoe_sim_iteration *it;
        if ((rc = iteration_open(out, &b, nrun, &it)) < 0) goto done;
        int32_t budget = batch_tokens;
        memset(taken, 0, (size_t)nrun);
        for (int64_t i = 0; i < nrun; i++) {
            const int64_t q = running[i];
            if (b.phase[rq[q].row0 + rq[q].next] == 0) continue;
            add_item(out, in, it, &b, q, 1);
            taken[i] = 1;
            budget--;
        }
        for (int64_t i = 0; i < nrun && budget > 0; i++) {
            const batch_req *r = &rq[running[i]];
            if (taken[i]) continue;
            int64_t n = 1; /* a chunk of the prompt run, within the budget */
            while (n < budget && r->next + n < r->rows && b.phase[r->row0 + r->next + n] == 0) n++;
            add_item(out, in, it, &b, running[i], n);
            budget -= (int32_t)n;
        }
        if ((rc = iteration_close(out, &b, it, scratch)) < 0) goto done;
        if (arrival_s) now += nominal_s(out, it, costs);
        /* finished requests leave */
        int64_t kept = 0;
        for (int64_t i = 0; i < nrun; i++)
            if (rq[running[i]].next < rq[running[i]].rows) running[kept++] = running[i];
        nrun = kept;
    }
    out->num_tokens = b.tok;
    FMOE_ASSERT(b.tok == in->num_tokens && b.left == R && b.started == R && admitted == R);
done:
    free(running);
    free(scratch);
    free(taken);
    batch_build_free(&b);
    if (rc < 0) fmoe_sim_workload_free(out);
    return rc;
}

/* ------------------------------------------------------------------ served passes */

/* One item of a served trace: a request's rows of one pass. */
typedef struct served_item {
    int64_t pass;     /* the trace's served_iteration */
    int64_t rank;     /* the request's admission order */
    int64_t request;  /* index into requests[] */
    int64_t row;      /* its first row, from the request's first */
    int32_t n;        /* rows */
    int32_t decode;   /* 1: a decode token (goes before the prompt chunks) */
} served_item;

/* The engine's order: by pass, decode tokens before prompt chunks, oldest admitted first. */
static int cmp_served_item(const void *pa, const void *pb) {
    const served_item *a = pa, *b = pb;
    if (a->pass != b->pass) return a->pass < b->pass ? -1 : 1;
    if (a->decode != b->decode) return a->decode ? -1 : 1;
    return (a->rank > b->rank) - (a->rank < b->rank);
}

/* Admission order: by id (the engine's admission index), then replay order. */
typedef struct id_index {
    int64_t id, request;
} id_index;

static int cmp_by_id(const void *pa, const void *pb) {
    const id_index *a = pa, *b = pb;
    if (a->id != b->id) return a->id < b->id ? -1 : 1;
    return (a->request > b->request) - (a->request < b->request);
}

int fmoe_sim_workload_served(fmoe_sim_workload *out, const fmoe_sim_workload *in) {
    memset(out, 0, sizeof *out);
    FMOE_RETURN_ERROR_IF(in->batch > 0, FMOE_EINVAL, "workload: already batched");
    FMOE_RETURN_ERROR_IF(!in->served_iteration && in->num_tokens > 0, FMOE_EINVAL,
                         "workload: no served iterations (read the trace with "
                         "FMOE_SIM_WANT_SERVED)");
    batch_build b;
    FMOE_FORWARD_IF_ERROR(batch_build_init(out, in, 1, &b));
    const int64_t R = in->num_requests, T = in->num_tokens;
    batch_req *rq = b.rq;
    served_item *items = malloc((size_t)(T ? T : 1) * sizeof *items); /* at most one a row */
    id_index *byid = malloc((size_t)(R ? R : 1) * sizeof *byid); /* [R] admission order */
    int64_t *scratch = NULL;
    int64_t n_items = 0;
    int rc = 0;
    if (!items || !byid) {
        rc = fmoe_error_set(FMOE_ENOMEM, "served passes of %lld tokens", (long long)T);
        goto done;
    }
    for (int64_t q = 0; q < R; q++) byid[q] = (id_index){in->requests[q].id, q};
    qsort(byid, (size_t)R, sizeof *byid, cmp_by_id);
    for (int64_t k = 0; k < R; k++) rq[byid[k].request].rank = k;
    /* Each request's rows into items: runs of one pass and one phase. */
    for (int64_t q = 0; q < R; q++) {
        const batch_req *r = &rq[q];
        const int64_t *pass = in->served_iteration + r->row0;
        for (int64_t t = 0, e; t < r->rows; t = e) {
            for (e = t + 1; e < r->rows && pass[e] == pass[t] && b.phase[r->row0 + e] == 0 &&
                            b.phase[r->row0 + t] == 0;
                 e++) {
            }
            if (t > 0 && pass[t] <= pass[t - 1]) {
                rc = fmoe_error_set(FMOE_EFORMAT,
                                    "request %lld: token %lld ran in pass %lld, not after the "
                                    "pass %lld of the token before it",
                                    (long long)in->requests[q].id, (long long)t,
                                    (long long)pass[t], (long long)pass[t - 1]);
                goto done;
            }
            items[n_items++] = (served_item){.pass = pass[t], .rank = r->rank, .request = q,
                                             .row = t, .n = (int32_t)(e - t),
                                             .decode = b.phase[r->row0 + t] != 0};
        }
    }
    qsort(items, (size_t)n_items, sizeof *items, cmp_served_item);
    int64_t widest = 1; /* the most items of a pass */
    for (int64_t i = 0, e; i < n_items; i = e) {
        for (e = i + 1; e < n_items && items[e].pass == items[i].pass; e++) {
        }
        if (e - i > widest) widest = e - i;
    }
    out->batch = widest > INT32_MAX ? INT32_MAX : (int32_t)widest;
    if (!(scratch = malloc((size_t)widest * sizeof *scratch))) {
        rc = fmoe_error_set(FMOE_ENOMEM, "a pass of %lld items", (long long)widest);
        goto done;
    }
    for (int64_t k = 0; k < R; k++) /* requests without rows start and end first */
        if (rq[byid[k].request].rows == 0) add_empty(out, &b, byid[k].request);
    for (int64_t i = 0, e; i < n_items; i = e) {
        for (e = i + 1; e < n_items && items[e].pass == items[i].pass; e++) {
        }
        fmoe_sim_iteration *it;
        if ((rc = iteration_open(out, &b, e - i, &it)) < 0) goto done;
        for (int64_t k = i; k < e; k++) {
            /* A request's items are in pass order and its passes increase, so each item
             * is the request's next rows. */
            FMOE_ASSERT(rq[items[k].request].next == items[k].row);
            add_item(out, in, it, &b, items[k].request, items[k].n);
        }
        if ((rc = iteration_close(out, &b, it, scratch)) < 0) goto done;
    }
    out->num_tokens = b.tok;
    FMOE_ASSERT(b.tok == T && b.left == R && b.started == R);
done:
    free(items);
    free(byid);
    free(scratch);
    batch_build_free(&b);
    if (rc < 0) fmoe_sim_workload_free(out);
    return rc;
}
