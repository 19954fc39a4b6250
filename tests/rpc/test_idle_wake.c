/* SPDX-License-Identifier: MIT */
/* The idle waiter is never left deaf by the progress thread's timer wake-up.
 *
 * A worker inside sr_shutdown (the idle waiter, lib/rpc/wait.c) may take the
 * inbox while the progress thread sleeps on the doorbell with a timer armed,
 * and then sleep on the same doorbell word itself. When the timer ends the
 * progress thread's sleep, it must not take the idle waiter's SLEEPING away
 * without waking it: producers would then see AWAKE, ring nobody, and a
 * request would wait for the end of the idle waiter's slice (the 100-200 ms
 * stalls of bench_dist_autograd; fixed in shm/waiter.c, take_back_sleeping).
 *
 * Nothing is timed, and every wait is for an event. Each round, worker0 asks
 * worker1 (idle in sr_shutdown) to call worker0 with a short timeout; worker0
 * answers no such call before the end. Worker1's idle waiter runs that request
 * after handing the inbox back, and returns only once the progress thread has
 * parked on the doorbell with the call's timer; it then takes the inbox back
 * and sleeps on the doorbell too: the trap. The timer wakes the progress
 * thread, which expires the call; the expiry's callback tells worker0, and
 * records who held worker1's inbox then: still the idle waiter (TOKEN_USER)
 * means the trap was set (otherwise, or when an executor ran the request
 * instead of the idle waiter, the round is tried again). Then worker0
 * sends worker1 requests, and each reports worker1's count of idle slices
 * that timed out with a message waiting and the doorbell no longer SLEEPING
 * (sr_agent.idle_missed_wakes): a producer that rang nobody. It must not
 * grow, but for the one race of the first request with the end of the idle
 * waiter's deadline-bounded sleep (below). Before the fix, the first request after a trap is such a lost wake-up: it
 * waits out the slice, and then reads its own miss.
 *
 * (Idle waiters no longer sleep in slices: they sleep on the doorbell as
 * SLEEPING_USER, which the progress thread's take-back leaves alone, until an
 * event. A lost wake-up would now last until the shutdown deadline, and the
 * requests below fail at their EVENT_WAIT_S bound.)
 *
 * The idle waiter sleeps on the doorbell only with the futex doorbell, so the
 * test skips itself under SHMRPC_DOORBELL=eventfd or without io_uring futexes. */
#include <criterion/criterion.h>
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "helpers/held_futures.h"
#include "rpc_harness.h"
#include "waiter.h"

LEAK_CHECKED_SUITE(idle_wake);

#define TRAPS 5                /* rounds that must set the trap */
#define MAX_ROUNDS 24          /* rounds tried to get them */
#define PINGS 3                /* requests worker0 sends after each expiry */
/* The timeout of worker1's call: half an idle slice (IDLE_SLICE_NS, 100 ms,
 * of the agent's waits before the fix). The idle waiter's slice starts just after the call does,
 * so before the fix it stays deaf for the other half after the expiry, ample
 * time for worker0's first request to land in it. */
#define CALL_TIMEOUT_S 0.05
#define EVENT_WAIT_S 30        /* bound on every wait for an event (none legitimately takes more than ms) */

/* Shared by the job's processes (mapped before sr_spawn). */
struct page {
    _Atomic uint32_t idle;              /* futex: worker1 is entering sr_shutdown */
    _Atomic uint32_t expired;           /* futex: the last round whose call expired on worker1 */
    _Atomic uint32_t token[MAX_ROUNDS]; /* worker1's token when that call expired */
    _Atomic int32_t err[MAX_ROUNDS];    /* how that call ended (want -ETIMEDOUT) */
};
static struct page *pg;

#include "shared_event.h"

/* ---- worker0: hold, an async function that answers only at the end ---- */

static int fn_hold(sr_call *c, sr_future **out)
{
    int rc = hold_new(MAX_ROUNDS, out);
    if (rc)
        return sr_call_fail(c, rc, "%s", rc == -ENOSPC ? "more holds than rounds" : "out of memory");
    return 0;
}

/* ---- worker1: arm a timer on its progress thread; report lost wake-ups ---- */

/* On worker1's progress thread, which just expired the call. */
static void on_hold_done(sr_future *f, void *arg)
{
    uint32_t round = (uint32_t)(uintptr_t)arg;
    atomic_store(&pg->err[round], sr_future_value(f, NULL));
    /* relaxed: the idle waiter holds it across its sleeps; we only classify the round */
    atomic_store(&pg->token[round], atomic_load_explicit(&sr__agent->token, memory_order_relaxed));
    set_and_wake(&pg->expired, round);
}

/* Worker1's thread that calls sr_shutdown: the idle waiter. */
static pthread_t idle_thread;

/* An executor runs arm: the progress thread polled it, the idle waiter is
 * between takes of the inbox. Answer once it holds the inbox again, so that
 * the next request reaches it rather than the progress thread. */
static int settle(sr_call *c, sr_agent *a, uint32_t round)
{
    int64_t deadline = now_ns() + (int64_t)EVENT_WAIT_S * 1000000000;
    uint32_t t;
    while ((t = atomic_load(&a->token)) != TOKEN_USER && t != TOKEN_USER_WAITING) {
        if (now_ns() > deadline)
            return sr_call_fail(c, -ETIMEDOUT, "round %u: the idle waiter did not take the inbox in %d s (token %u)",
                                round, EVENT_WAIT_S, t);
        sched_yield();
    }
    return sr_call_return(c, sr_bool(false));
}

/* arm(round, timeout_s) -> armed: call worker0's hold with that timeout,
 * whose expiry reports to worker0, and return only once the progress thread
 * has parked on the doorbell with the call's timer armed. Only when the idle
 * waiter runs it (a plain function it polls runs on it, after it handed the
 * inbox back): the progress thread takes the inbox meanwhile, and once this
 * returns the idle waiter takes it back from the parked progress thread and
 * sleeps on the doorbell too, the trap. (Returning at once would race the
 * idle waiter's retake against the progress thread's wake-up; when the idle
 * waiter wins, the progress thread waits out the timer on the token word
 * instead, away from the doorbell.) When the progress thread polled the
 * request (an executor runs it), the idle waiter is not ours to steer, and
 * the call is not made: the round is tried again. (A call started there, as
 * the idle waiter takes the inbox, can go unseen by the parked progress
 * thread until the next message arrives: in one run of an earlier version
 * of this test it had not expired 30 s later.) */
static int fn_arm(sr_call *c)
{
    sr_agent *a = sr__agent;
    uint32_t round = (uint32_t)sr_value_int(sr_call_arg(c, 0));
    double timeout = sr_value_double(sr_call_arg(c, 1));
    if (!pthread_equal(pthread_self(), idle_thread))
        return settle(c, a, round);
    sr_future *f;
    int rc = sr_rpc_async(0, "hold", SR_NOARGS, timeout, &f);
    if (rc)
        return sr_call_fail(c, rc, "hold: %s", sr_last_error());
    rc = sr_future_add_done_callback(f, on_hold_done, (void *)(uintptr_t)round);
    sr_future_unref(f);
    if (rc)
        return sr_call_fail(c, rc, "add_done_callback: %s", sr_last_error());
    /* The call's start kicked the progress thread (timer_gen); it arms a
     * sleep with that generation (armed_gen) before it parks. */
    uint32_t gen = atomic_load(&a->timer_gen);
    int64_t deadline = now_ns() + (int64_t)EVENT_WAIT_S * 1000000000;
    while (!(atomic_load(&a->token) == TOKEN_PARKED && atomic_load(&a->armed_gen) == gen)) {
        if (now_ns() > deadline)
            return sr_call_fail(c, -ETIMEDOUT, "round %u: the progress thread did not park with the timer in %d s "
                                "(token %u)", round, EVENT_WAIT_S, atomic_load(&a->token));
        sched_yield();
    }
    return sr_call_return(c, sr_bool(true));
}

static int fn_missed(sr_call *c)
{
    /* relaxed: a counter; this request itself is what it would have counted */
    return sr_call_return(c, sr_int((int64_t)atomic_load_explicit(&sr__agent->idle_missed_wakes,
                                                                  memory_order_relaxed)));
}

static void register_fns(void)
{
    sr_register_async("hold", fn_hold);
    sr_register("arm", fn_arm);
    sr_register("missed", fn_missed);
}

static const char *token_name(uint32_t t)
{
    static const char *names[] = {"FREE", "PROGRESS", "PARKED", "USER", "USER_WAITING"};
    return t < sizeof(names) / sizeof(*names) ? names[t] : "?";
}

static int rounds(void)
{
    WCHECK(wait_for(&pg->idle, 1), "worker1 did not reach sr_shutdown within %d s", EVENT_WAIT_S);
    double timeout = CALL_TIMEOUT_S;
    int traps = 0;
    int64_t missed_before = 0; /* worker1's idle_missed_wakes at the last request */
    uint32_t round;
    for (round = 1; round < MAX_ROUNDS && traps < TRAPS; round++) {
        sr_value *r = sr_int(round), *t = sr_double(timeout), *armed = NULL;
        int rc = sr_rpc_sync(1, "arm", SR_ARGS(r, t), EVENT_WAIT_S, &armed);
        sr_value_unref(r);
        sr_value_unref(t);
        WCHECK(rc == 0, "round %u: arm failed: %s", round, sr_last_error());
        bool made = sr_value_bool(armed);
        sr_value_unref(armed);
        if (!made)
            continue; /* an executor ran it: no call this round */
        WCHECK(wait_for(&pg->expired, round), "round %u: worker1's call (timeout %g s) did not expire within %d s",
               round, timeout, EVENT_WAIT_S);
        int err = atomic_load(&pg->err[round]);
        WCHECK(err == -ETIMEDOUT, "round %u: worker1's call to hold ended with %d, not -ETIMEDOUT", round, err);
        uint32_t tok = atomic_load(&pg->token[round]);
        bool trap = tok == TOKEN_USER;
        /* Worker1's idle waiter, if the trap is set, sleeps now. Each request
         * must wake it. The first one may race the end of the idle waiter's
         * own sleep, which is bounded by the call's deadline: when it lands
         * after that sleep timed out but before the idle waiter ran again,
         * the idle waiter finds it waiting and the doorbell AWAKE (the
         * request's own ring, too late for the sleep), which the counter
         * cannot tell from a ring that never came. So request 0 may add one;
         * the later ones none. A ring that never came to a sleep without a
         * deadline is a hang, caught by the requests' EVENT_WAIT_S bound; the
         * take-back itself is test_waiter's
         * a_sleep_leaves_a_user_sleepers_announcement_alone. */
        for (int k = 0; k < PINGS; k++) {
            sr_value *v = NULL;
            rc = sr_rpc_sync(1, "missed", SR_NOARGS, EVENT_WAIT_S, &v);
            WCHECK(rc == 0, "round %u, request %d: %s", round, k, sr_last_error());
            int64_t missed = sr_value_int(v);
            sr_value_unref(v);
            int64_t allowed = k == 0 ? missed_before + 1 : missed_before;
            WCHECK(missed <= allowed,
                   "round %u, request %d: worker1's idle waiter slept through %lld wake-up(s) (%lld allowed): a sleep "
                   "timed out with a request waiting and the doorbell no longer SLEEPING (the progress thread, woken "
                   "by its timer with the idle waiter holding the inbox (token %s), took SLEEPING away without a "
                   "wake)",
                   round, k, (long long)(missed - missed_before), (long long)(allowed - missed_before),
                   token_name(tok));
            missed_before = missed;
        }
        traps += trap;
    }
    fprintf(stderr, "idle_wake: %d of %u rounds set the trap\n", traps, round - 1);
    WCHECK(traps == TRAPS,
           "only %d of %u rounds expired worker1's call while its idle waiter held the inbox: the scenario did not "
           "happen, so this run tested nothing",
           traps, round - 1);
    return 0;
}

static int sc_idle_wake(int rank, int world)
{
    (void)world;
    if (rank == 1) {
        idle_thread = pthread_self();
        set_and_wake(&pg->idle, 1); /* and go idle: the harness calls sr_shutdown */
        return 0;
    }
    int rc = rounds();
    release_holds(); /* also after a failure: the graceful shutdown waits for every answer */
    return rc;
}

Test(idle_wake, timer_wake_keeps_idle_waiter_awake_to_the_doorbell, .timeout = 300)
{
    const char *kind = getenv("SHMRPC_DOORBELL");
    if ((kind && !strcmp(kind, "eventfd")) || !sr__waiter_futex_supported())
        cr_skip_test("the idle waiter sleeps on the doorbell only with the futex doorbell");
    pg = shared_page(sizeof(*pg));
    RUN_JOB("idlewake", 2, .scenario = sc_idle_wake, .register_fns = register_fns);
    munmap(pg, sizeof(*pg));
}
