/*
 * import_jsonl.c - `fmoe trace import --format jsonl`: routing logs in the JSON Lines
 * interchange format of docs/design.md §4.1, one object per (request, token, layer):
 *
 *     {"request": 7, "token": 0, "phase": "decode", "layer": 3,
 *      "experts": [5, 1], "probs": [0.71, 0.29], "token_id": 1234}
 *
 * How it works. One pass reads the file line by line and keeps each record compactly
 * (16 bytes of keys, its line number, K uint16 expert ids and, when given, K or J float
 * probabilities), so memory stays a fraction of the input's size. Requests are numbered in
 * the order of their first line (a hash of their ids). A counting sort by request and a
 * sort by (token, layer) within each request then group every token's L layer records;
 * a validation pass checks each group (no duplicate layer, all L layers, one phase, one
 * token_id, prefill before decode) before the writer is opened, so bad input never
 * creates an output file; a last pass fills one request's arrays at a time and appends
 * it to the trace writer.
 *
 * Rules beyond the bare format (documented in the public header and docs/cmd/fmoe-trace.md):
 *   - Blank lines are skipped. A line holding {"type": "meta", ...} is skipped too: the
 *     converters (datasets/vllm_logger_to_jsonl.py) put their provenance there.
 *   - Other keys are ignored. "probs" or "token_id" set to null count as absent.
 *   - Request ids keep their JSON type: 7 and "7" are different requests. When every id
 *     is an integer, /requests/id holds them; otherwise /requests/id is each request's
 *     0-based order of first appearance.
 *   - Token positions may have gaps; only their order matters.
 *   - probs with K values follow `experts` (gate order) and are stored as a dense row
 *     with zeros elsewhere (probs_kind topk); with J values they are the distribution
 *     over experts 0..J-1 (full). When K == J the K values follow `experts` and the kind
 *     is full. All lines must agree on the kind.
 *   - A request whose tokens were all dropped (drop_incomplete) is left out.
 *
 * Cost: a line count, then one cJSON parse per line; O(n log n) sorting within requests;
 * memory 24 + 2K (+ 4K or 4J) bytes per line, allocated once, plus 8 bytes per line for
 * the sort and one request's dense arrays (1.9 M lines of K = 4 top-k records, 232 MB of
 * text, import in ~2.7 s with ~200 MB resident).
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <stdint.h>
#include "datasets_impl.h"
#include "fmoe/datasets.h"
#include "fmoe/error.h"
#include "files.h"

/* One input line's keys; the line's experts and probs live in parallel pools. */
typedef struct jrec {
    int32_t request;  /* index into the request table (first-appearance order) */
    int32_t token;    /* position within the request */
    int32_t token_id; /* -1 when not given */
    uint16_t layer;
    uint8_t phase;    /* FMOE_PHASE_* */
    uint8_t has_token_id;
} jrec;

typedef struct req_key {
    int64_t ival;
    char *sval; /* NULL: integer id */
} req_key;

typedef struct req_info {
    int64_t tok_begin, tok_end; /* kept tokens: [tok_begin, tok_end) of jimport.tok */
    int32_t prompt_tokens;
} req_info;

typedef struct jimport {
    const char *path;
    int32_t L, J, K;
    /* records in input order */
    int64_t n;
    int64_t cap_rec, cap_line, cap_exp, cap_prob;
    jrec *rec;          /* [n] */
    int64_t *line;      /* [n] 1-based line numbers */
    uint16_t *experts;  /* [n][K] */
    float *probs;       /* [n][P] */
    int32_t P;          /* probabilities per record: 0, K or J */
    int64_t reserve;    /* records to allocate room for at once (lines in the file) */
    int kind_known;
    int64_t kind_line;  /* the line that fixed the kind */
    fmoe_probs_kind kind;
    /* requests */
    req_key *keys;      /* [nreq] */
    int64_t nreq, cap_req;
    int32_t *slots;     /* hash table of request indices, -1 empty */
    int64_t nslots;
    int all_int;
    /* grouping */
    int64_t *perm;      /* [n] record indices sorted by (request, token, layer) */
    int64_t *req_start; /* [nreq + 1] bucket starts in perm */
    int64_t *tok;       /* [ntok] perm index of each kept token's layer-0 record */
    int64_t ntok;
    req_info *reqs;     /* [nreq] */
} jimport;

static void jimport_free(jimport *im) {
    free(im->rec);
    free(im->line);
    free(im->experts);
    free(im->probs);
    for (int64_t i = 0; i < im->nreq; i++) free(im->keys[i].sval);
    free(im->keys);
    free(im->slots);
    free(im->perm);
    free(im->req_start);
    free(im->tok);
    free(im->reqs);
}

/* ------------------------------------------------------------ request ids */

static uint64_t hash_key(const req_key *k) {
    uint64_t h = 1469598103934665603ull;
    if (k->sval) {
        for (const unsigned char *p = (const unsigned char *)k->sval; *p; p++)
            h = (h ^ *p) * 1099511628211ull;
        h = (h ^ 0xff) * 1099511628211ull;
    } else {
        uint64_t v = (uint64_t)k->ival;
        for (int i = 0; i < 8; i++) h = (h ^ ((v >> (8 * i)) & 0xff)) * 1099511628211ull;
    }
    return h;
}

static int key_eq(const req_key *a, const req_key *b) {
    if (!a->sval != !b->sval) return 0;
    return a->sval ? strcmp(a->sval, b->sval) == 0 : a->ival == b->ival;
}

static int rehash(jimport *im, int64_t nslots) {
    int32_t *s = malloc((size_t)nslots * sizeof *s);
    if (!s) return fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", im->path);
    for (int64_t i = 0; i < nslots; i++) s[i] = -1;
    for (int64_t r = 0; r < im->nreq; r++) {
        uint64_t i = hash_key(&im->keys[r]) & (uint64_t)(nslots - 1);
        while (s[i] >= 0) i = (i + 1) & (uint64_t)(nslots - 1);
        s[i] = (int32_t)r;
    }
    free(im->slots);
    im->slots = s;
    im->nslots = nslots;
    return 0;
}

/* The request index of `k`, adding it when new (takes ownership of k->sval). */
static int request_index(jimport *im, req_key *k, int32_t *out, int64_t lineno) {
    if (im->nslots == 0 || (im->nreq + 1) * 2 > im->nslots)
        FMOE_FORWARD_IF_ERROR(rehash(im, im->nslots ? im->nslots * 2 : 1024));
    uint64_t mask = (uint64_t)(im->nslots - 1), i = hash_key(k) & mask;
    while (im->slots[i] >= 0) {
        if (key_eq(&im->keys[im->slots[i]], k)) {
            free(k->sval);
            k->sval = NULL;
            *out = im->slots[i];
            return 0;
        }
        i = (i + 1) & mask;
    }
    if (im->nreq >= INT32_MAX)
        return fmoe_error_set(FMOE_ERANGE, "%s:%lld: too many requests", im->path,
                              (long long)lineno);
    FMOE_FORWARD_IF_ERROR(
        fmoe__ds_grow((void **)&im->keys, sizeof *im->keys, &im->cap_req, im->nreq + 1));
    im->keys[im->nreq] = *k;
    k->sval = NULL;
    if (im->keys[im->nreq].sval) im->all_int = 0;
    im->slots[i] = (int32_t)im->nreq;
    *out = (int32_t)im->nreq++;
    return 0;
}

/* "request 7" / "request \"abc\"" for messages. */
static void request_name(const jimport *im, int32_t r, char *buf, size_t cap) {
    const req_key *k = &im->keys[r];
    if (k->sval)
        snprintf(buf, cap, "request \"%.100s\"", k->sval);
    else
        snprintf(buf, cap, "request %lld", (long long)k->ival);
}

/* ------------------------------------------------------------ one line */

/* An integral JSON number in [lo, hi]. @return 0, -1 not an integer, -2 out of range. */
static int get_int(const cJSON *v, double lo, double hi, int64_t *out) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!isfinite(d) || d != floor(d)) return -1;
    if (d < lo || d > hi) return -2;
    *out = (int64_t)d;
    return 0;
}

/* "no probs", "K = 2 probs", "J = 64 probs" for messages. */
static void probs_count_name(int np, int K, char *buf, size_t cap) {
    if (np == 0)
        snprintf(buf, cap, "no probs");
    else
        snprintf(buf, cap, "%s = %d probs", np == K ? "K" : "J", np);
}

#define LINE_ERROR(code, ...)                                                          \
    do {                                                                               \
        char m__[256];                                                                 \
        snprintf(m__, sizeof m__, __VA_ARGS__);                                        \
        rc = fmoe_error_set((code), "%s:%lld: %s", im->path, (long long)lineno, m__);  \
        goto done;                                                                     \
    } while (0)

/* Parses one non-blank line; appends a record unless it is a meta line.
 * @return 1 record added, 0 skipped (meta), or an error. */
static int parse_line(jimport *im, const char *s, size_t len, int64_t lineno) {
    int rc = 0;
    const int32_t L = im->L, J = im->J, K = im->K;
    req_key key = {0, NULL};
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithLengthOpts(s, len, &end, 0);
    if (!o || !fmoe__ds_is_blank(end, len - (size_t)(end - s))) {
        const char *at = o ? end : cJSON_GetErrorPtr();
        long long col = (at && at >= s && at <= s + len) ? (long long)(at - s) + 1 : 1;
        cJSON_Delete(o);
        return fmoe_error_set(FMOE_EFORMAT, "%s:%lld: malformed JSON (column %lld)", im->path,
                              (long long)lineno, col);
    }
    if (!cJSON_IsObject(o)) LINE_ERROR(FMOE_EFORMAT, "expected a JSON object");

    const cJSON *type = cJSON_GetObjectItemCaseSensitive(o, "type");
    if (cJSON_IsString(type) && strcmp(type->valuestring, "meta") == 0) goto done;

    /* request */
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "request");
    if (!v) LINE_ERROR(FMOE_EFORMAT, "no \"request\"");
    if (cJSON_IsString(v)) {
        key.sval = strdup(v->valuestring);
        if (!key.sval) LINE_ERROR(FMOE_ENOMEM, "out of memory");
    } else {
        /* Integers beyond 2^53 do not survive a double: ask for a string instead. */
        int g = get_int(v, -9007199254740992.0, 9007199254740992.0, &key.ival);
        if (g == -2) LINE_ERROR(FMOE_ERANGE, "\"request\" id beyond 2^53 (write it as a string)");
        if (g < 0) LINE_ERROR(FMOE_EFORMAT, "\"request\" must be an integer or a string");
    }

    jrec r = {0};
    int64_t t;
    int g = get_int(cJSON_GetObjectItemCaseSensitive(o, "token"), 0, INT32_MAX - 1, &t);
    if (!cJSON_GetObjectItemCaseSensitive(o, "token")) LINE_ERROR(FMOE_EFORMAT, "no \"token\"");
    if (g == -2) LINE_ERROR(FMOE_ERANGE, "\"token\" out of range (0..%d)", INT32_MAX - 1);
    if (g < 0) LINE_ERROR(FMOE_EFORMAT, "\"token\" must be a non-negative integer");
    r.token = (int32_t)t;

    v = cJSON_GetObjectItemCaseSensitive(o, "layer");
    if (!v) LINE_ERROR(FMOE_EFORMAT, "no \"layer\"");
    int64_t l;
    if (get_int(v, -1e18, 1e18, &l) < 0) LINE_ERROR(FMOE_EFORMAT, "\"layer\" must be an integer");
    if (l < 0 || l >= L) LINE_ERROR(FMOE_ERANGE, "layer %lld out of range (L = %d)", (long long)l, L);
    r.layer = (uint16_t)l;

    v = cJSON_GetObjectItemCaseSensitive(o, "phase");
    r.phase = FMOE_PHASE_DECODE;
    if (v && !cJSON_IsNull(v)) {
        if (cJSON_IsString(v) && strcmp(v->valuestring, "prefill") == 0)
            r.phase = FMOE_PHASE_PREFILL;
        else if (!(cJSON_IsString(v) && strcmp(v->valuestring, "decode") == 0))
            LINE_ERROR(FMOE_EFORMAT, "\"phase\" must be \"prefill\" or \"decode\"");
    }

    v = cJSON_GetObjectItemCaseSensitive(o, "token_id");
    r.token_id = -1;
    if (v && !cJSON_IsNull(v)) {
        int64_t tid;
        int gt = get_int(v, -1, INT32_MAX, &tid);
        if (gt == -2) LINE_ERROR(FMOE_ERANGE, "\"token_id\" out of range (-1..%d)", INT32_MAX);
        if (gt < 0) LINE_ERROR(FMOE_EFORMAT, "\"token_id\" must be an integer");
        r.token_id = (int32_t)tid;
        r.has_token_id = 1;
    }

    /* experts */
    v = cJSON_GetObjectItemCaseSensitive(o, "experts");
    if (!v) LINE_ERROR(FMOE_EFORMAT, "no \"experts\"");
    if (!cJSON_IsArray(v)) LINE_ERROR(FMOE_EFORMAT, "\"experts\" must be a list");
    int ne = cJSON_GetArraySize(v);
    if (ne != K) LINE_ERROR(FMOE_EFORMAT, "\"experts\" has %d values, expected K = %d", ne, K);
    const int64_t n = im->n, want = n + 1 > im->reserve ? n + 1 : im->reserve;
    rc = fmoe__ds_grow((void **)&im->experts, sizeof *im->experts * (size_t)K, &im->cap_exp, want);
    if (rc < 0) goto done;
    uint16_t *ex = im->experts + (size_t)n * K;
    {
        int i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, v) {
            int64_t x;
            int ge = get_int(e, -1e18, 1e18, &x);
            if (ge < 0) LINE_ERROR(FMOE_EFORMAT, "experts[%d] is not an integer", i);
            if (x < 0 || x >= J)
                LINE_ERROR(FMOE_ERANGE, "expert %lld out of range (J = %d)", (long long)x, J);
            for (int k = 0; k < i; k++)
                if (ex[k] == x) LINE_ERROR(FMOE_EFORMAT, "expert %lld chosen twice", (long long)x);
            ex[i++] = (uint16_t)x;
        }
    }

    /* probs: all lines must agree on none / K values / J values */
    v = cJSON_GetObjectItemCaseSensitive(o, "probs");
    if (v && cJSON_IsNull(v)) v = NULL;
    int np = 0;
    if (v) {
        if (!cJSON_IsArray(v)) LINE_ERROR(FMOE_EFORMAT, "\"probs\" must be a list");
        np = cJSON_GetArraySize(v);
        if (np != K && np != J)
            LINE_ERROR(FMOE_EFORMAT, "\"probs\" has %d values, expected K = %d or J = %d", np, K, J);
    }
    if (!im->kind_known) {
        im->kind_known = 1;
        im->kind_line = lineno;
        im->P = np;
        im->kind = np == 0 ? FMOE_PROBS_NONE : (np == K && K != J) ? FMOE_PROBS_TOPK : FMOE_PROBS_FULL;
    } else if (np != im->P) {
        char here[48], there[48];
        probs_count_name(np, K, here, sizeof here);
        probs_count_name(im->P, K, there, sizeof there);
        LINE_ERROR(FMOE_EMISMATCH, "%s, but line %lld has %s (probs kinds cannot be mixed)",
                   here, (long long)im->kind_line, there);
    }
    if (np > 0) {
        rc = fmoe__ds_grow((void **)&im->probs, sizeof *im->probs * (size_t)np, &im->cap_prob, want);
        if (rc < 0) goto done;
        float *pr = im->probs + (size_t)n * np;
        int i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, v) {
            if (!cJSON_IsNumber(e)) LINE_ERROR(FMOE_EFORMAT, "probs[%d] is not a number", i);
            double d = e->valuedouble;
            if (!isfinite(d) || d < 0 || !isfinite((float)d))
                LINE_ERROR(FMOE_ERANGE, "probs[%d] = %g is not a finite non-negative number", i, d);
            pr[i++] = (float)d;
        }
        rc = fmoe__ds_check_probs(pr, np, im->kind == FMOE_PROBS_FULL, im->path, lineno, "probs");
        if (rc < 0) goto done;
    }

    rc = request_index(im, &key, &r.request, lineno);
    if (rc < 0) goto done;
    rc = fmoe__ds_grow((void **)&im->rec, sizeof *im->rec, &im->cap_rec, want);
    if (rc < 0) goto done;
    rc = fmoe__ds_grow((void **)&im->line, sizeof *im->line, &im->cap_line, want);
    if (rc < 0) goto done;
    im->rec[n] = r;
    im->line[n] = lineno;
    im->n = n + 1;
    rc = 1;
done:
    free(key.sval);
    cJSON_Delete(o);
    return rc;
}

#undef LINE_ERROR

static int read_records(jimport *im, const fmoe_import_options *opts, fmoe_import_report *rep) {
    FILE *f;
    FMOE_FORWARD_IF_ERROR(fmoe__fopen_regular(im->path, &f)); /* no FIFO, no /dev/zero */
    struct stat st;
    int64_t total = fstat(fileno(f), &st) == 0 ? (int64_t)st.st_size : 0;
    /* Count the lines first (a fast pass over the page cache), so the record arrays are
     * allocated once at their final size instead of doubling. */
    char *buf = malloc(1 << 20);
    size_t cap = 1 << 20;
    if (!buf) {
        fclose(f);
        return fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", im->path);
    }
    int64_t nlines = 1;
    size_t got_block;
    while ((got_block = fread(buf, 1, cap, f)) > 0)
        for (const char *p = buf; (p = memchr(p, '\n', (size_t)(buf + got_block - p))); p++)
            nlines++;
    rewind(f);
    im->reserve = nlines;
    ssize_t got;
    int64_t lineno = 0, bytes = 0;
    int rc = 0;
    while ((got = getline(&buf, &cap, f)) >= 0) {
        lineno++;
        bytes += got;
        size_t len = (size_t)got;
        const char *s = buf;
        if (lineno == 1 && len >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0) {
            s += 3;
            len -= 3;
        }
        if (fmoe__ds_is_blank(s, len)) continue;
        rc = parse_line(im, s, len, lineno);
        if (rc < 0) break;
        rep->lines += rc;
        if ((lineno & 4095) == 0) fmoe_progress_report(&opts->progress, bytes, total, "bytes");
    }
    if (rc >= 0 && ferror(f)) rc = fmoe_error_set(FMOE_EIO, "%s: read error", im->path);
    free(buf);
    fclose(f);
    if (rc < 0) return rc;
    fmoe_progress_report(&opts->progress, bytes, total, "bytes");
    if (im->n == 0) return fmoe_error_set(FMOE_EFORMAT, "%s: no routing records", im->path);
    return 0;
}

/* ------------------------------------------------------------ grouping and checks */

typedef struct sort_item {
    uint64_t key; /* token << 16 | layer */
    int64_t ord;  /* record index: ties keep input order */
} sort_item;

static int cmp_item(const void *a, const void *b) {
    const sort_item *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return (x->ord > y->ord) - (x->ord < y->ord);
}

static int group_records(jimport *im) {
    const int64_t n = im->n, R = im->nreq;
    im->perm = malloc((size_t)n * sizeof *im->perm);
    im->req_start = calloc((size_t)R + 1, sizeof *im->req_start);
    if (!im->perm || !im->req_start) return fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", im->path);
    for (int64_t i = 0; i < n; i++) im->req_start[im->rec[i].request + 1]++;
    int64_t largest = 0;
    for (int64_t r = 0; r < R; r++) {
        int64_t c = im->req_start[r + 1];
        if (c > largest) largest = c;
        im->req_start[r + 1] += im->req_start[r];
    }
    int64_t *fill = malloc((size_t)R * sizeof *fill);
    sort_item *items = malloc((size_t)largest * sizeof *items);
    if (!fill || !items) {
        free(fill);
        free(items);
        return fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", im->path);
    }
    memcpy(fill, im->req_start, (size_t)R * sizeof *fill);
    for (int64_t i = 0; i < n; i++) im->perm[fill[im->rec[i].request]++] = i;
    for (int64_t r = 0; r < R; r++) {
        int64_t b = im->req_start[r], c = im->req_start[r + 1] - b;
        for (int64_t i = 0; i < c; i++) {
            const jrec *x = &im->rec[im->perm[b + i]];
            items[i].key = ((uint64_t)x->token << 16) | x->layer;
            items[i].ord = im->perm[b + i];
        }
        qsort(items, (size_t)c, sizeof *items, cmp_item);
        for (int64_t i = 0; i < c; i++) im->perm[b + i] = items[i].ord;
    }
    free(fill);
    free(items);
    return 0;
}

/* Checks every token group; records kept tokens and per-request counts. */
static int validate(jimport *im, int drop_incomplete, fmoe_import_report *rep) {
    const int32_t L = im->L;
    im->tok = malloc((size_t)(im->n / L + 1) * sizeof *im->tok);
    im->reqs = calloc((size_t)im->nreq, sizeof *im->reqs);
    if (!im->tok || !im->reqs) return fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", im->path);
    char name[128];
    for (int32_t r = 0; r < im->nreq; r++) {
        req_info *ri = &im->reqs[r];
        ri->tok_begin = im->ntok;
        int seen_decode = 0;
        int32_t decode_token = 0;
        int64_t g = im->req_start[r], end = im->req_start[r + 1];
        while (g < end) {
            const jrec *first = &im->rec[im->perm[g]];
            int64_t e = g + 1;
            while (e < end && im->rec[im->perm[e]].token == first->token) e++;
            /* [g, e): one token's records sorted by layer, ties in input order */
            int64_t first_line = im->line[im->perm[g]];
            int32_t token_id = first->has_token_id ? first->token_id : -1;
            int64_t token_id_line = first->has_token_id ? im->line[im->perm[g]] : 0;
            for (int64_t i = g; i < e; i++) {
                const jrec *x = &im->rec[im->perm[i]];
                int64_t ln = im->line[im->perm[i]];
                if (ln < first_line) first_line = ln;
                if (i > g && x->layer == im->rec[im->perm[i - 1]].layer) {
                    request_name(im, r, name, sizeof name);
                    return fmoe_error_set(FMOE_EFORMAT,
                                          "%s:%lld: %s token %d layer %d repeats line %lld",
                                          im->path, (long long)ln, name, (int)x->token,
                                          (int)x->layer, (long long)im->line[im->perm[i - 1]]);
                }
                if (x->phase != first->phase) {
                    request_name(im, r, name, sizeof name);
                    return fmoe_error_set(FMOE_EMISMATCH,
                                          "%s:%lld: %s token %d is \"%s\" here but \"%s\" at "
                                          "line %lld",
                                          im->path, (long long)ln, name, (int)x->token,
                                          x->phase == FMOE_PHASE_PREFILL ? "prefill" : "decode",
                                          first->phase == FMOE_PHASE_PREFILL ? "prefill" : "decode",
                                          (long long)im->line[im->perm[g]]);
                }
                if (x->has_token_id) {
                    if (token_id_line && x->token_id != token_id) {
                        request_name(im, r, name, sizeof name);
                        return fmoe_error_set(FMOE_EMISMATCH,
                                              "%s:%lld: %s token %d has token_id %d here but "
                                              "%d at line %lld",
                                              im->path, (long long)ln, name, (int)x->token,
                                              (int)x->token_id, (int)token_id,
                                              (long long)token_id_line);
                    }
                    token_id = x->token_id;
                    token_id_line = ln;
                }
            }
            if (e - g < L) {
                if (drop_incomplete) {
                    rep->dropped_tokens++;
                    g = e;
                    continue;
                }
                /* Name up to four missing layers. */
                char miss[96];
                size_t mlen = 0;
                int nmiss = 0;
                int64_t i = g;
                for (int32_t l = 0; l < L; l++) {
                    if (i < e && im->rec[im->perm[i]].layer == l) {
                        i++;
                        continue;
                    }
                    if (nmiss < 4 && mlen < sizeof miss)
                        mlen += (size_t)snprintf(miss + mlen, sizeof miss - mlen, "%s%d",
                                                 nmiss ? ", " : "", (int)l);
                    nmiss++;
                }
                if (nmiss > 4 && mlen < sizeof miss)
                    snprintf(miss + mlen, sizeof miss - mlen, ", ...");
                request_name(im, r, name, sizeof name);
                return fmoe_error_set(FMOE_EINCOMPLETE,
                                      "%s: %s token %d (first at line %lld) lacks %d of %d "
                                      "layers (%s); drop_incomplete drops such tokens",
                                      im->path, name, (int)first->token, (long long)first_line,
                                      nmiss, (int)L, miss);
            }
            if (first->phase == FMOE_PHASE_DECODE) {
                if (!seen_decode) decode_token = first->token;
                seen_decode = 1;
            } else if (seen_decode) {
                request_name(im, r, name, sizeof name);
                return fmoe_error_set(FMOE_EFORMAT,
                                      "%s:%lld: %s prefill token %d comes after decode token "
                                      "%d (prefill tokens must come first)",
                                      im->path, (long long)first_line, name, (int)first->token,
                                      (int)decode_token);
            } else {
                ri->prompt_tokens++;
            }
            im->tok[im->ntok++] = g;
            g = e;
        }
        ri->tok_end = im->ntok;
        if (ri->tok_end > ri->tok_begin) rep->requests++;
    }
    rep->tokens = im->ntok;
    if (im->ntok == 0)
        return fmoe_error_set(FMOE_EINCOMPLETE, "%s: no complete token (all %lld dropped)",
                              im->path, (long long)rep->dropped_tokens);
    return 0;
}

/* ------------------------------------------------------------ writing */

static int write_trace(jimport *im, const fmoe_import_options *opts, const char *out_path,
                       fmoe_import_report *rep) {
    const int32_t L = im->L, J = im->J, K = im->K;
    int64_t maxT = 0;
    for (int64_t r = 0; r < im->nreq; r++) {
        int64_t T = im->reqs[r].tok_end - im->reqs[r].tok_begin;
        if (T > maxT) maxT = T;
    }
    fmoe_trace_header h;
    FMOE_FORWARD_IF_ERROR(fmoe__ds_import_header(opts, fmoe__ds_basename(im->path), "import:jsonl",
                                              im->kind, &h));
    const int with_probs = im->kind != FMOE_PROBS_NONE;
    const int by_experts = im->P == K; /* K values follow `experts` */
    int32_t *token_id = malloc((size_t)maxT * sizeof *token_id);
    uint8_t *phase = malloc((size_t)maxT);
    uint16_t *experts = malloc((size_t)maxT * L * K * sizeof *experts);
    float *probs = with_probs ? malloc((size_t)maxT * L * J * sizeof *probs) : NULL;
    fmoe_trace_writer *w = NULL;
    int rc = 0;
    if (!token_id || !phase || !experts || (with_probs && !probs)) {
        rc = fmoe_error_set(FMOE_ENOMEM, "%s: cannot allocate a request of %lld tokens",
                            im->path, (long long)maxT);
        goto fail;
    }
    /* An import leaves nothing behind on failure, so per-request flushes (which
     * recompress partly filled chunks) buy nothing: flush once, at close. */
    fmoe_trace_write_options write_opts = opts->write;
    if (write_opts.flush_requests == 0) write_opts.flush_requests = INT32_MAX;
    rc = fmoe_trace_writer_open(&w, out_path, &h, &write_opts);
    if (rc < 0) goto fail;
    int64_t done = 0;
    for (int32_t r = 0; r < im->nreq; r++) {
        const req_info *ri = &im->reqs[r];
        int64_t T = ri->tok_end - ri->tok_begin;
        if (T == 0) continue;
        if (with_probs) memset(probs, 0, (size_t)T * L * J * sizeof *probs);
        for (int64_t t = 0; t < T; t++) {
            int64_t g = im->tok[ri->tok_begin + t];
            token_id[t] = -1;
            phase[t] = im->rec[im->perm[g]].phase;
            for (int32_t l = 0; l < L; l++) {
                int64_t o = im->perm[g + l];
                const jrec *x = &im->rec[o];
                if (x->has_token_id) token_id[t] = x->token_id;
                const uint16_t *ex = im->experts + (size_t)o * K;
                memcpy(experts + ((size_t)t * L + l) * K, ex, (size_t)K * sizeof *ex);
                if (!with_probs) continue;
                float *row = probs + ((size_t)t * L + l) * J;
                const float *p = im->probs + (size_t)o * im->P;
                if (by_experts)
                    for (int32_t k = 0; k < K; k++) row[ex[k]] = p[k];
                else
                    memcpy(row, p, (size_t)J * sizeof *row);
            }
        }
        fmoe_trace_request req = {
            .id = im->all_int ? im->keys[r].ival : r,
            .arrival_s = 0.0,
            .prompt_tokens = ri->prompt_tokens,
            .output_tokens = (int32_t)(T - ri->prompt_tokens),
            .token_id = token_id,
            .phase = phase,
            .experts = experts,
            .probs = probs,
        };
        rc = fmoe_trace_writer_append_request(w, &req);
        if (rc < 0) goto fail;
        done += T;
        fmoe_progress_report(&opts->progress, done, rep->tokens, "tokens");
    }
    rc = fmoe_trace_writer_close(w);
    w = NULL;
    if (rc < 0) goto fail;
    free(token_id);
    free(phase);
    free(experts);
    free(probs);
    return 0;
fail:
    fmoe_trace_writer_abort(w);
    free(token_id);
    free(phase);
    free(experts);
    free(probs);
    return rc;
}

int fmoe_import_jsonl(const char *in_path, const fmoe_import_options *opts,
                      const char *out_path, fmoe_import_report *report) {
    fmoe_import_report rep = {0};
    if (report) *report = rep;
    FMOE_RETURN_ERROR_IF(!in_path || !out_path, FMOE_EINVAL, "import: no input or output path");
    FMOE_FORWARD_IF_ERROR(fmoe__ds_import_check_options(opts));
    jimport im = {
        .path = in_path,
        .L = opts->geometry->num_moe_layers,
        .J = opts->geometry->num_experts,
        .K = opts->geometry->top_k,
        .all_int = 1,
    };
    int rc = read_records(&im, opts, &rep);
    if (rc >= 0) rc = group_records(&im);
    if (rc >= 0) rc = validate(&im, opts->drop_incomplete, &rep);
    rep.probs_kind = im.kind;
    if (rc >= 0) rc = write_trace(&im, opts, out_path, &rep);
    jimport_free(&im);
    if (report) *report = rep;
    return rc < 0 ? rc : 0;
}
