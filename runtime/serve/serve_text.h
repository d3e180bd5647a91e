/*
 * serve_text.h - what of a request's generated text a client may see: stop strings cut the
 * text where the first one starts (OpenAI's `stop`: the stop string is not returned), and
 * while generation goes on, a tail that could still become a stop string, or that is an
 * incomplete UTF-8 sequence, is held back.
 */
#ifndef FMOE_SERVE_TEXT_H
#define FMOE_SERVE_TEXT_H

#include <stddef.h>
#include <stdint.h>

/* Where the earliest occurrence of any of stop[0..num_stop) starts in text[0..n), or n.
 * Empty stop strings never match. */
size_t fmoe_serve_text_stop_at(const char *const *stop, int32_t num_stop, const char *text,
                               size_t n);

/* The bytes of text[0..n) (no stop string in it) a reader may see while generation goes
 * on: without trailing U+FFFD of an incomplete UTF-8 sequence, and without the longest tail
 * that is a proper prefix of a stop string. */
size_t fmoe_serve_text_visible(const char *const *stop, int32_t num_stop, const char *text,
                               size_t n);

#endif
