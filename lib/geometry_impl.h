/*
 * geometry_impl.h - what the config.json reader (geometry.c) and the model fingerprint
 * (fingerprint.c) share: parsing the JSON text.
 */
#ifndef FMOE_GEOMETRY_IMPL_H
#define FMOE_GEOMETRY_IMPL_H

#include <cjson/cJSON.h>
#include <stddef.h>

/*
 * Parses `len` bytes of JSON (not necessarily NUL-terminated) into a cJSON tree; only
 * whitespace may follow the value, as for Python's json.loads. On success the caller owns
 * *out (cJSON_Delete). @return 0, FMOE_EINVAL (NULL text with len > 0) or FMOE_EFORMAT
 * (malformed JSON: the detail gives the byte offset, line and column of the error).
 */
int fmoe__config_json_parse(const char *json, size_t len, cJSON **out);

#endif
