/* SPDX-License-Identifier: MIT */
/* Logging, internal side (the public half is shmrpc/log.h).
 *
 * The log identity (the "who" of each line) is set by the transport at
 * attach (sr__log_set_worker) and cleared at detach; launchers name their
 * role (sr__log_set_role). Identity changes happen while no other runtime
 * thread of the process runs (before the progress thread starts, after it
 * is joined); a user thread logging at that very moment may see the old or
 * the new name, never a torn one (see log.c). */
#ifndef SR_SHM_LOG_H
#define SR_SHM_LOG_H

#if !defined(SR__SEES_BASE)
#error "log.h is the seam of the base layer, for it and the layers above it only (docs/ARCHITECTURE.md)"
#endif
#include "shmrpc/log.h"

/* Lines written from now on say "<name> (rank R)"; name NULL: "worker<R>".
 * rank < 0: back to the role (or "pid N"). Both setters read
 * SHMRPC_LOG_LEVEL if no line did yet, so a bad value is reported at
 * sr_init (or at the launcher's start) even if nothing else is logged. */
void sr__log_set_worker(const char *name, int rank);
/* The process's role for lines written outside sr_init..sr_shutdown
 * ("shmrun"); NULL: "pid N" (the pid at the time of each line). */
void sr__log_set_role(const char *role);

/* Log an already formatted error text (sr_last_error()), without the
 * "worker<R>: " or "<role>: " it may start with: the line's prefix says it. */
void sr__log_text(sr_log_level level, const char *text);

/* A launcher, before it starts workers: a bad SHMRPC_LOG_LEVEL, which it
 * reported, is replaced in its environment by the name of the level in
 * force, so that no worker reports it again (one warning per job; without
 * a launcher, rank 0 reports it). */
void sr__log_pass_on(void);

/* Read SHMRPC_LOG_LEVEL again (tests); returns the level now in force. */
sr_log_level sr__log_reload(void);

#endif
