/* sha256.h - internal: SHA-256 (FIPS 180-4), for model fingerprints and checksums. */
#ifndef FMOE_SHA256_H
#define FMOE_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct fmoe_sha256 {
    uint32_t state[8];
    uint64_t bytes;     /* message length so far */
    uint8_t block[64];  /* pending partial block */
    size_t used;        /* bytes in `block` */
} fmoe_sha256;

void fmoe_sha256_init(fmoe_sha256 *s);
void fmoe_sha256_update(fmoe_sha256 *s, const void *data, size_t len);
void fmoe_sha256_final(fmoe_sha256 *s, uint8_t digest[32]);

/* One-shot: writes 64 lowercase hex characters and a NUL into hex[65]. */
void fmoe_sha256_hex(const void *data, size_t len, char hex[65]);

#endif
