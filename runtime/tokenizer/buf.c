/*
 * buf.c - tok_buf, the growable byte buffer every stage of the tokenizer appends to.
 *
 * The buffer doubles from 256 bytes and always keeps a NUL after its bytes, so that its
 * text can be passed as a C string; an empty buffer may have p == NULL until the first
 * append or reserve.
 */
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "tokenizer_impl.h"

int fmoe__tok_buf_reserve(tok_buf *b, size_t extra) {
    if (b->len + extra + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return fmoe_error_set(FMOE_ENOMEM, "tokenizer: out of memory (%zu bytes)", cap);
    b->p = p;
    b->cap = cap;
    return 0;
}

int fmoe__tok_buf_append(tok_buf *b, const void *data, size_t n) {
    FMOE_FORWARD_IF_ERROR(fmoe__tok_buf_reserve(b, n));
    if (n) memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

void fmoe__tok_buf_free(tok_buf *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}
