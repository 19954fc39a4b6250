/* Job creation and supervision. See job.h for the failure policy. */
#include "job.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <liburing.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "doorbell.h"
#include "error.h"
#include "log.h"
#include "ring.h"

#define TAG_SIGNAL UINT64_C(0xffffffff)

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
    if (!job->pids || !job->pidfds || !job->eventfds)
        return sr__fail(-ENOMEM, job->who, "no memory for %d workers", n);
    for (int r = 0; r < n; r++)
        job->pidfds[r] = job->eventfds[r] = -1;
    job->n = n;
    return 0;
}

int sr__job_create(sr_job *job, const sr_segment_opts *o, const char *who)
{
    memset(job, 0, sizeof(*job));
    job->who = who;
    sigprocmask(SIG_SETMASK, NULL, &job->child_mask);
    int rc = check_sigchld(who);
    if (rc || (rc = sr_segment_create(o, &job->seg)))
        return rc;
    if ((rc = alloc_tables(job, o->world_size))) {
        sr__job_destroy(job);
        return rc;
    }
    for (int r = 0; r < job->n; r++) {
        /* Blocking on purpose: io_uring waits on it by arming a poll. */
        job->eventfds[r] = eventfd(0, EFD_CLOEXEC);
        if (job->eventfds[r] < 0) {
            rc = sr__fail(-errno, who, "eventfd for rank %d: %s", r, strerror(errno));
            sr__job_destroy(job);
            return rc;
        }
        sr_seg_worker(&job->seg, r)->eventfd = job->eventfds[r];
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
    }
    free(job->pids);
    free(job->pidfds);
    free(job->eventfds);
    sr_segment_detach(&job->seg, true);
    job->pids = NULL;
    job->pidfds = job->eventfds = NULL;
    job->n = 0;
}

/* In a child: the pidfds of the ranks forked before it are the supervisor's
 * handles, not the worker's. They are close-on-exec, but sr_spawn workers do
 * not exec; the waiter opens its own pidfds on every peer after attach. */
static void close_sibling_pidfds(sr_job *job)
{
    for (int r = 0; r < job->n; r++)
        if (job->pidfds[r] >= 0)
            close(job->pidfds[r]);
}

int sr__job_fork(sr_job *job, int rank, void (*run)(sr_job *, int, void *), void *arg)
{
    pid_t parent = getpid();
    fflush(NULL); /* do not duplicate buffered output into the child */
    pid_t pid = fork();
    if (pid < 0)
        return sr__fail(-errno, job->who, "fork of rank %d: %s", rank, strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) /* the launcher died before the signal was armed */
            _exit(1);
        sigprocmask(SIG_SETMASK, &job->child_mask, NULL);
        close_sibling_pidfds(job);
        run(job, rank, arg);
        _exit(127);
    }
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

static int live_workers(const sr_job *job)
{
    int n = 0;
    for (int r = 0; r < job->n; r++)
        n += job->pids[r] != 0;
    return n;
}

/* waitid on the worker's pidfd. sr_spawn runs in the caller's process,
 * whose signal handlers may interrupt it: retry. */
static int reap(sr_job *job, int rank, siginfo_t *si)
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
            siginfo_t si;
            reap(job, r, &si);
            job->pids[r] = 0;
        }
    return n;
}

static int report_failure(sr_job *job, int rank, pid_t pid, const siginfo_t *si)
{
    char what[96], serving[256];
    sr_exit_describe(si->si_code, si->si_status, what, sizeof(what));
    sr_seg_crash_text(&job->seg, rank, serving, sizeof(serving)); /* the call it died in, if any */
    int others = sr__job_stop(job);
    sr__fail(-SR_EWORKER, job->who, "rank %d (pid %d) %s%s; stopped the other %d worker%s", rank, (int)pid, what,
             serving, others, others == 1 ? "" : "s");
    sr__log_text(SR_LOG_ERROR, sr_last_error());
    return si->si_code == CLD_EXITED ? si->si_status : 128 + si->si_status;
}

static void futex_wake_all(_Atomic uint32_t *w)
{
    syscall(SYS_futex, w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0); /* shared: the word is in the segment */
}

/* Wake every worker still running, wherever it waits for a peer: its
 * doorbell (X3 in segment.h), the start barrier, and a send blocked on the
 * departed worker's full inbox. */
static void wake_survivors(sr_job *job, int gone)
{
    futex_wake_all(&job->seg.hdr->attached);
    futex_wake_all(&((struct sr_ring *)sr_seg_inbox(&job->seg, gone))->space_wait);
    for (int r = 0; r < job->n; r++) {
        struct sr_worker_info *w = sr_seg_worker(&job->seg, r);
        /* acquire: pairs with the worker's release store of ATTACHED (CLOSING comes later), after its doorbell_kind */
        if (!job->pids[r] || !sr_worker_state_attached(atomic_load_explicit(&w->state, memory_order_acquire)))
            continue; /* not attached: it waits in the start barrier, woken above */
        sr_doorbell_ring(&w->doorbell, w->doorbell_kind, job->eventfds[r]);
    }
}

/* Publish how `rank` ended (segment.h, "Peer exit"). The peers are woken
 * only when the job goes on (status 0: a failure stops them all anyway) and
 * the worker had not left after a graceful shutdown (nobody waits for it). */
static void publish_exit(sr_job *job, int rank, const siginfo_t *si)
{
    struct sr_worker_info *w = sr_seg_worker(&job->seg, rank);
    w->exit_code = si->si_code;
    w->exit_status = si->si_status;
    /* relaxed: only this thread writes the count */
    w->exit_seq = atomic_load_explicit(&job->seg.hdr->exits, memory_order_relaxed) + 1;
    /* X1, seq_cst: pairs with the senders' seq_cst check (segment.h) */
    atomic_store_explicit(&w->exited, 1, memory_order_seq_cst);
    /* X2, seq_cst: pairs with the peers' load of the generation */
    atomic_fetch_add_explicit(&job->seg.hdr->exits, 1, memory_order_seq_cst);
    /* relaxed: the worker's last store, ordered by its exit and waitid */
    uint32_t st = atomic_load_explicit(&w->state, memory_order_relaxed);
    if (si->si_code == CLD_EXITED && si->si_status == 0 && st != SR_WORKER_DETACHED)
        wake_survivors(job, rank);
}

/* A worker's pidfd became readable: reap it. Returns 0, or the job's exit code. */
static int on_exit_event(sr_job *job, int rank)
{
    siginfo_t si = {0};
    pid_t pid = job->pids[rank];
    if (!pid)
        return 0;
    if (reap(job, rank, &si) < 0) {
        /* Its pidfd is no longer armed: carrying on would wait forever. */
        int err = errno;
        job->pids[rank] = 0;
        return sr__fail(-err, job->who, "waitid for rank %d (pid %d): %s", rank, (int)pid, strerror(err));
    }
    job->pids[rank] = 0;
    publish_exit(job, rank, &si);
    if (si.si_code == CLD_EXITED && si.si_status == 0)
        return 0;
    return report_failure(job, rank, pid, &si);
}

static void forward_signal(sr_job *job, int sigfd)
{
    struct signalfd_siginfo ssi;
    if (read(sigfd, &ssi, sizeof(ssi)) != sizeof(ssi))
        return;
    for (int r = 0; r < job->n; r++)
        if (job->pids[r])
            syscall(SYS_pidfd_send_signal, job->pidfds[r], (int)ssi.ssi_signo, NULL, 0);
}

static void arm(struct io_uring *ring, int fd, uint64_t tag)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
    if (!sqe) {
        io_uring_submit(ring);
        sqe = io_uring_get_sqe(ring);
    }
    io_uring_prep_poll_add(sqe, fd, POLLIN);
    io_uring_sqe_set_data64(sqe, tag);
}

static int supervise_loop(sr_job *job, struct io_uring *ring, int sigfd)
{
    while (live_workers(job)) {
        int rc = io_uring_submit_and_wait(ring, 1);
        if (rc < 0 && rc != -EINTR)
            return sr__fail(rc, job->who, "io_uring_submit_and_wait: %s", strerror(-rc));
        struct io_uring_cqe *cqe;
        while (io_uring_peek_cqe(ring, &cqe) == 0) {
            uint64_t tag = cqe->user_data;
            io_uring_cqe_seen(ring, cqe);
            if (tag == TAG_SIGNAL) {
                forward_signal(job, sigfd);
                arm(ring, sigfd, TAG_SIGNAL);
            } else if ((rc = on_exit_event(job, (int)tag)) != 0) {
                return rc;
            }
        }
    }
    return 0;
}

int sr__job_supervise(sr_job *job, int sigfd)
{
    struct io_uring ring;
    int rc = io_uring_queue_init(64, &ring, 0);
    if (rc < 0) {
        sr__job_stop(job);
        return sr__fail(rc, job->who, "io_uring_queue_init: %s", strerror(-rc));
    }
    for (int r = 0; r < job->n; r++)
        if (job->pids[r])
            arm(&ring, job->pidfds[r], (uint64_t)r);
    if (sigfd >= 0)
        arm(&ring, sigfd, TAG_SIGNAL);
    rc = supervise_loop(job, &ring, sigfd);
    if (rc < 0)
        sr__job_stop(job);
    io_uring_queue_exit(&ring);
    return rc;
}
