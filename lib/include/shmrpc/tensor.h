/* SPDX-License-Identifier: MIT */
/* shmrpc: tensors, their maths, and local autograd.
 *
 * A tensor is a strided N-d view (ndim <= SR_MAX_DIMS) of a storage whose
 * bytes live in a shared-heap block, so that RPC can pass it to another
 * worker without copying it (see docs/TENSORS.md).
 *
 * Ownership. Every function that returns `sr_tensor *` returns a NEW
 * reference that the caller releases with sr_tensor_unref(). Arguments are
 * borrowed: an op takes its own references where it keeps a tensor. Accessors
 * that return pointers (sr_tensor_shape, sr_tensor_grad, ...) return borrowed
 * pointers, valid while the tensor is alive and not modified; they (like
 * every accessor) require a non-NULL tensor. A tensor made while the worker
 * is attached to its job (after sr_init) lives in the job's segment: release
 * it before sr_shutdown(), which unmaps the segment (unlike RRefs, tensors do
 * not outlive it).
 *
 * Errors. Tensor maths returns NULL on failure with the detail in
 * sr_last_error(), naming the op and the offending shapes or dtypes, e.g.
 *   "sr_add: shapes [2, 3] and [4] cannot be broadcast"
 *   "sr_mul: dtypes f32 and f64 do not match"
 * An op given a NULL argument returns NULL and leaves sr_last_error() as the
 * failing op set it, so the first error of a chained expression survives.
 * Calls that return int return 0 or -errno (-EINVAL for a bad argument,
 * -ENOMEM when the heap is full).
 *
 * Dtypes and promotion. Tensor-tensor ops require equal dtypes (no implicit
 * promotion); a mismatch is -EINVAL naming both. Scalar operands (double)
 * take the tensor's dtype. i64 tensors support creation, views, copies,
 * add/sub/mul/neg, sums, cat/stack/split, and class targets for nll_loss;
 * floating-point-only ops (div, exp, matmul, ...) reject them by name. Only
 * f32/f64 tensors can require grad.
 *
 * Views. view, reshape (when strides allow), transpose, t, permute, narrow,
 * squeeze, unsqueeze, expand, detach and split/chunk return tensors that
 * share storage with their input: a write through one is seen by the other,
 * as in PyTorch.
 *
 * Copy-on-write. Each process keeps one storage object per storage, shared
 * by all of its local views; it holds exactly one reference on the heap
 * block. Every in-place write (sr_add_, sr_fill_, the optimizers, gradient
 * accumulation, sr_tensor_mutable_data) first checks the block's refcount:
 * above 1 means another holder exists (a message in flight, another worker,
 * or another storage object of this process adopted from a message), and the
 * storage then moves to a private copy of the whole block before the write.
 * Local views follow the move, because they share the storage object. So a
 * tensor passed by RPC behaves as a copy (neither side sees the other's
 * later writes) while views keep aliasing.
 *
 * Saved tensors. What an op saves for backward is a snapshot holding its own
 * block reference, so an in-place write to the tensor afterwards (an
 * optimizer step while another backward is pending) moves the tensor to a
 * private copy and backward still uses the forward's values: the gradient is
 * exact for its own forward. Unlike PyTorch, there is no "modified by an
 * inplace operation" error; the cost is one copy of a block written while a
 * pending backward still needs it (docs/TENSORS.md, "In-place writes and
 * saved tensors").
 *
 * Threads. Tensor objects are refcounted atomically and may be shared and
 * read by several threads. An in-place op (and so an optimizer step or
 * gradient accumulation) may run while other threads send the same tensor
 * by RPC, record ops that save it, or compute on it (any op reading it):
 * those see the values before the write or after it, never a mix (a short
 * per-storage lock, and a reader holds a reference on the bytes it reads,
 * so the write then moves the tensor to a copy; docs/TENSORS.md).
 * Concurrent in-place ops on one tensor are serialised by the same lock,
 * each op whole (two threads' sr_add_ both add); a sequence of ops, such as
 * an optimizer step, is not atomic as a whole. Reads through sr_tensor_data's
 * pointer and writes through sr_tensor_mutable_data's need external
 * synchronisation, as in PyTorch.
 * Grad mode is per thread.
 */
#ifndef SHMRPC_TENSOR_H
#define SHMRPC_TENSOR_H

#if defined(SR__BUILDING) && !defined(SR__SEES_TENSOR)
#error "shmrpc/tensor.h belongs to the tensor layer, which this layer sits below (docs/ARCHITECTURE.md)"
#endif
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sr_dtype { SR_F32 = 0, SR_F64 = 1, SR_I64 = 2 } sr_dtype;

/* Largest ndim of a tensor (and of a tensor descriptor in a message). */
#define SR_MAX_DIMS 8

/* Factory flag: the new tensor is a leaf that requires grad (f32/f64 only). */
#define SR_REQUIRES_GRAD 1u

typedef struct sr_tensor sr_tensor;

/* "f32", "f64", "i64"; "?" for a bad value. */
SR_API const char *sr_dtype_name(sr_dtype dt);
/* Bytes per element; 0 for a bad value. */
SR_API size_t sr_dtype_size(sr_dtype dt);

/* ---- factories: NULL on error (bad dtype, ndim, negative size, -ENOMEM) ---- */
SR_API sr_tensor *sr_empty(sr_dtype dt, int ndim, const int64_t *shape, unsigned flags);
SR_API sr_tensor *sr_zeros(sr_dtype dt, int ndim, const int64_t *shape, unsigned flags);
SR_API sr_tensor *sr_ones(sr_dtype dt, int ndim, const int64_t *shape, unsigned flags);
SR_API sr_tensor *sr_full(sr_dtype dt, int ndim, const int64_t *shape, double value, unsigned flags);
/* Uniform in [0, 1) (f32/f64). */
SR_API sr_tensor *sr_rand(sr_dtype dt, int ndim, const int64_t *shape, unsigned flags);
/* Standard normal (f32/f64). */
SR_API sr_tensor *sr_randn(sr_dtype dt, int ndim, const int64_t *shape, unsigned flags);
/* 1-D [start, start+step, ...) below end (above, for step < 0), like torch.arange. */
SR_API sr_tensor *sr_arange(sr_dtype dt, double start, double end, double step, unsigned flags);
/* n x m identity (m < 0: n x n). */
SR_API sr_tensor *sr_eye(sr_dtype dt, int64_t n, int64_t m, unsigned flags);
/* A copy of numel elements of dt, row-major, read from data. */
SR_API sr_tensor *sr_from_data(sr_dtype dt, int ndim, const int64_t *shape, const void *data, unsigned flags);
/* A 0-d tensor holding v. */
SR_API sr_tensor *sr_scalar_tensor(sr_dtype dt, double v, unsigned flags);
SR_API sr_tensor *sr_zeros_like(const sr_tensor *t);
SR_API sr_tensor *sr_ones_like(const sr_tensor *t);

/* The random generator is one per process (like torch.manual_seed), guarded
 * by a mutex; its default seed is fixed, so runs are reproducible. Workers
 * forked from one parent inherit the same state: seed each with its rank.
 * The streams differ from PyTorch's (xoshiro256** here). */
SR_API void sr_manual_seed(uint64_t seed);

/* ---- references and accessors ----
 * A NULL tensor is -EINVAL in sr_last_error(), never a crash: ndim gives
 * -EINVAL, dtype (sr_dtype)-1, shape/strides/data NULL, size -1, numel 0,
 * is_contiguous false. */
SR_API sr_tensor *sr_tensor_ref(sr_tensor *t);
SR_API void sr_tensor_unref(sr_tensor *t); /* NULL is ignored */
SR_API sr_dtype sr_tensor_dtype(const sr_tensor *t);
SR_API int sr_tensor_ndim(const sr_tensor *t);
SR_API const int64_t *sr_tensor_shape(const sr_tensor *t);
SR_API const int64_t *sr_tensor_strides(const sr_tensor *t); /* in elements */
/* Size of dim (negative counts from the end); -1 with an error if out of range. */
SR_API int64_t sr_tensor_size(const sr_tensor *t, int dim);
SR_API size_t sr_tensor_numel(const sr_tensor *t);
SR_API bool sr_tensor_is_contiguous(const sr_tensor *t);
/* Address of element [0, ..., 0]; read-only (writes would bypass copy-on-write). */
SR_API const void *sr_tensor_data(const sr_tensor *t);
/* The same address after making the storage private (copy-on-write), so the
 * caller may write. NULL with -ENOMEM. The writes through it are not covered
 * by the write lock (see "Threads"). */
SR_API void *sr_tensor_mutable_data(sr_tensor *t);
/* The value of a one-element tensor as a double; NaN with an error otherwise. */
SR_API double sr_tensor_item(const sr_tensor *t);
/* Copy all elements out in row-major order as doubles (any dtype, any
 * strides). -EINVAL if n < numel. */
SR_API int sr_tensor_to_f64(const sr_tensor *t, double *dst, size_t n);
/* Shared-storage test: true when both view the same storage. */
SR_API bool sr_tensor_shares_storage(const sr_tensor *a, const sr_tensor *b);

/* ---- in-place writes: all go through copy-on-write; 0 or -errno ----
 * Errors: -EINVAL on shape/dtype mismatch; -EPERM on a leaf that requires
 * grad while grad mode is enabled, or on a non-leaf that requires grad (the
 * engine does not rebase history). */
SR_API int sr_fill_(sr_tensor *t, double value);
SR_API int sr_zero_(sr_tensor *t);
SR_API int sr_copy_(sr_tensor *dst, const sr_tensor *src);          /* src broadcast to dst */
SR_API int sr_add_(sr_tensor *t, const sr_tensor *other, double alpha); /* t += alpha * other */
SR_API int sr_mul_(sr_tensor *t, const sr_tensor *other);
SR_API int sr_add_scalar_(sr_tensor *t, double s);
SR_API int sr_mul_scalar_(sr_tensor *t, double s);
SR_API int sr_addcmul_(sr_tensor *t, const sr_tensor *a, const sr_tensor *b, double value); /* t += value*a*b */
SR_API int sr_addcdiv_(sr_tensor *t, const sr_tensor *a, const sr_tensor *b, double value); /* t += value*a/b */

/* ---- elementwise maths, with full NumPy broadcasting ---- */
SR_API sr_tensor *sr_add(sr_tensor *a, sr_tensor *b);
SR_API sr_tensor *sr_sub(sr_tensor *a, sr_tensor *b);
SR_API sr_tensor *sr_mul(sr_tensor *a, sr_tensor *b);
SR_API sr_tensor *sr_div(sr_tensor *a, sr_tensor *b);
SR_API sr_tensor *sr_pow(sr_tensor *a, sr_tensor *b);
SR_API sr_tensor *sr_neg(sr_tensor *a);
SR_API sr_tensor *sr_add_scalar(sr_tensor *a, double s);
SR_API sr_tensor *sr_sub_scalar(sr_tensor *a, double s);
SR_API sr_tensor *sr_mul_scalar(sr_tensor *a, double s);
SR_API sr_tensor *sr_div_scalar(sr_tensor *a, double s);
SR_API sr_tensor *sr_pow_scalar(sr_tensor *a, double exponent);
SR_API sr_tensor *sr_exp(sr_tensor *a);
SR_API sr_tensor *sr_log(sr_tensor *a);
SR_API sr_tensor *sr_sin(sr_tensor *a);
SR_API sr_tensor *sr_cos(sr_tensor *a);
SR_API sr_tensor *sr_tanh(sr_tensor *a);
SR_API sr_tensor *sr_relu(sr_tensor *a);
SR_API sr_tensor *sr_sigmoid(sr_tensor *a);
SR_API sr_tensor *sr_sqrt(sr_tensor *a);

/* ---- linear algebra (f32/f64) ----
 * sr_matmul follows torch.matmul: 1-D x 1-D is a dot product (0-d result),
 * 2-D x 2-D is mm, a 1-D operand is promoted to a matrix and the added dim
 * removed afterwards, and operands of 3 or more dims are batches of matrices
 * whose batch dims broadcast. Uses cblas_?gemm when built with OpenBLAS, a
 * cache-blocked loop otherwise; sr_matmul_backend() names which.
 * OpenBLAS's thread count is set once, before shmrpc's first BLAS call, as
 * SHMRPC_BLAS_THREADS says: unset, 1 (each worker is one compute thread)
 * unless OPENBLAS_NUM_THREADS is set; n, n threads; "keep", never set by
 * shmrpc (the host application's own setting stands). */
SR_API sr_tensor *sr_matmul(sr_tensor *a, sr_tensor *b);
SR_API sr_tensor *sr_mm(sr_tensor *a, sr_tensor *b);   /* [n,k] x [k,m] */
SR_API sr_tensor *sr_bmm(sr_tensor *a, sr_tensor *b);  /* [b,n,k] x [b,k,m] */
SR_API const char *sr_matmul_backend(void);            /* "openblas" or "blocked" */

/* ---- reductions ---- */
SR_API sr_tensor *sr_sum(sr_tensor *a);                             /* all dims: 0-d */
SR_API sr_tensor *sr_sum_dim(sr_tensor *a, int dim, bool keepdim);
SR_API sr_tensor *sr_mean(sr_tensor *a);                            /* f32/f64 */
SR_API sr_tensor *sr_mean_dim(sr_tensor *a, int dim, bool keepdim);

/* ---- shape ops (views unless noted). A dim may be negative (from the end);
 * one entry of a shape may be -1 (inferred). ---- */
SR_API sr_tensor *sr_view(sr_tensor *a, int ndim, const int64_t *shape);    /* error if strides forbid */
SR_API sr_tensor *sr_reshape(sr_tensor *a, int ndim, const int64_t *shape); /* view, or a copy */
SR_API sr_tensor *sr_transpose(sr_tensor *a, int dim0, int dim1);
SR_API sr_tensor *sr_t(sr_tensor *a);                                       /* ndim <= 2 */
SR_API sr_tensor *sr_permute(sr_tensor *a, const int *dims);                /* ndim entries */
SR_API sr_tensor *sr_narrow(sr_tensor *a, int dim, int64_t start, int64_t length);
SR_API sr_tensor *sr_squeeze(sr_tensor *a, int dim);  /* no-op view if that dim is not 1 */
SR_API sr_tensor *sr_unsqueeze(sr_tensor *a, int dim);
SR_API sr_tensor *sr_expand(sr_tensor *a, int ndim, const int64_t *shape); /* -1 keeps a dim */
SR_API sr_tensor *sr_clone(sr_tensor *a);       /* always a contiguous copy */
SR_API sr_tensor *sr_contiguous(sr_tensor *a);  /* a itself (new ref) if contiguous, else a copy */
SR_API sr_tensor *sr_detach(sr_tensor *a);      /* shares storage, no history, no grad */
/* Copies: n >= 1 tensors of one dtype; cat needs equal shapes but along dim,
 * stack needs equal shapes and inserts dim. */
SR_API sr_tensor *sr_cat(sr_tensor *const *ts, size_t n, int dim);
SR_API sr_tensor *sr_stack(sr_tensor *const *ts, size_t n, int dim);
/* Views of consecutive pieces along dim, like torch.split/chunk. out == NULL
 * only counts. Returns the number of pieces (written to out[0..n-1], each a
 * new reference), or -errno. split: pieces of split_size (the last may be
 * smaller). chunk: ceil(size/chunks) per piece, so fewer than `chunks`
 * pieces may come back, as in PyTorch. */
SR_API int sr_split(sr_tensor *a, int64_t split_size, int dim, sr_tensor **out);
SR_API int sr_chunk(sr_tensor *a, int chunks, int dim, sr_tensor **out);

/* ---- neural-network functions ---- */
SR_API sr_tensor *sr_mse_loss(sr_tensor *input, sr_tensor *target); /* mean reduction, same shapes */
SR_API sr_tensor *sr_log_softmax(sr_tensor *a, int dim);
SR_API sr_tensor *sr_softmax(sr_tensor *a, int dim);
/* logp [N, C] with i64 target [N], or [C] with a 0-d target; mean over the
 * targets that are not -100 (PyTorch's default ignore_index). */
SR_API sr_tensor *sr_nll_loss(sr_tensor *logp, sr_tensor *target);
SR_API sr_tensor *sr_cross_entropy(sr_tensor *logits, sr_tensor *target);

/* ---- convolution layers (torch.nn.functional), f32/f64, with backward ----
 * Inputs are batches [N, C, H, W] (4-D only); the pair arguments are
 * (height, width) and NULL means PyTorch's default. Errors name the op and
 * the bad shape or value ("sr_conv2d: input [2, 3, 5, 5] and weight
 * [4, 2, 3, 3] with groups 1: ..."). */
/* torch.nn.functional.conv2d: weight [O, C/groups, kH, kW], bias [O] or
 * NULL; stride (NULL: 1, 1), padding (NULL: 0, 0, zeros), dilation (NULL:
 * 1, 1), groups >= 1 dividing C and O. Out [N, O, OH, OW] with OH = (H + 2
 * padding - dilation (kH - 1) - 1) / stride + 1. Computed as im2col and one
 * gemm per sample and group (BLAS when built with it), and so is backward
 * (docs/TENSORS.md, "Convolution layers"). */
SR_API sr_tensor *sr_conv2d(sr_tensor *x, sr_tensor *weight, sr_tensor *bias, const int64_t *stride,
                            const int64_t *padding, const int64_t *dilation, int64_t groups);
/* max_pool2d / avg_pool2d: kernel (kH, kW) required; stride NULL: the
 * kernel; padding NULL: 0, at most half the kernel. Floor mode, no dilation.
 * max keeps the argmax (first on ties, a NaN wins) for backward; avg counts
 * the padding in the divisor (count_include_pad=True). */
SR_API sr_tensor *sr_max_pool2d(sr_tensor *x, const int64_t *kernel, const int64_t *stride, const int64_t *padding);
SR_API sr_tensor *sr_avg_pool2d(sr_tensor *x, const int64_t *kernel, const int64_t *stride, const int64_t *padding);
/* torch.flatten: dims start_dim..end_dim (negative from the end) merged into
 * one; a view when strides allow (sr_reshape), any dtype. */
SR_API sr_tensor *sr_flatten(sr_tensor *x, int start_dim, int end_dim);
/* torch.nn.functional.layer_norm: normalises over the last ndim dims, which
 * must equal normalized_shape, with the biased variance and eps (PyTorch:
 * 1e-5); then * weight and + bias (each of normalized_shape, or NULL). */
SR_API sr_tensor *sr_layer_norm(sr_tensor *x, int ndim, const int64_t *normalized_shape, sr_tensor *weight,
                                sr_tensor *bias, double eps);

/* ---- local autograd ----
 * A tensor that requires grad records the op that made it (its grad_fn);
 * sr_backward walks that graph from the roots and accumulates gradients into
 * the .grad of the leaves. See docs/TENSORS.md. User-defined functions
 * (torch.autograd.Function) are in autograd_function.h. */
SR_API bool sr_tensor_requires_grad(const sr_tensor *t);
/* Leaves only ("you can only change requires_grad flags of leaf
 * variables"), floating dtypes only. */
SR_API int sr_tensor_set_requires_grad(sr_tensor *t, bool requires_grad);
SR_API bool sr_tensor_is_leaf(const sr_tensor *t);
/* Name of the node that made t ("MulBackward0", ...), NULL for a leaf. */
SR_API const char *sr_tensor_grad_fn_name(const sr_tensor *t);
/* Borrowed: the accumulated gradient, or NULL. Valid until the next
 * backward, sr_tensor_set_grad or unref of t; sr_tensor_ref it to keep it. */
SR_API sr_tensor *sr_tensor_grad(const sr_tensor *t);
/* Replace .grad (NULL clears it, like zero_grad(set_to_none=True)). grad is
 * borrowed: t takes its own reference; the old .grad is released. */
SR_API int sr_tensor_set_grad(sr_tensor *t, sr_tensor *grad);

/* Gradient hook: sees the gradient flowing into t (for a leaf: the total,
 * before it is accumulated). Store a new reference in *replace to replace the
 * gradient (the hook keeps ownership of nothing else): it must have the
 * gradient's shape and dtype, else the pass fails with -EINVAL ("hook N on
 * ... has changed the size of value"); leave it NULL to keep it. A non-zero
 * return aborts the backward pass with that error. */
typedef int (*sr_tensor_hook_fn)(sr_tensor *grad, sr_tensor **replace, void *arg);
/* t must require grad. Hooks run in registration order. arg must outlive t's
 * graph. Returns 0 or -EINVAL. */
SR_API int sr_tensor_register_hook(sr_tensor *t, sr_tensor_hook_fn fn, void *arg);

/* Backward from one scalar root (implicit gradient 1). Errors (-EINVAL or
 * -EPERM), with PyTorch's texts:
 *   "grad can be implicitly created only for scalar outputs"
 *   "element 0 of tensors does not require grad and does not have a grad_fn"
 *   "Trying to backward through the graph a second time ..." (saved tensors
 *     were freed by an earlier backward without retain_graph)
 * Saved tensors keep their forward values (see "Saved tensors" above), so
 * PyTorch's "modified by an inplace operation" error does not exist here. */
SR_API int sr_backward(sr_tensor *root, bool retain_graph);
/* Backward from n roots at once (each node runs once, after all its
 * gradients arrived). grad_roots: NULL (every root scalar, gradient 1) or n
 * tensors of the roots' shapes and dtypes (a NULL entry means 1 for a scalar
 * root). */
SR_API int sr_backward_multi(sr_tensor *const *roots, sr_tensor *const *grad_roots, size_t n, bool retain_graph);

/* Grad mode, per thread (torch.no_grad). Ops run with it disabled record no
 * history. sr_no_grad_enter() disables it and returns the previous mode for
 * sr_no_grad_exit(). */
SR_API bool sr_is_grad_enabled(void);
SR_API bool sr_set_grad_enabled(bool enabled); /* returns the previous mode */
SR_API bool sr_no_grad_enter(void);
SR_API void sr_no_grad_exit(bool previous);

#ifdef __cplusplus
}
#endif
#endif
