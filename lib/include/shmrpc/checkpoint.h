/* SPDX-License-Identifier: MIT */
/* shmrpc: crash-safe checkpoints of named tensors and integer metadata.
 *
 * A checkpoint is one file holding named tensors (parameters, or an
 * optimizer's state exported as named tensors such as "optim.0.exp_avg") and
 * a few named int64 values ("step", "epoch"). The format is in
 * docs/CHECKPOINT.md.
 *
 * Durability. sr_checkpoint_save writes a temporary file beside the target
 * (`<path>.tmp.<pid>`) through io_uring, fsyncs it, renames it over the
 * target and fsyncs the directory. A crash (of the process or of the
 * machine) at any moment leaves either the previous checkpoint or the new
 * one at `path`, never a mix; once save returns 0 the new one survives a
 * power loss. Temporary files left by a crashed writer are removed by the
 * next save of the same path.
 *
 * Validation. sr_checkpoint_load checks everything before it returns: magic,
 * version, header and table-of-contents checksums, every size and offset
 * against the file's size (before trusting it), dtypes, ranks, shapes and
 * each tensor's CRC32. A damaged file is -EBADMSG with the reason, e.g.
 *   "sr_checkpoint_load: checkpoint /x/ck.bin: tensor 'fc1.weight' checksum mismatch ..."
 *   "sr_checkpoint_load: checkpoint /x/ck.bin: truncated: table of contents needs 4096 bytes, file has 100"
 *
 * Ownership. sr_checkpoint_load hands back an sr_checkpoint the caller
 * destroys with sr_checkpoint_destroy(); it owns its tensors and names.
 * Names returned by accessors are borrowed, valid until the destroy.
 *
 * Threads. A loaded checkpoint is immutable and may be read by several
 * threads at once. Save reads the tensors it is given: they must not be
 * written while it runs (as for any reader, tensor.h "Threads"). Concurrent
 * saves to one path are safe (the last rename wins); from one process they
 * take turns on the temporary file's lock.
 */
#ifndef SHMRPC_CHECKPOINT_H
#define SHMRPC_CHECKPOINT_H

#if defined(SR__BUILDING) && !defined(SR__SEES_TRAIN)
#error "shmrpc/checkpoint.h belongs to the training (train) layer, which this layer sits below (docs/ARCHITECTURE.md)"
#endif
#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "nn.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Longest tensor or metadata name, in bytes (without the NUL). */
#define SR_CHECKPOINT_NAME_MAX 1024

typedef struct sr_checkpoint sr_checkpoint;

/* Write n named tensors and nmeta named int64 values to path, replacing any
 * file there only once the new one is complete and on disk.
 *   names[i] / tensors[i]: non-empty, distinct names of at most
 *     SR_CHECKPOINT_NAME_MAX bytes; tensors of any dtype, shape and strides
 *     (a non-contiguous view is written in row-major order). Borrowed.
 *   meta_names[i] / meta_values[i]: the same rules, a namespace of its own.
 * Arrays may be NULL when their count is 0.
 * Returns 0, or -errno with the detail in sr_last_error():
 *   -EINVAL  a NULL, empty, too long or duplicate name, a NULL tensor;
 *   -ENOENT, -EACCES, -ENOSPC, -EIO, ...  from the file system, naming
 *            the file and the step (open, write, fsync, rename);
 *   -ENOMEM.
 * On failure the previous checkpoint at path is untouched and no temporary
 * file is left. */
SR_API int sr_checkpoint_save(const char *path, size_t n, const char *const *names, sr_tensor *const *tensors,
                              size_t nmeta, const char *const *meta_names, const int64_t *meta_values);

/* Read and validate the checkpoint at path into *out (NULL on failure).
 * Tensors come back contiguous, without grad, in the shared heap.
 * Returns 0, or:
 *   -ENOENT (no such file), -EACCES, -EIO, ...  naming the file;
 *   -EBADMSG  the file is not a valid checkpoint: truncated, corrupt, a bad
 *             magic or version, a checksum mismatch (the detail says which);
 *   -EINVAL   NULL path or out;
 *   -ENOMEM. */
SR_API int sr_checkpoint_load(const char *path, sr_checkpoint **out);

/* NULL is ignored. Tensors from sr_checkpoint_tensor go with it unless
 * the caller took its own reference (sr_tensor_ref). */
SR_API void sr_checkpoint_destroy(sr_checkpoint *c);

/* Tensors, in the order they were saved. */
SR_API size_t sr_checkpoint_count(const sr_checkpoint *c);
/* Borrowed name of tensor i; NULL if i >= count. */
SR_API const char *sr_checkpoint_name(const sr_checkpoint *c, size_t i);
/* Borrowed (an accessor, as sr_module_param): the checkpoint's tensor
 * called name, valid until sr_checkpoint_destroy (sr_tensor_ref it to keep
 * it longer), or NULL with -ENOENT in sr_last_error() when absent. It is
 * the checkpoint's own tensor: sr_clone it before writing to it if later
 * lookups must see the saved values. */
SR_API sr_tensor *sr_checkpoint_tensor(const sr_checkpoint *c, const char *name);
/* The old form, kept for one release: the same tensor as a new reference. */
SR_API sr_tensor *sr_checkpoint_get(const sr_checkpoint *c, const char *name)
    __attribute__((deprecated("use sr_checkpoint_tensor, which lends the tensor (borrowed)")));

/* Metadata entries, in the order they were saved. */
SR_API size_t sr_checkpoint_meta_count(const sr_checkpoint *c);
/* Borrowed name of metadata entry i; NULL if i >= count. */
SR_API const char *sr_checkpoint_meta_name(const sr_checkpoint *c, size_t i);
/* *value = the entry called name. Returns 0, -ENOENT when absent, -EINVAL
 * for a NULL argument. */
SR_API int sr_checkpoint_meta(const sr_checkpoint *c, const char *name, int64_t *value);

/* Copy the checkpoint's tensors names[i] into dst[i] in place (any strides;
 * grad mode off, so leaves that require grad may be targets, as in
 * load_state_dict). Every pair is checked before anything is copied, so on
 * an error no dst has changed. Returns 0, or:
 *   -ENOENT  a name the checkpoint lacks;
 *   -EINVAL  a NULL argument, or a dtype or shape that differs, e.g.
 *     "sr_checkpoint_restore_into: 'fc1.weight' has shape [128, 784] in the checkpoint, [64, 784] in the model";
 *   -EPERM   a dst that is a non-leaf requiring grad (a view of a
 *            parameter made with grad mode on: restore into the parameter);
 *   -ENOMEM  copy-on-write of a shared dst failed; the tensors before it
 *            have been copied (the only partial outcome). */
SR_API int sr_checkpoint_restore_into(const sr_checkpoint *c, size_t n, const char *const *names,
                                      sr_tensor *const *dst);

/* ---- a module by name ----
 * Save module m's parameters as the tensors "<prefix><name>" (prefix NULL:
 * ""; sr_module_state_dict names them), with nmeta metadata values as in
 * sr_checkpoint_save. Errors as sr_checkpoint_save's. Several modules in one
 * file: concatenate their sr_module_state_dict lists, one prefix each. */
SR_API int sr_checkpoint_save_module(const char *path, const char *prefix, const sr_module *m, size_t nmeta,
                                     const char *const *meta_names, const int64_t *meta_values);
/* Load every parameter of m from the checkpoint's tensor "<prefix><name>",
 * as sr_checkpoint_restore_into (all checked first; the errors name the
 * tensor: -ENOENT for one the checkpoint lacks, -EINVAL for a dtype or
 * shape that differs). The checkpoint may hold other tensors too. */
SR_API int sr_checkpoint_load_module(const sr_checkpoint *c, const char *prefix, sr_module *m);

#ifdef __cplusplus
}
#endif
#endif
