/* SPDX-License-Identifier: MIT */
/* Elastic jobs under the real shmrun (shmrun --max-workers, --join):
 * tests/helpers/elastic_prog.c drives the scenario from inside the job (a
 * program joins a free rank, is called by rank and by name, leaves; a join
 * to a full job and a joiner with a name already taken are refused; rank 0
 * leaves too) and the job must end with status 0. And the client's own
 * refusals: a job that does not exist, bad command lines. And the same
 * supervisor in sr_spawn: shmrun --join adds a worker to its elastic job.
 * Each shmrun is waited for on its pidfd, with a bound. */
#include <criterion/criterion.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <time.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/resource.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "clock.h"
#include "common.h"
#include "job.h"
#include "shmrpc/rpc.h"
#include "shmrpc/spawn.h"
#include "worker_check.h"

LEAK_CHECKED_SUITE(join);

#define WAIT_S 60

static const char *env_path(const char *var)
{
    const char *p = getenv(var);
    cr_assert(p && *p, "%s is not set: run this test through meson", var);
    return p;
}

/* Run argv with stderr to `err` (NUL-terminated, up to len); its exit code. */
static int run(char *const argv[], char *err, size_t len)
{
    char path[64];
    snprintf(path, sizeof(path), "/tmp/%s.err", test_ns("join"));
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0 || dup2(fd, 2) != 2)
            _exit(126);
        execv(argv[0], argv);
        _exit(127);
    }
    int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
    struct pollfd p = {.fd = pfd, .events = POLLIN};
    cr_assert_eq(poll(&p, 1, WAIT_S * 1000), 1, "%s did not end within %d s", argv[0], WAIT_S);
    close(pfd);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(err, 1, len - 1, f) : 0;
    err[n] = 0;
    if (f)
        fclose(f);
    unlink(path);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

Test(join, a_program_joins_a_free_rank_and_leaves, .timeout = 120)
{
    char dir[64], err[16384];
    snprintf(dir, sizeof(dir), "/tmp/%s", test_ns("joindir"));
    cr_assert(mkdir(dir, 0700) == 0 || errno == EEXIST);
    const char *shmrun = env_path("SHMRUN"), *prog = env_path("ELASTIC_PROG");
    char *argv[] = {(char *)shmrun, "-n", "2", "--max-workers", "3", "--name-prefix", (char *)test_ns("join1"),
                    "--shm-size", "256M", "--", (char *)prog, "host", (char *)shmrun, dir, NULL};
    int st = run(argv, err, sizeof(err));
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(st, 0, "the elastic job: %d; its stderr:\n%s", st, err);
}

/* A joined worker killed in a job that replaces ranks is not replaced by
 * the job's own program (the supervisor keeps no joiner's program): its
 * rank is freed and the job goes on (elastic_prog host-kill). */
Test(join, a_killed_joiner_frees_its_rank_under_rank_restarts, .timeout = 120)
{
    char dir[64], err[16384];
    snprintf(dir, sizeof(dir), "/tmp/%s", test_ns("joinkdir"));
    cr_assert(mkdir(dir, 0700) == 0 || errno == EEXIST);
    const char *shmrun = env_path("SHMRUN"), *prog = env_path("ELASTIC_PROG");
    char *argv[] = {(char *)shmrun, "-n", "2", "--max-workers", "3", "--restart", "rank", "--max-restarts", "1",
                    "--name-prefix", (char *)test_ns("joink"), "--shm-size", "256M", "--", (char *)prog,
                    "host-kill", (char *)shmrun, dir, NULL};
    int st = run(argv, err, sizeof(err));
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(st, 0, "the elastic job: %d; its stderr:\n%s", st, err);
    cr_assert(strstr(err, "joined with --join) was killed by signal SIGKILL") && strstr(err, "rank 2 is free") &&
                  !strstr(err, "replaced by pid"),
              "shmrun's report of the killed joiner:\n%s", err);
}

Test(join, no_such_job, .timeout = 30)
{
    char err[4096];
    char *argv[] = {(char *)env_path("SHMRUN"), "--join", "999999999", "--", (char *)env_path("ELASTIC_PROG"),
                    "joiner", "x", NULL};
    int st = run(argv, err, sizeof(err));
    cr_assert_eq(st, 1, "%d: %s", st, err);
    cr_assert(strstr(err, "shmrun: --join 999999999: no such job"), "%s", err);
}

Test(join, bad_command_lines, .timeout = 30)
{
    char err[4096];
    const char *shmrun = env_path("SHMRUN");
    char *a1[] = {(char *)shmrun, "-n", "2", "--join", "1", "--", "/bin/true", NULL};
    cr_assert_eq(run(a1, err, sizeof(err)), 2, "%s", err);
    cr_assert(strstr(err, "--join runs one worker in a job that exists: -n is not for it"), "%s", err);
    char *a2[] = {(char *)shmrun, "-n", "3", "--max-workers", "2", "--", "/bin/true", NULL};
    cr_assert_eq(run(a2, err, sizeof(err)), 2, "%s", err);
    cr_assert(strstr(err, "--max-workers must be at least -n, not 2"), "%s", err);
    char *a3[] = {(char *)shmrun, "-n", "1", "--rank", "1", "--", "/bin/true", NULL};
    cr_assert_eq(run(a3, err, sizeof(err)), 2, "%s", err);
    cr_assert(strstr(err, "--rank goes with --join"), "%s", err);
}

/* ---- sr_spawn runs the same supervisor: shmrun --join works for its jobs ---- */
static _Atomic uint32_t hellos; /* in rank 0's process: the joiner said hello */

static int fn_hello(sr_call *c)
{
    atomic_fetch_add_explicit(&hellos, 1, memory_order_release); /* release: pairs with wait_hello */
    syscall(SYS_futex, &hellos, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
    return sr_call_return(c, NULL);
}

static int wait_hello(void)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (!atomic_load_explicit(&hellos, memory_order_acquire)) { /* acquire: pairs with fn_hello */
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > WAIT_S)
            return -ETIMEDOUT;
        struct timespec slice = {1, 0}; /* a bound per futex wait; the wake ends it at once */
        syscall(SYS_futex, &hellos, FUTEX_WAIT_PRIVATE, 0, &slice, NULL, 0);
    }
    return 0;
}

/* Rank 0: the joiner (bob, rank 2) says hello, is asked to leave, leaves. */
static int joiner_leaves(void)
{
    WCHECK(wait_hello() == 0, "the joiner never said hello");
    WCHECK(sr_worker_rank("bob") == 2, "bob: %s", sr_last_error());
    WCHECK(sr_rpc_sync(2, "leave", SR_ARGS(), WAIT_S, NULL) == 0, "leave: %s", sr_last_error());
    WCHECK(sr_wait_for_departure(2, WAIT_S) == 0, "bob never left: %s", sr_last_error());
    return 0;
}

/* Rank 0: its shmrun --join (pid) exits 0. */
static int joiner_exits(pid_t pid)
{
    int pfd = (int)syscall(SYS_pidfd_open, pid, 0), st = -1;
    struct pollfd p = {.fd = pfd, .events = POLLIN};
    bool ok = pfd >= 0 && poll(&p, 1, WAIT_S * 1000) == 1 && waitpid(pid, &st, 0) == pid;
    if (pfd >= 0)
        close(pfd);
    WCHECK(ok && WIFEXITED(st) && WEXITSTATUS(st) == 0, "shmrun --join: status %#x", st);
    return 0;
}

static int spawn_worker(int rank, int world, void *arg)
{
    const char **paths = arg;
    sr_register("hello", fn_hello);
    WCHECK(world == 3 && sr_init(NULL) == 0, "rank %d: sr_init: %s", rank, sr_last_error());
    if (rank == 0) {
        const char *id = sr_job_id();
        WCHECK(id, "no job id in an elastic sr_spawn job");
        pid_t pid = fork();
        if (pid == 0) {
            execl(paths[0], paths[0], "--join", id, "--rank", "2", "--", paths[1], "joiner", "bob", (char *)NULL);
            _exit(127);
        }
        WCHECK(pid > 0 && joiner_leaves() == 0 && joiner_exits(pid) == 0, "the joiner's round failed");
    }
    int rc = sr_shutdown(true, WAIT_S);
    WCHECK(rc == 0, "rank %d: leave: %s", rank, sr_last_error());
    return 0;
}

Test(join, shmrun_joins_an_sr_spawn_job, .timeout = 120)
{
    const char *paths[2] = {env_path("SHMRUN"), env_path("ELASTIC_PROG")};
    sr_spawn_opts o = {.name_prefix = test_ns("join2"), .shm_size = 3 * (64u << 20), .max_workers = 3};
    int rc = sr_spawn(2, spawn_worker, paths, &o);
    cr_assert_eq(rc, 0, "job: %d: %s", rc, sr_last_error());
}

/* ---- a signal caught by the supervisor while it reads a join request ---- */

/* Regression: the supervisor read a join request from a socket with a
 * receive timeout, where a caught signal fails the read with EINTR even
 * under SA_RESTART; it took that for a malformed request and closed the
 * connection, and the client's send failed with EPIPE ("cannot send the
 * request: Broken pipe"). Seen in this file's test above, whose process
 * (the supervisor) catches SIGCHLD. Here rank 0 joins by hand, as shmrun
 * --join does, and signals the supervisor (a handler, SA_RESTART) for 300
 * ms after connecting and before sending: the supervisor waits for the
 * request during that time (it no longer blocks in that wait, see the next
 * test, but a signal in it must still refuse nothing). */
static void on_usr1(int sig) { (void)sig; }

static int join_socket(const char *id)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    int n = snprintf(a.sun_path + 1, sizeof(a.sun_path) - 1, "shmrpc-job-%s", id);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n))) {
        close(fd);
        return -1;
    }
    return fd;
}

/* The request for rank 2: our stdio, then "2\0cwd\0prog\0joiner\0bob\0". */
static int send_join(int fd, const char *prog)
{
    char buf[1024], cwd[512];
    if (!getcwd(cwd, sizeof(cwd)))
        return -1;
    int len = snprintf(buf, sizeof(buf), "2%c%s%c%s%cjoiner%cbob", 0, cwd, 0, prog, 0, 0) + 1;
    int fds[3] = {0, 1, 2};
    char ctl[CMSG_SPACE(sizeof(fds))] = {0};
    struct iovec iov = {.iov_base = buf, .iov_len = (size_t)len};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof(ctl)};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(fds));
    memcpy(CMSG_DATA(c), fds, sizeof(fds));
    return sendmsg(fd, &m, MSG_NOSIGNAL) == len ? 0 : -1;
}

/* One line from the supervisor (bounded by WAIT_S), NUL-terminated. */
static void read_line(int fd, char *buf, size_t cap)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    ssize_t n = poll(&p, 1, WAIT_S * 1000) == 1 ? recv(fd, buf, cap - 1, 0) : -1;
    buf[n > 0 ? n : 0] = 0;
}

static int signalled_join_worker(int rank, int world, void *arg)
{
    const char *prog = arg;
    sr_register("hello", fn_hello);
    WCHECK(world == 3 && sr_init(NULL) == 0, "rank %d: sr_init: %s", rank, sr_last_error());
    if (rank == 0) {
        int fd = join_socket(sr_job_id());
        WCHECK(fd >= 0, "cannot connect to job %s: %s", sr_job_id(), strerror(errno));
        struct pollfd p = {.fd = fd, .events = POLLIN};
        for (int i = 0; i < 300 && poll(&p, 1, 1) == 0; i++) /* 1 ms apart; an early answer ends it */
            kill(getppid(), SIGUSR1);
        WCHECK(send_join(fd, prog) == 0, "cannot send the request: %s", strerror(errno));
        char line[256];
        read_line(fd, line, sizeof(line));
        WCHECK(!strncmp(line, "rank 2 pid ", 11), "the supervisor answered '%s'", line);
        WCHECK(joiner_leaves() == 0, "the joiner's round failed");
        read_line(fd, line, sizeof(line));
        WCHECK(!strcmp(line, "exit 0"), "the supervisor's last word: '%s'", line);
        close(fd);
    }
    int rc = sr_shutdown(true, WAIT_S);
    WCHECK(rc == 0, "rank %d: leave: %s", rank, sr_last_error());
    return 0;
}

Test(join, a_signal_while_the_supervisor_reads_a_request_refuses_nothing, .timeout = 120)
{
    struct sigaction sa = {.sa_handler = on_usr1, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    cr_assert_eq(sigaction(SIGUSR1, &sa, NULL), 0);
    sr_spawn_opts o = {.name_prefix = test_ns("join3"), .shm_size = 3 * (64u << 20), .max_workers = 3};
    int rc = sr_spawn(2, signalled_join_worker, (void *)env_path("ELASTIC_PROG"), &o);
    cr_assert_eq(rc, 0, "job: %d: %s", rc, sr_last_error());
}

/* ---- a client that connects and sends nothing holds nothing up ---- */

/* Regression: the supervisor read each join request with a blocking
 * recvmsg (5 s at most), so a client that connected and sent nothing held
 * it for 5 s: no join, no worker's exit, no signal was handled meanwhile.
 * Here rank 0 connects such a client first, then runs shmrun --join: the
 * joiner must come, be called and leave while the mute client is still
 * waiting, unanswered; then the mute client is refused at its deadline,
 * saying why. */
static int mute_client_worker(int rank, int world, void *arg)
{
    const char **paths = arg;
    sr_register("hello", fn_hello);
    WCHECK(world == 3 && sr_init(NULL) == 0, "rank %d: sr_init: %s", rank, sr_last_error());
    if (rank == 0) {
        int mute = join_socket(sr_job_id());
        WCHECK(mute >= 0, "cannot connect to job %s: %s", sr_job_id(), strerror(errno));
        pid_t pid = fork();
        if (pid == 0) {
            execl(paths[0], paths[0], "--join", sr_job_id(), "--rank", "2", "--", paths[1], "joiner", "bob",
                  (char *)NULL);
            _exit(127);
        }
        WCHECK(pid > 0 && joiner_leaves() == 0, "the joiner's round failed");
        struct pollfd p = {.fd = mute, .events = POLLIN};
        WCHECK(poll(&p, 1, 0) == 0, "the mute client was answered before the joiner left (revents %#x)", p.revents);
        char line[256];
        read_line(mute, line, sizeof(line));
        WCHECK(strstr(line, "no request within 5 s"), "the mute client was told '%s'", line);
        close(mute);
        WCHECK(joiner_exits(pid) == 0, "the joiner's shmrun --join failed");
    }
    int rc = sr_shutdown(true, WAIT_S);
    WCHECK(rc == 0, "rank %d: leave: %s", rank, sr_last_error());
    return 0;
}

Test(join, a_client_that_sends_nothing_holds_up_no_join, .timeout = 120)
{
    const char *paths[2] = {env_path("SHMRUN"), env_path("ELASTIC_PROG")};
    sr_spawn_opts o = {.name_prefix = test_ns("join4"), .shm_size = 3 * (64u << 20), .max_workers = 3};
    int rc = sr_spawn(2, mute_client_worker, paths, &o);
    cr_assert_eq(rc, 0, "job: %d: %s", rc, sr_last_error());
}

/* At most SR_JOIN_PENDING (8) connections wait for their request at a time:
 * a ninth is told at once to try again, while the eight still wait. */
static int crowd_worker(int rank, int world, void *arg)
{
    (void)arg;
    WCHECK(world == 3 && sr_init(NULL) == 0, "rank %d: sr_init: %s", rank, sr_last_error());
    if (rank == 0) {
        int fds[9];
        for (int i = 0; i < 9; i++)
            WCHECK((fds[i] = join_socket(sr_job_id())) >= 0, "connection %d: %s", i, strerror(errno));
        char line[256];
        read_line(fds[8], line, sizeof(line));
        WCHECK(strstr(line, "has 8 joins waiting for their requests already: try again"), "the ninth was told '%s'",
               line);
        for (int i = 0; i < 8; i++) {
            struct pollfd p = {.fd = fds[i], .events = POLLIN};
            WCHECK(poll(&p, 1, 0) == 0, "connection %d was answered (revents %#x)", i, p.revents);
        }
        for (int i = 0; i < 9; i++)
            close(fds[i]);
    }
    int rc = sr_shutdown(true, WAIT_S);
    WCHECK(rc == 0, "rank %d: shutdown: %s", rank, sr_last_error());
    return 0;
}

Test(join, a_ninth_waiting_client_is_told_to_try_again, .timeout = 120)
{
    sr_spawn_opts o = {.name_prefix = test_ns("join5"), .shm_size = 2 * (64u << 20), .max_workers = 3};
    int rc = sr_spawn(2, crowd_worker, NULL, &o);
    cr_assert_eq(rc, 0, "job: %d: %s", rc, sr_last_error());
}

/* ---- the supervisor out of file descriptors ---- */

/* Regression: when accept4 failed for another reason than EAGAIN (EMFILE:
 * the supervisor's descriptors all taken), the connection stayed in the
 * backlog, the listening socket was polled again at once and was readable
 * again at once: the supervisor spun, and the client waited unanswered. */

/* This process's descriptors, all taken: dups of /dev/null up to a soft
 * limit lowered to a few above the highest open one (the old limit in
 * *old). How many were taken, in fds[]. */
static int take_all_fds(int *fds, int cap, struct rlimit *old)
{
    int top = dup(0); /* the lowest free descriptor: those above it are few in a test's process */
    close(top);
    getrlimit(RLIMIT_NOFILE, old);
    struct rlimit low = {.rlim_cur = (rlim_t)top + (rlim_t)cap / 2, .rlim_max = old->rlim_max};
    if (setrlimit(RLIMIT_NOFILE, &low))
        return -1;
    int n = 0;
    while (n < cap && (fds[n] = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0)
        n++;
    return n < cap && errno == EMFILE ? n : -1;
}

static void give_back_fds(int *fds, int n, const struct rlimit *old)
{
    for (int i = 0; i < n; i++)
        close(fds[i]);
    setrlimit(RLIMIT_NOFILE, old);
}

/* sr__job_accept out of descriptors, on its own: with its spare descriptor
 * it refuses the waiting client, saying why; without one it backs off
 * (SR_JOIN_BACKOFF_NS, a due time the supervisor waits for) rather than
 * leave the socket readable; with descriptors again, it accepts. */
Test(join, accept_out_of_descriptors_refuses_or_backs_off, .timeout = 60)
{
    sr_job job = {.who = "test", .listen_fd = -1, .spare_fd = -1};
    for (int i = 0; i < SR_JOIN_PENDING; i++)
        job.pending[i].fd = -1;
    cr_assert_eq(sr__job_listen(&job), 0, "%s", sr_last_error());
    cr_assert_geq(job.spare_fd, 0, "no spare descriptor");
    int c1 = join_socket(job.id), fds[256];
    cr_assert_geq(c1, 0, "connect: %s", strerror(errno));
    struct rlimit old;
    int n = take_all_fds(fds, 256, &old);
    cr_assert_gt(n, 0, "cannot take every descriptor: %s", strerror(errno));

    cr_assert_eq(sr__job_accept(&job), -1);
    char line[256];
    read_line(c1, line, sizeof(line));
    cr_assert(strstr(line, "cannot take a join now: its supervisor is out of file descriptors"), "told '%s'", line);
    cr_assert_eq(job.accept_resume, 0, "backed off although the client was answered");
    cr_assert_geq(job.spare_fd, 0, "the spare descriptor was not taken again");

    close(fds[--n]); /* a descriptor for the next client; then none spare */
    int c2 = join_socket(job.id);
    cr_assert_geq(c2, 0, "connect: %s", strerror(errno));
    close(job.spare_fd);
    job.spare_fd = -1;
    cr_assert_geq(fds[n] = open("/dev/null", O_RDONLY | O_CLOEXEC), 0);
    n++;
    int64_t t0 = sr__now_ns();
    cr_assert_eq(sr__job_accept(&job), -1);
    cr_assert_eq(job.accept_err, EMFILE);
    cr_assert_eq(job.spare_fd, -1);
    cr_assert(job.accept_resume >= t0 + SR_JOIN_BACKOFF_NS, "no back-off: resume at %lld, now %lld",
              (long long)job.accept_resume, (long long)t0);
    cr_assert_eq(sr__job_join_due(&job), job.accept_resume, "the back-off is not a due time");
    struct pollfd p = {.fd = c2, .events = POLLIN};
    cr_assert_eq(poll(&p, 1, 0), 0, "the client was answered (revents %#x)", p.revents);

    give_back_fds(fds, n, &old);
    int e = sr__job_accept(&job);
    cr_assert_geq(e, 0, "not accepted with descriptors back");
    cr_assert_eq(job.accept_err, 0);
    close(job.pending[e].fd);
    close(c1);
    close(c2);
    close(job.listen_fd);
}

/* The same in a job: the supervisor (this process) is out of descriptors
 * while rank 0 connects, and answers; given them back, it reads a request
 * again (a malformed one, refused as such). The supervisor's descriptors
 * are taken by a thread of this process when rank 0 asks (pipes made before
 * the job, inherited by its workers). */
static int ask[2], done[2];

static void *fd_taker(void *arg)
{
    (void)arg;
    char c;
    int fds[256], n = -1;
    struct rlimit old;
    if (read(ask[0], &c, 1) == 1)
        n = take_all_fds(fds, 256, &old);
    c = n > 0 ? 'y' : 'n';
    (void)!write(done[1], &c, 1);
    if (n > 0 && read(ask[0], &c, 1) == 1) {
        give_back_fds(fds, n, &old);
        (void)!write(done[1], &c, 1);
    }
    return NULL;
}

/* Rank 0: one byte to the taker, its answer within WAIT_S. */
static int ask_taker(void)
{
    char c = 'g';
    struct pollfd p = {.fd = done[0], .events = POLLIN};
    WCHECK(write(ask[1], &c, 1) == 1 && poll(&p, 1, WAIT_S * 1000) == 1 && read(done[0], &c, 1) == 1 && c != 'n',
           "the supervisor's descriptors were not taken or given back");
    return 0;
}

static int emfile_worker(int rank, int world, void *arg)
{
    (void)arg;
    WCHECK(world == 3 && sr_init(NULL) == 0, "rank %d: sr_init: %s", rank, sr_last_error());
    if (rank == 0) {
        WCHECK(ask_taker() == 0, "taking");
        int fd = join_socket(sr_job_id());
        WCHECK(fd >= 0, "cannot connect to job %s: %s", sr_job_id(), strerror(errno));
        char line[256];
        read_line(fd, line, sizeof(line));
        WCHECK(strstr(line, "its supervisor is out of file descriptors"), "the supervisor answered '%s'", line);
        close(fd);
        WCHECK(ask_taker() == 0, "giving back");
        fd = join_socket(sr_job_id());
        WCHECK(fd >= 0 && send(fd, "x", 1, 0) == 1, "cannot send to job %s: %s", sr_job_id(), strerror(errno));
        read_line(fd, line, sizeof(line));
        WCHECK(strstr(line, "a malformed request"), "the supervisor answered '%s'", line);
        close(fd);
    }
    int rc = sr_shutdown(true, WAIT_S);
    WCHECK(rc == 0, "rank %d: shutdown: %s", rank, sr_last_error());
    return 0;
}

Test(join, a_supervisor_out_of_descriptors_answers_and_recovers, .timeout = 120)
{
    cr_assert_eq(pipe2(ask, O_CLOEXEC) || pipe2(done, O_CLOEXEC), 0);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, fd_taker, NULL), 0);
    sr_spawn_opts o = {.name_prefix = test_ns("join6"), .shm_size = 2 * (64u << 20), .max_workers = 3};
    int rc = sr_spawn(2, emfile_worker, NULL, &o);
    close(ask[1]); /* the taker's wait ends, if rank 0 never asked */
    pthread_join(t, NULL);
    cr_assert_eq(rc, 0, "job: %d: %s", rc, sr_last_error());
}

/* ---- a client of another user ---- */

/* The join socket is an abstract one (no file permissions): the supervisor
 * refuses a client whose SO_PEERCRED uid is not its own, saying why. Rank 0
 * forks a client that becomes user nobody first (so the test needs root,
 * which CI has; elsewhere it is skipped, saying why). */
static int other_user_worker(int rank, int world, void *arg)
{
    (void)arg;
    WCHECK(world == 3 && sr_init(NULL) == 0, "rank %d: sr_init: %s", rank, sr_last_error());
    if (rank == 0) {
        int p[2];
        WCHECK(pipe2(p, O_CLOEXEC) == 0, "pipe: %s", strerror(errno));
        pid_t pid = fork();
        if (pid == 0) {
            char line[256] = "cannot become user 65534";
            int fd = -1;
            if (setgid(65534) == 0 && setuid(65534) == 0 && getuid() == 65534) {
                fd = join_socket(sr_job_id());
                if (fd >= 0)
                    read_line(fd, line, sizeof(line));
                else
                    snprintf(line, sizeof(line), "cannot connect: %s", strerror(errno));
            }
            (void)!write(p[1], line, strlen(line) + 1);
            _exit(0);
        }
        close(p[1]);
        char line[256] = "";
        struct pollfd pf = {.fd = p[0], .events = POLLIN};
        ssize_t n = poll(&pf, 1, WAIT_S * 1000) == 1 ? read(p[0], line, sizeof(line) - 1) : -1;
        line[n > 0 ? n : 0] = 0;
        close(p[0]);
        WCHECK(pid > 0 && joiner_exits(pid) == 0, "the other user's client did not exit");
        WCHECK(strstr(line, "accepts joins from its own user only"), "the other user was told '%s'", line);
    }
    int rc = sr_shutdown(true, WAIT_S);
    WCHECK(rc == 0, "rank %d: shutdown: %s", rank, sr_last_error());
    return 0;
}

Test(join, a_client_of_another_user_is_refused, .timeout = 120)
{
    if (geteuid() != 0)
        cr_skip_test("needs root, to run a client as another user");
    sr_spawn_opts o = {.name_prefix = test_ns("join7"), .shm_size = 2 * (64u << 20), .max_workers = 3};
    int rc = sr_spawn(2, other_user_worker, NULL, &o);
    cr_assert_eq(rc, 0, "job: %d: %s", rc, sr_last_error());
}
