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

#define TOKEN_WAIT_NS (50ll * 1000000)       /* progress thread: recheck timers while a user polls */
#define TOKEN_WAIT_MIN_NS (20ll * 1000)      /* ... but never a busy loop on an overdue timer */
#define USER_STEAL_SPIN_NS (20ll * 1000)     /* a user waits this long for the progress thread to park */
#define IDLE_SLICE_NS (100ll * 1000000)      /* an idle waiter re-checks its deadline this often */
#define IDLE_RETAKE_NS (2ll * 1000000)       /* an idle waiter without the token retries this often */
#define HOLDER_SLICE_NS (1ll * 1000000)      /* eventfd doorbell only: a token holder waiting in a callback re-polls this often */

/* ---- lifetime (agent.h) ----------------------------------------------------- */

static _Atomic(sr_agent *) live;  /* the published agent, or NULL */
static _Atomic uint32_t users;    /* references taken by sr__agent_get and not yet put */
static _Atomic uint32_t draining; /* sr__agent_unpublish waits for users to reach 0 */
static _Atomic uint64_t epochs;   /* numbers the published agents */

/* The progress thread's agent (it takes no references: sr__agent_stop joins it). */
static _Thread_local sr_agent *tls_progress;
/* A user thread that holds the token (between user_take and user_release). */
static _Thread_local bool tls_holder;

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
    sr_doorbell_ring(&a->x->me->doorbell, a->x->waiter.kind, a->x->waiter.eventfd);
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

/* Messages for the token holder: the rest of the last burst, or the inbox. */
static bool inbox_ready(const sr_agent *a)
{
    return a->burst_at < a->burst_n || sr_ring_ready(a->x->inbox);
}

/* Consume one burst; the caller holds the token. Returns the count. The
 * burst is the agent's, not this frame's: a callback that waits (a nested
 * wait, agent.h) polls on, and the rest of the burst is what it reads first,
 * so an answer that came in the same burst is never stranded behind it. */
static unsigned poll_burst(sr_agent *a, enum sr_poll_mode mode)
{
    if (a->burst_at == a->burst_n) {
        a->burst_at = 0;
        a->burst_n = sr_xport_recv_burst(a->x, a->burst, BURST);
        if (!a->burst_n) { /* idle: take back the blocks peers released (one load when there are none) */
            sr_heap_drain();
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
    tls_holder = true;
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
        if (inbox_ready(a) || sr_xport_space_kicked(a->x)) {
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
                sr_doorbell_ring(&a->x->me->doorbell, a->x->waiter.kind, a->x->waiter.eventfd);
            break;
        }
    }
    tls_holder = false;
    return true;
}

/* Spin on the inbox and the future for up to budget ns. */
static bool spin_for(sr_agent *a, sr_future *f, int64_t budget)
{
    int64_t until = sr_now_ns() + budget;
    do {
        for (int i = 0; i < 64; i++) {
            if (inbox_ready(a) || sr_future_done(f) || sr_xport_space_kicked(a->x))
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

/* Ring this worker's doorbell whatever it says, and wake a progress thread
 * waiting out a user's poll: the waiters re-check what they wait for. The
 * store of AWAKE makes a sleeper that has not reached its futex wait yet
 * return at once (its expected value is SLEEPING). */
static void agent_poke(sr_agent *a)
{
    /* relaxed: the futex wake below carries the event; sleepers re-check after D2 */
    atomic_store_explicit(&a->x->me->doorbell, SR_DOORBELL_AWAKE, memory_order_relaxed);
    sr__doorbell_wake(&a->x->me->doorbell, a->x->me->doorbell_kind, a->x->me->eventfd);
    futex_wake_one(&a->token);
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

/* The job's awake counter counts runnable threads (the spin policy): a
 * user thread is counted out only while it sleeps. A counted waiter (one
 * that holds a reference from sr__agent_get) lets go of it while it sleeps:
 * sr_shutdown waits for references, never for futures. False if the agent
 * was unpublished meanwhile: the reference is then gone. */
static bool sleep_on(sr_agent *a, sr_future *f, int64_t deadline, bool counted)
{
    sr_xport_awake(a->x, -1);
    if (!counted) {
        sr__future_sleep(f, deadline);
        sr_xport_awake(a->x, 1);
        return true;
    }
    uint64_t epoch = a->epoch;
    sr__agent_put(a);
    sr__future_sleep(f, deadline);
    sr_agent *b = sr__agent_get(NULL);
    if (b != a || b->epoch != epoch) {
        if (b)
            sr__agent_put(b);
        return false;
    }
    sr_xport_awake(a->x, 1);
    return true;
}

/* A user thread that holds the token sleeps on the doorbell itself, so a
 * request wakes the thread that runs it, with no hand-over to the progress
 * thread. It also wakes for f (the POLLER bit: its completer rings the
 * doorbell), for the earliest call deadline (it expires calls: the progress
 * thread may sleep with an older timer while we hold the inbox), and for
 * sr_shutdown's poke. Only with the futex doorbell (eventfd producers never
 * futex-wake); bounded slices re-check the deadline. */
static bool holder_sleep(sr_agent *a, sr_future *f, int64_t deadline)
{
    if (a->x->waiter.kind != SR_DOORBELL_FUTEX)
        return false;
    _Atomic uint32_t *w = &a->x->me->doorbell;
    sr_xport_recv_burst(a->x, NULL, 0); /* free held slots before sleeping (ring.h) */
    bool armed = sr__future_arm_wake(f);
    atomic_store_explicit(w, SR_DOORBELL_SLEEPING, memory_order_relaxed); /* relaxed: D2 orders it */
    /* D2 (doorbell.h): pairs with the producers' D3 fence, with the D3 fence
     * of sr__agent_kick (the earliest deadline is read below), and with
     * sr__agent_unpublish's store of closing */
    atomic_thread_fence(memory_order_seq_cst);
    /* relaxed: ordered by D2 (see sr__call_begin, which stores it before its kick) */
    int64_t until = earlier(deadline, atomic_load_explicit(&a->earliest_deadline, memory_order_relaxed));
    /* The exit generation too: the supervisor rings after publishing one (X3). */
    if (armed && !inbox_ready(a) && !sr_future_done(f) && !closing(a) && !sr_xport_space_kicked(a->x) &&
        !sr__agent_exits_pending(a)) {
        int64_t left = until >= 0 ? until - sr_now_ns() : IDLE_SLICE_NS;
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
        if (!holder_sleep(a, f, deadline)) /* eventfd doorbell: nobody can ring this thread */
            sr__future_sleep(f, earlier(deadline, sr_now_ns() + HOLDER_SLICE_NS));
    }
    sr__dispatch_take_jobs(was);
    return rc;
}

static int progress_wait(sr_agent *a, sr_future *f, int64_t deadline);

int sr__agent_wait(sr_agent *a, sr_future *f, int64_t deadline, enum sr_poll_mode mode, bool counted)
{
    if (tls_progress == a)
        return progress_wait(a, f, deadline);
    if (tls_holder)
        return holder_wait(a, f, deadline);
    for (;;) {
        if (sr_future_done(f))
            return 0;
        if (deadline >= 0 && sr_now_ns() >= deadline)
            return -ETIMEDOUT;
        if (closing(a) || (!user_take(a) && !steal_from_progress(a, f))) {
            /* Someone else polls and will complete f. An idle waiter wakes
             * now and then to take over serving once the progress thread
             * has parked (only who serves depends on it, never correctness). */
            int64_t until = deadline;
            if (mode == SR_POLL_IDLE) {
                int64_t soon = sr_now_ns() + IDLE_RETAKE_NS;
                until = deadline >= 0 && deadline < soon ? deadline : soon;
            }
            if (!sleep_on(a, f, until, counted))
                return SR__WAIT_DETACHED;
            continue;
        }
        int rc = poll_as_user(a, f, deadline, mode);
        while (rc == 1 && mode == SR_POLL_IDLE && !sr__dispatch_has_deferred() && !closing(a) &&
               holder_sleep(a, f, deadline))
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
        if (!sleep_on(a, f, deadline, counted))
            return SR__WAIT_DETACHED;
    }
}

int sr__agent_wait_counted(sr_agent *a, sr_future *f, int64_t deadline, enum sr_poll_mode mode)
{
    if (tls_progress == a) { /* sr_shutdown joins this thread: it needs no reference, and must not hold one up */
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
    if (tls_progress)
        return sr__agent_wait(tls_progress, f, deadline, SR_POLL_NESTED, false);
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

/* A user thread polls: sleep on the token until it is handed back (or f,
 * which a nested wait waits for, completes: its wake hook wakes the token
 * word too; a wake that comes before the sleep is lost, bounded by ns). */
static void progress_wait_token(sr_agent *a, int64_t ns, sr_future *f)
{
    uint32_t t = TOKEN_USER;
    /* relaxed: the futex re-checks the value; the hand-over is a release store */
    if (atomic_compare_exchange_strong_explicit(&a->token, &t, TOKEN_USER_WAITING, memory_order_relaxed,
                                                memory_order_relaxed) || t == TOKEN_USER_WAITING) {
        if (f && sr_future_done(f))
            return;
        sr_xport_awake(a->x, -1);
        futex_wait_ns(&a->token, TOKEN_USER_WAITING, ns);
        sr_xport_awake(a->x, 1);
    }
}

struct park_ctx {
    sr_agent *a;
    sr_future *f; /* a nested wait's future, or NULL */
};

/* Called by the waiter after announcing sleep: park, unless there is work. */
static bool park_ready(void *p)
{
    struct park_ctx *c = p;
    sr_agent *a = c->a;
    /* relaxed (stopping): a hint to skip the sleep; sr__agent_stop also notifies the waiter */
    if (inbox_ready(a) || atomic_load_explicit(&a->stopping, memory_order_relaxed) || timers_moved(a) ||
        sr_xport_space_kicked(a->x) || (c->f && sr_future_done(c->f)) ||
        sr__agent_exits_pending(a)) /* after D2: the supervisor's X3 ring pairs with it */
        return true;
    uint32_t t = TOKEN_PROGRESS;
    /* release: pairs with a stealer's acquire; our consumption happens-before its */
    return !atomic_compare_exchange_strong_explicit(&a->token, &t, TOKEN_PARKED, memory_order_release,
                                                    memory_order_relaxed);
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

/* f, deadline: a nested wait's (NULL, -1 at the top level). */
static void progress_idle(sr_agent *a, sr_future *f, int64_t deadline)
{
    int64_t budget = progress_spin_budget(a);
    int64_t until = sr_now_ns() + budget;
    while (budget > 0 && sr_now_ns() < until) {
        for (int i = 0; i < 64; i++) {
            if (inbox_ready(a) || sr_xport_space_kicked(a->x) || (f && sr_future_done(f)))
                return;
            sr_cpu_relax();
        }
        /* relaxed: a hint; a user thread wants to poll its own response */
        if (atomic_load_explicit(&a->want_token, memory_order_relaxed))
            break;
    }
    if (f && !sr__future_arm_wake(f)) /* its completer rings the doorbell; the D2 inside the sleep orders this */
        return;
    /* relaxed: the generation is read before the deadlines it vouches for (K3) */
    atomic_store_explicit(&a->armed_gen, atomic_load_explicit(&a->timer_gen, memory_order_relaxed),
                          memory_order_relaxed);
    /* K3: pairs with the release bump in sr__agent_kick: the deadlines read
     * below include every kick up to the generation armed above */
    atomic_thread_fence(memory_order_acquire);
    struct park_ctx c = {a, f};
    sr_xport_sleep(a->x, earlier(next_deadline(a), deadline), park_ready, &c);
    handle_events(a);
}

/* One round of the progress loop. f, deadline: a nested wait's. */
static void progress_step(sr_agent *a, sr_future *f, int64_t deadline)
{
    if (!progress_take(a)) {
        /* A user thread polls: timers (call deadlines, retries, held
         * messages) still need this thread, so sleep no longer than them. */
        int64_t d = earlier(next_deadline(a), deadline), ns = TOKEN_WAIT_NS;
        if (d >= 0 && d - sr_now_ns() < ns)
            ns = d - sr_now_ns() > TOKEN_WAIT_MIN_NS ? d - sr_now_ns() : TOKEN_WAIT_MIN_NS;
        progress_wait_token(a, ns, f);
        handle_events(a);
        sr__modules_tick(); /* the polling user reads the acknowledgements meanwhile */
        return;
    }
    if (poll_burst(a, SR_POLL_NESTED)) {
        expire_due(a); /* a busy inbox must not stop timeouts from firing, */
        if (sr__agent_exits_pending(a)) /* nor a departure from being seen */
            sr__agent_check_exits(a);
        return;
    }
    /* Retries only after a poll found the inbox empty: acknowledgements are
     * sent quietly (they wake nobody), so one may be waiting there. */
    sr__modules_tick();
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
    while (!progress_take(a) && !stopping(a))
        progress_wait_token(a, TOKEN_WAIT_NS, NULL);
    return rc;
}

static void *progress_main(void *p)
{
    sr_agent *a = p;
    tls_progress = a;
    sr_xport_awake(a->x, 1); /* runnable from now; sr_xport_sleep counts its sleeps out */
    while (!stopping(a))
        progress_step(a, NULL, -1);
    /* release: a waiter still running (an executor finishing a nested call)
     * may steal the token and poll for itself. */
    uint32_t t = TOKEN_PROGRESS;
    atomic_compare_exchange_strong_explicit(&a->token, &t, TOKEN_FREE, memory_order_release, memory_order_relaxed);
    sr_xport_awake(a->x, -1);
    tls_progress = NULL;
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
    sr_waiter_notify_shutdown(&a->x->waiter);
    futex_wake_one(&a->token);
    pthread_join(a->progress, NULL);
}
