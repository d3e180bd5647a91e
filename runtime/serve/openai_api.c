/*
 * openai_api.c - parsing OpenAI requests into prompt ids and sampling, and rendering
 * responses, chunks and errors (see openai_api.h for the fields).
 *
 * Every cJSON node is type-checked before use and every allocation checked: the body comes
 * from the network, and tests/serve/fuzz_openai_request.c feeds this parser mutations.
 */
#include "openai_api.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "fmoe/utf8.h"
#include "fmoe/error.h"

/* ---------------------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------------------ */

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static int bad(serve_api_error *err, const char *param, const char *fmt, ...) {
    err->status = 400;
    err->type = "invalid_request_error";
    err->code = NULL;
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return FMOE_EINVAL;
}

static int oom(serve_api_error *err) {
    err->status = 500;
    err->type = "server_error";
    err->code = NULL;
    err->param[0] = '\0';
    snprintf(err->message, sizeof err->message, "out of memory");
    return FMOE_ENOMEM;
}

/* ---------------------------------------------------------------------------------------
 * Typed field access. Absent and null are the same: OpenAI clients send null for unset
 * optional fields.
 * ------------------------------------------------------------------------------------ */

static const cJSON *field(const cJSON *obj, const char *name) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(obj, name);
    return (f && !cJSON_IsNull(f)) ? f : NULL;
}

/* An integral number in [lo, hi]. @return 1 when present, 0 absent, FMOE_EINVAL. */
static int get_int(const cJSON *obj, const char *name, double lo, double hi, double *out,
                   serve_api_error *err) {
    const cJSON *f = field(obj, name);
    if (!f) return 0;
    if (!cJSON_IsNumber(f)) return bad(err, name, "'%s' must be an integer", name);
    double d = f->valuedouble;
    if (!isfinite(d) || d != floor(d)) return bad(err, name, "'%s' must be an integer", name);
    if (d < lo || d > hi)
        return bad(err, name, "'%s' is %.17g, outside [%.17g, %.17g]", name, d, lo, hi);
    *out = d;
    return 1;
}

static int get_bool(const cJSON *obj, const char *name, int *out, serve_api_error *err) {
    const cJSON *f = field(obj, name);
    if (!f) return 0;
    if (!cJSON_IsBool(f)) return bad(err, name, "'%s' must be a boolean", name);
    *out = cJSON_IsTrue(f);
    return 1;
}

/* ---------------------------------------------------------------------------------------
 * Sampling fields common to both endpoints
 * ------------------------------------------------------------------------------------ */

static int parse_stop(const cJSON *root, serve_api_request *r, serve_api_error *err) {
    const cJSON *f = field(root, "stop");
    if (!f) return 0;
    const cJSON *items[SERVE_API_MAX_STOP];
    int n = 0;
    if (cJSON_IsString(f)) {
        items[n++] = f;
    } else if (cJSON_IsArray(f)) {
        int size = cJSON_GetArraySize(f);
        if (size > SERVE_API_MAX_STOP)
            return bad(err, "stop", "'stop' has %d strings; at most %d are allowed", size,
                       SERVE_API_MAX_STOP);
        const cJSON *it;
        cJSON_ArrayForEach(it, f) {
            if (!cJSON_IsString(it)) return bad(err, "stop", "'stop' must hold strings");
            items[n++] = it;
        }
    } else {
        return bad(err, "stop", "'stop' must be a string or an array of strings");
    }
    for (int i = 0; i < n; i++) {
        /* An empty stop string would end every generation at once; clients send [""] to
         * mean "none". */
        if (items[i]->valuestring[0] == '\0') continue;
        char *s = strdup(items[i]->valuestring);
        if (!s) return oom(err);
        r->stop_ptrs[r->sampling.num_stop] = r->stop_store[r->sampling.num_stop] = s;
        r->sampling.num_stop++;
    }
    r->sampling.stop = r->sampling.num_stop ? r->stop_ptrs : NULL;
    return 0;
}

static int parse_sampling(const cJSON *root, serve_api_request *r, int32_t *max_tokens,
                          serve_api_error *err) {
    serve_sampling *s = &r->sampling;
    s->temperature = 1.0f;
    s->top_p = 1.0f;
    *max_tokens = 0;

    double d;
    int rc;
    /* max_completion_tokens replaces the deprecated max_tokens; a request may carry both. */
    if ((rc = get_int(root, "max_tokens", -INFINITY, INFINITY, &d, err)) < 0) return rc;
    if (rc && d < 1) return bad(err, "max_tokens", "'max_tokens' must be at least 1");
    if (rc) *max_tokens = d > INT32_MAX ? INT32_MAX : (int32_t)d;
    if ((rc = get_int(root, "max_completion_tokens", -INFINITY, INFINITY, &d, err)) < 0)
        return rc;
    if (rc && d < 1)
        return bad(err, "max_completion_tokens", "'max_completion_tokens' must be at least 1");
    if (rc) *max_tokens = d > INT32_MAX ? INT32_MAX : (int32_t)d;

    const cJSON *f;
    if ((f = field(root, "temperature"))) {
        if (!cJSON_IsNumber(f)) return bad(err, "temperature", "'temperature' must be a number");
        if (!(f->valuedouble >= 0 && f->valuedouble <= 2))
            return bad(err, "temperature", "'temperature' is %g, outside [0, 2]", f->valuedouble);
        /* as top_p: a positive double that the sampler's float holds as 0 would silently
         * mean greedy decoding */
        if (f->valuedouble > 0 && (float)f->valuedouble <= 0.0f)
            return bad(err, "temperature", "'temperature' is %g, too small for a float: use 0 "
                                           "for greedy decoding", f->valuedouble);
        s->temperature = (float)f->valuedouble;
    }
    if ((f = field(root, "top_p"))) {
        if (!cJSON_IsNumber(f)) return bad(err, "top_p", "'top_p' must be a number");
        /* the sampler works in float: a positive double below FLT_TRUE_MIN (1e-320) would
         * become 0, a nucleus of nothing */
        if (!(f->valuedouble > 0 && f->valuedouble <= 1) || (float)f->valuedouble <= 0.0f)
            return bad(err, "top_p", "'top_p' is %g, outside (0, 1]", f->valuedouble);
        s->top_p = (float)f->valuedouble;
    }
    if ((rc = get_int(root, "top_k", 0, INT32_MAX, &d, err)) < 0) return rc;
    if (rc) s->top_k = (int32_t)d;
    /* Seeds are int64 in OpenAI's API; a double holds them exactly up to 2^53, and beyond
     * that the same JSON number still gives the same seed. */
    if ((rc = get_int(root, "seed", -9223372036854775808.0, 18446744073709551615.0, &d, err)) < 0)
        return rc;
    if (rc) {
        s->has_seed = 1;
        s->seed = d < 0 ? (uint64_t)(int64_t)d : d >= 18446744073709551615.0 ? UINT64_MAX
                                                                              : (uint64_t)d;
    }
    /* n choices are n sequences (the prompt run n times): bounded, as the queue is */
    r->n = 1;
    if ((rc = get_int(root, "n", 1, SERVE_API_MAX_N, &d, err)) < 0) return rc;
    if (rc) r->n = (int32_t)d;
    int b;
    if ((rc = get_bool(root, "ignore_eos", &b, err)) < 0) return rc;
    if (rc) s->ignore_eos = b;
    if ((rc = get_bool(root, "stream", &b, err)) < 0) return rc;
    if (rc) r->stream = b;
    if ((f = field(root, "stream_options"))) {
        if (!cJSON_IsObject(f))
            return bad(err, "stream_options", "'stream_options' must be an object");
        if ((rc = get_bool(f, "include_usage", &b, err)) < 0) {
            snprintf(err->param, sizeof err->param, "stream_options.include_usage");
            return rc;
        }
        if (rc) r->include_usage = b;
    }
    return parse_stop(root, r, err);
}

/* ---------------------------------------------------------------------------------------
 * Prompts
 * ------------------------------------------------------------------------------------ */

/* A message's content: a string, null, or text parts concatenated. *out is malloc'd. */
static int message_content(const cJSON *c, int i, char **out, serve_api_error *err) {
    char param[64];
    snprintf(param, sizeof param, "messages[%d].content", i);
    if (!c || cJSON_IsNull(c)) {
        *out = strdup("");
        return *out ? 0 : oom(err);
    }
    if (cJSON_IsString(c)) {
        *out = strdup(c->valuestring);
        return *out ? 0 : oom(err);
    }
    if (!cJSON_IsArray(c))
        return bad(err, param, "'%s' must be a string or an array of content parts", param);
    size_t total = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, c) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type))
            return bad(err, param, "'%s' parts must be objects with a 'type'", param);
        if (strcmp(type->valuestring, "text") != 0)
            return bad(err, param, "content part type '%.64s' is not supported (text only)",
                       type->valuestring);
        if (!cJSON_IsString(text))
            return bad(err, param, "'%s' text parts need a string 'text'", param);
        total += strlen(text->valuestring);
    }
    char *s = malloc(total + 1);
    if (!s) return oom(err);
    size_t at = 0;
    cJSON_ArrayForEach(part, c) {
        const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        size_t n = strlen(t);
        memcpy(s + at, t, n);
        at += n;
    }
    s[at] = '\0';
    *out = s;
    return 0;
}

/* ---------------------------------------------------------------------------------------
 * Tools (docs/serving.md#tool-calls)
 * ------------------------------------------------------------------------------------ */

/* OpenAI's rule for function names (a-z, A-Z, 0-9, _ and -, at most 64), with '.' as
 * vLLM accepts; it also keeps a name safe to write into the forced call prefix. */
static int function_name_ok(const char *s) {
    size_t n = 0;
    for (; s[n]; n++) {
        const char c = s[n];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return 0;
    }
    return n >= 1 && n <= 64;
}

/* tools[i] = {"type": "function", "function": {"name", "description"?, "parameters"?}}. */
static int check_tool(const cJSON *t, int i, serve_api_error *err) {
    char param[64];
    snprintf(param, sizeof param, "tools[%d]", i);
    if (!cJSON_IsObject(t)) return bad(err, param, "'%s' must be an object", param);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") != 0) {
        snprintf(param, sizeof param, "tools[%d].type", i);
        return bad(err, param, "'%s' must be \"function\" (the only tool type)", param);
    }
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
    if (!cJSON_IsObject(f)) {
        snprintf(param, sizeof param, "tools[%d].function", i);
        return bad(err, param, "'%s' must be an object", param);
    }
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
    snprintf(param, sizeof param, "tools[%d].function.name", i);
    if (!cJSON_IsString(name)) return bad(err, param, "'%s' is required (a string)", param);
    if (!function_name_ok(name->valuestring))
        return bad(err, param, "'%s' is '%.64s'; a function name is 1 to 64 letters, digits, "
                               "'_', '-' or '.'", param, name->valuestring);
    const cJSON *desc = field(f, "description"), *params = field(f, "parameters");
    if (desc && !cJSON_IsString(desc)) {
        snprintf(param, sizeof param, "tools[%d].function.description", i);
        return bad(err, param, "'%s' must be a string", param);
    }
    if (params && !cJSON_IsObject(params)) {
        snprintf(param, sizeof param, "tools[%d].function.parameters", i);
        return bad(err, param, "'%s' must be an object (a JSON Schema)", param);
    }
    return 0;
}

/* A forced call's arguments written under the function's `parameters` schema (the
 * structured-output automaton, fmoe/json_constraint.h), as vLLM's guided decoding does
 * for a named tool_choice: they are then always a document of the schema. No parameters:
 * any JSON object. A schema the automaton cannot compile is a 400 when the function says
 * "strict": true, else the arguments are written unconstrained (docs/serving.md). */
static int constrain_arguments(const cJSON *tools, const char *named, serve_api_request *r,
                               serve_api_error *err) {
    if (r->sampling.json)
        return bad(err, "response_format", "'response_format' cannot be combined with a forced "
                                           "tool call (tool_choice \"required\" or a function): "
                                           "the call's arguments follow the tool's parameters");
    const cJSON *t, *f = NULL;
    int i = 0, at = 0;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (strcmp(cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring, named) == 0) {
            f = fn;
            at = i;
        }
        i++;
    }
    const cJSON *params = field(f, "parameters");
    if (!params) return fmoe_json_schema_any_object(&r->sampling.json) < 0 ? oom(err) : 0;
    char *text = cJSON_PrintUnformatted(params);
    if (!text) return oom(err);
    const int rc = fmoe_json_schema_compile(text, strlen(text), &r->sampling.json);
    free(text);
    if (rc == FMOE_ENOMEM) return oom(err);
    if (rc < 0) {
        r->sampling.json = NULL;
        if (cJSON_IsTrue(field(f, "strict"))) {
            char param[64];
            snprintf(param, sizeof param, "tools[%d].function.parameters", at);
            return bad(err, param, "'%s' cannot be enforced: %s", param, fmoe_error_detail());
        }
    }
    return 0;
}

/* tool_choice "required" with several tools, in a format whose call is one JSON object
 * {"name": N, KEY: A}: the opening markup goes into r->tools.prefix and the object is
 * constrained to a call of one of the tools, as the anyOf of one object per tool whose
 * "name" is that tool's const and whose KEY follows its parameters (the automaton joins
 * such branches as a tagged union: json_schema.c). @return 1 when constrained; 0 when the
 * format has no such object, or a tool's parameters do not compile and none says
 * "strict" (the caller then lets the model name the function, unconstrained); <0: 400. */
static int constrain_union(const cJSON *tools, const char *tmpl, serve_api_request *r,
                           serve_api_error *err) {
    const char *key;
    char opening[SERVE_TOOLS_PREFIX_MAX];
    if (fmoe_serve_tools_call_opening(r->tools.format, tmpl, opening, &key) < 0) return 0;
    if (r->sampling.json)
        return bad(err, "response_format", "'response_format' cannot be combined with a forced "
                                           "tool call (tool_choice \"required\" or a function): "
                                           "the call's arguments follow the tool's parameters");
    cJSON *any = cJSON_CreateObject(), *branches = cJSON_AddArrayToObject(any, "anyOf");
    const cJSON *t;
    int strict = 0, ok = branches != NULL;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *params = field(fn, "parameters");
        strict |= cJSON_IsTrue(field(fn, "strict"));
        cJSON *b = cJSON_CreateObject();
        if (!branches || !b || !cJSON_AddItemToArray(branches, b)) {
            cJSON_Delete(b);
            ok = 0;
            break;
        }
        cJSON *props = cJSON_AddObjectToObject(b, "properties");
        cJSON *name = cJSON_AddObjectToObject(props, "name");
        cJSON *req = cJSON_AddArrayToObject(b, "required");
        ok = ok && cJSON_AddStringToObject(b, "type", "object") && name &&
             cJSON_AddStringToObject(name, "const",
                                     cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring) &&
             cJSON_AddItemToObject(props, key, params ? cJSON_Duplicate(params, 1)
                                                      : cJSON_Parse("{\"type\":\"object\"}")) &&
             req && cJSON_AddItemToArray(req, cJSON_CreateString("name")) &&
             cJSON_AddItemToArray(req, cJSON_CreateString(key));
    }
    char *text = ok ? cJSON_PrintUnformatted(any) : NULL;
    cJSON_Delete(any);
    if (!text) return oom(err);
    const int rc = fmoe_json_schema_compile(text, strlen(text), &r->sampling.json);
    free(text);
    if (rc == FMOE_ENOMEM) return oom(err);
    if (rc < 0) {
        r->sampling.json = NULL;
        if (strict)
            return bad(err, "tools", "'tools' cannot be enforced with tool_choice \"required\": "
                                     "%s", fmoe_error_detail());
        return 0;
    }
    memcpy(r->tools.prefix, opening, sizeof opening);
    return 1;
}

/* tools, tool_choice and parallel_tool_calls: what the template is given (r->tools_json)
 * and how the output is read (r->tools.format, .parallel, .prefix). The format is the one
 * whose markup the model's template shows; forcing a call appends its opening to the
 * prompt (chat_output_prefix). */
static int chat_tools(const cJSON *root, const fmoe_tokenizer *tok, serve_api_request *r,
                      serve_api_error *err) {
    const cJSON *tools = field(root, "tools"), *choice = field(root, "tool_choice");
    if (tools && !cJSON_IsArray(tools))
        return bad(err, "tools", "'tools' must be an array of function tools");
    const int n = tools ? cJSON_GetArraySize(tools) : 0;
    int i = 0, rc;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        if ((rc = check_tool(t, i, err)) < 0) return rc;
        i++;
    }
    r->tools.parallel = 1;
    int b;
    if ((rc = get_bool(root, "parallel_tool_calls", &b, err)) < 0) return rc;
    if (rc) r->tools.parallel = b;

    /* tool_choice: "none" | "auto" (the default with tools) | "required" | a function */
    enum { NONE, AUTO, REQUIRED, NAMED } mode = n ? AUTO : NONE;
    const char *named = NULL;
    if (choice && cJSON_IsString(choice)) {
        const char *c = choice->valuestring;
        if (strcmp(c, "none") == 0) mode = NONE;
        else if (strcmp(c, "auto") == 0) mode = n ? AUTO : NONE;
        else if (strcmp(c, "required") == 0) mode = REQUIRED;
        else
            return bad(err, "tool_choice", "'tool_choice' is '%.32s'; expected \"none\", "
                                           "\"auto\", \"required\" or a function", c);
    } else if (choice) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(choice, "type");
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(choice, "function");
        const cJSON *name = cJSON_IsObject(f) ? cJSON_GetObjectItemCaseSensitive(f, "name") : NULL;
        if (!cJSON_IsObject(choice) || !cJSON_IsString(type) ||
            strcmp(type->valuestring, "function") != 0 || !cJSON_IsString(name))
            return bad(err, "tool_choice", "'tool_choice' must be \"none\", \"auto\", "
                                           "\"required\" or {\"type\": \"function\", "
                                           "\"function\": {\"name\": ...}}");
        mode = NAMED;
        named = name->valuestring;
    }
    if ((mode == REQUIRED || mode == NAMED) && n == 0)
        return bad(err, "tool_choice", "'tool_choice' asks for a call but 'tools' is empty");
    if (mode == NAMED) {
        int found = 0;
        cJSON_ArrayForEach(t, tools) {
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(
                cJSON_GetObjectItemCaseSensitive(t, "function"), "name");
            found |= strcmp(nm->valuestring, named) == 0;
        }
        if (!found)
            return bad(err, "tool_choice", "'tool_choice' names '%.64s', which is not one of "
                                           "'tools'", named);
    }
    /* "none": the tools are not offered and nothing is parsed (vLLM offers them unless
     * told not to; a model shown tools may still write a call, which would then be text) */
    if (mode == NONE) {
        r->tools.no_calls = 1;
        return 0;
    }

    const char *tmpl = fmoe_tokenizer_chat_template_text(tok, 1);
    r->tools.format = fmoe_serve_tools_detect(tmpl);
    if (r->tools.format == SERVE_TOOLS_NONE) {
        const char *other = fmoe_serve_tools_unsupported(tmpl);
        if (other)
            return bad(err, "tools", "'tools' is not supported for this model: its chat template "
                                     "writes tool calls as %s, a format fmoe does not parse yet",
                       other);
        if (!tmpl)
            return bad(err, "tools", "this model has no chat template text (its fixed '%s' "
                                     "renderer offers no tools), so 'tools' is not supported",
                       fmoe_tokenizer_chat_template(tok) ? fmoe_tokenizer_chat_template(tok)
                                                         : "none");
        return bad(err, "tools", "'tools' is not supported for this model: its chat template "
                                 "writes tool calls in no format fmoe parses (it knows "
                                 "<tool_call> (Hermes, Qwen), "
                                 "[TOOL_CALLS] and [ARGS] (Mistral), Llama 3's JSON and "
                                 "<|python_tag|>, gpt-oss's harmony channels and DeepSeek "
                                 "V3/V3.1's "
                                 "<\xEF\xBD\x9Ctool\xE2\x96\x81" "calls\xE2\x96\x81"
                                 "begin\xEF\xBD\x9C>)");
    }
    /* "required" with one tool can only call that one: forced as if named, so that its
     * arguments are constrained too */
    if (mode == REQUIRED && n == 1) {
        mode = NAMED;
        named = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(tools->child, "function"), "name")->valuestring;
    }
    if (mode == REQUIRED && (rc = constrain_union(tools, tmpl, r, err)) != 0) {
        if (rc < 0) return rc;
    } else if ((mode == REQUIRED || mode == NAMED) &&
        fmoe_serve_tools_forced_prefix(r->tools.format, named, tmpl, r->tools.prefix) < 0)
        return bad(err, "tool_choice", "'tool_choice': the function name is too long");
    if (mode == NAMED && (rc = constrain_arguments(tools, named, r, err)) < 0) return rc;
    /* the markers are special tokens in some vocabularies (Mistral's [TOOL_CALLS]) */
    r->sampling.keep_special = 1;
    r->tools_json = cJSON_PrintUnformatted(tools);
    return r->tools_json ? 0 : oom(err);
}

/* The deprecated `functions` and `function_call` fields of OpenAI's chat API, which it still
 * accepts, rewritten in root as the `tools` and `tool_choice` they stand for:
 * functions[i] = {name, description?, parameters?} becomes {"type": "function",
 * "function": functions[i]}; function_call "none" / "auto" / {"name": N} becomes
 * tool_choice "none" / "auto" / {"type": "function", "function": {"name": N}}. A request
 * with both forms is refused. @return 1 when root used them (the reply then answers in
 * their form: message.function_call), 0 when not, or a negative error. */
static int legacy_functions(cJSON *root, serve_api_error *err) {
    cJSON *fns = cJSON_GetObjectItemCaseSensitive(root, "functions");
    cJSON *fc = cJSON_GetObjectItemCaseSensitive(root, "function_call");
    if (cJSON_IsNull(fns)) fns = NULL;
    if (cJSON_IsNull(fc)) fc = NULL;
    if (!fns && !fc) return 0;
    if (field(root, "tools") || field(root, "tool_choice"))
        return bad(err, fns ? "functions" : "function_call",
                   "'%s' is the deprecated form of 'tools' and 'tool_choice'; send one form, "
                   "not both", fns ? "functions" : "function_call");
    if (fns && !cJSON_IsArray(fns))
        return bad(err, "functions", "'functions' must be an array of functions");
    if (fc && !(cJSON_IsString(fc) && (strcmp(fc->valuestring, "none") == 0 ||
                                       strcmp(fc->valuestring, "auto") == 0)) &&
        !(cJSON_IsObject(fc) && cJSON_IsString(cJSON_GetObjectItemCaseSensitive(fc, "name"))))
        return bad(err, "function_call", "'function_call' must be \"none\", \"auto\" or "
                                         "{\"name\": ...}");
    cJSON *tools = fns ? cJSON_CreateArray() : NULL;
    int i = 0;
    const cJSON *f;
    cJSON_ArrayForEach(f, fns) {
        char param[64];
        snprintf(param, sizeof param, "functions[%d]", i++);
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
        if (!cJSON_IsObject(f) || !cJSON_IsString(name) || !function_name_ok(name->valuestring)) {
            cJSON_Delete(tools);
            return bad(err, param, "'%s' must be an object with a 'name' of 1 to 64 letters, "
                                   "digits, '_', '-' or '.'", param);
        }
        cJSON *t = cJSON_CreateObject();
        if (!t || !cJSON_AddItemToArray(tools, t) || !cJSON_AddStringToObject(t, "type", "function") ||
            !cJSON_AddItemToObject(t, "function", cJSON_Duplicate(f, 1))) {
            cJSON_Delete(tools);
            return oom(err);
        }
    }
    cJSON *choice = NULL;
    if (cJSON_IsString(fc)) {
        choice = cJSON_CreateString(fc->valuestring);
    } else if (fc) {
        choice = cJSON_CreateObject();
        cJSON *fn = cJSON_AddObjectToObject(choice, "function");
        if (!cJSON_AddStringToObject(choice, "type", "function") || !fn ||
            !cJSON_AddStringToObject(fn, "name",
                                     cJSON_GetObjectItemCaseSensitive(fc, "name")->valuestring)) {
            cJSON_Delete(choice);
            cJSON_Delete(tools);
            return oom(err);
        }
    }
    if ((fc && !choice) || (fns && !tools)) {
        cJSON_Delete(choice);
        cJSON_Delete(tools);
        return oom(err);
    }
    cJSON_DeleteItemFromObjectCaseSensitive(root, "functions");
    cJSON_DeleteItemFromObjectCaseSensitive(root, "function_call");
    cJSON_DeleteItemFromObjectCaseSensitive(root, "tools");
    cJSON_DeleteItemFromObjectCaseSensitive(root, "tool_choice");
    if (tools) cJSON_AddItemToObject(root, "tools", tools);
    if (choice) cJSON_AddItemToObject(root, "tool_choice", choice);
    return 1;
}

/* An assistant message's tool_calls[].function.arguments, sent as OpenAI's API has them
 * (a JSON string), become the object they hold: transformers' templates expect a dict
 * (Mistral's writes arguments|tojson) and vLLM converts them the same way. A string that
 * is not a JSON object stays a string. */
static void tool_call_arguments_as_objects(cJSON *msg) {
    cJSON *calls = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls");
    cJSON *call;
    if (!cJSON_IsArray(calls)) return;
    cJSON_ArrayForEach(call, calls) {
        cJSON *f = cJSON_GetObjectItemCaseSensitive(call, "function");
        cJSON *a = cJSON_IsObject(f) ? cJSON_GetObjectItemCaseSensitive(f, "arguments") : NULL;
        if (!cJSON_IsString(a)) continue;
        cJSON *obj = cJSON_Parse(a->valuestring);
        if (!cJSON_IsObject(obj) || !cJSON_ReplaceItemInObjectCaseSensitive(f, "arguments", obj))
            cJSON_Delete(obj);
    }
}

/* After the template rendered the prompt text: how the output reads (<think> when the
 * template uses it; inside it already when the prompt ends with <think>), and the forced
 * call's opening appended to the prompt (*text grows). */
static int chat_output_prefix(const fmoe_tokenizer *tok, serve_api_request *r, char **text,
                              size_t *tlen, serve_api_error *err) {
    const char *tmpl = fmoe_tokenizer_chat_template_text(tok, r->tools_json != NULL);
    const char *t = *text;
    size_t e = *tlen;
    while (e > 0 && strchr(" \t\r\n", t[e - 1])) e--;
    const int open = e >= 7 && memcmp(t + e - 7, "<think>", 7) == 0;
    const int closed = e >= 8 && memcmp(t + e - 8, "</think>", 8) == 0;
    /* harmony (gpt-oss) answers on channels whether tools are offered or not: the output
     * is always split, and its header tokens must reach the parser */
    const int harmony = fmoe_serve_tools_detect(tmpl) == SERVE_TOOLS_HARMONY;
    if (harmony) {
        r->tools.format = SERVE_TOOLS_HARMONY;
        r->tools.reasoning = SERVE_REASONING_CHANNELS;
        r->sampling.keep_special = 1;
    } else if (tmpl && strstr(tmpl, "</think>") && !closed) {
        r->tools.reasoning = open ? SERVE_REASONING_OPEN : SERVE_REASONING_TAG;
    }
    const size_t np = strlen(r->tools.prefix);
    if (np == 0) return 0;
    /* a forced call comes first: a think block the prompt opened is closed before it */
    const char *close = r->tools.reasoning == SERVE_REASONING_OPEN ? "\n</think>\n\n" : "";
    if (!harmony) r->tools.reasoning = SERVE_REASONING_NONE;
    const size_t nc = strlen(close);
    char *g = realloc(*text, *tlen + nc + np + 1);
    if (!g) return oom(err);
    memcpy(g + *tlen, close, nc);
    memcpy(g + *tlen + nc, r->tools.prefix, np + 1);
    *text = g;
    *tlen += nc + np;
    return 0;
}

/* gpt-oss's template reads an assistant turn's reasoning from `thinking`; what serve
 * returns as `reasoning_content` comes back under that name, so it is handed over as
 * `thinking` unless the message has one (the template then renders it before a call, as
 * the model wrote it). A copy that fails for memory leaves the message as it was. */
static void reasoning_as_thinking(cJSON *msg) {
    const cJSON *rc = cJSON_GetObjectItemCaseSensitive(msg, "reasoning_content");
    if (cJSON_IsString(rc) && !cJSON_GetObjectItemCaseSensitive(msg, "thinking"))
        cJSON_AddStringToObject(msg, "thinking", rc->valuestring);
}

static int chat_prompt(const cJSON *root, const fmoe_tokenizer *tok, serve_api_request *r,
                       serve_api_error *err) {
    const int harmony = fmoe_serve_tools_detect(fmoe_tokenizer_chat_template_text(
                            tok, r->tools_json != NULL)) == SERVE_TOOLS_HARMONY;
    const cJSON *msgs = field(root, "messages");
    if (!msgs) return bad(err, "messages", "'messages' is required");
    if (!cJSON_IsArray(msgs)) return bad(err, "messages", "'messages' must be an array");
    int n = cJSON_GetArraySize(msgs);
    if (n == 0) return bad(err, "messages", "'messages' must not be empty");

    /* chat_template_kwargs (vLLM's and SGLang's name): extra template variables, such as
     * {"enable_thinking": false}, handed to the model's template as they are */
    const cJSON *kwargs = field(root, "chat_template_kwargs");
    if (kwargs && !cJSON_IsNull(kwargs) && !cJSON_IsObject(kwargs))
        return bad(err, "chat_template_kwargs", "'chat_template_kwargs' must be an object");

    fmoe_chat_message *cm = calloc((size_t)n, sizeof *cm);
    char **contents = calloc((size_t)n, sizeof *contents);
    char **fields = calloc((size_t)n, sizeof *fields);
    char *text = NULL, *kwargs_json = NULL;
    int rc = 0;
    if (!cm || !contents || !fields) {
        rc = oom(err);
        goto done;
    }
    if (cJSON_IsObject(kwargs) && !(kwargs_json = cJSON_PrintUnformatted(kwargs))) {
        rc = oom(err);
        goto done;
    }
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        char param[64];
        snprintf(param, sizeof param, "messages[%d]", i);
        if (!cJSON_IsObject(m)) {
            rc = bad(err, param, "'%s' must be an object", param);
            goto done;
        }
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role)) {
            snprintf(param, sizeof param, "messages[%d].role", i);
            rc = bad(err, param, "'%s' must be a string", param);
            goto done;
        }
        /* the roles OpenAI's chat API accepts; any other is refused, as OpenAI does,
         * rather than handed to a chat template that does not know it */
        static const char *const roles[] = {"system", "developer", "user", "assistant",
                                            "tool", NULL};
        int known = 0;
        for (int k = 0; roles[k]; k++) known |= strcmp(role->valuestring, roles[k]) == 0;
        if (!known) {
            snprintf(param, sizeof param, "messages[%d].role", i);
            rc = bad(err, param, "'%s' is '%.32s'; expected system, developer, user, "
                                 "assistant or tool", param, role->valuestring);
            goto done;
        }
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if ((rc = message_content(content, i, &contents[i], err)) < 0) goto done;
        cm[i].role = role->valuestring;
        /* null stays None for the template: an assistant turn that only calls tools */
        cm[i].content = content && !cJSON_IsNull(content) ? contents[i] : NULL;
        /* the other fields (tool_calls, tool_call_id, name, reasoning_content, ...) reach
         * the template as sent */
        if (m->child && (m->child->next || (strcmp(m->child->string, "role") != 0 &&
                                            strcmp(m->child->string, "content") != 0))) {
            cJSON *rest = cJSON_Duplicate(m, 1);
            if (rest) {
                cJSON_DeleteItemFromObjectCaseSensitive(rest, "role");
                cJSON_DeleteItemFromObjectCaseSensitive(rest, "content");
                if (strcmp(role->valuestring, "assistant") == 0) {
                    tool_call_arguments_as_objects(rest);
                    if (harmony) reasoning_as_thinking(rest);
                }
            }
            if (!rest || (rest->child && !(fields[i] = cJSON_PrintUnformatted(rest)))) {
                cJSON_Delete(rest);
                rc = oom(err);
                goto done;
            }
            cJSON_Delete(rest);
            cm[i].fields_json = fields[i];
        }
        i++;
    }
    size_t tlen;
    rc = fmoe_tokenizer_apply_chat_template(
        tok, cm, (size_t)n,
        &(fmoe_chat_options){.add_generation_prompt = 1, .tools_json = r->tools_json,
                             .kwargs_json = kwargs_json},
        &text, &tlen);
    if (rc == FMOE_ENOMEM) {
        rc = oom(err);
        goto done;
    }
    if (rc < 0) {
        rc = bad(err, "messages", "%s", fmoe_error_detail());
        goto done;
    }
    if ((rc = chat_output_prefix(tok, r, &text, &tlen, err)) < 0) goto done;
    size_t nids;
    rc = fmoe_tokenizer_encode_alloc(tok, text, tlen, 0, &r->prompt, &nids);
    if (rc < 0) {
        rc = rc == FMOE_ENOMEM ? oom(err) : bad(err, "messages", "%s", fmoe_error_detail());
        goto done;
    }
    if (nids > INT32_MAX) {
        rc = bad(err, "messages", "the prompt is too long");
        goto done;
    }
    r->num_prompt = (int32_t)nids;
done:
    for (int k = 0; k < n; k++) {
        if (contents) free(contents[k]);
        if (fields) cJSON_free(fields[k]);
    }
    free(contents);
    free(fields);
    cJSON_free(kwargs_json);
    free(cm);
    free(text);
    return rc;
}

static int ids_prompt(const cJSON *arr, const fmoe_tokenizer *tok, serve_api_request *r,
                      serve_api_error *err) {
    int n = cJSON_GetArraySize(arr);
    int32_t vocab = fmoe_tokenizer_vocab_size(tok);
    r->prompt = malloc((size_t)(n ? n : 1) * sizeof *r->prompt);
    if (!r->prompt) return oom(err);
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        double d = cJSON_IsNumber(it) ? it->valuedouble : -1;
        if (!cJSON_IsNumber(it) || d != floor(d) || d < 0 || d >= vocab)
            return bad(err, "prompt", "prompt token %d is not an id in [0, %d)", i, vocab);
        r->prompt[i++] = (int32_t)d;
    }
    r->num_prompt = n;
    return 0;
}

static int completion_prompt(const cJSON *root, const fmoe_tokenizer *tok,
                             serve_api_request *r, serve_api_error *err) {
    const cJSON *p = field(root, "prompt");
    if (!p) return bad(err, "prompt", "'prompt' is required");
    if (cJSON_IsArray(p)) {
        int n = cJSON_GetArraySize(p);
        if (n == 0) return bad(err, "prompt", "'prompt' must not be empty");
        const cJSON *first = cJSON_GetArrayItem(p, 0);
        if (cJSON_IsNumber(first)) return ids_prompt(p, tok, r, err);
        if (n != 1)
            return bad(err, "prompt", "one prompt per request is supported (got %d)", n);
        if (cJSON_IsArray(first)) return ids_prompt(first, tok, r, err);
        p = first;
    }
    if (!cJSON_IsString(p))
        return bad(err, "prompt", "'prompt' must be a string, an array of one string, or "
                                  "token ids");
    size_t nids;
    int rc = fmoe_tokenizer_encode_alloc(tok, p->valuestring, strlen(p->valuestring), 1,
                                         &r->prompt, &nids);
    if (rc < 0) return rc == FMOE_ENOMEM ? oom(err) : bad(err, "prompt", "%s", fmoe_error_detail());
    if (nids > INT32_MAX) return bad(err, "prompt", "the prompt is too long");
    r->num_prompt = (int32_t)nids;
    return 0;
}

static int is_noop(const cJSON *f);

/* Options of the legacy endpoint that change the response's shape: refused, not ignored,
 * so that a client does not read a field that is not there. */
static int completion_unsupported(const cJSON *root, serve_api_request *r,
                                  serve_api_error *err) {
    int b, rc;
    double d;
    if ((rc = get_bool(root, "echo", &b, err)) < 0) return rc;
    if (rc && b) return bad(err, "echo", "'echo' is not supported");
    /* logprobs: the number of alternatives per token, 0..5 as OpenAI's legacy API; 0
     * still reports each chosen token's own logprob. false (as null) asks for none. */
    const cJSON *f = field(root, "logprobs");
    if (f && !cJSON_IsFalse(f)) {
        if ((rc = get_int(root, "logprobs", 0, 5, &d, err)) < 0) return rc;
        r->sampling.logprobs = 1;
        r->sampling.top_logprobs = (int32_t)d;
    }
    if ((rc = get_int(root, "best_of", -INFINITY, INFINITY, &d, err)) < 0) return rc;
    if (rc && d != 1) return bad(err, "best_of", "'best_of' must be 1");
    if ((f = field(root, "suffix")) && !(cJSON_IsString(f) && f->valuestring[0] == '\0'))
        return bad(err, "suffix", "'suffix' is not supported");
    /* tools are a chat feature (OpenAI's legacy endpoint has none) */
    static const char *const chat_only[] = {"tools", "tool_choice", "functions", "function_call",
                                            "parallel_tool_calls"};
    for (size_t i = 0; i < sizeof chat_only / sizeof chat_only[0]; i++)
        if ((f = field(root, chat_only[i])) && !is_noop(f))
            return bad(err, chat_only[i], "'%s' is not supported on /v1/completions",
                       chat_only[i]);
    return 0;
}

/* logprobs (bool) and top_logprobs (0..20, only with logprobs true, as OpenAI says). */
static int chat_logprobs(const cJSON *root, serve_api_request *r, serve_api_error *err) {
    int b = 0, rc;
    double d;
    if ((rc = get_bool(root, "logprobs", &b, err)) < 0) return rc;
    if ((rc = get_int(root, "top_logprobs", 0, SERVE_MAX_TOP_LOGPROBS, &d, err)) < 0) return rc;
    if (rc && !b)
        return bad(err, "top_logprobs", "'top_logprobs' needs 'logprobs' to be true");
    r->sampling.logprobs = b;
    r->sampling.top_logprobs = rc ? (int32_t)d : 0;
    return 0;
}

/* 1 when f asks for nothing: an empty array or object, 0, false, "" or "none". */
static int is_noop(const cJSON *f) {
    if (cJSON_IsFalse(f)) return 1;
    if (cJSON_IsNumber(f)) return f->valuedouble == 0;
    if (cJSON_IsString(f)) return f->valuestring[0] == '\0' || strcmp(f->valuestring, "none") == 0;
    if (cJSON_IsArray(f) || cJSON_IsObject(f)) return f->child == NULL;
    return 0;
}

/* Options of either endpoint that change what is generated and that fmoe does not do yet:
 * refused with 400 naming the field, never ignored with a 200 that looks like compliance.
 * A value that asks for nothing (null, [], {}, 0, "none", response_format {"type": "text"})
 * is accepted. */
static int either_unsupported(const cJSON *root, serve_api_error *err) {
    static const char *const refused[] = {"logit_bias", "min_tokens"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        const cJSON *f = field(root, refused[i]);
        if (!f || is_noop(f)) continue;
        return bad(err, refused[i], "'%s' is not supported", refused[i]);
    }
    return 0;
}

/* response_format (either endpoint; the legacy completions API has none, vLLM's has it):
 * {"type": "text"} asks for nothing; {"type": "json_object"} any JSON object;
 * {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}} a
 * document of the schema (fmoe/json_constraint.h says what a schema may say; a keyword
 * it does not do is a 400 naming the keyword and its path). Errors name the param
 * "response_format", as OpenAI's do. Sets r->sampling.json. */
static int parse_response_format(const cJSON *root, serve_api_request *r, serve_api_error *err) {
    const cJSON *f = field(root, "response_format");
    if (!f) return 0;
    if (!cJSON_IsObject(f))
        return bad(err, "response_format", "'response_format' must be an object");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(f, "type");
    if (!cJSON_IsString(t))
        return bad(err, "response_format", "'response_format.type' must be a string: "
                                                "\"text\", \"json_object\" or \"json_schema\"");
    if (strcmp(t->valuestring, "text") == 0) return 0;
    if (strcmp(t->valuestring, "json_object") == 0) {
        if (fmoe_json_schema_any_object(&r->sampling.json) < 0) return oom(err);
        return 0;
    }
    if (strcmp(t->valuestring, "json_schema") != 0)
        return bad(err, "response_format",
                   "'response_format.type' \"%.64s\" is not one of \"text\", \"json_object\", "
                   "\"json_schema\"", t->valuestring);
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(f, "json_schema");
    if (!cJSON_IsObject(js))
        return bad(err, "response_format",
                   "'response_format.json_schema' must be an object with 'name' and 'schema'");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(js, "name");
    if (!cJSON_IsString(name) || !name->valuestring[0])
        return bad(err, "response_format",
                   "'response_format.json_schema.name' must be a non-empty string");
    const cJSON *strict = field(js, "strict");
    if (strict && !cJSON_IsBool(strict))
        return bad(err, "response_format",
                   "'response_format.json_schema.strict' must be a boolean");
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
    if (!cJSON_IsObject(schema))
        return bad(err, "response_format",
                   "'response_format.json_schema.schema' must be a JSON schema object");
    char *text = cJSON_PrintUnformatted(schema);
    if (!text) return oom(err);
    const int rc = fmoe_json_schema_compile(text, strlen(text), &r->sampling.json);
    free(text);
    if (rc == FMOE_ENOMEM) return oom(err);
    if (rc < 0)
        return bad(err, "response_format",
                   "Invalid schema for response_format '%.64s': %s", name->valuestring,
                   fmoe_error_detail());
    return 0;
}

/* The byte offset of the first JSON escape \u0000 in body, or -1. cJSON decodes it to a
 * NUL byte inside a C string, which would silently cut a prompt, a stop sequence or a role
 * short; a text with a NUL is refused instead. An escaped backslash followed by "u0000"
 * (an odd run of backslashes is the escape) is text, not a NUL. */
static long long nul_escape_at(const char *body, size_t len) {
    for (size_t i = 0; i + 6 <= len; i++) {
        if (body[i] != '\\') continue;
        size_t run = 1;
        while (i + run < len && body[i + run] == '\\') run++;
        const size_t u = i + run - 1; /* the last backslash of the run */
        if (run % 2 == 1 && u + 6 <= len && body[u + 1] == 'u' && body[u + 2] == '0' &&
            body[u + 3] == '0' && body[u + 4] == '0' && body[u + 5] == '0')
            return (long long)u;
        i += run - 1;
    }
    return -1;
}

int fmoe_serve_api_parse(int32_t kind, const char *body, size_t len, const fmoe_tokenizer *tok,
                    int32_t max_context, serve_api_request *out, serve_api_error *err) {
    memset(out, 0, sizeof *out);
    memset(err, 0, sizeof *err);
    out->kind = kind;
    const long long nul = nul_escape_at(body, len);
    if (nul >= 0)
        return bad(err, NULL, "the request holds a NUL character (\\u0000 at byte %lld); text "
                              "with NUL characters is not accepted", nul);
    if (memchr(body, '\0', len))
        return bad(err, NULL, "the request body holds a NUL byte; expected JSON");
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        /* cJSON reports the error position as a pointer into body (or just past it). */
        size_t off = (at && at >= body && at <= body + len) ? (size_t)(at - body) : 0;
        if (len == 0) return bad(err, NULL, "the request body is empty; expected JSON");
        return bad(err, NULL, "the request body is not valid JSON (near byte %zu)", off);
    }
    int rc;
    int32_t max_tokens;
    size_t tail = end && end >= body && end <= body + len ? (size_t)(end - body) : len;
    while (tail < len && strchr(" \t\r\n", body[tail]) && body[tail]) tail++;
    if (tail < len) {
        rc = bad(err, NULL, "the request body is not valid JSON (data after the value at "
                            "byte %zu)", tail);
        goto fail;
    }
    if (!cJSON_IsObject(root)) {
        rc = bad(err, NULL, "the request body must be a JSON object");
        goto fail;
    }
    if ((rc = parse_sampling(root, out, &max_tokens, err)) < 0) goto fail;
    if ((rc = either_unsupported(root, err)) < 0) goto fail;
    if ((rc = parse_response_format(root, out, err)) < 0) goto fail;
    if (kind == SERVE_API_CHAT) {
        if ((rc = chat_logprobs(root, out, err)) < 0) goto fail;
        if ((rc = legacy_functions(root, err)) < 0) goto fail;
        const int legacy = rc;
        if ((rc = chat_tools(root, tok, out, err)) < 0) goto fail;
        /* the legacy reply has room for one call: function_call, not a list */
        if (legacy) {
            out->tools.legacy = 1;
            out->tools.parallel = 0;
        }
        rc = chat_prompt(root, tok, out, err);
    } else {
        if ((rc = completion_unsupported(root, out, err)) < 0) goto fail;
        rc = completion_prompt(root, tok, out, err);
    }
    if (rc < 0) goto fail;

    const char *pfield = kind == SERVE_API_CHAT ? "messages" : "prompt";
    if (out->num_prompt == 0) {
        rc = bad(err, pfield, "the prompt is empty");
        goto fail;
    }
    int64_t left = (int64_t)max_context - out->num_prompt;
    if (left < 1 || (max_tokens && max_tokens > left)) {
        rc = bad(err, pfield,
                 "This model's maximum context length is %d tokens. However, you requested "
                 "%lld tokens (%d in the prompt, %lld for the completion).",
                 max_context, (long long)out->num_prompt + (max_tokens ? max_tokens : 0),
                 out->num_prompt, (long long)(max_tokens ? max_tokens : 0));
        err->code = "context_length_exceeded";
        goto fail;
    }
    out->sampling.max_tokens = max_tokens ? max_tokens : (int32_t)left;
    cJSON_Delete(root);
    return 0;
fail:
    cJSON_Delete(root);
    fmoe_serve_api_request_free(out);
    out->kind = kind;
    return rc;
}

size_t fmoe_serve_api_utf8_invalid_at(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        unsigned lo, hi;
        const size_t k = (size_t)fmoe_utf8_lead(c, &lo, &hi); /* table 3-7's ranges */
        if (k == 0 || i + k > n) return i;
        if (s[i + 1] < lo || s[i + 1] > hi) return i;
        for (size_t j = 2; j < k; j++)
            if ((s[i + j] & 0xC0) != 0x80) return i;
        i += k;
    }
    return n;
}

void fmoe_serve_api_request_free(serve_api_request *r) {
    if (!r) return;
    free(r->prompt);
    fmoe_json_schema_free(r->sampling.json);
    for (int i = 0; i < SERVE_API_MAX_STOP; i++) free(r->stop_store[i]);
    cJSON_free(r->tools_json);
    memset(r, 0, sizeof *r);
}

/* ---------------------------------------------------------------------------------------
 * Rendering
 * ------------------------------------------------------------------------------------ */

void fmoe_serve_api_make_id(int32_t kind, const uint8_t rnd[12], char out[SERVE_API_ID_MAX]) {
    static const char hex[] = "0123456789abcdef";
    int at = snprintf(out, SERVE_API_ID_MAX, "%s", kind == SERVE_API_CHAT ? "chatcmpl-" : "cmpl-");
    for (int i = 0; i < 12; i++) {
        out[at++] = hex[rnd[i] >> 4];
        out[at++] = hex[rnd[i] & 15];
    }
    out[at] = '\0';
}

const char *fmoe_serve_api_finish_reason(int32_t finish) {
    switch (finish) {
    case SERVE_FINISH_STOP: return "stop";
    case SERVE_FINISH_LENGTH:
    case SERVE_FINISH_CANCELLED: return "length";
    default: return NULL;
    }
}

/* cJSON wants NUL-terminated strings; the engine's text is a byte range. */
static cJSON *string_n(const char *text, size_t len) {
    char *s = malloc(len + 1);
    if (!s) return NULL;
    if (len) memcpy(s, text, len);
    s[len] = '\0';
    cJSON *j = cJSON_CreateString(s);
    free(s);
    return j;
}

/* Adds item to obj; on failure deletes it. @return 0 or -1. */
static int put(cJSON *obj, const char *name, cJSON *item) {
    if (!item) return -1;
    if (!cJSON_AddItemToObject(obj, name, item)) {
        cJSON_Delete(item);
        return -1;
    }
    return 0;
}

static int put_num(cJSON *obj, const char *name, double v) {
    return put(obj, name, cJSON_CreateNumber(isfinite(v) ? v : 0));
}

static int put_str(cJSON *obj, const char *name, const char *s) {
    return put(obj, name, s ? cJSON_CreateString(s) : cJSON_CreateNull());
}

static cJSON *header(const serve_api_meta *m, const char *object) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    if (put_str(o, "id", m->id) || put_str(o, "object", object) ||
        put_num(o, "created", (double)m->created) || put_str(o, "model", m->model)) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static int put_usage(cJSON *o, const serve_job_status *st) {
    cJSON *u = cJSON_CreateObject();
    if (put(o, "usage", u)) return -1;
    if (put_num(u, "prompt_tokens", st->prompt_tokens) ||
        put_num(u, "completion_tokens", st->completion_tokens) ||
        put_num(u, "total_tokens", (double)st->prompt_tokens + st->completion_tokens))
        return -1;
    /* OpenAI's report of prompt tokens served from its prompt cache: here the prefix cache */
    cJSON *pd = cJSON_CreateObject();
    if (put(u, "prompt_tokens_details", pd) || put_num(pd, "cached_tokens", st->cached_tokens))
        return -1;

    /* llama.cpp's server `timings`: per-token ms and tokens per second of each phase. */
    cJSON *t = cJSON_CreateObject();
    if (put(o, "timings", t)) return -1;
    /* as llama-server: prompt_n the prompt tokens run, cache_n those the cache spared */
    double pn = st->prompt_tokens - st->cached_tokens, gn = st->completion_tokens;
    if (put_num(t, "cache_n", st->cached_tokens) || put_num(t, "prompt_n", pn) ||
        put_num(t, "prompt_ms", st->prompt_ms) ||
        put_num(t, "prompt_per_token_ms", pn > 0 ? st->prompt_ms / pn : 0) ||
        put_num(t, "prompt_per_second", st->prompt_ms > 0 ? 1e3 * pn / st->prompt_ms : 0) ||
        put_num(t, "predicted_n", gn) || put_num(t, "predicted_ms", st->predicted_ms) ||
        put_num(t, "predicted_per_token_ms", gn > 0 ? st->predicted_ms / gn : 0) ||
        put_num(t, "predicted_per_second",
                st->predicted_ms > 0 ? 1e3 * gn / st->predicted_ms : 0))
        return -1;

    cJSON *f = cJSON_CreateObject();
    if (put(o, "fmoe", f)) return -1;
    const serve_job_cache *c = &st->cache;
    if (put_num(f, "hits", (double)c->hits) || put_num(f, "misses", (double)c->misses) ||
        put_num(f, "late", (double)c->late) || put_num(f, "prefetched", (double)c->prefetched) ||
        put_num(f, "bytes_loaded", (double)c->bytes_loaded) ||
        put_num(f, "stall_ms", c->stall_ms) || put_num(f, "queue_ms", st->queue_ms))
        return -1;
    return 0;
}

/* Prints and deletes o. */
static char *finish_json(cJSON *o) {
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

/* Appends {"index": index} to the array choices. @return it, or NULL out of memory. */
static cJSON *add_choice(cJSON *choices, int32_t index) {
    cJSON *c = cJSON_CreateObject();
    if (!c || !cJSON_AddItemToArray(choices, c)) {
        cJSON_Delete(c);
        return NULL;
    }
    return put_num(c, "index", index) ? NULL : c;
}

/* o.choices = [{"index": index}]. @return that choice, or NULL when out of memory. */
static cJSON *first_choice(cJSON *o, int32_t index) {
    cJSON *choices = cJSON_CreateArray();
    if (put(o, "choices", choices)) return NULL;
    return add_choice(choices, index);
}

/* ---------------------------------------------------------------------------------------
 * Log-probabilities
 * ------------------------------------------------------------------------------------ */

/* A logprob as JSON: -inf (a token the model gives no chance) is -9999, OpenAI's floor,
 * since JSON has no infinity. */
static cJSON *logprob_num(float lp) { return cJSON_CreateNumber(lp >= -9999.0f ? lp : -9999.0); }

/* The token's piece (the bytes it adds to the text) as a JSON string: a piece that is part
 * of a UTF-8 sequence has its stray bytes as U+FFFD; `bytes` carries them exactly. */
static cJSON *piece_string(const serve_api_meta *m, int32_t id) {
    const char *p = "";
    size_t n = 0;
    if (m->tok && fmoe_tokenizer_token_to_piece(m->tok, id, &p, &n) < 0) {
        p = "";
        n = 0;
    }
    char *out = malloc(3 * n + 1); /* each stray byte becomes 3 */
    if (!out) return NULL;
    size_t at = 0, i = 0;
    while (i < n) {
        const size_t ok = fmoe_serve_api_utf8_invalid_at(p + i, n - i);
        memcpy(out + at, p + i, ok);
        at += ok;
        i += ok;
        if (i < n) {
            memcpy(out + at, "\xEF\xBF\xBD", 3);
            at += 3;
            i++;
        }
    }
    out[at] = '\0';
    cJSON *j = cJSON_CreateString(out);
    free(out);
    return j;
}

static cJSON *piece_bytes(const serve_api_meta *m, int32_t id) {
    const char *p = "";
    size_t n = 0;
    if (m->tok && fmoe_tokenizer_token_to_piece(m->tok, id, &p, &n) < 0) n = 0;
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; a && i < n; i++) {
        cJSON *b = cJSON_CreateNumber((unsigned char)p[i]);
        if (!b || !cJSON_AddItemToArray(a, b)) {
            cJSON_Delete(b);
            cJSON_Delete(a);
            return NULL;
        }
    }
    return a;
}

static int push(cJSON *arr, cJSON *item) {
    if (!item) return -1;
    if (!cJSON_AddItemToArray(arr, item)) {
        cJSON_Delete(item);
        return -1;
    }
    return 0;
}

/* {token, logprob, bytes}, chat's shape of one token. */
static cJSON *chat_token(const serve_api_meta *m, int32_t id, float lp) {
    cJSON *o = cJSON_CreateObject();
    if (!o || put(o, "token", piece_string(m, id)) || put(o, "logprob", logprob_num(lp)) ||
        put(o, "bytes", piece_bytes(m, id))) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* chat: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]} */
static cJSON *chat_logprobs_json(const serve_api_meta *m, const serve_token_logprob *lp,
                                 int32_t n) {
    cJSON *o = cJSON_CreateObject();
    if (!o || put(o, "content", cJSON_CreateArray())) goto fail;
    cJSON *content = cJSON_GetObjectItemCaseSensitive(o, "content");
    for (int32_t i = 0; i < n; i++) {
        cJSON *t = chat_token(m, lp[i].id, lp[i].logprob), *top = cJSON_CreateArray();
        if (push(content, t)) {
            cJSON_Delete(top);
            goto fail;
        }
        if (put(t, "top_logprobs", top)) goto fail;
        for (int32_t k = 0; k < lp[i].num_top; k++)
            if (push(top, chat_token(m, lp[i].top_id[k], lp[i].top_logprob[k]))) goto fail;
    }
    return o;
fail:
    cJSON_Delete(o);
    return NULL;
}

/* completions: {tokens, token_logprobs, top_logprobs: [{piece: logprob}], text_offset};
 * the first token's text starts at `start`, each next one where the previous ended. */
static cJSON *completion_logprobs_json(const serve_api_meta *m, const serve_token_logprob *lp,
                                       int32_t n, size_t start) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON *tokens = cJSON_CreateArray(), *lps = cJSON_CreateArray(), *tops = cJSON_CreateArray(),
          *offs = cJSON_CreateArray();
    /* put deletes what it could not add; the rest are deleted here */
    if (put(o, "tokens", tokens)) {
        cJSON_Delete(lps), cJSON_Delete(tops), cJSON_Delete(offs);
        goto fail;
    }
    if (put(o, "token_logprobs", lps)) {
        cJSON_Delete(tops), cJSON_Delete(offs);
        goto fail;
    }
    if (put(o, "top_logprobs", tops)) {
        cJSON_Delete(offs);
        goto fail;
    }
    if (put(o, "text_offset", offs)) goto fail;
    for (int32_t i = 0; i < n; i++) {
        cJSON *d = cJSON_CreateObject();
        if (push(tops, d) || push(tokens, piece_string(m, lp[i].id)) ||
            push(lps, logprob_num(lp[i].logprob)) ||
            push(offs, cJSON_CreateNumber((double)(i ? lp[i - 1].text_end : start))))
            goto fail;
        for (int32_t k = 0; k < lp[i].num_top; k++) {
            cJSON *key = piece_string(m, lp[i].top_id[k]);
            if (!key) goto fail;
            /* two ids with the same piece: the likelier (first) keeps the key */
            if (!cJSON_GetObjectItemCaseSensitive(d, key->valuestring) &&
                put(d, key->valuestring, logprob_num(lp[i].top_logprob[k]))) {
                cJSON_Delete(key);
                goto fail;
            }
            cJSON_Delete(key);
        }
    }
    return o;
fail:
    cJSON_Delete(o);
    return NULL;
}

/* choice.logprobs: null unless the request asked for them. */
static int put_logprobs(cJSON *c, const serve_api_meta *m, const serve_token_logprob *lp,
                        int32_t n, size_t start) {
    if (!m->logprobs) return put(c, "logprobs", cJSON_CreateNull());
    return put(c, "logprobs", m->kind == SERVE_API_CHAT
                                  ? chat_logprobs_json(m, lp, n)
                                  : completion_logprobs_json(m, lp, n, start));
}

/* ---------------------------------------------------------------------------------------
 * Split outputs: reasoning, tool calls, content
 * ------------------------------------------------------------------------------------ */

/* {"id", "type": "function", "function": {"name", "arguments"}} (with index in a chunk:
 * index >= 0; a later chunk of the same call has only index and function.arguments). */
static cJSON *tool_call_json(const serve_api_meta *m, int32_t choice, int32_t index, int chunk,
                             const char *name, const char *args, size_t args_len) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    if (chunk && put_num(o, "index", index)) goto fail;
    if (name) {
        char id[SERVE_TOOLS_ID_MAX];
        fmoe_serve_tools_call_id(m->tools.format, m->id, choice, index, id);
        if (put_str(o, "id", id) || put_str(o, "type", "function")) goto fail;
    }
    cJSON *f = cJSON_CreateObject();
    if (put(o, "function", f)) goto fail; /* put deleted f */
    if ((name && put_str(f, "name", name)) || put(f, "arguments", string_n(args, args_len)))
        goto fail;
    return o;
fail:
    cJSON_Delete(o);
    return NULL;
}

/* choice.message of a split output: content (null when the answer is only calls),
 * reasoning_content (when the template thinks; null when there was none), tool_calls. */
static int put_split_message(cJSON *c, const serve_api_meta *m, int32_t choice,
                             const serve_tools_parse *p) {
    cJSON *msg = cJSON_CreateObject();
    if (put(c, "message", msg) || put_str(msg, "role", "assistant")) return -1;
    if (put(msg, "content", p->content_len == 0 && p->num_calls > 0
                                ? cJSON_CreateNull()
                                : string_n(p->content, p->content_len)))
        return -1;
    if (m->tools.reasoning != SERVE_REASONING_NONE &&
        put(msg, "reasoning_content", p->has_reasoning ? string_n(p->reasoning, p->reasoning_len)
                                                       : cJSON_CreateNull()))
        return -1;
    if (p->num_calls == 0) return 0;
    if (m->tools.legacy) { /* {"name", "arguments"}: no id, no type (OpenAI's older form) */
        cJSON *f = cJSON_CreateObject();
        return put(msg, "function_call", f) || put_str(f, "name", p->calls[0].name) ||
                       put(f, "arguments", string_n(p->calls[0].arguments,
                                                    p->calls[0].arguments_len))
                   ? -1
                   : 0;
    }
    cJSON *calls = cJSON_CreateArray();
    if (put(msg, "tool_calls", calls)) return -1;
    for (int32_t k = 0; k < p->num_calls; k++)
        if (push(calls, tool_call_json(m, choice, k, 0, p->calls[k].name, p->calls[k].arguments,
                                       p->calls[k].arguments_len)))
            return -1;
    return 0;
}

char *fmoe_serve_api_render_chunk_tools(const serve_api_meta *m, int32_t index,
                                        const serve_tools_delta *d, const char *finish_reason,
                                        int usage_null, const serve_token_logprob *lp,
                                        int32_t num_lp, size_t start) {
    cJSON *o = header(m, "chat.completion.chunk");
    if (!o) return NULL;
    cJSON *c = first_choice(o, index), *delta = cJSON_CreateObject();
    if (!c || put(c, "delta", delta)) goto fail;
    if (d && d->content_len && put(delta, "content", string_n(d->content, d->content_len)))
        goto fail;
    if (d && d->reasoning_len &&
        put(delta, "reasoning_content", string_n(d->reasoning, d->reasoning_len)))
        goto fail;
    if (d && d->num_calls && m->tools.legacy) {
        /* the legacy stream: delta.function_call, its name in the first delta only, then
         * pieces of its arguments (one call: parallel is 0) */
        const serve_tools_call_delta *cd = &d->calls[0];
        cJSON *f = cJSON_CreateObject();
        if (put(delta, "function_call", f) || (cd->name && put_str(f, "name", cd->name)) ||
            put(f, "arguments", string_n(cd->arguments, cd->arguments_len)))
            goto fail;
    } else if (d && d->num_calls) {
        cJSON *calls = cJSON_CreateArray();
        if (put(delta, "tool_calls", calls)) goto fail;
        for (int32_t k = 0; k < d->num_calls; k++) {
            const serve_tools_call_delta *cd = &d->calls[k];
            if (push(calls, tool_call_json(m, index, cd->index, 1, cd->name, cd->arguments,
                                           cd->arguments_len)))
                goto fail;
        }
    }
    const int lp_rc = num_lp > 0 ? put_logprobs(c, m, lp, num_lp, start)
                                 : put(c, "logprobs", cJSON_CreateNull());
    if (lp_rc || put_str(c, "finish_reason", finish_reason)) goto fail;
    if (usage_null && put(o, "usage", cJSON_CreateNull())) goto fail;
    return finish_json(o);
fail:
    cJSON_Delete(o);
    return NULL;
}

char *fmoe_serve_api_render_response(const serve_api_meta *m, const char *text, size_t len,
                                const serve_job_status *st) {
    return fmoe_serve_api_render_response_lp(m, text, len, st, NULL, 0);
}

char *fmoe_serve_api_render_response_lp(const serve_api_meta *m, const char *text, size_t len,
                                        const serve_job_status *st,
                                        const serve_token_logprob *lp, int32_t num_lp) {
    const serve_api_choice c = {text, len, st->finished, lp, num_lp, NULL};
    return fmoe_serve_api_render_response_n(m, &c, 1, st);
}

char *fmoe_serve_api_render_response_n(const serve_api_meta *m, const serve_api_choice *ch,
                                       int32_t n, const serve_job_status *st) {
    int chat = m->kind == SERVE_API_CHAT;
    cJSON *o = header(m, chat ? "chat.completion" : "text_completion");
    if (!o) return NULL;
    cJSON *choices = cJSON_CreateArray();
    if (put(o, "choices", choices)) goto fail;
    for (int32_t i = 0; i < n; i++) {
        cJSON *c = add_choice(choices, i);
        if (!c) goto fail;
        const char *finish = fmoe_serve_api_finish_reason(ch[i].finished);
        if (chat && ch[i].parsed) {
            if (put_split_message(c, m, i, ch[i].parsed)) goto fail;
            if (ch[i].parsed->num_calls > 0 && ch[i].finished == SERVE_FINISH_STOP)
                finish = m->tools.legacy ? "function_call" : "tool_calls";
        } else if (chat) {
            cJSON *msg = cJSON_CreateObject();
            if (put(c, "message", msg) || put_str(msg, "role", "assistant") ||
                put(msg, "content", string_n(ch[i].text, ch[i].len)))
                goto fail;
        } else if (put(c, "text", string_n(ch[i].text, ch[i].len))) {
            goto fail;
        }
        if (put_str(c, "finish_reason", finish) ||
            put_logprobs(c, m, ch[i].lp, ch[i].num_lp, 0))
            goto fail;
    }
    if (put_usage(o, st)) goto fail;
    return finish_json(o);
fail:
    cJSON_Delete(o);
    return NULL;
}

char *fmoe_serve_api_render_chunk(const serve_api_meta *m, int role, const char *text, size_t len,
                             const char *finish_reason, int usage_null) {
    return fmoe_serve_api_render_chunk_lp(m, 0, role, text, len, finish_reason, usage_null, NULL,
                                          0, 0);
}

char *fmoe_serve_api_render_chunk_lp(const serve_api_meta *m, int32_t index, int role,
                                     const char *text,
                                     size_t len, const char *finish_reason, int usage_null,
                                     const serve_token_logprob *lp, int32_t num_lp,
                                     size_t start) {
    int chat = m->kind == SERVE_API_CHAT;
    cJSON *o = header(m, chat ? "chat.completion.chunk" : "text_completion");
    if (!o) return NULL;
    cJSON *c = first_choice(o, index);
    if (!c) goto fail;
    if (chat) {
        cJSON *delta = cJSON_CreateObject();
        if (put(c, "delta", delta)) goto fail;
        if (role && (put_str(delta, "role", "assistant") || put_str(delta, "content", "")))
            goto fail;
        /* The final chunk's delta is empty: the text came before. */
        if (!role && len && put(delta, "content", string_n(text, len))) goto fail;
    } else if (put(c, "text", string_n(text, len))) {
        goto fail;
    }
    /* only chunks that carry tokens carry their logprobs (role and final chunks: null) */
    const int with_lp = !role && (len > 0 || num_lp > 0);
    const int lp_rc = with_lp ? put_logprobs(c, m, lp, num_lp, start)
                              : put(c, "logprobs", cJSON_CreateNull());
    if (lp_rc || put_str(c, "finish_reason", finish_reason))
        goto fail;
    if (usage_null && put(o, "usage", cJSON_CreateNull())) goto fail;
    return finish_json(o);
fail:
    cJSON_Delete(o);
    return NULL;
}

char *fmoe_serve_api_render_usage_chunk(const serve_api_meta *m, const serve_job_status *st) {
    cJSON *o = header(m, m->kind == SERVE_API_CHAT ? "chat.completion.chunk" : "text_completion");
    if (!o) return NULL;
    if (put(o, "choices", cJSON_CreateArray()) || put_usage(o, st)) {
        cJSON_Delete(o);
        return NULL;
    }
    return finish_json(o);
}

char *fmoe_serve_api_render_error(const char *type, const char *message, const char *param,
                             const char *code) {
    cJSON *o = cJSON_CreateObject(), *e = cJSON_CreateObject();
    if (!o) {
        cJSON_Delete(e);
        return NULL;
    }
    if (put(o, "error", e) || put_str(e, "message", message ? message : "") ||
        put_str(e, "type", type ? type : "invalid_request_error") ||
        put_str(e, "param", (param && param[0]) ? param : NULL) || put_str(e, "code", code)) {
        cJSON_Delete(o);
        return NULL;
    }
    return finish_json(o);
}

char *fmoe_serve_api_render_health(const char *status, const char *why) {
    cJSON *o = cJSON_CreateObject();
    if (!o || put_str(o, "status", status) || put_str(o, "error", why)) {
        cJSON_Delete(o);
        return NULL;
    }
    return finish_json(o);
}

char *fmoe_serve_api_render_models(const serve_engine_info *info) {
    cJSON *o = cJSON_CreateObject(), *data = cJSON_CreateArray(), *m = cJSON_CreateObject();
    if (!o || put_str(o, "object", "list") || put(o, "data", data)) {
        cJSON_Delete(m);
        goto fail;
    }
    if (!m || !cJSON_AddItemToArray(data, m)) {
        cJSON_Delete(m);
        goto fail;
    }
    if (put_str(m, "id", info->model_name ? info->model_name : "fmoe") ||
        put_str(m, "object", "model") || put_num(m, "created", (double)info->created) ||
        put_str(m, "owned_by", "fmoe") || put_num(m, "max_context", info->max_context) ||
        put_num(m, "parallel", info->parallel) ||
        put_str(m, "backend", info->backend ? info->backend : "cpu"))
        goto fail;
    return finish_json(o);
fail:
    cJSON_Delete(o);
    return NULL;
}
