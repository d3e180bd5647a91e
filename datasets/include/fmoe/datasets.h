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
    int64_t skipped; /* records without a user turn, or with an empty one, left out */
} fmoe_prompt_set;

/* Reads a prompt dataset. sharegpt: the first "human" (or "user") turn of each record;
 * lmsys: the first "user" turn; jsonl: "prompt" (and "id" when present); text: each
 * non-blank line. The JSON formats accept a JSON list or JSON Lines. Records without a
 * user turn are counted in `skipped`. Prompts must be valid UTF-8.
 * @return 0, FMOE_EIO, FMOE_EFORMAT naming the file and the line (JSON Lines, text) or
 *         "record N" (the 0-based index in a JSON list), FMOE_ENOMEM. *out owned by the
 *         caller (fmoe_prompt_set_free). */
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

/* Timestamps "YYYY-MM-DD HH:MM:SS[.fraction]" (no zone), rows in time order; arrival_s
 * keeps the sub-second digits (computed from integer seconds and nanoseconds).
 * @return 0, FMOE_EIO, FMOE_EFORMAT naming the file and line, FMOE_ENOMEM. */
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
    int64_t expert_bytes;      /* > 0: bytes of one routed expert, overriding the geometry's
                                  (for geometries given by hand); 0: from the geometry */
} fmoe_import_options;

typedef struct fmoe_import_report {
    int64_t lines;            /* input records read (JSONL lines, CSV rows of all files) */
    int64_t requests;
    int64_t tokens;           /* tokens written */
    int64_t dropped_tokens;   /* incomplete tokens dropped (--drop-incomplete) */
    fmoe_probs_kind probs_kind;
} fmoe_import_report;

/* docs/design.md §4.1 JSON Lines: one object per (request, token, layer). Writes `out_path`
 * atomically (nothing is left behind on failure). Also: blank lines and lines holding
 * {"type": "meta", ...} are skipped (converters record provenance there); unknown keys
 * are ignored; request ids keep their JSON type (7 != "7") and are stored as given when
 * all are integers, else as their 0-based order of first appearance; token positions may
 * have gaps; a request whose tokens were all dropped is left out.
 * @return 0, or (detail: file and line, or file, request and token):
 *   FMOE_EFORMAT malformed JSON or record, duplicate layer, prefill after decode;
 *   FMOE_ERANGE expert/layer/token out of range; FMOE_EMISMATCH probs kinds mixed, a
 *   token's lines disagreeing on phase or token_id; FMOE_EINCOMPLETE a token lacking
 *   layers (without drop_incomplete); FMOE_EIO, FMOE_ENOMEM, or the writer's errors.
 * `report` (may be NULL) is filled as far as the import got. */
int fmoe_import_jsonl(const char *in_path, const fmoe_import_options *opts,
                      const char *out_path, fmoe_import_report *report);

/* Dense CSV, one file per MoE layer (in layer order), header
 * `layer_id,token_id,expert_0..expert_{J-1}`, row i = token i in every file (the
 * FLAME-MoE layout). The chosen experts are the K largest non-zero entries of each row.
 * `tokens_per_request` > 0 splits the token stream into requests of that many prefill
 * tokens (the FLAME samples are 32 sequences x 64 tokens); 0 = one request. num_files
 * must equal the geometry's L. Rows need exactly K non-zero entries (ordered by
 * decreasing probability, ties by expert id); token_id must agree across the files row
 * by row (it is a position, not a vocabulary id: the trace's token_id is -1).
 * @return 0, FMOE_EINVAL (file count), FMOE_EFORMAT / FMOE_ERANGE / FMOE_EMISMATCH naming
 *         the file and line, FMOE_EIO, FMOE_ENOMEM, or the writer's errors. */
int fmoe_import_dense_csv(const char *const *layer_files, int num_files,
                          int64_t tokens_per_request, const fmoe_import_options *opts,
                          const char *out_path, fmoe_import_report *report);

#endif
