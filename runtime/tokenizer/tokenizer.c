/*
 * tokenizer.c - loading a HuggingFace tokenizer.json (plus tokenizer_config.json and
 * chat_template.jinja beside it, or the three as fmoe quantize embeds them in a GGUF file:
 * fmoe_gguf_get_file) into an immutable fmoe_tokenizer, and its accessors.
 *
 * Loading validates everything before use: every field that is present must have the type
 * tokenizer.json gives it, ids must lie in [0, 2^24), merges must name vocabulary tokens,
 * and any model, normalizer, pre-tokenizer, post-processor or decoder type fmoe does not
 * implement is refused by name. Errors are one line: "<file>: <field>: <what>".
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fmoe/error.h"
#include "files.h"
#include "fmoe/gguf.h"
#include "fmoe/log.h"
#include "tokenizer_impl.h"

/* The GPT-2 pre-tokenization regex ByteLevel uses when use_regex is true. */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- error helpers -------------------------------------------------------------------------- */

typedef struct load_ctx {
    fmoe_tokenizer *tok;
    const char *file; /* the file being parsed, for messages */
} load_ctx;

static int fail(const load_ctx *c, int code, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(const load_ctx *c, int code, const char *field, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    for (char *p = msg; *p; p++) /* strings quoted from the file stay on one line */
        if ((unsigned char)*p < 0x20) *p = ' ';
    return fmoe_error_set(code, "%s: %s: %s", c->file, field, msg);
}

static const char *json_kind(const cJSON *j) {
    if (!j) return "missing";
    if (cJSON_IsNull(j)) return "null";
    if (cJSON_IsBool(j)) return "a boolean";
    if (cJSON_IsNumber(j)) return "a number";
    if (cJSON_IsString(j)) return "a string";
    if (cJSON_IsArray(j)) return "an array";
    if (cJSON_IsObject(j)) return "an object";
    return "invalid";
}

/* Optional boolean field: absent or null gives `def`. */
static int get_bool(const load_ctx *c, const cJSON *obj, const char *key, const char *where,
                    int def, int *out) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!j || cJSON_IsNull(j)) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsBool(j))
        return fail(c, FMOE_EFORMAT, where, "\"%s\" must be a boolean, not %s", key,
                    json_kind(j));
    *out = cJSON_IsTrue(j);
    return 0;
}

/* A string field, required or optional (absent or null: *out = NULL). */
static int get_str(const load_ctx *c, const cJSON *obj, const char *key, const char *where,
                   const char **out, int required) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!j || cJSON_IsNull(j)) {
        *out = NULL;
        if (required)
            return fail(c, FMOE_EFORMAT, where, "\"%s\" is missing (expected a string)", key);
        return 0;
    }
    if (!cJSON_IsString(j))
        return fail(c, FMOE_EFORMAT, where, "\"%s\" must be a string, not %s", key,
                    json_kind(j));
    *out = j->valuestring;
    return 0;
}

static int get_int(const load_ctx *c, const cJSON *j, const char *where, int64_t lo, int64_t hi,
                   int64_t *out) {
    if (!cJSON_IsNumber(j))
        return fail(c, FMOE_EFORMAT, where, "expected an integer, not %s", json_kind(j));
    double v = j->valuedouble;
    if (!(v >= (double)lo && v <= (double)hi) || v != (double)(int64_t)v)
        return fail(c, FMOE_EFORMAT, where, "%g is not an integer in [%lld, %lld]", v,
                    (long long)lo, (long long)hi);
    *out = (int64_t)v;
    return 0;
}

static char *dup_n(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

#define OOM() fmoe_error_set(FMOE_ENOMEM, "tokenizer: out of memory")

/* ---- files ----------------------------------------------------------------------------------- */

/* The largest tokenizer file read: real tokenizer.json files reach tens of MiB (a 256k
 * vocabulary with its merges); more is not one, and /dev/zero is not read at all. */
#define MAX_TOKENIZER_FILE_BYTES ((long long)512 << 20)

static int is_json_space(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* check_json_tail: files of this size or more have their end checked before they are read
 * (real tokenizer.json files are up to tens of MiB; a smaller one is read and parsed whole,
 * which names a truncation's line and column), and how much of the end is read. */
#define JSON_TAIL_CHECK_MIN ((long long)16 << 20)
#define JSON_TAIL_BYTES 4096

/* A JSON file of the tokenizer (tokenizer.json, tokenizer_config.json) is one object: its
 * last byte that is not JSON whitespace must be the object's '}'. For a file of
 * JSON_TAIL_CHECK_MIN bytes or more this is checked on its last JSON_TAIL_BYTES before the
 * file is read, so that a tokenizer.json followed by hundreds of MB of NUL bytes or other
 * junk is refused at once instead of read into memory (it was read, 683 MB of RSS for
 * 500 MB of NULs, and accepted); parse_json finds whatever this lets through, at its byte.
 * A tail of whitespace only is left to parse_json too. */
static int check_json_tail(const char *path) {
    const int fd = fmoe__open_regular(path); /* lib/files.h: a FIFO must not block */
    if (fd < 0) return fd;
    struct stat st;
    unsigned char tail[JSON_TAIL_BYTES];
    int rc = 0;
    if (fstat(fd, &st) != 0) {
        rc = fmoe_error_set(FMOE_EIO, "%s: stat: %s", path, strerror(errno));
        goto done;
    }
    const long long size = (long long)st.st_size;
    /* small: parse_json says where; too large: the bounded read says so */
    if (size < JSON_TAIL_CHECK_MIN || size > MAX_TOKENIZER_FILE_BYTES) goto done;
    if (fmoe__pread_all(fd, tail, JSON_TAIL_BYTES, size - JSON_TAIL_BYTES) != 0) {
        rc = fmoe_error_set(FMOE_EIO, "%s: read: %s", path, strerror(errno));
        goto done;
    }
    int i = JSON_TAIL_BYTES - 1;
    while (i >= 0 && is_json_space(tail[i])) i--;
    if (i >= 0 && tail[i] != '}')
        rc = fmoe_error_set(FMOE_EFORMAT,
                            "%s: its last byte that is not whitespace, byte %lld of %lld, is "
                            "0x%02x, not the '}' that ends a JSON object: bytes after the JSON "
                            "value, or a truncated file",
                            path, size - JSON_TAIL_BYTES + i, size, tail[i]);
done:
    close(fd);
    return rc;
}

/* PATH's bytes (fmoe__read_file_bounded: regular files only, so a FIFO does not block); a
 * JSON file's end is checked first (check_json_tail).
 * @return 0, 1 when optional and PATH does not exist, or an error. */
static int read_file(const char *path, char **data, size_t *len, int optional, int json) {
    *data = NULL;
    *len = 0;
    struct stat st;
    if (optional && stat(path, &st) != 0 && errno == ENOENT) return 1;
    if (json) FMOE_FORWARD_IF_ERROR(check_json_tail(path));
    return fmoe__read_file_bounded(path, "a tokenizer file", MAX_TOKENIZER_FILE_BYTES, 0, data,
                                   len);
}

/* The 1-based line and column of byte pos of data. */
static void line_col(const char *data, size_t pos, long *line, long *col) {
    *line = *col = 1;
    for (size_t i = 0; i < pos; i++) {
        if (data[i] == '\n') {
            ++*line;
            *col = 1;
        } else {
            ++*col;
        }
    }
}

static int parse_json(const char *path, const char *data, size_t len, cJSON **out) {
    /* JSON text is UTF-8 (RFC 8259); cJSON would pass invalid bytes into token strings */
    const unsigned char *u = (const unsigned char *)data;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t k = u[i] < 0x80 ? 1 : fmoe__utf8_decode(u + i, len - i, &cp);
        if (!k) return fmoe_error_set(FMOE_EFORMAT, "%s: not valid UTF-8 at byte %zu", path, i);
        i += k;
    }
    const char *end = NULL;
    long line, col;
    cJSON *root = cJSON_ParseWithLengthOpts(data, len, &end, 0);
    if (!root) {
        size_t pos = end && end >= data && end <= data + len ? (size_t)(end - data) : 0;
        line_col(data, pos, &line, &col);
        return fmoe_error_set(FMOE_EFORMAT, "%s: invalid JSON at line %ld, column %ld (byte %zu)",
                              path, line, col, pos);
    }
    /* and nothing but whitespace after the value (RFC 8259); cJSON stops after the value */
    size_t pos = (size_t)(end - data);
    while (pos < len && is_json_space((unsigned char)data[pos])) pos++;
    if (pos < len) {
        cJSON_Delete(root);
        line_col(data, pos, &line, &col);
        return fmoe_error_set(FMOE_EFORMAT,
                              "%s: bytes after the JSON value, from byte %zu (line %ld, column "
                              "%ld): 0x%02x",
                              path, pos, line, col, (unsigned char)data[pos]);
    }
    *out = root;
    return 0;
}

/* ---- the model ------------------------------------------------------------------------------- */

/* Adds a string to the arena; returns its offset. */
static int arena_add(tok_buf *arena, const char *s, size_t n, uint32_t *off) {
    if (arena->len + n + 1 > UINT32_MAX)
        return fmoe_error_set(FMOE_ERANGE, "tokenizer: vocabulary strings exceed 4 GiB");
    *off = (uint32_t)arena->len;
    FMOE_FORWARD_IF_ERROR(fmoe__tok_buf_append(arena, s, n));
    arena->len++; /* keep the NUL */
    return 0;
}

static int check_vocab(load_ctx *c, const cJSON *vocab, int32_t *max_id) {
    if (!cJSON_IsObject(vocab))
        return fail(c, FMOE_EFORMAT, "model.vocab", "expected an object, not %s",
                    json_kind(vocab));
    for (const cJSON *e = vocab->child; e; e = e->next) {
        int64_t id;
        char where[96];
        snprintf(where, sizeof where, "model.vocab[\"%.40s\"]", e->string ? e->string : "");
        FMOE_FORWARD_IF_ERROR(get_int(c, e, where, 0, TOK_MAX_ID - 1, &id));
        if ((int32_t)id > *max_id) *max_id = (int32_t)id;
    }
    return 0;
}

static int parse_merges(load_ctx *c, const cJSON *merges) {
    fmoe_tokenizer *tok = c->tok;
    if (!merges || cJSON_IsNull(merges)) return fmoe__tok_mergemap_init(&tok->merges, 1);
    if (!cJSON_IsArray(merges))
        return fail(c, FMOE_EFORMAT, "model.merges", "expected an array, not %s",
                    json_kind(merges));
    size_t n = (size_t)cJSON_GetArraySize(merges);
    FMOE_FORWARD_IF_ERROR(fmoe__tok_mergemap_init(&tok->merges, n + 1));
    tok->split_metaspace = 1;
    tok_buf cat = {0};
    uint32_t rank = 0;
    int rc = 0;
    for (const cJSON *m = merges->child; m; m = m->next, rank++) {
        char where[64];
        snprintf(where, sizeof where, "model.merges[%u]", rank);
        const char *a, *b;
        size_t alen, blen;
        if (cJSON_IsString(m)) {
            const char *s = m->valuestring;
            const char *sp = strchr(s, ' ');
            if (!sp || sp == s || !sp[1] || strchr(sp + 1, ' ')) {
                rc = fail(c, FMOE_EFORMAT, where, "\"%.60s\" is not two tokens separated by one space", s);
                break;
            }
            a = s;
            alen = (size_t)(sp - s);
            b = sp + 1;
            blen = strlen(b);
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 &&
                   cJSON_IsString(m->child) && cJSON_IsString(m->child->next)) {
            a = m->child->valuestring;
            alen = strlen(a);
            b = m->child->next->valuestring;
            blen = strlen(b);
        } else {
            rc = fail(c, FMOE_EFORMAT, where, "expected \"a b\" or [\"a\", \"b\"], not %s",
                      json_kind(m));
            break;
        }
        int32_t ia = fmoe__tok_strmap_get(&tok->vocab, a, alen);
        int32_t ib = fmoe__tok_strmap_get(&tok->vocab, b, blen);
        cat.len = 0;
        if ((rc = fmoe__tok_buf_append(&cat, a, alen)) < 0 ||
            (rc = fmoe__tok_buf_append(&cat, b, blen)) < 0)
            break;
        int32_t inew = fmoe__tok_strmap_get(&tok->vocab, cat.p, cat.len);
        if (ia < 0 || ib < 0 || inew < 0) {
            const char *missing = ia < 0 ? a : ib < 0 ? b : cat.p;
            int mlen = (int)(ia < 0 ? alen : ib < 0 ? blen : cat.len);
            rc = fail(c, FMOE_EFORMAT, where, "token \"%.*s\" is not in model.vocab",
                      mlen > 60 ? 60 : mlen, missing);
            break;
        }
        fmoe__tok_mergemap_put(&tok->merges, ia, ib, rank, inew);
        if (blen >= 3 && memcmp(b, "\xE2\x96\x81", 3) == 0 &&
            !(alen >= 3 && memcmp(a + alen - 3, "\xE2\x96\x81", 3) == 0))
            tok->split_metaspace = 0;
    }
    fmoe__tok_buf_free(&cat);
    return rc;
}

/* ---- added tokens ------------------------------------------------------------------------------ */

static int parse_added_tokens(load_ctx *c, const cJSON *arr) {
    fmoe_tokenizer *tok = c->tok;
    if (!arr || cJSON_IsNull(arr)) return 0;
    if (!cJSON_IsArray(arr))
        return fail(c, FMOE_EFORMAT, "added_tokens", "expected an array, not %s",
                    json_kind(arr));
    size_t n = (size_t)cJSON_GetArraySize(arr);
    tok->added = calloc(n ? n : 1, sizeof *tok->added);
    if (!tok->added) return OOM();
    size_t i = 0;
    for (const cJSON *t = arr->child; t; t = t->next, i++) {
        char where[48];
        snprintf(where, sizeof where, "added_tokens[%zu]", i);
        if (!cJSON_IsObject(t))
            return fail(c, FMOE_EFORMAT, where, "expected an object, not %s", json_kind(t));
        tok_added *a = &tok->added[tok->n_added];
        const char *content;
        int64_t id;
        int special, normalized, b;
        FMOE_FORWARD_IF_ERROR(get_str(c, t, "content", where, &content, 1));
        const cJSON *jid = cJSON_GetObjectItemCaseSensitive(t, "id");
        char wid[64];
        snprintf(wid, sizeof wid, "%s.id", where);
        FMOE_FORWARD_IF_ERROR(get_int(c, jid, wid, 0, TOK_MAX_ID - 1, &id));
        FMOE_FORWARD_IF_ERROR(get_bool(c, t, "special", where, 0, &special));
        /* HuggingFace's AddedToken defaults normalized to true when the field is absent. */
        FMOE_FORWARD_IF_ERROR(get_bool(c, t, "normalized", where, 1, &normalized));
        a->special = (uint8_t)special;
        a->normalized = (uint8_t)normalized;
        FMOE_FORWARD_IF_ERROR(get_bool(c, t, "single_word", where, 0, &b));
        a->single_word = (uint8_t)b;
        FMOE_FORWARD_IF_ERROR(get_bool(c, t, "lstrip", where, 0, &b));
        a->lstrip = (uint8_t)b;
        FMOE_FORWARD_IF_ERROR(get_bool(c, t, "rstrip", where, 0, &b));
        a->rstrip = (uint8_t)b;
        if (!content[0]) continue; /* HuggingFace ignores empty added tokens */
        a->len = strlen(content);
        a->content = dup_n(content, a->len);
        if (!a->content) return OOM();
        a->id = (int32_t)id; /* as declared; load() assigns the id HuggingFace gives it */
        tok->n_added++;
    }
    return 0;
}

static int cmp_added_order(const void *x, const void *y, void *ctx) {
    const fmoe_tokenizer *tok = ctx;
    const tok_added *a = &tok->added[*(const int32_t *)x], *b = &tok->added[*(const int32_t *)y];
    unsigned char fa = (unsigned char)a->pattern[0], fb = (unsigned char)b->pattern[0];
    if (fa != fb) return fa < fb ? -1 : 1;
    if (a->pattern_len != b->pattern_len) return a->pattern_len > b->pattern_len ? -1 : 1;
    /* equal patterns: the first in the file wins, as HuggingFace's automaton does */
    return *(const int32_t *)x < *(const int32_t *)y ? -1 : *(const int32_t *)x > *(const int32_t *)y;
}

static int build_matcher(fmoe_tokenizer *tok, tok_matcher *m, int normalized) {
    m->order = malloc((tok->n_added ? tok->n_added : 1) * sizeof *m->order);
    if (!m->order) return OOM();
    m->n = 0;
    for (size_t i = 0; i < tok->n_added; i++)
        if (tok->added[i].normalized == normalized && tok->added[i].pattern_len > 0)
            m->order[m->n++] = (int32_t)i;
    qsort_r(m->order, m->n, sizeof *m->order, cmp_added_order, tok);
    size_t k = 0;
    for (int b = 0; b < 256; b++) {
        m->first[b] = (uint32_t)k;
        while (k < m->n && (unsigned char)tok->added[m->order[k]].pattern[0] == b) k++;
    }
    m->first[256] = (uint32_t)k;
    return 0;
}

/* Special tokens first, then the others (HuggingFace's order); the matchers. */
static int finish_added(load_ctx *c) {
    fmoe_tokenizer *tok = c->tok;
    int any_single = 0;
    for (size_t i = 0; i < tok->n_added; i++) any_single |= tok->added[i].single_word;
    /* stable partition: special tokens before non-special ones */
    tok_added *sorted = malloc((tok->n_added ? tok->n_added : 1) * sizeof *sorted);
    if (!sorted) return OOM();
    size_t k = 0;
    for (int pass = 1; pass >= 0; pass--)
        for (size_t i = 0; i < tok->n_added; i++)
            if (tok->added[i].special == pass) sorted[k++] = tok->added[i];
    if (tok->n_added) memcpy(tok->added, sorted, tok->n_added * sizeof *sorted);
    free(sorted);
    FMOE_FORWARD_IF_ERROR(build_matcher(tok, &tok->match_raw, 0));
    FMOE_FORWARD_IF_ERROR(build_matcher(tok, &tok->match_norm, 1));
    if (any_single) {
        static const char WORD[] = "[\\p{L}\\p{M}\\p{Nd}\\p{Pc}]";
        char err[256];
        tok->word_re = fmoe__tok_regex_compile(WORD, sizeof WORD - 1, 0, err, sizeof err);
        if (!tok->word_re) return fmoe_error_set(FMOE_EINTERNAL, "tokenizer: %s", err);
    }
    return 0;
}

/* ---- normalizers ---------------------------------------------------------------------------- */

static int parse_pattern(load_ctx *c, const cJSON *obj, const char *where, const char **str,
                         const char **regex) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(obj, "pattern");
    *str = *regex = NULL;
    if (!cJSON_IsObject(p))
        return fail(c, FMOE_EFORMAT, where,
                    "\"pattern\" must be {\"String\": ...} or {\"Regex\": ...}, not %s",
                    json_kind(p));
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(p, "String");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(p, "Regex");
    if (cJSON_IsString(s)) *str = s->valuestring;
    else if (cJSON_IsString(r)) *regex = r->valuestring;
    else
        return fail(c, FMOE_EFORMAT, where,
                    "\"pattern\" must be {\"String\": ...} or {\"Regex\": ...}");
    return 0;
}

static int compile_or_fail(load_ctx *c, const char *where, const char *pattern, int literal,
                           pcre2_code **out) {
    char err[256];
    *out = fmoe__tok_regex_compile(pattern, strlen(pattern), literal, err, sizeof err);
    if (!*out) return fail(c, FMOE_EFORMAT, where, "bad regex \"%.80s\": %s", pattern, err);
    return 0;
}

/* A step parser: normalizer, pre-tokenizer, post-processor or decoder. */
typedef int (*step_parser)(load_ctx *c, const cJSON *n, const char *where, int depth);

/*
 * What the four step kinds of tokenizer.json share: null means none; otherwise an object
 * with a "type", where type "Sequence" lists more steps of the same kind under `list_key`
 * (parsed here with `parse`). @return 1 with *type set when the caller parses one step,
 * 0 when there is nothing more to do (null, or a whole Sequence), or an error.
 */
static int step_type(load_ctx *c, const cJSON *n, const char *where, int depth,
                     const char *list_key, step_parser parse, const char **type) {
    if (!n || cJSON_IsNull(n)) return 0;
    if (!cJSON_IsObject(n))
        return fail(c, FMOE_EFORMAT, where, "expected an object, not %s", json_kind(n));
    if (depth > 8) return fail(c, FMOE_EFORMAT, where, "Sequence nested too deeply");
    FMOE_FORWARD_IF_ERROR(get_str(c, n, "type", where, type, 1));
    if (strcmp(*type, "Sequence") != 0) return 1;
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(n, list_key);
    if (!cJSON_IsArray(arr))
        return fail(c, FMOE_EFORMAT, where, "\"%s\" must be an array", list_key);
    int i = 0;
    for (const cJSON *e = arr->child; e; e = e->next, i++) {
        char w[160];
        snprintf(w, sizeof w, "%s.%s[%d]", where, list_key, i);
        FMOE_FORWARD_IF_ERROR(parse(c, e, w, depth + 1));
    }
    return 0;
}

static int parse_normalizer(load_ctx *c, const cJSON *n, const char *where, int depth) {
    fmoe_tokenizer *tok = c->tok;
    const char *type;
    int rc = step_type(c, n, where, depth, "normalizers", parse_normalizer, &type);
    if (rc <= 0) return rc;
    if (tok->n_norm == TOK_MAX_STEPS)
        return fail(c, FMOE_EUNSUPPORTED, where, "more than %d normalizer steps", TOK_MAX_STEPS);
    tok_norm_step *s = &tok->norm[tok->n_norm];
    memset(s, 0, sizeof *s);
    if (strcmp(type, "NFC") == 0) {
        s->kind = TOK_NORM_NFC;
    } else if (strcmp(type, "NFD") == 0) {
        s->kind = TOK_NORM_NFD;
    } else if (strcmp(type, "Prepend") == 0) {
        const char *p;
        FMOE_FORWARD_IF_ERROR(get_str(c, n, "prepend", where, &p, 1));
        s->kind = TOK_NORM_PREPEND;
        s->a_len = strlen(p);
        if (!(s->a = dup_n(p, s->a_len))) return OOM();
    } else if (strcmp(type, "Replace") == 0) {
        const char *str, *re, *content;
        FMOE_FORWARD_IF_ERROR(parse_pattern(c, n, where, &str, &re));
        FMOE_FORWARD_IF_ERROR(get_str(c, n, "content", where, &content, 1));
        s->kind = TOK_NORM_REPLACE;
        if (str) {
            if (!str[0]) return fail(c, FMOE_EFORMAT, where, "empty Replace pattern");
            s->a_len = strlen(str);
            if (!(s->a = dup_n(str, s->a_len))) return OOM();
        } else {
            FMOE_FORWARD_IF_ERROR(compile_or_fail(c, where, re, 0, &s->re));
        }
        s->b_len = strlen(content);
        if (!(s->b = dup_n(content, s->b_len))) return OOM();
    } else if (strcmp(type, "Strip") == 0) {
        s->kind = TOK_NORM_STRIP;
        FMOE_FORWARD_IF_ERROR(get_bool(c, n, "strip_left", where, 1, &s->left));
        FMOE_FORWARD_IF_ERROR(get_bool(c, n, "strip_right", where, 1, &s->right));
    } else {
        return fail(c, FMOE_EUNSUPPORTED, where,
                    "normalizer type \"%s\" is not supported (supported: NFC, NFD, Prepend, "
                    "Replace, Strip, Sequence)",
                    type);
    }
    tok->n_norm++;
    return 0;
}

/* ---- pre-tokenizers ------------------------------------------------------------------------ */

static int parse_behavior(load_ctx *c, const cJSON *n, const char *where,
                          tok_split_behavior *out) {
    const char *b;
    FMOE_FORWARD_IF_ERROR(get_str(c, n, "behavior", where, &b, 1));
    static const struct {
        const char *name;
        tok_split_behavior v;
    } names[] = {{"Removed", TOK_SPLIT_REMOVED},
                 {"Isolated", TOK_SPLIT_ISOLATED},
                 {"MergedWithPrevious", TOK_SPLIT_MERGED_WITH_PREVIOUS},
                 {"MergedWithNext", TOK_SPLIT_MERGED_WITH_NEXT},
                 {"Contiguous", TOK_SPLIT_CONTIGUOUS}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(b, names[i].name) == 0) {
            *out = names[i].v;
            return 0;
        }
    return fail(c, FMOE_EUNSUPPORTED, where, "split behavior \"%s\" is not supported", b);
}

static int parse_prepend_scheme(load_ctx *c, const cJSON *n, const char *where,
                                tok_prepend_scheme *out) {
    const char *ps;
    FMOE_FORWARD_IF_ERROR(get_str(c, n, "prepend_scheme", where, &ps, 0));
    if (ps) {
        if (strcmp(ps, "always") == 0) *out = TOK_PREPEND_ALWAYS;
        else if (strcmp(ps, "first") == 0) *out = TOK_PREPEND_FIRST;
        else if (strcmp(ps, "never") == 0) *out = TOK_PREPEND_NEVER;
        else return fail(c, FMOE_EUNSUPPORTED, where, "prepend_scheme \"%s\" is not supported", ps);
        return 0;
    }
    int aps; /* older files: add_prefix_space */
    FMOE_FORWARD_IF_ERROR(get_bool(c, n, "add_prefix_space", where, 1, &aps));
    *out = aps ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
    return 0;
}

static int parse_replacement(load_ctx *c, const cJSON *n, const char *where, char out[8],
                             size_t *len) {
    const char *r;
    FMOE_FORWARD_IF_ERROR(get_str(c, n, "replacement", where, &r, 0));
    if (!r) r = "\xE2\x96\x81"; /* ▁ */
    uint32_t cp;
    size_t k = fmoe__utf8_decode((const unsigned char *)r, strlen(r), &cp);
    if (!k || r[k] != '\0')
        return fail(c, FMOE_EFORMAT, where, "\"replacement\" must be one character");
    memcpy(out, r, k);
    out[k] = '\0';
    *len = k;
    return 0;
}

static int parse_pre_tokenizer(load_ctx *c, const cJSON *n, const char *where, int depth) {
    fmoe_tokenizer *tok = c->tok;
    const char *type;
    int rc = step_type(c, n, where, depth, "pretokenizers", parse_pre_tokenizer, &type);
    if (rc <= 0) return rc;
    if (tok->byte_level)
        return fail(c, FMOE_EUNSUPPORTED, where,
                    "pre-tokenizer \"%s\" after ByteLevel is not supported", type);
    if (tok->n_pre == TOK_MAX_STEPS)
        return fail(c, FMOE_EUNSUPPORTED, where, "more than %d pre-tokenizer steps",
                    TOK_MAX_STEPS);
    tok_pre_step *s = &tok->pre[tok->n_pre];
    memset(s, 0, sizeof *s);
    if (strcmp(type, "Split") == 0) {
        const char *str, *re;
        FMOE_FORWARD_IF_ERROR(parse_pattern(c, n, where, &str, &re));
        s->kind = TOK_PRE_SPLIT;
        FMOE_FORWARD_IF_ERROR(compile_or_fail(c, where, str ? str : re, str != NULL, &s->re));
        FMOE_FORWARD_IF_ERROR(parse_behavior(c, n, where, &s->behavior));
        FMOE_FORWARD_IF_ERROR(get_bool(c, n, "invert", where, 0, &s->invert));
    } else if (strcmp(type, "Digits") == 0) {
        int individual;
        FMOE_FORWARD_IF_ERROR(get_bool(c, n, "individual_digits", where, 0, &individual));
        s->kind = TOK_PRE_SPLIT;
        s->behavior = TOK_SPLIT_ISOLATED;
        FMOE_FORWARD_IF_ERROR(
            compile_or_fail(c, where, individual ? "\\p{N}" : "\\p{N}+", 0, &s->re));
    } else if (strcmp(type, "ByteLevel") == 0) {
        int use_regex;
        s->kind = TOK_PRE_BYTELEVEL;
        FMOE_FORWARD_IF_ERROR(get_bool(c, n, "add_prefix_space", where, 1, &s->add_prefix_space));
        FMOE_FORWARD_IF_ERROR(get_bool(c, n, "use_regex", where, 1, &use_regex));
        if (use_regex) {
            if (!tok->gpt2_re)
                FMOE_FORWARD_IF_ERROR(compile_or_fail(c, where, GPT2_PATTERN, 0, &tok->gpt2_re));
            s->re = tok->gpt2_re;
        }
        tok->byte_level = 1;
    } else if (strcmp(type, "Metaspace") == 0) {
        s->kind = TOK_PRE_METASPACE;
        FMOE_FORWARD_IF_ERROR(parse_replacement(c, n, where, s->replacement, &s->replacement_len));
        FMOE_FORWARD_IF_ERROR(parse_prepend_scheme(c, n, where, &s->prepend));
        FMOE_FORWARD_IF_ERROR(get_bool(c, n, "split", where, 1, &s->split));
    } else {
        return fail(c, FMOE_EUNSUPPORTED, where,
                    "pre-tokenizer type \"%s\" is not supported (supported: Split, ByteLevel, "
                    "Metaspace, Digits, Sequence)",
                    type);
    }
    tok->n_pre++;
    return 0;
}

/* ---- post-processors ----------------------------------------------------------------------- */

static int ids_append(int32_t **arr, size_t *n, const int32_t *ids, size_t k, int front) {
    if (k == 0) return 0;
    int32_t *p = realloc(*arr, (*n + k + 1) * sizeof *p);
    if (!p) return OOM();
    if (front) {
        memmove(p + k, p, *n * sizeof *p);
        memcpy(p, ids, k * sizeof *p);
    } else {
        memcpy(p + *n, ids, k * sizeof *p);
    }
    *arr = p;
    *n += k;
    return 0;
}

static int parse_template(load_ctx *c, const cJSON *n, const char *where) {
    fmoe_tokenizer *tok = c->tok;
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(n, "single");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(n, "special_tokens");
    if (!cJSON_IsArray(single))
        return fail(c, FMOE_EFORMAT, where, "\"single\" must be an array");
    int32_t *pre = NULL, *suf = NULL;
    size_t npre = 0, nsuf = 0;
    int seen_a = 0, rc = 0, i = 0;
    for (const cJSON *it = single->child; it; it = it->next, i++) {
        char w[200];
        snprintf(w, sizeof w, "%s.single[%d]", where, i);
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
        const cJSON *sq = cJSON_GetObjectItemCaseSensitive(it, "Sequence");
        if (cJSON_IsObject(sq)) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(sq, "id");
            if (seen_a || !cJSON_IsString(id) || strcmp(id->valuestring, "A") != 0) {
                rc = fail(c, FMOE_EUNSUPPORTED, w, "only one Sequence \"A\" is supported");
                goto out;
            }
            seen_a = 1;
        } else if (cJSON_IsObject(sp)) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(sp, "id");
            if (!cJSON_IsString(id)) {
                rc = fail(c, FMOE_EFORMAT, w, "SpecialToken.id must be a string");
                goto out;
            }
            const cJSON *st = cJSON_GetObjectItemCaseSensitive(specials, id->valuestring);
            const cJSON *ids = cJSON_GetObjectItemCaseSensitive(st, "ids");
            if (!cJSON_IsArray(ids)) {
                rc = fail(c, FMOE_EFORMAT, w, "special token \"%.60s\" has no ids in special_tokens",
                          id->valuestring);
                goto out;
            }
            for (const cJSON *x = ids->child; x; x = x->next) {
                int64_t v;
                if ((rc = get_int(c, x, w, 0, TOK_MAX_ID - 1, &v)) < 0) goto out;
                int32_t v32 = (int32_t)v;
                if ((rc = seen_a ? ids_append(&suf, &nsuf, &v32, 1, 0)
                                 : ids_append(&pre, &npre, &v32, 1, 0)) < 0)
                    goto out;
            }
        } else {
            rc = fail(c, FMOE_EFORMAT, w, "expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
            goto out;
        }
    }
    if (!seen_a) {
        rc = fail(c, FMOE_EFORMAT, where, "\"single\" has no Sequence \"A\"");
        goto out;
    }
    /* nesting: a later processor wraps what the earlier ones produced */
    if ((rc = ids_append(&tok->post_prefix, &tok->n_post_prefix, pre, npre, 1)) < 0) goto out;
    rc = ids_append(&tok->post_suffix, &tok->n_post_suffix, suf, nsuf, 0);
out:
    free(pre);
    free(suf);
    return rc;
}

static int parse_pair_token(load_ctx *c, const cJSON *n, const char *key, const char *where,
                            int32_t *id) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(n, key);
    if (!cJSON_IsArray(p) || cJSON_GetArraySize(p) != 2)
        return fail(c, FMOE_EFORMAT, where, "\"%s\" must be [token, id]", key);
    int64_t v;
    FMOE_FORWARD_IF_ERROR(get_int(c, p->child->next, where, 0, TOK_MAX_ID - 1, &v));
    *id = (int32_t)v;
    return 0;
}

static int parse_post_processor(load_ctx *c, const cJSON *n, const char *where, int depth) {
    fmoe_tokenizer *tok = c->tok;
    const char *type;
    int rc = step_type(c, n, where, depth, "processors", parse_post_processor, &type);
    if (rc <= 0) return rc;
    if (strcmp(type, "ByteLevel") == 0) return 0; /* only trims offsets */
    if (strcmp(type, "TemplateProcessing") == 0) return parse_template(c, n, where);
    if (strcmp(type, "RobertaProcessing") == 0 || strcmp(type, "BertProcessing") == 0) {
        int32_t cls, sep;
        FMOE_FORWARD_IF_ERROR(parse_pair_token(c, n, "cls", where, &cls));
        FMOE_FORWARD_IF_ERROR(parse_pair_token(c, n, "sep", where, &sep));
        FMOE_FORWARD_IF_ERROR(ids_append(&tok->post_prefix, &tok->n_post_prefix, &cls, 1, 1));
        return ids_append(&tok->post_suffix, &tok->n_post_suffix, &sep, 1, 0);
    }
    return fail(c, FMOE_EUNSUPPORTED, where,
                "post-processor type \"%s\" is not supported (supported: TemplateProcessing, "
                "ByteLevel, RobertaProcessing, BertProcessing, Sequence)",
                type);
}

/* ---- decoders ------------------------------------------------------------------------------ */

static int parse_decoder(load_ctx *c, const cJSON *n, const char *where, int depth) {
    fmoe_tokenizer *tok = c->tok;
    const char *type;
    int rc = step_type(c, n, where, depth, "decoders", parse_decoder, &type);
    if (rc <= 0) return rc;
    tok->has_decoder = 1;
    if (tok->n_dec == TOK_MAX_STEPS)
        return fail(c, FMOE_EUNSUPPORTED, where, "more than %d decoder steps", TOK_MAX_STEPS);
    tok_dec_step *s = &tok->dec[tok->n_dec];
    memset(s, 0, sizeof *s);
    if (strcmp(type, "ByteLevel") == 0) {
        s->kind = TOK_DEC_BYTELEVEL;
    } else if (strcmp(type, "ByteFallback") == 0) {
        s->kind = TOK_DEC_BYTEFALLBACK;
    } else if (strcmp(type, "Fuse") == 0) {
        s->kind = TOK_DEC_FUSE;
    } else if (strcmp(type, "Replace") == 0) {
        const char *str, *re, *content;
        FMOE_FORWARD_IF_ERROR(parse_pattern(c, n, where, &str, &re));
        if (!str || !str[0])
            return fail(c, FMOE_EUNSUPPORTED, where,
                        "decoder Replace supports only a non-empty String pattern");
        FMOE_FORWARD_IF_ERROR(get_str(c, n, "content", where, &content, 1));
        s->kind = TOK_DEC_REPLACE;
        s->a_len = strlen(str);
        s->b_len = strlen(content);
        if (!(s->a = dup_n(str, s->a_len)) || !(s->b = dup_n(content, s->b_len))) return OOM();
    } else if (strcmp(type, "Strip") == 0) {
        const char *content;
        int64_t start, stop;
        FMOE_FORWARD_IF_ERROR(get_str(c, n, "content", where, &content, 1));
        uint32_t cp;
        size_t k = fmoe__utf8_decode((const unsigned char *)content, strlen(content), &cp);
        if (!k || content[k] != '\0')
            return fail(c, FMOE_EFORMAT, where, "Strip \"content\" must be one character");
        char w[200];
        snprintf(w, sizeof w, "%s.start", where);
        FMOE_FORWARD_IF_ERROR(get_int(c, cJSON_GetObjectItemCaseSensitive(n, "start"), w, 0,
                                      1 << 20, &start));
        snprintf(w, sizeof w, "%s.stop", where);
        FMOE_FORWARD_IF_ERROR(get_int(c, cJSON_GetObjectItemCaseSensitive(n, "stop"), w, 0,
                                      1 << 20, &stop));
        s->kind = TOK_DEC_STRIP;
        s->a_len = k;
        if (!(s->a = dup_n(content, k))) return OOM();
        s->start = (int)start;
        s->stop = (int)stop;
    } else if (strcmp(type, "Metaspace") == 0) {
        char rep[8];
        size_t rlen;
        tok_prepend_scheme ps;
        FMOE_FORWARD_IF_ERROR(parse_replacement(c, n, where, rep, &rlen));
        FMOE_FORWARD_IF_ERROR(parse_prepend_scheme(c, n, where, &ps));
        s->kind = TOK_DEC_METASPACE;
        s->a_len = rlen;
        if (!(s->a = dup_n(rep, rlen))) return OOM();
        s->strip_first = ps != TOK_PREPEND_NEVER;
    } else {
        return fail(c, FMOE_EUNSUPPORTED, where,
                    "decoder type \"%s\" is not supported (supported: ByteLevel, Metaspace, "
                    "Replace, ByteFallback, Fuse, Strip, Sequence)",
                    type);
    }
    tok->n_dec++;
    return 0;
}

/* ---- the byte alphabet --------------------------------------------------------------------- */

/* GPT-2's bytes_to_unicode(): printable bytes map to themselves, the others to U+0100.. */
static uint32_t byte_to_cp(int b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))
        return (uint32_t)b;
    uint32_t n = 0;
    for (int x = 0; x < b; x++)
        if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF)))
            n++;
    return 256 + n;
}

static void build_byte_ids(fmoe_tokenizer *tok) {
    for (int b = 0; b < 256; b++) {
        char s[8];
        size_t k;
        if (tok->byte_level) {
            k = fmoe__utf8_encode(byte_to_cp(b), s);
        } else {
            k = (size_t)snprintf(s, sizeof s, "<0x%02X>", b);
        }
        tok->byte_ids[b] = fmoe__tok_strmap_get(&tok->vocab, s, k);
    }
}

/* ---- tokenizer_config.json and the chat template ----------------------------------------- */

static const char *token_field(const cJSON *j) {
    if (cJSON_IsString(j)) return j->valuestring;
    if (cJSON_IsObject(j)) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "content");
        if (cJSON_IsString(c)) return c->valuestring;
    }
    return NULL;
}

/* The optional file NAME: from the GGUF file g when given (fmoe_gguf_get_file), else
 * DIR/NAME; `shown` is what errors call it. @return 0, 1 when absent, or an error. */
static int read_part(const fmoe_gguf *g, const char *dir, const char *name, char *shown,
                     size_t cap, char **data, size_t *len) {
    if (!g) {
        snprintf(shown, cap, "%s/%s", dir, name);
        return read_file(shown, data, len, 1, strstr(name, ".json") != NULL);
    }
    snprintf(shown, cap, "%s:fmoe.file.%s", fmoe_gguf_name(g), name);
    const int rc = fmoe_gguf_get_file(g, name, data, len);
    if (rc == 0 && *len > (size_t)MAX_TOKENIZER_FILE_BYTES) {
        free(*data);
        *data = NULL;
        return fmoe_error_set(FMOE_ERANGE, "%s: more than %lld bytes: too large for a "
                              "tokenizer file", shown, MAX_TOKENIZER_FILE_BYTES);
    }
    return rc;
}

static int load_config(fmoe_tokenizer *tok, const char *dir, const fmoe_gguf *g) {
    char path[4096];
    char *data = NULL;
    size_t len;
    int rc;
    rc = read_part(g, dir, "tokenizer_config.json", path, sizeof path, &data, &len);
    if (rc < 0) return rc;
    if (rc == 0) {
        cJSON *root = NULL;
        rc = parse_json(path, data, len, &root);
        free(data);
        if (rc < 0) return rc;
        if (cJSON_IsObject(root)) {
            const char *bos = token_field(cJSON_GetObjectItemCaseSensitive(root, "bos_token"));
            const char *eos = token_field(cJSON_GetObjectItemCaseSensitive(root, "eos_token"));
            if (bos && !(tok->bos_text = dup_n(bos, strlen(bos)))) rc = OOM();
            if (eos && !(tok->eos_text = dup_n(eos, strlen(eos)))) rc = OOM();
            const cJSON *ct = cJSON_GetObjectItemCaseSensitive(root, "chat_template");
            const char *tmpl = NULL, *tool_use = NULL;
            if (cJSON_IsString(ct)) {
                tmpl = ct->valuestring;
            } else if (cJSON_IsArray(ct)) {
                /* [{"name": ..., "template": ...}]: "default" (else the first), and
                 * "tool_use", which transformers picks when the request has tools */
                for (const cJSON *e = ct->child; e; e = e->next) {
                    const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
                    const cJSON *t = cJSON_GetObjectItemCaseSensitive(e, "template");
                    if (!cJSON_IsString(t)) continue;
                    int named = cJSON_IsString(name);
                    if (named && strcmp(name->valuestring, "tool_use") == 0)
                        tool_use = t->valuestring;
                    if (!tmpl || (named && strcmp(name->valuestring, "default") == 0))
                        tmpl = t->valuestring;
                }
            }
            if (tmpl && rc == 0 && !(tok->chat_template_text = dup_n(tmpl, strlen(tmpl))))
                rc = OOM();
            if (tool_use && rc == 0 &&
                !(tok->chat_template_tool_use = dup_n(tool_use, strlen(tool_use))))
                rc = OOM();
        }
        cJSON_Delete(root);
        if (rc < 0) return rc;
    }
    if (!tok->chat_template_text) {
        rc = read_part(g, dir, "chat_template.jinja", path, sizeof path, &data, &len);
        if (rc < 0) return rc;
        if (rc == 0) tok->chat_template_text = data;
    }
    if (!tok->chat_template_text && g) {
        /* a GGUF converted by llama.cpp's tools carries the template as a key */
        fmoe_gguf_str s;
        if (fmoe_gguf_get_str(g, "tokenizer.chat_template", &s) == 0 &&
            !(tok->chat_template_text = dup_n(s.ptr, (size_t)s.len)))
            return OOM();
        fmoe_error_clear();
    }
    return 0;
}

static void pick_special_ids(fmoe_tokenizer *tok) {
    tok->bos_id = tok->eos_id = -1;
    if (tok->bos_text) tok->bos_id = fmoe_tokenizer_token_to_id(tok, tok->bos_text);
    else if (tok->n_post_prefix) tok->bos_id = tok->post_prefix[0];
    if (tok->eos_text) {
        tok->eos_id = fmoe_tokenizer_token_to_id(tok, tok->eos_text);
    } else {
        /* added tokens first: Qwen's vocabulary also spells a plain "</s>" */
        static const char *const EOS[] = {"</s>", "<|endoftext|>", "<|end_of_text|>",
                                          "<|im_end|>"};
        for (size_t i = 0; i < sizeof EOS / sizeof EOS[0] && tok->eos_id < 0; i++)
            tok->eos_id = fmoe__tok_strmap_get(&tok->added_map, EOS[i], strlen(EOS[i]));
        for (size_t i = 0; i < sizeof EOS / sizeof EOS[0] && tok->eos_id < 0; i++)
            tok->eos_id = fmoe_tokenizer_token_to_id(tok, EOS[i]);
    }
    if (!tok->bos_text) {
        const char *t = fmoe_tokenizer_id_to_token(tok, tok->bos_id);
        tok->bos_text = dup_n(t ? t : "", t ? strlen(t) : 0);
    }
    if (!tok->eos_text) {
        const char *t = fmoe_tokenizer_id_to_token(tok, tok->eos_id);
        tok->eos_text = dup_n(t ? t : "", t ? strlen(t) : 0);
    }
}

/* ---- load ------------------------------------------------------------------------------------- */

static int parse_model(load_ctx *c, const cJSON *root, int32_t *max_id, const cJSON **vocab_out,
                       const char **unk_out) {
    fmoe_tokenizer *tok = c->tok;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model))
        return fail(c, FMOE_EFORMAT, "model", "expected an object, not %s", json_kind(model));
    const char *type;
    FMOE_FORWARD_IF_ERROR(get_str(c, model, "type", "model", &type, 0));
    if (!type) { /* untagged (old files): BPE when it has merges */
        if (!cJSON_GetObjectItemCaseSensitive(model, "merges"))
            return fail(c, FMOE_EUNSUPPORTED, "model",
                        "model without \"type\" and without merges is not supported");
        type = "BPE";
    }
    if (strcmp(type, "BPE") != 0)
        return fail(c, FMOE_EUNSUPPORTED, "model.type",
                    "model type \"%s\" is not supported (supported: BPE)", type);
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (dropout && !cJSON_IsNull(dropout) &&
        !(cJSON_IsNumber(dropout) && (dropout->valuedouble == 0.0 || dropout->valuedouble == 1.0)))
        return fail(c, FMOE_EUNSUPPORTED, "model.dropout", "BPE dropout is not supported");
    const char *cont, *suffix, *unk;
    FMOE_FORWARD_IF_ERROR(get_str(c, model, "continuing_subword_prefix", "model", &cont, 0));
    FMOE_FORWARD_IF_ERROR(get_str(c, model, "end_of_word_suffix", "model", &suffix, 0));
    if ((cont && cont[0]) || (suffix && suffix[0]))
        return fail(c, FMOE_EUNSUPPORTED, "model",
                    "continuing_subword_prefix / end_of_word_suffix are not supported");
    FMOE_FORWARD_IF_ERROR(get_str(c, model, "unk_token", "model", &unk, 0));
    FMOE_FORWARD_IF_ERROR(get_bool(c, model, "fuse_unk", "model", 0, &tok->fuse_unk));
    FMOE_FORWARD_IF_ERROR(get_bool(c, model, "byte_fallback", "model", 0, &tok->byte_fallback));
    FMOE_FORWARD_IF_ERROR(get_bool(c, model, "ignore_merges", "model", 0, &tok->ignore_merges));
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    FMOE_FORWARD_IF_ERROR(check_vocab(c, vocab, max_id));
    *vocab_out = vocab;
    *unk_out = unk;
    return 0;
}

/* Added-token ids as HuggingFace assigns them when it loads the file: a content already
 * known (an earlier added token, or the vocabulary) keeps that id, the others are numbered
 * from the vocabulary size on. The ids written in the file are only compared with this
 * (tokenizers warns about a difference too). Fills added_map; raises *max_id. */
static int assign_added_ids(load_ctx *c, const uint32_t *aoff, int32_t *max_id) {
    fmoe_tokenizer *tok = c->tok;
    size_t vocab_count = tok->vocab.count;
    int32_t max_added = -1;
    for (size_t i = 0; i < tok->n_added; i++) {
        tok_added *a = &tok->added[i];
        int32_t id = fmoe__tok_strmap_get(&tok->added_map, a->content, a->len);
        if (id < 0) id = fmoe__tok_strmap_get(&tok->vocab, a->content, a->len);
        if (id < 0)
            id = max_added < 0 ? (int32_t)vocab_count
                 : ((size_t)max_added >= vocab_count || vocab_count == 0) ? max_added + 1
                                                                          : (int32_t)vocab_count;
        if (id >= TOK_MAX_ID)
            return fail(c, FMOE_EFORMAT, "added_tokens", "too many tokens (id %d)", id);
        if (id != a->id)
            fmoe_log(FMOE_LOG_WARN,
                     "%s: added token \"%.60s\" has id %d in the file but %d as HuggingFace "
                     "tokenizers assigns it; using %d",
                     tok->path, a->content, a->id, id, id);
        a->id = id;
        if (id > max_added) max_added = id;
        if (id > *max_id) *max_id = id;
        FMOE_FORWARD_IF_ERROR(
            fmoe__tok_strmap_put(&tok->added_map, tok->strings + aoff[i], a->len, id));
    }
    return 0;
}

static int resolve_paths(const char *path, char **json_path, char **dir) {
    struct stat st;
    if (stat(path, &st) != 0)
        return fmoe_error_set(FMOE_EIO, "%s: cannot open: %s", path, strerror(errno));
    size_t n = strlen(path);
    if (S_ISDIR(st.st_mode)) {
        *dir = dup_n(path, n);
        *json_path = malloc(n + 20);
        if (!*dir || !*json_path) return OOM();
        snprintf(*json_path, n + 20, "%s/tokenizer.json", path);
    } else {
        *json_path = dup_n(path, n);
        const char *slash = strrchr(path, '/');
        *dir = slash ? dup_n(path, (size_t)(slash - path)) : dup_n(".", 1);
        if (!*dir || !*json_path) return OOM();
        if (slash == path) (*dir)[0] = '/', (*dir)[1] = '\0';
    }
    return 0;
}

int fmoe_tokenizer_load(const char *path, fmoe_tokenizer **out) {
    *out = NULL;
    if (!path) return fmoe_error_set(FMOE_EINVAL, "tokenizer: no path given");
    fmoe_tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok) return OOM();
    char *dir = NULL, *data = NULL;
    size_t len = 0;
    cJSON *root = NULL;
    fmoe_gguf *gg = NULL; /* a GGUF file's embedded files, or NULL */
    tok_buf arena = {0};
    uint32_t *voff = NULL;
    int rc;
    tok->unk_id = -1;
    tok->bos_id = tok->eos_id = -1;
    if (fmoe_gguf_is_file(path)) {
        /* fmoe quantize's GGUF: the folder's files embedded as fmoe.file.* keys */
        const size_t n = strlen(path) + 32;
        if (!(tok->path = malloc(n))) {
            rc = OOM();
            goto fail;
        }
        snprintf(tok->path, n, "%s:fmoe.file.tokenizer.json", path);
        if ((rc = fmoe_gguf_open(path, &gg)) < 0) goto fail;
        if ((rc = fmoe_gguf_get_file(gg, "tokenizer.json", &data, &len)) == 1)
            rc = fmoe_error_set(FMOE_ENOTFOUND,
                                "%s: no tokenizer.json embedded (key fmoe.file.tokenizer.json; "
                                "fmoe does not read tokenizer.ggml.*): load the tokenizer "
                                "from its folder",
                                path);
        if (rc < 0) goto fail;
    } else {
        if ((rc = resolve_paths(path, &tok->path, &dir)) < 0) goto fail;
        if ((rc = read_file(tok->path, &data, &len, 0, 1)) < 0) goto fail;
    }
    if ((rc = parse_json(tok->path, data, len, &root)) < 0) goto fail;
    free(data);
    data = NULL;
    load_ctx c = {tok, tok->path};
    if (!cJSON_IsObject(root)) {
        rc = fmoe_error_set(FMOE_EFORMAT, "%s: expected a JSON object at the top level", tok->path);
        goto fail;
    }

    /* the model vocabulary, then the added tokens */
    int32_t max_id = -1;
    const cJSON *vocab = NULL;
    const char *unk = NULL;
    if ((rc = parse_model(&c, root, &max_id, &vocab, &unk)) < 0) goto fail;
    if ((rc = parse_added_tokens(&c, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"))) < 0)
        goto fail;
    if ((rc = parse_normalizer(&c, cJSON_GetObjectItemCaseSensitive(root, "normalizer"),
                               "normalizer", 0)) < 0)
        goto fail;
    /* token strings in one arena: vocabulary first, then each added token's content and
     * the string it has as a token: for a normalized added token, its normalized content
     * (what tokenizers' id_to_token returns and decode works on, e.g. "▁[INST]") */
    size_t nvocab = (size_t)cJSON_GetArraySize(vocab), vi = 0;
    voff = malloc((nvocab + 2 * tok->n_added + 1) * sizeof *voff);
    if (!voff) {
        rc = OOM();
        goto fail;
    }
    uint32_t *aoff = voff + nvocab, *doff = aoff + tok->n_added;
    for (const cJSON *e = vocab->child; e; e = e->next, vi++)
        if ((rc = arena_add(&arena, e->string, strlen(e->string), &voff[vi])) < 0) goto fail;
    for (size_t i = 0; i < tok->n_added; i++) {
        tok_added *a = &tok->added[i];
        if ((rc = arena_add(&arena, a->content, a->len, &aoff[i])) < 0) goto fail;
        tok_buf nb = {0};
        if (a->normalized && tok->n_norm > 0)
            rc = fmoe__tok_normalize(tok, a->content, a->len, &nb);
        else
            rc = fmoe__tok_buf_append(&nb, a->content, a->len);
        if (rc == 0) rc = arena_add(&arena, nb.p, nb.len, &doff[i]);
        a->pattern = nb.p; /* what the matchers look for */
        a->pattern_len = nb.len;
        if (rc < 0) goto fail;
    }
    tok->strings = arena.p ? arena.p : calloc(1, 1);
    tok->strings_len = arena.len;
    arena.p = NULL;
    if (!tok->strings) {
        rc = OOM();
        goto fail;
    }
    if ((rc = fmoe__tok_strmap_reserve(&tok->vocab, nvocab + 1)) < 0) goto fail;
    vi = 0;
    for (const cJSON *e = vocab->child; e; e = e->next, vi++)
        if ((rc = fmoe__tok_strmap_put(&tok->vocab, tok->strings + voff[vi], strlen(e->string),
                                       (int32_t)e->valuedouble)) < 0)
            goto fail;
    if ((rc = assign_added_ids(&c, aoff, &max_id)) < 0) goto fail;
    tok->n_ids = max_id + 1;
    tok->entries = malloc((size_t)(tok->n_ids ? tok->n_ids : 1) * sizeof *tok->entries);
    if (!tok->entries) {
        rc = OOM();
        goto fail;
    }
    for (int32_t i = 0; i < tok->n_ids; i++)
        tok->entries[i] = (tok_entry){UINT32_MAX, 0, 0, 0, 0, 0};
    vi = 0;
    for (const cJSON *e = vocab->child; e; e = e->next, vi++) {
        tok_entry *en = &tok->entries[(int32_t)e->valuedouble];
        en->str_off = voff[vi];
        en->str_len = (uint32_t)strlen(e->string);
    }
    for (size_t i = 0; i < tok->n_added; i++) { /* an added token's string names its id */
        tok_entry *en = &tok->entries[tok->added[i].id];
        en->str_off = doff[i];
        en->str_len = (uint32_t)tok->added[i].pattern_len;
        en->added = 1;
        en->special |= tok->added[i].special;
    }
    tok->unk_id = unk ? fmoe__tok_strmap_get(&tok->vocab, unk, strlen(unk)) : -1;
    if ((rc = parse_merges(&c, cJSON_GetObjectItemCaseSensitive(
                                   cJSON_GetObjectItemCaseSensitive(root, "model"), "merges"))) < 0)
        goto fail;

    if (fmoe__tok_strmap_get(&tok->vocab, "\xE2\x96\x81", 3) < 0) tok->split_metaspace = 0;
    if ((rc = parse_pre_tokenizer(&c, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"),
                                  "pre_tokenizer", 0)) < 0 ||
        (rc = parse_post_processor(&c, cJSON_GetObjectItemCaseSensitive(root, "post_processor"),
                                   "post_processor", 0)) < 0 ||
        (rc = parse_decoder(&c, cJSON_GetObjectItemCaseSensitive(root, "decoder"), "decoder",
                            0)) < 0)
        goto fail;
    for (size_t i = 0; i < tok->n_post_prefix + tok->n_post_suffix; i++) {
        int32_t id = i < tok->n_post_prefix ? tok->post_prefix[i]
                                            : tok->post_suffix[i - tok->n_post_prefix];
        if (id >= tok->n_ids || tok->entries[id].str_off == UINT32_MAX) {
            rc = fail(&c, FMOE_EFORMAT, "post_processor", "special token id %d is not in the vocabulary", id);
            goto fail;
        }
    }
    build_byte_ids(tok);
    if ((rc = finish_added(&c)) < 0) goto fail;
    if ((rc = fmoe__tok_build_pieces(tok)) < 0) goto fail;
    cJSON_Delete(root);
    root = NULL;

    if ((rc = load_config(tok, dir, gg)) < 0) goto fail;
    pick_special_ids(tok);
    if (!tok->bos_text || !tok->eos_text) {
        rc = OOM();
        goto fail;
    }
    fmoe__tok_chat_detect(tok);
    fmoe_gguf_close(gg);
    free(dir);
    free(voff);
    *out = tok;
    return 0;
fail:
    fmoe_gguf_close(gg);
    free(data);
    free(dir);
    free(voff);
    fmoe__tok_buf_free(&arena);
    cJSON_Delete(root);
    fmoe_tokenizer_free(tok);
    return rc;
}

void fmoe_tokenizer_free(fmoe_tokenizer *tok) {
    if (!tok) return;
    free(tok->path);
    free(tok->strings);
    free(tok->pieces);
    free(tok->entries);
    fmoe__tok_strmap_free(&tok->vocab);
    fmoe__tok_strmap_free(&tok->added_map);
    fmoe__tok_mergemap_free(&tok->merges);
    for (size_t i = 0; i < tok->n_added; i++) {
        free(tok->added[i].content);
        free(tok->added[i].pattern);
    }
    free(tok->added);
    free(tok->match_raw.order);
    free(tok->match_norm.order);
    pcre2_code_free(tok->word_re);
    /* all slots: a step that failed half-way holds resources without being counted */
    for (int i = 0; i < TOK_MAX_STEPS; i++) {
        free(tok->norm[i].a);
        free(tok->norm[i].b);
        pcre2_code_free(tok->norm[i].re);
        if (tok->pre[i].re != tok->gpt2_re) pcre2_code_free(tok->pre[i].re);
    }
    pcre2_code_free(tok->gpt2_re);
    free(tok->post_prefix);
    free(tok->post_suffix);
    for (int i = 0; i < TOK_MAX_STEPS; i++) {
        free(tok->dec[i].a);
        free(tok->dec[i].b);
    }
    free(tok->bos_text);
    free(tok->eos_text);
    free(tok->chat_template_text);
    free(tok->chat_template_tool_use);
    free(tok->chat_refused);
    free(tok->chat_default_system);
    memset(tok, 0xA5, sizeof *tok); /* poison: a use after free reads garbage, not stale data */
    free(tok);
}

/* ---- accessors ------------------------------------------------------------------------------ */

const char *fmoe_tokenizer_id_to_token(const fmoe_tokenizer *tok, int32_t id) {
    if (!tok || id < 0 || id >= tok->n_ids || tok->entries[id].str_off == UINT32_MAX)
        return NULL;
    return tok->strings + tok->entries[id].str_off;
}

int32_t fmoe_tokenizer_token_to_id(const fmoe_tokenizer *tok, const char *token) {
    if (!tok || !token) return -1;
    size_t n = strlen(token);
    int32_t id = fmoe__tok_strmap_get(&tok->added_map, token, n);
    return id >= 0 ? id : fmoe__tok_strmap_get(&tok->vocab, token, n);
}

int fmoe_tokenizer_is_special(const fmoe_tokenizer *tok, int32_t id) {
    return tok && id >= 0 && id < tok->n_ids && tok->entries[id].special;
}

int32_t fmoe_tokenizer_vocab_size(const fmoe_tokenizer *tok) { return tok ? tok->n_ids : 0; }
int32_t fmoe_tokenizer_bos_id(const fmoe_tokenizer *tok) { return tok ? tok->bos_id : -1; }
int32_t fmoe_tokenizer_eos_id(const fmoe_tokenizer *tok) { return tok ? tok->eos_id : -1; }

int fmoe_tokenizer_token_to_piece(const fmoe_tokenizer *tok, int32_t id, const char **piece,
                                  size_t *len) {
    if (!tok || id < 0 || id >= tok->n_ids || tok->entries[id].str_off == UINT32_MAX)
        return fmoe_error_set(FMOE_ERANGE, "tokenizer: token id %d is not in the vocabulary (size %d)",
                              id, tok ? tok->n_ids : 0);
    *piece = tok->pieces + tok->entries[id].piece_off;
    *len = tok->entries[id].piece_len;
    return 0;
}
