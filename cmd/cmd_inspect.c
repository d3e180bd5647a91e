/*
 * cmd_inspect.c - `fmoe inspect FILE [--json]`: summarise any fmoe file.
 *
 * What a file is comes from its first bytes (inspect_sniff): a GGUF file, or one meant to
 * be (a .gguf name, a magic one byte off), goes to cmd/inspect_gguf.c, whose reader names a
 * bad magic; a file with HDF5's signature to the readers below; anything else is one line
 * naming its first bytes (a safetensors file by name). For a trace: model and geometry,
 * requests, tokens by phase, probabilities kind, per-layer expert popularity, and the
 * predictability analysis of the fMoE paper ("fMoE: Fine-Grained Expert Offloading for
 * Large Mixture-of-Experts Serving") §2.4 (Fig. 3b/3c): mean Shannon entropy per layer of
 * expert activations at request level (coarse) versus iteration level (fine).
 */
#include <cjson/cJSON.h>
#include <stddef.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmd_common.h"
#include "fmoe/analysis.h"
#include "fmoe/error.h"
#include "files.h"
#include "fmoe/predictor.h"
#include "fmoe/trace.h"

#define AGGREGATED_ITERATIONS 64

static const char *const CMD = "inspect";

typedef struct inspect_opts {
    int json, quiet, plugin_path;
} inspect_opts;

static const cmd_option inspect_options[] = {
    {.name = "json", .kind = CMD_OPT_FLAG, .help = "print one JSON document instead of text",
     .offset = offsetof(inspect_opts, json)},
    {.name = "plugin-path", .kind = CMD_OPT_FLAG,
     .help = "print the folder holding libh5zstd.so (for HDF5_PLUGIN_PATH)",
     .offset = offsetof(inspect_opts, plugin_path)},
    {.name = "quiet", .short_name = 'q', .kind = CMD_OPT_FLAG, .help = "no progress bar",
     .offset = offsetof(inspect_opts, quiet)},
    {0},
};

const cmd_spec cmd_inspect_spec = {
    .name = "inspect",
    .usage = "inspect FILE [--json]\n"
             "inspect --plugin-path",
    .description =
        "Summarise an fmoe file: a trace (fmoe record, fmoe trace import) or an\n"
        "expert-map store (fmoe build-store). For a trace: model, geometry, requests,\n"
        "tokens by phase, probabilities kind, per-layer expert popularity, and the\n"
        "predictability analysis\n"
        "of the fMoE paper (§2.4, Fig. 3): mean Shannon entropy per layer of expert\n"
        "activations aggregated per request (coarse) versus per iteration (fine).\n"
        "For a store: capacity, fill, source traces, split, and the distribution of\n"
        "nearest-neighbour similarity between entries. For a learned predictor (fmoe\n"
        "train-predictor): its kind, model, shapes and validation accuracy per layer.\n"
        "For a GGUF file: architecture, geometry, fingerprint, tensor types and the\n"
        "routed experts' types (docs/quantization.md).\n",
    .options = inspect_options,
    .max_positional = -1, /* exactly one FILE, checked below with its own message */
    .size = sizeof(inspect_opts),
};

typedef struct layer_popularity {
    int32_t top_expert;
    double top_share;     /* share of the layer's activations taken by its top expert */
    double topk_share;    /* share taken by its K most used experts */
    int32_t unused;       /* experts never chosen */
    double entropy_bits;  /* entropy of the whole-trace popularity */
} layer_popularity;

static int cmp_desc_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x < y) - (x > y);
}

static void layer_popularity_compute(const fmoe_routing_stats *s, int32_t l, int64_t *scratch,
                                     layer_popularity *out) {
    const int32_t J = s->num_experts;
    const int64_t *c = s->expert_counts + (size_t)l * J;
    int64_t total = 0;
    memset(out, 0, sizeof *out);
    for (int32_t j = 0; j < J; j++) {
        total += c[j];
        if (c[j] > c[out->top_expert]) out->top_expert = j;
        if (c[j] == 0) out->unused++;
        scratch[j] = c[j];
    }
    qsort(scratch, (size_t)J, sizeof *scratch, cmp_desc_i64);
    int64_t topk = 0;
    for (int32_t k = 0; k < s->top_k && k < J; k++) topk += scratch[k];
    out->top_share = total ? (double)c[out->top_expert] / (double)total : 0.0;
    out->topk_share = total ? (double)topk / (double)total : 0.0;
    out->entropy_bits = fmoe_entropy_bits(c, J);
}

static int compute_stats(fmoe_trace_reader *r, int quiet, fmoe_routing_stats **out) {
    const fmoe_trace_header *h = fmoe_trace_reader_header(r);
    const int32_t L = h->num_layers, K = h->top_k;
    int64_t nreq = fmoe_trace_reader_num_requests(r), nit = 0;
    const fmoe_trace_request_info *req = fmoe_trace_reader_requests(r);
    const fmoe_trace_iteration *it = fmoe_trace_reader_iterations(r, &nit);
    int64_t max_tokens = 1;
    for (int64_t i = 0; i < nreq; i++)
        if (req[i].token_count > max_tokens) max_tokens = req[i].token_count;
    uint16_t *experts = malloc((size_t)max_tokens * (size_t)L * (size_t)K * sizeof *experts);
    if (!experts) return fmoe_error_set(FMOE_ENOMEM, "%lld tokens of experts", (long long)max_tokens);
    int rc = fmoe_routing_stats_init(out, L, h->num_experts, K, AGGREGATED_ITERATIONS);
    if (rc < 0) {
        free(experts);
        return rc;
    }
    cmd_progress_bar bar;
    cmd_progress_bar_init(&bar, "inspect", quiet);
    fmoe_progress progress = cmd_progress_bar_callback(&bar);
    int64_t k = 0; /* next iteration */
    for (int64_t q = 0; q < nreq && rc == 0; q++) {
        fmoe_trace_token_buffers buf = {.experts = experts};
        rc = fmoe_trace_reader_read_tokens(r, req[q].token_begin, req[q].token_count, &buf);
        if (rc < 0) break;
        fmoe_routing_stats_begin_request(*out);
        for (; k < nit && it[k].request == q; k++) {
            int64_t first = it[k].token_begin - req[q].token_begin;
            fmoe_routing_stats_add_iteration(*out, it[k].phase, it[k].num_tokens,
                                             experts + (size_t)first * L * K);
        }
        fmoe_routing_stats_end_request(*out);
        fmoe_progress_report(&progress, q + 1, nreq, "requests");
    }
    cmd_progress_bar_done(&bar);
    free(experts);
    if (rc < 0) {
        fmoe_routing_stats_free(*out);
        *out = NULL;
        return rc;
    }
    fmoe_routing_stats_finish(*out);
    return 0;
}

static double mean(const double *v, int32_t n) {
    double s = 0;
    for (int32_t i = 0; i < n; i++) s += v[i];
    return n ? s / n : 0.0;
}

static void print_trace_text(const char *path, fmoe_trace_reader *r, const fmoe_routing_stats *s) {
    const fmoe_trace_header *h = fmoe_trace_reader_header(r);
    char size[32];
    int64_t nit = 0;
    fmoe_trace_reader_iterations(r, &nit);
    printf("%s: fmoe trace, version %d\n", path, FMOE_TRACE_VERSION);
    printf("  model        %s\n", h->model_name[0] ? h->model_name : "(unnamed)");
    printf("  fingerprint  %s\n", h->model_fingerprint[0] ? h->model_fingerprint : "(none)");
    /* hidden_size 0 means unknown (an ids-only import without a config.json): left out */
    printf("  geometry     %d MoE layers, %d experts, top-%d", h->num_layers, h->num_experts,
           h->top_k);
    if (h->hidden_size > 0) printf(", hidden %d", h->hidden_size);
    printf(", %d shared\n", h->shared_experts);
    printf("  expert size  %s (%s), all routed experts %s\n",
           cmd_format_bytes((double)h->expert_bytes, size, sizeof size), h->dtype,
           cmd_format_bytes((double)h->expert_bytes * h->num_layers * h->num_experts,
                            (char[32]){0}, 32));
    printf("  probs        %s%s\n", fmoe_probs_kind_name(h->probs_kind),
           h->probs_kind == FMOE_PROBS_NONE ? "" : (h->probs_half ? " (float16)" : " (float32)"));
    printf("  semantic     %s\n", h->semantic_dim ? h->semantic_kind : "none");
    if (h->speculative_depth)
        printf("  speculative  gates of layers l+1..l+%d\n", h->speculative_depth);
    else
        printf("  speculative  none\n");
    if (h->hidden_dim)
        printf("  hidden       gate inputs, float16, %d wide\n", h->hidden_dim);
    else
        printf("  hidden       none\n");
    if (h->timing_layers)
        printf("  timing       measured seconds per layer (%d decoder layers) and iteration\n",
               h->timing_layers);
    else
        printf("  timing       none\n");
    printf("  dataset      %s\n", h->dataset[0] ? h->dataset : "(unknown)");
    printf("  recorded on  %s, %s, fmoe %s\n", h->recorded_on, h->created, h->fmoe_version);
    if (h->activations[0]) printf("  activations  %s\n", h->activations);
    printf("  requests     %lld\n", (long long)fmoe_trace_reader_num_requests(r));
    printf("  tokens       %lld (prefill %lld, decode %lld) in %lld iterations\n",
           (long long)fmoe_trace_reader_num_tokens(r), (long long)s->prefill_tokens,
           (long long)s->decode_tokens, (long long)nit);
    printf("\nexpert popularity per layer (uniform routing: top-1 share %.3f, top-%d share %.3f, "
           "entropy %.2f bits)\n",
           1.0 / h->num_experts, h->top_k, (double)h->top_k / h->num_experts,
           log2((double)h->num_experts));
    printf("  layer  top expert  top-1 share  top-%d share  unused  entropy\n", h->top_k);
    int64_t *scratch = malloc((size_t)h->num_experts * sizeof *scratch);
    for (int32_t l = 0; scratch && l < h->num_layers; l++) {
        layer_popularity p;
        layer_popularity_compute(s, l, scratch, &p);
        printf("  %5d  %10d  %11.3f  %11.3f  %6d  %7.2f\n", l, p.top_expert, p.top_share,
               p.topk_share, p.unused, p.entropy_bits);
    }
    free(scratch);
    printf("\npredictability (fMoE §2.4, Fig. 3b): mean entropy of expert activations, bits\n");
    printf("  layer  coarse (per request)  fine (per iteration)\n");
    for (int32_t l = 0; l < h->num_layers; l++)
        printf("  %5d  %20.3f  %20.3f\n", l, s->coarse_entropy[l], s->fine_entropy[l]);
    printf("  mean   %20.3f  %20.3f\n", mean(s->coarse_entropy, h->num_layers),
           mean(s->fine_entropy, h->num_layers));
    if (s->aggregated_len > 1) {
        printf("\nentropy as iterations aggregate (Fig. 3c), mean over layers and requests:\n ");
        int32_t shown = 0;
        for (int32_t i = 0; i < s->aggregated_len; i++) {
            if (i < 8 || (i + 1) % 8 == 0 || i == s->aggregated_len - 1) {
                printf(" %d:%.2f", i + 1, s->aggregated_entropy[i]);
                shown++;
            }
        }
        printf("\n");
    }
}

static cJSON *json_f64_array(const double *v, int32_t n) {
    cJSON *a = cJSON_CreateArray();
    for (int32_t i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
    return a;
}

static void print_trace_json(const char *path, fmoe_trace_reader *r, const fmoe_routing_stats *s) {
    const fmoe_trace_header *h = fmoe_trace_reader_header(r);
    int64_t nit = 0;
    fmoe_trace_reader_iterations(r, &nit);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "file", path);
    cJSON_AddStringToObject(root, "format", FMOE_TRACE_FORMAT);
    cJSON_AddNumberToObject(root, "version", FMOE_TRACE_VERSION);
    cJSON_AddStringToObject(root, "model_name", h->model_name);
    cJSON_AddStringToObject(root, "model_fingerprint", h->model_fingerprint);
    cJSON_AddNumberToObject(root, "num_layers", h->num_layers);
    cJSON_AddNumberToObject(root, "num_experts", h->num_experts);
    cJSON_AddNumberToObject(root, "top_k", h->top_k);
    cJSON_AddNumberToObject(root, "hidden_size", h->hidden_size);
    cJSON_AddNumberToObject(root, "shared_experts", h->shared_experts);
    cJSON_AddNumberToObject(root, "expert_bytes", (double)h->expert_bytes);
    cJSON_AddStringToObject(root, "dtype", h->dtype);
    cJSON_AddStringToObject(root, "dataset", h->dataset);
    cJSON_AddStringToObject(root, "created", h->created);
    cJSON_AddStringToObject(root, "fmoe_version", h->fmoe_version);
    cJSON_AddStringToObject(root, "recorded_on", h->recorded_on);
    if (h->activations[0]) cJSON_AddStringToObject(root, "activations", h->activations);
    cJSON_AddStringToObject(root, "probs_kind", fmoe_probs_kind_name(h->probs_kind));
    cJSON_AddNumberToObject(root, "semantic_dim", h->semantic_dim);
    cJSON_AddNumberToObject(root, "speculative_depth", h->speculative_depth);
    cJSON_AddNumberToObject(root, "hidden_dim", h->hidden_dim);
    cJSON_AddNumberToObject(root, "timing_layers", h->timing_layers);
    cJSON_AddNumberToObject(root, "requests", (double)fmoe_trace_reader_num_requests(r));
    cJSON_AddNumberToObject(root, "tokens", (double)fmoe_trace_reader_num_tokens(r));
    cJSON_AddNumberToObject(root, "prefill_tokens", (double)s->prefill_tokens);
    cJSON_AddNumberToObject(root, "decode_tokens", (double)s->decode_tokens);
    cJSON_AddNumberToObject(root, "iterations", (double)nit);
    cJSON *layers = cJSON_AddArrayToObject(root, "layers");
    int64_t *scratch = malloc((size_t)h->num_experts * sizeof *scratch);
    for (int32_t l = 0; scratch && l < h->num_layers; l++) {
        layer_popularity p;
        layer_popularity_compute(s, l, scratch, &p);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "layer", l);
        cJSON *counts = cJSON_AddArrayToObject(o, "expert_counts");
        for (int32_t j = 0; j < h->num_experts; j++)
            cJSON_AddItemToArray(counts, cJSON_CreateNumber(
                                             (double)s->expert_counts[(size_t)l * h->num_experts + j]));
        cJSON_AddNumberToObject(o, "top_expert", p.top_expert);
        cJSON_AddNumberToObject(o, "top_share", p.top_share);
        cJSON_AddNumberToObject(o, "topk_share", p.topk_share);
        cJSON_AddNumberToObject(o, "unused_experts", p.unused);
        cJSON_AddNumberToObject(o, "popularity_entropy_bits", p.entropy_bits);
        cJSON_AddNumberToObject(o, "coarse_entropy_bits", s->coarse_entropy[l]);
        cJSON_AddNumberToObject(o, "fine_entropy_bits", s->fine_entropy[l]);
        cJSON_AddItemToArray(layers, o);
    }
    free(scratch);
    cJSON *pred = cJSON_AddObjectToObject(root, "predictability");
    cJSON_AddNumberToObject(pred, "coarse_entropy_bits_mean", mean(s->coarse_entropy, h->num_layers));
    cJSON_AddNumberToObject(pred, "fine_entropy_bits_mean", mean(s->fine_entropy, h->num_layers));
    cJSON_AddItemToObject(pred, "entropy_by_aggregated_iterations",
                          json_f64_array(s->aggregated_entropy, s->aggregated_len));
    char *text = cJSON_Print(root);
    if (text) puts(text);
    free(text);
    cJSON_Delete(root);
}

static int inspect_trace(const char *path, int json, int quiet) {
    fmoe_trace_reader *r = NULL;
    fmoe_routing_stats *s = NULL;
    int rc = fmoe_trace_reader_open(&r, path);
    if (rc == 0) rc = compute_stats(r, quiet, &s);
    if (rc < 0) {
        fmoe_trace_reader_close(r);
        return cmd_fail(CMD, rc);
    }
    if (json)
        print_trace_json(path, r, s);
    else
        print_trace_text(path, r, s);
    fmoe_routing_stats_free(s);
    fmoe_trace_reader_close(r);
    return CMD_EXIT_OK;
}

/* A predictor file (fmoe/predictor.h), either kind: read and validated in full. */
static int inspect_predictor(const char *path, int json) {
    fmoe_predictor *p = NULL;
    int rc = fmoe_predictor_read(path, &p);
    if (rc < 0) return cmd_fail(CMD, rc);
    const int duo = fmoe_predictor_kind_id_of(p->kind) == FMOE_PREDICTOR_DUOSERVE;
    const int32_t L = p->num_layers;
    int64_t params = 0;
    if (duo)
        params = p->expert_mlp->num_params;
    else
        for (int32_t i = 1; i < L; i++) params += fmoe_mlp_num_params(&p->layers[i]);
    if (json) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "file", path);
        cJSON_AddStringToObject(d, "format", FMOE_PREDICTOR_FORMAT);
        cJSON_AddStringToObject(d, "kind", p->kind);
        cJSON_AddStringToObject(d, "model_name", p->model_name);
        cJSON_AddStringToObject(d, "model_fingerprint", p->model_fingerprint);
        cJSON_AddNumberToObject(d, "num_layers", L);
        cJSON_AddNumberToObject(d, "num_experts", p->num_experts);
        cJSON_AddNumberToObject(d, "top_k", p->top_k);
        cJSON_AddNumberToObject(d, "stride", p->stride);
        cJSON_AddNumberToObject(d, "params", (double)params);
        cJSON_AddNumberToObject(d, "seed", (double)p->seed);
        cJSON_AddNumberToObject(d, "split", p->split);
        cJSON_AddStringToObject(d, "created", p->created);
        cJSON_AddStringToObject(d, "fmoe_version", p->fmoe_version);
        if (duo) {
            cJSON *w = cJSON_AddArrayToObject(d, "widths");
            for (int32_t i = 0; i <= p->expert_mlp->num_fc; i++)
                cJSON_AddItemToArray(w, cJSON_CreateNumber(p->expert_mlp->width[i]));
        } else {
            cJSON_AddNumberToObject(d, "hidden_size", p->hidden_size);
            cJSON_AddNumberToObject(d, "mlp_hidden", p->mlp_hidden);
        }
        cJSON *ls = cJSON_AddArrayToObject(d, "layers");
        for (int32_t l = 1; l < L; l++) {
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "layer", l);
            const double a = duo ? p->val_all_correct[l] : p->val_accuracy[l];
            cJSON_AddItemToObject(e, duo ? "all_correct" : "accuracy",
                                  isfinite(a) ? cJSON_CreateNumber(a) : cJSON_CreateNull());
            if (duo) {
                const double o = p->val_one_correct[l];
                cJSON_AddItemToObject(e, "one_correct",
                                      isfinite(o) ? cJSON_CreateNumber(o) : cJSON_CreateNull());
            } else {
                cJSON_AddNumberToObject(e, "source_layer", p->source_layer[l]);
            }
            cJSON_AddItemToArray(ls, e);
        }
        cmd_print_json(d);
        fmoe_predictor_free(p);
        return CMD_EXIT_OK;
    }
    printf("%s: %s predictor for %s (fingerprint %.12s), created %s by fmoe %s\n", path,
           duo ? "DuoServe-MoE" : "ProMoE", p->model_name[0] ? p->model_name : "(unnamed model)",
           p->model_fingerprint, p->created, p->fmoe_version);
    printf("  model        %d MoE layers x %d experts, top-%d\n", L, p->num_experts, p->top_k);
    if (duo) {
        printf("  network      ExpertMLP");
        for (int32_t i = 0; i <= p->expert_mlp->num_fc; i++)
            printf("%s%d", i ? " -> " : " ", p->expert_mlp->width[i]);
        printf(", %lld parameters, next layer from expert ids\n", (long long)params);
    } else {
        printf("  network      one MLP per layer %d -> %d -> %d, %lld parameters in all, "
               "stride %d\n",
               p->hidden_size, p->mlp_hidden, p->num_experts, (long long)params, p->stride);
    }
    printf("  trained      seed %lld, split %.2f, on %s%s\n", (long long)p->seed, p->split,
           strcmp(p->target, "none") == 0 ? "expert ids only" : p->target,
           strcmp(p->target, "none") == 0 ? "" : " gate probabilities");
    printf("  validation   %s per layer:", duo ? "all / at least one of the top-K" : "ACCURACY");
    for (int32_t l = 1; l < L; l++) {
        if (duo)
            printf(" %d: %.1f%%/%.1f%%", l, 100 * p->val_all_correct[l],
                   100 * p->val_one_correct[l]);
        else
            printf(" %d: %.1f%%", l, 100 * p->val_accuracy[l]);
    }
    printf("\n");
    fmoe_predictor_free(p);
    return CMD_EXIT_OK;
}

/* ---- what a file is, from its first bytes ---------------------------------------- */

typedef enum inspect_kind {
    INSPECT_OPEN_FAILS, /* not opened here: the HDF5 reader names why (missing, a FIFO, ...) */
    INSPECT_GGUF,       /* the GGUF magic, or a file that means to be one (a .gguf name) */
    INSPECT_HDF5,       /* HDF5's signature at 0 or a user block's end (512, 1024, ...) */
    INSPECT_OTHER,      /* anything else: named by its first bytes */
} inspect_kind;

static int ends_with_ci(const char *s, const char *suffix) {
    const size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcasecmp(s + n - k, suffix) == 0;
}

/* What PATH is, by its first bytes (head, up to 16 of them, *nhead) and its name. Before,
 * anything without the GGUF magic went to the HDF5 reader, so a GGUF file with a damaged
 * magic was "not an HDF5 file". */
static inspect_kind inspect_sniff(const char *path, unsigned char head[16], size_t *nhead,
                                  long long *size) {
    static const unsigned char hdf5[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    *nhead = 0;
    const int fd = fmoe__open_regular(path); /* lib/files.h: a FIFO must not block */
    if (fd < 0) {
        fmoe_error_clear();
        return INSPECT_OPEN_FAILS;
    }
    struct stat st;
    inspect_kind kind = INSPECT_OTHER;
    if (fstat(fd, &st) != 0) {
        kind = INSPECT_OPEN_FAILS;
        goto done;
    }
    *size = (long long)st.st_size;
    *nhead = (size_t)(*size < 16 ? *size : 16);
    if (fmoe__pread_all(fd, head, *nhead, 0) != 0) {
        kind = INSPECT_OPEN_FAILS;
        goto done;
    }
    if (*nhead >= 4 && memcmp(head, "GGUF", 4) == 0) {
        kind = INSPECT_GGUF;
        goto done;
    }
    /* where libhdf5 looks for its signature (H5FD_locate_signature) */
    for (long long at = 0; at + 8 <= *size; at = at ? 2 * at : 512) {
        unsigned char sig[8];
        if (fmoe__pread_all(fd, sig, 8, at) != 0) break;
        if (memcmp(sig, hdf5, 8) == 0) {
            kind = INSPECT_HDF5;
            goto done;
        }
    }
    /* a file meant to be GGUF: a .gguf name, or a magic one byte off or in another case
     * (the GGUF reader's line then names the magic it found) */
    int off = 0;
    for (size_t i = 0; i < 4 && i < *nhead; i++) off += head[i] != (unsigned char)"GGUF"[i];
    if ((*nhead >= 4 && (off <= 1 || strncasecmp((const char *)head, "GGUF", 4) == 0)) ||
        ends_with_ci(path, ".gguf"))
        kind = INSPECT_GGUF;
done:
    close(fd);
    return kind;
}

/* The one line for a file fmoe inspect does not read: what it looks like, and its first
 * bytes. */
static int inspect_other(const char *path, const unsigned char *head, size_t nhead,
                         long long size) {
    static const char reads[] = "fmoe inspect reads GGUF files and fmoe's HDF5 traces, "
                                "stores and predictors";
    if (size == 0) return cmd_failf(CMD, "%s: an empty file; %s", path, reads);
    uint64_t hlen = 0;
    for (int i = 7; nhead >= 9 && i >= 0; i--) hlen = hlen << 8 | head[i];
    if (nhead >= 9 && head[8] == '{' && hlen >= 2 && hlen <= (uint64_t)size - 8)
        return cmd_failf(CMD, "%s: a safetensors file (a %llu-byte JSON header), not a GGUF "
                              "or HDF5 file; %s",
                         path, (unsigned long long)hlen, reads);
    char hex[3 * 8 + 1] = "", text[8 + 1] = "";
    const size_t n = nhead < 8 ? nhead : 8;
    int len = 0;
    for (size_t i = 0; i < n; i++) {
        len += snprintf(hex + len, sizeof hex - (size_t)len, "%s%02x", i ? " " : "", head[i]);
        text[i] = head[i] > 0x20 && head[i] < 0x7f && head[i] != '"' ? (char)head[i] : '.';
        text[i + 1] = '\0';
    }
    return cmd_failf(CMD, "%s: not a GGUF file (magic \"GGUF\") nor an HDF5 file (no HDF5 "
                          "signature): it starts with %s (\"%s\"); %s",
                     path, hex, text, reads);
}

int cmd_inspect(int argc, char **argv) {
    inspect_opts o = {0};
    int npos = 0;
    int prc = cmd_options_parse(&cmd_inspect_spec, &o, argc, argv, &npos);
    if (prc) return prc == CMD_OPTIONS_HELP ? CMD_EXIT_OK : prc;
    const int json = o.json, quiet = o.quiet, plugin_path = o.plugin_path;
    if (plugin_path) { /* a FILE or --json with it would be ignored: refused instead */
        if (npos > 0)
            return cmd_usage_error(CMD, "--plugin-path takes no FILE, got '%s'", argv[1]);
        if (json) return cmd_usage_error(CMD, "--plugin-path and --json are alternatives");
        printf("%s\n", cmd_plugin_dir());
        return CMD_EXIT_OK;
    }
    if (npos != 1) return cmd_usage_error(CMD, "expected exactly one FILE");
    const char *path = argv[1];
    unsigned char head[16];
    size_t nhead = 0;
    long long size = 0;
    const inspect_kind kind = inspect_sniff(path, head, &nhead, &size);
    if (kind == INSPECT_GGUF) return cmd_inspect_gguf(path, json); /* its reader says why not */
    if (kind == INSPECT_OTHER) return inspect_other(path, head, nhead, size);
    char format[64];
    int rc = fmoe_hdf5_read_format(path, format, sizeof format);
    if (rc < 0) return cmd_fail(CMD, rc);
    if (strcmp(format, FMOE_TRACE_FORMAT) == 0) return inspect_trace(path, json, quiet);
    if (strcmp(format, "fmoe-store") == 0) return cmd_inspect_store(path, json);
    if (strcmp(format, FMOE_PREDICTOR_FORMAT) == 0) return inspect_predictor(path, json);
    return cmd_failf(CMD, "%s: unsupported fmoe file format \"%s\" (supported: %s, fmoe-store, "
                          "%s)",
                     path, format, FMOE_TRACE_FORMAT, FMOE_PREDICTOR_FORMAT);
}
