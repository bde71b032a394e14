/*
 * wk_pth: the PyTorch checkpoint reader behind wk_tensor_set_open(), for the
 * zip format torch.save() has written since 1.6 (what BlinkDL ships). Internal
 * to common/.
 *
 * The zip central directory is parsed here (stored entries only, zip64
 * aware), and data.pkl is interpreted by a small pickle machine that knows a
 * fixed list of opcodes and globals (collections.OrderedDict,
 * torch._utils._rebuild_tensor_v2, torch._utils._rebuild_parameter and the
 * torch.*Storage classes). It never executes anything: any other global is
 * refused by name. Every count it keeps is bounded by a WK_PTH_MAX_* limit.
 * Tensor data points into the archive bytes; nothing is copied. Never logs.
 */
#ifndef WK_PTH_H
#define WK_PTH_H

#include <stddef.h>

#include "wk_err.h"
#include "wk_tensor_priv.h"

#define WK_PTH_MAX_ENTRIES ((size_t)1 << 18) /* max zip entries */
#define WK_PTH_MAX_PICKLE ((size_t)64 << 20) /* max data.pkl bytes */
#define WK_PTH_MAX_STACK ((size_t)1 << 16)   /* max pickle stack depth (values) */
#define WK_PTH_MAX_MARKS ((size_t)1024)      /* max nested MARKs */
#define WK_PTH_MAX_MEMO ((size_t)1 << 20)    /* max memo index + 1 */
#define WK_PTH_MAX_OBJECTS ((size_t)1 << 21) /* max values created by one pickle */
#define WK_PTH_MAX_ITEMS ((size_t)1 << 22)   /* max list/dict/tuple slots, all together */
#define WK_PTH_MAX_STR ((size_t)1 << 16)     /* max bytes of one pickled string */
#define WK_PTH_MAX_TENSORS ((size_t)1 << 16) /* max tensors in one checkpoint */
#define WK_PTH_MAX_NEST 4                    /* max "state_dict"/"model"/"module" descents */

/*
 * Resolves a storage key (the third field of torch's persistent id, e.g. "0")
 * to its bytes. Writes *data and *len on success; returns WK_ENOENT when the
 * key is unknown, or another wk_err with d set.
 */
typedef wk_err (*wk_pth_storage_fn)(void *ctx, const char *key, const void **data, size_t *len,
                                    wk_diag *d);

/*
 * Parses the torch zip archive [buf, buf + len) held in memory and appends its
 * tensors to out (data points into buf, borrowed for as long as buf lives).
 * The pickle top must be a dict (or OrderedDict) of tensors; when it holds no
 * tensor, its "state_dict", "model" or "module" dict is searched instead (up
 * to WK_PTH_MAX_NEST levels). Nothing is appended on failure. Returns
 * WK_EINVAL (malformed archive or pickle, non-contiguous tensor, bounds),
 * WK_ENOTSUP (compressed, encrypted or multi-disk entry, big-endian data,
 * unknown opcode or global, unsupported dtype), WK_ETOOBIG (a WK_PTH_MAX_*
 * limit), WK_ENOMEM. Diagnostics name the tensor, entry or pickle offset.
 * Thread-safe (no shared state).
 */
WK_MUST_CHECK wk_err wk_pth_parse(const void *buf, size_t len, wk_tensor_list *out, wk_diag *d);

/*
 * Interprets the pickle [pkl, pkl + len) alone, resolving storages through
 * resolve(ctx, ...), and appends the tensors to out as wk_pth_parse() does.
 * Exposed for tests and the fuzz harness. Same return codes.
 */
WK_MUST_CHECK wk_err wk_pth_pickle_load(const void *pkl, size_t len, wk_pth_storage_fn resolve,
                                        void *ctx, wk_tensor_list *out, wk_diag *d);

#endif /* WK_PTH_H */
