/* SPDX-License-Identifier: MIT */
/* The processes a job's workers leave behind.
 *
 * A worker may start processes of its own (a helper it forks, a command it
 * execs) and exit without ending them. Such a process would outlive the job,
 * and one forked from a worker after it attached keeps the segment mapped,
 * so its memory would not be freed either (docs/LAUNCHER.md, "Why no
 * segment can be left behind"). shmrun is therefore the child subreaper of
 * its job: a process whose parent exits is reparented to shmrun rather than
 * to init, however deep it was. When every worker has been reaped, what is
 * left of the job is exactly shmrun's remaining children: sweep_leftovers
 * ends them, SIGTERM first, SIGKILL after the grace period, and reaps them
 * (and what they leave in turn), with a bound on every wait.
 */
#ifndef SR_LAUNCHER_SWEEP_H
#define SR_LAUNCHER_SWEEP_H

#include <stdint.h>

/* Become the subreaper of every process started below us. 0 or -errno. */
int sweep_become_subreaper(void);

/* End and reap every child left (the workers must all be reaped already).
 * grace_ns: how long SIGTERM has before SIGKILL; a signal read from sigfd
 * (shmrun's forwarded ones: a user's Ctrl-C) ends it at once. Says on stderr which
 * processes were left (a warning), or which could not be ended (an error).
 * Returns how many were left behind (0: none), or -ETIMEDOUT when some
 * survived SIGKILL for 10 s. */
int sweep_leftovers(int64_t grace_ns, int sigfd);

#endif
