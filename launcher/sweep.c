/* SPDX-License-Identifier: MIT */
/* The processes a job's workers leave behind. See sweep.h. */
#include "sweep.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "log.h"

#define BATCH 256                                /* children handled per round; the rest in the next */
#define MAX_SEEN 1024                            /* distinct processes counted exactly */
#define MAX_NAMED 8                              /* processes named in the report */
#define KILL_BOUND_NS (INT64_C(10) * 1000000000) /* after SIGKILL: then shmrun gives up, saying so */

struct child {
    pid_t pid;
    bool zombie; /* exited, not reaped yet: the next round reaps it */
    char comm[20];
};

struct seen {
    int count;           /* distinct processes signalled */
    pid_t pid[MAX_SEEN];
    char named[MAX_NAMED * 40];
    size_t len;
};

int sweep_become_subreaper(void)
{
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) < 0)
        return sr__fail(-errno, "shmrun", "prctl(PR_SET_CHILD_SUBREAPER): %s", strerror(errno));
    return 0;
}

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void reap_exited(void)
{
    while (waitpid(-1, NULL, WNOHANG) > 0)
        ;
}

/* Our child `pid` (a /proc entry): its command name, and whether it is a
 * zombie (one that died after reap_exited: it is waited for, not signalled). */
static bool running_child(const char *pid, pid_t self, struct child *c)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%.20s/stat", pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return false; /* gone meanwhile */
    size_t got = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[got] = 0;
    /* "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses */
    char *open = strchr(buf, '('), *close = strrchr(buf, ')'), state;
    int ppid;
    if (!open || !close || close < open || sscanf(close + 1, " %c %d", &state, &ppid) != 2 || ppid != self)
        return false;
    c->pid = (pid_t)atoi(pid);
    c->zombie = state == 'Z';
    snprintf(c->comm, sizeof(c->comm), "%.*s", (int)(close - open - 1), open + 1);
    return true;
}

/* Our children not reaped yet, up to max; -errno if /proc cannot be read. */
static int list_children(struct child *c, int max)
{
    DIR *d = opendir("/proc");
    if (!d)
        return sr__fail(-errno, "shmrun", "cannot list /proc to find the processes the workers left: %s",
                        strerror(errno));
    pid_t self = getpid();
    int n = 0;
    struct dirent *e;
    while (n < max && (e = readdir(d)))
        if (isdigit((unsigned char)e->d_name[0]) && running_child(e->d_name, self, &c[n]))
            n++;
    closedir(d);
    return n;
}

/* Record c; true if it was not signalled before. */
static bool note(struct seen *s, const struct child *c)
{
    int known = s->count < MAX_SEEN ? s->count : MAX_SEEN;
    for (int i = 0; i < known; i++)
        if (s->pid[i] == c->pid)
            return false;
    if (s->count < MAX_SEEN)
        s->pid[s->count] = c->pid;
    if (s->count < MAX_NAMED)
        s->len += (size_t)snprintf(s->named + s->len, sizeof(s->named) - s->len, "%spid %d (%s)",
                                   s->count ? ", " : "", (int)c->pid, c->comm);
    s->count++;
    return true;
}

/* Until one of them exits (its pidfd becomes readable), `until` passes or
 * a signal shmrun forwards arrives on sigfd; true for the signal (read). */
static bool wait_any(const struct child *c, int n, int64_t until, int sigfd)
{
    struct pollfd p[BATCH + 1] = {{.fd = sigfd, .events = POLLIN}};
    int m = 1;
    bool gone = false;
    for (int i = 0; i < n && !gone; i++) {
        int fd = (int)syscall(SYS_pidfd_open, c[i].pid, 0);
        if (fd >= 0)
            p[m++] = (struct pollfd){.fd = fd, .events = POLLIN};
        gone = fd < 0; /* already reaped: look again at once */
    }
    int64_t left = until - now_ns();
    if (!gone && left > 0)
        poll(p, (nfds_t)m, (int)((left + 999999) / 1000000));
    for (int i = 1; i < m; i++)
        close(p[i].fd);
    struct signalfd_siginfo si;
    return (p[0].revents & POLLIN) && read(sigfd, &si, sizeof(si)) == sizeof(si);
}

static int report(const struct seen *s, int survivors, bool killed, int64_t termed_ns)
{
    const char *more = s->count > MAX_NAMED ? ", ..." : "";
    const char *es = s->count == 1 ? "" : "es";
    if (survivors) {
        sr__fail(-ETIMEDOUT, "shmrun", "the workers left %d process%s running after the job ended (%s%s): "
                 "%d still running %g s after SIGKILL", s->count, es, s->named, more, survivors,
                 (double)KILL_BOUND_NS / 1e9);
        sr__log_text(SR_LOG_ERROR, sr_last_error());
        return -ETIMEDOUT;
    }
    if (killed)
        sr_logf(SR_LOG_WARN, "the workers left %d process%s running after the job ended (%s%s): "
                "killed with SIGKILL %.3g s after SIGTERM", s->count, es, s->named, more, (double)termed_ns / 1e9);
    else
        sr_logf(SR_LOG_WARN, "the workers left %d process%s running after the job ended (%s%s): ended with SIGTERM",
                s->count, es, s->named, more);
    return s->count;
}

int sweep_leftovers(int64_t grace_ns, int sigfd)
{
    static struct seen s; /* one sweep at a time: after each attempt of the job */
    struct child c[BATCH];
    memset(&s, 0, sizeof(s));
    int64_t t0 = now_ns(), kill_at = t0 + grace_ns, give_up = kill_at + KILL_BOUND_NS;
    bool killed = false;
    int n;
    for (;;) {
        reap_exited();
        if ((n = list_children(c, BATCH)) <= 0)
            break;
        int64_t now = now_ns();
        if (now >= give_up)
            break;
        killed |= now >= kill_at;
        for (int i = 0; i < n; i++)
            if (!c[i].zombie && (note(&s, &c[i]) || killed)) /* SIGTERM once each; SIGKILL to all */
                kill(c[i].pid, killed ? SIGKILL : SIGTERM);
        if (wait_any(c, n, killed ? give_up : kill_at, sigfd))
            kill_at = now_ns(), give_up = kill_at + KILL_BOUND_NS; /* a stop signal: no more grace */
    }
    if (n < 0) {
        sr__log_text(SR_LOG_ERROR, sr_last_error());
        return n;
    }
    return s.count ? report(&s, n, killed, kill_at - t0) : 0;
}
