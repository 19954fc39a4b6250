/* SPDX-License-Identifier: MIT */
/* The progress thread (agent.h): it polls the inbox while no user thread
 * holds the token, sleeps in the transport when idle or aside while a user
 * holds it, fires the timers, and runs nested waits of callbacks on it.
 * The waits' entry points start here, because a wait on this thread runs
 * the progress loop; every other wait is the token's (wait.c). */
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "agent.h"
#include "error.h"
#include "module.h"
#include "reorder.h"
#include "spin.h"
#include "thread.h"

/* K2: the timers changed since the progress thread armed its sleep. */
static bool timers_moved(sr_agent *a)
{
    /* relaxed: both are hints; see sr__agent_kick */
    return atomic_load_explicit(&a->timer_gen, memory_order_relaxed) !=
           atomic_load_explicit(&a->armed_gen, memory_order_relaxed);
}

/* The futures' wake hook: a future that a poller sleeps on completed. */
static void wake_hook(void)
{
    sr_agent *a = sr__agent_get(NULL);
    if (a) {
        a->wake->poke(a->self);
        sr__agent_put(a);
    }
}

static bool progress_take(sr_agent *a)
{
    uint32_t t = atomic_load_explicit(&a->token, memory_order_relaxed); /* relaxed: the CAS validates */
    for (;;) {
        if (t == TOKEN_PROGRESS)
            return true;
        if (t == TOKEN_USER || t == TOKEN_USER_WAITING)
            return false;
        /* acquire: pairs with the release that handed the token back */
        if (atomic_compare_exchange_weak_explicit(&a->token, &t, TOKEN_PROGRESS, memory_order_acquire,
                                                  memory_order_relaxed))
            return true;
    }
}

static int64_t next_deadline(sr_agent *a)
{
    int64_t d = atomic_load_explicit(&a->earliest_deadline, memory_order_relaxed); /* relaxed: a hint */
    return sr__earlier(d, sr__reorder_next(a));
}

/* K3 half of the kick protocol: record the timer generation our next sleep's
 * deadline will include. */
static void arm_timers(sr_agent *a)
{
    /* relaxed: the generation is read before the deadlines it vouches for (K3) */
    atomic_store_explicit(&a->armed_gen, atomic_load_explicit(&a->timer_gen, memory_order_relaxed),
                          memory_order_relaxed);
    /* K3: pairs with the release bump in sr__agent_kick: the deadlines read
     * after this include every kick up to the generation armed above */
    atomic_thread_fence(memory_order_acquire);
}

struct park_ctx {
    sr_agent *a;
    sr_future *f; /* a nested wait's future, or NULL */
};

/* Checked by the aside sleep: the token came back, or there is work. */
static bool token_back(void *p)
{
    struct park_ctx *c = p;
    sr_agent *a = c->a;
    /* relaxed (token, stopping): hints; progress_take's acquire CAS takes the token */
    return atomic_load_explicit(&a->token, memory_order_relaxed) != TOKEN_USER_WAITING ||
           atomic_load_explicit(&a->stopping, memory_order_relaxed) || timers_moved(a) ||
           (c->f && sr_future_done(c->f)) || sr__agent_exits_pending(a);
}

/* A user thread holds the token (it polls, or sleeps on the doorbell): sleep
 * aside on what still needs this thread, the timers, the peers' deaths,
 * shutdown, and f (a nested wait's: its POLLER bit has the completer kick
 * us through the wake hook), until the user hands the token back
 * (user_release kicks us). Nothing periodic: with no deadline the sleep has
 * no timeout, and kicks are level-triggered, so none made before the sleep
 * is lost. Departures: the holder checks for them before it sleeps, and the
 * check here is a hint. */
static int progress_wait_token(sr_agent *a, sr_future *f, int64_t deadline)
{
    uint32_t t = TOKEN_USER;
    /* relaxed: the hand-back is a seq_cst store, taken by progress_take's acquire CAS */
    if (!atomic_compare_exchange_strong_explicit(&a->token, &t, TOKEN_USER_WAITING, memory_order_relaxed,
                                                 memory_order_relaxed) && t != TOKEN_USER_WAITING)
        return 0;
    if (f && !sr__future_arm_wake(f))
        return 0;
    arm_timers(a);
    struct park_ctx c = {a, f};
    return a->wake->sleep_aside(a->self, sr__earlier(next_deadline(a), deadline), token_back, &c);
}

/* Called by the waiter after announcing sleep: park, unless there is work. */
static bool park_ready(void *p)
{
    struct park_ctx *c = p;
    sr_agent *a = c->a;
    /* relaxed (stopping): a hint to skip the sleep; sr__agent_stop also notifies the waiter */
    if (sr__agent_inbox_ready(a) || atomic_load_explicit(&a->stopping, memory_order_relaxed) || timers_moved(a) ||
        sr__tport_space_kicked(a->self) || (c->f && sr_future_done(c->f)) ||
        sr__agent_exits_pending(a)) /* after D2: the supervisor's X3 ring pairs with it */
        return true;
    if (c->f) /* a nested wait sleeps holding the token (progress_wait) */
        return false;
    uint32_t t = TOKEN_PROGRESS;
    /* seq_cst (a release at least): pairs with a stealer's acquire; our
     * consumption happens-before its; T2 for token_freed */
    if (!atomic_compare_exchange_strong_explicit(&a->token, &t, TOKEN_PARKED, memory_order_seq_cst,
                                                 memory_order_relaxed))
        return true;
    sr__token_freed();
    return false;
}

/* After a sleep or a token wait. A peer's pidfd (a wake of the sleep) only wakes
 * us: its exit counts once the supervisor has published how it ended. */
static void handle_events(sr_agent *a)
{
    sr__agent_check_exits(a);
    int64_t now = sr__now_ns();
    int64_t d = atomic_load_explicit(&a->earliest_deadline, memory_order_relaxed); /* relaxed: a hint */
    if (d >= 0 && now >= d)
        sr__calls_expire(a, now);
    if (a->reorder)
        sr__reorder_pump(a, now, sr__agent_send_now);
}

/* Spin only while no user thread polls: a user waiting for a response is
 * the better poller (no hop), and a spinning progress thread would only make
 * it evict us, with syscalls, on every call. */
static int64_t progress_spin_budget(sr_agent *a)
{
    /* relaxed: a heuristic; see user_take */
    uint32_t polls = atomic_load_explicit(&a->user_polls, memory_order_relaxed);
    if (polls != a->seen_user_polls) {
        a->seen_user_polls = polls;
        return 0;
    }
    return a->wake->spin_budget(a->self);
}

/* f, deadline: a nested wait's (NULL, -1 at the top level). */
static void progress_idle(sr_agent *a, sr_future *f, int64_t deadline)
{
    int64_t budget = progress_spin_budget(a);
    int64_t now = sr__now_ns(), until = now + budget, give = now + SR_SPIN_YIELD_NS;
    while (budget > 0 && (now = sr__now_ns()) < until) {
        for (int i = 0; i < 64; i++) {
            if (sr__agent_poll_ready(a) || (f && sr_future_done(f)))
                return;
            sr__cpu_relax();
        }
        /* relaxed: a hint; a user thread wants to poll its own response */
        if (atomic_load_explicit(&a->want_token, memory_order_relaxed))
            break;
        give = sr__spin_give_way(now, give); /* spin.h */
    }
    if (f && !sr__future_arm_wake(f)) /* its completer rings the doorbell; the D2 inside the sleep orders this */
        return;
    arm_timers(a);
    struct park_ctx c = {a, f};
    a->wake->sleep(a->self, sr__earlier(sr__earlier(next_deadline(a), deadline), sr__agent_remote_due(a)), park_ready, &c);
    handle_events(a);
}

/* ---- the progress thread serves (agent.h) ---------------------------------- */

/* Hand the token back: nobody polls until a thread takes it (FREE). */
static void progress_free(sr_agent *a)
{
    /* seq_cst (a release at least): our consumption happens-before the next
     * holder's acquire CAS; T2 for token_freed. A store: only this thread
     * moves the token out of PROGRESS. */
    atomic_store_explicit(&a->token, TOKEN_FREE, memory_order_seq_cst);
    sr__token_freed();
}

/* run_call_then's retake: before the call's answer goes out. */
static void progress_retake(sr_agent *a) { (void)progress_take(a); }

/* The queued stand-in starts: the `back` of the latest call (a reference,
 * or NULL), and none is queued from now on. */
static sr_future *stand_in_take(sr_agent *a)
{
    sr__lock_take(&a->standin_lock);
    sr_future *back = a->standin_back;
    a->standin_back = NULL;
    a->standin_queued = false;
    sr__lock_give(&a->standin_lock);
    return back;
}

/* The stand-in's job (exec.c): it covers the latest call the progress
 * thread started. */
static void stand_in_job(void *p)
{
    sr_agent *a = p;
    sr_future *back = stand_in_take(a);
    if (back) /* done already when that call was short: then this returns at once */
        sr__agent_stand_in(a, back);
    sr_future_unref(back);
}

/* The pool shut down before the job ran: every call it stood for has ended. */
static void stand_in_shut(void *p) { sr_future_unref(stand_in_take(p)); }

/* A stand-in for the call about to run here: the one already queued, which
 * has not started yet and so takes this call's `back` instead of the last
 * (done) one, or a new job if an executor is free to take it at once. One
 * executor wake-up thus covers every call that starts before it runs.
 * Returns `back` (ours to complete and drop), or NULL: no executor free, or
 * no memory. */
static sr_future *stand_in_start(sr_agent *a)
{
    sr_future *back = sr_future_new(), *old = NULL;
    if (!back)
        return NULL;
    sr__lock_take(&a->standin_lock);
    bool ok = a->standin_queued || !sr__exec_push_now(a, stand_in_job, stand_in_shut, a);
    if (ok) {
        old = a->standin_back;
        a->standin_back = sr_future_ref(back);
        a->standin_queued = true;
    }
    sr__lock_give(&a->standin_lock);
    sr_future_unref(old);
    if (!ok) {
        sr_future_unref(back);
        return NULL;
    }
    return back;
}

/* ---- the stand-by ------------------------------------------------------------ */

/* The stand-by's timeout: the next timer (a call's deadline, a held
 * message of the reordering mode) if it is still ahead, published
 * (standby_armed) for the progress thread's hand-over; none if it has
 * passed: while the progress thread polls, that timer is its own. */
static int64_t standby_until(void *p)
{
    sr_agent *a = p;
    int64_t d = next_deadline(a);
    if (d >= 0 && d <= sr__now_ns())
        d = -1;
    atomic_store_explicit(&a->standby_armed, d, memory_order_seq_cst); /* seq_cst: see serve_kept_standby */
    return d;
}

/* A timer is due (the stand-by then stands in if the progress thread is away). */
static bool timer_due(sr_agent *a)
{
    int64_t d = next_deadline(a);
    return d >= 0 && sr__now_ns() >= d;
}

/* The stand-by's loop: asleep on the doorbell until a message, a poke or
 * its timer comes while the progress thread is away with it on, then a
 * stand-in for that call (sr__agent_stand_in) until the call ends. */
static void *standby_main(void *p)
{
    sr_agent *a = p;
    /* seq_cst: pairs with standby_stop's store, before it stops the doorbell */
    while (!atomic_load_explicit(&a->standby_quit, memory_order_seq_cst)) {
        int rc = a->wake->standby_wait(a->self, standby_until, a);
        if (rc < 0)
            break;
        if (rc == 0 && !timer_due(a))
            continue;
        /* Under the lock the progress thread takes before it parks away: a
         * ring with no call away is one left from an away period over, and
         * no new one can begin while it is cleared. */
        sr__lock_take(&a->standin_lock);
        sr_future *back = a->away_back ? sr_future_ref(a->away_back) : NULL;
        if (!back && rc == 1)
            a->wake->standby_settle(a->self);
        sr__lock_give(&a->standin_lock);
        if (back) {
            sr__agent_stand_in(a, back);
            sr_future_unref(back);
        }
    }
    return NULL;
}

/* The stand-by can cover this worker's inbox: no other host needs polling
 * on a timer while the progress thread is away, and the reordering mode
 * keeps the stand-in jobs, so that both ways stay tested. */
static bool standby_usable(const sr_agent *a) { return !a->reorder && !a->remote; }

/* The stand-by can cover the call about to run: usable, and its thread
 * runs (started here the first time). */
static bool standby_ready(sr_agent *a)
{
    if (!standby_usable(a))
        return false;
    if (!a->standby_started) {
        if (pthread_create(&a->standby, NULL, standby_main, a))
            return false; /* the stand-in jobs cover the calls */
        /* named here, not by itself: from now on it is there to see (top -H,
         * gdb, docs/PROFILING.md; tests count it) */
        pthread_setname_np(a->standby, "shmrpc-standby");
        a->standby_started = true;
    }
    return true;
}

static void standby_stop(sr_agent *a)
{
    if (!a->standby_started)
        return;
    atomic_store_explicit(&a->standby_quit, true, memory_order_seq_cst); /* seq_cst: see standby_main */
    /* A thread that parked the token meanwhile may have stored over the
     * stop before the stand-by read it: stop it again every 100 ms until
     * it returns (a bound, not a synchronisation; almost always once). */
    for (;;) {
        a->wake->standby_stop(a->self);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 100 * 1000000;
        if (until.tv_nsec >= 1000000000) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000;
        }
        if (pthread_timedjoin_np(a->standby, NULL, &until) != ETIMEDOUT)
            break;
    }
    a->wake->standby_done(a->self);
    a->standby_started = false;
}

/* Hand the token over while away: to the stand-by (a message wakes it),
 * or free for a stand-in job. Only this thread moves it out of PROGRESS,
 * and sets away_standby (relaxed: our own stores). */
static void hand_away(sr_agent *a)
{
    if (atomic_load_explicit(&a->token, memory_order_relaxed) != TOKEN_PROGRESS)
        return;
    if (!atomic_load_explicit(&a->away_standby, memory_order_relaxed)) {
        progress_free(a);
        return;
    }
    sr__agent_park_away(a);
}

/* The progress thread takes the token back before the answer goes out (as
 * progress_retake), and ends the away period's hand-over if it got it. */
static void progress_retake_away(sr_agent *a)
{
    if (progress_take(a))
        a->wake->away_end(a->self);
}

/* Run the kept call with the stand-by on: no executor is woken; a message
 * (or a poke) that comes while the call runs wakes the stand-by, which
 * then stands in as a stand-in job would. */
static void serve_kept_standby(sr_agent *a)
{
    sr_future *back = sr_future_new();
    if (!back) {
        sr__dispatch_hand_off(a);
        return;
    }
    sr__lock_take(&a->standin_lock);
    a->away_back = sr_future_ref(back);
    sr__lock_give(&a->standin_lock);
    atomic_store_explicit(&a->away_standby, true, memory_order_relaxed); /* relaxed: the token's hand-over publishes it */
    /* seq_cst (store and fence): K4, before the token is handed on */
    atomic_store_explicit(&a->progress_away, true, memory_order_seq_cst);
    atomic_thread_fence(memory_order_seq_cst);
    hand_away(a);
    /* The stand-by sleeps until the timer it armed: one due earlier (set
     * before we went away; a later one pokes it, K4) pokes it now. seq_cst
     * (the load): pairs with its store in standby_until, after its fence,
     * which pairs with the hand-over's (a stand-by that looked at the word
     * before it fails its wait on the new value and looks again). */
    int64_t due = next_deadline(a), armed = atomic_load_explicit(&a->standby_armed, memory_order_seq_cst);
    if (due >= 0 && (armed < 0 || due < armed))
        a->wake->poke(a->self);
    sr__dispatch_run_deferred(progress_retake_away);
    atomic_store_explicit(&a->away_standby, false, memory_order_relaxed); /* relaxed: a stale true parks away, which wakes the stand-by for nothing */
    atomic_store_explicit(&a->progress_away, false, memory_order_relaxed); /* relaxed: a late poke costs a wake-up */
    sr__lock_take(&a->standin_lock);
    sr_future *mine = a->away_back;
    a->away_back = NULL; /* before `back` completes: the stand-by, back from it, finds no call away */
    sr__lock_give(&a->standin_lock);
    sr_future_unref(mine);
    sr_future_set_result(back, NULL);
    sr_future_unref(back);
}

/* The progress thread's poll kept a plain call: run it here, with the
 * stand-by or an executor standing in (agent.h, "The progress thread
 * serves"), or hand it to the executors when none is free. */
static void serve_kept(sr_agent *a)
{
    if (standby_ready(a)) {
        serve_kept_standby(a);
        return;
    }
    sr_future *back = stand_in_start(a);
    if (!back) {
        sr__dispatch_hand_off(a);
        return;
    }
    /* seq_cst (store and fence): K4, before the token is handed on */
    atomic_store_explicit(&a->progress_away, true, memory_order_seq_cst);
    atomic_thread_fence(memory_order_seq_cst);
    progress_free(a);
    sr__dispatch_run_deferred(progress_retake);
    atomic_store_explicit(&a->progress_away, false, memory_order_relaxed); /* relaxed: a late poke costs a wake-up */
    sr_future_set_result(back, NULL);
    sr_future_unref(back);
}

/* Plain calls stay here only in the loop's own round (a wait's loop, f,
 * runs inside a callback), and only while no user thread serves: a serving
 * waiter runs one itself, and the progress thread then polls in its place
 * while it does; running a second call here too would leave the inbox to a
 * stand-in, each call paying its hand-back (bench_train's three trainers,
 * five interleaved pairs: 1.36-1.40x one trainer without this check,
 * 1.44-1.58x with it). */
static enum sr_poll_mode progress_poll_mode(sr_agent *a, sr_future *f)
{
    /* relaxed: a hint; a call kept or not is correct either way */
    return f || atomic_load_explicit(&a->serving_waiters, memory_order_relaxed) ? SR_POLL_NESTED : a->progress_mode;
}

/* One round of the progress loop. f, deadline: a nested wait's. */
static void progress_step(sr_agent *a, sr_future *f, int64_t deadline)
{
    if (!progress_take(a)) {
        /* A user thread holds the inbox: timers (call deadlines, held
         * messages of the reordering mode) and peers' deaths still need
         * this thread. */
        progress_wait_token(a, f, deadline);
        handle_events(a);
        /* Quiet messages (acknowledgements) ring nobody: wake a user
         * asleep on the inbox to read them (nothing if it polls). */
        a->wake->nudge(a->self);
        return;
    }
    enum sr_poll_mode mode = progress_poll_mode(a, f);
    /* Module jobs (a backward pass's hops) this burst starts are kept too
     * when the stand-by covers the inbox, as a serving waiter keeps them:
     * run here by serve_kept, no executor woken for each (the NESTED rounds,
     * a wait's, send them to the executors: progress_wait) */
    bool was = sr__exec_take_jobs(mode == SR_POLL_PROGRESS && standby_usable(a));
    unsigned n = sr__agent_poll_burst(a, mode);
    sr__exec_take_jobs(was);
    if (n) {
        sr__agent_expire_due(a); /* a busy inbox must not stop timeouts from firing, */
        if (sr__agent_exits_pending(a)) /* nor a departure from being seen */
            sr__agent_check_exits(a);
        if (sr__dispatch_has_deferred())
            serve_kept(a);
        return;
    }
    progress_idle(a, f, deadline);
}

static bool stopping(sr_agent *a)
{
    return atomic_load_explicit(&a->stopping, memory_order_acquire); /* acquire: pairs with sr__agent_stop */
}

/* A callback on the progress thread waits (agent.h, nested waits): the
 * thread goes on being the progress thread until f completes, for the frame
 * that was dispatching when the callback ran. It never parks the token
 * meanwhile (park_ready): a user thread that took it would keep it until
 * its own future completed, and that future may be the one this callback
 * completes once it returns (a `then` whose callback waits, with the user
 * waiting on its result): neither would ever go on. A user that waits
 * meanwhile sleeps on its future and on the token's hand-back. */
static int progress_wait(sr_agent *a, sr_future *f, int64_t deadline)
{
    /* This thread polls: module jobs it reads go to the executors, as in
     * holder_wait (a waiter that keeps them runs them only after handing the
     * inbox back, which the progress thread never does). */
    bool was = sr__exec_take_jobs(false);
    int rc = 0;
    while (!sr_future_done(f)) {
        if (deadline >= 0 && sr__now_ns() >= deadline) {
            rc = -ETIMEDOUT;
            break;
        }
        if (stopping(a)) {
            rc = sr__fail(-SR_ESHUTDOWN, "sr_future_wait",
                          "worker%d: RPC shut down while a callback on the progress thread waited", a->rank);
            break;
        }
        progress_step(a, f, deadline);
    }
    /* relaxed: our own store */
    if (atomic_load_explicit(&a->progress_away, memory_order_relaxed)) { /* inside a call run without the token */
        hand_away(a);
    } else {
        while (!progress_take(a) && !stopping(a)) {
            progress_wait_token(a, NULL, -1);
            handle_events(a);
        }
    }
    sr__exec_take_jobs(was);
    return rc;
}

int sr__agent_wait(sr_agent *a, sr_future *f, int64_t deadline, enum sr_poll_mode mode, bool counted)
{
    sr__burst_ring(a); /* a callback waits inside a burst: ring what it sent first (agent.h, "Poll bursts") */
    /* The wait ends the burst's batch for this thread: what it sends while
     * it waits, outside a burst of its own (held messages released, answers
     * of calls it runs, callbacks), rings at once. Sent quietly, it would
     * wait for the outer burst's ring, after this wait: a peer asleep on it
     * would never answer. */
    bool batching = sr__thr.batching;
    sr__thr.batching = false;
    int rc;
    /* a token taken before the request was sent is used even here (wait.c) */
    if (sr__thr.pretaken != a && sr__thr.progress == a)
        rc = progress_wait(a, f, deadline);
    else
        rc = sr__agent_wait_user(a, f, deadline, mode, counted);
    sr__thr.batching = batching;
    return rc;
}

int sr__agent_wait_counted(sr_agent *a, sr_future *f, int64_t deadline, enum sr_poll_mode mode)
{
    if (sr__thr.progress == a) { /* sr_shutdown joins this thread: it needs no reference, and must not hold one up */
        sr__agent_put(a);
        return sr__agent_wait(a, f, deadline, mode, false);
    }
    int rc = sr__agent_wait(a, f, deadline, mode, true);
    if (rc == SR__WAIT_DETACHED) /* the agent went away while we slept: f is ours to wait for alone */
        return sr__future_wait_plain(f, deadline);
    sr__agent_put(a);
    return rc;
}

static int wait_hook(sr_future *f, int64_t deadline)
{
    if (sr__thr.progress)
        return sr__agent_wait(sr__thr.progress, f, deadline, SR_POLL_NESTED, false);
    sr_agent *a = sr__agent_get(NULL);
    if (!a)
        return sr__future_wait_plain(f, deadline);
    /* a caller waits for its answer; any other waiter serves (agent.h, "Serving waiters") */
    return sr__agent_wait_counted(a, f, deadline, sr__future_is_call(f) ? SR_POLL_NESTED : SR_POLL_WAIT);
}

static void *progress_main(void *p)
{
    sr_agent *a = p;
    sr__thr.progress = a;
    /* Its name in top -H, gdb and the profiler's traces (docs/PROFILING.md),
     * set before it can record anything */
    pthread_setname_np(pthread_self(), "shmrpc-progress");
    while (!stopping(a))
        progress_step(a, NULL, -1);
    /* release: a waiter still running (an executor finishing a nested call)
     * may steal the token and poll for itself. */
    uint32_t t = TOKEN_PROGRESS;
    /* seq_cst: T2 for token_freed */
    if (atomic_compare_exchange_strong_explicit(&a->token, &t, TOKEN_FREE, memory_order_seq_cst, memory_order_relaxed))
        sr__token_freed();
    sr__thr.progress = NULL;
    return NULL;
}

int sr__agent_start(sr_agent *a)
{
    atomic_init(&a->token, TOKEN_PROGRESS);
    /* a stand-in must be woken by messages while it holds the token (agent.h) */
    a->progress_mode = a->self->caps & SR_TPORT_HOLD_SLEEP ? SR_POLL_PROGRESS : SR_POLL_NESTED;
    sr__lock_init(&a->standin_lock);
    a->standin_back = NULL;
    a->standin_queued = false;
    a->standby_started = false;
    a->away_back = NULL;
    atomic_init(&a->standby_armed, -1);
    atomic_init(&a->away_standby, false);
    atomic_init(&a->standby_quit, false);
    sr__future_set_hooks(wait_hook, wake_hook);
    int rc = pthread_create(&a->progress, NULL, progress_main, a);
    if (rc)
        return sr__fail(-rc, "sr_init", "cannot start the progress thread: %s", strerror(rc));
    return 0;
}

void sr__agent_stop(sr_agent *a)
{
    /* release: pairs with the progress thread's acquire load */
    atomic_store_explicit(&a->stopping, true, memory_order_release);
    a->wake->stop(a->self); /* also ends an aside sleep */
    pthread_join(a->progress, NULL);
    standby_stop(a); /* after: the progress thread may have been away until it returned */
}

