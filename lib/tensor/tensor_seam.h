/* SPDX-License-Identifier: MIT */
/* The tensor layer's seam for the layers above it (internal).
 *
 * The tensor layer is lib/tensor with its autograd engine,
 * lib/tensor/autograd: autograd is part of the tensor layer, as in PyTorch
 * (docs/TENSORS.md, "Layer"). Above it, the training code (lib/train/optim,
 * lib/train/nn, lib/train/checkpoint) and the distributed-autograd module include this
 * header and the public shmrpc/tensor.h, nothing else of lib/tensor; the RPC
 * layer's codec and values see tensors through tensor/desc.h only.
 * tensor_impl.h, kernels.h, gemm.h and the struct sr_tensor they define stay
 * private to the layer: above it, a tensor's dtype and geometry are read
 * through the public accessors (sr_tensor_dtype, sr_tensor_ndim,
 * sr_tensor_shape).
 *
 * What each layer above uses:
 *   lib/train/optim        sr__map / sr__map_into (an elementwise update computed
 *                    in double), sr__tensor_write_begin_from / _end_from (an
 *                    in-place update under the parameter's write lock),
 *                    shape checks and messages;
 *   lib/train/nn           sr__tensor_new + sr__tensor_new_data (a fresh tensor
 *                    filled in place), sr__tensor_pin / _unpin (reading a
 *                    tensor without a loop), sr__load_f64 / sr__store_f64,
 *                    the checks, the xoshiro generator (tensor/xoshiro.h),
 *                    the fused layer norm + relu (sequential models);
 *   lib/train/checkpoint   sr__tensor_snapshot (the values at save time, whatever
 *                    in-place writes follow), shape checks and messages;
 *   dist_autograd    the engine's extension points, tensor/autograd/engine.h
 *                    as a whole: node types, edges, graph tasks, sinks.
 *
 * Inside the layer the calls go one way where they can: the ops (lib/tensor)
 * call the engine (sr__node_for_inputs, sr__attach, sr__grad_mode) to record
 * history, and the engine calls back into tensors only through the
 * functions of tensor_impl.h and the public API (a node's apply runs ops);
 * the engine never includes an op's file. The internal headers include this
 * one, so each declaration below has one home.
 */
#ifndef SR_LIB_TENSOR_SEAM_H
#define SR_LIB_TENSOR_SEAM_H

#if !defined(SR__SEES_TENSOR)
#error "tensor_seam.h is the seam of the tensor layer, for it and the layers above it only (docs/ARCHITECTURE.md)"
#endif
#include <stdbool.h>
#include <stdint.h>

#include "shmrpc/tensor.h"
#include "autograd/engine.h"
#include "xoshiro.h"

/* ---- making and reading tensors (tensor.c) ---- */
/* A new contiguous tensor with fresh uninitialised storage; fn names the caller in errors. */
sr_tensor *sr__tensor_new(const char *fn, sr_dtype dt, int ndim, const int64_t *shape);
/* t's first element, for filling a tensor the caller just made (sr__tensor_new,
 * sr_empty) that no other thread can see yet: no lock, no copy-on-write. */
char *sr__tensor_new_data(sr_tensor *t);
/* Pins (tensor_impl.h, "Readers pin what they read"): t's storage's current
 * block, referenced, and t's first element in it. A thread's pins of one
 * storage nest and share one block: the first takes the storage lock briefly
 * and a block reference, the others only count. Unpin each pin once (the last
 * drops the reference). The pointer is valid, and its bytes unchanged, until
 * then. */
const char *sr__tensor_pin(const sr_tensor *t);
void sr__tensor_unpin(const sr_tensor *t);
/* An in-place write of t that reads src[0..n) (NULL entries skipped): checks
 * grad mode (-EPERM), pins the sources in other storages, then takes t's
 * write lock and makes t's storage writable (so never one storage lock under
 * another); on 0 the caller writes, then calls _end_from, which unlocks and
 * unpins. Sources in t's own storage are read under t's lock, from its
 * writable block. On error the lock is not held. */
int sr__tensor_write_begin_from(sr_tensor *t, const char *fn, const sr_tensor *const *src, int n);
void sr__tensor_write_end_from(sr_tensor *t, const sr_tensor *const *src, int n);
/* A tensor with t's geometry over t's block, through its own new storage
 * object (its own block reference): no history, no grad. The block is the
 * one this thread pinned for t's storage if it did (sr__tensor_pin), else
 * t's current one. What autograd saves for backward. NULL on -ENOMEM. */
sr_tensor *sr__tensor_snapshot(const sr_tensor *t);
int64_t sr__numel(int ndim, const int64_t *shape);
/* Tensors of this process alive now, by dtype (SR_F32, SR_F64, SR_I64). */
void sr__tensor_live_counts(int64_t out[3]);

/* ---- shapes and errors (shape.c) ---- */
#define SR_SHAPE_STR 160
/* "[2, 3]" in buf[SR_SHAPE_STR]. */
const char *sr__shape_str(int ndim, const int64_t *shape, char *buf);
/* t's shape, the same way. */
const char *sr__tensor_shape_str(const sr_tensor *t, char *buf);
/* -EINVAL naming fn, or 0. */
int sr__check_dtype(const char *fn, sr_dtype dt);
int sr__check_same_dtype(const char *fn, const sr_tensor *a, const sr_tensor *b);
int sr__check_float(const char *fn, const sr_tensor *a);
bool sr__same_shape(const sr_tensor *a, const sr_tensor *b);
/* Normalise a possibly negative dim into [0, ndim); -EINVAL naming fn. */
int sr__wrap_dim(const char *fn, int dim, int ndim);

/* ---- elements (loop.c, kernels.c) ---- */
/* Elements as doubles (n at a time, byte stride). */
void sr__load_f64(double *dst, const char *src, int64_t stride, int64_t n, sr_dtype dt);
void sr__store_f64(char *dst, int64_t stride, const double *src, int64_t n, sr_dtype dt);
/* y = f(x[0..nin)) per element, computed in double. */
typedef double (*sr_map_fn)(const double *x, const void *arg);
/* A new tensor of in[0]'s dtype and the broadcast shape of in[0..nin)
 * (nin <= 3); fn names the op in errors. */
sr_tensor *sr__map(const char *fn, sr_tensor *const *in, int nin, sr_map_fn f, const void *arg);
/* The same into out (written: the caller owns it or holds its write lock),
 * whose shape every input broadcasts to. */
void sr__map_into(sr_tensor *out, sr_tensor *const *in, int nin, sr_map_fn f, const void *arg);

/* ---- fused ops (norm.c) ---- */
/* relu(sr_layer_norm(...)) in one op, for sequential models (lib/train/nn):
 * the same output and gradients, bit for bit, without relu's own passes over
 * memory (the forward selects each row from cache; the backward masks dY by
 * the saved output inside layer norm's passes). Its node is
 * "LayerNormReluBackward0"; its errors are sr_layer_norm's. */
sr_tensor *sr__layer_norm_relu(sr_tensor *x, int ndim, const int64_t *normalized_shape, sr_tensor *weight,
                               sr_tensor *bias, double eps);
/* (norm_pool.c) sr_max_pool2d(relu(sr_layer_norm(...))) with a 2 x 2 window,
 * stride 2 and no padding, in one op: the same output and gradients, bit for
 * bit, with only the pooled values written (each sample is normalised and
 * pooled from cache) and a byte per window kept for backward. Its node is
 * "LayerNormReluMaxPool2DBackward0"; an input that is not [N, C, H, W] with
 * the norm over [C, H, W] or [H, W] and H, W >= 2 runs the ops apart. */
sr_tensor *sr__layer_norm_relu_pool(sr_tensor *x, int ndim, const int64_t *normalized_shape, sr_tensor *weight,
                                    sr_tensor *bias, double eps);

/* ---- op spans (ops_hook.c) ----
 * A layer above (the profiler, SHMRPC_TRACE_OPS: docs/PROFILING.md) sees
 * every compute op of the layer (matmul, conv2d, the arithmetic, the
 * reductions, the losses, ...; not views, factories or accessors) by
 * registering hooks: begin(op) when an op starts, on its thread, returning
 * a token; end(op, token) when it returns (a nested op, such as the mm
 * inside a matmul, is a span inside its caller's). op is the public
 * function's name without "sr_" ("matmul", "add_"), a string literal. Both
 * must not block and must not call tensor ops. NULL turns them off; while
 * off an op pays one relaxed load and a predicted branch. Registration is
 * process-wide; an op that started before the hooks changed ends with the
 * hooks it began with. */
typedef struct sr_op_hooks {
    int64_t (*begin)(const char *op);
    void (*end)(const char *op, int64_t token);
} sr_op_hooks;
void sr__tensor_op_hooks_set(const sr_op_hooks *h);

#endif
