/* SPDX-License-Identifier: MIT */
/* sr_spawn: the launcher's failure policy from inside a program.
 *
 * Workers attach, report "RANK PID\n" on a pipe created before sr_spawn (it
 * is inherited through fork), then sleep on their inbox until killed,
 * except the one chosen to fail, which first waits for a byte on the go
 * pipe. sr_spawn runs in its own thread, so that the test can watch the
 * workers while it blocks; it is the thread the workers' death signal is tied
 * to, and it outlives the job.
 *
 * Workers are forked copies of this test process: they must not call any
 * Criterion function (a forked assertion is a message to the runner from a pid
 * it does not know, and waits forever for a reply). They report problems
 * through their exit status instead.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "error.h"
#include "helpers/watch.h"
#include "helpers/pidfds.h"
#include "shmrpc/rpc.h"
#include "shmrpc/spawn.h"
#include "transport.h" /* the transport seam: workers join the job as sr_init would */

LEAK_CHECKED_SUITE(spawn);

enum mode { OK, EXIT, ABORT, BLOCK, ENV, RESTART };
enum { EXIT_ATTACH = 43, EXIT_IO = 44, EXIT_PIDFD = 45, EXIT_ENV = 46 };

struct job {
    enum mode mode;
    int fail_rank, code, n;
    int max_restarts;   /* sr_spawn_opts.max_restarts */
    int ready[2], go[2], done[2], err[2];
    int saved_stderr;
    struct stat stdin_st; /* the caller's stdin, which rank 0 keeps */
    struct ready seen;
    pthread_t thread;
    int rc;             /* sr_spawn's return */
    char error[512];    /* sr_last_error() of the spawning thread */
    char report[1024];  /* what sr_spawn printed on stderr */
    char ns[40];
};

static void wait_go(struct job *j)
{
    char c;
    if (read(j->go[0], &c, 1) != 1)
        _exit(EXIT_IO); /* the test went away */
}

static bool env_is(const char *name, int want)
{
    const char *v = getenv(name);
    char buf[16];
    snprintf(buf, sizeof(buf), "%d", want);
    return v && !strcmp(v, buf);
}

/* As under shmrun: torchrun's variables, and stdin for rank 0 only. */
static bool env_as_torchrun(const struct job *j, int rank, int n)
{
    struct stat st, null;
    if (!env_is("RANK", rank) || !env_is("LOCAL_RANK", rank) || !env_is("WORLD_SIZE", n) ||
        !env_is("LOCAL_WORLD_SIZE", n) || fstat(0, &st) || stat("/dev/null", &null))
        return false;
    const struct stat *want = rank ? &null : &j->stdin_st;
    return st.st_dev == want->st_dev && st.st_ino == want->st_ino && st.st_rdev == want->st_rdev;
}

/* The sleep's check after its doorbell announcement: a message waits. */
static bool inbox_pending(void *home)
{
    sr_tport *t = home;
    return t->ops->pending(t);
}

static int worker(int rank, int n, void *arg)
{
    struct job *j = arg;
    /* RESTART: attempts 0 .. code-1 fail (fail_rank kills itself), attempt
     * `code` returns 0; both counts name the attempt. */
    const char *count = getenv("SHMRPC_RESTART_COUNT");
    int attempt = count ? atoi(count) : -1;
    if (attempt < 0 || !env_is("SHMRPC_RESTART_COUNT", attempt) || !env_is("TORCHELASTIC_RESTART_COUNT", attempt) ||
        (j->mode != RESTART && attempt != 0))
        return EXIT_ENV;
    /* After a restart the test's own pidfds on the last attempt's workers
     * (helpers/watch.h) may still be open when this one is forked. */
    if (attempt == 0 && count_pidfds())
        return EXIT_PIDFD;
    if (j->mode == ENV && !env_as_torchrun(j, rank, n))
        return EXIT_ENV;
    sr_transports *x;
    if (sr__transport_open(&(struct sr_transport_opts){0}, &x))
        return EXIT_ATTACH;
    char line[32];
    int len = snprintf(line, sizeof(line), "%d %d\n", rank, (int)getpid());
    if (write(j->ready[1], line, (size_t)len) != len)
        return EXIT_IO;
    if (j->mode == OK || j->mode == ENV || (j->mode == RESTART && attempt >= j->code)) {
        sr__transport_close(x);
        return 0;
    }
    if (rank == j->fail_rank && j->mode != BLOCK) {
        wait_go(j);
        if (j->mode == ABORT) {
            prctl(PR_SET_DUMPABLE, 0); /* no core file */
            abort();
        }
        if (j->mode == RESTART)
            raise(SIGKILL);
        return j->code; /* the transport stays attached, as in a crash */
    }
    sr_tport *home = sr__transport_home(x);
    for (;;)
        if (home->ops->wake->sleep(home, -1, inbox_pending, home) < 0)
            return EXIT_IO;
}

static void *spawn_thread(void *p)
{
    struct job *j = p;
    sr_spawn_opts o = {.shm_size = 64u << 20, .ring_slots = 64, .name_prefix = j->ns, .max_restarts = j->max_restarts};
    j->rc = sr_spawn(j->n, worker, j, &o);
    snprintf(j->error, sizeof(j->error), "%s", sr_last_error());
    close(j->done[1]);
    return NULL;
}

static void make_pipe(int p[2]) { cr_assert_eq(pipe2(p, O_CLOEXEC), 0, "pipe2: %s", strerror(errno)); }

/* Start sr_spawn in a thread with stderr captured. */
static void start_max(struct job *j, const char *test, int n, enum mode mode, int fail_rank, int code, int max_restarts)
{
    *j = (struct job){.mode = mode, .fail_rank = fail_rank, .code = code, .n = n, .max_restarts = max_restarts};
    cr_assert_eq(fstat(0, &j->stdin_st), 0, "fstat(stdin): %s", strerror(errno));
    snprintf(j->ns, sizeof(j->ns), "%s", test_ns(test));
    make_pipe(j->ready), make_pipe(j->go), make_pipe(j->done), make_pipe(j->err);
    fcntl(j->err[0], F_SETFL, O_NONBLOCK);
    fcntl(j->ready[0], F_SETFL, O_NONBLOCK);
    ready_init(&j->seen, j->ready[0]);
    fflush(stderr);
    j->saved_stderr = dup(2);
    cr_assert_eq(dup2(j->err[1], 2), 2, "dup2: %s", strerror(errno));
    cr_assert_eq(pthread_create(&j->thread, NULL, spawn_thread, j), 0);
}

static void start(struct job *j, const char *test, int n, enum mode mode, int fail_rank, int code)
{
    start_max(j, test, n, mode, fail_rank, code, 0);
}

/* RESTART mode: rank 1 fails `fails` times; sr_spawn may restart max times. */
static void start_restarting(struct job *j, const char *test, int n, int max, int fails)
{
    start_max(j, test, n, RESTART, 1, fails, max);
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

static bool returned(struct job *j)
{
    struct pollfd p = {.fd = j->done[0], .events = POLLIN};
    return poll(&p, 1, 0) == 1;
}

static void await_return(struct job *j);

/* Every worker has reported ready (bounded), and sr_spawn has not returned. */
static void await_ready(struct job *j)
{
    int64_t deadline = watch_now_ms() + WATCH_WAIT_MS;
    while (j->seen.n < j->n && !returned(j)) {
        int64_t left = deadline - watch_now_ms();
        cr_assert_gt(left, 0, "%d of %d workers reported ready within %d ms", j->seen.n, j->n, WATCH_WAIT_MS);
        struct pollfd p[2] = {{.fd = j->ready[0], .events = POLLIN}, {.fd = j->done[0], .events = POLLIN}};
        poll(p, 2, (int)left);
        ready_feed(&j->seen);
    }
    ready_feed(&j->seen); /* lines written before sr_spawn returned */
    if (j->seen.n < j->n) {
        await_return(j);
        cr_assert_fail("sr_spawn returned %d after %d of %d workers reported ready: %s", j->rc, j->seen.n, j->n, j->error);
    }
}

/* sr_spawn has returned (bounded); restore stderr and collect its report. */
static void await_return(struct job *j)
{
    struct pollfd p = {.fd = j->done[0], .events = POLLIN};
    cr_assert_eq(poll(&p, 1, WATCH_WAIT_MS), 1, "sr_spawn did not return within %d ms", WATCH_WAIT_MS);
    pthread_join(j->thread, NULL);
    dup2(j->saved_stderr, 2);
    close(j->saved_stderr), close(j->err[1]);
    ssize_t got = read(j->err[0], j->report, sizeof(j->report) - 1);
    j->report[got > 0 ? got : 0] = 0;
    ready_feed(&j->seen);
}

static void finish(struct job *j)
{
    ready_fini(&j->seen);
    close(j->ready[1]), close(j->go[0]), close(j->go[1]), close(j->done[0]), close(j->err[0]);
}

/* -SR_EWORKER, the report in sr_last_error() and once on stderr (after the
 * log's "pid N: "), every worker gone, the segment gone. */
static void assert_taken_down(struct job *j, int rank, const char *what)
{
    await_return(j);
    cr_assert_eq(j->rc, -SR_EWORKER, "sr_spawn returned %d (%s)", j->rc, j->error);
    char want[160];
    snprintf(want, sizeof(want), "sr_spawn: rank %d (pid %d) %s", rank, (int)j->seen.pid[rank], what);
    cr_assert(!strncmp(j->error, want, strlen(want)), "sr_last_error() is '%s', expected '%s...'", j->error, want);
    char tail[64];
    snprintf(tail, sizeof(tail), "; stopped the other %d workers", j->n - 1);
    cr_assert(strstr(j->error, tail), "sr_last_error() '%s' does not end with '%s'", j->error, tail);
    char line[600];
    snprintf(line, sizeof(line), "pid %d: %s\n", (int)getpid(), j->error); /* the log names the process */
    cr_assert_str_eq(j->report, line, "stderr should hold the report once");
    assert_workers_gone(&j->seen, j->n);
    assert_segment_gone(j->ns);
}

Test(spawn, all_workers_return_0)
{
    struct job j;
    start(&j, "ok", 4, OK, -1, 0);
    await_ready(&j);
    await_return(&j);
    cr_assert_eq(j.rc, 0, "sr_spawn returned %d: %s", j.rc, j.error);
    cr_assert_str_empty(j.report, "a clean job printed: %s", j.report);
    assert_workers_gone(&j.seen, 4);
    assert_segment_gone(j.ns);
    finish(&j);
}

/* Consistent with shmrun: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
 * and stdin for rank 0 only (the others read /dev/null). */
Test(spawn, workers_see_torchrun_variables_and_only_rank_0_the_stdin)
{
    /* A pipe as our stdin: under meson it may be /dev/null already. */
    int in[2], saved = dup(0);
    make_pipe(in);
    cr_assert_eq(dup2(in[0], 0), 0, "dup2: %s", strerror(errno));
    struct job j;
    start(&j, "env", 3, ENV, -1, 0);
    await_ready(&j);
    await_return(&j);
    dup2(saved, 0);
    close(saved), close(in[0]), close(in[1]);
    cr_assert_eq(j.rc, 0, "sr_spawn returned %d: %s", j.rc, j.error);
    finish(&j);
}

Test(spawn, a_worker_returning_3_takes_the_job_down)
{
    struct job j;
    start(&j, "ret3", 4, EXIT, 2, 3);
    await_ready(&j);
    cr_assert_neq(segment_holder(j.ns), 0, "the leak scan cannot see memfd:%s while the job runs", j.ns);
    cr_assert_eq(write(j.go[1], "g", 1), 1);
    assert_taken_down(&j, 2, "exited with status 3");
    finish(&j);
}

Test(spawn, a_worker_calling_abort_takes_the_job_down)
{
    struct job j;
    start(&j, "abort", 4, ABORT, 0, 0);
    await_ready(&j);
    cr_assert_eq(write(j.go[1], "g", 1), 1);
    assert_taken_down(&j, 0, "was killed by signal SIGABRT");
    finish(&j);
}

Test(spawn, a_worker_killed_by_sigkill_takes_the_job_down)
{
    struct job j;
    start(&j, "sigkill", 3, BLOCK, -1, 0);
    await_ready(&j);
    cr_assert_eq(kill(j.seen.pid[1], SIGKILL), 0, "kill: %s", strerror(errno));
    assert_taken_down(&j, 1, "was killed by signal SIGKILL");
    finish(&j);
}

/* An attempt that fails: every worker reported ready, fail_rank is let go
 * (it SIGKILLs itself), every worker of the attempt is gone; the readiness
 * table is cleared for the next attempt. Returns the failed worker's pid. */
static pid_t failed_attempt(struct job *j)
{
    await_ready(j);
    pid_t pid = j->seen.pid[j->fail_rank];
    cr_assert_eq(write(j->go[1], "g", 1), 1);
    for (int rank = 0; rank < j->n; rank++) {
        int fd = j->seen.pidfd[rank];
        cr_assert(fd < 0 || pidfd_exited(fd, WATCH_WAIT_MS), "rank %d still runs %d ms after rank %d died", rank,
                  WATCH_WAIT_MS, j->fail_rank);
        if (fd >= 0)
            close(fd);
        j->seen.pidfd[rank] = -1;
        j->seen.pid[rank] = 0;
    }
    j->seen.n = 0;
    return pid;
}

Test(spawn, max_restarts_starts_the_job_again_after_a_worker_is_killed)
{
    struct job j;
    start_restarting(&j, "restarts", 3, 2, 2);
    pid_t dead[2] = {failed_attempt(&j), failed_attempt(&j)};
    await_ready(&j);
    await_return(&j);
    cr_assert_eq(j.rc, 0, "sr_spawn returned %d: %s", j.rc, j.error);
    char want[400];
    snprintf(want, sizeof(want),
             "pid %d: sr_spawn: rank 1 (pid %d) was killed by signal SIGKILL; restarting the job (restart 1 of 2)\n"
             "pid %d: sr_spawn: rank 1 (pid %d) was killed by signal SIGKILL; restarting the job (restart 2 of 2)\n",
             (int)getpid(), (int)dead[0], (int)getpid(), (int)dead[1]);
    cr_assert_str_eq(j.report, want);
    assert_workers_gone(&j.seen, 3);
    assert_segment_gone(j.ns);
    finish(&j);
}

Test(spawn, max_restarts_spent_the_last_failure_takes_the_job_down)
{
    struct job j;
    start_restarting(&j, "spent", 3, 1, 2);
    failed_attempt(&j);
    await_ready(&j);
    cr_assert_eq(write(j.go[1], "g", 1), 1);
    await_return(&j);
    cr_assert_eq(j.rc, -SR_EWORKER, "sr_spawn returned %d (%s)", j.rc, j.error);
    cr_assert(strstr(j.error, "was killed by signal SIGKILL; stopped the other 2 workers"), "%s", j.error);
    cr_assert_eq(count_lines(j.report), 2, "one restart line, one report: %s", j.report);
    assert_workers_gone(&j.seen, 3);
    assert_segment_gone(j.ns);
    finish(&j);
}

Test(spawn, a_worker_returning_3_is_not_restarted)
{
    struct job j;
    start_max(&j, "ret3restart", 4, EXIT, 2, 3, 2);
    await_ready(&j);
    cr_assert_eq(write(j.go[1], "g", 1), 1);
    assert_taken_down(&j, 2, "exited with status 3");
    finish(&j);
}

/* One strict syntax for numbers in the environment too (shm/base/parse.h): each
 * bad SHMRPC_SPIN_NS makes sr_init fail, naming the variable and the value
 * (it used to be read with atoll: " 3", "+3" and "" passed, "x" meant 0). */
static int bad_spin_env(int rank, int n, void *arg)
{
    (void)rank, (void)n;
    const char *v = arg;
    setenv("SHMRPC_SPIN_NS", v, 1);
    int rc = sr_init(NULL);
    char want[96];
    snprintf(want, sizeof(want), "environment SHMRPC_SPIN_NS=\"%s\" is not an integer in [0, ", v);
    if (rc == -EINVAL && strstr(sr_last_error(), want))
        return 0;
    fprintf(stderr, "SHMRPC_SPIN_NS=\"%s\": sr_init gave %d: %s\n", v, rc, sr_last_error());
    if (!rc)
        sr_shutdown(false, 0);
    return 1;
}

Test(spawn, bad_numbers_in_the_environment_are_refused_by_name)
{
    static const char *const bad[] = {" 3", "3 ", "", "+3", "-3", "0x10", "3k", "99999999999999999999"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        sr_spawn_opts o = {.name_prefix = test_ns("badenv"), .shm_size = 64u << 20};
        int rc = sr_spawn(1, bad_spin_env, (void *)bad[i], &o);
        cr_assert_eq(rc, 0, "SHMRPC_SPIN_NS=\"%s\" was not refused by name: %s", bad[i], sr_last_error());
    }
}

Test(spawn, bad_arguments_are_einval)
{
    cr_assert_eq(sr_spawn(0, worker, NULL, NULL), -EINVAL, "%s", sr_last_error());
    cr_assert(strstr(sr_last_error(), "world size 0"), "%s", sr_last_error());
    cr_assert_eq(sr_spawn(2, NULL, NULL, NULL), -EINVAL, "%s", sr_last_error());
    cr_assert(strstr(sr_last_error(), "fn is NULL"), "%s", sr_last_error());
    sr_spawn_opts o = {.ring_slots = 3};
    cr_assert_eq(sr_spawn(2, worker, NULL, &o), -EINVAL, "%s", sr_last_error());
    cr_assert(strstr(sr_last_error(), "ring size 3"), "%s", sr_last_error());
}

static int returns_0(int rank, int n, void *arg)
{
    (void)rank, (void)n, (void)arg;
    return 0;
}

/* Which descriptors below `limit` are open; returns how many are free. */
static int open_fds(bool *open, int limit)
{
    int free_slots = 0;
    for (int fd = 0; fd < limit; fd++) {
        open[fd] = fcntl(fd, F_GETFD) != -1;
        free_slots += !open[fd];
    }
    return free_slots;
}

enum { FD_LIMIT = 64 };

/* sr_spawn(n) with descriptors limited to FD_LIMIT; returns its result and
 * copies sr_last_error() to err. */
static int spawn_with_fd_limit(int n, char *err, size_t len)
{
    struct rlimit old, low;
    getrlimit(RLIMIT_NOFILE, &old);
    low = (struct rlimit){.rlim_cur = FD_LIMIT, .rlim_max = old.rlim_max};
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &low), 0, "setrlimit: %s", strerror(errno));
    sr_spawn_opts o = {.shm_size = 512u << 20, .ring_slots = 2, .name_prefix = test_ns("emfile")};
    int rc = sr_spawn(n, returns_0, NULL, &o);
    snprintf(err, len, "%s", sr_last_error());
    setrlimit(RLIMIT_NOFILE, &old);
    return rc;
}

Test(spawn, running_out_of_descriptors_fails_cleanly)
{
    /* Regression: when the eventfd of some rank failed, the cleanup closed
     * the never-opened slots of the later ranks (uninitialised memory,
     * often 0: the caller's stdin). The memfd and free - 1 eventfds fit;
     * the ranks past that have no descriptor left. */
    bool before[FD_LIMIT], after[FD_LIMIT];
    int free_slots = open_fds(before, FD_LIMIT);
    cr_assert_geq(free_slots, 4, "only %d free descriptors below %d", free_slots, FD_LIMIT);
    char err[512];
    int rc = spawn_with_fd_limit(free_slots + 8, err, sizeof(err));
    cr_assert_eq(rc, -EMFILE, "sr_spawn returned %d (%s), expected -EMFILE", rc, err);
    char want[64];
    snprintf(want, sizeof(want), "eventfd for rank %d", free_slots - 1);
    cr_assert(strstr(err, want), "'%s' does not name '%s'", err, want);
    open_fds(after, FD_LIMIT);
    for (int fd = 0; fd < FD_LIMIT; fd++)
        cr_assert_eq(after[fd], before[fd], "fd %d was %s before sr_spawn and is %s after", fd,
                     before[fd] ? "open" : "closed", after[fd] ? "open" : "closed");
}

Test(spawn, a_failed_pidfd_open_leaves_no_worker_behind)
{
    /* Regression: a worker forked but without a pidfd could be neither
     * killed nor reaped by sr__job_stop. The memfd, n eventfds and rank 0's
     * pidfd fit; rank 1's pidfd does not. */
    bool open[FD_LIMIT];
    int n = open_fds(open, FD_LIMIT) - 2;
    cr_assert_geq(n, 2, "too few free descriptors below %d", FD_LIMIT);
    char err[512];
    int rc = spawn_with_fd_limit(n, err, sizeof(err));
    cr_assert_eq(rc, -EMFILE, "sr_spawn returned %d (%s), expected -EMFILE", rc, err);
    cr_assert(strstr(err, "pidfd_open") && strstr(err, "rank 1"), "'%s' does not name pidfd_open of rank 1", err);
    int st;
    errno = 0;
    pid_t left = waitpid(-1, &st, WNOHANG);
    cr_assert(left == -1 && errno == ECHILD, "sr_spawn left a child behind (waitpid: %d, %s)", (int)left,
              strerror(errno));
}

static int returns_3(int rank, int n, void *arg)
{
    (void)n, (void)arg;
    return rank == 0 ? 3 : 0;
}

/* Regression: with SIGCHLD ignored the kernel reaped the workers, waitid()
 * failed, and the supervisor waited forever on a pidfd it no longer watched. */
Test(spawn, sigchld_ignored_is_refused, .timeout = 30)
{
    signal(SIGCHLD, SIG_IGN);
    sr_spawn_opts o = {.shm_size = 64u << 20, .ring_slots = 64, .name_prefix = test_ns("sigchld")};
    int rc = sr_spawn(2, returns_3, NULL, &o);
    cr_assert_eq(rc, -EINVAL, "sr_spawn returned %d (%s)", rc, sr_last_error());
    cr_assert(strstr(sr_last_error(), "SIGCHLD is ignored"), "%s", sr_last_error());
    struct sigaction sa = {.sa_handler = SIG_DFL, .sa_flags = SA_NOCLDWAIT};
    sigaction(SIGCHLD, &sa, NULL);
    cr_assert_eq(sr_spawn(2, returns_3, NULL, &o), -EINVAL, "SA_NOCLDWAIT: %s", sr_last_error());
    signal(SIGCHLD, SIG_DFL);
    cr_assert_eq(sr_spawn(2, returns_3, NULL, &o), -SR_EWORKER, "%s", sr_last_error());
}
