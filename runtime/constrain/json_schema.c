/*
 * json_schema.c - a JSON schema compiled to the node table the byte automaton runs
 * (json_impl.h); fmoe/json_constraint.h lists what a schema may say.
 *
 * Keywords are taken from a list: a keyword that changes what is valid and is not on it
 * is refused with its JSON path, never ignored, so that a 200 reply never pretends to
 * honour a constraint it did not apply. anyOf branches must differ in the first byte of
 * their values, so that the automaton stays deterministic (one stack, no backtracking):
 * a value's first byte picks its branch.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "fmoe/error.h"
#include "json_impl.h"

/* Nesting of a schema (objects within arrays within ...): each level is a frame. */
#define JSON_MAX_SCHEMA_DEPTH 24

/* ---------------------------------------------------------------------------------- */
/* Tables                                                                             */
/* ---------------------------------------------------------------------------------- */

#define GROW(arr, num, cap)                                                              \
    do {                                                                                 \
        if ((num) == (cap)) {                                                            \
            int32_t ncap_ = (cap) ? 2 * (cap) : 16;                                      \
            void *g_ = realloc((arr), (size_t)ncap_ * sizeof *(arr));                    \
            if (!g_) return fmoe_error_set(FMOE_ENOMEM, "out of memory compiling a schema"); \
            (arr) = g_;                                                                  \
            (cap) = ncap_;                                                               \
        }                                                                                \
    } while (0)

static void starts_add(json_node *n, unsigned c) { n->starts[c >> 6] |= 1ull << (c & 63); }

static int new_node(fmoe_json_schema *s, int32_t kind, int32_t *out) {
    GROW(s->nodes, s->num_nodes, s->cap_nodes);
    json_node *n = &s->nodes[s->num_nodes];
    memset(n, 0, sizeof *n);
    n->kind = kind;
    n->max_items = -1;
    n->pattern = -1;
    switch (kind) {
    case JSON_OBJECT:
    case JSON_ANY_OBJECT: starts_add(n, '{'); break;
    case JSON_ARRAY: starts_add(n, '['); break;
    case JSON_STRING: starts_add(n, '"'); break;
    case JSON_NUMBER:
    case JSON_INTEGER:
        starts_add(n, '-');
        for (unsigned c = '0'; c <= '9'; c++) starts_add(n, c);
        break;
    case JSON_ANY:
        for (const char *p = "{[\"-0123456789tfn"; *p; p++) starts_add(n, (unsigned char)*p);
        break;
    default: break; /* LITERALS and ANYOF: from their members */
    }
    *out = s->num_nodes++;
    return 0;
}

static int add_literal(fmoe_json_schema *s, const char *text, size_t len, int32_t *out) {
    FMOE_RETURN_ERROR_IF(len == 0 || len > (1u << 20), FMOE_EINVAL, "a literal of %zu bytes", len);
    while ((size_t)s->pool_len + len > (size_t)s->pool_cap) {
        int32_t ncap = s->pool_cap ? 2 * s->pool_cap : 256;
        char *g = realloc(s->pool, (size_t)ncap);
        if (!g) return fmoe_error_set(FMOE_ENOMEM, "out of memory compiling a schema");
        s->pool = g;
        s->pool_cap = ncap;
    }
    GROW(s->lits, s->num_lits, s->cap_lits);
    memcpy(s->pool + s->pool_len, text, len);
    s->lits[s->num_lits] = (json_lit){.off = s->pool_len, .len = (int32_t)len};
    s->pool_len += (int32_t)len;
    *out = s->num_lits++;
    return 0;
}

/* A LITERALS node of the given compact JSON texts. */
static int literal_node(fmoe_json_schema *s, const char *const *texts, int32_t n, int32_t *out) {
    int32_t id;
    FMOE_FORWARD_IF_ERROR(new_node(s, JSON_LITERALS, &id));
    s->nodes[id].first = s->num_lits;
    s->nodes[id].count = n;
    for (int32_t i = 0; i < n; i++) {
        int32_t lit;
        FMOE_FORWARD_IF_ERROR(add_literal(s, texts[i], strlen(texts[i]), &lit));
        starts_add(&s->nodes[id], (unsigned char)texts[i][0]);
    }
    *out = id;
    return 0;
}

static int builtins(fmoe_json_schema *s) {
    static const char *const t[] = {"true"}, *const f[] = {"false"}, *const nul[] = {"null"};
    FMOE_FORWARD_IF_ERROR(new_node(s, JSON_ANY, &s->any));
    FMOE_FORWARD_IF_ERROR(new_node(s, JSON_ANY_OBJECT, &s->any_object));
    FMOE_FORWARD_IF_ERROR(new_node(s, JSON_ARRAY, &s->any_array));
    s->nodes[s->any_array].item = s->any;
    FMOE_FORWARD_IF_ERROR(new_node(s, JSON_STRING, &s->string));
    FMOE_FORWARD_IF_ERROR(new_node(s, JSON_NUMBER, &s->number));
    FMOE_FORWARD_IF_ERROR(literal_node(s, t, 1, &s->lit_true));
    FMOE_FORWARD_IF_ERROR(literal_node(s, f, 1, &s->lit_false));
    return literal_node(s, nul, 1, &s->lit_null);
}

static int schema_new(fmoe_json_schema **out) {
    fmoe_json_schema *s = calloc(1, sizeof *s);
    if (!s) return fmoe_error_set(FMOE_ENOMEM, "out of memory compiling a schema");
    atomic_init(&s->refs, 1);
    int rc = builtins(s);
    if (rc < 0) {
        fmoe_json_schema_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

/* ---------------------------------------------------------------------------------- */
/* Compiling                                                                          */
/* ---------------------------------------------------------------------------------- */

/* Where the compiler is: the JSON path of the schema node being compiled
 * ("$.properties.name.items", "$.properties.home->#/$defs/Address.properties.zip" inside a
 * reference), the document's root (for "$ref") and the references being expanded. */
typedef struct path {
    char buf[256];
    size_t len;
    const cJSON *root;
    const char *refs[JSON_MAX_SCHEMA_DEPTH + 1];
    int num_refs;
} path;

/* Appends "<prefix><name>" (name NULL: "<prefix>[index]"); @return the length to pop to. */
static size_t path_push(path *p, const char *prefix, const char *name, int index) {
    const size_t was = p->len;
    const size_t room = sizeof p->buf - p->len;
    const int n = name ? snprintf(p->buf + p->len, room, "%s%s", prefix, name)
                       : snprintf(p->buf + p->len, room, "%s[%d]", prefix, index);
    if (n > 0) p->len += (size_t)n < room ? (size_t)n : room - 1;
    return was;
}

static void path_pop(path *p, size_t was) {
    p->len = was;
    p->buf[was] = '\0';
}

static const char *const supported_keywords[] = {
    "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
    "enum", "const", "anyOf", "$ref", "minLength", "maxLength", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "oneOf", "allOf", "pattern",
    /* definitions, read through "$ref" */
    "$defs", "definitions"};

/* annotations: they describe, they do not constrain */
static const char *const annotations[] = {
    "title", "description", "$schema", "$id", "$comment", "default", "examples", "deprecated",
    "readOnly", "writeOnly"};

static int in_list(const char *k, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(k, list[i]) == 0) return 1;
    return 0;
}

static int known_keyword(const char *k) {
    return in_list(k, supported_keywords, sizeof supported_keywords / sizeof *supported_keywords) ||
           in_list(k, annotations, sizeof annotations / sizeof *annotations);
}

static int compile(fmoe_json_schema *s, const cJSON *j, path *p, int depth, int32_t *out);

/* Does a value of JSON type name `type` hold v? ("integer": a number with no fraction.) */
static int has_type(const cJSON *v, const char *type) {
    if (!strcmp(type, "object")) return cJSON_IsObject(v);
    if (!strcmp(type, "array")) return cJSON_IsArray(v);
    if (!strcmp(type, "string")) return cJSON_IsString(v);
    if (!strcmp(type, "number")) return cJSON_IsNumber(v);
    if (!strcmp(type, "integer"))
        return cJSON_IsNumber(v) && v->valuedouble == (double)(long long)v->valuedouble;
    if (!strcmp(type, "boolean")) return cJSON_IsBool(v);
    if (!strcmp(type, "null")) return cJSON_IsNull(v);
    return 0;
}

static int valid_type_name(const char *t) {
    static const char *const names[] = {"object", "array", "string", "number", "integer",
                                        "boolean", "null"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!strcmp(t, names[i])) return 1;
    return 0;
}

/* enum / const: the values (filtered by `type` when the schema has one) as literals. */
static int compile_literals(fmoe_json_schema *s, const cJSON *j, path *p, int32_t *out) {
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(j, "enum");
    const cJSON *co = cJSON_GetObjectItemCaseSensitive(j, "const");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
    FMOE_RETURN_ERROR_IF(en && co, FMOE_EUNSUPPORTED,
                         "'enum' together with 'const' at %s is not supported", p->buf);
    FMOE_RETURN_ERROR_IF(en && (!cJSON_IsArray(en) || !en->child), FMOE_EINVAL,
                         "'enum' at %s must be a non-empty array", p->buf);
    const char *texts[JSON_MAX_ALTS];
    char *owned[JSON_MAX_ALTS];
    int32_t n = 0;
    int rc = 0;
    const cJSON *v = en ? en->child : co;
    for (; v; v = en ? v->next : NULL) {
        int keep = 1;
        if (cJSON_IsString(type)) keep = has_type(v, type->valuestring);
        if (cJSON_IsArray(type)) {
            keep = 0;
            for (const cJSON *t = type->child; t; t = t->next)
                keep |= cJSON_IsString(t) && has_type(v, t->valuestring);
        }
        if (!keep) continue;
        if (n == JSON_MAX_ALTS) {
            rc = fmoe_error_set(FMOE_EUNSUPPORTED, "'enum' at %s has more than %d values",
                                p->buf, JSON_MAX_ALTS);
            goto done;
        }
        char *t = cJSON_PrintUnformatted(v);
        if (!t) {
            rc = fmoe_error_set(FMOE_ENOMEM, "out of memory compiling a schema");
            goto done;
        }
        for (int32_t k = 0; k < n; k++)
            if (!strcmp(texts[k], t)) { /* a duplicate value: one literal is enough */
                free(t);
                t = NULL;
                break;
            }
        if (!t) continue;
        owned[n] = t;
        texts[n++] = t;
    }
    if (n == 0) {
        rc = fmoe_error_set(FMOE_EINVAL, "'%s' at %s has no value of the schema's 'type'",
                            en ? "enum" : "const", p->buf);
        goto done;
    }
    rc = literal_node(s, texts, n, out);
done:
    for (int32_t k = 0; k < n; k++) free(owned[k]);
    return rc;
}

static int get_count(const cJSON *j, const char *name, path *p, int32_t *out) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(j, name);
    if (!f) return 0;
    FMOE_RETURN_ERROR_IF(!cJSON_IsNumber(f) || f->valuedouble < 0 || f->valuedouble > 1e6 ||
                             f->valuedouble != (double)(int32_t)f->valuedouble,
                         FMOE_EINVAL, "'%s' at %s must be an integer in [0, 1000000]", name,
                         p->buf);
    *out = (int32_t)f->valuedouble;
    return 1;
}

static int compile_object(fmoe_json_schema *s, const cJSON *j, path *p, int depth,
                          int32_t *out) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(j, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(j, "required");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(j, "additionalProperties");
    FMOE_RETURN_ERROR_IF(props && !cJSON_IsObject(props), FMOE_EINVAL,
                         "'properties' at %s must be an object", p->buf);
    FMOE_RETURN_ERROR_IF(req && !cJSON_IsArray(req), FMOE_EINVAL,
                         "'required' at %s must be an array of strings", p->buf);
    FMOE_RETURN_ERROR_IF(add && !cJSON_IsBool(add) && !(cJSON_IsObject(add) && !add->child),
                         FMOE_EUNSUPPORTED,
                         "'additionalProperties' at %s is not supported unless true or false",
                         p->buf);
    if (!props && !cJSON_IsFalse(add)) {
        FMOE_RETURN_ERROR_IF(req && req->child, FMOE_EINVAL,
                             "'required' at %s names properties the schema does not list",
                             p->buf);
        *out = s->any_object;
        return 0;
    }
    int32_t count = cJSON_GetArraySize(props);
    FMOE_RETURN_ERROR_IF(count > JSON_MAX_ALTS, FMOE_EUNSUPPORTED,
                         "'properties' at %s has more than %d properties", p->buf,
                         JSON_MAX_ALTS);
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next) {
        FMOE_RETURN_ERROR_IF(!cJSON_IsString(r), FMOE_EINVAL,
                             "'required' at %s must be an array of strings", p->buf);
        FMOE_RETURN_ERROR_IF(!cJSON_GetObjectItemCaseSensitive(props, r->valuestring),
                             FMOE_EINVAL, "'required' at %s names '%s', not in 'properties'",
                             p->buf, r->valuestring);
    }
    /* Children first (they append props of their own), then this object's props. */
    json_prop tmp[JSON_MAX_ALTS];
    int32_t i = 0;
    for (const cJSON *pr = props ? props->child : NULL; pr; pr = pr->next, i++) {
        for (const cJSON *q = props->child; q != pr; q = q->next)
            FMOE_RETURN_ERROR_IF(!strcmp(q->string, pr->string), FMOE_EINVAL,
                                 "'properties' at %s lists '%s' twice", p->buf, pr->string);
        const size_t was = path_push(p, ".properties.", pr->string, 0);
        int32_t value;
        int rc = compile(s, pr, p, depth + 1, &value);
        path_pop(p, was);
        if (rc < 0) return rc;
        cJSON *name = cJSON_CreateString(pr->string);
        char *key = name ? cJSON_PrintUnformatted(name) : NULL;
        cJSON_Delete(name);
        if (!key) return fmoe_error_set(FMOE_ENOMEM, "out of memory compiling a schema");
        int32_t lit;
        rc = add_literal(s, key, strlen(key), &lit);
        free(key);
        if (rc < 0) return rc;
        int required = 0;
        for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
            required |= !strcmp(r->valuestring, pr->string);
        tmp[i] = (json_prop){.key = lit, .value = value, .required = required};
    }
    int32_t id;
    FMOE_FORWARD_IF_ERROR(new_node(s, JSON_OBJECT, &id));
    s->nodes[id].first = s->num_props;
    s->nodes[id].count = count;
    for (i = 0; i < count; i++) {
        GROW(s->props, s->num_props, s->cap_props);
        s->props[s->num_props++] = tmp[i];
    }
    *out = id;
    return 0;
}

static int compile_array(fmoe_json_schema *s, const cJSON *j, path *p, int depth, int32_t *out) {
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(j, "items");
    int32_t item = s->any, lo = 0, hi = -1;
    if (items) {
        const size_t was = path_push(p, ".items", "", 0);
        int rc = compile(s, items, p, depth + 1, &item);
        path_pop(p, was);
        if (rc < 0) return rc;
    }
    int rc = get_count(j, "minItems", p, &lo);
    if (rc < 0) return rc;
    if ((rc = get_count(j, "maxItems", p, &hi)) < 0) return rc;
    FMOE_RETURN_ERROR_IF(hi >= 0 && hi < lo, FMOE_EINVAL, "'maxItems' %d < 'minItems' %d at %s",
                         hi, lo, p->buf);
    if (item == s->any && lo == 0 && hi < 0) {
        *out = s->any_array;
        return 0;
    }
    int32_t id;
    FMOE_FORWARD_IF_ERROR(new_node(s, JSON_ARRAY, &id));
    s->nodes[id].item = item;
    s->nodes[id].min_items = lo;
    s->nodes[id].max_items = hi;
    *out = id;
    return 0;
}

/* The integers the bounds allow, [*lo, *hi] (JSON Schema 2020-12 validation §6.2: minimum
 * and maximum inclusive, exclusiveMinimum and exclusiveMaximum numbers, not draft 4's
 * booleans), clamped to the integers the automaton writes (15 digits). @return 1 when
 * some bound is given, 0 when none, or an error. */
#define INT_LIMIT 999999999999999.0 /* NUM_MAX_INT_DIGITS nines */
static int integer_bounds(const cJSON *j, path *p, int64_t *lo, int64_t *hi) {
    static const char *const keys[] = {"minimum", "exclusiveMinimum", "maximum",
                                       "exclusiveMaximum"};
    double l = -INT_LIMIT, h = INT_LIMIT;
    int any = 0;
    for (int k = 0; k < 4; k++) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(j, keys[k]);
        if (!f) continue;
        FMOE_RETURN_ERROR_IF(!cJSON_IsNumber(f), FMOE_EINVAL, "'%s' at %s must be a number",
                             keys[k], p->buf);
        const double v = f->valuedouble;
        any = 1;
        /* the smallest / largest integer the bound admits */
        double b = k == 0 ? ceil(v) : k == 1 ? floor(v) + 1 : k == 2 ? floor(v) : ceil(v) - 1;
        if (k < 2 && b > l) l = b;
        if (k >= 2 && b < h) h = b;
    }
    FMOE_RETURN_ERROR_IF(l > h, FMOE_EINVAL,
                         "the bounds at %s admit no integer of at most 15 digits", p->buf);
    *lo = (int64_t)l;
    *hi = (int64_t)h;
    return any;
}

static int compile_type(fmoe_json_schema *s, const cJSON *j, const char *type, path *p,
                        int depth, int32_t *out) {
    static const char *const bounds[] = {"minimum", "maximum", "exclusiveMinimum",
                                         "exclusiveMaximum"};
    if (!strcmp(type, "object")) return compile_object(s, j, p, depth, out);
    if (!strcmp(type, "array")) return compile_array(s, j, p, depth, out);
    if (!strcmp(type, "string")) {
        int32_t lo = 0, hi = -1;
        const int has_lo = get_count(j, "minLength", p, &lo);
        const int has_hi = has_lo < 0 ? has_lo : get_count(j, "maxLength", p, &hi);
        if (has_lo < 0 || has_hi < 0) return has_lo < 0 ? has_lo : has_hi;
        FMOE_RETURN_ERROR_IF(has_hi && lo > hi, FMOE_EINVAL,
                             "'minLength' at %s is above 'maxLength'", p->buf);
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(j, "pattern");
        if (pat) {
            FMOE_RETURN_ERROR_IF(!cJSON_IsString(pat), FMOE_EINVAL,
                                 "'pattern' at %s must be a string", p->buf);
            FMOE_RETURN_ERROR_IF(has_lo || has_hi, FMOE_EUNSUPPORTED,
                                 "'pattern' together with 'minLength' or 'maxLength' at %s "
                                 "is not supported", p->buf);
            GROW(s->regexes, s->num_regexes, s->cap_regexes);
            FMOE_FORWARD_IF_ERROR(fmoe__json_regex_compile(
                pat->valuestring, strlen(pat->valuestring), p->buf, &s->regexes[s->num_regexes]));
            FMOE_FORWARD_IF_ERROR(new_node(s, JSON_STRING, out));
            s->nodes[*out].pattern = s->num_regexes++;
            return 0;
        }
        if (!has_lo && !has_hi) {
            *out = s->string;
            return 0;
        }
        FMOE_FORWARD_IF_ERROR(new_node(s, JSON_STRING, out));
        s->nodes[*out].min_items = lo;
        s->nodes[*out].max_items = has_hi ? hi : -1;
        return 0;
    }
    if (!strcmp(type, "number")) {
        for (int k = 0; k < 4; k++)
            FMOE_RETURN_ERROR_IF(cJSON_GetObjectItemCaseSensitive(j, bounds[k]),
                                 FMOE_EUNSUPPORTED,
                                 "'%s' at %s is not supported on a number (only on an "
                                 "integer)", bounds[k], p->buf);
        *out = s->number;
    } else if (!strcmp(type, "integer")) {
        int64_t lo = 0, hi = 0;
        const int b = integer_bounds(j, p, &lo, &hi);
        if (b < 0) return b;
        FMOE_FORWARD_IF_ERROR(new_node(s, JSON_INTEGER, out));
        json_node *n = &s->nodes[*out];
        n->bounded = b;
        n->lo = lo;
        n->hi = hi;
        if (b && lo > 0) n->starts[0] &= ~(1ull << '-'); /* "-" leads to no allowed value */
        return 0;
    }
    else if (!strcmp(type, "boolean")) {
        static const char *const tf[] = {"true", "false"};
        return literal_node(s, tf, 2, out);
    } else if (!strcmp(type, "null")) *out = s->lit_null;
    else return fmoe_error_set(FMOE_EINVAL, "'type' at %s: unknown type '%s'", p->buf, type);
    return 0;
}

/* The literal of an OBJECT node's first property's value when that property is
 * required and its value a single string const; else -1. */
static int32_t tag_of(const fmoe_json_schema *s, int32_t node) {
    const json_node *n = &s->nodes[node];
    if (n->kind != JSON_OBJECT || n->count == 0 || !s->props[n->first].required) return -1;
    const json_node *v = &s->nodes[s->props[n->first].value];
    if (v->kind != JSON_LITERALS || v->count != 1 || s->pool[s->lits[v->first].off] != '"')
        return -1;
    return v->first;
}

static int same_lit(const fmoe_json_schema *s, int32_t a, int32_t b) {
    return s->lits[a].len == s->lits[b].len &&
           !memcmp(s->pool + s->lits[a].off, s->pool + s->lits[b].off, (size_t)s->lits[a].len);
}

/* The object branches of an anyOf (br[n]) joined into one TAGGED node, which replaces
 * the first of them in br (*n shrinks), when there are several and each begins with the
 * same required key whose value is a string const of its own: the value written there
 * then names the branch, and the automaton stays deterministic. Anything else is left as
 * it was (anyof_node refuses two branches that both start with '{'). */
static int join_tagged(fmoe_json_schema *s, int32_t *br, int32_t *n) {
    int32_t objs[JSON_MAX_ALTS], k = 0;
    for (int32_t i = 0; i < *n; i++)
        if (s->nodes[br[i]].kind == JSON_OBJECT) objs[k++] = i;
    if (k < 2) return 0;
    for (int32_t i = 0; i < k; i++) {
        const int32_t t = tag_of(s, br[objs[i]]);
        if (t < 0) return 0;
        const json_node *o = &s->nodes[br[objs[i]]], *o0 = &s->nodes[br[objs[0]]];
        if (!same_lit(s, s->props[o->first].key, s->props[o0->first].key)) return 0;
        for (int32_t j = 0; j < i; j++)
            if (same_lit(s, t, tag_of(s, br[objs[j]]))) return 0;
    }
    int32_t lits, id;
    FMOE_FORWARD_IF_ERROR(new_node(s, JSON_LITERALS, &lits));
    s->nodes[lits].first = s->num_lits;
    s->nodes[lits].count = k;
    starts_add(&s->nodes[lits], '"');
    for (int32_t i = 0; i < k; i++) { /* consecutive copies: a node's literals are a range */
        GROW(s->lits, s->num_lits, s->cap_lits);
        s->lits[s->num_lits] = s->lits[tag_of(s, br[objs[i]])];
        s->num_lits++;
    }
    FMOE_FORWARD_IF_ERROR(new_node(s, JSON_TAGGED, &id));
    s->nodes[id].item = lits;
    s->nodes[id].first = s->num_branches;
    s->nodes[id].count = k;
    starts_add(&s->nodes[id], '{');
    for (int32_t i = 0; i < k; i++) {
        GROW(s->branches, s->num_branches, s->cap_branches);
        s->branches[s->num_branches++] = br[objs[i]];
    }
    /* br without the joined objects, the TAGGED node where the first one was */
    int32_t m = 0;
    for (int32_t i = 0, j = 0; i < *n; i++) {
        if (j < k && objs[j] == i) {
            if (j++ == 0) br[m++] = id;
            continue;
        }
        br[m++] = br[i];
    }
    *n = m;
    return 0;
}

/* An ANYOF node of branches[n]; refused when two branches may start with the same byte
 * (object branches are first joined as a tagged union when they can be). */
static int anyof_node(fmoe_json_schema *s, int32_t *br, int32_t n, path *p,
                      const char *keyword, int32_t *out) {
    FMOE_FORWARD_IF_ERROR(join_tagged(s, br, &n));
    if (n == 1) {
        *out = br[0];
        return 0;
    }
    for (int32_t a = 0; a < n; a++)
        for (int32_t b = a + 1; b < n; b++)
            for (int w = 0; w < 4; w++) {
                const uint64_t both = s->nodes[br[a]].starts[w] & s->nodes[br[b]].starts[w];
                if (!both) continue;
                const int c = w * 64 + __builtin_ctzll(both);
                return fmoe_error_set(FMOE_EUNSUPPORTED,
                                      "'%s' at %s: branches %d and %d both start with '%c'; "
                                      "only branches of different first bytes are supported",
                                      keyword, p->buf, a, b, c);
            }
    int32_t id;
    FMOE_FORWARD_IF_ERROR(new_node(s, JSON_ANYOF, &id));
    s->nodes[id].first = s->num_branches;
    s->nodes[id].count = n;
    for (int32_t i = 0; i < n; i++) {
        GROW(s->branches, s->num_branches, s->cap_branches);
        s->branches[s->num_branches++] = br[i];
        for (int w = 0; w < 4; w++) s->nodes[id].starts[w] |= s->nodes[br[i]].starts[w];
    }
    *out = id;
    return 0;
}

/* "$ref": "#/$defs/NAME" (or "#/definitions/NAME") of the document's root, expanded in
 * place, as pydantic's nested models are written. Beside it only annotations (and
 * definitions) may stand; a reference to itself, directly or through others, is refused:
 * the automaton has no recursion. */
static int compile_ref(fmoe_json_schema *s, const cJSON *j, const cJSON *ref, path *p, int depth,
                       int32_t *out) {
    for (const cJSON *k = j->child; k; k = k->next)
        FMOE_RETURN_ERROR_IF(strcmp(k->string, "$ref") && strcmp(k->string, "$defs") &&
                                 strcmp(k->string, "definitions") &&
                                 !in_list(k->string, annotations,
                                          sizeof annotations / sizeof *annotations),
                             FMOE_EUNSUPPORTED, "'%s' beside '$ref' at %s is not supported",
                             k->string, p->buf);
    FMOE_RETURN_ERROR_IF(!cJSON_IsString(ref), FMOE_EINVAL, "'$ref' at %s must be a string",
                         p->buf);
    const char *r = ref->valuestring, *name = NULL, *where = NULL;
    if (!strncmp(r, "#/$defs/", 8)) name = r + 8, where = "$defs";
    else if (!strncmp(r, "#/definitions/", 14)) name = r + 14, where = "definitions";
    FMOE_RETURN_ERROR_IF(!name || !*name || strchr(name, '/') || strchr(name, '~'),
                         FMOE_EUNSUPPORTED,
                         "'$ref' at %s: \"%.64s\" is not supported (only \"#/$defs/NAME\" and "
                         "\"#/definitions/NAME\")", p->buf, r);
    const cJSON *defs = cJSON_GetObjectItemCaseSensitive(p->root, where);
    const cJSON *target = cJSON_IsObject(defs) ? cJSON_GetObjectItemCaseSensitive(defs, name)
                                               : NULL;
    FMOE_RETURN_ERROR_IF(!target, FMOE_EINVAL, "'$ref' at %s: \"%.64s\" is not defined", p->buf,
                         r);
    for (int i = 0; i < p->num_refs; i++)
        FMOE_RETURN_ERROR_IF(!strcmp(p->refs[i], r), FMOE_EUNSUPPORTED,
                             "'$ref' at %s: \"%.64s\" refers to itself; recursive schemas are "
                             "not supported", p->buf, r);
    FMOE_RETURN_ERROR_IF(p->num_refs > JSON_MAX_SCHEMA_DEPTH, FMOE_EUNSUPPORTED,
                         "'$ref' at %s: references nest deeper than %d", p->buf,
                         JSON_MAX_SCHEMA_DEPTH);
    p->refs[p->num_refs++] = r;
    const size_t was = path_push(p, "->", r, 0);
    const int rc = compile(s, target, p, depth + 1, out);
    path_pop(p, was);
    p->num_refs--;
    return rc;
}

static int compile(fmoe_json_schema *s, const cJSON *j, path *p, int depth, int32_t *out) {
    FMOE_RETURN_ERROR_IF(depth > JSON_MAX_SCHEMA_DEPTH, FMOE_EUNSUPPORTED,
                         "the schema at %s nests deeper than %d levels", p->buf,
                         JSON_MAX_SCHEMA_DEPTH);
    if (cJSON_IsTrue(j)) {
        *out = s->any;
        return 0;
    }
    FMOE_RETURN_ERROR_IF(!cJSON_IsObject(j), FMOE_EINVAL, "the schema at %s must be an object",
                         p->buf);
    for (const cJSON *k = j->child; k; k = k->next)
        FMOE_RETURN_ERROR_IF(!known_keyword(k->string), FMOE_EUNSUPPORTED,
                             "'%s' at %s is not supported", k->string, p->buf);
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(j, "$ref");
    if (ref) return compile_ref(s, j, ref, p, depth, out);
    /* allOf of one schema is that schema (pydantic writes a $ref so, with annotations) */
    const cJSON *allof = cJSON_GetObjectItemCaseSensitive(j, "allOf");
    if (allof) {
        FMOE_RETURN_ERROR_IF(!cJSON_IsArray(allof) || !allof->child || allof->child->next,
                             FMOE_EUNSUPPORTED,
                             "'allOf' at %s is supported only with one schema", p->buf);
        for (const cJSON *k = j->child; k; k = k->next)
            FMOE_RETURN_ERROR_IF(strcmp(k->string, "allOf") && strcmp(k->string, "$defs") &&
                                     strcmp(k->string, "definitions") &&
                                     !in_list(k->string, annotations,
                                              sizeof annotations / sizeof *annotations),
                                 FMOE_EUNSUPPORTED, "'%s' beside 'allOf' at %s is not supported",
                                 k->string, p->buf);
        const size_t was = path_push(p, ".allOf", NULL, 0);
        const int rc = compile(s, allof->child, p, depth + 1, out);
        path_pop(p, was);
        return rc;
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
    /* oneOf is anyOf when no document can match two branches: here, when the branches
     * start with different bytes (anyof_node refuses the others, naming oneOf) */
    const cJSON *oneof = cJSON_GetObjectItemCaseSensitive(j, "oneOf");
    const cJSON *anyof = cJSON_GetObjectItemCaseSensitive(j, "anyOf");
    const char *anyof_name = "anyOf";
    if (oneof) {
        FMOE_RETURN_ERROR_IF(anyof, FMOE_EUNSUPPORTED,
                             "'oneOf' together with 'anyOf' at %s is not supported", p->buf);
        anyof = oneof;
        anyof_name = "oneOf";
    }
    if (type) {
        FMOE_RETURN_ERROR_IF(!cJSON_IsString(type) && !(cJSON_IsArray(type) && type->child),
                             FMOE_EINVAL,
                             "'type' at %s must be a string or a non-empty array of strings",
                             p->buf);
        for (const cJSON *t = cJSON_IsArray(type) ? type->child : type; t;
             t = cJSON_IsArray(type) ? t->next : NULL)
            FMOE_RETURN_ERROR_IF(!cJSON_IsString(t) || !valid_type_name(t->valuestring),
                                 FMOE_EINVAL, "'type' at %s: unknown type", p->buf);
    }
    if (cJSON_GetObjectItemCaseSensitive(j, "enum") || cJSON_GetObjectItemCaseSensitive(j, "const")) {
        FMOE_RETURN_ERROR_IF(anyof, FMOE_EUNSUPPORTED,
                             "'%s' together with 'enum' or 'const' at %s is not supported",
                             anyof_name, p->buf);
        return compile_literals(s, j, p, out);
    }
    if (anyof) {
        FMOE_RETURN_ERROR_IF(type, FMOE_EUNSUPPORTED,
                             "'%s' together with 'type' at %s is not supported", anyof_name,
                             p->buf);
        FMOE_RETURN_ERROR_IF(!cJSON_IsArray(anyof) || !anyof->child, FMOE_EINVAL,
                             "'%s' at %s must be a non-empty array", anyof_name, p->buf);
        int32_t br[JSON_MAX_ALTS], n = 0;
        for (const cJSON *b = anyof->child; b; b = b->next, n++) {
            FMOE_RETURN_ERROR_IF(n == JSON_MAX_ALTS, FMOE_EUNSUPPORTED,
                                 "'%s' at %s has more than %d branches", anyof_name, p->buf,
                                 JSON_MAX_ALTS);
            const size_t was = path_push(p, oneof ? ".oneOf" : ".anyOf", NULL, n);
            int rc = compile(s, b, p, depth + 1, &br[n]);
            path_pop(p, was);
            if (rc < 0) return rc;
        }
        if (n == 1) {
            *out = br[0];
            return 0;
        }
        return anyof_node(s, br, n, p, anyof_name, out);
    }
    if (cJSON_IsString(type)) return compile_type(s, j, type->valuestring, p, depth, out);
    if (cJSON_IsArray(type)) {
        int32_t br[8], n = 0;
        for (const cJSON *t = type->child; t && n < 8; t = t->next)
            FMOE_FORWARD_IF_ERROR(compile_type(s, j, t->valuestring, p, depth, &br[n++]));
        if (n == 1) {
            *out = br[0];
            return 0;
        }
        return anyof_node(s, br, n, p, "type", out);
    }
    /* No type: what its keywords imply, else any value. A length or a bound without a
     * type would apply to only some of the values "any" writes: refused. */
    static const char *const typed[] = {"minLength", "maxLength", "minimum", "maximum",
                                        "exclusiveMinimum", "exclusiveMaximum", "pattern"};
    for (int k = 0; k < 7; k++)
        FMOE_RETURN_ERROR_IF(cJSON_GetObjectItemCaseSensitive(j, typed[k]), FMOE_EUNSUPPORTED,
                             "'%s' at %s is supported only beside 'type'", typed[k], p->buf);
    if (cJSON_GetObjectItemCaseSensitive(j, "properties") ||
        cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "additionalProperties")))
        return compile_object(s, j, p, depth, out);
    if (cJSON_GetObjectItemCaseSensitive(j, "items")) return compile_array(s, j, p, depth, out);
    *out = s->any;
    return 0;
}

/* ---------------------------------------------------------------------------------- */
/* Public                                                                             */
/* ---------------------------------------------------------------------------------- */

int fmoe_json_schema_compile(const char *text, size_t len, fmoe_json_schema **out) {
    if (!text || !out) return fmoe_error_set(FMOE_EINVAL, "schema text or output is NULL");
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root) return fmoe_error_set(FMOE_EINVAL, "the schema is not valid JSON");
    fmoe_json_schema *s = NULL;
    int rc = schema_new(&s);
    if (rc == 0) {
        path p = {.buf = "$", .len = 1, .root = root};
        rc = compile(s, root, &p, 0, &s->root);
    }
    cJSON_Delete(root);
    if (rc < 0) {
        fmoe_json_schema_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

int fmoe_json_schema_any_object(fmoe_json_schema **out) {
    fmoe_json_schema *s = NULL;
    FMOE_FORWARD_IF_ERROR(schema_new(&s));
    s->root = s->any_object;
    *out = s;
    return 0;
}

fmoe_json_schema *fmoe_json_schema_retain(fmoe_json_schema *s) {
    if (s) atomic_fetch_add(&s->refs, 1);
    return s;
}

void fmoe_json_schema_free(fmoe_json_schema *s) {
    if (!s || atomic_fetch_sub(&s->refs, 1) > 1) return;
    free(s->nodes);
    free(s->props);
    free(s->lits);
    free(s->branches);
    free(s->pool);
    free(s->regexes);
    free(s);
}
