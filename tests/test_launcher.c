/* shmrun, end to end: the launch contract, the failure policy, signals and
 * the command line.
 *
 * Each test runs the real shmrun (SHMRUN) on tests/helpers/worker_prog.c
 * (WORKER_PROG). shmrun gets exactly five descriptors: stdin, a stdout pipe,
 * a stderr pipe, the readiness pipe (fd 3) and the go pipe (fd 4); workers
 * inherit them. Nothing here sleeps: the test waits on the readiness pipe,
 * on pidfds and on end-of-file of the pipes, always with a bound.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "helpers/watch.h"

LEAK_CHECKED_SUITE(launcher);
LEAK_CHECKED_SUITE(launcher_usage);

#define READY_FD "3"
#define GO_FD "4"
#define EXIT_ENV 41 /* worker_prog: the launch contract is broken */

struct run {
    pid_t pid;
    int pidfd;
    int out_fd, err_fd, go_fd; /* the test's ends */
    struct ready ready;
    char out[4096], err[16384];
    size_t out_len, err_len;
    bool out_eof, err_eof;
    int status; /* wait status, once reaped */
    char ns[40];
};

static const char *env_path(const char *var)
{
    const char *p = getenv(var);
    cr_assert(p && *p, "%s is not set: run this test through meson", var);
    return p;
}

/* Move a pipe end above the descriptors the child rebuilds, so that the
 * dup2()s below never overwrite one another. */
static int high_fd(int fd)
{
    int hi = fcntl(fd, F_DUPFD_CLOEXEC, 10);
    cr_assert(hi >= 0, "F_DUPFD_CLOEXEC: %s", strerror(errno));
    close(fd);
    return hi;
}

static void make_pipe(int p[2])
{
    cr_assert_eq(pipe2(p, O_CLOEXEC), 0, "pipe2: %s", strerror(errno));
    p[0] = high_fd(p[0]);
    p[1] = high_fd(p[1]);
}

/* In the child: the five descriptors, nothing else; default signal
 * dispositions (a test runner may ignore SIGINT, and workers inherit that
 * through exec); die with the test. */
static bool ignore_sigchld; /* start shmrun with SIGCHLD ignored */

static void exec_shmrun(int out, int err, int ready, int go, char **argv)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    signal(SIGINT, SIG_DFL), signal(SIGTERM, SIG_DFL), signal(SIGPIPE, SIG_DFL);
    signal(SIGCHLD, ignore_sigchld ? SIG_IGN : SIG_DFL);
    if (dup2(out, 1) < 0 || dup2(err, 2) < 0 || dup2(ready, 3) < 0 || dup2(go, 4) < 0)
        _exit(126);
    close_range(5, ~0u, 0);
    execv(argv[0], argv);
    _exit(127);
}

static void start(struct run *r, const char *test, char **args)
{
    char *argv[32] = {(char *)env_path("SHMRUN")};
    for (int i = 0; args[i]; i++) {
        cr_assert_lt(i, 30, "too many arguments");
        argv[i + 1] = args[i];
    }
    int out[2], err[2], ready[2], go[2];
    make_pipe(out), make_pipe(err), make_pipe(ready), make_pipe(go);
    /* No Criterion call in the child: with --full-stats even a passing
     * assertion is a message to the runner, which waits forever for a reply
     * addressed to a pid it does not know. */
    pid_t pid = fork();
    if (pid == 0)
        exec_shmrun(out[1], err[1], ready[1], go[0], argv);
    cr_assert(pid > 0, "fork: %s", strerror(errno));
    *r = (struct run){.pid = pid};
    close(out[1]), close(err[1]), close(ready[1]), close(go[0]);
    r->out_fd = out[0], r->err_fd = err[0], r->go_fd = go[1];
    ready_init(&r->ready, ready[0]);
    fcntl(r->out_fd, F_SETFL, O_NONBLOCK);
    fcntl(r->err_fd, F_SETFL, O_NONBLOCK);
    fcntl(r->ready.fd, F_SETFL, O_NONBLOCK);
    r->pidfd = watch_pidfd_open(r->pid);
    cr_assert(r->pidfd >= 0, "pidfd_open(shmrun): %s", strerror(errno));
    snprintf(r->ns, sizeof(r->ns), "%s", test);
}

/* Read what is there; past the buffer's end output is read and dropped. */
static void drain(int fd, char *buf, size_t cap, size_t *len, bool *eof)
{
    char sink[512];
    for (;;) {
        size_t room = cap - 1 - *len;
        ssize_t got = room ? read(fd, buf + *len, room) : read(fd, sink, sizeof(sink));
        if (got == 0)
            *eof = true;
        if (got <= 0)
            break;
        if (room)
            *len += (size_t)got;
    }
    buf[*len] = 0;
}

/* One round: wait up to ms for output or for shmrun to exit, then read it all. */
static void pump(struct run *r, int ms)
{
    struct pollfd p[4] = {{.fd = r->out_eof ? -1 : r->out_fd, .events = POLLIN},
                          {.fd = r->err_eof ? -1 : r->err_fd, .events = POLLIN},
                          {.fd = r->ready.eof ? -1 : r->ready.fd, .events = POLLIN},
                          {.fd = r->pid ? r->pidfd : -1, .events = POLLIN}};
    poll(p, 4, ms);
    if (!r->out_eof)
        drain(r->out_fd, r->out, sizeof(r->out), &r->out_len, &r->out_eof);
    if (!r->err_eof)
        drain(r->err_fd, r->err, sizeof(r->err), &r->err_len, &r->err_eof);
    if (!r->ready.eof)
        ready_feed(&r->ready);
}

static bool shmrun_exited(struct run *r) { return !r->pid || pidfd_exited(r->pidfd, 0); }
static bool all_pipes_closed(struct run *r) { return r->out_eof && r->err_eof && r->ready.eof; }

/* Pump until done(r) or the bound passes; false on timeout. */
static bool pump_until(struct run *r, bool (*done)(struct run *))
{
    int64_t deadline = watch_now_ms() + WATCH_WAIT_MS;
    while (!done(r)) {
        int64_t left = deadline - watch_now_ms();
        if (left <= 0)
            return false;
        pump(r, (int)left);
    }
    return true;
}

static int want_ready;
static bool all_ready(struct run *r) { return r->ready.n >= want_ready || r->ready.eof; }

static void await_ready(struct run *r, int n)
{
    want_ready = n;
    bool ok = pump_until(r, all_ready);
    cr_assert(ok && r->ready.n == n, "%d of %d workers reported ready within %d ms%s; shmrun stderr:\n%s", r->ready.n,
              n, WATCH_WAIT_MS, r->ready.eof ? " (all closed the readiness pipe)" : "", r->err);
}

/* Wait for shmrun to exit, reap it, then for every process holding its pipes
 * (the workers) to be gone: end-of-file on all of them. */
static int await_exit(struct run *r)
{
    cr_assert(pump_until(r, shmrun_exited), "shmrun (pid %d) did not exit within %d ms; stderr so far:\n%s", r->pid,
              WATCH_WAIT_MS, r->err);
    cr_assert_eq(waitpid(r->pid, &r->status, 0), r->pid, "waitpid(shmrun): %s", strerror(errno));
    r->pid = 0;
    cr_assert(pump_until(r, all_pipes_closed), "shmrun exited but its pipes stayed open %d ms: workers survived it",
              WATCH_WAIT_MS);
    return r->status;
}

static void finish(struct run *r)
{
    ready_fini(&r->ready);
    close(r->out_fd), close(r->err_fd), close(r->go_fd), close(r->pidfd);
}

static void go(struct run *r)
{
    cr_assert_eq(write(r->go_fd, "g", 1), 1, "write to the go pipe: %s", strerror(errno));
}

static int exit_code(int status)
{
    cr_assert(WIFEXITED(status), "shmrun did not exit normally (wait status 0x%x)", status);
    return WEXITSTATUS(status);
}

/* shmrun -n N --name-prefix NS --shm-size 64M -- worker_prog 3 4 N mode... */
static void start_job(struct run *r, const char *test, int n, const char *m0, const char *m1, const char *m2)
{
    static char nbuf[8];
    snprintf(nbuf, sizeof(nbuf), "%d", n);
    const char *ns = test_ns(test);
    char *args[] = {"-n", nbuf, "--name-prefix", (char *)ns, "--shm-size", "64M", "--", (char *)env_path("WORKER_PROG"),
                    READY_FD, GO_FD, nbuf, (char *)m0, (char *)m1, (char *)m2, NULL};
    start(r, ns, args);
}

/* stderr is exactly one report line: "shmrun: rank R (pid P) WHAT; stopped the other K workers". */
static void assert_report(const struct run *r, int rank, const char *what, int others)
{
    char head[160], tail[64];
    snprintf(head, sizeof(head), "shmrun: rank %d (pid %d) %s", rank, (int)r->ready.pid[rank], what);
    snprintf(tail, sizeof(tail), "; stopped the other %d worker%s\n", others, others == 1 ? "" : "s");
    const char *nl = strchr(r->err, '\n');
    cr_assert(nl && nl[1] == 0, "expected exactly one line on stderr, got:\n%s", r->err);
    size_t hl = strlen(head), tl = strlen(tail);
    cr_assert(r->err_len >= hl + tl && !strncmp(r->err, head, hl) && !strcmp(r->err + r->err_len - tl, tail),
              "report line is '%s', expected '%s...%s'", r->err, head, tail);
    const char *middle = r->err + hl;
    size_t ml = r->err_len - hl - tl;
    cr_assert(ml == 0 || (ml == strlen(" (core dumped)") && !strncmp(middle, " (core dumped)", ml)),
              "unexpected text in the report line '%s'", r->err);
}

/* After a failure: a report, every worker gone, the segment gone. */
static void assert_taken_down(struct run *r, int n, int rank, const char *what, int code)
{
    int st = await_exit(r);
    cr_assert_eq(exit_code(st), code, "shmrun exit status %d, expected %d; stderr:\n%s", exit_code(st), code, r->err);
    assert_report(r, rank, what, n - 1);
    assert_workers_gone(&r->ready, n);
    assert_segment_gone(r->ns);
}

/* While the job runs, the scan that proves the segment gone must find it. */
static void assert_segment_held(const struct run *r)
{
    cr_assert_neq(segment_holder(r->ns), 0, "the leak scan cannot see memfd:%s while the job runs", r->ns);
}

Test(launcher, clean_exit_of_4_workers)
{
    struct run r;
    start_job(&r, "clean", 4, "ok", NULL, NULL);
    await_ready(&r, 4);
    cr_assert_eq(exit_code(await_exit(&r)), 0, "shmrun failed; stderr:\n%s", r.err);
    cr_assert_eq(r.err_len, 0, "a clean job printed on stderr:\n%s", r.err);
    assert_workers_gone(&r.ready, 4);
    assert_segment_gone(r.ns);
    finish(&r);
}

/* Regression: a rank that exited (status 0) before attaching made the others
 * wait 60 s in the start barrier, though shmrun knew at once. Now shmrun
 * publishes the exit and wakes the barrier: their attach fails at once,
 * naming the rank (worker_prog checks the error), well within the bound. */
Test(launcher, a_rank_exiting_before_attach_fails_the_others_at_once)
{
    struct run r;
    start_job(&r, "early", 3, "early", "1", NULL);
    int64_t t0 = watch_now_ms();
    int st = await_exit(&r);
    cr_assert_eq(exit_code(st), 0, "shmrun exit status %d; stderr:\n%s", exit_code(st), r.err);
    cr_assert_eq(r.err_len, 0, "the job printed on stderr:\n%s", r.err);
    cr_assert_lt(watch_now_ms() - t0, WATCH_WAIT_MS, "the job took %lld ms", (long long)(watch_now_ms() - t0));
    assert_segment_gone(r.ns);
    finish(&r);
}

Test(launcher, worker_abort_takes_the_job_down)
{
    struct run r;
    start_job(&r, "abort", 4, "abort", "2", NULL);
    await_ready(&r, 4);
    assert_segment_held(&r);
    go(&r);
    assert_taken_down(&r, 4, 2, "was killed by signal SIGABRT", 128 + SIGABRT);
    finish(&r);
}

/* A worker that dies of a signal while serving a call: shmrun's report
 * names the function and the caller, read from the worker's segment slot. */
Test(launcher, crash_report_names_the_call_being_served)
{
    struct run r;
    start_job(&r, "serving", 2, "serving", "1", NULL);
    await_ready(&r, 2);
    go(&r);
    int st = await_exit(&r);
    cr_assert_eq(exit_code(st), 128 + SIGABRT, "shmrun exit status %d; stderr:\n%s", exit_code(st), r.err);
    char want[200];
    snprintf(want, sizeof(want), "shmrun: rank 1 (pid %d) was killed by signal SIGABRT while serving 'train_step' "
                                 "from worker0; stopped the other 1 worker\n", (int)r.ready.pid[1]);
    cr_assert_str_eq(r.err, want);
    assert_workers_gone(&r.ready, 2);
    assert_segment_gone(r.ns);
    finish(&r);
}

Test(launcher, worker_exit_3_takes_the_job_down)
{
    struct run r;
    start_job(&r, "exit3", 4, "exit", "1", "3");
    await_ready(&r, 4);
    assert_segment_held(&r);
    go(&r);
    assert_taken_down(&r, 4, 1, "exited with status 3", 3);
    finish(&r);
}

Test(launcher, worker_sigkill_takes_the_job_down)
{
    struct run r;
    start_job(&r, "sigkill", 4, "block", NULL, NULL);
    await_ready(&r, 4);
    assert_segment_held(&r);
    cr_assert_eq(kill(r.ready.pid[3], SIGKILL), 0, "kill(rank 3): %s", strerror(errno));
    assert_taken_down(&r, 4, 3, "was killed by signal SIGKILL", 128 + SIGKILL);
    finish(&r);
}

Test(launcher, a_real_time_signal_is_reported_by_number)
{
    /* sigabbrev_np() has no name for these: the report used to say "SIG?". */
    int sig = SIGRTMIN + 6;
    char what[64];
    snprintf(what, sizeof(what), "was killed by signal %d", sig);
    struct run r;
    start_job(&r, "sigrt", 2, "block", NULL, NULL);
    await_ready(&r, 2);
    cr_assert_eq(kill(r.ready.pid[0], sig), 0, "kill(rank 0): %s", strerror(errno));
    assert_taken_down(&r, 2, 0, what, 128 + sig);
    finish(&r);
}

/* The forwarded signal kills every worker; the first one reaped is reported. */
static void assert_signal_forwarded(int sig, const char *test, const char *name)
{
    struct run r;
    start_job(&r, test, 3, "block", NULL, NULL);
    await_ready(&r, 3);
    cr_assert_eq(kill(r.pid, sig), 0, "kill(shmrun): %s", strerror(errno));
    int st = await_exit(&r);
    cr_assert_eq(exit_code(st), 128 + sig, "shmrun exit status %d; stderr:\n%s", exit_code(st), r.err);
    int rank = -1;
    cr_assert_eq(sscanf(r.err, "shmrun: rank %d ", &rank), 1, "no report line; stderr:\n%s", r.err);
    cr_assert(rank >= 0 && rank < 3, "report names rank %d", rank);
    char what[64];
    snprintf(what, sizeof(what), "was killed by signal %s", name);
    assert_report(&r, rank, what, 2);
    assert_workers_gone(&r.ready, 3);
    assert_segment_gone(r.ns);
    finish(&r);
}

/* Regression: started with SIGCHLD ignored, shmrun's workers were reaped by
 * the kernel, waitid() failed and shmrun waited forever. */
Test(launcher, a_sigchld_ignored_by_the_caller_changes_nothing)
{
    struct run r;
    ignore_sigchld = true;
    start_job(&r, "sigchld", 3, "exit", "0", "3");
    ignore_sigchld = false;
    await_ready(&r, 3);
    go(&r);
    assert_taken_down(&r, 3, 0, "exited with status 3", 3);
    finish(&r);
}

Test(launcher, sigterm_is_forwarded_to_the_workers) { assert_signal_forwarded(SIGTERM, "sigterm", "SIGTERM"); }
Test(launcher, sigint_is_forwarded_to_the_workers) { assert_signal_forwarded(SIGINT, "sigint", "SIGINT"); }

Test(launcher, workers_die_with_shmrun)
{
    /* Orphaned workers come to us, so that we can reap them and check ESRCH. */
    cr_assert_eq(prctl(PR_SET_CHILD_SUBREAPER, 1), 0, "PR_SET_CHILD_SUBREAPER: %s", strerror(errno));
    struct run r;
    start_job(&r, "pdeath", 4, "block", NULL, NULL);
    await_ready(&r, 4);
    cr_assert_eq(kill(r.pid, SIGKILL), 0, "kill(shmrun): %s", strerror(errno));
    int64_t deadline = watch_now_ms() + WATCH_WAIT_MS;
    for (int rank = 0; rank < 4; rank++) {
        int64_t left = deadline - watch_now_ms();
        cr_assert(pidfd_exited(r.ready.pidfd[rank], left > 0 ? (int)left : 0),
                  "rank %d (pid %d) outlived shmrun by %d ms: PR_SET_PDEATHSIG is not armed", rank, r.ready.pid[rank],
                  WATCH_WAIT_MS);
        waitpid(r.ready.pid[rank], NULL, 0); /* ours now, as the subreaper */
    }
    int st = await_exit(&r);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "shmrun wait status 0x%x", st);
    cr_assert_eq(r.err_len, 0, "a killed shmrun has nothing to report, got:\n%s", r.err);
    assert_workers_gone(&r.ready, 4);
    assert_segment_gone(r.ns);
    finish(&r);
}

Test(launcher, workers_see_their_rank_world_size_and_segment)
{
    /* worker_prog checks SHMRPC_RANK/WORLD_SIZE/FD and its descriptors, and
     * exits EXIT_ENV otherwise; await_ready checks the ranks are 0..2, once each. */
    struct run r;
    start_job(&r, "env", 3, "ok", NULL, NULL);
    await_ready(&r, 3);
    cr_assert_eq(exit_code(await_exit(&r)), 0, "shmrun failed; stderr:\n%s", r.err);
    for (int i = 0; i < 3; i++)
        for (int j = i + 1; j < 3; j++)
            cr_assert_neq(r.ready.pid[i], r.ready.pid[j], "ranks %d and %d share pid %d", i, j, r.ready.pid[i]);
    finish(&r);
}

Test(launcher, a_worker_that_sees_the_wrong_world_size_fails)
{
    /* The negative control of the test above: worker_prog's checks can fail. */
    struct run r;
    const char *ns = test_ns("envbad");
    char *args[] = {"-n", "2", "--name-prefix", (char *)ns, "--shm-size", "64M", (char *)env_path("WORKER_PROG"),
                    READY_FD, GO_FD, "5", "ok", NULL};
    start(&r, ns, args);
    int st = await_exit(&r);
    cr_assert_eq(exit_code(st), EXIT_ENV, "shmrun exit status %d; stderr:\n%s", exit_code(st), r.err);
    cr_assert(strstr(r.err, "exited with status 41"), "no report of the failed check:\n%s", r.err);
    cr_assert_eq(r.ready.n, 0, "a worker with the wrong world size reported ready");
    finish(&r);
}

/* exit 2, one error line naming `names`, the usage hint, no worker started. */
static void assert_bad_usage(char **args, const char *names)
{
    struct run r;
    start(&r, test_ns("usage"), args);
    int st = await_exit(&r);
    cr_assert_eq(exit_code(st), 2, "exit status %d, expected 2; stderr:\n%s", exit_code(st), r.err);
    const char *nl = strchr(r.err, '\n');
    cr_assert(nl && !strncmp(r.err, "shmrun: ", 8), "no error line; stderr:\n%s", r.err);
    cr_assert(!strcmp(nl + 1, "Try 'shmrun --help' for usage.\n"), "expected one error line and the usage hint, got:\n%s",
              r.err);
    cr_assert(memmem(r.err, (size_t)(nl - r.err), names, strlen(names)), "the error line does not name '%s':\n%s",
              names, r.err);
    cr_assert_eq(r.ready.n, 0, "a worker started despite the bad command line");
    assert_segment_gone(r.ns);
    finish(&r);
}

#define WORKER (char *)env_path("WORKER_PROG"), READY_FD, GO_FD, "1", "ok"

Test(launcher_usage, n_zero) { assert_bad_usage((char *[]){"-n", "0", WORKER, NULL}, "'0'"); }
Test(launcher_usage, n_not_a_number) { assert_bad_usage((char *[]){"-n", "abc", WORKER, NULL}, "'abc'"); }
Test(launcher_usage, n_too_large) { assert_bad_usage((char *[]){"-n", "5000", WORKER, NULL}, "'5000'"); }
Test(launcher_usage, n_without_its_value) { assert_bad_usage((char *[]){"-n", NULL}, "-n"); }
Test(launcher_usage, n_missing) { assert_bad_usage((char *[]){WORKER, NULL}, "-n"); }
Test(launcher_usage, no_program) { assert_bad_usage((char *[]){"-n", "2", "--", NULL}, "program"); }
Test(launcher_usage, program_not_found)
{
    assert_bad_usage((char *[]){"-n", "2", "/nonexistent/worker", NULL}, "/nonexistent/worker");
}
Test(launcher_usage, program_is_a_directory) { assert_bad_usage((char *[]){"-n", "2", "/", NULL}, "'/'"); }
Test(launcher_usage, shm_size_too_small_for_3)
{
    assert_bad_usage((char *[]){"-n", "3", "--shm-size", "1M", WORKER, NULL}, "too small for 3 workers");
}
Test(launcher_usage, shm_size_not_a_size) { assert_bad_usage((char *[]){"-n", "2", "--shm-size", "abc", WORKER, NULL}, "'abc'"); }
Test(launcher_usage, ring_slots_not_a_power_of_two)
{
    assert_bad_usage((char *[]){"-n", "2", "--ring-slots", "1000", WORKER, NULL}, "'1000'");
}
Test(launcher_usage, unknown_option) { assert_bad_usage((char *[]){"-n", "2", "--frobnicate", WORKER, NULL}, "--frobnicate"); }

Test(launcher_usage, help_prints_usage_and_exits_0)
{
    struct run r;
    start(&r, test_ns("help"), (char *[]){"--help", NULL});
    cr_assert_eq(exit_code(await_exit(&r)), 0, "--help failed; stderr:\n%s", r.err);
    cr_assert(!strncmp(r.out, "usage: shmrun -n N", 18), "--help printed:\n%s", r.out);
    cr_assert_eq(r.err_len, 0, "--help printed on stderr:\n%s", r.err);
    finish(&r);
}
