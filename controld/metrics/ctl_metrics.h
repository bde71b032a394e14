/*
 * ctl_metrics: the controller's Prometheus registry. Counters, gauges and
 * fixed-bucket histograms, each a (name, label set) series, rendered in the
 * Prometheus text format (version 0.0.4). Families are declared once with
 * their help text and type; series appear on first use. Labels are
 * low-cardinality by rule (route, status, reason, worker, tier): never a
 * request, user or session id.
 *
 * Threading: all functions are thread-safe.
 */
#ifndef CTL_METRICS_H
#define CTL_METRICS_H

#include <stddef.h>

#include "wk_err.h"

typedef struct ctl_metrics ctl_metrics;

typedef enum ctl_metric_type {
    CTL_METRIC_COUNTER = 0, /* monotonically increasing */
    CTL_METRIC_GAUGE,       /* set to the current value */
    CTL_METRIC_HISTOGRAM,   /* observations into buckets */
} ctl_metric_type;

/* A new, empty registry. NULL on ENOMEM. Free with ctl_metrics_free(). */
ctl_metrics *ctl_metrics_new(void);
void ctl_metrics_free(ctl_metrics *m);

/*
 * Declares a family. buckets (ascending upper bounds, +Inf implied) are used
 * for histograms only and copied. WK_EEXIST when the name is taken, WK_ENOSPC
 * when the registry is full.
 */
WK_MUST_CHECK wk_err ctl_metrics_declare(ctl_metrics *m, const char *name, ctl_metric_type type,
                                         const char *help, const double *buckets,
                                         size_t n_buckets);

/*
 * labels is the Prometheus label text without braces ('route="/health",code="200"'),
 * or NULL/"" for none; the caller escapes values with ctl_metrics_escape().
 * Unknown families are ignored (a programming error, logged once in debug builds).
 */
void ctl_metrics_add(ctl_metrics *m, const char *name, const char *labels, double delta);
void ctl_metrics_set(ctl_metrics *m, const char *name, const char *labels, double value);
void ctl_metrics_observe(ctl_metrics *m, const char *name, const char *labels, double value);

/* Removes every series of a gauge family (before re-setting a snapshot). */
void ctl_metrics_clear(ctl_metrics *m, const char *name);

/* Renders the registry; caller frees *out with free(). */
WK_MUST_CHECK wk_err ctl_metrics_render(ctl_metrics *m, char **out, size_t *len);

/* Escapes a label value (backslash, quote, newline) into out (cap bytes, always NUL-terminated). */
void ctl_metrics_escape(const char *value, char *out, size_t cap);

#endif /* CTL_METRICS_H */
