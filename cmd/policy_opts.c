/* policy_opts.c - --policy-opt KEY=VALUE and its shorthands (contract in policy_opts.h). */
#include "policy_opts.h"

#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "cmd_common.h"
#include "fmoe/error.h"

int cmd_policy_opts_parse(const char *cmd, const cmd_opt_strings *opts, char *const *policies,
                          int n, fmoe_policy_settings *out) {
    memset(out, 0, sizeof *out);
    for (int32_t i = 0; i < opts->n; i++) {
        const char *item = opts->items[i];
        if (fmoe_policy_settings_parse(out, item) < 0)
            return cmd_usage_error(cmd, "--policy-opt: %s", fmoe_error_detail());
        const char *eq = strchr(item, '=');
        char key[FMOE_POLICY_SETTING_KEY];
        snprintf(key, sizeof key, "%.*s", (int)(eq - item), item);
        int declared = 0;
        for (int p = 0; p < n; p++) {
            const fmoe_policy_ops *ops = fmoe_policy_find(policies[p]);
            const fmoe_policy_setting *row = fmoe_policy_setting_find(ops, key);
            if (!row) continue;
            declared = 1;
            double v;
            if (fmoe_policy_setting_parse_value(row, eq + 1, &v) < 0)
                return cmd_usage_error(cmd, "--policy-opt: policy %s: %s", ops->name,
                                       fmoe_error_detail());
        }
        if (!declared) {
            /* what the policies of the run do declare, to say what would have worked */
            char known[1024];
            size_t at = 0;
            known[0] = '\0';
            for (int p = 0; p < n && at < sizeof known; p++) {
                const fmoe_policy_ops *ops = fmoe_policy_find(policies[p]);
                for (const fmoe_policy_setting *r = ops->settings; r && r->name; r++)
                    if (at < sizeof known)
                        at += (size_t)snprintf(known + at, sizeof known - at, "%s%s %s",
                                               at ? "; " : "", ops->name, r->name);
            }
            return cmd_usage_error(cmd,
                                   "--policy-opt %s: no policy of the run has a setting '%s' "
                                   "(%s%s; fmoe simulate --list-policies lists them all)",
                                   item, key, known[0] ? "theirs: " : "they have none",
                                   known);
        }
    }
    return 0;
}

const char *cmd_policy_opt_key(const char *option) {
    const fmoe_policy_setting *row = fmoe_policy_setting_of_option(option + 2);
    assert(option[0] == '-' && option[1] == '-' && row);
    return row->name;
}

int cmd_policy_opt_shorthand(const char *cmd, fmoe_policy_settings *s, const char *option,
                             const char *value) {
    const char *key = cmd_policy_opt_key(option);
    const char *given = fmoe_policy_settings_get(s, key);
    if (given && strcmp(given, value) != 0)
        return cmd_usage_error(cmd, "%s %s and --policy-opt %s=%s disagree; give one", option,
                               value, key, given);
    if (fmoe_policy_settings_set(s, key, value) < 0)
        return cmd_usage_error(cmd, "%s %s: %s", option, value, fmoe_error_detail());
    return 0;
}

