/* SPDX-License-Identifier: MIT */
/* The consumer token and the waits (agent.h, "Threads and the consumer
 * token", "Nested waits"): a user thread takes the token to poll for its
 * own response, hands it back, and sleeps on its future, on the inbox or
 * on the token's hand-back. */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "agent.h"
#include "error.h"
#include "futex.h"
#include "reorder.h"
#include "spin.h"
#include "thread.h"

#define USER_STEAL_SPIN_NS (20ll * 1000)     /* a user waits this long for the progress thread to park */
/* The two bounded slices left, each only where no event exists to sleep on:
 * without futex_waitv (Linux < 5.16), an idle waiter that cannot take the
 * token cannot sleep on the token and its future at once, so it retries;
 * with the eventfd doorbell, producers never futex-wake, so a token holder
 * waiting in a callback cannot sleep on the doorbell and re-polls. */
#define IDLE_RETAKE_NS (2ll * 1000000)
#define HOLDER_SLICE_NS (1ll * 1000000)

static void futex_wake_one(_Atomic uint32_t *w)
{
    syscall(SYS_futex, w, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

/* Idle waiters that cannot take the token sleep on token_seq and their
 * future (idle_wait_token). Both words are static, not the agent's: such a
 * waiter lets go of its reference while it sleeps (as sleep_on does), so the
 * agent may be freed under it. One agent is live at a time, so one pair
 * serves; a stale count only costs a spurious wake. */
static _Atomic uint32_t token_seq;      /* bumped whenever the token becomes PARKED or FREE */
static _Atomic uint32_t token_sleepers; /* idle waiters between T1 and their wake */

/* The token became PARKED or FREE: wake one idle waiter (idle_wait_token)
 * to take over serving. One is enough: every serving waiter (each thread
 * of a pool in sr_rpc_sync) sleeps here, and only one can take the token;
 * who serves never decides correctness (the parked progress thread serves
 * otherwise), so a woken waiter that returns instead loses nothing.
 * T2: the caller's seq_cst store or CAS of the token, then our seq_cst load
 * of the count and, if someone is counted, our seq_cst bump, pair with the
 * waiter's seq_cst increment and loads (T1). A waiter counted after our
 * load loads the token after our store or CAS and takes it instead of
 * sleeping; one counted before it is bumped and woken. So with nobody
 * counted (the common hand-back) the process-wide word is not written. */
void sr__token_freed(void)
{
    if (atomic_load_explicit(&token_sleepers, memory_order_seq_cst)) {       /* seq_cst: T2 */
        atomic_fetch_add_explicit(&token_seq, 1, memory_order_seq_cst);      /* seq_cst: T2 */
        futex_wake_one(&token_seq);
    }
}

/* Steal the token for a user thread: from the parked progress thread, or free. */
static bool user_take(sr_agent *a)
{
    uint32_t t = TOKEN_PARKED;
    /* acquire: pairs with the release that handed the token back; the
     * previous holder's consumption of the inbox happens-before ours */
    if (!atomic_compare_exchange_strong_explicit(&a->token, &t, TOKEN_USER, memory_order_acquire,
                                                 memory_order_relaxed)) {
        t = TOKEN_FREE;
        if (!atomic_compare_exchange_strong_explicit(&a->token, &t, TOKEN_USER, memory_order_acquire,
                                                     memory_order_relaxed))
            return false;
    }
    sr__thr.holder = true;
    /* relaxed: a heuristic read by the progress thread. A load and a store,
     * no locked add: only a thread that has just taken the token writes it,
     * and the token's hand-over (the release that handed it back, our
     * acquire CAS above) orders those writers. */
    atomic_store_explicit(&a->user_polls, atomic_load_explicit(&a->user_polls, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    /* We poll now: producers need not wake the parked progress thread. */
    a->wake->hold(a->self);
    return true;
}

/* The holder's part of the re-check before it parks the token (the
 * transport checks its inbox and space events itself): the rest of the
 * burst, and departures. */
static bool park_busy(void *p)
{
    sr_agent *a = p;
    return sr__agent_burst_left(a) || sr__agent_exits_pending(a);
}

/* Hand the token back. Returns false if messages arrived meanwhile: the
 * caller keeps the token and must poll again. */
static bool user_release(sr_agent *a)
{
    for (;;) {
        /* acquire: pairs with the progress thread's CAS to USER_WAITING */
        uint32_t t = atomic_load_explicit(&a->token, memory_order_acquire);
        if (t == TOKEN_USER_WAITING) {
            /* seq_cst (a release at least): our consumption happens-before
             * the next holder's; T2 for token_freed */
            atomic_store_explicit(&a->token, TOKEN_FREE, memory_order_seq_cst);
            a->wake->kick(a->self); /* the progress thread sleeps aside (progress_wait_token) */
            sr__token_freed();
            break;
        }
        /* The progress thread is parked on the inbox: announce its sleep
         * again and re-check, after the transport's fence (D2), the inbox, a
         * space event, the rest of our burst and the departures (park_busy).
         * While it is away with the stand-by on (progress.c), a message must
         * wake the stand-by instead. relaxed: written before the progress
         * thread handed the token over, which our take of it ordered. */
        bool away = atomic_load_explicit(&a->away_standby, memory_order_relaxed);
        if (!(away ? a->wake->park_away : a->wake->park)(a->self, park_busy, a)) {
            if (sr__agent_inbox_ready(a) || sr__tport_space_kicked(a->self))
                return false;
            /* A departure published while we polled rang an AWAKE doorbell
             * (X3) and may have woken nobody: handle it before parking the token. */
            sr__agent_check_exits(a);
            continue;
        }
        /* seq_cst (a release at least): pairs with the acquire CAS of the
         * next holder; T2 for token_freed. A kick made while we polled is
         * still pending on the parked thread's kick eventfd: its sleep ends. */
        if (atomic_compare_exchange_strong_explicit(&a->token, &t, TOKEN_PARKED, memory_order_seq_cst,
                                                    memory_order_relaxed)) {
            sr__token_freed();
            break;
        }
    }
    sr__thr.holder = false;
    return true;
}

/* Spin on the inbox and the future for up to budget ns, giving way to a
 * thread queued on this core (spin.h). */
static bool spin_for(sr_agent *a, sr_future *f, int64_t budget)
{
    if (budget <= 0) /* not even one round of pauses (64 of them: microseconds) */
        return false;
    int64_t now = sr__now_ns(), until = now + budget, give = now + SR_SPIN_YIELD_NS;
    for (;;) {
        for (int i = 0; i < 64; i++) {
            if (sr__agent_poll_ready(a) || sr_future_done(f))
                return true;
            sr__cpu_relax();
        }
        if ((now = sr__now_ns()) >= until)
            return false;
        give = sr__spin_give_way(now, give);
    }
}

/* No spin (oversubscribed): poll by giving the core away, for at most the
 * transport's yield budget (wake->yield_budget), while this thread's
 * yield gate is open (spin.h: a yield that ran another job's slice closes
 * it for a back-off). A thread queued on this core runs at each yield,
 * often the very one whose answer we wait for; with none queued the yield
 * returns at once. */
static _Thread_local struct sr_yield_gate yield_gate; /* this thread's (spin.h) */

static bool yield_for(sr_agent *a, sr_future *f, int64_t budget)
{
    int64_t now = sr__now_ns(), until = now + budget;
    if (budget <= 0 || !sr__yield_gate_open(&yield_gate, now))
        return false;
    for (;;) {
        bool ready = sr__agent_poll_ready(a) || sr_future_done(f);
        if (ready || now >= until) { /* every yield was quick: the next slow one starts the back-off over */
            sr__yield_gate_quick(&yield_gate);
            return ready;
        }
        sched_yield();
        int64_t then = now;
        now = sr__now_ns();
        if (!sr__yield_gate_note(&yield_gate, now - then, now)) /* something else ran a slice: sleep from now on */
            return sr__agent_poll_ready(a) || sr_future_done(f);
    }
}

/* A user thread holds the token: poll until f is done or nothing comes. */
static int poll_as_user(sr_agent *a, sr_future *f, int64_t deadline, enum sr_poll_mode mode)
{
    for (;;) {
        if (sr__agent_poll_burst(a, mode)) {
            sr__agent_expire_due(a); /* a busy inbox must not stop timeouts from firing */
            if (sr__dispatch_has_deferred())
                return 2; /* a plain call to run here, once the token is handed back */
            if (sr_future_done(f)) /* do not keep serving a busy inbox once our answer is in */
                return 0;
            continue;
        }
        sr__agent_expire_due(a);
        if (sr_future_done(f))
            return 0;
        if (deadline >= 0 && sr__now_ns() >= deadline)
            return -ETIMEDOUT;
        if (sr__agent_closing(a))
            return 1; /* sr_shutdown waits for this thread: hand the inbox back */
        if (a->reorder)
            sr__reorder_pump(a, sr__now_ns(), sr__agent_send_now);
        if (sr__agent_exits_pending(a)) { /* the supervisor rang: a peer left */
            sr__agent_check_exits(a);
            continue;
        }
        int64_t spin = a->wake->spin_budget(a->self);
        if (!(spin ? spin_for(a, f, spin) : yield_for(a, f, a->wake->yield_budget(a->self))))
            return 1; /* idle: sleep on the future instead */
    }
}

/* The progress thread is polling: ask it to park, and try to steal the
 * token while it does (only while spinning is allowed), giving way to it
 * should it be queued on this core (spin.h): it parks only if it runs. */
static bool steal_from_progress(sr_agent *a, sr_future *f)
{
    if (!a->wake->spin_budget(a->self))
        return false;
    /* relaxed: a hint for the spinning progress thread */
    atomic_fetch_add_explicit(&a->want_token, 1, memory_order_relaxed);
    bool got = false;
    int64_t now = sr__now_ns(), until = now + USER_STEAL_SPIN_NS, give = now + SR_SPIN_YIELD_NS;
    while (!sr_future_done(f) && !(got = user_take(a)) && (now = sr__now_ns()) < until) {
        sr__cpu_relax();
        give = sr__spin_give_way(now, give);
    }
    atomic_fetch_sub_explicit(&a->want_token, 1, memory_order_relaxed); /* relaxed: as above */
    return got;
}

/* Take back the reference a counted waiter let go of while it slept. False
 * if the agent was unpublished meanwhile (a may be freed: not touched). */
static bool retake(sr_agent *a, uint64_t epoch)
{
    sr_agent *b = sr__agent_get(NULL);
    if (b != a || b->epoch != epoch) {
        if (b)
            sr__agent_put(b);
        return false;
    }
    return true;
}

/* A counted waiter (one that holds a reference from sr__agent_get) lets go
 * of it while it sleeps: sr_shutdown waits for references, never for
 * futures. False if the agent was unpublished meanwhile: the reference is
 * then gone. */
static bool sleep_on(sr_agent *a, sr_future *f, int64_t deadline, bool counted)
{
    if (!counted) {
        sr__future_sleep(f, deadline);
        return true;
    }
    uint64_t epoch = a->epoch;
    sr__agent_put(a);
    sr__future_sleep(f, deadline);
    return retake(a, epoch);
}

/* An idle waiter (inside sr_shutdown) prefers to be the worker's server (no
 * hop to the progress thread, plain functions run here). When it cannot take
 * the token, it sleeps on its future and on token_seq until either is done
 * or the token is handed back (token_freed), not on a timer. T1: the seq_cst
 * increment and loads pair with the hander's seq_cst store and bump (T2):
 * either it sees us counted, or we see the token free or token_seq moved.
 * Lets go of a counted reference while asleep, as sleep_on does. */
static bool idle_wait_token(sr_agent *a, sr_future *f, int64_t deadline, bool counted)
{
    if (!sr__futex_waitv_supported()) { /* no event to sleep on: retry now and then (who serves never decides correctness) */
        int64_t soon = sr__now_ns() + IDLE_RETAKE_NS;
        return sleep_on(a, f, deadline >= 0 && deadline < soon ? deadline : soon, counted);
    }
    _Atomic uint32_t *fw;
    uint32_t fv;
    atomic_fetch_add_explicit(&token_sleepers, 1, memory_order_seq_cst);  /* seq_cst: T1 */
    uint32_t seq = atomic_load_explicit(&token_seq, memory_order_seq_cst); /* seq_cst: T1 */
    uint32_t t = atomic_load_explicit(&a->token, memory_order_seq_cst);    /* seq_cst: T1 */
    bool ok = true;
    if (t != TOKEN_PARKED && t != TOKEN_FREE && sr__future_wait_word(f, &fw, &fv)) {
        struct futex_waitv v[2] = {sr__futex_private_word(&token_seq, seq), sr__futex_private_word(fw, fv)};
        uint64_t epoch = a->epoch;
        if (counted)
            sr__agent_put(a);
        sr__futex_waitv(v, 2, deadline);
        if (counted)
            ok = retake(a, epoch);
    }
    atomic_fetch_sub_explicit(&token_sleepers, 1, memory_order_relaxed); /* relaxed: a spurious wake at most */
    return ok;
}

struct hold_ctx {
    sr_agent *a;
    sr_future *f;
    int64_t until;
    uint32_t timer_gen; /* a->timer_gen before the timers `until` came from were read (K3) */
};

/* Re-checked by the transport after its D2 fence (hold_sleep): the rest of
 * the burst, f, closing (sr__agent_unpublish's store), the departures (the
 * supervisor's X3 ring), the deadline, and a kick since the timers were
 * read (K2, as the progress thread's sleeps check it): a deadline or a
 * held message (the reordering mode) set earlier meanwhile. Its setter
 * pokes us while the progress thread is away (sr__agent_kick, K4), but a
 * poke that lands before we announce the sleep is overwritten by that
 * announcement; the kicker's bump and fence before its poke and our D2
 * make this load see the bump. relaxed: ordered by those fences. */
static bool hold_busy(void *p)
{
    struct hold_ctx *c = p;
    return sr__agent_burst_left(c->a) || sr_future_done(c->f) || sr__agent_closing(c->a) ||
           sr__agent_exits_pending(c->a) || (c->until >= 0 && c->until <= sr__now_ns()) ||
           atomic_load_explicit(&c->a->timer_gen, memory_order_relaxed) != c->timer_gen;
}

_Atomic(sr__hold_hook) sr__test_before_hold_sleep;

/* A user thread that holds the token and has nothing to poll sleeps on the
 * doorbell itself (SLEEPING_USER, doorbell.h) and on its future at once, so
 * the message it waits for wakes it directly, with no hop through the
 * progress thread, and so does a completion from elsewhere (an expiry by
 * the progress thread, a peer's death, a local set_result). Nothing
 * periodic: it also wakes for the earliest call deadline (every holder
 * expires calls), for sr_shutdown's poke (closing), for a departure (the
 * supervisor's X3 ring) and for a space kick; the progress thread meanwhile
 * sleeps aside on timers, peers and kicks (progress_wait_token). It keeps
 * its reference (if any) while it sleeps: it holds the token, and
 * sr__agent_unpublish's poke wakes it to hand the token back first.
 * Without futex_waitv (no SR_TPORT_SLEEP_WORD) it sleeps on the doorbell
 * alone, and f's POLLER bit has its completer ring the doorbell. Only with
 * the futex doorbell (SR_TPORT_HOLD_SLEEP: eventfd producers never
 * futex-wake): returns false otherwise. */
static bool holder_sleep(sr_agent *a, sr_future *f, int64_t deadline)
{
    sr_tport *t = a->self;
    if (!(t->caps & SR_TPORT_HOLD_SLEEP))
        return false;
    _Atomic uint32_t *fw = NULL;
    uint32_t fv = 0;
    bool waitv = t->caps & SR_TPORT_SLEEP_WORD;
    t->ops->recv_burst(t, NULL, 0); /* free held slots before sleeping (transport.h, recv_burst) */
    if (waitv ? !sr__future_wait_word(f, &fw, &fv) : !sr__future_arm_wake(f))
        return true; /* done, or its state moved: poll again */
    /* relaxed: a lower bound; a deadline lowered after this read kicks the
     * progress thread, which expires the call and so completes f, or, while
     * it is away, pokes us (sr__agent_kick, K4). Held messages (the
     * reordering mode) are due too: the progress thread may be away. */
    /* relaxed, then K3's acquire fence: pairs with the release bump in
     * sr__agent_kick, so the timers read below include every kick up to it */
    uint32_t gen = atomic_load_explicit(&a->timer_gen, memory_order_relaxed);
    atomic_thread_fence(memory_order_acquire);
    int64_t due = sr__earlier(deadline, atomic_load_explicit(&a->earliest_deadline, memory_order_relaxed));
    struct hold_ctx c = {a, f, sr__earlier(sr__earlier(due, sr__agent_remote_due(a)), sr__reorder_next(a)), gen};
    /* acquire: pairs with the test's release store of the hook (what it uses is set up before) */
    sr__hold_hook hook = atomic_load_explicit(&sr__test_before_hold_sleep, memory_order_acquire);
    if (sr_unlikely(hook != NULL))
        hook();
    /* The doorbell handshake and the sleep are the transport's (transport.h, hold_sleep). */
    if (a->wake->hold_sleep(t, fw, fv, c.until, hold_busy, &c) == 1)
        atomic_fetch_add_explicit(&a->idle_missed_wakes, 1, memory_order_relaxed); /* relaxed: a statistic */
    /* A deadline that passed by the precise clock but not yet by the coarse
     * one of expire_due: expire now rather than poll until the tick. */
    if (due >= 0 && sr__now_ns() >= due) /* not for the polled transport's deadline: nothing is due then */
        sr__calls_expire(a, sr__now_ns());
    return true;
}

/* A user thread waits while it holds the token: a callback it runs (a
 * completion it read, an expiry) blocks. Nobody else can read the inbox, so
 * it goes on polling, in NESTED mode: plain functions, and what it had kept
 * for itself, go to the executors (it cannot run them before it returns). */
static int holder_wait(sr_agent *a, sr_future *f, int64_t deadline)
{
    bool was = sr__exec_take_jobs(false);
    sr__dispatch_hand_off(a);
    int rc;
    for (;;) {
        rc = poll_as_user(a, f, deadline, SR_POLL_NESTED);
        if (rc <= 0)
            break;
        if (sr__agent_closing(a)) {
            rc = sr__fail(-SR_ESHUTDOWN, "sr_future_wait",
                          "worker%d: RPC is shutting down while a callback waits on the thread that polls", a->rank);
            break;
        }
        if (!holder_sleep(a, f, deadline)) /* eventfd doorbell: nobody can ring this thread (HOLDER_SLICE_NS) */
            sr__future_sleep(f, sr__earlier(deadline, sr__now_ns() + HOLDER_SLICE_NS));
    }
    sr__exec_take_jobs(was);
    return rc;
}


void sr__agent_pretake(sr_agent *a)
{
    /* not on the progress thread, nor on a holder (a callback): they poll already */
    if (!sr__thr.pretaken && sr__thr.progress != a && !sr__thr.holder && user_take(a))
        sr__thr.pretaken = a;
}

bool sr__agent_polling_here(const sr_agent *a) { return sr__thr.progress == a || sr__thr.holder; }

void sr__agent_unhold(sr_agent *a)
{
    if (sr__thr.pretaken != a)
        return;
    sr__thr.pretaken = NULL;
    while (!user_release(a))
        sr__agent_poll_burst(a, SR_POLL_NESTED);
}

/* Hand a held token back on the way out of a wait. What the last polls
 * kept for this thread goes to the executors: the wait is over. */
static void leave_token(sr_agent *a, enum sr_poll_mode mode)
{
    while (!user_release(a))
        sr__agent_poll_burst(a, mode);
    if (sr__dispatch_has_deferred())
        sr__dispatch_hand_off(a);
}

static int wait_user(sr_agent *a, sr_future *f, int64_t deadline, enum sr_poll_mode mode, bool counted, bool held)
{
    for (;;) {
        if (sr_future_done(f) || (deadline >= 0 && sr__now_ns() >= deadline)) {
            if (held) /* a held token is handed back on every way out */
                leave_token(a, mode);
            else if (sr__dispatch_has_deferred()) /* jobs a function run here submitted */
                sr__dispatch_hand_off(a);
            return sr_future_done(f) ? 0 : -ETIMEDOUT;
        }
        bool mine = held;
        held = false;
        if (!mine && (sr__agent_closing(a) || (!user_take(a) && !steal_from_progress(a, f)))) {
            /* Someone else polls and will complete f. An idle or serving
             * waiter also wakes when the token is handed back, to take over
             * serving (agent.h, "Serving waiters"). */
            bool idle = mode != SR_POLL_NESTED && !sr__agent_closing(a);
            if (!(idle ? idle_wait_token(a, f, deadline, counted) : sleep_on(a, f, deadline, counted)))
                return SR__WAIT_DETACHED;
            continue;
        }
        int rc = poll_as_user(a, f, deadline, mode);
        while (rc == 1 && !sr__dispatch_has_deferred() && !sr__agent_closing(a) && holder_sleep(a, f, deadline))
            rc = poll_as_user(a, f, deadline, mode);
        /* Never leave holding the token: drain what slipped in, then hand
         * back. A call kept in the burst that completed f is the
         * executors': the wait is over (agent.h, "Serving waiters"). */
        while (!user_release(a))
            sr__agent_poll_burst(a, mode);
        if (sr__dispatch_has_deferred() && mode == SR_POLL_WAIT && sr_future_done(f))
            sr__dispatch_hand_off(a);
        if (sr__dispatch_has_deferred()) {
            /* Token released: a nested call inside can be answered by whoever
             * polls next (this thread included). */
            sr__dispatch_run_deferred(sr__agent_pretake);
            /* The last call's answer went out with the inbox taken back (serve.c, run_call_then). */
            held = sr__thr.pretaken == a;
            if (held)
                sr__thr.pretaken = NULL;
            continue;
        }
        if (rc <= 0)
            return rc;
        /* Idle without a doorbell sleep (the eventfd doorbell, or closing):
         * new messages now wake the progress thread, which completes f. */
        if (!sleep_on(a, f, deadline, counted))
            return SR__WAIT_DETACHED;
    }
}

void sr__agent_park_away(sr_agent *a)
{
    bool parked = a->wake->park_away(a->self, park_busy, a);
    /* seq_cst (a release at least): our consumption (the rest of the burst
     * included) happens-before the next holder's acquire CAS; T2 for
     * token_freed. A store: only this thread moves the token out of
     * PROGRESS. */
    atomic_store_explicit(&a->token, TOKEN_PARKED, memory_order_seq_cst);
    sr__token_freed();
    if (!parked) /* messages came first: the stand-by reads them, woken now, as a ring would */
        a->wake->poke(a->self);
}

/* The stand-in (agent.h, "The progress thread serves"): poll while the
 * progress thread runs a call, until `back` completes. When the token is
 * not to be had (the progress thread is back, a user thread polls, or
 * sr_shutdown wants it), sleep on `back` and on the token's hand-back
 * (idle_wait_token), never only on `back`: a token handed back while the
 * progress thread is away is PARKED with nobody asleep on the doorbell,
 * and this thread must take it. */
void sr__agent_stand_in(sr_agent *a, sr_future *back)
{
    while (!sr_future_done(back)) {
        if (sr__agent_closing(a) || !user_take(a)) {
            idle_wait_token(a, back, -1, false);
            continue;
        }
        int rc = poll_as_user(a, back, -1, SR_POLL_NESTED);
        while (rc == 1 && !sr__agent_closing(a) && holder_sleep(a, back, -1))
            rc = poll_as_user(a, back, -1, SR_POLL_NESTED);
        while (!user_release(a))
            sr__agent_poll_burst(a, SR_POLL_NESTED);
    }
}

int sr__agent_wait_user(sr_agent *a, sr_future *f, int64_t deadline, enum sr_poll_mode mode, bool counted)
{
    bool held = sr__thr.pretaken == a; /* taken before the request was sent: ours to poll with */
    if (held)
        sr__thr.pretaken = NULL;
    else if (sr__thr.holder)
        return holder_wait(a, f, deadline);
    if (mode == SR_POLL_NESTED)
        return wait_user(a, f, deadline, mode, counted, held);
    if (mode == SR_POLL_WAIT && sr__thr.serve_depth >= SR_SERVE_DEPTH_MAX) /* deep enough: the executors serve */
        return wait_user(a, f, deadline, SR_POLL_NESTED, counted, held);
    /* A serving waiter keeps the module jobs its polling starts, as an idle
     * one does; while one waits, the progress thread leaves plain calls to
     * the executors (serving_waiters). */
    bool was = sr__exec_take_jobs(mode == SR_POLL_WAIT ? true : sr__thr.takes_jobs);
    atomic_fetch_add_explicit(&a->serving_waiters, 1, memory_order_relaxed); /* relaxed: a hint */
    int rc = wait_user(a, f, deadline, mode, counted, held);
    if (rc != SR__WAIT_DETACHED) /* else a may be gone; nobody reads the count any more */
        atomic_fetch_sub_explicit(&a->serving_waiters, 1, memory_order_relaxed); /* relaxed: a hint */
    sr__exec_take_jobs(was);
    return rc;
}
