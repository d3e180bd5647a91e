/*
 * test_expert_tier - the file tier's reads (runtime/offload/expert_tier.c) split into
 * segments several requests deep (lib/preader.h), on a tiny Mixtral written here whose
 * experts are large enough to be split (three F32 matrices of 1 MiB each).
 *
 * Checked: at depth 1 and 4, with and without O_DIRECT, byte ranges of experts (whole,
 * starting and ending off the 4096 alignment, spanning two matrices, the copy engine's
 * four pieces) land in the slot exactly where fmoe__expert_tier_ranges says, equal to the
 * model's own tensors; the bounce-buffer path (a file whose matrices are not aligned for
 * their dtype) reads the same bytes; an EIO injected into one segment fails the whole read
 * with a one-line error naming the file; the reader's own contract (segments over several
 * extents, the file's end, a failing segment among good ones).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "expert_tier.h"
#include "fmoe/error.h"
#include "fmoe/model.h"
#include "harness.h"
#include "preader.h"
#include "st_writer.h"

enum { V = 48, H = 256, I = 1024, J = 4, K = 2, LAYERS = 2, HEADS = 2, KVH = 1, D = 8 };

static uint64_t rng = 1;
static float frand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) * 0x1.0p-24) * 2.0f - 1.0f;
}

/* A tiny Mixtral with F32 experts of 3 MiB; `misalign` pads the header by one byte so no
 * F32 matrix sits on a 4-byte boundary (the tier's bounce path under O_DIRECT). */
static void write_model(char *out, size_t cap, int misalign) {
    make_tmpdir(out, cap, "tier");
    char path[1024], cfg[1024];
    snprintf(cfg, sizeof cfg,
             "{\"model_type\": \"mixtral\", \"vocab_size\": %d, \"hidden_size\": %d,"
             " \"intermediate_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d,"
             " \"num_key_value_heads\": %d, \"num_local_experts\": %d,"
             " \"num_experts_per_tok\": %d, \"max_position_embeddings\": 64,"
             " \"head_dim\": %d, \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0}",
             V, H, I, LAYERS, HEADS, KVH, J, K, D);
    snprintf(path, sizeof path, "%s/config.json", out);
    write_text(path, cfg);
    rng = 1;
    st_builder b;
    stb_init(&b);
    float *buf = malloc(sizeof(float) * I * H);
    char name[256];
#define ADD(rows, cols, ...)                                                               \
    do {                                                                                   \
        snprintf(name, sizeof name, __VA_ARGS__);                                          \
        const int64_t r_ = (rows), c_ = (cols) ? (cols) : 1;                               \
        for (int64_t i_ = 0; i_ < r_ * c_; i_++) buf[i_] = (cols) ? 0.5f * frand() : 1.0f; \
        if ((cols) == 0)                                                                   \
            stb_add_f(&b, name, "F32", 1, (int64_t[]){r_}, buf);                           \
        else                                                                               \
            stb_add_f(&b, name, "F32", 2, (int64_t[]){r_, c_}, buf);                       \
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

/* Expert (l, j)'s bytes as the model holds them: gate, up, down concatenated. */
static uint8_t *expert_bytes(const fmoe_model *m, int32_t l, int32_t j, int64_t *bytes) {
    fmoe_expert_tensors x;
    if (fmoe_model_expert_tensors(m, l, j, &x) < 0) return NULL;
    const fmoe_matrix_view *v[3] = {&x.gate.view, &x.up.view, &x.down.view};
    int64_t n = 0;
    for (int i = 0; i < 3; i++) n += fmoe_matrix_view_bytes(v[i]);
    uint8_t *p = malloc((size_t)n);
    int64_t at = 0;
    for (int i = 0; i < 3; i++) {
        memcpy(p + at, v[i]->data, (size_t)fmoe_matrix_view_bytes(v[i]));
        at += fmoe_matrix_view_bytes(v[i]);
    }
    *bytes = n;
    return p;
}

/* The ranges each read checks: whole, off the alignment at both ends, across gate and
 * up, inside one matrix, the last bytes, and the copy engine's four pieces. */
typedef struct range {
    int64_t lo, hi;
} range;

static int32_t test_ranges(int64_t eb, range *r) {
    const int64_t mat = eb / 3, step = (eb + 3) / 4;
    int32_t n = 0;
    r[n++] = (range){0, eb};
    r[n++] = (range){1000, 1000 + 700001};
    r[n++] = (range){mat - 5000, mat + 300123};        /* gate's end into up */
    r[n++] = (range){mat - 77, 2 * mat + 4099};        /* all three matrices */
    r[n++] = (range){12345, 12345 + 4096};              /* one segment, unaligned */
    r[n++] = (range){eb - 3, eb};
    for (int64_t k = 0; k < 4; k++)
        r[n++] = (range){k * step, (k + 1) * step < eb ? (k + 1) * step : eb};
    return n;
}

/* Reads every test range of every expert through a tier of `depth` and compares. */
static void check_reads(int *harness_failed, const fmoe_model *m, int direct, int32_t depth,
                        const char *what) {
    fmoe_expert_tier *t = NULL;
    const int rc = fmoe__expert_tier_open(&t, m, FMOE_TIER_FILE, direct, depth);
    if (rc == FMOE_EIO && direct) { /* a file system without O_DIRECT */
        fprintf(stderr, "  (%s: %s: skipped)\n", what, fmoe_error_detail());
        return;
    }
    ASSERT_EQ(rc, 0);
    const int64_t slot_bytes = fmoe__expert_tier_slot_bytes(t);
    uint8_t *slot = aligned_alloc(4096, (size_t)slot_bytes);
    range r[16];
    for (int32_t l = 0; l < LAYERS; l++)
        for (int32_t j = 0; j < J; j++) {
            int64_t eb = 0;
            uint8_t *want = expert_bytes(m, l, j, &eb);
            ASSERT_TRUE(want != NULL);
            ASSERT_EQ(eb, fmoe__expert_tier_layer_bytes(t, l));
            const int32_t nr = test_ranges(eb, r);
            for (int32_t k = 0; k < nr; k++) {
                memset(slot, 0xA5, (size_t)slot_bytes);
                const int64_t lo = r[k].lo, n = r[k].hi - r[k].lo;
                if (fmoe__expert_tier_read(t, l, j, lo, n, slot) != 0)
                    HARNESS_FAIL("%s: expert (%d, %d) [%lld, %lld): %s", what, l, j,
                                 (long long)lo, (long long)r[k].hi, fmoe_error_detail());
                fmoe__tier_range run[3];
                const int32_t nrun = fmoe__expert_tier_ranges(t, l, j, lo, n, run);
                int64_t covered = 0;
                for (int32_t i = 0; i < nrun; i++) {
                    if (memcmp(slot + run[i].slot_offset, want + run[i].offset,
                               (size_t)run[i].bytes) != 0)
                        HARNESS_FAIL("%s: expert (%d, %d) [%lld, %lld): run %d differs", what,
                                     l, j, (long long)lo, (long long)r[k].hi, i);
                    covered += run[i].bytes;
                }
                ASSERT_EQ(covered, n);
            }
            /* the whole expert through the view, as the forward pass sees it */
            memset(slot, 0x5A, (size_t)slot_bytes);
            ASSERT_EQ(fmoe__expert_tier_read(t, l, j, 0, eb, slot), 0);
            fmoe_expert_view v;
            fmoe__expert_tier_view(t, l, j, slot, &v);
            const int64_t mb = eb / 3;
            ASSERT_TRUE(memcmp(v.gate.data, want, (size_t)mb) == 0);
            ASSERT_TRUE(memcmp(v.up.data, want + mb, (size_t)mb) == 0);
            ASSERT_TRUE(memcmp(v.down.data, want + 2 * mb, (size_t)mb) == 0);
            free(want);
        }
    free(slot);
    fmoe__expert_tier_close(t);
}

static fmoe_model *load(int *harness_failed, const char *dir) {
    fmoe_model *m = NULL;
    const int rc = fmoe_model_load(dir, NULL, &m);
    if (rc != 0) HARNESS_FAIL("load %s: %s", dir, fmoe_error_detail());
    return m;
}

TEST(tier_reads_at_each_depth_match_the_model) {
    char d[512];
    write_model(d, sizeof d, 0);
    fmoe_model *m = load(harness_failed, d);
    check_reads(harness_failed, m, 0, 1, "pread, depth 1");
    check_reads(harness_failed, m, 0, 4, "pread, depth 4");
    check_reads(harness_failed, m, 1, 1, "O_DIRECT in place, depth 1");
    check_reads(harness_failed, m, 1, 4, "O_DIRECT in place, depth 4");
    check_reads(harness_failed, m, 1, 3, "O_DIRECT in place, depth 3");
    fmoe_model_free(m);
    remove_tree(d);
}

TEST(tier_bounce_path_at_depth_4) {
    char d[512];
    write_model(d, sizeof d, 1);
    fmoe_model *m = load(harness_failed, d);
    check_reads(harness_failed, m, 1, 4, "O_DIRECT bounce, depth 4");
    check_reads(harness_failed, m, 0, 4, "pread misaligned, depth 4");
    fmoe_model_free(m);
    remove_tree(d);
}

/* An EIO in one segment fails the whole read, named, on one line; the next read (no
 * fault left) still works. */
static void check_segment_eio(int *harness_failed, const fmoe_model *m, int direct,
                              int32_t depth) {
    setenv("FMOE_FAULT_READ_EIO_SEGMENT", "2", 1);
    fmoe_expert_tier *t = NULL;
    const int rc = fmoe__expert_tier_open(&t, m, FMOE_TIER_FILE, direct, depth);
    unsetenv("FMOE_FAULT_READ_EIO_SEGMENT");
    if (rc == FMOE_EIO && direct) return;
    ASSERT_EQ(rc, 0);
    uint8_t *slot = aligned_alloc(4096, (size_t)fmoe__expert_tier_slot_bytes(t));
    const int64_t eb = fmoe__expert_tier_layer_bytes(t, 1);
    ASSERT_EQ(fmoe__expert_tier_read(t, 1, 2, 0, eb, slot), FMOE_EIO);
    const char *e = fmoe_error_detail();
    ASSERT_CONTAINS(e, "model.safetensors: read at ");
    ASSERT_CONTAINS(e, strerror(EIO));
    ASSERT_TRUE(strchr(e, '\n') == NULL);
    /* a read of one segment only (index 0) is not hit */
    ASSERT_EQ(fmoe__expert_tier_read(t, 1, 2, 4096, 8192, slot), 0);
    free(slot);
    fmoe__expert_tier_close(t);
}

TEST(tier_eio_in_one_segment_fails_the_read) {
    char d[512];
    write_model(d, sizeof d, 0);
    fmoe_model *m = load(harness_failed, d);
    check_segment_eio(harness_failed, m, 0, 4);
    check_segment_eio(harness_failed, m, 1, 4);
    check_segment_eio(harness_failed, m, 1, 1);
    fmoe_model_free(m);
    remove_tree(d);
}

TEST(tier_read_depth_out_of_range) {
    char d[512];
    write_model(d, sizeof d, 0);
    fmoe_model *m = load(harness_failed, d);
    fmoe_expert_tier *t = NULL;
    ASSERT_EQ(fmoe__expert_tier_open(&t, m, FMOE_TIER_FILE, 0, FMOE_PREADER_MAX_DEPTH + 1),
              FMOE_EINVAL);
    ASSERT_TRUE(t == NULL);
    /* the host tier starts no reader, whatever the depth */
    ASSERT_EQ(fmoe__expert_tier_open(&t, m, FMOE_TIER_HOST, 0, 8), 0);
    fmoe__expert_tier_close(t);
    fmoe_model_free(m);
    remove_tree(d);
}

/* The reader alone: extents of one file at several depths, the file's end inside the
 * last, a failing segment among good ones. */
TEST(preader_extents_eof_and_errors) {
    char d[512], path[600];
    make_tmpdir(d, sizeof d, "preader");
    snprintf(path, sizeof path, "%s/data", d);
    const int64_t size = 3 * (1 << 20) + 123;
    uint8_t *data = malloc((size_t)size);
    for (int64_t i = 0; i < size; i++) data[i] = (uint8_t)(i * 2654435761u >> 13);
    FILE *f = fopen(path, "wb");
    ASSERT_TRUE(f && fwrite(data, 1, (size_t)size, f) == (size_t)size && fclose(f) == 0);
    const int fd = open(path, O_RDONLY);
    ASSERT_TRUE(fd >= 0);
    uint8_t *dst = malloc((size_t)size + 8192);
    for (int32_t depth = 1; depth <= 8; depth *= 2) {
        fmoe__preader *p = NULL;
        ASSERT_EQ(fmoe__preader_open(&p, depth), 0);
        ASSERT_EQ(fmoe__preader_depth(p), depth);
        /* three extents, out of order in the file, one of them up to the end */
        memset(dst, 0, (size_t)size);
        fmoe__pread_extent x[3] = {
            {.fd = fd, .offset = 1 << 20, .bytes = size - (1 << 20), .dst = dst + (1 << 20)},
            {.fd = fd, .offset = 7, .bytes = 600000, .dst = dst + 7},
            {.fd = fd, .offset = 600007, .bytes = (1 << 20) - 600007, .dst = dst + 600007}};
        ASSERT_EQ(fmoe__preader_read(p, x, 3, 1), 0);
        ASSERT_TRUE(memcmp(dst + 7, data + 7, (size_t)(size - 7)) == 0);
        for (int i = 0; i < 3; i++) ASSERT_EQ(x[i].got, x[i].bytes);
        /* past the end: got stops there, no error */
        fmoe__pread_extent e = {.fd = fd, .offset = size - 700000, .bytes = 2000000,
                                .dst = dst};
        ASSERT_EQ(fmoe__preader_read(p, &e, 1, 1), -1);
        ASSERT_EQ(e.got, 700000);
        ASSERT_EQ(e.err, 0);
        ASSERT_TRUE(memcmp(dst, data + size - 700000, 700000) == 0);
        /* segment 1 fails: the extent's got stops at its start, err is EIO there */
        fmoe__preader_inject_eio(p, 1);
        fmoe__pread_extent g = {.fd = fd, .offset = 0, .bytes = size, .dst = dst};
        ASSERT_EQ(fmoe__preader_read(p, &g, 1, 1), depth == 1 ? 0 : -1);
        const int64_t seg = g.got; /* the first segment's length */
        if (depth == 1) {
            ASSERT_EQ(g.got, size); /* one segment: index 1 never exists */
            ASSERT_EQ(g.err, 0);
        } else {
            ASSERT_TRUE(seg >= FMOE_PREADER_MIN_SEGMENT && seg < size);
            ASSERT_EQ(g.err, EIO);
            ASSERT_EQ(g.err_at, seg);
        }
        fmoe__preader_close(p);
    }
    fmoe__preader *p = NULL;
    ASSERT_EQ(fmoe__preader_open(&p, 0), FMOE_EINVAL);
    close(fd);
    free(dst);
    free(data);
    remove_tree(d);
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
