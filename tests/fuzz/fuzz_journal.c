/*
 * fuzz_journal.c - fuzz target for the trace journal's reader and its resynchronisation
 * (trace/trace_journal.c), over raw bytes: no checksum is ever recomputed, so a mutated
 * record fails its CRC exactly as damage on a disk would.
 *
 * Byte 0 picks the mode:
 *   even  the rest is a journal file as it is: the reader must open it or refuse it with a
 *         detail, never crash, and account for every byte it did not return (recovered
 *         records + torn tail + damage <= the file).
 *   odd   the rest is a script: a journal of N requests is written by the real writer
 *         (fmoe__journal_append; sizes and header options from the script), then bytes
 *         are flipped or zeroed, a record's length field changed (a bit flipped, moved by
 *         up to 256, or set to end near the end of the file), the file cut as a kill cuts
 *         it (inside the record being appended, whose CRC is still 0) or as a lost end does
 *         (the CRC written), as the script says. The invariant: when the header record is
 *         intact, every request record whose bytes are all still there unchanged is
 *         recovered, with its values; nothing else is (no record is made up); and a loss
 *         is always accounted for as torn tail or damage, never silent. A script that only
 *         cuts as a kill does must report no damage.
 *   both  a torn tail is claimed only where the append could have left one: a request
 *         record's head whose CRC field (as far as the file keeps it) is still 0. A record
 *         whose CRC was written was whole; losing it, whatever its length field says, is
 *         damage (a flipped bit in the last record's length once passed for a torn tail).
 * Seeds: scripts and journals made by fuzz_seeded_replay below with
 * FMOE_FUZZ_WRITE_SEEDS (tests/fuzz/README.md).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fmoe/error.h"
#include "fmoe/trace.h"
#include "fuzz_file.h"
#include "fuzz_mutate.h"
#include "trace_journal.h"

#define MAX_RECORDS 6
#define MAX_TOKENS 6
#define L 2
#define J 4
#define K 2

static void fail(const char *what) {
    fprintf(stderr, "fuzz_journal: %s (%s)\n", what, fmoe_error_detail());
    abort();
}

/* A torn tail claimed over the last `dropped` of b[0..n) must begin with what the append
 * writes first: kind 2 and CRC 0, as far as those bytes are there. */
static void check_torn_claim(const unsigned char *b, size_t n, int64_t dropped) {
    if (dropped <= 0) return;
    if ((uint64_t)dropped > n) fail("a torn tail longer than the file");
    const size_t at = n - (size_t)dropped;
    const uint32_t kind = 2, zero = 0;
    unsigned char begun[8];
    memcpy(begun, &kind, 4);
    memcpy(begun + 4, &zero, 4);
    const size_t have = (size_t)dropped < 8 ? (size_t)dropped : 8;
    if (memcmp(b + at, begun, have) != 0) {
        fprintf(stderr, "fuzz_journal: a torn tail claimed at byte %zu, whose head is no "
                        "record the append was still writing\n", at);
        abort();
    }
}

static const char *work_path(const char *name) {
    static char buf[2][512];
    static int next;
    char *b = buf[next++ % 2];
    snprintf(b, sizeof buf[0], "%s/%s", fuzz_dir(), name);
    return b;
}

/* ---- mode even: a journal as it is ---------------------------------------------------- */

static void raw_journal(const uint8_t *data, size_t size) {
    const char *path = fuzz_memfile(0, data, size);
    fmoe__journal_reader *r = NULL;
    fmoe_trace_header h;
    fmoe_trace_write_options o;
    fmoe_error_clear();
    if (fmoe__journal_reader_open(&r, path, &h, &o) < 0) {
        if (!fmoe_error_detail()[0]) fail("refused without a detail");
        return;
    }
    fmoe_trace_request q;
    int e;
    uint64_t returned = 0;
    while ((e = fmoe__journal_reader_next(r, &q)) > 0) {
        if (q.prompt_tokens < 0 || q.output_tokens < 0 || q.num_access_outcomes < 0)
            fail("returned a request with negative sizes");
        returned += 16 + 32; /* at least a head and the fixed fields */
    }
    if (e < 0 && !fmoe_error_detail()[0]) fail("read error without a detail");
    int64_t first = 0;
    int32_t regions = 0;
    const int64_t damaged = fmoe__journal_reader_damaged(r, &first, &regions);
    const int64_t dropped = fmoe__journal_reader_dropped(r);
    if (damaged < 0 || dropped < 0 || (uint64_t)(damaged + dropped) + returned > size)
        fail("accounted for more bytes than the file has");
    if ((damaged > 0) != (regions > 0) || (damaged > 0) != (first >= 0))
        fail("damage counters disagree");
    check_torn_claim(data, size, dropped);
    fmoe__journal_reader_close(r);
}

/* ---- mode odd: a journal written here, then damaged ----------------------------------- */

typedef struct script {
    const uint8_t *p;
    size_t n, at;
} script;

static unsigned next_byte(script *s) { return s->at < s->n ? s->p[s->at++] : 0; }

static float prob_of(int64_t id, int t, int l, int j) { return (float)((id * 7 + t * 5 + l * 3 + j) % 16) / 16.0f; }

/* Request `id` of `prompt` + `output` tokens; values are a function of (id, position), so
 * a recovered request can be checked from its id alone. */
typedef struct req {
    int32_t tok[MAX_TOKENS];
    uint8_t phase[MAX_TOKENS];
    uint16_t experts[MAX_TOKENS * L * K];
    float probs[MAX_TOKENS * L * J];
    float layer_s[MAX_TOKENS * L];
    float iteration_s[MAX_TOKENS];
    fmoe_trace_request q;
} req;

static void make_request(req *r, int64_t id, int prompt, int output, int timing) {
    memset(r, 0, sizeof *r);
    const int T = prompt + output;
    for (int t = 0; t < T; t++) {
        r->tok[t] = (int32_t)(id * 100 + t);
        r->phase[t] = t < prompt ? FMOE_PHASE_PREFILL : FMOE_PHASE_DECODE;
        for (int l = 0; l < L; l++) {
            for (int k = 0; k < K; k++) r->experts[(t * L + l) * K + k] = (uint16_t)((id + t + l + k) % J);
            for (int j = 0; j < J; j++) r->probs[(t * L + l) * J + j] = prob_of(id, t, l, j);
        }
    }
    const int64_t I = fmoe_trace_request_iterations(prompt, output, 0);
    for (int64_t i = 0; i < I * L; i++) r->layer_s[i] = 0.25f * (float)(id + i);
    for (int64_t i = 0; i < I; i++) r->iteration_s[i] = 0.5f * (float)(id + i);
    r->q = (fmoe_trace_request){.id = id, .arrival_s = 0.5 * (double)id, .prompt_tokens = prompt,
                                .output_tokens = output, .token_id = r->tok, .phase = r->phase,
                                .experts = r->experts, .probs = r->probs,
                                .layer_s = timing ? r->layer_s : NULL,
                                .iteration_s = timing ? r->iteration_s : NULL};
}

/* memcmp with a length of zero may still not take NULL (C11 7.24.1): a request of zero
 * tokens has no arrays. */
static int same_bytes(const void *a, const void *b, size_t n) {
    return n == 0 || memcmp(a, b, n) == 0;
}

static int same_request(const fmoe_trace_request *a, const fmoe_trace_request *b, int half,
                        int timing) {
    const int T = a->prompt_tokens + a->output_tokens;
    if (a->id != b->id || a->arrival_s != b->arrival_s || a->prompt_tokens != b->prompt_tokens ||
        a->output_tokens != b->output_tokens)
        return 0;
    if (!same_bytes(a->token_id, b->token_id, (size_t)T * 4) ||
        !same_bytes(a->phase, b->phase, (size_t)T) ||
        !same_bytes(a->experts, b->experts, (size_t)T * L * K * 2))
        return 0;
    (void)half; /* the probabilities are sixteenths: exact in float16 too */
    if (!same_bytes(a->probs, b->probs, (size_t)T * L * J * 4)) return 0;
    if (timing) {
        const int64_t I = fmoe_trace_request_iterations(a->prompt_tokens, a->output_tokens, 0);
        if (!same_bytes(a->layer_s, b->layer_s, (size_t)(I * L) * 4) ||
            !same_bytes(a->iteration_s, b->iteration_s, (size_t)I * 4))
            return 0;
    }
    return 1;
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long m = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)m + 1);
    if (b && fread(b, 1, (size_t)m, f) != (size_t)m) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *n = (size_t)m;
    return b;
}

static void scripted_journal(const uint8_t *data, size_t size) {
    script s = {data, size, 0};
    const unsigned opts = next_byte(&s);
    const int nrec = 1 + (int)(next_byte(&s) % MAX_RECORDS);
    const int half = opts & 1, timing = (opts >> 1) & 1;
    fmoe_trace_header h = {.num_layers = L, .num_experts = J, .top_k = K,
                           .probs_kind = FMOE_PROBS_FULL, .probs_half = half,
                           .timing_layers = timing ? L : 0};
    snprintf(h.model_name, sizeof h.model_name, "fuzz");
    snprintf(h.dtype, sizeof h.dtype, "bf16");
    const fmoe_trace_write_options wo = {.flush_requests = 1};
    const char *jpath = work_path("j");
    fmoe__journal *jw = NULL;
    if (fmoe__journal_create(&jw, jpath, &h, "{}", &wo) < 0) fail("cannot create a journal");
    int sizes[MAX_RECORDS][2];
    for (int i = 0; i < nrec; i++) {
        const unsigned b = next_byte(&s);
        sizes[i][0] = (int)(b % 4);                    /* prompt 0..3 */
        sizes[i][1] = (int)((b >> 2) % (MAX_TOKENS - 3 + 1)); /* output 0..3 */
        req r;
        make_request(&r, i, sizes[i][0], sizes[i][1], timing);
        if (fmoe__journal_append(jw, &r.q) < 0) fail("cannot append");
    }
    fmoe__journal_close(jw, 0);
    size_t n = 0;
    unsigned char *orig = slurp(jpath, &n);
    unlink(jpath);
    if (!orig) fail("cannot read the journal back");
    /* record bounds from the framing: 16-byte file header, then head + payload */
    size_t start[MAX_RECORDS + 1], end[MAX_RECORDS + 1];
    size_t at = 16;
    for (int i = 0; i <= nrec; i++) {
        uint64_t len;
        memcpy(&len, orig + at + 8, 8);
        start[i] = at;
        end[i] = at + 16 + (size_t)len;
        at = end[i];
    }
    if (at != n) fail("the framing does not add up to the file");

    /* the damage, 3 bytes an edit: op, then two bytes x, y: for the byte edits and the
     * cuts a position (x << 8 | y, scaled to the file), for a length edit the record (x)
     * and the amount (y) */
    unsigned char *b = malloc(n);
    memcpy(b, orig, n);
    size_t len = n;
    int only_kill_cuts = 1;
    while (s.at + 3 <= s.n) {
        const unsigned op = next_byte(&s), x = next_byte(&s), y = next_byte(&s);
        const size_t pos = ((size_t)x << 8 | y) * n / 65536;
        int rec = 0; /* the record holding pos, by the writer's framing */
        while (rec < nrec && end[rec] <= pos) rec++;
        switch (op % 5) {
        case 0:
            if (pos >= len) break;
            b[pos] ^= (unsigned char)(1u << (op >> 5));
            only_kill_cuts = 0;
            break;
        case 1: /* a run of zeros, as a lost block reads */
            if (pos >= len) break;
            for (size_t i = pos; i < len && i < pos + 1 + (op >> 3); i++) b[i] = 0;
            only_kill_cuts = 0;
            break;
        case 2: /* a kill inside an append: the record it cuts has not got its CRC yet */
            if (pos >= len) break;
            for (size_t i = start[rec] + 4; pos > start[rec] && i < start[rec] + 8 && i < pos; i++)
                b[i] = 0;
            len = pos;
            break;
        case 3: /* the file lost its end: every record before was whole */
            if (pos >= len) break;
            len = pos;
            only_kill_cuts = 0;
            break;
        case 4: { /* a record's length field */
            const size_t at = start[x % (nrec + 1)] + 8;
            if (at + 8 > len) break;
            uint64_t v;
            memcpy(&v, b + at, 8);
            switch ((op >> 3) % 4) {
            case 0: v ^= (uint64_t)1 << (y % 64); break;
            case 1: v += 1 + (uint64_t)y; break;
            case 2: v -= 1 + (uint64_t)y; break;
            case 3: v = (uint64_t)(len - (at + 8)) + (uint64_t)(y % 16) - 8; break;
            }
            memcpy(b + at, &v, 8);
            only_kill_cuts = 0;
            break;
        }
        }
    }
    const char *path = fuzz_memfile(1, b, len);
    int intact[MAX_RECORDS + 1];
    for (int i = 0; i <= nrec; i++)
        intact[i] = end[i] <= len && memcmp(b + start[i], orig + start[i], end[i] - start[i]) == 0;

    fmoe__journal_reader *r = NULL;
    fmoe_trace_header rh;
    fmoe_trace_write_options ro;
    fmoe_error_clear();
    if (fmoe__journal_reader_open(&r, path, &rh, &ro) < 0) {
        if (intact[0] && memcmp(b, orig, 16) == 0)
            fail("refused a journal whose file header and header record are intact");
        if (!fmoe_error_detail()[0]) fail("refused without a detail");
        free(b);
        free(orig);
        return;
    }
    int got[MAX_RECORDS] = {0};
    fmoe_trace_request q;
    int e, recovered = 0;
    while ((e = fmoe__journal_reader_next(r, &q)) > 0) {
        if (q.id < 0 || q.id >= nrec) fail("returned a request that was never written");
        req want;
        make_request(&want, q.id, sizes[q.id][0], sizes[q.id][1], timing);
        if (!same_request(&q, &want.q, half, timing)) fail("returned a request with other values");
        if (got[q.id]++) fail("returned a request twice");
        recovered++;
    }
    if (e < 0) fail("read error on a file in memory");
    const int64_t damaged = fmoe__journal_reader_damaged(r, NULL, NULL);
    const int64_t dropped = fmoe__journal_reader_dropped(r);
    for (int i = 0; i < nrec; i++)
        if (intact[i + 1] && !got[i]) {
            fprintf(stderr, "fuzz_journal: record %d at byte %zu is intact and was lost\n", i,
                    start[i + 1]);
            abort();
        }
    /* a record of which some byte is still in the file and that was not returned must
     * show up as torn tail or damage (a cut exactly between records leaves nothing to say) */
    int present = 0;
    for (int i = 0; i < nrec; i++) present += start[i + 1] < len;
    if (recovered < present && damaged + dropped == 0) fail("lost a request without saying so");
    if (only_kill_cuts && damaged != 0) fail("a kill's cut reported as damage");
    check_torn_claim(b, len, dropped);
    fmoe__journal_reader_close(r);
    free(b);
    free(orig);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if (data[0] & 1)
        scripted_journal(data + 1, size - 1);
    else
        raw_journal(data + 1, size - 1);
    return 0;
}

#ifndef FMOE_LIBFUZZER
/* With FMOE_FUZZ_WRITE_SEEDS=DIR, the seeded replay also writes its first inputs of each
 * kind into DIR: how corpus/journal.tar.zst was made (then pack-corpus.sh journal). */
static void seed_out(const void *p, size_t n, int every) {
    static int count;
    const char *dir = getenv("FMOE_FUZZ_WRITE_SEEDS");
    if (!dir || count++ % every != 0) return;
    char path[1024];
    snprintf(path, sizeof path, "%s/seed-%04d", dir, count);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n) fail("cannot write a seed");
    fclose(f);
}

/* The script's op byte for edit `kind` (op % 5) and, for a length edit, `way` ((op >> 3) % 4). */
static uint8_t script_op(unsigned kind, unsigned way) {
    for (unsigned op = 0; op < 256; op++)
        if (op % 5 == kind && (op >> 3) % 4 == way) return (uint8_t)op;
    abort();
}

/* Seeded scripts (random bytes are a valid script) and raw journals: a scripted one's
 * bytes, mutated as the text targets do. Cheap: a few thousand inputs in about a second. */
int fuzz_seeded_replay(void);
int fuzz_seeded_replay(void) {
    fuzz_mutator m = {.state = 0x6a6f75726e616cull};
    static const char *const tokens[] = {"\x02\x00\x00\x00", "\x00\x00\x00\x00",
                                         "FMOEJRNL", "\xff\xff\xff\xff"};
    m.tokens = tokens;
    m.num_tokens = sizeof tokens / sizeof tokens[0];
    uint8_t in[64];
    for (int i = 0; i < 3000; i++) {
        const size_t n = 3 + fuzz_rng(&m) % (sizeof in - 3);
        for (size_t k = 0; k < n; k++) in[k] = (uint8_t)fuzz_rng(&m);
        in[0] |= 1;
        seed_out(in, n, 60);
        LLVMFuzzerTestOneInput(in, n);
    }
    /* raw: a clean journal of six requests, then byte edits of it */
    const uint8_t clean[] = {1, 3, 5, 0x11, 0x22, 0x33, 0x0f, 0x2a, 0x3c};
    const char *jpath = work_path("seed");
    fmoe_trace_header h = {.num_layers = L, .num_experts = J, .top_k = K,
                           .probs_kind = FMOE_PROBS_FULL};
    const fmoe_trace_write_options wo = {.flush_requests = 1};
    fmoe__journal *jw = NULL;
    if (fmoe__journal_create(&jw, jpath, &h, "{}", &wo) < 0) fail("cannot create a journal");
    for (int i = 0; i < 6; i++) {
        req r;
        make_request(&r, i, 1 + i % 3, i % 4, 0);
        if (fmoe__journal_append(jw, &r.q) < 0) fail("cannot append");
    }
    fmoe__journal_close(jw, 0);
    size_t n = 0;
    unsigned char *j = slurp(jpath, &n);
    unlink(jpath);
    if (!j) fail("cannot read the journal back");
    char *src = malloc(n + 1), *dst = malloc(n + 65);
    src[0] = 0; /* mode even */
    memcpy(src + 1, j, n);
    for (int i = 0; i < 2000; i++) {
        const size_t len = fuzz_mutate(&m, src + 1, n, dst + 1, n + 64);
        dst[0] = 0;
        seed_out(dst, len + 1, 60);
        LLVMFuzzerTestOneInput((const uint8_t *)dst, len + 1);
    }
    LLVMFuzzerTestOneInput(clean, sizeof clean);
    seed_out(clean, sizeof clean, 1);
    /* every bit of every record's length field (the header record's too), each way of
     * changing it, alone and after a kill's cut near the end; the framing oracle and
     * check_torn_claim say whether each loss was reported, and as what */
    int lengths = 0;
    for (unsigned rec = 0; rec <= 6; rec++)
        for (unsigned way = 0; way < 4; way++)
            for (unsigned y = 0; y < 64; y += way == 0 ? 1 : 9)
                for (int cut = 0; cut < 2; cut++) {
                    uint8_t sc[16] = {1, 2, 5, 0x11, 0x22, 0x33, 0x0f, 0x2a, 0x3c};
                    size_t k = 9;
                    if (cut) { /* at 0xff00 of 0x10000 of the file: in the last record */
                        sc[k++] = script_op(2, 0);
                        sc[k++] = 0xff;
                        sc[k++] = 0x00;
                    }
                    sc[k++] = script_op(4, way);
                    sc[k++] = (uint8_t)rec;
                    sc[k++] = (uint8_t)y;
                    seed_out(sc, k, 40);
                    LLVMFuzzerTestOneInput(sc, k);
                    lengths++;
                }
    printf("fuzz_journal: %d length-field edits replayed\n", lengths);
    seed_out(src, n + 1, 1);
    printf("fuzz_journal: 3000 seeded scripts and 2000 mutations of a journal replayed\n");
    free(src);
    free(dst);
    free(j);
    return 0;
}
#endif
