/*
 * chat.c - the chat-template entry point, and the fixed renderers kept as its fallback
 * (see fmoe/tokenizer.h).
 *
 * A model's template is rendered as written by the Jinja interpreter (chat_jinja.c,
 * jinja.h). The fixed renderers below predate it: C code for four families that produces
 * what their templates produce for plain messages. They are used when a caller names one,
 * when the model has no template text (the family guessed from its special tokens), and
 * when the interpreter refuses the model's template (a construct it does not implement),
 * with a one-line warning saying why. A family is recognised by markers only it uses:
 * "[INST]" (Mistral/Mixtral), "<|im_start|>" (ChatML: Qwen; with "<think>" or
 * "enable_thinking", Qwen3), "<|user|>" + "<|assistant|>" (OLMoE/Tulu). Variants inside a
 * family are read from the template text: whether Mixtral's turns start with a space,
 * whether the ChatML template carries a default system message, whether the OLMoE template
 * starts with the BOS token.
 */
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/log.h"
#include "jinja.h"
#include "tokenizer_impl.h"

#define OOM() fmoe_error_set(FMOE_ENOMEM, "tokenizer: out of memory")

/* "jinja": the model's template as written, never a fixed renderer instead */
static const char *const TEMPLATE_NAMES[] = {"mixtral", "chatml", "qwen3", "olmoe", "jinja", NULL};

const char *const *fmoe_chat_template_names(void) { return TEMPLATE_NAMES; }

const char *fmoe_tokenizer_chat_template(const fmoe_tokenizer *tok) {
    return tok ? tok->chat_family : NULL;
}

const char *fmoe_tokenizer_chat_template_text(const fmoe_tokenizer *tok, int with_tools) {
    if (!tok) return NULL;
    const fmoe_chat_options o = {.tools_json = with_tools ? "[]" : NULL};
    return fmoe__chat_template_for(tok, &o);
}

/* The default system message a ChatML template writes when the conversation has none:
 * the literal text between "<|im_start|>system\n" and "<|im_end|>" (Qwen1.5/2/2.5). */
static char *chatml_default_system(const char *t) {
    static const char *const OPEN[] = {"<|im_start|>system\\n", "<|im_start|>system\n"};
    for (size_t v = 0; v < 2; v++) {
        for (const char *p = strstr(t, OPEN[v]); p; p = strstr(p + 1, OPEN[v])) {
            const char *s = p + strlen(OPEN[v]);
            const char *e = strstr(s, "<|im_end|>");
            if (!e || e == s) continue;
            size_t n = (size_t)(e - s);
            if (memchr(s, '\'', n) || memchr(s, '"', n) || memchr(s, '+', n) || memchr(s, '{', n))
                continue; /* an expression (messages[0].content ...), not a literal */
            char *out = malloc(n + 1);
            if (!out) return NULL;
            size_t k = 0;
            for (size_t i = 0; i < n; i++) {
                if (s[i] == '\\' && i + 1 < n && s[i + 1] == 'n') {
                    out[k++] = '\n';
                    i++;
                } else {
                    out[k++] = s[i];
                }
            }
            out[k] = '\0';
            return out;
        }
    }
    return NULL;
}

void fmoe__tok_chat_detect(fmoe_tokenizer *tok) {
    const char *t = tok->chat_template_text;
    tok->chat_family = NULL;
    if (t && fmoe__jinja_check(t) < 0) {
        /* told once, at load: renders then use the family's fixed renderer, if any */
        tok->chat_refused = strdup(fmoe_error_detail());
        fmoe_error_clear();
    }
    if (t) {
        if (strstr(t, "[INST]")) {
            tok->chat_family = "mixtral";
            tok->chat_space_inst = strstr(t, "' [INST] '") != NULL;
        } else if (strstr(t, "<|im_start|>")) {
            tok->chat_family =
                strstr(t, "<think>") || strstr(t, "enable_thinking") ? "qwen3" : "chatml";
            tok->chat_default_system = chatml_default_system(t);
        } else if (strstr(t, "<|user|>") && strstr(t, "<|assistant|>")) {
            tok->chat_family = "olmoe";
            tok->chat_bos = strstr(t, "bos_token") != NULL;
        }
        if (tok->chat_refused)
            fmoe_log(FMOE_LOG_WARN, "%s: %s; %s", tok->path, tok->chat_refused,
                     tok->chat_family ? "fmoe's fixed renderer for the family is used instead"
                                      : "chat requests will fail");
        return;
    }
    /* no template: guess from the special tokens of the vocabulary */
    if (fmoe_tokenizer_token_to_id(tok, "<|im_start|>") >= 0)
        tok->chat_family = fmoe_tokenizer_token_to_id(tok, "<think>") >= 0 ? "qwen3" : "chatml";
    else if (fmoe_tokenizer_token_to_id(tok, "<|user|>") >= 0 &&
             fmoe_tokenizer_token_to_id(tok, "<|assistant|>") >= 0) {
        tok->chat_family = "olmoe";
        tok->chat_bos = 1;
    } else if (fmoe_tokenizer_token_to_id(tok, "[INST]") >= 0)
        tok->chat_family = "mixtral";
}

/* ---- rendering helpers ------------------------------------------------------------------------ */

static int put(tok_buf *b, const char *s) { return fmoe__tok_buf_append(b, s, strlen(s)); }
static int putn(tok_buf *b, const char *s, size_t n) { return fmoe__tok_buf_append(b, s, n); }

static int role_is(const fmoe_chat_message *m, const char *r) {
    return m->role && strcmp(m->role, r) == 0;
}

static const char *content_of(const fmoe_chat_message *m) { return m->content ? m->content : ""; }

/* ---- mixtral ---------------------------------------------------------------------------------- */

static int render_mixtral(const fmoe_tokenizer *tok, const fmoe_chat_message *m, size_t n,
                          tok_buf *b) {
    const char *sys = NULL;
    size_t first = 0;
    if (n && role_is(&m[0], "system")) {
        sys = content_of(&m[0]);
        first = 1;
    }
    FMOE_FORWARD_IF_ERROR(put(b, tok->bos_text));
    for (size_t i = first; i < n; i++) {
        size_t k = i - first;
        int user = role_is(&m[i], "user");
        if (!user && !role_is(&m[i], "assistant"))
            return fmoe_error_set(FMOE_EINVAL,
                                  "chat template mixtral: message %zu: role \"%s\" is not allowed "
                                  "(only a leading system message, then user/assistant)",
                                  i, m[i].role ? m[i].role : "(null)");
        if (user != (k % 2 == 0))
            return fmoe_error_set(FMOE_EINVAL,
                                  "chat template mixtral: message %zu: roles must alternate "
                                  "user/assistant/user/... (after an optional system message)",
                                  i);
        if (user) {
            FMOE_FORWARD_IF_ERROR(put(b, tok->chat_space_inst ? " [INST] " : "[INST] "));
            if (k == 0 && sys) {
                FMOE_FORWARD_IF_ERROR(put(b, sys));
                FMOE_FORWARD_IF_ERROR(put(b, "\n\n"));
            }
            FMOE_FORWARD_IF_ERROR(put(b, content_of(&m[i])));
            FMOE_FORWARD_IF_ERROR(put(b, " [/INST]"));
        } else {
            if (tok->chat_space_inst) FMOE_FORWARD_IF_ERROR(put(b, " "));
            FMOE_FORWARD_IF_ERROR(put(b, content_of(&m[i])));
            FMOE_FORWARD_IF_ERROR(put(b, tok->eos_text));
        }
    }
    return 0;
}

/* ---- chatml ----------------------------------------------------------------------------------- */

static int chatml_turn(tok_buf *b, const char *role, const char *content) {
    FMOE_FORWARD_IF_ERROR(put(b, "<|im_start|>"));
    FMOE_FORWARD_IF_ERROR(put(b, role));
    FMOE_FORWARD_IF_ERROR(put(b, "\n"));
    FMOE_FORWARD_IF_ERROR(put(b, content));
    return put(b, "<|im_end|>\n");
}

static int render_chatml(const fmoe_tokenizer *tok, const fmoe_chat_message *m, size_t n,
                         int gen, tok_buf *b) {
    if (tok->chat_default_system && (n == 0 || !role_is(&m[0], "system")))
        FMOE_FORWARD_IF_ERROR(chatml_turn(b, "system", tok->chat_default_system));
    for (size_t i = 0; i < n; i++)
        FMOE_FORWARD_IF_ERROR(chatml_turn(b, m[i].role ? m[i].role : "", content_of(&m[i])));
    if (gen) FMOE_FORWARD_IF_ERROR(put(b, "<|im_start|>assistant\n"));
    return 0;
}

/* ---- qwen3 ------------------------------------------------------------------------------------ */

static int starts_with(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

static int ends_with(const char *s, const char *p) {
    size_t n = strlen(s), k = strlen(p);
    return n >= k && memcmp(s + n - k, p, k) == 0;
}

/* Python's s.strip(chars) family on [*a, *e) with chars = "\n". */
static void lstrip_nl(const char **a, const char *e) {
    while (*a < e && **a == '\n') (*a)++;
}
static void rstrip_nl(const char *a, const char **e) {
    while (*e > a && (*e)[-1] == '\n') (*e)--;
}

/* Last occurrence of needle in [a, e). */
static const char *rfind(const char *a, const char *e, const char *needle) {
    size_t k = strlen(needle);
    for (const char *p = e - k; p >= a && e - a >= (ptrdiff_t)k; p--)
        if (memcmp(p, needle, k) == 0) return p;
    return NULL;
}

static const char *find(const char *a, const char *e, const char *needle) {
    size_t k = strlen(needle);
    for (const char *p = a; p + k <= e; p++)
        if (memcmp(p, needle, k) == 0) return p;
    return NULL;
}

static int render_qwen3(const fmoe_chat_message *m, size_t n, int gen, int no_think,
                        tok_buf *b) {
    if (n && role_is(&m[0], "system"))
        FMOE_FORWARD_IF_ERROR(chatml_turn(b, "system", content_of(&m[0])));
    /* the last user message that is not a wrapped tool response */
    size_t last_query = n ? n - 1 : 0;
    for (size_t k = n; k-- > 0;) {
        const char *c = content_of(&m[k]);
        if (role_is(&m[k], "user") &&
            !(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) {
            last_query = k;
            break;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const char *c = content_of(&m[i]);
        if (role_is(&m[i], "user") || (role_is(&m[i], "system") && i > 0)) {
            FMOE_FORWARD_IF_ERROR(chatml_turn(b, m[i].role, c));
        } else if (role_is(&m[i], "assistant")) {
            const char *ca = c, *ce = c + strlen(c); /* content */
            const char *ra = c, *re = c;             /* reasoning, empty */
            const char *close = find(c, ce, "</think>");
            if (close) {
                /* reasoning = content.split('</think>')[0].rstrip('\n')
                 *                    .split('<think>')[-1].lstrip('\n') */
                ra = c;
                re = close;
                rstrip_nl(ra, &re);
                const char *open = rfind(ra, re, "<think>");
                if (open) ra = open + 7;
                lstrip_nl(&ra, re);
                /* content = content.split('</think>')[-1].lstrip('\n') */
                ca = rfind(c, ce, "</think>") + 8;
                lstrip_nl(&ca, ce);
            }
            FMOE_FORWARD_IF_ERROR(put(b, "<|im_start|>assistant\n"));
            if (i > last_query && (i + 1 == n || re > ra)) {
                const char *sa = ra, *se = re; /* reasoning.strip('\n') */
                lstrip_nl(&sa, se);
                rstrip_nl(sa, &se);
                FMOE_FORWARD_IF_ERROR(put(b, "<think>\n"));
                FMOE_FORWARD_IF_ERROR(putn(b, sa, (size_t)(se - sa)));
                FMOE_FORWARD_IF_ERROR(put(b, "\n</think>\n\n"));
                lstrip_nl(&ca, ce);
            }
            FMOE_FORWARD_IF_ERROR(putn(b, ca, (size_t)(ce - ca)));
            FMOE_FORWARD_IF_ERROR(put(b, "<|im_end|>\n"));
        } else if (role_is(&m[i], "tool")) {
            if (i == 0 || !role_is(&m[i - 1], "tool")) FMOE_FORWARD_IF_ERROR(put(b, "<|im_start|>user"));
            FMOE_FORWARD_IF_ERROR(put(b, "\n<tool_response>\n"));
            FMOE_FORWARD_IF_ERROR(put(b, c));
            FMOE_FORWARD_IF_ERROR(put(b, "\n</tool_response>"));
            if (i + 1 == n || !role_is(&m[i + 1], "tool")) FMOE_FORWARD_IF_ERROR(put(b, "<|im_end|>\n"));
        }
        /* a first system message was written above; other roles render nothing */
    }
    if (gen) {
        FMOE_FORWARD_IF_ERROR(put(b, "<|im_start|>assistant\n"));
        if (no_think) FMOE_FORWARD_IF_ERROR(put(b, "<think>\n\n</think>\n\n"));
    }
    return 0;
}

/* ---- olmoe ------------------------------------------------------------------------------------ */

static int render_olmoe(const fmoe_tokenizer *tok, const fmoe_chat_message *m, size_t n,
                        int gen, tok_buf *b) {
    if (tok->chat_bos) FMOE_FORWARD_IF_ERROR(put(b, tok->bos_text));
    for (size_t i = 0; i < n; i++) {
        const char *c = content_of(&m[i]);
        int last = i + 1 == n;
        if (role_is(&m[i], "system") || role_is(&m[i], "user")) {
            FMOE_FORWARD_IF_ERROR(put(b, role_is(&m[i], "system") ? "<|system|>\n" : "<|user|>\n"));
            FMOE_FORWARD_IF_ERROR(put(b, c));
            FMOE_FORWARD_IF_ERROR(put(b, "\n"));
        } else if (role_is(&m[i], "assistant")) {
            FMOE_FORWARD_IF_ERROR(put(b, "<|assistant|>\n"));
            FMOE_FORWARD_IF_ERROR(put(b, c));
            FMOE_FORWARD_IF_ERROR(put(b, tok->eos_text));
            if (!last) FMOE_FORWARD_IF_ERROR(put(b, "\n"));
        }
        if (last && gen) FMOE_FORWARD_IF_ERROR(put(b, "<|assistant|>\n"));
    }
    return 0;
}

/* ---- entry point ------------------------------------------------------------------------------ */

static int render_fixed(const fmoe_tokenizer *tok, const char *name, const fmoe_chat_message *msgs,
                        size_t n, const fmoe_chat_options *o, char **text, size_t *len) {
    tok_buf b = {0};
    int rc = fmoe__tok_buf_reserve(&b, 256);
    if (rc == 0) {
        if (strcmp(name, "mixtral") == 0) rc = render_mixtral(tok, msgs, n, &b);
        else if (strcmp(name, "chatml") == 0) rc = render_chatml(tok, msgs, n, o->add_generation_prompt, &b);
        else if (strcmp(name, "qwen3") == 0)
            rc = render_qwen3(msgs, n, o->add_generation_prompt, o->disable_thinking, &b);
        else if (strcmp(name, "olmoe") == 0) rc = render_olmoe(tok, msgs, n, o->add_generation_prompt, &b);
        else
            rc = fmoe_error_set(FMOE_EINVAL,
                                "chat template \"%s\" is unknown (supported: mixtral, chatml, "
                                "qwen3, olmoe, jinja)",
                                name);
    }
    if (rc < 0) {
        fmoe__tok_buf_free(&b);
        return rc;
    }
    *text = b.p;
    if (len) *len = b.len;
    return 0;
}

int fmoe_tokenizer_apply_chat_template(const fmoe_tokenizer *tok, const fmoe_chat_message *msgs,
                                       size_t n, const fmoe_chat_options *opt, char **text,
                                       size_t *len) {
    *text = NULL;
    if (len) *len = 0;
    if (!tok || (!msgs && n)) return fmoe_error_set(FMOE_EINVAL, "chat template: no messages");
    fmoe_chat_options o = {0};
    if (opt) o = *opt;
    const char *tmpl = fmoe__chat_template_for(tok, &o);
    int as_written = o.template_name && strcmp(o.template_name, "jinja") == 0;
    if (as_written && !tmpl)
        return fmoe_error_set(FMOE_ENOTFOUND, "%s: the tokenizer has no chat template text to "
                              "render", tok->path);
    /* refused at load with a family to fall back on: said once then, not per render */
    int refused = tmpl == tok->chat_template_text && tok->chat_refused && tok->chat_family;
    if (tmpl && (as_written || (!o.template_name && !refused))) {
        int rc = fmoe__chat_render_jinja(tok, tmpl, msgs, n, &o, text, len);
        /* a construct the interpreter does not implement: the fixed renderer of the family,
         * when there is one; any other failure (the template's raise_exception, a limit)
         * is the answer */
        if (rc != FMOE_EUNSUPPORTED && rc != FMOE_EFORMAT) return rc;
        if (as_written || !tok->chat_family) return rc;
        fmoe_log(FMOE_LOG_WARN, "%s: %s; using fmoe's fixed %s renderer instead", tok->path,
                 fmoe_error_detail(), tok->chat_family);
        fmoe_error_clear();
    }
    const char *name = o.template_name ? o.template_name : tok->chat_family;
    if (!name)
        return fmoe_error_set(FMOE_ENOTFOUND,
                              "%s: no chat template (none in tokenizer_config.json, "
                              "chat_template.jinja or the GGUF file, and no family recognised "
                              "from the special tokens); name one of mixtral, chatml, qwen3, "
                              "olmoe to override",
                              tok->path);
    return render_fixed(tok, name, msgs, n, &o, text, len);
}
