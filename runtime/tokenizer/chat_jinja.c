/*
 * chat_jinja.c - a model's chat template rendered as written, with the variables
 * transformers' apply_chat_template gives it (see fmoe/tokenizer.h).
 *
 * transformers renders with messages=, tools= (None when there are none), documents=None,
 * add_generation_prompt=, the tokenizer's special tokens (bos_token, eos_token) and the
 * caller's extra keyword arguments (chat_template_kwargs, e.g. enable_thinking). The same
 * variables are built here as a cJSON object and handed to the interpreter (jinja.h).
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "jinja.h"
#include "tokenizer_impl.h"

#define OOM() fmoe_error_set(FMOE_ENOMEM, "chat template: out of memory")

/* A JSON text that must parse to `want` (cJSON_Object or cJSON_Array). */
static int parse_json_arg(const char *text, int want, const char *what, cJSON **out) {
    *out = cJSON_Parse(text);
    if (!*out)
        return fmoe_error_set(FMOE_EINVAL, "chat template: %s is not valid JSON", what);
    if (((*out)->type & 0xFF) != want) {
        cJSON_Delete(*out);
        *out = NULL;
        return fmoe_error_set(FMOE_EINVAL, "chat template: %s must be a JSON %s", what,
                              want == cJSON_Object ? "object" : "array");
    }
    return 0;
}

/* Puts the detached member f into o, in the place of a member of the same name if there is
 * one (replaced by pointer: replacing by name would copy the name from the string being
 * freed). */
static void merge(cJSON *o, cJSON *f) {
    cJSON *have = cJSON_GetObjectItemCaseSensitive(o, f->string);
    if (have) cJSON_ReplaceItemViaPointer(o, have, f);
    else cJSON_AddItemToObject(o, f->string, f);
}

static int message_json(const fmoe_chat_message *m, size_t i, cJSON **out) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return OOM();
    *out = o;
    if (!cJSON_AddStringToObject(o, "role", m->role ? m->role : "")) return OOM();
    if (!(m->content ? cJSON_AddStringToObject(o, "content", m->content)
                     : cJSON_AddNullToObject(o, "content")))
        return OOM();
    if (!m->fields_json) return 0;
    cJSON *extra;
    char what[64];
    snprintf(what, sizeof what, "message %zu's fields", i);
    FMOE_FORWARD_IF_ERROR(parse_json_arg(m->fields_json, cJSON_Object, what, &extra));
    /* the extra fields follow role and content; one of those two named again replaces it */
    while (extra->child) {
        cJSON *f = cJSON_DetachItemViaPointer(extra, extra->child);
        merge(o, f);
    }
    cJSON_Delete(extra);
    return 0;
}

static int build_vars(const fmoe_tokenizer *tok, const fmoe_chat_message *msgs, size_t n,
                      const fmoe_chat_options *o, cJSON *vars) {
    cJSON *arr = cJSON_AddArrayToObject(vars, "messages");
    if (!arr) return OOM();
    for (size_t i = 0; i < n; i++) {
        cJSON *m = NULL;
        int rc = message_json(&msgs[i], i, &m);
        if (m) cJSON_AddItemToArray(arr, m);
        FMOE_FORWARD_IF_ERROR(rc);
    }
    if (o->tools_json) {
        cJSON *tools;
        FMOE_FORWARD_IF_ERROR(parse_json_arg(o->tools_json, cJSON_Array, "tools", &tools));
        cJSON_AddItemToObject(vars, "tools", tools);
    } else if (!cJSON_AddNullToObject(vars, "tools")) {
        return OOM();
    }
    if (!cJSON_AddNullToObject(vars, "documents")) return OOM();
    if (!cJSON_AddBoolToObject(vars, "add_generation_prompt", o->add_generation_prompt))
        return OOM();
    /* transformers passes the special tokens that are set; an unset one stays undefined */
    if (tok->bos_text && *tok->bos_text && !cJSON_AddStringToObject(vars, "bos_token", tok->bos_text))
        return OOM();
    if (tok->eos_text && *tok->eos_text && !cJSON_AddStringToObject(vars, "eos_token", tok->eos_text))
        return OOM();
    if (o->disable_thinking && !cJSON_AddFalseToObject(vars, "enable_thinking")) return OOM();
    if (o->kwargs_json) {
        cJSON *kw;
        FMOE_FORWARD_IF_ERROR(parse_json_arg(o->kwargs_json, cJSON_Object, "chat_template_kwargs",
                                             &kw));
        while (kw->child) { /* keyword arguments win, as **kwargs does in transformers */
            cJSON *f = cJSON_DetachItemViaPointer(kw, kw->child);
            merge(vars, f);
        }
        cJSON_Delete(kw);
    }
    return 0;
}

int fmoe__chat_render_jinja(const fmoe_tokenizer *tok, const char *tmpl,
                            const fmoe_chat_message *msgs, size_t n, const fmoe_chat_options *o,
                            char **text, size_t *len) {
    cJSON *vars = cJSON_CreateObject();
    if (!vars) return OOM();
    int rc = build_vars(tok, msgs, n, o, vars);
    if (rc == 0) rc = fmoe__jinja_render(tmpl, vars, text, len);
    cJSON_Delete(vars);
    return rc;
}

const char *fmoe__chat_template_for(const fmoe_tokenizer *tok, const fmoe_chat_options *o) {
    if (o->tools_json && tok->chat_template_tool_use) return tok->chat_template_tool_use;
    return tok->chat_template_text;
}
