/*
 * test_model - loading model directories and running sessions, on tiny Mixtral-layout
 * checkpoints written here: refusals with one-line errors (missing tensor, wrong shape,
 * unknown or not-yet-supported family, unsupported rope or activation), the session's
 * limits, the trace outputs, and agreement between dtypes, chunkings and runs.
 * The numerical cross-check against transformers is tests/python/test_forward.py.
 */
#include "fmoe/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "harness.h"
#include "st_writer.h"

enum { V = 48, H = 16, HEADS = 2, KVH = 1, D = 8, I = 12, J = 4, K = 2, LAYERS = 2 };

static uint64_t rng = 1;
static float frand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) * 0x1.0p-24) * 2.0f - 1.0f;
}

static const char *config_fmt =
    "{\"model_type\": \"%s\", \"vocab_size\": %d, \"hidden_size\": %d,"
    " \"intermediate_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d,"
    " \"num_key_value_heads\": %d, \"num_local_experts\": %d, \"num_experts_per_tok\": %d,"
    " \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0%s}";

/*
 * Writes a tiny Mixtral into a new directory: weights drawn from a fixed seed (so two
 * calls write the same values), stored as `dtype`; `skip` names a tensor to leave out and
 * `bad_shape` one to write with a wrong shape; `extra` is appended to config.json;
 * `misalign` pads the header so F32 data is misaligned.
 */
static void write_model(char *out, size_t cap, const char *model_type, const char *dtype,
                        const char *skip, const char *bad_shape, const char *extra,
                        int misalign) {
    make_tmpdir(out, cap, "model");
    char path[1024], cfg[2048];
    snprintf(cfg, sizeof cfg, config_fmt, model_type, V, H, I, LAYERS, HEADS, KVH, J, K,
             extra ? extra : "");
    snprintf(path, sizeof path, "%s/config.json", out);
    write_text(path, cfg);
    rng = 1;
    st_builder b;
    stb_init(&b);
    float *buf = malloc(sizeof(float) * V * H * 4);
    char name[256];
#define ADD(rows, cols, ...)                                                               \
    do {                                                                                   \
        snprintf(name, sizeof name, __VA_ARGS__);                                          \
        int64_t r_ = (rows), c_ = (cols);                                                  \
        for (int64_t i_ = 0; i_ < r_ * c_; i_++) buf[i_] = (c_ ? 0.5f * frand() : 1.0f + 0.1f * frand()); \
        if (c_ == 0) c_ = 1, r_ = (rows);                                                  \
        if (skip && strcmp(skip, name) == 0) break;                                        \
        if (bad_shape && strcmp(bad_shape, name) == 0) r_ += 1;                            \
        if ((cols) == 0)                                                                   \
            stb_add_f(&b, name, dtype, 1, (int64_t[]){r_}, buf);                           \
        else                                                                               \
            stb_add_f(&b, name, dtype, 2, (int64_t[]){r_, c_}, buf);                       \
    } while (0)
    ADD(V, H, "model.embed_tokens.weight");
    ADD(H, 0, "model.norm.weight");
    ADD(V, H, "lm_head.weight");
    for (int l = 0; l < LAYERS; l++) {
        ADD(H, 0, "model.layers.%d.input_layernorm.weight", l);
        ADD(H, 0, "model.layers.%d.post_attention_layernorm.weight", l);
        ADD(HEADS * D, H, "model.layers.%d.self_attn.q_proj.weight", l);
        ADD(KVH * D, H, "model.layers.%d.self_attn.k_proj.weight", l);
        ADD(KVH * D, H, "model.layers.%d.self_attn.v_proj.weight", l);
        ADD(H, HEADS * D, "model.layers.%d.self_attn.o_proj.weight", l);
        ADD(J, H, "model.layers.%d.block_sparse_moe.gate.weight", l);
        for (int e = 0; e < J; e++) {
            ADD(I, H, "model.layers.%d.block_sparse_moe.experts.%d.w1.weight", l, e);
            ADD(H, I, "model.layers.%d.block_sparse_moe.experts.%d.w2.weight", l, e);
            ADD(I, H, "model.layers.%d.block_sparse_moe.experts.%d.w3.weight", l, e);
        }
    }
#undef ADD
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    stb_write(&b, path, misalign ? 0 : 8, misalign ? 1 : 0);
    stb_free(&b);
    free(buf);
}

#define EXPECT_LOAD_FAILS(d, code, needle)                                                 \
    do {                                                                                   \
        fmoe_model *m_ = NULL;                                                             \
        int rc_ = fmoe_model_load((d), NULL, &m_);                                         \
        remove_tree(d);                                                                    \
        if (rc_ != (code))                                                                 \
            HARNESS_FAIL("load returned %d, expected %d (%s)", rc_, (code),                \
                         fmoe_error_detail());                                             \
        ASSERT_TRUE(m_ == NULL);                                                           \
        ASSERT_CONTAINS(fmoe_error_detail(), (needle));                                    \
        ASSERT_TRUE(strchr(fmoe_error_detail(), '\n') == NULL);                            \
    } while (0)

TEST(loads_and_describes) {
    char d[512];
    write_model(d, sizeof d, "mixtral", "F32", NULL, NULL, NULL, 0);
    fmoe_model *m;
    ASSERT_OK(fmoe_model_load(d, NULL, &m));
    const fmoe_model_geometry *g = fmoe_model_get_geometry(m);
    ASSERT_EQ(g->num_moe_layers, LAYERS);
    ASSERT_EQ(g->num_experts, J);
    ASSERT_CONTAINS(fmoe_model_describe(m), "mixtral: 2 layers (2 MoE), 4 experts top-2");
    ASSERT_CONTAINS(fmoe_model_config_json(m), "\"mixtral\"");
    ASSERT_TRUE(fmoe_model_weight_bytes(m) > 0);
    fmoe_model_free(m);
    fmoe_model_free(NULL);
    remove_tree(d);
}

TEST(missing_tensor_named) {
    char d[512];
    write_model(d, sizeof d, "mixtral", "F32", "model.layers.1.block_sparse_moe.experts.2.w3.weight",
                NULL, NULL, 0);
    EXPECT_LOAD_FAILS(d, FMOE_ENOTFOUND,
                      "missing tensor model.layers.1.block_sparse_moe.experts.2.w3.weight");
    write_model(d, sizeof d, "mixtral", "F32", "lm_head.weight", NULL, NULL, 0);
    EXPECT_LOAD_FAILS(d, FMOE_ENOTFOUND, "missing tensor lm_head.weight");
}

TEST(wrong_shape_named) {
    char d[512];
    write_model(d, sizeof d, "mixtral", "F32", NULL, "model.layers.0.self_attn.k_proj.weight",
                NULL, 0);
    EXPECT_LOAD_FAILS(d, FMOE_EMISMATCH,
                      "tensor model.layers.0.self_attn.k_proj.weight has shape [9,16], "
                      "expected [8,16]");
}

TEST(families_refused) {
    char d[512];
    write_model(d, sizeof d, "mamba_moe", "F32", NULL, NULL, NULL, 0);
    EXPECT_LOAD_FAILS(d, FMOE_EUNSUPPORTED, "unsupported model_type \"mamba_moe\"");
    write_model(d, sizeof d, "llama", "F32", NULL, NULL, NULL, 0);
    EXPECT_LOAD_FAILS(d, FMOE_EUNSUPPORTED, "dense model");
    /* phimoe runs; its LayerNorm biases are read, so a Mixtral-shaped file lacks one */
    write_model(d, sizeof d, "phimoe", "F32", NULL, NULL, NULL, 0);
    EXPECT_LOAD_FAILS(d, FMOE_ENOTFOUND, "missing tensor model.norm.bias");
    /* gpt_oss runs; its attention biases are read, so a Mixtral-shaped file lacks one */
    write_model(d, sizeof d, "gpt_oss", "F32", NULL, NULL, ", \"head_dim\": 8", 0);
    EXPECT_LOAD_FAILS(d, FMOE_ENOTFOUND, "missing tensor model.layers.0.self_attn.q_proj.bias");
    /* llama4_text runs; its MoE block is feed_forward.*, which a Mixtral-shaped file
     * lacks */
    write_model(d, sizeof d, "llama4_text", "F32", NULL, NULL,
                ", \"intermediate_size_mlp\": 24, \"head_dim\": 8", 0);
    EXPECT_LOAD_FAILS(d, FMOE_ENOTFOUND, "missing tensor model.layers.0.feed_forward.router.weight");
    write_model(d, sizeof d, "mixtral", "F32", NULL, NULL,
                ", \"rope_scaling\": {\"type\": \"longrope\", \"factor\": 2}", 0);
    EXPECT_LOAD_FAILS(d, FMOE_EUNSUPPORTED,
                      "rope_type \"longrope\" is not supported for mixtral (phimoe only)");
    write_model(d, sizeof d, "mixtral", "F32", NULL, NULL, ", \"hidden_act\": \"gelu\"", 0);
    EXPECT_LOAD_FAILS(d, FMOE_EUNSUPPORTED, "hidden_act \"gelu\"");
    make_tmpdir(d, sizeof d, "model");
    EXPECT_LOAD_FAILS(d, FMOE_EIO, "config.json");
}

/* DeepSeek-V2/V3 run (tests/python/test_forward.py); MLA without its head sizes is a
 * malformed config, named before any weight is read. */
TEST(deepseek_mla_without_head_sizes_refused) {
    char d[512], p[600];
    make_tmpdir(d, sizeof d, "model");
    snprintf(p, sizeof p, "%s/config.json", d);
    write_text(p, "{\"model_type\": \"deepseek_v2\", \"num_hidden_layers\": 2, \"hidden_size\": 16,"
                  " \"n_routed_experts\": 4, \"num_experts_per_tok\": 2,"
                  " \"moe_intermediate_size\": 8, \"kv_lora_rank\": 8}");
    EXPECT_LOAD_FAILS(d, FMOE_EFORMAT, "qk_rope_head_dim 0");
}

/* Runs `n` tokens; logits of every token into out[n][V]. */
static int run(const char *dir, const int32_t *tok, int32_t n, int32_t batch, int32_t threads,
               float *out) {
    fmoe_model *m;
    int rc = fmoe_model_load(dir, NULL, &m);
    if (rc < 0) return rc;
    fmoe_session_options o = fmoe_session_defaults();
    o.all_logits = 1;
    o.max_batch = batch;
    o.threads = threads;
    fmoe_session *s;
    rc = fmoe_session_init(m, &o, &s);
    if (rc == 0) rc = fmoe_session_forward(s, tok, n, NULL, out);
    fmoe_session_free(s);
    fmoe_model_free(m);
    return rc;
}

TEST(dtypes_chunks_threads_and_alignment_agree) {
    enum { N = 20 };
    int32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (i * 7 + 3) % V;
    static float ref[N * V], got[N * V];
    char d[512];
    write_model(d, sizeof d, "mixtral", "F32", NULL, NULL, NULL, 0);
    ASSERT_OK(run(d, tok, N, 64, 1, ref));
    ASSERT_OK(run(d, tok, N, 3, 2, got)); /* chunks of 3 on two threads */
    for (int i = 0; i < N * V; i++) ASSERT_NEAR(got[i], ref[i], 1e-5);
    ASSERT_OK(run(d, tok, N, 64, 1, got)); /* deterministic */
    for (int i = 0; i < N * V; i++) ASSERT_NEAR(got[i], ref[i], 0);
    remove_tree(d);

    write_model(d, sizeof d, "mixtral", "F32", NULL, NULL, NULL, 1); /* misaligned data */
    ASSERT_OK(run(d, tok, N, 64, 1, got));
    for (int i = 0; i < N * V; i++) ASSERT_NEAR(got[i], ref[i], 0);
    remove_tree(d);

    /* bf16 and f16 copies of the same weights: rounding of 2^-8 / 2^-11 relative. */
    const char *dts[2] = {"BF16", "F16"};
    const double tol[2] = {0.05, 0.01};
    for (int k = 0; k < 2; k++) {
        write_model(d, sizeof d, "mixtral", dts[k], NULL, NULL, NULL, 0);
        ASSERT_OK(run(d, tok, N, 64, 2, got));
        double worst = 0;
        for (int i = 0; i < N * V; i++) worst = fmax(worst, fabs(got[i] - ref[i]));
        if (worst > tol[k]) HARNESS_FAIL("%s: max logit error %g", dts[k], worst);
        remove_tree(d);
    }
}

/* What the routing hook saw: every event checked against the rules of fmoe_route_event. */
static int routes_seen, route_errors;
static int route_fail_at = -1; /* the layer whose hook returns an error, -1 none */
static float route_probs[64 * LAYERS * J];
static int on_route(void *ctx, const fmoe_route_event *ev) {
    (void)ctx;
    if (ev->layer < 0 || ev->layer >= LAYERS || ev->num_tokens < 1) route_errors++;
    int seen[J] = {0}, order[J], n_order = 0;
    for (int32_t t = 0; t < ev->num_tokens; t++)
        for (int k = 0; k < K; k++) {
            const int e = ev->chosen[t * ev->chosen_stride + k];
            if (e >= J) route_errors++;
            else if (!seen[e]++) order[n_order++] = e;
        }
    if (ev->num_distinct != n_order) route_errors++;
    for (int j = 0; j < J; j++) /* the per-expert token counts are the chosen rows' */
        if (ev->tokens[j] != seen[j]) route_errors++;
    for (int q = 0; q < n_order && q < ev->num_distinct; q++)
        if (ev->distinct[q] != order[q]) route_errors++; /* first appearance, not index order */
    for (int32_t t = 0; t < ev->num_tokens && t < 64; t++)
        memcpy(route_probs + (t * LAYERS + ev->layer) * J, ev->probs + t * ev->probs_stride,
               J * sizeof(float));
    if (ev->speculative_depth != 1 || !ev->speculative) route_errors++;
    routes_seen += ev->num_tokens;
    return ev->layer == route_fail_at ? FMOE_EIO : 0;
}

TEST(session_limits_and_trace) {
    char d[512];
    write_model(d, sizeof d, "mixtral", "F32", NULL, NULL, NULL, 0);
    fmoe_model *m;
    ASSERT_OK(fmoe_model_load(d, NULL, &m));
    fmoe_session_options o = fmoe_session_defaults();
    o.max_context = 8;
    o.speculative_depth = 1;
    o.on_route = on_route;
    fmoe_session *s;
    ASSERT_OK(fmoe_session_init(m, &o, &s));
    int32_t tok[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    float logits[V];
    ASSERT_EQ(fmoe_session_forward(s, tok, 9, NULL, logits), FMOE_ERANGE);
    ASSERT_CONTAINS(fmoe_error_detail(), "exceed the context of 8 positions");
    ASSERT_EQ(fmoe_session_position(s), 0);
    int32_t bad = V;
    ASSERT_EQ(fmoe_session_forward(s, &bad, 1, NULL, logits), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "outside the vocabulary");
    ASSERT_EQ(fmoe_session_forward(s, tok, 0, NULL, logits), FMOE_EINVAL);

    uint16_t experts[4 * LAYERS * K];
    float weights[4 * LAYERS * K], probs[4 * LAYERS * J], sem[4 * H], hid[4 * LAYERS * H];
    float spec[4 * LAYERS * 1 * J];
    double secs[LAYERS] = {0, 0};
    fmoe_forward_trace tr = {experts, weights, probs, sem, spec, hid, secs};
    routes_seen = 0;
    ASSERT_OK(fmoe_session_forward(s, tok, 4, &tr, logits));
    ASSERT_EQ(fmoe_session_position(s), 4);
    ASSERT_EQ(routes_seen, 4 * LAYERS);
    ASSERT_EQ(route_errors, 0);
    ASSERT_TRUE(memcmp(route_probs, probs, sizeof probs) == 0); /* the hook's probs are the trace's */
    ASSERT_TRUE(secs[0] > 0 && secs[1] > 0);
    for (int t = 0; t < 4; t++)
        for (int l = 0; l < LAYERS; l++) {
            const float *p = probs + (t * LAYERS + l) * J;
            double sum = 0;
            for (int j = 0; j < J; j++) sum += p[j];
            ASSERT_NEAR(sum, 1, 1e-5);
            const uint16_t *e = experts + (t * LAYERS + l) * K;
            const float *w = weights + (t * LAYERS + l) * K;
            ASSERT_TRUE(p[e[0]] >= p[e[1]]);
            for (int j = 0; j < J; j++) /* the chosen two are the largest */
                if (j != e[0] && j != e[1]) ASSERT_TRUE(p[j] <= p[e[1]]);
            ASSERT_NEAR(w[0], p[e[0]] / (p[e[0]] + p[e[1]]), 1e-6); /* mixtral renormalises */
            const float *sp = spec + (t * LAYERS + l) * J;
            double ssum = 0;
            for (int j = 0; j < J; j++) ssum += sp[j];
            ASSERT_NEAR(ssum, l + 1 < LAYERS ? 1 : 0, 1e-5);
        }
    /* The semantic embedding is the embedding row: a bf16-free f32 checkpoint row. */
    ASSERT_TRUE(sem[0] != 0 && hid[0] != 0);
    fmoe_session_reset(s);
    ASSERT_EQ(fmoe_session_position(s), 0);
    ASSERT_OK(fmoe_session_forward(s, tok, 8, NULL, logits));
    /* A hook's error stops the call and is its result. */
    fmoe_session_reset(s);
    route_fail_at = 1;
    ASSERT_EQ(fmoe_session_forward(s, tok, 2, NULL, logits), FMOE_EIO);
    route_fail_at = -1;
    fmoe_session_free(s);
    fmoe_session_free(NULL);

    o = fmoe_session_defaults();
    o.speculative_depth = LAYERS + 1;
    ASSERT_EQ(fmoe_session_init(m, &o, &s), FMOE_EINVAL);
    fmoe_model_free(m);
    remove_tree(d);
}

/* The expert hooks: weights an executor supplies (copies of the model's, as a cache slot
 * holds them) give the model's logits bit for bit; every expert the router chose is asked
 * for once per layer and chunk, in first-appearance order, and released after it ran. */
typedef struct expert_hook_state {
    const fmoe_model *m;
    uint8_t *copy[J][3];
    int asked, done, open, in_order_errors, own;
    int last_layer, last_pos;
} expert_hook_state;

static int on_expert(void *ctx, int32_t l, int32_t j, fmoe_expert_view *w) {
    expert_hook_state *st = ctx;
    st->asked++;
    if (st->open != 0) st->in_order_errors++; /* the previous expert was not released */
    st->open = 1;
    if (l == 1 && j % 2) { /* odd experts of layer 1 run from the model's own weights */
        st->own++;
        return 1;
    }
    fmoe_expert_tensors t;
    if (fmoe_model_expert_tensors(st->m, l, j, &t) < 0) return FMOE_EINVAL;
    const fmoe_expert_tensor *src[3] = {&t.gate, &t.up, &t.down};
    fmoe_matrix_view *dst[3] = {&w->gate, &w->up, &w->down};
    for (int i = 0; i < 3; i++) {
        const size_t bytes = (size_t)(src[i]->view.rows * src[i]->view.cols *
                                      fmoe_st_dtype_size(src[i]->view.dtype));
        memcpy(st->copy[j][i], src[i]->view.data, bytes);
        *dst[i] = src[i]->view;
        dst[i]->data = st->copy[j][i];
    }
    return 0;
}

static void on_expert_done(void *ctx, int32_t l, int32_t j) {
    (void)l;
    (void)j;
    expert_hook_state *st = ctx;
    st->done++;
    st->open = 0;
}

static int route_count_only(void *ctx, const fmoe_route_event *ev) {
    (void)ctx;
    routes_seen += ev->num_distinct;
    return 0;
}

TEST(expert_hooks_supply_weights) {
    char d[512];
    write_model(d, sizeof d, "mixtral", "BF16", NULL, NULL, NULL, 0);
    fmoe_model *m;
    ASSERT_OK(fmoe_model_load(d, NULL, &m));
    int32_t tok[6] = {3, 1, 4, 1, 5, 9};
    float ref[V], got[V];
    fmoe_session *s;
    fmoe_session_options o = fmoe_session_defaults();
    ASSERT_OK(fmoe_session_init(m, &o, &s));
    ASSERT_OK(fmoe_session_forward(s, tok, 6, NULL, ref));
    fmoe_session_free(s);

    expert_hook_state st = {.m = m};
    for (int j = 0; j < J; j++)
        for (int i = 0; i < 3; i++) st.copy[j][i] = calloc(1, 1 << 16);
    o.on_route = route_count_only;
    o.on_expert = on_expert;
    o.on_expert_done = on_expert_done;
    o.route_ctx = &st;
    routes_seen = 0;
    ASSERT_OK(fmoe_session_init(m, &o, &s));
    ASSERT_OK(fmoe_session_forward(s, tok, 6, NULL, got));
    ASSERT_TRUE(memcmp(ref, got, sizeof ref) == 0);
    ASSERT_EQ(st.asked, routes_seen); /* once per distinct expert of each layer */
    ASSERT_EQ(st.done, st.asked);
    ASSERT_EQ(st.in_order_errors, 0);
    ASSERT_TRUE(st.own > 0);

    fmoe_expert_tensors t;
    ASSERT_OK(fmoe_model_expert_tensors(m, 1, J - 1, &t));
    ASSERT_TRUE(t.gate.file != NULL && strstr(t.gate.file, "safetensors") != NULL);
    ASSERT_TRUE(t.down.offset > t.gate.offset || t.down.file != t.gate.file ||
                t.down.offset != t.gate.offset);
    ASSERT_EQ(fmoe_model_expert_tensors(m, LAYERS, 0, &t), FMOE_EINVAL);
    fmoe_session_free(s);
    for (int j = 0; j < J; j++)
        for (int i = 0; i < 3; i++) free(st.copy[j][i]);
    fmoe_model_free(m);
    remove_tree(d);
}

/* The bytes fmoe_model_expert_tensors points a file tier at are the expert's bytes. */
TEST(expert_tensors_file_offsets) {
    char d[512];
    write_model(d, sizeof d, "mixtral", "F16", NULL, NULL, NULL, 0);
    fmoe_model *m;
    ASSERT_OK(fmoe_model_load(d, NULL, &m));
    for (int l = 0; l < LAYERS; l++)
        for (int j = 0; j < J; j++) {
            fmoe_expert_tensors t;
            ASSERT_OK(fmoe_model_expert_tensors(m, l, j, &t));
            const fmoe_expert_tensor *mats[3] = {&t.gate, &t.up, &t.down};
            for (int i = 0; i < 3; i++) {
                const size_t bytes = (size_t)(mats[i]->view.rows * mats[i]->view.cols * 2);
                uint8_t buf[1 << 14];
                ASSERT_TRUE(bytes <= sizeof buf);
                FILE *f = fopen(mats[i]->file, "rb");
                ASSERT_TRUE(f != NULL);
                ASSERT_EQ(fseek(f, (long)mats[i]->offset, SEEK_SET), 0);
                ASSERT_EQ(fread(buf, 1, bytes, f), bytes);
                fclose(f);
                ASSERT_TRUE(memcmp(buf, mats[i]->view.data, bytes) == 0);
            }
        }
    fmoe_model_free(m);
    remove_tree(d);
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
