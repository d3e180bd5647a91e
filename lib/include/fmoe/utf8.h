/*
 * fmoe/utf8.h - the one reading of a UTF-8 lead byte, for every place that checks text is
 * well-formed UTF-8 (the server's request text, structured output's string bodies and its
 * token trie).
 */
#ifndef FMOE_UTF8_H
#define FMOE_UTF8_H

/* The length (2..4) of the UTF-8 sequence lead byte c starts, and the range [*lo, *hi]
 * its second byte must lie in: the Unicode standard's table 3-7 (§3.9), whose second-byte
 * ranges exclude overlong forms (E0, F0), surrogates (ED) and code points past U+10FFFF
 * (F4); the later bytes are 80..BF. 1 for ASCII (lo, hi untouched); 0 for a byte that
 * cannot start a sequence (a continuation byte, C0, C1, F5..FF). */
static inline int fmoe_utf8_lead(unsigned c, unsigned *lo, unsigned *hi) {
    if (c < 0x80) return 1;
    *lo = 0x80;
    *hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) {
        if (c == 0xE0) *lo = 0xA0;
        if (c == 0xED) *hi = 0x9F;
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (c == 0xF0) *lo = 0x90;
        if (c == 0xF4) *hi = 0x8F;
        return 4;
    }
    return 0;
}

#endif
