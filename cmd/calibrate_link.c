/*
 * calibrate_link.c - `fmoe calibrate --link-file MODEL` (calibrate_link.h): the file link
 * timed on the model's own experts by the live file tier's reads
 * (fmoe_offload_time_file_reads).
 *
 * Why not reads of the file's bytes: a live run reads an expert as its matrices' slices
 * (a GGUF keeps each layer's gate, up and down experts stacked, so one expert is three
 * ranges far apart), each split into segments several requests deep. On the development
 * VM's virtual disk contiguous ranges of the same sizes read 20-40% slower than the copy
 * engine's decode transfers of a Qwen3-30B-A3B-shaped file, and simulate's transfers with
 * them came out that much too long (docs/results.md).
 */
#include "calibrate_link.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cmd_common.h"
#include "offload_cli.h"

#include "fmoe/error.h"
#include "fmoe/gguf.h"
#include "fmoe/model.h"
#include "fmoe/offload.h"

int calibrate_link_is_model(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) return 0;
    return S_ISDIR(st.st_mode) || fmoe_gguf_is_file(path);
}

int calibrate_expert_reads_run(const char *path, int32_t depth, int quick,
                               calibrate_expert_reads *out) {
    memset(out, 0, sizeof *out);
    static const int32_t pieces[CALIBRATE_EXPERT_POINTS] = {8, 4, 2, 1};
    fmoe_model *m = NULL;
    FMOE_FORWARD_IF_ERROR(fmoe_model_load(path, NULL, &m));
    int rc = fmoe_offload_time_file_reads(m, 1, depth, pieces, CALIBRATE_EXPERT_POINTS,
                                          quick ? 4 : 24, quick ? 0.2 : 3.0, out->bytes,
                                          out->seconds, &out->reads);
    if (rc == 0) {
        out->n = CALIBRATE_EXPERT_POINTS;
        out->expert_bytes = fmoe_model_expert_bytes(m);
    } else {
        fmoe_error_prefix("%s", path);
    }
    fmoe_model_free(m);
    return rc;
}

/* splitmix64: the prompt's token ids, the same for every calibration */
static uint64_t next_random(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int32_t argmax(const float *v, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

#define DECODE_PROMPT 4
#define DECODE_MAX_TOKENS 64

int calibrate_decode_link_run(const char *cmd, const char *path, int32_t depth,
                              double cache_gb, int32_t threads, int32_t activations,
                              int quick, calibrate_decode_link *out) {
    memset(out, 0, sizeof *out);
    out->cache_gb = cache_gb;
    out->threads = threads;
    fmoe_model *m = NULL;
    fmoe_session *s = NULL;
    float *logits = NULL;
    cmd_offload off;
    memset(&off, 0, sizeof off);
    int rc = CMD_EXIT_FAILURE, err = 0;
    if ((err = fmoe_model_load(path, NULL, &m)) < 0) {
        fmoe_error_prefix("%s", path);
        return cmd_fail(cmd, err);
    }
    const fmoe_model_geometry *g = fmoe_model_get_geometry(m);
    const int32_t vocab = (int32_t)g->vocab_size;
    cmd_offload_args a;
    cmd_offload_args_init(&a);
    a.cache_gb = cache_gb;
    a.tier = FMOE_TIER_FILE;
    a.direct_io = 1;
    a.read_depth = depth;
    a.policy = "lru";
    fmoe_session_options so = fmoe_session_defaults();
    so.backend = FMOE_BACKEND_CPU;
    so.max_context = DECODE_PROMPT + DECODE_MAX_TOKENS;
    so.threads = threads;
    so.activations = (fmoe_activations)activations;
    if ((rc = cmd_offload_open(cmd, &a, m, so.max_batch, 1, &off)) != 0) goto done;
    rc = CMD_EXIT_FAILURE;
    fmoe_offload_attach(off.x, &so);
    int32_t prompt[DECODE_PROMPT];
    uint64_t seed = 0x6d6f6566; /* "moef" */
    for (int32_t i = 0; i < DECODE_PROMPT; i++)
        prompt[i] = (int32_t)(next_random(&seed) % (uint64_t)(vocab > 0 ? vocab : 1));
    logits = malloc((size_t)(vocab > 0 ? vocab : 1) * sizeof *logits);
    if (!logits) {
        err = fmoe_error_set(FMOE_ENOMEM, "out of memory for %d logits", vocab);
        goto fail;
    }
    if ((err = fmoe_session_init(m, &so, &s)) < 0 ||
        (err = fmoe_offload_request_begin(off.x, 0, prompt, DECODE_PROMPT)) < 0 ||
        (err = fmoe_offload_forward(off.x, s, prompt, DECODE_PROMPT, FMOE_PHASE_PREFILL, NULL,
                                    logits)) < 0)
        goto fail;
    const int32_t min_tokens = quick ? 2 : 8;
    const double min_s = quick ? 0 : 3.0, max_s = 60.0, t0 = cmd_now();
    for (;;) {
        const double t = cmd_now() - t0;
        if (out->tokens >= DECODE_MAX_TOKENS || t > max_s ||
            (out->tokens >= min_tokens && t >= min_s))
            break;
        int32_t next = argmax(logits, vocab);
        if ((err = fmoe_offload_forward(off.x, s, &next, 1, FMOE_PHASE_DECODE, NULL, logits)) < 0)
            goto fail;
        out->tokens++;
    }
    out->decode_s = cmd_now() - t0;
    if ((err = fmoe_offload_request_end(off.x)) < 0) goto fail;
    fmoe_offload_stats st;
    fmoe_offload_get_stats(off.x, &st);
    out->slots = fmoe_offload_capacity(off.x);
    out->bytes = st.io_bytes_decode;
    out->busy_s = st.io_busy_s_decode;
    out->hit_pct = st.accesses > 0 ? 100.0 * (double)st.hits / (double)st.accesses : 0;
    if (!(out->bytes > 0 && out->busy_s > 0)) {
        rc = cmd_failf(cmd, "--link-decode-gb %g: %d decode tokens of %s copied no expert (%d "
                            "slots hold what they route): give a cache the experts do not "
                            "fit in", cache_gb, (int)out->tokens, path, (int)out->slots);
        goto done;
    }
    rc = CMD_EXIT_OK;
    goto done;
fail:
    rc = cmd_fail(cmd, err);
done:
    fmoe_session_free(s);
    free(logits);
    const int closed = cmd_offload_close(cmd, &off, rc == CMD_EXIT_OK);
    fmoe_model_free(m);
    return rc ? rc : closed;
}
