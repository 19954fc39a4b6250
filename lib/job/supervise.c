/* SPDX-License-Identifier: MIT */
/* Supervision of a job's workers: the failure policy, signal forwarding and
 * the grace period of a requested stop (job.h). One io_uring watches every
 * worker's pidfd, the signalfd and the launcher's input fds; the only timed
 * wait is for a deadline (the grace period, or a hook's next_due). */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <liburing.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "clock.h"
#include "doorbell.h"
#include "error.h"
#include "futex.h"
#include "heap.h"
#include "job.h"
#include "log.h"
#include "ring.h"

/* user_data: a rank (< 2^31), the join socket, the signalfd, an input fd's
 * index, a join connection's pending id (join.c), or nothing to handle (a
 * poll's cancellation). */
#define TAG_SIGNAL (UINT64_C(1) << 32)
#define TAG_INPUT (UINT64_C(2) << 32)
#define TAG_JOIN_REQ (UINT64_C(4) << 32)
#define TAG_JOIN (UINT64_C(1) << 31) /* the join socket (join.c): above any rank */
#define TAG_NONE UINT64_MAX

struct sup {
    sr_job *job;
    const sr_job_hooks *h;
    struct io_uring ring;
    int stop_sig;     /* the forwarded SIGTERM/SIGINT that started a stop; 0: none */
    int64_t deadline; /* CLOCK_MONOTONIC ns: end of the grace period; INT64_MAX: none */
    bool *killed;     /* [n]: sent SIGKILL when the grace period ended */
    int nkilled;
    int hurry_sig;    /* a second SIGTERM/SIGINT, which ended the grace period at once (mpirun's double Ctrl-C) */
    bool failed;      /* during a stop: the first failure, reported at the end */
    int first_rank;
    pid_t first_pid;
    siginfo_t first_si;
};

static int live_workers(const sr_job *job)
{
    int n = 0;
    for (int r = 0; r < job->n; r++)
        n += job->pids[r] != 0;
    return n;
}

static void on_end(struct sup *s)
{
    if (s->h->on_end)
        s->h->on_end(s->h->ctx);
}

static int exit_code(const siginfo_t *si) { return si->si_code == CLD_EXITED ? si->si_status : 128 + si->si_status; }

/* A SIGTERM or SIGINT for us not yet read from the sigfd (blocked, so
 * pending until read). A Ctrl-C reaches the whole foreground process group
 * at once: a worker it killed can be reaped before our copy is read. */
static bool stop_pending(const struct sup *s)
{
    sigset_t p;
    return s->h->sigfd >= 0 && sigpending(&p) == 0 && (sigismember(&p, SIGTERM) || sigismember(&p, SIGINT));
}

/* Restarts and replacements spent so far, this attempt's included. */
static int spent(const sr_job *job) { return job->spent + job->replaced; }

/* The restart policy (job.h, "Restarts"): a worker killed by a signal,
 * outside a requested stop (the caller checks stop_sig; a stop signal
 * still pending counts too), while the budget is not spent. */
static bool restartable(const struct sup *s, const siginfo_t *si)
{
    return si->si_code != CLD_EXITED && spent(s->job) < s->job->max_restarts && !stop_pending(s);
}

/* The restart line's tail: "(restart 1 of 3)"; in a job that replaces
 * ranks, why not in place, and the budget the two share. */
static void restart_text(const sr_job *job, const char *unreplaced, char *buf, size_t len)
{
    if (job->seg.flags & SR_SEG_F_REPLACE) /* flags: our copy of the creator's (segment.h) */
        snprintf(buf, len, "; not replaced in place (%s): restarting the job (restart %d; %d of %d replacements "
                 "and restarts spent)", unreplaced ? unreplaced : "no reason known", job->restart + 1, spent(job) + 1,
                 job->max_restarts);
    else
        snprintf(buf, len, "; restarting the job (restart %d of %d)", job->restart + 1, job->max_restarts);
}

/* unreplaced: why a job that replaces ranks did not replace this one
 * (replaceable), or NULL. */
static int report_failure(struct sup *s, int rank, pid_t pid, const siginfo_t *si, const char *unreplaced)
{
    char what[96], serving[256], restart[256];
    sr__exit_describe(si->si_code, si->si_status, what, sizeof(what));
    sr__seg_crash_text(&s->job->seg, rank, serving, sizeof(serving)); /* the call it died in, if any */
    int others = sr__job_stop(s->job);
    on_end(s);
    sr_job *job = s->job;
    job->restart_due = restartable(s, si);
    if (job->restart_due) {
        restart_text(job, unreplaced, restart, sizeof(restart));
        sr__fail(-SR_EWORKER, job->who, "rank %d (pid %d) %s%s%s", rank, (int)pid, what, serving, restart);
    } else
        sr__fail(-SR_EWORKER, job->who, "rank %d (pid %d) %s%s; stopped the other %d worker%s", rank, (int)pid,
                 what, serving, others, others == 1 ? "" : "s");
    sr__log_text(SR_LOG_ERROR, sr_last_error());
    return exit_code(si);
}

/* The end of a stop: who had to be killed, and the first failure, if it
 * was not one of those. */
static int report_stop(struct sup *s)
{
    on_end(s);
    const char *sig = sigabbrev_np(s->stop_sig);
    if (s->nkilled) {
        char list[256];
        sr__rank_list(s->killed, s->job->n, list, sizeof(list));
        if (s->hurry_sig)
            sr__fail(-SR_EWORKER, s->job->who, "rank%s %s still running at a second stop signal (SIG%s): killed with SIGKILL",
                     s->nkilled > 1 ? "s" : "", list, sigabbrev_np(s->hurry_sig));
        else
            sr__fail(-SR_EWORKER, s->job->who, "rank%s %s still running %g s after SIG%s: killed with SIGKILL",
                     s->nkilled > 1 ? "s" : "", list, (double)s->h->grace_ns / 1e9, sig);
        sr__log_text(SR_LOG_ERROR, sr_last_error());
    }
    if (!s->failed)
        return 0;
    if (!s->killed[s->first_rank]) {
        char what[96], serving[256];
        sr__exit_describe(s->first_si.si_code, s->first_si.si_status, what, sizeof(what));
        sr__seg_crash_text(&s->job->seg, s->first_rank, serving, sizeof(serving));
        sr__fail(-SR_EWORKER, s->job->who, "rank %d (pid %d) %s%s after %s forwarded SIG%s", s->first_rank,
                 (int)s->first_pid, what, serving, s->job->who, sig);
        sr__log_text(SR_LOG_ERROR, sr_last_error());
    }
    return exit_code(&s->first_si);
}

/* Wake every worker still running, wherever it waits for a peer: its
 * doorbell (X3 in segment.h), the start barrier, and a send blocked on the
 * departed worker's full inbox. */
static void wake_survivors(sr_job *job, int gone)
{
    sr__futex_wake_all(&job->seg.hdr->attached);
    sr__futex_wake_all(&((struct sr_ring *)sr__seg_inbox(&job->seg, gone))->space_wait);
    for (int r = 0; r < job->n; r++) {
        struct sr_worker_info *w = sr__seg_worker(&job->seg, r);
        /* acquire: pairs with the worker's release store of ATTACHED (CLOSING comes later), after its doorbell_kind */
        if (!job->pids[r] || !sr__worker_state_attached(atomic_load_explicit(&w->state, memory_order_acquire)))
            continue; /* not attached: it waits in the start barrier, woken above */
        sr__doorbell_ring(&w->doorbell, w->doorbell_kind, job->eventfds[r]);
    }
}

/* Publish how `rank` ended (segment.h, "Peer exit"). The peers are woken
 * only when the job goes on (status 0: a failure stops them all anyway) and
 * the worker had not left after a graceful shutdown (nobody waits for it). */
static void publish_exit(sr_job *job, int rank, const siginfo_t *si)
{
    struct sr_worker_info *w = sr__seg_worker(&job->seg, rank);
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

/* ---- replacement in place (segment.h, "Replacement in place") ---- */

/* Why rank could not be replaced while rank r's line said st. */
static const char *unreplaced_why(const sr_job *job, int rank, int r, uint32_t st)
{
    static char why[128]; /* the supervising thread's alone */
    if (r == rank)
        return st == SR_WORKER_CLOSING ? "it died inside sr_shutdown"
               : st == SR_WORKER_EMPTY ? "it died before it attached"
                                       : "it died after it detached";
    if (st == SR_WORKER_CLOSING) /* rank is 0, the shutdown's leader */
        snprintf(why, sizeof(why), "it led sr_shutdown, which rank %d had entered", r);
    else
        snprintf(why, sizeof(why), "rank %d had %s", r, job->pids[r] ? "not attached" : "ended");
    return why;
}

/* May `rank`, whose process ended as si says, be replaced now? Killed by a
 * signal, budget left, no stop under way, every worker attached once, the
 * dead one not inside sr_shutdown (it may have arrived at the shutdown
 * barrier, and its successor would arrive again), and every other rank
 * attached or starting as a replacement. Others may wait in sr_shutdown's
 * first barrier (the dead one never arrived, so it cannot have completed),
 * unless the dead one is the leader, rank 0, which their arrivals went to.
 * NULL if it may; else why not, in a job that replaces ranks, when only
 * the moment was wrong (the caller restarts the job if the budget allows),
 * or "" (not a job that replaces ranks, no budget, a stop, an exit). */
static const char *unreplaceable(struct sup *s, int rank, const siginfo_t *si)
{
    sr_job *job = s->job;
    if (job->replace_left <= 0 || s->stop_sig || si->si_code == CLD_EXITED ||
        !(job->seg.flags & SR_SEG_F_REPLACE)) /* flags: our copy of the creator's (segment.h) */
        return "";
    /* acquire: pairs with each worker's release increment at its first attach */
    if (atomic_load_explicit(&job->seg.hdr->attached, memory_order_acquire) < job->seg.launched)
        return "it died before every worker had attached";
    for (int r = 0; r < job->n; r++) {
        struct sr_worker_info *w = sr__seg_worker(&job->seg, r);
        /* acquire: pairs with the worker's release stores of its state */
        uint32_t st = atomic_load_explicit(&w->state, memory_order_acquire);
        /* relaxed: only this thread writes it */
        bool starting = st == SR_WORKER_EMPTY && atomic_load_explicit(&w->generation, memory_order_relaxed) > 0;
        bool closing = st == SR_WORKER_CLOSING && r != rank && rank != 0;
        /* elastic: a rank nobody holds (free, or its worker left), or one leaving (it shuts down alone) */
        bool elastic = (job->seg.flags & SR_SEG_F_ELASTIC) && r != rank &&
                       (!job->pids[r] || st == SR_WORKER_LEAVING || sr__worker_state_detached(st));
        if (st != SR_WORKER_ATTACHED && !starting && !closing && !elastic)
            return unreplaced_why(job, rank, r, st);
    }
    return NULL;
}

/* R2: rank's line as a new process of it must find it. The dead one was
 * reaped, so nothing else writes the line now. */
void sr__job_ready_line(sr_job *job, int rank)
{
    struct sr_worker_info *w = sr__seg_worker(&job->seg, rank);
    /* relaxed: the next process reads them after its fork, which orders them */
    atomic_store_explicit(&w->crashed, 0, memory_order_relaxed);
    atomic_store_explicit(&w->space_kick, 0, memory_order_relaxed);
    atomic_store_explicit(&w->state, SR_WORKER_EMPTY, memory_order_relaxed);
    uint32_t g = atomic_load_explicit(&w->generation, memory_order_relaxed) + 1; /* relaxed: ours alone */
    /* seq_cst: pairs with the peers' loads after header.exits (R2) */
    atomic_store_explicit(&w->generation, g, memory_order_seq_cst);
    atomic_store_explicit(&w->exited, 0, memory_order_seq_cst);
}

static void arm(struct io_uring *ring, int fd, uint64_t tag);

/* The slots the dead process claimed in its peers' inboxes and never
 * published: voided, so that their consumers do not stop there (ring.h; it
 * is reaped, and its successor does not exist yet). The wake comes with the
 * exit's publication. A corrupt inbox is its consumer's to find. */
static void reap_claims(sr_job *job, int rank)
{
    for (int r = 0; r < job->n; r++) /* its own inbox too: it may have been sending to itself */
        (void)sr__ring_reap_producer(sr__seg_inbox(&job->seg, r), job->seg.ring_slots, (uint32_t)rank);
}

/* R1 for a rank that died while the job goes on: its heap area
 * quarantined, its claims voided, its exit published, the survivors woken. */
static void bury_rank(sr_job *job, int rank, const siginfo_t *si)
{
    /* Its heap area's blocks stay valid for the survivors holding them, and
     * no dead arena is ever touched (heap.h, "Areas"; the heap counts
     * generations from 1). relaxed: only this thread writes the generation */
    uint32_t gen = atomic_load_explicit(&sr__seg_worker(&job->seg, rank)->generation, memory_order_relaxed);
    int area = sr__heap_area_find(&job->seg, rank, gen + 1);
    if (area >= 0)
        sr__heap_area_quarantine(&job->seg, area);
    reap_claims(job, rank);
    publish_exit(job, rank, si); /* X1, X2 */
    wake_survivors(job, rank);   /* X3: the survivors fail what was in flight with it */
}

/* A process that joined an elastic job (shmrun --join) and died while the
 * job replaces ranks: its program is its client's, which the supervisor
 * does not keep, so its rank becomes free (segment.h, "Elastic jobs") and
 * the job goes on; a new process may join it. */
static int free_joined_rank(struct sup *s, int rank, pid_t pid, const siginfo_t *si)
{
    sr_job *job = s->job;
    char what[96], serving[256], line[512];
    sr__exit_describe(si->si_code, si->si_status, what, sizeof(what));
    sr__seg_crash_text(&job->seg, rank, serving, sizeof(serving));
    bury_rank(job, rank, si);
    snprintf(line, sizeof(line), "%s: rank %d (pid %d, joined with --join) %s%s; not replaced (its program is its "
             "client's): rank %d is free", job->who, rank, (int)pid, what, serving, rank);
    sr__log_text(SR_LOG_WARN, line);
    return 0;
}

/* R1-R3 for a rank that died: publish, ready its line, start its next
 * process. Returns 0, or the job's exit code if no process could start. */
static int replace_rank(struct sup *s, int rank, pid_t pid, const siginfo_t *si)
{
    sr_job *job = s->job;
    char what[96], serving[256];
    sr__exit_describe(si->si_code, si->si_status, what, sizeof(what));
    sr__seg_crash_text(&job->seg, rank, serving, sizeof(serving));
    bury_rank(job, rank, si);
    sr__job_ready_line(job, rank);
    close(job->pidfds[rank]);
    job->pidfds[rank] = -1;
    job->replace_left--;
    job->replaced++;
    int rc = sr__job_fork(job, rank, job->run, job->run_arg);
    if (rc) {
        char why[256];
        snprintf(why, sizeof(why), "%s", sr_last_error());
        int others = sr__job_stop(job);
        on_end(s);
        sr__fail(-SR_EWORKER, job->who, "rank %d (pid %d) %s%s; its replacement could not start (%s); stopped the other %d worker%s",
                 rank, (int)pid, what, serving, why, others, others == 1 ? "" : "s");
        sr__log_text(SR_LOG_ERROR, sr_last_error());
        return exit_code(si);
    }
    arm(&s->ring, job->pidfds[rank], (uint64_t)rank);
    /* relaxed: only this thread writes it */
    uint32_t g = atomic_load_explicit(&sr__seg_worker(&job->seg, rank)->generation, memory_order_relaxed);
    char line[512];
    snprintf(line, sizeof(line), "%s: rank %d (pid %d) %s%s; replaced by pid %d (generation %u, replacement %d of %d)",
             job->who, rank, (int)pid, what, serving, (int)job->pids[rank], g, spent(job), job->max_restarts);
    sr__log_text(SR_LOG_WARN, line);
    return 0;
}

/* Elastic jobs (job.h, "Joining"): the worker had left the job (it
 * detached), or was a joiner that never attached: its process's end fails
 * nothing, and its rank is free again. */
static bool departed(sr_job *job, int rank)
{
    struct sr_worker_info *w = sr__seg_worker(&job->seg, rank);
    /* relaxed (all): its last stores, ordered by its exit and waitid; the generation is ours */
    uint32_t st = atomic_load_explicit(&w->state, memory_order_relaxed);
    return (job->seg.flags & SR_SEG_F_ELASTIC) && /* flags: our copy of the creator's (segment.h) */
           (sr__worker_state_detached(st) ||
            (st == SR_WORKER_EMPTY && atomic_load_explicit(&w->generation, memory_order_relaxed) > 0));
}

/* A worker's pidfd became readable: reap it. Returns 0, or the job's exit
 * code after a failure outside a stop. */
static int on_exit_event(struct sup *s, int rank)
{
    sr_job *job = s->job;
    siginfo_t si = {0};
    pid_t pid = job->pids[rank];
    if (!pid)
        return 0;
    if (sr__job_reap(job, rank, &si) < 0) {
        /* Its pidfd is no longer armed: carrying on would wait forever. */
        int err = errno;
        job->pids[rank] = 0;
        return sr__fail(-err, job->who, "waitid for rank %d (pid %d): %s", rank, (int)pid, strerror(err));
    }
    job->pids[rank] = 0;
    bool joined = job->join_conns && job->join_conns[rank] >= 0;
    sr__job_joined_exit(job, rank, exit_code(&si)); /* its shmrun --join exits with it */
    if (departed(job, rank)) { /* elastic: no longer part of the job, however it ends */
        publish_exit(job, rank, &si);
        return 0;
    }
    const char *unreplaced = unreplaceable(s, rank, &si);
    if (!unreplaced)
        return joined ? free_joined_rank(s, rank, pid, &si) : replace_rank(s, rank, pid, &si);
    publish_exit(job, rank, &si);
    if (si.si_code == CLD_EXITED && si.si_status == 0)
        return 0;
    if (!s->stop_sig)
        return report_failure(s, rank, pid, &si, *unreplaced ? unreplaced : NULL);
    if (!s->failed) { /* stopping: every worker keeps its grace period */
        s->failed = true;
        s->first_rank = rank;
        s->first_pid = pid;
        s->first_si = si;
    }
    return 0;
}

static void signal_all(sr_job *job, int sig)
{
    for (int r = 0; r < job->n; r++)
        if (job->pids[r])
            syscall(SYS_pidfd_send_signal, job->pidfds[r], sig, NULL, 0);
}

static void forward_signal(struct sup *s)
{
    struct signalfd_siginfo ssi;
    if (read(s->h->sigfd, &ssi, sizeof(ssi)) != sizeof(ssi))
        return;
    int sig = (int)ssi.ssi_signo;
    signal_all(s->job, sig);
    if (sig != SIGTERM && sig != SIGINT)
        return;
    if (!s->stop_sig) { /* the grace period runs from the first */
        s->stop_sig = sig;
        s->deadline = sr__now_ns() + s->h->grace_ns;
    } else if (!s->hurry_sig && live_workers(s->job)) { /* the second: no more waiting */
        s->hurry_sig = sig;
        s->deadline = sr__now_ns();
    }
}

static void kill_survivors(struct sup *s)
{
    for (int r = 0; r < s->job->n; r++)
        if (s->job->pids[r]) {
            syscall(SYS_pidfd_send_signal, s->job->pidfds[r], SIGKILL, NULL, 0);
            s->killed[r] = true;
            s->nkilled++;
        }
    s->deadline = INT64_MAX;
}

/* A free entry of the submission queue, submitting what is queued when
 * it is full. */
static struct io_uring_sqe *next_sqe(struct io_uring *ring)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
    if (!sqe) {
        io_uring_submit(ring);
        sqe = io_uring_get_sqe(ring);
    }
    return sqe;
}

static void arm(struct io_uring *ring, int fd, uint64_t tag)
{
    struct io_uring_sqe *sqe = next_sqe(ring);
    io_uring_prep_poll_add(sqe, fd, POLLIN);
    io_uring_sqe_set_data64(sqe, tag);
}

static int64_t next_deadline(struct sup *s)
{
    int64_t due = s->h->next_due ? s->h->next_due(s->h->ctx) : INT64_MAX, join = sr__job_join_due(s->job);
    due = due < s->deadline ? due : s->deadline;
    return join < due ? join : due;
}

/* Stop polling a join connection that is gone (its CQE, -ECANCELED, is
 * then stale: join.c tells it apart by the id's generation). */
static void disarm_join(struct io_uring *ring, uint32_t id)
{
    struct io_uring_sqe *sqe = next_sqe(ring);
    io_uring_prep_poll_remove(sqe, TAG_JOIN_REQ + id);
    io_uring_sqe_set_data64(sqe, TAG_NONE);
}

/* New join connections: each polled for its request. */
static void accept_joins(struct sup *s)
{
    int e;
    while ((e = sr__job_accept(s->job)) >= 0)
        arm(&s->ring, s->job->pending[e].fd, TAG_JOIN_REQ + sr__job_pending_id(s->job, e));
    if (!s->job->accept_resume) /* else run_due accepts again then */
        arm(&s->ring, s->job->listen_fd, TAG_JOIN);
}

/* A join connection is readable: its request, or its end. */
static void read_join(struct sup *s, uint32_t id)
{
    int rank = sr__job_join_request(s->job, id);
    if (rank >= 0)
        arm(&s->ring, s->job->pidfds[rank], (uint64_t)rank);
    else if (rank == SR_JOIN_NOT_YET)
        arm(&s->ring, s->job->pending[id & 0xff].fd, TAG_JOIN_REQ + id);
}

/* Submit what is armed and sleep until an event or the next deadline. */
static int wait_events(struct sup *s)
{
    int64_t due = next_deadline(s);
    struct io_uring_cqe *cqe;
    if (due == INT64_MAX)
        return io_uring_submit_and_wait(&s->ring, 1);
    int64_t left = due - sr__now_ns();
    if (left < 0)
        left = 0;
    struct __kernel_timespec ts = {.tv_sec = left / 1000000000, .tv_nsec = left % 1000000000};
    int rc = io_uring_submit_and_wait_timeout(&s->ring, &cqe, 1, &ts, NULL);
    return rc == -ETIME ? 0 : rc;
}

static int on_event(struct sup *s, uint64_t tag)
{
    if (tag == TAG_SIGNAL) {
        forward_signal(s);
        arm(&s->ring, s->h->sigfd, TAG_SIGNAL);
    } else if (tag == TAG_JOIN) {
        accept_joins(s);
    } else if (tag == TAG_NONE) {
        return 0;
    } else if (tag >= TAG_JOIN_REQ) {
        read_join(s, (uint32_t)(tag - TAG_JOIN_REQ));
    } else if (tag >= TAG_INPUT) {
        int i = (int)(tag - TAG_INPUT);
        if (s->h->on_input(s->h->ctx, i))
            arm(&s->ring, s->h->fds[i], tag);
    } else {
        return on_exit_event(s, (int)tag);
    }
    return 0;
}

static void run_due(struct sup *s)
{
    int64_t now = sr__now_ns();
    uint32_t gone[SR_JOIN_PENDING];
    for (int i = 0, n = sr__job_join_expire(s->job, now, gone); i < n; i++)
        disarm_join(&s->ring, gone[i]);
    if (s->job->accept_resume && s->job->accept_resume <= now) {
        s->job->accept_resume = 0;
        accept_joins(s);
    }
    if (s->h->on_due && s->h->next_due(s->h->ctx) <= now)
        s->h->on_due(s->h->ctx, now);
    if (now >= s->deadline)
        kill_survivors(s);
}

static int supervise_loop(struct sup *s)
{
    while (live_workers(s->job)) {
        int rc = wait_events(s);
        if (rc < 0 && rc != -EINTR)
            return sr__fail(rc, s->job->who, "io_uring_submit_and_wait: %s", strerror(-rc));
        struct io_uring_cqe *cqe;
        while (io_uring_peek_cqe(&s->ring, &cqe) == 0) {
            uint64_t tag = cqe->user_data;
            io_uring_cqe_seen(&s->ring, cqe);
            if ((rc = on_event(s, tag)) != 0)
                return rc;
        }
        run_due(s);
    }
    if (s->stop_sig)
        return report_stop(s);
    on_end(s);
    return 0;
}

static void arm_all(struct sup *s)
{
    for (int r = 0; r < s->job->n; r++)
        if (s->job->pids[r])
            arm(&s->ring, s->job->pidfds[r], (uint64_t)r);
    if (s->h->sigfd >= 0)
        arm(&s->ring, s->h->sigfd, TAG_SIGNAL);
    for (int i = 0; i < s->h->nfds; i++)
        arm(&s->ring, s->h->fds[i], TAG_INPUT + (uint64_t)i);
    if (s->job->listen_fd >= 0)
        arm(&s->ring, s->job->listen_fd, TAG_JOIN);
}

int sr__job_supervise(sr_job *job, const sr_job_hooks *hooks)
{
    static const sr_job_hooks none = {.sigfd = -1};
    struct sup s = {.job = job, .h = hooks ? hooks : &none, .deadline = INT64_MAX};
    s.killed = calloc((size_t)job->n, sizeof(bool));
    int rc = s.killed ? io_uring_queue_init(64, &s.ring, 0) : -ENOMEM;
    if (rc < 0) {
        free(s.killed);
        sr__job_stop(job);
        return sr__fail(rc, job->who, "io_uring_queue_init: %s", strerror(-rc));
    }
    arm_all(&s);
    rc = supervise_loop(&s);
    if (rc < 0)
        sr__job_stop(job);
    io_uring_queue_exit(&s.ring);
    free(s.killed);
    return rc;
}
