/*
 * test_batch - fmoe_session_forward_batch (continuous batching) against each sequence run
 * alone with fmoe_session_forward, on tiny checkpoints of four families written here:
 * Mixtral; Qwen2-MoE (q/k/v biases, a gated shared expert, a dense layer); Qwen3-MoE with
 * per-head qk-norm and dynamic NTK RoPE (whose scaling depends on each sequence's call
 * length); OLMoE (whole-projection qk-norm, clip_qkv); DeepSeek-V3 (multi-head latent
 * attention over each sequence's latent cache, YaRN, grouped biased routing).
 *
 * Three sequences with prompts of different lengths join the batch at different times, so
 * every batched call mixes prefill and decode rows at different positions; then all three
 * decode greedily together. Logits must agree with the sequences run alone within TOL
 * relative to the logits' scale (the products run over more rows, so they may sum in a
 * different order: measured at most 1.6e-6 on these models: rounding, and a wrong
 * position or a neighbour's KV cache moves the logits by far more, which the test also
 * checks), and the greedy continuations must be identical.
 */
#include "fmoe/model.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "harness.h"
#include "st_writer.h"

enum { V = 64, H = 32, HEADS = 4, KVH = 2, D = 8, I = 16, J = 8, K = 2 };
enum { SHARED_I = 24, DENSE_I = 20, CTX = 64, NSEQ = 3, GEN = 16 };

/* Largest |batched - alone| allowed, relative to the largest |logit| of the step. */
#define TOL 1e-5

typedef enum { FAM_MIXTRAL, FAM_QWEN2, FAM_QWEN3_DYNAMIC, FAM_OLMOE, FAM_DEEPSEEK_V3,
               NUM_FAMS } family;
static const char *const fam_names[NUM_FAMS] = {"mixtral", "qwen2_moe", "qwen3_moe+dynamic",
                                                "olmoe", "deepseek_v3+yarn"};
/* DeepSeek-V3's multi-head latent attention: per head 8 nope + 4 rope dims, 6 value dims,
 * latent rank 12, query rank 10; grouped biased routing; a dense first layer. */
enum { MLA_DN = 8, MLA_DR = 4, MLA_DV = 6, MLA_R = 12, MLA_RQ = 10 };

static uint64_t rng = 1;
static float frand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) * 0x1.0p-24) * 2.0f - 1.0f;
}

static const char *config_of(family f) {
    switch (f) {
    case FAM_MIXTRAL:
        return "{\"model_type\": \"mixtral\", \"vocab_size\": 64, \"hidden_size\": 32,"
               " \"intermediate_size\": 16, \"num_hidden_layers\": 2,"
               " \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
               " \"num_local_experts\": 8, \"num_experts_per_tok\": 2,"
               " \"max_position_embeddings\": 128, \"rms_norm_eps\": 1e-5}";
    case FAM_QWEN2:
        return "{\"model_type\": \"qwen2_moe\", \"vocab_size\": 64, \"hidden_size\": 32,"
               " \"intermediate_size\": 20, \"moe_intermediate_size\": 16,"
               " \"shared_expert_intermediate_size\": 24, \"mlp_only_layers\": [1],"
               " \"num_hidden_layers\": 3, \"num_attention_heads\": 4,"
               " \"num_key_value_heads\": 2, \"num_experts\": 8, \"num_experts_per_tok\": 2,"
               " \"max_position_embeddings\": 128}";
    case FAM_QWEN3_DYNAMIC:
        return "{\"model_type\": \"qwen3_moe\", \"vocab_size\": 64, \"hidden_size\": 32,"
               " \"moe_intermediate_size\": 16, \"num_hidden_layers\": 2, \"head_dim\": 8,"
               " \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
               " \"num_experts\": 8, \"num_experts_per_tok\": 2, \"norm_topk_prob\": true,"
               " \"max_position_embeddings\": 12,"
               " \"rope_scaling\": {\"rope_type\": \"dynamic\", \"factor\": 2.0}}";
    case FAM_DEEPSEEK_V3:
        return "{\"model_type\": \"deepseek_v3\", \"vocab_size\": 64, \"hidden_size\": 32,"
               " \"intermediate_size\": 20, \"moe_intermediate_size\": 16,"
               " \"num_hidden_layers\": 3, \"first_k_dense_replace\": 1,"
               " \"num_attention_heads\": 4, \"num_key_value_heads\": 4,"
               " \"n_routed_experts\": 8, \"n_shared_experts\": 1, \"num_experts_per_tok\": 2,"
               " \"n_group\": 4, \"topk_group\": 2, \"q_lora_rank\": 10, \"kv_lora_rank\": 12,"
               " \"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 4, \"v_head_dim\": 6,"
               " \"max_position_embeddings\": 128,"
               " \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0, \"mscale\": 1.0,"
               " \"mscale_all_dim\": 1.0, \"original_max_position_embeddings\": 4}}";
    default:
        return "{\"model_type\": \"olmoe\", \"vocab_size\": 64, \"hidden_size\": 32,"
               " \"intermediate_size\": 16, \"num_hidden_layers\": 2,"
               " \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
               " \"num_experts\": 8, \"num_experts_per_tok\": 2, \"clip_qkv\": 1.5,"
               " \"max_position_embeddings\": 128}";
    }
}

static st_builder *g_b;
static float g_buf[V * H * 4];

/* Adds a tensor of `rows` x `cols` random values; cols 0: a vector of `rows` near 1 (a
 * norm's weight); cols -1: a vector of `rows` around 0 (a bias). */
static void add(int64_t rows, int64_t cols, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void add(int64_t rows, int64_t cols, const char *fmt, ...) {
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    const int64_t n = rows * (cols > 0 ? cols : 1);
    for (int64_t i = 0; i < n; i++) g_buf[i] = cols ? 0.5f * frand() : 1.0f + 0.1f * frand();
    if (cols > 0)
        stb_add_f(g_b, name, "F32", 2, (int64_t[]){rows, cols}, g_buf);
    else
        stb_add_f(g_b, name, "F32", 1, (int64_t[]){rows}, g_buf);
}

static void add_mlp(int64_t width, const char *prefix, int l, const char *part) {
    add(width, H, "model.layers.%d.%s%s.gate_proj.weight", l, prefix, part);
    add(width, H, "model.layers.%d.%s%s.up_proj.weight", l, prefix, part);
    add(H, width, "model.layers.%d.%s%s.down_proj.weight", l, prefix, part);
}

/* Writes family f's tiny checkpoint into a new directory. */
static void write_family(char *out, size_t cap, family f) {
    make_tmpdir(out, cap, "batch");
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", out);
    write_text(path, config_of(f));
    rng = 7 + (uint64_t)f;
    st_builder *b = malloc(sizeof *b);
    stb_init(b);
    g_b = b;
    const int layers = f == FAM_QWEN2 || f == FAM_DEEPSEEK_V3 ? 3 : 2;
    add(V, H, "model.embed_tokens.weight");
    add(H, 0, "model.norm.weight");
    add(V, H, "lm_head.weight");
    for (int l = 0; l < layers; l++) {
        add(H, 0, "model.layers.%d.input_layernorm.weight", l);
        add(H, 0, "model.layers.%d.post_attention_layernorm.weight", l);
        if (f == FAM_DEEPSEEK_V3) {
            add(MLA_RQ, H, "model.layers.%d.self_attn.q_a_proj.weight", l);
            add(MLA_RQ, 0, "model.layers.%d.self_attn.q_a_layernorm.weight", l);
            add(HEADS * (MLA_DN + MLA_DR), MLA_RQ, "model.layers.%d.self_attn.q_b_proj.weight", l);
            add(MLA_R + MLA_DR, H, "model.layers.%d.self_attn.kv_a_proj_with_mqa.weight", l);
            add(MLA_R, 0, "model.layers.%d.self_attn.kv_a_layernorm.weight", l);
            add(HEADS * (MLA_DN + MLA_DV), MLA_R, "model.layers.%d.self_attn.kv_b_proj.weight", l);
            add(H, HEADS * MLA_DV, "model.layers.%d.self_attn.o_proj.weight", l);
            if (l == 0) {
                add_mlp(DENSE_I, "mlp", l, "");
                continue;
            }
            add(J, -1, "model.layers.%d.mlp.gate.e_score_correction_bias", l);
        } else {
            add(HEADS * D, H, "model.layers.%d.self_attn.q_proj.weight", l);
            add(KVH * D, H, "model.layers.%d.self_attn.k_proj.weight", l);
            add(KVH * D, H, "model.layers.%d.self_attn.v_proj.weight", l);
            add(H, HEADS * D, "model.layers.%d.self_attn.o_proj.weight", l);
        }
        if (f == FAM_QWEN2) {
            add(HEADS * D, -1, "model.layers.%d.self_attn.q_proj.bias", l);
            add(KVH * D, -1, "model.layers.%d.self_attn.k_proj.bias", l);
            add(KVH * D, -1, "model.layers.%d.self_attn.v_proj.bias", l);
        }
        if (f == FAM_QWEN3_DYNAMIC) {
            add(D, 0, "model.layers.%d.self_attn.q_norm.weight", l);
            add(D, 0, "model.layers.%d.self_attn.k_norm.weight", l);
        }
        if (f == FAM_OLMOE) {
            add(HEADS * D, 0, "model.layers.%d.self_attn.q_norm.weight", l);
            add(KVH * D, 0, "model.layers.%d.self_attn.k_norm.weight", l);
        }
        if (f == FAM_QWEN2 && l == 1) { /* mlp_only_layers: dense */
            add_mlp(DENSE_I, "mlp", l, "");
            continue;
        }
        const char *moe = f == FAM_MIXTRAL ? "block_sparse_moe" : "mlp";
        add(J, H, "model.layers.%d.%s.gate.weight", l, moe);
        for (int e = 0; e < J; e++) {
            if (f == FAM_MIXTRAL) {
                add(I, H, "model.layers.%d.%s.experts.%d.w1.weight", l, moe, e);
                add(H, I, "model.layers.%d.%s.experts.%d.w2.weight", l, moe, e);
                add(I, H, "model.layers.%d.%s.experts.%d.w3.weight", l, moe, e);
            } else {
                char part[64];
                snprintf(part, sizeof part, ".experts.%d", e);
                add_mlp(I, "mlp", l, part);
            }
        }
        if (f == FAM_QWEN2) {
            add_mlp(SHARED_I, "mlp", l, ".shared_expert");
            add(1, H, "model.layers.%d.mlp.shared_expert_gate.weight", l);
        }
        if (f == FAM_DEEPSEEK_V3) add_mlp(I, "mlp", l, ".shared_experts");
    }
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    stb_write(b, path, 8, 0);
    stb_free(b);
    free(b);
}

static fmoe_session *open_session(const fmoe_model *m, int32_t ctx, int32_t batch,
                                  int32_t all_logits) {
    fmoe_session_options o = fmoe_session_defaults();
    o.max_context = ctx;
    o.max_batch = batch;
    o.max_sequences = batch;
    o.threads = 2;
    o.all_logits = all_logits;
    fmoe_session *s = NULL;
    if (fmoe_session_init(m, &o, &s) < 0) return NULL;
    return s;
}

static int32_t argmax(const float *x) {
    int32_t b = 0;
    for (int32_t i = 1; i < V; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* max |a - b| / max(1, max |b|) over V logits. */
static double rel_diff(const float *a, const float *b) {
    double d = 0, scale = 1;
    for (int i = 0; i < V; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        scale = fmax(scale, fabs((double)b[i]));
    }
    return d / scale;
}

static const int32_t prompt_len[NSEQ] = {5, 9, 3};
static const int32_t join_at[NSEQ] = {0, 1, 3}; /* the step at which each sequence's prompt runs */
static int32_t prompt_tok(int seq, int t) { return (seq * 17 + t * 5 + 3) % V; }

/*
 * Runs the staggered schedule twice, batched through `runner` (NULL: the first sequence's
 * session runs the batch) and each sequence alone; *worst receives the largest relative
 * logit difference; every generated token is compared.
 */
static void schedule(int *harness_failed, const fmoe_model *m, int runner_is_item,
                     double *worst) {
    fmoe_session *alone[NSEQ], *seq[NSEQ];
    for (int i = 0; i < NSEQ; i++) {
        alone[i] = open_session(m, CTX, 16, 0);
        seq[i] = open_session(m, CTX, 16, 0);
        ASSERT_TRUE(alone[i] && seq[i]);
    }
    fmoe_session *runner = runner_is_item ? seq[0] : open_session(m, CTX, 16, 0);
    ASSERT_TRUE(runner != NULL);
    int32_t next_b[NSEQ], next_a[NSEQ], gen_b[NSEQ], gen_a[NSEQ];
    int32_t prompts[NSEQ][16];
    for (int i = 0; i < NSEQ; i++) {
        gen_b[i] = gen_a[i] = 0;
        for (int t = 0; t < prompt_len[i]; t++) prompts[i][t] = prompt_tok(i, t);
    }
    static float lb[NSEQ][V], la[NSEQ][V];
    *worst = 0;
    for (int step = 0; step < join_at[NSEQ - 1] + GEN; step++) {
        fmoe_batch_item items[NSEQ];
        int32_t count = 0, idx[NSEQ];
        for (int i = 0; i < NSEQ; i++) {
            if (step < join_at[i] || gen_b[i] >= GEN) continue;
            const int prefill = step == join_at[i];
            items[count] = (fmoe_batch_item){
                .session = seq[i], .tokens = prefill ? prompts[i] : &next_b[i],
                .n = prefill ? prompt_len[i] : 1, .trace = NULL, .logits = lb[i]};
            idx[count++] = i;
            ASSERT_OK(fmoe_session_forward(alone[i], prefill ? prompts[i] : &next_a[i],
                                           prefill ? prompt_len[i] : 1, NULL, la[i]));
        }
        if (count == 0) break;
        ASSERT_OK(fmoe_session_forward_batch(runner, items, count));
        for (int c = 0; c < count; c++) {
            const int i = idx[c];
            *worst = fmax(*worst, rel_diff(lb[i], la[i]));
            next_b[i] = argmax(lb[i]);
            next_a[i] = argmax(la[i]);
            ASSERT_EQ(next_b[i], next_a[i]); /* the greedy continuations agree token by token */
            gen_b[i]++;
            gen_a[i]++;
            ASSERT_EQ(fmoe_session_position(seq[i]), fmoe_session_position(alone[i]));
        }
    }
    for (int i = 0; i < NSEQ; i++) {
        ASSERT_EQ(gen_b[i], GEN);
        ASSERT_EQ(fmoe_session_position(seq[i]), prompt_len[i] + GEN - 1);
    }
    if (!runner_is_item) {
        ASSERT_EQ(fmoe_session_position(runner), 0); /* its own cache untouched */
        fmoe_session_free(runner);
    }
    for (int i = 0; i < NSEQ; i++) {
        fmoe_session_free(alone[i]);
        fmoe_session_free(seq[i]);
    }
}

TEST(batched_equals_alone) {
    for (int f = 0; f < NUM_FAMS; f++) {
        char d[512];
        write_family(d, sizeof d, (family)f);
        fmoe_model *m;
        ASSERT_OK(fmoe_model_load(d, NULL, &m));
        for (int ri = 0; ri < 2; ri++) {
            double worst = -1;
            int failed = 0;
            schedule(&failed, m, ri, &worst);
            if (failed) HARNESS_FAIL("%s (runner %s)", fam_names[f], ri ? "an item" : "apart");
            fprintf(stderr, "  %s, runner %s: max |batched - alone| / scale = %.3g\n",
                    fam_names[f], ri ? "an item" : "apart", worst);
            if (!(worst <= TOL))
                HARNESS_FAIL("%s: relative logit difference %g", fam_names[f], worst);
        }
        fmoe_model_free(m);
        remove_tree(d);
    }
}

/* The control: what the comparison above would see if a sequence ran at a wrong position
 * (one token later, its cache shifted by a token) or against another's cache — far more
 * than TOL, so the test can fail. */
TEST(controls_exceed_tolerance) {
    for (int f = 0; f < NUM_FAMS; f++) {
        char d[512];
        write_family(d, sizeof d, (family)f);
        fmoe_model *m;
        ASSERT_OK(fmoe_model_load(d, NULL, &m));
        fmoe_session *a = open_session(m, CTX, 16, 0), *b = open_session(m, CTX, 16, 0);
        ASSERT_TRUE(a && b);
        int32_t p[9], pre = 11;
        for (int t = 0; t < 9; t++) p[t] = prompt_tok(1, t);
        float la[V], lb[V];
        ASSERT_OK(fmoe_session_forward(a, p, 9, NULL, la));
        ASSERT_OK(fmoe_session_forward(b, &pre, 1, NULL, NULL));
        ASSERT_OK(fmoe_session_forward(b, p, 9, NULL, lb));
        const double shifted = rel_diff(lb, la);
        if (!(shifted > 100 * TOL))
            HARNESS_FAIL("%s: shift moved logits by %g", fam_names[f], shifted);
        /* the last token against the other sequence's cache */
        fmoe_session_reset(b);
        ASSERT_OK(fmoe_session_forward(b, p, 8, NULL, NULL));
        fmoe_batch_item it = {.session = a, .tokens = &p[8], .n = 1, .logits = lb};
        fmoe_session_reset(a);
        ASSERT_OK(fmoe_session_forward(a, (int32_t[]){1, 2, 3, 4, 5, 6, 7, 8}, 8, NULL, NULL));
        ASSERT_OK(fmoe_session_forward_batch(b, &it, 1));
        const double other = rel_diff(lb, la);
        if (!(other > 100 * TOL))
            HARNESS_FAIL("%s: other cache moved logits by %g", fam_names[f], other);
        fmoe_session_free(a);
        fmoe_session_free(b);
        fmoe_model_free(m);
        remove_tree(d);
    }
}

/* ------------------------------------------------------------------ routing and traces */

enum { MAXT = 16, LM = 2 }; /* rows of the batch below; MoE layers of the OLMoE fixture */

typedef struct route_check {
    int32_t expect_tokens;
    int events, errors;
    const fmoe_batch_item *items;
    int32_t count;
} route_check;
static route_check rt;

/* Checks one route event of a batched call: all rows, experts in first-appearance order
 * over the concatenated rows, counts per expert, and each row equal to its item's trace
 * (written before the hook runs). */
static int on_route_check(void *ctx, const fmoe_route_event *ev) {
    (void)ctx;
    rt.events++;
    if (ev->num_tokens != rt.expect_tokens) rt.errors++;
    int32_t seen[J] = {0}, order[J], n_order = 0;
    for (int32_t t = 0; t < ev->num_tokens; t++)
        for (int k = 0; k < K; k++) {
            const int e = ev->chosen[t * ev->chosen_stride + k];
            if (!seen[e]++) order[n_order++] = e;
        }
    if (ev->num_distinct != n_order) rt.errors++;
    for (int q = 0; q < n_order && q < ev->num_distinct; q++)
        if (ev->distinct[q] != order[q]) rt.errors++;
    for (int j = 0; j < J; j++)
        if (ev->tokens[j] != seen[j]) rt.errors++;
    int32_t row = 0;
    for (int32_t i = 0; i < rt.count; i++)
        for (int32_t t = 0; t < rt.items[i].n; t++, row++)
            for (int k = 0; k < K; k++)
                if (ev->chosen[row * ev->chosen_stride + k] !=
                    rt.items[i].trace->experts[((int64_t)t * LM + ev->layer) * K + k])
                    rt.errors++;
    return 0;
}

typedef struct trace_bufs {
    uint16_t experts[MAXT * LM * K];
    float weights[MAXT * LM * K], probs[MAXT * LM * J], semantic[MAXT * H];
    float hidden[MAXT * LM * H];
    double layer_seconds[LM];
    fmoe_forward_trace tr;
} trace_bufs;

static void trace_init(trace_bufs *b) {
    memset(b, 0, sizeof *b);
    b->tr = (fmoe_forward_trace){.experts = b->experts, .weights = b->weights,
                                 .probs = b->probs, .semantic = b->semantic,
                                 .hidden = b->hidden, .layer_seconds = b->layer_seconds};
}

TEST(route_event_and_traces_of_a_batch) {
    char d[512];
    write_family(d, sizeof d, FAM_OLMOE);
    fmoe_model *m;
    ASSERT_OK(fmoe_model_load(d, NULL, &m));
    fmoe_session_options o = fmoe_session_defaults();
    o.max_context = CTX;
    o.max_batch = MAXT;
    o.max_sequences = MAXT;
    o.on_route = on_route_check;
    fmoe_session *runner, *seq[NSEQ], *alone[NSEQ];
    ASSERT_OK(fmoe_session_init(m, &o, &runner));
    /* the sequences at different positions: 0, 4 and 7 tokens already in their caches */
    const int32_t before[NSEQ] = {0, 4, 7}, n[NSEQ] = {5, 1, 3};
    static trace_bufs tb[NSEQ], ta[NSEQ];
    fmoe_batch_item items[NSEQ];
    int32_t toks[NSEQ][16];
    float lb[NSEQ][V], la[NSEQ][V];
    for (int i = 0; i < NSEQ; i++) {
        seq[i] = open_session(m, CTX, 16, 0);
        alone[i] = open_session(m, CTX, 16, 0);
        ASSERT_TRUE(seq[i] && alone[i]);
        for (int t = 0; t < before[i] + n[i]; t++) toks[i][t] = prompt_tok(i, t);
        if (before[i]) {
            ASSERT_OK(fmoe_session_forward(seq[i], toks[i], before[i], NULL, NULL));
            ASSERT_OK(fmoe_session_forward(alone[i], toks[i], before[i], NULL, NULL));
        }
        trace_init(&tb[i]);
        trace_init(&ta[i]);
        items[i] = (fmoe_batch_item){.session = seq[i], .tokens = toks[i] + before[i],
                                     .n = n[i], .trace = &tb[i].tr, .logits = lb[i]};
        ASSERT_OK(fmoe_session_forward(alone[i], toks[i] + before[i], n[i], &ta[i].tr, la[i]));
    }
    rt = (route_check){.expect_tokens = 5 + 1 + 3, .items = items, .count = NSEQ};
    ASSERT_OK(fmoe_session_forward_batch(runner, items, NSEQ));
    ASSERT_EQ(rt.events, LM); /* one event per MoE layer for the whole batch */
    ASSERT_EQ(rt.errors, 0);
    for (int i = 0; i < NSEQ; i++) {
        ASSERT_EQ(fmoe_session_position(seq[i]), before[i] + n[i]);
        ASSERT_TRUE(rel_diff(lb[i], la[i]) <= TOL);
        ASSERT_TRUE(memcmp(tb[i].experts, ta[i].experts, sizeof tb[i].experts) == 0);
        ASSERT_TRUE(memcmp(tb[i].semantic, ta[i].semantic, sizeof tb[i].semantic) == 0);
        for (int r = 0; r < n[i] * LM * J; r++) ASSERT_NEAR(tb[i].probs[r], ta[i].probs[r], 1e-5);
        for (int r = 0; r < n[i] * LM * K; r++)
            ASSERT_NEAR(tb[i].weights[r], ta[i].weights[r], 1e-5);
        for (int r = 0; r < n[i] * LM * H; r++) ASSERT_NEAR(tb[i].hidden[r], ta[i].hidden[r], 1e-4);
        for (int l = 0; l < LM; l++) ASSERT_TRUE(tb[i].layer_seconds[l] > 0);
    }
    ASSERT_EQ(fmoe_session_position(runner), 0);
    fmoe_session_free(runner);
    for (int i = 0; i < NSEQ; i++) {
        fmoe_session_free(seq[i]);
        fmoe_session_free(alone[i]);
    }
    fmoe_model_free(m);
    remove_tree(d);
}

/* A runner with all_logits writes [n][V] per item, as fmoe_session_forward with all_logits. */
TEST(all_logits_per_item) {
    char d[512];
    write_family(d, sizeof d, FAM_QWEN2);
    fmoe_model *m;
    ASSERT_OK(fmoe_model_load(d, NULL, &m));
    fmoe_session *runner = open_session(m, CTX, 16, 1);
    fmoe_session *a = open_session(m, CTX, 16, 0), *b = open_session(m, CTX, 16, 0);
    fmoe_session *ra = open_session(m, CTX, 16, 1), *rb = open_session(m, CTX, 16, 1);
    ASSERT_TRUE(runner && a && b && ra && rb);
    int32_t ta[6], tb[4];
    for (int t = 0; t < 6; t++) ta[t] = prompt_tok(0, t);
    for (int t = 0; t < 4; t++) tb[t] = prompt_tok(2, t);
    static float ba[6 * V], bb[4 * V], xa[6 * V], xb[4 * V];
    const fmoe_batch_item items[2] = {{.session = a, .tokens = ta, .n = 6, .logits = ba},
                                      {.session = b, .tokens = tb, .n = 4, .logits = bb}};
    ASSERT_OK(fmoe_session_forward_batch(runner, items, 2));
    ASSERT_OK(fmoe_session_forward(ra, ta, 6, NULL, xa));
    ASSERT_OK(fmoe_session_forward(rb, tb, 4, NULL, xb));
    for (int t = 0; t < 6; t++) ASSERT_TRUE(rel_diff(ba + t * V, xa + t * V) <= TOL);
    for (int t = 0; t < 4; t++) ASSERT_TRUE(rel_diff(bb + t * V, xb + t * V) <= TOL);
    fmoe_session_free(runner);
    fmoe_session_free(a);
    fmoe_session_free(b);
    fmoe_session_free(ra);
    fmoe_session_free(rb);
    fmoe_model_free(m);
    remove_tree(d);
}

/* ------------------------------------------------------------------ refusals */

#define EXPECT_REFUSED(items_, count_, code_, needle_)                                      \
    do {                                                                                    \
        for (int v_ = 0; v_ < V; v_++) out[v_] = -12345.0f;                                 \
        ASSERT_EQ(fmoe_session_forward_batch(runner, (items_), (count_)), (code_));          \
        ASSERT_CONTAINS(fmoe_error_detail(), (needle_));                                    \
        ASSERT_EQ(fmoe_session_position(a), 2);                                             \
        ASSERT_EQ(fmoe_session_position(b), 0);                                             \
        ASSERT_EQ(fmoe_session_position(runner), 0);                                        \
        for (int v_ = 0; v_ < V; v_++) ASSERT_TRUE(out[v_] == -12345.0f);                   \
    } while (0)

TEST(refusals_change_nothing) {
    char d[512];
    write_family(d, sizeof d, FAM_MIXTRAL);
    fmoe_model *m, *m2;
    ASSERT_OK(fmoe_model_load(d, NULL, &m));
    ASSERT_OK(fmoe_model_load(d, NULL, &m2)); /* the same files, another model */
    fmoe_session *runner = open_session(m, 16, 4, 0);
    fmoe_session *a = open_session(m, 16, 4, 0), *b = open_session(m, 8, 4, 0);
    fmoe_session *wide = open_session(m, 32, 4, 0), *other = open_session(m2, 16, 4, 0);
    ASSERT_TRUE(runner && a && b && wide && other);
    ASSERT_OK(fmoe_session_forward(a, (int32_t[]){1, 2}, 2, NULL, NULL));
    float out[V];
    const int32_t t3[3] = {1, 2, 3}, bad[2] = {4, V}, neg[1] = {-1};
    int32_t t7[7] = {1, 2, 3, 4, 5, 6, 7};
    fmoe_batch_item it[3];

    EXPECT_REFUSED(it, 0, FMOE_EINVAL, "no items");
    it[0] = (fmoe_batch_item){.session = a, .tokens = t3, .n = 3, .logits = out};
    it[1] = (fmoe_batch_item){.session = b, .tokens = t3, .n = 2, .logits = out};
    EXPECT_REFUSED(it, 2, FMOE_EINVAL, "exceed the runner's batch of 4");
    it[1] = (fmoe_batch_item){.session = other, .tokens = t3, .n = 1};
    EXPECT_REFUSED(it, 2, FMOE_EINVAL, "item 1: a session of another model");
    it[1] = (fmoe_batch_item){.session = wide, .tokens = t3, .n = 1};
    EXPECT_REFUSED(it, 2, FMOE_EINVAL, "item 1: its context of 32 positions exceeds");
    it[1] = (fmoe_batch_item){.session = a, .tokens = t3, .n = 1};
    EXPECT_REFUSED(it, 2, FMOE_EINVAL, "item 1: its session is already an item");
    it[1] = (fmoe_batch_item){.session = b, .tokens = bad, .n = 2};
    EXPECT_REFUSED(it, 2, FMOE_EINVAL, "item 1: token 64 at index 1 is outside");
    it[1] = (fmoe_batch_item){.session = b, .tokens = neg, .n = 1};
    EXPECT_REFUSED(it, 2, FMOE_EINVAL, "item 1: token -1");
    it[1] = (fmoe_batch_item){.session = b, .tokens = t3, .n = 0};
    EXPECT_REFUSED(it, 2, FMOE_EINVAL, "item 1: no tokens");
    it[1] = (fmoe_batch_item){.session = NULL, .tokens = t3, .n = 1};
    EXPECT_REFUSED(it, 2, FMOE_EINVAL, "item 1 has no session");
    /* a session made for one sequence (max_sequences 1, the default) runs one item, not two */
    fmoe_session_options so = fmoe_session_defaults();
    so.max_context = 16;
    so.max_batch = 4;
    fmoe_session *single = NULL;
    ASSERT_OK(fmoe_session_init(m, &so, &single));
    it[1] = (fmoe_batch_item){.session = b, .tokens = t3, .n = 1};
    ASSERT_EQ(fmoe_session_forward_batch(single, it, 2), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "2 items exceed the runner's max_sequences of 1");
    ASSERT_EQ(fmoe_session_position(a), 2);
    ASSERT_EQ(fmoe_session_forward_batch(single, it + 1, 1), 0);
    ASSERT_EQ(fmoe_session_position(b), 1);
    fmoe_session_reset(b);
    fmoe_session_free(single);
    /* b holds 8 positions: 7 fit after 0, then 2 more do not */
    it[0] = (fmoe_batch_item){.session = b, .tokens = t7, .n = 3, .logits = out};
    ASSERT_OK(fmoe_session_forward(b, t7, 7, NULL, NULL));
    it[1] = (fmoe_batch_item){.session = a, .tokens = t3, .n = 1, .logits = out};
    for (int v = 0; v < V; v++) out[v] = -12345.0f;
    ASSERT_EQ(fmoe_session_forward_batch(runner, it, 2), FMOE_ERANGE);
    ASSERT_CONTAINS(fmoe_error_detail(), "item 0: 3 tokens after 7 in the cache exceed");
    ASSERT_EQ(fmoe_session_position(a), 2);
    ASSERT_EQ(fmoe_session_position(b), 7);
    for (int v = 0; v < V; v++) ASSERT_TRUE(out[v] == -12345.0f);
    ASSERT_EQ(fmoe_session_forward(b, t7, 2, NULL, NULL), FMOE_ERANGE);
    /* after every refusal the sessions are usable: no item is left marked */
    it[0] = (fmoe_batch_item){.session = b, .tokens = t7, .n = 1, .logits = out};
    ASSERT_OK(fmoe_session_forward_batch(runner, it, 2));
    ASSERT_EQ(fmoe_session_position(a), 3);
    ASSERT_EQ(fmoe_session_position(b), 8);
    ASSERT_EQ(fmoe_session_forward_batch(NULL, it, 1), FMOE_EINVAL);
    ASSERT_EQ(fmoe_session_forward_batch(runner, NULL, 1), FMOE_EINVAL);
    fmoe_session_free(runner);
    fmoe_session_free(a);
    fmoe_session_free(b);
    fmoe_session_free(wide);
    fmoe_session_free(other);
    fmoe_model_free(m);
    fmoe_model_free(m2);
    remove_tree(d);
}

/* fmoe_session_keep_prefix and _copy_prefix: a sequence that ran tokens A, kept to their first n, then given
 * B's tail gives B's logits and cache (its next decode steps too) as a fresh run of B, for
 * every family; the mismatched control (the kept tokens differ from B's head) moves the
 * logits far beyond the tolerance; a count past the cache and the dynamic-NTK family
 * (whose keys depend on the whole call's length) are refused with nothing changed. */
TEST(keep_prefix_continues_as_a_fresh_run) {
    for (int f = 0; f < NUM_FAMS; f++) {
        char d[512];
        write_family(d, sizeof d, (family)f);
        fmoe_model *m;
        ASSERT_OK(fmoe_model_load(d, NULL, &m));
        fmoe_session *a = open_session(m, CTX, 16, 0), *b = open_session(m, CTX, 16, 0);
        ASSERT_TRUE(a && b);
        enum { NA = 11, KEEP = 6, NB = 10 };
        int32_t ta[NA], tb[NB];
        for (int t = 0; t < NA; t++) ta[t] = prompt_tok(0, t);
        for (int t = 0; t < NB; t++) tb[t] = t < KEEP ? ta[t] : prompt_tok(2, t);
        float la[V], lb[V];
        ASSERT_OK(fmoe_session_forward(a, ta, NA, NULL, la));
        if (f == FAM_QWEN3_DYNAMIC) {
            ASSERT_EQ(fmoe_model_prefix_reusable(m), 0);
            ASSERT_EQ(fmoe_session_keep_prefix(a, KEEP), FMOE_EUNSUPPORTED);
            ASSERT_CONTAINS(fmoe_error_detail(), "whole call's length");
            ASSERT_EQ(fmoe_session_position(a), NA);
        } else {
            ASSERT_EQ(fmoe_model_prefix_reusable(m), 1);
            ASSERT_EQ(fmoe_session_keep_prefix(a, NA + 1), FMOE_EINVAL);
            ASSERT_EQ(fmoe_session_position(a), NA);
            ASSERT_OK(fmoe_session_keep_prefix(a, KEEP));
            ASSERT_EQ(fmoe_session_position(a), KEEP);
            ASSERT_OK(fmoe_session_forward(a, tb + KEEP, NB - KEEP, NULL, la));
            ASSERT_OK(fmoe_session_forward(b, tb, NB, NULL, lb));
            double worst = rel_diff(la, lb);
            /* and three decode steps on the kept cache */
            int32_t ga = argmax(la), gb = argmax(lb);
            for (int step = 0; step < 3; step++) {
                ASSERT_EQ(ga, gb);
                ASSERT_OK(fmoe_session_forward(a, &ga, 1, NULL, la));
                ASSERT_OK(fmoe_session_forward(b, &gb, 1, NULL, lb));
                worst = fmax(worst, rel_diff(la, lb));
                ga = argmax(la), gb = argmax(lb);
            }
            if (!(worst <= TOL))
                HARNESS_FAIL("%s: kept prefix moved logits by %g", fam_names[f], worst);
            /* the same prefix copied into a third session (a different context length,
             * so the rows move between strides) continues as the fresh run too */
            fmoe_session *c = open_session(m, CTX / 2, 16, 0);
            ASSERT_TRUE(c != NULL);
            fmoe_session_reset(a);
            ASSERT_OK(fmoe_session_forward(a, ta, NA, NULL, NULL));
            ASSERT_EQ(fmoe_session_copy_prefix(c, a, NA + 1), FMOE_EINVAL);
            ASSERT_OK(fmoe_session_copy_prefix(c, a, KEEP));
            ASSERT_EQ(fmoe_session_position(c), KEEP);
            ASSERT_EQ(fmoe_session_position(a), NA);
            ASSERT_OK(fmoe_session_forward(c, tb + KEEP, NB - KEEP, NULL, la));
            fmoe_session_reset(b);
            ASSERT_OK(fmoe_session_forward(b, tb, NB, NULL, lb));
            if (!(rel_diff(la, lb) <= TOL))
                HARNESS_FAIL("%s: copied prefix moved logits by %g", fam_names[f],
                             rel_diff(la, lb));
            ASSERT_TRUE(fmoe_session_kv_bytes(c) * 2 == fmoe_session_kv_bytes(a));
            fmoe_session_free(c);
            /* control: a cache holding other tokens than B's head */
            fmoe_session_reset(a);
            int32_t other[KEEP];
            for (int t = 0; t < KEEP; t++) other[t] = prompt_tok(1, t);
            ASSERT_OK(fmoe_session_forward(a, other, KEEP, NULL, NULL));
            ASSERT_OK(fmoe_session_forward(a, tb + KEEP, NB - KEEP, NULL, la));
            fmoe_session_reset(b);
            ASSERT_OK(fmoe_session_forward(b, tb, NB, NULL, lb));
            if (!(rel_diff(la, lb) > 100 * TOL))
                HARNESS_FAIL("%s: control moved logits by only %g", fam_names[f],
                             rel_diff(la, lb));
        }
        fmoe_session_free(a);
        fmoe_session_free(b);
        fmoe_model_free(m);
        remove_tree(d);
    }
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
