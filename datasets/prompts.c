/*
 * prompts.c - prompt dataset readers (fmoe_prompts_load).
 *
 * Formats and what is taken from each record:
 *   sharegpt  JSON list (or JSON Lines) of {"id", "conversations": [{"from", "value"}]}:
 *             the first turn from "human" or "user".
 *   lmsys     JSON list or JSON Lines of {"conversation_id"?, "conversation":
 *             [{"role", "content"}]}: the first turn with role "user".
 *   jsonl     one {"prompt": "...", "id"?} per line (a JSON list of them is accepted too).
 *   text      one prompt per line; blank lines are skipped.
 * Records without a user turn, or whose first user turn is empty, are skipped and counted
 * in fmoe_prompt_set.skipped; anything structurally wrong (not an object, a turn without
 * its text, a wrong type) is an error naming the file and the line (JSON Lines, text) or
 * the record's 0-based index in the list (JSON lists). Every prompt must be valid UTF-8.
 *
 * Cost: the file is read once into memory and parsed with cJSON; JSON lists are parsed
 * whole (a 2 MB ShareGPT file takes a few milliseconds).
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "datasets_impl.h"
#include "fmoe/datasets.h"
#include "fmoe/error.h"

/* Where a record came from, for error messages. */
typedef struct record_loc {
    const char *path;
    int64_t line;   /* > 0: JSON Lines / text line */
    int64_t index;  /* line <= 0: index in a JSON list */
} record_loc;

static int loc_error(int code, const record_loc *loc, const char *msg) {
    if (loc->line > 0)
        return fmoe_error_set(code, "%s:%lld: %s", loc->path, (long long)loc->line, msg);
    return fmoe_error_set(code, "%s: record %lld: %s", loc->path, (long long)loc->index, msg);
}

/* ------------------------------------------------------------ the growing prompt set */

typedef struct set_builder {
    fmoe_prompt_set *set;
    int64_t cap;
} set_builder;

static int builder_add(set_builder *b, const char *id, const char *prompt, size_t prompt_len,
                       const record_loc *loc) {
    size_t bad = 0;
    if (!fmoe__ds_utf8_valid(prompt, prompt_len, &bad)) {
        char msg[96];
        snprintf(msg, sizeof msg, "prompt is not valid UTF-8 (byte %zu)", bad);
        return loc_error(FMOE_EFORMAT, loc, msg);
    }
    fmoe_prompt_set *s = b->set;
    if (s->count == b->cap) {
        int64_t cap = b->cap;
        FMOE_FORWARD_IF_ERROR(fmoe__ds_grow((void **)&s->ids, sizeof *s->ids, &cap, s->count + 1));
        cap = b->cap;
        FMOE_FORWARD_IF_ERROR(
            fmoe__ds_grow((void **)&s->prompts, sizeof *s->prompts, &cap, s->count + 1));
        b->cap = cap;
    }
    char *pid = strdup(id ? id : "");
    char *pp = malloc(prompt_len + 1);
    if (!pid || !pp) {
        free(pid);
        free(pp);
        return fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", loc->path);
    }
    memcpy(pp, prompt, prompt_len);
    pp[prompt_len] = '\0';
    s->ids[s->count] = pid;
    s->prompts[s->count] = pp;
    s->count++;
    return 0;
}

void fmoe_prompt_set_free(fmoe_prompt_set *s) {
    if (!s) return;
    for (int64_t i = 0; i < s->count; i++) {
        free(s->ids[i]);
        free(s->prompts[i]);
    }
    free(s->ids);
    free(s->prompts);
    free(s);
}

/* ------------------------------------------------------------ record extractors */

/* An id field: string, or number printed as an integer when integral. */
static int read_id(const cJSON *obj, const char *key, char *buf, size_t cap,
                   const record_loc *loc) {
    buf[0] = '\0';
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (cJSON_IsString(v)) {
        snprintf(buf, cap, "%s", v->valuestring);
        return 0;
    }
    if (cJSON_IsNumber(v)) {
        double d = v->valuedouble;
        /* integral and inside long long's range (a cast of one outside is UB) */
        if (d >= -9.2e18 && d <= 9.2e18 && d == (double)(long long)d)
            snprintf(buf, cap, "%lld", (long long)d);
        else
            snprintf(buf, cap, "%.17g", d);
        return 0;
    }
    char msg[96];
    snprintf(msg, sizeof msg, "\"%s\" is neither a string nor a number", key);
    return loc_error(FMOE_EFORMAT, loc, msg);
}

/* The first turn of `turns` whose `who_key` is one of `who` (NULL-terminated); the text
 * under `text_key`. @return 1 found (*text set), 0 none, or an error. */
static int first_turn(const cJSON *obj, const char *list_key, const char *who_key,
                      const char *const *who, const char *text_key, const char **text,
                      const record_loc *loc) {
    char msg[160];
    const cJSON *turns = cJSON_GetObjectItemCaseSensitive(obj, list_key);
    if (!turns) {
        snprintf(msg, sizeof msg, "no \"%s\" list", list_key);
        return loc_error(FMOE_EFORMAT, loc, msg);
    }
    if (!cJSON_IsArray(turns)) {
        snprintf(msg, sizeof msg, "\"%s\" is not a list", list_key);
        return loc_error(FMOE_EFORMAT, loc, msg);
    }
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, turns) {
        if (!cJSON_IsObject(t)) {
            snprintf(msg, sizeof msg, "%s[%d] is not an object", list_key, i);
            return loc_error(FMOE_EFORMAT, loc, msg);
        }
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(t, who_key);
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(t, text_key);
        if (!cJSON_IsString(w)) {
            snprintf(msg, sizeof msg, "%s[%d] has no string \"%s\"", list_key, i, who_key);
            return loc_error(FMOE_EFORMAT, loc, msg);
        }
        if (!cJSON_IsString(x)) {
            snprintf(msg, sizeof msg, "%s[%d] has no string \"%s\"", list_key, i, text_key);
            return loc_error(FMOE_EFORMAT, loc, msg);
        }
        for (const char *const *k = who; *k; k++) {
            if (strcmp(w->valuestring, *k) == 0) {
                *text = x->valuestring;
                return 1;
            }
        }
        i++;
    }
    return 0;
}

/* Adds the record's prompt to the set (or counts it as skipped). */
static int take_record(fmoe_prompt_format fmt, const cJSON *rec, set_builder *b,
                       const record_loc *loc) {
    static const char *const sharegpt_who[] = {"human", "user", NULL};
    static const char *const lmsys_who[] = {"user", NULL};
    if (!cJSON_IsObject(rec)) return loc_error(FMOE_EFORMAT, loc, "record is not a JSON object");
    char id[256];
    const char *text = NULL;
    int found;
    switch (fmt) {
    case FMOE_PROMPTS_SHAREGPT:
        FMOE_FORWARD_IF_ERROR(read_id(rec, "id", id, sizeof id, loc));
        found = first_turn(rec, "conversations", "from", sharegpt_who, "value", &text, loc);
        break;
    case FMOE_PROMPTS_LMSYS:
        FMOE_FORWARD_IF_ERROR(read_id(rec, "conversation_id", id, sizeof id, loc));
        found = first_turn(rec, "conversation", "role", lmsys_who, "content", &text, loc);
        break;
    case FMOE_PROMPTS_JSONL: {
        FMOE_FORWARD_IF_ERROR(read_id(rec, "id", id, sizeof id, loc));
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(rec, "prompt");
        if (!p) return loc_error(FMOE_EFORMAT, loc, "no \"prompt\"");
        if (!cJSON_IsString(p)) return loc_error(FMOE_EFORMAT, loc, "\"prompt\" is not a string");
        text = p->valuestring;
        found = 1;
        break;
    }
    default:
        return fmoe_error_set(FMOE_EINTERNAL, "%s: bad record format", loc->path);
    }
    if (found < 0) return found;
    if (!found || !text[0]) {
        b->set->skipped++;
        return 0;
    }
    return builder_add(b, id, text, strlen(text), loc);
}

/* ------------------------------------------------------------ sources */

static int64_t line_of(const char *data, const char *pos) {
    int64_t n = 1;
    for (const char *p = data; p < pos; p++)
        if (*p == '\n') n++;
    return n;
}

/* Parses one JSON value spanning [s, s + len) exactly (surrounding whitespace allowed).
 * On failure *err_at is where parsing stopped. */
static cJSON *parse_exact(const char *s, size_t len, const char **err_at) {
    const char *end = NULL;
    cJSON *v = cJSON_ParseWithLengthOpts(s, len, &end, 0);
    if (!v) {
        *err_at = end ? end : cJSON_GetErrorPtr();
        if (!*err_at || *err_at < s || *err_at > s + len) *err_at = s;
        return NULL;
    }
    if (!fmoe__ds_is_blank(end, len - (size_t)(end - s))) {
        cJSON_Delete(v);
        *err_at = end;
        return NULL;
    }
    return v;
}

static int load_json_list(const char *path, const char *data, size_t len,
                          fmoe_prompt_format fmt, set_builder *b) {
    const char *err_at = NULL;
    cJSON *root = parse_exact(data, len, &err_at);
    if (!root)
        return fmoe_error_set(FMOE_EFORMAT, "%s:%lld: malformed JSON", path,
                              (long long)line_of(data, err_at));
    int rc = 0;
    if (!cJSON_IsArray(root)) {
        rc = fmoe_error_set(FMOE_EFORMAT, "%s: expected a JSON list of records", path);
        goto done;
    }
    record_loc loc = {path, 0, 0};
    const cJSON *rec;
    cJSON_ArrayForEach(rec, root) {
        rc = take_record(fmt, rec, b, &loc);
        if (rc < 0) goto done;
        loc.index++;
    }
done:
    cJSON_Delete(root);
    return rc;
}

static int load_json_lines(const char *path, const char *data, size_t len,
                           fmoe_prompt_format fmt, set_builder *b) {
    fmoe__ds_line_iter it;
    fmoe__ds_line ln;
    fmoe__ds_line_iter_init(&it, data, len);
    while (fmoe__ds_line_next(&it, &ln)) {
        if (fmoe__ds_is_blank(ln.begin, ln.len)) continue;
        record_loc loc = {path, ln.number, 0};
        const char *err_at = NULL;
        cJSON *rec = parse_exact(ln.begin, ln.len, &err_at);
        if (!rec) {
            char msg[64];
            snprintf(msg, sizeof msg, "malformed JSON (column %lld)",
                     (long long)(err_at - ln.begin) + 1);
            return loc_error(FMOE_EFORMAT, &loc, msg);
        }
        int rc = take_record(fmt, rec, b, &loc);
        cJSON_Delete(rec);
        FMOE_FORWARD_IF_ERROR(rc);
    }
    return 0;
}

static int load_text(const char *path, const char *data, size_t len, set_builder *b) {
    fmoe__ds_line_iter it;
    fmoe__ds_line ln;
    fmoe__ds_line_iter_init(&it, data, len);
    while (fmoe__ds_line_next(&it, &ln)) {
        if (fmoe__ds_is_blank(ln.begin, ln.len)) continue;
        record_loc loc = {path, ln.number, 0};
        FMOE_FORWARD_IF_ERROR(builder_add(b, "", ln.begin, ln.len, &loc));
    }
    return 0;
}

/* ------------------------------------------------------------ detection */

static const char *skip_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')) p++;
    return p;
}

/* The record layout of a JSON object, or AUTO when it matches none. */
static fmoe_prompt_format layout_of(const cJSON *obj) {
    if (!cJSON_IsObject(obj)) return FMOE_PROMPTS_AUTO;
    if (cJSON_GetObjectItemCaseSensitive(obj, "conversations")) return FMOE_PROMPTS_SHAREGPT;
    if (cJSON_GetObjectItemCaseSensitive(obj, "conversation")) return FMOE_PROMPTS_LMSYS;
    if (cJSON_GetObjectItemCaseSensitive(obj, "prompt")) return FMOE_PROMPTS_JSONL;
    return FMOE_PROMPTS_AUTO;
}

static const char *const LAYOUTS =
    "expected \"conversations\" (ShareGPT), \"conversation\" (LMSYS-Chat) or \"prompt\" (JSONL)";

static int has_json_extension(const char *path) {
    const char *dot = strrchr(path, '.'), *slash = strrchr(path, '/');
    return dot && (!slash || dot > slash) &&
           (strcasecmp(dot, ".json") == 0 || strcasecmp(dot, ".jsonl") == 0);
}

/* Guesses the format: a JSON list -> by its first record; a first line holding a JSON
 * object -> JSON Lines by that object; anything else -> text. */
static int detect(const char *path, const char *data, size_t len, fmoe_prompt_format *out) {
    const char *end = data + len, *p = skip_ws(data, end);
    if (p < end && *p == '[') {
        const char *err_at = NULL;
        cJSON *root = parse_exact(data, len, &err_at);
        if (!root)
            return fmoe_error_set(FMOE_EFORMAT, "%s:%lld: malformed JSON", path,
                                  (long long)line_of(data, err_at));
        fmoe_prompt_format f = FMOE_PROMPTS_SHAREGPT; /* an empty list: any list format */
        int rc = 0;
        if (cJSON_IsArray(root) && cJSON_GetArraySize(root) > 0) {
            f = layout_of(cJSON_GetArrayItem(root, 0));
            if (f == FMOE_PROMPTS_AUTO)
                rc = fmoe_error_set(FMOE_EFORMAT, "%s: record 0: unknown record layout (%s)",
                                    path, LAYOUTS);
        }
        cJSON_Delete(root);
        *out = f;
        return rc;
    }
    if (p < end && *p == '{') {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = (size_t)((nl ? nl : end) - p);
        const char *err_at = NULL;
        cJSON *first = parse_exact(p, n, &err_at);
        if (first) {
            fmoe_prompt_format f = layout_of(first);
            cJSON_Delete(first);
            if (f == FMOE_PROMPTS_AUTO)
                return fmoe_error_set(FMOE_EFORMAT, "%s:%lld: unknown record layout (%s)",
                                      path, (long long)line_of(data, p), LAYOUTS);
            *out = f;
            return 0;
        }
        /* A pretty-printed JSON object is neither JSON Lines nor text worth reading. */
        cJSON *whole = parse_exact(data, len, &err_at);
        int is_object = cJSON_IsObject(whole);
        cJSON_Delete(whole);
        if (is_object)
            return fmoe_error_set(FMOE_EFORMAT,
                                  "%s: one JSON object; expected a JSON list of records or "
                                  "JSON Lines (one record per line)",
                                  path);
        /* A file named as JSON whose first record does not parse is broken JSON, not a
         * text file of prompts that happen to start with "{": reading it as one text
         * prompt would hide the damage. A text file named so says --dataset-format text. */
        if (has_json_extension(path))
            return fmoe_error_set(FMOE_EFORMAT,
                                  "%s:%lld: malformed JSON (a .json/.jsonl file is read as JSON; "
                                  "for prompts that are text, give the format text)",
                                  path, (long long)line_of(data, p));
    }
    *out = FMOE_PROMPTS_TEXT;
    return 0;
}

/* ------------------------------------------------------------ public entry points */

int fmoe_prompts_load(const char *path, fmoe_prompt_format format, fmoe_prompt_set **out) {
    *out = NULL;
    FMOE_RETURN_ERROR_IF(format < FMOE_PROMPTS_AUTO || format > FMOE_PROMPTS_TEXT, FMOE_EINVAL,
                         "%s: unknown prompt format %d", path, (int)format);
    char *base = NULL;
    const char *data;
    size_t len;
    FMOE_FORWARD_IF_ERROR(fmoe__ds_read_file(path, &base, &data, &len));
    set_builder b = {calloc(1, sizeof(fmoe_prompt_set)), 0};
    int rc = 0;
    if (!b.set) {
        rc = fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    if (format == FMOE_PROMPTS_AUTO) {
        rc = detect(path, data, len, &format);
        if (rc < 0) goto fail;
    }
    b.set->format = format;
    if (format == FMOE_PROMPTS_TEXT) {
        rc = load_text(path, data, len, &b);
    } else {
        const char *p = skip_ws(data, data + len);
        if (p < data + len && *p == '[')
            rc = load_json_list(path, data, len, format, &b);
        else
            rc = load_json_lines(path, data, len, format, &b);
    }
    if (rc < 0) goto fail;
    free(base);
    *out = b.set;
    return 0;
fail:
    fmoe_prompt_set_free(b.set);
    free(base);
    return rc;
}

static const char *const FORMAT_NAMES[] = {"auto", "sharegpt", "lmsys", "jsonl", "text"};

int fmoe_prompt_format_parse(const char *name, fmoe_prompt_format *out) {
    for (int i = 0; i < (int)(sizeof FORMAT_NAMES / sizeof *FORMAT_NAMES); i++) {
        if (name && strcmp(name, FORMAT_NAMES[i]) == 0) {
            *out = (fmoe_prompt_format)i;
            return 0;
        }
    }
    return fmoe_error_set(FMOE_EINVAL,
                          "unknown prompt format '%s' (expected auto, sharegpt, lmsys, jsonl "
                          "or text)",
                          name ? name : "(null)");
}

const char *fmoe_prompt_format_name(fmoe_prompt_format f) {
    if (f < FMOE_PROMPTS_AUTO || f > FMOE_PROMPTS_TEXT) return "unknown";
    return FORMAT_NAMES[f];
}
