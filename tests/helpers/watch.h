/* SPDX-License-Identifier: MIT */
/* Watching a job's processes from a test: readiness lines, pidfds, and
 * whether a segment is still held by anyone.
 *
 * Workers report readiness as an event: one write of "RANK PID\n" to a pipe
 * (see worker_prog.c and test_spawn.c). The test opens a pidfd for each
 * worker as its line arrives, so "is it gone" is asked of that very process,
 * never of a pid that may have been reused.
 */
#ifndef SR_TESTS_WATCH_H
#define SR_TESTS_WATCH_H

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define WATCH_WAIT_MS 20000 /* every wait's bound: generous for ASan on 2 busy cores */
#define WATCH_MAX_WORKERS 16

struct ready {
    int fd;                             /* read end, non-blocking */
    bool eof;                           /* every writer has closed it */
    int n;                              /* lines seen */
    pid_t pid[WATCH_MAX_WORKERS];       /* by rank; 0 until reported */
    int pidfd[WATCH_MAX_WORKERS];       /* by rank; -1: gone before we could open it */
    char buf[1024];
    size_t len;
};

static inline int64_t watch_now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static inline int watch_pidfd_open(pid_t pid) { return (int)syscall(SYS_pidfd_open, pid, 0); }

static inline void ready_init(struct ready *r, int fd)
{
    memset(r, 0, sizeof(*r));
    r->fd = fd;
    for (int i = 0; i < WATCH_MAX_WORKERS; i++)
        r->pidfd[i] = -1;
}

static inline void ready_fini(struct ready *r)
{
    for (int i = 0; i < WATCH_MAX_WORKERS; i++)
        if (r->pidfd[i] >= 0)
            close(r->pidfd[i]);
    if (r->fd >= 0)
        close(r->fd);
    r->fd = -1;
}

static inline void ready_line(struct ready *r, const char *line)
{
    int rank, pid;
    cr_assert_eq(sscanf(line, "%d %d", &rank, &pid), 2, "bad readiness line '%s'", line);
    cr_assert(rank >= 0 && rank < WATCH_MAX_WORKERS, "readiness line names rank %d", rank);
    cr_assert_eq(r->pid[rank], 0, "rank %d reported ready twice (pids %d and %d)", rank, r->pid[rank], pid);
    r->pid[rank] = pid;
    r->pidfd[rank] = watch_pidfd_open(pid);
    cr_assert(r->pidfd[rank] >= 0 || errno == ESRCH, "pidfd_open(%d): %s", pid, strerror(errno));
    r->n++;
}

/* Read what is there and parse whole lines. */
static inline void ready_feed(struct ready *r)
{
    for (;;) {
        ssize_t got = read(r->fd, r->buf + r->len, sizeof(r->buf) - 1 - r->len);
        if (got == 0)
            r->eof = true;
        if (got <= 0)
            break;
        r->len += (size_t)got;
        r->buf[r->len] = 0;
        char *nl;
        while ((nl = strchr(r->buf, '\n'))) {
            *nl = 0;
            ready_line(r, r->buf);
            r->len -= (size_t)(nl + 1 - r->buf);
            memmove(r->buf, nl + 1, r->len + 1);
        }
    }
}

static inline bool pidfd_exited(int pidfd, int timeout_ms)
{
    struct pollfd p = {.fd = pidfd, .events = POLLIN};
    return poll(&p, 1, timeout_ms) == 1;
}

/* Every one of ranks [0, n) reported, has exited by now, and has been reaped
 * (its pid no longer exists). */
static inline void assert_workers_gone(const struct ready *r, int n)
{
    for (int rank = 0; rank < n; rank++) {
        cr_assert_neq(r->pid[rank], 0, "rank %d never reported its pid", rank);
        if (r->pidfd[rank] >= 0)
            cr_assert(pidfd_exited(r->pidfd[rank], 0), "rank %d (pid %d) is still running", rank, r->pid[rank]);
        errno = 0;
        cr_assert(kill(r->pid[rank], 0) == -1 && errno == ESRCH, "rank %d (pid %d) still exists (kill: %s)", rank,
                  r->pid[rank], strerror(errno));
    }
}

/* Does process `pid` hold memfd `want` ("/memfd:NAME (deleted)") as an fd? */
static inline bool fd_holder(const char *pid, const char *want)
{
    char path[300], target[300];
    snprintf(path, sizeof(path), "/proc/%s/fd", pid);
    DIR *d = opendir(path);
    if (!d)
        return false; /* gone, or not ours to read */
    struct dirent *e;
    bool found = false;
    while (!found && (e = readdir(d))) {
        snprintf(path, sizeof(path), "/proc/%s/fd/%.20s", pid, e->d_name);
        ssize_t n = readlink(path, target, sizeof(target) - 1);
        target[n > 0 ? n : 0] = 0;
        found = strcmp(target, want) == 0;
    }
    closedir(d);
    return found;
}

/* Does process `pid` map memfd `want`? */
static inline bool map_holder(const char *pid, const char *want)
{
    char path[300], line[1024];
    snprintf(path, sizeof(path), "/proc/%s/maps", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    bool found = false;
    while (!found && fgets(line, sizeof(line), f)) {
        const char *p = strstr(line, want);
        found = p && (p[strlen(want)] == '\n' || p[strlen(want)] == 0);
    }
    fclose(f);
    return found;
}

/* A process that holds the memfd named `name` (an fd or a mapping), or 0. */
static inline pid_t segment_holder(const char *name)
{
    char want[128];
    snprintf(want, sizeof(want), "/memfd:%s (deleted)", name);
    DIR *d = opendir("/proc");
    cr_assert(d, "cannot list /proc");
    struct dirent *e;
    pid_t holder = 0;
    while (!holder && (e = readdir(d))) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        if (fd_holder(e->d_name, want) || map_holder(e->d_name, want))
            holder = atoi(e->d_name);
    }
    closedir(d);
    return holder;
}

static inline void assert_segment_gone(const char *name)
{
    pid_t holder = segment_holder(name);
    cr_assert_eq(holder, 0, "segment memfd:%s is still held by pid %d", name, (int)holder);
}

/* Read what is there from a nonblocking pipe (end of file sets *eof); past
 * the buffer's end output is read and dropped. */
static inline void watch_drain(int fd, char *buf, size_t cap, size_t *len, bool *eof)
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

#endif
