/* SPDX-License-Identifier: MIT */
/* Job creation and supervision. See job.h for the failure policy. */
#include "job.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "error.h"
#include "log.h"

/* With SIGCHLD ignored (SIG_IGN or SA_NOCLDWAIT) the kernel reaps the
 * workers itself: waitid() finds no status, so the failure policy could not
 * say how a worker ended. */
static int check_sigchld(const char *who)
{
    struct sigaction sa;
    if (sigaction(SIGCHLD, NULL, &sa) == 0 && (sa.sa_handler == SIG_IGN || (sa.sa_flags & SA_NOCLDWAIT)))
        return sr__fail(-EINVAL, who, "SIGCHLD is ignored (SIG_IGN or SA_NOCLDWAIT): "
                                      "the exit status of the workers could not be collected");
    return 0;
}

/* Every fd slot reads -1 before anything can fail, so that destroy closes
 * only what was opened. */
static int alloc_tables(sr_job *job, int n)
{
    job->pids = calloc((size_t)n, sizeof(pid_t));
    job->pidfds = malloc((size_t)n * sizeof(int));
    job->eventfds = malloc((size_t)n * sizeof(int));
    job->join_conns = malloc((size_t)n * sizeof(int));
    if (!job->pids || !job->pidfds || !job->eventfds || !job->join_conns)
        return sr__fail(-ENOMEM, job->who, "no memory for %d workers", n);
    for (int r = 0; r < n; r++)
        job->pidfds[r] = job->eventfds[r] = job->join_conns[r] = -1;
    job->n = n;
    return 0;
}

int sr__job_create(sr_job *job, const sr_segment_opts *o, const char *who)
{
    memset(job, 0, sizeof(*job));
    job->who = who;
    job->listen_fd = job->spare_fd = -1;
    for (int i = 0; i < SR_JOIN_PENDING; i++)
        job->pending[i].fd = -1;
    sigprocmask(SIG_SETMASK, NULL, &job->child_mask);
    int rc = check_sigchld(who);
    if (rc || (rc = sr__segment_create(o, &job->seg)))
        return rc;
    if ((rc = alloc_tables(job, o->world_size)) || ((o->flags & SR_SEG_F_ELASTIC) && (rc = sr__job_listen(job)))) {
        sr__job_destroy(job);
        return rc;
    }
    for (int r = 0; r < job->n; r++) {
        /* Blocking on purpose: io_uring waits on it by arming a poll.
         * Inherited by every worker: never on fds 0-2 (segment.h). */
        job->eventfds[r] = eventfd(0, EFD_CLOEXEC);
        if (job->eventfds[r] < 0)
            rc = sr__fail(-errno, who, "eventfd for rank %d: %s", r, strerror(errno));
        else if ((job->eventfds[r] = sr__fd_above_stdio(job->eventfds[r], who)) < 0)
            rc = job->eventfds[r];
        if (rc) {
            job->eventfds[r] = -1;
            sr__job_destroy(job);
            return rc;
        }
        sr__seg_worker(&job->seg, r)->eventfd = job->eventfds[r];
    }
    return 0;
}

void sr__job_destroy(sr_job *job)
{
    for (int r = 0; r < job->n; r++) {
        if (job->pidfds && job->pidfds[r] >= 0)
            close(job->pidfds[r]);
        if (job->eventfds && job->eventfds[r] >= 0)
            close(job->eventfds[r]);
        if (job->join_conns && job->join_conns[r] >= 0) /* the client sees the job end without a status */
            close(job->join_conns[r]);
    }
    if (job->listen_fd >= 0)
        close(job->listen_fd);
    if (job->spare_fd >= 0)
        close(job->spare_fd);
    job->listen_fd = job->spare_fd = -1;
    for (int i = 0; i < SR_JOIN_PENDING; i++) { /* the client sees the job end before it answered */
        if (job->pending[i].fd >= 0)
            close(job->pending[i].fd);
        job->pending[i].fd = -1;
    }
    free(job->join_conns);
    job->join_conns = NULL;
    free(job->pids);
    free(job->pidfds);
    free(job->eventfds);
    sr__segment_detach(&job->seg, true);
    job->pids = NULL;
    job->pidfds = job->eventfds = NULL;
    job->n = 0;
}

/* In a child: the pidfds of the ranks forked before it are the supervisor's
 * handles, not the worker's. They are close-on-exec, but sr_spawn workers do
 * not exec. (A worker learns of its peers' exits from the supervisor's
 * publication, segment.h "Peer exit": it holds no pidfd.) */
static void close_sibling_pidfds(sr_job *job)
{
    for (int r = 0; r < job->n; r++) {
        if (job->pidfds[r] >= 0)
            close(job->pidfds[r]);
        if (job->join_conns[r] >= 0) /* another joiner's connection: only the supervisor talks on it */
            close(job->join_conns[r]);
    }
    if (job->listen_fd >= 0)
        close(job->listen_fd);
    if (job->spare_fd >= 0)
        close(job->spare_fd);
    for (int i = 0; i < SR_JOIN_PENDING; i++)
        if (job->pending[i].fd >= 0)
            close(job->pending[i].fd);
}

/* In a child: stdin for rank 0 only (mpirun's rule: one reader, and a
 * terminal's input is not split between ranks); the launch values under
 * torchrun's names, so that code written for torchrun finds its rank. */
static void child_setup(sr_job *job, int rank)
{
    if (rank > 0) {
        int fd = open("/dev/null", O_RDONLY); /* fd 0 itself when the caller had closed it */
        if (fd < 0 || dup2(fd, 0) < 0) {
            sr_logf(SR_LOG_ERROR, "rank %d: /dev/null as stdin: %s", rank, strerror(errno));
            _exit(127);
        }
        if (fd != 0)
            close(fd);
    }
    char buf[16];
    static const char *const names[] = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                        "SHMRPC_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"};
    for (int i = 0; i < 6; i++) {
        snprintf(buf, sizeof(buf), "%d", i < 2 ? rank : i < 4 ? job->n : job->restart);
        setenv(names[i], buf, 1);
    }
    /* relaxed: written by the supervisor before this fork */
    snprintf(buf, sizeof(buf), "%u",
             atomic_load_explicit(&sr__seg_worker(&job->seg, rank)->generation, memory_order_relaxed));
    setenv("SHMRPC_GENERATION", buf, 1);
    if (job->id[0]) /* an elastic job: what shmrun --join names it by (sr_job_id) */
        setenv("SHMRPC_JOB", job->id, 1);
}

void sr__job_exec_env(const sr_job *job, int rank)
{
    char buf[16];
    snprintf(buf, sizeof(buf), "%d", job->seg.fd);
    setenv("SHMRPC_FD", buf, 1);
    snprintf(buf, sizeof(buf), "%d", rank);
    setenv("SHMRPC_RANK", buf, 1);
    snprintf(buf, sizeof(buf), "%d", job->n);
    setenv("SHMRPC_WORLD_SIZE", buf, 1);
    if (!getenv("SHMRPC_BLAS_THREADS") && !getenv("OPENBLAS_NUM_THREADS") && !getenv("GOTO_NUM_THREADS"))
        setenv("OPENBLAS_NUM_THREADS", "1", 1);
}

int sr__job_fork(sr_job *job, int rank, void (*run)(sr_job *, int, void *), void *arg)
{
    pid_t parent = getpid();
    if (!job->run)
        job->run = run, job->run_arg = arg;
    fflush(NULL); /* do not duplicate buffered output into the child */
    pid_t pid = fork();
    if (pid < 0)
        return sr__fail(-errno, job->who, "fork of rank %d: %s", rank, strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) /* the launcher died before the signal was armed */
            _exit(1);
        sigprocmask(SIG_SETMASK, &job->child_mask, NULL);
        if (!job->children_exec)
            close_sibling_pidfds(job);
        child_setup(job, rank);
        run(job, rank, arg);
        _exit(127);
    }
    if (job->pidfds[rank] >= 0) /* the rank's last process, reaped (a free rank of an elastic job, joined again) */
        close(job->pidfds[rank]);
    job->pidfds[rank] = (int)syscall(SYS_pidfd_open, pid, 0);
    if (job->pidfds[rank] < 0) {
        /* Untracked, it would outlive the job. Its pid cannot be reused
         * before we reap it, so kill and reap it by pid. */
        int err = errno;
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return sr__fail(-err, job->who, "pidfd_open(%d) for rank %d: %s", pid, rank, strerror(err));
    }
    job->pids[rank] = pid;
    return 0;
}

/* waitid on the worker's pidfd. sr_spawn runs in the caller's process,
 * whose signal handlers may interrupt it: retry. */
int sr__job_reap(sr_job *job, int rank, siginfo_t *si)
{
    int rc;
    while ((rc = waitid(P_PIDFD, (id_t)job->pidfds[rank], si, WEXITED)) < 0 && errno == EINTR)
        ;
    return rc;
}

int sr__job_stop(sr_job *job)
{
    int n = 0;
    for (int r = 0; r < job->n; r++)
        if (job->pids[r]) {
            syscall(SYS_pidfd_send_signal, job->pidfds[r], SIGKILL, NULL, 0);
            n++;
        }
    for (int r = 0; r < job->n; r++)
        if (job->pids[r]) {
            siginfo_t si = {0};
            sr__job_reap(job, r, &si);
            job->pids[r] = 0;
            sr__job_joined_exit(job, r, si.si_code == CLD_EXITED ? si.si_status : 128 + si.si_status);
        }
    return n;
}


int sr__job_run(const sr_segment_opts *o, const char *who, int max_restarts, sr_job_attempt attempt, void *ctx)
{
    int rc, spent = 0;
    for (int restart = 0;; restart++) {
        sr_job job;
        if ((rc = sr__job_create(&job, o, who)))
            return rc;
        job.restart = restart;
        job.max_restarts = max_restarts;
        job.spent = spent;
        rc = attempt(&job, ctx);
        bool again = job.restart_due;
        spent += job.replaced + again;
        sr__job_destroy(&job); /* every worker is reaped: the segment goes with it */
        if (!again)
            return rc;
    }
}

const char *sr__rank_list(const bool *mask, int n, char *buf, size_t len)
{
    size_t at = 0;
    char piece[32];
    buf[0] = 0;
    for (int r = 0; r < n; r++) {
        if (!mask[r])
            continue;
        int end = r;
        while (end + 1 < n && mask[end + 1])
            end++;
        int w = end == r ? snprintf(piece, sizeof(piece), "%s%d", at ? "," : "", r)
                         : snprintf(piece, sizeof(piece), "%s%d-%d", at ? "," : "", r, end);
        if (at + (size_t)w + 4 >= len) { /* keep room for ",..." rather than cut a number */
            snprintf(buf + at, len - at, "%s", len - at > 4 ? ",..." : "");
            break;
        }
        memcpy(buf + at, piece, (size_t)w + 1);
        at += (size_t)w;
        r = end;
    }
    return buf;
}
