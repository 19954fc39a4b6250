/* SPDX-License-Identifier: MIT */
/* sr_serve_until: a thread with nothing else to do serves its worker's calls
 * while it waits, as sr_shutdown does (a parameter server's main thread).
 *
 *   calls_run_on_the_serving_thread   the hop it exists to remove: a plain
 *       function called by a peer runs on the thread in sr_serve_until, not
 *       on an executor (with sr_future_wait every call ran on an executor:
 *       bench_train's server paid that hop, and the wake of the executor,
 *       three times a step).
 *   a_bounded_serve_times_out_then_serves   sr_serve_until_timeout: a future
 *       nobody completes ends the wait with -ETIMEDOUT naming the worker and
 *       the bound, the future untouched; bad bounds are -EINVAL; calls run
 *       on the thread in it as in sr_serve_until.
 *   blocking_call_holds_up_no_other   the serving thread keeps one plain call
 *       of a burst for itself, never two: a call that blocks until the next
 *       one has run (a lock that a later call releases, bench_train's
 *       serialised mode) deadlocked when both were kept behind each other on
 *       that thread.
 *
 * Every wait is bounded: a call that never runs on the serving thread fails
 * after SERVE_BOUND_S, a blocked `take` after TAKE_BOUND_S.
 *
 * Worker 0's state for the functions is ready before its sr_init (setup):
 * worker 1 calls as soon as its own sr_init returns, and worker 0's progress
 * thread serves those calls on the executors before its main thread reaches
 * the scenario. A sem_init there reset a serve.give already posted, and
 * serve.take then waited for nothing. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <time.h>

#include "rpc_harness.h"

LEAK_CHECKED_SUITE(serve);

#define SERVE_BOUND_S 30
#define TAKE_BOUND_S 20
#define PAIRS 200

static pthread_t server_thread; /* worker 0's thread in sr_serve_until */
static sr_future *stop;          /* worker 0: completed by serve.stop */
static sem_t gate;               /* worker 0: serve.take waits, serve.give posts */

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* serve.where(): true when it runs on the serving thread. */
static int fn_where(sr_call *c)
{
    return sr_call_return(c, sr_bool(pthread_equal(pthread_self(), server_thread)));
}

static int fn_stop(sr_call *c)
{
    sr_future_set_result(stop, NULL);
    return sr_call_return(c, NULL);
}

/* serve.take(): blocks until a serve.give has run (bounded). */
static int fn_take(sr_call *c)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += TAKE_BOUND_S;
    while (sem_timedwait(&gate, &until))
        if (errno != EINTR)
            return sr_call_fail(c, -errno, "serve.take: no serve.give ran in %d s (held up behind this call?)",
                                TAKE_BOUND_S);
    return sr_call_return(c, NULL);
}

static int fn_give(sr_call *c)
{
    sem_post(&gate);
    return sr_call_return(c, NULL);
}

/* Before sr_init, on every worker (the harness's thread, which then runs
 * the scenario): the functions and the state they use, so that no call can
 * find it unset. Worker 1 only calls: serve_or releases its copy. */
static void setup(void)
{
    server_thread = pthread_self();
    sem_init(&gate, 0, 0);
    stop = sr_future_new();
    sr_register("serve.where", fn_where);
    sr_register("serve.stop", fn_stop);
    sr_register("serve.take", fn_take);
    sr_register("serve.give", fn_give);
}

static void release_state(void)
{
    sr_future_unref(stop);
    sem_destroy(&gate);
}

/* Worker 0, before its bounded serve: the bound's errors and its end. */
static int timeout_checks(void)
{
    sr_future *never = sr_future_new();
    WCHECK(never, "sr_future_new");
    int rc = sr_serve_until_timeout(never, 0.05, NULL);
    WCHECK(rc == -ETIMEDOUT && strstr(sr_last_error(), "worker0") && strstr(sr_last_error(), "within 0.05 s"),
           "a future nobody completes, 0.05 s: %d '%s'", rc, sr_last_error());
    WCHECK(!sr_future_done(never), "the timed-out wait completed its future");
    rc = sr_serve_until_timeout(never, -1, NULL);
    WCHECK(rc == -EINVAL && strstr(sr_last_error(), "sr_serve_until_timeout"), "timeout -1: %d '%s'", rc,
           sr_last_error());
    WCHECK(sr_serve_until_timeout(never, NAN, NULL) == -EINVAL, "timeout NaN: %s", sr_last_error());
    WCHECK(sr_serve_until_timeout(NULL, 1, NULL) == -EINVAL, "future NULL: %s", sr_last_error());
    sr_value *seven = sr_int(7), *v = NULL;
    sr_future_set_result(never, seven); /* the future takes its own reference */
    sr_value_unref(seven);
    rc = sr_serve_until_timeout(never, 1, &v);
    WCHECK(rc == 0 && sr_value_int(v) == 7, "a done future: %d '%s'", rc, sr_last_error());
    sr_value_unref(v);
    sr_future_unref(never);
    return 0;
}

/* Worker 0 serves until worker 1 says stop (bounded: sr_serve_until_timeout,
 * after timeout_checks); worker 1 runs `client`. */
static int serve_or(int rank, int (*client)(void), bool bounded)
{
    WCHECK(stop, "sr_future_new (in setup)");
    if (rank == 0) {
        int rc = bounded ? timeout_checks() : 0;
        if (!rc)
            rc = bounded ? sr_serve_until_timeout(stop, SERVE_BOUND_S, NULL) : sr_serve_until(stop, NULL);
        release_state();
        WCHECK(rc == 0, "sr_serve_until: %d %s", rc, sr_last_error());
        return 0;
    }
    release_state();
    int rc = client();
    WCHECK(sr_rpc_sync(0, "serve.stop", SR_NOARGS, 0, NULL) == 0, "serve.stop: %s", sr_last_error());
    return rc;
}

/* Calls serve.where until one runs on the serving thread (bounded). */
static int where_client(void)
{
    int64_t until = now_ns() + (int64_t)SERVE_BOUND_S * 1000000000;
    long calls = 0;
    for (bool there = false; !there; calls++) {
        sr_value *v = NULL;
        WCHECK(sr_rpc_sync(0, "serve.where", SR_NOARGS, 0, &v) == 0, "serve.where: %s", sr_last_error());
        there = sr_value_bool(v);
        sr_value_unref(v);
        WCHECK(there || now_ns() < until,
               "none of %ld calls in %d s ran on the thread in sr_serve_until (all went to executors)", calls + 1,
               SERVE_BOUND_S);
    }
    return 0;
}

static int where_scenario(int rank, int world)
{
    (void)world;
    return serve_or(rank, where_client, false);
}

Test(serve, calls_run_on_the_serving_thread)
{
    RUN_JOB("serve_where", 2, .scenario = where_scenario, .register_fns = setup);
}

static int timeout_scenario(int rank, int world)
{
    (void)world;
    return serve_or(rank, where_client, true);
}

Test(serve, a_bounded_serve_times_out_then_serves)
{
    RUN_JOB("serve_timeout", 2, .scenario = timeout_scenario, .register_fns = setup);
}

/* PAIRS times: take and give sent back to back, so that they often arrive
 * in one burst; take returns only once give has run. */
static int pairs_client(void)
{
    for (int i = 0; i < PAIRS; i++) {
        sr_future *t = NULL, *g = NULL;
        WCHECK(sr_rpc_async(0, "serve.take", SR_NOARGS, 0, &t) == 0, "serve.take: %s", sr_last_error());
        WCHECK(sr_rpc_async(0, "serve.give", SR_NOARGS, 0, &g) == 0, "serve.give: %s", sr_last_error());
        int rt = sr_future_wait(t, NULL);
        int rg = sr_future_wait(g, NULL);
        sr_future_unref(t);
        sr_future_unref(g);
        WCHECK(rt == 0 && rg == 0, "pair %d: take %d, give %d: %s", i, rt, rg, sr_last_error());
    }
    return 0;
}

static int pairs_scenario(int rank, int world)
{
    (void)world;
    return serve_or(rank, pairs_client, false);
}

Test(serve, blocking_call_holds_up_no_other)
{
    RUN_JOB("serve_pairs", 2, .scenario = pairs_scenario, .register_fns = setup);
}
