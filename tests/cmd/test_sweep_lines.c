/*
 * test_sweep_lines.c - the result lines and the --sweep-out file of `fmoe simulate`
 * (cmd/sweep_lines.c): every field of a result read back bit for bit (doubles of every
 * magnitude, undefined ratios, per-layer counters), lines that are not whole cell lines
 * refused, and the file's resume rules (settings line, torn last line cut, cells not of the
 * sweep left alone). The single-process pool of cmd/sweep_run.c runs every cell once.
 */
#include "sweep.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fmoe/error.h"
#include "harness.h"

static uint64_t next(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* A double of any magnitude from 1e-10 to 1e10 with all 53 bits used. */
static double dbl(uint64_t *x) {
    const double m = (double)(next(x) >> 11) * 0x1p-53;
    return m * pow(10.0, (double)(next(x) % 20) - 10.0);
}

/* A result whose doubles need all 17 digits, with per-layer rows. */
static fmoe_sim_result sample(uint64_t seed, int32_t L) {
    fmoe_sim_result r;
    memset(&r, 0, sizeof r);
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    snprintf(r.policy, sizeof r.policy, "moe-infinity-fb");
    r.cache_experts = 17;
    r.prefetch_distance = 3;
    r.accesses = (int64_t)(next(&x) % (1ull << 52));
    r.hits = 12345;
    r.bytes_loaded = ((int64_t)1 << 53) - 1; /* the largest exact in a double */
    r.stall_s = dbl(&x);
    r.total_s = dbl(&x);
    r.ttft_s = (fmoe_sim_summary){dbl(&x), dbl(&x), dbl(&x), dbl(&x)};
    r.e2e_s = (fmoe_sim_summary){dbl(&x), dbl(&x), dbl(&x), 0};
    r.prefetch_precision = NAN;
    r.prefetch_recall = dbl(&x);
    r.goodpred = NAN;
    r.host_busy_s = 1e-300;
    r.miss_mode = 2;
    r.variant = 1;
    r.batch = 4;
    r.per_phase[1].stall_s = dbl(&x);
    r.per_phase[0].wasted_prefetch_bytes = 99;
    r.num_layers = L;
    r.per_layer = calloc((size_t)L, sizeof *r.per_layer);
    for (int32_t l = 0; l < L; l++) {
        r.per_layer[l].accesses = l * 3;
        r.per_layer[l].host_misses = l;
        r.per_layer[l].stall_s = dbl(&x);
    }
    return r;
}

/* Same bits, NAN matching NAN. */
static int same(double a, double b) { return (isnan(a) && isnan(b)) || memcmp(&a, &b, sizeof a) == 0; }

TEST(lines_read_back_bit_for_bit) {
    for (uint64_t seed = 1; seed <= 50; seed++) {
        fmoe_sim_result r = sample(seed, (int32_t)(seed % 5)), back;
        const cmd_sweep_key k = {"t,1.h5", "h100-pcie5", "fmoe", 17, 0, "c0ffee"};
        char *line = cmd_sweep_line(&k, &r, 0.25);
        ASSERT_TRUE(line && !strchr(line, '\n'));
        char key[512], want[512];
        ASSERT_EQ(cmd_sweep_line_parse(line, key, sizeof key, &back), 0);
        ASSERT_STR_EQ(key, cmd_sweep_key_string(&k, want, sizeof want));
        ASSERT_STR_EQ(back.policy, r.policy);
        ASSERT_EQ(back.accesses, r.accesses);
        ASSERT_EQ(back.bytes_loaded, r.bytes_loaded);
        ASSERT_EQ(back.miss_mode, 2);
        ASSERT_EQ(back.variant, 1);
        ASSERT_EQ(back.batch, 4);
        ASSERT_TRUE(same(back.stall_s, r.stall_s) && same(back.total_s, r.total_s));
        ASSERT_TRUE(same(back.ttft_s.p99, r.ttft_s.p99) && same(back.e2e_s.p50, r.e2e_s.p50));
        ASSERT_TRUE(isnan(back.prefetch_precision) && isnan(back.goodpred));
        ASSERT_TRUE(same(back.prefetch_recall, r.prefetch_recall));
        ASSERT_TRUE(same(back.host_busy_s, 1e-300));
        ASSERT_TRUE(same(back.per_phase[1].stall_s, r.per_phase[1].stall_s));
        ASSERT_EQ(back.per_phase[0].wasted_prefetch_bytes, 99);
        ASSERT_EQ(back.num_layers, r.num_layers);
        for (int32_t l = 0; l < r.num_layers; l++) {
            ASSERT_EQ(back.per_layer[l].accesses, l * 3);
            ASSERT_EQ(back.per_layer[l].host_misses, l);
            ASSERT_TRUE(same(back.per_layer[l].stall_s, r.per_layer[l].stall_s));
        }
        free(line);
        fmoe_sim_result_free(&r);
        fmoe_sim_result_free(&back);
    }
}

TEST(broken_lines_are_refused) {
    fmoe_sim_result r = sample(3, 2), back;
    const cmd_sweep_key k = {"t.h5", "rtx3090-pcie4", "lru", 4, 1, "c0ffee"};
    char *line = cmd_sweep_line(&k, &r, 0);
    char key[256];
    const size_t n = strlen(line);
    for (size_t cut = 0; cut < n; cut += 7) { /* every torn prefix */
        char *torn = strndup(line, cut);
        ASSERT_EQ(cmd_sweep_line_parse(torn, key, sizeof key, &back), -1);
        free(torn);
    }
    const char *bad[] = {"", "null", "[]", "{\"fmoe_sweep\":1,\"settings\":\"x\"}",
                         "{\"cell\":{},\"result\":{}}",
                         "{\"cell\":{\"trace\":1,\"hardware\":\"h\",\"policy\":\"p\"}}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ASSERT_EQ(cmd_sweep_line_parse(bad[i], key, sizeof key, &back), -1);
    /* a policy name longer than the result holds */
    const char *tag = "\"result\":{\"policy\":\"moe-infinity-fb\"";
    const char *at = strstr(line, tag);
    ASSERT_TRUE(at != NULL);
    const size_t pre = (size_t)(at - line) + strlen("\"result\":{\"policy\":\"");
    char *lp = malloc(n + 64);
    sprintf(lp, "%.*s%s%s", (int)pre, line, "a-policy-name-far-longer-than-32-characters",
            line + pre + strlen("moe-infinity-fb"));
    ASSERT_EQ(cmd_sweep_line_parse(lp, key, sizeof key, &back), -1);
    /* the same line with the name it had reads */
    ASSERT_EQ(cmd_sweep_line_parse(line, key, sizeof key, &back), 0);
    fmoe_sim_result_free(&back);
    free(lp);
    free(line);
    fmoe_sim_result_free(&r);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = calloc(1, 1 << 20);
    size_t n = fread(buf, 1, (1 << 20) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

TEST(result_file_resumes_its_own_settings_only) {
    char dir[] = "/tmp/test_sweep_linesXXXXXX";
    ASSERT_TRUE(mkdtemp(dir) != NULL);
    char path[256];
    snprintf(path, sizeof path, "%s/s.jsonl", dir);
    char k0[128], k1[128], k2[128];
    const cmd_sweep_key keys[3] = {{"a.h5", "hw", "lru", 4, 0, "aa"}, {"a.h5", "hw", "lru", 8, 0, "aa"},
                                   {"a.h5", "hw", "lfu", 4, 0, "aa"}};
    char *ks[3] = {(char *)cmd_sweep_key_string(&keys[0], k0, sizeof k0),
                   (char *)cmd_sweep_key_string(&keys[1], k1, sizeof k1),
                   (char *)cmd_sweep_key_string(&keys[2], k2, sizeof k2)};
    fmoe_sim_result res[3];
    memset(res, 0, sizeof res);
    uint8_t done[3] = {0};
    size_t n_done = 9;
    cmd_sweep_file *f = NULL;
    ASSERT_EQ(cmd_sweep_file_open("test", path, "miss=load", 0, 3, ks, res, done, &n_done, &f), 0);
    ASSERT_EQ(n_done, 0);
    /* cells 2 and 0 finish, and a line of a cell of another sweep */
    fmoe_sim_result r = sample(7, 3);
    const cmd_sweep_key other = {"b.h5", "hw", "lru", 4, 0, "bb"};
    char *l2 = cmd_sweep_line(&keys[2], &r, 1), *l0 = cmd_sweep_line(&keys[0], &r, 1),
         *lo = cmd_sweep_line(&other, &r, 1);
    ASSERT_EQ(cmd_sweep_file_append(f, l2), 0);
    ASSERT_EQ(cmd_sweep_file_append(f, lo), 0);
    ASSERT_EQ(cmd_sweep_file_append(f, l0), 0);
    ASSERT_EQ(cmd_sweep_file_close(f), 0);
    /* a kill mid-line */
    FILE *raw = fopen(path, "a");
    fputs("{\"cell\":{\"trace\":\"a.h5\"", raw);
    fclose(raw);
    /* again without resume: refused (usage) */
    ASSERT_EQ(cmd_sweep_file_open("test", path, "miss=load", 0, 3, ks, res, done, &n_done, &f), 2);
    /* other settings: refused */
    ASSERT_EQ(cmd_sweep_file_open("test", path, "miss=cpu", 1, 3, ks, res, done, &n_done, &f), 1);
    ASSERT_EQ(cmd_sweep_file_open("test", path, "miss=load", 1, 3, ks, res, done, &n_done, &f), 0);
    ASSERT_EQ(n_done, 2);
    ASSERT_TRUE(done[0] && !done[1] && done[2]);
    ASSERT_EQ(res[0].num_layers, 3);
    ASSERT_TRUE(same(res[2].stall_s, r.stall_s));
    char *l1 = cmd_sweep_line(&keys[1], &r, 1);
    ASSERT_EQ(cmd_sweep_file_append(f, l1), 0);
    ASSERT_EQ(cmd_sweep_file_close(f), 0);
    /* the torn tail is gone, the other sweep's line kept, the new line whole */
    char *text = slurp(path);
    ASSERT_TRUE(text != NULL);
    int lines = 0;
    for (const char *c = text; *c; c++) lines += *c == '\n';
    ASSERT_EQ(lines, 5);
    ASSERT_TRUE(text[strlen(text) - 1] == '\n');
    ASSERT_CONTAINS(text, "\"b.h5\"");
    ASSERT_TRUE(strstr(text, "{\"cell\":{\"trace\":\"a.h5\"}") == NULL);
    free(text);
    for (int i = 0; i < 3; i++) fmoe_sim_result_free(&res[i]);
    free(l0);
    free(l1);
    free(l2);
    free(lo);
    fmoe_sim_result_free(&r);
    unlink(path);
    rmdir(dir);
}

/* ------------------------------------------------------------------ the local runner */

typedef struct counting {
    atomic_int runs[64];
    int seen[64];
    size_t order[64];
    size_t n_done;
} counting;

static char *run_one(void *ctx, size_t i, int *rc) {
    counting *c = ctx;
    atomic_fetch_add(&c->runs[i], 1);
    *rc = 0;
    char *line = malloc(32);
    snprintf(line, 32, "cell %zu", i);
    return line;
}

static int done_one(void *ctx, size_t i, const char *line) {
    counting *c = ctx;
    char want[32];
    snprintf(want, sizeof want, "cell %zu", i);
    if (strcmp(line, want) != 0) return fmoe_error_set(FMOE_EINTERNAL, "line %s", line);
    c->seen[i]++;
    c->order[c->n_done++] = i;
    return 0;
}

TEST(local_runner_runs_each_cell_once_and_skips_resumed) {
    static counting c;
    memset(&c, 0, sizeof c);
    uint8_t skip[64] = {0};
    for (int i = 0; i < 64; i += 5) skip[i] = 1;
    const cmd_sweep_job job = {.n = 64, .skip = skip, .threads = 3, .run = run_one,
                               .done = done_one, .ctx = &c};
    ASSERT_OK(cmd_sweep_run_local(&job));
    for (int i = 0; i < 64; i++) {
        ASSERT_EQ(atomic_load(&c.runs[i]), skip[i] ? 0 : 1);
        ASSERT_EQ(c.seen[i], skip[i] ? 0 : 1);
    }
    ASSERT_EQ(c.n_done, 64 - 13);
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
