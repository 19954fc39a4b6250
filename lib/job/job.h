/* SPDX-License-Identifier: MIT */
/* A job: the segment plus its N worker processes, and their supervision.
 * Shared by the shmrun launcher (fork + exec) and sr_spawn (fork only).
 *
 * Failure policy: the first worker that exits non-zero or is killed by a
 * signal takes the job down, unless the job replaces ranks (segment.h,
 * "Replacement in place": job->replace_left > 0 and the segment's
 * SR_SEG_F_REPLACE). Then a worker killed by a signal once every worker
 * attached, and before it entered sr_shutdown (rank 0: before any did), is
 * replaced by a new process of its rank while the others run on, with one
 * line:
 *   "<who>: rank 1 (pid 4710) was killed by signal SIGKILL; replaced by pid 4720 (generation 1, replacement 1 of 3)"
 * A worker killed by a signal outside those times, while the budget is not
 * spent, restarts the whole job (Restarts, below). A worker that exits
 * non-zero, or dies once the budget is spent, takes the job down. Every other worker is sent SIGKILL at once, all
 * are reaped, and one report line is printed:
 *   "<who>: rank 2 (pid 4711) exited with status 3; stopped the other 3 workers"
 *   "<who>: rank 1 (pid 4710) was killed by signal SIGKILL; stopped the other 3 workers"
 * Workers carry PR_SET_PDEATHSIG(SIGKILL), so they also die with the launcher.
 * The segment is a memfd: it disappears with the last process holding it.
 *
 * Stopping on request (shmrun only: a sigfd is watched): after SIGTERM or
 * SIGINT is forwarded, exits no longer take the job down at once: every
 * worker gets the grace period (sr_job_hooks.grace_ns) from the first such
 * signal, then the survivors get SIGKILL and are named in one line:
 *   "shmrun: ranks 0,2 (pids 4709,4711) still running 10 s after SIGTERM: killed with SIGKILL"
 * and the first worker that failed meanwhile (if it was not one of those) in another:
 *   "shmrun: rank 1 (pid 4710) was killed by signal SIGTERM after shmrun forwarded SIGTERM"
 * Other forwarded signals (HUP, QUIT, USR1, USR2) change nothing.
 *
 * Restarts (sr__job_run; shmrun --max-restarts, sr_spawn_opts.max_restarts):
 * a worker killed by a signal (a crash, the OOM killer, a SIGKILL) while
 * restarts are left ends the attempt with, instead of the line above,
 *   "<who>: rank 2 (pid 4711) was killed by signal SIGKILL; restarting the job (restart 1 of 3)"
 * and the whole job starts again: every worker stopped and reaped, a fresh
 * segment, every rank forked anew. A job that replaces ranks does the same
 * with a death it cannot replace in place (inside sr_shutdown, before every
 * worker attached), saying why; its replacements and restarts share one
 * budget, max_restarts (job.spent carries it from attempt to attempt):
 *   "<who>: rank 2 (pid 4711) was killed by signal SIGKILL; not replaced in place (it died inside
 *    sr_shutdown): restarting the job (restart 1; 2 of 3 replacements and restarts spent)"
 * Not restarted: a worker that exits
 * non-zero (it chose to fail: the same input fails the same way again),
 * any failure during a requested stop (SIGTERM/SIGINT forwarded), and a
 * failure of the last attempt; those end the job as above.
 *
 * In every child, before run(): ranks > 0 get /dev/null as stdin (rank 0
 * keeps the launcher's, as mpirun does), and RANK, WORLD_SIZE, LOCAL_RANK
 * and LOCAL_WORLD_SIZE are set as torchrun sets them (one host: local = global),
 * and SHMRPC_RESTART_COUNT and TORCHELASTIC_RESTART_COUNT to the attempt's
 * number (0 on the first).
 *
 * Lifetime: sr__job_create .. sr__job_destroy; sr__job_supervise reaps every
 * worker before it returns.
 */
#ifndef SR_LIB_JOB_H
#define SR_LIB_JOB_H

#if !defined(SR__SEES_JOB)
#error "job.h is the seam of the job layer, for it and the layers above it only (docs/ARCHITECTURE.md)"
#endif
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "segment.h"

#define SR_JOIN_PENDING 8 /* join connections whose request may be awaited at once */

typedef struct sr_job {
    sr_segment seg;
    int n;
    pid_t *pids;      /* [n]; 0 once reaped */
    int *pidfds;      /* [n] */
    int *eventfds;    /* [n]: doorbell fallback fds, inherited by the workers */
    const char *who;  /* report prefix: "shmrun" or "sr_spawn" */
    sigset_t child_mask; /* signal mask the workers start with */
    int restart;      /* this attempt's number: 0 first, k after the k-th restart */
    int max_restarts; /* restarts and replacements allowed in all (sr__job_run) */
    int spent;        /* restarts and replacements of the attempts before this one (sr__job_run) */
    bool restart_due; /* set by the supervisor: the attempt ended in a failure that is restarted */
    /* Replacement in place (segment.h, SR_SEG_F_REPLACE): how many more
     * failed ranks may be replaced (0: none, the job ends as without the
     * policy), and what a replacement runs: the first sr__job_fork's. */
    int replace_left;
    int replaced;     /* replacements so far */
    void (*run)(struct sr_job *, int, void *);
    void *run_arg;
    /* Elastic jobs (segment.h, SR_SEG_F_ELASTIC; "Joining" below): the job
     * id (SHMRPC_JOB in every worker), the join socket (-1: none) and, per
     * rank, the connection of the shmrun --join that started its process
     * (-1: none), told how it ends. */
    char id[32];
    int listen_fd;
    int *join_conns;  /* [n] */
    /* Join connections accepted whose request has not arrived yet (join.c):
     * the supervisor polls each, never blocks on one, and refuses it at its
     * deadline. fd -1: a free entry; gen: bumped when an entry is freed, so
     * that a poll armed for its previous connection is told apart. Only the
     * supervising thread touches them. */
    struct sr_join_pending {
        int fd;
        uint32_t gen;     /* 24 bits, wrapping (an id holds it above the entry's index) */
        int64_t deadline; /* sr__now_ns() */
    } pending[SR_JOIN_PENDING];
    /* When accept4 fails for want of descriptors or memory (join.c,
     * sr__job_accept): spare_fd is /dev/null held in reserve (-1: none), given
     * up at EMFILE or ENFILE so that the waiting connection can be accepted
     * and told why, then taken again; accept_resume is 0, or when the
     * listening socket is polled again after another failure (the
     * connection stays in the backlog meanwhile: polling it at once would
     * spin); accept_err, the failure last logged (0: none since the last
     * accept). Only the supervising thread touches them. */
    int spare_fd;
    int accept_err;
    int64_t accept_resume; /* sr__now_ns() */
    /* Every child execs (shmrun): the supervisor's own descriptors, all
     * close-on-exec, go at the exec, so a child does not close them one by
     * one (O(N) calls in each of N children). false: sr_spawn. */
    bool children_exec;
} sr_job;

/* A request to join (join.c): the rank wanted (-1: the lowest free), the
 * client's stdin, stdout and stderr, its directory and the program. */
struct sr_join_req {
    int want;
    int fds[3];
    const char *cwd;
    char **argv;
};

/* What a launcher adds to the supervision; every field optional ({0} and
 * sigfd -1 for none, as sr_spawn does). All callbacks run on the
 * supervisor's thread, between its waits. */
typedef struct sr_job_hooks {
    int sigfd;        /* signalfd whose signals are forwarded to the live workers; -1: none */
    int64_t grace_ns; /* after a forwarded SIGTERM/SIGINT: SIGKILL the survivors after this */
    void *ctx;
    /* Input fds watched alongside the workers (shmrun's output pipes):
     * on_input(ctx, i) runs when fds[i] is readable; false stops watching it. */
    int nfds;
    const int *fds;
    bool (*on_input)(void *ctx, int i);
    /* CLOCK_MONOTONIC ns at which on_due must run (INT64_MAX: never), asked
     * before every wait; on_due(ctx, now) then runs once that time passed. */
    int64_t (*next_due)(void *ctx);
    void (*on_due)(void *ctx, int64_t now);
    /* Every worker is reaped and the supervisor is about to print its
     * report (if any) and return: flush what the workers wrote first. */
    void (*on_end)(void *ctx);
} sr_job_hooks;

/* Create the segment and one doorbell eventfd per rank. Errors: -EINVAL bad
 * options (see sr__segment_create) or SIGCHLD ignored (SIG_IGN/SA_NOCLDWAIT:
 * the kernel would reap the workers before the supervisor reads their
 * status); -ENOMEM; -errno of memfd/eventfd. On error nothing is left open. */
int sr__job_create(sr_job *job, const sr_segment_opts *o, const char *who);
void sr__job_destroy(sr_job *job);

/* Fork worker `rank`. In the child, run(job, rank, arg) is called after the
 * death signal is armed, the signal mask restored and the supervisor's
 * pidfds closed; it must not return (exec or _exit). If no pidfd can be
 * opened on the child, it is killed and reaped before the error returns.
 * The child's environment also says its generation (SHMRPC_GENERATION: 0,
 * or the count of the rank's replacements). run and arg are kept for the
 * replacements (the first call's). */
int sr__job_fork(sr_job *job, int rank, void (*run)(sr_job *, int, void *), void *arg);
/* In a child about to exec the worker program: SHMRPC_FD, SHMRPC_RANK and
 * SHMRPC_WORLD_SIZE, and OPENBLAS_NUM_THREADS=1 unless SHMRPC_BLAS_THREADS,
 * OPENBLAS_NUM_THREADS or GOTO_NUM_THREADS is set: the thread count the
 * library would set at its first matmul anyway (docs/TENSORS.md), given
 * before the program loads OpenBLAS, which otherwise starts a pool of
 * threads at load that spin for about 0.1 s of CPU each, unused. */
void sr__job_exec_env(const sr_job *job, int rank);

/* waitid(P_PIDFD) on rank's pidfd, retried on EINTR: 0 or -1 with errno. */
int sr__job_reap(sr_job *job, int rank, siginfo_t *si);

/* SIGKILL and reap every worker still running; returns how many there were. */
int sr__job_stop(sr_job *job);

/* Wait for every worker (hooks: NULL for none). Returns 0 when all exited 0;
 * otherwise the exit code a launcher should use (the status, or 128 +
 * signal) after printing the report and copying it to sr_last_error().
 * Negative: -errno of the supervisor itself (every worker is stopped). */
int sr__job_supervise(sr_job *job, const sr_job_hooks *hooks);

/* One attempt of a job (sr__job_run): fork every worker and supervise
 * them. Returns what sr__job_supervise returns, or a negative error. */
typedef int (*sr_job_attempt)(sr_job *job, void *ctx);

/* Create the job, run attempt(job, ctx), destroy the job; again, with the
 * next restart number, while the supervisor set job.restart_due (the
 * restart policy above: at most max_restarts restarts and replacements in
 * all; job.spent says how many the attempts before spent, so an attempt of
 * a job that replaces ranks sets replace_left to max_restarts - spent).
 * Returns the last attempt's result, or sr__job_create's error. */
int sr__job_run(const sr_segment_opts *o, const char *who, int max_restarts, sr_job_attempt attempt, void *ctx);

/* Joining an elastic job (join.c). The supervisor listens on an abstract
 * unix socket named from the job id ("<pid>" of the supervisor, "<pid>.<k>"
 * for the k-th elastic job of one process), for its own user only
 * (SO_PEERCRED). A request (shmrun --join) gets the lowest free rank, or the
 * one asked for, readied as a new generation (segment.h, E4); the program
 * is forked and exec'd with the client's stdin, stdout and stderr, in the
 * client's directory, with the job's environment and launch variables (it
 * is the supervisor's child: exits, crash lines and the failure policy
 * apply as to any worker; its output is not prefixed nor collected by
 * --output-dir, nor traced). The client is told the rank and pid, or why
 * not ("the job is full: all 4 ranks are held", "rank 2 is held by a
 * worker"), and later the worker's exit code.
 * In an elastic job a worker's process that ends after it detached (a
 * leave, a failed sr_init of a joiner) or, for a joiner, before it
 * attached, fails nothing: its rank is free again. A worker that fails
 * while attached takes the job down as in any job. The job ends when no
 * worker runs. */
int sr__job_listen(sr_job *job);
/* The supervisor never waits for a client: it accepts each connection
 * (sr__job_accept: the pending entry it took, or -1 when no connection is
 * waiting; a client of another user, or one beyond SR_JOIN_PENDING, is
 * told why and closed), polls its fd, and reads its request once readable
 * (sr__job_join_request, with the entry's id, sr__job_pending_id: the rank
 * started; -1 refused, the client told why; SR_JOIN_NOT_YET, nothing to
 * read yet: poll again; SR_JOIN_STALE, the id names a connection gone).
 * A connection whose request has not come SR_JOIN_WAIT_NS after its accept
 * is refused and closed by sr__job_join_expire, which returns the ids of
 * those (their polls are to be cancelled); sr__job_join_due: the earliest
 * such deadline, or accept_resume (INT64_MAX: none). sr__job_accept never
 * leaves a connection in the backlog with the socket still to be polled:
 * at EMFILE or ENFILE it accepts the waiting connection in the spare
 * descriptor's place and serves it if descriptors came back meanwhile, or
 * refuses it, saying why;
 * at another failure (ENOMEM, ENOBUFS) it logs it once and sets
 * accept_resume, SR_JOIN_BACKOFF_NS on, before which the supervisor does not
 * poll the socket. */
#define SR_JOIN_NOT_YET (-2)
#define SR_JOIN_STALE (-3)
#define SR_JOIN_WAIT_NS (INT64_C(5) * 1000000000)
#define SR_JOIN_BACKOFF_NS (INT64_C(100) * 1000000)
int sr__job_accept(sr_job *job);
uint32_t sr__job_pending_id(const sr_job *job, int entry);
int sr__job_join_request(sr_job *job, uint32_t id);
int64_t sr__job_join_due(const sr_job *job);
int sr__job_join_expire(sr_job *job, int64_t now, uint32_t ids[SR_JOIN_PENDING]);
/* rank's process ended with exit code `code`: tell its join client, if any. */
void sr__job_joined_exit(sr_job *job, int rank, int code);
/* R2 (segment.h): rank's line as a new process of it must find it. */
void sr__job_ready_line(sr_job *job, int rank);

/* "3", "0-3,5": the ranks set in mask[0..n), written into buf. Returns buf. */
const char *sr__rank_list(const bool *mask, int n, char *buf, size_t len);

#endif
