/*
 * chat_jinja.c - a model's chat template rendered as written, with the variables
 * transformers' apply_chat_template gives it (see fmoe/tokenizer.h).
 *
 * transformers renders with messages=, tools= (None when there are none), documents=None,
 * add_generation_prompt=, the tokenizer's special tokens (bos_token, eos_token) and the
 * caller's extra keyword arguments (chat_template_kwargs, e.g. enable_thinking). The same
 * variables are built here as the interpreter's values (jinja.h), the JSON of message
 * fields, tools and keyword arguments read the way json.loads reads it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "jinja.h"
#include "tokenizer_impl.h"

#define OOM() fmoe_error_set(FMOE_ENOMEM, "chat template: out of memory")

/* JSON text that must be `want` (JV_DICT or JV_LIST), read as json.loads reads it. */
static int json_arg(jj_arena *A, const char *text, jv_kind want, const char *what, jv *out) {
    FMOE_FORWARD_IF_ERROR(jv_parse_json(A, text, strlen(text), what, out));
    if (out->k != want)
        return fmoe_error_set(FMOE_EINVAL, "chat template: %s must be a JSON %s", what,
                              want == JV_DICT ? "object" : "array");
    return 0;
}

static int set(jj_arena *A, jv d, const char *key, jv v) {
    return jv_dict_set(A, d, jv_str(key), v);
}

static int str(jj_arena *A, const char *s, jv *out) {
    size_t n = strlen(s);
    char *c = jj_strndup(A, s, n);
    if (!c) return OOM();
    *out = jv_strn(c, n);
    return 0;
}

static int message(jj_arena *A, const fmoe_chat_message *m, size_t i, jv *out) {
    jv role, content = jv_none();
    FMOE_FORWARD_IF_ERROR(jv_dict_new(A, out));
    FMOE_FORWARD_IF_ERROR(str(A, m->role ? m->role : "", &role));
    if (m->content) FMOE_FORWARD_IF_ERROR(str(A, m->content, &content));
    FMOE_FORWARD_IF_ERROR(set(A, *out, "role", role));
    FMOE_FORWARD_IF_ERROR(set(A, *out, "content", content));
    if (!m->fields_json) return 0;
    /* the extra fields follow role and content; one of those named again replaces it */
    char what[64];
    snprintf(what, sizeof what, "message %zu's fields", i);
    jv extra;
    FMOE_FORWARD_IF_ERROR(json_arg(A, m->fields_json, JV_DICT, what, &extra));
    for (size_t k = 0; k < extra.u.d->n; k++)
        FMOE_FORWARD_IF_ERROR(jv_dict_set(A, *out, extra.u.d->key[k], extra.u.d->val[k]));
    return 0;
}

static int build_vars(jj_arena *A, const fmoe_tokenizer *tok, const fmoe_chat_message *msgs,
                      size_t n, const fmoe_chat_options *o, jv *vars) {
    jv list, v;
    FMOE_FORWARD_IF_ERROR(jv_dict_new(A, vars));
    FMOE_FORWARD_IF_ERROR(jv_list_new(A, n, &list));
    for (size_t i = 0; i < n; i++) {
        FMOE_FORWARD_IF_ERROR(message(A, &msgs[i], i, &v));
        FMOE_FORWARD_IF_ERROR(jv_list_push(A, list, v));
    }
    FMOE_FORWARD_IF_ERROR(set(A, *vars, "messages", list));
    v = jv_none();
    if (o->tools_json) FMOE_FORWARD_IF_ERROR(json_arg(A, o->tools_json, JV_LIST, "tools", &v));
    FMOE_FORWARD_IF_ERROR(set(A, *vars, "tools", v));
    FMOE_FORWARD_IF_ERROR(set(A, *vars, "documents", jv_none()));
    FMOE_FORWARD_IF_ERROR(set(A, *vars, "add_generation_prompt", jv_bool(o->add_generation_prompt)));
    /* transformers passes the special tokens that are set; an unset one stays undefined */
    if (tok->bos_text && *tok->bos_text) {
        FMOE_FORWARD_IF_ERROR(str(A, tok->bos_text, &v));
        FMOE_FORWARD_IF_ERROR(set(A, *vars, "bos_token", v));
    }
    if (tok->eos_text && *tok->eos_text) {
        FMOE_FORWARD_IF_ERROR(str(A, tok->eos_text, &v));
        FMOE_FORWARD_IF_ERROR(set(A, *vars, "eos_token", v));
    }
    if (o->disable_thinking) FMOE_FORWARD_IF_ERROR(set(A, *vars, "enable_thinking", jv_bool(0)));
    if (o->kwargs_json) { /* keyword arguments win, as **kwargs does in transformers */
        jv kw;
        FMOE_FORWARD_IF_ERROR(json_arg(A, o->kwargs_json, JV_DICT, "chat_template_kwargs", &kw));
        for (size_t k = 0; k < kw.u.d->n; k++)
            FMOE_FORWARD_IF_ERROR(jv_dict_set(A, *vars, kw.u.d->key[k], kw.u.d->val[k]));
    }
    return 0;
}

int fmoe__chat_render_jinja(const fmoe_tokenizer *tok, const char *tmpl,
                            const fmoe_chat_message *msgs, size_t n, const fmoe_chat_options *o,
                            char **text, size_t *len) {
    jj_arena *A = jj_arena_new();
    if (!A) return OOM();
    jv vars;
    int rc = build_vars(A, tok, msgs, n, o, &vars);
    if (rc == 0) rc = fmoe__jinja_render_vars(A, tmpl, vars, text, len);
    jj_arena_free(A);
    return rc;
}

const char *fmoe__chat_template_for(const fmoe_tokenizer *tok, const fmoe_chat_options *o) {
    if (o->tools_json && tok->chat_template_tool_use) return tok->chat_template_tool_use;
    return tok->chat_template_text;
}
