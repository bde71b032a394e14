/*
 * wctl_table: aligned text tables for wkvmctl's human output. Cells are
 * copied; control characters in them print as '?', so a hostile name from
 * the server cannot move the cursor or forge rows. Widths count UTF-8 code
 * points. Never talks to the network.
 */
#ifndef WCTL_TABLE_H
#define WCTL_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "wk_err.h"

#define WCTL_TABLE_COLS_MAX 16 /* most columns in one table */

typedef struct wctl_table wctl_table;

/*
 * A table with ncols (1..WCTL_TABLE_COLS_MAX) columns titled headers
 * (borrowed for the call, copied). Caller frees with wctl_table_free().
 * NULL on ENOMEM or a bad ncols.
 */
wctl_table *wctl_table_new(size_t ncols, const char *const *headers);

/* Appends a row of ncols cells (copied; NULL prints "-"). WK_ENOMEM. */
WK_MUST_CHECK wk_err wctl_table_add(wctl_table *t, const char *const *cells);

/*
 * Writes the header and rows to f, columns two spaces apart, the last one
 * unpadded. header false leaves the header out (key/value listings).
 */
void wctl_table_print(const wctl_table *t, FILE *f, bool header);

/* Frees t. NULL-safe. */
void wctl_table_free(wctl_table *t);

#endif /* WCTL_TABLE_H */
