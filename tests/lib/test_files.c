/*
 * test_files.c - fmoe__read_file_bounded (lib/files.c), the one read of a whole text or JSON
 * input: the limit is exact (max_bytes reads, one byte more is "too large", for a regular
 * file and for a pipe), a FIFO and a device are refused without blocking unless pipes are
 * allowed, and then /dev/zero ends at the limit, standard input and a FIFO with a writer are
 * read whole. A regression that blocks fails by meson's timeout instead of passing.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fmoe/error.h"
#include "files.h"
#include "harness.h"

static char dir[256];

static void path_in(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", dir, name);
}

static void write_bytes(const char *path, size_t n) {
    FILE *f = fopen(path, "wb");
    for (size_t i = 0; f && i < n; i++) fputc('a' + (int)(i % 26), f);
    if (f) fclose(f);
}

TEST(a_regular_file_of_exactly_the_limit_is_read) {
    char p[300];
    path_in(p, sizeof p, "ten");
    write_bytes(p, 10);
    char *data;
    size_t len;
    ASSERT_OK(fmoe__read_file_bounded(p, "a test file", 10, 0, &data, &len));
    ASSERT_EQ(len, 10);
    ASSERT_EQ(data[10], 0);
    ASSERT_STR_EQ(data, "abcdefghij");
    free(data);
}

TEST(one_byte_over_the_limit_is_too_large) {
    char p[300];
    path_in(p, sizeof p, "eleven");
    write_bytes(p, 11);
    char *data = (char *)1;
    size_t len = 7;
    ASSERT_EQ(fmoe__read_file_bounded(p, "a test file", 10, 0, &data, &len), FMOE_ERANGE);
    ASSERT_TRUE(data == NULL);
    ASSERT_EQ(len, 0);
    ASSERT_CONTAINS(fmoe_error_detail(), p);
    ASSERT_CONTAINS(fmoe_error_detail(), "more than 10 bytes: too large for a test file");
}

TEST(an_empty_file_is_an_empty_string) {
    char p[300];
    path_in(p, sizeof p, "empty");
    write_bytes(p, 0);
    char *data;
    size_t len;
    ASSERT_OK(fmoe__read_file_bounded(p, "a test file", 10, 0, &data, &len));
    ASSERT_EQ(len, 0);
    ASSERT_STR_EQ(data, "");
    free(data);
}

TEST(a_fifo_is_refused_without_blocking) {
    char p[300];
    path_in(p, sizeof p, "fifo");
    ASSERT_EQ(mkfifo(p, 0600), 0);
    char *data;
    size_t len;
    ASSERT_EQ(fmoe__read_file_bounded(p, "a test file", 10, 0, &data, &len), FMOE_EIO);
    ASSERT_CONTAINS(fmoe_error_detail(), "not a regular file");
    unlink(p);
}

TEST(dev_zero_is_refused_and_with_pipes_ends_at_the_limit) {
    char *data;
    size_t len;
    ASSERT_EQ(fmoe__read_file_bounded("/dev/zero", "a test file", 1000, 0, &data, &len),
              FMOE_EIO);
    ASSERT_CONTAINS(fmoe_error_detail(), "/dev/zero: not a regular file");
    ASSERT_EQ(fmoe__read_file_bounded("/dev/zero", "a test file", 100000, FMOE_READ_PIPES,
                                      &data, &len),
              FMOE_ERANGE);
    ASSERT_CONTAINS(fmoe_error_detail(), "/dev/zero: more than 100000 bytes");
}

TEST(a_directory_and_a_missing_file_say_so) {
    char *data;
    size_t len;
    ASSERT_EQ(fmoe__read_file_bounded(dir, "a test file", 10, 0, &data, &len), FMOE_EIO);
    ASSERT_CONTAINS(fmoe_error_detail(), "is a directory");
    char p[300];
    path_in(p, sizeof p, "absent");
    ASSERT_EQ(fmoe__read_file_bounded(p, "a test file", 10, 0, &data, &len), FMOE_EIO);
    ASSERT_CONTAINS(fmoe_error_detail(), "cannot open");
}

/* Standard input from a pipe holding `text` (the write end closed), for one read of "-". */
static int read_stdin(const char *text, long long max, char **data, size_t *len) {
    int fds[2];
    if (pipe(fds) != 0) return -100;
    if (write(fds[1], text, strlen(text)) != (ssize_t)strlen(text)) return -100;
    close(fds[1]);
    const int saved = dup(STDIN_FILENO);
    dup2(fds[0], STDIN_FILENO);
    close(fds[0]);
    const int rc = fmoe__read_file_bounded("-", "a test file", max, FMOE_READ_PIPES, data, len);
    dup2(saved, STDIN_FILENO);
    close(saved);
    return rc;
}

TEST(standard_input_is_read_whole_and_bounded) {
    char *data;
    size_t len;
    ASSERT_OK(read_stdin("hello", 5, &data, &len));
    ASSERT_EQ(len, 5);
    ASSERT_STR_EQ(data, "hello");
    free(data);
    ASSERT_EQ(read_stdin("hello!", 5, &data, &len), FMOE_ERANGE);
    ASSERT_CONTAINS(fmoe_error_detail(), "standard input: more than 5 bytes");
}

TEST(a_fifo_with_pipes_allowed_waits_for_its_writer) {
    char p[300];
    path_in(p, sizeof p, "fifo2");
    ASSERT_EQ(mkfifo(p, 0600), 0);
    const pid_t child = fork();
    ASSERT_TRUE(child >= 0);
    if (child == 0) { /* the writer: opens after a moment, so the reader must wait */
        usleep(100 * 1000);
        const int fd = open(p, O_WRONLY);
        const int ok = fd >= 0 && write(fd, "abc", 3) == 3;
        _exit(ok ? 0 : 1);
    }
    char *data;
    size_t len;
    const int rc = fmoe__read_file_bounded(p, "a test file", 10, FMOE_READ_PIPES, &data, &len);
    int status = 0;
    waitpid(child, &status, 0);
    ASSERT_OK(rc);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    ASSERT_STR_EQ(data, "abc");
    free(data);
    unlink(p);
}

int main(int argc, char **argv) {
    snprintf(dir, sizeof dir, "%s/fmoe-test-files-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    const int rc = RUN_TESTS(argc, argv);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return rc;
}
