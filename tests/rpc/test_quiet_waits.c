/* SPDX-License-Identifier: MIT */
/* Waits are events: nothing wakes while nothing is due.
 *
 * Each test puts a worker in a wait where nothing is due for a while and
 * counts the voluntary context switches (/proc/self/task/N/status) of its
 * threads over a window, leaving out the threads that measure or spin. The
 * window opens once every counted thread sleeps (/proc), so that a thread
 * still on its way to sleep on a loaded machine does not count. A
 * thread that sleeps on events only does not switch at all there; one on a
 * periodic timer switches once per period. The window is a measurement, not
 * a synchronisation: every state is reached by waiting for an event, and
 * with no periodic timer the count is 0 however long the window lasts.
 *
 * Both run in worker1, idle in sr_shutdown while worker0 holds back: the
 * idle waiter holds the inbox (the consumer token) and sleeps on the doorbell.
 *   progress_thread_sleeps_while_the_idle_waiter_holds_the_inbox: a call's
 *     expiry has woken worker1's progress thread, which must now wait for the
 *     inbox. It used to re-check its timers every 50 ms (TOKEN_WAIT_NS) for as
 *     long as a user thread held the inbox.
 *   idle_waiter_sleeps_in_shutdown: the idle waiter alone. It used to wake
 *     every 100 ms (IDLE_SLICE_NS), or every 2 ms while it could not take the
 *     inbox (IDLE_RETAKE_NS).
 *   a_response_wakes_its_sleeping_caller_directly: over 200 calls with
 *     nobody spinning, worker0's threads other than the caller stay asleep
 *     (the responses used to go through its progress thread; 9a).
 *   a_blocked_callback_waits_quietly: a callback that blocks on the idle
 *     waiter (a nested wait on a thread that holds the inbox) keeps polling,
 *     and sleeps on events only. It used to re-poll every 100 ms
 *     (IDLE_SLICE_NS), and the progress thread, waiting for the inbox, to
 *     re-check its timers every 50 ms (TOKEN_WAIT_NS).
 * Futex doorbell only: with eventfd, the idle waiter does not keep the inbox
 * and a sleeping caller hands the inbox back to the progress thread.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "helpers/held_futures.h"
#include "helpers/proc_state.h"
#include "rpc_harness.h"

LEAK_CHECKED_SUITE(quiet_waits);

#define WINDOW_MS 500   /* the old timers: 50 ms and 100 ms periods, so 5 to 10 wake-ups */
#define MAX_WAKES 1     /* allowance for one stray event (none is expected) */
#define EVENT_WAIT_S 30 /* bound on every wait for an event */

struct page {
    _Atomic uint32_t measured; /* futex: worker1's window is over */
    _Atomic int64_t wakes;     /* worker1's count over its window */
    _Atomic uint32_t token;    /* worker1's token during its window */
    _Atomic int32_t err;       /* how worker1's expiring call ended */
    _Atomic int32_t nested_rc; /* how worker1's blocked callback's wait ended */
    _Atomic uint32_t on_progress; /* worker1's callback ran on another thread than its idle waiter */
    _Atomic uint32_t ready;    /* futex: worker1's idle waiter holds the inbox */
    char who[256];             /* worker1's threads that woke, written before measured is set */
};
static struct page *pg;

#include "shared_event.h"

/* Wait (bounded) until this worker's token is one of the two states. */
static bool wait_token(uint32_t a, uint32_t b)
{
    int64_t deadline = now_ns() + (int64_t)EVENT_WAIT_S * 1000000000;
    for (;;) {
        uint32_t t = atomic_load(&sr__agent->token);
        if (t == a || t == b)
            return true;
        if (now_ns() > deadline)
            return false;
        sched_yield();
    }
}

/* Wait (bounded) until every executor thread has gone to sleep on the job
 * queue: threads started by sr_init may not have run yet, and their first
 * wait would count in a window. exec_idle is counted before the wait, under
 * q_lock, which the wait releases: taking q_lock after the count proves it. */
static bool executors_asleep(void)
{
    sr_agent *a = sr__agent;
    int64_t deadline = now_ns() + (int64_t)EVENT_WAIT_S * 1000000000;
    while (atomic_load(&a->exec_idle) != (uint32_t)atomic_load(&a->nexec)) {
        if (now_ns() > deadline)
            return false;
        sched_yield();
    }
    pthread_mutex_lock(&a->q_lock);
    pthread_mutex_unlock(&a->q_lock);
    return true;
}

#define MAX_THREADS 64

/* The threads of this process but skip[0..n), at most MAX_THREADS: their
 * number, or -1. */
static int counted_threads(const pid_t *skip, int n, pid_t *out)
{
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
    int k = 0;
    struct dirent *e;
    while ((e = readdir(d)) && k < MAX_THREADS) {
        pid_t tid = (pid_t)atoi(e->d_name);
        bool skipped = tid <= 0;
        for (int i = 0; i < n && !skipped; i++)
            skipped = tid == skip[i];
        if (!skipped)
            out[k++] = tid;
    }
    closedir(d);
    return k;
}

/* Thread tid's voluntary context switches, or -1 once it has ended. */
static int64_t thread_switches(pid_t tid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/task/%d/status", (int)tid);
    return proc_voluntary_switches(path);
}

/* Voluntary context switches of this process's threads, but skip[0..n). */
static int64_t voluntary_switches(const pid_t *skip, int n)
{
    pid_t tids[MAX_THREADS];
    int k = counted_threads(skip, n, tids);
    int64_t sum = k < 0 ? -1 : 0;
    for (int i = 0; i < k; i++) {
        int64_t v = thread_switches(tids[i]);
        sum += v > 0 ? v : 0;
    }
    return sum;
}

/* Whether thread tid sleeps ('S' in /proc/self/task/tid/stat). */
static bool thread_sleeps(pid_t tid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/task/%d/stat", (int)tid);
    return proc_stat_sleeps(path);
}

/* Wait (bounded) until every thread but skip[0..n) sleeps. The window
 * starts there: a thread still on its way to sleep (the idle waiter ending
 * its spin, the progress thread that has just found the inbox taken, a
 * callback entering its nested wait), preempted on a loaded machine, would
 * otherwise count its going to sleep as a wake-up. Once all sleep, with
 * nothing due and the measuring thread holding none of their locks, only a
 * timer can wake one. */
static bool all_asleep(const pid_t *skip, int n)
{
    int64_t deadline = now_ns() + (int64_t)EVENT_WAIT_S * 1000000000;
    for (;;) {
        pid_t tids[MAX_THREADS];
        int k = counted_threads(skip, n, tids);
        bool all = k >= 0;
        for (int i = 0; i < k && all; i++)
            all = thread_sleeps(tids[i]);
        if (all)
            return true;
        if (now_ns() > deadline)
            return false;
        sched_yield();
    }
}

/* The switches of the other threads over the window; who[] names the
 * threads that switched (tid, name, count) for the failure message. */
static int64_t wakes_over_window(const pid_t *skip, int n, char *who, size_t size)
{
    pid_t tids[MAX_THREADS];
    int64_t before[MAX_THREADS];
    int k = counted_threads(skip, n, tids);
    for (int i = 0; i < k; i++)
        before[i] = thread_switches(tids[i]);
    struct timespec ts = {.tv_sec = WINDOW_MS / 1000, .tv_nsec = (WINDOW_MS % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) && errno == EINTR) {
    }
    int64_t sum = k < 0 ? -1 : 0;
    size_t used = 0;
    who[0] = 0;
    for (int i = 0; i < k; i++) {
        int64_t d = thread_switches(tids[i]) - before[i];
        if (before[i] < 0 || d <= 0)
            continue;
        char name[16] = "?", path[64];
        snprintf(path, sizeof(path), "/proc/self/task/%d/comm", (int)tids[i]);
        FILE *f = fopen(path, "r");
        if (f && fgets(name, sizeof(name), f))
            name[strcspn(name, "\n")] = 0;
        if (f)
            fclose(f);
        sum += d;
        if (used < size)
            used += (size_t)snprintf(who + used, size - used, "%s%s (tid %d): %lld", used ? ", " : "", name,
                                     (int)tids[i], (long long)d);
    }
    return sum;
}

/* ---- worker0: hold, an async function answered once worker1 has measured ---- */

static _Atomic uint32_t holds_taken; /* futex: calls fn_hold has held so far */

static int fn_hold(sr_call *c, sr_future **out)
{
    int rc = hold_new(4, out);
    if (rc)
        return sr_call_fail(c, rc, "%s", rc == -ENOSPC ? "more than 4 holds" : "out of memory");
    atomic_fetch_add(&holds_taken, 1); /* seq_cst: pairs with wait_for's acquire load (shared_event.h) */
    syscall(SYS_futex, &holds_taken, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    return 0;
}

static void register_fns(void) { sr_register_async("hold", fn_hold); }

/* ---- the idle waiter in sr_shutdown ---- */

/* Worker1's measuring thread. Once its main thread is the idle waiter
 * holding the inbox, and (expiring) once a call's expiry has woken the
 * progress thread, which must then wait for the inbox, count the other
 * threads' wake-ups. */
static void *measure_idle(void *arg)
{
    bool expiring = arg != NULL;
    pid_t skip[1] = {(pid_t)syscall(SYS_gettid)};
    int64_t w = -1;
    int rc = 0;
    /* The idle waiter takes the inbox (the progress thread, if awake then,
     * may at once be waiting for it: USER_WAITING). */
    bool held = wait_token(TOKEN_USER, TOKEN_USER_WAITING);
    if (held && expiring) {
        sr_future *f;
        rc = sr_rpc_async(0, "hold", SR_NOARGS, 0.05, &f);
        if (!rc) {
            rc = sr_future_wait(f, NULL);
            sr_future_unref(f);
        }
        held = rc == -ETIMEDOUT && wait_token(TOKEN_USER_WAITING, TOKEN_USER_WAITING);
    }
    held = held && executors_asleep() && all_asleep(skip, 1);
    atomic_store(&pg->token, atomic_load(&sr__agent->token));
    if (held)
        w = wakes_over_window(skip, 1, pg->who, sizeof(pg->who));
    atomic_store(&pg->err, rc);
    atomic_store(&pg->wakes, w);
    set_and_wake(&pg->measured, 1);
    return NULL;
}

static int sc_idle(int rank, int world, bool expiring)
{
    (void)world;
    if (rank == 0) {
        /* twice the bound: each of worker1's waits is bounded by EVENT_WAIT_S */
        WCHECK(wait_for(&pg->measured, 1) || wait_for(&pg->measured, 1), "worker1 did not measure within %d s",
               2 * EVENT_WAIT_S);
        release_holds();
        int64_t w = atomic_load(&pg->wakes);
        WCHECK(!expiring || atomic_load(&pg->err) == -ETIMEDOUT, "worker1's expiring call ended with %d",
               atomic_load(&pg->err));
        WCHECK(w >= 0, "worker1's idle waiter never held the inbox in sr_shutdown%s, or its executors never all went "
               "idle, or its threads never all slept (token %u)", expiring ? " with the progress thread waiting for it" : "", atomic_load(&pg->token));
        WCHECK(w <= MAX_WAKES,
               "worker1 woke %lld times in %d ms while idle in sr_shutdown with nothing due (%s; token %u; %s)",
               (long long)w, WINDOW_MS, pg->who, atomic_load(&pg->token),
               expiring ? "the progress thread re-checking its timers while the idle waiter holds the inbox, or "
                          "the idle waiter's slices"
                        : "the idle waiter's periodic slices");
        return 0;
    }
    pthread_t th;
    WCHECK(pthread_create(&th, NULL, measure_idle, expiring ? pg : NULL) == 0, "pthread_create");
    pthread_detach(th); /* it ends before worker0 lets our sr_shutdown return */
    return 0;           /* the harness calls sr_shutdown: the idle waiter */
}

static int sc_idle_plain(int rank, int world) { return sc_idle(rank, world, false); }
static int sc_idle_expiring(int rank, int world) { return sc_idle(rank, world, true); }

static void skip_without_futex_doorbell(void)
{
    const char *kind = getenv("SHMRPC_DOORBELL");
    if (kind && !strcmp(kind, "eventfd"))
        cr_skip_test("with the eventfd doorbell the idle waiter hands the inbox back and sleeps on its future");
}

Test(quiet_waits, progress_thread_sleeps_while_the_idle_waiter_holds_the_inbox, .timeout = 120)
{
    skip_without_futex_doorbell();
    pg = shared_page(sizeof(*pg));
    RUN_JOB("quietprog", 2, .scenario = sc_idle_expiring, .register_fns = register_fns);
    munmap(pg, sizeof(*pg));
}

Test(quiet_waits, idle_waiter_sleeps_in_shutdown, .timeout = 120)
{
    skip_without_futex_doorbell();
    pg = shared_page(sizeof(*pg));
    RUN_JOB("quietidle", 2, .scenario = sc_idle_plain, .register_fns = register_fns);
    munmap(pg, sizeof(*pg));
}

/* ---- a response wakes its caller, not the progress thread ---- */

#define CALLS 200

static void register_no_spin(void)
{
    register_fns();
    /* Nobody spins (read by sr_init): every request and every response finds
     * its receiver asleep, as in bench_rpc's "both asleep". */
    setenv("SHMRPC_SPIN_NS", "0", 1);
}

/* Worker0's main thread makes CALLS calls, asleep while each is in flight;
 * its other threads (the progress thread, idle executors) must stay asleep:
 * each response wakes the caller directly. They used to wake once a call:
 * the response woke the parked progress thread, which completed the future
 * and woke the caller (bench_rpc's "both asleep"). A few
 * wake-ups remain legitimate: a response that lands before the caller has
 * taken the inbox (it was preempted after sending) wakes the progress thread. */
static int sc_direct(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0;
    pid_t skip[1] = {(pid_t)syscall(SYS_gettid)};
    for (int i = 0; i < 20; i++) /* warm up: thread starts, first allocations */
        WCHECK(sr_rpc_sync(1, "noop", SR_NOARGS, EVENT_WAIT_S, NULL) == 0, "noop: %s", sr_last_error());
    WCHECK(executors_asleep() && all_asleep(skip, 1), "worker0's executors did not all go idle, or its threads did "
           "not all sleep, within %d s", EVENT_WAIT_S);
    int64_t before = voluntary_switches(skip, 1);
    for (int i = 0; i < CALLS; i++)
        WCHECK(sr_rpc_sync(1, "noop", SR_NOARGS, EVENT_WAIT_S, NULL) == 0, "noop %d: %s", i, sr_last_error());
    int64_t wakes = voluntary_switches(skip, 1) - before;
    fprintf(stderr, "quiet_waits: %lld wake-ups of worker0's other threads in %d calls\n", (long long)wakes, CALLS);
    WCHECK(before >= 0 && wakes < CALLS / 4,
           "worker0's other threads woke %lld times during %d calls made by a sleeping caller (the responses went "
           "through the progress thread)", (long long)wakes, CALLS);
    return 0;
}

Test(quiet_waits, a_response_wakes_its_sleeping_caller_directly, .timeout = 120)
{
    skip_without_futex_doorbell();
    RUN_JOB("quietdirect", 2, .scenario = sc_direct, .register_fns = register_no_spin);
}

/* ---- a callback that blocks on the polling thread ---- */

static sr_future *nested_g;       /* what worker1's callback waits for: set once measured */
static _Atomic uint32_t nested_in; /* worker1's callback is about to wait */
static pid_t main_tid;

/* Runs on the thread that reads the response of worker1's call: the idle
 * waiter of sr_shutdown, which holds the inbox. It must keep polling while
 * it waits (agent.h, nested waits), and sleep on events only. */
static void cb_blocks(sr_future *f, void *arg)
{
    (void)f;
    (void)arg;
    atomic_store(&pg->on_progress, (pid_t)syscall(SYS_gettid) != main_tid);
    set_and_wake(&nested_in, 1);
    atomic_store(&pg->nested_rc, sr_future_wait(nested_g, NULL));
    sr_future_unref(nested_g); /* the callback's reference */
}

/* Worker1's measuring thread: once the idle waiter holds the inbox, let
 * worker0 answer the held call; once the callback blocks, count. */
static void *measure_nested(void *arg)
{
    (void)arg;
    pid_t skip[1] = {(pid_t)syscall(SYS_gettid)};
    int64_t w = -1;
    bool held = wait_token(TOKEN_USER, TOKEN_USER_WAITING);
    atomic_store(&pg->token, held);
    set_and_wake(&pg->ready, 1);
    if (held && wait_for(&nested_in, 1) && executors_asleep() && all_asleep(skip, 1))
        w = wakes_over_window(skip, 1, pg->who, sizeof(pg->who));
    atomic_store(&pg->wakes, w);
    sr_future_set_result(nested_g, NULL); /* the callback returns; sr_shutdown goes on */
    sr_future_unref(nested_g);            /* ours */
    set_and_wake(&pg->measured, 1);
    return NULL;
}

static int sc_nested(int rank, int world)
{
    (void)world;
    if (rank == 0) {
        WCHECK(wait_for(&pg->ready, 1), "worker1 did not start its sr_shutdown within %d s", EVENT_WAIT_S);
        WCHECK(wait_for(&holds_taken, 1), "worker1's call did not reach fn_hold within %d s", EVENT_WAIT_S);
        release_holds(); /* the response goes to worker1's idle waiter */
        /* twice the bound: each of worker1's waits is bounded by EVENT_WAIT_S */
        WCHECK(wait_for(&pg->measured, 1) || wait_for(&pg->measured, 1), "worker1 did not measure within %d s",
               2 * EVENT_WAIT_S);
        int64_t w = atomic_load(&pg->wakes);
        WCHECK(atomic_load(&pg->token), "worker1's idle waiter never held the inbox in sr_shutdown");
        WCHECK(!atomic_load(&pg->on_progress), "worker1's callback ran on another thread than its idle waiter");
        WCHECK(atomic_load(&pg->nested_rc) == 0, "worker1's blocked callback's wait ended with %d",
               atomic_load(&pg->nested_rc));
        WCHECK(w >= 0, "worker1's callback never blocked, or its executors never all went idle, or its threads never "
               "all slept");
        WCHECK(w <= MAX_WAKES,
               "worker1 woke %lld times in %d ms while a callback blocked on its idle waiter, which holds the inbox, "
               "with nothing due (%s: the nested wait's slices, or the progress thread's re-checks)", (long long)w,
               WINDOW_MS, pg->who);
        return 0;
    }
    main_tid = (pid_t)syscall(SYS_gettid);
    nested_g = sr_future_new(); /* one reference for the callback, one for the measuring thread */
    WCHECK(nested_g, "sr_future_new");
    sr_future_ref(nested_g);
    sr_future *f;
    WCHECK(sr_rpc_async(0, "hold", SR_NOARGS, EVENT_WAIT_S, &f) == 0, "hold: %s", sr_last_error());
    WCHECK(sr_future_add_done_callback(f, cb_blocks, NULL) == 0, "add_done_callback: %s", sr_last_error());
    sr_future_unref(f);
    pthread_t th;
    WCHECK(pthread_create(&th, NULL, measure_nested, NULL) == 0, "pthread_create");
    pthread_detach(th); /* it ends before our sr_shutdown returns: the callback waits for it */
    return 0;           /* the harness calls sr_shutdown: the idle waiter */
}

Test(quiet_waits, a_blocked_callback_waits_quietly, .timeout = 120)
{
    skip_without_futex_doorbell();
    pg = shared_page(sizeof(*pg));
    RUN_JOB("quietnested", 2, .scenario = sc_nested, .register_fns = register_fns);
    munmap(pg, sizeof(*pg));
}
