/* SPDX-License-Identifier: MIT */
/* Start-up at scale: from the launch of a job to every worker's first
 * completed call (docs/PERFORMANCE.md, "Start-up at scale").
 *
 *   bench_scale [--json] [--sizes N,N,...] [--trials T] [--shmrun PATH]
 *
 * For each N, each trial starts `shmrun -n N -- bench_scale --worker FD`;
 * every worker calls sr_init, then `noop` on its neighbour (rank + 1) % N
 * with sr_rpc_sync, reports "RANK T_MAIN T_INIT T_CALL" (CLOCK_MONOTONIC, one
 * clock for every process) on the pipe FD and shuts down gracefully. The
 * figure is the time from the fork of shmrun to the last worker's first
 * completed call, and that divided by N: the per-worker cost, flat when the
 * start-up scales. Its floor, measured in the same trial, is the launch of
 * the same N processes under shmrun without shmrpc (`--bare`: the worker
 * reports from main and exits): fork, exec and the supervisor's own work.
 * The phases (last worker in main, past sr_init, past its call) say where
 * the time goes. The target: the per-worker figure at 1024 workers at most
 * 1.5x the one at 64 (printed when both sizes run).
 *
 * Limits (checked before a size runs, which is skipped with a line saying
 * what it needs): a worker holds a few dozen descriptors and 4 threads
 * (main, OpenBLAS's, sr_init's progress thread and first executor; more
 * executors start only for plain functions, and noop runs inline), so
 * RLIMIT_NPROC and kernel.pid_max must allow about 6 tasks per worker, and shmrun, which
 * holds each worker's pidfd, about N + 64 descriptors (RLIMIT_NOFILE).
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "shmrpc/shmrpc.h"
#include "shmrun_job.h"

#define MAX_N 4096
#define MAX_SIZES 16
#define TASKS_PER_WORKER 6 /* main, OpenBLAS's, the progress thread, one executor, and room */
#define WAIT_MS 300000      /* a whole job, up to its last worker's call */
#define TARGET_RATIO 1.5
#define TARGET_BASE 64
#define TARGET_TOP 1024

static int report(int fd, int64_t t_main, int64_t t_init, int64_t t_call)
{
    char line[128];
    int len = snprintf(line, sizeof(line), "%s %lld %lld %lld\n", getenv("SHMRPC_RANK"), (long long)t_main,
                       (long long)t_init, (long long)t_call);
    return write(fd, line, (size_t)len) == len ? 0 : -1; /* < PIPE_BUF: one write, never interleaved */
}

static int worker(int fd, bool bare)
{
    int64_t t_main = bench_now_ns();
    if (bare)
        return report(fd, t_main, 0, 0) ? 1 : 0;
    if (sr_init(NULL)) {
        fprintf(stderr, "bench_scale: sr_init: %s\n", sr_last_error());
        return 1;
    }
    int64_t t_init = bench_now_ns();
    int rank = atoi(getenv("SHMRPC_RANK")), n = atoi(getenv("SHMRPC_WORLD_SIZE"));
    sr_value *v = NULL;
    if (sr_rpc_sync((rank + 1) % n, "noop", SR_NOARGS, 120, &v)) {
        fprintf(stderr, "bench_scale: rank %d: noop on rank %d: %s\n", rank, (rank + 1) % n, sr_last_error());
        sr_shutdown(false, 0);
        return 1;
    }
    sr_value_unref(v);
    int64_t t_call = bench_now_ns();
    int rc = report(fd, t_main, t_init, t_call);
    return sr_shutdown(true, 300) || rc ? 1 : 0;
}

struct trial {
    int n, got;
    int64_t last[3]; /* the latest T_MAIN, T_INIT, T_CALL */
};

static int take_line(void *ctx, const char *line)
{
    struct trial *t = ctx;
    int rank;
    long long ts[3];
    if (sscanf(line, "%d %lld %lld %lld", &rank, &ts[0], &ts[1], &ts[2]) != 4 || rank < 0 || rank >= t->n) {
        fprintf(stderr, "bench_scale: bad report '%s'\n", line);
        return -1;
    }
    t->got++;
    for (int i = 0; i < 3; i++)
        if (ts[i] > t->last[i])
            t->last[i] = ts[i];
    return 0;
}

static bool all_in(void *ctx)
{
    struct trial *t = ctx;
    return t->got >= t->n;
}

/* One job of n workers: the times from the fork of shmrun to the last
 * worker's main, sr_init and call (out[0..3), ns); 0 or -1. */
static int run_job(const char *shmrun, const char *self, int n, bool bare, double out[3])
{
    struct trial t = {.n = n};
    bench_job j = {.who = "bench_scale", .shmrun = shmrun, .take = take_line, .ctx = &t};
    int w = bench_job_pipe(&j);
    if (w < 0)
        return -1;
    char nb[16], fdb[16];
    snprintf(nb, sizeof(nb), "%d", n);
    snprintf(fdb, sizeof(fdb), "%d", w);
    char *argv[] = {(char *)shmrun, "-n", nb, "--name-prefix", "bench_scale", "--", (char *)self,
                    bare ? "--bare" : "--worker", fdb, NULL};
    int64_t t0 = bench_now_ns();
    int rc = bench_job_start(&j, argv, w);
    rc = rc ? rc : bench_job_await(&j, all_in, WAIT_MS, "not every worker reported its first call");
    rc = bench_job_end(&j, rc, WAIT_MS);
    for (int i = 0; i < 3; i++)
        out[i] = t.last[i] ? (double)(t.last[i] - t0) : 0;
    return rc;
}

/* Can this process start a job of n workers? 0, or -1 after a line saying
 * which limit is short and what it must be. */
static int limits_allow(int n)
{
    struct rlimit nofile, nproc;
    long need_tasks = (long)n * TASKS_PER_WORKER + 256, need_fds = n + 64;
    long pid_max = 0;
    FILE *f = fopen("/proc/sys/kernel/pid_max", "r");
    if (f) {
        if (fscanf(f, "%ld", &pid_max) != 1)
            pid_max = 0;
        fclose(f);
    }
    getrlimit(RLIMIT_NOFILE, &nofile);
    getrlimit(RLIMIT_NPROC, &nproc);
    const char *short_of = nofile.rlim_cur != RLIM_INFINITY && (long)nofile.rlim_cur < need_fds ? "ulimit -n"
                           : nproc.rlim_cur != RLIM_INFINITY && (long)nproc.rlim_cur < need_tasks ? "ulimit -u"
                           : pid_max && pid_max < need_tasks ? "kernel.pid_max"
                                                             : NULL;
    if (!short_of)
        return 0;
    fprintf(stderr, "bench_scale: skipping %d workers: %s is too small (need ulimit -n >= %ld, ulimit -u and "
                    "kernel.pid_max >= %ld)\n", n, short_of, need_fds, need_tasks);
    return -1;
}

static int parse_sizes(const bench_cli *cli, const char *list, int *sizes)
{
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", list);
    int k = 0;
    for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (k == MAX_SIZES)
            bench_cli_int(cli, "--sizes (count)", "too many", 1, MAX_SIZES); /* exits 2 */
        sizes[k++] = (int)bench_cli_int(cli, "--sizes", tok, 2, MAX_N);
    }
    return k;
}

struct size_fig {
    int n;
    double call, init, main, bare; /* medians over trials, ns from the launch */
};

static void print_size(const struct size_fig *f, const struct size_fig *base, int trials)
{
    double per = f->call / f->n, base_per = base ? base->call / base->n : 0;
    double ratio = base_per > 0 ? per / base_per : 0;
    char vs[128] = "";
    bool judged = base && f->n == TARGET_TOP && base->n == TARGET_BASE;
    if (base)
        snprintf(vs, sizeof(vs), " | per worker vs %d workers %.2fx%s", base->n, ratio,
                 judged ? (ratio <= TARGET_RATIO ? " (target <= 1.5x met)" : " (target <= 1.5x NOT met)") : "");
    printf("start-up %5d workers | launch to last first call %9.1f ms | per worker %6.2f ms%s | "
           "phases (last worker): main %.1f ms, past sr_init %.1f ms | floor: bare launch %.1f ms, per worker %.2f ms"
           " | median of %d\n",
           f->n, f->call / 1e6, per / 1e6, vs, f->main / 1e6, f->init / 1e6, f->bare / 1e6, f->bare / f->n / 1e6,
           trials);
    bench_rec r;
    bench_rec_begin(&r, "start-up to first call");
    bench_rec_num(&r, "n", f->n);
    bench_rec_num(&r, "p50_ns", f->call);
    bench_rec_num(&r, "per_worker_ns", per);
    bench_rec_num(&r, "main_ns", f->main);
    bench_rec_num(&r, "init_ns", f->init);
    bench_rec_str(&r, "floor", "bare launch");
    bench_rec_num(&r, "floor_ns", f->bare);
    if (base) {
        bench_rec_num(&r, "ref_n", base->n);
        bench_rec_num(&r, "ratio", ratio);
    }
    if (judged) {
        bench_rec_num(&r, "target_ratio", TARGET_RATIO);
        bench_rec_bool(&r, "target_met", ratio <= TARGET_RATIO);
    }
    bench_rec_emit(&r);
    fflush(stdout);
}

/* One size: trials, each a bare launch then the real job; medians. */
static int run_size(const char *shmrun, const char *self, int n, int trials, struct size_fig *f)
{
    double call[100], init[100], mainv[100], bare[100];
    for (int i = 0; i < trials; i++) {
        double b[3], o[3];
        if (run_job(shmrun, self, n, true, b) || run_job(shmrun, self, n, false, o))
            return -1;
        bare[i] = b[0], mainv[i] = o[0], init[i] = o[1], call[i] = o[2];
    }
    *f = (struct size_fig){.n = n, .call = bench_median(call, (size_t)trials), .init = bench_median(init, (size_t)trials),
                           .main = bench_median(mainv, (size_t)trials), .bare = bench_median(bare, (size_t)trials)};
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && (!strcmp(argv[1], "--worker") || !strcmp(argv[1], "--bare")))
        return worker(atoi(argv[2]), !strcmp(argv[1], "--bare"));
    bench_cli cli = {.prog = "bench_scale", .opts = {"--sizes", "--trials", "--shmrun"},
                     .usage = "  --sizes N,...  job sizes, 2..4096 each (default 16,64,256; the full sweep:\n"
                              "                 64,128,256,512,1024, ./dev bench-scale)\n"
                              "  --trials T     trials per size (1..100, default 3)\n"
                              "  --shmrun PATH  shmrun (default: beside this program in the build)\n"};
    bench_cli_parse(&cli, argc, argv);
    int sizes[MAX_SIZES];
    int k = parse_sizes(&cli, cli.opt[0] ? cli.opt[0] : "16,64,256", sizes);
    int trials = cli.opt[1] ? (int)bench_cli_int(&cli, "--trials", cli.opt[1], 1, 100) : 3;
    char self[PATH_MAX], shmrun[PATH_MAX + 32] = "";
    snprintf(shmrun, sizeof(shmrun), "%s", cli.opt[2] ? cli.opt[2] : "");
    bench_job_paths(self, sizeof(self), shmrun, sizeof(shmrun));
    double load[3] = {0};
    getloadavg(load, 3);
    printf("bench_scale: shmrun -n N, each worker sr_init then one rpc_sync noop to its neighbour; %ld CPUs online, "
           "load average %.1f; target: per worker at %d <= %.1fx per worker at %d\n",
           sysconf(_SC_NPROCESSORS_ONLN), load[0], TARGET_TOP, TARGET_RATIO, TARGET_BASE);
    struct size_fig figs[MAX_SIZES], *base = NULL;
    int status = 0;
    for (int i = 0; i < k; i++) {
        if (limits_allow(sizes[i]))
            continue;
        if (run_size(shmrun, self, sizes[i], trials, &figs[i])) {
            status = 1;
            continue;
        }
        if (sizes[i] == TARGET_BASE)
            base = &figs[i];
        print_size(&figs[i], base && base != &figs[i] ? base : NULL, trials);
    }
    return status;
}
