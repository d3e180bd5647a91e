/*
 * forward_driver - runs a model on a token sequence for the Python cross-checks
 * (tests/python/test_forward.py) and for quick benchmarks.
 *
 *   forward_driver DIR --tokens 1,2,3 [--logits OUT.f32] [--routes OUT.json]
 *                  [--generate N] [--stepwise] [--batch B] [--threads T]
 *                  [--max-context C] [--temperature T] [--top-k K] [--top-p P]
 *                  [--seed S] [--speculative S] [--backend cpu|cuda|auto] [--bench]
 *                  [--activations f32|q8] [--warmup] [--decode-from-empty]
 *
 * --logits writes the logits of every prompt token as raw little-endian float32 [n][V].
 * --routes writes JSON: prompt, generated tokens, and for every token run (the prompt and
 * each generated token fed back) the chosen experts [T][L][K], their weights and the full
 * gate probabilities [T][L][J].
 * --stepwise feeds the prompt one token at a time (exercises the KV cache).
 * --backend runs the session there (fmoe_backend_choose; default cpu, the reference).
 * --session-backend cuda asks fmoe_session_init for CUDA without fmoe_backend_choose's look
 * for a device first, so the session's own refusals (a quantized GGUF model) are seen on
 * any machine.
 * --activations q8 multiplies quantized weights by inputs quantised to 8 bits
 * (fmoe_session_options.activations, the commands' --activations).
 * --bench prints one JSON line with prefill and decode tokens/s. Without --logits it asks
 * for the last prompt token's logits only, as llama-bench's prompt test does.
 * --warmup runs the prompt once untimed and clears the cache before the timed prefill, as
 * llama-bench's warmup run does: the timed pass then finds the weights' pages mapped and
 * the session's buffers touched (a first pass also pays the page faults of every routed
 * expert it reads first, which the load does not touch: docs/cpu.md, Threads).
 * --decode-from-empty times the decode as llama-bench's tg test does: after the timed
 * prefill the cache is cleared and --generate N single-token steps run from position 0,
 * fed the prompt's tokens in turn rather than sampled ones (llama-bench feeds random ones
 * and samples nothing). Without it the N - 1 timed steps follow the prompt in the cache,
 * so each step's attention reads prompt + i positions: at a 64-token prompt that is several
 * times the attention of llama-bench's tg steps, and the sampler runs on every step.
 * Exit status 0, or 1 with the error detail on stderr.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fmoe/error.h"
#include "fmoe/model.h"
#include "fmoe/sampler.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int parse_tokens(const char *s, int32_t **out, int32_t *n) {
    int32_t cap = 16, cnt = 0;
    int32_t *v = malloc((size_t)cap * sizeof *v);
    if (!v) return -1;
    const char *p = s;
    while (*p) {
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p) {
            free(v);
            return -1;
        }
        if (cnt == cap) {
            cap *= 2;
            int32_t *nv = realloc(v, (size_t)cap * sizeof *nv);
            if (!nv) {
                free(v);
                return -1;
            }
            v = nv;
        }
        v[cnt++] = (int32_t)x;
        p = end;
        if (*p == ',') p++;
    }
    *out = v;
    *n = cnt;
    return 0;
}

static void write_f32_list(FILE *f, const float *v, int32_t n) {
    fputc('[', f);
    for (int32_t i = 0; i < n; i++) fprintf(f, i ? ",%.9g" : "%.9g", v[i]);
    fputc(']', f);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: forward_driver DIR --tokens 1,2,3 [options]\n");
        return 2;
    }
    const char *dir = argv[1], *tokens_arg = NULL, *logits_path = NULL, *routes_path = NULL;
    int32_t generate = 0, stepwise = 0, bench = 0, spec = 0, warmup = 0, from_empty = 0;
    fmoe_session_options so = fmoe_session_defaults();
    fmoe_sampler_params sp = {0.0f, 0, 1.0f, 0};
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--stepwise")) { stepwise = 1; continue; }
        if (!strcmp(a, "--bench")) { bench = 1; continue; }
        if (!strcmp(a, "--warmup")) { warmup = 1; continue; }
        if (!strcmp(a, "--decode-from-empty")) { from_empty = 1; continue; }
        if (!v) { fprintf(stderr, "forward_driver: %s needs a value\n", a); return 2; }
        i++;
        if (!strcmp(a, "--tokens")) tokens_arg = v;
        else if (!strcmp(a, "--logits")) logits_path = v;
        else if (!strcmp(a, "--routes")) routes_path = v;
        else if (!strcmp(a, "--generate")) generate = atoi(v);
        else if (!strcmp(a, "--batch")) so.max_batch = atoi(v);
        else if (!strcmp(a, "--threads")) so.threads = atoi(v);
        else if (!strcmp(a, "--max-context")) so.max_context = atoi(v);
        else if (!strcmp(a, "--temperature")) sp.temperature = (float)atof(v);
        else if (!strcmp(a, "--top-k")) sp.top_k = atoi(v);
        else if (!strcmp(a, "--top-p")) sp.top_p = (float)atof(v);
        else if (!strcmp(a, "--seed")) sp.seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--speculative")) spec = atoi(v);
        else if (!strcmp(a, "--activations")) {
            if (strcmp(v, "f32") && strcmp(v, "q8")) {
                fprintf(stderr, "forward_driver: --activations must be f32 or q8, got '%s'\n", v);
                return 2;
            }
            so.activations = !strcmp(v, "q8") ? FMOE_ACTIVATIONS_Q8 : FMOE_ACTIVATIONS_F32;
        }
        else if (!strcmp(a, "--session-backend"))
            so.backend = !strcmp(v, "cuda") ? FMOE_BACKEND_CUDA : FMOE_BACKEND_CPU;
        else if (!strcmp(a, "--backend")) {
            if (fmoe_backend_choose(v, &so.backend) < 0) {
                fprintf(stderr, "forward_driver: %s\n", fmoe_error_detail());
                return 2;
            }
        }
        else { fprintf(stderr, "forward_driver: unknown option %s\n", a); return 2; }
    }
    int32_t *prompt = NULL, n = 0;
    if (!tokens_arg || parse_tokens(tokens_arg, &prompt, &n) < 0 || n < 1) {
        fprintf(stderr, "forward_driver: --tokens needs a comma-separated list of ids\n");
        return 2;
    }
    if (from_empty && (routes_path || spec)) {
        fprintf(stderr, "forward_driver: --decode-from-empty takes no --routes or --speculative\n");
        return 2;
    }

    int rc = 1;
    fmoe_model *m = NULL;
    fmoe_session *s = NULL;
    fmoe_sampler *smp = NULL;
    float *logits = NULL, *probs = NULL, *weights = NULL, *last = NULL, *specbuf = NULL;
    uint16_t *experts = NULL;
    int32_t *gen = NULL;
    FILE *f = NULL;

    if (fmoe_model_load(dir, NULL, &m) < 0) goto fail;
    const fmoe_model_geometry *g = fmoe_model_get_geometry(m);
    const int64_t V = g->vocab_size, L = g->num_moe_layers, J = g->num_experts, K = g->top_k;
    so.all_logits = !(bench && !logits_path);
    if (so.max_context <= 0) so.max_context = n + (generate > 0 ? generate : 0);
    so.speculative_depth = spec;
    if (fmoe_session_init(m, &so, &s) < 0) goto fail;
    if (fmoe_sampler_init(&sp, (int32_t)V, &smp) < 0) goto fail;

    const int64_t T = n + (generate > 0 ? generate : 0);
    logits = malloc((size_t)(n * V) * sizeof *logits);
    last = malloc((size_t)V * sizeof *last);
    experts = calloc((size_t)(T * L * K), sizeof *experts);
    weights = calloc((size_t)(T * L * K), sizeof *weights);
    probs = calloc((size_t)(T * L * J), sizeof *probs);
    specbuf = spec ? calloc((size_t)(T * L * spec * J), sizeof *specbuf) : NULL;
    gen = calloc((size_t)(generate > 0 ? generate : 1), sizeof *gen);
    if (!logits || !last || !experts || !weights || !probs || !gen || (spec && !specbuf)) {
        fmoe_error_set(FMOE_ENOMEM, "out of memory");
        goto fail;
    }

    if (warmup) {
        if (fmoe_session_forward(s, prompt, n, NULL, logits) < 0) goto fail;
        fmoe_session_reset(s);
    }

    /* Prefill (or the prompt token by token). */
    double t0 = now();
    if (stepwise) {
        for (int32_t t = 0; t < n; t++) {
            fmoe_forward_trace tr = {experts + t * L * K, weights + t * L * K, probs + t * L * J,
                                     NULL, specbuf ? specbuf + t * L * spec * J : NULL, NULL,
                                     NULL};
            if (fmoe_session_forward(s, prompt + t, 1, &tr, logits + t * V) < 0) goto fail;
        }
    } else {
        fmoe_forward_trace tr = {experts, weights, probs, NULL, specbuf, NULL, NULL};
        if (fmoe_session_forward(s, prompt, n, &tr, logits) < 0) goto fail;
    }
    double t1 = now();
    memcpy(last, logits + (so.all_logits || stepwise ? (int64_t)(n - 1) * V : 0),
           (size_t)V * sizeof *last);

    /* Generation: each token but the last is fed back. */
    int32_t fed = 0;
    if (from_empty) fmoe_session_reset(s);
    double t2 = now();
    for (int32_t i = 0; from_empty && i < generate; i++) {
        gen[i] = prompt[i % n];
        if (fmoe_session_forward(s, &gen[i], 1, NULL, last) < 0) goto fail;
        fed++;
    }
    for (int32_t i = 0; !from_empty && i < generate; i++) {
        gen[i] = fmoe_sampler_sample(smp, last);
        if (i + 1 == generate) break;
        const int64_t t = n + i;
        fmoe_forward_trace tr = {experts + t * L * K, weights + t * L * K, probs + t * L * J, NULL,
                                 specbuf ? specbuf + t * L * spec * J : NULL, NULL, NULL};
        if (fmoe_session_forward(s, &gen[i], 1, &tr, last) < 0) goto fail;
        fed++;
    }
    double t3 = now();

    if (logits_path) {
        if (!(f = fopen(logits_path, "wb")) ||
            fwrite(logits, sizeof *logits, (size_t)(n * V), f) != (size_t)(n * V)) {
            fmoe_error_set(FMOE_EIO, "%s: cannot write", logits_path);
            goto fail;
        }
        fclose(f);
        f = NULL;
    }
    if (routes_path) {
        if (!(f = fopen(routes_path, "w"))) {
            fmoe_error_set(FMOE_EIO, "%s: cannot write", routes_path);
            goto fail;
        }
        const int64_t ran = n + fed;
        fprintf(f, "{\"prompt\":[");
        for (int32_t i = 0; i < n; i++) fprintf(f, i ? ",%d" : "%d", prompt[i]);
        fprintf(f, "],\n\"generated\":[");
        for (int32_t i = 0; i < generate; i++) fprintf(f, i ? ",%d" : "%d", gen[i]);
        fprintf(f, "],\n\"experts\":[");
        for (int64_t t = 0; t < ran; t++) {
            fprintf(f, t ? ",[" : "[");
            for (int64_t l = 0; l < L; l++) {
                fprintf(f, l ? ",[" : "[");
                for (int64_t k = 0; k < K; k++)
                    fprintf(f, k ? ",%d" : "%d", experts[(t * L + l) * K + k]);
                fprintf(f, "]");
            }
            fprintf(f, "]");
        }
        fprintf(f, "],\n\"weights\":[");
        for (int64_t t = 0; t < ran; t++) {
            fprintf(f, t ? ",[" : "[");
            for (int64_t l = 0; l < L; l++) {
                if (l) fputc(',', f);
                write_f32_list(f, weights + (t * L + l) * K, (int32_t)K);
            }
            fprintf(f, "]");
        }
        fprintf(f, "],\n\"probs\":[");
        for (int64_t t = 0; t < ran; t++) {
            fprintf(f, t ? ",[" : "[");
            for (int64_t l = 0; l < L; l++) {
                if (l) fputc(',', f);
                write_f32_list(f, probs + (t * L + l) * J, (int32_t)J);
            }
            fprintf(f, "]");
        }
        if (specbuf) {
            fprintf(f, "],\n\"speculative\":[");
            for (int64_t t = 0; t < ran; t++) {
                fprintf(f, t ? ",[" : "[");
                for (int64_t l = 0; l < L; l++) {
                    fprintf(f, l ? ",[" : "[");
                    for (int32_t sd = 0; sd < spec; sd++) {
                        if (sd) fputc(',', f);
                        write_f32_list(f, specbuf + ((t * L + l) * spec + sd) * J, (int32_t)J);
                    }
                    fprintf(f, "]");
                }
                fprintf(f, "]");
            }
        }
        fprintf(f, "]}\n");
        if (fclose(f) != 0) {
            f = NULL;
            fmoe_error_set(FMOE_EIO, "%s: cannot write", routes_path);
            goto fail;
        }
        f = NULL;
    }
    if (bench)
        printf("{\"model\": \"%s\", \"prompt_tokens\": %d, \"prefill_s\": %.6f, "
               "\"prefill_tok_s\": %.2f, \"decode_tokens\": %d, \"decode_s\": %.6f, "
               "\"decode_tok_s\": %.2f}\n",
               fmoe_model_describe(m), n, t1 - t0, n / (t1 - t0), fed, t3 - t2,
               fed > 0 ? fed / (t3 - t2) : 0.0);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "forward_driver: %s\n", fmoe_error_detail());
done:
    if (f) fclose(f);
    free(prompt);
    free(logits);
    free(last);
    free(experts);
    free(weights);
    free(probs);
    free(specbuf);
    free(gen);
    fmoe_sampler_free(smp);
    fmoe_session_free(s);
    fmoe_model_free(m);
    return rc;
}
