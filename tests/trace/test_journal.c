/*
 * test_journal.c - the trace writer's journal and fmoe_trace_recover (trace_journal.c).
 *
 * The kill test in tests/python/test_crash_safety.py kills a real recorder at random
 * instants; this one is exhaustive on a small sample instead: a journal cut at (nearly)
 * every byte offset, as a kill mid-write would leave it, must recover to exactly the
 * requests whose records are whole, with the sample's values (the record a kill cuts has
 * CRC 0: the append writes it last); the same cut of a finished journal, a flipped bit
 * anywhere (the last record's length field included) or a journal cut at a record boundary
 * beside a .partial holding more is damage: reported with its offset, costing only the
 * record it hit, the .partial used when it holds more, nothing removed; the writer's
 * lifecycle (close, abort, close_partial, a journal already there, a failed close) leaves
 * the files it promises.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fmoe/error.h"
#include "fmoe/trace.h"
#include "harness.h"
#include "sample_trace.h"

static char scratch_dir[512];

static const char *tmp_path(const char *name) {
    static char bufs[8][1024];
    static int next;
    if (!scratch_dir[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(scratch_dir, sizeof scratch_dir, "%s/fmoe-test-journal-XXXXXX",
                 base && base[0] ? base : "/tmp");
        if (!mkdtemp(scratch_dir)) {
            perror("mkdtemp");
            abort();
        }
    }
    char *b = bufs[next++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", scratch_dir, name);
    return b;
}

static int rm_entry(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(p);
}

static int file_exists(const char *p) {
    struct stat st;
    return lstat(p, &st) == 0;
}

static char *with_suffix(const char *path, const char *suffix) {
    static char b[4][1100];
    static int next;
    char *out = b[next++ % 4];
    snprintf(out, sizeof b[0], "%s%s", path, suffix);
    return out;
}

/* Reads a whole file (malloc'd) and its size. */
static unsigned char *slurp(const char *path, long *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)*n + 1);
    if (b && fread(b, 1, (size_t)*n, f) != (size_t)*n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    return b;
}

static int spit(const char *path, const unsigned char *b, long n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fwrite(b, 1, (size_t)n, f) == (size_t)n;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* A child that opens a writer on `path` (float16 gates), appends `count` requests of the
 * sample and dies without closing anything, as a SIGKILL right after the last append
 * returned would leave it. */
static int killed_writer_with(const char *path, int count, const int64_t *layer_bytes) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        fmoe_trace_header h = sample_header(1);
        h.layer_expert_bytes = layer_bytes;
        fmoe_trace_writer *w = NULL;
        if (fmoe_trace_writer_open(&w, path, &h, NULL) < 0) _exit(3);
        if (sample_append(w, count) < 0) _exit(4);
        _exit(0);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
    return WEXITSTATUS(status) == 0 ? 0 : -1;
}

static int killed_writer(const char *path, int count) {
    return killed_writer_with(path, count, NULL);
}

static void check_recovered(int *harness_failed, const char *path, int nreq) {
    fmoe_trace_reader *r = NULL;
    ASSERT_OK(fmoe_trace_reader_open(&r, path));
    char why[256];
    const char *diff = sample_verify(r, nreq, 1, why, sizeof why);
    fmoe_trace_reader_close(r);
    if (diff) HARNESS_FAIL("%s: %s", path, diff);
}

/* The ids and token ids of the trace at `path`, against the sample's requests that are not
 * `skip` (-1: none). */
static void check_all_but(int *harness_failed, const char *path, int skip) {
    fmoe_trace_reader *r = NULL;
    ASSERT_OK(fmoe_trace_reader_open(&r, path));
    const int64_t R = fmoe_trace_reader_num_requests(r);
    const fmoe_trace_request_info *q = fmoe_trace_reader_requests(r);
    int32_t tok[SAMPLE_T];
    fmoe_trace_token_buffers b = {.token_id = tok};
    ASSERT_EQ(R, SAMPLE_R - (skip >= 0));
    ASSERT_OK(fmoe_trace_reader_read_tokens(r, 0, fmoe_trace_reader_num_tokens(r), &b));
    int i = 0;
    for (int s = 0; s < SAMPLE_R; s++) {
        if (s == skip) continue;
        ASSERT_EQ(q[i].id, 100 + 7 * s);
        for (int t = 0; t < sample_prompt[s] + sample_output[s]; t++)
            ASSERT_EQ(tok[q[i].token_begin + t], sample_token_id(sample_first_token(s) + t));
        i++;
    }
    fmoe_trace_reader_close(r);
}

/* Offsets where records end, from the journal's own framing (16-byte file header, then
 * records of a 16-byte head whose last 8 bytes are the payload length). */
static int record_ends(const unsigned char *b, long n, long *ends, int cap) {
    long at = 16;
    int k = 0;
    while (at + 16 <= n && k < cap) {
        uint64_t len;
        memcpy(&len, b + at + 8, 8);
        at += 16 + (long)len;
        if (at > n) break;
        ends[k++] = at;
    }
    return k;
}

TEST(kill_after_appends_recovers_every_request) {
    const char *path = tmp_path("k.h5");
    ASSERT_OK(killed_writer(path, 2));
    const char *partial = with_suffix(path, ".partial");
    ASSERT_TRUE(file_exists(partial));
    ASSERT_TRUE(file_exists(with_suffix(path, ".partial.journal")));
    /* a new writer refuses to start over the journal */
    fmoe_trace_header h = sample_header(1);
    fmoe_trace_writer *w = NULL;
    ASSERT_EQ(fmoe_trace_writer_open(&w, path, &h, NULL), FMOE_EIO);
    ASSERT_CONTAINS(fmoe_error_detail(), "fmoe trace recover");
    ASSERT_TRUE(file_exists(with_suffix(path, ".partial.journal")));
    fmoe_trace_recover_report rep;
    ASSERT_OK(fmoe_trace_recover(partial, NULL, &rep));
    ASSERT_EQ(rep.from_journal, 1);
    ASSERT_EQ(rep.requests, 2);
    ASSERT_EQ(rep.dropped_bytes, 0);
    ASSERT_STR_EQ(rep.output, path);
    ASSERT_TRUE(!file_exists(partial) && !file_exists(with_suffix(path, ".partial.journal")));
    check_recovered(harness_failed, path, 2);
    /* never over an existing trace */
    ASSERT_OK(killed_writer(tmp_path("k2.h5"), 1));
    ASSERT_EQ(fmoe_trace_recover(with_suffix(tmp_path("k2.h5"), ".partial"), path, &rep),
              FMOE_EIO);
    ASSERT_CONTAINS(fmoe_error_detail(), "exists");
    check_recovered(harness_failed, path, 2);
}

/* Per-layer expert bytes (a llama-quantize mix) travel in the journal's header record. */
TEST(recovery_keeps_the_layers_expert_bytes) {
    int64_t bytes[SAMPLE_L];
    for (int l = 0; l < SAMPLE_L; l++) bytes[l] = SAMPLE_EXPERT_BYTES - 64 * l;
    const char *path = tmp_path("layers.h5");
    ASSERT_OK(killed_writer_with(path, 2, bytes));
    fmoe_trace_recover_report rep;
    ASSERT_OK(fmoe_trace_recover(with_suffix(path, ".partial"), NULL, &rep));
    ASSERT_EQ(rep.from_journal, 1);
    fmoe_trace_reader *r = NULL;
    ASSERT_OK(fmoe_trace_reader_open(&r, path));
    const fmoe_trace_header *h = fmoe_trace_reader_header(r);
    ASSERT_TRUE(h->layer_expert_bytes != NULL);
    for (int l = 0; l < SAMPLE_L; l++) ASSERT_EQ(h->layer_expert_bytes[l], bytes[l]);
    fmoe_trace_reader_close(r);
}

/* Whether the file at `path` holds exactly b[0..n). */
static int same_bytes(const char *path, const unsigned char *b, long n) {
    long m = 0;
    unsigned char *c = slurp(path, &m);
    const int same = c && m == n && memcmp(b, c, (size_t)n) == 0;
    free(c);
    return same;
}

/* A kill cuts a journal inside the record being appended, whose CRC the append had not
 * written yet (it goes in last); a journal that loses its end after the CRC was written is
 * damage. Both at (nearly) every byte offset. */
TEST(journal_cut_anywhere_recovers_the_whole_records) {
    const char *path = tmp_path("cut.h5");
    ASSERT_OK(killed_writer(path, SAMPLE_R));
    long n = 0;
    unsigned char *b = slurp(with_suffix(path, ".partial.journal"), &n);
    ASSERT_TRUE(b != NULL);
    unsigned char *c = malloc((size_t)n);
    ASSERT_TRUE(c != NULL);
    long ends[8];
    const int k = record_ends(b, n, ends, 8);
    ASSERT_EQ(k, 1 + SAMPLE_R); /* the header record, then one per request */
    ASSERT_EQ(ends[k - 1], n);
    int tried = 0, lost_ends = 0;
    for (long cut = 0; cut <= n; cut++) {
        /* every byte around a record boundary, a stride elsewhere (each try writes an
         * HDF5 file) */
        int near = 0;
        for (int i = 0; i < k; i++) near |= labs(cut - ends[i]) <= 12;
        if (!near && cut % 97 != 0 && cut != n) continue;
        tried++;
        int whole = 0; /* request records within the cut */
        for (int i = 1; i < k; i++) whole += ends[i] <= cut;
        /* the record the cut falls in (none at a boundary), and what a kill leaves of it:
         * its CRC field, as far as the cut keeps it, still 0 */
        const long start = cut < ends[0] ? 16 : ends[whole];
        const int inside = cut > start && cut < n && !(cut >= ends[0] && cut == ends[whole]);
        memcpy(c, b, (size_t)n);
        for (long i = start + 4; inside && i < start + 8 && i < cut; i++) c[i] = 0;
        for (int killed = 1; killed >= 0; killed--) {
            /* killed = 0: the same cut of the finished journal, its CRC written (a lost
             * end); it reads as a kill's only while the cut keeps none of the CRC */
            const int lost_end = !killed && inside && cut > start + 4;
            if (!killed && !lost_end) continue;
            const unsigned char *data = killed ? c : b;
            char name[64];
            snprintf(name, sizeof name, "cut-%ld-%d.h5", cut, killed);
            const char *out = tmp_path(name);
            ASSERT_OK(spit(with_suffix(out, ".partial.journal"), data, cut));
            fmoe_trace_recover_report rep;
            const int rc = fmoe_trace_recover(with_suffix(out, ".partial"), NULL, &rep);
            if (cut < ends[0]) {
                /* the header record cut short: nothing to recover, one clear error naming
                 * which it was, the journal kept */
                ASSERT_EQ(rc, FMOE_EFORMAT);
                ASSERT_CONTAINS(fmoe_error_detail(),
                                cut < 16   ? "not an fmoe trace journal"
                                : lost_end ? "header record at byte 16 is damaged"
                                           : "no whole header record");
                ASSERT_TRUE(same_bytes(with_suffix(out, ".partial.journal"), data, cut));
                continue;
            }
            if (rc < 0) HARNESS_FAIL("cut at %ld of %ld: %s", cut, n, fmoe_error_detail());
            ASSERT_EQ(rep.requests, whole);
            check_recovered(harness_failed, out, whole);
            if (lost_end) {
                lost_ends++;
                if (rep.damaged != 1 || rep.damaged_at != start || rep.dropped_bytes != 0 ||
                    !rep.kept)
                    HARNESS_FAIL("cut at %ld (a whole record at %ld lost its end): damaged %d "
                                 "at %lld, dropped %lld",
                                 cut, start, rep.damaged, (long long)rep.damaged_at,
                                 (long long)rep.dropped_bytes);
                ASSERT_TRUE(same_bytes(with_suffix(out, ".partial.journal"), data, cut));
            } else {
                ASSERT_EQ(rep.damaged, 0);
                ASSERT_EQ(rep.dropped_bytes, cut - ends[whole]);
                ASSERT_TRUE(!file_exists(with_suffix(out, ".partial.journal")));
            }
            if (*harness_failed) HARNESS_FAIL("cut at %ld (%s)", cut, killed ? "kill" : "lost end");
        }
    }
    ASSERT_TRUE(tried > 60);
    ASSERT_TRUE(lost_ends > 30);
    /* a flipped bit inside the last record: that record is damage (its checksum was
     * written, so no kill tore it), reported with its offset; the others kept */
    b[ends[k - 2] + 16 + 40] ^= 0x10;
    const char *out = tmp_path("flip.h5");
    ASSERT_OK(spit(with_suffix(out, ".partial.journal"), b, n));
    fmoe_trace_recover_report rep;
    ASSERT_OK(fmoe_trace_recover(with_suffix(out, ".partial"), NULL, &rep));
    ASSERT_EQ(rep.requests, SAMPLE_R - 1);
    ASSERT_EQ(rep.dropped_bytes, 0);
    ASSERT_EQ(rep.damaged, 1);
    ASSERT_EQ(rep.damaged_at, ends[k - 2]);
    ASSERT_EQ(rep.damaged_bytes, n - ends[k - 2]);
    ASSERT_TRUE(file_exists(with_suffix(out, ".partial.journal")));
    check_recovered(harness_failed, out, SAMPLE_R - 1);
    free(c);
    free(b);
}

/* A journal cut short at a record boundary (or to its header record) reads clean: no torn
 * tail, no damage. The .partial beside it lists the requests it lost, which no kill can do
 * (each request is journalled first): the trace is the .partial's copy, the report names
 * the journal's end, and both files stay byte for byte. It once recovered the journal's
 * requests alone, exited 0 and deleted the .partial that held the rest. */
TEST(journal_cut_at_a_record_boundary_keeps_the_partial) {
    const char *path = tmp_path("bnd.h5");
    ASSERT_OK(killed_writer(path, SAMPLE_R));
    long n = 0, pn = 0;
    unsigned char *b = slurp(with_suffix(path, ".partial.journal"), &n);
    unsigned char *pb = slurp(with_suffix(path, ".partial"), &pn); /* holds all SAMPLE_R */
    ASSERT_TRUE(b != NULL && pb != NULL);
    long ends[8];
    const int k = record_ends(b, n, ends, 8);
    ASSERT_EQ(k, 1 + SAMPLE_R);
    for (int i = 0; i < k - 1; i++) { /* the journal of i requests */
        char name[64];
        snprintf(name, sizeof name, "bnd-%d.h5", i);
        const char *out = tmp_path(name);
        ASSERT_OK(spit(with_suffix(out, ".partial.journal"), b, ends[i]));
        ASSERT_OK(spit(with_suffix(out, ".partial"), pb, pn));
        fmoe_trace_recover_report rep;
        ASSERT_OK(fmoe_trace_recover(with_suffix(out, ".partial"), NULL, &rep));
        ASSERT_EQ(rep.damaged, 1);
        ASSERT_EQ(rep.kept, 1);
        ASSERT_EQ(rep.damaged_bytes, 0);
        ASSERT_EQ(rep.damaged_at, ends[i]);
        ASSERT_EQ(rep.journal_requests, i);
        ASSERT_EQ(rep.partial_requests, SAMPLE_R);
        ASSERT_EQ(rep.from_journal, 0);
        ASSERT_EQ(rep.requests, SAMPLE_R);
        ASSERT_CONTAINS(rep.damage, "cut short at byte");
        ASSERT_CONTAINS(rep.damage, "the trace is its copy");
        check_recovered(harness_failed, out, SAMPLE_R);
        ASSERT_TRUE(same_bytes(with_suffix(out, ".partial.journal"), b, ends[i]));
        ASSERT_TRUE(same_bytes(with_suffix(out, ".partial"), pb, pn));
        ASSERT_TRUE(!file_exists(with_suffix(out, ".recovering")));
    }
    /* the whole journal beside the same .partial: nothing lacks, both go */
    const char *out = tmp_path("bnd-all.h5");
    ASSERT_OK(spit(with_suffix(out, ".partial.journal"), b, n));
    ASSERT_OK(spit(with_suffix(out, ".partial"), pb, pn));
    fmoe_trace_recover_report rep;
    ASSERT_OK(fmoe_trace_recover(with_suffix(out, ".partial"), NULL, &rep));
    ASSERT_EQ(rep.damaged, 0);
    ASSERT_EQ(rep.from_journal, 1);
    ASSERT_EQ(rep.requests, SAMPLE_R);
    ASSERT_TRUE(!file_exists(with_suffix(out, ".partial")) &&
                !file_exists(with_suffix(out, ".partial.journal")));
    free(b);
    free(pb);
}

/* The last record's length field, each of its 64 bits flipped in turn: its CRC field shows
 * the record was whole, so this is damage at its offset, never a torn tail. It once read as
 * "dropped the bytes of a request the kill cut short", exit 0, the request gone and both
 * files removed. With the .partial beside it the trace is the .partial's, and both files
 * stay byte for byte. A record the kill did cut (CRC 0) whose length no longer fits what is
 * left of the file or its own fields is damage too. */
TEST(last_record_length_flip_is_damage_not_a_torn_tail) {
    const char *path = tmp_path("len.h5");
    ASSERT_OK(killed_writer(path, SAMPLE_R));
    long n = 0, pn = 0;
    unsigned char *b = slurp(with_suffix(path, ".partial.journal"), &n);
    unsigned char *pb = slurp(with_suffix(path, ".partial"), &pn);
    ASSERT_TRUE(b != NULL && pb != NULL);
    long ends[8];
    const int k = record_ends(b, n, ends, 8);
    ASSERT_EQ(k, 1 + SAMPLE_R);
    const long last = ends[k - 2];
    for (int bit = 0; bit < 64; bit++) {
        b[last + 8 + bit / 8] ^= (unsigned char)(1u << (bit % 8));
        for (int with_partial = 0; with_partial < 2; with_partial++) {
            char name[64];
            snprintf(name, sizeof name, "len-%d-%d.h5", bit, with_partial);
            const char *out = tmp_path(name);
            ASSERT_OK(spit(with_suffix(out, ".partial.journal"), b, n));
            if (with_partial) ASSERT_OK(spit(with_suffix(out, ".partial"), pb, pn));
            fmoe_trace_recover_report rep;
            ASSERT_OK(fmoe_trace_recover(with_suffix(out, ".partial"), NULL, &rep));
            if (rep.damaged != 1 || rep.damaged_at != last || rep.dropped_bytes != 0 ||
                !rep.kept || rep.journal_requests != SAMPLE_R - 1)
                HARNESS_FAIL("length bit %d: damaged %d at %lld, dropped %lld, %lld from the "
                             "journal",
                             bit, rep.damaged, (long long)rep.damaged_at,
                             (long long)rep.dropped_bytes, (long long)rep.journal_requests);
            ASSERT_EQ(rep.requests, with_partial ? SAMPLE_R : SAMPLE_R - 1);
            ASSERT_TRUE(same_bytes(with_suffix(out, ".partial.journal"), b, n));
            if (with_partial) {
                ASSERT_EQ(rep.from_journal, 0);
                ASSERT_TRUE(same_bytes(with_suffix(out, ".partial"), pb, pn));
                check_recovered(harness_failed, out, SAMPLE_R);
            } else {
                check_all_but(harness_failed, out, SAMPLE_R - 1);
            }
        }
        b[last + 8 + bit / 8] ^= (unsigned char)(1u << (bit % 8));
    }
    /* a kill's torn last record (CRC 0, cut inside its payload) is the torn tail ... */
    const long cut = last + 16 + 40;
    memset(b + last + 4, 0, 4);
    const char *out = tmp_path("len-torn.h5");
    ASSERT_OK(spit(with_suffix(out, ".partial.journal"), b, cut));
    fmoe_trace_recover_report rep;
    ASSERT_OK(fmoe_trace_recover(with_suffix(out, ".partial"), NULL, &rep));
    ASSERT_EQ(rep.damaged, 0);
    ASSERT_EQ(rep.dropped_bytes, cut - last);
    /* ... but not with a length shorter than what is left, or not the one its fields give */
    uint64_t len, bad[2];
    memcpy(&len, b + last + 8, 8);
    bad[0] = (uint64_t)(cut - last - 16 - 1);
    bad[1] = len + 8;
    for (int i = 0; i < 2; i++) {
        memcpy(b + last + 8, &bad[i], 8);
        char name[64];
        snprintf(name, sizeof name, "len-torn-%d.h5", i);
        out = tmp_path(name);
        ASSERT_OK(spit(with_suffix(out, ".partial.journal"), b, cut));
        ASSERT_OK(fmoe_trace_recover(with_suffix(out, ".partial"), NULL, &rep));
        ASSERT_EQ(rep.damaged, 1);
        ASSERT_EQ(rep.damaged_at, last);
        ASSERT_EQ(rep.dropped_bytes, 0);
        ASSERT_TRUE(same_bytes(with_suffix(out, ".partial.journal"), b, cut));
    }
    free(b);
    free(pb);
}

TEST(damage_before_the_tail_costs_only_its_record) {
    const char *path = tmp_path("dmg.h5");
    ASSERT_OK(killed_writer(path, SAMPLE_R));
    long n = 0, pn = 0;
    unsigned char *b = slurp(with_suffix(path, ".partial.journal"), &n);
    unsigned char *pb = slurp(with_suffix(path, ".partial"), &pn); /* holds all SAMPLE_R */
    ASSERT_TRUE(b != NULL && pb != NULL);
    long ends[8];
    const int k = record_ends(b, n, ends, 8);
    ASSERT_EQ(k, 1 + SAMPLE_R);
    /* A bit flipped at (a stride of) every byte of every request record, the journal alone:
     * exactly the record it hit is lost and reported by its offset, every other one is
     * recovered, and the journal stays as it was. */
    int tried = 0;
    for (long at = ends[0]; at < n; at++) {
        int hit = 0;
        while (ends[hit + 1] <= at) hit++; /* request index whose record holds `at` */
        if (at - ends[hit] >= 16 && at % 37 != 0) continue; /* each head byte, a stride after */
        b[at] ^= (unsigned char)(1u << (at % 8));
        char name[64];
        snprintf(name, sizeof name, "flip-%ld.h5", at);
        const char *out = tmp_path(name);
        ASSERT_OK(spit(with_suffix(out, ".partial.journal"), b, n));
        fmoe_trace_recover_report rep;
        const int rc = fmoe_trace_recover(with_suffix(out, ".partial"), NULL, &rep);
        if (rc < 0) HARNESS_FAIL("flip at %ld: %s", at, fmoe_error_detail());
        /* the last record's head too: its CRC was written, so even a length made to run
         * past the end is damage, not the torn tail a kill leaves */
        if (rep.damaged != 1 || rep.damaged_at != ends[hit] || rep.dropped_bytes != 0 ||
            rep.requests != SAMPLE_R - 1)
            HARNESS_FAIL("flip at %ld (record at %ld): damaged %d at %lld, dropped %lld, %lld "
                         "requests",
                         at, ends[hit], rep.damaged, (long long)rep.damaged_at,
                         (long long)rep.dropped_bytes, (long long)rep.requests);
        ASSERT_TRUE(same_bytes(with_suffix(out, ".partial.journal"), b, n));
        check_all_but(harness_failed, out, hit);
        b[at] ^= (unsigned char)(1u << (at % 8));
        tried++;
    }
    ASSERT_TRUE(tried > 50);

    /* The same damage with the killed run's .partial beside it: the .partial holds every
     * request the journal gave and the one it lost, so the trace is the .partial's copy;
     * both leftovers are kept, byte for byte. */
    const long mid = ends[1] + 16 + 8; /* inside request 1's payload */
    b[mid] ^= 0x04;
    const char *out = tmp_path("both.h5");
    ASSERT_OK(spit(with_suffix(out, ".partial.journal"), b, n));
    ASSERT_OK(spit(with_suffix(out, ".partial"), pb, pn));
    fmoe_trace_recover_report rep;
    ASSERT_OK(fmoe_trace_recover(with_suffix(out, ".partial"), NULL, &rep));
    ASSERT_EQ(rep.damaged, 1);
    ASSERT_EQ(rep.kept, 1);
    ASSERT_EQ(rep.damaged_at, ends[1]);
    ASSERT_EQ(rep.journal_requests, SAMPLE_R - 1);
    ASSERT_EQ(rep.partial_requests, SAMPLE_R);
    ASSERT_EQ(rep.from_journal, 0);
    ASSERT_EQ(rep.requests, SAMPLE_R);
    ASSERT_CONTAINS(rep.damage, "damaged at byte");
    check_recovered(harness_failed, out, SAMPLE_R);
    ASSERT_TRUE(same_bytes(with_suffix(out, ".partial.journal"), b, n));
    ASSERT_TRUE(same_bytes(with_suffix(out, ".partial"), pb, pn));
    ASSERT_TRUE(!file_exists(with_suffix(out, ".recovering")) &&
                !file_exists(with_suffix(out, ".recovering.partial")));
    /* a second recovery does not replace the first one's output */
    ASSERT_EQ(fmoe_trace_recover(with_suffix(out, ".partial"), NULL, &rep), FMOE_EIO);
    ASSERT_CONTAINS(fmoe_error_detail(), "exists");
    b[mid] ^= 0x04;

    /* A damaged header record decodes nothing: the .partial is the source, damage reported,
     * both kept; without a .partial that reads, one error naming the header record. */
    b[16 + 16 + 3] ^= 0x01;
    out = tmp_path("hdr.h5");
    ASSERT_OK(spit(with_suffix(out, ".partial.journal"), b, n));
    ASSERT_OK(spit(with_suffix(out, ".partial"), pb, pn));
    ASSERT_OK(fmoe_trace_recover(with_suffix(out, ".partial"), NULL, &rep));
    ASSERT_EQ(rep.damaged, 1);
    ASSERT_EQ(rep.journal_requests, -1);
    ASSERT_EQ(rep.requests, SAMPLE_R);
    ASSERT_CONTAINS(rep.damage, "header record at byte 16 is damaged");
    check_recovered(harness_failed, out, SAMPLE_R);
    ASSERT_TRUE(same_bytes(with_suffix(out, ".partial"), pb, pn));
    out = tmp_path("hdr2.h5");
    ASSERT_OK(spit(with_suffix(out, ".partial.journal"), b, n));
    ASSERT_EQ(fmoe_trace_recover(with_suffix(out, ".partial"), NULL, &rep), FMOE_EFORMAT);
    ASSERT_CONTAINS(fmoe_error_detail(), "header record at byte 16 is damaged");
    ASSERT_TRUE(!file_exists(out) && same_bytes(with_suffix(out, ".partial.journal"), b, n));
    b[16 + 16 + 3] ^= 0x01;

    /* A kill inside the last append (its CRC still 0, the file cut inside it), with the
     * .partial of the requests before it: the torn tail, no damage, the leftovers go (the
     * trace holds everything they did). */
    out = tmp_path("torn.h5");
    memset(b + ends[k - 2] + 4, 0, 4);
    ASSERT_OK(spit(with_suffix(out, ".partial.journal"), b, n - 3));
    ASSERT_OK(killed_writer(tmp_path("torn-src.h5"), SAMPLE_R - 1));
    long pn2 = 0;
    unsigned char *pb2 = slurp(with_suffix(tmp_path("torn-src.h5"), ".partial"), &pn2);
    ASSERT_TRUE(pb2 != NULL);
    ASSERT_OK(spit(with_suffix(out, ".partial"), pb2, pn2));
    free(pb2);
    ASSERT_OK(fmoe_trace_recover(with_suffix(out, ".partial"), NULL, &rep));
    ASSERT_EQ(rep.damaged, 0);
    ASSERT_EQ(rep.dropped_bytes, n - 3 - ends[k - 2]);
    ASSERT_EQ(rep.requests, SAMPLE_R - 1);
    ASSERT_TRUE(!file_exists(with_suffix(out, ".partial")) &&
                !file_exists(with_suffix(out, ".partial.journal")));
    free(b);
    free(pb);
}

TEST(not_a_journal) {
    const char *out = tmp_path("nj.h5");
    ASSERT_OK(spit(with_suffix(out, ".partial.journal"), (const unsigned char *)"hello world, "
                                                                              "not a journal",
                   25));
    fmoe_trace_recover_report rep;
    ASSERT_EQ(fmoe_trace_recover(with_suffix(out, ".partial"), NULL, &rep), FMOE_EFORMAT);
    ASSERT_CONTAINS(fmoe_error_detail(), "not an fmoe trace journal");
    ASSERT_EQ(fmoe_trace_recover(out, NULL, &rep), FMOE_EINVAL); /* not a .partial */
}

TEST(writer_lifecycle_and_the_journal) {
    fmoe_trace_header h = sample_header(0);
    /* close: the journal goes with the .partial */
    const char *path = tmp_path("life.h5");
    fmoe_trace_writer *w = NULL;
    ASSERT_OK(fmoe_trace_writer_open(&w, path, &h, NULL));
    ASSERT_TRUE(file_exists(with_suffix(path, ".partial.journal")));
    ASSERT_OK(sample_append(w, 2));
    ASSERT_OK(fmoe_trace_writer_close(w));
    ASSERT_TRUE(file_exists(path) && !file_exists(with_suffix(path, ".partial")) &&
                !file_exists(with_suffix(path, ".partial.journal")));
    /* abort: nothing left */
    path = tmp_path("life2.h5");
    ASSERT_OK(fmoe_trace_writer_open(&w, path, &h, NULL));
    ASSERT_OK(sample_append(w, 1));
    fmoe_trace_writer_abort(w);
    ASSERT_TRUE(!file_exists(path) && !file_exists(with_suffix(path, ".partial")) &&
                !file_exists(with_suffix(path, ".partial.journal")));
    /* close_partial: a whole .partial and the journal; recover then renames... from the
     * journal, which holds the same requests */
    path = tmp_path("life3.h5");
    ASSERT_OK(fmoe_trace_writer_open(&w, path, &h, NULL));
    ASSERT_OK(sample_append(w, 2));
    ASSERT_OK(fmoe_trace_writer_close_partial(w));
    ASSERT_TRUE(!file_exists(path) && file_exists(with_suffix(path, ".partial")) &&
                file_exists(with_suffix(path, ".partial.journal")));
    fmoe_trace_reader *r = NULL;
    ASSERT_OK(fmoe_trace_reader_open(&r, with_suffix(path, ".partial")));
    ASSERT_EQ(fmoe_trace_reader_num_requests(r), 2);
    fmoe_trace_reader_close(r);
    fmoe_trace_recover_report rep;
    ASSERT_OK(fmoe_trace_recover(with_suffix(path, ".partial"), NULL, &rep));
    ASSERT_EQ(rep.requests, 2);
    /* without a journal: a whole .partial is renamed, a damaged one refused and kept */
    path = tmp_path("life4.h5");
    fmoe_trace_write_options o = {.flush_requests = INT32_MAX}; /* an importer's: no journal */
    ASSERT_OK(fmoe_trace_writer_open(&w, path, &h, &o));
    ASSERT_TRUE(!file_exists(with_suffix(path, ".partial.journal")));
    ASSERT_OK(sample_append(w, 3));
    ASSERT_OK(fmoe_trace_writer_close_partial(w));
    ASSERT_OK(fmoe_trace_recover(with_suffix(path, ".partial"), NULL, &rep));
    ASSERT_EQ(rep.from_journal, 0);
    ASSERT_EQ(rep.requests, 3);
    ASSERT_TRUE(file_exists(path) && !file_exists(with_suffix(path, ".partial")));
    path = tmp_path("life5.h5");
    ASSERT_OK(spit(with_suffix(path, ".partial"), (const unsigned char *)"\x89HDF\r\n\x1a\n", 8));
    ASSERT_TRUE(fmoe_trace_recover(with_suffix(path, ".partial"), NULL, &rep) < 0);
    ASSERT_CONTAINS(fmoe_error_detail(), "no journal");
    ASSERT_TRUE(file_exists(with_suffix(path, ".partial")) && !file_exists(path));
}

int main(int argc, char **argv) {
    int rc = RUN_TESTS(argc, argv);
    if (scratch_dir[0]) nftw(scratch_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return rc;
}
