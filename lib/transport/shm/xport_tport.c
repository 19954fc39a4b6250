/* SPDX-License-Identifier: MIT */
/* The shared-memory transport behind the seam (transport.h): the ops over
 * xport.c, every optional group included, with the doorbell side of the
 * consumer's hand-offs and their memory-ordering arguments (doorbell.h
 * D1-D3). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "futex.h"
#include "heap.h"
#include "xport.h"

#define X(t) ((sr_xport *)((char *)(t) - offsetof(sr_xport, tp)))

static int t_send(sr_tport *t, int to, sr_msg *m) { return sr_xport_send(X(t), to, m); }
static int t_send_quiet(sr_tport *t, int to, sr_msg *m) { return sr__xport_send_quiet(X(t), to, m); }
static int t_send_lazy(sr_tport *t, int to, sr_msg *m) { return sr__xport_send_lazy(X(t), to, m); }
static int t_ring_peer(sr_tport *t, int to) { return sr__xport_ring_peer(X(t), to); }
static void t_space_arm(sr_tport *t, int to) { sr__xport_space_arm(X(t), to); }
static int t_probe(sr_tport *t, int to) { return sr__xport_probe(X(t), to); }
static bool t_space_take(sr_tport *t) { return sr__xport_space_take(X(t)); }

/* An empty inbox: take back the blocks peers released to our heap (one
 * relaxed load when there are none). */
static unsigned t_recv_burst(sr_tport *t, sr_msg *out, unsigned n)
{
    unsigned k = sr__xport_recv_burst(X(t), out, n);
    if (!k && n)
        sr__heap_drain();
    return k;
}
static bool t_pending(sr_tport *t) { return sr__ring_cons_pending(X(t)->inbox); }
static const char *t_inbox_text(sr_tport *t, char *buf, size_t len) { return sr__xport_inbox_text(X(t), buf, len); }

/* Another thread took the inbox: it polls now, so producers need not wake
 * the thread asleep on the doorbell: the slot at head is no longer watched
 * (doorbell.h, "Watching the head"). The doorbell word is left as it is
 * (SLEEPING: the parked thread still sleeps on it), so that handing the
 * inbox back writes no line a producer reads. */
static void t_hold(sr_tport *t) { sr__ring_unwatch(X(t)->inbox); }

/* The holding thread hands the inbox back to the thread asleep on the
 * doorbell. It released the inbox before it slept, and will
 * not again before its next read: free the slots the holder's last burst
 * still holds (a receive of nothing), or a ring full of them would refuse
 * every producer, which then rings no doorbell, while everyone sleeps. Then
 * watch the head for it (doorbell.h). False (the watch withdrawn): the
 * inbox, a space event or busy(arg) has work; the caller polls again. */
static bool park_as(sr_tport *t, uint32_t sleeper, bool (*busy)(void *), void *arg)
{
    sr_xport *x = X(t);
    sr__xport_recv_burst(x, NULL, 0);
    /* The parked thread sleeps on the word as SLEEPING: say so again only if
     * a ring (or this holder's own sleep) changed it. The common hand-back
     * writes nothing here: producers read this line. */
    if (atomic_load_explicit(&x->me->doorbell, memory_order_relaxed) != sleeper) {
        /* relaxed: the D2 fence below orders it before the re-checks */
        atomic_store_explicit(&x->me->doorbell, sleeper, memory_order_relaxed);
        /* D2 (doorbell.h): pairs with the D3 fence of a direct ring (a space
         * kick, the supervisor's X3 ring: busy() checks the departures) */
        atomic_thread_fence(memory_order_seq_cst);
    }
    /* The watch (W1) is the ring's re-check: it fails on a published head */
    if (!sr__ring_watch(x->inbox) || sr__xport_space_kicked(x) || busy(arg)) {
        sr__ring_unwatch(x->inbox);
        return false;
    }
    return true;
}

static bool t_park(sr_tport *t, bool (*busy)(void *), void *arg)
{
    return park_as(t, SR_DOORBELL_SLEEPING, busy, arg);
}

/* The stand-by (doorbell.h): the inbox handed over while the progress
 * thread is away, so that a message wakes the stand-by, not the thread
 * that cannot poll. As t_park otherwise. */
static bool t_park_away(sr_tport *t, bool (*busy)(void *), void *arg)
{
    /* only the futex doorbell wakes by bit; an eventfd one parks as ever */
    bool futex = X(t)->waiter.kind == SR_DOORBELL_FUTEX;
    return park_as(t, futex ? SR_DOORBELL_SLEEPING_STANDBY : SR_DOORBELL_SLEEPING, busy, arg);
}

/* The progress thread holds the inbox again after an away period: the word
 * leaves the stand-by's two values (a ring that came meanwhile is the
 * progress thread's to read now), and the head is no longer watched. */
static void t_away_end(sr_tport *t)
{
    sr_xport *x = X(t);
    _Atomic uint32_t *w = &x->me->doorbell;
    /* relaxed: a producer's CAS decides who rings; the holder polls next */
    uint32_t v = atomic_load_explicit(w, memory_order_relaxed);
    while ((v == SR_DOORBELL_SLEEPING_STANDBY || v == SR_DOORBELL_AWAKE_STANDBY) &&
           !atomic_compare_exchange_weak_explicit(w, &v, SR_DOORBELL_AWAKE, memory_order_relaxed, memory_order_relaxed)) {
    }
    sr__ring_unwatch(x->inbox);
}

/* The stand-by's sleep (doorbell.h): 1 at once when the word says it was
 * rung (AWAKE_STANDBY); -ESHUTDOWN once stopped; otherwise a
 * FUTEX_WAIT_BITSET on the value it holds now, until until(arg) at the
 * latest, 0 when it ends (woken, timed out, or the word changed first: the
 * caller looks again). */
static int t_standby_wait(sr_tport *t, int64_t (*until)(void *), void *arg)
{
    _Atomic uint32_t *w = &X(t)->me->doorbell;
    /* relaxed: the value only decides whether to sleep; what the stand-by
     * then reads (the call it stands in for) is under the agent's lock */
    uint32_t v = atomic_load_explicit(w, memory_order_relaxed);
    if (v == SR_DOORBELL_STANDBY_STOP)
        return -ESHUTDOWN;
    if (v == SR_DOORBELL_AWAKE_STANDBY)
        return 1;
    /* seq_cst: pairs with the D2 fence of the hand-over that stored v (park_as):
     * the timers its thread saw before are seen by until() */
    atomic_thread_fence(memory_order_seq_cst);
    int64_t u = until(arg);
    struct timespec ts = {.tv_sec = u / 1000000000, .tv_nsec = u % 1000000000};
    /* shared word; an absolute CLOCK_MONOTONIC timeout */
    syscall(SYS_futex, w, FUTEX_WAIT_BITSET, v, u >= 0 ? &ts : NULL, NULL, SR_DOORBELL_BIT_STANDBY);
    return 0;
}

/* A ring that came for an away period already over: AWAKE again. The
 * caller makes sure no away period begins meanwhile (a lock the progress
 * thread takes before it parks away). */
static void t_standby_settle(sr_tport *t)
{
    uint32_t v = SR_DOORBELL_AWAKE_STANDBY;
    /* relaxed: no wake to carry; a producer's CAS from SLEEPING_STANDBY cannot come (see above) */
    atomic_compare_exchange_strong_explicit(&X(t)->me->doorbell, &v, SR_DOORBELL_AWAKE, memory_order_relaxed,
                                            memory_order_relaxed);
}

/* End the stand-by's sleeps (stop) and, once it has returned, give the word
 * back (done). STANDBY_STOP differs from any value it may be about to wait
 * on, and producers take it as awake, so the wait after it fails at once. */
static void t_standby_stop(sr_tport *t)
{
    _Atomic uint32_t *w = &X(t)->me->doorbell;
    atomic_store_explicit(w, SR_DOORBELL_STANDBY_STOP, memory_order_seq_cst); /* seq_cst: before the wake */
    sr__doorbell_wake_standby(w);
}

static void t_standby_done(sr_tport *t)
{
    uint32_t v = SR_DOORBELL_STANDBY_STOP;
    /* relaxed: nobody sleeps on the word any more but a progress thread to come, which stores its own value */
    atomic_compare_exchange_strong_explicit(&X(t)->me->doorbell, &v, SR_DOORBELL_AWAKE, memory_order_relaxed,
                                            memory_order_relaxed);
}

/* The holding thread has nothing to poll: watch the head, and sleep on the
 * doorbell word itself (SLEEPING_USER, doorbell.h) and on `word` at once,
 * so that the message it waits for wakes it directly. Only with the futex doorbell
 * (eventfd producers never futex-wake). Without futex_waitv, on the doorbell
 * alone (FUTEX_WAIT_BITSET, BIT_USER); the caller then arranged for whoever
 * changes what it waits for to ring the doorbell (wake->ring). */
static int t_hold_sleep(sr_tport *t, _Atomic uint32_t *word, uint32_t val, int64_t until, bool (*busy)(void *),
                        void *arg)
{
    sr_xport *x = X(t);
    if (x->waiter.kind != SR_DOORBELL_FUTEX)
        return -EOPNOTSUPP;
    _Atomic uint32_t *w = &x->me->doorbell;
    int lost = 0;
    if (!sr__ring_watch(x->inbox)) /* W1: a message at head (or held slots): poll */
        return 0;
    atomic_store_explicit(w, SR_DOORBELL_SLEEPING_USER, memory_order_relaxed); /* relaxed: D2 orders it */
    /* D2 (doorbell.h): pairs with the producers' D3 fence, with the
     * supervisor's X3 ring, and with the caller's seq_cst stores of what
     * busy() reads (the departures, the RPC layer's closing) */
    atomic_thread_fence(memory_order_seq_cst);
    if (!sr__ring_cons_pending(x->inbox) && !sr__xport_space_kicked(x) && !busy(arg)) {
        /* relaxed: a statistic; the holder is the inbox's consumer, its only writer (xport.h) */
        atomic_store_explicit(&x->st.sleeps, atomic_load_explicit(&x->st.sleeps, memory_order_relaxed) + 1,
                              memory_order_relaxed);
        int rc;
        int64_t t0 = sr__xport_sleep_begin(x);
        if (word) {
            struct futex_waitv v[2] = {
                {.val = SR_DOORBELL_SLEEPING_USER, .uaddr = (uint64_t)(uintptr_t)w, .flags = FUTEX_32}, /* shared */
                sr__futex_private_word(word, val)};
            rc = sr__futex_waitv(v, 2, until);
        } else { /* FUTEX_WAIT_BITSET: an absolute CLOCK_MONOTONIC deadline; shared word */
            struct timespec ts = {.tv_sec = until / 1000000000, .tv_nsec = until % 1000000000};
            rc = syscall(SYS_futex, w, FUTEX_WAIT_BITSET, SR_DOORBELL_SLEEPING_USER, until >= 0 ? &ts : NULL, NULL,
                         SR_DOORBELL_BIT_USER) < 0 ? -errno : 0;
        }
        sr__xport_sleep_end(x, t0);
        /* relaxed: a statistic for tests/rpc/test_idle_wake.c */
        lost = rc == -ETIMEDOUT && sr__ring_ready(x->inbox) &&
               atomic_load_explicit(w, memory_order_relaxed) != SR_DOORBELL_SLEEPING_USER;
    }
    /* Back to the parked thread's SLEEPING (it still sleeps on the word),
     * and polling: no watch. relaxed: only the token's holder writes
     * SLEEPING_USER; a producer's exchange writes AWAKE, and a ring then
     * is a spurious wake of the parked thread at most */
    atomic_store_explicit(w, SR_DOORBELL_SLEEPING, memory_order_relaxed);
    sr__ring_unwatch(x->inbox);
    return lost;
}

/* After a sleep of the sleeping thread: one that ends on a local peer's
 * pidfd (SR_WAKE_PEER) publishes the exit when no supervisor does (mpirun,
 * orphan.c); then take back the blocks peers released to our heap. */
static int woke(sr_xport *x, int rc)
{
    if (rc < 0 || (rc & SR_WAKE_PEER)) /* an error may have consumed a pidfd too */
        sr__xport_publish_orphans(x);
    sr__heap_drain();
    return rc;
}

static int t_sleep(sr_tport *t, int64_t deadline, bool (*ready)(void *), void *arg)
{
    return woke(X(t), sr__xport_sleep(X(t), deadline, ready, arg));
}

static int t_sleep_aside(sr_tport *t, int64_t deadline, bool (*ready)(void *), void *arg)
{
    return woke(X(t), sr__waiter_sleep_aside(&X(t)->waiter, deadline, ready, arg));
}

static int64_t t_spin_budget(sr_tport *t) { return sr__xport_spin_budget(X(t)); }
static int64_t t_yield_budget(sr_tport *t) { return sr__xport_yield_budget(X(t)); }
static void t_kick(sr_tport *t) { sr__waiter_kick(&X(t)->waiter); }

/* Ring this worker's doorbell whatever it says, and kick the sleeping
 * thread (asleep aside while another holds the inbox, or on the doorbell):
 * the waiters re-check what they wait for. The store of AWAKE makes a
 * sleeper that has not reached its futex wait yet return at once (its
 * expected value is SLEEPING or SLEEPING_USER); the wake reaches both kinds
 * of doorbell sleeper (doorbell.h). */
static void t_poke(sr_tport *t)
{
    sr_xport *x = X(t);
    _Atomic uint32_t *w = &x->me->doorbell;
    /* relaxed: the futex wake below carries the event; sleepers re-check
     * after D2. While the progress thread is away, the stand-by's AWAKE. */
    uint32_t v = atomic_load_explicit(w, memory_order_relaxed), to;
    do {
        bool away = v == SR_DOORBELL_SLEEPING_STANDBY || v == SR_DOORBELL_AWAKE_STANDBY;
        to = away ? SR_DOORBELL_AWAKE_STANDBY : v == SR_DOORBELL_STANDBY_STOP ? v : SR_DOORBELL_AWAKE;
    } while (!atomic_compare_exchange_weak_explicit(w, &v, to, memory_order_relaxed, memory_order_relaxed));
    if (to == SR_DOORBELL_AWAKE_STANDBY)
        sr__doorbell_wake_standby(w);
    sr__doorbell_wake(w, x->waiter.kind, x->waiter.eventfd);
    sr__waiter_kick(&x->waiter);
}

/* Quiet messages (acknowledgements) ring nobody: wake a holder asleep on
 * the doorbell to read them (nothing if it polls, or if the parked thread
 * is the one the word names). */
static void t_nudge(sr_tport *t)
{
    sr_xport *x = X(t);
    /* relaxed: the ring's exchange decides; a holder about to sleep re-checks the ring after D2 */
    if (sr__ring_ready(x->inbox) &&
        atomic_load_explicit(&x->me->doorbell, memory_order_relaxed) == SR_DOORBELL_SLEEPING_USER)
        sr__doorbell_ring(&x->me->doorbell, x->waiter.kind, x->waiter.eventfd);
}

/* As a producer's ring after a publish: the D3 fence inside pairs with the
 * sleeper's D2 (a completion made before it is seen by a holder about to
 * sleep on the inbox). */
static void t_ring(sr_tport *t)
{
    sr_xport *x = X(t);
    sr__doorbell_ring(&x->me->doorbell, x->me->doorbell_kind, x->me->eventfd);
}

static void t_closing(sr_tport *t) { sr__xport_closing(X(t)); }
static void t_graceful(sr_tport *t, int rc)
{
    X(t)->graceful = rc == 0;
    X(t)->timed_out = rc == -ETIMEDOUT;
}

static void t_stop(sr_tport *t) { sr__waiter_notify_shutdown(&X(t)->waiter); }

static bool t_peer_gone(sr_tport *t, int rank) { return sr__xport_peer_gone(X(t), rank); }
static uint32_t t_exit_order(sr_tport *t, int rank)
{
    return sr__seg_worker(&X(t)->seg, rank)->exit_seq; /* written before X1, read after it */
}
static const char *t_gone_text(sr_tport *t, int rank, char *buf, size_t len)
{
    return sr__xport_gone_text(X(t), rank, buf, len);
}
static const char *t_exit_text(sr_tport *t, int rank, char *buf, size_t len)
{
    /* relaxed: our own view; UINT32_MAX: no process of it known (a free rank) */
    if (!X(t)->replaces || atomic_load_explicit(&X(t)->peers[rank].gen, memory_order_relaxed) == UINT32_MAX)
        return sr__seg_exit_text(sr__seg_worker(&X(t)->seg, rank), buf, len);
    char how[128]; /* the generation that ended: the one we know (relaxed: our own view) */
    sr__seg_exit_text(sr__seg_worker(&X(t)->seg, rank), how, sizeof(how));
    snprintf(buf, len, "(generation %u) %s", atomic_load_explicit(&X(t)->peers[rank].gen, memory_order_relaxed), how);
    return buf;
}
static bool t_left_gracefully(sr_tport *t, int rank) { return sr__xport_peer_left_gracefully(X(t), rank); }
static bool t_left_timed_out(sr_tport *t, int rank) { return sr__xport_peer_left_timed_out(X(t), rank); }
static const char *t_name(sr_tport *t, int rank) { return X(t)->peers[rank].name; }
static uint32_t t_generation(sr_tport *t, int rank)
{
    /* relaxed: our own view (xport.h, struct sr_peer) */
    return rank == X(t)->rank ? X(t)->gen : atomic_load_explicit(&X(t)->peers[rank].gen, memory_order_relaxed);
}
static int t_rejoin(sr_tport *t, int rank) { return sr__xport_rejoin(X(t), rank); }
static bool t_leaving(sr_tport *t, int rank) { return sr__xport_peer_leaving(X(t), rank); }

static void t_stats(sr_tport *t, struct sr_tport_stats *o)
{
    sr_xport_stats *s = &X(t)->st;
    /* relaxed (all): statistics */
    uint64_t rung = atomic_load_explicit(&s->sent, memory_order_relaxed);
    o->sent = rung + atomic_load_explicit(&s->quiet, memory_order_relaxed);
    o->rings = rung + atomic_load_explicit(&s->peer_rings, memory_order_relaxed);
    o->received = atomic_load_explicit(&s->received, memory_order_relaxed);
    o->wakes = atomic_load_explicit(&s->wakes, memory_order_relaxed);
    o->sleeps = atomic_load_explicit(&s->sleeps, memory_order_relaxed);
    o->full = atomic_load_explicit(&s->full, memory_order_relaxed);
    o->spin_hits = atomic_load_explicit(&s->spin_hits, memory_order_relaxed);
}

static const struct sr_tport_flow shm_flow = {
    .space_arm = t_space_arm,
    .probe = t_probe,
    .space_take = t_space_take,
};

static const struct sr_tport_wake shm_wake = {
    .send_quiet = t_send_quiet,
    .send_lazy = t_send_lazy,
    .hold = t_hold,
    .park = t_park,
    .park_away = t_park_away,
    .away_end = t_away_end,
    .standby_wait = t_standby_wait,
    .standby_settle = t_standby_settle,
    .standby_stop = t_standby_stop,
    .standby_done = t_standby_done,
    .hold_sleep = t_hold_sleep,
    .sleep = t_sleep,
    .sleep_aside = t_sleep_aside,
    .spin_budget = t_spin_budget,
    .yield_budget = t_yield_budget,
    .kick = t_kick,
    .poke = t_poke,
    .nudge = t_nudge,
    .ring = t_ring,
    .ring_peer = t_ring_peer,
    .stop = t_stop,
};

static const struct sr_tport_live shm_live = {
    .peer_gone = t_peer_gone,
    .exit_order = t_exit_order,
    .gone_text = t_gone_text,
    .exit_text = t_exit_text,
    .left_gracefully = t_left_gracefully,
    .left_timed_out = t_left_timed_out,
    .closing = t_closing,
    .graceful = t_graceful,
    .generation = t_generation,
    .rejoin = t_rejoin,
    .leaving = t_leaving,
};

/* Producers ring our doorbell: no poll_ns, never poll on a timer. */
static const struct sr_tport_ops shm_ops = {
    .kind = "shm",
    .send = t_send,
    .recv_burst = t_recv_burst,
    .pending = t_pending,
    .name = t_name,
    .stats = t_stats,
    .flow = &shm_flow,
    .wake = &shm_wake,
    .live = &shm_live,
    .inbox_text = t_inbox_text,
};

sr_tport *sr__xport_transport(sr_xport *x)
{
    x->tp.ops = &shm_ops;
    x->tp.rank = x->rank;
    x->tp.world = x->world;
    x->tp.caps = (x->replaces ? SR_TPORT_REPLACES : 0) | (x->elastic ? SR_TPORT_ELASTIC : 0);
    x->tp.space_kick = &x->me->space_kick;
    x->tp.inbox_bad = &x->inbox->bad;
    x->tp.exits = &x->seg.hdr->exits;
    x->tp.marshal = NULL; /* parts travel by reference */
    if (x->waiter.kind == SR_DOORBELL_FUTEX)
        x->tp.caps |= SR_TPORT_HOLD_SLEEP | (sr__futex_waitv_supported() ? SR_TPORT_SLEEP_WORD : 0);
    return &x->tp;
}
