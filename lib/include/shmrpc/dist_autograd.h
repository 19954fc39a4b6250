/* SPDX-License-Identifier: MIT */
/* shmrpc: distributed autograd (torch.distributed.autograd), FAST mode.
 *
 * A context collects one training step's distributed graph. Inside a
 * context, an RPC whose arguments hold tensors that require grad (and every
 * user-function call, remote() and to_here(), whatever its arguments)
 * records a SendRpcBackward on the sender and a RecvRpcBackward on the
 * receiver; responses do the same in the other direction. The receiver's
 * context is created lazily under the same id, and the function runs with
 * that context current, so nested calls propagate it. docs/DIST_AUTOGRAD.md
 * has the message flow.
 *
 * Ids: context ids and autograd message ids are rank << 48 | counter; running
 * out of counter values is -EOVERFLOW, never a wrap.
 *
 * Threads: the current context is per thread. Every call may be made from
 * any thread; concurrent backward passes in different contexts run in
 * parallel. One pass at a time per context: a second pass rooted in a
 * context while one runs there is -EBUSY.
 *
 * Lifetime: sr_dist_autograd_context_begin() makes a context current on the
 * calling thread; sr_dist_autograd_context_end() releases it here and sends a
 * cleanup to every worker it knows, which forward it to theirs. Gradients
 * handed out by sr_dist_autograd_get_gradients() are new references and stay
 * valid after the context ends. Contexts still alive at sr_shutdown() are
 * released.
 *
 * Errors are -errno with the detail in sr_last_error(), PyTorch's texts:
 *   -EINVAL   "Could not find autograd context with id: N"
 *             "Already have an autograd context id for this thread"
 *             "No tensors provided for gradient computation"
 *             "requires_grad not set on root N" / "is not a scalar, all roots
 *             need to be scalar" / "does not have a valid gradient function"
 *   -SR_EREMOTE  a worker failed during backward: "Error on Node N: ..."
 *   -EPIPE    a worker involved in the pass died
 *   -EDEADLK  a send function of the calling worker can never receive its
 *             gradient: every worker involved has finished and the output of
 *             that RPC was not used by any root (FAST mode's known limit,
 *             where PyTorch hangs); the text names the call (function,
 *             destination, message id)
 *   -ETIMEDOUT  the pass ran past the RPC timeout
 *   -EBUSY    a backward pass is already running in this context
 *   -EOVERFLOW  out of context or message ids
 *   -SR_ESHUTDOWN  RPC is not initialised
 */
#ifndef SHMRPC_DIST_AUTOGRAD_H
#define SHMRPC_DIST_AUTOGRAD_H

#if defined(SR__BUILDING) && !defined(SR__SEES_DIST_AUTOGRAD)
#error "shmrpc/dist_autograd.h belongs to the dist_autograd module layer, which this layer sits below (docs/ARCHITECTURE.md)"
#endif
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "rref.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The "no context" id (PyTorch's -1). */
#define SR_NO_CONTEXT INT64_C(-1)

/* Begin a context and make it current on this thread (-EINVAL if one is
 * already current: "Already have an autograd context id for this thread"). */
SR_API int sr_dist_autograd_context_begin(int64_t *context_id);
/* Release the context here (making none current if it was this thread's)
 * and send a cleanup to every known worker. -EINVAL for an unknown id. */
SR_API int sr_dist_autograd_context_end(int64_t context_id);
/* This thread's current context id, or SR_NO_CONTEXT. */
SR_API int64_t sr_dist_autograd_current_context(void);
/* True if a context with this id exists on this worker. */
SR_API bool sr_dist_autograd_is_valid_context(int64_t context_id);
/* The largest id this worker may give: (2^48 - 1) + (rank << 48). */
SR_API int64_t sr_dist_autograd_max_id(void);

/* Run a distributed backward pass from n scalar roots (gradient 1 each).
 * Gradients accumulate in the context, never in .grad; retain_graph keeps
 * the graph for another pass, and passes accumulate. Returns when every
 * worker involved has finished. */
SR_API int sr_dist_autograd_backward(int64_t context_id, sr_tensor *const *roots, size_t n, bool retain_graph);

/* The gradients accumulated in the context for this worker's leaves:
 * *n pairs, (*tensors)[i] -> (*grads)[i], new references in malloc'd arrays;
 * free them with sr_dist_autograd_gradients_free(). */
SR_API int sr_dist_autograd_get_gradients(int64_t context_id, size_t *n, sr_tensor ***tensors, sr_tensor ***grads);
SR_API void sr_dist_autograd_gradients_free(size_t n, sr_tensor **tensors, sr_tensor **grads);
/* The gradient for one leaf (a new reference), or NULL with -ENOENT. */
SR_API int sr_dist_autograd_get_gradient(int64_t context_id, const sr_tensor *leaf, sr_tensor **grad);

/* ---- introspection (PyTorch's DistAutogradContext internals) ---- */

/* The workers this context has sent to or received from, ascending; *n
 * gets the count even if it exceeds cap. */
SR_API int sr_dist_autograd_known_workers(int64_t context_id, int *ranks, size_t cap, size_t *n);

/* One send or recv function of a context. */
typedef struct sr_dist_fn_info {
    int64_t message_id;
    int peer;                  /* the other side of the RPC */
    uint32_t num_next;         /* next edges (send: one per tensor that requires grad) */
    const char *next_names[8]; /* the first next functions' names (NULL: no gradient), static strings */
} sr_dist_fn_info;
/* The context's send (send = true) or recv functions, by message id
 * ascending; *n gets the count even if it exceeds cap. */
SR_API int sr_dist_autograd_functions(int64_t context_id, bool send, sr_dist_fn_info *out, size_t cap, size_t *n);

typedef struct sr_dist_autograd_debug_info {
    uint64_t num_current_backward_passes;
    uint64_t num_autograd_contexts;
} sr_dist_autograd_debug_info;
SR_API int sr_dist_autograd_debug_info_get(sr_dist_autograd_debug_info *out);

/* ---- RRef.backward ---- */

/* The RRef's value must be a scalar tensor ("RRef should contain a tensor
 * for .backward()"). With a context id: a distributed backward run on the
 * owner in that context. With SR_NO_CONTEXT: a local backward into .grad, on
 * the owner only ("User RRefs require 'dist_autograd_ctx_id' to be
 * specified"). */
SR_API int sr_rref_backward(sr_rref *r, int64_t context_id, bool retain_graph);

#ifdef __cplusplus
}
#endif

#endif
