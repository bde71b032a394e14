/*
 * wk_safetensors: the safetensors reader behind wk_tensor_set_open(), single
 * file and sharded (model.safetensors.index.json). Internal to common/.
 *
 * The header is hostile input: its length, JSON, dtypes, shapes and data
 * offsets are all checked against the buffer before a tensor is exposed, and
 * every diagnostic names the offending tensor (or header field). It never
 * copies tensor bytes and never logs.
 */
#ifndef WK_SAFETENSORS_H
#define WK_SAFETENSORS_H

#include <stddef.h>

#include "wk_err.h"
#include "wk_tensor_priv.h"

#define WK_ST_MAX_HEADER ((size_t)100 << 20) /* max JSON header bytes (100 MiB) */
#define WK_ST_MAX_TENSORS ((size_t)1 << 20)  /* max tensors in one file or index */
#define WK_ST_MAX_INDEX ((size_t)100 << 20)  /* max size of an index .json file */
#define WK_ST_MAX_SHARDS ((size_t)4096)      /* max distinct shard files in an index */

/*
 * Parses the safetensors image [buf, buf + len) held in memory (a mapped file
 * or a fuzzer input) and appends its tensors to out, in no particular order.
 * Tensor data points into buf: borrowed for as long as buf lives. Nothing is
 * appended on failure. Returns WK_EINVAL (malformed: truncated, header length
 * past the end, bad JSON, bad shape or offsets, overlap, duplicate name),
 * WK_ENOTSUP (dtype other than F32/F16/BF16, more than WK_TENSOR_MAX_DIMS
 * dims), WK_ETOOBIG (header over WK_ST_MAX_HEADER, too many tensors),
 * WK_ENOMEM. Thread-safe (no shared state).
 */
WK_MUST_CHECK wk_err wk_st_parse(const void *buf, size_t len, wk_tensor_list *out, wk_diag *d);

/*
 * Opens the sharded checkpoint described by the index file at index_path (a
 * JSON object with a "weight_map" object {tensor name: shard file}). Every
 * distinct shard is mapped once; shard names must be plain base names in the
 * index's directory. Each tensor of weight_map must be present in its named
 * shard, each shard tensor must be listed under that shard, and no tensor may
 * appear in two shards. On success *maps (n_maps entries, heap array the
 * caller closes with wk_map_close() on each and frees with free()) backs the
 * tensors appended to out. Nothing is kept on failure; the diagnostic starts
 * with index_path (and names the shard when one is at fault). Returns the
 * codes of wk_map_open() and wk_st_parse(), and WK_EINVAL for a malformed
 * index.
 */
WK_MUST_CHECK wk_err wk_st_index_open(const char *index_path, wk_map **maps, size_t *n_maps,
                                      wk_tensor_list *out, wk_diag *d);

/*
 * Parses the index JSON [buf, buf + len) alone (what wk_st_index_open() reads
 * first) and reports its number of tensors and distinct shards; used by the
 * fuzz harness and tests. Returns WK_OK, WK_EINVAL, WK_ETOOBIG or WK_ENOMEM.
 */
WK_MUST_CHECK wk_err wk_st_index_check(const void *buf, size_t len, size_t *n_tensors,
                                       size_t *n_shards, wk_diag *d);

#endif /* WK_SAFETENSORS_H */
