/*
 * wctl_table: rows of copied, sanitised cells printed with column widths
 * computed over the whole table. Never talks to the network.
 */
#include "wctl_table.h"

#include <stdlib.h>
#include <string.h>

struct wctl_table {
    size_t ncols; /* columns per row */
    size_t nrows; /* rows, the header included */
    size_t cap;   /* rows allocated */
    char **cells; /* nrows * ncols owned strings, row-major; row 0 is the header */
};

/* Copies s with control characters replaced by '?'. NULL on ENOMEM. */
static char *
wctl_table_clean(const char *s)
{
    char *c = strdup(s != NULL ? s : "-");
    if (c == NULL)
        return NULL;
    for (char *p = c; *p; p++) {
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = '?';
    }
    return c;
}

/* Display width: UTF-8 code points. */
static size_t
wctl_table_width(const char *s)
{
    size_t w = 0;
    for (; *s; s++) {
        if (((unsigned char)*s & 0xc0) != 0x80)
            w++;
    }
    return w;
}

static wk_err
wctl_table_push(wctl_table *t, const char *const *cells)
{
    if (t->nrows == t->cap) {
        size_t ncap = t->cap ? t->cap * 2 : 16;
        char **nc = realloc(t->cells, ncap * t->ncols * sizeof(*nc));
        if (nc == NULL)
            return WK_ENOMEM;
        t->cells = nc;
        t->cap = ncap;
    }
    char **row = t->cells + t->nrows * t->ncols;
    for (size_t i = 0; i < t->ncols; i++) {
        row[i] = wctl_table_clean(cells[i]);
        if (row[i] == NULL) {
            while (i-- > 0)
                free(row[i]);
            return WK_ENOMEM;
        }
    }
    t->nrows++;
    return WK_OK;
}

wctl_table *
wctl_table_new(size_t ncols, const char *const *headers)
{
    if (ncols == 0 || ncols > WCTL_TABLE_COLS_MAX)
        return NULL;
    wctl_table *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return NULL;
    t->ncols = ncols;
    if (wctl_table_push(t, headers) != WK_OK) {
        wctl_table_free(t);
        return NULL;
    }
    return t;
}

wk_err
wctl_table_add(wctl_table *t, const char *const *cells)
{
    return wctl_table_push(t, cells);
}

void
wctl_table_print(const wctl_table *t, FILE *f, bool header)
{
    size_t w[WCTL_TABLE_COLS_MAX] = {0};
    size_t first = header ? 0 : 1;
    for (size_t r = first; r < t->nrows; r++) {
        for (size_t c = 0; c < t->ncols; c++) {
            size_t cw = wctl_table_width(t->cells[r * t->ncols + c]);
            if (cw > w[c])
                w[c] = cw;
        }
    }
    for (size_t r = first; r < t->nrows; r++) {
        for (size_t c = 0; c < t->ncols; c++) {
            const char *s = t->cells[r * t->ncols + c];
            fputs(s, f);
            if (c + 1 < t->ncols) {
                for (size_t pad = wctl_table_width(s); pad < w[c] + 2; pad++)
                    fputc(' ', f);
            }
        }
        fputc('\n', f);
    }
}

void
wctl_table_free(wctl_table *t)
{
    if (t == NULL)
        return;
    for (size_t i = 0; i < t->nrows * t->ncols; i++)
        free(t->cells[i]);
    free(t->cells);
    free(t);
}
