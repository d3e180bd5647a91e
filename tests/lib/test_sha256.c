/* test_sha256.c - SHA-256 against the NIST FIPS 180-4 example vectors. */
#include "sha256.h"
#include "harness.h"

static void hex_of(const uint8_t d[32], char out[65]) {
    for (int i = 0; i < 32; i++) sprintf(out + 2 * i, "%02x", d[i]);
}

TEST(sha256_empty) {
    char hex[65];
    fmoe_sha256_hex("", 0, hex);
    ASSERT_STR_EQ(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(sha256_abc) {
    char hex[65];
    fmoe_sha256_hex("abc", 3, hex);
    ASSERT_STR_EQ(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(sha256_448_bits) {
    const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    char hex[65];
    fmoe_sha256_hex(m, strlen(m), hex);
    ASSERT_STR_EQ(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(sha256_896_bits) {
    const char *m = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmno"
                    "ijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu";
    char hex[65];
    fmoe_sha256_hex(m, strlen(m), hex);
    ASSERT_STR_EQ(hex, "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
}

/* One million 'a', fed in uneven pieces so partial blocks cross every boundary. */
TEST(sha256_million_a) {
    static char a[1000];
    memset(a, 'a', sizeof a);
    fmoe_sha256 s;
    fmoe_sha256_init(&s);
    size_t left = 1000000, step = 1;
    while (left) {
        size_t n = step < left ? step : left;
        fmoe_sha256_update(&s, a, n);
        left -= n;
        step = step % 997 + 1;
    }
    uint8_t d[32];
    char hex[65];
    fmoe_sha256_final(&s, d);
    hex_of(d, hex);
    ASSERT_STR_EQ(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

/* The one-shot and the streaming interface agree at every length around block edges. */
TEST(sha256_streaming_matches_oneshot) {
    uint8_t msg[200];
    for (int i = 0; i < 200; i++) msg[i] = (uint8_t)(i * 37 + 11);
    for (size_t len = 0; len <= 200; len++) {
        char one[65], two[65];
        fmoe_sha256_hex(msg, len, one);
        fmoe_sha256 s;
        fmoe_sha256_init(&s);
        for (size_t i = 0; i < len; i++) fmoe_sha256_update(&s, msg + i, 1);
        uint8_t d[32];
        fmoe_sha256_final(&s, d);
        hex_of(d, two);
        if (strcmp(one, two) != 0) HARNESS_FAIL("length %zu: %s != %s", len, one, two);
    }
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
