/* SPDX-License-Identifier: MIT */
/* Doorbells: how a producer wakes a sleeping consumer.
 *
 * Each worker owns one 32-bit word in the worker table (sr_worker_info.doorbell).
 *
 * Watching the head. Whoever stops polling a worker's inbox (the progress
 * thread before it sleeps, a user thread that hands the inbox back to it or
 * sleeps holding it) first watches the slot at the inbox's head
 * (sr__ring_watch, shm/ring.h). A free slot's sequence word becomes
 * "watched" (W1, a seq_cst CAS), and the producer whose claim takes it
 * rings after publishing: one word carries both sides, so no ring is lost
 * (either the watch comes first and the claim sees it, or the claim comes
 * first and the watch fails). A head already claimed but not yet published
 * gets the ring's claim watch instead, a rarely written flag that every
 * producer whose claim found no watch loads after its publish (D2'/D3':
 * either the consumer's second look sees the publish, or the producer sees
 * the flag and rings). A published head cannot be watched: the consumer
 * polls instead of sleeping. Messages behind the head need no ring of their
 * own: their claims come after the head's, whose publisher rings. A thread
 * that polls again un-watches (sr__ring_unwatch; a read clears the claim
 * watch too).
 *
 * Why: the word below lives on a line every producer would otherwise read
 * after every send (D3), and a user thread took and handed back the inbox
 * on every call, writing the word twice; each write then had to take the
 * line back from the peer that read it, a cache-line round trip on the
 * critical path of every call (docs/PERFORMANCE.md). The watched slot is
 * the line the next message is written to anyway.
 *
 *   consumer (sr__waiter_sleep)             producer (sr__doorbell_ring)
 *   W1 watch the head slot                 (message published into a watched slot)
 *   D1 store word = SLEEPING               D3 fence(seq_cst)
 *   D2 fence(seq_cst)                         load word; if SLEEPING and our
 *      re-check the ring; if non-empty,       exchange wins, wake the consumer
 *      do not sleep
 *
 * D2 pairs with D3 (a Dekker handshake): either the consumer sees the
 * message, or the producer sees SLEEPING. So no wake-up is ever lost, and a
 * producer makes the wake syscall only when the consumer really sleeps, and
 * only one producer makes it (the one whose exchange returned SLEEPING).
 * The word says who sleeps on it, not whether the inbox is polled: while a
 * user thread holds the inbox the parked progress thread still sleeps on
 * it, and the word stays SLEEPING, so the common hand-back writes nothing
 * here (it stores SLEEPING, with D2, only when a ring or its own sleep
 * changed it).
 *
 * R1, quiet sends and one ring: a producer may publish several messages to
 * one consumer without ringing (a quiet send) and then ring once
 * (sr__xport_ring_peer). A quiet send that finds its slot watched records a
 * ring owed to that peer; the thread's ring_peer, or the next loud send to
 * the peer from any thread, pays it (after the publish that owed it). The
 * ring must come before that thread itself waits for anything the consumer
 * will do (the RPC layer's poll bursts: lib/rpc/poll.c).
 *
 * R2, a lazy send (no ring follows: a message nobody waits on, read when
 * the consumer next polls) that finds its slot watched does not ring for
 * itself: it hands the watch on to the next slot (sr__ring_watch_next), so
 * that the next message, which someone may wait on, rings; where it cannot
 * (the next slot already published), it rings. A consumer that polls again
 * and reads up to a watch handed on ahead of its old head clears it
 * (sr__ring_read_burst): left, the next claim there would ring the parked
 * thread while the holder polls.
 *
 * The same pair carries space events (xport.h): the consumer of a full inbox
 * that frees slots stores the blocked sender's space_kick and then rings
 * the sender's doorbell (D3 after the store), and every sender-side thread
 * about to sleep checks space_kick after its D2, next to its ring. Those
 * direct rings (and the supervisor's X3, shutdown's pokes) read the word
 * whatever the slots say: one of them while a user thread polls wakes the
 * parked progress thread for nothing, which is rare and harmless.
 *
 * Two kinds of consumer sleep on the word, told apart by the value announced:
 *   SLEEPING       the progress thread, in io_uring (shm/waiter.c). Its
 *                  FUTEX_WAIT carries SR_DOORBELL_BIT_PROGRESS and stays armed
 *                  across sleeps, so it is still queued on the word while
 *                  another thread holds the inbox.
 *   SLEEPING_USER  a user thread that holds the worker's inbox (the RPC
 *                  agent's consumer token) sleeps on the word itself, in
 *                  futex_waitv with its future. The producer wakes it with
 *                  bitset SR_DOORBELL_BIT_USER, which the progress thread's
 *                  armed wait does not match: a response wakes its caller
 *                  directly, and only it. Once awake it stores SLEEPING again
 *                  (the parked progress thread's word).
 * The same handshake covers both: a producer acts on any value but the
 * awake ones (sr__doorbell_awake).
 *
 * A third sleeper, the stand-by (the RPC layer's, agent.h "The progress
 * thread serves"), is woken only while the progress thread is away running
 * a call: that thread then hands the inbox over as SLEEPING_STANDBY, and a
 * producer that finds that value moves it to AWAKE_STANDBY (not AWAKE) and
 * wakes with bitset SR_DOORBELL_BIT_STANDBY, which no other sleeper's wait
 * carries as its only bit. The stand-by sleeps in FUTEX_WAIT_BITSET with
 * that bit and, as its expected value, whatever the word held when it
 * looked (the only sleeper that queues on any value): AWAKE_STANDBY
 * differs from every value it can have read before the hand-over, so a ring
 * between its look and its wait fails the wait (EAGAIN) instead of being
 * lost. STANDBY_STOP ends it; producers take that value as awake.
 *
 * The wake is FUTEX_WAKE (or FUTEX_WAKE_BITSET) on the shared (not private)
 * word, or, in the eventfd fallback, an 8-byte write to the consumer's
 * eventfd (there only the progress thread sleeps on the doorbell).
 *
 * Cost: a send into an unwatched slot pays D3' (a fence, as D3 was) and a
 * load of the claim watch, a line that is almost never written, so the
 * load hits; it reads no doorbell. A watched one pays D3, a load of the
 * consumer's doorbell line, and the wake when the consumer sleeps. Quiet
 * sends pay nothing per message: their one ring_peer pays D3' for all.
 */
#ifndef SR_SHM_DOORBELL_H
#define SR_SHM_DOORBELL_H

#if !defined(SR__SEES_SHM)
#error "doorbell.h is the seam of the substrate (shm) layer, for it and the layers above it only (docs/ARCHITECTURE.md)"
#endif
#include <stdbool.h>
#include <stdint.h>

#include "atomics.h"

enum {
    SR_DOORBELL_AWAKE = 0,
    SR_DOORBELL_SLEEPING = 1,
    SR_DOORBELL_SLEEPING_USER = 2,
    SR_DOORBELL_SLEEPING_STANDBY = 3, /* the progress thread is away: a message wakes the stand-by */
    SR_DOORBELL_AWAKE_STANDBY = 4,    /* ... and one did (or a poke): awake, as AWAKE */
    SR_DOORBELL_STANDBY_STOP = 5,     /* the stand-by is being stopped: awake, as AWAKE */
};

/* FUTEX_WAIT_BITSET masks of the sleepers (a futex_waitv sleeper matches any). */
#define SR_DOORBELL_BIT_PROGRESS 0x1u
#define SR_DOORBELL_BIT_USER 0x2u
#define SR_DOORBELL_BIT_STANDBY 0x4u

/* A value a producer must not ring on: someone polls, or will. */
static inline bool sr__doorbell_awake(uint32_t v)
{
    return v == SR_DOORBELL_AWAKE || v == SR_DOORBELL_AWAKE_STANDBY || v == SR_DOORBELL_STANDBY_STOP;
}

enum sr_doorbell_kind {
    SR_DOORBELL_FUTEX = 1,   /* io_uring FUTEX_WAIT / futex(FUTEX_WAKE) */
    SR_DOORBELL_EVENTFD = 2, /* io_uring READ of an eventfd / write(2) */
};

/* Out of line: the syscall. Returns 1 if a wake was issued. Wakes every
 * sleeper on the word but the stand-by (whose bit is its own). */
int sr__doorbell_wake(_Atomic uint32_t *word, uint32_t kind, int eventfd);
/* Wake only a SLEEPING_USER sleeper (futex doorbells only). */
int sr__doorbell_wake_user(_Atomic uint32_t *word);
/* Wake only the stand-by (futex doorbells only). */
int sr__doorbell_wake_standby(_Atomic uint32_t *word);

/* Producer side, called after publishing a message. Returns 1 if it woke the
 * consumer (a syscall), 0 if the consumer was awake (no syscall). */
static inline int sr__doorbell_ring(_Atomic uint32_t *word, uint32_t kind, int eventfd)
{
    /* D3: pairs with the consumer's D2 fence between announcing SLEEPING and re-checking its ring */
    atomic_thread_fence(memory_order_seq_cst);
    /* relaxed: ordered after our publish by D3 */
    uint32_t was = atomic_load_explicit(word, memory_order_relaxed);
    do {
        if (sr__doorbell_awake(was))
            return 0;
        /* relaxed: the CAS only elects one waker; the wake syscall carries the event */
    } while (!atomic_compare_exchange_weak_explicit(
        word, &was, was == SR_DOORBELL_SLEEPING_STANDBY ? SR_DOORBELL_AWAKE_STANDBY : SR_DOORBELL_AWAKE,
        memory_order_relaxed, memory_order_relaxed));
    if (was == SR_DOORBELL_SLEEPING_STANDBY)
        return sr__doorbell_wake_standby(word);
    return was == SR_DOORBELL_SLEEPING_USER ? sr__doorbell_wake_user(word) : sr__doorbell_wake(word, kind, eventfd);
}

#endif
