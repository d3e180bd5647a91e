/*
 * fmoe/datasets.h - outside data fmoe reads: prompt datasets, arrival traces, and routing
 * traces recorded elsewhere (imported into fmoe traces). Implemented in datasets/.
 * Every parser bounds-checks its input; errors name the file and the line (or record).
 */
#ifndef FMOE_DATASETS_H
#define FMOE_DATASETS_H

#include <stdint.h>

#include "fmoe/geometry.h"
#include "fmoe/progress.h"
#include "fmoe/trace.h"

/* ---------------------------------------------------------------- prompt datasets */

typedef enum fmoe_prompt_format {
    FMOE_PROMPTS_AUTO = 0,     /* guess from content: JSON array -> sharegpt/lmsys, ... */
    FMOE_PROMPTS_SHAREGPT = 1, /* JSON list of {"id", "conversations": [{"from","value"}]} */
    FMOE_PROMPTS_LMSYS = 2,    /* JSON list or JSONL of {"conversation": [{"role","content"}]} */
    FMOE_PROMPTS_JSONL = 3,    /* one {"prompt": "..."} per line */
    FMOE_PROMPTS_TEXT = 4,     /* one prompt per line (blank lines skipped) */
} fmoe_prompt_format;

typedef struct fmoe_prompt_set {
    int64_t count;
    char **ids;      /* [count] dataset ids ("" where the dataset has none) */
    char **prompts;  /* [count] the first user turn, UTF-8 */
    fmoe_prompt_format format; /* the format actually read */
} fmoe_prompt_set;

/* @return 0 or an error naming the file and the line/record. */
int fmoe_prompts_load(const char *path, fmoe_prompt_format format, fmoe_prompt_set **out);
void fmoe_prompt_set_free(fmoe_prompt_set *s); /* NULL is a no-op */
int fmoe_prompt_format_parse(const char *name, fmoe_prompt_format *out);
const char *fmoe_prompt_format_name(fmoe_prompt_format f);

/* ---------------------------------------------------------------- arrival traces */

/* Azure LLM inference trace CSV: TIMESTAMP,ContextTokens,GeneratedTokens. */
typedef struct fmoe_arrivals {
    int64_t count;
    double *arrival_s;          /* [count] seconds since the first request */
    int32_t *context_tokens;    /* [count] */
    int32_t *generated_tokens;  /* [count] */
} fmoe_arrivals;

int fmoe_arrivals_load_azure(const char *path, fmoe_arrivals **out);
void fmoe_arrivals_free(fmoe_arrivals *a);

/* ---------------------------------------------------------------- trace import */

typedef struct fmoe_import_options {
    const fmoe_model_geometry *geometry; /* L, J, K (and h, expert bytes) */
    const char *config_json;   /* stored in /model/config_json and fingerprinted; may be NULL */
    const char *model_name;    /* may be NULL */
    int drop_incomplete;       /* drop tokens missing layers instead of failing */
    fmoe_trace_write_options write;
    fmoe_progress progress;
} fmoe_import_options;

typedef struct fmoe_import_report {
    int64_t lines;            /* input records read */
    int64_t requests;
    int64_t tokens;           /* tokens written */
    int64_t dropped_tokens;   /* incomplete tokens dropped (--drop-incomplete) */
    fmoe_probs_kind probs_kind;
} fmoe_import_report;

/* DESIGN.md §4.1 JSON Lines: one object per (request, token, layer). Writes `out_path`
 * atomically (nothing is left behind on failure). */
int fmoe_import_jsonl(const char *in_path, const fmoe_import_options *opts,
                      const char *out_path, fmoe_import_report *report);

/* Dense CSV, one file per MoE layer (in layer order), header
 * `layer_id,token_id,expert_0..expert_{J-1}`, row i = token i in every file (the
 * FLAME-MoE layout). The chosen experts are the K largest non-zero entries of each row.
 * `tokens_per_request` > 0 splits the token stream into requests of that many prefill
 * tokens (the FLAME samples are 32 sequences x 64 tokens); 0 = one request. */
int fmoe_import_dense_csv(const char *const *layer_files, int num_files,
                          int64_t tokens_per_request, const fmoe_import_options *opts,
                          const char *out_path, fmoe_import_report *report);

#endif
