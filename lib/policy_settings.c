/*
 * policy_settings.c - each policy's own settings (fmoe/policy.h, "settings"): the KEY=VALUE
 * list a user gives, checked against the table the policy declares, and read back by the
 * policy at init.
 *
 * Why strings until init: one --policy-opt list serves every policy of a sweep, and only
 * the policy's table says what a key's value must be, so the values are parsed where the
 * table is known (check, then the policy's reads), never by the commands. A value is parsed
 * twice (check, read): at init only, a few rows.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/policy.h"

static int key_ok(const char *key) {
    if (!key || !*key || strlen(key) >= FMOE_POLICY_SETTING_KEY) return 0;
    for (const char *c = key; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_')) return 0;
    return 1;
}

int fmoe_policy_settings_set(fmoe_policy_settings *s, const char *key, const char *value) {
    FMOE_RETURN_ERROR_IF(!key_ok(key), FMOE_EINVAL,
                         "setting '%s': a key is 1 to %d characters of a-z, 0-9 and _",
                         key ? key : "", FMOE_POLICY_SETTING_KEY - 1);
    FMOE_RETURN_ERROR_IF(!value || !*value || strlen(value) >= FMOE_POLICY_SETTING_VALUE,
                         FMOE_EINVAL, "setting %s: a value is 1 to %d characters, got '%s'",
                         key, FMOE_POLICY_SETTING_VALUE - 1, value ? value : "");
    int32_t i = 0;
    while (i < s->n && strcmp(s->item[i].key, key) != 0) i++;
    FMOE_RETURN_ERROR_IF(i == FMOE_POLICY_MAX_SETTINGS, FMOE_EINVAL,
                         "setting %s: at most %d settings", key, FMOE_POLICY_MAX_SETTINGS);
    snprintf(s->item[i].key, sizeof s->item[i].key, "%s", key);
    snprintf(s->item[i].value, sizeof s->item[i].value, "%s", value);
    if (i == s->n) s->n++;
    return 0;
}

int fmoe_policy_settings_parse(fmoe_policy_settings *s, const char *key_value) {
    const char *eq = key_value ? strchr(key_value, '=') : NULL;
    FMOE_RETURN_ERROR_IF(!eq || eq == key_value, FMOE_EINVAL, "'%s' is not KEY=VALUE",
                         key_value ? key_value : "");
    char key[FMOE_POLICY_SETTING_KEY];
    const size_t n = (size_t)(eq - key_value);
    FMOE_RETURN_ERROR_IF(n >= sizeof key, FMOE_EINVAL,
                         "'%s': a key is at most %d characters", key_value,
                         FMOE_POLICY_SETTING_KEY - 1);
    memcpy(key, key_value, n);
    key[n] = '\0';
    return fmoe_policy_settings_set(s, key, eq + 1);
}

const char *fmoe_policy_settings_get(const fmoe_policy_settings *s, const char *key) {
    for (int32_t i = 0; s && key && i < s->n; i++)
        if (strcmp(s->item[i].key, key) == 0) return s->item[i].value;
    return NULL;
}

const fmoe_policy_setting *fmoe_policy_setting_find(const fmoe_policy_ops *ops,
                                                    const char *key) {
    for (const fmoe_policy_setting *r = ops ? ops->settings : NULL; r && r->name && key; r++)
        if (strcmp(r->name, key) == 0) return r;
    return NULL;
}

/* "a, b or c" */
const fmoe_policy_setting *fmoe_policy_setting_of_option(const char *option) {
    const fmoe_policy_ops *const *all;
    const size_t n = fmoe_policy_registry(&all);
    for (size_t i = 0; option && i < n; i++)
        for (const fmoe_policy_setting *r = all[i]->settings; r && r->name; r++)
            if (r->option && strcmp(r->option, option) == 0) return r;
    return NULL;
}

static void choice_list(const char *const *choices, char *buf, size_t cap) {
    size_t at = 0, n = 0;
    while (choices[n]) n++;
    buf[0] = '\0';
    for (size_t i = 0; i < n && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%s", i == 0 ? "" : i + 1 == n ? " or " : ", ",
                               choices[i]);
}

int fmoe_policy_setting_parse_value(const fmoe_policy_setting *row, const char *text,
                                    double *out) {
    if (row->type == FMOE_SETTING_CHOICE) {
        for (int32_t i = 0; row->choices[i]; i++)
            if (strcmp(row->choices[i], text) == 0) {
                *out = i;
                return 0;
            }
        char list[256];
        choice_list(row->choices, list, sizeof list);
        return fmoe_error_set(FMOE_EINVAL, "%s=%s: expected %s", row->name, text, list);
    }
    const int is_int = row->type == FMOE_SETTING_INT;
    errno = 0;
    char *end = NULL;
    double v;
    if (is_int) {
        const long long i = strtoll(text, &end, 10);
        v = (double)i;
    } else {
        v = strtod(text, &end);
    }
    const int parsed = end != text && *end == '\0' && errno == 0 && isfinite(v);
    if (!parsed || v < row->min || v > row->max) {
        if (is_int)
            return fmoe_error_set(FMOE_EINVAL, "%s=%s: expected an integer in [%.0f, %.0f]",
                                  row->name, text, row->min, row->max);
        return fmoe_error_set(FMOE_EINVAL, "%s=%s: expected a number in [%g, %g]", row->name,
                              text, row->min, row->max);
    }
    *out = v;
    return 0;
}

/* "eamc_capacity, foo" or "" */
static void key_list(const fmoe_policy_ops *ops, char *buf, size_t cap) {
    size_t at = 0;
    buf[0] = '\0';
    for (const fmoe_policy_setting *r = ops->settings; r && r->name && at < cap; r++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%s", r == ops->settings ? "" : ", ",
                               r->name);
}

int fmoe_policy_settings_check(const fmoe_policy_ops *ops, const fmoe_policy_settings *s) {
    for (int32_t i = 0; s && i < s->n; i++) {
        const fmoe_policy_setting *row = fmoe_policy_setting_find(ops, s->item[i].key);
        if (!row) {
            char keys[512];
            key_list(ops, keys, sizeof keys);
            return fmoe_error_set(FMOE_EINVAL, "policy %s has no setting '%s' (%s%s)", ops->name,
                                  s->item[i].key, keys[0] ? "its settings: " : "it has none",
                                  keys);
        }
        double v;
        if (fmoe_policy_setting_parse_value(row, s->item[i].value, &v) < 0) {
            fmoe_error_prefix("policy %s", ops->name);
            return FMOE_EINVAL;
        }
    }
    return 0;
}

void fmoe_policy_settings_select(fmoe_policy_settings *out, const fmoe_policy_ops *ops,
                                 const fmoe_policy_settings *all) {
    memset(out, 0, sizeof *out);
    for (int32_t i = 0; all && i < all->n; i++)
        if (fmoe_policy_setting_find(ops, all->item[i].key)) out->item[out->n++] = all->item[i];
}

/* A command-line option's name: [a-z0-9-], starting with a letter. */
static int option_ok(const char *option) {
    if (!(*option >= 'a' && *option <= 'z')) return 0;
    for (const char *c = option; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '-')) return 0;
    return 1;
}

int fmoe_policy_settings_table_check(const fmoe_policy_ops *ops) {
    int32_t n = 0;
    for (const fmoe_policy_setting *r = ops->settings; r && r->name; r++, n++) {
        FMOE_RETURN_ERROR_IF(!key_ok(r->name), FMOE_EINVAL, "policy %s: setting '%s' is not a key",
                             ops->name, r->name);
        for (const fmoe_policy_setting *q = ops->settings; q != r; q++)
            FMOE_RETURN_ERROR_IF(strcmp(q->name, r->name) == 0, FMOE_EINVAL,
                                 "policy %s: setting %s declared twice", ops->name, r->name);
        FMOE_RETURN_ERROR_IF(!r->help || !*r->help, FMOE_EINVAL,
                             "policy %s: setting %s has no help line", ops->name, r->name);
        FMOE_RETURN_ERROR_IF(r->option && !option_ok(r->option), FMOE_EINVAL,
                             "policy %s: setting %s's option '%s' is not of [a-z0-9-]",
                             ops->name, r->name, r->option);
        for (const fmoe_policy_setting *q = ops->settings; r->option && q != r; q++)
            FMOE_RETURN_ERROR_IF(q->option && strcmp(q->option, r->option) == 0, FMOE_EINVAL,
                                 "policy %s: settings %s and %s share the option --%s",
                                 ops->name, q->name, r->name, r->option);
        switch (r->type) {
        case FMOE_SETTING_INT:
            FMOE_RETURN_ERROR_IF(r->min != floor(r->min) || r->max != floor(r->max) ||
                                     r->def != floor(r->def),
                                 FMOE_EINVAL, "policy %s: int setting %s has a fraction",
                                 ops->name, r->name);
            /* fall through */
        case FMOE_SETTING_DOUBLE:
            FMOE_RETURN_ERROR_IF(!(r->min <= r->def && r->def <= r->max), FMOE_EINVAL,
                                 "policy %s: setting %s's default %g is outside [%g, %g]",
                                 ops->name, r->name, r->def, r->min, r->max);
            break;
        case FMOE_SETTING_CHOICE: {
            int32_t k = 0;
            while (r->choices && r->choices[k]) k++;
            FMOE_RETURN_ERROR_IF(k == 0 || r->def < 0 || r->def >= k || r->def != floor(r->def),
                                 FMOE_EINVAL,
                                 "policy %s: choice setting %s's default %g is not one of its "
                                 "%d choices",
                                 ops->name, r->name, r->def, k);
            break;
        }
        default:
            return fmoe_error_set(FMOE_EINVAL, "policy %s: setting %s has no type", ops->name,
                                  r->name);
        }
    }
    FMOE_RETURN_ERROR_IF(n > FMOE_POLICY_MAX_SETTINGS, FMOE_EINVAL,
                         "policy %s declares %d settings; at most %d", ops->name, n,
                         FMOE_POLICY_MAX_SETTINGS);
    return 0;
}

/* The value of a declared setting: the given one (checked at init) or the default. */
static double setting_value(const fmoe_policy_config *cfg, const fmoe_policy_setting *table,
                            const char *key, fmoe_policy_setting_type type) {
    const fmoe_policy_setting *row = table;
    while (row && row->name && strcmp(row->name, key) != 0) row++;
    FMOE_ASSERT(row && row->name && row->type == type);
    const char *text = fmoe_policy_settings_get(cfg->settings, key);
    double v = row->def;
    /* fmoe_policy_init_ops checked the value; a policy initialised without it (a test
     * calling ops->init directly) gets the default for a bad one */
    if (text && fmoe_policy_setting_parse_value(row, text, &v) < 0) v = row->def;
    return v;
}

int64_t fmoe_policy_setting_int(const fmoe_policy_config *cfg, const fmoe_policy_setting *table,
                                const char *key) {
    return (int64_t)setting_value(cfg, table, key, FMOE_SETTING_INT);
}

double fmoe_policy_setting_double(const fmoe_policy_config *cfg,
                                  const fmoe_policy_setting *table, const char *key) {
    return setting_value(cfg, table, key, FMOE_SETTING_DOUBLE);
}

int32_t fmoe_policy_setting_choice(const fmoe_policy_config *cfg,
                                   const fmoe_policy_setting *table, const char *key) {
    return (int32_t)setting_value(cfg, table, key, FMOE_SETTING_CHOICE);
}

void fmoe_policy_setting_describe(const fmoe_policy_setting *row, char *buf, size_t cap) {
    if (row->type == FMOE_SETTING_CHOICE) {
        size_t at = 0;
        buf[0] = '\0';
        for (int32_t i = 0; row->choices[i] && at < cap; i++)
            at += (size_t)snprintf(buf + at, cap - at, "%s%s", i ? "|" : "", row->choices[i]);
        if (at < cap)
            snprintf(buf + at, cap - at, ", default %s", row->choices[(int32_t)row->def]);
    } else if (row->type == FMOE_SETTING_INT) {
        snprintf(buf, cap, "int, default %.0f, in [%.0f, %.0f]", row->def, row->min, row->max);
    } else {
        snprintf(buf, cap, "number, default %g, in [%g, %g]", row->def, row->min, row->max);
    }
}
