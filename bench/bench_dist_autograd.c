/* SPDX-License-Identifier: MIT */
/* Distributed autograd benchmarks, each printed next to a reference measured
 * in the same rounds of the same run, and next to PyTorch's figure, measured
 * in the same run too: bench/compare/torch_dist_autograd.py is spawned first
 * and its "torch-da <workload> p50_ns N p99_ns N n N" lines are read back.
 *
 *   bench_dist_autograd [step] [chain] [contexts] [shutdown] [future] [away]
 *
 * (default: every workload, callees waiting each of the three ways; see Method).
 *
 *   step      the example of PyTorch's distributed autograd design note
 *             (seed 002), one training step per context: begin; t1, t2 =
 *             rand(3, 3, requires grad); t3 = rpc_sync(1, my_add, t1, t2);
 *             t4 = rand(3, 3, requires grad); t5 = t3 * t4; loss = sum(t5);
 *             backward(ctx, [loss]); get_gradients; end. Reference: the
 *             rpc_sync(my_add) it makes, outside any context. my_add is a
 *             registered plain function, as PyTorch's is a Python UDF; the
 *             same step with the built-in "add" (PyTorch: torch.add) and
 *             the step computed locally (sr_backward, no RPC) are printed
 *             for reference. Target (docs/PERFORMANCE.md): >= 50x faster
 *             than PyTorch's step.
 *   chain     4 workers: rank 0 computes x * W0 and calls chain on rank 1,
 *             which multiplies by its W1 and calls rank 2, ... rank 3
 *             returns; rank 0 sums, runs the backward (through 3 more
 *             workers) and reads its gradient. Reference: the same nested
 *             calls outside any context. Target: >= 50x faster than
 *             PyTorch's chain. Floor: CHAIN_HOPS (the reference:
 *             CHAIN_FWD_HOPS) sequential hops, each at least one cache
 *             line crossing cores (half the cache-line ping-pong round
 *             trip): no hop can cost less, whoever waits and however.
 *             Beside it, for reference and not a bound, the same hops at
 *             half the futex ping-pong round trip: what the chain would
 *             cost if every hop woke a sleeping worker. With four workers
 *             on fewer cores nobody spins (docs/SUBSTRATE.md), but a waiter
 *             polls by yielding its core before it sleeps (lib/rpc/wait.c),
 *             so most hops wake nobody and the chain runs below it. Both
 *             ping-pongs run between ranks 0 and 1 at the start of each
 *             job (bench/floor.h) while ranks 2 and 3 wait.
 *   contexts  sr_dist_autograd_context_begin + _end pairs per second, 16
 *             threads of one worker, with the context map sharded (the
 *             default) and with one lock (sr__dist_autograd_set_shards(1),
 *             a knob of the implementation, set before sr_init). One thread
 *             is printed for reference.
 *
 * --no-torch or BENCH_NO_TORCH=1 skips PyTorch (the lines then say why there
 * is no PyTorch figure, as they do without python3-torch: "torch not
 * installed"; --json: bench_util.h). BENCH_TORCH_QUICK=1 runs it
 * with fewer iterations; BENCH_PYTHON names the interpreter (default
 * /usr/bin/python3, Debian's, which has torch); BENCH_STRICT=1 exits 1 when
 * the 50x target is missed. Any failed call, wrong gradient or context left
 * alive exits 1.
 *
 * Method: the callees sit in sr_shutdown (as PyTorch's sit in
 * rpc.shutdown()), where they poll their inbox and run plain functions on
 * their own thread, or wait in sr_future_wait, where they serve the same
 * way (a serving waiter, lib/rpc/agent.h), or block in sem_wait, outside
 * the runtime, where their progress thread serves (the regime of a pipeline
 * stage whose main thread computes or joins: agent.h, "The progress thread
 * serves"; the chain's middle workers then call onwards from a function run
 * on that thread); each is its own line. 7
 * rounds; each round times the reference and then ours; lines report the
 * medians over rounds of p50 and p99, and the median of per-round ratios.
 * The step's forward and context end are also timed alone, so the lines
 * show what the backward costs; "rank 0 per call" is sr_debug_info over
 * the last round (messages sent, doorbell wake-ups issued, sleeps taken).
 * Gradients are checked against the closed form before timing, and their
 * count in every timed step.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "bench_util.h"
#include "floor.h"
#include "shmrpc/dist_autograd.h"
#include "shmrpc/shmrpc.h"

#ifndef BENCH_COMPARE_DIR
#define BENCH_COMPARE_DIR "bench/compare"
#endif

/* The implementation's test and bench knob: the number of shards of the
 * context map, set before sr_init (1 = one lock). */
extern void sr__dist_autograd_set_shards(unsigned n);

#define TARGET_X 50.0

#define ROUNDS 7
#define STEP_N 1500
#define STEP_WARM 300
#define CHAIN_N 500
#define CHAIN_WARM 100
#define CTX_ROUNDS 5
#define CTX_THREADS 16
#define CTX_SAMPLE 8 /* time one begin+end pair in 8 (the clock costs about what a pair does) */
/* The counts, or --smoke's (main): a smoke run's figures are not measurements. */
static int rounds = ROUNDS, step_n = STEP_N, step_warm = STEP_WARM, chain_n = CHAIN_N, chain_warm = CHAIN_WARM;
static int ctx_rounds = CTX_ROUNDS, ctx_div = 1; /* ctx_div divides each configuration's pairs */

enum { W_RPC, W_STEP, W_STEP_ADD, W_FWD, W_LOCAL, W_CHAIN_FWD, W_CHAIN, NWORK };
static const char *const wname[NWORK] = {"rpc", "step", "step_add", "fwd", "local", "chain_fwd", "chain"};

/* Where the callees wait while rank 0 measures. */
enum { IDLE_SHUTDOWN, IDLE_FUTURE, IDLE_AWAY, NMODE };
static const char *const mode_name[NMODE] = {"callees in sr_shutdown", "callees in sr_future_wait",
                                             "callees away (sem_wait)"};

enum { C_SHARDED, C_ONE_LOCK, C_ONE_THREAD, NCFG };
static const struct ctx_cfg {
    const char *label;
    unsigned threads, shards; /* shards 0: the implementation's default */
    int pairs;                /* per thread */
} ctx_cfgs[NCFG] = {
    {"16 threads, sharded map (default)", CTX_THREADS, 0, 100000},
    {"16 threads, one lock (shards = 1)", CTX_THREADS, 1, 100000},
    {"1 thread, sharded map (reference)", 1, 0, 1000000},
};

struct ctx_result {
    double per_s;
    bench_lat pair;
};

/* The chain's sequential hops, each a message to another worker. The
 * nested calls: 0 -> 1 -> 2 -> 3 and the answers back, 6. The backward
 * (Dijkstra-Scholten, lib/modules/dist_autograd/backward.c): the gradient
 * 0 -> 1 -> 2 -> 3, then each worker's answer ending its part of the pass,
 * carrying the gradients of the request that engaged it ("Up"), 3 -> 2 ->
 * 1 -> 0: 6. */
#define CHAIN_FWD_HOPS 6
#define CHAIN_HOPS (CHAIN_FWD_HOPS + 6)
#define FUTEX_FLOOR_N 2000 /* futex round trips per job */
#define LINE_FLOOR_N 20000 /* cache-line round trips per job */

struct shared {
    bench_barrier bar;
    bench_floor_area floor;
    bench_lat futex[NMODE]; /* the futex ping-pong round trip, ranks 0 and 1, per job */
    bench_lat line[NMODE];  /* the cache-line ping-pong round trip, the same */
    bench_lat lat[NMODE][NWORK][ROUNDS];
    bool ran[NMODE][NWORK];
    struct ctx_result ctx[NCFG][CTX_ROUNDS];
    _Atomic int errors;
    int failed[NMODE][NWORK]; /* timed calls that failed, by workload */
    double per_op[NMODE][NWORK][3]; /* rank 0, last round: messages sent, wakes issued, sleeps taken per call */
    char first_error[512];
};

static struct shared *sh;

/* Count an error; the first one's text is kept. The context threads may
 * fail at once: relaxed, only the count matters, and only the first to
 * count writes the text. */
static void fail(const char *what, int rc)
{
    if (!atomic_fetch_add_explicit(&sh->errors, 1, memory_order_relaxed))
        snprintf(sh->first_error, sizeof(sh->first_error), "rank %d: %s: %s (%s)", sr_rank(), what,
                 sr_last_error(), sr_strerror(rc));
}

/* ---- functions the callees run ---- */

static sr_tensor *W;        /* this worker's parameter in the chain */
static int mode;            /* this job's IDLE_* */
static sr_future *done_fut; /* IDLE_FUTURE callees: completed by rank 0's "done" */
static sem_t done_sem;      /* IDLE_AWAY callees: posted by the same */

static int fn_done(sr_call *c)
{
    sr_future_set_result(done_fut, NULL);
    sem_post(&done_sem);
    return sr_call_return(c, NULL);
}

static int return_tensor(sr_call *c, sr_tensor *t)
{
    if (!t)
        return sr_call_fail(c, -EINVAL, "%s", sr_last_error());
    sr_value *v = sr_value_from_tensor(t);
    sr_tensor_unref(t);
    if (!v)
        return sr_call_fail(c, -ENOMEM, "%s", sr_last_error());
    return sr_call_return(c, v);
}

/* The seed's def my_add(t1, t2): return torch.add(t1, t2) */
static int fn_my_add(sr_call *c)
{
    sr_tensor *a = sr_value_tensor(sr_call_arg(c, 0)), *b = sr_value_tensor(sr_call_arg(c, 1));
    if (!a || !b)
        return sr_call_fail(c, -EINVAL, "my_add: takes two tensors");
    return return_tensor(c, sr_add(a, b));
}

/* chain(x): x * W here, then on to the next rank; the last rank returns. */
static int fn_chain(sr_call *c)
{
    sr_tensor *x = sr_value_tensor(sr_call_arg(c, 0));
    if (!x)
        return sr_call_fail(c, -EINVAL, "chain: takes a tensor");
    sr_tensor *y = sr_mul(x, W);
    int me = sr_rank();
    if (!y || me == sr_world_size() - 1)
        return return_tensor(c, y);
    sr_value *v = sr_value_from_tensor(y), *out = NULL;
    sr_tensor_unref(y);
    int rc = v ? sr_rpc_sync(me + 1, "chain", SR_ARGS(v), 0, &out) : -ENOMEM;
    sr_value_unref(v);
    if (rc)
        return sr_call_fail(c, rc, "%s", sr_last_error());
    return sr_call_return(c, out);
}

static int fn_param(sr_call *c)
{
    return sr_call_return(c, sr_value_from_tensor(W));
}

/* drop_w(): rank 0, done, has the callees let their W go, even those
 * serving from sr_shutdown, so that the leak check at its end finds none. */
static int fn_drop_w(sr_call *c)
{
    sr_tensor_unref(W);
    W = NULL;
    return sr_call_return(c, NULL);
}

/* Contexts alive on this worker. */
static int fn_contexts(sr_call *c)
{
    sr_dist_autograd_debug_info d = {0};
    int rc = sr_dist_autograd_debug_info_get(&d);
    return rc ? sr_call_fail(c, rc, "%s", sr_last_error()) : sr_call_return(c, sr_int((int64_t)d.num_autograd_contexts));
}

/* ---- checks ---- */

static bool close_to(const sr_tensor *t, const double *want, size_t n)
{
    double got[16];
    if (sr_tensor_numel(t) != n || n > 16 || sr_tensor_to_f64(t, got, n))
        return false;
    for (size_t i = 0; i < n; i++)
        if (fabs(got[i] - want[i]) > 1e-5 * (1 + fabs(want[i])))
            return false;
    return true;
}

static bool same_leaf(const sr_tensor *a, const sr_tensor *b)
{
    return a == b || sr_tensor_shares_storage(a, b);
}

/* ---- the seed-002 step, its reference and its local twin ---- */

static const int64_t shape33[2] = {3, 3};

/* The call the step makes, outside any context. */
static int rpc_once(const char *fn)
{
    sr_tensor *t1 = sr_rand(SR_F32, 2, shape33, SR_REQUIRES_GRAD), *t2 = sr_rand(SR_F32, 2, shape33, SR_REQUIRES_GRAD);
    sr_value *a = sr_value_from_tensor(t1), *b = sr_value_from_tensor(t2), *out = NULL;
    int rc = a && b ? sr_rpc_sync(1, fn, SR_ARGS(a, b), 0, &out) : -ENOMEM;
    if (rc)
        fail("rpc_sync(my_add)", rc);
    sr_value_unref(out);
    sr_value_unref(a);
    sr_value_unref(b);
    sr_tensor_unref(t1);
    sr_tensor_unref(t2);
    return rc;
}

/* One step in a fresh context. check: compare the gradients with the closed
 * form (t1, t2 -> t4; t4 -> t3 = t1 + t2). backward false: the forward and
 * the context's end only (where the step's time goes). */
static int step_once(const char *fn, bool check, bool backward)
{
    int64_t ctx;
    int rc = sr_dist_autograd_context_begin(&ctx);
    if (rc)
        return fail("context_begin", rc), rc;
    sr_tensor *t1 = sr_rand(SR_F32, 2, shape33, SR_REQUIRES_GRAD), *t2 = sr_rand(SR_F32, 2, shape33, SR_REQUIRES_GRAD);
    sr_tensor *t4 = NULL, *t5 = NULL, *loss = NULL, **ts = NULL, **gs = NULL;
    sr_value *a = sr_value_from_tensor(t1), *b = sr_value_from_tensor(t2), *out = NULL;
    size_t n = 0;
    const char *what = "rpc_sync";
    rc = a && b ? sr_rpc_sync(1, fn, SR_ARGS(a, b), 0, &out) : -ENOMEM;
    if (!rc) {
        what = "forward";
        t4 = sr_rand(SR_F32, 2, shape33, SR_REQUIRES_GRAD);
        t5 = sr_mul(sr_value_tensor(out), t4);
        loss = sr_sum(t5);
        rc = loss ? 0 : -EINVAL;
    }
    if (!rc && backward) {
        what = "backward";
        rc = sr_dist_autograd_backward(ctx, &loss, 1, false);
    }
    if (!rc && backward) {
        what = "get_gradients";
        rc = sr_dist_autograd_get_gradients(ctx, &n, &ts, &gs);
    }
    if (!rc && backward && n != 3) {
        what = "get_gradients: not 3 gradients";
        rc = sr_errorf(-EINVAL, "%zu gradients", n);
    }
    if (!rc && check) {
        double v1[9], v2[9], v3[9], v4[9];
        sr_tensor_to_f64(t1, v1, 9);
        sr_tensor_to_f64(t2, v2, 9);
        sr_tensor_to_f64(t4, v4, 9);
        for (int i = 0; i < 9; i++)
            v3[i] = v1[i] + v2[i];
        int found = 0;
        for (size_t i = 0; i < n && !rc; i++) {
            bool is12 = same_leaf(ts[i], t1) || same_leaf(ts[i], t2), is4 = same_leaf(ts[i], t4);
            found += is12 || is4;
            if ((is12 && !close_to(gs[i], v4, 9)) || (is4 && !close_to(gs[i], v3, 9)))
                rc = sr_errorf(-EINVAL, "gradient %zu differs from the closed form", i);
        }
        if (!rc && found != 3)
            rc = sr_errorf(-EINVAL, "gradients are not for t1, t2 and t4");
        what = "gradient check";
    }
    if (rc)
        fail(what, rc);
    sr_dist_autograd_gradients_free(n, ts, gs);
    sr_value_unref(out);
    sr_value_unref(a);
    sr_value_unref(b);
    sr_tensor_unref(loss);
    sr_tensor_unref(t5);
    sr_tensor_unref(t4);
    sr_tensor_unref(t1);
    sr_tensor_unref(t2);
    int rc2 = sr_dist_autograd_context_end(ctx);
    if (rc2)
        fail("context_end", rc2);
    return rc ? rc : rc2;
}

/* The same step in one process: sr_add, sr_mul, sr_sum, sr_backward into .grad. */
static int local_once(void)
{
    sr_tensor *t1 = sr_rand(SR_F32, 2, shape33, SR_REQUIRES_GRAD), *t2 = sr_rand(SR_F32, 2, shape33, SR_REQUIRES_GRAD);
    sr_tensor *t3 = sr_add(t1, t2), *t4 = sr_rand(SR_F32, 2, shape33, SR_REQUIRES_GRAD);
    sr_tensor *t5 = sr_mul(t3, t4), *loss = sr_sum(t5);
    int rc = loss ? sr_backward(loss, false) : -EINVAL;
    if (!rc && (!sr_tensor_grad(t1) || !sr_tensor_grad(t2) || !sr_tensor_grad(t4)))
        rc = sr_errorf(-EINVAL, "a leaf has no gradient");
    if (rc)
        fail("local step", rc);
    sr_tensor *all[] = {loss, t5, t4, t3, t2, t1};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        sr_tensor_unref(all[i]);
    return rc;
}

/* ---- the 4-worker chain ---- */

static sr_tensor *X; /* rank 0's input */

static int chain_fwd_once(void)
{
    sr_tensor *y = sr_mul(X, W);
    sr_value *v = y ? sr_value_from_tensor(y) : NULL, *out = NULL;
    int rc = v ? sr_rpc_sync(1, "chain", SR_ARGS(v), 0, &out) : -ENOMEM;
    if (rc)
        fail("chain forward", rc);
    sr_value_unref(out);
    sr_value_unref(v);
    sr_tensor_unref(y);
    return rc;
}

/* want: the closed-form gradient of W0 (x * W1 * W2 * W3), or NULL. */
static int chain_once(const double *want)
{
    int64_t ctx;
    int rc = sr_dist_autograd_context_begin(&ctx);
    if (rc)
        return fail("context_begin", rc), rc;
    sr_tensor *y = sr_mul(X, W), *loss = NULL, **ts = NULL, **gs = NULL;
    sr_value *v = y ? sr_value_from_tensor(y) : NULL, *out = NULL;
    size_t n = 0;
    const char *what = "chain rpc_sync";
    rc = v ? sr_rpc_sync(1, "chain", SR_ARGS(v), 0, &out) : -ENOMEM;
    if (!rc) {
        what = "backward";
        loss = sr_sum(sr_value_tensor(out));
        rc = loss ? sr_dist_autograd_backward(ctx, &loss, 1, false) : -EINVAL;
    }
    if (!rc) {
        what = "get_gradients";
        rc = sr_dist_autograd_get_gradients(ctx, &n, &ts, &gs);
    }
    if (!rc && (n != 1 || !same_leaf(ts[0], W))) {
        what = "get_gradients: not W0's gradient alone";
        rc = sr_errorf(-EINVAL, "%zu gradients", n);
    }
    if (!rc && want && !close_to(gs[0], want, 9)) {
        what = "gradient check";
        rc = sr_errorf(-EINVAL, "W0's gradient differs from x * W1 * W2 * W3");
    }
    if (rc)
        fail(what, rc);
    sr_dist_autograd_gradients_free(n, ts, gs);
    sr_tensor_unref(loss);
    sr_value_unref(out);
    sr_value_unref(v);
    sr_tensor_unref(y);
    int rc2 = sr_dist_autograd_context_end(ctx);
    if (rc2)
        fail("context_end", rc2);
    return rc ? rc : rc2;
}

/* The closed form needs the other workers' parameters: fetched outside any context. */
static int chain_expected(double *want)
{
    double w[9];
    if (sr_tensor_to_f64(X, want, 9))
        return -EINVAL;
    for (int k = 1; k < sr_world_size(); k++) {
        sr_value *p = NULL;
        int rc = sr_rpc_sync(k, "param", SR_NOARGS, 0, &p);
        if (rc || sr_tensor_to_f64(sr_value_tensor(p), w, 9))
            return sr_value_unref(p), fail("param", rc), -EINVAL;
        sr_value_unref(p);
        for (int i = 0; i < 9; i++)
            want[i] *= w[i];
    }
    return 0;
}

/* ---- drivers ---- */

static int once(int w)
{
    switch (w) {
    case W_RPC: return rpc_once("my_add");
    case W_STEP: return step_once("my_add", false, true);
    case W_STEP_ADD: return step_once("add", false, true);
    case W_FWD: return step_once("my_add", false, false);
    case W_LOCAL: return local_once();
    case W_CHAIN_FWD: return chain_fwd_once();
    case W_CHAIN: return chain_once(NULL);
    }
    return -EINVAL;
}

static void measure(const int *ws, int nw, int n, int warm)
{
    static int64_t lat[STEP_N > CHAIN_N ? STEP_N : CHAIN_N];
    for (int i = 0; i < nw; i++)
        for (int k = 0; k < warm; k++)
            once(ws[i]);
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < nw; i++) {
            sr_debug_info d0 = {0}, d1 = {0};
            sr_debug_info_get(&d0);
            for (int k = 0; k < n; k++) {
                int64_t t0 = bench_now_ns();
                sh->failed[mode][ws[i]] += once(ws[i]) != 0;
                lat[k] = bench_now_ns() - t0;
            }
            sr_debug_info_get(&d1);
            double *po = sh->per_op[mode][ws[i]];
            po[0] = (double)(d1.messages_sent - d0.messages_sent) / n;
            po[1] = (double)(d1.wakes_issued - d0.wakes_issued) / n;
            po[2] = (double)(d1.sleeps_taken - d0.sleeps_taken) / n;
            sh->lat[mode][ws[i]][r] = bench_lat_of(lat, (size_t)n);
            sh->ran[mode][ws[i]] = true;
        }
}

static void drive_step(void)
{
    static const int ws[] = {W_RPC, W_STEP, W_STEP_ADD, W_FWD, W_LOCAL};
    if (step_once("my_add", true, true) || step_once("add", true, true))
        return;
    measure(ws, 5, step_n, step_warm);
}

static void drive_chain(void)
{
    static const int ws[] = {W_CHAIN_FWD, W_CHAIN};
    double want[9];
    X = sr_rand(SR_F32, 2, shape33, 0);
    if (!X || chain_expected(want) || chain_once(want))
        return;
    measure(ws, 2, chain_n, chain_warm);
    sr_tensor_unref(X);
}

/* Contexts still alive on a worker, after giving cleanups in flight up to 2 s. */
static int64_t contexts_left(int rank)
{
    int64_t n = -1;
    for (int i = 0; i < 200 && n; i++) {
        sr_value *v = NULL;
        if (i)
            usleep(10000);
        if (sr_rpc_sync(rank, "contexts", SR_NOARGS, 0, &v))
            return fail("contexts", -EIO), -1;
        n = sr_value_int(v);
        sr_value_unref(v);
    }
    return n;
}

struct job_arg {
    bool chain; /* else the step */
    int mode;
};

/* The chain's floor and its sleeping reference (CHAIN_HOPS): ranks 0 and
 * 1 ping-pong through a cache line, then through a futex, each a warm-up
 * and then LINE_FLOOR_N or FUTEX_FLOOR_N timed round trips (a tenth in a
 * smoke run), while ranks 2 and 3 wait. 0, or -ETIMEDOUT. */
static int hop_floors(int rank)
{
    static int64_t rtt[LINE_FLOOR_N > FUTEX_FLOOR_N ? LINE_FLOOR_N : FUTEX_FLOOR_N];
    uint32_t n_line = bench_smoke_on() ? LINE_FLOOR_N / 10 : LINE_FLOOR_N;
    uint32_t n_futex = bench_smoke_on() ? FUTEX_FLOOR_N / 10 : FUTEX_FLOOR_N;
    enum bench_role role = rank ? BENCH_ECHO : BENCH_INITIATOR;
    int rc = bench_floor_cacheline(&sh->floor, role, n_line / 10, rtt); /* warm-up */
    if (!rc)
        rc = bench_floor_cacheline(&sh->floor, role, n_line, rtt);
    if (!rc && rank == 0)
        sh->line[mode] = bench_lat_of(rtt, n_line);
    if (!rc)
        rc = bench_floor_futex(&sh->floor, role, n_futex / 10, rtt); /* warm-up */
    if (!rc)
        rc = bench_floor_futex(&sh->floor, role, n_futex, rtt);
    if (!rc && rank == 0)
        sh->futex[mode] = bench_lat_of(rtt, n_futex);
    return rc;
}

/* Rank 0 drives. The others serve either from sr_shutdown, as PyTorch's
 * callees do from rpc.shutdown() in bench/compare (idle there, a worker
 * keeps its inbox and runs a plain function on its own thread), or while
 * waiting in sr_future_wait (a serving waiter: it runs what its polling
 * finds itself, as the idle thread does; before, each plain function and
 * backward job went to an executor, and each hop cost a wake-up). */
static int job(int rank, int world, void *arg)
{
    const struct job_arg *ja = arg;
    bool chain = ja->chain;
    mode = ja->mode;
    sr_manual_seed((uint64_t)rank + 1);
    done_fut = sr_future_new();
    if (!done_fut || sem_init(&done_sem, 0, 0) || sr_register("my_add", fn_my_add) ||
        sr_register("chain", fn_chain) || sr_register("param", fn_param) || sr_register("contexts", fn_contexts) ||
        sr_register("done", fn_done) || sr_register("drop_w", fn_drop_w) || sr_init(NULL))
        return fprintf(stderr, "rank %d: %s\n", rank, sr_last_error()), 1;
    /* Tensors that travel must live in the shared heap, attached by sr_init;
     * nobody calls chain or param before every W exists. */
    W = sr_rand(SR_F32, 2, shape33, SR_REQUIRES_GRAD);
    if (!W || bench_barrier_wait(&sh->bar, (uint32_t)world, 60ll * 1000000000))
        return fprintf(stderr, "rank %d: %s\n", rank, W ? "start barrier timed out" : sr_last_error()), 1;
    if (chain && rank < 2 && hop_floors(rank))
        return fprintf(stderr, "rank %d: the hop floors' peer stopped answering\n", rank), 1;
    if (rank == 0) {
        if (chain)
            drive_chain();
        else
            drive_step();
        for (int k = 0; k < world; k++) {
            int64_t left = contexts_left(k);
            if (left) {
                fprintf(stderr, "rank %d: %lld autograd contexts still alive 2 s after the last step\n", k,
                        (long long)left);
                sh->errors++;
            }
        }
        for (int k = 1; k < world; k++) {
            int rc = sr_rpc_sync(k, "drop_w", SR_NOARGS, 0, NULL);
            if (rc)
                fail("drop_w", rc);
        }
        for (int k = 1; mode != IDLE_SHUTDOWN && k < world; k++)
            sr_rpc_sync(k, "done", SR_NOARGS, 0, NULL);
        sr_tensor_unref(W);
    } else if (mode == IDLE_FUTURE) {
        sr_future_wait(done_fut, NULL);
    } else if (mode == IDLE_AWAY) { /* no thread of this worker in the runtime: the progress thread serves */
        while (sem_wait(&done_sem) && errno == EINTR)
            ;
    }
    if (sr_shutdown(true, 600))
        return fprintf(stderr, "rank %d: shutdown: %s\n", rank, sr_last_error()), 1;
    return 0;
}

/* ---- contexts per second ---- */

struct ctx_thread {
    pthread_t tid;
    pthread_barrier_t *start;
    int pairs;
    int64_t *samples;
    int nsamples;
    int64_t end_ns;
};

static void *ctx_thread_main(void *p)
{
    struct ctx_thread *t = p;
    pthread_barrier_wait(t->start);
    for (int i = 0; i < t->pairs; i++) {
        int64_t ctx, t0 = i % CTX_SAMPLE ? 0 : bench_now_ns();
        int rc = sr_dist_autograd_context_begin(&ctx);
        if (rc || (rc = sr_dist_autograd_context_end(ctx))) {
            fail("context begin/end", rc);
            break;
        }
        if (t0)
            t->samples[t->nsamples++] = bench_now_ns() - t0;
    }
    t->end_ns = bench_now_ns();
    return NULL;
}

/* arg: &ctx_result to fill, cfg index and round packed in the pointer's target */
struct ctx_job {
    int cfg, round;
};

static int ctx_job_main(int rank, int world, void *arg)
{
    (void)rank;
    (void)world;
    const struct ctx_job *j = arg;
    const struct ctx_cfg *c = &ctx_cfgs[j->cfg];
    if (c->shards)
        sr__dist_autograd_set_shards(c->shards);
    if (sr_init(NULL))
        return fprintf(stderr, "contexts: %s\n", sr_last_error()), 1;
    struct ctx_thread th[CTX_THREADS];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, c->threads + 1);
    int pairs = c->pairs / ctx_div;
    int per = pairs / CTX_SAMPLE + 1;
    int64_t *samples = malloc(sizeof(int64_t) * (size_t)per * c->threads);
    if (!samples)
        return 1;
    for (unsigned i = 0; i < c->threads; i++) {
        th[i] = (struct ctx_thread){.start = &start, .pairs = pairs, .samples = samples + (size_t)i * per};
        pthread_create(&th[i].tid, NULL, ctx_thread_main, &th[i]);
    }
    pthread_barrier_wait(&start);
    int64_t t0 = bench_now_ns(), end = t0;
    size_t ns = 0;
    for (unsigned i = 0; i < c->threads; i++) {
        pthread_join(th[i].tid, NULL);
        end = th[i].end_ns > end ? th[i].end_ns : end;
        memmove(samples + ns, th[i].samples, sizeof(int64_t) * (size_t)th[i].nsamples);
        ns += (size_t)th[i].nsamples;
    }
    pthread_barrier_destroy(&start);
    struct ctx_result *r = &sh->ctx[j->cfg][j->round];
    r->per_s = (double)pairs * c->threads / ((double)(end - t0) / 1e9);
    if (ns)
        r->pair = bench_lat_of(samples, ns);
    free(samples);
    sr_dist_autograd_debug_info d;
    if (sr_dist_autograd_debug_info_get(&d) || d.num_autograd_contexts) {
        fprintf(stderr, "contexts: %llu still alive after every thread ended its own\n",
                (unsigned long long)d.num_autograd_contexts);
        sh->errors++;
    }
    return sr_shutdown(true, 30) ? 1 : 0;
}

static int run_contexts(void)
{
    sr_spawn_opts o = {.name_prefix = "bench-dactx", .shm_size = 256u << 20};
    for (int r = 0; r < ctx_rounds; r++)
        for (int k = 0; k < NCFG; k++) {
            /* alternate the order, so neither configuration always runs second */
            int cfg = r % 2 ? NCFG - 1 - k : k;
            struct ctx_job j = {.cfg = cfg, .round = r};
            if (sr_spawn(1, ctx_job_main, &j, &o))
                return fprintf(stderr, "bench_dist_autograd contexts: %s\n", sr_last_error()), 1;
        }
    return 0;
}

/* ---- PyTorch, measured in this run ---- */

struct torch_fig {
    double p50, p99;
    bool have;
};
static struct torch_fig pt[NWORK];
static char pt_version[64] = "";
static char pt_why[256] = "not run"; /* why there are no PyTorch figures */

/* Runs the comparison script and reads its machine lines; its human lines
 * are echoed. Returns 0 when it produced figures. */
static int run_torch(bool step, bool chain, bool no_torch)
{
    if (no_torch || bench_smoke_on() || getenv("BENCH_NO_TORCH")) {
        snprintf(pt_why, sizeof(pt_why), "%s",
                 no_torch ? "--no-torch" : bench_smoke_on() ? "--smoke" : "BENCH_NO_TORCH set");
        return -1;
    }
    const char *py = getenv("BENCH_PYTHON") ? getenv("BENCH_PYTHON") : "/usr/bin/python3";
    char cmd[1024], line[512];
    snprintf(cmd, sizeof(cmd), "'%s' '%s/torch_dist_autograd.py'%s%s", py, BENCH_COMPARE_DIR,
             getenv("BENCH_TORCH_QUICK") ? " --quick" : "", step && chain ? "" : step ? " --only step" : " --only chain");
    fflush(stdout);
    snprintf(cmd + strlen(cmd), sizeof(cmd) - strlen(cmd), " 2>&1");
    FILE *f = popen(cmd, "r");
    if (!f) {
        snprintf(pt_why, sizeof(pt_why), "could not run %s", py);
        return -1;
    }
    int got = 0;
    bool missing = false;
    while (fgets(line, sizeof(line), f)) {
        char key[32];
        double p50, p99;
        if (sscanf(line, "torch-da %31s p50_ns %lf p99_ns %lf", key, &p50, &p99) == 3) {
            for (int w = 0; w < NWORK; w++)
                if (!strcmp(key, wname[w]))
                    pt[w] = (struct torch_fig){p50, p99, true}, got++;
        } else {
            if (!strncmp(line, "# PyTorch ", 10))
                sscanf(line + 10, "%63s", pt_version);
            missing |= strstr(line, "python3-torch is not installed") || strstr(line, "No module named 'torch'");
            fputs(line, stdout);
        }
    }
    int st = pclose(f);
    if (st)
        printf("# PyTorch: %s exited with status %d\n", cmd, st);
    if (missing)
        snprintf(pt_why, sizeof(pt_why), "torch not installed (apt-get install python3-torch)");
    else if (!got)
        snprintf(pt_why, sizeof(pt_why), "torch_dist_autograd.py gave no figures (status %d)", st);
    return got ? 0 : -1;
}

/* ---- report ---- */

static bench_lat med(int w)
{
    double p50[ROUNDS], p99[ROUNDS];
    for (int r = 0; r < rounds; r++)
        p50[r] = (double)sh->lat[mode][w][r].p50, p99[r] = (double)sh->lat[mode][w][r].p99;
    return (bench_lat){(int64_t)bench_median(p50, rounds), (int64_t)bench_median(p99, rounds)};
}

static double ratio50(int w, int ref)
{
    double q[ROUNDS];
    for (int r = 0; r < rounds; r++)
        q[r] = (double)sh->lat[mode][w][r].p50 / (double)sh->lat[mode][ref][r].p50;
    return bench_median(q, rounds);
}

/* Decimals worth printing for a ratio: 85x, 7.3x, 0.01x. */
static int digits(double x)
{
    return x >= 10 ? 0 : x >= 1 ? 1 : 2;
}

/* The chain's lines: the floor of its hops (CHAIN_HOPS), and the same
 * hops asleep (a reference, not a bound). */
static void chain_floor(int w, const bench_lat *m, bench_rec *rec)
{
    int hops = w == W_CHAIN ? CHAIN_HOPS : w == W_CHAIN_FWD ? CHAIN_FWD_HOPS : 0;
    if (!hops || sh->line[mode].p50 <= 0 || sh->futex[mode].p50 <= 0)
        return;
    double line = hops * (double)sh->line[mode].p50 / 2, asleep = hops * (double)sh->futex[mode].p50 / 2;
    printf(" | floor %d hops x cache-line one-way %.0f ns = %.1f us: ratio %.0f", hops,
           (double)sh->line[mode].p50 / 2, line / 1e3, (double)m->p50 / line);
    printf(" | reference, not a bound: %d sleeping hops x futex one-way %.1f us = %.0f us: ratio %.2f", hops,
           (double)sh->futex[mode].p50 / 2e3, asleep / 1e3, (double)m->p50 / asleep);
    if (pt[w].have)
        printf(" (%.0fx faster than PyTorch)", pt[w].p50 / asleep);
    bench_rec_num(rec, "floor_hops", hops);
    bench_rec_num(rec, "floor_ns", line);
    bench_rec_num(rec, "floor_ratio_p50", (double)m->p50 / line);
    bench_rec_num(rec, "sleeping_hops_ns", asleep);
    bench_rec_num(rec, "sleeping_hops_ratio_p50", (double)m->p50 / asleep);
}

/* Prints one line; returns 1 if the PyTorch target applies and is missed. */
static int report_line(const char *name, const char *config, int w, int ref, const char *ref_name, double target)
{
    bench_lat m = med(w);
    int missed = 0;
    char cfg[160];
    snprintf(cfg, sizeof(cfg), "%s, %s", config, mode_name[mode]);
    printf("%-13s | %-70s | p50 %9lld ns p99 %9lld ns", name, cfg, (long long)m.p50, (long long)m.p99);
    if (ref >= 0)
        printf(" | %.2fx %s", ratio50(w, ref), ref_name);
    bench_rec rec;
    bench_rec_begin(&rec, name);
    bench_rec_str(&rec, "config", cfg);
    bench_rec_num(&rec, "p50_ns", (double)m.p50);
    bench_rec_num(&rec, "p99_ns", (double)m.p99);
    if (ref >= 0) {
        bench_rec_str(&rec, "ref", ref_name);
        bench_rec_num(&rec, "ratio_p50", ratio50(w, ref));
    }
    if (pt[w].have) {
        printf(" | PyTorch p50 %.0f us p99 %.0f us (this run): %.*fx faster (p99 %.*fx)", pt[w].p50 / 1e3,
               pt[w].p99 / 1e3, digits(pt[w].p50 / (double)m.p50), pt[w].p50 / (double)m.p50,
               digits(pt[w].p99 / (double)m.p99), pt[w].p99 / (double)m.p99);
        bench_rec_num(&rec, "torch_p50_ns", pt[w].p50);
        bench_rec_num(&rec, "torch_p99_ns", pt[w].p99);
        if (pt_version[0])
            bench_rec_str(&rec, "torch_version", pt_version);
    } else if (w == W_STEP || w == W_CHAIN) {
        printf(" | PyTorch: %s", pt_why);
        bench_rec_str(&rec, "torch", pt_why);
    }
    if (target > 0 && pt[w].have) {
        missed = pt[w].p50 / (double)m.p50 < target;
        printf(" | target >= %.0fx faster than PyTorch: %s", target, missed ? "NOT met" : "met");
        bench_rec_num(&rec, "target_torch_speedup", target);
        bench_rec_bool(&rec, "target_met", !missed);
    }
    chain_floor(w, &m, &rec);
    const double *po = sh->per_op[mode][w];
    if (w != W_LOCAL)
        printf(" | rank 0 per call: %.1f msgs sent, %.2f wakes issued, %.2f sleeps", po[0], po[1], po[2]);
    if (sh->failed[mode][w]) {
        printf(" | FAILED %d of %d timed calls", sh->failed[mode][w], rounds * (w >= W_CHAIN_FWD ? chain_n : step_n));
        bench_rec_num(&rec, "failed_calls", sh->failed[mode][w]);
    }
    printf("\n");
    bench_rec_emit(&rec);
    return missed;
}

/* Returns 1 if the target is missed with the callees in sr_shutdown (PyTorch's like-for-like). */
static int report_steps(void)
{
    int missed = 0;
    for (mode = 0; mode < NMODE; mode++)
        if (sh->ran[mode][W_STEP]) {
            missed |= report_line("dist_autograd", "seed-002 step (my_add UDF), 2 workers", W_STEP, W_RPC,
                                  "its rpc_sync(my_add) without a context", TARGET_X) &&
                      mode == IDLE_SHUTDOWN;
            report_line("dist_autograd", "seed-002 step (built-in add), 2 workers", W_STEP_ADD, W_RPC,
                        "rpc_sync(my_add) without a context", 0);
            report_line("dist_autograd", "the step's forward and context end only", W_FWD, W_RPC,
                        "rpc_sync(my_add) without a context", 0);
            report_line("dist_autograd", "rpc_sync(my_add), no context (reference)", W_RPC, -1, NULL, 0);
            if (mode == IDLE_SHUTDOWN)
                report_line("dist_autograd", "the same step locally (sr_backward, no RPC)", W_LOCAL, W_STEP,
                            "the distributed step", 0);
        }
    for (mode = 0; mode < NMODE; mode++)
        if (sh->ran[mode][W_CHAIN]) {
            report_line("dist_autograd", "4-worker chain: forward + backward", W_CHAIN, W_CHAIN_FWD,
                        "the same chain without a context", TARGET_X);
            report_line("dist_autograd", "4-worker chain, no context (reference)", W_CHAIN_FWD, -1, NULL, 0);
        }
    return missed;
}

static void report_contexts(void)
{
    double ps[NCFG][CTX_ROUNDS], p50[CTX_ROUNDS], p99[CTX_ROUNDS], q[CTX_ROUNDS], m[NCFG];
    for (int c = 0; c < NCFG; c++) {
        for (int r = 0; r < ctx_rounds; r++) {
            ps[c][r] = sh->ctx[c][r].per_s;
            p50[r] = (double)sh->ctx[c][r].pair.p50;
            p99[r] = (double)sh->ctx[c][r].pair.p99;
            q[r] = sh->ctx[c][r].per_s / sh->ctx[C_ONE_LOCK][r].per_s;
        }
        double ratio = bench_median(q, ctx_rounds);
        memcpy(q, ps[c], sizeof(q));
        m[c] = bench_median(q, ctx_rounds);
        printf("dist_autograd ctx | begin+end, 1 worker, %-34s | %6.2f M ctx/s | pair p50 %6.0f ns p99 %7.0f ns",
               ctx_cfgs[c].label, m[c] / 1e6, bench_median(p50, ctx_rounds), bench_median(p99, ctx_rounds));
        if (c == C_SHARDED)
            printf(" | %.2fx one lock", ratio);
        printf("\n");
        bench_rec rec;
        bench_rec_begin(&rec, "dist_autograd ctx begin+end");
        bench_rec_str(&rec, "config", ctx_cfgs[c].label);
        bench_rec_num(&rec, "per_s", m[c]);
        bench_rec_num(&rec, "pair_p50_ns", bench_median(p50, ctx_rounds));
        bench_rec_num(&rec, "pair_p99_ns", bench_median(p99, ctx_rounds));
        bench_rec_emit(&rec);
    }
}

static void header(void)
{
    char model[128] = "?", line[256];
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof(line), f))
        if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
            snprintf(model, sizeof(model), "%s", strchr(line, ':') + 2);
            model[strcspn(model, "\n")] = 0;
            break;
        }
    if (f)
        fclose(f);
    struct utsname u;
    uname(&u);
    printf("# bench_dist_autograd: %ld CPUs online, %s, Linux %s; %d rounds (contexts: %d), medians over rounds; "
           "PyTorch %s\n",
           sysconf(_SC_NPROCESSORS_ONLN), model, u.release, rounds, ctx_rounds,
           pt_version[0] ? pt_version : pt_why);
}

/* bench_dist_autograd [step] [chain] [contexts] [shutdown] [future] [away]:
 * the workloads (default all) and where the callees wait (default all three). */
int main(int argc, char **argv)
{
    bench_cli cli = {.prog = "bench_dist_autograd",
                     .names = {"step", "chain", "contexts", "shutdown", "future", "away"},
                     .flags = {"--no-torch"},
                     .usage = "  workloads: step chain contexts (default all); callees wait in: shutdown future away "
                              "(default all three)\n  --no-torch  skip PyTorch (bench/compare/torch_dist_autograd.py)",
                     .smoke_what = "1 round of 30 steps and 20 chains, contexts 1/100 of the pairs"};
    bench_cli_parse(&cli, argc, argv);
    if (cli.smoke)
        rounds = 1, step_n = 30, step_warm = 5, chain_n = 20, chain_warm = 5, ctx_rounds = 1, ctx_div = 100;
    bool want[6] = {0};
    int nw = 0, nm = 0;
    for (int k = 0; k < 6; k++)
        if (cli.named[k])
            want[k] = true, nw += k < 3, nm += k >= 3;
    for (int k = 0; k < 6; k++)
        want[k] |= k < 3 ? !nw : !nm;
    if (!(sh = bench_shared_alloc(sizeof(*sh))))
        return 1;
    if (want[0] || want[1])
        run_torch(want[0], want[1], cli.flag[0]);
    sr_spawn_opts o2 = {.name_prefix = "bench-da", .shm_size = 512u << 20};
    sr_spawn_opts o4 = {.name_prefix = "bench-da", .shm_size = 1ull << 30};
    int rc = 0;
    for (int m = 0; m < NMODE && !rc; m++) {
        if (!want[3 + m])
            continue;
        struct job_arg step = {.chain = false, .mode = m}, chain = {.chain = true, .mode = m};
        if (want[0] && sr_spawn(2, job, &step, &o2))
            rc = fprintf(stderr, "bench_dist_autograd step: %s\n", sr_last_error());
        if (!rc && want[1] && sr_spawn(4, job, &chain, &o4))
            rc = fprintf(stderr, "bench_dist_autograd chain: %s\n", sr_last_error());
    }
    if (!rc && want[2])
        rc = run_contexts();
    if (rc)
        return 1;
    header();
    int missed = report_steps();
    if (want[2])
        report_contexts();
    if (sh->errors) { /* the lines above say which workload failed */
        fprintf(stderr, "bench_dist_autograd: %d errors; first: %s\n", sh->errors, sh->first_error);
        return 1;
    }
    return missed && getenv("BENCH_STRICT") && !cli.smoke ? 1 : 0; /* as bench_ring: a miss fails only when asked */
}
