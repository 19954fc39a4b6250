/* SPDX-License-Identifier: MIT */
/* The waiter alone, in one process: deadlines (the standalone timer that
 * stays armed across sleeps), a sleep from a second thread (the first sleep
 * binds a single-issuer ring to its thread), shutdown from another thread,
 * and a doorbell rung by another thread. meson runs this binary once with
 * the probed doorbell and once with SHMRPC_DOORBELL=eventfd. Also the aside
 * sleep and its kick, and the take-back that leaves SLEEPING_USER alone;
 * and that the doorbell probe leaves its caller no stray wake-up.
 *
 * The ringing thread acts on the handshake itself: it rings only once it
 * sees the word announce SLEEPING, so no test depends on sleeping for luck. */
#include <criterion/criterion.h>
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "doorbell.h"
#include "error.h"
#include "waiter.h"

#define MS 1000000ll
#define BOUND_NS (5000 * MS) /* no step of these tests legitimately takes this long */

LEAK_CHECKED_SUITE(waiter);

struct fixture {
    sr_waiter w;
    _Atomic uint32_t word;
    int efd;
};

static void fixture_init(struct fixture *f)
{
    atomic_init(&f->word, SR_DOORBELL_AWAKE);
    f->efd = eventfd(0, EFD_CLOEXEC);
    cr_assert_geq(f->efd, 0);
    cr_assert_eq(sr__waiter_init(&f->w, &f->word, f->efd, 0), 0, "init: %s", sr_last_error());
}

static void fixture_fini(struct fixture *f)
{
    sr__waiter_fini(&f->w);
    close(f->efd);
}

static bool never_ready(void *arg)
{
    (void)arg;
    return false;
}

/* Ring the doorbell as a producer would, once the sleeper has announced. */
static void *ringer(void *p)
{
    struct fixture *f = p;
    int64_t until = sr__now_ns() + BOUND_NS;
    /* relaxed: we only watch for the announcement; sr__doorbell_ring's D3
     * fence does the ordering that matters */
    while (atomic_load_explicit(&f->word, memory_order_relaxed) != SR_DOORBELL_SLEEPING && sr__now_ns() < until)
        sched_yield();
    sr__doorbell_ring(&f->word, f->w.kind, f->efd);
    return NULL;
}

static int sleep_rung(struct fixture *f, int64_t deadline_ns)
{
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, ringer, f), 0);
    int ev = sr__waiter_sleep(&f->w, deadline_ns, never_ready, NULL);
    pthread_join(t, NULL);
    return ev;
}

/* Sleep with nothing to wake us; returns the events and the time slept. */
static int sleep_idle(struct fixture *f, int64_t deadline_ns, int64_t *slept_ns)
{
    int64_t t0 = sr__now_ns();
    int ev = sr__waiter_sleep(&f->w, deadline_ns, never_ready, NULL);
    *slept_ns = sr__now_ns() - t0;
    return ev;
}

Test(waiter, deadline_passes_with_nothing_to_wake)
{
    struct fixture f;
    fixture_init(&f);
    int64_t slept;
    int ev = sleep_idle(&f, sr__now_ns() + 20 * MS, &slept);
    cr_assert_eq(ev, (int)SR_WAKE_TIMEOUT, "events %d (%s)", ev, ev < 0 ? sr_last_error() : "");
    cr_assert_geq(slept, 20 * MS, "woke %lld ns early", (long long)(20 * MS - slept));
    cr_assert_lt(slept, BOUND_NS);
    fixture_fini(&f);
}

Test(waiter, doorbell_wakes_a_sleep_without_deadline)
{
    struct fixture f;
    fixture_init(&f);
    for (int i = 0; i < 3; i++) { /* the wait is re-armed after each wake-up */
        int ev = sleep_rung(&f, -1);
        cr_assert_eq(ev, (int)SR_WAKE_DOORBELL, "round %d: events %d", i, ev);
        /* relaxed: written by this thread (the sleeper) or the joined ringer */
        cr_assert_eq(atomic_load_explicit(&f.word, memory_order_relaxed), SR_DOORBELL_AWAKE);
    }
    fixture_fini(&f);
}

/* The first sleep leaves its timer armed 10 s out; a later sleep that needs
 * an earlier deadline must move it, not sleep 10 s. */
Test(waiter, an_earlier_deadline_moves_the_armed_timer)
{
    struct fixture f;
    fixture_init(&f);
    cr_assert_eq(sleep_rung(&f, sr__now_ns() + 10000 * MS), (int)SR_WAKE_DOORBELL);
    int64_t slept;
    int ev = sleep_idle(&f, sr__now_ns() + 20 * MS, &slept);
    cr_assert_eq(ev, (int)SR_WAKE_TIMEOUT, "events %d", ev);
    cr_assert_geq(slept, 20 * MS);
    cr_assert_lt(slept, 5000 * MS, "slept %lld ms: the 10 s timer was not moved", (long long)(slept / MS));
    fixture_fini(&f);
}

/* A timer armed for an earlier sleep fires during a later, longer one: that
 * is not this sleep's timeout. The first sleep's deadline leaves the ringer
 * a second (it once took over 30 ms to run on a loaded machine, and the
 * sleep timed out instead). */
Test(waiter, an_old_timer_firing_early_is_not_a_timeout)
{
    struct fixture f;
    fixture_init(&f);
    cr_assert_eq(sleep_rung(&f, sr__now_ns() + 1000 * MS), (int)SR_WAKE_DOORBELL);
    int64_t slept;
    int ev = sleep_idle(&f, sr__now_ns() + 1500 * MS, &slept);
    cr_assert_eq(ev, (int)SR_WAKE_TIMEOUT, "events %d", ev);
    cr_assert_geq(slept, 1500 * MS, "returned after %lld ms, at the old timer", (long long)(slept / MS));
    fixture_fini(&f);
}

static void *sleep_in_thread(void *p)
{
    struct fixture *f = p;
    int64_t slept;
    int ev = sleep_idle(f, sr__now_ns() + 5 * MS, &slept);
    return (void *)(intptr_t)ev;
}

/* The first sleep binds a single-issuer ring to its thread; a sleep from
 * another thread must still work (the ring is rebuilt as a plain one). */
Test(waiter, a_second_thread_can_sleep)
{
    struct fixture f;
    fixture_init(&f);
    int64_t slept;
    cr_assert_eq(sleep_idle(&f, sr__now_ns() + 5 * MS, &slept), (int)SR_WAKE_TIMEOUT);
    pthread_t t;
    void *ev;
    cr_assert_eq(pthread_create(&t, NULL, sleep_in_thread, &f), 0);
    pthread_join(t, &ev);
    cr_assert_eq((int)(intptr_t)ev, (int)SR_WAKE_TIMEOUT, "second thread: events %d (%s)", (int)(intptr_t)ev,
                 sr_last_error());
    cr_assert_eq(sleep_rung(&f, sr__now_ns() + BOUND_NS), (int)SR_WAKE_DOORBELL, "the doorbell after the switch");
    fixture_fini(&f);
}

static void *notify(void *p)
{
    struct fixture *f = p;
    int64_t until = sr__now_ns() + BOUND_NS;
    /* relaxed: we only watch for the announcement; the eventfd write wakes */
    while (atomic_load_explicit(&f->word, memory_order_relaxed) != SR_DOORBELL_SLEEPING && sr__now_ns() < until)
        sched_yield();
    sr__waiter_notify_shutdown(&f->w);
    return NULL;
}

Test(waiter, shutdown_from_another_thread_wakes_and_sticks)
{
    struct fixture f;
    fixture_init(&f);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, notify, &f), 0);
    int ev = sr__waiter_sleep(&f.w, sr__now_ns() + BOUND_NS, never_ready, NULL);
    pthread_join(t, NULL);
    cr_assert(ev > 0 && (ev & SR_WAKE_SHUTDOWN), "events %d", ev);
    ev = sr__waiter_sleep(&f.w, sr__now_ns() + BOUND_NS, never_ready, NULL);
    cr_assert(ev > 0 && (ev & SR_WAKE_SHUTDOWN), "shutdown is sticky: events %d", ev);
    fixture_fini(&f);
}

static void *kicker(void *p)
{
    sr__waiter_kick(p);
    return NULL;
}

/* The progress thread's sleep while a user thread holds the inbox: only a
 * kick (from any thread, before or during the sleep) ends it, and it leaves
 * the doorbell word, which the user thread owns meanwhile, alone. */
Test(waiter, a_kick_ends_an_aside_sleep_and_the_word_is_left_alone)
{
    struct fixture f;
    fixture_init(&f);
    for (int i = 0; i < 3; i++) {
        /* relaxed: single-threaded here; the kicker does not read it */
        atomic_store_explicit(&f.word, SR_DOORBELL_SLEEPING_USER, memory_order_relaxed);
        pthread_t t;
        cr_assert_eq(pthread_create(&t, NULL, kicker, &f.w), 0);
        if (i == 1) /* a kick made before the sleep is not lost (the eventfd keeps it) */
            pthread_join(t, NULL);
        int ev = sr__waiter_sleep_aside(&f.w, sr__now_ns() + BOUND_NS, never_ready, NULL);
        if (i != 1)
            pthread_join(t, NULL);
        cr_assert(ev > 0 && (ev & SR_WAKE_KICK) && !(ev & SR_WAKE_TIMEOUT), "round %d: events %d", i, ev);
        /* relaxed: as above */
        cr_assert_eq(atomic_load_explicit(&f.word, memory_order_relaxed), SR_DOORBELL_SLEEPING_USER,
                     "round %d: the aside sleep changed the doorbell word", i);
    }
    fixture_fini(&f);
}

/* Stands in for a user thread that takes the inbox while the progress
 * thread sleeps: it announces SLEEPING_USER, and the sleep is then ended by
 * a kick (a timer, say). */
static bool user_announces(void *p)
{
    struct fixture *f = p;
    /* relaxed: the same thread reads it back after the sleep */
    atomic_store_explicit(&f->word, SR_DOORBELL_SLEEPING_USER, memory_order_relaxed);
    sr__waiter_kick(&f->w);
    return false;
}

/* The progress thread's take-back after its sleep leaves a user thread's
 * SLEEPING_USER alone: taking it would leave that thread deaf to producers,
 * who would see AWAKE and ring nobody. */
Test(waiter, a_sleep_leaves_a_user_sleepers_announcement_alone)
{
    struct fixture f;
    fixture_init(&f);
    for (int i = 0; i < 3; i++) {
        int ev = sr__waiter_sleep(&f.w, sr__now_ns() + BOUND_NS, user_announces, &f);
        cr_assert(ev > 0 && (ev & SR_WAKE_KICK) && !(ev & SR_WAKE_TIMEOUT), "round %d: events %d", i, ev);
        /* relaxed: written by this thread */
        cr_assert_eq(atomic_load_explicit(&f.word, memory_order_relaxed), SR_DOORBELL_SLEEPING_USER,
                     "round %d: the sleep's take-back replaced SLEEPING_USER", i);
        atomic_store_explicit(&f.word, SR_DOORBELL_AWAKE, memory_order_relaxed); /* relaxed: as above */
    }
    fixture_fini(&f);
}

/* The doorbell probe (the first sr__waiter_init of a process) creates and
 * closes a ring of its own. The kernel tears a used ring down later, from a
 * worker, and signals the thread that used it with task work: a sleep of
 * that thread then ends and restarts, one stray wake-up (which the idle
 * waiter of sr_shutdown, often sr_init's thread, used to show in
 * quiet_waits). The probe now runs on a thread that has ended before it
 * returns. A sleep of 200 ms right after the probe, on a word that nobody
 * wakes, must cost exactly one voluntary switch: the sleep itself (the
 * teardown comes some milliseconds after the close, inside the window). */
Test(waiter, the_doorbell_probe_leaves_its_caller_no_stray_wake)
{
    _Atomic uint32_t word = 0;
    (void)sr__waiter_futex_supported(); /* this process's first probe */
    long long before = proc_voluntary_switches("/proc/thread-self/status");
    struct timespec ts = {0, 200 * MS};
    long rc = syscall(SYS_futex, &word, FUTEX_WAIT_PRIVATE, 0, &ts, NULL, 0);
    long long woke = proc_voluntary_switches("/proc/thread-self/status") - before;
    cr_assert(rc == -1 && errno == ETIMEDOUT, "the futex wait ended with %ld (errno %d), not its timeout", rc, errno);
    cr_assert_geq(before, 0, "cannot read /proc/thread-self/status");
    cr_assert_eq(woke, 1, "a 200 ms sleep right after the doorbell probe had %lld stray wake-ups: the probe's ring teardown "
                 "signalled this thread", woke - 1);
}
