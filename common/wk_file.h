/*
 * wk_file: reading a small whole file (a PEM certificate or key, a key
 * list) into memory with a size limit. No daemon logic, never logs.
 */
#ifndef WK_FILE_H
#define WK_FILE_H

#include <stddef.h>

#include "wk_err.h"

/*
 * Reads path whole into a new NUL-terminated buffer (*out, *len bytes not
 * counting the NUL; caller frees with free()). WK_ENOENT (missing),
 * WK_EPERM (unreadable), WK_ETOOBIG (over max bytes), WK_EIO, WK_ENOMEM;
 * the diag names the file. Outputs written only on success.
 */
WK_MUST_CHECK wk_err wk_file_read(const char *path, size_t max, char **out, size_t *len,
                                  wk_diag *d);

#endif /* WK_FILE_H */
