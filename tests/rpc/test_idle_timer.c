/* SPDX-License-Identifier: MIT */
/* A call's timeout fires while another thread of its worker waits in
 * sr_shutdown holding the inbox (where a timer was suspected of being lost).
 *
 * Worker 0's main thread enters sr_shutdown and, as its idle waiter, holds
 * the inbox (token USER). Worker 1 calls worker 0's async function "trap",
 * which runs inline on whichever thread polls; when that is the idle waiter,
 * it starts a call with a 100 ms timeout to worker 1's "block", which does not
 * answer until the call has timed out (bounded). The call's start kicked the
 * progress thread, but while a user thread holds the inbox with its doorbell
 * AWAKE that kick rings nobody: a progress thread parked with an older timer
 * never learns of the deadline, and before the fix nobody else expired
 * calls. Now every thread that holds the inbox expires due calls and bounds
 * its sleep by the earliest deadline. Rounds where the progress thread ran
 * "trap" are retried; worker 1 waits for each outcome on an event, bounded.
 *
 * A contract test, not a reproducer: on the old code this passes too, since
 * the request that reaches the sleeping idle waiter also wakes the parked
 * progress thread, which then waits out the user's poll on the token word,
 * where a kick reaches it. The lost kick needs the request to arrive while
 * the idle waiter is awake right after taking the inbox from a parked
 * progress thread, a window this test cannot steer into. */
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "rpc_harness.h"

LEAK_CHECKED_SUITE(idle_timer);

#define ROUNDS 20       /* rounds whose call the idle waiter started */
#define MAX_TRIES 4000  /* trap calls in all */
#define WAIT_S 5        /* a call of 100 ms that has not failed by then never will */

static struct shared {
    _Atomic uint32_t outcome[ROUNDS]; /* 0: pending; 1: timed out; 2: anything else */
    _Atomic uint32_t errs[ROUNDS];
} *sh;

static pthread_t idle_thread; /* worker 0's main thread */

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Wait until *w != 0 or WAIT_S pass (shared futex: the page is MAP_SHARED). */
static uint32_t wait_word(_Atomic uint32_t *w)
{
    int64_t until = now_ns() + (int64_t)WAIT_S * 1000000000;
    uint32_t v;
    while (!(v = atomic_load(w)) && now_ns() < until) {
        int64_t left = until - now_ns();
        struct timespec ts = {left / 1000000000, left % 1000000000};
        syscall(SYS_futex, w, FUTEX_WAIT, 0, &ts, NULL, 0);
    }
    return v;
}

static void set_word(_Atomic uint32_t *w, uint32_t v)
{
    atomic_store(w, v);
    syscall(SYS_futex, w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0); /* worker1 waits twice: its main thread and block */
}

static void on_done(sr_future *f, void *arg)
{
    uint32_t round = (uint32_t)(uintptr_t)arg;
    int rc = sr_future_value(f, NULL);
    atomic_store(&sh->errs[round], (uint32_t)-rc);
    set_word(&sh->outcome[round], rc == -ETIMEDOUT ? 1 : 2);
}

/* trap(round) -> whether the idle waiter ran it (and started the call). */
static int fn_trap(sr_call *c, sr_future **out)
{
    uint32_t round = (uint32_t)sr_value_int(sr_call_arg(c, 0));
    bool mine = pthread_equal(pthread_self(), idle_thread);
    if (mine) {
        sr_value *r = sr_int(round);
        sr_future *f;
        int rc = sr_rpc_async(1, "block", SR_ARGS(r), 0.1, &f);
        sr_value_unref(r);
        if (rc)
            return sr_call_fail(c, rc, "rpc_async: %s", sr_last_error());
        rc = sr_future_add_done_callback(f, on_done, (void *)(uintptr_t)round);
        sr_future_unref(f);
        if (rc)
            return sr_call_fail(c, rc, "add_done_callback: %s", sr_last_error());
    }
    *out = sr_future_new();
    sr_value *v = sr_bool(mine);
    sr_future_set_result(*out, v);
    sr_value_unref(v);
    return 0;
}

/* block(round): answer once the caller's call has ended (bounded). */
static int fn_block(sr_call *c)
{
    uint32_t round = (uint32_t)sr_value_int(sr_call_arg(c, 0));
    wait_word(&sh->outcome[round]);
    return sr_call_return(c, sr_none());
}

static int scenario(int rank, int world)
{
    (void)world;
    if (rank == 0) {
        idle_thread = pthread_self();
        return 0; /* into sr_shutdown: the idle waiter */
    }
    int round = 0;
    for (int tries = 0; round < ROUNDS && tries < MAX_TRIES; tries++) {
        sr_value *r = sr_int(round), *v = NULL;
        int rc = sr_rpc_sync(0, "trap", SR_ARGS(r), 10, &v);
        sr_value_unref(r);
        WCHECK(rc == 0, "trap: %s", sr_last_error());
        bool mine = sr_value_bool(v);
        sr_value_unref(v);
        if (!mine)
            continue; /* the progress thread ran it: try again */
        uint32_t o = wait_word(&sh->outcome[round]);
        WCHECK(o != 0, "round %d: a call with a 100 ms timeout, started while worker0's idle waiter held the inbox, "
               "had not ended %d s later (lost timer)", round, WAIT_S);
        WCHECK(o == 1, "round %d: the call ended with error %u, not -ETIMEDOUT", round, atomic_load(&sh->errs[round]));
        round++;
    }
    WCHECK(round == ROUNDS, "only %d of %d rounds ran on the idle waiter in %d tries", round, ROUNDS, MAX_TRIES);
    return 0;
}

static void register_fns(void)
{
    sr_register_async("trap", fn_trap);
    sr_register("block", fn_block);
}

Test(idle_timer, call_times_out_while_the_idle_waiter_holds_the_inbox)
{
    sh = shared_page(sizeof(*sh));
    RUN_JOB("idle_timer", 2, .scenario = scenario, .register_fns = register_fns, .shutdown_timeout = 100);
}
