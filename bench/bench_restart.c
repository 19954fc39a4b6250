/* SPDX-License-Identifier: MIT */
/* What a whole-job restart costs (shmrun --max-restarts; docs/PERFORMANCE.md).
 *
 *   bench_restart [--json] [-n N] [--trials T] [--shmrun PATH]
 *
 * Each trial starts `shmrun -n N --max-restarts 1 -- bench_restart --worker FD`
 * and measures, on CLOCK_MONOTONIC (one clock for every process):
 *   start-up: from the fork of shmrun to the last worker of attempt 0 past sr_init;
 *   restart:  from the SIGKILL of rank N-1 (sent once every worker of attempt 0
 *             is past sr_init) to the last worker of attempt 1 past sr_init.
 * One line: the restart next to its floor, the same trial's start-up (the
 * launch), and their ratio: what the restart adds to a fresh launch is the
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

#include "bench_util.h"
#include "shmrpc/shmrpc.h"
#include "shmrun_job.h"

#define MAX_N 64
#define WAIT_MS 30000

static int worker(int fd)
{
    int rc = sr_init(NULL);
    int64_t t = bench_now_ns();
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
    int n, got[2];
    pid_t pid[MAX_N];
    int64_t last[2]; /* per attempt: the latest time past sr_init */
    int want;        /* the attempt await_attempt waits for */
};

static int take_line(void *ctx, const char *line)
{
    struct trial *t = ctx;
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

static bool attempt_up(void *ctx)
{
    struct trial *t = ctx;
    return t->got[t->want] >= t->n;
}

/* Read reports until `attempt` has all n, bounded. */
static int await_attempt(bench_job *j, struct trial *t, int attempt)
{
    char what[96];
    t->want = attempt;
    snprintf(what, sizeof(what), "not every worker of attempt %d was past sr_init", attempt);
    return bench_job_await(j, attempt_up, WAIT_MS, what);
}

/* One trial: start-up and restart in ns; 0 or -1. */
static int run_trial(const char *shmrun, const char *self, int n, double *startup_ns, double *restart_ns)
{
    struct trial t = {.n = n};
    bench_job j = {.who = "bench_restart", .shmrun = shmrun, .take = take_line, .ctx = &t};
    int w = bench_job_pipe(&j);
    if (w < 0)
        return -1;
    char nb[16], fdb[16];
    snprintf(nb, sizeof(nb), "%d", n);
    snprintf(fdb, sizeof(fdb), "%d", w);
    char *argv[] = {(char *)shmrun, "-n", nb, "--max-restarts", "1", "--name-prefix", "bench_restart", "--",
                    (char *)self, "--worker", fdb, NULL};
    int64_t t0 = bench_now_ns();
    int rc = bench_job_start(&j, argv, w);
    rc = rc ? rc : await_attempt(&j, &t, 0);
    int64_t t_kill = bench_now_ns();
    rc = rc ? rc : kill(t.pid[n - 1], SIGKILL);
    rc = rc ? rc : await_attempt(&j, &t, 1);
    rc = bench_job_end(&j, rc, WAIT_MS);
    *startup_ns = (double)(t.last[0] - t0);
    *restart_ns = (double)(t.last[1] - t_kill);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--worker"))
        return worker(atoi(argv[2]));
    bench_cli cli = {.prog = "bench_restart", .opts = {"-n", "--trials", "--shmrun"},
                     .usage = "  -n N          workers (2..64, default 4)\n"
                              "  --trials T    trials (1..100, default 10)\n"
                              "  --shmrun PATH shmrun (default: beside this program in the build)\n"};
    bench_cli_parse(&cli, argc, argv);
    int n = cli.opt[0] ? (int)bench_cli_int(&cli, "-n", cli.opt[0], 2, MAX_N) : 4;
    int trials = cli.opt[1] ? (int)bench_cli_int(&cli, "--trials", cli.opt[1], 1, 100) : 10;
    char self[PATH_MAX], shmrun[PATH_MAX + 32] = "";
    snprintf(shmrun, sizeof(shmrun), "%s", cli.opt[2] ? cli.opt[2] : "");
    bench_job_paths(self, sizeof(self), shmrun, sizeof(shmrun));
    double *up = calloc((size_t)trials, sizeof(double)), *re = calloc((size_t)trials, sizeof(double));
    for (int i = 0; up && re && i < trials; i++)
        if (run_trial(shmrun, self, n, &up[i], &re[i]))
            return 1;
    if (!up || !re)
        return 1;
    char config[96];
    snprintf(config, sizeof(config), "%d workers, SIGKILL -> all past sr_init", n);
    printf("bench_restart: %d workers, %d trials (shmrun --max-restarts 1); floor: the same job's launch\n", n,
           trials);
    bench_job_print("whole-job restart", config, "launch", re, up, trials);
    free(up), free(re);
    return 0;
}
