/*
 * wk_json: small helpers over jansson for request parsing with typed,
 * bounded field access, and for the OpenAI-style error body. Never logs.
 * json_t values passed in are borrowed; strings handed out are borrowed from
 * the json_t unless the doc says "caller frees".
 */
#ifndef WK_JSON_H
#define WK_JSON_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wk_err.h"

/*
 * Parses len bytes as one JSON value (max depth 64 enforced by jansson's own
 * limit; duplicate keys refused). *out is owned by the caller (json_decref).
 * WK_EINVAL with "line L column C: ..." in the diag on malformed input.
 */
WK_MUST_CHECK wk_err wk_json_parse(const char *buf, size_t len, json_t **out, wk_diag *d);

/*
 * Like wk_json_parse(), but string values may hold NUL ("\u0000"): for
 * bodies whose texts are data (chat content). Read such strings with
 * json_string_length(); wk_json_get_str() still refuses a NUL in a field.
 */
WK_MUST_CHECK wk_err wk_json_parse_text(const char *buf, size_t len, json_t **out, wk_diag *d);

/*
 * Reads obj[key] as a string. When absent: WK_ENOENT if required, else *out =
 * def and WK_OK. Wrong type or longer than max_len bytes: WK_EINVAL naming key.
 */
WK_MUST_CHECK wk_err wk_json_get_str(const json_t *obj, const char *key, bool required,
                                     const char *def, size_t max_len, const char **out,
                                     wk_diag *d);

/* Reads obj[key] as an integer in [min, max]; absent -> def (or WK_ENOENT if required). */
WK_MUST_CHECK wk_err wk_json_get_i64(const json_t *obj, const char *key, bool required,
                                     int64_t def, int64_t min, int64_t max, int64_t *out,
                                     wk_diag *d);

/* Reads obj[key] as a number (integer or real) in [min, max]. */
WK_MUST_CHECK wk_err wk_json_get_num(const json_t *obj, const char *key, bool required,
                                     double def, double min, double max, double *out,
                                     wk_diag *d);

/* Reads obj[key] as a boolean; absent -> def. */
WK_MUST_CHECK wk_err wk_json_get_bool(const json_t *obj, const char *key, bool def, bool *out,
                                      wk_diag *d);

/* Compact serialisation (no spaces), caller frees with free(). NULL on ENOMEM. */
char *wk_json_dump_compact(const json_t *v);

/*
 * Canonical serialisation: compact, keys sorted, non-ASCII kept as UTF-8 —
 * the form Python writes with json.dumps(v, sort_keys=True,
 * separators=(",", ":"), ensure_ascii=False). Caller frees. NULL on ENOMEM.
 */
char *wk_json_dump_canonical(const json_t *v);

/*
 * A copy of s (caller frees) with every byte that does not belong to a
 * well-formed UTF-8 sequence replaced by '?': messages quote client input
 * and may be cut inside a character, and jansson refuses invalid UTF-8.
 * NULL on ENOMEM.
 */
char *wk_json_utf8_scrub(const char *s);

#endif /* WK_JSON_H */
