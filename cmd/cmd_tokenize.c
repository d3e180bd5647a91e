/*
 * cmd_tokenize.c - `fmoe tokenize`: text -> token ids and back with a HuggingFace
 * tokenizer.json, like llama.cpp's llama-tokenize. Also the batch mode the Python
 * cross-check tests drive (one process, thousands of strings).
 *
 * defaults -> parse -> validate -> load -> run -> free.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cmd_common.h"
#include "fmoe/error.h"
#include "files.h"
#include "fmoe/tokenizer.h"

static const char *const CMD = "tokenize";

typedef struct options {
    const char *tokenizer, *text, *file, *decode, *batch, *system, *chat_template;
    int chat, no_think, add_special, skip_special, pieces, json, info;
    int no_special; /* --no-special: add_special = !no_special after parsing */
} options;

#define OPT(field) offsetof(options, field)
static const cmd_option tokenize_options[] = {
    {.name = "tokenizer", .kind = CMD_OPT_STRING, .io = CMD_IO_INPUT, .value_name = "PATH",
     .help = "tokenizer.json, or a model directory holding it (its tokenizer_config.json "
             "gives BOS/EOS and the chat template)",
     .offset = OPT(tokenizer)},
    {.name = "text", .kind = CMD_OPT_STRING, .io = CMD_IO_TEXT,
     .value_name = "S", .help = "the text to encode",
     .offset = OPT(text)},
    {.name = "file", .kind = CMD_OPT_STRING, .io = CMD_IO_INPUT, .value_name = "F",
     .help = "encode the bytes of file F ('-': standard input)", .offset = OPT(file)},
    {.name = "decode", .kind = CMD_OPT_STRING, .io = CMD_IO_TEXT, .value_name = "IDS",
     .help = "decode ids: \"1,2,3\", \"1 2 3\" or \"[1, 2, 3]\"", .offset = OPT(decode)},
    {.name = "batch", .kind = CMD_OPT_STRING, .io = CMD_IO_INPUT, .value_name = "F",
     .help = "JSON Lines ('-': standard input), one request per line: a string (or "
             "{\"hex\": \"...\"} for raw bytes) is encoded and answered {\"ids\": [...]}; an "
             "array of ids is decoded and answered {\"text\": \"...\"}",
     .offset = OPT(batch)},
    {.name = "chat", .kind = CMD_OPT_FLAG,
     .help = "render the text as one user message with the chat template (with the "
             "assistant's generation prompt) and encode that",
     .offset = OPT(chat)},
    {.name = "system", .kind = CMD_OPT_STRING, .io = CMD_IO_TEXT, .value_name = "S",
     .help = "with --chat: a system message before the user message", .offset = OPT(system)},
    {.name = "chat-template", .kind = CMD_OPT_STRING, .io = CMD_IO_TEXT, .value_name = "NAME",
     .help = "with --chat: a fixed renderer (mixtral, chatml, qwen3, olmoe) instead of the "
             "model's template as written, or jinja: that template, never a fallback",
     .offset = OPT(chat_template)},
    {.name = "no-think", .kind = CMD_OPT_FLAG,
     .help = "with --chat: the template variable enable_thinking=false (Qwen3 reads it)",
     .offset = OPT(no_think)},
    {.name = "no-special", .kind = CMD_OPT_FLAG,
     .help = "do not add the post-processor's special tokens (BOS ...)",
     .offset = OPT(no_special)},
    {.name = "skip-special", .kind = CMD_OPT_FLAG,
     .help = "when decoding, leave special tokens out", .offset = OPT(skip_special)},
    {.name = "pieces", .kind = CMD_OPT_FLAG, .help = "print one line per token: id and its text",
     .offset = OPT(pieces)},
    {.name = "json", .kind = CMD_OPT_FLAG,
     .help = "print JSON: {\"ids\": [...], \"tokens\": [...]} (encode), {\"text\": \"...\"} "
             "(decode)",
     .offset = OPT(json)},
    {.name = "info", .kind = CMD_OPT_FLAG,
     .help = "print vocabulary size, BOS/EOS and the chat template family",
     .offset = OPT(info)},
    {0},
};
#undef OPT

const cmd_spec cmd_tokenize_spec = {
    .name = "tokenize",
    .usage = "tokenize --tokenizer PATH (--text S | --file F | --decode IDS |\n"
             "                     --batch F | --info) [options]",
    .description =
        "Encodes text to token ids (or decodes ids to text) with a HuggingFace\n"
        "tokenizer.json: byte-level BPE (Qwen, gpt-oss, OLMoE, ...) and SentencePiece-style\n"
        "BPE with byte fallback (Mistral/Mixtral, Llama-2).\n",
    .options = tokenize_options,
    .epilog =
        "examples:\n"
        "  fmoe tokenize --tokenizer models/Mixtral-8x7B --text 'Hello world'\n"
        "  fmoe tokenize --tokenizer models/Qwen3/tokenizer.json --chat --text 'Hi' --pieces\n"
        "  fmoe tokenize --tokenizer models/Mixtral-8x7B --decode 1,22557,1526\n",
    .size = sizeof(options),
};

/* ---- input ------------------------------------------------------------------------------------- */

/* The most text tokenize reads (--file, --batch): far more than a prompt, far less than
 * would exhaust memory (standard input from /dev/zero ends here). */
#define MAX_TEXT_BYTES ((long long)256 << 20)

/* PATH's bytes, or standard input's for "-" (the one input that may be a pipe; a named
 * file must be regular: lib/files.h). @return 0 or 1 (printed). */
static int read_path(const char *path, char **data, size_t *len) {
    const int flags = strcmp(path, "-") == 0 ? FMOE_READ_PIPES : 0;
    int e = fmoe__read_file_bounded(path, "tokenize's input", MAX_TEXT_BYTES, flags, data, len);
    return e < 0 ? cmd_fail(CMD, e) : 0;
}

/* "1,2,3", "1 2 3", "[1, 2, 3]" -> ids. */
static int parse_ids(const char *s, int32_t **ids, size_t *n) {
    size_t cap = 64;
    *n = 0;
    *ids = malloc(cap * sizeof **ids);
    if (!*ids) return cmd_failf(CMD, "out of memory");
    const char *p = s;
    for (;;) {
        while (*p == ' ' || *p == ',' || *p == '[' || *p == ']' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX) {
            free(*ids);
            *ids = NULL;
            return cmd_usage_error(CMD, "--decode: '%.20s' is not a token id", p);
        }
        if (*n == cap) {
            int32_t *nv = realloc(*ids, cap * 2 * sizeof *nv);
            if (!nv) {
                free(*ids);
                return cmd_failf(CMD, "out of memory");
            }
            *ids = nv;
            cap *= 2;
        }
        (*ids)[(*n)++] = (int32_t)v;
        p = end;
    }
    return 0;
}

/* ---- output ------------------------------------------------------------------------------------ */

/* Writes s[0..n) as a JSON string: cJSON stops at a NUL byte, decoded text may hold one. */
static void put_json_string(const char *s, size_t n) {
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"') fputs("\\\"", stdout);
        else if (c == '\\') fputs("\\\\", stdout);
        else if (c == '\n') fputs("\\n", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c == '\r') fputs("\\r", stdout);
        else if (c < 0x20 || c == 0x7F) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

static void print_piece_escaped(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') fputs("\\n", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c == '\r') fputs("\\r", stdout);
        else if (c == '\'') fputs("\\'", stdout);
        else if (c < 0x20 || c == 0x7F) printf("\\x%02x", c);
        else putchar(c);
    }
}

static int print_encoding(const fmoe_tokenizer *tok, const options *o, const int32_t *ids,
                          size_t n, const char *prompt) {
    if (o->json) {
        cJSON *root = cJSON_CreateObject();
        cJSON *jids = cJSON_AddArrayToObject(root, "ids");
        cJSON *jtoks = cJSON_AddArrayToObject(root, "tokens");
        for (size_t i = 0; i < n; i++) {
            const char *t = fmoe_tokenizer_id_to_token(tok, ids[i]);
            cJSON_AddItemToArray(jids, cJSON_CreateNumber(ids[i]));
            cJSON_AddItemToArray(jtoks, cJSON_CreateString(t ? t : ""));
        }
        cJSON_AddNumberToObject(root, "n_tokens", (double)n);
        if (prompt) cJSON_AddStringToObject(root, "prompt", prompt);
        char *s = cJSON_PrintUnformatted(root);
        cJSON_Delete(root);
        if (!s) return cmd_failf(CMD, "out of memory");
        puts(s);
        free(s);
        return CMD_EXIT_OK;
    }
    if (o->pieces) {
        for (size_t i = 0; i < n; i++) {
            const char *piece;
            size_t len;
            printf("%6d -> '", ids[i]);
            if (fmoe_tokenizer_token_to_piece(tok, ids[i], &piece, &len) == 0)
                print_piece_escaped(piece, len);
            puts("'");
        }
        return CMD_EXIT_OK;
    }
    putchar('[');
    for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
    puts("]");
    return CMD_EXIT_OK;
}

static int print_decoded(const options *o, const char *text, size_t len) {
    if (o->json) {
        fputs("{\"text\":", stdout);
        put_json_string(text, len);
        puts("}");
    } else {
        fwrite(text, 1, len, stdout);
        putchar('\n');
    }
    return CMD_EXIT_OK;
}

/* ---- batch --------------------------------------------------------------------------------------- */

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One batch line -> one JSON answer on stdout. @return 0, or an exit code. */
static int batch_line(const fmoe_tokenizer *tok, const options *o, const char *line, size_t len,
                      long lineno) {
    cJSON *in = cJSON_ParseWithLength(line, len);
    cJSON *out = cJSON_CreateObject();
    int rc = 0;
    char *bytes = NULL;
    if (!in) {
        rc = cmd_failf(CMD, "--batch line %ld: invalid JSON", lineno);
        goto done;
    }
    const cJSON *hex = cJSON_GetObjectItemCaseSensitive(in, "hex");
    if (cJSON_IsString(in) || cJSON_IsString(hex)) {
        const char *text;
        size_t n;
        if (cJSON_IsString(in)) {
            text = in->valuestring;
            n = strlen(text);
        } else {
            size_t h = strlen(hex->valuestring);
            bytes = malloc(h / 2 + 1);
            if (!bytes || h % 2) {
                rc = cmd_failf(CMD, "--batch line %ld: bad hex", lineno);
                goto done;
            }
            for (size_t i = 0; i < h / 2; i++) {
                int a = hex_value(hex->valuestring[2 * i]), b = hex_value(hex->valuestring[2 * i + 1]);
                if (a < 0 || b < 0) {
                    rc = cmd_failf(CMD, "--batch line %ld: bad hex", lineno);
                    goto done;
                }
                bytes[i] = (char)(a * 16 + b);
            }
            text = bytes;
            n = h / 2;
        }
        int32_t *ids;
        size_t nids;
        int e = fmoe_tokenizer_encode_alloc(tok, text, n, o->add_special, &ids, &nids);
        if (e < 0) {
            rc = cmd_fail(CMD, e);
            goto done;
        }
        cJSON *arr = cJSON_AddArrayToObject(out, "ids");
        for (size_t i = 0; i < nids; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
        free(ids);
    } else if (cJSON_IsArray(in)) {
        size_t n = (size_t)cJSON_GetArraySize(in), k = 0;
        int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
        if (!ids) {
            rc = cmd_failf(CMD, "out of memory");
            goto done;
        }
        for (const cJSON *x = in->child; x; x = x->next) {
            if (!cJSON_IsNumber(x)) {
                free(ids);
                rc = cmd_failf(CMD, "--batch line %ld: ids must be numbers", lineno);
                goto done;
            }
            /* Range first: casting 1e20 to int32_t is undefined. */
            const double v = x->valuedouble;
            const int32_t vocab = fmoe_tokenizer_vocab_size(tok);
            if (!(v >= 0 && v < vocab) || v != (double)(int32_t)v) {
                free(ids);
                rc = cmd_failf(CMD, "--batch line %ld: %.17g is not a token id (vocabulary size %d)",
                               lineno, v, (int)vocab);
                goto done;
            }
            ids[k++] = (int32_t)v;
        }
        char *text;
        size_t tl;
        int e = fmoe_tokenizer_decode(tok, ids, k, o->skip_special, &text, &tl);
        free(ids);
        if (e < 0) {
            rc = cmd_fail(CMD, e);
            goto done;
        }
        fputs("{\"text\":", stdout);
        put_json_string(text, tl);
        puts("}");
        free(text);
        goto done;
    } else {
        rc = cmd_failf(CMD, "--batch line %ld: expected a string, {\"hex\": ...} or an array of ids",
                       lineno);
        goto done;
    }
    char *s = cJSON_PrintUnformatted(out);
    if (!s) {
        rc = cmd_failf(CMD, "out of memory");
        goto done;
    }
    puts(s);
    free(s);
done:
    free(bytes);
    cJSON_Delete(in);
    cJSON_Delete(out);
    return rc;
}

static int run_batch(const fmoe_tokenizer *tok, const options *o) {
    char *data;
    size_t len;
    int rc = read_path(o->batch, &data, &len);
    if (rc) return rc;
    long lineno = 0;
    for (size_t i = 0; i < len && rc == 0;) {
        size_t e = i;
        while (e < len && data[e] != '\n') e++;
        lineno++;
        size_t k = e;
        while (k > i && (data[k - 1] == '\r' || data[k - 1] == ' ')) k--;
        if (k > i) rc = batch_line(tok, o, data + i, k - i, lineno);
        i = e + 1;
    }
    free(data);
    fflush(stdout);
    return rc;
}

/* ---- main ------------------------------------------------------------------------------------------ */

static int run_info(const fmoe_tokenizer *tok, const options *o) {
    int32_t bos = fmoe_tokenizer_bos_id(tok), eos = fmoe_tokenizer_eos_id(tok);
    const char *tmpl = fmoe_tokenizer_chat_template(tok);
    const char *bt = fmoe_tokenizer_id_to_token(tok, bos), *et = fmoe_tokenizer_id_to_token(tok, eos);
    if (o->json) {
        cJSON *root = cJSON_CreateObject();
        cJSON_AddNumberToObject(root, "vocab_size", fmoe_tokenizer_vocab_size(tok));
        cJSON_AddNumberToObject(root, "bos_id", bos);
        cJSON_AddNumberToObject(root, "eos_id", eos);
        if (bt) cJSON_AddStringToObject(root, "bos_token", bt);
        if (et) cJSON_AddStringToObject(root, "eos_token", et);
        if (tmpl) cJSON_AddStringToObject(root, "chat_template", tmpl);
        else cJSON_AddNullToObject(root, "chat_template");
        char *s = cJSON_PrintUnformatted(root);
        cJSON_Delete(root);
        if (!s) return cmd_failf(CMD, "out of memory");
        puts(s);
        free(s);
        return CMD_EXIT_OK;
    }
    printf("vocab size     %d\n", fmoe_tokenizer_vocab_size(tok));
    printf("bos            %d%s%s%s\n", bos, bt ? " '" : "", bt ? bt : "", bt ? "'" : "");
    printf("eos            %d%s%s%s\n", eos, et ? " '" : "", et ? et : "", et ? "'" : "");
    printf("chat template  %s\n", tmpl ? tmpl : "(none recognised)");
    return CMD_EXIT_OK;
}

static int run_encode(const fmoe_tokenizer *tok, const options *o) {
    char *data = NULL, *prompt = NULL;
    size_t len = 0;
    int rc;
    if (o->file) {
        if ((rc = read_path(o->file, &data, &len))) return rc;
    } else {
        len = strlen(o->text);
        if (!(data = malloc(len + 1))) return cmd_failf(CMD, "out of memory");
        memcpy(data, o->text, len + 1);
    }
    const char *text = data;
    int add_special = o->add_special;
    if (o->chat) {
        if (memchr(data, '\0', len)) {
            free(data);
            return cmd_failf(CMD, "--chat: the text contains a NUL byte");
        }
        fmoe_chat_message msgs[2];
        size_t n = 0;
        if (o->system) msgs[n++] = (fmoe_chat_message){.role = "system", .content = o->system};
        msgs[n++] = (fmoe_chat_message){.role = "user", .content = data};
        fmoe_chat_options co = {.template_name = o->chat_template, .add_generation_prompt = 1,
                              .disable_thinking = o->no_think};
        size_t plen;
        int e = fmoe_tokenizer_apply_chat_template(tok, msgs, n, &co, &prompt, &plen);
        if (e < 0) {
            free(data);
            return cmd_fail(CMD, e);
        }
        text = prompt;
        len = plen;
        add_special = 0; /* the template writes its own BOS */
    }
    int32_t *ids;
    size_t nids;
    int e = fmoe_tokenizer_encode_alloc(tok, text, len, add_special, &ids, &nids);
    if (e < 0) {
        rc = cmd_fail(CMD, e);
    } else {
        rc = print_encoding(tok, o, ids, nids, prompt);
        free(ids);
    }
    free(prompt);
    free(data);
    return rc;
}

static int run_decode(const fmoe_tokenizer *tok, const options *o) {
    int32_t *ids;
    size_t n;
    int rc = parse_ids(o->decode, &ids, &n);
    if (rc) return rc;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= fmoe_tokenizer_vocab_size(tok)) {
            int32_t bad = ids[i];
            free(ids);
            return cmd_usage_error(CMD, "--decode: id %d is outside the vocabulary (size %d)", bad,
                                   fmoe_tokenizer_vocab_size(tok));
        }
    char *text;
    size_t len;
    int e = fmoe_tokenizer_decode(tok, ids, n, o->skip_special, &text, &len);
    free(ids);
    if (e < 0) return cmd_fail(CMD, e);
    rc = print_decoded(o, text, len);
    free(text);
    return rc;
}

int cmd_tokenize(int argc, char **argv) {
    options o = {0};
    int rc = cmd_options_parse(&cmd_tokenize_spec, &o, argc, argv, NULL);
    if (rc) return rc == CMD_OPTIONS_HELP ? CMD_EXIT_OK : rc;
    o.add_special = !o.no_special;
    if (!o.tokenizer) return cmd_usage_error(CMD, "--tokenizer is required");
    int modes = !!o.text + !!o.file + !!o.decode + !!o.batch + o.info;
    if (modes != 1)
        return cmd_usage_error(CMD, "give exactly one of --text, --file, --decode, --batch, --info");
    if ((o.chat || o.system || o.chat_template || o.no_think) && !(o.text || o.file))
        return cmd_usage_error(CMD, "--chat works with --text or --file");
    if ((o.system || o.chat_template || o.no_think) && !o.chat)
        return cmd_usage_error(CMD, "--system, --chat-template and --no-think need --chat");
    if (o.skip_special && !(o.decode || o.batch)) /* it would be ignored: refused instead */
        return cmd_usage_error(CMD, "--skip-special applies to --decode and --batch");
    if (o.no_special && (o.decode || o.info))
        return cmd_usage_error(CMD, "--no-special applies to encoding (--text, --file, --batch)");
    int crc = cmd_check_chat_template(CMD, o.chat_template);
    if (crc) return crc;

    fmoe_tokenizer *tok;
    int e = fmoe_tokenizer_load(o.tokenizer, &tok);
    if (e < 0) return cmd_fail(CMD, e);
    if (o.info) rc = run_info(tok, &o);
    else if (o.batch) rc = run_batch(tok, &o);
    else if (o.decode) rc = run_decode(tok, &o);
    else rc = run_encode(tok, &o);
    fmoe_tokenizer_free(tok);
    return rc;
}
