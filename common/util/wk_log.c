/*
 * wk_log: level-checked, one-write-per-line logging with a UTC timestamp and
 * the module name. Never allocates.
 */
#include "wk_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

wk_log_level wk_log_threshold = WK_LOG_INFO;
static int wk_log_fd = 2;

static const char *const wk_log_names[] = {"error", "warn", "info", "debug"};

const char *
wk_log_level_name(wk_log_level level)
{
    if ((unsigned)level > WK_LOG_DEBUG)
        return "?";
    return wk_log_names[level];
}

wk_err
wk_log_set_level_name(const char *name)
{
    for (unsigned i = 0; i <= WK_LOG_DEBUG; i++) {
        if (name && strcasecmp(name, wk_log_names[i]) == 0) {
            wk_log_threshold = (wk_log_level)i;
            return WK_OK;
        }
    }
    return WK_EINVAL;
}

void
wk_log_set_fd(int fd)
{
    wk_log_fd = fd;
}

void
wk_log_write(wk_log_level level, const char *module, const char *fmt, ...)
{
    char line[2048];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s %s: ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, wk_log_level_name(level), module);
    if (n < 0)
        return;
    size_t len = (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + len, sizeof(line) - len, fmt, ap);
    va_end(ap);
    if (m > 0)
        len += (size_t)m < sizeof(line) - len ? (size_t)m : sizeof(line) - len - 1;
    if (len >= sizeof(line) - 1)
        len = sizeof(line) - 2;
    line[len++] = '\n';
    ssize_t w = write(wk_log_fd, line, len);
    (void)w;
}
