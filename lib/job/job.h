/* A job: the segment plus its N worker processes, and their supervision.
 * Shared by the shmrun launcher (fork + exec) and sr_spawn (fork only).
 *
 * Failure policy: the first worker that exits non-zero or is killed by a
 * signal takes the job down. Every other worker is sent SIGKILL at once, all
 * are reaped, and one report line is printed:
 *   "<who>: rank 2 (pid 4711) exited with status 3; stopped the other 3 workers"
 *   "<who>: rank 1 (pid 4710) was killed by signal SIGKILL; stopped the other 3 workers"
 * Workers carry PR_SET_PDEATHSIG(SIGKILL), so they also die with the launcher.
 * The segment is a memfd: it disappears with the last process holding it.
 *
 * Lifetime: sr__job_create .. sr__job_destroy; sr__job_supervise reaps every
 * worker before it returns.
 */
#ifndef SR_LIB_JOB_H
#define SR_LIB_JOB_H

#include <signal.h>
#include <stdint.h>
#include <sys/types.h>

#include "segment.h"

typedef struct sr_job {
    sr_segment seg;
    int n;
    pid_t *pids;      /* [n]; 0 once reaped */
    int *pidfds;      /* [n] */
    int *eventfds;    /* [n]: doorbell fallback fds, inherited by the workers */
    const char *who;  /* report prefix: "shmrun" or "sr_spawn" */
    sigset_t child_mask; /* signal mask the workers start with */
} sr_job;

/* Create the segment and one doorbell eventfd per rank. Errors: -EINVAL bad
 * options (see sr_segment_create) or SIGCHLD ignored (SIG_IGN/SA_NOCLDWAIT:
 * the kernel would reap the workers before the supervisor reads their
 * status); -ENOMEM; -errno of memfd/eventfd. On error nothing is left open. */
int sr__job_create(sr_job *job, const sr_segment_opts *o, const char *who);
void sr__job_destroy(sr_job *job);

/* Fork worker `rank`. In the child, run(job, rank, arg) is called after the
 * death signal is armed, the signal mask restored and the supervisor's
 * pidfds closed; it must not return (exec or _exit). If no pidfd can be
 * opened on the child, it is killed and reaped before the error returns. */
int sr__job_fork(sr_job *job, int rank, void (*run)(sr_job *, int, void *), void *arg);

/* SIGKILL and reap every worker still running; returns how many there were. */
int sr__job_stop(sr_job *job);

/* Wait for every worker. sigfd >= 0 is a signalfd whose signals are forwarded
 * to the live workers. Returns 0 when all exited 0; otherwise the exit code a
 * launcher should use (the status, or 128 + signal) after printing the report
 * and copying it to sr_last_error(). Negative: -errno of the supervisor itself. */
int sr__job_supervise(sr_job *job, int sigfd);

#endif
