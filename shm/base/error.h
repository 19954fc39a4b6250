/* SPDX-License-Identifier: MIT */
/* Internal error helpers: record the detail behind a -errno return.
 * sr__fail(err, fn, fmt, ...) stores "worker<R>: fn: <message>" in the calling
 * thread's buffer (see sr_last_error()) and returns err, so a call site reads
 *   return sr__fail(-EINVAL, __func__, "rank %d is out of range", r);
 */
#ifndef SR_SHM_ERROR_H
#define SR_SHM_ERROR_H

#if !defined(SR__SEES_BASE)
#error "error.h is the seam of the base layer, for it and the layers above it only (docs/ARCHITECTURE.md)"
#endif
#include "shmrpc/error.h"

int sr__fail(int err, const char *fn, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Replace the detail with an already formatted message (the code stays). */
void sr__error_set_text(const char *msg);
/* Replace the detail and its code (sr_last_error_code()): a re-raised error. */
void sr__error_set(int code, const char *msg);
/* The cause to pass on for a failure that returned rc: for -SR_EREMOTE, the
 * code behind this thread's last error when one is recorded (a function
 * forwarding a failed nested call keeps the innermost code); else rc. */
int sr__error_cause(int rc);

/* The rank used in error prefixes; -1 (the default) prints no worker. */
void sr__error_set_rank(int rank);
/* This process's rank as set above, or -1. */
int sr__error_rank(void);

#endif
