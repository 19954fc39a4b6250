/* The agent's threads: the consumer token, the progress thread, the wait
 * hook that lets a waiting caller poll for its own response, and sends with
 * local overflow (outq.c). See agent.h for the token states. */
#include "agent.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <time.h>

#include "error.h"
#include "heap.h"
#include "payload.h"
#include "reorder.h"
#include "module.h"

#define BURST 32
#define USER_STEAL_SPIN_NS (20ll * 1000)     /* a user waits this long for the progress thread to park */
#define IDLE_RETAKE_NS (2ll * 1000000)       /* without futex_waitv: an idle waiter without the token retries */

sr_agent *sr__agent;

#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449 /* the generic syscall table's number (Linux 5.16) */
#endif

static void futex_wake_all(_Atomic uint32_t *w)
{
    syscall(SYS_futex, w, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Does the kernel have futex_waitv (5.16+)? Probed once: an empty vector is
 * -EINVAL where the call exists. Racy init is harmless (same answer). */
static bool waitv_supported(void)
{
    static int known = -1;
    if (known < 0)
        known = syscall(SYS_futex_waitv, NULL, 0, 0, NULL, CLOCK_MONOTONIC) < 0 && errno == ENOSYS ? 0 : 1;
    return known;
}

/* Sleep until one of the n words changes from its value and is woken, or
 * the deadline (CLOCK_MONOTONIC, < 0: none). 0 when woken, else -errno
 * (-EAGAIN: a word had already changed; -ETIMEDOUT). */
static int futex_waitv(struct futex_waitv *v, unsigned n, int64_t deadline)
{
    struct timespec ts = {.tv_sec = deadline / 1000000000, .tv_nsec = deadline % 1000000000};
    return syscall(SYS_futex_waitv, v, n, 0, deadline >= 0 ? &ts : NULL, CLOCK_MONOTONIC) < 0 ? -errno : 0;
}

static struct futex_waitv private_word(_Atomic uint32_t *w, uint32_t val)
{
    return (struct futex_waitv){.val = val, .uaddr = (uint64_t)(uintptr_t)w, .flags = FUTEX_32 | FUTEX_PRIVATE_FLAG};
}

/* The token became PARKED or FREE: wake the idle waiters that sleep on the
 * token word (idle_wait_token). T2: the caller's seq_cst store or CAS of the
 * token pairs with the waiter's seq_cst increment and load (T1). */
static void token_freed(sr_agent *a)
{
    if (atomic_load_explicit(&a->token_sleepers, memory_order_seq_cst)) /* seq_cst: T2 */
        futex_wake_all(&a->token);
}

/* ---- sending ------------------------------------------------------------ */

int sr__agent_send(sr_agent *a, int to, sr_msg *m)
{
    /* The shutdown control messages are never held: the barrier and the
     * quiescence waves must see the held ones as in flight, not be held too. */
    if (sr_unlikely(a->reorder != NULL) && m->type != SR_MSG_CTRL && !sr_xport_peer_dead(a->x, to))
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
 * made unconditionally. */
void sr__agent_kick(sr_agent *a)
{
    /* release: pairs with K3, so a generation seen means its deadline is seen */
    atomic_fetch_add_explicit(&a->timer_gen, 1, memory_order_release);
    sr_waiter_kick(&a->x->waiter);
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
    if (a->reorder || sr__outq_busy(&a->outq, to))
        return sr__agent_send(a, to, m);
    int rc = sr_xport_send_quiet(a->x, to, m);
    return rc == -EAGAIN ? sr__agent_send(a, to, m) : rc;
}

int sr__agent_send_now(sr_agent *a, int to, sr_msg *m)
{
    /* Keep this destination's order behind its queued messages (best effort, outq.h). */
    if (sr_likely(!sr__outq_busy(&a->outq, to))) {
        int rc = sr_xport_send(a->x, to, m);
        if (rc != -EAGAIN)
            return rc;
    }
    m->src = (uint16_t)a->rank;
    return sr__outq_push(a, to, m);
}

/* ---- polling ------------------------------------------------------------- */

/* Consume one burst; the caller holds the token. Returns the count. */
static unsigned poll_burst(sr_agent *a, enum sr_poll_mode mode)
{
    sr_msg burst[BURST];
    unsigned n = sr_xport_recv_burst(a->x, burst, BURST);
    for (unsigned i = 0; i < n; i++)
        sr__dispatch(a, &burst[i], mode);
    if (!n) /* idle: take back the blocks peers released (one load when there are none) */
        sr_heap_drain();
    sr__outq_service(a); /* a full inbox we queue for freed slots: one load when none did */
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
    /* relaxed: a heuristic read by the progress thread */
    atomic_fetch_add_explicit(&a->user_polls, 1, memory_order_relaxed);
    /* We poll now: producers need not wake the parked progress thread.
     * relaxed: a stale SLEEPING costs one spurious wake, never a lost one */
    atomic_store_explicit(&a->x->me->doorbell, SR_DOORBELL_AWAKE, memory_order_relaxed);
    return true;
}

/* Hand the token back. Returns false if messages arrived meanwhile: the
 * caller keeps the token and must poll again. */
static bool user_release(sr_agent *a)
{
    for (;;) {
        /* acquire: pairs with the progress thread's CAS to USER_WAITING */
        uint32_t t = atomic_load_explicit(&a->token, memory_order_acquire);
        if (t == TOKEN_USER_WAITING) {
            /* seq_cst (a release at least): our consumption happens-before the
             * next holder's; T2 for token_freed */
            atomic_store_explicit(&a->token, TOKEN_FREE, memory_order_seq_cst);
            sr_waiter_kick(&a->x->waiter); /* the progress thread sleeps aside (progress_wait_token) */
            token_freed(a);
            break;
        }
        /* The progress thread is parked on the doorbell. It released the
         * inbox before it slept, and will not again before its next read: free
         * the slots our last burst still holds (a receive of nothing), or a
         * ring full of them would refuse every producer, which then rings no
         * doorbell, while everyone sleeps. Then re-announce its sleep. */
        sr_xport_recv_burst(a->x, NULL, 0);
        /* relaxed: the D2 fence below orders it before the ring re-check */
        atomic_store_explicit(&a->x->me->doorbell, SR_DOORBELL_SLEEPING, memory_order_relaxed);
        /* D2 (doorbell.h): pairs with the producers' D3 fence */
        atomic_thread_fence(memory_order_seq_cst);
        if (sr_ring_ready(a->x->inbox) || sr_xport_space_kicked(a->x)) {
            atomic_store_explicit(&a->x->me->doorbell, SR_DOORBELL_AWAKE, memory_order_relaxed);
            return false;
        }
        /* seq_cst (a release at least): pairs with the acquire CAS of the next
         * holder; T2 for token_freed */
        if (atomic_compare_exchange_strong_explicit(&a->token, &t, TOKEN_PARKED, memory_order_seq_cst,
                                                    memory_order_relaxed)) {
            token_freed(a);
            break;
        }
    }
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
            if (sr_ring_ready(a->x->inbox) || sr_future_done(f) || sr_xport_space_kicked(a->x))
                return true;
            sr_cpu_relax();
        }
    } while (sr_now_ns() < until);
    return false;
}

/* A user thread holds the token: poll until f is done or nothing comes. */
static int poll_as_user(sr_agent *a, sr_future *f, int64_t deadline, enum sr_poll_mode mode)
{
    for (;;) {
        if (poll_burst(a, mode)) {
            if (sr__dispatch_has_deferred())
                return 2; /* a plain call to run here, once the token is handed back */
            if (sr_future_done(f)) /* do not keep serving a busy inbox once our answer is in */
                return 0;
            continue;
        }
        if (sr_future_done(f))
            return 0;
        if (deadline >= 0 && sr_now_ns() >= deadline)
            return -ETIMEDOUT;
        if (a->reorder)
            sr__reorder_pump(a, sr_now_ns());
        if (!spin_for(a, f, sr_xport_spin_budget(a->x)))
            return 1; /* idle: sleep on the future instead */
    }
}

/* The progress thread is polling: ask it to park, and try to steal the
 * token while it does (only while spinning is allowed). */
static bool steal_from_progress(sr_agent *a, sr_future *f)
{
    if (!sr_xport_spin_budget(a->x))
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

/* A user thread that holds the token and has nothing to poll sleeps on the
 * doorbell itself (SLEEPING_USER, doorbell.h) and on its future at once, so
 * the message it waits for wakes it directly, with no hop through the
 * progress thread, and so does a completion from elsewhere (an expiry, a
 * peer's death, a local set_result). The progress thread meanwhile sleeps
 * aside on timers, peers and kicks (progress_wait_token). Only with the
 * futex doorbell (eventfd producers never futex-wake) and futex_waitv;
 * returns false otherwise (the caller hands the token back). */
static bool user_doorbell_sleep(sr_agent *a, sr_future *f, int64_t deadline)
{
    if (a->x->me->doorbell_kind != SR_DOORBELL_FUTEX || !waitv_supported())
        return false;
    _Atomic uint32_t *w = &a->x->me->doorbell, *fw;
    uint32_t fv;
    sr_xport_recv_burst(a->x, NULL, 0); /* free held slots before sleeping (ring.h) */
    if (!sr__future_wait_word(f, &fw, &fv))
        return true; /* done, or its state moved: poll again */
    atomic_store_explicit(w, SR_DOORBELL_SLEEPING_USER, memory_order_relaxed); /* relaxed: D2 orders it */
    /* D2 (doorbell.h): pairs with the producers' D3 fence */
    atomic_thread_fence(memory_order_seq_cst);
    if (!sr_ring_ready(a->x->inbox) && !sr_future_done(f) && !sr_xport_space_kicked(a->x)) {
        struct futex_waitv v[2] = {
            {.val = SR_DOORBELL_SLEEPING_USER, .uaddr = (uint64_t)(uintptr_t)w, .flags = FUTEX_32}, /* shared */
            private_word(fw, fv)};
        int rc = futex_waitv(v, 2, deadline);
        /* relaxed (both): a statistic for tests/test_idle_wake.c */
        if (rc == -ETIMEDOUT && sr_ring_ready(a->x->inbox) &&
            atomic_load_explicit(w, memory_order_relaxed) != SR_DOORBELL_SLEEPING_USER)
            atomic_fetch_add_explicit(&a->idle_missed_wakes, 1, memory_order_relaxed);
    }
    /* relaxed: only the token's holder writes SLEEPING_USER; a producer's exchange also writes AWAKE */
    atomic_store_explicit(w, SR_DOORBELL_AWAKE, memory_order_relaxed);
    return true;
}

/* An idle waiter (inside sr_shutdown) prefers to be the worker's server
 * (no hop to the progress thread, plain functions run here). When it cannot
 * take the token, it sleeps on its future and on the token word until
 * either is done or the token is handed back (token_freed). T1: the seq_cst
 * increment and load pair with the hander's seq_cst store and load (T2):
 * either it sees us counted, or we see the token free. */
static void idle_wait_token(sr_agent *a, sr_future *f, int64_t deadline)
{
    if (!waitv_supported()) { /* retry now and then; who serves never decides correctness */
        int64_t soon = sr_now_ns() + IDLE_RETAKE_NS;
        sr__future_sleep(f, deadline >= 0 && deadline < soon ? deadline : soon);
        return;
    }
    _Atomic uint32_t *fw;
    uint32_t fv;
    atomic_fetch_add_explicit(&a->token_sleepers, 1, memory_order_seq_cst); /* seq_cst: T1 */
    uint32_t t = atomic_load_explicit(&a->token, memory_order_seq_cst);     /* seq_cst: T1 */
    if (t != TOKEN_PARKED && t != TOKEN_FREE && sr__future_wait_word(f, &fw, &fv)) {
        struct futex_waitv v[2] = {private_word(&a->token, t), private_word(fw, fv)};
        futex_waitv(v, 2, deadline);
    }
    atomic_fetch_sub_explicit(&a->token_sleepers, 1, memory_order_relaxed); /* relaxed: a spurious wake at most */
}

/* The agent whose token this thread took ahead of its wait (sr__agent_pretake). */
static _Thread_local sr_agent *pretaken;

void sr__agent_pretake(sr_agent *a)
{
    if (!pretaken && user_take(a))
        pretaken = a;
}

void sr__agent_unhold(sr_agent *a)
{
    if (pretaken != a)
        return;
    pretaken = NULL;
    while (!user_release(a))
        poll_burst(a, SR_POLL_NESTED);
}

int sr__agent_wait(sr_agent *a, sr_future *f, int64_t deadline, enum sr_poll_mode mode)
{
    bool held = pretaken == a; /* taken before the request was sent: ours to poll with */
    pretaken = NULL;
    for (;;) {
        if (sr_future_done(f) || (deadline >= 0 && sr_now_ns() >= deadline)) {
            if (held) /* a held token is handed back on every way out */
                while (!user_release(a))
                    poll_burst(a, mode);
            return sr_future_done(f) ? 0 : -ETIMEDOUT;
        }
        bool mine = held;
        held = false;
        if (!mine && !user_take(a) && !steal_from_progress(a, f)) {
            /* Someone else polls and will complete f. */
            if (mode == SR_POLL_IDLE)
                idle_wait_token(a, f, deadline);
            else
                sr__future_sleep(f, deadline);
            continue;
        }
        int rc = poll_as_user(a, f, deadline, mode);
        while (rc == 1 && !sr__dispatch_has_deferred() && user_doorbell_sleep(a, f, deadline))
            rc = poll_as_user(a, f, deadline, mode);
        /* Never leave holding the token: drain what slipped in, then hand back. */
        while (!user_release(a))
            poll_burst(a, mode);
        if (sr__dispatch_has_deferred()) {
            /* Token released: a nested call inside can be answered by whoever
             * polls next (this thread included). */
            sr__dispatch_run_deferred();
            continue;
        }
        if (rc <= 0)
            return rc;
        /* Idle (no doorbell sleep here): new messages now wake the progress
         * thread, which completes f. */
        sr__future_sleep(f, deadline);
    }
}

static int wait_hook(sr_future *f, int64_t deadline)
{
    sr_agent *a = sr__agent;
    if (!a)
        return sr__future_wait_until(f, deadline);
    return sr__agent_wait(a, f, deadline, SR_POLL_NESTED);
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

static int64_t earlier(int64_t d, int64_t e)
{
    return e >= 0 && (d < 0 || e < d) ? e : d;
}

static int64_t next_deadline(sr_agent *a)
{
    int64_t d = atomic_load_explicit(&a->earliest_deadline, memory_order_relaxed); /* relaxed: a hint */
    d = earlier(d, sr__modules_next_deadline());
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

/* Checked by the aside sleep: the token came back, or there is work. */
static bool token_back(void *p)
{
    sr_agent *a = p;
    /* relaxed: a hint; progress_take's acquire CAS takes the token */
    return atomic_load_explicit(&a->token, memory_order_relaxed) != TOKEN_USER_WAITING ||
           atomic_load_explicit(&a->stopping, memory_order_relaxed) || timers_moved(a);
}

/* A user thread holds the token (it polls, or sleeps on the doorbell): sleep
 * aside on what still needs this thread, the timers, the peers' deaths and
 * shutdown, until the user hands the token back (user_release kicks us).
 * Nothing periodic: with no deadline the sleep has no timeout. */
static int progress_wait_token(sr_agent *a)
{
    uint32_t t = TOKEN_USER;
    /* relaxed: the hand-back is a seq_cst store, taken by progress_take's acquire CAS */
    if (!atomic_compare_exchange_strong_explicit(&a->token, &t, TOKEN_USER_WAITING, memory_order_relaxed,
                                                 memory_order_relaxed) && t != TOKEN_USER_WAITING)
        return 0;
    arm_timers(a);
    return sr_waiter_sleep_aside(&a->x->waiter, next_deadline(a), token_back, a);
}

/* Called by the waiter after announcing sleep: park, unless there is work. */
static bool park_ready(void *p)
{
    sr_agent *a = p;
    /* relaxed (stopping): a hint to skip the sleep; sr__agent_stop also notifies the waiter */
    if (sr_ring_ready(a->x->inbox) || atomic_load_explicit(&a->stopping, memory_order_relaxed) || timers_moved(a) ||
        sr_xport_space_kicked(a->x))
        return true;
    uint32_t t = TOKEN_PROGRESS;
    /* seq_cst (a release at least): pairs with a stealer's acquire; our
     * consumption happens-before its; T2 for token_freed */
    if (!atomic_compare_exchange_strong_explicit(&a->token, &t, TOKEN_PARKED, memory_order_seq_cst,
                                                 memory_order_relaxed))
        return true;
    token_freed(a);
    return false;
}

static bool peer_crashed(sr_agent *a, int r)
{
    /* acquire: pairs with the peer's release store of DETACHED in sr_xport_detach */
    return atomic_load_explicit(&sr_seg_worker(&a->x->seg, r)->state, memory_order_acquire) != SR_WORKER_DETACHED;
}

static void handle_events(sr_agent *a, int ev)
{
    if (ev > 0 && (ev & SR_WAKE_PEER))
        for (int r = 0; r < a->world; r++)
            if (sr_xport_peer_dead(a->x, r) && peer_crashed(a, r)) {
                sr__outq_drop_peer(a, r);
                sr__calls_fail_peer(a, r, "died");
                sr__modules_peer_died(r);
            }
    int64_t now = sr_now_ns();
    int64_t d = atomic_load_explicit(&a->earliest_deadline, memory_order_relaxed); /* relaxed: a hint */
    if (d >= 0 && now >= d)
        sr__calls_expire(a, now);
    if (a->reorder)
        sr__reorder_pump(a, now);
    sr_heap_drain();
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
    return sr_xport_spin_budget(a->x);
}

static void progress_idle(sr_agent *a)
{
    int64_t budget = progress_spin_budget(a);
    int64_t until = sr_now_ns() + budget;
    while (budget > 0 && sr_now_ns() < until) {
        for (int i = 0; i < 64; i++) {
            if (sr_ring_ready(a->x->inbox) || sr_xport_space_kicked(a->x))
                return;
            sr_cpu_relax();
        }
        /* relaxed: a hint; a user thread wants to poll its own response */
        if (atomic_load_explicit(&a->want_token, memory_order_relaxed))
            break;
    }
    arm_timers(a);
    int ev = sr_xport_sleep(a->x, next_deadline(a), park_ready, a);
    handle_events(a, ev);
}

/* Expire overdue calls; one relaxed load (and a coarse clock read when a
 * deadline exists) on the busy path. */
static void expire_due(sr_agent *a)
{
    int64_t d = atomic_load_explicit(&a->earliest_deadline, memory_order_relaxed); /* relaxed: a hint */
    if (d >= 0 && sr_now_coarse_ns() >= d)
        sr__calls_expire(a, sr_now_ns());
}

static void *progress_main(void *p)
{
    sr_agent *a = p;
    while (!atomic_load_explicit(&a->stopping, memory_order_acquire)) { /* acquire: pairs with sr__agent_stop */
        if (!progress_take(a)) {
            /* A user thread holds the inbox: timers (call deadlines, retries,
             * held messages) and peers' deaths still need this thread. */
            handle_events(a, progress_wait_token(a));
            /* Quiet messages (acknowledgements) ring nobody, and a retry timer
             * must see them before it resends: wake a user asleep on the
             * doorbell to read them (nothing if it polls). */
            if (sr_ring_ready(a->x->inbox))
                sr_doorbell_ring(&a->x->me->doorbell, a->x->me->doorbell_kind, a->x->me->eventfd);
            sr__modules_tick(); /* the user reads the acknowledgements meanwhile */
            continue;
        }
        if (poll_burst(a, SR_POLL_NESTED)) {
            expire_due(a); /* a busy inbox must not stop timeouts from firing */
            continue;
        }
        /* Retries only after a poll found the inbox empty: acknowledgements are
         * sent quietly (they wake nobody), so one may be waiting there. */
        sr__modules_tick();
        progress_idle(a);
    }
    /* release: a waiter still running (an executor finishing a nested call)
     * may steal the token and poll for itself. */
    uint32_t t = TOKEN_PROGRESS;
    /* seq_cst: T2 for token_freed */
    if (atomic_compare_exchange_strong_explicit(&a->token, &t, TOKEN_FREE, memory_order_seq_cst, memory_order_relaxed))
        token_freed(a);
    return NULL;
}

int sr__agent_start(sr_agent *a)
{
    atomic_init(&a->token, TOKEN_PROGRESS);
    sr__future_set_wait_hook(wait_hook);
    int rc = pthread_create(&a->progress, NULL, progress_main, a);
    if (rc)
        return sr__fail(-rc, "sr_init", "cannot start the progress thread: %s", strerror(rc));
    return 0;
}

void sr__agent_stop(sr_agent *a)
{
    /* release: pairs with the progress thread's acquire load */
    atomic_store_explicit(&a->stopping, true, memory_order_release);
    sr_waiter_notify_shutdown(&a->x->waiter);
    pthread_join(a->progress, NULL);
    sr__future_set_wait_hook(NULL);
}
