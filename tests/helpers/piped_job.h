/* SPDX-License-Identifier: MIT */
/* A job under the real shmrun whose stdout and stderr a test reads through
 * pipes (test_train_resume.c, test_train_restart.c): start it, pump its
 * output into buffers, wait until the output says enough or both pipes are
 * closed. Nothing sleeps: every wait is a poll on the pipes, with a bound.
 */
#ifndef SR_TESTS_PIPED_JOB_H
#define SR_TESTS_PIPED_JOB_H

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "helpers/watch.h"

struct piped_job {
    pid_t pid; /* shmrun; with own_group, also the process group of the whole job */
    int pidfd, out_fd, err_fd;
    char out[65536], err[16384];
    size_t out_len, err_len;
    bool out_eof, err_eof;
    int status;
    char ns[40]; /* the job's shared-memory namespace (the caller's) */
};

/* In the child: stdout and stderr to the pipes, nothing else open; its own
 * process group (the job, to kill as one) with own_group. No Criterion call. */
static inline void piped_job_exec(int out, int err, char **argv, bool own_group)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (own_group)
        setpgid(0, 0);
    signal(SIGINT, SIG_DFL), signal(SIGTERM, SIG_DFL), signal(SIGPIPE, SIG_DFL);
    if (dup2(out, 1) < 0 || dup2(err, 2) < 0)
        _exit(126);
    close_range(3, ~0u, 0);
    execv(argv[0], argv);
    _exit(127);
}

/* Start argv (argv[0] a path) with its output piped into j; j->ns is kept. */
static inline void piped_job_start(struct piped_job *j, char **argv, bool own_group)
{
    int out[2], err[2];
    cr_assert_eq(pipe2(out, O_CLOEXEC), 0);
    cr_assert_eq(pipe2(err, O_CLOEXEC), 0);
    pid_t pid = fork();
    if (pid == 0)
        piped_job_exec(out[1], err[1], argv, own_group);
    cr_assert(pid > 0, "fork: %s", strerror(errno));
    if (own_group)
        setpgid(pid, pid); /* as the child does: whichever runs first */
    close(out[1]), close(err[1]);
    j->pid = pid, j->out_fd = out[0], j->err_fd = err[0], j->status = 0;
    j->out_len = j->err_len = 0, j->out_eof = j->err_eof = false;
    j->out[0] = j->err[0] = '\0';
    fcntl(j->out_fd, F_SETFL, O_NONBLOCK);
    fcntl(j->err_fd, F_SETFL, O_NONBLOCK);
    j->pidfd = watch_pidfd_open(pid);
    cr_assert(j->pidfd >= 0, "pidfd_open: %s", strerror(errno));
}

/* Wait up to ms for output, and take what came. */
static inline void piped_job_pump(struct piped_job *j, int ms)
{
    struct pollfd p[2] = {{.fd = j->out_eof ? -1 : j->out_fd, .events = POLLIN},
                          {.fd = j->err_eof ? -1 : j->err_fd, .events = POLLIN}};
    poll(p, 2, ms);
    if (!j->out_eof)
        watch_drain(j->out_fd, j->out, sizeof(j->out), &j->out_len, &j->out_eof);
    if (!j->err_eof)
        watch_drain(j->err_fd, j->err, sizeof(j->err), &j->err_len, &j->err_eof);
}

/* Pump until done(j), or false once bound_ms have passed. */
static inline bool piped_job_pump_until(struct piped_job *j, bool (*done)(struct piped_job *), int64_t bound_ms)
{
    int64_t deadline = watch_now_ms() + bound_ms;
    while (!done(j)) {
        int64_t left = deadline - watch_now_ms();
        if (left <= 0)
            return false;
        piped_job_pump(j, (int)left);
    }
    return true;
}

/* Every worker holds the pipes: end-of-file on both means the job is gone. */
static inline bool piped_job_closed(struct piped_job *j) { return j->out_eof && j->err_eof; }

/* The path in the environment variable var (meson's test env sets it). */
static inline const char *piped_job_env_path(const char *var)
{
    const char *p = getenv(var);
    cr_assert(p && *p, "%s is not set: run this test through meson", var);
    return p;
}

/* SHMRUN -n world --name-prefix test_ns(name) -- $prog_var head... args...
 * (head and args NULL-terminated), in its own process group. */
static inline void piped_job_shmrun(struct piped_job *j, const char *name, const char *world, const char *prog_var,
                                    char *const *head, char *const *args)
{
    snprintf(j->ns, sizeof(j->ns), "%s", test_ns(name));
    char *argv[48] = {(char *)piped_job_env_path("SHMRUN"), "-n", (char *)world, "--name-prefix", j->ns, "--",
                      (char *)piped_job_env_path(prog_var)};
    int n = 7;
    for (char *const *part[2] = {head, args}, *const **p = part; p < part + 2; p++)
        for (int i = 0; *p && (*p)[i]; i++) {
            cr_assert_lt(n, 47, "too many arguments");
            argv[n++] = (*p)[i];
        }
    piped_job_start(j, argv, true); /* its own process group: the whole job */
}

/* Wait until the job has closed its pipes and shmrun has exited; reap it
 * and, as the subreaper, the workers it left when killed (they have exited:
 * the pipes are closed, so no wait blocks for long). Its wait status. */
static inline int piped_job_finish(struct piped_job *j)
{
    cr_assert(piped_job_pump_until(j, piped_job_closed, 6 * WATCH_WAIT_MS),
              "the job (shmrun pid %d) still holds its pipes after %d ms; stderr:\n%s", j->pid, 6 * WATCH_WAIT_MS,
              j->err);
    cr_assert(pidfd_exited(j->pidfd, WATCH_WAIT_MS), "shmrun (pid %d) did not exit", j->pid);
    pid_t p;
    int st;
    while ((p = waitpid(-j->pid, &st, 0)) > 0)
        if (p == j->pid)
            j->status = st;
    cr_assert_eq(errno, ECHILD, "waitpid: %s", strerror(errno));
    close(j->out_fd), close(j->err_fd), close(j->pidfd);
    return j->status;
}

/* Finish a job that must exit 0 and leave no segment behind. */
static inline void piped_job_expect_success(struct piped_job *j, const char *name)
{
    int st = piped_job_finish(j);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: shmrun wait status 0x%x; stdout:\n%s\nstderr:\n%s", name,
              st, j->out, j->err);
    assert_segment_gone(j->ns);
}

#endif
