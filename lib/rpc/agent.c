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

#include "error.h"
#include "heap.h"
#include "payload.h"
#include "reorder.h"
#include "module.h"

#define BURST 32
#define TOKEN_WAIT_NS (50ll * 1000000)       /* progress thread: recheck timers while a user polls */
#define TOKEN_WAIT_MIN_NS (20ll * 1000)      /* ... but never a busy loop on an overdue timer */
#define USER_STEAL_SPIN_NS (20ll * 1000)     /* a user waits this long for the progress thread to park */
#define IDLE_SLICE_NS (100ll * 1000000)      /* an idle waiter re-checks its deadline this often */
#define IDLE_RETAKE_NS (2ll * 1000000)       /* an idle waiter without the token retries this often */

sr_agent *sr__agent;

static void futex_wait_ns(_Atomic uint32_t *w, uint32_t val, int64_t ns)
{
    struct timespec ts = {.tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000};
    syscall(SYS_futex, w, FUTEX_WAIT_PRIVATE, val, &ts, NULL, 0);
}

static void futex_wake_one(_Atomic uint32_t *w)
{
    syscall(SYS_futex, w, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

/* ---- sending ------------------------------------------------------------ */

int sr__agent_send(sr_agent *a, int to, sr_msg *m)
{
    /* The shutdown control messages are never held: the barrier and the
     * quiescence waves must see the held ones as in flight, not be held too. */
    if (sr_unlikely(a->reorder != NULL) && m->type != SR_MSG_CTRL && !sr_xport_peer_gone(a->x, to))
        return sr__reorder_hold(a, to, m);
    return sr__agent_send_now(a, to, m);
}

/* A deadline moved earlier than the progress thread's armed timer may be.
 * K1: bump timer_gen, then ring the doorbell (its D3 fence orders the bump
 * before the load of the word). The sleeping side re-checks timer_gen after
 * announcing SLEEPING (park_ready, after D2), so either it sees the bump and
 * does not sleep, or we see SLEEPING and wake it: no kick is lost between the
 * progress thread computing its deadline and falling asleep. While a user
 * thread polls, the word is AWAKE and nothing is rung: user_release compares
 * the generations when it hands the token back. */
void sr__agent_kick(sr_agent *a)
{
    /* release: pairs with K3, so a generation seen means its deadline is seen;
     * the D3 fence in sr_doorbell_ring orders it before the doorbell load */
    atomic_fetch_add_explicit(&a->timer_gen, 1, memory_order_release);
    sr_doorbell_ring(&a->x->me->doorbell, a->x->me->doorbell_kind, a->x->me->eventfd);
    /* relaxed: a hint; the progress thread waiting out a user's poll rechecks its timers */
    if (atomic_load_explicit(&a->token, memory_order_relaxed) == TOKEN_USER_WAITING)
        futex_wake_one(&a->token);
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
            /* release: our consumption happens-before the progress thread's */
            atomic_store_explicit(&a->token, TOKEN_FREE, memory_order_release);
            futex_wake_one(&a->token);
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
        /* A departure published while we polled rang an AWAKE doorbell (X3)
         * and may have woken nobody: handle it before parking the token. */
        if (sr__agent_exits_pending(a)) {
            atomic_store_explicit(&a->x->me->doorbell, SR_DOORBELL_AWAKE, memory_order_relaxed); /* relaxed: as above */
            sr__agent_check_exits(a);
            continue;
        }
        /* release: pairs with the acquire CAS of the next holder */
        if (atomic_compare_exchange_strong_explicit(&a->token, &t, TOKEN_PARKED, memory_order_release,
                                                    memory_order_relaxed)) {
            if (timers_moved(a)) /* kicked while we polled: the parked thread's timer is stale */
                sr_doorbell_ring(&a->x->me->doorbell, a->x->me->doorbell_kind, a->x->me->eventfd);
            break;
        }
    }
    return true;
}

/* Spin on the inbox and the future for up to budget ns. */
static bool spin_for(sr_agent *a, sr_future *f, int64_t budget)
{
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
        if (sr__agent_exits_pending(a)) { /* the supervisor rang: a peer left */
            sr__agent_check_exits(a);
            continue;
        }
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

/* The job's awake counter counts runnable threads (the spin policy): a
 * user thread is counted out only while it sleeps. */
static void sleep_on(sr_agent *a, sr_future *f, int64_t deadline)
{
    sr_xport_awake(a->x, -1);
    sr__future_sleep(f, deadline);
    sr_xport_awake(a->x, 1);
}

/* An idle waiter (inside sr_shutdown) stays the worker's server: it keeps
 * the token and sleeps on the doorbell itself, so a request wakes the thread
 * that runs it, with no hand-over to the progress thread and no executor hop
 * for plain functions. Safe because what completes an idle wait (barrier,
 * quiescence) arrives through this inbox. Only with the futex doorbell
 * (eventfd producers never futex-wake); bounded slices re-check the deadline. */
static bool idle_doorbell_sleep(sr_agent *a, sr_future *f, int64_t deadline)
{
    if (a->x->me->doorbell_kind != SR_DOORBELL_FUTEX)
        return false;
    _Atomic uint32_t *w = &a->x->me->doorbell;
    sr_xport_recv_burst(a->x, NULL, 0); /* free held slots before sleeping (ring.h) */
    atomic_store_explicit(w, SR_DOORBELL_SLEEPING, memory_order_relaxed); /* relaxed: D2 orders it */
    /* D2 (doorbell.h): pairs with the producers' D3 fence */
    atomic_thread_fence(memory_order_seq_cst);
    /* The exit generation too: the supervisor rings after publishing one (X3). */
    if (!sr_ring_ready(a->x->inbox) && !sr_future_done(f) && !sr_xport_space_kicked(a->x) &&
        !sr__agent_exits_pending(a)) {
        int64_t left = deadline >= 0 ? deadline - sr_now_ns() : IDLE_SLICE_NS;
        if (left > IDLE_SLICE_NS)
            left = IDLE_SLICE_NS;
        struct timespec ts = {.tv_sec = left / 1000000000, .tv_nsec = left % 1000000000};
        sr_xport_awake(a->x, -1);
        /* shared futex: the word is in the segment, woken from other processes */
        if (left > 0 && syscall(SYS_futex, w, FUTEX_WAIT, SR_DOORBELL_SLEEPING, &ts, NULL, 0) < 0 &&
            errno == ETIMEDOUT && sr_ring_ready(a->x->inbox) &&
            atomic_load_explicit(w, memory_order_relaxed) != SR_DOORBELL_SLEEPING) /* relaxed: a statistic */
            atomic_fetch_add_explicit(&a->idle_missed_wakes, 1, memory_order_relaxed); /* relaxed: as above */
        sr_xport_awake(a->x, 1);
    }
    /* relaxed: only pollers write SLEEPING; a producer's exchange also writes AWAKE */
    atomic_store_explicit(w, SR_DOORBELL_AWAKE, memory_order_relaxed);
    return true;
}

int sr__agent_wait(sr_agent *a, sr_future *f, int64_t deadline, enum sr_poll_mode mode)
{
    for (;;) {
        if (sr_future_done(f))
            return 0;
        if (deadline >= 0 && sr_now_ns() >= deadline)
            return -ETIMEDOUT;
        if (!user_take(a) && !steal_from_progress(a, f)) {
            /* Someone else polls and will complete f. An idle waiter wakes
             * now and then to take over serving once the progress thread
             * has parked (only who serves depends on it, never correctness). */
            int64_t until = deadline;
            if (mode == SR_POLL_IDLE) {
                int64_t soon = sr_now_ns() + IDLE_RETAKE_NS;
                until = deadline >= 0 && deadline < soon ? deadline : soon;
            }
            sleep_on(a, f, until);
            continue;
        }
        int rc = poll_as_user(a, f, deadline, mode);
        while (rc == 1 && mode == SR_POLL_IDLE && !sr__dispatch_has_deferred() &&
               idle_doorbell_sleep(a, f, deadline))
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
        /* Idle: new messages now wake the progress thread, which completes f. */
        sleep_on(a, f, deadline);
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

/* A user thread polls: sleep on the token until it is handed back. */
static void progress_wait_token(sr_agent *a, int64_t ns)
{
    uint32_t t = TOKEN_USER;
    /* relaxed: the futex re-checks the value; the hand-over is a release store */
    if (atomic_compare_exchange_strong_explicit(&a->token, &t, TOKEN_USER_WAITING, memory_order_relaxed,
                                                memory_order_relaxed) || t == TOKEN_USER_WAITING) {
        sr_xport_awake(a->x, -1);
        futex_wait_ns(&a->token, TOKEN_USER_WAITING, ns);
        sr_xport_awake(a->x, 1);
    }
}

/* Called by the waiter after announcing sleep: park, unless there is work. */
static bool park_ready(void *p)
{
    sr_agent *a = p;
    /* relaxed (stopping): a hint to skip the sleep; sr__agent_stop also notifies the waiter */
    if (sr_ring_ready(a->x->inbox) || atomic_load_explicit(&a->stopping, memory_order_relaxed) || timers_moved(a) ||
        sr_xport_space_kicked(a->x) ||
        sr__agent_exits_pending(a)) /* after D2: the supervisor's X3 ring pairs with it */
        return true;
    uint32_t t = TOKEN_PROGRESS;
    /* release: pairs with a stealer's acquire; our consumption happens-before its */
    return !atomic_compare_exchange_strong_explicit(&a->token, &t, TOKEN_PARKED, memory_order_release,
                                                    memory_order_relaxed);
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

/* Under gone_lock: claim the peer whose exit was published first among
 * those not handled yet; -1 when none is left. In publication order, so
 * that the worker that left first is the one a failed wait names, not a
 * peer whose own shutdown failed because of it. */
static int claim_gone(sr_agent *a)
{
    int first = -1;
    uint32_t seq = 0;
    for (int r = 0; r < a->world; r++)
        if (r != a->rank && !a->gone[r] && sr_xport_peer_gone(a->x, r)) {
            uint32_t s = sr_seg_worker(&a->x->seg, r)->exit_seq; /* written before X1, read after it */
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
    sr_xport_gone_text(a->x, r, text, sizeof(text));
    sr_seg_exit_text(sr_seg_worker(&a->x->seg, r), how, sizeof(how));
    sr__outq_drop_peer(a, r); /* nothing queued for it can be delivered now */
    sr__calls_fail_peer(a, r, how); /* "RPC to worker2 failed: the worker exited with ..." */
    if (sr_xport_peer_left_gracefully(a->x, r))
        return;
    sr__modules_peer_died(r, text);
    sr__ctrl_peer_gone(a, r, text);
}

void sr__agent_check_exits(sr_agent *a)
{
    for (;;) {
        uint32_t n = sr_xport_exits(a->x); /* seq_cst: pairs with the supervisor's X2 */
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

/* After a sleep or a token wait. A peer's pidfd (SR_WAKE_PEER) only wakes
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
    /* relaxed: the generation is read before the deadlines it vouches for (K3) */
    atomic_store_explicit(&a->armed_gen, atomic_load_explicit(&a->timer_gen, memory_order_relaxed),
                          memory_order_relaxed);
    /* K3: pairs with the release bump in sr__agent_kick: the deadlines read
     * below include every kick up to the generation armed above */
    atomic_thread_fence(memory_order_acquire);
    sr_xport_sleep(a->x, next_deadline(a), park_ready, a);
    handle_events(a);
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
    sr_xport_awake(a->x, 1); /* runnable from now; sr_xport_sleep counts its sleeps out */
    while (!atomic_load_explicit(&a->stopping, memory_order_acquire)) { /* acquire: pairs with sr__agent_stop */
        if (!progress_take(a)) {
            /* A user thread polls: timers (call deadlines, retries, held
             * messages) still need this thread, so sleep no longer than them. */
            int64_t d = next_deadline(a), ns = TOKEN_WAIT_NS;
            if (d >= 0 && d - sr_now_ns() < ns)
                ns = d - sr_now_ns() > TOKEN_WAIT_MIN_NS ? d - sr_now_ns() : TOKEN_WAIT_MIN_NS;
            progress_wait_token(a, ns);
            handle_events(a);
            sr__modules_tick(); /* the polling user reads the acknowledgements meanwhile */
            continue;
        }
        if (poll_burst(a, SR_POLL_NESTED)) {
            expire_due(a); /* a busy inbox must not stop timeouts from firing, */
            if (sr__agent_exits_pending(a)) /* nor a departure from being seen */
                sr__agent_check_exits(a);
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
    atomic_compare_exchange_strong_explicit(&a->token, &t, TOKEN_FREE, memory_order_release, memory_order_relaxed);
    sr_xport_awake(a->x, -1);
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
    futex_wake_one(&a->token);
    pthread_join(a->progress, NULL);
    sr__future_set_wait_hook(NULL);
}
