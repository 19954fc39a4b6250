/* A rank replaced in place against a whole-job restart (shmrun --restart
 * rank|job; docs/PERFORMANCE.md, "Replacement in place against a whole-job
 * restart").
 *
 *   bench_replace [-n N] [--kills K] [--trials T] [--settle-ms MS] [--shmrun PATH]
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
 *   the bench SIGKILLs rank N-1 once; rank 0 stops POST_MS after the kill.
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

#include "shmrpc/shmrpc.h"

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
    /* relaxed: stop_at is a deadline, read again every step */
    for (int64_t s = 0; now_ns() < atomic_load_explicit(&pg->stop_at, memory_order_relaxed); s++) {
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
    const char *shmrun, *self, *mode;
    int n, kills, fd, log;
    bool rank_policy;
    pid_t pid;
    struct page *pg;
    int pg_fd;
    struct round r[MAX_KILLS + 1];
    char buf[4096];
    size_t len;
};

static int take_line(struct job *j, const char *line)
{
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

static int read_lines(struct job *j)
{
    ssize_t got = read(j->fd, j->buf + j->len, sizeof(j->buf) - 1 - j->len);
    if (got <= 0) {
        fprintf(stderr, "bench_replace: the workers closed the report pipe\n");
        return -1;
    }
    j->len += (size_t)got;
    j->buf[j->len] = 0;
    for (char *nl; (nl = strchr(j->buf, '\n'));) {
        *nl = 0;
        if (take_line(j, j->buf))
            return -1;
        j->len -= (size_t)(nl + 1 - j->buf);
        memmove(j->buf, nl + 1, j->len + 1);
    }
    return 0;
}

/* Read reports until round k has every worker up (all: the job policy's
 * attempt, or round 0) or its victim up (the rank policy), and, when
 * `served`, rank 0 served by it. Bounded. */
static int await_round(struct job *j, int k, bool served)
{
    int want = k == 0 || !j->rank_policy ? j->n : 1;
    int64_t deadline = now_ns() + (int64_t)WAIT_MS * 1000000;
    while (j->r[k].up < want || (served && !j->r[k].served)) {
        int left = (int)((deadline - now_ns()) / 1000000);
        struct pollfd p = {.fd = j->fd, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, left) <= 0) {
            fprintf(stderr, "bench_replace: round %d: %d of %d workers up%s within %d ms\n", k, j->r[k].up, want,
                    served && !j->r[k].served ? ", rank 0 not served" : "", WAIT_MS);
            return -1;
        }
        if (read_lines(j))
            return -1;
    }
    return 0;
}

static void print_log(struct job *j)
{
    char buf[4096];
    lseek(j->log, 0, SEEK_SET);
    for (ssize_t got; (got = read(j->log, buf, sizeof(buf))) > 0;)
        fwrite(buf, 1, (size_t)got, stderr);
}

static int launch(struct job *j)
{
    int p[2];
    char tmpl[] = "/tmp/bench_replace.XXXXXX";
    j->log = mkstemp(tmpl);
    if (j->log < 0 || pipe(p))
        return -1;
    unlink(tmpl);
    fcntl(p[0], F_SETFD, FD_CLOEXEC);
    char nb[16], fdb[16], pgb[16], kb[16], restarts[16], prefix[48];
    snprintf(nb, sizeof(nb), "%d", j->n);
    snprintf(fdb, sizeof(fdb), "%d", p[1]);
    snprintf(pgb, sizeof(pgb), "%d", j->pg_fd);
    snprintf(kb, sizeof(kb), "%d", j->kills);
    snprintf(restarts, sizeof(restarts), "%d", j->kills);
    snprintf(prefix, sizeof(prefix), "bench_replace%d", (int)getpid());
    j->pid = fork();
    if (j->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(j->log, 2);
        execl(j->shmrun, j->shmrun, "-n", nb, "--restart", j->rank_policy ? "rank" : "job", "--max-restarts",
              restarts, "--name-prefix", prefix, "--", j->self, "--worker", j->mode, fdb, pgb, kb, (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    j->fd = p[0];
    return j->pid > 0 ? 0 : -1;
}

/* shmrun's exit, bounded; 0 if it exited 0. */
static int end_job(struct job *j, int rc)
{
    int st = 0, pidfd = (int)syscall(SYS_pidfd_open, j->pid, 0);
    struct pollfd p = {.fd = pidfd, .events = POLLIN};
    if (!rc && (pidfd < 0 || poll(&p, 1, WAIT_MS) != 1)) {
        fprintf(stderr, "bench_replace: shmrun did not end within %d ms\n", WAIT_MS);
        rc = -1;
    }
    if (pidfd >= 0)
        close(pidfd);
    if (rc)
        kill(j->pid, SIGKILL);
    waitpid(j->pid, &st, 0);
    if (WIFEXITED(st) && WEXITSTATUS(st)) /* 127: shmrun could not be run */
        fprintf(stderr, "bench_replace: %s exited with status %d\n", j->shmrun, WEXITSTATUS(st));
    else if (!rc && WIFSIGNALED(st))
        fprintf(stderr, "bench_replace: %s was killed by signal %d\n", j->shmrun, WTERMSIG(st));
    rc = rc || !WIFEXITED(st) || WEXITSTATUS(st) ? -1 : 0;
    if (rc)
        print_log(j);
    close(j->fd), close(j->log);
    return rc;
}

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
    double rate = (double)(win(j, at) - win(j, at - RATE_WIN)) / RATE_WIN; /* steps per window */
    return ((double)DIP_WIN - (double)(win(j, at + DIP_WIN) - win(j, at)) / rate) * WIN_NS / 1e6;
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
    sleep_ms(PRE_MS);
    int64_t t_kill = now_ns();
    rc = kill(j->r[0].victim, SIGKILL);
    /* relaxed: a deadline rank 0 reads every step */
    atomic_store_explicit(&j->pg->stop_at, t_kill + (int64_t)POST_MS * 1000000, memory_order_relaxed);
    rc = end_job(j, rc);
    /* relaxed: after shmrun's exit, as win() */
    int64_t k = (t_kill - j->pg->t0) / WIN_NS + 1, last = atomic_load_explicit(&j->pg->filled, memory_order_relaxed) - 1;
    if (rc || k - RATE_WIN - DIP_WIN < 0 || last < k + DIP_WIN + RATE_WIN) {
        fprintf(stderr, "bench_replace: dip: windows %lld to %lld, the kill in %lld\n", 0ll, (long long)last,
                (long long)k);
        return -1;
    }
    out->rate = rate_over(j, k - RATE_WIN, k);
    out->after = rate_over(j, last - RATE_WIN, last);
    out->stall_ms = (double)atomic_load_explicit(&j->pg->stall, memory_order_relaxed) / 1e6; /* relaxed: as win() */
    out->lost_ms = lost_at(j, k);
    out->control_ms = lost_at(j, k - DIP_WIN); /* the same estimate where nothing happened: its noise */
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

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void report(const char *what, double *v, int k, const char *unit)
{
    qsort(v, (size_t)k, sizeof(*v), cmp);
    printf("  %-42s p50 %8.1f %s  min %8.1f %s  max %8.1f %s\n", what, v[k / 2], unit, v[0], unit, v[k - 1], unit);
}

static int bench_latency(struct job *j, int settle_ms)
{
    struct latency *l = calloc(1, sizeof(*l));
    j->mode = "latency";
    memset(j->r, 0, sizeof(j->r));
    if (!l || run_latency(j, settle_ms, l)) {
        free(l);
        return -1;
    }
    printf("latency, --restart %s: %d workers, %d kills of rank %d in one job\n", j->rank_policy ? "rank" : "job",
           j->n, j->kills, j->n - 1);
    /* drift: the last third against the first, before the sort */
    int third = j->kills / 3;
    double first = 0, last = 0;
    for (int k = 0; k < third; k++)
        first += l->served[k], last += l->served[j->kills - 1 - k];
    if (j->rank_policy)
        report("kill -> rank 0's first failed call", l->detect, j->kills, "ms");
    report("kill -> the new victim's main()", l->to_main, j->kills, "ms");
    report("its own start-up (main -> past sr_init)", l->startup, j->kills, "ms");
    report("past sr_init -> rank 0 served by it", l->to_call, j->kills, "ms");
    report("kill -> rank 0 served by the new one", l->served, j->kills, "ms");
    report("served - own start-up", l->own, j->kills, "ms");
    if (third)
        printf("  served, mean of the first %d kills %.1f ms, of the last %d %.1f ms\n", third, first / third, third,
               last / third);
    free(l);
    return 0;
}

static int bench_dip(struct job *j, int trials)
{
    double rate[64], after[64], stall[64], lost[64], control[64];
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
        rate[t] = d.rate * (j->n - 1), after[t] = d.after * (j->n - 1), stall[t] = d.stall_ms, lost[t] = d.lost_ms;
        control[t] = d.control_ms;
    }
    printf("dip, --restart %s: %d workers (rank 0 steps: a call to each of the %d others), one kill of rank %d, "
           "%d trials\n", j->rank_policy ? "rank" : "job", j->n, j->n - 1, j->n - 1, trials);
    report("calls/s, the 500 ms before the kill", rate, trials, "/s");
    report("calls/s, from kill + 600 ms to the stop", after, trials, "/s");
    report("stall (longest time between two steps)", stall, trials, "ms");
    report("lost in the 300 ms from the kill", lost, trials, "ms");
    report("the same estimate, 300 ms without a kill", control, trials, "ms");
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
    int n = 4, kills = 30, trials = 5, settle = 20;
    char self[PATH_MAX], shmrun[PATH_MAX + 32] = "";
    ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
    self[len > 0 ? len : 0] = 0;
    int i = 1;
    for (; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-n"))
            n = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--kills"))
            kills = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--trials"))
            trials = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--settle-ms"))
            settle = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--shmrun"))
            snprintf(shmrun, sizeof(shmrun), "%s", argv[i + 1]);
        else
            break;
    }
    if (i < argc || n < 2 || n > MAX_N || kills < 1 || kills > MAX_KILLS || trials < 1 || trials > 64 ||
        settle < 0 || settle > 10000) {
        fprintf(stderr, "usage: bench_replace [-n 2..%d] [--kills 1..%d] [--trials 1..64] [--settle-ms 0..10000] "
                        "[--shmrun PATH]\n", MAX_N, MAX_KILLS);
        return 2;
    }
    if (!*shmrun) { /* beside us in the build: bench/../launcher/shmrun */
        char *slash = strrchr(self, '/');
        snprintf(shmrun, sizeof(shmrun), "%.*s/../launcher/shmrun", slash ? (int)(slash - self) : 1,
                 slash ? self : ".");
    }
    struct job *j = calloc(1, sizeof(*j));
    int pg_fd = memfd_create("bench_replace", 0); /* inherited by shmrun and every worker */
    if (!j || pg_fd < 0 || ftruncate(pg_fd, sizeof(struct page)))
        return 1;
    *j = (struct job){.shmrun = shmrun, .self = self, .n = n, .pg_fd = pg_fd,
                      .pg = mmap(NULL, sizeof(struct page), PROT_READ | PROT_WRITE, MAP_SHARED, pg_fd, 0)};
    if (j->pg == MAP_FAILED)
        return 1;
    double ex[15];
    for (int i = 0; i < 15; i++)
        ex[i] = exec_cost(self);
    printf("bench_replace: %d workers\n", n);
    report("fork + exec of this program -> its main()", ex, 15, "ms");
    int rc = 0;
    for (int policy = 1; policy >= 0 && !rc; policy--) {
        j->rank_policy = policy;
        j->kills = kills;
        rc = bench_latency(j, settle);
    }
    for (int policy = 1; policy >= 0 && !rc; policy--) {
        j->rank_policy = policy;
        rc = bench_dip(j, trials);
    }
    free(j);
    return rc ? 1 : 0;
}
