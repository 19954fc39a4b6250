/* SPDX-License-Identifier: MIT */
/* A rank replaced in place against a whole-job restart (shmrun --restart
 * rank|job; docs/PERFORMANCE.md, "Replacement in place against a whole-job
 * restart").
 *
 *   bench_replace [--json] [-n N] [--kills K] [--trials T] [--settle-ms MS] [--shmrun PATH] [latency] [dip]
 *
 * Two measures, each under both policies, on CLOCK_MONOTONIC (one clock for
 * every process):
 *
 * latency: one job of N workers under `shmrun --restart POLICY --max-restarts
 *   K`. Rank 0 calls rank N-1 (the victim) in a loop; once rank 0's call has
 *   been served by round k (round: SHMRPC_RESTART_COUNT + SHMRPC_GENERATION)
 *   and MS more have passed, the bench SIGKILLs the victim, K times. Per kill:
 *     detect: the SIGKILL to rank 0's first failed call (rank policy only:
 *             under the job policy rank 0 is stopped with the others);
 *     served: the SIGKILL to rank 0's first call served by round k + 1;
 *     own start-up: round k + 1's victim, from main() to past sr_init;
 *     served - own start-up: what the replacement (or the restart) adds to
 *             the program's own start-up: the supervisor's reap, publication
 *             and fork, the exec and loading of the program, the survivor
 *             learning of the new generation, one call.
 *   A bare fork + exec of this program to its main() is measured apart, to
 *   show how much of that is the exec.
 *
 * dip: a tiny training loop: rank 0 runs steps, each an asynchronous call to
 *   every other rank (an int argument, an int answer: inline, no heap block)
 *   and a wait for all of them; a call that fails is sent again until it is
 *   served. Steps are counted in a page shared with the bench (a memfd the
 *   workers inherit), which a restarted attempt keeps counting in, with the
 *   count at the start of every 5 ms window. PRE_MS after every worker is up
 *   the bench SIGKILLs rank N-1 once; rank 0 stops POST_MS after the kill (a
 *   rank 0 restarted later than that makes one step first).
 *     calls/s: over the 500 ms before the kill, and over the last 500 ms
 *              (from 600 ms after the kill to rank 0's stop);
 *     stall:   the longest time between two steps (the one across the kill);
 *     lost:    the area of the dip: 300 ms - (steps in the 300 ms from the
 *              kill) / (the rate of the 500 ms before it), the work time the
 *              kill cost. The same estimate over the 300 ms before the kill,
 *              where nothing happened, is printed beside it: its noise (on
 *              a loaded machine the rate moves by tens of per cent between
 *              two intervals, so the stall is the sharper figure).
 *
 * Workers report on the pipe FD: "up RANK ROUND PID T_MAIN T_INIT" once past
 * sr_init, and rank 0 in latency mode "served ROUND T_FAIL T_OK". Every wait
 * of the bench is on the pipe or on shmrun's exit, with a bound; shmrun's and
 * the workers' stderr go to a file, printed if the job fails.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "shmrpc/shmrpc.h"
#include "shmrun_job.h"

#define MAX_N 16
#define MAX_KILLS 200
#define WAIT_MS 30000     /* any one event the bench waits for */
#define CALL_S 10.0       /* any one call of rank 0 */
#define FINISH_S 600      /* a worker waiting for rank 0's "finish" */
#define WIN_NS 5000000    /* dip: the windows' width */
#define MAX_WIN 4096      /* dip: windows per trial (20 s) */
#define RATE_WIN 100      /* dip: windows of the rate before an interval (500 ms) */
#define DIP_WIN 60        /* dip: windows of the interval whose lost time is estimated (300 ms) */
#define PRE_MS 1200       /* dip: from every worker up to the kill */
#define POST_MS 1100      /* dip: from the kill to rank 0's stop */
/* The dip's windows and pacing, or --smoke's (main): shorter intervals, and
 * figures that are not measurements. */
static int rate_win = RATE_WIN, dip_win = DIP_WIN, pre_ms = PRE_MS, post_ms = POST_MS;

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void sleep_ms(int ms) /* the bench's own pacing, not a synchronisation */
{
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000};
    while (nanosleep(&t, &t) && errno == EINTR)
        ;
}

/* The page the bench and every attempt's workers share (dip mode). */
struct page {
    _Atomic int64_t stop_at; /* rank 0 stops at this time (set by the bench after the kill) */
    int64_t t0;              /* the windows' origin (set by the bench before the launch) */
    _Atomic int64_t steps;   /* steps done, by every attempt's rank 0 */
    _Atomic int64_t last_t;  /* the time of the latest step */
    _Atomic int64_t stall;   /* the longest time between two steps */
    _Atomic int32_t filled;  /* windows whose start has passed */
    _Atomic int64_t win[MAX_WIN]; /* steps done at the first step past each window's start */
};

/* ================================ workers ================================ */

static int64_t t_main;           /* this process's main() */
static _Atomic uint32_t finished; /* a futex word: rank 0 called "finish" */

static int env_int(const char *name)
{
    const char *v = getenv(name);
    return v ? atoi(v) : 0;
}

static int my_round(void) { return env_int("SHMRPC_RESTART_COUNT") + env_int("SHMRPC_GENERATION"); }

static int fn_round(sr_call *c) { return sr_call_return(c, sr_int(my_round())); }
static int fn_step(sr_call *c) { return sr_call_return(c, sr_int(sr_value_int(sr_call_arg(c, 0)) + 1)); }

static int fn_finish(sr_call *c)
{
    atomic_store_explicit(&finished, 1, memory_order_release); /* release: pairs with wait_finish's acquire */
    syscall(SYS_futex, &finished, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
    return sr_call_return(c, NULL);
}

static int wait_finish(int rank)
{
    int64_t end = now_ns() + (int64_t)FINISH_S * 1000000000;
    while (!atomic_load_explicit(&finished, memory_order_acquire)) { /* acquire: pairs with fn_finish */
        int64_t left = end - now_ns();
        if (left <= 0) {
            fprintf(stderr, "bench_replace: rank %d round %d: no finish from rank 0 within %d s\n", rank,
                    my_round(), FINISH_S);
            return -1;
        }
        struct timespec ts = {left / 1000000000, left % 1000000000};
        syscall(SYS_futex, &finished, FUTEX_WAIT_PRIVATE, 0, &ts, NULL, 0);
    }
    return 0;
}

static int say(int fd, const char *line, int len) { return write(fd, line, (size_t)len) == len ? 0 : -1; }

static int say_up(int fd, int rank, int64_t t_init)
{
    char line[128];
    int len = snprintf(line, sizeof(line), "up %d %d %d %lld %lld\n", rank, my_round(), (int)getpid(),
                       (long long)t_main, (long long)t_init);
    return say(fd, line, len);
}

/* Rank 0 calls the victim until it has been served by round `kills`. */
static int drive_latency(int fd, int victim, int kills)
{
    int64_t t_fail = 0;
    for (int last = -1; last < kills;) {
        sr_value *v = NULL;
        int rc = sr_rpc_sync(victim, "round", SR_NOARGS, CALL_S, &v);
        int64_t t = now_ns();
        if (rc) {
            t_fail = t_fail ? t_fail : t;
            if (rc != -EPIPE || t - t_fail > (int64_t)WAIT_MS * 1000000) {
                fprintf(stderr, "bench_replace: rank 0: call to rank %d (failing for %lld ms): %s\n", victim,
                        (long long)((t - t_fail) / 1000000), sr_last_error());
                return -1;
            }
            sched_yield(); /* the replacement needs the CPU more than we do */
            continue;
        }
        int r = (int)sr_value_int(v);
        sr_value_unref(v);
        if (r == last)
            continue;
        char line[96];
        int len = snprintf(line, sizeof(line), "served %d %lld %lld\n", r, (long long)t_fail, (long long)t);
        if (say(fd, line, len))
            return -1;
        last = r, t_fail = 0;
    }
    return 0;
}

/* One call to `to`, sent again while it fails because `to` is gone. */
static int step_retry(int to, int64_t step)
{
    int64_t end = now_ns() + (int64_t)WAIT_MS * 1000000;
    for (;;) {
        sr_value *arg = sr_int(step);
        int rc = sr_rpc_sync(to, "step", SR_ARGS(arg), CALL_S, NULL);
        sr_value_unref(arg);
        if (rc != -EPIPE || now_ns() > end) {
            if (rc)
                fprintf(stderr, "bench_replace: rank 0: step to rank %d: %s\n", to, sr_last_error());
            return rc;
        }
        sched_yield();
    }
}

static void count_step(struct page *pg)
{
    int64_t t = now_ns();
    /* relaxed (all): statistics read by the bench, which orders nothing by them */
    int64_t prev = atomic_exchange_explicit(&pg->last_t, t, memory_order_relaxed), gap = t - prev;
    if (prev && gap > atomic_load_explicit(&pg->stall, memory_order_relaxed))
        atomic_store_explicit(&pg->stall, gap, memory_order_relaxed);
    int64_t n = atomic_fetch_add_explicit(&pg->steps, 1, memory_order_relaxed);
    int64_t w = (t - pg->t0) / WIN_NS; /* the windows that started since the last step: n steps were done then */
    for (int32_t i; (i = atomic_load_explicit(&pg->filled, memory_order_relaxed)) <= w && i < MAX_WIN;) {
        atomic_store_explicit(&pg->win[i], n, memory_order_relaxed);
        atomic_store_explicit(&pg->filled, i + 1, memory_order_relaxed);
    }
}

/* Rank 0's training loop: one step = a call to every other rank, all awaited. */
static int drive_dip(struct page *pg, int world)
{
    sr_future *f[MAX_N];
    /* relaxed: stop_at is a deadline, read again every step. Every attempt's
     * rank 0 makes one step at least: after a whole-job restart slower than
     * the deadline, that step still fills the windows up to its end. */
    for (int64_t s = 0; s == 0 || now_ns() < atomic_load_explicit(&pg->stop_at, memory_order_relaxed); s++) {
        sr_value *arg = sr_int(s);
        for (int r = 1; r < world; r++)
            if (sr_rpc_async(r, "step", SR_ARGS(arg), CALL_S, &f[r]))
                f[r] = NULL;
        sr_value_unref(arg);
        for (int r = 1; r < world; r++) {
            int rc = f[r] ? sr_future_wait(f[r], NULL) : -EPIPE;
            sr_future_unref(f[r]);
            if (rc == -EPIPE)
                rc = step_retry(r, s);
            if (rc)
                return -1;
        }
        count_step(pg);
    }
    return 0;
}

static int finish_all(int world)
{
    for (int r = 1; r < world; r++)
        if (sr_rpc_sync(r, "finish", SR_NOARGS, CALL_S, NULL)) {
            fprintf(stderr, "bench_replace: rank 0: finish to rank %d: %s\n", r, sr_last_error());
            return -1;
        }
    return 0;
}

/* bench_replace --worker latency|dip FD PAGE_FD KILLS */
static int worker(char **argv)
{
    int fd = atoi(argv[3]), kills = atoi(argv[5]);
    bool dip = !strcmp(argv[2], "dip");
    struct page *pg = mmap(NULL, sizeof(struct page), PROT_READ | PROT_WRITE, MAP_SHARED, atoi(argv[4]), 0);
    sr_register("round", fn_round);
    sr_register("step", fn_step);
    sr_register("finish", fn_finish);
    if (pg == MAP_FAILED || sr_init(NULL)) {
        fprintf(stderr, "bench_replace: worker start: %s\n", pg == MAP_FAILED ? strerror(errno) : sr_last_error());
        return 1;
    }
    int64_t t_init = now_ns();
    int rank = env_int("SHMRPC_RANK"), world = env_int("SHMRPC_WORLD_SIZE");
    if (say_up(fd, rank, t_init))
        return 1;
    int rc = 0;
    if (rank == 0) {
        rc = dip ? drive_dip(pg, world) : drive_latency(fd, world - 1, kills);
        rc = rc ? rc : finish_all(world);
    } else {
        rc = wait_finish(rank);
    }
    int sd = sr_shutdown(true, 60);
    return rc || sd ? 1 : 0;
}

/* ================================ the bench ================================ */

struct round {
    int up;
    pid_t victim;
    int64_t main_t, init_t; /* the victim's */
    bool served;
    int64_t fail_t, ok_t;
};

struct job {
    bench_job bj; /* shmrun, the report pipe, the log */
    const char *self, *mode;
    int n, kills;
    bool rank_policy;
    struct page *pg;
    int pg_fd;
    int want_k;     /* await_round's round */
    bool want_served;
    struct round r[MAX_KILLS + 1];
};

static int take_line(void *ctx, const char *line)
{
    struct job *j = ctx;
    int rank, round, pid;
    long long a, b;
    if (sscanf(line, "up %d %d %d %lld %lld", &rank, &round, &pid, &a, &b) == 5 && rank >= 0 && rank < j->n &&
        round >= 0 && round <= j->kills) {
        struct round *r = &j->r[round];
        r->up++;
        if (rank == j->n - 1)
            r->victim = pid, r->main_t = a, r->init_t = b;
        return 0;
    }
    if (sscanf(line, "served %d %lld %lld", &round, &a, &b) == 3 && round >= 0 && round <= j->kills) {
        j->r[round].served = true, j->r[round].fail_t = a, j->r[round].ok_t = b;
        return 0;
    }
    fprintf(stderr, "bench_replace: bad report '%s'\n", line);
    return -1;
}

/* Round want_k has every worker up (all: the job policy's attempt, or round
 * 0) or its victim up (the rank policy), and, if want_served, rank 0 was
 * served by it. */
static bool round_done(void *ctx)
{
    struct job *j = ctx;
    struct round *r = &j->r[j->want_k];
    int want = j->want_k == 0 || !j->rank_policy ? j->n : 1;
    return r->up >= want && (!j->want_served || r->served);
}

static int await_round(struct job *j, int k, bool served)
{
    char what[96];
    j->want_k = k, j->want_served = served;
    snprintf(what, sizeof(what), "round %d: not every worker up%s", k, served ? ", or rank 0 not served" : "");
    return bench_job_await(&j->bj, round_done, WAIT_MS, what);
}

static int launch(struct job *j)
{
    int w = bench_job_pipe(&j->bj);
    if (w < 0)
        return -1;
    char nb[16], fdb[16], pgb[16], kb[16], prefix[48];
    snprintf(nb, sizeof(nb), "%d", j->n);
    snprintf(fdb, sizeof(fdb), "%d", w);
    snprintf(pgb, sizeof(pgb), "%d", j->pg_fd);
    snprintf(kb, sizeof(kb), "%d", j->kills);
    snprintf(prefix, sizeof(prefix), "bench_replace%d", (int)getpid());
    char *argv[] = {(char *)j->bj.shmrun, "-n", nb, "--restart", j->rank_policy ? "rank" : "job", "--max-restarts", kb,
                    "--name-prefix", prefix, "--", (char *)j->self, "--worker", (char *)j->mode, fdb, pgb, kb, NULL};
    return bench_job_start(&j->bj, argv, w);
}

static int end_job(struct job *j, int rc) { return bench_job_end(&j->bj, rc, WAIT_MS); }

struct latency {
    double detect[MAX_KILLS], to_main[MAX_KILLS], startup[MAX_KILLS], to_call[MAX_KILLS], served[MAX_KILLS],
        own[MAX_KILLS];
};

static int run_latency(struct job *j, int settle_ms, struct latency *out)
{
    int rc = launch(j);
    for (int k = 0; !rc && k < j->kills; k++) {
        rc = await_round(j, k, true);
        if (rc)
            break;
        sleep_ms(settle_ms);
        int64_t t_kill = now_ns();
        rc = kill(j->r[k].victim, SIGKILL);
        rc = rc ? rc : await_round(j, k + 1, true);
        if (rc)
            break;
        struct round *r = &j->r[k + 1];
        out->detect[k] = r->fail_t ? (double)(r->fail_t - t_kill) / 1e6 : 0;
        out->to_main[k] = (double)(r->main_t - t_kill) / 1e6;
        out->startup[k] = (double)(r->init_t - r->main_t) / 1e6;
        out->to_call[k] = (double)(r->ok_t - r->init_t) / 1e6;
        out->served[k] = (double)(r->ok_t - t_kill) / 1e6;
        out->own[k] = out->served[k] - out->startup[k];
    }
    return end_job(j, rc);
}

struct dip {
    double rate, after, stall_ms, lost_ms, control_ms;
};

/* relaxed: read after shmrun's exit, which ordered every worker's stores (waitpid) */
static int64_t win(struct job *j, int64_t i) { return atomic_load_explicit(&j->pg->win[i], memory_order_relaxed); }

/* The time lost in the DIP_WIN windows from window `at` on, estimated from
 * the rate of the RATE_WIN windows before it: ms. */
static double lost_at(struct job *j, int64_t at)
{
    double rate = (double)(win(j, at) - win(j, at - rate_win)) / rate_win; /* steps per window */
    return ((double)dip_win - (double)(win(j, at + dip_win) - win(j, at)) / rate) * WIN_NS / 1e6;
}

static double rate_over(struct job *j, int64_t from, int64_t to) /* steps/s */
{
    return (double)(win(j, to) - win(j, from)) * 1e9 / ((double)(to - from) * WIN_NS);
}

static int run_dip(struct job *j, struct dip *out)
{
    memset(j->pg, 0, sizeof(*j->pg));
    atomic_store_explicit(&j->pg->stop_at, INT64_MAX, memory_order_relaxed); /* relaxed: before the launch */
    j->pg->t0 = now_ns();
    int rc = launch(j);
    rc = rc ? rc : await_round(j, 0, false);
    if (rc)
        return end_job(j, rc);
    sleep_ms(pre_ms);
    int64_t t_kill = now_ns();
    rc = kill(j->r[0].victim, SIGKILL);
    /* relaxed: a deadline rank 0 reads every step */
    atomic_store_explicit(&j->pg->stop_at, t_kill + (int64_t)post_ms * 1000000, memory_order_relaxed);
    rc = end_job(j, rc);
    /* relaxed: after shmrun's exit, as win() */
    int64_t k = (t_kill - j->pg->t0) / WIN_NS + 1, last = atomic_load_explicit(&j->pg->filled, memory_order_relaxed) - 1;
    if (rc || k - rate_win - dip_win < 0 || last < k + dip_win + rate_win) {
        fprintf(stderr, "bench_replace: dip: windows %lld to %lld, the kill in %lld\n", 0ll, (long long)last,
                (long long)k);
        return -1;
    }
    out->rate = rate_over(j, k - rate_win, k);
    out->after = rate_over(j, last - rate_win, last);
    out->stall_ms = (double)atomic_load_explicit(&j->pg->stall, memory_order_relaxed) / 1e6; /* relaxed: as win() */
    out->lost_ms = lost_at(j, k);
    out->control_ms = lost_at(j, k - dip_win); /* the same estimate where nothing happened: its noise */
    return 0;
}

/* A bare fork + exec of this program, to its main(): ms. */
static double exec_cost(const char *self)
{
    int p[2];
    if (pipe(p))
        return -1;
    char fdb[16];
    snprintf(fdb, sizeof(fdb), "%d", p[1]);
    int64_t t0 = now_ns(), t1 = 0;
    pid_t pid = fork();
    if (pid == 0) {
        execl(self, self, "--exec-probe", fdb, (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    if (pid < 0 || read(p[0], &t1, sizeof(t1)) != sizeof(t1))
        t1 = t0 - 1000000;
    close(p[0]);
    waitpid(pid, NULL, 0);
    return (double)(t1 - t0) / 1e6;
}

#define EXECS 15 /* bare fork + exec of this program: the latency figures' floor */

/* The latency figures of one policy, in ns, each next to a bare fork + exec
 * of this program (round-robin over the EXECS measured). */
static void print_latency(const struct job *j, const struct latency *l, const double *ex)
{
    static const char *what[] = {"kill -> rank 0's first failed call", "kill -> the new victim's main()",
                                 "its own start-up (main -> past sr_init)", "past sr_init -> rank 0 served by it",
                                 "kill -> rank 0 served by the new one", "served - own start-up"};
    const double *fig[] = {l->detect, l->to_main, l->startup, l->to_call, l->served, l->own};
    double ours[MAX_KILLS], floor_[MAX_KILLS];
    for (int f = j->rank_policy ? 0 : 1; f < 6; f++) { /* detect: rank policy only (job: rank 0 is stopped too) */
        char config[96];
        snprintf(config, sizeof(config), "--restart %s: %s", j->rank_policy ? "rank" : "job", what[f]);
        for (int k = 0; k < j->kills; k++)
            ours[k] = fig[f][k] * 1e6, floor_[k] = ex[k % EXECS] * 1e6;
        bench_job_print("replace latency", config, "fork+exec", ours, floor_, j->kills);
    }
}

static int bench_latency(struct job *j, int settle_ms, const double *ex, struct latency *l)
{
    j->mode = "latency";
    memset(j->r, 0, sizeof(j->r));
    if (run_latency(j, settle_ms, l))
        return -1;
    printf("latency, --restart %s: %d workers, %d kills of rank %d in one job\n", j->rank_policy ? "rank" : "job",
           j->n, j->kills, j->n - 1);
    print_latency(j, l, ex);
    /* drift: the last third against the first */
    int third = j->kills / 3;
    double first = 0, last = 0;
    for (int k = 0; k < third; k++)
        first += l->served[k], last += l->served[j->kills - 1 - k];
    if (third)
        printf("  served, mean of the first %d kills %.1f ms, of the last %d %.1f ms\n", third, first / third, third,
               last / third);
    return 0;
}

/* The dip's figures of `trials` trials under one policy, in ns: the time a
 * call took (rank 0's steps, one call to each other rank) before and after
 * the kill, the stall, the time lost, and the same estimate with no kill. */
struct dips {
    double before[64], after[64], stall[64], lost[64], control[64];
};

static int bench_dip(struct job *j, int trials, struct dips *out)
{
    j->mode = "dip";
    j->kills = 1;
    for (int t = 0; t < trials; t++) {
        struct dip d = {0};
        memset(j->r, 0, sizeof(j->r));
        if (run_dip(j, &d))
            return -1;
        if (getenv("BENCH_REPLACE_VERBOSE"))
            fprintf(stderr, "  trial %d: %.0f steps/s before, %.0f after, stall %.1f ms, lost %.1f ms (%.1f)\n", t,
                    d.rate, d.after, d.stall_ms, d.lost_ms, d.control_ms);
        out->before[t] = 1e9 / (d.rate * (j->n - 1)), out->after[t] = 1e9 / (d.after * (j->n - 1));
        out->stall[t] = d.stall_ms * 1e6, out->lost[t] = d.lost_ms * 1e6, out->control[t] = d.control_ms * 1e6;
    }
    printf("dip, --restart %s: %d workers (rank 0 steps: a call to each of the %d others), one kill of rank %d, "
           "%d trials\n", j->rank_policy ? "rank" : "job", j->n, j->n - 1, j->n - 1, trials);
    const char *pol = j->rank_policy ? "rank" : "job";
    char config[96];
    snprintf(config, sizeof(config), "--restart %s: ns per call, kill + 600 ms on", pol);
    bench_job_print("replace dip", config, "before", out->after, out->before, trials);
    double control = bench_median(out->control, (size_t)trials) / 1e6;
    printf("  (the lost-time estimate over 300 ms without a kill, its noise: p50 %.1f ms)\n", control);
    return 0;
}

int main(int argc, char **argv)
{
    t_main = now_ns();
    if (argc == 6 && !strcmp(argv[1], "--worker"))
        return worker(argv);
    if (argc == 3 && !strcmp(argv[1], "--exec-probe")) {
        int fd = atoi(argv[2]);
        return write(fd, &t_main, sizeof(t_main)) == sizeof(t_main) ? 0 : 1;
    }
    bench_cli cli = {.prog = "bench_replace", .names = {"latency", "dip"},
                     .opts = {"-n", "--kills", "--trials", "--settle-ms", "--shmrun"},
                     .usage = "  -n N           workers (2..16, default 4)\n"
                              "  --kills K      latency: kills in one job (1..200, default 30)\n"
                              "  --trials T     dip: trials (1..64, default 5)\n"
                              "  --settle-ms MS latency: from rank 0 served to the next kill (0..10000, default 20)\n"
                              "  --shmrun PATH  shmrun (default: beside this program in the build)\n",
                     .smoke_what = "3 workers, 2 kills, 1 dip trial of a 150 ms lead and 300 ms on (options may say otherwise)"};
    bench_cli_parse(&cli, argc, argv);
    bool smoke = cli.smoke;
    if (smoke)
        rate_win = 10, dip_win = 6, pre_ms = 150, post_ms = 300;
    int n = cli.opt[0] ? (int)bench_cli_int(&cli, "-n", cli.opt[0], 2, MAX_N) : smoke ? 3 : 4;
    int kills = cli.opt[1] ? (int)bench_cli_int(&cli, "--kills", cli.opt[1], 1, MAX_KILLS) : smoke ? 2 : 30;
    int trials = cli.opt[2] ? (int)bench_cli_int(&cli, "--trials", cli.opt[2], 1, 64) : smoke ? 1 : 5;
    int settle = cli.opt[3] ? (int)bench_cli_int(&cli, "--settle-ms", cli.opt[3], 0, 10000) : smoke ? 0 : 20;
    char self[PATH_MAX], shmrun[PATH_MAX + 32] = "";
    snprintf(shmrun, sizeof(shmrun), "%s", cli.opt[4] ? cli.opt[4] : "");
    bench_job_paths(self, sizeof(self), shmrun, sizeof(shmrun));
    struct job *j = calloc(1, sizeof(*j));
    struct latency *l = calloc(2, sizeof(*l));
    struct dips *d = calloc(2, sizeof(*d));
    int pg_fd = memfd_create("bench_replace", 0); /* inherited by shmrun and every worker */
    if (!j || !l || !d || pg_fd < 0 || ftruncate(pg_fd, sizeof(struct page)))
        return 1;
    *j = (struct job){.bj = {.who = "bench_replace", .shmrun = shmrun, .take = take_line, .ctx = j}, .self = self,
                      .n = n, .pg_fd = pg_fd,
                      .pg = mmap(NULL, sizeof(struct page), PROT_READ | PROT_WRITE, MAP_SHARED, pg_fd, 0)};
    if (j->pg == MAP_FAILED)
        return 1;
    double ex[EXECS];
    for (int i = 0; i < EXECS; i++)
        ex[i] = exec_cost(self);
    printf("bench_replace: %d workers; floor of the latency figures: a bare fork + exec of this program\n", n);
    int rc = 0;
    for (int policy = 1; policy >= 0 && !rc && bench_cli_wants(&cli, "latency"); policy--) {
        j->rank_policy = policy;
        j->kills = kills;
        rc = bench_latency(j, settle, ex, &l[policy]);
    }
    if (!rc && bench_cli_wants(&cli, "latency")) { /* each kill against the same kill under the whole-job restart */
        double ours[MAX_KILLS], floor_[MAX_KILLS];
        for (int k = 0; k < kills; k++)
            ours[k] = l[1].served[k] * 1e6, floor_[k] = l[0].served[k] * 1e6;
        bench_job_print("replace latency", "kill -> rank 0 served, --restart rank", "--restart job", ours, floor_,
                        kills);
    }
    for (int policy = 1; policy >= 0 && !rc && bench_cli_wants(&cli, "dip"); policy--) {
        j->rank_policy = policy;
        rc = bench_dip(j, trials, &d[policy]);
    }
    if (!rc && bench_cli_wants(&cli, "dip"))
    {
        bench_job_print("replace dip", "stall, --restart rank", "--restart job", d[1].stall, d[0].stall, trials);
        bench_job_print("replace dip", "lost in the 300 ms from the kill, --restart rank", "--restart job", d[1].lost,
                        d[0].lost, trials);
    }
    free(j), free(l), free(d);
    return rc ? 1 : 0;
}
