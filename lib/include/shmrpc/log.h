/* SPDX-License-Identifier: MIT */
/* shmrpc: logging.
 *
 * Every line the runtime writes to stderr goes through sr_logf(): one line,
 * one write(2), so lines of different threads and processes never
 * interleave. Each line names who wrote it:
 *   "worker1 (rank 1): warning: dropped a message of unknown type 99 from worker0"
 *   "shmrun: rank 1 (pid 4242) was killed by signal SIGSEGV; stopped the other 1 worker"
 * A worker is "<name> (rank R)" between sr_init and sr_shutdown; before and
 * after, the process role ("shmrun") or "pid N". Errors carry no level word
 * (the "prog: message" convention); the other levels say "warning:",
 * "info:" or "debug:". A line longer than 1023 bytes is cut, ending "...".
 *
 * SHMRPC_LOG_LEVEL selects what is written: error, warn (the default),
 * info or debug (case-insensitive; "warning" is accepted for warn). Any other
 * value is reported once per job, as a warning (by shmrun, or by the worker
 * of rank 0 where no launcher reads it), and the default applies. The
 * variable is read once per process: at sr_init (a launcher: at its start)
 * or at the first log line, whichever comes first.
 */
#ifndef SHMRPC_LOG_H
#define SHMRPC_LOG_H

#if defined(SR__BUILDING) && !defined(SR__SEES_BASE)
#error "shmrpc/log.h belongs to the base layer, which this layer sits below (docs/ARCHITECTURE.md)"
#endif
#include <stdbool.h>

#include "error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sr_log_level {
    SR_LOG_ERROR = 0,
    SR_LOG_WARN = 1,
    SR_LOG_INFO = 2,
    SR_LOG_DEBUG = 3,
} sr_log_level;

/* Write one line at level (dropped if the level is filtered out). A level
 * outside the enum is treated as SR_LOG_ERROR. fmt must not end in '\n'. */
SR_API void sr_logf(sr_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Whether a line at level would be written (e.g. to skip building it). */
SR_API bool sr_log_enabled(sr_log_level level);

#ifdef __cplusplus
}
#endif
#endif
