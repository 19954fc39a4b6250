/* SPDX-License-Identifier: MIT */
/* shmrun: launch a shmrpc job.
 *
 *   shmrun -n N [options] [--] prog [args...]     (options: args.c, docs/LAUNCHER.md, shmrun.1)
 *
 * Creates the job's shared-memory segment, fork+execs N copies of prog with
 * SHMRPC_FD, SHMRPC_RANK and SHMRPC_WORLD_SIZE set (and torchrun's RANK,
 * WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), forwards SIGHUP, SIGINT,
 * SIGQUIT, SIGTERM, SIGUSR1 and SIGUSR2 to them and supervises them (failure
 * policy and grace period: lib/job/job.h). Output: output.h; CPU binding: bind.h;
 * the processes the workers leave behind, ended with the job: sweep.h.
 * With --max-restarts, a worker killed by a signal starts the whole job
 * again (restart policy: lib/job/job.h). --monitor: a live view (monitor.h). With --max-workers M the job is
 * elastic (M ranks, N launched), and shmrun --join JOB adds a worker to a
 * running one (join.h; lib/job/job.h, "Joining").
 * Exit status: 0 when every worker exited 0; the failed worker's status (or
 * 128 + signal) otherwise, of the last attempt; 2 for a bad command line; 1 for a launcher error.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "args.h"
#include "bind.h"
#include "error.h"
#include "log.h"
#include "job.h"
#include "join.h"
#include "monitor.h"
#include "output.h"
#include "sweep.h"
#include "trace_seam.h"

/* What every child needs; built before the first fork. */
struct launch {
    char **argv;
    struct out *out;
    struct monitor *mon; /* --monitor; NULL: off */
    struct bind_plan bind;
    struct sr_trace_job *trace; /* the profiler's record areas; NULL: none */
};

static void exec_worker(sr_job *job, int rank, void *p)
{
    struct launch *l = p;
    int rc = out_child(l->out, rank);
    if (rc || (rc = bind_apply(&l->bind, rank))) {
        fprintf(stderr, "shmrun: rank %d: %s: %s\n", rank, l->out && rc ? "output" : "sched_setaffinity",
                strerror(-rc));
        _exit(127);
    }
    /* The segment and every doorbell eventfd cross the exec (inherit_across_exec). */
    sr__job_exec_env(job, rank);
    sr__trace_job_child(l->trace, rank, true);
    mon_child(l->mon);
    execvp(l->argv[0], l->argv);
    fprintf(stderr, "shmrun: rank %d: exec %s: %s\n", rank, l->argv[0], strerror(errno));
    _exit(127);
}

/* The signals shmrun forwards to its workers, read through a signalfd. */
static int make_sigfd(sigset_t *old)
{
    static const int forwarded[] = {SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};
    sigset_t set;
    sigemptyset(&set);
    for (size_t i = 0; i < sizeof(forwarded) / sizeof(forwarded[0]); i++)
        sigaddset(&set, forwarded[i]);
    sigprocmask(SIG_BLOCK, &set, old);
    return signalfd(-1, &set, SFD_CLOEXEC);
}

/* One line on stderr, prefixed "shmrun: " once: the job's own messages
 * already carry it, the segment's name their function instead. */
static int launcher_error(int exit_code, bool usage_hint)
{
    const char *e = sr_last_error();
    fprintf(stderr, "%s%s\n%s", strncmp(e, "shmrun: ", 8) ? "shmrun: " : "", e,
            usage_hint ? "Try 'shmrun --help' for usage.\n" : "");
    return exit_code;
}

/* Fork every rank; on error the ones started are stopped. */
static int start_workers(sr_job *job, struct launch *l, const struct args *a)
{
    int rc = 0;
    for (int r = 0; r < a->n && !rc; r++) {
        rc = sr__job_fork(job, r, exec_worker, l);
        out_forked(l->out, r);
        if (!rc && a->report_bindings)
            bind_report(&l->bind, r, job->pids[r]);
    }
    for (int r = a->n; r < job->n; r++) /* an elastic job's free ranks: nobody writes their pipes */
        out_forked(l->out, r);
    if (rc)
        sr__job_stop(job);
    return rc;
}

static int run_job(sr_job *job, const struct args *a, int sigfd, struct sr_trace_job *trace)
{
    struct launch l = {.argv = a->argv, .trace = trace};
    int rc = bind_plan_make(&l.bind, a->bind, a->n);
    if (!rc)
        rc = out_create(&l.out, a, job);
    if (!rc && (rc = mon_create(&l.mon, a, job)))
        sr__fail(rc, "shmrun", "no memory for --monitor");
    if (!rc)
        rc = start_workers(job, &l, a);
    int status = -1;
    if (!rc) {
        sr_job_hooks h = {.sigfd = sigfd, .grace_ns = a->grace_ns};
        out_hooks(l.out, &h);
        mon_hooks(l.mon, &h);
        status = sr__job_supervise(job, &h);
    }
    mon_destroy(l.mon);
    out_destroy(l.out);
    bind_plan_free(&l.bind);
    if (rc || status < 0)
        rc = launcher_error(1, false);
    /* Every worker is reaped: whatever runs below us now is what they left. */
    sweep_leftovers(a->grace_ns, sigfd);
    return rc ? rc : status;
}

/* Started with fd 0, 1 or 2 closed (a daemon's habit), shmrun would get
 * its own descriptors there (the signalfd, the segment, pipes, log files),
 * and each worker's stdio would be copied over them. /dev/null takes those
 * places first, as for a worker: nothing is read from or written to it. */
static void fill_stdio(void)
{
    for (int fd = 0; fd < 3; fd++)
        if (fcntl(fd, F_GETFD) < 0 && errno == EBADF)
            (void)open("/dev/null", O_RDWR); /* the lowest free fd: this one, the lower ones are open */
}

/* The segment and every doorbell eventfd reach the workers across their
 * exec: close-on-exec is cleared once per attempt, here, before the first
 * fork, not in each child (N calls in each of N children). shmrun execs
 * nothing but workers (and joiners, which get them too), and each worker
 * sets it again once attached (docs/LAUNCHER.md). */
static void inherit_across_exec(sr_job *job)
{
    job->children_exec = true;
    fcntl(job->seg.fd, F_SETFD, 0);
    for (int r = 0; r < job->n; r++)
        fcntl(job->eventfds[r], F_SETFD, 0);
}

/* What every attempt of the job needs (sr__job_run). */
struct attempt_ctx {
    const struct args *a;
    int sigfd;
    sigset_t child_mask; /* the caller's: workers start with it, not ours */
};

static int attempt(sr_job *job, void *p)
{
    struct attempt_ctx *c = p;
    job->child_mask = c->child_mask;
    job->replace_left = c->a->restart_rank ? c->a->max_restarts - job->spent : 0; /* one budget (job.h) */
    inherit_across_exec(job);
    /* SHMRPC_TRACE, SHMRPC_STATS: checked and set up before any worker starts (docs/PROFILING.md) */
    struct sr_trace_job *trace;
    if (sr__trace_job_begin(&trace, job->n, job->replace_left, job->restart, "shmrun"))
        return launcher_error(1, false);
    int status = run_job(job, c->a, c->sigfd, trace);
    sr__trace_job_end(trace); /* however the attempt ended: the trace and the statistics it left */
    return status;
}

int main(int argc, char **argv)
{
    fill_stdio();
    sr__log_set_role("shmrun"); /* the runtime's lines from this process say "shmrun: " */
    sr__log_pass_on();          /* a bad SHMRPC_LOG_LEVEL: warned here, once for the job */
    struct args a;
    int rc = parse_args(argc, argv, &a);
    if (rc)
        return rc == 1 ? 0 : rc;
    if (a.join) /* a worker for a job that runs: no segment, no supervision of our own */
        return join_job(&a);
    /* A SIGCHLD ignored by whoever started us would let the kernel reap the
     * workers before we read their status; shmrun owns its process, so take
     * the default back (workers then inherit it, as from a shell). */
    signal(SIGCHLD, SIG_DFL);
    /* What a worker starts and leaves comes back to us, not to init (sweep.h). */
    if (sweep_become_subreaper())
        return launcher_error(1, false);
    sigset_t old;
    int sigfd = make_sigfd(&old);
    if (sigfd < 0) /* without it the forwarded signals would stay blocked, unseen */
        return launcher_error(sr__fail(1, "shmrun", "signalfd: %s", strerror(errno)), false);
    bool elastic = a.max_workers > a.n;
    sr_segment_opts so = {.world_size = elastic ? a.max_workers : a.n, .launched = a.n, .size = a.shm_size,
                          .ring_slots = a.ring_slots, .name = a.prefix,
                          .flags = (a.restart_rank ? SR_SEG_F_REPLACE : 0) | (elastic ? SR_SEG_F_ELASTIC : 0),
                          .heap_spares = a.restart_rank ? sr__seg_replace_spares(a.max_restarts) : 0};
    struct attempt_ctx c = {.a = &a, .sigfd = sigfd, .child_mask = old};
    int status = sr__job_run(&so, "shmrun", a.max_restarts, attempt, &c);
    if (status < 0) /* the job could not be created */
        return status == -EINVAL ? launcher_error(2, true) : launcher_error(1, false);
    return status;
}
