/* What a whole-job restart costs (shmrun --max-restarts; docs/PERFORMANCE.md).
 *
 *   bench_restart [-n N] [--trials T] [--shmrun PATH]
 *
 * Each trial starts `shmrun -n N --max-restarts 1 -- bench_restart --worker FD`
 * and measures, on CLOCK_MONOTONIC (one clock for every process):
 *   start-up: from the fork of shmrun to the last worker of attempt 0 past sr_init;
 *   restart:  from the SIGKILL of rank N-1 (sent once every worker of attempt 0
 *             is past sr_init) to the last worker of attempt 1 past sr_init.
 * restart - start-up is what the restart adds to a fresh launch: the
 * supervisor's stop, reap and sweep of the old attempt and its new segment.
 * Workers report "RANK ATTEMPT PID NS" on the pipe FD once past sr_init;
 * attempt 0 then waits to be killed, attempt 1 shuts down and exits 0.
 * Every wait is on the pipe or on shmrun's exit, with a bound.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "shmrpc/shmrpc.h"

#define MAX_N 64
#define WAIT_MS 30000

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static int worker(int fd)
{
    int rc = sr_init(NULL);
    int64_t t = now_ns();
    if (rc) {
        fprintf(stderr, "bench_restart: sr_init: %s\n", sr_last_error());
        return 1;
    }
    const char *a = getenv("SHMRPC_RESTART_COUNT");
    int attempt = a ? atoi(a) : -1;
    char line[96];
    int len = snprintf(line, sizeof(line), "%s %d %d %lld\n", getenv("SHMRPC_RANK"), attempt, (int)getpid(),
                       (long long)t);
    if (write(fd, line, (size_t)len) != len)
        return 1;
    if (attempt == 0)
        for (;;)
            pause(); /* until the bench kills one of us and shmrun the rest */
    return sr_shutdown(true, 30) ? 1 : 0;
}

struct trial {
    int n, fd, got[2];
    pid_t pid[MAX_N];
    int64_t last[2]; /* per attempt: the latest time past sr_init */
    char buf[4096];
    size_t len;
};

static int take_line(struct trial *t, const char *line)
{
    int rank, attempt, pid;
    long long ns;
    if (sscanf(line, "%d %d %d %lld", &rank, &attempt, &pid, &ns) != 4 || rank < 0 || rank >= t->n || attempt < 0 ||
        attempt > 1) {
        fprintf(stderr, "bench_restart: bad report '%s'\n", line);
        return -1;
    }
    t->got[attempt]++;
    t->pid[rank] = pid;
    if (ns > t->last[attempt])
        t->last[attempt] = ns;
    return 0;
}

/* Read reports until `attempt` has all n, bounded. */
static int await_attempt(struct trial *t, int attempt)
{
    int64_t deadline = now_ns() + (int64_t)WAIT_MS * 1000000;
    while (t->got[attempt] < t->n) {
        int left = (int)((deadline - now_ns()) / 1000000);
        struct pollfd p = {.fd = t->fd, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, left) <= 0) {
            fprintf(stderr, "bench_restart: %d of %d workers of attempt %d past sr_init within %d ms\n",
                    t->got[attempt], t->n, attempt, WAIT_MS);
            return -1;
        }
        ssize_t got = read(t->fd, t->buf + t->len, sizeof(t->buf) - 1 - t->len);
        if (got <= 0) {
            fprintf(stderr, "bench_restart: the workers closed the report pipe\n");
            return -1;
        }
        t->len += (size_t)got;
        t->buf[t->len] = 0;
        char *nl;
        while ((nl = strchr(t->buf, '\n'))) {
            *nl = 0;
            if (take_line(t, t->buf))
                return -1;
            t->len -= (size_t)(nl + 1 - t->buf);
            memmove(t->buf, nl + 1, t->len + 1);
        }
    }
    return 0;
}

static pid_t launch(const char *shmrun, const char *self, int n, int fd)
{
    char nb[16], fdb[16];
    snprintf(nb, sizeof(nb), "%d", n);
    snprintf(fdb, sizeof(fdb), "%d", fd);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execl(shmrun, shmrun, "-n", nb, "--max-restarts", "1", "--name-prefix", "bench_restart", "--", self,
              "--worker", fdb, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* One trial: start-up and restart in ms; 0 or -1. */
static int run_trial(const char *shmrun, const char *self, int n, double *startup_ms, double *restart_ms)
{
    int p[2];
    if (pipe(p))
        return -1;
    fcntl(p[0], F_SETFD, FD_CLOEXEC);
    struct trial t = {.n = n, .fd = p[0]};
    int64_t t0 = now_ns();
    pid_t pid = launch(shmrun, self, n, p[1]);
    close(p[1]);
    int rc = pid > 0 ? await_attempt(&t, 0) : -1;
    int64_t t_kill = now_ns();
    if (!rc)
        rc = kill(t.pid[n - 1], SIGKILL);
    if (!rc)
        rc = await_attempt(&t, 1);
    int st = 0;
    if (pid > 0) {
        if (rc)
            kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
    }
    close(p[0]);
    if (!rc && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
        fprintf(stderr, "bench_restart: shmrun ended with wait status 0x%x\n", st);
        rc = -1;
    }
    *startup_ms = (double)(t.last[0] - t0) / 1e6;
    *restart_ms = (double)(t.last[1] - t_kill) / 1e6;
    return rc;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void report(const char *what, double *v, int k)
{
    qsort(v, (size_t)k, sizeof(*v), cmp);
    printf("%-40s p50 %7.1f ms   min %7.1f ms   max %7.1f ms\n", what, v[k / 2], v[0], v[k - 1]);
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--worker"))
        return worker(atoi(argv[2]));
    int n = 4, trials = 10;
    char self[PATH_MAX], shmrun[PATH_MAX + 32] = "";
    ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
    self[len > 0 ? len : 0] = 0;
    int i = 1;
    for (; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-n"))
            n = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--trials"))
            trials = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--shmrun"))
            snprintf(shmrun, sizeof(shmrun), "%s", argv[i + 1]);
        else
            break;
    }
    if (i < argc || n < 2 || n > MAX_N || trials < 1 || trials > 1000) {
        fprintf(stderr, "usage: bench_restart [-n 2..%d] [--trials 1..1000] [--shmrun PATH]\n", MAX_N);
        return 2;
    }
    if (!*shmrun) { /* beside us in the build: bench/../launcher/shmrun */
        char *slash = strrchr(self, '/');
        snprintf(shmrun, sizeof(shmrun), "%.*s/../launcher/shmrun", slash ? (int)(slash - self) : 1,
                 slash ? self : ".");
    }
    double *up = calloc((size_t)trials, sizeof(double)), *re = calloc((size_t)trials, sizeof(double)),
           *diff = calloc((size_t)trials, sizeof(double));
    for (int i = 0; i < trials; i++) {
        if (run_trial(shmrun, self, n, &up[i], &re[i]))
            return 1;
        diff[i] = re[i] - up[i];
    }
    printf("bench_restart: %d workers, %d trials (shmrun --max-restarts 1)\n", n, trials);
    report("start-up (launch -> all past sr_init)", up, trials);
    report("restart (SIGKILL -> all past sr_init)", re, trials);
    report("restart - start-up (same trial)", diff, trials);
    free(up), free(re), free(diff);
    return 0;
}
