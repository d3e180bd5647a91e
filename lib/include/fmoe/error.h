/*
 * fmoe/error.h - status codes and the "what and where" detail string.
 *
 * Every library function returns 0 on success or a negative FMOE_E* code. The code says
 * what kind of failure it was; fmoe_error_detail() says what and where, in one line, e.g.
 * "trace.h5: /tokens/probs has shape [10,32,7], expected [10,32,8]". The detail string is
 * thread-local, so threads that fail independently do not overwrite each other.
 * Only cmd/ prints it.
 */
#ifndef FMOE_ERROR_H
#define FMOE_ERROR_H

#include <stdarg.h>

/* X(name, value, message): the one table of codes. New codes go at the end. */
#define FMOE_ERROR_TABLE(X)                                  \
    X(FMOE_OK, 0, "success")                                 \
    X(FMOE_EINVAL, -1, "invalid argument")                   \
    X(FMOE_ENOMEM, -2, "out of memory")                      \
    X(FMOE_EIO, -3, "input/output error")                    \
    X(FMOE_EFORMAT, -4, "malformed input")                   \
    X(FMOE_EUNSUPPORTED, -5, "unsupported")                  \
    X(FMOE_ERANGE, -6, "value out of range")                 \
    X(FMOE_ENOTFOUND, -7, "not found")                       \
    X(FMOE_EINCOMPLETE, -8, "incomplete data")               \
    X(FMOE_EMISMATCH, -9, "mismatch")                        \
    X(FMOE_EINTERNAL, -10, "internal error")

enum fmoe_error_code {
#define FMOE__ERROR_ENUM(name, value, msg) name = value,
    FMOE_ERROR_TABLE(FMOE__ERROR_ENUM)
#undef FMOE__ERROR_ENUM
};

/* @return a static message for a code ("unknown error" for codes not in the table). */
const char *fmoe_strerror(int code);

/*
 * Records a detail string for the calling thread and returns `code`, so that
 *     return fmoe_error_set(FMOE_EFORMAT, "%s: line %lld: ...", path, line);
 * is the one-line way to fail. printf-style.
 */
int fmoe_error_set(int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
int fmoe_error_setv(int code, const char *fmt, va_list ap);

/* Prepends "prefix: " to the current detail (adds context while an error travels up). */
void fmoe_error_prefix(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* @return the calling thread's last detail string; never NULL (may be ""). */
const char *fmoe_error_detail(void);

/* Clears the calling thread's detail string. */
void fmoe_error_clear(void);

/* Fail with `code` and a formatted detail when `cond` holds. */
#define FMOE_RETURN_ERROR_IF(cond, code, ...)                                            \
    do {                                                                                 \
        if (cond) return fmoe_error_set((code), __VA_ARGS__);                            \
    } while (0)

/* Evaluate an fmoe call and return its status from the enclosing function if negative. */
#define FMOE_FORWARD_IF_ERROR(expr)                                                      \
    do {                                                                                 \
        int fmoe__rc = (expr);                                                           \
        if (fmoe__rc < 0) return fmoe__rc;                                               \
    } while (0)

/* Always-on assertion for invariants whose failure means a bug in fmoe itself. */
#define FMOE_ASSERT(cond)                                                                \
    do {                                                                                 \
        if (!(cond)) fmoe__assert_fail(#cond, __FILE__, __LINE__);                       \
    } while (0)
void fmoe__assert_fail(const char *expr, const char *file, int line)
#if defined(__GNUC__)
    __attribute__((noreturn))
#endif
    ;

#endif
