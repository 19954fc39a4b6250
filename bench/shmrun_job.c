/* SPDX-License-Identifier: MIT */
/* See shmrun_job.h. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "shmrun_job.h"

void bench_job_paths(char *self, size_t self_len, char *shmrun, size_t shmrun_len)
{
    ssize_t len = readlink("/proc/self/exe", self, self_len - 1);
    self[len > 0 ? len : 0] = 0;
    if (*shmrun)
        return;
    char *slash = strrchr(self, '/');
    snprintf(shmrun, shmrun_len, "%.*s/../launcher/shmrun", slash ? (int)(slash - self) : 1, slash ? self : ".");
}

int bench_job_pipe(bench_job *j)
{
    int p[2];
    char tmpl[] = "/tmp/bench_job.XXXXXX";
    j->log = mkstemp(tmpl);
    if (j->log < 0 || pipe(p)) {
        fprintf(stderr, "%s: report pipe or log: %s\n", j->who, strerror(errno));
        return -1;
    }
    unlink(tmpl);
    fcntl(p[0], F_SETFD, FD_CLOEXEC);
    fcntl(j->log, F_SETFD, FD_CLOEXEC);
    j->fd = p[0];
    j->len = 0;
    j->pid = 0;
    return p[1];
}

int bench_job_start(bench_job *j, char *const argv[], int w)
{
    j->pid = fork();
    if (j->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(j->log, 2);
        execv(j->shmrun, argv);
        _exit(127);
    }
    close(w);
    return j->pid > 0 ? 0 : -1;
}

/* Hand the complete lines read so far to take. */
static int read_lines(bench_job *j)
{
    ssize_t got = read(j->fd, j->buf + j->len, sizeof(j->buf) - 1 - j->len);
    if (got <= 0) {
        fprintf(stderr, "%s: the workers closed the report pipe\n", j->who);
        return -1;
    }
    j->len += (size_t)got;
    j->buf[j->len] = 0;
    for (char *nl; (nl = strchr(j->buf, '\n'));) {
        *nl = 0;
        if (j->take(j->ctx, j->buf))
            return -1;
        j->len -= (size_t)(nl + 1 - j->buf);
        memmove(j->buf, nl + 1, j->len + 1);
    }
    return 0;
}

int bench_job_await(bench_job *j, bool (*done)(void *ctx), int wait_ms, const char *what)
{
    int64_t deadline = bench_now_ns() + (int64_t)wait_ms * 1000000;
    while (!done(j->ctx)) {
        int left = (int)((deadline - bench_now_ns()) / 1000000);
        struct pollfd p = {.fd = j->fd, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, left) <= 0) {
            fprintf(stderr, "%s: %s within %d ms\n", j->who, what, wait_ms);
            return -1;
        }
        if (read_lines(j))
            return -1;
    }
    return 0;
}

static void print_log(bench_job *j)
{
    char buf[4096];
    lseek(j->log, 0, SEEK_SET);
    for (ssize_t got; (got = read(j->log, buf, sizeof(buf))) > 0;)
        fwrite(buf, 1, (size_t)got, stderr);
}

int bench_job_end(bench_job *j, int rc, int wait_ms)
{
    int st = 0, pidfd = j->pid > 0 ? (int)syscall(SYS_pidfd_open, j->pid, 0) : -1;
    struct pollfd p = {.fd = pidfd, .events = POLLIN};
    if (!rc && (pidfd < 0 || poll(&p, 1, wait_ms) != 1)) {
        fprintf(stderr, "%s: shmrun did not end within %d ms\n", j->who, wait_ms);
        rc = -1;
    }
    if (pidfd >= 0)
        close(pidfd);
    if (j->pid > 0) {
        if (rc)
            kill(j->pid, SIGKILL);
        waitpid(j->pid, &st, 0);
        if (WIFEXITED(st) && WEXITSTATUS(st)) /* 127: shmrun could not be run */
            fprintf(stderr, "%s: %s exited with status %d\n", j->who, j->shmrun, WEXITSTATUS(st));
        else if (!rc && WIFSIGNALED(st))
            fprintf(stderr, "%s: %s was killed by signal %d\n", j->who, j->shmrun, WTERMSIG(st));
    }
    rc = rc || j->pid <= 0 || !WIFEXITED(st) || WEXITSTATUS(st) ? -1 : 0;
    if (rc)
        print_log(j);
    close(j->fd), close(j->log);
    j->fd = j->log = -1;
    return rc;
}

/* The median of v[0..n) and, in *p99, its nearest-rank 99th percentile (sorts v). */
static double p50_p99(double *v, int n, double *p99)
{
    double m = bench_median(v, (size_t)n); /* sorts */
    int k = (99 * n + 99) / 100 - 1;
    *p99 = v[k < 0 ? 0 : k >= n ? n - 1 : k];
    return m;
}

void bench_job_print(const char *name, const char *config, const char *floor_name, const double *ours,
                     const double *floor_, int n)
{
    double *o = malloc(3 * (size_t)n * sizeof(double)), *f = o + n, *r = f + n;
    if (!o || n <= 0) {
        free(o);
        return;
    }
    for (int i = 0; i < n; i++)
        o[i] = ours[i], f[i] = floor_[i], r[i] = floor_[i] != 0 ? ours[i] / floor_[i] : 0;
    bench_summary s;
    s.ours50 = p50_p99(o, n, &s.ours99);
    s.floor50 = p50_p99(f, n, &s.floor99);
    s.ratio50 = p50_p99(r, n, &s.ratio99);
    bench_print(name, config, floor_name, &s, 0, NULL);
    free(o);
}
