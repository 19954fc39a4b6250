/* The agent's threads: the consumer token, the progress thread, the wait
 * hook that lets a waiting caller poll for its own response, and sends with
 * local overflow (outq.c). See agent.h for the token states. */
#include "agent.h"
#include "marshal.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "futex.h"
#include "payload.h"
#include "reorder.h"
#include "thread.h"
#include "module.h"

#define USER_STEAL_SPIN_NS (20ll * 1000)     /* a user waits this long for the progress thread to park */
/* The two bounded slices left, each only where no event exists to sleep on:
 * without futex_waitv (Linux < 5.16), an idle waiter that cannot take the
 * token cannot sleep on the token and its future at once, so it retries;
 * with the eventfd doorbell, producers never futex-wake, so a token holder
 * waiting in a callback cannot sleep on the doorbell and re-polls. */
#define IDLE_RETAKE_NS (2ll * 1000000)
#define HOLDER_SLICE_NS (1ll * 1000000)

/* ---- lifetime (agent.h) ----------------------------------------------------- */

static _Atomic(sr_agent *) live;  /* the published agent, or NULL */
static _Atomic uint32_t users;    /* references taken by sr__agent_get and not yet put */
static _Atomic uint32_t draining; /* sr__agent_unpublish waits for users to reach 0 */
static _Atomic uint64_t epochs;   /* numbers the published agents */


sr_agent *sr__agent_get(const char *fn)
{
    /* seq_cst: pairs with sr__agent_unpublish (store live, then load users):
     * either it sees our reference, or we see NULL */
    atomic_fetch_add_explicit(&users, 1, memory_order_seq_cst);
    sr_agent *a = atomic_load_explicit(&live, memory_order_seq_cst);
    if (!a) {
        sr__agent_put(NULL);
        if (fn)
            sr__fail(-SR_ESHUTDOWN, fn, "RPC has not been initialized. Call sr_init first.");
    }
    return a;
}

sr_agent *sr__agent_peek(void)
{
    return atomic_load_explicit(&live, memory_order_acquire); /* acquire: pairs with sr__agent_publish */
}

void sr__agent_put(sr_agent *a)
{
    (void)a;
    /* seq_cst: pairs with sr__agent_unpublish (store draining, then load
     * users): either it sees the count drop, or we see it draining and wake it */
    if (atomic_fetch_sub_explicit(&users, 1, memory_order_seq_cst) == 1 &&
        atomic_load_explicit(&draining, memory_order_seq_cst))
        syscall(SYS_futex, &users, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

void sr__agent_publish(sr_agent *a)
{
    a->epoch = atomic_fetch_add_explicit(&epochs, 1, memory_order_relaxed) + 1; /* relaxed: a unique number */
    /* seq_cst: a's fields are complete before any sr__agent_get sees it */
    atomic_store_explicit(&live, a, memory_order_seq_cst);
}

static void agent_poke(sr_agent *a);

void sr__agent_unpublish(sr_agent *a)
{
    /* seq_cst: see sr__agent_get and sr__agent_put */
    atomic_store_explicit(&live, NULL, memory_order_seq_cst);
    atomic_store_explicit(&draining, 1, memory_order_seq_cst);
    /* seq_cst: pairs with the D2 fence of a holder about to sleep (holder_sleep) */
    atomic_store_explicit(&a->closing, true, memory_order_seq_cst);
    agent_poke(a);
    for (uint32_t u; (u = atomic_load_explicit(&users, memory_order_seq_cst)) != 0;)
        syscall(SYS_futex, &users, FUTEX_WAIT_PRIVATE, u, NULL, NULL, 0);
    atomic_store_explicit(&draining, 0, memory_order_relaxed); /* relaxed: only sr_shutdown (under life_lock) reads it again */
}

static bool closing(sr_agent *a)
{
    return atomic_load_explicit(&a->closing, memory_order_relaxed); /* relaxed: a hint, re-checked after D2 before sleeping */
}

static void futex_wake_all(_Atomic uint32_t *w)
{
    syscall(SYS_futex, w, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Idle waiters that cannot take the token sleep on token_seq and their
 * future (idle_wait_token). Both words are static, not the agent's: such a
 * waiter lets go of its reference while it sleeps (as sleep_on does), so the
 * agent may be freed under it. One agent is live at a time, so one pair
 * serves; a stale count only costs a spurious wake. */
static _Atomic uint32_t token_seq;      /* bumped whenever the token becomes PARKED or FREE */
static _Atomic uint32_t token_sleepers; /* idle waiters between T1 and their wake */

/* The token became PARKED or FREE: wake the idle waiters (idle_wait_token).
 * T2: the caller's seq_cst store or CAS of the token, then our seq_cst bump
 * and load, pair with the waiter's seq_cst increment and loads (T1). */
static void token_freed(void)
{
    atomic_fetch_add_explicit(&token_seq, 1, memory_order_seq_cst);          /* seq_cst: T2 */
    if (atomic_load_explicit(&token_sleepers, memory_order_seq_cst))         /* seq_cst: T2 */
        futex_wake_all(&token_seq);
}

/* ---- sending ------------------------------------------------------------ */

int sr__agent_send(sr_agent *a, int to, sr_msg *m)
{
    /* The shutdown control messages are never held: the barrier and the
     * quiescence waves must see the held ones as in flight, not be held too. */
    if (sr_unlikely(a->reorder != NULL) && m->type != SR_MSG_CTRL && !sr_tport_peer_gone(a->tp[to], to))
        return sr__reorder_hold(a, to, m);
    return sr__agent_send_now(a, to, m);
}

/* A deadline moved earlier than the progress thread's armed timer may be.
 * K1: bump timer_gen, then kick the waiter (an eventfd its every sleep
 * reads, whether it sleeps on the doorbell or aside while a user thread
 * holds the inbox). The kick is level-triggered, so it is not lost when the
 * progress thread is between computing its deadline and falling asleep: the
 * sleep then ends at once and the next one arms the new deadline. Kicks are
 * rare (a deadline earlier than every one in flight), so the syscall is
 * made unconditionally. A user thread asleep on the doorbell while holding
 * the token is not kicked: the progress thread, awake for the new deadline,
 * expires the call and so wakes it through its future (holder_sleep). */
void sr__agent_kick(sr_agent *a)
{
    /* release: pairs with K3, so a generation seen means its deadline is seen */
    atomic_fetch_add_explicit(&a->timer_gen, 1, memory_order_release);
    a->wake->kick(a->self);
}

/* K2: the timers changed since the progress thread armed its sleep. */
static bool timers_moved(sr_agent *a)
{
    /* relaxed: both are hints; see sr__agent_kick */
    return atomic_load_explicit(&a->timer_gen, memory_order_relaxed) !=
           atomic_load_explicit(&a->armed_gen, memory_order_relaxed);
}

int sr__agent_send_quiet(sr_agent *a, int to, sr_msg *m)
{
    sr__marshal_handoff(m);
    if (a->reorder || sr__outq_busy(&a->outq, to))
        return sr__agent_send(a, to, m);
    sr_tport *t = a->tp[to];
    int rc = t->ops->wake ? t->ops->wake->send_quiet(t, to, m) : t->ops->send(t, to, m); /* no wake: none to spare */
    return rc == -EAGAIN ? sr__agent_send(a, to, m) : rc;
}

int sr__agent_send_now(sr_agent *a, int to, sr_msg *m)
{
    sr__marshal_handoff(m);
    /* Keep this destination's order behind its queued messages (best effort, outq.h). */
    if (sr_likely(!sr__outq_busy(&a->outq, to))) {
        int rc = a->tp[to]->ops->send(a->tp[to], to, m);
        if (rc != -EAGAIN)
            return rc;
    }
    m->src = (uint16_t)a->rank;
    return sr__outq_push(a, to, m);
}

bool sr__agent_shares_heap(const sr_agent *a, int rank)
{
    return rank >= 0 && rank < a->world && !(a->tp[rank]->caps & SR_TPORT_COPIES);
}

/* ---- polling ------------------------------------------------------------- */

/* Messages for the token holder: the rest of the last burst, or the inbox
 * (or a corrupt inbox not yet found: a poll finds it; transport.h, pending). */
static bool inbox_ready(const sr_agent *a)
{
    return a->burst_at < a->burst_n || a->self->ops->pending(a->self) ||
           (a->remote && a->remote->ops->pending(a->remote));
}

/* The same, or a space event (transport.h, flow): the spin loops' check. */
static bool poll_ready(const sr_agent *a)
{
    return a->burst_at < a->burst_n || sr_tport_space_kicked(a->self) || a->self->ops->pending(a->self) ||
           (a->remote && a->remote->ops->pending(a->remote));
}

/* When the token holder must poll the copying transport again, however
 * idle the rings are (its producers ring no doorbell): -1 never. */
static int64_t remote_due(const sr_agent *a)
{
    if (sr_likely(!a->remote) || !a->remote->ops->poll_ns)
        return -1;
    int64_t ns = a->remote->ops->poll_ns(a->remote);
    return ns < 0 ? -1 : sr_now_ns() + ns;
}

/* One burst from the rings, then what fits from the other hosts. */
static unsigned recv_all(sr_agent *a)
{
    unsigned n = a->self->ops->recv_burst(a->self, a->burst, BURST);
    if (a->remote && n < BURST)
        n += a->remote->ops->recv_burst(a->remote, a->burst + n, BURST - n);
    return n;
}

static void inbox_lost(sr_agent *a);

/* Consume one burst; the caller holds the token. Returns the count. The
 * burst is the agent's, not this frame's: a callback that waits (a nested
 * wait, agent.h) polls on, and the rest of the burst is what it reads first,
 * so an answer that came in the same burst is never stranded behind it. */
static unsigned poll_burst(sr_agent *a, enum sr_poll_mode mode)
{
    if (a->burst_at == a->burst_n) {
        a->burst_at = 0;
        a->burst_n = recv_all(a);
        if (sr_unlikely(!a->burst_n && sr_tport_inbox_bad(a->self)))
            inbox_lost(a);
        if (!a->burst_n) { /* idle (the transport took back the blocks peers released) */
            sr__outq_service(a); /* a full inbox we queue for freed slots: one load when none did */
            return 0;
        }
    }
    unsigned n = 0;
    while (a->burst_at < a->burst_n) {
        sr_msg m = a->burst[a->burst_at++]; /* a copy: a nested poll refills the burst */
        sr__dispatch(a, &m, mode);
        n++;
    }
    sr__outq_service(a);
    return n;
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
    /* relaxed: a heuristic read by the progress thread */
    atomic_fetch_add_explicit(&a->user_polls, 1, memory_order_relaxed);
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
    return a->burst_at < a->burst_n || sr__agent_exits_pending(a);
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
            token_freed();
            break;
        }
        /* The progress thread is parked on the inbox: announce its sleep
         * again and re-check, after the transport's fence (D2), the inbox, a
         * space event, the rest of our burst and the departures (park_busy). */
        if (!a->wake->park(a->self, park_busy, a)) {
            if (inbox_ready(a) || sr_tport_space_kicked(a->self))
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
            token_freed();
            break;
        }
    }
    sr__thr.holder = false;
    return true;
}

/* Spin on the inbox and the future for up to budget ns. */
static bool spin_for(sr_agent *a, sr_future *f, int64_t budget)
{
    if (budget <= 0) /* not even one round of pauses (64 of them: microseconds) */
        return false;
    int64_t until = sr_now_ns() + budget;
    do {
        for (int i = 0; i < 64; i++) {
            if (poll_ready(a) || sr_future_done(f))
                return true;
            sr_cpu_relax();
        }
    } while (sr_now_ns() < until);
    return false;
}

static int64_t earlier(int64_t d, int64_t e)
{
    return e >= 0 && (d < 0 || e < d) ? e : d;
}

/* Expire overdue calls; one relaxed load (and a coarse clock read when a
 * deadline exists) on the busy path. Every holder of the token runs it, so
 * calls time out whoever polls (a user thread may hold the inbox while the
 * progress thread sleeps with an older timer). */
static void expire_due(sr_agent *a)
{
    int64_t d = atomic_load_explicit(&a->earliest_deadline, memory_order_relaxed); /* relaxed: a hint */
    if (d >= 0 && sr_now_coarse_ns() >= d)
        sr__calls_expire(a, sr_now_ns());
}

/* A user thread holds the token: poll until f is done or nothing comes. */
static int poll_as_user(sr_agent *a, sr_future *f, int64_t deadline, enum sr_poll_mode mode)
{
    for (;;) {
        if (poll_burst(a, mode)) {
            expire_due(a); /* a busy inbox must not stop timeouts from firing */
            if (sr__dispatch_has_deferred())
                return 2; /* a plain call to run here, once the token is handed back */
            if (sr_future_done(f)) /* do not keep serving a busy inbox once our answer is in */
                return 0;
            continue;
        }
        expire_due(a);
        if (sr_future_done(f))
            return 0;
        if (deadline >= 0 && sr_now_ns() >= deadline)
            return -ETIMEDOUT;
        if (closing(a))
            return 1; /* sr_shutdown waits for this thread: hand the inbox back */
        if (a->reorder)
            sr__reorder_pump(a, sr_now_ns());
        if (sr__agent_exits_pending(a)) { /* the supervisor rang: a peer left */
            sr__agent_check_exits(a);
            continue;
        }
        if (!spin_for(a, f, a->wake->spin_budget(a->self)))
            return 1; /* idle: sleep on the future instead */
    }
}

/* The progress thread is polling: ask it to park, and try to steal the
 * token while it does (only while spinning is allowed). */
static bool steal_from_progress(sr_agent *a, sr_future *f)
{
    if (!a->wake->spin_budget(a->self))
        return false;
    /* relaxed: a hint for the spinning progress thread */
    atomic_fetch_add_explicit(&a->want_token, 1, memory_order_relaxed);
    bool got = false;
    int64_t until = sr_now_ns() + USER_STEAL_SPIN_NS;
    while (!sr_future_done(f) && !(got = user_take(a)) && sr_now_ns() < until)
        sr_cpu_relax();
    atomic_fetch_sub_explicit(&a->want_token, 1, memory_order_relaxed); /* relaxed: as above */
    return got;
}

/* Wake every sleeper on this worker's inbox whatever it announced, and
 * kick the progress thread (asleep aside while a user holds the inbox, or
 * on the inbox): the waiters re-check what they wait for (transport.h, poke). */
static void agent_poke(sr_agent *a)
{
    a->wake->poke(a->self);
}

/* The futures' wake hook: a future that a poller sleeps on completed. */
static void wake_hook(void)
{
    sr_agent *a = sr__agent_get(NULL);
    if (a) {
        agent_poke(a);
        sr__agent_put(a);
    }
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
    if (!sr_futex_waitv_supported()) { /* no event to sleep on: retry now and then (who serves never decides correctness) */
        int64_t soon = sr_now_ns() + IDLE_RETAKE_NS;
        return sleep_on(a, f, deadline >= 0 && deadline < soon ? deadline : soon, counted);
    }
    _Atomic uint32_t *fw;
    uint32_t fv;
    atomic_fetch_add_explicit(&token_sleepers, 1, memory_order_seq_cst);  /* seq_cst: T1 */
    uint32_t seq = atomic_load_explicit(&token_seq, memory_order_seq_cst); /* seq_cst: T1 */
    uint32_t t = atomic_load_explicit(&a->token, memory_order_seq_cst);    /* seq_cst: T1 */
    bool ok = true;
    if (t != TOKEN_PARKED && t != TOKEN_FREE && sr__future_wait_word(f, &fw, &fv)) {
        struct futex_waitv v[2] = {sr_futex_private_word(&token_seq, seq), sr_futex_private_word(fw, fv)};
        uint64_t epoch = a->epoch;
        if (counted)
            sr__agent_put(a);
        sr_futex_waitv(v, 2, deadline);
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
};

/* Re-checked by the transport after its D2 fence (hold_sleep): the rest of
 * the burst, f, closing (sr__agent_unpublish's store), the departures (the
 * supervisor's X3 ring) and the deadline. */
static bool hold_busy(void *p)
{
    struct hold_ctx *c = p;
    return c->a->burst_at < c->a->burst_n || sr_future_done(c->f) || closing(c->a) ||
           sr__agent_exits_pending(c->a) || (c->until >= 0 && c->until <= sr_now_ns());
}

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
     * progress thread, which expires the call and so completes f */
    int64_t due = earlier(deadline, atomic_load_explicit(&a->earliest_deadline, memory_order_relaxed));
    struct hold_ctx c = {a, f, earlier(due, remote_due(a))};
    /* The doorbell handshake and the sleep are the transport's (transport.h, hold_sleep). */
    if (a->wake->hold_sleep(t, fw, fv, c.until, hold_busy, &c) == 1)
        atomic_fetch_add_explicit(&a->idle_missed_wakes, 1, memory_order_relaxed); /* relaxed: a statistic */
    /* A deadline that passed by the precise clock but not yet by the coarse
     * one of expire_due: expire now rather than poll until the tick. */
    if (due >= 0 && sr_now_ns() >= due) /* not for the polled transport's deadline: nothing is due then */
        sr__calls_expire(a, sr_now_ns());
    return true;
}

/* A user thread waits while it holds the token: a callback it runs (a
 * completion it read, an expiry) blocks. Nobody else can read the inbox, so
 * it goes on polling, in NESTED mode: plain functions, and what it had kept
 * for itself, go to the executors (it cannot run them before it returns). */
static int holder_wait(sr_agent *a, sr_future *f, int64_t deadline)
{
    bool was = sr__dispatch_take_jobs(false);
    sr__dispatch_hand_off(a);
    int rc;
    for (;;) {
        rc = poll_as_user(a, f, deadline, SR_POLL_NESTED);
        if (rc <= 0)
            break;
        if (closing(a)) {
            rc = sr__fail(-SR_ESHUTDOWN, "sr_future_wait",
                          "worker%d: RPC is shutting down while a callback waits on the thread that polls", a->rank);
            break;
        }
        if (!holder_sleep(a, f, deadline)) /* eventfd doorbell: nobody can ring this thread (HOLDER_SLICE_NS) */
            sr__future_sleep(f, earlier(deadline, sr_now_ns() + HOLDER_SLICE_NS));
    }
    sr__dispatch_take_jobs(was);
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
        poll_burst(a, SR_POLL_NESTED);
}

static int progress_wait(sr_agent *a, sr_future *f, int64_t deadline);

int sr__agent_wait(sr_agent *a, sr_future *f, int64_t deadline, enum sr_poll_mode mode, bool counted)
{
    bool held = sr__thr.pretaken == a; /* taken before the request was sent: ours to poll with */
    if (held)
        sr__thr.pretaken = NULL;
    else if (sr__thr.progress == a)
        return progress_wait(a, f, deadline);
    else if (sr__thr.holder)
        return holder_wait(a, f, deadline);
    for (;;) {
        if (sr_future_done(f) || (deadline >= 0 && sr_now_ns() >= deadline)) {
            if (held) /* a held token is handed back on every way out */
                while (!user_release(a))
                    poll_burst(a, mode);
            return sr_future_done(f) ? 0 : -ETIMEDOUT;
        }
        bool mine = held;
        held = false;
        if (!mine && (closing(a) || (!user_take(a) && !steal_from_progress(a, f)))) {
            /* Someone else polls and will complete f. An idle waiter also
             * wakes when the token is handed back, to take over serving. */
            bool idle = mode == SR_POLL_IDLE && !closing(a);
            if (!(idle ? idle_wait_token(a, f, deadline, counted) : sleep_on(a, f, deadline, counted)))
                return SR__WAIT_DETACHED;
            continue;
        }
        int rc = poll_as_user(a, f, deadline, mode);
        while (rc == 1 && !sr__dispatch_has_deferred() && !closing(a) && holder_sleep(a, f, deadline))
            rc = poll_as_user(a, f, deadline, mode);
        /* Never leave holding the token: drain what slipped in, then hand back. */
        while (!user_release(a))
            poll_burst(a, mode);
        if (sr__dispatch_has_deferred()) {
            /* Token released: a nested call inside can be answered by whoever
             * polls next (this thread included). */
            sr__dispatch_run_deferred();
            /* The last call's answer went out with the inbox taken back (dispatch.c, run_call_then). */
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
    return sr__agent_wait_counted(a, f, deadline, SR_POLL_NESTED);
}

/* ---- the progress thread ------------------------------------------------- */

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
    return earlier(d, sr__reorder_next(a));
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
    return a->wake->sleep_aside(a->self, earlier(next_deadline(a), deadline), token_back, &c);
}

/* Called by the waiter after announcing sleep: park, unless there is work. */
static bool park_ready(void *p)
{
    struct park_ctx *c = p;
    sr_agent *a = c->a;
    /* relaxed (stopping): a hint to skip the sleep; sr__agent_stop also notifies the waiter */
    if (inbox_ready(a) || atomic_load_explicit(&a->stopping, memory_order_relaxed) || timers_moved(a) ||
        sr_tport_space_kicked(a->self) || (c->f && sr_future_done(c->f)) ||
        sr__agent_exits_pending(a)) /* after D2: the supervisor's X3 ring pairs with it */
        return true;
    uint32_t t = TOKEN_PROGRESS;
    /* seq_cst (a release at least): pairs with a stealer's acquire; our
     * consumption happens-before its; T2 for token_freed */
    if (!atomic_compare_exchange_strong_explicit(&a->token, &t, TOKEN_PARKED, memory_order_seq_cst,
                                                 memory_order_relaxed))
        return true;
    token_freed();
    return false;
}

/* Under gone_lock: claim the peer whose exit was published first among
 * those not handled yet; -1 when none is left. In publication order, so
 * that the worker that left first is the one a failed wait names, not a
 * peer whose own shutdown failed because of it. */
static int claim_gone(sr_agent *a)
{
    int first = -1;
    uint32_t seq = 0;
    for (int r = 0; r < a->world; r++)
        if (r != a->rank && !a->gone[r] && sr_tport_peer_gone(a->tp[r], r)) {
            uint32_t s = a->tp[r]->ops->live->exit_order(a->tp[r], r);
            if (first < 0 || s < seq)
                first = r, seq = s;
        }
    if (first >= 0)
        a->gone[first] = true;
    return first;
}

/* A peer's process ended. Calls to it fail whatever the reason; a peer
 * that left after a graceful shutdown owes nothing else (the final barrier
 * ordered it after every wait that involved it), so only the others fail
 * the modules' waits and this worker's own shutdown. */
static void peer_gone(sr_agent *a, int r)
{
    char text[256], how[128];
    sr_tport *t = a->tp[r];
    const struct sr_tport_live *l = t->ops->live; /* r's exit was published: the group exists */
    l->gone_text(t, r, text, sizeof(text));
    l->exit_text(t, r, how, sizeof(how));
    sr__outq_drop_peer(a, r); /* nothing queued for it can be delivered now */
    sr__calls_fail_peer(a, r, how); /* "RPC to worker2 failed: the worker exited with ..." */
    if (l->left_gracefully(t, r))
        return;
    sr__modules_peer_died(r, text);
    sr__ctrl_peer_gone(a, r, text);
}

/* Our own inbox is corrupt (transport.h, inbox_text): nothing can be read from it again,
 * so no answer, acknowledgement or release sent to us can arrive. Fail at
 * once every wait that needs one, naming this worker and the corruption:
 * the calls in flight, and every later call at its begin (calls.c); the
 * modules' waits on each peer not handled yet, as if it had left (its
 * messages cannot reach us); the shutdown waits. Run once, by the token
 * holder that found it (inbox_failed is handed over with the token). */
static void inbox_lost(sr_agent *a)
{
    if (a->inbox_failed)
        return;
    a->inbox_failed = true;
    char corrupt[320], text[400];
    a->self->ops->inbox_text(a->self, corrupt, sizeof(corrupt));
    sr__calls_fail_all(a, corrupt);
    snprintf(text, sizeof(text), "%s can no longer receive messages: %s", a->names[a->rank], corrupt);
    for (int r = 0; r < a->world; r++) {
        pthread_mutex_lock(&a->gone_lock);
        bool mine = r != a->rank && !a->gone[r];
        if (mine) /* a later exit of r is not handled again (claim_gone) */
            a->gone[r] = true;
        pthread_mutex_unlock(&a->gone_lock);
        if (mine)
            sr__modules_peer_died(r, text); /* outside the lock, as in peer_gone */
    }
    sr__ctrl_peer_gone(a, a->rank, text);
}

void sr__agent_check_exits(sr_agent *a)
{
    for (;;) {
        uint32_t n = sr_tport_exits(a->self); /* seq_cst: pairs with the supervisor's X2 */
        /* relaxed: a hint, confirmed under the lock */
        if (n == atomic_load_explicit(&a->exits_seen, memory_order_relaxed))
            return;
        pthread_mutex_lock(&a->gone_lock);
        int r = claim_gone(a);
        if (r < 0) /* every exit counted in n is handled: published before X2 */
            atomic_store_explicit(&a->exits_seen, n, memory_order_relaxed); /* relaxed: a hint */
        pthread_mutex_unlock(&a->gone_lock);
        if (r < 0)
            return;
        peer_gone(a, r); /* outside the lock: it completes futures, whose callbacks may poll */
    }
}

/* After a sleep or a token wait. A peer's pidfd (a wake of the sleep) only wakes
 * us: its exit counts once the supervisor has published how it ended. */
static void handle_events(sr_agent *a)
{
    sr__agent_check_exits(a);
    int64_t now = sr_now_ns();
    int64_t d = atomic_load_explicit(&a->earliest_deadline, memory_order_relaxed); /* relaxed: a hint */
    if (d >= 0 && now >= d)
        sr__calls_expire(a, now);
    if (a->reorder)
        sr__reorder_pump(a, now);
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
    int64_t until = sr_now_ns() + budget;
    while (budget > 0 && sr_now_ns() < until) {
        for (int i = 0; i < 64; i++) {
            if (poll_ready(a) || (f && sr_future_done(f)))
                return;
            sr_cpu_relax();
        }
        /* relaxed: a hint; a user thread wants to poll its own response */
        if (atomic_load_explicit(&a->want_token, memory_order_relaxed))
            break;
    }
    if (f && !sr__future_arm_wake(f)) /* its completer rings the doorbell; the D2 inside the sleep orders this */
        return;
    arm_timers(a);
    struct park_ctx c = {a, f};
    a->wake->sleep(a->self, earlier(earlier(next_deadline(a), deadline), remote_due(a)), park_ready, &c);
    handle_events(a);
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
    if (poll_burst(a, SR_POLL_NESTED)) {
        expire_due(a); /* a busy inbox must not stop timeouts from firing, */
        if (sr__agent_exits_pending(a)) /* nor a departure from being seen */
            sr__agent_check_exits(a);
        return;
    }
    progress_idle(a, f, deadline);
}

static bool stopping(sr_agent *a)
{
    return atomic_load_explicit(&a->stopping, memory_order_acquire); /* acquire: pairs with sr__agent_stop */
}

/* A callback on the progress thread waits (agent.h, nested waits): the
 * thread goes on being the progress thread until f completes, then takes
 * the token back for the frame that was dispatching when the callback ran. */
static int progress_wait(sr_agent *a, sr_future *f, int64_t deadline)
{
    /* This thread polls: module jobs it reads go to the executors, as in
     * holder_wait (a waiter that keeps them runs them only after handing the
     * inbox back, which the progress thread never does). */
    bool was = sr__dispatch_take_jobs(false);
    int rc = 0;
    while (!sr_future_done(f)) {
        if (deadline >= 0 && sr_now_ns() >= deadline) {
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
    while (!progress_take(a) && !stopping(a)) {
        progress_wait_token(a, NULL, -1);
        handle_events(a);
    }
    sr__dispatch_take_jobs(was);
    return rc;
}

static void *progress_main(void *p)
{
    sr_agent *a = p;
    sr__thr.progress = a;
    while (!stopping(a))
        progress_step(a, NULL, -1);
    /* release: a waiter still running (an executor finishing a nested call)
     * may steal the token and poll for itself. */
    uint32_t t = TOKEN_PROGRESS;
    /* seq_cst: T2 for token_freed */
    if (atomic_compare_exchange_strong_explicit(&a->token, &t, TOKEN_FREE, memory_order_seq_cst, memory_order_relaxed))
        token_freed();
    sr__thr.progress = NULL;
    return NULL;
}

int sr__agent_start(sr_agent *a)
{
    atomic_init(&a->token, TOKEN_PROGRESS);
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
}
