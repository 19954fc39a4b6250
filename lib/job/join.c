/* SPDX-License-Identifier: MIT */
/* Joining an elastic job (job.h, "Joining"; segment.h, "Elastic jobs").
 *
 * The supervisor listens on an abstract unix socket named after the job id
 * ("\0shmrpc-job-<id>", SOCK_SEQPACKET, same uid only: SO_PEERCRED). A
 * client (shmrun --join) sends one request: its stdin, stdout and stderr
 * as SCM_RIGHTS, and a payload of the rank it wants (-1: any), its working
 * directory and the program's argv, each NUL-terminated. The supervisor
 * picks the rank, readies its line (a new generation), forks the program
 * with the client's stdio and answers "rank R pid P", or "error: why"; when
 * that worker's process ends it sends "exit N" (N as shmrun's own exit
 * code) and closes the connection. The supervisor never waits for a
 * client: it accepts a connection, polls it with the job's other fds
 * (supervise.c) and reads the request once it is there; a request that has
 * not come SR_JOIN_WAIT_NS after the accept is refused. So a client that
 * connects and sends nothing holds up no worker's exit, no signal and no
 * other join. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "clock.h"
#include "error.h"
#include "job.h"
#include "log.h"
#include "shmrpc/spawn.h"

#define JOIN_MSG_MAX 65536

static _Atomic int jobs_made; /* this process's elastic jobs: the second gets "<pid>.1" */

static socklen_t job_addr(const char *id, struct sockaddr_un *a)
{
    memset(a, 0, sizeof(*a));
    a->sun_family = AF_UNIX;
    int n = snprintf(a->sun_path + 1, sizeof(a->sun_path) - 1, "shmrpc-job-%s", id);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

int sr__job_listen(sr_job *job)
{
    /* relaxed: a count, nothing published with it */
    int n = atomic_fetch_add_explicit(&jobs_made, 1, memory_order_relaxed);
    if (n)
        snprintf(job->id, sizeof(job->id), "%d.%d", (int)getpid(), n);
    else
        snprintf(job->id, sizeof(job->id), "%d", (int)getpid());
    struct sockaddr_un a;
    socklen_t len = job_addr(job->id, &a);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd >= 0 && (fd = sr__fd_above_stdio(fd, job->who)) < 0)
        return fd;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, len) || listen(fd, 16)) {
        int err = errno;
        if (fd >= 0)
            close(fd);
        return sr__fail(-err, job->who, "the join socket of job %s: %s", job->id, strerror(err));
    }
    job->listen_fd = fd;
    job->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC); /* none (-1) only weakens EMFILE's answer */
    return 0;
}

/* One line back to the client; it may have gone (its loss, not the job's). */
static void tell(int conn, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tell(int conn, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    (void)!send(conn, buf, (size_t)(n < (int)sizeof(buf) ? n : (int)sizeof(buf) - 1), MSG_NOSIGNAL);
}

/* The request's fds (3) and payload (its length; the payload is NUL-terminated
 * past its end), without waiting: -EAGAIN when nothing came yet, -EPROTO a
 * malformed one or none (the client closed). */
static int read_request(int conn, char *buf, size_t cap, int fds[3])
{
    char ctl[CMSG_SPACE(3 * sizeof(int))];
    struct iovec iov = {.iov_base = buf, .iov_len = cap - 1};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof(ctl)};
    ssize_t n = recvmsg(conn, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return -EAGAIN;
    if (n <= 0)
        return -EPROTO;
    buf[n] = 0;
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    if (!c || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(3 * sizeof(int)) || (m.msg_flags & MSG_CTRUNC)) {
        for (; c; c = CMSG_NXTHDR(&m, c)) /* whatever came, closed */
            if (c->cmsg_type == SCM_RIGHTS)
                for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++)
                    close(((int *)CMSG_DATA(c))[i]);
        return -EPROTO;
    }
    memcpy(fds, CMSG_DATA(c), 3 * sizeof(int));
    return (int)n;
}

/* "rank\0cwd\0argv0\0argv1\0...": split in place. */
static int parse_request(char *buf, int n, struct sr_join_req *q)
{
    char *p = buf, *end = buf + n;
    char *rank = p;
    p += strlen(p) + 1;
    if (p >= end)
        return -EPROTO;
    q->cwd = p;
    p += strlen(p) + 1;
    int argc = 0;
    for (char *s = p; s < end; s += strlen(s) + 1)
        argc++;
    if (!argc || !(q->argv = calloc((size_t)argc + 1, sizeof(char *))))
        return argc ? -ENOMEM : -EPROTO;
    for (int i = 0; i < argc; i++, p += strlen(p) + 1)
        q->argv[i] = p;
    char *e;
    long r = strtol(rank, &e, 10);
    if (*e || r < -1 || r >= SR_MAX_WORKERS)
        return -EPROTO;
    q->want = (int)r;
    return 0;
}

/* rank holds no process and its line says so (its last exit published). */
static bool rank_free(sr_job *job, int r)
{
    /* seq_cst: pairs with X1 (this thread's own stores, or the creator's E1) */
    return !job->pids[r] && atomic_load_explicit(&sr__seg_worker(&job->seg, r)->exited, memory_order_seq_cst);
}

static int pick_rank(sr_job *job, int want, char *why, size_t len)
{
    if (want >= job->n) {
        snprintf(why, len, "rank %d is out of range [0, %d)", want, job->n);
        return -EINVAL;
    }
    if (want >= 0 && !rank_free(job, want)) {
        snprintf(why, len, "rank %d is held by a worker (pid %d)", want, (int)job->pids[want]);
        return -EBUSY;
    }
    for (int r = 0; want < 0 && r < job->n; r++)
        if (rank_free(job, r))
            return r;
    if (want >= 0)
        return want;
    snprintf(why, len, "the job is full: all %d ranks are held", job->n);
    return -EBUSY;
}

/* In the child: the client's stdio, its directory, the launch variables, exec. */
static void exec_joiner(sr_job *job, int rank, void *p)
{
    const struct sr_join_req *q = p;
    for (int i = 0; i < 3; i++)
        if (dup2(q->fds[i], i) < 0)
            _exit(127);
    if (chdir(q->cwd)) {
        sr_logf(SR_LOG_ERROR, "%s: rank %d: chdir %s: %s", job->who, rank, q->cwd, strerror(errno));
        _exit(127);
    }
    fcntl(job->seg.fd, F_SETFD, 0); /* inherited across exec, as shmrun's workers do */
    for (int r = 0; r < job->n; r++)
        fcntl(job->eventfds[r], F_SETFD, 0);
    sr__job_exec_env(job, rank);
    execvp(q->argv[0], q->argv);
    sr_logf(SR_LOG_ERROR, "%s: rank %d: exec %s: %s", job->who, rank, q->argv[0], strerror(errno));
    _exit(127);
}

static bool same_user(int conn)
{
    struct ucred c;
    socklen_t len = sizeof(c);
    return getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &c, &len) == 0 && c.uid == getuid();
}

/* A free pending entry, or -1. */
static int free_entry(const sr_job *job)
{
    for (int i = 0; i < SR_JOIN_PENDING; i++)
        if (job->pending[i].fd < 0)
            return i;
    return -1;
}

/* Out of descriptors (err: EMFILE or ENFILE): accept the waiting
 * connection in the spare's place, then take the spare back. If that
 * works, descriptors came back meanwhile and the connection is served as
 * any other (returned). If not, it is told why and closed (-1: accept the
 * next). -2: no spare, or no connection (errno says why; EAGAIN: none
 * waits). Refusing only what arrives while the table is full, not every
 * connection of the backlog, so that one that comes once descriptors are
 * back is never told they are not. */
static int accept_by_spare(sr_job *job, int err)
{
    if (job->spare_fd < 0)
        return -2;
    close(job->spare_fd);
    int conn = accept4(job->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK), why = errno;
    job->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (conn < 0) {
        errno = why;
        return why == EINTR || why == ECONNABORTED ? -1 : -2;
    }
    if (job->spare_fd >= 0)
        return conn;
    tell(conn, "error: %s: job %s cannot take a join now: its supervisor is out of file descriptors (%s)",
         job->who, job->id, strerror(err));
    close(conn);
    job->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    return -1;
}

/* accept4 failed with err: a connection to serve after all (>= 0), -1 to
 * accept again at once, -2 nothing more now. Logs a failure other than
 * EAGAIN once until an accept succeeds again. */
static int accept_failed(sr_job *job, int err)
{
    if (err == EINTR || err == ECONNABORTED)
        return -1;
    if (err == EAGAIN || err == EWOULDBLOCK)
        return -2;
    if (err != job->accept_err) {
        char line[256];
        snprintf(line, sizeof(line), "%s: job %s cannot accept a join: %s", job->who, job->id, strerror(err));
        sr__log_text(SR_LOG_WARN, line);
    }
    job->accept_err = err;
    if (err == EMFILE || err == ENFILE) {
        int c = accept_by_spare(job, err);
        if (c != -2 || errno == EAGAIN || errno == EWOULDBLOCK)
            return c; /* served, refused, or the backlog is empty */
    }
    job->accept_resume = sr__now_ns() + SR_JOIN_BACKOFF_NS;
    return -2;
}

int sr__job_accept(sr_job *job)
{
    for (;;) {
        int conn = accept4(job->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (conn < 0 && (conn = accept_failed(job, errno)) < 0) {
            if (conn == -1)
                continue;
            return -1;
        }
        job->accept_err = 0;
        int e = same_user(conn) ? free_entry(job) : -2;
        if (e >= 0) {
            job->pending[e].fd = conn;
            job->pending[e].deadline = sr__now_ns() + SR_JOIN_WAIT_NS;
            return e;
        }
        if (e == -2)
            tell(conn, "error: %s: job %s accepts joins from its own user only", job->who, job->id);
        else
            tell(conn, "error: %s: job %s has %d joins waiting for their requests already: try again", job->who,
                 job->id, SR_JOIN_PENDING);
        close(conn);
    }
}

/* An id: the entry in its low 8 bits, the entry's generation (24 bits,
 * wrapping) above. */
uint32_t sr__job_pending_id(const sr_job *job, int entry)
{
    return job->pending[entry].gen << 8 | (uint32_t)entry;
}

/* Entry e is done with: free it, and make the ids of its connection stale. */
static void drop_entry(sr_job *job, int e)
{
    job->pending[e].fd = -1;
    job->pending[e].gen = (job->pending[e].gen + 1) & 0xffffffu;
}

/* The request read from conn: fork its worker. The rank, or -1 (refused, the
 * client told why and closed). */
static int serve_request(sr_job *job, int conn, int n, char *buf, struct sr_join_req *q)
{
    int rc = n < 0 ? n : parse_request(buf, n, q);
    char why[256] = "a malformed request";
    int rank = rc ? rc : pick_rank(job, q->want, why, sizeof(why));
    if (rank >= 0) {
        sr__job_ready_line(job, rank);
        if (sr__job_fork(job, rank, exec_joiner, q)) {
            snprintf(why, sizeof(why), "%s", sr_last_error());
            rank = -1;
        }
    }
    if (rank >= 0) {
        tell(conn, "rank %d pid %d", rank, (int)job->pids[rank]);
        job->join_conns[rank] = conn;
        return rank;
    }
    tell(conn, "error: %s: cannot join job %s: %s", job->who, job->id, why);
    close(conn);
    return -1;
}

int sr__job_join_request(sr_job *job, uint32_t id)
{
    int e = (int)(id & 0xff);
    if (e >= SR_JOIN_PENDING || job->pending[e].fd < 0 || job->pending[e].gen != id >> 8)
        return SR_JOIN_STALE;
    char *buf = malloc(JOIN_MSG_MAX);
    struct sr_join_req q = {.fds = {-1, -1, -1}};
    int conn = job->pending[e].fd;
    int n = buf ? read_request(conn, buf, JOIN_MSG_MAX, q.fds) : -ENOMEM;
    int rank = SR_JOIN_NOT_YET;
    if (n != -EAGAIN) {
        drop_entry(job, e);
        rank = serve_request(job, conn, n, buf, &q);
    }
    for (int i = 0; i < 3; i++)
        if (q.fds[i] >= 0)
            close(q.fds[i]);
    free(q.argv);
    free(buf);
    return rank;
}

int64_t sr__job_join_due(const sr_job *job)
{
    int64_t due = INT64_MAX;
    for (int i = 0; i < SR_JOIN_PENDING; i++)
        if (job->pending[i].fd >= 0 && job->pending[i].deadline < due)
            due = job->pending[i].deadline;
    return job->accept_resume && job->accept_resume < due ? job->accept_resume : due;
}

int sr__job_join_expire(sr_job *job, int64_t now, uint32_t ids[SR_JOIN_PENDING])
{
    int k = 0;
    for (int i = 0; i < SR_JOIN_PENDING; i++) {
        if (job->pending[i].fd < 0 || job->pending[i].deadline > now)
            continue;
        tell(job->pending[i].fd, "error: %s: cannot join job %s: no request within %d s", job->who, job->id,
             (int)(SR_JOIN_WAIT_NS / 1000000000));
        close(job->pending[i].fd);
        ids[k++] = sr__job_pending_id(job, i);
        drop_entry(job, i);
    }
    return k;
}

void sr__job_joined_exit(sr_job *job, int rank, int code)
{
    if (!job->join_conns || job->join_conns[rank] < 0)
        return;
    tell(job->join_conns[rank], "exit %d", code);
    close(job->join_conns[rank]);
    job->join_conns[rank] = -1;
}

SR_API const char *sr_job_id(void)
{
    const char *id = getenv("SHMRPC_JOB");
    return id && *id ? id : NULL;
}
