/*
 * wk_file: reading a small whole file (a PEM certificate or key, a key
 * list) into memory with a size limit, and what a --model path names. No
 * daemon logic, never logs.
 */
#ifndef WK_FILE_H
#define WK_FILE_H

#include <stdbool.h>
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

/*
 * What a --model path names: a directory (*is_file false, dir = model) or
 * one checkpoint file (.gguf, .pth, .safetensors; *is_file true, dir = the
 * directory holding it, "." for a bare name), whose config.json and
 * tokenizer are looked for beside it. name (may be NULL) gets the model's
 * name: the directory's base name, or the file's without its extension.
 * WK_ETOOBIG when dir or name does not fit its cap.
 */
WK_MUST_CHECK wk_err wk_file_model_path(const char *model, char *dir, size_t dir_cap,
                                        char *name, size_t name_cap, bool *is_file);

#endif /* WK_FILE_H */
