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
    if (!w->stamp || !w->count || !w->order) {
        fmoe_sim_workload_free(w);
        return fmoe_error_set(FMOE_ENOMEM, "workload scratch");
    }
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
    free(w->count);
    free(w->order);
    free(w->probs);
    free(w->speculative);
    free(w->semantic);
    free(w->items);
    free(w->admit_order);
    free(w->leave_order);
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
 * tokens whole, or its next prefill_chunk tokens (DESIGN.md §7.1). */
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
 * probabilities, speculative rows, semantic rows, with strides); gathering the rows once
 * here keeps every reader as it is, at the price of a second copy of the rows while both
 * workloads live (fmoe simulate frees the first). */

/* The scheduler's view of one request of the source workload. */
typedef struct batch_req {
    int64_t row0;   /* its first row in the source */
    int64_t rows;   /* its rows: prompt, then decode */
    int64_t next;   /* rows run so far */
    int64_t rank;   /* admission order: prompt chunks go oldest first */
} batch_req;

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

/* Copies row `from` of `in` to row `to` of `out` (routing and whatever gate data). */
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
}

/* Appends to iteration `it` request q's next n rows (r->next on) as one item. */
static void add_item(fmoe_sim_workload *out, const fmoe_sim_workload *in,
                     fmoe_sim_iteration *it, int64_t q, const batch_req *r,
                     const uint8_t *phase, int64_t n, int64_t *tok) {
    const int64_t context = r->next + n;
    const int prompt = phase[r->row0 + r->next] == 0;
    const int last_prompt = prompt && (context == r->rows || phase[r->row0 + context] != 0);
    out->items[out->num_items++] = (fmoe_sim_item){
        .request = q, .phase = !prompt, .num_tokens = (int32_t)n, .context = context,
        .last_prompt = last_prompt};
    for (int64_t u = 0; u < n; u++) copy_row(out, in, *tok + u, r->row0 + r->next + u);
    *tok += n;
    it->num_items++;
    it->num_tokens += (int32_t)n;
    it->yields += !prompt || last_prompt;
    if (context > it->context) it->context = context;
    it->kv_context += context;
    it->token_context += n * context;
}

int fmoe_sim_workload_batch(fmoe_sim_workload *out, const fmoe_sim_workload *in,
                            int32_t batch, const double *arrival_s,
                            const fmoe_sim_costs *costs) {
    memset(out, 0, sizeof *out);
    FMOE_RETURN_ERROR_IF(batch < 1 || batch > (1 << 20), FMOE_EINVAL,
                         "batch must be in [1, %d], got %d", 1 << 20, batch);
    FMOE_RETURN_ERROR_IF(in->batch > 0, FMOE_EINVAL, "workload: already batched");
    FMOE_RETURN_ERROR_IF(arrival_s && !costs, FMOE_EINVAL,
                         "workload: batching with arrival times needs the cost model");
    for (int64_t q = 0; arrival_s && q < in->num_requests; q++)
        FMOE_RETURN_ERROR_IF(!(arrival_s[q] >= 0) || !isfinite(arrival_s[q]), FMOE_EINVAL,
                             "arrival time of request %lld is %g", (long long)q, arrival_s[q]);
    FMOE_FORWARD_IF_ERROR(fmoe_sim_workload_init(out, in->num_layers, in->num_experts,
                                                 in->top_k, in->expert_bytes));
    const int32_t L = in->num_layers, K = in->top_k;
    const int64_t R = in->num_requests, T = in->num_tokens;
    const size_t LJ = (size_t)L * in->num_experts;
    out->prefill_chunk = in->prefill_chunk;
    out->probs_kind = in->probs ? in->probs_kind : FMOE_PROBS_NONE;
    out->speculative_depth = in->speculative ? in->speculative_depth : 0;
    out->semantic_dim = in->semantic ? in->semantic_dim : 0;
    out->batch = batch;
    batch_req *rq = calloc((size_t)(R ? R : 1), sizeof *rq);
    uint8_t *phase = malloc((size_t)(T ? T : 1));     /* [T] each source row's phase */
    int64_t *slot = malloc((size_t)batch * sizeof *slot); /* [B] request, or -1 free */
    uint8_t *taken = calloc((size_t)batch, 1);          /* [B] slot has an item this iteration */
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
    int rc = 0;
    if (!rq || !phase || !slot || !taken || !out->requests || !out->admit_order ||
        !out->leave_order || !out->experts || (out->probs_kind != FMOE_PROBS_NONE && !out->probs) ||
        (out->speculative_depth && !out->speculative) || (out->semantic_dim && !out->semantic)) {
        rc = fmoe_error_set(FMOE_ENOMEM, "batched workload of %lld tokens", (long long)T);
        goto done;
    }
    out->cap_requests = out->num_requests = R;
    out->cap_tokens = T;
    for (int64_t i = 0; i < in->num_iterations; i++)
        memset(phase + in->iterations[i].token_begin, in->iterations[i].phase ? 1 : 0,
               (size_t)in->iterations[i].num_tokens);
    for (int64_t q = 0; q < R; q++) {
        const fmoe_sim_request *s = &in->requests[q];
        out->requests[q] = *s;
        if (s->num_iterations > 0) {
            const fmoe_sim_iteration *a = &in->iterations[s->first_iteration];
            const fmoe_sim_iteration *b = a + s->num_iterations - 1;
            rq[q].row0 = a->token_begin;
            rq[q].rows = b->token_begin + b->num_tokens - a->token_begin;
        }
    }
    for (int32_t b = 0; b < batch; b++) slot[b] = -1;

    double now = 0;  /* the compute-only clock; only admissions with arrival times read it */
    int64_t head = 0, running = 0, admitted = 0, left = 0, tok = 0;
    while (head < R || running > 0) {
        /* admission: the queue's head, while a slot is free and it has arrived */
        while (head < R && running < batch && (!arrival_s || arrival_s[head] <= now)) {
            const int64_t q = head++;
            out->requests[q].admit_iteration = out->num_iterations;
            out->requests[q].first_iteration = out->num_iterations;
            out->requests[q].num_iterations = 0;
            rq[q].rank = admitted;
            out->admit_order[admitted++] = q;
            if (rq[q].rows == 0) { /* nothing to run: it leaves at once, holding no slot */
                out->requests[q].leave_iteration = -1;
                out->leave_order[left++] = q;
                continue;
            }
            int32_t b = 0;
            while (slot[b] >= 0) b++;
            slot[b] = q;
            running++;
        }
        if (running == 0) { /* idle until the next arrival */
            if (head < R && arrival_s && arrival_s[head] > now) now = arrival_s[head];
            continue;
        }
        /* the items: decode rows in slot order, then prompt chunks oldest first */
        if ((rc = reserve_iterations(out, out->num_iterations + 1)) < 0 ||
            (rc = grow((void **)&out->items, &out->cap_items, out->num_items + running,
                       sizeof *out->items)) < 0)
            goto done;
        fmoe_sim_iteration *it = &out->iterations[out->num_iterations];
        *it = (fmoe_sim_iteration){.token_begin = tok, .item_begin = out->num_items};
        int32_t budget = FMOE_SIM_BATCH_TOKENS;
        memset(taken, 0, (size_t)batch);
        for (int32_t b = 0; b < batch; b++) {
            const int64_t q = slot[b];
            if (q < 0 || phase[rq[q].row0 + rq[q].next] == 0) continue;
            add_item(out, in, it, q, &rq[q], phase, 1, &tok);
            taken[b] = 1;
            budget--;
        }
        const int32_t decode_items = it->num_items;
        while (budget > 0) {
            int32_t pick = -1;
            for (int32_t b = 0; b < batch; b++) {
                const int64_t q = slot[b];
                if (q < 0 || taken[b] || phase[rq[q].row0 + rq[q].next] != 0) continue;
                if (pick < 0 || rq[q].rank < rq[slot[pick]].rank) pick = b;
            }
            if (pick < 0) break;
            batch_req *r = &rq[slot[pick]];
            int64_t n = 1; /* a chunk of the prompt run, within the budget */
            while (n < budget && r->next + n < r->rows && phase[r->row0 + r->next + n] == 0) n++;
            add_item(out, in, it, slot[pick], r, phase, n, &tok);
            taken[pick] = 1;
            budget -= (int32_t)n;
        }
        const fmoe_sim_item *first = &out->items[it->item_begin];
        it->request = first->request;
        it->phase = decode_items == it->num_items ? 1 : 0; /* decode only if all items are */
        it->access_begin = out->num_accesses;
        if ((rc = reserve_accesses(out, out->num_accesses + (int64_t)it->num_tokens * L * K)) < 0)
            goto done;
        compile_iteration(out, out->experts + (size_t)it->token_begin * L * K, it->num_tokens);
        if (arrival_s) now += nominal_s(out, it, costs);
        /* the items advance; finished requests leave, in slot order */
        for (int32_t c = 0; c < it->num_items; c++)
            rq[first[c].request].next += first[c].num_tokens;
        for (int32_t b = 0; b < batch; b++) {
            const int64_t q = slot[b];
            if (q < 0 || rq[q].next < rq[q].rows) continue;
            out->requests[q].leave_iteration = out->num_iterations;
            out->requests[q].num_iterations =
                out->num_iterations + 1 - out->requests[q].admit_iteration;
            out->leave_order[left++] = q;
            slot[b] = -1;
            running--;
        }
        out->num_iterations++;
    }
    out->num_tokens = tok;
    FMOE_ASSERT(tok == T && left == R && admitted == R);
done:
    free(rq);
    free(phase);
    free(slot);
    free(taken);
    if (rc < 0) fmoe_sim_workload_free(out);
    return rc;
}
