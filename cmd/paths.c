/*
 * paths.c - the bundled default model and generation_config.json (see paths.h).
 */
#include "paths.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmd_common.h"
#include "fmoe/error.h"
#include "files.h"
#include "fmoe/gguf.h"
#include "fmoe_config.h"

#define BUNDLED_MODEL "fmoe-tiny"

static int holds_config(const char *dir) {
    char probe[2 * PATH_MAX];
    struct stat st;
    snprintf(probe, sizeof probe, "%s/config.json", dir);
    return stat(probe, &st) == 0 && S_ISREG(st.st_mode);
}

static int exe_dir(char *buf, size_t cap) {
    ssize_t n = readlink("/proc/self/exe", buf, cap - 1);
    if (n <= 0) return -1;
    buf[n] = '\0';
    char *slash = strrchr(buf, '/');
    if (!slash) return -1;
    *slash = '\0';
    return 0;
}

const char *cmd_bundled_model_dir(void) {
    static char dir[PATH_MAX];
    char exe[PATH_MAX], probe[PATH_MAX + 64];
    const char *env = getenv("FMOE_BUNDLED_MODEL");
    if (env && env[0]) return holds_config(env) ? env : NULL;
    if (exe_dir(exe, sizeof exe) == 0) {
        snprintf(probe, sizeof probe, "%s/../datasets/" BUNDLED_MODEL, exe); /* build tree */
        if (holds_config(probe) && realpath(probe, dir)) return dir;
    }
    snprintf(probe, sizeof probe, "%s/datasets/" BUNDLED_MODEL, FMOE_SOURCE_DIR);
    if (holds_config(probe) && realpath(probe, dir)) return dir;
    snprintf(probe, sizeof probe, "%s", FMOE_DATA_DIR "/" BUNDLED_MODEL);
    if (holds_config(probe) && realpath(probe, dir)) return dir;
    return NULL;
}

const char *cmd_model_dir_or_default(const char *cmd, const char *given) {
    if (given) return given;
    const char *dir = cmd_bundled_model_dir();
    if (!dir)
        cmd_failf(cmd,
                  "no --model given and the bundled model " BUNDLED_MODEL
                  " was not found (looked in $FMOE_BUNDLED_MODEL, the build tree, %s/datasets "
                  "and %s)",
                  FMOE_SOURCE_DIR, FMOE_DATA_DIR);
    return dir;
}

const char *cmd_tokenizer_dir(const char *cmd, const char *model, const char *tokenizer) {
    if (tokenizer) return tokenizer;
    struct stat st;
    if (stat(model, &st) != 0 || S_ISDIR(st.st_mode)) return model; /* the load names errors */
    /* A GGUF file from fmoe quantize carries the folder's tokenizer files (fmoe.file.*);
     * llama.cpp's tokenizer.ggml.* keys are not a tokenizer.json, which fmoe's tokenizer
     * reads (with tokenizer_config.json's chat template). */
    fmoe_gguf *g = NULL;
    if (fmoe_gguf_open(model, &g) < 0) {
        fmoe_error_clear();
        return model; /* the model load says what is wrong with the file */
    }
    const int embedded = fmoe_gguf_find_kv(g, "fmoe.file.tokenizer.json") != NULL;
    fmoe_gguf_close(g);
    if (embedded) return model;
    cmd_usage_error(cmd, "%s: the file embeds no tokenizer fmoe reads (fmoe quantize embeds "
                    "one); pass --tokenizer DIR (the HuggingFace folder with tokenizer.json)",
                    model);
    return NULL;
}

void cmd_generation_config_add_stop(cmd_generation_config *gc, int32_t id) {
    if (id < 0 || cmd_generation_config_is_stop(gc, id) || gc->num_stop >= CMD_MAX_STOP_TOKENS)
        return;
    gc->stop[gc->num_stop++] = id;
}

int cmd_generation_config_is_stop(const cmd_generation_config *gc, int32_t id) {
    for (int32_t i = 0; i < gc->num_stop; i++)
        if (gc->stop[i] == id) return 1;
    return 0;
}

int cmd_generation_config_load(const char *dir, cmd_generation_config *out) {
    memset(out, 0, sizeof *out);
    out->temperature = 1.0f;
    out->top_p = 1.0f;
    char path[PATH_MAX + 32];
    char *text = NULL;
    size_t len = 0;
    if (fmoe_gguf_is_file(dir)) { /* fmoe quantize's GGUF: the file embedded, if it was */
        snprintf(path, sizeof path, "%s:fmoe.file.generation_config.json", dir);
        fmoe_gguf *g = NULL;
        FMOE_FORWARD_IF_ERROR(fmoe_gguf_open(dir, &g));
        const int rc = fmoe_gguf_get_file(g, "generation_config.json", &text, &len);
        fmoe_gguf_close(g);
        if (rc != 0) return rc < 0 ? rc : 0; /* optional */
    } else {
        snprintf(path, sizeof path, "%s/generation_config.json", dir);
        struct stat st;
        if (stat(path, &st) != 0 && errno == ENOENT) return 0; /* optional */
        /* a few hundred bytes; a FIFO or /dev/zero here is refused (lib/files.h) */
        FMOE_FORWARD_IF_ERROR(fmoe__read_file_bounded(path, "a generation_config.json",
                                                      (long long)16 << 20, 0, &text, &len));
    }
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    if (!j || !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return fmoe_error_set(FMOE_EFORMAT, "%s: not a JSON object", path);
    }
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(j, "eos_token_id");
    if (cJSON_IsNumber(eos)) {
        cmd_generation_config_add_stop(out, (int32_t)eos->valuedouble);
    } else if (cJSON_IsArray(eos)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, eos) if (cJSON_IsNumber(e))
            cmd_generation_config_add_stop(out, (int32_t)e->valuedouble);
    }
    const cJSON *v;
    if (cJSON_IsBool(v = cJSON_GetObjectItemCaseSensitive(j, "do_sample")))
        out->do_sample = cJSON_IsTrue(v);
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(j, "temperature")) &&
        v->valuedouble >= 0)
        out->temperature = (float)v->valuedouble;
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(j, "top_p")) && v->valuedouble > 0)
        out->top_p = (float)v->valuedouble;
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(j, "top_k")) && v->valuedouble >= 0)
        out->top_k = (int32_t)v->valuedouble;
    cJSON_Delete(j);
    return 0;
}
