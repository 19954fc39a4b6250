/* SPDX-License-Identifier: MIT */
/* sr_debug_info's sleeps_taken counts the sleeps of a user thread that holds
 * the inbox while it waits (lib/rpc/wait.c, holder_sleep: the transport's
 * hold_sleep), not only the progress thread's.
 *
 * Worker0's main thread takes its inbox (sr__agent_pretake, as sr_rpc_sync
 * does, retried until the idle progress thread has parked it) and then
 * calls worker1's "block", which answers only once "release" is called:
 * the main thread holds the inbox for the whole wait, so only it can sleep
 * on the doorbell meanwhile, and with nothing to read it does. A watcher
 * thread of worker0 reads sleeps_taken once the inbox is held and before
 * the main thread starts its wait, waits for it to grow while the main
 * thread still holds the inbox, and then calls
 * "release". Before the count, sleeps_taken stays put and the watcher fails
 * at its bound (then releases anyway, so that the job ends). Nothing is
 * timed: every wait is for an event, with a bound.
 *
 * The holder sleeps on the doorbell only with the futex doorbell: the test
 * skips itself under SHMRPC_DOORBELL=eventfd or without futex support.
 *
 * And a holder's spin gives way (shm/base/spin.h): worker0's main thread
 * holds its inbox and waits on a future that a second thread completes,
 * both SCHED_FIFO at one priority on one CPU, so the second thread runs
 * only when the spinner gives way. With a 500 ms spin budget the wait ends
 * at once with the yield, and after the budget without it. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"
#include "helpers/fifo.h"
#include "rpc_harness.h"
#include "thread.h"
#include "waiter.h"

LEAK_CHECKED_SUITE(holder_sleeps);

#define EVENT_WAIT_S 10 /* bound on every wait for an event (none legitimately takes more than ms) */

/* ---- worker1: block answers once release is called ---- */

static sr_future *gate;

static int block_fn(sr_call *c) { return sr_future_wait(gate, NULL) ? -EIO : sr_call_return(c, NULL); }
static int release_fn(sr_call *c)
{
    sr_future_set_result(gate, NULL);
    return sr_call_return(c, NULL);
}

static void register_fns(void)
{
    sr_register("block", block_fn);
    sr_register("release", release_fn);
    gate = sr_future_new();
}

/* ---- worker0 ---- */

static int64_t deadline_in(int s) { return sr__now_ns() + (int64_t)s * 1000000000; }

static uint64_t sleeps_now(void)
{
    sr_debug_info d;
    return sr_debug_info_get(&d) == 0 ? d.sleeps_taken : UINT64_MAX;
}

/* 1: the main thread holds the inbox for its wait; 2: the watcher has read
 * sleeps_taken, the main thread may wait (and sleep) now. */
static _Atomic int stage;

/* Wait (bounded) for stage to reach s: false at the bound. */
static bool stage_reached(int s)
{
    int64_t until = deadline_in(EVENT_WAIT_S);
    while (atomic_load(&stage) < s && sr__now_ns() < until)
        sched_yield();
    return atomic_load(&stage) >= s;
}

/* The watcher: 0, or 1 with the reason on stderr. Releases worker1's block
 * on every way out. */
static void *watch(void *arg)
{
    (void)arg;
    uintptr_t bad = 1;
    if (!stage_reached(1)) {
        fprintf(stderr, "worker0: the main thread did not take its inbox in %d s\n", EVENT_WAIT_S);
    } else {
        uint64_t s0 = sleeps_now(), s = s0;
        atomic_store(&stage, 2); /* the main thread's sleeps come after s0 */
        int64_t until = deadline_in(EVENT_WAIT_S);
        while ((s = sleeps_now()) == s0 && sr__now_ns() < until)
            sched_yield();
        uint32_t tok = atomic_load(&sr__agent->token); /* the main thread's wait is not over: still its */
        if (s == s0 || s == UINT64_MAX)
            fprintf(stderr,
                    "worker0: sleeps_taken stayed at %llu for %d s while the main thread held the inbox "
                    "(token %u), waiting for an answer that could not come\n",
                    (unsigned long long)s0, EVENT_WAIT_S, tok);
        else if (tok != TOKEN_USER && tok != TOKEN_USER_WAITING) /* WAITING: the progress thread waits for it */
            fprintf(stderr, "worker0: sleeps_taken grew (%llu -> %llu) but the inbox is no longer held (token %u)\n",
                    (unsigned long long)s0, (unsigned long long)s, tok);
        else
            bad = 0;
    }
    if (sr_rpc_sync(1, "release", SR_NOARGS, EVENT_WAIT_S, NULL)) {
        fprintf(stderr, "worker0: release: %s\n", sr_last_error());
        bad = 1;
    }
    return (void *)bad;
}

/* Take the inbox for this thread's next wait: the progress thread parks it
 * once it has nothing to read. */
static int take_inbox(sr_agent *a)
{
    int64_t until = deadline_in(EVENT_WAIT_S);
    for (sr__agent_pretake(a); sr__thr.pretaken != a; sr__agent_pretake(a)) {
        WCHECK(sr__now_ns() < until, "worker0: could not take the inbox from the progress thread in %d s (token %u)",
               EVENT_WAIT_S, atomic_load(&a->token));
        sched_yield();
    }
    return 0;
}

static int scenario(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0;
    pthread_t w;
    WCHECK(pthread_create(&w, NULL, watch, NULL) == 0, "pthread_create failed");
    int rc = take_inbox(sr__agent);
    if (!rc) {
        atomic_store(&stage, 1);
        if (!stage_reached(2)) {
            fprintf(stderr, "worker0: the watcher did not read sleeps_taken in %d s\n", EVENT_WAIT_S);
            sr__agent_unhold(sr__agent);
            rc = 1;
        } else if ((rc = sr_rpc_sync(1, "block", SR_NOARGS, 3 * EVENT_WAIT_S, NULL))) {
            /* sr_rpc_sync's own pretake found the inbox taken: its wait used it (wait.c, sr__agent_wait_user) */
            fprintf(stderr, "worker0: block: %s\n", sr_last_error());
        }
    }
    void *bad = (void *)1;
    pthread_join(w, &bad);
    WCHECK(!rc && !bad, "see above");
    return 0;
}

Test(holder_sleeps, a_waiter_holding_the_inbox_counts_its_sleeps, .timeout = 120)
{
    const char *kind = getenv("SHMRPC_DOORBELL");
    if ((kind && !strcmp(kind, "eventfd")) || !sr__waiter_futex_supported())
        cr_skip_test("a waiter holding the inbox sleeps on the doorbell only with the futex doorbell");
    RUN_JOB("holdsleep", 2, .scenario = scenario, .register_fns = register_fns);
}

/* ---- a holder's spin gives way to a thread queued on its core ---- */

static void *complete(void *f)
{
    sr_future_set_result(f, NULL);
    return NULL;
}

static int give_way_scenario(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0;
    sr_future *f = sr_future_new();
    WCHECK(f, "sr_future_new failed");
    pthread_attr_t attr;
    int rc = fifo_on_cpu(sched_getcpu(), &attr);
    if (rc == -EPERM) {
        fprintf(stderr, "holder_sleeps: skipped: no permission for SCHED_FIFO (needs CAP_SYS_NICE)\n");
        sr_future_unref(f);
        return 0;
    }
    WCHECK(rc == 0, "SCHED_FIFO on one CPU: %s", strerror(-rc));
    rc = take_inbox(sr__agent); /* the wait below polls with it: it spins, it does not sleep aside */
    pthread_t t;
    if (!rc)
        rc = pthread_create(&t, &attr, complete, f) ? -EAGAIN : 0; /* queued behind this thread's spin */
    int64_t t0 = sr__now_ns();
    int waited = rc ? rc : sr_future_wait(f, NULL);
    int64_t ms = (sr__now_ns() - t0) / 1000000;
    if (!rc)
        pthread_join(t, NULL);
    pthread_attr_destroy(&attr);
    struct sched_param other = {0};
    sched_setscheduler(0, SCHED_OTHER, &other);
    sr_future_unref(f);
    WCHECK(rc == 0, "could not take the inbox or start the completer: %d", rc);
    WCHECK(waited == 0, "sr_future_wait: %s", sr_last_error());
    WCHECK(ms < 250, "the wait took %lld ms: the holder spun its 500 ms budget before the completer queued on its "
           "core could run (it did not give way)", (long long)ms);
    return 0;
}

Test(holder_sleeps, a_holders_spin_gives_way_to_a_thread_queued_on_its_core, .timeout = 120)
{
    RUN_SPINNING_JOB("holdgive", give_way_scenario);
}
