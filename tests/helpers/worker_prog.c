/* A worker for test_launcher.c, run under shmrun.
 *
 *   worker_prog READY_FD GO_FD WORLD_SIZE MODE [ARGS...]
 *
 * Every mode first checks the launch contract, before touching the transport:
 *   - SHMRPC_WORLD_SIZE equals WORLD_SIZE, SHMRPC_RANK is in [0, WORLD_SIZE),
 *     SHMRPC_FD is an open memfd holding a valid segment for that world size;
 *   - the only open descriptors are 0-2, READY_FD, GO_FD, the segment and the
 *     doorbell eventfds named in the worker table: nothing of shmrun's
 *     (signalfd, pidfds, io_uring) leaks into a worker.
 * A broken contract prints one line and exits EXIT_ENV / EXIT_FD.
 *
 * Then it attaches with sr_xport_attach (whose start barrier means every
 * worker is up) and reports readiness as an event: one write of
 * "RANK PID\n" to READY_FD. Then, by MODE:
 *   ok            detach and exit 0
 *   exit R CODE   rank R reads one byte from GO_FD, then _exit(CODE)
 *   abort R       rank R reads one byte from GO_FD, then abort()
 *   serving R     as abort, while marked as serving a call to 'train_step'
 *                 from rank 0 (crash.h): the report must name them
 *   block         nothing more
 *   early R       rank R exits 0 before attaching; every other rank's attach
 *                 must fail at once with -EPIPE naming it (then it exits 0;
 *                 otherwise it prints what it got and exits EXIT_ATTACH)
 * Every other rank blocks: it waits for messages (sr_xport_wait, no deadline)
 * until it is killed. It never exits by itself, so a test that finds it gone
 * knows that the launcher killed it.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "crash.h"
#include "error.h"
#include "xport.h"

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
        if (sr_seg_worker(seg, r)->eventfd == fd)
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
    sr_segment seg;
    if (sr_segment_attach(fd, &seg) || seg.hdr->world_size != (uint32_t)n)
        die(EXIT_ENV, "SHMRPC_FD is not a segment for this world size");
    check_fds(&seg, fd);
    sr_segment_detach(&seg, false);
}

static _Noreturn void block_forever(sr_xport *x)
{
    sr_msg m;
    for (;;) {
        int ev = sr_xport_wait(x, -1);
        if (ev < 0)
            die(EXIT_IO, sr_last_error());
        while (sr_xport_recv_burst(x, &m, 1))
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
static int early(int chosen)
{
    if (env_num("SHMRPC_RANK") == chosen)
        return 0; /* gone before attaching */
    sr_xport *x;
    int rc = sr_xport_attach(NULL, &x);
    char want[64];
    snprintf(want, sizeof(want), "rank %d exited with status 0 before attaching", chosen);
    if (rc == -EPIPE && strstr(sr_last_error(), want))
        return 0;
    if (!rc)
        sr_xport_detach(x);
    fprintf(stderr, "worker_prog: attach gave %d (%s), expected -EPIPE with '%s'\n", rc, sr_last_error(), want);
    return EXIT_ATTACH;
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
    if (!strcmp(mode, "early"))
        return early(argc > 5 ? atoi(argv[5]) : 0);
    /* No core files from the abort case, wherever core_pattern points. */
    prctl(PR_SET_DUMPABLE, 0);
    sr_xport *x;
    if (sr_xport_attach(NULL, &x))
        die(EXIT_ATTACH, sr_last_error());
    char line[32];
    int len = snprintf(line, sizeof(line), "%d %d\n", x->rank, (int)getpid());
    if (write(ready_fd, line, (size_t)len) != len) /* one write: lines never interleave */
        die(EXIT_IO, "cannot write the readiness line");
    if (!strcmp(mode, "ok")) {
        sr_xport_detach(x);
        return 0;
    }
    int chosen = argc > 5 ? atoi(argv[5]) : -1;
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
    if (strcmp(mode, "block") && strcmp(mode, "exit") && strcmp(mode, "abort") && strcmp(mode, "serving"))
        die(EXIT_USAGE, "unknown mode");
    block_forever(x);
}
