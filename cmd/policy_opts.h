/*
 * policy_opts.h - a policy's own settings on the command line: --policy-opt KEY=VALUE and
 * the shorthand options that name one setting (--store-mode, --eamc-capacity,
 * --store-capacity). The settings themselves are declared by each policy (fmoe/policy.h).
 */
#ifndef FMOE_CMD_POLICY_OPTS_H
#define FMOE_CMD_POLICY_OPTS_H

#include "fmoe/policy.h"
#include "options.h"

/* --policy-opt KEY=VALUE (repeatable), shared by simulate and the live commands: parses
 * each into *out (a key given again replaces its value) and refuses, as a usage error, a
 * malformed item, a key that no policy of `policies` declares (naming what each declares)
 * and a value that a policy declaring the key would refuse. @return 0 or 2 (printed). */
int cmd_policy_opts_parse(const char *cmd, const cmd_opt_strings *opts, char *const *policies,
                          int n, fmoe_policy_settings *out);

/* The KEY of the setting that `option` ("--store-mode") is the shorthand of: the policies'
 * tables say it (fmoe_policy_setting.option), so no command names a policy's key. The
 * option must be declared by some built-in policy (asserted). */
const char *cmd_policy_opt_key(const char *option);

/* A shorthand option for a setting (--store-mode M is store_mode=M): adds KEY=VALUE to s,
 * a usage error when --policy-opt gave the key another value. @return 0 or 2 (printed). */
int cmd_policy_opt_shorthand(const char *cmd, fmoe_policy_settings *s, const char *option,
                             const char *value);

#endif
