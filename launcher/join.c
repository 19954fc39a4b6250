/* SPDX-License-Identifier: MIT */
/* shmrun --join JOB [--rank R] prog [args...]: run prog as a new worker of
 * a running elastic job (lib/job/job.h, "Joining"). The protocol: connect
 * to the supervisor's abstract socket "\0shmrpc-job-JOB", send our stdin,
 * stdout and stderr (SCM_RIGHTS) with "R\0cwd\0prog\0args...\0", read
 * "rank R pid P" or "error: why", then "exit N" when the worker's process
 * ends; we exit with N. */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "join.h"

#define JOIN_MSG_MAX 65536

static int connect_job(const char *job)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    int n = snprintf(a.sun_path + 1, sizeof(a.sun_path) - 1, "shmrpc-job-%s", job);
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, len)) {
        fprintf(stderr, "shmrun: --join %s: no such job (%s): is it elastic (--max-workers), running, and yours?\n",
                job, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

/* Append s and its NUL at *at; false if it does not fit. */
static bool put(char *buf, size_t cap, size_t *at, const char *s)
{
    size_t n = strlen(s) + 1;
    if (*at + n > cap)
        return false;
    memcpy(buf + *at, s, n);
    *at += n;
    return true;
}

/* "R\0cwd\0argv...": into buf; its length, or -1 if it does not fit. */
static int build_request(const struct args *a, char *buf, size_t cap)
{
    char cwd[PATH_MAX], rank[16];
    if (!getcwd(cwd, sizeof(cwd)))
        snprintf(cwd, sizeof(cwd), "/");
    snprintf(rank, sizeof(rank), "%d", a->join_rank);
    size_t at = 0;
    bool ok = put(buf, cap, &at, rank) && put(buf, cap, &at, cwd);
    for (int i = 0; ok && a->argv[i]; i++)
        ok = put(buf, cap, &at, a->argv[i]);
    return ok ? (int)at : -1;
}

static int send_request(int fd, const char *buf, int len)
{
    int fds[3] = {0, 1, 2};
    char ctl[CMSG_SPACE(sizeof(fds))] = {0};
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = (size_t)len};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof(ctl)};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(fds));
    memcpy(CMSG_DATA(c), fds, sizeof(fds));
    return sendmsg(fd, &m, MSG_NOSIGNAL) == len ? 0 : -1;
}

/* One message from the supervisor, NUL-terminated; its length, 0 at EOF. */
static ssize_t read_line(int fd, char *buf, size_t cap)
{
    ssize_t n;
    while ((n = recv(fd, buf, cap - 1, 0)) < 0 && errno == EINTR)
        ;
    buf[n > 0 ? n : 0] = 0;
    return n;
}

int join_job(const struct args *a)
{
    static char buf[JOIN_MSG_MAX];
    int len = build_request(a, buf, sizeof(buf));
    if (len < 0) {
        fprintf(stderr, "shmrun: --join %s: the program's arguments are longer than %d bytes\n", a->join, JOIN_MSG_MAX);
        return 2;
    }
    int fd = connect_job(a->join);
    if (fd < 0)
        return 1;
    if (send_request(fd, buf, len)) {
        fprintf(stderr, "shmrun: --join %s: cannot send the request: %s\n", a->join, strerror(errno));
        close(fd);
        return 1;
    }
    char line[512];
    int rank, pid, code;
    if (read_line(fd, line, sizeof(line)) <= 0 || sscanf(line, "rank %d pid %d", &rank, &pid) != 2) {
        fprintf(stderr, "%s\n", line[0] ? line + (strncmp(line, "error: ", 7) ? 0 : 7)
                                        : "shmrun: --join: the job ended before it answered");
        close(fd);
        return 1;
    }
    ssize_t n = read_line(fd, line, sizeof(line));
    close(fd);
    if (n <= 0 || sscanf(line, "exit %d", &code) != 1) {
        fprintf(stderr, "shmrun: --join %s: the job ended without the status of rank %d (pid %d)\n", a->join, rank,
                pid);
        return 1;
    }
    return code;
}
