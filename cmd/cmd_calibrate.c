/*
 * cmd_calibrate.c - `fmoe calibrate`: measure this machine into a hardware profile that
 * `fmoe simulate --profile` reads (docs/design.md §7; format in docs/formats/hardware-profile.md).
 *
 * defaults -> parse -> model shapes -> measure -> fit -> report (stderr) -> profile JSON
 * (-o FILE, written to a temporary name and renamed; or stdout).
 *
 * Measured: copies across sizes RAM->RAM (memcpy) and file->RAM (pread with the page cache
 * dropped: a model file larger than RAM), and on a CUDA machine pinned host->device
 * cudaMemcpyAsync; compute at the model's shapes through the backend's own function table,
 * as a live pass runs it (runtime/model/backend_bench.c): an expert from backend memory as
 * forward.c computes it (gather, three products, SwiGLU, scatter, the wait after a device
 * slot), a layer's products (attention projections, router, shared experts), the backend's
 * attention over a context, the LM head, and a MoE layer's other ops and waits (norms,
 * RoPE, KV writes, top-k, the routing read back to the host): the CPU backend's always
 * (the host lane), the CUDA backend's too with --backend cuda.
 * And the fMoE matcher (one thread): the trajectory search of a decode token over a
 * 1000-entry store of the model's MoE layers x experts, per layer: matcher.match_s, the
 * delay `simulate` gives the fmoe policies' prefetches.
 * Fitted by least squares (relative error): copy = alpha + bytes / beta, expert = base +
 * per_token * n, layer = base + per_token * n + per_token_context * n * c, layer overhead =
 * base + per_token * n; every fit's
 * error is reported and stored in the profile's "calibration" record with the points.
 *
 * --backend decides whose compute the profile holds, as it decides where generate, record
 * and serve compute: cuda measures the device (pinned host->device copies, its ops' curves)
 * and makes its figures the profile's link and compute, and needs a device; cpu measures
 * no GPU and the CPU's figures are the profile's compute, file->RAM its link; auto (the
 * default) is cuda when the CUDA module loads and sees a device, else cpu. --link chooses
 * another link (h2d only with the cuda backend). "host" is always the CPU (the lane
 * `simulate --miss cpu` uses). --activations (auto: q8 on the cpu backend, f32 on cuda)
 * times the CPU's quantized products with 8-bit or f32 inputs, as generate, record and
 * serve compute with the same value (a different speed: the profile must be of the run it
 * predicts), and the resolved value is recorded in the calibration record; like theirs, an
 * explicit q8 needs the cpu backend.
 */
#include <cblas.h>
#include <errno.h>
#include <cjson/cJSON.h>
#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend_cli.h"
#include "calibrate_link.h"
#include "cmd_common.h"
#include "paths.h"
#include "fmoe/cuda.h"
#include "fmoe/error.h"
#include "files.h"
#include "preader.h"
#include "fmoe/geometry.h"
#include "fmoe/gguf.h"
#include "fmoe/hardware.h"
#include "fmoe/model.h"
#include "fmoe/predictor.h"
#include "fmoe_config.h"

int cmd_calibrate(int argc, char **argv);

static const char *const CMD = "calibrate";

#define MAXPTS 16
#define MATCHER_STORE 1000 /* entries of the store the matcher is timed on (fMoE §6.6) */

typedef struct options {
    const char *output, *model_config, *name, *file_dir;
    const char *link_file; /* --link-file: time O_DIRECT reads of this file instead */
    const char *base;      /* --base: measure the link only, the rest copied from this */
    const char *link;   /* auto|h2d|file|ram */
    int32_t link_index; /* in link_names */
    const char *backend; /* --backend cpu|cuda|auto */
    int32_t activations; /* --activations: fmoe_activations, as the run will compute */
    int32_t threads;
    int32_t read_depth; /* --read-depth: the file link's requests in flight, as live runs' */
    double link_decode_gb; /* --link-decode-gb: the file link timed in an offloaded decode */
    int quick, quiet;
} options;

/* The non-expert matrices of a layer (layer_mats): q, k, v, o, router, shared expert (3). */
#define LAYER_MATS 8

typedef struct shapes {
    int32_t hidden, ffn, heads, kv_heads, head_dim, experts, shared_ffn;
    int32_t vocab;         /* the LM head's rows */
    int32_t layers, top_k; /* MoE layers and experts per token: the matcher's maps */
    fmoe_dtype dtype;        /* the checkpoint's: the CPU kernels are timed on it */
    fmoe_dtype expert_dtype; /* its routed experts' (a GGUF's q4_k, ...): the expert chain's */
    /* Each layer matrix's type (layer_mats' order) and the LM head's: a GGUF file's own,
     * which a llama-quantize mix chooses per matrix (Q4_K_M: q4_k projections, q6_k
     * values in some layers, f32 routers, a q6_k head), else dtype. Products at bf16 cost
     * three to four times those of the 4-bit blocks a GGUF holds, so timing the layer at
     * the config's dtype overstated a quantized model's decode step. */
    fmoe_dtype layer_dtype[LAYER_MATS];
    fmoe_dtype head_dtype;
    char model[192];
} shapes;

/* A measured series and its fit. */
typedef struct series {
    char what[96];
    char ops[16]; /* a compute series: the backend table it was timed through ("cpu") */
    int32_t n;
    double x[MAXPTS], x2[MAXPTS], y[MAXPTS];
    fmoe_linear_fit fit;
    int ok;
    int throughput_only; /* a link series whose fit did not grow with size: see fit_link */
} series;

/* ------------------------------------------------------------------ parsing */

static const char *const link_names[] = {"auto", "h2d", "file", "ram", NULL};

static const cmd_option calibrate_options[] = {
    {.name = "output", .short_name = 'o', .kind = CMD_OPT_STRING, .io = CMD_IO_OUTPUT,
     .value_name = "FILE",
     .help = "write the profile to FILE", .default_text = "stdout",
     .offset = offsetof(options, output)},
    {.name = "model-config", .kind = CMD_OPT_STRING, .io = CMD_IO_INPUT, .value_name = "FILE",
     .help = "measure at this model's shapes (HF config.json)",
     .default_text = "Mixtral-8x7B's: hidden 4096, expert 14336, 32 heads, 8 KV",
     .offset = offsetof(options, model_config)},
    {.name = "name", .kind = CMD_OPT_STRING, .io = CMD_IO_TEXT,
     .value_name = "NAME", .help = "the profile's name",
     .default_text = "calibrated-<hostname>", .offset = offsetof(options, name)},
    CMD_BACKEND_OPTION(options, backend),
    CMD_ACTIVATIONS_OPTION(options, activations),
    {.name = "link", .kind = CMD_OPT_ENUM, .value_name = "auto|h2d|file|ram",
     .help = "which copy is the profile's link (auto: host->device with the cuda backend, "
             "else file->RAM)",
     .default_text = "auto", .offset = offsetof(options, link_index), .choices = link_names},
    {.name = "file-dir", .kind = CMD_OPT_STRING, .io = CMD_IO_OUTPUT_DIR, .value_name = "DIR",
     .help = "where the file->RAM test writes its scratch file; use the disk your models "
             "live on",
     .default_text = "$TMPDIR or /tmp", .offset = offsetof(options, file_dir)},
    {.name = "link-file", .kind = CMD_OPT_STRING, .io = CMD_IO_INPUT, .value_name = "FILE",
     .help = "time the file link on FILE with O_DIRECT instead of a scratch file: a model "
             "(a GGUF file or a model directory) on its own experts, read as --tier file "
             "--direct-io reads them; any other file on reads of its bytes",
     .offset = offsetof(options, link_file)},
    {.name = "base", .kind = CMD_OPT_STRING, .io = CMD_IO_INPUT, .value_name = "PROFILE",
     .help = "measure the link only, in seconds: write PROFILE (a profile) with its link "
             "replaced by this measurement and every other figure kept, to re-measure a "
             "disk whose speed drifts just before a simulation",
     .offset = offsetof(options, base)},
    {.name = "read-depth", .kind = CMD_OPT_INT32, .value_name = "N",
     .help = "file link: requests in flight per read, each read split into segments of at "
             "least 256 KiB, as a live run's --read-depth N reads the file tier; give the "
             "value those runs are given",
     .default_text = "4, the live runs' default", .offset = offsetof(options, read_depth),
     .min = 1, .max = 64},
    {.name = "link-decode-gb", .kind = CMD_OPT_DOUBLE, .value_name = "X",
     .help = "with --link-file MODEL: the profile's link is the one a decode of MODEL "
             "offloaded from its file sees, with X GiB of expert slots (--cache-gb X --tier "
             "file --direct-io, lru, --threads' compute beside the reads): the copy engine's "
             "bytes over its busy seconds, alpha 0. Give the --cache-gb of the runs it is to "
             "predict. The reads on an idle CPU are still measured and recorded",
     .offset = offsetof(options, link_decode_gb), .fmin = 0, .fmax = 1e6},
    {.name = "threads", .kind = CMD_OPT_INT32, .value_name = "N",
     .help = "OpenBLAS threads, and the compute threads of --link-decode-gb's decode",
     .default_text = "OpenBLAS's, all cores", .offset = offsetof(options, threads), .min = 1,
     .max = 1024},
    {.name = "quick", .kind = CMD_OPT_FLAG,
     .help = "small shapes and sizes, one second (for tests)", .offset = offsetof(options, quick)},
    {.name = "quiet", .kind = CMD_OPT_FLAG, .help = "no report on stderr",
     .offset = offsetof(options, quiet)},
    {0},
};

const cmd_spec cmd_calibrate_spec = {
    .name = "calibrate",
    .usage = "calibrate [-o profile.json] [options]",
    .description =
        "Measure this machine's copy bandwidth and latency and its compute at a model's\n"
        "expert and attention shapes, and the fMoE matcher's time per match at its\n"
        "MoE layers x experts (1000-entry store, one thread); fit the simulator's cost\n"
        "model to them and write a hardware profile for 'fmoe simulate --profile'.\n"
        "The profile's compute is the --backend's own ops, timed as a live pass runs them\n"
        "(the CUDA backend's on the device, or the CPU backend's), with the per-layer\n"
        "overhead of its small ops and host waits. Takes under 20 s by default.\n",
    .options = calibrate_options,
    .epilog =
        "The report gives each fit as alpha/beta or base/per-token with its error (root\n"
        "mean square and largest relative error over the measured points): a large error\n"
        "means the linear model the simulator uses does not describe this machine well\n"
        "over that range.\n",
    .size = sizeof(options),
};

static int parse_options(int argc, char **argv, options *o) {
    int rc = cmd_options_parse(&cmd_calibrate_spec, o, argc, argv, NULL);
    if (rc) return rc;
    o->link = link_names[o->link_index];
    if (o->link_file && o->link_index != 0 && strcmp(o->link, "file") != 0)
        return cmd_usage_error(CMD, "--link-file times the file link: not with --link %s",
                               o->link);
    if (o->link_file && o->link_index == 0) o->link = "file"; /* what it was given for */
    if (strcmp(o->link, "h2d") == 0 && o->backend && strcmp(o->backend, "cpu") == 0)
        return cmd_usage_error(CMD, "--link h2d is the cuda backend's link: not with "
                                    "--backend cpu");
    if (o->link_decode_gb > 0 && !(o->link_file && calibrate_link_is_model(o->link_file)))
        return cmd_usage_error(CMD, "--link-decode-gb times a decode of the model: give the "
                                    "model with --link-file MODEL");
    if (o->link_decode_gb > 0 && strcmp(o->link, "file") != 0)
        return cmd_usage_error(CMD, "--link-decode-gb measures the file link: not with --link %s",
                               o->link);
    if (!o->file_dir) o->file_dir = getenv("TMPDIR") && getenv("TMPDIR")[0] ? getenv("TMPDIR")
                                                                             : "/tmp";
    return 0;
}

/* The type most of the MoE layers store tensor blk.<l>.<role>.weight in, into *out; left
 * as it is when no layer has the tensor or its type has no fmoe dtype. */
static void gguf_role_dtype(const fmoe_gguf *g, const fmoe_model_geometry *geo,
                            const char *role, fmoe_dtype *out) {
    int32_t count[FMOE_DTYPE_LAST + 1] = {0};
    for (int32_t i = 0; i < geo->num_moe_layers; i++) {
        char name[96];
        snprintf(name, sizeof name, "blk.%d.%s.weight", geo->moe_layer_index[i], role);
        const fmoe_gguf_tensor *t = fmoe_gguf_find_tensor(g, name);
        fmoe_dtype d;
        if (t && fmoe_dtype_of_ggml_type(t->type, &d) == 0 && d <= FMOE_DTYPE_LAST) count[d]++;
    }
    int32_t best = -1;
    for (int32_t d = 0; d <= FMOE_DTYPE_LAST; d++)
        if (count[d] > 0 && (best < 0 || count[d] > count[best])) best = d;
    if (best >= 0) *out = (fmoe_dtype)best;
}

/* A GGUF --model-config: each layer matrix's and the LM head's type as the file stores
 * them (shapes.layer_dtype). Not a GGUF (a config.json): nothing to do. */
static int gguf_matrix_dtypes(const char *path, const fmoe_model_geometry *geo, shapes *s) {
    if (!fmoe_gguf_is_file(path)) return 0;
    fmoe_gguf *g = NULL;
    FMOE_FORWARD_IF_ERROR(fmoe_gguf_open(path, &g));
    /* layer_mats' order */
    static const char *const roles[LAYER_MATS] = {
        "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_inp",
        "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"};
    for (int32_t i = 0; i < LAYER_MATS; i++) gguf_role_dtype(g, geo, roles[i], &s->layer_dtype[i]);
    /* the head: output.weight, or the embeddings it is tied to */
    const fmoe_gguf_tensor *h = fmoe_gguf_find_tensor(g, "output.weight");
    if (!h) h = fmoe_gguf_find_tensor(g, "token_embd.weight");
    if (h) (void)fmoe_dtype_of_ggml_type(h->type, &s->head_dtype);
    fmoe_gguf_close(g);
    return 0;
}

static int load_shapes(const options *o, shapes *s) {
    *s = (shapes){.hidden = 4096, .ffn = 14336, .heads = 32, .kv_heads = 8, .head_dim = 128,
                  .experts = 8, .shared_ffn = 0, .vocab = 32000, .layers = 32, .top_k = 2,
                  .dtype = FMOE_DTYPE_BF16, .expert_dtype = FMOE_DTYPE_BF16};
    snprintf(s->model, sizeof s->model, "Mixtral-8x7B shapes (default)");
    fmoe_model_geometry g; /* the --model-config's, read once */
    if (o->model_config) {
        int rc = fmoe_geometry_load(o->model_config, &g);
        if (rc < 0) return rc;
        s->hidden = g.hidden_size;
        s->ffn = g.moe_intermediate_size;
        s->heads = g.num_attention_heads > 0 ? g.num_attention_heads : 1;
        s->kv_heads = g.num_key_value_heads > 0 ? g.num_key_value_heads : s->heads;
        s->head_dim = g.head_dim > 0 ? g.head_dim : s->hidden / s->heads;
        s->experts = g.num_experts;
        s->shared_ffn = g.shared_intermediate_size;
        if (g.vocab_size > 0) s->vocab = (int32_t)g.vocab_size;
        s->layers = g.num_moe_layers > 0 ? g.num_moe_layers : 1;
        s->top_k = g.top_k;
        s->dtype = g.dtype;
        s->expert_dtype = g.expert_dtype;
        snprintf(s->model, sizeof s->model, "%s (%.60s)", g.model_type, o->model_config);
        if (s->heads % s->kv_heads) s->kv_heads = s->heads;
    }
    for (int32_t i = 0; i < LAYER_MATS; i++) s->layer_dtype[i] = s->dtype;
    s->head_dtype = s->dtype;
    if (o->model_config) FMOE_FORWARD_IF_ERROR(gguf_matrix_dtypes(o->model_config, &g, s));
    if (o->quick) { /* an eighth of the widths, so it runs in a blink */
        s->hidden = s->hidden / 8 > 64 ? s->hidden / 8 : 64;
        s->ffn = s->ffn / 8 > 64 ? s->ffn / 8 : 64;
        s->shared_ffn /= 8;
        s->vocab = s->vocab / 8 > 64 ? s->vocab / 8 : 64;
        s->heads = s->heads / 8 > 0 ? s->heads / 8 : 1;
        s->kv_heads = s->kv_heads / 8 > 0 ? s->kv_heads / 8 : 1;
        if (s->heads % s->kv_heads) s->kv_heads = s->heads;
    }
    return 0;
}

/* ------------------------------------------------------------------ measuring */

static void fit_series(series *s) {
    s->ok = s->n >= 2 && fmoe_calibrate_fit(s->x, s->y, s->n, &s->fit) == 0;
    fmoe_error_clear();
}

/* A link: time = alpha + bytes / beta. The fit weighs relative errors, so its small reads
 * count most; when their times are noise (a shared virtual disk, a busy machine) the fitted
 * slope can come out zero or negative, which is no link at all. Then the largest read's
 * throughput is the link (alpha 0), and the profile's calibration record says so, rather
 * than the whole calibration failing on a noisy sample. */
static void fit_link(series *s) {
    fit_series(s);
    if (!s->ok || s->fit.b > 0) return;
    int32_t big = 0;
    for (int32_t i = 1; i < s->n; i++)
        if (s->x[i] > s->x[big]) big = i;
    if (!(s->x[big] > 0 && s->y[big] > 0)) {
        s->ok = 0;
        return;
    }
    s->throughput_only = 1;
    s->fit.a = 0;
    s->fit.b = s->y[big] / s->x[big];
    s->fit.rms_rel = s->fit.max_rel = 0;
    double se = 0;
    for (int32_t i = 0; i < s->n; i++) {
        const double r = fabs(s->fit.b * s->x[i] - s->y[i]) / s->y[i];
        se += r * r;
        if (r > s->fit.max_rel) s->fit.max_rel = r;
    }
    s->fit.rms_rel = sqrt(se / s->n);
}

/* The non-expert matrices of a layer (LAYER_MATS at most): q, k, v, o, router, shared
 * expert (3). */
static int32_t layer_mats(const shapes *s, int32_t *rows, int32_t *cols) {
    const int32_t q = s->heads * s->head_dim, kv = s->kv_heads * s->head_dim, h = s->hidden;
    int32_t m = 0;
    rows[m] = q, cols[m++] = h;
    rows[m] = kv, cols[m++] = h;
    rows[m] = kv, cols[m++] = h;
    rows[m] = h, cols[m++] = q;
    rows[m] = s->experts > 0 ? s->experts : 1, cols[m++] = h;
    if (s->shared_ffn > 0) {
        rows[m] = s->shared_ffn, cols[m++] = h;
        rows[m] = s->shared_ffn, cols[m++] = h;
        rows[m] = h, cols[m++] = s->shared_ffn;
    }
    return m;
}

static double chain_flops(const int32_t *rows, const int32_t *cols, int32_t m) {
    double f = 0;
    for (int32_t i = 0; i < m; i++) f += 2.0 * rows[i] * cols[i];
    return f;
}

typedef struct measurements {
    series ram, file, h2d;
    fmoe_file_cache file_cache;
    int32_t file_expert_reads; /* --link-file MODEL: the file link timed on its experts,
                                  this many reads per point (0: on reads of a file's bytes) */
    series expert_cpu, layer_cpu, attn_cpu, expert_gpu, layer_gpu, attn_gpu;
    series head_cpu, head_gpu; /* the LM head, [vocab x hidden] */
    series over_cpu, over_gpu; /* a MoE layer's other ops and waits (backend_bench.c) */
    double cpu_peak_flops, gpu_peak_flops, gpu_membw;
    double match_s, token_match_s; /* the fMoE matcher: one layer's match, a whole token */
    int32_t promoe_hidden;         /* the ProMoE predictor timed: h -> this -> J */
    double promoe_s;               /* its pass over one token */
    double duoserve_s;             /* DuoServe's ExpertMLP of the default widths, one token */
    int have_gpu; /* the cuda backend: the GPU is measured and its figures are the profile's */
    calibrate_decode_link decode; /* --link-decode-gb: the file link in a decode (tokens > 0) */
} measurements;

/* A series timed through a backend's table (runtime/model/backend_bench.c): "expert (fmoe
 * cpu q4_k)", what was timed with the backend and the kernels' weight formats (each
 * distinct one of dtypes[0..n_dtypes), in order: "layer GEMMs (fmoe cpu q4_k/q6_k/f32)"),
 * and ", activations q8" where the CPU's block kernels took 8-bit inputs; no format for
 * the ops that have none (attention, layer overhead: n_dtypes 0). A format the backends
 * have no kernel for (mxfp4, f8_e4m3) is timed as bf16, and named so. */
static void backend_series(series *s, int32_t n, const char *what, const char *backend,
                           const fmoe_dtype *dtypes, int32_t n_dtypes, int32_t activations) {
    *s = (series){.n = n};
    char formats[64] = "";
    const char *named[LAYER_MATS];
    int32_t n_named = 0, blocks = 0;
    for (int32_t i = 0; i < n_dtypes && n_named < LAYER_MATS; i++) {
        const fmoe_dtype d = dtypes[i];
        const int block = fmoe_dtype_ggml_type(d) != 0;
        const int own = block || d == FMOE_DTYPE_F32 || d == FMOE_DTYPE_F16 ||
                        d == FMOE_DTYPE_BF16;
        const char *name = own ? fmoe_dtype_name(d) : "bf16";
        blocks |= block;
        int seen = 0;
        for (int32_t k = 0; k < n_named; k++) seen |= strcmp(named[k], name) == 0;
        if (seen) continue;
        named[n_named++] = name;
        const size_t len = strlen(formats);
        snprintf(formats + len, sizeof formats - len, "%s%s", len ? "/" : " ", name);
    }
    snprintf(s->what, sizeof s->what, "%s (fmoe %s%s%s)", what, backend, formats,
             blocks && activations == FMOE_ACTIVATIONS_Q8 ? ", activations q8" : "");
}

/* The points every backend's compute is timed at. */
typedef struct points {
    const int32_t *tok;  /* [nt] tokens of the products, experts and layer overhead */
    int32_t nt;
    const int32_t *atok, *actx; /* [na] attention: tokens at a context */
    int32_t na;
    int32_t reps;
} points;

/* The compute curves of one backend, each timed through its table as a live pass runs
 * it (fmoe_backend_bench): an expert from backend memory, the layer's products (q, k, v,
 * o, router, shared expert), attention, the LM head, and the layer's other ops and waits.
 * *peak: the best expert FLOP rate seen. */
static int measure_backend(const options *o, const shapes *sh, fmoe_backend_kind kind,
                           const points *pt, series *expert, series *layer, series *attn,
                           series *head, series *over, double *peak) {
    const int32_t *tok = pt->tok, nt = pt->nt, na = pt->na, reps = pt->reps;
    const char *bname = fmoe_backend_name(kind);
    fmoe_backend_bench_shape bs = {
        .hidden = sh->hidden, .ffn = sh->ffn, .heads = sh->heads, .kv_heads = sh->kv_heads,
        .head_dim = sh->head_dim, .experts = sh->experts > 0 ? sh->experts : 1,
        .top_k = sh->top_k > 0 ? sh->top_k : 1, .shared_ffn = sh->shared_ffn,
        .expert_dtype = sh->expert_dtype, .max_batch = 1, .max_context = 1};
    if (bs.top_k > bs.experts) bs.top_k = bs.experts;
    for (int32_t i = 0; i < nt; i++) bs.max_batch = tok[i] > bs.max_batch ? tok[i] : bs.max_batch;
    for (int32_t i = 0; i < na; i++) {
        bs.max_batch = pt->atok[i] > bs.max_batch ? pt->atok[i] : bs.max_batch;
        bs.max_context = pt->actx[i] > bs.max_context ? pt->actx[i] : bs.max_context;
    }
    if (bs.max_context < bs.max_batch) bs.max_context = bs.max_batch;
    const int32_t erows[3] = {sh->ffn, sh->ffn, sh->hidden};
    const int32_t ecols[3] = {sh->hidden, sh->hidden, sh->ffn};
    const double eflops = chain_flops(erows, ecols, 3);
    int32_t lrows[LAYER_MATS], lcols[LAYER_MATS];
    const int32_t lm = layer_mats(sh, lrows, lcols);
    const int32_t hrows[1] = {sh->vocab}, hcols[1] = {sh->hidden};
    double sec[MAXPTS];

    const int blas_threads = openblas_get_num_threads(); /* the CPU backend sets it to one */
    fmoe_backend_bench *b = NULL;
    int rc = fmoe_backend_bench_init(&b, kind, &bs, o->threads,
                                     (fmoe_activations)o->activations);
    /* the experts in their own format (a GGUF's blocks), the rest in the config's dtype,
     * which is what `fmoe quantize --experts-only` leaves */
    backend_series(expert, nt, "expert", bname, &sh->expert_dtype, 1, o->activations);
    backend_series(layer, nt, "layer GEMMs", bname, sh->layer_dtype, lm, o->activations);
    backend_series(attn, na, "attention", bname, NULL, 0, o->activations);
    backend_series(head, nt, "LM head", bname, &sh->head_dtype, 1, o->activations);
    backend_series(over, nt, "layer overhead", bname, NULL, 0, o->activations);
    series *all[5] = {expert, layer, attn, head, over};
    for (int i = 0; rc == 0 && i < 5; i++) /* the table's own name: what was timed */
        snprintf(all[i]->ops, sizeof all[i]->ops, "%s", fmoe_backend_bench_backend(b));
    if (rc == 0) rc = fmoe_backend_bench_expert(b, tok, nt, reps, sec);
    for (int32_t i = 0; rc == 0 && i < nt; i++) {
        expert->x[i] = tok[i], expert->y[i] = sec[i];
        const double f = eflops * tok[i] / sec[i];
        if (f > *peak) *peak = f;
    }
    if (rc == 0) rc = fmoe_backend_bench_chain(b, lrows, lcols, lm, sh->layer_dtype, tok, nt, reps, sec);
    for (int32_t i = 0; rc == 0 && i < nt; i++) layer->x[i] = tok[i], layer->y[i] = sec[i];
    if (rc == 0) rc = fmoe_backend_bench_attention(b, pt->atok, pt->actx, na, reps, sec);
    for (int32_t i = 0; rc == 0 && i < na; i++) {
        attn->x[i] = (double)pt->atok[i] * pt->actx[i];
        attn->x2[i] = pt->actx[i];
        attn->y[i] = sec[i];
    }
    if (rc == 0) rc = fmoe_backend_bench_chain(b, hrows, hcols, 1, &sh->head_dtype, tok, nt, reps, sec);
    for (int32_t i = 0; rc == 0 && i < nt; i++) head->x[i] = tok[i], head->y[i] = sec[i];
    if (rc == 0) rc = fmoe_backend_bench_layer_overhead(b, tok, nt, reps, sec);
    for (int32_t i = 0; rc == 0 && i < nt; i++) over->x[i] = tok[i], over->y[i] = sec[i];
    fmoe_backend_bench_free(b);
    openblas_set_num_threads(blas_threads);
    if (rc < 0) return rc;
    fit_series(expert);
    fit_series(layer);
    fit_series(attn);
    fit_series(head);
    fit_series(over);
    return 0;
}

/* The file link: a model's own experts read as the live file tier reads them
 * (--link-file MODEL), O_DIRECT reads of another file (--link-file FILE), or a scratch
 * file in --file-dir. */
static int measure_file_link(const options *o, const int64_t *sizes, int32_t reps,
                             measurements *m) {
    double sec[MAXPTS];
    int rc;
    const int32_t nf = o->quick ? 3 : 6; /* file: 64 KiB .. 64 MiB (quick: 4 KiB .. 1 MiB) */
    const int64_t *fsizes = sizes;
    m->file = (series){.what = "copy file->RAM", .n = nf};
    if (o->link_file && calibrate_link_is_model(o->link_file)) {
        /* a model: its own experts, read as the live file tier reads them */
        calibrate_expert_reads er;
        m->file_cache = FMOE_FILE_CACHE_DIRECT;
        FMOE_FORWARD_IF_ERROR(calibrate_expert_reads_run(o->link_file, o->read_depth, o->quick,
                                                         &er));
        m->file.n = er.n;
        for (int32_t i = 0; i < er.n; i++) m->file.x[i] = er.bytes[i], m->file.y[i] = er.seconds[i];
        m->file_expert_reads = er.reads;
    } else {
        if (o->link_file) {
            m->file_cache = FMOE_FILE_CACHE_DIRECT;
            /* 7 repetitions: these reads take about half a second, and the medians of a
             * shared virtual disk steady with more of them */
            rc = fmoe_calibrate_read_file(o->link_file, fsizes, nf, o->quick ? reps : 7,
                                          o->read_depth, sec);
        } else {
            rc = fmoe_calibrate_copy_file(o->file_dir, fsizes, nf, reps, o->read_depth, sec,
                                          &m->file_cache);
        }
        if (rc < 0) return rc;
        for (int32_t i = 0; i < nf; i++) m->file.x[i] = (double)fsizes[i], m->file.y[i] = sec[i];
    }
    fit_link(&m->file);
    return 0;
}

/* The copies: RAM->RAM, file->RAM and, with the cuda backend, host->device; `only`
 * (with --base) names the one link to time, NULL all of them. */
static int measure_links(const options *o, const char *only, measurements *m) {
    /* RAM: expert-sized copies (below 256 KiB they run in the CPU caches, which experts
     * never do); file: from 64 KiB, where the device's latency still shows. */
    static const int64_t sizes_full[] = {65536, 262144, 1 << 20, 4 << 20, 16 << 20, 64 << 20,
                                         256 << 20};
    static const int64_t sizes_quick[] = {4096, 65536, 1 << 20};
    const int64_t *sizes = o->quick ? sizes_quick : sizes_full;
    const int32_t ns = o->quick ? 3 : 7;
    const int32_t reps = o->quick ? 2 : 3;
    double sec[MAXPTS];

    const int32_t r0 = o->quick ? 0 : 1; /* RAM from 256 KiB */
    if (!only || strcmp(only, "ram") == 0) {
        m->ram = (series){.what = "copy RAM->RAM", .n = ns - r0};
        FMOE_FORWARD_IF_ERROR(fmoe_calibrate_copy_ram(sizes + r0, ns - r0, reps, sec));
        for (int32_t i = 0; i < ns - r0; i++)
            m->ram.x[i] = (double)sizes[r0 + i], m->ram.y[i] = sec[i];
        fit_link(&m->ram);
    }
    if (!only || strcmp(only, "file") == 0)
        FMOE_FORWARD_IF_ERROR(measure_file_link(o, sizes, reps, m));
    if (m->have_gpu && (!only || strcmp(only, "h2d") == 0)) { /* the cuda backend */
        static const int64_t gsizes[] = {4096, 65536, 1 << 20, 16 << 20, 64 << 20, 256 << 20};
        m->h2d = (series){.what = "copy host->device", .n = o->quick ? 4 : 6};
        FMOE_FORWARD_IF_ERROR(fmoe_cuda_calibrate_h2d(gsizes, m->h2d.n, reps, sec));
        for (int32_t i = 0; i < m->h2d.n; i++) m->h2d.x[i] = (double)gsizes[i], m->h2d.y[i] = sec[i];
        fit_link(&m->h2d);
        FMOE_FORWARD_IF_ERROR(fmoe_cuda_calibrate_d2d(o->quick ? 16 << 20 : 256 << 20, reps,
                                                      &m->gpu_membw));
    }
    return 0;
}

/* The links, then each backend's compute at the model's shapes, the matcher and the
 * predictors. */
static int measure(const options *o, const shapes *sh, measurements *m) {
    static const int32_t tok_full[] = {1, 4, 16, 64}, tok_quick[] = {1, 4, 16};
    static const int32_t at_tok_full[] = {1, 1, 16, 64}, at_ctx_full[] = {512, 2048, 2048, 2048};
    static const int32_t at_tok_quick[] = {1, 4, 8}, at_ctx_quick[] = {64, 256, 256};
    const int32_t *tok = o->quick ? tok_quick : tok_full, nt = o->quick ? 3 : 4;
    const int32_t *atok = o->quick ? at_tok_quick : at_tok_full;
    const int32_t *actx = o->quick ? at_ctx_quick : at_ctx_full, na = o->quick ? 3 : 4;
    const int32_t reps = o->quick ? 2 : 3;
    int rc;
    FMOE_FORWARD_IF_ERROR(measure_links(o, NULL, m));

    /* compute: each backend's own ops at the model's shapes */
    const points pt = {.tok = tok, .nt = nt, .atok = atok, .actx = actx, .na = na, .reps = reps};
    FMOE_FORWARD_IF_ERROR(measure_backend(o, sh, FMOE_BACKEND_CPU, &pt, &m->expert_cpu,
                                          &m->layer_cpu, &m->attn_cpu, &m->head_cpu,
                                          &m->over_cpu, &m->cpu_peak_flops));
    /* the fMoE matcher: one CPU thread, whatever --threads says (it runs beside inference) */
    const int blas_threads = openblas_get_num_threads();
    openblas_set_num_threads(1);
    rc = fmoe_calibrate_matcher(sh->layers, sh->experts, sh->top_k, MATCHER_STORE, reps,
                                &m->match_s, &m->token_match_s);
    /* ProMoE's predictor, the default shape for the model, one thread (ProMoE §4.4: on
     * the CPU beside inference) */
    m->promoe_hidden = fmoe_promoe_default_hidden(sh->hidden, sh->experts);
    if (rc >= 0)
        rc = fmoe_calibrate_predictor(sh->hidden, m->promoe_hidden, sh->experts, reps,
                                      &m->promoe_s);
    if (rc >= 0) rc = fmoe_calibrate_duoserve(sh->layers, sh->experts, reps, &m->duoserve_s);
    openblas_set_num_threads(blas_threads);
    if (rc < 0) return rc;
    if (m->have_gpu)
        FMOE_FORWARD_IF_ERROR(measure_backend(o, sh, FMOE_BACKEND_CUDA, &pt, &m->expert_gpu,
                                              &m->layer_gpu, &m->attn_gpu, &m->head_gpu,
                                              &m->over_gpu, &m->gpu_peak_flops));
    return 0;
}

/* ------------------------------------------------------------------ profile */

static double nonneg(double v) { return v > 0 ? v : 0; }

/* layer(n, c) = layer GEMMs + attention: base and per_token from the GEMMs (plus the
 * attention's intercept), per_token_context from the attention's slope. */
static fmoe_linear_cost layer_cost(const series *gemms, const series *attn) {
    fmoe_linear_cost c = {0};
    if (!gemms->ok) return c;
    c.present = 1;
    c.base_s = nonneg(gemms->fit.a + (attn->ok ? nonneg(attn->fit.a) : 0));
    c.per_token_s = nonneg(gemms->fit.b);
    c.per_token_context_s = attn->ok ? nonneg(attn->fit.b) : 0;
    return c;
}

static fmoe_linear_cost expert_cost(const series *s) {
    fmoe_linear_cost c = {0};
    if (!s->ok) return c;
    c.present = 1;
    c.base_s = nonneg(s->fit.a);
    c.per_token_s = nonneg(s->fit.b);
    return c;
}

static const char *cache_name(fmoe_file_cache c) {
    return c == FMOE_FILE_CACHE_DROPPED ? "dropped"
           : c == FMOE_FILE_CACHE_TMPFS ? "tmpfs"
           : c == FMOE_FILE_CACHE_DIRECT ? "O_DIRECT"
                                         : "warm";
}

static cJSON *series_json(const series *s, const char *xname) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "what", s->what);
    if (s->ops[0]) cJSON_AddStringToObject(o, "backend_ops", s->ops);
    if (s->ok) {
        cJSON_AddNumberToObject(o, "intercept_s", s->fit.a);
        cJSON_AddNumberToObject(o, "slope_s", s->fit.b);
        cJSON_AddNumberToObject(o, "fit_rms_rel_error", s->fit.rms_rel);
        cJSON_AddNumberToObject(o, "fit_max_rel_error", s->fit.max_rel);
    }
    cJSON *pts = cJSON_AddArrayToObject(o, "points");
    for (int32_t i = 0; i < s->n; i++) {
        cJSON *p = cJSON_CreateObject();
        cJSON_AddNumberToObject(p, xname, s->x[i]);
        if (s->x2[i] > 0) cJSON_AddNumberToObject(p, "context", s->x2[i]);
        cJSON_AddNumberToObject(p, "seconds", s->y[i]);
        cJSON_AddItemToArray(pts, p);
    }
    return o;
}

static void add_link(cJSON *links, const char *key, const series *s) {
    if (!s->n) return;
    cJSON *o = series_json(s, "bytes");
    if (s->ok) {
        cJSON_AddNumberToObject(o, "alpha_s", nonneg(s->fit.a));
        cJSON_AddNumberToObject(o, "beta_bytes_per_s", s->fit.b > 0 ? 1.0 / s->fit.b : 0);
        if (s->throughput_only)
            cJSON_AddStringToObject(o, "fit", "throughput of the largest read: the times did "
                                              "not grow with size");
    }
    cJSON_AddItemToObject(links, key, o);
}

/* The profile's link: the measured series' fit, or with --link-decode-gb the file link a
 * decode saw, alpha 0 and its bytes over its busy seconds (a decode's transfers, whole
 * experts and their pieces, add up to that time: the same figure a run's "link ... GiB/s
 * measured (decode X)" reports, with which simulate was within 13% of every live run in
 * docs/results.md). */
static void profile_link(const measurements *m, const char *link, const series *ls,
                         double *alpha, double *beta) {
    if (m->decode.tokens > 0 && strcmp(link, "file") == 0) {
        *alpha = 0;
        *beta = (double)m->decode.bytes / m->decode.busy_s;
        return;
    }
    *alpha = nonneg(ls->fit.a);
    *beta = 1.0 / ls->fit.b;
}

/* The calibration record of --link-decode-gb's decode, in the file link's. */
static void add_decode_record(cJSON *file_link, const measurements *m) {
    const calibrate_decode_link *d = &m->decode;
    if (!file_link || d->tokens <= 0) return;
    cJSON *o = cJSON_AddObjectToObject(file_link, "decode");
    cJSON_AddStringToObject(o, "what", "the copy engine's bytes over its busy seconds in the "
                                       "decode iterations of an offloaded run: the "
                                       "profile's link");
    cJSON_AddNumberToObject(o, "cache_gb", d->cache_gb);
    cJSON_AddStringToObject(o, "policy", "lru");
    cJSON_AddNumberToObject(o, "slots", d->slots);
    cJSON_AddNumberToObject(o, "threads", d->threads);
    cJSON_AddNumberToObject(o, "tokens", d->tokens);
    cJSON_AddNumberToObject(o, "decode_s", d->decode_s);
    cJSON_AddNumberToObject(o, "hit_pct", d->hit_pct);
    cJSON_AddNumberToObject(o, "bytes", (double)d->bytes);
    cJSON_AddNumberToObject(o, "busy_s", d->busy_s);
    cJSON_AddNumberToObject(o, "beta_bytes_per_s", (double)d->bytes / d->busy_s);
}

/* Builds the profile and its JSON (with the "calibration" record). */
static int build_profile(const options *o, const shapes *sh, const measurements *m,
                         const char **link_used, char **json) {
    fmoe_hardware_profile p;
    memset(&p, 0, sizeof p);
    char host[128] = "this-machine";
    gethostname(host, sizeof host - 1);
    snprintf(p.name, sizeof p.name, "%s", o->name ? o->name : "");
    if (!o->name) snprintf(p.name, sizeof p.name, "calibrated-%.48s", host);
    const char *link = o->link;
    if (strcmp(link, "auto") == 0) link = m->have_gpu ? "h2d" : "file";
    if (strcmp(link, "h2d") == 0 && !m->have_gpu) /* cmd_calibrate refused it already */
        return fmoe_error_set(FMOE_EUNSUPPORTED, "--link h2d needs the cuda backend");
    const series *ls = strcmp(link, "h2d") == 0 ? &m->h2d : strcmp(link, "ram") == 0 ? &m->ram
                                                                                       : &m->file;
    FMOE_RETURN_ERROR_IF(!ls->ok || !(ls->fit.b > 0), FMOE_EINTERNAL,
                         "%s: the measurements do not fit alpha + bytes / beta", ls->what);
    *link_used = link;
    profile_link(m, link, ls, &p.alpha_s, &p.beta_bytes_per_s);
    /* Memory bandwidth: the largest copy's rate, bytes read plus written (the smaller
     * copies partly run in the CPU caches). */
    const int32_t last = m->ram.n - 1;
    const double cpu_bw = last >= 0 && m->ram.y[last] > 0 ? 2.0 * m->ram.x[last] / m->ram.y[last]
                                                          : 0;
    if (m->have_gpu) {
        p.peak_flops = m->gpu_peak_flops;
        p.memory_bandwidth_bytes_per_s = m->gpu_membw;
        p.attention = layer_cost(&m->layer_gpu, &m->attn_gpu);
        p.expert = expert_cost(&m->expert_gpu);
        p.head = expert_cost(&m->head_gpu);
        p.layer_overhead = expert_cost(&m->over_gpu);
    } else {
        p.peak_flops = m->cpu_peak_flops;
        p.memory_bandwidth_bytes_per_s = cpu_bw;
        p.attention = layer_cost(&m->layer_cpu, &m->attn_cpu);
        p.expert = expert_cost(&m->expert_cpu);
        p.head = expert_cost(&m->head_cpu);
        p.layer_overhead = expert_cost(&m->over_cpu);
    }
    p.host_expert = expert_cost(&m->expert_cpu);
    p.host_peak_flops = m->cpu_peak_flops;
    p.host_memory_bandwidth_bytes_per_s = cpu_bw;
    p.match_s = m->match_s;
    p.promoe_s = m->promoe_s;
    p.duoserve_s = m->duoserve_s;
    snprintf(p.source, sizeof p.source,
             "fmoe calibrate on %.60s: link %s; compute %s at %.90s; host fmoe cpu kernels",
             host, link, m->have_gpu ? "fmoe cuda backend ops" : "fmoe cpu kernels", sh->model);

    char *text = NULL;
    FMOE_FORWARD_IF_ERROR(fmoe_hardware_to_json(&p, &text));
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root) return fmoe_error_set(FMOE_ENOMEM, "profile JSON");
    cJSON *cal = cJSON_AddObjectToObject(root, "calibration");
    cJSON_AddStringToObject(cal, "fmoe_version", FMOE_VERSION);
    cJSON_AddStringToObject(cal, "host", host);
    cJSON_AddNumberToObject(cal, "cpus", (double)sysconf(_SC_NPROCESSORS_ONLN));
    cJSON_AddNumberToObject(cal, "openblas_threads", openblas_get_num_threads());
    cJSON_AddStringToObject(cal, "cuda", fmoe_cuda_describe());
    cJSON_AddStringToObject(cal, "backend",
                            fmoe_backend_name(m->have_gpu ? FMOE_BACKEND_CUDA : FMOE_BACKEND_CPU));
    cJSON_AddStringToObject(cal, "activations",
                            fmoe_activations_name((fmoe_activations)o->activations));
    cJSON_AddStringToObject(cal, "link_used", link);
    cJSON_AddBoolToObject(cal, "quick", o->quick);
    cJSON *model = cJSON_AddObjectToObject(cal, "model");
    cJSON_AddStringToObject(model, "shapes_of", sh->model);
    cJSON_AddNumberToObject(model, "hidden_size", sh->hidden);
    cJSON_AddNumberToObject(model, "expert_intermediate_size", sh->ffn);
    cJSON_AddNumberToObject(model, "attention_heads", sh->heads);
    cJSON_AddNumberToObject(model, "kv_heads", sh->kv_heads);
    cJSON_AddNumberToObject(model, "head_dim", sh->head_dim);
    cJSON_AddNumberToObject(model, "shared_intermediate_size", sh->shared_ffn);
    cJSON_AddNumberToObject(model, "vocab_size", sh->vocab);
    int32_t lr[LAYER_MATS], lc[LAYER_MATS];
    cJSON *ldt = cJSON_AddArrayToObject(model, "layer_matrix_dtypes");
    for (int32_t i = 0; i < layer_mats(sh, lr, lc); i++)
        cJSON_AddItemToArray(ldt, cJSON_CreateString(fmoe_dtype_name(sh->layer_dtype[i])));
    cJSON_AddStringToObject(model, "lm_head_dtype", fmoe_dtype_name(sh->head_dtype));
    cJSON *mat = cJSON_AddObjectToObject(cal, "matcher");
    cJSON_AddNumberToObject(mat, "store_entries", MATCHER_STORE);
    cJSON_AddNumberToObject(mat, "layers", sh->layers);
    cJSON_AddNumberToObject(mat, "experts", sh->experts);
    cJSON_AddNumberToObject(mat, "match_s", m->match_s);
    cJSON_AddNumberToObject(mat, "token_s", m->token_match_s);
    cJSON *pred = cJSON_AddObjectToObject(cal, "predictor");
    cJSON_AddStringToObject(pred, "kind", FMOE_PREDICTOR_KIND_PROMOE);
    cJSON_AddNumberToObject(pred, "input", sh->hidden);
    cJSON_AddNumberToObject(pred, "hidden", m->promoe_hidden);
    cJSON_AddNumberToObject(pred, "experts", sh->experts);
    cJSON_AddNumberToObject(pred, "promoe_s", m->promoe_s);
    int32_t widths[FMOE_EXPERT_MLP_MAX_FC + 1];
    const int32_t fc = fmoe_duoserve_widths(sh->layers, sh->experts, 0, widths);
    cJSON_AddItemToObject(pred, "duoserve_widths", cJSON_CreateIntArray(widths, fc + 1));
    cJSON_AddNumberToObject(pred, "duoserve_s", m->duoserve_s);
    cJSON *links = cJSON_AddObjectToObject(cal, "links");
    add_link(links, "ram", &m->ram);
    add_link(links, "file", &m->file);
    cJSON *fl = cJSON_GetObjectItemCaseSensitive(links, "file");
    if (fl) {
        cJSON_AddStringToObject(fl, "page_cache", cache_name(m->file_cache));
        cJSON_AddNumberToObject(fl, "read_depth", o->read_depth);
        if (o->link_file) cJSON_AddStringToObject(fl, "file", o->link_file);
        else cJSON_AddStringToObject(fl, "dir", o->file_dir);
        if (m->file_expert_reads) { /* the points are pieces of experts, not file ranges */
            cJSON_AddStringToObject(fl, "reads", "experts of the model, as the file tier "
                                                 "reads them: 1/8, 1/4, 1/2, whole");
            cJSON_AddNumberToObject(fl, "reads_per_point", m->file_expert_reads);
        }
        add_decode_record(fl, m);
    }
    add_link(links, "h2d", &m->h2d);
    cJSON *comp = cJSON_AddObjectToObject(cal, "compute");
    cJSON_AddItemToObject(comp, "expert_cpu", series_json(&m->expert_cpu, "tokens"));
    cJSON_AddItemToObject(comp, "layer_gemms_cpu", series_json(&m->layer_cpu, "tokens"));
    cJSON_AddItemToObject(comp, "attention_cpu", series_json(&m->attn_cpu, "tokens_x_context"));
    cJSON_AddItemToObject(comp, "lm_head_cpu", series_json(&m->head_cpu, "tokens"));
    cJSON_AddItemToObject(comp, "layer_overhead_cpu", series_json(&m->over_cpu, "tokens"));
    if (m->have_gpu) {
        cJSON_AddItemToObject(comp, "expert_gpu", series_json(&m->expert_gpu, "tokens"));
        cJSON_AddItemToObject(comp, "layer_gemms_gpu", series_json(&m->layer_gpu, "tokens"));
        cJSON_AddItemToObject(comp, "attention_gpu",
                              series_json(&m->attn_gpu, "tokens_x_context"));
        cJSON_AddItemToObject(comp, "lm_head_gpu", series_json(&m->head_gpu, "tokens"));
        cJSON_AddItemToObject(comp, "layer_overhead_gpu", series_json(&m->over_gpu, "tokens"));
    }
    *json = cJSON_Print(root);
    cJSON_Delete(root);
    return *json ? 0 : fmoe_error_set(FMOE_ENOMEM, "profile JSON");
}

/* --base PROFILE: PROFILE's JSON with its link and the measured link's calibration record
 * replaced by this run's (every other figure, and fields this version does not know,
 * kept as they were). The base must parse as a profile, so a typo is refused before the
 * link is timed. */
static int load_base(const char *path, cJSON **root) {
    char *text = NULL;
    size_t len = 0;
    FMOE_FORWARD_IF_ERROR(fmoe__read_file_bounded(path, "a hardware profile", 64ll << 20, 0,
                                                  &text, &len));
    fmoe_hardware_profile p;
    int rc = fmoe_hardware_parse(text, len, path, &p);
    if (rc >= 0) {
        *root = cJSON_ParseWithLength(text, len);
        if (!*root) rc = fmoe_error_set(FMOE_ENOMEM, "%s: parsing it again", path);
    }
    free(text);
    return rc;
}

static void replace_item(cJSON *obj, const char *key, cJSON *item) {
    if (cJSON_GetObjectItemCaseSensitive(obj, key))
        cJSON_ReplaceItemInObjectCaseSensitive(obj, key, item);
    else
        cJSON_AddItemToObject(obj, key, item);
}

static cJSON *object_in(cJSON *obj, const char *key) {
    cJSON *o = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (cJSON_IsObject(o)) return o;
    o = cJSON_CreateObject();
    replace_item(obj, key, o);
    return o;
}

static int build_relinked_profile(const options *o, const measurements *m, const char *link,
                                  char **json) {
    const series *ls = strcmp(link, "h2d") == 0 ? &m->h2d : strcmp(link, "ram") == 0 ? &m->ram
                                                                                       : &m->file;
    FMOE_RETURN_ERROR_IF(!ls->ok || !(ls->fit.b > 0), FMOE_EINTERNAL,
                         "%s: the measurements do not fit alpha + bytes / beta", ls->what);
    cJSON *root = NULL;
    FMOE_FORWARD_IF_ERROR(load_base(o->base, &root));
    cJSON *l = cJSON_CreateObject();
    double alpha, beta;
    profile_link(m, link, ls, &alpha, &beta);
    cJSON_AddNumberToObject(l, "alpha_s", alpha);
    cJSON_AddNumberToObject(l, "beta_bytes_per_s", beta);
    replace_item(root, "link", l);
    if (o->name) replace_item(root, "name", cJSON_CreateString(o->name));
    cJSON *cal = object_in(root, "calibration");
    cJSON *links = object_in(cal, "links");
    cJSON_DeleteItemFromObjectCaseSensitive(links, link);
    add_link(links, link, ls);
    cJSON *fl = strcmp(link, "file") == 0 ? cJSON_GetObjectItemCaseSensitive(links, "file") : NULL;
    if (fl) {
        cJSON_AddStringToObject(fl, "page_cache", cache_name(m->file_cache));
        cJSON_AddNumberToObject(fl, "read_depth", o->read_depth);
        if (o->link_file) cJSON_AddStringToObject(fl, "file", o->link_file);
        else cJSON_AddStringToObject(fl, "dir", o->file_dir);
        add_decode_record(fl, m);
    }
    replace_item(cal, "link_used", cJSON_CreateString(link));
    replace_item(cal, "link_remeasured_from", cJSON_CreateString(o->base));
    *json = cJSON_Print(root);
    cJSON_Delete(root);
    return *json ? 0 : fmoe_error_set(FMOE_ENOMEM, "profile JSON");
}

/* ------------------------------------------------------------------ report */

static const char *human_s(double s, char *buf, size_t cap) {
    if (s < 1e-3) snprintf(buf, cap, "%.2f us", s * 1e6);
    else if (s < 1) snprintf(buf, cap, "%.3f ms", s * 1e3);
    else snprintf(buf, cap, "%.3f s", s);
    return buf;
}

static void report_link(const series *s, const char *note) {
    char a[32];
    if (!s->n) return;
    if (!s->ok) {
        fprintf(stderr, "  %-28s (no fit)\n", s->what);
        return;
    }
    fprintf(stderr, "  %-28s alpha %10s  beta %7.2f GB/s  fit error rms %4.1f%% max %5.1f%%%s\n",
            s->what, human_s(nonneg(s->fit.a), a, sizeof a), 1e-9 / s->fit.b,
            100 * s->fit.rms_rel, 100 * s->fit.max_rel, note);
}

static void report_compute(const series *s, const char *xlabel) {
    char a[32], b[32];
    if (!s->n) return;
    if (!s->ok) {
        fprintf(stderr, "  %-28s (no fit)\n", s->what);
        return;
    }
    fprintf(stderr, "  %-28s base %10s  per %-8s %10s  fit error rms %4.1f%% max %5.1f%%\n",
            s->what, human_s(nonneg(s->fit.a), a, sizeof a), xlabel,
            human_s(nonneg(s->fit.b), b, sizeof b), 100 * s->fit.rms_rel, 100 * s->fit.max_rel);
}

static void report_links(const options *o, const measurements *m) {
    char note[192];
    report_link(&m->ram, "");
    if (o->link_file && m->file_expert_reads)
        snprintf(note, sizeof note, " (experts of %.100s, O_DIRECT, read depth %d, %d reads a "
                 "point)", o->link_file, o->read_depth, m->file_expert_reads);
    else if (o->link_file)
        snprintf(note, sizeof note, " (%.100s, O_DIRECT, read depth %d)", o->link_file,
                 o->read_depth);
    else
        snprintf(note, sizeof note, " (%s, page cache %s, read depth %d)", o->file_dir,
                 cache_name(m->file_cache), o->read_depth);
    report_link(&m->file, note);
    const calibrate_decode_link *d = &m->decode;
    if (d->tokens > 0)
        fprintf(stderr, "  %-28s beta %7.2f GB/s  (the profile's link: %d decode tokens, "
                        "--cache-gb %g: %d slots, %.1f%% hits, lru, %.0f MiB in %.2f s busy)\n",
                "copy file->RAM in decode", (double)d->bytes / d->busy_s * 1e-9, d->tokens,
                d->cache_gb, d->slots, d->hit_pct, (double)d->bytes / (1 << 20), d->busy_s);
    report_link(&m->h2d, " (pinned)");
}

static void report(const options *o, const shapes *sh, const measurements *m, const char *link) {
    /* first, and only with the measurements: a failure stays one line */
    cmd_backend_say(CMD, m->have_gpu ? FMOE_BACKEND_CUDA : FMOE_BACKEND_CPU, o->activations);
    fprintf(stderr, "fmoe calibrate: %ld cpus, OpenBLAS %d threads; CUDA: %s\n",
            sysconf(_SC_NPROCESSORS_ONLN), openblas_get_num_threads(), fmoe_cuda_describe());
    fprintf(stderr, "shapes: %s: hidden %d, expert %d, %d heads (%d KV) of %d%s\n", sh->model,
            sh->hidden, sh->ffn, sh->heads, sh->kv_heads, sh->head_dim,
            o->quick ? " (--quick: an eighth)" : "");
    report_links(o, m);
    report_compute(&m->expert_cpu, "token");
    report_compute(&m->layer_cpu, "token");
    report_compute(&m->attn_cpu, "tok*ctx");
    report_compute(&m->head_cpu, "token");
    report_compute(&m->over_cpu, "token");
    report_compute(&m->expert_gpu, "token");
    report_compute(&m->layer_gpu, "token");
    report_compute(&m->attn_gpu, "tok*ctx");
    report_compute(&m->head_gpu, "token");
    report_compute(&m->over_gpu, "token");
    char a[32], b[32];
    fprintf(stderr, "  %-28s %10s per match (one layer), %s per token (%d layers x %d experts, "
                    "%d entries, 1 thread)\n",
            "fMoE matcher", human_s(m->match_s, a, sizeof a),
            human_s(m->token_match_s, b, sizeof b), sh->layers, sh->experts, MATCHER_STORE);
    fprintf(stderr, "  %-28s %10s per token (%d -> %d -> %d, 1 thread)\n", "ProMoE predictor",
            human_s(m->promoe_s, a, sizeof a), sh->hidden, m->promoe_hidden, sh->experts);
    fprintf(stderr, "  %-28s %10s per token (ExpertMLP for %d layers x %d experts, 1 thread)\n",
            "DuoServe predictor", human_s(m->duoserve_s, a, sizeof a), sh->layers, sh->experts);
    fprintf(stderr, "profile: link = %s; compute = %s; host = fmoe cpu kernels\n", link,
            m->have_gpu ? "fmoe cuda backend ops" : "fmoe cpu kernels");
}

/* ------------------------------------------------------------------ main */

/* --link-decode-gb: the decode after the other measurements (its model's weights, loaded
 * and made the process's own, would otherwise sit in the memory the compute timings use).
 * @return a command exit code (0, or printed). */
static int measure_decode_link(const options *o, measurements *m) {
    if (!(o->link_decode_gb > 0)) return CMD_EXIT_OK;
    return calibrate_decode_link_run(CMD, o->link_file, o->read_depth, o->link_decode_gb,
                                     o->threads, o->activations, o->quick, &m->decode);
}

/* Writes the profile into the partial opened before measuring (so a bad -o fails in
 * a moment, not after the measurements) and makes it the output. Every failure names
 * the file and the reason; the partial is removed. */
static int write_profile(FILE *f, const char *partial, const char *path, const char *text) {
    int err = 0; /* the first failure's errno, kept before anything else can change it */
    errno = 0;
    if (fputs(text, f) < 0 || fputc('\n', f) == EOF || fflush(f) != 0) err = errno ? errno : EIO;
    errno = 0;
    if (fclose(f) != 0 && !err) err = errno ? errno : EIO;
    if (err) {
        remove(partial);
        return cmd_failf(CMD, "%s: cannot write: %s", partial, strerror(err));
    }
    int rc = fmoe__partial_commit(partial, path); /* lib/files.h */
    if (rc < 0) {
        remove(partial);
        return cmd_fail(CMD, rc);
    }
    return 0;
}

int cmd_calibrate(int argc, char **argv) {
    options o;
    memset(&o, 0, sizeof o);
    o.activations = FMOE_ACTIVATIONS_AUTO;
    o.read_depth = FMOE_PREADER_DEFAULT_DEPTH;
    int rc = parse_options(argc, argv, &o);
    if (rc != 0) return rc < 0 ? CMD_EXIT_OK : rc;
    fmoe_backend_kind backend;
    if ((rc = cmd_backend_resolve(CMD, o.backend, &backend)) != 0) return rc;
    if ((rc = cmd_activations_resolve(CMD, backend, &o.activations)) != 0) return rc;
    shapes sh;
    memset(&sh, 0, sizeof sh);
    rc = o.base ? 0 : load_shapes(&o, &sh); /* --base times no compute */
    if (rc < 0) return cmd_fail(CMD, rc);
    if (strcmp(o.link, "h2d") == 0 && backend != FMOE_BACKEND_CUDA) /* auto found no device */
        return cmd_failf(CMD, "--link h2d needs a CUDA device (%s)", fmoe_cuda_describe());
    if (o.threads > 0) openblas_set_num_threads(o.threads);
    /* The output first: a missing folder or an unwritable file is reported before the
     * measurements, not after them. */
    FILE *out = NULL;
    char partial[4200];
    if (o.output) {
        /* an output that cannot be a file (/dev/full, a folder) was refused by the parse,
         * exit 2, as in every command (cmd/outputs.h) */
        snprintf(partial, sizeof partial, "%s.partial", o.output);
        rc = fmoe__partial_fopen(o.output, partial, "w", &out); /* lib/files.h */
        if (rc < 0) return cmd_fail(CMD, rc);
        /* interrupted: no .partial left (half a profile is worth nothing) */
        const char *cleanup[] = {partial};
        cmd_remove_on_signal(cleanup, 1);
    }
    measurements m;
    memset(&m, 0, sizeof m);
    m.have_gpu = backend == FMOE_BACKEND_CUDA;
    int exit_code = CMD_EXIT_OK;
    const double t0 = cmd_now();
    const char *link = NULL;
    char *json = NULL;
    if (o.base) {
        /* the base is checked before the link is timed: a typo fails in a moment */
        cJSON *base = NULL;
        rc = load_base(o.base, &base);
        cJSON_Delete(base);
        link = strcmp(o.link, "auto") == 0 ? (m.have_gpu ? "h2d" : "file") : o.link;
        if (rc >= 0) rc = measure_links(&o, link, &m);
        if (rc >= 0 && (exit_code = measure_decode_link(&o, &m)) != 0) goto done;
        if (rc >= 0) rc = build_relinked_profile(&o, &m, link, &json);
    } else {
        rc = measure(&o, &sh, &m);
        if (rc >= 0 && (exit_code = measure_decode_link(&o, &m)) != 0) goto done;
        if (rc >= 0) rc = build_profile(&o, &sh, &m, &link, &json);
    }
    if (rc < 0) {
        if (out) {
            fclose(out);
            remove(partial);
        }
        return cmd_fail(CMD, rc);
    }
    if (!o.quiet && o.base) {
        report_links(&o, &m);
        fprintf(stderr, "profile: link = %s, measured now; everything else from %s\n", link,
                o.base);
    } else if (!o.quiet) {
        report(&o, &sh, &m, link);
        fprintf(stderr, "measured in %.1f s\n", cmd_now() - t0);
    }
    if (o.output) {
        exit_code = write_profile(out, partial, o.output, json);
        if (!exit_code && !o.quiet) fprintf(stderr, "wrote %s\n", o.output);
    } else {
        puts(json);
    }
    free(json);
    return exit_code;
done: /* the decode's failure, printed */
    if (out) {
        fclose(out);
        remove(partial);
    }
    return exit_code;
}
