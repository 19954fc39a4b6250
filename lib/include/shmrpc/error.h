/* SPDX-License-Identifier: MIT */
/* shmrpc: error reporting.
 *
 * Every fallible call returns 0 (or a count) on success and -errno on failure.
 * The human detail of the most recent failure on the calling thread is kept in
 * a thread-local buffer: it names the worker, the function and the value, e.g.
 *   "worker2: sr_xport_send: destination rank 9 is out of range [0, 4)".
 *
 * Lifetime: the string returned by sr_last_error() belongs to the calling
 * thread and stays valid until that thread's next failing shmrpc call.
 */
#ifndef SHMRPC_ERROR_H
#define SHMRPC_ERROR_H

#if defined(SR__BUILDING) && !defined(SR__SEES_BASE)
#error "shmrpc/error.h belongs to the base layer, which this layer sits below (docs/ARCHITECTURE.md)"
#endif
/* The API returns -errno: the codes' names (EINVAL, ETIMEDOUT, ...) come with it. */
#include <errno.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define SR_API __attribute__((visibility("default")))
#else
#define SR_API
#endif

/* shmrpc's own error codes, returned negated like -errno values. */
#define SR_EBASE 10000
#define SR_EWORKER (SR_EBASE + 1) /* a worker of the job failed (exit status or signal) */
#define SR_EREMOTE (SR_EBASE + 2) /* the remote function failed; see sr_last_error() */
#define SR_ESHUTDOWN (SR_EBASE + 3) /* the runtime is not initialised or has shut down */
#define SR_EOWNERLOST (SR_EBASE + 4) /* an RRef's owner died: its value is lost (the message names the owner) */

/* Detail of the last failure on this thread; "" if none. Never NULL. */
SR_API const char *sr_last_error(void);

/* The error code behind sr_last_error(): the code the failing call returned,
 * except after -SR_EREMOTE, where it is the remote function's own code (the
 * -errno it failed with, e.g. -ENOSPC; -SR_EREMOTE itself only when the
 * callee gave none). 0 if nothing was recorded on this thread. Like the
 * text, it is set by every failing shmrpc call, and by sr_errorf(). */
SR_API int sr_last_error_code(void);

/* Record a failure's detail (for sr_last_error()) and return err, e.g. from
 * a then-callback: return sr_errorf(-EINVAL, "bad value %d", v); */
SR_API int sr_errorf(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* strerror() for -errno values; also covers shmrpc's own codes. */
SR_API const char *sr_strerror(int err);

#ifdef __cplusplus
}
#endif
#endif
