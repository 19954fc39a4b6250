/* SPDX-License-Identifier: MIT */
/* The progress thread's spin, and a waiter's spin for it, give way to a
 * thread queued on their core (shm/base/spin.h; lib/rpc/progress.c,
 * progress_idle; lib/rpc/wait.c, steal_from_progress).
 *
 * Each test runs one worker whose progress thread is made SCHED_FIFO at
 * priority 1 on one CPU, with a 500 ms spin budget (RUN_SPINNING_JOB). Among
 * SCHED_FIFO threads of one priority on one CPU nothing preempts the
 * running one: the next runs only when it blocks or yields.
 *
 *   idle   the main thread (SCHED_FIFO, on another CPU) calls itself, so
 *          the progress thread serves the call and then spins, idle, for
 *          its budget. The main thread then moves onto the progress
 *          thread's CPU: it runs again only when the spin gives way.
 *          Without the yield it waits out the 500 ms spin.
 *   steal  the main thread, on the same CPU as the spinning progress
 *          thread, waits on a local future: it asks the progress thread to
 *          park the inbox and spins to take it (steal_from_progress). The
 *          progress thread can park only if the waiter gives way. A watcher
 *          on the other CPU completes the future once the main thread holds
 *          the inbox, or at its 250 ms bound, and fails the test then.
 *          Without the yield the waiter gives up its 20 µs steal, sleeps,
 *          and gets the inbox only when the progress thread's 500 ms spin
 *          ends.
 *
 * Both skip without permission for SCHED_FIFO (CAP_SYS_NICE) or with fewer
 * than two CPUs. Nothing sleeps for time: every wait is for an event, with
 * a bound. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"
#include "helpers/fifo.h"
#include "rpc_harness.h"

LEAK_CHECKED_SUITE(progress_spin);

#define GIVE_WAY_MS (SPIN_TEST_BUDGET_MS / 2) /* well under the spin budget, far above a few yields */
#define EVENT_WAIT_NS (10ll * 1000000000)

/* Thread t on CPU cpu, SCHED_FIFO at priority 1 (fifo), or back to
 * SCHED_OTHER on every CPU in all (!fifo). 0 or -errno. */
static int place(pthread_t t, bool fifo, int cpu, const cpu_set_t *all)
{
    struct sched_param p = {.sched_priority = fifo ? 1 : 0};
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    /* the policy first: a SCHED_OTHER thread queued behind a FIFO spinner would never run to set it */
    int rc = pthread_setschedparam(t, fifo ? SCHED_FIFO : SCHED_OTHER, &p);
    return rc ? -rc : -pthread_setaffinity_np(t, sizeof(cpu_set_t), fifo ? &one : all);
}

struct setup {
    cpu_set_t all;
    int spin_cpu, other_cpu; /* the progress thread's CPU, and the main thread's to begin with */
    pthread_t progress, self;
};

/* 1: skip (said why); 0: the progress thread is SCHED_FIFO on spin_cpu and
 * the caller on other_cpu; -1: failed (said why). */
static int setup(struct setup *s)
{
    if (sched_getaffinity(0, sizeof(s->all), &s->all) || CPU_COUNT(&s->all) < 2) {
        fprintf(stderr, "progress_spin: skipped: needs two CPUs\n");
        return 1;
    }
    s->spin_cpu = s->other_cpu = -1;
    for (int c = 0; c < CPU_SETSIZE && s->other_cpu < 0; c++)
        if (CPU_ISSET(c, &s->all))
            *(s->spin_cpu < 0 ? &s->spin_cpu : &s->other_cpu) = c;
    s->progress = sr__agent->progress;
    s->self = pthread_self();
    int rc = place(s->self, true, s->other_cpu, &s->all);
    if (rc == -EPERM) {
        fprintf(stderr, "progress_spin: skipped: no permission for SCHED_FIFO (needs CAP_SYS_NICE)\n");
        return 1;
    }
    if (!rc)
        rc = place(s->progress, true, s->spin_cpu, &s->all);
    if (rc)
        return fprintf(stderr, "worker0: SCHED_FIFO on one CPU: %s\n", strerror(-rc)), -1;
    return 0;
}

/* The progress thread back to SCHED_OTHER first (it may spin on, and the
 * main thread shares its CPU), then the caller. */
static void unplace(struct setup *s)
{
    place(s->progress, false, 0, &s->all);
    place(s->self, false, 0, &s->all);
}

/* The progress thread serves a call to this worker, then spins, idle, for
 * its budget (no user thread has polled: progress_spin_budget). */
static int start_idle_spin(void)
{
    sr_future *f = NULL;
    WCHECK(sr_rpc_async(0, "noop", SR_NOARGS, 0, &f) == 0, "sr_rpc_async: %s", sr_last_error());
    int64_t until = sr__now_ns() + EVENT_WAIT_NS;
    while (!sr_future_done(f) && sr__now_ns() < until)
        ; /* not a wait: a wait would take the inbox and stop the progress thread's spin */
    bool done = sr_future_done(f);
    sr_future_unref(f);
    WCHECK(done, "worker0: the progress thread did not serve a call to this worker in 10 s");
    return 0;
}

static int idle_scenario(int rank, int world)
{
    (void)rank, (void)world;
    struct setup s;
    int rc = setup(&s);
    if (rc)
        return rc > 0 ? 0 : 1;
    if (start_idle_spin()) {
        unplace(&s);
        return 1;
    }
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(s.spin_cpu, &one);
    int64_t t0 = sr__now_ns();
    rc = sched_setaffinity(0, sizeof(one), &one) ? -errno : 0; /* returns once this thread runs on the spinner's CPU */
    int64_t ms = (sr__now_ns() - t0) / 1000000;
    unplace(&s);
    WCHECK(rc == 0, "worker0: could not move onto CPU %d: %s", s.spin_cpu, strerror(-rc));
    WCHECK(ms < GIVE_WAY_MS, "worker0: the main thread ran on the idle progress thread's CPU only after %lld ms: the "
           "progress thread spun its 500 ms budget and did not give way", (long long)ms);
    return 0;
}

Test(progress_spin, an_idle_progress_thread_gives_way_to_a_thread_queued_on_its_core, .timeout = 120)
{
    RUN_SPINNING_JOB("progspin", idle_scenario);
}

/* ---- a waiter's steal ---- */

struct watch {
    sr_future *f;
    _Atomic int seen; /* 1: the main thread held the inbox; -1: the bound passed first */
};

/* On the other CPU, SCHED_OTHER: wait (bounded) for the main thread to hold
 * the inbox, then complete its future either way. */
static void *watcher(void *p)
{
    struct watch *w = p;
    struct sched_param other = {.sched_priority = 0};
    sched_setscheduler(0, SCHED_OTHER, &other);
    sr_agent *a = sr__agent;
    int64_t until = sr__now_ns() + (int64_t)GIVE_WAY_MS * 1000000;
    while (atomic_load(&a->token) != TOKEN_USER && sr__now_ns() < until)
        ;
    atomic_store(&w->seen, atomic_load(&a->token) == TOKEN_USER ? 1 : -1);
    sr_future_set_result(w->f, NULL);
    return NULL;
}

static int steal_scenario(int rank, int world)
{
    (void)rank, (void)world;
    struct setup s;
    int rc = setup(&s);
    if (rc)
        return rc > 0 ? 0 : 1;
    struct watch w = {.f = sr_future_new()};
    if (!w.f || start_idle_spin()) {
        unplace(&s);
        sr_future_unref(w.f);
        return 1;
    }
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(s.spin_cpu, &one);
    pthread_t t;
    /* started here, on this thread's CPU (the other one), at its policy:
     * it runs once this thread has moved away, and drops to SCHED_OTHER */
    rc = -pthread_create(&t, NULL, watcher, &w);
    bool started = !rc;
    if (!rc) /* onto the spinner's CPU: runs once the spin gives way (the test above) */
        rc = sched_setaffinity(0, sizeof(one), &one) ? -errno : 0;
    int waited = rc ? rc : sr_future_wait(w.f, NULL); /* the progress thread holds the inbox: steal it */
    if (started)
        pthread_join(t, NULL);
    unplace(&s);
    sr_future_unref(w.f);
    WCHECK(rc == 0, "worker0: setting up: %s", strerror(-rc));
    WCHECK(waited == 0, "sr_future_wait: %s", sr_last_error());
    WCHECK(atomic_load(&w.seen) == 1, "worker0: the waiter did not take the inbox from the spinning progress thread "
           "in %d ms: it did not give way, so the progress thread queued on its CPU could not park", GIVE_WAY_MS);
    return 0;
}

Test(progress_spin, a_waiter_gives_way_to_the_progress_thread_it_asks_to_park, .timeout = 120)
{
    RUN_SPINNING_JOB("progsteal", steal_scenario);
}
