/*
 * wk_log: levelled logging for the daemons. Lines look like
 *   2026-11-29T14:30:01.123Z info  pool: worker registered worker=w0 backend=cpu
 * The level is checked before anything is formatted. Each .c file that logs
 * defines WK_LOG_MODULE before including this header. Library-like code
 * (common/, backends, store) returns errors instead of logging.
 * Thread-safe: one write(2) per line.
 */
#ifndef WK_LOG_H
#define WK_LOG_H

#include <stdbool.h>

#include "wk_err.h"

typedef enum wk_log_level {
    WK_LOG_ERROR = 0, /* something failed and needs an operator */
    WK_LOG_WARN,      /* degraded but continuing */
    WK_LOG_INFO,      /* lifecycle events */
    WK_LOG_DEBUG,     /* per-request detail */
} wk_log_level;

#ifndef WK_LOG_MODULE
#define WK_LOG_MODULE "wkvm"
#endif

/* Current threshold; lines above it are dropped before formatting. */
extern wk_log_level wk_log_threshold;

/* Sets the threshold from a name ("error","warn","info","debug"). WK_EINVAL if unknown. */
WK_MUST_CHECK wk_err wk_log_set_level_name(const char *name);

/* Sets the file descriptor lines go to (default 2). */
void wk_log_set_fd(int fd);

/* Writes one line. Use the wk_log() macro instead. */
void wk_log_write(wk_log_level level, const char *module, const char *fmt, ...) WK_PRINTF(3, 4);

/* Name of a level ("info"). */
const char *wk_log_level_name(wk_log_level level);

#define wk_log(level, ...)                                                                         \
    do {                                                                                           \
        if ((level) <= wk_log_threshold)                                                           \
            wk_log_write((level), WK_LOG_MODULE, __VA_ARGS__);                                     \
    } while (0)

#define wk_log_error(...) wk_log(WK_LOG_ERROR, __VA_ARGS__)
#define wk_log_warn(...) wk_log(WK_LOG_WARN, __VA_ARGS__)
#define wk_log_info(...) wk_log(WK_LOG_INFO, __VA_ARGS__)
#define wk_log_debug(...) wk_log(WK_LOG_DEBUG, __VA_ARGS__)

#endif /* WK_LOG_H */
