/*
 * paths.h - the bundled default model (datasets/fmoe-tiny) and what `fmoe generate` and
 * `fmoe record` share about a model directory: finding it, its stop tokens, and the
 * sampling defaults of its generation_config.json.
 */
#ifndef FMOE_CMD_PATHS_H
#define FMOE_CMD_PATHS_H

#include <stdint.h>

#include "fmoe/sampler.h"

/* Directory of the bundled model fmoe-tiny: $FMOE_BUNDLED_MODEL when set, else the build
 * tree (<build>/datasets/fmoe-tiny), the source tree, then the installed data directory
 * (<datadir>/fmoe/fmoe-tiny); a candidate counts when it holds config.json. NULL when not
 * found. The string is static. */
const char *cmd_bundled_model_dir(void);

/* `given` when not NULL; else the bundled model, or NULL after printing
 * "fmoe <cmd>: no --model given and the bundled model fmoe-tiny was not found ...". */
const char *cmd_model_dir_or_default(const char *cmd, const char *given);

/* Where the tokenizer (tokenizer.json, tokenizer_config.json) and generation_config.json of
 * MODEL are: TOKENIZER (--tokenizer DIR) when given, else MODEL when it is a directory or a
 * GGUF file that embeds them (fmoe quantize's: fmoe_gguf_get_file). For another model file
 * without --tokenizer: NULL after printing "fmoe CMD: MODEL: the file embeds no tokenizer
 * fmoe reads ...; pass --tokenizer DIR ..." (a usage error). */
const char *cmd_tokenizer_dir(const char *cmd, const char *model, const char *tokenizer);

#define CMD_MAX_STOP_TOKENS 16

/* What a model directory's generation_config.json says (absent file or keys: defaults). */
typedef struct cmd_generation_config {
    int32_t stop[CMD_MAX_STOP_TOKENS]; /* eos_token_id (int or list) */
    int32_t num_stop;
    int32_t do_sample;                 /* 0 when absent */
    float temperature;                 /* 1.0 when absent */
    float top_p;                       /* 1.0 when absent */
    int32_t top_k;                     /* 0 when absent (HF's default 50 applies only with
                                          do_sample; we follow the file) */
} cmd_generation_config;

/* Reads DIR/generation_config.json when present (DIR may be a GGUF file from fmoe quantize:
 * its embedded copy, fmoe_gguf_get_file). @return 0; FMOE_EIO or FMOE_ERANGE for a
 * file that is not regular or too large (fmoe__read_file_bounded); or FMOE_EFORMAT for a file
 * that is not valid JSON (detail names it). */
int cmd_generation_config_load(const char *dir, cmd_generation_config *out);

/* Adds `id` (>= 0) to the stop list unless present. */
void cmd_generation_config_add_stop(cmd_generation_config *gc, int32_t id);

/* 1 when `id` is a stop token. */
int cmd_generation_config_is_stop(const cmd_generation_config *gc, int32_t id);

/* cmd_check_output, the check of a file a command is about to write, is in outputs.h. */
#include "outputs.h"

#endif
