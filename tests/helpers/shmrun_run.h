/* SPDX-License-Identifier: MIT */
/* Running the real shmrun from a test (test_launcher.c, test_shmrun.c).
 *
 * shmrun gets exactly six descriptors: a stdin pipe, a stdout pipe, a stderr
 * pipe, the readiness pipe (fd 3) and the go pipe (fd 4); workers inherit
 * them. Nothing here sleeps: the test waits on the readiness pipe, on pidfds
 * and on end-of-file of the pipes, always with a bound (WATCH_WAIT_MS).
 */
#ifndef SR_TESTS_SHMRUN_RUN_H
#define SR_TESTS_SHMRUN_RUN_H

#include <criterion/criterion.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "helpers/watch.h"

#define READY_FD "3"
#define GO_FD "4"
#define EXIT_ENV 41 /* worker_prog: the launch contract is broken */

struct run {
    pid_t pid;
    int pidfd;
    int in_fd, out_fd, err_fd, go_fd; /* the test's ends (in_fd: shmrun's stdin) */
    struct ready ready;
    char out[4096], err[16384];
    size_t out_len, err_len;
    bool out_eof, err_eof;
    int status; /* wait status, once reaped */
    char ns[40];
};

static inline const char *env_path(const char *var)
{
    const char *p = getenv(var);
    cr_assert(p && *p, "%s is not set: run this test through meson", var);
    return p;
}

/* Move a pipe end above the descriptors the child rebuilds, so that the
 * dup2()s below never overwrite one another. */
static inline int high_fd(int fd)
{
    int hi = fcntl(fd, F_DUPFD_CLOEXEC, 10);
    cr_assert(hi >= 0, "F_DUPFD_CLOEXEC: %s", strerror(errno));
    close(fd);
    return hi;
}

static inline void make_pipe(int p[2])
{
    cr_assert_eq(pipe2(p, O_CLOEXEC), 0, "pipe2: %s", strerror(errno));
    p[0] = high_fd(p[0]);
    p[1] = high_fd(p[1]);
}

/* In the child: the five descriptors, nothing else; default signal
 * dispositions (a test runner may ignore SIGINT, and workers inherit that
 * through exec); die with the test. */
static bool ignore_sigchld;      /* start shmrun with SIGCHLD ignored */
static cpu_set_t *shmrun_cpus;   /* start shmrun with this affinity (NULL: the test's) */
static unsigned closed_stdio;    /* start shmrun with these standard fds closed (bit k: fd k) */

static inline void exec_shmrun(int in, int out, int err, int ready, int go, char **argv)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    static const int dfl[] = {SIGINT, SIGTERM, SIGPIPE, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
    for (size_t i = 0; i < sizeof(dfl) / sizeof(dfl[0]); i++)
        signal(dfl[i], SIG_DFL);
    signal(SIGCHLD, ignore_sigchld ? SIG_IGN : SIG_DFL);
    if (shmrun_cpus && sched_setaffinity(0, sizeof(cpu_set_t), shmrun_cpus))
        _exit(125);
    if (dup2(in, 0) < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0 || dup2(ready, 3) < 0 || dup2(go, 4) < 0)
        _exit(126);
    close_range(5, ~0u, 0);
    for (int fd = 0; fd < 3; fd++)
        if (closed_stdio & (1u << fd))
            close(fd);
    execv(argv[0], argv);
    _exit(127);
}

static inline void start(struct run *r, const char *test, char **args)
{
    char *argv[32] = {(char *)env_path("SHMRUN")};
    for (int i = 0; args[i]; i++) {
        cr_assert_lt(i, 30, "too many arguments");
        argv[i + 1] = args[i];
    }
    int in[2], out[2], err[2], ready[2], go[2];
    make_pipe(in), make_pipe(out), make_pipe(err), make_pipe(ready), make_pipe(go);
    /* No Criterion call in the child: with --full-stats even a passing
     * assertion is a message to the runner, which waits forever for a reply
     * addressed to a pid it does not know. */
    pid_t pid = fork();
    if (pid == 0)
        exec_shmrun(in[0], out[1], err[1], ready[1], go[0], argv);
    cr_assert(pid > 0, "fork: %s", strerror(errno));
    *r = (struct run){.pid = pid};
    close(in[0]), close(out[1]), close(err[1]), close(ready[1]), close(go[0]);
    r->in_fd = in[1], r->out_fd = out[0], r->err_fd = err[0], r->go_fd = go[1];
    ready_init(&r->ready, ready[0]);
    fcntl(r->out_fd, F_SETFL, O_NONBLOCK);
    fcntl(r->err_fd, F_SETFL, O_NONBLOCK);
    fcntl(r->ready.fd, F_SETFL, O_NONBLOCK);
    r->pidfd = watch_pidfd_open(r->pid);
    cr_assert(r->pidfd >= 0, "pidfd_open(shmrun): %s", strerror(errno));
    snprintf(r->ns, sizeof(r->ns), "%s", test);
}

/* One round: wait up to ms for output or for shmrun to exit, then read it all. */
static inline void pump(struct run *r, int ms)
{
    struct pollfd p[4] = {{.fd = r->out_eof ? -1 : r->out_fd, .events = POLLIN},
                          {.fd = r->err_eof ? -1 : r->err_fd, .events = POLLIN},
                          {.fd = r->ready.eof ? -1 : r->ready.fd, .events = POLLIN},
                          {.fd = r->pid ? r->pidfd : -1, .events = POLLIN}};
    poll(p, 4, ms);
    if (!r->out_eof)
        watch_drain(r->out_fd, r->out, sizeof(r->out), &r->out_len, &r->out_eof);
    if (!r->err_eof)
        watch_drain(r->err_fd, r->err, sizeof(r->err), &r->err_len, &r->err_eof);
    if (!r->ready.eof)
        ready_feed(&r->ready);
}

static inline bool shmrun_exited(struct run *r) { return !r->pid || pidfd_exited(r->pidfd, 0); }
static inline bool all_pipes_closed(struct run *r) { return r->out_eof && r->err_eof && r->ready.eof; }

/* Pump until done(r) or the bound passes; false on timeout. */
static inline bool pump_until(struct run *r, bool (*done)(struct run *))
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
static inline bool all_ready(struct run *r) { return r->ready.n >= want_ready || r->ready.eof; }

static inline void await_ready(struct run *r, int n)
{
    want_ready = n;
    bool ok = pump_until(r, all_ready);
    cr_assert(ok && r->ready.n == n, "%d of %d workers reported ready within %d ms%s; shmrun stderr:\n%s", r->ready.n,
              n, WATCH_WAIT_MS, r->ready.eof ? " (all closed the readiness pipe)" : "", r->err);
}

/* Wait for shmrun to exit, reap it, then for every process holding its pipes
 * (the workers) to be gone: end-of-file on all of them. */
static inline int await_exit(struct run *r)
{
    cr_assert(pump_until(r, shmrun_exited), "shmrun (pid %d) did not exit within %d ms; stderr so far:\n%s", r->pid,
              WATCH_WAIT_MS, r->err);
    cr_assert_eq(waitpid(r->pid, &r->status, 0), r->pid, "waitpid(shmrun): %s", strerror(errno));
    r->pid = 0;
    cr_assert(pump_until(r, all_pipes_closed), "shmrun exited but its pipes stayed open %d ms: workers survived it",
              WATCH_WAIT_MS);
    return r->status;
}

static inline void finish(struct run *r)
{
    ready_fini(&r->ready);
    if (r->in_fd >= 0)
        close(r->in_fd);
    close(r->out_fd), close(r->err_fd), close(r->go_fd), close(r->pidfd);
}

static inline void go(struct run *r)
{
    cr_assert_eq(write(r->go_fd, "g", 1), 1, "write to the go pipe: %s", strerror(errno));
}

static inline int exit_code(int status)
{
    cr_assert(WIFEXITED(status), "shmrun did not exit normally (wait status 0x%x)", status);
    return WEXITSTATUS(status);
}

/* shmrun -n N --name-prefix NS --shm-size 64M [opts...] -- worker_prog 3 4 N mode... */
static inline void start_job_opts(struct run *r, const char *test, int n, char **opts, const char *m0, const char *m1,
                                  const char *m2)
{
    static char nbuf[8];
    snprintf(nbuf, sizeof(nbuf), "%d", n);
    const char *ns = test_ns(test);
    char *args[32] = {"-n", nbuf, "--name-prefix", (char *)ns, "--shm-size", "64M"};
    int i = 6;
    for (; opts && *opts; opts++) {
        cr_assert_lt(i, 20, "too many options");
        args[i++] = *opts;
    }
    char *tail[] = {"--", (char *)env_path("WORKER_PROG"), READY_FD, GO_FD, nbuf, (char *)m0, (char *)m1, (char *)m2, NULL};
    memcpy(args + i, tail, sizeof(tail));
    start(r, ns, args);
}

static inline void start_job(struct run *r, const char *test, int n, const char *m0, const char *m1, const char *m2)
{
    start_job_opts(r, test, n, NULL, m0, m1, m2);
}

#endif
