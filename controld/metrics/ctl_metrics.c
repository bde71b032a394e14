/*
 * ctl_metrics: a small fixed-capacity Prometheus registry. Series live in a
 * flat array per family, searched linearly: families hold few series by the
 * low-cardinality rule, and rendering happens once per scrape.
 */
#include "ctl_metrics.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CTL_METRICS_FAMILIES 96
#define CTL_METRICS_SERIES 256
#define CTL_METRICS_BUCKETS 24
#define CTL_METRICS_LABELS 256

typedef struct ctl_series {
    char labels[CTL_METRICS_LABELS];             /* label text, "" for none */
    double value;                                /* counter/gauge value; histogram sum */
    unsigned long long count;                    /* histogram observation count */
    unsigned long long bucket[CTL_METRICS_BUCKETS]; /* histogram cumulative counts */
} ctl_series;

typedef struct ctl_family {
    char name[96];                      /* metric name */
    char help[256];                     /* HELP text */
    ctl_metric_type type;               /* kind */
    double bounds[CTL_METRICS_BUCKETS]; /* histogram upper bounds */
    size_t n_bounds;                    /* entries in bounds */
    ctl_series *series;                 /* array of CTL_METRICS_SERIES */
    size_t n_series;                    /* used entries */
} ctl_family;

struct ctl_metrics {
    pthread_mutex_t mu;                        /* guards everything */
    ctl_family fam[CTL_METRICS_FAMILIES];      /* families in declaration order */
    size_t n_fam;                              /* used entries */
};

ctl_metrics *
ctl_metrics_new(void)
{
    ctl_metrics *m = calloc(1, sizeof(*m));
    if (m != NULL)
        pthread_mutex_init(&m->mu, NULL);
    return m;
}

void
ctl_metrics_free(ctl_metrics *m)
{
    if (m == NULL)
        return;
    for (size_t i = 0; i < m->n_fam; i++)
        free(m->fam[i].series);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

static ctl_family *
ctl_metrics_family(ctl_metrics *m, const char *name)
{
    for (size_t i = 0; i < m->n_fam; i++) {
        if (strcmp(m->fam[i].name, name) == 0)
            return &m->fam[i];
    }
    return NULL;
}

wk_err
ctl_metrics_declare(ctl_metrics *m, const char *name, ctl_metric_type type, const char *help,
                    const double *buckets, size_t n_buckets)
{
    wk_err err = WK_OK;
    pthread_mutex_lock(&m->mu);
    if (ctl_metrics_family(m, name) != NULL) {
        err = WK_EEXIST;
    } else if (m->n_fam >= CTL_METRICS_FAMILIES || n_buckets > CTL_METRICS_BUCKETS ||
               strlen(name) >= sizeof(m->fam[0].name)) {
        err = WK_ENOSPC;
    } else {
        ctl_family *f = &m->fam[m->n_fam];
        f->series = calloc(CTL_METRICS_SERIES, sizeof(*f->series));
        if (f->series == NULL) {
            err = WK_ENOMEM;
        } else {
            snprintf(f->name, sizeof(f->name), "%s", name);
            snprintf(f->help, sizeof(f->help), "%s", help);
            f->type = type;
            if (type == CTL_METRIC_HISTOGRAM) {
                memcpy(f->bounds, buckets, n_buckets * sizeof(*buckets));
                f->n_bounds = n_buckets;
            }
            m->n_fam++;
        }
    }
    pthread_mutex_unlock(&m->mu);
    return err;
}

/* The series of f with labels, created when absent. Caller holds mu. NULL when f is full. */
static ctl_series *
ctl_metrics_series(ctl_family *f, const char *labels)
{
    if (labels == NULL)
        labels = "";
    for (size_t i = 0; i < f->n_series; i++) {
        if (strcmp(f->series[i].labels, labels) == 0)
            return &f->series[i];
    }
    if (f->n_series >= CTL_METRICS_SERIES || strlen(labels) >= CTL_METRICS_LABELS)
        return NULL;
    ctl_series *s = &f->series[f->n_series++];
    memset(s, 0, sizeof(*s));
    snprintf(s->labels, sizeof(s->labels), "%s", labels);
    return s;
}

void
ctl_metrics_add(ctl_metrics *m, const char *name, const char *labels, double delta)
{
    pthread_mutex_lock(&m->mu);
    ctl_family *f = ctl_metrics_family(m, name);
    ctl_series *s = f ? ctl_metrics_series(f, labels) : NULL;
    if (s != NULL)
        s->value += delta;
    pthread_mutex_unlock(&m->mu);
}

void
ctl_metrics_set(ctl_metrics *m, const char *name, const char *labels, double value)
{
    pthread_mutex_lock(&m->mu);
    ctl_family *f = ctl_metrics_family(m, name);
    ctl_series *s = f ? ctl_metrics_series(f, labels) : NULL;
    if (s != NULL)
        s->value = value;
    pthread_mutex_unlock(&m->mu);
}

void
ctl_metrics_observe(ctl_metrics *m, const char *name, const char *labels, double value)
{
    pthread_mutex_lock(&m->mu);
    ctl_family *f = ctl_metrics_family(m, name);
    ctl_series *s = f && f->type == CTL_METRIC_HISTOGRAM ? ctl_metrics_series(f, labels) : NULL;
    if (s != NULL) {
        s->value += value;
        s->count++;
        for (size_t b = 0; b < f->n_bounds; b++) {
            if (value <= f->bounds[b])
                s->bucket[b]++;
        }
    }
    pthread_mutex_unlock(&m->mu);
}

void
ctl_metrics_clear(ctl_metrics *m, const char *name)
{
    pthread_mutex_lock(&m->mu);
    ctl_family *f = ctl_metrics_family(m, name);
    if (f != NULL)
        f->n_series = 0;
    pthread_mutex_unlock(&m->mu);
}

void
ctl_metrics_escape(const char *value, char *out, size_t cap)
{
    size_t o = 0;
    for (const char *p = value; *p && o + 3 < cap; p++) {
        if (*p == '\\' || *p == '"') {
            out[o++] = '\\';
            out[o++] = *p;
        } else if (*p == '\n') {
            out[o++] = '\\';
            out[o++] = 'n';
        } else {
            out[o++] = *p;
        }
    }
    out[o] = '\0';
}

static const char *
ctl_metrics_type_name(ctl_metric_type t)
{
    return t == CTL_METRIC_COUNTER ? "counter" : t == CTL_METRIC_GAUGE ? "gauge" : "histogram";
}

static void
ctl_metrics_le(FILE *f, const char *name, const char *labels, const char *le,
               unsigned long long v)
{
    fprintf(f, "%s_bucket{%s%sle=\"%s\"} %llu\n", name, labels, labels[0] ? "," : "", le, v);
}

wk_err
ctl_metrics_render(ctl_metrics *m, char **out, size_t *len)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (f == NULL)
        return WK_ENOMEM;
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < m->n_fam; i++) {
        ctl_family *fa = &m->fam[i];
        fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", fa->name, fa->help, fa->name,
                ctl_metrics_type_name(fa->type));
        if (fa->type != CTL_METRIC_HISTOGRAM && fa->n_series == 0 &&
            fa->type == CTL_METRIC_COUNTER)
            fprintf(f, "%s 0\n", fa->name);
        for (size_t s = 0; s < fa->n_series; s++) {
            ctl_series *se = &fa->series[s];
            const char *lb = se->labels;
            if (fa->type != CTL_METRIC_HISTOGRAM) {
                if (lb[0])
                    fprintf(f, "%s{%s} %.17g\n", fa->name, lb, se->value);
                else
                    fprintf(f, "%s %.17g\n", fa->name, se->value);
                continue;
            }
            for (size_t b = 0; b < fa->n_bounds; b++) {
                char le[32];
                snprintf(le, sizeof(le), "%g", fa->bounds[b]);
                ctl_metrics_le(f, fa->name, lb, le, se->bucket[b]);
            }
            ctl_metrics_le(f, fa->name, lb, "+Inf", se->count);
            fprintf(f, "%s_sum%s%s%s %.17g\n%s_count%s%s%s %llu\n", fa->name, lb[0] ? "{" : "",
                    lb, lb[0] ? "}" : "", se->value, fa->name, lb[0] ? "{" : "", lb,
                    lb[0] ? "}" : "", se->count);
        }
    }
    pthread_mutex_unlock(&m->mu);
    if (fclose(f) != 0) {
        free(buf);
        return WK_ENOMEM;
    }
    *out = buf;
    *len = n;
    return WK_OK;
}
