/* SPDX-License-Identifier: MIT */
/* RPC layer tests, after PyTorch's rpc_test.py: calls by rank and name,
 * self-calls, UDFs, nested calls, async functions, fire-and-forget chains
 * drained by graceful shutdown, many threads, futures, timeouts, errors. */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "rpc_harness.h"

#define EVENT_WAIT_S 30
#include "shared_event.h"

LEAK_CHECKED_SUITE(rpc);

#define WORLD 4

static struct shared {
    _Atomic int chain_hops;
    _Atomic int uneven_done;
} *sh;

static void sleep_ms(int64_t ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

static struct pool_page {
    _Atomic uint32_t arrived[2]; /* calls inside "rendezvous", per burst */
    _Atomic uint32_t step;       /* the pool test's steps (sc_pool) */
} *pp;

/* ---- test functions ---- */

static int fn_scalar(sr_call *c)
{
    if (sr_call_nargs(c) != 1 || sr_value_type(sr_call_arg(c, 0)) != SR_KIND_INT)
        return sr_call_fail(c, -EINVAL, "udf_scalar takes one int");
    return sr_call_return(c, sr_int(sr_value_int(sr_call_arg(c, 0)) * 2 + 1));
}

/* nested(depth): hop to the next worker until depth is 0; returns the list of ranks visited. */
static int fn_nested(sr_call *c)
{
    int64_t depth = sr_value_int(sr_call_arg(c, 0));
    int me = sr_rank();
    if (depth == 0)
        return sr_call_return(c, sr_int(me));
    sr_value *d = sr_int(depth - 1), *inner = NULL;
    int rc = sr_rpc_sync((me + 1) % sr_world_size(), "nested", SR_ARGS(d), 0, &inner);
    sr_value_unref(d);
    if (rc)
        return sr_call_fail(c, rc, "nested hop from %d failed: %s", me, sr_last_error());
    int64_t got = sr_value_int(inner);
    sr_value_unref(inner);
    return sr_call_return(c, sr_int(got * 10 + me));
}

static int fn_sleep(sr_call *c)
{
    sleep_ms(sr_value_int(sr_call_arg(c, 0)));
    return sr_call_return(c, sr_int(sr_value_int(sr_call_arg(c, 0))));
}

static int fn_fail(sr_call *c)
{
    return sr_call_fail(c, -EINVAL, "intentional failure with %lld", (long long)sr_value_int(sr_call_arg(c, 0)));
}

/* chain(n): count a hop, then fire the next one without waiting for it. */
static int fn_chain(sr_call *c)
{
    int64_t left = sr_value_int(sr_call_arg(c, 0));
    atomic_fetch_add(&sh->chain_hops, 1);
    if (left > 0) {
        sr_value *n = sr_int(left - 1);
        sr_future *f;
        int rc = sr_rpc_async((sr_rank() + 1) % sr_world_size(), "chain", SR_ARGS(n), 0, &f);
        sr_value_unref(n);
        if (rc)
            return sr_call_fail(c, rc, "chain hop failed: %s", sr_last_error());
        sr_future_unref(f); /* fire and forget */
    }
    return sr_call_return(c, NULL);
}

/* async relay: forward to the next worker and answer with that future. */
static int fn_async_relay(sr_call *c, sr_future **out)
{
    return sr_rpc_async((sr_rank() + 1) % sr_world_size(), "udf_scalar", SR_ARGS(sr_call_arg(c, 0)), 0, out);
}

/* rendezvous(burst, n): returns once n calls of the burst are inside it at
 * once. Each blocks until the others have come, so a burst of n needs n
 * executors at the same time. */
static int fn_rendezvous(sr_call *c)
{
    int b = (int)sr_value_int(sr_call_arg(c, 0));
    uint32_t n = (uint32_t)sr_value_int(sr_call_arg(c, 1));
    _Atomic uint32_t *w = &pp->arrived[b];
    uint32_t got = atomic_fetch_add(w, 1) + 1; /* seq_cst: pairs with wait_for's acquire load */
    syscall(SYS_futex, w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    if (got < n && !wait_for(w, n))
        return sr_call_fail(c, -ETIMEDOUT, "only %u of the %u calls of burst %d ran at once within %d s",
                            atomic_load(w), n, b, EVENT_WAIT_S);
    return sr_call_return(c, NULL);
}

static void register_fns(void)
{
    sr_register("rendezvous", fn_rendezvous);
    sr_register("udf_scalar", fn_scalar);
    sr_register("nested", fn_nested);
    sr_register("sleep_ms", fn_sleep);
    sr_register("fail", fn_fail);
    sr_register("chain", fn_chain);
    sr_register_async("async_relay", fn_async_relay);
}

/* v is passed by address: the call that fills it is an argument too, and
 * argument evaluation order is unspecified. */
static int expect_int(int rc, sr_value **pv, int64_t want, const char *what)
{
    sr_value *v = *pv;
    WCHECK(rc == 0, "%s failed: %s", what, sr_last_error());
    WCHECK(sr_value_type(v) == SR_KIND_INT && sr_value_int(v) == want, "%s: got %lld, want %lld", what,
           (long long)sr_value_int(v), (long long)want);
    sr_value_unref(v);
    return 0;
}

/* ---- scenarios ---- */

static int sc_add(int rank, int world)
{
    sr_value *a = sr_int(rank), *b = sr_int(40), *v = NULL;
    int to = (rank + 1) % world;
    if (expect_int(sr_rpc_sync(to, "add", SR_ARGS(a, b), 0, &v), &v, rank + 40, "add by rank"))
        return 1;
    char name[32];
    snprintf(name, sizeof(name), "worker%d", to);
    WCHECK(sr_worker_rank(name) == to, "worker_rank(%s)", name);
    WCHECK(!strcmp(sr_worker_name(to), name), "worker_name(%d) = %s", to, sr_worker_name(to));
    if (expect_int(sr_rpc_sync(sr_worker_rank(name), "add", SR_ARGS(a, b), 0, &v), &v, rank + 40, "add by name"))
        return 1;
    if (expect_int(sr_rpc_sync(rank, "add", SR_ARGS(a, b), 0, &v), &v, rank + 40, "add to self"))
        return 1;
    sr_future *f;
    WCHECK(sr_rpc_async(to, "add", SR_ARGS(a, b), 0, &f) == 0, "rpc_async: %s", sr_last_error());
    if (expect_int(sr_future_wait(f, &v), &v, rank + 40, "add async"))
        return 1;
    sr_future_unref(f);
    sr_value *x = sr_double(1.5);
    WCHECK(sr_rpc_sync(to, "add", SR_ARGS(a, x), 0, &v) == 0 && sr_value_double(v) == rank + 1.5, "add double");
    sr_value_unref(v);
    sr_value_unref(x);
    sr_value_unref(a);
    sr_value_unref(b);
    return 0;
}

Test(rpc, add_sync_async_self_by_name_and_rank, .timeout = 120)
{
    RUN_JOB("add", WORLD, .scenario = sc_add, .register_fns = register_fns);
}

static int sc_scalar_udf(int rank, int world)
{
    sr_value *x = sr_int(rank + 7), *v;
    int rc = expect_int(sr_rpc_sync((rank + 1) % world, "udf_scalar", SR_ARGS(x), 0, &v), &v, 2 * (rank + 7) + 1,
                        "udf_scalar");
    sr_value_unref(x);
    return rc;
}

Test(rpc, udf_with_scalar_argument, .timeout = 120)
{
    RUN_JOB("udf", WORLD, .scenario = sc_scalar_udf, .register_fns = register_fns);
}

static int sc_nested(int rank, int world)
{
    if (rank != 0)
        return 0;
    (void)world;
    sr_value *d = sr_int(3), *v;
    /* 0 -> 1 -> 2 -> 3: 3 returns 3; 2 returns 32; 1 returns 321 */
    int rc = expect_int(sr_rpc_sync(1, "nested", SR_ARGS(d), 0, &v), &v, 3 * 100 + 2 * 10 + 1, "three hops");
    sr_value_unref(d);
    return rc;
}

Test(rpc, nested_calls_three_hops, .timeout = 120)
{
    RUN_JOB("nested", WORLD, .scenario = sc_nested, .register_fns = register_fns);
}

static int sc_async_concurrent(int rank, int world)
{
    if (rank != 0)
        return 0;
    (void)world;
    sr_future *fs[20];
    sr_value *xs[20];
    for (int i = 0; i < 20; i++) {
        xs[i] = sr_int(i);
        WCHECK(sr_rpc_async(1, "async_relay", SR_ARGS(xs[i]), 0, &fs[i]) == 0, "rpc_async %d", i);
    }
    sr_value *all;
    WCHECK(sr_future_wait_all(fs, 20, &all) == 0, "wait_all: %s", sr_last_error());
    for (int i = 0; i < 20; i++) {
        WCHECK(sr_value_int(sr_value_list_at(all, (size_t)i)) == 2 * i + 1, "result %d", i);
        sr_future_unref(fs[i]);
        sr_value_unref(xs[i]);
    }
    sr_value_unref(all);
    return 0;
}

Test(rpc, twenty_concurrent_nested_async_calls_with_two_executors, .timeout = 120)
{
    RUN_JOB("asyncnest", WORLD, .scenario = sc_async_concurrent, .register_fns = register_fns,
            .opts = {.num_worker_threads = 2});
}

static int sc_chain(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0;
    sr_value *n = sr_int(20);
    sr_future *f;
    WCHECK(sr_rpc_async(1, "chain", SR_ARGS(n), 0, &f) == 0, "start chain: %s", sr_last_error());
    sr_future_unref(f); /* nobody waits: shutdown must drain it */
    sr_value_unref(n);
    return 0;
}

Test(rpc, fire_and_forget_chain_drained_by_graceful_shutdown, .timeout = 120)
{
    sh = shared_page(4096);
    RUN_JOB("chain", WORLD, .scenario = sc_chain, .register_fns = register_fns);
    cr_assert_eq(atomic_load(&sh->chain_hops), 21, "the 20-hop chain ran %d of 21 hops before shutdown ended",
                 atomic_load(&sh->chain_hops));
}

static int sc_uneven(int rank, int world)
{
    if (rank != 0)
        return 0; /* the others go straight into shutdown and serve from there */
    for (int i = 0; i < 300; i++) {
        sr_value *x = sr_int(i), *v;
        if (expect_int(sr_rpc_sync(1 + i % (world - 1), "udf_scalar", SR_ARGS(x), 0, &v), &v, 2 * i + 1, "uneven"))
            return 1;
        sr_value_unref(x);
    }
    atomic_fetch_add(&sh->uneven_done, 1);
    return 0;
}

Test(rpc, uneven_workload_while_others_are_in_shutdown, .timeout = 120)
{
    sh = shared_page(4096);
    RUN_JOB("uneven", WORLD, .scenario = sc_uneven, .register_fns = register_fns);
    cr_assert_eq(atomic_load(&sh->uneven_done), 1);
}

struct thread_arg {
    int rank, world, failures;
    unsigned seed;
};

static void *caller_thread(void *p)
{
    struct thread_arg *t = p;
    for (int i = 0; i < 100; i++) {
        int to = (int)(rand_r(&t->seed) % (unsigned)t->world);
        sr_value *x = sr_int(i * 1000 + t->rank), *v = NULL;
        int rc = sr_rpc_sync(to, "udf_scalar", SR_ARGS(x), 0, &v);
        if (rc || sr_value_int(v) != 2 * (i * 1000 + t->rank) + 1) {
            fprintf(stderr, "thread call %d to %d: rc %d %s\n", i, to, rc, sr_last_error());
            t->failures++;
        }
        sr_value_unref(v);
        sr_value_unref(x);
    }
    return NULL;
}

static int sc_threads(int rank, int world)
{
    pthread_t th[20];
    struct thread_arg args[20];
    for (int i = 0; i < 20; i++) {
        args[i] = (struct thread_arg){rank, world, 0, (unsigned)(rank * 100 + i)};
        WCHECK(pthread_create(&th[i], NULL, caller_thread, &args[i]) == 0, "pthread_create");
    }
    int failures = 0;
    for (int i = 0; i < 20; i++) {
        pthread_join(th[i], NULL);
        failures += args[i].failures;
    }
    WCHECK(failures == 0, "%d of 2000 calls failed", failures);
    return 0;
}

Test(rpc, twenty_threads_per_worker_hundred_calls_each, .timeout = 240)
{
    RUN_JOB("threads", WORLD, .scenario = sc_threads, .register_fns = register_fns);
}

/* Back-pressure: 8-slot inboxes and hundreds of calls in flight both ways.
 * Sends to a full inbox queue locally and are retried; nothing is lost,
 * nothing hangs, every result is right. */
static int sc_backpressure(int rank, int world)
{
    enum { N = 500 };
    sr_future *fs[N];
    sr_value *xs[N], *all = NULL;
    int to = (rank + 1) % world;
    for (int i = 0; i < N; i++) {
        xs[i] = sr_int(rank * 10000 + i);
        WCHECK(sr_rpc_async(to, "udf_scalar", SR_ARGS(xs[i]), 10, &fs[i]) == 0, "call %d: %s", i, sr_last_error());
    }
    WCHECK(sr_future_wait_all(fs, N, &all) == 0, "wait_all: %s", sr_last_error());
    for (int i = 0; i < N; i++) {
        WCHECK(sr_value_int(sr_value_list_at(all, (size_t)i)) == 2 * (rank * 10000 + i) + 1, "result %d", i);
        sr_future_unref(fs[i]);
        sr_value_unref(xs[i]);
    }
    sr_value_unref(all);
    return 0;
}

Test(rpc, full_inboxes_queue_and_lose_nothing, .timeout = 120)
{
    RUN_JOB("backpressure", WORLD, .scenario = sc_backpressure, .register_fns = register_fns, .ring_slots = 8);
}

/* Executors start as calls need them: sr_init starts one of at most
 * POOL_MAX; a burst of n calls that each block until all n run starts
 * exactly n executors (a queued call with no free executor starts one; no
 * call ever waits behind a blocked one); where the progress thread runs
 * one of them with the stand-by covering it (a thread named
 * shmrpc-standby: agent.h, "The progress thread serves"), n - 1, or n when
 * the stand-by, still covering the burst before (its `back` completes just
 * after that call's answer), read this one's first call; the pool never
 * passes POOL_MAX. Counted by the pool (sr_debug_info_get) and by the
 * threads named shmrpc-exec* in /proc/self/task. Steps (pp->step): 1
 * worker1 counted at init, 2 burst of 2 answered, 3 worker1 counted, 4
 * burst of POOL_MAX answered. */
#define POOL_MAX 6

static int pool_size(void)
{
    sr_debug_info d;
    return sr_debug_info_get(&d) ? -1 : (int)d.thread_pool_size;
}

static int burst(int b, int n)
{
    sr_future *fs[POOL_MAX];
    for (int i = 0; i < n; i++) {
        sr_value *vb = sr_int(b), *vn = sr_int(n);
        WCHECK(sr_rpc_async(1, "rendezvous", SR_ARGS(vb, vn), 0, &fs[i]) == 0, "burst %d, call %d: %s", b, i,
               sr_last_error());
        sr_value_unref(vb);
        sr_value_unref(vn);
    }
    for (int i = 0; i < n; i++) {
        sr_value *v = NULL;
        WCHECK(sr_future_wait(fs[i], &v) == 0, "burst %d, call %d: %s", b, i, sr_last_error());
        sr_value_unref(v);
        sr_future_unref(fs[i]);
    }
    return 0;
}

/* named: the executors started all ran a call, so each has named itself.
 * burst: want is a burst's size, one of which the progress thread may have
 * run if the stand-by is on. */
static int pool_count(int want, bool named_all, bool burst, const char *when)
{
    int least = burst && threads_named("shmrpc-standby") == 1 ? want - 1 : want;
    int pool = pool_size(), named = threads_named("shmrpc-exec");
    if (pool == least)
        want = least;
    WCHECK(pool == want && (named_all ? named == want : named <= want),
           "%s: %d executors started (%d threads named shmrpc-exec*) of at most %d; %d expected", when, pool, named,
           POOL_MAX, want);
    return 0;
}

static int sc_pool(int rank, int world)
{
    (void)world;
    if (rank == 1) { /* its main thread waits aside: the progress thread hands every call to the executors */
        int rc = pool_count(1, false, false, "after sr_init");
        set_and_wake(&pp->step, 1); /* even after a failure: worker0 goes on, the job fails by our status */
        WCHECK(wait_for(&pp->step, 2), "worker0's burst of 2 was not answered within %d s", EVENT_WAIT_S);
        rc = rc || pool_count(2, true, true, "after a burst of 2 blocking calls");
        set_and_wake(&pp->step, 3);
        WCHECK(wait_for(&pp->step, 4), "worker0's burst of %d was not answered within %d s", POOL_MAX, EVENT_WAIT_S);
        return rc || pool_count(POOL_MAX, true, true, "after a burst of POOL_MAX blocking calls");
    }
    if (rank != 0)
        return 0;
    WCHECK(wait_for(&pp->step, 1), "worker1 did not count its executors within %d s", EVENT_WAIT_S);
    if (burst(0, 2))
        return 1;
    set_and_wake(&pp->step, 2);
    WCHECK(wait_for(&pp->step, 3), "worker1 did not count its executors within %d s", EVENT_WAIT_S);
    if (burst(1, POOL_MAX))
        return 1;
    set_and_wake(&pp->step, 4);
    return 0;
}

Test(rpc, executors_start_as_blocking_calls_need_them, .timeout = 120)
{
    pp = shared_page(4096);
    RUN_JOB("pool", 2, .scenario = sc_pool, .register_fns = register_fns, .opts = {.num_worker_threads = POOL_MAX});
}
