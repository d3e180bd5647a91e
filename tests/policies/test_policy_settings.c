/*
 * test_policy_settings.c - each policy's own settings (fmoe/policy.h, lib/policy_settings.c):
 * the registry's tables are well-formed, a KEY=VALUE list is checked against the policy's
 * table at init (unknown key, bad value, range), a policy reads what was given or its
 * default, and a list for several policies gives each the keys it declares.
 */
#include "harness.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/policy.h"

static const fmoe_policy_config geometry = {.num_layers = 2, .num_experts = 4, .top_k = 1,
                                            .capacity = 2, .prefetch_distance = 1};

/* ------------------------------------------------------------------ the registry's tables */

TEST(registry_tables_are_well_formed) {
    const fmoe_policy_ops *const *all = NULL;
    const size_t n = fmoe_policy_registry(&all);
    size_t with = 0;
    for (size_t i = 0; i < n; i++) {
        if (fmoe_policy_settings_table_check(all[i]) < 0)
            HARNESS_FAIL("%s: %s", all[i]->name, fmoe_error_detail());
        for (const fmoe_policy_setting *r = all[i]->settings; r && r->name; r++) {
            with += r == all[i]->settings;
            /* independently of table_check: the default is a value the row accepts, and
             * reads back as itself when given in its own words */
            char text[64];
            if (r->type == FMOE_SETTING_CHOICE) {
                snprintf(text, sizeof text, "%s", r->choices[(int)r->def]);
            } else {
                ASSERT_TRUE(r->min <= r->def && r->def <= r->max);
                snprintf(text, sizeof text, "%.17g", r->def);
            }
            double v = -1;
            ASSERT_OK(fmoe_policy_setting_parse_value(r, text, &v));
            ASSERT_TRUE(v == r->def);
            ASSERT_TRUE(strlen(r->help) > 10);
            ASSERT_TRUE(fmoe_policy_setting_find(all[i], r->name) == r);
        }
    }
    /* moe-infinity, moe-infinity-fb and the fmoe family declare theirs; most take none */
    ASSERT_TRUE(with > 0 && with < n);
}

TEST(table_check_refuses_bad_rows) {
    static const char *const ab[] = {"a", "b", NULL};
    const fmoe_policy_setting outside[] = {
        {.name = "k", .type = FMOE_SETTING_INT, .def = 0, .min = 1, .max = 3, .help = "h"}, {0}};
    const fmoe_policy_setting twice[] = {
        {.name = "k", .type = FMOE_SETTING_INT, .def = 1, .min = 1, .max = 3, .help = "h"},
        {.name = "k", .type = FMOE_SETTING_DOUBLE, .def = 1, .min = 1, .max = 3, .help = "h"},
        {0}};
    const fmoe_policy_setting fraction[] = {
        {.name = "k", .type = FMOE_SETTING_INT, .def = 1.5, .min = 1, .max = 3, .help = "h"}, {0}};
    const fmoe_policy_setting choice[] = {
        {.name = "k", .type = FMOE_SETTING_CHOICE, .def = 2, .choices = ab, .help = "h"}, {0}};
    const fmoe_policy_setting upper[] = {
        {.name = "Key", .type = FMOE_SETTING_INT, .def = 1, .min = 1, .max = 3, .help = "h"}, {0}};
    const fmoe_policy_setting nohelp[] = {
        {.name = "k", .type = FMOE_SETTING_INT, .def = 1, .min = 1, .max = 3}, {0}};
    const fmoe_policy_setting option_case[] = {
        {.name = "k", .type = FMOE_SETTING_INT, .def = 1, .min = 1, .max = 3, .help = "h",
         .option = "K-opt"}, {0}};
    const fmoe_policy_setting option_twice[] = {
        {.name = "k", .type = FMOE_SETTING_INT, .def = 1, .min = 1, .max = 3, .help = "h",
         .option = "k-opt"},
        {.name = "j", .type = FMOE_SETTING_INT, .def = 1, .min = 1, .max = 3, .help = "h",
         .option = "k-opt"}, {0}};
    const fmoe_policy_setting *bad[] = {outside, twice, fraction, choice, upper, nohelp,
                                        option_case, option_twice};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const fmoe_policy_ops ops = {.name = "t", .settings = bad[i]};
        ASSERT_EQ(fmoe_policy_settings_table_check(&ops), FMOE_EINVAL);
        ASSERT_CONTAINS(fmoe_error_detail(), "policy t");
    }
}

/* The alias column: each shorthand option the commands have (simulate's --eamc-capacity,
 * --store-mode, --store-capacity; the live commands' --store-mode) finds its setting in the
 * tables, and every table that declares a key with an option gives it the same option, so
 * which policy's row the lookup meets first does not matter. */
TEST(shorthand_options_name_one_key_across_the_registry) {
    static const char *const shorthands[][2] = {{"eamc-capacity", "eamc_capacity"},
                                                {"store-mode", "store_mode"},
                                                {"store-capacity", "store_capacity"}};
    for (size_t i = 0; i < 3; i++) {
        const fmoe_policy_setting *row = fmoe_policy_setting_of_option(shorthands[i][0]);
        ASSERT_TRUE(row != NULL);
        ASSERT_STR_EQ(row->name, shorthands[i][1]);
    }
    ASSERT_TRUE(fmoe_policy_setting_of_option("no-such-option") == NULL);
    ASSERT_TRUE(fmoe_policy_setting_of_option(NULL) == NULL);
    const fmoe_policy_ops *const *all = NULL;
    const size_t n = fmoe_policy_registry(&all);
    for (size_t i = 0; i < n; i++)
        for (const fmoe_policy_setting *r = all[i]->settings; r && r->name; r++)
            for (size_t j = 0; j < n; j++) {
                const fmoe_policy_setting *q = fmoe_policy_setting_find(all[j], r->name);
                if (!q) continue;
                if ((q->option == NULL) != (r->option == NULL) ||
                    (q->option && strcmp(q->option, r->option) != 0))
                    HARNESS_FAIL("%s of %s and of %s: options differ", r->name,
                                 all[i]->name, all[j]->name);
            }
}

/* ------------------------------------------------------------------ KEY=VALUE lists */

TEST(settings_parse_and_replace) {
    fmoe_policy_settings s = {0};
    ASSERT_OK(fmoe_policy_settings_parse(&s, "eamc_capacity=5"));
    ASSERT_OK(fmoe_policy_settings_parse(&s, "store_mode=offline-update"));
    ASSERT_OK(fmoe_policy_settings_parse(&s, "eamc_capacity=7")); /* the last one counts */
    ASSERT_EQ(s.n, 2);
    ASSERT_STR_EQ(fmoe_policy_settings_get(&s, "eamc_capacity"), "7");
    ASSERT_STR_EQ(fmoe_policy_settings_get(&s, "store_mode"), "offline-update");
    ASSERT_TRUE(fmoe_policy_settings_get(&s, "store_capacity") == NULL);
    ASSERT_TRUE(fmoe_policy_settings_get(NULL, "store_mode") == NULL);
    const char *malformed[] = {"eamc_capacity", "=5", "eamc_capacity=", "Eamc=5", "a-b=1"};
    for (size_t i = 0; i < sizeof malformed / sizeof malformed[0]; i++) {
        ASSERT_EQ(fmoe_policy_settings_parse(&s, malformed[i]), FMOE_EINVAL);
        ASSERT_TRUE(fmoe_error_detail()[0] != '\0');
    }
    ASSERT_EQ(s.n, 2);
    fmoe_policy_settings full = {0};
    char kv[32];
    for (int i = 0; i < FMOE_POLICY_MAX_SETTINGS; i++) {
        snprintf(kv, sizeof kv, "k%d=1", i);
        ASSERT_OK(fmoe_policy_settings_parse(&full, kv));
    }
    ASSERT_EQ(fmoe_policy_settings_parse(&full, "one_more=1"), FMOE_EINVAL);
    ASSERT_OK(fmoe_policy_settings_parse(&full, "k3=2")); /* replacing still works */
}

/* ------------------------------------------------------------------ checked at init */

static int init_with(const char *policy, const char *kv) {
    fmoe_policy_settings s = {0};
    if (kv && fmoe_policy_settings_parse(&s, kv) < 0) return FMOE_EINTERNAL;
    fmoe_policy_config cfg = geometry;
    cfg.settings = &s;
    fmoe_policy p;
    const int rc = fmoe_policy_init(&p, policy, &cfg);
    fmoe_policy_free(&p);
    return rc;
}

TEST(unknown_key_names_the_key_the_policy_and_its_keys) {
    ASSERT_EQ(init_with("lru", "eamc_capacity=5"), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "policy lru has no setting 'eamc_capacity'");
    ASSERT_CONTAINS(fmoe_error_detail(), "it has none");
    ASSERT_EQ(init_with("moe-infinity", "store_mode=online"), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "policy moe-infinity has no setting 'store_mode'");
    ASSERT_CONTAINS(fmoe_error_detail(), "its settings: eamc_capacity");
}

TEST(bad_value_names_the_key_the_value_and_the_range) {
    const char *bad[] = {"eamc_capacity=0", "eamc_capacity=10000001", "eamc_capacity=abc",
                         "eamc_capacity=12.5", "eamc_capacity=5x", "eamc_capacity=-3"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ASSERT_EQ(init_with("moe-infinity-fb", bad[i]), FMOE_EINVAL);
        ASSERT_CONTAINS(fmoe_error_detail(), "policy moe-infinity-fb: ");
        ASSERT_CONTAINS(fmoe_error_detail(), bad[i]);
        ASSERT_CONTAINS(fmoe_error_detail(), "an integer in [1, 10000000]");
    }
    ASSERT_EQ(init_with("fmoe", "store_mode=sometimes"), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "store_mode=sometimes: expected offline, online or "
                                         "offline-update");
    ASSERT_EQ(init_with("fmoe-lru", "store_capacity=-1"), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "store_capacity=-1");
    /* both ends of a range are allowed */
    ASSERT_OK(init_with("moe-infinity", "eamc_capacity=1"));
    ASSERT_OK(init_with("moe-infinity", NULL));
    ASSERT_OK(init_with("fmoe", "store_mode=online"));
}

/* ------------------------------------------------------------------ read by the policy */

static const char *const colours[] = {"red", "green", "blue", NULL};
static const fmoe_policy_setting probe_settings[] = {
    {.name = "count", .type = FMOE_SETTING_INT, .def = 7, .min = -5, .max = 100,
     .help = "an integer with a negative range"},
    {.name = "ratio", .type = FMOE_SETTING_DOUBLE, .def = 0.25, .min = 0, .max = 1,
     .help = "a fraction"},
    {.name = "colour", .type = FMOE_SETTING_CHOICE, .def = 1, .choices = colours,
     .help = "a choice"},
    {0},
};

static int64_t seen_count;
static double seen_ratio;
static int32_t seen_colour;

static int probe_init(void **state, const fmoe_policy_config *cfg) {
    seen_count = fmoe_policy_setting_int(cfg, probe_settings, "count");
    seen_ratio = fmoe_policy_setting_double(cfg, probe_settings, "ratio");
    seen_colour = fmoe_policy_setting_choice(cfg, probe_settings, "colour");
    *state = &seen_count; /* any non-NULL */
    return 0;
}

static int32_t probe_victim(void *state, const fmoe_policy_env *env,
                            const fmoe_victim_request *req) {
    (void)state, (void)req;
    return fmoe_policy_victim_lru(env->cache);
}

static const fmoe_policy_ops probe = {.name = "probe", .summary = "reads its settings",
                                      .init = probe_init, .choose_victim = probe_victim,
                                      .settings = probe_settings};

TEST(policy_reads_given_values_or_defaults) {
    ASSERT_OK(fmoe_policy_settings_table_check(&probe));
    fmoe_policy p;
    fmoe_policy_config cfg = geometry;
    ASSERT_OK(fmoe_policy_init_ops(&p, &probe, &cfg)); /* settings NULL: all defaults */
    ASSERT_EQ(seen_count, 7);
    ASSERT_NEAR(seen_ratio, 0.25, 0);
    ASSERT_EQ(seen_colour, 1);
    fmoe_policy_settings s = {0};
    ASSERT_OK(fmoe_policy_settings_parse(&s, "colour=blue"));
    ASSERT_OK(fmoe_policy_settings_parse(&s, "count=-5"));
    cfg.settings = &s;
    ASSERT_OK(fmoe_policy_init_ops(&p, &probe, &cfg)); /* ratio not given: its default */
    ASSERT_EQ(seen_count, -5);
    ASSERT_NEAR(seen_ratio, 0.25, 0);
    ASSERT_EQ(seen_colour, 2);
    ASSERT_OK(fmoe_policy_settings_parse(&s, "ratio=1e-1"));
    ASSERT_OK(fmoe_policy_init_ops(&p, &probe, &cfg));
    ASSERT_NEAR(seen_ratio, 0.1, 0);
    ASSERT_OK(fmoe_policy_settings_parse(&s, "ratio=1.5"));
    ASSERT_EQ(fmoe_policy_init_ops(&p, &probe, &cfg), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "ratio=1.5: expected a number in [0, 1]");
    ASSERT_OK(fmoe_policy_settings_parse(&s, "ratio=nan"));
    ASSERT_EQ(fmoe_policy_init_ops(&p, &probe, &cfg), FMOE_EINVAL);
    char d[128];
    fmoe_policy_setting_describe(&probe_settings[0], d, sizeof d);
    ASSERT_STR_EQ(d, "int, default 7, in [-5, 100]");
    fmoe_policy_setting_describe(&probe_settings[2], d, sizeof d);
    ASSERT_STR_EQ(d, "red|green|blue, default green");
}

/* One list for a sweep of several policies: each takes the keys its table declares. */
TEST(select_gives_each_policy_its_own_keys) {
    fmoe_policy_settings all = {0}, mine;
    ASSERT_OK(fmoe_policy_settings_parse(&all, "store_mode=online"));
    ASSERT_OK(fmoe_policy_settings_parse(&all, "eamc_capacity=3"));
    ASSERT_OK(fmoe_policy_settings_parse(&all, "store_capacity=40"));
    fmoe_policy_settings_select(&mine, fmoe_policy_find("moe-infinity"), &all);
    ASSERT_EQ(mine.n, 1);
    ASSERT_STR_EQ(fmoe_policy_settings_get(&mine, "eamc_capacity"), "3");
    fmoe_policy_settings_select(&mine, fmoe_policy_find("fmoe-map-t"), &all);
    ASSERT_EQ(mine.n, 2);
    ASSERT_STR_EQ(fmoe_policy_settings_get(&mine, "store_mode"), "online");
    ASSERT_STR_EQ(fmoe_policy_settings_get(&mine, "store_capacity"), "40");
    fmoe_policy_settings_select(&mine, fmoe_policy_find("lru"), &all);
    ASSERT_EQ(mine.n, 0);
    /* each selection passes its policy's check; the whole list passes none of them */
    const char *names[] = {"moe-infinity", "fmoe", "lru"};
    for (size_t i = 0; i < 3; i++) {
        const fmoe_policy_ops *ops = fmoe_policy_find(names[i]);
        fmoe_policy_settings_select(&mine, ops, &all);
        ASSERT_OK(fmoe_policy_settings_check(ops, &mine));
        ASSERT_EQ(fmoe_policy_settings_check(ops, &all), FMOE_EINVAL);
    }
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
