/* SPDX-License-Identifier: MIT */
/* shmrun, end to end: the launch contract, the failure policy, signals and
 * the command line (its features, tags, logs, binding...: test_shmrun.c).
 *
 * Each test runs the real shmrun (SHMRUN) on tests/helpers/worker_prog.c
 * (WORKER_PROG) through helpers/shmrun_run.h.
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
#include "helpers/shmrun_run.h"

LEAK_CHECKED_SUITE(launcher);
LEAK_CHECKED_SUITE(launcher_usage);

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
static void assert_early_exit_fails_the_others(const char *mode)
{
    struct run r;
    start_job(&r, mode, 3, mode, "1", NULL);
    int64_t t0 = watch_now_ms();
    int st = await_exit(&r);
    cr_assert_eq(exit_code(st), 0, "shmrun exit status %d; stderr:\n%s", exit_code(st), r.err);
    cr_assert_eq(r.err_len, 0, "the job printed on stderr:\n%s", r.err);
    cr_assert_lt(watch_now_ms() - t0, WATCH_WAIT_MS, "the job took %lld ms", (long long)(watch_now_ms() - t0));
    assert_segment_gone(r.ns);
    finish(&r);
}

Test(launcher, a_rank_exiting_before_attach_fails_the_others_at_once) { assert_early_exit_fails_the_others("early"); }

/* The same through the public API: sr_init returns -EPIPE naming the rank. */
Test(launcher, a_rank_exiting_before_sr_init_fails_the_others_sr_init_at_once)
{
    assert_early_exit_fails_the_others("early-init");
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

/* The forwarded signal kills every worker within the grace period; the
 * first one reaped is reported, as a worker that died after the forward. */
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
    char want[160];
    snprintf(want, sizeof(want), "shmrun: rank %d (pid %d) was killed by signal %s after shmrun forwarded %s\n", rank,
             (int)r.ready.pid[rank], name, name);
    cr_assert_str_eq(r.err, want, "expected exactly the report line '%s'", want);
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

static int count_nl(const char *s);

static bool two_orphan_lines(struct run *r) { return count_nl(r->out) >= 2 || r->out_eof; }

/* Regression: a worker's children outlived a clean job, and one forked
 * after attach kept the segment mapped, contradicting "no segment can be
 * left behind". Each rank leaves a forked child (blocked on a pipe) and an
 * exec'd "sleep 1000". The exec'd one holds no segment fd (the worker's
 * copy is close-on-exec); when shmrun has returned, none of them runs (it
 * is their subreaper and ends them) and the segment is gone. */
Test(launcher, processes_left_by_the_workers_end_with_the_job)
{
    struct run r;
    start_job(&r, "orphans", 2, "orphans", NULL, NULL);
    await_ready(&r, 2);
    cr_assert(pump_until(&r, two_orphan_lines) && count_nl(r.out) == 2,
              "the workers did not report their children within %d ms; stdout:\n%s\nstderr:\n%s", WATCH_WAIT_MS, r.out,
              r.err);
    pid_t pid[4];
    int pidfd[4];
    char want[128], num[16];
    snprintf(want, sizeof(want), "/memfd:%s (deleted)", r.ns);
    char *save = NULL, *line = strtok_r(r.out, "\n", &save);
    for (int i = 0; i < 2; i++, line = strtok_r(NULL, "\n", &save)) {
        int rank, forked, execed;
        cr_assert(line && sscanf(line, "orphans %d %d %d", &rank, &forked, &execed) == 3, "bad line '%s'", line);
        pid[2 * i] = forked, pid[2 * i + 1] = execed;
        snprintf(num, sizeof(num), "%d", execed);
        cr_assert(!fd_holder(num, want), "the exec'd child %d of rank %d inherited the segment's fd", execed, rank);
    }
    for (int i = 0; i < 4; i++) {
        pidfd[i] = watch_pidfd_open(pid[i]);
        cr_assert(pidfd[i] >= 0, "pidfd_open(%d): %s", pid[i], strerror(errno));
    }
    assert_segment_held(&r);
    cr_assert_eq(write(r.go_fd, "gg", 2), 2, "write to the go pipe: %s", strerror(errno));
    int st = await_exit(&r);
    bool alive[4];
    for (int i = 0; i < 4; i++) {
        alive[i] = !pidfd_exited(pidfd[i], 0);
        if (alive[i]) /* do not leave it to outlive the test either */
            syscall(SYS_pidfd_send_signal, pidfd[i], SIGKILL, NULL, 0);
        close(pidfd[i]);
    }
    for (int i = 0; i < 4; i++)
        cr_assert(!alive[i], "the %s child %d of rank %d still ran after shmrun had returned",
                  i % 2 ? "exec'd" : "forked", pid[i], i / 2);
    cr_assert_eq(exit_code(st), 0, "shmrun exit status %d; stderr:\n%s", exit_code(st), r.err);
    cr_assert(strstr(r.err, "the workers left 4 processes running after the job ended"),
              "shmrun did not report the processes left behind; stderr:\n%s", r.err);
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

static int count_nl(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
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

/* One strict syntax for every number (shm/base/parse.h): " 3" and "+3" used to
 * pass where "3 " did not, and --grace took "0x1" and "1e1" (strtod). */
static void assert_bad_numbers(const char *opt, const char *what, const char *const *bad)
{
    char line[160];
    for (; *bad; bad++) {
        snprintf(line, sizeof(line), "%s takes %s, not '%s'", opt, what, *bad);
        char *with_n[] = {"-n", "2", (char *)opt, (char *)*bad, WORKER, NULL};
        assert_bad_usage(strcmp(opt, "-n") ? with_n : with_n + 2, line); /* -n alone: "-n BAD prog" */
    }
}

Test(launcher_usage, n_numbers_are_strict)
{
    static const char *const bad[] = {" 3", "3 ", "", "+3", "-3", "0x10", "3.0", "99999999999999999999", NULL};
    assert_bad_numbers("-n", "a number of workers in [1, 4096]", bad);
}

Test(launcher_usage, size_slots_and_seconds_are_strict)
{
    assert_bad_numbers("--shm-size", "a size like 512M or 4G",
                       (const char *const[]){" 64M", "64M ", "+64M", "", "M", "0x40M", "99999999999999999999", NULL});
    assert_bad_numbers("--ring-slots", "a power of two in [2, 2^24]", (const char *const[]){" 8", "8 ", "+8", NULL});
    assert_bad_numbers("--grace", "seconds in [0, 86400]",
                       (const char *const[]){" 1", "1 ", "+1", "", ".", "0x1", "1e1", "inf", "nan", NULL});
}

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

Test(launcher_usage, tag_output_neither_rank_nor_name)
{
    assert_bad_usage((char *[]){"-n", "2", "--tag-output=host", WORKER, NULL}, "'host'");
}
Test(launcher_usage, bind_to_socket) { assert_bad_usage((char *[]){"-n", "2", "--bind-to", "socket", WORKER, NULL}, "'socket'"); }
Test(launcher_usage, grace_negative) { assert_bad_usage((char *[]){"-n", "2", "--grace", "-1", WORKER, NULL}, "'-1'"); }
Test(launcher_usage, fold_window_not_a_number)
{
    assert_bad_usage((char *[]){"-n", "2", "--fold-window", "soon", WORKER, NULL}, "'soon'");
}
Test(launcher_usage, output_dir_that_cannot_be_created)
{
    /* Not a usage error: nothing is wrong with the command line, but no
     * worker may start without its log files (exit 1, the path named). */
    struct run r;
    start(&r, test_ns("logdir"), (char *[]){"-n", "2", "--output-dir", "/proc/shmrun-logs", WORKER, NULL});
    int st = await_exit(&r);
    cr_assert_eq(exit_code(st), 1, "exit status %d, expected 1; stderr:\n%s", exit_code(st), r.err);
    cr_assert(strstr(r.err, "shmrun: --output-dir: cannot create /proc/shmrun-logs: ") && count_nl(r.err) == 1,
              "expected one line naming the directory, got:\n%s", r.err);
    cr_assert_eq(r.ready.n, 0, "a worker started without its log files");
    assert_segment_gone(r.ns);
    finish(&r);
}

Test(launcher_usage, help_prints_usage_and_exits_0)
{
    struct run r;
    start(&r, test_ns("help"), (char *[]){"--help", NULL});
    cr_assert_eq(exit_code(await_exit(&r)), 0, "--help failed; stderr:\n%s", r.err);
    cr_assert(!strncmp(r.out, "usage: shmrun -n N", 18), "--help printed:\n%s", r.out);
    cr_assert_eq(r.err_len, 0, "--help printed on stderr:\n%s", r.err);
    finish(&r);
}
