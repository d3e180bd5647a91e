/*
 * serve_tools.c - reasoning, tool calls and content of a model's output (serve_tools.h).
 *
 * The parser reads the whole output from the start every time (a stream calls it once per
 * chunk: O(n) per chunk, O(n^2) bytes over a response, which for the few kilobytes of a
 * chat answer is far below the cost of one forward pass: 0.7 us a chunk for a 3.5 KB
 * answer streamed 4 bytes at a time, docs/serving.md#tool-calls). Every rule is written so that
 * a parse of a shorter text is a prefix of the parse of a longer one:
 *   - a tail that is the start of a marker (`<tool_c`) is held back, not emitted;
 *   - whitespace-only text next to tool calls is held while it is whitespace-only and
 *     dropped once a call follows it (the templates put newlines between calls);
 *   - a call is emitted only once its name is whole, and its arguments are the bytes the
 *     model wrote, up to where a JSON scanner (strings, escapes, nesting) says the value
 *     ends, so they only grow;
 *   - a call that does not read as expected is held until it closes, then read whole.
 */
#include "serve_tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "fmoe/error.h"

/* The markers, as the families' tokenizers write them (DeepSeek's are full-width bars and
 * U+2581 "▁" for spaces). */
#define THINK_OPEN "<think>"
#define THINK_CLOSE "</think>"
#define HERMES_OPEN "<tool_call>"
#define HERMES_CLOSE "</tool_call>"
#define MISTRAL_OPEN "[TOOL_CALLS]"
#define DS_CALLS_BEGIN "<\xEF\xBD\x9Ctool\xE2\x96\x81" "calls\xE2\x96\x81" "begin\xEF\xBD\x9C>"
#define DS_CALLS_END "<\xEF\xBD\x9Ctool\xE2\x96\x81" "calls\xE2\x96\x81" "end\xEF\xBD\x9C>"
#define DS_CALL_BEGIN "<\xEF\xBD\x9Ctool\xE2\x96\x81" "call\xE2\x96\x81" "begin\xEF\xBD\x9C>"
#define DS_CALL_END "<\xEF\xBD\x9Ctool\xE2\x96\x81" "call\xE2\x96\x81" "end\xEF\xBD\x9C>"
#define DS_SEP "<\xEF\xBD\x9Ctool\xE2\x96\x81" "sep\xEF\xBD\x9C>"
/* Llama 3.1's marker of a tool call (its templates also write calls as bare JSON) */
#define PYTHON_TAG "<|python_tag|>"
#define MISTRAL_ARGS "[ARGS]"
#define MISTRAL_CALL_ID "[CALL_ID]"
/* OpenAI harmony's special tokens (the gpt-oss chat template, openai/harmony's format doc) */
#define H_START "<|start|>"
#define H_CHANNEL "<|channel|>"
#define H_MESSAGE "<|message|>"
#define H_END "<|end|>"
#define H_RETURN "<|return|>"
#define H_CALL "<|call|>"

/* ---------------------------------------------------------------------------------------
 * Choosing the format
 * ------------------------------------------------------------------------------------ */

/* Markup of formats fmoe does not read, found before the ones it does, so that such a
 * template is refused by name rather than read wrongly (Qwen3-Coder's XML calls also sit
 * in <tool_call> blocks; Mistral's newer templates also start with [TOOL_CALLS]). */
static const struct {
    const char *marker, *name;
} unsupported[] = {
    {"<function=", "Qwen3-Coder's XML calls (<tool_call><function=...>)"},
    {"<|tool_call|>", "<|tool_call|> (Granite, Phi-4)"},
};

const char *fmoe_serve_tools_unsupported(const char *t) {
    for (size_t i = 0; t && i < sizeof unsupported / sizeof unsupported[0]; i++)
        if (strstr(t, unsupported[i].marker)) return unsupported[i].name;
    return NULL;
}

serve_tools_format fmoe_serve_tools_detect(const char *t) {
    if (!t || fmoe_serve_tools_unsupported(t)) return SERVE_TOOLS_NONE;
    /* gpt-oss: the harmony header tokens; checked first, its template names no other */
    if (strstr(t, H_CHANNEL) && strstr(t, H_MESSAGE)) return SERVE_TOOLS_HARMONY;
    /* Mistral's newer templates write the name before [ARGS]; the older ones a JSON list */
    if (strstr(t, MISTRAL_OPEN) && strstr(t, MISTRAL_ARGS)) return SERVE_TOOLS_MISTRAL_ARGS;
    /* Llama 3.1/3.3 name <|python_tag|>; 3.2 only asks for {"name": ..., "parameters": ...}
     * and closes turns with <|eot_id|> */
    if (strstr(t, PYTHON_TAG) || (strstr(t, "\"parameters\": ") && strstr(t, "<|eot_id|>")))
        return SERVE_TOOLS_LLAMA3;
    if (strstr(t, DS_CALLS_BEGIN))
        /* V3's template writes the ```json fence around the arguments; V3.1's does not */
        return strstr(t, "```json") ? SERVE_TOOLS_DEEPSEEK_V3 : SERVE_TOOLS_DEEPSEEK_V31;
    if (strstr(t, HERMES_OPEN)) return SERVE_TOOLS_HERMES;
    if (strstr(t, MISTRAL_OPEN)) return SERVE_TOOLS_MISTRAL;
    return SERVE_TOOLS_NONE;
}

const char *fmoe_serve_tools_format_name(int32_t format) {
    switch (format) {
    case SERVE_TOOLS_HERMES: return "hermes";
    case SERVE_TOOLS_MISTRAL: return "mistral";
    case SERVE_TOOLS_DEEPSEEK_V3: return "deepseek_v3";
    case SERVE_TOOLS_DEEPSEEK_V31: return "deepseek_v31";
    case SERVE_TOOLS_HARMONY: return "harmony";
    case SERVE_TOOLS_LLAMA3: return "llama3_json";
    case SERVE_TOOLS_MISTRAL_ARGS: return "mistral_args";
    default: return "none";
    }
}

int fmoe_serve_tools_forced_prefix(int32_t format, const char *name, const char *template_text,
                                   char out[SERVE_TOOLS_PREFIX_MAX]) {
    int n;
    /* Mistral v0.3's template writes "[TOOL_CALLS] [", Nemo's "[TOOL_CALLS][" */
    const char *mistral_open = template_text && strstr(template_text, MISTRAL_OPEN " [")
                                   ? MISTRAL_OPEN " [" : MISTRAL_OPEN "[";
    /* what the families' templates write for an earlier call, up to where the model's
     * choice begins: the name (name NULL) or the arguments */
    switch (format) {
    case SERVE_TOOLS_HERMES:
        n = name ? snprintf(out, SERVE_TOOLS_PREFIX_MAX,
                            HERMES_OPEN "\n{\"name\": \"%s\", \"arguments\": ", name)
                 : snprintf(out, SERVE_TOOLS_PREFIX_MAX, HERMES_OPEN "\n{\"name\": \"");
        break;
    case SERVE_TOOLS_MISTRAL:
        n = name ? snprintf(out, SERVE_TOOLS_PREFIX_MAX, "%s{\"name\": \"%s\", \"arguments\": ",
                            mistral_open, name)
                 : snprintf(out, SERVE_TOOLS_PREFIX_MAX, "%s{\"name\": \"", mistral_open);
        break;
    case SERVE_TOOLS_DEEPSEEK_V3:
        n = name ? snprintf(out, SERVE_TOOLS_PREFIX_MAX,
                            DS_CALLS_BEGIN DS_CALL_BEGIN "function" DS_SEP "%s\n```json\n", name)
                 : snprintf(out, SERVE_TOOLS_PREFIX_MAX,
                            DS_CALLS_BEGIN DS_CALL_BEGIN "function" DS_SEP);
        break;
    case SERVE_TOOLS_DEEPSEEK_V31:
        n = name ? snprintf(out, SERVE_TOOLS_PREFIX_MAX, DS_CALLS_BEGIN DS_CALL_BEGIN "%s" DS_SEP,
                            name)
                 : snprintf(out, SERVE_TOOLS_PREFIX_MAX, DS_CALLS_BEGIN DS_CALL_BEGIN);
        break;
    case SERVE_TOOLS_HARMONY:
        /* the prompt ends with <|start|>assistant; the call's header as gpt-oss writes it
         * (the recipient after the channel, the arguments' type after <|constrain|>) */
        n = name ? snprintf(out, SERVE_TOOLS_PREFIX_MAX,
                            H_CHANNEL "commentary to=functions.%s <|constrain|>json" H_MESSAGE,
                            name)
                 : snprintf(out, SERVE_TOOLS_PREFIX_MAX, H_CHANNEL "commentary to=functions.");
        break;
    case SERVE_TOOLS_LLAMA3:
        /* as Llama 3's templates write an earlier call */
        n = name ? snprintf(out, SERVE_TOOLS_PREFIX_MAX, "{\"name\": \"%s\", \"parameters\": ", name)
                 : snprintf(out, SERVE_TOOLS_PREFIX_MAX, "{\"name\": \"");
        break;
    case SERVE_TOOLS_MISTRAL_ARGS:
        n = name ? snprintf(out, SERVE_TOOLS_PREFIX_MAX, MISTRAL_OPEN "%s" MISTRAL_ARGS, name)
                 : snprintf(out, SERVE_TOOLS_PREFIX_MAX, MISTRAL_OPEN);
        break;
    default: return -1;
    }
    return n > 0 && n < SERVE_TOOLS_PREFIX_MAX ? 0 : -1;
}

int fmoe_serve_tools_call_opening(int32_t format, const char *template_text,
                                  char out[SERVE_TOOLS_PREFIX_MAX], const char **args_key) {
    *args_key = "arguments";
    switch (format) {
    case SERVE_TOOLS_HERMES: snprintf(out, SERVE_TOOLS_PREFIX_MAX, HERMES_OPEN "\n"); return 0;
    case SERVE_TOOLS_MISTRAL:
        /* as fmoe_serve_tools_forced_prefix opens the list */
        snprintf(out, SERVE_TOOLS_PREFIX_MAX, "%s",
                 template_text && strstr(template_text, MISTRAL_OPEN " [") ? MISTRAL_OPEN " ["
                                                                          : MISTRAL_OPEN "[");
        return 0;
    case SERVE_TOOLS_LLAMA3:
        out[0] = '\0'; /* the output is the call */
        *args_key = "parameters";
        return 0;
    default: return -1;
    }
}

void fmoe_serve_tools_call_id(int32_t format, const char *response_id, int32_t choice,
                              int32_t index, char out[SERVE_TOOLS_ID_MAX]) {
    /* FNV-1a over the response id, then splitmix64 steps: unique as the (random) response
     * id is, and the same id for the same call in a stream and a whole response */
    uint64_t h = 1469598103934665603ull;
    for (const char *p = response_id ? response_id : ""; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    h ^= ((uint64_t)(uint32_t)choice << 32) | (uint32_t)index;
    char digits[24];
    static const char alnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    const int mistral = format == SERVE_TOOLS_MISTRAL || format == SERVE_TOOLS_MISTRAL_ARGS;
    for (int i = 0; i < (mistral ? 9 : 24); i++) {
        h += 0x9E3779B97F4A7C15ull;
        uint64_t z = h;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        digits[i] = mistral ? alnum[z % 62] : "0123456789abcdef"[z & 15];
    }
    if (mistral) snprintf(out, SERVE_TOOLS_ID_MAX, "%.9s", digits);
    else snprintf(out, SERVE_TOOLS_ID_MAX, "call_%.24s", digits);
}

/* ---------------------------------------------------------------------------------------
 * Text helpers
 * ------------------------------------------------------------------------------------ */

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static size_t skip_ws(const char *s, size_t n, size_t p) {
    while (p < n && is_ws(s[p])) p++;
    return p;
}

static int starts(const char *s, size_t n, size_t p, const char *lit) {
    const size_t m = strlen(lit);
    return p <= n && n - p >= m && memcmp(s + p, lit, m) == 0;
}

/* s[p..n) is a proper prefix of lit (empty included). */
static int prefix_of(const char *s, size_t n, size_t p, const char *lit) {
    const size_t m = strlen(lit);
    return p <= n && n - p < m && memcmp(s + p, lit, n - p) == 0;
}

static size_t find(const char *s, size_t n, size_t p, const char *lit) {
    const size_t m = strlen(lit);
    for (; p + m <= n; p++)
        if (s[p] == lit[0] && memcmp(s + p, lit, m) == 0) return p;
    return n;
}

/* The longest tail of s[p..n) that is a proper, non-empty prefix of lit. */
static size_t tail_hold(const char *s, size_t n, size_t p, const char *lit) {
    const size_t m = strlen(lit);
    for (size_t k = m - 1 < n - p ? m - 1 : n - p; k > 0; k--)
        if (memcmp(s + n - k, lit, k) == 0) return k;
    return 0;
}

static int all_ws(const char *s, size_t a, size_t b) {
    for (size_t i = a; i < b; i++)
        if (!is_ws(s[i])) return 0;
    return 1;
}

/* ---------------------------------------------------------------------------------------
 * The parse state
 * ------------------------------------------------------------------------------------ */

typedef struct buf {
    char *p;
    size_t len, cap;
} buf;

static int buf_add(buf *b, const char *a, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->cap ? b->cap * 2 : 64) + n;
        char *q = realloc(b->p, cap);
        if (!q) return FMOE_ENOMEM;
        b->p = q;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, a, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

typedef struct parser {
    const serve_tools_config *cfg;
    const char *s;    /* prefix + text */
    size_t n;
    int final;
    buf content, reasoning;
    serve_tools_parse *out;
    int32_t cap_calls;
    int blocks;       /* tool-call blocks read so far */
    int stop;         /* 1: nothing more is read (parallel_tool_calls false, one call read) */
} parser;

enum { MORE = 0, DONE = 1 };

static int add_call(parser *P, const char *name, size_t nlen, const char *args, size_t alen) {
    serve_tools_parse *o = P->out;
    if (o->num_calls == P->cap_calls) {
        int32_t cap = P->cap_calls ? 2 * P->cap_calls : 4;
        serve_tool_call *c = realloc(o->calls, (size_t)cap * sizeof *c);
        if (!c) return FMOE_ENOMEM;
        o->calls = c;
        P->cap_calls = cap;
    }
    serve_tool_call *c = &o->calls[o->num_calls];
    c->name = malloc(nlen + 1);
    c->arguments = malloc(alen + 1);
    if (!c->name || !c->arguments) {
        free(c->name);
        free(c->arguments);
        return FMOE_ENOMEM;
    }
    memcpy(c->name, name, nlen);
    c->name[nlen] = '\0';
    if (alen) memcpy(c->arguments, args, alen);
    c->arguments[alen] = '\0';
    c->arguments_len = alen;
    o->num_calls++;
    if (!P->cfg->parallel) P->stop = 1;
    return 0;
}

/* Text outside markup, s[a..b). open: more of it may come (it reached the end of what
 * was generated). Whitespace-only text is held while open, dropped next to a call, and
 * kept only as the whole answer of an output without calls. */
static int content_segment(parser *P, size_t a, size_t b, int open, int before_marker) {
    if (a >= b) return 0;
    if (all_ws(P->s, a, b)) {
        if (open || before_marker || P->blocks > 0) return 0;
    }
    return buf_add(&P->content, P->s + a, b - a);
}

/* Where a JSON value starting at p ends, by strings, escapes and nesting (not validated).
 * close: a marker that ends the value wherever it stands outside a string (no JSON holds
 * it there), NULL for none. @return 1 complete (*end past it), 0 not yet (*end: how much
 * of it is certain). */
static int scan_value(const parser *P, size_t p, const char *close, size_t *end) {
    const char *s = P->s;
    const size_t n = P->n;
    int depth = 0, in_str = 0, esc = 0;
    for (size_t i = p; i < n; i++) {
        const char c = s[i];
        if (in_str) {
            if (esc) esc = 0;
            else if (c == '\\') esc = 1;
            else if (c == '"') {
                in_str = 0;
                if (depth == 0) {
                    *end = i + 1;
                    return 1;
                }
            }
            continue;
        }
        if (close && c == close[0]) {
            if (starts(s, n, i, close)) {
                *end = i;
                return 1;
            }
            if (!P->final && prefix_of(s, n, i, close)) {
                *end = i;
                return 0;
            }
        }
        if (c == '"') {
            in_str = 1;
        } else if (c == '{' || c == '[') {
            depth++;
        } else if (c == '}' || c == ']') {
            if (depth == 0) { /* the enclosing object's end: a scalar ended before it */
                *end = i;
                return 1;
            }
            if (--depth == 0) {
                *end = i + 1;
                return 1;
            }
        } else if (depth == 0 && (is_ws(c) || c == ',') && i > p) {
            *end = i;
            return 1;
        }
    }
    *end = n;
    return P->final;
}

/* Reads a JSON string s[p] == '"' holding no escapes. @return 1 and [*a, *b) its text,
 * *end past it; 0 not whole yet; -1 not such a string. */
static int plain_string(const parser *P, size_t p, size_t *a, size_t *b, size_t *end) {
    if (p >= P->n) return 0;
    if (P->s[p] != '"') return -1;
    for (size_t i = p + 1; i < P->n; i++) {
        if (P->s[i] == '\\' || (unsigned char)P->s[i] < 0x20) return -1;
        if (P->s[i] == '"') {
            *a = p + 1;
            *b = i;
            *end = i + 1;
            return 1;
        }
    }
    return 0;
}

enum { CALL_NEED, CALL_BAD, CALL_OPEN, CALL_DONE };

/* {"name": "N", "arguments": A} from p (A may be named "parameters"). CALL_OPEN and
 * CALL_DONE add the call (with the arguments so far); *end is past A (and past the
 * object's "}" when it follows). */
static int scan_call_object(parser *P, size_t p, const char *close, size_t *end) {
    const char *s = P->s;
    const size_t n = P->n;
    size_t a, b, q;
    p = skip_ws(s, n, p);
    if (p >= n) return CALL_NEED;
    if (s[p] != '{') return CALL_BAD;
    p = skip_ws(s, n, p + 1);
    int r = plain_string(P, p, &a, &b, &q);
    if (r <= 0) return r < 0 ? CALL_BAD : CALL_NEED;
    if (b - a != 4 || memcmp(s + a, "name", 4) != 0) return CALL_BAD;
    p = skip_ws(s, n, q);
    if (p >= n) return CALL_NEED;
    if (s[p] != ':') return CALL_BAD;
    p = skip_ws(s, n, p + 1);
    size_t na, nb;
    r = plain_string(P, p, &na, &nb, &q);
    if (r <= 0) return r < 0 ? CALL_BAD : CALL_NEED;
    if (nb == na) return CALL_BAD;
    p = skip_ws(s, n, q);
    if (p >= n) return CALL_NEED;
    if (s[p] != ',') return CALL_BAD;
    p = skip_ws(s, n, p + 1);
    r = plain_string(P, p, &a, &b, &q);
    if (r <= 0) return r < 0 ? CALL_BAD : CALL_NEED;
    if (!((b - a == 9 && memcmp(s + a, "arguments", 9) == 0) ||
          (b - a == 10 && memcmp(s + a, "parameters", 10) == 0)))
        return CALL_BAD;
    p = skip_ws(s, n, q);
    if (p >= n) return CALL_NEED;
    if (s[p] != ':') return CALL_BAD;
    p = skip_ws(s, n, p + 1);
    if (p >= n && !P->final) return CALL_NEED; /* the value's first byte decides its kind */
    size_t vend;
    const int whole = scan_value(P, p, close, &vend);
    if (add_call(P, s + na, nb - na, s + p, vend - p) < 0) return -1;
    if (!whole) return CALL_OPEN;
    q = skip_ws(s, n, vend);
    *end = q < n && s[q] == '}' ? q + 1 : vend;
    return CALL_DONE;
}

/* A call read whole with a JSON parser: {"name", "arguments" | "parameters"} in any order;
 * arguments that are not a string are printed compactly. @return 1 added, 0 not a call,
 * -1 out of memory. */
static int opaque_call(parser *P, size_t a, size_t b) {
    cJSON *j = cJSON_ParseWithLength(P->s + a, b - a);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
    if (!cJSON_IsObject(j) || !cJSON_IsString(name) || !name->valuestring[0]) {
        cJSON_Delete(j);
        return 0;
    }
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(j, "arguments");
    if (!args) args = cJSON_GetObjectItemCaseSensitive(j, "parameters");
    char *printed = NULL;
    const char *at = "{}";
    if (cJSON_IsString(args)) at = args->valuestring;
    else if (args && !(at = printed = cJSON_PrintUnformatted(args))) {
        cJSON_Delete(j);
        return -1;
    }
    const int rc = add_call(P, name->valuestring, strlen(name->valuestring), at, strlen(at));
    cJSON_free(printed);
    cJSON_Delete(j);
    return rc < 0 ? -1 : 1;
}

/* Keeps s[m..b) (a block that is no call) in the content as the model wrote it. */
static int raw_block(parser *P, size_t m, size_t b) {
    return buf_add(&P->content, P->s + m, b - m);
}

/* <tool_call> JSON </tool_call>, from p past the opening tag (m: the tag). */
static int hermes_block(parser *P, size_t m, size_t p, size_t *pos) {
    const char *s = P->s;
    const size_t n = P->n;
    size_t e;
    const int r = scan_call_object(P, p, HERMES_CLOSE, &e);
    if (r < 0) return FMOE_ENOMEM;
    if (r == CALL_OPEN || (r == CALL_NEED && !P->final)) return MORE;
    if (r == CALL_DONE) {
        size_t c = find(s, n, e, HERMES_CLOSE);
        if (c == n) {
            if (!P->final) return MORE;
            *pos = n;
        } else {
            *pos = c + strlen(HERMES_CLOSE);
        }
        return DONE;
    }
    /* CALL_BAD, or CALL_NEED at the end: read whole once it closes */
    size_t c = find(s, n, p, HERMES_CLOSE);
    if (c == n && !P->final) return MORE;
    const int ok = opaque_call(P, p, c);
    if (ok < 0) return FMOE_ENOMEM;
    const size_t after = c == n ? n : c + strlen(HERMES_CLOSE);
    if (!ok && raw_block(P, m, after) < 0) return FMOE_ENOMEM;
    *pos = after;
    return DONE;
}

/* [TOOL_CALLS] [{...}, {...}] from p past the marker. */
static int mistral_block(parser *P, size_t m, size_t p, size_t *pos) {
    const char *s = P->s;
    const size_t n = P->n;
    p = skip_ws(s, n, p);
    if (p >= n) {
        if (!P->final) return MORE;
        *pos = n;
        return DONE;
    }
    if (s[p] != '[') goto bad;
    p++;
    for (;;) {
        size_t e;
        const int r = scan_call_object(P, p, NULL, &e);
        if (r < 0) return FMOE_ENOMEM;
        if (r == CALL_BAD) goto bad;
        if (r != CALL_DONE) {
            if (!P->final) return MORE;
            *pos = n;
            return DONE;
        }
        if (P->stop) { /* parallel_tool_calls false: the rest is not read */
            *pos = n;
            return DONE;
        }
        p = skip_ws(s, n, e);
        if (p >= n) {
            if (!P->final) return MORE;
            *pos = n;
            return DONE;
        }
        if (s[p] == ',') {
            p++;
            continue;
        }
        *pos = s[p] == ']' ? p + 1 : p;
        return DONE;
    }
bad:
    /* not the JSON list: the rest stays text, once it is all there */
    if (!P->final) return MORE;
    if (raw_block(P, m, n) < 0) return FMOE_ENOMEM;
    *pos = n;
    return DONE;
}

/* DeepSeek's calls, from p past <｜tool▁calls▁begin｜>. */
static int deepseek_block(parser *P, size_t m, size_t p, size_t *pos) {
    const char *s = P->s;
    const size_t n = P->n;
    const int v3 = P->cfg->format == SERVE_TOOLS_DEEPSEEK_V3;
    for (;;) {
        p = skip_ws(s, n, p);
        if (starts(s, n, p, DS_CALLS_END)) {
            *pos = p + strlen(DS_CALLS_END);
            return DONE;
        }
        if (p >= n || (!P->final && (prefix_of(s, n, p, DS_CALLS_END) ||
                                     prefix_of(s, n, p, DS_CALL_BEGIN)))) {
            if (!P->final) return MORE;
            *pos = n;
            return DONE;
        }
        if (!starts(s, n, p, DS_CALL_BEGIN)) {
            if (P->blocks == 0 && P->out->num_calls == 0) goto bad;
            *pos = p; /* what follows the calls is text */
            return DONE;
        }
        size_t q = p + strlen(DS_CALL_BEGIN), na, nb, v;
        if (v3) {
            if (!starts(s, n, q, "function" DS_SEP)) {
                if (!P->final && prefix_of(s, n, q, "function" DS_SEP)) return MORE;
                goto bad;
            }
            na = q + strlen("function" DS_SEP);
            nb = find(s, n, na, "\n");
            if (nb == n) {
                if (!P->final) return MORE;
                goto bad;
            }
            v = skip_ws(s, n, nb);
            if (!starts(s, n, v, "```json")) {
                if (!P->final && prefix_of(s, n, v, "```json")) return MORE;
                goto bad;
            }
            v = skip_ws(s, n, v + strlen("```json"));
        } else {
            na = q;
            nb = find(s, n, na, DS_SEP);
            if (nb == n) {
                if (!P->final) return MORE;
                goto bad;
            }
            v = skip_ws(s, n, nb + strlen(DS_SEP));
        }
        if (nb == na || nb - na > 256) goto bad;
        if (v >= n && !P->final) return MORE;
        size_t vend;
        const int whole = scan_value(P, v, v3 ? "```" : DS_CALL_END, &vend);
        if (add_call(P, s + na, nb - na, s + v, vend - v) < 0) return FMOE_ENOMEM;
        if (!whole) return MORE;
        size_t c = find(s, n, vend, DS_CALL_END);
        if (c == n) {
            if (!P->final) return MORE;
            *pos = n;
            return DONE;
        }
        p = c + strlen(DS_CALL_END);
        if (P->stop) {
            *pos = n;
            return DONE;
        }
    }
bad:
    if (!P->final) return MORE;
    if (raw_block(P, m, n) < 0) return FMOE_ENOMEM;
    *pos = n;
    return DONE;
}

/* A function name as OpenAI allows them (serve's request check), at most 64 bytes. */
static int name_ok(const char *s, size_t a, size_t b) {
    if (b <= a || b - a > 64) return 0;
    for (size_t i = a; i < b; i++) {
        const char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return 0;
    }
    return 1;
}

/* [TOOL_CALLS]N[ARGS]A from p past [TOOL_CALLS] (Mistral Small 3.2's template; its v11
 * form puts [CALL_ID]id between the name and [ARGS]). The next call opens with its own
 * [TOOL_CALLS], found by parse_all. */
static int mistral_args_block(parser *P, size_t m, size_t p, size_t *pos) {
    const char *s = P->s;
    const size_t n = P->n;
    size_t q = p;
    while (q < n && s[q] != '[') q++;
    if (q == n || (!P->final && (prefix_of(s, n, q, MISTRAL_ARGS) ||
                                 prefix_of(s, n, q, MISTRAL_CALL_ID)))) {
        /* the name is not whole yet: held while it can still be one */
        if (!P->final && (q == n ? q - p <= 64 : 1) && (q == p || name_ok(s, p, q)))
            return MORE;
        goto bad;
    }
    if (!name_ok(s, p, q)) goto bad;
    size_t v = q;
    if (starts(s, n, v, MISTRAL_CALL_ID)) {
        v = find(s, n, v, MISTRAL_ARGS);
        if (v == n) {
            if (!P->final) return MORE;
            goto bad;
        }
    }
    if (!starts(s, n, v, MISTRAL_ARGS)) goto bad;
    v = skip_ws(s, n, v + strlen(MISTRAL_ARGS));
    if (v >= n && !P->final) return MORE;
    size_t vend;
    const int whole = scan_value(P, v, NULL, &vend);
    if (add_call(P, s + p, q - p, s + v, vend - v) < 0) return FMOE_ENOMEM;
    if (!whole) return MORE;
    *pos = P->stop ? n : vend;
    return DONE;
bad:
    if (!P->final) return MORE;
    if (raw_block(P, m, n) < 0) return FMOE_ENOMEM;
    *pos = n;
    return DONE;
}

/* Llama 3: the output is a call when it starts (after <|python_tag|> or not) with a JSON
 * object {"name": N, "parameters": A}; calls may follow each other after ";" (vLLM's
 * llama3_json reading). Anything else is the answer. */
static int llama3_all(parser *P, size_t pos) {
    const char *s = P->s;
    const size_t n = P->n;
    size_t p = skip_ws(s, n, pos);
    if (!P->final && (p == n || prefix_of(s, n, p, PYTHON_TAG))) return 0; /* not known yet */
    if (starts(s, n, p, PYTHON_TAG)) p = skip_ws(s, n, p + strlen(PYTHON_TAG));
    if (p < n && s[p] != '{') return buf_add(&P->content, s + pos, n - pos);
    for (;;) {
        size_t e;
        const int r = scan_call_object(P, p, NULL, &e);
        if (r < 0) return FMOE_ENOMEM;
        if (r == CALL_OPEN || (r == CALL_NEED && !P->final)) return 0;
        if (r == CALL_BAD || r == CALL_NEED) {
            /* another key order, say: read whole at the end; not a call: the answer */
            if (!P->final) return 0;
            const int ok = P->out->num_calls == 0 ? opaque_call(P, p, n) : 0;
            if (ok < 0) return FMOE_ENOMEM;
            return ok ? 0 : buf_add(&P->content, s + p, n - p);
        }
        P->blocks++;
        if (P->stop) return 0;
        p = skip_ws(s, n, e);
        if (p < n && s[p] == ';') p = skip_ws(s, n, p + 1);
        if (p >= n) return 0;
        if (s[p] != '{') return buf_add(&P->content, s + p, n - p);
    }
}

/* Harmony (gpt-oss): messages header <|message|> body, each ended by <|end|> (another
 * message follows, opened by <|start|>assistant) or by <|return|> / <|call|> (the stop
 * tokens, usually not in the text). The header holds the channel after <|channel|> and a
 * recipient after "to=" (before or after the channel). A header is read once its
 * <|message|> came; a body grows into the part its header says. */
static void harmony_word(const char *s, size_t a, size_t b, const char *key, size_t *wa,
                         size_t *wb) {
    *wa = *wb = 0;
    const size_t at = find(s, b, a, key);
    if (at == b) return;
    size_t e = at + strlen(key);
    *wa = e;
    while (e < b && s[e] != ' ' && s[e] != '<') e++;
    *wb = e;
}

static int harmony_all(parser *P) {
    const char *s = P->s;
    const size_t n = P->n;
    static const char *const ends[] = {H_END, H_RETURN, H_CALL};
    size_t pos = 0;
    while (!P->stop && pos < n) {
        if (starts(s, n, pos, H_START)) pos += strlen(H_START);
        const size_t m = find(s, n, pos, H_MESSAGE);
        if (m == n) {
            /* a header still being written; at the end, text that never was harmony is
             * the answer as written */
            if (P->final && P->blocks == 0) return buf_add(&P->content, s + pos, n - pos);
            return 0;
        }
        size_t ca, cb, ra, rb;
        harmony_word(s, pos, m, H_CHANNEL, &ca, &cb);
        harmony_word(s, pos, m, "to=", &ra, &rb);
        const size_t b = m + strlen(H_MESSAGE);
        size_t e = n, hold = 0, tlen = 0;
        for (int k = 0; k < 3; k++) {
            const size_t f = find(s, n, b, ends[k]);
            if (f < e) {
                e = f;
                tlen = strlen(ends[k]);
            }
        }
        if (e == n && !P->final)
            for (int k = 0; k < 3; k++) {
                const size_t h = tail_hold(s, n, b, ends[k]);
                if (h > hold) hold = h;
            }
        const size_t be = e - hold;
        int rc;
        const int function = rb > ra + 10 && memcmp(s + ra, "functions.", 10) == 0;
        if (function && P->cfg->no_calls) {
            /* tool_choice "none": OpenAI's API returns no call then, so one the model
             * wrote anyway is text, like commentary to no one */
            rc = buf_add(&P->content, s + b, be - b);
        } else if (function) {
            rc = add_call(P, s + ra + 10, rb - ra - 10, s + b, be - b);
        } else if (rb > ra || (cb - ca == 8 && memcmp(s + ca, "analysis", 8) == 0)) {
            /* the reasoning, and calls to the built-in tools (browser, python), which
             * serve does not run: the model's own working */
            P->out->has_reasoning = 1;
            rc = buf_add(&P->reasoning, s + b, be - b);
        } else {
            rc = buf_add(&P->content, s + b, be - b); /* final, commentary to the user */
        }
        if (rc < 0) return rc;
        if (e == n) return 0;
        P->blocks++;
        pos = e + tlen;
    }
    return 0;
}

static const char *open_marker(int32_t format) {
    switch (format) {
    case SERVE_TOOLS_HERMES: return HERMES_OPEN;
    case SERVE_TOOLS_MISTRAL:
    case SERVE_TOOLS_MISTRAL_ARGS: return MISTRAL_OPEN;
    case SERVE_TOOLS_DEEPSEEK_V3:
    case SERVE_TOOLS_DEEPSEEK_V31: return DS_CALLS_BEGIN;
    default: return NULL;
    }
}

/* Reasoning first: @return the position the answer starts at, or n + 1 when nothing
 * after the reasoning is known yet. */
static int reasoning_part(parser *P, size_t *pos) {
    const char *s = P->s;
    const size_t n = P->n;
    size_t p = 0;
    int inside = P->cfg->reasoning == SERVE_REASONING_OPEN;
    if (P->cfg->reasoning == SERVE_REASONING_TAG) {
        const size_t w = skip_ws(s, n, 0);
        if (starts(s, n, w, THINK_OPEN)) {
            inside = 1;
            p = w + strlen(THINK_OPEN);
        } else if (!P->final && prefix_of(s, n, w, THINK_OPEN)) {
            *pos = n + 1; /* "<thi" or only whitespace: not known yet */
            return 0;
        }
    }
    *pos = p;
    if (!inside) return 0;
    P->out->has_reasoning = 1;
    const size_t e = find(s, n, p, THINK_CLOSE);
    if (e == n) {
        const size_t hold = P->final ? 0 : tail_hold(s, n, p, THINK_CLOSE);
        *pos = n + 1;
        return buf_add(&P->reasoning, s + p, n - hold - p);
    }
    *pos = e + strlen(THINK_CLOSE);
    return buf_add(&P->reasoning, s + p, e - p);
}

static int parse_all(parser *P) {
    const char *s = P->s;
    const size_t n = P->n;
    size_t pos;
    int rc = reasoning_part(P, &pos);
    if (rc < 0 || pos > n) return rc;
    if (P->cfg->format == SERVE_TOOLS_HARMONY) return harmony_all(P);
    if (P->cfg->format == SERVE_TOOLS_LLAMA3) return llama3_all(P, pos);
    const char *marker = open_marker(P->cfg->format);
    if (!marker) return buf_add(&P->content, s + pos, n - pos);
    while (!P->stop) {
        const size_t m = find(s, n, pos, marker);
        if (m == n) {
            const size_t hold = P->final ? 0 : tail_hold(s, n, pos, marker);
            return content_segment(P, pos, n - hold, !P->final, 0);
        }
        if ((rc = content_segment(P, pos, m, 0, 1)) < 0) return rc;
        const size_t p = m + strlen(marker);
        switch (P->cfg->format) {
        case SERVE_TOOLS_HERMES: rc = hermes_block(P, m, p, &pos); break;
        case SERVE_TOOLS_MISTRAL: rc = mistral_block(P, m, p, &pos); break;
        case SERVE_TOOLS_MISTRAL_ARGS: rc = mistral_args_block(P, m, p, &pos); break;
        default: rc = deepseek_block(P, m, p, &pos); break;
        }
        if (rc <= 0) return rc; /* MORE: wait for the rest; or out of memory */
        P->blocks++;
    }
    return 0;
}

int fmoe_serve_tools_parse(const serve_tools_config *cfg, const char *text, size_t len,
                           int final, serve_tools_parse *out) {
    memset(out, 0, sizeof *out);
    const size_t np = strlen(cfg->prefix);
    char *s = malloc(np + len + 1);
    if (!s) return FMOE_ENOMEM;
    memcpy(s, cfg->prefix, np);
    if (len) memcpy(s + np, text, len);
    s[np + len] = '\0';
    parser P = {.cfg = cfg, .s = s, .n = np + len, .final = final, .out = out};
    int rc = parse_all(&P);
    /* an empty buffer is "" rather than NULL, so that callers need not care */
    if (rc >= 0) rc = buf_add(&P.content, "", 0);
    if (rc >= 0) rc = buf_add(&P.reasoning, "", 0);
    out->content = P.content.p;
    out->content_len = P.content.len;
    out->reasoning = P.reasoning.p;
    out->reasoning_len = P.reasoning.len;
    free(s);
    if (rc < 0) {
        fmoe_serve_tools_parse_free(out);
        return FMOE_ENOMEM;
    }
    return 0;
}

void fmoe_serve_tools_parse_free(serve_tools_parse *p) {
    if (!p) return;
    free(p->content);
    free(p->reasoning);
    for (int32_t i = 0; i < p->num_calls; i++) {
        free(p->calls[i].name);
        free(p->calls[i].arguments);
    }
    free(p->calls);
    memset(p, 0, sizeof *p);
}

/* ---------------------------------------------------------------------------------------
 * Streaming
 * ------------------------------------------------------------------------------------ */

void fmoe_serve_tools_stream_init(serve_tools_stream *s, const serve_tools_config *cfg) {
    memset(s, 0, sizeof *s);
    s->cfg = *cfg;
}

void fmoe_serve_tools_stream_free(serve_tools_stream *s) {
    if (!s) return;
    fmoe_serve_tools_parse_free(&s->last);
    free(s->args_sent);
    free(s->deltas);
    memset(s, 0, sizeof *s);
}

int fmoe_serve_tools_stream_next(serve_tools_stream *s, const char *text, size_t len, int final,
                                 serve_tools_delta *d) {
    memset(d, 0, sizeof *d);
    serve_tools_parse p;
    if (fmoe_serve_tools_parse(&s->cfg, text, len, final, &p) < 0) return FMOE_ENOMEM;
    if (p.num_calls > s->cap) {
        const int32_t cap = p.num_calls * 2;
        size_t *a = realloc(s->args_sent, (size_t)cap * sizeof *a);
        if (a) s->args_sent = a;
        serve_tools_call_delta *c = a ? realloc(s->deltas, (size_t)cap * sizeof *c) : NULL;
        if (!a || !c) {
            fmoe_serve_tools_parse_free(&p);
            return FMOE_ENOMEM;
        }
        s->deltas = c;
        for (int32_t i = s->cap; i < cap; i++) s->args_sent[i] = 0;
        s->cap = cap;
    }
    fmoe_serve_tools_parse_free(&s->last);
    s->last = p;
    /* each part of a parse extends the last one's (serve_tools.h); the guards keep a
     * broken promise from reading out of bounds */
    if (p.content_len > s->content_sent) {
        d->content = p.content + s->content_sent;
        d->content_len = p.content_len - s->content_sent;
        s->content_sent = p.content_len;
    }
    if (p.reasoning_len > s->reasoning_sent) {
        d->reasoning = p.reasoning + s->reasoning_sent;
        d->reasoning_len = p.reasoning_len - s->reasoning_sent;
        s->reasoning_sent = p.reasoning_len;
    }
    for (int32_t i = 0; i < p.num_calls; i++) {
        const serve_tool_call *c = &p.calls[i];
        const int first = i >= s->calls_sent;
        const size_t from = first ? 0 : s->args_sent[i];
        if (!first && c->arguments_len <= from) continue;
        serve_tools_call_delta *cd = &s->deltas[d->num_calls++];
        cd->index = i;
        cd->name = first ? c->name : NULL;
        cd->arguments = c->arguments + from;
        cd->arguments_len = c->arguments_len - from;
        s->args_sent[i] = c->arguments_len;
    }
    if (p.num_calls > s->calls_sent) s->calls_sent = p.num_calls;
    d->calls = d->num_calls ? s->deltas : NULL;
    return 0;
}
