/* SPDX-License-Identifier: MIT */
/* A worker for test_launcher.c, run under shmrun.
 *
 *   worker_prog READY_FD GO_FD WORLD_SIZE MODE [ARGS...]
 *
 * Every mode first checks the launch contract, before touching the transport:
 *   - SHMRPC_WORLD_SIZE equals WORLD_SIZE, SHMRPC_RANK is in [0, WORLD_SIZE),
 *     SHMRPC_FD is an open memfd holding a valid segment for that world size;
 *   - RANK and LOCAL_RANK equal SHMRPC_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE
 *     equal SHMRPC_WORLD_SIZE (torchrun's variables);
 *   - the only open descriptors are 0-2, READY_FD, GO_FD, the segment and the
 *     doorbell eventfds named in the worker table: nothing of shmrun's
 *     (signalfd, pidfds, io_uring) leaks into a worker.
 * A broken contract prints one line and exits EXIT_ENV / EXIT_FD.
 *
 * Then it attaches with sr__xport_attach (whose start barrier means every
 * worker is up) and reports readiness as an event: one write of
 * "RANK PID\n" to READY_FD. Then, by MODE:
 *   ok            detach and exit 0
 *   exit R CODE   rank R reads one byte from GO_FD, then _exit(CODE)
 *   abort R       rank R reads one byte from GO_FD, then abort()
 *   serving R     as abort, while marked as serving a call to 'train_step'
 *                 from rank 0 (crash.h): the report must name them
 *   restart R F   prints "attempt RANK N T" (N: SHMRPC_RESTART_COUNT, T:
 *                 TORCHELASTIC_RESTART_COUNT) before its readiness line; on attempts N < F rank R reads
 *                 one byte from GO_FD, then kills itself with SIGKILL; on
 *                 attempt F every rank detaches and exits 0
 *   blasenv       prints "blasenv RANK VALUE": its OPENBLAS_NUM_THREADS, or
 *                 (unset); detaches and exits 0
 *   block         nothing more
 *   early R       rank R exits 0 before attaching; every other rank's attach
 *                 must fail at once with -EPIPE naming it (then it exits 0;
 *                 otherwise it prints what it got and exits EXIT_ATTACH)
 *   early-init R  the same through the public sr_init
 *   say           writes "part " on stdout before attaching and "of rank R\n"
 *                 after (so every rank's line is half written when the first
 *                 is finished), then on stderr "error: same on every rank\n"
 *                 and "note from rank R\n"; attaches as "trainerR"; exits 0
 *   stdin         prints "stdin R FILE 'TEXT'" (what fd 0 is, what it held)
 *   signals       waits (handlers) until it has received SIGHUP, SIGQUIT,
 *                 SIGUSR1 and SIGUSR2, prints "signals R" and exits 0
 *   term R        every rank ignores SIGTERM but R, which exits 0 on it; blocks
 *   affinity      prints "affinity R CPULIST" (its sched_getaffinity) and exits 0
 *   orphans       forks a child that blocks (on a pipe nobody writes, for at
 *                 most 10 minutes) and one that execs "sleep 1000", both with
 *                 /dev/null as stdio; once the second has exec'd prints
 *                 "orphans R FORKED EXECED" (their pids), reads one byte from
 *                 GO_FD, detaches and exits 0, leaving both behind
 * Every other rank blocks: it waits for messages (sr__xport_wait, no deadline)
 * until it is killed. It never exits by itself, so a test that finds it gone
 * knows that the launcher killed it.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "crash.h"
#include "error.h"
#include "shmrpc/shmrpc.h"
#include "shm/xport.h"

enum { EXIT_USAGE = 40, EXIT_ENV = 41, EXIT_FD = 42, EXIT_ATTACH = 43, EXIT_IO = 44 };

static int world, ready_fd, go_fd;

static _Noreturn void die(int code, const char *what)
{
    fprintf(stderr, "worker_prog: %s\n", what);
    fflush(stderr);
    _exit(code);
}

static int env_num(const char *name)
{
    const char *s = getenv(name);
    char *end;
    long v = s ? strtol(s, &end, 10) : -1;
    if (!s || end == s || *end) {
        fprintf(stderr, "worker_prog: %s=\"%s\" is not a number\n", name, s ? s : "(unset)");
        _exit(EXIT_ENV);
    }
    return (int)v;
}

static bool fd_expected(int fd, const sr_segment *seg, int seg_fd)
{
    if (fd <= 2 || fd == ready_fd || fd == go_fd || fd == seg_fd)
        return true;
    for (int r = 0; r < world; r++)
        if (sr__seg_worker(seg, r)->eventfd == fd)
            return true;
    return false;
}

/* Every open fd is one the launch contract gives us. */
static void check_fds(const sr_segment *seg, int seg_fd)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        die(EXIT_FD, "cannot list /proc/self/fd");
    struct dirent *e;
    char path[64], target[256];
    while ((e = readdir(d))) {
        int fd = atoi(e->d_name);
        if (e->d_name[0] == '.' || fd == dirfd(d) || fd_expected(fd, seg, seg_fd))
            continue;
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        ssize_t n = readlink(path, target, sizeof(target) - 1);
        target[n > 0 ? n : 0] = 0;
        fprintf(stderr, "worker_prog: rank %s: unexpected inherited fd %d -> %s\n", getenv("SHMRPC_RANK"), fd, target);
        _exit(EXIT_FD);
    }
    closedir(d);
}

static void check_launch_contract(void)
{
    int n = env_num("SHMRPC_WORLD_SIZE"), rank = env_num("SHMRPC_RANK"), fd = env_num("SHMRPC_FD");
    char path[64], target[256];
    if (n != world || rank < 0 || rank >= n) {
        fprintf(stderr, "worker_prog: SHMRPC_WORLD_SIZE=%d SHMRPC_RANK=%d, expected a rank of a world of %d\n", n, rank,
                world);
        _exit(EXIT_ENV);
    }
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    ssize_t len = readlink(path, target, sizeof(target) - 1);
    target[len > 0 ? len : 0] = 0;
    if (strncmp(target, "/memfd:", 7)) {
        fprintf(stderr, "worker_prog: SHMRPC_FD=%d is '%s', not a memfd\n", fd, target);
        _exit(EXIT_ENV);
    }
    static const char *const torch[][2] = {{"RANK", "SHMRPC_RANK"}, {"LOCAL_RANK", "SHMRPC_RANK"},
                                           {"WORLD_SIZE", "SHMRPC_WORLD_SIZE"},
                                           {"LOCAL_WORLD_SIZE", "SHMRPC_WORLD_SIZE"}};
    for (int i = 0; i < 4; i++)
        if (env_num(torch[i][0]) != env_num(torch[i][1])) {
            fprintf(stderr, "worker_prog: %s=%d but %s=%d\n", torch[i][0], env_num(torch[i][0]), torch[i][1],
                    env_num(torch[i][1]));
            _exit(EXIT_ENV);
        }
    sr_segment seg;
    if (sr__segment_attach(fd, &seg) || seg.world != (uint32_t)n)
        die(EXIT_ENV, "SHMRPC_FD is not a segment for this world size");
    check_fds(&seg, fd);
    sr__segment_detach(&seg, false);
}

static _Noreturn void block_forever(sr_xport *x)
{
    sr_msg m;
    for (;;) {
        int ev = sr__xport_wait(x, -1);
        if (ev < 0)
            die(EXIT_IO, sr_last_error());
        while (sr__xport_recv_burst(x, &m, 1))
            ; /* nobody sends: tolerated, not expected */
    }
}

static void wait_go(void)
{
    char c;
    ssize_t n;
    while ((n = read(go_fd, &c, 1)) < 0 && errno == EINTR)
        ;
    if (n != 1) /* the test went away: do not fail on its behalf */
        _exit(EXIT_IO);
}

/* Mode early: no readiness line (nobody gets past the start barrier). */
static int early(int chosen, bool api)
{
    if (env_num("SHMRPC_RANK") == chosen)
        return 0; /* gone before attaching */
    sr_xport *x;
    int rc = api ? sr_init(NULL) : sr__xport_attach(NULL, &x);
    char want[64];
    snprintf(want, sizeof(want), "rank %d exited with status 0 before attaching", chosen);
    if (rc == -EPIPE && strstr(sr_last_error(), want))
        return 0;
    if (!rc && api)
        sr_shutdown(false, 0);
    else if (!rc)
        sr__xport_detach(x);
    fprintf(stderr, "worker_prog: attach gave %d (%s), expected -EPIPE with '%s'\n", rc, sr_last_error(), want);
    return EXIT_ATTACH;
}

static void put(int fd, const char *s)
{
    size_t len = strlen(s);
    if (write(fd, s, len) != (ssize_t)len)
        die(EXIT_IO, "write failed");
}

static int say(sr_xport *x)
{
    char line[64];
    snprintf(line, sizeof(line), "of rank %d\n", x->rank);
    put(1, line);
    put(2, "error: same on every rank\n");
    snprintf(line, sizeof(line), "note from rank %d\n", x->rank);
    put(2, line);
    sr__xport_detach(x);
    return 0;
}

/* What fd 0 is ("/dev/null", "pipe:[N]") and what it holds. */
static int print_stdin(int rank)
{
    char target[64] = "", text[64] = "", line[200];
    ssize_t n = readlink("/proc/self/fd/0", target, sizeof(target) - 1);
    target[n > 0 ? n : 0] = 0;
    size_t len = 0;
    while (len < sizeof(text) - 1 && (n = read(0, text + len, sizeof(text) - 1 - len)) > 0)
        len += (size_t)n;
    text[len] = 0;
    text[strcspn(text, "\n")] = 0;
    snprintf(line, sizeof(line), "stdin %d %s '%s'\n", rank, target, text);
    put(1, line);
    return 0;
}

static const int waited[] = {SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
static _Atomic int sigs_seen; /* bit i: waited[i] arrived */
static int sig_pipe[2];       /* the handler's wake-up for the main thread */

/* Handlers, not sigwaitinfo: a process-directed signal may be delivered to
 * any thread that does not block it, such as the thread pool OpenBLAS
 * starts before main; a handler runs wherever it lands. */
static void on_signal(int sig)
{
    for (int i = 0; i < 4; i++)
        if (sig == waited[i])
            atomic_fetch_or(&sigs_seen, 1 << i); /* lock-free: async-signal-safe */
    int saved = errno;
    if (write(sig_pipe[1], "s", 1) < 0) { /* the pipe cannot fill: 4 signals */
    }
    errno = saved;
}

/* Before readiness, so that no forwarded signal finds the default action. */
static void catch_signals(void)
{
    if (pipe(sig_pipe))
        die(EXIT_IO, "pipe failed");
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 4; i++)
        sigaction(waited[i], &sa, NULL);
}

static int wait_signals(int rank)
{
    char c;
    while (atomic_load(&sigs_seen) != 15)
        if (read(sig_pipe[0], &c, 1) < 0 && errno != EINTR)
            die(EXIT_IO, "read of the signal pipe failed");
    char line[32];
    snprintf(line, sizeof(line), "signals %d\n", rank);
    put(1, line);
    return 0;
}

static void exit_0(int sig)
{
    (void)sig;
    _exit(0);
}

static int print_affinity(sr_xport *x)
{
    cpu_set_t set;
    char line[4096];
    if (sched_getaffinity(0, sizeof(set), &set))
        die(EXIT_IO, "sched_getaffinity failed");
    int len = snprintf(line, sizeof(line), "affinity %d", x->rank);
    char sep = ' ';
    for (int c = 0; c < CPU_SETSIZE && len < (int)sizeof(line) - 16; c++)
        if (CPU_ISSET(c, &set)) {
            len += snprintf(line + len, sizeof(line) - (size_t)len, "%c%d", sep, c);
            sep = ',';
        }
    snprintf(line + len, sizeof(line) - (size_t)len, "\n");
    put(1, line);
    sr__xport_detach(x);
    return 0;
}

/* A child of the worker, its stdio on /dev/null and without the test's
 * pipes: it holds nothing the test waits on, only what shmrpc gave it. */
static pid_t orphan(bool exec, int exec_done)
{
    pid_t pid = fork();
    if (pid)
        return pid;
    int null = open("/dev/null", O_RDWR);
    if (null < 0 || dup2(null, 0) < 0 || dup2(null, 1) < 0 || dup2(null, 2) < 0)
        _exit(EXIT_IO);
    close(ready_fd), close(go_fd);
    if (exec) {
        execlp("sleep", "sleep", "1000", (char *)NULL); /* success closes exec_done (close-on-exec) */
        _exit(EXIT_IO);
    }
    close(exec_done);
    int p[2];
    if (pipe(p) == 0) /* nobody writes: only a signal ends this before its bound */
        poll(&(struct pollfd){.fd = p[0], .events = POLLIN}, 1, 600000);
    _exit(0);
}

static int orphans(sr_xport *x)
{
    int done[2];
    if (pipe2(done, O_CLOEXEC))
        die(EXIT_IO, "pipe2 failed");
    pid_t forked = orphan(false, done[1]), execed = orphan(true, done[1]);
    close(done[1]);
    char c, line[64];
    ssize_t n;
    while ((n = read(done[0], &c, 1)) < 0 && errno == EINTR)
        ;
    if (forked < 0 || execed < 0 || n != 0)
        die(EXIT_IO, "could not start both children");
    snprintf(line, sizeof(line), "orphans %d %d %d\n", x->rank, (int)forked, (int)execed);
    put(1, line);
    wait_go();
    sr__xport_detach(x);
    return 0;
}

/* Before the readiness line: a test that saw every rank ready has its line. */
static void put_attempt(int rank)
{
    char line[64];
    snprintf(line, sizeof(line), "attempt %d %d %d\n", rank, env_num("SHMRPC_RESTART_COUNT"),
             env_num("TORCHELASTIC_RESTART_COUNT"));
    put(1, line);
}

static int restart_mode(sr_xport *x, int chosen, int fails)
{
    if (env_num("SHMRPC_RESTART_COUNT") >= fails) {
        sr__xport_detach(x);
        return 0;
    }
    if (x->rank == chosen) {
        wait_go();
        raise(SIGKILL);
    }
    block_forever(x);
}

int main(int argc, char **argv)
{
    if (argc < 5)
        die(EXIT_USAGE, "usage: worker_prog READY_FD GO_FD WORLD_SIZE MODE [ARGS]");
    ready_fd = atoi(argv[1]);
    go_fd = atoi(argv[2]);
    world = atoi(argv[3]);
    const char *mode = argv[4];
    check_launch_contract();
    if (!strcmp(mode, "early") || !strcmp(mode, "early-init"))
        return early(argc > 5 ? atoi(argv[5]) : 0, mode[5] == '-');
    /* No core files from the abort case, wherever core_pattern points. */
    prctl(PR_SET_DUMPABLE, 0);
    int chosen = argc > 5 ? atoi(argv[5]) : -1;
    if (!strcmp(mode, "signals"))
        catch_signals();
    if (!strcmp(mode, "term"))
        signal(SIGTERM, env_num("SHMRPC_RANK") == chosen ? exit_0 : SIG_IGN);
    if (!strcmp(mode, "say"))
        put(1, "part ");
    char name[32];
    snprintf(name, sizeof(name), "trainer%d", env_num("SHMRPC_RANK"));
    sr_xport *x;
    if (sr__xport_attach(&(sr_xport_opts){.name = strcmp(mode, "say") ? NULL : name}, &x))
        die(EXIT_ATTACH, sr_last_error());
    if (!strcmp(mode, "restart"))
        put_attempt(x->rank);
    char line[32];
    int len = snprintf(line, sizeof(line), "%d %d\n", x->rank, (int)getpid());
    if (write(ready_fd, line, (size_t)len) != len) /* one write: lines never interleave */
        die(EXIT_IO, "cannot write the readiness line");
    if (!strcmp(mode, "ok")) {
        sr__xport_detach(x);
        return 0;
    }
    if (!strcmp(mode, "say"))
        return say(x);
    if (!strcmp(mode, "affinity"))
        return print_affinity(x);
    if (!strcmp(mode, "orphans"))
        return orphans(x);
    if (!strcmp(mode, "restart"))
        return restart_mode(x, chosen, argc > 6 ? atoi(argv[6]) : 1);
    if (!strcmp(mode, "blasenv")) { /* what OpenBLAS will read at load */
        const char *v = getenv("OPENBLAS_NUM_THREADS");
        char line[160];
        snprintf(line, sizeof(line), "blasenv %d %s\n", x->rank, v ? v : "(unset)");
        put(1, line);
        sr__xport_detach(x);
        return 0;
    }
    if (!strcmp(mode, "stdin") || !strcmp(mode, "signals")) {
        int rc = mode[1] == 't' ? print_stdin(x->rank) : wait_signals(x->rank);
        sr__xport_detach(x);
        return rc;
    }
    if (x->rank == chosen && !strcmp(mode, "exit") && argc > 6) {
        wait_go();
        _exit(atoi(argv[6])); /* _exit: the transport stays attached, as in a crash */
    }
    if (x->rank == chosen && !strcmp(mode, "abort")) {
        wait_go();
        abort();
    }
    if (x->rank == chosen && !strcmp(mode, "serving")) {
        wait_go();
        sr__serving_enter("train_step", 0);
        abort();
    }
    if (strcmp(mode, "block") && strcmp(mode, "exit") && strcmp(mode, "abort") && strcmp(mode, "serving") &&
        strcmp(mode, "term"))
        die(EXIT_USAGE, "unknown mode");
    block_forever(x);
}
