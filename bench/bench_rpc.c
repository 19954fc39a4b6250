/* SPDX-License-Identifier: MIT */
/* RPC benchmarks, each printed next to the floor measured in the same run
 * and next to PyTorch's figure, measured in the same run too:
 * bench/compare/torch_rpc.py runs first (--no-torch or BENCH_NO_TORCH=1 skip
 * it, BENCH_TORCH_QUICK=1 runs it with fewer iterations; without
 * python3-torch each line says "torch not installed").
 *
 *   bench_rpc [--json] [--no-torch] [hot] [udf] [asleep] [pipeline] [self] [entry] [fanin] [tensor] [executors] [probes]
 *
 * hot       no-op rpc_sync round trip, both sides polling (spinning allowed)
 * udf       the same with a registered plain function, the callee idle in
 *           sr_shutdown (PyTorch's anchor is a Python UDF answered so); and
 *           with the callee's main thread away, waiting outside the runtime
 *           (no user thread serves), with how many calls an executor ran
 * asleep    the same, but the callee never spins: every request wakes it;
 *           and with neither side spinning (both asleep)
 * pipeline  rpc_async no-op calls with up to 1024 in flight, calls/s, against
 *           the ring's own per-message cost measured first in the same run
 *           (one producer, one consumer in bursts of 32, as bench_ring burst)
 * self      the RPC layer's own work, no transfer: one thread calls its own
 *           worker (both sides of every call on one core), rpc_sync and
 *           rpc_async in windows of 64; ns per call, median of 256-call batches,
 *           in the worker's CPU time (so a loaded machine's preemption is left
 *           out), and rpc_sync's against the hot rounds' floor (a bound)
 * entry     an entry point's reference to the agent (sr_rank, which takes
 *           and drops one and does nothing else): ns a call from one thread,
 *           and from two threads of the worker at once (each thread counts
 *           its references on its own line: no shared word to contend on)
 * fanin     N callers (1, 2, 4, 8) -> one callee idle in sr_shutdown, for a
 *           fixed window after a common start: total calls/s against one
 *           caller's, per-caller counts (starvation shows), worst p50/p99,
 *           and the CPU each call cost the callers and the callee (process
 *           CPU time over the window), with how many cores that keeps busy
 * tensor    rpc_sync(add) of two tensors from 4 B to 256 MiB
 * executors plain functions under concurrent callers, by executor pool size
 * probes    the hot no-op round trip with the profiler's probes compiled out,
 *           compiled in but off, statistics on, trace on (probe_cost.c)
 *
 * Method: the callee (rank 1) alternates between echoing the floor
 * ping-pongs and serving calls while it waits on a future that the caller
 * completes at the end of each round; `noop` and `add` are built-ins, so
 * they run inline on the polling thread. Results are checked after timing.
 */
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <sys/prctl.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "icount.h"
#include "floor.h"
#include "probe_cost.h"
#include "shmrpc/shmrpc.h"
#include "shmrpc/tensor.h"
#include "shm/xport.h"

#ifndef BENCH_COMPARE_DIR
#define BENCH_COMPARE_DIR "bench/compare"
#endif

static bench_torch pt; /* PyTorch's figures (torch_rpc.py), measured before ours */

#define ROUNDS 7
#define CALLS 20000
#define CL_N 20000
#define FX_N 2000

/* The counts above, or --smoke's (smoke_counts): a smoke run's figures are
 * not measurements. So are those of each workload below. */
static int rounds = ROUNDS, calls = CALLS, cl_n = CL_N, fx_n = FX_N, warm = 2000;

struct shared {
    bench_floor_area floor;
    bench_barrier bar;
    bench_rounds cl, fx;
    int errors;
    uint64_t udf_hops; /* bench udf: calls the callee ran on an executor (a thread hop) */
    uint64_t timed_calls, sleeps, wakes; /* the latency workloads: the caller's timed calls, and its
                                          * doorbell sleeps and wake syscalls during them */
    double ring_ns[ROUNDS]; /* bench pipeline: the ring's ns per message, per round */
    int ring_rounds;
    double hot_floor50; /* bench hot: the cache-line floor's p50 (median over rounds), for bench self */
};

static struct shared *sh;
static sr_future *round_fut; /* rank 1: completed by the caller's "round_done" */

static int round_done(sr_call *c)
{
    sr_future_set_result(round_fut, NULL);
    return sr_call_return(c, NULL);
}

static int serve_round(void)
{
    int rc = sr_future_wait(round_fut, NULL);
    sr_future_unref(round_fut);
    round_fut = sr_future_new();
    return rc;
}

static const char *noop_fn = "noop"; /* or "udf_noop": a registered plain function */

static _Atomic uint64_t udf_hops; /* rank 1 of bench udf: calls an executor ran (a thread hop) */

/* Whether this thread is one of the worker's executors ("shmrpc-exec<i>"),
 * asked once per thread. */
static bool on_executor(void)
{
    static _Thread_local int known; /* 0 not asked yet, 1 no, 2 yes */
    if (!known) {
        char name[16] = "";
        prctl(PR_GET_NAME, name);
        known = strncmp(name, "shmrpc-exec", 11) ? 1 : 2;
    }
    return known == 2;
}

static int udf_noop(sr_call *c)
{
    if (on_executor()) /* relaxed: a statistic */
        atomic_fetch_add_explicit(&udf_hops, 1, memory_order_relaxed);
    return sr_call_return(c, NULL);
}

/* The caller's doorbell sleeps and wake syscalls so far (sr_debug_info). */
static void count_wakes(uint64_t *sleeps, uint64_t *wakes)
{
    sr_debug_info d;
    if (sr_debug_info_get(&d))
        d.sleeps_taken = d.wakes_issued = 0;
    *sleeps = d.sleeps_taken;
    *wakes = d.wakes_issued;
}

static bench_lat time_noop(int n, int64_t *lat)
{
    uint64_t s0, w0, s1, w1;
    count_wakes(&s0, &w0);
    for (int i = 0; i < n; i++) {
        int64_t t0 = bench_now_ns();
        if (sr_rpc_sync(1, noop_fn, SR_NOARGS, 0, NULL))
            sh->errors++;
        lat[i] = bench_now_ns() - t0;
    }
    count_wakes(&s1, &w1);
    sh->timed_calls += (uint64_t)n;
    sh->sleeps += s1 - s0;
    sh->wakes += w1 - w0;
    return bench_lat_of(lat, (size_t)n);
}

/* The caller's sleeps and wakes per timed call of the workload just run, on
 * a line of its own after its figure (a lost or spurious ring shows there
 * before it shows in a ratio), and as a record. */
static void report_wakes(const char *name, const char *config)
{
    double n = sh->timed_calls ? (double)sh->timed_calls : 1, sleeps = sh->sleeps / n, wakes = sh->wakes / n;
    printf("%s | %s | caller per call: %.3f doorbell sleeps, %.3f wake syscalls\n", name, config, sleeps, wakes);
    bench_rec r;
    bench_rec_begin(&r, name);
    bench_rec_str(&r, "config", config);
    bench_rec_num(&r, "caller_sleeps_per_call", sleeps);
    bench_rec_num(&r, "caller_wakes_per_call", wakes);
    bench_rec_emit(&r);
    sh->timed_calls = sh->sleeps = sh->wakes = 0;
}

/* One configuration of the no-op round trip against one floor. */
static int latency_rounds(int rank, bool futex_floor, bench_rounds *out)
{
    static int64_t lat[CALLS], fl[CL_N];
    uint32_t nfl = futex_floor ? fx_n : cl_n;
    for (int r = 0; r < rounds; r++) {
        enum bench_role role = rank == 0 ? BENCH_INITIATOR : BENCH_ECHO;
        bench_barrier_wait(&sh->bar, 2, 30ll * 1000000000);
        int rc = futex_floor ? bench_floor_futex(&sh->floor, role, nfl, fl)
                             : bench_floor_cacheline(&sh->floor, role, nfl, fl);
        if (rc)
            return rc;
        if (rank == 1) {
            if (serve_round())
                return -EIO;
            continue;
        }
        bench_lat floor = bench_lat_of(fl, nfl);
        bench_lat ours = time_noop(futex_floor ? calls / 10 : calls, lat);
        sr_rpc_sync(1, "round_done", SR_NOARGS, 0, NULL);
        bench_rounds_add(out, ours, floor);
    }
    return 0;
}

static int run_latency(int rank, int world, void *arg)
{
    (void)world;
    intptr_t mode = (intptr_t)arg; /* 0 hot, 1 callee asleep, 2 both asleep */
    bool asleep = mode != 0;
    if ((mode == 1 && rank == 1) || mode == 2) /* never spin: every message wakes a sleeper */
        setenv("SHMRPC_SPIN_NS", "0", 1);
    sr_register("round_done", round_done);
    sr_register("udf_noop", udf_noop);
    round_fut = sr_future_new();
    if (sr_init(NULL))
        return 1;
    for (int i = 0; rank == 0 && i < warm; i++) /* warm up */
        sr_rpc_sync(1, noop_fn, SR_NOARGS, 0, NULL);
    int rc = latency_rounds(rank, asleep, asleep ? &sh->fx : &sh->cl);
    sr_future_unref(round_fut);
    sr_shutdown(true, 60);
    return rc ? 1 : 0;
}

/* Returns the floor's p50 (the median over rounds). */
static double report_latency(const char *name, const char *config, const char *floor_name, bench_rounds *r,
                             double target)
{
    bench_summary s = bench_summarize(r);
    char extra[320];
    bench_torch_vs(&pt, "noop", s.ours50, extra, sizeof(extra));
    bench_print_torch(name, config, floor_name, &s, target, extra, &pt, "noop");
    return s.floor50;
}

static int bench_hot_and_asleep(bool hot, bool asleep)
{
    sr_spawn_opts o = {.name_prefix = "bench-rpc", .shm_size = 512u << 20};
    if (hot) {
        memset(&sh->cl, 0, sizeof(sh->cl));
        if (sr_spawn(2, run_latency, NULL, &o))
            return fprintf(stderr, "bench_rpc hot: %s\n", sr_last_error()), 1;
        sh->hot_floor50 = report_latency("rpc_sync noop", "hot (both polling)", "cache-line ping-pong", &sh->cl, 2.5);
        report_wakes("rpc_sync noop", "hot (both polling)");
    }
    if (asleep) {
        memset(&sh->fx, 0, sizeof(sh->fx));
        if (sr_spawn(2, run_latency, (void *)1, &o))
            return fprintf(stderr, "bench_rpc asleep: %s\n", sr_last_error()), 1;
        report_latency("rpc_sync noop", "callee asleep, caller hot", "futex ping-pong", &sh->fx, 1.3);
        report_wakes("rpc_sync noop", "callee asleep, caller hot");
        /* Like for like with the floor (both sides sleep): two wake-ups per
         * round trip, as the floor's, since the caller sleeps on its doorbell
         * and the response wakes it directly (target <= 1.3x). */
        memset(&sh->fx, 0, sizeof(sh->fx));
        if (sr_spawn(2, run_latency, (void *)2, &o))
            return fprintf(stderr, "bench_rpc asleep: %s\n", sr_last_error()), 1;
        report_latency("rpc_sync noop", "both asleep", "futex ping-pong", &sh->fx, 1.3);
        report_wakes("rpc_sync noop", "both asleep");
    }
    return 0;
}

/* ---- a registered (plain) no-op ----
 * PyTorch's no-op is a Python UDF answered by a worker sitting in
 * rpc.shutdown(): this is the like-for-like case (UDF_IDLE). The callee
 * cannot echo the floor while it serves, so the floor rounds come first,
 * then the call rounds, in the same two processes. UDF_AWAY: the callee's
 * main thread waits outside the runtime (a semaphore that the caller's
 * "udf_release" posts at the end), as a program's does while it computes or
 * joins its own threads: no user thread serves. */
enum { UDF_IDLE, UDF_AWAY };
static sem_t udf_away_sem; /* rank 1, UDF_AWAY: what its main thread waits on */

static int udf_release(sr_call *c)
{
    sem_post(&udf_away_sem);
    return sr_call_return(c, NULL);
}

static int run_udf(int rank, int world, void *arg)
{
    (void)world;
    intptr_t mode = (intptr_t)arg;
    static int64_t lat[CALLS], fl[CL_N];
    bench_lat floors[ROUNDS];
    for (int r = 0; r < rounds; r++) {
        if (bench_floor_cacheline(&sh->floor, rank == 0 ? BENCH_INITIATOR : BENCH_ECHO, cl_n, fl))
            return 1;
        if (rank == 0)
            floors[r] = bench_lat_of(fl, cl_n);
    }
    sr_register("udf_noop", udf_noop);
    sr_register("udf_release", udf_release);
    sem_init(&udf_away_sem, 0, 0);
    if (sr_init(NULL))
        return 1;
    if (rank == 0) {
        noop_fn = "udf_noop";
        for (int i = 0; i < warm; i++)
            sr_rpc_sync(1, noop_fn, SR_NOARGS, 0, NULL);
        for (int r = 0; r < rounds; r++)
            bench_rounds_add(&sh->cl, time_noop(calls, lat), floors[r]);
        if (mode == UDF_AWAY && sr_rpc_sync(1, "udf_release", SR_NOARGS, 0, NULL))
            sh->errors++;
    } else if (mode == UDF_AWAY) {
        while (sem_wait(&udf_away_sem) && errno == EINTR)
            ;
    }
    sr_shutdown(true, 60);
    if (rank == 1) /* relaxed: the executors are joined */
        sh->udf_hops = atomic_load_explicit(&udf_hops, memory_order_relaxed);
    return 0;
}

static int bench_udf(void)
{
    static const char *config[] = {"callee idle in sr_shutdown", "callee's main thread away"};
    sr_spawn_opts o = {.name_prefix = "bench-udf", .shm_size = 512u << 20};
    for (intptr_t mode = UDF_IDLE; mode <= UDF_AWAY; mode++) {
        memset(&sh->cl, 0, sizeof(sh->cl));
        if (sr_spawn(2, run_udf, (void *)mode, &o))
            return fprintf(stderr, "bench_rpc udf: %s\n", sr_last_error()), 1;
        /* the like-for-like case has the target; the other is informational */
        report_latency("rpc_sync udf noop", config[mode], "cache-line ping-pong", &sh->cl, mode == UDF_IDLE ? 2.5 : 0);
        report_wakes("rpc_sync udf noop", config[mode]);
        printf("rpc_sync udf noop | %s | calls an executor ran (a thread hop): %llu of %d\n", config[mode],
               (unsigned long long)sh->udf_hops, rounds * calls + warm);
    }
    return 0;
}

/* ---- pipelined throughput ---- */

#define PIPE_CALLS 200000
#define WINDOW 1024
#define PIPE_TARGET_PER_S 8e6 /* calls/s for one pair; or: */
#define PIPE_TARGET_RING 2.5  /* times the ring's per-message cost of the same run */
#define RING_MSGS 200000
#define RING_BURST 32
#define RING_WAIT_NS (30ll * 1000000000)
static int pipe_calls = PIPE_CALLS;
static uint64_t ring_msgs = RING_MSGS;

static double pipe_cps;

/* The ring's own cost in this run: rank 1 sends RING_MSGS messages through
 * sr_xport, rank 0 takes them in bursts (bench_ring burst 1->1, here so that
 * the pipeline's figure has it to compare with). Order is checked after timing. */
static int ring_consume(sr_xport *x, uint64_t *bad)
{
    int64_t deadline = sr__now_ns() + RING_WAIT_NS;
    sr_msg m[RING_BURST];
    uint64_t next = 0;
    while (next < ring_msgs) {
        unsigned k = sr__xport_recv_burst(x, m, RING_BURST);
        for (unsigned i = 0; i < k; i++, next++) {
            uint64_t v;
            memcpy(&v, m[i].data, sizeof(v));
            *bad += v != next || m[i].src != 1;
        }
        int ev = k ? 0 : sr__xport_wait(x, deadline);
        if (ev < 0 || ((ev & SR_WAKE_TIMEOUT) && !sr__ring_ready(x->inbox)))
            return ev < 0 ? ev : -ETIMEDOUT;
    }
    return 0;
}

static int ring_worker(int rank, int world, void *arg)
{
    (void)world;
    (void)arg;
    sr_xport *x = NULL;
    int rc = sr__xport_attach(NULL, &x);
    for (int r = 0; !rc && r < rounds; r++) {
        rc = bench_barrier_wait(&sh->bar, 2, RING_WAIT_NS);
        if (!rc && rank == 1) {
            sr_msg m = {.type = 0};
            /* One bound for the round, as bench_ring's producers: a clock
             * read per message was a fifth of this floor's cost (perf) */
            int64_t deadline = sr__now_ns() + RING_WAIT_NS;
            for (uint64_t i = 0; i < ring_msgs && !rc; i++) {
                memcpy(m.data, &i, sizeof(i));
                rc = sr__xport_send_wait(x, 0, &m, deadline);
            }
        } else if (!rc) {
            uint64_t bad = 0;
            int64_t t = bench_now_ns();
            rc = ring_consume(x, &bad);
            t = bench_now_ns() - t;
            if (!rc && bad)
                rc = -EBADMSG;
            sh->ring_ns[sh->ring_rounds++] = (double)t / ring_msgs;
        }
    }
    if (!rc)
        rc = bench_barrier_wait(&sh->bar, 2, RING_WAIT_NS); /* nobody detaches mid-round */
    if (x)
        sr__xport_detach(x);
    if (rc)
        fprintf(stderr, "bench_rpc pipeline: ring, rank %d: %s\n", rank, sr_last_error());
    return rc ? 1 : 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double ring_median_ns(void)
{
    qsort(sh->ring_ns, (size_t)sh->ring_rounds, sizeof(double), cmp_double);
    return sh->ring_rounds ? sh->ring_ns[sh->ring_rounds / 2] : 0;
}

static int run_pipeline(int rank, int world, void *arg)
{
    (void)world;
    (void)arg;
    if (sr_init(NULL))
        return 1;
    int rc = 0;
    if (rank == 0) {
        static sr_future *win[WINDOW];
        int64_t t0 = bench_now_ns();
        for (int i = 0; i < pipe_calls && !rc; i++) {
            sr_future **slot = &win[i % WINDOW];
            if (*slot) {
                rc = sr_future_wait(*slot, NULL);
                sr_future_unref(*slot);
            }
            if (!rc)
                rc = sr_rpc_async(1, "noop", SR_NOARGS, 0, slot);
        }
        for (int i = 0; i < WINDOW; i++)
            if (win[i]) {
                rc |= sr_future_wait(win[i], NULL);
                sr_future_unref(win[i]);
            }
        pipe_cps = pipe_calls / ((double)(bench_now_ns() - t0) / 1e9);
        const bench_torch_fig *f = bench_torch_get(&pt, "pipeline");
        char vs[320];
        if (f && f->per_s > 0)
            snprintf(vs, sizeof(vs), "vs PyTorch %.0f calls/s (this run): %.0fx", f->per_s, pipe_cps / f->per_s);
        else
            snprintf(vs, sizeof(vs), "PyTorch: %s", pt.measured ? "no figure" : pt.why);
        double ring = ring_median_ns(), per_call = 1e9 / pipe_cps;
        /* met at PIPE_TARGET_PER_S, or within PIPE_TARGET_RING x the ring's own per-message cost */
        bool met = pipe_cps >= PIPE_TARGET_PER_S || (ring > 0 && per_call <= PIPE_TARGET_RING * ring);
        printf("rpc_async noop pipelined | %d calls, window %d | %.0f calls/s | target >= %.0f or <= %.1fx the ring "
               "(%s) | %s | %.1f ns/call, ring %.1f ns/msg in this run: %.2fx\n",
               pipe_calls, WINDOW, pipe_cps, PIPE_TARGET_PER_S, PIPE_TARGET_RING, bench_verdict(met), vs, per_call,
               ring, ring > 0 ? per_call / ring : 0);
        fflush(stdout);
        bench_rec r;
        bench_rec_begin(&r, "rpc_async noop pipelined");
        bench_rec_num(&r, "calls", pipe_calls);
        bench_rec_num(&r, "window", WINDOW);
        bench_rec_num(&r, "per_s", pipe_cps);
        bench_rec_num(&r, "target_per_s", PIPE_TARGET_PER_S);
        bench_rec_num(&r, "ring_ns_per_msg", ring);
        bench_rec_num(&r, "ratio_to_ring", ring > 0 ? per_call / ring : 0);
        bench_rec_bool(&r, "target_met", met);
        bench_rec_torch(&r, &pt, "pipeline");
        bench_rec_emit(&r);
    }
    sr_shutdown(true, 60);
    return rc ? 1 : 0;
}

/* ---- the RPC layer's own work: calls to this worker itself ----
 * rpc_sync: one thread makes the call, polls its own inbox, runs the
 * built-in inline, answers itself and completes its future: every per-call
 * step of both sides, with no cache line crossing cores and no scheduler in
 * the loop, so that a change to that work shows even on a loaded machine.
 * rpc_async: the window's first request wakes the parked progress thread
 * (no thread holds the inbox while the window is sent), which serves part
 * of the window on the other core; the CPU time counted is the worker's,
 * every thread's, so that work counts too, and so do the wake and sleep. */

#define SELF_BATCH 256
#define SELF_BATCHES 800
#define SELF_WINDOW 64
static int self_batches = SELF_BATCHES;


/* In the worker's CPU time, all its threads: a batch preempted by other
 * work on the machine does not count the time it was off the CPU. */
static int self_sync_batch(int self, int64_t *ns)
{
    int64_t t0 = bench_process_cpu_ns();
    for (int i = 0; i < SELF_BATCH; i++)
        if (sr_rpc_sync(self, "noop", SR_NOARGS, SR_TIMEOUT_NONE, NULL))
            return 1;
    *ns = bench_process_cpu_ns() - t0;
    return 0;
}

static int self_async_batch(int self, int64_t *ns)
{
    sr_future *win[SELF_WINDOW];
    int rc = 0;
    int64_t t0 = bench_process_cpu_ns();
    for (int i = 0; i < SELF_BATCH && !rc; i += SELF_WINDOW) {
        int n = 0;
        for (; n < SELF_WINDOW && !rc; n++)
            rc = sr_rpc_async(self, "noop", SR_NOARGS, SR_TIMEOUT_NONE, &win[n]);
        n -= rc != 0;
        for (int k = 0; k < n; k++) {
            rc |= sr_future_wait(win[k], NULL);
            sr_future_unref(win[k]);
        }
    }
    *ns = bench_process_cpu_ns() - t0;
    return rc ? 1 : 0;
}

/* Instructions per call in user mode on this thread (icount.h): the
 * same per-call work as the batches above, counted exactly, so that a
 * change of a few per cent shows in one run of a noisy machine. The
 * kernel's share (none here: no system call on this path once warm) and
 * the progress thread's are not in it, nor, for a plain function (the UDF),
 * the executor's that runs it: the caller serves no plain call, so this
 * thread hands it over (a queue push and a condition-variable signal) and
 * waits. -errno if it cannot count. */
#define SELF_ICOUNT_CALLS 100
static double self_icount(int self, const char *fn, int calls)
{
    bench_icount ic;
    int rc = bench_icount_begin(&ic);
    if (rc)
        return rc;
    for (int i = 0; i < calls && !rc; i++)
        rc = sr_rpc_sync(self, fn, SR_NOARGS, SR_TIMEOUT_NONE, NULL);
    int64_t n = bench_icount_end(&ic);
    return rc ? rc : n < 0 ? (double)n : (double)n / calls;
}

static void print_icount(const char *what, double n)
{
    if (n < 0)
        printf(" | %s: not counted (%s)", what, strerror((int)-n));
    else
        printf(" | %s %.0f", what, n);
}

static int run_self(int rank, int world, void *arg)
{
    (void)world;
    (void)arg;
    static int64_t sync_ns[SELF_BATCHES], async_ns[SELF_BATCHES];
    /* No spin: the idle progress thread then always parks the inbox, so
     * this thread takes it for each call and does both sides alone. A
     * spinning progress thread would serve some calls on the other core and
     * contend for the call slots (a third of its samples): CPU work this
     * thread's clock does not count, and cache lines that cross cores. */
    setenv("SHMRPC_SPIN_NS", "0", 1);
    if (sr_register("udf_noop", udf_noop) || sr_init(NULL))
        return 1;
    int rc = 0;
    for (int b = 0; b < self_batches / 4 && !rc; b++) /* warm-up */
        rc = self_sync_batch(rank, &sync_ns[0]) || self_async_batch(rank, &async_ns[0]);
    for (int b = 0; b < self_batches && !rc; b++) /* interleaved, so both see the same load */
        rc = self_sync_batch(rank, &sync_ns[b]) || self_async_batch(rank, &async_ns[b]);
    int icalls = self_batches < SELF_BATCHES ? 5 : SELF_ICOUNT_CALLS; /* --smoke: a check that it counts */
    double ins = rc ? 0 : self_icount(rank, "noop", icalls), ins_udf = rc ? 0 : self_icount(rank, "udf_noop", icalls);
    sr_shutdown(true, 60);
    if (rc)
        return fprintf(stderr, "bench_rpc self: %s\n", sr_last_error()), 1;
    bench_lat s = bench_lat_of(sync_ns, self_batches), a = bench_lat_of(async_ns, self_batches);
    /* bench_lat_of sorted the batches: [SELF_BATCHES / 10] is the p10, the
     * least disturbed by other work on the machine (its cache misses, steal) */
    printf("rpc_sync noop self  | one thread, both sides of each call | %.1f ns/call of CPU time (median of %d batches "
           "of %d; p10 %.1f p99 %.1f)", (double)s.p50 / SELF_BATCH, self_batches, SELF_BATCH,
           (double)sync_ns[self_batches / 10] / SELF_BATCH, (double)s.p99 / SELF_BATCH);
    /* A hot round trip runs both halves one after the other: their CPU is
     * a bound on it, against the floor the hot rounds measured. */
    if (sh->hot_floor50 > 0)
        printf(" | %.1fx the hot rounds' cache-line floor (%.0f ns): the least the hot round trip's ratio can be",
               (double)s.p50 / SELF_BATCH / sh->hot_floor50, sh->hot_floor50);
    printf("\n");
    printf("rpc_async noop self | windows of %d, progress thread too | %.1f ns/call of CPU time (p10 %.1f p99 %.1f)\n",
           SELF_WINDOW, (double)a.p50 / SELF_BATCH, (double)async_ns[self_batches / 10] / SELF_BATCH,
           (double)a.p99 / SELF_BATCH);
    printf("rpc_sync noop self  | instructions per call in user mode, one thread, counted by single-stepping %d calls",
           icalls);
    print_icount("built-in noop", ins);
    /* A caller serves no plain call (lib/rpc/agent.h, "Serving waiters"): the
     * UDF runs on an executor, whose instructions this thread's count has not */
    print_icount("UDF noop (caller's thread: the function runs on an executor)", ins_udf);
    printf("\n");
    bench_rec r;
    bench_rec_begin(&r, "rpc noop self");
    if (ins > 0)
        bench_rec_num(&r, "sync_instructions_per_call", ins);
    if (ins_udf > 0)
        bench_rec_num(&r, "udf_sync_instructions_per_call", ins_udf);
    bench_rec_num(&r, "sync_ns_per_call", (double)s.p50 / SELF_BATCH);
    bench_rec_num(&r, "async_ns_per_call", (double)a.p50 / SELF_BATCH);
    bench_rec_emit(&r);
    return 0;
}

/* ---- an entry point's reference, from one thread and from two ---- */

/* Every public call takes a reference to the agent and drops it
 * (lib/rpc/life.c); sr_rank does nothing else. Each thread counts its
 * references on a line of its own, so two threads of one worker calling at
 * once should each pay what one thread pays: the figure is ns a call per
 * thread, the median of `rounds`, with 1 and with 2 threads. */
#define ENTRY_CALLS 2000000
static int entry_calls = ENTRY_CALLS;

static void *entry_loop(void *p)
{
    long sum = 0;
    for (int i = 0; i < entry_calls; i++)
        sum += sr_rank();
    *(long *)p = sum;
    return NULL;
}

/* ns a call per thread, or -1 if a thread could not start. */
static double entry_round(int threads)
{
    pthread_t t[2];
    long sums[2];
    int started = 0;
    int64_t t0 = bench_now_ns();
    while (started < threads && !pthread_create(&t[started], NULL, entry_loop, &sums[started]))
        started++;
    for (int i = 0; i < started; i++)
        pthread_join(t[i], NULL);
    return started == threads ? (double)(bench_now_ns() - t0) / entry_calls : -1;
}

static int run_entry(int rank, int world, void *arg)
{
    (void)rank, (void)world, (void)arg;
    if (sr_init(NULL))
        return 1;
    double one[ROUNDS], two[ROUNDS];
    bool failed = false;
    for (int r = 0; r < rounds; r++) { /* interleaved, so both see the same load */
        one[r] = entry_round(1);
        two[r] = entry_round(2);
        failed |= one[r] < 0 || two[r] < 0;
    }
    sr_shutdown(true, 60);
    if (failed)
        return fprintf(stderr, "bench_rpc entry: pthread_create failed\n"), 1;
    qsort(one, (size_t)rounds, sizeof(double), cmp_double);
    qsort(two, (size_t)rounds, sizeof(double), cmp_double);
    double o = one[rounds / 2], w = two[rounds / 2];
    printf("entry point reference | sr_rank, %d calls a thread | 1 thread %.1f ns a call | 2 threads %.1f ns a call "
           "each (%.2fx one thread; %d CPUs)\n", entry_calls, o, w, w / o, (int)sysconf(_SC_NPROCESSORS_ONLN));
    bench_rec r;
    bench_rec_begin(&r, "entry point reference");
    bench_rec_num(&r, "ns_per_call_1_thread", o);
    bench_rec_num(&r, "ns_per_call_2_threads", w);
    bench_rec_emit(&r);
    return 0;
}

/* ---- N callers -> one callee ---- */

/* Each caller calls for FANIN_WINDOW_NS after a common start (a barrier of
 * the callers); the total is every caller's calls in the window over the
 * window, so a caller that starts late or starves shows in the per-caller
 * minimum and maximum, not in a caller-1-only extrapolation. */
#define FANIN_MAX 8
#define FANIN_WINDOW_NS (400ll * 1000000)
#define FANIN_TARGET 0.7 /* total calls/s of 2, 4 and 8 callers against one caller's */
#define FANIN_SAMPLES 200000
#define FANIN_FLOOR_RTTS 5000 /* futex round trips timed for the bound */
static int64_t fanin_window_ns = FANIN_WINDOW_NS;

struct fanin_caller {
    uint64_t calls, wakes, sleeps; /* wakes: doorbells this caller rang (the callee asleep) */
    int64_t p50, p99;
    int64_t cpu_ns;        /* this caller's process CPU time over its window */
    int64_t callee_cpu_ns; /* rank 1 only: the callee's over rank 1's window ("cpu" before and after) */
};
static struct fanin_caller *fan; /* [FANIN_MAX + 1], shared with the job */
static bench_barrier *fan_bar;

/* The callee's process CPU time, for rank 1's window. */
static int fanin_cpu(sr_call *c) { return sr_call_return(c, sr_int(bench_process_cpu_ns())); }

static int64_t callee_cpu_ns(void)
{
    sr_value *v = NULL;
    int64_t ns = sr_rpc_sync(0, "cpu", SR_NOARGS, 0, &v) ? -1 : sr_value_int(v);
    sr_value_unref(v);
    return ns;
}

static int run_fanin(int rank, int world, void *arg)
{
    (void)arg;
    static int64_t lat[FANIN_SAMPLES];
    sr_register("cpu", fanin_cpu);
    if (sr_init(NULL))
        return 1;
    if (rank > 0) {
        if (sr_rpc_sync(0, "noop", SR_NOARGS, 0, NULL)) /* warm: the path and the rings */
            sh->errors++;
        bench_barrier_wait(fan_bar, (uint32_t)(world - 1), 60ll * 1000000000);
        sr_debug_info d0 = {0}, d1 = {0};
        sr_debug_info_get(&d0);
        int64_t callee0 = rank == 1 ? callee_cpu_ns() : 0, cpu0 = bench_process_cpu_ns();
        int64_t t0 = bench_now_ns(), end = t0 + fanin_window_ns, t = t0;
        uint64_t n = 0;
        while (t < end) {
            if (sr_rpc_sync(0, "noop", SR_NOARGS, 0, NULL))
                sh->errors++;
            int64_t t1 = bench_now_ns();
            if (n < FANIN_SAMPLES)
                lat[n] = t1 - t;
            n++;
            t = t1;
        }
        int64_t cpu = bench_process_cpu_ns() - cpu0, callee = rank == 1 ? callee_cpu_ns() - callee0 : 0;
        sr_debug_info_get(&d1);
        bench_lat l = bench_lat_of(lat, n < FANIN_SAMPLES ? n : FANIN_SAMPLES);
        fan[rank] = (struct fanin_caller){.calls = n, .wakes = d1.wakes_issued - d0.wakes_issued,
                                          .sleeps = d1.sleeps_taken - d0.sleeps_taken, .p50 = l.p50, .p99 = l.p99,
                                          .cpu_ns = cpu, .callee_cpu_ns = callee};
    }
    sr_shutdown(true, 120);
    return 0;
}

static int bench_fanin(void)
{
    static const int all[] = {1, 2, 4, 8}, smoke[] = {1, 4};
    const int *ns = bench_smoke_on() ? smoke : all;
    size_t runs = bench_smoke_on() ? sizeof(smoke) / sizeof(smoke[0]) : sizeof(all) / sizeof(all[0]);
    fan = bench_shared_alloc(sizeof(*fan) * (FANIN_MAX + 1));
    fan_bar = bench_shared_alloc(sizeof(*fan_bar));
    /* The bounds (below): what a sleep and a wake cost the machine in CPU,
     * half a futex round trip of two processes; and what handing a core over
     * by sched_yield costs, which callers that poll by yielding pay instead. */
    double rtt_cpu = 0, yield_ns = 0;
    if (bench_floor_futex_cpu(bench_smoke_on() ? 200 : FANIN_FLOOR_RTTS, &rtt_cpu))
        return fprintf(stderr, "bench_rpc fanin: the futex floor failed\n"), 1;
    if (bench_floor_yield_switch(bench_smoke_on() ? 200 : FANIN_FLOOR_RTTS, &yield_ns))
        return fprintf(stderr, "bench_rpc fanin: the yield floor failed\n"), 1;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    double one = 0, one_cpu = 0;
    for (size_t i = 0; i < runs; i++) {
        memset(fan, 0, sizeof(*fan) * (FANIN_MAX + 1));
        memset(fan_bar, 0, sizeof(*fan_bar));
        sr_spawn_opts o = {.name_prefix = "bench-fanin", .shm_size = (uint64_t)(ns[i] + 1) * (64u << 20)};
        if (sr_spawn(ns[i] + 1, run_fanin, NULL, &o))
            return fprintf(stderr, "bench_rpc fanin: %s\n", sr_last_error()), 1;
        uint64_t total = 0, lo = UINT64_MAX, hi = 0, wakes = 0, sleeps = 0;
        int64_t p50 = 0, p99 = 0, cpu = 0; /* the worst caller's; the callers' CPU */
        for (int r = 1; r <= ns[i]; r++) {
            total += fan[r].calls;
            cpu += fan[r].cpu_ns;
            wakes += fan[r].wakes;
            sleeps += fan[r].sleeps;
            lo = fan[r].calls < lo ? fan[r].calls : lo;
            hi = fan[r].calls > hi ? fan[r].calls : hi;
            p50 = fan[r].p50 > p50 ? fan[r].p50 : p50;
            p99 = fan[r].p99 > p99 ? fan[r].p99 : p99;
        }
        double per_s = (double)total / ((double)fanin_window_ns / 1e9);
        double call_cpu = total ? (double)(cpu + (fan[1].callee_cpu_ns > 0 ? fan[1].callee_cpu_ns : 0)) / (double)total : 0;
        if (ns[i] == 1)
            one = per_s, one_cpu = call_cpu;
        /* More callers than cores left beside the callee's: nobody spins, so
         * each call costs, on top of the call's own CPU (one caller's,
         * spinning), at least a hand-over of a caller's core: a yield
         * (docs/SUBSTRATE.md, section 5) or, for a caller that sleeps, a
         * sleep and a wake-up. The machine's cores over that bound the
         * total: the first with yielding callers, the second with sleeping
         * ones. */
        double bound = ns[i] > 1 && one_cpu > 0 ? (double)ncpu * 1e9 / (one_cpu + yield_ns) : 0;
        double bound_sleep = ns[i] > 1 && one_cpu > 0 ? (double)ncpu * 1e9 / (one_cpu + rtt_cpu / 2) : 0;
        char bound_text[256] = "";
        if (bound > 0)
            snprintf(bound_text, sizeof(bound_text), " | bound %ld cores / (%.2f us + a yield's switch %.2f us) = %.0f "
                     "calls/s = %.2fx one caller (sleeping callers: + a sleep and wake %.2f us = %.2fx)", ncpu,
                     one_cpu / 1e3, yield_ns / 1e3, bound, one > 0 ? bound / one : 0, rtt_cpu / 2e3,
                     one > 0 ? bound_sleep / one : 0);
        char key[32], vs[320];
        snprintf(key, sizeof(key), "fanin%d", ns[i]);
        char verdict[64] = "";
        if (ns[i] > 1 && one > 0)
            snprintf(verdict, sizeof(verdict), " (target >= %.1fx %s)", FANIN_TARGET,
                     bench_verdict(per_s >= FANIN_TARGET * one));
        printf("rpc_sync noop fan-in | %d callers -> 1 | %.0f calls/s total, %.2fx one caller%s | per caller "
               "%llu..%llu calls in %.1f s | worst caller p50 %.2f us p99 %.2f us | per call: %.2f callee wakes, "
               "%.2f caller sleeps | CPU per call: callers %.2f us, callee %.2f us, %.2f cores busy%s | %s\n",
               ns[i], per_s, one > 0 ? per_s / one : 0, verdict, (unsigned long long)lo, (unsigned long long)hi,
               (double)fanin_window_ns / 1e9, (double)p50 / 1e3, (double)p99 / 1e3,
               total ? (double)wakes / (double)total : 0, total ? (double)sleeps / (double)total : 0,
               total ? (double)cpu / (double)total / 1e3 : 0,
               total && fan[1].callee_cpu_ns > 0 ? (double)fan[1].callee_cpu_ns / (double)total / 1e3 : 0,
               (double)(cpu + (fan[1].callee_cpu_ns > 0 ? fan[1].callee_cpu_ns : 0)) / (double)fanin_window_ns,
               bound_text, bench_torch_vs(&pt, key, (double)p50, vs, sizeof(vs)));
        fflush(stdout);
        bench_rec r;
        bench_rec_begin(&r, "rpc_sync noop fan-in");
        bench_rec_num(&r, "callers", ns[i]);
        bench_rec_num(&r, "p50_ns", (double)p50);
        bench_rec_num(&r, "p99_ns", (double)p99);
        bench_rec_num(&r, "per_s", per_s);
        bench_rec_num(&r, "ratio_to_one_caller", one > 0 ? per_s / one : 0);
        if (ns[i] > 1 && one > 0) {
            bench_rec_num(&r, "target_ratio", FANIN_TARGET);
            bench_rec_bool(&r, "target_met", per_s >= FANIN_TARGET * one);
        }
        bench_rec_num(&r, "callers_cpu_ns_per_call", total ? (double)cpu / (double)total : 0);
        bench_rec_num(&r, "callee_cpu_ns_per_call", total ? (double)fan[1].callee_cpu_ns / (double)total : 0);
        if (bound > 0) {
            bench_rec_num(&r, "bound_per_s", bound);
            bench_rec_num(&r, "bound_sleeping_per_s", bound_sleep);
        }
        bench_rec_num(&r, "min_caller_calls", (double)lo);
        bench_rec_num(&r, "max_caller_calls", (double)hi);
        bench_rec_torch(&r, &pt, key);
        bench_rec_emit(&r);
    }
    return 0;
}

/* ---- tensors ---- */

static const int64_t tensor_bytes[] = {4, 4 << 10, 1 << 20, 64 << 20, 256 << 20, 1ll << 30};
#define NSIZES (int)(sizeof(tensor_bytes) / sizeof(tensor_bytes[0]))
static int tensor_sizes = NSIZES; /* the first ones: all, or --smoke's 3 (up to 1 MiB) */
static int tensor_reps = 1;       /* divides the calls per size: 1, or --smoke's 10 */

struct tensor_result {
    bench_lat pass, add;
    double memcpy_ns;
};
static struct tensor_result *tres; /* shared with the job */

static bench_lat time_call(const char *fn, sr_value *a, sr_value *b, int reps)
{
    static int64_t lat[200];
    for (int i = 0; i < reps; i++) {
        sr_value *out = NULL;
        int64_t t0 = bench_now_ns();
        int rc = b ? sr_rpc_sync(1, fn, SR_ARGS(a, b), SR_TIMEOUT_NONE, &out) : sr_rpc_sync(1, fn, SR_ARGS(a), SR_TIMEOUT_NONE, &out);
        lat[i] = bench_now_ns() - t0;
        if (rc)
            sh->errors++, fprintf(stderr, "%s: %s\n", fn, sr_last_error());
        sr_value_unref(out);
    }
    return bench_lat_of(lat, (size_t)reps);
}

/* rank 0 passes tensors to rank 1: "echo" hands the argument back (the round
 * trip of a tensor, zero-copy both ways); "add" computes x + x on the callee. */
static int run_tensor(int rank, int world, void *arg)
{
    (void)world;
    (void)arg;
    if (sr_init(NULL))
        return 1;
    /* All the echoes first: freeing an add's large result gives its pages
     * back on the owner's poller (MADV_REMOVE, milliseconds per 64 MiB), which
     * would land inside the next size's echoes. */
    for (int pass = 0; rank == 0 && pass < 2; pass++)
        for (int i = 0; i < tensor_sizes; i++) {
            if (pass == 1 && tensor_bytes[i] > (256 << 20))
                continue;
            int64_t n = tensor_bytes[i] / 4;
            sr_tensor *t = sr_ones(SR_F32, 1, &n, 0);
            if (!t)
                return fprintf(stderr, "tensor of %lld bytes: %s\n", (long long)tensor_bytes[i], sr_last_error()), 1;
            sr_value *v = sr_value_from_tensor(t);
            if (pass == 0) {
                time_call("echo", v, NULL, 10 / tensor_reps);
                tres[i].pass = time_call("echo", v, NULL, (tensor_bytes[i] >= (64 << 20) ? 20 : 200) / tensor_reps);
            } else {
                tres[i].add = time_call("add", v, v, tensor_bytes[i] >= (64 << 20) ? 3 : 50 / tensor_reps);
            }
            sr_value_unref(v);
            sr_tensor_unref(t);
        }
    sr_shutdown(true, 120);
    return 0;
}

static int bench_tensor(void)
{
    tres = bench_shared_alloc(sizeof(*tres) * NSIZES);
    sr_spawn_opts o = {.name_prefix = "bench-tensor", .shm_size = tensor_sizes == NSIZES ? 5ull << 30 : 0};
    if (!tres || sr_spawn(2, run_tensor, NULL, &o))
        return fprintf(stderr, "bench_rpc tensor: %s\n", sr_last_error()), 1;
    double base = (double)tres[0].pass.p50;
    for (int i = 0; i < tensor_sizes; i++) {
        double gibs = bench_floor_memcpy_gibs((size_t)tensor_bytes[i], tensor_bytes[i] >= (256 << 20) ? 2 : 5);
        double memcpy_ns = (double)tensor_bytes[i] / (gibs * (1u << 30)) * 1e9;
        double ratio = (double)tres[i].pass.p50 / base;
        printf("rpc_sync echo tensor %11lld B | round trip p50 %9.2f us p99 %9.2f us | vs 4 B %.2fx%s | "
               "memcpy of the same size %10.1f us\n",
               (long long)tensor_bytes[i], (double)tres[i].pass.p50 / 1e3, (double)tres[i].pass.p99 / 1e3, ratio,
               tensor_bytes[i] == (256 << 20) ? (ratio <= 1.2 ? " (target <= 1.2x met)" : " (target <= 1.2x NOT met)") : "",
               memcpy_ns / 1e3);
        bench_rec r;
        bench_rec_begin(&r, "rpc_sync echo tensor");
        bench_rec_num(&r, "bytes", (double)tensor_bytes[i]);
        bench_rec_num(&r, "p50_ns", (double)tres[i].pass.p50);
        bench_rec_num(&r, "p99_ns", (double)tres[i].pass.p99);
        bench_rec_num(&r, "ratio_p50_4B", ratio);
        bench_rec_num(&r, "memcpy_ns", memcpy_ns);
        bench_rec_emit(&r);
        if (tres[i].add.p50) {
            char key[32], vs[320];
            snprintf(key, sizeof(key), "tensor%lld", (long long)tensor_bytes[i]);
            printf("rpc_sync add tensor %12lld B | p50 %12.0f ns (computes x + x on the callee) | %s\n",
                   (long long)tensor_bytes[i], (double)tres[i].add.p50,
                   bench_torch_vs(&pt, key, (double)tres[i].add.p50, vs, sizeof(vs)));
            bench_rec_begin(&r, "rpc_sync add tensor");
            bench_rec_num(&r, "bytes", (double)tensor_bytes[i]);
            bench_rec_num(&r, "p50_ns", (double)tres[i].add.p50);
            bench_rec_num(&r, "p99_ns", (double)tres[i].add.p99);
            bench_rec_torch(&r, &pt, key);
            bench_rec_emit(&r);
        }
    }
    return 0;
}

/* ---- executor pool size ---- */

/* A plain function (runs on the executor pool when the callee is busy): a
 * short computation and, for a quarter of the calls, a 1 ms block (I/O). */
static int work_fn(sr_call *c)
{
    int64_t x = sr_value_int(sr_call_arg(c, 0));
    volatile double acc = 0;
    for (int i = 0; i < 2000; i++)
        acc += (double)i * (double)x;
    if (x % 4 == 0) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return sr_call_return(c, sr_int(x));
}

static int exec_calls = 100; /* per caller thread; --smoke: 10 */

struct exec_arg {
    int threads;
    double secs[4];
};

static void *exec_caller(void *p)
{
    int rank = sr_rank(), world = sr_world_size();
    for (int i = 0; i < exec_calls; i++) {
        sr_value *x = sr_int(i + (intptr_t)p), *v = NULL;
        if (sr_rpc_sync((rank + 1 + i) % world, "work", SR_ARGS(x), 0, &v) || sr_value_int(v) != i + (intptr_t)p)
            sh->errors++;
        sr_value_unref(v);
        sr_value_unref(x);
    }
    return NULL;
}

static int run_exec(int rank, int world, void *arg)
{
    (void)world;
    struct exec_arg *e = arg;
    sr_register("work", work_fn);
    sr_init_opts o = {.num_worker_threads = e->threads};
    if (sr_init(&o))
        return 1;
    pthread_t th[8];
    int64_t t0 = bench_now_ns();
    for (intptr_t i = 0; i < 8; i++)
        pthread_create(&th[i], NULL, exec_caller, (void *)(i * 1000));
    for (int i = 0; i < 8; i++)
        pthread_join(th[i], NULL);
    e->secs[rank] = (double)(bench_now_ns() - t0) / 1e9;
    sr_shutdown(true, 120);
    return 0;
}

static int bench_executors(void)
{
    static const int all[] = {1, 2, 4, 8, 16}, smoke[] = {1, 16};
    const int *counts = bench_smoke_on() ? smoke : all;
    size_t runs = bench_smoke_on() ? sizeof(smoke) / sizeof(smoke[0]) : sizeof(all) / sizeof(all[0]);
    double calls_all = 4 * 8 * exec_calls;
    struct exec_arg *e = bench_shared_alloc(sizeof(*e));
    for (size_t i = 0; e && i < runs; i++) {
        e->threads = counts[i];
        sr_spawn_opts o = {.name_prefix = "bench-exec", .shm_size = 4u * (64u << 20)};
        if (sr_spawn(4, run_exec, e, &o))
            return fprintf(stderr, "bench_rpc executors: %s\n", sr_last_error()), 1;
        double worst = 0;
        for (int r = 0; r < 4; r++)
            worst = e->secs[r] > worst ? e->secs[r] : worst;
        printf("rpc_sync plain fn, 4 workers x 8 caller threads x %d calls (1/4 block 1 ms) | %2d executors | "
               "%.0f calls/s\n", exec_calls, counts[i], calls_all / worst);
        fflush(stdout);
        bench_rec r;
        bench_rec_begin(&r, "rpc_sync plain fn, 4 workers x 8 caller threads, 1/4 block 1 ms");
        bench_rec_num(&r, "executors", counts[i]);
        bench_rec_num(&r, "per_s", calls_all / worst);
        bench_rec_emit(&r);
    }
    return 0;
}

static bench_cli cli = {
    .prog = "bench_rpc",
    .names = {"hot", "udf", "asleep", "pipeline", "self", "entry", "fanin", "tensor", "executors", "probes"},
    .flags = {"--no-torch"},
    .usage = "  --no-torch  skip PyTorch (bench/compare/torch_rpc.py, run first otherwise)",
    .smoke_what = "1 round of 200 calls per workload, sizes up to 1 MiB, fewer callers and pools",
};

/* --smoke: every workload with tiny counts. */
static void smoke_counts(void)
{
    rounds = 1, calls = 200, cl_n = 200, fx_n = 50, warm = 100;
    pipe_calls = 4096, ring_msgs = 2000, self_batches = 8;
    fanin_window_ns = 20ll * 1000000;
    tensor_sizes = 3, tensor_reps = 10;
    exec_calls = 10;
    entry_calls = 20000;
    bench_probe_smoke();
}

static bool want(const char *what) { return bench_cli_wants(&cli, what); }

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "probe-one")) /* a child of "probes" */
        return bench_probe_one(argc == 3 && !strcmp(argv[2], "--smoke"));
    bench_cli_parse(&cli, argc, argv);
    if (cli.smoke)
        smoke_counts();
    sh = bench_shared_alloc(sizeof(*sh));
    if (!sh)
        return 1;
    /* PyTorch first, in this run: its processes are gone before ours start. */
    if (want("hot") || want("udf") || want("asleep") || want("pipeline") || want("fanin") || want("tensor")) {
        char args[64];
        snprintf(args, sizeof(args), "%s%s", getenv("BENCH_TORCH_QUICK") ? "--quick " : "",
                 want("fanin") ? "" : "--no-fanin");
        bench_torch_run(&pt, BENCH_COMPARE_DIR "/torch_rpc.py", args,
                        cli.flag[0] ? "--no-torch" : getenv("BENCH_NO_TORCH") ? "BENCH_NO_TORCH set" : NULL);
    }
    if (pt.measured)
        printf("# bench_rpc: %d rounds; PyTorch %s figures measured in this run (bench/compare/torch_rpc.py)\n",
               rounds, pt.version[0] ? pt.version : "?");
    else
        printf("# bench_rpc: %d rounds; PyTorch not measured: %s\n", rounds, pt.why[0] ? pt.why : "no workload needs it");
    int rc = bench_hot_and_asleep(want("hot"), want("asleep"));
    if (!rc && want("udf"))
        rc = bench_udf();
    if (!rc && want("pipeline")) {
        sr_spawn_opts o = {.name_prefix = "bench-pipe", .shm_size = 512u << 20};
        sh->ring_rounds = 0;
        rc = sr_spawn(2, ring_worker, NULL, &o) ? 1 : 0;
        if (!rc)
            rc = sr_spawn(2, run_pipeline, NULL, &o) ? 1 : 0;
    }
    if (!rc && want("self")) {
        sr_spawn_opts o = {.name_prefix = "bench-self", .shm_size = 512u << 20};
        rc = sr_spawn(1, run_self, NULL, &o) ? 1 : 0;
    }
    if (!rc && want("entry")) {
        sr_spawn_opts o = {.name_prefix = "bench-entry", .shm_size = 64u << 20};
        rc = sr_spawn(1, run_entry, NULL, &o) ? 1 : 0;
    }
    if (!rc && want("fanin"))
        rc = bench_fanin();
    if (!rc && want("tensor"))
        rc = bench_tensor();
    if (!rc && want("executors"))
        rc = bench_executors();
    if (!rc && want("probes"))
        rc = bench_probe_cost("/proc/self/exe");
    if (sh->errors)
        fprintf(stderr, "bench_rpc: %d calls failed\n", sh->errors);
    return rc || sh->errors ? 1 : 0;
}
