/* SPDX-License-Identifier: MIT */
/* The program of tests/job/test_join.c, under the real shmrun:
 *
 *   shmrun -n 2 --max-workers 3 elastic_prog host SHMRUN LOGDIR
 *   shmrun --join JOB elastic_prog joiner NAME       (started by rank 0)
 *
 * host, rank 0 drives (rank 1 serves until told to leave):
 *   1. rank 2 is free: a call to it fails at once naming it;
 *   2. a program joins as "bob" (shmrun --join, its stderr in LOGDIR): it
 *      says hello; rank 0 calls it by rank and by name (its generation is 1);
 *   3. a second join while every rank is held fails: "the job is full";
 *   4. bob is told to leave: its departure is seen, a call to it fails at
 *      once ("left the job"), its shmrun --join exits 0;
 *   5. a joiner named "worker1" (rank 1's name) is refused by its sr_init
 *      with -EEXIST naming both ranks; its shmrun --join exits 3; the job
 *      goes on, and rank 2 is free again;
 *   6. rank 1 and rank 0 leave; the job ends with status 0.
 *
 *   shmrun -n 2 --max-workers 3 --restart rank --max-restarts 1 elastic_prog host-kill SHMRUN LOGDIR
 *
 * host-kill: a joiner ("bob") is killed by SIGKILL in a job that replaces
 * ranks: its program is its client's, so it is not replaced; its shmrun
 * --join exits 137, rank 2 is free again (a call to it fails at once), and
 * the job goes on and ends with status 0 once ranks 1 and 0 have left.
 * Every wait is on an event (a call's answer, a futex word set by a
 * function, a child's pidfd) with a bound.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "shmrpc/rpc.h"
#include "shmrpc/spawn.h"

#define WAIT_S 20

#define CHECK(cond, ...)                                                                \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "elastic_prog: check failed at line %d: ", __LINE__);      \
            fprintf(stderr, __VA_ARGS__);                                               \
            fputc('\n', stderr);                                                        \
            return 1;                                                                   \
        }                                                                               \
    } while (0)

static _Atomic uint32_t hellos, told_to_leave; /* futex words, set by the functions below */

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Until *w >= want; bounded. */
static int wait_word(_Atomic uint32_t *w, uint32_t want)
{
    int64_t end = now_ns() + (int64_t)WAIT_S * 1000000000;
    for (uint32_t v; (v = atomic_load_explicit(w, memory_order_acquire)) < want;) { /* acquire: pairs with bump */
        int64_t ns = end - now_ns();
        if (ns <= 0)
            return -ETIMEDOUT;
        struct timespec left = {ns / 1000000000, ns % 1000000000};
        syscall(SYS_futex, w, FUTEX_WAIT_PRIVATE, v, &left, NULL, 0);
    }
    return 0;
}

static void bump(_Atomic uint32_t *w)
{
    atomic_fetch_add_explicit(w, 1, memory_order_release); /* release: pairs with wait_word */
    syscall(SYS_futex, w, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
}

static int fn_hello(sr_call *c)
{
    bump(&hellos);
    return sr_call_return(c, NULL);
}

static int fn_leave(sr_call *c)
{
    bump(&told_to_leave);
    return sr_call_return(c, NULL);
}

static int fn_die(sr_call *c)
{
    (void)c;
    raise(SIGKILL);
    return 0;
}

static int fn_gen(sr_call *c)
{
    const char *g = getenv("SHMRPC_GENERATION");
    return sr_call_return(c, sr_int(g ? atoi(g) : -1));
}

/* shmrun --join JOB elastic_prog joiner NAME, its stderr to LOGDIR/NAME.err;
 * the pid of that shmrun, or -1. */
static pid_t start_join(const char *shmrun, const char *self, const char *logdir, const char *name)
{
    char log[512];
    snprintf(log, sizeof(log), "%s/%s.err", logdir, name);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0 || dup2(fd, 2) != 2)
            _exit(126);
        execl(shmrun, shmrun, "--join", sr_job_id(), "--", self, "joiner", name, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* The exit code of that shmrun --join, waited for on its pidfd with a bound; -1. */
static int join_status(pid_t pid)
{
    int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
    struct pollfd p = {.fd = pfd, .events = POLLIN};
    int ready = pfd >= 0 ? poll(&p, 1, WAIT_S * 1000) : -1;
    if (pfd >= 0)
        close(pfd);
    int st;
    if (ready != 1 || waitpid(pid, &st, 0) != pid)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void read_log(const char *logdir, const char *name, char *buf, size_t len)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s.err", logdir, name);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, len - 1, f) : 0;
    buf[n] = 0;
    if (f)
        fclose(f);
}

static int call_int(int to, const char *fn, int64_t *out)
{
    sr_value *v = NULL;
    int rc = sr_rpc_sync(to, fn, SR_ARGS(), WAIT_S, &v);
    if (!rc)
        *out = sr_value_int(v);
    sr_value_unref(v);
    return rc;
}

static int drive(const char *shmrun, const char *self, const char *logdir)
{
    CHECK(sr_world_size() == 3 && sr_worker_present(2) == 0, "world %d, rank 2 present %d", sr_world_size(),
          sr_worker_present(2));
    CHECK(sr_job_id() != NULL, "no job id in an elastic job");
    int rc = sr_rpc_sync(2, "gen", SR_ARGS(), WAIT_S, NULL);
    CHECK(rc == -EPIPE && strstr(sr_last_error(), "rank 2 is gone") && strstr(sr_last_error(), "is free"),
          "a call to the free rank: %d '%s'", rc, sr_last_error());
    /* 2: bob joins */
    pid_t bob = start_join(shmrun, self, logdir, "bob");
    CHECK(bob > 0 && wait_word(&hellos, 1) == 0, "bob never said hello");
    CHECK(sr_wait_for_worker(2, WAIT_S) == 0, "rank 2: %s", sr_last_error());
    int64_t g = -1;
    CHECK(call_int(2, "gen", &g) == 0 && g == 1, "bob by rank: %d: %s", (int)g, sr_last_error());
    int r = sr_worker_rank("bob");
    CHECK(r == 2 && !strcmp(sr_worker_name(2), "bob"), "bob's rank %d, rank 2's name %s", r, sr_worker_name(2));
    CHECK(call_int(sr_worker_rank("bob"), "gen", &g) == 0 && g == 1, "bob by name: %s", sr_last_error());
    /* 3: the job is full */
    pid_t carol = start_join(shmrun, self, logdir, "carol");
    int st = join_status(carol);
    char text[4096];
    read_log(logdir, "carol", text, sizeof(text));
    CHECK(st == 1 && strstr(text, "the job is full: all 3 ranks are held"), "a join to a full job: %d '%s'", st,
          text);
    /* 4: bob leaves */
    CHECK(sr_rpc_sync(2, "leave", SR_ARGS(), WAIT_S, NULL) == 0, "leave: %s", sr_last_error());
    CHECK(sr_wait_for_departure(2, WAIT_S) == 0, "bob never left: %s", sr_last_error());
    rc = sr_rpc_sync(2, "gen", SR_ARGS(), WAIT_S, NULL);
    CHECK(rc == -EPIPE && strstr(sr_last_error(), "'bob' (rank 2, generation 1) left the job"),
          "a call to bob after it left: %d '%s'", rc, sr_last_error());
    CHECK(sr_worker_rank("bob") == -EINVAL, "bob's name is still known");
    CHECK((st = join_status(bob)) == 0, "bob's shmrun --join: %d", st);
    /* 5: a name taken by a worker present */
    pid_t dup = start_join(shmrun, self, logdir, "worker1");
    st = join_status(dup);
    read_log(logdir, "worker1", text, sizeof(text));
    CHECK(st == 3 && strstr(text, "Worker name 'worker1' of rank 2 is taken: rank 1, present in the job, has it"),
          "a join with rank 1's name: %d '%s'", st, text);
    CHECK(sr_worker_present(2) == 0 && sr_worker_rank("worker1") == 1, "after the refused join: %d %d",
          sr_worker_present(2), sr_worker_rank("worker1"));
    /* 6: rank 1 leaves, then us */
    CHECK(sr_rpc_sync(1, "leave", SR_ARGS(), WAIT_S, NULL) == 0, "leave rank 1: %s", sr_last_error());
    CHECK(sr_wait_for_departure(1, WAIT_S) == 0, "rank 1 never left: %s", sr_last_error());
    return 0;
}

/* host-kill's scenario (the header). */
static int drive_killed_joiner(const char *shmrun, const char *self, const char *logdir)
{
    pid_t bob = start_join(shmrun, self, logdir, "bob");
    CHECK(bob > 0 && wait_word(&hellos, 1) == 0, "bob never said hello");
    CHECK(sr_wait_for_worker(2, WAIT_S) == 0, "rank 2: %s", sr_last_error());
    int rc = sr_rpc_sync(2, "die", SR_ARGS(), WAIT_S, NULL);
    CHECK(rc == -EPIPE, "die: %d '%s'", rc, sr_last_error());
    int st = join_status(bob);
    CHECK(st == 128 + SIGKILL, "bob's shmrun --join: %d", st);
    CHECK(sr_wait_for_departure(2, WAIT_S) == 0, "bob's death is not a departure: %s", sr_last_error());
    rc = sr_rpc_sync(2, "gen", SR_ARGS(), WAIT_S, NULL);
    CHECK(rc == -EPIPE && strstr(sr_last_error(), "rank 2 is gone"), "a call to rank 2 after bob died: %d '%s'", rc,
          sr_last_error());
    CHECK(sr_rpc_sync(1, "leave", SR_ARGS(), WAIT_S, NULL) == 0, "leave rank 1: %s", sr_last_error());
    CHECK(sr_wait_for_departure(1, WAIT_S) == 0, "rank 1 never left: %s", sr_last_error());
    return 0;
}

int main(int argc, char **argv)
{
    bool joiner = argc == 3 && !strcmp(argv[1], "joiner");
    bool kill_joiner = argc == 4 && !strcmp(argv[1], "host-kill");
    if (!joiner && !kill_joiner && (argc != 4 || strcmp(argv[1], "host"))) {
        fprintf(stderr, "usage: elastic_prog host|host-kill SHMRUN LOGDIR | elastic_prog joiner NAME\n");
        return 2;
    }
    sr_register("hello", fn_hello);
    sr_register("leave", fn_leave);
    sr_register("gen", fn_gen);
    sr_register("die", fn_die);
    int rc = sr_init(&(sr_init_opts){.name = joiner ? argv[2] : NULL});
    if (rc) {
        fprintf(stderr, "elastic_prog: sr_init: %s\n", sr_last_error());
        return 3;
    }
    if (joiner) {
        CHECK(sr_rpc_sync(0, "hello", SR_ARGS(), WAIT_S, NULL) == 0, "hello: %s", sr_last_error());
        CHECK(wait_word(&told_to_leave, 1) == 0, "%s was never told to leave", argv[2]);
    } else if (sr_rank() == 0) {
        if ((kill_joiner ? drive_killed_joiner : drive)(argv[2], argv[0], argv[3]))
            return 1;
    } else {
        CHECK(wait_word(&told_to_leave, 1) == 0, "rank %d was never told to leave", sr_rank());
    }
    rc = sr_shutdown(true, WAIT_S);
    CHECK(rc == 0, "leave: %s", sr_last_error());
    return 0;
}
