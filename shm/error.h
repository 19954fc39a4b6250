/* Internal error helpers: record the detail behind a -errno return.
 * sr__fail(err, fn, fmt, ...) stores "worker<R>: fn: <message>" in the calling
 * thread's buffer (see sr_last_error()) and returns err, so a call site reads
 *   return sr__fail(-EINVAL, __func__, "rank %d is out of range", r);
 */
#ifndef SR_SHM_ERROR_H
#define SR_SHM_ERROR_H

#include "shmrpc/error.h"

int sr__fail(int err, const char *fn, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Replace the detail with an already formatted message. */
void sr__error_set_text(const char *msg);

/* The rank used in error prefixes; -1 (the default) prints no worker. */
void sr__error_set_rank(int rank);
/* This process's rank as set above, or -1. */
int sr__error_rank(void);

#endif
