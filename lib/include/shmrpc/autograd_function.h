/* SPDX-License-Identifier: MIT */
/* shmrpc: user-defined autograd functions, the counterpart of PyTorch's
 * torch.autograd.Function (docs/TENSORS.md, "Custom autograd functions").
 *
 * A definition names the function and gives its forward and backward:
 *
 *   static int cube_fwd(sr_function_ctx *ctx, sr_tensor *const *in, size_t n, sr_tensor **out, size_t nout)
 *   {
 *       sr_function_ctx_save_for_backward(ctx, in, 1);
 *       out[0] = sr_pow_scalar(in[0], 3);
 *       return out[0] ? 0 : -EINVAL;
 *   }
 *   static int cube_bwd(sr_function_ctx *ctx, sr_tensor *const *gout, size_t nout, sr_tensor **gin, size_t n)
 *   {
 *       sr_tensor *x;
 *       int rc = sr_function_ctx_saved(ctx, 0, &x);   // a new reference
 *       ...gin[0] = 3 x^2 * gout[0] (a new reference)...
 *       sr_tensor_unref(x);
 *   }
 *   static const sr_autograd_function cube = {"Cube", cube_fwd, cube_bwd, NULL};
 *   sr_tensor *y;
 *   sr_function_apply(&cube, &x, 1, &y, 1);    // y's grad_fn is "CubeBackward"
 *
 * Semantics (as PyTorch unless said):
 *   - forward runs with grad mode off, once per sr_function_apply, on the
 *     caller's thread. When grad mode is on and an input requires grad, the
 *     floating-point outputs that are not marked non-differentiable get one
 *     node named "<name>Backward" as their grad_fn; else nothing is recorded
 *     (what forward saved is dropped when it returns; backward never runs).
 *   - backward runs inside a backward pass (local, or distributed on the
 *     worker that ran the forward), with grad mode off, under the pass's
 *     lock: it must not start a backward pass itself. Two passes over a
 *     graph kept with retain_graph may run it at once on two threads: it
 *     must treat the context as read-only. grad_outputs[i] is the
 *     gradient of output i; an output that received none (unused, or
 *     non-differentiable) gets zeros of its shape, or NULL after
 *     sr_function_ctx_set_materialize_grads(ctx, false).
 *   - what backward returns is checked: a gradient for input i must have
 *     input i's dtype and shape ("Function CubeBackward returned an invalid
 *     gradient at index 0 - got [3] but expected shape compatible with
 *     [2, 3]"); a gradient for an input that was not a tensor (NULL) is an
 *     error; one for a tensor input that needs no gradient is dropped.
 *     Errors are -EINVAL naming "<name>Backward" and the index.
 *   - custom functions are once differentiable (PyTorch's
 *     @once_differentiable): the engine has no create_graph, and a
 *     gradient returned with history (backward re-enabled grad mode) is
 *     refused with -EPERM, "trying to differentiate twice a function that
 *     was marked with @once_differentiable".
 *   - saved tensors follow the tree's rule (docs/TENSORS.md, "In-place
 *     writes and saved tensors"): a saved tensor is a snapshot of the values
 *     it had when saved, so an in-place write to it before backward leaves
 *     the gradient exact for the forward instead of failing with PyTorch's
 *     "modified by an inplace operation". After a backward without
 *     retain_graph they are freed, and a second pass fails with PyTorch's
 *     "Trying to backward through the graph a second time" naming the node.
 *   - an output that is one of the inputs (or any tensor that already has
 *     history or requires grad) is returned as a new view of it, as PyTorch
 *     does for an input returned unmodified; in-place forwards (mark_dirty)
 *     are not supported, since the engine does not rebase history.
 *
 * Errors of forward and backward: a non-zero return aborts the apply (or
 * the pass) with that code; sr_last_error() then reads "...: Cube: forward
 * failed (-33): <the detail forward left>" or "...: CubeBackward: backward
 * failed (-33): <detail>". A callback that succeeds leaves the thread's
 * last error as it was.
 *
 * Ownership. sr_function_apply borrows the inputs and stores nout new
 * references in outputs (all NULL on failure). forward stores new references
 * in out[] (apply takes them over, also on failure); backward stores new
 * references in gin[] (the engine takes them over). grad_outputs are
 * borrowed, valid during the callback; sr_function_ctx_saved hands out a
 * new reference, as every out-pointer does. The definition, and what
 * its `user` points to, must outlive every graph recorded with it. The
 * context is valid only during forward and backward.
 */
#ifndef SHMRPC_AUTOGRAD_FUNCTION_H
#define SHMRPC_AUTOGRAD_FUNCTION_H

#if defined(SR__BUILDING) && !defined(SR__SEES_TENSOR)
#error "shmrpc/autograd_function.h belongs to the tensor layer, which this layer sits below (docs/ARCHITECTURE.md)"
#endif
#include <stdbool.h>
#include <stddef.h>

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sr_function_ctx sr_function_ctx;

/* Longest name of a definition (its node is "<name>Backward"). */
#define SR_FUNCTION_NAME_MAX 63

typedef struct sr_autograd_function {
    const char *name; /* 1 to SR_FUNCTION_NAME_MAX characters */
    /* in[0..n) borrowed (NULL entries are non-tensor inputs); store a new
     * reference in each out[0..nout). 0 or -errno. */
    int (*forward)(sr_function_ctx *ctx, sr_tensor *const *in, size_t n, sr_tensor **out, size_t nout);
    /* gout[0..nout) borrowed; gin[0..n) all NULL on entry: store a new
     * reference for each input that needs one (NULL: no gradient). 0 or
     * -errno. */
    int (*backward)(sr_function_ctx *ctx, sr_tensor *const *gout, size_t nout, sr_tensor **gin, size_t n);
    void *user; /* for the callbacks: sr_function_ctx_user() */
} sr_autograd_function;

/* Run def on inputs[0..n) into outputs[0..nout) (nout >= 1) and record its
 * node (see above). 0 or -errno: -EINVAL for a bad definition or argument,
 * a forward that left an output NULL, or a non-zero return of forward. */
SR_API int sr_function_apply(const sr_autograd_function *def, sr_tensor *const *inputs, size_t n,
                             sr_tensor **outputs, size_t nout);

/* ---- the context: in forward ---- */
/* Save ts[0..n) (NULL entries allowed) for backward, replacing what an
 * earlier call saved. -EPERM outside forward, -ENOMEM. */
SR_API int sr_function_ctx_save_for_backward(sr_function_ctx *ctx, sr_tensor *const *ts, size_t n);
/* Output i gets no gradient and does not require grad (indices, masks).
 * -EINVAL out of range, -EPERM outside forward. */
SR_API int sr_function_ctx_mark_non_differentiable(sr_function_ctx *ctx, size_t output);
/* false: backward gets NULL (not zeros) for outputs without a gradient. */
SR_API void sr_function_ctx_set_materialize_grads(sr_function_ctx *ctx, bool materialize);
/* Plain bytes for backward (ctx.k = ... in PyTorch): size zeroed bytes,
 * allocated on the first call of forward, the same block after (size must
 * not grow); in backward, the block forward allocated (size ignored; NULL
 * if none). Freed with the node; do not keep tensors in it. NULL on
 * -ENOMEM or -EINVAL. */
SR_API void *sr_function_ctx_state(sr_function_ctx *ctx, size_t size);

/* ---- the context: in forward and backward ---- */
/* Whether input i requires grad through this node (false when nothing is
 * recorded, for a NULL input, or i out of range). */
SR_API bool sr_function_ctx_needs_input_grad(const sr_function_ctx *ctx, size_t i);
/* Saved tensor i: a new reference (NULL where NULL was saved). -EINVAL out
 * of range; -EPERM when a backward without retain_graph freed it. */
SR_API int sr_function_ctx_saved(sr_function_ctx *ctx, size_t i, sr_tensor **out);
/* The old form, kept for one release: the same, but *out is borrowed. */
SR_API int sr_function_ctx_saved_tensor(sr_function_ctx *ctx, size_t i, sr_tensor **out)
    __attribute__((deprecated("use sr_function_ctx_saved, which hands out a new reference")));
SR_API size_t sr_function_ctx_num_saved(const sr_function_ctx *ctx);
/* The definition's `user`. */
SR_API void *sr_function_ctx_user(const sr_function_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif
