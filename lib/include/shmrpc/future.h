/* SPDX-License-Identifier: MIT */
/* shmrpc: futures (torch.futures.Future).
 *
 * A future completes exactly once, with a value or with an error (an -errno
 * or -SR_E* code plus a message). sr_future_wait() re-raises a stored error
 * every time it is called: it returns the code and sets sr_last_error() to
 * the message.
 *
 * Callbacks (then, add_done_callback) run exactly once, in the order they were
 * added, on the thread that completes the future, or at once on the calling
 * thread if the future is already complete. If a call that takes a callback
 * returns an error, the callback is never called.
 *
 * Lifetime: futures are refcounted. A function that hands a future back
 * through **out gives the caller one reference; sr_future_unref() drops it.
 * A pending future stays alive while the runtime still has to complete it.
 * Completing a future (set_result, set_error) needs a reference held until
 * the call returns: the caller's own, or one its owner keeps until it sees
 * the future done (a waiter). Completion never touches the future after the
 * point where such a waiter may drop the last reference.
 */
#ifndef SHMRPC_FUTURE_H
#define SHMRPC_FUTURE_H

#if defined(SR__BUILDING) && !defined(SR__SEES_RPC)
#error "shmrpc/future.h belongs to the RPC core (rpc) layer, which this layer sits below (docs/ARCHITECTURE.md)"
#endif
#include <stdbool.h>
#include <stddef.h>

#include "error.h"
#include "value.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sr_future sr_future;

/* A new pending future (one reference), or NULL on -ENOMEM. */
SR_API sr_future *sr_future_new(void);
SR_API sr_future *sr_future_ref(sr_future *f);
SR_API void sr_future_unref(sr_future *f);

SR_API bool sr_future_done(const sr_future *f);

/* Block until complete. 0 with *out = a new reference to the value (out may
 * be NULL), or the stored error code with its message in sr_last_error().
 * On a thread of an initialised worker, a wait for a future that is not an
 * RPC call's own (one sr_rpc_async gave) may run the worker's incoming plain
 * calls on this thread meanwhile, as an executor would (docs/API.md,
 * "Serving while waiting"). */
SR_API int sr_future_wait(sr_future *f, sr_value **out);

/* Non-blocking: as wait if complete, else -EAGAIN. */
SR_API int sr_future_value(sr_future *f, sr_value **out);

/* The code behind a completed future's error: its error code, except for
 * -SR_EREMOTE, where it is the remote function's own -errno (e.g. -ENOSPC
 * for a function that failed with sr_call_fail(c, -ENOSPC, ...)). 0 if the
 * future holds a value; -EAGAIN if it is not complete; -EINVAL if f is NULL.
 * sr_future_wait() sets the same code in sr_last_error_code(). */
SR_API int sr_future_error_code(const sr_future *f);

/* Complete with a value (the future takes its own reference) or an error.
 * A second completion is -EALREADY ("Future can only be marked completed
 * once"). err must be negative. */
SR_API int sr_future_set_result(sr_future *f, sr_value *v);
SR_API int sr_future_set_error(sr_future *f, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* then: cb(parent, arg, &result) runs when f completes; it returns 0 with a
 * new reference in *result, or an error code (its message is taken from
 * sr_last_error(), e.g. set with sr_errorf). The child future (*out) gets the
 * result or the error. -EINVAL if cb is NULL. */
typedef int (*sr_then_fn)(sr_future *parent, void *arg, sr_value **result);
SR_API int sr_future_then(sr_future *f, sr_then_fn cb, void *arg, sr_future **out);

/* cb(f, arg) runs once when f completes; it cannot fail anything. */
SR_API int sr_future_add_done_callback(sr_future *f, void (*cb)(sr_future *f, void *arg), void *arg);

/* Wait for all: 0 with *out = a list of the n values, or the first error to
 * occur, as soon as it occurs, without waiting for the rest. */
SR_API int sr_future_wait_all(sr_future *const *fs, size_t n, sr_value **out);

#ifdef __cplusplus
}
#endif
#endif
